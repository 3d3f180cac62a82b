// The device-memory allocator: hands out blocks of the simulated HBM address space
// [base, end) for aclrtMalloc-style calls. Best fit (the smallest free block that holds the
// request; the lowest address among equal sizes), blocks split from their low end, freed blocks
// coalesced with free neighbours. Every block starts on, and is rounded up to, the alignment
// given at construction: at least kAlignment bytes (512: the largest GM burst and the L0A/L0B
// fractal size, so any tensor can be moved by any MTE path without a misaligned head); the
// device uses its L2 line if that is larger, so no two blocks share an L2 line. Where the blocks
// lie still depends on the order of the requests (TensorFlow's threads); the chip's L2 model
// files a launch's lines by block (block_of, sim/chip/l2_placement.h), so a launch's L2
// behaviour does not depend on it. Thread-safe. It only does bookkeeping: it never touches the
// simulated memory (the device discards freed pages, see device.h).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "adapter/runtime/status.h"

namespace npusim::rt {

struct AllocatorStats {
  uint64_t bytes_in_use = 0;        // bytes in live blocks (each rounded up to the alignment)
  uint64_t peak_bytes_in_use = 0;   // maximum of bytes_in_use since construction or reset_peak()
  uint64_t num_allocs = 0;          // live blocks
  uint64_t total_allocs = 0;        // successful allocations since construction
  uint64_t largest_alloc_size = 0;  // largest block handed out since construction, bytes
  uint64_t largest_free_block = 0;  // largest request that can succeed now, bytes
  uint64_t bytes_free = 0;          // bytes_limit - bytes_in_use (fragmentation included)
  uint64_t bytes_limit = 0;         // size of the managed range [base, end), bytes
};

class HbmAllocator {
 public:
  static constexpr uint64_t kAlignment = 512;

  // Manages [round_up(base), round_down(end)) in blocks of `alignment` bytes (a power of two,
  // at least kAlignment); base must be > 0 so address 0 is never handed out. Throws
  // npusim::Error if the alignment is not allowed or the range holds no block.
  HbmAllocator(uint64_t base, uint64_t end, uint64_t alignment = kAlignment);

  // A block of at least `bytes` (> 0) bytes. out_of_memory names the request and what is free.
  Status allocate(uint64_t bytes, uint64_t* addr);

  // Frees in two steps so the caller can scrub the block in between: begin_release takes the
  // live block at `addr` out of use (a second free of it then fails) and returns its size;
  // finish_release puts it on the free list. invalid_argument if `addr` is not a live block.
  Status begin_release(uint64_t addr, uint64_t* block_bytes);
  void finish_release(uint64_t addr);
  Status release(uint64_t addr);  // both steps

  // True if [addr, addr+bytes) lies inside one live block.
  bool contains(uint64_t addr, uint64_t bytes) const;
  // The live block holding `addr`: sets *start and *bytes (its rounded size) and returns true;
  // false if no live block holds it. What the chip's L2 model files a launch's lines by
  // (sim/chip/l2_placement.h, a GmBlockLookup).
  bool block_of(uint64_t addr, uint64_t* start, uint64_t* bytes) const;
  uint64_t base() const { return m_base; }
  uint64_t alignment() const { return m_alignment; }
  uint64_t end() const { return m_end; }
  AllocatorStats stats() const;
  // Restarts peak_bytes_in_use from bytes_in_use now (TensorFlow's reset_memory_stats).
  void reset_peak();

 private:
  void insert_free(uint64_t addr, uint64_t size);
  void erase_free(std::map<uint64_t, uint64_t>::iterator it);
  uint64_t largest_free_locked() const;

  uint64_t m_alignment, m_base, m_end;
  mutable std::mutex m_mutex;
  std::map<uint64_t, uint64_t> m_free;                 // start -> size, address order
  std::set<std::pair<uint64_t, uint64_t>> m_by_size;   // (size, start) of every free block
  std::map<uint64_t, uint64_t> m_live;                 // start -> size
  std::map<uint64_t, uint64_t> m_releasing;            // between begin_ and finish_release
  AllocatorStats m_stats;
};

}  // namespace npusim::rt
