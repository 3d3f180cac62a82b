// nd2nz's row issue (mte.nd2nz_row_cycles): an ND -> NZ load issues at most one ND row every
// nd2nz_row_cycles cycles, so a row takes max(its bytes at the phase's port rate, that), from
// HBM and from the L2 alike, derived from the config (test_sim_nd2nz_datacopy.cpp: the
// DataCopy sample's patterns on the 910b). One Simulator per process, hence a file of its own.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using isa::Buf;
using npusim::test::counter;
using npusim::test::launch;

namespace {
constexpr uint64_t kSrc = 0x200000;

// Busy cycles of aic `core`'s MTE2 pipe (its bandwidth phases).
double mte2_busy(const KernelResult& r, int core) {
  return static_cast<double>(
      counter(r.counters, "chip.aic" + std::to_string(core) + ".mte2.busy_cycles"));
}

// One block loads the same `rows` x `cols` fp16 rows (pitch 4096 elements) twice: the first
// nd2nz misses (HBM phase, at the gm->l1 path rate), the second hits the lines the first
// allocated (L2 phase, at the core's L2 read rate).
KernelResult load_twice(Simulator& s, int rows, int cols) {
  isa::Program p = isa::assemble(R"(
.arg src
.arg rows
.arg cols
.section aic
    ldarg x1, src
    ldarg x2, rows
    ldarg x3, cols
    movi x4, 4096
    movi x5, 0
    nd2nz.f16 x5, x1, x2, x3, x4, x2
    movi x5, 131072
    nd2nz.f16 x5, x1, x2, x3, x4, x2
    end
)",
                                 "nd2nz_twice.s");
  KernelResult r =
      launch(s, p, {kSrc, static_cast<uint64_t>(rows), static_cast<uint64_t>(cols)}, 1);
  REQUIRE(r.ok);
  return r;
}
}  // namespace

TEST_CASE("nd2nz: a row takes max(its bytes at the port rate, mte.nd2nz_row_cycles)") {
  // The row time the DataCopy sample implies (configs/chips/910b.yaml, mte.nd2nz_row_cycles).
  Simulator s(load_chip_config("tiny", {"clock_mhz=1000", "mte.nd2nz_row_cycles=5.34"}),
              SimOptions{});
  const ChipConfig& c = s.config();
  const double t = c.nd2nz_row_cycles, hbm_port = c.path_rate(Buf::GM, Buf::L1),
               l2_port = c.l2_read_bytes_per_cycle;
  // That row time lies between a 128-byte row's time at the HBM port and a 512-byte
  // row's, and above a 512-byte row's at the L2 port: each case below tests a different side.
  REQUIRE(t > 128 / hbm_port);
  REQUIRE(t < 512 / hbm_port);
  REQUIRE(t > 512 / l2_port);
  REQUIRE(c.hbm_bytes_per_cycle() > hbm_port);  // one core: HBM itself is not the bound
  const auto row = [&](double bytes, double port) { return std::max(bytes / port, t); };

  // 128-byte rows are issue-bound from HBM and from the L2.
  KernelResult narrow = load_twice(s, 64, 64);
  CHECK(mte2_busy(narrow, 0) == Approx(64 * row(128, hbm_port) + 64 * row(128, l2_port)).margin(2));
  CHECK(mte2_busy(narrow, 0) == Approx(128 * t).margin(2));
  // 512-byte rows: the HBM port binds the first load, the row issue the second (each launch
  // starts with a cold L2).
  KernelResult wide = load_twice(s, 64, 256);
  CHECK(mte2_busy(wide, 0) == Approx(64 * 512 / hbm_port + 64 * t).margin(2));
}
