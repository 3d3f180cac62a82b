// Task overheads (docs/chip_model.md, "Task overheads"): a launch's duration is the config's
// dispatch, block start and completion overheads plus the busy time of the worker that ended
// last (its cores' active_cycles). Each chip config runs in a forked child process (SystemC
// elaborates one chip per process) that reports its results as JSON.
#include <catch2/catch.hpp>

#include <algorithm>
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

// The largest active_cycles of the chip's cores in a launch's counters.
uint64_t max_active(const Simulator& sim, const KernelResult& r) {
  uint64_t m = 0;
  for (const CoreKindConfig& k : sim.config().core_kinds)
    for (int i = 0; i < k.count; ++i)
      m = std::max(m, counter(r.counters, fmt::format("chip.{}{}.active_cycles",
                                                      isa::core_kind_name(k.kind), i)));
  return m;
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
    Simulator sim(load_chip_config("tiny", overrides), opts);
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
    return out.dump();
  }));
}

// Every launch of a run_config result: duration = derived overheads + busy time of the worker
// that ended last; the counter holds the overheads.
void check_derivation(const json& run) {
  for (const char* name : {"one", "one_again", "two", "two_again", "mix"}) {
    INFO(name << ": " << run[name].dump());
    const json& r = run[name];
    REQUIRE(r["ok"] == true);
    CHECK(r["cycles"].get<uint64_t>() ==
          r["derived_overhead"].get<uint64_t>() + r["busy"].get<uint64_t>());
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
  for (const char* name : {"one", "two", "mix"}) {
    INFO(name);
    CHECK(changed[name]["busy"] == preset[name]["busy"]);
    CHECK(none[name]["busy"] == preset[name]["busy"]);
    // No overheads: the duration is the busy time alone.
    CHECK(none[name]["cycles"] == none[name]["busy"]);
    CHECK(none[name]["overhead_counter"] == 0);
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
