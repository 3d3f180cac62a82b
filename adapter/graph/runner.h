// Runs an offline model (model.h) on the chip model without TensorFlow: places the constant and
// activation regions in device memory, copies the constants in and runs the init tasks once
// (derived tensors of the weights), then per inference copies the inputs in over the host link,
// runs the task list in order and copies the outputs back.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "adapter/graph/model.h"
#include "common/npy.h"
#include "sim/simulator.h"

namespace npusim::graph {

// The chip an .om was compiled for, loaded from the config it holds.
ChipConfig model_chip(const OmModel& m);

// Throws npusim::Error if `cfg` (a chip asked for by name or file) is not the one `m` was
// compiled for: different name or any different key.
void check_model_chip(const OmModel& m, const ChipConfig& cfg, const std::string& source);

struct TaskRun {
  const Task* task = nullptr;
  // Its own launch: start_cycle is its group's start when it ran beside others (cycles run from
  // there to its own end: Simulator::run_concurrent).
  KernelResult result;
  size_t group = 0;  // the group of the inference it ran in (run in order: its own index)
};

// The model's task list cut into groups of tasks that may run at once (OfflineRunner's
// concurrent mode), as task indices in list order. Walking the list in order, a task joins the
// current group when no buffer it writes overlaps one a task of the group reads or writes, none
// it reads overlaps one they write (RAW, WAR, WAW on Task::buffers), and its cores still fit
// beside the group's: `block_dim` free cores of the kind its kernel runs on (a mix kernel:
// `block_dim` free groups of a cube core and its `mix_aiv_per_block` vector cores), taken
// first-free in core order. Otherwise the group closes and the task starts the next. A task with
// no recorded buffers, or whose block_dim exceeds the chip's cores of its kind, is a group alone.
// `cores[i][j]`: the names of the cores task groups[i][j] is given ("aic0", "aiv3", "aicore5").
struct TaskGroups {
  std::vector<std::vector<size_t>> groups;
  std::vector<std::vector<std::vector<std::string>>> cores;
};
TaskGroups concurrent_groups(const OmModel& m, const ChipConfig& cfg);

// Where the runner places the model's two regions (model.h) in device memory: device addresses,
// each a multiple of 4096, the regions disjoint. 0, 0: the constant region at 0x10000, the
// activation region after it (what `npusim infer` does).
struct RegionBases {
  uint64_t constant = 0, activation = 0;
};

class OfflineRunner {
 public:
  // Verifies every kernel for the simulator's chip, places the regions at `bases`, uploads the
  // constants and runs the init tasks. Throws npusim::Error naming `source` if the chip differs,
  // the bases are misaligned or the regions overlap, the regions do not fit the device memory or
  // an init task faults. Every launch names the two regions as its allocations
  // (KernelLaunch::gm_blocks), so its L2 files lines by region and an inference times the same
  // wherever the regions lie (sim/chip/l2_placement.h).
  OfflineRunner(const OmModel& m, Simulator& sim, const std::string& source,
                RegionBases bases = {});

  // One inference. `inputs[i]` (from `labels[i]`, for messages) must have model input i's dtype
  // and shape exactly; throws npusim::Error naming the input, the expected and the given type.
  // Appends each launch's result to `runs` if given. Throws npusim::Error naming the node, its
  // op and the kernel fault if a task faults.
  std::vector<NpyArray> run(const std::vector<NpyArray>& inputs,
                            const std::vector<std::string>& labels,
                            std::vector<TaskRun>* runs = nullptr);

  // Device memory the two regions span, from the lower base to the end of the higher region.
  uint64_t device_bytes() const { return m_end - std::min(m_constant_base, m_activation_base); }
  // Build each launch's counter tree (KernelResult::counters), for reports. Default off.
  void set_counter_trees(bool on) { m_counter_trees = on; }
  // Run each inference's task list in groups of independent tasks (concurrent_groups), each
  // group of two or more at once (Simulator::run_concurrent: cores apart, HBM and L2 shared), a
  // group of one through Simulator::run as in order. The inference's simulated time is the sum
  // of the groups' makespans. Default off: tasks one after another.
  void set_concurrent(bool on);
  // The groups concurrent mode runs (empty until it is set on).
  const TaskGroups& concurrent_task_groups() const { return m_groups; }
  // Launches carried out as replays (SimOptions::replay) so far, init tasks included.
  uint64_t replayed_launches() const { return m_replayed; }

 private:
  const OmModel& m_model;
  Simulator& m_sim;
  std::string m_source;
  uint64_t m_constant_base = 0, m_activation_base = 0, m_end = 0;
  bool m_counter_trees = false;
  bool m_concurrent = false;
  uint64_t m_replayed = 0;
  TaskGroups m_groups;  // concurrent_groups, computed when concurrent mode is set on

  // The two regions as the launches' allocation blocks (KernelLaunch::gm_blocks).
  GmBlockLookup m_regions;

  uint64_t address(Region r, uint64_t offset) const;
  // run: KernelLaunch::l2_run (nonzero for the tasks of one run()).
  KernelLaunch kernel_launch(const Task& t, uint64_t run) const;
  KernelResult launch(const Task& t, uint64_t run = 0);
  // A task's failed result as an npusim::Error naming the node.
  [[noreturn]] void task_fault(const Task& t, const KernelResult& r) const;
};

}  // namespace npusim::graph
