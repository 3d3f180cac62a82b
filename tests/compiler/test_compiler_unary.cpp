// Unary ops and Cast compiled for the tiny chip and run on the chip model, against a reference
// in plain C++ (double, rounded once to the output type).
//
// Tolerances (relative to the reference value, ulp = 2^-23 for f32, 2^-10 for f16, 2^-7 bf16):
//   Neg, Abs, Square, Relu, Cast: exact (0): one correctly rounded operation.
//   Sqrt, Reciprocal: exact for f32 (correctly rounded in fp32); f16/bf16 are computed in fp32
//     and rounded again to the type, which can differ from one rounding by 1 ulp.
//   Exp, Log: 2 ulp (libm's expf/logf; TF's Eigen kernels are within a few ulp too).
//   Rsqrt: 2 ulp (1/sqrt(x) rounds twice in fp32).
#include <catch2/catch.hpp>

#include <cfloat>
#include <cmath>
#include <functional>

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

struct UnaryCase {
  const char* op;
  std::function<double(double)> fn;
  double lo, hi;  // input range
  double ulps_f32, ulps_16;  // tolerance in ulps of the output type
  bool ints;      // also runs on s32
};

const UnaryCase kUnary[] = {
    {"Neg", [](double x) { return -x; }, -8, 8, 0, 0, true},
    {"Abs", [](double x) { return std::fabs(x); }, -8, 8, 0, 0, true},
    {"Square", [](double x) { return x * x; }, -8, 8, 0, 0, true},
    {"Relu", [](double x) { return x > 0 ? x : 0; }, -8, 8, 0, 0, true},
    {"Sqrt", [](double x) { return std::sqrt(x); }, 0.01, 50, 0, 1, false},
    {"Reciprocal", [](double x) { return 1 / x; }, 0.2, 9, 0, 1, false},
    {"Rsqrt", [](double x) { return 1 / std::sqrt(x); }, 0.01, 50, 2, 2, false},
    {"Exp", [](double x) { return std::exp(x); }, -6, 6, 2, 2, false},
    {"Log", [](double x) { return std::log(x); }, 0.01, 50, 2, 2, false},
};

void check_unary(const UnaryCase& c, DataType dt, std::vector<int64_t> shape, uint32_t seed) {
  INFO(c.op << " " << compiler::data_type_name(dt) << " " << compiler::shape_str(shape));
  HostTensor x = random_tensor(dt, shape, c.lo, c.hi, seed);
  auto k = compiler::compile(make_op(c.op, {x.desc}), test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {x});
  REQUIRE(r.outputs[0].desc == x.desc);
  std::vector<double> want(x.values.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = round_to(dt, c.fn(x.values[i]));
  const double ulps = dt == DataType::F32 || dt == DataType::S32 ? c.ulps_f32 : c.ulps_16;
  check_close(r.outputs[0].values, want, ulps * ulp(dt), 0, c.op);
}

// Reference cast: TF's rounding (RNE to floats, toward zero to integers).
double cast_ref(double x, DataType dst, bool truncate) {
  if (dst == DataType::BOOL) return x != 0 ? 1 : 0;
  if (dst == DataType::S32 || dst == DataType::U8) return std::trunc(x);
  if (!truncate) return round_to(dst, x);
  // Toward zero: the RNE result, stepped one ulp toward zero if it rounded away.
  double r = round_to(dst, x);
  if (std::fabs(r) <= std::fabs(x)) return r;
  if (dst == DataType::F16) {
    uint16_t b = to_f16_bits_direct(r);
    return from_f16_bits(static_cast<uint16_t>(b - 1));  // magnitude down by one ulp
  }
  return std::nextafter(static_cast<float>(r), 0.0f);
}

void check_cast(DataType src, DataType dst, std::vector<int64_t> shape, uint32_t seed,
                bool truncate = false) {
  INFO("Cast " << compiler::data_type_name(src) << " -> " << compiler::data_type_name(dst)
               << " " << compiler::shape_str(shape) << (truncate ? " truncate" : ""));
  const bool is_bool = src == DataType::BOOL;
  const bool to_u8 = dst == DataType::U8;  // in range: TF's out-of-range result is undefined
  HostTensor x = random_tensor(is_bool ? DataType::S32 : src, shape,
                               is_bool || to_u8 ? 0 : -300, is_bool ? 1 : to_u8 ? 255 : 300, seed);
  x.desc.dtype = src;
  for (size_t i = 0; i < x.values.size(); i += 7) x.values[i] = 0;  // zeros for -> bool
  if (src == DataType::F32 && dst == DataType::F16 && x.values.size() > 3) {
    x.values[1] = 65519.0;    // rounds to f16 max 65504
    x.values[2] = 1e-6;       // an f16 subnormal
    x.values[3] = -2.5 / 1024;
  }
  auto k = compiler::compile(make_op("Cast", {x.desc},
                                     {{"SrcT", std::string(compiler::data_type_name(src))},
                                      {"DstT", std::string(compiler::data_type_name(dst))},
                                      {"Truncate", truncate}}),
                             test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {x});
  REQUIRE(r.outputs[0].desc.dtype == dst);
  std::vector<double> want(x.values.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = cast_ref(x.values[i], dst, truncate);
  check_close(r.outputs[0].values, want, 0, 0, "Cast");
}

// IsFinite on the edge values of `dt` (zeros, NaN, +-Inf, the largest finite values, the smallest
// normal and denormal values) repeated over `shape`, against std::isfinite.
void check_is_finite(DataType dt, std::vector<int64_t> shape) {
  INFO("IsFinite " << compiler::data_type_name(dt) << " " << compiler::shape_str(shape));
  const double inf = HUGE_VAL, nan = std::nan("");
  double max = FLT_MAX, min_normal = FLT_MIN, denormal = FLT_TRUE_MIN;
  if (dt == DataType::F16) {
    max = 65504, min_normal = std::ldexp(1.0, -14), denormal = std::ldexp(1.0, -24);
  } else if (dt == DataType::BF16) {
    max = from_bf16_bits(0x7f7f), min_normal = from_bf16_bits(0x0080);
    denormal = from_bf16_bits(0x0001);
  }
  const double edges[] = {0,   -0.0, 1,        -1.5,       nan,       inf,      -inf,
                          max, -max, min_normal, -min_normal, denormal, -denormal, -nan};
  HostTensor x{TensorDesc{dt, std::move(shape)}, {}};
  x.values.resize(static_cast<size_t>(x.desc.num_elements()));
  for (size_t i = 0; i < x.values.size(); ++i)
    x.values[i] = edges[(i * 5 + i / 14) % std::size(edges)];  // every edge at every lane phase
  auto k = compiler::compile(make_op("IsFinite", {x.desc}), test_sim().config());
  REQUIRE(k.outputs[0] == TensorDesc{DataType::BOOL, x.desc.shape});
  if (x.values.empty()) {
    CHECK(k.launches.empty());
    return;
  }
  RunResult r = run_compiled(test_sim(), k, {x});
  std::vector<double> want(x.values.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = std::isfinite(x.values[i]) ? 1 : 0;
  check_close(r.outputs[0].values, want, 0, 0, "IsFinite");
}

}  // namespace

TEST_CASE("IsFinite on NaN, Inf, denormals and the largest values, f32 / f16 / bf16") {
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16}) {
    check_is_finite(dt, {14});
    check_is_finite(dt, {1});
    check_is_finite(dt, {5, 19});
    check_is_finite(dt, {3, 0});
  }
  check_is_finite(DataType::F32, {2, 4099});  // several tiles, a partial last repeat
  check_is_finite(DataType::F16, {20011});
  CHECK_THROWS_WITH(compiler::compile(make_op("IsFinite", {{DataType::S32, {4}}}), test_sim().config()),
                    Catch::Contains("dtype s32"));
}

TEST_CASE("unary ops, f32 / f16 / bf16 / s32, odd and size-1 shapes") {
  uint32_t seed = 1;
  for (const UnaryCase& c : kUnary) {
    check_unary(c, DataType::F32, {3, 41}, seed++);
    check_unary(c, DataType::F16, {7, 1, 19}, seed++);
    check_unary(c, DataType::BF16, {130}, seed++);
    if (c.ints) check_unary(c, DataType::S32, {2, 77}, seed++);
  }
  check_unary(kUnary[0], DataType::F32, {}, seed++);  // a scalar
  check_unary(kUnary[7], DataType::F16, {1}, seed++);
}

TEST_CASE("unary op over many tiles and all vector cores") {
  // 70000 f32 elements: 4 blocks of 17504, several UB tiles each (see the launch summary).
  check_unary(kUnary[7], DataType::F32, {70000}, 90);
  check_unary(kUnary[3], DataType::F16, {3, 33333}, 91);
}

TEST_CASE("zero-size unary op: no launch") {
  compiler::TensorDesc x{DataType::F32, {4, 0, 3}};
  auto k = compiler::compile(make_op("Exp", {x}), test_sim().config());
  CHECK(k.launches.empty());
  CHECK(k.outputs[0] == x);
}

TEST_CASE("Cast between f32, f16, bf16, s32 and bool") {
  check_cast(DataType::F32, DataType::F16, {5, 31}, 1);
  check_cast(DataType::F32, DataType::F16, {5, 31}, 2, true);
  check_cast(DataType::F16, DataType::F32, {100}, 3);
  check_cast(DataType::F32, DataType::BF16, {9, 9}, 4);
  check_cast(DataType::BF16, DataType::F32, {33}, 5);
  check_cast(DataType::F32, DataType::S32, {3, 50}, 6);
  check_cast(DataType::F16, DataType::S32, {47}, 7);
  check_cast(DataType::S32, DataType::F32, {65}, 8);
  check_cast(DataType::S32, DataType::F16, {65}, 9);
  check_cast(DataType::F32, DataType::BOOL, {3, 29}, 10);
  check_cast(DataType::S32, DataType::BOOL, {40}, 11);
  check_cast(DataType::BOOL, DataType::F32, {37}, 12);
  check_cast(DataType::BOOL, DataType::F16, {70}, 13);
  check_cast(DataType::F32, DataType::F32, {19}, 14);
  check_cast(DataType::F16, DataType::BF16, {50}, 15);
  check_cast(DataType::BOOL, DataType::BOOL, {45}, 16);
  check_cast(DataType::F32, DataType::U8, {2, 40}, 17);
}

TEST_CASE("unsupported unary ops, dtypes and casts are errors naming the op") {
  const ChipConfig& cfg = test_sim().config();
  CHECK_THROWS_WITH(compiler::compile(make_op("Exp", {{DataType::S32, {4}}}), cfg),
                    Catch::Contains("Exp(s32[4])") && Catch::Contains("dtype s32"));
  CHECK_THROWS_WITH(compiler::compile(make_op("Cast", {{DataType::S32, {4}}},
                                              {{"DstT", std::string("s16")}}),
                                      cfg),
                    Catch::Contains("wraps"));
  CHECK_THROWS_WITH(compiler::compile(make_op("Cast", {{DataType::F32, {4}}}), cfg),
                    Catch::Contains("DstT is missing"));
  CHECK_THROWS_WITH(compiler::compile(make_op("Lgamma", {{DataType::F32, {4}}}), cfg),
                    Catch::Contains("not supported by the kernel compiler"));
}
