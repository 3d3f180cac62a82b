// Static device memory planning by liveness: buffers whose lifetimes (inclusive ranges of task
// steps) do not overlap may share bytes. Placement is greedy, largest buffer first, each at the
// lowest aligned offset free of every placed buffer it is live with (the offline planners'
// "greedy by size" heuristic, as in TFLite's arena planner).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
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

// Later ends of some buffers' lifetimes that a plan may grant or refuse as one
// (plan_memory_within_budget): each pair asks that buffer `first` (an index into the planned
// buffers) stay live at least until step `second`.
struct LifetimeExtension {
  std::vector<std::pair<size_t, int>> live_until;
};

// plan_memory, granting extensions while the plan's peak stays within a budget. The buffers'
// lifetimes as given are the least each needs. If the plan with every extension fits
// `budget_bytes`, every one is granted; else each in turn, in the order given, is granted when
// the plan with it and with the ones granted before peaks at no more than the limit, the
// larger of `budget_bytes` and the peak with none (a budget below that cannot be met by
// lifetimes). Sets every buffer's `last` and offset to the plan granted, `(*granted)[i]` to
// whether extension i was granted; returns the peak. An extension naming a buffer out of range
// is an error. Each refused or granted extension that lengthens a lifetime costs one plan
// (greedy by size, quadratic in the buffers).
uint64_t plan_memory_within_budget(std::vector<PlannedBuffer>& buffers,
                                   const std::vector<LifetimeExtension>& extensions,
                                   uint64_t budget_bytes, std::vector<char>* granted);

}  // namespace npusim::graph
