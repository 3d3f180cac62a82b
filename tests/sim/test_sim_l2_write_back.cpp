// A write-back L2 (memory.l2.write_back): a write miss is taken by a newly allocated dirty line
// at L2 bandwidth, and a dirty line evicted by a later transfer costs that transfer an HBM
// write of the line. Expectations derived from the config: tiny preset at 1000 MHz (GB/s =
// bytes/cycle) with HBM at 48 B/cycle; the L2 starts cold at every launch.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using isa::Buf;
using npusim::test::ceil_cycles;
using npusim::test::counter;
using npusim::test::task_overhead;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny", {"clock_mhz=1000", "memory.hbm.gbps=48",
                                               "memory.l2.write_back=true"}),
                     SimOptions{});
  return s;
}
const ChipConfig& cfg() { return sim().config(); }

KernelResult run(const std::string& body, uint64_t addr) {
  KernelResult r = npusim::test::run_aiv_body(sim(), body, addr);
  INFO(r.error);
  REQUIRE(r.ok);
  return r;
}

// Bytes between two addresses of the same L2 set: sets x line bytes.
uint64_t set_stride() {
  return cfg().l2_bytes / (static_cast<uint64_t>(cfg().l2_ways) * cfg().l2_line_bytes) *
         cfg().l2_line_bytes;
}

}  // namespace

TEST_CASE("config assumptions of these tests") {
  CHECK(cfg().l2_write_back);
  CHECK_FALSE(cfg().l2_keep_across_launches);
  CHECK(cfg().l2_line_bytes == 512);
  CHECK(cfg().l2_write_bytes_per_cycle == 86);
  CHECK(set_stride() == 512 * 1024);  // 8 MiB / (16 ways x 512 B) = 1024 sets
}

TEST_CASE("write-back: a write miss is absorbed by the L2 at its bandwidth, HBM untouched") {
  // 7040 bytes from UB to GM, cold L2: every line misses, is allocated dirty and takes the
  // bytes at min(the core's L2 write port 86, L2 5000) B/cycle; it lands the path latency plus
  // the L2 latency later. 3 scalar instructions come first.
  KernelResult r = run("    copy_ub2gm x1, x2, 1, 220, 0, 0\n", 0x200000);
  const double lands = 3 +
                       7040 / std::min(cfg().l2_write_bytes_per_cycle, cfg().l2_bytes_per_cycle()) +
                       cfg().path_latency(Buf::UB, Buf::GM) + cfg().l2_latency_cycles;
  CHECK(r.cycles == task_overhead(cfg()) + ceil_cycles(lands));
  CHECK(counter(r.counters, "chip.l2.misses") == 14);
  CHECK(counter(r.counters, "chip.l2.write_bytes") == 7040);
  CHECK(counter(r.counters, "chip.hbm.write_bytes") == 0);
  CHECK(counter(r.counters, "chip.l2.writeback_bytes") == 0);
  // noalloc writes go to HBM as before.
  KernelResult s = run("    copy_ub2gm.noalloc x1, x2, 1, 220, 0, 0\n", 0x200000);
  CHECK(counter(s.counters, "chip.hbm.write_bytes") == 7040);
  CHECK(counter(s.counters, "chip.l2.write_bytes") == 0);
}

TEST_CASE("write-back: evicting a dirty line costs the evicting transfer an HBM write") {
  // 16 dirty lines fill one set (16 ways); reading a 17th line of that set evicts the least
  // recently used one, dirty: the read's HBM phase moves 512 + 512 bytes instead of 512.
  const uint64_t gap_blocks = (set_stride() - 512) / 32;
  const std::string fill = "    copy_ub2gm x1, x2, 16, 16, 0, " + std::to_string(gap_blocks) +
                           "\n    set_flag mte3, mte2, 0\n    wait_flag mte3, mte2, 0\n";
  const uint64_t base = 0x1000000;
  KernelResult evicts = run(fill + "    movi x4, " + std::to_string(base + 16 * set_stride()) +
                                "\n    copy_gm2ub x3, x4, 1, 16, 0, 0\n",
                            base);
  CHECK(counter(evicts.counters, "chip.l2.writeback_bytes") == 512);
  CHECK(counter(evicts.counters, "chip.hbm.write_bytes") == 512);
  CHECK(counter(evicts.counters, "chip.hbm.read_bytes") == 512);
  // The same read of a line in another set evicts nothing.
  KernelResult clean = run(fill + "    movi x4, " + std::to_string(base + 16 * set_stride() + 512) +
                               "\n    copy_gm2ub x3, x4, 1, 16, 0, 0\n",
                           base);
  CHECK(counter(clean.counters, "chip.l2.writeback_bytes") == 0);
  CHECK(counter(clean.counters, "chip.hbm.write_bytes") == 0);
  // The write-back goes from the L2 to HBM, not through the core: the read's HBM phase moves
  // 512 + 512 bytes at min(the GM port scaled by 1024 / 512, HBM) = min(64, 48) B/cycle, where
  // the clean read moves 512 at min(32, 48). (Through the port it would be 1024 / 32.)
  const double port = cfg().path_rate(Buf::GM, Buf::UB), hbm = cfg().hbm_bytes_per_cycle();
  const double extra = 1024 / std::min(port * 1024 / 512, hbm) - 512 / std::min(port, hbm);
  REQUIRE(port * 2 > hbm);  // the scaled port is not the bound: HBM is
  CHECK(std::abs(double(evicts.cycles - clean.cycles) - extra) <= 1);
}
