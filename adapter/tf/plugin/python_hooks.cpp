// C functions the Python package (adapter/tf/python/npusim) reads with ctypes from the same
// loaded library TensorFlow uses, so it sees the plugin's device, launch records and compiled
// op cache. Strings are returned as malloc'd JSON/YAML text the caller frees with
// npusim_tf_free; nothing here opens the device.
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "adapter/profiler/counter_view.h"
#include "adapter/profiler/report_writer.h"
#include "adapter/profiler/runtime_report.h"
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/cpu_fallbacks.h"
#include "adapter/tf/plugin/host_cpu_time.h"
#include "adapter/tf/plugin/launch_window.h"
#include "adapter/tf/plugin/npu_graph.h"
#include "adapter/tf/plugin/op_coverage.h"
#include "adapter/tf/plugin/plugin_device.h"

#define NPUSIM_TF_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

char* to_c_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

nlohmann::json settings_json(const npusim::tf::PluginSettings& s) {
  return {{"chip", s.chip},
          {"overrides", s.overrides},
          {"precision_mode", npusim::compiler::precision_mode_name(s.precision)},
          {"record_launches", s.record_launches},
          {"max_insns_per_block", s.max_insns_per_block},
          {"functional", s.functional},
          {"chips", s.chips},
          {"system", s.system},
          {"modify_mixlist", s.modify_mixlist}};
}

// Whether the program reads device memory with the scalar unit (ld): only such a kernel's
// control flow and addresses can depend on data, so only its timing can differ between a
// timing-only and a functional run (docs/tf_plugin.md, "Timing-only runs").
bool loads_data(const npusim::isa::Program* program) {
  if (!program) return false;
  for (const npusim::isa::Section& s : program->sections)
    for (const npusim::isa::Instruction& in : s.code)
      if (in.op == npusim::isa::Opcode::op_ld) return true;
  return false;
}

}  // namespace

NPUSIM_TF_EXPORT void npusim_tf_free(char* p) { std::free(p); }

// {"open": bool, "settings": {...} (what the device was opened with, or what the environment
//  says now), "env_error": "..." (a bad environment), and, when open: "chip_identity",
//  "hbm_bytes", "memory": {allocator stats}, "graph_plans": {"plans", "max_arena_bytes",
//  "max_unplanned_bytes", "arena_allocations", "arenas_held", "arena_bytes_held"}: the static
//  memory plans of whole-graph execution and their arenas, npu_graph.h}.
NPUSIM_TF_EXPORT char* npusim_tf_device_json() {
  using namespace npusim;
  nlohmann::json j;
  std::shared_ptr<rt::Device> dev = tf::device_if_open();
  j["open"] = dev != nullptr;
  if (dev) {
    j["settings"] = settings_json(tf::opened_settings());
    j["chip_identity"] = dev->chip_identity();
    j["hbm_bytes"] = dev->config().hbm_bytes;
    rt::AllocatorStats s = dev->memory_stats();
    j["memory"] = {{"bytes_in_use", s.bytes_in_use}, {"peak_bytes_in_use", s.peak_bytes_in_use},
                   {"bytes_limit", s.bytes_limit}, {"num_allocs", s.num_allocs}};
    const tf::NpuGraphStats g = tf::npu_graph_stats();
    j["graph_plans"] = {{"plans", g.plans},
                        {"max_arena_bytes", g.max_arena_bytes},
                        {"max_unplanned_bytes", g.max_unplanned_bytes},
                        {"arena_allocations", g.arena_allocations},
                        {"arenas_held", g.arenas_held},
                        {"arena_bytes_held", g.arena_bytes_held}};
  } else {
    tf::PluginSettings s;
    rt::Status st = tf::settings_from_env(&s);
    j["settings"] = settings_json(s);
    if (!st.ok()) j["env_error"] = st.message();
  }
  return to_c_string(j.dump());
}

// Restarts chip `chip`'s allocator peak from the bytes in use now; false if the device is not
// open (or there is no such chip).
NPUSIM_TF_EXPORT int npusim_tf_reset_memory_peak(int chip) {
  std::shared_ptr<npusim::rt::Device> dev;
  if (!npusim::tf::device_if_open() || !npusim::tf::open_device(chip, &dev).ok()) return 0;
  dev->reset_memory_peak();
  return 1;
}

// A launch's counters as {dotted name below "chip": value} (a ready tree: its leaves flattened).
static nlohmann::json flat_counters(const npusim::CounterDelta& delta) {
  nlohmann::json out = nlohmann::json::object();
  if (delta.is_tree()) {
    const nlohmann::json tree = delta.tree();
    std::map<std::string, uint64_t> values;
    if (tree.contains("chip")) npusim::prof::flatten_counters(tree["chip"], "", values);
    for (const auto& [name, v] : values) out[name] = v;
    return out;
  }
  delta.for_each([&](const npusim::CounterInfo& c, uint64_t v) {
    if (c.path.size() > 1 && c.path[0] == "chip") out[c.name.substr(5)] = v;  // after "chip."
  });
  return out;
}

// Every kernel launch on chip `chip` (NPU:chip; 0 with one NPU) so far, oldest first: [{"index",
// "chip", "kernel", "stream",
// "block_dim", "start_cycle", "cycles", "time_us", "wall_us", "replayed", "ok", "error",
// "loads_data" (the kernel reads device memory with ld: loads_data() above), "aiv_per_aic" (a mix
// kernel's declared vector cores per cube core, isa::Program::aiv_per_aic; 0: the chip's),
// "host_dispatch_cycles" (the host dispatch paid before it: LaunchLabel::host_dispatch),
// "reads_collective" (the id of the latest collective whose output it reads, 0: none)
// [, "op_name", "op_type", "dispatch" (launches of one dispatch of an op share it),
//  "graph_run" (nonzero: launches of one run of a whole graph share it: npu_graph.h)
//  [, "members" (a launch of a multi-tensor update's node: the original node names of the
//  members it computes; op_name is the merged node's: rt::LaunchLabel::members)]]
// [, "counters"]}] (op_name/op_type: the TF op that launched it). [] if the device is not open.
// with_counters: 0 none; 1 the counter tree (Simulator::counters layout, with units and
// descriptions); 2 flat {"aic0.mte2.busy_cycles": value, ...}: the tree's leaves by dotted name
// below "chip", values only (a fraction of the tree's bytes: what launches.json holds).
// {"error"} if the NPUs are open and `chip` is not one of them.
NPUSIM_TF_EXPORT char* npusim_tf_launch_records_json(int with_counters, int chip) {
  using namespace npusim;
  nlohmann::json j = nlohmann::json::array();
  if (std::shared_ptr<rt::Device> first = tf::device_if_open()) {
    std::shared_ptr<rt::Device> dev;
    if (chip < 0 || chip >= first->chips() || !tf::open_device(chip, &dev).ok())
      return to_c_string(nlohmann::json{{"error", fmt::format("launch_records: chip {} is not "
                                                              "an NPU (there are {})",
                                                              chip, first->chips())}}
                             .dump());
    for (const rt::LaunchRecord& r : dev->launch_records()) {
      nlohmann::json e = {{"index", r.index},         {"chip", r.chip}, {"kernel", r.kernel},
                          {"stream", r.stream},       {"block_dim", r.block_dim},
                          {"start_cycle", r.start_cycle}, {"cycles", r.cycles},
                          {"time_us", r.time_us},     {"wall_us", r.wall_us},
                          {"replayed", r.replayed},   {"ok", r.ok},
                          {"error", r.error},         {"loads_data", loads_data(r.program.get())},
                          {"aiv_per_aic", r.program ? r.program->aiv_per_aic : 0}};
      if (r.label) {
        e["op_name"] = r.label->op_name;
        e["op_type"] = r.label->op_type;
        e["dispatch"] = r.label->dispatch;
        e["graph_run"] = r.label->graph_run;
        if (!r.label->members.empty()) e["members"] = r.label->members;
      }
      e["host_dispatch_cycles"] = r.host_dispatch_cycles;
      e["reads_collective"] = r.reads_collective;
      if (with_counters == 1) e["counters"] = r.counters();
      if (with_counters == 2) e["counters"] = flat_counters(r.counter_delta);
      j.push_back(std::move(e));
    }
  }
  return to_c_string(j.dump());
}

NPUSIM_TF_EXPORT void npusim_tf_clear_launch_records() {
  if (auto dev = npusim::tf::device_if_open()) dev->clear_launch_records();
}

// The compiled op cache: {"hits", "misses", "failed_compiles", "entries", "keys": [...]}.
NPUSIM_TF_EXPORT char* npusim_tf_compiled_ops_json() {
  using npusim::tf::CompiledOpCache;
  npusim::tf::CompiledOpCacheStats s = CompiledOpCache::instance().stats();
  nlohmann::json j = {{"hits", s.hits},
                      {"misses", s.misses},
                      {"failed_compiles", s.failed_compiles},
                      {"entries", s.entries},
                      {"keys", CompiledOpCache::instance().keys()}};
  return to_c_string(j.dump());
}

// CPU seconds of the plugin's host-side phases (host_cpu_time.h): {phase: {item: {"calls",
// "cpu_s"}}}, since the process started or the last call with reset != 0, which clears them.
NPUSIM_TF_EXPORT char* npusim_tf_host_cpu_json(int reset) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [phase, items] : npusim::tf::host_cpu_times(reset != 0))
    for (const auto& [item, f] : items)
      j[phase][item] = {{"calls", f.calls}, {"cpu_s", static_cast<double>(f.cpu_ns) * 1e-9}};
  return to_c_string(j.dump());
}

// Checks the settings the environment holds now (NPUSIM_CHIP, NPUSIM_CHIP_OVERRIDES,
// NPUSIM_PRECISION_MODE, NPUSIM_FUNCTIONAL, ...) by loading the chip config, without opening the
// device. Returns null if they are valid, else the error message.
NPUSIM_TF_EXPORT char* npusim_tf_check_env_settings() {
  using namespace npusim;
  tf::PluginSettings s;
  rt::Status st = tf::settings_from_env(&s);
  if (st.ok() && s.multichip()) {
    SystemConfig sys;
    st = tf::system_from_settings(s, &sys);
  } else if (st.ok()) {
    st = rt::guard("chip '" + s.chip + "'", [&] {
      (void)load_chip_config(s.chip, s.overrides);
      return rt::ok_status();
    });
  }
  return st.ok() ? nullptr : to_c_string(st.message());
}

// The NPUs as a system of chips: {"open": bool, "devices": N (what TensorFlow is told), and
// when open "system": {"name", "chips", "servers", "chips_per_server", "topology"},
// "fabric": {channel: counters} (the links' bytes and busy cycles since open),
// "peer_copies": [{"src_chip", "dst_chip", "bytes", "start_cycle", "cycles"}] (copies between
// NPUs over the links, every chip's), "memory": [{"bytes_in_use", "peak_bytes_in_use"}] per
// chip, "timeline_cycles": [each chip's device timeline now, AI-core cycles], "host_cycles" (the
// host clock: the latest device time the host observed, rt::Driver) and
// "collectives": [rt::CollectiveRecord as dicts]}.
NPUSIM_TF_EXPORT char* npusim_tf_system_json() {
  using namespace npusim;
  nlohmann::json j;
  j["devices"] = tf::device_count();
  std::shared_ptr<rt::Device> dev = tf::device_if_open();
  j["open"] = dev != nullptr;
  if (!dev) return to_c_string(j.dump());
  j["chips"] = dev->chips();
  nlohmann::json counters;
  if (dev->system_counters(&counters).ok() && counters.contains("fabric"))
    j["fabric"] = counters["fabric"];
  else
    j["fabric"] = nlohmann::json::object();
  j["peer_copies"] = nlohmann::json::array();
  j["memory"] = nlohmann::json::array();
  j["timeline_cycles"] = nlohmann::json::array();
  for (int c = 0; c < dev->chips(); ++c) {
    std::shared_ptr<rt::Device> chip;
    if (!tf::open_device(c, &chip).ok()) continue;
    uint64_t now = 0;
    if (!chip->device_time_cycles(&now).ok()) continue;
    j["timeline_cycles"].push_back(now);
    rt::AllocatorStats s = chip->memory_stats();
    j["memory"].push_back(
        {{"bytes_in_use", s.bytes_in_use}, {"peak_bytes_in_use", s.peak_bytes_in_use}});
    for (const rt::CopyRecord& r : chip->copy_records())
      if (r.kind == rt::OpKind::memcpy_peer)
        j["peer_copies"].push_back({{"src_chip", r.chip},
                                    {"dst_chip", r.dst_chip},
                                    {"bytes", r.bytes},
                                    {"start_cycle", r.start_cycle},
                                    {"cycles", r.cycles}});
  }
  uint64_t host = 0;
  if (dev->host_time_cycles(&host).ok()) j["host_cycles"] = host;
  j["collectives"] = nlohmann::json::array();
  for (const rt::CollectiveRecord& r : dev->collective_records())
    j["collectives"].push_back({{"id", r.id},
                                {"collective", r.collective},
                                {"algorithm", r.algorithm},
                                {"op", r.op},
                                {"dtype", r.dtype},
                                {"label", r.label},
                                {"count", r.count},
                                {"bytes", r.bytes},
                                {"link_bytes", r.link_bytes},
                                {"chips", r.chips},
                                {"input_launch", r.input_launch},
                                {"start_cycle", r.start_cycle},
                                {"end_cycle", r.end_cycle},
                                {"steps", r.steps},
                                {"inline_reduce", r.inline_reduce}});
  return to_c_string(j.dump());
}

// The resolved chip config as YAML (written next to every report); null if not open.
NPUSIM_TF_EXPORT char* npusim_tf_chip_config_yaml() {
  auto dev = npusim::tf::device_if_open();
  return dev ? to_c_string(npusim::dump_chip_config_yaml(dev->config())) : nullptr;
}

// The simulator's counter tree since the device opened; null if not open or on error.
NPUSIM_TF_EXPORT char* npusim_tf_counters_json() {
  auto dev = npusim::tf::device_if_open();
  if (!dev) return nullptr;
  nlohmann::json tree;
  if (!dev->counters(&tree).ok()) return nullptr;
  return to_c_string(tree.dump());
}

// Ops soft placement ran on the CPU for want of an NPU kernel, as recorded by the graph optimizer
// (graph_optimizer.cpp): {"op type": nodes}.
NPUSIM_TF_EXPORT char* npusim_tf_cpu_fallback_ops_json() {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [op, nodes] : npusim::tf::cpu_fallback_counts()) j[op] = nodes;
  return to_c_string(j.dump());
}

NPUSIM_TF_EXPORT void npusim_tf_clear_cpu_fallback_ops() { npusim::tf::clear_cpu_fallback_counts(); }

// {"compiler_ops": [the compiler's op table], "unregistered": {op: reason},
// "plugin_only": {op: reason}} (op_coverage.h), for the check that the lists agree.
NPUSIM_TF_EXPORT char* npusim_tf_op_coverage_json() {
  nlohmann::json j;
  j["compiler_ops"] = npusim::compiler::supported_ops();
  j["unregistered"] = nlohmann::json::object();
  for (const auto& r : npusim::tf::unregistered_compiler_ops()) j["unregistered"][r.op] = r.reason;
  j["plugin_only"] = nlohmann::json::object();
  for (const auto& r : npusim::tf::plugin_only_ops()) j["plugin_only"][r.op] = r.reason;
  return to_c_string(j.dump());
}

// ---- Reports (adapter/profiler/runtime_report.h, docs/reports.md "From TensorFlow")

namespace {

nlohmann::json parse_or_empty(const char* text) {
  if (!text || !*text) return nlohmann::json::object();
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();
}

uint64_t json_u64(const nlohmann::json& j, const char* key, uint64_t fallback) {
  return j.contains(key) && j[key].is_number_unsigned() ? j[key].get<uint64_t>() : fallback;
}

}  // namespace

// Starts a report window (npusim.profile): instruction detail is collected from the next launch
// on, with options {"trace_launches", "trace_max_events"} (absent: NPUSIM_TRACE_* or the
// defaults), and restarts the allocator's peak from the bytes in use now (the report's device
// memory is the window's). Returns {"origin_cycle": the device timeline now (0 if the device is
// not open yet), "origin_cycles": each chip's timeline now (several NPUs; [] if not open),
// "device_open"} or {"error"}.
NPUSIM_TF_EXPORT char* npusim_tf_report_begin(const char* options_json) {
  using namespace npusim;
  nlohmann::json j;
  rt::Status st = rt::guard("npusim.profile", [&]() -> rt::Status {
    const nlohmann::json o = parse_or_empty(options_json);
    prof::PipeTraceOptions opts = tf::ReportProfiler::options_from_env();
    opts.detail_launches = json_u64(o, "trace_launches", opts.detail_launches);
    opts.max_events = json_u64(o, "trace_max_events", opts.max_events);
    uint64_t now = 0;
    std::shared_ptr<rt::Device> dev = tf::device_if_open();
    if (dev) {
      rt::Status s = dev->device_time_cycles(&now);
      if (!s.ok()) return s;
    }
    j = {{"origin_cycle", now}, {"device_open", dev != nullptr}};
    // Several NPUs: each chip's own timeline now (the window's start in its device_<k> folder).
    nlohmann::json origins = nlohmann::json::array();
    for (const std::shared_ptr<rt::Device>& d : tf::open_devices()) {
      uint64_t t = 0;
      if (rt::Status s = d->device_time_cycles(&t); !s.ok()) return s;
      origins.push_back(t);
    }
    j["origin_cycles"] = origins;
    // The window's allocator peak (summary.txt's device memory): from the bytes in use now.
    if (dev) dev->reset_memory_peak();
    return tf::ReportProfiler::instance().start(opts);
  });
  if (!st.ok()) j = {{"error", st.message()}};
  return to_c_string(j.dump());
}

// Writes the report folder of the launches since {"origin_cycle"} (default 0: the whole run) to
// `dir`: op_summary.csv, op_statistic.csv, instructions.csv, counters.json, chip.yaml,
// trace.json, summary.txt, and the plots when {"python", "plot_script"} are given; with several
// NPUs also device_<k>/ per chip k with the same files (and plots) of that chip's launches since
// {"origin_cycles"}[k] (default: origin_cycle); {"phases"}: [{"name", "origin_cycle",
// "end_cycle" (0: the window's end), "items", "unit"}] (prof::ReportPhase: summary.txt's
// "Phases" and phases/<name>/ with the last occurrence's report; chip 0's). Other keys of
// extra_json: "title", "cpu_fallback_ops" (shown in summary.txt; null: not available),
// "device_memory" (default: the runtime allocator's figures, whose peak npusim_tf_report_begin
// restarted, and the NpuGraph plans' arenas, npu_graph.h; RuntimeReportInput::extra). Returns
// {"files": [...], "window": {"origin_cycle", "end_cycle": the device timeline now},
// "plots": {"ok", "output"}[, "device_plots": [{"ok", "output"} per chip]]} or {"error"};
// {"files": []} if the device never opened.
NPUSIM_TF_EXPORT char* npusim_tf_write_report(const char* dir, const char* extra_json) {
  using namespace npusim;
  nlohmann::json j;
  rt::Status st = rt::guard("npusim.write_report", [&]() -> rt::Status {
    if (!dir || !*dir) return rt::Status(rt::StatusCode::invalid_argument, "no directory given");
    const nlohmann::json extra = parse_or_empty(extra_json);
    std::shared_ptr<rt::Device> dev = tf::device_if_open();
    if (!dev) {
      j = {{"files", nlohmann::json::array()}};
      return rt::ok_status();
    }
    prof::RuntimeReportInput in;
    in.title = extra.value("title", std::string("npusim TensorFlow run"));
    in.config = &dev->config();
    in.origin_cycle = json_u64(extra, "origin_cycle", 0);
    uint64_t now = 0;
    if (rt::Status s = dev->device_time_cycles(&now); !s.ok()) return s;
    tf::window_records(*dev, in.origin_cycle, 0, &in.launches, &in.copies);
    // Several NPUs: the window's collectives (HCCL rows and a lane per chip; the launches and
    // copies are chip 0's).
    for (const rt::CollectiveRecord& c : dev->collective_records())
      if (c.start_cycle >= in.origin_cycle)
        in.comms.push_back(prof::comm_record(c, in.comms.size()));
    // The window's AI CPU tasks (chip 0's): AI_CPU rows.
    for (const rt::AiCpuRecord& t : dev->ai_cpu_records())
      if (t.start_cycle >= in.origin_cycle) in.ai_cpu.push_back(t);
    j["window"] = {{"origin_cycle", in.origin_cycle}, {"end_cycle", now}};
    in.pipe_trace = tf::ReportProfiler::instance().collector();
    in.extra = extra;
    in.extra.erase("phases");
    // Named parts of the window (npusim.mark_phase): phases/<name>/ and summary.txt's section.
    for (const nlohmann::json& p : extra.value("phases", nlohmann::json::array())) {
      if (!p.is_object() || !p.contains("name") || !p["name"].is_string())
        return rt::Status(rt::StatusCode::invalid_argument,
                          "a report phase needs a name: " + p.dump());
      prof::ReportPhase& ph = in.phases.emplace_back();
      ph.name = p["name"].get<std::string>();
      ph.origin_cycle = json_u64(p, "origin_cycle", 0);
      ph.end_cycle = json_u64(p, "end_cycle", 0);
      ph.items = p.contains("items") && p["items"].is_number() ? p["items"].get<double>() : 0.0;
      ph.unit = p.contains("unit") && p["unit"].is_string() ? p["unit"].get<std::string>() : "";
    }
    if (!in.extra.contains("device_memory")) {
      const rt::AllocatorStats m = dev->memory_stats();
      const tf::NpuGraphStats g = tf::npu_graph_stats();
      in.extra["device_memory"] = {{"allocator_in_use_bytes", m.bytes_in_use},
                                   {"allocator_peak_bytes", m.peak_bytes_in_use},
                                   {"graph_plans", g.plans},
                                   {"arenas_held", g.arenas_held},
                                   {"arena_bytes_held", g.arena_bytes_held},
                                   {"max_arena_bytes", g.max_arena_bytes},
                                   {"max_unplanned_bytes", g.max_unplanned_bytes}};
    }
    // Several NPUs: every chip's launches in a folder of its own, device_<k>/ (msprof's layout);
    // the top level keeps chip 0's and the collectives, and its per-chip time split counts the
    // other chips' kernels of their windows.
    const std::vector<std::shared_ptr<rt::Device>> devices = tf::open_devices();
    std::vector<prof::RuntimeReportInput> chip_inputs;
    if (devices.size() > 1) {
      const nlohmann::json origins = extra.value("origin_cycles", nlohmann::json::array());
      for (size_t k = 0; k < devices.size(); ++k) {
        rt::Device& d = *devices[k];
        prof::RuntimeReportInput& ck = chip_inputs.emplace_back();
        ck.title = fmt::format("{}, chip {} of {}", in.title, k, devices.size());
        ck.config = &d.config();
        ck.origin_cycle = k < origins.size() && origins[k].is_number_unsigned()
                              ? origins[k].get<uint64_t>()
                              : in.origin_cycle;
        tf::window_records(d, ck.origin_cycle, 0, &ck.launches, &ck.copies);
        ck.pipe_trace = tf::ReportProfiler::instance().collector(static_cast<int>(k));
        ck.extra = extra;
        const rt::AllocatorStats m = d.memory_stats();
        ck.extra["device_memory"] = {{"allocator_in_use_bytes", m.bytes_in_use},
                                     {"allocator_peak_bytes", m.peak_bytes_in_use}};
        if (k > 0) in.other_chip_kernels[static_cast<int>(k)] = prof::kernel_spans(ck.launches);
      }
    }
    const std::string python = extra.value("python", std::string());
    const std::string script = extra.value("plot_script", std::string());
    const bool plot = !python.empty() && !script.empty();
    // The plots start once the tables they read are written and draw while trace.json (the
    // largest file) and the rest are written.
    prof::PlotProcess plotting;
    if (plot)
      in.tables_written = [&] { plotting = prof::start_plot_script(dir, python, script); };
    j["files"] = prof::write_runtime_report(dir, in);
    for (size_t k = 0; k < chip_inputs.size(); ++k)
      for (std::string& f :
           prof::write_runtime_report(fmt::format("{}/device_{}", dir, k), chip_inputs[k]))
        j["files"].push_back(std::move(f));
    if (plot) {
      if (!plotting.started()) plotting = prof::start_plot_script(dir, python, script);
      const prof::PlotResult plots = prof::finish_plot_script(plotting);
      j["plots"] = {{"ok", plots.ok}, {"output", plots.output}};
      // Several NPUs: each device_<k>/ gets its chip's plots too (the same script on its files).
      if (devices.size() > 1) {
        j["device_plots"] = nlohmann::json::array();
        for (size_t k = 0; k < devices.size(); ++k) {
          const prof::PlotResult p =
              prof::run_plot_script(fmt::format("{}/device_{}", dir, k), python, script);
          j["device_plots"].push_back({{"ok", p.ok}, {"output", p.output}});
        }
      }
    }
    return rt::ok_status();
  });
  if (!st.ok()) j = {{"error", st.message()}};
  return to_c_string(j.dump());
}

// Per op type over the launches that started in [{"origin_cycle"}, {"end_cycle"}) (defaults 0:
// from the start, no end), longest first, at most
// {"top"} (0: all): [{"op_type", "count", "tasks", "time_us", "cube_utilization_pct",
// "vector_utilization_pct"}] (adapter/profiler/runtime_report.h, OpTypeSummary). [] if the
// device is not open; {"error"} on failure.
NPUSIM_TF_EXPORT char* npusim_tf_op_summary_json(const char* options_json) {
  using namespace npusim;
  nlohmann::json j = nlohmann::json::array();
  rt::Status st = rt::guard("npusim.op_summary", [&]() -> rt::Status {
    const nlohmann::json o = parse_or_empty(options_json);
    std::shared_ptr<rt::Device> dev = tf::device_if_open();
    if (!dev) return rt::ok_status();
    std::vector<rt::LaunchRecord> launches;
    tf::window_records(*dev, json_u64(o, "origin_cycle", 0), json_u64(o, "end_cycle", 0),
                       &launches, nullptr);
    for (const prof::OpTypeSummary& t :
         prof::op_type_summary(launches, dev->config(), json_u64(o, "top", 0)))
      j.push_back({{"op_type", t.op_type},
                   {"count", t.count},
                   {"tasks", t.tasks},
                   {"time_us", t.time_us},
                   {"cube_utilization_pct", t.cube_utilization_pct},
                   {"vector_utilization_pct", t.vector_utilization_pct}});
    return rt::ok_status();
  });
  if (!st.ok()) j = {{"error", st.message()}};
  return to_c_string(j.dump());
}
