#include "adapter/profiler/runtime_report.h"

#include <algorithm>
#include <cctype>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include <fmt/format.h>

#include "adapter/profiler/counter_view.h"
#include "adapter/profiler/report_writer.h"
#include "common/error.h"
#include "isa/layout.h"
#include "sim/counters/trace.h"

namespace npusim::prof {
namespace {

using nlohmann::json;

// Trace ids: host and chip processes first; cores from pid 100
// (trace_events::kCorePidBase, sim/counters/trace.h).
constexpr uint32_t kHostPid = 1, kChipPid = 2;
constexpr uint32_t kTfOpsTid = 1, kH2dTid = 2, kD2hTid = 3, kDeviceCopyTid = 4, kKernelTid = 1;
constexpr uint32_t kAiCpuTid = 2;  // the chip's AI CPU tasks (docs/runtime.md)

using trace_events::meta;

// Without a program: the task type from the kinds of the cores that ran.
std::string task_type_from_counters(const CounterDelta& counters, const ChipConfig& cfg) {
  if (!cfg.split) return "AI_CORE";
  bool cube = false, vector = false;
  for (const CoreCounters& c : read_launch_counters(counters).cores) {
    cube |= c.kind == isa::CoreKind::AIC;
    vector |= c.kind == isa::CoreKind::AIV;
  }
  if (cube && vector) return "MIX_AIC";
  return cube ? "AI_CORE" : "AI_VECTOR_CORE";
}

std::vector<TensorDesc> tensor_descs(const std::vector<rt::LaunchTensor>& ts) {
  std::vector<TensorDesc> out;
  for (const rt::LaunchTensor& t : ts) out.push_back({t.shape, t.dtype, "ND"});
  return out;
}

const char* copy_lane_name(rt::OpKind k) {
  switch (k) {
    case rt::OpKind::memcpy_h2d: return "h2d";
    case rt::OpKind::memcpy_d2h: return "d2h";
    default: return "d2d/memset";
  }
}

const char* copy_name(rt::OpKind k) {
  switch (k) {
    case rt::OpKind::memcpy_h2d: return "memcpy_h2d";
    case rt::OpKind::memcpy_d2h: return "memcpy_d2h";
    case rt::OpKind::memcpy_d2d: return "memcpy_d2d";
    case rt::OpKind::memset8: return "memset8";
    case rt::OpKind::memset32: return "memset32";
    default: return "copy";
  }
}

uint32_t copy_tid(rt::OpKind k) {
  switch (k) {
    case rt::OpKind::memcpy_h2d: return kH2dTid;
    case rt::OpKind::memcpy_d2h: return kD2hTid;
    default: return kDeviceCopyTid;
  }
}

std::string bytes_text(double b) {
  if (b >= double(1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (b >= double(1ull << 20)) return fmt::format("{:.2f} MiB", b / double(1ull << 20));
  if (b >= 1024) return fmt::format("{:.2f} KiB", b / 1024);
  return fmt::format("{:.0f} B", b);
}

std::string pct(double part, double whole) {
  return whole > 0 ? fmt::format("{:.1f}%", 100.0 * part / whole) : std::string("-");
}

// The overlap of [a0, a1) and [b0, b1).
uint64_t overlap(uint64_t a0, uint64_t a1, uint64_t b0, uint64_t b1) {
  const uint64_t lo = std::max(a0, b0), hi = std::min(a1, b1);
  return hi > lo ? hi - lo : 0;
}

// Busy-cycle sums per unit of one side over several ops, for a weighted ratio.
struct SideSums {
  uint64_t total = 0;
  std::map<std::string, double> busy;
  void add(const SideMetrics& s) {
    if (!s.present) return;
    total += s.total_cycles;
    for (const auto& [unit, r] : s.ratio) busy[unit] += r * static_cast<double>(s.total_cycles);
  }
  template <size_t N>
  std::string text(const char* label, const UnitRatio (&units)[N]) const {
    if (total == 0) return "";
    std::string line = fmt::format(" {}:", label);
    for (const UnitRatio& u : units) {
      auto it = busy.find(u.name);
      line += fmt::format(" {} {}", u.name, pct(it == busy.end() ? 0 : it->second, double(total)));
    }
    return line;
  }
};

// summary.txt's device memory section from extra["device_memory"] (RuntimeReportInput::extra);
// empty without it.
std::string device_memory_text(const json& extra) {
  if (!extra.is_object() || !extra.contains("device_memory") ||
      !extra["device_memory"].is_object())
    return "";
  const json& m = extra["device_memory"];
  const auto num = [&](const char* key) { return m.value(key, uint64_t{0}); };
  std::ostringstream o;
  o << "\nDevice memory:\n";
  o << fmt::format(
      "  TensorFlow's allocator (the runtime's): peak {} in the window (since the report began, "
      "or the device opened), {} in use now\n",
      bytes_text(double(num("allocator_peak_bytes"))),
      bytes_text(double(num("allocator_in_use_bytes"))));
  if (num("graph_plans") == 0) {
    o << "  whole-graph static memory plans: none (no NpuGraph ran)\n";
  } else {
    o << fmt::format(
        "  whole-graph static memory plans (NpuGraph arenas, docs/graph_engine.md): {} plans, {} "
        "arenas held now, {} (the plans' device memory, inside the allocator's figures); largest "
        "plan {} ({} without reuse)\n",
        num("graph_plans"), num("arenas_held"), bytes_text(double(num("arena_bytes_held"))),
        bytes_text(double(num("max_arena_bytes"))),
        bytes_text(double(num("max_unplanned_bytes"))));
  }
  return o.str();
}

// The ops (indices into `ops`) that started in a phase's window.
std::vector<size_t> phase_ops(const std::vector<OpRecord>& ops, const ReportPhase& p) {
  std::vector<size_t> out;
  for (size_t i = 0; i < ops.size(); ++i)
    if (ops[i].start_cycle >= p.origin_cycle &&
        (p.end_cycle == 0 || ops[i].start_cycle < p.end_cycle))
      out.push_back(i);
  return out;
}

// summary.txt's "Where the time goes": the simulated time (the window's origin to the last
// kernel's end) as rows that add up to it: each kind of work's kernel time without the task
// overheads, the task overheads of every launch, and the waits between kernels split by what
// filled them (wait_breakdown; host dispatch and copies capped at the waits they sit in).
std::string time_split_text(const RuntimeReportInput& in, const std::vector<OpRecord>& ops,
                            const std::vector<OpMetrics>& ms) {
  const ChipConfig& cfg = *in.config;
  struct Row {
    uint64_t launches = 0, work_cycles = 0, kernel_cycles = 0, hbm_bytes = 0;
    double bound_cycles = 0;
  };
  std::map<WorkKind, Row> rows;
  uint64_t overhead = 0, last_end = in.origin_cycle, hbm_read = 0, hbm_write = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    Row& r = rows[work_kind(ops[i].op_type, ms[i])];
    const uint64_t oh = std::min(ms[i].task_overhead_cycles, ops[i].cycles);
    ++r.launches;
    r.work_cycles += ops[i].cycles - oh;
    r.kernel_cycles += ops[i].cycles;
    r.hbm_bytes += ms[i].hbm_read_bytes + ms[i].hbm_write_bytes;
    r.bound_cycles += ms[i].roofline_bound_cycles;
    overhead += oh;
    hbm_read += ms[i].hbm_read_bytes;
    hbm_write += ms[i].hbm_write_bytes;
    last_end = std::max(last_end, ops[i].start_cycle + ops[i].cycles);
  }
  const double span = double(last_end - in.origin_cycle);
  const WaitBreakdown w = wait_breakdown(ops, in.copies, in.origin_cycle);
  const uint64_t dispatch = std::min(w.host_dispatch_cycles, w.wait_cycles);
  const uint64_t copies =
      std::min(w.h2d_cycles + w.d2h_cycles + w.device_cycles, w.wait_cycles - dispatch);
  const uint64_t other = w.wait_cycles - dispatch - copies;

  std::ostringstream o;
  o << fmt::format(
      "\nWhere the time goes (the simulated time, {:.3f} us, as rows that add up to it; the kind "
      "of work from each launch's op type and counters, docs/reports.md):\n",
      cfg.cycles_to_us(span));
  o << fmt::format("  {:<34} {:>8} {:>12} {:>7} {:>12} {:>11} {:>11} {:>8}\n", "row", "launches",
                   "time(us)", "share", "kernels(us)", "HBM bytes", "bound(us)", "x bound");
  for (WorkKind k : {WorkKind::cube, WorkKind::attention, WorkKind::vector, WorkKind::slice_update,
                     WorkKind::data_movement}) {
    const Row& r = rows[k];
    const std::string ratio =
        r.bound_cycles > 0 ? fmt::format("{:.2f}", double(r.kernel_cycles) / r.bound_cycles) : "-";
    o << fmt::format("  {:<34} {:>8} {:>12.3f} {:>7} {:>12.3f} {:>11} {:>11.3f} {:>8}\n",
                     std::string(work_kind_name(k)) + " (w/o task overheads)", r.launches,
                     cfg.cycles_to_us(double(r.work_cycles)), pct(double(r.work_cycles), span),
                     cfg.cycles_to_us(double(r.kernel_cycles)), bytes_text(double(r.hbm_bytes)),
                     cfg.cycles_to_us(r.bound_cycles), ratio);
  }
  const auto row = [&](const std::string& name, uint64_t cycles) {
    o << fmt::format("  {:<34} {:>8} {:>12.3f} {:>7}\n", name, "", cfg.cycles_to_us(double(cycles)),
                     pct(double(cycles), span));
  };
  row(fmt::format("task overheads ({} launches)", ops.size()), overhead);
  row("waits: host dispatch", dispatch);
  row("waits: copies and fills", copies);
  row("waits: other", other);
  const double hbm_us = cfg.cycles_to_us(double(hbm_read + hbm_write) /
                                         std::max(chip_peaks(cfg).hbm_bytes_per_cycle, 1e-9));
  o << fmt::format(
      "  HBM: {} read, {} written by the kernels; at the chip's HBM rate that takes {:.3f} us "
      "(the window's memory roofline): simulated time {} x it, kernel time {} x it\n",
      bytes_text(double(hbm_read)), bytes_text(double(hbm_write)), hbm_us,
      hbm_us > 0 ? fmt::format("{:.2f}", cfg.cycles_to_us(span) / hbm_us) : "-",
      hbm_us > 0 ? fmt::format("{:.2f}", cfg.cycles_to_us(span - double(w.wait_cycles)) / hbm_us)
                 : "-");
  return o.str();
}

// summary.txt's "Phases": per phase name (first-marked first) its occurrences, launches and
// times, and the rate of its items.
std::string phases_text(const RuntimeReportInput& in, const std::vector<OpRecord>& ops) {
  if (in.phases.empty()) return "";
  const ChipConfig& cfg = *in.config;
  std::vector<std::string> names;
  std::map<std::string, std::vector<const ReportPhase*>> by_name;
  for (const ReportPhase& p : in.phases) {
    if (!by_name.count(p.name)) names.push_back(p.name);
    by_name[p.name].push_back(&p);
  }
  std::ostringstream o;
  o << "\nPhases (npusim.mark_phase; the report of each name's last occurrence is in "
       "phases/<name>/; time = the phase's start to its last kernel's end, kernels = its first "
       "launch's start to its last launch's end):\n";
  o << fmt::format("  {:<20} {:>6} {:>9} {:>12} {:>12} {:>12} {:>12}  {}\n", "phase", "times",
                   "launches", "time(us)", "min(us)", "max(us)", "kernels(us)", "rate (mean time)");
  for (const std::string& name : names) {
    const std::vector<const ReportPhase*>& occ = by_name[name];
    double sum = 0, lo = 0, hi = 0, kernels = 0, items = 0;
    uint64_t launches = 0;
    std::string unit;
    for (size_t k = 0; k < occ.size(); ++k) {
      const std::vector<size_t> idx = phase_ops(ops, *occ[k]);
      double t = 0, kt = 0;
      if (!idx.empty()) {
        uint64_t end = 0;
        for (size_t i : idx) end = std::max(end, ops[i].start_cycle + ops[i].cycles);
        t = cfg.cycles_to_us(double(end - occ[k]->origin_cycle));
        kt = cfg.cycles_to_us(double(end - ops[idx.front()].start_cycle));
      }
      sum += t;
      kernels += kt;
      lo = k == 0 ? t : std::min(lo, t);
      hi = std::max(hi, t);
      launches += idx.size();
      items += occ[k]->items;
      if (!occ[k]->unit.empty()) unit = occ[k]->unit;
    }
    const double n = double(occ.size()), mean = sum / n;
    const std::string rate =
        items > 0 && mean > 0
            ? fmt::format("{:.1f} {}/s", items / n / (mean * 1e-6), unit.empty() ? "items" : unit)
            : "-";
    o << fmt::format("  {:<20} {:>6} {:>9.1f} {:>12.3f} {:>12.3f} {:>12.3f} {:>12.3f}  {}\n", name,
                     occ.size(), double(launches) / n, mean, lo, hi, kernels / n, rate);
  }
  return o.str();
}

std::string appendix(const RuntimeReportInput& in, const std::vector<OpRecord>& ops,
                     const std::vector<OpMetrics>& ms) {
  const ChipConfig& cfg = *in.config;
  std::ostringstream o;
  uint64_t last_end = in.origin_cycle;
  for (const OpRecord& op : ops) last_end = std::max(last_end, op.start_cycle + op.cycles);
  const double span = double(last_end - in.origin_cycle);

  const std::vector<OpTypeSummary> types = op_type_summary(in.launches, cfg);
  double all_us = 0;
  for (const OpTypeSummary& t : types) all_us += t.time_us;
  o << "\nTF ops by op type (runs = TF op executions; tasks = their kernel launches):\n";
  o << fmt::format("  {:<28} {:>6} {:>6} {:>12} {:>7} {:>8} {:>9}\n", "op type", "runs", "tasks",
                   "time(us)", "share", "cube %", "vector %");
  for (const OpTypeSummary& t : types)
    o << fmt::format("  {:<28} {:>6} {:>6} {:>12.3f} {:>7} {:>8.2f} {:>9.2f}\n", t.op_type,
                     t.count, t.tasks, t.time_us, pct(t.time_us, all_us),
                     t.cube_utilization_pct, t.vector_utilization_pct);

  o << time_split_text(in, ops, ms);
  o << phases_text(in, ops);

  o << "\nUtilisation per unit by op type (busy / active cycles, summed over the ops' cores):\n";
  std::map<std::string, std::pair<SideSums, SideSums>> by_type;
  for (size_t i = 0; i < ops.size(); ++i) {
    by_type[ops[i].op_type].first.add(ms[i].aic);
    by_type[ops[i].op_type].second.add(ms[i].aiv);
  }
  for (const OpTypeSummary& t : types) {
    const auto& [aic, aiv] = by_type[t.op_type];
    std::string line = fmt::format("  {:<28}", t.op_type);
    line += aic.text(cfg.split ? "aic" : "aicore", kCubeSideUnits);
    line += aiv.text(cfg.split ? "aiv" : "aicore vector side", kVectorSideUnits);
    o << line << "\n";
  }

  o << "\nHDC link and device copies (runtime records in the report's window):\n";
  struct CopySums {
    uint64_t n = 0, bytes = 0, cycles = 0;
  };
  std::map<std::string, CopySums> copies;
  for (const rt::CopyRecord& c : in.copies) {
    CopySums& s = copies[copy_lane_name(c.kind)];
    ++s.n;
    s.bytes += c.bytes;
    s.cycles += c.cycles;
  }
  for (const char* lane : {"h2d", "d2h", "d2d/memset"}) {
    const CopySums& s = copies[lane];
    const double us = cfg.cycles_to_us(double(s.cycles));
    o << fmt::format("  {:<10} {} copies, {}, busy {:.3f} us", lane, s.n,
                     bytes_text(double(s.bytes)), us);
    if (us > 0) o << fmt::format(" ({:.2f} GB/s achieved)", double(s.bytes) / (us * 1e-6) / 1e9);
    o << "\n";
  }

  const WaitBreakdown w = wait_breakdown(ops, in.copies, in.origin_cycle);
  const uint64_t known = w.h2d_cycles + w.d2h_cycles + w.device_cycles + w.host_dispatch_cycles;
  const uint64_t other = w.wait_cycles > known ? w.wait_cycles - known : 0;
  o << fmt::format(
      "\nWaits between kernels: {:.3f} us ({} of the simulated time; task time + waits = "
      "simulated time)\n",
      cfg.cycles_to_us(double(w.wait_cycles)), pct(double(w.wait_cycles), span));
  o << fmt::format("  waiting for data (host->device copies before a kernel): {:.3f} us ({})\n",
                   cfg.cycles_to_us(double(w.h2d_cycles)), pct(double(w.h2d_cycles), span));
  o << fmt::format("  host dispatch of the ops (host.op_dispatch_us, docs/runtime.md): {:.3f} us "
                   "({})\n",
                   cfg.cycles_to_us(double(w.host_dispatch_cycles)),
                   pct(double(w.host_dispatch_cycles), span));
  o << fmt::format("  device->host copies: {:.3f} us; d2d copies and memsets: {:.3f} us; "
                   "other: {:.3f} us\n",
                   cfg.cycles_to_us(double(w.d2h_cycles)),
                   cfg.cycles_to_us(double(w.device_cycles)), cfg.cycles_to_us(double(other)));
  if (w.after_last_copies)
    o << fmt::format("  after the last kernel (not in the simulated time): {} copies, {:.3f} us\n",
                     w.after_last_copies, cfg.cycles_to_us(double(w.after_last_cycles)));

  o << "\nCPU-fallback ops (TF ops of the run placed on the CPU):";
  const json fallback = in.extra.is_object() && in.extra.contains("cpu_fallback_ops")
                            ? in.extra["cpu_fallback_ops"]
                            : json();
  if (fallback.is_null()) {
    o << " not available\n";
  } else if (fallback.empty()) {
    o << " none\n";
  } else if (fallback.is_object()) {
    o << "\n";
    for (auto it = fallback.begin(); it != fallback.end(); ++it)
      o << "  " << it.key() << ": "
        << (it->is_string() ? it->get<std::string>() : it->dump()) << "\n";
  } else if (fallback.is_array()) {
    o << "\n";
    for (const json& e : fallback) o << "  " << (e.is_string() ? e.get<std::string>() : e.dump()) << "\n";
  } else {
    o << " " << fallback.dump() << "\n";
  }

  o << device_memory_text(in.extra);

  if (in.pipe_trace) {
    const PipeTraceCollector::Stats s = in.pipe_trace->stats();
    const PipeTraceOptions opt = in.pipe_trace->options();
    o << fmt::format(
        "\nTrace (trace.json): instruction detail for the first {} of {} launches seen since "
        "profiling started ({} events{}); later launches as kernel and TF op spans only. Limits: "
        "{} launches, {} events (NPUSIM_TRACE_DETAIL_LAUNCHES, NPUSIM_TRACE_MAX_EVENTS, or "
        "npusim.profile(trace_launches=, trace_max_events=)).\n",
        s.launches_detailed, s.launches_seen, s.events,
        s.dropped_events ? fmt::format(", {} dropped at the event limit", s.dropped_events) : "",
        opt.detail_launches, opt.max_events);
  } else {
    o << "\nTrace (trace.json): kernel and TF op spans only (no instruction detail collected).\n";
  }
  return o.str();
}

}  // namespace

void check_phase_name(const std::string& name) {
  const bool ok = !name.empty() && name != "." && name != ".." &&
                  std::all_of(name.begin(), name.end(), [](char c) {
                    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' ||
                           c == '.';
                  });
  if (!ok)
    throw Error(fmt::format("report phase '{}': a phase name is letters, digits, '_', '-' and "
                            "'.' (it names the folder phases/<name>/)",
                            name));
}

const char* work_kind_name(WorkKind k) {
  switch (k) {
    case WorkKind::attention: return "attention";
    case WorkKind::slice_update: return "slice updates";
    case WorkKind::cube: return "cube products";
    case WorkKind::vector: return "vector ops";
    case WorkKind::data_movement: return "data movement";
  }
  return "unknown";
}

WorkKind work_kind(const std::string& op_type, const OpMetrics& m) {
  if (op_type.find("Attention") != std::string::npos) return WorkKind::attention;
  if (op_type.find("DynamicUpdateSlice") != std::string::npos ||
      op_type.find("Scatter") != std::string::npos)
    return WorkKind::slice_update;
  if (m.macs > 0) return WorkKind::cube;
  if (m.vector_repeats > 0) return WorkKind::vector;
  return WorkKind::data_movement;
}

std::vector<std::pair<uint64_t, uint64_t>> kernel_spans(
    const std::vector<rt::LaunchRecord>& launches) {
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const rt::LaunchRecord& l : launches)
    spans.push_back({l.start_cycle, l.start_cycle + l.cycles});
  for (size_t i = 0; i + 1 < spans.size(); ++i) {
    const uint64_t next = spans[i + 1].first;
    if (spans[i].second > next && spans[i].second - next <= 1 && next >= spans[i].first)
      spans[i].second = next;
  }
  return spans;
}

std::vector<AiCpuTaskRow> ai_cpu_rows(const std::vector<rt::AiCpuRecord>& tasks,
                                      uint64_t origin_cycle) {
  std::vector<AiCpuTaskRow> rows;
  uint64_t last_end = origin_cycle;
  for (const rt::AiCpuRecord& t : tasks) {
    AiCpuTaskRow& a = rows.emplace_back();
    a.op_name = t.label ? t.label->op_name : t.kernel;
    a.op_type = t.label ? t.label->op_type : t.kernel;
    if (t.label) {
      a.inputs = tensor_descs(t.label->inputs);
      a.outputs = tensor_descs(t.label->outputs);
    }
    a.stream = t.stream;
    a.start_cycle = t.start_cycle;
    a.cycles = t.cycles;
    a.wait_cycles = t.start_cycle - std::min(last_end, t.start_cycle);
    last_end = std::max(last_end, t.start_cycle + t.cycles);
  }
  return rows;
}

std::vector<OpRecord> op_records(const std::vector<rt::LaunchRecord>& launches,
                                 const ChipConfig& cfg) {
  const std::vector<std::pair<uint64_t, uint64_t>> spans = kernel_spans(launches);
  std::vector<OpRecord> ops;
  for (size_t i = 0; i < launches.size(); ++i) {
    ops.push_back(op_record(launches[i], cfg));
    ops.back().cycles = spans[i].second - spans[i].first;
  }
  return ops;
}

OpRecord op_record(const rt::LaunchRecord& r, const ChipConfig& cfg) {
  OpRecord op;
  if (r.label) {
    op.op_name = r.label->op_name.empty() ? r.kernel : r.label->op_name;
    op.op_type = r.label->op_type.empty() ? r.kernel : r.label->op_type;
    op.inputs = tensor_descs(r.label->inputs);
    op.outputs = tensor_descs(r.label->outputs);
    op.members = r.label->members;
  } else {
    op.op_name = op.op_type = r.kernel;
  }
  op.kernel = r.kernel;
  op.task_type = r.program ? task_type_of(*r.program, cfg)
                           : task_type_from_counters(r.counter_delta, cfg);
  op.stream = r.stream;
  op.chip = r.chip;
  op.start_cycle = r.start_cycle;
  op.cycles = r.cycles;
  op.host_dispatch_cycles = r.host_dispatch_cycles;
  op.block_dim = r.block_dim;
  op.mix_block_dim = r.program ? mix_block_dim_of(*r.program, cfg, r.block_dim)
                    : op.task_type == "MIX_AIC" ? r.block_dim * std::max(1, cfg.aiv_per_aic)
                                                : 0;
  op.counters = r.counter_delta;
  return op;
}

std::vector<OpTypeSummary> op_type_summary(const std::vector<rt::LaunchRecord>& launches,
                                           const ChipConfig& cfg, size_t top) {
  struct Acc {
    OpTypeSummary s;
    std::set<uint64_t> dispatches;
    uint64_t undispatched = 0, cycles = 0, macs = 0, repeats = 0;
  };
  std::map<std::string, Acc> by;
  const std::vector<OpRecord> ops = op_records(launches, cfg);
  for (size_t i = 0; i < ops.size(); ++i) {
    const rt::LaunchRecord& r = launches[i];
    const OpRecord& op = ops[i];
    const LaunchCounters lc = read_launch_counters(op.counters);
    Acc& a = by[op.op_type];
    a.s.op_type = op.op_type;
    ++a.s.tasks;
    if (r.label && r.label->dispatch) a.dispatches.insert(r.label->dispatch);
    else ++a.undispatched;
    a.cycles += op.cycles;
    a.macs += lc.sum("m.macs");
    a.repeats += lc.sum("v.repeats");
  }
  const ChipPeaks peaks = chip_peaks(cfg);
  std::vector<OpTypeSummary> out;
  for (auto& [type, a] : by) {
    a.s.count = a.dispatches.size() + a.undispatched;
    a.s.time_us = cfg.cycles_to_us(double(a.cycles));
    if (a.cycles && peaks.macs_per_cycle > 0)
      a.s.cube_utilization_pct = 100.0 * double(a.macs) / (peaks.macs_per_cycle * double(a.cycles));
    if (a.cycles && peaks.vector_bytes_per_cycle > 0)
      a.s.vector_utilization_pct = 100.0 * double(a.repeats) * vec::kRepeatBytes /
                                   (peaks.vector_bytes_per_cycle * double(a.cycles));
    out.push_back(a.s);
  }
  std::stable_sort(out.begin(), out.end(), [](const OpTypeSummary& a, const OpTypeSummary& b) {
    return a.time_us > b.time_us;
  });
  if (top > 0 && out.size() > top) out.resize(top);
  return out;
}

WaitBreakdown wait_breakdown(const std::vector<OpRecord>& ops,
                             const std::vector<rt::CopyRecord>& copies, uint64_t origin_cycle) {
  WaitBreakdown w;
  uint64_t prev_end = origin_cycle;
  std::vector<std::pair<uint64_t, uint64_t>> gaps;  // [prev_end, start) of each wait
  for (const OpRecord& op : ops) {
    if (op.start_cycle > prev_end) gaps.emplace_back(prev_end, op.start_cycle);
    w.wait_cycles += op.start_cycle > prev_end ? op.start_cycle - prev_end : 0;
    w.host_dispatch_cycles += op.host_dispatch_cycles;
    prev_end = std::max(prev_end, op.start_cycle + op.cycles);
  }
  // Copies and gaps are both in timeline order: walk them together.
  size_t g = 0;
  for (const rt::CopyRecord& c : copies) {
    const uint64_t c0 = c.start_cycle, c1 = c.start_cycle + c.cycles;
    while (g < gaps.size() && gaps[g].second <= c0) ++g;
    uint64_t in_gaps = 0;
    for (size_t k = g; k < gaps.size() && gaps[k].first < c1; ++k)
      in_gaps += overlap(c0, c1, gaps[k].first, gaps[k].second);
    if (c.kind == rt::OpKind::memcpy_h2d) w.h2d_cycles += in_gaps;
    else if (c.kind == rt::OpKind::memcpy_d2h) w.d2h_cycles += in_gaps;
    else w.device_cycles += in_gaps;
    if (c0 + 1 >= prev_end) {  // (starts are rounded down: a cycle's tolerance)
      ++w.after_last_copies;
      w.after_last_cycles += c.cycles;
    }
  }
  return w;
}

std::vector<TfOpSpan> tf_op_spans(const std::vector<rt::LaunchRecord>& launches,
                                  const std::vector<OpRecord>& ops) {
  std::map<uint64_t, TfOpSpan> spans;  // by dispatch id, which grows with dispatch order
  for (size_t i = 0; i < ops.size() && i < launches.size(); ++i) {
    const rt::LaunchRecord& r = launches[i];
    if (!r.label || !r.label->dispatch) continue;
    auto [it, fresh] = spans.try_emplace(r.label->dispatch);
    TfOpSpan& s = it->second;
    if (fresh) {
      s.start_cycle = ops[i].start_cycle;
      s.first_task = i;
    }
    s.start_cycle = std::min(s.start_cycle, ops[i].start_cycle);
    s.end_cycle = std::max(s.end_cycle, ops[i].start_cycle + ops[i].cycles);
    s.tasks.push_back(i);
    s.kernels.push_back(r.kernel);
  }
  std::vector<TfOpSpan> out;
  for (auto& [id, s] : spans) out.push_back(std::move(s));
  return out;
}

void pipe_trace_events(const RuntimeReportInput& in,
                       const std::function<void(std::string_view)>& emit) {
  if (!in.pipe_trace) return;
  // Each detailed launch moves by the runtime's modelled time before it (LaunchRecord:
  // start_cycle - sim_start_cycle); the collector saw it begin at sim_start_cycle.
  std::unordered_map<uint64_t, int64_t> offset_by_sim_start;
  for (const rt::LaunchRecord& r : in.launches)
    offset_by_sim_start[r.sim_start_cycle] =
        static_cast<int64_t>(r.start_cycle - r.sim_start_cycle) * 1000;
  in.pipe_trace->write_events(
      in.config->clock_mhz,
      [&](uint64_t begin_ps) -> int64_t {
        auto it = offset_by_sim_start.find(begin_ps / 1000);
        return it == offset_by_sim_start.end() ? -1 : it->second;
      },
      emit);
}

json runtime_trace(const RuntimeReportInput& in, const std::vector<OpRecord>& ops) {
  const ChipConfig& cfg = *in.config;
  auto us = [&](uint64_t cycles) { return cfg.cycles_to_us(double(cycles)); };
  json ev = json::array();
  ev.push_back(meta("process_name", kHostPid, -1, "name", "host"));
  ev.push_back(meta("process_sort_index", kHostPid, -1, "sort_index", 0));
  const std::pair<uint32_t, const char*> host_lanes[] = {
      {kTfOpsTid, "TF ops"}, {kH2dTid, "h2d"}, {kD2hTid, "d2h"}, {kDeviceCopyTid, "d2d/memset"}};
  for (const auto& [tid, name] : host_lanes) {
    ev.push_back(meta("thread_name", kHostPid, tid, "name", name));
    ev.push_back(meta("thread_sort_index", kHostPid, tid, "sort_index", tid));
  }
  ev.push_back(meta("process_name", kChipPid, -1, "name", "chip"));
  ev.push_back(meta("process_sort_index", kChipPid, -1, "sort_index", 1));
  ev.push_back(meta("thread_name", kChipPid, kKernelTid, "name", "kernels"));
  if (!in.ai_cpu.empty()) ev.push_back(meta("thread_name", kChipPid, kAiCpuTid, "name", "AI CPU"));
  for (const rt::AiCpuRecord& t : in.ai_cpu)
    ev.push_back({{"ph", "X"}, {"pid", kChipPid}, {"tid", kAiCpuTid}, {"ts", us(t.start_cycle)},
                  {"dur", us(t.cycles)}, {"name", t.kernel}, {"cat", "ai_cpu"},
                  {"args", {{"op_name", t.label ? t.label->op_name : t.kernel},
                            {"stream", t.stream}}}});

  for (const TfOpSpan& s : tf_op_spans(in.launches, ops)) {
    const OpRecord& op = ops[s.first_task];
    ev.push_back({{"ph", "X"}, {"pid", kHostPid}, {"tid", kTfOpsTid}, {"ts", us(s.start_cycle)},
                  {"dur", us(s.end_cycle - s.start_cycle)}, {"name", op.op_name}, {"cat", "tf_op"},
                  {"args", {{"op_type", op.op_type}, {"first_task_id", s.first_task},
                            {"kernels", s.kernels}}}});
  }
  for (const rt::CopyRecord& c : in.copies)
    ev.push_back({{"ph", "X"}, {"pid", kHostPid}, {"tid", copy_tid(c.kind)},
                  {"ts", us(c.start_cycle)}, {"dur", us(c.cycles)},
                  {"name", copy_name(c.kind)}, {"cat", "copy"},
                  {"args", {{"bytes", c.bytes}, {"stream", c.stream}}}});
  for (size_t i = 0; i < ops.size(); ++i) {
    const OpRecord& op = ops[i];
    ev.push_back({{"ph", "X"}, {"pid", kChipPid}, {"tid", kKernelTid}, {"ts", us(op.start_cycle)},
                  {"dur", us(op.cycles)}, {"name", op.kernel.empty() ? op.op_name : op.kernel},
                  {"cat", "kernel"},
                  {"args", {{"task_id", i}, {"op_name", op.op_name}, {"op_type", op.op_type},
                            {"task_type", op.task_type}, {"block_dim", op.block_dim},
                            {"ok", in.launches[i].ok}}}});
    if (!op.members.empty()) ev.back()["args"]["members"] = op.members;
  }

  json other = {{"clock_mhz", cfg.clock_mhz}, {"launches", ops.size()}};
  if (in.pipe_trace) {
    // The pipe trace's events follow (pipe_trace_events, streamed as trace.json is written).
    const PipeTraceCollector::Stats s = in.pipe_trace->stats();
    other["detail_launches"] = s.launches_detailed;
    other["launches_seen"] = s.launches_seen;
    other["instruction_events"] = s.events;
    other["dropped_events"] = s.dropped_events;
  }
  return {{"traceEvents", std::move(ev)}, {"displayTimeUnit", "ns"}, {"otherData", other}};
}

std::vector<std::string> write_runtime_report(const std::string& dir,
                                              const RuntimeReportInput& in) {
  if (!in.config) throw Error("report: no chip config given");
  for (const ReportPhase& p : in.phases) check_phase_name(p.name);
  ReportInput r;
  r.title = in.title;
  r.config = in.config;
  r.ops = op_records(in.launches, *in.config);
  set_wait_cycles(r.ops, in.origin_cycle);
  r.origin_cycle = in.origin_cycle;
  r.per_op_utilisation = false;
  // Per-launch counter trees for as many launches as the trace details (the pipe collector's
  // detail_launches, default 50), so counters.json stays small for a whole training run.
  r.counter_detail_ops =
      in.pipe_trace ? in.pipe_trace->options().detail_launches : PipeTraceOptions{}.detail_launches;
  std::vector<OpMetrics> ms;
  for (size_t i = 0; i < r.ops.size(); ++i) {
    try {
      ms.push_back(compute_op_metrics(r.ops[i], *in.config));
    } catch (const Error& e) {
      throw Error(fmt::format("report: op {} ('{}'): {}", i, r.ops[i].op_name, e.what()));
    }
  }
  r.comms = in.comms;
  r.ai_cpu = ai_cpu_rows(in.ai_cpu, in.origin_cycle);
  r.other_chip_kernels = in.other_chip_kernels;
  r.summary_appendix = appendix(in, r.ops, ms);
  r.metrics = &ms;
  r.tables_written = in.tables_written;
  const json trace = runtime_trace(in, r.ops);
  r.trace = &trace;
  if (in.pipe_trace)
    r.trace_events_tail = [&in](const std::function<void(std::string_view)>& emit) {
      pipe_trace_events(in, emit);
    };
  std::vector<std::string> files = write_report(dir, r);

  // Each phase name's last occurrence: the same files of its launches, copies and collectives.
  std::map<std::string, const ReportPhase*> last;
  std::map<std::string, size_t> count;
  for (const ReportPhase& p : in.phases) {
    last[p.name] = &p;
    ++count[p.name];
  }
  for (const auto& [name, p] : last) {
    RuntimeReportInput sub;
    sub.title = fmt::format("{}: phase {} (occurrence {} of {})", in.title, name, count[name],
                            count[name]);
    sub.config = in.config;
    sub.origin_cycle = p->origin_cycle;
    const auto inside = [&](uint64_t start) {
      return start >= p->origin_cycle && (p->end_cycle == 0 || start < p->end_cycle);
    };
    for (size_t i = 0; i < in.launches.size(); ++i)
      if (inside(r.ops[i].start_cycle)) sub.launches.push_back(in.launches[i]);
    for (const rt::CopyRecord& c : in.copies)
      if (inside(c.start_cycle)) sub.copies.push_back(c);
    for (const CommRecord& c : in.comms)
      if (inside(c.start_cycle)) sub.comms.push_back(c);
    for (const rt::AiCpuRecord& t : in.ai_cpu)
      if (inside(t.start_cycle)) sub.ai_cpu.push_back(t);
    sub.extra = in.extra;
    if (sub.extra.is_object()) sub.extra.erase("device_memory");  // the whole window's figures
    for (std::string& f : write_runtime_report(dir + "/phases/" + name, sub))
      files.push_back(std::move(f));
  }
  return files;
}

}  // namespace npusim::prof
