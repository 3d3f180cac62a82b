// The YAML loader of system descriptions (system_config.h); the key layer is config_tree.h's.
#include "sim/config/system_config.h"

#include <sstream>

#include <fmt/format.h>

#include "common/error.h"
#include "sim/config/config_tree.h"

namespace npusim {
namespace {

namespace fs = std::filesystem;
using namespace config_tree;

const Schema& system_schema() {
  static const Schema schema{
      {"name", "chip", "servers", "chips_per_server", "server.topology", "server.link.gbps",
       "server.link.latency_us", "scale_out.nic.gbps", "scale_out.nic.latency_us",
       "scale_out.switch.latency_us", "collective.reduce_kernel_launch_us"},
      {},
      {}};
  return schema;
}

PresetDir system_presets() { return PresetDir{"system", system_config_dir()}; }

// Every chip is elaborated in one SystemC simulation with its cores' threads and buffers: 64
// chips of the 910b preset are 4,608 cores (about 15 GiB of thread stacks, mapped lazily).
constexpr int kMaxChips = 64;
// Ranges, as the chip loader's (config_loader.cpp, "Ranges"): simulated time counts cycles of
// 1000 ps in 64 bits. A link moves at least 1/16 byte per cycle, so that the whole 48-bit device
// address space crosses it alone within 2^52 cycles (a quarter of the range), and at most the
// address space per ps; a latency is at most 2^20 cycles, as the chip's.
constexpr double kMinBytesPerCycle = 1.0 / 16, kMaxBytesPerCycle = 0x1p48 * 1000;
constexpr double kMaxLatencyCycles = 1 << 20;

LinkConfig parse_link(const Reader& r, const std::string& key, double clock_mhz) {
  LinkConfig l;
  l.gbps = r.get_gbps(key + ".gbps", clock_mhz, kMinBytesPerCycle, kMaxBytesPerCycle);
  l.latency_us = r.get_number(key + ".latency_us", 0, false, kMaxLatencyCycles / clock_mhz);
  return l;
}

double parse_latency(const Reader& r, const std::string& key, double clock_mhz) {
  return r.get_number(key, 0, false, kMaxLatencyCycles / clock_mhz);
}

// The chip reference: a preset name, or a path relative to the system file.
std::string chip_path(const std::string& ref, const std::string& system_file) {
  if (!looks_like_path(ref) || fs::path(ref).is_absolute()) return ref;
  return (fs::path(system_file).parent_path() / ref).string();
}

SystemConfig parse_system(const Tree& tree, const std::string& file,
                          const std::string& default_name,
                          const std::vector<std::string>& chip_overrides) {
  check_known_keys(tree, system_schema());
  Reader r(tree, file);
  SystemConfig c;
  c.source_file = file;
  c.name = r.has("name") ? r.get_string("name") : default_name;
  c.chip_ref = r.get_string("chip");
  try {
    c.chip = load_chip_config(chip_path(c.chip_ref, file), chip_overrides);
  } catch (const ConfigError& e) {
    r.fail("chip", e.what());
  }
  c.servers = r.get_int("servers", 1, kMaxChips);
  c.chips_per_server = r.get_int("chips_per_server", 1, kMaxChips);
  if (c.chips() > kMaxChips)
    r.fail("servers", fmt::format("{} servers x {} chips = {} chips; at most {}", c.servers,
                                  c.chips_per_server, c.chips(), kMaxChips));
  const std::string topo = r.get_string("server.topology");
  if (topo == "full_mesh")
    c.topology = SystemTopology::full_mesh;
  else if (topo == "ring")
    c.topology = SystemTopology::ring;
  else
    r.fail("server.topology", fmt::format("expected full_mesh or ring, got '{}'", topo));
  const double mhz = c.chip.clock_mhz;
  c.link = parse_link(r, "server.link", mhz);
  if (c.servers > 1 || !r.children("scale_out").empty()) {  // one server: checked, unused
    c.nic = parse_link(r, "scale_out.nic", mhz);
    c.switch_latency_us = parse_latency(r, "scale_out.switch.latency_us", mhz);
  }
  c.reduce_kernel_launch_us = parse_latency(r, "collective.reduce_kernel_launch_us", mhz);
  return c;
}

}  // namespace

const char* topology_name(SystemTopology t) {
  return t == SystemTopology::ring ? "ring" : "full_mesh";
}

std::string system_config_dir() {
  const char* env = std::getenv("NPUSIM_SYSTEM_DIR");
  if (env && *env) return env;
  return (fs::path(chip_config_dir()).parent_path() / "systems").string();
}

std::vector<std::string> list_system_presets() { return system_presets().names(); }

SystemConfig load_system_config(const std::string& name_or_path,
                                const std::vector<std::string>& overrides) {
  const fs::path file = resolve_config_file(name_or_path, {}, "", system_presets());
  Tree tree = load_tree(file, system_presets());
  std::vector<std::string> chip_overrides;
  for (const std::string& o : overrides) {
    if (starts_with(o, "chip."))
      chip_overrides.push_back(o.substr(5));
    else
      apply_override(tree, o, file.string());
  }
  return parse_system(tree, file.string(), file.stem().string(), chip_overrides);
}

std::string dump_system_config_yaml(const SystemConfig& c, const std::string& chip_file) {
  std::ostringstream o;
  o << fmt::format("# Resolved system '{}' (from {}); schema: docs/configs.md\n", c.name,
                   c.source_file.empty() ? "code" : c.source_file);
  o << fmt::format("name: {}\nchip: {}\nservers: {}\nchips_per_server: {}\n", quote(c.name),
                   quote(chip_file), c.servers, c.chips_per_server);
  o << fmt::format("server:\n  topology: {}\n  link:\n    gbps: {}\n    latency_us: {}\n",
                   topology_name(c.topology), c.link.gbps, c.link.latency_us);
  if (c.servers > 1 || c.nic.gbps > 0)
    o << fmt::format(
        "scale_out:\n  nic:\n    gbps: {}\n    latency_us: {}\n  switch:\n    latency_us: {}\n",
        c.nic.gbps, c.nic.latency_us, c.switch_latency_us);
  o << fmt::format("collective:\n  reduce_kernel_launch_us: {}\n", c.reduce_kernel_launch_us);
  return o.str();
}

}  // namespace npusim
