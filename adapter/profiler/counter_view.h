// A launch's counter tree (Simulator counters, sim/counters/counters.h) flattened and grouped the
// way reports read it: the cores that ran, each with its counters by dotted name below the core
// ("mte2.busy_cycles"), and the chip-level counters ("l2.hits", "hbm.read_bytes", "hdc.h2d_bytes").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isa/isa.h"
#include "sim/counters/counters.h"

namespace npusim::prof {

// Adds every counter leaf ({"value", "unit", ...}) under `node` to `out`, named by its dotted path
// relative to `node` with `prefix` in front ("" for none). Values of the same name are summed.
void flatten_counters(const nlohmann::json& node, const std::string& prefix,
                      std::map<std::string, uint64_t>& out);

struct CoreCounters {
  std::string name;                         // "aic0", "aiv3", "aicore5"
  isa::CoreKind kind = isa::CoreKind::AICORE;
  std::map<std::string, uint64_t> values;   // "active_cycles", "m.busy_cycles", "s.stall.barrier"
  uint64_t get(const std::string& name) const;  // 0 if absent
  bool has_pipe(const std::string& pipe) const;  // any counter under "<pipe>."
};

struct LaunchCounters {
  std::vector<CoreCounters> cores;           // cores that completed at least one block
  std::map<std::string, uint64_t> chip;      // counters not under a core: "l2.hits", "launches"
  uint64_t chip_value(const std::string& name) const;  // 0 if absent
  // Sum of `name` over the cores that ran.
  uint64_t sum(const std::string& name) const;
  // Sum over the cores that ran of every counter whose name matches `<pipe>.<group>.<x>` for any
  // pipe, by <x>: group "stall" gives cycles by cause, "bytes" bytes by data path ("gm_to_l1").
  std::map<std::string, uint64_t> by_suffix(const std::string& group) const;
};

// Reads a counter tree {"chip": {...}} (KernelResult::counters, Simulator::counters()). A core is
// a child of "chip" that has an "active_cycles" counter; its kind is its name without the digits.
// Throws npusim::Error if the tree has no "chip" object.
LaunchCounters read_launch_counters(const nlohmann::json& tree);
// The same from a launch's flat delta (the runtime's records), without building the tree: the
// result equals read_launch_counters(delta.tree()).
LaunchCounters read_launch_counters(const CounterDelta& delta);

}  // namespace npusim::prof
