// Activations and their gradients, L2Loss, BiasAdd and BiasAddGrad compiled for the tiny chip
// and run on the chip model, against references computed here in double precision from the
// (exactly representable) inputs.
//
// Tolerances: u = 2^-24; every op is evaluated in f32 and rounded once to the output type
// (u_t = 2^-24 f32, 2^-11 f16, 2^-8 bf16; s = half the f16 subnormal spacing, 2^-25, for f16
// results below 2^-14, 0 otherwise). Each f32 rounding (+, *, /, vexp, vln, vrec: correctly
// rounded or within an ulp) contributes u relative to the value it produces, so:
//   Relu6, ReluGrad, Relu6Grad, BiasAdd: exact (one comparison / one rounded add).
//   Elu x < 0: exp(x) <= 1 is within u, minus 1 adds u |y|: absolute 2u + u |y|. Selu: times
//     scale_alpha < 1.76: 4u + 2u |y|.
//   Sigmoid 1 / (1 + exp(-x)): three roundings, 4u relative.
//   Tanh: expm1 by Kahan's formula is within a few ulp (Goldberg, "What every computer scientist
//     should know about floating-point arithmetic", thm. 4's relative), then +, /, and a sign:
//     16u relative.
//   Softplus: log1p by Kahan's formula (same argument), exp, a product and a quotient: 16u
//     relative; the reference applies TF's thresholds, computed here in the type (_Float16 for
//     f16, bf16 rounded by hand).
//   Gelu exact: the erfcc approximation is within 1.2e-7 relative (Numerical Recipes 6.2); its
//     exp argument -z^2 + P(t) carries absolute error ~ (z^2 + 2) 4u, which exp turns into
//     relative error: 1.2e-7 + (x^2 / 2 + 3) 8u relative, plus u for 0.5 x *.
//   Gelu approximate x / (1 + exp(-2y)): y has 4 roundings (relative 4u), exp turns its absolute
//     error |2y| 4u into relative error; then +, /: (|2y| + 1) 4u + 3u relative.
//   Erfc: erfc(|x|) by erfcc as Gelu's, within 1.2e-7 + (x^2 + 3) 8u relative; for x < 0,
//     2 - that: the same absolute error, plus 2u |ref| for the subtraction's rounding.
//   Erf: |x| >= 1/2, 1 - erfc(|x|): erfc's absolute error, plus 2u |ref|; |x| < 1/2, the
//     Maclaurin series to x^13 (truncation below 1e-9 relative; 15 roundings on terms of
//     decreasing size, within 16u relative).
//   EluGrad, SeluGrad, SoftplusGrad: 2 to 4 roundings: 4u relative (SoftplusGrad 5u).
//   SigmoidGrad dy * y * (1 - y): 3 roundings, 3u relative.
//   TanhGrad dy * (1 - y * y): y * y is within u, so 1 - y * y within u absolute (it cancels as
//     y -> 1, as TF's does): |dy| 2u + 2u |ref|.
//   L2Loss sum(x * x) / 2: n squares and n - 1 additions: (n + 1) u sum(x * x) / 2.
//   BiasAddGrad: a Sum (see test_compiler_reduce.cpp): n u S, then the output rounding.
// f16/bf16 add u_t |ref| + s for the final rounding.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/channel.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;

namespace {

constexpr double kU = 5.9604644775390625e-08;  // 2^-24
constexpr double kSeluScale = 1.0507009873554804934193349852946;
constexpr double kSeluAlpha = 1.6732632423543772848170429916717;

double unit(DataType t) {
  switch (t) {
    case DataType::F16: return std::ldexp(1.0, -11);
    case DataType::BF16: return std::ldexp(1.0, -8);
    case DataType::S32: return 0;
    default: return kU;
  }
}
double sub_half(DataType t) { return t == DataType::F16 ? std::ldexp(1.0, -25) : 0; }

// TF's Softplus threshold ln(eps) + 2, each step in the type.
double softplus_threshold(DataType t) {
  if (t == DataType::F16) {
    _Float16 l = static_cast<_Float16>(std::log(std::ldexp(1.0, -10)));
    return static_cast<double>(static_cast<_Float16>(l + static_cast<_Float16>(2)));
  }
  if (t == DataType::BF16) {
    double l = round_to(DataType::BF16, std::log(std::ldexp(1.0, -7)));
    return round_to(DataType::BF16, l + 2);
  }
  return static_cast<float>(static_cast<float>(std::log(std::ldexp(1.0, -23))) + 2.0f);
}

struct Ref {
  double value, tol;  // tol: the f32 evaluation's error bound (before the output rounding)
};
using RefFn = std::function<Ref(const std::vector<double>& in, DataType t)>;

struct ActCase {
  const char* op;
  int inputs;
  double lo, hi;  // input range (all inputs)
  bool ints;
  RefFn ref;
};

Ref exact(double v) { return {v, 0}; }

const ActCase kCases[] = {
    {"Relu6", 1, -3, 9, true, [](auto& x, DataType) { return exact(std::min(std::max(x[0], 0.0), 6.0)); }},
    {"Elu", 1, -5, 3, false,
     [](auto& x, DataType) {
       double y = x[0] < 0 ? std::exp(x[0]) - 1 : x[0];
       return Ref{y, 2 * kU + kU * std::fabs(y)};
     }},
    {"Selu", 1, -5, 3, false,
     [](auto& x, DataType) {
       double y = x[0] < 0 ? kSeluScale * kSeluAlpha * (std::exp(x[0]) - 1) : kSeluScale * x[0];
       return Ref{y, 4 * kU + 2 * kU * std::fabs(y)};
     }},
    {"Sigmoid", 1, -12, 12, false,
     [](auto& x, DataType) {
       double y = 1 / (1 + std::exp(-x[0]));
       return Ref{y, 4 * kU * y};
     }},
    {"Tanh", 1, -6, 6, false,
     [](auto& x, DataType) {
       double y = std::tanh(x[0]);
       return Ref{y, 16 * kU * std::fabs(y)};
     }},
    {"Softplus", 1, -20, 20, false,
     [](auto& x, DataType t) {
       const double th = softplus_threshold(t), v = x[0];
       double y = v > -th ? v : v < th ? std::exp(v) : std::log1p(std::exp(v));
       return Ref{y, 16 * kU * std::fabs(y)};
     }},
    {"ReluGrad", 2, -3, 3, true, [](auto& x, DataType) { return exact(x[1] > 0 ? x[0] : 0); }},
    {"Relu6Grad", 2, -2, 8, true,
     [](auto& x, DataType) { return exact(x[1] > 0 && x[1] < 6 ? x[0] : 0); }},
    {"EluGrad", 2, -1, 3, false,
     [](auto& x, DataType) {
       double y = x[1] < 0 ? (x[1] + 1) * x[0] : x[0];
       return Ref{y, 4 * kU * std::fabs(y)};
     }},
    {"SeluGrad", 2, -1.7, 3, false,
     [](auto& x, DataType) {
       double y = x[1] < 0 ? x[0] * (x[1] + kSeluScale * kSeluAlpha) : x[0] * kSeluScale;
       return Ref{y, 4 * kU * std::fabs(y)};
     }},
    {"SigmoidGrad", 2, 0, 1, false,
     [](auto& x, DataType) {
       double y = x[1] * x[0] * (1 - x[0]);
       return Ref{y, 3 * kU * std::fabs(y)};
     }},
    {"TanhGrad", 2, -1, 1, false,
     [](auto& x, DataType) {
       double y = x[1] * (1 - x[0] * x[0]);
       return Ref{y, 2 * kU * std::fabs(x[1]) + 2 * kU * std::fabs(y)};
     }},
    {"SoftplusGrad", 2, -8, 8, false,
     [](auto& x, DataType) {
       double y = x[0] / (std::exp(-x[1]) + 1);
       return Ref{y, 5 * kU * std::fabs(y)};
     }},    {"Erfc", 1, -4, 4, false,
     [](auto& x, DataType) {
       const double v = x[0], y = std::erfc(v), e = std::erfc(std::fabs(v));
       return Ref{y, (1.2e-7 + (v * v + 3) * 8 * kU) * e + 2 * kU * std::fabs(y)};
     }},
    {"Erf", 1, -3, 3, false,
     [](auto& x, DataType) {
       const double v = x[0], y = std::erf(v);
       if (std::fabs(v) < 0.5) return Ref{y, (1e-9 + 16 * kU) * std::fabs(y)};
       return Ref{y, (1.2e-7 + (v * v + 3) * 8 * kU) * std::erfc(std::fabs(v)) +
                         2 * kU * std::fabs(y)};
     }},
};

const ActCase gelu_exact{"Gelu", 1, -8, 5, false, [](auto& x, DataType) {
                           double v = x[0], y = 0.5 * v * std::erfc(-v / std::sqrt(2.0));
                           return Ref{y, (1.2e-7 + (v * v / 2 + 3) * 8 * kU + kU) * std::fabs(y)};
                         }};
const ActCase gelu_tanh{"Gelu", 1, -8, 5, false, [](auto& x, DataType) {
                          double v = x[0];
                          double yy = std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v);
                          double y = v / (1 + std::exp(-2 * yy));  // = 0.5 v (1 + tanh yy)
                          return Ref{y, ((2 * std::fabs(yy) + 1) * 4 * kU + 3 * kU) * std::fabs(y)};
                        }};

// GeGlu(gate, up) = gelu(gate) * up (CANN's, Gemma's feed-forward): Gelu's bound on the gelu,
// times |up|, plus the product's rounding.
ActCase geglu_case(const ActCase& gelu) {
  return ActCase{"GeGlu", 2, -8, 5, false, [gelu](auto& x, DataType t) {
                   const Ref g = gelu.ref(x, t);
                   const double y = g.value * x[1];
                   return Ref{y, g.tol * std::fabs(x[1]) + kU * std::fabs(y)};
                 }};
}

// GeluGrad(g, x) = g * d, d = gelu'(x), from the terms of d in double:
//   exact: d = Phi(x) + x phi(x). Phi as Gelu exact: (1.2e-7 + (x^2/2 + 3) 8u + 2u) relative;
//     x phi(x): exp of -x^2/2 (argument within x^2/2 u absolute) and four roundings:
//     (x^2/2 + 5) u relative; the sum and the product with g: 2u |g d|. Tolerances are on the
//     terms' magnitudes: the terms cancel near x = -0.75.
//   approximate: d = s + 2 x y' q, s = 1 / (1 + e), q = e / (1 + e)^2, e = exp(-2y): -2y has
//     4 roundings (|2y| 4u absolute), so s is within (|2y| 4u + 3u), q within 2 (|2y| 4u + 2u)
//     + 3u, and the second term (3 more roundings for y', then x, 2) within (|2y| 8u + 12u)
//     relative. Where (1 + e)^2 overflows f32 (e > 1.8e19) the kernel's q is 0 and the term
//     (< 2 |x| y' / e) is allowed absolutely.
const ActCase gelu_grad_exact{"GeluGrad", 2, -8, 5, false, [](auto& in, DataType) {
  const double g = in[0], x = in[1];
  const double phi_big = 0.5 * std::erfc(-x / std::sqrt(2.0));
  const double xphi = x * std::exp(-x * x / 2) / std::sqrt(2 * M_PI);
  const double d = phi_big + xphi;
  const double tol = (1.2e-7 + (x * x / 2 + 3) * 8 * kU + 2 * kU) * phi_big +
                     (x * x / 2 + 5) * kU * std::fabs(xphi);
  return Ref{g * d, std::fabs(g) * tol + 2 * kU * std::fabs(g * d)};
}};
const ActCase gelu_grad_tanh{"GeluGrad", 2, -8, 5, false, [](auto& in, DataType) {
  const double g = in[0], x = in[1], c = std::sqrt(2 / M_PI);
  const double y = c * (x + 0.044715 * x * x * x), yd = c * (1 + 3 * 0.044715 * x * x);
  const double e = std::exp(-2 * y), s = 1 / (1 + e), q = e / ((1 + e) * (1 + e));
  const double t2 = 2 * x * yd * q, d = s + t2;
  double tol = s * (std::fabs(2 * y) * 4 * kU + 3 * kU) +
               std::fabs(t2) * (std::fabs(2 * y) * 8 * kU + 12 * kU);
  if (e > 1.8e19) tol += std::fabs(t2);
  return Ref{g * d, std::fabs(g) * tol + 2 * kU * std::fabs(g * d)};
}};

void check_act(const ActCase& c, DataType dt, const std::vector<int64_t>& shape, uint32_t seed,
               compiler::OpDesc* custom = nullptr) {
  INFO(c.op << " " << compiler::data_type_name(dt) << compiler::shape_str(shape));
  std::vector<HostTensor> in;
  std::vector<compiler::TensorDesc> descs;
  for (int i = 0; i < c.inputs; ++i) {
    in.push_back(random_tensor(dt, shape, c.lo, c.hi, seed + static_cast<uint32_t>(i)));
    descs.push_back(in.back().desc);
  }
  compiler::OpDesc op = custom ? *custom : make_op(c.op, descs);
  op.inputs = descs;
  auto k = compiler::compile(op, test_sim().config());
  RunResult r = run_compiled(test_sim(), k, in);
  REQUIRE(r.outputs[0].desc == in[0].desc);
  const double ut = unit(dt);
  std::vector<double> want(in[0].values.size()), tol(want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    std::vector<double> x;
    for (const HostTensor& t : in) x.push_back(t.values[i]);
    Ref ref = c.ref(x, dt);
    want[i] = ref.value;
    tol[i] = ref.tol + ut * std::fabs(ref.value) + sub_half(dt);
    if (dt == DataType::S32) tol[i] = 0;
  }
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    double got = r.outputs[0].values[i];
    bool ok = std::fabs(got - want[i]) <= tol[i] || (std::isnan(got) && std::isnan(want[i]));
    if (!ok && bad++ < 5) {
      std::string ins;
      for (const HostTensor& t : in) ins += " " + std::to_string(t.values[i]);
      UNSCOPED_INFO("element " << i << " in" << ins << " got " << got << " want " << want[i]
                               << " tol " << tol[i]);
    }
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("activations and gradients: f32 / f16 / bf16 / s32, odd and size-1 shapes") {
  uint32_t seed = 1;
  for (const ActCase& c : kCases) {
    check_act(c, DataType::F32, {3, 41}, seed += 2);
    check_act(c, DataType::F16, {7, 1, 19}, seed += 2);
    check_act(c, DataType::BF16, {130}, seed += 2);
    if (c.ints) check_act(c, DataType::S32, {2, 77}, seed += 2);
  }
  check_act(kCases[3], DataType::F32, {}, seed += 2);   // a scalar
  check_act(kCases[4], DataType::F32, {70000}, seed += 2);  // many tiles, all cores
}

TEST_CASE("Gelu: exact (erf) and approximate (tanh)") {
  uint32_t seed = 50;
  for (bool approx : {false, true}) {
    compiler::OpDesc op = make_op("Gelu", {}, {{"approximate", approx}});
    const ActCase& c = approx ? gelu_tanh : gelu_exact;
    check_act(c, DataType::F32, {5, 200}, seed++, &op);
    check_act(c, DataType::F16, {33}, seed++, &op);
    check_act(c, DataType::BF16, {4, 4}, seed++, &op);
  }
}

TEST_CASE("GeGlu and Gelu with CANN's int attribute approximate (1 tanh, 0 erf)") {
  uint32_t seed = 60;
  for (int64_t approx : {0, 1}) {
    compiler::OpDesc gelu = make_op("Gelu", {}, {{"approximate", approx}});
    const ActCase& c = approx ? gelu_tanh : gelu_exact;
    check_act(c, DataType::F32, {3, 64}, seed++, &gelu);
    compiler::OpDesc geglu = make_op("GeGlu", {}, {{"approximate", approx}});
    for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16})
      check_act(geglu_case(c), dt, {5, 96}, seed++, &geglu);
  }
  // absent: the tanh form (CANN's default)
  check_act(geglu_case(gelu_tanh), DataType::F32, {2, 33}, seed++);
}

TEST_CASE("GeluGrad: exact (erf) and approximate (tanh)") {
  uint32_t seed = 70;
  for (bool approx : {false, true}) {
    compiler::OpDesc op = make_op("GeluGrad", {}, {{"approximate", approx}});
    const ActCase& c = approx ? gelu_grad_tanh : gelu_grad_exact;
    check_act(c, DataType::F32, {5, 200}, seed++, &op);
    check_act(c, DataType::F16, {33}, seed++, &op);
    check_act(c, DataType::BF16, {4, 4}, seed++, &op);
    check_act(c, DataType::F32, {1}, seed++, &op);
    check_act(c, DataType::F32, {0, 7}, seed++, &op);
  }
}

// Sigmoid's two forms (NPUSIM_SIGMOID_ALTERNATE_BUFFERS, on by default): every step writing a
// buffer it does not read, or every step but the first in place. The same instructions on the
// same values: the outputs are the same bits, within the reference's bound (kCases' Sigmoid).
// On a chip with UB banks the alternating form's f32 kernel meets no bank conflict (its tiles
// in bank windows of their own), the in-place form's conflicts are a fifth of its vector
// time at least (two accesses per bank for each of its three in-place steps).
TEST_CASE("Sigmoid: alternating buffers against in place, the same bits") {
  const ActCase& sigmoid = kCases[3];
  REQUIRE(std::string(sigmoid.op) == "Sigmoid");
  const ChipConfig& cfg = test_sim().config();
  uint32_t seed = 90;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16}) {
    const std::vector<int64_t> shape = {48, 2048};
    const HostTensor x = random_tensor(dt, shape, sigmoid.lo, sigmoid.hi, seed++);
    std::vector<double> out[2];
    uint64_t conflicts[2] = {}, busy[2] = {};
    for (int alternate : {0, 1}) {
      INFO(compiler::data_type_name(dt) << " NPUSIM_SIGMOID_ALTERNATE_BUFFERS=" << alternate);
      setenv("NPUSIM_SIGMOID_ALTERNATE_BUFFERS", alternate ? "1" : "0", 1);
      check_act(sigmoid, dt, shape, seed++);
      const auto k = compiler::compile(make_op("Sigmoid", {x.desc}), cfg);
      const RunResult r = run_compiled(test_sim(), k, {x});
      out[alternate] = r.outputs[0].values;
      for (const auto& [name, core] : r.counters.at(0).at("chip").items()) {
        if (!core.contains("v")) continue;
        const nlohmann::json& v = core.at("v");
        busy[alternate] += v.at("busy_cycles").at("value").get<uint64_t>();
        if (v.contains("stall") && v.at("stall").contains("bank_conflict"))
          conflicts[alternate] += v.at("stall").at("bank_conflict").at("value").get<uint64_t>();
      }
    }
    unsetenv("NPUSIM_SIGMOID_ALTERNATE_BUFFERS");
    INFO(compiler::data_type_name(dt) << ": conflict cycles in place " << conflicts[0] << " of "
                                      << busy[0] << ", alternating " << conflicts[1] << " of "
                                      << busy[1]);
    CHECK(out[0] == out[1]);
    if (cfg.ub_banks > 1) {
      CHECK(conflicts[0] * 5 > busy[0]);
      CHECK(conflicts[1] < conflicts[0]);
      if (dt == DataType::F32) CHECK(conflicts[1] == 0);
    }
  }
  setenv("NPUSIM_SIGMOID_ALTERNATE_BUFFERS", "yes", 1);
  CHECK_THROWS_WITH(compiler::compile(make_op("Sigmoid", {{DataType::F32, {4}}}), cfg),
                    Catch::Contains("NPUSIM_SIGMOID_ALTERNATE_BUFFERS='yes'") &&
                        Catch::Contains("Sigmoid"));
  unsetenv("NPUSIM_SIGMOID_ALTERNATE_BUFFERS");
}

TEST_CASE("activations: zero-size, dtype and shape errors") {
  const ChipConfig& cfg = test_sim().config();
  auto k = compiler::compile(make_op("Tanh", {{DataType::F32, {4, 0}}}), cfg);
  CHECK(k.launches.empty());
  CHECK_THROWS_WITH(compiler::compile(make_op("Sigmoid", {{DataType::S32, {4}}}), cfg),
                    Catch::Contains("dtype s32"));
  CHECK_THROWS_WITH(compiler::compile(make_op("ReluGrad", {{DataType::F32, {4}},
                                                           {DataType::F32, {5}}}),
                                      cfg),
                    Catch::Contains("same shape"));
}

namespace {

void check_l2loss(DataType dt, const std::vector<int64_t>& shape, uint32_t seed) {
  INFO("L2Loss " << compiler::data_type_name(dt) << compiler::shape_str(shape));
  HostTensor x = random_tensor(dt, shape, -2, 2, seed);
  auto k = compiler::compile(make_op("L2Loss", {x.desc}), test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {x});
  REQUIRE(r.outputs[0].desc == (compiler::TensorDesc{dt, {}}));
  double sum = 0;
  for (double v : x.values) sum += v * v;
  const double want = sum / 2, n = static_cast<double>(x.values.size());
  const double tol = (n + 1) * kU * want + unit(dt) * want;
  CHECK(std::fabs(r.outputs[0].values[0] - want) <= tol);
}

void check_bias_add(DataType dt, const std::vector<int64_t>& shape, bool nchw, uint32_t seed) {
  INFO("BiasAdd " << compiler::data_type_name(dt) << compiler::shape_str(shape)
                  << (nchw ? " NCHW" : " NHWC"));
  const size_t c = nchw ? 1 : shape.size() - 1;
  HostTensor v = random_tensor(dt, shape, -100, 100, seed);
  HostTensor b = random_tensor(dt, {shape[c]}, -100, 100, seed + 1);
  auto k = compiler::compile(
      make_op("BiasAdd", {v.desc, b.desc}, {{"data_format", std::string(nchw ? "NCHW" : "NHWC")}}),
      test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {v, b});
  REQUIRE(r.outputs[0].desc == v.desc);
  int64_t inner = 1;
  for (size_t d = c + 1; d < shape.size(); ++d) inner *= shape[d];
  std::vector<double> want(v.values.size());
  for (size_t i = 0; i < want.size(); ++i)
    want[i] = round_to(dt, v.values[i] + b.values[(i / static_cast<size_t>(inner)) %
                                                  static_cast<size_t>(shape[c])]);
  check_close(r.outputs[0].values, want, 0, 0, "BiasAdd");
}

void check_bias_grad(DataType dt, const std::vector<int64_t>& shape, bool nchw, uint32_t seed) {
  INFO("BiasAddGrad " << compiler::data_type_name(dt) << compiler::shape_str(shape)
                      << (nchw ? " NCHW" : " NHWC"));
  const size_t c = nchw ? 1 : shape.size() - 1;
  HostTensor g = random_tensor(dt, shape, -4, 4, seed);
  auto k = compiler::compile(
      make_op("BiasAddGrad", {g.desc}, {{"data_format", std::string(nchw ? "NCHW" : "NHWC")}}),
      test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {g});
  REQUIRE(r.outputs[0].desc == (compiler::TensorDesc{dt, {shape[c]}}));
  int64_t inner = 1;
  for (size_t d = c + 1; d < shape.size(); ++d) inner *= shape[d];
  const size_t C = static_cast<size_t>(shape[c]);
  std::vector<double> sum(C, 0), sabs(C, 0), n(C, 0);
  for (size_t i = 0; i < g.values.size(); ++i) {
    size_t ch = (i / static_cast<size_t>(inner)) % C;
    sum[ch] += g.values[i];
    sabs[ch] += std::fabs(g.values[i]);
    n[ch] += 1;
  }
  std::vector<double> tol(C);
  for (size_t i = 0; i < C; ++i) {
    double e = n[i] * kU * sabs[i];
    tol[i] = e + unit(dt) * (std::fabs(sum[i]) + e);
  }
  int bad = 0;
  for (size_t i = 0; i < C; ++i)
    if (!(std::fabs(r.outputs[0].values[i] - sum[i]) <= tol[i]) && bad++ < 5)
      UNSCOPED_INFO("channel " << i << " got " << r.outputs[0].values[i] << " want " << sum[i]);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("L2Loss") {
  check_l2loss(DataType::F32, {3, 41}, 1);
  check_l2loss(DataType::F16, {1000}, 2);
  check_l2loss(DataType::BF16, {2, 2, 2}, 3);
  check_l2loss(DataType::F32, {}, 4);
  check_l2loss(DataType::F32, {5, 0}, 5);  // empty: 0
  check_l2loss(DataType::F32, {300000}, 6);
}

TEST_CASE("BiasAdd and BiasAddGrad, NHWC and NCHW") {
  uint32_t seed = 10;
  check_bias_add(DataType::F32, {2, 3, 4, 5}, false, seed += 2);
  check_bias_add(DataType::F32, {2, 3, 4, 5}, true, seed += 2);
  check_bias_add(DataType::F16, {37, 33}, false, seed += 2);
  check_bias_add(DataType::BF16, {3, 17, 9}, true, seed += 2);
  check_bias_add(DataType::S32, {6, 10}, false, seed += 2);
  check_bias_grad(DataType::F32, {2, 3, 4, 5}, false, seed += 2);
  check_bias_grad(DataType::F32, {2, 3, 4, 5}, true, seed += 2);
  check_bias_grad(DataType::F16, {100, 7}, false, seed += 2);
  check_bias_grad(DataType::BF16, {4, 16, 3, 3}, true, seed += 2);
  check_bias_grad(DataType::F32, {512, 64}, false, seed += 2);
  check_bias_grad(DataType::S32, {9, 1}, false, seed += 2);
  // Where the reduction engine's plan leaves vector cores idle and every vector core gets 128
  // pixels, the channel sums instead (ops/bias.cpp), as compiled for the tiny chip (4 vector
  // cores): f16 x 32 channels and f32 x 24 take them, f32 x 32 (the engine's 4 blocks of 8) not;
  // the results are checked on the test chip, whichever path it takes (f16: rounded once).
  const auto first_launch = [](DataType dt, const std::vector<int64_t>& shape) {
    auto k = compiler::compile(make_op("BiasAddGrad", {{dt, shape}}, {}),
                               load_chip_config("tiny"));
    return k.launches.front().summary;
  };
  CHECK(first_launch(DataType::F16, {4, 16, 16, 32}).find("channel sums") != std::string::npos);
  CHECK(first_launch(DataType::F32, {1, 64, 64, 24}).find("channel sums") != std::string::npos);
  CHECK(first_launch(DataType::F32, {4, 16, 16, 32}).find("channel sums") == std::string::npos);
  // Where the engine takes two launches (the 910b's f16 x 64 channels: partial column sums
  // over all 48 vector cores, then their combination), the channel sums too.
  const auto f16_64 = compiler::compile(
      make_op("BiasAddGrad", {{DataType::F16, {8, 56, 56, 64}}}, {}), load_chip_config("910b"));
  CHECK(f16_64.launches.front().summary.find("channel sums") != std::string::npos);
  // f16: the partials' epilogue (in the sums' kernel on the split tiny chip, unless
  // NPUSIM_FUSION_CHANNEL_EPILOGUE=0) rounds the sums as it stores them, no Cast launch after it.
  const auto f16_sums =
      compiler::compile(make_op("BiasAddGrad", {{DataType::F16, {4, 16, 16, 32}}}, {}),
                        load_chip_config("tiny"));
  const bool in_kernel = compiler::ops::channel_epilogue_in_kernel(load_chip_config("tiny"));
  REQUIRE(f16_sums.launches.size() == (in_kernel ? 1u : 2u));
  CHECK(f16_sums.launches.back().summary.find("BiasAddGradSums") != std::string::npos);
  check_bias_grad(DataType::F16, {4, 16, 16, 32}, false, seed += 2);
  check_bias_grad(DataType::F32, {1, 64, 64, 24}, false, seed += 2);
  check_bias_grad(DataType::F32, {8, 16, 16, 48}, false, seed += 2);
  check_bias_grad(DataType::F16, {3, 17, 19, 64}, false, seed += 2);
  // 6,272 pixels: the channel sums on the 910b too (their epilogue in the sums' kernel there).
  check_bias_grad(DataType::F16, {8, 28, 28, 32}, false, seed += 2);
  CHECK_THROWS_WITH(compiler::compile(make_op("BiasAdd", {{DataType::F32, {4, 3}},
                                                          {DataType::F32, {4}}}),
                                      test_sim().config()),
                    Catch::Contains("channels"));
}
