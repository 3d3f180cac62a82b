// MatMul compiled for the test chip (tiny by default: 2 cube cores, 910B cube buffers; 910b, 910
// or 310p with NPUSIM_TEST_CHIP) and run on the chip model, against a reference in plain C++:
// C = A x B summed in double from the exact inputs.
//
// Tolerance per element, with S = sum_k |a_ik * b_kj| and K the inner dimension:
//   accumulation: the cube adds in fp32, sequentially in k: at most K * 2^-24 * S (one fp32
//     rounding per addition, each at most 2^-24 relative to the partial sum, bounded by S),
//     and fp32 products of f32 inputs add another 2^-24 * S;
//   output rounding: half an ulp of the output type: 2^-11 |c| for f16, 2^-8 |c| for bf16,
//     2^-24 |c| for f32;
//   f32 inputs cast to f16 (allow_fp32_to_fp16, allow_mix_precision): each input rounded to
//     f16 (relative 2^-11), so a product is off by at most (2 * 2^-11 + 2^-22) relative: 2^-10 S.
// Each bound is doubled for slack; reference values are exact doubles.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <regex>
#include <tuple>

#include <fmt/format.h>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "adapter/compiler/ops/matmul.h"
#include "isa/disassembler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::PrecisionMode;

namespace {

double out_half_ulp(DataType t) {
  switch (t) {
    case DataType::F16: return std::ldexp(1.0, -11);
    case DataType::BF16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

struct MatmulCase {
  int64_t m, k, n;
  bool ta, tb;
};

// Builds the kernel of an op (default: compiler::compile for the test chip in the given mode).
using KernelFor = std::function<compiler::CompiledKernel(const compiler::OpDesc&)>;

// Runs MatMul(a, b) and checks every element against the double reference. bias: 0 MatMul;
// 1 MatMulBiasAdd (an f32 bias [n] added to C, one more term of the sum, whatever a and b's
// type: f16 a and b with the f32 bias is allow_mix_precision's float16 Dense layer, C rounded
// once to f16 after the bias); 2 the same with relu.
// Returns the run (its counters).
RunResult check_matmul(DataType dt, MatmulCase c, PrecisionMode mode, uint32_t seed, int bias = 0,
                       const KernelFor& build = {}) {
  INFO(compiler::data_type_name(dt)
       << " m=" << c.m << " k=" << c.k << " n=" << c.n << " ta=" << c.ta << " tb=" << c.tb
       << " mode " << compiler::precision_mode_name(mode));
  std::vector<int64_t> sa = c.ta ? std::vector<int64_t>{c.k, c.m} : std::vector<int64_t>{c.m, c.k};
  std::vector<int64_t> sb = c.tb ? std::vector<int64_t>{c.n, c.k} : std::vector<int64_t>{c.k, c.n};
  HostTensor a = random_tensor(dt, sa, -2, 2, seed), b = random_tensor(dt, sb, -2, 2, seed + 7);
  HostTensor bias_t = random_tensor(DataType::F32, {c.n}, -3, 3, seed + 9);
  compiler::OpDesc op =
      make_op("MatMul", {a.desc, b.desc}, {{"transpose_a", c.ta}, {"transpose_b", c.tb}});
  if (bias) {
    op.type = "MatMulBiasAdd";
    op.inputs.push_back(bias_t.desc);
    op.attrs["relu"] = bias == 2;
  }
  compiler::CompiledKernel k = build ? build(op) : compiler::compile(op, test_sim().config(), mode);
  for (const compiler::Launch& l : k.launches) INFO(l.summary);
  std::vector<HostTensor> inputs = {a, b};
  if (bias) inputs.push_back(bias_t);
  RunResult r = run_compiled(test_sim(), k, inputs);
  REQUIRE(r.outputs[0].desc.shape == std::vector<int64_t>{c.m, c.n});
  REQUIRE(r.outputs[0].desc.dtype == dt);
  auto at = [&](int64_t i, int64_t kk) {
    return a.values[static_cast<size_t>(c.ta ? kk * c.m + i : i * c.k + kk)];
  };
  auto bt = [&](int64_t kk, int64_t j) {
    return b.values[static_cast<size_t>(c.tb ? j * c.k + kk : kk * c.n + j)];
  };
  const bool f16_inputs = dt == DataType::F32 && mode != PrecisionMode::kKeepFp32;
  const DataType rounded_out =
      dt == DataType::F32 && mode == PrecisionMode::kAllowMixPrecision ? DataType::F16 : dt;
  int bad = 0;
  for (int64_t i = 0; i < c.m; ++i) {
    for (int64_t j = 0; j < c.n; ++j) {
      double sum = 0, s_abs = 0;
      for (int64_t kk = 0; kk < c.k; ++kk) {
        sum += at(i, kk) * bt(kk, j);
        s_abs += std::fabs(at(i, kk) * bt(kk, j));
      }
      if (bias) {  // one more term of the fp32 sum
        const double v = bias_t.values[static_cast<size_t>(j)];
        sum += v;
        s_abs += std::fabs(v);
      }
      double tol = static_cast<double>(c.k + 1) * std::ldexp(1.0, -24) * s_abs +
                   out_half_ulp(rounded_out) * std::fabs(sum);
      if (f16_inputs) tol += std::ldexp(1.0, -10) * s_abs;
      tol *= 2;
      if (bias == 2) sum = std::max(sum, 0.0);
      double got = r.outputs[0].values[static_cast<size_t>(i * c.n + j)];
      if (!(std::fabs(got - sum) <= tol) && bad++ < 5)
        UNSCOPED_INFO("C[" << i << "][" << j << "] = " << got << ", want " << sum << " +- " << tol);
    }
  }
  CHECK(bad == 0);
  return r;
}

// check_matmul where the test chip's cube multiplies dt operands in this mode; elsewhere the
// compiler's refusal (cube_type_refusal: the 910 and 310P cubes have neither bf16 nor fp32).
void check_matmul_where_supported(DataType dt, MatmulCase c, PrecisionMode mode, uint32_t seed) {
  const std::string refusal = cube_type_refusal(test_sim().config(), dt, mode);
  if (refusal.empty()) {
    check_matmul(dt, c, mode, seed);
    return;
  }
  compiler::TensorDesc a{dt,
                         c.ta ? std::vector<int64_t>{c.k, c.m} : std::vector<int64_t>{c.m, c.k}};
  compiler::TensorDesc b{dt,
                         c.tb ? std::vector<int64_t>{c.n, c.k} : std::vector<int64_t>{c.k, c.n}};
  CHECK_THROWS_WITH(
      compiler::compile(make_op("MatMul", {a, b}, {{"transpose_a", c.ta}, {"transpose_b", c.tb}}),
                        test_sim().config(), mode),
      Catch::Contains(refusal));
}

}  // namespace

TEST_CASE("MatMul f16: sizes that are and are not multiples of 16, all transposes") {
  const MatmulCase cases[] = {
      {1, 1, 1, false, false},
      {16, 16, 16, false, false},
      {17, 33, 5, false, false},
      {40, 70, 24, true, false},
      {33, 20, 47, false, true},
      {20, 45, 30, true, true},
      {64, 300, 48, false, false},
      // Several tiles per cube core with one L0C buffer (128x256 tiles), and several L1
      // chunks per tile with a partial last chunk (see the launch summaries).
      {200, 100, 300, false, false},
      {200, 100, 300, true, true},
      {96, 700, 80, false, true},
  };
  uint32_t seed = 100;
  for (const MatmulCase& c : cases)
    check_matmul(DataType::F16, c, PrecisionMode::kKeepFp32, seed++);
}

TEST_CASE("MatMul bf16 and f32 under the precision modes") {
  check_matmul_where_supported(DataType::BF16, {24, 40, 18, false, true}, PrecisionMode::kKeepFp32,
                               200);
  // fp32 on the cube (tiny's and 910b's cubes have fp32 at 1/4 rate): A x B^T only.
  check_matmul_where_supported(DataType::F32, {19, 37, 21, false, true}, PrecisionMode::kKeepFp32,
                               201);
  // fp32 cast to fp16 by a vector launch, fp32 accumulation and output.
  check_matmul(DataType::F32, {19, 37, 21, false, false}, PrecisionMode::kAllowFp32ToFp16, 202);
  check_matmul(DataType::F32, {21, 16, 35, true, true}, PrecisionMode::kAllowFp32ToFp16, 203);
  // Mixed: the result is rounded to fp16 too.
  check_matmul(DataType::F32, {30, 50, 10, false, false}, PrecisionMode::kAllowMixPrecision, 204);
}

TEST_CASE("MatMulBiasAdd: the bias from the bias table, ReLU in FIXPIPE, no extra launch") {
  const PrecisionMode fp16 = PrecisionMode::kAllowFp32ToFp16;
  check_matmul(DataType::F32, {19, 37, 21, false, false}, fp16, 300, 1);
  check_matmul(DataType::F32, {40, 70, 24, true, false}, fp16, 301, 2);
  check_matmul(DataType::F32, {200, 100, 300, false, true}, fp16, 302, 2);  // several tiles
  check_matmul(DataType::F32, {30, 50, 10, false, false}, PrecisionMode::kAllowMixPrecision, 303,
               2);
  check_matmul(DataType::F32, {8, 1, 12, false, false}, fp16, 304, 2);  // k = 1: vector epilogue
  // f16 a and b, f32 bias (allow_mix_precision's graph pass): the cube starts from the f32
  // bias, FIXPIPE rounds C once to f16 (within half an ulp of f16 of the exact sum).
  const PrecisionMode any = PrecisionMode::kKeepFp32;  // no f32 operand: the mode changes nothing
  check_matmul(DataType::F16, {19, 37, 21, false, false}, any, 305, 1);
  check_matmul(DataType::F16, {200, 100, 300, true, true}, any, 306, 2);
  check_matmul(DataType::F16, {8, 1, 12, false, false}, any, 307, 2);  // k = 1
  // k = 1 on the cube (not the vector outer product, f32 under allow_fp32_to_fp16 only): the
  // bias from the bias table too.
  check_matmul(DataType::F32, {8, 1, 12, false, false}, PrecisionMode::kAllowMixPrecision, 308, 2);
  compiler::TensorDesc a{DataType::F32, {32, 48}}, b{DataType::F32, {48, 16}};
  const auto plain = compiler::compile(make_op("MatMul", {a, b}), test_sim().config());
  const auto fused =
      compiler::compile(make_op("MatMulBiasAdd", {a, b, {DataType::F32, {16}}}, {{"relu", true}}),
                        test_sim().config());
  CHECK(fused.launches.size() == plain.launches.size());
  CHECK_THROWS_WITH(compiler::compile(make_op("MatMulBiasAdd", {a, b, {DataType::F32, {17}}}),
                                      test_sim().config()),
                    Catch::Contains("bias"));
  compiler::TensorDesc a16{DataType::F16, {32, 48}}, b16{DataType::F16, {48, 16}};
  const auto plain16 = compiler::compile(make_op("MatMul", {a16, b16}), test_sim().config());
  const auto fused16 = compiler::compile(
      make_op("MatMulBiasAdd", {a16, b16, {DataType::F32, {16}}}, {{"relu", true}}),
      test_sim().config());
  CHECK(fused16.launches.size() == plain16.launches.size());
  // The bias is f32 whatever a and b are (the sum it joins is f32).
  CHECK_THROWS_WITH(compiler::compile(make_op("MatMulBiasAdd", {a16, b16, {DataType::F16, {16}}}),
                                      test_sim().config()),
                    Catch::Contains("not f32[16]"));
  CHECK_THROWS_WITH(compiler::compile(make_op("MatMulBiasAdd", {{DataType::BF16, {32, 48}},
                                                                {DataType::BF16, {48, 16}},
                                                                {DataType::F32, {16}}}),
                                      test_sim().config()),
                    Catch::Contains("dtype bf16 is not supported"));
}

TEST_CASE("MatMul launches: casts for fp32, none for empty outputs, zeros for k = 0") {
  const ChipConfig& cfg = test_sim().config();
  compiler::TensorDesc a{DataType::F32, {8, 4}}, b{DataType::F32, {4, 8}};
  auto k16 = compiler::compile(make_op("MatMul", {a, b}), cfg, PrecisionMode::kAllowFp32ToFp16);
  // A and B cast to f16 into the workspace, then the cube kernel.
  REQUIRE(k16.launches.size() == 3);
  CHECK(k16.workspace_bytes > 0);
  auto mix = compiler::compile(make_op("MatMul", {a, b}), cfg, PrecisionMode::kAllowMixPrecision);
  CHECK(mix.launches.size() == 4);  // + the f16 -> f32 widening of the result
  // f32 on the cube needs B transposed, on chips whose cube has fp32 at all.
  const std::string no_fp32 = cube_type_refusal(cfg, DataType::F32, PrecisionMode::kKeepFp32);
  CHECK_THROWS_WITH(compiler::compile(make_op("MatMul", {a, b}), cfg, PrecisionMode::kKeepFp32),
                    Catch::Contains(no_fp32.empty() ? "transpose_b = true" : no_fp32));

  // M = 0: an empty output and nothing to run.
  compiler::TensorDesc e{DataType::F16, {0, 5}}, f{DataType::F16, {5, 3}};
  auto empty = compiler::compile(make_op("MatMul", {e, f}), cfg);
  CHECK(empty.launches.empty());
  CHECK(empty.outputs[0].shape == std::vector<int64_t>{0, 3});

  // K = 0: C is all zeros.
  HostTensor z1{compiler::TensorDesc{DataType::F16, {3, 0}}, {}};
  HostTensor z2{compiler::TensorDesc{DataType::F16, {0, 7}}, {}};
  auto kz = compiler::compile(make_op("MatMul", {z1.desc, z2.desc}), cfg);
  REQUIRE(kz.launches.size() == 1);
  RunResult r = run_compiled(test_sim(), kz, {z1, z2});
  CHECK(r.outputs[0].values == std::vector<double>(21, 0.0));

  CHECK_THROWS_WITH(compiler::compile(make_op("MatMul", {f, f}), cfg),
                    Catch::Contains("inner dimensions differ"));
}

TEST_CASE("MatMul tiling follows the config's L1/L0 sizes") {
  // The same op for the tiny chip and for a variant with a quarter of its L0A/L0B and L1:
  // k per mmad and per L1 chunk shrink with the buffers, so the programs differ. Only the
  // tiny chip is run (one SystemC elaboration per process); its numbers are checked above.
  ChipConfig small =
      load_chip_config("tiny", {"cores.aic.buffers.l0a=16 KiB", "cores.aic.buffers.l0b=16 KiB",
                                "cores.aic.buffers.l1=128 KiB"});
  const ChipConfig tiny = load_chip_config("tiny");  // tiny's numbers, whatever chip runs
  auto t_big = compiler::ops::plan_matmul_tiling(128, 128, 1024, false, false, isa::Dtype::F16,
                                                 isa::Dtype::F16, tiny, "test");
  auto t_small = compiler::ops::plan_matmul_tiling(128, 128, 1024, false, false, isa::Dtype::F16,
                                                   isa::Dtype::F16, small, "test");
  INFO(t_big.str() << "\n" << t_small.str());
  // Two L0A buffers of tm x tk_l0 f16 must fit: 2 * tm * tk_l0 * 2 <= L0A.
  CHECK(2 * t_big.tm * t_big.tk_l0 * 2 <= 64 * 1024);
  CHECK(2 * t_small.tm * t_small.tk_l0 * 2 <= 16 * 1024);
  CHECK(2 * (t_small.tm + t_small.tn) * t_small.tk_l1 * 2 <= 128 * 1024);
  CHECK(t_small.tk_l0 < t_big.tk_l0);
  CHECK(t_small.tk_l1 < t_big.tk_l1);
  compiler::TensorDesc a{DataType::F16, {128, 1024}}, b{DataType::F16, {1024, 128}};
  auto k_big = compiler::compile(make_op("MatMul", {a, b}), tiny);
  auto k_small = compiler::compile(make_op("MatMul", {a, b}), small);
  CHECK(isa::disassemble(k_big.launches[0].kernel.program) !=
        isa::disassemble(k_small.launches[0].kernel.program));
  // Core count: tiles are spread over the cube cores.
  ChipConfig one_core = load_chip_config("tiny", {"cores.aic.count=1", "cores.aiv.count=2"});
  auto k1 = compiler::compile(make_op("MatMul", {a, b}), one_core);
  CHECK(k1.launches[0].block_dim == 1);
  CHECK(k_big.launches[0].block_dim == 2);
  // And this tiling runs correctly on the test chip.
  check_matmul(DataType::F16, {128, 1024, 128, false, false}, PrecisionMode::kKeepFp32, 300);
}

TEST_CASE("MatMul core split: each cube core computes its own region of C") {
  // NPUSIM_MATMUL_CORE_SPLIT's tiling (apply_matmul_core_split) on C = 768 x 256, cut into two
  // regions down M: block 0 computes the first rm tile rows, block 1 the rest (fewer). Values
  // against the double reference; each core's cube busy cycles against the config: one mmad of
  // k 64 per (full) tile, cube.latency_cycles + (tm / cube_m) (64 / cube_k) (tn / cube_n) cycles.
  const ChipConfig& cfg = test_sim().config();
  const int64_t m = 768, n = 256, k = 64;
  compiler::ops::MatmulTiling t = compiler::ops::plan_matmul_tiling(
      m, n, k, false, false, isa::Dtype::F16, isa::Dtype::F16, cfg, "MatMul");
  INFO(t.str());
  REQUIRE(t.tk_l0 >= k);
  REQUIRE(m % t.tm == 0);
  REQUIRE(n % t.tn == 0);
  const int64_t rm = t.tiles_m - t.tiles_m / 3;  // tile rows of the first region (6 -> 4)
  compiler::ops::apply_matmul_core_split(t, fmt::format("{}x{}", rm * t.tm, n), cfg, "MatMul");
  INFO(t.str());
  CHECK(t.block_dim == 2);
  CHECK(t.regions_m == 2);

  const RunResult r = check_matmul(
      DataType::F16, {m, k, n, false, false}, PrecisionMode::kKeepFp32, 401, 0,
      [&](const compiler::OpDesc&) {
        compiler::CompiledKernel ck;
        ck.outputs = {TensorDesc{DataType::F16, {m, n}}};
        compiler::Launch l = compiler::ops::build_matmul_launch(t, cfg, "MatMul");
        using compiler::ArgRef;
        l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kInput, 1, 0},
                  ArgRef{ArgRef::Kind::kOutput, 0, 0}};
        ck.launches.push_back(std::move(l));
        return ck;
      });

  const uint64_t per_tile =
      static_cast<uint64_t>(cfg.cube_latency_cycles) + static_cast<uint64_t>(t.tm / cfg.cube_m) *
                                                           static_cast<uint64_t>(k / cfg.cube_k) *
                                                           static_cast<uint64_t>(t.tn / cfg.cube_n);
  const nlohmann::json& chip = r.counters.at(0).at("chip");
  INFO(chip.dump());
  const uint64_t tiles0 = static_cast<uint64_t>(rm * t.tiles_n);
  const uint64_t tiles1 = static_cast<uint64_t>((t.tiles_m - rm) * t.tiles_n);
  // the cube cores: a split chip's AIC cores, a coupled chip's AI cores
  const std::string cube =
      isa::core_kind_name(cfg.split ? isa::CoreKind::AIC : isa::CoreKind::AICORE);
  CHECK(chip.at(cube + "0").at("m").at("busy_cycles").at("value").get<uint64_t>() ==
        tiles0 * per_tile);
  CHECK(chip.at(cube + "1").at("m").at("busy_cycles").at("value").get<uint64_t>() ==
        tiles1 * per_tile);
}

TEST_CASE("MatMul core split: tiles planned for the cores the split uses") {
  // A split of one region is one cube core computing all of C: the plan is the unforced plan
  // of the chip with one cube core (the same candidates, costs and choice; C's sides multiples
  // of 256, so that every candidate tile divides the split). On the 910b config
  // the unforced 24-core plan takes small tiles (64x64 for 256^3) that one core would run one
  // by one (21,633 cycles against 15,812 for the one-core plan's 128x128).
  for (const std::string& chip : {std::string("910b"), test_chip_name()}) {
    const ChipConfig cfg = load_chip_config(chip);
    const std::string cube = isa::core_kind_name(compiler::ops::cube_core(cfg, "MatMul").kind);
    std::vector<std::string> one = {fmt::format("cores.{}.count=1", cube)};
    if (cfg.split) one.push_back(fmt::format("cores.aiv.count={}", cfg.aiv_per_aic));
    const ChipConfig one_core = load_chip_config(chip, one);
    for (auto [m, k, n] : {std::tuple<int64_t, int64_t, int64_t>{256, 256, 256},
                           {128, 1024, 128},
                           {512, 64, 768}}) {
      INFO(chip << " " << m << "x" << k << "x" << n);
      const compiler::ops::MatmulCoreSplit whole{m, n};
      auto plan = [&](const ChipConfig& c, const compiler::ops::MatmulCoreSplit* split) {
        return compiler::ops::plan_matmul_tiling(m, n, k, false, false, isa::Dtype::F16,
                                                 isa::Dtype::F16, c, "MatMul", 1, false, false,
                                                 false, split);
      };
      compiler::ops::MatmulTiling t = plan(cfg, &whole);
      const compiler::ops::MatmulTiling want = plan(one_core, nullptr);
      INFO(t.str() << "\n" << want.str());
      CHECK(t.tm == want.tm);
      CHECK(t.tn == want.tn);
      CHECK(t.tk_l0 == want.tk_l0);
      CHECK(t.tk_l1 == want.tk_l1);
      compiler::ops::apply_matmul_core_split(t, fmt::format("{}x{}", m, n), cfg, "MatMul");
      CHECK(t.block_dim == 1);
    }
  }
  // Two regions down M: every tile side divides the region's, one block per region.
  const ChipConfig b = load_chip_config("910b");
  const compiler::ops::MatmulCoreSplit half{256, 512};
  compiler::ops::MatmulTiling t = compiler::ops::plan_matmul_tiling(
      512, 512, 256, false, false, isa::Dtype::F16, isa::Dtype::F16, b, "MatMul", 1, false, false,
      false, &half);
  INFO(t.str());
  CHECK(256 % t.tm == 0);
  CHECK(512 % t.tn == 0);
  compiler::ops::apply_matmul_core_split(t, "256x512", b, "MatMul");
  CHECK(t.block_dim == 2);
  // A split no tile divides (sides not multiples of 16): the plan without it, and the split's
  // error names the mismatch.
  const compiler::ops::MatmulCoreSplit odd{100, 512};
  t = compiler::ops::plan_matmul_tiling(512, 512, 256, false, false, isa::Dtype::F16,
                                        isa::Dtype::F16, b, "MatMul", 1, false, false, false, &odd);
  CHECK_THROWS_WITH(compiler::ops::apply_matmul_core_split(t, "100x512", b, "MatMul"),
                    Catch::Contains("not a multiple of the"));
}

TEST_CASE("MatMul core split: no split, batches, and bad values") {
  const ChipConfig tiny = load_chip_config("tiny");  // 2 cube cores
  auto plan = [&](int64_t batch) {
    return compiler::ops::plan_matmul_tiling(768, 256, 64, false, false, isa::Dtype::F16,
                                             isa::Dtype::F16, tiny, "MatMul", batch);
  };
  compiler::ops::MatmulTiling t = plan(1);
  const compiler::ops::MatmulTiling before = t;
  compiler::ops::apply_matmul_core_split(t, "", tiny, "MatMul");  // unset: round-robin
  CHECK(t.region_tiles_m == 0);
  CHECK(t.block_dim == before.block_dim);
  compiler::ops::MatmulTiling batched = plan(3);
  compiler::ops::apply_matmul_core_split(batched, "512x256", tiny, "MatMul");
  CHECK(batched.region_tiles_m == 0);  // batched products keep the round-robin
  using Catch::Matchers::Contains;
  for (const char* bad : {"512", "512x", "x256", "512*256", "0x256", "512x256x1", "-128x256"})
    CHECK_THROWS_WITH(compiler::ops::apply_matmul_core_split(t, bad, tiny, "MatMul"),
                      Contains("NPUSIM_MATMUL_CORE_SPLIT") && Contains("is not MxN"));
  CHECK_THROWS_WITH(compiler::ops::apply_matmul_core_split(t, "100x256", tiny, "MatMul"),
                    Contains("not a multiple of the"));
  // 768 / 128 = 6 regions down M, more than tiny's 2 cube cores.
  CHECK_THROWS_WITH(
      compiler::ops::apply_matmul_core_split(t, fmt::format("{}x256", t.tm), tiny, "MatMul"),
      Contains("more than the 2 cube cores"));
}

TEST_CASE("MatMul L1 chunks: rows of k of at least a GM burst, whole bursts where the DMA prices them") {
  // A GM burst is 512 bytes (sim/exec/mte_common.h kGmBurstBytes); the keys are the DataCopy
  // sample's set A (docs/validation.md "What an MTE copy costs per instruction and per GM burst").
  constexpr int64_t kBurst = 512;
  // The 910b without the DMA's issue keys (the 910b preset prices it since 2026-12-06: set B).
  const ChipConfig unpriced =
      load_chip_config("910b", {"mte.copy_issue_cycles=0", "mte.burst_cycles=0"});
  const ChipConfig set_a =
      load_chip_config("910b", {"mte.copy_issue_cycles=12.518", "mte.burst_cycles=8.114"});
  struct Shape {
    int64_t m, n, k;
    bool ta, tb;
  };
  const Shape shapes[] = {{8192, 8192, 8192, false, true}, {4096, 4096, 4096, false, true},
                          {4096, 4096, 4096, false, false}, {2048, 2048, 2048, false, false},
                          {1024, 1024, 1024, false, false}, {2048, 512, 4096, true, false},
                          {256, 256, 256, false, true},       {64, 1000, 2048, false, false},
                          {1000, 64, 2048, false, true}};
  for (const Shape& s : shapes) {
    for (const isa::Dtype dt : {isa::Dtype::F16, isa::Dtype::F32}) {
      const int64_t isz = isa::dtype_size(dt);
      for (const ChipConfig* cfg : {&unpriced, &set_a}) {
        const compiler::ops::MatmulTiling t = compiler::ops::plan_matmul_tiling(
            s.m, s.n, s.k, s.ta, s.tb, dt, dt, *cfg, "MatMul");
        INFO(t.str() << (cfg == &set_a ? " (set A)" : " (keys 0)"));
        // The chunk's rows of k (A, and B stored transposed) are at least a burst, or all of k.
        CHECK(t.tk_l1 * isz >= std::min(s.k * isz, kBurst));
        // Where the DMA's issue is priced per burst and both operands' rows run along k (A, B
        // transposed), a chunk that is not all of k is whole bursts (so from a burst boundary,
        // the operands' rows being whole bursts here). (Elsewhere the planner weighs it against
        // the largest chunk: B's rows of n may outweigh A's of k.)
        if (cfg == &set_a && !s.ta && s.tb && t.tk_l1 < s.k) CHECK((t.tk_l1 * isz) % kBurst == 0);
      }
      // The keys at 0: the plan the largest chunk that fits gives (nothing moves where nothing is priced).
      setenv("NPUSIM_MATMUL_BURST_CHUNKS", "0", 1);
      const compiler::ops::MatmulTiling old = compiler::ops::plan_matmul_tiling(
          s.m, s.n, s.k, s.ta, s.tb, dt, dt, unpriced, "MatMul");
      unsetenv("NPUSIM_MATMUL_BURST_CHUNKS");
      const compiler::ops::MatmulTiling now = compiler::ops::plan_matmul_tiling(
          s.m, s.n, s.k, s.ta, s.tb, dt, dt, unpriced, "MatMul");
      CHECK(now.str() == old.str());
      // The estimate other kernels' plans are weighed against leaves the issue out (no
      // convolution's prices it): with set A it is the unpriced plan's.
      const compiler::ops::MatmulTiling keyed = compiler::ops::plan_matmul_tiling(
          s.m, s.n, s.k, s.ta, s.tb, dt, dt, set_a, "MatMul");
      CHECK(keyed.est_cycles == Approx(now.est_cycles).epsilon(1e-9));
    }
  }
  // 4096^3 with B transposed on set A: 128 x 256 tiles whose largest chunk (320 f16 of k, 640
  // bytes a row) takes two bursts a row; the whole-burst chunk of 256 takes one, so the chunk's
  // issue, 2 x 12.518 + 8.114 x (128 + 256) rows, is 3,141 cycles where 320 took 6,257.
  const compiler::ops::MatmulTiling t = compiler::ops::plan_matmul_tiling(
      4096, 4096, 4096, false, true, isa::Dtype::F16, isa::Dtype::F16, set_a, "MatMul");
  INFO(t.str());
  CHECK(t.tk_l1 == 256);
  // And a whole-burst chunk computes right on the test chip: a plan for the test chip with the
  // keys set, its kernel run on the test chip (the keys move only time).
  const ChipConfig& chip = test_sim().config();
  const ChipConfig keyed =
      load_chip_config(chip.name, {"mte.copy_issue_cycles=12.518", "mte.burst_cycles=8.114"});
  const compiler::ops::MatmulTiling tk = compiler::ops::plan_matmul_tiling(
      128, 128, 1200, false, true, isa::Dtype::F16, isa::Dtype::F16, keyed, "MatMul");
  INFO(tk.str());
  CHECK((tk.tk_l1 * 2) % kBurst == 0);
  check_matmul(DataType::F16, {128, 1200, 128, false, true}, PrecisionMode::kKeepFp32, 301, 0,
               [&](const compiler::OpDesc& op) { return compiler::compile(op, keyed); });
}

TEST_CASE("MatMul staggered tiles: the cores running together share few bands of A") {
  // The 910b with same-line serialisation in the L2 (memory.l2.line_read_bytes_per_cycle R =
  // 302.6, docs/validation.md "Same-line serialisation in the L2"): a line serves R / k to each
  // of k readers, at most `sharers` = floor(R / the core's L2 read port) of them at the port's
  // rate. The tile order keeps each block's tiles (block + j x block_dim) and places them so
  // that the block_dim tiles of step j read each band of A at most `sharers` times; row by row
  // they read one or two bands, each by up to tiles_n cores.
  const ChipConfig plain = load_chip_config("910b", {"memory.l2.line_read_bytes_per_cycle=0"});
  const ChipConfig serial = load_chip_config("910b", {"memory.l2.line_read_bytes_per_cycle=302.6"});
  REQUIRE(plain.l2_line_read_bytes_per_cycle == 0);  // not serialised
  REQUIRE(serial.l2_read_bytes_per_cycle > 0);
  const int64_t sharers = static_cast<int64_t>(
      std::floor(serial.l2_line_read_bytes_per_cycle / serial.l2_read_bytes_per_cycle));
  REQUIRE(sharers >= 1);
  struct Shape {
    int64_t m, n, k;
    bool tb;
  };
  const Shape shapes[] = {{4096, 4096, 4096, false}, {8192, 8192, 8192, false},
                          {2048, 2048, 2048, false}, {8192, 8192, 8192, true},
                          {1024, 1024, 1024, false}, {3000, 1000, 512, false},
                          {64, 1000, 2048, false},   {1000, 64, 2048, true}};
  for (const Shape& s : shapes) {
    const compiler::ops::MatmulTiling row = compiler::ops::plan_matmul_tiling(
        s.m, s.n, s.k, false, s.tb, isa::Dtype::F16, isa::Dtype::F16, plain, "MatMul");
    const compiler::ops::MatmulTiling t = compiler::ops::plan_matmul_tiling(
        s.m, s.n, s.k, false, s.tb, isa::Dtype::F16, isa::Dtype::F16, serial, "MatMul");
    INFO(t.str());
    CHECK(row.stagger_bands == 0);
    // The same tiles, cores and chunks: only their order moves.
    CHECK(t.tm == row.tm);
    CHECK(t.tn == row.tn);
    CHECK(t.tk_l1 == row.tk_l1);
    CHECK(t.block_dim == row.block_dim);
    if (t.tiles_m == 1 || t.tiles_n == 1) {
      CHECK(t.stagger_bands == 0);
      continue;
    }
    REQUIRE(t.stagger_bands > 0);
    // Every tile once.
    const int64_t tiles = t.tiles_m * t.tiles_n;
    std::vector<int> seen(static_cast<size_t>(tiles), 0);
    for (int64_t i = 0; i < tiles; ++i) {
      const compiler::ops::MatmulTileCoord c = compiler::ops::matmul_tile_at(t, i);
      REQUIRE(c.m >= 0);
      REQUIRE(c.m < t.tiles_m);
      REQUIRE(c.n >= 0);
      REQUIRE(c.n < t.tiles_n);
      ++seen[static_cast<size_t>(c.m * t.tiles_n + c.n)];
    }
    CHECK(std::count(seen.begin(), seen.end(), 1) == tiles);
    // Step j: the most cores on one band of A, staggered and row by row.
    const int64_t bd = t.block_dim;
    int64_t most = 0, most_row = 0;
    for (int64_t first = 0; first < tiles; first += bd) {
      std::vector<int64_t> on(static_cast<size_t>(t.tiles_m), 0), on_row(on);
      for (int64_t i = first; i < std::min(tiles, first + bd); ++i) {
        most = std::max(most, ++on[static_cast<size_t>(compiler::ops::matmul_tile_at(t, i).m)]);
        most_row = std::max(most_row, ++on_row[static_cast<size_t>(i / t.tiles_n)]);
      }
    }
    INFO("most cores on one band of A at a step: " << most << ", row by row " << most_row);
    // At most `sharers` where the bands allow it (at least block_dim / sharers of them).
    if (t.tiles_m * sharers >= bd) CHECK(most <= sharers);
    CHECK(most <= most_row);
    // The first tiles of blocks 0 and 1 are on different bands of A (row by row: the same).
    CHECK(compiler::ops::matmul_tile_at(t, 0).m != compiler::ops::matmul_tile_at(t, 1).m);
  }
  // 4096^3: 32 x 16 tiles of 128 x 256 over 24 cores; row by row step 0 puts 16 cores on band 0.
  // Staggered: groups of 16 bands, at most 2 cores on a band of A or a column of B at a step.
  const compiler::ops::MatmulTiling t = compiler::ops::plan_matmul_tiling(
      4096, 4096, 4096, false, false, isa::Dtype::F16, isa::Dtype::F16, serial, "MatMul");
  INFO(t.str());
  CHECK(t.stagger_bands == 16);
  for (int64_t first = 0; first < t.tiles_m * t.tiles_n; first += t.block_dim) {
    std::vector<int64_t> on_n(static_cast<size_t>(t.tiles_n), 0);
    for (int64_t i = first; i < std::min(t.tiles_m * t.tiles_n, first + t.block_dim); ++i)
      CHECK(++on_n[static_cast<size_t>(compiler::ops::matmul_tile_at(t, i).n)] <= 2);
  }
  // The switch: row by row.
  setenv("NPUSIM_MATMUL_STAGGERED_TILES", "0", 1);
  CHECK(compiler::ops::plan_matmul_tiling(4096, 4096, 4096, false, false, isa::Dtype::F16,
                                          isa::Dtype::F16, serial, "MatMul")
            .stagger_bands == 0);
  setenv("NPUSIM_MATMUL_STAGGERED_TILES", "2", 1);
  CHECK_THROWS_WITH(compiler::ops::plan_matmul_tiling(4096, 4096, 4096, false, false,
                                                      isa::Dtype::F16, isa::Dtype::F16, serial,
                                                      "MatMul"),
                    Catch::Contains("NPUSIM_MATMUL_STAGGERED_TILES='2'"));
  unsetenv("NPUSIM_MATMUL_STAGGERED_TILES");
}

TEST_CASE("MatMul staggered tiles: the kernel computes every tile, the same bits as row by row") {
  // A plan for the test chip with R set (so its tiles go staggered, in groups of bands the last
  // of which takes the remainder), run on the test chip (R moves only time): values against the
  // double reference, and bit for bit against the row-by-row kernel (each tile's k order is the
  // same: sequential, from k = 0).
  const ChipConfig& chip = test_sim().config();
  // R for half the cube cores on a line at the port's rate (groups of 2 bands: several groups
  // in few rows on every chip); not every preset has the key: set on a copy.
  ChipConfig serial = chip;
  const int cube_cores = compiler::ops::cube_core(chip, "MatMul").count;
  const double port = chip.l2_read_bytes_per_cycle > 0 ? chip.l2_read_bytes_per_cycle : 1;
  serial.l2_line_read_bytes_per_cycle = port * std::max(1, cube_cores / 2);
  struct Case {
    MatmulCase c;
    uint32_t seed;
  };
  int staggered_cases = 0, grouped_cases = 0;
  const std::regex groups(R"(\((\d+)x\d+ = .*groups of (\d+) bands)");
  for (const Case& cs : {Case{{200, 96, 300, false, false}, 501},
                         Case{{300, 64, 200, true, true}, 502},
                         Case{{17, 40, 500, false, true}, 503},
                         Case{{1100, 32, 300, false, false}, 504}}) {
    const compiler::OpDesc probe = make_op(
        "MatMul", {TensorDesc{DataType::F16, {cs.c.ta ? cs.c.k : cs.c.m, cs.c.ta ? cs.c.m : cs.c.k}},
                   TensorDesc{DataType::F16, {cs.c.tb ? cs.c.n : cs.c.k, cs.c.tb ? cs.c.k : cs.c.n}}},
        {{"transpose_a", cs.c.ta}, {"transpose_b", cs.c.tb}});
    const compiler::CompiledKernel staggered = compiler::compile(probe, serial);
    bool is_staggered = false;  // the cube launch's (C's rows may be copied out by another)
    for (const compiler::Launch& l : staggered.launches) {
      INFO(l.summary);
      is_staggered |= l.summary.find("staggered tiles") != std::string::npos;
      std::smatch g;  // several groups of bands (the last with the remainder)
      if (std::regex_search(l.summary, g, groups) && std::stoi(g[2]) * 2 <= std::stoi(g[1]))
        ++grouped_cases;
    }
    staggered_cases += is_staggered;
    const RunResult a = check_matmul(DataType::F16, cs.c, PrecisionMode::kKeepFp32, cs.seed, 0,
                                     [&](const compiler::OpDesc& op) {
                                       return compiler::compile(op, serial);
                                     });
    const RunResult b = check_matmul(DataType::F16, cs.c, PrecisionMode::kKeepFp32, cs.seed);
    CHECK(a.outputs[0].values == b.outputs[0].values);
  }
  // Several tile rows and columns over several cube cores: the first two shapes on every chip.
  // 1100 rows: several groups of bands on the test chips (tiny: 9 bands of 128 in 4 groups).
  if (cube_cores > 1) {
    CHECK(staggered_cases >= 2);
    CHECK(grouped_cases >= 1);
  }
}

TEST_CASE("MatMul unit flag: the tile's mmads and FIXPIPE synchronise by UnitFlag, same bits") {
  // NPUSIM_MATMUL_UNIT_FLAG=1: each tile's mmads carry .uf2 (.uf3 on its last step), its
  // FIXPIPE .uf3, and no M -> FIX flag is set. The values against the double reference, and
  // bit for bit against the kernel synchronised by flags (the same instructions move the same
  // data). Shapes: one k step, several k steps and L1 chunks, ragged tiles, transposes, a bias.
  const ChipConfig& chip = test_sim().config();
  const bool direct = !compiler::ops::cube_store_via_ub(
      chip, compiler::ops::cube_core(chip, "MatMul"), "MatMul");
  struct Case {
    MatmulCase c;
    uint32_t seed;
    int bias;
  };
  for (const Case& cs : {Case{{16, 16, 16, false, false}, 601, 0},
                         Case{{200, 1000, 300, false, false}, 602, 0},
                         Case{{77, 530, 45, true, true}, 603, 0},
                         Case{{64, 700, 96, false, true}, 604, 1}}) {
    setenv("NPUSIM_MATMUL_UNIT_FLAG", "1", 1);
    compiler::CompiledKernel with;
    const RunResult on = check_matmul(DataType::F16, cs.c, PrecisionMode::kKeepFp32, cs.seed,
                                      cs.bias, [&](const compiler::OpDesc& op) {
                                        with = compiler::compile(op, chip);
                                        return with;
                                      });
    unsetenv("NPUSIM_MATMUL_UNIT_FLAG");
    const RunResult off =
        check_matmul(DataType::F16, cs.c, PrecisionMode::kKeepFp32, cs.seed, cs.bias);
    CHECK(on.outputs[0].values == off.outputs[0].values);
    const std::string listing = isa::disassemble(with.launches[0].kernel.program);
    if (direct) {
      CHECK(listing.find("mmad.f16.uf3") != std::string::npos);
      CHECK(listing.find(".uf3 gm,") != std::string::npos);  // the fixpipe
      CHECK(listing.find("wait_flag m, fix") == std::string::npos);
    } else {  // tiles leave L0C through the UB: no unit flags
      CHECK(listing.find(".uf") == std::string::npos);
    }
  }
  setenv("NPUSIM_MATMUL_UNIT_FLAG", "2", 1);
  CHECK_THROWS_WITH(
      compiler::compile(make_op("MatMul", {TensorDesc{DataType::F16, {32, 32}},
                                           TensorDesc{DataType::F16, {32, 32}}},
                                {}),
                        chip),
      Catch::Contains("NPUSIM_MATMUL_UNIT_FLAG='2' is neither '0' nor '1'"));
  unsetenv("NPUSIM_MATMUL_UNIT_FLAG");
}
