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
#include <algorithm>
#include <string>
#include <vector>

#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/tf_cc_kernel_util.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_def_builder.h"
#include "tensorflow/core/framework/shape_inference.h"
#pragma GCC diagnostic pop

namespace npusim::tf {
namespace {

using namespace cc;  // NOLINT: tfc, device_address, register_npu_kernel, ...

// AssignAddVariableOp (binary_op "AddV2") and AssignSubVariableOp ("Sub").
template <const char* kBinaryOp>
class AssignUpdateVariableOp : public GuardedOpKernel {
 public:
  using GuardedOpKernel::GuardedOpKernel;

 private:
  absl::Status compute(tfc::OpKernelContext* ctx) override {
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

// ResourceDynamicUpdateSlice(resource, update: T, indices: Tindices): the variable's value with
// `update` written at the start indices, XlaDynamicUpdateSlice's semantics (each start clamped
// to [0, variable dim - update dim]) but written into the variable's own buffer: only the
// update's bytes move (a KV cache's new row; CANN's in-place ScatterUpdate / KV-cache update),
// not the whole variable. `indices` [rank] int32 or int64 is in host memory (the byte offsets
// are computed here). The update's box in the variable is a set of contiguous runs: the trailing
// dims the update covers fully merged with the last dim it does not (as the compiler's
// XlaDynamicUpdateSlice merges its columns); each run is copied by one launch of the compiler's
// Pack (one input: a plain copy) whose output is the run's place in the variable's buffer, so
// a [1, L, N, D] cache takes one launch per update and a [B, L, N, D] one B launches. A compiled
// kernel writes whole 32-byte blocks, so a run must be whole blocks at a 32-byte offset
// (UnimplementedError otherwise). Copy on write, as TensorFlow's in-place updates: when the
// buffer is shared (a tensor read from the variable is still alive) it is first copied to a
// new buffer, so that reader keeps the old value.
class DynamicUpdateSliceVariableOp : public GuardedOpKernel {
 public:
  using GuardedOpKernel::GuardedOpKernel;

 private:
  absl::Status invalid(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat(name(), " (ResourceDynamicUpdateSlice): ", what));
  }

  // The start indices from the host tensor `indices`.
  static std::vector<int64_t> starts_of(const tfc::Tensor& indices) {
    std::vector<int64_t> v(static_cast<size_t>(indices.NumElements()));
    for (size_t d = 0; d < v.size(); ++d)
      v[d] = indices.dtype() == tfc::DT_INT32 ? indices.flat<int32_t>()(d)
                                              : indices.flat<int64_t>()(d);
    return v;
  }

  // One launch: `elements` elements from device address `from` to `to` (copy_on_device).
  static absl::Status copy(tfc::OpKernelContext* ctx, TF_DataType dtype, int64_t elements,
                           uint64_t from, uint64_t to) {
    return to_absl(
        copy_on_device(reinterpret_cast<TF_OpKernelContext*>(ctx), dtype, elements, from, to));
  }

  absl::Status compute(tfc::OpKernelContext* ctx) override {
    tfc::core::RefCountPtr<tfc::Var> variable;
    absl::Status st = tfc::LookupResource(ctx, tfc::HandleFromInput(ctx, 0), &variable);
    if (!st.ok()) return st;
    const tfc::Tensor& value = ctx->input(1);
    const tfc::Tensor& indices = ctx->input(2);

    tfc::mutex_lock lock(*variable->mu());
    tfc::Tensor* var = variable->tensor();
    if (var->dtype() != value.dtype())
      return invalid("the update's dtype is not the variable's");
    const int rank = var->dims();
    if (value.dims() != rank)
      return invalid(absl::StrCat("update ", value.shape().DebugString(),
                                  " must have the rank of the variable ",
                                  var->shape().DebugString()));
    if (indices.dims() != 1 || indices.NumElements() != rank)
      return invalid(absl::StrCat("indices ", indices.shape().DebugString(), " must be [", rank,
                                  "] (the variable's rank)"));
    std::vector<int64_t> start = starts_of(indices);
    for (int d = 0; d < rank; ++d) {
      if (value.dim_size(d) > var->dim_size(d))
        return invalid(absl::StrCat("update ", value.shape().DebugString(),
                                    " is larger than the variable ", var->shape().DebugString(),
                                    " in dim ", d));
      start[d] = std::clamp<int64_t>(start[d], 0, var->dim_size(d) - value.dim_size(d));
    }
    if (value.NumElements() == 0) return absl::OkStatus();

    // Runs: dims [0, c) of the update index them; each is upd[c] x (dims after c) elements.
    int c = rank == 0 ? 0 : rank - 1;
    while (c > 0 && value.dim_size(c) == var->dim_size(c)) --c;
    std::vector<int64_t> stride(static_cast<size_t>(rank), 1);  // the variable's, in elements
    for (int d = rank - 2; d >= 0; --d) stride[d] = stride[d + 1] * var->dim_size(d + 1);
    const int64_t run = rank == 0 ? 1 : value.dim_size(c) * stride[c];
    const int64_t esize = static_cast<int64_t>(tfc::DataTypeSize(var->dtype()));
    auto whole_blocks = [](int64_t bytes) { return bytes % 32 == 0; };
    if (!whole_blocks(run * esize))
      return absl::UnimplementedError(absl::StrCat(
          name(), " (ResourceDynamicUpdateSlice): a contiguous run of the update is ",
          run * esize, " bytes, not whole 32-byte blocks (update ", value.shape().DebugString(),
          " into ", var->shape().DebugString(), ")"));

    const auto dtype = static_cast<TF_DataType>(var->dtype());
    if (!var->RefCountIsOne()) {  // copy on write
      tfc::Tensor fresh;
      st = allocate_like(ctx, *var, &fresh);
      if (st.ok())
        st = copy(ctx, dtype, var->NumElements(), device_address(*var), device_address(fresh));
      if (!st.ok()) return st;
      *var = fresh;
    }
    const int64_t runs = value.NumElements() / run;
    std::vector<int64_t> at(static_cast<size_t>(c), 0);  // run j's index over dims [0, c)
    for (int64_t j = 0; j < runs; ++j) {
      int64_t offset = rank == 0 ? 0 : start[c] * stride[c];
      for (int d = 0; d < c; ++d) offset += (start[d] + at[d]) * stride[d];
      if (!whole_blocks(offset * esize))
        return absl::UnimplementedError(absl::StrCat(
            name(), " (ResourceDynamicUpdateSlice): the update's run ", j, " lands at byte ",
            offset * esize, " of the variable, not on a 32-byte block"));
      st = copy(ctx, dtype, run, device_address(value) + static_cast<uint64_t>(j * run * esize),
                device_address(*var) + static_cast<uint64_t>(offset * esize));
      if (!st.ok()) return st;
      for (int d = c - 1; d >= 0 && ++at[d] == value.dim_size(d); --d) at[d] = 0;
    }
    return absl::OkStatus();
  }
};

absl::Status register_dynamic_update_slice_op_def() {
  tfc::OpRegistry::Global()->Register([](tfc::OpRegistrationData* data) -> absl::Status {
    return tfc::OpDefBuilder("ResourceDynamicUpdateSlice")
        .Input("resource: resource")
        .Input("update: T")
        .Input("indices: Tindices")
        .Attr("T: type")
        .Attr("Tindices: {int32, int64}")
        .SetIsStateful()
        .SetShapeFn([](tfc::shape_inference::InferenceContext*) { return absl::OkStatus(); })
        .Finalize(data);
  });
  return absl::OkStatus();
}

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
    absl::Status st = register_dynamic_update_slice_op_def();
    if (!st.ok()) return rt::Status(rt::StatusCode::internal, std::string(st.message()));
    tfc::KernelDefBuilder builder("ResourceDynamicUpdateSlice");
    builder.Device("NPU").HostMemory("resource").HostMemory("indices");
    register_npu_kernel<DynamicUpdateSliceVariableOp>(builder, "ResourceDynamicUpdateSlice");
    return rt::ok_status();
  });
}

}  // namespace npusim::tf
