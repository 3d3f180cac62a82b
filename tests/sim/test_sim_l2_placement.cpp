// The L2 model files a cold launch's lines by allocation (sim/chip/l2_placement.h): a launch's
// L2 outcome depends on its blocks' sizes and the order it first touches them, not on where the
// allocator put them. On a direct-mapped L2 of 8 sets (tiny chip, 4 KiB, 1 way, 512-byte lines:
// one way is 4 KiB), a kernel reads a line of A, a line of B, then A again: filed at device
// addresses, B 4 KiB above A takes A's set and A's second read misses, B 512 bytes above A does
// not; filed by block, both placements give the second read of A a hit.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "sim/chip/l2_placement.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::a_b_a;
using npusim::test::counter;
using npusim::test::lookup_of;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny", {"memory.l2.bytes=4 KiB", "memory.l2.ways=1"}),
                     SimOptions{});
  return s;
}

KernelResult run(uint64_t a, uint64_t b, GmBlockLookup blocks) {
  KernelLaunch l;
  l.program = &a_b_a();
  l.args = {a, b};
  l.gm_blocks = std::move(blocks);
  KernelResult r = sim().run(l);
  INFO(r.error);
  REQUIRE(r.ok);
  return r;
}

}  // namespace

TEST_CASE("l2 placement: blocks packed in first-touch order, offsets kept") {
  constexpr uint64_t kBase = L2Placement::kPackedBase;
  L2Placement p(512);
  p.begin_launch(lookup_of({{0x10000, 1536}, {0x40000, 512}, {0x80000, 1024}}));
  uint64_t run = 0, origin = 0;
  // The block at 0x80000 is touched first: it starts the packed range. Each address's page
  // origin (where the L2's page rotation counts pages from) is its block's first L2 byte.
  CHECK(p.l2_address(0x80000 + 700, &run, &origin) == kBase + 700);
  CHECK(run == 1024 - 700);
  CHECK(origin == kBase);
  CHECK(p.l2_address(0x10000 + 5, &run, &origin) == kBase + 1024 + 5);
  CHECK(run == 1536 - 5);
  CHECK(origin == kBase + 1024);
  CHECK(p.l2_address(0x80000, &run, &origin) == kBase);  // placed once per launch
  CHECK(origin == kBase);
  CHECK(p.l2_address(0x40000 + 511, &run, &origin) == kBase + 1024 + 1536 + 511);
  CHECK(run == 1);
  CHECK(origin == kBase + 1024 + 1536);
  // Outside every block: the device address itself, to the end of the range, absolute pages.
  CHECK(p.l2_address(0x20000, &run, &origin) == 0x20000);
  CHECK(run == UINT64_MAX);
  CHECK(origin == 0);
  // The next launch places afresh, in its own order.
  p.begin_launch(lookup_of({{0x10000, 1536}, {0x40000, 512}}));
  CHECK(p.l2_address(0x40000, &run, &origin) == kBase);
  CHECK(p.l2_address(0x10000, &run, &origin) == kBase + 512);
  CHECK(origin == kBase + 512);
  // No lookup: every address is filed at itself.
  p.begin_launch({});
  CHECK(p.l2_address(0x40000, &run, &origin) == 0x40000);
  CHECK(origin == 0);
}

TEST_CASE("l2 placement: an arena past the planned buffer at its start is a piece of its own") {
  // A graph's arena [0x10000, + 4096) holds a planned buffer at its start [0x10000, + 256): the
  // lookup (planned_block_lookup) finds the buffer for its bytes and the arena for the rest, two
  // blocks with one start. An address just past the buffer once got the buffer's entry back with
  // no bytes left in it (run 0: access_placed never advanced).
  constexpr uint64_t kBase = L2Placement::kPackedBase;
  L2Placement p(512);
  p.begin_launch(planned_block_lookup({{0x10000, 256}}, 512, lookup_of({{0x10000, 4096}})));
  uint64_t run = 0, origin = 0;
  CHECK(p.l2_address(0x10000 + 10, &run, &origin) == kBase + 10);
  CHECK(run == 256 - 10);
  // The rest of the arena, from the buffer's end, placed on the next line.
  CHECK(p.l2_address(0x10000 + 256, &run, &origin) == kBase + 512);
  REQUIRE(run == 4096 - 256);  // (on failure the range below would never end)
  CHECK(origin == kBase + 512);
  CHECK(p.l2_address(0x10000 + 300, &run, &origin) == kBase + 512 + 44);
  CHECK(p.l2_address(0x10000 + 20, &run, &origin) == kBase + 20);  // the buffer as placed
  // A range across the buffer's end is filed in two pieces and ends.
  L2Tags l2(64 * 1024, 512, 4);
  GmAccess r;
  r.addr = 0x10000 + 128;
  r.bytes = 256;
  const L2Outcome o = access_placed(l2, p, r);
  CHECK(o.hit_bytes + o.miss_bytes == 256);
}

TEST_CASE("l2 placement: a launch's L2 outcome does not depend on where its blocks lie") {
  const ChipConfig& cfg = sim().config();
  REQUIRE(cfg.l2_line_bytes == 512);
  REQUIRE(cfg.l2_bytes / (cfg.l2_line_bytes * cfg.l2_ways) == 8);  // one way: 4 KiB
  REQUIRE_FALSE(cfg.l2_keep_across_launches);
  constexpr uint64_t kA = 0x100000, kConflict = kA + 4096, kApart = kA + 512;

  // Filed at device addresses (no lookup): B in A's set evicts A.
  const KernelResult conflict = run(kA, kConflict, {});
  CHECK(counter(conflict.counters, "chip.l2.hits") == 0);
  CHECK(counter(conflict.counters, "chip.l2.misses") == 3);
  const KernelResult apart = run(kA, kApart, {});
  CHECK(counter(apart.counters, "chip.l2.hits") == 1);
  CHECK(counter(apart.counters, "chip.l2.misses") == 2);
  CHECK(conflict.cycles > apart.cycles);

  // Filed by block: the same outcome at every placement, B below A included.
  const KernelResult by_block[] = {
      run(kA, kConflict, lookup_of({{kA, 512}, {kConflict, 512}})),
      run(kA, kApart, lookup_of({{kA, 512}, {kApart, 512}})),
      run(kA, kA - 4096, lookup_of({{kA, 512}, {kA - 4096, 512}})),
  };
  for (const KernelResult& r : by_block) {
    CHECK(counter(r.counters, "chip.l2.hits") == 1);
    CHECK(counter(r.counters, "chip.l2.misses") == 2);
    CHECK(r.cycles == apart.cycles);
    CHECK(counter_digest(r.counter_delta) == counter_digest(apart.counter_delta));
  }
}
