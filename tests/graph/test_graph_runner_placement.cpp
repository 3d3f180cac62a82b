// The offline runner files an inference's L2 lines by region (KernelLaunch::gm_blocks: the
// constant and the activation region are the model's allocations), so where it places the two
// regions in device memory does not change the inference's timing or counters. The model,
// y = (x + c1) + c2 in two launches (fusion off), runs on the tiny chip with the L2 kept within
// the run and made direct-mapped and small (16 KiB: 32 sets of 512-byte lines) against the five
// 4 KiB tensors: the second launch hits on the first one's output unless the constants' lines
// took its sets, which, with lines filed at their device addresses, depends on where the
// constants lie relative to the activations (8 or 16 of its 24 lines hit at the placements
// below).
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "adapter/graph/engine.h"
#include "adapter/graph/runner.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using namespace npusim::graph;
using compiler::DataType;
using npusim::test::counter;

namespace {

constexpr int64_t kN = 1024;  // f32 elements per tensor: 4 KiB, 8 lines

// Every launch simulated (no replay), so equal timings are the model's, not a replay's.
Simulator& sim() {
  static Simulator s(
      load_chip_config("tiny",
                       {"memory.l2.bytes=16 KiB", "memory.l2.ways=1", "memory.l2.line_bytes=512",
                        "memory.l2.write_back=true", "memory.l2.keep_within_graph_run=true"}),
      [] {
        SimOptions o;
        o.replay = SimOptions::Replay::off;
        o.replay_translated = false;
        return o;
      }());
  return s;
}

std::vector<float> random_floats(unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(kN);
  for (float& f : v) f = u(rng);
  return v;
}

Node f32_node(const char* name, const char* op, std::vector<TensorRef> in) {
  Node n;
  n.name = name;
  n.op = op;
  n.inputs = std::move(in);
  n.outputs = {{DataType::F32, {kN}}};
  if (std::string(op) == "AddV2") n.attrs["T"] = std::string("f32");
  return n;
}

// y = (x + c1) + c2, one launch per addition.
OmModel two_adds(const std::vector<float>& c1, const std::vector<float>& c2) {
  Graph g;
  const auto add = [&](Node n) {
    g.nodes.push_back(std::move(n));
    return static_cast<int>(g.nodes.size()) - 1;
  };
  const auto constant = [&](const char* name, const std::vector<float>& v) {
    Node n = f32_node(name, "Const", {});
    n.value.resize(v.size() * 4);
    std::memcpy(n.value.data(), v.data(), n.value.size());
    return add(std::move(n));
  };
  const int x = add(f32_node("x", "Placeholder", {}));
  const int k1 = constant("c1", c1), k2 = constant("c2", c2);
  const int y1 = add(f32_node("y1", "AddV2", {{x, 0}, {k1, 0}}));
  const int y2 = add(f32_node("y2", "AddV2", {{y1, 0}, {k2, 0}}));
  g.inputs = {{"x", {x, 0}}};
  g.outputs = {{"y", {y2, 0}}};
  EngineOptions apart;
  apart.fusion = false;
  return compile_graph(std::move(g), sim().config(), apart);
}

struct Inference {
  std::vector<float> y;
  std::vector<uint64_t> cycles, digests, hits;  // per launch
};

Inference infer(const OmModel& m, const std::vector<float>& x, RegionBases bases) {
  OfflineRunner runner(m, sim(), "adds.om", bases);
  NpyArray in;
  in.dtype = "f4";
  in.shape = {kN};
  in.data.resize(x.size() * 4);
  std::memcpy(in.data.data(), x.data(), in.data.size());
  std::vector<TaskRun> runs;
  const NpyArray out = runner.run({in}, {"x"}, &runs).at(0);
  Inference r;
  r.y.resize(kN);
  REQUIRE(out.data.size() == r.y.size() * 4);
  std::memcpy(r.y.data(), out.data.data(), out.data.size());
  for (const TaskRun& t : runs) {
    r.cycles.push_back(t.result.cycles);
    r.digests.push_back(counter_digest(t.result.counter_delta));
    r.hits.push_back(counter(t.result.counter_delta.tree(), "chip.l2.hits"));
  }
  return r;
}

}  // namespace

TEST_CASE("offline runner: an inference times the same wherever the regions lie") {
  const std::vector<float> x = random_floats(1), c1 = random_floats(2), c2 = random_floats(3);
  const OmModel m = two_adds(c1, c2);
  REQUIRE(m.tasks.size() == 2);
  std::vector<float> want(kN);
  for (int64_t i = 0; i < kN; ++i) want[i] = (x[i] + c1[i]) + c2[i];
  // Where `npusim infer` puts them: the constants at 0x10000, the activations after them.
  const Inference packed = infer(m, x, {});
  CHECK(packed.y == want);
  REQUIRE(packed.hits.size() == 2);
  CHECK(packed.hits[1] > 0);  // the run's L2 holds the first launch's output
  // The activations one to seven 4 KiB steps further on (each step moves their lines by 8 sets
  // against the constants'), then the constants moved instead, and below the activations.
  std::vector<RegionBases> others;
  for (uint64_t k = 0; k < 8; ++k) others.push_back({0x100000, 0x200000 + k * 4096});
  for (uint64_t k = 1; k < 4; ++k) others.push_back({0x200000 + k * 4096, 0x100000});
  for (const RegionBases& b : others) {
    INFO("constants at " << b.constant << ", activations at " << b.activation);
    const Inference moved = infer(m, x, b);
    CHECK(moved.y == want);
    CHECK(moved.cycles == packed.cycles);
    CHECK(moved.digests == packed.digests);
  }
}

TEST_CASE("offline runner: misplaced regions are refused") {
  const OmModel m = two_adds(random_floats(2), random_floats(3));
  CHECK_THROWS_WITH(OfflineRunner(m, sim(), "adds.om", {0x100800, 0x200000}),
                    Catch::Contains("multiple of 4096"));
  CHECK_THROWS_WITH(OfflineRunner(m, sim(), "adds.om", {0x100000, 0x100000}),
                    Catch::Contains("overlaps the activation region"));
}

TEST_CASE("offline model: each task names the planned buffers its arguments lie in") {
  const OmModel m = two_adds(random_floats(2), random_floats(3));
  for (const auto* list : {&m.init_tasks, &m.tasks})
    for (const Task& t : *list) {
      INFO("node " << t.node);
      REQUIRE_FALSE(t.buffers.empty());
      for (size_t i = 0; i < t.buffers.size(); ++i) {
        const TaskBuffer& b = t.buffers[i];
        CHECK(b.bytes > 0);
        CHECK(b.offset + b.bytes <=
              (b.region == Region::kConstant ? m.constants.size() : m.activation_bytes));
        for (size_t j = 0; j < i; ++j)  // pairwise disjoint
          CHECK((t.buffers[j].region != b.region || t.buffers[j].offset >= b.offset + b.bytes ||
                 b.offset >= t.buffers[j].offset + t.buffers[j].bytes));
      }
      for (const ArgValue& a : t.args) {
        if (a.scalar) continue;
        bool inside = false;
        for (const TaskBuffer& b : t.buffers)
          inside |= b.region == a.region && a.value >= b.offset && a.value < b.offset + b.bytes;
        CHECK(inside);
      }
    }
  // The .om keeps them; a buffer outside its region is refused.
  const std::vector<uint8_t> bytes = serialize_om(m);
  const OmModel back = parse_om(bytes, "adds.om");
  REQUIRE(back.tasks.size() == m.tasks.size());
  for (size_t i = 0; i < m.tasks.size(); ++i) {
    REQUIRE(back.tasks[i].buffers.size() == m.tasks[i].buffers.size());
    for (size_t j = 0; j < m.tasks[i].buffers.size(); ++j) {
      CHECK(back.tasks[i].buffers[j].region == m.tasks[i].buffers[j].region);
      CHECK(back.tasks[i].buffers[j].offset == m.tasks[i].buffers[j].offset);
      CHECK(back.tasks[i].buffers[j].bytes == m.tasks[i].buffers[j].bytes);
    }
  }
  OmModel bad = m;
  bad.tasks[0].buffers[0].bytes = m.activation_bytes + m.constants.size() + 1;
  CHECK_THROWS_WITH(parse_om(serialize_om(bad), "bad.om"),
                    Catch::Contains("a buffer of node") && Catch::Contains("outside its region"));
}
