#include "adapter/compiler/op_desc.h"

#include <algorithm>

#include <fmt/format.h>

namespace npusim::compiler {
namespace {

const char* const kTypeNames[] = {"f32", "f16", "bf16", "s32", "s16", "s8", "u8", "u16", "s64",
                                  "bool"};
constexpr int kNumTypes = sizeof(kTypeNames) / sizeof(kTypeNames[0]);

}  // namespace

const char* data_type_name(DataType t) { return kTypeNames[static_cast<int>(t)]; }

std::optional<DataType> data_type_from_name(const std::string& s) {
  for (int i = 0; i < kNumTypes; ++i)
    if (s == kTypeNames[i]) return static_cast<DataType>(i);
  return std::nullopt;
}

int data_type_bytes(DataType t) {
  return t == DataType::BOOL ? 1 : isa::dtype_size(device_dtype(t));
}

bool data_type_is_float(DataType t) {
  return t == DataType::F32 || t == DataType::F16 || t == DataType::BF16;
}

isa::Dtype device_dtype(DataType t) {
  if (t == DataType::BOOL) return isa::Dtype::U8;
  return static_cast<isa::Dtype>(static_cast<int>(t));  // same order as isa::Dtype
}

DataType from_device_dtype(isa::Dtype t) {
  if (t == isa::Dtype::NONE) throw Error("from_device_dtype: isa::Dtype::NONE has no DataType");
  return static_cast<DataType>(static_cast<int>(t));
}

int64_t TensorDesc::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ","));
}

std::string TensorDesc::str() const { return data_type_name(dtype) + shape_str(shape); }

std::string attr_value_str(const AttrValue& v) {
  struct Visitor {
    std::string operator()(int64_t i) const { return fmt::format("i:{}", i); }
    // %a keeps every bit of the double, so distinct values never share a key.
    std::string operator()(double d) const { return fmt::format("f:{:a}", d); }
    std::string operator()(bool b) const { return b ? "b:1" : "b:0"; }
    std::string operator()(const std::string& s) const { return "s:" + s; }
    std::string operator()(const std::vector<int64_t>& l) const {
      return fmt::format("l:[{}]", fmt::join(l, ","));
    }
    // Each string prefixed by its length, so no two lists share a key.
    std::string operator()(const std::vector<std::string>& l) const {
      std::string k = "ls:[";
      for (const std::string& s : l) k += fmt::format("{}:{};", s.size(), s);
      return k + "]";
    }
  };
  return std::visit(Visitor{}, v);
}

std::string OpDesc::key() const {
  std::string k = type + "(";
  for (size_t i = 0; i < inputs.size(); ++i) k += (i ? "," : "") + inputs[i].str();
  k += ")";
  if (!outputs.empty()) {
    k += "->(";
    for (size_t i = 0; i < outputs.size(); ++i) k += (i ? "," : "") + outputs[i].str();
    k += ")";
  }
  k += "{";
  bool first = true;
  for (const auto& [name, value] : attrs) {  // std::map: sorted by name
    k += (first ? "" : ";") + name + "=" + attr_value_str(value);
    first = false;
  }
  return k + "}";
}

std::string OpDesc::str() const {
  std::vector<std::string> parts;
  for (const TensorDesc& t : inputs) parts.push_back(t.str());
  std::string s = type + "(";
  if (parts.size() <= kListedInputs) {
    for (size_t i = 0; i < parts.size(); ++i) s += (i ? ", " : "") + parts[i];
    return s + ")";
  }
  // Many inputs (Pack, ConcatV2 of hundreds): runs of equal inputs as "f32[2,3] x 300", and
  // past kListedInputs runs only the count, so that a message stays readable.
  size_t runs = 0;
  for (size_t i = 0; i < parts.size();) {
    size_t j = i + 1;
    while (j < parts.size() && parts[j] == parts[i]) ++j;
    if (runs == kListedInputs) {
      s += fmt::format(", ... ({} inputs in all)", parts.size());
      break;
    }
    s += (runs ? ", " : "") + parts[i] + (j - i > 1 ? fmt::format(" x {}", j - i) : "");
    ++runs;
    i = j;
  }
  return s + ")";
}

void OpDesc::fail(const std::string& what) const { throw CompileError(str() + ": " + what); }

void OpDesc::invalid(const std::string& what) const { throw InvalidOpError(str() + ": " + what); }

void OpDesc::check_size(const TensorDesc& t, const std::string& what) const {
  for (int64_t d : t.shape)
    if (d < 0) invalid(fmt::format("{} {} has a negative dimension", what, t.str()));
  int64_t bytes = data_type_bytes(t.dtype);
  for (int64_t d : t.shape)
    if (d != 0 && __builtin_mul_overflow(bytes, d, &bytes))
      invalid(fmt::format("{} {} is too large: its dimensions multiply past 2^63 bytes", what,
                          t.str()));
}

namespace {

template <typename T>
const T* typed_attr(const OpDesc& op, const std::string& name, const char* type_name) {
  auto it = op.attrs.find(name);
  if (it == op.attrs.end()) return nullptr;
  const T* v = std::get_if<T>(&it->second);
  if (!v)
    op.fail(fmt::format("attribute '{}' = {} is not of type {}", name,
                        attr_value_str(it->second), type_name));
  return v;
}

}  // namespace

int64_t OpDesc::attr_int(const std::string& name, int64_t fallback) const {
  const int64_t* v = typed_attr<int64_t>(*this, name, "int");
  return v ? *v : fallback;
}

double OpDesc::attr_float(const std::string& name, double fallback) const {
  const double* v = typed_attr<double>(*this, name, "float");
  return v ? *v : fallback;
}

bool OpDesc::attr_bool(const std::string& name, bool fallback) const {
  const bool* v = typed_attr<bool>(*this, name, "bool");
  return v ? *v : fallback;
}

std::string OpDesc::attr_string(const std::string& name, const std::string& fallback) const {
  const std::string* v = typed_attr<std::string>(*this, name, "string");
  return v ? *v : fallback;
}

std::vector<int64_t> OpDesc::attr_ints(const std::string& name) const {
  const std::vector<int64_t>* v = typed_attr<std::vector<int64_t>>(*this, name, "list(int)");
  return v ? *v : std::vector<int64_t>{};
}

std::vector<std::string> OpDesc::attr_strings(const std::string& name) const {
  const auto* v = typed_attr<std::vector<std::string>>(*this, name, "list(string)");
  return v ? *v : std::vector<std::string>{};
}

std::optional<DataType> OpDesc::attr_type(const std::string& name) const {
  const std::string* v = typed_attr<std::string>(*this, name, "type");
  if (!v) return std::nullopt;
  auto t = data_type_from_name(*v);
  if (!t) fail(fmt::format("attribute '{}' = '{}' is not a data type name", name, *v));
  return t;
}

std::optional<std::vector<int64_t>> broadcast_shapes(const std::vector<int64_t>& a,
                                                     const std::vector<int64_t>& b) {
  const size_t rank = std::max(a.size(), b.size());
  std::vector<int64_t> out(rank);
  for (size_t i = 0; i < rank; ++i) {
    // Dimension i counted from the last.
    int64_t da = i < a.size() ? a[a.size() - 1 - i] : 1;
    int64_t db = i < b.size() ? b[b.size() - 1 - i] : 1;
    int64_t d;
    if (da == db) d = da;
    else if (da == 1) d = db;
    else if (db == 1) d = da;
    else return std::nullopt;
    out[rank - 1 - i] = d;
  }
  return out;
}

}  // namespace npusim::compiler
