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
  else
    m_starts.emplace_back(sc_core::sc_time_stamp() + delay,
                          static_cast<size_t>(&w - m_workers.data()));
}

void TaskScheduler::assign(const Worker& w) {
  for (const Member& m : w.members) m.core->assign_block(*m.run, w.block, m.subblock);
}

void TaskScheduler::start_due() {
  while (!m_starts.empty() && m_starts.front().first <= sc_core::sc_time_stamp()) {
    assign(m_workers[m_starts.front().second]);
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
    if (w.block < 0 && !w.released) dispatch(w, m_block_start);
  }
}

size_t TaskScheduler::add_worker(Worker w, const sc_core::sc_time& block_start) {
  const size_t wi = m_workers.size();
  for (const Member& m : w.members) {
    const size_t ci = static_cast<size_t>(m.core->chip_index());
    if (ci >= m_worker_of_core.size()) m_worker_of_core.resize(ci + 1, -1);
    m_worker_of_core[ci] = static_cast<int>(wi);
  }
  w.block = -1;
  w.pending = 0;
  w.released = false;
  m_workers.push_back(std::move(w));
  if (m_next < m_block_dim) dispatch(m_workers.back(), block_start);
  return wi;
}

int TaskScheduler::idle_workers() const {
  int n = 0;
  for (const Worker& w : m_workers) n += w.block < 0 && !w.released;
  return n;
}

std::vector<size_t> TaskScheduler::release_idle_workers() {
  std::vector<size_t> out;
  if (m_next < m_block_dim) return out;
  for (size_t i = 0; i < m_workers.size(); ++i) {
    Worker& w = m_workers[i];
    if (w.block >= 0 || w.released) continue;
    w.released = true;
    out.push_back(i);
  }
  return out;
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
