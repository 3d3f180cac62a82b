// Resource-variable updates on the NPU, written with TensorFlow's C++ kernel API.
//
// Why the C++ API: updating a resource variable means finding its `Var` in the resource manager,
// locking it and swapping its buffer. The C API's helpers for that (TF_AssignUpdateVariable, ...
// in kernels_experimental.h) are declared but not exported by TensorFlow 2.20/2.21 (tensorflow
// issue #126374), while the C++ API they wrap is: libtensorflow_framework.so.2 exports
// OpKernelRegistrar::InitInternal, HandleFromInput, ResourceMgr::DoLookup,
// ResourceHandle::ValidateType, the typeinfo of OpKernel and Var, ... (docs/tf_plugin.md;
// -Wl,--no-undefined checks that all resolve there). This file is the only one of the plugin
// compiled against TensorFlow's C++ headers, with the wheel's preprocessor flags
// (tf.sysconfig.get_compile_flags(): C++11 string ABI, EIGEN_MAX_ALIGN_BYTES) and NDEBUG like
// the wheel (CMakeLists.txt); it includes no npusim
// header except the C-API-only bridge dense_update.h and kernel_families.h, so TensorFlow's Eigen
// and abseil never meet npusim's code. Everything here has hidden visibility like the rest of
// the plugin; the kernels reach TensorFlow only through the registry.
//
// Why these kernels: TensorFlow 2.21 registers AssignAddVariableOp and AssignSubVariableOp for
// DEVICE_DEFAULT with its CPU code (AssignUpdateVariableOp<CPUDevice>), which a pluggable device
// inherits and which would treat NPU addresses as host pointers. A kernel registered for "NPU"
// wins over DEVICE_DEFAULT, for every dtype (no type constraint here).
//
// What they do (TensorFlow's AssignUpdateVariableOp, resource_variable_ops.cc, with the
// arithmetic moved to the chip): look up the variable, take its lock, check dtype and shape,
// allocate a new device buffer, compute buffer = variable <op> value with the compiler's AddV2
// or Sub kernel on the op's NPU stream (dense_update.cpp), and make the new buffer the variable's
// tensor. Always writing a new buffer is TensorFlow's copy-on-write path (taken whenever the old
// buffer is shared); compiled kernels may not write over their inputs, so it is the only path
// here. Readers holding the old buffer keep the old value, as in TensorFlow. dtypes the compiler
// has no AddV2/Sub for (float64, int8, ...) fail with UnimplementedError naming the op; the
// variable is then unchanged. int64 (Keras' iteration counter) runs on the scalar unit
// (the compiler's s64 AddV2/Sub).
//
// Not replaced, because TensorFlow's DEVICE_DEFAULT kernels are correct on device memory:
// VarHandleOp, ReadVariableOp (shares the buffer, or copies it with the device's
// CopyTensorInSameDevice, i.e. memcpy_dtod), AssignVariableOp (shares the value's buffer; it
// copies with CPU code only in copy-on-read mode, which only sparse access turns on, and the
// sparse ops are refused on the NPU: kernels_variables.cpp), VarIsInitializedOp and
// DestroyResourceOp (host memory only).
#include <exception>
#include <string>
#include <vector>

#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/tf_cc_kernel_util.h"

namespace npusim::tf {
namespace {

using namespace cc;  // NOLINT: tfc, device_address, register_npu_kernel, ...

// AssignAddVariableOp (binary_op "AddV2") and AssignSubVariableOp ("Sub").
template <const char* kBinaryOp>
class AssignUpdateVariableOp : public tfc::OpKernel {
 public:
  explicit AssignUpdateVariableOp(tfc::OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(tfc::OpKernelContext* ctx) override {
    // No exception may reach TensorFlow (only std::bad_alloc could come from here).
    try {
      ctx->SetStatus(update(ctx));
    } catch (const std::exception& e) {
      ctx->SetStatus(absl::InternalError(absl::StrCat(name(), " on the NPU: ", e.what())));
    }
  }

 private:
  absl::Status update(tfc::OpKernelContext* ctx) {
    tfc::core::RefCountPtr<tfc::Var> variable;
    absl::Status st = tfc::LookupResource(ctx, tfc::HandleFromInput(ctx, 0), &variable);
    if (!st.ok()) return st;
    const tfc::Tensor& value = ctx->input(1);

    tfc::mutex_lock lock(*variable->mu());
    tfc::Tensor* var = variable->tensor();
    // TensorFlow's checks and messages (ValidateAssignUpdateVariableOpShapes, ...).
    if (!var->shape().IsSameSize(value.shape()))
      return absl::InvalidArgumentError(
          absl::StrCat("Cannot update variable with shape ", var->shape().DebugString(),
                       " using a Tensor with shape ", value.shape().DebugString(),
                       ", shapes must be equal."));
    if (var->dtype() != value.dtype())
      return absl::InvalidArgumentError("DType of variable handle and value does not match.");

    tfc::Tensor updated;
    st = allocate_like(ctx, *var, &updated);
    if (!st.ok()) return st;
    if (var->NumElements() > 0) {
      const auto dims = var->shape().dim_sizes();
      const std::vector<int64_t> shape(dims.begin(), dims.end());
      // TF_OpKernelContext is TensorFlow's OpKernelContext behind a C name: the C API casts it
      // back (tensorflow/c/kernels.cc), so the plugin's C-API layer can run on this context.
      DenseUpdateStatus u = run_dense_update(reinterpret_cast<TF_OpKernelContext*>(ctx),
                                             kBinaryOp, static_cast<TF_DataType>(var->dtype()),
                                             shape, device_address(*var), device_address(value),
                                             device_address(updated));
      if (!u.ok()) return to_absl(u);
    }
    *var = updated;
    return absl::OkStatus();
  }
};

constexpr char kAddV2[] = "AddV2";
constexpr char kSub[] = "Sub";

template <typename Kernel>
void register_update_kernel(const char* op) {
  tfc::KernelDefBuilder builder(op);
  builder.Device("NPU").HostMemory("resource");
  register_npu_kernel<Kernel>(builder, op);
}

}  // namespace

rt::Status register_resource_variable_kernels() {
  return rt::guard("registering the NPU's resource-variable kernels", [] {
    register_update_kernel<AssignUpdateVariableOp<kAddV2>>("AssignAddVariableOp");
    register_update_kernel<AssignUpdateVariableOp<kSub>>("AssignSubVariableOp");
    return rt::ok_status();
  });
}

}  // namespace npusim::tf
