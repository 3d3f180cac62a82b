#include "adapter/graph/step_groups.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "sim/config/core_taker.h"

namespace npusim::graph {

StepGroups schedule_step_groups(const std::vector<GroupStep>& steps, const ChipConfig& cfg) {
  const size_t n = steps.size();
  const auto launches = [&](size_t i) { return steps[i].alone || steps[i].program != nullptr; };
  // Per step, the launching steps it waits for (through steps that launch nothing).
  std::vector<std::vector<size_t>> gates(n);
  for (size_t i = 0; i < n; ++i) {
    for (size_t j : steps[i].after) {
      if (j >= i)
        throw Error(fmt::format("step {} comes after step {}, which is not earlier", i, j));
      if (launches(j))
        gates[i].push_back(j);
      else
        gates[i].insert(gates[i].end(), gates[j].begin(), gates[j].end());
    }
    std::sort(gates[i].begin(), gates[i].end());
    gates[i].erase(std::unique(gates[i].begin(), gates[i].end()), gates[i].end());
  }
  // Priority: the launching steps on the longest chain of launching steps from the step to the
  // list's end (its "bottom level"), most first; ties in task order. The steps that later
  // steps wait for go first; a step little waits for (a filter gradient: only its update reads
  // it) fills a group beside them.
  std::vector<size_t> level(n, 0);
  for (size_t i = n; i-- > 0;) {
    level[i] += launches(i) ? 1 : 0;
    for (size_t j : steps[i].after) level[j] = std::max(level[j], level[i]);
  }
  constexpr int kUnplaced = -1;
  StepGroups out;
  out.position.assign(n, kUnplaced);
  std::vector<size_t> pending;  // launching steps not yet in a group, by priority
  for (size_t i = 0; i < n; ++i)
    if (launches(i)) pending.push_back(i);
  std::stable_sort(pending.begin(), pending.end(),
                   [&](size_t a, size_t b) { return level[a] > level[b]; });
  CoreTaker cores(cfg);
  while (!pending.empty()) {
    const int g = static_cast<int>(out.groups.size());
    const auto ready = [&](size_t i) {
      for (size_t j : gates[i])
        if (out.position[j] == kUnplaced || out.position[j] >= g) return false;
      return true;
    };
    // The first ready step by priority opens the group (the pending step first in task order
    // is ready: its predecessors are earlier, all in groups by now).
    const size_t first = *std::find_if(pending.begin(), pending.end(), ready);
    std::vector<size_t> group{first};
    if (!steps[first].alone) {
      // The opener takes its free workers, every one of its kind where its blocks outnumber
      // them (they run in waves); the others join only where each of their blocks finds a
      // free worker (admitting those that find some, to begin on them and take more as they
      // free, put them ahead of the next chain step in the launches' order and lengthened the
      // step: docs/graph_engine.md, "Streams that group more").
      cores.clear();
      cores.take_free(*steps[first].program, steps[first].block_dim, nullptr);
      for (const size_t i : pending) {
        if (i == first || steps[i].alone || !ready(i)) continue;
        if (cores.take(*steps[i].program, steps[i].block_dim, nullptr)) group.push_back(i);
      }
    }
    for (size_t i : group) out.position[i] = g;
    pending.erase(std::remove_if(pending.begin(), pending.end(),
                                 [&](size_t i) { return out.position[i] == g; }),
                  pending.end());
    std::sort(group.begin(), group.end());
    out.groups.push_back(std::move(group));
  }
  for (size_t i = 0; i < n; ++i) {
    if (launches(i)) continue;
    int at = 0;
    for (size_t j : gates[i]) at = std::max(at, out.position[j]);
    out.position[i] = at;
  }
  return out;
}

}  // namespace npusim::graph
