// int64 (s64) ops on the scalar unit (ops/int64.h) compiled for the test chip and run on the
// chip model, against references in plain C++ int64 / float arithmetic: element-wise
// arithmetic wrapping modulo 2^64 (as TF's int64 kernels on two's complement hardware),
// comparisons, Cast between s64 and f32 / f16 / bf16 / s32 / bool (float -> int64 truncates and
// saturates as the vector unit's vconv: out of range and infinities to INT64_MIN / INT64_MAX by
// sign, NaN to 0; int64 -> float rounds to nearest even; to f16 / bf16 through float, as Eigen),
// Range. Exact: tolerance 0 everywhere.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <functional>
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

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// s64 values: mostly small (ties for comparisons), some large and the extremes.
HostTensor s64_tensor(std::vector<int64_t> shape, uint32_t seed) {
  HostTensor h{TensorDesc{DataType::S64, std::move(shape)}, {}};
  const int64_t n = h.desc.num_elements();
  std::mt19937_64 rng(seed);
  for (int64_t i = 0; i < n; ++i) {
    int64_t v;
    switch (rng() % 5) {
      case 0: v = static_cast<int64_t>(rng()); break;                        // any 64 bits
      case 1: v = static_cast<int64_t>(rng() % (int64_t{1} << 40)) - (int64_t{1} << 39); break;
      case 2: v = i % 7 == 0 ? kMin : i % 7 == 1 ? kMax : -1; break;
      default: v = static_cast<int64_t>(rng() % 9) - 4; break;
    }
    h.s64.push_back(v);
    h.values.push_back(static_cast<double>(v));
  }
  return h;
}

int64_t wrap_add(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
}
int64_t wrap_sub(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b));
}
int64_t wrap_mul(int64_t a, int64_t b) {
  return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
}

struct BinCase {
  const char* op;
  std::function<int64_t(int64_t, int64_t)> fn;
  bool compare;
};
const BinCase kBin[] = {
    {"AddV2", wrap_add, false},
    {"Sub", wrap_sub, false},
    {"Mul", wrap_mul, false},
    {"Maximum", [](int64_t a, int64_t b) { return std::max(a, b); }, false},
    {"Minimum", [](int64_t a, int64_t b) { return std::min(a, b); }, false},
    {"SquaredDifference", [](int64_t a, int64_t b) { return wrap_mul(wrap_sub(a, b), wrap_sub(a, b)); }, false},
    {"Equal", [](int64_t a, int64_t b) -> int64_t { return a == b; }, true},
    {"NotEqual", [](int64_t a, int64_t b) -> int64_t { return a != b; }, true},
    {"Less", [](int64_t a, int64_t b) -> int64_t { return a < b; }, true},
    {"LessEqual", [](int64_t a, int64_t b) -> int64_t { return a <= b; }, true},
    {"Greater", [](int64_t a, int64_t b) -> int64_t { return a > b; }, true},
    {"GreaterEqual", [](int64_t a, int64_t b) -> int64_t { return a >= b; }, true},
};

void check_s64_binary(const BinCase& c, const std::vector<int64_t>& sa,
                      const std::vector<int64_t>& sb, uint32_t seed) {
  INFO(c.op << " s64 " << compiler::shape_str(sa) << " op " << compiler::shape_str(sb));
  HostTensor a = s64_tensor(sa, seed), b = s64_tensor(sb, seed + 1);
  auto k = compiler::compile(make_op(c.op, {a.desc, b.desc}), test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {a, b});
  auto shape = compiler::broadcast_shapes(sa, sb);
  REQUIRE(shape);
  REQUIRE(r.outputs.size() == 1);
  CHECK(r.outputs[0].desc == TensorDesc{c.compare ? DataType::BOOL : DataType::S64, *shape});
  auto ia = broadcast_index(sa, *shape), ib = broadcast_index(sb, *shape);
  int bad = 0;
  for (size_t i = 0; i < ia.size(); ++i) {
    const int64_t want = c.fn(a.s64[ia[i]], b.s64[ib[i]]);
    const int64_t got = c.compare ? static_cast<int64_t>(r.outputs[0].values[i])
                                  : r.outputs[0].s64[i];
    if (got != want && bad++ < 5)
      UNSCOPED_INFO("element " << i << ": " << a.s64[ia[i]] << " op " << b.s64[ib[i]] << " got "
                               << got << " want " << want);
  }
  CHECK(bad == 0);
  if (ia.empty()) CHECK(k.launches.empty());
}

}  // namespace

TEST_CASE("s64 element-wise arithmetic and comparisons, with broadcasting") {
  uint32_t seed = 1;
  for (const BinCase& c : kBin) {
    check_s64_binary(c, {37}, {37}, seed++);         // odd size: a partial last word (bool)
    check_s64_binary(c, {3, 17}, {17}, seed++);       // a row broadcast
    check_s64_binary(c, {}, {}, seed++);              // 0-d, as Keras' iteration counter
    check_s64_binary(c, {2, 1, 3}, {4, 1}, seed++);   // both broadcast
    check_s64_binary(c, {0, 3}, {3}, seed++);         // zero-size: no launch
  }
}

TEST_CASE("s64 AddV2 over several blocks") {
  // More elements than kScalarMapMinPerBlock per core: every core takes a range.
  // the element-wise cores: the vector cores of a split chip, the AI cores of a coupled one
  const ChipConfig& cfg = test_sim().config();
  const int64_t n =
      300 * cfg.core_kind(cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE)->count + 5;
  check_s64_binary(kBin[0], {n}, {n}, 100);
  check_s64_binary(kBin[6], {n}, {1}, 101);  // Equal: bool words across block boundaries
}

namespace {

// float -> int64 as the chip converts: truncation, saturation to [INT64_MIN, INT64_MAX] (the
// infinities too), NaN -> 0.
int64_t f32_to_s64(float f) {
  if (std::isnan(f)) return 0;
  if (f >= 9223372036854775808.0f) return std::numeric_limits<int64_t>::max();
  if (f < -9223372036854775808.0f) return kMin;
  return static_cast<int64_t>(f);
}

void check_cast(const HostTensor& x, DataType dst, const std::vector<int64_t>& want_s64,
                const std::vector<double>& want) {
  INFO("Cast " << x.desc.str() << " -> " << compiler::data_type_name(dst));
  auto k = compiler::compile(
      make_op("Cast", {x.desc},
              {{"SrcT", std::string(compiler::data_type_name(x.desc.dtype))},
               {"DstT", std::string(compiler::data_type_name(dst))}}),
      test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {x});
  REQUIRE(r.outputs.size() == 1);
  CHECK(r.outputs[0].desc == TensorDesc{dst, x.desc.shape});
  if (dst == DataType::S64) {
    int bad = 0;
    for (size_t i = 0; i < want_s64.size(); ++i)
      if (r.outputs[0].s64[i] != want_s64[i] && bad++ < 5)
        UNSCOPED_INFO("element " << i << " (" << x.values[i] << ") got " << r.outputs[0].s64[i]
                                 << " want " << want_s64[i]);
    CHECK(bad == 0);
  } else {
    // Exact (infinities included: s64 beyond f16's range gives inf, as static_cast).
    REQUIRE(r.outputs[0].values.size() == want.size());
    int bad = 0;
    for (size_t i = 0; i < want.size(); ++i)
      if (r.outputs[0].values[i] != want[i] && bad++ < 5)
        UNSCOPED_INFO("element " << i << " (" << x.s64[i] << ") got " << r.outputs[0].values[i]
                                 << " want " << want[i]);
    CHECK(bad == 0);
  }
}

}  // namespace

TEST_CASE("Cast s64 -> f32, f16, bf16, s32, s8, bool") {
  HostTensor x = s64_tensor({3, 29}, 7);
  // Rounding cases for f32: ties to even above 2^24, just above and below a tie, 2^63.
  const int64_t special[] = {(1 << 24) + 1, (1 << 24) + 3, -((1 << 24) + 1), (int64_t{1} << 40) + (1 << 16) + 1,
                             (int64_t{1} << 40) + (1 << 16), (int64_t{1} << 40) + (1 << 17) - 1,
                             kMin, kMax, 0, 1, -1, (int64_t{1} << 62) + (int64_t{1} << 38)};
  for (size_t i = 0; i < std::size(special); ++i) {
    x.s64[i] = special[i];
    x.values[i] = static_cast<double>(special[i]);
  }
  std::vector<double> f32, f16, bf16, s32, s8, b;
  for (int64_t v : x.s64) {
    const float f = static_cast<float>(v);  // x86 cvtsi2ss: round to nearest even
    f32.push_back(f);
    f16.push_back(from_f16_bits(to_f16_bits(f)));  // through float, as Eigen
    bf16.push_back(from_bf16_bits(to_bf16_bits(f)));
    s32.push_back(static_cast<int32_t>(static_cast<uint32_t>(v)));  // wraps
    s8.push_back(static_cast<int8_t>(static_cast<uint8_t>(v)));
    b.push_back(v != 0);
  }
  check_cast(x, DataType::F32, {}, f32);
  check_cast(x, DataType::F16, {}, f16);
  check_cast(x, DataType::BF16, {}, bf16);
  check_cast(x, DataType::S32, {}, s32);
  check_cast(x, DataType::S8, {}, s8);
  check_cast(x, DataType::BOOL, {}, b);
  HostTensor one = s64_tensor({}, 8);  // 0-d
  check_cast(one, DataType::F32, {}, {static_cast<float>(one.s64[0])});
  HostTensor empty = s64_tensor({0}, 9);
  check_cast(empty, DataType::F16, {}, {});
}

TEST_CASE("Cast f32, f16, bf16, s32, bool -> s64") {
  // f32: fractions (truncation), large values, 2^63 (out of range), -2^63 (in range), inf, NaN.
  HostTensor f = random_tensor(DataType::F32, {5, 21}, -1e6, 1e6, 11);
  const float special[] = {0.99f, -0.99f, -2.5f, 2.5f, 16777217.0f, 1e18f, -1e18f,
                           9223372036854775808.0f, -9223372036854775808.0f,
                           std::numeric_limits<float>::infinity(),
                           -std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(), 4.0e19f, -0.0f, 1.5e-30f};
  for (size_t i = 0; i < std::size(special); ++i) f.values[i] = special[i];
  std::vector<int64_t> want;
  for (double v : f.values) want.push_back(f32_to_s64(static_cast<float>(v)));
  check_cast(f, DataType::S64, want, {});

  HostTensor h = random_tensor(DataType::F16, {33}, -60000, 60000, 12);
  want.clear();
  for (double v : h.values) want.push_back(static_cast<int64_t>(v));
  check_cast(h, DataType::S64, want, {});
  HostTensor bf = random_tensor(DataType::BF16, {2, 9}, -1e12, 1e12, 13);
  want.clear();
  for (double v : bf.values) want.push_back(static_cast<int64_t>(v));
  check_cast(bf, DataType::S64, want, {});

  HostTensor s = random_tensor(DataType::S32, {41}, -2147483648.0, 2147483647.0, 14);
  want.clear();
  for (double v : s.values) want.push_back(static_cast<int64_t>(v));
  check_cast(s, DataType::S64, want, {});
  HostTensor bl = random_tensor(DataType::BOOL, {19}, 0, 1, 15);
  want.clear();
  for (double v : bl.values) want.push_back(static_cast<int64_t>(v));
  check_cast(bl, DataType::S64, want, {});
  check_cast(HostTensor{TensorDesc{DataType::F32, {}}, {-7.75}}, DataType::S64, {-7}, {});
  check_cast(HostTensor{TensorDesc{DataType::S32, {0, 4}}, {}}, DataType::S64, {}, {});
}

TEST_CASE("Range of s64") {
  struct R { int64_t start, limit, delta; };
  for (R c : {R{0, 10, 1}, R{-5, 12, 3}, R{(int64_t{1} << 40) + 3, (int64_t{1} << 40) - 50, -7},
              R{4, 5, 100}, R{7, 7, 1}}) {
    INFO("Range " << c.start << " " << c.limit << " " << c.delta);
    auto op = make_op("Range", {}, {{"start", c.start}, {"limit", c.limit}, {"delta", c.delta},
                                    {"Tidx", std::string("s64")}});
    auto k = compiler::compile(op, test_sim().config());
    RunResult r = run_compiled(test_sim(), k, {});
    std::vector<int64_t> want;
    for (int64_t v = c.start; c.delta > 0 ? v < c.limit : v > c.limit; v += c.delta)
      want.push_back(v);
    REQUIRE(r.outputs.size() == 1);
    CHECK(r.outputs[0].desc == TensorDesc{DataType::S64, {static_cast<int64_t>(want.size())}});
    CHECK(r.outputs[0].s64 == want);
  }
}

TEST_CASE("s64 ops that are not supported say so") {
  const ChipConfig& cfg = test_sim().config();
  CHECK_THROWS_WITH(compiler::compile(make_op("RealDiv", {{DataType::S64, {3}},
                                                          {DataType::S64, {3}}}),
                                      cfg),
                    Catch::Contains("RealDiv(s64[3], s64[3])") &&
                        Catch::Contains("dtype s64 is not supported"));
  CHECK_THROWS_WITH(compiler::compile(make_op("AddV2", {{DataType::S64, {3}},
                                                        {DataType::S64, {4}}}),
                                      cfg),
                    Catch::Contains("not broadcast-compatible"));
}

namespace {

// Reference reduction over `reduced` dims of x (values exact as int64): Sum / Max / Min / Prod
// wrapping in int64, Mean = int64 sum / count truncated toward zero.
std::vector<int64_t> reduce_ref(const std::string& kind, const std::vector<int64_t>& x,
                                const std::vector<int64_t>& shape,
                                const std::vector<bool>& reduced) {
  std::vector<int64_t> out_shape;
  for (size_t d = 0; d < shape.size(); ++d)
    if (!reduced[d]) out_shape.push_back(shape[d]);
  int64_t n_out = 1, n_red = 1;
  for (size_t d = 0; d < shape.size(); ++d) (reduced[d] ? n_red : n_out) *= shape[d];
  const int64_t init = kind == "Prod" ? 1 : kind == "Max" ? kMin : kind == "Min" ? kMax : 0;
  std::vector<int64_t> acc(static_cast<size_t>(n_out), init);
  std::vector<int64_t> idx(shape.size(), 0);
  for (size_t f = 0; f < x.size(); ++f) {
    int64_t rest = static_cast<int64_t>(f), o = 0;
    for (size_t d = shape.size(); d-- > 0;) {
      idx[d] = rest % shape[d];
      rest /= shape[d];
    }
    for (size_t d = 0; d < shape.size(); ++d)
      if (!reduced[d]) o = o * shape[d] + idx[d];
    int64_t& a = acc[static_cast<size_t>(o)];
    if (kind == "Prod") a = wrap_mul(a, x[f]);
    else if (kind == "Max") a = std::max(a, x[f]);
    else if (kind == "Min") a = std::min(a, x[f]);
    else a = wrap_add(a, x[f]);
  }
  if (kind == "Mean")
    for (int64_t& a : acc) a /= n_red;
  return acc;
}

void check_reduce(const std::string& kind, DataType dt, const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& axes, uint32_t seed) {
  INFO(kind << " " << compiler::data_type_name(dt) << compiler::shape_str(shape) << " axes "
            << compiler::shape_str(axes));
  HostTensor x;
  if (dt == DataType::S64) {
    x = s64_tensor(shape, seed);
  } else {
    x = random_tensor(DataType::S32, shape, -2147483648.0, 2147483647.0, seed);
    for (double v : x.values) x.s64.push_back(static_cast<int64_t>(v));
  }
  std::vector<bool> reduced(shape.size(), false);
  for (int64_t a : axes) reduced[static_cast<size_t>(a < 0 ? a + static_cast<int64_t>(shape.size()) : a)] = true;
  auto k = compiler::compile(make_op(kind, {x.desc}, {{"axes", axes}}), test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {x});
  std::vector<int64_t> want = reduce_ref(kind, x.s64, shape, reduced);
  REQUIRE(r.outputs.size() == 1);
  std::vector<int64_t> got;
  if (dt == DataType::S64) got = r.outputs[0].s64;
  else for (double v : r.outputs[0].values) got.push_back(static_cast<int64_t>(v));
  if (dt == DataType::S32)
    for (int64_t& w : want) w = static_cast<int32_t>(w);  // in range: a mean of int32s
  CHECK(got == want);
}

}  // namespace

TEST_CASE("Mean of s32: int64 sum, truncating division (TF)") {
  uint32_t seed = 300;
  // Full-range int32 values: their s32 sum would overflow; negative means truncate toward 0.
  check_reduce("Mean", DataType::S32, {5, 37}, {1}, seed++);
  check_reduce("Mean", DataType::S32, {5, 37}, {0}, seed++);
  check_reduce("Mean", DataType::S32, {3, 4, 7}, {0, 2}, seed++);
  check_reduce("Mean", DataType::S32, {200}, {0}, seed++);
  check_reduce("Mean", DataType::S32, {6, 1, 3}, {1}, seed++);  // size-1 reduced dim: a copy
  check_reduce("Mean", DataType::S32, {}, {}, seed++);
  check_reduce("Mean", DataType::S32, {4, 0}, {0}, seed++);     // empty output
  CHECK_THROWS_WITH(compiler::compile(make_op("Mean", {TensorDesc{DataType::S32, {4, 0}}},
                                              {{"axes", std::vector<int64_t>{1}}}),
                                      test_sim().config()),
                    Catch::Contains("divides by zero"));
}

TEST_CASE("Sum, Max, Min, Prod, Mean of s64") {
  uint32_t seed = 320;
  for (const char* kind : {"Sum", "Max", "Min", "Prod", "Mean"}) {
    check_reduce(kind, DataType::S64, {4, 9}, {1}, seed++);
    check_reduce(kind, DataType::S64, {2, 3, 5}, {0, 2}, seed++);
    check_reduce(kind, DataType::S64, {700}, {0}, seed++);
  }
  check_reduce("Sum", DataType::S64, {3, 0}, {1}, seed++);  // empty axis: 0
  check_reduce("Max", DataType::S64, {3, 0}, {1}, seed++);  // INT64_MIN
}

TEST_CASE("Cumsum of s64: axes, exclusive, reverse, wrapping") {
  uint32_t seed = 340;
  struct Case {
    std::vector<int64_t> shape;
    int64_t axis;
  };
  for (const Case& c : {Case{{7}, 0}, Case{{3, 17}, 1}, Case{{3, 17}, 0}, Case{{2, 5, 3}, 1},
                        Case{{4, 1, 2}, -2}, Case{{1}, 0}, Case{{0, 3}, 1}}) {
    for (int mode = 0; mode < 4; ++mode) {
      const bool exclusive = mode & 1, reverse = mode & 2;
      INFO("Cumsum " << compiler::shape_str(c.shape) << " axis " << c.axis << " exclusive "
                     << exclusive << " reverse " << reverse);
      HostTensor x = s64_tensor(c.shape, seed++);
      const int64_t rank = static_cast<int64_t>(c.shape.size());
      const size_t a = static_cast<size_t>(c.axis < 0 ? c.axis + rank : c.axis);
      int64_t outer = 1, inner = 1;
      for (size_t d = 0; d < a; ++d) outer *= c.shape[d];
      for (size_t d = a + 1; d < c.shape.size(); ++d) inner *= c.shape[d];
      const int64_t n = c.shape[a];
      std::vector<int64_t> want(x.s64.size());
      for (int64_t o = 0; o < outer; ++o)
        for (int64_t i = 0; i < inner; ++i) {
          int64_t acc = 0;
          for (int64_t k = 0; k < n; ++k) {
            const int64_t r = reverse ? n - 1 - k : k;
            const size_t at = static_cast<size_t>((o * n + r) * inner + i);
            if (exclusive) want[at] = acc;
            acc = wrap_add(acc, x.s64[at]);
            if (!exclusive) want[at] = acc;
          }
        }
      auto k = compiler::compile(make_op("Cumsum", {x.desc},
                                         {{"axis", c.axis}, {"exclusive", exclusive},
                                          {"reverse", reverse}}),
                                 test_sim().config());
      RunResult r = run_compiled(test_sim(), k, {x});
      REQUIRE(r.outputs.size() == 1);
      CHECK(r.outputs[0].desc == x.desc);
      CHECK(r.outputs[0].s64 == want);
    }
  }
}

TEST_CASE("UnsortedSegmentSum of s64: rows in any order, ids out of range dropped") {
  uint32_t seed = 360;
  struct Case {
    std::vector<int64_t> data, ids;
    int64_t segments;
    DataType id_type;
  };
  for (const Case& c : {Case{{20, 5}, {20}, 7, DataType::S32}, Case{{9}, {9}, 4, DataType::S64},
                        Case{{3, 4, 3}, {3, 4}, 5, DataType::S32},
                        Case{{6, 130}, {6}, 3, DataType::S64}, Case{{0, 3}, {0}, 2, DataType::S32},
                        Case{{4, 2}, {4}, 0, DataType::S32}}) {
    INFO("UnsortedSegmentSum " << compiler::shape_str(c.data) << " segments " << c.segments);
    HostTensor x = s64_tensor(c.data, seed++);
    HostTensor ids{TensorDesc{c.id_type, c.ids}, {}};
    std::mt19937 rng(seed++);
    for (int64_t i = 0; i < ids.desc.num_elements(); ++i)
      ids.values.push_back(static_cast<double>(static_cast<int64_t>(rng() % (c.segments + 3)) - 1));
    const int64_t rows = ids.desc.num_elements();
    int64_t inner = 1;
    for (size_t d = c.ids.size(); d < c.data.size(); ++d) inner *= c.data[d];
    std::vector<int64_t> want(static_cast<size_t>(c.segments * inner), 0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t id = static_cast<int64_t>(ids.values[static_cast<size_t>(r)]);
      if (id < 0 || id >= c.segments) continue;
      for (int64_t j = 0; j < inner; ++j)
        want[static_cast<size_t>(id * inner + j)] =
            wrap_add(want[static_cast<size_t>(id * inner + j)], x.s64[static_cast<size_t>(r * inner + j)]);
    }
    auto k = compiler::compile(make_op("UnsortedSegmentSum", {x.desc, ids.desc},
                                       {{"num_segments", c.segments}}),
                               test_sim().config());
    RunResult r = run_compiled(test_sim(), k, {x, ids});
    REQUIRE(r.outputs.size() == 1);
    CHECK(r.outputs[0].desc == TensorDesc{DataType::S64, [&] {
            std::vector<int64_t> s = {c.segments};
            s.insert(s.end(), c.data.begin() + static_cast<int64_t>(c.ids.size()), c.data.end());
            return s;
          }()});
    CHECK(r.outputs[0].s64 == want);
  }
}
