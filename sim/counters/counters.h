// Statistics of the chip model: a registry of named counters forming a tree after the module
// hierarchy ("chip.aic0.mte2.busy_cycles"). Every counter has a unit and a one-line description;
// registering a name twice, or a name that is a prefix path of another counter, is rejected.
// Reset and dump are functions of the registry. No SystemC in here.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace npusim {

// How a counter combines what it is given: a sum (add/inc), or a high-water mark (raise_to: the
// largest value seen, e.g. the highest byte offset of a buffer any instruction touched).
enum class CounterKind { kSum, kHighWater };

// What a counter is, apart from its value: its name (and the name split at '.'), its unit and
// description. Immutable once registered; Counter and CounterDelta refer to it.
struct CounterInfo {
  std::string name;
  std::vector<std::string> path;
  std::string unit, desc;
};

// One counter. It accumulates a raw integer; the reported value is raw / scale rounded to the
// nearest integer (time counters accumulate picoseconds and report cycles, scale 1000).
class Counter {
 public:
  // `info` is owned by the registry and outlives the counter.
  Counter(const CounterInfo& info, uint64_t scale, CounterKind kind = CounterKind::kSum)
      : m_info(&info), m_scale(scale), m_kind(kind) {}
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
  const std::string& name() const { return m_info->name; }
  const std::string& unit() const { return m_info->unit; }
  const std::string& desc() const { return m_info->desc; }

 private:
  friend class CounterRegistry;
  // Only the value and what reporting it needs live here: a registry scans every counter per
  // launch (snapshot, delta_since), so counters are kept small and dense.
  const CounterInfo* m_info;
  uint64_t m_scale;
  CounterKind m_kind;
  uint64_t m_raw = 0;
  // High-water counters: the maximum since the registry's last snapshot() (which restarts it).
  mutable uint64_t m_window = 0;
};

// A launch's counter growth stored flat: (counter, reported value) for each counter whose
// reported value is nonzero, in registration order. tree() builds the JSON tree that
// CounterRegistry::dump_since(base, changed_only = true) gives, so a launch pays for the tree
// only when someone reads it. A delta keeps the counters' descriptions alive by itself: it may be
// copied to and read on any thread, also after the registry is gone (the registry only appends
// descriptions, never moves or changes them).
class CounterDelta {
 public:
  CounterDelta() = default;
  // A delta that is a ready tree (records built by hand, e.g. in tests); tree() returns it.
  explicit CounterDelta(nlohmann::json tree)
      : m_tree(std::make_shared<const nlohmann::json>(std::move(tree))) {}
  // {"chip": {"aic0": {"mte2": {"busy_cycles": {"value", "unit", "desc"}}}}}; with a root set
  // (set_root), that top-level group is present even if empty.
  nlohmann::json tree() const;
  // The top-level group tree() always contains (the Simulator's "chip").
  void set_root(std::string root) { m_root = std::move(root); }
  // Number of counters that changed (of a ready tree: 0).
  size_t size() const { return m_values ? m_values->size() : 0; }
  // Whether this delta is a ready tree (the JSON constructor): then only tree() reads it.
  bool is_tree() const { return m_tree != nullptr; }
  // Calls f(const CounterInfo&, uint64_t value) for each counter of a flat delta, in
  // registration order, without building the tree (nothing for a ready tree: see is_tree).
  template <class F>
  void for_each(F&& f) const {
    if (m_values)
      for (const auto& [info, value] : *m_values) f(*info, value);
  }
  // The counters of this flat delta that `keep(info)` accepts, in the same order, with the same
  // root (a ready tree gives an empty delta). E.g. one launch's cores among concurrent ones.
  template <class Keep>
  CounterDelta filtered(Keep&& keep) const {
    CounterDelta d;
    d.m_keep = m_keep;
    d.m_root = m_root;
    auto values = std::make_shared<Values>();
    for_each([&](const CounterInfo& info, uint64_t value) {
      if (keep(info)) values->emplace_back(&info, value);
    });
    d.m_values = std::move(values);
    return d;
  }
  // Whether both hold one stored copy of their values (equal deltas built while another was
  // alive share it: CounterRegistry::intern). For memory accounting and its tests.
  bool shares_values(const CounterDelta& other) const {
    return m_values && m_values == other.m_values;
  }

 private:
  friend class CounterRegistry;
  using Values = std::vector<std::pair<const CounterInfo*, uint64_t>>;
  std::shared_ptr<const void> m_keep;  // the registry's description store
  // Immutable once built, so copies share it: the records of a replayed launch all share the
  // values of its recording (RecordedLaunch::delta) instead of holding ~1500 pairs each on a
  // large chip, and a long training run's launch records stay small.
  std::shared_ptr<const Values> m_values;
  std::shared_ptr<const nlohmann::json> m_tree;
  std::string m_root;
};

class CounterRegistry {
 public:
  CounterRegistry();
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
  // The same into `raw` (reusing its storage: no allocation once it has grown).
  void snapshot(std::vector<uint64_t>& raw) const;
  // Only the new window of every high-water counter that snapshot() starts (what a replayed
  // launch, which needs no raw values, must do: no pass over every counter).
  void restart_windows() const;
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
  // dump_since(base, true) as a flat delta: the same counters and values, no tree built.
  CounterDelta delta_since(const std::vector<uint64_t>& base) const;
  // Raw values of all counters, as snapshot() gives them, without starting new high-water
  // windows (a point inside a launch group: Chip's ordered launches).
  void raw_values(std::vector<uint64_t>& raw) const;
  // The counters that grew from `from` to `to` (raw_values or snapshot vectors; a counter past
  // the end of `to` counts its value now, past the end of `from` from zero) as a flat delta; a
  // high-water counter reports its maximum since the latest snapshot() (the group's).
  CounterDelta delta_between(const std::vector<uint64_t>& from,
                             const std::vector<uint64_t>& to) const;

  // A launch's raw growth, to be applied again later (the launch replay, sim/replay/): for each
  // counter that moved since `base` (the latest snapshot), its index and its raw growth (sums)
  // or its maximum since the snapshot (high-water counters).
  using RawDelta = std::vector<std::pair<uint32_t, uint64_t>>;
  RawDelta raw_delta_since(const std::vector<uint64_t>& base) const;
  // Applies a RawDelta of this registry: sums grow by it, high-water counters are raised to it,
  // exactly as if the recorded launch had run again.
  void apply(const RawDelta& delta);
  // What delta_since(base) returns after snapshot(base) and apply(delta), from the delta alone
  // (no pass over every counter of the chip).
  CounterDelta delta_of(const RawDelta& delta) const;
  // A RawDelta of registry `from` as one of this registry: each counter's index becomes that of
  // the counter of the same name here, registered now (with from's unit, description, scale and
  // kind) if this registry has none yet; sorted by index, as raw_delta_since gives it. For the
  // chips of a system, whose registries name their counters alike ("chip.aic0...") but may
  // register the lazily created ones in another order: a launch recorded on one chip replays on
  // another. `map` caches the index mapping between the two registries (keep one per `from`).
  RawDelta translate(const RawDelta& delta, const CounterRegistry& from,
                     std::vector<int64_t>& map);

 private:
  // Counter i's growth since base, as reported (dump_since's rules).
  uint64_t reported_since(size_t i, const std::vector<uint64_t>& base) const;
  // `values` as a delta's shared values: equal to those of a delta still alive, that one's.
  // Launches of one kernel that ran alike (most launches of a training loop that could not be
  // replayed at their new addresses) then keep one copy between all their records.
  std::shared_ptr<const CounterDelta::Values> intern(CounterDelta::Values values) const;

  std::deque<Counter> m_counters;                   // stable addresses
  std::vector<Counter*> m_high_water;               // the kHighWater ones
  // Each counter's description, in registration order; shared with the deltas that name it.
  std::shared_ptr<std::deque<CounterInfo>> m_info;
  std::map<std::string, size_t> m_index;            // name -> position
  // intern()'s table: values by hash; entries whose deltas are all gone are swept now and then.
  mutable std::unordered_map<uint64_t, std::weak_ptr<const CounterDelta::Values>> m_interned;
  mutable size_t m_interned_sweep = 1024;  // sweep when the table grows past this
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
