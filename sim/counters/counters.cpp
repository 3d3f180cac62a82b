#include "sim/counters/counters.h"

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {
namespace {

// Splits "a.b.c" into its path components.
std::vector<std::string> split_path(const std::string& name) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t dot = name.find('.', start);
    parts.push_back(name.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

}  // namespace

Counter& CounterRegistry::add(const std::string& name, const std::string& unit,
                              const std::string& desc, uint64_t scale, CounterKind kind) {
  std::vector<std::string> path = split_path(name);
  for (const std::string& part : path)
    if (part.empty()) throw Error(fmt::format("counter name '{}' has an empty component", name));
  if (scale == 0) throw Error(fmt::format("counter '{}': scale must be positive", name));
  if (m_index.count(name)) throw Error(fmt::format("duplicate counter '{}'", name));
  // A leaf may not also be an interior node: "a.b" and "a.b.c" cannot both exist.
  auto next = m_index.lower_bound(name + ".");
  if (next != m_index.end() && next->first.compare(0, name.size() + 1, name + ".") == 0)
    throw Error(fmt::format("counter '{}' would be a leaf and a group ('{}' exists)", name,
                            next->first));
  for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', dot + 1))
    if (m_index.count(name.substr(0, dot)))
      throw Error(fmt::format("counter '{}' would be inside counter '{}'", name,
                              name.substr(0, dot)));
  m_index[name] = m_counters.size();
  m_counters.emplace_back(name, unit, desc, scale, kind);
  m_paths.push_back(std::move(path));
  return m_counters.back();
}

Counter* CounterRegistry::find(const std::string& name) {
  auto it = m_index.find(name);
  return it == m_index.end() ? nullptr : &m_counters[it->second];
}

void CounterRegistry::reset() {
  for (Counter& c : m_counters) c.m_raw = c.m_window = 0;
}

std::vector<uint64_t> CounterRegistry::snapshot() const {
  std::vector<uint64_t> raw;
  raw.reserve(m_counters.size());
  for (const Counter& c : m_counters) {
    raw.push_back(c.m_raw);
    c.m_window = 0;
  }
  return raw;
}

nlohmann::json CounterRegistry::dump() const { return dump_since({}); }

nlohmann::json CounterRegistry::dump_since(const std::vector<uint64_t>& base,
                                           bool changed_only) const {
  nlohmann::json tree = nlohmann::json::object();
  for (size_t i = 0; i < m_counters.size(); ++i) {
    const Counter& c = m_counters[i];
    // After a reset() the raw value may be below the base: count from zero then.
    uint64_t from = i < base.size() && base[i] <= c.m_raw ? base[i] : 0;
    uint64_t raw = c.m_raw - from;
    if (c.m_kind == CounterKind::kHighWater) raw = base.empty() ? c.m_raw : c.m_window;
    const uint64_t value = c.report(raw);
    if (changed_only && value == 0) continue;
    nlohmann::json* node = &tree;
    for (const std::string& part : m_paths[i]) node = &(*node)[part];
    nlohmann::json& leaf = *node;
    leaf["value"] = value;
    leaf["unit"] = c.m_unit;
    leaf["desc"] = c.m_desc;
  }
  return tree;
}

Counter& CounterGroup::get_or_add(const std::string& name, const std::string& unit,
                                  const std::string& desc, uint64_t scale) const {
  if (Counter* c = m_reg->find(m_prefix + "." + name)) return *c;
  return add(name, unit, desc, scale);
}

}  // namespace npusim
