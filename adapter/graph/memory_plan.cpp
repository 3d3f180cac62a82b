#include "adapter/graph/memory_plan.h"

#include <algorithm>
#include <numeric>

namespace npusim::graph {

uint64_t plan_memory(std::vector<PlannedBuffer>& buffers) {
  std::vector<size_t> order(buffers.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return buffers[a].bytes > buffers[b].bytes; });
  std::vector<size_t> placed;
  uint64_t peak = 0;
  for (size_t i : order) {
    PlannedBuffer& b = buffers[i];
    // The placed buffers live at the same time, by offset.
    std::vector<const PlannedBuffer*> live;
    for (size_t p : placed)
      if (buffers[p].first <= b.last && b.first <= buffers[p].last) live.push_back(&buffers[p]);
    std::sort(live.begin(), live.end(),
              [](const PlannedBuffer* x, const PlannedBuffer* y) { return x->offset < y->offset; });
    uint64_t offset = 0;
    for (const PlannedBuffer* o : live) {
      if (o->offset >= offset + b.bytes) break;  // the gap before o fits
      const uint64_t end = o->offset + o->bytes;
      offset = std::max(offset, (end + kPlanAlign - 1) / kPlanAlign * kPlanAlign);
    }
    b.offset = offset;
    peak = std::max(peak, offset + b.bytes);
    placed.push_back(i);
  }
  return peak;
}

}  // namespace npusim::graph
