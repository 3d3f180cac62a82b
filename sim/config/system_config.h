// A system description: which chip, how many, and the links between them. Loaded from
// configs/systems/<name>.yaml (or a file of one's own) plus overrides, like a chip config.
// Chips are numbered 0..chips()-1, server by server: chip c sits in server c / chips_per_server.
// Inside a server the chips are joined by HCCS links (a full mesh: one link between every pair;
// a ring: links between neighbours only); servers are joined through one NIC per chip and a
// non-blocking switch. Bandwidths are per direction, in GB/s (10^9 B/s).
#pragma once

#include <string>
#include <vector>

#include "sim/config/chip_config.h"

namespace npusim {

struct LinkConfig {
  double gbps = 0;        // per direction
  double latency_us = 0;  // per transfer (DMA start, link and protocol)
};

enum class SystemTopology { full_mesh, ring };
const char* topology_name(SystemTopology t);

struct SystemConfig {
  std::string name;         // preset name, e.g. "910b-x8"
  std::string source_file;  // YAML file it came from (for error messages)
  std::string chip_ref;     // the chip as the file named it (preset or path)
  ChipConfig chip;          // every chip of the system is this one
  int servers = 1;
  int chips_per_server = 1;
  SystemTopology topology = SystemTopology::full_mesh;
  LinkConfig link;               // one in-server (HCCS) link
  LinkConfig nic;                // one chip's NIC (servers > 1)
  double switch_latency_us = 0;  // added to every transfer between servers
  // A reduction HCCL cannot do inline in the DMA (see docs/multichip.md) runs as a vector
  // kernel on the chip's AI vector cores; its launch costs this much.
  double reduce_kernel_launch_us = 0;

  int chips() const { return servers * chips_per_server; }
  int server_of(int chip_index) const { return chip_index / chips_per_server; }
};

// Loads a preset by name (configs/systems/) or a YAML file path, then applies overrides
// "dotted.key=value": keys of the system file, or "chip.<chip key>=value" for a key of its chip's
// config. Errors throw ConfigError naming the file and key.
SystemConfig load_system_config(const std::string& name_or_path,
                                const std::vector<std::string>& overrides = {});
// The directory of the system presets (NPUSIM_SYSTEM_DIR, else configs/systems beside the chip
// presets' directory).
std::string system_config_dir();
std::vector<std::string> list_system_presets();
// The resolved system as YAML; its `chip` key is `chip_file` (where the caller writes
// dump_chip_config_yaml(cfg.chip)), so that the two files load back as this system.
std::string dump_system_config_yaml(const SystemConfig& cfg, const std::string& chip_file);

}  // namespace npusim
