// The training batch-norm ops of the graph fusion (BNTrainingReduce, BNTrainingUpdate,
// BNTrainingUpdateGrad, BNTrainingReduceGrad; ops/batchnorm.cpp) compiled for the test chip and
// run on the chip model, against their formulas evaluated here in double from the exact inputs.
//
// Tolerances (e = 2^-24, R pixels, K = R + 16 covering the f32 additions of a per-channel sum:
// R lane-wise additions, the pairwise fold and the blocks' partials), each doubled by check_vec:
//   sums: K e sum|term|;
//   m = sum / R: 2 e |m|; v = square_sum / R - m^2: 4 e (square_sum / R + m^2) (the
//     cancellation of the one-pass variance); a = rsqrt(v + eps) * scale: relative
//     ea = dv / (2 (v + eps)) + 3 e; shift = offset - m a; y = x a + shift:
//     |x a| ea + |m a| (ea + 2 e) + 4 e (|x a| + |shift|);
//   diff_scale = r sum dy (x - m): (K + 2) e r sum|dy (x - m)| + 4 e |diff_scale|;
//   dx = c1 ((dy - mdy) - (x - m) c2), computed as (dy c1 - x kc) + k3 with kc = c1 c2 and
//     k3 = c1 (c2 m - mdy) (x not centred first, as y = x a + shift): with c1, c2 and mdy
//     within 3 e, 5 e and 2 e, kc within 9 e and k3 within 12 e |c1| (|c2 m| + |mdy|), the
//     products 4 e |c1 dy| and 10 e |c1 c2 x|, the difference and the sum e each:
//     12 e |c1| (|dy| + |x c2| + |m c2| + |mdy|) + 2 e |dx|.
// With relu (the ReLU's gradient folded in), dy is replaced by dy * (x a + shift > 0), the
// forward pass's a = scale / sqrt(v + eps) and shift = offset - m a; x is drawn so that no
// pre-activation lies within 1e-3 of 0 (the mask is then the same in f32 and in double); the
// mask's edges (f16: y rounded to f16 is 0 up to 2^-25) are checked bit for bit against the
// unfused chain (check_relu_fold_bits).
// With x (and dy) f16 (allow_mix_precision's graph pass: x / dy f16, statistics f32) the inputs
// are exact f16 values, every sum and statistic is the same f32 computation, and y / dx are
// rounded once more to f16: + 2^-11 |y| (round to nearest).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/channel.h"
#include "adapter/compiler/ops/conv.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

constexpr double kE = 1.0 / (1 << 24);
constexpr double kH = 1.0 / (1 << 11);  // f16's unit roundoff
// Half the spacing of f16's subnormals (2^-24 apart): rounding v to f16 errs by at most
// kH |v| where v is normal and by at most kHalfSubnormal where it is not, so by at most
// kH |v| + kHalfSubnormal everywhere.
constexpr double kHalfSubnormal = 1.0 / (1 << 25);

// Element (pixel i, channel j) of an [R, C] tensor.
double at(const HostTensor& t, int64_t i, int64_t j, int64_t c) {
  return t.values[static_cast<size_t>(i * c + j)];
}

HostTensor vec(std::vector<double> v) {
  return HostTensor{TensorDesc{DataType::F32, {static_cast<int64_t>(v.size())}}, std::move(v)};
}

// The chip the kernels are compiled for (null: the test chip); they always run on the test chip.
const ChipConfig* g_compile_for = nullptr;

RunResult run(const std::string& type, const std::vector<HostTensor>& in,
              std::map<std::string, compiler::AttrValue> attrs, size_t outputs) {
  std::vector<TensorDesc> descs;
  for (const HostTensor& t : in) descs.push_back(t.desc);
  auto k = compiler::compile(make_op(type, descs, std::move(attrs)),
                             g_compile_for ? *g_compile_for : test_sim().config());
  for (const auto& l : k.launches) UNSCOPED_INFO(l.summary);
  REQUIRE(k.outputs.size() == outputs);
  return run_compiled(test_sim(), k, in);
}

// outputs[first] and outputs[first + 1] of res: the per-channel sum and sum of squares of x
// ([R, c]) within their bounds (the file comment).
void check_channel_sums(const HostTensor& x, int64_t c, const RunResult& res, size_t first) {
  const int64_t r = static_cast<int64_t>(x.values.size()) / c;
  std::vector<double> s(c), sq(c), ts(c), tsq(c);
  const double k = static_cast<double>(r + 16);
  for (int64_t j = 0; j < c; ++j) {
    double sa = 0;
    for (int64_t i = 0; i < r; ++i) {
      const double v = at(x, i, j, c);
      s[j] += v;
      sq[j] += v * v;
      sa += std::fabs(v);
    }
    ts[j] = k * kE * sa;
    tsq[j] = (k + 1) * kE * sq[j];
  }
  check_within_bounds(res.outputs[first].values, s, ts, "sum");
  check_within_bounds(res.outputs[first + 1].values, sq, tsq, "square_sum");
}

void check_reduce(const std::vector<int64_t>& shape, uint32_t seed, DataType dt = DataType::F32) {
  INFO("BNTrainingReduce " << compiler::shape_str(shape) << " " << compiler::data_type_name(dt));
  HostTensor x = random_tensor(dt, shape, -2, 3, seed);
  check_channel_sums(x, shape[3], run("BNTrainingReduce", {x}, {}, 2), 0);
}

// The per-channel sum and sum of squares of x ([R, c]) in double, rounded to f32 as
// BNTrainingReduce hands them over.
std::pair<std::vector<double>, std::vector<double>> rounded_sums(const HostTensor& x, int64_t c) {
  const int64_t r = static_cast<int64_t>(x.values.size()) / c;
  std::vector<double> s(c), sq(c);
  for (int64_t j = 0; j < c; ++j)
    for (int64_t i = 0; i < r; ++i) {
      s[j] += at(x, i, j, c);
      sq[j] += at(x, i, j, c) * at(x, i, j, c);
    }
  for (int64_t j = 0; j < c; ++j) {
    s[j] = round_to(DataType::F32, s[j]);
    sq[j] = round_to(DataType::F32, sq[j]);
  }
  return {s, sq};
}

// With `residual` (attribute R = 1): input 5 a residual res of x's type drawn from [-2, 2], and
// output 0 relu(y + res) (relu: after the add), y and y + res each rounded to T: the bound
// of y in T, widened by the add's rounding u |y + res| (u = e, or 2^-11 and half a subnormal).
void check_update(const std::vector<int64_t>& shape, bool relu, uint32_t seed,
                  DataType dt = DataType::F32, bool residual = false) {
  const int64_t c = shape[3], r = shape[0] * shape[1] * shape[2];
  const double eps = 0.001;
  INFO("BNTrainingUpdate " << compiler::shape_str(shape) << (relu ? " relu " : " ")
                           << compiler::data_type_name(dt) << (residual ? " residual" : ""));
  HostTensor x = random_tensor(dt, shape, -2, 3, seed);
  HostTensor res = random_tensor(dt, shape, -2, 2, seed + 3);
  HostTensor scale = random_tensor(DataType::F32, {c}, 0.5, 2, seed + 1);
  HostTensor offset = random_tensor(DataType::F32, {c}, -1, 1, seed + 2);
  const auto [s, sq] = rounded_sums(x, c);
  std::vector<HostTensor> in = {x, vec(s), vec(sq), scale, offset};
  std::map<std::string, compiler::AttrValue> attrs = {{"epsilon", eps}, {"relu", relu}};
  if (residual) {
    in.push_back(res);
    attrs["R"] = int64_t{1};
  }
  RunResult out = run("BNTrainingUpdate", in, attrs, 3);
  std::vector<double> m(c), v(c), tm(c), tv(c), y(x.values.size()), ty(x.values.size());
  for (int64_t j = 0; j < c; ++j) {
    m[j] = s[j] / static_cast<double>(r);
    v[j] = sq[j] / static_cast<double>(r) - m[j] * m[j];
    tm[j] = 2 * kE * std::fabs(m[j]);
    tv[j] = 4 * kE * (sq[j] / static_cast<double>(r) + m[j] * m[j]);
    const double a = scale.values[j] / std::sqrt(v[j] + eps);
    const double ea = tv[j] / (2 * (v[j] + eps)) + 3 * kE;
    const double shift = offset.values[j] - m[j] * a;
    for (int64_t i = 0; i < r; ++i) {
      const size_t q = static_cast<size_t>(i * c + j);
      const double xa = x.values[q] * a, raw = xa + shift;
      y[q] = relu && !residual ? std::max(raw, 0.0) : raw;
      ty[q] = std::fabs(xa) * ea + std::fabs(m[j] * a) * (ea + 2 * kE) +
              4 * kE * (std::fabs(xa) + std::fabs(shift));
      if (dt == DataType::F16) ty[q] = ty[q] * (1 + kH) + kH * std::fabs(y[q]) + kHalfSubnormal;
      if (residual) {
        const double u = dt == DataType::F16 ? kH : kE, sum = y[q] + res.values[q];
        ty[q] = ty[q] * (1 + u) + u * std::fabs(sum) + (dt == DataType::F16 ? kHalfSubnormal : 0);
        y[q] = relu ? std::max(sum, 0.0) : sum;
      }
    }
  }
  check_within_bounds(out.outputs[0].values, y, ty, "y");
  check_within_bounds(out.outputs[1].values, m, tm, "batch_mean");
  check_within_bounds(out.outputs[2].values, v, tv, "batch_variance");
}

// BNTrainingUpdate with a residual (R = 1, relu) against the unfused graph it replaces,
// BNTrainingUpdate then AddRelu(y, res): the same bits in all three outputs (the add and the
// ReLU are the AddRelu kernel's instructions on y rounded to T). The residual has x's shape, or
// `res_shape` where given (one that broadcasts into x's: the update then an AddRelu launch).
void check_residual_bits(const std::vector<int64_t>& shape, DataType dt, uint32_t seed,
                         const std::vector<int64_t>& res_shape = {}) {
  const int64_t c = shape[3];
  INFO("BNTrainingUpdate residual bits " << compiler::shape_str(shape) << " + "
                                         << compiler::shape_str(res_shape) << " "
                                         << compiler::data_type_name(dt));
  HostTensor x = random_tensor(dt, shape, -2, 3, seed);
  HostTensor res = random_tensor(dt, res_shape.empty() ? shape : res_shape, -2, 2, seed + 1);
  HostTensor scale = random_tensor(DataType::F32, {c}, 0.5, 2, seed + 2);
  HostTensor offset = random_tensor(DataType::F32, {c}, -1, 1, seed + 3);
  const auto [s, sq] = rounded_sums(x, c);
  const std::vector<HostTensor> in = {x, vec(s), vec(sq), scale, offset};
  RunResult plain = run("BNTrainingUpdate", in, {{"epsilon", 0.001}}, 3);
  const HostTensor y{TensorDesc{dt, shape}, plain.outputs[0].values};
  RunResult add_relu = run("AddRelu", {y, res}, {}, 1);
  std::vector<HostTensor> fused_in = in;
  fused_in.push_back(res);
  RunResult fused =
      run("BNTrainingUpdate", fused_in, {{"epsilon", 0.001}, {"relu", true}, {"R", int64_t{1}}}, 3);
  // Both sides of the ReLU occur.
  size_t zeros = 0;
  for (double v : fused.outputs[0].values) zeros += v == 0;
  CHECK(zeros > 0);
  CHECK(zeros < fused.outputs[0].values.size());
  CHECK(fused.outputs[0].values == add_relu.outputs[0].values);
  CHECK(fused.outputs[1].values == plain.outputs[1].values);
  CHECK(fused.outputs[2].values == plain.outputs[2].values);
}

struct GradCase {
  std::vector<int64_t> shape;
  uint32_t seed;
  bool relu = false;
  DataType dt = DataType::F32;  // of dy, x and dx
  double scale_unit = 1;        // scale is drawn from [0.5, 2] * scale_unit
};

void check_grads(const GradCase& gc) {
  const std::vector<int64_t>& shape = gc.shape;
  const int64_t c = shape[3], r = shape[0] * shape[1] * shape[2];
  const double eps = 0.001, k = static_cast<double>(r + 16);
  INFO("BNTrainingUpdateGrad / BNTrainingReduceGrad " << compiler::shape_str(shape) << " "
                                                      << compiler::data_type_name(gc.dt));
  HostTensor dy = random_tensor(gc.dt, shape, -1, 1, gc.seed);
  HostTensor x = random_tensor(gc.dt, shape, -2, 3, gc.seed + 1);
  HostTensor scale =
      random_tensor(DataType::F32, {c}, 0.5 * gc.scale_unit, 2 * gc.scale_unit, gc.seed + 2);
  HostTensor mean = random_tensor(DataType::F32, {c}, 0, 1, gc.seed + 3);
  HostTensor var = random_tensor(DataType::F32, {c}, 0.5, 2, gc.seed + 4);
  HostTensor offset = random_tensor(DataType::F32, {c}, -1, 1, gc.seed + 5);
  const std::map<std::string, compiler::AttrValue> attrs = {{"epsilon", eps}, {"relu", gc.relu}};
  // relu: the gradient arriving at relu(x a + shift) goes back through the ReLU.
  HostTensor g = dy;
  if (gc.relu) {
    for (int64_t j = 0; j < c; ++j) {
      const double a = scale.values[j] / std::sqrt(var.values[j] + eps),
                   shift = offset.values[j] - mean.values[j] * a;
      for (int64_t i = 0; i < r; ++i) {
        const size_t q = static_cast<size_t>(i * c + j);
        if (std::fabs(x.values[q] * a + shift) < 1e-3)
          x.values[q] = round_to(gc.dt, x.values[q] + 0.01);
        if (x.values[q] * a + shift <= 0) g.values[q] = 0;
      }
    }
  }
  const std::vector<HostTensor> fold =
      gc.relu ? std::vector<HostTensor>{scale, offset} : std::vector<HostTensor>{};
  std::vector<HostTensor> in = {dy, x, mean, var};
  in.insert(in.end(), fold.begin(), fold.end());
  RunResult sums = run("BNTrainingUpdateGrad", in, attrs, 2);
  std::vector<double> ds(c), dof(c), tds(c), tdof(c), rs(c);
  for (int64_t j = 0; j < c; ++j) {
    double sdyx = 0, adyx = 0, ady = 0;
    for (int64_t i = 0; i < r; ++i) {
      const double gi = at(g, i, j, c), xm = at(x, i, j, c) - mean.values[j];
      dof[j] += gi;
      ady += std::fabs(gi);
      sdyx += gi * xm;
      adyx += std::fabs(gi * xm);
    }
    rs[j] = 1 / std::sqrt(var.values[j] + eps);
    ds[j] = sdyx * rs[j];
    tds[j] = (k + 2) * kE * adyx * rs[j] + 4 * kE * std::fabs(ds[j]);
    tdof[j] = k * kE * ady;
  }
  check_within_bounds(sums.outputs[0].values, ds, tds, "diff_scale");
  check_within_bounds(sums.outputs[1].values, dof, tdof, "diff_offset");
  // The x gradient from the f32 sums the first op returned.
  HostTensor dsv = vec(sums.outputs[0].values), dofv = vec(sums.outputs[1].values);
  in = {dy, x, dsv, dofv, scale, mean, var};
  if (gc.relu) in.push_back(offset);
  RunResult dx = run("BNTrainingReduceGrad", in, attrs, 1);
  std::vector<double> want(x.values.size()), tol(x.values.size());
  for (int64_t j = 0; j < c; ++j) {
    const double c1 = scale.values[j] * rs[j], mdy = dofv.values[j] / static_cast<double>(r),
                 c2 = rs[j] * dsv.values[j] / static_cast<double>(r);
    for (int64_t i = 0; i < r; ++i) {
      const size_t q = static_cast<size_t>(i * c + j);
      const double xm = x.values[q] - mean.values[j], inner = (g.values[q] - mdy) - xm * c2;
      want[q] = c1 * inner;
      tol[q] = std::fabs(c1) * 12 * kE *
                   (std::fabs(g.values[q]) + std::fabs(x.values[q] * c2) +
                    std::fabs(mean.values[j] * c2) + std::fabs(mdy)) +
               2 * kE * std::fabs(want[q]);
      if (gc.dt == DataType::F16)
        tol[q] = tol[q] * (1 + kH) + kH * std::fabs(want[q]) + kHalfSubnormal;
    }
  }
  check_within_bounds(dx.outputs[0].values, want, tol, "dx");
  // bias_grads = 1 (the graph pass's BiasAddGrad folded in): dx the same, bit for bit, and output 1
  // the per-channel sum of dx in T (C a multiple of 8: summed from the f32 dx in the pass, else by
  // BiasAddGrad's kernel after it), against the sum in double of the dx returned: the f32
  // additions' K e sum|dx|, for f16 each dx's rounding (the pass sums dx before it) and the
  // sum's own.
  std::map<std::string, compiler::AttrValue> bias_attrs = attrs;
  bias_attrs["bias_grads"] = int64_t{1};
  RunResult with_bias = run("BNTrainingReduceGrad", in, bias_attrs, 2);
  CHECK(with_bias.outputs[0].values == dx.outputs[0].values);
  std::vector<double> bias(c), tbias(c);
  for (int64_t j = 0; j < c; ++j) {
    for (int64_t i = 0; i < r; ++i) {
      const double d = std::fabs(at(dx.outputs[0], i, j, c));
      bias[j] += at(dx.outputs[0], i, j, c);
      tbias[j] += k * kE * d + (gc.dt == DataType::F16 ? kH * d + kHalfSubnormal : 0);
    }
    if (gc.dt == DataType::F16) tbias[j] += kH * std::fabs(bias[j]) + kHalfSubnormal;
  }
  check_within_bounds(with_bias.outputs[1].values, bias, tbias, "bias_grad");
}

// The ReLU-masked gradients against the chain they replace, bit for bit: BNTrainingUpdate(relu)
// -> y, ReluGrad(dy, y), then BNTrainingUpdateGrad / BNTrainingReduceGrad of that gradient,
// each a kernel of its own. batch_mean is 0 (sum = 0 given), so shift = offset exactly and a
// pixel with x = 0 has the pre-activation offset: channel j's offset puts such pixels right at
// the edges of the mask (for f16, y rounded to f16 is +0 up to 2^-25, the tie to even
// included); the other pixels are random. Small shapes, so that the masked and the plain sums
// take the same tiles (on larger tensors the masked sums' extra UB buffers can make their tiles
// smaller, which changes the order of the f32 additions, not the mask).
void check_relu_fold_bits(const std::vector<int64_t>& shape, DataType dt, uint32_t seed) {
  const int64_t c = shape[3], r = shape[0] * shape[1] * shape[2];
  INFO("ReLU fold " << compiler::shape_str(shape) << " " << compiler::data_type_name(dt));
  const double eps = 0.001, t = std::ldexp(1.0, -25);
  const std::vector<double> edges = {t,    std::nextafter(static_cast<float>(t), 1.0f),
                                     -t,   std::nextafter(static_cast<float>(t), 0.0f),
                                     0,    std::ldexp(1.0, -24),
                                     1e-9, -0.0};
  HostTensor x = random_tensor(dt, shape, -2, 3, seed);
  HostTensor dy = random_tensor(dt, shape, -1, 1, seed + 1);
  HostTensor scale = random_tensor(DataType::F32, {c}, 0.5, 2, seed + 2);
  HostTensor offset = random_tensor(DataType::F32, {c}, -1, 1, seed + 3);
  for (int64_t j = 0; j < c; ++j) {
    offset.values[j] = edges[j % edges.size()];
    for (int64_t i = 0; i < r; i += 3) x.values[static_cast<size_t>(i * c + j)] = 0;
  }
  std::vector<double> sq(c);
  for (int64_t j = 0; j < c; ++j)
    for (int64_t i = 0; i < r; ++i) sq[j] += at(x, i, j, c) * at(x, i, j, c);
  for (double& v : sq) v = round_to(DataType::F32, v);
  const std::map<std::string, compiler::AttrValue> attrs = {{"epsilon", eps}, {"relu", true}},
                                                   plain = {{"epsilon", eps}};
  RunResult fwd =
      run("BNTrainingUpdate", {x, vec(std::vector<double>(c)), vec(sq), scale, offset}, attrs, 3);
  const HostTensor y{TensorDesc{dt, shape}, fwd.outputs[0].values};
  const HostTensor mean = vec(fwd.outputs[1].values), var = vec(fwd.outputs[2].values);
  const HostTensor g{TensorDesc{dt, shape}, run("ReluGrad", {dy, y}, {}, 1).outputs[0].values};
  // Both sides of the mask occur.
  size_t masked = 0;
  for (double v : y.values) masked += v == 0;
  CHECK(masked > 0);
  CHECK(masked < y.values.size());
  RunResult sums = run("BNTrainingUpdateGrad", {g, x, mean, var}, plain, 2);
  RunResult fsums = run("BNTrainingUpdateGrad", {dy, x, mean, var, scale, offset}, attrs, 2);
  CHECK(fsums.outputs[0].values == sums.outputs[0].values);
  CHECK(fsums.outputs[1].values == sums.outputs[1].values);
  const HostTensor ds = vec(sums.outputs[0].values), dof = vec(sums.outputs[1].values);
  RunResult dx = run("BNTrainingReduceGrad", {g, x, ds, dof, scale, mean, var}, plain, 1);
  RunResult fdx = run("BNTrainingReduceGrad", {dy, x, ds, dof, scale, mean, var, offset}, attrs, 1);
  CHECK(fdx.outputs[0].values == dx.outputs[0].values);
}

// Conv2DBNTrainingReduce (ops/conv2d.cpp) of x uniform in [x_lo, 1): y bit for bit as Conv2D /
// Conv2DBiasAdd compute it (the same cube kernel; the vector cores only read y), and sum /
// square_sum of that y within BNTrainingReduce's bounds (K e sum|y|, (K + 1) e sum y^2). On split
// chips the sums are the convolution kernel's (a mix kernel: no channel-sum launch and no epilogue
// launch of its own).
void check_conv_reduce(const std::vector<int64_t>& xs, const std::vector<int64_t>& ws, bool bias,
                       DataType dt, uint32_t seed, bool whole_blocks = true, double x_lo = -1) {
  INFO("Conv2DBNTrainingReduce x " << compiler::shape_str(xs) << " filter "
                                   << compiler::shape_str(ws) << (bias ? " bias " : " ")
                                   << compiler::data_type_name(dt));
  std::vector<HostTensor> in = {random_tensor(dt, xs, x_lo, 1, seed),
                                random_tensor(dt, ws, -0.5, 0.5, seed + 1)};
  if (bias) in.push_back(random_tensor(DataType::F32, {ws[3]}, -1, 1, seed + 2));
  const std::map<std::string, compiler::AttrValue> attrs = {
      {"strides", std::vector<int64_t>{1, 1, 1, 1}}, {"padding", std::string("SAME")}};
  std::vector<TensorDesc> descs;
  for (const HostTensor& t : in) descs.push_back(t.desc);
  const auto k =
      compiler::compile(make_op("Conv2DBNTrainingReduce", descs, attrs), test_sim().config());
  bool channel_sum_launch = false, epilogue_launch = false;
  for (const auto& l : k.launches) {
    channel_sum_launch |= l.kernel.program.name.rfind("ChannelSum", 0) == 0;
    epilogue_launch |= l.kernel.program.name == "BNTrainingReduceSums";
  }
  CHECK(channel_sum_launch == (!test_sim().config().split || !whole_blocks));
  // the mix kernel adds its vector cores' partials itself, after their barrier; so does the
  // channel-sum launch on a split chip (compiler::ops::build_channel_sum_with_epilogue)
  CHECK(epilogue_launch == (channel_sum_launch && !test_sim().config().split));
  RunResult fused = run("Conv2DBNTrainingReduce", in, attrs, 3);
  RunResult conv = run(bias ? "Conv2DBiasAdd" : "Conv2D", in, attrs, 1);
  CHECK(fused.outputs[0].values == conv.outputs[0].values);
  check_channel_sums(fused.outputs[0], ws[3], fused, 1);
}

// Sets an environment variable (a compiler's measuring switch) for a test's compiles, unset
// again on the way out.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name); }
  const char* name;
};

// Conv2DBNTrainingReduce (split chips) with its statistics summed tile by tile as each cube core
// stores its tiles (CubeConvSpec::bn_stats_per_tile, the default) against the same op with
// NPUSIM_FUSION_CONV_BN_REDUCE_TILES=0 (the sums after a barrier of the cube cores): y bit for
// bit the convolution's in both, the sums within BNTrainingReduce's bounds in both, and the
// per-tile kernel's cycles beyond the convolution alone fewer than the barrier kernel's: where
// a cube core has more than 2 tiles by at least the fraction `overlap` of them (the sums of the
// earlier tiles run while the cube computes the later ones), else at least not more (one or
// two tiles a cube core, as these shapes get on the 910b's 24: little to overlap, the last
// tile's sums follow it either way). A cube core with more tiles than cross_core_max_pending /
// aiv_per_aic (the launch summary's "blocks of N") waits for its vector cores to take the
// earlier ones before it hands over more (the flag counters' bound); with fewer it never does.
void check_conv_reduce_per_tile(const std::vector<int64_t>& xs, const std::vector<int64_t>& ws,
                                DataType dt, uint32_t seed, double overlap) {
  INFO("Conv2DBNTrainingReduce per tile: x " << compiler::shape_str(xs) << " filter "
                                             << compiler::shape_str(ws) << " "
                                             << compiler::data_type_name(dt));
  const ChipConfig& cfg = test_sim().config();
  REQUIRE(cfg.split);
  std::vector<HostTensor> in = {random_tensor(dt, xs, 0, 1, seed),
                                random_tensor(dt, ws, -0.5, 0.5, seed + 1)};
  const std::map<std::string, compiler::AttrValue> attrs = {
      {"strides", std::vector<int64_t>{1, 1, 1, 1}}, {"padding", std::string("SAME")}};
  // The convolution's launch (f32 x and w: after their casts).
  const auto conv_launch = [&] {
    const auto k =
        compiler::compile(make_op("Conv2DBNTrainingReduce", {in[0].desc, in[1].desc}, attrs), cfg);
    for (const auto& l : k.launches)
      if (l.kernel.program.name.find("_BNTrainingReduce") != std::string::npos) return l;
    FAIL("no convolution with the statistics among the launches");
    return k.launches[0];
  };
  const auto l = conv_launch();
  INFO(l.summary);
  const std::string& listing = l.kernel.listing;
  CHECK(listing.find("tile stored: to the vector cores") != std::string::npos);
  const size_t of = l.summary.find(" blocks of ");
  REQUIRE(of != std::string::npos);
  const int64_t per_block = std::stoll(l.summary.substr(of + 11));
  CHECK((listing.find("wait: a vector core took an earlier tile") != std::string::npos) ==
        (per_block > cfg.cross_core_max_pending / cfg.aiv_per_aic));
  const RunResult per_tile = run("Conv2DBNTrainingReduce", in, attrs, 3);
  RunResult barrier;
  {
    ScopedEnv off("NPUSIM_FUSION_CONV_BN_REDUCE_TILES", "0");
    CHECK(conv_launch().kernel.listing.find("tile stored: to the vector cores") ==
          std::string::npos);
    barrier = run("Conv2DBNTrainingReduce", in, attrs, 3);
  }
  const RunResult conv = run("Conv2D", in, attrs, 1);
  CHECK(per_tile.outputs[0].values == conv.outputs[0].values);
  CHECK(barrier.outputs[0].values == conv.outputs[0].values);
  check_channel_sums(per_tile.outputs[0], ws[3], per_tile, 1);
  check_channel_sums(barrier.outputs[0], ws[3], barrier, 1);
  INFO("cycles: conv " << conv.cycles << ", per tile " << per_tile.cycles << ", after a barrier "
                       << barrier.cycles);
  REQUIRE(barrier.cycles > conv.cycles);
  // With more than 2 tiles per cube core the sums overlap the cube's later tiles. With 1 or 2
  // (the 910b's 24 cube cores on these small maps) there is nothing to overlap, and since the
  // barrier form's epilogue folds its 48 partial rows pairwise it is up to ~5 % faster there
  // (2026-12-05; at ResNet-50's maps the per-tile form stays faster, docs/graph_engine.md):
  // only reported.
  if (per_block > 2)
    CHECK(static_cast<double>(per_tile.cycles - conv.cycles) <=
          (1 - overlap) * static_cast<double>(barrier.cycles - conv.cycles));
  else
    WARN("1 or 2 tiles per cube core: per tile " << per_tile.cycles << ", after a barrier "
                                                 << barrier.cycles << " cycles");
}

// BNTrainingUpdateGrad's channel sums of `pixels` x c: a = x centred on m (argument "m"), b = dy,
// the sum of (x - m) dy, and the plain sum of dy.
compiler::ops::ChannelSumSpec update_grad_sums(int64_t pixels, int64_t c, isa::Dtype t) {
  compiler::ops::ChannelSumSpec s;
  s.kind = compiler::ops::ChannelSumSpec::Kind::kSumProduct;
  s.centered = true;
  s.plain_sum = true;
  s.a_type = s.b_type = t;
  s.pixels = pixels;
  // (c not whole blocks of t: rows of whole pixels, ChannelSumSpec::channels)
  const std::optional<compiler::ops::ChannelSumRow> row =
      compiler::ops::channel_sum_row(pixels, c, isa::dtype_size(t));
  REQUIRE(row);
  s.cp = row->cp;
  s.channels = row->channels;
  return s;
}

// compiler::ops::append_channel_sum_epilogue with the epilogue in the sums' kernel (one launch,
// split chips) against the sums' launch and the epilogue's launch: the same outputs, bit for
// bit. The sums are BNTrainingUpdateGrad's (a = x, b = dy, centred on m, with the plain sum of
// dy), the epilogue reads a vector (v) and writes diff_scale = rsqrt(v) * sum dy (x - m) and
// diff_offset = sum dy, each through its own instructions. A coupled chip has the two launches
// only (checked against the sums in double).
void check_epilogue_in_kernel(int64_t pixels, int64_t c, DataType dt, uint32_t seed) {
  INFO("channel sums and epilogue in one kernel: " << pixels << " x " << c << " "
                                                   << compiler::data_type_name(dt));
  using namespace compiler::ops;
  HostTensor x = random_tensor(dt, {pixels, c}, -2, 3, seed);
  HostTensor dy = random_tensor(dt, {pixels, c}, -1, 1, seed + 1);
  HostTensor m = random_tensor(DataType::F32, {c}, 0, 1, seed + 2);
  HostTensor v = random_tensor(DataType::F32, {c}, 0.5, 2, seed + 3);
  ChannelSumSpec s = update_grad_sums(pixels, c, compiler::device_dtype(dt));
  ChannelEpilogueSpec e;
  e.name = "TestSums";
  e.spread = true;
  e.c = c;
  e.vectors = 1;
  e.outputs = 2;
  e.compute = [](compiler::KernelBuilder& b, const EpilogueOperands& o) {
    f32_unary(b, isa::Opcode::op_vrsqrt, o.outputs[0], o.vectors[0], *o.count);
    f32_binary(b, isa::Opcode::op_vmul, o.outputs[0], o.outputs[0], o.sums[0], *o.count);
    f32_copy(b, o.outputs[1], o.sums[1], *o.count);
  };
  const auto run_sums = [&](bool in_kernel) {
    compiler::CompiledKernel k;
    k.outputs = {TensorDesc{DataType::F32, {c}}, TensorDesc{DataType::F32, {c}}};
    append_channel_sum_epilogue(k, "test", s, {input_ref(0), input_ref(1), input_ref(2)}, e,
                                {input_ref(3), output_ref(0), output_ref(1)}, test_sim().config(),
                                in_kernel);
    for (const auto& l : k.launches) UNSCOPED_INFO(l.summary);
    CHECK(k.launches.size() == (in_kernel ? 1u : 2u));
    return run_compiled(test_sim(), k, {x, dy, m, v});
  };
  // A coupled chip keeps the two launches (no cross-core flags for the epilogue's barrier:
  // channel_epilogue_in_kernel says no, the one-launch form is refused); the two launches'
  // values are checked below alone.
  const bool split = test_sim().config().split;
  if (!split) {
    CHECK_FALSE(channel_epilogue_in_kernel(test_sim().config()));
    CHECK_THROWS_WITH(build_channel_sum_with_epilogue(s, e, test_sim().config(), "test"),
                      Catch::Contains("need a split chip"));
  }
  const RunResult two = run_sums(false);
  const RunResult one = split ? run_sums(true) : two;
  CHECK(one.outputs[1].values == two.outputs[1].values);
  CHECK(one.outputs[0].values == two.outputs[0].values);
  // and against the sums in double (the channel sums' bound, file comment)
  const double k = static_cast<double>(pixels + 16);
  std::vector<double> dof(c), tdof(c);
  for (int64_t j = 0; j < c; ++j)
    for (int64_t i = 0; i < pixels; ++i) {
      dof[j] += at(dy, i, j, c);
      tdof[j] += k * kE * std::fabs(at(dy, i, j, c));
    }
  check_within_bounds(one.outputs[1].values, dof, tdof, "sum dy");
}

// build_channel_epilogue alone on given partials ([1][blocks][cp] f32, values of magnitudes
// 2^-10 to 2^10 so that the order of the f32 additions shows in the bits): the sums it writes
// are those of the pairwise fold documented in ops/channel.h (fold_rows_pairwise), emulated
// here in f32, bit for bit; and that order is not block order (the adds one after another
// give other bits for some channel), so the check can tell the two apart.
void check_epilogue_fold_order(int blocks, int64_t c, uint32_t seed) {
  INFO("the epilogue's fold of " << blocks << " partial rows x " << c << " channels");
  using namespace compiler::ops;
  const int64_t cp = (c + 7) / 8 * 8;
  HostTensor p = random_tensor(DataType::F32, {1, blocks, cp}, -1, 1, seed);
  HostTensor scale = random_tensor(DataType::F32, {1, blocks, cp}, -10, 10, seed + 1);
  for (size_t i = 0; i < p.values.size(); ++i)
    p.values[i] = static_cast<float>(p.values[i] * std::exp2(std::round(scale.values[i])));
  ChannelEpilogueSpec e;
  e.name = "TestFold";
  e.spread = true;
  e.c = c;
  e.partial_cp = cp;
  e.partial_blocks = {blocks};
  e.outputs = 1;
  e.compute = [](compiler::KernelBuilder& b, const EpilogueOperands& o) {
    f32_copy(b, o.outputs[0], o.sums[0], *o.count);
  };
  compiler::CompiledKernel k;
  k.outputs = {TensorDesc{DataType::F32, {c}}};
  k.launches.push_back(with_args(build_channel_epilogue(e, test_sim().config(), "test"),
                                 {input_ref(0), output_ref(0)}));
  const RunResult r = run_compiled(test_sim(), k, {p});
  int order_shows = 0;
  for (int64_t j = 0; j < c; ++j) {
    std::vector<float> rows(static_cast<size_t>(blocks));
    float in_order = 0;
    for (int i = 0; i < blocks; ++i) {
      rows[static_cast<size_t>(i)] = static_cast<float>(p.values[static_cast<size_t>(i * cp + j)]);
      in_order = i == 0 ? rows[0] : in_order + rows[static_cast<size_t>(i)];
    }
    for (int left = blocks; left > 1; left -= left / 2)
      for (int i = 0; i < left / 2; ++i)
        rows[static_cast<size_t>(i)] += rows[static_cast<size_t>(left - left / 2 + i)];
    INFO("channel " << j);
    CHECK(r.outputs[0].values[static_cast<size_t>(j)] == static_cast<double>(rows[0]));
    order_shows += in_order != rows[0];
  }
  if (blocks > 2) CHECK(order_shows > 0);
}

}  // namespace

TEST_CASE("Channel sums with their epilogue in the kernel: the two launches' values") {
  // One channel tile (block 0 adds it) and several spread over the blocks; whole and partial
  // last tiles of pixels; f16 inputs widened.
  check_epilogue_in_kernel(8 * 6 * 6, 16, DataType::F32, 70);
  check_epilogue_in_kernel(2 * 20 * 61, 64, DataType::F16, 71);
  check_epilogue_in_kernel(4 * 7 * 7, 512, DataType::F32, 72);
  check_epilogue_in_kernel(3 * 9 * 9, 2048, DataType::F16, 73);
  // f16 pixels of 24 and 40 channels read as rows of two (ChannelSumSpec::channels): the
  // partials fold a row's two pixels with the blocks; an odd count's last pixel a partial row
  check_epilogue_in_kernel(2 * 7 * 7, 24, DataType::F16, 74);
  check_epilogue_in_kernel(3 * 7 * 7, 40, DataType::F16, 75);
}

TEST_CASE("Channel epilogue: the blocks' partials folded pairwise in a fixed order") {
  // 48 rows (a 910b's vector cores), odd counts (a middle row kept), one row; one channel tile
  // and several, a partial last tile (the rows' gaps added too, never read).
  check_epilogue_fold_order(48, 64, 80);
  check_epilogue_fold_order(7, 200, 81);
  check_epilogue_fold_order(3, 24, 82);
  check_epilogue_fold_order(1, 16, 83);
}

TEST_CASE("Conv2DBNTrainingReduce: the batch norm's sums of the convolution's output") {
  check_conv_reduce({2, 6, 7, 16}, {3, 3, 16, 32}, true, DataType::F16, 50);
  check_conv_reduce({3, 5, 5, 24}, {1, 1, 24, 64}, false, DataType::F16, 51);
  check_conv_reduce({2, 6, 6, 8}, {3, 3, 8, 16}, true, DataType::F32, 52);
  // one pixel: a vector core without pixels still joins the barrier before the epilogue
  check_conv_reduce({1, 1, 1, 32}, {1, 1, 32, 64}, false, DataType::F16, 54);
  // 7 f16 channels are not whole 32-byte pixels: BNTrainingReduce's launches on y instead
  check_conv_reduce({1, 4, 4, 16}, {1, 1, 16, 7}, true, DataType::F16, 53, false);
  // Grouped, the narrow groups packed block-diagonally (forced): 4 groups of 8 -> 8, 8 of 4 -> 4.
  ScopedEnv pack("NPUSIM_FUSION_GROUPED_CONV_PACK", "1");
  check_conv_reduce({2, 6, 7, 32}, {3, 3, 8, 32}, false, DataType::F16, 55);
  check_conv_reduce({2, 8, 8, 32}, {3, 3, 4, 32}, false, DataType::F32, 56);
}

TEST_CASE("Conv2DBNTrainingReduce: the sums per tile as the cube cores store them") {
  // (split chips only: on a coupled chip the sums are a channel-sum launch after the convolution)
  if (!test_sim().config().split) return;
  // On the test chip (2 cube cores): 1x1 64 -> 256 at 16x16 (16 tiles per cube core, more than
  // the hand-over window) and 3x3 32 -> 64 at 28x28 (8); 3x3 32 -> 512 at 14x14 (several n
  // tiles: running sums of each key's channels); f32 y (2 tiles per cube core: not slower).
  check_conv_reduce_per_tile({8, 16, 16, 64}, {1, 1, 64, 256}, DataType::F16, 80, 0.5);
  check_conv_reduce_per_tile({4, 28, 28, 32}, {3, 3, 32, 64}, DataType::F16, 82, 0.4);
  check_conv_reduce_per_tile({2, 14, 14, 32}, {3, 3, 32, 512}, DataType::F16, 84, 0.25);
  check_conv_reduce_per_tile({2, 16, 16, 32}, {3, 3, 32, 64}, DataType::F32, 86, 0);
}

TEST_CASE("NPUSIM_MIX_ONE_TO_ONE: Conv2DBNTrainingReduce's sums on one vector core a block") {
  // (split chips only.) Under the switch the convolution with the statistics declares one
  // vector core per cube core (.aiv_per_aic 1), per tile and after a barrier: y bit for bit the
  // convolution's, the sums within BNTrainingReduce's bounds (their partials now one per cube
  // core: another order of f32 additions), and the launch's blocks on the groups' first vector
  // cores only, the others left free.
  const ChipConfig& cfg = test_sim().config();
  if (!cfg.split) return;
  const std::vector<int64_t> xs{2, 16, 16, 32}, ws{3, 3, 32, 64};
  std::vector<HostTensor> in = {random_tensor(DataType::F16, xs, 0, 1, 90),
                                random_tensor(DataType::F16, ws, -0.5, 0.5, 91)};
  const std::map<std::string, compiler::AttrValue> attrs = {
      {"strides", std::vector<int64_t>{1, 1, 1, 1}}, {"padding", std::string("SAME")}};
  const RunResult conv = run("Conv2D", in, attrs, 1);
  for (const char* tiles : {"1", "0"}) {
    INFO("NPUSIM_FUSION_CONV_BN_REDUCE_TILES=" << tiles);
    ScopedEnv per_tile("NPUSIM_FUSION_CONV_BN_REDUCE_TILES", tiles);
    ScopedEnv one("NPUSIM_MIX_ONE_TO_ONE", "1");
    const auto k =
        compiler::compile(make_op("Conv2DBNTrainingReduce", {in[0].desc, in[1].desc}, attrs), cfg);
    size_t stats = k.launches.size();
    for (size_t i = 0; i < k.launches.size(); ++i)
      if (k.launches[i].kernel.program.name.find("_BNTrainingReduce") != std::string::npos)
        stats = i;
    REQUIRE(stats < k.launches.size());
    CHECK(k.launches[stats].kernel.program.aiv_per_aic == 1);
    CHECK((k.launches[stats].kernel.listing.find("tile stored: to the vector cores") !=
           std::string::npos) == (std::string(tiles) == "1"));
    const RunResult r = run("Conv2DBNTrainingReduce", in, attrs, 3);
    CHECK(r.outputs[0].values == conv.outputs[0].values);
    check_channel_sums(r.outputs[0], ws[3], r, 1);
    REQUIRE(stats < r.counters.size());
    const nlohmann::json& chip = r.counters[stats]["chip"];
    CHECK(chip.contains("aiv0"));
    CHECK_FALSE(chip.contains("aiv1"));
  }
  // The switch naming kernels: the statistics 1:1 where it names bn_reduce.
  for (const auto& [value, one] : std::vector<std::pair<const char*, bool>>{
           {"bn_reduce", true}, {"filter_grad", false}, {"filter_grad,bn_reduce", true}}) {
    INFO("NPUSIM_MIX_ONE_TO_ONE=" << value);
    ScopedEnv sw("NPUSIM_MIX_ONE_TO_ONE", value);
    const auto k =
        compiler::compile(make_op("Conv2DBNTrainingReduce", {in[0].desc, in[1].desc}, attrs), cfg);
    bool found = false;
    for (const auto& l : k.launches)
      if (l.kernel.program.name.find("_BNTrainingReduce") != std::string::npos) {
        found = true;
        CHECK(l.kernel.program.aiv_per_aic == (one ? 1 : 0));
      }
    CHECK(found);
  }
  // The compile option (kMixOneToOneAttr, the caller's default): the statistics 1:1 where it
  // names bn_reduce and the switch is unset; the switch, where set, wins.
  const auto stats_ratio = [&](const char* option) {
    compiler::OpDesc op = make_op("Conv2DBNTrainingReduce", {in[0].desc, in[1].desc}, attrs);
    op.attrs[compiler::ops::kMixOneToOneAttr] = std::string(option);
    int ratio = -1;
    for (const auto& l : compiler::compile(op, cfg).launches)
      if (l.kernel.program.name.find("_BNTrainingReduce") != std::string::npos)
        ratio = l.kernel.program.aiv_per_aic;
    return ratio;
  };
  CHECK(stats_ratio("bn_reduce") == 1);
  CHECK(stats_ratio("filter_grad") == 0);
  {
    ScopedEnv off("NPUSIM_MIX_ONE_TO_ONE", "0");
    CHECK(stats_ratio("bn_reduce") == 0);
  }
}

TEST_CASE("Conv2DBNTrainingReduce: the sums within the chip's cross-core flag ids") {
  // (split chips only.) The per-tile sums use cross-core flag ids 0-4, the sums after a barrier
  // 0-2: compiled for the test chip with 4 ids the kernel takes the barrier (no hand-over of
  // tiles) and runs right; with 2 the compile fails naming sync.cross_core_flag_ids.
  if (!test_sim().config().split) return;
  ChipConfig few = test_sim().config();
  REQUIRE(few.cross_core_flag_ids >= 5);
  few.cross_core_flag_ids = 4;
  const DataType dt = DataType::F16;
  const std::vector<int64_t> xs = {4, 28, 28, 32}, ws = {3, 3, 32, 64};
  std::vector<HostTensor> in = {random_tensor(dt, xs, 0, 1, 90),
                                random_tensor(dt, ws, -0.5, 0.5, 91)};
  const std::map<std::string, compiler::AttrValue> attrs = {
      {"strides", std::vector<int64_t>{1, 1, 1, 1}}, {"padding", std::string("SAME")}};
  const OpDesc op = make_op("Conv2DBNTrainingReduce", {in[0].desc, in[1].desc}, attrs);
  const auto k = compiler::compile(op, few);
  bool fused = false;
  for (const auto& l : k.launches)
    if (l.kernel.program.name.find("_BNTrainingReduce") != std::string::npos) {
      fused = true;
      CHECK(l.kernel.listing.find("tile stored: to the vector cores") == std::string::npos);
      CHECK(l.kernel.listing.find("y stored: to the vector cores") != std::string::npos);
    }
  CHECK(fused);
  g_compile_for = &few;
  const RunResult res = run("Conv2DBNTrainingReduce", in, attrs, 3);
  g_compile_for = nullptr;
  const RunResult conv = run("Conv2D", in, attrs, 1);
  CHECK(res.outputs[0].values == conv.outputs[0].values);
  check_channel_sums(res.outputs[0], ws[3], res, 1);
  {  // the switch takes unset, "0" or "1" only
    ScopedEnv bad("NPUSIM_FUSION_CONV_BN_REDUCE_TILES", "yes");
    CHECK(compile_refusal(op).message.find("NPUSIM_FUSION_CONV_BN_REDUCE_TILES='yes'") !=
          std::string::npos);
  }
  few.cross_core_flag_ids = 2;
  const CompileRefusal r = compile_refusal(op, few);
  CHECK(r.message.find("sync.cross_core_flag_ids") != std::string::npos);
  CHECK(r.message.find("needs 3 cross-core flag ids") != std::string::npos);
}

TEST_CASE("Conv2DBNTrainingReduce: the sums in channels-first tiles at ResNet-50's small maps") {
  // The ResNet-50 v1.5 training test's shapes (tests/tf/test_resnet_v15.py: 32x32 input, batch
  // 16) whose fused sums take another tile with the channels first (ops/channel.cpp): on the
  // test chip 4096 x 64 pixels x channels (64 x 64 tiles), 1024 x 64, 1024 x 128, 1024 x 256 (16
  // to 64 pixels x 64 to 256 channels), 256 x 256, 256 x 512 and 64 x 1024 (16 to 4 pixels x
  // 256 to 1024 channels), each in ping-pong sums and two tiles per raw tile; the inputs
  // non-negative as after a ReLU, so that y's channels have a mean.
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{16, 16, 16, 16}, {1, 1, 16, 64}},  {{16, 8, 8, 64}, {3, 3, 64, 64}},
      {{16, 8, 8, 64}, {1, 1, 64, 128}},   {{16, 8, 8, 64}, {1, 1, 64, 256}},
      {{16, 4, 4, 128}, {1, 1, 128, 256}}, {{16, 4, 4, 128}, {1, 1, 128, 512}},
      {{16, 2, 2, 256}, {1, 1, 256, 1024}}};
  uint32_t seed = 55;
  for (const auto& [x, w] : cases) check_conv_reduce(x, w, false, DataType::F32, seed++, true, 0);
}

TEST_CASE("BNTrainingReduce: per-channel sum and sum of squares in one pass") {
  check_reduce({2, 3, 5, 16}, 1);
  check_reduce({1, 4, 4, 7}, 2);  // channels padded to whole blocks
  check_reduce({4, 8, 8, 64}, 3);
  check_reduce({1, 4, 4, 200}, 4);  // per-channel work spread over the cores
}

TEST_CASE("BNTrainingUpdate: statistics, normalisation, scale, shift (and ReLU)") {
  check_update({2, 3, 5, 16}, false, 10);
  check_update({2, 3, 5, 16}, true, 11);
  check_update({1, 4, 4, 7}, true, 12);
  check_update({1, 4, 4, 200}, false, 13);
}

TEST_CASE("BNTrainingUpdate with a residual: relu(y + r), the add in T after y's rounding") {
  check_update({2, 3, 5, 16}, true, 14, DataType::F32, true);
  check_update({2, 3, 5, 16}, false, 15, DataType::F32, true);
  check_update({1, 4, 4, 7}, true, 16, DataType::F32, true);  // the fold in a launch of its own
  check_update({2, 3, 5, 16}, true, 17, DataType::F16, true);
  check_update({2, 3, 5, 16}, false, 20, DataType::F16, true);
  check_update({1, 4, 4, 200}, true, 18, DataType::F16, true);
  check_update({1, 4, 4, 7}, true, 19, DataType::F16, true);
  for (DataType dt : {DataType::F32, DataType::F16}) {
    check_residual_bits({2, 3, 5, 16}, dt, 40);
    check_residual_bits({1, 4, 4, 7}, dt, 41);
    check_residual_bits({4, 8, 8, 64}, dt, 42);  // several tiles per block
    // a residual that broadcasts into x's shape (per channel, per pixel row)
    check_residual_bits({2, 3, 5, 16}, dt, 43, {16});
    check_residual_bits({2, 3, 5, 16}, dt, 44, {2, 1, 5, 16});
  }
  // one that does not broadcast into x's shape
  const TensorDesc x{DataType::F32, {2, 3, 5, 16}}, v{DataType::F32, {16}};
  CHECK(compile_refusal(make_op("BNTrainingUpdate",
                                {x, v, v, v, v, TensorDesc{DataType::F32, {4, 3, 5, 16}}},
                                {{"R", int64_t{1}}, {"relu", true}}))
            .message.find("input 5 (the residual) is f32[4,3,5,16], expected f32[2,3,5,16] or a "
                          "shape that broadcasts into it") != std::string::npos);
}

TEST_CASE("BNTrainingUpdateGrad and BNTrainingReduceGrad: the training gradient") {
  check_grads({{2, 3, 5, 16}, 20});
  check_grads({{1, 4, 4, 7}, 21});
  check_grads({{3, 4, 4, 32}, 22});
  check_grads({{1, 4, 4, 200}, 23});
}

TEST_CASE("BNTrainingUpdateGrad and BNTrainingReduceGrad with relu: ReluGrad folded in") {
  check_grads({{2, 3, 5, 16}, 30, true});
  check_grads({{1, 4, 4, 7}, 31, true});  // channels padded to whole blocks
  check_grads({{3, 4, 4, 32}, 32, true});
  check_grads({{1, 4, 4, 200}, 33, true});
  // relu needs the fold's inputs
  const TensorDesc x{DataType::F32, {2, 4, 4, 8}}, v{DataType::F32, {8}};
  CHECK(compile_refusal(make_op("BNTrainingUpdateGrad", {x, x, v, v}, {{"relu", true}}))
            .message.find("with relu = true takes 6 inputs, 4 given") != std::string::npos);
  CHECK(compile_refusal(make_op("BNTrainingReduceGrad", {x, x, v, v, v, v, v, v}))
            .message.find("takes 7 inputs without relu, 8 given") != std::string::npos);
}

TEST_CASE("BNTrainingReduceGrad with relu: a masked infinite dy gives NaN, as ReluGrad's") {
  // ReluGrad multiplies dy by the mask, so an infinite dy where y = 0 gives NaN (inf * 0), and
  // a loss-scaled step sees the overflow; the folded mask keeps that product.
  for (DataType dt : {DataType::F32, DataType::F16}) {
    INFO(compiler::data_type_name(dt));
    const std::vector<int64_t> shape = {1, 2, 4, 8};
    const int64_t c = 8, r = 8;
    const double eps = 0.001;
    HostTensor dy = random_tensor(dt, shape, -1, 1, 40);
    HostTensor x = random_tensor(dt, shape, -2, 3, 41);
    const HostTensor scale = random_tensor(DataType::F32, {c}, 0.5, 2, 42),
                     mean = random_tensor(DataType::F32, {c}, 0, 1, 43),
                     var = random_tensor(DataType::F32, {c}, 0.5, 2, 44),
                     offset = random_tensor(DataType::F32, {c}, -1, 1, 45),
                     ds = random_tensor(DataType::F32, {c}, -1, 1, 46),
                     dof = random_tensor(DataType::F32, {c}, -1, 1, 47);
    // In each channel, pixel 0 gets the pre-activation -1 (masked) and an infinite dy.
    for (int64_t j = 0; j < c; ++j) {
      const double a = scale.values[j] / std::sqrt(var.values[j] + eps),
                   shift = offset.values[j] - mean.values[j] * a;
      x.values[static_cast<size_t>(j)] = round_to(dt, (-1 - shift) / a);
      dy.values[static_cast<size_t>(j)] = j % 2 ? INFINITY : -INFINITY;
    }
    RunResult dx = run("BNTrainingReduceGrad", {dy, x, ds, dof, scale, mean, var, offset},
                       {{"epsilon", eps}, {"relu", true}}, 1);
    for (int64_t i = 0; i < r; ++i)
      for (int64_t j = 0; j < c; ++j) {
        const double v = dx.outputs[0].values[static_cast<size_t>(i * c + j)];
        INFO("pixel " << i << " channel " << j << ": " << v);
        const bool ok = i == 0 ? std::isnan(v) : std::isfinite(v);
        CHECK(ok);
      }
  }
}

TEST_CASE("BNTraining ops with f16 x and dy: f32 statistics, f16 y and dx") {
  check_reduce({2, 3, 5, 16}, 30, DataType::F16);
  check_reduce({1, 4, 4, 7}, 31, DataType::F16);  // channels padded to whole blocks
  check_update({2, 3, 5, 16}, true, 32, DataType::F16);
  check_update({1, 4, 4, 200}, false, 33, DataType::F16);
  check_grads({{2, 3, 5, 16}, 34, false, DataType::F16});
  check_grads({{1, 4, 4, 7}, 35, false, DataType::F16});
  check_grads({{2, 3, 5, 16}, 36, true, DataType::F16});
  check_grads({{1, 4, 4, 7}, 37, true, DataType::F16});
  // A small scale makes every dx an f16 subnormal (scale <= 2^-19, r < 1.42, |inner| < 15:
  // |dx| < 2^-14): the rounding to f16 errs by up to 2^-25 there, above its relative bound.
  check_grads({{2, 3, 5, 16}, 38, false, DataType::F16, 1.0 / (1 << 20)});
  check_grads({{2, 3, 5, 16}, 39, true, DataType::F16, 1.0 / (1 << 20)});
}

TEST_CASE("BNTraining gradients with relu: ReluGrad's mask on the stored y, bit for bit") {
  check_relu_fold_bits({2, 3, 5, 16}, DataType::F32, 60);
  check_relu_fold_bits({2, 3, 5, 16}, DataType::F16, 61);
  check_relu_fold_bits({1, 4, 4, 24}, DataType::F16, 62);
  check_relu_fold_bits({1, 3, 5, 40}, DataType::F16, 64);  // rows of two pixels, a partial one
  check_relu_fold_bits({1, 4, 4, 7}, DataType::F16, 63);   // channels padded to whole blocks
  // bf16 has no BNTrainingUpdate to fold from
  const TensorDesc x{DataType::BF16, {2, 4, 4, 8}}, v{DataType::F32, {8}};
  CHECK(compile_refusal(make_op("BNTrainingUpdateGrad", {x, x, v, v, v, v}, {{"relu", true}}))
            .message.find("relu = true needs T = f32 or f16") != std::string::npos);
}

TEST_CASE("BNTraining f16 channels not whole 32-byte blocks: read in place in rows of two pixels") {
  // C = 8, 24, 40 (multiples of 8 whose f16 pixel is 16 bytes past whole blocks; EfficientNet's
  // 24 and 40, RegNet's 24, 56 and 152): the channel sums read x and dy where they are, in rows
  // of two pixels (ChannelSumSpec::channels), an odd pixel count's last pixel a partial row;
  // C = 3 (not a multiple of 8) from a channel-padded copy. Against the double reference.
  uint32_t seed = 100;
  const std::vector<std::vector<int64_t>> shapes = {{2, 3, 5, 8},  {1, 3, 5, 24}, {2, 7, 7, 40},
                                                    {1, 7, 7, 40}, {3, 5, 5, 24}, {1, 1, 3, 24},
                                                    {1, 4, 4, 3},  {2, 3, 5, 3}};
  for (const std::vector<int64_t>& shape : shapes) {
    check_reduce(shape, seed++, DataType::F16);
    check_grads({shape, seed++, false, DataType::F16});
    check_grads({shape, seed++, true, DataType::F16});
  }
  // Several tiles and raw tiles per block, the last block's partial row after them.
  check_reduce({1, 41, 61, 24}, seed++, DataType::F16);
  check_grads({{1, 41, 61, 40}, seed++, true, DataType::F16});
  // The widest row read in place, C = 1,016 (2,032 f32: one repeat stride); 1,032 is padded.
  check_grads({{1, 1, 3, 1016}, seed++, true, DataType::F16});
  check_reduce({1, 1, 3, 1032}, seed++, DataType::F16);
  // One launch each where the epilogue joins the sums (split chips), else the sums' and the
  // epilogue's; with NPUSIM_BN_RAGGED_CHANNELS=0 the padded copies of x (and dy, and the
  // per-channel vectors of the gradient, all four of the ReLU-masked one in one launch) come
  // first.
  const ChipConfig& cfg = test_sim().config();
  const size_t one = compiler::ops::channel_epilogue_in_kernel(cfg) ? 1 : 2;
  const TensorDesc x{DataType::F16, {8, 14, 14, 24}}, v{DataType::F32, {24}};
  const auto launches = [&](const std::string& type, std::vector<TensorDesc> in, bool relu) {
    const auto k = compiler::compile(make_op(type, std::move(in), {{"relu", relu}}), cfg);
    std::string all;
    for (const auto& l : k.launches) all += l.summary + "\n";
    INFO(all);
    CHECK((all.find("24 channels, 2 pixels a row") != std::string::npos) ==
          (k.launches.size() == one));
    return k.launches.size();
  };
  CHECK(launches("BNTrainingReduce", {x}, false) == one);
  CHECK(launches("BNTrainingUpdateGrad", {x, x, v, v}, false) == one);
  CHECK(launches("BNTrainingUpdateGrad", {x, x, v, v, v, v}, true) == one);
  setenv("NPUSIM_BN_RAGGED_CHANNELS", "0", 1);
  CHECK(launches("BNTrainingReduce", {x}, false) == one + 1);
  CHECK(launches("BNTrainingUpdateGrad", {x, x, v, v}, false) == one + 3);
  CHECK(launches("BNTrainingUpdateGrad", {x, x, v, v, v, v}, true) == one + 3);
  check_grads({{1, 3, 5, 24}, seed++, true, DataType::F16});
  unsetenv("NPUSIM_BN_RAGGED_CHANNELS");
}

TEST_CASE("BNTraining channel sums: several tiles per block, a partial last tile") {
  // The sums ping-pong between two accumulators per tile (ops/channel.cpp); the tiny chip's 4
  // vector blocks get, per image: 6 pixels (tiles of 4: a full, then a partial one), 300
  // (128, 128, 44: the partial one after an even count), 384 (three full tiles of 128).
  check_reduce({2, 4, 6, 16}, 40);
  check_reduce({1, 20, 60, 16}, 41);
  check_reduce({1, 32, 48, 16}, 42);
  check_reduce({1, 20, 60, 16}, 43, DataType::F16);
  check_grads({{2, 4, 6, 16}, 44});
  check_grads({{1, 20, 60, 16}, 45});
  check_grads({{1, 32, 48, 16}, 46, true});
  check_grads({{1, 32, 48, 16}, 47, false, DataType::F16});
}

TEST_CASE("BNTrainingReduceGrad in pieces: many tiles per block, the f32 work per piece") {
  // StreamSpec::work_piece (ops/elementwise.h): where a block holds 8 or more tiles, the x
  // gradient's f32 work runs in pieces of about 2048 elements and its tiles grow. On the tiny
  // chip's 4 vector blocks these take pieces (on the 910b's 48 the blocks' ranges are too
  // short for it): 100352 elements a block in tiles of a few pieces, the last piece of each
  // tile partial and the block's last tile shorter than one piece; C = 100 (a period of 400)
  // takes pieces of 2400 that are not whole UB bank spans. BNTrainingUpdateGrad's plain sums
  // take their raw tile first (ChannelSumSpec::raw_tile_first) here: 32 pixels x 64 channels
  // loaded 256 pixels at a time (f16), 32 x 104 loaded 64 (f32).
  check_grads({{2, 56, 56, 64}, 48, false, DataType::F16});
  check_grads({{2, 56, 56, 64}, 49, true, DataType::F16});
  check_grads({{8, 28, 28, 100}, 50, false, DataType::F32});
  check_grads({{8, 28, 28, 100}, 51, true, DataType::F32});
}

TEST_CASE("BNTrainingUpdate in pieces: many tiles per block, the f32 work per piece") {
  // On split chips the apply's f32 work runs in pieces (StreamSpec::work_piece) where a block
  // holds at least 4 tiles without them, and the blocks' first tiles are staggered. The tiny
  // chip's 4 vector blocks take pieces at these shapes: 50176 (f16) and 43264 (f32, C = 104:
  // pieces of whole 104-channel periods, not whole UB bank spans) elements a block, the last
  // tile partial. Values against the double reference, and the residual's bits against the
  // unfused BNTrainingUpdate + AddRelu.
  check_update({2, 56, 56, 32}, true, 60, DataType::F16);
  check_update({2, 56, 56, 32}, false, 61, DataType::F16, true);
  check_update({4, 26, 16, 104}, true, 62, DataType::F32);
  check_update({4, 26, 16, 104}, true, 63, DataType::F32, true);
  check_residual_bits({2, 56, 56, 32}, DataType::F16, 64);
  check_residual_bits({4, 26, 16, 104}, DataType::F32, 65);
  // Where the pieces are taken, compiled for the 910b (48 vector blocks): ResNet-50's largest
  // maps (about 20 tiles a block) take them, its 14x14x256 layers (about one tile) do not.
  const ChipConfig b910 = load_chip_config("910b");
  auto summary = [&](const std::vector<int64_t>& shape) {
    const TensorDesc x{DataType::F16, shape}, v{DataType::F32, {shape[3]}};
    const auto k =
        compiler::compile(make_op("BNTrainingUpdate", {x, v, v, v, v}, {{"relu", true}}), b910);
    REQUIRE(k.launches.size() == 1);
    INFO(k.launches[0].summary);
    return k.launches[0].summary;
  };
  CHECK(summary({8, 56, 56, 256}).find(" in pieces of ") != std::string::npos);
  CHECK(summary({8, 14, 14, 256}).find(" in pieces of ") == std::string::npos);
  // Compiled for the 910b and run on the test chip: the 28x28x128 layer (2.5 tiles a block, no
  // pieces) staggers its blocks' first tiles (the 910b's ports outrun its HBM), and with them
  // loads the first tile together with the resident per-channel vectors, before their flag
  // (ops/elementwise.cpp first_tile_ahead).
  {
    const TensorDesc x{DataType::F16, {8, 28, 28, 128}}, v{DataType::F32, {128}};
    const auto k =
        compiler::compile(make_op("BNTrainingUpdate", {x, v, v, v, v}, {{"relu", true}}), b910);
    REQUIRE(k.launches.size() == 1);
    const std::string& listing = k.launches[0].kernel.listing;
    CHECK(listing.find("staggered first tile") != std::string::npos);
    CHECK(listing.find("first_tile_compute") != std::string::npos);
  }
  g_compile_for = &b910;
  check_update({8, 28, 28, 128}, true, 66, DataType::F16);
  check_update({8, 28, 28, 128}, false, 67, DataType::F16, true);
  check_residual_bits({8, 28, 28, 128}, DataType::F16, 68);
  g_compile_for = nullptr;
  if (test_chip_is_tiny()) {
    const TensorDesc x{DataType::F16, {2, 56, 56, 32}}, v{DataType::F32, {32}};
    const auto k = compiler::compile(make_op("BNTrainingUpdate", {x, v, v, v, v}, {{"relu", true}}),
                                     test_sim().config());
    REQUIRE(k.launches.size() == 1);
    INFO(k.launches[0].summary);
    CHECK(k.launches[0].summary.find(" in pieces of ") != std::string::npos);
  }
}

TEST_CASE("BNTrainingReduceGrad: the bias gradient's accumulator takes no tile UB") {
  // The stream kernel reserves a gather scratch for its per-channel inputs; they are loaded
  // whole (C * 4 bytes, whole 32-byte blocks), so it is dead UB and the bias gradient's
  // accumulator lives there (ops/elementwise.cpp declare_buffers): bias_grads = 1 takes the
  // tiles (and pieces) of bias_grads = 0, with and without the ReLU mask, in pieces and not.
  // (dx bit for bit and the sums' bounds: check_grads.)
  const auto tiles = [](const std::vector<int64_t>& shape, bool relu, int64_t bias_grads) {
    const TensorDesc x{DataType::F16, shape}, v{DataType::F32, {shape[3]}};
    std::vector<TensorDesc> in = {x, x, v, v, v, v, v};
    if (relu) in.push_back(v);
    auto k = compiler::compile(
        make_op("BNTrainingReduceGrad", in, {{"relu", relu}, {"bias_grads", bias_grads}}),
        test_sim().config());
    const std::string& s = k.launches.at(0).summary;
    UNSCOPED_INFO(s);
    const size_t at = s.find(", tile ");
    REQUIRE(at != std::string::npos);
    return s.substr(at, s.find(';', at) - at);
  };
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{2, 56, 56, 64}, {8, 28, 28, 256}, {8, 14, 14, 512}, {2, 7, 7, 2048}})
    for (bool relu : {false, true}) {
      INFO(compiler::shape_str(shape) << (relu ? " relu" : ""));
      CHECK(tiles(shape, relu, 1) == tiles(shape, relu, 0));
    }
}

TEST_CASE("BNTraining channel sums: several tiles loaded under one flag") {
  // Where a block has room for two raw tiles of several tiles each, a raw tile takes as many as
  // the UB holds (ops/channel.cpp: one flag, one memory latency, per raw tile); per block of the
  // tiny chip's 4, with tiles of 128 pixels and raw tiles of 512: 1536 pixels (three full raw
  // tiles), 1525 (two, then three full tiles and a partial one), 1300 (two, then two full tiles
  // and a partial one), 1408 (two, then three full tiles: the pixels end before the raw tile's
  // last tile). Those splits are the tiny chip's (compiled for it here; the 910b's 48 vector
  // cores leave a block too few pixels for two raw tiles of two).
  const ChipConfig tiny = load_chip_config("tiny");
  const auto tiles_per_raw_tile = [&tiny](const std::vector<int64_t>& shape) {
    auto k = compiler::compile(make_op("BNTrainingReduce", {TensorDesc{DataType::F32, shape}}, {}),
                               tiny);
    const std::string& s = k.launches.front().summary;
    UNSCOPED_INFO(s);
    const size_t t = s.find("tiles of "), l = s.find("loaded ");
    REQUIRE((t != std::string::npos && l != std::string::npos));
    return std::stoll(s.substr(l + 7)) / std::stoll(s.substr(t + 9));
  };
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{1, 64, 96, 16}, {1, 61, 100, 16}, {1, 52, 100, 16}, {1, 44, 128, 16}})
    CHECK(tiles_per_raw_tile(shape) >= 2);
  check_reduce({1, 64, 96, 16}, 60);
  check_reduce({1, 61, 100, 16}, 61);
  check_reduce({1, 52, 100, 16}, 62, DataType::F16);
  check_reduce({1, 44, 128, 16}, 63);
  check_grads({{1, 61, 100, 16}, 64});
  check_grads({{1, 52, 100, 16}, 65, true});
  check_grads({{1, 44, 128, 16}, 66, false, DataType::F16});
  check_grads({{1, 64, 96, 16}, 67, true});
}

TEST_CASE("BNTraining channel sums: staggered first raw tiles, the sums within their bounds") {
  // ChannelSumSpec::stagger_first_tiles (ops/channel.h, BNTrainingUpdateGrad's): block b of B
  // first loads (b + 1) / B of a raw tile, then whole ones, so that the blocks' round trips fall
  // at different times. Taken where the vector cores' GM -> UB ports together outrun HBM and a
  // load's set_flag holds MTE2 (the 910b: fewer cycles, the sums within their bounds, added in
  // another order); elsewhere (the tiny chip) not: the same kernel, cycles and bits.
  using namespace compiler::ops;
  const ChipConfig& cfg = test_sim().config();
  const isa::CoreKind vk = cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE;
  const int64_t cores = cfg.core_kind(vk)->count, c = 64;
  const int64_t pixels = cores * 500 + 7;  // several raw tiles a block, a short last one
  const HostTensor x = random_tensor(DataType::F16, {pixels, c}, -2, 3, 90);
  const HostTensor dy = random_tensor(DataType::F16, {pixels, c}, -1, 1, 91);
  const HostTensor m = random_tensor(DataType::F32, {c}, 0, 1, 92);
  ChannelSumSpec s = update_grad_sums(pixels, c, isa::Dtype::F16);
  s.raw_tile_first = cfg.split;  // as BNTrainingUpdateGrad: sums in place here (else ping-pong,
                                 // which is not staggered)
  ChannelEpilogueSpec e;
  e.name = "TestSums";
  e.spread = true;
  e.c = c;
  e.outputs = 2;
  e.compute = [](compiler::KernelBuilder& b, const EpilogueOperands& o) {
    f32_copy(b, o.outputs[0], o.sums[0], *o.count);
    f32_copy(b, o.outputs[1], o.sums[1], *o.count);
  };
  const auto run_sums = [&](bool stagger, std::string& summary) {
    s.stagger_first_tiles = stagger;
    compiler::CompiledKernel k;
    k.outputs = {TensorDesc{DataType::F32, {c}}, TensorDesc{DataType::F32, {c}}};
    append_channel_sum_epilogue(k, "test", s, {input_ref(0), input_ref(1), input_ref(2)}, e,
                                {output_ref(0), output_ref(1)}, cfg,
                                channel_epilogue_in_kernel(cfg));
    summary = k.launches.front().summary;
    UNSCOPED_INFO(summary);
    return run_compiled(test_sim(), k, {x, dy, m});
  };
  std::string plain_summary, staggered_summary;
  const RunResult plain = run_sums(false, plain_summary);
  const RunResult staggered = run_sums(true, staggered_summary);
  const double k = static_cast<double>(pixels + 16);
  std::vector<double> sp(c), tsp(c), sdy(c), tsdy(c);
  for (int64_t j = 0; j < c; ++j)
    for (int64_t i = 0; i < pixels; ++i) {
      const double p = (at(x, i, j, c) - m.values[static_cast<size_t>(j)]) * at(dy, i, j, c);
      sp[j] += p;
      tsp[j] += (k + 2) * kE * std::fabs(p);
      sdy[j] += at(dy, i, j, c);
      tsdy[j] += k * kE * std::fabs(at(dy, i, j, c));
    }
  for (const RunResult* r : {&plain, &staggered}) {
    check_within_bounds(r->outputs[0].values, sp, tsp, "sum dy (x - m)");
    check_within_bounds(r->outputs[1].values, sdy, tsdy, "sum dy");
  }
  const double ports = static_cast<double>(cores) * cfg.path_rate(isa::Buf::GM, isa::Buf::UB);
  const bool pays =
      cfg.set_flag_holds_pipe && ports > cfg.hbm_bytes_per_cycle() * cfg.hbm_efficiency;
  WARN("plain " << plain.cycles << " cycles, staggered " << staggered.cycles);
  CHECK(plain_summary.find("staggered") == std::string::npos);
  CHECK((staggered_summary.find("first raw tiles staggered") != std::string::npos) == pays);
  if (pays) {
    CHECK(staggered.cycles < plain.cycles);
  } else {
    CHECK(staggered.cycles == plain.cycles);
    CHECK(staggered.outputs[0].values == plain.outputs[0].values);
    CHECK(staggered.outputs[1].values == plain.outputs[1].values);
  }
}

TEST_CASE("BNTraining channel sums: staggered where a block holds one raw tile and a part") {
  // ops/channel.cpp stagger_range_long_enough: a block's pixels more than one raw tile but
  // fewer than two whole ones are staggered too (BNTrainingUpdateGrad at 8x7x7x512 with the
  // mask, compiled for the 910b: 392 pixels in 44 blocks of 9, raw tiles of 8; a block loads two
  // raw tiles either way); NPUSIM_STAGGER_PARTIAL_TILES=0 keeps the rule of two whole ones. Both
  // ways the gradients within their bounds (the stagger changes which lanes add which pixels,
  // not the bounds).
  const ChipConfig b910 = load_chip_config("910b");
  const std::vector<int64_t> shape = {8, 7, 7, 512};
  const TensorDesc t{DataType::F16, shape}, v{DataType::F32, {512}};
  const OpDesc op =
      make_op("BNTrainingUpdateGrad", {t, t, v, v, v, v}, {{"epsilon", 0.001}, {"relu", true}});
  const auto staggered = [&] {
    const std::string summary = compiler::compile(op, b910).launches.front().summary;
    UNSCOPED_INFO(summary);
    REQUIRE(summary.find("44 blocks of 9 pixels") != std::string::npos);
    REQUIRE(summary.find("loaded 8 pixels at a time") != std::string::npos);
    return summary.find("first raw tiles staggered") != std::string::npos;
  };
  // (the values where the test chip is the 910b: the sums' in-kernel epilogue waits for all
  // 44 blocks at once, more vector cores than the tiny chip has)
  const bool on_910b = test_sim().config().name == b910.name;
  CHECK(staggered());
  if (on_910b) check_grads({shape, 140, true, DataType::F16});
  {
    ScopedEnv off("NPUSIM_STAGGER_PARTIAL_TILES", "0");
    CHECK_FALSE(staggered());
    if (on_910b) check_grads({shape, 140, true, DataType::F16});
  }
  {  // the switch takes unset, "0" or "1" only
    ScopedEnv bad("NPUSIM_STAGGER_PARTIAL_TILES", "yes");
    CHECK(compile_refusal(op, b910).message.find("NPUSIM_STAGGER_PARTIAL_TILES='yes'") !=
          std::string::npos);
  }
}

TEST_CASE("BNTraining channel sums: the most channels per tile first, whatever the L2") {
  // A 6144-pixel x 256-channel sum (6 MiB of f32) takes all 256 channels per tile
  // (ops/channel.cpp), compiled for the test chip with a 64 KiB L2 (which it overflows) and
  // with the test chip's own (8 MiB, which holds it). Same sums either way.
  ChipConfig small = test_sim().config();
  small.l2_bytes = 64 << 10;
  const TensorDesc x{DataType::F32, {1, 64, 96, 256}};
  const auto tiles = [](const ChipConfig& cfg, const TensorDesc& in) {
    auto k = compiler::compile(make_op("BNTrainingReduce", {in}, {}), cfg);
    std::string all;
    for (const auto& l : k.launches) all += l.summary + "\n";
    return all;
  };
  CHECK(tiles(small, x).find("x 256 channels") != std::string::npos);
  CHECK(tiles(test_sim().config(), x).find("x 256 channels") != std::string::npos);
  g_compile_for = &small;
  check_reduce({1, 64, 96, 256}, 50);
  check_reduce({1, 64, 96, 256}, 51, DataType::F16);
  check_grads({{1, 64, 96, 256}, 52});
  check_grads({{1, 64, 96, 256}, 53, true});
  // 2048 channels (ResNet-50's last stage): a pixel's f32 row of all of them would be a
  // 256-block repeat stride, one more than the stride fields hold, so the tile takes 1024.
  const TensorDesc wide{DataType::F32, {1, 4, 4, 2048}};
  CHECK(tiles(small, wide).find("x 1024 channels") != std::string::npos);
  check_reduce({1, 4, 4, 2048}, 54);
  check_grads({{1, 4, 4, 2048}, 55});
  g_compile_for = nullptr;
}

TEST_CASE("BNTraining ops refuse wrong inputs, naming them") {
  const TensorDesc x{DataType::F32, {2, 4, 4, 8}}, v{DataType::F32, {8}}, v7{DataType::F32, {7}};
  CHECK(compile_refusal(make_op("BNTrainingUpdate", {x, v, v, v}))
            .message.find("takes 5 inputs, 4 given") != std::string::npos);
  CHECK(compile_refusal(make_op("BNTrainingUpdateGrad", {x, x, v, v7}))
            .message.find("input 3 must be f32[8]") != std::string::npos);
  CHECK(compile_refusal(make_op("BNTrainingReduce", {TensorDesc{DataType::F32, {0, 4, 4, 8}}}))
            .message.find("non-empty batch") != std::string::npos);
  // the residual: of x's type and shape, R 0 or 1
  const TensorDesc x16{DataType::F16, {2, 4, 4, 8}};
  CHECK(compile_refusal(make_op("BNTrainingUpdate", {x, v, v, v, v, x16}, {{"R", int64_t{1}}}))
            .message.find("input 5 is f16[2,4,4,8], expected f32[2,4,4,8]") != std::string::npos);
  CHECK(compile_refusal(make_op("BNTrainingUpdate", {x, v, v, v, v}, {{"R", int64_t{1}}}))
            .message.find("takes 6 inputs, 5 given") != std::string::npos);
  CHECK(compile_refusal(make_op("BNTrainingUpdate", {x, v, v, v, v, x}, {{"R", int64_t{2}}}))
            .message.find("attribute R = 2: 0 or 1 expected") != std::string::npos);

  CHECK(compile_refusal(
            make_op("BNTrainingReduceGrad", {x, x, v, v, v, v, v}, {{"bias_grads", int64_t{2}}}))
            .message.find("bias_grads = 2: 0 or 1") != std::string::npos);
}

// Conflict cycles and busy cycles of the vector units (summed over the cores) in launch
// `launch` of `type` run on random inputs of `in` (the op's outputs into `outputs` if given).
std::pair<uint64_t, uint64_t> vector_bank_conflicts(
    const std::string& type, const std::vector<TensorDesc>& in,
    std::map<std::string, compiler::AttrValue> attrs, size_t launch,
    std::vector<HostTensor>* outputs = nullptr) {
  auto k = compiler::compile(make_op(type, in, std::move(attrs)), test_sim().config());
  std::vector<HostTensor> host;
  for (size_t i = 0; i < in.size(); ++i)
    host.push_back(random_tensor(in[i].dtype, in[i].shape, 0.5, 2, 70 + static_cast<uint32_t>(i)));
  const RunResult r = run_compiled(test_sim(), k, host);
  if (outputs) *outputs = r.outputs;
  uint64_t busy = 0, conflicts = 0;
  for (const auto& [name, core] : r.counters.at(launch).at("chip").items()) {
    if (!core.contains("v")) continue;
    const nlohmann::json& v = core.at("v");
    busy += v.at("busy_cycles").at("value").get<uint64_t>();
    if (v.contains("stall") && v.at("stall").contains("bank_conflict"))
      conflicts += v.at("stall").at("bank_conflict").at("value").get<uint64_t>();
  }
  return {conflicts, busy};
}

TEST_CASE("BNTrainingReduceGrad and BNTrainingUpdate: tiles in UB bank windows of their own") {
  // ops/batchnorm.cpp append_training_dx and BNTrainingUpdate's placed apply (ops/fused.cpp):
  // no instruction of a tile writes what it reads, and every instruction's tiles start in
  // different bank windows, so the vector unit's repeats rarely meet in a bank (what remains:
  // the f16 conversions, whose f16 side advances half as fast, the ReLU mask's constant
  // repeats and the once-per-block resident work). Measured on the 910b at this shape, the
  // share of the vector unit's busy cycles that are bank conflicts: the x gradient 13-14 %, the
  // apply 5 %, against 33-50 % and 39-40 % with the tiles in place and wherever the layout put
  // them. The memory-bound f32 passes keep that layout (the x gradient without the mask, the
  // apply). Values: check_grads and check_update.
  for (DataType dt : {DataType::F32, DataType::F16})
    for (bool relu : {false, true}) {
      const TensorDesc t{dt, {8, 32, 32, 64}}, v{DataType::F32, {64}};
      std::vector<TensorDesc> grad = {t, t, v, v, v, v, v};
      if (relu) grad.push_back(v);
      std::vector<std::tuple<std::string, std::vector<TensorDesc>, size_t>> placed;
      if (dt == DataType::F16 || relu) placed.emplace_back("BNTrainingReduceGrad", grad, 0);
      std::vector<std::map<std::string, compiler::AttrValue>> attrs(placed.size(),
                                                                    {{"relu", relu}});
      if (dt == DataType::F16) {
        placed.emplace_back("BNTrainingUpdate", std::vector<TensorDesc>{t, v, v, v, v}, 0);
        attrs.push_back({{"relu", relu}});
        // with the residual: y + r into x's widened tile, the ReLU from there into the output
        placed.emplace_back("BNTrainingUpdate", std::vector<TensorDesc>{t, v, v, v, v, t}, 0);
        attrs.push_back({{"relu", relu}, {"R", int64_t{1}}});
      }
      for (size_t p = 0; p < placed.size(); ++p) {
        const auto& [type, in, launch] = placed[p];
        const auto [conflicts, busy] = vector_bank_conflicts(type, in, attrs[p], launch);
        INFO(type << " " << compiler::data_type_name(dt) << (relu ? " relu" : "") << ": "
                  << conflicts << " conflict cycles of " << busy << " busy");
        REQUIRE(busy > 0);
        if (test_sim().config().ub_banks > 1) CHECK(conflicts * 5 < busy);
      }
    }
}

TEST_CASE(
    "BNTrainingUpdateGrad's ReLU-masked sums: per-channel vectors apart from their tiles' banks") {
  // ops/channel.cpp relu_mask_windows: a tile's per-pixel instructions (the pre-activation
  // a * fa + fs, the centring a - m) step their tiles by a pixel of C f32, an even number of
  // bank windows where C is a multiple of 128, so fa, fs and m in windows of the other parity
  // never share a bank with them; the select's 1.0f and 0.0f repeats sit past the mask bits'
  // windows. Against the layout before (NPUSIM_MASKED_SUM_WINDOWS=0, the same instructions):
  // fewer conflict cycles on a chip with UB banks (on the 910b, f16 C = 256: 5,718 -> 4,396 of
  // about 47,000 busy; the rest the sums added in place, the f16 widening and the flat tiles
  // meeting the constants), the same outputs bit for bit; on a chip without banks none either
  // way.
  const ChipConfig& cfg = test_sim().config();
  for (DataType dt : {DataType::F32, DataType::F16})
    for (int64_t c : {128, 256}) {
      const TensorDesc t{dt, {4, 8, 8, c}}, v{DataType::F32, {c}};
      const std::vector<TensorDesc> in = {t, t, v, v, v, v};
      std::vector<HostTensor> placed_out, before_out;
      const auto [placed, busy] =
          vector_bank_conflicts("BNTrainingUpdateGrad", in, {{"relu", true}}, 0, &placed_out);
      uint64_t before = 0;
      {
        ScopedEnv off("NPUSIM_MASKED_SUM_WINDOWS", "0");
        before = vector_bank_conflicts("BNTrainingUpdateGrad", in, {{"relu", true}}, 0, &before_out)
                     .first;
      }
      INFO(compiler::data_type_name(dt)
           << " C = " << c << ": " << placed << " conflict cycles "
           << "placed, " << before << " before, of " << busy << " busy");
      REQUIRE(busy > 0);
      if (cfg.ub_banks > 1)
        CHECK(placed < before);
      else
        CHECK(placed + before == 0);
      REQUIRE(placed_out.size() == 2);
      REQUIRE(before_out.size() == 2);
      for (size_t i = 0; i < 2; ++i) {  // bit for bit (NaN included)
        const std::vector<double>& a = placed_out[i].values;
        const std::vector<double>& b = before_out[i].values;
        REQUIRE(a.size() == b.size());
        CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
      }
    }
  ScopedEnv bad("NPUSIM_MASKED_SUM_WINDOWS", "yes");
  const TensorDesc t{DataType::F16, {4, 8, 8, 128}}, v{DataType::F32, {128}};
  CHECK(compile_refusal(make_op("BNTrainingUpdateGrad", {t, t, v, v, v, v}, {{"relu", true}}))
            .message.find("NPUSIM_MASKED_SUM_WINDOWS='yes' is neither '0' nor '1'") !=
        std::string::npos);
}

TEST_CASE("BNTrainingUpdateGrad's ReLU-masked sums of f16: dy masked in f16 before its widening") {
  // ops/channel.cpp masked_sum_f16_mask: the select of 1 or 0 and the product dy * factor run on
  // dy's f16 tile (half the repeats of f32), then the product is widened. dy * 1 and dy * 0 are
  // exact in f16 and widen exactly, so both sums are the f32 path's (NPUSIM_MASKED_SUM_F16_MASK=0)
  // bit for bit, ReluGrad's product included: an infinite dy where the ReLU is off makes its
  // channel's sums NaN either way. The vector unit is busy fewer cycles.
  for (int64_t c : {128, 256}) {
    const TensorDesc t{DataType::F16, {4, 8, 8, c}}, v{DataType::F32, {c}};
    const auto op = make_op("BNTrainingUpdateGrad", {t, t, v, v, v, v}, {{"relu", true}});
    std::vector<HostTensor> host = {
        random_tensor(t.dtype, t.shape, -1, 1, 91),     random_tensor(t.dtype, t.shape, -2, 2, 92),
        random_tensor(v.dtype, v.shape, -0.5, 0.5, 93), random_tensor(v.dtype, v.shape, 0.5, 2, 94),
        random_tensor(v.dtype, v.shape, 0.5, 2, 95),    random_tensor(v.dtype, v.shape, -1, 1, 96)};
    // Channel 3: x far below the mean (the ReLU off: mask 0) at the pixel with an infinite dy;
    // channel 5: a NaN dy at a pixel whose ReLU is on.
    host[1].values[static_cast<size_t>(7 * c + 3)] = -60000.0;
    host[0].values[static_cast<size_t>(7 * c + 3)] = INFINITY;
    host[1].values[static_cast<size_t>(9 * c + 5)] = 60000.0;
    host[0].values[static_cast<size_t>(9 * c + 5)] = NAN;
    const auto run = [&](const char* f16_mask) {
      ScopedEnv env("NPUSIM_MASKED_SUM_F16_MASK", f16_mask);
      const RunResult r =
          run_compiled(test_sim(), compiler::compile(op, test_sim().config()), host);
      uint64_t busy = 0;
      for (const auto& [name, core] : r.counters.at(0).at("chip").items())
        if (core.contains("v")) busy += core.at("v").at("busy_cycles").at("value").get<uint64_t>();
      return std::pair<std::vector<HostTensor>, uint64_t>{r.outputs, busy};
    };
    const auto [f16, f16_busy] = run("1");
    const auto [f32, f32_busy] = run("0");
    INFO("C = " << c << ": vector busy " << f16_busy << " (f16 mask) against " << f32_busy);
    CHECK(f16_busy < f32_busy);
    REQUIRE(f16.size() == 2);
    REQUIRE(f32.size() == 2);
    for (size_t i = 0; i < 2; ++i) {
      const std::vector<double>& a = f16[i].values;
      const std::vector<double>& b = f32[i].values;
      REQUIRE(a.size() == static_cast<size_t>(c));
      REQUIRE(b.size() == a.size());
      for (size_t k = 0; k < a.size(); ++k) {
        INFO("output " << i << " channel " << k << ": " << a[k] << " against " << b[k]);
        const bool nan = k == 3 || k == 5;  // masked inf: inf * 0; NaN * 1
        CHECK(std::isnan(a[k]) == nan);
        CHECK(std::isnan(b[k]) == nan);
        if (!nan) CHECK(std::memcmp(&a[k], &b[k], sizeof(double)) == 0);
      }
    }
  }
  ScopedEnv bad("NPUSIM_MASKED_SUM_F16_MASK", "yes");
  const TensorDesc t{DataType::F16, {4, 8, 8, 128}}, v{DataType::F32, {128}};
  CHECK(compile_refusal(make_op("BNTrainingUpdateGrad", {t, t, v, v, v, v}, {{"relu", true}}))
            .message.find("NPUSIM_MASKED_SUM_F16_MASK='yes' is neither '0' nor '1'") !=
        std::string::npos);
}

TEST_CASE("BNTraining channel sums: squares and products by vmla, the bits of vmul then vadd") {
  // On a chip with vector.multiply_accumulate (tiny and 910b: 910b.yaml) the channel sums add
  // each tile's squares (BNTrainingReduce, Conv2DBNTrainingReduce's vector side) or products
  // (BNTrainingUpdateGrad: dy (x - m)) by vmla into sums kept in place;
  // NPUSIM_VECTOR_MULTIPLY_ACCUMULATE=0 keeps vmul then vadd. vmla rounds the product first
  // (docs/assembly.md), so the outputs are the same bits either way. (The cycles are measured
  // at ResNet-50's shapes on the 910b, docs/compiler.md; at these small shapes on tiny the two
  // differ by a few cycles either way.)
  const ChipConfig& cfg = test_sim().config();
  REQUIRE(cfg.vector_multiply_accumulate);
  const auto uses_vmla = [&](const OpDesc& op) {
    bool any = false;
    for (const auto& l : compiler::compile(op, cfg).launches)
      any = any || l.kernel.listing.find("vmla.f32") != std::string::npos;
    return any;
  };
  // Runs `type` with and without vmla: the same bits, vmla in the kernels only when enabled.
  const auto compare = [&](const std::string& type, const std::vector<HostTensor>& in,
                           const std::map<std::string, compiler::AttrValue>& attrs,
                           size_t outputs) {
    INFO(type);
    std::vector<TensorDesc> descs;
    for (const HostTensor& t : in) descs.push_back(t.desc);
    const OpDesc op = make_op(type, descs, attrs);
    CHECK(uses_vmla(op));
    const RunResult with = run(type, in, attrs, outputs);
    RunResult without;
    {
      ScopedEnv off("NPUSIM_VECTOR_MULTIPLY_ACCUMULATE", "0");
      CHECK_FALSE(uses_vmla(op));
      without = run(type, in, attrs, outputs);
    }
    for (size_t i = 0; i < outputs; ++i) CHECK(with.outputs[i].values == without.outputs[i].values);
  };
  // BNTrainingReduce: a partial last tile, f16 and f32 (several tiles per block)
  for (DataType dt : {DataType::F32, DataType::F16}) {
    HostTensor x = random_tensor(dt, {4, 9, 9, 64}, -2, 3, 300);
    compare("BNTrainingReduce", {x}, {}, 2);
  }
  // BNTrainingUpdateGrad: the sum of dy (x - m) and of dy
  {
    const std::vector<int64_t> shape = {3, 7, 7, 32};
    HostTensor dy = random_tensor(DataType::F32, shape, -1, 1, 310);
    HostTensor x = random_tensor(DataType::F32, shape, -2, 3, 311);
    HostTensor mean = random_tensor(DataType::F32, {32}, 0, 1, 312);
    HostTensor var = random_tensor(DataType::F32, {32}, 0.5, 2, 313);
    compare("BNTrainingUpdateGrad", {dy, x, mean, var}, {{"epsilon", 0.001}, {"relu", false}}, 2);
  }
  // Conv2DBNTrainingReduce (split chips: the sums in the convolution's vector cores, per tile)
  if (cfg.split) {
    HostTensor x = random_tensor(DataType::F16, {4, 14, 14, 32}, 0, 1, 320);
    HostTensor w = random_tensor(DataType::F16, {3, 3, 32, 64}, -0.5, 0.5, 321);
    compare("Conv2DBNTrainingReduce", {x, w},
            {{"strides", std::vector<int64_t>{1, 1, 1, 1}}, {"padding", std::string("SAME")}}, 3);
  }
  {  // the switch takes unset, "0" or "1" only
    HostTensor x = random_tensor(DataType::F32, {2, 3, 5, 16}, -2, 3, 330);
    ScopedEnv bad("NPUSIM_VECTOR_MULTIPLY_ACCUMULATE", "yes");
    CHECK(compile_refusal(make_op("BNTrainingReduce", {x.desc}, {}))
              .message.find("NPUSIM_VECTOR_MULTIPLY_ACCUMULATE='yes'") != std::string::npos);
  }
}
