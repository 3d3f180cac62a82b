// Mix kernels that declare one vector core per cube core (`.aiv_per_aic 1`, Ascend C
// KERNEL_TYPE_MIX_AIC_1_1) on the tiny chip (2 cube cores, 4 vector cores, 2 per cube core):
// a 1:1 kernel computes what its 1:2 twin does, each block on cube core g and vector core 2g
// only; its freed vector cores run a vector launch beside it in a concurrent group (cores fixed
// at the group's start, or taken when ready, also one with more blocks than those cores, in
// waves); a ratio the chip cannot run is refused.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "sim/config/core_taker.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::concurrent_launch;
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
constexpr int kRows = 6;  // rows of each block, split among its vector cores

// A block's cube core spins `spin` iterations, stores v = block + 7 at row slot 0 and signals its
// vector cores; vector core s of `ratio` stores 10 * v + r at row slot 1 + r for its rows
// r = s, s + ratio, ... < kRows, and signals back; the cube core waits once per vector core and
// stores the sum of the rows at slot 1 + kRows. Block b's slots: kBuf + b * 128, 8 bytes each.
isa::Program sum_kernel(int ratio, int spin, const std::string& name) {
  const std::string declared = ratio == 2 ? "" : fmt::format(".aiv_per_aic {}\n", ratio);
  std::string waits;
  for (int i = 0; i < ratio; ++i) waits += "    cc_wait s, 1\n";
  return isa::assemble(fmt::format(R"(.kernel {0}
.arg buf
{1}.equ ROWS, {2}
.equ RATIO, {3}
.section aic
    ldarg x1, buf
    get_block_id x2
    shl x3, x2, 7
    add x1, x1, x3
    movi x4, 0
spin:
    add x4, x4, 1
    blt x4, {4}, spin
    add x5, x2, 7
    st x5, x1
    cc_set s, 2, 0
{5}    movi x7, 0
    movi x9, 0
sum:
    add x9, x9, 1
    shl x6, x9, 3
    add x6, x1, x6
    ld x8, x6
    add x7, x7, x8
    blt x9, ROWS, sum
    add x6, x1, (ROWS + 1) * 8
    st x7, x6
    end
.section aiv
    ldarg x1, buf
    get_block_id x2
    get_subblock_id x3
    shl x4, x2, 7
    add x1, x1, x4
    cc_wait s, 0
    ld x5, x1
    mul x5, x5, 10
rows:
    add x6, x5, x3
    add x7, x3, 1
    shl x7, x7, 3
    add x7, x1, x7
    st x6, x7
    add x3, x3, RATIO
    blt x3, ROWS, rows
    cc_set s, 2, 1
    end
)",
                                   name, declared, kRows, ratio, spin, waits),
                       name + ".s");
}

// The slots block b of the sum kernel leaves (the reference: no simulator involved).
std::vector<int64_t> expected_slots(int b) {
  std::vector<int64_t> v(kRows + 2, 0);
  v[0] = b + 7;
  for (int r = 0; r < kRows; ++r) v[1 + r] = 10 * (b + 7) + r, v[kRows + 1] += v[1 + r];
  return v;
}

const isa::Program& vec_nop() {
  static const isa::Program p = isa::assemble(".section aiv\n    nop\n    end\n", "vec_nop.s");
  return p;
}

std::string error_of(const isa::Program& p, int block_dim) {
  try {
    launch(sim(), p, {kBuf}, block_dim);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a 1:1 mix kernel computes what its 1:2 twin does, on one vector core per block") {
  for (int ratio : {2, 1}) {
    INFO("ratio " << ratio);
    const isa::Program p = sum_kernel(ratio, 50, fmt::format("sum_{}", ratio));
    write_gm(sim(), kBuf, std::vector<int64_t>(3 * 16, -1));
    KernelResult r = launch(sim(), p, {kBuf}, 3);
    REQUIRE(r.ok);
    for (int b = 0; b < 3; ++b) {
      INFO("block " << b);
      CHECK(read_gm<int64_t>(sim(), kBuf + 128 * b, kRows + 2) == expected_slots(b));
    }
    // Blocks 0 and 1 on groups 0 and 1, block 2 on group 0 again.
    CHECK(counter(r.counters, "chip.aic0.blocks") == 2);
    CHECK(counter(r.counters, "chip.aic1.blocks") == 1);
    CHECK(counter(r.counters, "chip.aiv0.blocks") == 2);
    CHECK(counter(r.counters, "chip.aiv2.blocks") == 1);
    if (ratio == 2) {
      CHECK(counter(r.counters, "chip.aiv1.blocks") == 2);
      CHECK(counter(r.counters, "chip.aiv3.blocks") == 1);
    } else {
      CHECK(!r.counters["chip"].contains("aiv1"));
      CHECK(!r.counters["chip"].contains("aiv3"));
    }
  }
}

TEST_CASE("the freed vector cores of a 1:1 mix launch run a vector launch beside it") {
  // Launch 0: the mix kernel on both groups, long (the cube cores spin); launch 1: a vector
  // launch of 2 blocks. 1:1 leaves aiv1 and aiv3 free: launch 1 starts with the group. 1:2
  // holds every vector core: launch 1 waits for launch 0's end (fixed cores, ordered) or for
  // its blocks' end (taken when ready: the cores free then, before its completion overhead).
  const uint64_t done = test::us_cycles(sim().config(), sim().config().task_done_us);
  const isa::Program one = sum_kernel(1, 2000, "sum_long_1");
  const isa::Program two = sum_kernel(2, 2000, "sum_long_2");
  for (const bool when_ready : {false, true}) {
    INFO("take_cores_when_ready " << when_ready);
    for (const isa::Program* p : {&one, &two}) {
      INFO(p->name);
      write_gm(sim(), kBuf, std::vector<int64_t>(2 * 16, -1));
      std::vector<ConcurrentLaunch> group{concurrent_launch(*p, {kBuf}, 2, {}, {}),
                                          concurrent_launch(vec_nop(), {}, 2, {}, {})};
      if (when_ready) {
        for (ConcurrentLaunch& c : group) c.take_cores_when_ready = true;
      } else if (p == &two) {
        group[1].after = {0};  // no vector core is free beside it: it runs after
      }
      ConcurrentResult g = sim().run_concurrent(group);
      for (const KernelResult& r : g.launches) REQUIRE(r.ok);
      const KernelResult &mix = g.launches[0], &vec = g.launches[1];
      for (int b = 0; b < 2; ++b)
        CHECK(read_gm<int64_t>(sim(), kBuf + 128 * b, kRows + 2) == expected_slots(b));
      CHECK(mix.start_cycle == g.start_cycle);
      CHECK(mix.cycles > 2000);
      if (p == &one) {
        CHECK(vec.start_cycle == g.start_cycle);
        CHECK(vec.start_cycle + vec.cycles < mix.start_cycle + mix.cycles);
        for (const char* core : {"aiv1", "aiv3"})
          CHECK(counter(vec.counters, std::string("chip.") + core + ".blocks") == 1);
      } else if (when_ready) {
        CHECK(vec.start_cycle == mix.start_cycle + mix.cycles - done);
      } else {
        CHECK(vec.start_cycle + 1 >= mix.start_cycle + mix.cycles);
      }
    }
  }
}

TEST_CASE("a vector launch with more blocks than a 1:1 mix launch leaves free runs in waves") {
  // Launch 0: the long 1:1 mix kernel on both groups (aic0 + aiv0, aic1 + aiv2); launch 1: a
  // vector launch of 6 blocks, taken when ready: it begins at once on aiv1 and aiv3 and runs
  // three blocks on each, as a lone launch of 6 blocks on two vector cores does.
  const isa::Program one = sum_kernel(1, 2000, "sum_long_1");
  write_gm(sim(), kBuf, std::vector<int64_t>(2 * 16, -1));
  std::vector<ConcurrentLaunch> group{concurrent_launch(one, {kBuf}, 2, {}, {}),
                                      concurrent_launch(vec_nop(), {}, 6, {}, {})};
  for (ConcurrentLaunch& c : group) c.take_cores_when_ready = true;
  ConcurrentResult g = sim().run_concurrent(group);
  for (const KernelResult& r : g.launches) REQUIRE(r.ok);
  const KernelResult &mix = g.launches[0], &vec = g.launches[1];
  for (int b = 0; b < 2; ++b)
    CHECK(read_gm<int64_t>(sim(), kBuf + 128 * b, kRows + 2) == expected_slots(b));
  // The reference: the same 6 blocks alone on two vector cores named for them.
  ConcurrentResult lone =
      sim().run_concurrent({concurrent_launch(vec_nop(), {}, 6, {"aiv1", "aiv3"}, {})});
  REQUIRE(lone.launches[0].ok);
  CHECK(vec.start_cycle == g.start_cycle);
  CHECK(vec.cycles == lone.launches[0].cycles);
  CHECK(vec.cycles == test::task_overhead(sim().config(), 3) + 3);  // a nop block: one cycle
  CHECK(vec.start_cycle + vec.cycles < mix.start_cycle + mix.cycles);
  for (const char* core : {"aiv1", "aiv3"})
    CHECK(counter(vec.counters, std::string("chip.") + core + ".blocks") == 3);
  CHECK(!vec.counters["chip"].contains("aiv0"));
  CHECK(!vec.counters["chip"].contains("aiv2"));
  CHECK(counter(mix.counters, "chip.aiv0.blocks") == 1);
  CHECK(!mix.counters["chip"].contains("aiv1"));
}

TEST_CASE("Mix Block Dim and core taking follow the program's ratio") {
  const ChipConfig& cfg = sim().config();
  const isa::Program one = sum_kernel(1, 1, "sum_1"), two = sum_kernel(2, 1, "sum_2");
  CHECK(mix_aiv_per_block(cfg, one) == 1);
  CHECK(mix_aiv_per_block(cfg, two) == cfg.aiv_per_aic);
  CoreTaker taker(cfg);
  std::vector<std::string> names;
  REQUIRE(taker.take(one, 2, &names));
  CHECK(names == std::vector<std::string>{"aic0", "aiv0", "aic1", "aiv2"});
  names.clear();
  REQUIRE(taker.take(vec_nop(), 2, &names));
  CHECK(names == std::vector<std::string>{"aiv1", "aiv3"});
  CHECK_FALSE(taker.take(vec_nop(), 1, nullptr));
}

TEST_CASE("a mix ratio the chip cannot run is refused, naming the kernel") {
  isa::Program three = sum_kernel(1, 1, "sum_3");
  three.aiv_per_aic = 3;
  CHECK(error_of(three, 1) ==
        "kernel 'sum_3' declares 3 vector core(s) per cube core "
        "(.aiv_per_aic); chip 'tiny' has 2 (cores.aiv.per_aic)");
  // On a coupled chip (whose Simulator would need a process of its own) the check the chip
  // makes before forming its workers (Chip::make_workers) refuses it.
  const isa::Program one = sum_kernel(1, 1, "sum_1");
  try {
    mix_aiv_per_block(load_chip_config("tiny_coupled"), one);
    FAIL("a coupled chip took a kernel with a declared mix ratio");
  } catch (const Error& e) {
    CHECK(std::string(e.what()) ==
          "kernel 'sum_1' declares 1 vector core(s) per cube core (.aiv_per_aic), but chip "
          "'tiny_coupled' is coupled: it has no cube and vector cores");
  }
}
