// FusedBatchNormV3 (training, inference, exponential averaging) and FusedBatchNormGradV3
// (training, inference) compiled for the tiny chip and run on the chip model, against the
// formulas of TF's CPU kernels evaluated here in double from the exact inputs.
//
// Tolerances (e = 2^-24, R pixels, K = R + 16 covering the f32 additions of the per-channel
// sums: R lane-wise additions, the pairwise fold and the blocks' partials):
//   mean m = sum(x) * (1/R): dm = K e sum|x| / R + 2 e |m| (the rounded 1/R and product);
//   variance v = sum((x - m')^2) / R: dv = (K + 4) e v + 2 |dm| sum|x - m| / R
//     ((x - m')^2 with m' off by dm, each square and difference rounded);
//   a = rsqrt(v + eps) * scale: relative error ea = dv / (2 (v + eps)) + 3 e;
//   y = (x - m) a + offset: dy = |x - m| |a| ea + |a| dm + 4 e (|x - m| |a| + |offset|),
//     plus half an ulp of T;
//   gradients: Sdy = sum dy and Sdyx = sum dy (x - m) off by K e sum|dy| and
//     (K + 2) e sum|dy (x - m)|, r = rsqrt(v + eps) by 2 e r, and x_backprop
//     = c1 ((dy - mdy) - (x - m) c2) by the propagated errors of mdy, c1, c2 plus 4 e of each
//     term, plus half an ulp of T.
// Every bound is doubled for slack.
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

double half_ulp(DataType t) {
  switch (t) {
    case DataType::F16: return std::ldexp(1.0, -11);
    case DataType::BF16: return std::ldexp(1.0, -8);
    default: return kE;
  }
}

struct Stats {
  std::vector<double> m, v, dm, dv, sum_abs_xm;
};

// Batch statistics of x [R, C] with their error bounds (file comment).
Stats batch_stats(const HostTensor& x, int64_t r, int64_t c) {
  Stats s;
  const double k = static_cast<double>(r + 16);
  for (int64_t j = 0; j < c; ++j) {
    double sum = 0, sabs = 0;
    for (int64_t i = 0; i < r; ++i) {
      sum += x.values[static_cast<size_t>(i * c + j)];
      sabs += std::fabs(x.values[static_cast<size_t>(i * c + j)]);
    }
    const double m = sum / static_cast<double>(r);
    double sq = 0, sxm = 0;
    for (int64_t i = 0; i < r; ++i) {
      const double d = x.values[static_cast<size_t>(i * c + j)] - m;
      sq += d * d;
      sxm += std::fabs(d);
    }
    const double v = sq / static_cast<double>(r);
    const double dm = k * kE * sabs / static_cast<double>(r) + 2 * kE * std::fabs(m);
    s.m.push_back(m);
    s.v.push_back(v);
    s.dm.push_back(dm);
    s.dv.push_back((k + 4) * kE * v + 2 * dm * sxm / static_cast<double>(r));
    s.sum_abs_xm.push_back(sxm);
  }
  return s;
}

struct BnCase {
  DataType dt;
  std::vector<int64_t> shape;  // NHWC
  bool training;
  double factor = 1.0;
  double eps = 0.001;
};

void check_forward(const BnCase& bc, uint32_t seed) {
  const int64_t c = bc.shape[3], r = bc.shape[0] * bc.shape[1] * bc.shape[2];
  INFO("FusedBatchNormV3 " << compiler::data_type_name(bc.dt) << " " << compiler::shape_str(bc.shape)
                           << (bc.training ? " training" : " inference") << " factor "
                           << bc.factor);
  HostTensor x = random_tensor(bc.dt, bc.shape, -2, 3, seed);
  HostTensor scale = random_tensor(DataType::F32, {c}, 0.5, 2, seed + 1);
  HostTensor offset = random_tensor(DataType::F32, {c}, -1, 1, seed + 2);
  HostTensor mean = random_tensor(DataType::F32, {c}, -0.5, 0.5, seed + 3);
  HostTensor var = random_tensor(DataType::F32, {c}, 0.5, 2, seed + 4);
  auto op = make_op("FusedBatchNormV3", {x.desc, scale.desc, offset.desc, mean.desc, var.desc},
                    {{"epsilon", bc.eps}, {"is_training", bc.training},
                     {"exponential_avg_factor", bc.factor},
                     {"data_format", std::string("NHWC")}});
  auto k = compiler::compile(op, test_sim().config());
  for (const auto& l : k.launches) UNSCOPED_INFO(l.summary);
  REQUIRE(k.outputs.size() == 6);
  CHECK(k.outputs[5] == (TensorDesc{DataType::F32, {}}));
  RunResult res = run_compiled(test_sim(), k, {x, scale, offset, mean, var});
  Stats s;
  if (bc.training) {
    s = batch_stats(x, r, c);
  } else {
    s.m = mean.values;
    s.v = var.values;
    s.dm.assign(static_cast<size_t>(c), 0);
    s.dv.assign(static_cast<size_t>(c), 0);
  }
  std::vector<double> y(x.values.size()), ty(x.values.size());
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) {
      const size_t q = static_cast<size_t>(i * c + j), jj = static_cast<size_t>(j);
      const double a = scale.values[jj] / std::sqrt(s.v[jj] + bc.eps);
      const double ea = s.dv[jj] / (2 * (s.v[jj] + bc.eps)) + 3 * kE;
      const double xm = x.values[q] - s.m[jj];
      y[q] = round_to(bc.dt, xm * a + offset.values[jj]);
      ty[q] = std::fabs(xm * a) * ea + std::fabs(a) * s.dm[jj] +
              4 * kE * (std::fabs(xm * a) + std::fabs(offset.values[jj])) +
              half_ulp(bc.dt) * std::fabs(y[q]);
    }
  check_within_bounds(res.outputs[0].values, y, ty, "y");
  std::vector<double> want_mean = s.m, want_var = s.v, tm = s.dm, tv = s.dv;
  if (bc.training) {
    const double adjust = static_cast<double>(r) / static_cast<double>(std::max<int64_t>(r - 1, 1));
    for (size_t j = 0; j < want_var.size(); ++j) {
      want_var[j] *= adjust;
      tv[j] = tv[j] * adjust + 2 * kE * want_var[j];
    }
    if (bc.factor != 1.0)
      for (size_t j = 0; j < want_var.size(); ++j) {
        want_mean[j] = (1 - bc.factor) * mean.values[j] + bc.factor * want_mean[j];
        want_var[j] = (1 - bc.factor) * var.values[j] + bc.factor * want_var[j];
        tm[j] += 4 * kE * (std::fabs(mean.values[j]) + std::fabs(s.m[j]));
        tv[j] += 4 * kE * (std::fabs(var.values[j]) + std::fabs(want_var[j]));
      }
  }
  check_within_bounds(res.outputs[1].values, want_mean, tm, "batch_mean");
  check_within_bounds(res.outputs[2].values, want_var, tv, "batch_variance");
  check_within_bounds(res.outputs[3].values, s.m, s.dm, "reserve_space_1");
  check_within_bounds(res.outputs[4].values, s.v, s.dv, "reserve_space_2");
  CHECK(res.outputs[5].values == std::vector<double>{0.0});
}

void check_grad(const BnCase& bc, uint32_t seed) {
  const int64_t c = bc.shape[3], r = bc.shape[0] * bc.shape[1] * bc.shape[2];
  INFO("FusedBatchNormGradV3 " << compiler::data_type_name(bc.dt) << " " << compiler::shape_str(bc.shape)
                               << (bc.training ? " training" : " inference"));
  HostTensor dy = random_tensor(bc.dt, bc.shape, -1, 1, seed);
  HostTensor x = random_tensor(bc.dt, bc.shape, -2, 3, seed + 1);
  HostTensor scale = random_tensor(DataType::F32, {c}, 0.5, 2, seed + 2);
  HostTensor mean = random_tensor(DataType::F32, {c}, 0, 1, seed + 3);
  HostTensor var = random_tensor(DataType::F32, {c}, 0.5, 2, seed + 4);
  HostTensor r3{TensorDesc{DataType::F32, {}}, {0.0}};
  auto op = make_op("FusedBatchNormGradV3", {dy.desc, x.desc, scale.desc, mean.desc, var.desc,
                                             r3.desc},
                    {{"epsilon", bc.eps}, {"is_training", bc.training},
                     {"data_format", std::string("NHWC")}});
  auto k = compiler::compile(op, test_sim().config());
  for (const auto& l : k.launches) UNSCOPED_INFO(l.summary);
  REQUIRE(k.outputs.size() == 5);
  CHECK(k.outputs[3] == (TensorDesc{DataType::F32, {0}}));
  RunResult res = run_compiled(test_sim(), k, {dy, x, scale, mean, var, r3});
  const double kk = static_cast<double>(r + 16);
  std::vector<double> dx(x.values.size()), tdx(x.values.size()), sb(static_cast<size_t>(c)),
      tsb(static_cast<size_t>(c)), ob(static_cast<size_t>(c)), tob(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) {
    const size_t jj = static_cast<size_t>(j);
    double sdy = 0, sdyx = 0, adx = 0, adyx = 0;
    for (int64_t i = 0; i < r; ++i) {
      const size_t q = static_cast<size_t>(i * c + j);
      sdy += dy.values[q];
      adx += std::fabs(dy.values[q]);
      sdyx += dy.values[q] * (x.values[q] - mean.values[jj]);
      adyx += std::fabs(dy.values[q] * (x.values[q] - mean.values[jj]));
    }
    const double rs = 1 / std::sqrt(var.values[jj] + bc.eps);
    const double dsdy = kk * kE * adx, dsdyx = (kk + 2) * kE * adyx;
    sb[jj] = sdyx * rs;
    tsb[jj] = dsdyx * rs + 4 * kE * std::fabs(sdyx) * rs;
    ob[jj] = sdy;
    tob[jj] = dsdy;
    const double c1 = scale.values[jj] * rs, dc1 = 4 * kE * std::fabs(c1);
    const double mdy = bc.training ? sdy / static_cast<double>(r) : 0;
    const double dmdy = bc.training ? dsdy / static_cast<double>(r) + 2 * kE * std::fabs(mdy) : 0;
    const double c2 = bc.training ? rs * rs * sdyx / static_cast<double>(r) : 0;
    const double dc2 = bc.training ? rs * rs * dsdyx / static_cast<double>(r) +
                                         8 * kE * std::fabs(c2)
                                   : 0;
    for (int64_t i = 0; i < r; ++i) {
      const size_t q = static_cast<size_t>(i * c + j);
      const double xm = x.values[q] - mean.values[jj];
      const double inner = (dy.values[q] - mdy) - xm * c2;
      dx[q] = round_to(bc.dt, c1 * inner);
      tdx[q] = std::fabs(c1) * (dmdy + std::fabs(xm) * dc2 +
                                4 * kE * (std::fabs(dy.values[q]) + std::fabs(mdy) +
                                          std::fabs(xm * c2))) +
               dc1 * std::fabs(inner) + half_ulp(bc.dt) * std::fabs(dx[q]);
    }
  }
  check_within_bounds(res.outputs[0].values, dx, tdx, "x_backprop");
  check_within_bounds(res.outputs[1].values, sb, tsb, "scale_backprop");
  check_within_bounds(res.outputs[2].values, ob, tob, "offset_backprop");
}

}  // namespace

TEST_CASE("FusedBatchNormV3 training: batch statistics, channels not multiples of 8") {
  check_forward({DataType::F32, {2, 3, 5, 7}, true}, 1);
  check_forward({DataType::F32, {3, 4, 3, 16}, true}, 2);
  check_forward({DataType::F16, {2, 5, 3, 12}, true}, 3);
  check_forward({DataType::BF16, {1, 6, 7, 32}, true}, 4);
  check_forward({DataType::F32, {1, 1, 1, 3}, true}, 5);  // one pixel: Bessel factor 1
  // 16-bit pixels of 24 and 40 channels (not whole 32-byte blocks) summed in place in rows of
  // two pixels, an odd pixel count's last pixel a partial row (ops/channel.h)
  check_forward({DataType::F16, {2, 5, 3, 24}, true}, 6);
  check_forward({DataType::F16, {1, 5, 3, 40}, true}, 7);
  check_forward({DataType::BF16, {1, 3, 3, 8}, true}, 8);
}

TEST_CASE("FusedBatchNormV3 inference and exponential averaging") {
  check_forward({DataType::F32, {2, 4, 3, 9}, false}, 10);
  check_forward({DataType::F16, {1, 3, 3, 16}, false}, 11);
  check_forward({DataType::F32, {2, 3, 3, 5}, true, 0.3}, 12);
}

TEST_CASE("FusedBatchNormGradV3 training and inference") {
  check_grad({DataType::F32, {2, 3, 5, 7}, true}, 20);
  check_grad({DataType::F16, {2, 4, 3, 16}, true}, 21);
  check_grad({DataType::BF16, {1, 5, 5, 10}, true}, 22);
  check_grad({DataType::F32, {3, 2, 4, 9}, false}, 23);
  // (pixels of 24 and 40 channels read in place, as in the forward test)
  check_grad({DataType::F16, {2, 4, 3, 24}, true}, 24);
  check_grad({DataType::F16, {1, 3, 5, 40}, true}, 25);
  check_grad({DataType::BF16, {1, 3, 3, 8}, true}, 26);
  check_grad({DataType::F16, {1, 3, 5, 24}, false}, 27);
}

TEST_CASE("FusedBatchNorm: empty batch, errors") {
  HostTensor x{TensorDesc{DataType::F32, {0, 3, 3, 4}}, {}};
  HostTensor v = random_tensor(DataType::F32, {4}, 0.5, 1, 30);
  auto k = compiler::compile(make_op("FusedBatchNormV3", {x.desc, v.desc, v.desc, v.desc, v.desc},
                                     {{"is_training", true}}),
                             test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {x, v, v, v, v});
  for (double m : r.outputs[1].values) CHECK(std::isnan(m));
  TensorDesc bad{DataType::F32, {1, 2, 2, 4}};
  CHECK_THROWS_WITH(compiler::compile(make_op("FusedBatchNormV3",
                                              {bad, v.desc, v.desc, v.desc, v.desc},
                                              {{"data_format", std::string("NCHW")}}),
                                      test_sim().config()),
                    Catch::Contains("NCHW"));
  CHECK_THROWS_WITH(compiler::compile(make_op("FusedBatchNormV3",
                                              {bad, TensorDesc{DataType::F32, {3}}, v.desc,
                                               v.desc, v.desc}),
                                      test_sim().config()),
                    Catch::Contains("f32[4]"));
}
