#include "adapter/graph/memory_plan.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "common/error.h"

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

uint64_t plan_memory_within_budget(std::vector<PlannedBuffer>& buffers,
                                   const std::vector<LifetimeExtension>& extensions,
                                   uint64_t budget_bytes, std::vector<char>* granted) {
  for (size_t e = 0; e < extensions.size(); ++e)
    for (const auto& [b, until] : extensions[e].live_until)
      if (b >= buffers.size())
        throw Error(fmt::format("lifetime extension {} names buffer {}, the plan has {}", e, b,
                                buffers.size()));
  // Raises the lifetimes of `b` by extension e; whether any grew.
  const auto extend = [&](std::vector<PlannedBuffer>& b, size_t e) {
    bool grew = false;
    for (const auto& [i, until] : extensions[e].live_until)
      if (until > b[i].last) {
        b[i].last = until;
        grew = true;
      }
    return grew;
  };
  granted->assign(extensions.size(), 1);
  std::vector<PlannedBuffer> all = buffers;
  for (size_t e = 0; e < extensions.size(); ++e) extend(all, e);
  uint64_t peak = plan_memory(all);
  if (peak <= budget_bytes) {
    buffers = std::move(all);
    return peak;
  }
  peak = plan_memory(buffers);
  const uint64_t limit = std::max(budget_bytes, peak);
  for (size_t e = 0; e < extensions.size(); ++e) {
    std::vector<PlannedBuffer> trial = buffers;
    if (!extend(trial, e)) continue;  // lengthens nothing: granted as it is
    const uint64_t trial_peak = plan_memory(trial);
    if (trial_peak <= limit) {
      buffers = std::move(trial);
      peak = trial_peak;
    } else {
      (*granted)[e] = 0;
    }
  }
  return peak;
}

}  // namespace npusim::graph
