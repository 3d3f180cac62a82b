// A V instruction decoded from an IssuedOp: operand geometry in the UB, data types, repeats and
// lane masks, checked against the chip config; plus the vector unit's cost model. Shared by
// plan_vector() (checks and cost) and execute_vector() (functional effect) in vector.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "common/convert.h"
#include "isa/isa.h"
#include "isa/layout.h"
#include "sim/config/chip_config.h"
#include "sim/exec/exec.h"
#include "sim/exec/vector_ops.h"

namespace npusim::vec {

// The vector geometry fixed by the ISA (kBlockBytes, kRepeatBytes, kMaskLanes, ...) is in
// isa/layout.h.

// Lanes of one repeat: bit i of (hi:lo) is lane i.
struct Lanes {
  uint64_t lo = 0, hi = 0;
  bool test(int lane) const { return ((lane < 64 ? lo >> lane : hi >> (lane - 64)) & 1u) != 0; }
  void set(int lane) { (lane < 64 ? lo : hi) |= uint64_t{1} << (lane & 63); }
  // True if lanes [first, first + n) are all set.
  bool all(int first, int n) const;
  bool none() const { return lo == 0 && hi == 0; }
  int count() const;
};

// One UB operand. Strided operands (element-wise data): lane i of repeat r is at
//   addr + r*rep_bytes + (i / epb)*blk_bytes + (i % epb)*elem_size,  epb = 32 / elem_size,
// and a repeat touches bytes_per_repeat / 32 blocks. Dense operands (vcmp result bits, vsel
// selector bits, reduction results): repeat r covers bytes_per_repeat bytes at
// addr + r*bytes_per_repeat.
struct VecOperand {
  const char* field = "";  // address field name in isa.def, for messages
  uint64_t addr = 0;       // UB byte address
  uint64_t blk_bytes = 0;  // block stride in bytes (strided only)
  uint64_t rep_bytes = 0;  // repeat stride in bytes
  int elem_size = 0;       // bytes per element (strided only)
  int bytes_per_repeat = 0;
  bool dense = false;
  bool write = false;
  int blocks_per_repeat() const { return dense ? 0 : bytes_per_repeat / kBlockBytes; }
  // Byte address of lane `lane` of repeat r (strided only).
  uint64_t lane_addr(uint64_t r, int lane) const {
    int epb = kBlockBytes / elem_size;
    return addr + r * rep_bytes + static_cast<uint64_t>(lane / epb) * blk_bytes +
           static_cast<uint64_t>(lane % epb) * elem_size;
  }
};

// Operand slots, in this order when present: dst, src0, src1, sel (the families use a prefix).
enum Slot : int { kDst = 0, kSrc0 = 1, kSrc1 = 2, kSel = 3 };

struct VecInsn {
  isa::Opcode op = isa::Opcode::op_nop;
  const char* mnemonic = "";
  Family family = Family::kBinary;
  CostClass cost = CostClass::kElementwise;
  isa::Dtype type = isa::Dtype::NONE;      // element type; vconv, vaddreluconv: the destination
  isa::Dtype src_type = isa::Dtype::NONE;  // vconv, vaddreluconv: the sources'; else == type
  isa::Cmp cmp = isa::Cmp::EQ;             // vcmp
  RoundMode round = RoundMode::kRint;      // vconv
  int64_t scalar = 0;                      // xscalar register value (VSCL, vdup)
  int lanes = 0;                           // lanes per repeat
  uint64_t repeats = 0;
  bool masked = true;                      // false for vtranspose (the mask does not apply)
  VectorMask mask;
  std::array<VecOperand, 4> operand;
  int num_operands = 0;

  // Active lanes of repeat r (normal mask or counter mode; all lanes if !masked).
  Lanes active(uint64_t r) const;
  // Bytes the instruction writes to the UB (active lanes only; vcmp writes whole bit rows).
  uint64_t bytes_written() const;
};

// The chip config key (configs/chips/*.yaml) that a V instruction needs and cfg lacks, or nullptr
// if cfg has what it needs (only vaddreluconv needs one: vector.add_relu_conv).
const char* missing_capability(isa::Opcode op, const ChipConfig& cfg);
// The chip config key that a V instruction taking element type `type` (in any of its type
// fields) needs and cfg lacks, or nullptr: "vector.bf16_arithmetic" for bf16 in an instruction
// that computes on its elements (vec::OpTraits::computes; every V instruction but vconv, vcopy,
// vsel, vdup and vtranspose) where that key is false; "vector.bf16_conversion" for bf16 in vconv
// or vdup where that key is false.
const char* missing_type_capability(isa::Opcode op, isa::Dtype type, const ChipConfig& cfg);
// Why: "chip C has no bf16 arithmetic on the vector unit (KEY is false in FILE); widen to f32
// with vconv", or for vector.bf16_conversion "chip C has no bf16 on the vector unit, no
// conversion either (...)".
std::string missing_type_message(isa::Dtype type, const char* key, const ChipConfig& cfg);
// Decodes and checks operand values, data types and alignment (no buffer access). Throws
// KernelFault naming the instruction and operand on any violation.
VecInsn decode_vector(const IssuedOp& op, const ChipConfig& cfg);
// Checks that every byte the instruction touches is inside the UB (through CoreMemory::at,
// without touching contents). Throws KernelFault naming instruction, operand and range.
void check_vector_bounds(const VecInsn& vi, CoreMemory& local);
// Cycles, bank-conflict cycles, repeats and bytes of the instruction (see vector_insn.cpp).
ExecCost vector_cost(const VecInsn& vi, const ChipConfig& cfg);

}  // namespace npusim::vec
