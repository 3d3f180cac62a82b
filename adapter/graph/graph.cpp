#include "adapter/graph/graph.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "common/npy.h"

namespace npusim::graph {
namespace {

using nlohmann::json;

struct RawNode {
  json j;
  std::vector<std::pair<std::string, int>> inputs;  // (node name, port), data inputs only
};

[[noreturn]] void fail(const std::string& file, const std::string& where, const std::string& what) {
  throw Error(fmt::format("{}: {}: {}", file, where, what));
}

const json& need(const json& j, const char* key, const std::string& file,
                 const std::string& where) {
  if (!j.is_object() || !j.contains(key)) fail(file, where, fmt::format("missing key '{}'", key));
  return j.at(key);
}

// "name:port" -> (name, port); "name" -> (name, 0).
std::pair<std::string, int> split_ref(const std::string& s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string::npos) return {s, 0};
  try {
    return {s.substr(0, colon), std::stoi(s.substr(colon + 1))};
  } catch (const std::exception&) {
    return {s, 0};
  }
}

compiler::AttrValue parse_attr(const json& v, const std::string& file, const std::string& where) {
  if (!v.is_object() || v.size() != 1)
    fail(file, where, "expected one tagged value, e.g. {\"i\": 1}");
  const auto& [tag, x] = *v.items().begin();
  try {
    if (tag == "i") return x.get<int64_t>();
    if (tag == "f") return x.get<double>();
    if (tag == "b") return x.get<bool>();
    if (tag == "s" || tag == "type") return x.get<std::string>();
    if (tag == "ints") return x.get<std::vector<int64_t>>();
    if (tag == "strs") return x.get<std::vector<std::string>>();
  } catch (const json::exception& e) {
    fail(file, where, fmt::format("'{}' value: {}", tag, e.what()));
  }
  fail(file, where, fmt::format("unknown tag '{}' (i, f, b, s, type, ints, strs)", tag));
}

compiler::TensorDesc parse_desc(const json& j, const std::string& file, const std::string& where) {
  compiler::TensorDesc t;
  const std::string dtype = need(j, "dtype", file, where).get<std::string>();
  auto d = compiler::data_type_from_name(dtype);
  if (!d) fail(file, where, fmt::format("dtype '{}' has no device type", dtype));
  t.dtype = *d;
  const json& shape = need(j, "shape", file, where);
  if (shape.is_null()) fail(file, where, "shape unknown (the engine needs static shapes)");
  for (const json& dim : shape) {
    if (dim.is_null() || dim.get<int64_t>() < 0)
      fail(file, where, fmt::format("shape {} has an unknown dimension", shape.dump()));
    t.shape.push_back(dim.get<int64_t>());
  }
  return t;
}

// The npy's bytes as `want` (same element type and element count).
std::vector<uint8_t> const_bytes(const NpyArray& a, const compiler::TensorDesc& want,
                                 const std::string& file, const std::string& where) {
  const std::string expect = npy_descr(want.dtype);
  if (a.dtype != expect || a.elements() != want.num_elements())
    fail(file, where,
         fmt::format("value is {}{}, the node declares {}", a.dtype, compiler::shape_str(a.shape),
                     want.str()));
  return a.data;
}

std::vector<RawNode> raw_nodes(const json& nodes, const std::string& file) {
  std::vector<RawNode> raw;
  for (const json& n : nodes) {
    RawNode r{n, {}};
    const std::string where =
        fmt::format("node '{}'", need(n, "name", file, "node").get<std::string>());
    for (const json& in : need(n, "inputs", file, where)) {
      const std::string s = in.get<std::string>();
      if (!s.empty() && s[0] != '^') r.inputs.push_back(split_ref(s));
    }
    raw.push_back(std::move(r));
  }
  return raw;
}

// A graph holding control flow: an error naming every control-flow node (a loop's NextIteration
// would otherwise show as a cycle, and a cond's Switch as one unmappable op among the branches').
void refuse_control_flow(const std::vector<RawNode>& raw, const std::string& file) {
  std::vector<std::string> found;
  for (const RawNode& r : raw) {
    const std::string op = r.j.value("op", "");
    if (is_tf_control_flow_op(op))
      found.push_back(fmt::format("  node '{}' ({})", r.j.value("name", ""), op));
  }
  if (found.empty()) return;
  fail(file, "nodes",
       fmt::format("{} control-flow node(s) of a lowered tf.cond or tf.while_loop (Keras' LSTM, "
                   "GRU) cannot be mapped: an offline model is one static task list, without "
                   "branches or loops (through TensorFlow the plugin runs loop bodies and taken "
                   "branches as whole graphs):\n{}",
                   found.size(), fmt::join(found, "\n")));
}

// Depth-first topological order of the raw nodes; throws on a cycle or an unknown input.
std::vector<size_t> topo_order(const std::vector<RawNode>& raw, const std::string& file) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < raw.size(); ++i) index[raw[i].j["name"].get<std::string>()] = i;
  std::vector<int> state(raw.size(), 0);  // 0 new, 1 on the stack, 2 done
  std::vector<size_t> order;
  std::vector<std::pair<size_t, size_t>> stack;
  for (size_t root = 0; root < raw.size(); ++root) {
    if (state[root]) continue;
    stack.push_back({root, 0});
    state[root] = 1;
    while (!stack.empty()) {
      auto& [n, next] = stack.back();
      if (next == raw[n].inputs.size()) {
        state[n] = 2;
        order.push_back(n);
        stack.pop_back();
        continue;
      }
      const std::string& src = raw[n].inputs[next++].first;
      auto it = index.find(src);
      if (it == index.end())
        fail(file, fmt::format("node '{}'", raw[n].j["name"].get<std::string>()),
             fmt::format("input '{}' names no node", src));
      if (state[it->second] == 1) fail(file, "nodes", fmt::format("cycle through '{}'", src));
      if (state[it->second] == 0) {
        state[it->second] = 1;
        stack.push_back({it->second, 0});
      }
    }
  }
  return order;
}

Node parse_node(const RawNode& r, const std::map<std::string, int>& index, const Graph& g,
                const std::string& file, const std::string& dir) {
  Node node;
  node.name = r.j["name"].get<std::string>();
  const std::string where = fmt::format("node '{}'", node.name);
  node.op = need(r.j, "op", file, where).get<std::string>();
  for (const auto& [src, port] : r.inputs) {
    const int n = index.at(src);
    if (port < 0 || size_t(port) >= g.nodes[n].outputs.size())
      fail(file, where,
           fmt::format("input '{}:{}': node '{}' has {} output(s)", src, port, src,
                       g.nodes[n].outputs.size()));
    node.inputs.push_back({n, port});
  }
  if (r.j.contains("attrs"))
    for (const auto& [k, v] : r.j["attrs"].items())
      node.attrs[k] = parse_attr(v, file, where + " attr '" + k + "'");
  size_t port = 0;
  for (const json& o : need(r.j, "outputs", file, where))
    node.outputs.push_back(parse_desc(o, file, fmt::format("{} output {}", where, port++)));
  if (node.op == "Const") {
    if (!r.j.contains("value") || node.outputs.size() != 1)
      fail(file, where,
           "a Const needs one output and a 'value' file (its dtype has no device type?)");
    const std::string npy = dir + "/" + r.j["value"].get<std::string>();
    node.value = const_bytes(read_npy(npy), node.outputs[0], file, where);
  }
  return node;
}

GraphIo parse_io(const json& j, const Graph& g, const std::map<std::string, int>& index,
                 const std::string& file, const std::string& where) {
  GraphIo io;
  io.name = need(j, "name", file, where).get<std::string>();
  const auto [node, port] = split_ref(need(j, "tensor", file, where).get<std::string>());
  auto it = index.find(node);
  if (it == index.end() || size_t(port) >= g.nodes[it->second].outputs.size())
    fail(file, where + " '" + io.name + "'",
         fmt::format("tensor '{}:{}' is no node output", node, port));
  io.tensor = {it->second, port};
  return io;
}

}  // namespace

bool is_tf_control_flow_op(const std::string& op) {
  static const std::set<std::string> kOps = {
      "Switch",        "RefSwitch", "_SwitchN", "Merge",         "RefMerge",         "Enter",
      "RefEnter",      "Exit",      "RefExit",  "NextIteration", "RefNextIteration", "LoopCond",
      "ControlTrigger"};
  return kOps.count(op) > 0;
}

std::string npy_descr(compiler::DataType t) {
  return t == compiler::DataType::BOOL ? "b1" : npy_dtype(compiler::device_dtype(t));
}

std::map<TensorRef, std::vector<int>> Graph::consumers() const {
  std::map<TensorRef, std::vector<int>> c;
  for (size_t i = 0; i < nodes.size(); ++i)
    if (!nodes[i].dead)
      for (const TensorRef& t : nodes[i].inputs) c[t].push_back(int(i));
  return c;
}

bool Graph::is_output(const TensorRef& t) const {
  for (const GraphIo& o : outputs)
    if (o.tensor == t) return true;
  return false;
}

Graph load_graph_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error(fmt::format("{}: cannot read", path));
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: not JSON: {}", path, e.what()));
  }
  if (!j.is_object() || j.value("format", "") != "npusim-graph" || j.value("version", 0) != 1)
    fail(path, "header", "expected \"format\": \"npusim-graph\", \"version\": 1");
  const std::string dir =
      path.rfind('/') == std::string::npos ? "." : path.substr(0, path.rfind('/'));
  try {
    std::vector<RawNode> raw = raw_nodes(need(j, "nodes", path, "graph"), path);
    refuse_control_flow(raw, path);
    Graph g;
    std::map<std::string, int> index;
    for (size_t i : topo_order(raw, path)) {
      g.nodes.push_back(parse_node(raw[i], index, g, path, dir));
      index[g.nodes.back().name] = int(g.nodes.size()) - 1;
    }
    for (const json& io : need(j, "inputs", path, "graph"))
      g.inputs.push_back(parse_io(io, g, index, path, "input"));
    for (const json& io : need(j, "outputs", path, "graph"))
      g.outputs.push_back(parse_io(io, g, index, path, "output"));
    if (g.outputs.empty()) fail(path, "outputs", "the graph has no outputs");
    return g;
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: malformed graph: {}", path, e.what()));
  }
}

}  // namespace npusim::graph
