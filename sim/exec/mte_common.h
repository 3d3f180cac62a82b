// Operand access and checks shared by the MTE, cube and FIXPIPE instruction families: reading
// named operands with their range, and the checks every plan() makes (buffer present, data path
// present, alignment, bounds) with faults that name the instruction, operand and range.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "sim/exec/exec.h"

namespace npusim::mte {

// Named operands of one issued instruction. Field names are the ones in isa/isa.def, passed as
// string literals: a name's field index is looked up once per opcode and thread, then found by
// the literal's address (every plan() and execute() reads its operands by name).
class Operands {
 public:
  explicit Operands(const IssuedOp& op);
  const char* mnemonic() const { return m_desc.mnemonic; }
  // The operand's raw value (register contents or immediate).
  int64_t raw(const char* name) const;
  // A byte address (register contents reinterpreted as unsigned).
  uint64_t addr(const char* name) const { return static_cast<uint64_t>(raw(name)); }
  // A count or size in [min, the field's immediate maximum]; a register operand holding a value
  // the field could not encode faults like an immediate would.
  uint64_t count(const char* name, uint64_t min) const;
  isa::Dtype dtype(const char* name) const;
  isa::Buf buf(const char* name) const;
  // The L2 policy (field "l2"); NORMAL for an instruction without one.
  isa::L2Hint l2_hint() const;
  // Throws KernelFault "<mnemonic>: <what>".
  [[noreturn]] void fault(const std::string& what) const;

 private:
  struct CachedField {
    const char* name = nullptr;  // the address of the name the caller passed
    int index = -1;
  };
  int index(const char* name) const;
  int lookup(const char* name) const;
  const IssuedOp& m_op;
  const isa::InstrDesc& m_desc;
  CachedField* m_cache;  // this opcode's row of the thread's lookup cache, kMaxFields entries
};

// Faults unless the chip has the data path src->dst ("no data path l0c->ub on chip X").
void require_path(const Operands& o, const ChipConfig& cfg, isa::Buf src, isa::Buf dst);

// Faults unless the core has buffer b, addr meets cfg.align_bytes[b] and [addr, addr+bytes) lies
// inside the buffer. `operand` names the address operand in the message.
void check_local(const Operands& o, const ExecContext& ctx, const char* operand, isa::Buf b,
                 uint64_t addr, uint64_t bytes);

// Faults unless addr meets cfg.align_bytes[GM] and [addr, addr+bytes) lies in device memory.
void check_gm(const Operands& o, const ExecContext& ctx, const char* operand, uint64_t addr,
              uint64_t bytes);

// check_local or check_gm according to b.
void check_range(const Operands& o, const ExecContext& ctx, const char* operand, isa::Buf b,
                 uint64_t addr, uint64_t bytes);

// Appends a GM range, merging it into the previous one when contiguous and of the same direction
// and L2 policy.
void add_gm_range(std::vector<GmAccess>& gm, uint64_t addr, uint64_t bytes, bool write,
                  isa::L2Hint l2 = isa::L2Hint::NORMAL);

// GM bursts: the DMA cuts each contiguous GM run into bursts of at most kGmBurstBytes that never
// cross a kGmBurstBytes boundary (the reference's GM transfers are split into 128/256/512-byte
// bursts; a burst is taken not to straddle a 512-byte-aligned block, as the 910b's 512-byte L2
// line is filled whole: one burst one line). gm_bursts counts them over an instruction's ranges
// (add_gm_range has merged the contiguous ones): a run [a, a + n) makes
// floor((a + n - 1) / 512) - floor(a / 512) + 1.
constexpr uint64_t kGmBurstBytes = 512;
uint64_t gm_bursts(const std::vector<GmAccess>& gm);

// The pipe's minimum cycles for a GM <-> UB / L1 copy whose GM ranges are `gm`:
// cfg.copy_issue_cycles + cfg.burst_cycles x gm_bursts(gm) (ExecCost::gm_issue_cycles); 0 when
// the chip sets neither key.
double issue_cycles(const ChipConfig& cfg, const std::vector<GmAccess>& gm);

// Cost of moving `bytes` over the path src->dst (contract in exec.h):
//   a path touching GM: cycles = path_latency (fixed start latency); the GM ranges are timed by
//     the memory system at up to gm_core_rate = path_rate bytes per cycle (the caller fills gm);
//   a local path: cycles = path_latency + ceil(bytes / path_rate).
ExecCost path_cost(const ChipConfig& cfg, isa::Buf src, isa::Buf dst, uint64_t bytes);

// One 32-byte block (isa/layout.h kBlockBytes) at dst: the first `bytes` (< 32) bytes of src,
// then zeros; src is read only there. The partial C0 block of a channel count that is not a
// multiple of C0 (an image's 3 channels): a memcpy and a memset of variable size are two library
// calls per 32 bytes, so the block is zeroed with one fixed-size store and the bytes copied in
// pieces of fixed size (each a move) on top.
inline void copy_block_prefix(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  std::memset(dst, 0, 32);
  uint64_t at = 0;
  if (bytes & 16) std::memcpy(dst + at, src + at, 16), at += 16;
  if (bytes & 8) std::memcpy(dst + at, src + at, 8), at += 8;
  if (bytes & 4) std::memcpy(dst + at, src + at, 4), at += 4;
  if (bytes & 2) std::memcpy(dst + at, src + at, 2), at += 2;
  if (bytes & 1) dst[at] = src[at];
}

// Copies n bytes between any two of GM / the core's local buffers.
void copy_bytes(ExecContext& ctx, isa::Buf src, uint64_t src_addr, isa::Buf dst,
                uint64_t dst_addr, uint64_t n);
// Reads n bytes from GM or a local buffer into out / writes them from in.
void read_bytes(ExecContext& ctx, isa::Buf b, uint64_t addr, void* out, uint64_t n);
void write_bytes(ExecContext& ctx, isa::Buf b, uint64_t addr, const void* in, uint64_t n);

}  // namespace npusim::mte
