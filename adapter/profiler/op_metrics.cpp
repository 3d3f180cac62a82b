#include "adapter/profiler/op_metrics.h"

#include <algorithm>

#include "adapter/profiler/counter_view.h"
#include "isa/layout.h"
#include "sim/config/core_taker.h"

namespace npusim::prof {
namespace {

template <size_t N>
SideMetrics side_metrics(const std::vector<const CoreCounters*>& cores, const UnitRatio (&units)[N],
                         const ChipConfig& cfg) {
  SideMetrics m;
  if (cores.empty()) return m;
  m.present = true;
  m.cores = static_cast<int>(cores.size());
  for (const CoreCounters* c : cores) m.total_cycles += c->get("active_cycles");
  m.time_us = cfg.cycles_to_us(static_cast<double>(m.total_cycles) / m.cores);
  for (const UnitRatio& d : units) {
    // A counter tree without the unit's counter (inflight_cycles came later) falls back to
    // busy_cycles.
    uint64_t busy = 0;
    const std::string pipe(d.pipe);
    for (const CoreCounters* c : cores)
      busy += c->values.count(pipe + "." + d.counter) ? c->get(pipe + "." + d.counter)
                                                      : c->get(pipe + ".busy_cycles");
    m.ratio[d.name] = m.total_cycles ? static_cast<double>(busy) / m.total_cycles : 0.0;
  }
  return m;
}

double ratio_or_zero(const SideMetrics& s, const char* name) {
  auto it = s.ratio.find(name);
  return s.present && it != s.ratio.end() ? it->second : 0.0;
}

}  // namespace

std::string msprof_dtype(isa::Dtype t) {
  switch (t) {
    case isa::Dtype::F32: return "DT_FLOAT";
    case isa::Dtype::F16: return "DT_FLOAT16";
    case isa::Dtype::BF16: return "DT_BF16";
    case isa::Dtype::S32: return "DT_INT32";
    case isa::Dtype::S16: return "DT_INT16";
    case isa::Dtype::S8: return "DT_INT8";
    case isa::Dtype::U8: return "DT_UINT8";
    case isa::Dtype::U16: return "DT_UINT16";
    case isa::Dtype::S64: return "DT_INT64";
    case isa::Dtype::NONE: break;
  }
  return "UNDEFINED";
}

std::string task_type_of(const isa::Program& prog, const ChipConfig& cfg) {
  if (!cfg.split) return "AI_CORE";
  const bool cube = prog.find(isa::CoreKind::AIC) != nullptr;
  const bool vector = prog.find(isa::CoreKind::AIV) != nullptr;
  if (cube && vector) return "MIX_AIC";
  return cube ? "AI_CORE" : "AI_VECTOR_CORE";
}

int mix_block_dim_of(const isa::Program& prog, const ChipConfig& cfg, int block_dim) {
  return task_type_of(prog, cfg) == "MIX_AIC" ? block_dim * mix_aiv_per_block(cfg, prog) : 0;
}

void set_wait_cycles(std::vector<OpRecord>& ops, uint64_t origin_cycle) {
  uint64_t prev_end = origin_cycle;
  for (OpRecord& op : ops) {
    op.wait_cycles = op.start_cycle > prev_end ? op.start_cycle - prev_end : 0;
    prev_end = std::max(prev_end, op.start_cycle + op.cycles);
  }
}

ChipPeaks chip_peaks(const ChipConfig& cfg) {
  ChipPeaks p;
  for (const CoreKindConfig& k : cfg.core_kinds) {
    if (k.has(isa::Pipe::M)) p.cube_cores += k.count;
    if (k.has(isa::Pipe::V)) p.vector_cores += k.count;
  }
  p.macs_per_cycle = static_cast<double>(cfg.cube_m) * cfg.cube_k * cfg.cube_n * p.cube_cores;
  p.vector_bytes_per_cycle = static_cast<double>(cfg.vector_bytes_per_cycle) * p.vector_cores;
  p.hbm_bytes_per_cycle = cfg.hbm_bytes_per_cycle();
  return p;
}

double roofline_cycles(const ChipPeaks& peaks, uint64_t macs, uint64_t vector_repeats,
                             uint64_t hbm_bytes) {
  double bound = 0;
  if (peaks.macs_per_cycle > 0) bound = std::max(bound, macs / peaks.macs_per_cycle);
  if (peaks.vector_bytes_per_cycle > 0)
    bound = std::max(bound, static_cast<double>(vector_repeats) * vec::kRepeatBytes /
                                peaks.vector_bytes_per_cycle);
  if (peaks.hbm_bytes_per_cycle > 0)
    bound = std::max(bound, static_cast<double>(hbm_bytes) / peaks.hbm_bytes_per_cycle);
  return bound;
}

OpMetrics compute_op_metrics(const OpRecord& op, const ChipConfig& cfg) {
  OpMetrics m;
  m.start_us = cfg.cycles_to_us(static_cast<double>(op.start_cycle));
  m.duration_us = cfg.cycles_to_us(static_cast<double>(op.cycles));
  m.wait_us = cfg.cycles_to_us(static_cast<double>(op.wait_cycles));
  const LaunchCounters lc = read_launch_counters(op.counters);
  m.task_overhead_cycles = lc.chip_value("task_overhead_cycles");
  m.task_overhead_us = cfg.cycles_to_us(static_cast<double>(m.task_overhead_cycles));

  // Cube side: aic cores, or the coupled chip's aicore cores; vector side: aiv or aicore.
  std::vector<const CoreCounters*> cube_cores, vector_cores;
  for (const CoreCounters& c : lc.cores) {
    if (c.kind == isa::CoreKind::AIC || c.kind == isa::CoreKind::AICORE) cube_cores.push_back(&c);
    if (c.kind == isa::CoreKind::AIV || c.kind == isa::CoreKind::AICORE)
      vector_cores.push_back(&c);
  }
  m.aic = side_metrics(cube_cores, kCubeSideUnits, cfg);
  m.aiv = side_metrics(vector_cores, kVectorSideUnits, cfg);

  m.macs = lc.sum("m.macs");
  m.vector_repeats = lc.sum("v.repeats");
  const ChipPeaks peaks = chip_peaks(cfg);
  if (op.cycles && peaks.macs_per_cycle > 0)
    m.cube_utilization_pct =
        100.0 * static_cast<double>(m.macs) /
        (peaks.macs_per_cycle * static_cast<double>(op.cycles));

  const double compute = std::max(ratio_or_zero(m.aic, "mac"), ratio_or_zero(m.aiv, "vec"));
  const double mte2 = std::max(ratio_or_zero(m.aic, "mte2"), ratio_or_zero(m.aiv, "mte2"));
  if (compute > 0) m.memory_bound = mte2 / compute;

  m.path_bytes = lc.by_suffix("bytes");
  for (const auto& [path, bytes] : m.path_bytes) {
    if (path.rfind("gm_to_", 0) == 0) m.gm_read_bytes += bytes;
    if (path.size() > 6 && path.compare(path.size() - 6, 6, "_to_gm") == 0)
      m.gm_write_bytes += bytes;
  }
  m.hbm_read_bytes = lc.chip_value("hbm.read_bytes");
  m.hbm_write_bytes = lc.chip_value("hbm.write_bytes");
  m.l2_hits = lc.chip_value("l2.hits");
  m.l2_misses = lc.chip_value("l2.misses");
  if (m.l2_hits + m.l2_misses)
    m.l2_hit_rate = static_cast<double>(m.l2_hits) / static_cast<double>(m.l2_hits + m.l2_misses);
  m.stall_cycles = lc.by_suffix("stall");

  const double bound =
      roofline_cycles(peaks, m.macs, m.vector_repeats, m.hbm_read_bytes + m.hbm_write_bytes);
  m.roofline_bound_cycles = bound;
  m.roofline_bound_us = cfg.cycles_to_us(bound);
  if (bound > 0) m.roofline_ratio = static_cast<double>(op.cycles) / bound;
  return m;
}

}  // namespace npusim::prof
