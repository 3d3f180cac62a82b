// Fused inference ops, produced by the TensorFlow plugin's graph fusion
// (adapter/tf/plugin/graph_fusion.cpp) from chains of small ops; TensorFlow has no such ops, the
// plugin registers their definitions (kernels_fused.cpp). Like CANN's graph engine fusions, each
// runs as at most two launches instead of one per op of the chain.
//
// BatchNormInference(x, scale, offset, mean, variance[, bias]; epsilon, relu, relu6, Tout) -> y
//   x: f32 [..., C] (channel last: NHWC feature maps, Dense outputs); the others f32 [C] (or
//   [1, ..., 1, C] of at most x's rank: Keras reshapes them so for a positive channel axis). The
//   optional sixth input is the bias of a BiasAdd that produced x (the fused chain is then
//   BiasAdd(x, bias) -> batch norm -> Relu). Keras 3's BatchNormalization at inference computes
//     a = rsqrt(variance + epsilon) * scale,  y = x * a + (offset - mean * a)
//   as separate ops; here:
//     launch 1 (BatchNormInferenceFold, per-channel epilogue kernel, ops/channel.h):
//       a = rsqrt(variance + epsilon) * scale
//       shift = offset - mean * a                 (no bias: the chain's own rounding steps)
//       shift = offset + (bias - mean) * a        (with bias)
//     launch 2 (streaming kernel, a and shift resident in the UB):
//       y = x * a + shift, then max(y, 0) when relu, min(max(y, 0), 6) when relu6 (a Relu6
//       after the chain, as CANN fuses it into the batch norm's or convolution's epilogue),
//       rounded once to Tout (f32, or f16 where the graph fusion hands y to convolutions:
//       the RNE rounding their input cast would apply, so their result is the same bits).
//   Numerics: without a bias each step is the f32 operation TF's kernels run, so y matches the
//   unfused chain bit for bit wherever vrsqrt matches TF's Rsqrt. With a bias the fold reorders
//   (x + bias) * a + (offset - mean * a) into x * a + (offset + (bias - mean) * a): a few f32
//   ulp of the larger terms apart.
//
// AddRelu(x, y) -> max(x + y, 0)
//   f32, f16, bf16 with numpy broadcasting (ops/elementwise.h). The sum is rounded to T (one
//   vadd, as AddV2), then vrelu: bit for bit AddV2 followed by Relu.
#include <fmt/format.h>

#include "adapter/compiler/ops/fused.h"

#include "adapter/compiler/ops/channel.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

// The per-channel inputs of a batch norm, in input order.
constexpr const char* kBatchNormVectors[] = {"scale", "offset", "mean", "variance", "bias"};

}  // namespace

BatchNormFold append_batch_norm_fold(CompiledKernel& k, const CompileContext& ctx, int first,
                                     const std::vector<int64_t>& y_shape, int end) {
  const OpDesc& op = ctx.op;
  const int64_t c = y_shape.back();
  if (end < 0) end = static_cast<int>(op.inputs.size());
  const int vectors = end - first;
  if (vectors != 4 && vectors != 5)
    op.fail(
        fmt::format("takes the batch norm's scale, offset, mean, variance (and bias) from "
                    "input {}: {} inputs given",
                    first, end));
  const bool has_bias = vectors == 5;
  for (int i = first; i < end; ++i) {
    const TensorDesc& v = op.inputs[static_cast<size_t>(i)];
    bool channel_last = v.dtype == DataType::F32 && !v.shape.empty() && v.shape.back() == c &&
                        v.shape.size() <= y_shape.size();
    for (size_t d = 0; channel_last && d + 1 < v.shape.size(); ++d) channel_last = v.shape[d] == 1;
    if (!channel_last)
      op.fail(
          fmt::format("{} (input {}) must be f32[{}] (the last dimension of {}; leading 1s "
                      "allowed), got {}",
                      kBatchNormVectors[i - first], i, c, shape_str(y_shape), v.str()));
  }
  const double eps = op.attr_float("epsilon", 0.001);
  // a and shift: one derived tensor of the batch norm's inputs ([a | shift], shift 32-byte
  // aligned), so a caller keeps it while they are unchanged (GE folds it at inference).
  const uint64_t shift_at = (static_cast<uint64_t>(c) * 4 + 31) / 32 * 32;
  const ArgRef ws = workspace_take(k, 2 * shift_at);
  std::vector<int> sources;
  for (int i = first; i < end; ++i) sources.push_back(i);
  const int d = static_cast<int>(k.derived.size());
  k.derived.push_back(
      DerivedTensor{sources, k.launches.size(), 2 * shift_at, "batch-norm factor and shift"});
  BatchNormFold fold;
  fold.a = ArgRef{ArgRef::Kind::kDerived, d, ws.value, 0};
  fold.shift = ArgRef{ArgRef::Kind::kDerived, d, ws.value, shift_at};
  ChannelEpilogueSpec e;
  e.name = "BatchNormInferenceFold";
  e.c = c;
  e.vectors = vectors;  // scale, offset, mean, variance (, bias)
  e.outputs = 2;        // a, shift
  e.temps = 1;
  e.compute = [eps, has_bias](KernelBuilder& b, const EpilogueOperands& o) {
    const Reg& n = *o.count;
    const uint64_t scale = o.vectors[0], offset = o.vectors[1], mean = o.vectors[2],
                   variance = o.vectors[3], av = o.outputs[0], sv = o.outputs[1], t = o.temps[0];
    f32_scalar(b, Opcode::op_vadds, av, variance, eps, n);
    f32_unary(b, Opcode::op_vrsqrt, av, av, n);
    f32_binary(b, Opcode::op_vmul, av, av, scale, n);
    if (has_bias) {
      f32_binary(b, Opcode::op_vsub, t, o.vectors[4], mean, n);
      f32_binary(b, Opcode::op_vmul, t, t, av, n);
      f32_binary(b, Opcode::op_vadd, sv, offset, t, n);
    } else {
      f32_binary(b, Opcode::op_vmul, t, mean, av, n);
      f32_binary(b, Opcode::op_vsub, sv, offset, t, n);
    }
  };
  std::vector<ArgRef> fold_args;
  for (int i = first; i < end; ++i) fold_args.push_back(input_ref(i));
  fold_args.push_back(fold.a);
  fold_args.push_back(fold.shift);
  k.launches.push_back(with_args(build_channel_epilogue(e, ctx.cfg, op.str()), fold_args));
  return fold;
}

Activation activation_attr(const OpDesc& op) {
  if (op.attr_bool("relu6", false)) return Activation::kRelu6;
  return op.attr_bool("relu", false) ? Activation::kRelu : Activation::kNone;
}

const char* activation_name(Activation act) {
  switch (act) {
    case Activation::kNone: return "";
    case Activation::kRelu: return "Relu";
    case Activation::kRelu6: return "Relu6";
  }
  return "";
}

void append_activation(KernelBuilder& b, Activation act, uint64_t y, const Reg& count, Dtype t) {
  if (act == Activation::kRelu) vec_unary(b, Opcode::op_vrelu, t, y, y, count);
  if (act == Activation::kRelu6) {
    if (t == Dtype::F32) {
      f32_scalar(b, Opcode::op_vmaxs, y, y, 0.0, count);
      f32_scalar(b, Opcode::op_vmins, y, y, 6.0, count);
      return;
    }
    Reg bound = b.reg("ReLU6 bound");
    b.movi(bound, vector_scalar_bits(t, 0.0));
    vec_scalar(b, Opcode::op_vmaxs, t, y, y, bound, count);
    b.movi(bound, vector_scalar_bits(t, 6.0));
    vec_scalar(b, Opcode::op_vmins, t, y, y, bound, count);
  }
}

void append_residual_add(CompiledKernel& k, const CompileContext& ctx, int residual_input,
                         Activation act) {
  const std::vector<int64_t>& shape = k.outputs[0].shape;
  const Dtype io = device_dtype(k.outputs[0].dtype);
  StreamSpec spec;
  spec.kernel_name = fmt::format("AddResidual{}_{}", activation_name(act), isa::dtype_name(io));
  spec.out_type = io;
  spec.out_shape = shape;
  spec.inputs = {StreamInput{io, broadcast_view(shape, shape), shape},
                 StreamInput{io, broadcast_view(shape, shape), shape}};
  spec.compute = [act, io](KernelBuilder& b, const TileOperands& t) {
    vec_binary(b, Opcode::op_vadd, io, t.out, t.in[0], t.in[1], *t.count);
    append_activation(b, act, t.out, *t.count, io);
  };
  k.launches.push_back(with_args(build_stream_kernel(ctx.op.str(), spec, ctx.cfg),
                                 {output_ref(0), input_ref(residual_input), output_ref(0)}));
}

StreamSpec batch_norm_apply_spec(const std::vector<int64_t>& shape, Activation act, Dtype x_type,
                                 Dtype y_type, bool placed) {
  const int64_t c = shape.back();
  StreamSpec spec;
  spec.kernel_name =
      x_type == y_type
          ? fmt::format("BatchNormInference{}_{}", activation_name(act), isa::dtype_name(y_type))
          : fmt::format("BatchNormInference{}_{}_{}", activation_name(act), isa::dtype_name(x_type),
                        isa::dtype_name(y_type));
  spec.out_type = y_type;
  spec.out_shape = shape;
  spec.inputs = {StreamInput{x_type, broadcast_view(shape, shape), shape},
                 StreamInput{Dtype::F32, broadcast_view({c}, shape), {c}},
                 StreamInput{Dtype::F32, broadcast_view({c}, shape), {c}}};
  const bool x16 = x_type == Dtype::F16, y16 = y_type == Dtype::F16;
  if (y16) spec.temps = {TempSpec{"y (f32)", 4, 0}};
  spec.compute = [act, x16, y16](KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    const uint64_t y = y16 ? t.temp[0] : t.out;
    if (x16) vec_convert(b, Dtype::F32, Dtype::F16, y, t.in[0], RoundMode::kRint, n);
    vec_binary(b, Opcode::op_vmul, Dtype::F32, y, x16 ? y : t.in[0], t.in[1], n);
    vec_binary(b, Opcode::op_vadd, Dtype::F32, y, y, t.in[2], n);
    append_activation(b, act, y, n);
    if (y16) vec_convert(b, Dtype::F16, Dtype::F32, t.out, y, RoundMode::kRint, n);
  };
  // Placed where x or y is f16 (the conversions make the pass vector-bound); an f32 pass is
  // memory-bound and measured no faster placed (docs/compiler.md "The batch norm's passes in
  // bank windows"), so it keeps the layout above.
  if (placed && (x16 || y16)) {
    // Windows: x 0 (f16: its raw tile 1, widened into the temp at 0), a 2, shift 3, a scratch
    // tile 1, the output 2. The steps after x * a alternate between windows 0 and 1, the last
    // into the output where y is f32.
    spec.inputs[0].window = x16 ? 1 : 0;
    spec.inputs[1].window = 2;
    spec.inputs[2].window = 3;
    spec.out_window = 2;
    spec.temps.clear();
    if (x16) spec.temps.push_back(TempSpec{"x (f32)", 4, 0, 0});
    spec.temps.push_back(TempSpec{"scratch (f32)", 4, 0, 1});
    spec.compute = [act, x16, y16](KernelBuilder& b, const TileOperands& t) {
      const Reg& n = *t.count;
      const uint64_t x32 = x16 ? t.temp[0] : t.in[0], other = t.temp[x16 ? 1 : 0];
      if (x16) vec_convert(b, Dtype::F32, Dtype::F16, x32, t.in[0], RoundMode::kRint, n);
      vec_binary(b, Opcode::op_vmul, Dtype::F32, other, x32, t.in[1], n);
      std::vector<std::function<void(uint64_t, uint64_t)>> steps = {[&](uint64_t d, uint64_t s) {
        vec_binary(b, Opcode::op_vadd, Dtype::F32, d, s, t.in[2], n);
      }};
      if (act == Activation::kRelu)
        steps.push_back(
            [&](uint64_t d, uint64_t s) { vec_unary(b, Opcode::op_vrelu, Dtype::F32, d, s, n); });
      if (act == Activation::kRelu6) {
        steps.push_back(
            [&](uint64_t d, uint64_t s) { f32_scalar(b, Opcode::op_vmaxs, d, s, 0.0, n); });
        steps.push_back(
            [&](uint64_t d, uint64_t s) { f32_scalar(b, Opcode::op_vmins, d, s, 6.0, n); });
      }
      uint64_t y = other;
      for (size_t i = 0; i < steps.size(); ++i) {
        const uint64_t d = i + 1 == steps.size() && !y16 ? t.out : y == other ? x32 : other;
        steps[i](d, y);
        y = d;
      }
      if (y16) vec_convert(b, Dtype::F16, Dtype::F32, t.out, y, RoundMode::kRint, n);
    };
  }
  return spec;
}

void append_batch_norm_apply(CompiledKernel& k, const CompileContext& ctx, const ArgRef& x,
                             const std::vector<int64_t>& shape, const BatchNormFold& fold,
                             Activation act, Dtype x_type, Dtype y_type, bool placed) {
  const StreamSpec spec = batch_norm_apply_spec(shape, act, x_type, y_type, placed);
  k.launches.push_back(with_args(build_stream_kernel(ctx.op.str(), spec, ctx.cfg),
                                 {x, fold.a, fold.shift, output_ref(0)}));
}

void append_bias_epilogue(CompiledKernel& k, const CompileContext& ctx, int bias_input, bool relu) {
  const std::vector<int64_t>& shape = k.outputs[0].shape;
  const int64_t c = shape.back();
  const Dtype io = device_dtype(k.outputs[0].dtype);
  const bool f16 = io == Dtype::F16;
  StreamSpec spec;
  spec.kernel_name = fmt::format("{}_{}", relu ? "BiasAddRelu" : "BiasAdd", isa::dtype_name(io));
  spec.out_type = io;
  spec.out_shape = shape;
  spec.inputs = {StreamInput{io, broadcast_view(shape, shape), shape},
                 StreamInput{Dtype::F32, broadcast_view({c}, shape), {c}}};
  if (f16) spec.temps = {TempSpec{"y (f32)", 4, 0}};
  spec.compute = [relu, f16](KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    const uint64_t y = f16 ? t.temp[0] : t.out;
    if (f16) vec_convert(b, Dtype::F32, Dtype::F16, y, t.in[0], RoundMode::kRint, n);
    vec_binary(b, Opcode::op_vadd, Dtype::F32, y, f16 ? y : t.in[0], t.in[1], n);
    if (relu) vec_unary(b, Opcode::op_vrelu, Dtype::F32, y, y, n);
    if (f16) vec_convert(b, Dtype::F16, Dtype::F32, t.out, y, RoundMode::kRint, n);
  };
  k.launches.push_back(with_args(build_stream_kernel(ctx.op.str(), spec, ctx.cfg),
                                 {output_ref(0), input_ref(bias_input), output_ref(0)}));
}

namespace {

CompiledKernel compile_batch_norm_inference(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 5 && op.inputs.size() != 6)
    op.fail(
        fmt::format("takes 5 inputs (x, scale, offset, mean, variance) or 6 (and bias), {} "
                    "given",
                    op.inputs.size()));
  const TensorDesc& x = op.inputs[0];
  if (x.dtype != DataType::F32)
    op.fail(fmt::format("x is {}, only f32 is supported", data_type_name(x.dtype)));
  if (auto t = op.attr_type("T"); t && *t != x.dtype)
    op.fail(fmt::format("attribute T = {} does not match x's {}", data_type_name(*t),
                        data_type_name(x.dtype)));
  if (x.shape.empty()) op.fail("x must have rank >= 1 (channels last)");
  // y f32, or f16 (Tout: the graph fusion's fp16 hand-off to convolutions, which read f16)
  const DataType y_type = op.attr_type("Tout").value_or(DataType::F32);
  if (y_type != DataType::F32 && y_type != DataType::F16)
    op.fail(fmt::format("attribute Tout = {}: f32 or f16 expected", data_type_name(y_type)));
  CompiledKernel k;
  k.outputs = {TensorDesc{y_type, x.shape}};
  if (x.num_elements() == 0) return k;
  const BatchNormFold fold = append_batch_norm_fold(k, ctx, 1, x.shape);
  append_batch_norm_apply(k, ctx, input_ref(0), x.shape, fold, activation_attr(op), Dtype::F32,
                          device_dtype(y_type));
  return k;
}

CompiledKernel compile_add_relu(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 2) op.fail(fmt::format("takes 2 inputs, {} given", op.inputs.size()));
  const DataType dt = op.inputs[0].dtype;
  if (op.inputs[1].dtype != dt)
    op.fail(fmt::format("inputs have different dtypes ({} and {})", data_type_name(dt),
                        data_type_name(op.inputs[1].dtype)));
  if (dt != DataType::F32 && dt != DataType::F16 && dt != DataType::BF16)
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16)", data_type_name(dt)));
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the inputs' {}", data_type_name(*t),
                        data_type_name(dt)));
  auto shape = broadcast_shapes(op.inputs[0].shape, op.inputs[1].shape);
  if (!shape)
    op.invalid(fmt::format("shapes {} and {} are not broadcast-compatible",
                           shape_str(op.inputs[0].shape), shape_str(op.inputs[1].shape)));
  const TensorDesc out{dt, *shape};
  StreamSpec spec;
  spec.kernel_name = fmt::format("AddRelu_{}", data_type_name(dt));
  spec.inputs = stream_inputs(op.inputs, out.shape);
  spec.out_type = device_dtype(dt);
  spec.out_shape = out.shape;
  // bf16 without bf16 arithmetic: in f32, rounded once (the ReLU after the rounding of the sum
  // or before it gives the same bits).
  const bool widen = widens_bf16(device_dtype(dt), ctx.cfg);
  const Dtype type = widen ? Dtype::F32 : device_dtype(dt);
  spec.compute = [type](KernelBuilder& b, const TileOperands& t) {
    vec_binary(b, Opcode::op_vadd, type, t.out, t.in[0], t.in[1], *t.count);
    vec_unary(b, Opcode::op_vrelu, type, t.out, t.out, *t.count);
  };
  if (widen) widen_bf16_tile_work(spec, 2);
  return stream_kernel(ctx, out, spec);
}

}  // namespace

CompiledKernel compile_fused(const CompileContext& ctx) {
  if (ctx.op.type == "BatchNormInference") return compile_batch_norm_inference(ctx);
  if (ctx.op.type == "AddRelu") return compile_add_relu(ctx);
  ctx.op.fail("internal: not a fused op");
}

}  // namespace npusim::compiler::ops
