// The offline runner's run is one graph run (KernelLaunch::l2_run): with
// memory.l2.keep_within_graph_run on the tiny chip (8 MiB L2, write-through, a write miss
// allocates under the normal policy), a model of two Relus compiled apart has its second task
// hit in L2 on every line of the first task's output, while the first task, reading the input
// the host just copied (those lines dropped) in a run that starts cold, hits nothing; a second
// inference counts the same.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "adapter/graph/engine.h"
#include "adapter/graph/runner.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using namespace npusim::graph;
using compiler::DataType;
using npusim::test::counter;

TEST_CASE("offline run: the second task hits on the first one's output in the run's L2") {
  static Simulator sim(load_chip_config("tiny", {"memory.l2.keep_within_graph_run=true"}),
                       SimOptions{});
  REQUIRE(sim.config().l2_line_bytes == 512);
  constexpr int64_t kN = 64;  // [64, 64] f32: 16 KiB, 32 lines
  constexpr uint64_t kLines = kN * kN * 4 / 512;
  Graph g;
  const auto node = [&](const char* name, const char* op, std::vector<TensorRef> in) {
    Node n;
    n.name = name;
    n.op = op;
    n.inputs = std::move(in);
    n.outputs = {{DataType::F32, {kN, kN}}};
    if (std::string(op) != "Placeholder") n.attrs["T"] = std::string("f32");
    g.nodes.push_back(std::move(n));
    return static_cast<int>(g.nodes.size()) - 1;
  };
  const int x = node("x", "Placeholder", {});
  const int a = node("a", "Relu", {{x, 0}});
  const int b = node("b", "Relu", {{a, 0}});
  g.inputs = {{"x", {x, 0}}};
  g.outputs = {{"y", {b, 0}}};
  EngineOptions apart;
  apart.fusion = false;
  const OmModel m = compile_graph(std::move(g), sim.config(), apart);
  REQUIRE(m.tasks.size() == 2);
  OfflineRunner runner(m, sim, "relu2.om");
  runner.set_counter_trees(true);
  NpyArray in;
  in.dtype = "f4";
  in.shape = {kN, kN};
  in.data.assign(kN * kN * 4, 0);
  std::vector<std::vector<TaskRun>> runs(2);
  for (auto& r : runs) runner.run({in}, {"x"}, &r);
  for (const auto& r : runs) {
    REQUIRE(r.size() == 2);
    CHECK(counter(r[0].result.counters, "chip.l2.hits") == 0);
    CHECK(counter(r[1].result.counters, "chip.l2.hits") >= kLines);
  }
  CHECK(runs[1][1].result.cycles == runs[0][1].result.cycles);
  CHECK(counter_digest(runs[1][1].result.counter_delta) ==
        counter_digest(runs[0][1].result.counter_delta));
}
