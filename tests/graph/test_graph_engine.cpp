// The graph engine (adapter/graph) on graphs built in code, on the tiny chip: the convolution
// epilogue fold against a double-precision reference and against the unfused graph, the
// element-wise chain fusion, the unmappable-op error, the static memory plan, the .om format's
// checks and the runner's input checks.
#include <fmt/format.h>
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "adapter/graph/engine.h"
#include "adapter/graph/memory_plan.h"
#include "adapter/graph/passes.h"
#include "adapter/graph/runner.h"

using namespace npusim;
using namespace npusim::graph;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

const ChipConfig& tiny() {
  static ChipConfig cfg = load_chip_config("tiny");
  return cfg;
}

Simulator& sim() {
  static Simulator s(tiny(), SimOptions{});
  return s;
}

std::vector<float> random_floats(size_t n, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

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

int add_const(Graph& g, const std::string& name, std::vector<int64_t> shape,
              const std::vector<float>& v) {
  const int i = add_node(g, name, "Const", {}, {DataType::F32, std::move(shape)});
  g.nodes[i].value.resize(v.size() * 4);
  std::memcpy(g.nodes[i].value.data(), v.data(), v.size() * 4);
  return i;
}

NpyArray f32_array(std::vector<int64_t> shape, const std::vector<float>& v) {
  NpyArray a;
  a.dtype = "f4";
  a.shape = std::move(shape);
  a.data.resize(v.size() * 4);
  std::memcpy(a.data.data(), v.data(), a.data.size());
  return a;
}

std::vector<float> floats(const NpyArray& a) {
  std::vector<float> v(a.data.size() / 4);
  std::memcpy(v.data(), a.data.data(), a.data.size());
  return v;
}

// x[1,6,6,3] -> Conv2D 3x3 VALID (4 filters) -> BiasAdd b -> Mul s -> Relu.
struct ConvGraph {
  std::vector<float> x = random_floats(1 * 6 * 6 * 3, 1), w = random_floats(3 * 3 * 3 * 4, 2),
                     b = random_floats(4, 3), s = {0.5f, 1.5f, -2.0f, 1.0f};
  Graph graph() const {
    Graph g;
    const int in = add_node(g, "x", "Placeholder", {}, {DataType::F32, {1, 6, 6, 3}});
    const int wc = add_const(g, "w", {3, 3, 3, 4}, w);
    const int conv =
        add_node(g, "conv", "Conv2D", {{in, 0}, {wc, 0}}, {DataType::F32, {1, 4, 4, 4}});
    g.nodes[conv].attrs["strides"] = std::vector<int64_t>{1, 1, 1, 1};
    g.nodes[conv].attrs["padding"] = std::string("VALID");
    g.nodes[conv].attrs["data_format"] = std::string("NHWC");
    const int bc = add_const(g, "b", {4}, b);
    const int bias =
        add_node(g, "bias", "BiasAdd", {{conv, 0}, {bc, 0}}, {DataType::F32, {1, 4, 4, 4}});
    const int sc = add_const(g, "s", {4}, s);
    const int mul = add_node(g, "mul", "Mul", {{bias, 0}, {sc, 0}}, {DataType::F32, {1, 4, 4, 4}});
    const int relu = add_node(g, "relu", "Relu", {{mul, 0}}, {DataType::F32, {1, 4, 4, 4}});
    g.inputs = {{"x", {in, 0}}};
    g.outputs = {{"y", {relu, 0}}};
    return g;
  }
  // max((conv(x, w) + b) * s, 0) in double.
  std::vector<double> reference() const {
    std::vector<double> y(4 * 4 * 4);
    for (int oh = 0; oh < 4; ++oh)
      for (int ow = 0; ow < 4; ++ow)
        for (int co = 0; co < 4; ++co) {
          double acc = 0;
          for (int kh = 0; kh < 3; ++kh)
            for (int kw = 0; kw < 3; ++kw)
              for (int ci = 0; ci < 3; ++ci)
                acc += double(x[((oh + kh) * 6 + ow + kw) * 3 + ci]) *
                       w[((kh * 3 + kw) * 3 + ci) * 4 + co];
          y[(oh * 4 + ow) * 4 + co] = std::max((acc + b[co]) * s[co], 0.0);
        }
    return y;
  }
};

std::vector<float> run_model(const OmModel& m, const std::vector<NpyArray>& in) {
  OfflineRunner runner(m, sim(), "test.om");
  return floats(runner.run(in, {"x"}).at(0));
}

}  // namespace

TEST_CASE("conv epilogue fold: one fused node, same result as unfused and as the reference") {
  const ConvGraph cg;
  EngineOptions unfused;
  unfused.fusion = false;
  const OmModel fused_model = compile_graph(cg.graph(), tiny());
  const OmModel plain_model = compile_graph(cg.graph(), tiny(), unfused);
  REQUIRE(fused_model.info["fusions"].size() == 1);
  CHECK(fused_model.info["fusions"][0]["pattern"] ==
        "Conv2D+BiasAdd+Mul+Relu -> Conv2DBatchNormInference");
  CHECK(fused_model.info["nodes"].size() == 1);
  CHECK(fused_model.tasks.size() < plain_model.tasks.size());
  for (const Task& t : fused_model.tasks) CHECK(t.node == "relu");  // the chain's last name
  const std::vector<NpyArray> in = {f32_array({1, 6, 6, 3}, cg.x)};
  const std::vector<float> fused = run_model(fused_model, in), plain = run_model(plain_model, in);
  const std::vector<double> ref = cg.reference();
  REQUIRE(fused.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    // fp16 operands (allow_fp32_to_fp16): 27 products of ~2^-11 relative error each, scaled.
    CHECK(std::abs(fused[i] - ref[i]) <= 2e-2 * (1 + std::abs(ref[i])));
    CHECK(std::abs(plain[i] - ref[i]) <= 2e-2 * (1 + std::abs(ref[i])));
  }
}

// x[1,6,6,3] -> Conv2D 3x3 SAME (4) -> Relu -> Conv2D 3x3 SAME (4) -> BiasAdd; with
// `second_output` the first convolution's result is a graph output too.
Graph two_convs(bool second_output) {
  Graph g;
  const TensorDesc t{DataType::F32, {1, 6, 6, 4}};
  const int x = add_node(g, "x", "Placeholder", {}, {DataType::F32, {1, 6, 6, 3}});
  int prev = x, relu0 = -1;
  for (int k = 0; k < 2; ++k) {
    const int64_t cin = k == 0 ? 3 : 4;
    const int w = add_const(g, "w" + std::to_string(k), {3, 3, cin, 4},
                            random_floats(size_t(36 * cin), 10 + k));
    const int conv = add_node(g, "conv" + std::to_string(k), "Conv2D", {{prev, 0}, {w, 0}}, t);
    g.nodes[conv].attrs["strides"] = std::vector<int64_t>{1, 1, 1, 1};
    g.nodes[conv].attrs["padding"] = std::string("SAME");
    const int c = add_const(g, "c" + std::to_string(k), {4}, random_floats(4, 20 + k));
    prev = k == 0 ? relu0 = add_node(g, "relu0", "Relu", {{conv, 0}}, t)
                  : add_node(g, "bias1", "BiasAdd", {{conv, 0}, {c, 0}}, t);
  }
  g.inputs = {{"x", {x, 0}}};
  g.outputs = {{"y", {prev, 0}}};
  if (second_output) g.outputs.push_back({"relu0", {relu0, 0}});
  return g;
}

TEST_CASE("fp16 hand-off between fused convolutions: one cast fewer, bit-identical output") {
  const OmModel half = compile_graph(two_convs(false), tiny());
  const OmModel kept = compile_graph(two_convs(true), tiny());  // relu0 is read outside: f32
  int handoffs = 0;
  for (const auto& f : half.info["fusions"])
    handoffs += f["pattern"].get<std::string>().find("in fp16") != std::string::npos;
  CHECK(handoffs == 1);
  CHECK(half.tasks.size() + 1 == kept.tasks.size());
  const std::vector<NpyArray> in = {f32_array({1, 6, 6, 3}, random_floats(108, 30))};
  CHECK(run_model(half, in) == run_model(kept, in));
}

// ResNet's block end on 16 channels: x[1,6,6,16] -> Conv2D 1x1 + BiasAdd -> Relu (h) ->
// Conv2D 1x1 + BiasAdd -> AddV2(., h) -> Relu.
struct ResidualGraph {
  std::vector<float> x = random_floats(6 * 6 * 16, 61), w0 = random_floats(16 * 16, 62),
                     w1 = random_floats(16 * 16, 63), b0 = random_floats(16, 64),
                     b1 = random_floats(16, 65);
  Graph graph() const {
    Graph g;
    const TensorDesc t{DataType::F32, {1, 6, 6, 16}};
    const int in = add_node(g, "x", "Placeholder", {}, t);
    auto conv_bias = [&](const std::string& n, TensorRef from, const std::vector<float>& w,
                         const std::vector<float>& b) {
      const int wc = add_const(g, n + "_w", {1, 1, 16, 16}, w);
      const int conv = add_node(g, n, "Conv2D", {from, {wc, 0}}, t);
      g.nodes[conv].attrs["strides"] = std::vector<int64_t>{1, 1, 1, 1};
      g.nodes[conv].attrs["padding"] = std::string("VALID");
      const int bc = add_const(g, n + "_b", {16}, b);
      return add_node(g, n + "_bias", "BiasAdd", {{conv, 0}, {bc, 0}}, t);
    };
    const int h = add_node(g, "relu0", "Relu", {{conv_bias("conv0", {in, 0}, w0, b0), 0}}, t);
    const int add =
        add_node(g, "add", "AddV2", {{conv_bias("conv1", {h, 0}, w1, b1), 0}, {h, 0}}, t);
    const int relu = add_node(g, "relu1", "Relu", {{add, 0}}, t);
    g.inputs = {{"x", {in, 0}}};
    g.outputs = {{"y", {relu, 0}}};
    return g;
  }
  std::vector<double> reference() const {
    std::vector<double> h(36 * 16), y(36 * 16);
    for (int p = 0; p < 36; ++p)
      for (int co = 0; co < 16; ++co) {
        double acc = b0[co];
        for (int ci = 0; ci < 16; ++ci) acc += double(x[p * 16 + ci]) * w0[ci * 16 + co];
        h[p * 16 + co] = std::max(acc, 0.0);
      }
    for (int p = 0; p < 36; ++p)
      for (int co = 0; co < 16; ++co) {
        double acc = b1[co] + h[p * 16 + co];
        for (int ci = 0; ci < 16; ++ci) acc += h[p * 16 + ci] * w1[ci * 16 + co];
        y[p * 16 + co] = std::max(acc, 0.0);
      }
    return y;
  }
};

TEST_CASE("residual add and its Relu into the second convolution (Conv2D + BN + Add + ReLU)") {
  const ResidualGraph rg;
  EngineOptions unfused;
  unfused.fusion = false;
  const OmModel fused_model = compile_graph(rg.graph(), tiny());
  const OmModel plain_model = compile_graph(rg.graph(), tiny(), unfused);
  std::vector<std::string> patterns;
  for (const auto& f : fused_model.info["fusions"]) patterns.push_back(f["pattern"]);
  CHECK(std::find(patterns.begin(), patterns.end(),
                  "Conv2DBatchNormInference+AddV2+Relu -> Conv2DBatchNormInference with a "
                  "residual") != patterns.end());
  for (const Task& t : fused_model.tasks) {
    CHECK(t.op_type != "AddV2");
    CHECK(t.op_type != "AddRelu");
  }
  CHECK(fused_model.tasks.size() < plain_model.tasks.size());
  const std::vector<NpyArray> in = {f32_array({1, 6, 6, 16}, rg.x)};
  const std::vector<float> fused = run_model(fused_model, in), plain = run_model(plain_model, in);
  const std::vector<double> ref = rg.reference();
  REQUIRE(fused.size() == ref.size());
  for (size_t i = 0; i < ref.size(); ++i) {
    // fp16 operands, two layers of 16 products each (h rounded to fp16 for the second)
    CHECK(std::abs(fused[i] - ref[i]) <= 2e-2 * (1 + std::abs(ref[i])));
    CHECK(std::abs(plain[i] - ref[i]) <= 2e-2 * (1 + std::abs(ref[i])));
  }
  // On a coupled chip the add and the ReLU run in the convolution's UB epilogue: the tasks
  // are the two convolutions and x's and h's casts (h is read as the residual: f32).
  const OmModel coupled = compile_graph(rg.graph(), load_chip_config("tiny_coupled"));
  for (const Task& t : coupled.tasks) CHECK(t.op_type == "Conv2DBatchNormInference");
  CHECK(coupled.tasks.size() == 4);
}

// MobileNetV2's strided depthwise step: x[1,7,7,16] -> Pad [[0,0],[0,1],[0,1],[0,0]] ->
// DepthwiseConv2dNative 3x3 stride 2 VALID (multiplier 1) -> Mul s -> AddV2 b -> Relu6; with
// `pad_output` the Pad's result is a graph output too.
struct DepthwiseGraph {
  std::vector<float> x = random_floats(7 * 7 * 16, 41), w = random_floats(3 * 3 * 16, 42),
                     s = random_floats(16, 43), b = random_floats(16, 44);
  DepthwiseGraph() {
    for (float& v : x) v *= 4;  // pre-activations beyond 6 too: both clamps are exercised
    for (float& v : s) v *= 3;
    for (float& v : b) v *= 3;
  }
  Graph graph(bool pad_output) const {
    Graph g;
    const int in = add_node(g, "x", "Placeholder", {}, {DataType::F32, {1, 7, 7, 16}});
    const int amounts = add_node(g, "amounts", "Const", {}, {DataType::S32, {4, 2}});
    const std::vector<int32_t> p = {0, 0, 0, 1, 0, 1, 0, 0};
    g.nodes[amounts].value.resize(p.size() * 4);
    std::memcpy(g.nodes[amounts].value.data(), p.data(), p.size() * 4);
    const int pad =
        add_node(g, "pad", "Pad", {{in, 0}, {amounts, 0}}, {DataType::F32, {1, 8, 8, 16}});
    const int wc = add_const(g, "w", {3, 3, 16, 1}, w);
    const TensorDesc t{DataType::F32, {1, 3, 3, 16}};
    const int dw = add_node(g, "dw", "DepthwiseConv2dNative", {{pad, 0}, {wc, 0}}, t);
    g.nodes[dw].attrs["strides"] = std::vector<int64_t>{1, 2, 2, 1};
    g.nodes[dw].attrs["padding"] = std::string("VALID");
    const int sc = add_const(g, "s", {16}, s);
    const int mul = add_node(g, "mul", "Mul", {{dw, 0}, {sc, 0}}, t);
    const int bc = add_const(g, "b", {16}, b);
    const int add = add_node(g, "add", "AddV2", {{mul, 0}, {bc, 0}}, t);
    const int relu6 = add_node(g, "relu6", "Relu6", {{add, 0}}, t);
    g.inputs = {{"x", {in, 0}}};
    g.outputs = {{"y", {relu6, 0}}};
    if (pad_output) g.outputs.push_back({"padded", {pad, 0}});
    return g;
  }
  // min(max(depthwise(pad(x), w) * s + b, 0), 6) in double.
  std::vector<double> reference() const {
    std::vector<double> y(3 * 3 * 16);
    for (int oh = 0; oh < 3; ++oh)
      for (int ow = 0; ow < 3; ++ow)
        for (int c = 0; c < 16; ++c) {
          double acc = 0;
          for (int kh = 0; kh < 3; ++kh)
            for (int kw = 0; kw < 3; ++kw) {
              const int h = 2 * oh + kh, wi = 2 * ow + kw;  // padded row / column
              if (h < 7 && wi < 7)  // the pad adds a zero row and column at the end
                acc += double(x[(h * 7 + wi) * 16 + c]) * w[(kh * 3 + kw) * 16 + c];
            }
          y[(oh * 3 + ow) * 16 + c] = std::min(std::max(acc * s[c] + b[c], 0.0), 6.0);
        }
    return y;
  }
};

TEST_CASE("depthwise: Pad into the padding, scale, shift and Relu6 into one vector pass") {
  const DepthwiseGraph dg;
  EngineOptions unfused;
  unfused.fusion = false;
  const OmModel fused_model = compile_graph(dg.graph(false), tiny());
  const OmModel kept_model = compile_graph(dg.graph(true), tiny());  // the Pad is read outside
  const OmModel plain_model = compile_graph(dg.graph(false), tiny(), unfused);
  std::vector<std::string> patterns;
  for (const auto& f : fused_model.info["fusions"]) patterns.push_back(f["pattern"]);
  CHECK(patterns == std::vector<std::string>{
                        "Pad+DepthwiseConv2dNative -> DepthwiseConv2dNative (padding EXPLICIT)",
                        "DepthwiseConv2dNative+Mul+AddV2+Relu6 -> "
                        "DepthwiseConv2dBatchNormInference"});
  std::vector<std::string> kept_patterns;
  for (const auto& f : kept_model.info["fusions"]) kept_patterns.push_back(f["pattern"]);
  CHECK(kept_patterns == std::vector<std::string>{"DepthwiseConv2dNative+Mul+AddV2+Relu6 -> "
                                                  "DepthwiseConv2dBatchNormInference"});
  // Per inference: the Pad's copy and the Mul and AddV2 launches go, the Relu6 is the batch
  // norm's pass (its fold and the folded filter's casts are init tasks).
  CHECK(fused_model.tasks.size() + 3 <= plain_model.tasks.size());
  CHECK(fused_model.tasks.size() < kept_model.tasks.size());
  const std::vector<NpyArray> in = {f32_array({1, 7, 7, 16}, dg.x)};
  const std::vector<double> ref = dg.reference();
  const std::vector<float> fused = run_model(fused_model, in), plain = run_model(plain_model, in),
                           kept = run_model(kept_model, in);
  REQUIRE(fused.size() == ref.size());
  int clamped_low = 0, clamped_high = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    // fp16 operands (allow_fp32_to_fp16): 9 products of ~2^-11 relative error each, scaled by
    // |s| <= 3 and x by 4: within 2e-2 of (1 + |y|) as the Conv2D case.
    CHECK(std::abs(fused[i] - ref[i]) <= 2e-2 * (1 + std::abs(ref[i])));
    CHECK(std::abs(plain[i] - ref[i]) <= 2e-2 * (1 + std::abs(ref[i])));
    CHECK(std::abs(kept[i] - ref[i]) <= 2e-2 * (1 + std::abs(ref[i])));
    CHECK(fused[i] >= 0.0f);
    CHECK(fused[i] <= 6.0f);
    clamped_low += ref[i] == 0.0;
    clamped_high += ref[i] == 6.0;
  }
  CHECK(clamped_low > 0);
  CHECK(clamped_high > 0);
  // On a coupled chip (the 310P's core) the batch norm and the clamp run on each tile in the
  // UB, in the depthwise convolution's kernel: one task per inference for the chain.
  const ChipConfig coupled = load_chip_config("tiny_coupled");
  const OmModel coupled_model = compile_graph(dg.graph(false), coupled);
  REQUIRE(coupled_model.tasks.size() == 2);  // x's cast and the convolution
  CHECK(coupled_model.tasks[1].op_type == "DepthwiseConv2dBatchNormInference");
}

// DepthwiseGraph's output read by a 1x1 Conv2D (16 -> 8) + BiasAdd, MobileNetV2's projection;
// with `relu6_output` the depthwise step's Relu6 is a graph output too.
Graph depthwise_then_projection(bool relu6_output) {
  const DepthwiseGraph dg;
  Graph g = dg.graph(false);
  const TensorRef relu6 = g.outputs[0].tensor;
  const int w = add_const(g, "pw", {1, 1, 16, 8}, random_floats(16 * 8, 45));
  const TensorDesc t{DataType::F32, {1, 3, 3, 8}};
  const int conv = add_node(g, "proj", "Conv2D", {relu6, {w, 0}}, t);
  g.nodes[conv].attrs["strides"] = std::vector<int64_t>{1, 1, 1, 1};
  g.nodes[conv].attrs["padding"] = std::string("VALID");
  const int b = add_const(g, "pb", {8}, random_floats(8, 46));
  const int bias = add_node(g, "proj_bias", "BiasAdd", {{conv, 0}, {b, 0}}, t);
  g.outputs = {{"y", {bias, 0}}};
  if (relu6_output) g.outputs.push_back({"relu6", relu6});
  return g;
}

TEST_CASE("fp16 hand-off from the depthwise batch norm to the projection: bit-identical") {
  const OmModel half = compile_graph(depthwise_then_projection(false), tiny());
  const OmModel kept = compile_graph(depthwise_then_projection(true), tiny());
  std::vector<std::string> handoffs;
  for (const auto& f : half.info["fusions"])
    if (f["pattern"].get<std::string>().find("in fp16") != std::string::npos)
      handoffs.push_back(f["pattern"]);
  CHECK(handoffs == std::vector<std::string>{
                        "DepthwiseConv2dBatchNormInference -> fused convolutions in fp16"});
  CHECK(half.tasks.size() + 1 == kept.tasks.size());  // the projection's input cast
  const std::vector<NpyArray> in = {f32_array({1, 7, 7, 16}, DepthwiseGraph().x)};
  CHECK(run_model(half, in) == run_model(kept, in));
}

TEST_CASE("element-wise chain: one FusedElementwise launch, bit-identical to the unfused ops") {
  Graph g;
  const TensorDesc t{DataType::F32, {2, 64}};
  const int x = add_node(g, "x", "Placeholder", {}, t);
  const int c = add_const(g, "c", {64}, random_floats(64, 5));
  const int sub = add_node(g, "sub", "Sub", {{x, 0}, {c, 0}}, t);
  const int sq = add_node(g, "square", "Square", {{sub, 0}}, t);
  const int mul = add_node(g, "mul", "Mul", {{sq, 0}, {x, 0}}, t);
  g.inputs = {{"x", {x, 0}}};
  g.outputs = {{"y", {mul, 0}}};
  EngineOptions unfused;
  unfused.fusion = false;
  const OmModel fused_model = compile_graph(g, tiny());
  const OmModel plain_model = compile_graph(g, tiny(), unfused);
  REQUIRE(fused_model.tasks.size() == 1);
  CHECK(fused_model.tasks[0].op_type == "FusedElementwise");
  CHECK(plain_model.tasks.size() == 3);
  const std::vector<NpyArray> in = {f32_array({2, 64}, random_floats(128, 6))};
  CHECK(run_model(fused_model, in) == run_model(plain_model, in));
}

TEST_CASE("unmappable ops: one error listing every such node") {
  Graph g;
  const TensorDesc t{DataType::F32, {8}};
  const int x = add_node(g, "x", "Placeholder", {}, t);
  const int a = add_node(g, "first_atan", "Atan", {{x, 0}}, t);
  const int r = add_node(g, "fine_relu", "Relu", {{a, 0}}, t);
  const int s = add_node(g, "second_sinh", "Sinh", {{r, 0}}, t);
  g.inputs = {{"x", {x, 0}}};
  g.outputs = {{"y", {s, 0}}};
  try {
    compile_graph(g, tiny());
    FAIL("no error");
  } catch (const UnmappableOpsError& e) {
    const std::string msg = e.what();
    CHECK(msg.find("2 node(s) cannot be mapped") != std::string::npos);
    CHECK(msg.find("first_atan (Atan)") != std::string::npos);
    CHECK(msg.find("second_sinh (Sinh)") != std::string::npos);
    CHECK(msg.find("fine_relu") == std::string::npos);
  }
}

TEST_CASE("memory plan: buffers live together never overlap; disjoint lifetimes share bytes") {
  std::vector<PlannedBuffer> b = {
      {"a", 1000, 0, 1}, {"b", 3000, 1, 2}, {"c", 1000, 2, 3}, {"d", 600, 3, 4}, {"e", 5000, 4, 5}};
  const uint64_t peak = plan_memory(b);
  for (size_t i = 0; i < b.size(); ++i) {
    CHECK(b[i].offset % kPlanAlign == 0);
    CHECK(b[i].offset + b[i].bytes <= peak);
    for (size_t j = i + 1; j < b.size(); ++j)
      if (b[i].first <= b[j].last && b[j].first <= b[i].last)
        CHECK((b[i].offset + b[i].bytes <= b[j].offset || b[j].offset + b[j].bytes <= b[i].offset));
  }
  // At step 4 d and e live (5,600 bytes + alignment); nothing needs more than e next to d or
  // b next to c: the sum of all (10,600) is not needed.
  CHECK(peak <= 5000 + 1024);
}

TEST_CASE(".om file: round trip; bad magic, truncation, corruption and version are errors") {
  const OmModel m = compile_graph(ConvGraph().graph(), tiny());
  const std::vector<uint8_t> bytes = serialize_om(m);
  const OmModel back = parse_om(bytes, "m.om");
  CHECK(back.tasks.size() == m.tasks.size());
  CHECK(back.constants == m.constants);
  CHECK(serialize_om(back) == bytes);
  std::vector<uint8_t> cut(bytes.begin(), bytes.end() - 100);
  CHECK_THROWS_WITH(parse_om(cut, "m.om"), Catch::Contains("m.om: truncated"));
  std::vector<uint8_t> flipped = bytes;
  flipped[bytes.size() / 2] ^= 0x40;
  CHECK_THROWS_WITH(parse_om(flipped, "m.om"), Catch::Contains("m.om: corrupt"));
  std::vector<uint8_t> other = bytes;
  other[0] = 'X';
  CHECK_THROWS_WITH(parse_om(other, "m.om"), Catch::Contains("not an npusim offline model"));
  std::vector<uint8_t> version = bytes;
  version[8] = 9;
  CHECK_THROWS_WITH(parse_om(version, "m.om"), Catch::Contains("format version 9"));
}

TEST_CASE("runner: wrong input shape or dtype, and another chip, are errors naming them") {
  const OmModel m = compile_graph(ConvGraph().graph(), tiny());
  OfflineRunner runner(m, sim(), "m.om");
  NpyArray shape = f32_array({1, 6, 6, 2}, random_floats(72, 1));
  CHECK_THROWS_WITH(runner.run({shape}, {"x.npy"}),
                    Catch::Contains("input 'x' (x.npy): expected f32[1,6,6,3]") &&
                        Catch::Contains("got numpy f4[1,6,6,2]"));
  NpyArray dtype = f32_array({1, 6, 6, 3}, random_floats(108, 1));
  dtype.dtype = "i4";
  CHECK_THROWS_WITH(runner.run({dtype}, {"x.npy"}), Catch::Contains("got numpy i4[1,6,6,3]"));
  CHECK_THROWS_WITH(check_model_chip(m, load_chip_config("910b"), "m.om"),
                    Catch::Contains("m.om was compiled for chip 'tiny', not '910b'"));
  CHECK_THROWS_WITH(check_model_chip(m, load_chip_config("tiny", {"memory.hbm.gbps=900"}), "m.om"),
                    Catch::Contains("another configuration of chip 'tiny'"));
}

namespace {

// The folders write_graph_json made, removed when the test ends.
struct TempDirs {
  std::vector<std::string> dirs;
  ~TempDirs() {
    for (const auto& d : dirs) std::filesystem::remove_all(d);
  }
};

// Writes graph.json (and w.npy, a 2x2 f32 constant) into a fresh folder; returns its path.
std::string write_graph_json(const std::string& nodes) {
  static TempDirs made;
  char tmpl[] = "/tmp/npusim-graph-test-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  made.dirs.push_back(dir);
  write_npy(dir + "/w.npy", f32_array({2, 2}, {1.0f, 2.0f, 3.0f, 4.0f}));
  std::ofstream(dir + "/graph.json") << R"({"format": "npusim-graph", "version": 1,
             "inputs": [{"name": "x", "tensor": "x:0"}],
             "outputs": [{"name": "y", "tensor": "mm:0"}], "nodes": [)"
                                     << nodes << "]}";
  return dir + "/graph.json";
}

const char* kMatMulNodes = R"(
  {"name": "mm", "op": "MatMul", "inputs": ["x:0", "w", "^x"], "attrs": {"T": {"type": "f32"}},
   "outputs": [{"dtype": "f32", "shape": [1, 2]}]},
  {"name": "x", "op": "Placeholder", "inputs": [], "outputs": [{"dtype": "f32", "shape": [1, 2]}]},
  {"name": "w", "op": "Const", "inputs": [], "value": "w.npy",
   "outputs": [{"dtype": "f32", "shape": [2, 2]}]})";

}  // namespace

TEST_CASE("graph.json: loaded in topological order and run; malformed files name node and key") {
  const std::string path = write_graph_json(kMatMulNodes);
  Graph g = load_graph_json(path);
  REQUIRE(g.nodes.size() == 3);
  CHECK(g.nodes[2].name == "mm");  // after its inputs; the control input is dropped
  CHECK(g.nodes[2].inputs.size() == 2);
  const OmModel m = compile_graph(std::move(g), tiny());
  CHECK(run_model(m, {f32_array({1, 2}, {1.0f, -1.0f})}) == std::vector<float>{-2.0f, -2.0f});

  std::string bad = kMatMulNodes;
  bad.replace(bad.find("\"x:0\", \"w\""), 10, "\"x:0\", \"v\"");
  CHECK_THROWS_WITH(load_graph_json(write_graph_json(bad)),
                    Catch::Contains("node 'mm': input 'v' names no node"));
  bad = kMatMulNodes;
  bad.replace(bad.find("\"f32\", \"shape\": [2, 2]"), 5, "\"f64\"");
  CHECK_THROWS_WITH(load_graph_json(write_graph_json(bad)),
                    Catch::Contains("node 'w' output 0: dtype 'f64' has no device type"));
  bad = kMatMulNodes;
  bad.replace(bad.find("[2, 2]"), 6, "[2, 3]");
  CHECK_THROWS_WITH(load_graph_json(write_graph_json(bad)),
                    Catch::Contains("node 'w': value is f4[2,2], the node declares f32[2,3]"));
}

TEST_CASE("graph.json: a lowered loop is an error naming every control-flow node, not a cycle") {
  // x through a loop (Enter, Merge, LoopCond, Switch, NextIteration, Exit; a Relu its body)
  // into mm.
  const char* f32_12 = R"("outputs": [{"dtype": "f32", "shape": [1, 2]}])";
  const std::string loop = fmt::format(
      R"(
  {{"name": "mm", "op": "MatMul", "inputs": ["out:0", "w"], "attrs": {{"T": {{"type": "f32"}}}}, {0}}},
  {{"name": "x", "op": "Placeholder", "inputs": [], {0}}},
  {{"name": "w", "op": "Const", "inputs": [], "value": "w.npy",
   "outputs": [{{"dtype": "f32", "shape": [2, 2]}}]}},
  {{"name": "enter", "op": "Enter", "inputs": ["x"], {0}}},
  {{"name": "merge", "op": "Merge", "inputs": ["enter", "next"], {0}}},
  {{"name": "cond", "op": "LoopCond", "inputs": ["pred"], "outputs": [{{"dtype": "bool", "shape": []}}]}},
  {{"name": "pred", "op": "Placeholder", "inputs": [], "outputs": [{{"dtype": "bool", "shape": []}}]}},
  {{"name": "switch", "op": "Switch", "inputs": ["merge", "cond"], {0}}},
  {{"name": "body", "op": "Relu", "inputs": ["switch:1"], {0}}},
  {{"name": "next", "op": "NextIteration", "inputs": ["body"], {0}}},
  {{"name": "out", "op": "Exit", "inputs": ["switch:0"], {0}}})",
      f32_12);
  try {
    load_graph_json(write_graph_json(loop));
    FAIL("a graph with a loop loaded");
  } catch (const std::exception& e) {
    const std::string what = e.what();
    CHECK_THAT(what, Catch::Contains("6 control-flow node(s)"));
    for (const char* n : {"'enter' (Enter)", "'merge' (Merge)", "'cond' (LoopCond)",
                          "'switch' (Switch)", "'next' (NextIteration)", "'out' (Exit)"})
      CHECK_THAT(what, Catch::Contains(n));
    CHECK_THAT(what, !Catch::Contains("cycle"));
    CHECK_THAT(what, !Catch::Contains("'body'"));
  }
}
