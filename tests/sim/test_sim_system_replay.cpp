// Launch replay and per-chip counters on a system of chips (sim/replay/chip_launcher.h): a
// launch recorded on one chip replays on another, and a run with replay gives exactly what a run
// without it gives (results, cycles, per-launch counters, every chip's totals, simulated time),
// with launches alone, several at once and alongside link traffic. A system chip's launch counts
// what the same launch counts on a single-chip Simulator of the same chip. Each mode runs in a
// forked child process (SystemC elaborates once per process).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "common/numeric.h"
#include "isa/assembler.h"
#include "sim/config/system_config.h"
#include "sim/counters/observer.h"
#include "sim/system/system_simulator.h"
#include "tests/common/child_process.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using nlohmann::json;

namespace {

constexpr uint64_t kX = 0x1000000, kY = 0x2000000, kZ = 0x3000000, kW = 0x4000000;
constexpr uint64_t kN = 20000;  // vadd elements

std::vector<uint16_t> f16_data(uint64_t n, float scale) {
  std::vector<uint16_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = f32_to_f16(static_cast<float>(i % 97) * scale - 3.0f);
  return v;
}

template <class T>
void put(SystemSimulator& s, int chip, uint64_t addr, const std::vector<T>& v) {
  s.gm(chip).write(addr, v.data(), v.size() * sizeof(T));
}
template <class T>
std::vector<T> get(SystemSimulator& s, int chip, uint64_t addr, size_t n) {
  std::vector<T> v(n);
  s.gm(chip).read(addr, v.data(), n * sizeof(T));
  return v;
}

json result_json(const KernelResult& r, uint64_t now) {
  return {{"ok", r.ok},
          {"error", r.error},
          {"cycles", r.cycles},
          {"start", r.start_cycle},
          {"counters", r.counters},
          {"replayed", r.replayed},
          {"now", now}};
}

// Counts what it is told; wants launch detail.
struct Probe : ChipObserver {
  uint64_t instructions = 0, kernels = 0;
  void on_core(int, const std::string&) override {}
  void on_kernel_begin(const isa::Program&, int, uint64_t) override { ++kernels; }
  void on_kernel_end(const isa::Program&, uint64_t, bool) override {}
  void on_instruction(int, Lane, uint64_t, uint64_t, uint32_t, const isa::Instruction&,
                      const isa::Section&) override {
    ++instructions;
  }
  void on_flow_begin(int, Lane, uint64_t, uint64_t) override {}
  void on_flow_end(int, Lane, uint64_t, uint64_t) override {}
  void on_hdc(bool, uint64_t, uint64_t, uint64_t) override {}
};

// Data-parallel steps on 4 chips of tiny-x8 in a fresh system with replay `mode`: every chip
// runs the same kernels on its own data, one chip at a time (replayed), all at once and
// alongside link traffic (simulated, and unchanged by the replays around them); the tensors
// move between rounds (as a training step's do).
json workload(SimOptions::Replay mode, bool functional = true) {
  unsetenv("NPUSIM_REPLAY");  // the options below are what this test compares
  unsetenv("NPUSIM_REPLAY_THREADS");
  SimOptions opts;
  opts.replay = mode;
  opts.replay_threads = 2;
  opts.functional = functional;
  SystemSimulator s(load_system_config("tiny-x8"), opts);
  const isa::Program vadd = isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s");
  const isa::Program gemm = isa::assemble_file(test::source_dir() + "/kernels/gemm_f16.s");
  json out;
  auto launch = [&](int chip, const isa::Program& p, std::vector<uint64_t> args, int blocks) {
    return ChipLaunch{chip, test::kernel_launch(p, std::move(args), blocks)};
  };
  auto record = [&](const std::string& name, const std::vector<KernelResult>& rs) {
    for (size_t i = 0; i < rs.size(); ++i)
      out[name + "_" + std::to_string(i)] = result_json(rs[i], s.now_cycles());
  };
  for (int round = 0; round < 3; ++round) {
    const std::string r = std::to_string(round);
    const uint64_t shift = round == 2 ? 0x100000 : 0;  // round 2: the tensors moved
    for (int c = 0; c < 4; ++c) {
      put(s, c, kX + shift, f16_data(kN, 0.25f + c + round));
      put(s, c, kY + shift, f16_data(kN, 1.5f - c));
    }
    // One chip after the other (as the runtime's driver runs them): chip 0's recording
    // replays on chips 1..3.
    for (int c = 0; c < 4; ++c) {
      record("vadd" + r + "_chip" + std::to_string(c),
             s.run({launch(c, vadd, {kX + shift, kY + shift, kZ + shift, kN}, 3)}));
      out["vadd_out" + r + "_" + std::to_string(c)] = get<uint16_t>(s, c, kZ + shift, kN);
    }
    // All four at once, two kernels.
    record("both" + r, s.run({launch(0, gemm, {kX, kY, kW, 256, 256, 512}, 2),
                              launch(1, vadd, {kX + shift, kY + shift, kZ + shift, kN}, 3),
                              launch(2, gemm, {kX, kY, kW, 256, 256, 512}, 2),
                              launch(3, vadd, {kX + shift, kY + shift, kZ + shift, kN}, 3)}));
    for (int c : {0, 2})
      out["gemm_out" + r + "_" + std::to_string(c)] = get<uint32_t>(s, c, kW, 256 * 256 / 2);
    // Alongside link traffic (a collective's transfers while the kernels run).
    PeerCopyResult t;
    record("alongside" + r,
           s.run_alongside({launch(2, vadd, {kX + shift, kY + shift, kZ + shift, kN}, 3)}, [&] {
             t = s.transfer({{0, 1, 1 << 20}, {1, 0, 1 << 20}});
           }));
    out["transfer" + r] = t.cycles;
  }
  out["counters"] = s.counters();
  out["now"] = s.now_cycles();
  return out;
}

// Removes the "replayed" flags (the only thing replay may change).
json without_replayed(json j) {
  for (auto& [k, v] : j.items())
    if (v.is_object()) v.erase("replayed");
  return j;
}

// The keys of `a` whose values differ in `b`, with their cycles and simulated time (what a
// failure shows instead of two whole workloads).
std::string differences(const json& a, const json& b) {
  std::string out;
  for (const auto& [k, v] : a.items()) {
    if (b.contains(k) && b[k] == v) continue;
    out += k;
    if (v.is_object() && v.contains("cycles") && b.contains(k))
      out += " (cycles " + v["cycles"].dump() + " vs " + b[k]["cycles"].dump() + ", now " +
             v["now"].dump() + " vs " + b[k]["now"].dump() + ")";
    out += "; ";
  }
  return out;
}

json in_child(const std::function<json()>& f) {
  return json::parse(test::run_in_child([&] { return f().dump(); }));
}

}  // namespace

TEST_CASE("replay on a system gives what simulating every launch gives", "[system][replay]") {
  const json off = in_child([] { return workload(SimOptions::Replay::off); });
  const json on = in_child([] { return workload(SimOptions::Replay::on); });
  REQUIRE(off["vadd0_chip0_0"]["ok"] == true);
  CHECK(off["vadd0_chip0_0"]["counters"]["chip"].contains("aiv0"));  // counted per launch
  // Every launch, its outputs, every chip's and the links' totals, the final time.
  INFO(differences(without_replayed(on), without_replayed(off)));
  CHECK(without_replayed(on) == without_replayed(off));
  for (const auto& [k, v] : off.items())
    if (v.is_object() && v.contains("replayed")) CHECK(v["replayed"] == false);
  // Chip 0's recording replays on chip 1 (cross-chip), in round 0 already.
  CHECK(on["vadd0_chip0_0"]["replayed"] == false);
  CHECK(on["vadd0_chip1_0"]["replayed"] == true);
  CHECK(on["vadd0_chip3_0"]["replayed"] == true);
  // Round 2 at moved tensors too (verified against chip 0's recording first).
  CHECK(on["vadd2_chip0_0"]["replayed"] == true);
  CHECK(on["vadd2_chip2_0"]["replayed"] == true);
  // Launches beside other chips' launches or link traffic are simulated (ChipLauncher::begin):
  // they may differ from a launch alone by the order of same-time events.
  CHECK(on["both1_1"]["replayed"] == false);
  CHECK(on["alongside1_0"]["replayed"] == false);
}

TEST_CASE("replay check mode on a system verifies every replayed launch", "[system][replay]") {
  const json off = in_child([] { return workload(SimOptions::Replay::off); });
  const json check = in_child([] { return workload(SimOptions::Replay::check); });
  INFO(differences(without_replayed(check), without_replayed(off)));
  CHECK(without_replayed(check) == without_replayed(off));
  CHECK(check["vadd0_chip1_0"]["replayed"] == true);
  const json timing_off = in_child([] { return workload(SimOptions::Replay::off, false); });
  const json timing_on = in_child([] { return workload(SimOptions::Replay::on, false); });
  for (const auto& [k, v] : timing_off.items())
    if (v.is_object() && v.contains("cycles")) {
      INFO(k);
      CHECK(timing_on[k]["cycles"] == v["cycles"]);
      CHECK(timing_on[k]["counters"] == v["counters"]);
      CHECK(timing_on[k]["now"] == v["now"]);
    }
}

TEST_CASE("a system chip's launch counts what a single chip counts", "[system][counters]") {
  // The same vadd with the same data on chip 2 of a system (after other launches on other
  // chips) and on a single-chip Simulator of the same chip config.
  auto system_run = [] {
    unsetenv("NPUSIM_REPLAY");
    SimOptions opts;
    opts.replay = SimOptions::Replay::off;
    SystemSimulator s(load_system_config("tiny-x8"), opts);
    const isa::Program vadd = isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s");
    const isa::Program gemm = isa::assemble_file(test::source_dir() + "/kernels/gemm_f16.s");
    s.run({ChipLaunch{0, test::kernel_launch(gemm, {kX, kY, kW, 256, 256, 512}, 2)}});
    put(s, 2, kX, f16_data(kN, 0.5f));
    put(s, 2, kY, f16_data(kN, 2.0f));
    const KernelResult r =
        s.run({ChipLaunch{2, test::kernel_launch(vadd, {kX, kY, kZ, kN}, 3)}})[0];
    return json{
        {"launch", result_json(r, 0)}, {"chip2", s.chip_counters(2)}, {"all", s.counters()}};
  };
  auto chip_run = [] {
    unsetenv("NPUSIM_REPLAY");
    SimOptions opts;
    opts.replay = SimOptions::Replay::off;
    Simulator sim(load_system_config("tiny-x8").chip, opts);
    const isa::Program vadd = isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s");
    test::write_gm(sim, kX, f16_data(kN, 0.5f));
    test::write_gm(sim, kY, f16_data(kN, 2.0f));
    const KernelResult r = test::launch(sim, vadd, {kX, kY, kZ, kN}, 3);
    return json{{"launch", result_json(r, 0)}, {"chip", sim.counters()}};
  };
  const json sys = in_child(system_run);
  const json one = in_child(chip_run);
  REQUIRE(one["launch"]["ok"] == true);
  REQUIRE(test::counter(one["launch"]["counters"], "chip.aiv0.v.busy_cycles") > 0);
  CHECK(sys["launch"]["cycles"] == one["launch"]["cycles"]);
  CHECK(sys["launch"]["counters"] == one["launch"]["counters"]);
  // Chip 2's totals are its one launch's: what the single chip counted since it began (the
  // HDC copies aside, which the test made on the single chip only).
  json chip2 = sys["chip2"]["chip"], single = one["chip"]["chip"];
  chip2.erase("hdc");
  single.erase("hdc");
  CHECK(chip2 == single);
  CHECK(sys["all"]["chip2"] == sys["chip2"]["chip"]);
  CHECK(sys["all"].contains("fabric"));
}

TEST_CASE("an observer on a system chip sees its launches, which are then simulated",
          "[system][replay]") {
  const json j = in_child([] {
    unsetenv("NPUSIM_REPLAY");
    SimOptions opts;
    opts.replay = SimOptions::Replay::on;
    SystemSimulator s(load_system_config("tiny-x8"), opts);
    const isa::Program vadd = isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s");
    Probe probe;
    const KernelLaunch l = test::kernel_launch(vadd, {kX, kY, kZ, kN}, 3);
    s.run({ChipLaunch{0, l}});
    s.add_observer(1, &probe);
    const KernelResult observed = s.run({ChipLaunch{1, l}})[0];
    const KernelResult other = s.run({ChipLaunch{2, l}})[0];  // no observer on chip 2
    s.remove_observer(1, &probe);
    const KernelResult again = s.run({ChipLaunch{1, l}})[0];
    return json{{"observed_replayed", observed.replayed},
                {"other_replayed", other.replayed},
                {"again_replayed", again.replayed},
                {"cycles", {observed.cycles, other.cycles, again.cycles}},
                {"instructions", probe.instructions},
                {"kernels", probe.kernels}};
  });
  CHECK(j["observed_replayed"] == false);
  CHECK(j["other_replayed"] == true);
  CHECK(j["again_replayed"] == true);
  CHECK(j["cycles"][0] == j["cycles"][1]);
  CHECK(j["cycles"][0] == j["cycles"][2]);
  CHECK(j["instructions"].get<uint64_t>() > 0);
  CHECK(j["kernels"] == 1);
}

TEST_CASE("every system chip has its trace", "[system]") {
  const json j = in_child([] {
    unsetenv("NPUSIM_REPLAY");
    SimOptions opts;
    opts.trace = true;
    SystemSimulator s(load_system_config("tiny-x8"), opts);
    const isa::Program vadd = isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s");
    const KernelLaunch l = test::kernel_launch(vadd, {kX, kY, kZ, kN}, 3);
    s.run({ChipLaunch{0, l}});
    s.run({ChipLaunch{1, l}, ChipLaunch{3, l}});
    json n;
    for (int c = 0; c < 4; ++c) n.push_back(s.trace(c)["traceEvents"].size());
    return n;
  });
  CHECK(j[0] == j[1]);  // the same launch, simulated again with its detail
  CHECK(j[1] == j[3]);
  CHECK(j[0].get<uint64_t>() > j[2].get<uint64_t>() + 10);  // chip 2 ran nothing
}
