// Launches that take their cores when ready (ConcurrentLaunch::take_cores_when_ready) on the
// tiny split chip (2 cube cores, 4 vector cores): each begins when it is ready and a core (mix:
// a group) is free, and its blocks run on cores as they free (waves). Launches that each need
// every vector core run one after another in index order, each in its time alone, the next
// beginning when the one before's blocks end (not waiting for its completion overhead); a
// chain of them runs beside an independent cube launch; a launch needing more cores than are
// free begins on those and takes others as they free, its cycles derived from its blocks' own;
// a mix launch takes whole groups; launches with fixed cores keep theirs (and may be ordered
// with the others); a failed launch keeps its cores and a launch that needs them does not run;
// the same group twice gives the same cycles and counters; a launch with no core it may ever
// take is refused.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "common/numeric.h"
#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::concurrent_launch;
using npusim::test::counter;
using npusim::test::gemm;
using npusim::test::kernel_launch;
using npusim::test::read_gm;
using npusim::test::vadd;
using npusim::test::write_gm;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny"), SimOptions{});
  return s;
}

const isa::Program& nop() {
  static const isa::Program p = isa::assemble(".section aiv\n    nop\n    end\n", "nop.s");
  return p;
}
// A mix kernel: each block on a cube core and its two vector cores.
const isa::Program& mix_nop() {
  static const isa::Program p = isa::assemble(
      ".section aic\n    nop\n    end\n.section aiv\n    nop\n    end\n", "mix_nop.s");
  return p;
}
// A vector kernel whose every block spins `n` iterations of the scalar unit: no memory, so a
// block takes the same cycles on any core, beside any launch.
isa::Program spin(int n) {
  return isa::assemble(fmt::format(".kernel spin_{0}\n.section aiv\n    movi x4, 0\nloop:\n"
                                   "    add x4, x4, 1\n    blt x4, {0}, loop\n    end\n",
                                   n),
                       fmt::format("spin_{}.s", n));
}
// Cycles of one block of `p` (a lone launch of one block less its task overheads).
uint64_t block_cycles(const isa::Program& p);
// The task's completion overhead (cycles): a launch ends this long after its last block.
uint64_t done_cycles() { return test::us_cycles(sim().config(), sim().config().task_done_us); }

// A launch of `prog` that takes its cores when ready, waiting for the launches `after`.
ConcurrentLaunch when_ready(const isa::Program& prog, std::vector<uint64_t> args, int block_dim,
                            std::vector<size_t> after = {}) {
  ConcurrentLaunch c = concurrent_launch(prog, std::move(args), block_dim, {}, std::move(after));
  c.take_cores_when_ready = true;
  return c;
}

// vadd operands of kN fp16 each (small integers: every sum is exact in fp16), each launch's
// own (so that no launch finds another's lines in the shared L2): launch k adds kIn[k] to
// itself into kOut[k]; kLong: kN x 8 elements.
constexpr uint64_t kN = 32768, kLongN = 8 * kN;
constexpr uint64_t kIn[3] = {0x1000000, 0x1400000, 0x1800000};
constexpr uint64_t kOut[3] = {0x2000000, 0x2400000, 0x2800000};
constexpr uint64_t kLongIn = 0x3000000, kLongOut = 0x3800000;
// GEMM operands (M x K times K x N fp16) and its outputs: [0] in a group, [1] alone.
constexpr uint64_t M = 128, N = 256, K = 512;
constexpr uint64_t kA = 0x4000000, kB = 0x4100000, kC[2] = {0x4200000, 0x4300000};

std::vector<uint16_t> ramp(uint64_t n, int mod, float scale) {
  std::vector<uint16_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = f32_to_f16(static_cast<float>(i % mod) * scale);
  return v;
}

// x + x for x = ramp(n, mod, scale), rounded to fp16 (exact for these values).
std::vector<uint16_t> doubled(uint64_t n, int mod, float scale) {
  std::vector<uint16_t> v = ramp(n, mod, scale);
  for (uint16_t& e : v) e = f32_to_f16(2 * f16_to_f32(e));
  return v;
}

void write_operands() {
  for (int k = 0; k < 3; ++k) {
    write_gm(sim(), kIn[k], ramp(kN, 31 + 2 * k, 1.0f + k));
    write_gm(sim(), kOut[k], std::vector<uint16_t>(kN, 0));
  }
  write_gm(sim(), kLongIn, ramp(kLongN, 53, 3.0f));
  write_gm(sim(), kA, ramp(M * K, 13, 0.125f));
  write_gm(sim(), kB, ramp(K * N, 7, 0.25f));
}

std::vector<uint64_t> vadd_args(int k) { return {kIn[k], kIn[k], kOut[k], kN}; }

uint64_t block_cycles(const isa::Program& p) {
  const KernelResult r = sim().run(kernel_launch(p, {}, 1));
  REQUIRE(r.ok);
  return r.cycles - test::task_overhead(sim().config(), 1);
}

// The message of the Error run_concurrent throws for `group` ("" if it runs).
std::string refusal(const std::vector<ConcurrentLaunch>& group) {
  try {
    sim().run_concurrent(group);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE(
    "three independent launches each needing every vector core: in index order, each its "
    "time alone, each beginning when the blocks of the one before end") {
  write_operands();
  // Alone: each begins on a chip with nothing of the others' in the L2, as in the group (their
  // data are disjoint and the tiny chip's L2 holds all of it).
  std::vector<KernelResult> alone;
  for (int k = 0; k < 3; ++k) alone.push_back(sim().run(kernel_launch(vadd(), vadd_args(k), 4)));
  for (const KernelResult& r : alone) REQUIRE(r.ok);
  write_operands();
  std::vector<ConcurrentResult> runs;
  for (int run = 0; run < 2; ++run)
    runs.push_back(sim().run_concurrent({when_ready(vadd(), vadd_args(0), 4),
                                         when_ready(vadd(), vadd_args(1), 4),
                                         when_ready(vadd(), vadd_args(2), 4)}));
  const ConcurrentResult& g = runs[0];
  uint64_t begin = g.start_cycle;
  for (int k = 0; k < 3; ++k) {
    const KernelResult& r = g.launches[static_cast<size_t>(k)];
    INFO("launch " << k << ": " << r.start_cycle << "+" << r.cycles << ", alone "
                   << alone[static_cast<size_t>(k)].cycles);
    REQUIRE(r.ok);
    CHECK(r.start_cycle == begin);
    CHECK(r.cycles == alone[static_cast<size_t>(k)].cycles);
    // Its counters are its own blocks' on the cores it took, as alone.
    for (int c = 0; c < 4; ++c) {
      const std::string core = "aiv" + std::to_string(c);
      CHECK(r.counters["chip"][core] ==
            alone[static_cast<size_t>(k)].counter_delta.tree()["chip"][core]);
    }
    CHECK(read_gm<uint16_t>(sim(), kOut[k], kN) == doubled(kN, 31 + 2 * k, 1.0f + k));
    // Its cores free when its blocks end; the next launch takes them then, while this one's
    // completion is reported.
    begin += r.cycles - done_cycles();
  }
  CHECK(g.cycles == begin + done_cycles() - g.start_cycle);
  CHECK(counter(g.counters.tree(), "chip.aiv0.blocks") == 3);
  // The same group again: the same timing.
  for (size_t k = 0; k < 3; ++k) {
    REQUIRE(runs[1].launches[k].ok);
    CHECK(runs[1].launches[k].start_cycle - runs[1].start_cycle ==
          g.launches[k].start_cycle - g.start_cycle);
    CHECK(runs[1].launches[k].cycles == g.launches[k].cycles);
  }
  CHECK(runs[1].cycles == g.cycles);
}

TEST_CASE("a chain of launches needing every vector core beside an independent cube launch") {
  write_operands();
  // out0 = in0 + in0; out1 = out0 + out0 (after 0); out2 = out1 + out1 (after 1); the GEMM on
  // the cube cores beside them.
  ConcurrentResult g =
      sim().run_concurrent({when_ready(vadd(), vadd_args(0), 4),
                            when_ready(vadd(), {kOut[0], kOut[0], kOut[1], kN}, 4, {0}),
                            when_ready(vadd(), {kOut[1], kOut[1], kOut[2], kN}, 4, {1}),
                            when_ready(gemm(), {kA, kB, kC[0], M, N, K}, 2)});
  for (const KernelResult& r : g.launches) REQUIRE(r.ok);
  const KernelResult& mm = g.launches[3];
  INFO("gemm " << mm.start_cycle << "+" << mm.cycles);
  CHECK(g.launches[0].start_cycle == g.start_cycle);
  CHECK(mm.start_cycle == g.start_cycle);  // the cube cores are free: it does not wait
  // Each link begins at the end of the one before. Beside the GEMM's transfers that end falls
  // between clock edges: start_cycle rounds down, cycles up.
  for (size_t k = 1; k < 3; ++k) {
    INFO("launch " << k);
    const uint64_t end = g.launches[k - 1].start_cycle + g.launches[k - 1].cycles;
    CHECK(g.launches[k].start_cycle <= end);
    CHECK(g.launches[k].start_cycle + 1 >= end);
  }
  CHECK(mm.start_cycle < g.launches[0].start_cycle + g.launches[0].cycles);  // it overlaps
  const nlohmann::json& cm = mm.counters;
  CHECK(counter(cm, "chip.aic0.m.macs") == M * N * K);
  CHECK(!cm["chip"].contains("aiv0"));
  const uint64_t last = g.launches[2].start_cycle + g.launches[2].cycles;
  CHECK(g.start_cycle + g.cycles == std::max(last, mm.start_cycle + mm.cycles));
  // The data: each link read what the one before wrote; the GEMM's bytes are its bytes alone.
  std::vector<uint16_t> want = ramp(kN, 31, 1.0f);
  for (int k = 0; k < 3; ++k) {
    for (uint16_t& e : want) e = f32_to_f16(2 * f16_to_f32(e));
    CHECK(read_gm<uint16_t>(sim(), kOut[k], kN) == want);
  }
  REQUIRE(sim().run(kernel_launch(gemm(), {kA, kB, kC[1], M, N, K}, 2)).ok);
  CHECK(read_gm<uint16_t>(sim(), kC[0], M * N) == read_gm<uint16_t>(sim(), kC[1], M * N));
}

TEST_CASE("a launch needing more cores than are free begins on those, its blocks in waves") {
  const uint64_t d = test::us_cycles(sim().config(), sim().config().task_dispatch_us);
  const uint64_t bs = static_cast<uint64_t>(sim().config().task_block_start_cycles);
  const uint64_t D = done_cycles();
  // 0 takes aiv0, aiv1 for a long spin; 1 (6 short blocks) begins at once on aiv2, aiv3, the
  // free ones, and runs its blocks three to a core: its duration is the lone launch's of one
  // worker running three blocks.
  const isa::Program long_spin = spin(3000), short_spin = spin(100);
  const uint64_t a = block_cycles(long_spin), c = block_cycles(short_spin);
  ConcurrentResult g =
      sim().run_concurrent({when_ready(long_spin, {}, 2), when_ready(short_spin, {}, 6)});
  for (const KernelResult& r : g.launches) REQUIRE(r.ok);
  const KernelResult &l0 = g.launches[0], &l1 = g.launches[1];
  INFO("0: " << l0.start_cycle << "+" << l0.cycles << ", 1: " << l1.start_cycle << "+" << l1.cycles
             << "; blocks " << a << ", " << c);
  REQUIRE(d + 3 * (bs + c) < d + bs + a);  // its three waves end before launch 0's block
  CHECK(l0.start_cycle == g.start_cycle);
  CHECK(l0.cycles == d + bs + a + D);
  CHECK(l1.start_cycle == g.start_cycle);
  CHECK(l1.cycles == d + 3 * (bs + c) + D);
  for (const char* core : {"aiv2", "aiv3"})
    CHECK(counter(l1.counters, std::string("chip.") + core + ".blocks") == 3);
  CHECK(!l1.counters["chip"].contains("aiv0"));
  CHECK(!l1.counters["chip"].contains("aiv1"));

  // Cores joining a running launch. 0 (2 blocks of x) on aiv0, aiv1; 1 (2 blocks of y, longer)
  // on aiv2, aiv3; 2 (6 blocks of z) waits for a free core: at e0 = d + bs + x, the end of 0's
  // blocks, it begins on aiv0, aiv1 (blocks 0, 1, starting after dispatch and block start); at
  // e1 = d + bs + y, during that first wave, it takes aiv2, aiv3 for blocks 2, 3 (block start
  // only); blocks 4, 5 go to aiv0, aiv1 again, the first to free, and aiv2, aiv3 go back.
  const isa::Program px = spin(200), py = spin(1600), pz = spin(1500);
  const uint64_t x = block_cycles(px), y = block_cycles(py), z = block_cycles(pz);
  const uint64_t e0 = d + bs + x, e1 = d + bs + y;
  INFO("blocks " << x << ", " << y << ", " << z);
  REQUIRE(e0 + d + bs < e1);
  REQUIRE(e1 < e0 + d + bs + z);
  ConcurrentResult j =
      sim().run_concurrent({when_ready(px, {}, 2), when_ready(py, {}, 2), when_ready(pz, {}, 6)});
  for (const KernelResult& r : j.launches) REQUIRE(r.ok);
  const KernelResult& l2 = j.launches[2];
  INFO("2: " << l2.start_cycle << "+" << l2.cycles);
  CHECK(j.launches[0].cycles == e0 + D);
  CHECK(j.launches[1].cycles == e1 + D);
  CHECK(l2.start_cycle == j.start_cycle + e0);
  CHECK(l2.cycles == d + 2 * (bs + z) + D);  // aiv0's two blocks, the path to its end
  CHECK(j.cycles == e0 + d + 2 * (bs + z) + D);
  CHECK(counter(l2.counters, "chip.aiv0.blocks") == 2);
  CHECK(counter(l2.counters, "chip.aiv1.blocks") == 2);
  CHECK(counter(l2.counters, "chip.aiv2.blocks") == 1);
  CHECK(counter(l2.counters, "chip.aiv3.blocks") == 1);
  // Each launch's counters are its own blocks' on each core it held: aiv2 ran a block of 1,
  // then one of 2.
  CHECK(counter(j.launches[1].counters, "chip.aiv2.blocks") == 1);
  CHECK(counter(j.counters.tree(), "chip.aiv2.blocks") == 2);
  uint64_t insns = 0;
  for (const KernelResult& r : j.launches) insns += counter(r.counters, "chip.aiv2.s.issued");
  CHECK(insns == counter(j.counters.tree(), "chip.aiv2.s.issued"));

  // The same group again: the same cycles and counters, bit for bit.
  ConcurrentResult again =
      sim().run_concurrent({when_ready(px, {}, 2), when_ready(py, {}, 2), when_ready(pz, {}, 6)});
  for (size_t k = 0; k < 3; ++k) {
    REQUIRE(again.launches[k].ok);
    CHECK(again.launches[k].start_cycle - again.start_cycle ==
          j.launches[k].start_cycle - j.start_cycle);
    CHECK(again.launches[k].cycles == j.launches[k].cycles);
    CHECK(counter_digest(again.launches[k].counter_delta) ==
          counter_digest(j.launches[k].counter_delta));
  }
  CHECK(again.cycles == j.cycles);
}

TEST_CASE("a launch with named cores keeps them: the others take the rest") {
  write_operands();
  // The long add on aiv0 for the whole group; two nops of three blocks each take aiv1..aiv3
  // one after the other, each in its time alone (the task overheads and one cycle), the second
  // when the first's blocks end.
  ConcurrentResult g = sim().run_concurrent(
      {concurrent_launch(vadd(), {kLongIn, kLongIn, kLongOut, kLongN}, 1, {"aiv0"}),
       when_ready(nop(), {}, 3), when_ready(nop(), {}, 3)});
  for (const KernelResult& r : g.launches) REQUIRE(r.ok);
  const uint64_t nop_alone = test::task_overhead(sim().config()) + 1;
  CHECK(g.launches[1].start_cycle == g.start_cycle);
  CHECK(g.launches[1].cycles == nop_alone);
  CHECK(g.launches[2].start_cycle == g.start_cycle + nop_alone - done_cycles());
  CHECK(g.launches[2].cycles == nop_alone);
  for (size_t k = 1; k < 3; ++k) {
    CHECK(!g.launches[k].counters["chip"].contains("aiv0"));
    CHECK(counter(g.launches[k].counters, "chip.aiv3.blocks") == 1);
  }
  CHECK(counter(g.counters.tree(), "chip.aiv0.blocks") == 1);
  // Ordered both ways: a launch on aiv0 after one that took aiv1..aiv3, and one taking them
  // again after it; each begins at the end of the one before.
  ConcurrentResult o = sim().run_concurrent({when_ready(nop(), {}, 3),
                                             concurrent_launch(nop(), {}, 1, {"aiv0"}, {0}),
                                             when_ready(nop(), {}, 3, {1})});
  for (size_t k = 0; k < 3; ++k) {
    INFO("launch " << k);
    REQUIRE(o.launches[k].ok);
    CHECK(o.launches[k].start_cycle == o.start_cycle + k * nop_alone);
    CHECK(counter(o.launches[k].counters, k == 1 ? "chip.aiv0.blocks" : "chip.aiv3.blocks") == 1);
  }
}

TEST_CASE("a mix launch takes whole groups: a cube core with its vector cores") {
  write_operands();
  // 0 takes aiv0 for a long add, so group 0 (aic0, aiv0, aiv1) is not free; 1 takes group 1
  // (aic1, aiv2, aiv3) at once; 2 (two blocks) begins on group 1 when 1's block ends and runs
  // both blocks there, one after the other, while 0 still holds aiv0.
  ConcurrentResult g =
      sim().run_concurrent({when_ready(vadd(), {kLongIn, kLongIn, kLongOut, kLongN}, 1),
                            when_ready(mix_nop(), {}, 1), when_ready(mix_nop(), {}, 2)});
  for (const KernelResult& r : g.launches) REQUIRE(r.ok);
  const KernelResult &a = g.launches[0], &b = g.launches[1], &c = g.launches[2];
  CHECK(a.start_cycle == g.start_cycle);
  CHECK(b.start_cycle == g.start_cycle);
  CHECK(b.cycles == test::task_overhead(sim().config()) + 1);
  for (const char* core : {"aic1", "aiv2", "aiv3"})
    CHECK(counter(b.counters, std::string("chip.") + core + ".blocks") == 1);
  CHECK(!b.counters["chip"].contains("aic0"));
  CHECK(!b.counters["chip"].contains("aiv1"));
  CHECK(c.start_cycle == b.start_cycle + b.cycles - done_cycles());
  CHECK(c.cycles == test::task_overhead(sim().config(), 2) + 2);
  REQUIRE(c.start_cycle + c.cycles < a.start_cycle + a.cycles);
  for (const char* core : {"aic1", "aiv2", "aiv3"})
    CHECK(counter(c.counters, std::string("chip.") + core + ".blocks") == 2);
  CHECK(!c.counters["chip"].contains("aic0"));
  CHECK(!c.counters["chip"].contains("aiv0"));
  CHECK(read_gm<uint16_t>(sim(), kLongOut, kLongN) == doubled(kLongN, 53, 3.0f));
  // Three groups on the chip's two: in waves, as a lone launch of three blocks.
  const KernelResult lone = sim().run(kernel_launch(mix_nop(), {}, 3));
  ConcurrentResult w = sim().run_concurrent({when_ready(mix_nop(), {}, 3)});
  REQUIRE(lone.ok);
  REQUIRE(w.launches[0].ok);
  CHECK(w.launches[0].cycles == lone.cycles);
  CHECK(w.launches[0].cycles == test::task_overhead(sim().config(), 2) + 2);
  CHECK(counter(w.launches[0].counters, "chip.aic0.blocks") == 2);
  CHECK(counter(w.launches[0].counters, "chip.aic1.blocks") == 1);
}

TEST_CASE("a failed launch keeps its cores: one that needs them does not run, the others do") {
  write_operands();
  isa::Program bad =
      isa::assemble(".section aiv\n    movi x3, 0\n    div x4, x3, 0\n    end\n", "bad.s");
  // 0 faults on aiv0..aiv2 and keeps them; 1 runs its two blocks on aiv3, one after the
  // other; 2 then takes aiv3 as well.
  ConcurrentResult g = sim().run_concurrent({when_ready(bad, {}, 3), when_ready(nop(), {}, 2),
                                             when_ready(nop(), {}, 1),
                                             when_ready(gemm(), {kA, kB, kC[0], M, N, K}, 2)});
  REQUIRE_FALSE(g.launches[0].ok);
  CHECK(g.launches[0].error.find("division by zero") != std::string::npos);
  REQUIRE(g.launches[1].ok);
  CHECK(counter(g.launches[1].counters, "chip.aiv3.blocks") == 2);
  REQUIRE(g.launches[2].ok);
  CHECK(counter(g.launches[2].counters, "chip.aiv3.blocks") == 1);
  CHECK(g.launches[2].start_cycle ==
        g.launches[1].start_cycle + g.launches[1].cycles - done_cycles());
  CHECK(g.launches[3].ok);
  CHECK(counter(g.counters.tree(), "chip.launches") == 4);
  CHECK(counter(g.counters.tree(), "chip.failed_launches") == 1);
  // 0 faults on every vector core: 1 and 2 never get one.
  ConcurrentResult h = sim().run_concurrent(
      {when_ready(bad, {}, 4), when_ready(nop(), {}, 2), when_ready(nop(), {}, 1)});
  REQUIRE_FALSE(h.launches[0].ok);
  REQUIRE_FALSE(h.launches[1].ok);
  CHECK(h.launches[1].error ==
        "did not run: it takes its cores when ready and none was free (0 of the 2 workers it "
        "needs); failed launches keep theirs: 0 ('bad')");
  CHECK(h.launches[1].cycles == 0);
  REQUIRE_FALSE(h.launches[2].ok);
  CHECK(counter(h.counters.tree(), "chip.launches") == 1);
  // The chip is clean afterwards: a nop on every vector core alone takes the task overheads
  // and its one cycle.
  KernelResult r = sim().run(kernel_launch(nop(), {}, 4));
  REQUIRE(r.ok);
  CHECK(r.cycles == test::task_overhead(sim().config()) + 1);
}

TEST_CASE("refused: no core that may be taken, cores named as well") {
  auto refused = [&](const std::vector<ConcurrentLaunch>& group, const std::string& what) {
    INFO(what);
    const std::string got = refusal(group);
    INFO(got);
    CHECK(got.find(what) != std::string::npos);
  };
  // Every vector core is named by launch 0 (for the whole group): none remains.
  refused(
      {concurrent_launch(nop(), {}, 4, {"aiv0", "aiv1", "aiv2", "aiv3"}), when_ready(nop(), {}, 1)},
      "concurrent launch 1: kernel 'nop' takes its cores when ready and needs one aiv core: "
      "the chip has 4, none of them on cores no launch with fixed cores uses");
  ConcurrentLaunch both = when_ready(nop(), {}, 1);
  both.cores = {"aiv1"};
  refused({both},
          "run_concurrent: launch 0 ('nop') names 1 cores and takes its cores when ready "
          "(take_cores_when_ready): it may do only one");
  // More blocks than the chip has cores: in waves, as a lone launch.
  const KernelResult lone = sim().run(kernel_launch(nop(), {}, 5));
  ConcurrentResult w = sim().run_concurrent({when_ready(nop(), {}, 1), when_ready(nop(), {}, 5)});
  REQUIRE(lone.ok);
  REQUIRE(w.launches[1].ok);
  CHECK(w.launches[1].start_cycle == w.start_cycle);  // aiv1..aiv3 are free
  CHECK(lone.cycles == test::task_overhead(sim().config(), 2) + 2);
  CHECK(w.launches[1].cycles == lone.cycles);
  // The group is still usable after refusals.
  ConcurrentResult g = sim().run_concurrent({when_ready(nop(), {}, 4)});
  REQUIRE(g.launches[0].ok);
  CHECK(g.cycles == test::task_overhead(sim().config()) + 1);
}
