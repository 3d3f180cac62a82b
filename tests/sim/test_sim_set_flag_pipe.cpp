// A set_flag that does not hold its pipe (sync.set_flag_holds_pipe=false): the pipe's next
// instruction starts at once, and the flag takes effect when the GM transfers the pipe issued
// before it have landed (docs/chip_model.md, "Pipes"). Tiny preset at 1000 MHz (GB/s = bytes
// per cycle), HBM at 24 B/cycle sustained (below the 32 B/cycle GM -> UB port), the L2 cold; a
// launch's cycles are the task overheads (sim_test_util.h task_overhead()) plus its core's
// time. One Simulator per process, hence a file of its own (the holding pipe, the presets'
// default, is what every other timing test runs).
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
}  // namespace

TEST_CASE("set_flag without holding the pipe: the next copy overlaps the first one's latency") {
  Simulator s(
      load_chip_config("tiny", {"clock_mhz=1000", "memory.hbm.gbps=48", "memory.hbm.efficiency=0.5",
                                "sync.set_flag_holds_pipe=false"}),
      SimOptions{});
  const ChipConfig& c = s.config();
  REQUIRE_FALSE(c.set_flag_holds_pipe);
  REQUIRE(c.scalar_cycles_per_insn == kCycle);
  // Two 8192-byte copies from HBM (distinct lines, so both miss), a set_flag between them, and
  // the vector pipe waiting for that flag.
  isa::Program p = isa::assemble(R"(
.arg src
.section aiv
    ldarg x1, src
    movi x2, 0
    movi x3, 8192
    add x4, x1, 8192
    copy_gm2ub x2, x1, 1, 256, 0, 0     ; copy A, issued at 4 cycles
    set_flag mte2, v, 0                 ; in effect when copy A has landed
    copy_gm2ub x3, x4, 1, 256, 0, 0     ; copy B
    wait_flag mte2, v, 0                ; issued at 7 cycles
    end
)",
                                 "set_flag_pipe.s");
  KernelResult r = launch(s, p, {kSrc}, 1);
  INFO(r.error);
  REQUIRE(r.ok);
  const double rate = std::min(c.path_rate(Buf::GM, Buf::UB), c.hbm_sustained_bytes_per_cycle());
  REQUIRE(rate == Approx(24));
  const double flow = 8192 / rate;  // a copy's bandwidth phase
  const double latency = c.path_latency(Buf::GM, Buf::UB) + c.hbm_latency_cycles;
  // Copy B's flow follows copy A's at once (not A's landing), and the block ends when B has
  // landed: 4 + 2 flows + one latency. A pipe held by the set_flag would take one latency more.
  const double core = 4 * kCycle + 2 * flow + latency;
  CHECK(double(r.cycles - task_overhead(c)) == Approx(core).margin(2));
  // The vector pipe waits from its wait_flag's issue until copy A has landed.
  CHECK(double(counter(r.counters, "chip.aiv0.v.stall.flag_wait")) ==
        Approx(4 * kCycle + flow + latency - 7 * kCycle).margin(2));
  // The pipe's busy time is the two flows; the flag does not add to it.
  CHECK(double(counter(r.counters, "chip.aiv0.mte2.busy_cycles")) == Approx(2 * flow).margin(2));
}
