// MultiTensorCast (ops/cast.cpp; made by the TF plugin of a training step's weight casts,
// graph_fusion.h rewrite 19): output i is input i's own Cast, bit for bit, with the members as
// segments of a few multi-tensor launches. Reference: the Cast op's own kernel run on the same
// input (itself checked against TF's CPU kernel, tests/tf/test_kernels_cast.py), and the rounding
// of the source value to the target type.
#include <catch2/catch.hpp>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

std::string type_name(DataType t) { return std::string(compiler::data_type_name(t)); }

// Elements per vector core above which multi_tensor_launches takes a segment as large.
int64_t large_elements(const ChipConfig& cfg) {
  const CoreKindConfig* v = cfg.core_kind(cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE);
  return 1024 * (v ? v->count : 1);
}

}  // namespace

TEST_CASE("MultiTensorCast: each output has the bits of its member's own Cast") {
  const ChipConfig& cfg = test_sim().config();
  using V = std::vector<int64_t>;
  const int64_t large = large_elements(cfg) + 40;
  // Small members of odd sizes, an empty one, large ones (launches of their own kind).
  const std::vector<V> shapes = {
      V{3, 7}, V{1}, V{64}, V{0, 4}, V{large}, V{5, 33}, V{2, large / 2 + 3}, V{1000}};
  uint32_t seed = 90;
  for (const auto& [src, dst, truncate] :
       std::vector<std::tuple<DataType, DataType, bool>>{{DataType::F32, DataType::F16, false},
                                                         {DataType::F32, DataType::F16, true},
                                                         {DataType::F16, DataType::F32, false},
                                                         {DataType::F32, DataType::BF16, false}}) {
    INFO(type_name(src) << " -> " << type_name(dst) << (truncate ? " truncate" : ""));
    std::vector<HostTensor> xs;
    std::vector<TensorDesc> descs;
    for (const V& shape : shapes) {
      // Beyond f16's range (inf), its subnormals and ties between f16 neighbours.
      xs.push_back(random_tensor(src, shape, -70000, 70000, seed++));
      std::vector<double>& v = xs.back().values;
      if (v.size() > 4 && src == DataType::F32) {
        v[0] = 2049.0;                         // a tie between f16 neighbours: to even
        v[1] = -2051.0;                        // the other tie
        v[2] = round_to(DataType::F32, 1e-7);  // an f16 subnormal
        v[3] = round_to(DataType::F32, 3e-8);  // rounds to f16 zero
      }
      descs.push_back(xs.back().desc);
    }
    const int64_t n = static_cast<int64_t>(shapes.size());
    const std::map<std::string, compiler::AttrValue> attrs = {
        {"SrcT", type_name(src)}, {"DstT", type_name(dst)}, {"Truncate", truncate}, {"N", n}};
    CompiledKernel multi = compiler::compile(make_op("MultiTensorCast", descs, attrs), cfg);
    REQUIRE(multi.outputs.size() == shapes.size());
    // One launch for the small members, one for the large ones (their streams fit the L2).
    CHECK(multi.launches.size() == 2);
    const RunResult all = run_compiled(test_sim(), multi, xs);
    for (size_t i = 0; i < shapes.size(); ++i) {
      INFO("member " << i << " " << compiler::shape_str(shapes[i]));
      REQUIRE(all.outputs[i].desc == (TensorDesc{dst, shapes[i]}));
      if (xs[i].values.empty()) continue;
      CompiledKernel own = compiler::compile(
          make_op("Cast", {xs[i].desc},
                  {{"SrcT", type_name(src)}, {"DstT", type_name(dst)}, {"Truncate", truncate}}),
          cfg);
      const RunResult alone = run_compiled(test_sim(), own, {xs[i]});
      CHECK(all.outputs[i].values == alone.outputs[0].values);
      if (!truncate)  // round to nearest even: the value rounded to the target type
        for (size_t e = 0; e < xs[i].values.size(); ++e)
          CHECK(all.outputs[i].values[e] == round_to(dst, xs[i].values[e]));
    }
  }
}

TEST_CASE("MultiTensorCast: bad attributes and inputs are named") {
  const ChipConfig& cfg = test_sim().config();
  const TensorDesc f32{DataType::F32, {8}}, s32{DataType::S32, {8}};
  auto compile = [&](std::vector<TensorDesc> in, const std::string& src, int64_t n) {
    return compiler::compile(
        make_op("MultiTensorCast", in, {{"SrcT", src}, {"DstT", std::string("f16")}, {"N", n}}),
        cfg);
  };
  CHECK_THROWS_WITH(compile({f32, f32}, "f32", 3), Catch::Contains("N = 3"));
  CHECK_THROWS_WITH(compile({f32, s32}, "f32", 2), Catch::Contains("input 1 is s32"));
  CHECK_THROWS_WITH(compile({s32, s32}, "s32", 2), Catch::Contains("only between float types"));
}

TEST_CASE("MultiTensorCast: small members ahead of larger ones are spread over the blocks") {
  // Each segment a block meets costs it a setup (its addresses, its first tile's round trip to
  // HBM): with the blocks' ranges split by elements alone, the first block would meet all 16
  // small members and pay 16 setups while the others stream. Balanced by their costs, the 16
  // small members (each an HBM latency and its 128 elements' 6 bytes at a block's share of
  // the stream rate) are shared by the vector cores, one more on the longest block at most
  // (the cut's granularity): so much longer than the two larger members alone, at most.
  const ChipConfig& cfg = test_sim().config();
  using V = std::vector<int64_t>;
  const int64_t larger = large_elements(cfg) * 3 / 4;  // still the small kind: one launch
  std::vector<V> shapes(16, V{128});
  shapes.push_back(V{larger});
  shapes.push_back(V{larger + 96});
  std::vector<HostTensor> xs;
  std::vector<TensorDesc> descs;
  uint32_t seed = 300;
  for (const V& shape : shapes) {
    xs.push_back(random_tensor(DataType::F32, shape, -100, 100, seed++));
    descs.push_back(xs.back().desc);
  }
  auto cast_of = [&](size_t first) {
    const std::vector<TensorDesc> d(descs.begin() + static_cast<std::ptrdiff_t>(first),
                                    descs.end());
    return compiler::compile(make_op("MultiTensorCast", d,
                                     {{"SrcT", type_name(DataType::F32)},
                                      {"DstT", type_name(DataType::F16)},
                                      {"Truncate", false},
                                      {"N", static_cast<int64_t>(d.size())}}),
                             cfg);
  };
  const CompiledKernel all = cast_of(0), larger_two = cast_of(16);
  REQUIRE(all.launches.size() == 1);
  REQUIRE(larger_two.launches.size() == 1);
  const RunResult ran = run_compiled(test_sim(), all, xs);
  for (size_t i = 0; i < shapes.size(); ++i)
    for (size_t e = 0; e < xs[i].values.size(); ++e)
      REQUIRE(ran.outputs[i].values[e] == round_to(DataType::F16, xs[i].values[e]));
  const RunResult alone =
      run_compiled(test_sim(), larger_two, std::vector<HostTensor>(xs.begin() + 16, xs.end()));
  INFO(all.launches[0].summary);
  const CoreKindConfig* v = cfg.core_kind(cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE);
  const int cores = v ? v->count : 1;
  const double rate = std::min(cfg.path_rate(isa::Buf::GM, isa::Buf::UB),
                               cfg.hbm_sustained_bytes_per_cycle() / cores);
  const double small_member = cfg.hbm_latency_cycles + 128 * 6 / rate;
  CHECK(static_cast<double>(ran.cycles) <=
        static_cast<double>(alone.cycles) + (16.0 / cores + 1) * small_member);
}
