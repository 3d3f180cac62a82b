#include "adapter/profiler/counter_view.h"

#include <set>

#include "common/error.h"

namespace npusim::prof {
namespace {

bool is_leaf(const nlohmann::json& n) {
  return n.is_object() && n.contains("value") && n.contains("unit");
}

}  // namespace

void flatten_counters(const nlohmann::json& node, const std::string& prefix,
                      std::map<std::string, uint64_t>& out) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string name = prefix.empty() ? it.key() : prefix + "." + it.key();
    if (is_leaf(*it)) out[name] += it->at("value").get<uint64_t>();
    else if (it->is_object()) flatten_counters(*it, name, out);
  }
}

uint64_t CoreCounters::get(const std::string& name) const {
  auto it = values.find(name);
  return it == values.end() ? 0 : it->second;
}

bool CoreCounters::has_pipe(const std::string& pipe) const {
  auto it = values.lower_bound(pipe + ".");
  return it != values.end() && it->first.compare(0, pipe.size() + 1, pipe + ".") == 0;
}

uint64_t LaunchCounters::chip_value(const std::string& name) const {
  auto it = chip.find(name);
  return it == chip.end() ? 0 : it->second;
}

uint64_t LaunchCounters::sum(const std::string& name) const {
  uint64_t total = 0;
  for (const auto& c : cores) total += c.get(name);
  return total;
}

std::map<std::string, uint64_t> LaunchCounters::by_suffix(const std::string& group) const {
  std::map<std::string, uint64_t> out;
  const std::string mid = "." + group + ".";
  for (const auto& c : cores)
    for (const auto& [name, v] : c.values) {
      // "<pipe>.<group>.<x>": the group right after the first component.
      const auto dot = name.find('.');
      if (dot == std::string::npos || name.compare(dot, mid.size(), mid) != 0) continue;
      out[name.substr(dot + mid.size())] += v;
    }
  return out;
}

LaunchCounters read_launch_counters(const nlohmann::json& tree) {
  if (!tree.is_object() || !tree.contains("chip") || !tree["chip"].is_object())
    throw Error("counter tree: no \"chip\" object (expected Simulator counters)");
  LaunchCounters out;
  const nlohmann::json& chip = tree["chip"];
  for (auto it = chip.begin(); it != chip.end(); ++it) {
    if (is_leaf(*it)) {
      out.chip[it.key()] += it->at("value").get<uint64_t>();
      continue;
    }
    if (!it->is_object()) continue;
    if (!it->contains("active_cycles")) {
      flatten_counters(*it, it.key(), out.chip);
      continue;
    }
    CoreCounters core;
    core.name = it.key();
    const std::string kind = core.name.substr(0, core.name.find_first_of("0123456789"));
    auto k = isa::core_kind_from_name(kind);
    if (!k)
      throw Error("counter tree: core '" + core.name + "' is of no known kind (aic, aiv, aicore)");
    core.kind = *k;
    flatten_counters(*it, "", core.values);
    if (core.get("blocks") > 0) out.cores.push_back(std::move(core));
  }
  return out;
}

LaunchCounters read_launch_counters(const CounterDelta& delta) {
  if (delta.is_tree() || delta.size() == 0) return read_launch_counters(delta.tree());
  // As the tree reader: a group under "chip" is a core if it has "active_cycles"; cores in name
  // order (the tree's), other groups' counters flattened into the chip-level ones.
  std::set<std::string> core_names;
  delta.for_each([&](const CounterInfo& c, uint64_t) {
    if (c.path.size() == 3 && c.path[0] == "chip" && c.path[2] == "active_cycles")
      core_names.insert(c.path[1]);
  });
  std::map<std::string, CoreCounters> cores;
  LaunchCounters out;
  bool has_chip = false;
  delta.for_each([&](const CounterInfo& c, uint64_t value) {
    if (c.path.empty() || c.path[0] != "chip") return;
    has_chip = true;
    if (c.path.size() >= 3 && core_names.count(c.path[1])) {
      // The name below the core: everything after "chip.<core>.".
      cores[c.path[1]].values[c.name.substr(6 + c.path[1].size())] += value;
    } else if (c.path.size() >= 2) {
      out.chip[c.name.substr(5)] += value;  // after "chip."
    }
  });
  if (!has_chip) return read_launch_counters(delta.tree());  // its error, as the tree reader's
  for (auto& [name, core] : cores) {
    core.name = name;
    const std::string kind = name.substr(0, name.find_first_of("0123456789"));
    auto k = isa::core_kind_from_name(kind);
    if (!k) throw Error("counter tree: core '" + name + "' is of no known kind (aic, aiv, aicore)");
    core.kind = *k;
    if (core.get("blocks") > 0) out.cores.push_back(std::move(core));
  }
  return out;
}

}  // namespace npusim::prof
