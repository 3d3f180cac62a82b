// The scalar unit's architectural state (registers and the special registers that ride along
// with every issued pipe instruction) and the instructions that touch nothing else. Shared by
// the timed core model (AiCore) and the untimed replay (sim/replay/functional_core.h), so the
// two execute the scalar instruction set through one piece of code.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "isa/isa.h"
#include "sim/exec/exec.h"

namespace npusim {

// Who the running block is, for ldarg / get_block_id / get_block_num / get_subblock_id /
// get_core_id.
struct BlockIdentity {
  const std::vector<uint64_t>* args = nullptr;  // the launch's arguments
  int block = 0, block_dim = 1, subblock = 0, core_id = 0;
};

struct ScalarState {
  std::array<int64_t, isa::kNumRegs> regs{};
  VectorMask mask;
  FMatrix fmatrix;
  L3dGeom l3d;
  // DecodedInsn::reg_fields of the instruction being executed: bit i set if operand i names a
  // register (else it is an immediate). Set before operand() / exec_local() / issued().
  uint32_t reg_fields = 0;

  // Start of a block: registers zero, masks and geometries at their reset values.
  void reset() { *this = ScalarState{}; }
  // Operand `field` of `in`: the register's value or the immediate.
  int64_t operand(const isa::Instruction& in, int field) const {
    const int64_t v = in.ops[field].value;
    return (reg_fields >> field) & 1u ? regs[static_cast<size_t>(v)] : v;
  }
  // `in` (a pipe instruction at `pc`) as issued now: operands resolved, special registers
  // captured.
  IssuedOp issued(const isa::Instruction& in, uint32_t pc) const;
};

// Returned by exec_scalar_local for an instruction it does not execute.
constexpr uint32_t kNotLocal = UINT32_MAX;

// Executes scalar-unit instruction `in` at `pc` if it only reads and writes scalar state (ALU,
// branches, moves, ldarg, block ids, set_mask*, set_fmatrix, set_l3d_geom) and returns the
// next pc; returns kNotLocal for the others (end, ld/st, flags, cross-core, barriers), which the
// caller executes. `code_size` bounds branch targets. Throws KernelFault on a bad operand.
uint32_t exec_scalar_local(ScalarState& s, const isa::Instruction& in, uint32_t pc,
                           size_t code_size, const BlockIdentity& id);
// Whether exec_scalar_local executes `op` (else it returns kNotLocal for it).
bool is_scalar_local(isa::Opcode op);

}  // namespace npusim
