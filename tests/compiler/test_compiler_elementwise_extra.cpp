// Floor, Ceil, Round, Sign, Log1p, LogicalNot, Invert (unary family) and DivNoNan, Pow,
// LogicalAnd, LogicalOr, BitwiseAnd, BitwiseOr (binary family) compiled for the tiny chip and run
// on the chip model, against a reference computed in double from the exactly representable
// inputs and rounded once to the output type.
//
// Tolerances (relative to the reference, in ulps of the output type: 2^-23 f32, 2^-10 f16,
// 2^-7 bf16):
//   Floor, Ceil, Round, Sign, DivNoNan, logical and bitwise ops: exact (0).
//   Log1p: 4 ulp (ln, a division and a product in fp32; f16/bf16 computed in fp32 and rounded
//     once, so 1 ulp).
//   Pow: f32 10 ulp for |y * ln x| <= 4 ln 4 (about (2 + |y ln x|) ulp, see ops/binary.cpp);
//     f16/bf16 1 ulp.
// Infinite results must match exactly (the same infinity).
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <iterator>
#include <limits>
#include <tuple>
#include <utility>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;

namespace {

double ulp(DataType t) {
  switch (t) {
    case DataType::F16: return std::ldexp(1.0, -10);
    case DataType::BF16: return std::ldexp(1.0, -7);
    default: return std::ldexp(1.0, -23);
  }
}

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// check_close, with elements that are equal (including infinities) counted as matching.
void check_equal_or_close(std::vector<double> got, std::vector<double> want, double rtol,
                          const std::string& what) {
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (got[i] == want[i]) got[i] = want[i] = 0;
  check_close(got, want, rtol, 0, what);
}

HostTensor bool_tensor(std::vector<int64_t> shape, uint32_t seed) {
  HostTensor t = random_tensor(DataType::S32, std::move(shape), 0, 1, seed);
  t.desc.dtype = DataType::BOOL;
  return t;
}

// Runs a unary op on x and compares with fn rounded to the type.
void check_unary(const std::string& op, const HostTensor& x,
                 const std::function<double(double)>& fn, double ulps) {
  const DataType dt = x.desc.dtype;
  INFO(op << " " << compiler::data_type_name(dt) << " " << compiler::shape_str(x.desc.shape));
  auto k = compiler::compile(make_op(op, {x.desc}), test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {x});
  REQUIRE(r.outputs[0].desc == x.desc);
  std::vector<double> want(x.values.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = round_to(dt, fn(x.values[i]));
  check_equal_or_close(r.outputs[0].values, want, ulps * ulp(dt), op);
}

void check_binary(const std::string& op, const HostTensor& a, const HostTensor& b,
                  const std::function<double(double, double)>& fn, double ulps) {
  const DataType dt = a.desc.dtype;
  INFO(op << " " << compiler::data_type_name(dt) << " " << compiler::shape_str(a.desc.shape)
          << " op " << compiler::shape_str(b.desc.shape));
  auto k = compiler::compile(make_op(op, {a.desc, b.desc}), test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {a, b});
  auto shape = compiler::broadcast_shapes(a.desc.shape, b.desc.shape);
  REQUIRE(shape);
  CHECK(r.outputs[0].desc.shape == *shape);
  CHECK(r.outputs[0].desc.dtype == dt);
  auto ia = broadcast_index(a.desc.shape, *shape), ib = broadcast_index(b.desc.shape, *shape);
  std::vector<double> want(ia.size());
  for (size_t i = 0; i < want.size(); ++i)
    want[i] = round_to(dt, fn(a.values[ia[i]], b.values[ib[i]]));
  check_equal_or_close(r.outputs[0].values, want, ulps * ulp(dt), op);
}

double sign_ref(double x) {
  if (std::isnan(x)) return x;
  return (x > 0) - (x < 0);
}

double pow_ref(double x, double y) { return std::pow(x, y); }

double div_no_nan_ref(double x, double y) { return y == 0 ? 0 : x / y; }

}  // namespace

TEST_CASE("Floor, Ceil, Round (half to even): exact, odd shapes, ties and specials") {
  struct R {
    const char* op;
    double (*fn)(double);
  };
  const R ops[] = {{"Floor", [](double x) { return std::floor(x); }},
                   {"Ceil", [](double x) { return std::ceil(x); }},
                   {"Round", [](double x) { return std::nearbyint(x); }}};  // RNE (default env)
  uint32_t seed = 1;
  for (const R& r : ops) {
    const std::pair<DataType, std::vector<int64_t>> cases[] = {
        {DataType::F32, {3, 41}}, {DataType::F16, {7, 1, 19}}, {DataType::BF16, {130}}};
    for (const auto& [dt, shape] : cases) {
      HostTensor x = random_tensor(dt, shape, -300, 300, seed++);
      for (size_t i = 0; i < x.values.size(); i += 5)  // exact halves: ties for Round
        x.values[i] = std::floor(x.values[i] / 8) + 0.5;
      x.values[1] = -0.5;
      x.values[2] = 2.5;
      x.values[3] = kInf;
      x.values[4] = kNaN;
      x.values[6] = -kInf;
      if (dt != DataType::F16) {
        x.values[7] = round_to(dt, 3e9);     // beyond s32: integral, passes through
        x.values[8] = round_to(dt, -8388609);  // above 2^23 in magnitude
      }
      check_unary(r.op, x, r.fn, 0);
    }
  }
}

TEST_CASE("Sign: f32 / f16 / bf16 / s32, zero and NaN") {
  uint32_t seed = 20;
  const std::pair<DataType, std::vector<int64_t>> cases[] = {
      {DataType::F32, {3, 41}}, {DataType::F16, {5, 27}}, {DataType::BF16, {130}},
      {DataType::S32, {2, 77}}};
  for (const auto& [dt, shape] : cases) {
    HostTensor x = random_tensor(dt, shape, -5, 5, seed++);
    for (size_t i = 0; i < x.values.size(); i += 7) x.values[i] = 0;
    if (dt != DataType::S32) x.values[3] = kNaN;
    check_unary("Sign", x, sign_ref, 0);
  }
}

TEST_CASE("Log1p: small x keeps precision, -1 gives -inf, large and inf") {
  uint32_t seed = 30;
  const std::tuple<DataType, std::vector<int64_t>, double> cases[] = {
      {DataType::F32, {3, 41}, 4}, {DataType::F16, {7, 1, 19}, 1}, {DataType::BF16, {130}, 1}};
  for (const auto& [dt, shape, ulps] : cases) {
    HostTensor x = random_tensor(dt, shape, -0.9, 1000, seed++);
    for (size_t i = 0; i < x.values.size(); i += 3)  // |x| in about [1e-9, 1e-3]
      x.values[i] = round_to(dt, x.values[i] * 1e-6);
    x.values[1] = -1;
    x.values[2] = kInf;
    x.values[4] = round_to(dt, 1e-7);
    if (dt != DataType::F16) x.values[5] = round_to(dt, 3e7);  // beyond 2^24
    check_unary("Log1p", x, [](double v) { return std::log1p(v); }, ulps);
  }
}

TEST_CASE("LogicalNot / LogicalAnd / LogicalOr on bool, odd sizes") {
  HostTensor x = bool_tensor({3, 37}, 40);
  check_unary("LogicalNot", x, [](double v) { return v != 0 ? 0.0 : 1.0; }, 0);
  check_unary("LogicalNot", bool_tensor({1}, 41), [](double v) { return v != 0 ? 0.0 : 1.0; }, 0);
  HostTensor a = bool_tensor({129}, 42), b = bool_tensor({129}, 43);
  check_binary("LogicalAnd", a, b, [](double p, double q) { return p != 0 && q != 0; }, 0);
  check_binary("LogicalOr", a, b, [](double p, double q) { return p != 0 || q != 0; }, 0);
  check_binary("LogicalOr", x, bool_tensor({3, 37}, 44),
               [](double p, double q) { return p != 0 || q != 0; }, 0);
}

TEST_CASE("LogicalAnd / LogicalOr broadcast bool inputs") {
  auto logical_and = [](double p, double q) -> double { return p != 0 && q != 0; };
  auto logical_or = [](double p, double q) -> double { return p != 0 || q != 0; };
  using S = std::vector<int64_t>;
  const std::pair<S, S> shapes[] = {
      {{3, 37}, {37}},  {{3, 37}, {}},     {{}, {5, 33}},    {{4, 1}, {1, 17}},
      {{2, 1, 5}, {3, 1}}, {{1}, {1}},     {{0, 3}, {3}},    {{1}, {70}}};
  uint32_t seed = 400;
  for (const auto& [sa, sb] : shapes) {
    check_binary("LogicalAnd", bool_tensor(sa, seed), bool_tensor(sb, seed + 1), logical_and, 0);
    check_binary("LogicalOr", bool_tensor(sa, seed + 2), bool_tensor(sb, seed + 3), logical_or, 0);
    seed += 4;
  }
  // Equal / NotEqual of bool (scalar unit), broadcasting too.
  auto equal = [](double p, double q) -> double { return p == q; };
  auto not_equal = [](double p, double q) -> double { return p != q; };
  for (const auto& [sa, sb] : {shapes[0], shapes[3], shapes[6]}) {
    check_binary("Equal", bool_tensor(sa, seed), bool_tensor(sb, seed + 1), equal, 0);
    check_binary("NotEqual", bool_tensor(sa, seed + 2), bool_tensor(sb, seed + 3), not_equal, 0);
    seed += 4;
  }
  CHECK_THROWS_WITH(compiler::compile(make_op("Less", {{DataType::BOOL, {4}},
                                                       {DataType::BOOL, {4}}}),
                                      test_sim().config()),
                    Catch::Contains("dtype bool is not supported"));
}

TEST_CASE("DivNoNan: 0 where y == 0, with broadcasting") {
  uint32_t seed = 50;
  const std::tuple<DataType, std::vector<int64_t>, std::vector<int64_t>> cases[] = {
      {DataType::F32, {3, 37}, {37}},
      {DataType::F16, {5, 40}, {5, 1}},
      {DataType::BF16, {33, 7}, {33, 7}}};
  for (const auto& [dt, sa, sb] : cases) {
    HostTensor a = random_tensor(dt, sa, -4, 4, seed++);
    HostTensor b = random_tensor(dt, sb, -4, 4, seed++);
    for (size_t i = 0; i < b.values.size(); i += 3) b.values[i] = 0;
    a.values[0] = kNaN;  // 0 where y == 0 even for a NaN x (b[0] is 0)
    check_binary("DivNoNan", a, b, div_no_nan_ref, 0);
  }
}

// ReciprocalGrad(y, dy) = -dy * y * y, SqrtGrad(y, dy) = dy * 0.5 / y (0 where dy == 0). bf16
// on the test chips (no bf16 arithmetic) is computed in f32 and rounded once: within one bf16
// ulp of the exact value rounded to bf16 (f32's roundings may tip a near-tie).
TEST_CASE("ReciprocalGrad and SqrtGrad on bf16, computed in f32 and rounded once") {
  uint32_t seed = 80;
  HostTensor y = random_tensor(DataType::BF16, {33, 7}, 0.25, 4, seed++);
  HostTensor dy = random_tensor(DataType::BF16, {33, 7}, -4, 4, seed++);
  for (size_t i = 0; i < dy.values.size(); i += 5) dy.values[i] = 0;
  check_binary("ReciprocalGrad", y, dy, [](double a, double g) { return -g * a * a; }, 1);
  check_binary("SqrtGrad", y, dy, [](double a, double g) { return g == 0 ? 0 : g * 0.5 / a; }, 1);
}

TEST_CASE("Pow: positive bases, negative bases with integer exponents, specials, broadcasting") {
  HostTensor a = random_tensor(DataType::F32, {3, 37}, 0.25, 4, 60);
  HostTensor b = random_tensor(DataType::F32, {3, 37}, -4, 4, 61);
  const double specials[][2] = {{0, 2}, {0, -1}, {0, 0}, {kNaN, 0}, {1, kNaN}, {1, 3},
                                {kInf, 2}, {kInf, -2}, {3, 0}, {-2, 0.5}, {4, 0.5},
                                {-2, 3}, {-2, -2}, {-1.5, 4}, {-3, -3}, {-kInf, 3}, {-kInf, 2},
                                {-0.5, 1}};
  for (size_t i = 0; i < std::size(specials); ++i) {
    a.values[i] = specials[i][0];
    b.values[i] = specials[i][1];
  }
  check_binary("Pow", a, b, pow_ref, 10);
  check_binary("Pow", random_tensor(DataType::F32, {2, 3, 33}, 0.25, 4, 62),
               random_tensor(DataType::F32, {3, 1}, -4, 4, 63), pow_ref, 10);
  check_binary("Pow", random_tensor(DataType::F16, {5, 40}, 0.25, 4, 64),
               random_tensor(DataType::F16, {1}, -4, 4, 65), pow_ref, 1);
  HostTensor nx = random_tensor(DataType::F16, {4, 9}, -4, -0.25, 68);
  HostTensor ny = random_tensor(DataType::S32, {9}, -4, 4, 69);  // integer exponents
  ny.desc.dtype = DataType::F16;
  check_binary("Pow", nx, ny, pow_ref, 1);
  check_binary("Pow", random_tensor(DataType::BF16, {33, 7}, 0.25, 4, 66),
               random_tensor(DataType::BF16, {33, 1}, -4, 4, 67), pow_ref, 1);
}

TEST_CASE("extra element-wise ops reject unsupported dtypes naming the op") {
  const ChipConfig& cfg = test_sim().config();
  CHECK_THROWS_WITH(
      compiler::compile(make_op("LogicalAnd", {{DataType::F32, {4}}, {DataType::F32, {4}}}), cfg),
      Catch::Contains("dtype f32 is not supported (bool)"));
  CHECK_THROWS_WITH(
      compiler::compile(make_op("Pow", {{DataType::S32, {4}}, {DataType::S32, {4}}}), cfg),
      Catch::Contains("dtype s32 is not supported (f32, f16, bf16)"));
  CHECK_THROWS_WITH(compiler::compile(make_op("Floor", {{DataType::S32, {4}}}), cfg),
                    Catch::Contains("Floor") && Catch::Contains("dtype s32"));
  CHECK_THROWS_WITH(compiler::compile(make_op("LogicalNot", {{DataType::F16, {4}}}), cfg),
                    Catch::Contains("dtype f16 is not supported (bool)"));
}

TEST_CASE("BitwiseAnd / BitwiseOr / Invert on int32, int16, uint16: every bit, broadcasting, errors") {
  // The reference: the op on the two's-complement bits of the type (as numpy's & and |).
  auto bits = [](DataType t, double v) -> int64_t {
    return t == DataType::U16 ? static_cast<int64_t>(v) & 0xffff : static_cast<int64_t>(v);
  };
  auto back = [](DataType t, int64_t v) -> double {
    switch (t) {
      case DataType::S32: return static_cast<int32_t>(static_cast<uint32_t>(v));
      case DataType::S16: return static_cast<int16_t>(static_cast<uint16_t>(v));
      default: return static_cast<uint16_t>(v);
    }
  };
  using S = std::vector<int64_t>;
  const std::pair<S, S> shapes[] = {
      {{3, 37}, {3, 37}}, {{129}, {}}, {{4, 1}, {1, 17}}, {{2, 70}, {70}}, {{0, 3}, {3}}};
  const std::tuple<DataType, double, double> types[] = {
      {DataType::S32, -2147483648.0, 2147483647.0},
      {DataType::S16, -32768.0, 32767.0},
      {DataType::U16, 0.0, 65535.0}};
  uint32_t seed = 700;
  for (const auto& [dt, lo, hi] : types)
    for (const auto& [sa, sb] : shapes) {
      HostTensor a = random_tensor(dt, sa, lo, hi, seed),
                 b = random_tensor(dt, sb, lo, hi, seed + 1);
      seed += 2;
      check_binary(
          "BitwiseAnd", a, b,
          [&, dt = dt](double p, double q) { return back(dt, bits(dt, p) & bits(dt, q)); }, 0);
      check_binary(
          "BitwiseOr", a, b,
          [&, dt = dt](double p, double q) { return back(dt, bits(dt, p) | bits(dt, q)); }, 0);
    }
  for (const auto& [dt, lo, hi] : types) {
    HostTensor x = random_tensor(dt, {3, 45}, lo, hi, seed++);
    check_unary("Invert", x, [&, dt = dt](double p) { return back(dt, ~bits(dt, p)); }, 0);
  }
  // The metric's sign-bit test: x & INT32_MIN on the bits of floats, -0.0 included.
  HostTensor x{{DataType::S32, {6}}, {0.0, -2147483648.0, 1065353216.0, -1082130432.0, -1.0, 1.0}};
  HostTensor sign{{DataType::S32, {}}, {-2147483648.0}};
  check_binary(
      "BitwiseAnd", x, sign,
      [&](double p, double q) {
        return back(DataType::S32, bits(DataType::S32, p) & bits(DataType::S32, q));
      },
      0);
  CHECK_THROWS_WITH(
      compiler::compile(make_op("BitwiseAnd", {{DataType::F32, {4}}, {DataType::F32, {4}}}),
                        test_sim().config()),
      Catch::Contains("dtype f32 is not supported (s32, s16, u16)"));
}
