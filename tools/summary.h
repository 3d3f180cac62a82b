// Human-readable summaries of a kernel run, computed from its counter tree.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>

#include "isa/isa.h"
#include "sim/config/chip_config.h"
#include "sim/simulator.h"

namespace npusim::cli {

// The block_dim that uses every core the program runs on (cube cores for aic/mix kernels,
// vector cores for aiv kernels, all AI cores on coupled chips).
int default_block_dim(const isa::Program& prog, const ChipConfig& cfg);

// One line: organisation, cores, clock, peak fp16 TFLOPS, HBM.
std::string describe_chip(const ChipConfig& cfg);

// Time, per-pipe utilisation (busy cycles / kernel cycles, averaged over the cores that ran),
// cube MAC utilisation, bytes per data path, stalls by cause, L2 and HBM traffic.
void print_summary(std::ostream& out, const ChipConfig& cfg, const std::string& kernel,
                   int block_dim, const KernelResult& r);

// 100 x vector repeats x 256 B / (vector bytes per cycle x vector cores x cycles): the share of
// the whole chip's vector peak used over `cycles` (0 if the chip has no vector unit or cycles 0).
double vector_utilization_pct(const ChipConfig& cfg, uint64_t vector_repeats, uint64_t cycles);

// Merges the buffer high-water marks of a counter tree (chip.<core>.buffer.<buf>.high_water, the
// highest byte offset any instruction touched) into `marks`: per buffer name ("l1", "l0a", "ub",
// ...), the maximum over the cores and over every tree merged so far, in bytes.
void merge_buffer_high_water(const nlohmann::json& counters,
                             std::map<std::string, uint64_t>& marks);

// Adds the activity of a counter tree that the sweep's power estimate uses into `totals`, summed
// over the cores (docs/sweep.md, "Power estimate"): "macs" (cube MACs, fp16 equivalents),
// "vector_repeats", "bytes.<path>" per data path (e.g. "bytes.gm_to_l1"), "l2_read_bytes",
// "l2_write_bytes", "hbm_read_bytes", "hbm_write_bytes".
void merge_activity(const nlohmann::json& counters, std::map<std::string, uint64_t>& totals);

}  // namespace npusim::cli
