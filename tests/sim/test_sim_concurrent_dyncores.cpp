// Launches that take their cores when ready (ConcurrentLaunch::take_cores_when_ready) on the
// tiny split chip (2 cube cores, 4 vector cores): launches that each need every vector core run
// one after another in index order, each in its time alone; a chain of them runs beside an
// independent cube launch; a later launch that fits begins before an earlier one waiting for
// cores; a mix launch takes whole groups; launches with fixed cores keep theirs (and may be
// ordered with the others); a failed launch keeps its cores and a launch that needs them does
// not run; launches that can never get their cores are refused.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "common/error.h"
#include "common/numeric.h"
#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::concurrent_launch;
using npusim::test::counter;
using npusim::test::kernel_launch;
using npusim::test::read_gm;
using npusim::test::write_gm;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny"), SimOptions{});
  return s;
}

const isa::Program& vadd() {
  static const isa::Program p = isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s");
  return p;
}
const isa::Program& gemm() {
  static const isa::Program p = isa::assemble_file(test::source_dir() + "/kernels/gemm_f16.s");
  return p;
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
    "time alone") {
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
    begin += r.cycles;
  }
  CHECK(g.cycles == begin - g.start_cycle);
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

TEST_CASE("a later launch that fits begins before an earlier one waiting for cores") {
  write_operands();
  // 0 takes aiv0, aiv1 for a long add; 1 needs all four vector cores and waits; 2 fits on aiv2,
  // aiv3 and begins at once; 1 begins when 0, the later to end, frees its cores.
  ConcurrentResult g = sim().run_concurrent(
      {when_ready(vadd(), {kLongIn, kLongIn, kLongOut, kLongN}, 2),
       when_ready(vadd(), vadd_args(1), 4), when_ready(vadd(), vadd_args(2), 2)});
  for (const KernelResult& r : g.launches) REQUIRE(r.ok);
  const KernelResult &a = g.launches[0], &b = g.launches[1], &c = g.launches[2];
  INFO("0: " << a.start_cycle << "+" << a.cycles << ", 1: " << b.start_cycle << "+" << b.cycles
             << ", 2: " << c.start_cycle << "+" << c.cycles);
  CHECK(a.start_cycle == g.start_cycle);
  CHECK(c.start_cycle == g.start_cycle);
  REQUIRE(c.start_cycle + c.cycles < a.start_cycle + a.cycles);
  CHECK(b.start_cycle == a.start_cycle + a.cycles);
  // The cores each took, first in chip order among the free ones.
  CHECK(counter(a.counters, "chip.aiv0.blocks") == 1);
  CHECK(counter(a.counters, "chip.aiv1.blocks") == 1);
  CHECK(!a.counters["chip"].contains("aiv2"));
  CHECK(counter(c.counters, "chip.aiv2.blocks") == 1);
  CHECK(counter(c.counters, "chip.aiv3.blocks") == 1);
  CHECK(!c.counters["chip"].contains("aiv0"));
  for (int k = 0; k < 4; ++k)
    CHECK(counter(b.counters, "chip.aiv" + std::to_string(k) + ".blocks") == 1);
  CHECK(read_gm<uint16_t>(sim(), kLongOut, kLongN) == doubled(kLongN, 53, 3.0f));
  CHECK(read_gm<uint16_t>(sim(), kOut[1], kN) == doubled(kN, 33, 2.0f));
  CHECK(read_gm<uint16_t>(sim(), kOut[2], kN) == doubled(kN, 35, 3.0f));
}

TEST_CASE("a launch with named cores keeps them: the others take the rest") {
  write_operands();
  // The long add on aiv0 for the whole group; two nops of three blocks each take aiv1..aiv3
  // one after the other, each in its time alone (the task overheads and one cycle).
  ConcurrentResult g = sim().run_concurrent(
      {concurrent_launch(vadd(), {kLongIn, kLongIn, kLongOut, kLongN}, 1, {"aiv0"}),
       when_ready(nop(), {}, 3), when_ready(nop(), {}, 3)});
  for (const KernelResult& r : g.launches) REQUIRE(r.ok);
  const uint64_t nop_alone = test::task_overhead(sim().config()) + 1;
  CHECK(g.launches[1].start_cycle == g.start_cycle);
  CHECK(g.launches[1].cycles == nop_alone);
  CHECK(g.launches[2].start_cycle == g.start_cycle + nop_alone);
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
  // (aic1, aiv2, aiv3) at once; 2 needs both groups and begins when 0, the later, ends.
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
  const uint64_t end = a.start_cycle + a.cycles;
  CHECK(c.start_cycle <= end);
  CHECK(c.start_cycle + 1 >= end);
  for (const char* core : {"aic0", "aic1", "aiv0", "aiv1", "aiv2", "aiv3"})
    CHECK(counter(c.counters, std::string("chip.") + core + ".blocks") == 1);
  CHECK(read_gm<uint16_t>(sim(), kLongOut, kLongN) == doubled(kLongN, 53, 3.0f));
  // Three groups: the chip has two.
  CHECK(refusal({when_ready(mix_nop(), {}, 3)}) ==
        "concurrent launch 0: kernel 'mix_nop': block_dim 3 needs 3 groups of one aic and 2 aiv "
        "cores at once (it takes its cores when ready); the chip has 2, 2 of them on cores no "
        "launch with fixed cores uses");
}

TEST_CASE("a failed launch keeps its cores: one that needs them does not run, the others do") {
  write_operands();
  isa::Program bad =
      isa::assemble(".section aiv\n    movi x3, 0\n    div x4, x3, 0\n    end\n", "bad.s");
  ConcurrentResult g = sim().run_concurrent({when_ready(bad, {}, 3), when_ready(nop(), {}, 2),
                                             when_ready(nop(), {}, 1),
                                             when_ready(gemm(), {kA, kB, kC[0], M, N, K}, 2)});
  REQUIRE_FALSE(g.launches[0].ok);
  CHECK(g.launches[0].error.find("division by zero") != std::string::npos);
  REQUIRE_FALSE(g.launches[1].ok);
  CHECK(g.launches[1].error ==
        "did not run: it takes its cores when ready and too few were free (1 of the 2 workers "
        "it needs); failed launches keep theirs: 0 ('bad')");
  CHECK(g.launches[1].cycles == 0);
  CHECK(g.launches[2].ok);  // aiv3, free
  CHECK(counter(g.launches[2].counters, "chip.aiv3.blocks") == 1);
  CHECK(g.launches[3].ok);
  CHECK(counter(g.counters.tree(), "chip.launches") == 3);
  CHECK(counter(g.counters.tree(), "chip.failed_launches") == 1);
  // The chip is clean afterwards: a nop on every vector core alone takes the task overheads
  // and its one cycle.
  KernelResult r = sim().run(kernel_launch(nop(), {}, 4));
  REQUIRE(r.ok);
  CHECK(r.cycles == test::task_overhead(sim().config()) + 1);
}

TEST_CASE("refused: more cores than may be taken, cores named as well") {
  auto refused = [&](const std::vector<ConcurrentLaunch>& group, const std::string& what) {
    INFO(what);
    const std::string got = refusal(group);
    INFO(got);
    CHECK(got.find(what) != std::string::npos);
  };
  refused({when_ready(nop(), {}, 1), when_ready(nop(), {}, 5)},
          "concurrent launch 1: kernel 'nop': block_dim 5 needs 5 aiv cores at once (it takes "
          "its cores when ready); the chip has 4, 4 of them on cores no launch with fixed cores "
          "uses");
  // aiv0 is named by launch 0 (for the whole group): 3 vector cores remain.
  refused({concurrent_launch(nop(), {}, 1, {"aiv0"}), when_ready(nop(), {}, 4)},
          "concurrent launch 1: kernel 'nop': block_dim 4 needs 4 aiv cores at once (it takes "
          "its cores when ready); the chip has 4, 3 of them on cores no launch with fixed cores "
          "uses");
  ConcurrentLaunch both = when_ready(nop(), {}, 1);
  both.cores = {"aiv1"};
  refused({both},
          "run_concurrent: launch 0 ('nop') names 1 cores and takes its cores when ready "
          "(take_cores_when_ready): it may do only one");
  // A GEMM runs on the cube cores: 2.
  refused({when_ready(gemm(), {kA, kB, kC[0], M, N, K}, 3)},
          "block_dim 3 needs 3 aic cores at once");
  // The group is still usable after refusals.
  ConcurrentResult g = sim().run_concurrent({when_ready(nop(), {}, 4)});
  REQUIRE(g.launches[0].ok);
  CHECK(g.cycles == test::task_overhead(sim().config()) + 1);
}
