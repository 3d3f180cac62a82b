// THE op table: every TF op the compiler accepts, with the family that compiles it and how the
// TF plugin registers its NPU kernel (kernel class, type constraints, host-memory inputs).
// Adding an op = adding a row here (and its code in the family's file); see docs/compiler.md.
#include "adapter/compiler/ops/registry.h"

#include <algorithm>
#include <utility>

#include "adapter/compiler/ops/fused_elementwise.h"
#include "adapter/compiler/ops/int64.h"
#include "adapter/compiler/ops/random.h"

namespace npusim::compiler::ops {
namespace {

using K = TfKernel;
using H = HostAttrInput::Kind;
using DT = DataType;

// An NPU kernel with one list of type constraints (none: the op has no type attribute).
TfRegistration npu(TfKernel kernel, std::vector<TypeConstraint> types = {},
                   std::vector<HostAttrInput> host_inputs = {}) {
  return {kernel, {std::move(types)}, std::move(host_inputs), nullptr};
}

// An NPU kernel whose only type attribute is T.
TfRegistration npu_t(TfKernel kernel, const std::vector<DataType>& t,
                     std::vector<HostAttrInput> host_inputs = {}) {
  return npu(kernel, {{"T", t}}, std::move(host_inputs));
}

// No NPU kernel, for `reason`.
TfRegistration unregistered(const char* reason) { return {K::kNone, {}, {}, reason}; }

std::vector<DataType> with(std::vector<DataType> types, DataType t) {
  types.push_back(t);
  return types;
}

std::vector<DataType> without(std::vector<DataType> types, DataType t) {
  types.erase(std::remove(types.begin(), types.end(), t), types.end());
  return types;
}

// Float arithmetic and comparisons, and the scalar unit's int64 ones (ops/int64.h).
const std::vector<DataType> kFloatS64Types = with(kFloatTypes, DT::S64);
// Where TensorFlow registers an int32 kernel for DEVICE_DEFAULT (host-memory shape arithmetic:
// ConcatV2, Unpack, Slice, Fill, ZerosLike, OnesLike), int32 is left to it, so shape tensors
// stay on the host as TensorFlow's other devices keep them.
const std::vector<DataType> kMoveNoS32Types = without(kMoveTypes, DT::S32);
// The bitwise ops: vand / vor / vnot act on 16-bit lanes, an int32 element being two.
const std::vector<DataType> kBitwiseTypes = {DT::S32, DT::S16, DT::U16};

// Every Cast registration: TensorFlow refuses a node that two registrations of one op match, so
// the (SrcT, DstT) sets must not overlap. One list per DstT, naming the SrcT the compiler
// converts to it bit-exactly as TF's CPU kernel (tests/tf/test_kernels_cast.py checks every
// pair on edge values):
//   - between the floats, and float <-> int32/int16/uint16/int8/uint8 (to integers: values in
//     range; TF's out-of-range and NaN results are undefined behaviour, the vector unit
//     saturates);
//   - everything to bool (x != 0); bool to everything (0 / 1; to int8 / uint8 a byte copy);
//   - integer -> wider integer of the same signedness, or unsigned -> wider signed (widening
//     keeps the value); not integer -> narrower or same-width (TF wraps, the vector unit
//     saturates) nor signed -> unsigned (TF wraps negative values);
//   - int64 to and from every type (the scalar unit wraps to narrower integers as TF).
// int32 inputs and outputs stay in device memory (no HostMemory): the int32 -> float label
// casts of Keras' losses run on the chip.
TfRegistration cast_registration() {
  const std::vector<DataType> any = {DT::F32, DT::F16, DT::BF16, DT::S32,  DT::S16,
                                     DT::U16, DT::S8,  DT::U8,   DT::BOOL, DT::S64};
  // Into a float, bool or int64: from everything. Into a narrower integer: from the floats,
  // int64, itself and the narrower types (bool included) that widen to it without changing the
  // value (bool -> int8 / uint8: the compiler copies the 0 / 1 bytes).
  auto into_int = [](DataType self, std::vector<DataType> narrower) {
    std::vector<DataType> v = {DT::F32, DT::F16, DT::BF16, DT::S64, self};
    v.insert(v.end(), narrower.begin(), narrower.end());
    return v;
  };
  const std::pair<DataType, std::vector<DataType>> sources_by_dst[] = {
      {DT::F32, any},
      {DT::F16, any},
      {DT::BF16, any},
      {DT::BOOL, any},
      {DT::S64, any},
      {DT::S32, into_int(DT::S32, {DT::S16, DT::U16, DT::S8, DT::U8, DT::BOOL})},
      {DT::S16, into_int(DT::S16, {DT::S8, DT::U8, DT::BOOL})},
      {DT::U16, into_int(DT::U16, {DT::U8, DT::BOOL})},
      {DT::S8, into_int(DT::S8, {DT::BOOL})},
      {DT::U8, into_int(DT::U8, {DT::BOOL})},
  };
  TfRegistration r{K::kCast, {}, {}, nullptr};
  for (const auto& [dst, srcs] : sources_by_dst)
    r.types.push_back({{"SrcT", srcs}, {"DstT", {dst}}});
  return r;
}

const std::vector<HostAttrInput> kStridedSliceBounds = {
    {"begin", 1, "begin"}, {"end", 2, "end"}, {"strides", 3, "strides"}};

}  // namespace

const std::vector<OpEntry>& op_table() {
  static const std::vector<OpEntry> table = {
      // element-wise binary with broadcasting (ops/binary.cpp)
      {"AddV2", "binary", compile_binary, npu_t(K::kElementwise, kFloatS64Types)},
      {"Add", "binary", compile_binary, npu_t(K::kElementwise, kFloatS64Types)},
      // AddN: a streaming kernel of N-1 AddV2 steps, or past one kernel's reach several launches
      // continuing the sum (ops/fused_elementwise.cpp)
      {"AddN", "fused_elementwise", compile_add_n, npu_t(K::kElementwise, kFloatTypes)},
      {"Sub", "binary", compile_binary, npu_t(K::kElementwise, kFloatS64Types)},
      {"Mul", "binary", compile_binary, npu_t(K::kElementwise, kFloatS64Types)},
      {"RealDiv", "binary", compile_binary, npu_t(K::kElementwise, kFloatTypes)},
      {"Maximum", "binary", compile_binary, npu_t(K::kElementwise, kFloatS64Types)},
      {"Minimum", "binary", compile_binary, npu_t(K::kElementwise, kFloatS64Types)},
      {"SquaredDifference", "binary", compile_binary, npu_t(K::kElementwise, kFloatTypes)},
      {"Equal", "binary", compile_binary, npu_t(K::kElementwise, kFloatS64Types)},
      {"NotEqual", "binary", compile_binary, npu_t(K::kElementwise, kFloatS64Types)},
      {"Less", "binary", compile_binary, npu_t(K::kElementwise, kFloatS64Types)},
      {"LessEqual", "binary", compile_binary, npu_t(K::kElementwise, kFloatS64Types)},
      {"Greater", "binary", compile_binary, npu_t(K::kElementwise, kFloatS64Types)},
      {"GreaterEqual", "binary", compile_binary, npu_t(K::kElementwise, kFloatS64Types)},
      {"DivNoNan", "binary", compile_binary, npu_t(K::kElementwise, kFloatTypes)},
      {"Pow", "binary", compile_binary, npu_t(K::kElementwise, kFloatTypes)},
      {"ReciprocalGrad", "binary", compile_binary, npu_t(K::kElementwise, kFloatTypes)},
      {"SqrtGrad", "binary", compile_binary, npu_t(K::kElementwise, kFloatTypes)},
      {"RsqrtGrad", "binary", compile_binary, npu_t(K::kElementwise, kFloatTypes)},
      {"LogicalAnd", "binary", compile_binary, npu(K::kElementwise)},
      {"LogicalOr", "binary", compile_binary, npu(K::kElementwise)},
      {"BitwiseAnd", "binary", compile_binary, npu_t(K::kElementwise, kBitwiseTypes)},
      {"BitwiseOr", "binary", compile_binary, npu_t(K::kElementwise, kBitwiseTypes)},
      // element-wise unary (ops/unary.cpp)
      {"Neg", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Abs", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Exp", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Log", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Sqrt", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Rsqrt", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Square", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Reciprocal", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Relu", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Floor", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Ceil", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Round", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Sign", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Log1p", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"IsFinite", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"LogicalNot", "unary", compile_unary, npu(K::kElementwise)},
      {"Invert", "unary", compile_unary, npu_t(K::kElementwise, kBitwiseTypes)},
      {"Sin", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      {"Cos", "unary", compile_unary, npu_t(K::kElementwise, kFloatTypes)},
      // dtype conversion (ops/cast.cpp)
      {"Cast", "cast", compile_cast, cast_registration()},
      // cube (ops/matmul.cpp)
      {"MatMul", "matmul", compile_matmul, npu_t(K::kCubeProduct, kFloatTypes)},
      // MatMul -> BiasAdd [-> Relu] fused by the TF plugin's graph pass (the bias table, ReLU in
      // FIXPIPE; T = f16, bias f32: allow_mix_precision's graph pass, the bias added to the f32
      // sum before C's one rounding to f16)
      {"MatMulBiasAdd", "matmul", compile_matmul,
       npu(K::kFusedInference, {{"T", {DT::F32, DT::F16}}, {"Tbias", {DT::F32}}})},
      // data movement: strided copies assembled in the UB (ops/layout.cpp)
      {"Transpose", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveTypes, {{"perm", 1, "perm"}})},
      {"ConcatV2", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveNoS32Types, {{"axis", -1, "axis", H::kInt}})},
      {"Pack", "layout", compile_layout, npu_t(K::kDataMovement, kMoveTypes)},
      {"Unpack", "layout", compile_layout, npu_t(K::kDataMovement, kMoveNoS32Types)},
      {"Split", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveTypes, {{"split_dim", 0, "split_dim", H::kInt}})},
      {"SplitV", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveTypes,
             {{"size_splits", 1, "size_splits"}, {"split_dim", 2, "split_dim", H::kInt}})},
      {"Slice", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveNoS32Types, {{"begin", 1, "begin"}, {"size", 2, "size"}})},
      {"StridedSlice", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveTypes, kStridedSliceBounds)},
      {"StridedSliceGrad", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveTypes,
             {{"shape", 0, "shape"},
              {"begin", 1, "begin"},
              {"end", 2, "end"},
              {"strides", 3, "strides"}})},
      {"ReverseV2", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveTypes, {{"axis", 1, "axis"}})},
      {"Pad", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveTypes, {{"paddings", 1, "paddings", H::kFlatInts}})},
      {"PadV2", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveTypes, {{"paddings", 1, "paddings", H::kFlatInts}})},
      {"MirrorPad", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveTypes, {{"paddings", 1, "paddings", H::kFlatInts}})},
      {"Tile", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveTypes, {{"multiples", 1, "multiples"}})},
      {"BroadcastTo", "layout", compile_layout,
       npu_t(K::kDataMovement, kMoveTypes, {{"shape", 1, "shape"}})},
      {"XlaDynamicUpdateSlice", "layout", compile_layout,
       npu(K::kDataMovement, {{"T", kMoveTypes}, {"Tindices", kIndexTypes}})},
      // index-driven data movement (ops/gather.cpp)
      {"GatherV2", "gather", compile_gather,
       npu(K::kDataMovement, {{"Tparams", kMoveTypes}, {"Tindices", kIndexTypes}},
           {{"axis", 2, "axis", H::kInt}})},
      {"UnsortedSegmentSum", "gather", compile_gather,
       npu(K::kReduction, {{"T", kFloatS32Types}, {"Tindices", kIndexTypes}},
           {{"num_segments", 2, "num_segments", H::kInt}})},
      {"OneHot", "gather", compile_gather,
       npu(K::kDataMovement, {{"T", kMoveTypes}, {"TI", {DT::U8, DT::S8, DT::S32, DT::S64}}},
           {{"depth", 1, "depth", H::kInt}})},
      // generators (ops/fill.cpp)
      {"Fill", "fill", compile_fill, npu_t(K::kGenerator, kMoveNoS32Types, {{"dims", 0, "dims"}})},
      {"ZerosLike", "fill", compile_fill, npu_t(K::kGenerator, kMoveNoS32Types)},
      {"OnesLike", "fill", compile_fill, npu_t(K::kGenerator, kMoveNoS32Types)},
      {"Range", "fill", compile_fill,
       npu(K::kGenerator, {{"Tidx", {DT::F32}}},
           {{"start", 0, "start", H::kNumber},
            {"limit", 1, "limit", H::kNumber},
            {"delta", 2, "delta", H::kNumber}})},
      // selection and clipping, streamed element-wise (ops/select.cpp)
      {"Select", "select", compile_select, npu_t(K::kElementwise, kMoveTypes)},
      {"SelectV2", "select", compile_select, npu_t(K::kElementwise, kMoveTypes)},
      {"ClipByValue", "select", compile_select, npu_t(K::kElementwise, kFloatS32Types)},
      // s64 floor division on the scalar unit (ops/int64.cpp)
      {"FloorMod", "int64", compile_s64_floor, npu_t(K::kElementwise, {DT::S64})},
      {"FloorDiv", "int64", compile_s64_floor, npu_t(K::kElementwise, {DT::S64})},
      // stateless random numbers, Philox4x32-10 as TF (ops/random.cpp)
      {"StatelessRandomGetKeyCounter", "random", compile_random,
       npu(K::kRandom, {{"Tseed", kIndexTypes}})},
      {"StatelessRandomUniformV2", "random", compile_random,
       npu(K::kRandom, {{"dtype", kFloatTypes}, {"Tshape", kIndexTypes}},
           {{"shape", 0, "shape"}, {"alg", 3, "alg", H::kInt}})},
      // scans (ops/scan.cpp)
      {"Cumsum", "scan", compile_scan,
       npu_t(K::kReduction, kFloatS32Types, {{"axis", 1, "axis", H::kInt}})},
      // batched products on the cube, Einsum as BatchMatMul + transposes (ops/batch_matmul.cpp)
      {"BatchMatMulV2", "batch_matmul", compile_batch_matmul, npu_t(K::kCubeProduct, kFloatTypes)},
      {"BatchMatMul", "batch_matmul", compile_batch_matmul, npu_t(K::kCubeProduct, kFloatTypes)},
      {"Einsum", "batch_matmul", compile_batch_matmul, npu_t(K::kCubeProduct, kFloatTypes)},
      // reductions over any set of axes (ops/reduce.cpp)
      {"Sum", "reduce", compile_reduce,
       npu_t(K::kReduction, kFloatS32Types, {{"reduction_indices", 1, "axes"}})},
      {"Mean", "reduce", compile_reduce,
       npu_t(K::kReduction, kFloatTypes, {{"reduction_indices", 1, "axes"}})},
      {"Max", "reduce", compile_reduce,
       npu_t(K::kReduction, kFloatS32Types, {{"reduction_indices", 1, "axes"}})},
      {"Min", "reduce", compile_reduce,
       npu_t(K::kReduction, kFloatS32Types, {{"reduction_indices", 1, "axes"}})},
      {"Prod", "reduce", compile_reduce,
       npu_t(K::kReduction, kFloatS32Types, {{"reduction_indices", 1, "axes"}})},
      {"All", "reduce", compile_reduce, npu(K::kReduction, {}, {{"reduction_indices", 1, "axes"}})},
      {"Any", "reduce", compile_reduce, npu(K::kReduction, {}, {{"reduction_indices", 1, "axes"}})},
      {"ArgMax", "reduce", compile_reduce,
       npu(K::kReduction, {{"T", kFloatS32Types}, {"output_type", kIndexTypes}},
           {{"dimension", 1, "axis", H::kInt}})},
      {"ArgMin", "reduce", compile_reduce,
       npu(K::kReduction, {{"T", kFloatS32Types}, {"output_type", kIndexTypes}},
           {{"dimension", 1, "axis", H::kInt}})},
      // softmax over the last axis and the cross-entropy losses (ops/softmax.cpp)
      {"Softmax", "softmax", compile_softmax, npu_t(K::kNn, kFloatTypes)},
      {"LogSoftmax", "softmax", compile_softmax, npu_t(K::kNn, kFloatTypes)},
      {"SoftmaxCrossEntropyWithLogits", "softmax", compile_softmax, npu_t(K::kNn, kFloatTypes)},
      {"SparseSoftmaxCrossEntropyWithLogits", "softmax", compile_softmax,
       npu(K::kNn, {{"T", kFloatTypes}, {"Tlabels", kIndexTypes}})},
      // activations, their gradients and L2Loss (ops/activation.cpp)
      {"Relu6", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"Elu", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"Selu", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"Sigmoid", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"Tanh", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"Softplus", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"LeakyRelu", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"Erf", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"Erfc", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      // TF has no Gelu op (tf.nn.gelu is a composition): the plugin defines CANN's (graph
      // rewrite 11 makes it from tf.nn.gelu's approximate form).
      {"Gelu", "activation", compile_activation, npu_t(K::kLlm, kFloatTypes)},
      {"GeluGrad", "activation", compile_activation,
       unregistered("TF has no GeluGrad op (Gelu's gradient is autodiff of the composition)")},
      {"ReluGrad", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"Relu6Grad", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"EluGrad", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"SeluGrad", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"SigmoidGrad", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"TanhGrad", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"SoftplusGrad", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"LeakyReluGrad", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      {"L2Loss", "activation", compile_activation, npu_t(K::kNn, kFloatTypes)},
      // bias (ops/bias.cpp)
      {"BiasAdd", "bias", compile_bias, npu_t(K::kNn, kFloatTypes)},
      {"BiasAddV1", "bias", compile_bias,
       unregistered("legacy graph op that TF 2 never emits (tf.nn.bias_add makes BiasAdd)")},
      {"BiasAddGrad", "bias", compile_bias, npu_t(K::kNn, kFloatTypes)},
      // convolutions on the cube, NHWC (ops/conv2d.cpp, kernels in ops/conv_emitter.cpp)
      {"Conv2D", "conv2d", compile_conv2d, npu_t(K::kWindow, kFloatTypes)},
      {"Conv2DBatchNormInference", "fused", compile_conv2d,
       npu(K::kFusedInference,
           {{"T", {DT::F32}}, {"Tx", {DT::F32, DT::F16}}, {"Tout", {DT::F32, DT::F16}}})},
      // Conv2D -> BiasAdd [-> Relu] fused by the TF plugin's graph pass (the bias table, ReLU in
      // FIXPIPE)
      // (T = f16, bias f32: allow_mix_precision's graph pass; the bias table holds f32)
      {"Conv2DBiasAdd", "conv2d", compile_conv2d,
       npu(K::kFusedInference, {{"T", {DT::F32, DT::F16}}, {"Tbias", {DT::F32}}})},
      // Conv2D / Conv2DBiasAdd -> BNTrainingReduce fused by the TF plugin's graph pass
      // (CANN's Conv2D + BNTrainingReduce fusion: the convolution's vector cores compute the
      // batch norm's sums of y)
      {"Conv2DBNTrainingReduce", "conv2d", compile_conv2d,
       npu(K::kFusedInference, {{"T", {DT::F32, DT::F16}}, {"Tbias", {DT::F32}}})},
      {"Conv2DBackpropInput", "conv2d", compile_conv2d,
       npu_t(K::kWindow, kFloatTypes, {{"input_sizes", 0, "input_sizes"}})},
      {"Conv2DBackpropFilter", "conv2d", compile_conv2d,
       npu_t(K::kWindow, kFloatTypes, {{"filter_sizes", 1, "filter_sizes"}})},
      {"DepthwiseConv2dNative", "conv2d", compile_conv2d, npu_t(K::kWindow, kFloatTypes)},
      // DepthwiseConv2dNative -> BatchNormInference fused by the TF plugin's graph pass
      {"DepthwiseConv2dBatchNormInference", "fused", compile_conv2d,
       npu(K::kFusedInference,
           {{"T", {DT::F32}}, {"Tx", {DT::F32, DT::F16}}, {"Tout", {DT::F32, DT::F16}}})},
      {"DepthwiseConv2dNativeBackpropInput", "conv2d", compile_conv2d,
       npu_t(K::kWindow, kFloatTypes, {{"input_sizes", 0, "input_sizes"}})},
      {"DepthwiseConv2dNativeBackpropFilter", "conv2d", compile_conv2d,
       npu_t(K::kWindow, kFloatTypes, {{"filter_sizes", 1, "filter_sizes"}})},
      // pooling on the vector cores (ops/pool.cpp)
      {"MaxPool", "pool", compile_pool, npu_t(K::kWindow, kFloatTypes)},
      {"AvgPool", "pool", compile_pool, npu_t(K::kWindow, kFloatTypes)},
      {"MaxPoolGrad", "pool", compile_pool, npu_t(K::kWindow, kFloatTypes)},
      {"AvgPoolGrad", "pool", compile_pool,
       npu_t(K::kWindow, kFloatTypes, {{"orig_input_shape", 0, "orig_input_shape"}})},
      // batch normalisation: per-channel sums (ops/channel.cpp) + streamed passes
      // (ops/batchnorm.cpp)
      {"FusedBatchNormV3", "batchnorm", compile_batchnorm,
       npu(K::kWindow, {{"T", kFloatTypes}, {"U", {DT::F32}}})},
      {"FusedBatchNormGradV3", "batchnorm", compile_batchnorm,
       npu(K::kWindow, {{"T", kFloatTypes}, {"U", {DT::F32}}})},
      // fused optimizer updates, the new values as outputs (ops/optimizer.cpp)
      {"ResourceApplyGradientDescent", "optimizer", compile_optimizer,
       npu_t(K::kResourceApply, kFloatTypes)},
      {"ResourceApplyMomentum", "optimizer", compile_optimizer,
       npu_t(K::kResourceApply, kFloatTypes)},
      {"ResourceApplyAdam", "optimizer", compile_optimizer, npu_t(K::kResourceApply, kFloatTypes)},
      {"ApplyGradientDescent", "optimizer", compile_optimizer,
       unregistered(
           "TF1 ref-variable op; the row names the kernel ResourceApplyGradientDescent launches")},
      {"ApplyMomentum", "optimizer", compile_optimizer,
       unregistered(
           "TF1 ref-variable op; the row names the kernel ResourceApplyMomentum launches")},
      {"ApplyAdam", "optimizer", compile_optimizer,
       unregistered("TF1 ref-variable op; the row names the kernel ResourceApplyAdam launches")},
      // Inference fusions made by the TF plugin's graph pass (ops/fused.cpp)
      {"BatchNormInference", "fused", compile_fused,
       npu(K::kFusedInference, {{"T", {DT::F32}}, {"Tout", {DT::F32, DT::F16}}})},
      {"AddRelu", "fused", compile_fused, npu_t(K::kFusedInference, kFloatTypes)},
      // Lamb's norms made by the graph pass (graph_fusion.h rewrite 17), CANN's op type
      // (ops/reduce.cpp)
      {"SquareSumV1", "reduce", compile_reduce, npu_t(K::kFusedInference, kFloatTypes)},
      // allow_mix_precision's weight casts as one op, made by the graph pass (graph_fusion.h
      // rewrite 19; ops/cast.cpp)
      {"MultiTensorCast", "cast", compile_multi_tensor_cast,
       npu(K::kFusedInference, {{"SrcT", kFloatTypes}, {"DstT", kFloatTypes}})},
      // A loss scale's overflow check over the gradients in one launch, made by the graph pass
      // (graph_fusion.h rewrite 20; ops/all_finite.cpp)
      {"AllFinite", "all_finite", compile_all_finite, npu_t(K::kFusedInference, kFloatTypes)},
      // Training batch norm made by the graph pass, CANN's op types (ops/batchnorm.cpp)
      // (T = f16: x and dy in f16, statistics f32, as CANN's; allow_mix_precision's graph pass)
      {"BNTrainingReduce", "batchnorm", compile_batchnorm,
       npu_t(K::kFusedInference, {DT::F32, DT::F16})},
      {"BNTrainingUpdate", "batchnorm", compile_batchnorm,
       npu_t(K::kFusedInference, {DT::F32, DT::F16})},
      {"BNTrainingUpdateGrad", "batchnorm", compile_batchnorm,
       npu_t(K::kFusedInference, {DT::F32, DT::F16})},
      {"BNTrainingReduceGrad", "batchnorm", compile_batchnorm,
       npu_t(K::kFusedInference, {DT::F32, DT::F16})},
      {"FusedElementwise", "fused_elementwise", compile_fused_elementwise,
       npu_t(K::kFusedInference, kFloatTypes)},
      // Decoder-model kernels, CANN's op types (ops/attention.cpp, ...; TF ops: kernels_llm.cpp)
      {"FlashAttentionScore", "attention", compile_attention, npu_t(K::kLlm, kHalfTypes)},
      {"PromptFlashAttention", "attention", compile_attention, npu_t(K::kLlm, kHalfTypes)},
      {"IncreFlashAttention", "attention", compile_attention, npu_t(K::kLlm, kHalfTypes)},
      {"SwiGlu", "activation", compile_activation, npu_t(K::kLlm, kFloatTypes)},
      {"GeGlu", "activation", compile_activation, npu_t(K::kLlm, kFloatTypes)},
      // Weight-only int8 MatMul (ops/quant_matmul.cpp): T is x's type, the weight int8
      {"WeightQuantBatchMatmulV2", "quant_matmul", compile_weight_quant_matmul,
       npu_t(K::kLlm, kHalfTypes)},
      {"RmsNorm", "norm", compile_norm, npu_t(K::kLlm, kFloatTypes)},
      // (Tgamma: gamma's and beta's type, T's or f32: allow_mix_precision's graph pass keeps them
      // f32 beside an f16 x, as CANN's LayerNorm takes them; ops/norm.cpp)
      {"LayerNorm", "norm", compile_norm,
       npu(K::kLlm, {{"T", kFloatTypes}, {"Tgamma", kFloatTypes}})},
      // LayerNorm in training, CANN's op types (graph_fusion.h 12b): the forward with its row
      // statistics, the input gradient, the parameters' gradients
      {"LayerNormV3", "norm", compile_norm,
       npu(K::kLlm, {{"T", kFloatTypes}, {"Tgamma", kFloatTypes}})},
      {"LayerNormXBackpropV2", "norm", compile_norm,
       npu(K::kLlm, {{"T", kFloatTypes}, {"Tgamma", kFloatTypes}})},
      {"LayerNormBetaGammaBackpropV2", "norm", compile_norm, npu_t(K::kLlm, kFloatTypes)},
      {"RotaryPositionEmbedding", "rope", compile_rope, npu_t(K::kLlm, kFloatTypes)},
      // Variable updates made by the graph pass: the new values as outputs, like the optimizer
      // ops above (its op definition is the plugin's, kernels_fused.cpp)
      {"FusedVariableUpdate", "fused_elementwise", compile_fused_variable_update,
       npu_t(K::kResourceApply, kFloatTypes)},
  };
  return table;
}

}  // namespace npusim::compiler::ops
