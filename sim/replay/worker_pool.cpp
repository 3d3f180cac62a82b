#include "sim/replay/worker_pool.h"

#include <algorithm>
#include <chrono>

namespace npusim {

WorkerPool::WorkerPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) m_threads.emplace_back([this] { worker(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stop = true;
  }
  m_start.notify_all();
  for (std::thread& t : m_threads) t.join();
}

void WorkerPool::work_on_current() {
  for (size_t i = m_next.fetch_add(1); i < m_count; i = m_next.fetch_add(1)) (*m_task)(i);
}

namespace {
// How long a thread that ran out of work keeps watching for more before it sleeps on the
// condition variable: launches follow each other by tens to hundreds of microseconds, and
// waking a sleeping thread costs about as much (a futex round trip through the host
// scheduler). It yields while it watches, so other threads of the process still get the CPU.
constexpr auto kWatch = std::chrono::microseconds(200);

template <typename Done>
void watch(Done&& done) {
  const auto until = std::chrono::steady_clock::now() + kWatch;
  while (!done() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
}
}  // namespace

void WorkerPool::worker() {
  uint64_t seen = 0;
  for (;;) {
    watch([&] { return m_stop.load() || m_generation.load() != seen; });
    {
      std::unique_lock<std::mutex> lock(m_mutex);
      m_start.wait(lock, [&] { return m_stop || m_generation != seen; });
      if (m_stop) return;
      seen = m_generation;
      if (!m_open) continue;  // woke after that loop ended: nothing to join
      ++m_busy;
    }
    work_on_current();
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      if (--m_busy == 0) m_done.notify_all();
    }
  }
}

void WorkerPool::run(size_t n, const std::function<void(size_t)>& task) {
  if (m_threads.empty() || n <= 1) {
    for (size_t i = 0; i < n; ++i) task(i);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_task = &task;
    m_count = n;
    m_next.store(0);
    m_open = true;
    ++m_generation;
  }
  m_start.notify_all();
  work_on_current();
  // Every iteration has been taken once m_next passed m_count; wait for the workers that took
  // one to finish it. A worker that wakes late finds nothing left and leaves at once.
  watch([&] { return m_busy.load() == 0; });
  std::unique_lock<std::mutex> lock(m_mutex);
  m_done.wait(lock, [&] { return m_busy == 0; });
  m_open = false;
  m_task = nullptr;
}

}  // namespace npusim
