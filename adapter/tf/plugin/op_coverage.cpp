#include "adapter/tf/plugin/op_coverage.h"

#include "adapter/compiler/ops/registry.h"

namespace npusim::tf {

const std::vector<OpReason>& unregistered_compiler_ops() {
  static const auto* ops = [] {
    auto* v = new std::vector<OpReason>();
    for (const compiler::ops::OpEntry& e : compiler::ops::op_table())
      if (e.tf.kernel == compiler::ops::TfKernel::kNone && e.tf.unregistered)
        v->push_back({e.tf_op, e.tf.unregistered});
    return v;
  }();
  return *ops;
}

const std::vector<OpReason>& plugin_only_ops() {
  static const std::vector<OpReason> ops = {
      {"AssignAddVariableOp", "the compiler's AddV2 on a locked variable"},
      {"AssignSubVariableOp", "the compiler's Sub on a locked variable"},
      {"ResourceDynamicUpdateSlice",
       "the compiler's Pack (a copy) into a locked variable's buffer, in place"},
      {"ResourceApplyKerasMomentum", "composed of the compiler's Mul/Sub/AddV2"},
      {"RandomUniform", "the compiler's StatelessRandomUniformV2 on the kernel's own seed"},
      {"Bitcast", "the output aliases the input's buffer: no kernel runs"},
      {"OptionalGetValue", "TensorFlow's CPU kernel on host-memory arguments (tf.data)"},
      {"OptionalHasValue", "TensorFlow's CPU kernel on host-memory arguments (tf.data)"},
      {"ResourceGather", "refuses with an error instead of TF's DEVICE_DEFAULT CPU code"},
      {"ResourceScatterUpdate", "refuses with an error instead of TF's DEVICE_DEFAULT CPU code"},
      {"NpuGraph", "a set of the compiler's ops run as one task list (npu_graph.h)"},
      {"NpuCollective", "HCCL's collective between NPUs on the chips' collective engine"},
      {"TensorListFromTensor",
       "TensorFlow's list kernel, for bool elements (kernels_tensor_list.cpp)"},
      {"TensorListGetItem",
       "TensorFlow's list kernel, for bool elements (kernels_tensor_list.cpp)"},
      {"TensorListPopBack",
       "TensorFlow's list kernel, for bool elements (kernels_tensor_list.cpp)"},
      {"TensorListStack", "TensorFlow's list kernel, for bool elements (kernels_tensor_list.cpp)"},
      {"TensorListGather", "TensorFlow's list kernel, for bool elements (kernels_tensor_list.cpp)"},
      {"DropOutGenMask",
       "an AI CPU task computed on the host (kernels_gen_mask.cpp), no AI-core kernel"},
  };
  return ops;
}

}  // namespace npusim::tf
