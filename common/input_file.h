// Reading a user-supplied input file (kernel source or binary, .npy tensor, chip config) whole
// into memory. Only a regular file of at most a given size is read: a FIFO, character device
// (/dev/zero, /dev/urandom, a terminal), directory or socket is refused without blocking, and so
// is a file larger than the limit, so a wrong path gives an error naming the file instead of
// reading until the host runs out of memory. A file that grows past the limit while it is read
// (or a pseudo-file whose size the filesystem reports as 0) is cut off at the limit and refused.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/error.h"

namespace npusim {

// Size limits, bytes. Kernels: the assembler and binary format hold at most 2^20 instructions
// per section (a 20-bit label field); 256 MiB is far above any such file. Chip configs are a
// few KiB of YAML. Tensors: 64 GiB, the largest preset's device memory (an input larger than
// the device cannot be uploaded).
inline constexpr uint64_t kMaxKernelFileBytes = uint64_t{256} << 20;
inline constexpr uint64_t kMaxConfigFileBytes = uint64_t{16} << 20;
inline constexpr uint64_t kMaxNpyFileBytes = uint64_t{64} << 30;

// Reads `path` whole. On failure returns false and sets *problem to "<path>: <what>", naming
// `kind` (e.g. "kernel file"): cannot open (with the system's reason), not a regular file
// (which kind of file it is), larger than max_bytes (with both sizes), or a read error.
bool try_read_input_file(const std::string& path, std::string_view kind, uint64_t max_bytes,
                         std::string* contents, std::string* problem);

// The same, throwing E (an npusim::Error type: IsaError for kernels, ConfigError for configs)
// with that message.
template <typename E = Error>
std::string read_input_file(const std::string& path, std::string_view kind, uint64_t max_bytes) {
  std::string contents, problem;
  if (!try_read_input_file(path, kind, max_bytes, &contents, &problem)) throw E(problem);
  return contents;
}

}  // namespace npusim
