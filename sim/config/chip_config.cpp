// Accessors of ChipConfig. The YAML loader is in config_loader.cpp.
#include "sim/config/chip_config.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {

bool CoreKindConfig::has(isa::Pipe p) const {
  return std::find(pipes.begin(), pipes.end(), p) != pipes.end();
}
bool CoreKindConfig::has(isa::Buf b) const { return buffer_bytes.count(b) != 0; }
uint64_t CoreKindConfig::capacity(isa::Buf b) const {
  auto it = buffer_bytes.find(b);
  return it == buffer_bytes.end() ? 0 : it->second;
}

bool ChipConfig::has_path(isa::Buf src, isa::Buf dst) const {
  return path_bytes_per_cycle.count({src, dst}) != 0;
}
double ChipConfig::path_rate(isa::Buf src, isa::Buf dst) const {
  auto it = path_bytes_per_cycle.find({src, dst});
  if (it == path_bytes_per_cycle.end())
    throw ConfigError(fmt::format("{}: chip '{}' has no data path {}->{}", source_file, name,
                                  isa::buf_name(src), isa::buf_name(dst)));
  return it->second;
}
int ChipConfig::path_latency(isa::Buf src, isa::Buf dst) const {
  auto it = path_latency_cycles.find({src, dst});
  return it == path_latency_cycles.end() ? 0 : it->second;
}

const CoreKindConfig* ChipConfig::core_kind(isa::CoreKind k) const {
  for (const auto& c : core_kinds)
    if (c.kind == k) return &c;
  return nullptr;
}
double ChipConfig::hbm_mixed_bytes_per_cycle(double write_share) const {
  const double minority = std::min(write_share, 1.0 - write_share);
  return hbm_sustained_bytes_per_cycle() * (1.0 - hbm_turnaround_loss * 2.0 * minority);
}
uint64_t ChipConfig::us_to_cycles(double us) const {
  return static_cast<uint64_t>(std::llround(us * clock_mhz));
}
int ChipConfig::total_cores() const {
  int n = 0;
  for (const auto& c : core_kinds) n += c.count;
  return n;
}

}  // namespace npusim
