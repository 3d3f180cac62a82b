// THE op table: every TF op the compiler accepts, with the family that compiles it. Adding an
// op = adding a row here (and its code in the family's file); see docs/compiler.md.
#include "adapter/compiler/ops/registry.h"

#include "adapter/compiler/ops/int64.h"
#include "adapter/compiler/ops/random.h"

namespace npusim::compiler::ops {

const std::vector<OpEntry>& op_table() {
  static const std::vector<OpEntry> table = {
      // element-wise binary with broadcasting (ops/binary.cpp)
      {"AddV2", "binary", compile_binary},
      {"Add", "binary", compile_binary},
      {"Sub", "binary", compile_binary},
      {"Mul", "binary", compile_binary},
      {"RealDiv", "binary", compile_binary},
      {"Maximum", "binary", compile_binary},
      {"Minimum", "binary", compile_binary},
      {"SquaredDifference", "binary", compile_binary},
      {"Equal", "binary", compile_binary},
      {"NotEqual", "binary", compile_binary},
      {"Less", "binary", compile_binary},
      {"LessEqual", "binary", compile_binary},
      {"Greater", "binary", compile_binary},
      {"GreaterEqual", "binary", compile_binary},
      {"DivNoNan", "binary", compile_binary},
      {"Pow", "binary", compile_binary},
      {"LogicalAnd", "binary", compile_binary},
      {"LogicalOr", "binary", compile_binary},
      // element-wise unary (ops/unary.cpp)
      {"Neg", "unary", compile_unary},
      {"Abs", "unary", compile_unary},
      {"Exp", "unary", compile_unary},
      {"Log", "unary", compile_unary},
      {"Sqrt", "unary", compile_unary},
      {"Rsqrt", "unary", compile_unary},
      {"Square", "unary", compile_unary},
      {"Reciprocal", "unary", compile_unary},
      {"Relu", "unary", compile_unary},
      {"Floor", "unary", compile_unary},
      {"Ceil", "unary", compile_unary},
      {"Round", "unary", compile_unary},
      {"Sign", "unary", compile_unary},
      {"Log1p", "unary", compile_unary},
      {"IsFinite", "unary", compile_unary},
      {"LogicalNot", "unary", compile_unary},
      // dtype conversion (ops/cast.cpp)
      {"Cast", "cast", compile_cast},
      // cube (ops/matmul.cpp)
      {"MatMul", "matmul", compile_matmul},
      // data movement: strided copies assembled in the UB (ops/layout.cpp)
      {"Transpose", "layout", compile_layout},
      {"ConcatV2", "layout", compile_layout},
      {"Pack", "layout", compile_layout},
      {"Unpack", "layout", compile_layout},
      {"Split", "layout", compile_layout},
      {"SplitV", "layout", compile_layout},
      {"Slice", "layout", compile_layout},
      {"StridedSlice", "layout", compile_layout},
      {"StridedSliceGrad", "layout", compile_layout},
      {"Pad", "layout", compile_layout},
      {"PadV2", "layout", compile_layout},
      {"MirrorPad", "layout", compile_layout},
      {"Tile", "layout", compile_layout},
      {"BroadcastTo", "layout", compile_layout},
      // index-driven data movement (ops/gather.cpp)
      {"GatherV2", "gather", compile_gather},
      {"UnsortedSegmentSum", "gather", compile_gather},
      {"OneHot", "gather", compile_gather},
      // generators (ops/fill.cpp)
      {"Fill", "fill", compile_fill},
      {"ZerosLike", "fill", compile_fill},
      {"OnesLike", "fill", compile_fill},
      {"Range", "fill", compile_fill},
      // selection and clipping, streamed element-wise (ops/select.cpp)
      {"Select", "select", compile_select},
      {"SelectV2", "select", compile_select},
      {"ClipByValue", "select", compile_select},
      // s64 floor division on the scalar unit (ops/int64.cpp)
      {"FloorMod", "int64", compile_s64_floor},
      {"FloorDiv", "int64", compile_s64_floor},
      // stateless random numbers, Philox4x32-10 as TF (ops/random.cpp)
      {"StatelessRandomGetKeyCounter", "random", compile_random},
      {"StatelessRandomUniformV2", "random", compile_random},
      // scans (ops/scan.cpp)
      {"Cumsum", "scan", compile_scan},
      // batched products on the cube, Einsum as BatchMatMul + transposes (ops/batch_matmul.cpp)
      {"BatchMatMulV2", "batch_matmul", compile_batch_matmul},
      {"BatchMatMul", "batch_matmul", compile_batch_matmul},
      {"Einsum", "batch_matmul", compile_batch_matmul},
      // reductions over any set of axes (ops/reduce.cpp)
      {"Sum", "reduce", compile_reduce},
      {"Mean", "reduce", compile_reduce},
      {"Max", "reduce", compile_reduce},
      {"Min", "reduce", compile_reduce},
      {"Prod", "reduce", compile_reduce},
      {"ArgMax", "reduce", compile_reduce},
      {"ArgMin", "reduce", compile_reduce},
      // softmax over the last axis and the cross-entropy losses (ops/softmax.cpp)
      {"Softmax", "softmax", compile_softmax},
      {"LogSoftmax", "softmax", compile_softmax},
      {"SoftmaxCrossEntropyWithLogits", "softmax", compile_softmax},
      {"SparseSoftmaxCrossEntropyWithLogits", "softmax", compile_softmax},
      // activations, their gradients and L2Loss (ops/activation.cpp)
      {"Relu6", "activation", compile_activation},
      {"Elu", "activation", compile_activation},
      {"Selu", "activation", compile_activation},
      {"Sigmoid", "activation", compile_activation},
      {"Tanh", "activation", compile_activation},
      {"Softplus", "activation", compile_activation},
      {"Gelu", "activation", compile_activation},
      {"GeluGrad", "activation", compile_activation},
      {"ReluGrad", "activation", compile_activation},
      {"Relu6Grad", "activation", compile_activation},
      {"EluGrad", "activation", compile_activation},
      {"SeluGrad", "activation", compile_activation},
      {"SigmoidGrad", "activation", compile_activation},
      {"TanhGrad", "activation", compile_activation},
      {"SoftplusGrad", "activation", compile_activation},
      {"L2Loss", "activation", compile_activation},
      // bias (ops/bias.cpp)
      {"BiasAdd", "bias", compile_bias},
      {"BiasAddV1", "bias", compile_bias},
      {"BiasAddGrad", "bias", compile_bias},
      // convolutions on the cube, NHWC (ops/conv2d.cpp, kernels in ops/conv_cube.cpp)
      {"Conv2D", "conv2d", compile_conv2d},
      {"Conv2DBatchNormInference", "fused", compile_conv2d},
      {"Conv2DBackpropInput", "conv2d", compile_conv2d},
      {"Conv2DBackpropFilter", "conv2d", compile_conv2d},
      {"DepthwiseConv2dNative", "conv2d", compile_conv2d},
      {"DepthwiseConv2dNativeBackpropInput", "conv2d", compile_conv2d},
      {"DepthwiseConv2dNativeBackpropFilter", "conv2d", compile_conv2d},
      // pooling on the vector cores (ops/pool.cpp)
      {"MaxPool", "pool", compile_pool},
      {"AvgPool", "pool", compile_pool},
      {"MaxPoolGrad", "pool", compile_pool},
      {"AvgPoolGrad", "pool", compile_pool},
      // batch normalisation: per-channel sums (ops/channel.cpp) + streamed passes
      // (ops/batchnorm.cpp)
      {"FusedBatchNormV3", "batchnorm", compile_batchnorm},
      {"FusedBatchNormGradV3", "batchnorm", compile_batchnorm},
      // fused optimizer updates, the new values as outputs (ops/optimizer.cpp)
      {"ResourceApplyGradientDescent", "optimizer", compile_optimizer},
      {"ResourceApplyMomentum", "optimizer", compile_optimizer},
      {"ResourceApplyAdam", "optimizer", compile_optimizer},
      {"ApplyGradientDescent", "optimizer", compile_optimizer},
      {"ApplyMomentum", "optimizer", compile_optimizer},
      {"ApplyAdam", "optimizer", compile_optimizer},
      // Inference fusions made by the TF plugin's graph pass (ops/fused.cpp)
      {"BatchNormInference", "fused", compile_fused},
      {"AddRelu", "fused", compile_fused},
  };
  return table;
}

}  // namespace npusim::compiler::ops
