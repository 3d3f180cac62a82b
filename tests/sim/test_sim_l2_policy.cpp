// The L2 cache policy of GM transfers (normal, noalloc, bypass) and an L2 kept across launches
// (memory.l2.keep_across_launches), each expectation derived from the chip config: the tiny
// preset at a 1000 MHz clock (GB/s = bytes/cycle) with HBM slowed to 48 B/cycle, as in
// test_sim_timing.cpp. A hit costs the L2 latency and moves at the core's L2 read port, a miss
// the HBM latency and the core's GM port. The L2 keeps its lines between launches here, so each
// test case works on GM addresses of its own (cold lines).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

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
                                               "memory.l2.keep_across_launches=true"}),
                     SimOptions{});
  return s;
}
const ChipConfig& cfg() { return sim().config(); }

// 7040 bytes = 220 blocks of 32 B (a multiple of the 32 B/cycle GM port and of the 110 B/cycle
// L2 read port), 14 lines of 512 B when 512-aligned.
constexpr uint64_t kBytes = 7040;
constexpr uint64_t kLines = 14;
// A read that misses fills whole lines from HBM: the last line's 128 bytes past kBytes too (into
// the L2 only: the core's port moves kBytes, so the timing is kBytes at the port's rate).
constexpr uint64_t kFill = kLines * 512 - kBytes;

// One GM read of kBytes, alone: from HBM (miss) or from L2 (hit), to landing.
double gm_read(bool hit) {
  const double lat = cfg().path_latency(Buf::GM, Buf::UB);
  if (hit)
    return lat + cfg().l2_latency_cycles +
           kBytes / std::min(cfg().l2_read_bytes_per_cycle, cfg().l2_bytes_per_cycle());
  return lat + cfg().hbm_latency_cycles +
         kBytes / std::min(cfg().path_rate(Buf::GM, Buf::UB), cfg().hbm_bytes_per_cycle());
}

KernelResult run(const std::string& body, uint64_t addr) {
  KernelResult r = npusim::test::run_aiv_body(sim(), body, addr);
  INFO(r.error);
  REQUIRE(r.ok);
  return r;
}

}  // namespace

TEST_CASE("config assumptions of these tests") {
  CHECK(cfg().l2_keep_across_launches);
  CHECK(cfg().l2_line_bytes == 512);
  CHECK(cfg().path_rate(Buf::GM, Buf::UB) == 32);
  CHECK(cfg().hbm_bytes_per_cycle() == Approx(48));
  CHECK(cfg().l2_read_bytes_per_cycle == 110);
}

TEST_CASE("a noalloc write leaves its lines absent; a normal write allocates them") {
  const std::string read_back =
      "    set_flag mte3, mte2, 0\n    wait_flag mte3, mte2, 0\n"
      "    copy_gm2ub x3, x1, 1, 220, 0, 0\n";
  KernelResult s = run("    copy_ub2gm.noalloc x1, x2, 1, 220, 0, 0\n" + read_back, 0x1000000);
  CHECK(counter(s.counters, "chip.l2.noalloc_misses") == kLines);
  CHECK(counter(s.counters, "chip.l2.misses") == 2 * kLines);  // the read back misses too
  CHECK(counter(s.counters, "chip.l2.hits") == 0);
  CHECK(counter(s.counters, "chip.hbm.write_bytes") == kBytes);
  CHECK(counter(s.counters, "chip.hbm.read_bytes") == kBytes + kFill);

  KernelResult n = run("    copy_ub2gm x1, x2, 1, 220, 0, 0\n" + read_back, 0x1100000);
  CHECK(counter(n.counters, "chip.l2.noalloc_misses") == 0);
  CHECK(counter(n.counters, "chip.l2.misses") == kLines);
  CHECK(counter(n.counters, "chip.l2.hits") == kLines);
  CHECK(counter(n.counters, "chip.l2.read_bytes") == kBytes);
  CHECK(counter(n.counters, "chip.hbm.read_bytes") == 0);
  // The read back costs a hit's time instead of a miss's: the two launches differ by that.
  CHECK(s.cycles - n.cycles == ceil_cycles(gm_read(false)) - ceil_cycles(gm_read(true)));
}

TEST_CASE("a noalloc read hits lines that are present") {
  KernelResult r =
      run("    copy_gm2ub x2, x1, 1, 220, 0, 0\n"
          "    copy_gm2ub.noalloc x3, x1, 1, 220, 0, 0\n",
          0x1200000);
  CHECK(counter(r.counters, "chip.l2.noalloc_hits") == kLines);
  CHECK(counter(r.counters, "chip.l2.hits") == kLines);
  CHECK(counter(r.counters, "chip.l2.misses") == kLines);
}

TEST_CASE("bypass reads HBM even when the lines are present; a bypass write drops them") {
  // MTE2 runs both copies in order, each occupying it for its bandwidth phase: the first misses
  // (7040 / 32 = 220 cycles at the core's port, its lines' 128 more bytes of fill into the L2
  // alongside; then lands 32 + 500 later), the second bypasses L2 and moves at the GM port like
  // a miss: 220 more, landing 32 + 500 after that. 3 scalar instructions come before them.
  KernelResult r =
      run("    copy_gm2ub x2, x1, 1, 220, 0, 0\n"
          "    copy_gm2ub.bypass x3, x1, 1, 220, 0, 0\n",
          0x1300000);
  const double bw =
      kBytes / std::min(cfg().path_rate(Buf::GM, Buf::UB), cfg().hbm_bytes_per_cycle());
  const double lands = 3 + 2 * bw + cfg().path_latency(Buf::GM, Buf::UB) + cfg().hbm_latency_cycles;
  CHECK(r.cycles == task_overhead(cfg()) + ceil_cycles(lands));
  CHECK(r.cycles - task_overhead(cfg()) == 975);
  CHECK(counter(r.counters, "chip.l2.bypass_lines") == kLines);
  CHECK(counter(r.counters, "chip.l2.misses") == kLines);
  CHECK(counter(r.counters, "chip.l2.hits") == 0);
  CHECK(counter(r.counters, "chip.hbm.read_bytes") == 2 * kBytes + kFill);

  KernelResult w =
      run("    copy_gm2ub x2, x1, 1, 220, 0, 0\n"
          "    set_flag mte2, mte3, 0\n    wait_flag mte2, mte3, 0\n"
          "    copy_ub2gm.bypass x1, x2, 1, 220, 0, 0\n"
          "    set_flag mte3, mte2, 0\n    wait_flag mte3, mte2, 0\n"
          "    copy_gm2ub x3, x1, 1, 220, 0, 0\n",
          0x1400000);
  CHECK(counter(w.counters, "chip.l2.misses") == 2 * kLines);  // the read after the write too
  CHECK(counter(w.counters, "chip.l2.hits") == 0);
  CHECK(counter(w.counters, "chip.l2.bypass_lines") == kLines);
  CHECK(counter(w.counters, "chip.hbm.write_bytes") == kBytes);
}

TEST_CASE("kept across launches: a launch reading the previous one's output hits in L2") {
  constexpr uint64_t kOut = 0x1500000;
  run("    copy_ub2gm x1, x2, 1, 220, 0, 0\n", kOut);  // producer: writes allocate
  const std::string consumer = "    copy_gm2ub x2, x1, 1, 220, 0, 0\n";
  // 3 scalar instructions, then one read that hits every line.
  KernelResult hit = run(consumer, kOut);
  CHECK(counter(hit.counters, "chip.l2.hits") == kLines);
  CHECK(counter(hit.counters, "chip.l2.misses") == 0);
  CHECK(hit.cycles == task_overhead(cfg()) + ceil_cycles(3 + gm_read(true)));
  CHECK(hit.cycles - task_overhead(cfg()) == 299);

  // The same launch again (replayed: its recording holds for the L2 it starts with).
  KernelResult again = run(consumer, kOut);
  const char* replay = std::getenv("NPUSIM_REPLAY");  // on by default; check replays too
  if (!replay || std::strcmp(replay, "off") != 0) CHECK(again.replayed);
  CHECK(again.cycles == hit.cycles);
  CHECK(counter(again.counters, "chip.l2.hits") == kLines);

  // A host copy over the output drops its lines: the consumer misses now, and a recording made
  // with the lines present does not time it.
  std::vector<uint8_t> host(kBytes, 7);
  sim().copy_host_to_device(kOut, host.data(), host.size());
  KernelResult miss = run(consumer, kOut);
  CHECK_FALSE(miss.replayed);
  CHECK(counter(miss.counters, "chip.l2.misses") == kLines);
  CHECK(counter(miss.counters, "chip.l2.hits") == 0);
  CHECK(miss.cycles == task_overhead(cfg()) + ceil_cycles(3 + gm_read(false)));
  CHECK(miss.cycles - task_overhead(cfg()) == 755);
}

TEST_CASE("a read missing part of a line fills the whole line from HBM; its other bytes hit") {
  // kLines bursts of one 32-byte block, one per L2 line (a gap of a line less a block), then
  // the block after each: the first read misses every line and reads each whole line from HBM
  // (the fill), the second hits every line and reads nothing from HBM.
  const uint64_t block = 32, line = cfg().l2_line_bytes, gap = line / block - 1;
  const std::string strided =
      "    copy_gm2ub x2, x1, " + std::to_string(kLines) + ", 1, " + std::to_string(gap) + ", 0\n";
  KernelResult r = run(strided +
                           "    add x1, x1, 32\n"
                           "    copy_gm2ub x3, x1, " +
                           std::to_string(kLines) + ", 1, " + std::to_string(gap) + ", 0\n",
                       0x1600000);
  CHECK(counter(r.counters, "chip.l2.misses") == kLines);
  CHECK(counter(r.counters, "chip.l2.hits") == kLines);
  CHECK(counter(r.counters, "chip.hbm.read_bytes") == kLines * line);
  CHECK(counter(r.counters, "chip.l2.read_bytes") == kLines * block);
  // Alone, the first read moves the whole lines over HBM; only its blocks pass the core's port
  // (the fill goes into the L2), so the port's cap on the flow is scaled by line / block.
  KernelResult one = run(strided, 0x1700000);
  const double flow =
      static_cast<double>(kLines * line) /
      std::min(cfg().path_rate(Buf::GM, Buf::UB) * line / block, cfg().hbm_bytes_per_cycle());
  CHECK(one.cycles == task_overhead(cfg()) + ceil_cycles(3 + cfg().path_latency(Buf::GM, Buf::UB) +
                                                         cfg().hbm_latency_cycles + flow));
  CHECK(counter(one.counters, "chip.hbm.read_bytes") == kLines * line);
}
