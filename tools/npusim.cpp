// The npusim command line: assemble, inspect, verify and run kernels on a chip model.
//   npusim run KERNEL --chip 910b --in a=a.npy --out c=c.npy --arg M=64 ...
//   npusim demo | asm | disasm | verify | chips | config
//   npusim compile | infer   (offline models, tools/offline_cli.h)
//   npusim collective        (one collective on a multi-chip system, tools/collective_cli.h)
//   npusim sweep | explore | validate   (Python tools, tools/script_cli.h)
// Exit codes: 0 ok, 1 bad input (usage, files, config, assembly), 3 the kernel faulted.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>

#include "adapter/profiler/instruction_profiler.h"
#include "adapter/profiler/op_metrics.h"
#include "common/error.h"
#include "common/npy.h"
#include "isa/disassembler.h"
#include "isa/kernel_file.h"
#include "sim/simulator.h"
#include "sim/verifier/verifier.h"
#include "tools/collective_cli.h"
#include "tools/demo.h"
#include "tools/device_buffers.h"
#include "tools/kernel_io.h"
#include "tools/offline_cli.h"
#include "tools/op_cli.h"
#include "tools/report_cli.h"
#include "tools/script_cli.h"
#include "tools/summary.h"

using namespace npusim;

namespace {

constexpr int kExitBadInput = 1;
constexpr int kExitKernelFault = 3;
constexpr const char* kWatchdogHelp =
    "watchdog: a block may execute N instructions per 128 KiB of the launch's tensor arguments "
    "(at least N), then it faults; 0 turns it off";

struct ChipOptions {
  std::string chip = "910b";
  std::vector<std::string> overrides;
  void add(CLI::App* app) {
    app->add_option("--chip", chip, "chip preset name or YAML file")->capture_default_str();
    app->add_option("--set", overrides, "override a chip key: dotted.key=value (repeatable)");
  }
};

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  if (!out) throw Error("cannot write '" + path + "'");
  out << j.dump(1) << "\n";
}

// "name=value" -> (name, value); `what` names the option for errors.
std::pair<std::string, std::string> split_assignment(const std::string& s,
                                                     const std::string& what) {
  auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(fmt::format("{} '{}': expected NAME=VALUE", what, s));
  return {s.substr(0, eq), s.substr(eq + 1)};
}

struct RunOptions {
  ChipOptions chip;
  std::string kernel;
  std::vector<std::string> inputs, outputs, scalars;
  int blocks = 0;
  std::string counters_path, trace_path, config_out, report_dir, json_path;
  bool timing_only = false;
  bool quiet = false;
  uint64_t max_insns_per_block = SimOptions{}.max_insns_per_block;
};

// How the command line gives one kernel argument: the option ("--in", "--out", "--arg") and
// what follows "NAME=".
struct GivenArg {
  std::string option, value;
  std::string where(const std::string& name) const {
    return fmt::format("{} {}={}", option, name, value);
  }
};

// Collects --in, --out and --arg by argument name. Each must name an argument of the kernel, and
// each argument must be given exactly once.
std::map<std::string, GivenArg> given_args(const RunOptions& o, const isa::Program& prog) {
  std::map<std::string, GivenArg> given;
  auto collect = [&](const std::vector<std::string>& specs, const char* option) {
    for (const auto& spec : specs) {
      auto [name, value] = split_assignment(spec, option);
      if (std::find(prog.arg_names.begin(), prog.arg_names.end(), name) == prog.arg_names.end())
        throw Error(fmt::format("kernel '{}' has no argument '{}' (it declares: {})", prog.name,
                                name, fmt::join(prog.arg_names, ", ")));
      auto [it, inserted] = given.emplace(name, GivenArg{option, value});
      if (!inserted)
        throw Error(fmt::format("{} {}: argument '{}' is already given by {}", option, spec, name,
                                it->second.where(name)));
    }
  };
  collect(o.inputs, "--in");
  collect(o.outputs, "--out");
  collect(o.scalars, "--arg");
  for (const auto& name : prog.arg_names)
    if (!given.count(name))
      throw Error(fmt::format("kernel '{}' needs argument '{}': give it with --in, --out or --arg",
                              prog.name, name));
  return given;
}

// The figures of `npusim run --json`: `meta` plus cube and vector utilisation (of the whole
// chip's peak), GM and HBM bytes and the buffer high-water marks (bytes, max over cores).
nlohmann::json run_figures(nlohmann::json meta, const ChipConfig& cfg, const isa::Program& prog,
                           int block_dim, const KernelResult& r) {
  const prof::OpMetrics m = prof::compute_op_metrics(cli::op_record(prog, cfg, block_dim, r), cfg);
  std::map<std::string, uint64_t> high_water, activity;
  cli::merge_buffer_high_water(r.counters, high_water);
  cli::merge_activity(r.counters, activity);
  meta["activity"] = activity;
  meta["cube_utilization_pct"] = m.cube_utilization_pct;
  meta["vector_utilization_pct"] = cli::vector_utilization_pct(cfg, m.vector_repeats, r.cycles);
  meta["hbm_bytes"] = m.hbm_read_bytes + m.hbm_write_bytes;
  meta["gm_bytes"] = m.gm_read_bytes + m.gm_write_bytes;
  meta["roofline_bound_us"] = m.roofline_bound_us;
  meta["buffer_high_water_bytes"] = high_water;
  return meta;
}

int cmd_run(const RunOptions& o) {
  ChipConfig cfg = cli::load_chip(o.chip.chip, o.chip.overrides);
  isa::Program prog = cli::load_kernel(o.kernel);
  isa::verify_or_throw(prog, cfg);
  const std::map<std::string, GivenArg> given = given_args(o, prog);
  std::map<std::string, uint64_t> scalars;  // --arg values, which also give dimensions
  for (const auto& [name, g] : given) {
    if (g.option != "--arg") continue;
    try {
      scalars[name] = std::stoull(g.value, nullptr, 0);
    } catch (const std::exception&) {
      throw Error(fmt::format("--arg {}: '{}' is not an integer", name, g.value));
    }
  }

  SimOptions so;
  so.functional = !o.timing_only;
  so.trace = !o.trace_path.empty();
  so.max_insns_per_block = o.max_insns_per_block;
  prof::InstructionProfiler profiler(cfg);  // outlives the Simulator it observes
  Simulator sim(cfg, so);
  cli::DeviceArena arena(sim);
  KernelLaunch launch;
  launch.program = &prog;
  std::vector<cli::DeviceTensor> outs;
  prof::OpRecord op;  // for --report-dir: the tensors, in argument order
  for (size_t i = 0; i < prog.arg_names.size(); ++i) {
    const std::string& name = prog.arg_names[i];
    const GivenArg& g = given.at(name);
    const std::string where = g.where(name);
    if (g.option == "--arg") {
      launch.args.push_back(scalars.at(name));
      continue;
    }
    cli::ArgShape shape = cli::resolve_arg_shape(prog.arg(i), scalars);
    if (g.option == "--in") {
      NpyArray a;
      try {
        a = read_npy(g.value);
      } catch (const Error& e) {
        throw Error(fmt::format("{}: {}", where, e.what()));
      }
      cli::check_input(shape, a, g.value, where);
      launch.args.push_back(arena.upload(a, where));
      op.inputs.push_back(cli::tensor_desc(a, shape.arg.dtype));
    } else {  // --out FILE.npy[:DTYPE:SHAPE]
      auto colon = g.value.find(':');
      cli::DeviceTensor t;
      t.name = g.value.substr(0, colon);  // the file
      t.host = cli::output_array(shape, colon == std::string::npos ? "" : g.value.substr(colon + 1),
                                 t.name, where);
      t.addr = arena.allocate(static_cast<uint64_t>(t.host.elements()) * t.host.item_size(), where);
      launch.args.push_back(t.addr);
      op.outputs.push_back(cli::tensor_desc(t.host, shape.arg.dtype));
      outs.push_back(std::move(t));
    }
  }
  launch.block_dim = o.blocks > 0 ? o.blocks : cli::default_block_dim(prog, cfg);
  // Each --in and --out buffer is an allocation block, as a TensorFlow tensor is (DeviceArena).
  launch.gm_blocks = arena.blocks();

  if (!o.report_dir.empty()) sim.add_observer(&profiler);
  KernelResult r = sim.run(launch);
  if (!r.ok) {
    std::cerr << "npusim: kernel " << prog.name << " failed: " << r.error << "\n";
    return kExitKernelFault;
  }
  for (auto& t : outs) {
    arena.download(t.addr, t.host);
    write_npy(t.name, t.host);
  }
  nlohmann::json meta = {{"kernel", prog.name},           {"chip", cfg.name},
                         {"block_dim", launch.block_dim}, {"cycles", r.cycles},
                         {"time_us", r.time_us},          {"functional", !o.timing_only}};
  if (!o.counters_path.empty())
    write_json(o.counters_path, {{"run", meta}, {"counters", r.counters}});
  if (!o.json_path.empty())
    write_json(o.json_path, run_figures(meta, cfg, prog, launch.block_dim, r));
  if (!o.trace_path.empty()) write_json(o.trace_path, sim.trace());
  if (!o.config_out.empty()) {
    std::ofstream out(o.config_out);
    out << dump_chip_config_yaml(cfg);
  }
  if (!o.quiet) cli::print_summary(std::cout, cfg, prog.name, launch.block_dim, r);
  if (!o.report_dir.empty()) {
    prof::OpRecord rec = cli::op_record(prog, cfg, launch.block_dim, r);
    rec.inputs = std::move(op.inputs);
    rec.outputs = std::move(op.outputs);
    rec.instructions = profiler.launches().back();
    prof::ReportInput report;
    report.title = fmt::format("npusim run {} (chip {}{})", o.kernel, cfg.name,
                               o.timing_only ? ", timing-only" : "");
    report.config = &cfg;
    report.ops.push_back(std::move(rec));
    prof::set_wait_cycles(report.ops);
    report.session_counters = sim.counters();
    report.end_cycle = sim.now_cycles();
    nlohmann::json trace;
    if (so.trace) {
      trace = sim.trace();
      report.trace = &trace;
    }
    cli::write_cli_report(o.report_dir, report, std::cout);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"npusim: an Ascend-class NPU model - assemble, verify and run kernels"};
  app.require_subcommand(1);

  RunOptions run;
  auto* c_run = app.add_subcommand("run", "run a kernel on a chip model");
  c_run->add_option("kernel", run.kernel, "kernel: assembly (.s) or binary (.npuk)")->required();
  run.chip.add(c_run);
  c_run->add_option("--in", run.inputs, "input argument NAME=FILE.npy (copied to device memory)");
  c_run->add_option("--out", run.outputs,
                    "output argument NAME=FILE.npy[:DTYPE:SHAPE] (the type is optional for "
                    "typed kernel arguments)");
  c_run->add_option("--arg", run.scalars, "scalar argument NAME=INTEGER");
  c_run->add_option("--blocks", run.blocks, "block_dim (default: every core the kernel runs on)");
  c_run->add_option("--counters", run.counters_path, "write the counter tree as JSON");
  c_run->add_option("--trace", run.trace_path, "write a Chrome-trace timeline (Perfetto)");
  c_run->add_option("--config-out", run.config_out, "write the resolved chip config as YAML");
  c_run->add_option("--report-dir", run.report_dir,
                    "write an msprof-style report folder (docs/reports.md)");
  c_run->add_option(
      "--json", run.json_path,
      "write the figures as JSON (time, utilisation, bytes, buffer high-water marks)");
  c_run->add_flag("--timing-only", run.timing_only, "skip functional effects (same cycles)");
  c_run->add_flag("--quiet", run.quiet, "no summary");
  c_run->add_option("--max-insns-per-block", run.max_insns_per_block, kWatchdogHelp)
      ->capture_default_str();

  cli::DemoOptions demo;
  auto* c_demo =
      app.add_subcommand("demo", "run the built-in GEMM and vector-add kernels and print counters");
  c_demo->add_option("--chip", demo.chip, "chip preset or YAML file")->capture_default_str();
  c_demo->add_option("--set", demo.overrides, "override a chip key: dotted.key=value");
  c_demo->add_option("--counters", demo.counters_path, "write both kernels' counters as JSON");
  c_demo->add_option("--trace", demo.trace_path, "write a Chrome-trace timeline (Perfetto)");
  c_demo->add_option("--report-dir", demo.report_dir,
                     "write an msprof-style report folder, the two kernels as two ops");
  c_demo->add_flag("--timing-only", demo.timing_only,
                   "skip functional effects and the result check");
  c_demo->add_flag("--concurrent", demo.concurrent,
                   "then run both kernels at once (cube and vector cores) and print alone, "
                   "sequence and concurrent cycles");

  cli::OpOptions op;
  auto* c_op = app.add_subcommand(
      "op", "compile one TensorFlow op with the kernel compiler and run it on a chip");
  c_op->add_option("op", op.op, "TF op type, e.g. MatMul, AddV2, Conv2D")->required();
  c_op->add_option("--input", op.inputs,
                   "input tensor: DTYPE:SHAPE (random data, e.g. f16:64x128) or FILE.npy (repeat)");
  c_op->add_option("--output", op.outputs, "write output i to FILE.npy (repeat, in order)");
  c_op->add_option("--attr", op.attrs, "attribute NAME=VALUE: int, float, true/false, [1,2], text");
  c_op->add_option("--chip", op.chip, "chip preset or YAML file")->capture_default_str();
  c_op->add_option("--set", op.overrides, "override a chip key: dotted.key=value");
  c_op->add_option("--precision", op.precision,
                   "allow_fp32_to_fp16 | must_keep_origin_dtype | allow_mix_precision")
      ->capture_default_str();
  c_op->add_flag("--timing-only", op.timing_only, "skip functional effects (same cycles)");
  c_op->add_flag("--listing", op.listing, "print the generated assembly of each launch");
  c_op->add_option("--max-insns-per-block", op.max_insns_per_block, kWatchdogHelp)
      ->capture_default_str();
  c_op->add_option("--report-dir", op.report_dir, "write the msprof-style report folder");
  c_op->add_option("--json", op.json_path, "write the figures as JSON");
  c_op->add_option("--trace", op.trace_path,
                   "write a Chrome-trace timeline of every launch (Perfetto)");
  c_op->add_option("--before", op.before,
                   "run OP:DTYPE:SHAPE[,DTYPE:SHAPE...] first, not counted (repeat): e.g. a "
                   "benchmark's L2 flush, seen with memory.l2.keep_across_launches");
  c_op->add_option(
      "--host-loop", op.host_loop,
      "call the op N times back to back from an eager host that pays "
      "host.op_dispatch_us a call and runs ahead of the device; print the loop's time");
  c_op->add_option("--host-warmup", op.host_warmup,
                   "with --host-loop: N calls first, not counted (a benchmark's warm-ups)");

  std::string asm_in, asm_out;
  auto* c_asm = app.add_subcommand("asm", "assemble to a binary kernel (.npuk)");
  c_asm->add_option("input", asm_in, "assembly file")->required();
  c_asm->add_option("-o,--output", asm_out, "output .npuk")->required();

  std::string dis_in;
  auto* c_dis = app.add_subcommand("disasm", "disassemble a kernel (.npuk or .s)");
  c_dis->add_option("input", dis_in, "kernel file")->required();

  std::string ver_in;
  ChipOptions ver_chip;
  auto* c_ver = app.add_subcommand("verify", "check a kernel against a chip without running it");
  c_ver->add_option("kernel", ver_in, "kernel file")->required();
  ver_chip.add(c_ver);

  auto* c_sweep = cli::add_script_subcommand(
      app, "sweep",
      "architecture exploration: run a grid of chip configs x workloads (docs/sweep.md)");
  auto* c_explore = cli::add_script_subcommand(
      app, "explore", "design-space search over chip configs with Optuna (docs/sweep.md)");

  auto* c_validate = cli::add_script_subcommand(
      app, "validate", "reproduce published measurements of Ascend silicon (docs/validation.md)");

  cli::CollectiveOptions coll;
  auto* c_coll = cli::add_collective_command(app, coll);

  cli::CompileOptions compile;
  auto* c_compile = app.add_subcommand("compile", "compile a SavedModel to an offline model (.om)");
  cli::add_compile_options(c_compile, compile);
  cli::InferOptions infer;
  auto* c_infer = app.add_subcommand("infer", "run an offline model (.om) on its chip");
  cli::add_infer_options(c_infer, infer, kWatchdogHelp);

  auto* c_chips = app.add_subcommand("chips", "list the chip presets");

  ChipOptions cfg_chip;
  auto* c_cfg = app.add_subcommand("config", "print a resolved chip config (YAML)");
  cfg_chip.add(c_cfg);

  CLI11_PARSE(app, argc, argv);
  try {
    if (c_run->parsed()) return cmd_run(run);
    if (c_op->parsed()) return cli::run_op(op, std::cout);
    if (c_demo->parsed()) return cli::run_demo(demo, std::cout);
    if (c_compile->parsed()) return cli::run_compile(compile, std::cout);
    if (c_infer->parsed()) return cli::run_infer(infer, std::cout);
    if (c_sweep->parsed()) return cli::run_script_subcommand(c_sweep, "tools/npusim_sweep.py");
    if (c_explore->parsed())
      return cli::run_script_subcommand(c_explore, "tools/npusim_explore.py");
    if (c_validate->parsed())
      return cli::run_script_subcommand(c_validate, "tools/npusim_validate.py");
    if (c_coll->parsed()) return cli::run_collective_command(coll, std::cout);
    if (c_asm->parsed()) {
      isa::Program p = cli::load_kernel(asm_in);
      std::vector<uint8_t> bytes = isa::write_kernel(p);
      std::ofstream out(asm_out, std::ios::binary);
      if (!out) throw Error("cannot write '" + asm_out + "'");
      out.write(reinterpret_cast<const char*>(bytes.data()),
                static_cast<std::streamsize>(bytes.size()));
      std::cout << fmt::format("{}: {} sections, {} bytes\n", asm_out, p.sections.size(),
                               bytes.size());
      return 0;
    }
    if (c_dis->parsed()) {
      std::cout << isa::disassemble(cli::load_kernel(dis_in));
      return 0;
    }
    if (c_ver->parsed()) {
      ChipConfig cfg = cli::load_chip(ver_chip.chip, ver_chip.overrides);
      isa::verify_or_throw(cli::load_kernel(ver_in), cfg);
      std::cout << ver_in << ": ok for chip " << cfg.name << "\n";
      return 0;
    }
    if (c_chips->parsed()) {
      for (const auto& name : list_chip_presets()) {
        ChipConfig c = load_chip_config(name);
        std::cout << fmt::format("{:<6} {}\n", name, cli::describe_chip(c));
      }
      return 0;
    }
    if (c_cfg->parsed()) {
      std::cout << dump_chip_config_yaml(cli::load_chip(cfg_chip.chip, cfg_chip.overrides));
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "npusim: error: " << e.what() << "\n";
    return kExitBadInput;
  }
  return 0;
}
