// MatMulBiasAdd on a coupled chip (tiny_coupled: the 310p core, 2 AI cores; no l0c->gm path and
// no bias table): the bias and the ReLU are applied by the vector unit on each f32 tile in the
// UB, in the MatMul's own kernel (MatmulTiling::bias_in_ub), instead of a BiasAdd launch after
// it. Reference: the unfused path's own arithmetic, the plain MatMul's f32 result run on the
// same chip plus the bias in f32 (one RNE rounding, as the BiasAdd launch adds it), then
// max(., 0): equal bit for bit. And the real product in double within the fp16-operand bound of
// test_compiler_coupled.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/matmul.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny_coupled"), SimOptions{});
  return s;
}

bool has_bias_launch(const compiler::CompiledKernel& k) {
  for (const compiler::Launch& l : k.launches)
    if (l.kernel.program.name.rfind("BiasAdd", 0) == 0) return true;
  return false;
}

// C = A (m x k, or k x m with ta) x B (k x n, or n x k with tb) + bias [n], max(., 0) with relu.
void check_bias_in_ub(int64_t m, int64_t k, int64_t n, bool ta, bool tb, bool relu, uint32_t seed) {
  INFO("m=" << m << " k=" << k << " n=" << n << " ta=" << ta << " tb=" << tb << " relu=" << relu);
  HostTensor a = random_tensor(
      DataType::F32, ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, -2, 2, seed);
  HostTensor b = random_tensor(
      DataType::F32, tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, -2, 2, seed + 1);
  HostTensor bias = random_tensor(DataType::F32, {n}, -3, 3, seed + 2);
  const std::map<std::string, compiler::AttrValue> attrs{{"transpose_a", ta}, {"transpose_b", tb}};
  std::map<std::string, compiler::AttrValue> fused_attrs = attrs;
  fused_attrs["relu"] = relu;
  auto plain = compiler::compile(make_op("MatMul", {a.desc, b.desc}, attrs), sim().config());
  auto fused = compiler::compile(make_op("MatMulBiasAdd", {a.desc, b.desc, bias.desc}, fused_attrs),
                                 sim().config());
  for (const compiler::Launch& l : fused.launches) INFO(l.summary);
  // The bias rides in the MatMul's kernel: as many launches as the plain product.
  CHECK(fused.launches.size() == plain.launches.size());
  CHECK_FALSE(has_bias_launch(fused));
  RunResult c = run_compiled(sim(), plain, {a, b});
  RunResult r = run_compiled(sim(), fused, {a, b, bias});
  std::vector<double> want(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const size_t at = static_cast<size_t>(i * n + j);
      const float y = static_cast<float>(c.outputs[0].values[at]) +
                      static_cast<float>(bias.values[static_cast<size_t>(j)]);
      want[at] = relu ? std::max(y, 0.0f) : y;
    }
  check_close(r.outputs[0].values, want, 0, 0, "MatMulBiasAdd vs MatMul + f32 bias");
  int bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      // fp16 operands (allow_fp32_to_fp16): each product off by at most 2^-10 relative.
      double sum = bias.values[static_cast<size_t>(j)], s_abs = std::fabs(sum);
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p = a.values[static_cast<size_t>(ta ? kk * m + i : i * k + kk)] *
                         b.values[static_cast<size_t>(tb ? j * k + kk : kk * n + j)];
        sum += p;
        s_abs += std::fabs(p);
      }
      const double tol = 2 * ((k + 2) * std::ldexp(1.0, -24) + std::ldexp(1.0, -10)) * s_abs;
      const double ref = relu ? std::max(sum, 0.0) : sum;
      const double got = r.outputs[0].values[static_cast<size_t>(i * n + j)];
      if (!(std::fabs(got - ref) <= tol) && bad++ < 5)
        UNSCOPED_INFO("C[" << i << "][" << j << "] = " << got << ", want " << ref);
    }
  CHECK(bad == 0);
}

// f16 a and b with an f32 bias (allow_mix_precision's float16 Dense layer, CANN's MatMulV2 with
// a bias under mixed precision): the f32 tile in the UB gets the bias, then C is rounded once to
// f16. Reference: the f32 MatMul of the same f16-valued operands on the same chip (the cube reads
// them exactly and sums in f32: the same f32 tile) plus the bias in f32, rounded once to f16
// (RNE), max(., 0) with relu: equal bit for bit. The unfused chain's result, MatMul(f16) rounded
// to f16 then BiasAdd(f16) rounded again, differs from it somewhere: the comparison tells one
// rounding from two.
void check_f16_bias_in_ub(int64_t m, int64_t k, int64_t n, bool relu, uint32_t seed) {
  INFO("f16 m=" << m << " k=" << k << " n=" << n << " relu=" << relu);
  HostTensor a = random_tensor(DataType::F16, {m, k}, -2, 2, seed);
  HostTensor b = random_tensor(DataType::F16, {k, n}, -2, 2, seed + 1);
  HostTensor bias = random_tensor(DataType::F32, {n}, -3, 3, seed + 2);
  HostTensor a32{TensorDesc{DataType::F32, a.desc.shape}, a.values};
  HostTensor b32{TensorDesc{DataType::F32, b.desc.shape}, b.values};
  auto plain16 = compiler::compile(make_op("MatMul", {a.desc, b.desc}), sim().config());
  auto fused = compiler::compile(
      make_op("MatMulBiasAdd", {a.desc, b.desc, bias.desc}, {{"relu", relu}}), sim().config());
  for (const compiler::Launch& l : fused.launches) INFO(l.summary);
  CHECK(fused.launches.size() == plain16.launches.size());
  CHECK_FALSE(has_bias_launch(fused));
  auto plain32 = compiler::compile(make_op("MatMul", {a32.desc, b32.desc}), sim().config(),
                                   compiler::PrecisionMode::kAllowFp32ToFp16);
  RunResult c = run_compiled(sim(), plain32, {a32, b32});
  RunResult r = run_compiled(sim(), fused, {a, b, bias});
  REQUIRE(r.outputs[0].desc.dtype == DataType::F16);
  std::vector<double> once(static_cast<size_t>(m * n));
  int twice_differs = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const size_t at = static_cast<size_t>(i * n + j);
      const float sum = static_cast<float>(c.outputs[0].values[at]);
      const float bj = static_cast<float>(bias.values[static_cast<size_t>(j)]);
      const double y = round_to(DataType::F16, static_cast<double>(sum + bj));
      const double y2 =
          round_to(DataType::F16,
                   static_cast<double>(static_cast<float>(round_to(DataType::F16, sum)) + bj));
      once[at] = relu ? std::max(y, 0.0) : y;
      if ((relu ? std::max(y2, 0.0) : y2) != once[at]) ++twice_differs;
    }
  check_close(r.outputs[0].values, once, 0, 0, "f16 MatMulBiasAdd vs f16(f32 MatMul + f32 bias)");
  CHECK(twice_differs > 0);
}

}  // namespace

TEST_CASE("coupled MatMulBiasAdd f16 with an f32 bias: one rounding after the bias in the UB") {
  check_f16_bias_in_ub(32, 48, 64, true, 61);
  // Several tiles, partial last ones, n not a whole number of 32-byte blocks of f16 (padded
  // rows in the workspace, then packed); without ReLU.
  check_f16_bias_in_ub(150, 72, 200, false, 71);
}

TEST_CASE("coupled MatMulBiasAdd f16: wide tiles leave L0C in column bands of 64") {
  // The UB holds two bands of 64 columns (f32 and f16) and the table, not whole tiles, so the
  // planner may take tiles wider than one band with the bias in the UB. On the 910, BERT-Large's
  // Dense shape takes a tile whose f32 and f16 copies, two of each, would not fit the UB.
  const ChipConfig c910 = load_chip_config("910");
  const int64_t ub910 =
      static_cast<int64_t>(c910.core_kind(isa::CoreKind::AICORE)->capacity(isa::Buf::UB));
  auto wide =
      compiler::ops::plan_matmul_tiling(12288, 1024, 1024, false, false, isa::Dtype::F16,
                                        isa::Dtype::F16, c910, "test", 1, false, false, true);
  INFO(wide.str());
  CHECK(wide.bias_in_ub);
  CHECK(compiler::ops::matmul_bias_ub_bytes(wide.tm, wide.tn, 2, 1024) <= ub910);
  CHECK(2 * wide.tm * wide.tn * (4 + 2) > ub910);
  // Run on this chip: several bands per tile, the last tile column 44 wide (a partial band, 11
  // blocks of f16 per row).
  const int64_t ub =
      static_cast<int64_t>(sim().config().core_kind(isa::CoreKind::AICORE)->capacity(isa::Buf::UB));
  auto t = compiler::ops::plan_matmul_tiling(520, 300, 64, false, false, isa::Dtype::F16,
                                             isa::Dtype::F16, sim().config(), "test", 1, false,
                                             false, true);
  INFO(t.str());
  CHECK(t.bias_in_ub);
  CHECK(t.tn > 64);
  CHECK(300 % t.tn == 44);
  CHECK(compiler::ops::matmul_bias_ub_bytes(t.tm, t.tn, 2, 300) <= ub);
  // Partial last tiles in both directions, with ReLU.
  check_f16_bias_in_ub(520, 64, 300, true, 81);
}

TEST_CASE("coupled MatMulBiasAdd: the bias and ReLU on the tiles in the UB, no extra launch") {
  REQUIRE_FALSE(sim().config().has_path(isa::Buf::L1, isa::Buf::BT));
  REQUIRE_FALSE(sim().config().has_path(isa::Buf::L0C, isa::Buf::GM));
  // Rows whole blocks (C straight to the output), one tile per core.
  check_bias_in_ub(32, 48, 64, false, false, true, 11);
  // n = 20 f32: rows padded to 24 in the workspace, then packed by a copy launch.
  check_bias_in_ub(24, 40, 20, false, false, true, 21);
  // Several tiles in both directions, column groups past 64 lanes with a masked last one, the
  // last tiles partial; without ReLU (negative values kept).
  check_bias_in_ub(150, 72, 200, false, true, false, 31);
  // Transposed A, Dense-like shapes (batch 8 x 128 features -> 96).
  check_bias_in_ub(8, 128, 96, true, false, true, 41);
}

TEST_CASE("coupled MatMulBiasAdd: tall tiles take their rows in runs of at most 255") {
  // m = 600 with k small: the planner's tiles are 256 rows tall where the UB allows it;
  // whatever it picks, every row must carry its bias.
  auto t =
      compiler::ops::plan_matmul_tiling(600, 64, 32, false, false, isa::Dtype::F16, isa::Dtype::F32,
                                        sim().config(), "test", 1, false, false, true);
  INFO(t.str());
  CHECK(t.bias_in_ub);
  CHECK(compiler::ops::matmul_bias_ub_bytes(t.tm, t.tn, 4, 64) <=
        static_cast<int64_t>(
            sim().config().core_kind(isa::CoreKind::AICORE)->capacity(isa::Buf::UB)));
  check_bias_in_ub(600, 32, 64, false, false, true, 51);
}

TEST_CASE("coupled MatMulBiasAdd: a vector launch where the UB cannot take the bias") {
  const ChipConfig& cfg = sim().config();
  const int64_t ub =
      static_cast<int64_t>(cfg.core_kind(isa::CoreKind::AICORE)->capacity(isa::Buf::UB));
  // A bias table (4 bytes per column) larger than the UB: compiled, not run.
  const int64_t n = ub / 4 + 64;
  TensorDesc a{DataType::F32, {16, 32}}, b{DataType::F32, {32, n}}, bias{DataType::F32, {n}};
  auto plain = compiler::compile(make_op("MatMul", {a, b}), cfg);
  auto fused = compiler::compile(make_op("MatMulBiasAdd", {a, b, bias}), cfg);
  CHECK(fused.launches.size() == plain.launches.size() + 1);
  CHECK(has_bias_launch(fused));
  // allow_mix_precision rounds C to f16 before the bias (then widens it): the bias keeps its
  // launch after the widening, as the unfused graph computes it.
  TensorDesc a2{DataType::F32, {16, 32}}, b2{DataType::F32, {32, 64}}, bias2{DataType::F32, {64}};
  auto mix = compiler::compile(make_op("MatMulBiasAdd", {a2, b2, bias2}), cfg,
                               compiler::PrecisionMode::kAllowMixPrecision);
  CHECK(has_bias_launch(mix));
}
