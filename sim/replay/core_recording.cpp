#include "sim/replay/core_recording.h"

namespace npusim {

void CoreRecording::on_scalar_gm(uint32_t pc, const GmAccess& access) {
  m_exec_order.push_back(static_cast<uint8_t>(isa::Pipe::S));
  m_gm_ops.push_back({pc, static_cast<uint32_t>(m_gm_accesses.size())});
  m_gm_accesses.push_back(access);
  m_env.recorded(1 + sizeof(GmAccess) + sizeof(GmOp));  // last: it may drop this record
}

void CoreRecording::on_pipe_op(isa::Pipe pipe, uint32_t pc, const ExecCost& cost) {
  m_exec_order.push_back(static_cast<uint8_t>(pipe));
  if (!cost.gm.empty()) m_gm_ops.push_back({pc, static_cast<uint32_t>(m_gm_accesses.size())});
  m_gm_accesses.insert(m_gm_accesses.end(), cost.gm.begin(), cost.gm.end());
  m_fingerprint.add_cost(pc, cost);
  // The effect order, the GM ranges and the memory system's transfer order entry; last: it may
  // drop this record.
  m_env.recorded(1 + cost.gm.size() * sizeof(GmAccess) +
                 (cost.gm.empty() ? 0 : sizeof(uint16_t) + sizeof(GmOp)));
}

void CoreRecording::on_gm_transfer(isa::Pipe pipe) {
  m_transfer_pipes.push_back(static_cast<uint8_t>(pipe));
  m_env.recorded(1);  // last: it may drop this record
}

void CoreRecording::drop() {
  std::vector<uint8_t>().swap(m_exec_order);
  std::vector<GmAccess>().swap(m_gm_accesses);
  std::vector<GmOp>().swap(m_gm_ops);
  std::vector<uint8_t>().swap(m_transfer_pipes);
}

}  // namespace npusim
