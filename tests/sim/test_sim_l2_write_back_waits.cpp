// A write-back L2 whose transfers wait for the write-back of the dirty lines they evict
// (memory.l2.write_back_waits, as on the 910b): the victims still move over HBM in a flow of
// their own, sharing HBM with the evicting transfer, which completes when both have. Tiny preset
// at 1000 MHz (GB/s = bytes/cycle), HBM at 48 B/cycle, the L2 cold at every launch; one chip per
// process, hence a file of its own (the flows that are not waited for: test_sim_l2_write_back).
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using isa::Buf;
using npusim::test::counter;

namespace {

Simulator& sim() {
  static Simulator s(
      load_chip_config("tiny", {"clock_mhz=1000", "memory.hbm.gbps=48", "memory.l2.write_back=true",
                                "memory.l2.write_back_waits=true"}),
      SimOptions{});
  return s;
}
const ChipConfig& cfg() { return sim().config(); }

// Fills `lines` x 16 lines (16 runs of `lines` lines a set stride apart: the first `lines` sets,
// all 16 ways) with dirty lines, then writes as many new lines from `second` on: into the same
// sets (each evicts a dirty line) or into the next ones (none does).
KernelResult fill_then_write(int lines, bool same_sets) {
  const uint64_t base = 0x1000000, line = cfg().l2_line_bytes;
  const uint64_t stride = cfg().l2_bytes / static_cast<uint64_t>(cfg().l2_ways);
  const std::string run = ", x2, 16, " + std::to_string(lines * line / 32) + ", 0, " +
                          std::to_string((stride - line * lines) / 32) + "\n";
  const uint64_t second = base + 16 * stride + (same_sets ? 0 : line * lines);
  KernelResult r =
      npusim::test::run_aiv_body(sim(),
                                 "    copy_ub2gm x1" + run + "    movi x4, " +
                                     std::to_string(second) + "\n    copy_ub2gm x4" + run,
                                 base);
  INFO(r.error);
  REQUIRE(r.ok);
  return r;
}

}  // namespace

TEST_CASE("write-back waits: an evicting write completes when its victims are in HBM") {
  REQUIRE(cfg().l2_line_bytes == 512);
  const double l2_write = std::min(cfg().l2_write_bytes_per_cycle, cfg().l2_bytes_per_cycle());
  const double hbm = cfg().hbm_bytes_per_cycle();
  for (int lines : {1, 16}) {
    // The second write moves 16 x lines x 512 bytes into the L2 at l2_write B/cycle; when it
    // evicts, the victims' as many bytes go to HBM at 48 B/cycle (HBM's only traffic), and the
    // write completes when they have: it lands, and the launch ends, that much later.
    const double bytes = 16.0 * lines * 512;
    KernelResult evicts = fill_then_write(lines, true);
    KernelResult clean = fill_then_write(lines, false);
    CHECK(counter(evicts.counters, "chip.l2.writeback_bytes") == bytes);
    CHECK(counter(clean.counters, "chip.l2.writeback_bytes") == 0);
    REQUIRE(hbm < l2_write);
    CHECK(std::abs(double(evicts.cycles - clean.cycles) - (bytes / hbm - bytes / l2_write)) <= 2);
  }
}
