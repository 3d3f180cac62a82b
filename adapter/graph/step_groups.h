// Groups of a task list's steps that may run at once on disjoint cores, scheduled from the
// steps' data dependences: the TF plugin's NpuGraph under NPUSIM_GRAPH_CONCURRENT=1 submits its
// launches in the groups' order, one group after another, as streams (each launch waiting only
// for what it depends on; docs/graph_engine.md, "Concurrent steps of a TF graph"); its memory
// plan's reuse is among the dependences, and the groups say which steps are expected to run
// on beside later ones (whose buffers the plan keeps longer where its budget allows).
//
// The schedule (schedule_step_groups) is a list scheduler over the dependence graph, one group
// at a time: the ready steps are those whose every launching predecessor is in an earlier group
// (a step that launches nothing passes its predecessors on to its readers). Priority: the
// length of the longest chain of launching steps from the step to the list's end, longest
// first, ties in task order. The ready step of highest priority opens the group, taking the
// free cores of its kernel's kind for its blocks (CoreTaker::take_free: all of them where its
// block_dim exceeds them; its blocks then run in waves, as the chip dispatches them); the other
// ready steps join it by priority while all their blocks find free cores beside the group's
// (CoreTaker::take: block_dim free cores of their kernel's kind; a mix kernel, groups), so a
// step wider than the chip joins none but opens its own. So in a backward pass the data
// gradients and batch-norm gradients (the chain every later layer waits for) go first, and a
// filter gradient (cube; only its update reads it) runs beside the next batch-norm gradient
// (vector) instead of alone. A step that must run alone (several launches, an AI CPU task) is
// a group of its own and fills none. Deterministic: the steps and the chip alone decide.
#pragma once

#include <cstddef>
#include <vector>

#include "isa/isa.h"
#include "sim/config/chip_config.h"

namespace npusim::graph {

struct GroupStep {
  // The steps whose results it reads (or that must precede it otherwise), all earlier in the
  // list: the list is a topological order.
  std::vector<size_t> after;
  // Its one kernel launch and block count; program null: the step launches nothing (a view, a
  // slice placed in its input) unless `alone`.
  const isa::Program* program = nullptr;
  int block_dim = 1;
  // Runs as a group of its own (queued as in order): several launches, an AI CPU task. (A
  // launch whose block_dim exceeds the chip's cores of its kind need not: it opens a group.)
  bool alone = false;
};

struct StepGroups {
  // The groups in run order, each its steps in task order; steps that launch nothing are in
  // none.
  std::vector<std::vector<size_t>> groups;
  // Per step, the position of its group; a step that launches nothing: that of its latest
  // launching predecessor (0 without one).
  std::vector<int> position;
};

StepGroups schedule_step_groups(const std::vector<GroupStep>& steps, const ChipConfig& cfg);

}  // namespace npusim::graph
