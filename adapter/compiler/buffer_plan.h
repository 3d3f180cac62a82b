// BufferPlan: a kernel's on-chip buffers declared once. The same list answers "how large a tile
// fits" (fit) and lays the buffers out (allocate), so a kernel never keeps a hand-computed
// budget next to its allocations.
//
// A tile is counted in UNITS the kernel chooses (elements, 4-byte lanes, rows, ...). Each
// buffer's size is a function of the units: linear (bytes_per_unit * units + fixed bytes,
// rounded up to whole bytes) or any monotone function (e.g. a scratch that grows in steps).
// A buffer of two copies (ping / pong) is laid out as two buffers; a disabled buffer (enabled
// false, e.g. a widened copy an f32 kernel does not need) takes no space and has address 0.
//
// The layout is exactly KernelBuilder::alloc's: buffers in declaration order, each starting at
// the next multiple of the buffer's alignment (KernelBuilder::alignment) after the one before.
// fit() therefore finds the largest tile whose allocation succeeds, no more and no less.
//
// A placed buffer (place()) starts at a given offset modulo a period: each copy is preceded by
// a padding allocation up to the next such address (e.g. the UB's bank windows: operands of a
// vector instruction that start in different windows of banks x width bytes do not meet in a
// bank). The padding is part of the layout (extent, allocations, allocate), so a tile found by
// fit() with placed buffers is one whose padded layout fits; as the padding depends on where
// each buffer lands, extent is then not monotone in the units, and fit() returns a tile that
// fits, not necessarily the largest.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "adapter/compiler/kernel_builder.h"
#include "isa/isa.h"

namespace npusim::compiler {

// Two copies of a buffer (ping / pong), indexed by parity; a single buffer has a[0] == a[1].
struct Twin {
  uint64_t a[2] = {0, 0};
  uint64_t operator[](int q) const { return a[q]; }
};

class BufferPlan {
 public:
  using Id = int;
  // bytes(units) of one copy; must not decrease as units grow.
  using SizeFn = std::function<uint64_t(int64_t units)>;

  // All buffers of the plan live in `buf` (one plan per buffer kind: UB, L1, L0A, ...).
  explicit BufferPlan(isa::Buf buf = isa::Buf::UB) : m_buf(buf) {}

  // ceil(units * bytes_per_unit) + fixed_bytes per copy.
  Id add(std::string name, double bytes_per_unit, uint64_t fixed_bytes = 0, int copies = 1,
         bool enabled = true);
  // The same size whatever the tile.
  Id add_fixed(std::string name, uint64_t bytes, int copies = 1, bool enabled = true);
  Id add_sized(std::string name, SizeFn bytes, int copies = 1, bool enabled = true);
  // Buffer `id` (each copy) starts at an address = offset (mod period); period a multiple of
  // every alignment the plan is laid out with, offset < period.
  void place(Id id, uint64_t period, uint64_t offset);
  bool has_placed() const;

  isa::Buf buf() const { return m_buf; }
  // One copy of buffer `id` at `units`, in bytes (0 if disabled).
  uint64_t bytes(Id id, int64_t units) const;
  // The end of the layout at `units`: the first byte past the last buffer when the plan is
  // laid out from byte `start` (already allocated bytes of the same buffer) with `alignment`.
  uint64_t extent(int64_t units, uint64_t alignment, uint64_t start = 0) const;
  // How many allocations allocate() makes at `units`, at most: copies counted (a placed one
  // twice, for its padding), disabled and empty buffers not (e.g. to budget one alignment unit
  // per allocation, whatever the layout).
  int allocations(int64_t units) const;
  // The largest multiple of `granule` in [granule, max_units] whose layout from `start` ends
  // within `capacity` bytes; 0 if even `granule` units do not fit.
  int64_t fit(uint64_t capacity, uint64_t alignment, int64_t granule, int64_t max_units,
              uint64_t start = 0) const;
  // fit() against a fresh core of the config (capacity of buf() on cores of `kind`).
  int64_t fit(const ChipConfig& cfg, isa::CoreKind kind, int64_t granule, int64_t max_units) const;
  // fit() against what the builder's current section has left of buf().
  int64_t fit(const KernelBuilder& b, int64_t granule, int64_t max_units) const;

  // Addresses of an allocated plan, by Id.
  class Placed {
   public:
    uint64_t operator[](Id id) const { return m_at[static_cast<size_t>(id)][0]; }
    const Twin& twin(Id id) const { return m_at[static_cast<size_t>(id)]; }

   private:
    friend class BufferPlan;
    std::vector<Twin> m_at;
  };
  // Allocates every enabled buffer with b.alloc in declaration order (copies: "<name> (ping)",
  // "<name> (pong)"); CompileError from alloc if the tile does not fit.
  Placed allocate(KernelBuilder& b, int64_t units) const;

 private:
  struct Decl {
    std::string name;
    SizeFn bytes;
    int copies = 1;
    bool enabled = true;
    uint64_t period = 0, offset = 0;  // place(); period 0: anywhere
  };
  // Bytes of padding before a copy of d laid out from `used` (aligned to `alignment`).
  static uint64_t padding(const Decl& d, uint64_t used, uint64_t alignment);
  Id push(Decl d);
  isa::Buf m_buf;
  std::vector<Decl> m_decls;
};

}  // namespace npusim::compiler
