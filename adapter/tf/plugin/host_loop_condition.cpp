#include "adapter/tf/plugin/host_loop_condition.h"

#include <cstdlib>
#include <string>
#include <unordered_map>
#include <vector>

#include "adapter/tf/plugin/graph_view.h"

namespace npusim::tf {
namespace {

namespace tfc = ::tensorflow;
using graph_edit::parse_input;

bool logical_op(const std::string& op) {
  return op == "LogicalAnd" || op == "LogicalOr" || op == "LogicalNot";
}

// An int32 comparison: TensorFlow's DEVICE_DEFAULT kernel computes it on host memory.
bool host_comparison(const tfc::NodeDef& n) {
  static const char* const kOps[] = {"Less",         "LessEqual", "Greater",
                                     "GreaterEqual", "Equal",     "NotEqual"};
  bool comparison = false;
  for (const char* op : kOps) comparison |= n.op() == op;
  const auto t = graph_edit::type_attr(n);
  return comparison && t && *t == tfc::DT_INT32;
}

}  // namespace

bool host_loop_condition_enabled() {
  const char* v = std::getenv("NPUSIM_HOST_LOOP_CONDITION");
  return !(v && std::string(v) == "0");
}

int label_host_loop_conditions(tfc::GraphDef& graph) {
  if (!host_loop_condition_enabled()) return 0;
  std::unordered_map<std::string, int> index;
  std::unordered_map<std::string, std::vector<int>> readers;  // data readers
  for (int i = 0; i < graph.node_size(); ++i) {
    index[graph.node(i).name()] = i;
    for (const std::string& in : graph.node(i).input()) {
      const graph_edit::InputRef r = parse_input(in);
      if (!r.control) readers[r.node].push_back(i);
    }
  }
  // Candidates: logical ops on the NPU without a label; dropped until the rest hold together
  // (a candidate's inputs from host values or candidates, its readers LoopConds or candidates).
  std::vector<char> host(static_cast<size_t>(graph.node_size()), 0);
  for (int i = 0; i < graph.node_size(); ++i) {
    const tfc::NodeDef& n = graph.node(i);
    host[i] = logical_op(n.op()) && graph_edit::on_npu(n) && !n.attr().count("_kernel");
  }
  for (bool dropped = true; dropped;) {
    dropped = false;
    for (int i = 0; i < graph.node_size(); ++i) {
      if (!host[i]) continue;
      const tfc::NodeDef& n = graph.node(i);
      bool ok = true;
      for (const std::string& in : n.input()) {
        const graph_edit::InputRef r = parse_input(in);
        if (r.control) continue;
        const auto it = index.find(r.node);
        ok = ok && it != index.end() && r.port == 0 &&
             ((host_comparison(graph.node(it->second)) &&
               graph_edit::on_npu(graph.node(it->second))) ||
              host[it->second]);
      }
      const auto rd = readers.find(n.name());
      ok = ok && rd != readers.end();
      if (ok)
        for (int reader : rd->second)
          ok = ok && (graph.node(reader).op() == "LoopCond" || host[reader]);
      if (!ok) {
        host[i] = 0;
        dropped = true;
      }
    }
  }
  int labelled = 0;
  for (int i = 0; i < graph.node_size(); ++i)
    if (host[i]) {
      (*graph.mutable_node(i)->mutable_attr())["_kernel"].set_s(kHostKernelLabel);
      ++labelled;
    }
  return labelled;
}

}  // namespace npusim::tf
