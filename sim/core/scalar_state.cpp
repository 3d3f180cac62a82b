#include "sim/core/scalar_state.h"

#include <fmt/format.h>

#include "common/error.h"
#include "sim/exec/scalar_alu.h"

namespace npusim {

using isa::Opcode;

IssuedOp ScalarState::issued(const isa::Instruction& in, uint32_t pc) const {
  IssuedOp op;
  op.insn = &in;
  op.pc = pc;
  const size_t nfields = in.desc().fields.size();
  for (size_t i = 0; i < nfields; ++i) op.v[i] = operand(in, static_cast<int>(i));
  op.mask = mask;
  op.fmatrix = fmatrix;
  op.l3d = l3d;
  return op;
}

bool is_scalar_local(Opcode op) {
  if (is_scalar_alu(op) || is_conditional_branch(op)) return true;
  switch (op) {
    case Opcode::op_nop: case Opcode::op_jmp: case Opcode::op_movi: case Opcode::op_mov:
    case Opcode::op_ldarg: case Opcode::op_get_block_id: case Opcode::op_get_block_num:
    case Opcode::op_get_subblock_id: case Opcode::op_get_core_id: case Opcode::op_set_mask:
    case Opcode::op_set_mask_count: case Opcode::op_set_fmatrix: case Opcode::op_set_l3d_geom:
      return true;
    default:
      return false;
  }
}

uint32_t exec_scalar_local(ScalarState& s, const isa::Instruction& in, uint32_t pc,
                           size_t code_size, const BlockIdentity& id) {
  auto dst = [&]() -> int64_t& { return s.regs[static_cast<size_t>(in.ops[0].value)]; };
  auto target = [&](int field) {
    const int64_t t = in.ops[field].value;
    if (t < 0 || static_cast<uint64_t>(t) >= code_size)
      throw KernelFault(fmt::format("branch target {} is outside the section ({} instructions)",
                                    t, code_size));
    return static_cast<uint32_t>(t);
  };
  const Opcode op = in.op;
  if (is_scalar_alu(op)) {
    dst() = scalar_alu(op, s.operand(in, 1), s.operand(in, 2));
    return pc + 1;
  }
  if (is_conditional_branch(op))
    return branch_taken(op, s.operand(in, 0), s.operand(in, 1)) ? target(2) : pc + 1;
  switch (op) {
    case Opcode::op_nop:
      break;
    case Opcode::op_jmp:
      return target(0);
    case Opcode::op_movi:
      dst() = in.ops[1].value;
      break;
    case Opcode::op_mov:
      dst() = s.operand(in, 1);
      break;
    case Opcode::op_ldarg: {
      const auto& args = *id.args;
      const int64_t index = in.ops[1].value;
      if (index < 0 || static_cast<uint64_t>(index) >= args.size())
        throw KernelFault(fmt::format("ldarg index {} out of range: the launch passes {} "
                                      "argument(s)", index, args.size()));
      dst() = static_cast<int64_t>(args[static_cast<size_t>(index)]);
      break;
    }
    case Opcode::op_get_block_id:
      dst() = id.block;
      break;
    case Opcode::op_get_block_num:
      dst() = id.block_dim;
      break;
    case Opcode::op_get_subblock_id:
      dst() = id.subblock;
      break;
    case Opcode::op_get_core_id:
      dst() = id.core_id;
      break;
    case Opcode::op_set_mask:
      s.mask = VectorMask{static_cast<uint64_t>(s.operand(in, 0)),
                          static_cast<uint64_t>(s.operand(in, 1)), false, 0};
      break;
    case Opcode::op_set_mask_count:
      s.mask.counter_mode = true;
      s.mask.count = static_cast<uint64_t>(s.operand(in, 0));
      break;
    case Opcode::op_set_fmatrix:
      s.fmatrix = FMatrix{s.operand(in, 0),
                          s.operand(in, 1),
                          static_cast<int>(in.ops[2].value),
                          static_cast<int>(in.ops[3].value),
                          static_cast<int>(in.ops[4].value),
                          static_cast<int>(in.ops[5].value)};
      break;
    case Opcode::op_set_l3d_geom:
      s.l3d = L3dGeom{static_cast<int>(in.ops[0].value), static_cast<int>(in.ops[1].value),
                      static_cast<int>(in.ops[2].value), static_cast<int>(in.ops[3].value),
                      static_cast<int>(in.ops[4].value), static_cast<int>(in.ops[5].value)};
      break;
    default:
      return kNotLocal;
  }
  return pc + 1;
}

}  // namespace npusim
