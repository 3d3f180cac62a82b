// What the kernel compiler is asked to compile: one TensorFlow op with its attributes and the
// types and shapes of its tensors. No TensorFlow here: the plugin fills these from TF's own
// kernel context (TF_DataType -> DataType, TF attrs -> AttrValue).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/error.h"
#include "isa/isa.h"

namespace npusim::compiler {

// Element types a tensor can have. The first nine are the ISA's types (isa::Dtype, same order);
// BOOL is TensorFlow's bool. Device storage (what a GM buffer holds, little-endian):
//   F32 F16 BF16 S32 S16 S8 U8 U16: the ISA type of the same name.
//   S64:  8-byte two's complement (TF int64). Stored and moved, but no vector or cube
//         instruction computes on it: ops that take or produce S64 move it as bytes or convert
//         it to / from s32 with the scalar unit (ops/int64.h: ArgMax's output_type, int64
//         labels); the others reject it.
//   BOOL: one byte per element, 0 = false, 1 = true (TF's own layout); kernels read and write
//         it as U8.
enum class DataType : uint8_t { F32, F16, BF16, S32, S16, S8, U8, U16, S64, BOOL };

const char* data_type_name(DataType t);  // "f32", ..., "s64", "bool"
std::optional<DataType> data_type_from_name(const std::string& s);
int data_type_bytes(DataType t);    // storage bytes per element
bool data_type_is_float(DataType t);
// The ISA type a kernel reads and writes for t (BOOL -> U8, S64 -> S64).
isa::Dtype device_dtype(DataType t);
// The DataType of an ISA type (isa::Dtype::NONE is an Error).
DataType from_device_dtype(isa::Dtype t);

struct TensorDesc {
  DataType dtype = DataType::F32;
  std::vector<int64_t> shape;  // empty: a scalar (one element)

  int64_t num_elements() const;
  uint64_t bytes() const { return static_cast<uint64_t>(num_elements()) * data_type_bytes(dtype); }
  std::string str() const;  // "f32[2,3]"
  bool operator==(const TensorDesc& o) const { return dtype == o.dtype && shape == o.shape; }
  bool operator!=(const TensorDesc& o) const { return !(*this == o); }
};

// Device buffer contract (the runtime's allocator must honour it for every tensor a kernel
// reads or writes): a buffer holding a tensor of B bytes spans at least
// device_buffer_bytes(B) = round_up(B, kDeviceBufferAlign) bytes, because the MTEs move whole
// 32-byte blocks and a kernel may write the tail of the last block. Kernels may also READ up to
// kDeviceBufferAlign bytes before the start and past the end of an input buffer (never write
// there), so no buffer may start within kDeviceBufferAlign bytes of device address 0 or end
// within that of the device memory's end. Outputs must not alias inputs.
inline constexpr uint64_t kDeviceBufferAlign = 32;
inline constexpr uint64_t device_buffer_bytes(uint64_t tensor_bytes) {
  return (tensor_bytes + kDeviceBufferAlign - 1) / kDeviceBufferAlign * kDeviceBufferAlign;
}

// An attribute value: TF's int, float, bool, string (also used for type attrs such as "T",
// written as a data_type_name), list(int) and list(string).
using AttrValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>,
                               std::vector<std::string>>;
std::string attr_value_str(const AttrValue& v);  // canonical text, used in cache keys

// Raised for anything the compiler cannot compile (unknown op, unsupported dtype, attribute or
// shape, a tile that does not fit the chip). The message names the op and the reason.
struct CompileError : Error {
  using Error::Error;
};

// The op itself is invalid, whatever the chip: its inputs or attributes break the op's own
// contract (inner dimensions of a product differ, shapes do not broadcast, an axis or a
// permutation or a slice is out of range, ...), where TensorFlow's kernels on every device fail
// with InvalidArgumentError. A CompileError, so callers that do not tell the two apart still
// catch it; the TF plugin maps it to InvalidArgumentError, plain CompileError to Unimplemented.
struct InvalidOpError : CompileError {
  using CompileError::CompileError;
};

// The host ran out of memory compiling the op (std::bad_alloc or std::length_error inside a
// family's compile): "<op str>: ...", so the caller learns which op and shapes did it. A
// CompileError; the TF plugin maps it to ResourceExhaustedError.
struct CompileMemoryError : CompileError {
  using CompileError::CompileError;
};

struct OpDesc {
  std::string type;                        // TF op name: "AddV2", "MatMul", "Cast", ...
  std::map<std::string, AttrValue> attrs;  // by TF attribute name
  std::vector<TensorDesc> inputs;
  // Optional: the output tensors as the caller expects them. Empty means "infer"; when given,
  // compile() checks them against its own shape inference.
  std::vector<TensorDesc> outputs;

  // Canonical cache key: op, input dtypes and shapes, attributes (sorted by name), and the
  // outputs if given. Two descs with the same key compile to the same kernel.
  std::string key() const;
  // "AddV2(f32[2,3], f32[3])" for messages; with more than kListedInputs inputs, runs of equal
  // ones are counted ("Pack(bool[] x 300)") and at most kListedInputs runs are listed.
  std::string str() const;
  static constexpr size_t kListedInputs = 8;

  // Typed attribute access; a missing attribute gives `fallback`, a present one of another type
  // throws CompileError naming op and attribute.
  int64_t attr_int(const std::string& name, int64_t fallback) const;
  double attr_float(const std::string& name, double fallback) const;
  bool attr_bool(const std::string& name, bool fallback) const;
  std::string attr_string(const std::string& name, const std::string& fallback) const;
  std::vector<int64_t> attr_ints(const std::string& name) const;  // missing: empty
  std::vector<std::string> attr_strings(const std::string& name) const;  // missing: empty
  // A type attribute ("T", "DstT"): a string holding a data_type_name; nullopt if absent.
  std::optional<DataType> attr_type(const std::string& name) const;

  // Throws CompileError "<op str>: <what>": the compiler cannot compile this (valid) op.
  [[noreturn]] void fail(const std::string& what) const;
  // Throws InvalidOpError "<op str>: <what>": the op's inputs or attributes are invalid.
  [[noreturn]] void invalid(const std::string& what) const;
  // The size rule every tensor of a kernel keeps (inputs, outputs, and shapes an op builds from
  // attributes or host inputs before it compiles them): its non-zero dimensions times its
  // element size fit int64_t, so that no byte count, pixel or row count or offset a kernel forms
  // wraps (zero dimensions left out, so that no partial product wraps either). Otherwise throws
  // InvalidOpError "<op str>: <what> <tensor> is too large: ...", as TF's TensorShape refuses
  // such a shape. A negative dimension is refused too.
  void check_size(const TensorDesc& t, const std::string& what) const;
};

// numpy/TensorFlow broadcasting of two shapes (aligned at the last dimension; each pair of dims
// equal or one of them 1). nullopt if incompatible.
std::optional<std::vector<int64_t>> broadcast_shapes(const std::vector<int64_t>& a,
                                                     const std::vector<int64_t>& b);

std::string shape_str(const std::vector<int64_t>& shape);  // "[2,3]"

}  // namespace npusim::compiler
