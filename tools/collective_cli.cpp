#include "tools/collective_cli.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include <fmt/format.h>

#include "adapter/profiler/comm_record.h"
#include "adapter/profiler/report_writer.h"
#include "common/error.h"
#include "common/npy.h"
#include "sim/collective/collective.h"
#include "sim/config/system_config.h"
#include "sim/system/system_simulator.h"

namespace npusim::cli {
namespace {

// "64", "64B", "4K", "1M", "1G" (binary multiples) as bytes.
uint64_t parse_size(const std::string& s) {
  size_t end = 0;
  unsigned long long v = 0;
  try {
    v = std::stoull(s, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  const std::string unit = end ? s.substr(end) : "?";
  int shift = -1;
  if (unit.empty() || unit == "B")
    shift = 0;
  else if (unit == "K")
    shift = 10;
  else if (unit == "M")
    shift = 20;
  else if (unit == "G")
    shift = 30;
  if (end == 0 || shift < 0 || v == 0 || v > (uint64_t{1} << 40 >> shift))
    throw Error(
        fmt::format("--bytes: '{}' is not a size (e.g. 256, 64K, 1M, 1G; at most 1024G)", s));
  return static_cast<uint64_t>(v) << shift;
}

std::vector<uint64_t> sizes(const CollectiveOptions& o) {
  const size_t dots = o.bytes.find("..");
  const uint64_t lo = parse_size(o.bytes.substr(0, dots));
  const uint64_t hi = dots == std::string::npos ? lo : parse_size(o.bytes.substr(dots + 2));
  if (hi < lo) throw Error(fmt::format("--bytes {}: the end is below the start", o.bytes));
  if (o.factor < 2) throw Error("--factor must be at least 2");
  std::vector<uint64_t> out;
  for (uint64_t s = lo; s <= hi; s *= static_cast<uint64_t>(o.factor)) out.push_back(s);
  return out;
}

// The call for `size` bytes as nccl-tests counts them: all_reduce, broadcast, send_recv: one
// buffer; all_gather: the gathered output; reduce_scatter: the input; all_to_all: one buffer.
CollectiveCall make_call(CollectiveKind kind, const CollectiveOptions& o, int n, uint64_t size) {
  CollectiveCall c;
  c.kind = kind;
  for (int i = 0; i < n; ++i) c.chips.push_back(i);
  const auto dt = isa::dtype_from_name(o.dtype);
  if (!dt || isa::dtype_size(*dt) <= 0)
    throw Error(fmt::format("--dtype '{}': expected f32, f16, bf16, s32, s16 or s8", o.dtype));
  c.dtype = *dt;
  c.op = reduce_op_from_name(o.op);
  c.algo = collective_algo_from_name(o.algo);
  c.root = o.root;
  const uint64_t elems = size / static_cast<uint64_t>(isa::dtype_size(c.dtype));
  const bool per_rank = kind == CollectiveKind::all_gather ||
                        kind == CollectiveKind::reduce_scatter ||
                        kind == CollectiveKind::all_to_all;
  c.count = std::max<uint64_t>(1, per_rank ? elems / static_cast<uint64_t>(n) : elems);
  const uint64_t span = std::max(collective_send_bytes(c), collective_recv_bytes(c));
  c.send.assign(n, 0);
  c.recv.assign(n, span);
  return c;
}

// Each rank's input: values whose reduction is exact in any order (exact_reduction_inputs).
void fill_inputs(SystemSimulator& sys, const CollectiveCall& c) {
  for (size_t r = 0; r < c.chips.size(); ++r) {
    const std::vector<uint8_t> data =
        exact_reduction_inputs(c.dtype, c.op, collective_send_bytes(c) / isa::dtype_size(c.dtype),
                               static_cast<uint32_t>(r + 1));
    sys.gm(c.chips[r]).write(c.send[r], data.data(), data.size());
  }
}

// rank<r>_send.npy and rank<r>_recv.npy: every rank's buffers, 1-D (bf16 as uint16 bits).
void dump_buffers(SystemSimulator& sys, const CollectiveCall& c, const std::string& dir) {
  std::filesystem::create_directories(dir);
  const int64_t es = isa::dtype_size(c.dtype);
  for (size_t r = 0; r < c.chips.size(); ++r)
    for (auto [name, addr, bytes] : {std::tuple{"send", c.send[r], collective_send_bytes(c)},
                                     {"recv", c.recv[r], collective_recv_bytes(c)}}) {
      NpyArray a;
      a.dtype = npy_dtype(c.dtype);
      a.shape = {static_cast<int64_t>(bytes) / es};
      a.data.resize(bytes);
      sys.gm(c.chips[r]).read(addr, a.data.data(), bytes);
      write_npy(fmt::format("{}/rank{}_{}.npy", dir, r, name), a);
    }
}

void write_configs(const SystemConfig& cfg, const std::string& dir) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/chip.yaml") << dump_chip_config_yaml(cfg.chip);
  std::ofstream(dir + "/system.yaml") << dump_system_config_yaml(cfg, "chip.yaml");
}

}  // namespace

CLI::App* add_collective_command(CLI::App& app, CollectiveOptions& o) {
  CLI::App* c = app.add_subcommand(
      "collective", "run one HCCL-style collective on a system of chips: the bus-bandwidth curve");
  c->add_option("collective", o.collective,
                "all_reduce, all_gather, reduce_scatter, broadcast, all_to_all or send_recv")
      ->required();
  c->add_option("--system", o.system, "system preset or YAML file")->capture_default_str();
  c->add_option("--set", o.overrides,
                "override a system key (dotted.key=value) or a chip key (chip.dotted.key=value)");
  c->add_option("--bytes", o.bytes, "SIZE or MIN..MAX, e.g. 1M..1G")->capture_default_str();
  c->add_option("--factor", o.factor, "size step between MIN and MAX")->capture_default_str();
  c->add_option("--chips", o.chips, "use the first N chips (default: all)");
  c->add_option(
       "--algo", o.algo,
       "auto, mesh, ring, hd (halving_doubling), mesh_ring or mesh_hd (all_reduce across servers)")
      ->capture_default_str();
  c->add_option("--dtype", o.dtype, "f32, f16, bf16, s32, s16, s8")->capture_default_str();
  c->add_option("--op", o.op, "sum, prod, max, min")->capture_default_str();
  c->add_option("--root", o.root, "broadcast root rank")->capture_default_str();
  c->add_flag("--functional", o.functional,
              "move and reduce real data (default: timing only, same times)");
  c->add_option("--dump", o.dump_dir,
                "with --functional: write every rank's send and receive buffer of the last size "
                "as DIR/rank<r>_send.npy, rank<r>_recv.npy");
  c->add_option("--out", o.out_dir, "write results.csv and the resolved system.yaml/chip.yaml");
  c->add_option("--report-dir", o.report_dir,
                "write the msprof-style report of the collectives (HCCL rows in op_summary.csv, "
                "a communication lane per chip in trace.json, summary.txt)");
  return c;
}

int run_collective_command(const CollectiveOptions& o, std::ostream& out) {
  const CollectiveKind kind = collective_from_name(o.collective);
  const SystemConfig cfg = load_system_config(o.system, o.overrides);
  const int n = o.chips ? o.chips : cfg.chips();
  if (n < 1 || n > cfg.chips())
    throw Error(
        fmt::format("--chips {}: system '{}' has {} chips", o.chips, cfg.name, cfg.chips()));
  const std::vector<uint64_t> list = sizes(o);
  if (!o.dump_dir.empty() && !o.functional) throw Error("--dump needs --functional");
  make_call(kind, o, n, list.front());  // bad --dtype, --op or --algo fail before the run
  SimOptions opts;
  opts.functional = o.functional;
  SystemSimulator sys(cfg, opts);
  out << fmt::format(
      "# npusim collective {}: system {} ({} x {} chips of {}, {}), {} chips, "
      "algorithm {}\n",
      collective_name(kind), cfg.name, cfg.servers, cfg.chips_per_server, cfg.chip.name,
      topology_name(cfg.topology), n, o.algo);
  out << fmt::format(
      "# link {} GB/s {} us per direction; NIC {} GB/s {} us; busbw = algbw x {:.4f}"
      "\n",
      cfg.link.gbps, cfg.link.latency_us, cfg.nic.gbps, cfg.nic.latency_us,
      prof::collective_bus_factor(kind, n));
  out << fmt::format("#{:>12} {:>12} {:>6} {:>6} {:>5} {:>10} {:>8} {:>8} {:>6}  {}\n", "size",
                     "count", "type", "redop", "root", "time", "algbw", "busbw", "steps",
                     "algorithm");
  out << fmt::format("#{:>12} {:>12} {:>6} {:>6} {:>5} {:>10} {:>8} {:>8}\n", "(B)", "(elements)",
                     "", "", "", "(us)", "(GB/s)", "(GB/s)");
  std::string csv =
      "size_bytes,count,dtype,redop,root,time_us,algbw_gbps,busbw_gbps,steps,"
      "algorithm\n";
  prof::ReportInput report;
  report.title = fmt::format("npusim collective {} --system {} ({} chips, algorithm {})",
                             collective_name(kind), cfg.name, n, o.algo);
  report.config = &cfg.chip;
  for (uint64_t size : list) {
    const CollectiveCall call = make_call(kind, o, n, size);
    if (o.functional) fill_inputs(sys, call);
    std::map<std::string, uint64_t> links_before;
    if (!o.report_dir.empty()) links_before = prof::fabric_channel_bytes(sys.counters());
    const CollectiveResult r = run_collective(sys, call);
    if (!o.report_dir.empty())
      report.comms.push_back(prof::comm_record(sys, call, r, links_before, report.comms.size()));
    const double algbw = static_cast<double>(size) / (r.time_us * 1e3);  // GB/s
    const double busbw = algbw * prof::collective_bus_factor(kind, n);
    const std::string redop =
        kind == CollectiveKind::all_reduce || kind == CollectiveKind::reduce_scatter ? o.op
                                                                                     : "none";
    const int root = kind == CollectiveKind::broadcast ? o.root : -1;
    out << fmt::format(" {:>12} {:>12} {:>6} {:>6} {:>5} {:>10.2f} {:>8.2f} {:>8.2f} {:>6}  {}\n",
                       size, call.count, o.dtype, redop, root, r.time_us, algbw, busbw, r.steps,
                       r.algorithm);
    csv += fmt::format("{},{},{},{},{},{},{},{},{},{}\n", size, call.count, o.dtype, redop, root,
                       r.time_us, algbw, busbw, r.steps, r.algorithm);
  }
  if (!o.dump_dir.empty()) dump_buffers(sys, make_call(kind, o, n, list.back()), o.dump_dir);
  if (!o.report_dir.empty()) {
    report.end_cycle = sys.now_cycles();
    prof::write_report(o.report_dir, report);
    write_configs(cfg, o.report_dir);
    out << fmt::format("# wrote the report to {}/\n", o.report_dir);
  }
  if (!o.out_dir.empty()) {
    write_configs(cfg, o.out_dir);
    std::ofstream(o.out_dir + "/results.csv") << csv;
    out << fmt::format("# wrote {}/results.csv, system.yaml, chip.yaml\n", o.out_dir);
  }
  return 0;
}

}  // namespace npusim::cli
