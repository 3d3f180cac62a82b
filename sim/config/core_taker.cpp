#include "sim/config/core_taker.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {

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

bool CoreTaker::take(const isa::Program& p, int block_dim, std::vector<std::string>* names) {
  const size_t want = size_t(std::max(1, block_dim));
  const bool aic = p.find(isa::CoreKind::AIC) != nullptr;
  const bool aiv = p.find(isa::CoreKind::AIV) != nullptr;
  std::vector<std::pair<isa::CoreKind, size_t>> picked;
  if (m_cfg.split && aic && aiv) {
    const size_t per = size_t(std::max(1, m_cfg.aiv_per_aic));
    const auto& cube = m_taken[int(isa::CoreKind::AIC)];
    const auto& vec = m_taken[int(isa::CoreKind::AIV)];
    for (size_t g = 0; g < cube.size() && picked.size() < want * (1 + per); ++g) {
      if (cube[g] || (g + 1) * per > vec.size()) continue;
      bool free = true;
      for (size_t k = 0; k < per; ++k) free = free && !vec[g * per + k];
      if (!free) continue;
      picked.emplace_back(isa::CoreKind::AIC, g);
      for (size_t k = 0; k < per; ++k) picked.emplace_back(isa::CoreKind::AIV, g * per + k);
    }
    if (picked.size() < want * (1 + per)) return false;
  } else {
    const isa::CoreKind kind = !m_cfg.split ? isa::CoreKind::AICORE
                               : aic        ? isa::CoreKind::AIC
                                            : isa::CoreKind::AIV;
    const auto& taken = m_taken[int(kind)];
    for (size_t i = 0; i < taken.size() && picked.size() < want; ++i)
      if (!taken[i]) picked.emplace_back(kind, i);
    if (picked.size() < want) return false;
  }
  for (const auto& [kind, i] : picked) {
    m_taken[int(kind)][i] = true;
    if (names) names->push_back(isa::core_kind_name(kind) + std::to_string(i));
  }
  return true;
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

namespace {

// The core kinds a program runs on, as a bit per isa::CoreKind.
unsigned core_kinds(const ChipConfig& cfg, const isa::Program& p) {
  if (!cfg.split) return 1u << int(isa::CoreKind::AICORE);
  return (p.find(isa::CoreKind::AIC) ? 1u << int(isa::CoreKind::AIC) : 0u) |
         (p.find(isa::CoreKind::AIV) ? 1u << int(isa::CoreKind::AIV) : 0u);
}

}  // namespace

std::vector<std::vector<std::string>> take_stream_cores(const ChipConfig& cfg,
                                                        std::vector<StreamLaunch>* launches) {
  const size_t n = launches->size();
  std::vector<std::vector<std::string>> cores(n);
  // waits[i][j]: launch i waits for launch j (j < i), directly or through others.
  std::vector<std::vector<char>> waits(n);
  std::vector<unsigned> kinds(n, 0);
  CoreTaker taker(cfg);
  for (size_t i = 0; i < n; ++i) {
    StreamLaunch& l = (*launches)[i];
    if (!l.program) throw Error(fmt::format("launch {} has no program", i));
    kinds[i] = core_kinds(cfg, *l.program);
    if (!taker.fits_alone(*l.program, l.block_dim))
      throw Error(
          fmt::format("launch {} (kernel '{}', block_dim {}) does not fit the chip's "
                      "cores of its kind",
                      i, l.program->name, l.block_dim));
    waits[i].assign(i, 0);
    const auto wait_for = [&](size_t j) {
      waits[i][j] = 1;
      for (size_t k = 0; k < j; ++k) waits[i][k] = waits[i][k] || waits[j][k];
    };
    for (const size_t j : l.after) {
      if (j >= i)
        throw Error(
            fmt::format("launch {} (kernel '{}') waits for launch {}, which is not "
                        "earlier",
                        i, l.program->name, j));
      wait_for(j);
    }
    for (;;) {
      taker.clear();
      size_t latest = i;  // the latest launch it may overlap on a kind of its own
      for (size_t j = 0; j < i; ++j)
        if (!waits[i][j]) {
          taker.hold(cores[j]);
          if (kinds[j] & kinds[i]) latest = j;
        }
      cores[i].clear();
      if (taker.take(*l.program, l.block_dim, &cores[i])) break;
      // Too few free: some launch it may overlap holds cores of its kind (it fits alone).
      if (latest == i)
        throw Error(
            fmt::format("launch {} (kernel '{}') finds no free cores, yet no launch it "
                        "may overlap runs on its kind",
                        i, l.program->name));
      l.after.push_back(latest);
      wait_for(latest);
    }
  }
  return cores;
}

}  // namespace npusim
