// Buffer high-water counters: chip.<core>.buffer.<buf>.high_water is the highest byte offset
// (addr + bytes) any instruction touched in that buffer during the launch; the session counters
// (Simulator::counters) keep the maximum over all launches; also the registry semantics of
// high-water counters. Timing-only runs, since the marks come
// from plan()'s range checks and must not depend on the functional mode.
#include <catch2/catch.hpp>

#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "sim/counters/counters.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::counter;
using npusim::test::launch;

namespace {

constexpr uint64_t kGm = 0x100000;

// Vector core: an MTE2 burst copy into the UB at 0x1000, then a vdup at 0x2000.
// copy_gm2ub: nburst 2, burst_len 3 blocks, dst_gap 1 block: destination pitch (3+1)*32 = 128,
// extent (2-1)*128 + 3*32 = 224 bytes, so it touches [0x1000, 0x1000+224) and the mark is
// 4096 + 224 = 4320.
// vdup.f16: repeat 2, dst_blk 1 (32 B between blocks), dst_rep 8 (256 B between repeats): the last
// byte touched ends at 0x2000 + (2-1)*256 + (8-1)*32 + 32 = 8192 + 512 = 8704.
const char* kVectorKernel = R"(
.arg src
.arg with_vdup
.section aiv
    ldarg x1, src
    ldarg x2, with_vdup
    movi x3, 0x1000
    copy_gm2ub x3, x1, 2, 3, 0, 1
    beq x2, 0, done
    movi x4, 0x2000
    movi x5, 0
    vdup.f16 x4, x5, 2, 1, 8
done:
    pipe_barrier all
    end
)";

// Cube core: copy_gm2l1 of one 4-block burst to L1 0x400 (ends at 1024 + 128 = 1152), then
// load2d of 2 fractals from L1 0x400 (src_stride 1: source extent ((2-1)*1+1)*512 = 1024, ends at
// 1024 + 1024 = 2048) into L0A 0x200 (destination 2*512 = 1024 bytes, ends at 512 + 1024 = 1536).
// So L1's mark is max(1152, 2048) = 2048, L0A's 1536, and L0B/L0C (untouched) stay 0.
const char* kCubeKernel = R"(
.arg src
.section aic
    ldarg x1, src
    movi x2, 0x400
    copy_gm2l1 x2, x1, 1, 4, 0, 0
    set_flag mte2, mte1, 0
    wait_flag mte2, mte1, 0
    movi x3, 0x200
    load2d.f16 l0a, x3, x2, 2, 1, 0
    pipe_barrier all
    end
)";

}  // namespace

TEST_CASE("buffer high-water counters: per launch, per core and buffer; session keeps the max") {
  SimOptions opts;
  opts.functional = false;
  Simulator sim(load_chip_config("tiny"), opts);
  const isa::Program vec = isa::assemble(kVectorKernel, "hwm_vec.s");
  const isa::Program cube = isa::assemble(kCubeKernel, "hwm_cube.s");

  KernelResult r1 = launch(sim, vec, {kGm, 1}, 1);
  REQUIRE(r1.ok);
  CHECK(counter(r1.counters, "chip.aiv0.buffer.ub.high_water") == 8704);
  CHECK(counter(r1.counters, "chip.aiv1.buffer.ub.high_water") == 0);  // ran no block

  // Second launch without the vdup: the launch's own mark (4320), not the earlier 8704.
  KernelResult r2 = launch(sim, vec, {kGm, 0}, 1);
  REQUIRE(r2.ok);
  CHECK(counter(r2.counters, "chip.aiv0.buffer.ub.high_water") == 4320);

  KernelResult r3 = launch(sim, cube, {kGm}, 1);
  REQUIRE(r3.ok);
  CHECK(counter(r3.counters, "chip.aic0.buffer.l1.high_water") == 2048);
  CHECK(counter(r3.counters, "chip.aic0.buffer.l0a.high_water") == 1536);
  CHECK(counter(r3.counters, "chip.aic0.buffer.l0b.high_water") == 0);
  CHECK(counter(r3.counters, "chip.aic0.buffer.l0c.high_water") == 0);
  CHECK(counter(r3.counters, "chip.aiv0.buffer.ub.high_water") == 0);  // not run this launch
  CHECK(r3.counters["chip"]["aic0"]["buffer"]["l1"]["high_water"]["unit"] == "bytes");

  // Session counters: the maximum over the three launches.
  const nlohmann::json session = sim.counters();
  CHECK(counter(session, "chip.aiv0.buffer.ub.high_water") == 8704);
  CHECK(counter(session, "chip.aic0.buffer.l1.high_water") == 2048);
}

TEST_CASE("high-water counters: dump_since gives the max since the latest snapshot") {
  CounterRegistry reg;
  Counter& hw = reg.add("chip.aic0.buffer.l1.high_water", "bytes", "", 1, CounterKind::kHighWater);
  Counter& sum = reg.add("chip.aic0.blocks", "blocks", "");
  hw.raise_to(500);
  hw.raise_to(200);  // lower: no change
  sum.add(1);
  auto base = reg.snapshot();  // starts a new window: the next launch's marks count from 0
  hw.raise_to(300);
  sum.add(1);
  nlohmann::json d = reg.dump_since(base);
  CHECK(d["chip"]["aic0"]["buffer"]["l1"]["high_water"]["value"] == 300);  // not 300 - 500
  CHECK(d["chip"]["aic0"]["blocks"]["value"] == 1);
  CHECK(reg.dump()["chip"]["aic0"]["buffer"]["l1"]["high_water"]["value"] == 500);
  reg.snapshot();  // a window in which nothing was touched reports 0
  CHECK(reg.dump_since(reg.snapshot())["chip"]["aic0"]["buffer"]["l1"]["high_water"]["value"] == 0);
  reg.reset();
  CHECK(reg.dump()["chip"]["aic0"]["buffer"]["l1"]["high_water"]["value"] == 0);
}
