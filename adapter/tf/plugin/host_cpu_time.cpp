#include "adapter/tf/plugin/host_cpu_time.h"

#include <mutex>
#include <utility>

#include "common/thread_cpu_time.h"

namespace npusim::tf {
namespace {

struct Registry {
  std::mutex mutex;
  HostCpuTimes times;
};

Registry& registry() {
  static Registry* r = new Registry();  // lives as long as the process: kernels may outlive main
  return *r;
}

// CPU time of the scopes that ended on this thread, inclusive, nanoseconds: a scope subtracts
// what its inner scopes took.
thread_local uint64_t t_scoped_ns = 0;

}  // namespace

HostCpuTimes host_cpu_times(bool reset) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  HostCpuTimes out = r.times;
  if (reset) r.times.clear();
  return out;
}

HostCpuScope::HostCpuScope(const char* phase, std::string item)
    : m_phase(phase),
      m_item(std::move(item)),
      m_start_ns(thread_cpu_ns()),
      m_nested_at(t_scoped_ns) {}

HostCpuScope::~HostCpuScope() {
  const uint64_t elapsed = thread_cpu_ns() - m_start_ns;
  const uint64_t nested = t_scoped_ns - m_nested_at;
  t_scoped_ns = m_nested_at + elapsed;
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  HostCpuFigure& f = r.times[m_phase][m_item];
  ++f.calls;
  f.cpu_ns += elapsed > nested ? elapsed - nested : 0;
}

}  // namespace npusim::tf
