// The chip's cores as concurrent groups of launches take them (Simulator::run_concurrent,
// docs/chip_model.md "Concurrent launches"): per core kind, which cores are taken, each launch
// given the first free ones in core order, which is run_concurrent's own order for launches
// that name no cores. Used by the offline runner's groups (concurrent_groups) and by the TF
// plugin's NpuGraph schedule (adapter/graph/step_groups.h); the runtime's launch groups
// (rt::Device::launch_group) refuse with it a member for which the idle chip has no worker.
#pragma once

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "isa/isa.h"
#include "sim/config/chip_config.h"

namespace npusim {

// The vector cores in each block of mix kernel p (aic and aiv sections) on chip cfg: the
// program's declared aiv_per_aic (1: Ascend C KERNEL_TYPE_MIX_AIC_1_1, the block's other vector
// cores stay free for other launches), else the chip's cores.aiv.per_aic (at least 1). Throws
// Error naming the kernel if p declares a ratio on a coupled chip or above the chip's.
int mix_aiv_per_block(const ChipConfig& cfg, const isa::Program& p);

class CoreTaker {
 public:
  explicit CoreTaker(const ChipConfig& cfg);
  // Every core free again.
  void clear();
  // Could the launch's block_dim blocks have cores of their own on an idle chip?
  bool fits_alone(const isa::Program& p, int block_dim) const;
  // The workers program p has on an idle chip: its kind's cores (a mix kernel on a split chip:
  // the groups of a cube core and its mix_aiv_per_block vector cores). A launch whose blocks
  // take their cores as they free (Simulator's ConcurrentLaunch::take_cores_when_ready) runs
  // them in waves on these, so it needs one; block_dim may exceed them. 0: the chip cannot run
  // it. Throws Error as mix_aiv_per_block does.
  int idle_workers(const isa::Program& p) const;
  // Takes block_dim free cores (a mix kernel, with AIC and AIV sections on a split chip:
  // block_dim groups of a cube core and its first mix_aiv_per_block vector cores) for program p,
  // appending
  // their names ("aic0", "aiv3", "aicore5") to `names` if given; false, nothing taken, if that
  // many are not free.
  bool take(const isa::Program& p, int block_dim, std::vector<std::string>* names);
  // Takes the free workers for program p (as take picks them: first in core order) up to
  // block_dim of them, appending their cores' names to `names` if given; returns how many it
  // took (0: none of its kind free). A launch that takes its cores when ready begins on these
  // and runs its other blocks as they free.
  int take_free(const isa::Program& p, int block_dim, std::vector<std::string>* names);
  // Marks the named cores ("aic0", "aiv3", "aicore5", as take names them) taken; a name of no
  // core of this chip is ignored.
  void hold(const std::vector<std::string>& names);

 private:
  // The free workers for p, first in core order, at most `want`: each its cores.
  std::vector<std::vector<std::pair<isa::CoreKind, size_t>>> free_workers(const isa::Program& p,
                                                                          size_t want) const;
  // Marks the cores of `workers` taken, appending their names to `names` if given.
  void mark(const std::vector<std::vector<std::pair<isa::CoreKind, size_t>>>& workers,
            std::vector<std::string>* names);

  const ChipConfig& m_cfg;
  std::array<std::vector<bool>, 3> m_taken;  // by isa::CoreKind
};

}  // namespace npusim
