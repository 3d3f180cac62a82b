// Ops that only route host tensors, registered for the NPU by reusing TensorFlow's own CPU
// kernels: the data iterator's OptionalHasValue and OptionalGetValue. Written on TensorFlow's C++
// kernel API (kernels_resource_variables.cpp says why that API; tf_cc_kernel_util.h has the shared
// parts).
//
// Why: Keras 3's model.fit runs its steps in a tf.function that returns a tf.data Optional (a
// variant tensor); TensorFlow places that function's outputs on the NPU, so the eager
// `optional.has_value()` / `get_value()` that follow run colocated with it, on the NPU. TensorFlow
// registers the Optional ops for the CPU and GPU only (the GPU ones with the variant in host
// memory), so with soft placement off model.fit stopped at OptionalHasValue.
//
// How: an NPU kernel with every argument in host memory, which creates TensorFlow's CPU kernel
// for the same node (tensorflow::CreateOpKernel, exported by libtensorflow_framework.so.2) and
// runs its Compute on the NPU's context. The Optionals themselves are only ever built on the CPU
// (OptionalFromValue, OptionalNone and IteratorGetNextAsOptional keep their CPU-only kernels, so
// TensorFlow copies NPU components to the host before wrapping them), so the tensors an Optional
// holds are host tensors, and host memory is where the NPU kernels hand them on:
//   OptionalHasValue   `optional`, `has_value` in host memory: reads the variant, writes a bool;
//   OptionalGetValue   `optional`, `components` in host memory: passes the held (host) tensors
//                      on by reference; a consumer on the chip gets them copied in by TensorFlow,
//                      as for any host-memory output.
// The CPU kernels dereference nothing but host memory. Registering OptionalFromValue for the NPU
// would break that invariant (an Optional holding device tensors read back as host memory).
//
// The same kernel, under the label kHostKernelLabel, runs the logical ops of a while loop's
// condition on their host-memory operands (host_loop_condition.h: only nodes the graph pass
// labels, whose inputs are host values and whose readers take host memory): LogicalAnd,
// LogicalOr (x, y, z in host memory), LogicalNot (x, y).
#include <memory>
#include <string>
#include <vector>

#include "adapter/tf/plugin/host_loop_condition.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/tf_cc_kernel_util.h"

namespace npusim::tf {
namespace {

using namespace cc;  // NOLINT: tfc, register_npu_kernel

class HostRoutedOp : public GuardedOpKernel {
 public:
  explicit HostRoutedOp(tfc::OpKernelConstruction* c) : GuardedOpKernel(c) {
    absl::Status st;
    tfc::NodeDef cpu_def = def();
    cpu_def.mutable_attr()->erase("_kernel");  // the NPU kernel's label: the CPU's has none
    m_cpu = tfc::CreateOpKernel(tfc::DeviceType(tfc::DEVICE_CPU), c->device(),
                                c->device()->GetAllocator(tfc::AllocatorAttributes()), cpu_def,
                                c->graph_def_version(), &st);
    if (st.ok() && !m_cpu)
      st = absl::InternalError(absl::StrCat(type_string(), ": no CPU kernel to reuse"));
    OP_REQUIRES_OK(c, st);
  }

 private:
  // The CPU kernel sets the context's status itself.
  absl::Status compute(tfc::OpKernelContext* ctx) override {
    m_cpu->Compute(ctx);
    return ctx->status();
  }

  std::unique_ptr<tfc::OpKernel> m_cpu;
};

struct HostRoutedDef {
  const char* op;
  std::vector<const char*> host_args;
  const char* label = nullptr;  // the `_kernel` label that selects the kernel, if any
};

}  // namespace

rt::Status register_host_routed_kernels() {
  return rt::guard("registering the NPU's host-routed kernels", [] {
    // Every argument in host memory (see the top of this file).
    for (const HostRoutedDef& d :
         std::vector<HostRoutedDef>{{"OptionalHasValue", {"optional", "has_value"}},
                                    {"OptionalGetValue", {"optional", "components"}},
                                    {"LogicalAnd", {"x", "y", "z"}, kHostKernelLabel},
                                    {"LogicalOr", {"x", "y", "z"}, kHostKernelLabel},
                                    {"LogicalNot", {"x", "y"}, kHostKernelLabel}}) {
      tfc::KernelDefBuilder builder(d.op);
      builder.Device("NPU");
      if (d.label) builder.Label(d.label);
      for (const char* arg : d.host_args) builder.HostMemory(arg);
      register_npu_kernel<HostRoutedOp>(builder, d.op);
    }
    return rt::ok_status();
  });
}

}  // namespace npusim::tf
