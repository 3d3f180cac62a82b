#include "adapter/tf/plugin/op_coverage.h"

namespace npusim::tf {

const std::vector<OpReason>& unregistered_compiler_ops() {
  static const std::vector<OpReason> ops = {
      {"ApplyGradientDescent",
       "TF1 ref-variable op; the row names the kernel ResourceApplyGradientDescent launches"},
      {"ApplyMomentum",
       "TF1 ref-variable op; the row names the kernel ResourceApplyMomentum launches"},
      {"ApplyAdam", "TF1 ref-variable op; the row names the kernel ResourceApplyAdam launches"},
      {"BiasAddV1", "legacy graph op that TF 2 never emits (tf.nn.bias_add makes BiasAdd)"},
      {"Gelu", "TF has no Gelu op (tf.nn.gelu is a composition); reached through `npusim op`"},
      {"GeluGrad", "TF has no GeluGrad op (Gelu's gradient is autodiff of the composition)"},
  };
  return ops;
}

const std::vector<OpReason>& plugin_only_ops() {
  static const std::vector<OpReason> ops = {
      {"AddN", "composed of the compiler's AddV2 (kernels_composed.cpp)"},
      {"RsqrtGrad", "composed of the compiler's Mul (kernels_composed.cpp)"},
      {"AssignAddVariableOp", "the compiler's AddV2 on a locked variable"},
      {"AssignSubVariableOp", "the compiler's Sub on a locked variable"},
      {"ResourceApplyKerasMomentum", "composed of the compiler's Mul/Sub/AddV2"},
      {"RandomUniform", "the compiler's StatelessRandomUniformV2 on the kernel's own seed"},
      {"Bitcast", "the output aliases the input's buffer: no kernel runs"},
      {"OptionalGetValue", "TensorFlow's CPU kernel on host-memory arguments (tf.data)"},
      {"OptionalHasValue", "TensorFlow's CPU kernel on host-memory arguments (tf.data)"},
      {"ResourceGather", "refuses with an error instead of TF's DEVICE_DEFAULT CPU code"},
      {"ResourceScatterUpdate", "refuses with an error instead of TF's DEVICE_DEFAULT CPU code"},
  };
  return ops;
}

}  // namespace npusim::tf
