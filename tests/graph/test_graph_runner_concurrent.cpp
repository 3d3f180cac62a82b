// The offline runner's concurrent mode (OfflineRunner::set_concurrent, concurrent_groups) on the
// tiny chip (2 cube cores, 4 vector cores): a Relu and an add of one 16-element input (2 vector
// cores each), then their sum, run the two as one group (no buffer one writes is read or written
// by the other) and the sum alone; the outputs are bit-identical to the run in order and the
// inference takes fewer simulated cycles (the sum of the groups' makespans). A chain (each task
// reads the one before's output) stays one task a group, with the in-order run's cycles and
// outputs.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "adapter/graph/engine.h"
#include "adapter/graph/runner.h"

using namespace npusim;
using namespace npusim::graph;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

int add_node(Graph& g, const std::string& name, const std::string& op,
             std::vector<TensorRef> inputs, TensorDesc out) {
  Node n;
  n.name = name;
  n.op = op;
  n.inputs = std::move(inputs);
  n.outputs = {std::move(out)};
  if (op != "Placeholder" && op != "Const") n.attrs["T"] = std::string("f32");
  g.nodes.push_back(std::move(n));
  return int(g.nodes.size()) - 1;
}

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

constexpr int64_t kH = 2, kC = 8;
const TensorDesc kFeature{DataType::F32, {kH, kC}};

NpyArray input() {
  const std::vector<float> v = random_floats(size_t(kH * kC), 7);
  NpyArray a;
  a.dtype = "f4";
  a.shape = kFeature.shape;
  a.data.resize(v.size() * 4);
  std::memcpy(a.data.data(), v.data(), v.size() * sizeof(float));
  return a;
}

OmModel compile(Graph g) {
  static const ChipConfig cfg = load_chip_config("tiny");
  EngineOptions apart;
  apart.fusion = false;  // the add stays a task of its own
  return compile_graph(std::move(g), cfg, apart);
}

struct Inference {
  std::vector<NpyArray> outputs;
  std::vector<TaskRun> runs;
  uint64_t cycles = 0;  // the simulator's clock across the inference, host copies included
};

// One chip per process (SystemC): the runs share it, one runner each.
Inference infer(const OmModel& m, bool concurrent) {
  static Simulator sim(load_chip_config("tiny"), SimOptions{});
  OfflineRunner runner(m, sim, "model.om");
  runner.set_concurrent(concurrent);
  Inference r;
  const uint64_t start = sim.now_cycles();
  r.outputs = runner.run({input()}, {"x"}, &r.runs);
  r.cycles = sim.now_cycles() - start;
  return r;
}

}  // namespace

TEST_CASE("concurrent offline run: two element-wise ops of one input at once, then their sum") {
  Graph g;
  const int x = add_node(g, "x", "Placeholder", {}, kFeature);
  const int a = add_node(g, "a", "Relu", {{x, 0}}, kFeature);
  const int b = add_node(g, "b", "AddV2", {{x, 0}, {x, 0}}, kFeature);
  const int sum = add_node(g, "sum", "AddV2", {{a, 0}, {b, 0}}, kFeature);
  g.inputs = {{"x", {x, 0}}};
  g.outputs = {{"y", {sum, 0}}};
  const OmModel m = compile(std::move(g));
  REQUIRE(m.tasks.size() == 3);
  // 16 elements: each element-wise task takes 2 of the 4 vector cores.
  for (const Task& t : m.tasks) REQUIRE(t.block_dim == 2);

  // The two ops share only the input (read by both); the sum reads both outputs.
  const TaskGroups groups = concurrent_groups(m, load_chip_config("tiny"));
  const auto node_of = [&](size_t task) { return m.tasks[task].node; };
  size_t together = 0;  // groups holding both ops
  for (const auto& grp : groups.groups) {
    bool has_a = false, has_b = false, has_sum = false;
    for (size_t t : grp) {
      has_a |= node_of(t) == "a";
      has_b |= node_of(t) == "b";
      has_sum |= node_of(t) == "sum";
    }
    together += has_a && has_b;
    if (has_sum) CHECK(grp.size() == 1);
  }
  CHECK(together == 1);
  CHECK(groups.groups.size() == 2);
  REQUIRE(groups.cores.size() == 2);
  CHECK(groups.cores[0] ==
        std::vector<std::vector<std::string>>{{"aiv0", "aiv1"}, {"aiv2", "aiv3"}});

  const Inference seq = infer(m, false), conc = infer(m, true);
  REQUIRE(seq.outputs.size() == 1);
  REQUIRE(conc.outputs.size() == 1);
  CHECK(conc.outputs[0].data == seq.outputs[0].data);
  REQUIRE(conc.runs.size() == seq.runs.size());
  CHECK(conc.runs.back().group + 1 == groups.groups.size());
  CHECK(groups.groups.size() < m.tasks.size());
  // Each group's tasks start together and the inference is the sum of the groups' makespans.
  uint64_t makespans = 0, in_order = 0;
  for (size_t gi = 0; gi < groups.groups.size(); ++gi) {
    uint64_t span = 0, start = 0;
    for (const TaskRun& r : conc.runs)
      if (r.group == gi) {
        if (span == 0) start = r.result.start_cycle;
        CHECK(r.result.start_cycle == start);
        span = std::max(span, r.result.cycles);
      }
    makespans += span;
  }
  for (const TaskRun& r : seq.runs) in_order += r.result.cycles;
  CHECK(makespans < in_order);
  CHECK(conc.cycles < seq.cycles);
}

TEST_CASE("concurrent offline run: a chain stays one task a group, as the run in order") {
  Graph g;
  int prev = add_node(g, "x", "Placeholder", {}, kFeature);
  const int x = prev;
  for (const char* name : {"r1", "r2", "r3"})
    prev = add_node(g, name, "Relu", {{prev, 0}}, kFeature);
  g.inputs = {{"x", {x, 0}}};
  g.outputs = {{"y", {prev, 0}}};
  const OmModel m = compile(std::move(g));
  REQUIRE(m.tasks.size() == 3);
  const TaskGroups groups = concurrent_groups(m, load_chip_config("tiny"));
  REQUIRE(groups.groups.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(groups.groups[i] == std::vector<size_t>{i});

  const Inference seq = infer(m, false), conc = infer(m, true);
  CHECK(conc.outputs[0].data == seq.outputs[0].data);
  CHECK(conc.cycles == seq.cycles);
  for (size_t i = 0; i < 3; ++i) CHECK(conc.runs[i].result.cycles == seq.runs[i].result.cycles);
}
