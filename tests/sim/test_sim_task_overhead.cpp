// Task overheads (docs/chip_model.md, "Task overheads"): a launch's duration is the config's
// dispatch, block start and completion overheads plus the busy time of the worker that ended
// last (its cores' active_cycles). Each chip config runs in a forked child process (SystemC
// elaborates one chip per process) that reports its results as JSON.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "tests/common/child_process.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using nlohmann::json;
using npusim::test::counter;
using npusim::test::launch;

namespace {

// A vector-only block that touches no GM: every block takes the same time on any core.
const char* const kVectorBlock = R"(
.section aiv
    movi x1, 0
    movi x2, 2048
    vadds.f16 x2, x1, x3, 4, 1, 1, 8, 8
    vmuls.f16 x1, x2, x3, 4, 1, 1, 8, 8
    end
)";

// A mix kernel: the cube core runs a few scalar instructions, its vector cores the block above.
const char* const kMixKernel = R"(
.section aic
    movi x1, 0
    movi x2, 1
    add x1, x1, x2
    end
.section aiv
    movi x1, 0
    movi x2, 2048
    vadds.f16 x2, x1, x3, 4, 1, 1, 8, 8
    end
)";

// The largest active_cycles of the chip's cores in a launch's counters, rounded up to whole
// cycles as a launch's duration is (active time is kept to the picosecond).
uint64_t max_active(const Simulator& sim, const KernelResult& r) {
  double m = 0;
  for (const CoreKindConfig& k : sim.config().core_kinds)
    for (int i = 0; i < k.count; ++i) {
      const json& chip = r.counters["chip"];
      const std::string core = fmt::format("{}{}", isa::core_kind_name(k.kind), i);
      if (chip.contains(core) && chip[core].contains("active_cycles"))
        m = std::max(m, chip[core]["active_cycles"]["value"].get<double>());
    }
  return static_cast<uint64_t>(std::ceil(m - 1e-9));
}

json result(const Simulator& sim, const KernelResult& r, uint64_t blocks_per_worker) {
  return {{"ok", r.ok},
          {"cycles", r.cycles},
          {"replayed", r.replayed},
          {"busy", max_active(sim, r)},
          {"overhead_counter", counter(r.counters, "chip.task_overhead_cycles")},
          {"derived_overhead", test::task_overhead(sim.config(), blocks_per_worker)}};
}

// Runs the vector kernel with one block per aiv core and with two, and the mix kernel, on tiny
// with `overrides`, each launch twice (the second is replayed), in a child process.
json run_config(const std::vector<std::string>& overrides, SimOptions::Replay replay) {
  return json::parse(test::run_in_child([overrides, replay] {
    unsetenv("NPUSIM_REPLAY");
    SimOptions opts;
    opts.replay = replay;
    // HBM slowed to 100 GB/s (54 B/cycle), so that vadd's four cores (32 B/cycle each) contend.
    std::vector<std::string> keys = {"memory.hbm.gbps=100"};
    keys.insert(keys.end(), overrides.begin(), overrides.end());
    Simulator sim(load_chip_config("tiny", keys), opts);
    const int aiv = sim.config().core_kind(isa::CoreKind::AIV)->count;
    const isa::Program vec = isa::assemble(kVectorBlock, "vector_block.s");
    const isa::Program mix = isa::assemble(kMixKernel, "mix.s");
    json out;
    out["one"] = result(sim, launch(sim, vec, {}, aiv), 1);
    out["one_again"] = result(sim, launch(sim, vec, {}, aiv), 1);
    out["two"] = result(sim, launch(sim, vec, {}, 2 * aiv), 2);
    out["two_again"] = result(sim, launch(sim, vec, {}, 2 * aiv), 2);
    out["mix"] = result(sim, launch(sim, mix, {}, 1), 1);
    out["single_block_busy"] = out["one"]["busy"];
    // Cores competing for HBM (vadd over the 4 aiv cores): the overheads shift the blocks in
    // time and change nothing else; every counter but the duration's is the same.
    const uint64_t n = 16896;  // 4224 per block: 8448 B, so neighbouring blocks share L2 lines
    const isa::Program& vadd = test::repo_kernel("vadd_f16.s");
    const KernelResult r = launch(sim, vadd, {0x1000000, 0x2000000, 0x3000000, n}, aiv);
    out["vadd"] = result(sim, r, 1);
    json counters = r.counters;
    counters["chip"].erase("task_overhead_cycles");
    counters["chip"].erase("total_cycles");
    out["vadd_counters"] = counters;
    return out.dump();
  }));
}

// Every launch of a run_config result: duration = derived overheads + busy time of the worker
// that ended last; the counter holds the overheads. vadd's busy time has fractions of a cycle
// (shared HBM bandwidth): active_cycles reports it rounded to nearest, the duration rounds up.
void check_derivation(const json& run) {
  for (const char* name : {"one", "one_again", "two", "two_again", "mix", "vadd"}) {
    INFO(name << ": " << run[name].dump());
    const json& r = run[name];
    REQUIRE(r["ok"] == true);
    const uint64_t derived = r["derived_overhead"].get<uint64_t>() + r["busy"].get<uint64_t>();
    const uint64_t slack = std::string(name) == "vadd" ? 1 : 0;
    CHECK(r["cycles"].get<uint64_t>() >= derived);
    CHECK(r["cycles"].get<uint64_t>() <= derived + slack);
    CHECK(r["overhead_counter"] == r["derived_overhead"]);
  }
  // The second launch of each is replayed, with the simulated launch's duration.
  CHECK(run["one_again"]["replayed"] == true);
  CHECK(run["one_again"]["cycles"] == run["one"]["cycles"]);
  CHECK(run["two_again"]["replayed"] == true);
  CHECK(run["two_again"]["cycles"] == run["two"]["cycles"]);
  // Two blocks per worker run back to back: twice one block's busy time.
  CHECK(run["two"]["busy"].get<uint64_t>() == 2 * run["single_block_busy"].get<uint64_t>());
}

}  // namespace

TEST_CASE("a launch's duration is the config's task overheads plus its busy time") {
  const json preset = run_config({}, SimOptions::Replay::on);
  check_derivation(preset);
  // The preset (910b's overheads) has all three overheads.
  CHECK(preset["one"]["derived_overhead"].get<uint64_t>() > preset["one"]["busy"].get<uint64_t>());
}

TEST_CASE("changing an overhead key moves the duration as derived, not the busy time") {
  const json preset = run_config({}, SimOptions::Replay::on);
  const json changed =
      run_config({"task.dispatch_us=3", "task.block_start_cycles=41", "task.done_us=0.25"},
                 SimOptions::Replay::on);
  const json none =
      run_config({"task.dispatch_us=0", "task.block_start_cycles=0", "task.done_us=0"},
                 SimOptions::Replay::on);
  check_derivation(changed);
  check_derivation(none);
  CHECK(changed["vadd_counters"] == preset["vadd_counters"]);
  CHECK(none["vadd_counters"] == preset["vadd_counters"]);
  CHECK(preset["vadd_counters"]["chip"]["aiv0"]["mte2"]["stall"].contains("mem_contention"));
  for (const char* name : {"one", "two", "mix", "vadd"}) {
    INFO(name);
    CHECK(changed[name]["busy"] == preset[name]["busy"]);
    CHECK(none[name]["busy"] == preset[name]["busy"]);
    CHECK(none[name]["overhead_counter"] == 0);
    // The same busy time to the picosecond: the durations differ by exactly the overheads.
    CHECK(preset[name]["cycles"].get<uint64_t>() - none[name]["cycles"].get<uint64_t>() ==
          preset[name]["derived_overhead"].get<uint64_t>());
    CHECK(changed[name]["cycles"].get<uint64_t>() - none[name]["cycles"].get<uint64_t>() ==
          changed[name]["derived_overhead"].get<uint64_t>());
  }
  // 3 us at 1850 MHz = 5550 cycles, 0.25 us = 462.5 -> 463; per block 41.
  CHECK(changed["one"]["derived_overhead"] == 5550 + 41 + 463);
  CHECK(changed["two"]["derived_overhead"] == 5550 + 2 * 41 + 463);
}

TEST_CASE("replay check mode: replayed launches with overheads match their simulation") {
  // Check mode simulates every replayed launch again and throws on any difference in cycles,
  // idle time or counters (run_in_child fails the test with the message).
  const json checked = run_config({}, SimOptions::Replay::check);
  check_derivation(checked);
}
