#include "sim/exec/scalar_alu.h"

#include <algorithm>
#include <limits>
#include <string>

#include "common/error.h"

namespace npusim {

using isa::Opcode;

namespace {
// The fault paths, out of line so the hot paths (run for every scalar instruction) need no
// stack frame for building a message.
[[noreturn]] __attribute__((noinline, cold)) void fault_not(Opcode op, const char* what) {
  throw KernelFault(std::string(isa::describe(op).mnemonic) + " is not " + what);
}
[[noreturn]] __attribute__((noinline, cold)) void fault_division_by_zero() {
  throw KernelFault("division by zero");
}
}  // namespace

bool is_scalar_alu(Opcode op) {
  switch (op) {
    case Opcode::op_add: case Opcode::op_sub: case Opcode::op_mul: case Opcode::op_div:
    case Opcode::op_rem: case Opcode::op_and: case Opcode::op_or: case Opcode::op_xor:
    case Opcode::op_shl: case Opcode::op_shr: case Opcode::op_min: case Opcode::op_max:
      return true;
    default:
      return false;
  }
}

bool is_conditional_branch(Opcode op) {
  return op == Opcode::op_beq || op == Opcode::op_bne || op == Opcode::op_blt ||
         op == Opcode::op_bge;
}

int64_t scalar_alu(Opcode op, int64_t a, int64_t b) {
  const uint64_t ua = static_cast<uint64_t>(a), ub = static_cast<uint64_t>(b);
  switch (op) {
    case Opcode::op_add: return static_cast<int64_t>(ua + ub);
    case Opcode::op_sub: return static_cast<int64_t>(ua - ub);
    case Opcode::op_mul: return static_cast<int64_t>(ua * ub);
    case Opcode::op_div:
    case Opcode::op_rem: {
      if (b == 0) fault_division_by_zero();
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
      fault_not(op, "a scalar ALU instruction");
  }
}

bool branch_taken(Opcode op, int64_t a, int64_t b) {
  switch (op) {
    case Opcode::op_beq: return a == b;
    case Opcode::op_bne: return a != b;
    case Opcode::op_blt: return a < b;
    case Opcode::op_bge: return a >= b;
    default:
      fault_not(op, "a conditional branch");
  }
}

}  // namespace npusim
