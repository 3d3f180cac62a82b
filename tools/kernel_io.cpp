#include "tools/kernel_io.h"

#include <cstdlib>

#include "common/error.h"
#include "isa/assembler.h"
#include "isa/kernel_file.h"

#ifndef NPUSIM_SOURCE_DIR
#define NPUSIM_SOURCE_DIR "."
#endif

namespace npusim::cli {

namespace {
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}
}  // namespace

isa::Program load_kernel(const std::string& path) {
  if (!ends_with(path, ".npuk")) return isa::assemble_file(path);
  return isa::read_kernel_file(path);
}

ChipConfig load_chip(const std::string& chip, const std::vector<std::string>& overrides) {
  return load_chip_config(chip, overrides);
}

std::string source_dir() {
  const char* env = std::getenv("NPUSIM_SOURCE_DIR");
  return env ? env : NPUSIM_SOURCE_DIR;
}

std::string builtin_kernel_path(const std::string& file) {
  return source_dir() + "/kernels/" + file;
}

}  // namespace npusim::cli
