// Ordered launches in one concurrent run (ConcurrentLaunch::after: streams) on the tiny split
// chip (2 cube cores, 4 vector cores): a launch that waits for another begins at that one's
// end, on the same cores if it names them, and reads what it wrote; an independent launch on
// other cores runs beside the whole chain; a failed launch's dependants do not run while the
// others complete; overlapping unordered launches on one core and waits for a launch that is
// not an earlier one are refused.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/error.h"
#include "common/numeric.h"
#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::concurrent_launch;
using npusim::test::counter;
using npusim::test::kernel_launch;
using npusim::test::read_gm;
using npusim::test::vadd;
using npusim::test::write_gm;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny"), SimOptions{});
  return s;
}

// x, y: vadd operands of kN fp16 each (small integers: every sum is exact in fp16); z = x + y
// (launch A), w = z + y (launch B, reading A's output); u, v: C's operands and output.
constexpr uint64_t kN = 32768;
constexpr uint64_t kX = 0x1000000, kY = 0x1100000, kZ = 0x1200000, kW = 0x1300000;
constexpr uint64_t kU = 0x2000000, kV = 0x2400000;
constexpr uint64_t kCN = 8 * kN;  // C's elements: longer than A and B together

std::vector<uint16_t> ramp(uint64_t n, int mod, float scale) {
  std::vector<uint16_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = f32_to_f16(static_cast<float>(i % mod) * scale);
  return v;
}

void write_operands() {
  write_gm(sim(), kX, ramp(kN, 101, 1.0f));
  write_gm(sim(), kY, ramp(kN, 37, -2.0f));
  write_gm(sim(), kU, ramp(kCN, 53, 3.0f));
  write_gm(sim(), kZ, std::vector<uint16_t>(kN, 0));
  write_gm(sim(), kW, std::vector<uint16_t>(kN, 0));
}

// The reference of w = (x + y) + y, in fp32 rounded to fp16 at each step.
std::vector<uint16_t> expected_w() {
  const std::vector<uint16_t> x = ramp(kN, 101, 1.0f), y = ramp(kN, 37, -2.0f);
  std::vector<uint16_t> w(kN);
  for (uint64_t i = 0; i < kN; ++i) {
    const float z = f16_to_f32(f32_to_f16(f16_to_f32(x[i]) + f16_to_f32(y[i])));
    w[i] = f32_to_f16(z + f16_to_f32(y[i]));
  }
  return w;
}

const std::vector<std::string> kPair = {"aiv0", "aiv1"};

}  // namespace

TEST_CASE("two vector launches ordered on the same cores take the sum of their alone times") {
  write_operands();
  // B adds data A does not touch (u), so it finds no line of A's in the shared L2: each takes
  // exactly its time alone, one after the other.
  KernelResult a = sim().run(kernel_launch(vadd(), {kX, kY, kZ, kN}, 2));
  KernelResult b = sim().run(kernel_launch(vadd(), {kU, kU, kV, kN}, 2));
  REQUIRE(a.ok);
  REQUIRE(b.ok);
  write_operands();
  ConcurrentResult g =
      sim().run_concurrent({concurrent_launch(vadd(), {kX, kY, kZ, kN}, 2, kPair),
                            concurrent_launch(vadd(), {kU, kU, kV, kN}, 2, kPair, {0})});
  REQUIRE(g.launches[0].ok);
  REQUIRE(g.launches[1].ok);
  INFO("alone " << a.cycles << " + " << b.cycles << ", ordered " << g.launches[0].cycles << " + "
                << g.launches[1].cycles << ", makespan " << g.cycles);
  CHECK(g.launches[0].start_cycle == g.start_cycle);
  CHECK(g.launches[1].start_cycle == g.start_cycle + g.launches[0].cycles);
  CHECK(g.launches[0].cycles == a.cycles);
  CHECK(g.launches[1].cycles == b.cycles);
  CHECK(g.cycles == a.cycles + b.cycles);
  // Each launch's counters are its own blocks', as alone (the cores ran both launches).
  const nlohmann::json alone[2] = {a.counter_delta.tree(), b.counter_delta.tree()};
  for (size_t k = 0; k < 2; ++k)
    for (const std::string& core : kPair) {
      INFO("launch " << k << " core " << core);
      CHECK(g.launches[k].counters["chip"][core] == alone[k]["chip"][core]);
    }
  const std::vector<uint16_t> u = ramp(kN, 53, 3.0f);
  std::vector<uint16_t> v(kN);
  for (uint64_t i = 0; i < kN; ++i) v[i] = f32_to_f16(2 * f16_to_f32(u[i]));
  CHECK(read_gm<uint16_t>(sim(), kV, kN) == v);
  CHECK(counter(g.counters.tree(), "chip.launches") == 2);
}

TEST_CASE("B ordered after A on the same cores reads what A wrote") {
  write_operands();
  ConcurrentResult g =
      sim().run_concurrent({concurrent_launch(vadd(), {kX, kY, kZ, kN}, 2, kPair),
                            concurrent_launch(vadd(), {kZ, kY, kW, kN}, 2, kPair, {0})});
  REQUIRE(g.launches[0].ok);
  REQUIRE(g.launches[1].ok);
  CHECK(read_gm<uint16_t>(sim(), kW, kN) == expected_w());
}

TEST_CASE("a chain A -> B beside an independent C: C overlaps both, B begins at A's end") {
  write_operands();
  ConcurrentResult g =
      sim().run_concurrent({concurrent_launch(vadd(), {kX, kY, kZ, kN}, 2, kPair),
                            concurrent_launch(vadd(), {kZ, kY, kW, kN}, 2, kPair, {0}),
                            concurrent_launch(vadd(), {kU, kU, kV, kCN}, 2, {"aiv2", "aiv3"})});
  for (const KernelResult& r : g.launches) REQUIRE(r.ok);
  const KernelResult &a = g.launches[0], &b = g.launches[1], &c = g.launches[2];
  INFO("A " << a.start_cycle << "+" << a.cycles << ", B " << b.start_cycle << "+" << b.cycles
            << ", C " << c.start_cycle << "+" << c.cycles);
  CHECK(a.start_cycle == g.start_cycle);
  CHECK(c.start_cycle == g.start_cycle);
  CHECK(b.start_cycle == a.start_cycle + a.cycles);
  CHECK(c.start_cycle < a.start_cycle + a.cycles);             // C begins before A's end
  CHECK(c.start_cycle + c.cycles > b.start_cycle + b.cycles);  // and runs past B's end
  CHECK(g.cycles == c.cycles);
  CHECK(read_gm<uint16_t>(sim(), kW, kN) == expected_w());
  // C's output: u + u.
  const std::vector<uint16_t> u = ramp(kCN, 53, 3.0f);
  std::vector<uint16_t> v(kCN);
  for (uint64_t i = 0; i < kCN; ++i) v[i] = f32_to_f16(2 * f16_to_f32(u[i]));
  CHECK(read_gm<uint16_t>(sim(), kV, kCN) == v);
}

TEST_CASE("unnamed cores: a launch takes the cores of the launches it waits for") {
  write_operands();
  // A and B (after A) take aiv0 and aiv1; C, beside both, aiv2 and aiv3.
  ConcurrentResult g =
      sim().run_concurrent({concurrent_launch(vadd(), {kX, kY, kZ, kN}, 2, {}),
                            concurrent_launch(vadd(), {kZ, kY, kW, kN}, 2, {}, {0}),
                            concurrent_launch(vadd(), {kU, kU, kV, kCN}, 2, {})});
  for (const KernelResult& r : g.launches) REQUIRE(r.ok);
  const nlohmann::json tree = g.counters.tree();
  CHECK(counter(tree, "chip.aiv0.blocks") == 2);  // A's block 0, then B's
  CHECK(counter(tree, "chip.aiv1.blocks") == 2);
  CHECK(counter(tree, "chip.aiv2.blocks") == 1);
  CHECK(counter(tree, "chip.aiv3.blocks") == 1);
  CHECK(counter(g.launches[0].counters, "chip.aiv0.blocks") == 1);  // each launch its own
  CHECK(counter(g.launches[1].counters, "chip.aiv0.blocks") == 1);
  CHECK(g.launches[1].start_cycle == g.launches[0].start_cycle + g.launches[0].cycles);
  CHECK(read_gm<uint16_t>(sim(), kW, kN) == expected_w());
}

TEST_CASE("a faulting launch: those waiting for it do not run, the launch beside it completes") {
  write_operands();
  isa::Program bad =
      isa::assemble(".section aiv\n    movi x3, 0\n    div x4, x3, 0\n    end\n", "bad.s");
  ConcurrentResult g =
      sim().run_concurrent({concurrent_launch(bad, {}, 1, {"aiv0"}),
                            concurrent_launch(vadd(), {kZ, kY, kW, kN}, 2, kPair, {0}),
                            concurrent_launch(vadd(), {kU, kU, kV, kCN}, 2, {"aiv2", "aiv3"}),
                            concurrent_launch(vadd(), {kZ, kY, kW, kN}, 1, {"aiv0"}, {1})});
  REQUIRE_FALSE(g.launches[0].ok);
  CHECK(g.launches[0].error == "core aiv0 pc 1 (bad.s:3): div x4, x3, 0: division by zero");
  REQUIRE_FALSE(g.launches[1].ok);
  CHECK(g.launches[1].error == "did not run: launch 0 ('bad') it waits for failed");
  CHECK(g.launches[1].cycles == 0);
  REQUIRE_FALSE(g.launches[3].ok);
  CHECK(g.launches[3].error == "did not run: launch 1 ('vadd_f16') it waits for failed");
  REQUIRE(g.launches[2].ok);
  CHECK(read_gm<uint16_t>(sim(), kW, kN) == std::vector<uint16_t>(kN, 0));  // B never wrote
  CHECK(counter(g.counters.tree(), "chip.launches") == 2);
  CHECK(counter(g.counters.tree(), "chip.failed_launches") == 1);
}

TEST_CASE("a deadlocked launch: the launch waiting for it does not run, and the host goes on") {
  isa::Program dl = isa::assemble(".section aiv\n    wait_flag mte2, v, 1\n    end\n", "dl.s");
  isa::Program nop = isa::assemble(".section aiv\n    nop\n    end\n", "nop.s");
  ConcurrentResult g = sim().run_concurrent({concurrent_launch(dl, {}, 1, {"aiv1"}),
                                             concurrent_launch(nop, {}, 1, {"aiv1"}, {0}),
                                             concurrent_launch(nop, {}, 1, {"aiv0"})});
  REQUIRE_FALSE(g.launches[0].ok);
  CHECK(g.launches[0].error == "deadlock: core aiv1 pc 0 (dl.s:2) wait_flag mte2, v, 1 never set");
  REQUIRE_FALSE(g.launches[1].ok);
  CHECK(g.launches[1].error == "did not run: launch 0 ('dl') it waits for failed");
  CHECK(g.launches[2].ok);
  // The chip is clean afterwards: a nop alone takes the task overheads and its one cycle.
  KernelResult r = sim().run(kernel_launch(nop, {}, 1));
  REQUIRE(r.ok);
  CHECK(r.cycles == test::task_overhead(sim().config()) + 1);
}

TEST_CASE("refused: unordered launches on one core, waits for a launch not before it") {
  isa::Program nop = isa::assemble(".section aiv\n    nop\n    end\n", "nop.s");
  auto refused = [&](const std::vector<ConcurrentLaunch>& group, const std::string& what) {
    INFO(what);
    try {
      sim().run_concurrent(group);
      FAIL("accepted");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  // Launches 1 and 2 both wait for 0 but not for each other: they may overlap.
  refused({concurrent_launch(nop, {}, 1, {"aiv0"}), concurrent_launch(nop, {}, 1, {"aiv1"}, {0}),
           concurrent_launch(nop, {}, 1, {"aiv1"}, {0})},
          "concurrent launch 2 'nop': core aiv1 is also launch 1's ('nop'), and neither waits "
          "for the other");
  refused({concurrent_launch(nop, {}, 1, {"aiv0"}, {1}), concurrent_launch(nop, {}, 1, {"aiv1"})},
          "concurrent launch 0 'nop' waits for launch 1: a launch can wait only for earlier "
          "launches of the group (launch 0 has none)");
  refused({concurrent_launch(nop, {}, 1, {"aiv0"}), concurrent_launch(nop, {}, 1, {"aiv1"}, {1})},
          "concurrent launch 1 'nop' waits for launch 1: a launch can wait only for earlier "
          "launches of the group (0..0)");
  // Ordered through another launch: a core may be shared.
  ConcurrentResult g = sim().run_concurrent({concurrent_launch(nop, {}, 1, {"aiv0"}),
                                             concurrent_launch(nop, {}, 1, {"aiv1"}, {0}),
                                             concurrent_launch(nop, {}, 1, {"aiv0"}, {1})});
  for (const KernelResult& r : g.launches) REQUIRE(r.ok);
  const uint64_t alone = test::task_overhead(sim().config()) + 1;
  CHECK(g.launches[2].start_cycle == g.start_cycle + 2 * alone);
  CHECK(g.cycles == 3 * alone);
}
