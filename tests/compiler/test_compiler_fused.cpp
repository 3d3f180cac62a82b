// The inference fusions of adapter/compiler/ops/fused.cpp (BatchNormInference, AddRelu)
// compiled for the test chip and run on the chip model, against plain reference loops here.
//
// Tolerances, BatchNormInference (e = 2^-24, all f32; reference in double from the exact
// inputs): a = rsqrt(v + eps) * scale has relative error ea = 3e (the sum's rounding e/2 halved
// by the square root, vrsqrt within an ulp, the product's rounding; as test_compiler_batchnorm);
// shift = offset - mean * a (or offset + (bias - mean) * a) is off by
//   dshift = |m'| |a| (ea + e) + e |shift| + e |bias - mean| |a|   (m' = mean or bias - mean);
// y = x * a + shift by dy = |x| |a| (ea + e) + dshift + e |y|; relu adds no error. Bounds are
// doubled for slack.
// AddRelu: one vadd rounded to T, then vrelu: equal to round_T(x + y) clamped at 0, exactly.
#include <catch2/catch.hpp>

#include <cmath>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

constexpr double kE = 1.0 / (1 << 24);

struct BnCase {
  std::vector<int64_t> shape;  // channels last
  bool bias;
  bool relu;
  double eps = 0.001;
};

void check_batch_norm_inference(const BnCase& bc, uint32_t seed) {
  const int64_t c = bc.shape.back();
  int64_t n = 1;
  for (int64_t d : bc.shape) n *= d;
  INFO("BatchNormInference " << compiler::shape_str(bc.shape) << (bc.bias ? " bias" : "")
                             << (bc.relu ? " relu" : ""));
  HostTensor x = random_tensor(DataType::F32, bc.shape, -3, 3, seed);
  HostTensor scale = random_tensor(DataType::F32, {c}, 0.5, 2, seed + 1);
  HostTensor offset = random_tensor(DataType::F32, {c}, -1, 1, seed + 2);
  HostTensor mean = random_tensor(DataType::F32, {c}, -0.5, 0.5, seed + 3);
  HostTensor var = random_tensor(DataType::F32, {c}, 0.1, 2, seed + 4);
  HostTensor bias = random_tensor(DataType::F32, {c}, -1, 1, seed + 5);
  std::vector<HostTensor> inputs = {x, scale, offset, mean, var};
  if (bc.bias) inputs.push_back(bias);
  std::vector<TensorDesc> descs;
  for (const HostTensor& t : inputs) descs.push_back(t.desc);
  auto op = make_op("BatchNormInference", descs,
                    {{"epsilon", bc.eps}, {"relu", bc.relu}, {"T", std::string("f32")}});
  auto k = compiler::compile(op, test_sim().config());
  for (const auto& l : k.launches) UNSCOPED_INFO(l.summary);
  REQUIRE(k.outputs.size() == 1);
  CHECK(k.outputs[0] == x.desc);
  if (n == 0) {
    CHECK(k.launches.empty());
    return;
  }
  CHECK(k.launches.size() == 2);  // the per-channel fold, then the element-wise pass
  RunResult res = run_compiled(test_sim(), k, inputs);
  const double ea = 3 * kE;
  std::vector<double> want(static_cast<size_t>(n)), tol(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const size_t ch = static_cast<size_t>(i % c);
    const double a = scale.values[ch] / std::sqrt(var.values[ch] + bc.eps);
    const double m = bc.bias ? bias.values[ch] - mean.values[ch] : -mean.values[ch];
    const double shift = offset.values[ch] + m * a;
    const double dshift = std::fabs(m) * std::fabs(a) * (ea + kE) + kE * std::fabs(shift) +
                          (bc.bias ? kE * std::fabs(m * a) : 0);
    const double xv = x.values[static_cast<size_t>(i)];
    double y = xv * a + shift;
    const double dy = std::fabs(xv) * std::fabs(a) * (ea + kE) + dshift + kE * std::fabs(y);
    if (bc.relu) y = std::max(y, 0.0);
    want[static_cast<size_t>(i)] = y;
    tol[static_cast<size_t>(i)] = 2 * dy;
  }
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double got = res.outputs[0].values[i];
    if (!(std::fabs(got - want[i]) <= tol[i]) && bad++ < 5)
      UNSCOPED_INFO("y[" << i << "] = " << got << ", want " << want[i] << " +- " << tol[i]);
    if (bc.relu && got < 0 && bad++ < 5) UNSCOPED_INFO("y[" << i << "] < 0 after relu");
  }
  CHECK(bad == 0);
}

void check_add_relu(DataType dt, const std::vector<int64_t>& xs, const std::vector<int64_t>& ys,
                    uint32_t seed) {
  INFO("AddRelu " << compiler::data_type_name(dt) << " " << compiler::shape_str(xs) << " + "
                  << compiler::shape_str(ys));
  HostTensor x = random_tensor(dt, xs, -4, 4, seed);
  HostTensor y = random_tensor(dt, ys, -4, 4, seed + 1);
  auto out_shape = compiler::broadcast_shapes(xs, ys);
  REQUIRE(out_shape);
  auto k = compiler::compile(make_op("AddRelu", {x.desc, y.desc}), test_sim().config());
  REQUIRE(k.outputs.size() == 1);
  CHECK(k.outputs[0] == (TensorDesc{dt, *out_shape}));
  int64_t n = 1;
  for (int64_t d : *out_shape) n *= d;
  if (n == 0) {
    CHECK(k.launches.empty());
    return;
  }
  CHECK(k.launches.size() == 1);
  RunResult res = run_compiled(test_sim(), k, {x, y});
  const auto xi = broadcast_index(xs, *out_shape), yi = broadcast_index(ys, *out_shape);
  std::vector<double> want(static_cast<size_t>(n));
  for (size_t i = 0; i < want.size(); ++i)
    want[i] = std::max(round_to(dt, x.values[xi[i]] + y.values[yi[i]]), 0.0);
  check_close(res.outputs[0].values, want, 0, 0, "AddRelu");
}

}  // namespace

TEST_CASE("BatchNormInference: fold then x * a + shift, NHWC and Dense shapes") {
  uint32_t seed = 100;
  for (const BnCase& bc : {BnCase{{2, 3, 5, 24}, false, false},
                           BnCase{{2, 3, 5, 24}, false, true},
                           BnCase{{1, 7, 7, 64}, true, true},
                           BnCase{{3, 2, 2, 5}, true, false, 1e-5},   // C not whole blocks
                           BnCase{{5, 100}, true, true},              // a Dense output
                           BnCase{{1, 1, 1, 1}, false, true},
                           BnCase{{0, 4, 4, 8}, true, true}})         // nothing to compute
    check_batch_norm_inference(bc, seed += 10);
}

TEST_CASE("BatchNormInference rejects per-channel inputs that are not [C]") {
  const TensorDesc x{DataType::F32, {1, 4, 4, 8}}, v{DataType::F32, {8}},
      nchw{DataType::F32, {1, 8, 1, 1}}, f16{DataType::F16, {1, 4, 4, 8}};
  CHECK_THROWS_WITH(compiler::compile(make_op("BatchNormInference", {x, v, v, nchw, v}),
                                      test_sim().config()),
                    Catch::Contains("mean (input 3) must be f32[8]"));
  const TensorDesc ones_c{DataType::F32, {1, 1, 1, 8}}, too_deep{DataType::F32, {1, 1, 1, 1, 8}};
  CHECK_NOTHROW(compiler::compile(make_op("BatchNormInference", {x, ones_c, v, ones_c, v}),
                                  test_sim().config()));
  CHECK_THROWS_WITH(compiler::compile(make_op("BatchNormInference", {x, v, too_deep, v, v}),
                                      test_sim().config()),
                    Catch::Contains("offset (input 2) must be f32[8]"));
  CHECK_THROWS_WITH(compiler::compile(make_op("BatchNormInference", {x, v, v, v}),
                                      test_sim().config()),
                    Catch::Contains("takes 5 inputs"));
  CHECK_THROWS_WITH(compiler::compile(make_op("BatchNormInference", {f16, v, v, v, v}),
                                      test_sim().config()),
                    Catch::Contains("only f32"));
}

TEST_CASE("AddRelu: max(x + y, 0) rounded as AddV2 then Relu") {
  uint32_t seed = 300;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16}) {
    check_add_relu(dt, {2, 5, 5, 24}, {2, 5, 5, 24}, seed += 10);  // the residual add
    check_add_relu(dt, {3, 77}, {77}, seed += 10);                  // broadcast row
    check_add_relu(dt, {1001}, {1001}, seed += 10);
    check_add_relu(dt, {0, 3}, {3}, seed += 10);
  }
  CHECK_THROWS_WITH(compiler::compile(make_op("AddRelu", {TensorDesc{DataType::S32, {4}},
                                                          TensorDesc{DataType::S32, {4}}}),
                                      test_sim().config()),
                    Catch::Contains("not supported"));
}
