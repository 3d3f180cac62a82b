#include "sim/config/core_taker.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {

int mix_aiv_per_block(const ChipConfig& cfg, const isa::Program& p) {
  const int chip = std::max(1, cfg.aiv_per_aic);
  if (p.aiv_per_aic == 0) return chip;
  if (!cfg.split)
    throw Error(
        fmt::format("kernel '{}' declares {} vector core(s) per cube core (.aiv_per_aic), "
                    "but chip '{}' is coupled: it has no cube and vector cores",
                    p.name, p.aiv_per_aic, cfg.name));
  if (p.aiv_per_aic < 1 || p.aiv_per_aic > chip)
    throw Error(
        fmt::format("kernel '{}' declares {} vector core(s) per cube core (.aiv_per_aic); "
                    "chip '{}' has {} (cores.aiv.per_aic)",
                    p.name, p.aiv_per_aic, cfg.name, chip));
  return p.aiv_per_aic;
}

CoreTaker::CoreTaker(const ChipConfig& cfg) : m_cfg(cfg) {
  for (const CoreKindConfig& k : cfg.core_kinds)
    m_taken[int(k.kind)].assign(size_t(std::max(0, k.count)), false);
}

void CoreTaker::clear() {
  for (auto& t : m_taken) t.assign(t.size(), false);
}

bool CoreTaker::fits_alone(const isa::Program& p, int block_dim) const {
  CoreTaker idle(m_cfg);
  return idle.take(p, block_dim, nullptr);
}

int CoreTaker::idle_workers(const isa::Program& p) const {
  const CoreTaker idle(m_cfg);
  return static_cast<int>(idle.free_workers(p, SIZE_MAX).size());
}

std::vector<std::vector<std::pair<isa::CoreKind, size_t>>> CoreTaker::free_workers(
    const isa::Program& p, size_t want) const {
  const bool aic = p.find(isa::CoreKind::AIC) != nullptr;
  const bool aiv = p.find(isa::CoreKind::AIV) != nullptr;
  std::vector<std::vector<std::pair<isa::CoreKind, size_t>>> out;
  if (m_cfg.split && aic && aiv) {
    // Cube core g pairs with vector cores g * chip_per ...; the block uses the first `per`.
    const size_t chip_per = size_t(std::max(1, m_cfg.aiv_per_aic));
    const size_t per = size_t(mix_aiv_per_block(m_cfg, p));
    const auto& cube = m_taken[int(isa::CoreKind::AIC)];
    const auto& vec = m_taken[int(isa::CoreKind::AIV)];
    for (size_t g = 0; g < cube.size() && out.size() < want; ++g) {
      if (cube[g] || (g + 1) * chip_per > vec.size()) continue;
      bool free = true;
      for (size_t k = 0; k < per; ++k) free = free && !vec[g * chip_per + k];
      if (!free) continue;
      std::vector<std::pair<isa::CoreKind, size_t>> w{{isa::CoreKind::AIC, g}};
      for (size_t k = 0; k < per; ++k) w.emplace_back(isa::CoreKind::AIV, g * chip_per + k);
      out.push_back(std::move(w));
    }
  } else {
    const isa::CoreKind kind = !m_cfg.split ? isa::CoreKind::AICORE
                               : aic        ? isa::CoreKind::AIC
                                            : isa::CoreKind::AIV;
    const auto& taken = m_taken[int(kind)];
    for (size_t i = 0; i < taken.size() && out.size() < want; ++i)
      if (!taken[i]) out.push_back({{kind, i}});
  }
  return out;
}

bool CoreTaker::take(const isa::Program& p, int block_dim, std::vector<std::string>* names) {
  const size_t want = size_t(std::max(1, block_dim));
  const auto picked = free_workers(p, want);
  if (picked.size() < want) return false;
  mark(picked, names);
  return true;
}

int CoreTaker::take_free(const isa::Program& p, int block_dim, std::vector<std::string>* names) {
  const auto picked = free_workers(p, size_t(std::max(1, block_dim)));
  mark(picked, names);
  return static_cast<int>(picked.size());
}

void CoreTaker::mark(const std::vector<std::vector<std::pair<isa::CoreKind, size_t>>>& workers,
                     std::vector<std::string>* names) {
  for (const auto& worker : workers)
    for (const auto& [kind, i] : worker) {
      m_taken[int(kind)][i] = true;
      if (names) names->push_back(isa::core_kind_name(kind) + std::to_string(i));
    }
}

void CoreTaker::hold(const std::vector<std::string>& names) {
  for (const std::string& name : names)
    for (const isa::CoreKind kind :
         {isa::CoreKind::AIC, isa::CoreKind::AIV, isa::CoreKind::AICORE}) {
      const std::string prefix = isa::core_kind_name(kind);
      if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
          name.find_first_not_of("0123456789", prefix.size()) != std::string::npos)
        continue;
      const size_t i = std::stoul(name.substr(prefix.size()));
      auto& taken = m_taken[int(kind)];
      if (i < taken.size()) taken[i] = true;
    }
}

}  // namespace npusim
