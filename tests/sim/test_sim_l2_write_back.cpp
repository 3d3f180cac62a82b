// A write-back L2 (memory.l2.write_back): a write miss is taken by a newly allocated dirty line
// at L2 bandwidth, and a dirty line evicted by a later transfer is written to HBM by a flow of
// its own, which shares HBM with the transfers but does not lengthen the evicting one
// (memory.l2.write_back_waits false; true: test_sim_l2_write_back_waits); the launch ends when
// its write-backs have drained. Expectations derived from the config: tiny
// preset at 1000 MHz (GB/s = bytes/cycle) with HBM at 48 B/cycle; the L2 starts cold at every
// launch.
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
  static Simulator s(
      load_chip_config("tiny", {"clock_mhz=1000", "memory.hbm.gbps=48", "memory.l2.write_back=true",
                                "memory.l2.write_back_waits=false"}),
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

// `dst` <- UB: 16 runs of `lines` consecutive lines a set stride apart, filling the sets of
// `lines` lines from dst's (16 ways) when they start empty.
std::string write_sets(const std::string& dst, int lines) {
  const uint64_t gap_blocks = (set_stride() - 512 * static_cast<uint64_t>(lines)) / 32;
  return "    copy_ub2gm " + dst + ", x2, 16, " + std::to_string(16 * lines) + ", 0, " +
         std::to_string(gap_blocks) + "\n";
}
// 16 dirty lines filling one set from the kernel's GM address: every later allocation in that
// set evicts one of them.
std::string fill_one_set() {
  return write_sets("x1", 1) + "    set_flag mte3, mte2, 0\n    wait_flag mte3, mte2, 0\n";
}
constexpr uint64_t kBase = 0x1000000;

TEST_CASE("write-back: an evicted dirty line is an HBM write sharing HBM with the evictor") {
  // Reading a 17th line of the full set evicts the least recently used one, dirty: the read
  // moves its 512 bytes over HBM while a write-back flow moves the victim's 512.
  const std::string fill = fill_one_set();
  const uint64_t base = kBase;
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
  // Two flows share HBM: the read at min(port 32, 48 / 2) = 24 B/cycle and the write-back (no
  // port: it goes from the L2 to HBM) at 48 / 2; both move 512 bytes, so they end together and
  // the read took 512 / 24 where the clean one takes 512 / min(32, 48).
  const double port = cfg().path_rate(Buf::GM, Buf::UB), hbm = cfg().hbm_bytes_per_cycle();
  const double extra = 512 / std::min(port, hbm / 2) - 512 / std::min(port, hbm);
  REQUIRE(port > hbm / 2);  // the shared HBM is the bound, not the port
  CHECK(std::abs(double(evicts.cycles - clean.cycles) - extra) <= 1);
}

TEST_CASE("write-back: a write that evicts a dirty line does not wait for the write-back") {
  // A one-line write into the full set is absorbed by the L2 as a write into another set is;
  // the victim's 512 bytes go to HBM on their own at 48 B/cycle (HBM's only traffic: the fill
  // was absorbed too), done before the write lands, so both launches take the same cycles.
  auto at = [&](uint64_t addr) {
    return fill_one_set() + "    movi x4, " + std::to_string(addr) +
           "\n    copy_ub2gm x4, x2, 1, 16, 0, 0\n";
  };
  KernelResult evicts = run(at(kBase + 16 * set_stride()), kBase);
  KernelResult clean = run(at(kBase + 16 * set_stride() + 512), kBase);
  CHECK(counter(evicts.counters, "chip.l2.writeback_bytes") == 512);
  CHECK(counter(evicts.counters, "chip.hbm.write_bytes") == 512);
  CHECK(counter(clean.counters, "chip.hbm.write_bytes") == 0);
  const double hbm = cfg().hbm_bytes_per_cycle();
  const double l2_write = std::min(cfg().l2_write_bytes_per_cycle, cfg().l2_bytes_per_cycle());
  REQUIRE(512 / hbm <
          512 / l2_write + cfg().path_latency(Buf::UB, Buf::GM) + cfg().l2_latency_cycles);
  CHECK(evicts.cycles == clean.cycles);
  CHECK(std::abs(double(counter(evicts.counters, "chip.hbm.busy_cycles")) - 512 / hbm) <= 1);
}

TEST_CASE("write-back: the launch ends when its write-backs have drained") {
  // 256 dirty lines fill 16 sets; writing 256 new lines into those sets (one transfer, 16 runs
  // of 16 lines) evicts all of them: 131072 bytes of write-back at 48 B/cycle, 2730.7 cycles,
  // where the write itself moves at 86 B/cycle into the L2 (1524.1 cycles) and the clean launch
  // (the new lines in the next 16 sets) ends D = that + path + L2 latency + task done (500)
  // after the write's flow starts; the evicting one ends 131072 / 48 after it.
  const int lines = 16;
  const uint64_t bytes = 16 * 512 * lines;
  auto at = [&](uint64_t addr) {
    return write_sets("x1", lines) + "    movi x4, " + std::to_string(addr) + "\n" +
           write_sets("x4", lines);
  };
  KernelResult evicts = run(at(kBase + 16 * set_stride()), kBase);
  KernelResult clean = run(at(kBase + 16 * set_stride() + 512 * lines), kBase);
  CHECK(counter(evicts.counters, "chip.l2.writeback_bytes") == bytes);
  CHECK(counter(clean.counters, "chip.l2.writeback_bytes") == 0);
  const double drain = double(bytes) / cfg().hbm_bytes_per_cycle();
  const double clean_tail =
      double(bytes) / std::min(cfg().l2_write_bytes_per_cycle, cfg().l2_bytes_per_cycle()) +
      cfg().path_latency(Buf::UB, Buf::GM) + cfg().l2_latency_cycles +
      double(cfg().task_done_cycles());
  REQUIRE(drain > clean_tail + 100);
  CHECK(std::abs(double(evicts.cycles) - (double(clean.cycles) - clean_tail + drain)) <= 2);
}
