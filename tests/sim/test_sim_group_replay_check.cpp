// Replay of a repeated launch group under SimOptions::Replay::check (sim/replay/group_replay.h)
// in a timing-only simulator on the tiny split chip: the same group a second time is replayed,
// then simulated from the same state, and the two agree (the check would throw naming the first
// difference); the results are the simulated ones, marked replayed, equal to the first run's.
// Likewise a group replayed by translation: its arguments moved by whole blocks, with a launch
// whose loaded value steers it.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::kernel_launch;
using npusim::test::lookup_of;
using npusim::test::vadd;
using npusim::test::write_gm;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny"), [] {
    SimOptions o;
    o.functional = false;
    o.replay = SimOptions::Replay::check;
    return o;
  }());
  return s;
}

}  // namespace

TEST_CASE("check mode replays a repeated group and verifies it against a fresh simulation") {
  constexpr uint64_t kN = 32768;
  constexpr uint64_t kX = 0x1000000, kY = 0x1100000, kZ = 0x1200000, kW = 0x1300000;
  constexpr uint64_t kV = 0x1400000;
  const GmBlockLookup blocks =
      lookup_of({{kX, 0x100000}, {kY, 0x100000}, {kZ, 0x100000}, {kW, 0x100000}, {kV, 0x100000}});
  // z = x + y and w = z + y after it on named cores, v = y + y beside them on cores taken when
  // ready: a group of fixed and ready-taken cores.
  std::vector<ConcurrentLaunch> g = {
      {kernel_launch(vadd(), {kX, kY, kZ, kN}, 2), {"aiv0", "aiv1"}, {}},
      {kernel_launch(vadd(), {kZ, kY, kW, kN}, 2), {"aiv0", "aiv1"}, {0}},
      {kernel_launch(vadd(), {kY, kY, kV, kN}, 2), {}, {}},
  };
  g[2].take_cores_when_ready = true;
  for (ConcurrentLaunch& c : g) c.launch.gm_blocks = blocks;
  const ConcurrentResult first = sim().run_concurrent(g);
  ConcurrentResult second;
  REQUIRE_NOTHROW(second = sim().run_concurrent(g));
  REQUIRE(first.cycles == second.cycles);
  REQUIRE(first.counters.tree() == second.counters.tree());
  for (size_t i = 0; i < g.size(); ++i) {
    REQUIRE(first.launches[i].ok);
    REQUIRE_FALSE(first.launches[i].replayed);
    REQUIRE(second.launches[i].replayed);
    REQUIRE(second.launches[i].start_cycle - second.start_cycle ==
            first.launches[i].start_cycle - first.start_cycle);
    REQUIRE(second.launches[i].cycles == first.launches[i].cycles);
    REQUIRE(second.launches[i].counters == first.launches[i].counters);
  }
}

TEST_CASE("check mode verifies a group replayed at other addresses, a loaded value steering it") {
  constexpr uint64_t kN = 32768;
  constexpr uint64_t kX = 0x3000000, kY = 0x3100000, kZ = 0x3200000, kZ2 = 0x3300000;
  const GmBlockLookup blocks =
      lookup_of({{kX, 0x100000}, {kY, 0x100000}, {kZ, 0x100000}, {kZ2, 0x100000}});
  // A branch on a loaded value (x's first word), beside z = x + y.
  static const isa::Program steered = isa::assemble(
      ".arg x, f16[16]\n.section aiv\n  ldarg x1, x\n  ld x2, x1\n  bne x2, 0, l\n"
      "  add x3, x3, 1\n  mul x3, x3, x3\nl:\n  end\n",
      "steered.s");
  const auto group = [&](uint64_t z) {
    std::vector<ConcurrentLaunch> g = {
        {kernel_launch(vadd(), {kX, kY, z, kN}, 2), {}, {}},
        {kernel_launch(steered, {kX}, 1), {}, {}},
    };
    for (ConcurrentLaunch& c : g) {
      c.take_cores_when_ready = true;
      c.launch.gm_blocks = blocks;
    }
    return g;
  };
  write_gm(sim(), kX, std::vector<uint64_t>{0});
  const ConcurrentResult first = sim().run_concurrent(group(kZ));
  ConcurrentResult second;
  REQUIRE_NOTHROW(second = sim().run_concurrent(group(kZ2)));
  REQUIRE(first.cycles == second.cycles);
  for (size_t i = 0; i < 2; ++i) {
    REQUIRE(first.launches[i].ok);
    REQUIRE_FALSE(first.launches[i].replayed);
    REQUIRE(second.launches[i].replayed);
    REQUIRE(second.launches[i].cycles == first.launches[i].cycles);
  }
}
