// Helpers shared by the SystemC scenario tests (each test_sim_*.cpp is its own executable with
// one Simulator, because SystemC elaborates once per process).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isa/assembler.h"
#include "sim/simulator.h"

namespace npusim::test {

// The repository root (NPUSIM_SOURCE_DIR when ctest runs us, else derived from this file).
inline std::string source_dir() {
  if (const char* d = std::getenv("NPUSIM_SOURCE_DIR")) return d;
  std::string f = __FILE__;  // <root>/tests/sim/sim_test_util.h
  return f.substr(0, f.rfind("/tests/sim/"));
}

// The value of counter `path` ("chip.aic0.mte2.busy_cycles") in a counter tree; 0 if absent
// (counters such as insn.<mnemonic> appear on first use).
inline uint64_t counter(const nlohmann::json& tree, const std::string& path) {
  const nlohmann::json* node = &tree;
  size_t start = 0;
  for (;;) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot - start);
    if (!node->is_object() || !node->contains(part)) return 0;
    node = &(*node)[part];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return node->at("value").get<uint64_t>();
}

// Task overheads (docs/chip_model.md, "Task overheads"), derived from the config's keys: a
// microsecond key is round(us x clock_mhz) cycles.
inline uint64_t us_cycles(const ChipConfig& cfg, double us) {
  return static_cast<uint64_t>(std::llround(us * cfg.clock_mhz));
}
// Cycles from a launch's begin to its first blocks' first instruction: dispatch + block start.
inline uint64_t task_start_overhead(const ChipConfig& cfg) {
  return us_cycles(cfg, cfg.task_dispatch_us) + static_cast<uint64_t>(cfg.task_block_start_cycles);
}
// The overheads in the duration of a launch whose worker that ended last ran `blocks` blocks:
// dispatch + blocks x block start + done.
inline uint64_t task_overhead(const ChipConfig& cfg, uint64_t blocks = 1) {
  return us_cycles(cfg, cfg.task_dispatch_us) +
         blocks * static_cast<uint64_t>(cfg.task_block_start_cycles) +
         us_cycles(cfg, cfg.task_done_us);
}

// A launch of `prog` with `args` on `block_dim` blocks, its other fields at their defaults.
inline KernelLaunch kernel_launch(const isa::Program& prog, std::vector<uint64_t> args,
                                  int block_dim) {
  KernelLaunch l;
  l.program = &prog;
  l.args = std::move(args);
  l.block_dim = block_dim;
  return l;
}

// A launch of a concurrent group (Simulator::run_concurrent): kernel_launch's on `cores`,
// waiting for the launches `after` (indices in the group).
inline ConcurrentLaunch concurrent_launch(const isa::Program& prog, std::vector<uint64_t> args,
                                          int block_dim, std::vector<std::string> cores,
                                          std::vector<size_t> after = {}) {
  return {kernel_launch(prog, std::move(args), block_dim), std::move(cores), std::move(after)};
}

// The repository's kernel `file` (under kernels/, "vadd_f16.s"), assembled once per process.
inline const isa::Program& repo_kernel(const std::string& file) {
  static std::map<std::string, isa::Program> assembled;  // node-based: references stay valid
  auto it = assembled.find(file);
  if (it == assembled.end())
    it = assembled.emplace(file, isa::assemble_file(source_dir() + "/kernels/" + file)).first;
  return it->second;
}
// The vector add (kernels/vadd_f16.s: z = x + y over n f16, args x, y, z, n) and the
// double-buffered GEMM (kernels/gemm_f16.s) most scenario tests launch.
inline const isa::Program& vadd() { return repo_kernel("vadd_f16.s"); }
inline const isa::Program& gemm() { return repo_kernel("gemm_f16.s"); }

// Counter `leaf` ("mte2.busy_cycles") of each of the first `cores` cores of kind `kind` ("aiv",
// "aic") in a counter tree, in core order.
inline std::vector<double> per_core_counter(const nlohmann::json& tree, const std::string& kind,
                                            int cores, const std::string& leaf) {
  std::vector<double> values;
  for (int c = 0; c < cores; ++c)
    values.push_back(
        static_cast<double>(counter(tree, "chip." + kind + std::to_string(c) + "." + leaf)));
  return values;
}

inline KernelResult launch(Simulator& sim, const isa::Program& prog, std::vector<uint64_t> args,
                           int block_dim) {
  return sim.run(kernel_launch(prog, std::move(args), block_dim));
}

// A cycle count derived in floating point, rounded up as the simulator rounds a launch's end
// (tolerating representation error below 1e-9).
inline uint64_t ceil_cycles(double v) { return static_cast<uint64_t>(std::ceil(v - 1e-9)); }

// One block of a kernel with one argument `a` on the vector cores: three scalar instructions
// (x1 = a, x2 = 0 and x3 = 8192: two UB addresses), then `body` (assembly lines), then end.
inline KernelResult run_aiv_body(Simulator& sim, const std::string& body, uint64_t a) {
  isa::Program p = isa::assemble(
      ".arg a\n.section aiv\n    ldarg x1, a\n    movi x2, 0\n    movi x3, 8192\n" + body +
          "    end\n",
      "body.s");
  return launch(sim, p, {a}, 1);
}

// A vector-core kernel reading 512 bytes (one L2 line of the tiny chip) of argument a, then of
// b, then of a again: whether the second read of a hits shows whether b's line took a's set.
inline const isa::Program& a_b_a() {
  static const isa::Program p = isa::assemble(
      ".arg a\n.arg b\n.section aiv\n    ldarg x1, a\n    ldarg x4, b\n    movi x2, 0\n"
      "    copy_gm2ub x2, x1, 1, 16, 0, 0\n"  // 512 bytes of A
      "    copy_gm2ub x2, x4, 1, 16, 0, 0\n"  // 512 bytes of B
      "    copy_gm2ub x2, x1, 1, 16, 0, 0\n"  // A again
      "    end\n",
      "a_b_a.s");
  return p;
}

// A lookup over a fixed set of allocation blocks (start -> bytes), as the runtime's allocator
// answers (KernelLaunch::gm_blocks).
inline GmBlockLookup lookup_of(std::map<uint64_t, uint64_t> blocks) {
  return [blocks](uint64_t addr, uint64_t* start, uint64_t* bytes) {
    auto it = blocks.upper_bound(addr);
    if (it == blocks.begin()) return false;
    --it;
    if (addr - it->first >= it->second) return false;
    *start = it->first;
    *bytes = it->second;
    return true;
  };
}

// Runs `program` with one argument `a` and its blocks, as a launch of graph run `l2_run`
// (0: none); the launch must succeed.
inline KernelResult run_in_graph_run(Simulator& sim, const isa::Program& program, uint64_t a,
                                     uint64_t l2_run, const GmBlockLookup& blocks) {
  KernelLaunch l;
  l.program = &program;
  l.args = {a};
  l.gm_blocks = blocks;
  l.l2_run = l2_run;
  KernelResult r = sim.run(l);
  if (!r.ok) throw std::runtime_error("launch failed: " + r.error);
  return r;
}

// A vector-core kernel moving `lines` L2 lines of 512 bytes (16 blocks of 32 B each) between
// UB and argument `a` (a typed tensor of those bytes, so a recording may time the launch at
// other addresses after a check): a write (UB -> GM) if `write`, else a read.
inline isa::Program move_lines(int lines, bool write) {
  const std::string n = std::to_string(16 * lines);
  return isa::assemble(".arg a, f16[" + std::to_string(256 * lines) +
                           "]\n.section aiv\n    ldarg x1, a\n    movi x2, 0\n" +
                           (write ? "    copy_ub2gm x1, x2, 1, " + n + ", 0, 0\n"
                                  : "    copy_gm2ub x2, x1, 1, " + n + ", 0, 0\n") +
                           "    end\n",
                       write ? "producer.s" : "consumer.s");
}

template <typename T>
std::vector<T> read_gm(Simulator& sim, uint64_t addr, size_t n) {
  std::vector<T> v(n);
  sim.gm().read(addr, v.data(), n * sizeof(T));
  return v;
}

template <typename T>
void write_gm(Simulator& sim, uint64_t addr, const std::vector<T>& v) {
  sim.gm().write(addr, v.data(), v.size() * sizeof(T));
}

}  // namespace npusim::test
