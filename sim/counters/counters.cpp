#include "sim/counters/counters.h"

#include <algorithm>
#include <cstdint>

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

// Writes one leaf {"value", "unit", "desc"} at the counter's path in `tree`.
void add_leaf(nlohmann::json& tree, const CounterInfo& info, uint64_t value) {
  nlohmann::json* node = &tree;
  for (const std::string& part : info.path) node = &(*node)[part];
  nlohmann::json& leaf = *node;
  leaf["value"] = value;
  leaf["unit"] = info.unit;
  leaf["desc"] = info.desc;
}

}  // namespace

nlohmann::json CounterDelta::tree() const {
  if (m_tree) return *m_tree;
  nlohmann::json tree = nlohmann::json::object();
  if (m_values)
    for (const auto& [info, value] : *m_values) add_leaf(tree, *info, value);
  if (!m_root.empty() && !tree.contains(m_root)) tree[m_root] = nlohmann::json::object();
  return tree;
}

CounterRegistry::CounterRegistry() : m_info(std::make_shared<std::deque<CounterInfo>>()) {}

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
  m_info->push_back(CounterInfo{name, std::move(path), unit, desc});
  m_counters.emplace_back(m_info->back(), scale, kind);
  if (kind == CounterKind::kHighWater) m_high_water.push_back(&m_counters.back());
  return m_counters.back();
}

Counter* CounterRegistry::find(const std::string& name) {
  auto it = m_index.find(name);
  return it == m_index.end() ? nullptr : &m_counters[it->second];
}

void CounterRegistry::reset() {
  for (Counter& c : m_counters) c.m_raw = c.m_window = 0;
}

void CounterRegistry::restart_windows() const {
  for (const Counter* c : m_high_water) c->m_window = 0;
}

std::vector<uint64_t> CounterRegistry::snapshot() const {
  std::vector<uint64_t> raw;
  snapshot(raw);
  return raw;
}

void CounterRegistry::snapshot(std::vector<uint64_t>& raw) const {
  raw.resize(m_counters.size());
  size_t i = 0;
  for (const Counter& c : m_counters) {
    raw[i++] = c.m_raw;
    c.m_window = 0;
  }
}

uint64_t CounterRegistry::reported_since(size_t i, const std::vector<uint64_t>& base) const {
  const Counter& c = m_counters[i];
  if (c.m_kind == CounterKind::kHighWater) return c.report(base.empty() ? c.m_raw : c.m_window);
  // After a reset() the raw value may be below the base: count from zero then.
  const uint64_t from = i < base.size() && base[i] <= c.m_raw ? base[i] : 0;
  return c.report(c.m_raw - from);
}

nlohmann::json CounterRegistry::dump() const { return dump_since({}); }

nlohmann::json CounterRegistry::dump_since(const std::vector<uint64_t>& base,
                                           bool changed_only) const {
  nlohmann::json tree = nlohmann::json::object();
  for (size_t i = 0; i < m_counters.size(); ++i) {
    const uint64_t value = reported_since(i, base);
    if (changed_only && value == 0) continue;
    add_leaf(tree, (*m_info)[i], value);
  }
  return tree;
}

CounterDelta CounterRegistry::delta_since(const std::vector<uint64_t>& base) const {
  CounterDelta d;
  d.m_keep = m_info;
  // Most counters of a large chip did not move in a launch: test the raw growth first and
  // compute the reported value (a division) only for those that did.
  auto info = m_info->cbegin();
  size_t i = 0;
  CounterDelta::Values values;
  for (auto c = m_counters.cbegin(); c != m_counters.cend(); ++c, ++info, ++i) {
    const bool moved = c->m_kind == CounterKind::kHighWater
                           ? (base.empty() ? c->m_raw : c->m_window) != 0
                           : c->m_raw != (i < base.size() ? base[i] : 0);
    if (!moved) continue;
    if (const uint64_t value = reported_since(i, base)) values.emplace_back(&*info, value);
  }
  d.m_values = intern(std::move(values));
  return d;
}

void CounterRegistry::raw_values(std::vector<uint64_t>& raw) const {
  raw.resize(m_counters.size());
  for (size_t i = 0; i < m_counters.size(); ++i) raw[i] = m_counters[i].m_raw;
}

CounterDelta CounterRegistry::delta_between(const std::vector<uint64_t>& from,
                                            const std::vector<uint64_t>& to) const {
  CounterDelta d;
  d.m_keep = m_info;
  CounterDelta::Values values;
  for (size_t i = 0; i < m_counters.size(); ++i) {
    const Counter& c = m_counters[i];
    uint64_t value = 0;
    if (c.m_kind == CounterKind::kHighWater) {
      value = c.report(c.m_window);
    } else {
      const uint64_t a = i < from.size() ? from[i] : 0;
      const uint64_t b = i < to.size() ? to[i] : c.m_raw;
      value = b > a ? c.report(b - a) : 0;
    }
    if (value) values.emplace_back(&(*m_info)[i], value);
  }
  d.m_values = intern(std::move(values));
  return d;
}

CounterRegistry::RawDelta CounterRegistry::raw_delta_since(
    const std::vector<uint64_t>& base) const {
  RawDelta d;
  uint32_t i = 0;
  for (auto c = m_counters.cbegin(); c != m_counters.cend(); ++c, ++i) {
    if (c->m_kind == CounterKind::kHighWater) {
      if (c->m_window) d.emplace_back(i, c->m_window);
      continue;
    }
    const uint64_t from = i < base.size() && base[i] <= c->m_raw ? base[i] : 0;
    if (c->m_raw != from) d.emplace_back(i, c->m_raw - from);
  }
  return d;
}

CounterRegistry::RawDelta CounterRegistry::translate(const RawDelta& delta,
                                                     const CounterRegistry& from,
                                                     std::vector<int64_t>& map) {
  if (&from == this) return delta;
  RawDelta out;
  out.reserve(delta.size());
  for (const auto& [i, v] : delta) {
    if (i >= from.m_counters.size())
      throw Error(fmt::format("counter delta names counter {} of a registry of {}", i,
                              from.m_counters.size()));
    if (map.size() <= i) map.resize(i + 1, -1);
    if (map[i] < 0) {
      const Counter& c = from.m_counters[i];
      auto it = m_index.find(c.name());
      if (it != m_index.end()) {
        map[i] = static_cast<int64_t>(it->second);
      } else {
        add(c.name(), c.unit(), c.desc(), c.m_scale, c.m_kind);
        map[i] = static_cast<int64_t>(m_counters.size() - 1);
      }
    }
    out.emplace_back(static_cast<uint32_t>(map[i]), v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void CounterRegistry::apply(const RawDelta& delta) {
  // A replayed launch's delta names counters spread over the registry, which the kernels' own
  // data has evicted from the host's caches since the last launch: each is prefetched a few
  // entries ahead, so that their misses overlap instead of coming one after another.
  constexpr size_t kAhead = 8;
  for (size_t j = 0; j < delta.size(); ++j) {
    if (j + kAhead < delta.size() && delta[j + kAhead].first < m_counters.size())
      __builtin_prefetch(&m_counters[delta[j + kAhead].first], 1);
    const auto& [i, raw] = delta[j];
    Counter& c = m_counters.at(i);
    if (c.m_kind == CounterKind::kHighWater) c.raise_to(raw);
    else c.add(raw);
  }
}

CounterDelta CounterRegistry::delta_of(const RawDelta& delta) const {
  CounterDelta d;
  d.m_keep = m_info;
  // Sums grew by raw since the snapshot; a high-water counter's window (zeroed by the snapshot)
  // was raised to raw: either way the reported value is report(raw).
  CounterDelta::Values values;
  for (const auto& [i, raw] : delta)
    if (const uint64_t value = m_counters[i].report(raw))
      values.emplace_back(&(*m_info)[i], value);
  d.m_values = intern(std::move(values));
  return d;
}

std::shared_ptr<const CounterDelta::Values> CounterRegistry::intern(
    CounterDelta::Values values) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over (counter description address, value)
  for (const auto& [info, value] : values)
    for (uint64_t word : {static_cast<uint64_t>(reinterpret_cast<uintptr_t>(info)), value}) {
      h ^= word;
      h *= 1099511628211ull;
    }
  std::weak_ptr<const CounterDelta::Values>& slot = m_interned[h];
  if (auto alive = slot.lock(); alive && *alive == values) return alive;
  auto fresh = std::make_shared<const CounterDelta::Values>(std::move(values));
  slot = fresh;  // (a hash collision only loses the sharing of the older values)
  if (m_interned.size() > m_interned_sweep) {
    for (auto it = m_interned.begin(); it != m_interned.end();)
      it = it->second.expired() ? m_interned.erase(it) : std::next(it);
    m_interned_sweep = std::max<size_t>(1024, 2 * m_interned.size());
  }
  return fresh;
}

Counter& CounterGroup::get_or_add(const std::string& name, const std::string& unit,
                                  const std::string& desc, uint64_t scale) const {
  if (Counter* c = m_reg->find(m_prefix + "." + name)) return *c;
  return add(name, unit, desc, scale);
}

}  // namespace npusim
