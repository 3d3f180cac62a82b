// Statistics of the chip model: a registry of named counters forming a tree after the module
// hierarchy ("chip.aic0.mte2.busy_cycles"). Every counter has a unit and a one-line description;
// registering a name twice, or a name that is a prefix path of another counter, is rejected.
// Reset and dump are functions of the registry. No SystemC in here.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace npusim {

// How a counter combines what it is given: a sum (add/inc), or a high-water mark (raise_to: the
// largest value seen, e.g. the highest byte offset of a buffer any instruction touched).
enum class CounterKind { kSum, kHighWater };

// One counter. It accumulates a raw integer; the reported value is raw / scale rounded to the
// nearest integer (time counters accumulate picoseconds and report cycles, scale 1000).
class Counter {
 public:
  Counter(std::string name, std::string unit, std::string desc, uint64_t scale,
          CounterKind kind = CounterKind::kSum)
      : m_name(std::move(name)), m_unit(std::move(unit)), m_desc(std::move(desc)),
        m_scale(scale), m_kind(kind) {}
  void add(uint64_t raw) { m_raw += raw; }
  void inc() { ++m_raw; }
  // High-water counters: raw = max(raw, v); also raises the maximum since the last snapshot.
  void raise_to(uint64_t v) {
    if (v > m_raw) m_raw = v;
    if (v > m_window) m_window = v;
  }
  CounterKind kind() const { return m_kind; }
  uint64_t raw() const { return m_raw; }
  // The reported value of a raw amount of this counter.
  uint64_t report(uint64_t raw) const { return (raw + m_scale / 2) / m_scale; }
  uint64_t value() const { return report(m_raw); }
  const std::string& name() const { return m_name; }
  const std::string& unit() const { return m_unit; }
  const std::string& desc() const { return m_desc; }

 private:
  friend class CounterRegistry;
  std::string m_name, m_unit, m_desc;
  uint64_t m_scale;
  CounterKind m_kind;
  uint64_t m_raw = 0;
  // High-water counters: the maximum since the registry's last snapshot() (which restarts it).
  mutable uint64_t m_window = 0;
};

class CounterRegistry {
 public:
  // Registers a counter; throws npusim::Error on an empty or duplicate name, or one that would
  // make a counter an interior node of the tree (or the reverse). The reference stays valid for
  // the registry's lifetime.
  Counter& add(const std::string& name, const std::string& unit, const std::string& desc,
               uint64_t scale = 1, CounterKind kind = CounterKind::kSum);
  // The counter of that name, or nullptr.
  Counter* find(const std::string& name);
  size_t size() const { return m_counters.size(); }

  // Zeroes every counter.
  void reset();
  // Raw values of all counters, in registration order (for dump_since). Also starts a new window
  // for every high-water counter (see dump_since).
  std::vector<uint64_t> snapshot() const;
  // The tree: {"chip": {"aic0": {"mte2": {"busy_cycles": {"value", "unit", "desc"}}}}}.
  // A high-water counter reports its maximum since construction or reset().
  nlohmann::json dump() const;
  // The same tree with each counter's growth since `base` (a snapshot; counters registered after
  // it count from zero). A high-water counter reports the maximum it was raised to since the
  // latest snapshot() instead, so `base` must be that latest snapshot for the two to agree.
  // changed_only: leave out the counters whose reported value is 0 (a launch's tree then holds
  // only the cores and units that worked: a few hundred leaves instead of thousands on a large
  // chip, which is most of a small launch's wall time). Readers treat a missing counter as 0.
  nlohmann::json dump_since(const std::vector<uint64_t>& base, bool changed_only = false) const;

 private:
  std::deque<Counter> m_counters;                   // stable addresses
  std::deque<std::vector<std::string>> m_paths;     // each counter's name split at '.'
  std::map<std::string, size_t> m_index;            // name -> position
};

// A registry view with a name prefix, for a module to register its counters under its path.
class CounterGroup {
 public:
  CounterGroup(CounterRegistry& reg, std::string prefix)
      : m_reg(&reg), m_prefix(std::move(prefix)) {}
  CounterGroup sub(const std::string& name) const { return {*m_reg, m_prefix + "." + name}; }
  Counter& add(const std::string& name, const std::string& unit, const std::string& desc,
               uint64_t scale = 1, CounterKind kind = CounterKind::kSum) const {
    return m_reg->add(m_prefix + "." + name, unit, desc, scale, kind);
  }
  // The counter `name` under this group, registering it on first use (for counters created
  // lazily, e.g. one per opcode actually executed).
  Counter& get_or_add(const std::string& name, const std::string& unit, const std::string& desc,
                      uint64_t scale = 1) const;
  const std::string& prefix() const { return m_prefix; }

 private:
  CounterRegistry* m_reg;
  std::string m_prefix;
};

}  // namespace npusim
