// Split-chip launches on the tiny chip (2 cube cores, 4 vector cores, 2 vector cores per cube
// core): mix kernels (one cube core + its vector cores per block, subblock ids), cross-core flags
// in all three modes, their faults and deadlocks, and the GEMM kernel on the cube cores.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>

#include "common/error.h"
#include "common/numeric.h"
#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::counter;
using npusim::test::launch;
using npusim::test::read_gm;
using npusim::test::write_gm;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny"), SimOptions{});
  return s;
}

constexpr uint64_t kBuf = 0x100000;

}  // namespace

TEST_CASE("mix kernel: each block is one cube core and its two vector cores") {
  // Slot (block * 3 + k) * 16 holds {tag, core id}: k = 0 for the cube core (tag 1000 + block),
  // k = 1 + subblock for a vector core (tag 2000 + 100 * subblock + block).
  isa::Program p = isa::assemble(R"(
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
)", "mix_ids.s");
  KernelResult r = launch(sim(), p, {kBuf}, 3);
  REQUIRE(r.ok);
  auto v = read_gm<int64_t>(sim(), kBuf, 3 * 3 * 2);
  for (int b = 0; b < 3; ++b) {
    // Blocks 0 and 1 start on groups 0 and 1; both finish together, and the group with the
    // lower index takes block 2.
    const int group = b == 2 ? 0 : b;
    INFO("block " << b);
    CHECK(v[(b * 3 + 0) * 2] == 1000 + b);
    CHECK(v[(b * 3 + 0) * 2 + 1] == group);
    for (int s = 0; s < 2; ++s) {
      CHECK(v[(b * 3 + 1 + s) * 2] == 2000 + 100 * s + b);
      CHECK(v[(b * 3 + 1 + s) * 2 + 1] == 2 * group + s);
    }
  }
  CHECK(counter(r.counters, "chip.aic0.blocks") == 2);
  CHECK(counter(r.counters, "chip.aiv1.blocks") == 2);
  CHECK(counter(r.counters, "chip.aiv3.blocks") == 1);
}

TEST_CASE("cross-core flags mode 2: cube core -> its vector cores and back") {
  // The cube core spins, then stores v = block + 7 and signals; each vector core waits, reads
  // v, stores 10 * v + subblock and signals back; the cube core waits for both and stores the
  // sum. Without the flags the vector cores would read 0 (they get there first).
  isa::Program p = isa::assemble(R"(
.arg buf
.section aic
    ldarg x1, buf
    get_block_id x2
    shl x3, x2, 6
    add x1, x1, x3
    movi x4, 0
spin:
    add x4, x4, 1
    blt x4, 50, spin
    add x5, x2, 7
    st x5, x1
    cc_set s, 2, 0
    cc_wait s, 1
    cc_wait s, 1
    add x6, x1, 24
    ld x7, x6
    add x6, x1, 32
    ld x8, x6
    add x7, x7, x8
    add x6, x1, 40
    st x7, x6
    end
.section aiv
    ldarg x1, buf
    get_block_id x2
    get_subblock_id x3
    shl x4, x2, 6
    add x1, x1, x4
    cc_wait s, 0
    ld x5, x1
    mul x5, x5, 10
    add x5, x5, x3
    shl x6, x3, 3
    add x6, x6, 24
    add x6, x1, x6
    st x5, x6
    cc_set s, 2, 1
    end
)", "cc2.s");
  KernelResult r = launch(sim(), p, {kBuf}, 2);
  REQUIRE(r.ok);
  for (int b = 0; b < 2; ++b) {
    auto v = read_gm<int64_t>(sim(), kBuf + 64 * b, 6);
    const int64_t x = b + 7;
    CHECK(v[0] == x);
    CHECK(v[3] == 10 * x);
    CHECK(v[4] == 10 * x + 1);
    CHECK(v[5] == 20 * x + 1);
  }
  CHECK(counter(r.counters, "chip.aiv0.s.stall.cross_core_wait") > 0);
}

TEST_CASE("cc_set in a pipe queue fires after that pipe's earlier work (MTE3 -> cube core)") {
  // Each vector core writes 8 s32 copies of (block * 10 + subblock + 1) through the UB and
  // signals from MTE3, i.e. after the copy reached GM; the cube core then reads 8 bytes of
  // each (two equal s32 lanes).
  isa::Program p = isa::assemble(R"(
.arg buf
.section aic
    ldarg x1, buf
    get_block_id x2
    shl x3, x2, 7
    add x1, x1, x3
    cc_wait s, 2
    cc_wait s, 2
    ld x4, x1
    add x5, x1, 32
    ld x6, x5
    add x5, x1, 64
    st x4, x5
    add x5, x1, 72
    st x6, x5
    end
.section aiv
    ldarg x1, buf
    get_block_id x2
    get_subblock_id x3
    shl x4, x2, 7
    add x1, x1, x4
    shl x5, x3, 5
    add x1, x1, x5
    mul x6, x2, 10
    add x6, x6, x3
    add x6, x6, 1
    movi x7, 0
    set_mask_count 8
    vdup.s32 x7, x6, 1, 1, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x1, x7, 1, 1, 0, 0
    cc_set mte3, 2, 2
    end
)", "cc_pipe.s");
  KernelResult r = launch(sim(), p, {kBuf}, 2);
  REQUIRE(r.ok);
  for (int b = 0; b < 2; ++b) {
    auto v = read_gm<int64_t>(sim(), kBuf + 128 * b + 64, 2);
    for (int s = 0; s < 2; ++s) {
      const int64_t lane = b * 10 + s + 1;
      CHECK(v[s] == (lane | (lane << 32)));
    }
  }
}

TEST_CASE("cross-core flags modes 0 and 1 are barriers") {
  // Mode 0 over the cube cores of an aic-only kernel: block 0 spins and stores 99 before the
  // barrier; block 1 reads it after the barrier.
  isa::Program p0 = isa::assemble(R"(
.arg buf
.section aic
    ldarg x1, buf
    get_block_id x2
    bne x2, 0, after
    movi x4, 0
spin:
    add x4, x4, 1
    blt x4, 100, spin
    movi x5, 99
    st x5, x1
after:
    cc_set s, 0, 3
    cc_wait s, 3
    ld x6, x1
    shl x7, x2, 3
    add x7, x7, 8
    add x7, x1, x7
    st x6, x7
    end
)", "cc0.s");
  write_gm(sim(), kBuf, std::vector<int64_t>(3, 0));
  KernelResult r0 = launch(sim(), p0, {kBuf}, 2);
  REQUIRE(r0.ok);
  CHECK(read_gm<int64_t>(sim(), kBuf, 3) == std::vector<int64_t>{99, 99, 99});

  // Mode 1 between the two vector cores of each group of a mix kernel.
  isa::Program p1 = isa::assemble(R"(
.arg buf
.section aic
    end
.section aiv
    ldarg x1, buf
    get_block_id x2
    get_subblock_id x3
    shl x4, x2, 5
    add x1, x1, x4
    bne x3, 0, after
    movi x4, 0
spin:
    add x4, x4, 1
    blt x4, 100, spin
    add x5, x2, 50
    st x5, x1
after:
    cc_set s, 1, 4
    cc_wait s, 4
    ld x6, x1
    add x7, x1, 8
    shl x8, x3, 3
    add x7, x7, x8
    st x6, x7
    end
)", "cc1.s");
  write_gm(sim(), kBuf, std::vector<int64_t>(8, 0));
  KernelResult r1 = launch(sim(), p1, {kBuf}, 2);
  REQUIRE(r1.ok);
  for (int b = 0; b < 2; ++b)
    CHECK(read_gm<int64_t>(sim(), kBuf + 32 * b, 3) == std::vector<int64_t>(3, 50 + b));
}

TEST_CASE("cross-core faults and deadlock") {
  {
    isa::Program p = isa::assemble(".section aic\n    cc_set s, 1, 0\n    end\n"
                                   ".section aiv\n    end\n", "cc_bad.s");
    KernelResult r = launch(sim(), p, {}, 1);
    CHECK_FALSE(r.ok);
    CHECK(r.error == "core aic0 pc 0 (cc_bad.s:2): cc_set s, 1, 0: cc_set mode 1 synchronises "
                     "vector cores; this is a cube core");
  }
  {
    // One vector core posts 16 sets to its cube core, which never waits: the 16th overflows.
    std::string text = ".section aic\n    end\n.section aiv\n    get_subblock_id x1\n"
                       "    bne x1, 0, done\n";
    for (int i = 0; i < 16; ++i) text += "    cc_set s, 2, 4\n";
    text += "done:\n    end\n";
    isa::Program p = isa::assemble(text, "cc_many.s");
    KernelResult r = launch(sim(), p, {}, 1);
    CHECK_FALSE(r.ok);
    CHECK(r.error == "core aiv0 pc 17 (cc_many.s:21): cc_set s, 2, 4: cross-core flag 4 of core "
                     "aic0 already has 15 pending sets (the chip allows 15)");
  }
  {
    isa::Program p = isa::assemble(".section aic\n    cc_wait s, 5\n    end\n"
                                   ".section aiv\n    end\n", "cc_dl.s");
    KernelResult r = launch(sim(), p, {}, 1);
    CHECK_FALSE(r.ok);
    CHECK(r.error == "deadlock: core aic0 pc 0 (cc_dl.s:2) cc_wait s, 5 never set");
  }
  // And the chip runs normally afterwards.
  isa::Program ok = isa::assemble(".section aic\n    nop\n    end\n.section aiv\n    end\n",
                                  "ok.s");
  KernelResult r = launch(sim(), ok, {}, 2);
  CHECK(r.ok);
  CHECK(r.cycles == test::task_overhead(sim().config()) + 1);
}

TEST_CASE("a split chip refuses a kernel with only an aicore section") {
  isa::Program p = isa::assemble(".section aicore\n    end\n", "coupled_only.s");
  KernelLaunch l;
  l.program = &p;
  CHECK_THROWS_AS(sim().run(l), Error);
  isa::Program ok = isa::assemble(".section aiv\n    nop\n    end\n", "ok.s");
  KernelResult r = launch(sim(), ok, {}, 4);
  CHECK(r.ok);
  CHECK(r.cycles == test::task_overhead(sim().config()) + 1);
}

TEST_CASE("the GEMM kernel on the cube cores matches a float reference") {
  const isa::Program& p = test::repo_kernel("gemm_f16.s");
  const uint64_t M = 128, N = 256, K = 512;
  const uint64_t a = 0x1000000, b = 0x2000000, c = 0x3000000;
  std::vector<uint16_t> ha(M * K), hb(K * N);
  for (uint64_t i = 0; i < ha.size(); ++i)
    ha[i] = f32_to_f16(static_cast<float>(i % 13) * 0.125f - 0.75f);
  for (uint64_t i = 0; i < hb.size(); ++i)
    hb[i] = f32_to_f16(static_cast<float>(i % 7) * 0.25f - 0.5f);
  write_gm(sim(), a, ha);
  write_gm(sim(), b, hb);
  KernelResult r = launch(sim(), p, {a, b, c, M, N, K}, 2);
  REQUIRE(r.ok);
  auto hc = read_gm<uint16_t>(sim(), c, M * N);
  for (uint64_t i = 0; i < M; ++i) {
    for (uint64_t j = 0; j < N; ++j) {
      double ref = 0;
      for (uint64_t k = 0; k < K; ++k)
        ref += static_cast<double>(f16_to_f32(ha[i * K + k])) * f16_to_f32(hb[k * N + j]);
      INFO(i << "," << j);
      REQUIRE(f16_to_f32(hc[i * N + j]) == Approx(ref).margin(0.05).epsilon(2e-3));
    }
  }
  // One 128 x 256 tile, on block 0: 128 * 256 * 512 MACs.
  CHECK(counter(r.counters, "chip.aic0.m.macs") == M * N * K);
  CHECK(counter(r.counters, "chip.aic1.m.macs") == 0);
  CHECK(counter(r.counters, "chip.aic0.fix.bytes.l0c_to_gm") == M * N * 2);
}
