// The fused inference ops the graph fusion (graph_fusion.h) puts into NPU graphs: their op
// definitions (TensorFlow has no such ops; registered through tensorflow/c/ops.h, exported by
// libtensorflow_framework.so.2) and their NPU kernels (compiled by adapter/compiler/ops/
// fused.cpp, which states the formulas):
//
//   BatchNormInference(x: T, scale: T, offset: T, mean: T, variance: T, bias: N * T) -> y: T
//     T in {float}; N in {0, 1} (1: x was BiasAdd(x, bias[0]) before fusion); epsilon: float;
//     relu: bool. Two launches (per-channel fold, then y = x * a + shift [, max 0]).
//   Conv2DBatchNormInference(x: Tx, filter: T, scale: T, offset: T, mean: T, variance: T,
//                            bias: N * T) -> y: Tout
//     Conv2D's attributes (strides, padding, explicit_paddings, dilations, data_format) and
//     BatchNormInference's (N, epsilon, relu): the batch norm folded into the convolution.
//     T in {float}; Tx, Tout in {float, half} (default float): half where the graph fusion
//     hands the activation from one such convolution to the next in fp16, the form the cube
//     reads (graph_fusion.h).
//   AddRelu(x: T, y: T) -> z: T     T in {float, half, bfloat16}: max(x + y, 0), one launch.
//
// The kernels keep the fused node's name and these op types, so launch records and reports
// (npusim.op_summary()) show them as such.
#include <string>

#include "tensorflow/c/ops.h"

#include "adapter/tf/plugin/compiled_op_table.h"
#include "adapter/tf/plugin/graph_fusion.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/plugin_device.h"

namespace npusim::tf {
namespace {

// The convolution's output: unknown here (the C shape API cannot read the window attributes);
// TensorFlow's executor does not need it, the kernel computes it.
void unknown_shape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeInferenceContextSetUnknownShape(ctx, status);
}

// Output 0 has the shape of input 0 (BatchNormInference: y is x's shape).
void same_as_input0(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* in = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, in, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextSetOutput(ctx, 0, in, status);
  TF_DeleteShapeHandle(in);
}

// AddRelu broadcasts; the C shape API has no broadcast helper, so the output is x's shape when
// y's dimensions are known to broadcast into x's (the residual add: equal shapes), otherwise
// unknown (TensorFlow's executor does not need it; only later graph passes read it).
void add_relu_shape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* x = TF_NewShapeHandle();
  TF_ShapeHandle* y = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, x, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextGetInput(ctx, 1, y, status);
  bool into_x = TF_GetCode(status) == TF_OK && TF_ShapeInferenceContextRankKnown(ctx, x) &&
                TF_ShapeInferenceContextRankKnown(ctx, y) &&
                TF_ShapeInferenceContextRank(ctx, y) <= TF_ShapeInferenceContextRank(ctx, x);
  if (into_x) {
    const int64_t rx = TF_ShapeInferenceContextRank(ctx, x);
    const int64_t ry = TF_ShapeInferenceContextRank(ctx, y);
    for (int64_t i = 1; i <= ry && into_x; ++i) {
      TF_DimensionHandle* dx = TF_NewDimensionHandle();
      TF_DimensionHandle* dy = TF_NewDimensionHandle();
      TF_ShapeInferenceContextDim(ctx, x, rx - i, dx);
      TF_ShapeInferenceContextDim(ctx, y, ry - i, dy);
      const int64_t vx = TF_DimensionHandleValue(dx), vy = TF_DimensionHandleValue(dy);
      into_x = vy == 1 || (vx >= 0 && vx == vy);
      TF_DeleteDimensionHandle(dx);
      TF_DeleteDimensionHandle(dy);
    }
  }
  if (TF_GetCode(status) == TF_OK) {
    if (into_x) {
      TF_ShapeInferenceContextSetOutput(ctx, 0, x, status);
    } else {
      TF_ShapeInferenceContextSetUnknownShape(ctx, status);
    }
  }
  TF_DeleteShapeHandle(x);
  TF_DeleteShapeHandle(y);
}

struct OpDefSpec {
  const char* name;
  std::vector<const char*> inputs, outputs, attrs;
  void (*shape_fn)(TF_ShapeInferenceContext*, TF_Status*);
};

rt::Status register_op_def(const OpDefSpec& spec) {
  TF_OpDefinitionBuilder* b = TF_NewOpDefinitionBuilder(spec.name);
  for (const char* in : spec.inputs) TF_OpDefinitionBuilderAddInput(b, in);
  for (const char* out : spec.outputs) TF_OpDefinitionBuilderAddOutput(b, out);
  for (const char* attr : spec.attrs) TF_OpDefinitionBuilderAddAttr(b, attr);
  TF_OpDefinitionBuilderSetShapeInferenceFunction(b, spec.shape_fn);
  TF_Status* status = TF_NewStatus();
  TF_RegisterOpDefinition(b, status);  // takes ownership of b
  rt::Status st;
  if (TF_GetCode(status) != TF_OK)
    st = rt::Status(rt::StatusCode::internal, std::string("registering op ") + spec.name +
                                                  ": " + TF_Message(status));
  TF_DeleteStatus(status);
  return st;
}

bool g_fused_ops_registered = false;

}  // namespace

bool fused_ops_registered() { return g_fused_ops_registered; }

rt::Status register_fused_kernels(const std::vector<TableKernelDef>& compiler_ops) {
  const OpDefSpec defs[] = {
      {"BatchNormInference",
       {"x: T", "scale: T", "offset: T", "mean: T", "variance: T", "bias: N * T"},
       {"y: T"},
       {"T: {float}", "N: int >= 0 = 0", "epsilon: float = 0.001", "relu: bool = false"},
       same_as_input0},
      {"Conv2DBatchNormInference",
       {"x: Tx", "filter: T", "scale: T", "offset: T", "mean: T", "variance: T", "bias: N * T"},
       {"y: Tout"},
       {"T: {float}", "Tx: {float, half} = DT_FLOAT", "Tout: {float, half} = DT_FLOAT",
        "N: int >= 0 = 0", "epsilon: float = 0.001", "relu: bool = false",
        "strides: list(int)", "padding: string", "explicit_paddings: list(int) = []",
        "dilations: list(int) = [1, 1, 1, 1]", "data_format: string = 'NHWC'"},
       unknown_shape},
      {"AddRelu", {"x: T", "y: T"}, {"z: T"}, {"T: {float, half, bfloat16}"}, add_relu_shape},
  };
  for (const OpDefSpec& d : defs) {
    rt::Status st = register_op_def(d);
    if (!st.ok()) return st;
  }
  // The kernels: the op table's rows (kernel class kFusedInference).
  rt::Status st = rt::ok_status();
  for (const TableKernelDef& d : compiler_ops)
    if (st.ok()) st = register_compiled_op_kernel(d);
  // The graph pass only creates these ops once both definitions and kernels exist.
  g_fused_ops_registered = st.ok();
  return st;
}

}  // namespace npusim::tf
