// Compiled kernels in timing-only mode (SimOptions::functional = false; docs/chip_model.md,
// "Timing-only mode"): a set of ops from every kernel family the TF plugin's training steps use
// (cube MatMul, a convolution with its casts, an element-wise op broadcasting a scalar tensor,
// softmax, a reduction, a gather, int64 casts and FloorMod on the scalar unit) runs once in a
// functional and once in a timing-only simulator, each in its own child process (one chip per
// process). Their inputs come from the host, which a timing-only device memory keeps, so even
// the kernels that load data with `ld` (the broadcast scalar, the indices, the int64 values,
// the divisor) take the same path: every op takes the same cycles and the counter tree after
// all of them is the same. The timing-only run computed nothing: its outputs read as zero.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/common/child_process.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;
using nlohmann::json;

namespace {

struct Case {
  compiler::OpDesc op;
  std::vector<HostTensor> inputs;
};

HostTensor s64_tensor(std::vector<int64_t> shape, int64_t scale, int64_t offset) {
  HostTensor t{TensorDesc{DataType::S64, std::move(shape)}, {}};
  for (int64_t i = 0; i < t.desc.num_elements(); ++i) {
    const int64_t v = (i % 2 ? -1 : 1) * (i * scale + offset);
    t.values.push_back(static_cast<double>(v));
    t.s64.push_back(v);
  }
  return t;
}

std::vector<Case> cases() {
  std::vector<Case> c;
  auto a = random_tensor(DataType::F16, {64, 96}, -2, 2, 1);
  auto b = random_tensor(DataType::F16, {96, 80}, -2, 2, 2);
  c.push_back({make_op("MatMul", {a.desc, b.desc}), {a, b}});
  auto x = random_tensor(DataType::F32, {2, 8, 8, 16}, -1, 1, 3);
  auto f = random_tensor(DataType::F32, {3, 3, 16, 16}, -1, 1, 4);
  c.push_back(
      {make_op("Conv2D", {x.desc, f.desc},
               {{"strides", std::vector<int64_t>{1, 1, 1, 1}}, {"padding", std::string("SAME")}}),
       {x, f}});
  auto v = random_tensor(DataType::F32, {4096}, -10, 10, 5);
  auto s = random_tensor(DataType::F32, {}, 0.5, 2, 6);  // broadcast scalar: loaded with ld
  c.push_back({make_op("Mul", {v.desc, s.desc}), {v, s}});
  auto logits = random_tensor(DataType::F32, {32, 100}, -5, 5, 7);
  c.push_back({make_op("Softmax", {logits.desc}), {logits}});
  auto r = random_tensor(DataType::F32, {64, 50}, -5, 5, 8);
  c.push_back(
      {make_op("Sum", {r.desc}, {{"axes", std::vector<int64_t>{0}}, {"keep_dims", false}}), {r}});
  auto params = random_tensor(DataType::F32, {50, 24}, -5, 5, 9);
  HostTensor idx{TensorDesc{DataType::S32, {40}}, {}};
  for (int i = 0; i < 40; ++i) idx.values.push_back((i * 17) % 50);  // indices: loaded with ld
  c.push_back(
      {make_op("GatherV2", {params.desc, idx.desc}, {{"axis", int64_t{0}}}), {params, idx}});
  auto big = s64_tensor({300}, 8589934593, 5);
  c.push_back(
      {make_op("Cast", {big.desc}, {{"SrcT", std::string("s64")}, {"DstT", std::string("f32")}}),
       {big}});
  auto num = s64_tensor({64}, 12345, 3);
  auto div = s64_tensor({}, 0, 7);  // a divisor of zero here would fault
  c.push_back({make_op("FloorMod", {num.desc, div.desc}), {num, div}});
  return c;
}

// Runs every case on a fresh chip of the test chip config; returns {"ops": [{op, cycles, nonzero
// outputs}], "counters": the counter tree after all of them}.
json run_all(bool functional) {
  SimOptions opts;
  opts.functional = functional;
  Simulator sim(load_chip_config(test_chip_name()), opts);
  json out = {{"ops", json::array()}};
  for (const Case& c : cases()) {
    compiler::CompiledKernel k = compiler::compile(c.op, sim.config());
    RunResult r = run_compiled(sim, k, c.inputs);
    int64_t nonzero = 0;
    for (const HostTensor& t : r.outputs)
      for (double d : t.values) nonzero += d != 0;
    out["ops"].push_back({{"op", c.op.str()},
                          {"launches", k.launches.size()},
                          {"cycles", r.cycles},
                          {"nonzero", nonzero}});
  }
  out["counters"] = sim.counters();
  return out;
}

json run_in_child(bool functional) {
  return json::parse(test::run_in_child([functional] { return run_all(functional).dump(); }));
}

}  // namespace

TEST_CASE("compiled kernels take the same cycles and counters timing-only as functional") {
  const json f = run_in_child(true);
  const json t = run_in_child(false);
  REQUIRE(f["ops"].size() == cases().size());
  REQUIRE(t["ops"].size() == f["ops"].size());
  for (size_t i = 0; i < f["ops"].size(); ++i) {
    const json &fo = f["ops"][i], &to = t["ops"][i];
    INFO(fo["op"].get<std::string>());
    CHECK(fo["launches"] == to["launches"]);
    CHECK(fo["cycles"].get<uint64_t>() > 0);
    CHECK(fo["cycles"] == to["cycles"]);
    CHECK(fo["nonzero"].get<int64_t>() > 0);  // it computed
    CHECK(to["nonzero"] == 0);                // it did not
  }
  CHECK(f["counters"] == t["counters"]);
}
