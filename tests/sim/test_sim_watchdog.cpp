// The watchdog's budget scales with the launch's tensor arguments (SimOptions::
// max_insns_per_block per 128 KiB, at least once), and a launch whose replay recording outgrows
// SimOptions::replay_record_max_bytes runs on unrecorded (then it is not replayed), on the tiny
// chip. References: the budget from the arguments' declared sizes; the recording's size from
// what each recorded transfer keeps (its effect-order byte, its GM range, its transfer-order
// entry).
#include <catch2/catch.hpp>

#include <string>

#include <fmt/format.h>

#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "sim/exec/exec.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::launch;

namespace {

// One instruction per byte of tensor data, so that a loop of two instructions per 4-byte
// element fits the scaled budget while exceeding the floor.
constexpr uint64_t kPerUnit = SimOptions::kWatchdogDataBytes;
constexpr uint64_t kRecordBound = 64 * 1024;

Simulator& sim() {
  static Simulator s(load_chip_config("tiny"), [] {
    SimOptions o;
    o.max_insns_per_block = kPerUnit;
    o.replay_record_max_bytes = kRecordBound;
    return o;
  }());
  return s;
}

uint64_t budget_for(uint64_t data_bytes) {
  return kPerUnit * std::max<uint64_t>(1, (data_bytes + 128 * 1024 - 1) / (128 * 1024));
}

// Counts n down on the scalar unit: 3 + 2n instructions; x (n f32) is never touched.
const char* kCountLoop = R"(
.arg x, f32[n]
.arg n
.section aiv
    ldarg x2, n
    movi x1, 0
loop:
    add x1, x1, 1
    blt x1, x2, loop
    end
)";

std::string spin(const std::string& args) {
  return args + "\n.section aiv\nspin:\n    add x1, x1, 1\n    jmp spin\n    end\n";
}

}  // namespace

TEST_CASE("a large valid launch gets a budget scaled to its tensors") {
  const uint64_t n = uint64_t{1} << 18;  // 1 MiB of f32: 8 units
  const isa::Program p = isa::assemble(kCountLoop, "count.s");
  CHECK(launch_data_bytes(p, {0x100000, n}) == 4 * n);
  CHECK(watchdog_budget(SimOptions{}, p, {0x100000, n}) ==
        SimOptions{}.max_insns_per_block * 8);
  REQUIRE(3 + 2 * n > kPerUnit);           // more than the floor
  REQUIRE(3 + 2 * n <= budget_for(4 * n));  // within the scaled budget
  KernelResult r = launch(sim(), p, {0x100000, n}, 1);
  CHECK(r.ok);
  CHECK(r.error == "");
}

TEST_CASE("an endless loop faults at the scaled budget, naming the options that set it") {
  struct Case {
    std::string args;
    std::vector<uint64_t> values;
    uint64_t data_bytes;
  };
  const Case cases[] = {
      {".arg x, f32[n]\n.arg n", {0x100000, uint64_t{1} << 18}, 4u << 18},
      {".arg a, f16[1000, 300]\n.arg b, s32[7]", {0x100000, 0x200000}, 600000 + 28},
      {".arg p\n.arg q", {0x100000, 5}, 0},  // untyped: the floor
  };
  for (const Case& c : cases) {
    INFO(c.args);
    const isa::Program p = isa::assemble(spin(c.args), "spin.s");
    CHECK(launch_data_bytes(p, c.values) == c.data_bytes);
    KernelResult r = launch(sim(), p, c.values, 2);
    CHECK_FALSE(r.ok);
    CHECK_THAT(r.error, Catch::Contains("watchdog") &&
                            Catch::Contains(fmt::format("more than {} instructions",
                                                        budget_for(c.data_bytes))) &&
                            Catch::Contains("spin.s:") &&
                            Catch::Contains("--max-insns-per-block") &&
                            Catch::Contains("NPUSIM_MAX_INSNS_PER_BLOCK"));
  }
}

TEST_CASE("the budget saturates and 0 turns the watchdog off") {
  const isa::Program p = isa::assemble(".arg x, u8[n, n]\n.arg n\n.section aiv\n    end\n", "b.s");
  SimOptions o;
  CHECK(watchdog_budget(o, p, {0, ~uint64_t{0}}) == ~uint64_t{0});
  o.max_insns_per_block = 0;
  CHECK(watchdog_budget(o, p, {0, 1000}) == 0);
}

TEST_CASE("a launch whose recording outgrows the bound runs, unrecorded and not replayed") {
  // k copies of 32 bytes GM -> UB in a loop. Recording one keeps an effect-order byte, its GM
  // range and a transfer-order entry.
  const uint64_t per_copy = 1 + sizeof(GmAccess) + sizeof(uint16_t);
  auto copies = [](uint64_t k) {
    return isa::assemble(fmt::format(R"(
.arg src
.section aiv
    ldarg x1, src
    movi x2, 0
    movi x3, 0
loop:
    copy_gm2ub x2, x1, 1, 1, 0, 0
    add x3, x3, 1
    blt x3, {}, loop
    pipe_barrier all
    end
)", k), fmt::format("copies{}.s", k));
  };
  const uint64_t small = kRecordBound / per_copy / 2, large = kRecordBound / per_copy * 2;
  for (uint64_t k : {small, large}) {
    INFO(k << " copies, " << k * per_copy << " bytes recorded, bound " << kRecordBound);
    const isa::Program p = copies(k);
    KernelResult first = launch(sim(), p, {0x100000}, 1);
    REQUIRE(first.ok);
    CHECK_FALSE(first.replayed);
    KernelResult second = launch(sim(), p, {0x100000}, 1);
    REQUIRE(second.ok);
    CHECK(second.replayed == (k == small));
    CHECK(second.cycles == first.cycles);
  }
}
