// The read/write mix of HBM (memory.hbm.turnaround_loss = λ): while a share f of the bytes in
// flight on HBM are writes, HBM moves B x (1 - λ x 2 min(f, 1 - f)), B the sustained rate;
// derived from the config (tiny at 1000 MHz, so GB/s = bytes per cycle; write-through L2, so a
// write that misses goes to HBM). One Simulator per process, hence a file of its own.
#include <catch2/catch.hpp>

#include <algorithm>

#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using isa::Buf;
using npusim::test::counter;
using npusim::test::run_aiv_body;

namespace {
constexpr double kBytes = 8192;  // each copy: 256 blocks of 32 B
}  // namespace

TEST_CASE("HBM turnaround: a read and a write in flight together share the mixed rate") {
  // HBM at 16 B/cycle, half the 32 B/cycle ports, so both copies are bound by HBM.
  Simulator s(load_chip_config("tiny", {"clock_mhz=1000", "memory.hbm.gbps=16",
                                        "memory.hbm.turnaround_loss=0.5"}),
              SimOptions{});
  const ChipConfig& c = s.config();
  REQUIRE(!c.l2_write_back);
  REQUIRE(c.hbm_efficiency == 1);
  const double b = c.hbm_sustained_bytes_per_cycle();
  REQUIRE(b == Approx(16));
  REQUIRE(b < c.path_rate(Buf::GM, Buf::UB));
  REQUIRE(b < c.path_rate(Buf::UB, Buf::GM));
  CHECK(c.hbm_mixed_bytes_per_cycle(0) == Approx(b));
  CHECK(c.hbm_mixed_bytes_per_cycle(1) == Approx(b));
  CHECK(c.hbm_mixed_bytes_per_cycle(0.5) == Approx(b * 0.5));
  CHECK(c.hbm_mixed_bytes_per_cycle(0.25) == Approx(b * 0.75));

  // MTE2 reads one region while MTE3 writes another: no flag between them, so both flows run
  // together, one direction each (f = 1/2) but for the cycle between their issues.
  KernelResult r = run_aiv_body(s,
                                "    movi x4, 0x400000\n"
                                "    copy_gm2ub x2, x1, 1, 256, 0, 0\n"
                                "    copy_ub2gm x4, x3, 1, 256, 0, 0\n",
                                0x200000);
  INFO(r.error);
  REQUIRE(r.ok);
  CHECK(counter(r.counters, "chip.hbm.read_bytes") == kBytes);
  CHECK(counter(r.counters, "chip.hbm.write_bytes") == kBytes);
  // Both directions' bytes at the mixed rate: twice the time they take at the one-way rate.
  CHECK(double(counter(r.counters, "chip.hbm.busy_cycles")) ==
        Approx(2 * kBytes / c.hbm_mixed_bytes_per_cycle(0.5)).margin(2));

  // A read alone is one-way: the full sustained rate.
  KernelResult one = run_aiv_body(s, "    copy_gm2ub x2, x1, 1, 256, 0, 0\n", 0x600000);
  INFO(one.error);
  REQUIRE(one.ok);
  CHECK(double(counter(one.counters, "chip.hbm.busy_cycles")) == Approx(kBytes / b).margin(1));
}

TEST_CASE("HBM turnaround: a bad memory.hbm.turnaround_loss is an error naming the key") {
  CHECK_THROWS_WITH(load_chip_config("tiny", {"memory.hbm.turnaround_loss=0.95"}),
                    Catch::Contains("memory.hbm.turnaround_loss"));
  CHECK_THROWS_WITH(load_chip_config("tiny", {"memory.hbm.turnaround_loss=-0.1"}),
                    Catch::Contains("memory.hbm.turnaround_loss"));
}
