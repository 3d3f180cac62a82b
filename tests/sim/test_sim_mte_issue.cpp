// The DMA's issue of a GM <-> UB / L1 copy (mte.copy_issue_cycles, mte.burst_cycles): the pipe
// spends at least copy_issue_cycles + burst_cycles x the copy's GM bursts on it (each contiguous
// GM run cut at 512-byte boundaries), the memory system's flow otherwise, each derived from the
// config: strided rows one burst each, contiguous rows one run of bursts. One Simulator per
// process, hence a file of its own.
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
constexpr uint64_t kSrc = 0x200000;  // 512-byte aligned GM (a 128 KiB range of it is used)

// Busy cycles of `pipe` ("mte2", "mte3") of core `core` ("aiv0", "aic0") in a launch of `body`
// (assembly lines after x1 = kSrc + offset, x2 = 0) on that core's section.
double pipe_busy(Simulator& s, const std::string& section, const std::string& body,
                 const std::string& core, const std::string& pipe, uint64_t offset = 0) {
  isa::Program p = isa::assemble(".arg src\n.section " + section +
                                     "\n    ldarg x1, src\n    movi x2, 0\n" + body + "    end\n",
                                 "issue.s");
  KernelResult r = launch(s, p, {kSrc + offset}, 1);
  REQUIRE(r.ok);
  return static_cast<double>(counter(r.counters, "chip." + core + "." + pipe + ".busy_cycles"));
}
}  // namespace

TEST_CASE("MTE copies: the pipe takes max(issue + bursts x burst time, the flow's time)") {
  // (one Simulator for every section: SystemC elaborates once per process)
  static Simulator s(load_chip_config("tiny", {"clock_mhz=1000", "mte.copy_issue_cycles=12",
                                               "mte.burst_cycles=6"}),
                     SimOptions{});
  const ChipConfig& c = s.config();
  const double issue = c.copy_issue_cycles, burst = c.burst_cycles;
  const double gm_ub = c.path_rate(Buf::GM, Buf::UB), ub_gm = c.path_rate(Buf::UB, Buf::GM),
               gm_l1 = c.path_rate(Buf::GM, Buf::L1);
  // One core, a cold L2: every copy below misses and moves at its path's rate (HBM is not the
  // bound), its line fills beside it.
  REQUIRE(c.hbm_bytes_per_cycle() > 4 * std::max({gm_ub, ub_gm, gm_l1}));
  const auto pipe = [&](double bursts, double bytes, double rate) {
    return std::max(issue + bursts * burst, bytes / rate);
  };

  SECTION("GM -> UB") {
    // One 128-byte row: one burst, issue-bound.
    REQUIRE(issue + burst > 128 / gm_ub);
    CHECK(pipe_busy(s, "aiv", "    copy_gm2ub x2, x1, 1, 4, 0, 0\n", "aiv0", "mte2") ==
          Approx(issue + burst).margin(1));
    // 64 rows of 128 B 24 KiB apart: a burst each, issue-bound.
    const double strided = pipe(64, 64 * 128, gm_ub);
    REQUIRE(strided == issue + 64 * burst);
    CHECK(pipe_busy(s, "aiv", "    copy_gm2ub x2, x1, 64, 4, 764, 0\n", "aiv0", "mte2") ==
          Approx(strided).margin(1));
    // The same 64 rows contiguous: one 8 KiB run of 16 bursts, bound by the path.
    const double dense = pipe(16, 64 * 128, gm_ub);
    REQUIRE(dense == 64 * 128 / gm_ub);
    CHECK(pipe_busy(s, "aiv", "    copy_gm2ub x2, x1, 64, 4, 0, 0\n", "aiv0", "mte2") ==
          Approx(dense).margin(1));
    // 512 bytes from a 512-byte boundary are one burst, from 256 bytes past it two.
    REQUIRE(issue + burst > 512 / gm_ub);
    CHECK(pipe_busy(s, "aiv", "    copy_gm2ub x2, x1, 1, 16, 0, 0\n", "aiv0", "mte2") ==
          Approx(issue + burst).margin(1));
    CHECK(pipe_busy(s, "aiv", "    copy_gm2ub x2, x1, 1, 16, 0, 0\n", "aiv0", "mte2", 256) ==
          Approx(issue + 2 * burst).margin(1));
  }
  SECTION("copies queued behind a long flow have issued their requests meanwhile") {
    // 32 KiB contiguous (64 bursts: bound by the path), then 8 one-row copies 24 KiB apart
    // past it, queued while it flows: their requests go out during that flow, so each then
    // holds the pipe for its own flow only, not issue + burst.
    const double first = pipe(64, 32768, gm_ub), row = 128 / gm_ub;
    REQUIRE(first == 32768 / gm_ub);
    REQUIRE(issue + 64 * burst + 8 * (issue + burst) < first);
    std::string body =
        "    copy_gm2ub x2, x1, 1, 1024, 0, 0\n    movi x6, 24576\n    add x5, x1, x6\n";
    for (int i = 0; i < 8; ++i) body += "    add x5, x5, x6\n    copy_gm2ub x2, x5, 1, 4, 0, 0\n";
    CHECK(pipe_busy(s, "aiv", body, "aiv0", "mte2") == Approx(first + 8 * row).margin(2));
  }
  SECTION("UB -> GM (MTE3)") {
    const double strided = pipe(64, 64 * 128, ub_gm);
    REQUIRE(strided == issue + 64 * burst);
    CHECK(pipe_busy(s, "aiv", "    copy_ub2gm x1, x2, 64, 4, 0, 764\n", "aiv0", "mte3") ==
          Approx(strided).margin(1));
    // 16 KiB contiguous: 32 bursts, bound by the path.
    const double dense = pipe(32, 16384, ub_gm);
    REQUIRE(dense == 16384 / ub_gm);
    CHECK(pipe_busy(s, "aiv", "    copy_ub2gm x1, x2, 1, 512, 0, 0\n", "aiv0", "mte3") ==
          Approx(dense).margin(1));
  }
  SECTION("nd2nz: strided rows a burst each, contiguous rows one run") {
    // 64 rows of 64 fp16 (128 B), pitch 12288 elements (24 KiB): 64 bursts.
    const std::string load = "    movi x3, 64\n    movi x4, 64\n    movi x6, ";
    const double strided = pipe(64, 64 * 128, gm_l1);
    REQUIRE(strided == issue + 64 * burst);
    CHECK(pipe_busy(s, "aic", load + "12288\n    nd2nz.f16 x2, x1, x3, x4, x6, x3\n", "aic0",
                    "mte2") == Approx(strided).margin(1));
    // The same rows contiguous (pitch 64): one 8 KiB run, 16 bursts, bound by the path.
    const double dense = pipe(16, 64 * 128, gm_l1);
    REQUIRE(dense == 64 * 128 / gm_l1);
    CHECK(pipe_busy(s, "aic", load + "64\n    nd2nz.f16 x2, x1, x3, x4, x6, x3\n", "aic0",
                    "mte2") == Approx(dense).margin(1));
  }
}
