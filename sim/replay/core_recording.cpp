#include "sim/replay/core_recording.h"

#include <algorithm>

namespace npusim {

uint64_t CoreRecording::note(uint32_t pc, const GmAccess& access) {
  if (pc >= m_spans.size()) m_spans.resize(pc + 1);
  Span& s = m_spans[pc];
  s.begin = std::min(s.begin, access.addr);
  s.end = std::max(s.end, access.addr + access.bytes);
  if (m_lean && !access.write) return 0;
  // A lean recording joins a write that continues the previous one of the same instruction.
  if (m_lean && !m_gm_ops.empty() && m_gm_ops.back().pc == pc &&
      m_gm_ops.back().first + 1 == m_gm_accesses.size() &&
      m_gm_accesses.back().addr + m_gm_accesses.back().bytes == access.addr) {
    m_gm_accesses.back().bytes += access.bytes;
    return 0;
  }
  m_gm_ops.push_back({pc, static_cast<uint32_t>(m_gm_accesses.size())});
  m_gm_accesses.push_back(access);
  return sizeof(GmAccess) + sizeof(GmOp);
}

uint64_t CoreRecording::took_effect(isa::Pipe pipe) {
  m_exec_order.push_back(static_cast<uint8_t>(pipe));
  if (!m_effects) return 1;
  m_effects->push_back(m_core);
  return 1 + sizeof(uint16_t);
}

void CoreRecording::on_scalar_gm(uint32_t pc, const GmAccess& access) {
  uint64_t bytes = note(pc, access);
  if (!access.write) {
    Load* last = m_loads.empty() ? nullptr : &m_loads.back();
    if (last && last->pc == pc && access.addr >= last->addr &&
        access.addr <= last->addr + last->bytes) {
      last->bytes = std::max(last->bytes, access.addr + access.bytes - last->addr);
    } else {
      m_loads.push_back({pc, access.addr, access.bytes});
      bytes += sizeof(Load);
    }
  }
  if (!m_lean) bytes += took_effect(isa::Pipe::S);
  m_env.recorded(bytes);  // last: it may drop this record
}

void CoreRecording::on_pipe_op(isa::Pipe pipe, uint32_t pc, const ExecCost& cost) {
  uint64_t bytes = 0;
  if (m_lean) {
    for (const GmAccess& a : cost.gm) bytes += note(pc, a);
    if (bytes) m_env.recorded(bytes);  // last: it may drop this record
    return;
  }
  const uint64_t order_bytes = took_effect(pipe);
  if (!cost.gm.empty()) {
    m_gm_ops.push_back({pc, static_cast<uint32_t>(m_gm_accesses.size())});
    if (pc >= m_spans.size()) m_spans.resize(pc + 1);
    Span& s = m_spans[pc];
    for (const GmAccess& a : cost.gm) {
      s.begin = std::min(s.begin, a.addr);
      s.end = std::max(s.end, a.addr + a.bytes);
    }
  }
  m_gm_accesses.insert(m_gm_accesses.end(), cost.gm.begin(), cost.gm.end());
  m_fingerprint.add_cost(pc, cost);
  // The effect order, the GM ranges and the memory system's transfer order entry; last: it may
  // drop this record.
  m_env.recorded(order_bytes + cost.gm.size() * sizeof(GmAccess) +
                 (cost.gm.empty() ? 0 : sizeof(uint16_t) + sizeof(GmOp)));
}

void CoreRecording::on_gm_transfer(isa::Pipe pipe) {
  if (m_lean) return;
  m_transfer_pipes.push_back(static_cast<uint8_t>(pipe));
  m_env.recorded(1);  // last: it may drop this record
}

void CoreRecording::drop() {
  std::vector<uint8_t>().swap(m_exec_order);
  std::vector<GmAccess>().swap(m_gm_accesses);
  std::vector<GmOp>().swap(m_gm_ops);
  std::vector<Load>().swap(m_loads);
  std::vector<uint8_t>().swap(m_transfer_pipes);
  std::vector<Span>().swap(m_spans);
}

}  // namespace npusim
