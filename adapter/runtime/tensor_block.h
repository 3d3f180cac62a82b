// Where a tensor lies in the allocation block that holds it alone: compiled kernels may read up
// to `spare` bytes (compiler::kDeviceBufferAlign, adapter/compiler/op_desc.h) before and past a
// tensor, so its block holds one guard unit of the allocator's alignment (an L2 line or more)
// before the tensor and `spare` bytes after it. No other tensor's line is then touched by a
// launch reading this one. The TF plugin places every tensor so (malloc_tensor,
// adapter/tf/plugin/plugin_device.h), and `npusim op` places a compiled op's buffers so
// (tools/device_buffers.h): the chip's L2 model files a launch's lines by block with pages
// counted from the block's first line, the guard's, so both file the same op's lines alike.
#pragma once

#include <cstdint>

namespace npusim::rt {

struct TensorBlock {
  uint64_t alignment;  // the allocator's (HbmAllocator::alignment()), bytes: the guard
  uint64_t spare;      // bytes kept after the tensor

  // Bytes to allocate for a tensor of `tensor_bytes`.
  uint64_t block_bytes(uint64_t tensor_bytes) const { return alignment + tensor_bytes + spare; }
  // The tensor's device address in the block starting at `block`, and back.
  uint64_t tensor_at(uint64_t block) const { return block + alignment; }
  uint64_t block_at(uint64_t tensor) const { return tensor - alignment; }
};

}  // namespace npusim::rt
