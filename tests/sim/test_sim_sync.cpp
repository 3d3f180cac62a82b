// Synchronisation, faults and deadlocks on the tiny split chip: flags order pipes (and without
// them the result is racy but deterministic), faults and deadlocks give errors naming core, pc,
// source line and instruction, and the next launch after either runs normally; identical
// launches give identical counters.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "common/error.h"
#include "common/numeric.h"
#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::counter;
using npusim::test::launch;
using npusim::test::read_gm;
using npusim::test::write_gm;

namespace {

// The watchdog budget is small here so the endless-loop test ends fast; every other kernel in
// this file needs a few dozen instructions per block.
constexpr uint64_t kWatchdog = 100'000;

Simulator& sim() {
  static Simulator s(load_chip_config("tiny"), [] {
    SimOptions o;
    o.max_insns_per_block = kWatchdog;
    return o;
  }());
  return s;
}

constexpr uint64_t kIn = 0x100000, kOut = 0x200000;

// y = 2 * x over 128 fp16 (one repeat): MTE2 loads x, V scales, MTE3 stores. V first fills its
// source buffer with zeros, so if it does not wait for MTE2 it deterministically reads zeros
// (the load's data lands only after its 64-cycle bandwidth phase).
std::string scale_kernel(bool wait_for_load) {
  return fmt::format(R"(
.arg x
.arg y
.section aiv
    ldarg x1, x
    ldarg x2, y
    movi x3, 0              ; UB: x
    movi x4, 1024           ; UB: y
    movi x5, f32(2.0)
    movi x6, 0
    vdup.f16 x3, x6, 1, 1, 8
    set_flag v, mte2, 1     ; the load may only overwrite the zeros once vdup is done
    wait_flag v, mte2, 1
    copy_gm2ub x3, x1, 1, 64, 0, 0   ; 2 KiB (x is the first 256 B): 64 cycles at 32 B/cycle,
    set_flag mte2, v, 0              ; longer than vmuls, so an unsynchronised V reads zeros
{}
    vmuls.f16 x4, x3, x5, 1, 1, 1, 8, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x2, x4, 1, 8, 0, 0
{}
    end
)", wait_for_load ? "    wait_flag mte2, v, 0" : "",
                     // without the wait the flag stays set; consume it so the block ends clean
                     wait_for_load ? "" : "    wait_flag mte2, v, 0");
}

std::vector<uint16_t> input_x() {
  std::vector<uint16_t> x(128);
  for (int i = 0; i < 128; ++i) x[i] = f32_to_f16(static_cast<float>(i) * 0.25f - 3.0f);
  return x;
}

// A scalar-only kernel whose duration is its instruction count; used to check that the launch
// after a fault or deadlock runs normally.
const char* kHealthy = R"(
.arg out
.section aiv
    ldarg x1, out
    get_block_id x2
    mul x3, x2, 8
    add x1, x1, x3
    add x2, x2, 100
    st x2, x1
    end
)";

void expect_healthy_run() {
  isa::Program p = isa::assemble(kHealthy, "healthy.s");
  KernelResult r = launch(sim(), p, {kOut}, 4);
  REQUIRE(r.ok);
  CHECK(r.error.empty());
  // 6 instructions before end, one issue slot each
  CHECK(r.cycles == test::task_overhead(sim().config()) + 6);
  CHECK(read_gm<int64_t>(sim(), kOut, 4) == std::vector<int64_t>{100, 101, 102, 103});
  CHECK(counter(r.counters, "chip.failed_launches") == 0);
}

}  // namespace

TEST_CASE("set_flag/wait_flag order MTE2 before V: y = 2x") {
  write_gm(sim(), kIn, input_x());
  isa::Program p = isa::assemble(scale_kernel(true), "scale.s");
  KernelResult r = launch(sim(), p, {kIn, kOut}, 1);
  REQUIRE(r.ok);
  auto y = read_gm<uint16_t>(sim(), kOut, 128);
  auto x = input_x();
  for (int i = 0; i < 128; ++i) CHECK(y[i] == f32_to_f16(2.0f * f16_to_f32(x[i])));
  CHECK(counter(r.counters, "chip.aiv0.v.stall.flag_wait") > 0);
}

TEST_CASE("without the wait, V races ahead of MTE2: deterministically reads the zeros") {
  write_gm(sim(), kIn, input_x());
  isa::Program p = isa::assemble(scale_kernel(false), "race.s");
  KernelResult a = launch(sim(), p, {kIn, kOut}, 1);
  REQUIRE(a.ok);
  CHECK(read_gm<uint16_t>(sim(), kOut, 128) == std::vector<uint16_t>(128, f32_to_f16(0.0f)));
  KernelResult b = launch(sim(), p, {kIn, kOut}, 1);
  REQUIRE(b.ok);
  CHECK(read_gm<uint16_t>(sim(), kOut, 128) == std::vector<uint16_t>(128, f32_to_f16(0.0f)));
  CHECK(a.cycles == b.cycles);
}

TEST_CASE("faults stop the kernel with core, pc, source line and instruction") {
  struct Case {
    const char* name;
    const char* text;
    std::string error;  // expected prefix
    const char* what;   // expected to appear after it
  };
  const std::vector<Case> cases = {
      {"div.s", ".section aiv\n    movi x1, 5\n    movi x2, 0\n    div x3, x1, x2\n    end\n",
       "core aiv0 pc 2 (div.s:4): div x3, x1, x2: ", "division by zero"},
      {"ldarg.s", ".arg a\n.section aiv\n    ldarg x1, 3\n    end\n",
       "core aiv0 pc 0 (ldarg.s:3): ldarg x1, 3: ",
       "ldarg index 3 out of range: the launch passes 1 argument(s)"},
      {"oob.s",
       ".arg a\n.section aiv\n    ldarg x1, a\n    movi x2, 0x40000\n"
       "    copy_gm2ub x2, x1, 1, 8, 0, 0\n    end\n",
       "core aiv0 pc 2 (oob.s:5): copy_gm2ub x2, x1, 1, 8, 0, 0: ", "ub"},
      {"twice.s",
       ".section aiv\n    set_flag mte2, v, 0\n    set_flag mte2, v, 0\n"
       "    wait_flag mte2, v, 0\n    end\n",
       "core aiv0 pc 1 (twice.s:3): set_flag mte2, v, 0: ",
       "flag mte2->v id 0 is already set"},
      {"twice_s.s",
       ".section aiv\n    set_flag s, v, 2\n    set_flag s, v, 2\n    end\n",
       "core aiv0 pc 1 (twice_s.s:3): set_flag s, v, 2: ", "flag s->v id 2 is already set"},
      {"nopipe.s",
       ".section aiv\n    movi x1, 0\n    mmad.f16 x1, x1, x1, 16, 16, 16, 0, x1\n    end\n",
       "core aiv0 pc 1 (nopipe.s:3): mmad.f16 x1, x1, x1, 16, 16, 16, 0, x1: ",
       "illegal instruction: mmad names pipe m, which aiv cores do not have"},
      {"noend.s", ".section aiv\n    movi x1, 0\n", "core aiv0 pc 1 (noend.s): ",
       "pc out of range: section aiv has 1 instructions"},
      {"gmld.s", ".section aiv\n    movi x1, -16\n    ld x2, x1\n    end\n",
       "core aiv0 pc 1 (gmld.s:3): ld x2, x1: ", "outside device memory"},
  };
  for (const Case& c : cases) {
    INFO(c.name);
    isa::Program p = isa::assemble(c.text, c.name);
    KernelResult r = launch(sim(), p, {0}, 1);
    CHECK_FALSE(r.ok);
    CHECK(r.error.rfind(c.error, 0) == 0);
    INFO(r.error);
    CHECK(r.error.find(c.what) != std::string::npos);
    CHECK(counter(r.counters, "chip.failed_launches") == 1);
    expect_healthy_run();
  }
}

TEST_CASE("a fault on one core aborts every core, also mid-transfer; the next run is clean") {
  // Blocks 0..2 copy 64 KiB each (HBM-bound for thousands of cycles) and wait on a flag that
  // MTE2 sets after the copy; block 3 divides by zero right away.
  isa::Program p = isa::assemble(R"(
.arg src
.section aiv
    ldarg x1, src
    get_block_id x2
    beq x2, 3, bad
    movi x3, 0
    copy_gm2ub x3, x1, 1, 2048, 0, 0
    set_flag mte2, s, 0
    wait_flag mte2, s, 0
    end
bad:
    div x4, x2, 0
    end
)", "abort.s");
  KernelResult r = launch(sim(), p, {kIn}, 4);
  REQUIRE_FALSE(r.ok);
  CHECK(r.error == "core aiv3 pc 8 (abort.s:13): div x4, x2, 0: division by zero");
  // The kernel stopped at the fault, when block 3 reached the div after 3 scalar instructions
  // (no completion overhead: the launch failed).
  CHECK(r.cycles == test::task_start_overhead(sim().config()) + 3);
  expect_healthy_run();
  // The memory system holds no stale transfer: a copy alone is timed exactly
  // (2 + path latency 32 + HBM latency 500 + 8192 B / port 32 B/cycle).
  isa::Program copy = isa::assemble(R"(
.arg src
.section aiv
    ldarg x1, src
    movi x2, 0
    copy_gm2ub x2, x1, 1, 256, 0, 0
    end
)", "copy.s");
  KernelResult c = launch(sim(), copy, {kIn}, 1);
  REQUIRE(c.ok);
  const ChipConfig& cfg = sim().config();
  CHECK(c.cycles == test::task_overhead(cfg) +
                        static_cast<uint64_t>(2 + cfg.path_latency(isa::Buf::GM, isa::Buf::UB) +
                                         cfg.hbm_latency_cycles + 8192 / 32));
}

TEST_CASE("an endless loop trips the watchdog instead of hanging, and the next run works") {
  isa::Program p = isa::assemble(".section aiv\nspin:\n    add x1, x1, 1\n    jmp spin\n    end\n",
                                 "spin.s");
  KernelResult r = launch(sim(), p, {}, 2);
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.error, Catch::Contains("watchdog") &&
                          Catch::Contains("more than " + std::to_string(kWatchdog)) &&
                          Catch::Contains("spin.s:"));
  expect_healthy_run();
}

TEST_CASE("deadlock: a wait that is never set is reported, and the next run works") {
  {
    isa::Program p = isa::assemble(R"(
.section aiv
    movi x1, 0
    wait_flag mte2, v, 1
    vadds.f16 x1, x1, x1, 1, 1, 1, 8, 8
    end
)", "dl.s");
    KernelResult r = launch(sim(), p, {}, 1);
    CHECK_FALSE(r.ok);
    CHECK(r.error == "deadlock: core aiv0 pc 1 (dl.s:4) wait_flag mte2, v, 1 never set");
    expect_healthy_run();
  }
  {
    // Scalar-unit waits on two cores.
    isa::Program p = isa::assemble(".section aiv\n    nop\n    wait_flag v, s, 0\n    end\n",
                                   "dl2.s");
    KernelResult r = launch(sim(), p, {}, 2);
    CHECK_FALSE(r.ok);
    CHECK(r.error ==
          "deadlock: core aiv0 pc 1 (dl2.s:3) wait_flag v, s, 0 never set; "
          "core aiv1 pc 1 (dl2.s:3) wait_flag v, s, 0 never set");
    CHECK(r.cycles == test::task_start_overhead(sim().config()) + 1);  // the last activity
    expect_healthy_run();
  }
}

TEST_CASE("identical launches give identical counters and cycles (vadd_f16 kernel)") {
  const isa::Program& p = test::repo_kernel("vadd_f16.s");
  const uint64_t n = 40000, x = 0x1000000, y = 0x2000000, z = 0x3000000;
  std::vector<uint16_t> hx(n), hy(n);
  for (uint64_t i = 0; i < n; ++i) {
    hx[i] = f32_to_f16(static_cast<float>(i % 1000) * 0.5f);
    hy[i] = f32_to_f16(static_cast<float>(i % 77) - 20.0f);
  }
  write_gm(sim(), x, hx);
  write_gm(sim(), y, hy);
  KernelResult a = launch(sim(), p, {x, y, z, n}, 4);
  REQUIRE(a.ok);
  auto hz = read_gm<uint16_t>(sim(), z, n);
  for (uint64_t i = 0; i < n; ++i) {
    INFO(i);
    REQUIRE(hz[i] == f32_to_f16(f16_to_f32(hx[i]) + f16_to_f32(hy[i])));
  }
  KernelResult b = launch(sim(), p, {x, y, z, n}, 4);
  REQUIRE(b.ok);
  CHECK(a.cycles == b.cycles);
  CHECK(a.counters == b.counters);
  CHECK(counter(a.counters, "chip.aiv0.mte2.bytes.gm_to_ub") == 2 * 10000 * 2);
  CHECK(counter(a.counters, "chip.aiv3.mte3.bytes.ub_to_gm") == 10000 * 2);
  // The accumulated counters are the sum of the launches.
  nlohmann::json all = sim().counters();
  CHECK(counter(all, "chip.launches") >= 2);
}
