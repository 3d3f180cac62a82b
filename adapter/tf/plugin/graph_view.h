// The graph rewrites' view of a GraphDef (graph_fusion.cpp, gen_mask_rewrite.cpp): nodes by
// name with their consumers, the removal bookkeeping that keeps a rewrite from taking a node
// that something else still reads, and the small readers of attributes and constants they share.
// Built against TensorFlow's C++ protobuf headers; only those files include it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "adapter/tf/plugin/tensor_names.h"
#include "common/numeric.h"
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"
#include "tensorflow/core/framework/types.pb.h"
#pragma GCC diagnostic pop

namespace npusim::tf::graph_edit {

namespace tfc = ::tensorflow;

// "name:port" / "name" / "^name" (a control input).
struct InputRef {
  std::string node;
  int port = 0;
  bool control = false;
};

inline InputRef parse_input(const std::string& s) {
  InputRef r;
  size_t start = 0;
  if (!s.empty() && s[0] == '^') {
    r.control = true;
    start = 1;
  }
  const size_t colon = s.rfind(':');
  if (colon != std::string::npos && colon > start) {
    r.node = s.substr(start, colon - start);
    r.port = std::atoi(s.c_str() + colon + 1);
  } else {
    r.node = s.substr(start);
  }
  return r;
}

// Nodes by name, and per node its data consumers (one entry per consuming input) and whether
// anything depends on it by a control edge.
class GraphView {
 public:
  explicit GraphView(tfc::GraphDef& graph) : m_graph(graph) {
    for (int i = 0; i < graph.node_size(); ++i) m_index[graph.node(i).name()] = i;
    for (int i = 0; i < graph.node_size(); ++i)
      for (const std::string& in : graph.node(i).input()) {
        const InputRef r = parse_input(in);
        if (r.control) {
          m_control_targets.insert(r.node);
        } else {
          m_consumers[r.node].push_back(i);
        }
      }
  }

  tfc::NodeDef* node(const std::string& name) {
    auto it = m_index.find(name);
    return it == m_index.end() ? nullptr : m_graph.mutable_node(it->second);
  }

  // The node producing data input `i` of `n` if it is output 0 of a node of type `op`.
  tfc::NodeDef* producer(const tfc::NodeDef& n, int i, const char* op) {
    if (i >= n.input_size()) return nullptr;
    const InputRef r = parse_input(n.input(i));
    if (r.control || r.port != 0) return nullptr;
    tfc::NodeDef* p = node(r.node);
    return p && p->op() == op ? p : nullptr;
  }

  // Data inputs of n referring to output 0 of `name`.
  static bool reads(const tfc::NodeDef& n, int i, const std::string& name) {
    if (i >= n.input_size()) return false;
    const InputRef r = parse_input(n.input(i));
    return !r.control && r.port == 0 && r.node == name;
  }

  size_t consumers(const std::string& name) const { return consumer_indices(name).size(); }
  // The graph indices of `name`'s data consumers, one per consuming input.
  const std::vector<int>& consumer_indices(const std::string& name) const {
    static const std::vector<int> kNone;
    auto it = m_consumers.find(name);
    return it == m_consumers.end() ? kNone : it->second;
  }
  // The single data consumer of `name`, if it has exactly one.
  tfc::NodeDef* only_consumer(const std::string& name) {
    auto it = m_consumers.find(name);
    if (it == m_consumers.end() || it->second.size() != 1) return nullptr;
    return m_graph.mutable_node(it->second[0]);
  }
  bool control_target(const std::string& name) const { return m_control_targets.count(name); }
  int size() const { return m_graph.node_size(); }
  tfc::NodeDef* at(int i) { return m_graph.mutable_node(i); }

 private:
  tfc::GraphDef& m_graph;
  std::unordered_map<std::string, int> m_index;
  std::unordered_map<std::string, std::vector<int>> m_consumers;
  std::unordered_set<std::string> m_control_targets;
};

inline bool on_npu(const tfc::NodeDef& n) { return on_npu_device(n.device()); }

inline std::optional<tfc::DataType> type_attr(const tfc::NodeDef& n, const char* name = "T") {
  auto it = n.attr().find(name);
  if (it == n.attr().end() || it->second.value_case() != tfc::AttrValue::kType) return std::nullopt;
  return it->second.type();
}

inline bool has_control_inputs(const tfc::NodeDef& n) {
  for (const std::string& in : n.input())
    if (!in.empty() && in[0] == '^') return true;
  return false;
}

// The tensor of a Const of the given dtype; nullptr for any other node or a Const without one.
inline const tfc::TensorProto* const_tensor(const tfc::NodeDef& n, tfc::DataType dtype) {
  if (n.op() != "Const" || type_attr(n, "dtype") != dtype) return nullptr;
  auto it = n.attr().find("value");
  if (it == n.attr().end() || it->second.value_case() != tfc::AttrValue::kTensor) return nullptr;
  return &it->second.tensor();
}

// The value of a float32 Const holding one element.
inline std::optional<float> scalar_float_const(const tfc::NodeDef& n) {
  const tfc::TensorProto* tensor = const_tensor(n, tfc::DT_FLOAT);
  if (!tensor) return std::nullopt;
  const tfc::TensorProto& t = *tensor;
  int64_t elements = 1;
  for (const auto& d : t.tensor_shape().dim()) elements *= d.size();
  if (elements != 1) return std::nullopt;
  if (t.float_val_size() >= 1) return t.float_val(0);
  if (t.tensor_content().size() == sizeof(float)) {
    float v;
    std::memcpy(&v, t.tensor_content().data(), sizeof v);
    return v;
  }
  return std::nullopt;
}

// Tracks the nodes a pass removes; each node belongs to at most one chain.
class Removal {
 public:
  Removal(GraphView& g, const std::unordered_set<std::string>& preserve)
      : m_graph(g), m_preserve(preserve) {}

  // n can disappear: on the NPU, not preserved, no control edges in or out, `consumers`
  // data consumers, not claimed by another chain.
  bool removable(const tfc::NodeDef& n, size_t consumers) const {
    return on_npu(n) && !m_preserve.count(n.name()) && !m_graph.control_target(n.name()) &&
           !has_control_inputs(n) && m_graph.consumers(n.name()) == consumers &&
           !m_claimed.count(n.name());
  }
  bool claimed(const std::string& name) const { return m_claimed.count(name); }
  void claim(const std::string& name) { m_claimed.insert(name); }
  void remove(const std::string& name) {
    m_claimed.insert(name);
    m_removed.insert(name);
  }
  const std::set<std::string>& removed() const { return m_removed; }

 private:
  GraphView& m_graph;
  const std::unordered_set<std::string>& m_preserve;
  std::set<std::string> m_claimed, m_removed;
};

// The fused node replacing `last` in place: same name and device, last's control inputs and
// its internal ("_"-prefixed) attributes kept.
inline void rewrite_as(tfc::NodeDef& last, const char* op, const std::vector<std::string>& inputs,
                       const std::map<std::string, tfc::AttrValue>& attrs) {
  tfc::NodeDef fused;
  fused.set_name(last.name());
  fused.set_op(op);
  fused.set_device(last.device());
  for (const std::string& in : inputs) fused.add_input(in);
  for (const std::string& in : last.input())
    if (!in.empty() && in[0] == '^') fused.add_input(in);
  for (const auto& [name, value] : last.attr())
    if (!name.empty() && name[0] == '_') (*fused.mutable_attr())[name] = value;
  for (const auto& [name, value] : attrs) (*fused.mutable_attr())[name] = value;
  if (last.has_experimental_debug_info())
    *fused.mutable_experimental_debug_info() = last.experimental_debug_info();
  last = std::move(fused);
}

inline tfc::AttrValue type_value(tfc::DataType t) {
  tfc::AttrValue v;
  v.set_type(t);
  return v;
}

inline bool half_type(tfc::DataType t) { return t == tfc::DT_HALF || t == tfc::DT_BFLOAT16; }
inline bool float_type(tfc::DataType t) { return t == tfc::DT_FLOAT || half_type(t); }

// The value of a scalar floating Const (float, half or bfloat16), as a double.
inline std::optional<double> scalar_value(const tfc::NodeDef* n) {
  if (!n || n->op() != "Const") return std::nullopt;
  if (std::optional<float> f = scalar_float_const(*n)) return *f;
  const std::optional<tfc::DataType> t = type_attr(*n, "dtype");
  auto it = n->attr().find("value");
  if (!t || !float_type(*t) || it == n->attr().end() ||
      it->second.value_case() != tfc::AttrValue::kTensor)
    return std::nullopt;
  const tfc::TensorProto& p = it->second.tensor();
  int64_t elements = 1;
  for (const auto& d : p.tensor_shape().dim()) elements *= d.size();
  if (elements != 1) return std::nullopt;
  // A tensor without values is zeros (TensorFlow writes 0.0 so)
  if (p.float_val_size() == 0 && p.half_val_size() == 0 && p.tensor_content().empty()) return 0.0;
  if (*t == tfc::DT_FLOAT) return std::nullopt;
  uint16_t bits = 0;
  if (p.half_val_size() >= 1) {
    bits = static_cast<uint16_t>(p.half_val(0));
  } else if (p.tensor_content().size() == sizeof bits) {
    std::memcpy(&bits, p.tensor_content().data(), sizeof bits);
  } else {
    return std::nullopt;
  }
  return *t == tfc::DT_HALF ? f16_to_f32(bits) : bf16_to_f32(bits);
}

// False when the environment variable is "0" (a rewrite's switch, graph_fusion.h).
inline bool switch_on(const char* variable) {
  const char* v = std::getenv(variable);
  return !(v && std::string(v) == "0");
}

}  // namespace npusim::tf::graph_edit
