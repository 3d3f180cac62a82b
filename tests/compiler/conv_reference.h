// The convolution tests' references (tests/compiler/test_compiler_conv*.cpp): direct
// convolutions written here in double from the exact (rounded) inputs, and checks that compile an
// op for test_sim()'s chip, run it on the chip model and compare every output element.
//
// Tolerance per output element, with S = the sum of |products| it adds up and K their count:
//   cube accumulation: products of f16/bf16 values are exact in fp32 (11 + 11 significand
//     bits); each of the K fp32 additions errs by at most 2^-24 of a partial sum, itself at
//     most S: K * 2^-24 * S;
//   output rounding: half an ulp, 2^-11 |y| (f16), 2^-8 |y| (bf16), 2^-24 |y| (f32);
//   f32 inputs cast to f16 (allow_fp32_to_fp16): each factor off by 2^-11 relative, a product
//     by 2 * 2^-11 + 2^-22 < 2^-10: 2^-10 * S.
// The bound is doubled for slack. Padding taps and the zeros inserted for strided input
// gradients contribute exact zeros.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "isa/isa.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

namespace npusim::test::conv {

using compiler::DataType;
using compiler::PrecisionMode;
using compiler::TensorDesc;

inline double half_ulp(DataType t) {
  switch (t) {
    case DataType::F16: return std::ldexp(1.0, -11);
    case DataType::BF16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

// One spatial dimension, padded as TF does (independent of the compiler's conv_window).
struct Dim {
  int64_t in, k, s, d, before, after, out;
};
inline Dim tf_dim(int64_t in, int64_t k, int64_t s, int64_t d, const std::string& padding,
                  int64_t ex_before = 0, int64_t ex_after = 0) {
  const int64_t ek = (k - 1) * d + 1;
  Dim r{in, k, s, d, 0, 0, 0};
  if (padding == "VALID") {
    r.out = (in - ek + s) / s;
  } else if (padding == "SAME") {
    r.out = (in + s - 1) / s;
    const int64_t total = std::max<int64_t>((r.out - 1) * s + ek - in, 0);
    r.before = total / 2;
    r.after = total - r.before;
  } else {
    r.before = ex_before;
    r.after = ex_after;
    r.out = (in + ex_before + ex_after - ek) / s + 1;
  }
  return r;
}

// A convolution case: x [n, h, w, c], filter [kh, kw, c / groups, cout].
struct ConvCase {
  int64_t n, h, w, c, kh, kw, cout;
  int64_t sh = 1, sw = 1, dh = 1, dw = 1;
  std::string padding = "SAME";
  std::vector<int64_t> explicit_pads = {};  // top, bottom, left, right for EXPLICIT
  int64_t groups = 1;
  // This case with the given strides, dilations and padding (explicit: top, bottom, left,
  // right), in one expression.
  ConvCase window(int64_t sh_, int64_t sw_, int64_t dh_, int64_t dw_, std::string pad,
                  std::vector<int64_t> pads = {}) const {
    ConvCase c = *this;
    c.sh = sh_;
    c.sw = sw_;
    c.dh = dh_;
    c.dw = dw_;
    c.padding = std::move(pad);
    c.explicit_pads = std::move(pads);
    return c;
  }
  Dim dim_h() const {
    return tf_dim(h, kh, sh, dh, padding, explicit_pads.empty() ? 0 : explicit_pads[0],
                  explicit_pads.empty() ? 0 : explicit_pads[1]);
  }
  Dim dim_w() const {
    return tf_dim(w, kw, sw, dw, padding, explicit_pads.empty() ? 0 : explicit_pads[2],
                  explicit_pads.empty() ? 0 : explicit_pads[3]);
  }
  std::map<std::string, compiler::AttrValue> attrs() const {
    std::map<std::string, compiler::AttrValue> a = {
        {"strides", std::vector<int64_t>{1, sh, sw, 1}},
        {"dilations", std::vector<int64_t>{1, dh, dw, 1}},
        {"padding", padding},
        {"data_format", std::string("NHWC")}};
    if (padding == "EXPLICIT")
      a["explicit_paddings"] = std::vector<int64_t>{
          0, 0, explicit_pads[0], explicit_pads[1], explicit_pads[2], explicit_pads[3], 0, 0};
    return a;
  }
};

// Visits every (output pixel, tap) pair whose input pixel lies inside x (not in the padding):
// f(x pixel index, tap index, y pixel index), pixels counted over [n, h, w].
template <typename F>
void for_each_tap(const ConvCase& c, F&& f) {
  const Dim dh = c.dim_h(), dw = c.dim_w();
  for (int64_t n = 0; n < c.n; ++n)
    for (int64_t oh = 0; oh < dh.out; ++oh)
      for (int64_t ow = 0; ow < dw.out; ++ow)
        for (int64_t kh = 0; kh < c.kh; ++kh)
          for (int64_t kw = 0; kw < c.kw; ++kw) {
            const int64_t ih = oh * c.sh - dh.before + kh * c.dh;
            const int64_t iw = ow * c.sw - dw.before + kw * c.dw;
            if (ih < 0 || ih >= c.h || iw < 0 || iw >= c.w) continue;
            f((n * c.h + ih) * c.w + iw, kh * c.kw + kw, (n * dh.out + oh) * dw.out + ow);
          }
}

// Visits every (output position, tap, input channel, output channel) product of the forward
// convolution: f(x index, filter index, y index).
template <typename F>
void for_each_product(const ConvCase& c, F&& f) {
  const int64_t cin = c.c / c.groups, cg_out = c.cout / c.groups;
  for_each_tap(c, [&](int64_t xp, int64_t tap, int64_t yp) {
    for (int64_t co = 0; co < c.cout; ++co) {
      const int64_t g = co / cg_out;
      for (int64_t ci = 0; ci < cin; ++ci)
        f(xp * c.c + g * cin + ci, (tap * cin + ci) * c.cout + co, yp * c.cout + co);
    }
  });
}

// ---- what the test chip's cube can do (test_compiler_conv.cpp runs on any test chip) ----

// Whether the cube's tiles leave L0C through the UB (a coupled chip: no l0c->gm path), where
// y's rows and, with groups, each group's channels go in whole 32-byte blocks.
inline bool cube_out_via_ub() { return !test_sim().config().has_path(isa::Buf::L0C, isa::Buf::GM); }

// A chip override key of the test chip's cube core kind: "cores.<kind>.<rest>" (aic on split
// chips, aicore on coupled ones).
inline std::string cube_core_key(const std::string& rest) {
  const ChipConfig& cfg = test_sim().config();
  return "cores." + std::string(isa::core_kind_name(compiler::ops::cube_core(cfg, "test").kind)) +
         "." + rest;
}

// Runs `check` (a case of bf16 tensors) where the test chip's cube multiplies bf16; on other
// chips (the 310P's cube: f16 and int8; and its vector unit has no bf16 at all,
// vector.bf16_conversion) the compile must refuse it with a clear error.
template <typename F>
void check_bf16_case(F&& check) {
  const ChipConfig& cfg = test_sim().config();
  if (cfg.cube_bf16)
    check();
  else
    CHECK_THROWS_WITH(check(), Catch::Contains(cfg.vector_bf16_conversion
                                                   ? "bf16 is not supported by the cube"
                                                   : "dtype bf16 is not supported on chip"));
}

// For the cube convolution kernel run directly (build_cube_conv): through the UB y's rows
// must be whole 32-byte blocks, so the spec's row pitch is padded as the compiler pads it
// (CubeConvSpec::y_pitch); elsewhere y stays dense.
inline void pad_rows_for_test_chip(compiler::ops::CubeConvSpec& s) {
  if (!cube_out_via_ub()) return;
  const int64_t per_block = 32 / isa::dtype_size(s.out_type);
  s.y_pitch = (s.cy + per_block - 1) / per_block * per_block;
}
// y of rows of s.pitch() elements without the padding: the first s.cy of each row.
inline std::vector<double> unpadded_rows(const std::vector<double>& y,
                                         const compiler::ops::CubeConvSpec& s) {
  const size_t pitch = static_cast<size_t>(s.pitch()), cy = static_cast<size_t>(s.cy);
  std::vector<double> dense;
  dense.reserve(y.size() / pitch * cy);
  for (size_t row = 0; row + pitch <= y.size(); row += pitch)
    dense.insert(dense.end(), y.begin() + static_cast<std::ptrdiff_t>(row),
                 y.begin() + static_cast<std::ptrdiff_t>(row + cy));
  return dense;
}

struct Reference {
  std::vector<double> value, abs_sum;
  std::vector<int64_t> terms;
};

// Checks got against the reference with the tolerance of the file comment.
inline void check_against(const std::vector<double>& got, const Reference& r, DataType out,
                          bool cast16, const std::string& what) {
  REQUIRE(got.size() == r.value.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double tol = static_cast<double>(r.terms[i] + 1) * std::ldexp(1.0, -24) * r.abs_sum[i] +
                 half_ulp(out) * std::fabs(r.value[i]);
    if (cast16) tol += std::ldexp(1.0, -10) * r.abs_sum[i];
    tol *= 2;
    if (!(std::fabs(got[i] - r.value[i]) <= tol) && bad++ < 5)
      UNSCOPED_INFO(what << "[" << i << "] = " << got[i] << ", want " << r.value[i] << " +- "
                         << tol);
  }
  CHECK(bad == 0);
}

inline std::vector<int64_t> filter_shape(const ConvCase& c) {
  return {c.kh, c.kw, c.c / c.groups, c.cout};
}
inline std::vector<int64_t> y_shape(const ConvCase& c) {
  return {c.n, c.dim_h().out, c.dim_w().out, c.cout};
}

inline void summarize(const compiler::CompiledKernel& k) {
  for (const compiler::Launch& l : k.launches) UNSCOPED_INFO(l.summary);
}

// Returns per launch its kernel name and summary.
inline std::vector<std::string> check_conv2d(DataType dt, const ConvCase& c, uint32_t seed,
                                             PrecisionMode mode = PrecisionMode::kAllowFp32ToFp16,
                                             const ChipConfig* cfg = nullptr) {
  INFO(compiler::data_type_name(dt)
       << " x [" << c.n << "," << c.h << "," << c.w << "," << c.c << "] filter " << c.kh << "x"
       << c.kw << " -> " << c.cout << " stride " << c.sh << "x" << c.sw << " dilation " << c.dh
       << "x" << c.dw << " " << c.padding << " groups " << c.groups);
  HostTensor x = random_tensor(dt, {c.n, c.h, c.w, c.c}, -2, 2, seed);
  HostTensor f = random_tensor(dt, filter_shape(c), -1, 1, seed + 1);
  auto op = make_op("Conv2D", {x.desc, f.desc}, c.attrs());
  compiler::CompiledKernel k = compiler::compile(op, cfg ? *cfg : test_sim().config(), mode);
  summarize(k);
  REQUIRE(k.outputs[0] == (TensorDesc{dt, y_shape(c)}));
  RunResult r = run_compiled(test_sim(), k, {x, f});
  Reference ref;
  const size_t ny = static_cast<size_t>(k.outputs[0].num_elements());
  ref.value.assign(ny, 0);
  ref.abs_sum.assign(ny, 0);
  ref.terms.assign(ny, 0);
  for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
    const double p = x.values[static_cast<size_t>(xi)] * f.values[static_cast<size_t>(fi)];
    ref.value[static_cast<size_t>(yi)] += p;
    ref.abs_sum[static_cast<size_t>(yi)] += std::fabs(p);
    ++ref.terms[static_cast<size_t>(yi)];
  });
  const DataType rounded =
      dt == DataType::F32 && mode == PrecisionMode::kAllowMixPrecision ? DataType::F16 : dt;
  check_against(r.outputs[0].values, ref, rounded, dt == DataType::F32, "y");
  std::vector<std::string> launches;
  for (const compiler::Launch& l : k.launches)
    launches.push_back(l.kernel.program.name + ": " + l.summary);
  return launches;
}

inline Reference new_reference(size_t n) {
  Reference r;
  r.value.assign(n, 0);
  r.abs_sum.assign(n, 0);
  r.terms.assign(n, 0);
  return r;
}
inline void accumulate(Reference& r, int64_t i, double p) {
  r.value[static_cast<size_t>(i)] += p;
  r.abs_sum[static_cast<size_t>(i)] += std::fabs(p);
  ++r.terms[static_cast<size_t>(i)];
}

// The filter gradient's reference: dW[filter index] += x[x index] * dy[y index] over the
// forward's products, in double.
inline Reference filter_grad_reference(const ConvCase& c, const HostTensor& x,
                                       const HostTensor& dy) {
  Reference ref = new_reference(static_cast<size_t>(c.kh * c.kw * (c.c / c.groups) * c.cout));
  for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
    accumulate(ref, fi, x.values[static_cast<size_t>(xi)] * dy.values[static_cast<size_t>(yi)]);
  });
  return ref;
}

// Conv2DBackpropInput: dx[x index] += dy[y index] * f[filter index] over the forward's products.
// TF's full input list (input_sizes, filter, out_backprop) with input_sizes also as an
// attribute, or (data_only) just filter and out_backprop.
// What a Conv2DBackpropInput check ran: per launch its kernel name and summary, and dx.
struct BackpropInputRun {
  std::vector<std::string> launches;
  std::vector<double> dx;
};
// compile_for: the chip config it is compiled for (test_sim()'s if null; one whose kernels the
// test chip runs as they are, e.g. the test chip with a coarser alignment); run on test_sim().
inline BackpropInputRun check_conv2d_backprop_input(
    DataType dt, const ConvCase& c, uint32_t seed,
    PrecisionMode mode = PrecisionMode::kAllowFp32ToFp16, bool data_only = false,
    const ChipConfig* compile_for = nullptr) {
  Simulator& on = test_sim();
  INFO("BackpropInput " << compiler::data_type_name(dt) << " x [" << c.n << "," << c.h << "," << c.w
                        << "," << c.c << "] filter " << c.kh << "x" << c.kw << " -> " << c.cout
                        << " stride " << c.sh << "x" << c.sw << " dilation " << c.dh << "x" << c.dw
                        << " " << c.padding << " groups " << c.groups);
  HostTensor sizes{TensorDesc{DataType::S32, {4}},
                   {double(c.n), double(c.h), double(c.w), double(c.c)}};
  HostTensor f = random_tensor(dt, filter_shape(c), -1, 1, seed);
  HostTensor dy = random_tensor(dt, y_shape(c), -2, 2, seed + 1);
  auto op = data_only ? make_op("Conv2DBackpropInput", {f.desc, dy.desc}, c.attrs())
                      : make_op("Conv2DBackpropInput", {sizes.desc, f.desc, dy.desc}, c.attrs());
  op.attrs["input_sizes"] = std::vector<int64_t>{c.n, c.h, c.w, c.c};
  compiler::CompiledKernel k =
      compiler::compile(op, compile_for ? *compile_for : on.config(), mode);
  summarize(k);
  REQUIRE(k.outputs[0] == (TensorDesc{dt, {c.n, c.h, c.w, c.c}}));
  RunResult r = data_only ? run_compiled(on, k, {f, dy}) : run_compiled(on, k, {sizes, f, dy});
  Reference ref = new_reference(static_cast<size_t>(k.outputs[0].num_elements()));
  for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
    accumulate(ref, xi, dy.values[static_cast<size_t>(yi)] * f.values[static_cast<size_t>(fi)]);
  });
  check_against(r.outputs[0].values, ref, dt, dt == DataType::F32, "dx");
  BackpropInputRun run;
  for (const compiler::Launch& l : k.launches)
    run.launches.push_back(l.kernel.program.name + ": " + l.summary);
  run.dx = std::move(r.outputs[0].values);
  return run;
}

// Conv2DBackpropFilter: dW[filter index] += x[x index] * dy[y index].
// Returns per launch its kernel name and summary.
inline std::vector<std::string> check_conv2d_backprop_filter(
    DataType dt, const ConvCase& c, uint32_t seed,
    PrecisionMode mode = PrecisionMode::kAllowFp32ToFp16) {
  INFO("BackpropFilter " << compiler::data_type_name(dt) << " x [" << c.n << "," << c.h << ","
                         << c.w << "," << c.c << "] filter " << c.kh << "x" << c.kw << " -> "
                         << c.cout << " stride " << c.sh << "x" << c.sw << " dilation " << c.dh
                         << "x" << c.dw << " " << c.padding << " groups " << c.groups);
  HostTensor x = random_tensor(dt, {c.n, c.h, c.w, c.c}, -2, 2, seed);
  HostTensor sizes{TensorDesc{DataType::S32, {4}},
                   {double(c.kh), double(c.kw), double(c.c / c.groups), double(c.cout)}};
  HostTensor dy = random_tensor(dt, y_shape(c), -1, 1, seed + 1);
  auto op = make_op("Conv2DBackpropFilter", {x.desc, sizes.desc, dy.desc}, c.attrs());
  op.outputs = {TensorDesc{dt, filter_shape(c)}};
  compiler::CompiledKernel k = compiler::compile(op, test_sim().config(), mode);
  summarize(k);
  RunResult r = run_compiled(test_sim(), k, {x, sizes, dy});
  REQUIRE(k.outputs[0].num_elements() == c.kh * c.kw * (c.c / c.groups) * c.cout);
  const Reference ref = filter_grad_reference(c, x, dy);
  const DataType rounded =
      dt == DataType::F32 && mode == PrecisionMode::kAllowMixPrecision ? DataType::F16 : dt;
  check_against(r.outputs[0].values, ref, rounded, dt == DataType::F32, "dW");
  std::vector<std::string> launches;
  for (const compiler::Launch& l : k.launches) {
    launches.push_back(l.kernel.program.name + ": " + l.summary);
    // img2col(x) is made in L0A by the product's kernel (load3dt), never written to GM.
    CHECK(l.kernel.program.name.rfind("Img2col", 0) != 0);
  }
  return launches;
}

// Whether one of the launches' "name: summary" (check_conv2d_backprop_filter's list) starts
// with / contains `text`.
inline bool has_launch(const std::vector<std::string>& launches, const std::string& prefix) {
  return std::any_of(launches.begin(), launches.end(),
                     [&](const std::string& n) { return n.rfind(prefix, 0) == 0; });
}
inline bool mentions(const std::vector<std::string>& launches, const std::string& text) {
  return std::any_of(launches.begin(), launches.end(),
                     [&](const std::string& n) { return n.find(text) != std::string::npos; });
}

// Depthwise: x [n, h, w, c], filter [kh, kw, c, m] (the case's cout = c * m, groups unused);
// f(x index, filter index, y index) for every product.
template <typename F>
void for_each_depthwise_product(const ConvCase& c, int64_t m, F&& f) {
  for_each_tap(c, [&](int64_t xp, int64_t tap, int64_t yp) {
    for (int64_t ch = 0; ch < c.c; ++ch)
      for (int64_t q = 0; q < m; ++q)
        f(xp * c.c + ch, (tap * c.c + ch) * m + q, yp * c.c * m + ch * m + q);
  });
}

// kind 0: DepthwiseConv2dNative, 1: ...BackpropInput, 2: ...BackpropFilter. Returns the
// launches' summaries.
inline std::vector<std::string> check_depthwise(int kind, DataType dt, ConvCase c, int64_t m,
                                                uint32_t seed) {
  c.cout = c.c * m;
  const char* names[] = {"DepthwiseConv2dNative", "DepthwiseConv2dNativeBackpropInput",
                         "DepthwiseConv2dNativeBackpropFilter"};
  INFO(names[kind] << " " << compiler::data_type_name(dt) << " x [" << c.n << "," << c.h << ","
                   << c.w << "," << c.c << "] x " << m << " filter " << c.kh << "x" << c.kw
                   << " stride " << c.sh << "x" << c.sw << " dilation " << c.dh << "x" << c.dw
                   << " " << c.padding);
  const std::vector<int64_t> xs{c.n, c.h, c.w, c.c}, fs{c.kh, c.kw, c.c, m};
  HostTensor x = random_tensor(dt, xs, -2, 2, seed);
  HostTensor f = random_tensor(dt, fs, -1, 1, seed + 1);
  HostTensor dy = random_tensor(dt, y_shape(c), -1, 1, seed + 2);
  HostTensor sizes{TensorDesc{DataType::S32, {4}}, {}};
  compiler::OpDesc op;
  std::vector<HostTensor> ins;
  if (kind == 0) {
    op = make_op(names[0], {x.desc, f.desc}, c.attrs());
    ins = {x, f};
  } else if (kind == 1) {
    sizes.values = {double(c.n), double(c.h), double(c.w), double(c.c)};
    op = make_op(names[1], {sizes.desc, f.desc, dy.desc}, c.attrs());
    op.attrs["input_sizes"] = xs;
    ins = {sizes, f, dy};
  } else {
    sizes.values = {double(c.kh), double(c.kw), double(c.c), double(m)};
    op = make_op(names[2], {x.desc, sizes.desc, dy.desc}, c.attrs());
    op.attrs["filter_sizes"] = fs;
    ins = {x, sizes, dy};
  }
  compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
  summarize(k);
  RunResult r = run_compiled(test_sim(), k, ins);
  Reference ref = new_reference(static_cast<size_t>(k.outputs[0].num_elements()));
  for_each_depthwise_product(c, m, [&](int64_t xi, int64_t fi, int64_t yi) {
    const size_t xq = static_cast<size_t>(xi), fq = static_cast<size_t>(fi),
                 yq = static_cast<size_t>(yi);
    if (kind == 0) accumulate(ref, yi, x.values[xq] * f.values[fq]);
    if (kind == 1) accumulate(ref, xi, dy.values[yq] * f.values[fq]);
    if (kind == 2) accumulate(ref, fi, x.values[xq] * dy.values[yq]);
  });
  check_against(r.outputs[0].values, ref, dt, dt == DataType::F32, names[kind]);
  std::vector<std::string> summaries;
  for (const compiler::Launch& l : k.launches) summaries.push_back(l.summary);
  return summaries;
}

// The cube convolution kernel's spec for c's map and window (x NHWC [n, h, w, c], f16):
// images .. pr; the caller sets the groups and the weights' layout.
inline compiler::ops::CubeConvSpec cube_conv_geometry(const ConvCase& c) {
  const Dim dh = c.dim_h(), dw = c.dim_w();
  compiler::ops::CubeConvSpec s;
  s.images = c.n;
  s.hs = c.h;
  s.ws = c.w;
  s.cs = c.c;
  s.kh = c.kh;
  s.kw = c.kw;
  s.sh = c.sh;
  s.sw = c.sw;
  s.dh = c.dh;
  s.dw = c.dw;
  s.pt = dh.before;
  s.pb = dh.after;
  s.pl = dw.before;
  s.pr = dw.after;
  return s;
}

// The cube convolution kernel with block-diagonal groups (CubeConvSpec::b_diagonal) run
// directly: the depthwise convolution of x [n,h,w,c] by filter [kh,kw,c,m] (f16) as groups of
// one 16-channel block, `per` of them merged into each group (merge_diagonal_groups), the
// planner's tiling or (kc1 > 0) that tiling in chunks of kc1 channel blocks with resident or
// streamed weights. B is the block-diagonal filter Wbd[g][tap][c0][c0 * m + q] =
// filter[tap][16g + c0][q] (zeros elsewhere and past c) written here; y (c * m channels, rows
// of c * m elements, padded to whole 32-byte blocks on chips without an l0c->gm path) against the
// direct depthwise product. stack > 0 forces that many images per tall map. Returns the
// tiling's description.
inline std::string check_diagonal_groups(ConvCase c, int64_t m, int64_t per, int64_t kc1,
                                         bool resident, uint32_t seed, int64_t stack = 0) {
  c.cout = c.c * m;
  const Dim dh = c.dim_h(), dw = c.dim_w();
  const int64_t blocks = (c.c + 15) / 16, taps = c.kh * c.kw;
  compiler::ops::CubeConvSpec s = cube_conv_geometry(c);
  s.groups = blocks;
  s.cg_in = 16;
  s.cg_out = 16 * m;
  s.cy = c.c * m;
  s.b_tap = 256 * m;
  s.b_group = taps * s.b_tap;
  s.b_row = 16 * m;
  s = compiler::ops::merge_diagonal_groups(s, per, "test");
  pad_rows_for_test_chip(s);
  const ChipConfig& cfg = test_sim().config();
  auto t = compiler::ops::plan_cube_conv(s, cfg, "test", stack);
  if (kc1 > 0) t = compiler::ops::rechunk_cube_conv(s, t, kc1, resident, cfg, "test");
  INFO("x [" << c.n << "," << c.h << "," << c.w << "," << c.c << "] x " << m << ", " << per
             << " blocks per group: " << t.str());
  HostTensor x = random_tensor(DataType::F16, {c.n, c.h, c.w, c.c}, -2, 2, seed);
  HostTensor f = random_tensor(DataType::F16, {c.kh, c.kw, c.c, m}, -1, 1, seed + 1);
  HostTensor wbd{TensorDesc{DataType::F16, {blocks, taps, 16, 16 * m}},
                 std::vector<double>(static_cast<size_t>(blocks * taps * 256 * m), 0.0)};
  for (int64_t g = 0; g < blocks; ++g)
    for (int64_t tap = 0; tap < taps; ++tap)
      for (int64_t c0 = 0; c0 < 16 && 16 * g + c0 < c.c; ++c0)
        for (int64_t q = 0; q < m; ++q)
          wbd.values[static_cast<size_t>(((g * taps + tap) * 16 + c0) * 16 * m + c0 * m + q)] =
              f.values[static_cast<size_t>((tap * c.c + 16 * g + c0) * m + q)];
  Reference ref = new_reference(static_cast<size_t>(c.n * dh.out * dw.out * c.cout));
  for_each_depthwise_product(c, m, [&](int64_t xi, int64_t fi, int64_t yi) {
    accumulate(ref, yi, x.values[static_cast<size_t>(xi)] * f.values[static_cast<size_t>(fi)]);
  });
  compiler::CompiledKernel k;
  k.outputs = {TensorDesc{DataType::F16, {c.n, dh.out, dw.out, s.pitch()}}};
  k.launches = {compiler::ops::build_cube_conv(s, t, cfg, "test")};
  RunResult r = run_compiled(test_sim(), k, {x, wbd});
  check_against(unpadded_rows(r.outputs[0].values, s), ref, DataType::F16, false, "y");
  return t.str();
}

// Conv2DBatchNormInference (x, filter, scale, offset, mean, variance[, bias]): the reference
// is conv(x, filter) (+ bias) then the batch norm in double, y = (conv - mean) * a + offset
// with a = scale / sqrt(variance + eps) (then max(y, 0) with relu). The kernel rounds x and
// W * a to f16 (2^-11 each, the W * a product first 2^-24: under 2^-10 for a product, the
// cast16 term) and the fold's a and shift in f32 (a few 2^-24 relative, counted as terms of
// |shift| in the sums); ReLU moves no value further from the reference.
// x_type / y_type f16: the fp16 hand-off between two fused convolutions (Tx / Tout); the
// output is then rounded once to f16 (its half ulp in the bound). relu6: min(max(y, 0), 6)
// (MobileNet's; relu is then ignored, as the op does). residual (attribute R = 1, the last
// input, y's type and shape): y = act(round_y(bn) + residual), the add in y's type (the
// pre-add rounding, at most a half ulp of |bn|, counted as a term of |bn| and |residual|).
// Returns the launches' kernel names.
inline std::vector<std::string> check_conv2d_batch_norm(
    const ConvCase& c, bool relu, bool bias, uint32_t seed,
    PrecisionMode mode = PrecisionMode::kAllowFp32ToFp16, DataType x_type = DataType::F32,
    DataType y_type = DataType::F32, bool relu6 = false, bool residual = false) {
  INFO("Conv2DBatchNormInference x ["
       << c.n << "," << c.h << "," << c.w << "," << c.c << "] filter " << c.kh << "x" << c.kw
       << " -> " << c.cout << " stride " << c.sh << " groups " << c.groups << (relu ? " relu" : "")
       << (relu6 ? " relu6" : "") << (bias ? " bias" : "") << (residual ? " residual" : ""));
  const int64_t co = c.cout;
  HostTensor x = random_tensor(x_type, {c.n, c.h, c.w, c.c}, -2, 2, seed);
  HostTensor f = random_tensor(DataType::F32, filter_shape(c), -1, 1, seed + 1);
  HostTensor scale = random_tensor(DataType::F32, {co}, 0.5, 2, seed + 2);
  HostTensor offset = random_tensor(DataType::F32, {co}, -1, 1, seed + 3);
  HostTensor mean = random_tensor(DataType::F32, {co}, -0.5, 0.5, seed + 4);
  HostTensor var = random_tensor(DataType::F32, {co}, 0.1, 2, seed + 5);
  HostTensor b = random_tensor(DataType::F32, {co}, -1, 1, seed + 6);
  std::vector<HostTensor> inputs = {x, f, scale, offset, mean, var};
  if (bias) inputs.push_back(b);
  HostTensor res = random_tensor(y_type, y_shape(c), -4, 4, seed + 7);
  if (residual) inputs.push_back(res);
  std::vector<TensorDesc> descs;
  for (const HostTensor& t : inputs) descs.push_back(t.desc);
  auto attrs = c.attrs();
  attrs["epsilon"] = 0.001;
  if (residual) attrs["R"] = int64_t{1};
  attrs["relu"] = relu;
  attrs["relu6"] = relu6;
  attrs["Tx"] = std::string(compiler::data_type_name(x_type));
  attrs["Tout"] = std::string(compiler::data_type_name(y_type));
  compiler::CompiledKernel k = compiler::compile(make_op("Conv2DBatchNormInference", descs, attrs),
                                                 test_sim().config(), mode);
  summarize(k);
  REQUIRE(k.outputs[0] == (TensorDesc{y_type, y_shape(c)}));
  RunResult r = run_compiled(test_sim(), k, inputs);
  Reference ref = new_reference(static_cast<size_t>(k.outputs[0].num_elements()));
  std::vector<double> a(static_cast<size_t>(co));
  for (size_t j = 0; j < a.size(); ++j) a[j] = scale.values[j] / std::sqrt(var.values[j] + 0.001);
  for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
    accumulate(ref, yi,
               x.values[static_cast<size_t>(xi)] * f.values[static_cast<size_t>(fi)] *
                   a[static_cast<size_t>(yi % co)]);
  });
  for (size_t i = 0; i < ref.value.size(); ++i) {
    const size_t j = i % static_cast<size_t>(co);
    const double m = (bias ? b.values[j] : 0.0) - mean.values[j];
    const double shift = offset.values[j] + m * a[j];
    ref.value[i] += shift;
    ref.abs_sum[i] += 4 * (std::fabs(shift) + std::fabs(m * a[j]));
    ref.terms[i] += 4;
    if (residual) {
      ref.abs_sum[i] += std::fabs(ref.value[i]) + std::fabs(res.values[i]);
      ref.value[i] += res.values[i];
      ref.terms[i] += 1;
    }
    if (relu || relu6) ref.value[i] = std::max(ref.value[i], 0.0);
    if (relu6) ref.value[i] = std::min(ref.value[i], 6.0);
  }
  const DataType rounded = mode == PrecisionMode::kAllowMixPrecision || y_type == DataType::F16
                               ? DataType::F16
                               : DataType::F32;
  check_against(r.outputs[0].values, ref, rounded, true, "y");
  // Derived tensors: the batch norm's factor and shift (of its inputs), then for groups == 1
  // on a chip with a bias table (the batch norm folded into the convolution) or whose tiles
  // leave L0C through the UB (the shift added there) an f32 x's cast (an f16 x is read as it
  // is) and the folded filter (of the filter, scale and variance).
  std::vector<int> bn_inputs = {2, 3, 4, 5};
  if (bias) bn_inputs.push_back(6);
  REQUIRE(!k.derived.empty());
  CHECK(k.derived[0].inputs == bn_inputs);
  const ChipConfig& cfg = test_sim().config();
  if (c.groups == 1 &&
      (cfg.has_path(isa::Buf::L1, isa::Buf::BT) || !cfg.has_path(isa::Buf::L0C, isa::Buf::GM))) {
    const bool cast_x = x_type == DataType::F32;
    REQUIRE(k.derived.size() == (cast_x ? 3u : 2u));
    if (cast_x) CHECK(k.derived[1].inputs == std::vector<int>{0});
    CHECK(k.derived.back().inputs == std::vector<int>{1, 2, 5});
    // Kept in buffers of their own: the same outputs.
    RunResult own = run_compiled(test_sim(), k, inputs, /*own_derived=*/true);
    CHECK(own.outputs[0].values == r.outputs[0].values);
  }
  std::vector<std::string> names;
  for (const compiler::Launch& l : k.launches) names.push_back(l.kernel.program.name);
  return names;
}

// Conv2DBiasAdd (the graph fusion's Conv2D -> BiasAdd [-> Relu], f32) against the double
// reference sum x * f + bias [max 0], the convolution's tolerance with the bias as one more term.
// On a chip with a bias table and one group the bias is the cube's (no launch besides the
// casts and the convolution); otherwise one vector launch adds it after the convolution.
// dt: x, filter and y (f16: allow_mix_precision's graph pass); the bias is f32 either way.
inline void check_conv2d_bias_add(const ConvCase& c, bool relu, uint32_t seed,
                                  PrecisionMode mode = PrecisionMode::kAllowFp32ToFp16,
                                  DataType dt = DataType::F32) {
  INFO("Conv2DBiasAdd x [" << c.n << "," << c.h << "," << c.w << "," << c.c << "] filter " << c.kh
                           << "x" << c.kw << " -> " << c.cout << " stride " << c.sh << " groups "
                           << c.groups << (relu ? " relu " : " ") << compiler::data_type_name(dt));
  const int64_t co = c.cout;
  HostTensor x = random_tensor(dt, {c.n, c.h, c.w, c.c}, -2, 2, seed);
  HostTensor f = random_tensor(dt, filter_shape(c), -1, 1, seed + 1);
  HostTensor b = random_tensor(DataType::F32, {co}, -2, 2, seed + 2);
  auto attrs = c.attrs();
  attrs["relu"] = relu;
  compiler::CompiledKernel k = compiler::compile(
      make_op("Conv2DBiasAdd", {x.desc, f.desc, b.desc}, attrs), test_sim().config(), mode);
  summarize(k);
  REQUIRE(k.outputs[0] == (TensorDesc{dt, y_shape(c)}));
  compiler::CompiledKernel plain =
      compiler::compile(make_op("Conv2D", {x.desc, f.desc}, c.attrs()), test_sim().config(), mode);
  const bool cube_bias = c.groups == 1 && test_sim().config().has_path(isa::Buf::L1, isa::Buf::BT);
  CHECK(k.launches.size() == plain.launches.size() + (cube_bias ? 0 : 1));
  RunResult r = run_compiled(test_sim(), k, {x, f, b});
  Reference ref = new_reference(static_cast<size_t>(k.outputs[0].num_elements()));
  for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
    accumulate(ref, yi, x.values[static_cast<size_t>(xi)] * f.values[static_cast<size_t>(fi)]);
  });
  for (size_t i = 0; i < ref.value.size(); ++i) {
    const double bias = b.values[i % static_cast<size_t>(co)];
    ref.value[i] += bias;
    ref.abs_sum[i] += std::fabs(bias);
    ref.terms[i] += 1;
    if (relu) ref.value[i] = std::max(ref.value[i], 0.0);
  }
  check_against(r.outputs[0].values, ref,
                mode == PrecisionMode::kAllowMixPrecision ? DataType::F16 : dt, true, "y");
}

// Element (kh, kw, ci, co) of an HWIO filter of shape f in the blocked layout, written from the
// layout's definition (not the compiler's helper).
inline size_t blocked_index(const std::vector<int64_t>& f, int64_t kh, int64_t kw, int64_t ci,
                            int64_t co) {
  const int64_t block = co / 16, lane = co % 16;
  return static_cast<size_t>((((block * f[0] + kh) * f[1] + kw) * f[2] + ci) * 16 + lane);
}

// The HWIO tensor's values placed in the blocked layout (same shape, same element count).
inline HostTensor to_blocked(const HostTensor& hwio) {
  const std::vector<int64_t>& f = hwio.desc.shape;
  HostTensor b = hwio;
  size_t i = 0;
  for (int64_t kh = 0; kh < f[0]; ++kh)
    for (int64_t kw = 0; kw < f[1]; ++kw)
      for (int64_t ci = 0; ci < f[2]; ++ci)
        for (int64_t co = 0; co < f[3]; ++co)
          b.values[blocked_index(f, kh, kw, ci, co)] = hwio.values[i++];
  return b;
}

// attrs with the filter in blocks of 16 output channels (ops/conv.h kFilterLayoutN16).
inline std::map<std::string, compiler::AttrValue> with_layout(
    std::map<std::string, compiler::AttrValue> a) {
  a["filter_layout"] = std::string(compiler::ops::kFilterLayoutN16);
  return a;
}

}  // namespace npusim::test::conv
