// CANN's automatic mixed precision as a graph pass (mixed_precision.h states the contract).
// Built against TensorFlow's C++ headers (op registry: each node's input and output types).
#include "adapter/tf/plugin/mixed_precision.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "adapter/runtime/status.h"
#include "adapter/tf/plugin/plugin_device.h"
#include "adapter/tf/plugin/tensor_names.h"
#include "adapter/tf/plugin/tf_graph_headers.h"
#include "common/input_file.h"
#include "common/numeric.h"

namespace npusim::tf {
namespace {

namespace tfc = ::tensorflow;

// The built-in lists. CANN keeps them as the precision_reduce flag of each op in its ops-info
// json; its documentation shows Conv2D's ("flag": "true", the pages cited in
// mixed_precision.h) and names the kinds of op on each list: the cube's products (trustlist:
// they gain the most from float16 and accumulate in float32 anyway), and the ops whose results
// need float32's range or whose float16 rounding would bias training (blocklist). The flags of
// the other ops are not published outside the ops-info file, so every row below but Conv2D's is
// an estimate by that rule; an op on neither list is on the graylist. Rows are TensorFlow op
// types (the CANN op each stands for in a comment where the names differ).
const std::vector<const char*> kTrustList = {
    // The cube's products and their gradients (CANN: Conv2D, Conv2DBackpropInput,
    // Conv2DBackpropFilter, DepthwiseConv2D..., MatMulV2, BatchMatMulV2).
    "Conv2D",
    "Conv2DBackpropInput",
    "Conv2DBackpropFilter",
    "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropInput",
    "DepthwiseConv2dNativeBackpropFilter",
    "MatMul",
    "BatchMatMul",
    "BatchMatMulV2",
    "Einsum"};

// graph_fusion.h's bias epilogues are on the list of their product (CANN: Conv2D / MatMulV2
// with a bias input), so a user's list naming the product covers them.
const std::map<std::string, std::string> kEpilogueProduct = {
    {"Conv2DBiasAdd", "Conv2D"},
    {"MatMulBiasAdd", "MatMul"},
    {"Conv2DBatchNormInference", "Conv2D"},
    {"DepthwiseConv2dBatchNormInference", "DepthwiseConv2dNative"}};

// The fused inference convolutions keep T (the filter and the batch norm's per-channel inputs)
// float32 and run in float16 through their x and y types: Tx and Tout half (the cube reads
// f16, the batch norm's pass rounds once to f16), as CANN's Conv2D + BNInference fusion keeps
// its scale and offset in float32.
bool half_through_io_types(const std::string& op) {
  return op == "Conv2DBatchNormInference" || op == "DepthwiseConv2dBatchNormInference";
}

const std::vector<const char*> kBlockList = {
    // Exponentials and logarithms: exp overflows float16 above 11.1, log loses its small
    // arguments below 6e-8.
    "Exp", "Expm1", "Log", "Log1p", "Pow", "Softplus",
    // Softmax and the losses on it (CANN: SoftmaxV2, SoftmaxCrossEntropyWithLogits,
    // SparseSoftmaxCrossEntropyWithLogits), and the losses' reductions: a sum over a batch or
    // a feature map needs float32's range and precision (CANN: ReduceSum, ReduceMean,
    // ReduceProd).
    "Softmax", "LogSoftmax", "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits",
    "Sum", "Mean", "Prod", "L2Loss", "SquareSumV1",
    // The optimizer's variable updates stay float32 (CANN: ApplyAdam, ApplyMomentum, ...; the
    // variables themselves are float32).
    "ResourceApplyGradientDescent", "ResourceApplyMomentum", "ResourceApplyKerasMomentum",
    "ResourceApplyAdam", "FusedVariableUpdate", "AssignVariableOp", "AssignAddVariableOp",
    "AssignSubVariableOp"};

// Ops never changed whatever the lists say: function plumbing and control flow route tensors
// whose types are fixed by the function's signature or by the loop.
bool untouchable(const std::string& op) {
  static const std::set<std::string> kOps = {"_Arg",
                                             "_Retval",
                                             "_DeviceArg",
                                             "_DeviceRetval",
                                             "Switch",
                                             "Merge",
                                             "Enter",
                                             "Exit",
                                             "NextIteration",
                                             "LoopCond",
                                             "If",
                                             "StatelessIf",
                                             "While",
                                             "StatelessWhile",
                                             "PartitionedCall",
                                             "StatefulPartitionedCall",
                                             "Placeholder",
                                             "ReadVariableOp",
                                             "VarHandleOp",
                                             "Const",
                                             "NoOp",
                                             "NpuGraph"};
  return kOps.count(op) > 0;
}

bool on_npu(const std::string& device) { return on_npu_device(device); }

bool is_control(const std::string& in) { return !in.empty() && in[0] == '^'; }

// The node's input and output types from the op registry; false for an op it does not know.
bool node_types(const tfc::NodeDef& node, tfc::DataTypeVector* in, tfc::DataTypeVector* out) {
  const tfc::OpDef* op_def = nullptr;
  if (!tfc::OpRegistry::Global()->LookUpOpDef(node.op(), &op_def).ok()) return false;
  tfc::NodeDef full = node;
  tfc::AddDefaultsToNodeDef(*op_def, &full);
  return tfc::InOutTypesForNode(full, *op_def, in, out).ok();
}

// A node of op `op` named `name` on `device`, with the registry's default attributes.
tfc::NodeDef new_node(const std::string& name, const std::string& op, const std::string& device) {
  tfc::NodeDef n;
  n.set_name(name);
  n.set_op(op);
  n.set_device(device);
  return n;
}

void add_defaults(tfc::NodeDef* node) {
  const tfc::OpDef* op_def = nullptr;
  if (tfc::OpRegistry::Global()->LookUpOpDef(node->op(), &op_def).ok())
    tfc::AddDefaultsToNodeDef(*op_def, node);
}

// Node indices in a topological order over data and control inputs; empty if the graph has a
// cycle or an input names no node.
std::vector<int> topological_order(const tfc::GraphDef& graph) {
  const int n = graph.node_size();
  std::map<std::string, int> index;
  for (int i = 0; i < n; ++i) index[graph.node(i).name()] = i;
  std::vector<int> pending(n, 0);
  std::vector<std::vector<int>> consumers(n);
  for (int i = 0; i < n; ++i) {
    for (const std::string& in : graph.node(i).input()) {
      const std::string name = split_input(in).first;
      const auto it = index.find(name);
      if (it == index.end()) return {};
      consumers[it->second].push_back(i);
      ++pending[i];
    }
  }
  std::vector<int> order;
  for (int i = 0; i < n; ++i)
    if (pending[i] == 0) order.push_back(i);
  for (size_t k = 0; k < order.size(); ++k)
    for (int c : consumers[order[k]])
      if (--pending[c] == 0) order.push_back(c);
  if (static_cast<int>(order.size()) != n) return {};
  return order;
}

enum class Category { kTrust, kBlock, kGray };

Category category(const MixLists& lists, const std::string& type) {
  const auto product = kEpilogueProduct.find(type);
  const std::string& op = product == kEpilogueProduct.end() ? type : product->second;
  if (lists.trust.count(op)) return Category::kTrust;
  if (lists.block.count(op)) return Category::kBlock;
  return Category::kGray;
}

// The node's T attribute, if it is a single type.
const tfc::AttrValue* type_attr(const tfc::NodeDef& node) {
  const auto it = node.attr().find("T");
  if (it == node.attr().end() || it->second.value_case() != tfc::AttrValue::kType) return nullptr;
  return &it->second;
}

// The float16 Const holding `c`'s float32 values rounded as a Cast rounds them (to nearest,
// ties to even: common/numeric.h), named `name`; nullopt if `c` is no float32 Const whose values
// it can read. CANN's graph engine folds such a Cast at compile time: the weights of a frozen
// graph are stored in float16 and no launch casts them at each run.
std::optional<tfc::NodeDef> half_const(const tfc::NodeDef& c, const std::string& name) {
  const auto dt = c.attr().find("dtype");
  const auto value = c.attr().find("value");
  if (c.op() != "Const" || dt == c.attr().end() || dt->second.type() != tfc::DT_FLOAT ||
      value == c.attr().end() || value->second.value_case() != tfc::AttrValue::kTensor)
    return std::nullopt;
  const tfc::TensorProto& t = value->second.tensor();
  if (t.dtype() != tfc::DT_FLOAT) return std::nullopt;
  int64_t elements = 1;
  for (const auto& d : t.tensor_shape().dim()) {
    if (d.size() < 0) return std::nullopt;
    elements *= d.size();
  }
  std::vector<float> v(static_cast<size_t>(elements), 0.0f);  // no values: TF's zeros
  if (t.float_val_size() > 0) {  // the last value repeats to fill the shape
    for (int64_t i = 0; i < elements; ++i)
      v[static_cast<size_t>(i)] =
          t.float_val(static_cast<int>(std::min<int64_t>(i, t.float_val_size() - 1)));
  } else if (!t.tensor_content().empty()) {
    if (t.tensor_content().size() != v.size() * sizeof(float)) return std::nullopt;
    std::memcpy(v.data(), t.tensor_content().data(), t.tensor_content().size());
  }
  std::string bytes(v.size() * sizeof(uint16_t), '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = f32_to_f16(v[i]);
    std::memcpy(&bytes[i * sizeof h], &h, sizeof h);
  }
  tfc::NodeDef out = new_node(name, "Const", c.device());
  for (const std::string& in : c.input())  // a Const has control inputs only
    out.add_input(in);
  (*out.mutable_attr())["dtype"].set_type(tfc::DT_HALF);
  tfc::TensorProto* h = (*out.mutable_attr())["value"].mutable_tensor();
  h->set_dtype(tfc::DT_HALF);
  *h->mutable_tensor_shape() = t.tensor_shape();
  h->set_tensor_content(bytes);
  return out;
}

const char* short_name(tfc::DataType t) { return t == tfc::DT_HALF ? "f16" : "f32"; }

}  // namespace

const MixLists& builtin_mix_lists() {
  static const MixLists* lists = [] {
    auto* l = new MixLists();
    for (const char* op : kTrustList) l->trust.insert(op);
    for (const char* op : kBlockList) l->block.insert(op);
    return l;
  }();
  return *lists;
}

rt::Status load_mix_lists(const std::string& path, MixLists* out) {
  *out = builtin_mix_lists();
  if (path.empty()) return rt::ok_status();
  const auto bad = [&](const std::string& what) {
    return rt::Status(rt::StatusCode::invalid_argument, "modify_mixlist '" + path + "': " + what);
  };
  std::string text, problem;
  if (!try_read_input_file(path, "mixed precision list", kMaxConfigFileBytes, &text, &problem))
    return rt::Status(rt::StatusCode::invalid_argument, "modify_mixlist: " + problem);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return bad(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object())
    return bad("the top level must be an object with \"black-list\" / \"white-list\"");
  for (const auto& [list_key, list] : j.items()) {
    const bool black = list_key == "black-list";
    if (!black && list_key != "white-list")
      return bad("unknown key '" + list_key + "' (black-list, white-list)");
    if (!list.is_object())
      return bad("key '" + list_key + "' must be an object with \"to-add\" / \"to-remove\"");
    std::set<std::string>& own = black ? out->block : out->trust;
    std::set<std::string>& other = black ? out->trust : out->block;
    for (const auto& [action, ops] : list.items()) {
      const std::string key = list_key + "." + action;
      const bool add = action == "to-add";
      if (!add && action != "to-remove")
        return bad("unknown key '" + key + "' (to-add, to-remove)");
      if (!ops.is_array()) return bad("key '" + key + "' must be a list of op type names");
      for (size_t i = 0; i < ops.size(); ++i) {
        const std::string where = key + "[" + std::to_string(i) + "]";
        if (!ops[i].is_string() || ops[i].get<std::string>().empty())
          return bad("key '" + where + "' must be an op type name (a non-empty string)");
        const std::string op = ops[i].get<std::string>();
        if (add) {
          other.erase(op);
          own.insert(op);
        } else if (!own.erase(op)) {
          return bad("key '" + where + "': '" + op + "' is not on the " +
                     (black ? "black" : "white") + " list, nothing to remove");
        }
      }
    }
  }
  return rt::ok_status();
}

namespace {

// The device's settings once it is open, else the environment's; false if those are invalid.
bool current_settings(PluginSettings* s) {
  if (!device_if_open()) return settings_from_env(s).ok();
  *s = opened_settings();
  return true;
}

}  // namespace

std::string first_type_error(const tfc::GraphDef& graph) {
  const int n = graph.node_size();
  std::vector<tfc::DataTypeVector> in_types(n), out_types(n);
  std::map<std::string, int> typed;  // node name -> index, for the nodes the registry types
  for (int i = 0; i < n; ++i)
    if (node_types(graph.node(i), &in_types[i], &out_types[i])) typed[graph.node(i).name()] = i;
  for (int i = 0; i < n; ++i) {
    const tfc::NodeDef& node = graph.node(i);
    if (!typed.count(node.name())) continue;
    int k = 0;
    for (const std::string& in : node.input()) {
      if (is_control(in)) continue;
      const int at = k++;
      const auto [name, port] = split_input(in);
      const auto p = typed.find(name);
      if (p == typed.end() || at >= static_cast<int>(in_types[i].size()) ||
          port >= static_cast<int>(out_types[p->second].size()))
        continue;
      const tfc::DataType have = out_types[p->second][port], want = in_types[i][at];
      if (!tfc::TypesCompatible(want, have))
        return "node '" + node.name() + "' (" + node.op() + ") input " + std::to_string(at) + ": " +
               tfc::DataTypeString(have) + " from '" + in + "', " + tfc::DataTypeString(want) +
               " expected";
    }
  }
  return "";
}

bool mixed_precision_requested() {
  const char* env = std::getenv("NPUSIM_MIX_PRECISION_GRAPH");
  if (env && std::string(env) == "0") return false;
  PluginSettings s;
  return current_settings(&s) && s.precision == compiler::PrecisionMode::kAllowMixPrecision;
}

MixLists mixed_precision_lists() {
  PluginSettings s;
  MixLists lists;
  if (!current_settings(&s) || !load_mix_lists(s.modify_mixlist, &lists).ok())
    return builtin_mix_lists();
  return lists;
}

MixedPrecisionCounts apply_mixed_precision(
    tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve, const MixLists& lists,
    const std::function<bool(const tfc::NodeDef&)>& has_half_kernel) {
  MixedPrecisionCounts counts;
  // The node with T = half and its default attributes spelled out (the kernel registry matches
  // the constraints of attributes the node leaves at their defaults, e.g. Conv2DBiasAdd's Tbias).
  const auto as_half = [](const tfc::NodeDef& node) {
    tfc::NodeDef h = node;
    if (half_through_io_types(node.op())) {
      (*h.mutable_attr())["Tx"].set_type(tfc::DT_HALF);
      (*h.mutable_attr())["Tout"].set_type(tfc::DT_HALF);
    } else {
      (*h.mutable_attr())["T"].set_type(tfc::DT_HALF);
      // FusedElementwise's inputs of type T follow it (its Tin); the others (a SelectV2 step's
      // bool condition) keep theirs.
      if (const auto tin = h.mutable_attr()->find("Tin");
          node.op() == "FusedElementwise" && tin != h.mutable_attr()->end())
        for (int k = 0; k < tin->second.list().type_size(); ++k)
          if (tin->second.list().type(k) == tfc::DT_FLOAT)
            tin->second.mutable_list()->set_type(k, tfc::DT_HALF);
    }
    add_defaults(&h);
    return h;
  };
  const auto candidate = [&](const tfc::NodeDef& node) {
    const tfc::AttrValue* t = type_attr(node);
    return on_npu(node.device()) && !untouchable(node.op()) && !preserve.count(node.name()) && t &&
           t->type() == tfc::DT_FLOAT;
  };

  // 1. Decide each node's precision in topological order.
  const std::vector<int> order = topological_order(graph);
  if (order.empty()) return counts;
  const int n = graph.node_size();
  std::map<std::string, int> index;
  for (int i = 0; i < n; ++i) index[graph.node(i).name()] = i;
  enum class State { kNeutral, kHalf, kBlocked };
  std::vector<State> state(n, State::kNeutral);
  std::vector<tfc::DataTypeVector> in_types(n), out_types(n);
  std::vector<bool> typed(n, false);
  for (int i = 0; i < n; ++i) typed[i] = node_types(graph.node(i), &in_types[i], &out_types[i]);

  for (int i : order) {
    tfc::NodeDef& node = *graph.mutable_node(i);
    if (!typed[i] || !candidate(node)) continue;
    const Category cat = category(lists, node.op());
    if (cat == Category::kBlock) {
      state[i] = State::kBlocked;
      continue;
    }
    // The node's T-typed inputs: those whose type is T's (float).
    bool half_input = false, blocked_input = false;
    int data = 0;
    for (const std::string& in : node.input()) {
      if (is_control(in)) continue;
      const int k = data++;
      if (k >= static_cast<int>(in_types[i].size()) || in_types[i][k] != tfc::DT_FLOAT) continue;
      const auto [name, port] = split_input(in);
      const int p = index.at(name);
      if (state[p] == State::kBlocked) blocked_input = true;
      if (typed[p] && port < static_cast<int>(out_types[p].size()) &&
          out_types[p][port] == tfc::DT_HALF)
        half_input = true;
    }
    if (cat == Category::kGray && (!half_input || blocked_input)) {
      if (blocked_input) state[i] = State::kBlocked;
      continue;
    }
    tfc::NodeDef half = as_half(node);
    if (!has_half_kernel(half)) {
      ++counts.no_half_kernel;
      continue;
    }
    tfc::DataTypeVector hin, hout;
    if (!node_types(half, &hin, &hout)) continue;
    node.Swap(&half);
    in_types[i] = hin;
    out_types[i] = hout;
    state[i] = State::kHalf;
    ++counts.half_nodes;
  }
  if (counts.half_nodes == 0) return counts;

  // 2. Casts where a producer's output type differs from what its consumer reads; one per
  //    (tensor, type). A float32 Const read in float16 becomes a float16 Const (half_const).
  std::map<std::pair<std::string, tfc::DataType>, std::string> casts;
  std::vector<tfc::NodeDef> added;
  for (int i = 0; i < n; ++i) {
    if (!typed[i]) continue;
    tfc::NodeDef& node = *graph.mutable_node(i);
    int data = 0;
    for (int j = 0; j < node.input_size(); ++j) {
      const std::string in = node.input(j);
      if (is_control(in)) continue;
      const int k = data++;
      if (k >= static_cast<int>(in_types[i].size())) continue;
      const auto [name, port] = split_input(in);
      const int p = index.at(name);
      if (!typed[p] || port >= static_cast<int>(out_types[p].size())) continue;
      const tfc::DataType have = out_types[p][port], want = in_types[i][k];
      if (have == want) continue;
      if ((have != tfc::DT_FLOAT && have != tfc::DT_HALF) ||
          (want != tfc::DT_FLOAT && want != tfc::DT_HALF))
        continue;
      const std::string tensor = port == 0 ? name : name + ":" + std::to_string(port);
      auto [it, fresh] = casts.try_emplace({tensor, want}, "");
      if (fresh) {
        const tfc::NodeDef& producer = graph.node(p);
        std::string cast_name =
            name + "/npusim_amp_" + std::to_string(port) + "_" + short_name(want);
        while (index.count(cast_name)) cast_name += "_";
        index[cast_name] = -1;
        it->second = cast_name;
        if (want == tfc::DT_HALF) {
          if (std::optional<tfc::NodeDef> folded = half_const(producer, cast_name)) {
            added.push_back(std::move(*folded));
            ++counts.folded_consts;
            node.set_input(j, it->second);
            continue;
          }
        }
        tfc::NodeDef cast = new_node(cast_name, "Cast",
                                     on_npu(producer.device()) ? producer.device() : node.device());
        cast.add_input(tensor);
        (*cast.mutable_attr())["SrcT"].set_type(have);
        (*cast.mutable_attr())["DstT"].set_type(want);
        (*cast.mutable_attr())["Truncate"].set_b(false);
        added.push_back(cast);
        ++counts.casts;
      }
      node.set_input(j, it->second);
    }
  }
  for (tfc::NodeDef& c : added) *graph.add_node() = std::move(c);
  return counts;
}

}  // namespace npusim::tf
