// BiasAdd (and the legacy BiasAddV1) and BiasAddGrad, attr data_format "NHWC" (default: the
// channel is the last dim) or "NCHW" (the channel is dim 1); value of rank >= 2, bias [C].
//   BiasAdd      value + bias broadcast along the channel: the element-wise stream kernel
//                (NHWC: the bias is resident in the UB, one period of C; NCHW: gathered per
//                piece of H*W elements). f32/f16/bf16 as AddV2 (one rounding, TF's result bit
//                for bit), s32 wrapping.
//   BiasAddGrad  the sum of out_backprop over every dim but the channel, f16/bf16 accumulated
//                in f32 (as TF's AccumulatorType), rounded once, by the reduction engine
//                (ops/reduce.h). It splits the channels over the cores (C = 256: 16 channels a
//                block, 16 blocks); where that leaves vector cores idle or takes two launches
//                (C = 64: partial sums over the pixels, then their combination), the channel is
//                last, T is f32 or f16 with whole 32-byte pixels and every vector core gets at
//                least kMinPixelsPerCore pixels (a convolution's bias gradient), by the channel
//                sums instead (ops/channel.h: the pixels split over every vector core, their
//                partials added per channel and rounded to T as they are stored). Measured,
//                docs/compiler.md.
#include <fmt/format.h>

#include "adapter/compiler/ops/channel.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/reduce.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

namespace {

// The pixels per vector core from which BiasAddGrad takes the channel sums. # estimate: their
// three launches of 2026-12-03 (sums, partials, rounding; now two, the rounding in the
// partials' launch, and one on split chips) cost about 5,000 cycles more than the engine's one
// on the 910 (f16 1x7x7x64: 7,669 against 2,477), which a core's share of 128 pixels or more
// outweighs where the engine leaves half the cores idle or takes two launches (docs/compiler.md
// "BiasAddGrad").
constexpr int64_t kMinPixelsPerCore = 128;

// The channel dim of a value of `rank` under the op's data_format.
size_t channel_dim(const OpDesc& op, size_t rank) {
  const std::string fmt_attr = op.attr_string("data_format", "NHWC");
  if (rank < 2) op.invalid("the value must have at least 2 dimensions");
  if (fmt_attr == "NHWC" || op.type == "BiasAddV1") return rank - 1;
  if (fmt_attr == "NCHW") return 1;
  op.fail(fmt::format("data_format '{}' is not supported (NHWC, NCHW)", fmt_attr));
}

void check_dtype(const OpDesc& op, DataType dt) {
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the input's {}", data_type_name(*t),
                        data_type_name(dt)));
  if (!data_type_is_float(dt) && dt != DataType::S32)
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16, s32)", data_type_name(dt)));
}

CompiledKernel compile_bias_add(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 2) op.fail(fmt::format("takes 2 inputs, {} given", op.inputs.size()));
  const TensorDesc& value = op.inputs[0];
  const TensorDesc& bias = op.inputs[1];
  check_dtype(op, value.dtype);
  if (bias.dtype != value.dtype)
    op.fail(fmt::format("bias ({}) and value ({}) have different dtypes",
                        data_type_name(bias.dtype), data_type_name(value.dtype)));
  const size_t c = channel_dim(op, value.shape.size());
  if (bias.shape.size() != 1 || bias.shape[0] != value.shape[c])
    op.invalid(fmt::format("bias {} must be a vector of the {} channels of dim {}",
                           shape_str(bias.shape), value.shape[c], c));
  // The bias as a tensor broadcastable to the value: [C] (NHWC) or [C, 1, ..., 1] (NCHW).
  std::vector<int64_t> bshape{value.shape[c]};
  bshape.resize(value.shape.size() - c, 1);
  StreamSpec spec;
  spec.kernel_name = fmt::format("BiasAdd_{}", data_type_name(value.dtype));
  spec.inputs = stream_inputs({value, TensorDesc{bias.dtype, bshape}}, value.shape);
  spec.inputs[1].shape = bias.shape;
  spec.out_type = device_dtype(value.dtype);
  spec.out_shape = value.shape;
  // AddV2's tile work (bf16 widened where the vector unit has no bf16 arithmetic); s32 adds.
  const isa::Dtype type = device_dtype(value.dtype);
  if (!binary_tile_work("AddV2", type, ctx.cfg.vector_bf16_arithmetic, spec))
    spec.compute = [type](KernelBuilder& b, const TileOperands& tile) {
      vec_binary(b, isa::Opcode::op_vadd, type, tile.out, tile.in[0], tile.in[1], *tile.count);
    };
  return stream_kernel(ctx, value, spec);
}

CompiledKernel compile_bias_add_grad(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 1) op.fail(fmt::format("takes 1 input, {} given", op.inputs.size()));
  const TensorDesc& g = op.inputs[0];
  check_dtype(op, g.dtype);
  const size_t c = channel_dim(op, g.shape.size());
  ReduceRequest req;
  req.kind = ReduceKind::kSum;
  req.input = g;
  req.reduced.assign(g.shape.size(), true);
  req.reduced[c] = false;
  req.out_type = g.dtype;
  LaunchPlan plan({TensorDesc{g.dtype, {g.shape[c]}}});
  append_reduce(plan, ctx, req, LaunchPlan::input(0), LaunchPlan::output(0));
  CompiledKernel reduce = std::move(plan).finish();
  const CoreKindConfig* vector =
      ctx.cfg.core_kind(ctx.cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE);
  const int64_t cores = vector ? vector->count : 0;
  int64_t used = 0;
  for (const Launch& l : reduce.launches) used = std::max<int64_t>(used, l.block_dim);
  const int64_t channels = g.shape[c], size = data_type_bytes(g.dtype);
  const int64_t pixels = channels ? g.num_elements() / channels : 0;
  const bool engine_idle_or_two = used < cores || reduce.launches.size() > 1;
  if (c + 1 == g.shape.size() && (g.dtype == DataType::F32 || g.dtype == DataType::F16) &&
      engine_idle_or_two && pixels >= cores * kMinPixelsPerCore && channels % 8 == 0 &&
      (channels * size) % 32 == 0) {
    CompiledKernel k;
    k.outputs = {TensorDesc{g.dtype, {channels}}};
    ChannelSumSpec s;
    s.kind = ChannelSumSpec::Kind::kSum;
    s.a_type = device_dtype(g.dtype);
    s.pixels = pixels;
    s.cp = channels;
    // The most pixels per raw tile (ops/channel.cpp) on split chips: a plain sum's vector work
    // per element is the least of the channel sums' (measured, docs/compiler.md).
    s.raw_tile_first = ctx.cfg.split;
    // The epilogue rounds the f32 sums to T as it stores them (f16: vconv, round to nearest
    // even, as a Cast's).
    const ChannelEpilogueSpec e =
        rounded_sums_epilogue("BiasAddGradSums", channels, device_dtype(g.dtype));
    append_channel_sum_epilogue(k, op.str(), s, {input_ref(0)}, e, {output_ref(0)}, ctx.cfg,
                                channel_epilogue_in_kernel(ctx.cfg));
    return k;
  }
  return reduce;
}

}  // namespace

CompiledKernel compile_bias(const CompileContext& ctx) {
  if (ctx.op.type == "BiasAddGrad") return compile_bias_add_grad(ctx);
  return compile_bias_add(ctx);
}

}  // namespace npusim::compiler::ops
