// The Chrome-trace timeline (opts.trace): one process per core with a lane per pipe, complete
// events per instruction with pc, source line and text, flow events from each set_flag to the
// wait_flag it releases, the event cap, and observers that want the instructions of some launches
// only (ChipObserver::wants_instructions).
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>

#include "isa/assembler.h"
#include "sim/counters/observer.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using nlohmann::json;
using npusim::test::launch;

namespace {

constexpr uint64_t kMaxEvents = 400;

Simulator& sim() {
  static Simulator s(load_chip_config("tiny", {"clock_mhz=1000"}), [] {
    SimOptions o;
    o.trace = true;
    o.trace_max_events = kMaxEvents;
    return o;
  }());
  return s;
}

const char* kPipeline = R"(
.arg x
.arg y
.section aiv
    ldarg x1, x
    ldarg x2, y
    movi x3, 0
    movi x4, 1024
    copy_gm2ub x3, x1, 1, 8, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    vadds.f16 x4, x3, x0, 1, 1, 1, 8, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x2, x4, 1, 8, 0, 0
    end
)";

// Names of the processes (by pid) and threads (by pid, tid) from the metadata events.
struct Names {
  std::map<int64_t, std::string> process;
  std::map<std::pair<int64_t, int64_t>, std::string> thread;
};
Names names_of(const json& trace) {
  Names n;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] != "M") continue;
    if (e["name"] == "process_name") n.process[e["pid"]] = e["args"]["name"];
    if (e["name"] == "thread_name") n.thread[{e["pid"], e["tid"]}] = e["args"]["name"];
  }
  return n;
}

}  // namespace

TEST_CASE("trace: lanes per core, instruction slices with source, flows from set to wait") {
  isa::Program p = isa::assemble(kPipeline, "pipe.s");
  KernelResult r = launch(sim(), p, {0x100000, 0x200000}, 1);
  REQUIRE(r.ok);
  json t = sim().trace();
  REQUIRE(t["traceEvents"].is_array());
  Names n = names_of(t);

  // One process per core, named after it, each with the seven lanes.
  std::map<std::string, int64_t> pid_of;
  for (const auto& [pid, name] : n.process) pid_of[name] = pid;
  for (const char* core : {"aic0", "aic1", "aiv0", "aiv1", "aiv2", "aiv3"}) {
    INFO(core);
    REQUIRE(pid_of.count(core));
    std::set<std::string> lanes;
    for (const auto& [key, name] : n.thread)
      if (key.first == pid_of[core]) lanes.insert(name);
    CHECK(lanes == std::set<std::string>{"SCALAR", "MTE1", "MTE2", "MTE3", "CUBE", "VECTOR",
                                         "FIXP"});
  }
  const int64_t aiv0 = pid_of["aiv0"];
  auto lane = [&](int64_t tid) { return n.thread[{aiv0, tid}]; };

  // Complete events: the copy on MTE2 with its pc, source line and text; its duration in us
  // at the 1000 MHz clock: (32 + 500 + 256 / 32) cycles = 0.54 us.
  std::map<std::string, json> by_insn;
  std::map<int64_t, std::pair<std::string, double>> flow_begin, flow_end;  // id -> lane, ts
  for (const json& e : t["traceEvents"]) {
    if (e["pid"] != aiv0) continue;
    if (e["ph"] == "X") by_insn[e["args"]["insn"]] = e;
    if (e["ph"] == "s") flow_begin[e["id"]] = {lane(e["tid"]), e["ts"]};
    if (e["ph"] == "f") flow_end[e["id"]] = {lane(e["tid"]), e["ts"]};
  }
  REQUIRE(by_insn.count("copy_gm2ub x3, x1, 1, 8, 0, 0"));
  const json& copy = by_insn["copy_gm2ub x3, x1, 1, 8, 0, 0"];
  CHECK(lane(copy["tid"]) == "MTE2");
  CHECK(copy["args"]["pc"] == 4);
  CHECK(copy["args"]["line"] == "pipe.s:9");
  // Issued after the task's dispatch and block start and 4 scalar cycles.
  CHECK(copy["ts"].get<double>() ==
        Approx(static_cast<double>(test::task_start_overhead(sim().config()) + 4) / 1000.0));
  // The slice is the pipe's occupancy: 256 bytes at 32 B/cycle. The data lands 32 + 500 cycles
  // (path and HBM latency) later, overlapping whatever MTE2 does next.
  CHECK(copy["dur"].get<double>() == Approx(8 / 1000.0));
  CHECK(lane(by_insn["vadds.f16 x4, x3, x0, 1, 1, 1, 8, 8"]["tid"]) == "VECTOR");
  CHECK(lane(by_insn["copy_ub2gm x2, x4, 1, 8, 0, 0"]["tid"]) == "MTE3");
  CHECK(lane(by_insn["ldarg x1, 0"]["tid"]) == "SCALAR");
  CHECK(lane(by_insn["wait_flag mte2, v, 0"]["tid"]) == "VECTOR");

  // Flows: mte2 -> v and v -> mte3, each from the set's lane to the released wait's lane,
  // never backwards in time.
  REQUIRE(flow_begin.size() == 2);
  std::set<std::pair<std::string, std::string>> edges;
  for (const auto& [id, begin] : flow_begin) {
    REQUIRE(flow_end.count(id));
    CHECK(begin.second <= flow_end[id].second);
    edges.insert({begin.first, flow_end[id].first});
  }
  CHECK(edges == std::set<std::pair<std::string, std::string>>{{"MTE2", "VECTOR"},
                                                               {"VECTOR", "MTE3"}});
  // The wait on V lasts until the copy's data has landed; the flow ends at its end.
  const json& wait = by_insn["wait_flag mte2, v, 0"];
  CHECK(wait["ts"].get<double>() + wait["dur"].get<double>() ==
        Approx(copy["ts"].get<double>() + copy["dur"].get<double>() + (32 + 500) / 1000.0));

  // The launch as a slice on the chip's kernels lane.
  bool kernel_slice = false;
  for (const json& e : t["traceEvents"])
    if (e["ph"] == "X" && e.value("cat", "") == "kernel" && e["name"] == "pipe")
      kernel_slice = e["dur"].get<double>() == Approx(r.time_us);
  CHECK(kernel_slice);
}

TEST_CASE("trace: events past trace_max_events are dropped and counted") {
  std::string text = ".section aiv\n";
  for (int i = 0; i < 300; ++i) text += "    add x1, x1, 1\n";
  text += "    end\n";
  isa::Program p = isa::assemble(text, "many.s");
  KernelResult r = launch(sim(), p, {}, 2);  // 600 scalar slices on two cores
  REQUIRE(r.ok);
  json t = sim().trace();
  uint64_t recorded = 0;
  for (const json& e : t["traceEvents"])
    if ((e["ph"] == "X" && e.value("cat", "") != "kernel") || e["ph"] == "s" || e["ph"] == "f")
      ++recorded;
  CHECK(recorded == kMaxEvents);
  CHECK(t["otherData"]["dropped_events"].get<uint64_t>() > 0);
}

namespace {

// Counts the instruction slices and flow edges it is given. `selective`: it wants those of every
// other launch only (the first, the third, ...), its answer changing at each launch's begin and
// end as a profiler's does past its detailed launches; otherwise it wants all of them.
struct CountingObserver : ChipObserver {
  explicit CountingObserver(bool selective) : selective(selective) {}
  bool selective;
  int launches = 0;
  bool in_wanted_launch = false;
  uint64_t instructions = 0, flow_edges = 0;
  void on_core(int, const std::string&) override {}
  void on_kernel_begin(const isa::Program&, int, uint64_t) override {
    in_wanted_launch = launches++ % 2 == 0;
  }
  void on_kernel_end(const isa::Program&, uint64_t, bool) override { in_wanted_launch = false; }
  void on_instruction(int, Lane, uint64_t, uint64_t, uint32_t, const isa::Instruction&,
                      const isa::Section&) override {
    ++instructions;
  }
  void on_flow_begin(int, Lane, uint64_t, uint64_t) override { ++flow_edges; }
  void on_flow_end(int, Lane, uint64_t, uint64_t) override { ++flow_edges; }
  void on_hdc(bool, uint64_t, uint64_t, uint64_t) override {}
  bool wants_instructions() const override { return !selective || in_wanted_launch; }
};

}  // namespace

TEST_CASE("trace: an observer gets the instructions and flows of the launches it wants only") {
  isa::Program p = isa::assemble(kPipeline, "pipe.s");
  CountingObserver all(false), selective(true);
  sim().add_observer(&all);
  sim().add_observer(&selective);
  // Launch 1 is wanted: every slice and edge the other observer gets.
  REQUIRE(launch(sim(), p, {0x100000, 0x200000}, 2).ok);
  const uint64_t insns = all.instructions, edges = all.flow_edges;
  CHECK(insns >= 2 * 12);  // the kernel's 12 instructions on each of the two blocks' cores
  CHECK(edges > 0);
  CHECK(selective.instructions == insns);
  CHECK(selective.flow_edges == edges);
  // Launch 2 is not: none, while the other observer gets the same launch's again.
  REQUIRE(launch(sim(), p, {0x100000, 0x200000}, 2).ok);
  CHECK(all.instructions == 2 * insns);
  CHECK(all.flow_edges == 2 * edges);
  CHECK(selective.instructions == insns);
  CHECK(selective.flow_edges == edges);
  // Launch 3 is wanted again.
  REQUIRE(launch(sim(), p, {0x100000, 0x200000}, 2).ok);
  CHECK(selective.instructions == 2 * insns);
  CHECK(selective.flow_edges == 2 * edges);
  CHECK(selective.launches == 3);
  sim().remove_observer(&selective);
  sim().remove_observer(&all);
}
