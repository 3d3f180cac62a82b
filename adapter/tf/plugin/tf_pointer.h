// TensorFlow's device pointers for NPU tensors. With several chips (NPUSIM_CHIPS,
// NPUSIM_SYSTEM) every NPU device hands out addresses of its own chip's memory, and the same
// address exists on every chip; TensorFlow copies a tensor between two NPUs by giving one device
// the other's pointer (memcpy_dtod). So chip k's device address a is the pointer
// (k << kChipShift) | a: the pointer says which chip it lies on. Chip 0's pointers are its
// device addresses, so a single-chip process sees exactly the addresses it always did.
// Everything the plugin passes to the runtime is the chip's own address (local_address).
// No includes: both the C-API side and the TF C++ kernels (tf_cc_kernel_util.h) use it.
#pragma once

#include <cstdint>

namespace npusim::tf {

constexpr int kChipShift = 40;  // device memory of up to 1 TiB per chip (checked at open)

inline uint64_t tf_pointer(int chip, uint64_t addr) {
  return (static_cast<uint64_t>(chip) << kChipShift) | addr;
}
inline int chip_of_pointer(uint64_t p) { return static_cast<int>(p >> kChipShift); }
inline uint64_t local_address(uint64_t p) { return p & ((uint64_t{1} << kChipShift) - 1); }

}  // namespace npusim::tf
