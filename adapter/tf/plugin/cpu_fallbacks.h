// The record of ops that ran on the CPU because the NPU has no kernel for them (soft
// placement's silent fallback), shared by the graph optimizer that finds them
// (graph_optimizer.cpp, TensorFlow's C++ API) and the Python hooks that report them
// (python_hooks.cpp). Standard library only, so both sides can include it.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace npusim::tf {

// Adds `nodes` CPU-placed nodes of `op_type` (e.g. "Pow", or "AddV2[T=int64]"'s op "AddV2").
// The first time an op type is recorded in this process, logs one warning naming it and the
// example node (`example`: "AddV2 'Adam/add_1' (T=int64)"). Thread-safe.
void record_cpu_fallback(const std::string& op_type, int64_t nodes, const std::string& example);

// op type -> number of CPU-placed nodes recorded so far.
std::map<std::string, int64_t> cpu_fallback_counts();

// Forgets the counts (the warnings stay once per process).
void clear_cpu_fallback_counts();

}  // namespace npusim::tf
