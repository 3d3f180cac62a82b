// Concurrent launches on one chip (Simulator::run_concurrent) on the tiny split chip (2 cube
// cores, 4 vector cores): a cube-only GEMM beside a vector-only vadd on disjoint cores gives the
// bytes of running them one after another, in less time than the two in sequence; a launch alone
// in a group is timed and counted as Simulator::run times it; a faulting or deadlocked launch
// reports its error while the other completes; malformed groups are refused naming the launch.
// (Shared-HBM contention: test_sim_concurrent_hbm.cpp.)
#include <catch2/catch.hpp>

#include <algorithm>
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

// GEMM operands (M x K times K x N, fp16) and vadd operands (n fp16 each), disjoint.
constexpr uint64_t M = 128, N = 256, K = 512, kN = 65536;
constexpr uint64_t kA = 0x1000000, kB = 0x2000000, kX = 0x4000000, kY = 0x5000000;
// Outputs: [0] of the concurrent run, [1] of the sequential one.
constexpr uint64_t kC[2] = {0x3000000, 0x3800000};
constexpr uint64_t kZ[2] = {0x6000000, 0x6800000};

void write_operands() {
  std::vector<uint16_t> a(M * K), b(K * N), x(kN), y(kN);
  for (uint64_t i = 0; i < a.size(); ++i)
    a[i] = f32_to_f16(static_cast<float>(i % 13) * 0.125f - 0.75f);
  for (uint64_t i = 0; i < b.size(); ++i)
    b[i] = f32_to_f16(static_cast<float>(i % 7) * 0.25f - 0.5f);
  for (uint64_t i = 0; i < kN; ++i) x[i] = f32_to_f16(static_cast<float>(i % 101) * 0.5f);
  for (uint64_t i = 0; i < kN; ++i) y[i] = f32_to_f16(static_cast<float>(i % 37) * -0.25f);
  write_gm(sim(), kA, a);
  write_gm(sim(), kB, b);
  write_gm(sim(), kX, x);
  write_gm(sim(), kY, y);
}

// Whether every counter path in `tree` under "chip" names one of `cores` (or is the root).
bool only_cores(const nlohmann::json& tree, const std::vector<std::string>& cores) {
  if (!tree.contains("chip")) return false;
  for (const auto& [name, sub] : tree["chip"].items())
    if (std::find(cores.begin(), cores.end(), name) == cores.end()) return false;
  return true;
}

}  // namespace

TEST_CASE("a cube GEMM beside a vector vadd: the bytes of running them in sequence, sooner") {
  write_operands();
  const std::vector<uint64_t> gemm_args0 = {kA, kB, kC[0], M, N, K};
  const std::vector<uint64_t> vadd_args0 = {kX, kY, kZ[0], kN};
  ConcurrentResult g = sim().run_concurrent(
      {concurrent_launch(gemm(), gemm_args0, 2, {"aic0", "aic1"}),
       concurrent_launch(vadd(), vadd_args0, 4, {"aiv0", "aiv1", "aiv2", "aiv3"})});
  REQUIRE(g.launches.size() == 2);
  REQUIRE(g.launches[0].ok);
  REQUIRE(g.launches[1].ok);
  CHECK_FALSE(g.launches[0].replayed);
  // One after another (Simulator::run) into the second output buffers.
  KernelResult ga = sim().run(kernel_launch(gemm(), {kA, kB, kC[1], M, N, K}, 2));
  KernelResult va = sim().run(kernel_launch(vadd(), {kX, kY, kZ[1], kN}, 4));
  REQUIRE(ga.ok);
  REQUIRE(va.ok);
  CHECK(read_gm<uint16_t>(sim(), kC[0], M * N) == read_gm<uint16_t>(sim(), kC[1], M * N));
  CHECK(read_gm<uint16_t>(sim(), kZ[0], kN) == read_gm<uint16_t>(sim(), kZ[1], kN));
  // ... and the vadd is x + y (fp16 sums of values exact in fp16).
  auto x = read_gm<uint16_t>(sim(), kX, kN), y = read_gm<uint16_t>(sim(), kY, kN);
  auto z = read_gm<uint16_t>(sim(), kZ[0], kN);
  for (uint64_t i = 0; i < kN; i += 97)
    REQUIRE(f16_to_f32(z[i]) == f16_to_f32(x[i]) + f16_to_f32(y[i]));
  // Time: the makespan is the later launch's end, at least the longer launch alone and less
  // than the two in sequence.
  INFO("gemm alone " << ga.cycles << ", vadd alone " << va.cycles << ", together " << g.cycles);
  CHECK(g.cycles == std::max(g.launches[0].cycles, g.launches[1].cycles));
  CHECK(g.cycles >= std::max(ga.cycles, va.cycles));
  CHECK(g.cycles < ga.cycles + va.cycles);
  CHECK(g.launches[0].start_cycle == g.start_cycle);
  CHECK(g.launches[1].start_cycle == g.start_cycle);
  // Counters: each launch's are its own cores'; the group's hold the memory system's.
  const nlohmann::json& cg = g.launches[0].counters;
  const nlohmann::json& cv = g.launches[1].counters;
  CHECK(only_cores(cg, {"aic0", "aic1"}));
  CHECK(only_cores(cv, {"aiv0", "aiv1", "aiv2", "aiv3"}));
  CHECK(counter(cg, "chip.aic0.m.macs") == M * N * K);  // one 128 x 256 tile, block 0
  CHECK(counter(cg, "chip.aic0.fix.bytes.l0c_to_gm") == M * N * 2);
  CHECK(counter(cv, "chip.aiv0.blocks") == 1);
  CHECK(counter(cv, "chip.aiv3.blocks") == 1);
  CHECK(counter(cv, "chip.aiv0.mte3.bytes.ub_to_gm") == kN / 4 * 2);
  const nlohmann::json all = g.counters.tree();
  CHECK(counter(all, "chip.launches") == 2);
  CHECK(counter(all, "chip.aic0.m.macs") == M * N * K);
  // Every GM byte the launches moved went through the shared memory system.
  CHECK(counter(all, "chip.l2.read_bytes") + counter(all, "chip.hbm.read_bytes") >=
        (M * K + K * N + 2 * kN) * 2);
  // The next launch starts after the group.
  CHECK(sim().now_cycles() >= g.start_cycle + g.cycles);
}

TEST_CASE("a group of one launch on every core is Simulator::run's launch") {
  write_operands();
  std::vector<std::string> all;
  for (int i = 0; i < 4; ++i) all.push_back("aiv" + std::to_string(i));
  ConcurrentResult g =
      sim().run_concurrent({concurrent_launch(vadd(), {kX, kY, kZ[0], kN}, 4, all)});
  KernelLaunch l = kernel_launch(vadd(), {kX, kY, kZ[1], kN}, 4);
  KernelResult r = sim().run(l);
  REQUIRE(g.launches[0].ok);
  REQUIRE(r.ok);
  CHECK(g.cycles == r.cycles);
  CHECK(g.launches[0].cycles == r.cycles);
  // The same core counters (the launch's cores are all the vector cores; run's delta also has
  // the chip-level ones).
  const nlohmann::json ran = r.counter_delta.tree();
  for (const auto& [core, sub] : g.launches[0].counters["chip"].items()) {
    INFO(core);
    CHECK(sub == ran["chip"][core]);
  }
  const nlohmann::json group = g.counters.tree();
  CHECK(group["chip"]["l2"] == ran["chip"]["l2"]);
  CHECK(group["chip"]["hbm"] == ran["chip"]["hbm"]);
  CHECK(read_gm<uint16_t>(sim(), kZ[0], kN) == read_gm<uint16_t>(sim(), kZ[1], kN));
}

TEST_CASE("a faulting launch reports its error; the launch beside it completes") {
  write_operands();
  // Launch 0 starts a 64 KiB copy (in flight for thousands of cycles) and divides by zero at
  // once: its copy is dropped from the shared memory system, the vadd beside it runs on.
  isa::Program bad = isa::assemble(R"(
.arg src
.section aiv
    ldarg x1, src
    movi x3, 0
    copy_gm2ub x3, x1, 1, 2048, 0, 0
    div x4, x3, 0
    end
)",
                                   "bad.s");
  ConcurrentResult g =
      sim().run_concurrent({concurrent_launch(bad, {kA}, 1, {"aiv0"}),
                            concurrent_launch(vadd(), {kX, kY, kZ[0], kN}, 2, {"aiv2", "aiv3"})});
  REQUIRE_FALSE(g.launches[0].ok);
  CHECK(g.launches[0].error == "core aiv0 pc 3 (bad.s:7): div x4, x3, 0: division by zero");
  REQUIRE(g.launches[1].ok);
  KernelResult alone = sim().run(kernel_launch(vadd(), {kX, kY, kZ[1], kN}, 2));
  REQUIRE(alone.ok);
  CHECK(read_gm<uint16_t>(sim(), kZ[0], kN) == read_gm<uint16_t>(sim(), kZ[1], kN));
  CHECK(g.launches[0].cycles < g.launches[1].cycles);
  CHECK(counter(g.counters.tree(), "chip.failed_launches") == 1);
  CHECK(counter(g.counters.tree(), "chip.launches") == 2);
  // The memory system holds no stale transfer: a copy alone is timed exactly (as in
  // test_sim_sync: 2 + path latency + HBM latency + 8192 B / port 32 B/cycle).
  isa::Program copy = isa::assemble(R"(
.arg src
.section aiv
    ldarg x1, src
    movi x2, 0
    copy_gm2ub x2, x1, 1, 256, 0, 0
    end
)",
                                    "copy.s");
  KernelResult c = sim().run(kernel_launch(copy, {kB}, 1));
  REQUIRE(c.ok);
  const ChipConfig& cfg = sim().config();
  CHECK(c.cycles == test::task_overhead(cfg) +
                        static_cast<uint64_t>(2 + cfg.path_latency(isa::Buf::GM, isa::Buf::UB) +
                                              cfg.hbm_latency_cycles + 8192 / 32));
}

TEST_CASE("a deadlocked launch reports its wait; the launch beside it completes") {
  write_operands();
  isa::Program dl = isa::assemble(R"(
.section aiv
    movi x1, 0
    wait_flag mte2, v, 1
    end
)",
                                  "dl.s");
  ConcurrentResult g =
      sim().run_concurrent({concurrent_launch(vadd(), {kX, kY, kZ[0], kN}, 1, {"aiv0"}),
                            concurrent_launch(dl, {}, 1, {"aiv1"})});
  REQUIRE(g.launches[0].ok);
  REQUIRE_FALSE(g.launches[1].ok);
  CHECK(g.launches[1].error == "deadlock: core aiv1 pc 1 (dl.s:4) wait_flag mte2, v, 1 never set");
}

TEST_CASE("cores left unnamed: the first free ones of the program's kind, block_dim of them") {
  write_operands();
  ConcurrentResult g =
      sim().run_concurrent({concurrent_launch(vadd(), {kX, kY, kZ[0], kN}, 2, {"aiv0"}),
                            concurrent_launch(vadd(), {kX, kY, kZ[1], kN}, 2, {}),
                            concurrent_launch(gemm(), {kA, kB, kC[0], M, N, K}, 1, {})});
  REQUIRE(g.launches[0].ok);
  REQUIRE(g.launches[1].ok);
  REQUIRE(g.launches[2].ok);
  // Launch 0 ran both its blocks on aiv0; launch 1 got aiv1 and aiv2; the GEMM aic0.
  CHECK(counter(g.launches[0].counters, "chip.aiv0.blocks") == 2);
  CHECK(only_cores(g.launches[1].counters, {"aiv1", "aiv2"}));
  CHECK(counter(g.launches[1].counters, "chip.aiv1.blocks") == 1);
  CHECK(counter(g.launches[1].counters, "chip.aiv2.blocks") == 1);
  CHECK(only_cores(g.launches[2].counters, {"aic0"}));
  CHECK(read_gm<uint16_t>(sim(), kZ[0], kN) == read_gm<uint16_t>(sim(), kZ[1], kN));
}

TEST_CASE("malformed groups are refused naming the launch, and nothing runs") {
  isa::Program nop = isa::assemble(".section aiv\n    nop\n    end\n", "nop.s");
  isa::Program cube = isa::assemble(".section aic\n    nop\n    end\n", "cube.s");
  auto refused = [&](const std::vector<ConcurrentLaunch>& group, const std::string& what) {
    INFO(what);
    try {
      sim().run_concurrent(group);
      FAIL("accepted");
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  refused(
      {concurrent_launch(nop, {}, 1, {"aiv0", "aiv1"}), concurrent_launch(nop, {}, 1, {"aiv1"})},
      "concurrent launch 1 'nop': core aiv1 is also launch 0's");
  refused({concurrent_launch(nop, {}, 1, {"aiv0", "aiv0"})}, "core aiv0 is listed twice");
  refused({concurrent_launch(nop, {}, 1, {"aiv0", "aiv1", "aiv2", "aiv3", "aic0", "aic1", "aiv4"})},
          "launch 0 ('nop') names 7 cores; chip 'tiny' has 6");
  refused({concurrent_launch(nop, {}, 1, {}), concurrent_launch(nop, {}, 1, {"aiv9"})},
          "launch 1 ('nop'): chip 'tiny' has no core 'aiv9' (its cores: aic0..aic1, aiv0..aiv3)");
  refused(
      {concurrent_launch(cube, {}, 1, {"aiv0"})},
      "concurrent launch 0: kernel 'cube' runs on aic cores and none of the launch's cores is one");
  refused({concurrent_launch(nop, {}, 4, {}), concurrent_launch(nop, {}, 1, {})},
          "launch 1 ('nop'): no free core of the kind its program runs on is left");
  refused({concurrent_launch(nop, {}, 0, {"aiv0"})},
          "concurrent launch 0: kernel 'nop': block_dim 0");
  ConcurrentLaunch none;
  refused({concurrent_launch(nop, {}, 1, {}), none}, "run_concurrent: launch 1 has no program");
  refused({}, "run_concurrent: no launches");
  // The chip is clean afterwards.
  ConcurrentResult g = sim().run_concurrent({concurrent_launch(nop, {}, 4, {})});
  REQUIRE(g.launches[0].ok);
  CHECK(g.cycles == test::task_overhead(sim().config()) + 1);
}

TEST_CASE("a mix kernel on one group's cores beside a vector kernel on another core") {
  // Each block stores {1000 + block, cube core id} from its cube core and {2000 + 100 * subblock
  // + block, vector core id} from each vector core, in slots (block * 3 + k) * 16.
  isa::Program mix = isa::assemble(R"(
.arg out
.section aic
    ldarg x1, out
    get_block_id x2
    mul x4, x2, 48
    add x1, x1, x4
    add x5, x2, 1000
    st x5, x1
    add x1, x1, 8
    get_core_id x6
    st x6, x1
    end
.section aiv
    ldarg x1, out
    get_block_id x2
    get_subblock_id x7
    mul x4, x2, 3
    add x4, x4, x7
    add x4, x4, 1
    shl x4, x4, 4
    add x1, x1, x4
    mul x8, x7, 100
    add x5, x2, 2000
    add x5, x5, x8
    st x5, x1
    add x1, x1, 8
    get_core_id x6
    st x6, x1
    end
)",
                                   "mix_ids.s");
  const uint64_t out = 0x9000000;
  write_gm(sim(), out, std::vector<int64_t>(2 * 3 * 2, -1));
  write_operands();
  // Group 1 (aic1 with aiv2 and aiv3) runs both blocks, one after the other.
  ConcurrentResult g =
      sim().run_concurrent({concurrent_launch(mix, {out}, 2, {"aic1", "aiv2", "aiv3"}),
                            concurrent_launch(vadd(), {kX, kY, kZ[0], kN}, 1, {"aiv0"})});
  REQUIRE(g.launches[0].ok);
  REQUIRE(g.launches[1].ok);
  auto v = read_gm<int64_t>(sim(), out, 2 * 3 * 2);
  for (int b = 0; b < 2; ++b) {
    INFO("block " << b);
    CHECK(v[(b * 3 + 0) * 2] == 1000 + b);
    CHECK(v[(b * 3 + 0) * 2 + 1] == 1);
    for (int s = 0; s < 2; ++s) {
      CHECK(v[(b * 3 + 1 + s) * 2] == 2000 + 100 * s + b);
      CHECK(v[(b * 3 + 1 + s) * 2 + 1] == 2 + s);
    }
  }
  CHECK(counter(g.launches[0].counters, "chip.aic1.blocks") == 2);
  CHECK(only_cores(g.launches[0].counters, {"aic1", "aiv2", "aiv3"}));
  // Unnamed cores: the first free group (group 0) for a mix kernel.
  ConcurrentResult h =
      sim().run_concurrent({concurrent_launch(vadd(), {kX, kY, kZ[0], kN}, 1, {"aiv0"}),
                            concurrent_launch(mix, {out}, 1, {})});
  REQUIRE(h.launches[1].ok);
  CHECK(only_cores(h.launches[1].counters, {"aic1", "aiv2", "aiv3"}));
  // A cube core without both of its vector cores is no group.
  try {
    sim().run_concurrent({concurrent_launch(mix, {out}, 1, {"aic1", "aiv2"})});
    FAIL("accepted");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          "concurrent launch 0: kernel 'mix_ids' is a mix kernel and the launch's cores hold no "
          "group of one aic core and its 2 aiv cores");
  }
}
