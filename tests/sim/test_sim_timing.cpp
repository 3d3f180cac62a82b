// Cycle-exact timing of single instructions and small sequences, each expectation derived from
// the chip config (tiny preset at a 1000 MHz clock so GB/s = bytes/cycle, with HBM slowed to
// 48 B/cycle so that two cores saturate it; a launch's cycles are the task overheads,
// sim_test_util.h task_overhead(), plus its cores' busy time): GM copies alone, from L2, two
// cores sharing HBM, double buffering, issue-queue stalls, HDC copies and time across launches.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include <fmt/format.h>

#include "common/error.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using isa::Buf;
using npusim::test::counter;
using npusim::test::launch;
using npusim::test::task_overhead;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny", {"clock_mhz=1000", "memory.hbm.gbps=48"}),
                     SimOptions{});
  return s;
}
const ChipConfig& cfg() { return sim().config(); }

constexpr uint64_t kSrc = 0x200000;
constexpr uint64_t kCycle = 1;  // scalar_cycles_per_insn of the preset, checked below

uint64_t ceil_u(double v) { return static_cast<uint64_t>(std::ceil(v - 1e-9)); }

}  // namespace

TEST_CASE("config assumptions of these tests") {
  CHECK(cfg().clock_mhz == 1000);
  CHECK(cfg().scalar_cycles_per_insn == kCycle);
  CHECK(cfg().hbm_bytes_per_cycle() == Approx(48));
  // One core alone is limited by its GM port (32 B/cycle); two share HBM (24 B/cycle each).
  CHECK(cfg().path_rate(Buf::GM, Buf::UB) == 32);
  CHECK(cfg().l2_read_bytes_per_cycle == 110);
}

TEST_CASE("one copy_gm2ub alone: path latency + HBM latency + bytes / port rate") {
  isa::Program p = isa::assemble(R"(
.arg src
.section aiv
    ldarg x1, src
    movi x2, 0
    copy_gm2ub x2, x1, 1, 256, 0, 0     ; 256 blocks = 8192 bytes
    end
)", "copy1.s");
  KernelResult r = launch(sim(), p, {kSrc}, 1);
  REQUIRE(r.ok);
  const double bytes = 8192;
  // Issued after 2 scalar instructions; cold L2, so every line misses and HBM serves at
  // min(port 32, HBM 48) = 32 B/cycle: 2 + 32 + 500 + 8192 / 32 = 790.
  const double copy = cfg().path_latency(Buf::GM, Buf::UB) + cfg().hbm_latency_cycles +
                      bytes / std::min(cfg().path_rate(Buf::GM, Buf::UB),
                                       cfg().hbm_bytes_per_cycle());
  CHECK(r.cycles == task_overhead(cfg()) + ceil_u(2 * kCycle + copy));
  CHECK(r.cycles - task_overhead(cfg()) == 790);
  CHECK(counter(r.counters, "chip.task_overhead_cycles") == task_overhead(cfg()));
  // The pipe is occupied by the bandwidth phase only; the latencies overlap what follows.
  CHECK(counter(r.counters, "chip.aiv0.mte2.busy_cycles") == 8192 / 32);
  // In flight from its start until the data has landed: the whole copy (msprof's MTE2 time).
  CHECK(counter(r.counters, "chip.aiv0.mte2.inflight_cycles") == ceil_u(copy));
  CHECK(counter(r.counters, "chip.aiv0.mte2.stall.mem_contention") == 0);
  CHECK(counter(r.counters, "chip.aiv0.mte2.bytes.gm_to_ub") == 8192);
  CHECK(counter(r.counters, "chip.l2.misses") == 8192 / cfg().l2_line_bytes);
  CHECK(counter(r.counters, "chip.l2.hits") == 0);
  CHECK(counter(r.counters, "chip.hbm.read_bytes") == 8192);
  CHECK(counter(r.counters, "chip.hbm.busy_cycles") == 8192 / 32);
  CHECK(counter(r.counters, "chip.aiv0.mte2.insn.copy_gm2ub") == 1);
}

TEST_CASE("a second copy of the same lines hits L2: L2 latency and the core's L2 read port") {
  // 7040 bytes = 220 blocks (a multiple of both 32 and 110 B/cycle), 14 lines of 512 B: the
  // first copy misses and fills the 14 whole lines from HBM (7168 bytes; the last line's 128
  // bytes past the copy go into the L2 only, not through the core's port), the second hits.
  isa::Program p = isa::assemble(R"(
.arg src
.section aiv
    ldarg x1, src
    movi x2, 0
    copy_gm2ub x2, x1, 1, 220, 0, 0
    copy_gm2ub x2, x1, 1, 220, 0, 0
    end
)", "copy2.s");
  KernelResult r = launch(sim(), p, {kSrc}, 1);
  REQUIRE(r.ok);
  const double bytes = 7040, lat = cfg().path_latency(Buf::GM, Buf::UB);
  // MTE2 runs them in order, each occupying the pipe for its bandwidth phase only; each lands
  // its fixed latency later. First: bandwidth 7040/32 = 220 (cycles 2..222), lands after
  // 32 + 500 more: 754. Second (all hits): bandwidth 7040 / min(110, L2 5000) = 64 (222..286),
  // lands after 32 + 200 more: 518. The block ends when both have landed: 754.
  const double first_bw = bytes / 32;
  const double second_bw = bytes / std::min(cfg().l2_read_bytes_per_cycle, cfg().l2_bytes_per_cycle());
  const double first = 2 + first_bw + lat + cfg().hbm_latency_cycles;
  const double second = 2 + first_bw + second_bw + lat + cfg().l2_latency_cycles;
  CHECK(r.cycles == task_overhead(cfg()) + ceil_u(std::max(first, second)));
  CHECK(r.cycles - task_overhead(cfg()) == 754);
  CHECK(counter(r.counters, "chip.l2.misses") == 14);
  CHECK(counter(r.counters, "chip.l2.hits") == 14);
  CHECK(counter(r.counters, "chip.l2.read_bytes") == 7040);
  CHECK(counter(r.counters, "chip.hbm.read_bytes") == 14 * 512);
}

TEST_CASE("L2 starts cold at every launch: the same launch twice takes the same time") {
  isa::Program p = isa::assemble(R"(
.arg src
.section aiv
    ldarg x1, src
    movi x2, 0
    copy_gm2ub x2, x1, 1, 256, 0, 0
    end
)", "cold.s");
  KernelResult a = launch(sim(), p, {kSrc}, 1);
  KernelResult b = launch(sim(), p, {kSrc}, 1);
  REQUIRE(a.ok);
  REQUIRE(b.ok);
  CHECK(a.cycles == b.cycles);
  CHECK(counter(b.counters, "chip.l2.hits") == 0);
  // Simulated time moves on between launches.
  CHECK(b.start_cycle >= a.start_cycle + a.cycles);
}

TEST_CASE("two cores copying at once share HBM bandwidth, rates recomputed when one ends") {
  // Block b copies (b + 1) * 6144 bytes. Both start after 7 scalar instructions and the
  // 32 + 500 cycle latency; then each gets min(32, 48 / 2) = 24 B/cycle. Block 0 ends after
  // 6144 / 24 = 256 cycles; block 1 has 6144 bytes left and alone gets min(32, 48) = 32 B/cycle:
  // 192 more. Block 0 ends at 7 + 532 + 256 = 795, block 1 at 795 + 192 = 987.
  isa::Program p = isa::assemble(R"(
.arg src
.section aiv
    ldarg x1, src
    get_block_id x3
    add x4, x3, 1
    mul x4, x4, 192         ; blocks of 32 B: 6144 or 12288 bytes
    mul x5, x3, 0x100000
    add x1, x1, x5          ; different GM ranges
    movi x2, 0
    copy_gm2ub x2, x1, 1, x4, 0, 0
    end
)", "share.s");
  KernelResult r = launch(sim(), p, {kSrc}, 2);
  REQUIRE(r.ok);
  const double lat = cfg().path_latency(Buf::GM, Buf::UB) + cfg().hbm_latency_cycles;
  const double shared = cfg().hbm_bytes_per_cycle() / 2, port = 32;
  const double t0 = 7 + lat + 6144 / shared;  // 7 scalar instructions before the copy
  const double t1 = t0 + (12288 - 6144) / std::min(port, cfg().hbm_bytes_per_cycle());
  CHECK(r.cycles == task_overhead(cfg()) + ceil_u(t1));
  CHECK(r.cycles - task_overhead(cfg()) == 987);
  CHECK(counter(r.counters, "chip.aiv0.active_cycles") == ceil_u(t0));
  // Contention: block 0 took 256 cycles for 6144 bytes it could move in 192 alone;
  // block 1 took 448 for 12288 it could move in 384.
  CHECK(counter(r.counters, "chip.aiv0.mte2.stall.mem_contention") == 64);
  CHECK(counter(r.counters, "chip.aiv1.mte2.stall.mem_contention") == 64);
  CHECK(counter(r.counters, "chip.hbm.busy_cycles") == 256 + 192);
}

namespace {
// Two 8 KiB tiles: MTE2 loads tile i into UB, V scales it into an output area. `serial` makes
// MTE2 wait until V has finished tile 0 before loading tile 1; otherwise (double buffering)
// MTE2 loads tile 1 while V works on tile 0. UB operands are placed in distinct banks (source
// tiles at bank offsets 0 and 16, destinations at 32 and 0 of 48) so V has no bank conflicts.
std::string two_tiles(bool serial) {
  return fmt::format(R"(
.arg src
.section aiv
    ldarg x1, src
    add x4, x1, 8192
    movi x2, 0              ; tile 0 in UB
    movi x3, 8192           ; tile 1 in UB
    movi x7, 16384          ; tile 0 result
    movi x8, 24576          ; tile 1 result
    movi x6, f32(2.0)
    copy_gm2ub x2, x1, 1, 256, 0, 0
    set_flag mte2, v, 0
{}
    copy_gm2ub x3, x4, 1, 256, 0, 0
    set_flag mte2, v, 1
    wait_flag mte2, v, 0
    vmuls.f16 x7, x2, x6, 32, 1, 1, 8, 8
{}
    wait_flag mte2, v, 1
    vmuls.f16 x8, x3, x6, 32, 1, 1, 8, 8
    end
)", serial ? "    wait_flag v, mte2, 0" : "", serial ? "    set_flag v, mte2, 0" : "");
}
}  // namespace

TEST_CASE("double buffering overlaps MTE2 with V: total < sum of the stages") {
  isa::Program db = isa::assemble(two_tiles(false), "db.s");
  isa::Program serial = isa::assemble(two_tiles(true), "serial.s");
  KernelResult rd = launch(sim(), db, {kSrc}, 1);
  KernelResult rs = launch(sim(), serial, {kSrc}, 1);
  REQUIRE(rd.ok);
  REQUIRE(rs.ok);
  // copy = 32 + 500 + 8192/32 = 788; vmuls of 32 repeats = latency 12 + 32 * 1 = 44.
  const double copy = cfg().path_latency(Buf::GM, Buf::UB) + cfg().hbm_latency_cycles + 8192.0 / 32;
  const double vec = cfg().vector_latency_cycles + 32.0 * 256 / cfg().vector_bytes_per_cycle;
  const double issue = 7;  // scalar instructions before the first copy
  // Double buffered: copies back to back, V on tile 1 after the second copy: 7 + 2*788 + 44.
  CHECK(rd.cycles == task_overhead(cfg()) + ceil_u(issue + 2 * copy + vec));
  CHECK(rd.cycles - task_overhead(cfg()) == 1627);
  // Serial: 7 + 788 + 44 + 788 + 44 = the sum of the stages.
  CHECK(rs.cycles == task_overhead(cfg()) + ceil_u(issue + 2 * copy + 2 * vec));
  CHECK(rd.cycles < rs.cycles);
  CHECK(counter(rd.counters, "chip.aiv0.v.stall.bank_conflict") == 0);
  CHECK(counter(rd.counters, "chip.aiv0.v.busy_cycles") == ceil_u(2 * vec));
  // The two copies, one after the other, each in flight until its data landed; V's in-flight
  // time is its busy time (no GM).
  CHECK(counter(rd.counters, "chip.aiv0.mte2.inflight_cycles") == ceil_u(2 * copy));
  CHECK(counter(rd.counters, "chip.aiv0.v.inflight_cycles") ==
        counter(rd.counters, "chip.aiv0.v.busy_cycles"));
  CHECK(counter(rd.counters, "chip.aiv0.v.repeats") == 64);
  // V waited for tile 0 and, after finishing it, for tile 1.
  CHECK(counter(rd.counters, "chip.aiv0.v.stall.flag_wait") > 0);
}

TEST_CASE("a full issue queue stalls the scalar unit") {
  // 40 vadds of one repeat (latency 12 + 1 = 13 cycles each) issued back to back after two
  // movi. V starts instruction k at 2 + 13k. The queue holds issue_queue_depth = 32 waiting
  // instructions (the one V executes is out of the queue), so instruction i (0-based, issued at
  // 2 + i when there is room) needs V to have started i - 32, at 2 + 13 * (i - 32): i = 35
  // waits 4 cycles (2 + 35 -> 2 + 39), i = 36..39 wait 12 each (2 + 13 * (i - 32) after the
  // previous at 2 + 13 * (i - 33) + 1): 52 stall cycles. V ends at 2 + 13 * 40 = 522.
  REQUIRE(cfg().issue_queue_depth == 32);
  std::string text = ".section aiv\n    movi x1, 0\n    movi x2, 512\n";
  for (int i = 0; i < 40; ++i) text += "    vadds.f16 x2, x1, x3, 1, 1, 1, 8, 8\n";
  text += "    end\n";
  isa::Program p = isa::assemble(text, "queue.s");
  KernelResult r = launch(sim(), p, {}, 1);
  REQUIRE(r.ok);
  const uint64_t vec = static_cast<uint64_t>(cfg().vector_latency_cycles) + 1;
  CHECK(vec == 13);
  CHECK(r.cycles == task_overhead(cfg()) + 2 + 40 * vec);
  CHECK(counter(r.counters, "chip.aiv0.s.stall.queue_full") == 52);
  CHECK(counter(r.counters, "chip.aiv0.v.busy_cycles") == 40 * vec);
  CHECK(counter(r.counters, "chip.aiv0.v.insn.vadds") == 40);
  CHECK(counter(r.counters, "chip.aiv0.s.issued") == 40);
}

TEST_CASE("HDC copies: latency + bytes / link rate, one after another per direction") {
  std::vector<uint8_t> host(64000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<uint8_t>(i * 7);
  const uint64_t before = sim().now_cycles();
  HdcResult a = sim().copy_host_to_device(0x300000, host.data(), host.size());
  HdcResult b = sim().copy_host_to_device(0x400000, host.data(), host.size());
  // 5 us * 1000 MHz + 64000 B / 64 B/cycle (64 GB/s at 1000 MHz) = 5000 + 1000 = 6000.
  const double expect =
      cfg().hdc_latency_us * cfg().clock_mhz + 64000 / cfg().hdc_bytes_per_cycle();
  CHECK(a.cycles == ceil_u(expect));
  CHECK(a.cycles == 6000);
  CHECK(a.time_us == Approx(6.0));
  CHECK(a.start_cycle == before);
  CHECK(b.start_cycle == a.start_cycle + a.cycles);
  std::vector<uint8_t> back(host.size());
  HdcResult c = sim().copy_device_to_host(back.data(), 0x400000, back.size());
  CHECK(back == host);
  CHECK(c.cycles == 6000);
  nlohmann::json all = sim().counters();
  CHECK(counter(all, "chip.hdc.h2d_bytes") == 128000);
  CHECK(counter(all, "chip.hdc.d2h_bytes") == 64000);
  CHECK(counter(all, "chip.hdc.h2d_busy_cycles") == 12000);
  CHECK(counter(all, "chip.hdc.h2d_copies") == 2);
  CHECK_THROWS_AS(sim().copy_host_to_device(cfg().hbm_bytes - 10, host.data(), 64), Error);
}
