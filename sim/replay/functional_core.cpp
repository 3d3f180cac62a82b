#include "sim/replay/functional_core.h"

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {

using isa::Opcode;
using isa::Pipe;

namespace {
constexpr size_t kQueueReserve = 64;
// Pipe instructions that only order time: never in the recorded order, skipped here.
bool is_sync(Opcode op) {
  return op == Opcode::op_set_flag || op == Opcode::op_wait_flag || op == Opcode::op_cc_set ||
         op == Opcode::op_cc_wait;
}

// A scalar st as a kept effect: its 8 bytes, written again.
class PreparedStore final : public PreparedOp {
 public:
  PreparedStore(uint64_t addr, int64_t value) : m_addr(addr), m_value(value) {}
  void run(ExecContext& ctx) const override { ctx.gm.write(m_addr, &m_value, 8); }
  uint64_t bytes() const override { return sizeof(*this); }

 private:
  uint64_t m_addr;
  int64_t m_value;
};
}  // namespace

FunctionalCore::FunctionalCore(const ChipConfig& cfg, const CoreKindConfig& kind,
                               CoreMemory& local, DeviceMemory& gm,
                               const std::vector<uint8_t>& order, bool functional, Mode mode,
                               Queues* queues)
    : m_ctx{cfg, kind, local, gm},
      m_order(order),
      m_functional(functional),
      m_verify(mode == Mode::verify),
      m_issue(mode == Mode::issue),
      m_queues(queues ? *queues : m_own_queues) {
  // A pipe's queue holds the instructions the scalar unit issued ahead of the recorded order:
  // rarely more than a few dozen; reserved so that they do not grow by reallocation.
  for (Queue& q : m_queues) {
    q.ops.clear();
    q.head = 0;
    if (q.ops.capacity() < kQueueReserve) q.ops.reserve(kQueueReserve);
  }
}

void FunctionalCore::take_effect(const IssuedOp& op) {
  m_pc = op.pc;
  if (m_issue) {
    if (!m_issued) throw Error("FunctionalCore: issue mode without keep_issued");
    if (op.op() == Opcode::op_ld)
      throw KernelFault("replay: an ld cannot be replayed in the order of effects across cores");
    m_issued->ops.push_back(op);
    m_issued->where.push_back({m_run, op.pc});
    return;
  }
  if (op.op() == Opcode::op_ld) {  // at its recorded place among the effects
    m_keep_failed = true;
    const uint64_t addr = static_cast<uint64_t>(op[1]);
    if (!m_ctx.gm.in_bounds(addr, 8))
      throw KernelFault(fmt::format("GM access [{:#x}, {:#x}) is outside device memory of {} "
                                    "bytes", addr, addr + 8, m_ctx.gm.capacity()));
    if (m_verify) m_loads.push_back({addr, 8, false});
    m_ctx.gm.read(addr, &m_loaded, 8);  // in timing-only runs too (as AiCore)
    return;
  }
  if (m_verify) {
    if (op.op() == Opcode::op_st) {
      m_stores.push_back({static_cast<uint64_t>(op[1]), 8, true});
    } else {
      const ExecCost cost = plan(op, m_ctx);
      if (!cost.gm.empty()) {
        m_ranges.insert(m_ranges.end(), cost.gm.begin(), cost.gm.end());
        m_sizes.push_back(static_cast<uint32_t>(cost.gm.size()));
        m_pipes.push_back(m_order[m_next]);
      }
      m_fingerprint.add_cost(op.pc, cost);
    }
    if (m_issued) {  // planned: execute() may take it
      m_issued->ops.push_back(op);
      m_issued->where.push_back({m_run, op.pc});
    }
    return;
  }
  if (!m_functional) {
    if (op.op() == Opcode::op_st) m_ctx.gm.invalidate(static_cast<uint64_t>(op[1]), 8);
    else invalidate_gm_writes(plan(op, m_ctx), m_ctx.gm);
    return;
  }
  if (!m_keep) {
    if (op.op() == Opcode::op_st) {
      const int64_t v = op[0];
      m_ctx.gm.write(static_cast<uint64_t>(op[1]), &v, 8);
    } else {
      execute(op, m_ctx);
    }
    return;
  }
  keep_effect(op, m_ctx, {m_run, op.pc}, m_keep);
}

void keep_effect(const IssuedOp& op, ExecContext& ctx, PreparedEffects::Where where,
                 PreparedEffects* out) {
  std::unique_ptr<PreparedOp> p;
  if (op.op() == Opcode::op_st)
    p = std::make_unique<PreparedStore>(static_cast<uint64_t>(op[1]), op[0]);
  else
    p = prepare(op, ctx);
  p->run(ctx);
  out->bytes += p->bytes() + sizeof(p) + sizeof(PreparedEffects::Where);
  out->ops.push_back(std::move(p));
  out->where.push_back(where);
}

void run_issued(const IssuedEffects& effects, ExecContext& ctx, size_t* at) {
  for (*at = 0; *at < effects.ops.size(); ++*at) {
    const IssuedOp& op = effects.ops[*at];
    if (op.op() == Opcode::op_st) {
      const int64_t v = op[0];
      ctx.gm.write(static_cast<uint64_t>(op[1]), &v, 8);
    } else {
      execute(op, ctx);
    }
  }
}

void FunctionalCore::execute_ready() {
  while (m_next < m_order.size()) {
    Queue& q = m_queues[m_order[m_next]];
    while (!q.empty() && is_sync(q.ops[q.head].op())) ++q.head;
    if (q.empty()) break;  // the scalar unit has not issued it yet
    take_effect(q.ops[q.head++]);
    ++m_next;
    if (q.empty()) {  // keep the queue as short as the timed run's
      q.ops.clear();
      q.head = 0;
    }
  }
}

void FunctionalCore::run_block(const SectionRun& run, const BlockIdentity& id) {
  m_run = &run;
  m_scalar.reset();
  for (Queue& q : m_queues) {
    q.ops.clear();
    q.head = 0;
  }
  const auto& code = run.section->code;
  uint32_t pc = 0;
  for (;;) {
    m_pc = pc;
    if (pc >= code.size() || !run.decoded[pc].legal)
      throw KernelFault(fmt::format("replay: pc {} is not a legal instruction of the recorded "
                                    "run", pc));
    const DecodedInsn& d = run.decoded[pc];
    const isa::Instruction& in = code[pc];
    m_scalar.reg_fields = d.reg_fields;
    if (m_verify) m_fingerprint.add_pc(pc);
    if (d.pipe != Pipe::S) {
      m_queues[static_cast<size_t>(d.pipe)].ops.push_back(m_scalar.issued(in, pc));
      execute_ready();
      ++pc;
      continue;
    }
    const uint32_t next = exec_scalar_local(m_scalar, in, pc, code.size(), id);
    if (next != kNotLocal) {
      pc = next;
      continue;
    }
    switch (in.op) {
      case Opcode::op_end:
        execute_ready();
        for (size_t p = 0; p < m_queues.size(); ++p) {
          Queue& q = m_queues[p];
          while (!q.empty() && is_sync(q.ops[q.head].op())) ++q.head;
          if (!q.empty())
            throw KernelFault(fmt::format("replay: pipe {} has {} instruction(s) the recorded "
                                          "run did not execute in this block",
                                          isa::pipe_name(Pipe(p)), q.ops.size() - q.head));
        }
        return;
      case Opcode::op_st:
        m_queues[static_cast<size_t>(Pipe::S)].ops.push_back(m_scalar.issued(in, pc));
        execute_ready();
        break;
      case Opcode::op_ld: {
        // The value is needed now: every effect recorded before the load has been issued (the
        // scalar unit issues in program order), so the load is taken here.
        Queue& s = m_queues[static_cast<size_t>(Pipe::S)];
        s.ops.push_back(m_scalar.issued(in, pc));
        execute_ready();
        if (!s.empty())
          throw KernelFault("replay: an ld is not where the recorded order has it");
        m_scalar.regs[static_cast<size_t>(in.ops[0].value)] = m_loaded;
        break;
      }
      case Opcode::op_set_flag:
      case Opcode::op_wait_flag:
      case Opcode::op_pipe_barrier:
      case Opcode::op_cc_set:  // the recorded order of effects across the cores holds them
      case Opcode::op_cc_wait:
        break;  // order only time
      default:
        throw KernelFault(fmt::format("replay: {} cannot be replayed",
                                      in.desc().mnemonic));
    }
    ++pc;
  }
}

}  // namespace npusim
