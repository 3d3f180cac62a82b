// NumPy .npy files, for the command line's tensor inputs and outputs.
//
// Format (numpy.lib.format, "NEP 1"): the magic "\x93NUMPY", a major and a minor version byte,
// the header length (little-endian uint16 in version 1.0, uint32 in 2.0), then an ASCII Python
// dict literal {'descr': ..., 'fortran_order': ..., 'shape': (...), } padded with spaces and a
// final '\n' so that the data starts at a multiple of 64 bytes; then the raw elements.
// Supported: versions 1.0 and 2.0 (the writer uses 1.0 unless the header needs 2.0),
// little-endian ('<') or byte-order-free ('|') descrs, C order. Big-endian data, Fortran order,
// other dtypes, bad magic, truncated headers or data throw npusim::Error naming the file.
//
// bf16 has no numpy descr: a bf16 tensor travels as a "u2" array of the raw bf16 bit patterns
// (in numpy: `a.view(np.uint16)` of an ml_dtypes.bfloat16 array), and whoever reads it states
// the element type bf16 separately; npy_dtype(BF16) is "u2".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "isa/isa.h"

namespace npusim {

struct NpyArray {
  // numpy descr without byte order: "f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "b1"
  std::string dtype;
  std::vector<int64_t> shape;  // empty for a 0-d (scalar) array
  std::vector<uint8_t> data;   // elements in C (row-major) order, little-endian
  int64_t elements() const;    // product of shape (1 for a 0-d array)
  int item_size() const;       // bytes per element; throws Error for an unsupported dtype
};

// Reads a whole .npy file. Throws Error("<path>: <problem>").
NpyArray read_npy(const std::string& path);
// Writes `a` as a .npy file. Throws Error if the dtype is unsupported, data.size() is not
// elements() * item_size(), or the file cannot be written.
void write_npy(const std::string& path, const NpyArray& a);

// The same on bytes in memory; `source` names the bytes in error messages.
NpyArray parse_npy(const std::vector<uint8_t>& bytes, const std::string& source);
std::vector<uint8_t> serialize_npy(const NpyArray& a);

// numpy descr (without byte order) <-> ISA element type: f2 F16, f4 F32, i1 S8, i2 S16, i4 S32,
// i8 S64, u1 U8, u2 U16. f8 and b1 have no ISA type (nullopt). BF16 maps to "u2" (raw bits,
// see above), so npy_dtype(BF16) does not round-trip through isa_dtype_of_npy.
std::optional<isa::Dtype> isa_dtype_of_npy(std::string_view descr);
std::string npy_dtype(isa::Dtype t);  // throws Error for Dtype::NONE

}  // namespace npusim
