#include "sim/chip/task_scheduler.h"

namespace npusim {

void TaskScheduler::start(std::vector<Worker> workers, int block_dim, int num_cores,
                          const sc_core::sc_time& dispatch, const sc_core::sc_time& block_start) {
  m_workers = std::move(workers);
  m_worker_of_core.assign(static_cast<size_t>(num_cores), -1);
  for (size_t w = 0; w < m_workers.size(); ++w)
    for (const Member& m : m_workers[w].members)
      m_worker_of_core[static_cast<size_t>(m.core->chip_index())] = static_cast<int>(w);
  m_next = m_done = 0;
  m_block_dim = block_dim;
  m_block_start = block_start;
  for (Worker& w : m_workers) {
    if (m_next >= m_block_dim) break;
    this->dispatch(w, dispatch + block_start);
  }
}

void TaskScheduler::dispatch(Worker& w, const sc_core::sc_time& delay) {
  w.block = m_next++;
  ++w.blocks_run;
  w.pending = static_cast<int>(w.members.size());
  if (delay == sc_core::SC_ZERO_TIME) assign(w);
  else m_starts.emplace_back(sc_core::sc_time_stamp() + delay, &w);
}

void TaskScheduler::assign(const Worker& w) {
  for (const Member& m : w.members) m.core->assign_block(*m.run, w.block, m.subblock);
}

void TaskScheduler::start_due() {
  while (!m_starts.empty() && m_starts.front().first <= sc_core::sc_time_stamp()) {
    assign(*m_starts.front().second);
    m_starts.pop_front();
  }
}

std::optional<sc_core::sc_time> TaskScheduler::next_start() const {
  if (m_starts.empty()) return std::nullopt;
  return m_starts.front().first;
}

bool TaskScheduler::core_done(AiCore& core) {
  const int wi = m_worker_of_core[static_cast<size_t>(core.chip_index())];
  if (wi < 0) return false;
  Worker& w = m_workers[static_cast<size_t>(wi)];
  if (--w.pending > 0) return false;
  ++m_done;
  w.block = -1;
  return true;
}

void TaskScheduler::dispatch_free() {
  for (Worker& w : m_workers) {
    if (m_next >= m_block_dim) return;
    if (w.block < 0) dispatch(w, m_block_start);
  }
}

const TaskScheduler::Worker* TaskScheduler::worker_of(const AiCore& core) const {
  const size_t i = static_cast<size_t>(core.chip_index());
  if (i >= m_worker_of_core.size() || m_worker_of_core[i] < 0) return nullptr;
  return &m_workers[static_cast<size_t>(m_worker_of_core[i])];
}

void TaskScheduler::clear() {
  m_workers.clear();
  m_worker_of_core.clear();
  m_starts.clear();
  m_next = m_done = m_block_dim = 0;
}

}  // namespace npusim
