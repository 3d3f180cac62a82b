// Sparse resource-variable ops refused on the NPU instead of running TensorFlow's CPU code there.
//
// TensorFlow 2.21 registers ResourceGather and ResourceScatterUpdate for DEVICE_DEFAULT (for
// variant variables) with its CPU implementation, and a pluggable device inherits them: they
// would dereference NPU device addresses as host pointers. Sparse access would also put the
// variable in copy-on-read mode, in which TensorFlow's DEVICE_DEFAULT AssignVariableOp copies
// with CPU code. A kernel registered for "NPU" takes precedence over DEVICE_DEFAULT, so these NPU
// kernels (no type constraint: every dtype) replace them and fail with an explicit error. They
// would need gather/scatter kernels in the compiler and the variable lookup of
// kernels_resource_variables.cpp; a Dense model does not use them (an Embedding layer does).
// The dense updates (AssignAddVariableOp, AssignSubVariableOp) run on the chip:
// kernels_resource_variables.cpp.
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
            "' on the NPU is not implemented yet: sparse access to a resource variable has no "
            "NPU kernel (see docs/tf_plugin.md). Keep the variable on the CPU "
            "(with tf.device('/CPU:0')) meanwhile."));
  }

 private:
  std::string m_type;
};

}  // namespace

rt::Status register_variable_kernels() {
  // No type constraint: these NPU kernels cover every dtype DEVICE_DEFAULT would.
  for (auto [op, host_args] : std::vector<std::pair<const char*, std::vector<const char*>>>{
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
