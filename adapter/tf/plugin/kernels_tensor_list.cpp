// AddN and ZerosLike on `variant` TensorLists, on the NPU, written on TensorFlow's C++ kernel
// API (kernels_resource_variables.cpp says why that API; tf_cc_kernel_util.h has the shared
// parts); and TensorFlow's own list kernels for bool elements (below).
//
// Why: the gradient of a while loop that reads a TensorList (Keras' LSTM / GRU read their input
// sequence from TensorListFromTensor) sums the per-iteration gradient lists with AddN on
// variants, and starts the sum from ZerosLike of the forward loop's list. TensorFlow registers
// both for variants on the CPU and the GPU only (aggregate_ops.cc, constant_op.cc), and the C
// API's TF_AddNVariant / TF_ZerosLikeVariant are not exported by the 2.21 wheel
// (docs/tf_plugin.md, "C API exports"). So soft placement ran them on the CPU, and the executor
// copied every valid element of every input list over the HDC link to the host and every
// element of the result back (TensorList's registered device-copy functions copy element by
// element): for a 40-step LSTM at batch 2, 81 copies of 5 us per backward iteration for one
// (2, 32) addition. A graph engine keeps these lists on the device.
//
// What they do: TensorFlow's own list arithmetic (tensorflow::TensorListBinaryAdd and
// TensorListZerosLike, exported by libtensorflow_framework: the same checks and messages, the
// same output list), with the element operation on the chip:
//   AddN      the lists summed left to right; per element, an uninitialised (DT_INVALID) side
//             passes the other's tensor on (shared, no copy: TensorFlow's BinaryAddTensors), two
//             tensors are added by one launch of the compiler's AddV2 into a new device buffer;
//   ZerosLike per element, uninitialised stays uninitialised, a tensor gets a new device buffer
//             filled by one launch of the compiler's ZerosLike.
// The list itself is a host object, as TensorFlow's list kernels allocate it (`on_host`); its
// elements are device tensors, as TensorFlow's list device-copy functions take them, int32 ones
// too (TensorFlow keeps int32 kernel arguments in host memory, but a list's elements are copied
// between devices as device tensors): the compiler's AddV2 adds them on the chip, its ZerosLike
// (which has no int32) zeroes them as float32, the same bytes, all zero. A variant holding
// something other than a TensorList, nested lists, and element dtypes the compiler has no
// AddV2 / ZerosLike for are UnimplementedError naming the node and what it holds.
// Bool elements: TensorFlow registers its list kernels (TensorListFromTensor, TensorListGetItem,
// TensorListPopBack, TensorListStack, ...) for DEVICE_DEFAULT, so for the NPU, with float, half,
// bfloat16, double, int32 and int64 elements only. Keras splits a recurrent layer's mask (bool)
// into a TensorList, so a masked LSTM / GRU (Embedding(mask_zero=True)) ran those nodes on the
// CPU, one TensorListGetItem per loop iteration. They are registered here for bool with
// TensorFlow's own kernel classes (list_kernels.h) and the HostMemory arguments of its
// DEVICE_DEFAULT registrations; on a PluggableDevice those classes move elements with the
// stream's copies and memsets (ConcatPluggableDevice, CopyTensorPluggableDevice, SetZero), never
// through host pointers. Their out-of-line helpers (GetInputList, ...) are libtensorflow_cc's.
// Before any Eigen header: list_kernels.h instantiates Eigen expressions on the CPU device.
#define EIGEN_USE_THREADS

#include <string>

#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/tf_cc_kernel_util.h"

#include "tensorflow/core/framework/variant.h"
#include "tensorflow/core/kernels/list_kernels.h"
#include "tensorflow/core/kernels/tensor_list.h"
#include "tensorflow/core/kernels/tensor_list_util.h"

namespace npusim::tf {
namespace {

using namespace cc;  // NOLINT: tfc, device_address, register_npu_kernel, ...

// The TensorList a scalar variant input holds.
absl::Status input_list(const tfc::OpKernel& kernel, tfc::OpKernelContext* ctx, int i,
                        const tfc::TensorList** list) {
  const tfc::Tensor& t = ctx->input(i);
  if (t.dims() != 0)
    return absl::InvalidArgumentError(absl::StrCat(
        kernel.name(), ": ", kernel.type_string(), " of non-scalar Tensor with dtype=DT_VARIANT",
        " is not supported; inputs[", i, "] has shape: ", t.shape().DebugString()));
  *list = t.scalar<tfc::Variant>()().get<tfc::TensorList>();
  if (!*list)
    return absl::UnimplementedError(absl::StrCat(kernel.name(), ": ", kernel.type_string(),
                                                 " of a variant on the NPU takes TensorLists"
                                                 " only; inputs[",
                                                 i, "] holds ",
                                                 t.scalar<tfc::Variant>()().TypeName()));
  return absl::OkStatus();
}

absl::Status nested(const tfc::OpKernel& kernel) {
  return absl::UnimplementedError(
      absl::StrCat(kernel.name(), ": ", kernel.type_string(),
                   " on the NPU: a TensorList whose elements are variants (nested lists)"));
}

// The output: a host-memory scalar variant holding `list`.
absl::Status set_list_output(tfc::OpKernelContext* ctx, tfc::TensorList&& list) {
  tfc::Tensor* out = nullptr;
  tfc::AllocatorAttributes attr;
  attr.set_on_host(true);
  absl::Status st = ctx->allocate_output(0, tfc::TensorShape({}), &out, attr);
  if (st.ok()) out->scalar<tfc::Variant>()() = std::move(list);
  return st;
}

// AddN(inputs: N x variant) -> sum: the lists' element-wise sum.
class AddNTensorListsOp : public GuardedOpKernel {
 public:
  using GuardedOpKernel::GuardedOpKernel;

 private:
  // `dispatch`: the Compute's host dispatch, which its launches share (new_dispatch_id).
  absl::Status add(tfc::OpKernelContext* ctx, const tfc::Tensor& a, const tfc::Tensor& b,
                   tfc::Tensor* out, uint64_t dispatch) const {
    if (a.dtype() == tfc::DT_INVALID) {
      *out = b;
      return absl::OkStatus();
    }
    if (b.dtype() == tfc::DT_INVALID) {
      *out = a;
      return absl::OkStatus();
    }
    if (a.dtype() != b.dtype())
      return absl::InvalidArgumentError(absl::StrCat(
          name(), ": Trying to add two tensors with incompatible element types. One is ",
          tfc::DataTypeString(a.dtype()), " and the other is ", tfc::DataTypeString(b.dtype())));
    if (a.shape() != b.shape())
      return absl::InvalidArgumentError(absl::StrCat(
          name(), ": Trying to add two tensors with incompatible element shapes. One is ",
          a.shape().DebugString(), " and the other is ", b.shape().DebugString()));
    if (a.dtype() == tfc::DT_VARIANT) return nested(*this);
    absl::Status st = ctx->allocate_temp(a.dtype(), a.shape(), out);
    if (!st.ok() || a.NumElements() == 0) return st;
    UpdateAttrs one_dispatch;
    one_dispatch.dispatch = dispatch;
    return to_absl(run_compiled_update(reinterpret_cast<TF_OpKernelContext*>(ctx), "AddV2", {},
                                       {update_tensor(a), update_tensor(b)}, {update_tensor(*out)},
                                       one_dispatch));
  }

  absl::Status compute(tfc::OpKernelContext* ctx) override {
    const uint64_t dispatch = new_dispatch_id();
    const int n = ctx->num_inputs();
    if (n == 1) {
      ctx->set_output(0, ctx->input(0));
      return absl::OkStatus();
    }
    const tfc::TensorList* first = nullptr;
    absl::Status st = input_list(*this, ctx, 0, &first);
    if (!st.ok()) return st;
    tfc::TensorList sum = *first;
    auto element_add = [this, dispatch](tfc::OpKernelContext* c, const tfc::Tensor& a,
                                        const tfc::Tensor& b,
                                        tfc::Tensor* out) { return add(c, a, b, out, dispatch); };
    for (int i = 1; i < n; ++i) {
      const tfc::TensorList* next = nullptr;
      st = input_list(*this, ctx, i, &next);
      if (!st.ok()) return st;
      tfc::TensorList out;
      st = tfc::TensorListBinaryAdd(ctx, sum, *next, &out, element_add);
      if (!st.ok()) return absl::Status(st.code(), absl::StrCat(name(), ": ", st.message()));
      sum = std::move(out);
    }
    return set_list_output(ctx, std::move(sum));
  }
};

// ZerosLike(x: variant) -> y: a list of x's length and element shape, zeros where x has tensors.
class ZerosLikeTensorListOp : public GuardedOpKernel {
 public:
  using GuardedOpKernel::GuardedOpKernel;

 private:
  // `dispatch`: as AddNTensorListsOp::add's.
  absl::Status zeros(tfc::OpKernelContext* ctx, const tfc::Tensor& x, tfc::Tensor* out,
                     uint64_t dispatch) const {
    if (x.dtype() == tfc::DT_INVALID) {
      *out = tfc::Tensor(tfc::DT_INVALID);
      return absl::OkStatus();
    }
    if (x.dtype() == tfc::DT_VARIANT) return nested(*this);
    absl::Status st = ctx->allocate_temp(x.dtype(), x.shape(), out);
    if (!st.ok() || x.NumElements() == 0) return st;
    UpdateAttrs one_dispatch;
    one_dispatch.dispatch = dispatch;
    UpdateTensor in = update_tensor(x), zeros = update_tensor(*out);
    if (in.dtype == TF_INT32) in.dtype = zeros.dtype = TF_FLOAT;  // zero bytes either way
    return to_absl(run_compiled_update(reinterpret_cast<TF_OpKernelContext*>(ctx), "ZerosLike", {},
                                       {in}, {zeros}, one_dispatch));
  }

  absl::Status compute(tfc::OpKernelContext* ctx) override {
    const uint64_t dispatch = new_dispatch_id();
    const tfc::TensorList* x = nullptr;
    absl::Status st = input_list(*this, ctx, 0, &x);
    if (!st.ok()) return st;
    tfc::TensorList y;
    st = tfc::TensorListZerosLike(
        ctx, *x, &y,
        [this, dispatch](tfc::OpKernelContext* c, const tfc::Tensor& t, tfc::Tensor* out) {
          return zeros(c, t, out, dispatch);
        });
    if (!st.ok()) return absl::Status(st.code(), absl::StrCat(name(), ": ", st.message()));
    return set_list_output(ctx, std::move(y));
  }
};

template <typename Kernel>
tfc::OpKernel* create(tfc::OpKernelConstruction* c) {
  return new Kernel(c);
}

}  // namespace

rt::Status register_tensor_list_kernels() {
  return rt::guard("registering the NPU's TensorList kernels", [] {
    {
      tfc::KernelDefBuilder builder("AddN");
      builder.Device("NPU").TypeConstraint("T", tfc::DT_VARIANT);
      register_npu_kernel<AddNTensorListsOp>(builder, "AddN");
    }
    {
      tfc::KernelDefBuilder builder("ZerosLike");
      builder.Device("NPU").TypeConstraint("T", tfc::DT_VARIANT);
      register_npu_kernel<ZerosLikeTensorListOp>(builder, "ZerosLike");
    }
    // TensorFlow's list kernels for bool elements (see the file's head), with the HostMemory
    // arguments of TensorFlow's own DEVICE_DEFAULT registrations (list_kernels.cc).
    struct BoolListKernel {
      const char* op;
      std::vector<const char*> host_memory;
      tfc::OpKernel* (*create)(tfc::OpKernelConstruction*);
    };
    using tfc::CPUDevice;
    const BoolListKernel kBoolKernels[] = {
        {"TensorListFromTensor",
         {"element_shape"},
         create<tfc::TensorListFromTensor<CPUDevice, bool>>},
        {"TensorListGetItem",
         {"index", "element_shape"},
         create<tfc::TensorListGetItem<CPUDevice, bool>>},
        {"TensorListPopBack", {"element_shape"}, create<tfc::TensorListPopBack<CPUDevice, bool>>},
        {"TensorListStack", {"element_shape"}, create<tfc::TensorListStack<CPUDevice, bool>>},
        {"TensorListGather",
         {"indices", "element_shape"},
         create<tfc::TensorListGather<CPUDevice, bool>>},
    };
    for (const BoolListKernel& k : kBoolKernels) {
      tfc::KernelDefBuilder builder(k.op);
      builder.Device("NPU").TypeConstraint("element_dtype", tfc::DT_BOOL);
      for (const char* arg : k.host_memory) builder.HostMemory(arg);
      tfc::kernel_factory::OpKernelRegistrar registrar(
          builder.Build(), absl::StrCat("npusim::", k.op, "Bool"), k.create);
    }
    return rt::ok_status();
  });
}

}  // namespace npusim::tf
