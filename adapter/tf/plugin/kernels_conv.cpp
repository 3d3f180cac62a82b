// Convolutions (Conv2D, depthwise, and their input / filter gradients: adapter/compiler/ops/
// conv2d.cpp on the cube), pooling (MaxPool, AvgPool and gradients: ops/pool.cpp) and fused
// batch normalisation (FusedBatchNormV3 and its gradient: ops/batchnorm.cpp) on f32/f16/bf16,
// NHWC. The shape operands input_sizes, filter_sizes and orig_input_shape are HostMemory and
// read into the compiler's attributes of the same names. What the compiler rejects (NCHW,
// depthwise channel multipliers > 16, windows > 255, ...) fails as UnimplementedError naming
// the op; docs/compiler.md lists the limits.
#include "adapter/tf/plugin/compiled_op_table.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {
namespace {

using K = AttrSpec::Kind;

// TF's window attributes of Conv2D, DepthwiseConv2dNative, the pools and their gradients (a
// node lacking one, e.g. pooling's dilations, leaves it out).
const std::vector<AttrSpec> kWindowAttrs = {
    {"T", K::kType},           {"strides", K::kInts},          {"padding", K::kString},
    {"explicit_paddings", K::kInts}, {"data_format", K::kString}, {"dilations", K::kInts},
    {"ksize", K::kInts}};

const std::vector<AttrSpec> kBatchNormAttrs = {
    {"T", K::kType},           {"U", K::kType},                {"epsilon", K::kFloat},
    {"exponential_avg_factor", K::kFloat}, {"data_format", K::kString},
    {"is_training", K::kBool}};

CompiledOpDef window_op(const char* op, std::vector<HostArg> host = {}) {
  return {op, {{"T", kFloatTypes}}, kWindowAttrs, std::move(host)};
}

}  // namespace

rt::Status register_conv_kernels() {
  using H = HostAttrInput;
  const HostArg input_sizes{"input_sizes", {0, "input_sizes"}};
  const HostArg filter_sizes{"filter_sizes", {1, "filter_sizes"}};
  return register_compiled_ops({
      window_op("Conv2D"),
      window_op("Conv2DBackpropInput", {input_sizes}),
      window_op("Conv2DBackpropFilter", {filter_sizes}),
      window_op("DepthwiseConv2dNative"),
      window_op("DepthwiseConv2dNativeBackpropInput", {input_sizes}),
      window_op("DepthwiseConv2dNativeBackpropFilter", {filter_sizes}),
      window_op("MaxPool"),
      window_op("MaxPoolGrad"),
      window_op("AvgPool"),
      window_op("AvgPoolGrad", {{"orig_input_shape", {0, "orig_input_shape", H::Kind::kInts}}}),
      // Scale, offset, mean and variance are f32 (U) for every T, as TF's kernels register.
      {"FusedBatchNormV3", {{"T", kFloatTypes}, {"U", {TF_FLOAT}}}, kBatchNormAttrs, {}},
      {"FusedBatchNormGradV3", {{"T", kFloatTypes}, {"U", {TF_FLOAT}}}, kBatchNormAttrs, {}},
  });
}

}  // namespace npusim::tf
