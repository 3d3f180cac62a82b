// A launch's planned buffers (KernelLaunch::planned_blocks): MemorySystem::select_l2 files a
// cold launch's lines by them, ahead of the allocation they lie in, so its L2 outcome does not
// depend on where a static plan put them in the allocation; a launch whose L2 is kept (a graph
// run's) files by the allocation, one L2 range per block through the run.
#include <catch2/catch.hpp>

#include "sim/chip/l2_placement.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::a_b_a;
using npusim::test::counter;
using npusim::test::lookup_of;

TEST_CASE("planned blocks: planned buffers looked up before the allocation, line-aligned only") {
  // One allocation [0x10000, +64 KiB) holding three planned buffers, given out of order; the one
  // at 0x10000 + 4100 starts inside a line and is left to its allocation.
  const GmBlockLookup blocks = planned_block_lookup(
      {{0x10000 + 8192, 1024}, {0x10000, 512}, {0x10000 + 4100, 100}}, 512,
      lookup_of({{0x10000, 65536}}));
  uint64_t start = 0, bytes = 0;
  REQUIRE(blocks(0x10000 + 8192 + 1023, &start, &bytes));
  CHECK(start == 0x10000 + 8192);
  CHECK(bytes == 1024);
  REQUIRE(blocks(0x10000 + 511, &start, &bytes));
  CHECK(start == 0x10000);
  CHECK(bytes == 512);
  for (uint64_t addr : {uint64_t{0x10000 + 512}, uint64_t{0x10000 + 4100},
                        uint64_t{0x10000 + 8192 + 1024}}) {
    REQUIRE(blocks(addr, &start, &bytes));  // between the buffers: the allocation
    CHECK(start == 0x10000);
    CHECK(bytes == 65536);
  }
  CHECK_FALSE(blocks(0x10000 + 65536, &start, &bytes));
  // Without allocations: only the planned buffers answer.
  const GmBlockLookup alone = planned_block_lookup({{0x10000, 512}}, 512, {});
  CHECK(alone(0x10000 + 100, &start, &bytes));
  CHECK_FALSE(alone(0x10000 + 512, &start, &bytes));
  // No line-aligned buffer: the allocations' lookup itself.
  CHECK_FALSE(bool(planned_block_lookup({{0x10001, 512}}, 512, {})));
}

TEST_CASE("planned blocks: a cold launch files by its planned buffers, a graph run's does not") {
  // The tiny chip's direct-mapped 8-set L2 with the L2 kept within graph runs. A and B are two
  // planned buffers of one allocation, B 4 KiB above A: A's set.
  Simulator s(load_chip_config("tiny", {"memory.l2.bytes=4 KiB", "memory.l2.ways=1",
                                        "memory.l2.keep_within_graph_run=true"}),
              SimOptions{});
  REQUIRE_FALSE(s.config().l2_keep_across_launches);
  constexpr uint64_t kBlock = 0x100000, kA = kBlock, kB = kBlock + 4096;
  const auto run_planned = [&](uint64_t l2_run, bool planned) {
    KernelLaunch l;
    l.program = &a_b_a();
    l.args = {kA, kB};
    l.gm_blocks = lookup_of({{kBlock, 16384}});
    if (planned) l.planned_blocks = {{kB, 512}, {kA, 512}};
    l.l2_run = l2_run;
    KernelResult r = s.run(l);
    INFO(r.error);
    REQUIRE(r.ok);
    return r;
  };
  // Cold (no run): filed by buffer, A and B packed one after the other, A's second read hits.
  const KernelResult cold = run_planned(0, true);
  CHECK(counter(cold.counters, "chip.l2.hits") == 1);
  CHECK(counter(cold.counters, "chip.l2.misses") == 2);
  // Without the buffers, filed by the allocation (offsets kept): B evicts A.
  const KernelResult whole = run_planned(0, false);
  CHECK(counter(whole.counters, "chip.l2.hits") == 0);
  CHECK(counter(whole.counters, "chip.l2.misses") == 3);
  // The first launch of a graph run, whose L2 is kept through the run: filed by the allocation
  // (one L2 range per block through the run), the buffers ignored.
  const KernelResult in_run = run_planned(7001, true);
  CHECK(counter(in_run.counters, "chip.l2.hits") == 0);
  CHECK(counter(in_run.counters, "chip.l2.misses") == 3);
  CHECK(in_run.cycles == whole.cycles);
}
