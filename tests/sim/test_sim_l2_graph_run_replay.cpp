// Launch replay inside graph runs with memory.l2.keep_within_graph_run (replay on, as
// functional runs have it): a replayed launch of a run leaves the run's L2 tags and block
// placement as simulating it would have (ChipLauncher::begin installs the checked copies), so
// the launches after it, replayed or simulated, count what they would have. The tiny preset
// with a direct-mapped 4 KiB L2 (8 sets of one 512-byte line), as test_sim_l2_graph_run.cpp
// (which compares every replay with simulating it, in check mode).
#include <catch2/catch.hpp>

#include <utility>
#include <vector>

#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::counter;
using npusim::test::lookup_of;
using npusim::test::move_lines;
using npusim::test::run_in_graph_run;

TEST_CASE("graph run: replayed launches leave the run's L2 as simulating would") {
  static Simulator sim(load_chip_config("tiny", {"memory.l2.bytes=4 KiB", "memory.l2.ways=1",
                                                 "memory.l2.keep_within_graph_run=true"}),
                       SimOptions{});
  constexpr int kLines = 4;
  constexpr uint64_t kBlockBytes = kLines * 512;
  const isa::Program producer = move_lines(kLines, true), consumer = move_lines(kLines, false);
  // Reads the first half of a tensor: in the last step only, so it is simulated there.
  const isa::Program half = move_lines(kLines / 2, false);
  // Three steps of one run each at other tensor addresses (as a training step's): write a,
  // read a, write b, read a; the third step then reads half of b.
  std::vector<KernelResult> step[3];
  KernelResult last;
  for (int s = 0; s < 3; ++s) {
    const uint64_t a = 0x400000 + 0x100000 * static_cast<uint64_t>(s), b = a + 0x10000;
    const GmBlockLookup bl = lookup_of({{a, kBlockBytes}, {b, kBlockBytes}});
    const uint64_t l2_run = 1 + static_cast<uint64_t>(s);
    for (const auto& [program, arg] : {std::pair{&producer, a}, std::pair{&consumer, a},
                                       std::pair{&producer, b}, std::pair{&consumer, a}})
      step[s].push_back(run_in_graph_run(sim, *program, arg, l2_run, bl));
    if (s == 2) last = run_in_graph_run(sim, half, b, l2_run, bl);
  }
  // The first step's first two launches are simulated (its last two replay the recordings of
  // the first two, after their check); every later launch replays with the same cycles and
  // counters, each producer missing every line and each consumer hitting every line.
  CHECK_FALSE(step[0][0].replayed);
  CHECK_FALSE(step[0][1].replayed);
  for (size_t i = 0; i < 4; ++i)
    CHECK(counter(step[0][i].counters, i % 2 ? "chip.l2.hits" : "chip.l2.misses") == kLines);
  for (int s = 1; s < 3; ++s)
    for (size_t i = 0; i < 4; ++i) {
      INFO("step " << s << ", launch " << i);
      CHECK(step[s][i].replayed);
      CHECK(step[s][i].cycles == step[0][i].cycles);
      CHECK(counter_digest(step[s][i].counter_delta) == counter_digest(step[0][i].counter_delta));
    }
  // Simulated after four replays: b's lines are where the replayed producer left them, at the
  // L2 addresses the run's placement gave b (a's block first, then b's: sets 4 to 7).
  CHECK_FALSE(last.replayed);
  CHECK(counter(last.counters, "chip.l2.hits") == kLines / 2);
  CHECK(counter(last.counters, "chip.l2.misses") == 0);
}
