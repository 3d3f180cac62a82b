// Chaining each NPU's nodes in a canonical launch order (launch_order.h).
#include "adapter/tf/plugin/launch_order.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <queue>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "adapter/tf/plugin/tensor_names.h"
#include "adapter/tf/plugin/tf_graph_headers.h"

namespace npusim::tf {
namespace {

namespace tfc = ::tensorflow;

bool on_npu(const tfc::NodeDef& n) { return on_npu_device(n.device()); }

// Ops that complete after their kernel returns: a replica's collective part waits for the other
// replicas (kernels_collective.cpp). They stay out of the chain and count as the boundaries of
// the order's levels.
bool is_async(const tfc::NodeDef& n) { return n.op() == "NpuCollective"; }

// Nodes that run work on their NPU and join its chain (launch_order.h, "Chained").
bool chained(const tfc::NodeDef& n) {
  // clang-format off
  static const std::set<std::string> kPlumbing = {
      "_Arg", "_Retval", "_DeviceArg", "_DeviceRetval", "_Send", "_Recv", "_HostSend",
      "_HostRecv", "NoOp", "Const", "HostConst", "Placeholder", "PlaceholderWithDefault",
      "PartitionedCall", "StatefulPartitionedCall", "If", "StatelessIf", "While",
      "StatelessWhile", "Case", "StatelessCase"};
  // clang-format on
  return on_npu(n) && !is_async(n) && !kPlumbing.count(n.op());
}

}  // namespace

bool launch_order_enabled() {
  const char* v = std::getenv("NPUSIM_LAUNCH_ORDER");
  return v && std::string(v) == "1";
}

int order_npu_launches(tfc::GraphDef& graph) {
  const int n = graph.node_size();
  std::unordered_map<std::string, int> index;
  for (int v = 0; v < n; ++v) {
    if (is_control_flow_op(graph.node(v).op())) return 0;
    index[graph.node(v).name()] = v;
  }
  // Edges (data and control) from producer to consumer; unknown inputs are outside the graph.
  std::vector<std::vector<int>> succ(static_cast<size_t>(n));
  std::vector<int> indeg(static_cast<size_t>(n), 0);
  for (int v = 0; v < n; ++v)
    for (const std::string& in : graph.node(v).input()) {
      const auto it = index.find(split_input(in).first);
      if (it == index.end()) continue;
      succ[static_cast<size_t>(it->second)].push_back(v);
      ++indeg[static_cast<size_t>(v)];
    }
  // Kahn's algorithm, the ready node with the fewest asynchronous ops upstream first, then by
  // position. upstream[v]: the most asynchronous ops on a path into v (v itself not counted);
  // final once v is ready, since all its producers have been taken.
  std::vector<int> upstream(static_cast<size_t>(n), 0);
  using Key = std::pair<int, int>;  // (upstream asynchronous ops, position)
  std::priority_queue<Key, std::vector<Key>, std::greater<Key>> ready;
  for (int v = 0; v < n; ++v)
    if (indeg[static_cast<size_t>(v)] == 0) ready.push({0, v});
  std::map<std::string, int> last_on_device;  // device -> its latest chained node so far
  int added = 0, taken = 0;
  std::vector<std::pair<int, int>> edges;  // (predecessor, node) to add
  while (!ready.empty()) {
    const int v = ready.top().second;
    ready.pop();
    ++taken;
    const tfc::NodeDef& node = graph.node(v);
    if (chained(node)) {
      const auto [it, first] = last_on_device.try_emplace(node.device(), v);
      if (!first) {
        edges.emplace_back(it->second, v);
        it->second = v;
      }
    }
    const int level = upstream[static_cast<size_t>(v)] + (is_async(node) ? 1 : 0);
    for (int s : succ[static_cast<size_t>(v)]) {
      int& up = upstream[static_cast<size_t>(s)];
      up = std::max(up, level);
      if (--indeg[static_cast<size_t>(s)] == 0) ready.push({up, s});
    }
  }
  if (taken != n) return 0;  // a cycle: not a graph TensorFlow would run; leave it alone
  for (const auto& [pred, v] : edges) {
    tfc::NodeDef& node = *graph.mutable_node(v);
    const std::string& pred_name = graph.node(pred).name();
    const std::string edge = "^" + pred_name;
    if (std::find(node.input().begin(), node.input().end(), edge) != node.input().end()) continue;
    node.add_input(edge);  // control inputs come after the data inputs
    (*node.mutable_attr())[kOrderAfterAttr].set_s(pred_name);
    ++added;
  }
  return added;
}

}  // namespace npusim::tf
