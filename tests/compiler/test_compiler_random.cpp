// The ops on Keras Dropout's path that run on the scalar unit: StatelessRandomGetKeyCounter and
// StatelessRandomUniformV2 (ops/random.h) against a plain C++ Philox4x32-10 written here and
// checked against the published known-answer vectors (Random123's kat_vectors, the ones TF's
// philox_random_test uses), and TF's uniform mapping (random_distributions.h: the low 23 / 10 /
// 7 bits as the mantissa of 1.m, minus 1); FloorMod / FloorDiv of s64 (Keras' SeedGenerator
// reduces its int64 state with FloorMod) against C++ floor semantics. Exact: tolerance 0.
#include <catch2/catch.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

using Words = std::array<uint32_t, 4>;
using Key = std::array<uint32_t, 2>;

// Philox4x32-10 (Salmon et al., SC'11): ten rounds of two 32x32->64 products, the key bumped
// by the Weyl constants between rounds.
Words philox(Words c, Key k) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k[0] += 0x9E3779B9u;
      k[1] += 0xBB67AE85u;
    }
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0];
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
  }
  return c;
}

// counter + g as a 128-bit number (words low first).
Words add_counter(Words c, uint64_t g) {
  uint64_t lo = (uint64_t{c[1]} << 32 | c[0]) + g;
  uint64_t hi = uint64_t{c[3]} << 32 | c[2];
  if (lo < g) ++hi;
  return {static_cast<uint32_t>(lo), static_cast<uint32_t>(lo >> 32), static_cast<uint32_t>(hi),
          static_cast<uint32_t>(hi >> 32)};
}

// TF's uniform value of one sample for dtype t: (u & (2^W - 1)) * 2^-W, exact in double.
double uniform_value(DataType t, uint32_t u) {
  const int w = t == DataType::F16 ? 10 : t == DataType::BF16 ? 7 : 23;
  return std::ldexp(static_cast<double>(u & ((1u << w) - 1)), -w);
}

HostTensor s64_host(std::vector<int64_t> shape, std::vector<int64_t> v) {
  std::vector<double> d(v.begin(), v.end());
  return HostTensor{TensorDesc{DataType::S64, std::move(shape)}, d, v};
}

int64_t join(uint32_t lo, uint32_t hi) { return static_cast<int64_t>(uint64_t{hi} << 32 | lo); }

// Runs StatelessRandomUniformV2 for key/counter and checks every element against the reference.
// Returns the run (its cycles, whether the simulator replayed it). bf16 on a chip without bf16
// at all (vector.bf16_conversion false: the 910) must be refused instead.
RunResult check_uniform(DataType t, std::vector<int64_t> shape, Words counter, Key key) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const int rank = static_cast<int>(shape.size());
  OpDesc op = make_op("StatelessRandomUniformV2",
                      {TensorDesc{DataType::S32, {rank}}, TensorDesc{DataType::S64, {1}},
                       TensorDesc{DataType::S64, {2}}, TensorDesc{DataType::S32, {}}},
                      {{"shape", shape}, {"alg", int64_t{1}},
                       {"dtype", std::string(compiler::data_type_name(t))}});
  if (t == DataType::BF16 && !test_sim().config().vector_bf16_conversion) {
    CHECK_THROWS_WITH(compiler::compile(op, test_sim().config()),
                      Catch::Contains("dtype bf16 is not supported on chip"));
    return {};
  }
  CompiledKernel k = compiler::compile(op, test_sim().config());
  REQUIRE(k.outputs.size() == 1);
  CHECK(k.outputs[0] == TensorDesc{t, shape});
  if (n == 0) {
    CHECK(k.launches.empty());
    return {};
  }
  std::vector<double> shape_values(shape.begin(), shape.end());
  RunResult r = run_compiled(
      test_sim(), k,
      {HostTensor{TensorDesc{DataType::S32, {rank}}, shape_values},
       s64_host({1}, {join(key[0], key[1])}),
       s64_host({2}, {join(counter[0], counter[1]), join(counter[2], counter[3])}),
       HostTensor{TensorDesc{DataType::S32, {}}, {1}}});
  const std::vector<double>& got = r.outputs[0].values;
  REQUIRE(static_cast<int64_t>(got.size()) == n);
  for (int64_t i = 0; i < n; ++i) {
    const Words w = philox(add_counter(counter, static_cast<uint64_t>(i / 4)), key);
    const double want = uniform_value(t, w[i % 4]);
    if (got[i] != want)
      FAIL("element " << i << " of " << n << ": got " << got[i] << ", want " << want);
  }
  return r;
}

}  // namespace

TEST_CASE("the reference Philox4x32-10 gives the published known-answer vectors") {
  // Random123 kat_vectors, "philox4x32 10": counter, key -> output.
  CHECK(philox({0, 0, 0, 0}, {0, 0}) == Words{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        Words{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        Words{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("StatelessRandomUniformV2 gives TF's bits for the known-answer counters and keys") {
  // Group 0 of each tensor is Philox of the given counter and key itself (the KAT above).
  for (DataType t : {DataType::F32, DataType::F16, DataType::BF16}) {
    INFO(compiler::data_type_name(t));
    check_uniform(t, {4}, {0, 0, 0, 0}, {0, 0});
    check_uniform(t, {2, 3}, {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                  {0xffffffff, 0xffffffff});
    check_uniform(t, {7}, {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                  {0xa4093822, 0x299f31d0});
  }
}

TEST_CASE("StatelessRandomUniformV2: odd sizes, several blocks, counter carries, empty") {
  // 1000 f32 elements = 250 groups: more than kRandomMinGroupsPerBlock (64), so several blocks
  // on any chip with more than one vector core; the low counter word wraps after 3 groups
  // (carry into the high 64 bits), and the all-ones counter wraps to zero.
  check_uniform(DataType::F32, {10, 100}, {0xfffffffd, 0xffffffff, 7, 0}, {0x12345678, 0x9abcdef0});
  check_uniform(DataType::F16, {3, 5, 7}, {0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
                {1, 2});
  check_uniform(DataType::BF16, {1, 1}, {5, 6, 7, 8}, {9, 10});
  check_uniform(DataType::F32, {0, 3}, {1, 2, 3, 4}, {5, 6});
}

TEST_CASE("StatelessRandomUniformV2 on the vector unit: tiles, ragged tails, carries, keys") {
  // Sizes past one tile and one block, none a whole number of groups or tiles; counters whose
  // low word wraps inside a tile (carry into word 1 only, into the high 64 bits, and the whole
  // 128-bit counter wrapping to zero); keys with all bits set and random ones.
  const auto vector_launch = [](DataType t, std::vector<int64_t> shape) {
    OpDesc op = make_op("StatelessRandomUniformV2",
                        {TensorDesc{DataType::S32, {static_cast<int64_t>(shape.size())}},
                         TensorDesc{DataType::S64, {1}}, TensorDesc{DataType::S64, {2}},
                         TensorDesc{DataType::S32, {}}},
                        {{"shape", shape}, {"dtype", std::string(compiler::data_type_name(t))}});
    const CompiledKernel k = compiler::compile(op, test_sim().config());
    REQUIRE(k.launches.size() == 1);
    return k.launches[0].summary.rfind("vector unit", 0) == 0;
  };
  CHECK(vector_launch(DataType::F32, {3, 3001}));
  CHECK(vector_launch(DataType::F16, {4099}));
  check_uniform(DataType::F32, {3, 3001}, {0xfffff000, 0xffffffff, 0xffffffff, 0},
                {0xffffffff, 0xffffffff});
  check_uniform(DataType::F32, {70001}, {0xffffff00, 5, 0, 0}, {0x9e3779b9, 0x1234});
  check_uniform(DataType::F16, {4099}, {0xfffffff0, 0xffffffff, 0xffffffff, 0xffffffff},
                {7, 0xffffffff});
  check_uniform(DataType::BF16, {2, 2053}, {1, 2, 3, 4}, {0xffffffff, 0});
  std::mt19937 rng(20261204);
  for (int i = 0; i < 3; ++i) {
    const Words c{rng(), rng(), rng(), rng()};
    const Key k{rng(), rng()};
    INFO("counter " << c[0] << " " << c[1] << " " << c[2] << " " << c[3] << " key " << k[0]
                    << " " << k[1]);
    check_uniform(DataType::F32, {5003}, c, k);
    check_uniform(DataType::F16, {1, 1029}, c, k);
  }
}

TEST_CASE("StatelessRandomUniformV2 on the vector unit: products of edge words") {
  // The first round multiplies counter words 0 and 2 (word 0 plus each lane's group offset):
  // words at the edges of the 16-bit pieces and of the s32 range, where a piece's sign or a
  // carry between the partial products of the high word would show.
  const uint32_t edges[] = {0x00000000, 0x0000ffff, 0x00010000, 0x00007fff, 0x00008000,
                            0x7fffffff, 0x80000000, 0x8000ffff, 0xffff0000, 0xffffffff};
  for (uint32_t w : edges) {
    INFO("edge word " << w);
    check_uniform(DataType::F32, {600}, {w - 75, 0, w, 0}, {0, 0});
    check_uniform(DataType::F32, {600}, {w, 0xffffffff, ~w, 0x80000000}, {0xffffffff, 0x12345});
  }
}

TEST_CASE("StatelessRandomUniformV2 on the vector unit: the largest tiles") {
  // 65539 groups: more than 2048 per core on up to 32 vector cores, so that a chip whose UB
  // holds them (the 910's 256 KiB, run as test_compiler_random_910) takes tiles of 2048 groups,
  // the largest; a ragged last tile and a counter whose low word wraps inside the draw.
  const std::vector<int64_t> shape{4, 65539};
  if (test_chip_name() == "910") {
    OpDesc op = make_op("StatelessRandomUniformV2",
                        {TensorDesc{DataType::S32, {2}}, TensorDesc{DataType::S64, {1}},
                         TensorDesc{DataType::S64, {2}}, TensorDesc{DataType::S32, {}}},
                        {{"shape", shape},
                         {"dtype", std::string(compiler::data_type_name(DataType::F32))}});
    const CompiledKernel k = compiler::compile(op, test_sim().config());
    REQUIRE(k.launches.size() == 1);
    CHECK(k.launches[0].summary.find("in tiles of 2048,") != std::string::npos);
  }
  check_uniform(DataType::F32, shape, {0xffff0000, 0xffffffff, 3, 0}, {0x2468ace0, 0x13579bdf});
  check_uniform(DataType::F16, shape, {7, 8, 9, 10}, {0xffffffff, 1});
}

TEST_CASE("StatelessRandomUniformV2: a zero sample, and timing that does not depend on the key") {
  // A counter whose first sample has a zero f16 mantissa (found with the reference): +0.0.
  Words zero{0, 0, 0, 0};
  const Key key{0x0badcafe, 0x5eed};
  for (uint32_t c = 0;; ++c) {
    REQUIRE(c < 1000000);
    if ((philox({c, 0, 0, 0}, key)[0] & 0x3ff) == 0) {
      zero = {c, 0, 0, 0};
      break;
    }
  }
  check_uniform(DataType::F16, {4}, zero, key);
  // The kernel builds each float without branches on the random bits, so its control flow and
  // timing are the same for every key: the same launch with another key (the next training
  // step's) passes the replay check and is replayed, with the other key's bits.
  const std::vector<int64_t> shape{2, 300};
  const RunResult first = check_uniform(DataType::F32, shape, {1, 2, 3, 4}, {5, 6});
  const RunResult second = check_uniform(DataType::F32, shape, {1, 2, 3, 4}, {0xdead, 0xbeef});
  CHECK(second.replayed == 1);
  CHECK(second.cycles == first.cycles);
}

TEST_CASE("StatelessRandomUniformV2 rejects ThreeFry, bad keys and integer dtypes") {
  const std::vector<TensorDesc> in = {TensorDesc{DataType::S32, {1}},
                                      TensorDesc{DataType::S64, {1}},
                                      TensorDesc{DataType::S64, {2}}, TensorDesc{DataType::S32, {}}};
  auto fails = [&](std::vector<TensorDesc> inputs, std::map<std::string, compiler::AttrValue> a,
                   const char* what) {
    OpDesc op = make_op("StatelessRandomUniformV2", std::move(inputs), std::move(a));
    CHECK_THROWS_WITH(compiler::compile(op, test_sim().config()), Catch::Contains(what));
  };
  fails(in, {{"shape", std::vector<int64_t>{4}}, {"alg", int64_t{2}}}, "ThreeFry");
  fails(in, {{"shape", std::vector<int64_t>{4}}, {"dtype", std::string("s32")}}, "dtype s32");
  fails({in[0], TensorDesc{DataType::S64, {2}}, in[2], in[3]},
        {{"shape", std::vector<int64_t>{4}}}, "key must be");
  fails(in, {}, "shape");
}

TEST_CASE("StatelessRandomGetKeyCounter scrambles the seed as TF's GenerateKey") {
  // TF: counter = the two seeds sign-extended to 64 bits (low word first), key = (0x3ec8f720,
  // 0x02461e29); mix = Philox(counter, key); key out = mix[0..1], counter out = {0, mix[2..3]}.
  for (DataType st : {DataType::S32, DataType::S64}) {
    for (std::array<int64_t, 2> seed : {std::array<int64_t, 2>{0, 0}, {1337, 42}, {-1, 7},
                                        {std::numeric_limits<int32_t>::min(), 123456789}}) {
      if (st == DataType::S64 && seed[0] == 1337) seed = {int64_t{1} << 40, -(int64_t{3} << 50)};
      INFO(compiler::data_type_name(st) << " seed " << seed[0] << ", " << seed[1]);
      OpDesc op = make_op("StatelessRandomGetKeyCounter", {TensorDesc{st, {2}}});
      CompiledKernel k = compiler::compile(op, test_sim().config());
      REQUIRE(k.outputs.size() == 2);
      CHECK(k.outputs[0] == TensorDesc{DataType::S64, {1}});
      CHECK(k.outputs[1] == TensorDesc{DataType::S64, {2}});
      HostTensor seed_t = st == DataType::S64
                              ? s64_host({2}, {seed[0], seed[1]})
                              : HostTensor{TensorDesc{st, {2}},
                                           {static_cast<double>(seed[0]),
                                            static_cast<double>(seed[1])}};
      RunResult r = run_compiled(test_sim(), k, {seed_t});
      const uint64_t s0 = static_cast<uint64_t>(seed[0]), s1 = static_cast<uint64_t>(seed[1]);
      const Words mix = philox({static_cast<uint32_t>(s0), static_cast<uint32_t>(s0 >> 32),
                                static_cast<uint32_t>(s1), static_cast<uint32_t>(s1 >> 32)},
                               {0x3ec8f720, 0x02461e29});
      CHECK(r.outputs[0].s64 == std::vector<int64_t>{join(mix[0], mix[1])});
      CHECK(r.outputs[1].s64 == std::vector<int64_t>{0, join(mix[2], mix[3])});
    }
  }
}

TEST_CASE("FloorMod and FloorDiv of s64 follow floor semantics, with broadcasting") {
  // Reference: r = a % b (C++ truncation); if r != 0 and its sign differs from b's, r += b and
  // the quotient a / b - 1 (TF's floor_mod / floor_div for signed integers).
  std::mt19937_64 rng(5);
  const int64_t big = std::numeric_limits<int32_t>::max() - 1;  // Keras' _cast_seed divisor
  std::vector<int64_t> a, bv;
  for (int i = 0; i < 37; ++i) {
    const int64_t x = i % 3 == 0 ? static_cast<int64_t>(rng()) : static_cast<int64_t>(rng() % 41) - 20;
    a.push_back(x);
  }
  for (int64_t d : {int64_t{7}, int64_t{-7}, big, int64_t{-3}}) bv.push_back(d);
  for (const char* name : {"FloorMod", "FloorDiv"}) {
    INFO(name);
    // [37, 1] against [4]: a [37, 4] output
    OpDesc op = make_op(name, {TensorDesc{DataType::S64, {37, 1}}, TensorDesc{DataType::S64, {4}}});
    CompiledKernel k = compiler::compile(op, test_sim().config());
    REQUIRE(k.outputs[0] == TensorDesc{DataType::S64, {37, 4}});
    RunResult r = run_compiled(test_sim(), k, {s64_host({37, 1}, a), s64_host({4}, bv)});
    for (size_t i = 0; i < a.size(); ++i)
      for (size_t j = 0; j < bv.size(); ++j) {
        int64_t q = a[i] / bv[j], m = a[i] % bv[j];
        if (m != 0 && ((m < 0) != (bv[j] < 0))) {
          m += bv[j];
          q -= 1;
        }
        INFO(a[i] << " and " << bv[j]);
        CHECK(r.outputs[0].s64[i * bv.size() + j] == (std::string(name) == "FloorMod" ? m : q));
      }
  }
  OpDesc f32 = make_op("FloorMod", {TensorDesc{DataType::F32, {3}}, TensorDesc{DataType::F32, {3}}});
  CHECK_THROWS_WITH(compiler::compile(f32, test_sim().config()), Catch::Contains("s64 only"));
}
