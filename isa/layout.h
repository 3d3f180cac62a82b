// Geometry fixed by the ISA, shared by the simulator (sim/exec), the compiler and the profiler:
// the fractal data layouts of the MTE, cube and FIXPIPE instructions (the contract in
// docs/assembly.md, "Data layouts") and the vector unit's repeat geometry (isa.def). Layout
// offsets are in ELEMENTS from the start of the matrix; multiply by the element size for bytes.
// These are format facts of the ISA, not hardware rates, so they are constants here rather than
// config values.
#pragma once

#include <cstdint>

#include "common/int_math.h"

namespace npusim::layout {

inline constexpr uint64_t kBlockBytes = 32;     // one block: the unit of C0, gaps and strides
inline constexpr uint64_t kFractalBytes = 512;  // one L1 / L0A / L0B fractal
inline constexpr uint64_t kFractalRows = 16;    // rows of a fractal (and n-width of L0B/L0C ones)
inline constexpr uint64_t kL0cElemBytes = 4;    // L0C holds f32 or s32

// C0 (= K0): elements of one 32-byte block for an element of `elem_bytes` bytes.
inline constexpr uint64_t c0_of(uint64_t elem_bytes) { return kBlockBytes / elem_bytes; }

// NZ: a matrix stored as [ceil(cols/c0)][rows_padded][c0]; element (r, c).
inline constexpr uint64_t nz_offset(uint64_t r, uint64_t c, uint64_t rows_padded, uint64_t c0) {
  return ((c / c0) * rows_padded + r) * c0 + c % c0;
}

// L0A "Zz": A (m x k) as 16 x k0 fractals, fractal (r/16, c/k0) at index
// (r/16) * k_blocks + c/k0, row-major inside. k_blocks = ceil(k / k0).
inline constexpr uint64_t zz_offset(uint64_t r, uint64_t c, uint64_t k_blocks, uint64_t k0) {
  return ((r / kFractalRows) * k_blocks + c / k0) * (kFractalRows * k0) + (r % kFractalRows) * k0 +
         c % k0;
}

// L0B "Zn": B (k x n) as fractals (kk/k0, nn/16) at index (kk/k0) * n_blocks + nn/16, each
// stored column-major: (kk, nn) at (nn % 16) * k0 + kk % k0. n_blocks = ceil(n / 16).
inline constexpr uint64_t zn_offset(uint64_t kk, uint64_t nn, uint64_t n_blocks, uint64_t k0) {
  return ((kk / k0) * n_blocks + nn / kFractalRows) * (kFractalRows * k0) +
         (nn % kFractalRows) * k0 + kk % k0;
}

// L0C: C (m x n) as [ceil(n/16)][m16][16], m16 = round_up(m, 16).
inline constexpr uint64_t l0c_offset(uint64_t r, uint64_t c, uint64_t m16) {
  return nz_offset(r, c, m16, kFractalRows);
}

// Element count of the smallest prefix holding every element (r < m, c < n) of each layout
// (the last touched element is the last row / column of the last fractal). Used for bounds
// checks of exactly the bytes an instruction touches.
inline constexpr uint64_t zz_extent(uint64_t m, uint64_t k, uint64_t k0) {
  return zz_offset(m - 1, k - 1, ceil_div(k, k0), k0) + 1;
}
inline constexpr uint64_t zn_extent(uint64_t k, uint64_t n, uint64_t k0) {
  return zn_offset(k - 1, n - 1, ceil_div(n, kFractalRows), k0) + 1;
}
inline constexpr uint64_t l0c_extent(uint64_t m, uint64_t n) {
  return l0c_offset(m - 1, n - 1, round_up(m, kFractalRows)) + 1;
}

}  // namespace npusim::layout

namespace npusim::vec {

// A vector repeat is 8 blocks of 32 bytes; the normal-mode mask has a bit per lane.
inline constexpr int kBlockBytes = static_cast<int>(layout::kBlockBytes);
inline constexpr int kBlocksPerRepeat = 8;
inline constexpr int kRepeatBytes = kBlockBytes * kBlocksPerRepeat;
inline constexpr int kMaskLanes = 128;     // width of the normal-mode mask
inline constexpr int kTransposeSide = 16;  // vtranspose: 16 x 16 elements of 2 bytes
inline constexpr int kTransposeElemBytes = 2;
inline constexpr int kTransposeBytes = kTransposeSide * kTransposeSide * kTransposeElemBytes;

}  // namespace npusim::vec
