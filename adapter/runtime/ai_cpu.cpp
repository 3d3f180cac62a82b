#include "adapter/runtime/ai_cpu.h"

#include <cmath>

namespace npusim::rt {

uint64_t gen_mask_cycles(const ChipConfig& cfg, uint64_t elements) {
  const uint64_t units = (elements + kGenMaskUnitBits - 1) / kGenMaskUnitBits;
  const uint64_t cores = static_cast<uint64_t>(cfg.ai_cpu_cores);
  const uint64_t units_per_core = (units + cores - 1) / cores;
  const double ai_cpu_cycles =
      static_cast<double>(units_per_core) * cfg.ai_cpu_gen_mask_cycles_per_128_bits;
  const double chip_cycles =
      cfg.ai_cpu_task_us * cfg.clock_mhz + ai_cpu_cycles * cfg.clock_mhz / cfg.ai_cpu_clock_mhz;
  return static_cast<uint64_t>(std::ceil(chip_cycles));
}

}  // namespace npusim::rt
