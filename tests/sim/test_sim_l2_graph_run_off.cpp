// memory.l2.keep_within_graph_run off (every preset's default): the launches of a graph run
// (KernelLaunch::l2_run) start cold, as every launch does, so a consumer misses on its
// producer's output. test_sim_l2_graph_run.cpp has the same run with the key on (hits).
#include <catch2/catch.hpp>

#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::counter;

TEST_CASE("graph run, key off: the second launch misses on the first's output") {
  static Simulator sim(load_chip_config("tiny", {"memory.l2.bytes=4 KiB", "memory.l2.ways=1"}),
                       SimOptions{});
  REQUIRE_FALSE(sim.config().l2_keep_within_graph_run);
  REQUIRE_FALSE(sim.config().l2_keep_across_launches);
  constexpr int kLines = 4;
  constexpr uint64_t kOut = 0x100000;
  const GmBlockLookup blocks = npusim::test::lookup_of({{kOut, kLines * 512}});
  const isa::Program producer = npusim::test::move_lines(kLines, true);
  const isa::Program consumer = npusim::test::move_lines(kLines, false);
  npusim::test::run_in_graph_run(sim, producer, kOut, 7, blocks);
  const KernelResult r = npusim::test::run_in_graph_run(sim, consumer, kOut, 7, blocks);
  CHECK(counter(r.counters, "chip.l2.hits") == 0);
  CHECK(counter(r.counters, "chip.l2.misses") == kLines);
}
