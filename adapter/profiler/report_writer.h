// The report folder of a run, in the formats Ascend users know from msprof (docs/reports.md):
//   op_summary.csv    one row per op (kernel launch): msprof's columns plus npusim's roofline,
//                     GM/HBM bytes, L2 hit rate and stall cycles by cause
//   op_statistic.csv  per op type and task type: count, total/min/avg/max time, share
//   instructions.csv  per op, section and pc: calls, busy and wait cycles (InstructionProfiler)
//   counters.json     every op's counter tree (and the whole run's, if given)
//   chip.yaml         the resolved chip config
//   trace.json        the Chrome-trace timeline, if the run traced
//   summary.txt       top ops by time, utilisation per unit, bytes moved, memory, HDC link
// and, for the collectives of a system run (ReportInput::comms), their HCCL rows, trace lanes and
// the compute / communication / overlap split per chip.
// All files are computed from the same OpMetrics. The plots (roofline.png, op_time.png) come from
// tools/npusim_report_plots.py, which reads op_summary.csv, op_statistic.csv and chip.yaml.
#pragma once

#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "adapter/profiler/comm_record.h"
#include "adapter/profiler/op_metrics.h"
#include "sim/config/chip_config.h"

namespace npusim::prof {

// A task of the chip's AI CPU (rt::AiCpuRecord: an AI CPU kernel beside the AI cores, e.g.
// DropOutGenMask; docs/runtime.md "The AI CPU timeline"): an op_summary.csv row with Task Type
// AI_CPU, and op_statistic.csv's AI_CPU lines.
struct AiCpuTaskRow {
  std::string op_name, op_type;  // the TF node and its type, or the kernel for both
  uint64_t stream = 0;
  uint64_t start_cycle = 0;  // on the chip's AI CPU timeline, AI-core cycles
  uint64_t cycles = 0;
  uint64_t wait_cycles = 0;  // since the previous AI CPU task ended (the first: the origin)
  std::vector<TensorDesc> inputs, outputs;
};

struct ReportInput {
  std::string title;               // summary.txt's heading, e.g. "npusim run kernels/vadd_f16.s"
  const ChipConfig* config = nullptr;
  std::vector<OpRecord> ops;       // in launch order, wait_cycles set (set_wait_cycles)
  // compute_op_metrics of each of `ops`, in order, when the caller has them already (a TF
  // step's ~500 launches' counter trees take seconds to read); null: write_report computes them.
  const std::vector<OpMetrics>* metrics = nullptr;
  // Collectives of a system run (comm_record.h): op_summary.csv rows with Task Type HCCL after
  // the ops' (and its communication columns), their trace lanes and summary.txt's split of each
  // chip's time into compute, communication and overlap.
  std::vector<CommRecord> comms;
  // AI CPU tasks, in the order they ran: op_summary.csv rows after the ops' (before the HCCL
  // rows), Block Dim 0 and N/A where a kernel's figure does not apply.
  std::vector<AiCpuTaskRow> ai_cpu;
  // Kernels of chips whose ops are not in `ops`, as [start, end) spans in cycles on their
  // timelines, keyed by chip: a system run's top-level report lists chip 0's ops but splits the
  // time of every chip its collectives ran on (summary.txt "Time per chip"), whose compute is
  // then `ops` of that chip plus these. Empty when `ops` holds every chip's kernels (the
  // command line's reports).
  std::map<int, std::vector<std::pair<uint64_t, uint64_t>>> other_chip_kernels;
  // Simulator::counters() at the end of the run (whole-run totals: HDC link); null if unknown.
  nlohmann::json session_counters;
  uint64_t end_cycle = 0;          // the device timeline at the end of the run (0: last op's end)
  // Where the report's window starts on the device timeline (a TF profile() block); the
  // simulated time is end - origin, the first op's wait is measured from it.
  uint64_t origin_cycle = 0;
  const nlohmann::json* trace = nullptr;  // Simulator::trace(), when the run traced
  // Events streamed into trace.json's traceEvents after `trace`'s (and the collectives'), each
  // call of `emit` one event's JSON text, without a document in memory: a TF step's pipe trace
  // has up to a million instruction events (RuntimeReportInput::pipe_trace). Empty: none.
  std::function<void(const std::function<void(std::string_view)>& emit)> trace_events_tail;
  // summary.txt: one utilisation line per op (off for a TF run's many ops, whose summary gives
  // it per op type in summary_appendix instead).
  bool per_op_utilisation = true;
  std::string summary_appendix;    // appended to summary.txt (a TF run's model-level sections)
  // counters.json keeps the counter trees of the first `counter_detail_ops` ops; later ops are
  // listed without theirs (a TF training run has thousands of launches, ~100 KB of tree each).
  // The session totals are always complete.
  uint64_t counter_detail_ops = UINT64_MAX;
  // Called once op_summary.csv, op_statistic.csv, instructions.csv, counters.json and chip.yaml
  // are written, before trace.json and summary.txt: the plots (which read the first two and
  // chip.yaml) may start then and run while the rest is written. Empty: nothing.
  std::function<void()> tables_written;
};

// Writes the folder (created if missing; files of the same names are replaced) and returns the
// paths written. Throws npusim::Error naming the file that cannot be written, or the op whose
// counters are malformed.
std::vector<std::string> write_report(const std::string& dir, const ReportInput& in);

// One CSV field: quoted (with "" for ") if it holds a comma, semicolon, quote or line break.
std::string csv_field(const std::string& s);

// Cycles given in picoseconds as decimal text with up to three decimals ("12", "12.5").
std::string cycles_text(uint64_t ps);

// The plots. `python` runs `script DIR`; returns whether it succeeded and its output (or why it
// could not run). Never throws.
struct PlotResult {
  bool ok = false;
  std::string output;
};
PlotResult run_plot_script(const std::string& dir, const std::string& python,
                           const std::string& script);
// The plot script started on a folder and not yet waited for (start_plot_script), so that the
// caller may write other files meanwhile; finish_plot_script waits for it. Destroying one that
// was not finished waits for the script too.
class PlotProcess {
 public:
  PlotProcess() = default;
  PlotProcess(const PlotProcess&) = delete;
  PlotProcess& operator=(const PlotProcess&) = delete;
  PlotProcess(PlotProcess&& o) noexcept;
  PlotProcess& operator=(PlotProcess&& o) noexcept;
  ~PlotProcess();
  bool started() const { return m_pipe != nullptr || !m_error.empty(); }

 private:
  friend PlotProcess start_plot_script(const std::string&, const std::string&,
                                       const std::string&);
  friend PlotResult finish_plot_script(PlotProcess& p);
  FILE* m_pipe = nullptr;
  std::string m_cmd;
  std::string m_error;  // why it could not start (the result's output)
};
// Starts `python script DIR` (its output read at the finish). Never throws.
PlotProcess start_plot_script(const std::string& dir, const std::string& python,
                              const std::string& script);
// Waits for it: whether it succeeded and its output (or why it could not run). Never throws.
PlotResult finish_plot_script(PlotProcess& p);
// The Python to run the plot script with: $NPUSIM_PYTHON if set, else <source_dir>/.venv/bin/python
// if it is executable, else "".
std::string find_report_python(const std::string& source_dir);

}  // namespace npusim::prof
