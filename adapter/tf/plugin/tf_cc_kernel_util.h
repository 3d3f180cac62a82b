// Helpers shared by the plugin's kernels written on TensorFlow's C++ kernel API
// (kernels_resource_variables.cpp, kernels_optimizer.cpp, kernels_collective.cpp,
// kernels_host_ops.cpp; kernels_resource_variables.cpp says why they use it). Only those files
// include this header: it pulls in TensorFlow's C++ headers, compiled with the wheel's flags
// (CMakeLists.txt), and must never meet npusim's own headers.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

// TensorFlow's headers are not warning-clean under -Wall -Wextra: abseil's CHECK_LT instantiated
// by shape_inference.h compares int with size_t, Eigen's RunQueue.h aligns to
// std::hardware_destructive_interference_size. (Their deprecated tsl::mutex is what Var::mu()
// returns: CMakeLists.txt adds -Wno-deprecated-declarations for these files.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Winterference-size"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tensorflow/core/framework/kernel_def_builder.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#pragma GCC diagnostic pop

#include "adapter/tf/plugin/dense_update.h"
#include "adapter/tf/plugin/tf_pointer.h"

namespace npusim::tf::cc {

namespace tfc = ::tensorflow;

// A tensor's buffer on the NPU: TensorFlow's data pointer is the device byte address, tagged
// with its chip (tf_pointer.h).
inline uint64_t device_address(const tfc::Tensor& t) {
  return local_address(reinterpret_cast<uint64_t>(t.data()));
}

inline UpdateTensor update_tensor(const tfc::Tensor& t) {
  const auto dims = t.shape().dim_sizes();
  return {static_cast<TF_DataType>(t.dtype()), std::vector<int64_t>(dims.begin(), dims.end()),
          device_address(t)};
}

// A new NPU buffer for a variable's next value (TensorFlow's allocator attributes for variable
// buffers).
inline absl::Status allocate_like(tfc::OpKernelContext* ctx, const tfc::Tensor& like,
                                  tfc::Tensor* out) {
  tfc::AllocatorAttributes attr;
  attr.set_gpu_compatible(true);
  attr.set_nic_compatible(true);
  return ctx->allocate_temp(like.dtype(), like.shape(), out, attr);
}

inline absl::Status to_absl(const DenseUpdateStatus& u) {
  return u.ok() ? absl::OkStatus() : absl::Status(static_cast<absl::StatusCode>(u.code), u.message);
}

// The status `body()` returns (an absl::Status), run as `kernel`'s work: no exception may reach
// TensorFlow, so one escaping `body` (of the standard ones only std::bad_alloc can come from the
// plugin's code) becomes an InternalError "<node name> on the NPU: <what()>".
template <typename Body>
absl::Status guarded_compute(const tfc::OpKernel& kernel, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(kernel.name(), " on the NPU: ", e.what()));
  }
}

// A synchronous NPU kernel whose work is compute(ctx): Compute makes its status, or an
// exception's message (guarded_compute), the op's status.
class GuardedOpKernel : public tfc::OpKernel {
 public:
  using OpKernel::OpKernel;
  void Compute(tfc::OpKernelContext* ctx) final {
    ctx->SetStatus(guarded_compute(*this, [&] { return compute(ctx); }));
  }

 protected:
  virtual absl::Status compute(tfc::OpKernelContext* ctx) = 0;
};

// Registers `Kernel` for the NPU: what REGISTER_KERNEL_BUILDER expands to, done when
// TF_InitKernel runs rather than at load time (init_kernels.cpp keeps the list of families
// explicit). The registrar takes ownership of the KernelDef.
template <typename Kernel>
void register_npu_kernel(tfc::KernelDefBuilder& builder, const std::string& op) {
  tfc::kernel_factory::OpKernelRegistrar registrar(
      builder.Build(), absl::StrCat("npusim::", op),
      [](tfc::OpKernelConstruction* c) -> tfc::OpKernel* { return new Kernel(c); });
}

// The variables of a kernel's first `n` (resource) inputs, looked up and locked in address
// order (TensorFlow's MaybeLockVariableInputMutexesInOrder: one order for every kernel, so two
// kernels sharing variables cannot deadlock; a variable given twice is locked once).
class LockedVariables {
 public:
  absl::Status lock(tfc::OpKernelContext* ctx, int n) { return lock(ctx, 0, n); }
  // The variables of inputs [first, first + n).
  absl::Status lock(tfc::OpKernelContext* ctx, int first, int n) {
    for (int i = first; i < first + n; ++i) {
      tfc::core::RefCountPtr<tfc::Var> v;
      absl::Status st = tfc::LookupResource(ctx, tfc::HandleFromInput(ctx, i), &v);
      if (!st.ok()) return st;
      m_vars.push_back(std::move(v));
    }
    std::vector<tfc::Var*> order;
    for (const auto& v : m_vars) order.push_back(v.get());
    std::sort(order.begin(), order.end());
    order.erase(std::unique(order.begin(), order.end()), order.end());
    for (tfc::Var* v : order) m_locks.push_back(std::make_unique<tfc::mutex_lock>(*v->mu()));
    return absl::OkStatus();
  }
  tfc::Var* operator[](size_t i) const { return m_vars[i].get(); }
  size_t size() const { return m_vars.size(); }

 private:
  std::vector<tfc::core::RefCountPtr<tfc::Var>> m_vars;
  std::vector<std::unique_ptr<tfc::mutex_lock>> m_locks;  // released before m_vars
};

}  // namespace npusim::tf::cc
