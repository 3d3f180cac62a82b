#include "tools/demo.h"

#include <cmath>
#include <fstream>
#include <random>

#include <fmt/format.h>

#include "common/error.h"
#include "common/numeric.h"
#include "adapter/profiler/instruction_profiler.h"
#include "sim/verifier/verifier.h"
#include "sim/simulator.h"
#include "tools/device_buffers.h"
#include "tools/kernel_io.h"
#include "tools/report_cli.h"
#include "tools/summary.h"

namespace npusim::cli {
namespace {

std::vector<uint16_t> random_f16(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = f32_to_f16(dist(rng));
  return v;
}

NpyArray f16_array(std::vector<int64_t> shape, const std::vector<uint16_t>& data) {
  NpyArray a;
  a.dtype = npy_dtype(isa::Dtype::F16);
  a.shape = std::move(shape);
  a.data.resize(data.size() * 2);
  std::memcpy(a.data.data(), data.data(), a.data.size());
  return a;
}

std::vector<uint16_t> f16_data(const NpyArray& a) {
  std::vector<uint16_t> v(a.data.size() / 2);
  std::memcpy(v.data(), a.data.data(), a.data.size());
  return v;
}

struct Checked {
  KernelResult result;
  size_t mismatches = 0;
  double max_err = 0;
};

}  // namespace

int run_demo(const DemoOptions& o, std::ostream& out) {
  ChipConfig cfg = load_chip(o.chip, o.overrides);
  SimOptions so;
  so.functional = !o.timing_only;
  so.trace = !o.trace_path.empty();
  prof::InstructionProfiler profiler(cfg);  // outlives the Simulator it observes
  Simulator sim(cfg, so);
  if (!o.report_dir.empty()) sim.add_observer(&profiler);
  std::vector<prof::OpRecord> ops;  // for the report
  // The report's record of a launch: its tensors (f16, ND) and the profiler's instruction table.
  auto record = [&](const isa::Program& prog, int block_dim, const KernelResult& r,
                    const std::vector<const NpyArray*>& inputs, const NpyArray& output) {
    prof::OpRecord op = op_record(prog, cfg, block_dim, r);
    for (const NpyArray* a : inputs) op.inputs.push_back(tensor_desc(*a, isa::Dtype::F16));
    op.outputs.push_back(tensor_desc(output, isa::Dtype::F16));
    if (!profiler.launches().empty()) op.instructions = profiler.launches().back();
    ops.push_back(std::move(op));
  };
  DeviceArena arena(sim);
  std::mt19937 rng(2026);
  out << fmt::format("npusim demo on chip '{}': {}\n", cfg.name, describe_chip(cfg));
  int status = 0;
  nlohmann::json all;

  // GEMM: N = K = 1024 and enough 128-row tiles for two 128x256 output tiles per cube core.
  isa::Program gemm = load_kernel(builtin_kernel_path("gemm_f16.s"));
  isa::verify_or_throw(gemm, cfg);
  int cube_blocks = default_block_dim(gemm, cfg);
  const int64_t N = 1024, K = 1024, M = 128 * ((cube_blocks + 1) / 2);
  auto a = random_f16(M * K, rng), b = random_f16(K * N, rng);
  const NpyArray a_array = f16_array({M, K}, a), b_array = f16_array({K, N}, b);
  uint64_t da = arena.upload(a_array, "gemm a");
  uint64_t db = arena.upload(b_array, "gemm b");
  NpyArray c = f16_array({M, N}, std::vector<uint16_t>(M * N));
  uint64_t dc = arena.allocate(c.data.size(), "gemm c");
  out << fmt::format("\n== gemm_f16: C[{}x{}] = A[{}x{}] x B[{}x{}], fp16 in, fp32 accumulate, {} blocks\n",
                     M, N, M, K, K, N, cube_blocks);
  KernelResult r =
      sim.run(arena.launch(gemm, {da, db, dc, uint64_t(M), uint64_t(N), uint64_t(K)}, cube_blocks));
  if (!r.ok) throw Error("gemm_f16 failed: " + r.error);
  const uint64_t gemm_alone = r.cycles;
  print_summary(out, cfg, "gemm_f16", cube_blocks, r);
  record(gemm, cube_blocks, r, {&a_array, &b_array}, c);
  all["gemm_f16"] = r.counters;
  if (!o.timing_only) {
    arena.download(dc, c);
    auto got = f16_data(c);
    // Reference in double from the same fp16 inputs; the kernel's only extra error is the final
    // rounding to fp16 (2^-11 relative) plus fp32 accumulation order.
    size_t bad = 0;
    double max_err = 0;
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double ref = 0;
        for (int64_t k = 0; k < K; ++k) ref += double(f16_to_f32(a[i * K + k])) * f16_to_f32(b[k * N + j]);
        double err = std::fabs(f16_to_f32(got[i * N + j]) - ref);
        max_err = std::max(max_err, err);
        if (err > 1e-3 + std::fabs(ref) * 1e-3) ++bad;
      }
    out << fmt::format("  check vs host reference: {} of {} outside tolerance, max abs error {:.3g}\n",
                       bad, M * N, max_err);
    if (bad) status = 2;
  }

  // Vector add: 4 Mi fp16 elements over every vector core.
  isa::Program vadd = load_kernel(builtin_kernel_path("vadd_f16.s"));
  isa::verify_or_throw(vadd, cfg);
  int vec_blocks = default_block_dim(vadd, cfg);
  const int64_t n = int64_t(1) << 22;
  auto x = random_f16(n, rng), y = random_f16(n, rng);
  const NpyArray x_array = f16_array({n}, x), y_array = f16_array({n}, y);
  uint64_t dx = arena.upload(x_array, "vadd x");
  uint64_t dy = arena.upload(y_array, "vadd y");
  NpyArray z = f16_array({n}, std::vector<uint16_t>(n));
  uint64_t dz = arena.allocate(z.data.size(), "vadd z");
  out << fmt::format("\n== vadd_f16: z = x + y over {} fp16 elements, {} blocks\n", n, vec_blocks);
  r = sim.run(arena.launch(vadd, {dx, dy, dz, uint64_t(n)}, vec_blocks));
  if (!r.ok) throw Error("vadd_f16 failed: " + r.error);
  const uint64_t vadd_alone = r.cycles;
  print_summary(out, cfg, "vadd_f16", vec_blocks, r);
  record(vadd, vec_blocks, r, {&x_array, &y_array}, z);
  all["vadd_f16"] = r.counters;
  if (!o.timing_only) {
    arena.download(dz, z);
    auto got = f16_data(z);
    size_t bad = 0;
    for (int64_t i = 0; i < n; ++i)
      if (got[i] != f32_to_f16(f16_to_f32(x[i]) + f16_to_f32(y[i]))) ++bad;
    out << fmt::format("  check vs host reference: {} of {} elements differ\n", bad, n);
    if (bad) status = 2;
  }
  if (o.concurrent) {
    // The same two launches at once, into fresh outputs, each on the cores of its kind (a
    // coupled chip's AI cores run both kernels: the GEMM gets the first half, the add the rest).
    std::vector<std::string> gemm_cores, vadd_cores;
    if (!cfg.split)
      for (int i = 0; i < cfg.total_cores(); ++i)
        (i < cfg.total_cores() / 2 ? gemm_cores : vadd_cores).push_back(fmt::format("aicore{}", i));
    NpyArray c2 = f16_array({M, N}, std::vector<uint16_t>(M * N));
    NpyArray z2 = f16_array({n}, std::vector<uint16_t>(n));
    const uint64_t dc2 = arena.allocate(c2.data.size(), "gemm c (concurrent)");
    const uint64_t dz2 = arena.allocate(z2.data.size(), "vadd z (concurrent)");
    ConcurrentResult g = sim.run_concurrent(
        {{arena.launch(gemm, {da, db, dc2, uint64_t(M), uint64_t(N), uint64_t(K)}, cube_blocks),
          gemm_cores},
         {arena.launch(vadd, {dx, dy, dz2, uint64_t(n)}, vec_blocks), vadd_cores}});
    for (const KernelResult& k : g.launches)
      if (!k.ok) throw Error("concurrent run failed: " + k.error);
    out << fmt::format("\n== gemm_f16 beside vadd_f16 (run_concurrent, shared L2 and HBM)\n"
                       "  alone: {} + {} = {} cycles in sequence\n"
                       "  together: gemm {} cycles, vadd {} cycles, makespan {} cycles "
                       "({:.2f} us, {:.1f} % of the sequence)\n",
                       gemm_alone, vadd_alone, gemm_alone + vadd_alone, g.launches[0].cycles,
                       g.launches[1].cycles, g.cycles, g.time_us,
                       100.0 * static_cast<double>(g.cycles) /
                           static_cast<double>(gemm_alone + vadd_alone));
    all["concurrent"] = {{"gemm_f16_cycles", g.launches[0].cycles},
                         {"vadd_f16_cycles", g.launches[1].cycles},
                         {"makespan_cycles", g.cycles},
                         {"group", g.counters.tree()}};
    if (!o.timing_only) {
      arena.download(dc2, c2);
      arena.download(dz2, z2);
      const bool same = c2.data == c.data && z2.data == z.data;
      out << fmt::format("  outputs {} the lone runs'\n", same ? "equal" : "DIFFER from");
      if (!same) status = 2;
    }
  }
  out << fmt::format("\nHDC link: {:.1f} us of host<->device copies\n", arena.hdc_us());
  if (!o.counters_path.empty()) {
    std::ofstream f(o.counters_path);
    f << all.dump(1) << "\n";
  }
  nlohmann::json trace;
  if (so.trace) trace = sim.trace();
  if (!o.trace_path.empty()) {
    std::ofstream f(o.trace_path);
    f << trace.dump() << "\n";
  }
  if (!o.report_dir.empty()) {
    prof::ReportInput report;
    report.title = fmt::format("npusim demo (chip {}{})", cfg.name,
                               o.timing_only ? ", timing-only" : "");
    report.config = &cfg;
    report.ops = std::move(ops);
    prof::set_wait_cycles(report.ops);
    report.session_counters = sim.counters();
    report.end_cycle = sim.now_cycles();
    if (so.trace) report.trace = &trace;
    out << "\n";
    write_cli_report(o.report_dir, report, out);
  }
  return status;
}

}  // namespace npusim::cli
