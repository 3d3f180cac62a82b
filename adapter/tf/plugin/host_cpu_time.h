// CPU time the plugin's host-side phases take, by phase and item, so that a step's CPU seconds
// can be split (issue 14's first step: benchmarks/bench_tf.py, docs/graph_engine.md, "The
// emulator's first step and speed"). Phases:
//   "graph_pass"  the graph optimizer's passes over a tf.function's graph (graph_optimizer.cpp),
//                 item: the pass ("fusion", "mixed_precision", "cluster", ...), the fusion
//                 also by rewrite ("fusion: <rewrite>", "fusion: copies and type checks": the
//                 copy each rewrite keeps to take it back and the type check after it);
//   "compile"     the kernel compiler on a CompiledOpCache miss, item: the op type;
//   "graph_plan"  an NpuGraph's plan on its first run with a signature, item: "plan".
// Figures are CPU time of the thread that ran the phase (common/thread_cpu_time.h), exclusive:
// a phase run inside another on the same thread (the compiles inside a plan) counts only in the
// inner one, so the phases add up. Standard library only (graph_optimizer.cpp includes it).
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace npusim::tf {

struct HostCpuFigure {
  uint64_t calls = 0;
  uint64_t cpu_ns = 0;  // exclusive thread CPU time, nanoseconds
};

// phase -> item -> figure
using HostCpuTimes = std::map<std::string, std::map<std::string, HostCpuFigure>>;

// The figures since the process started or the last call with reset = true; reset clears them.
HostCpuTimes host_cpu_times(bool reset);

// Times one phase from construction to destruction on the constructing thread and adds its
// exclusive CPU time to (phase, item). Scopes nest on a thread; not to be moved across threads.
class HostCpuScope {
 public:
  HostCpuScope(const char* phase, std::string item);
  ~HostCpuScope();
  HostCpuScope(const HostCpuScope&) = delete;
  HostCpuScope& operator=(const HostCpuScope&) = delete;

 private:
  const char* m_phase;
  std::string m_item;
  uint64_t m_start_ns;   // thread CPU time at construction
  uint64_t m_nested_at;  // the thread's nested total at construction
};

}  // namespace npusim::tf
