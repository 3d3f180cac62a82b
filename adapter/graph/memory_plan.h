// Static device memory planning by liveness: buffers whose lifetimes (inclusive ranges of task
// steps) do not overlap may share bytes. Placement is greedy, largest buffer first, each at the
// lowest aligned offset free of every placed buffer it is live with (the offline planners'
// "greedy by size" heuristic, as in TFLite's arena planner).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace npusim::graph {

// Buffers start on 512-byte boundaries, as the command line's device arena places them
// (tools/device_buffers.h): whole L2 lines, so a launch's timing does not depend on where its
// neighbours lie.
inline constexpr uint64_t kPlanAlign = 512;

struct PlannedBuffer {
  std::string what;  // e.g. "conv1/Relu:0" or "conv1/Relu workspace"
  uint64_t bytes = 0;
  int first = 0, last = 0;  // live from step first to step last, inclusive
  uint64_t offset = 0;      // set by plan_memory
};

// Sets every buffer's offset; returns the plan's peak (bytes of the region it needs).
uint64_t plan_memory(std::vector<PlannedBuffer>& buffers);

}  // namespace npusim::graph
