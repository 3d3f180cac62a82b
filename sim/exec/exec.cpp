// Dispatch of plan()/execute() to the instruction families, and the core's local buffers.
#include "sim/exec/exec.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {

CoreMemory::CoreMemory(const CoreKindConfig& kind) {
  for (const auto& [buf, bytes] : kind.buffer_bytes) m_bufs[static_cast<int>(buf)].resize(bytes);
}

uint8_t* CoreMemory::at(isa::Buf b, uint64_t addr, uint64_t n) {
  auto& v = m_bufs[static_cast<int>(b)];
  if (v.empty())
    throw KernelFault(fmt::format("this core has no {} buffer", isa::buf_name(b)));
  if (n > v.size() || addr > v.size() - n)
    throw KernelFault(fmt::format("{} access [{:#x}, {:#x}) is outside the buffer of {} bytes",
                                  isa::buf_name(b), addr, addr + n, v.size()));
  return v.data() + addr;
}

void CoreMemory::clear() {
  for (auto& v : m_bufs) std::fill(v.begin(), v.end(), 0);
}

ExecCost plan(const IssuedOp& op, const ExecContext& ctx) {
  switch (op.insn->desc().pipe) {
    case isa::Pipe::V: return plan_vector(op, ctx);
    case isa::Pipe::M: return plan_cube(op, ctx);
    case isa::Pipe::MTE1: case isa::Pipe::MTE2: case isa::Pipe::MTE3: case isa::Pipe::FIX:
      return plan_mte(op, ctx);
    default:
      throw KernelFault(fmt::format("{} is not a pipe instruction", op.insn->desc().mnemonic));
  }
}

void execute(const IssuedOp& op, ExecContext& ctx) {
  switch (op.insn->desc().pipe) {
    case isa::Pipe::V: return execute_vector(op, ctx);
    case isa::Pipe::M: return execute_cube(op, ctx);
    case isa::Pipe::MTE1: case isa::Pipe::MTE2: case isa::Pipe::MTE3: case isa::Pipe::FIX:
      return execute_mte(op, ctx);
    default:
      throw KernelFault(fmt::format("{} is not a pipe instruction", op.insn->desc().mnemonic));
  }
}

}  // namespace npusim
