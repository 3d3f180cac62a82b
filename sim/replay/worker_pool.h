// A fixed set of host threads that run the iterations of one loop at a time (the launch replay
// runs one AI core per iteration). The calling thread works too, so a pool of size 1 is the
// plain loop and starts no thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace npusim {

class WorkerPool {
 public:
  // threads: how many threads run iterations, the caller's included (at least 1).
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;
  int size() const { return static_cast<int>(m_threads.size()) + 1; }

  // Calls task(i) once for every i in [0, n), spread over the pool's threads, and returns when
  // all calls have returned. task must not throw (catch inside and report through the
  // captures). Not reentrant: one run() at a time.
  void run(size_t n, const std::function<void(size_t)>& task);

 private:
  void worker();
  void work_on_current();  // take iterations of the current loop until none is left

  std::vector<std::thread> m_threads;
  std::mutex m_mutex;
  std::condition_variable m_start, m_done;
  // Incremented per run() (under m_mutex): wakes the workers. Atomic so that an idle worker can
  // watch it for a while before it sleeps (WorkerPool::worker).
  std::atomic<uint64_t> m_generation{0};
  std::atomic<bool> m_stop{false};
  // A loop is running: workers may join it (set and cleared under m_mutex, so a worker that
  // wakes after run() returned cannot take iterations of the next loop's state half-written).
  bool m_open = false;
  const std::function<void(size_t)>* m_task = nullptr;
  size_t m_count = 0;
  std::atomic<size_t> m_next{0};
  std::atomic<int> m_busy{0};  // workers still inside the current loop (changed under m_mutex)
};

}  // namespace npusim
