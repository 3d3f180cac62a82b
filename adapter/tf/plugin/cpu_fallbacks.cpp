#include "adapter/tf/plugin/cpu_fallbacks.h"

#include <mutex>
#include <set>

#include "adapter/tf/plugin/plugin_device.h"

namespace npusim::tf {
namespace {

struct FallbackState {
  std::mutex mutex;
  std::map<std::string, int64_t> counts;
  std::set<std::string> warned;
};

FallbackState& state() {
  static FallbackState* s = new FallbackState();  // outlives every graph TensorFlow optimizes
  return *s;
}

}  // namespace

void record_cpu_fallback(const std::string& op_type, int64_t nodes, const std::string& example) {
  FallbackState& s = state();
  bool first;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.counts[op_type] += nodes;
    first = s.warned.insert(op_type).second;
  }
  if (first)
    log_warning("op " + op_type + " has no NPU kernel; soft placement runs it on the CPU (" +
                example + "). npusim.cpu_fallback_ops() counts these nodes.");
}

std::map<std::string, int64_t> cpu_fallback_counts() {
  FallbackState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.counts;
}

void clear_cpu_fallback_counts() {
  FallbackState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.counts.clear();
}

}  // namespace npusim::tf
