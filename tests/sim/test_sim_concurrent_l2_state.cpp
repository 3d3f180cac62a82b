// The L2 a launch of a concurrent group starts with (docs/chip_model.md "Concurrent launches",
// "The L2 of each launch"), on the tiny split chip: the same rule as the launches run one at a
// time on the same preset. B (w = z + y) waits for A (z = x + y) and reads A's operand y and
// output z. On tiny (memory.l2.keep_across_launches and keep_within_graph_run false) every
// launch in order starts with an empty L2, so B inside the group takes exactly its cycles
// alone, every one of its lines a miss, though A's lines are still in the L2; with
// keep_within_graph_run and one graph run the launches in order share the L2, and B inside the
// group finds A's lines as B after A in order does, in the same cycles. Launches that overlap
// still share the lines filled while both run.
#include <catch2/catch.hpp>

#include "sim/config/chip_config.h"
#include "tests/sim/concurrent_l2_chain.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using namespace npusim::test::l2_chain;
using npusim::test::concurrent_launch;
using npusim::test::counter;
using npusim::test::kernel_launch;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny"), SimOptions{});
  return s;
}

}  // namespace

TEST_CASE("an L2 cold at every launch: B after A in a group takes its cycles alone") {
  const ChipConfig& cfg = sim().config();
  REQUIRE_FALSE(cfg.l2_keep_across_launches);
  REQUIRE_FALSE(cfg.l2_keep_within_graph_run);
  const uint64_t lines = kBytes / cfg.l2_line_bytes;  // of each of x, y, z, w
  // In order, B after A: its L2 is empty at its start (what A left is dropped).
  KernelResult a = sim().run(launch_a());
  KernelResult b = sim().run(launch_b());
  REQUIRE(a.ok);
  REQUIRE(b.ok);
  // Each launch looks its three arrays' lines up once, every one a miss.
  CHECK(counter(b.counters, "chip.l2.hits") == 0);
  CHECK(counter(b.counters, "chip.l2.misses") == 3 * lines);
  ConcurrentResult g = chain(sim(), 0);
  REQUIRE(g.launches[0].ok);
  REQUIRE(g.launches[1].ok);
  INFO("alone " << a.cycles << " + " << b.cycles << ", group " << g.launches[0].cycles << " + "
                << g.launches[1].cycles);
  CHECK(g.launches[1].start_cycle == g.launches[0].start_cycle + g.launches[0].cycles);
  // A's y and z lines are still in the L2 when B begins (2 x lines of the 8 MiB), but B does
  // not see them: its own cycles are those alone, and the group's lookups all miss.
  CHECK(g.launches[0].cycles == a.cycles);
  CHECK(g.launches[1].cycles == b.cycles);
  CHECK(g.cycles == a.cycles + b.cycles);
  CHECK(counter(g.counters.tree(), "chip.l2.hits") == 0);
  CHECK(counter(g.counters.tree(), "chip.l2.misses") == 6 * lines);
}

TEST_CASE("an L2 cold at every launch: launches that overlap share the lines filled meanwhile") {
  const uint64_t lines = kBytes / sim().config().l2_line_bytes;
  // A on aiv0-1 and C (v = y + y) on aiv2-3 begin together and both read y: y's lines are
  // looked up by both, filled once by whichever comes first, so the other hits on some of
  // them, where each alone misses on all of its lines.
  KernelResult c = sim().run(kernel_launch(vadd(), {kY, kY, kV, kN}, 2));
  REQUIRE(c.ok);
  CHECK(counter(c.counters, "chip.l2.hits") == lines);  // its second read of y (same lines)
  ConcurrentResult g =
      sim().run_concurrent({concurrent_launch(vadd(), {kX, kY, kZ, kN}, 2, kPair),
                            concurrent_launch(vadd(), {kY, kY, kV, kN}, 2, {"aiv2", "aiv3"})});
  REQUIRE(g.launches[0].ok);
  REQUIRE(g.launches[1].ok);
  const uint64_t hits = counter(g.counters.tree(), "chip.l2.hits");
  INFO("group hits " << hits << ", alone " << lines << " (C) + 0 (A)");
  CHECK(hits > lines);
  CHECK(hits + counter(g.counters.tree(), "chip.l2.misses") == 3 * lines + 3 * lines);
}
