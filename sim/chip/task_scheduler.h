// The chip's task scheduler: hands the blocks 0..block_dim-1 of a launch to workers in order.
// A worker is one core, or for a mix kernel one cube core with its vector cores (all members
// run the same block). Initially worker i gets block i; a worker whose members have all
// finished takes the next block, so block_dim may exceed the number of workers. Workers that
// become free together (in the same delta cycle) take the next blocks in worker order.
// Task overheads (ChipConfig task_*): a block handed out starts block_start later, the first
// blocks dispatch + block_start after the launch begins. Blocks due at the same time start in
// the order they were handed out, in one delta cycle (start_due), as blocks handed out without
// a delay do: the overheads shift a launch's blocks in time and change nothing else.
// A launch of a concurrent group that takes its cores when ready (Chip::begin_concurrent) may
// gain workers while it runs (add_worker: cores another launch freed), and gives up a worker
// that is free when no block is left to hand out (release_idle_workers): its cores go back to
// the chip for other launches.
#pragma once

#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "sim/core/ai_core.h"

namespace npusim {

class TaskScheduler {
 public:
  struct Member {
    AiCore* core = nullptr;
    const SectionRun* run = nullptr;
    int subblock = 0;  // get_subblock_id
  };
  struct Worker {
    std::vector<Member> members;
    int pending = 0;  // members still running the current block
    int block = -1;
    int blocks_run = 0;  // blocks handed to this worker in the launch
    bool released = false;  // given back to the chip (release_idle_workers): takes no block
  };

  // Starts a launch: dispatches blocks to the workers in order; they start after `dispatch`
  // plus `block_start`, a block handed out later after `block_start`. `num_cores` bounds the
  // cores' chip indices.
  void start(std::vector<Worker> workers, int block_dim, int num_cores,
             const sc_core::sc_time& dispatch, const sc_core::sc_time& block_start);
  // Starts the blocks handed out whose start time has come, in the order they were handed out.
  void start_due();
  // When the next block handed out but not started is due, if any.
  std::optional<sc_core::sc_time> next_start() const;
  // A member core finished its block. Returns true if that freed its worker (then call
  // dispatch_free() once the other cores finishing at the same instant have reported too).
  bool core_done(AiCore& core);
  // Hands the next blocks to the free workers, in worker order.
  void dispatch_free();
  // A worker joins the running launch (cores another launch freed) and is handed the next
  // block, which starts after `block_start`. Returns its index in workers().
  size_t add_worker(Worker w, const sc_core::sc_time& block_start);
  // Blocks not yet handed to a worker.
  int blocks_left() const { return m_block_dim - m_next; }
  // Workers neither running a block nor released (they take the next blocks at dispatch_free).
  int idle_workers() const;
  // Marks released every idle worker if no block is left to hand out, and returns their
  // indices in workers() (none while blocks are left: a worker's next block is the launch's).
  std::vector<size_t> release_idle_workers();
  bool all_done() const { return m_done == m_block_dim; }
  int blocks_done() const { return m_done; }
  const std::vector<Worker>& workers() const { return m_workers; }
  // The worker a core belongs to in this launch, or nullptr.
  const Worker* worker_of(const AiCore& core) const;
  void clear();

 private:
  void dispatch(Worker& w, const sc_core::sc_time& delay);
  void assign(const Worker& w);
  std::vector<Worker> m_workers;
  sc_core::sc_time m_block_start;
  // Handed out, due at, in order: (time, index in m_workers; add_worker may move the workers).
  std::deque<std::pair<sc_core::sc_time, size_t>> m_starts;
  std::vector<int> m_worker_of_core;  // by chip index, -1 if not in the launch
  int m_next = 0, m_done = 0, m_block_dim = 0;
};

}  // namespace npusim
