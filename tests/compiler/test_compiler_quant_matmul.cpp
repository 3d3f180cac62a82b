// WeightQuantBatchMatmulV2 (ops/quant_matmul.cpp): y = x @ (w_int8 * scale) against the same
// product computed here in double, on the test chip.
//
// Error bound per output element (derived from the kernel's numerics, ops/quant_matmul.cpp): the
// dequantised weight is round_T(w * s), computed here exactly the same way (the product of an
// int8 and a T value is exact in double and rounded once to T); the kernel accumulates in f32
// (at most K * 2^-24 * sum_k |x_k w'_k|) and rounds y once to T (u * |y|, u = 2^-11 for f16,
// 2^-8 for bf16). check_within_bounds allows twice the bound.
#include <cmath>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "adapter/compiler/compiler.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;

namespace {

struct Case {
  DataType dt = DataType::F16;
  std::vector<int64_t> x_shape;  // [..., K]
  int64_t n = 0;
};

OpDesc quant_op(const Case& c) {
  const int64_t k = c.x_shape.back();
  return make_op("WeightQuantBatchMatmulV2",
                 {{c.dt, c.x_shape}, {DataType::S8, {k, c.n}}, {c.dt, {c.n}}}, {});
}

struct Inputs {
  HostTensor x, w, s;
};

Inputs make_inputs(const Case& c, uint32_t seed) {
  const int64_t k = c.x_shape.back();
  // Scales as AbsMax quantisation gives them: absmax / 127 of a column of weights ~ 0.02.
  return {random_tensor(c.dt, c.x_shape, -2, 2, seed),
          random_tensor(DataType::S8, {k, c.n}, -127, 127, seed + 1),
          random_tensor(c.dt, {c.n}, 1e-4, 4e-4, seed + 2)};
}

// y = x @ round_T(w * s) in double; bound as derived at the top of the file.
void reference(const Case& c, const Inputs& in, std::vector<double>& y,
               std::vector<double>& bound) {
  const int64_t k = c.x_shape.back(), n = c.n;
  const int64_t m = static_cast<int64_t>(in.x.values.size()) / k;
  const double u = c.dt == DataType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  std::vector<double> wq(in.w.values.size());
  for (int64_t kk = 0; kk < k; ++kk)
    for (int64_t j = 0; j < n; ++j)
      wq[kk * n + j] = round_to(c.dt, in.w.values[kk * n + j] * in.s.values[j]);
  y.assign(static_cast<size_t>(m * n), 0);
  bound.assign(y.size(), 0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0, mag = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double p = in.x.values[i * k + kk] * wq[kk * n + j];
        acc += p;
        mag += std::fabs(p);
      }
      y[i * n + j] = acc;
      bound[i * n + j] = u * std::fabs(acc) + static_cast<double>(k) * std::ldexp(mag, -24);
    }
}

// Compiles and runs c; checks y against the reference. A coupled chip: the refusal, and no
// launches.
compiler::CompiledKernel check_case(const Case& c, uint32_t seed) {
  const OpDesc op = quant_op(c);
  INFO(op.str());
  if (!runs_mix_kernel(op)) return {};
  compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
  REQUIRE(k.launches.size() == 1);
  INFO(k.launches[0].summary);
  std::vector<int64_t> y_shape = c.x_shape;
  y_shape.back() = c.n;
  CHECK(k.outputs[0].shape == y_shape);
  const Inputs in = make_inputs(c, seed);
  RunResult r = run_compiled(test_sim(), k, {in.x, in.w, in.s});
  std::vector<double> want, bound;
  reference(c, in, want, bound);
  check_within_bounds(r.outputs[0].values, want, bound, "y");
  return k;
}

uint64_t counter(const nlohmann::json& tree, const std::string& path) {
  const nlohmann::json* n = &tree;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t dot = path.find('.', pos);
    if (dot == std::string::npos) dot = path.size();
    n = &n->at(path.substr(pos, dot - pos));
    pos = dot + 1;
  }
  return n->is_object() ? n->at("value").get<uint64_t>() : n->get<uint64_t>();
}

}  // namespace

TEST_CASE("weight-only int8 MatMul, one decode row, several column tiles and K chunks") {
  // N 384: three 128-column tiles; K 768: several chunks.
  check_case({DataType::F16, {1, 768}, 384}, 1);
}

TEST_CASE("weight-only int8 MatMul, rows not a multiple of 16, narrow columns") {
  // 20 rows (one row block, 12 padding rows), N 64 and 96 (64- and 32-column tiles), K 96.
  check_case({DataType::F16, {2, 10, 96}, 64}, 11);
  check_case({DataType::F16, {20, 96}, 96}, 13);
}

TEST_CASE("weight-only int8 MatMul, a prefill: several row blocks") {
  check_case({DataType::F16, {1, 150, 128}, 128}, 21);
}

TEST_CASE("weight-only int8 MatMul, bf16") { check_case({DataType::BF16, {3, 256}, 160}, 31); }

TEST_CASE("weight-only int8 MatMul reads the weights from HBM as int8") {
  // A decode-shaped product: the weight (K x N) dominates the traffic. HBM (L2 misses; the L2
  // starts cold, a write to a missing line goes to HBM) sees x, the int8 weight, the scales and
  // y once, and the workspace (two slots per mix group, written and re-read in L2) once: below
  // what the weight alone would take in f16.
  const Case c{DataType::F16, {1, 1024}, 1024};
  const OpDesc op = quant_op(c);
  if (!runs_mix_kernel(op)) return;
  compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
  const Inputs in = make_inputs(c, 41);
  const nlohmann::json before = test_sim().counters();
  run_compiled(test_sim(), k, {in.x, in.w, in.s});
  const nlohmann::json after = test_sim().counters();
  auto delta = [&](const char* path) { return counter(after, path) - counter(before, path); };
  const uint64_t hbm = delta("chip.hbm.read_bytes") + delta("chip.hbm.write_bytes");
  const uint64_t gm_read = delta("chip.hbm.read_bytes") + delta("chip.l2.read_bytes");
  const uint64_t w8 = in.w.desc.bytes();
  const uint64_t rest = in.x.desc.bytes() + in.s.desc.bytes() + 2 * c.n;  // x, scales, y
  INFO("HBM bytes " << hbm << ", GM bytes read " << gm_read << ", int8 weight " << w8
                    << ", workspace " << k.workspace_bytes);
  CHECK(gm_read >= w8);  // every weight byte was read (from HBM or, within a line, from L2)
  // Slack: L2 lines (512 bytes) at the tensors' edges may be touched twice.
  CHECK(hbm <= w8 + rest + k.workspace_bytes + 64 * 1024);
  CHECK(hbm < 2 * w8);  // the weight never crossed HBM in f16
}

TEST_CASE("weight-only int8 MatMul refuses what it does not support") {
  Case c{DataType::F16, {4, 64}, 48};  // N not a multiple of 32
  CHECK(compile_refusal(quant_op(c)).message.find("multiples of 32") != std::string::npos);
  OpDesc bad =
      make_op("WeightQuantBatchMatmulV2",
              {{DataType::F16, {4, 64}}, {DataType::S8, {64, 64}}, {DataType::F16, {32}}}, {});
  CHECK(compile_refusal(bad).invalid);  // one scale per column
  bad = make_op("WeightQuantBatchMatmulV2",
                {{DataType::F16, {4, 64}}, {DataType::F16, {64, 64}}, {DataType::F16, {64}}}, {});
  CHECK(compile_refusal(bad).invalid);  // the weight must be int8
}
