#include "adapter/profiler/report_writer.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "adapter/profiler/counter_view.h"
#include "common/error.h"

namespace npusim::prof {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kNa = "N/A";  // msprof's cell for a figure that does not apply

std::string us_text(double us) { return fmt::format("{:.3f}", us); }
std::string ratio_text(double r) { return fmt::format("{:.4f}", r); }
std::string opt_text(const std::optional<double>& v) { return v ? ratio_text(*v) : kNa; }

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

// msprof lists tensors separated by ';', dimensions by ','.
std::string shapes_text(const std::vector<TensorDesc>& ts) {
  std::vector<std::string> parts;
  for (const TensorDesc& t : ts) {
    std::vector<std::string> dims;
    for (int64_t d : t.shape) dims.push_back(std::to_string(d));
    parts.push_back(join(dims, ","));
  }
  return join(parts, ";");
}
std::string dtypes_text(const std::vector<TensorDesc>& ts) {
  std::vector<std::string> parts;
  for (const TensorDesc& t : ts) parts.push_back(t.dtype);
  return join(parts, ";");
}
std::string formats_text(const std::vector<TensorDesc>& ts) {
  std::vector<std::string> parts;
  for (const TensorDesc& t : ts) parts.push_back(t.format);
  return join(parts, ";");
}

class CsvFile {
 public:
  explicit CsvFile(const std::string& path) : m_path(path), m_out(path) {
    if (!m_out) throw Error("report: cannot write '" + path + "'");
  }
  void row(const std::vector<std::string>& cells) {
    for (size_t i = 0; i < cells.size(); ++i) m_out << (i ? "," : "") << csv_field(cells[i]);
    m_out << "\n";
  }
  void close() {
    m_out.close();
    if (!m_out) throw Error("report: writing '" + m_path + "' failed");
  }

 private:
  std::string m_path;
  std::ofstream m_out;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) throw Error("report: cannot write '" + path + "'");
  out << text;
  out.close();
  if (!out) throw Error("report: writing '" + path + "' failed");
}

// trace.json: `trace` (an object) as its dump() writes it, with `tail`'s events streamed at the
// end of its traceEvents array (created if missing), written through a buffer so that neither
// the events nor the file's text are held whole.
void write_trace(const std::string& path, const json& trace,
                 const std::function<void(const std::function<void(std::string_view)>&)>& tail) {
  if (!tail) return write_text(path, trace.dump() + "\n");
  if (!trace.is_object() && !trace.is_null())
    throw Error("report: trace.json's document is not an object");
  const json empty = json::array();
  const json& events = trace.contains("traceEvents") ? trace.at("traceEvents") : empty;
  if (!events.is_array()) throw Error("report: trace.json's traceEvents is not an array");
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Error("report: cannot write '" + path + "'");
  constexpr size_t kFlushBytes = 1 << 20;
  std::string buf;
  auto flush = [&]() {
    out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    buf.clear();
  };
  // The object's keys in dump()'s order (sorted), traceEvents among them.
  std::map<std::string, const json*> keys;
  if (trace.is_object())
    for (auto it = trace.begin(); it != trace.end(); ++it) keys[it.key()] = &it.value();
  keys.emplace("traceEvents", &events);
  buf += '{';
  bool first_key = true;
  for (const auto& [key, value] : keys) {
    if (!first_key) buf += ',';
    first_key = false;
    buf += json(key).dump();
    buf += ':';
    if (key != "traceEvents") {
      buf += value->dump();
      continue;
    }
    buf += '[';
    bool first = true;
    auto emit = [&](std::string_view e) {
      if (!first) buf += ',';
      first = false;
      buf.append(e.data(), e.size());
      if (buf.size() >= kFlushBytes) flush();
    };
    for (const json& e : events) emit(e.dump());
    tail(emit);
    buf += ']';
  }
  buf += "}\n";
  flush();
  out.close();
  if (!out) throw Error("report: writing '" + path + "' failed");
}

template <size_t N>
void side_cells(std::vector<std::string>& row, const SideMetrics& s, const UnitRatio (&units)[N]) {
  if (!s.present) {
    row.insert(row.end(), 2 + N, kNa);
    return;
  }
  row.push_back(us_text(s.time_us));
  row.push_back(std::to_string(s.total_cycles));
  for (const UnitRatio& u : units) row.push_back(ratio_text(s.ratio.at(u.name)));
}

// op_summary.csv's communication columns (only in a report with collectives): `chip` for
// every row, the rest for the HCCL rows.
constexpr const char* kCommColumns[] = {"chip",
                                        "rank",
                                        "ranks",
                                        "collective",
                                        "algorithm",
                                        "reduce_op",
                                        "comm_bytes",
                                        "alg_bandwidth(GB/s)",
                                        "bus_bandwidth(GB/s)",
                                        "reduce_cycles",
                                        "link_bytes",
                                        "link_bandwidth(GB/s)",
                                        "link_utilization(%)"};

// One HCCL row: collective `comm` on its rank `rank`, and the time its chip waited before it
// (its start minus the end of the chip's latest earlier task, op or collective; 0 if none ended
// before).
struct CommTask {
  size_t comm = 0;
  int rank = 0;
  uint64_t wait_cycles = 0;
};

// Time intervals [start, end) in cycles.
using Intervals = std::vector<std::pair<uint64_t, uint64_t>>;

// Every chip's kernels, chip -> their [start, end): the ops' and the other chips' of a system run
// (ReportInput::other_chip_kernels).
std::map<int, Intervals> kernel_spans_by_chip(const ReportInput& in) {
  std::map<int, Intervals> out;
  for (const OpRecord& op : in.ops)
    out[op.chip].push_back({op.start_cycle, op.start_cycle + op.cycles});
  for (const auto& [chip, spans] : in.other_chip_kernels)
    out[chip].insert(out[chip].end(), spans.begin(), spans.end());
  return out;
}

std::vector<CommTask> comm_tasks(const ReportInput& in) {
  std::map<int, Intervals> busy = kernel_spans_by_chip(in);  // chip -> kernels and collectives
  for (const CommRecord& c : in.comms)
    for (int chip : c.chips) busy[chip].push_back({c.start_cycle, c.start_cycle + c.cycles});
  std::vector<CommTask> out;
  for (size_t i = 0; i < in.comms.size(); ++i) {
    const CommRecord& c = in.comms[i];
    for (size_t r = 0; r < c.chips.size(); ++r) {
      uint64_t last_end = in.origin_cycle;
      for (const auto& [b, e] : busy[c.chips[r]])
        if (e <= c.start_cycle) last_end = std::max(last_end, e);
      out.push_back({i, static_cast<int>(r), c.start_cycle - std::min(last_end, c.start_cycle)});
    }
  }
  return out;
}

void write_op_summary(const std::string& path, const ReportInput& in,
                      const std::vector<OpMetrics>& ms, const std::set<std::string>& stalls) {
  CsvFile f(path);
  std::vector<std::string> head = {
      "Task ID", "Stream ID", "Op Name", "OP Type", "Task Type", "Task Start Time(us)",
      "Task Duration(us)", "Task Wait Time(us)", "Block Dim", "Mix Block Dim", "Input Shapes",
      "Input Data Types", "Input Formats", "Output Shapes", "Output Data Types", "Output Formats",
      "aic_time(us)", "aic_total_cycles"};
  for (const UnitRatio& u : kCubeSideUnits) head.push_back(fmt::format("aic_{}_ratio", u.name));
  head.insert(head.end(), {"aiv_time(us)", "aiv_total_cycles"});
  for (const UnitRatio& u : kVectorSideUnits) head.push_back(fmt::format("aiv_{}_ratio", u.name));
  head.insert(head.end(),
              {"cube_utilization(%)", "memory_bound", "task_start_cycles", "task_duration_cycles",
               "task_wait_cycles", "task_overhead(us)", "task_overhead_cycles",
               "host_dispatch_cycles", "cube_macs", "vector_repeats", "roofline_bound(us)",
               "duration/bound", "gm_read_bytes", "gm_write_bytes", "hbm_read_bytes",
               "hbm_write_bytes", "l2_hit_rate"});
  for (const std::string& s : stalls) head.push_back("stall_" + s + "(cycles)");
  // The kernel column only when an op names its kernel apart (a TF run), so the CLI's table
  // keeps its columns.
  const bool kernel_column = std::any_of(in.ops.begin(), in.ops.end(), [](const OpRecord& op) {
    return !op.kernel.empty() && op.kernel != op.op_name;
  });
  // The members column only when a launch names the original nodes it computes (a multi-tensor
  // update's); before `kernel`, which stays last.
  const bool members_column = std::any_of(in.ops.begin(), in.ops.end(),
                                          [](const OpRecord& op) { return !op.members.empty(); });
  if (members_column) head.push_back("members");
  if (kernel_column) head.push_back("kernel");
  const bool comm_columns = !in.comms.empty();
  if (comm_columns) head.insert(head.end(), std::begin(kCommColumns), std::end(kCommColumns));
  f.row(head);
  for (size_t i = 0; i < in.ops.size(); ++i) {
    const OpRecord& op = in.ops[i];
    const OpMetrics& m = ms[i];
    std::vector<std::string> row = {
        std::to_string(i), std::to_string(op.stream), op.op_name, op.op_type, op.task_type,
        us_text(m.start_us), us_text(m.duration_us), us_text(m.wait_us),
        std::to_string(op.block_dim), std::to_string(op.mix_block_dim), shapes_text(op.inputs),
        dtypes_text(op.inputs), formats_text(op.inputs), shapes_text(op.outputs),
        dtypes_text(op.outputs), formats_text(op.outputs)};
    side_cells(row, m.aic, kCubeSideUnits);
    side_cells(row, m.aiv, kVectorSideUnits);
    row.push_back(fmt::format("{:.4f}", m.cube_utilization_pct));
    row.push_back(opt_text(m.memory_bound));
    row.push_back(std::to_string(op.start_cycle));
    row.push_back(std::to_string(op.cycles));
    row.push_back(std::to_string(op.wait_cycles));
    row.push_back(us_text(m.task_overhead_us));
    row.push_back(std::to_string(m.task_overhead_cycles));
    row.push_back(std::to_string(op.host_dispatch_cycles));
    row.push_back(std::to_string(m.macs));
    row.push_back(std::to_string(m.vector_repeats));
    row.push_back(us_text(m.roofline_bound_us));
    row.push_back(opt_text(m.roofline_ratio));
    row.push_back(std::to_string(m.gm_read_bytes));
    row.push_back(std::to_string(m.gm_write_bytes));
    row.push_back(std::to_string(m.hbm_read_bytes));
    row.push_back(std::to_string(m.hbm_write_bytes));
    row.push_back(opt_text(m.l2_hit_rate));
    for (const std::string& s : stalls) {
      auto it = m.stall_cycles.find(s);
      row.push_back(std::to_string(it == m.stall_cycles.end() ? 0 : it->second));
    }
    if (members_column) {
      std::string names;
      for (const std::string& m : op.members) names += (names.empty() ? "" : ";") + m;
      row.push_back(names);
    }
    if (kernel_column) row.push_back(op.kernel.empty() ? op.op_name : op.kernel);
    if (comm_columns) {
      row.push_back(std::to_string(op.chip));
      row.insert(row.end(), std::size(kCommColumns) - 1, kNa);
    }
    f.row(row);
  }
  // The AI CPU and HCCL rows, after the ops: columns by name, N/A where a kernel's figure does
  // not apply.
  auto named_row = [&](const std::map<std::string, std::string>& cells) {
    std::vector<std::string> row;
    for (const std::string& h : head) {
      auto it = cells.find(h);
      row.push_back(it == cells.end() ? kNa : it->second);
    }
    f.row(row);
  };
  const double mhz = in.config->clock_mhz;
  size_t task = in.ops.size();
  for (const AiCpuTaskRow& a : in.ai_cpu)
    named_row({{"Task ID", std::to_string(task++)},
               {"Stream ID", std::to_string(a.stream)},
               {"Op Name", a.op_name},
               {"OP Type", a.op_type},
               {"Task Type", "AI_CPU"},
               {"Task Start Time(us)", us_text(in.config->cycles_to_us(double(a.start_cycle)))},
               {"Task Duration(us)", us_text(in.config->cycles_to_us(double(a.cycles)))},
               {"Task Wait Time(us)", us_text(in.config->cycles_to_us(double(a.wait_cycles)))},
               {"Block Dim", "0"},
               {"Mix Block Dim", "0"},
               {"Input Shapes", shapes_text(a.inputs)},
               {"Input Data Types", dtypes_text(a.inputs)},
               {"Input Formats", formats_text(a.inputs)},
               {"Output Shapes", shapes_text(a.outputs)},
               {"Output Data Types", dtypes_text(a.outputs)},
               {"Output Formats", formats_text(a.outputs)},
               {"task_start_cycles", std::to_string(a.start_cycle)},
               {"task_duration_cycles", std::to_string(a.cycles)},
               {"task_wait_cycles", std::to_string(a.wait_cycles)},
               {"host_dispatch_cycles", "0"},
               {"cube_macs", "0"},
               {"vector_repeats", "0"}});
  for (const CommTask& t : comm_tasks(in)) {
    const CommRecord& c = in.comms[t.comm];
    const CommRankMetrics m = comm_rank_metrics(c, t.rank, mhz);
    const std::map<std::string, std::string> cells = {
        {"Task ID", std::to_string(task++)},
        {"Stream ID", std::to_string(c.stream)},
        {"Op Name", c.op_name},
        {"OP Type", c.op_type},
        {"Task Type", "HCCL"},
        {"Task Start Time(us)", us_text(in.config->cycles_to_us(double(c.start_cycle)))},
        {"Task Duration(us)", us_text(comm_time_us(c, mhz))},
        {"Task Wait Time(us)", us_text(in.config->cycles_to_us(double(t.wait_cycles)))},
        {"Block Dim", "0"},
        {"Mix Block Dim", "0"},
        {"Input Shapes", std::to_string(c.send_count)},
        {"Input Data Types", c.dtype},
        {"Input Formats", "ND"},
        {"Output Shapes", std::to_string(c.recv_count)},
        {"Output Data Types", c.dtype},
        {"Output Formats", "ND"},
        {"task_start_cycles", std::to_string(c.start_cycle)},
        {"task_duration_cycles", std::to_string(c.cycles)},
        {"task_wait_cycles", std::to_string(t.wait_cycles)},
        {"host_dispatch_cycles", "0"},
        {"cube_macs", "0"},
        {"vector_repeats", "0"},
        {"chip", std::to_string(m.chip)},
        {"rank", std::to_string(t.rank)},
        {"ranks", std::to_string(c.chips.size())},
        {"collective", c.collective},
        {"algorithm", c.algorithm},
        {"reduce_op", c.reduce_op.empty() ? kNa : c.reduce_op},
        {"comm_bytes", std::to_string(c.bytes)},
        {"alg_bandwidth(GB/s)", fmt::format("{:.3f}", comm_algbw_gbps(c, mhz))},
        {"bus_bandwidth(GB/s)", fmt::format("{:.3f}", comm_algbw_gbps(c, mhz) * c.bus_factor)},
        {"reduce_cycles", std::to_string(c.reduce_cycles)},
        {"link_bytes", std::to_string(m.link_bytes)},
        {"link_bandwidth(GB/s)", fmt::format("{:g}", m.link_gbps)},
        {"link_utilization(%)", fmt::format("{:.3f}", 100.0 * m.link_utilization)}};
    named_row(cells);
  }
  f.close();
}

struct TypeStats {
  std::string op_type, task_type;
  uint64_t count = 0;
  double total_us = 0, min_us = 0, max_us = 0;
};

// Per (op type, task type), by total time, longest first (ties by name); a collective counts
// once per rank, as its HCCL rows.
std::vector<TypeStats> op_type_stats(const ReportInput& in, const std::vector<OpMetrics>& ms) {
  std::map<std::pair<std::string, std::string>, TypeStats> by;
  auto add = [&](const std::string& op_type, const std::string& task_type, double us) {
    TypeStats& t = by[{op_type, task_type}];
    if (t.count == 0) {
      t.op_type = op_type;
      t.task_type = task_type;
      t.min_us = t.max_us = us;
    }
    ++t.count;
    t.total_us += us;
    t.min_us = std::min(t.min_us, us);
    t.max_us = std::max(t.max_us, us);
  };
  for (size_t i = 0; i < in.ops.size(); ++i)
    add(in.ops[i].op_type, in.ops[i].task_type, ms[i].duration_us);
  for (const AiCpuTaskRow& a : in.ai_cpu)
    add(a.op_type, "AI_CPU", in.config->cycles_to_us(double(a.cycles)));
  for (const CommRecord& c : in.comms)
    for (size_t r = 0; r < c.chips.size(); ++r)
      add(c.op_type, "HCCL", comm_time_us(c, in.config->clock_mhz));
  std::vector<TypeStats> out;
  for (auto& [k, t] : by) out.push_back(t);
  std::stable_sort(out.begin(), out.end(),
                   [](const TypeStats& a, const TypeStats& b) { return a.total_us > b.total_us; });
  return out;
}

void write_op_statistic(const std::string& path, const std::vector<TypeStats>& stats) {
  double all = 0;
  for (const TypeStats& t : stats) all += t.total_us;
  CsvFile f(path);
  f.row({"OP Type", "Core Type", "Count", "Total Time(us)", "Min Time(us)", "Avg Time(us)",
         "Max Time(us)", "Ratio(%)"});
  for (const TypeStats& t : stats)
    f.row({t.op_type, t.task_type, std::to_string(t.count), us_text(t.total_us),
           us_text(t.min_us), us_text(t.total_us / t.count), us_text(t.max_us),
           fmt::format("{:.3f}", all > 0 ? 100.0 * t.total_us / all : 0.0)});
  f.close();
}

void write_instructions(const std::string& path, const ReportInput& in) {
  CsvFile f(path);
  f.row({"Task ID", "Op Name", "Core Type", "PC", "Source", "Instruction", "Pipe", "Call Count",
         "Total Cycles", "Avg Cycles", "Wait Cycles"});
  for (size_t i = 0; i < in.ops.size(); ++i) {
    const OpRecord& op = in.ops[i];
    if (!op.instructions) continue;
    for (const InstructionStat& r : op.instructions->rows)
      f.row({std::to_string(i), op.op_name, isa::core_kind_name(r.section), std::to_string(r.pc),
             r.location, r.text, lane_name(r.lane), std::to_string(r.calls),
             cycles_text(r.busy_ps),
             fmt::format("{:.3f}", static_cast<double>(r.busy_ps) / 1000.0 /
                                       static_cast<double>(std::max<uint64_t>(1, r.calls))),
             cycles_text(r.wait_ps)});
  }
  f.close();
}

json counters_document(const ReportInput& in) {
  json ops = json::array();
  for (size_t i = 0; i < in.ops.size(); ++i) {
    const OpRecord& op = in.ops[i];
    json entry = {{"task_id", i}, {"op_name", op.op_name}, {"op_type", op.op_type},
                  {"task_type", op.task_type}, {"start_cycle", op.start_cycle},
                  {"cycles", op.cycles}, {"block_dim", op.block_dim}};
    if (i < in.counter_detail_ops) entry["counters"] = op.counters.tree();
    ops.push_back(std::move(entry));
  }
  json doc = {{"chip", in.config->name}, {"clock_mhz", in.config->clock_mhz}, {"ops", ops}};
  if (in.ops.size() > in.counter_detail_ops)
    doc["counter_trees_omitted_after_task"] = in.counter_detail_ops;
  if (!in.session_counters.is_null()) doc["session"] = in.session_counters;
  return doc;
}

std::string bytes_text(double b) {
  if (b >= double(1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (b >= double(1ull << 20)) return fmt::format("{:.2f} MiB", b / double(1ull << 20));
  if (b >= 1024) return fmt::format("{:.2f} KiB", b / 1024);
  return fmt::format("{:.0f} B", b);
}

std::string pct(double r) { return fmt::format("{:.1f}%", 100.0 * r); }

// A name for a summary table: at most 40 characters, keeping the end of a long TF node name
// ("...dense_1/MatMul/MatMul"); op_summary.csv has it in full.
std::string short_name(const std::string& s) {
  constexpr size_t kMax = 40;
  return s.size() <= kMax ? s : "..." + s.substr(s.size() - (kMax - 3));
}

// Sorted, overlapping and touching intervals joined.
Intervals merged(Intervals v) {
  std::sort(v.begin(), v.end());
  Intervals out;
  for (const auto& [b, e] : v) {
    if (e <= b) continue;
    if (!out.empty() && b <= out.back().second)
      out.back().second = std::max(out.back().second, e);
    else
      out.push_back({b, e});
  }
  return out;
}

uint64_t length(const Intervals& v) {
  uint64_t n = 0;
  for (const auto& [b, e] : v) n += e - b;
  return n;
}

// Length of the intersection of two merged interval lists.
uint64_t common_length(const Intervals& a, const Intervals& b) {
  uint64_t n = 0;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const uint64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) n += hi - lo;
    (a[i].second < b[j].second) ? ++i : ++j;
  }
  return n;
}

// summary.txt's communication sections: the collectives by op type and algorithm, and per chip
// its kernel time (compute), collective time (communication), the time both ran (overlap) and
// the communication that did not overlap (exposed), as unions of the tasks' intervals.
std::string comm_summary_text(const ReportInput& in) {
  const ChipConfig& cfg = *in.config;
  std::ostringstream o;
  o << "\nCommunication (HCCL), per collective (all ranks together):\n";
  o << fmt::format("  {:<18} {:<18} {:>6} {:>10} {:>14} {:>12} {:>12} {:>12}\n", "op type",
                   "algorithm", "count", "ranks", "bytes", "time(us)", "algbw(GB/s)",
                   "busbw(GB/s)");
  struct Group {
    uint64_t count = 0, bytes = 0, cycles = 0;
    double bus = 0;
    size_t ranks = 0;
  };
  std::map<std::pair<std::string, std::string>, Group> groups;
  for (const CommRecord& c : in.comms) {
    Group& g = groups[{c.op_type, c.algorithm}];
    ++g.count;
    g.bytes += c.bytes;
    g.cycles += c.cycles;
    g.bus = c.bus_factor;  // the same communicator size within a group here
    g.ranks = std::max(g.ranks, c.chips.size());
  }
  for (const auto& [key, g] : groups) {
    const double us = cfg.cycles_to_us(double(g.cycles));
    const double algbw = us > 0 ? double(g.bytes) / (us * 1e3) : 0.0;
    o << fmt::format("  {:<18} {:<18} {:>6} {:>10} {:>14} {:>12.3f} {:>12.3f} {:>12.3f}\n",
                     key.first, key.second, g.count, g.ranks, g.bytes, us, algbw, algbw * g.bus);
  }
  std::map<int, Intervals> compute = kernel_spans_by_chip(in), comm;
  for (const CommRecord& c : in.comms)
    for (int chip : c.chips) comm[chip].push_back({c.start_cycle, c.start_cycle + c.cycles});
  std::set<int> chips;
  for (const auto& [chip, v] : compute) chips.insert(chip);
  for (const auto& [chip, v] : comm) chips.insert(chip);
  o << "\nTime per chip (us): compute = kernels, communication = collectives, overlap = both at "
       "once,\nexposed = communication without compute, busy = either:\n";
  o << fmt::format("  {:>5} {:>14} {:>14} {:>14} {:>14} {:>14}\n", "chip", "compute",
                   "communication", "overlap", "exposed comm", "busy");
  for (int chip : chips) {
    const Intervals a = merged(compute[chip]), b = merged(comm[chip]);
    const uint64_t ca = length(a), cb = length(b), both = common_length(a, b);
    auto us = [&](uint64_t cycles) { return cfg.cycles_to_us(double(cycles)); };
    o << fmt::format("  {:>5} {:>14.3f} {:>14.3f} {:>14.3f} {:>14.3f} {:>14.3f}\n", chip, us(ca),
                     us(cb), us(both), us(cb - both), us(ca + cb - both));
  }
  return o.str();
}

std::string summary_text(const ReportInput& in, const std::vector<OpMetrics>& ms,
                         const std::vector<TypeStats>& stats) {
  const ChipConfig& cfg = *in.config;
  const ChipPeaks peaks = chip_peaks(cfg);
  std::ostringstream o;
  o << in.title << "\n";
  o << fmt::format("chip {}: {} MHz, {} cube cores ({:.1f} TFLOPS fp16 peak), {} vector cores, "
                   "HBM {:.0f} GB/s\n",
                   cfg.name, cfg.clock_mhz, peaks.cube_cores,
                   2.0 * peaks.macs_per_cycle * cfg.clock_mhz * 1e6 / 1e12, peaks.vector_cores,
                   cfg.hbm_gbps);
  uint64_t task_cycles = 0, wait_cycles = 0, last_end = 0;
  for (const OpRecord& op : in.ops) {
    task_cycles += op.cycles;
    wait_cycles += op.wait_cycles;
    last_end = std::max(last_end, op.start_cycle + op.cycles);
  }
  for (const CommRecord& c : in.comms) last_end = std::max(last_end, c.start_cycle + c.cycles);
  const uint64_t end = std::max({in.end_cycle, last_end, in.origin_cycle}) - in.origin_cycle;
  o << fmt::format("{} ops: task time {:.3f} us, waits {:.3f} us, simulated time {:.3f} us\n",
                   in.ops.size(), cfg.cycles_to_us(double(task_cycles)),
                   cfg.cycles_to_us(double(wait_cycles)), cfg.cycles_to_us(double(end)));

  o << "\nTop ops by time:\n";
  std::vector<size_t> order(in.ops.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return in.ops[a].cycles > in.ops[b].cycles; });
  o << fmt::format("  {:>4} {:<24} {:<16} {:>12} {:>7} {:>12} {:>9} {:>8}\n", "task", "op",
                   "task type", "time(us)", "share", "bound(us)", "x bound", "cube %");
  const size_t top = std::min<size_t>(order.size(), 20);
  for (size_t k = 0; k < top; ++k) {
    const size_t i = order[k];
    const OpMetrics& m = ms[i];
    o << fmt::format("  {:>4} {:<24} {:<16} {:>12.3f} {:>7} {:>12.3f} {:>9} {:>8.2f}\n", i,
                     short_name(in.ops[i].op_name), in.ops[i].task_type, m.duration_us,
                     task_cycles ? pct(double(in.ops[i].cycles) / double(task_cycles)) : "-",
                     m.roofline_bound_us,
                     m.roofline_ratio ? fmt::format("{:.2f}", *m.roofline_ratio) : "-",
                     m.cube_utilization_pct);
  }
  if (order.size() > top) o << fmt::format("  ... {} more in op_summary.csv\n", order.size() - top);

  o << "\nBy op type:\n";
  for (const TypeStats& t : stats)
    o << fmt::format("  {:<24} {:<16} x{:<5} total {:.3f} us, avg {:.3f} us\n", t.op_type,
                     t.task_type, t.count, t.total_us, t.total_us / t.count);

  if (in.per_op_utilisation)
    o << "\nUtilisation per unit (busy / active cycles over the cores that ran):\n";
  for (size_t i = 0; in.per_op_utilisation && i < in.ops.size(); ++i) {
    const OpMetrics& m = ms[i];
    std::string line = fmt::format("  {:>4} {:<24}", i, in.ops[i].op_name);
    auto side = [&](const char* label, const SideMetrics& s, const auto& units) {
      if (!s.present) return;
      line += fmt::format(" {} x{}:", label, s.cores);
      for (const UnitRatio& u : units)
        line += fmt::format(" {} {}", u.name, pct(s.ratio.at(u.name)));
    };
    side(cfg.split ? "aic" : "aicore", m.aic, kCubeSideUnits);
    if (cfg.split) side("aiv", m.aiv, kVectorSideUnits);
    else if (m.aiv.present)  // coupled: the same cores; add the vector-side units only
      line += fmt::format(" vec {} mte3 {}", pct(m.aiv.ratio.at("vec")),
                          pct(m.aiv.ratio.at("mte3")));
    if (m.memory_bound) line += fmt::format("  memory_bound {:.2f}", *m.memory_bound);
    o << line << "\n";
  }

  o << "\nBytes moved (all ops):\n";
  std::map<std::string, uint64_t> paths;
  uint64_t gm_r = 0, gm_w = 0, hbm_r = 0, hbm_w = 0, hits = 0, misses = 0;
  std::map<std::string, uint64_t> stalls;
  for (const OpMetrics& m : ms) {
    for (const auto& [p, b] : m.path_bytes) paths[p] += b;
    for (const auto& [s, c] : m.stall_cycles) stalls[s] += c;
    gm_r += m.gm_read_bytes;
    gm_w += m.gm_write_bytes;
    hbm_r += m.hbm_read_bytes;
    hbm_w += m.hbm_write_bytes;
    hits += m.l2_hits;
    misses += m.l2_misses;
  }
  for (const auto& [p, b] : paths)
    if (b) o << fmt::format("  {:<12} {}\n", p, bytes_text(double(b)));
  o << fmt::format("  GM read {}, written {}; HBM read {}, written {}; L2 hit rate {}\n",
                   bytes_text(double(gm_r)), bytes_text(double(gm_w)), bytes_text(double(hbm_r)),
                   bytes_text(double(hbm_w)),
                   hits + misses ? pct(double(hits) / double(hits + misses)) : "-");
  std::string sl = "  stall cycles (all ops, sum over cores and units):";
  for (const auto& [s, c] : stalls)
    if (c) sl += fmt::format(" {} {}", s, c);
  o << sl << "\n";

  if (!in.session_counters.is_null()) {
    const LaunchCounters session = read_launch_counters(in.session_counters);
    o << "\nHDC link (host <-> device, whole run):\n";
    for (const char* dir : {"h2d", "d2h"}) {
      const uint64_t bytes = session.chip_value(fmt::format("hdc.{}_bytes", dir));
      const uint64_t busy = session.chip_value(fmt::format("hdc.{}_busy_cycles", dir));
      const uint64_t copies = session.chip_value(fmt::format("hdc.{}_copies", dir));
      const double us = cfg.cycles_to_us(double(busy));
      o << fmt::format("  {}: {} copies, {}, busy {:.3f} us ({:.1f} GB/s achieved, {} of the "
                       "simulated time)\n",
                       dir, copies, bytes_text(double(bytes)), us,
                       us > 0 ? double(bytes) / (us * 1e-6) / 1e9 : 0.0,
                       end ? pct(double(busy) / double(end)) : "-");
    }
  }
  if (!in.comms.empty()) o << comm_summary_text(in);
  o << in.summary_appendix;
  return o.str();
}

// Single-quotes a word for /bin/sh.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",;\"\n\r") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

std::string cycles_text(uint64_t ps) {
  const uint64_t whole = ps / 1000, frac = ps % 1000;
  if (frac == 0) return std::to_string(whole);
  std::string f = fmt::format("{:03d}", frac);
  while (f.back() == '0') f.pop_back();
  return fmt::format("{}.{}", whole, f);
}

std::vector<std::string> write_report(const std::string& dir, const ReportInput& in) {
  if (!in.config) throw Error("report: no chip config given");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir))
    throw Error(fmt::format("report: cannot create the folder '{}': {}", dir, ec.message()));
  if (in.metrics && in.metrics->size() != in.ops.size())
    throw Error(fmt::format("report: {} ops but metrics of {}", in.ops.size(), in.metrics->size()));
  std::vector<OpMetrics> computed;
  for (size_t i = 0; !in.metrics && i < in.ops.size(); ++i) {
    try {
      computed.push_back(compute_op_metrics(in.ops[i], *in.config));
    } catch (const Error& e) {
      throw Error(fmt::format("report: op {} ('{}'): {}", i, in.ops[i].op_name, e.what()));
    }
  }
  const std::vector<OpMetrics>& ms = in.metrics ? *in.metrics : computed;
  std::set<std::string> stalls;
  for (const OpMetrics& m : ms)
    for (const auto& [cause, v] : m.stall_cycles) stalls.insert(cause);
  const std::vector<TypeStats> stats = op_type_stats(in, ms);
  std::vector<std::string> written;
  auto path = [&](const char* name) {
    written.push_back((fs::path(dir) / name).string());
    return written.back();
  };
  write_op_summary(path("op_summary.csv"), in, ms, stalls);
  write_op_statistic(path("op_statistic.csv"), stats);
  write_instructions(path("instructions.csv"), in);
  write_text(path("counters.json"), counters_document(in).dump(1) + "\n");
  write_text(path("chip.yaml"), dump_chip_config_yaml(*in.config));
  if (in.tables_written) in.tables_written();
  if (!in.comms.empty()) {
    json trace = in.trace ? *in.trace : json::object();
    add_comm_trace(trace, in.comms, in.config->clock_mhz);
    write_trace(path("trace.json"), trace, in.trace_events_tail);
  } else if (in.trace) {
    write_trace(path("trace.json"), *in.trace, in.trace_events_tail);
  }
  write_text(path("summary.txt"), summary_text(in, ms, stats));
  return written;
}

PlotProcess::PlotProcess(PlotProcess&& o) noexcept
    : m_pipe(std::exchange(o.m_pipe, nullptr)),
      m_cmd(std::move(o.m_cmd)),
      m_error(std::move(o.m_error)) {}

PlotProcess& PlotProcess::operator=(PlotProcess&& o) noexcept {
  if (this != &o) {
    finish_plot_script(*this);
    m_pipe = std::exchange(o.m_pipe, nullptr);
    m_cmd = std::move(o.m_cmd);
    m_error = std::move(o.m_error);
  }
  return *this;
}

PlotProcess::~PlotProcess() { finish_plot_script(*this); }

PlotProcess start_plot_script(const std::string& dir, const std::string& python,
                              const std::string& script) {
  PlotProcess p;
  if (python.empty()) {
    p.m_error = "no Python found (set NPUSIM_PYTHON or create .venv with scripts/setup.sh)";
    return p;
  }
  p.m_cmd = shell_quote(python) + " " + shell_quote(script) + " " + shell_quote(dir) + " 2>&1";
  p.m_pipe = popen(p.m_cmd.c_str(), "r");
  if (!p.m_pipe) p.m_error = "cannot start: " + p.m_cmd;
  return p;
}

PlotResult finish_plot_script(PlotProcess& p) {
  PlotResult r;
  if (!p.m_pipe) {
    r.output = p.m_error;
    return r;
  }
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p.m_pipe)) > 0) r.output.append(buf, n);
  const int status = pclose(std::exchange(p.m_pipe, nullptr));
  r.ok = status == 0;
  if (!r.ok && r.output.empty()) r.output = "failed: " + p.m_cmd;
  return r;
}

PlotResult run_plot_script(const std::string& dir, const std::string& python,
                           const std::string& script) {
  PlotProcess p = start_plot_script(dir, python, script);
  return finish_plot_script(p);
}

std::string find_report_python(const std::string& source_dir) {
  if (const char* env = std::getenv("NPUSIM_PYTHON"); env && *env) return env;
  const std::string venv = (fs::path(source_dir) / ".venv" / "bin" / "python").string();
  if (access(venv.c_str(), X_OK) == 0) return venv;
  return "";
}

}  // namespace npusim::prof
