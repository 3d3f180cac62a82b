// The functional and cost model of every pipe instruction (everything but the scalar unit's own
// instructions, which the core executes itself). This layer has no SystemC in it: the core model
// calls plan() when an instruction reaches the head of its pipe, waits the returned cost
// (timing the GM part through the memory system), then calls execute() unless the run is
// timing-only. plan() depends only on operand values and the config, never on buffer contents,
// so timing-only and functional runs take identical cycles.
#pragma once

#include <array>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <utility>
#include <vector>

#include "isa/isa.h"
#include "sim/config/chip_config.h"
#include "sim/memory/device_memory.h"

namespace npusim {

// Special registers captured by the scalar unit when it issues an instruction to a pipe.
struct VectorMask {
  uint64_t hi = ~0ull, lo = ~0ull;  // normal mode: lane i enabled if bit i of (hi:lo) is set
  bool counter_mode = false;        // counter mode: the first `count` elements over all repeats
  uint64_t count = 0;
};
struct FMatrix {  // load3d feature map geometry (set_fmatrix)
  int64_t h = 0, w = 0;
  int pad_top = 0, pad_bottom = 0, pad_left = 0, pad_right = 0;
};
struct L3dGeom {  // load3d kernel geometry (set_l3d_geom)
  int kh = 1, kw = 1, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
};

// An instruction as issued: every operand resolved to a value (register contents read at issue).
struct IssuedOp {
  const isa::Instruction* insn = nullptr;
  uint32_t pc = 0;
  std::array<int64_t, isa::kMaxFields> v{};  // operand values, in table order
  VectorMask mask;
  FMatrix fmatrix;
  L3dGeom l3d;
  isa::Opcode op() const { return insn->op; }
  int64_t operator[](int i) const { return v[i]; }
};

// A core's private buffers (L1, L0A, L0B, L0C, UB, BT, FB), sized from its CoreKindConfig.
class CoreMemory {
 public:
  explicit CoreMemory(const CoreKindConfig& kind);
  CoreMemory(const CoreMemory&) = delete;
  CoreMemory& operator=(const CoreMemory&) = delete;
  // Pointer to [addr, addr+n) of buffer b; throws KernelFault naming buffer and range if the
  // core has no such buffer or the range is out of bounds.
  uint8_t* at(isa::Buf b, uint64_t addr, uint64_t n);
  uint64_t capacity(isa::Buf b) const { return m_bufs[static_cast<int>(b)].size; }
  void clear();  // zero all buffers
  // Every buffer's contents, and putting them back (the replay check, sim/replay/).
  std::vector<std::vector<uint8_t>> save() const;
  void restore(const std::vector<std::vector<uint8_t>>& saved);
  // High-water mark of buffer b: the largest end offset (addr + bytes) of any range plan()
  // checked in it (note_access), in functional and timing-only runs alike. The core reports it
  // as a counter and restarts it between launches (reset_high_water).
  void note_access(isa::Buf b, uint64_t end) {
    uint64_t& h = m_high_water[static_cast<int>(b)];
    if (end > h) h = end;
  }
  uint64_t high_water(isa::Buf b) const { return m_high_water[static_cast<int>(b)]; }
  void reset_high_water() { m_high_water.fill(0); }

 private:
  // All buffers live in one anonymous mapping (zero pages from the host on first touch, so a
  // chip's cores cost no memory writes until a kernel uses them), advised for huge pages where
  // it spans them (img2col and the cube sweep L1/L0 with 4 KiB-page TLB misses otherwise).
  struct Mapping {
    void* base = nullptr;
    uint64_t bytes = 0;
    ~Mapping();
  };
  struct Buffer {
    uint8_t* data = nullptr;
    uint64_t size = 0;
  };
  Mapping m_mapping;
  std::array<Buffer, isa::kNumBufs> m_bufs;
  std::array<uint64_t, isa::kNumBufs> m_high_water{};
};

struct ExecContext {
  const ChipConfig& cfg;
  const CoreKindConfig& core;
  CoreMemory& local;
  DeviceMemory& gm;
};

// One contiguous GM range an instruction reads or writes, with the instruction's L2 policy
// (isa.h L2Hint; the memory system applies it, sim/chip/l2_tags.h).
struct GmAccess {
  uint64_t addr = 0;
  uint64_t bytes = 0;
  bool write = false;
  isa::L2Hint l2 = isa::L2Hint::NORMAL;
};

struct ExecCost {
  // Pipe-busy cycles excluding GM transfer time (for GM instructions: the fixed path latency).
  uint64_t cycles = 0;
  // Part of `cycles` caused by UB bank conflicts.
  uint64_t bank_conflict_cycles = 0;
  // The data path used and the bytes it carried (for counters); src == dst == GM if none.
  isa::Buf path_src = isa::Buf::GM, path_dst = isa::Buf::GM;
  uint64_t bytes = 0;
  // GM ranges touched; the memory system times them (L2/HBM, shared bandwidth) at up to
  // gm_core_rate bytes per cycle (the core's own port rate for this path).
  std::vector<GmAccess> gm;
  double gm_core_rate = 0;
  // Bytes per cycle the instruction's GM request issue allows, from L2 or HBM alike (nd2nz: one
  // row per ChipConfig::nd2nz_row_cycles); 0: no such limit.
  double gm_request_rate = 0;
  // Cycles the pipe spends on the instruction at least, from the DMA's issue of its GM requests
  // (ChipConfig::copy_issue_cycles + burst_cycles per GM burst, mte::issue_cycles); the pipe is
  // held max(this, the memory system's flow time). 0: no such minimum.
  double gm_issue_cycles = 0;
  // Cube work: multiply-accumulates performed (for utilisation), in units of the chip's peak
  // fp16 MAC/cycle-equivalents (an int8 MAC counts 1/2, an fp32 MAC counts divisor).
  uint64_t macs = 0;
  // Vector work: number of repeats executed.
  uint64_t vector_repeats = 0;
};

// Checks the operands (bounds, alignment, legal path and dtype for this chip) and returns the
// cost. Throws KernelFault with a message naming the buffer/operand on any violation.
ExecCost plan(const IssuedOp& op, const ExecContext& ctx);
// Applies the functional effect (bit-accurate). Precondition: plan() succeeded for op.
void execute(const IssuedOp& op, ExecContext& ctx);
// What a timing-only run does instead of execute(): the GM ranges the instruction writes
// (cost.gm, from its plan()) become undefined (DeviceMemory::invalidate), so device memory's
// write epochs move as in a functional run.
void invalidate_gm_writes(const ExecCost& cost, DeviceMemory& gm);

// An instruction decoded and checked once, its functional effect then carried out any number of
// times (a replayed launch, sim/replay/: the same operand values on the same core, every time):
// run(ctx) does exactly what execute(op, ctx) does, without decoding the operands again.
// Precondition of prepare(): plan() succeeded for op on this core (the checks are not repeated
// by run(), so ctx must be the same core's: the same buffers, sizes and chip).
class PreparedOp {
 public:
  virtual ~PreparedOp() = default;
  virtual void run(ExecContext& ctx) const = 0;
  // Host memory this object holds, roughly (for the replay memo's limit).
  virtual uint64_t bytes() const = 0;
};
std::unique_ptr<PreparedOp> prepare(const IssuedOp& op, const ExecContext& ctx);

// A PreparedOp of a family's decoded instruction D (a copyable descriptor with
// `void run(ExecContext&) const`).
template <typename D>
class PreparedDescriptor final : public PreparedOp {
 public:
  explicit PreparedDescriptor(D d) : m_d(std::move(d)) {}
  void run(ExecContext& ctx) const override { m_d.run(ctx); }
  uint64_t bytes() const override { return sizeof(*this); }

 private:
  D m_d;
};

// Families (one file each), dispatched by plan()/execute()/prepare() on the instruction's pipe.
ExecCost plan_vector(const IssuedOp& op, const ExecContext& ctx);
void execute_vector(const IssuedOp& op, ExecContext& ctx);
std::unique_ptr<PreparedOp> prepare_vector(const IssuedOp& op, const ExecContext& ctx);
ExecCost plan_cube(const IssuedOp& op, const ExecContext& ctx);
void execute_cube(const IssuedOp& op, ExecContext& ctx);
std::unique_ptr<PreparedOp> prepare_cube(const IssuedOp& op, const ExecContext& ctx);
ExecCost plan_mte(const IssuedOp& op, const ExecContext& ctx);  // MTE1/2/3 and FIXPIPE
void execute_mte(const IssuedOp& op, ExecContext& ctx);
std::unique_ptr<PreparedOp> prepare_mte(const IssuedOp& op, const ExecContext& ctx);

}  // namespace npusim
