// Human-readable summaries of a kernel run, computed from its counter tree.
#pragma once

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

}  // namespace npusim::cli
