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
  KernelResult result;
};

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
  // Launches carried out as replays (SimOptions::replay) so far, init tasks included.
  uint64_t replayed_launches() const { return m_replayed; }

 private:
  const OmModel& m_model;
  Simulator& m_sim;
  std::string m_source;
  uint64_t m_constant_base = 0, m_activation_base = 0, m_end = 0;
  bool m_counter_trees = false;
  uint64_t m_replayed = 0;

  // The two regions as the launches' allocation blocks (KernelLaunch::gm_blocks).
  GmBlockLookup m_regions;

  uint64_t address(Region r, uint64_t offset) const;
  // run: KernelLaunch::l2_run (nonzero for the tasks of one run()).
  KernelResult launch(const Task& t, uint64_t run = 0);
};

}  // namespace npusim::graph
