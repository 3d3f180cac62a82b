#include "adapter/graph/passes.h"

#include <fmt/format.h>

#include <cstring>
#include <initializer_list>
#include <map>
#include <optional>

#include "adapter/compiler/ops/fused_elementwise.h"

namespace npusim::graph {
namespace {

using compiler::DataType;
using compiler::TensorDesc;

// The only reader of t is one node that is not a graph output's producer of t: that node's index.
std::optional<int> sole_consumer(const Graph& g, const std::map<TensorRef, std::vector<int>>& c,
                                 const TensorRef& t) {
  auto it = c.find(t);
  if (it == c.end() || it->second.size() != 1 || g.is_output(t)) return std::nullopt;
  return it->second[0];
}

std::vector<float> const_floats(const Node& n) {
  std::vector<float> v(n.value.size() / 4);
  std::memcpy(v.data(), n.value.data(), v.size() * 4);
  return v;
}

int add_const(Graph& g, const std::string& name, const std::vector<int64_t>& shape,
              const std::vector<float>& v) {
  Node n;
  n.name = name;
  n.op = "Const";
  n.outputs = {TensorDesc{DataType::F32, shape}};
  n.value.resize(v.size() * 4);
  std::memcpy(n.value.data(), v.data(), n.value.size());
  g.nodes.push_back(std::move(n));
  return int(g.nodes.size()) - 1;
}

// A per-channel affine step y = x * scale + shift folded into (scale, shift) of c channels.
// Returns false if node n is not one (op, constant operand of c or 1 elements, f32).
bool fold_affine(const Graph& g, const Node& n, const TensorRef& x, std::vector<float>& scale,
                 std::vector<float>& shift) {
  static const char* kOps[] = {"BiasAdd", "AddV2", "Add", "Sub", "Mul"};
  bool known = false;
  for (const char* op : kOps) known |= n.op == op;
  if (!known || n.inputs.size() != 2 || n.outputs[0] != g.desc(x)) return false;
  const bool x_first = n.inputs[0] == x;
  const TensorRef other = x_first ? n.inputs[1] : n.inputs[0];
  if (!g.is_const(other) || g.desc(other).dtype != DataType::F32) return false;
  if ((n.op == "Sub" || n.op == "BiasAdd") && !x_first) return false;
  const std::vector<float> v = const_floats(g.nodes[other.node]);
  const size_t c = scale.size();
  if (v.size() != c && v.size() != 1) return false;
  if (v.size() == c && g.desc(other).shape.size() > 1)
    for (size_t d = 0; d + 1 < g.desc(other).shape.size(); ++d)
      if (g.desc(other).shape[d] != 1) return false;
  for (size_t k = 0; k < c; ++k) {
    const float s = v[v.size() == 1 ? 0 : k];
    if (n.op == "Mul") {
      scale[k] *= s;
      shift[k] *= s;
    } else {
      shift[k] += n.op == "Sub" ? -s : s;
    }
  }
  return true;
}

bool conv_foldable(const Graph& g, const Node& n) {
  if (n.op != "Conv2D" || n.inputs.size() != 2 || !g.is_const(n.inputs[1])) return false;
  auto fmt = n.attrs.find("data_format");
  if (fmt != n.attrs.end() && std::get_if<std::string>(&fmt->second) &&
      std::get<std::string>(fmt->second) != "NHWC")
    return false;
  const TensorDesc& x = g.desc(n.inputs[0]);
  const TensorDesc& f = g.desc(n.inputs[1]);
  return x.dtype == DataType::F32 && f.dtype == DataType::F32 && x.shape.size() == 4 &&
         f.shape.size() == 4 && x.shape[3] == f.shape[2];  // not grouped: the bias serves one group
}

// Rewrites the chain's last node as the convolution with the folded filter and bias.
void rewrite_conv(Graph& g, int conv, int last, const std::vector<float>& scale,
                  const std::vector<float>& shift, bool relu, std::vector<std::string> absorbed) {
  const Node& c = g.nodes[conv];
  const TensorRef x = c.inputs[0];
  const TensorDesc fdesc = g.desc(c.inputs[1]);
  std::vector<float> w = const_floats(g.nodes[c.inputs[1].node]);
  for (size_t i = 0; i < w.size(); ++i) w[i] *= scale[i % scale.size()];  // HWIO: O innermost
  const std::string& name = g.nodes[last].name;
  const int64_t ch = int64_t(scale.size());
  const std::vector<float> ones(scale.size(), 1.0f), zeros(scale.size(), 0.0f);
  const int wi = add_const(g, name + "/folded_filter", fdesc.shape, w);
  const int gi = add_const(g, name + "/scale", {ch}, ones);
  const int bi = add_const(g, name + "/shift", {ch}, shift);
  const int mi = add_const(g, name + "/mean", {ch}, zeros);
  const int vi = add_const(g, name + "/variance", {ch}, ones);
  Node& out = g.nodes[last];
  std::map<std::string, compiler::AttrValue> attrs = g.nodes[conv].attrs;
  attrs["epsilon"] = 0.0;  // rsqrt(1 + 0) * 1 = 1: the filter already holds the scale
  attrs["relu"] = relu;
  attrs["T"] = std::string("f32");
  out.op = "Conv2DBatchNormInference";
  out.attrs = attrs;
  out.inputs = {x, {wi, 0}, {gi, 0}, {bi, 0}, {mi, 0}, {vi, 0}};
  out.fused = std::move(absorbed);
}

// Every node but the last of a chain is marked dead; returns the absorbed names.
std::vector<std::string> absorb(Graph& g, const std::vector<int>& chain) {
  std::vector<std::string> names;
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    g.nodes[chain[i]].dead = true;
    names.push_back(g.nodes[chain[i]].name);
  }
  return names;
}

std::string chain_pattern(const Graph& g, const std::vector<int>& chain, const std::string& to) {
  std::string s;
  for (int n : chain) s += (s.empty() ? "" : "+") + g.nodes[n].op;
  return s + " -> " + to;
}

bool fusible_step(const Node& n) {
  if (!compiler::ops::fusible_elementwise(n.op) || n.inputs.empty() || n.outputs.size() != 1)
    return false;
  const DataType t = n.outputs[0].dtype;
  if (t != DataType::F32 && t != DataType::F16 && t != DataType::BF16) return false;
  for (const auto& [name, v] : n.attrs)
    if (name != "T") return false;
  return true;
}

// The FusedElementwise node replacing the set `members` (topological order, sink last).
void rewrite_elementwise(Graph& g, const std::vector<int>& members) {
  std::map<int, int> step_of;
  std::map<TensorRef, int> input_of;
  std::vector<TensorRef> inputs;
  std::vector<std::string> steps;
  for (int m : members) {
    std::string text = g.nodes[m].op;
    for (const TensorRef& in : g.nodes[m].inputs) {
      auto s = step_of.find(in.node);
      if (s != step_of.end()) {
        text += fmt::format(" s{}", s->second);
        continue;
      }
      auto [it, added] = input_of.emplace(in, int(inputs.size()));
      if (added) inputs.push_back(in);
      text += fmt::format(" i{}", it->second);
    }
    step_of[m] = int(steps.size());
    steps.push_back(text);
  }
  Node& sink = g.nodes[members.back()];
  sink.fused = absorb(g, members);
  sink.op = "FusedElementwise";
  sink.attrs = {{"T", std::string(compiler::data_type_name(sink.outputs[0].dtype))},
                {"N", int64_t(inputs.size())},
                {"steps", steps}};
  sink.inputs = inputs;
}

// The alive nodes whose op is one of `ops`, by index.
std::vector<int> nodes_of(const Graph& g, std::initializer_list<const char*> ops) {
  std::vector<int> out;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const char* op : ops)
      if (!g.nodes[i].dead && g.nodes[i].op == op) out.push_back(int(i));
  return out;
}

}  // namespace

std::vector<FusionRecord> fold_conv_epilogues(Graph& g) {
  std::vector<FusionRecord> done;
  const size_t n_nodes = g.nodes.size();
  for (size_t i = 0; i < n_nodes; ++i) {
    if (g.nodes[i].dead || !conv_foldable(g, g.nodes[i])) continue;
    const auto consumers = g.consumers();
    const int64_t ch = g.nodes[i].outputs[0].shape[3];
    std::vector<float> scale(ch, 1.0f), shift(ch, 0.0f);
    std::vector<int> chain = {int(i)};
    bool relu = false;
    while (!relu) {
      const TensorRef y{chain.back(), 0};
      auto next = sole_consumer(g, consumers, y);
      if (!next) break;
      const Node& n = g.nodes[*next];
      if (n.op == "Relu" && n.outputs[0] == g.desc(y)) {
        relu = true;
      } else if (!fold_affine(g, n, y, scale, shift)) {
        break;
      }
      chain.push_back(*next);
    }
    if (chain.size() < 2) continue;
    const std::string pattern = chain_pattern(g, chain, "Conv2DBatchNormInference");
    rewrite_conv(g, int(i), chain.back(), scale, shift, relu, absorb(g, chain));
    done.push_back({pattern, g.nodes[chain.back()].name, g.nodes[chain.back()].fused});
  }
  return done;
}

std::vector<FusionRecord> fuse_add_relu(Graph& g) {
  std::vector<FusionRecord> done;
  const auto consumers = g.consumers();
  for (int i : nodes_of(g, {"AddV2", "Add"})) {
    Node& add = g.nodes[i];
    if (add.inputs.size() != 2) continue;
    auto next = sole_consumer(g, consumers, {i, 0});
    if (!next || g.nodes[*next].op != "Relu") continue;
    Node& relu = g.nodes[*next];
    relu.op = "AddRelu";
    relu.inputs = add.inputs;
    relu.attrs = add.attrs;
    relu.fused = {add.name};
    add.dead = true;
    done.push_back({"AddV2+Relu -> AddRelu", relu.name, relu.fused});
  }
  return done;
}

std::vector<FusionRecord> fuse_elementwise_chains(Graph& g) {
  const auto consumers = g.consumers();
  std::vector<int> sink(g.nodes.size(), -1);
  for (int i = int(g.nodes.size()) - 1; i >= 0; --i) {
    const Node& n = g.nodes[i];
    if (n.dead || !fusible_step(n)) continue;
    auto it = consumers.find({i, 0});
    int joined = it == consumers.end() || g.is_output({i, 0}) ? -1 : sink[it->second[0]];
    if (it != consumers.end())
      for (int c : it->second)
        if (sink[c] != joined || g.nodes[c].outputs[0].dtype != n.outputs[0].dtype) joined = -1;
    sink[i] = joined < 0 ? i : joined;
  }
  std::map<int, std::vector<int>> sets;  // by sink, members in topological order
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (sink[i] >= 0) sets[sink[i]].push_back(int(i));
  std::vector<FusionRecord> done;
  for (const auto& [last, members] : sets) {
    if (members.size() < 2) continue;
    const std::string pattern = chain_pattern(g, members, "FusedElementwise");
    rewrite_elementwise(g, members);
    done.push_back({pattern, g.nodes[last].name, g.nodes[last].fused});
  }
  return done;
}

std::vector<FusionRecord> half_handoffs(Graph& g) {
  std::vector<FusionRecord> done;
  const auto consumers = g.consumers();
  for (int i : nodes_of(g, {"Conv2DBatchNormInference"})) {
    Node& n = g.nodes[i];
    if (g.is_output({i, 0})) continue;
    auto it = consumers.find({i, 0});
    if (it == consumers.end()) continue;
    bool all_x = true;
    for (int c : it->second) {
      const Node& m = g.nodes[c];
      all_x &= m.op == "Conv2DBatchNormInference" && m.inputs[0] == TensorRef{i, 0};
      for (size_t k = 1; k < m.inputs.size(); ++k) all_x &= !(m.inputs[k] == TensorRef{i, 0});
    }
    if (!all_x) continue;
    n.attrs["Tout"] = std::string("f16");
    n.outputs[0].dtype = DataType::F16;
    std::vector<std::string> readers;
    for (int c : it->second) {
      g.nodes[c].attrs["Tx"] = std::string("f16");
      readers.push_back(g.nodes[c].name);
    }
    done.push_back(
        {"Conv2DBatchNormInference -> Conv2DBatchNormInference in fp16", n.name, readers});
  }
  return done;
}

std::vector<FusionRecord> run_fusion_passes(Graph& g, compiler::PrecisionMode precision) {
  std::vector<FusionRecord> all = fold_conv_epilogues(g);
  if (precision != compiler::PrecisionMode::kKeepFp32) {
    std::vector<FusionRecord> r = half_handoffs(g);
    all.insert(all.end(), r.begin(), r.end());
  }
  for (auto* pass : {fuse_add_relu, fuse_elementwise_chains}) {
    std::vector<FusionRecord> r = pass(g);
    all.insert(all.end(), r.begin(), r.end());
  }
  return all;
}

}  // namespace npusim::graph
