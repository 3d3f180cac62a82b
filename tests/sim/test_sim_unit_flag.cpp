// UnitFlag between the cube and FIXPIPE on the tiny split chip (docs/chip_model.md "UnitFlag"):
// a fixpipe .uf3 starts once its tile's mmad chain has begun and moves the tile as the chain's
// last mmad completes it, 512 L0C bytes at a time, so it overlaps that mmad; the tile stays
// busy until the fixpipe has drained it. The cycles saved against the same kernel synchronised
// by flags are derived from the config's cube and FIXPIPE costs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "isa/assembler.h"
#include "isa/layout.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::counter;
using npusim::test::launch;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny"), SimOptions{});
  return s;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A tile of m x n (f32 in L0C) accumulated over `mmads` mmads of k each (f16 inputs), then one
// fixpipe of it into L1 as out_type (ND). unit_flag: the mmads carry .uf2 / .uf3 and the
// fixpipe .uf3; else an M -> FIX flag hands the tile over after the last mmad.
isa::Program tile_kernel(int64_t m, int64_t k, int64_t n, int mmads, const char* out_type,
                         bool unit_flag) {
  std::string body = "    movi x1, 0\n    movi x2, 0\n    movi x3, 0\n    movi x4, 0\n";
  for (int i = 0; i < mmads; ++i)
    body += fmt::format("    mmad.f16{} x1, x2, x3, {}, {}, {}, {}, x0\n",
                        unit_flag ? (i + 1 == mmads ? ".uf3" : ".uf2") : "", m, k, n,
                        i == 0 ? 0 : 1);
  if (!unit_flag) body += "    set_flag m, fix, 0\n    wait_flag m, fix, 0\n";
  body += fmt::format("    fixpipe.f32.{}{} l1, x4, x1, {}, {}, {}, 1, 0, x0\n", out_type,
                      unit_flag ? ".uf3" : "", m, n, n);
  return isa::assemble(".section aic\n" + body + "    end\n", "tile.s");
}

// One f16 mmad's cycles and one fixpipe's (L0C -> L1) from the config (sim/exec: the cube's
// latency plus its 16x16x16 steps; the path's latency plus its bytes at its rate).
struct Costs {
  double mmad, fixpipe, unit_share;  // unit_share: 512 B over the tile's L0C bytes
};
Costs costs(const ChipConfig& cfg, int64_t m, int64_t k, int64_t n, int out_bytes) {
  Costs c;
  c.mmad = cfg.cube_latency_cycles + static_cast<double>(ceil_div(m, cfg.cube_m) *
                                                         ceil_div(k, cfg.cube_k) *
                                                         ceil_div(n, cfg.cube_n));
  c.fixpipe = cfg.path_latency(isa::Buf::L0C, isa::Buf::L1) +
              std::ceil(static_cast<double>(m * n * out_bytes) /
                        cfg.path_rate(isa::Buf::L0C, isa::Buf::L1));
  c.unit_share = 512.0 / static_cast<double>(layout::l0c_extent(m, n) * 4);
  return c;
}

}  // namespace

TEST_CASE("unit flag: FIXPIPE overlaps the chain's last mmad by the derived cycles") {
  const ChipConfig& cfg = sim().config();
  struct Case {
    int64_t m, k, n;
    const char* out;
    int out_bytes;
  };
  // FIXPIPE shorter than the mmad (the tile's last unit leaves after the mmad ends), and the
  // mmad shorter than FIXPIPE (FIXPIPE's own time bounds it, from the first unit on).
  for (const Case& c : {Case{32, 256, 64, "f16", 2}, Case{32, 16, 32, "f32", 4}}) {
    INFO(fmt::format("{}x{}x{} -> {}", c.m, c.k, c.n, c.out));
    const Costs t = costs(cfg, c.m, c.k, c.n, c.out_bytes);
    const isa::Program flags = tile_kernel(c.m, c.k, c.n, 4, c.out, false);
    const isa::Program uf = tile_kernel(c.m, c.k, c.n, 4, c.out, true);
    const KernelResult a = launch(sim(), flags, {}, 1);
    const KernelResult b = launch(sim(), uf, {}, 1);
    REQUIRE(a.ok);
    REQUIRE(b.ok);
    // With flags the fixpipe runs after the last mmad: last mmad + fixpipe. With the unit
    // flag it ends at the later of (first unit + the fixpipe) and (the mmad's end + the last
    // unit's share of the fixpipe): it saves (1 - share) x min(mmad, fixpipe).
    const double saved = (1 - t.unit_share) * std::min(t.mmad, t.fixpipe);
    CHECK(a.cycles - b.cycles == static_cast<uint64_t>(std::llround(saved)));
    // The fixpipe is in flight from its start through the mmad it overlaps: longer than alone.
    CHECK(counter(a.counters, "chip.aic0.fix.inflight_cycles") ==
          static_cast<uint64_t>(t.fixpipe));
    CHECK(counter(b.counters, "chip.aic0.fix.inflight_cycles") >
          static_cast<uint64_t>(t.fixpipe + t.unit_share * t.mmad));
    // No M -> FIX flag was waited for.
    CHECK(counter(b.counters, "chip.aic0.fix.stall.flag_wait") <
          counter(a.counters, "chip.aic0.fix.stall.flag_wait"));
  }
}

TEST_CASE("unit flag: the L0C tile is busy until FIXPIPE has drained it") {
  // Two chains into the same tile, each drained by a fixpipe .uf3. Without a FIX -> M flag the
  // second chain's mmad still waits for the first fixpipe: the run takes exactly as long as
  // the same kernel with the flag.
  auto two_chains = [](bool fix_to_m_flag) {
    std::string body =
        "    movi x1, 0\n    movi x2, 0\n    movi x3, 0\n    movi x4, 0\n"
        "    mmad.f16.uf2 x1, x2, x3, 32, 256, 64, 0, x0\n"
        "    mmad.f16.uf3 x1, x2, x3, 32, 256, 64, 1, x0\n"
        "    fixpipe.f32.f16.uf3 l1, x4, x1, 32, 64, 64, 1, 0, x0\n";
    if (fix_to_m_flag) body += "    set_flag fix, m, 0\n    wait_flag fix, m, 0\n";
    body +=
        "    mmad.f16.uf3 x1, x2, x3, 32, 256, 64, 0, x0\n"
        "    fixpipe.f32.f16.uf3 l1, x4, x1, 32, 64, 64, 1, 0, x0\n";
    return isa::assemble(".section aic\n" + body + "    end\n", "two.s");
  };
  const KernelResult with_flag = launch(sim(), two_chains(true), {}, 1);
  const KernelResult without = launch(sim(), two_chains(false), {}, 1);
  REQUIRE(with_flag.ok);
  REQUIRE(without.ok);
  CHECK(without.cycles == with_flag.cycles);
  // The second chain's mmad waited (a stall of the M pipe, counted as a flag wait).
  CHECK(counter(without.counters, "chip.aic0.m.stall.flag_wait") > 0);
}

TEST_CASE("unit flag: a fixpipe .uf3 whose tile no chain writes is a deadlock naming it") {
  // The verifier sees an mmad .uf3 before the fixpipe; which tile each names is a run-time
  // value, so the simulator reports the wait.
  const isa::Program p = isa::assemble(R"(
.section aic
    movi x1, 0
    movi x2, 0
    movi x5, 16384
    mmad.f16.uf3 x1, x2, x2, 16, 16, 16, 0, x0
    fixpipe.f32.f16.uf3 l1, x2, x5, 16, 16, 16, 1, 0, x0
    end
)", "stray.s");
  const KernelResult r = launch(sim(), p, {}, 1);
  CHECK_FALSE(r.ok);
  CHECK_THAT(r.error, Catch::Contains("deadlock: core aic0 pc 4 (stray.s:7) fixpipe.f32.f16.uf3") &&
                          Catch::Contains("waits on its L0C tile's unit flag"));
}
