#include "adapter/tf/plugin/kernel.h"

#include <memory>

#include "adapter/tf/plugin/plugin_device.h"
#include "adapter/tf/plugin/se_handles.h"
#include "tensorflow/c/tf_buffer.h"

namespace npusim::tf {
namespace {

using StatusPtr = std::unique_ptr<TF_Status, void (*)(TF_Status*)>;
StatusPtr new_status() { return StatusPtr(TF_NewStatus(), &TF_DeleteStatus); }

// Reads the string field `field` of a serialized protocol buffer message (wire format:
// varint keys, wire types 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32). Used for
// NodeDef.op (field 2), which the kernel C API does not expose otherwise. nullopt if absent or
// malformed.
std::optional<std::string> proto_string_field(const uint8_t* p, size_t n, uint32_t field) {
  size_t i = 0;
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && i < n; shift += 7) {
      uint8_t b = p[i++];
      *v |= static_cast<uint64_t>(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  };
  while (i < n) {
    uint64_t key, len;
    if (!varint(&key)) return std::nullopt;
    switch (key & 7) {
      case 0:
        if (!varint(&len)) return std::nullopt;
        break;
      case 1: i += 8; break;
      case 5: i += 4; break;
      case 2:
        if (!varint(&len) || len > n - i) return std::nullopt;
        if ((key >> 3) == field) return std::string(reinterpret_cast<const char*>(p + i), len);
        i += len;
        break;
      default: return std::nullopt;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<compiler::DataType> from_tf_dtype(TF_DataType t) {
  using compiler::DataType;
  switch (t) {
    case TF_FLOAT: return DataType::F32;
    case TF_HALF: return DataType::F16;
    case TF_BFLOAT16: return DataType::BF16;
    case TF_INT32: return DataType::S32;
    case TF_INT16: return DataType::S16;
    case TF_INT8: return DataType::S8;
    case TF_UINT8: return DataType::U8;
    case TF_UINT16: return DataType::U16;
    case TF_INT64: return DataType::S64;
    case TF_BOOL: return DataType::BOOL;
    default: return std::nullopt;
  }
}

TF_DataType to_tf_dtype(compiler::DataType t) {
  using compiler::DataType;
  switch (t) {
    case DataType::F32: return TF_FLOAT;
    case DataType::F16: return TF_HALF;
    case DataType::BF16: return TF_BFLOAT16;
    case DataType::S32: return TF_INT32;
    case DataType::S16: return TF_INT16;
    case DataType::S8: return TF_INT8;
    case DataType::U8: return TF_UINT8;
    case DataType::U16: return TF_UINT16;
    case DataType::S64: return TF_INT64;
    case DataType::BOOL: return TF_BOOL;
  }
  return TF_FLOAT;
}

std::string tf_dtype_name(TF_DataType t) {
  switch (t) {
    case TF_FLOAT: return "float32";
    case TF_DOUBLE: return "float64";
    case TF_HALF: return "half";
    case TF_BFLOAT16: return "bfloat16";
    case TF_INT32: return "int32";
    case TF_INT64: return "int64";
    case TF_INT16: return "int16";
    case TF_INT8: return "int8";
    case TF_UINT8: return "uint8";
    case TF_UINT16: return "uint16";
    case TF_BOOL: return "bool";
    default: return "type " + std::to_string(static_cast<int>(t));
  }
}

// ---- Tensor

std::vector<int64_t> Tensor::shape() const {
  std::vector<int64_t> s(static_cast<size_t>(TF_NumDims(m_tensor.get())));
  for (size_t i = 0; i < s.size(); ++i) s[i] = TF_Dim(m_tensor.get(), static_cast<int>(i));
  return s;
}

rt::Status Tensor::desc(compiler::TensorDesc* out) const {
  auto t = from_tf_dtype(dtype());
  if (!t)
    return rt::Status(rt::StatusCode::invalid_argument,
                      "dtype " + tf_dtype_name(dtype()) + " cannot live on the NPU");
  out->dtype = *t;
  out->shape = shape();
  return rt::ok_status();
}

// ---- OpKernelConstruction

OpKernelConstruction::OpKernelConstruction(TF_OpKernelConstruction* ctx) : m_ctx(ctx) {
  TF_StringView name = TF_OpKernelConstruction_GetName(ctx);
  m_name.assign(name.data, name.len);
  StatusPtr st = new_status();
  TF_Buffer* node_def = TF_OpKernelConstruction_GetNodeDef(ctx, st.get());
  if (TF_GetCode(st.get()) == TF_OK && node_def) {
    auto op = proto_string_field(static_cast<const uint8_t*>(node_def->data), node_def->length,
                                 /*NodeDef.op=*/2);
    if (op) m_type = *op;
  }
  if (node_def) TF_DeleteBuffer(node_def);
  if (m_type.empty())
    CtxFailure(rt::Status(rt::StatusCode::internal,
                          "node '" + m_name + "': cannot read the op type from its NodeDef"));
}

bool OpKernelConstruction::HasAttr(const char* attr) const {
  StatusPtr st = new_status();
  return TF_OpKernelConstruction_HasAttr(m_ctx, attr, st.get());
}

rt::Status OpKernelConstruction::attr_status(const char* attr, TF_Status* tf) const {
  if (TF_GetCode(tf) == TF_OK) return rt::ok_status();
  return from_tf_status(tf, m_type + " '" + m_name + "': attribute '" + attr + "'");
}

rt::Status OpKernelConstruction::GetAttr(const char* attr, TF_DataType* value) const {
  StatusPtr st = new_status();
  TF_OpKernelConstruction_GetAttrType(m_ctx, attr, value, st.get());
  return attr_status(attr, st.get());
}

rt::Status OpKernelConstruction::GetAttr(const char* attr, bool* value) const {
  StatusPtr st = new_status();
  TF_Bool v = 0;
  TF_OpKernelConstruction_GetAttrBool(m_ctx, attr, &v, st.get());
  *value = v != 0;
  return attr_status(attr, st.get());
}

rt::Status OpKernelConstruction::GetAttr(const char* attr, int64_t* value) const {
  StatusPtr st = new_status();
  TF_OpKernelConstruction_GetAttrInt64(m_ctx, attr, value, st.get());
  return attr_status(attr, st.get());
}

rt::Status OpKernelConstruction::GetAttr(const char* attr, float* value) const {
  StatusPtr st = new_status();
  TF_OpKernelConstruction_GetAttrFloat(m_ctx, attr, value, st.get());
  return attr_status(attr, st.get());
}

rt::Status OpKernelConstruction::GetAttr(const char* attr, std::string* value) const {
  StatusPtr st = new_status();
  int32_t list_size = 0, total_size = 0;
  TF_OpKernelConstruction_GetAttrSize(m_ctx, attr, &list_size, &total_size, st.get());
  if (TF_GetCode(st.get()) != TF_OK) return attr_status(attr, st.get());
  std::string s(static_cast<size_t>(total_size), '\0');
  TF_OpKernelConstruction_GetAttrString(m_ctx, attr, s.data(), s.size(), st.get());
  *value = std::move(s);
  return attr_status(attr, st.get());
}

rt::Status OpKernelConstruction::GetAttr(const char* attr, std::vector<int64_t>* value) const {
  StatusPtr st = new_status();
  int32_t list_size = 0, total_size = 0;
  TF_OpKernelConstruction_GetAttrSize(m_ctx, attr, &list_size, &total_size, st.get());
  if (TF_GetCode(st.get()) != TF_OK) return attr_status(attr, st.get());
  value->assign(static_cast<size_t>(list_size), 0);
  TF_OpKernelConstruction_GetAttrInt64List(m_ctx, attr, value->data(), list_size, st.get());
  return attr_status(attr, st.get());
}

rt::Status OpKernelConstruction::GetAttr(const char* attr,
                                         std::vector<std::string>* value) const {
  StatusPtr st = new_status();
  int32_t list_size = 0, total_size = 0;
  TF_OpKernelConstruction_GetAttrSize(m_ctx, attr, &list_size, &total_size, st.get());
  if (TF_GetCode(st.get()) != TF_OK) return attr_status(attr, st.get());
  value->clear();
  // An empty list: nothing to read (its total_size is no byte count then).
  if (list_size <= 0) return rt::ok_status();
  std::vector<char*> strings(static_cast<size_t>(list_size));
  std::vector<size_t> lengths(static_cast<size_t>(list_size));
  std::string storage(static_cast<size_t>(total_size), '\0');
  TF_OpKernelConstruction_GetAttrStringList(m_ctx, attr, strings.data(), lengths.data(),
                                            list_size, storage.data(), storage.size(), st.get());
  for (int32_t i = 0; i < list_size && TF_GetCode(st.get()) == TF_OK; ++i)
    value->emplace_back(strings[i], lengths[i]);
  return attr_status(attr, st.get());
}

void OpKernelConstruction::CtxFailure(const rt::Status& st) {
  m_ok = false;
  StatusPtr tf = new_status();
  set_tf_status(st, tf.get());
  TF_OpKernelConstruction_Failure(m_ctx, tf.get());
}

// ---- OpKernelContext

rt::Status OpKernelContext::input(int index, Tensor* out) const {
  StatusPtr st = new_status();
  TF_Tensor* t = nullptr;
  TF_GetInput(m_ctx, index, &t, st.get());
  if (TF_GetCode(st.get()) != TF_OK) {
    if (t) TF_DeleteTensor(t);
    return from_tf_status(st.get(), op_name() + ": input " + std::to_string(index));
  }
  *out = Tensor(t);
  return rt::ok_status();
}

rt::Status OpKernelContext::allocate_output(int index, TF_DataType dtype,
                                            const std::vector<int64_t>& shape, Tensor* out) {
  StatusPtr st = new_status();
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  size_t bytes = static_cast<size_t>(elements) * TF_DataTypeSize(dtype);
  TF_Tensor* t = TF_AllocateOutput(m_ctx, index, dtype, shape.data(),
                                   static_cast<int>(shape.size()), bytes, st.get());
  if (TF_GetCode(st.get()) != TF_OK) {
    if (t) TF_DeleteTensor(t);
    return from_tf_status(st.get(), op_name() + ": allocating output " + std::to_string(index));
  }
  *out = Tensor(t);
  return rt::ok_status();
}

rt::Status OpKernelContext::allocate_temp(TF_DataType dtype, const std::vector<int64_t>& shape,
                                          Tensor* out) {
  StatusPtr st = new_status();
  TF_AllocatorAttributes attrs{TF_ALLOCATOR_ATTRIBUTES_STRUCT_SIZE, /*on_host=*/0};
  TF_Tensor* t = TF_AllocateTemp(m_ctx, dtype, shape.data(), static_cast<int>(shape.size()),
                                 &attrs, st.get());
  if (TF_GetCode(st.get()) != TF_OK) {
    if (t) TF_DeleteTensor(t);
    return from_tf_status(st.get(), op_name() + ": allocating a temporary");
  }
  *out = Tensor(t);
  return rt::ok_status();
}

rt::Status OpKernelContext::npu_stream(rt::Stream* out) const {
  StatusPtr st = new_status();
  SP_Stream s = TF_GetStream(m_ctx, st.get());
  if (TF_GetCode(st.get()) != TF_OK || !s)
    return rt::Status(rt::StatusCode::internal, op_name() + ": no NPU stream for this op");
  *out = s->stream;
  return rt::ok_status();
}

rt::Status OpKernelContext::npu_device(std::shared_ptr<rt::Device>* out) const {
  StatusPtr st = new_status();
  SP_Stream s = TF_GetStream(m_ctx, st.get());
  if (TF_GetCode(st.get()) != TF_OK || !s)
    return rt::Status(rt::StatusCode::internal, op_name() + ": no NPU stream for this op");
  return open_device(s->chip, out);
}

std::string OpKernelContext::op_name() const {
  TF_StringView name = TF_GetOpKernelName(m_ctx);
  return std::string(name.data, name.len);
}

void OpKernelContext::CtxFailure(const rt::Status& st) {
  StatusPtr tf = new_status();
  set_tf_status(st, tf.get());
  TF_OpKernelContext_Failure(m_ctx, tf.get());
}

// ---- registration

rt::Status KernelDefBuilder::register_with(void* (*create)(TF_OpKernelConstruction*),
                                           void (*compute)(void*, TF_OpKernelContext*),
                                           void (*destroy)(void*)) const {
  // Every combination of the constraints' types: an odometer over the constraint lists.
  std::vector<size_t> pick(m_constraints.size(), 0);
  for (const Constraint& c : m_constraints)
    if (c.types.empty())
      return rt::Status(rt::StatusCode::internal,
                        m_op + ": type constraint '" + c.attr + "' lists no type");
  while (true) {
    TF_KernelBuilder* b = TF_NewKernelBuilder(m_op.c_str(), kDeviceNpu, create, compute, destroy);
    StatusPtr st = new_status();
    std::string name = m_op;
    for (size_t i = 0; i < m_constraints.size(); ++i) {
      TF_DataType t = m_constraints[i].types[pick[i]];
      TF_KernelBuilder_TypeConstraint(b, m_constraints[i].attr.c_str(), t, st.get());
      if (TF_GetCode(st.get()) != TF_OK) {
        TF_DeleteKernelBuilder(b);
        return from_tf_status(st.get(), "registering " + m_op);
      }
      name += "_" + m_constraints[i].attr + "_" + tf_dtype_name(t);
    }
    for (const std::string& arg : m_host_memory) TF_KernelBuilder_HostMemory(b, arg.c_str());
    // TF_RegisterKernelBuilder takes ownership of the builder.
    TF_RegisterKernelBuilder(name.c_str(), b, st.get());
    if (TF_GetCode(st.get()) != TF_OK) return from_tf_status(st.get(), "registering " + name);
    size_t i = 0;
    for (; i < pick.size(); ++i) {
      if (++pick[i] < m_constraints[i].types.size()) break;
      pick[i] = 0;
    }
    if (i == pick.size()) return rt::ok_status();
  }
}

rt::Status host_ints(const std::string& op, const Tensor& t, int index,
                     std::vector<int64_t>* out) {
  const int64_t n = t.NumElements();
  out->clear();
  if (t.dtype() == TF_INT32) {
    const auto* v = static_cast<const int32_t*>(t.host_data());
    out->assign(v, v + n);
  } else if (t.dtype() == TF_INT64) {
    const auto* v = static_cast<const int64_t*>(t.host_data());
    out->assign(v, v + n);
  } else {
    return rt::Status(rt::StatusCode::invalid_argument,
                      op + ": input " + std::to_string(index) + " is " +
                          tf_dtype_name(t.dtype()) + ", expected int32 or int64");
  }
  return rt::ok_status();
}

}  // namespace npusim::tf
