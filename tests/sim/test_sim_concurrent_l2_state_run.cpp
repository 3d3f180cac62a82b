// The L2 a launch of a concurrent group starts with where the preset keeps it within a graph
// run (tiny with memory.l2.keep_within_graph_run: its own process, one chip per process): the
// group's launches share the L2 as the run's launches in order do (docs/chip_model.md
// "Concurrent launches", "The L2 of each launch"; the cold preset:
// test_sim_concurrent_l2_state.cpp).
#include <catch2/catch.hpp>

#include "sim/config/chip_config.h"
#include "tests/sim/concurrent_l2_chain.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using namespace npusim::test::l2_chain;
using npusim::test::concurrent_launch;
using npusim::test::counter;
using npusim::test::kernel_launch;

TEST_CASE("an L2 kept within a graph run: B after A in a group finds A's lines, as in order") {
  Simulator sim(load_chip_config("tiny", {"memory.l2.keep_within_graph_run=true"}), SimOptions{});
  const ChipConfig& cfg = sim.config();
  const uint64_t lines = kBytes / cfg.l2_line_bytes;
  KernelResult b_cold = sim.run(launch_b());  // in no run: cold
  // In order, one graph run: B starts with the L2 A left, and hits on y and z.
  KernelResult a = sim.run(launch_a(1));
  KernelResult b = sim.run(launch_b(1));
  REQUIRE(b_cold.ok);
  REQUIRE(a.ok);
  REQUIRE(b.ok);
  CHECK(counter(b.counters, "chip.l2.hits") == 2 * lines);
  CHECK(counter(b.counters, "chip.l2.misses") == lines);
  CHECK(b.cycles < b_cold.cycles);     // its reads at the L2's rate
  ConcurrentResult g = chain(sim, 2);  // a new run: cold at A's start
  REQUIRE(g.launches[0].ok);
  REQUIRE(g.launches[1].ok);
  INFO("in order " << a.cycles << " + " << b.cycles << " (B cold " << b_cold.cycles << "), group "
                   << g.launches[0].cycles << " + " << g.launches[1].cycles);
  CHECK(g.launches[0].cycles == a.cycles);
  CHECK(g.launches[1].cycles == b.cycles);
  CHECK(counter(g.counters.tree(), "chip.l2.hits") == 2 * lines);
  CHECK(counter(g.counters.tree(), "chip.l2.misses") == 4 * lines);
}
