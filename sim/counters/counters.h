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

// One counter. It accumulates a raw integer; the reported value is raw / scale rounded to the
// nearest integer (time counters accumulate picoseconds and report cycles, scale 1000).
class Counter {
 public:
  Counter(std::string name, std::string unit, std::string desc, uint64_t scale)
      : m_name(std::move(name)), m_unit(std::move(unit)), m_desc(std::move(desc)),
        m_scale(scale) {}
  void add(uint64_t raw) { m_raw += raw; }
  void inc() { ++m_raw; }
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
  uint64_t m_raw = 0;
};

class CounterRegistry {
 public:
  // Registers a counter; throws npusim::Error on an empty or duplicate name, or one that would
  // make a counter an interior node of the tree (or the reverse). The reference stays valid for
  // the registry's lifetime.
  Counter& add(const std::string& name, const std::string& unit, const std::string& desc,
               uint64_t scale = 1);
  // The counter of that name, or nullptr.
  Counter* find(const std::string& name);
  size_t size() const { return m_counters.size(); }

  // Zeroes every counter.
  void reset();
  // Raw values of all counters, in registration order (for dump_since).
  std::vector<uint64_t> snapshot() const;
  // The tree: {"chip": {"aic0": {"mte2": {"busy_cycles": {"value", "unit", "desc"}}}}}.
  nlohmann::json dump() const;
  // The same tree with each counter's growth since `base` (a snapshot; counters registered after
  // it count from zero).
  nlohmann::json dump_since(const std::vector<uint64_t>& base) const;

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
               uint64_t scale = 1) const {
    return m_reg->add(m_prefix + "." + name, unit, desc, scale);
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
