// AllFinite (ops/all_finite.cpp; made by the TF plugin of a loss scale's overflow check,
// graph_fusion.h rewrite 20): true exactly when every element of every input is finite.
// Reference: the inputs' values on the host (std::isfinite), and TensorFlow's unfused form,
// All(Pack(All(IsFinite(x[i])))), compiled and run op by op on the same chip.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/kernel_builder.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

using V = std::vector<int64_t>;

// Members of odd sizes (a tensor's last 32-byte block partial), an empty one, a scalar and,
// per chip, one larger than a vector core's tile so that pieces take several tiles.
std::vector<V> member_shapes(const ChipConfig& cfg) {
  const CoreKindConfig* v = cfg.core_kind(cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE);
  const int64_t large = static_cast<int64_t>(v->capacity(isa::Buf::UB) / 4) + 37;
  return {V{3, 7}, V{}, V{0, 4}, V{64}, V{5, 33}, V{large}, V{2, 9}, V{1}};
}

std::vector<HostTensor> members(DataType t, const std::vector<V>& shapes, uint32_t seed) {
  std::vector<HostTensor> xs;
  for (const V& s : shapes) xs.push_back(random_tensor(t, s, -1000, 1000, seed++));
  return xs;
}

bool host_all_finite(const std::vector<HostTensor>& xs) {
  for (const HostTensor& x : xs)
    for (double v : x.values)
      if (!std::isfinite(v)) return false;
  return true;
}

bool run_all_finite(const std::vector<HostTensor>& xs, DataType t, size_t* launches = nullptr) {
  std::vector<TensorDesc> descs;
  for (const HostTensor& x : xs) descs.push_back(x.desc);
  const CompiledKernel k =
      compiler::compile(make_op("AllFinite", descs,
                                {{"T", std::string(compiler::data_type_name(t))},
                                 {"N", static_cast<int64_t>(xs.size())}}),
                        test_sim().config());
  if (launches) *launches = k.launches.size();
  REQUIRE(k.outputs.size() == 1);
  REQUIRE(k.outputs[0] == (TensorDesc{DataType::BOOL, {}}));
  const RunResult r = run_compiled(test_sim(), k, xs);
  REQUIRE(r.outputs[0].values.size() == 1);
  return r.outputs[0].values[0] != 0;
}

// TensorFlow's graph for the same check, op by op: IsFinite and All per member, Pack, All.
bool run_unfused(const std::vector<HostTensor>& xs) {
  std::vector<HostTensor> alls;
  for (const HostTensor& x : xs) {
    const RunResult f = run_op("IsFinite", {x}, {}, 1);
    V axes;
    for (size_t a = 0; a < x.desc.shape.size(); ++a) axes.push_back(static_cast<int64_t>(a));
    const RunResult all = run_op("All", {f.outputs[0]}, {{"axes", axes}}, 1);
    alls.push_back(all.outputs[0]);
  }
  const RunResult packed =
      run_op("Pack", alls, {{"axis", int64_t{0}}, {"N", int64_t(alls.size())}}, 1);
  const RunResult all = run_op("All", {packed.outputs[0]}, {{"axes", V{0}}}, 1);
  return all.outputs[0].values[0] != 0;
}

}  // namespace

TEST_CASE("AllFinite: every element of every member checked, nothing past a member's end") {
  const ChipConfig& cfg = test_sim().config();
  const std::vector<V> shapes = member_shapes(cfg);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<DataType> types = {DataType::F32, DataType::F16};
  if (cfg.vector_bf16_conversion) types.push_back(DataType::BF16);
  uint32_t seed = 700;
  for (DataType t : types) {
    INFO(compiler::data_type_name(t));
    std::vector<HostTensor> xs = members(t, shapes, seed);
    seed += 20;
    size_t launches = 0;
    CHECK(run_all_finite(xs, t, &launches));
    // One launch where the vector cores can meet at a barrier (cross-core flags), else two.
    CHECK(launches == (cfg.split && cfg.cross_core_flag_ids > 0 ? 1u : 2u));
    // One non-finite value anywhere: the first element, a member's last element (inside its
    // last partial 32-byte block), the large member's middle (a later tile), the scalar.
    for (const auto& [member, where, value] : std::vector<std::tuple<size_t, int64_t, double>>{
             {0, 0, inf}, {0, 20, nan}, {4, 164, -inf}, {5, -1, nan}, {1, 0, inf}, {7, 0, -inf}}) {
      std::vector<HostTensor> bad = xs;
      std::vector<double>& v = bad[member].values;
      const int64_t at = where < 0 ? static_cast<int64_t>(v.size()) / 2 : where;
      INFO("member " << member << " element " << at << " = " << value);
      REQUIRE(at < static_cast<int64_t>(v.size()));
      v[static_cast<size_t>(at)] = value;
      REQUIRE_FALSE(host_all_finite(bad));
      CHECK_FALSE(run_all_finite(bad, t));
    }
    // f16's largest finite value and its negative are finite; an f32 value beyond f16's range
    // is only in an f32 member.
    std::vector<HostTensor> edge = xs;
    edge[3].values[0] = t == DataType::F16 ? 65504.0 : 3.0e38;
    edge[3].values[1] = t == DataType::F16 ? -65504.0 : -3.0e38;
    CHECK(run_all_finite(edge, t));
  }
}

TEST_CASE("AllFinite: the same answer as TensorFlow's op-by-op check") {
  const ChipConfig& cfg = test_sim().config();
  std::vector<HostTensor> xs = members(DataType::F32, {V{4, 5}, V{17}, V{3}}, 900);
  CHECK(run_all_finite(xs, DataType::F32) == run_unfused(xs));
  CHECK(run_unfused(xs));
  xs[1].values[16] = std::numeric_limits<double>::infinity();
  CHECK(run_all_finite(xs, DataType::F32) == run_unfused(xs));
  CHECK_FALSE(run_unfused(xs));
  (void)cfg;
}

TEST_CASE("AllFinite: more members than a kernel's arguments, in several launches") {
  // 772 members: launches of at most KernelBuilder::max_args() - 2 = 254, so four of 193: A and
  // C all empty (one core each: C resumes core 0's row alone, the others' rows stay), B and D
  // of values over every core (D with one member larger than a tile).
  const ChipConfig& cfg = test_sim().config();
  const CoreKindConfig* v = cfg.core_kind(cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE);
  const int64_t large = static_cast<int64_t>(v->capacity(isa::Buf::UB) / 4) + 37;
  const int per_launch = compiler::KernelBuilder::max_args() - 2;
  REQUIRE(per_launch == 254);
  const size_t part = 193, count = 4 * part;
  std::vector<V> shapes;
  const std::vector<V> sizes = {V{3}, V{17}, V{40}, V{2, 5}};
  for (size_t i = 0; i < count; ++i) {
    const size_t p = i / part;
    shapes.push_back(p % 2 == 0 ? V{0} : sizes[i % sizes.size()]);
  }
  shapes[3 * part + 7] = V{large};
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (DataType t : {DataType::F32, DataType::F16}) {
    INFO(compiler::data_type_name(t));
    const std::vector<HostTensor> xs = members(t, shapes, 1200);
    size_t launches = 0;
    REQUIRE(host_all_finite(xs));
    CHECK(run_all_finite(xs, t, &launches));
    CHECK(launches == (cfg.split && cfg.cross_core_flag_ids > 0 ? 4u : 5u));
    // B's first and last members (core 0's and the last core's rows, resumed by C and D), D's
    // large member's middle (a later tile), D's last member.
    for (const auto& [member, value] : std::vector<std::pair<size_t, double>>{
             {part, inf}, {2 * part - 1, nan}, {3 * part + 7, -inf}, {count - 1, nan}}) {
      std::vector<HostTensor> bad = xs;
      std::vector<double>& vals = bad[member].values;
      vals[vals.size() / 2] = value;
      INFO("member " << member << " = " << value);
      REQUIRE_FALSE(host_all_finite(bad));
      CHECK_FALSE(run_all_finite(bad, t));
    }
  }
}

TEST_CASE("AllFinite: only empty members is true") {
  CHECK(run_all_finite({random_tensor(DataType::F32, V{0}, -1, 1, 1)}, DataType::F32));
}

TEST_CASE("AllFinite: bad attributes and inputs are named") {
  const ChipConfig& cfg = test_sim().config();
  const TensorDesc f32{DataType::F32, {8}}, f16{DataType::F16, {8}}, m{DataType::F32, {2, 4}};
  auto compile = [&](std::vector<TensorDesc> in, int64_t n, V ranks = {}) {
    std::map<std::string, compiler::AttrValue> attrs = {{"T", std::string("f32")}, {"N", n}};
    if (!ranks.empty()) attrs["ranks"] = ranks;
    return compiler::compile(make_op("AllFinite", in, attrs), cfg);
  };
  CHECK_THROWS_WITH(compile({f32, f32}, 3), Catch::Contains("N = 3"));
  CHECK_THROWS_WITH(compile({f32, f16}, 2), Catch::Contains("input 1 is f16"));
  CHECK_THROWS_WITH(compile({f32, m}, 2, {1, 1}), Catch::Contains("input 1 has rank 2"));
  CHECK_NOTHROW(compile({f32, m}, 2, {1, 2}));
}
