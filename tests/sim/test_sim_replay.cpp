// Launch replay (sim/replay/launch_replay.h): a launch identical to one already simulated is
// replayed, and a run with replay gives exactly what a run without it gives (results, cycles,
// per-launch counters, the chip's totals, simulated time), also for a kernel whose pipes race
// and for a launch whose tensors moved.
// Launches that cannot be replayed (cores writing each other's bytes, faults) are simulated
// every time; one whose ld steers its control flow replays only after a check. Each mode runs
// in a forked child process (SystemC elaborates one chip per process); this process never
// constructs a Simulator itself.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <unistd.h>
#include <string>

#include "common/numeric.h"
#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "sim/counters/observer.h"
#include "sim/replay/launch_replay.h"
#include "tests/common/child_process.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using nlohmann::json;
using npusim::test::launch;
using npusim::test::read_gm;
using npusim::test::write_gm;

namespace {

constexpr uint64_t kX = 0x1000000, kY = 0x2000000, kZ = 0x3000000, kW = 0x4000000;

// y = 2 * x over 128 fp16 where V does not wait for MTE2: the simulated run reads the zeros V
// wrote first (the race of test_sim_sync.cpp).
const char* kRace = R"(
.arg x
.arg y
.section aiv
    ldarg x1, x
    ldarg x2, y
    movi x3, 0
    movi x4, 1024
    movi x5, f32(2.0)
    movi x6, 0
    vdup.f16 x3, x6, 1, 1, 8
    set_flag v, mte2, 1
    wait_flag v, mte2, 1
    copy_gm2ub x3, x1, 1, 64, 0, 0
    set_flag mte2, v, 0
    vmuls.f16 x4, x3, x5, 1, 1, 1, 8, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x2, x4, 1, 8, 0, 0
    wait_flag mte2, v, 0
    end
)";

// Every block stores its id at the same address: the cores write each other's bytes.
const char* kSameAddress = R"(
.arg out
.section aiv
    ldarg x1, out
    get_block_id x2
    st x2, x1
    end
)";

// ld turns data into an operand.
const char* kLoadStore = R"(
.arg p
.section aiv
    ldarg x1, p
    ld x2, x1
    add x2, x2, 1
    add x3, x1, 8
    st x2, x3
    end
)";

// ld steers the control flow: the loop runs as many times as the loaded value says.
const char* kLoadLoop = R"(
.arg p
.section aiv
    ldarg x1, p
    ld x2, x1
    movi x3, 0
loop:
    add x3, x3, 3
    sub x2, x2, 1
    bne x2, 0, loop
    add x4, x1, 8
    st x3, x4
    end
)";

// ld of bytes the core itself stores first: the check (which applies no effects) cannot vouch
// for the value; the loaded value only reaches a stored one, so the launch replays unchecked
// under its own key.
const char* kStoreLoad = R"(
.arg p
.section aiv
    ldarg x1, p
    movi x2, 7
    st x2, x1
    ld x3, x1
    add x4, x1, 8
    st x3, x4
    end
)";

// y = x * s over 128 fp16, s the fp32 scalar at p (an optimizer's learning rate): the loaded
// value reaches only the vector unit's scalar operand, so under its own key the launch replays
// without the check whatever p holds (the replay log says so).
const char* kLoadScale = R"(
.arg x
.arg p
.arg y
.section aiv
    ldarg x1, x
    ldarg x7, p
    ldarg x2, y
    ld x5, x7
    movi x3, 0
    movi x4, 1024
    copy_gm2ub x3, x1, 1, 8, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    vmuls.f16 x4, x3, x5, 1, 1, 1, 8, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x2, x4, 1, 8, 0, 0
    end
)";

// A 4 KiB store on MTE3, then a 256-byte load on MTE2 that starts after it and ends before it:
// the two transfers reach the memory system (their L2 lookups) in the other order than they
// take effect in.
const char* kOverlap = R"(
.arg x, f16[128]
.arg y, f16[2048]
.section aiv
    ldarg x1, x
    ldarg x2, y
    movi x3, 0
    movi x4, 8192
    copy_ub2gm x2, x3, 1, 128, 0, 0
    copy_gm2ub x4, x1, 1, 8, 0, 0
    end
)";

// A mix kernel without cross-core flags (as the strided input gradient's: its cube core writes
// some bytes of the output, its vector cores others): per block the cube core stores 1000 +
// block at tags[block]; vector core `subblock` scales x's tile 2 * block + subblock (128 fp16)
// by 2 into y's. No core touches bytes another writes, so its cores replay apart.
const char* kMixApart = R"(
.arg x
.arg y
.arg tags
.section aic
    ldarg x1, tags
    get_block_id x2
    shl x3, x2, 3
    add x1, x1, x3
    add x4, x2, 1000
    st x4, x1
    end
.section aiv
    ldarg x1, x
    ldarg x2, y
    get_block_id x5
    get_subblock_id x6
    shl x5, x5, 1
    add x5, x5, x6
    shl x5, x5, 8
    add x1, x1, x5
    add x2, x2, x5
    movi x3, 0
    movi x4, 1024
    movi x7, f32(2.0)
    copy_gm2ub x3, x1, 1, 8, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    vmuls.f16 x4, x3, x7, 1, 1, 1, 8, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x2, x4, 1, 8, 0, 0
    end
)";
constexpr uint64_t kMixY = kZ + 0x800000, kMixTags = kW + 0x80000;
constexpr int kMixBlocks = 3;  // on the tiny chip's two groups of a cube and two vector cores

const char* kFault = ".section aiv\n    movi x1, 0x40000\n    copy_ub2gm x1, x1, 1, 8, 0, 0\n    end\n";

// Counts what it is told; wants detail when `detail` is set.
struct Probe : ChipObserver {
  bool detail = true;
  uint64_t instructions = 0, begin_ps = 0, end_ps = 0;
  void on_core(int, const std::string&) override {}
  void on_kernel_begin(const isa::Program&, int, uint64_t t) override { begin_ps = t; }
  void on_kernel_end(const isa::Program&, uint64_t t, bool) override { end_ps = t; }
  void on_instruction(int, Lane, uint64_t, uint64_t, uint32_t, const isa::Instruction&,
                      const isa::Section&) override {
    ++instructions;
  }
  void on_flow_begin(int, Lane, uint64_t, uint64_t) override {}
  void on_flow_end(int, Lane, uint64_t, uint64_t) override {}
  void on_hdc(bool, uint64_t, uint64_t, uint64_t) override {}
  bool wants_launch_detail() const override { return detail; }
};

std::vector<uint16_t> f16_data(uint64_t n, float scale) {
  std::vector<uint16_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = f32_to_f16(static_cast<float>(i % 97) * scale - 3.0f);
  return v;
}

// Runs the workload on a fresh chip in this (child) process with replay `mode`; `functional`
// false: a timing-only simulator.
// replay_log: SimOptions::replay_log (empty: none).
json workload(SimOptions::Replay mode, int threads, bool functional = true,
              const std::string& replay_log = "") {
  unsetenv("NPUSIM_REPLAY");  // the options below are what this test compares
  unsetenv("NPUSIM_REPLAY_THREADS");
  SimOptions opts;
  opts.replay_log = replay_log;
  opts.replay = mode;
  opts.replay_threads = threads;
  opts.functional = functional;
  Simulator sim(load_chip_config("tiny"), opts);
  json out;
  auto record = [&](const std::string& name, const KernelResult& r) {
    out[name] = {{"ok", r.ok},         {"error", r.error},   {"cycles", r.cycles},
                 {"start", r.start_cycle}, {"counters", r.counters},
                 {"replayed", r.replayed}, {"now", sim.now_cycles()}};
  };
  const uint64_t n = 20000;
  isa::Program vadd = isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s");
  isa::Program gemm = isa::assemble_file(test::source_dir() + "/kernels/gemm_f16.s");
  isa::Program race = isa::assemble(kRace, "race.s");
  isa::Program same = isa::assemble(kSameAddress, "same.s");
  isa::Program ldst = isa::assemble(kLoadStore, "ldst.s");
  isa::Program fault = isa::assemble(kFault, "fault.s");
  isa::Program loop = isa::assemble(kLoadLoop, "loop.s");
  isa::Program stld = isa::assemble(kStoreLoad, "stld.s");
  isa::Program overlap = isa::assemble(kOverlap, "overlap.s");
  isa::Program scale = isa::assemble(kLoadScale, "scale.s");
  isa::Program mix = isa::assemble(kMixApart, "mix.s");
  for (int round = 0; round < 3; ++round) {
    // New data every round: a replay computes with the data it is given.
    const std::string r = std::to_string(round);
    write_gm(sim, kX, f16_data(n, 0.25f + round));
    write_gm(sim, kY, f16_data(n, 1.5f - round));
    record("vadd" + r, launch(sim, vadd, {kX, kY, kZ, n}, 3));
    out["vadd_out" + r] = read_gm<uint16_t>(sim, kZ, n);
    record("gemm" + r, launch(sim, gemm, {kX, kY, kW, 256, 256, 512}, 2));
    out["gemm_out" + r] = read_gm<uint32_t>(sim, kW, 256 * 256 / 2);
    record("race" + r, launch(sim, race, {kX, kZ}, 1));
    out["race_out" + r] = read_gm<uint16_t>(sim, kZ, 128);
    record("same" + r, launch(sim, same, {kZ}, 4));
    out["same_out" + r] = read_gm<int64_t>(sim, kZ, 1);
    write_gm(sim, kW, std::vector<int64_t>{1000 + round});
    record("ldst" + r, launch(sim, ldst, {kW}, 1));
    out["ldst_out" + r] = read_gm<int64_t>(sim, kW + 8, 1);
    // The same loop count in rounds 0 and 1, another one in round 2.
    write_gm(sim, kW + 64, std::vector<int64_t>{round < 2 ? 2 : 5});
    record("loop" + r, launch(sim, loop, {kW + 64}, 1));
    out["loop_out" + r] = read_gm<int64_t>(sim, kW + 72, 1);
    record("stld" + r, launch(sim, stld, {kW + 128}, 1));
    out["stld_out" + r] = read_gm<int64_t>(sim, kW + 136, 1);
    record("fault" + r, launch(sim, fault, {}, 1));
    // Another scalar every round.
    write_gm(sim, kW + 256, std::vector<uint32_t>{f32_to_bits(0.5f + round), 0});
    record("scale" + r, launch(sim, scale, {kX, kW + 256, kZ}, 1));
    out["scale_out" + r] = read_gm<uint16_t>(sim, kZ, 128);
    record("mix" + r, launch(sim, mix, {kX, kMixY, kMixTags}, kMixBlocks));
    out["mix_out" + r] = read_gm<uint16_t>(sim, kMixY, kMixBlocks * 2 * 128);
    out["mix_tags" + r] = read_gm<int64_t>(sim, kMixTags, kMixBlocks);
  }
  // A different block count or size argument is another launch.
  record("vadd_blocks", launch(sim, vadd, {kX, kY, kZ, n}, 2));
  record("vadd_args", launch(sim, vadd, {kX, kY, kZ, n - 16}, 2));
  // The same launch with its tensors elsewhere (a training step's allocator): replayed when the
  // L2 sees the same hits and misses (moved by whole lines, nothing shared), simulated when it
  // does not (z in place over x: the stores hit lines the loads brought in).
  constexpr uint64_t kMove = 0x123400;  // whole 512-byte lines, not a multiple of the L2 period
  write_gm(sim, kX + kMove, f16_data(n, 0.5f));
  write_gm(sim, kY + kMove, f16_data(n, 0.75f));
  write_gm(sim, kZ + kMove, f16_data(n, 9.0f));  // host bytes the launch must overwrite
  record("vadd_moved", launch(sim, vadd, {kX + kMove, kY + kMove, kZ + kMove, n}, 3));
  out["vadd_moved_out"] = read_gm<uint16_t>(sim, kZ + kMove, n);
  record("vadd_in_place", launch(sim, vadd, {kX + kMove, kY + kMove, kX + kMove, n}, 3));
  out["vadd_in_place_out"] = read_gm<uint16_t>(sim, kX + kMove, n);
  // Overlapping transfers of one core, then the same launch moved: the check looks the moved
  // ranges up in the order the simulated run's transfers reached the memory system.
  record("overlap", launch(sim, overlap, {kX, kZ}, 1));
  record("overlap_moved", launch(sim, overlap, {kX + kMove, kZ + kMove}, 1));
  out["overlap_moved_out"] = read_gm<uint16_t>(sim, kZ + kMove, 2048);
  // Observers: one that wants detail sees a simulated launch; one that does not lets it replay
  // and sees its begin and end at the simulated times.
  Probe probe;
  sim.add_observer(&probe);
  record("observed_detail", launch(sim, vadd, {kX, kY, kZ, n}, 3));
  out["probe_detail"] = {probe.instructions, probe.begin_ps, probe.end_ps};
  probe.detail = false;
  probe.instructions = 0;
  record("observed_quiet", launch(sim, vadd, {kX, kY, kZ, n}, 3));
  out["probe_quiet"] = {probe.instructions, probe.begin_ps, probe.end_ps};
  sim.remove_observer(&probe);
  out["totals"] = sim.counters();
  return out;
}

json run_in_child(SimOptions::Replay mode, int threads = 0, bool functional = true,
                  const std::string& replay_log = "") {
  return json::parse(test::run_in_child([mode, threads, functional, replay_log] {
    return workload(mode, threads, functional, replay_log).dump();
  }));
}

// Every launch of `run` (results, cycles, counters, simulated time) and the totals as in `off`.
void check_same_as_simulated(const json& off, const json& run) {
  for (const auto& [name, value] : off.items()) {
    INFO(name);
    if (value.is_object() && value.contains("replayed")) {
      json a = value, b = run[name];
      a.erase("replayed");
      b.erase("replayed");
      CHECK(a == b);
    } else if (name == "probe_quiet") {  // instructions seen differ: a replay has none
      CHECK(value[1] == run[name][1]);
      CHECK(value[2] == run[name][2]);
    } else {
      CHECK(value == run[name]);
    }
  }
}

}  // namespace

TEST_CASE("replay gives exactly what simulating every launch gives") {
  const json off = run_in_child(SimOptions::Replay::off);
  const json on = run_in_child(SimOptions::Replay::on);
  const json one_thread = run_in_child(SimOptions::Replay::on, 1);
  const json check = run_in_child(SimOptions::Replay::check);  // throws on any difference
  for (const json* run : {&on, &one_thread, &check}) check_same_as_simulated(off, *run);
  // The simulated runs really computed: vadd's round-2 result, the race's zeros.
  const auto x = f16_data(20000, 2.25f), y = f16_data(20000, -0.5f);
  const auto z = off["vadd_out2"].get<std::vector<uint16_t>>();
  bool vadd_correct = true;
  for (size_t i = 0; i < z.size(); ++i)
    vadd_correct &= z[i] == f32_to_f16(f16_to_f32(x[i]) + f16_to_f32(y[i]));
  CHECK(vadd_correct);
  CHECK(off["race_out2"] == json(std::vector<uint16_t>(128, 0)));
  CHECK(off["ldst_out2"] == json(std::vector<int64_t>{1003}));
  CHECK(off["loop_out1"] == json(std::vector<int64_t>{6}));
  CHECK(off["stld_out2"] == json(std::vector<int64_t>{7}));
  CHECK(off["loop_out2"] == json(std::vector<int64_t>{15}));
  CHECK(off["loop2"]["cycles"] > off["loop1"]["cycles"]);
  CHECK(off["fault0"]["ok"] == false);
  // The scaled tile of round 2 (x of round 2, s = 2.5).
  const auto scaled = off["scale_out2"].get<std::vector<uint16_t>>();
  bool scale_correct = true;
  for (size_t i = 0; i < scaled.size(); ++i)
    scale_correct &= scaled[i] == f32_to_f16(f16_to_f32(x[i]) * 2.5f);
  CHECK(scale_correct);
  // The mix kernel of round 2: x's first 6 tiles doubled, each block's tag.
  const auto doubled = off["mix_out2"].get<std::vector<uint16_t>>();
  bool mix_correct = doubled.size() == kMixBlocks * 2 * 128;
  for (size_t i = 0; i < doubled.size(); ++i)
    mix_correct &= doubled[i] == f32_to_f16(f16_to_f32(x[i]) * 2.0f);
  CHECK(mix_correct);
  CHECK(off["mix_tags2"] == json(std::vector<int64_t>{1000, 1001, 1002}));
}

// A timing-only simulator carries out a launch that passed the address check by invalidating
// the GM ranges the check found written, without running its blocks again: the same cycles,
// counters and (undefined) memory as simulating it. check mode compares device memory too.
TEST_CASE("a timing-only replay gives exactly what simulating every launch gives") {
  const json off = run_in_child(SimOptions::Replay::off, 0, false);
  const json on = run_in_child(SimOptions::Replay::on, 0, false);
  const json check = run_in_child(SimOptions::Replay::check, 0, false);
  for (const json* run : {&on, &check}) check_same_as_simulated(off, *run);
  // The moved launch and the ld kernels were carried out from the check's ranges.
  for (const char* k : {"vadd_moved", "overlap_moved", "ldst1", "ldst2", "loop1", "vadd1", "gemm2"}) {
    INFO(k);
    CHECK(on[k]["replayed"] == true);
  }
  // Kernel outputs are undefined (zero) in every mode alike.
  CHECK(off["vadd_moved_out"] == json(std::vector<uint16_t>(20000, 0)));
}

TEST_CASE("which launches are replayed") {
  const json on = run_in_child(SimOptions::Replay::on);
  for (const char* k : {"vadd", "gemm", "race"}) {
    INFO(k);
    CHECK(on[std::string(k) + "0"]["replayed"] == false);
    CHECK(on[std::string(k) + "1"]["replayed"] == true);
    CHECK(on[std::string(k) + "2"]["replayed"] == true);
  }
  // A mix kernel whose cores touch no bytes another writes replays as any launch does (each
  // core its own section's blocks, with their subblock ids).
  for (int round = 0; round < 3; ++round) {
    INFO("mix" << round);
    CHECK(on["mix" + std::to_string(round)]["replayed"] == (round > 0));
  }
  // A program with ld replays once its recording passes the check with the launch's data:
  // ldst always (the loaded value only flows into the stored one), the loop when it loops as
  // often as recorded.
  for (const char* k : {"ldst", "loop"}) {
    INFO(k);
    CHECK(on[std::string(k) + "0"]["replayed"] == false);
    CHECK(on[std::string(k) + "1"]["replayed"] == true);
  }
  CHECK(on["ldst2"]["replayed"] == true);
  CHECK(on["loop2"]["replayed"] == false);
  // A loaded value that reaches data operands only (the vector unit's scalar, the value st
  // stores): under its own key the launch replays without the check, whatever it loads; one that
  // reaches a branch is checked.
  for (int round = 0; round < 3; ++round) {
    INFO("scale" << round);
    CHECK(on["scale" + std::to_string(round)]["replayed"] == (round > 0));
  }
  // So is an ld of the core's own stores (which the check, applying no effects, could not vouch
  // for): the replay's walk stores, then loads, in the recorded order.
  for (int round = 0; round < 3; ++round) {
    INFO("stld" << round);
    CHECK(on["stld" + std::to_string(round)]["replayed"] == (round > 0));
  }
  const std::string log_path = (std::filesystem::temp_directory_path() /
                                ("replay_log_" + std::to_string(getpid())))
                                   .string();
  std::filesystem::remove(log_path);
  run_in_child(SimOptions::Replay::on, 0, true, log_path);
  std::map<std::string, std::vector<std::string>> notes;  // kernel -> its launches' notes
  {
    std::ifstream log(log_path);
    // kernel, blocks, cycles, CPU us, then the note ("replayed" or "simulated", a tab, why)
    for (std::string line; std::getline(log, line);) {
      size_t at = 0;
      for (int field = 0; field < 4 && at != std::string::npos; ++field)
        at = line.find('\t', at + 1);
      if (at != std::string::npos)
        notes[line.substr(0, line.find('\t'))].push_back(line.substr(at + 1));
    }
  }
  std::filesystem::remove(log_path);
  for (const char* k : {"scale", "ldst", "stld"}) {
    INFO(k);
    REQUIRE(notes[k].size() == 3);
    CHECK(notes[k][1] == "replayed\tits own key, loads reach data operands only");
    CHECK(notes[k][2] == "replayed\tits own key, loads reach data operands only");
  }
  REQUIRE(notes["loop"].size() == 3);
  CHECK(notes["loop"][1] == "replayed\tits own key, checked");
  // Cores writing each other's bytes, faults: simulated every time.
  for (const char* k : {"same", "fault"})
    for (int round = 0; round < 3; ++round) {
      INFO(k << round);
      CHECK(on[std::string(k) + std::to_string(round)]["replayed"] == false);
    }
  CHECK(on["vadd_blocks"]["replayed"] == false);
  CHECK(on["vadd_args"]["replayed"] == false);
  CHECK(on["vadd_moved"]["replayed"] == true);
  CHECK(on["vadd_in_place"]["replayed"] == false);
  CHECK(on["overlap"]["ok"] == true);
  INFO(on["overlap"]["error"]);
  CHECK(on["overlap"]["replayed"] == false);
  CHECK(on["overlap_moved"]["replayed"] == true);
  // An observer that wants detail gets the instructions of a simulated launch; one that does not
  // gets a replay, with begin and end where the simulated launch had them.
  CHECK(on["observed_detail"]["replayed"] == false);
  CHECK(on["probe_detail"][0].get<uint64_t>() > 0);
  CHECK(on["observed_quiet"]["replayed"] == true);
  CHECK(on["probe_quiet"][0] == 0);
  const uint64_t begin = on["probe_quiet"][1], end = on["probe_quiet"][2];
  CHECK(begin / 1000 == on["observed_quiet"]["start"].get<uint64_t>());
  CHECK((end - begin + 999) / 1000 == on["observed_quiet"]["cycles"].get<uint64_t>());
  CHECK(on["probe_detail"][2].get<uint64_t>() - on["probe_detail"][1].get<uint64_t>() ==
        end - begin);
}

TEST_CASE("the replay memo keeps the most recently used launches within its limits") {
  auto run = [](size_t launches, uint64_t bytes) {
    return json::parse(test::run_in_child([launches, bytes] {
      unsetenv("NPUSIM_REPLAY");
      SimOptions opts;
      opts.replay_memo_launches = launches;
      opts.replay_memo_bytes = bytes;
      Simulator sim(load_chip_config("tiny"), opts);
      isa::Program vadd = isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s");
      json replayed = json::array();
      // Three distinct launches (element counts), then the first and the last again.
      for (uint64_t n : {1024, 2048, 4096, 1024, 4096})
        replayed.push_back(launch(sim, vadd, {kX, kY, kZ, n}, 2).replayed);
      return replayed.dump();
    }));
  };
  CHECK(run(8, uint64_t(1) << 30) == json({false, false, false, true, true}));
  // Two launches kept: the first was dropped for the third, the second for the first's rerun.
  CHECK(run(2, uint64_t(1) << 30) == json({false, false, false, false, true}));
  // One byte: only the latest recording is kept (never the one just added).
  CHECK(run(8, 1) == json({false, false, false, false, false}));
}

TEST_CASE("the replay memo lists a key recorded again once and with its latest recording") {
  LaunchMemo memo(16, uint64_t(1) << 30);
  const auto key = [](uint64_t tensor) {
    LaunchKey k;
    k.program_hash[0] = 7;
    k.args = {tensor, 1024};
    k.block_dim = 2;
    return k;
  };
  LaunchKey similar = key(0);
  // Recordings told apart by their duration.
  const auto recording = [](uint64_t ps) {
    RecordedLaunch rec;
    rec.duration_ps = ps;
    return rec;
  };
  memo.insert(key(0x1000), similar, recording(1), &similar);
  memo.insert(key(0x1000), similar, recording(2), &similar);  // recorded again: replaces it
  memo.insert(key(0x2000), similar, recording(3), &similar);
  CHECK(memo.size() == 2);
  for (const auto& found : {memo.find_similar(similar), memo.find_loose(similar)}) {
    REQUIRE(found.size() == 2);
    CHECK(found[0]->duration_ps == 3);  // latest first
    CHECK(found[1]->duration_ps == 2);
  }
  // Recorded again once more: first again, and the others keep their place within kSimilar.
  memo.insert(key(0x1000), similar, recording(4), &similar);
  const auto found = memo.find_similar(similar);
  REQUIRE(found.size() == 2);
  CHECK(found[0]->duration_ps == 4);
  CHECK(found[1]->duration_ps == 3);
}
