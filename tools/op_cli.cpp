#include "tools/op_cli.h"

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "adapter/compiler/compiler.h"
#include "adapter/profiler/op_metrics.h"
#include "common/error.h"
#include "common/npy.h"
#include "common/numeric.h"
#include "sim/simulator.h"
#include "tools/device_buffers.h"
#include "tools/kernel_io.h"
#include "tools/report_cli.h"
#include "tools/summary.h"

namespace npusim::cli {
namespace {

using compiler::DataType;

bool is_npy(const std::string& s) { return s.size() > 4 && s.compare(s.size() - 4, 4, ".npy") == 0; }

// The compiler's type of a .npy array (bool arrays are "b1").
DataType npy_data_type(const NpyArray& a, const std::string& where) {
  if (a.dtype == "b1") return DataType::BOOL;
  auto t = isa_dtype_of_npy(a.dtype);
  auto d = t ? compiler::data_type_from_name(isa::dtype_name(*t)) : std::nullopt;
  if (!d) throw Error(fmt::format("{}: numpy dtype '{}' has no device type", where, a.dtype));
  return *d;
}

// "f32:8x3" -> TensorDesc; an empty shape ("f32:") is a scalar.
// `prefix`: where the spec came from, for errors ("--input", then the index).
compiler::TensorDesc parse_input(const std::string& spec, int index,
                                 const std::string& prefix = "--input") {
  const std::string where = fmt::format("{} {} ('{}')", prefix, index, spec);
  auto colon = spec.find(':');
  if (colon == std::string::npos)
    throw Error(where + ": expected DTYPE:SHAPE, e.g. f16:64x128 (f32:, for a scalar)");
  auto dtype = compiler::data_type_from_name(spec.substr(0, colon));
  if (!dtype) throw Error(fmt::format("{}: unknown dtype '{}'", where, spec.substr(0, colon)));
  compiler::TensorDesc t;
  t.dtype = *dtype;
  std::string shape = spec.substr(colon + 1);
  if (!shape.empty()) t.shape = parse_tensor_spec("f32:" + shape, where).shape;
  return t;
}

// NAME=VALUE with VALUE an int, a float, true/false, an int list "[1,2]", a string list "[a b,c]" or a string.
std::pair<std::string, compiler::AttrValue> parse_attr(const std::string& s) {
  auto eq = s.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(fmt::format("--attr '{}': expected NAME=VALUE", s));
  std::string name = s.substr(0, eq), v = s.substr(eq + 1);
  if (v == "true" || v == "false") return {name, v == "true"};
  if (!v.empty() && v.front() == '[' && v.back() == ']') {
    // Items separated by commas: an int list if every item is an integer, else a string list
    // (e.g. FusedElementwise's steps=[Mul i0 i1,AddV2 s0 i2]).
    std::vector<std::string> items;
    const std::string body = v.substr(1, v.size() - 2);
    for (size_t pos = 0; pos < body.size();) {
      const size_t comma = body.find(',', pos);
      items.push_back(body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos));
      if (comma == std::string::npos) break;
      pos = comma + 1;
    }
    std::vector<int64_t> list;
    for (const std::string& item : items) {
      size_t used = 0;
      try {
        list.push_back(std::stoll(item, &used));
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != item.size()) return {name, items};
    }
    return {name, list};
  }
  try {
    size_t used = 0;
    long long i = std::stoll(v, &used);
    if (used == v.size()) return {name, static_cast<int64_t>(i)};
    double d = std::stod(v, &used);
    if (used == v.size()) return {name, d};
  } catch (const std::exception&) {
  }
  return {name, v};
}

// Deterministic input data: floats uniform in [-1, 1], integers in [-8, 8], bools 0/1.
std::vector<uint8_t> random_bytes(const compiler::TensorDesc& t, std::mt19937& rng) {
  const int64_t n = t.num_elements();
  std::vector<uint8_t> bytes(compiler::device_buffer_bytes(t.bytes()));
  std::uniform_real_distribution<float> real(-1.0f, 1.0f);
  std::uniform_int_distribution<int> small(-8, 8);
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* p = bytes.data() + i * compiler::data_type_bytes(t.dtype);
    switch (t.dtype) {
      case DataType::F32: { float f = real(rng); std::memcpy(p, &f, 4); break; }
      case DataType::F16: { uint16_t h = f32_to_f16(real(rng)); std::memcpy(p, &h, 2); break; }
      case DataType::BF16: { uint16_t h = f32_to_bf16(real(rng)); std::memcpy(p, &h, 2); break; }
      case DataType::BOOL: *p = static_cast<uint8_t>(rng() & 1); break;
      default: {
        int64_t v = small(rng);
        std::memcpy(p, &v, compiler::data_type_bytes(t.dtype));  // little-endian truncation
      }
    }
  }
  return bytes;
}

// A compiled op's device buffers: its inputs (holding input_bytes(i)), outputs and workspace,
// named "<label>input 0", ... in the arena, each in a block of its own laid out as the TF plugin
// lays out an op's tensors and workspace (DeviceArena::allocate_tensor). Each input's device buffer is allocated
// before its host bytes are made, so a tensor larger than the device is refused by the arena,
// naming it, rather than by the host's allocator.
struct OpBuffers {
  const DeviceArena& arena;
  std::vector<uint64_t> in, out;
  uint64_t workspace = 0;

  template <class InputBytes>
  OpBuffers(Simulator& sim, DeviceArena& arena, const compiler::CompiledKernel& k,
            const std::vector<compiler::TensorDesc>& inputs, InputBytes input_bytes,
            const std::string& label)
      : arena(arena) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      const uint64_t size = compiler::device_buffer_bytes(inputs[i].bytes());
      in.push_back(arena.allocate_tensor(size, fmt::format("{}input {}", label, i)));
      std::vector<uint8_t> bytes = input_bytes(i);
      bytes.resize(size);
      if (!bytes.empty()) sim.copy_host_to_device(in.back(), bytes.data(), bytes.size());
    }
    for (size_t i = 0; i < k.outputs.size(); ++i)
      out.push_back(arena.allocate_tensor(compiler::device_buffer_bytes(k.outputs[i].bytes()),
                                          fmt::format("{}output {}", label, i)));
    if (k.workspace_bytes)
      workspace = arena.allocate_tensor(k.workspace_bytes, label + "workspace");
  }

  KernelLaunch launch(const compiler::Launch& l) const {
    return arena.launch(l.kernel.program, l.bind(in, out, workspace), l.block_dim);
  }
};

// A --before op, "OP:SPEC[,SPEC...]", compiled for the chip and run on `sim` (its inputs random,
// its outputs and workspace in the arena). Its figures are not kept: the caller wants the state
// it leaves (the L2's lines when the chip keeps them across launches). Returns false (after
// printing why) when a launch failed.
bool run_before_op(const std::string& spec, Simulator& sim, DeviceArena& arena,
                   const ChipConfig& cfg, compiler::PrecisionMode precision, std::mt19937& rng,
                   std::ostream& out) {
  const std::string where = fmt::format("--before '{}'", spec);
  const auto colon = spec.find(':');
  if (colon == std::string::npos || colon == 0)
    throw Error(where + ": expected OP:DTYPE:SHAPE[,DTYPE:SHAPE...], e.g. ZerosLike:f32:50331648");
  compiler::OpDesc desc;
  desc.type = spec.substr(0, colon);
  std::string rest = spec.substr(colon + 1);
  for (size_t start = 0; start <= rest.size();) {
    const size_t comma = std::min(rest.find(',', start), rest.size());
    desc.inputs.push_back(
        parse_input(rest.substr(start, comma - start), int(desc.inputs.size()), where + " input"));
    start = comma + 1;
  }
  compiler::CompiledKernel k;
  try {
    k = compiler::compile(desc, cfg, precision);
  } catch (const std::exception& e) {
    throw Error(fmt::format("{}: {}", where, e.what()));
  }
  const OpBuffers buffers(
      sim, arena, k, desc.inputs, [&](size_t i) { return random_bytes(desc.inputs[i], rng); },
      where + " ");
  uint64_t cycles = 0;
  for (size_t i = 0; i < k.launches.size(); ++i) {
    const compiler::Launch& l = k.launches[i];
    const KernelResult r = sim.run(buffers.launch(l));
    if (!r.ok) {
      out << fmt::format("{}: launch {} ({}) failed: {}\n", where, i, l.kernel.program.name,
                         r.error);
      return false;
    }
    cycles += r.cycles;
  }
  out << fmt::format("before: {} ran {} launch(es), {} cycles (not counted){}\n", desc.str(),
                     k.launches.size(), cycles,
                     cfg.l2_keep_across_launches ? "" : "; the L2 starts cold at every launch, "
                     "so it leaves no state (memory.l2.keep_across_launches)");
  return true;
}

// The op called `calls` times back to back by an eager host loop (a benchmark timing N framework
// calls between two device synchronizes): each call's host issue takes `issue` cycles, the host
// runs ahead of the device (an asynchronous launch queue), and a call's first launch starts when
// both its issue and the device's previous launch are done. `launch_cycles[c]`: call c's launches'
// Task Durations in order. Returns the loop's cycles, from the first issue's start to the last
// launch's end (a device synchronize that returns at once).
uint64_t host_loop_cycles(const std::vector<std::vector<uint64_t>>& launch_cycles, uint64_t issue) {
  uint64_t host = 0, device = 0;
  for (const auto& call : launch_cycles) {
    host += issue;
    device = std::max(device, host);
    for (uint64_t c : call) device += c;
  }
  return device;
}

}  // namespace

int run_op(const OpOptions& o, std::ostream& out) {
  const auto wall0 = std::chrono::steady_clock::now();
  ChipConfig cfg = load_chip(o.chip, o.overrides);
  auto precision = compiler::precision_mode_from_name(o.precision);
  if (!precision) throw Error(fmt::format("--precision '{}': unknown mode", o.precision));
  compiler::OpDesc desc;
  desc.type = o.op;
  std::vector<NpyArray> given(o.inputs.size());  // arrays of inputs given as .npy files
  for (size_t i = 0; i < o.inputs.size(); ++i) {
    if (is_npy(o.inputs[i])) {
      given[i] = read_npy(o.inputs[i]);
      desc.inputs.push_back({npy_data_type(given[i], "--input " + o.inputs[i]), given[i].shape});
    } else {
      desc.inputs.push_back(parse_input(o.inputs[i], int(i)));
    }
  }
  for (const auto& a : o.attrs) desc.attrs.insert(parse_attr(a));

  const auto c0 = std::chrono::steady_clock::now();
  compiler::CompiledKernel k = compiler::compile(desc, cfg, *precision);
  const double compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - c0).count();
  out << fmt::format("{} on chip '{}' ({}): {} launch(es), workspace {} bytes, compiled in {:.1f} ms\n",
                     desc.str(), cfg.name, compiler::precision_mode_name(*precision),
                     k.launches.size(), k.workspace_bytes, compile_s * 1e3);

  SimOptions so;
  so.functional = !o.timing_only;
  so.trace = !o.trace_path.empty();
  so.max_insns_per_block = o.max_insns_per_block;
  Simulator sim(cfg, so);
  DeviceArena arena(sim);
  std::mt19937 rng(7);
  const OpBuffers buffers(
      sim, arena, k, desc.inputs,
      [&](size_t i) {
        return given[i].dtype.empty() ? random_bytes(desc.inputs[i], rng) : given[i].data;
      },
      desc.str() + " ");
  for (const std::string& b : o.before)
    if (!run_before_op(b, sim, arena, cfg, *precision, rng, out)) return 3;
  if (o.host_loop < 0 || o.host_warmup < 0)
    throw Error(
        fmt::format("--host-loop {} / --host-warmup {}: not negative", o.host_loop, o.host_warmup));
  if (o.host_warmup > 0 && o.host_loop == 0)
    throw Error("--host-warmup needs --host-loop (the warm-up calls precede a loop)");
  // A call of the op outside the figures (a host loop's warm-ups and its calls after the first):
  // its launches' cycles, or nullopt after printing why a launch failed.
  auto uncounted_call = [&](const char* what, int index) -> std::optional<std::vector<uint64_t>> {
    std::vector<uint64_t> cycles;
    for (size_t i = 0; i < k.launches.size(); ++i) {
      const KernelResult r = sim.run(buffers.launch(k.launches[i]));
      if (!r.ok) {
        out << fmt::format("{} call {}: launch {} ({}) failed: {}\n", what, index, i,
                           k.launches[i].kernel.program.name, r.error);
        return std::nullopt;
      }
      cycles.push_back(r.cycles);
    }
    return cycles;
  };
  // With the L2 cold at every launch, a launch's timing does not depend on what ran before
  // (docs/chip_model.md "L2 state between launches"): the warm-ups leave no state and every call
  // of the loop times as its first, so they are not simulated again (a large GEMM's 36 calls
  // would take 36 times as long). With a kept L2 every call runs.
  const bool calls_alike = !cfg.l2_keep_across_launches;
  for (int c = 0; c < o.host_warmup && !calls_alike; ++c)
    if (!uncounted_call("--host-warmup", c)) return 3;
  std::vector<std::vector<uint64_t>> loop_cycles(1);  // per call of the host loop, its launches

  const prof::ChipPeaks peaks = prof::chip_peaks(cfg);
  prof::ReportInput report;
  report.config = &cfg;
  report.title = "npusim op " + desc.str();
  uint64_t cycles = 0, macs = 0, repeats = 0, hbm = 0, gm = 0;
  std::map<std::string, uint64_t> high_water;  // buffer -> bytes, over launches and cores
  std::map<std::string, uint64_t> activity;    // merge_activity totals over the launches
  nlohmann::json launches = nlohmann::json::array();
  for (size_t i = 0; i < k.launches.size(); ++i) {
    const compiler::Launch& l = k.launches[i];
    if (o.listing) out << l.kernel.listing << "\n";
    KernelResult r = sim.run(buffers.launch(l));
    if (!r.ok) {
      out << fmt::format("launch {} ({}) failed: {}\n", i, l.kernel.program.name, r.error);
      return 3;
    }
    prof::OpRecord rec = op_record(l.kernel.program, cfg, l.block_dim, r);
    rec.op_type = desc.type;
    const prof::OpMetrics m = prof::compute_op_metrics(rec, cfg);
    cycles += r.cycles;
    loop_cycles[0].push_back(r.cycles);
    macs += m.macs;
    repeats += m.vector_repeats;
    hbm += m.hbm_read_bytes + m.hbm_write_bytes;
    gm += m.gm_read_bytes + m.gm_write_bytes;
    merge_buffer_high_water(r.counters, high_water);
    merge_activity(r.counters, activity);
    out << fmt::format("  launch {}: {} ({})\n", i, l.kernel.program.name, l.summary);
    print_summary(out, cfg, l.kernel.program.name, l.block_dim, r);
    launches.push_back({{"kernel", l.kernel.program.name}, {"cycles", r.cycles},
                        {"time_us", r.time_us}, {"cube_utilization_pct", m.cube_utilization_pct},
                        {"roofline_bound_us", m.roofline_bound_us}});
    report.ops.push_back(std::move(rec));
  }
  nlohmann::json host_loop;  // null without --host-loop
  if (o.host_loop > 0) {
    for (int c = 1; c < o.host_loop; ++c) {
      auto call = calls_alike ? std::optional(loop_cycles[0]) : uncounted_call("--host-loop", c);
      if (!call) return 3;
      loop_cycles.push_back(std::move(*call));
    }
    const uint64_t issue = cfg.us_to_cycles(cfg.host_op_dispatch_us);
    const uint64_t loop = host_loop_cycles(loop_cycles, issue);
    uint64_t device = 0;
    nlohmann::json call_cycles = nlohmann::json::array();  // per call, its launches' cycles
    for (const auto& call : loop_cycles) {
      uint64_t sum = 0;
      for (uint64_t c : call) sum += c;
      call_cycles.push_back(sum);
      device += sum;
    }
    const double per_call_us = cfg.cycles_to_us(double(loop)) / o.host_loop;
    const bool host_bound = loop > device + issue;  // the device waited between calls
    out << fmt::format(
        "host loop: {} call(s) after {} warm-up(s), host issue {:.2f} us a call "
        "(host.op_dispatch_us): {:.2f} us = {:.2f} us a call; device busy {:.2f} us; {}-bound\n",
        o.host_loop, o.host_warmup, cfg.cycles_to_us(double(issue)), cfg.cycles_to_us(double(loop)),
        per_call_us, cfg.cycles_to_us(double(device)), host_bound ? "host" : "device");
    host_loop = {{"calls", o.host_loop},
                 {"warmup", o.host_warmup},
                 {"host_issue_us", cfg.cycles_to_us(double(issue))},
                 {"loop_cycles", loop},
                 {"loop_us", cfg.cycles_to_us(double(loop))},
                 {"per_call_us", per_call_us},
                 {"device_busy_us", cfg.cycles_to_us(double(device))},
                 {"call_cycles", call_cycles},
                 {"bound", host_bound ? "host" : "device"}};
  }
  if (o.outputs.size() > k.outputs.size())
    throw Error(fmt::format("{} has {} output(s), {} --output files given", desc.str(),
                            k.outputs.size(), o.outputs.size()));
  for (size_t i = 0; i < o.outputs.size(); ++i) {
    const compiler::TensorDesc& t = k.outputs[i];
    NpyArray a;
    a.dtype = t.dtype == DataType::BOOL
                  ? "b1"
                  : npy_dtype(*isa::dtype_from_name(compiler::data_type_name(t.dtype)));
    a.shape = t.shape;
    a.data.resize(t.bytes());
    if (!a.data.empty()) sim.copy_device_to_host(a.data.data(), buffers.out[i], a.data.size());
    write_npy(o.outputs[i], a);
  }
  const double bound = prof::roofline_cycles(peaks, macs, repeats, hbm);
  const double cube_pct = peaks.macs_per_cycle > 0 && cycles
                              ? 100.0 * double(macs) / (peaks.macs_per_cycle * double(cycles)) : 0;
  const double vector_pct = vector_utilization_pct(cfg, repeats, cycles);
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  out << fmt::format(
      "op total: {} cycles = {:.2f} us; cube {:.1f}% of chip peak; HBM {:.1f} GB/s; roofline bound "
      "{:.2f} us (x{:.2f}); compile {:.3f} s, wall {:.2f} s\n",
      cycles, cfg.cycles_to_us(double(cycles)), cube_pct,
      cycles ? double(hbm) / (cfg.cycles_to_us(double(cycles)) * 1e-6) / 1e9 : 0.0,
      cfg.cycles_to_us(bound), bound > 0 ? double(cycles) / bound : 0.0, compile_s, wall_s);
  if (!o.json_path.empty()) {
    std::ofstream f(o.json_path);
    if (!f) throw Error("cannot write '" + o.json_path + "'");
    f << nlohmann::json{{"op", desc.str()}, {"chip", cfg.name},
                        {"precision", compiler::precision_mode_name(*precision)},
                        {"functional", !o.timing_only}, {"cycles", cycles},
                        {"time_us", cfg.cycles_to_us(double(cycles))},
                        {"cube_utilization_pct", cube_pct}, {"hbm_bytes", hbm},
                        {"vector_utilization_pct", vector_pct}, {"gm_bytes", gm},
                        {"buffer_high_water_bytes", high_water}, {"activity", activity},
                        {"roofline_bound_us", cfg.cycles_to_us(bound)},
                        {"roofline_ratio", bound > 0 ? double(cycles) / bound : 0.0},
                        {"compile_s", compile_s}, {"wall_s", wall_s}, {"launches", launches},
                        {"host_loop", host_loop}}
                             .dump(1)
      << "\n";
  }
  if (!o.trace_path.empty()) {
    std::ofstream f(o.trace_path);
    if (!f) throw Error("cannot write '" + o.trace_path + "'");
    f << sim.trace().dump() << "\n";
  }
  if (!o.report_dir.empty()) {
    prof::set_wait_cycles(report.ops);
    write_cli_report(o.report_dir, report, out);
  }
  return 0;
}

}  // namespace npusim::cli
