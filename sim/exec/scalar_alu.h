// Integer semantics of the scalar unit's arithmetic and branch instructions (isa.def, section
// "scalar unit"). Registers are 64-bit two's complement. Used by the core model and by the
// verifier's constant propagation, so both fold arithmetic the same way.
#pragma once

#include <cstdint>

#include "isa/isa.h"

namespace npusim {

// Result of add/sub/mul/div/rem/and/or/xor/shl/shr/min/max on a, b:
//   add/sub/mul wrap modulo 2^64; div/rem are signed and truncate toward zero (b == 0 faults;
//   INT64_MIN / -1 wraps to INT64_MIN, remainder 0); shl/shr shift by b (shr is logical: zeros
//   enter from the left); a shift by b outside [0, 63] gives 0; min/max are signed.
// Throws KernelFault "division by zero" for div/rem with b == 0.
int64_t scalar_alu(isa::Opcode op, int64_t a, int64_t b);

// Whether beq/bne/blt/bge branches for operands a, b (signed comparison).
bool branch_taken(isa::Opcode op, int64_t a, int64_t b);

// True for the opcodes scalar_alu handles / branch_taken handles.
bool is_scalar_alu(isa::Opcode op);
bool is_conditional_branch(isa::Opcode op);

}  // namespace npusim
