// Integer semantics of the scalar unit's arithmetic and branch instructions (isa.def, section
// "scalar unit"). Registers are 64-bit two's complement. Used by the core model and by the
// verifier's constant propagation, so both fold arithmetic the same way.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "isa/isa.h"

namespace npusim {

namespace scalar_alu_detail {
// The fault paths, out of line so the inline hot paths (run for every scalar instruction) need
// no stack frame for building a message.
[[noreturn]] __attribute__((noinline, cold)) void fault_not(isa::Opcode op, const char* what);
[[noreturn]] __attribute__((noinline, cold)) void fault_division_by_zero();
}  // namespace scalar_alu_detail

// True for the opcodes scalar_alu handles / branch_taken handles.
inline bool is_scalar_alu(isa::Opcode op) {
  using isa::Opcode;
  switch (op) {
    case Opcode::op_add: case Opcode::op_sub: case Opcode::op_mul: case Opcode::op_div:
    case Opcode::op_rem: case Opcode::op_and: case Opcode::op_or: case Opcode::op_xor:
    case Opcode::op_shl: case Opcode::op_shr: case Opcode::op_min: case Opcode::op_max:
      return true;
    default:
      return false;
  }
}

inline bool is_conditional_branch(isa::Opcode op) {
  using isa::Opcode;
  return op == Opcode::op_beq || op == Opcode::op_bne || op == Opcode::op_blt ||
         op == Opcode::op_bge;
}

// Result of add/sub/mul/div/rem/and/or/xor/shl/shr/min/max on a, b:
//   add/sub/mul wrap modulo 2^64; div/rem are signed and truncate toward zero (b == 0 faults;
//   INT64_MIN / -1 wraps to INT64_MIN, remainder 0); shl/shr shift by b (shr is logical: zeros
//   enter from the left); a shift by b outside [0, 63] gives 0; min/max are signed.
// Throws KernelFault "division by zero" for div/rem with b == 0. Inline: the scalar unit runs
// it for most of the instructions a kernel executes.
inline int64_t scalar_alu(isa::Opcode op, int64_t a, int64_t b) {
  using isa::Opcode;
  const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  switch (op) {
    case Opcode::op_add: return static_cast<int64_t>(ua + ub);
    case Opcode::op_sub: return static_cast<int64_t>(ua - ub);
    case Opcode::op_mul: return static_cast<int64_t>(ua * ub);
    case Opcode::op_div:
    case Opcode::op_rem: {
      if (b == 0) scalar_alu_detail::fault_division_by_zero();
      if (a == std::numeric_limits<int64_t>::min() && b == -1) return op == Opcode::op_div ? a : 0;
      return op == Opcode::op_div ? a / b : a % b;
    }
    case Opcode::op_and: return a & b;
    case Opcode::op_or: return a | b;
    case Opcode::op_xor: return a ^ b;
    case Opcode::op_shl: return b < 0 || b > 63 ? 0 : static_cast<int64_t>(ua << b);
    case Opcode::op_shr: return b < 0 || b > 63 ? 0 : static_cast<int64_t>(ua >> b);
    case Opcode::op_min: return std::min(a, b);
    case Opcode::op_max: return std::max(a, b);
    default:
      scalar_alu_detail::fault_not(op, "a scalar ALU instruction");
  }
}

// Whether beq/bne/blt/bge branches for operands a, b (signed comparison).
inline bool branch_taken(isa::Opcode op, int64_t a, int64_t b) {
  using isa::Opcode;
  switch (op) {
    case Opcode::op_beq: return a == b;
    case Opcode::op_bne: return a != b;
    case Opcode::op_blt: return a < b;
    case Opcode::op_bge: return a >= b;
    default:
      scalar_alu_detail::fault_not(op, "a conditional branch");
  }
}

}  // namespace npusim
