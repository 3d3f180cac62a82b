// The L2 kept within a graph run (memory.l2.keep_within_graph_run, KernelLaunch::l2_run): the
// run's launches share one L2, cold at the run's first launch, its lines filed by allocation
// block with one placement for the whole run; a launch in no run gets a cold L2 of its own and
// leaves the run's as it was. The tiny preset with a direct-mapped 4 KiB L2 (8 sets of one
// 512-byte line; write-through, a write miss allocates under the normal policy); expectations
// are counts of L2 lines derived from it. Replay runs in check mode here: every replayed launch
// is simulated again from the same state and must give the same cycles, counters and memory
// (ChipLauncher::check_replay throws otherwise); test_sim_l2_graph_run_replay.cpp replays with
// replay on. test_sim_l2_graph_run_off.cpp has the key off.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::counter;
using npusim::test::lookup_of;
using npusim::test::move_lines;
using npusim::test::run_in_graph_run;

namespace {

SimOptions replay_checked() {
  SimOptions o;
  o.replay = SimOptions::Replay::check;
  return o;
}

Simulator& sim() {
  static Simulator s(load_chip_config("tiny", {"memory.l2.bytes=4 KiB", "memory.l2.ways=1",
                                               "memory.l2.keep_within_graph_run=true"}),
                     replay_checked());
  return s;
}

constexpr int kLines = 4;               // each launch moves 4 lines (half the L2)
constexpr uint64_t kBlockBytes = 2048;  // each tensor's allocation block: exactly its lines
const isa::Program& producer() {
  static const isa::Program p = move_lines(kLines, true);
  return p;
}
const isa::Program& consumer() {
  static const isa::Program p = move_lines(kLines, false);
  return p;
}

constexpr uint64_t kOut = 0x100000, kOther = 0x200000;
const GmBlockLookup& blocks() {
  static const GmBlockLookup b = lookup_of({{kOut, kBlockBytes}, {kOther, kBlockBytes}});
  return b;
}

KernelResult run(const isa::Program& p, uint64_t a, uint64_t l2_run,
                 const GmBlockLookup& bl = blocks()) {
  return run_in_graph_run(sim(), p, a, l2_run, bl);
}

}  // namespace

TEST_CASE("config assumptions of these tests") {
  const ChipConfig& cfg = sim().config();
  CHECK(cfg.l2_keep_within_graph_run);
  CHECK_FALSE(cfg.l2_keep_across_launches);
  CHECK(cfg.l2_line_bytes == 512);
  CHECK(cfg.l2_bytes / (cfg.l2_line_bytes * cfg.l2_ways) == 8);
}

TEST_CASE("graph run: the second launch hits on the first's output; the next run starts cold") {
  const KernelResult w = run(producer(), kOut, 7);
  CHECK(counter(w.counters, "chip.l2.misses") == kLines);
  const KernelResult r = run(consumer(), kOut, 7);
  CHECK(counter(r.counters, "chip.l2.hits") == kLines);
  CHECK(counter(r.counters, "chip.l2.misses") == 0);
  const KernelResult next = run(consumer(), kOut, 8);
  CHECK(counter(next.counters, "chip.l2.hits") == 0);
  CHECK(counter(next.counters, "chip.l2.misses") == kLines);
  CHECK(next.cycles > r.cycles);
}

TEST_CASE("graph run: a launch outside the run neither sees nor disturbs the run's L2") {
  // Alone: what an eager consumer of kOut counts on a cold L2.
  const KernelResult cold = run(consumer(), kOut, 0);
  CHECK(counter(cold.counters, "chip.l2.misses") == kLines);

  run(producer(), kOut, 21);
  // Between the run's launches: an eager launch reading the run's output starts cold, and one
  // writing another tensor (filed at the run's L2 addresses it would take the run's sets: the
  // first block of each launch is packed at the same base) leaves the run's L2 alone.
  const KernelResult eager = run(consumer(), kOut, 0);
  CHECK(counter_digest(eager.counter_delta) == counter_digest(cold.counter_delta));
  CHECK(eager.cycles == cold.cycles);
  run(producer(), kOther, 0);
  // So does a launch of another run (its state is set aside, then comes back).
  run(producer(), kOther, 22);
  const KernelResult r = run(consumer(), kOut, 21);
  CHECK(counter(r.counters, "chip.l2.hits") == kLines);
  CHECK(counter(r.counters, "chip.l2.misses") == 0);
  // The other run's L2 kept its own output.
  const KernelResult other = run(consumer(), kOther, 22);
  CHECK(counter(other.counters, "chip.l2.hits") == kLines);

  // The same run without the launches between: the run's consumer counts alike.
  run(producer(), kOut, 23);
  const KernelResult plain = run(consumer(), kOut, 23);
  CHECK(counter_digest(plain.counter_delta) == counter_digest(r.counter_delta));
  CHECK(plain.cycles == r.cycles);
}

TEST_CASE("graph run: a host copy into a block the run placed drops its lines") {
  run(producer(), kOut, 31);
  // Over the output's last two lines (filed at the run's L2 addresses, not at kOut).
  std::vector<uint8_t> host(2 * 512, 3);
  sim().copy_host_to_device(kOut + 2 * 512, host.data(), host.size());
  const KernelResult r = run(consumer(), kOut, 31);
  CHECK(counter(r.counters, "chip.l2.hits") == 2);
  CHECK(counter(r.counters, "chip.l2.misses") == 2);
}

TEST_CASE("graph run: the outcome does not depend on where the allocator put the blocks") {
  // The run writes A, then B, then reads A. Filed at device addresses, B 4 KiB above A would
  // take A's sets (a direct-mapped 4 KiB L2) and the read would miss; B 1 KiB above A would
  // leave two of its lines. Filed by block over the run, A's block takes the first 2 KiB of
  // the packed range and B's the next: the read hits every line at every placement.
  constexpr uint64_t kA = 0x300000;
  const uint64_t bs[] = {kA + 4096, kA + 1024 + kBlockBytes, kA - 0x10000};
  std::vector<KernelResult> rs;
  for (size_t i = 0; i < 3; ++i) {
    const GmBlockLookup bl = lookup_of({{kA, kBlockBytes}, {bs[i], kBlockBytes}});
    const uint64_t l2_run = 41 + i;
    run(producer(), kA, l2_run, bl);
    run(producer(), bs[i], l2_run, bl);
    rs.push_back(run(consumer(), kA, l2_run, bl));
  }
  for (const KernelResult& r : rs) {
    CHECK(counter(r.counters, "chip.l2.hits") == kLines);
    CHECK(counter_digest(r.counter_delta) == counter_digest(rs[0].counter_delta));
    CHECK(r.cycles == rs[0].cycles);
  }
}

TEST_CASE("graph run: a second step replays, as simulating it would give") {
  // Two steps of a run of four launches, the second at other tensor addresses (as a training
  // step's). In check mode each replay is simulated again and compared (a difference throws);
  // every launch of the second step replays, after its check against the run's L2 as it stands.
  const uint64_t base[] = {0x400000, 0x500000};
  std::vector<KernelResult> step[2];
  for (int s = 0; s < 2; ++s) {
    const uint64_t a = base[s], b = base[s] + 0x10000;
    const GmBlockLookup bl = lookup_of({{a, kBlockBytes}, {b, kBlockBytes}});
    const uint64_t l2_run = 51 + static_cast<uint64_t>(s);
    for (const auto& [program, arg] : {std::pair{&producer(), a}, std::pair{&consumer(), a},
                                       std::pair{&producer(), b}, std::pair{&consumer(), a}})
      step[s].push_back(run(*program, arg, l2_run, bl));
  }
  for (size_t i = 0; i < 4; ++i) {
    INFO("launch " << i);
    CHECK(step[1][i].replayed);
    CHECK(step[1][i].cycles == step[0][i].cycles);
    CHECK(counter_digest(step[1][i].counter_delta) == counter_digest(step[0][i].counter_delta));
  }
  CHECK(counter(step[0][1].counters, "chip.l2.hits") == kLines);
  CHECK(counter(step[0][3].counters, "chip.l2.hits") == kLines);
}
