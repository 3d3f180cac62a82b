#include "tools/summary.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "adapter/profiler/counter_view.h"
#include "adapter/profiler/op_metrics.h"
#include "isa/layout.h"

namespace npusim::cli {
namespace {

using nlohmann::json;

uint64_t leaf(const json& node, const std::string& dotted) {
  const json* n = &node;
  size_t pos = 0;
  while (pos <= dotted.size()) {
    size_t dot = dotted.find('.', pos);
    std::string key = dotted.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (!n->is_object() || !n->contains(key)) return 0;
    n = &(*n)[key];
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return n->is_object() && n->contains("value") ? (*n)["value"].get<uint64_t>() : 0;
}

bool is_leaf(const json& n) { return n.is_object() && n.contains("value") && n.contains("unit"); }

const char* kPipeLabels[][2] = {{"s", "scalar"}, {"mte1", "MTE1"}, {"mte2", "MTE2"},
                                {"mte3", "MTE3"}, {"m", "cube"},   {"v", "vector"},
                                {"fix", "FIXPIPE"}};

}  // namespace

double vector_utilization_pct(const ChipConfig& cfg, uint64_t vector_repeats, uint64_t cycles) {
  const prof::ChipPeaks peaks = prof::chip_peaks(cfg);
  if (peaks.vector_bytes_per_cycle <= 0 || cycles == 0) return 0;
  return 100.0 * double(vector_repeats) * vec::kRepeatBytes /
         (peaks.vector_bytes_per_cycle * double(cycles));
}

void merge_buffer_high_water(const json& counters, std::map<std::string, uint64_t>& marks) {
  const json& chip = counters.contains("chip") ? counters["chip"] : counters;
  for (auto core = chip.begin(); core != chip.end(); ++core) {
    if (!core->is_object() || !core->contains("buffer")) continue;
    const json& bufs = (*core)["buffer"];
    for (auto b = bufs.begin(); b != bufs.end(); ++b) {
      uint64_t& m = marks[b.key()];
      m = std::max(m, leaf(*b, "high_water"));
    }
  }
}

void merge_activity(const json& counters, std::map<std::string, uint64_t>& totals) {
  const json& chip = counters.contains("chip") ? counters["chip"] : counters;
  for (const char* mem : {"l2", "hbm"})
    for (const char* dir : {"read_bytes", "write_bytes"})
      totals[fmt::format("{}_{}", mem, dir)] += leaf(chip, fmt::format("{}.{}", mem, dir));
  totals["macs"];
  totals["vector_repeats"];
  for (auto core = chip.begin(); core != chip.end(); ++core) {
    if (!core->is_object() || !core->contains("s")) continue;  // cores have a scalar unit
    totals["macs"] += leaf(*core, "m.macs");
    totals["vector_repeats"] += leaf(*core, "v.repeats");
    for (auto pipe = core->begin(); pipe != core->end(); ++pipe) {
      if (!pipe->is_object() || !pipe->contains("bytes")) continue;
      const json& paths = (*pipe)["bytes"];
      for (auto p = paths.begin(); p != paths.end(); ++p)
        if (is_leaf(*p)) totals["bytes." + p.key()] += p->at("value").get<uint64_t>();
    }
  }
}

int default_block_dim(const isa::Program& prog, const ChipConfig& cfg) {
  if (!cfg.split) {
    const CoreKindConfig* k = cfg.core_kind(isa::CoreKind::AICORE);
    return k ? k->count : 1;
  }
  isa::CoreKind kind = prog.find(isa::CoreKind::AIC) ? isa::CoreKind::AIC : isa::CoreKind::AIV;
  const CoreKindConfig* k = cfg.core_kind(kind);
  return k ? k->count : 1;
}

std::string describe_chip(const ChipConfig& cfg) {
  std::string cores;
  int cube_cores = 0;
  for (const auto& k : cfg.core_kinds) {
    cores += fmt::format("{}{} {}", cores.empty() ? "" : " + ", k.count, isa::core_kind_name(k.kind));
    if (k.has(isa::Pipe::M)) cube_cores += k.count;
  }
  double tflops = 2.0 * cube_cores * cfg.cube_m * cfg.cube_k * cfg.cube_n * cfg.clock_mhz * 1e6 / 1e12;
  return fmt::format("{} ({}), {:.0f} MHz, {:.1f} TFLOPS fp16, HBM {:.0f} GiB at {:.0f} GB/s",
                     cores, cfg.split ? "split" : "coupled", cfg.clock_mhz, tflops,
                     double(cfg.hbm_bytes) / (1ull << 30), cfg.hbm_gbps);
}

void print_summary(std::ostream& out, const ChipConfig& cfg, const std::string& kernel,
                   int block_dim, const KernelResult& r) {
  const json& chip = r.counters.contains("chip") ? r.counters["chip"] : r.counters;
  const double cycles = std::max<double>(1, double(r.cycles));
  out << fmt::format("  {}: {} cycles = {:.2f} us at {:.0f} MHz, block_dim {}\n", kernel, r.cycles,
                     r.time_us, cfg.clock_mhz, block_dim);

  // Per core kind: pipe utilisation averaged over the cores that ran a block.
  std::map<std::string, std::vector<const json*>> cores_by_kind;  // "aic" -> cores
  std::map<std::string, uint64_t> chip_level;
  for (auto it = chip.begin(); it != chip.end(); ++it) {
    if (it->is_object() && it->contains("active_cycles")) {
      if (leaf(*it, "blocks") == 0) continue;
      std::string kind = it.key().substr(0, it.key().find_first_of("0123456789"));
      cores_by_kind[kind].push_back(&*it);
    } else if (it->is_object() && !is_leaf(*it)) {
      prof::flatten_counters(*it, it.key(), chip_level);
    }
  }
  std::map<std::string, uint64_t> paths, stalls;
  for (const auto& [kind, cores] : cores_by_kind) {
    std::string line = fmt::format("  {} x{} busy:", kind, cores.size());
    for (const auto& p : kPipeLabels) {
      uint64_t busy = 0;
      bool present = false;
      for (const json* c : cores) {
        present |= c->contains(p[0]);
        busy += leaf(*c, std::string(p[0]) + ".busy_cycles");
      }
      if (present)
        line += fmt::format(" {} {:.0f}%", p[1], 100.0 * busy / cycles / double(cores.size()));
    }
    out << line << "\n";
    uint64_t macs = 0;
    for (const json* c : cores) {
      macs += leaf(*c, "m.macs");
      std::map<std::string, uint64_t> flat;
      prof::flatten_counters(*c, "", flat);
      for (const auto& [name, v] : flat) {
        auto b = name.find("bytes.");
        if (b != std::string::npos) paths[name.substr(b + 6)] += v;
        auto s = name.find("stall.");
        if (s != std::string::npos) stalls[name.substr(s + 6)] += v;
      }
    }
    if (macs) {
      double peak = double(cfg.cube_m) * cfg.cube_k * cfg.cube_n * cycles * double(cores.size());
      out << fmt::format("  cube utilisation {:.1f}% of peak over the {} cores that ran\n",
                         100.0 * double(macs) / peak, cores.size());
    }
  }
  if (!paths.empty()) {
    std::string line = "  bytes moved:";
    for (const auto& [path, v] : paths)
      line += fmt::format(" {} {:.2f} MiB", path, double(v) / (1 << 20));
    out << line << "\n";
  }
  if (!stalls.empty()) {
    std::string line = "  stall cycles (sum over cores):";
    for (const auto& [cause, v] : stalls)
      if (v) line += fmt::format(" {} {}", cause, v);
    out << line << "\n";
  }
  if (!chip_level.empty()) {
    std::string line = "  memory system:";
    for (const auto& [name, v] : chip_level)
      if (v) line += fmt::format(" {} {}", name, v);
    out << line << "\n";
  }
}

}  // namespace npusim::cli
