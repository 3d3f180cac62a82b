// LayerNorm in training (ops/norm.cpp; the graph fusion's rewrite 12b): LayerNormV3 (y and each
// row's mean and rstd), LayerNormXBackpropV2 (dx and res_for_gamma) and
// LayerNormBetaGammaBackpropV2 (the parameters' gradients) compiled for the test chip and run on
// the chip model, against their formulas evaluated here in double from the exact inputs:
//
//   mean = sum(x) / H   var = sum((x - mean)^2) / H   rstd = 1 / sqrt(var + eps)
//   y = (x - mean) * rstd * gamma + beta
//   xhat = (x - mean) * rstd   g = dy * gamma
//   dx = rstd * (g - sum(g) / H - xhat * sum(g * xhat) / H)   res_for_gamma = xhat
//   pd_gamma = sum over rows of dy * res_for_gamma   pd_beta = sum over rows of dy
//
// Tolerances (e = 2^-24, K = H + 16 covering the f32 additions of a row sum: H lane-wise
// additions and the fold; for the column sums K = rows + 16): every value is a few f32 steps
// away from f32 sums of K terms, so |error| <= c K e (the sum of the terms' magnitudes) with a
// small c: 4 for the statistics, 8 for y and dx (the statistics' errors carried through), each
// doubled by check_within_bounds. f16 x / dy are exact f16 values, computed the same way in f32,
// and y / dx are rounded once more to f16: + 2^-11 |value| (bf16: 2^-8). f32 gamma and beta
// beside an f16 / bf16 x are read exactly as f32.
#include <catch2/catch.hpp>

#include <cmath>
#include <optional>

#include "adapter/compiler/compiler.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

constexpr double kE = 1.0 / (1 << 24);
constexpr double kH = 1.0 / (1 << 11);  // f16's unit roundoff
constexpr double kB = 1.0 / (1 << 8);   // bf16's
constexpr double kEps = 1e-7;           // BERT's LayerNormalization epsilon (models/bert.py)

// The rows' statistics in double.
struct Stats {
  std::vector<double> mean, rstd, abs_mean, sq_bound;
};

Stats row_stats(const HostTensor& x, int64_t rows, int64_t h) {
  Stats s;
  for (int64_t i = 0; i < rows; ++i) {
    double sum = 0, abs_sum = 0;
    for (int64_t j = 0; j < h; ++j) {
      sum += x.values[static_cast<size_t>(i * h + j)];
      abs_sum += std::fabs(x.values[static_cast<size_t>(i * h + j)]);
    }
    const double m = sum / static_cast<double>(h);
    double sq = 0;
    for (int64_t j = 0; j < h; ++j) {
      const double d = x.values[static_cast<size_t>(i * h + j)] - m;
      sq += d * d;
    }
    s.mean.push_back(m);
    s.rstd.push_back(1 / std::sqrt(sq / static_cast<double>(h) + kEps));
    s.abs_mean.push_back(abs_sum / static_cast<double>(h));
    s.sq_bound.push_back(sq / static_cast<double>(h));
  }
  return s;
}

std::vector<int64_t> stats_shape(std::vector<int64_t> shape) {
  shape.back() = 1;
  return shape;
}

// pdt: gamma's and beta's dtype, dt's or f32 (an f16 x with f32 parameters: allow_mix_precision's
// graph pass); the formulas take their exact values either way.
void check_forward(const std::vector<int64_t>& shape, DataType dt, uint32_t seed,
                   std::optional<DataType> param_dt = std::nullopt) {
  const DataType pdt = param_dt.value_or(dt);
  const int64_t h = shape.back();
  INFO("LayerNormV3 " << compiler::shape_str(shape) << " " << compiler::data_type_name(dt)
                      << ", gamma and beta " << compiler::data_type_name(pdt));
  HostTensor x = random_tensor(dt, shape, -2, 3, seed);
  HostTensor gamma = random_tensor(pdt, {h}, 0.5, 2, seed + 1);
  HostTensor beta = random_tensor(pdt, {h}, -1, 1, seed + 2);
  const int64_t rows = static_cast<int64_t>(x.values.size()) / h;
  RunResult res = run_op("LayerNormV3", {x, gamma, beta}, {{"epsilon", kEps}}, 3);
  REQUIRE(res.outputs[1].desc.shape == stats_shape(shape));
  REQUIRE(res.outputs[2].desc.dtype == DataType::F32);
  const Stats s = row_stats(x, rows, h);
  const double k = static_cast<double>(h + 16);
  std::vector<double> tm(rows), tr(rows), y(x.values.size()), ty(x.values.size());
  for (int64_t i = 0; i < rows; ++i) {
    tm[i] = 4 * k * kE * s.abs_mean[i];
    // The variance's error: the mean's carried through the squares plus the sum's own.
    const double dv = 4 * k * kE * (s.sq_bound[i] + s.abs_mean[i] * s.abs_mean[i]);
    const double er = dv * s.rstd[i] * s.rstd[i] / 2 + 4 * kE;  // relative error of rstd
    tr[i] = er * s.rstd[i];
    for (int64_t j = 0; j < h; ++j) {
      const size_t n = static_cast<size_t>(i * h + j);
      const double xc = (x.values[n] - s.mean[i]) * s.rstd[i] * gamma.values[j];
      y[n] = xc + beta.values[j];
      ty[n] = std::fabs(xc) * er + tm[i] * s.rstd[i] * std::fabs(gamma.values[j]) +
              8 * kE * (std::fabs(xc) + std::fabs(beta.values[j]));
      if (dt != DataType::F32) ty[n] += (dt == DataType::BF16 ? kB : kH) * std::fabs(y[n]);
    }
  }
  check_within_bounds(res.outputs[0].values, y, ty, "y");
  check_within_bounds(res.outputs[1].values, s.mean, tm, "mean");
  check_within_bounds(res.outputs[2].values, s.rstd, tr, "rstd");
}

// input_at_memory_end: run_compiled's (2: rstd, 3: mean).
void check_backward(const std::vector<int64_t>& shape, DataType dt, uint32_t seed,
                    std::optional<DataType> param_dt = std::nullopt, int input_at_memory_end = -1) {
  const DataType pdt = param_dt.value_or(dt);
  const int64_t h = shape.back();
  INFO("LayerNormXBackpropV2 / BetaGammaBackpropV2 " << compiler::shape_str(shape) << " "
                                                     << compiler::data_type_name(dt) << ", gamma "
                                                     << compiler::data_type_name(pdt));
  HostTensor x = random_tensor(dt, shape, -2, 3, seed);
  HostTensor dy = random_tensor(dt, shape, -1, 1, seed + 1);
  HostTensor gamma = random_tensor(pdt, {h}, 0.5, 2, seed + 2);
  const int64_t rows = static_cast<int64_t>(x.values.size()) / h;
  // The statistics as LayerNormV3 hands them over: f32.
  const Stats s = row_stats(x, rows, h);
  HostTensor mean{TensorDesc{DataType::F32, stats_shape(shape)}, s.mean};
  HostTensor rstd{TensorDesc{DataType::F32, stats_shape(shape)}, s.rstd};
  for (double& v : mean.values) v = round_to(DataType::F32, v);
  for (double& v : rstd.values) v = round_to(DataType::F32, v);
  RunResult res =
      run_op("LayerNormXBackpropV2", {dy, x, rstd, mean, gamma}, {}, 2, input_at_memory_end);
  REQUIRE(res.outputs[1].desc.dtype == DataType::F32);
  const double k = static_cast<double>(h + 16);
  std::vector<double> dx(x.values.size()), tdx(x.values.size()), xhat(x.values.size()),
      txhat(x.values.size());
  for (int64_t i = 0; i < rows; ++i) {
    const double r = rstd.values[i], m = mean.values[i];
    double s1 = 0, s2 = 0, a1 = 0, a2 = 0;
    for (int64_t j = 0; j < h; ++j) {
      const size_t n = static_cast<size_t>(i * h + j);
      xhat[n] = (x.values[n] - m) * r;
      txhat[n] = 2 * kE * std::fabs(xhat[n]) + kE * std::fabs(m * r);
      const double g = dy.values[n] * gamma.values[j];
      s1 += g;
      s2 += g * xhat[n];
      a1 += std::fabs(g);
      a2 += std::fabs(g * xhat[n]);
    }
    s1 /= static_cast<double>(h);
    s2 /= static_cast<double>(h);
    const double t1 = 4 * k * kE * a1 / static_cast<double>(h);
    const double t2 = 4 * k * kE * a2 / static_cast<double>(h);
    for (int64_t j = 0; j < h; ++j) {
      const size_t n = static_cast<size_t>(i * h + j);
      const double g = dy.values[n] * gamma.values[j];
      dx[n] = r * (g - s1 - xhat[n] * s2);
      tdx[n] = r * (t1 + std::fabs(xhat[n]) * t2 + std::fabs(s2) * txhat[n] * 2 +
                    8 * kE * (std::fabs(g) + std::fabs(s1) + std::fabs(xhat[n] * s2)));
      if (dt != DataType::F32) tdx[n] += kH * std::fabs(dx[n]);
    }
  }
  check_within_bounds(res.outputs[0].values, dx, tdx, "dx");
  check_within_bounds(res.outputs[1].values, xhat, txhat, "res_for_gamma");

  // The parameters' gradients from the kernel's own res_for_gamma (f32, as the graph hands it).
  HostTensor res_for_gamma{TensorDesc{DataType::F32, shape}, res.outputs[1].values};
  RunResult pd = run_op("LayerNormBetaGammaBackpropV2", {dy, res_for_gamma}, {}, 2);
  REQUIRE(pd.outputs[0].desc.shape == std::vector<int64_t>{h});
  std::vector<double> dg(h), db(h), tdg(h), tdb(h);
  const double kr = static_cast<double>(rows + 16);
  for (int64_t j = 0; j < h; ++j) {
    double ag = 0, ab = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const size_t n = static_cast<size_t>(i * h + j);
      dg[j] += dy.values[n] * res_for_gamma.values[n];
      db[j] += dy.values[n];
      ag += std::fabs(dy.values[n] * res_for_gamma.values[n]);
      ab += std::fabs(dy.values[n]);
    }
    tdg[j] = (kr + 1) * kE * ag;
    tdb[j] = kr * kE * ab;
  }
  check_within_bounds(pd.outputs[0].values, dg, tdg, "pd_gamma");
  check_within_bounds(pd.outputs[1].values, db, tdb, "pd_beta");
}

}  // namespace

TEST_CASE("LayerNormV3: y, the rows' mean and rstd in one launch") {
  check_forward({3, 5, 64}, DataType::F32, 1);  // 15 rows: a group's last block partly filled
  check_forward({40, 128}, DataType::F32, 2);
  check_forward({300, 48}, DataType::F32, 3);  // rows over every vector core
  check_forward({17, 32}, DataType::F16, 4);
  check_forward({17, 32}, DataType::F16, 5, DataType::F32);  // f16 x, f32 gamma and beta
  check_forward({40, 128}, DataType::BF16, 6, DataType::F32);
  // BERT's rows (f16, f32 parameters): fewer rows per group than 64-lane spans per row (the
  // per-row instructions), span sums, the row values widened one instruction per 8 rows.
  check_forward({64, 1024}, DataType::F16, 7, DataType::F32);
  // Short rows, many per group: the lane slots, widen_row_groups.
  check_forward({2048, 128}, DataType::F32, 8);
  auto k =
      compiler::compile(make_op("LayerNormV3",
                                {TensorDesc{DataType::F32, {8, 64}},
                                 TensorDesc{DataType::F32, {64}}, TensorDesc{DataType::F32, {64}}},
                                {}),
                        test_sim().config());
  CHECK(k.launches.size() == 1);
}

// Rows too long for 8 in the UB (f32 and f16 x, f32 parameters): f(shape, dtype) for each,
// after checking that the launch of `op` (x, then f32 [H] or row statistics) groups fewer rows
// than a 32-byte block of mean / rstd holds (8).
template <typename F>
void for_each_long_row_case(const std::string& op, F&& f) {
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{24, 2048}, {37, 2048}, {13, 4096}, {9, 2048}}) {
    for (DataType dt : {DataType::F32, DataType::F16}) {
      INFO(op << " " << compiler::shape_str(shape) << " " << compiler::data_type_name(dt));
      const TensorDesc x{dt, shape}, p{DataType::F32, {shape.back()}},
          stats{DataType::F32, stats_shape(shape)};
      const std::vector<TensorDesc> in = op == "LayerNormV3"
                                             ? std::vector<TensorDesc>{x, p, p}
                                             : std::vector<TensorDesc>{x, x, stats, stats, p};
      auto k = compiler::compile(make_op(op, in, {}), test_sim().config());
      const std::string& s = k.launches.at(0).summary;
      CHECK(std::stoll(s.substr(s.rfind("groups of ") + 10)) % 8 != 0);
      f(shape, dt);
    }
  }
}

// Rows too long for 8 in the UB: groups of fewer rows than a 32-byte block of mean / rstd
// holds (8), so the statistics are gathered across groups into whole blocks before they are
// stored; rows that do not divide the blocks (the last block range, and the tensor, end inside
// a block). run_compiled's guards check nothing is written past the outputs' buffers; every row's
// mean and rstd is checked (a block stored from a group's first row used to leave rows of the
// next block range, another core's, and of the tensor's end wrong).
TEST_CASE("LayerNormV3: mean and rstd where a group holds fewer than 8 rows") {
  uint32_t seed = 30;
  for_each_long_row_case("LayerNormV3", [&](const std::vector<int64_t>& shape, DataType dt) {
    check_forward(shape, dt, seed++, DataType::F32);
  });
}

TEST_CASE("LayerNormXBackpropV2 and LayerNormBetaGammaBackpropV2 against the formulas") {
  check_backward({3, 5, 64}, DataType::F32, 11);
  check_backward({40, 128}, DataType::F32, 12);
  check_backward({300, 48}, DataType::F32, 13);
  check_backward({17, 32}, DataType::F16, 14);
  check_backward({17, 32}, DataType::F16, 16, DataType::F32);  // f16 dy and x, f32 gamma
  // BERT-Large's rows: groups of fewer than 8 rows fit the UB (replicate_rows fills whole
  // groups of 8 row blocks), several groups per core.
  check_backward({256, 1024}, DataType::F32, 15);
  check_backward({64, 1024}, DataType::F16, 17, DataType::F32);
  check_backward({2048, 128}, DataType::F32, 18);
}

// Rows too long for 8 in the UB: groups of fewer rows than a 32-byte block of mean / rstd
// holds (8). Each group reads its rows' statistics in whole blocks from its 8-row block's first
// row, so nothing past the tensor's last 32-byte granule is read: rstd (input 2), then mean
// (input 3) placed where the device memory ends, so that such a read faults (read from the
// group's first row, the blocks passed the tensor's end by up to 28 bytes).
TEST_CASE("LayerNormXBackpropV2: groups under 8 rows read nothing past mean and rstd") {
  uint32_t seed = 50;
  for_each_long_row_case("LayerNormXBackpropV2",
                         [&](const std::vector<int64_t>& shape, DataType dt) {
                           for (int at_end : {2, 3})
                             check_backward(shape, dt, seed++, DataType::F32, at_end);
                         });
}

TEST_CASE("LayerNorm training kernels: bad shapes are errors naming the input") {
  const ChipConfig& cfg = test_sim().config();
  const TensorDesc x{DataType::F32, {8, 64}}, h{DataType::F32, {64}};
  CHECK_THROWS_WITH(
      compiler::compile(make_op("LayerNormV3", {x, TensorDesc{DataType::F32, {32}}, h}, {}), cfg),
      Catch::Contains("gamma must be [64]"));
  // gamma and beta: x's dtype or f32, one dtype.
  const TensorDesc x16{DataType::F16, {8, 64}}, h16{DataType::F16, {64}};
  CHECK_THROWS_WITH(compiler::compile(make_op("LayerNormV3", {x16, h, h16}, {}), cfg),
                    Catch::Contains("beta is f16, gamma f32"));
  CHECK_THROWS_WITH(
      compiler::compile(
          make_op("LayerNormV3",
                  {x16, TensorDesc{DataType::BF16, {64}}, TensorDesc{DataType::BF16, {64}}}, {}),
          cfg),
      Catch::Contains("gamma is bf16: x's dtype f16 or f32"));
  CHECK_THROWS_WITH(compiler::compile(make_op("LayerNormXBackpropV2",
                                              {x, x, TensorDesc{DataType::F32, {7, 1}},
                                               TensorDesc{DataType::F32, {8, 1}}, h},
                                              {}),
                                      cfg),
                    Catch::Contains("rstd must be f32[8,1]"));
  CHECK_THROWS_WITH(compiler::compile(make_op("LayerNormBetaGammaBackpropV2",
                                              {x, TensorDesc{DataType::F16, {8, 64}}}, {}),
                                      cfg),
                    Catch::Contains("res_for_gamma must be f32"));
  CHECK_THROWS_WITH(
      compiler::compile(
          make_op("LayerNormXBackpropV2",
                  {TensorDesc{DataType::F32, {8, 40}}, TensorDesc{DataType::F32, {8, 40}},
                   TensorDesc{DataType::F32, {8, 1}}, TensorDesc{DataType::F32, {8, 1}},
                   TensorDesc{DataType::F32, {40}}},
                  {}),
          cfg),
      Catch::Contains("a multiple of 16"));
}
