// The row skeleton shared by the row-wise vector kernels (ops/reduce.cpp: rows, streamed rows,
// columns; ops/softmax.cpp: resident rows, long rows, streamed rows).
//
// A row kernel cuts a tensor of rows (or of reduction units) into a range per vector core
// (block range), walks that range in GROUPS (a group of super-rows resident in the UB, or a
// group of rows whose elements stream through in chunks) and double-buffers its loads and
// stores (vector_rows.h PingPong). The skeleton (RowKernel) owns the builder, the kernel's
// arguments, the block range, the group loop and the PingPong; an op supplies its buffers as a
// BufferPlan (buffer_plan.h: declared once, fit() picks the tile that the same list then
// allocates) and its per-group computation as callbacks.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "adapter/compiler/buffer_plan.h"
#include "adapter/compiler/compiler.h"
#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/int_math.h"
#include "isa/isa.h"

namespace npusim::compiler::ops {

inline constexpr int64_t kBlock =
    vec::kBlockBytes;                     // bytes of a UB block (vector operand / MTE unit)
inline constexpr int64_t kLaneBytes = 4;  // one lane of the compute type (f32 / s32)

// `bytes` rounded up to whole 32-byte blocks.
inline int64_t rnd(int64_t bytes) { return round_up(bytes, kBlock); }
inline int isz(isa::Dtype t) { return isa::dtype_size(t); }

// BufferPlan sizes: `bytes_per_unit` * units rounded up to whole blocks, and the same for a
// count that does not depend on the tile.
BufferPlan::SizeFn blocks_of(int64_t bytes_per_unit);
BufferPlan::SizeFn fixed_blocks(int64_t bytes);

// Declares, as a plan's last buffer, the bytes past the end of the layout that a vector
// instruction on the last buffer may touch: a buffer is whole 32-byte blocks, an instruction's
// footprint whole 256-byte repeats from the buffer's start (at most 224 bytes more).
void declare_repeat_overhang(BufferPlan& plan);

// Copies the addresses of an allocated plan's buffers (single: `take_buffers`, ping / pong:
// `take_twins`) into the variables they name.
void take_buffers(const BufferPlan::Placed& at,
                  std::initializer_list<std::pair<uint64_t*, BufferPlan::Id>> buffers);
void take_twins(const BufferPlan::Placed& at,
                std::initializer_list<std::pair<Twin*, BufferPlan::Id>> twins);

// The vector cores of a chip: their kind and how many there are.
struct VectorCores {
  isa::CoreKind kind = isa::CoreKind::AICORE;
  int64_t count = 0;
  static VectorCores of(const ChipConfig& cfg);
};

// `units` split over the cores: `per` units per block (a multiple of `step`), block_dim blocks.
struct BlockSplit {
  int64_t per = 0;
  int block_dim = 0;
  static BlockSplit make(int64_t units, int64_t cores, int64_t step = 1);
};

// The registers of one resident group: rows r .. r + rows - 1 as whole super-rows.
struct GroupRegs {
  const Reg& r;       // first row of the group
  const Reg& rows;    // rows in the group (<= G)
  const Reg& supers;  // super-rows covering them
  const Reg& slots;   // supers * g (lane slots, rows rounded up to whole super-rows)
};

// One row kernel on the vector cores: its builder and launch, its arguments, its block range,
// its group loop and its PingPong. Use: arg()... load_args(), allocate(plan, tile), constants,
// start_pingpong(), resident_groups() or streamed_groups() (or block_range() and the PingPong
// directly), finish().
class RowKernel {
 public:
  // Begins the vector section of kernel `name` (for errors: `op`).
  RowKernel(const std::string& name, const std::string& op, const ChipConfig& cfg);

  KernelBuilder& b() { return m_b; }

  // Declares argument `name` (bound to `ref`); load_args() then loads every declared argument
  // in declaration order.
  void arg(const std::string& name, isa::Dtype t, const std::vector<int64_t>& dims, ArgRef ref);
  std::vector<Reg> load_args();

  // The plan's buffers at `units` (the tile its fit() chose).
  BufferPlan::Placed allocate(const BufferPlan& plan, int64_t units);

  // Starts the double buffering: after the buffers and their constants, before the loop.
  PingPong& start_pingpong();
  PingPong& sync() { return *m_sync; }

  // [start, end) = this block's range of units: `per` per block, `total` in all.
  void block_range(const Reg& start, const Reg& end, int64_t per, int64_t total);

  // Resident groups of G rows (a multiple of the super-row's g rows) of this block's range of
  // `split.per` rows of `total`, software-pipelined (PingPong::pipeline): load(grp, q) and
  // compute(grp, q) of group t with copy q = t & 1.
  using GroupFn = std::function<void(const GroupRegs& grp, int q)>;
  void resident_groups(const BlockSplit& split, int64_t total, int64_t G, const SuperRowLayout& L,
                       const GroupFn& load, const GroupFn& compute);

  // Streamed groups of up to G units of this block's range [.., end) of `split.per` units of
  // `total`: body(u0, end, units) once per group (u0 its first unit), in a run-time loop.
  using StreamedFn = std::function<void(const Reg& u0, const Reg& end, const Reg& units)>;
  void streamed_groups(const BlockSplit& split, int64_t total, int64_t G, const StreamedFn& body);

  // Drains the PingPong, ends the section and returns the launch.
  Launch finish(int block_dim, std::string summary);

 private:
  KernelBuilder m_b;
  Launch m_launch;
  std::vector<std::string> m_args;
  std::optional<PingPong> m_sync;
};

}  // namespace npusim::compiler::ops
