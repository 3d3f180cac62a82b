// Bitcast on the NPU: the output aliases the input's device buffer with the new dtype and shape
// (TF_TensorBitcastFrom, TensorFlow's own Bitcast kernel does the same with BitcastFrom), so no
// kernel runs and nothing is copied. Shape rule as TF's: equal element sizes keep the shape; a
// wider input gains a last dim of in_size / out_size; a narrower input must end in a dim of
// out_size / in_size, which is dropped.
//
// Written on the kernel C API directly (not kernel.h's wrappers): setting an output to a tensor
// that shares an input's buffer needs the raw TF_OpKernelContext (TF_GetInput, TF_SetOutput).
#include <memory>
#include <string>
#include <vector>

#include "adapter/tf/plugin/kernel.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "tensorflow/c/kernels.h"
#include "tensorflow/c/tf_status.h"
#include "tensorflow/c/tf_tensor.h"

namespace npusim::tf {
namespace {

// The numeric types TF's Bitcast takes that a device buffer can hold (no complex, no quantized).
const std::vector<TF_DataType> kBitcastTypes = {
    TF_FLOAT, TF_HALF,  TF_BFLOAT16, TF_DOUBLE, TF_INT8,   TF_INT16,
    TF_INT32, TF_INT64, TF_UINT8,    TF_UINT16, TF_UINT32, TF_UINT64};

using StatusHandle = std::unique_ptr<TF_Status, void (*)(TF_Status*)>;
using TensorHandle = std::unique_ptr<TF_Tensor, void (*)(TF_Tensor*)>;

void fail(TF_OpKernelContext* ctx, TF_Code code, const std::string& what) {
  StatusHandle st(TF_NewStatus(), TF_DeleteStatus);
  TF_SetStatus(st.get(), code, ("Bitcast on the NPU: " + what).c_str());
  TF_OpKernelContext_Failure(ctx, st.get());
}

void* bitcast_create(TF_OpKernelConstruction*) { return nullptr; }  // stateless
void bitcast_delete(void*) {}

void bitcast_compute(void*, TF_OpKernelContext* ctx) {
  StatusHandle st(TF_NewStatus(), TF_DeleteStatus);
  TF_Tensor* raw = nullptr;
  TF_GetInput(ctx, 0, &raw, st.get());
  if (TF_GetCode(st.get()) != TF_OK) {
    TF_OpKernelContext_Failure(ctx, st.get());
    return;
  }
  TensorHandle in(raw, TF_DeleteTensor);
  const TF_DataType out_type = TF_ExpectedOutputDataType(ctx, 0);
  const size_t in_size = TF_DataTypeSize(TF_TensorType(in.get()));
  const size_t out_size = TF_DataTypeSize(out_type);
  std::vector<int64_t> dims(static_cast<size_t>(TF_NumDims(in.get())));
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = TF_Dim(in.get(), static_cast<int>(i));
  if (in_size > out_size) {
    dims.push_back(static_cast<int64_t>(in_size / out_size));
  } else if (in_size < out_size) {
    const int64_t ratio = static_cast<int64_t>(out_size / in_size);
    if (dims.empty() || dims.back() != ratio) {
      fail(ctx, TF_INVALID_ARGUMENT,
           "cannot bitcast from " + tf_dtype_name(TF_TensorType(in.get())) + " to " +
               tf_dtype_name(out_type) + ": the input's last dimension must be " +
               std::to_string(ratio));
      return;
    }
    dims.pop_back();
  }
  // A zero-element tensor of the output type (TF_AllocateTensor refuses a shape its 0 bytes
  // cannot hold), then given the input's buffer and the new shape.
  const int64_t no_elements = 0;
  TensorHandle out(TF_AllocateTensor(out_type, &no_elements, 1, 0), TF_DeleteTensor);
  if (!out) {
    fail(ctx, TF_INTERNAL, "TF_AllocateTensor failed");
    return;
  }
  TF_TensorBitcastFrom(in.get(), out_type, out.get(), dims.data(), static_cast<int>(dims.size()),
                       st.get());
  if (TF_GetCode(st.get()) == TF_OK) TF_SetOutput(ctx, 0, out.get(), st.get());
  if (TF_GetCode(st.get()) != TF_OK) TF_OpKernelContext_Failure(ctx, st.get());
}

}  // namespace

rt::Status register_bitcast_kernels() {
  for (TF_DataType t : kBitcastTypes) {
    for (TF_DataType type : kBitcastTypes) {
      TF_KernelBuilder* b = TF_NewKernelBuilder("Bitcast", kDeviceNpu, bitcast_create,
                                                bitcast_compute, bitcast_delete);
      StatusHandle st(TF_NewStatus(), TF_DeleteStatus);
      TF_KernelBuilder_TypeConstraint(b, "T", t, st.get());
      if (TF_GetCode(st.get()) == TF_OK) TF_KernelBuilder_TypeConstraint(b, "type", type, st.get());
      const std::string name = "Bitcast_" + tf_dtype_name(t) + "_" + tf_dtype_name(type);
      if (TF_GetCode(st.get()) != TF_OK) {
        TF_DeleteKernelBuilder(b);
        return rt::Status(rt::StatusCode::internal,
                          "registering " + name + ": " + TF_Message(st.get()));
      }
      TF_RegisterKernelBuilder(name.c_str(), b, st.get());  // takes the builder
      if (TF_GetCode(st.get()) != TF_OK)
        return rt::Status(rt::StatusCode::internal,
                          "registering " + name + ": " + TF_Message(st.get()));
    }
  }
  return rt::ok_status();
}

}  // namespace npusim::tf
