// The fused inference ops the graph fusion (graph_fusion.h) puts into NPU graphs: their op
// definitions (TensorFlow has no such ops; registered through tensorflow/c/ops.h, exported by
// libtensorflow_framework.so.2) and their NPU kernels (compiled by adapter/compiler/ops/
// fused.cpp, which states the formulas):
//
//   BatchNormInference(x: T, scale: T, offset: T, mean: T, variance: T, bias: N * T) -> y: Tout
//     T in {float}; Tout in {float, half} (default float; half where the graph fusion hands y
//     to convolutions in fp16); N in {0, 1} (1: x was BiasAdd(x, bias[0]) before fusion); epsilon:
//     float; relu, relu6: bool. Two launches (per-channel fold, then y = x * a + shift [, max 0]
//     with relu; min(max(., 0), 6) with relu6: a Relu6 after the chain).
//   Conv2DBatchNormInference(x: Tx, filter: T, scale: T, offset: T, mean: T, variance: T,
//                            bias: N * T, residual: R * Tout) -> y: Tout
//     Conv2D's attributes (strides, padding, explicit_paddings, dilations, data_format) and
//     BatchNormInference's (N, epsilon, relu, relu6): the batch norm folded into the
//     convolution.
//     T in {float}; Tx, Tout in {float, half} (default float): half where the graph fusion
//     hands the activation from one such convolution to the next in fp16, the form the cube
//     reads (graph_fusion.h). R in {0, 1} (1: the graph fusion's residual AddV2 taken in,
//     rewrite 2b): y = act(y + residual), the add in Tout after the rounding.
//   DepthwiseConv2dBatchNormInference(x: Tx, filter: T, scale: T, offset: T, mean: T,
//                                     variance: T, bias: N * T, residual: R * Tout) -> y: Tout
//     the same for DepthwiseConv2dNative -> BatchNormInference (MobileNetV2's depthwise
//     convolutions): the depthwise convolution, then the batch norm's vector pass.
//   Conv2DBiasAdd(x: T, filter: T, bias: Tbias) -> y: T     T in {float, half}, Tbias in
//     {float} (default; half T: allow_mix_precision's graph pass, mixed_precision.h); Conv2D's
//     attributes and relu: bool: Conv2D -> BiasAdd [-> Relu] as one convolution starting from
//     the bias, ReLU in FIXPIPE (adapter/compiler/ops/conv2d.cpp); y's shape is left unknown
//     here.
//   Conv2DBNTrainingReduce(x: T, filter: T, bias: N * Tbias) -> y: T, sum: float,
//                          square_sum: float     T in {float, half}, N in {0, 1}, Tbias in
//     {float}; Conv2D's attributes and relu: Conv2D / Conv2DBiasAdd (N = 1) with the
//     BNTrainingReduce of its output (graph_fusion.h rewrite 15): the per-channel sum and sum
//     of squares of y computed by the convolution's kernel (adapter/compiler/ops/conv2d.cpp).
//   MatMulBiasAdd(a: T, b: T, bias: Tbias) -> product: T     T in {float, half}, Tbias in
//     {float} (default; half T: allow_mix_precision's graph pass, mixed_precision.h: CANN's
//     MatMulV2 with an f32 bias); transpose_a, transpose_b, relu: bool: MatMul -> BiasAdd
//     [-> Relu] as one cube kernel adding the bias to the f32 sum, ReLU in FIXPIPE or the UB
//     (adapter/compiler/ops/matmul.cpp).
//   AddRelu(x: T, y: T) -> z: T     T in {float, half, bfloat16}: max(x + y, 0), one launch.
//   SquareSumV1(x: N * T) -> y: N * T     T in {float, half, bfloat16}; axis: list(int);
//     keep_dims: bool; N: int >= 1 = 1: CANN's op, y[i] = Sum(Square(x[i]), axis) as one
//     reduction squaring in its f32 pass (adapter/compiler/ops/reduce.cpp; graph_fusion.h
//     rewrite 17, Lamb's norms); N > 1: rewrite 17b's multi-tensor norms.
//   MultiTensorCast(x: N * SrcT) -> y: N * DstT     SrcT, DstT in {float, half, bfloat16};
//     Truncate: bool; N: int >= 1: y[i] = Cast(x[i]) (Cast's rounding, the same bits), all in a
//     few multi-tensor launches (adapter/compiler/ops/cast.cpp; graph_fusion.h rewrite 19,
//     allow_mix_precision's weight casts); filter_n16: the members written in the forward
//     convolutions' blocked layout [Cout/16][KH][KW][Cin][16] (ops/conv.h kFilterLayoutN16;
//     rewrite 19, the convolutions' filters, which then carry _npusim_filter_layout).
//   AllFinite(x: N * T) -> y: bool     T in {float, half, bfloat16}; N: int >= 1; ranks:
//     list(int): y is true exactly when every element of every x[i] is finite, one launch
//     (adapter/compiler/ops/all_finite.cpp; graph_fusion.h rewrite 20, a loss scale's check of
//     the gradients); x[i] must have rank ranks[i] where ranks is given.
//   FusedElementwise(inputs: Tin) -> z: T     T in {float, half, bfloat16}; Tin: list of
//     {float, half, bfloat16, bool}, at least 1: T for an operand of the steps, bool for the
//     condition of a SelectV2 step (graph_fusion.h rewrite 4); steps: list(string): a chain of
//     element-wise ops as one vector kernel (adapter/compiler/ops/fused_elementwise.h states
//     the steps' form); z has the inputs' broadcast shape. Every input's type is in Tin, so
//     TensorFlow's own graph checks (a function's graph is rebuilt from the optimizer's output
//     before it runs node by node) accept a node with a bool condition.
//
//   FusedVariableUpdate(resources: M * resource, inputs: Tin)     T in {float, half,
//     bfloat16}; M >= 1; Tin: list of {float, half, bfloat16, bool} (T, another float type for
//     an input the steps cast to T: graph_fusion.h rewrite 5c, or bool for a SelectV2 step's
//     condition: a chain's, rewrite 4); steps: list(string); updates: list(int): the
//     new values of M variables of one shape from one chain of element-wise steps
//     (fused_elementwise.h), one launch; stateful, no outputs. members: int >= 1 = 1: that many
//     such updates of the same steps in one op (graph_fusion.h, rewrite 5b), member g's
//     variables the g-th M / members resources, its inputs the g-th of members equal parts of
//     the inputs; one multi-tensor launch for the small
//     ones. Its kernel is kernels_optimizer.cpp's (it updates
//     variables, on TensorFlow's C++ kernel API); registered here is only its definition.
//
//   BNTrainingReduce(x: T) -> sum: float, square_sum: float
//   BNTrainingUpdate(x: T, sum: float, square_sum: float, scale: float, offset: float,
//                    residual: R * T)
//     -> y: T, batch_mean: float, batch_variance: float     epsilon: float; relu: bool;
//     R: int in {0, 1} = 0 (1: y = relu(y + residual), graph_fusion.h rewrite 0c)
//   BNTrainingUpdateGrad(grads: T, x: T, batch_mean: float, batch_variance: float)
//     -> diff_scale: float, diff_offset: float              epsilon: float
//   BNTrainingReduceGrad(grads: T, x: T, diff_scale: float, diff_offset: float, scale: float,
//                        batch_mean: float, batch_variance: float) -> y: T     epsilon: float
//     [bias_grads = 1: -> y, bias_grad: T [C], the per-channel sum of y (rewrite 0d's BiasAddGrad)]
//     T in {float, half}: batch norm in training as CANN splits it (adapter/compiler/ops/
//     batchnorm.cpp states the formulas), x NHWC, the per-channel tensors [C].
//
// The kernels keep the fused node's name and these op types, so launch records and reports
// (npusim.op_summary()) show them as such.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/c/ops.h"

#include "adapter/tf/plugin/compiled_op_table.h"
#include "adapter/tf/plugin/graph_fusion.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/op_defs.h"
#include "adapter/tf/plugin/plugin_device.h"

namespace npusim::tf {
namespace {

// The convolution's output: unknown here (the C shape API cannot read the window attributes);
// TensorFlow's executor does not need it, the kernel computes it.
void unknown_shape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeInferenceContextSetUnknownShape(ctx, status);
}

// The numpy broadcast of all inputs' shapes (AddRelu, FusedElementwise); the C shape API has
// no broadcast helper, so the output is assembled from one-dimension subshapes of the inputs:
// per output axis (aligned at the last), an input's dimension known and not 1, else an unknown
// one, else 1. Unknown when an input's rank is; dimensions that cannot broadcast are left to
// the kernel (TensorFlow's executor does not need the shape, only later graph passes read it).
void broadcast_shape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  const int n = TF_ShapeInferenceContextNumInputs(ctx);
  std::vector<TF_ShapeHandle*> in(n);
  int64_t rank = 0;
  bool known = true;
  for (int i = 0; i < n; ++i) {
    in[i] = TF_NewShapeHandle();
    if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextGetInput(ctx, i, in[i], status);
    if (TF_GetCode(status) != TF_OK) continue;
    known = known && TF_ShapeInferenceContextRankKnown(ctx, in[i]);
    if (known) rank = std::max(rank, TF_ShapeInferenceContextRank(ctx, in[i]));
  }
  TF_ShapeHandle* out = TF_ShapeInferenceContextScalar(ctx);
  for (int64_t axis = -rank; axis < 0 && known && TF_GetCode(status) == TF_OK; ++axis) {
    int pick = -1, pick_rank = 0;
    enum { kNone, kOne, kUnknown, kKnown } best = kNone;
    for (int i = 0; i < n; ++i) {
      const int64_t r = TF_ShapeInferenceContextRank(ctx, in[i]);
      if (r + axis < 0) continue;
      TF_DimensionHandle* d = TF_NewDimensionHandle();
      TF_ShapeInferenceContextDim(ctx, in[i], r + axis, d);
      const auto kind = !TF_DimensionHandleValueKnown(d)  ? kUnknown
                        : TF_DimensionHandleValue(d) == 1 ? kOne
                                                          : kKnown;
      TF_DeleteDimensionHandle(d);
      if (kind > best) {
        best = kind;
        pick = i;
        pick_rank = static_cast<int>(r);
      }
    }
    TF_ShapeHandle* dim = TF_NewShapeHandle();
    TF_ShapeHandle* grown = TF_NewShapeHandle();
    TF_ShapeInferenceContextSubshape(ctx, in[pick], pick_rank + axis, pick_rank + axis + 1, dim,
                                     status);
    if (TF_GetCode(status) == TF_OK)
      TF_ShapeInferenceContextConcatenateShapes(ctx, out, dim, grown, status);
    std::swap(out, grown);
    TF_DeleteShapeHandle(dim);
    TF_DeleteShapeHandle(grown);
  }
  if (TF_GetCode(status) == TF_OK) {
    if (known) {
      TF_ShapeInferenceContextSetOutput(ctx, 0, out, status);
    } else {
      TF_ShapeInferenceContextSetUnknownShape(ctx, status);
    }
  }
  TF_DeleteShapeHandle(out);
  for (TF_ShapeHandle* h : in) TF_DeleteShapeHandle(h);
}

void reduce_shape(TF_ShapeInferenceContext* ctx, TF_Status* s) { channel_outputs(ctx, 0, 0, 2, s); }
void update_shape(TF_ShapeInferenceContext* ctx, TF_Status* s) { channel_outputs(ctx, 0, 1, 3, s); }
void update_grad_shape(TF_ShapeInferenceContext* ctx, TF_Status* s) {
  channel_outputs(ctx, 1, 0, 2, s);
}
// BNTrainingReduceGrad: y as grads; with bias_grads = 1 bias_grad [C] (the C shape API does not say how
// many outputs a node has: an out-of-range output 1, bias_grads = 0, is no error).
void reduce_grad_shape(TF_ShapeInferenceContext* ctx, TF_Status* s) {
  channel_outputs(ctx, 0, 1, 1, s);
  if (TF_GetCode(s) != TF_OK) return;
  channel_outputs(ctx, 0, 1, 2, s);
  if (TF_GetCode(s) != TF_OK) TF_SetStatus(s, TF_OK, "");
}

// Output i the shape of input i (MultiTensorCast).
void each_input_shape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  const int n = TF_ShapeInferenceContextNumInputs(ctx);
  TF_ShapeHandle* in = TF_NewShapeHandle();
  for (int i = 0; i < n && TF_GetCode(status) == TF_OK; ++i) {
    TF_ShapeInferenceContextGetInput(ctx, i, in, status);
    if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextSetOutput(ctx, i, in, status);
  }
  TF_DeleteShapeHandle(in);
}

// A scalar output 0 (AllFinite).
void scalar_output(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* scalar = TF_ShapeInferenceContextScalar(ctx);
  TF_ShapeInferenceContextSetOutput(ctx, 0, scalar, status);
  TF_DeleteShapeHandle(scalar);
}

// An op without outputs (FusedVariableUpdate) has no shapes to infer.
void no_outputs(TF_ShapeInferenceContext*, TF_Status*) {}

bool g_fused_ops_registered = false;
bool g_fused_elementwise_registered = false;

}  // namespace

void same_as_input0(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* in = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, in, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextSetOutput(ctx, 0, in, status);
  TF_DeleteShapeHandle(in);
}

void channel_outputs(TF_ShapeInferenceContext* ctx, int input, int first, int outputs,
                     TF_Status* status) {
  TF_ShapeHandle* in = TF_NewShapeHandle();
  TF_ShapeHandle* c = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, input, in, status);
  if (TF_GetCode(status) == TF_OK)
    TF_ShapeInferenceContextSubshape(ctx, in, -1, std::numeric_limits<int64_t>::max(), c, status);
  for (int o = 0; o < outputs && TF_GetCode(status) == TF_OK; ++o)
    TF_ShapeInferenceContextSetOutput(ctx, o, o < first ? in : c, status);
  TF_DeleteShapeHandle(c);
  TF_DeleteShapeHandle(in);
}

// An output of unknown shape (rank included): for ops whose shape the C shape API cannot
// derive (window attributes), where input 0's shape would be wrong (a strided convolution).
void unknown_output(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeInferenceContextSetUnknownShape(ctx, status);
}

rt::Status register_op_def(const OpDefSpec& spec) {
  TF_OpDefinitionBuilder* b = TF_NewOpDefinitionBuilder(spec.name);
  for (const char* in : spec.inputs) TF_OpDefinitionBuilderAddInput(b, in);
  for (const char* out : spec.outputs) TF_OpDefinitionBuilderAddOutput(b, out);
  for (const char* attr : spec.attrs) TF_OpDefinitionBuilderAddAttr(b, attr);
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, spec.shape_fn);
  if (spec.stateful) TF_OpDefinitionBuilderSetIsStateful(b, true);
  TF_Status* status = TF_NewStatus();
  TF_RegisterOpDefinition(b, status);  // takes ownership of b
  rt::Status st;
  if (TF_GetCode(status) != TF_OK)
    st = rt::Status(rt::StatusCode::internal,
                    std::string("registering op ") + spec.name + ": " + TF_Message(status));
  TF_DeleteStatus(status);
  return st;
}

bool fused_ops_registered() { return g_fused_ops_registered; }
bool fused_elementwise_registered() { return g_fused_elementwise_registered; }

rt::Status register_fused_kernels(const std::vector<TableKernelDef>& compiler_ops) {
  const OpDefSpec defs[] = {
      {"BatchNormInference",
       {"x: T", "scale: T", "offset: T", "mean: T", "variance: T", "bias: N * T"},
       {"y: Tout"},
       {"T: {float}", "Tout: {float, half} = DT_FLOAT", "N: int >= 0 = 0", "epsilon: float = 0.001",
        "relu: bool = false", "relu6: bool = false"},
       same_as_input0},
      {"Conv2DBatchNormInference",
       {"x: Tx", "filter: T", "scale: T", "offset: T", "mean: T", "variance: T", "bias: N * T",
        "residual: R * Tout"},
       {"y: Tout"},
       {"T: {float}", "Tx: {float, half} = DT_FLOAT", "Tout: {float, half} = DT_FLOAT",
        "N: int >= 0 = 0", "R: int >= 0 = 0", "epsilon: float = 0.001", "relu: bool = false",
        "relu6: bool = false", "strides: list(int)", "padding: string",
        "explicit_paddings: list(int) = []", "dilations: list(int) = [1, 1, 1, 1]",
        "data_format: string = 'NHWC'"},
       unknown_shape},
      {"DepthwiseConv2dBatchNormInference",
       {"x: Tx", "filter: T", "scale: T", "offset: T", "mean: T", "variance: T", "bias: N * T",
        "residual: R * Tout"},
       {"y: Tout"},
       {"T: {float}", "Tx: {float, half} = DT_FLOAT", "Tout: {float, half} = DT_FLOAT",
        "N: int >= 0 = 0", "R: int >= 0 = 0", "epsilon: float = 0.001", "relu: bool = false",
        "relu6: bool = false", "strides: list(int)", "padding: string",
        "explicit_paddings: list(int) = []", "dilations: list(int) = [1, 1, 1, 1]",
        "data_format: string = 'NHWC'"},
       unknown_shape},
      {"Conv2DBiasAdd",
       {"x: T", "filter: T", "bias: Tbias"},
       {"y: T"},
       {"T: {float, half}", "Tbias: {float} = DT_FLOAT", "relu: bool = false", "strides: list(int)",
        "padding: string", "explicit_paddings: list(int) = []",
        "dilations: list(int) = [1, 1, 1, 1]", "data_format: string = 'NHWC'"},
       unknown_output},
      {"Conv2DBNTrainingReduce",
       {"x: T", "filter: T", "bias: N * Tbias"},
       {"y: T", "sum: float", "square_sum: float"},
       {"T: {float, half}", "N: int >= 0 = 0", "Tbias: {float} = DT_FLOAT", "relu: bool = false",
        "strides: list(int)", "padding: string", "explicit_paddings: list(int) = []",
        "dilations: list(int) = [1, 1, 1, 1]", "data_format: string = 'NHWC'"},
       unknown_output},
      {"MatMulBiasAdd",
       {"a: T", "b: T", "bias: Tbias"},
       {"product: T"},
       {"T: {float, half}", "Tbias: {float} = DT_FLOAT", "transpose_a: bool = false",
        "transpose_b: bool = false", "relu: bool = false"},
       unknown_output},
      {"AddRelu", {"x: T", "y: T"}, {"z: T"}, {"T: {float, half, bfloat16}"}, broadcast_shape},
      {"SquareSumV1",
       {"x: N * T"},
       {"y: N * T"},
       {"T: {float, half, bfloat16}", "axis: list(int)", "keep_dims: bool = false",
        "N: int >= 1 = 1"},
       unknown_output},
      {"MultiTensorCast",
       {"x: N * SrcT"},
       {"y: N * DstT"},
       {"SrcT: {float, half, bfloat16}", "DstT: {float, half, bfloat16}",
        "Truncate: bool = false", "N: int >= 1", "filter_n16: list(int) = []"},
       each_input_shape},
      {"AllFinite",
       {"x: N * T"},
       {"y: bool"},
       {"T: {float, half, bfloat16}", "N: int >= 1", "ranks: list(int) = []"},
       scalar_output},
      {"BNTrainingReduce",
       {"x: T"},
       {"sum: float", "square_sum: float"},
       {"T: {float, half}"},
       reduce_shape},
      // R = 1: residual is added to y (in T, after y's rounding) before the ReLU (graph_fusion.h
      // rewrite 0c).
      {"BNTrainingUpdate",
       {"x: T", "sum: float", "square_sum: float", "scale: float", "offset: float",
        "residual: R * T"},
       {"y: T", "batch_mean: float", "batch_variance: float"},
       {"T: {float, half}", "R: int >= 0 = 0", "epsilon: float = 0.001", "relu: bool = false"},
       update_shape},
      // relu = true: grads is the gradient of BNTrainingUpdate(relu = true)'s y, taken back
      // through the ReLU in the kernel; fold = scale, offset (N = 2) / offset (N = 1).
      {"BNTrainingUpdateGrad",
       {"grads: T", "x: T", "batch_mean: float", "batch_variance: float", "fold: N * float"},
       {"diff_scale: float", "diff_offset: float"},
       {"T: {float, half}", "N: int >= 0 = 0", "epsilon: float = 0.001", "relu: bool = false"},
       update_grad_shape},
      {"BNTrainingReduceGrad",
       {"grads: T", "x: T", "diff_scale: float", "diff_offset: float", "scale: float",
        "batch_mean: float", "batch_variance: float", "fold: N * float"},
       {"y: T", "bias_grad: bias_grads * T"},
       {"T: {float, half}", "N: int >= 0 = 0", "bias_grads: int >= 0 = 0", "epsilon: float = 0.001",
        "relu: bool = false"},
       reduce_grad_shape},
      {"FusedElementwise",
       {"inputs: Tin"},
       {"z: T"},
       {"T: {float, half, bfloat16}", "Tin: list({float, half, bfloat16, bool}) >= 1",
        "steps: list(string)"},
       broadcast_shape},
      {"FusedVariableUpdate",
       {"resources: M * resource", "inputs: Tin"},
       {},
       {"T: {float, half, bfloat16}", "M: int >= 1",
        "Tin: list({float, half, bfloat16, bool}) >= 0", "steps: list(string)",
        "updates: list(int)", "members: int >= 1 = 1"},
       no_outputs,
       true},
  };
  for (const OpDefSpec& d : defs) {
    rt::Status st = register_op_def(d);
    if (!st.ok()) return st;
  }
  // The kernels: the op table's rows (kernel class kFusedInference).
  rt::Status st = rt::ok_status();
  bool elementwise = false;
  for (const TableKernelDef& d : compiler_ops) {
    if (st.ok()) st = register_compiled_op_kernel(d);
    elementwise = elementwise || d.op == "FusedElementwise";
  }
  // The graph pass only creates these ops once both definitions and kernels exist.
  g_fused_ops_registered = st.ok();
  g_fused_elementwise_registered = st.ok() && elementwise;
  return st;
}

}  // namespace npusim::tf
