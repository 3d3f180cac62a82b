// A thin layer over TensorFlow's kernel C API (tensorflow/c/kernels.h) so that the plugin's
// kernels read like TensorFlow's own: OpKernel with Compute(OpKernelContext*), attributes read in
// the constructor through OpKernelConstruction, OP_REQUIRES_OK, and a registration builder
// (KernelDefBuilder + register_kernel<K>) instead of REGISTER_KERNEL_BUILDER. Statuses are the
// runtime's (rt::Status); the context converts them to TF_Status with the mapping of
// plugin_device.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "adapter/compiler/op_desc.h"
#include "adapter/runtime/status.h"
#include "adapter/runtime/stream.h"
#include "adapter/tf/plugin/plugin_device.h"
#include "tensorflow/c/kernels.h"
#include "tensorflow/c/tf_datatype.h"
#include "tensorflow/c/tf_tensor.h"

namespace npusim::tf {

constexpr char kDeviceNpu[] = "NPU";

// TensorFlow dtype <-> the compiler's; nullopt for a TF type the chip cannot hold.
std::optional<compiler::DataType> from_tf_dtype(TF_DataType t);
TF_DataType to_tf_dtype(compiler::DataType t);
std::string tf_dtype_name(TF_DataType t);  // "float32", "half", ... ("type 23" if unknown)

// A tensor handed to or produced by a kernel. Owns its TF_Tensor handle (TensorFlow keeps the
// buffer alive as long as the op's input or output needs it).
class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(TF_Tensor* t) : m_tensor(t, &TF_DeleteTensor) {}

  bool valid() const { return m_tensor != nullptr; }
  TF_DataType dtype() const { return TF_TensorType(m_tensor.get()); }
  std::vector<int64_t> shape() const;
  int64_t NumElements() const { return TF_TensorElementCount(m_tensor.get()); }
  size_t TotalBytes() const { return TF_TensorByteSize(m_tensor.get()); }
  // Device byte address of the first element in its chip's memory (kernels on the NPU: device
  // memory; 0 for an empty tensor). TensorFlow's pointer also names the chip (plugin_device.h).
  uint64_t device_address() const {
    return local_address(reinterpret_cast<uint64_t>(TF_TensorData(m_tensor.get())));
  }
  // The buffer as a host pointer: only for an input the kernel declared HostMemory.
  const void* host_data() const { return TF_TensorData(m_tensor.get()); }
  // dtype and shape as the compiler describes them; invalid_argument for an unsupported dtype.
  rt::Status desc(compiler::TensorDesc* out) const;

 private:
  std::unique_ptr<TF_Tensor, void (*)(TF_Tensor*)> m_tensor{nullptr, &TF_DeleteTensor};
};

class OpKernelConstruction {
 public:
  explicit OpKernelConstruction(TF_OpKernelConstruction* ctx);

  // The op type ("AddV2"), from the node's NodeDef; the node name.
  const std::string& type_string() const { return m_type; }
  const std::string& name() const { return m_name; }

  bool HasAttr(const char* attr) const;
  rt::Status GetAttr(const char* attr, TF_DataType* value) const;
  rt::Status GetAttr(const char* attr, bool* value) const;
  rt::Status GetAttr(const char* attr, int64_t* value) const;
  rt::Status GetAttr(const char* attr, float* value) const;
  rt::Status GetAttr(const char* attr, std::string* value) const;
  rt::Status GetAttr(const char* attr, std::vector<int64_t>* value) const;
  rt::Status GetAttr(const char* attr, std::vector<std::string>* value) const;

  // Records a failure: TensorFlow reports it when it creates the kernel.
  void CtxFailure(const rt::Status& st);
  bool ok() const { return m_ok; }

 private:
  rt::Status attr_status(const char* attr, TF_Status* tf) const;

  TF_OpKernelConstruction* m_ctx;
  std::string m_type, m_name;
  bool m_ok = true;
};

// The values of host-memory input `index` of op `op` (int32 or int64: a shape, an algorithm id);
// invalid_argument naming the op and the input for another type.
rt::Status host_ints(const std::string& op, const Tensor& t, int index, std::vector<int64_t>* out);

class OpKernelContext {
 public:
  explicit OpKernelContext(TF_OpKernelContext* ctx) : m_ctx(ctx) {}

  int num_inputs() const { return TF_NumInputs(m_ctx); }
  int num_outputs() const { return TF_NumOutputs(m_ctx); }
  rt::Status input(int index, Tensor* out) const;
  TF_DataType expected_output_dtype(int index) const {
    return TF_ExpectedOutputDataType(m_ctx, index);
  }
  rt::Status allocate_output(int index, TF_DataType dtype, const std::vector<int64_t>& shape,
                             Tensor* out);
  rt::Status allocate_temp(TF_DataType dtype, const std::vector<int64_t>& shape, Tensor* out);
  // The runtime stream TensorFlow runs this op on, and the device (chip) it belongs to.
  rt::Status npu_stream(rt::Stream* out) const;
  rt::Status npu_device(std::shared_ptr<rt::Device>* out) const;
  std::string op_name() const;  // the node name
  // TensorFlow's context, for the bridges to its C++ API (dense_update.h).
  TF_OpKernelContext* tf_context() const { return m_ctx; }

  void CtxFailure(const rt::Status& st);

 private:
  TF_OpKernelContext* m_ctx;
};

class OpKernel {
 public:
  virtual ~OpKernel() = default;
  virtual void Compute(OpKernelContext* ctx) = 0;
};

#define NPU_OP_REQUIRES_OK(CTX, EXPR)              \
  do {                                              \
    ::npusim::rt::Status _npu_st = (EXPR);          \
    if (!_npu_st.ok()) {                            \
      (CTX)->CtxFailure(_npu_st);                   \
      return;                                       \
    }                                               \
  } while (0)

// What a kernel registration says: op name, device NPU, type constraints, host-memory args.
class KernelDefBuilder {
 public:
  explicit KernelDefBuilder(std::string op) : m_op(std::move(op)) {}
  KernelDefBuilder& TypeConstraint(std::string attr, std::vector<TF_DataType> types) {
    m_constraints.push_back({std::move(attr), std::move(types)});
    return *this;
  }
  KernelDefBuilder& HostMemory(std::string arg) {
    m_host_memory.push_back(std::move(arg));
    return *this;
  }

 private:
  template <typename K>
  friend rt::Status register_kernel(const KernelDefBuilder& def);
  rt::Status register_with(void* (*create)(TF_OpKernelConstruction*),
                           void (*compute)(void*, TF_OpKernelContext*),
                           void (*destroy)(void*)) const;

  struct Constraint {
    std::string attr;
    std::vector<TF_DataType> types;
  };
  std::string m_op;
  std::vector<Constraint> m_constraints;
  std::vector<std::string> m_host_memory;
};

// Registers kernel class K (constructor K(OpKernelConstruction*)) for the NPU. A constraint
// with several types registers one kernel per type (TensorFlow's C API takes one type per
// constraint); with several such constraints, every combination is registered.
template <typename K>
rt::Status register_kernel(const KernelDefBuilder& def) {
  // No exception may cross the C ABI into TensorFlow: one becomes the kernel's failure.
  auto create = [](TF_OpKernelConstruction* c) -> void* {
    OpKernelConstruction ctx(c);
    std::unique_ptr<K> kernel;
    rt::Status st = rt::guard("creating the NPU kernel of " + ctx.type_string() + " '" +
                                  ctx.name() + "'",
                              [&] {
                                kernel = std::make_unique<K>(&ctx);
                                return rt::ok_status();
                              });
    if (!st.ok()) ctx.CtxFailure(st);
    return ctx.ok() ? static_cast<OpKernel*>(kernel.release()) : nullptr;
  };
  auto compute = [](void* kernel, TF_OpKernelContext* c) {
    OpKernelContext ctx(c);
    rt::Status st = rt::guard(ctx.op_name() + " on the NPU", [&] {
      static_cast<OpKernel*>(kernel)->Compute(&ctx);
      return rt::ok_status();
    });
    if (!st.ok()) ctx.CtxFailure(st);
  };
  auto destroy = [](void* kernel) { delete static_cast<OpKernel*>(kernel); };
  return def.register_with(create, compute, destroy);
}

}  // namespace npusim::tf
