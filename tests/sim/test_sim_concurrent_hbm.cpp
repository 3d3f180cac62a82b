// Concurrent launches share the chip's HBM (Simulator::run_concurrent): on the tiny chip with HBM
// slowed to 48 B/cycle, one vector core streaming a vadd alone (GM reads at its 32 B/cycle port)
// is not HBM-bound and two are. Two such launches on disjoint cores are each slower together
// than alone, and together faster than one after another.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

#include "common/numeric.h"
#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::kernel_launch;
using npusim::test::read_gm;
using npusim::test::write_gm;

namespace {

// 48 bytes per cycle at the tiny chip's 1850 MHz (memory.hbm.efficiency 1: sustained = peak).
constexpr double kHbmBytesPerCycle = 48;

Simulator& sim() {
  static Simulator s(
      load_chip_config("tiny", {"memory.hbm.gbps=" + std::to_string(kHbmBytesPerCycle * 1.850)}),
      SimOptions{});
  return s;
}

}  // namespace

TEST_CASE(
    "two memory-bound launches share HBM: each slower together, together faster than in "
    "sequence") {
  REQUIRE(sim().config().hbm_sustained_bytes_per_cycle() == Approx(kHbmBytesPerCycle));
  const isa::Program& vadd = test::repo_kernel("vadd_f16.s");
  constexpr uint64_t n = 65536;
  const uint64_t x[2] = {0x1000000, 0x2000000}, y[2] = {0x3000000, 0x4000000};
  const uint64_t z[2] = {0x5000000, 0x6000000}, z_alone[2] = {0x7000000, 0x8000000};
  for (int k = 0; k < 2; ++k) {
    std::vector<uint16_t> a(n), b(n);
    for (uint64_t i = 0; i < n; ++i) a[i] = f32_to_f16(static_cast<float>((i + k) % 29));
    for (uint64_t i = 0; i < n; ++i) b[i] = f32_to_f16(static_cast<float>(i % 11) * 0.5f);
    write_gm(sim(), x[k], a);
    write_gm(sim(), y[k], b);
  }
  ConcurrentResult g =
      sim().run_concurrent({{kernel_launch(vadd, {x[0], y[0], z[0], n}, 1), {"aiv0"}},
                            {kernel_launch(vadd, {x[1], y[1], z[1], n}, 1), {"aiv2"}}});
  REQUIRE(g.launches[0].ok);
  REQUIRE(g.launches[1].ok);
  KernelResult alone[2];
  for (int k = 0; k < 2; ++k) {
    alone[k] = sim().run(kernel_launch(vadd, {x[k], y[k], z_alone[k], n}, 1));
    REQUIRE(alone[k].ok);
    CHECK(read_gm<uint16_t>(sim(), z[k], n) == read_gm<uint16_t>(sim(), z_alone[k], n));
  }
  INFO("alone " << alone[0].cycles << " and " << alone[1].cycles << "; together "
                << g.launches[0].cycles << " and " << g.launches[1].cycles << ", makespan "
                << g.cycles);
  for (int k = 0; k < 2; ++k) CHECK(g.launches[k].cycles > alone[k].cycles);
  CHECK(g.cycles < alone[0].cycles + alone[1].cycles);
  // HBM moved the group's bytes (both launches' reads and writes missing the cold L2) busy for
  // at least those bytes at its bandwidth, which bounds the makespan from below too.
  const nlohmann::json c = g.counters.tree();
  const double hbm_bytes = static_cast<double>(test::counter(c, "chip.hbm.read_bytes") +
                                               test::counter(c, "chip.hbm.write_bytes"));
  CHECK(test::counter(c, "chip.hbm.read_bytes") >= 2 * 2 * n * 2);  // x and y of each
  CHECK(static_cast<double>(g.cycles) >= hbm_bytes / kHbmBytesPerCycle);
}
