// The system config loader on arbitrary YAML and --set overrides (system keys and chip.<key>).
// Input: a YAML file whose lines "#set KEY=VALUE" (YAML comments) are also given as overrides,
// in order; if the first line is "#system NAME", the preset NAME is loaded with those overrides
// instead of the file.
//
// A system the loader accepts must be what the model can run: at most 64 chips; every link and
// NIC moves the chip's whole device memory in a time the simulator's clock can count (64-bit
// picoseconds, 1000 per cycle), latencies included; and its resolved dump (system.yaml with its
// chip.yaml beside it) must load back as the same system.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "fuzz/fuzz_util.h"
#include "sim/config/system_config.h"

using namespace npusim;

namespace {

constexpr double kMaxCycles = 18446744073709551615.0 / 1000;  // 2^64 ps at 1000 ps per cycle

void require_link_finishes(const SystemConfig& cfg, const char* what, const LinkConfig& l) {
  const double mhz = cfg.chip.clock_mhz;
  const double cycles = (l.latency_us + cfg.switch_latency_us) * mhz +
                        static_cast<double>(cfg.chip.hbm_bytes) / (l.gbps * 1e3 / mhz);
  fuzz::fuzz_require(cycles >= 0 && cycles < kMaxCycles,
                     fmt::format("system accepted, but the device memory over the {} takes {} "
                                 "cycles, more than the simulator's clock counts ({})",
                                 what, cycles, kMaxCycles));
}

// A scratch folder for the input file and the dump, removed at exit.
const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = [] {
    std::string tmpl = "/tmp/npusim_fuzz_system_XXXXXX";
    if (!mkdtemp(tmpl.data())) std::abort();
    return std::filesystem::path(tmpl);
  }();
  static const bool removed_at_exit = std::atexit([] {
                                        std::error_code ec;
                                        std::filesystem::remove_all(scratch(), ec);
                                      }) == 0;
  (void)removed_at_exit;
  return dir;
}

// The dump without its first line (which names the file it came from).
std::string body(const std::string& yaml) { return yaml.substr(yaml.find('\n') + 1); }

void require_round_trip(const SystemConfig& cfg) {
  const std::filesystem::path system = scratch() / "dump_system.yaml";
  std::ofstream(scratch() / "chip.yaml") << dump_chip_config_yaml(cfg.chip);
  const std::string dump = dump_system_config_yaml(cfg, "chip.yaml");
  std::ofstream(system) << dump;
  SystemConfig back;
  const bool loads = fuzz::accepted([&] { back = load_system_config(system.string()); });
  fuzz::fuzz_require(loads, "the resolved system dump does not load back");
  fuzz::fuzz_require(body(dump_system_config_yaml(back, "chip.yaml")) == body(dump),
                     "the resolved system dump loads back as another system");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text = fuzz::as_text(data, size);
  fuzz::ConfigDirectives d = fuzz::config_directives(text, "#system ");
  std::string system = d.preset;
  const std::vector<std::string>& overrides = d.overrides;
  if (system.empty()) {
    system = (scratch() / "input.yaml").string();
    std::ofstream f(system, std::ios::binary | std::ios::trunc);
    f.write(text.data(), static_cast<std::streamsize>(text.size()));
  }
  SystemConfig cfg;
  if (!fuzz::accepted([&] { cfg = load_system_config(system, overrides); })) return 0;
  fuzz::fuzz_require(cfg.chips() >= 1 && cfg.chips() <= 64,
                     fmt::format("system accepted with {} chips", cfg.chips()));
  require_link_finishes(cfg, "in-server link", cfg.link);
  if (cfg.servers > 1) require_link_finishes(cfg, "NIC", cfg.nic);
  require_round_trip(cfg);
  return 0;
}
