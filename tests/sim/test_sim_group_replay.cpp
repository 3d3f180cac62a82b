// Replay of a repeated launch group (Simulator::run_concurrent, sim/replay/group_replay.h) in a
// timing-only simulator on the tiny split chip: the same group a second time is replayed and
// gives the first run's records (each launch's start after the group's, cycles, counters; the
// group's makespan and counters; the chip's counters move alike) and writes its outputs'
// ranges undefined again; a group whose arguments moved by whole blocks (each in a block of the
// same size at the same offset) replays with the same records, writing at the new addresses,
// while one that differs in an argument's offset in its block, one `after` edge or one
// argument's block extent is simulated; a group with a launch whose loaded value steers it
// replays where the bytes its ld reads before the group writes them are the recorded ones;
// blocks overlapping a planned buffer are keyed at their addresses (check mode:
// tests/sim/test_sim_group_replay_check.cpp). A group whose arguments share blocks otherwise
// than in its last recording is simulated, its replay log naming the argument.
// The written ranges a replay invalidates, normalized, do what the ranges one by one do.
// A simulated group's replay log lines count its CPU time once, on its first line.
#include <time.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "sim/replay/group_replay.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::counter;
using npusim::test::kernel_launch;
using npusim::test::lookup_of;
using npusim::test::read_gm;
using npusim::test::vadd;
using npusim::test::write_gm;

namespace {

// The replay log every group of this process appends to (SimOptions::replay_log).
const std::string& replay_log() {
  static const std::string path = (std::filesystem::temp_directory_path() /
                                   ("npusim_group_replay_log_" + std::to_string(getpid()) + ".tsv"))
                                      .string();
  return path;
}

Simulator& sim() {
  static Simulator s(load_chip_config("tiny"), [] {
    SimOptions o;
    o.functional = false;  // groups replay in a timing-only simulator
    o.replay_log = replay_log();
    return o;
  }());
  return s;
}

uint64_t thread_cpu_us() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000 + static_cast<uint64_t>(t.tv_nsec) / 1000;
}

constexpr uint64_t kN = 32768;  // fp16 elements per operand
constexpr uint64_t kX = 0x1000000, kY = 0x1100000, kZ = 0x1200000, kW = 0x1300000;
constexpr uint64_t kU = 0x2000000, kV = 0x2400000;
constexpr uint64_t kU2 = 0x2600000;    // a block of u's size, where a test moves u's second use
constexpr uint64_t kBlock = 0x100000;  // each operand's allocation block (kCN * 2 for U and V)
constexpr uint64_t kCN = 8 * kN;

// z = x + y, then w = z + y after it (a stream), and v = u + u beside both; each takes its
// cores when ready, as the runtime's launch groups do. `w_after`: w's `after` edges.
// The other blocks (kMoved..., of kBlock each) are where a test moves z.
constexpr uint64_t kMoved = 0x1400000, kMoved2 = 0x1500000;
std::vector<ConcurrentLaunch> group(uint64_t z = kZ, std::vector<size_t> w_after = {0},
                                    uint64_t u_block = 2 * kCN) {
  const GmBlockLookup blocks = lookup_of({{kX, kBlock},
                                          {kY, kBlock},
                                          {kZ, kBlock},
                                          {kW, kBlock},
                                          {kU, u_block},
                                          {kV, 2 * kCN},
                                          {kU2, 2 * kCN},
                                          {kMoved, kBlock},
                                          {kMoved2, kBlock}});
  std::vector<ConcurrentLaunch> g = {
      {kernel_launch(vadd(), {kX, kY, z, kN}, 2), {}, {}},
      {kernel_launch(vadd(), {z, kY, kW, kN}, 2), {}, std::move(w_after)},
      {kernel_launch(vadd(), {kU, kU, kV, kCN}, 2), {}, {}},
  };
  for (ConcurrentLaunch& c : g) {
    c.take_cores_when_ready = true;
    c.launch.gm_blocks = blocks;
  }
  return g;
}

// A group's results, each launch's start relative to the group's.
struct Records {
  std::vector<uint64_t> starts, cycles;
  std::vector<nlohmann::json> counters;
  uint64_t makespan = 0;
  nlohmann::json group_counters;
  nlohmann::json chip_delta;  // the chip's whole counter tree's growth over the group
  std::vector<bool> replayed;
};

uint64_t total_cycles(const nlohmann::json& tree) { return counter(tree, "chip.total_cycles"); }

Records run(const std::vector<ConcurrentLaunch>& g) {
  const nlohmann::json before = sim().counters();
  ConcurrentResult r = sim().run_concurrent(g);
  Records out;
  for (const KernelResult& k : r.launches) {
    REQUIRE(k.ok);
    out.starts.push_back(k.start_cycle - r.start_cycle);
    out.cycles.push_back(k.cycles);
    out.counters.push_back(k.counters);
    out.replayed.push_back(k.replayed);
  }
  out.makespan = r.cycles;
  out.group_counters = r.counters.tree();
  const nlohmann::json after = sim().counters();
  // The chip's counters as every summed leaf's growth.
  out.chip_delta = nlohmann::json::object();
  const nlohmann::json a = after.flatten(), b = before.flatten();
  for (auto it = a.begin(); it != a.end(); ++it) {
    if (it.key().size() < 6 || it.key().compare(it.key().size() - 6, 6, "/value") != 0) continue;
    // A high-water counter reports its maximum since construction: no growth to compare.
    if (it.key().find("high_water") != std::string::npos) continue;
    const uint64_t was = b.contains(it.key()) ? b[it.key()].get<uint64_t>() : 0;
    out.chip_delta[it.key()] = it.value().get<uint64_t>() - was;
  }
  return out;
}

// Counters are registered on first use: one missing from a tree grew by 0. A counter kept in ps
// reports its total in rounded cycles, so the growth of two reads of the total may differ by one
// from the same raw growth (the launches' own deltas above compare exactly).
bool same_growth(const nlohmann::json& a, const nlohmann::json& b) {
  for (const auto* x : {&a, &b}) {
    const nlohmann::json& y = x == &a ? b : a;
    for (auto it = x->begin(); it != x->end(); ++it) {
      const uint64_t u = y.contains(it.key()) ? y[it.key()].get<uint64_t>() : 0;
      const uint64_t v = it.value().get<uint64_t>();
      if (u > v + 1 || v > u + 1) {
        UNSCOPED_INFO(it.key() << " grew by " << v << " against " << u);
        return false;
      }
    }
  }
  return true;
}

void require_same(const Records& a, const Records& b) {
  REQUIRE(a.starts == b.starts);
  REQUIRE(a.cycles == b.cycles);
  REQUIRE(a.makespan == b.makespan);
  for (size_t i = 0; i < a.counters.size(); ++i) REQUIRE(a.counters[i] == b.counters[i]);
  REQUIRE(a.group_counters == b.group_counters);
  REQUIRE(same_growth(a.chip_delta, b.chip_delta));
}

bool none_replayed(const Records& r) {
  for (bool b : r.replayed)
    if (b) return false;
  return true;
}

}  // namespace

TEST_CASE("the same group again is replayed with the first run's records and effects") {
  const Records first = run(group());
  REQUIRE(none_replayed(first));
  // The launches overlap (v = u + u beside the stream) and w starts at z's end: a group's
  // timing, not one launch's.
  REQUIRE(first.starts[1] > 0);
  REQUIRE(first.starts[2] == 0);
  REQUIRE(total_cycles(first.group_counters) > 0);

  // Bytes the host writes into the outputs: the replay writes them undefined again (a
  // timing-only kernel's output reads as zero) and stamps their write epochs.
  write_gm(sim(), kW, std::vector<uint16_t>(kN, 0x3c00));
  write_gm(sim(), kV, std::vector<uint16_t>(kCN, 0x3c00));
  const uint64_t epoch = sim().gm().advance_write_epoch();
  REQUIRE(sim().gm().holds_data(kW, kN * 2));

  const uint64_t t0 = sim().now_cycles();
  const Records second = run(group());
  REQUIRE(second.replayed == std::vector<bool>{true, true, true});
  require_same(first, second);
  // Simulated time moved on as simulating the group would have.
  REQUIRE(sim().now_cycles() - t0 >= second.makespan);
  REQUIRE(read_gm<uint16_t>(sim(), kW, kN) == std::vector<uint16_t>(kN, 0));
  REQUIRE(read_gm<uint16_t>(sim(), kV, kCN) == std::vector<uint16_t>(kCN, 0));
  REQUIRE(sim().gm().last_write_epoch(kW, kN * 2) > epoch);
  REQUIRE(sim().gm().last_write_epoch(kZ, kN * 2) > epoch);
  REQUIRE(sim().gm().last_write_epoch(kX, kN * 2) <= epoch);  // an input: not written
}

TEST_CASE("a group whose arguments moved by whole blocks replays, writing at the new place") {
  const Records base = run(group());
  REQUIRE(base.replayed == std::vector<bool>{true, true, true});  // recorded by the test above
  // z (and w's input) in another block of the same size, at the same offset: every range z's
  // member touches moves with the block, so under the L2's filing by block it keeps its L2
  // address and the group its timing.
  write_gm(sim(), kMoved, std::vector<uint16_t>(kN, 0x3c00));
  const uint64_t epoch = sim().gm().advance_write_epoch();
  const Records moved = run(group(kMoved));
  REQUIRE(moved.replayed == std::vector<bool>{true, true, true});
  require_same(base, moved);
  // Its writes moved with it: z's new range written undefined, its old one not.
  REQUIRE(read_gm<uint16_t>(sim(), kMoved, kN) == std::vector<uint16_t>(kN, 0));
  REQUIRE(sim().gm().last_write_epoch(kMoved, kN * 2) > epoch);
  REQUIRE(sim().gm().last_write_epoch(kZ, kN * 2) <= epoch);
}

TEST_CASE("a group differing in one argument's offset, one edge or one block extent is simulated") {
  const Records base = run(group());
  // z at another offset in its block: its lines fall elsewhere in the L2, so its key differs:
  // simulated, then itself replayed.
  const Records moved = run(group(kMoved2 + 0x80000));
  REQUIRE(none_replayed(moved));
  REQUIRE(run(group(kMoved2 + 0x80000)).replayed == std::vector<bool>{true, true, true});
  // w waiting for nothing: it overlaps z now, so its start moves.
  const Records unordered = run(group(kZ, {}));
  REQUIRE(none_replayed(unordered));
  REQUIRE(unordered.starts[1] == 0);
  // The same addresses in a larger block for u: its lines are filed by block, so the key
  // holds the block's extent.
  const Records bigger = run(group(kZ, {0}, 4 * kCN));
  REQUIRE(none_replayed(bigger));
  // The original group is still replayed, with its records.
  const Records again = run(group());
  REQUIRE(again.replayed == std::vector<bool>{true, true, true});
  require_same(base, again);
}

namespace {

// The replay log's lines, each split into its fields (kernel, block_dim, cycles, CPU
// microseconds, verdict, detail).
std::vector<std::vector<std::string>> replay_log_lines() {
  std::ifstream in(replay_log());
  std::vector<std::vector<std::string>> lines;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> fields;
    std::stringstream ss(line);
    for (std::string f; std::getline(ss, f, '\t');) fields.push_back(f);
    lines.push_back(fields);
  }
  return lines;
}

}  // namespace

TEST_CASE("a group whose arguments share blocks otherwise is simulated; the log says which") {
  // group()'s launches with v on one block (launches no other test runs): v = u + u, both of
  // its arguments in u's block, recorded.
  std::vector<ConcurrentLaunch> shared = group();
  shared[2].launch.block_dim = 1;
  REQUIRE(none_replayed(run(shared)));
  // v = u + u2: its second argument in a block of its own, of u's size, at the same offset. The
  // L2 files lines by block, so its loads no longer find the lines its first argument's loaded:
  // another key, simulated. The replay log names the argument and the one it shared with.
  std::vector<ConcurrentLaunch> apart = shared;
  apart[2].launch.args[1] = kU2;
  std::filesystem::remove(replay_log());
  REQUIRE(none_replayed(run(apart)));
  const std::vector<std::vector<std::string>> lines = replay_log_lines();
  REQUIRE(lines.size() == 3);
  for (const std::vector<std::string>& f : lines) {
    REQUIRE(f.size() >= 6);
    CHECK(f[4] == "simulated");
    CHECK(f[5].find("group recorded, translatable (not laid out as the last recording of these "
                    "launches: launch 2 ('" +
                    apart[2].launch.program->name +
                    "') argument 1 shares a block with launch 2 argument 0 in the recording, "
                    "not here (1 argument differs))") != std::string::npos);
  }
  // Each layout replays its own recording.
  REQUIRE(run(shared).replayed == std::vector<bool>{true, true, true});
  REQUIRE(run(apart).replayed == std::vector<bool>{true, true, true});
  std::filesystem::remove(replay_log());
}

TEST_CASE("the normalized ranges of a group's writes invalidate as the ranges one by one do") {
  // Pages of 64 KiB: a range covering one whole page releases it (DeviceMemory::invalidate);
  // two ranges covering a page between them zero it but keep it. The normalized ranges must do
  // the same.
  constexpr uint64_t P = DeviceMemory::kPageBytes;
  const uint64_t a = 0x4000000;
  const std::vector<GmAccess> ranges = {
      {a, P / 2, true},            // page 0: first half
      {a + P / 2, P / 2, true},    // page 0: second half (together: the whole page, no one range)
      {a + P, P, true},            // page 1: whole
      {a + 3 * P + 7, 100, true},  // page 3: a few bytes
      {a + P + 10, 20, true},      // inside page 1 again
  };
  DeviceMemory one(uint64_t{1} << 30), normalized(uint64_t{1} << 30);
  std::vector<uint8_t> ones(4 * P, 1);
  for (DeviceMemory* m : {&one, &normalized}) m->write(a, ones.data(), ones.size());
  for (const GmAccess& r : ranges) one.invalidate(r.addr, r.bytes);
  for (const GmAccess& r : normalized_writes(ranges)) normalized.invalidate(r.addr, r.bytes);
  for (uint64_t page = 0; page < 4; ++page) {
    INFO("page " << page);
    REQUIRE(one.holds_data(a + page * P, P) == normalized.holds_data(a + page * P, P));
  }
  REQUIRE_FALSE(one.first_difference(normalized.snapshot()));
  REQUIRE(one.holds_data(a, P));            // zeroed, kept
  REQUIRE_FALSE(one.holds_data(a + P, P));  // released
}

// A branch on a loaded value: its control flow (and so the group's timing) follows data. The
// taken branch skips scalar instructions, so the two values take different times.
const isa::Program& steered() {
  static const isa::Program p = isa::assemble(
      ".arg x, f16[16]\n.section aiv\n  ldarg x1, x\n  ld x2, x1\n  bne x2, 0, l\n"
      "  add x3, x3, 1\n  mul x3, x3, x3\n  add x3, x3, 1\n  mul x3, x3, x3\n"
      "  add x3, x3, 1\n  mul x3, x3, x3\n  add x3, x3, 1\n  mul x3, x3, x3\nl:\n  end\n",
      "steered.s");
  return p;
}

TEST_CASE("a group with a launch whose loaded value steers it replays where it loads alike") {
  std::vector<ConcurrentLaunch> g = group();
  g.push_back({kernel_launch(steered(), {kX}, 1), {}, {}});
  g.back().take_cores_when_ready = true;
  write_gm(sim(), kX, std::vector<uint64_t>{0});
  const Records first = run(g);
  REQUIRE(none_replayed(first));
  // The same bytes where its ld reads: replayed with the first run's records.
  const Records second = run(g);
  REQUIRE(second.replayed == std::vector<bool>{true, true, true, true});
  require_same(first, second);
  // Other bytes there: simulated (the branch goes the other way), then replayed in turn.
  write_gm(sim(), kX, std::vector<uint64_t>{1});
  const Records other = run(g);
  REQUIRE(none_replayed(other));
  REQUIRE(other.cycles[3] != first.cycles[3]);
  REQUIRE(run(g).replayed == std::vector<bool>{true, true, true, true});
}

TEST_CASE("a steering ld that reads what the group wrote before it replays whatever was there") {
  // The steering launch reads z after z = x + y (its `after`): in a timing-only run it loads
  // the undefined bytes z's member wrote (zero), not what z held at the group's start.
  std::vector<ConcurrentLaunch> g = group(kMoved2);
  g.push_back({kernel_launch(steered(), {kMoved2}, 1), {}, {0}});
  g.back().take_cores_when_ready = true;
  write_gm(sim(), kMoved2, std::vector<uint64_t>{1});
  const Records first = run(g);
  write_gm(sim(), kMoved2, std::vector<uint64_t>{2});
  const Records second = run(g);
  REQUIRE(second.replayed == std::vector<bool>{true, true, true, true});
  require_same(first, second);
}

TEST_CASE("blocks overlapping a planned buffer stay at their addresses: moved, simulated") {
  // A graph's arena (an allocation) with a statically planned buffer at its start: the L2 files
  // an address in the buffer by the buffer, any other by the arena. z of the first launch lies
  // in the arena outside the buffer, x of the second in the buffer: their blocks overlap, so
  // the key holds their addresses. The same group without the plan moves with its arena.
  constexpr uint64_t kArenaBytes = 0x200000;
  const auto arena_group = [&](uint64_t arena, bool planned) {
    const GmBlockLookup blocks = lookup_of({{kX, kBlock}, {kY, kBlock}, {arena, kArenaBytes}});
    std::vector<ConcurrentLaunch> g = {
        {kernel_launch(vadd(), {kX, kY, arena + 0x100000, kN}, 2), {}, {}},
        {kernel_launch(vadd(), {arena, kY, arena + 0x180000, kN}, 2), {}, {0}},
    };
    for (ConcurrentLaunch& c : g) {
      c.take_cores_when_ready = true;
      c.launch.gm_blocks = blocks;
      if (planned) c.launch.planned_blocks = {{arena, 0x100000}};
    }
    return g;
  };
  constexpr uint64_t kArena = 0x6000000, kArena2 = 0x6400000;
  const Records first = run(arena_group(kArena, true));
  REQUIRE(none_replayed(first));
  REQUIRE(run(arena_group(kArena, true)).replayed == std::vector<bool>{true, true});
  REQUIRE(none_replayed(run(arena_group(kArena2, true))));
  // Without the plan the arena is one block, which moves: replayed at the other address.
  REQUIRE(none_replayed(run(arena_group(kArena, false))));
  REQUIRE(run(arena_group(kArena2, false)).replayed == std::vector<bool>{true, true});
}

TEST_CASE("a simulated group's replay log lines sum to at most the CPU time the group took") {
  std::filesystem::remove(replay_log());
  std::vector<ConcurrentLaunch> g = group();
  g.pop_back();  // z = x + y, then w = z + y: a group no test above runs
  const uint64_t before_us = thread_cpu_us();
  const ConcurrentResult r = sim().run_concurrent(g);
  const uint64_t spent_us = thread_cpu_us() - before_us;
  for (const KernelResult& k : r.launches) {
    REQUIRE(k.ok);
    REQUIRE_FALSE(k.replayed);
  }
  // One line per launch: kernel, block_dim, cycles, CPU microseconds, verdict, detail.
  const std::vector<std::vector<std::string>> lines = replay_log_lines();
  REQUIRE(lines.size() == 2);
  std::vector<uint64_t> cpu_us;
  for (const auto& f : lines) {
    REQUIRE(f.size() >= 6);
    CHECK(f[4] == "simulated");
    cpu_us.push_back(std::stoull(f[3]));
  }
  // The group's lines are written at its end, the first with the group's simulation, the second
  // with what writing the first took: counted each from the group's start, the second would
  // hold at least the first's and the two would count the group twice.
  CHECK(cpu_us[0] > 0);
  CHECK(cpu_us[1] < cpu_us[0]);
  CHECK(cpu_us[0] + cpu_us[1] <= spent_us);
  std::filesystem::remove(replay_log());
}
