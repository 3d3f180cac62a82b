// The AI CPU's cost model (docs/runtime.md, "The AI CPU timeline"): how long an AI CPU kernel
// takes, from the chip config's `ai_cpu:` section, in AI-core cycles (the unit of every device
// timeline), for AiCpuTask::cycles.
#pragma once

#include <cstdint>

#include "sim/config/chip_config.h"

namespace npusim::rt {

// Mask bits one unit of DropOutGenMask's work covers: the AI CPU kernel generates and stores the
// mask in 128-bit units, the element count rounded up to a whole unit, and spreads the units
// over its cores (MindSpore's DropoutGenMask AI CPU kernel: ParallelFor over 16-byte units).
inline constexpr uint64_t kGenMaskUnitBits = 128;

// DropOutGenMask of `elements` mask bits: the task overhead (ai_cpu.task_us) plus the busiest
// core's units (ceil(units / ai_cpu.cores)) at ai_cpu.gen_mask_cycles_per_128_bits AI CPU cycles
// each, converted to the chip's clock; rounded up to whole cycles. 0 elements: the overhead only.
// The chip must model an AI CPU (ai_cpu_cores > 0).
uint64_t gen_mask_cycles(const ChipConfig& cfg, uint64_t elements);

}  // namespace npusim::rt
