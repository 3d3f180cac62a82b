// The chip's cores as concurrent groups of launches take them (Simulator::run_concurrent,
// docs/chip_model.md "Concurrent launches"): per core kind, which cores are taken, each launch
// given the first free ones in core order, which is run_concurrent's own order for launches
// that name no cores. Used by the offline runner's groups (concurrent_groups) and by the TF
// plugin's NpuGraph schedule (adapter/graph/step_groups.h), and checked by the runtime's
// launch groups (rt::Device::launch_group).
#pragma once

#include <array>
#include <string>
#include <vector>

#include "isa/isa.h"
#include "sim/config/chip_config.h"

namespace npusim {

class CoreTaker {
 public:
  explicit CoreTaker(const ChipConfig& cfg);
  // Every core free again.
  void clear();
  // Could the launch's block_dim blocks have cores of their own on an idle chip?
  bool fits_alone(const isa::Program& p, int block_dim) const;
  // Takes block_dim free cores (a mix kernel, with AIC and AIV sections on a split chip:
  // block_dim groups of a cube core and its aiv_per_aic vector cores) for program p, appending
  // their names ("aic0", "aiv3", "aicore5") to `names` if given; false, nothing taken, if that
  // many are not free.
  bool take(const isa::Program& p, int block_dim, std::vector<std::string>* names);
  // Marks the named cores ("aic0", "aiv3", "aicore5", as take names them) taken; a name of no
  // core of this chip is ignored.
  void hold(const std::vector<std::string>& names);

 private:
  const ChipConfig& m_cfg;
  std::array<std::vector<bool>, 3> m_taken;  // by isa::CoreKind
};

// One launch of a group whose launches wait for others (ConcurrentLaunch::after): its program,
// block count and the earlier launches it waits for (indices into the group, each earlier).
struct StreamLaunch {
  const isa::Program* program = nullptr;
  int block_dim = 1;
  std::vector<size_t> after;
};

// The cores of a group of launches that wait for others, each given block_dim cores of its own
// as a stream's task is. Launch i may overlap every earlier launch it does not wait for
// (directly or through others); it takes the first free cores (CoreTaker::take) beside the
// cores of those launches. Where too few are free it waits for the latest of them that runs on
// a core kind of its own (that launch's index appended to its `after`), and again, until it
// fits: a static stand-in for cores taken when a launch is ready (a later launch never passes
// an earlier one for cores). Returns each launch's core names, in the order given; throws
// npusim::Error naming the launch for an `after` that names no earlier launch or a launch that
// does not fit the idle chip.
std::vector<std::vector<std::string>> take_stream_cores(const ChipConfig& cfg,
                                                        std::vector<StreamLaunch>* launches);

}  // namespace npusim
