#include "tools/offline_cli.h"

#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "adapter/compiler/compiler.h"
#include "adapter/graph/engine.h"
#include "adapter/graph/runner.h"
#include "adapter/profiler/op_metrics.h"
#include "adapter/profiler/report_writer.h"
#include "common/error.h"
#include "tools/kernel_io.h"
#include "tools/report_cli.h"

namespace npusim::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Runs argv, waits; throws if it cannot start or exits non-zero (it printed why on stderr).
void run_child(const std::vector<std::string>& args, const std::string& what) {
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) throw Error(fmt::format("{}: cannot fork: {}", what, std::strerror(errno)));
  if (pid == 0) {
    execvp(argv[0], argv.data());
    fmt::print(stderr, "npusim: cannot run '{}': {}\n", args[0], std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) throw Error(what + ": waitpid failed");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error(fmt::format("{} failed (exit {}; its message is above)", what,
                            WIFEXITED(status) ? WEXITSTATUS(status) : -1));
}

// The SavedModel through the TensorFlow frontend into `dir`; returns dir/graph.json.
std::string run_frontend(const CompileOptions& o, const std::string& dir) {
  std::string python = prof::find_report_python(source_dir());
  if (python.empty()) python = "python3";
  std::vector<std::string> args = {
      python,     source_dir() + "/tools/npusim_compile_frontend.py", o.model, dir, "--signature",
      o.signature};
  for (const auto& s : o.input_shapes) args.insert(args.end(), {"--input-shape", s});
  run_child(args, "the TensorFlow frontend (tools/npusim_compile_frontend.py)");
  return dir + "/graph.json";
}

graph::Graph load_model_graph(const CompileOptions& o) {
  if (fs::is_directory(o.model)) {
    char tmpl[] = "/tmp/npusim-compile-XXXXXX";
    if (!mkdtemp(tmpl)) throw Error("cannot create a temporary folder for the frontend");
    const std::string dir = tmpl;
    try {
      graph::Graph g = graph::load_graph_json(run_frontend(o, dir));
      fs::remove_all(dir);
      return g;
    } catch (...) {
      fs::remove_all(dir);
      throw;
    }
  }
  if (!o.input_shapes.empty())
    throw Error("--input-shape applies to a SavedModel; a graph.json has static shapes");
  return graph::load_graph_json(o.model);
}

std::vector<NpyArray> zero_inputs(const graph::OmModel& m) {
  std::vector<NpyArray> in;
  for (const graph::IoBinding& b : m.inputs) {
    NpyArray a;
    a.dtype = graph::npy_descr(b.desc.dtype);
    a.shape = b.desc.shape;
    a.data.assign(b.desc.bytes(), 0);
    in.push_back(std::move(a));
  }
  return in;
}

// Simulated cycles per node of one inference, timing only (cycles are those of a functional run).
json estimate(const graph::OmModel& m, const ChipConfig& cfg, const std::string& source) {
  SimOptions so;
  so.functional = false;
  Simulator sim(cfg, so);
  graph::OfflineRunner runner(m, sim, source);
  std::vector<graph::TaskRun> runs;
  runner.run(zero_inputs(m), std::vector<std::string>(m.inputs.size(), "zeros"), &runs);
  std::map<std::string, uint64_t> per_node;
  uint64_t total = 0;
  for (const auto& r : runs) {
    per_node[r.task->node] += r.result.cycles;
    total += r.result.cycles;
  }
  return {
      {"cycles", total}, {"time_us", cfg.cycles_to_us(double(total))}, {"node_cycles", per_node}};
}

void print_compile_report(const json& r, std::ostream& out) {
  out << fmt::format(
      "{}: chip {}, {}; {} graph node(s) -> {} launch(es) per inference "
      "({} once at load), {} distinct kernel(s)\n",
      r["output"].get<std::string>(), r["chip"].get<std::string>(),
      r["precision"].get<std::string>(), r["graph_nodes"].get<int>(), r["launches"].get<int>(),
      r["init_launches"].get<int>(), r["kernels"].get<int>());
  out << fmt::format("fusions applied: {}\n", r["fusions"].size());
  for (const json& f : r["fusions"])
    out << fmt::format("  {}  ({})\n", f["pattern"].get<std::string>(),
                       f["node"].get<std::string>());
  const json& mem = r["memory"];
  out << fmt::format(
      "memory plan: activations {} bytes at peak ({} without reuse, {} buffers), "
      "constants {} bytes\n",
      mem["activation_peak_bytes"].get<uint64_t>(),
      mem["activation_bytes_without_reuse"].get<uint64_t>(), mem["buffers"].size(),
      mem["constant_bytes"].get<uint64_t>());
  if (r.contains("estimate"))
    out << fmt::format(
        "estimated time: {:.2f} us per inference ({} cycles, timing-only "
        "simulation of the task list)\n",
        r["estimate"]["time_us"].get<double>(), r["estimate"]["cycles"].get<uint64_t>());
}

// --input/--output items "[NAME=]FILE" in the model's order: named ones to their slot, the others
// in order. Throws naming the option for an unknown name, a slot given twice or one missing.
std::vector<std::string> assign_files(const std::vector<std::string>& items,
                                      const std::vector<graph::IoBinding>& ios, const char* option,
                                      bool all_needed) {
  std::vector<std::string> files(ios.size());
  size_t next = 0;
  for (const std::string& item : items) {
    size_t slot = ios.size();
    std::string file = item;
    const size_t eq = item.find('=');
    if (eq != std::string::npos)
      for (size_t i = 0; i < ios.size(); ++i)
        if (ios[i].name == item.substr(0, eq)) slot = i, file = item.substr(eq + 1);
    if (slot == ios.size()) {
      while (next < ios.size() && !files[next].empty()) ++next;
      slot = next;
    }
    if (slot >= ios.size())
      throw Error(
          fmt::format("{} '{}': the model has {} {}(s)", option, item, ios.size(), option + 2));
    if (!files[slot].empty())
      throw Error(
          fmt::format("{} '{}': {} '{}' is given twice", option, item, option + 2, ios[slot].name));
    files[slot] = file;
  }
  for (size_t i = 0; all_needed && i < ios.size(); ++i)
    if (files[i].empty())
      throw Error(fmt::format("no {} given for the model's input '{}' ({})", option, ios[i].name,
                              ios[i].desc.str()));
  return files;
}

prof::TensorDesc report_tensor(const compiler::TensorDesc& t) {
  return {t.shape, prof::msprof_dtype(compiler::device_dtype(t.dtype))};
}

void write_infer_report(const InferOptions& o, const graph::OmModel& m, Simulator& sim,
                        const std::vector<graph::TaskRun>& runs, std::ostream& out) {
  const ChipConfig& cfg = sim.config();
  prof::ReportInput report;
  report.config = &cfg;
  report.title = "npusim infer " + o.model;
  report.per_op_utilisation = false;
  report.counter_detail_ops = m.tasks.size();
  for (const graph::TaskRun& r : runs) {
    const isa::Program& p = m.kernels[r.task->kernel];
    prof::OpRecord rec = op_record(p, cfg, r.task->block_dim, r.result);
    rec.op_name = r.task->node;
    rec.op_type = r.task->op_type;
    rec.kernel = p.name;
    for (const auto& t : r.task->inputs) rec.inputs.push_back(report_tensor(t));
    for (const auto& t : r.task->outputs) rec.outputs.push_back(report_tensor(t));
    report.ops.push_back(std::move(rec));
  }
  prof::set_wait_cycles(report.ops);
  report.session_counters = sim.counters();
  report.end_cycle = sim.now_cycles();
  write_cli_report(o.report_dir, report, out);
}

}  // namespace

void add_compile_options(CLI::App* app, CompileOptions& o) {
  app->add_option("model", o.model, "SavedModel folder (or a graph.json of the engine)")
      ->required();
  app->add_option("-o,--output", o.output, "the .om file to write")->required();
  app->add_option("--chip", o.chip, "chip preset or YAML file")->capture_default_str();
  app->add_option("--set", o.overrides, "override a chip key: dotted.key=value");
  app->add_option("--input-shape", o.input_shapes,
                  "fix an input's shape NAME:D0,D1,... (default: batch 1 for an unknown batch)");
  app->add_option("--signature", o.signature, "the SavedModel signature")->capture_default_str();
  app->add_option("--precision", o.precision,
                  "allow_fp32_to_fp16 | must_keep_origin_dtype | allow_mix_precision")
      ->capture_default_str();
  app->add_flag("--fusion,!--no-fusion", o.fusion, "apply the fusion passes (default on)");
  app->add_flag("--estimate,!--no-estimate", o.estimate,
                "simulate one inference (timing only) for the estimated time (default on)");
  app->add_option("--report", o.report_path, "write the compile report as JSON");
}

void add_infer_options(CLI::App* app, InferOptions& o, const char* watchdog_help) {
  app->add_option("model", o.model, "the .om file")->required();
  app->add_option("--input", o.inputs, "input [NAME=]FILE.npy (repeat, in the model's order)");
  app->add_option("--output", o.outputs, "write output [NAME=]FILE.npy (repeat)");
  app->add_option("--chip", o.chip, "check that the model is for this chip (preset or YAML)");
  app->add_option("--set", o.overrides, "override a key of --chip: dotted.key=value");
  app->add_option("--loop", o.loop, "run the inference N times")->capture_default_str();
  app->add_option("--report-dir", o.report_dir, "write the msprof-style report folder");
  app->add_option("--json", o.json_path, "write the figures as JSON");
  app->add_flag("--concurrent", o.concurrent,
                "run independent tasks at once, in groups on disjoint cores (default: in order)");
  app->add_option("--max-insns-per-block", o.max_insns_per_block, watchdog_help)
      ->capture_default_str();
}

int run_compile(const CompileOptions& o, std::ostream& out) {
  const auto t0 = std::chrono::steady_clock::now();
  ChipConfig cfg = load_chip(o.chip, o.overrides);
  graph::EngineOptions eo;
  auto precision = compiler::precision_mode_from_name(o.precision);
  if (!precision) throw Error(fmt::format("--precision '{}': unknown mode", o.precision));
  eo.precision = *precision;
  eo.fusion = o.fusion;
  graph::Graph g = load_model_graph(o);
  const int graph_nodes = int(g.nodes.size());
  graph::OmModel m = graph::compile_graph(std::move(g), cfg, eo);
  json r = m.info;
  r["output"] = o.output;
  r["chip"] = cfg.name;
  r["precision"] = m.precision;
  r["graph_nodes"] = graph_nodes;
  r["launches"] = m.tasks.size();
  r["init_launches"] = m.init_tasks.size();
  r["kernels"] = m.kernels.size();
  if (o.estimate) r["estimate"] = estimate(m, cfg, o.output);
  write_om_file(m, o.output);
  r["compile_s"] = seconds_since(t0);
  print_compile_report(r, out);
  if (!o.report_path.empty()) {
    std::ofstream f(o.report_path);
    if (!f) throw Error("cannot write '" + o.report_path + "'");
    f << r.dump(1) << "\n";
  }
  return 0;
}

int run_infer(const InferOptions& o, std::ostream& out) {
  if (o.loop < 1) throw Error(fmt::format("--loop {}: at least 1", o.loop));
  const auto t0 = std::chrono::steady_clock::now();
  const graph::OmModel m = graph::read_om_file(o.model);
  ChipConfig cfg = o.chip.empty() ? graph::model_chip(m) : load_chip(o.chip, o.overrides);
  graph::check_model_chip(m, cfg, o.model);
  const std::vector<std::string> in_files = assign_files(o.inputs, m.inputs, "--input", true);
  const std::vector<std::string> out_files = assign_files(o.outputs, m.outputs, "--output", false);
  std::vector<NpyArray> inputs;
  for (const std::string& f : in_files) inputs.push_back(read_npy(f));
  SimOptions so;
  so.max_insns_per_block = o.max_insns_per_block;
  Simulator sim(cfg, so);
  graph::OfflineRunner runner(m, sim, o.model);
  runner.set_counter_trees(!o.report_dir.empty());
  runner.set_concurrent(o.concurrent);
  const double load_s = seconds_since(t0);
  std::vector<graph::TaskRun> runs;
  std::vector<NpyArray> outputs;
  double first_s = 0;
  uint64_t first_cycle = sim.now_cycles();
  const auto t1 = std::chrono::steady_clock::now();
  for (int i = 0; i < o.loop; ++i) {
    const auto ti = std::chrono::steady_clock::now();
    outputs = runner.run(inputs, in_files, o.report_dir.empty() ? nullptr : &runs);
    if (i == 0) first_s = seconds_since(ti);
  }
  const double loop_s = seconds_since(t1);
  const double sim_us = cfg.cycles_to_us(double(sim.now_cycles() - first_cycle)) / o.loop;
  for (size_t i = 0; i < outputs.size(); ++i)
    if (!out_files[i].empty()) write_npy(out_files[i], outputs[i]);
  out << fmt::format(
      "{}: chip {}, {} launch(es) per inference; {} inference(s): simulated "
      "{:.2f} us each (host copies included); wall {:.3f} s each (first {:.3f} s, "
      "load {:.3f} s); {} launch(es) replayed\n",
      o.model, cfg.name, m.tasks.size(), o.loop, sim_us, loop_s / o.loop, first_s, load_s,
      runner.replayed_launches());
  const size_t groups = runner.concurrent_task_groups().groups.size();
  if (o.concurrent) {
    size_t together = 0;  // tasks in groups of two or more
    for (const auto& g : runner.concurrent_task_groups().groups)
      together += g.size() > 1 ? g.size() : 0;
    out << fmt::format(
        "concurrent: {} group(s) per inference, {} of the {} launches beside others\n", groups,
        together, m.tasks.size());
  }
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    if (!f) throw Error("cannot write '" + o.json_path + "'");
    json j{{"chip", cfg.name},
           {"launches", m.tasks.size()},
           {"loop", o.loop},
           {"simulated_us_per_inference", sim_us},
           {"wall_s_per_inference", loop_s / o.loop},
           {"first_wall_s", first_s},
           {"load_s", load_s},
           {"replayed_launches", runner.replayed_launches()}};
    if (o.concurrent) j["concurrent_groups"] = groups;
    f << j.dump(1) << "\n";
  }
  if (!o.report_dir.empty()) write_infer_report(o, m, sim, runs, out);
  return 0;
}

}  // namespace npusim::cli
