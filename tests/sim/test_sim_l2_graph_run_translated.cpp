// Timing-only replay by translation inside graph runs (memory.l2.keep_within_graph_run;
// sim/replay/launch_replay.h, run_l2_lookups_match): a run's launch at other tensor addresses
// replays from a recording whose L2 lookups, moved to its arguments, find on the run's L2 what
// they found then, and leaves the run's L2 and placement as simulating it would have. A tiny
// chip with a direct-mapped 4 KiB write-back L2 (8 sets of one 512-byte line), so launches
// evict each other's lines, dirty ones too. Each mode runs in a forked child (SystemC
// elaborates one chip per process).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "tests/common/child_process.h"
#include "tests/sim/replay_kernels.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using nlohmann::json;

namespace {

enum class Mode { simulate, translate, check };

// Four graph runs (steps), each at other tensor addresses, in `mode`: simulate every launch
// (translation off); replay by translation only (SimOptions::replay off, the TF plugin's
// timing-only setting); or replay, then also simulate and throw on any difference in cycles,
// counters, device memory, the L2's lines or its placement (Replay::check). Steps 0 to 2:
// write a, read a, write b, the mix kernel (cross-core flags) on x, s, y (its 8 KiB evict a
// and b, dirty), read 3 lines of a, read b; in step 1, a lies 512 bytes into a block of
// 2560 (another block layout: its lines and b's fall in other sets). Step 3: write a, a host
// copy into a (dropping its lines from the run's L2), read a: that read starts with another L2
// than any recording of it. Returns every launch's cycles, counter digest and whether it was
// replayed, by "step/index".
json workload(Mode mode) {
  unsetenv("NPUSIM_REPLAY");
  unsetenv("NPUSIM_REPLAY_TRANSLATED");
  unsetenv("NPUSIM_REPLAY_RELOCATE");
  SimOptions opts;
  opts.functional = false;
  opts.replay = mode == Mode::check ? SimOptions::Replay::check : SimOptions::Replay::off;
  opts.replay_translated = mode != Mode::simulate;
  Simulator sim(load_chip_config(
                    "tiny", {"memory.l2.bytes=4 KiB", "memory.l2.ways=1",
                             "memory.l2.write_back=true", "memory.l2.keep_within_graph_run=true"}),
                opts);
  const isa::Program write4 = test::move_lines(4, true), read4 = test::move_lines(4, false),
                     read3 = test::move_lines(3, false);
  const isa::Program handoff = isa::assemble(test::kHandoff, "handoff.s");
  json out;
  for (uint64_t step = 0; step < 4; ++step) {
    // Blocks of 2 KiB (a, b) and the mix kernel's x (4 KiB), s, y (4 KiB), 1 MiB apart per step.
    const uint64_t base = 0x1000000 + step * 0x100000;
    const uint64_t a_offset = step == 1 ? 512 : 0;
    const uint64_t a = base + a_offset, b = base + 0x10000, x = base + 0x20000, s = base + 0x30000,
                   y = base + 0x40000;
    const GmBlockLookup blocks =
        test::lookup_of({{base, 2048 + a_offset}, {b, 2048}, {x, 4096}, {s, 512}, {y, 4096}});
    int index = 0;
    const auto launch = [&](const isa::Program& p, std::vector<uint64_t> args, int block_dim) {
      KernelLaunch l;
      l.program = &p;
      l.args = std::move(args);
      l.block_dim = block_dim;
      l.gm_blocks = blocks;
      l.l2_run = 1 + step;
      const KernelResult r = sim.run(l);
      if (!r.ok) throw std::runtime_error(p.name + ": " + r.error);
      out[std::to_string(step) + "/" + std::to_string(index++)] = {
          {"cycles", r.cycles},
          {"counters", std::to_string(counter_digest(r.counter_delta))},
          {"hits", test::counter(r.counters, "chip.l2.hits")},
          {"replayed", r.replayed}};
    };
    launch(write4, {a}, 1);
    if (step == 3) {
      const std::vector<uint8_t> host(2048, 1);
      sim.copy_host_to_device(a, host.data(), host.size());
      launch(read4, {a}, 1);
      continue;
    }
    launch(read4, {a}, 1);
    launch(write4, {b}, 1);
    launch(handoff, {x, s, y}, 2);
    launch(read3, {a}, 1);
    launch(read4, {b}, 1);
  }
  out["now"] = sim.now_cycles();
  return out;
}

json run_in_child(Mode mode) {
  return json::parse(test::run_in_child([mode] { return workload(mode).dump(); }));
}

}  // namespace

TEST_CASE("graph run: a replay by translation gives exactly what simulating gives") {
  const json sim = run_in_child(Mode::simulate);
  const json translated = run_in_child(Mode::translate);
  const json check = run_in_child(Mode::check);  // throws on any difference, the L2's included
  REQUIRE(sim.size() == 21);                     // 20 launches and "now"
  CHECK(translated["now"] == sim["now"]);
  CHECK(check["now"] == sim["now"]);
  for (const auto& [key, simulated] : sim.items()) {
    if (key == "now") continue;
    INFO(key);
    CHECK(simulated["replayed"] == false);
    for (const json* run : {&translated, &check}) {
      CHECK((*run)[key]["cycles"] == simulated["cycles"]);
      CHECK((*run)[key]["counters"] == simulated["counters"]);
      CHECK((*run)[key]["replayed"] == translated[key]["replayed"]);
    }
  }
  // At another block layout, the launches whose lookups find what they found then replay
  // (relocated): write a (its lines now in sets 1 to 4), read a, write b (sets 5 to 7 and 0,
  // as empty as sets 4 to 7 were); a step in the first layout at other addresses replays every
  // launch, the mix kernel included.
  for (int i = 0; i < 3; ++i) {
    INFO("step 1, launch " << i);
    CHECK(translated["1/" + std::to_string(i)]["replayed"] == true);
  }
  for (int i = 0; i < 6; ++i) {
    INFO("step 2, launch " << i);
    CHECK(translated["2/" + std::to_string(i)]["replayed"] == true);
  }
  // The run's L2 matters: the reads of a hit on the producer's lines in the first steps; after
  // the host copy dropped them, the read misses, and no recording of it (all of whose lookups
  // hit) times it: simulated.
  CHECK(sim["0/1"]["hits"] == 4);
  CHECK(sim["3/1"]["hits"] == 0);
  CHECK(translated["3/0"]["replayed"] == true);
  CHECK(translated["3/1"]["replayed"] == false);
}

namespace {

// Runs `steps` graph runs of one launch each (run_step(sim, step) sets the launch up and runs
// it) in a forked child, simulating every launch or replaying by translation; returns each
// launch's cycles, counter digest and whether it was replayed, by step.
template <class RunStep>
json steps_in_child(Mode mode, const std::vector<std::string>& overrides, int steps,
                    RunStep run_step) {
  return json::parse(test::run_in_child([&] {
    unsetenv("NPUSIM_REPLAY");
    unsetenv("NPUSIM_REPLAY_TRANSLATED");
    unsetenv("NPUSIM_REPLAY_RELOCATE");
    SimOptions opts;
    opts.functional = false;
    opts.replay = SimOptions::Replay::off;
    opts.replay_translated = mode != Mode::simulate;
    Simulator sim(load_chip_config("tiny", overrides), opts);
    json out;
    for (int step = 0; step < steps; ++step) {
      const KernelResult r = run_step(sim, static_cast<uint64_t>(step));
      if (!r.ok) throw std::runtime_error(r.error);
      out[std::to_string(step)] = {{"cycles", r.cycles},
                                   {"counters", std::to_string(counter_digest(r.counter_delta))},
                                   {"replayed", r.replayed}};
    }
    return out.dump();
  }));
}

void check_same_as_simulated(const json& sim, const json& translated) {
  REQUIRE(sim.size() == translated.size());
  for (const auto& [step, simulated] : sim.items()) {
    INFO("step " << step << ", replayed " << translated[step]["replayed"]);
    CHECK(translated[step]["cycles"] == simulated["cycles"]);
    CHECK(translated[step]["counters"] == simulated["counters"]);
  }
}

}  // namespace

TEST_CASE("graph run: a BYPASS read moved within an L2 line is not replayed with the old line count") {
  // 512 bytes read with BYPASS: at a line's start 1 line, 32 bytes into it 2 (the recorded
  // L2 outcomes must tell the two apart, or the replay counts the recorded bypass_lines).
  const isa::Program rd = isa::assemble(
      ".arg a, f16[256]\n.section aiv\n    ldarg x1, a\n    movi x2, 0\n"
      "    copy_gm2ub.bypass x2, x1, 1, 16, 0, 0\n    end\n",
      "bypass.s");
  const std::vector<std::string> overrides = {"memory.l2.bytes=4 KiB", "memory.l2.ways=1",
                                              "memory.l2.write_back=true",
                                              "memory.l2.keep_within_graph_run=true"};
  const auto run_step = [&](Simulator& sim, uint64_t step) {
    const uint64_t base = 0x1000000 + step * 0x100000;
    KernelLaunch l;
    l.program = &rd;
    l.args = {base + (step == 1 ? 32 : 0)};
    l.block_dim = 1;
    l.gm_blocks = test::lookup_of({{base, 2048}});
    l.l2_run = 1 + step;
    return sim.run(l);
  };
  check_same_as_simulated(steps_in_child(Mode::simulate, overrides, 3, run_step),
                          steps_in_child(Mode::translate, overrides, 3, run_step));
}

TEST_CASE("graph run: a steered launch moved onto tensors where it writes what it loads is simulated") {
  // The loaded index picks the rows copied; in step 1 the output y is the index tensor, so a
  // core's later block loads what its earlier block wrote (the recording loaded nothing it wrote).
  const isa::Program pick = isa::assemble(test::kPick, "pick.s");
  const std::vector<std::string> overrides = {"memory.l2.bytes=64 KiB", "memory.l2.write_back=true",
                                              "memory.l2.keep_within_graph_run=true"};
  const auto run_step = [&](Simulator& sim, uint64_t step) {
    const uint64_t base = 0x1000000 + step * 0x100000;
    const uint64_t x = base, idx = base + 0x10000, y_block = base + 0x20000;
    test::write_gm(sim, idx, std::vector<int64_t>{3, 2});
    KernelLaunch l;
    l.program = &pick;
    l.args = {x, idx, step == 1 ? idx : y_block};
    l.block_dim = 8;
    l.gm_blocks = test::lookup_of({{x, 8192}, {idx, 512}, {y_block, 512}});
    l.l2_run = 1 + step;
    return sim.run(l);
  };
  check_same_as_simulated(steps_in_child(Mode::simulate, overrides, 2, run_step),
                          steps_in_child(Mode::translate, overrides, 2, run_step));
}
