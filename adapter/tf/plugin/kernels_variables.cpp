// Resource-variable ops whose DEVICE_DEFAULT kernels TensorFlow would otherwise run on the NPU.
//
// TensorFlow 2.21 registers AssignAddVariableOp, AssignSubVariableOp, ResourceGather and
// ResourceScatterUpdate for DEVICE_DEFAULT with its CPU implementation (Eigen on the host), and a
// pluggable device inherits them: they would dereference NPU device addresses as host pointers
// and crash the process. A kernel registered for "NPU" takes precedence over DEVICE_DEFAULT, so
// these NPU kernels replace them and fail with an explicit error instead. Real implementations
// need the variable helpers of kernels_experimental.h (TF_AssignUpdateVariable,
// TF_GetInputTensorFromVariable, ...), which TensorFlow 2.20 and 2.21 declare but do not export
// (tensorflow issue #126374; docs/tf_plugin.md), or TensorFlow's C++ kernel API.
// AssignVariableOp, ReadVariableOp and VarHandleOp keep TensorFlow's DEVICE_DEFAULT kernels:
// they only pass buffers around, which is correct for device memory.
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {
namespace {

class UnsupportedVariableOp : public OpKernel {
 public:
  explicit UnsupportedVariableOp(OpKernelConstruction* ctx) : m_type(ctx->type_string()) {}
  void Compute(OpKernelContext* ctx) override {
    ctx->CtxFailure(rt::Status(
        rt::StatusCode::unsupported,
        m_type + " '" + ctx->op_name() +
            "' on the NPU is not implemented yet: updating a resource variable in place needs "
            "TensorFlow's variable helpers (TF_AssignUpdateVariable, ...), which TensorFlow 2.21 "
            "does not export (see docs/tf_plugin.md). Keep the variable on the CPU "
            "(with tf.device('/CPU:0')) meanwhile."));
  }

 private:
  std::string m_type;
};

}  // namespace

rt::Status register_variable_kernels() {
  // No type constraint: these NPU kernels cover every dtype DEVICE_DEFAULT would.
  for (auto [op, host_args] : std::vector<std::pair<const char*, std::vector<const char*>>>{
           {"AssignAddVariableOp", {"resource"}},
           {"AssignSubVariableOp", {"resource"}},
           {"ResourceGather", {"resource", "indices"}},
           {"ResourceScatterUpdate", {"resource", "indices"}}}) {
    KernelDefBuilder def(op);
    for (const char* arg : host_args) def.HostMemory(arg);
    rt::Status st = register_kernel<UnsupportedVariableOp>(def);
    if (!st.ok()) return st;
  }
  return rt::ok_status();
}

}  // namespace npusim::tf
