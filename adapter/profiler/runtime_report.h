// The report folder of a run through the host runtime (a TF program on the NPU): the same files
// as the command line's (report_writer.h, docs/reports.md) from the runtime's records, plus what
// only a model-level run has: TF op names and types on every task, a host lane in the trace (HDC
// copies, TF op dispatch spans), a trimmed per-pipe instruction timeline, and summary sections
// for op types, HDC link use, the time the chip waited for data and CPU-fallback ops.
//
// Uses only the plain record structs of adapter/runtime/stream.h, not the runtime library.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "adapter/profiler/comm_record.h"
#include "adapter/profiler/op_metrics.h"
#include "adapter/profiler/pipe_trace.h"
#include "adapter/profiler/report_writer.h"
#include "adapter/runtime/stream.h"
#include "sim/config/chip_config.h"

namespace npusim::prof {

// One launch as a report row: op name and type and tensors from its label (without one: the
// kernel name for both), task type from its program (without one: from the cores that ran),
// start and duration on the device timeline, counters. wait_cycles is left 0 (set_wait_cycles).
OpRecord op_record(const rt::LaunchRecord& r, const ChipConfig& cfg);

// AI CPU tasks as report rows (ReportInput::ai_cpu), in the order they ran: op name, type and
// tensors from the label (without one: the kernel for both), each wait since the previous task
// ended on the AI CPU timeline (the first: since `origin_cycle`).
std::vector<AiCpuTaskRow> ai_cpu_rows(const std::vector<rt::AiCpuRecord>& tasks,
                                      uint64_t origin_cycle);

// The launches as report rows, in launch order (op_record each). The runtime runs one operation
// at a time, but a record gives the start rounded down and the duration rounded up to whole
// cycles, so a task may seem to end up to a cycle after the next operation began; such an end
// is cut to that start. The rows of op_summary.csv, the trace and the TensorBoard profile.
std::vector<OpRecord> op_records(const std::vector<rt::LaunchRecord>& launches,
                                 const ChipConfig& cfg);
// The launches' [start, end) on their timeline, cycles, with op_records' cut: what a report
// counts as their kernel time (ReportInput::other_chip_kernels of a system run's other chips).
std::vector<std::pair<uint64_t, uint64_t>> kernel_spans(
    const std::vector<rt::LaunchRecord>& launches);

// One run of a TF op (launches sharing a LaunchLabel::dispatch): from its first launch's start
// to its last launch's end on the device timeline.
struct TfOpSpan {
  uint64_t start_cycle = 0, end_cycle = 0;
  size_t first_task = 0;             // index of its first launch in `ops`
  std::vector<size_t> tasks;         // indices of its launches in `ops`, in order
  std::vector<std::string> kernels;  // their kernels
};
// The runs among `ops` (op_records(launches)), in dispatch order; launches without a dispatch
// id belong to none.
std::vector<TfOpSpan> tf_op_spans(const std::vector<rt::LaunchRecord>& launches,
                                  const std::vector<OpRecord>& ops);

// Per op type, over a set of launches (launches of one label = one TF op run).
struct OpTypeSummary {
  std::string op_type;
  uint64_t count = 0;   // runs of the op (distinct LaunchLabel::dispatch; unlabelled: launches)
  uint64_t tasks = 0;   // kernel launches
  double time_us = 0;   // sum of the tasks' durations
  // 100 x cube MACs / (chip cube peak per cycle x task cycles): as op_summary's
  // cube_utilization(%), over all the type's tasks.
  double cube_utilization_pct = 0;
  // 100 x vector repeats x 256 B / (chip vector bytes per cycle, all vector cores x task cycles):
  // the vector unit's share of the whole chip's vector peak.
  double vector_utilization_pct = 0;
};
// Longest total time first (ties by name); `top` > 0 keeps that many.
std::vector<OpTypeSummary> op_type_summary(const std::vector<rt::LaunchRecord>& launches,
                                           const ChipConfig& cfg, size_t top = 0);

// Time between kernels on the device timeline, by what filled it. A launch's wait is its start
// minus the previous launch's end (the first: minus the window's origin); the runtime runs one
// operation at a time and its timeline does not advance while idle, so a wait is filled by the
// copies and fills that ran in it. The chip "waited for data" for the host->device copies in
// the waits: they ran after the previous kernel and before the next one started.
struct WaitBreakdown {
  uint64_t wait_cycles = 0;       // sum of the launches' waits
  uint64_t h2d_cycles = 0;        // host->device copy time inside the waits (waiting for data)
  uint64_t d2h_cycles = 0;        // device->host copy time inside the waits
  uint64_t device_cycles = 0;     // d2d copies and memsets inside the waits
  uint64_t host_dispatch_cycles = 0;  // the ops' host dispatch inside the waits
  uint64_t after_last_cycles = 0; // copies and fills after the last launch (not in any wait)
  uint64_t after_last_copies = 0;
};
WaitBreakdown wait_breakdown(const std::vector<OpRecord>& ops,
                             const std::vector<rt::CopyRecord>& copies, uint64_t origin_cycle);

// A named part of a report's window (npusim.mark_phase, docs/reports.md "Phases"): the launches
// and copies that started in [origin_cycle, end_cycle) on the device timeline (end_cycle 0: to
// the window's end). Several phases of one name are occurrences of one repeated phase (each
// decode step of a generation, each training step).
struct ReportPhase {
  std::string name;      // [A-Za-z0-9_.-], not "." or "..": its folder's name under phases/
  uint64_t origin_cycle = 0, end_cycle = 0;
  double items = 0;      // the work one occurrence does (e.g. tokens generated); 0: not given
  std::string unit;      // the items' unit ("tokens"); "" when items is 0
};
// Throws npusim::Error naming the phase whose name is not a folder name as above.
void check_phase_name(const std::string& name);

// What kind of work a launch does, for summary.txt's "Where the time goes": from its op type
// and counters, the same rules for every model (docs/reports.md gives them in order).
enum class WorkKind {
  attention,        // op type containing "Attention" (the fused attention kernels)
  slice_update,     // op type containing "DynamicUpdateSlice", or "Scatter" (cache writes)
  cube,             // any other launch that did cube MACs (MatMul, BatchMatMul, convolutions)
  vector,           // any other launch with vector repeats (norms, rotary, activations, casts)
  data_movement,    // neither: only moved data (Pack, Slice, Transpose by DMA, Fill)
};
const char* work_kind_name(WorkKind k);
WorkKind work_kind(const std::string& op_type, const OpMetrics& m);

struct RuntimeReportInput {
  std::string title;
  const ChipConfig* config = nullptr;
  std::vector<rt::LaunchRecord> launches;  // the window's launches, in launch order
  std::vector<rt::CopyRecord> copies;      // the window's copies and fills, in order
  uint64_t origin_cycle = 0;               // the window's start on the device timeline
  const PipeTraceCollector* pipe_trace = nullptr;  // instruction detail; null: none
  // The window's collectives (several chips; comm_record.h): HCCL rows and lanes per chip.
  std::vector<CommRecord> comms;
  // The window's AI CPU tasks (rt::Device::ai_cpu_records): AI_CPU rows (ai_cpu_rows).
  std::vector<rt::AiCpuRecord> ai_cpu;
  // The window's kernels of the system's other chips (ReportInput::other_chip_kernels: the
  // per-chip split of summary.txt counts them; kernel_spans of each chip's launches).
  std::map<int, std::vector<std::pair<uint64_t, uint64_t>>> other_chip_kernels;
  // Model-level facts from the caller: "cpu_fallback_ops" (any JSON; null or absent: "not
  // available"); "device_memory" (absent: no section): {"allocator_peak_bytes",
  // "allocator_in_use_bytes", "graph_plans", "arenas_held", "arena_bytes_held",
  // "max_arena_bytes", "max_unplanned_bytes"}, bytes.
  nlohmann::json extra;
  // Named parts of the window (npusim.mark_phase): summary.txt gets a "Phases" section and each
  // phase name a folder phases/<name>/ with the report of its last occurrence.
  std::vector<ReportPhase> phases;
  // ReportInput::tables_written of the top-level folder (not the phases' folders).
  std::function<void()> tables_written;
};

// The Chrome trace: a "host" process (lanes "TF ops": one slice per TF op run, spanning its
// launches; "h2d", "d2h", "d2d/memset": the copies) and a "chip" process ("kernels": one slice
// per launch); the collector's cores with one lane per pipe come from pipe_trace_events.
nlohmann::json runtime_trace(const RuntimeReportInput& in, const std::vector<OpRecord>& ops);
// The pipe trace's events (in.pipe_trace; none without it), shifted onto the device timeline,
// each handed to `emit` as its JSON text: trace.json's traceEvents after runtime_trace's.
void pipe_trace_events(const RuntimeReportInput& in,
                       const std::function<void(std::string_view)>& emit);

// Writes the folder (write_report's files, trace.json included) and returns the paths written;
// with phases also phases/<name>/ per phase name (the same files of its last occurrence's
// launches, no instruction detail).
// Records give starts rounded down and durations rounded up to whole cycles; a task that so
// seems to end up to one cycle after the next launch's start is cut to that start (the runtime
// runs one operation at a time), so the durations add up to the simulated time minus the waits.
// op_type_summary does the same.
// Throws npusim::Error as write_report does.
std::vector<std::string> write_runtime_report(const std::string& dir, const RuntimeReportInput& in);

}  // namespace npusim::prof
