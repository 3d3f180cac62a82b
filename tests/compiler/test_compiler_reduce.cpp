// Reductions (Sum, Mean, Max, Min, Prod, ArgMax, ArgMin, SquareSumV1) compiled for the tiny
// chip and run on the chip model, against a reference computed here in double precision.
//
// Tolerances. u = 2^-24 (f32 unit roundoff); u_t = the output type's (2^-24 f32, 2^-11 f16,
// 2^-8 bf16); n = elements reduced into one output; S = sum of their |x|.
//   Sum: the kernels accumulate in f32 in some order (lane order, halving folds, parts); any
//     order of n - 1 f32 additions is within (n - 1) u S of the exact sum (Higham, "Accuracy and
//     Stability of Numerical Algorithms", 4.2); the result is then rounded once to the output
//     type: |got - ref| <= e + u_t (|ref| + e), e = n u S.
//   Mean: the sum's error divided by n, plus the f32 division (u) and the output rounding:
//     e = u S + u |ref|; |got - ref| <= e + u_t (|ref| + e).
//   Prod: n - 1 f32 multiplications, each within a factor (1 + u): relative (n u) |ref|, then the
//     output rounding (inputs near 1 keep the product in range).
//   Max, Min: exact (a value of the input, rounded to nothing).
//   s32: exact (TF's int32 sums and products wrap, as the reference does).
//   ArgMax/ArgMin: exact indices, first occurrence on ties (inputs take few distinct values so
//     ties happen).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <regex>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;

namespace {

double unit(DataType t) {
  switch (t) {
    case DataType::F16: return std::ldexp(1.0, -11);
    case DataType::BF16: return std::ldexp(1.0, -8);
    case DataType::S32: return 0;
    default: return std::ldexp(1.0, -24);
  }
}

// For each input element, the flat index of the output element it reduces into.
std::vector<size_t> output_index(const std::vector<int64_t>& shape, const std::vector<bool>& red) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<size_t> idx(static_cast<size_t>(n));
  for (int64_t f = 0; f < n; ++f) {
    int64_t rest = f, out = 0, stride = 1;
    for (size_t d = shape.size(); d-- > 0;) {
      int64_t i = rest % shape[d];
      rest /= shape[d];
      if (!red[d]) {
        out += i * stride;
        stride *= shape[d];
      }
    }
    idx[static_cast<size_t>(f)] = static_cast<size_t>(out);
  }
  return idx;
}

std::vector<bool> flags(size_t rank, const std::vector<int64_t>& axes) {
  std::vector<bool> r(rank, false);
  for (int64_t a : axes) r[static_cast<size_t>(a < 0 ? a + static_cast<int64_t>(rank) : a)] = true;
  return r;
}

// The shape a reduction over the dims flagged in `red` gives (keep: those dims as 1).
std::vector<int64_t> reduced_shape(const std::vector<int64_t>& shape, const std::vector<bool>& red,
                                   bool keep) {
  std::vector<int64_t> out;
  for (size_t d = 0; d < shape.size(); ++d)
    if (!red[d]) out.push_back(shape[d]);
    else if (keep) out.push_back(1);
  return out;
}

compiler::CompiledKernel compile_reduce(const std::string& op, const compiler::TensorDesc& x,
                                        const std::vector<int64_t>& axes, bool keep) {
  return compiler::compile(
      make_op(op, {x}, {{"axes", axes}, {"keep_dims", keep}}), test_sim().config());
}

void check_reduce(const std::string& op, DataType dt, const std::vector<int64_t>& shape,
                  const std::vector<int64_t>& axes, bool keep, uint32_t seed) {
  INFO(op << " " << compiler::data_type_name(dt) << compiler::shape_str(shape) << " axes "
          << compiler::shape_str(axes) << (keep ? " keep_dims" : ""));
  const bool prod = op == "Prod";
  double lo = -4, hi = 4;
  int64_t per_out = 1;  // elements reduced into one output
  for (int64_t a : axes) per_out *= shape[static_cast<size_t>(a < 0 ? a + static_cast<int64_t>(shape.size()) : a)];
  if (prod) lo = dt == DataType::S32 ? -2 : 0.8, hi = dt == DataType::S32 ? 2 : 1.25;
  if (prod && per_out > 100) lo = 0.99, hi = 1.01;  // keeps long products in range
  if (dt == DataType::S32 && !prod) lo = -1000, hi = 1000;
  HostTensor x = random_tensor(dt, shape, lo, hi, seed);
  auto k = compile_reduce(op, x.desc, axes, keep);
  RunResult r = run_compiled(test_sim(), k, {x});
  const std::vector<bool> red = flags(shape.size(), axes);
  REQUIRE(r.outputs[0].desc == (compiler::TensorDesc{dt, reduced_shape(shape, red, keep)}));
  const auto oi = output_index(shape, red);
  const size_t n_out = r.outputs[0].values.size();
  std::vector<double> acc(n_out), sabs(n_out, 0), cnt(n_out, 0);
  const double inf = std::numeric_limits<double>::infinity();
  for (double& a : acc) a = op == "Max" ? -inf : op == "Min" ? inf : prod ? 1 : 0;
  if (dt == DataType::S32 && op == "Max") for (double& a : acc) a = INT32_MIN;
  if (dt == DataType::S32 && op == "Min") for (double& a : acc) a = INT32_MAX;
  for (size_t i = 0; i < x.values.size(); ++i) {
    double v = x.values[i];
    double& a = acc[oi[i]];
    if (op == "Max") a = std::max(a, v);
    else if (op == "Min") a = std::min(a, v);
    else if (prod && dt == DataType::S32)
      a = static_cast<int32_t>(static_cast<uint32_t>(static_cast<int32_t>(a)) *
                               static_cast<uint32_t>(static_cast<int32_t>(v)));
    else if (prod) a *= v;
    else a += v;
    sabs[oi[i]] += std::fabs(v);
    cnt[oi[i]] += 1;
  }
  std::vector<double> want(n_out), tol(n_out);
  const double u = std::ldexp(1.0, -24), ut = unit(dt);
  for (size_t i = 0; i < n_out; ++i) {
    double ref = acc[i], e = 0;
    if (op == "Mean") {
      ref = cnt[i] ? acc[i] / cnt[i] : std::numeric_limits<double>::quiet_NaN();
      e = u * sabs[i] + u * std::fabs(ref);
    } else if (op == "Sum" && dt != DataType::S32) {
      e = cnt[i] * u * sabs[i];
    } else if (prod && dt != DataType::S32) {
      e = cnt[i] * u * std::fabs(ref);
    }
    want[i] = ref;
    tol[i] = e + ut * (std::fabs(ref) + e);
    if (op == "Max" || op == "Min") tol[i] = 0;
  }
  int bad = 0;
  for (size_t i = 0; i < n_out; ++i) {
    double got = r.outputs[0].values[i];
    bool ok = (std::isnan(got) && std::isnan(want[i])) || std::fabs(got - want[i]) <= tol[i] ||
              got == want[i];
    if (!ok && bad++ < 5) UNSCOPED_INFO("output " << i << " got " << got << " want " << want[i]);
  }
  for (const auto& l : k.launches) UNSCOPED_INFO(l.summary);
  CHECK(bad == 0);
}

void check_arg(const std::string& op, DataType dt, const std::vector<int64_t>& shape,
               int64_t axis, DataType out_type, uint32_t seed, int distinct = 7) {
  INFO(op << " " << compiler::data_type_name(dt) << compiler::shape_str(shape) << " axis "
          << axis << " -> " << compiler::data_type_name(out_type));
  HostTensor x = random_tensor(dt, shape, 0, 1, seed);
  for (double& v : x.values) v = std::floor(v * distinct) - distinct / 2;  // ties
  auto k = compiler::compile(
      make_op(op, {x.desc},
              {{"axis", axis}, {"output_type", std::string(compiler::data_type_name(out_type))}}),
      test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {x});
  const size_t rank = shape.size();
  const size_t ax = static_cast<size_t>(axis < 0 ? axis + static_cast<int64_t>(rank) : axis);
  std::vector<int64_t> out_shape;
  for (size_t d = 0; d < rank; ++d)
    if (d != ax) out_shape.push_back(shape[d]);
  REQUIRE(r.outputs[0].desc.shape == out_shape);
  REQUIRE(r.outputs[0].desc.dtype == out_type);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < ax; ++d) outer *= shape[d];
  for (size_t d = ax + 1; d < rank; ++d) inner *= shape[d];
  const int64_t R = shape[ax];
  std::vector<double> want(static_cast<size_t>(outer * inner));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      int64_t best = 0;
      for (int64_t j = 1; j < R; ++j) {
        double v = x.values[static_cast<size_t>((o * R + j) * inner + i)];
        double b = x.values[static_cast<size_t>((o * R + best) * inner + i)];
        if (op == "ArgMax" ? v > b : v < b) best = j;
      }
      want[static_cast<size_t>(o * inner + i)] = static_cast<double>(best);
    }
  for (const auto& l : k.launches) UNSCOPED_INFO(l.summary);
  check_close(r.outputs[0].values, want, 0, 0, op);
}

// The integer after `phrase` in the summary of the kernel launch whose name contains `kernel`
// (-1 if absent): the tiling the compiler chose, to check that a case really runs several
// steps per core.
int64_t plan_number(const std::string& op, DataType dt, const std::vector<int64_t>& shape,
                    const std::map<std::string, compiler::AttrValue>& attrs, const std::string& kernel,
                    const std::string& phrase) {
  auto k = compiler::compile(make_op(op, {compiler::TensorDesc{dt, shape}}, attrs),
                             test_sim().config());
  for (const auto& l : k.launches) {
    if (l.summary.find(kernel) == std::string::npos) continue;
    std::smatch m;
    if (std::regex_search(l.summary, m, std::regex(phrase + " ([0-9]+)")))
      return std::stoll(m[1].str());
  }
  return -1;
}

}  // namespace

TEST_CASE("reductions over the trailing axis (rows)") {
  uint32_t seed = 1;
  for (const char* op : {"Sum", "Mean", "Max", "Min", "Prod"}) {
    check_reduce(op, DataType::F32, {37, 10}, {1}, false, seed++);
    check_reduce(op, DataType::F16, {5, 16}, {-1}, true, seed++);
    check_reduce(op, DataType::BF16, {19, 100}, {1}, false, seed++);
  }
  check_reduce("Sum", DataType::S32, {21, 9}, {1}, false, seed++);
  check_reduce("Max", DataType::S32, {3, 130}, {1}, false, seed++);
  check_reduce("Prod", DataType::S32, {9, 5}, {1}, false, seed++);
  check_reduce("Sum", DataType::F32, {300, 3}, {1}, false, seed++);   // many groups
  check_reduce("Sum", DataType::F32, {1, 1}, {1}, false, seed++);
  check_reduce("Max", DataType::F16, {7, 1, 33}, {1, 2}, false, seed++);
  // 8 rows of 1001 per super-row: longer than an instruction's repeat stride reaches.
  check_reduce("Sum", DataType::F32, {16, 1001}, {1}, false, seed++);
  check_arg("ArgMax", DataType::F32, {24, 1001}, 1, DataType::S32, seed++, 50);
}

TEST_CASE("reductions over leading, middle and several axes (columns, stages)") {
  uint32_t seed = 100;
  check_reduce("Sum", DataType::F32, {50, 7}, {0}, false, seed++);
  check_reduce("Mean", DataType::F16, {100, 16}, {0}, true, seed++);
  check_reduce("Max", DataType::BF16, {4, 9, 5}, {1}, false, seed++);
  check_reduce("Min", DataType::F32, {3, 33, 24}, {-2}, false, seed++);
  check_reduce("Prod", DataType::F32, {6, 5, 7}, {0, 2}, false, seed++);
  check_reduce("Sum", DataType::F16, {2, 3, 4, 5}, {1, 3}, true, seed++);
  check_reduce("Mean", DataType::F32, {3, 17, 2, 9}, {0, 1, 2, 3}, false, seed++);
  check_reduce("Sum", DataType::S32, {31, 17}, {0}, false, seed++);
  check_reduce("Min", DataType::S32, {5, 6, 7}, {0, 2}, true, seed++);
  check_reduce("Mean", DataType::BF16, {8, 3, 40}, {1}, false, seed++);
  check_reduce("Sum", DataType::F32, {4, 1, 1000}, {1}, false, seed++);  // only a size-1 axis
  check_reduce("Sum", DataType::F32, {9, 33, 130}, {0, 2}, false, seed++);
  check_reduce("Max", DataType::F32, {4, 5, 6}, {0, 1, 2}, true, seed++);
  check_reduce("Sum", DataType::F32, {}, {}, false, seed++);  // a scalar
}

TEST_CASE("long reductions: streamed rows and parts over the cores") {
  uint32_t seed = 200;
  check_reduce("Sum", DataType::F32, {3, 20000}, {1}, false, seed++);
  check_reduce("Max", DataType::F16, {70001}, {0}, false, seed++);
  check_reduce("Mean", DataType::F32, {2, 3, 9000}, {2}, true, seed++);
  check_reduce("Prod", DataType::F32, {20000}, {0}, false, seed++);
  check_reduce("Sum", DataType::F16, {20000, 3}, {0}, false, seed++);
  check_reduce("Min", DataType::F32, {30, 3000}, {1}, false, seed++);
  // Enough rows for every core, each too long for a group of 8: streamed without parts.
  check_reduce("Sum", DataType::F16, {33, 7000}, {1}, false, seed++);
  check_reduce("Prod", DataType::BF16, {32, 6000}, {-1}, true, seed++);
  // Rows 8 MiB apart: farther than a strided copy's gap reaches, loaded one by one.
  check_reduce("Sum", DataType::F32, {2, 2097160}, {0}, false, seed++);
  check_reduce("Sum", DataType::F16, {32, 45000}, {1}, false, seed++);  // two chunks per row
}

// The kernels are double-buffered (ping/pong UB copies, vector_rows.h PingPong): cases with many
// groups, chunks or row loads per core and odd remainders, so that both copies are used, a
// copy is reused after the other, and the last step is partial.
TEST_CASE("double-buffered reductions: many steps per core, odd remainders") {
  uint32_t seed = 400;
  const std::map<std::string, compiler::AttrValue> rows_axis{{"axes", std::vector<int64_t>{1}}};
  // Rows kernel: each core's rows take three groups of 16 rows of 1000 (checked from the plan),
  // the last core's rows are a partial group.
  const ChipConfig& cfg = test_sim().config();
  const int64_t cores =
      cfg.core_kind(cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE)->count;
  const std::vector<int64_t> rows_shape{40 * cores + 7, 1000};
  const int64_t per = plan_number("Sum", DataType::F16, rows_shape, rows_axis, "rows", "blocks of");
  const int64_t group =
      plan_number("Sum", DataType::F16, rows_shape, rows_axis, "rows", "groups of");
  INFO("rows per core " << per << ", rows per group " << group);
  REQUIRE(group > 0);
  CHECK(per > 2 * group);
  check_reduce("Sum", DataType::F16, rows_shape, {1}, false, seed++);
  check_reduce("Mean", DataType::F32, {1001, 77}, {1}, false, seed++);
  check_reduce("Max", DataType::BF16, {613, 250}, {-1}, true, seed++);
  check_reduce("Prod", DataType::F32, {501, 37}, {1}, false, seed++);
  check_arg("ArgMax", DataType::F16, {777, 250}, 1, DataType::S32, seed++, 40);
  check_arg("ArgMin", DataType::F32, {333, 129}, 1, DataType::S64, seed++, 40);
  // Streamed rows: many chunks per row (odd count, partial last chunk), several rows per core.
  const std::vector<int64_t> long_shape{9, 100003};
  const int64_t chunk =
      plan_number("Sum", DataType::F16, long_shape, rows_axis, "", "chunks of");
  INFO("chunk " << chunk);
  REQUIRE(chunk > 0);
  CHECK(100003 / chunk >= 3);
  check_reduce("Sum", DataType::F16, long_shape, {1}, false, seed++);
  check_reduce("Min", DataType::F32, {7, 40001}, {1}, false, seed++);
  check_arg("ArgMax", DataType::BF16, {5, 30007}, 1, DataType::S32, seed++, 1000);
  // Columns: many row loads per output tile and several tiles per core.
  check_reduce("Sum", DataType::F16, {3001, 517}, {0}, false, seed++);
  check_reduce("Mean", DataType::F32, {2999, 130}, {0}, false, seed++);
  check_reduce("Max", DataType::F32, {5, 1999, 67}, {1}, false, seed++);
  check_arg("ArgMin", DataType::F16, {3001, 45}, 0, DataType::S32, seed++, 500);
  // Split over the cores: parts (with indices for Arg), then a columns launch combines them.
  check_reduce("Sum", DataType::F32, {200001}, {0}, false, seed++);
  check_arg("ArgMax", DataType::F32, {150001}, 0, DataType::S32, seed++, 100000);
}

TEST_CASE("empty reductions and zero-size outputs") {
  const ChipConfig& cfg = test_sim().config();
  // A zero-size reduced dim: the identity (Mean: NaN).
  for (const char* op : {"Sum", "Prod", "Max", "Mean"}) check_reduce(op, DataType::F32, {3, 0}, {1}, false, 7);
  check_reduce("Min", DataType::F16, {0, 4}, {0}, true, 8);
  // Zero-size output: nothing to run.
  auto k = compile_reduce("Sum", {DataType::F32, {0, 5}}, {1}, false);
  CHECK(k.launches.empty());
  CHECK(k.outputs[0] == (compiler::TensorDesc{DataType::F32, {0}}));
  // Empty axes: a copy.
  check_reduce("Sum", DataType::F16, {3, 5}, {}, false, 9);
  CHECK_THROWS_WITH(compiler::compile(make_op("Sum", {{DataType::F32, {4}}}), cfg),
                    Catch::Contains("'axes'"));
  CHECK_THROWS_WITH(compile_reduce("Sum", {DataType::F32, {4, 2}}, {2}, false),
                    Catch::Contains("axis 2 is out of range"));
  // s32 Mean runs on the scalar unit (test_compiler_int64.cpp); over an empty axis TF divides
  // by zero.
  CHECK_THROWS_WITH(compile_reduce("Mean", {DataType::S32, {4, 0}}, {1}, false),
                    Catch::Contains("divides by zero"));
  CHECK_THROWS_WITH(
      compiler::compile(make_op("ArgMax", {{DataType::F32, {4, 0}}}, {{"axis", int64_t{1}}}), cfg),
      Catch::Contains("axis 1 is empty"));
}

namespace {

// SquareSumV1 (CANN's Sum of squares, made by the TF plugin of Lamb's norms) over `axes`
// against the double sum of x * x: n squares and n - 1 additions in f32, e = (n + 1) u S with S
// the exact sum, then the output rounding. f32: also the same bits as Square then Sum (the
// graph it replaces), the engine squaring in its own pass with the same vmul.
void check_square_sum(DataType dt, const std::vector<int64_t>& shape,
                      const std::vector<int64_t>& axes, bool keep, uint32_t seed) {
  INFO("SquareSumV1 " << compiler::data_type_name(dt) << compiler::shape_str(shape) << " axis "
                      << compiler::shape_str(axes) << (keep ? " keep_dims" : ""));
  HostTensor x = random_tensor(dt, shape, -2, 2, seed);
  auto k = compiler::compile(make_op("SquareSumV1", {x.desc}, {{"axis", axes}, {"keep_dims", keep}}),
                             test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {x});
  const std::vector<bool> red = flags(shape.size(), axes);
  REQUIRE(r.outputs[0].desc == (compiler::TensorDesc{dt, reduced_shape(shape, red, keep)}));
  const auto oi = output_index(shape, red);
  const size_t n_out = r.outputs[0].values.size();
  std::vector<double> acc(n_out, 0), cnt(n_out, 0);
  for (size_t i = 0; i < x.values.size(); ++i) {
    acc[oi[i]] += x.values[i] * x.values[i];
    cnt[oi[i]] += 1;
  }
  const double u = std::ldexp(1.0, -24), ut = unit(dt);
  int bad = 0;
  for (size_t i = 0; i < n_out; ++i) {
    const double e = (cnt[i] + 1) * u * acc[i], tol = e + ut * (acc[i] + e);
    const double got = r.outputs[0].values[i];
    if (!(std::fabs(got - acc[i]) <= tol) && bad++ < 5)
      UNSCOPED_INFO("output " << i << " got " << got << " want " << acc[i]);
  }
  CHECK(bad == 0);
  if (dt != DataType::F32) return;
  auto square = compiler::compile(make_op("Square", {x.desc}), test_sim().config());
  RunResult sq = run_compiled(test_sim(), square, {x});
  HostTensor squares{x.desc, sq.outputs[0].values};
  RunResult sum = run_compiled(test_sim(), compile_reduce("Sum", x.desc, axes, keep), {squares});
  CHECK(sum.outputs[0].values == r.outputs[0].values);
}

}  // namespace

TEST_CASE("SquareSumV1: the sum of squares in the reduction's pass") {
  uint32_t seed = 400;
  check_square_sum(DataType::F32, {16, 4}, {0, 1}, false, seed++);     // a bias-sized norm
  check_square_sum(DataType::F32, {1024, 96}, {0, 1}, false, seed++);  // parts over the cores
  check_square_sum(DataType::F32, {7, 33, 5}, {0, 2}, true, seed++);
  check_square_sum(DataType::F16, {3000}, {0}, false, seed++);
  check_square_sum(DataType::BF16, {40, 20}, {1}, false, seed++);
  const ChipConfig& cfg = test_sim().config();
  CHECK_THROWS_WITH(compiler::compile(make_op("SquareSumV1", {{DataType::F32, {4}}}), cfg),
                    Catch::Contains("'axis'"));
  CHECK_THROWS_WITH(compiler::compile(make_op("SquareSumV1", {{DataType::S32, {4}}},
                                              {{"axis", std::vector<int64_t>{0}}}),
                                      cfg),
                    Catch::Contains("dtype s32 is not supported"));
}

// Lamb's per-variable norms are many small full reductions. A launch of k such norms can reduce
// them as the rows of a [k, R] tensor, with each norm's bits unchanged, only if a row's result
// does not depend on how many rows the launch has nor where it sits. That holds for rows that
// start on a 32-byte block (R f32 a multiple of 8: 296, 1000, 1024, 4096 here) reduced in one
// stage (rows and streamed-rows plans). It does not hold for unaligned rows (R = 300: row 7,
// at byte 8400, sums 1 ulp apart from the same 300 values alone, on tiny and on the 910) nor for
// a reduction split into parts over the cores (the part count follows the number of outputs,
// and with it the order of the additions), which these cases leave out.
TEST_CASE("SquareSumV1: a row's sum of squares has the same bits in a launch of many rows") {
  const ChipConfig& cfg = test_sim().config();
  uint32_t seed = 450;
  for (int64_t r : {int64_t{296}, int64_t{1000}, int64_t{1024}, int64_t{4096}}) {
    INFO("rows of " << r);
    const int64_t k = 19;
    HostTensor rows = random_tensor(DataType::F32, {k, r}, -3, 3, seed++);
    auto many = compiler::compile(
        make_op("SquareSumV1", {rows.desc}, {{"axis", std::vector<int64_t>{1}}}), cfg);
    REQUIRE(many.launches.size() == 1);
    const RunResult all = run_compiled(test_sim(), many, {rows});
    for (int64_t i : {int64_t{0}, int64_t{7}, k - 1}) {
      const auto first = rows.values.begin() + i * r;
      HostTensor one{compiler::TensorDesc{DataType::F32, {r}},
                     std::vector<double>(first, first + r)};
      auto single = compiler::compile(
          make_op("SquareSumV1", {one.desc}, {{"axis", std::vector<int64_t>{0}}}), cfg);
      const RunResult alone = run_compiled(test_sim(), single, {one});
      INFO("row " << i);
      CHECK(alone.outputs[0].values[0] == all.outputs[0].values[static_cast<size_t>(i)]);
    }
  }
}

// SquareSumV1 with attribute N > 1 (graph_fusion.h rewrite 17b): output i is input i's own
// SquareSumV1, bit for bit, whatever the inputs: f32 inputs of one aligned element count below
// the split, reduced whole, four or more of them, as the rows of one reduction (more than 128
// take a second copy launch on each side of it); f32 inputs of one element count whose own
// reduction is split into parts, three or more, with their own first passes and one combine
// (then a copy launch); every other input in its own launches.
TEST_CASE("SquareSumV1 of N tensors: each output has the bits of its own launch") {
  const ChipConfig& cfg = test_sim().config();
  using V = std::vector<int64_t>;
  struct Input {
    DataType dt;
    V shape;
  };
  struct Case {
    V axes;
    std::vector<Input> inputs;
  };
  std::vector<Input> mixed;
  for (int i = 0; i < 130; ++i)  // every third of rank 2: the same elements, reduced whole
    mixed.push_back({DataType::F32, i % 3 == 1 ? V{8, 128} : V{1024}});
  for (const Input& x : std::vector<Input>{{DataType::F32, {64, 64}},  // three: alone
                                           {DataType::F32, {4096}},
                                           {DataType::F32, {4096}},
                                           {DataType::F32, {300}},   // unaligned
                                           {DataType::F32, {8192}},  // split into parts
                                           {DataType::F16, {1024}}})
    mixed.push_back(x);
  std::vector<Input> four(4, Input{DataType::F32, {8184}});
  std::vector<Input> columns(5, Input{DataType::F32, {8, 128}});  // axis 1: not whole
  // Split on the 910b (one output, 48 vector cores): three of 16384, two of 12288 (alone).
  std::vector<Input> split(3, Input{DataType::F32, {128, 128}});
  split.push_back({DataType::F32, {96, 128}});
  split.push_back({DataType::F32, {96, 128}});
  uint32_t seed = 470;
  for (const Case& c :
       {Case{{0, -1}, mixed}, Case{{0}, four}, Case{{1}, columns}, Case{{0, 1}, split}}) {
    const int64_t n = static_cast<int64_t>(c.inputs.size());
    for (bool keep : {false, true}) {
      INFO("N = " << n << " axis " << compiler::shape_str(c.axes) << (keep ? " keep_dims" : ""));
      std::vector<HostTensor> xs;
      std::vector<compiler::TensorDesc> descs;
      for (const Input& in : c.inputs) {
        xs.push_back(random_tensor(in.dt, in.shape, -3, 3, seed++));
        descs.push_back(xs.back().desc);
      }
      auto multi = compiler::compile(
          make_op("SquareSumV1", descs, {{"axis", c.axes}, {"keep_dims", keep}, {"N", n}}), cfg);
      const RunResult all = run_compiled(test_sim(), multi, xs);
      REQUIRE(all.outputs.size() == static_cast<size_t>(n));
      // The launches expected: per element count the inputs that share rows, those split into
      // parts (f32, reduced whole), each with their own launch count.
      std::map<int64_t, std::vector<size_t>> rows, parts;
      size_t want_launches = 0;
      for (int64_t i = 0; i < n; ++i) {
        const HostTensor& x = xs[static_cast<size_t>(i)];
        auto single = compiler::compile(
            make_op("SquareSumV1", {x.desc}, {{"axis", c.axes}, {"keep_dims", keep}}), cfg);
        const RunResult alone = run_compiled(test_sim(), single, {x});
        const int64_t r = x.desc.num_elements();
        const bool whole = c.axes != V{1};
        if (x.desc.dtype == DataType::F32 && whole && r % 8 == 0 && r < 8192)
          rows[r].push_back(single.launches.size());
        else if (x.desc.dtype == DataType::F32 && whole && single.launches.size() == 2)
          parts[r].push_back(single.launches.size());
        else
          want_launches += single.launches.size();
        INFO("input " << i << " " << x.desc.str());
        CHECK(all.outputs[static_cast<size_t>(i)].desc == alone.outputs[0].desc);
        CHECK(all.outputs[static_cast<size_t>(i)].values == alone.outputs[0].values);
      }
      for (const auto& [r, own] : rows) {
        const size_t k = own.size(), copies = (k + 127) / 128;
        want_launches += k >= 4 ? 2 * copies + 1 : k * own[0];
      }
      for (const auto& [r, own] : parts) {
        const size_t k = own.size(), copies = (k + 127) / 128;
        want_launches += k >= 3 ? k + 1 + copies : 2 * k;
      }
      CHECK(multi.launches.size() == want_launches);
    }
  }
  CHECK_THROWS_WITH(compiler::compile(make_op("SquareSumV1", {{DataType::F32, {1024}}},
                                              {{"axis", V{0}}, {"N", int64_t{2}}}),
                                      cfg),
                    Catch::Contains("attribute N = 2 but 1 inputs"));
  CHECK_THROWS_WITH(
      compiler::compile(make_op("SquareSumV1", {{DataType::F32, {16}}, {DataType::S32, {16}}},
                                {{"axis", V{0}}, {"N", int64_t{2}}}),
                        cfg),
      Catch::Contains("input 1: ") && Catch::Contains("dtype s32 is not supported"));
}

TEST_CASE("ArgMax and ArgMin: first index, s32 and s64 outputs") {
  uint32_t seed = 300;
  check_arg("ArgMax", DataType::F32, {37, 10}, 1, DataType::S32, seed++);
  check_arg("ArgMin", DataType::F16, {10, 37}, 0, DataType::S64, seed++);
  check_arg("ArgMax", DataType::BF16, {4, 33, 5}, 1, DataType::S32, seed++);
  check_arg("ArgMin", DataType::S32, {6, 200}, -1, DataType::S32, seed++);
  check_arg("ArgMax", DataType::F32, {3, 5000}, 1, DataType::S64, seed++, 50);
  check_arg("ArgMax", DataType::F32, {50000}, 0, DataType::S32, seed++, 1000);
  check_arg("ArgMin", DataType::F16, {20000, 2}, 0, DataType::S32, seed++, 100);
  check_arg("ArgMax", DataType::F32, {5, 1, 3}, 1, DataType::S64, seed++);  // size-1 axis: zeros
  check_arg("ArgMin", DataType::F32, {32, 9000}, 1, DataType::S32, seed++, 300);  // streamed
  check_arg("ArgMax", DataType::F16, {2, 2}, 0, DataType::S64, seed++);
}

TEST_CASE("NaN: Max/Min propagate it, ArgMax/ArgMin ignore it (all-NaN rows give 0)") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t axis : {0, 1}) {
    // rows (axis 1) and columns (axis 0) kernels; row / column 2 is all NaN, 5 has one NaN.
    HostTensor x = random_tensor(DataType::F32, {9, 9}, -8, 8, 77);
    for (int64_t j = 0; j < 9; ++j) {
      x.values[static_cast<size_t>(axis ? 2 * 9 + j : j * 9 + 2)] = nan;
      if (j == 4) x.values[static_cast<size_t>(axis ? 5 * 9 + j : j * 9 + 5)] = nan;
    }
    for (const char* op : {"Max", "Min"}) {
      INFO(op << " axis " << axis);
      auto k = compile_reduce(op, x.desc, {axis}, false);
      RunResult r = run_compiled(test_sim(), k, {x});
      for (int64_t i = 0; i < 9; ++i) {
        double want = op[1] == 'a' ? -1e300 : 1e300;
        for (int64_t j = 0; j < 9; ++j) {
          double v = x.values[static_cast<size_t>(axis ? i * 9 + j : j * 9 + i)];
          want = std::isnan(v) || std::isnan(want) ? nan
                 : op[1] == 'a'                    ? std::max(want, v)
                                                   : std::min(want, v);
        }
        const double got = r.outputs[0].values[static_cast<size_t>(i)];
        CHECK((std::isnan(want) ? std::isnan(got) : got == want));
      }
    }
    for (const char* op : {"ArgMax", "ArgMin"}) {
      INFO(op << " axis " << axis);
      auto k = compiler::compile(
          make_op(op, {x.desc}, {{"axis", axis}, {"output_type", std::string("s32")}}),
          test_sim().config());
      RunResult r = run_compiled(test_sim(), k, {x});
      for (int64_t i = 0; i < 9; ++i) {
        int64_t best = -1;
        for (int64_t j = 0; j < 9; ++j) {
          double v = x.values[static_cast<size_t>(axis ? i * 9 + j : j * 9 + i)];
          if (std::isnan(v)) continue;
          double b = best < 0 ? 0 : x.values[static_cast<size_t>(axis ? i * 9 + best : best * 9 + i)];
          if (best < 0 || (op[3] == 'M' && op[4] == 'a' ? v > b : v < b)) best = j;
        }
        CHECK(r.outputs[0].values[static_cast<size_t>(i)] == static_cast<double>(std::max<int64_t>(best, 0)));
      }
    }
  }
}

TEST_CASE("duplicate and negative axes") {
  check_reduce("Sum", DataType::F32, {4, 6, 5}, {1, -2, 2}, false, 400);
  check_reduce("Max", DataType::F16, {3, 4}, {-1, -2}, true, 401);
}
