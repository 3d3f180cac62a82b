// Loading kernels and chip configs for the command line.
#pragma once

#include <string>
#include <vector>

#include "isa/isa.h"
#include "sim/config/chip_config.h"

namespace npusim::cli {

// Assembly (.s or anything else) or binary (.npuk) by file extension.
isa::Program load_kernel(const std::string& path);

// --chip NAME|FILE plus --set key=value overrides.
ChipConfig load_chip(const std::string& chip, const std::vector<std::string>& overrides);

// The source tree: $NPUSIM_SOURCE_DIR, else the one npusim was built from.
std::string source_dir();

// A kernel shipped in kernels/ (NPUSIM_SOURCE_DIR or the source tree), by file name.
std::string builtin_kernel_path(const std::string& file);

}  // namespace npusim::cli
