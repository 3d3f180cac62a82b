// The instruction profiler attached to a running chip (Simulator::add_observer): per-instruction
// calls and busy/wait cycles against cycles derived from the config, and against the chip's own
// busy and instruction counters for the shipped kernels; attaching and detaching.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>

#include "adapter/profiler/instruction_profiler.h"
#include "adapter/profiler/report_writer.h"
#include "isa/assembler.h"
#include "isa/disassembler.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::counter;
using npusim::test::launch;

namespace {

constexpr uint64_t kPs = 1000;  // picoseconds per cycle

const ChipConfig& chip() {
  static ChipConfig c = load_chip_config("tiny");
  return c;
}

Simulator& sim() {
  static Simulator s(chip(), [] {
    SimOptions o;
    o.functional = false;  // timing only: identical cycles, faster
    return o;
  }());
  return s;
}

// One block on one vector core: a GM->UB copy, a flag pair, a vector add.
const char* kProbe = R"(
.kernel probe
.arg src
.section aiv
    ldarg x1, src
    movi x2, 0
    copy_gm2ub x2, x1, 1, 256, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    movi x3, 8192
    movi x4, 16384
    vadd.f16 x4, x2, x3, 4, 1, 1, 1, 8, 8, 8
    end
)";

const prof::InstructionStat& row_at(const prof::InstructionTable& t, uint32_t pc) {
  for (const auto& r : t.rows)
    if (r.pc == pc) return r;
  FAIL("no row for pc " << pc);
  throw std::logic_error("unreachable");
}

// Sum over the cores that ran a block of chip.<core>.<name>.
uint64_t sum_over_cores(const nlohmann::json& tree, const std::string& name) {
  uint64_t total = 0;
  for (auto it = tree["chip"].begin(); it != tree["chip"].end(); ++it)
    if (it->is_object() && it->contains("active_cycles") && counter(*it, "blocks") > 0)
      total += counter(*it, name);
  return total;
}
int cores_ran(const nlohmann::json& tree) {
  int n = 0;
  for (auto it = tree["chip"].begin(); it != tree["chip"].end(); ++it)
    if (it->is_object() && it->contains("active_cycles") && counter(*it, "blocks") > 0) ++n;
  return n;
}

// The table's busy cycles per lane add up to the busy_cycles counters (the scalar unit also
// spends S cycles issuing each pipe instruction), and its calls per unit and mnemonic to the
// instruction counters. Counters round picoseconds to cycles per core: 0.5 cycle per core.
void check_against_counters(const prof::InstructionTable& t, const KernelResult& r) {
  const double s_cycles = chip().scalar_cycles_per_insn;
  std::map<std::string, uint64_t> busy_ps;
  std::map<std::string, uint64_t> calls;  // "<pipe>.insn.<mnemonic>"
  uint64_t pipe_calls = 0;
  for (const auto& row : t.rows) {
    const std::string pipe = prof::lane_counter_pipe(row.lane);
    busy_ps[pipe] += row.busy_ps;
    const std::string mnemonic = row.text.substr(0, row.text.find_first_of(" ."));
    calls[pipe + ".insn." + mnemonic] += row.calls;
    if (row.lane != Lane::SCALAR) pipe_calls += row.calls;
  }
  const double tolerance = 0.5 * cores_ran(r.counters) + 1e-9;
  for (const char* pipe : {"mte1", "mte2", "mte3", "m", "v", "fix"}) {
    INFO("pipe " << pipe);
    CHECK(std::abs(double(busy_ps[pipe]) / kPs -
                   double(sum_over_cores(r.counters, std::string(pipe) + ".busy_cycles"))) <=
          tolerance);
  }
  CHECK(std::abs(double(busy_ps["s"]) / kPs + s_cycles * double(pipe_calls) -
                 double(sum_over_cores(r.counters, "s.busy_cycles"))) <= tolerance);
  for (const auto& [name, n] : calls) {
    INFO(name);
    CHECK(n == sum_over_cores(r.counters, name));
  }
}

}  // namespace

TEST_CASE("profiler: per-instruction cycles of a small kernel, derived from the config") {
  prof::InstructionProfiler profiler(chip());
  sim().add_observer(&profiler);
  isa::Program p = isa::assemble(kProbe, "probe.s");
  KernelResult r = launch(sim(), p, {0x10000}, 1);
  sim().remove_observer(&profiler);
  REQUIRE(r.ok);
  REQUIRE(profiler.launches().size() == 1);
  const prof::InstructionTable& t = *profiler.launches()[0];
  CHECK(t.kernel == "probe");
  CHECK(t.ok);
  REQUIRE(t.rows.size() == 9);  // every instruction ran once
  const isa::Section& aiv = *p.find(isa::CoreKind::AIV);
  for (const auto& row : t.rows) {
    CHECK(row.calls == 1);
    CHECK(row.section == isa::CoreKind::AIV);
    CHECK(row.text == isa::disassemble(aiv.code[row.pc], &aiv));
    CHECK(row.location == "probe.s:" + std::to_string(aiv.code[row.pc].src_line));
  }
  const uint64_t S = uint64_t(chip().scalar_cycles_per_insn) * kPs;
  // Scalar-unit instructions: S cycles each.
  for (uint32_t pc : {0u, 1u, 5u, 6u}) {
    CHECK(row_at(t, pc).lane == Lane::SCALAR);
    CHECK(row_at(t, pc).busy_ps == S);
    CHECK(row_at(t, pc).wait_ps == 0);
  }
  // copy_gm2ub of 256 x 32 B = 8192 B, alone on a cold L2: its bandwidth phase moves the bytes
  // at min(gm->ub port rate, HBM bytes per cycle) (docs/chip_model.md, "Memory system").
  const auto& copy = row_at(t, 2);
  CHECK(copy.lane == Lane::MTE2);
  const double rate = std::min(chip().path_rate(isa::Buf::GM, isa::Buf::UB),
                               chip().hbm_sustained_bytes_per_cycle());
  CHECK(double(copy.busy_ps) == Approx(8192.0 / rate * kPs).margin(1));
  CHECK(copy.wait_ps == 0);
  // set_flag mte2, v waits on the MTE2 lane for the copy to land: the path latency plus the HBM
  // latency after its bandwidth phase. It keeps no unit busy.
  const auto& set = row_at(t, 3);
  CHECK(set.lane == Lane::MTE2);
  CHECK(set.busy_ps == 0);
  const int landing = chip().path_latency(isa::Buf::GM, isa::Buf::UB) + chip().hbm_latency_cycles;
  CHECK(set.wait_ps == uint64_t(landing) * kPs);
  // wait_flag mte2, v on the vector lane: all wait, no busy.
  const auto& wait = row_at(t, 4);
  CHECK(wait.lane == Lane::VECTOR);
  CHECK(wait.busy_ps == 0);
  CHECK(wait.wait_ps > 0);
  // vadd of 4 repeats with operands in disjoint banks (UB 0, 8192, 16384 = banks 0, 16, 32 of
  // 48 x 32 B): latency + 4 x ceil(256 B / vector bytes per cycle).
  const auto& vadd = row_at(t, 7);
  CHECK(vadd.lane == Lane::VECTOR);
  const uint64_t vbytes = uint64_t(chip().vector_bytes_per_cycle);
  const uint64_t per_repeat = (256 + vbytes - 1) / vbytes;
  CHECK(vadd.busy_ps == (uint64_t(chip().vector_latency_cycles) + 4 * per_repeat) * kPs);
  // end: no issue slot; it waits for the pipes to drain.
  const auto& end = row_at(t, 8);
  CHECK(end.lane == Lane::SCALAR);
  CHECK(end.busy_ps == 0);
  check_against_counters(t, r);
}

TEST_CASE("profiler: the shipped kernels' tables add up to the chip's counters") {
  prof::InstructionProfiler profiler(chip());
  sim().add_observer(&profiler);
  sim().add_observer(&profiler);  // a second attach is a no-op
  isa::Program vadd = isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s");
  isa::Program gemm = isa::assemble_file(test::source_dir() + "/kernels/gemm_f16.s");
  const uint64_t n = 4 * 8192 + 64;  // several tiles on each of the 4 vector cores
  KernelResult rv = launch(sim(), vadd, {0x100000, 0x200000, 0x300000, n}, 4);
  // 256 x 512 output in 128 x 256 tiles: 4 tiles over the 2 cube cores, K = 512.
  KernelResult rg = launch(sim(), gemm, {0x100000, 0x200000, 0x300000, 256, 512, 512}, 2);
  sim().remove_observer(&profiler);
  REQUIRE(rv.ok);
  REQUIRE(rg.ok);
  REQUIRE(profiler.launches().size() == 2);
  CHECK(profiler.launches()[0]->kernel == "vadd_f16");
  CHECK(profiler.launches()[1]->kernel == "gemm_f16");
  {
    INFO("vadd_f16");
    check_against_counters(*profiler.launches()[0], rv);
  }
  {
    INFO("gemm_f16");
    check_against_counters(*profiler.launches()[1], rg);
  }
  // Detached: later launches are not recorded.
  auto tables = profiler.take();
  CHECK(profiler.launches().empty());
  REQUIRE(launch(sim(), vadd, {0x100000, 0x200000, 0x300000, 64}, 1).ok);
  CHECK(profiler.launches().empty());
  CHECK(tables.size() == 2);
}
