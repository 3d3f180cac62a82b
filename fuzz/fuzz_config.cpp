// The chip config loader on arbitrary YAML and --set overrides. Input: a YAML file whose lines
// "#set KEY=VALUE" (YAML comments) are also given as overrides, in order; if the first line is
// "#chip NAME", the preset NAME is loaded with those overrides instead of the file.
//
// A config the loader accepts must build what the model builds from it without a simulator:
// the device memory (its first and last byte written and read back), each core kind's buffers
// (likewise), the cost of moving one page over each data path; and every rate the model
// divides by must move one device-memory page in a time the simulator's clock can count
// (64-bit picoseconds, 1000 per cycle), or a transfer would never end.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include <fmt/format.h>

#include "fuzz/fuzz_util.h"
#include "sim/config/chip_config.h"
#include "sim/exec/exec.h"
#include "sim/exec/mte_common.h"
#include "sim/memory/device_memory.h"

using namespace npusim;

namespace {

constexpr double kMaxCycles = 18446744073709551615.0 / 1000;  // 2^64 ps at 1000 ps per cycle
constexpr double kPage = DeviceMemory::kPageBytes;

void require_finishes(const ChipConfig& cfg, const std::string& what, double cycles) {
  fuzz::fuzz_require(cycles >= 0 && cycles < kMaxCycles,
                     fmt::format("config accepted, but {} takes {} cycles, more than the "
                                 "simulator's clock counts ({})",
                                 what, cycles, kMaxCycles));
}

void check_rates(const ChipConfig& cfg) {
  for (const auto& [path, rate] : cfg.path_bytes_per_cycle)
    require_finishes(cfg, fmt::format("one page over path {}->{}", isa::buf_name(path.first),
                                      isa::buf_name(path.second)),
                     kPage / rate);
  require_finishes(cfg, "one page from HBM", kPage / cfg.hbm_sustained_bytes_per_cycle());
  if (cfg.l2_bytes > 0) {
    require_finishes(cfg, "one page from L2", kPage / cfg.l2_bytes_per_cycle());
    for (double port : {cfg.l2_read_bytes_per_cycle, cfg.l2_write_bytes_per_cycle})
      if (port > 0) require_finishes(cfg, "one page over a core's L2 port", kPage / port);
  }
  require_finishes(cfg, "one page over the host link",
                   cfg.hdc_latency_us * cfg.clock_mhz + kPage / cfg.hdc_bytes_per_cycle());
}

void build_structures(const ChipConfig& cfg) {
  DeviceMemory gm(cfg.hbm_bytes);
  if (cfg.hbm_bytes > 0) {
    for (uint64_t addr : {uint64_t{0}, cfg.hbm_bytes - 1}) {
      const uint8_t in = 0xa5;
      uint8_t out = 0;
      gm.write(addr, &in, 1);
      gm.read(addr, &out, 1);
      fuzz::fuzz_require(out == in, fmt::format("device memory byte {:#x} reads back wrong", addr));
    }
  }
  for (const CoreKindConfig& kind : cfg.core_kinds) {
    CoreMemory local(kind);
    for (const auto& [buf, bytes] : kind.buffer_bytes) {
      if (bytes == 0) continue;
      *local.at(buf, 0, 1) = 1;
      *local.at(buf, bytes - 1, 1) = 2;
    }
  }
  for (const auto& [path, rate] : cfg.path_bytes_per_cycle)
    mte::path_cost(cfg, path.first, path.second, DeviceMemory::kPageBytes);
}

// The input's file, rewritten for each input (loaded by path like a user's file).
const std::string& input_path() {
  static const std::string path = [] {
    std::string tmpl = "/tmp/npusim_fuzz_config_XXXXXX.yaml";
    int fd = mkstemps(tmpl.data(), 5);
    if (fd < 0) std::abort();
    close(fd);
    return tmpl;
  }();
  static const bool removed_at_exit = std::atexit([] { unlink(input_path().c_str()); }) == 0;
  (void)removed_at_exit;
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::as_text(data, size);
  fuzz::ConfigDirectives d = fuzz::config_directives(text, "#chip ");
  std::string chip = d.preset;
  const std::vector<std::string>& overrides = d.overrides;
  if (chip.empty()) {
    std::ofstream f(input_path(), std::ios::binary | std::ios::trunc);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
    chip = input_path();
  }
  ChipConfig cfg;
  if (!fuzz::accepted([&] { cfg = load_chip_config(chip, overrides); })) return 0;
  dump_chip_config_yaml(cfg);
  check_rates(cfg);
  build_structures(cfg);
  return 0;
}
