// A coupled chip (910 preset: 32 AI cores, each with cube and vector pipes): the program's single
// section runs on every AI core, whatever kind it was written for; blocks beyond the core count
// wait for free cores; a kernel with two sections is refused.
#include <catch2/catch.hpp>

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
  static Simulator s(load_chip_config("910"), SimOptions{});
  return s;
}
}  // namespace

TEST_CASE("coupled chip: an aiv-section kernel runs on the AI cores, 40 blocks on 32 cores") {
  REQUIRE_FALSE(sim().config().split);
  REQUIRE(sim().config().total_cores() == 32);
  const isa::Program& p = test::repo_kernel("vadd_f16.s");
  const uint64_t n = 40 * 1024, x = 0x1000000, y = 0x2000000, z = 0x3000000;
  std::vector<uint16_t> hx(n), hy(n);
  for (uint64_t i = 0; i < n; ++i) {
    hx[i] = f32_to_f16(static_cast<float>(i % 512) / 8.0f);
    hy[i] = f32_to_f16(-static_cast<float>(i % 3));
  }
  write_gm(sim(), x, hx);
  write_gm(sim(), y, hy);
  KernelResult r = launch(sim(), p, {x, y, z, n}, 40);
  REQUIRE(r.ok);
  auto hz = read_gm<uint16_t>(sim(), z, n);
  for (uint64_t i = 0; i < n; ++i) {
    INFO(i);
    REQUIRE(hz[i] == f32_to_f16(f16_to_f32(hx[i]) + f16_to_f32(hy[i])));
  }
  // Blocks 0..31 start on cores 0..31; the 8 left go to the first cores to finish.
  uint64_t blocks = 0;
  for (int c = 0; c < 32; ++c)
    blocks += counter(r.counters, "chip.aicore" + std::to_string(c) + ".blocks");
  CHECK(blocks == 40);
  CHECK(counter(r.counters, "chip.aicore31.v.insn.vadd") >= 1);
  CHECK(counter(r.counters, "chip.aicore0.mte2.bytes.gm_to_ub") >= 2 * 1024 * 2);
}

TEST_CASE("coupled chip refuses a kernel with two sections") {
  isa::Program p = isa::assemble(".section aic\n    end\n.section aiv\n    end\n", "two.s");
  KernelLaunch l;
  l.program = &p;
  CHECK_THROWS_AS(sim().run(l), Error);
  // The chip is untouched by the refused launch.
  isa::Program ok = isa::assemble(".section aicore\n    nop\n    nop\n    end\n", "ok.s");
  KernelResult r = launch(sim(), ok, {}, 32);
  CHECK(r.ok);
  CHECK(r.cycles == test::task_overhead(sim().config()) + 2);  // one block per core
  KernelLaunch none;
  CHECK_THROWS_AS(sim().run(none), Error);
  l.program = &ok;
  l.block_dim = 0;
  CHECK_THROWS_AS(sim().run(l), Error);
}
