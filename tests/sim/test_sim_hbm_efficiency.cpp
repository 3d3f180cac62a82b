// The sustained HBM rate (memory.hbm.efficiency): a transfer that misses L2 moves at
// memory.hbm.gbps x efficiency, derived from the config (tiny at 1000 MHz, so GB/s = bytes per
// cycle; a launch's cycles are the task overheads, sim_test_util.h task_overhead(), plus its
// core's busy time). One Simulator per process, hence a file of its own.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>

#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using isa::Buf;
using npusim::test::counter;
using npusim::test::launch;
using npusim::test::task_overhead;

namespace {
constexpr uint64_t kSrc = 0x200000;
constexpr uint64_t kCycle = 1;  // scalar_cycles_per_insn of the preset, checked below
uint64_t ceil_u(double v) { return static_cast<uint64_t>(std::ceil(v - 1e-9)); }
}  // namespace

TEST_CASE("HBM efficiency: a miss moves at the sustained rate, peak x memory.hbm.efficiency") {
  // HBM at 48 B/cycle peak and efficiency 0.5: 24 B/cycle sustained, below the 32 B/cycle port,
  // so the copy of 8192 bytes is bound by HBM: 2 + 32 + 500 + 8192 / 24.
  Simulator s(load_chip_config("tiny", {"clock_mhz=1000", "memory.hbm.gbps=48",
                                        "memory.hbm.efficiency=0.5"}),
              SimOptions{});
  const ChipConfig& c = s.config();
  REQUIRE(c.hbm_sustained_bytes_per_cycle() == Approx(24));
  REQUIRE(c.scalar_cycles_per_insn == kCycle);
  isa::Program p = isa::assemble(R"(
.arg src
.section aiv
    ldarg x1, src
    movi x2, 0
    copy_gm2ub x2, x1, 1, 256, 0, 0     ; 256 blocks = 8192 bytes
    end
)", "copy_eff.s");
  KernelResult r = launch(s, p, {kSrc}, 1);
  REQUIRE(r.ok);
  const double rate = std::min(c.path_rate(Buf::GM, Buf::UB), c.hbm_bytes_per_cycle() * 0.5);
  const double copy = c.path_latency(Buf::GM, Buf::UB) + c.hbm_latency_cycles + 8192 / rate;
  CHECK(r.cycles == task_overhead(c) + ceil_u(2 * kCycle + copy));
  CHECK(double(counter(r.counters, "chip.aiv0.mte2.busy_cycles")) == Approx(8192 / rate).margin(1));
  CHECK(double(counter(r.counters, "chip.hbm.busy_cycles")) == Approx(8192 / rate).margin(1));
  CHECK(8192 / rate > 8192 / c.path_rate(Buf::GM, Buf::UB) + 1);  // the efficiency is visible
}
