#include "adapter/graph/passes.h"

#include <fmt/format.h>

#include <algorithm>
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

// The string attribute `name` of n, or `otherwise` where it is absent or not a string.
std::string string_attr(const Node& n, const char* name, const char* otherwise) {
  auto it = n.attrs.find(name);
  const std::string* v = it == n.attrs.end() ? nullptr : std::get_if<std::string>(&it->second);
  return v ? *v : otherwise;
}

// The values of an s32 / s64 Const.
std::optional<std::vector<int64_t>> const_ints(const Node& n) {
  if (n.op != "Const" || n.outputs.size() != 1) return std::nullopt;
  const DataType t = n.outputs[0].dtype;
  if (t != DataType::S32 && t != DataType::S64) return std::nullopt;
  const size_t size = t == DataType::S32 ? 4 : 8;
  std::vector<int64_t> v(n.value.size() / size);
  for (size_t i = 0; i < v.size(); ++i) {
    if (size == 4) {
      int32_t x;
      std::memcpy(&x, n.value.data() + i * 4, 4);
      v[i] = x;
    } else {
      std::memcpy(&v[i], n.value.data() + i * 8, 8);
    }
  }
  return v;
}

bool conv_foldable(const Graph& g, const Node& n) {
  if (n.op != "Conv2D" || n.inputs.size() != 2 || !g.is_const(n.inputs[1])) return false;
  if (string_attr(n, "data_format", "NHWC") != "NHWC") return false;
  const TensorDesc& x = g.desc(n.inputs[0]);
  const TensorDesc& f = g.desc(n.inputs[1]);
  return x.dtype == DataType::F32 && f.dtype == DataType::F32 && x.shape.size() == 4 &&
         f.shape.size() == 4 && x.shape[3] == f.shape[2];  // not grouped: the bias serves one group
}

// Rewrites the chain's last node as the convolution with the folded filter and bias.
void rewrite_conv(Graph& g, int conv, int last, const std::vector<float>& scale,
                  const std::vector<float>& shift, const std::string& activation,
                  std::vector<std::string> absorbed) {
  const Node& c = g.nodes[conv];
  const TensorRef x = c.inputs[0];
  const TensorDesc fdesc = g.desc(c.inputs[1]);
  std::vector<float> w = const_floats(g.nodes[c.inputs[1].node]);
  for (size_t i = 0; i < w.size(); ++i) w[i] *= scale[i % scale.size()];  // HWIO: O innermost
  const std::string name = g.nodes[last].name;  // a copy: add_const grows g.nodes
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
  attrs["relu"] = activation == "Relu";
  attrs["relu6"] = activation == "Relu6";
  attrs["T"] = std::string("f32");
  out.op = "Conv2DBatchNormInference";
  out.attrs = attrs;
  out.inputs = {x, {wi, 0}, {gi, 0}, {bi, 0}, {mi, 0}, {vi, 0}};
  out.fused = std::move(absorbed);
}

// Every node but the last of a chain is marked dead; returns the absorbed names (and those an
// earlier pass folded into them).
std::vector<std::string> absorb(Graph& g, const std::vector<int>& chain) {
  std::vector<std::string> names;
  for (size_t i = 0; i + 1 < chain.size(); ++i) {
    g.nodes[chain[i]].dead = true;
    names.insert(names.end(), g.nodes[chain[i]].fused.begin(), g.nodes[chain[i]].fused.end());
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

namespace {

// The chain after node `first` (a convolution of `ch` output channels): per-channel affine steps,
// each the only reader of the one before, optionally ended by a Relu or Relu6 (`activation`),
// folded into scale and shift. chain[0] is `first`.
struct AffineChain {
  std::vector<int> chain;
  std::vector<float> scale, shift;
  std::string activation;
  int affine_steps = 0;
};

AffineChain walk_affine_chain(const Graph& g, int first) {
  const auto consumers = g.consumers();
  const int64_t ch = g.nodes[first].outputs[0].shape[3];
  AffineChain a;
  a.chain = {first};
  a.scale.assign(ch, 1.0f);
  a.shift.assign(ch, 0.0f);
  while (a.activation.empty()) {
    const TensorRef y{a.chain.back(), 0};
    auto next = sole_consumer(g, consumers, y);
    if (!next) break;
    const Node& n = g.nodes[*next];
    if ((n.op == "Relu" || n.op == "Relu6") && n.outputs[0] == g.desc(y)) {
      a.activation = n.op;
    } else if (fold_affine(g, n, y, a.scale, a.shift)) {
      ++a.affine_steps;
    } else {
      break;
    }
    a.chain.push_back(*next);
  }
  return a;
}

}  // namespace

std::vector<FusionRecord> absorb_conv_pads(Graph& g) {
  std::vector<FusionRecord> done;
  const auto consumers = g.consumers();
  for (int i : nodes_of(g, {"Pad", "PadV2"})) {
    Node& pad = g.nodes[i];
    if (pad.inputs.size() != (pad.op == "Pad" ? 2u : 3u) || !g.is_const(pad.inputs[1])) continue;
    if (pad.op == "PadV2") {  // the constant must be a zero of the padded type
      const Node& v = g.nodes[pad.inputs[2].node];
      if (v.op != "Const" || v.value.empty() ||
          std::any_of(v.value.begin(), v.value.end(), [](uint8_t b) { return b != 0; }))
        continue;
    }
    const std::optional<std::vector<int64_t>> p = const_ints(g.nodes[pad.inputs[1].node]);
    if (!p || p->size() != 8 || (*p)[0] || (*p)[1] || (*p)[6] || (*p)[7] ||
        *std::min_element(p->begin(), p->end()) < 0)
      continue;
    auto next = sole_consumer(g, consumers, {i, 0});
    if (!next) continue;
    Node& conv = g.nodes[*next];
    if ((conv.op != "Conv2D" && conv.op != "DepthwiseConv2dNative") || conv.inputs.empty() ||
        !(conv.inputs[0] == TensorRef{i, 0}) || string_attr(conv, "padding", "") != "VALID" ||
        string_attr(conv, "data_format", "NHWC") != "NHWC")
      continue;
    conv.inputs[0] = pad.inputs[0];
    conv.attrs["padding"] = std::string("EXPLICIT");
    conv.attrs["explicit_paddings"] = *p;
    conv.fused.push_back(pad.name);
    pad.dead = true;
    done.push_back(
        {pad.op + "+" + conv.op + " -> " + conv.op + " (padding EXPLICIT)", conv.name, {pad.name}});
  }
  return done;
}

std::vector<FusionRecord> fold_depthwise_epilogues(Graph& g) {
  std::vector<FusionRecord> done;
  for (int i : nodes_of(g, {"DepthwiseConv2dNative"})) {
    Node& conv = g.nodes[i];
    if (conv.inputs.size() != 2 || !g.is_const(conv.inputs[1]) ||
        string_attr(conv, "data_format", "NHWC") != "NHWC" || conv.outputs.size() != 1 ||
        conv.outputs[0].dtype != DataType::F32 || g.desc(conv.inputs[1]).dtype != DataType::F32)
      continue;
    const AffineChain a = walk_affine_chain(g, i);
    if (a.affine_steps == 0) continue;  // a lone Relu: nothing to fold
    // The filter [KH, KW, C, M]: output channel c * M + q is the innermost index.
    const TensorRef f = conv.inputs[1];
    std::vector<float> w = const_floats(g.nodes[f.node]);
    for (size_t k = 0; k < w.size(); ++k) w[k] *= a.scale[k % a.scale.size()];
    const std::string name = g.nodes[a.chain.back()].name;  // add_const grows g.nodes
    const int64_t ch = int64_t(a.scale.size());
    const std::vector<float> ones(a.scale.size(), 1.0f), zeros(a.scale.size(), 0.0f);
    const std::vector<int64_t> fshape = g.desc(f).shape;
    const int wi = add_const(g, name + "/folded_filter", fshape, w);
    const int gi = add_const(g, name + "/scale", {ch}, ones);
    const int bi = add_const(g, name + "/shift", {ch}, a.shift);
    const int mi = add_const(g, name + "/mean", {ch}, zeros);
    const int vi = add_const(g, name + "/variance", {ch}, ones);
    g.nodes[i].inputs[1] = {wi, 0};  // (g.nodes may have moved: index, not the reference)
    const std::string pattern = chain_pattern(g, a.chain, "DepthwiseConv2dBatchNormInference");
    // One node, one launch where the batch norm runs in the convolution's way out (coupled
    // chips: the shift and the clamp on each tile in the UB; elsewhere the compiler appends
    // the batch norm's vector pass): the convolution's window and the batch norm's attributes.
    Node& out = g.nodes[a.chain.back()];
    const Node& dw = g.nodes[i];
    std::map<std::string, compiler::AttrValue> attrs = {
        {"T", std::string("f32")},
        {"epsilon", 0.0},  // rsqrt(1 + 0) * 1 = 1: the filter holds the scale
        {"relu", a.activation == "Relu"},
        {"relu6", a.activation == "Relu6"}};
    for (const char* w : {"strides", "padding", "explicit_paddings", "dilations", "data_format"})
      if (auto it = dw.attrs.find(w); it != dw.attrs.end()) attrs[w] = it->second;
    out.op = "DepthwiseConv2dBatchNormInference";
    out.attrs = attrs;
    out.inputs = {dw.inputs[0], {wi, 0}, {gi, 0}, {bi, 0}, {mi, 0}, {vi, 0}};
    out.fused = absorb(g, a.chain);
    done.push_back({pattern, out.name, out.fused});
  }
  return done;
}

std::vector<FusionRecord> fold_conv_epilogues(Graph& g) {
  std::vector<FusionRecord> done;
  const size_t n_nodes = g.nodes.size();
  for (size_t i = 0; i < n_nodes; ++i) {
    if (g.nodes[i].dead || !conv_foldable(g, g.nodes[i])) continue;
    const AffineChain a = walk_affine_chain(g, int(i));
    const std::vector<int>& chain = a.chain;
    const std::vector<float>& scale = a.scale;
    const std::vector<float>& shift = a.shift;
    const std::string& activation = a.activation;
    if (chain.size() < 2) continue;
    const std::string pattern = chain_pattern(g, chain, "Conv2DBatchNormInference");
    rewrite_conv(g, int(i), chain.back(), scale, shift, activation, absorb(g, chain));
    done.push_back({pattern, g.nodes[chain.back()].name, g.nodes[chain.back()].fused});
  }
  return done;
}

// AddV2 / Add (c, r) [-> Relu / Relu6], c a fused convolution (float32 y, no activation, no
// residual yet) read only by the add, r (either operand) a non-constant tensor of c's type and
// shape: c with r as its residual (R = 1, the last input) and the activation, under the last
// node's name (CANN's Conv2D + BNInference + Add [+ ReLU]; the compiler adds r after the
// rounding to Tout, in Tout, then the activation).
std::vector<FusionRecord> fuse_conv_residuals(Graph& g) {
  std::vector<FusionRecord> done;
  const auto consumers = g.consumers();
  auto flag = [](const Node& n, const char* a) {
    auto it = n.attrs.find(a);
    if (it == n.attrs.end()) return false;
    if (const bool* b = std::get_if<bool>(&it->second)) return *b;
    if (const int64_t* v = std::get_if<int64_t>(&it->second)) return *v != 0;
    return false;
  };
  for (int i : nodes_of(g, {"AddV2", "Add"})) {
    Node& add = g.nodes[i];
    if (add.dead || add.inputs.size() != 2) continue;
    for (int k = 0; k < 2; ++k) {
      const TensorRef ct = add.inputs[k], r = add.inputs[1 - k];
      const Node& c = g.nodes[ct.node];
      if ((c.op != "Conv2DBatchNormInference" && c.op != "DepthwiseConv2dBatchNormInference") ||
          c.dead || flag(c, "relu") || flag(c, "relu6") || flag(c, "R") || g.is_const(r) ||
          r.node == ct.node || !sole_consumer(g, consumers, ct) ||
          g.desc(ct).dtype != DataType::F32 || !(g.desc(r) == g.desc(ct)) ||
          !(add.outputs[0] == g.desc(ct)))
        continue;
      std::vector<int> chain = {ct.node, i};
      std::string activation;
      if (auto next = sole_consumer(g, consumers, {i, 0});
          next && (g.nodes[*next].op == "Relu" || g.nodes[*next].op == "Relu6")) {
        chain.push_back(*next);
        activation = g.nodes[*next].op;
      }
      const std::string pattern = chain_pattern(g, chain, c.op + " with a residual");
      Node& out = g.nodes[chain.back()];
      std::map<std::string, compiler::AttrValue> attrs = c.attrs;
      attrs["R"] = int64_t{1};
      attrs["relu"] = activation == "Relu";
      attrs["relu6"] = activation == "Relu6";
      std::vector<TensorRef> inputs = c.inputs;
      inputs.push_back(r);
      const std::string op = c.op;
      out.fused = absorb(g, chain);
      out.op = op;
      out.attrs = attrs;
      out.inputs = inputs;
      done.push_back({pattern, out.name, out.fused});
      break;
    }
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
  const auto fused_conv = [](const Node& m) {
    return m.op == "Conv2DBatchNormInference" || m.op == "DepthwiseConv2dBatchNormInference";
  };
  for (int i : nodes_of(g, {"Conv2DBatchNormInference", "DepthwiseConv2dBatchNormInference",
                            "BatchNormInference"})) {
    Node& n = g.nodes[i];
    // A residual has its reader's type: one with a residual keeps f32 (so does its residual,
    // read other than as x).
    if (g.is_output({i, 0}) || n.attrs.count("R")) continue;
    auto it = consumers.find({i, 0});
    if (it == consumers.end()) continue;
    bool all_x = true;
    for (int c : it->second) {
      const Node& m = g.nodes[c];
      all_x &= fused_conv(m) && m.inputs[0] == TensorRef{i, 0};
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
    done.push_back({n.op + " -> fused convolutions in fp16", n.name, readers});
  }
  return done;
}

std::vector<FusionRecord> run_fusion_passes(Graph& g, compiler::PrecisionMode precision) {
  std::vector<FusionRecord> all = absorb_conv_pads(g);
  for (auto* pass : {fold_conv_epilogues, fold_depthwise_epilogues, fuse_conv_residuals}) {
    std::vector<FusionRecord> r = pass(g);
    all.insert(all.end(), r.begin(), r.end());
  }
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
