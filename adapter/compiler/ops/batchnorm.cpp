// Batch normalisation, NHWC (data_format NHWC), x of type T in {f32, f16, bf16}, the
// per-channel tensors of type U = f32, as TensorFlow's CPU kernels
// (tensorflow/core/kernels/fused_batch_norm_op.cc) compute them, in f32:
//
// FusedBatchNormV3(x, scale, offset, mean, variance; epsilon, exponential_avg_factor,
//                  is_training) -> y, batch_mean, batch_variance, reserve_space_1,
//                                  reserve_space_2, reserve_space_3
//   training:  m = sum(x) * (1/R), v = sum((x - m)^2) * (1/R) (R = N*H*W, two passes),
//              y = (x - m) * (rsqrt(v + eps) * scale) + offset,
//              batch_mean = m, batch_variance = v * R/(R-1) (Bessel; with f = exponential_avg_
//              factor != 1 both blended with the inputs: (1-f) * old + f * new),
//              reserve_space_1 = m, reserve_space_2 = v (biased).
//   inference: y with the given mean and variance; batch_mean / batch_variance and the reserve
//              spaces are copies of them (TF leaves the reserve spaces unspecified).
//   reserve_space_3: a scalar 0 (TF's CPU kernel's dummy).
// FusedBatchNormGradV3(y_backprop, x, scale, reserve_space_1, reserve_space_2,
//                      reserve_space_3; epsilon, is_training)
//   -> x_backprop, scale_backprop, offset_backprop, reserve_space_4 [0], reserve_space_5 [0]
//   r = rsqrt(var + eps), Sdy = sum(dy), Sdyx = sum(dy * (x - mean)),
//   scale_backprop = Sdyx * r, offset_backprop = Sdy,
//   training:  x_backprop = scale*r * ((dy - Sdy/R) - (x - mean) * r^2 * Sdyx/R),
//   inference: x_backprop = dy * (scale * r).
//
// The training fusions of the TF plugin's graph pass (CANN's op types; T = float, R = N*H*W,
// every per-channel tensor f32 [C]; graph_fusion.h says what each replaces):
//   BNTrainingReduce(x) -> sum = sum(x), square_sum = sum(x^2): one pass over x.
//   BNTrainingUpdate(x, sum, square_sum, scale, offset; epsilon, relu)
//     -> y, batch_mean, batch_variance:  m = sum / R, v = max(square_sum / R - m^2, 0) (biased),
//     a = rsqrt(v + eps) * scale, y = x * a + (offset - m * a) [then max(y, 0)]: one launch, one
//     pass over x (the statistics and the fold per block on the resident vectors; C not a
//     multiple of 8: a per-channel launch first). With attribute R = 1 (the graph pass's
//     residual add and ReLU folded in, CANN's BNTrainingUpdate + Add + ReLU fusion) input 5 is
//     a residual r of x's type and shape, loaded beside x: y = act(round_T(x * a + shift) + r),
//     the add and the ReLU in T as the unfused AddRelu computes them (bit for bit), relu then
//     applying after the add only.
//   BNTrainingUpdateGrad(dy, x, batch_mean, batch_variance; epsilon) -> diff_scale, diff_offset:
//     diff_offset = sum(dy), diff_scale = sum(dy * (x - m)) * rsqrt(v + eps): one pass over
//     dy and x.
//   BNTrainingReduceGrad(dy, x, diff_scale, diff_offset, scale, batch_mean, batch_variance;
//     epsilon) -> dx = c1 * ((dy - diff_offset / R) - (x - m) * c2), c1 = scale * r,
//     c2 = r * diff_scale / R, r = rsqrt(v + eps): one pass over dy and x. With bias_grads = 1 also
//     bias_grad = sum(dx) per channel (the convolution's bias gradient), from that pass.
//   With relu = true (the graph pass's ReluGrad folded in, CANN's fusion of the ReLU's gradient
//   into the batch norm's): BNTrainingUpdateGrad takes scale and offset as inputs 4 and 5,
//   BNTrainingReduceGrad offset as input 7, and both read dy as the gradient of the ReLU's
//   output y = relu(x * a + shift) of BNTrainingUpdate(relu = true), taking it back through the
//   ReLU on the fly: dy * (x * a + shift > 0 ? 1 : 0), as ReluGrad(dy, y). a and shift are
//   recomputed from batch_mean, batch_variance, scale and offset with BNTrainingUpdate's
//   instructions (bnt_fold), so x * a + shift is y's pre-activation bit for bit and the mask is
//   ReluGrad's; y is not read (one pass over dy and x each, as without the ReLU). T = f32 or
//   f16 (allow_mix_precision): for f16, y is rounded to f16 after the ReLU, and ReluGrad reads
//   that; the mask compares the f32 pre-activation with the largest f32 that rounds to f16 +0
//   instead of 0 (channel.h relu_mask_threshold), which is the same test.
//   The variance from the sum of squares (as CANN's BNTrainingReduce) loses precision where
//   |mean| >> std (cancellation, relative error about 2^-24 * mean^2 / v), which a batch norm
//   after a convolution does not see in practice; TF's graph subtracts the mean first.
//
// Launches: per-channel sums on the vector cores (ops/channel.h: each block sums a range of
// pixels, an epilogue kernel adds the blocks' partials and does the per-channel math), then
// the element-wise pass (the streaming kernel, per-channel vectors resident in the UB). Sums
// are formed in a different order than Eigen's (see channel.h), so results agree within f32
// rounding, not bit for bit. Channels whose C * sizeof(T) is not a multiple of 32 are summed
// from a channel-padded copy of the tensors in the workspace (a launch per tensor and per
// vector the sums read), except where C is a multiple of 8 (f16 / bf16 C = 8, 24, 40, ...):
// there the sums read x and dy where they are, as rows of two pixels (whole blocks), and fold
// each row's two pixels back to channels with the blocks' partials (ChannelSumSpec::channels;
// NPUSIM_BN_RAGGED_CHANNELS=0: the padded copies).
#include <optional>

#include <fmt/format.h>

#include "adapter/compiler/ops/batchnorm.h"
#include "adapter/compiler/ops/channel.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/fused.h"
#include "adapter/compiler/ops/registry.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

// The elements of the f32 work pieces of the training passes streamed in pieces on split chips
// (StreamSpec::work_piece: BNTrainingReduceGrad's x gradient, BNTrainingUpdate's apply;
// measured, docs/compiler.md "The x gradient in pieces").
constexpr int64_t kBnTrainingWorkPiece = 2048;

// A tensor as a channel sum reads it: rows of cp channels (ChannelSumSpec::cp), with channels
// != 0 rows of cp / channels whole pixels of the tensor itself (ChannelSumSpec::channels).
struct Padded {
  ArgRef ref;
  int64_t cp = 0, channels = 0;
  // The channel pitch of the sums' partials (ChannelSumLaunch::partial_pitch).
  int64_t pitch() const { return channels ? channels : cp; }
  void set(ChannelSumSpec& s) const {
    s.cp = cp;
    s.channels = channels;
  }
};

// [pixels, c] tensor `src` of type dt in the layout the channel sums need: the tensor itself
// where c * size is whole blocks, or where the sums can read it in rows of whole
// pixels (channel_sum_row: c a multiple of 8, e.g. f16's 24 or 40); else a copy with the
// channels padded to whole blocks in the workspace (a launch).
Padded padded(CompiledKernel& k, const OpDesc& op, const ArgRef& src, int64_t pixels, int64_t c,
              DataType dt, const ChipConfig& cfg) {
  const int64_t size = data_type_bytes(dt), cp = round_up(c, std::max<int64_t>(8, 32 / size));
  if (cp == c) return {src, c};
  if (const std::optional<ChannelSumRow> row = channel_sum_row(pixels, c, size))
    return {src, row->cp, row->channels};
  ArgRef ws = workspace_take(k, static_cast<uint64_t>(pixels * cp * size));
  append_channel_pad(k, op, src, ws, pixels, c, cp, dt, cfg);
  return {ws, cp};
}

// Appends a channel sum; returns the partials' workspace ref and their rows of
// ChannelSumLaunch::partial_pitch channels per item (the blocks, or with s.channels the rows
// of pixels; with s.plain_sum, *plain gets the second partials' ref).
std::pair<ArgRef, int> append_sum(CompiledKernel& k, const OpDesc& op, ChannelSumSpec s,
                                  std::vector<ArgRef> ins, const ChipConfig& cfg,
                                  ArgRef* plain = nullptr) {
  ChannelSumLaunch cs = build_channel_sum(s, cfg, op.str());
  const uint64_t bytes = static_cast<uint64_t>(s.batch * cs.blocks * s.cp) * 4;
  const ArgRef partials = workspace_take(k, bytes);
  ins.push_back(partials);
  if (s.plain_sum) {
    *plain = workspace_take(k, bytes);
    ins.push_back(*plain);
  }
  k.launches.push_back(with_args(std::move(cs.launch), ins));
  return {partials, cs.partial_rows};
}

// A vector launch writing f32 `value` to every element of the output `out` (index).
void append_fill(CompiledKernel& k, const OpDesc& op, int out, const TensorDesc& desc, double value,
                 const ChipConfig& cfg) {
  if (desc.num_elements() == 0) return;
  StreamSpec spec;
  spec.kernel_name = "FillF32";
  spec.out_type = Dtype::F32;
  spec.out_shape = desc.shape;
  const int64_t bits = vector_scalar_bits(Dtype::F32, value);
  spec.compute = [bits](KernelBuilder& b, const TileOperands& t) {
    Reg v = b.reg_imm("value", bits);
    vec_dup_bits(b, 4, t.out, v, *t.count);
  };
  k.launches.push_back(with_args(build_stream_kernel(op.str(), spec, cfg), {output_ref(out)}));
}

// The element-wise pass: out = f(tensors, per-channel vectors), computed in f32. compute's
// temps: `temps` f32 tiles, then `extra_temps` (whose constants `prologue` fills, given every
// temp of the kernel: for f16 / bf16 the widened tensors' come first).
void append_elementwise(
    CompiledKernel& k, const OpDesc& op, const std::string& name, const std::vector<int64_t>& shape,
    DataType dt, const std::vector<ArgRef>& tensors, const std::vector<ArgRef>& vectors,
    const ArgRef& out, int temps,
    std::function<void(KernelBuilder&, const TileOperands&,
                       const std::vector<uint64_t>& f32_tensors)>
        compute,
    const ChipConfig& cfg, const std::vector<TempSpec>& extra_temps = {},
    std::function<void(KernelBuilder&, const std::vector<uint64_t>&)> prologue = {},
    std::function<void(KernelBuilder&, const TileOperands&)> resident = {}) {
  const int64_t c = shape.back();
  StreamSpec spec;
  spec.kernel_name = name;
  spec.out_type = device_dtype(dt);
  spec.out_shape = shape;
  for (size_t i = 0; i < tensors.size(); ++i)
    spec.inputs.push_back(StreamInput{device_dtype(dt), broadcast_view(shape, shape), shape});
  for (size_t i = 0; i < vectors.size(); ++i)
    spec.inputs.push_back(StreamInput{Dtype::F32, broadcast_view({c}, shape), {c}});
  const bool widen = dt != DataType::F32;
  const size_t nt = tensors.size();
  for (size_t i = 0; i < (widen ? nt : 0) + static_cast<size_t>(temps); ++i)
    spec.temps.push_back(TempSpec{fmt::format("f32 {}", i), 4, 0});
  spec.temps.insert(spec.temps.end(), extra_temps.begin(), extra_temps.end());
  spec.prologue = std::move(prologue);
  spec.compute = [=](KernelBuilder& b, const TileOperands& t) {
    std::vector<uint64_t> f32;
    for (size_t i = 0; i < nt; ++i) {
      if (widen) {
        vec_convert(b, Dtype::F32, device_dtype(dt), t.temp[i], t.in[i], RoundMode::kRint,
                    *t.count);
        f32.push_back(t.temp[i]);
      } else {
        f32.push_back(t.in[i]);
      }
    }
    TileOperands u = t;
    u.temp.assign(t.temp.begin() + (widen ? static_cast<long>(nt) : 0), t.temp.end());
    u.in.assign(t.in.begin() + static_cast<long>(nt), t.in.end());  // the vectors
    compute(b, u, f32);
  };
  // The once-per-block work on the vectors' resident tiles, given the operands as compute's.
  if (resident)
    spec.resident_compute = [=](KernelBuilder& b, const TileOperands& t) {
      TileOperands u = t;
      u.temp.assign(t.temp.begin() + (widen ? static_cast<long>(nt) : 0), t.temp.end());
      u.in.assign(t.in.begin() + static_cast<long>(nt), t.in.end());
      resident(b, u);
    };
  std::vector<ArgRef> args = tensors;
  args.insert(args.end(), vectors.begin(), vectors.end());
  args.push_back(out);
  k.launches.push_back(with_args(build_stream_kernel(op.str(), spec, cfg), args));
}

// Writes f32 result `r` to the output tile in the output type.
void store_f32(KernelBuilder& b, const TileOperands& t, uint64_t r, DataType dt) {
  if (dt == DataType::F32) {
    if (r != t.out) vec_copy_bits(b, 4, t.out, r, *t.count);
  } else {
    vec_convert(b, device_dtype(dt), Dtype::F32, t.out, r, RoundMode::kRint, *t.count);
  }
}

// Appends copies of the f32 [c] vectors `vs` into new cp-long workspace buffers (their first c
// elements), one launch (a channel epilogue named `name`) for all of them; returns the copies in
// vs's order.
std::vector<ArgRef> append_vector_copies(CompiledKernel& k, const OpDesc& op,
                                         const std::vector<ArgRef>& vs, int64_t c, int64_t cp,
                                         const char* name, const ChipConfig& cfg) {
  std::vector<ArgRef> copies, args = vs;
  for (size_t i = 0; i < vs.size(); ++i)
    copies.push_back(workspace_take(k, static_cast<uint64_t>(cp) * 4));
  args.insert(args.end(), copies.begin(), copies.end());
  ChannelEpilogueSpec e;
  e.name = name;
  e.c = c;
  e.vectors = e.outputs = static_cast<int>(vs.size());
  e.compute = [](KernelBuilder& b, const EpilogueOperands& o) {
    for (size_t i = 0; i < o.vectors.size(); ++i) f32_copy(b, o.outputs[i], o.vectors[i], *o.count);
  };
  k.launches.push_back(with_args(build_channel_epilogue(e, cfg, op.str()), args));
  return copies;
}

DataType bn_dtype(const OpDesc& op, std::initializer_list<size_t> tensors,
                  std::initializer_list<size_t> vectors, int64_t* c) {
  DataType dt = op.inputs[*tensors.begin()].dtype;
  const std::vector<int64_t>& shape = op.inputs[*tensors.begin()].shape;
  if (shape.size() != 4)
    op.invalid(fmt::format("x must have rank 4 (NHWC), got {}", shape_str(shape)));
  for (size_t i : tensors)
    if (op.inputs[i].dtype != dt || op.inputs[i].shape != shape)
      op.invalid(fmt::format("input {} is {}, expected {}", i, op.inputs[i].str(),
                             TensorDesc{dt, shape}.str()));
  if (dt != DataType::F32 && dt != DataType::F16 && dt != DataType::BF16)
    op.fail(fmt::format("T = {} is not supported (f32, f16, bf16)", data_type_name(dt)));
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match x's {}", data_type_name(*t),
                        data_type_name(dt)));
  if (auto u = op.attr_type("U"); u && *u != DataType::F32)
    op.fail(fmt::format("U = {} is not supported (f32)", data_type_name(*u)));
  const std::string f = op.attr_string("data_format", "NHWC");
  if (f != "NHWC") op.fail(fmt::format("data_format {} is not supported (NHWC only)", f));
  *c = shape[3];
  for (size_t i : vectors)
    if (op.inputs[i].dtype != DataType::F32 || op.inputs[i].shape != std::vector<int64_t>{*c})
      op.invalid(fmt::format("input {} must be f32[{}], got {}", i, *c, op.inputs[i].str()));
  return dt;
}

CompiledKernel compile_fused_batch_norm(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const ChipConfig& cfg = ctx.cfg;
  if (op.inputs.size() != 5) op.fail(fmt::format("takes 5 inputs, {} given", op.inputs.size()));
  const bool training = op.attr_bool("is_training", true);
  const double eps = op.attr_float("epsilon", 0.0001);
  const double factor = op.attr_float("exponential_avg_factor", 1.0);
  int64_t c = 0;
  const DataType dt = training && factor == 1.0 ? bn_dtype(op, {0}, {1, 2}, &c)
                                                : bn_dtype(op, {0}, {1, 2, 3, 4}, &c);
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const int64_t pixels = shape[0] * shape[1] * shape[2];
  const TensorDesc vec{DataType::F32, {c}};
  CompiledKernel k;
  k.outputs = {TensorDesc{dt, shape}, vec, vec, vec, vec, TensorDesc{DataType::F32, {}}};
  const bool blend = training && factor != 1.0;
  if (pixels == 0 || c == 0) {  // TF: NaN statistics for an empty batch
    for (int o = 1; o <= 4; ++o) append_fill(k, op, o, vec, NAN, cfg);
    append_fill(k, op, 5, k.outputs[5], 0, cfg);
    return k;
  }
  const ArgRef scale = input_ref(1), offset = input_ref(2);
  ArgRef mean = input_ref(3), a = workspace_take(k, static_cast<uint64_t>(c) * 4);
  if (training) {
    const Padded x = padded(k, op, input_ref(0), pixels, c, dt, cfg);
    const ArgRef mean_ws = workspace_take(k, static_cast<uint64_t>(x.cp) * 4);
    ChannelSumSpec s;
    s.a_type = device_dtype(dt);
    s.pixels = pixels;
    x.set(s);
    auto [s1, b1] = append_sum(k, op, s, {x.ref}, cfg);
    ChannelEpilogueSpec e1;
    e1.name = "BatchNormMean";
    e1.c = c;
    e1.partial_cp = x.pitch();
    e1.partial_blocks = {b1};
    e1.outputs = 1;
    const double inv = static_cast<float>(1.0f / static_cast<float>(pixels));
    e1.compute = [inv](KernelBuilder& b, const EpilogueOperands& o) {
      f32_scalar(b, Opcode::op_vmuls, o.outputs[0], o.sums[0], inv, *o.count);  // sum * (1/R)
    };
    k.launches.push_back(with_args(build_channel_epilogue(e1, cfg, op.str()), {s1, mean_ws}));
    s.kind = ChannelSumSpec::Kind::kSumSquares;
    s.centered = true;
    auto [s2, b2] = append_sum(k, op, s, {x.ref, mean_ws}, cfg);
    ChannelEpilogueSpec e2;
    e2.name = "BatchNormVariance";
    e2.c = c;
    e2.partial_cp = x.pitch();
    e2.partial_blocks = {b2};
    e2.vectors = blend ? 4 : 2;  // scale, mean (, old mean, old variance)
    e2.outputs = 5;              // batch_mean, batch_variance, reserve 1, reserve 2, a
    e2.temps = 1;
    const double adjust = static_cast<float>(static_cast<float>(pixels) /
                                             static_cast<float>(std::max<int64_t>(pixels - 1, 1)));
    e2.compute = [=](KernelBuilder& b, const EpilogueOperands& o) {
      const Reg& n = *o.count;
      const uint64_t var = o.outputs[3], m = o.vectors[1];
      f32_scalar(b, Opcode::op_vmuls, var, o.sums[0], inv, n);  // v = sum * (1/R)
      f32_copy(b, o.outputs[2], m, n);
      // a = rsqrt(v + eps) * scale
      f32_scalar(b, Opcode::op_vadds, o.temps[0], var, eps, n);
      f32_unary(b, Opcode::op_vrsqrt, o.temps[0], o.temps[0], n);
      f32_binary(b, Opcode::op_vmul, o.outputs[4], o.temps[0], o.vectors[0], n);
      if (!blend) {
        f32_copy(b, o.outputs[0], m, n);
        f32_scalar(b, Opcode::op_vmuls, o.outputs[1], var, adjust, n);
        return;
      }
      // (1 - f) * old + f * new (the variance's new value with Bessel's correction)
      f32_scalar(b, Opcode::op_vmuls, o.outputs[0], o.vectors[2],
                 static_cast<float>(1.0f - static_cast<float>(factor)), n);
      f32_scalar(b, Opcode::op_vmuls, o.temps[0], m, static_cast<float>(factor), n);
      f32_binary(b, Opcode::op_vadd, o.outputs[0], o.outputs[0], o.temps[0], n);
      f32_scalar(b, Opcode::op_vmuls, o.outputs[1], o.vectors[3],
                 static_cast<float>(1.0f - static_cast<float>(factor)), n);
      f32_scalar(b, Opcode::op_vmuls, o.temps[0], var,
                 static_cast<float>(static_cast<float>(factor) * static_cast<float>(adjust)), n);
      f32_binary(b, Opcode::op_vadd, o.outputs[1], o.outputs[1], o.temps[0], n);
    };
    std::vector<ArgRef> args = {s2, scale, mean_ws};
    if (blend) {
      args.push_back(input_ref(3));
      args.push_back(input_ref(4));
    }
    for (int i = 1; i <= 4; ++i) args.push_back(output_ref(i));
    args.push_back(a);
    k.launches.push_back(with_args(build_channel_epilogue(e2, cfg, op.str()), args));
    mean = mean_ws;
  } else {
    ChannelEpilogueSpec e;
    e.name = "BatchNormInference";
    e.c = c;
    e.vectors = 3;  // scale, mean, variance
    e.outputs = 5;  // batch_mean, batch_variance, reserve 1, reserve 2, a
    e.compute = [eps](KernelBuilder& b, const EpilogueOperands& o) {
      const Reg& n = *o.count;
      f32_copy(b, o.outputs[0], o.vectors[1], n);
      f32_copy(b, o.outputs[2], o.vectors[1], n);
      f32_copy(b, o.outputs[1], o.vectors[2], n);
      f32_copy(b, o.outputs[3], o.vectors[2], n);
      f32_scalar(b, Opcode::op_vadds, o.outputs[4], o.vectors[2], eps, n);
      f32_unary(b, Opcode::op_vrsqrt, o.outputs[4], o.outputs[4], n);
      f32_binary(b, Opcode::op_vmul, o.outputs[4], o.outputs[4], o.vectors[0], n);
    };
    k.launches.push_back(with_args(build_channel_epilogue(e, cfg, op.str()),
                                   {scale, input_ref(3), input_ref(4), output_ref(1), output_ref(2),
                                    output_ref(3), output_ref(4), a}));
  }
  // y = (x - mean) * a + offset
  append_elementwise(
      k, op, fmt::format("BatchNorm_{}", data_type_name(dt)), shape, dt, {input_ref(0)},
      {mean, a, offset}, output_ref(0), 1,
      [dt](KernelBuilder& b, const TileOperands& t, const std::vector<uint64_t>& x) {
        const uint64_t r = t.temp[0];
        vec_binary(b, Opcode::op_vsub, Dtype::F32, r, x[0], t.in[0], *t.count);
        vec_binary(b, Opcode::op_vmul, Dtype::F32, r, r, t.in[1], *t.count);
        vec_binary(b, Opcode::op_vadd, Dtype::F32, r, r, t.in[2], *t.count);
        store_f32(b, t, r, dt);
      },
      cfg);
  append_fill(k, op, 5, k.outputs[5], 0, cfg);
  return k;
}

// The skeleton of a training x gradient's stream kernel: dy (input 0) and x (input 1) of dt
// streamed, then the f32 [c] `vectors` broadcast over them (window `windows[i]`, period_only
// `period_only[i]`), output 0 of dt; with dt != f32 the f32 tiles "dy (f32)" and "x (f32)"
// (temps 0 and 1, windows 0 and 1, the tensors' own tiles in 1 and 0). placed = false: no
// windows at all.
StreamSpec training_dx_spec(const std::string& name, const std::vector<int64_t>& shape, DataType dt,
                            bool placed, const std::vector<int>& windows,
                            const std::vector<bool>& period_only = {}) {
  const Dtype t_dev = device_dtype(dt);
  const bool widen = dt != DataType::F32;
  const auto window = [placed](int w) { return placed ? w : -1; };
  const int64_t c = shape.back();
  StreamSpec spec;
  spec.kernel_name = name;
  spec.out_type = t_dev;
  spec.out_shape = shape;
  spec.out_window = window(2);
  spec.inputs.push_back(
      StreamInput{t_dev, broadcast_view(shape, shape), shape, window(widen ? 1 : 0)});
  spec.inputs.push_back(
      StreamInput{t_dev, broadcast_view(shape, shape), shape, window(widen ? 0 : 1)});
  for (size_t i = 0; i < windows.size(); ++i) {
    spec.inputs.push_back(
        StreamInput{Dtype::F32, broadcast_view({c}, shape), {c}, window(windows[i])});
    spec.inputs.back().period_only = i < period_only.size() && period_only[i];
  }
  if (widen) {
    spec.temps.push_back(TempSpec{"dy (f32)", 4, 0, 0});
    spec.temps.push_back(TempSpec{"x (f32)", 4, 0, 1});
  }
  return spec;
}

// dy and x of a training_dx_spec tile in f32: widened into temps 0 and 1, or their input tiles.
std::pair<uint64_t, uint64_t> training_dx_f32(KernelBuilder& b, const TileOperands& t,
                                              DataType dt) {
  if (dt == DataType::F32) return {t.in[0], t.in[1]};
  const Dtype t_dev = device_dtype(dt);
  vec_convert(b, Dtype::F32, t_dev, t.temp[0], t.in[0], RoundMode::kRint, *t.count);
  vec_convert(b, Dtype::F32, t_dev, t.temp[1], t.in[1], RoundMode::kRint, *t.count);
  return {t.temp[0], t.temp[1]};
}

// f32 result `r` of a training_dx_spec tile to the output in dt (f32: `r` is the output tile
// already; else rounded once into it).
void training_dx_store(KernelBuilder& b, const TileOperands& t, uint64_t r, DataType dt) {
  if (dt != DataType::F32)
    vec_convert(b, device_dtype(dt), Dtype::F32, t.out, r, RoundMode::kRint, *t.count);
}

// FusedBatchNormGradV3's training x gradient, inputs dy (0) and x (1): dx = c1 * ((dy - mdy) -
// (x - mean) * c2) to output 0; `vectors` = {mdy, mean, c2, c1}, f32 [c] (its coefficient
// launch's).
//
// One stream kernel, computed in f32: dy and x widened to F0 and F1 (f32: their input tiles)
// and an f32 scratch tile U. f16 / bf16: no instruction writes a tile it reads, and the tiles
// sit in UB bank windows (StreamSpec::out_window) such that each instruction's tiles are in
// different ones: F0 0, F1 1, U 2, the output 2; the vectors mdy 1, mean 3, c2 5, c1 4; dy and x
// 1 and 0. (Measured, docs/compiler.md "The batch norm's passes in bank windows": in place and
// unplaced, half the vector unit's time went to bank conflicts.) Not the f32 pass: memory-bound
// (12 bytes of HBM traffic per element for 5 instructions), it keeps its former in-place steps
// and layout, which measured faster there than the placed ones (the same document).
void append_training_dx(CompiledKernel& k, const OpDesc& op, const std::vector<int64_t>& shape,
                        DataType dt, const std::vector<ArgRef>& vectors, const ChipConfig& cfg) {
  const bool widen = dt != DataType::F32;
  StreamSpec spec = training_dx_spec(fmt::format("BatchNormGrad_{}", data_type_name(dt)), shape, dt,
                                     widen, {1, 3, 5, 4});
  spec.temps.push_back(TempSpec{"U", 4, 0, widen ? 2 : -1});
  spec.compute = [=](KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    const auto [f0, f1] = training_dx_f32(b, t, dt);
    const uint64_t u = t.temp[widen ? 2 : 0];
    const uint64_t mdy = t.in[2], mean = t.in[3], c2 = t.in[4], c1 = t.in[5];
    auto op3 = [&](Opcode o, uint64_t d, uint64_t x, uint64_t y) {
      vec_binary(b, o, Dtype::F32, d, x, y, n);
    };
    if (!widen) {  // f32: dy and x's input tiles, U, in place
      op3(Opcode::op_vsub, u, f0, mdy);
      op3(Opcode::op_vsub, f1, f1, mean);
      op3(Opcode::op_vmul, f1, f1, c2);
      op3(Opcode::op_vsub, u, u, f1);
      op3(Opcode::op_vmul, u, u, c1);
      vec_copy_bits(b, 4, t.out, u, n);
      return;
    }
    // the same steps, through F0 and F1 once they are read
    op3(Opcode::op_vsub, u, f0, mdy);
    op3(Opcode::op_vsub, f0, f1, mean);
    op3(Opcode::op_vmul, f1, f0, c2);
    op3(Opcode::op_vsub, f0, u, f1);
    op3(Opcode::op_vmul, f1, f0, c1);
    training_dx_store(b, t, f1, dt);
  };
  std::vector<ArgRef> args = {input_ref(0), input_ref(1)};
  args.insert(args.end(), vectors.begin(), vectors.end());
  args.push_back(output_ref(0));
  k.launches.push_back(with_args(build_stream_kernel(op.str(), spec, cfg), args));
}

CompiledKernel compile_fused_batch_norm_grad(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const ChipConfig& cfg = ctx.cfg;
  if (op.inputs.size() != 6) op.fail(fmt::format("takes 6 inputs, {} given", op.inputs.size()));
  const bool training = op.attr_bool("is_training", true);
  const double eps = op.attr_float("epsilon", 0.0001);
  int64_t c = 0;
  const DataType dt = bn_dtype(op, {0, 1}, {2, 3, 4}, &c);
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const int64_t pixels = shape[0] * shape[1] * shape[2];
  const TensorDesc vec{DataType::F32, {c}}, none{DataType::F32, {0}};
  CompiledKernel k;
  k.outputs = {TensorDesc{dt, shape}, vec, vec, none, none};
  if (c == 0) return k;
  if (pixels == 0) {  // TF: zero scale / offset gradients
    append_fill(k, op, 1, vec, 0, cfg);
    append_fill(k, op, 2, vec, 0, cfg);
    return k;
  }
  const Padded dy = padded(k, op, input_ref(0), pixels, c, dt, cfg);
  const Padded x = padded(k, op, input_ref(1), pixels, c, dt, cfg);
  // The centring vector must cover the sums' cp channels: a copy of the mean in a cp buffer
  // (read in rows of pixels: the mean itself, ChannelSumSpec::channels).
  const ArgRef mean_p = x.channels ? input_ref(3)
                                   : append_vector_copies(k, op, {input_ref(3)}, c, x.cp,
                                                          "BatchNormGradMean", cfg)[0];
  ChannelSumSpec s;
  s.a_type = s.b_type = device_dtype(dt);
  s.pixels = pixels;
  x.set(s);
  auto [sdy, bdy] = append_sum(k, op, s, {dy.ref}, cfg);
  s.kind = ChannelSumSpec::Kind::kSumProduct;
  s.centered = true;
  auto [sdx, bdx] = append_sum(k, op, s, {x.ref, dy.ref, mean_p}, cfg);
  // Coefficients: c1 = scale * r, mdy = Sdy / R, c2 = r^2 * Sdyx / R.
  const ArgRef c1 = workspace_take(k, static_cast<uint64_t>(c) * 4),
               mdy = workspace_take(k, static_cast<uint64_t>(c) * 4),
               c2 = workspace_take(k, static_cast<uint64_t>(c) * 4);
  ChannelEpilogueSpec e;
  e.name = "BatchNormGradCoefficients";
  e.c = c;
  e.partial_cp = x.pitch();
  e.partial_blocks = {bdy, bdx};
  e.vectors = 2;  // scale, variance
  e.outputs = training ? 5 : 3;
  e.temps = 1;
  const double r_count = static_cast<double>(pixels);
  e.compute = [=](KernelBuilder& b, const EpilogueOperands& o) {
    const Reg& n = *o.count;
    const uint64_t r = o.temps[0];
    f32_scalar(b, Opcode::op_vadds, r, o.vectors[1], eps, n);
    f32_unary(b, Opcode::op_vrsqrt, r, r, n);
    f32_binary(b, Opcode::op_vmul, o.outputs[0], o.sums[1], r, n);     // scale_backprop
    f32_copy(b, o.outputs[1], o.sums[0], n);                           // offset_backprop
    f32_binary(b, Opcode::op_vmul, o.outputs[2], o.vectors[0], r, n);  // c1
    if (!training) return;
    f32_scalar(b, Opcode::op_vmuls, o.outputs[3], o.sums[0],
               static_cast<float>(1.0f / static_cast<float>(r_count)), n);  // mdy
    f32_binary(b, Opcode::op_vmul, o.outputs[4], r, r, n);
    f32_binary(b, Opcode::op_vmul, o.outputs[4], o.outputs[4], o.sums[1], n);
    f32_scalar(b, Opcode::op_vmuls, o.outputs[4], o.outputs[4],
               static_cast<float>(1.0f / static_cast<float>(r_count)), n);  // c2
  };
  std::vector<ArgRef> args = {sdy,           sdx, input_ref(2), input_ref(4), output_ref(1),
                              output_ref(2), c1};
  if (training) {
    args.push_back(mdy);
    args.push_back(c2);
  }
  k.launches.push_back(with_args(build_channel_epilogue(e, cfg, op.str()), args));
  if (training) {
    append_training_dx(k, op, shape, dt, {mdy, input_ref(3), c2, c1}, cfg);
  } else {
    append_elementwise(
        k, op, fmt::format("BatchNormGrad_{}", data_type_name(dt)), shape, dt, {input_ref(0)}, {c1},
        output_ref(0), 1,
        [dt](KernelBuilder& b, const TileOperands& t, const std::vector<uint64_t>& f) {
          vec_binary(b, Opcode::op_vmul, Dtype::F32, t.temp[0], f[0], t.in[0], *t.count);
          store_f32(b, t, t.temp[0], dt);
        },
        cfg);
  }
  return k;
}

// The training fusions (file comment). x (input 0, and input 1 of the gradients) is NHWC T;
// per-channel inputs f32 [c].
struct TrainingShape {
  DataType dt = DataType::F32;
  std::vector<int64_t> shape;
  int64_t c = 0, pixels = 0;
};

TrainingShape training_shape(const OpDesc& op, size_t inputs, std::initializer_list<size_t> tensors,
                             std::initializer_list<size_t> vectors) {
  if (op.inputs.size() != inputs)
    op.fail(fmt::format("takes {} inputs, {} given", inputs, op.inputs.size()));
  TrainingShape t;
  t.dt = bn_dtype(op, tensors, {}, &t.c);
  t.shape = op.inputs[*tensors.begin()].shape;
  // Per-channel vectors: f32 [c], leading 1s allowed (Keras reshapes them to [1, 1, 1, c] for a
  // positive channel axis).
  for (size_t i : vectors) {
    const TensorDesc& v = op.inputs[i];
    bool ok = v.dtype == DataType::F32 && !v.shape.empty() && v.shape.back() == t.c;
    for (size_t d = 0; ok && d + 1 < v.shape.size(); ++d) ok = v.shape[d] == 1;
    if (!ok) op.invalid(fmt::format("input {} must be f32[{}], got {}", i, t.c, v.str()));
  }
  t.pixels = t.shape[0] * t.shape[1] * t.shape[2];
  if (t.pixels == 0 || t.c == 0)
    op.fail(fmt::format("needs a non-empty batch, got {}", shape_str(t.shape)));
  return t;
}

// The per-channel vectors of a channel sum over x (the centring mean, the ReLU mask's
// statistics): the vectors `vs` themselves where the sums read x's own channels (whole blocks,
// or rows of whole pixels), else copies in x.cp-long workspace buffers (the sums read cp
// channels of them), all made by one launch.
std::vector<ArgRef> padded_vectors(CompiledKernel& k, const OpDesc& op,
                                   const std::vector<ArgRef>& vs, int64_t c, const Padded& x,
                                   const ChipConfig& cfg) {
  return x.cp == c || x.channels
             ? vs
             : append_vector_copies(k, op, vs, c, x.cp, "BatchNormGradMean", cfg);
}

// BNTrainingReduce(x) -> sum, square_sum: one pass over x summing x and x^2.
CompiledKernel compile_bn_training_reduce(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const TrainingShape t = training_shape(op, 1, {0}, {});
  CompiledKernel k;
  k.outputs = {TensorDesc{DataType::F32, {t.c}}, TensorDesc{DataType::F32, {t.c}}};
  append_bn_training_reduce(k, op, input_ref(0), t.pixels, t.c, t.dt, 0, ctx.cfg);
  return k;
}

// BNTrainingUpdate's fold from the batch statistics (f32 [count] in the UB): a = rsqrt(v + eps)
// * scale, shift = offset - m * a, with r = rsqrt(v + eps) formed in `r` (the default: in a).
// tmp and r are scratch; a may be scale, shift may be offset and tmp may be r (each is read
// before it is written), m and v are left as they are. The ReLU-masked gradients recompute a
// and shift with it, so they get the same bits as the forward pass's apply used.
void bnt_fold(KernelBuilder& b, const Reg& n, uint64_t m, uint64_t v, uint64_t scale,
              uint64_t offset, uint64_t a, uint64_t shift, uint64_t tmp, double eps,
              std::optional<uint64_t> r = std::nullopt) {
  const uint64_t rv = r.value_or(a);
  f32_scalar(b, Opcode::op_vadds, rv, v, eps, n);
  f32_unary(b, Opcode::op_vrsqrt, rv, rv, n);
  f32_binary(b, Opcode::op_vmul, a, rv, scale, n);  // a = rsqrt(v + eps) * scale
  f32_binary(b, Opcode::op_vmul, tmp, m, a, n);
  f32_binary(b, Opcode::op_vsub, shift, offset, tmp, n);  // shift = offset - m * a
}

// BNTrainingUpdate's statistics from the sums (f32 [count] in the UB): m = sum * inv (inv = 1/R
// in f32), v = max(square_sum * inv - m^2, 0) (biased); m may be sum and v square_sum (tmp:
// scratch, neither of them).
void bnt_statistics(KernelBuilder& b, const Reg& n, uint64_t sum, uint64_t square_sum, uint64_t m,
                    uint64_t v, uint64_t tmp, double inv) {
  f32_scalar(b, Opcode::op_vmuls, m, sum, inv, n);  // m = sum * (1/R)
  f32_scalar(b, Opcode::op_vmuls, v, square_sum, inv, n);
  f32_binary(b, Opcode::op_vmul, tmp, m, m, n);
  f32_binary(b, Opcode::op_vsub, v, v, tmp, n);
  f32_unary(b, Opcode::op_vrelu, v, v, n);  // v = max(square_sum / R - m^2, 0)
}

// The residual of BNTrainingUpdate (attribute R = 1) added in the apply `spec` (built with no
// activation; its compute leaves y rounded to T in the output tile): a stream input of y's type
// and shape (next after the spec's), then out = act(y + r) in T with the unfused graph's
// AddRelu kernel's instructions (ops/fused.cpp: vadd, then vrelu, of type T), so y + r and the
// ReLU round as the AddV2 and Relu after a BNTrainingUpdate do, bit for bit. Where the spec is
// placed in UB bank windows (T = f16: x's widened tile in window 0, free once y is rounded; the
// output in 2), the sum goes to that tile and the ReLU writes the output from it, r in window 3:
// no instruction writes a tile it reads. Else (f32, memory-bound) both in place on the output.
void add_residual(StreamSpec& spec, Activation act) {
  const size_t r = spec.inputs.size();
  const isa::Dtype type = spec.out_type;
  const bool placed = spec.out_window >= 0;
  if (placed &&
      (spec.temps.empty() || spec.temps[0].window != 0 || spec.temps[0].bytes_per_element < 2))
    throw CompileError("internal: a placed apply's residual needs x's widened tile in window 0");
  spec.inputs.push_back(
      StreamInput{type, broadcast_view(spec.out_shape, spec.out_shape), spec.out_shape});
  if (placed) spec.inputs.back().window = 3;
  spec.compute = [y = std::move(spec.compute), r, act, type, placed](KernelBuilder& b,
                                                                     const TileOperands& t) {
    const Reg& n = *t.count;
    y(b, t);
    const uint64_t sum = placed && act == Activation::kRelu ? t.temp[0] : t.out;
    vec_binary(b, Opcode::op_vadd, type, sum, t.out, t.in[r], n);
    if (act == Activation::kRelu) vec_unary(b, Opcode::op_vrelu, type, t.out, sum, n);
  };
}

// BNTrainingUpdate(x, sum, square_sum, scale, offset[, residual]) -> y, batch_mean,
// batch_variance; with R = 1, y = act(round_T(x * a + shift) + residual) (add_residual).
CompiledKernel compile_bn_training_update(const CompileContext& ctx);

// BNTrainingUpdate with R = 1 whose residual (input 5) is of x's type but another shape that
// broadcasts into x's (the graph pass's residual add takes the other operand of an AddRelu
// whose shapes it cannot always see): the update without the residual, its y into the
// workspace, then AddRelu(y, r) (AddV2 without relu) into output 0: the unfused graph's two
// launches and values. A residual that does not broadcast into x's shape is an error naming it.
CompiledKernel compile_bn_training_update_broadcast_residual(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const TensorDesc& x = op.inputs[0];
  const TensorDesc& r = op.inputs[5];
  const std::optional<std::vector<int64_t>> out = broadcast_shapes(x.shape, r.shape);
  if (r.dtype != x.dtype || !out || *out != x.shape)
    op.invalid(
        fmt::format("input 5 (the residual) is {}, expected {} or a shape that "
                    "broadcasts into it",
                    r.str(), x.str()));
  OpDesc update = op;
  update.inputs.pop_back();
  update.attrs.erase("R");
  update.attrs["relu"] = false;
  const CompiledKernel plain =
      compile_bn_training_update(CompileContext{update, ctx.cfg, ctx.precision});
  OpDesc add;
  add.type = op.attr_bool("relu", false) ? "AddRelu" : "AddV2";
  add.inputs = {x, r};
  LaunchPlan plan(plain.outputs);
  const ArgRef y = plan.workspace(x.bytes());
  plan.add(plain,
           {LaunchPlan::input(0), LaunchPlan::input(1), LaunchPlan::input(2), LaunchPlan::input(3),
            LaunchPlan::input(4)},
           {y, LaunchPlan::output(1), LaunchPlan::output(2)});
  plan.add(compile(add, ctx.cfg, ctx.precision), {y, LaunchPlan::input(5)}, {LaunchPlan::output(0)},
           "the residual add: ");
  return std::move(plan).finish();
}

CompiledKernel compile_bn_training_update(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const int64_t residual = op.attr_int("R", 0);
  if (residual != 0 && residual != 1)
    op.invalid(fmt::format("attribute R = {}: 0 or 1 expected", residual));
  if (residual && op.inputs.size() == 6 && op.inputs[5].shape != op.inputs[0].shape)
    return compile_bn_training_update_broadcast_residual(ctx);
  // (the residual is checked as x: of its type and shape)
  const TrainingShape t = residual ? training_shape(op, 6, {0, 5}, {1, 2, 3, 4})
                                   : training_shape(op, 5, {0}, {1, 2, 3, 4});
  // x and y f32, or f16 (allow_mix_precision's graph pass): widened, computed in f32, rounded
  // once (append_batch_norm_apply).
  if (t.dt != DataType::F32 && t.dt != DataType::F16)
    op.fail(fmt::format("T = {} is not supported (f32, f16)", data_type_name(t.dt)));
  const double eps = op.attr_float("epsilon", 0.001);
  const double inv = static_cast<float>(1.0f / static_cast<float>(t.pixels));
  CompiledKernel k;
  const TensorDesc vec{DataType::F32, {t.c}};
  k.outputs = {TensorDesc{t.dt, t.shape}, vec, vec};
  const Activation act = op.attr_bool("relu", false) ? Activation::kRelu : Activation::kNone;
  // The activation of y itself: none where it follows the residual's add.
  const Activation y_act = residual ? Activation::kNone : act;
  // One launch where it can (CANN's BNTrainingUpdate is one kernel too): the apply's blocks
  // each compute the statistics and the fold on their resident per-channel tiles, once per
  // period, with the fold launch's instructions lane by lane (the same bits); block 0 stores
  // batch_mean and batch_variance from them. The apply reads a and shift where it read them
  // before (inputs 1 and 2: scale and offset's tiles, folded in place); sum and square_sum are
  // inputs 3 and 4 (m and v in place; they and the fold's scratch take one period of the UB,
  // not a tile). Needs the statistics' stores whole 32-byte blocks (c a multiple of 8) and the
  // four vectors resident; else the fold is a launch of its own.
  // With a residual, input 5 (r) follows them; the kernel is named BNTrainingUpdateAdd[Relu]_T.
  const std::string name = fmt::format("BNTrainingUpdate{}{}_{}", residual ? "Add" : "",
                                       activation_name(act), data_type_name(t.dt));
  StreamSpec apply =
      batch_norm_apply_spec(t.shape, y_act, device_dtype(t.dt), device_dtype(t.dt), true);
  apply.kernel_name = name;
  // Split chips (the 910b's vector cores stream against HBM's sustained rate, their tiles each
  // wait a round trip): the f32 work in pieces where a block holds at least 4 tiles without
  // them (StreamSpec::work_piece, BNTrainingReduceGrad's piece), so the f16 tiles grow about
  // 1.4-2.5x (with 1 to 2.5 tiles a block the pieces' instructions cost more than they save:
  // measured, docs/compiler.md "BNTrainingUpdate's round trips"); and the blocks' first tiles
  // out of phase (StreamSpec::stagger_first_tiles: taken where the vector cores' ports outrun
  // HBM; split chips only: on the coupled 310P, where they outrun its DDR, measured no faster).
  // Tile boundaries and instruction grouping only: y, batch_mean and batch_variance keep their
  // bits.
  apply.work_piece = ctx.cfg.split ? kBnTrainingWorkPiece : 0;
  apply.work_piece_min_tiles = 4;
  apply.stagger_first_tiles = ctx.cfg.split;
  for (int i = 0; i < 2; ++i) {
    apply.inputs.push_back(StreamInput{Dtype::F32, broadcast_view({t.c}, t.shape), {t.c}});
    apply.inputs.back().period_only = true;
  }
  if (residual) add_residual(apply, act);
  const size_t scratch = apply.temps.size();
  apply.temps.push_back(TempSpec{"statistics scratch (f32)", 4, 0});
  apply.temps.back().period_only = true;
  apply.resident_per_period = true;
  apply.resident_compute = [eps, inv, scratch](KernelBuilder& b, const TileOperands& o) {
    const Reg& n = *o.count;
    const uint64_t a = o.in[1], shift = o.in[2], m = o.in[3], v = o.in[4], tmp = o.temp[scratch];
    bnt_statistics(b, n, m, v, m, v, tmp, inv);
    bnt_fold(b, n, m, v, a, shift, a, shift, tmp, eps, tmp);  // scale -> a, offset -> shift
  };
  apply.resident_stores = {{3, t.c}, {4, t.c}};  // batch_mean, batch_variance
  if (t.c % 8 == 0 && stream_keeps_resident(apply, ctx.cfg)) {
    std::vector<ArgRef> args = {input_ref(0), input_ref(3), input_ref(4), input_ref(1),
                                input_ref(2)};
    if (residual) args.push_back(input_ref(5));
    args.insert(args.end(), {output_ref(0), output_ref(1), output_ref(2)});
    k.launches.push_back(with_args(build_stream_kernel(op.str(), apply, ctx.cfg), args));
    return k;
  }
  BatchNormFold fold;
  fold.a = workspace_take(k, static_cast<uint64_t>(t.c) * 4);
  fold.shift = workspace_take(k, static_cast<uint64_t>(t.c) * 4);
  ChannelEpilogueSpec e;
  e.name = "BNTrainingUpdateFold";
  e.spread = true;
  e.c = t.c;
  e.vectors = 4;  // sum, square_sum, scale, offset
  e.outputs = 4;  // batch_mean, batch_variance, a, shift
  e.temps = 1;
  e.compute = [eps, inv](KernelBuilder& b, const EpilogueOperands& o) {
    const Reg& n = *o.count;
    const uint64_t m = o.outputs[0], v = o.outputs[1], a = o.outputs[2], shift = o.outputs[3],
                   tmp = o.temps[0];
    bnt_statistics(b, n, o.vectors[0], o.vectors[1], m, v, tmp, inv);
    bnt_fold(b, n, m, v, o.vectors[2], o.vectors[3], a, shift, tmp, eps);
  };
  k.launches.push_back(with_args(build_channel_epilogue(e, ctx.cfg, op.str()),
                                 {input_ref(1), input_ref(2), input_ref(3), input_ref(4),
                                  output_ref(1), output_ref(2), fold.a, fold.shift}));
  if (!residual) {
    append_batch_norm_apply(k, ctx, input_ref(0), t.shape, fold, act, device_dtype(t.dt),
                            device_dtype(t.dt), true);
    return k;
  }
  StreamSpec fold_apply =
      batch_norm_apply_spec(t.shape, y_act, device_dtype(t.dt), device_dtype(t.dt), true);
  fold_apply.kernel_name = name;
  add_residual(fold_apply, act);
  k.launches.push_back(with_args(build_stream_kernel(op.str(), fold_apply, ctx.cfg),
                                 {input_ref(0), fold.a, fold.shift, input_ref(5), output_ref(0)}));
  return k;
}

// The relu attribute of the ReLU-masked gradients (file comment): T must be f32 or f16 (the
// forward BNTrainingUpdate's), and the op has `inputs` inputs with it, `inputs - extra` without.
bool relu_attr(const OpDesc& op, size_t inputs, size_t extra) {
  const bool relu = op.attr_bool("relu", false);
  if (relu && !op.inputs.empty() && op.inputs[0].dtype != DataType::F32 &&
      op.inputs[0].dtype != DataType::F16)
    op.fail(fmt::format("relu = true needs T = f32 or f16 (BNTrainingUpdate's), got {}",
                        data_type_name(op.inputs[0].dtype)));
  if (relu && op.inputs.size() != inputs)
    op.fail(fmt::format("with relu = true takes {} inputs, {} given", inputs, op.inputs.size()));
  if (!relu && op.inputs.size() == inputs && extra)
    op.fail(
        fmt::format("takes {} inputs without relu, {} given", inputs - extra, op.inputs.size()));
  return relu;
}

// BNTrainingUpdateGrad(dy, x, batch_mean, batch_variance[, scale, offset]) -> diff_scale,
// diff_offset: one pass over dy and x summing dy and dy * (x - m) (relu: dy masked first).
CompiledKernel compile_bn_training_update_grad(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const bool relu = relu_attr(op, 6, 2);
  const TrainingShape t =
      relu ? training_shape(op, 6, {0, 1}, {2, 3, 4, 5}) : training_shape(op, 4, {0, 1}, {2, 3});
  const double eps = op.attr_float("epsilon", 0.001);
  CompiledKernel k;
  const TensorDesc vec{DataType::F32, {t.c}};
  k.outputs = {vec, vec};
  const Padded dy = padded(k, op, input_ref(0), t.pixels, t.c, t.dt, ctx.cfg);
  const Padded x = padded(k, op, input_ref(1), t.pixels, t.c, t.dt, ctx.cfg);
  // batch_mean [, batch_variance, scale, offset: the ReLU mask's], cp long
  std::vector<ArgRef> vectors = {input_ref(2)};
  if (relu)
    for (int i : {3, 4, 5}) vectors.push_back(input_ref(i));
  vectors = padded_vectors(k, op, vectors, t.c, x, ctx.cfg);
  ChannelSumSpec s;
  s.kind = ChannelSumSpec::Kind::kSumProduct;
  s.centered = true;
  s.plain_sum = true;
  // The most pixels per raw tile (ops/channel.cpp), on split chips only; not for the ReLU-masked
  // sums, whose vector work per element is larger (measured slower at 28x28x128 on the 910b;
  // on the 910's coupled cores slower at every layer it moved: docs/compiler.md).
  s.raw_tile_first = !relu && ctx.cfg.split;
  s.stagger_first_tiles = true;  // where it can pay (ops/channel.h)
  s.a_type = s.b_type = device_dtype(t.dt);
  s.pixels = t.pixels;
  x.set(s);
  std::vector<ArgRef> sum_inputs = {x.ref, dy.ref};
  sum_inputs.insert(sum_inputs.end(), vectors.begin(), vectors.end());
  if (relu) {
    // The forward pass's a and shift, recomputed per channel group inside the sums from the
    // statistics, scale and offset (cp long: the sums read the padded channels too).
    s.relu_mask = true;
    s.mask_vectors = 3;  // batch_variance, scale, offset
    s.mask_fold = [eps](KernelBuilder& b, const Reg& n, const std::vector<uint64_t>& v, uint64_t a,
                        uint64_t shift, uint64_t tmp) {
      bnt_fold(b, n, v[0], v[1], v[2], v[3], a, shift, tmp, eps);
    };
  }
  // The partial sets: sum dy * (x - m), then sum dy.
  ChannelEpilogueSpec e;
  e.name = "BNTrainingUpdateGradSums";
  e.spread = true;
  e.c = t.c;
  e.vectors = 1;  // variance
  e.outputs = 2;  // diff_scale, diff_offset
  e.compute = [eps](KernelBuilder& b, const EpilogueOperands& o) {
    const Reg& n = *o.count;
    f32_scalar(b, Opcode::op_vadds, o.outputs[0], o.vectors[0], eps, n);
    f32_unary(b, Opcode::op_vrsqrt, o.outputs[0], o.outputs[0], n);
    f32_binary(b, Opcode::op_vmul, o.outputs[0], o.outputs[0], o.sums[0], n);
    f32_copy(b, o.outputs[1], o.sums[1], n);
  };
  append_channel_sum_epilogue(k, op.str(), s, sum_inputs, e,
                              {input_ref(3), output_ref(0), output_ref(1)}, ctx.cfg,
                              channel_epilogue_in_kernel(ctx.cfg));
  return k;
}

// BNTrainingReduceGrad(dy, x, diff_scale, diff_offset, scale, batch_mean, batch_variance[,
// offset]) -> dx (relu: dy masked first) [, bias_grad: with bias_grads = 1, T [C], the per-channel
// sum of dx: the f32 dx of each tile added lane by lane into a tile-long accumulator, folded per
// block and the blocks' partials folded pairwise (ops/channel.h add_stream_channel_sums),
// rounded once to T; where C is not whole 32-byte blocks of f32 and T, BiasAddGrad's kernel on dx].
//
// One stream kernel. dx = c1 * ((g - mdy) - (x - m) * c2) (the file comment; g = dy, or with
// relu dy masked) is computed as the affine form dx = (g * c1 - x * kc) + k3, kc = c1 * c2,
// k3 = c1 * (c2 * m - mdy): per element two products, a difference and a sum, where the centred
// form takes five steps, and three per-channel vectors read per element instead of four. Like
// BNTrainingUpdate's y = x * a + shift it does not centre x before scaling it: where |m| >> the
// channel's spread, x * kc and k3 cancel, an absolute error of a few e |kc| (|x| + |m|) (the
// tests' bound). Each block computes c1, kc, k3 (and shift) once, over one period of the
// per-channel vectors' resident tiles and in place, before they are repeated over the tile
// (StreamSpec::resident_per_period): scale -> c1 (= BNTrainingUpdate's a, bnt_fold's
// instructions), diff_scale -> kc, diff_offset -> k3, offset -> shift; batch_mean and
// batch_variance stay one period long (only that work reads them; the variance's buffer is its
// scratch after r = rsqrt(v + eps)).
//
// The tile's steps, in f32: dy and x widened to F0 and F1 (f32: their input tiles), scratch U
// (and V with the mask); relu: U = F1 c1, V = U + shift (y's pre-activation, bit for bit the
// apply's), mask bits = V > relu_mask_threshold(T), U = mask ? c1 : 0, V = F0 U (g c1 with
// ReluGrad's product: dy * 0 where masked, NaN for an infinite dy, as dy * mask * c1 but for
// the sign of a zero), then U = F1 kc, F0 = V - U, dx = F0 + k3; without: U = F0 c1,
// F0 = F1 kc, F1 = U - F0, dx = F1 + k3. No instruction writes a tile it reads (the f32 output
// is the last step's destination), and with f16 / bf16 or the mask the tiles sit in UB bank
// windows (append_training_dx): F0 0, F1 1, U 2, V 3, the output 2, c1 and k3 4, kc and shift 5
// (the f32 pass without the mask unplaced, as append_training_dx's).
CompiledKernel compile_bn_training_reduce_grad(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const bool relu = relu_attr(op, 8, 1);
  const TrainingShape t = relu ? training_shape(op, 8, {0, 1}, {2, 3, 4, 5, 6, 7})
                               : training_shape(op, 7, {0, 1}, {2, 3, 4, 5, 6});
  const double eps = op.attr_float("epsilon", 0.001);
  const double inv = static_cast<float>(1.0f / static_cast<float>(t.pixels));
  const DataType dt = t.dt;
  const bool widen = dt != DataType::F32, placed = widen || relu;
  const Dtype t_dev = device_dtype(dt);
  const float threshold = relu ? relu_mask_threshold(t_dev) : 0.0f;
  // bias_grads = 1: output 1 is the per-channel sum of dx, the bias gradient of the convolution
  // whose output x is (the graph pass's BiasAddGrad folded in), in T.
  const int64_t bias_grads = op.attr_int("bias_grads", 0);
  if (bias_grads != 0 && bias_grads != 1)
    op.invalid(fmt::format("bias_grads = {}: 0 or 1", bias_grads));
  CompiledKernel k;
  k.outputs = {TensorDesc{dt, t.shape}};
  if (bias_grads) k.outputs.push_back(TensorDesc{dt, {t.c}});
  // The sum in the pass where the channels are whole 32-byte blocks in f32 and in T (the
  // partials' and the output's stores); else BiasAddGrad's own kernel on dx after it.
  const bool bias_in_pass = bias_grads && t.c % 8 == 0 && (t.c * data_type_bytes(dt)) % 32 == 0;
  // The per-channel inputs: c1, kc, k3[, shift] read per element, then mean and variance.
  std::vector<ArgRef> vectors = {input_ref(4), input_ref(2), input_ref(3)};
  std::vector<int> windows = {4, 5, 4};
  if (relu) {
    vectors.push_back(input_ref(7));
    windows.push_back(5);
  }
  const size_t per_element = vectors.size();
  vectors.push_back(input_ref(5));
  vectors.push_back(input_ref(6));
  windows.insert(windows.end(), {-1, -1});
  std::vector<bool> period_only(per_element, false);
  period_only.insert(period_only.end(), {true, true});
  StreamSpec spec = training_dx_spec(
      fmt::format("BNTrainingReduceGrad{}_{}", relu ? "Relu" : "", data_type_name(dt)), t.shape, dt,
      placed, windows, period_only);
  const size_t scratch = spec.temps.size();  // U (, V, then the mask's)
  spec.temps.push_back(TempSpec{"U", 4, 0, placed ? 2 : -1});
  if (relu) {
    spec.temps.push_back(TempSpec{"V", 4, 0, 3});
    spec.temps.push_back(TempSpec{"mask bits", 1.0 / 8, 0});
    spec.temps.push_back(TempSpec{"0.0f repeat", 0, vec::kRepeatBytes});
    if (threshold != 0.0f)
      spec.temps.push_back(TempSpec{"ReLU mask threshold repeat", 0, vec::kRepeatBytes});
    spec.prologue = [scratch, threshold](KernelBuilder& b, const std::vector<uint64_t>& temp) {
      vec_fill_repeat(b, Dtype::F32, temp[scratch + 3], 0.0);
      if (threshold != 0.0f) vec_fill_repeat(b, Dtype::F32, temp[scratch + 4], threshold);
    };
  }
  spec.resident_per_period = true;
  // The f32 work in pieces where a block has many tiles, on split chips (measured,
  // docs/compiler.md "The x gradient in pieces": larger tiles wait fewer round trips; with
  // under 8 tiles a block, the pieces' instructions cost more than that saves, most with the
  // mask's 11 steps; on the 910's coupled cores, nearer their HBM roofline, slower throughout).
  spec.work_piece = ctx.cfg.split ? kBnTrainingWorkPiece : 0;
  spec.work_piece_min_tiles = 8;
  // The blocks' first tiles out of phase (StreamSpec::stagger_first_tiles; taken where the
  // vector cores' ports outrun HBM, as on the 910b, not the 910): blocks in step all wait their
  // round trip per tile at once with HBM idle. dx is the same bit for bit (tile boundaries
  // only); the bias gradient's lanes then gather other elements, a different f32 summation
  // order within the same bounds.
  spec.stagger_first_tiles = true;
  spec.resident_compute = [=](KernelBuilder& b, const TileOperands& o) {
    const Reg& n = *o.count;
    const uint64_t c1 = o.in[2], kc = o.in[3], k3 = o.in[4], mean = o.in[2 + per_element],
                   var = o.in[3 + per_element], r = o.temp[scratch];
    f32_scalar(b, Opcode::op_vadds, r, var, eps, n);
    f32_unary(b, Opcode::op_vrsqrt, r, r, n);
    f32_binary(b, Opcode::op_vmul, c1, c1, r, n);  // c1 = scale * r
    f32_binary(b, Opcode::op_vmul, kc, kc, r, n);
    f32_scalar(b, Opcode::op_vmuls, kc, kc, inv, n);  // c2 = r * diff_scale / R
    f32_scalar(b, Opcode::op_vmuls, k3, k3, inv, n);  // mdy = diff_offset / R
    f32_binary(b, Opcode::op_vmul, var, kc, mean, n);
    f32_binary(b, Opcode::op_vsub, var, var, k3, n);
    f32_binary(b, Opcode::op_vmul, k3, c1, var, n);  // k3 = c1 * (c2 * m - mdy)
    f32_binary(b, Opcode::op_vmul, kc, c1, kc, n);   // kc = c1 * c2
    if (relu) {                                      // shift = offset - m * a, as bnt_fold (a = c1)
      f32_binary(b, Opcode::op_vmul, r, mean, c1, n);
      f32_binary(b, Opcode::op_vsub, o.in[5], o.in[5], r, n);
    }
  };
  // The bias gradient's per-channel sums of the f32 dx, tile by tile (ops/channel.h), then the
  // blocks' partials added and rounded to T: in this kernel after a barrier (split chips), else
  // by an epilogue launch after it.
  const bool epilogue_in_kernel = channel_epilogue_in_kernel(ctx.cfg);
  const ChannelEpilogueSpec bias_epilogue =
      rounded_sums_epilogue("BNTrainingReduceGradBiasSums", t.c, t_dev);
  std::optional<size_t> bias_sums;
  if (bias_in_pass)
    bias_sums = add_stream_channel_sums(spec, t.c, bias_epilogue, epilogue_in_kernel);
  spec.compute = [=](KernelBuilder& b, const TileOperands& o) {
    const Reg& n = *o.count;
    const auto [f0, f1] = training_dx_f32(b, o, dt);
    const uint64_t u = o.temp[scratch], c1 = o.in[2], kc = o.in[3], k3 = o.in[4];
    auto op3 = [&](Opcode op_code, uint64_t d, uint64_t a, uint64_t c) {
      vec_binary(b, op_code, Dtype::F32, d, a, c, n);
    };
    // (the difference's tile, and the tile the result goes to before the output's type)
    uint64_t diff = f1, result = f0;
    if (relu) {
      const uint64_t v = o.temp[scratch + 1], bits = o.temp[scratch + 2],
                     zero = o.temp[scratch + 3];
      const uint64_t above = threshold == 0.0f ? zero : o.temp[scratch + 4];
      op3(Opcode::op_vmul, u, f1, c1);  // x * a + shift, as the apply
      op3(Opcode::op_vadd, v, u, o.in[5]);
      vec_compare(b, Dtype::F32, isa::Cmp::GT, bits, v, above, n, true);
      vec_select(b, Dtype::F32, u, c1, zero, bits, n, false, true);  // c1 * mask
      op3(Opcode::op_vmul, v, f0, u);                                // g * c1
      op3(Opcode::op_vmul, u, f1, kc);
      op3(Opcode::op_vsub, f0, v, u);
      diff = f0;
      result = f1;
    } else {
      op3(Opcode::op_vmul, u, f0, c1);
      op3(Opcode::op_vmul, f0, f1, kc);
      op3(Opcode::op_vsub, f1, u, f0);
    }
    op3(Opcode::op_vadd, widen ? result : o.out, diff, k3);
    training_dx_store(b, o, result, dt);
    if (bias_sums)  // dx in f32, before its rounding to T
      op3(Opcode::op_vadd, o.temp[*bias_sums], o.temp[*bias_sums], widen ? result : o.out);
  };
  if (!stream_keeps_resident(spec, ctx.cfg))
    op.fail(
        fmt::format("C = {} channels: the per-channel vectors do not fit the UB beside a "
                    "tile of whole periods",
                    t.c));
  std::vector<ArgRef> args = {input_ref(0), input_ref(1)};
  args.insert(args.end(), vectors.begin(), vectors.end());
  args.push_back(output_ref(0));
  Launch pass = build_stream_kernel(op.str(), spec, ctx.cfg);
  if (bias_in_pass) {
    const int blocks = pass.block_dim;
    const ArgRef partials = workspace_take(k, static_cast<uint64_t>(blocks * t.c) * 4);
    args.push_back(partials);
    if (epilogue_in_kernel) args.push_back(output_ref(1));
    k.launches.push_back(with_args(std::move(pass), args));
    if (!epilogue_in_kernel) {
      ChannelEpilogueSpec e = bias_epilogue;
      e.partial_cp = t.c;
      e.partial_blocks = {blocks};
      k.launches.push_back(
          with_args(build_channel_epilogue(e, ctx.cfg, op.str()), {partials, output_ref(1)}));
    }
    return k;
  }
  if (!bias_grads) {
    k.launches.push_back(with_args(std::move(pass), args));
    return k;
  }
  // BiasAddGrad's kernel on the dx just written (the same values as the unfused op's).
  OpDesc sum_op;
  sum_op.type = "BiasAddGrad";
  sum_op.inputs = {TensorDesc{dt, t.shape}};
  LaunchPlan plan(k.outputs);
  plan.add(std::move(pass), args);
  plan.add(compile_bias(CompileContext{sum_op, ctx.cfg, ctx.precision}), {LaunchPlan::output(0)},
           {LaunchPlan::output(1)}, "the bias gradient: ");
  return std::move(plan).finish();
}

}  // namespace

void append_bn_training_reduce(CompiledKernel& k, const OpDesc& op, const ArgRef& x, int64_t pixels,
                               int64_t c, DataType dt, int out, const ChipConfig& cfg) {
  const Padded xp = padded(k, op, x, pixels, c, dt, cfg);
  ChannelSumSpec s;
  s.kind = ChannelSumSpec::Kind::kSumSquares;
  s.plain_sum = true;
  s.a_type = device_dtype(dt);
  s.pixels = pixels;
  xp.set(s);
  // The most pixels per raw tile (ops/channel.cpp) on split chips, for f32 x only: f16 x adds
  // a widening per tile, and the smaller tile's extra instructions then cost more than the round
  // trips save (measured: f16 lost 3-10 % at 8x112x112x64 to 8x28x28x512, f32 gained 4-7 %).
  s.raw_tile_first = cfg.split && dt == DataType::F32;
  // (the sums' partial sets: the sums of squares, then the plain sums)
  append_channel_sum_epilogue(
      k, op.str(), s, {xp.ref}, bn_training_reduce_sums_epilogue(0, c, xp.cp, true),
      {output_ref(out), output_ref(out + 1)}, cfg, channel_epilogue_in_kernel(cfg));
}

ChannelEpilogueSpec bn_training_reduce_sums_epilogue(int blocks, int64_t c, int64_t cp,
                                                     bool squares_first) {
  ChannelEpilogueSpec e;
  e.name = "BNTrainingReduceSums";
  e.spread = true;
  e.c = c;
  e.partial_cp = cp;
  e.partial_blocks = {blocks, blocks};
  e.outputs = 2;
  const int sums = squares_first ? 1 : 0;
  e.compute = [sums](KernelBuilder& b, const EpilogueOperands& o) {
    f32_copy(b, o.outputs[0], o.sums[sums], *o.count);
    f32_copy(b, o.outputs[1], o.sums[1 - sums], *o.count);
  };
  return e;
}

CompiledKernel compile_batchnorm(const CompileContext& ctx) {
  if (ctx.op.type == "FusedBatchNormV3") return compile_fused_batch_norm(ctx);
  if (ctx.op.type == "FusedBatchNormGradV3") return compile_fused_batch_norm_grad(ctx);
  if (ctx.op.type == "BNTrainingReduce") return compile_bn_training_reduce(ctx);
  if (ctx.op.type == "BNTrainingUpdate") return compile_bn_training_update(ctx);
  if (ctx.op.type == "BNTrainingUpdateGrad") return compile_bn_training_update_grad(ctx);
  if (ctx.op.type == "BNTrainingReduceGrad") return compile_bn_training_reduce_grad(ctx);
  ctx.op.fail("not a batch-normalisation op");
}

}  // namespace npusim::compiler::ops
