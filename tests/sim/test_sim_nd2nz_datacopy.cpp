// benchmarks/kernels/nd2nz_load.s on the 910b preset in the GM -> L1 patterns of Huawei's
// DataCopy sample (docs/validation.md, "The DataCopy sample's GM -> L1 loads"), at a quarter of
// its matrix side: the order the sample's msprof figures put them in, by the per-row time the
// config derives (mte.nd2nz_row_cycles, test_sim_nd2nz_rows.cpp). One Simulator per process,
// hence a file of its own.
#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>

#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using isa::Buf;
using npusim::test::counter;
using npusim::test::launch;

TEST_CASE("nd2nz: the DataCopy sample's GM -> L1 patterns in the order its msprof figures give") {
  // The row time the sample's Scenario 1 implies (configs/chips/910b.yaml, mte.nd2nz_row_cycles)
  // and the 128-byte L2 lines its msprof counts are in (a read of 128-byte rows fetches no more).
  Simulator s(load_chip_config("910b", {"mte.nd2nz_row_cycles=5.34", "memory.l2.line_bytes=128"}),
              SimOptions{});
  const ChipConfig& c = s.config();
  constexpr uint64_t kSrc = 0x200000;  // x in GM
  std::ifstream f(test::source_dir() + "/benchmarks/kernels/nd2nz_load.s");
  REQUIRE(f);
  std::stringstream src;
  src << f.rdbuf();
  isa::Program p = isa::assemble(src.str(), "nd2nz_load.s");
  const int cores = c.core_kind(isa::CoreKind::AIC)->count;
  REQUIRE(cores == 24);
  // MTE2 busy cycles per ND row, the mean over the cores, of one pattern: x is M x N fp16, tiles
  // tr x tc (args of nd2nz_load.s).
  struct Pattern {
    uint64_t m, n, tr, tc, every, stagger;
  };
  const auto per_row = [&](const Pattern& q) {
    KernelResult r = launch(s, p, {kSrc, q.m, q.n, q.tr, q.tc, q.every, q.stagger, 1, 1}, cores);
    REQUIRE(r.ok);
    const double rows_per_core = static_cast<double>(
        q.every ? q.m * ((q.n + q.tc - 1) / q.tc) : q.m / cores * ((q.n + q.tc - 1) / q.tc));
    double busy = 0;
    for (int i = 0; i < cores; ++i)
      busy += static_cast<double>(
          counter(r.counters, "chip.aic" + std::to_string(i) + ".mte2.busy_cycles"));
    return busy / cores / rows_per_core;
  };
  // The sample's scenarios at 1/4 of its matrix side (every core still loads whole 64-row bands).
  const double s1 = per_row({3072, 3072, 64, 64, 0, 0});   // 128-byte rows from HBM
  const double s2 = per_row({3072, 3072, 64, 256, 0, 0});  // 512-byte rows from HBM
  const double s6 = per_row({768, 512, 256, 64, 1, 0});    // every core, 128-byte rows, L2
  const double port = c.path_rate(Buf::GM, Buf::L1);
  // 24 ports at 32 B/cycle stay under HBM's sustained rate: the ports and the row issue bind.
  REQUIRE(cores * port < c.hbm_sustained_bytes_per_cycle());
  // Scenario 1 against 2: 128-byte rows take the row time, 512-byte rows their bytes at the
  // port; per byte, 1 is slower by 4 t / 16 (silicon: 283.508 / 214.519 us = 1.32).
  CHECK(s1 == Approx(c.nd2nz_row_cycles).epsilon(0.02));
  CHECK(s2 == Approx(512 / port).epsilon(0.02));
  CHECK(4 * s1 / s2 > 1.2);
  // Scenario 6 against 1: L2-resident 128-byte rows are no faster a row than HBM's (silicon:
  // 9.0 cycles a row against 5.3; the rest, same-line contention, is not modelled).
  CHECK(s6 >= 0.98 * s1);
}
