// The compiler on a coupled chip (310P-like: 8 AI cores, each with cube and vector units, and
// no l0c->gm path, so MatMul results leave through the UB). Same references and tolerances as
// test_compiler_binary.cpp and test_compiler_matmul.cpp; this file elaborates its own chip.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <limits>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/matmul.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("310p"), SimOptions{});
  return s;
}

// f16 MatMul, output f16: |c - ref| <= 2 * ((k + 1) * 2^-24 * S + 2^-11 |ref|), see
// test_compiler_matmul.cpp for the derivation.
void check_matmul_f16(int64_t m, int64_t k, int64_t n, bool tb, uint32_t seed) {
  INFO("m=" << m << " k=" << k << " n=" << n << " tb=" << tb);
  HostTensor a = random_tensor(DataType::F16, {m, k}, -2, 2, seed);
  HostTensor b = random_tensor(DataType::F16, tb ? std::vector<int64_t>{n, k}
                                                 : std::vector<int64_t>{k, n},
                               -2, 2, seed + 1);
  auto ck = compiler::compile(make_op("MatMul", {a.desc, b.desc}, {{"transpose_b", tb}}),
                              sim().config());
  for (const compiler::Launch& l : ck.launches) INFO(l.summary);
  RunResult r = run_compiled(sim(), ck, {a, b});
  int bad = 0;
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0, s_abs = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        double p = a.values[static_cast<size_t>(i * k + kk)] *
                   b.values[static_cast<size_t>(tb ? j * k + kk : kk * n + j)];
        sum += p;
        s_abs += std::fabs(p);
      }
      double tol = 2 * ((k + 1) * std::ldexp(1.0, -24) * s_abs +
                        std::ldexp(1.0, -11) * std::fabs(sum));
      double got = r.outputs[0].values[static_cast<size_t>(i * n + j)];
      if (!(std::fabs(got - sum) <= tol) && bad++ < 5)
        UNSCOPED_INFO("C[" << i << "][" << j << "] = " << got << ", want " << sum);
    }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("coupled chip: MatMul through the UB, rows aligned and padded") {
  auto t = compiler::ops::plan_matmul_tiling(40, 40, 40, false, false, isa::Dtype::F16,
                                             isa::Dtype::F16, sim().config(), "test");
  CHECK(t.via_ub);
  CHECK(t.c_pitch == 48);  // 40 f16 = 80 bytes per row, padded to 96 = 3 blocks
  check_matmul_f16(64, 48, 32, false, 1);  // rows of 64 bytes: straight to the output
  check_matmul_f16(40, 40, 40, false, 2);  // padded rows in the workspace, then copied
  check_matmul_f16(17, 100, 5, true, 3);
  auto k = compiler::compile(
      make_op("MatMul", {{DataType::F16, {40, 40}}, {DataType::F16, {40, 40}}}), sim().config());
  CHECK(k.launches.size() == 2);
  CHECK(k.workspace_bytes > 0);
}

TEST_CASE("coupled chip: fp32 MatMul needs a cast (no fp32 cube), vector ops run on aicore") {
  const ChipConfig& cfg = sim().config();
  compiler::TensorDesc a{DataType::F32, {8, 8}};
  CHECK_THROWS_WITH(
      compiler::compile(make_op("MatMul", {a, a}, {{"transpose_b", true}}), cfg,
                        compiler::PrecisionMode::kKeepFp32),
      Catch::Contains("has no fp32"));
  HostTensor x = random_tensor(DataType::F32, {300, 7}, -3, 3, 5);
  HostTensor y = random_tensor(DataType::F32, {7}, -3, 3, 6);
  auto k = compiler::compile(make_op("Mul", {x.desc, y.desc}), cfg);
  CHECK(k.launches[0].kernel.program.sections[0].kind == isa::CoreKind::AICORE);
  RunResult r = run_compiled(sim(), k, {x, y});
  std::vector<double> want(x.values.size());
  for (size_t i = 0; i < want.size(); ++i)
    want[i] = static_cast<float>(x.values[i] * y.values[i % 7]);
  check_close(r.outputs[0].values, want, 0, 0, "Mul");
}

TEST_CASE("coupled chip: MatMulBiasAdd adds the bias and ReLU in the UB (no bias table)") {
  const ChipConfig& cfg = sim().config();
  REQUIRE(!cfg.has_path(isa::Buf::L1, isa::Buf::BT));
  HostTensor a = random_tensor(DataType::F32, {24, 40}, -2, 2, 7);
  HostTensor b = random_tensor(DataType::F32, {40, 20}, -2, 2, 8);
  HostTensor bias = random_tensor(DataType::F32, {20}, -3, 3, 9);
  auto plain = compiler::compile(make_op("MatMul", {a.desc, b.desc}), cfg);
  auto k = compiler::compile(
      make_op("MatMulBiasAdd", {a.desc, b.desc, bias.desc}, {{"relu", true}}), cfg);
  CHECK(k.launches.size() == plain.launches.size());  // on the tiles in the UB: no launch
  RunResult r = run_compiled(sim(), k, {a, b, bias});
  int bad = 0;
  for (int64_t i = 0; i < 24; ++i)
    for (int64_t j = 0; j < 20; ++j) {
      // fp16 operands (allow_fp32_to_fp16): each product off by at most 2^-10 relative.
      double sum = bias.values[static_cast<size_t>(j)], s_abs = std::fabs(sum);
      for (int64_t kk = 0; kk < 40; ++kk) {
        const double p = a.values[static_cast<size_t>(i * 40 + kk)] *
                         b.values[static_cast<size_t>(kk * 20 + j)];
        sum += p;
        s_abs += std::fabs(p);
      }
      const double tol = 2 * (42 * std::ldexp(1.0, -24) + std::ldexp(1.0, -10)) * s_abs;
      const double got = r.outputs[0].values[static_cast<size_t>(i * 20 + j)];
      if (!(std::fabs(got - std::max(sum, 0.0)) <= tol) && bad++ < 5)
        UNSCOPED_INFO("C[" << i << "][" << j << "] = " << got << ", want " << std::max(sum, 0.0));
    }
  CHECK(bad == 0);
}

TEST_CASE("coupled chip: AllFinite's bool in a second launch (no cross-core flags)") {
  const ChipConfig& cfg = sim().config();
  REQUIRE_FALSE(cfg.split);
  std::vector<HostTensor> xs = {random_tensor(DataType::F32, {37, 5}, -9, 9, 21),
                                random_tensor(DataType::F32, {3}, -9, 9, 22),
                                random_tensor(DataType::F32, {4000}, -9, 9, 23)};
  std::vector<compiler::TensorDesc> descs;
  for (const HostTensor& x : xs) descs.push_back(x.desc);
  auto k = compiler::compile(
      make_op("AllFinite", descs, {{"T", std::string("f32")}, {"N", int64_t{3}}}), cfg);
  CHECK(k.launches.size() == 2);
  CHECK(run_compiled(sim(), k, xs).outputs[0].values[0] == 1);
  xs[2].values[3999] = std::numeric_limits<double>::quiet_NaN();
  CHECK(run_compiled(sim(), k, xs).outputs[0].values[0] == 0);
  xs[2].values[3999] = 1;
  xs[0].values[0] = -std::numeric_limits<double>::infinity();
  CHECK(run_compiled(sim(), k, xs).outputs[0].values[0] == 0);
}
