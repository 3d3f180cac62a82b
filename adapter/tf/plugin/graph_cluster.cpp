// Clustering NPU graphs into NpuGraph nodes (npu_graph.h), and reading a cluster back.
//
// A node may join a cluster when:
//  - it is assigned to the NPU and its op runs as a CompiledOpKernel of the compiler's op table
//    or is a stateless random op (StatelessRandomGetKeyCounter, StatelessRandomUniformV2: their
//    uint64 key and counter are the compiler's s64 in the task list) (npu_graph_clusterable_op:
//    no resource or variable op, no stateful random op, no plugin-only op but DropOutGenMask,
//    an AI CPU step of the task list: npu_graph_kernel.cpp);
//  - each input the op reads on the host (reduction axes, ...) comes straight from a Const node
//    (its value is copied into the cluster; anything computed stays node by node);
//  - TensorFlow does not ask to preserve it (fetches, keep ops: GrapplerItem::NodesToPreserve),
//    so no node TensorFlow looks up by name disappears;
//  - or it is a FusedVariableUpdate (graph_fusion.h, rewrite 5) assigned to the NPU, unless
//    NPUSIM_GRAPH_UPDATES=0 (npu_graph.h): its resource handles become the NpuGraph node's
//    variables; a set never holds two updates of one handle (the second would read the
//    variable's old value); TensorFlow may preserve it (a function's control output): it then
//    stays as a NoOp of its name, after the NpuGraph node;
//  - or it is an in-place KV-cache update (ResourceDynamicUpdateSlice, npu_graph.h) on the NPU,
//    under the same switch and rules as an update, or a ReadVariableOp that tf.function ordered
//    after an update of its handle, a KV-cache update or a FusedVariableUpdate (a control edge
//    from it, or from a NoOp after it: a multi-tensor update's member left as a NoOp of its
//    name; `read_after_noop_as_after_update`): a "read after an update". That control edge joins
//    sets as a data edge does, and a set holds such a read only with the update it follows (or
//    none of that handle): inside the set it reads the update step's new value (npu_graph.h).
//    Such a read read outside the set, or preserved, stays outside too (a copy under its name,
//    reading the variable after the NpuGraph node);
//  - or it is a view (npu_graph_view_op: Reshape, ExpandDims, Squeeze, Bitcast between two
//    types of the chip of one size) whose host input comes from a Const: it joins only the set of
//    its input's producer (a set never starts with a view, so its place is always an earlier
//    step's), and an outside reader of its output reads a copy of it left outside the set (below);
//  - it is no control-flow op (Switch, Merge, Enter, Exit, NextIteration, LoopCond, ...) and has
//    a liveness class (graph_liveness.h: its loop frame and the predicates it runs under); a
//    set holds nodes of one class only. The tensors of a lowered cond or loop may be dead, and
//    an NpuGraph node runs all its members or none: members of one class are live in exactly
//    the same executions (a loop body's nodes run once per iteration as one NpuGraph node, a
//    cond branch's nodes as one when the branch is taken, the nodes no control-flow op reaches
//    as one: the forward and backward pass of Keras' mixed-precision step, whose loss-scale
//    optimizer conds on the gradients being finite). A set in a loop's frame needs an input
//    from outside it (an NpuGraph node without inputs would run in the top frame).
//    NPUSIM_GRAPH_CONTROL_FLOW=top keeps to the nodes no control-flow op reaches along data or
//    control edges, =0 leaves every graph with control flow alone (graph_control_flow_clustering).
// Edges out of NextIteration nodes lead to the next iteration of a loop: the graph below has
// edges from each NextIteration to its loop's Exits instead (struct Graph; a graph still cyclic
// is left alone). Clusters grow along data
// edges between such nodes (union of connected sets; the edges are tried again while sets
// merge), and two sets merge only if no path leads
// from one to the other through a node outside both (control edges included): the contracted
// graph stays acyclic, so the NpuGraph node can run after all its inputs and before all its
// consumers. A Const's edge into the other set that its member reads
// only as host inputs is not such a path's edge: the merged set copies the value and takes no
// input from the Const (grappler's constant-folded ShapeN Consts keep control inputs). In a
// graph without control flow the Consts on the chip lose their control inputs first
// (detach_consts: they only delay a value that cannot change), so a Const read as a data input
// makes no such path either. An update
// left alone (no data edge to a member) then joins the largest set it can under the same rule, and
// so does a compiled op left alone whose data inputs are all variable reads and Consts (a
// variable's next state: Keras 3's seed `state + [0, 1]`, its readers the AssignVariableOp that
// writes it back, after the NpuGraph node). Other sets of one node stay as they were.
//
// The rewrite: the NpuGraph node takes the cluster's external data inputs (deduplicated) and the
// members' control inputs from outside; each member output read outside (data) becomes one
// output; outside readers are rewired to it, and control edges from members to the NpuGraph
// node. Its name is "npu_graph_<N>" (unused in the graph), its device the members'. A view
// member read outside the set stays outside too, under its name, as TensorFlow's own (free)
// kernel reading the NpuGraph output it views (or its input's copy, for a view of a view): so
// no graph output is a view, and readers that look it up by name still find it.
#include <algorithm>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "adapter/tf/plugin/compiled_op_table.h"
#include "adapter/tf/plugin/filter_layout.h"
#include "adapter/tf/plugin/gen_mask_task.h"
#include "adapter/tf/plugin/graph_liveness.h"
#include "adapter/tf/plugin/npu_graph.h"
#include "adapter/tf/plugin/tensor_names.h"
#include "adapter/tf/plugin/tf_graph_headers.h"

namespace npusim::tf {
namespace {

namespace tfc = ::tensorflow;

bool on_npu(const tfc::NodeDef& n) { return on_npu_device(n.device()); }

bool is_next_iteration(const tfc::NodeDef& n) {
  return n.op() == "NextIteration" || n.op() == "RefNextIteration";
}

std::string tensor_name(const std::string& node, int port) {
  return port == 0 ? node : node + ":" + std::to_string(port);
}

// The graph's nodes with their edges (data and control), indexed. An edge out of a NextIteration
// leads to the loop's next iteration: it is replaced by edges to the Exits of the loop (the Exits
// whose input lies in the NextIteration's frame, `liveness`), so that paths stay within one
// iteration inside the loop (a body's last node does not reach its first), while everything the
// body computes still reaches what runs after the loop.
struct Graph {
  std::vector<const tfc::NodeDef*> nodes;
  std::unordered_map<std::string, int> index;
  std::vector<std::vector<int>> succ;  // data and control successors (repeats possible)

  Graph(const tfc::GraphDef& g, const LivenessClasses& liveness) {
    for (const tfc::NodeDef& n : g.node()) {
      index[n.name()] = static_cast<int>(nodes.size());
      nodes.push_back(&n);
    }
    succ.resize(nodes.size());
    std::map<int, std::vector<int>> exits_of;  // loop frame -> its Exits
    for (size_t v = 0; v < nodes.size(); ++v) {
      const std::string& op = nodes[v]->op();
      if ((op != "Exit" && op != "RefExit") || nodes[v]->input_size() < 1) continue;
      const auto in = index.find(split_input(nodes[v]->input(0)).first);
      if (in != index.end()) exits_of[liveness.frame[in->second]].push_back(static_cast<int>(v));
    }
    for (size_t v = 0; v < nodes.size(); ++v) {
      if (is_next_iteration(*nodes[v])) {
        const auto e = exits_of.find(liveness.frame[v]);
        if (e != exits_of.end()) succ[v] = e->second;
      }
      for (const std::string& in : nodes[v]->input()) {
        const auto it = index.find(split_input(in).first);
        if (it != index.end() && !is_next_iteration(*nodes[it->second]))
          succ[it->second].push_back(static_cast<int>(v));
      }
    }
  }
};

// Positions of `node`'s data inputs that are host inputs of its op (resolved from the end).
std::vector<int> host_input_positions(const tfc::NodeDef& node, const std::vector<int>& host) {
  int data_inputs = 0;
  for (const std::string& in : node.input()) data_inputs += !in.empty() && in[0] != '^';
  std::vector<int> pos;
  for (int h : host) pos.push_back(h < 0 ? data_inputs + h : h);
  return pos;
}

// An update of variables the set may hold: FusedVariableUpdate, or an in-place KV-cache update
// (ResourceDynamicUpdateSlice).
bool is_update(const tfc::NodeDef& n) {
  return n.op() == kVariableUpdateOp || n.op() == kCacheUpdateOp;
}

bool is_view(const tfc::NodeDef& n) {
  std::vector<int> host;
  return npu_graph_view_op(n.op(), &host);
}

// The positions of `op`'s inputs read on the host, for a view or a compiled op.
std::vector<int> member_host_inputs(const std::string& op) {
  std::vector<int> host;
  if (!npu_graph_view_op(op, &host)) npu_graph_clusterable_op(op, &host);
  return host;
}

// An update's resource inputs (its first M inputs, as written; a cache update's input 0).
std::vector<std::string> update_handles(const tfc::NodeDef& n) {
  if (n.op() == kCacheUpdateOp)
    return n.input_size() > 0 ? std::vector<std::string>{n.input(0)} : std::vector<std::string>{};
  const auto m = n.attr().find("M");
  std::vector<std::string> handles;
  if (m == n.attr().end()) return handles;
  for (int i = 0; i < m->second.i() && i < n.input_size(); ++i) handles.push_back(n.input(i));
  return handles;
}

// Whether `u` is an update of `handle` on `device`.
bool updates_handle(const tfc::NodeDef& u, const std::string& handle, const std::string& device) {
  if (!is_update(u) || u.device() != device) return false;
  const std::vector<std::string> h = update_handles(u);
  return std::find(h.begin(), h.end(), handle) != h.end();
}

// The update a ReadVariableOp reads after: its control input from an update of the same handle
// (a KV-cache update, or a FusedVariableUpdate holding the handle among its variables) on the
// same device (tf.function orders a read after the last update of its variable so); nullptr for
// any other node.
const tfc::NodeDef* read_after_update(const Graph& g, const tfc::NodeDef& n) {
  if (n.op() != "ReadVariableOp" || n.input_size() < 1) return nullptr;
  for (const std::string& in : n.input()) {
    const auto [src, port] = split_input(in);
    if (port >= 0) continue;
    const auto it = g.index.find(src);
    if (it == g.index.end()) continue;
    if (updates_handle(*g.nodes[it->second], n.input(0), n.device())) return g.nodes[it->second];
  }
  return nullptr;
}

// A read ordered after an update through a NoOp (a multi-tensor update's member left as a NoOp
// of its name, graph_fusion.h rewrite 5: `^AssignVariableOp_1` whose only input is
// `^npusim_multi_tensor_update_0`) is ordered after the update itself: each ReadVariableOp's
// control input from a NoOp that has control inputs only, one of them an update of the read's
// handle on its device, becomes those control inputs. The order is the same (the NoOp does
// nothing), and the read is then one `read_after_update` sees.
void read_after_noop_as_after_update(tfc::GraphDef& graph) {
  std::unordered_map<std::string, const tfc::NodeDef*> by_name;
  for (const tfc::NodeDef& n : graph.node()) by_name[n.name()] = &n;
  // The NoOp's control inputs, when it has no other inputs and one is an update of `handle`
  // on `device`; empty otherwise.
  auto noop_after_update = [&](const std::string& name, const std::string& handle,
                               const std::string& device) {
    const auto it = by_name.find(name);
    std::vector<std::string> controls;
    if (it == by_name.end() || it->second->op() != "NoOp") return controls;
    bool update = false;
    for (const std::string& in : it->second->input()) {
      const auto [src, port] = split_input(in);
      if (port >= 0) return std::vector<std::string>{};
      controls.push_back(in);
      const auto u = by_name.find(src);
      update = update || (u != by_name.end() && updates_handle(*u->second, handle, device));
    }
    return update ? controls : std::vector<std::string>{};
  };
  for (tfc::NodeDef& n : *graph.mutable_node()) {
    if (n.op() != "ReadVariableOp" || n.input_size() < 1) continue;
    std::vector<std::string> inputs;
    bool changed = false;
    for (const std::string& in : n.input()) {
      const std::vector<std::string> controls =
          split_input(in).second < 0
              ? noop_after_update(split_input(in).first, n.input(0), n.device())
              : std::vector<std::string>{};
      if (controls.empty()) {
        inputs.push_back(in);
        continue;
      }
      changed = true;
      for (const std::string& c : controls)
        if (std::find(inputs.begin(), inputs.end(), c) == inputs.end()) inputs.push_back(c);
    }
    if (!changed) continue;
    n.clear_input();
    for (const std::string& in : inputs) n.add_input(in);
  }
}

// A Bitcast the plan can place as a view: from and to types the compiler has (so the set's spec
// names them), of the same size (the shape unchanged).
bool same_size_bitcast(const tfc::NodeDef& n) {
  const auto from = n.attr().find("T"), to = n.attr().find("type");
  if (from == n.attr().end() || to == n.attr().end()) return false;
  const auto a =
      compiler::data_type_from_name(compiler_type_name(static_cast<int>(from->second.type())));
  const auto b =
      compiler::data_type_from_name(compiler_type_name(static_cast<int>(to->second.type())));
  return a && b && compiler::data_type_bytes(*a) == compiler::data_type_bytes(*b);
}

// A node's type attributes and their values (compiled_op_table.h, table_kernel_takes_types).
std::map<std::string, std::vector<TF_DataType>> types_of(const tfc::NodeDef& node) {
  std::map<std::string, std::vector<TF_DataType>> types;
  for (const auto& [name, value] : node.attr()) {
    if (value.value_case() == tfc::AttrValue::kType)
      types[name].push_back(static_cast<TF_DataType>(value.type()));
    else if (value.value_case() == tfc::AttrValue::kList && value.list().type_size() > 0)
      for (const int t : value.list().type()) types[name].push_back(static_cast<TF_DataType>(t));
  }
  return types;
}

// Whether node by node TensorFlow's DEVICE_DEFAULT kernel runs `node` on the host, not the
// plugin's (int32 shape arithmetic: Less, AddV2 ... on int32; table_kernel_takes_types).
bool host_kernel(const tfc::NodeDef& node) {
  return !is_update(node) && !is_view(node) && node.op() != kGenMaskOp &&
         node.op() != "ReadVariableOp" && !table_kernel_takes_types(node.op(), types_of(node));
}

bool clusterable(const Graph& g, const tfc::NodeDef& node,
                 const std::unordered_set<std::string>& preserve) {
  if (read_after_update(g, node))  // preserved: its copy outside keeps the name (below)
    return on_npu(node) && graph_updates_enabled();
  if (is_update(node))
    return on_npu(node) && graph_updates_enabled() && !update_handles(node).empty();
  if (!on_npu(node) || preserve.count(node.name())) return false;
  // A variant (AddN / ZerosLike of TensorLists: kernels_tensor_list.cpp) is no task-list tensor;
  // a labelled kernel (host_loop_condition.h) is no compiled op.
  if (node.attr().count("_kernel")) return false;
  for (const auto& [attr, types] : types_of(node))
    if (std::find(types.begin(), types.end(), TF_VARIANT) != types.end()) return false;
  std::vector<int> host;
  if (!npu_graph_view_op(node.op(), &host) && !npu_graph_clusterable_op(node.op(), &host))
    return false;
  if (is_view(node) && (node.input_size() == 0 || split_input(node.input(0)).second < 0))
    return false;
  if (node.op() == "Bitcast" && !same_size_bitcast(node)) return false;
  const std::vector<int> pos = host_input_positions(node, host);
  for (int p : pos) {
    if (p < 0 || p >= node.input_size()) return false;
    const auto it = g.index.find(split_input(node.input(p)).first);
    if (it == g.index.end() || g.nodes[it->second]->op() != "Const") return false;
  }
  return true;
}

// Whether every data input of `node` is a ReadVariableOp's or a Const's output outside every set
// (`ok`: the nodes that may join one), at least one a ReadVariableOp's: a value computed from
// variables only.
bool state_step_inputs(const Graph& g, const tfc::NodeDef& node, const std::vector<char>& ok) {
  int reads = 0;
  for (const std::string& in : node.input()) {
    const auto [src, port] = split_input(in);
    if (port < 0) continue;
    const auto it = g.index.find(src);
    if (it == g.index.end() || ok[it->second]) return false;
    const std::string& op = g.nodes[it->second]->op();
    if (op != "ReadVariableOp" && op != "Const") return false;
    reads += op == "ReadVariableOp";
  }
  return reads > 0;
}

// Union-find over node indices.
struct Sets {
  std::vector<int> parent;
  explicit Sets(size_t n) : parent(n) {
    for (size_t i = 0; i < n; ++i) parent[i] = static_cast<int>(i);
  }
  int find(int x) {
    while (parent[x] != x) x = parent[x] = parent[parent[x]];
    return x;
  }
};

// Whether `member` reads Const `c` only as host inputs of its op (at least once): the set copies
// the value into its spec and the NpuGraph node takes no input from `c`, so the edge is gone
// once `member`'s set is rewritten.
bool reads_const_on_host_only(const Graph& g, int c, int member) {
  const tfc::NodeDef& m = *g.nodes[member];
  if (g.nodes[c]->op() != "Const") return false;
  const std::vector<int> host = host_input_positions(m, member_host_inputs(m.op()));
  bool read = false;
  for (int i = 0; i < m.input_size(); ++i) {
    if (split_input(m.input(i)).first != g.nodes[c]->name()) continue;
    if (std::find(host.begin(), host.end(), i) == host.end()) return false;  // data or control
    read = true;
  }
  return read;
}

// Drops the control inputs of the Consts on an NPU in a graph without control flow (the
// working copy's; none if the graph has a control-flow op); returns how many. A Const's control
// inputs only delay it: without frames or dead tensors for them to carry, its value is the same
// whenever it runs. grappler's constant folding keeps them on the Consts it folds from shapes
// (a Mean gradient's element count `moments/scalar`, ordered after the forward's node whose
// shape it was), and such a Const read as a data input by a later node made a path from the
// earlier node's set through the Const to the later one's, which then could not merge
// (ConvNeXt's unfused layer norms split its training step into four task lists).
int detach_consts(tfc::GraphDef& work) {
  for (const tfc::NodeDef& n : work.node())
    if (is_control_flow_op(n.op())) return 0;
  int dropped = 0;
  for (tfc::NodeDef& n : *work.mutable_node()) {
    if (n.op() != "Const" || !on_npu(n)) continue;
    int kept = 0;
    for (int i = 0; i < n.input_size(); ++i)
      if (split_input(n.input(i)).second >= 0) *n.mutable_input(kept++) = n.input(i);
    dropped += n.input_size() - kept;
    while (n.input_size() > kept) n.mutable_input()->RemoveLast();
  }
  return dropped;
}

// Whether a path leads from set `a` to set `b` through at least one node outside both (sets of
// the contracted graph: entering a set reaches all its members). An edge into `b` from a Const
// `b`'s member reads only as host inputs (`reads_const_on_host_only`) is no edge of that graph:
// should a and b merge, the rewritten set takes the value, not the Const, and its steps keep
// the order of the Const's control inputs among its members (grappler's constant-folded
// `ShapeN` of a convolution's backprop keeps a control input from the forward's MaxPool: the
// Const runs after the NpuGraph node, read by nothing). An edge into a third set still counts:
// that set may yet be left alone.
bool path_through_outside(const Graph& g, Sets& sets,
                          const std::unordered_map<int, std::vector<int>>& members, int a, int b) {
  std::vector<char> seen(g.nodes.size(), 0);
  std::vector<int> stack;
  auto push_set = [&](int node) {
    const int s = sets.find(node);
    const auto it = members.find(s);
    if (it == members.end()) {
      if (!seen[node]) {
        seen[node] = 1;
        stack.push_back(node);
      }
      return;
    }
    for (int m : it->second)
      if (!seen[m]) {
        seen[m] = 1;
        stack.push_back(m);
      }
  };
  // Start: the successors of a's members that lie outside a and b.
  for (int m : members.at(a))
    for (int s : g.succ[m]) {
      const int root = sets.find(s);
      if (root != a && root != b) push_set(s);
    }
  while (!stack.empty()) {
    const int v = stack.back();
    stack.pop_back();
    for (int s : g.succ[v]) {
      const int root = sets.find(s);
      if (root == b) {
        if (reads_const_on_host_only(g, v, s)) continue;
        return true;
      }
      if (root == a) continue;  // cannot happen in an acyclic contracted graph
      push_set(s);
    }
  }
  return false;
}

std::vector<int> topological_order(const Graph& g) {
  std::vector<int> indeg(g.nodes.size(), 0), order;
  for (const auto& s : g.succ)
    for (int v : s) ++indeg[v];
  for (size_t v = 0; v < g.nodes.size(); ++v)
    if (indeg[v] == 0) order.push_back(static_cast<int>(v));
  for (size_t i = 0; i < order.size(); ++i)
    for (int v : g.succ[order[i]])
      if (--indeg[v] == 0) order.push_back(v);
  return order;
}

// The dtype of each output of `node` (empty if its op is unknown). Attributes left at their
// defaults count with their default: a node the fusions of this call made carries only the
// attributes they set (a Conv2DBiasAdd without `Tbias`), whose types InOutTypesForNode would
// not resolve until TensorFlow adds the defaults between calls; a set reading such a node
// would be left alone in this call and clustered apart from the rest in the next.
std::vector<tfc::DataType> output_types(const tfc::NodeDef& node) {
  tfc::DataTypeVector in, out;
  const tfc::OpDef* def = nullptr;
  if (!tfc::OpRegistry::Global()->LookUpOpDef(node.op(), &def).ok()) return {};
  tfc::NodeDef full = node;
  tfc::AddDefaultsToNodeDef(*def, &full);
  if (!tfc::InOutTypesForNode(full, *def, &in, &out).ok()) return {};
  return std::vector<tfc::DataType>(out.begin(), out.end());
}

// For each node: whether it is a control-flow op or one reaches it along data or control edges
// (its tensors may be dead, or it runs in a loop's frame).
std::vector<char> below_control_flow(const Graph& g) {
  std::vector<char> below(g.nodes.size(), 0);
  std::vector<int> stack;
  for (size_t v = 0; v < g.nodes.size(); ++v)
    if (is_control_flow_op(g.nodes[v]->op())) {
      below[v] = 1;
      stack.push_back(static_cast<int>(v));
    }
  while (!stack.empty()) {
    const int u = stack.back();
    stack.pop_back();
    for (int v : g.succ[u])
      if (!below[v]) {
        below[v] = 1;
        stack.push_back(v);
      }
  }
  return below;
}

std::string unused_name(const Graph& g, int* counter) {
  for (;;) {
    std::string name = "npu_graph_" + std::to_string((*counter)++);
    if (!g.index.count(name)) return name;
  }
}

}  // namespace

ClusterCounts cluster_npu_graph(tfc::GraphDef& graph,
                                const std::unordered_set<std::string>& preserve) {
  ClusterCounts counts;
  const ControlFlowClustering control_flow = graph_control_flow_clustering();
  if (control_flow == ControlFlowClustering::off)
    for (const tfc::NodeDef& n : graph.node())
      if (is_control_flow_op(n.op())) return counts;
  // The clustering reads (and rewrites) a copy: `graph` changes only if a set is made.
  tfc::GraphDef work = graph;
  read_after_noop_as_after_update(work);
  detach_consts(work);
  const LivenessClasses liveness = liveness_classes(work);
  const Graph g(work, liveness);
  const std::vector<int> order = topological_order(g);
  if (order.size() != g.nodes.size()) return counts;  // a cycle: leave the graph alone
  const std::vector<std::string>& live_class = liveness.of;
  const std::vector<char> below = control_flow == ControlFlowClustering::top
                                      ? below_control_flow(g)
                                      : std::vector<char>(g.nodes.size(), 0);

  std::vector<char> ok(g.nodes.size(), 0);
  std::unordered_map<int, std::vector<int>> members;  // set root -> members
  // Set root -> its updates' handles (each with the update's name), and its reads after an
  // update (handle, the update each reads after).
  std::unordered_map<int, std::map<std::string, std::string>> handles;
  std::unordered_map<int, std::set<std::pair<std::string, std::string>>> reads;
  // The nodes that may join a set. One that TensorFlow's host kernel runs node by node
  // (host_kernel) only when a data input comes from one that may join and computes on the chip:
  // int32 arithmetic on the chip's values (a finiteness test's bit compare) joins, arithmetic
  // on host values (a loop's counter and condition) stays TensorFlow's.
  std::vector<char> candidate(g.nodes.size(), 0), on_host(g.nodes.size(), 0);
  for (size_t v = 0; v < g.nodes.size(); ++v) {
    candidate[v] = !below[v] && !live_class[v].empty() && clusterable(g, *g.nodes[v], preserve);
    on_host[v] = candidate[v] && host_kernel(*g.nodes[v]);
  }
  auto reads_chip_value = [&](size_t v) {
    for (const std::string& in : g.nodes[v]->input()) {
      const auto [src, port] = split_input(in);
      const auto it = g.index.find(src);
      if (port >= 0 && it != g.index.end() && candidate[it->second] && !on_host[it->second])
        return true;
    }
    return false;
  };
  for (size_t v = 0; v < g.nodes.size(); ++v)
    if (candidate[v] && (!on_host[v] || reads_chip_value(v))) {
      const tfc::NodeDef& n = *g.nodes[v];
      ok[v] = 1;
      members[static_cast<int>(v)] = {static_cast<int>(v)};
      if (is_update(n))
        for (const std::string& h : update_handles(n)) handles[static_cast<int>(v)][h] = n.name();
      if (const tfc::NodeDef* u = read_after_update(g, n))
        reads[static_cast<int>(v)].insert({n.input(0), u->name()});
    }
  // Whether sets a and b may not merge for their variables: both update one handle (the second
  // update would read the variable's old value), or one reads a handle after an update other
  // than the one the other set holds (its readers in the task list could follow that update).
  auto share_handle = [&](int a, int b) {
    for (const auto& [h, u] : handles[b])
      if (handles[a].count(h)) return true;
    for (const auto& [x, y] : {std::pair<int, int>{a, b}, std::pair<int, int>{b, a}})
      for (const auto& [h, after] : reads[x]) {
        const auto it = handles[y].find(h);
        if (it != handles[y].end() && it->second != after) return true;
      }
    return false;
  };
  Sets sets(g.nodes.size());
  // Set b (a root) joins set a (a root).
  auto merge = [&](int a, int b) {
    sets.parent[b] = a;
    handles[a].insert(handles[b].begin(), handles[b].end());
    handles.erase(b);
    reads[a].insert(reads[b].begin(), reads[b].end());
    reads.erase(b);
    auto& ma = members[a];
    ma.insert(ma.end(), members[b].begin(), members[b].end());
    members.erase(b);
  };
  // Sets grow along data edges in topological order, and again until no two merge: an edge
  // refused for a path through a node that joined one of its sets later (the Sub of a
  // SquaredDifference's gradient, ordered by a control edge after the Mean gradient that later
  // joined the forward's set: ConvNeXt's unfused layer norms) may then join.
  for (bool merged = true; merged;) {
    merged = false;
    for (int u : order) {
      if (!ok[u]) continue;
      // A view joins its input's set only: edges out of it count once it is there.
      if (is_view(*g.nodes[u])) {
        const auto in = g.index.find(split_input(g.nodes[u]->input(0)).first);
        if (in == g.index.end() || sets.find(in->second) != sets.find(u)) continue;
      }
      for (int v : g.succ[u]) {
        if (!ok[v]) continue;
        // Only data edges join sets, and the control edge from an update to a read after it.
        bool data = read_after_update(g, *g.nodes[v]) == g.nodes[u];
        for (const std::string& in : g.nodes[v]->input())
          data |= split_input(in).second >= 0 && split_input(in).first == g.nodes[u]->name();
        if (!data) continue;
        const int a = sets.find(u), b = sets.find(v);
        if (a == b || !on_npu(*g.nodes[v]) || g.nodes[u]->device() != g.nodes[v]->device() ||
            live_class[u] != live_class[v])
          continue;
        if (share_handle(a, b) || path_through_outside(g, sets, members, a, b)) continue;
        merge(a, b);
        merged = true;
      }
    }
  }
  // A lone update (no data edge to another member: its value from Consts and variable reads
  // only, e.g. a metric's `count += batch size`) joins the largest set of its device it can
  // join: no path between them through outside nodes either way, no variable updated twice.
  // The largest set (of two members or more; the first root of equal size) that the set of one
  // node `u` may join: the same device, no path between them through outside nodes either way,
  // no variable updated twice; -1 if none.
  auto largest_joinable_set = [&](int u) {
    int best = -1;
    for (const auto& [root, list] : members)
      if (list.size() >= 2 && g.nodes[root]->device() == g.nodes[u]->device() &&
          live_class[root] == live_class[u] &&
          (best < 0 || list.size() > members[best].size() ||
           (list.size() == members[best].size() && root < best)))
        if (!share_handle(root, u) && !path_through_outside(g, sets, members, root, u) &&
            !path_through_outside(g, sets, members, u, root))
          best = root;
    return best;
  };
  for (int u : order) {
    if (!ok[u] || !is_update(*g.nodes[u]) || members[sets.find(u)].size() != 1) continue;
    const int best = largest_joinable_set(u);
    if (best >= 0) merge(best, u);
  }
  // A lone step of a variable's state (a compiled op, no view, no update, whose data inputs are
  // all variable reads and Consts outside every set: Keras 3's seed update `state + [0, 1]`, an
  // optimizer's step counter, each written back by an AssignVariableOp) joins the largest set
  // of its device under the same rule; its readers then follow that set's NpuGraph node.
  for (int u : order) {
    const tfc::NodeDef& n = *g.nodes[u];
    if (!ok[u] || is_update(n) || is_view(n) || read_after_update(g, n) ||
        members[sets.find(u)].size() != 1 || !state_step_inputs(g, n, ok))
      continue;
    const int best = largest_joinable_set(u);
    if (best >= 0) merge(best, u);
  }

  std::vector<int> position(g.nodes.size(), 0);
  for (size_t i = 0; i < order.size(); ++i) position[order[i]] = static_cast<int>(i);
  int counter = 0;
  std::unordered_map<std::string, std::string> rename;          // "member:port" -> "npu_graph_N:K"
  std::unordered_map<std::string, std::string> control_rename;  // member -> npu_graph_N
  std::unordered_set<int> removed;
  std::vector<tfc::NodeDef> created, kept_noops, view_copies;
  for (auto& [root, list] : members) {
    if (list.size() < 2) continue;
    std::sort(list.begin(), list.end(), [&](int x, int y) { return position[x] < position[y]; });
    std::unordered_set<std::string> names;
    for (int m : list) names.insert(g.nodes[m]->name());
    const std::string name = unused_name(g, &counter);

    tfc::NodeDef node;
    node.set_name(name);
    node.set_op(kNpuGraphOp);
    node.set_device(g.nodes[list[0]]->device());
    tfc::GraphDef sub;
    std::map<std::string, int> input_of;     // external tensor -> input K
    std::map<std::string, int> variable_of;  // update's resource handle -> variable K
    std::vector<std::string> variables;
    std::set<std::string> controls, consts;
    bool updates = false;
    auto& tin = *(*node.mutable_attr())["Tin"].mutable_list();
    bool typed = true;
    for (int m : list) {
      const tfc::NodeDef& member = *g.nodes[m];
      const std::vector<int> host_pos =
          host_input_positions(member, member_host_inputs(member.op()));
      tfc::NodeDef* copy = sub.add_node();
      *copy = member;
      copy->clear_device();
      copy->clear_input();
      const bool read = read_after_update(g, member) != nullptr;
      const int resources = is_update(member) ? static_cast<int>(update_handles(member).size())
                            : read            ? 1
                                              : 0;
      updates = updates || (resources > 0 && !read);
      for (int i = 0; i < member.input_size(); ++i) {
        const auto [src, port] = split_input(member.input(i));
        if (port < 0) {
          if (!names.count(src)) controls.insert(src);
          continue;
        }
        if (i < resources) {
          const auto [it, added] =
              variable_of.emplace(member.input(i), static_cast<int>(variables.size()));
          if (added) variables.push_back(member.input(i));
          copy->add_input(kGraphVariablePrefix + std::to_string(it->second));
          continue;
        }
        if (names.count(src) || std::find(host_pos.begin(), host_pos.end(), i) != host_pos.end()) {
          copy->add_input(member.input(i));
          if (!names.count(src)) consts.insert(src);
          continue;
        }
        const std::string t = tensor_name(src, port);
        auto it = input_of.find(t);
        if (it == input_of.end()) {
          const auto p = g.index.find(src);
          const std::vector<tfc::DataType> types =
              p == g.index.end() ? std::vector<tfc::DataType>() : output_types(*g.nodes[p->second]);
          if (port >= static_cast<int>(types.size())) {
            typed = false;
            break;
          }
          tin.add_type(types[port]);
          node.add_input(t);
          it = input_of.emplace(t, static_cast<int>(input_of.size())).first;
        }
        copy->add_input(kGraphInputPrefix + std::to_string(it->second));
      }
      if (!typed) break;
    }
    if (!typed) continue;  // an input whose type is unknown: leave this set alone
    for (const std::string& c : consts) *sub.add_node() = *g.nodes[g.index.at(c)];
    for (tfc::NodeDef& c : *sub.mutable_node())
      if (c.op() == "Const") c.clear_device();
    // View members read outside the set stay outside as well (a copy under their name), and
    // so does a view member such a copy reads; so do reads after an update (a ReadVariableOp
    // after the set's update: outside, it reads the variable after the NpuGraph node).
    std::set<std::string> kept_views;
    for (size_t v = 0; v < g.nodes.size(); ++v) {
      if (names.count(g.nodes[v]->name())) continue;
      for (const std::string& in : g.nodes[v]->input()) {
        const auto [src, port] = split_input(in);
        if (port < 0 || !names.count(src)) continue;
        const tfc::NodeDef& s = *g.nodes[g.index.at(src)];
        if (is_view(s) || read_after_update(g, s)) kept_views.insert(src);
      }
    }
    for (int m : list)
      if (preserve.count(g.nodes[m]->name()) && read_after_update(g, *g.nodes[m]))
        kept_views.insert(g.nodes[m]->name());
    for (std::vector<std::string> todo(kept_views.begin(), kept_views.end()); !todo.empty();) {
      const tfc::NodeDef& kept_view = *g.nodes[g.index.at(todo.back())];
      todo.pop_back();
      if (!is_view(kept_view)) continue;  // a read after an update: its input is the variable
      const std::string src = split_input(kept_view.input(0)).first;
      if (names.count(src) && is_view(*g.nodes[g.index.at(src)]) && kept_views.insert(src).second)
        todo.push_back(src);
    }
    // Outputs: member outputs read by a data edge from outside the set (the kept views' copies
    // included), but the kept views (their readers read the copies).
    std::vector<std::string> outputs;
    std::map<std::string, int> output_of;
    auto read_outside = [&](const tfc::NodeDef& reader) {
      for (const std::string& in : reader.input()) {
        const auto [src, port] = split_input(in);
        if (port < 0 || !names.count(src) || kept_views.count(src)) continue;
        const std::string t = src + ":" + std::to_string(port);
        if (!output_of.count(t)) {
          output_of[t] = static_cast<int>(outputs.size());
          outputs.push_back(t);
        }
      }
    };
    for (size_t v = 0; v < g.nodes.size(); ++v)
      if (!names.count(g.nodes[v]->name())) read_outside(*g.nodes[v]);
    for (const std::string& v : kept_views) read_outside(*g.nodes[g.index.at(v)]);
    auto& tout = *(*node.mutable_attr())["Tout"].mutable_list();
    for (const std::string& t : outputs) {
      const auto [src, port] = split_input(t);
      const std::vector<tfc::DataType> types = output_types(*g.nodes[g.index.at(src)]);
      if (port >= static_cast<int>(types.size())) {
        typed = false;
        break;
      }
      tout.add_type(types[port]);
    }
    // A set nothing outside reads would be dead code TensorFlow prunes (unless it updates
    // variables); leave it alone.
    if (!typed || (outputs.empty() && !updates)) continue;
    for (const std::string& v : variables) node.add_input(v);
    (*node.mutable_attr())[kVariablesAttr].set_i(static_cast<int64_t>(variables.size()));
    for (const std::string& c : controls) node.add_input("^" + c);
    if (node.input_size() == 0 && liveness.frame[list[0]] != 0)
      continue;  // it would leave the frame
    (*node.mutable_attr())[kGraphAttr].set_s(sub.SerializeAsString());
    auto& outs = *(*node.mutable_attr())[kOutputsOfAttr].mutable_list();
    for (const std::string& t : outputs) outs.add_s(t);
    for (const auto& [t, k] : output_of) {
      const auto [src, port] = split_input(t);
      rename[tensor_name(src, port)] = name + ":" + std::to_string(k);
      if (port == 0) rename[src + ":0"] = name + ":" + std::to_string(k);
    }
    for (const std::string& v : kept_views) view_copies.push_back(*g.nodes[g.index.at(v)]);
    for (int m : list) {
      removed.insert(m);
      if (kept_views.count(g.nodes[m]->name())) continue;  // its copy keeps the name
      // A preserved update stays as a NoOp after the NpuGraph node (its control consumers wait
      // for it as before).
      if (preserve.count(g.nodes[m]->name())) {
        tfc::NodeDef noop;
        noop.set_name(g.nodes[m]->name());
        noop.set_op("NoOp");
        noop.set_device(g.nodes[m]->device());
        noop.add_input("^" + name);
        kept_noops.push_back(std::move(noop));
        continue;
      }
      control_rename[g.nodes[m]->name()] = name;
    }
    created.push_back(std::move(node));
    ++counts.clusters;
    counts.nodes += static_cast<int>(list.size());
  }
  if (created.empty()) return counts;

  // Control inputs of the new nodes that name members of other clusters.
  for (tfc::NodeDef& n : created) {
    std::vector<std::string> inputs(n.input().begin(), n.input().end());
    n.clear_input();
    std::set<std::string> seen;
    for (const std::string& in : inputs) {
      std::string r = in;
      if (in[0] == '^') {
        const auto it = control_rename.find(in.substr(1));
        if (it != control_rename.end()) r = "^" + it->second;
        if (r == "^" + n.name() || !seen.insert(r).second) continue;
      } else {
        const auto it = rename.find(in);
        if (it != rename.end()) r = it->second;
      }
      n.add_input(r);
    }
  }
  tfc::GraphDef out;
  *out.mutable_versions() = work.versions();
  *out.mutable_library() = work.library();
  // The graph's nodes but the members, and the kept views' copies: inputs from members renamed.
  std::vector<const tfc::NodeDef*> kept;
  for (size_t v = 0; v < g.nodes.size(); ++v)
    if (!removed.count(static_cast<int>(v))) kept.push_back(g.nodes[v]);
  for (const tfc::NodeDef& n : view_copies) kept.push_back(&n);
  for (const tfc::NodeDef* k : kept) {
    tfc::NodeDef n = *k;
    std::vector<std::string> inputs(n.input().begin(), n.input().end());
    n.clear_input();
    std::set<std::string> seen_controls;
    std::vector<std::string> controls;
    for (const std::string& in : inputs) {
      if (in[0] == '^') {
        const auto it = control_rename.find(in.substr(1));
        const std::string r = it != control_rename.end() ? "^" + it->second : in;
        if (seen_controls.insert(r).second) controls.push_back(r);
        continue;
      }
      const auto it = rename.find(in);
      n.add_input(it != rename.end() ? it->second : in);
    }
    for (const std::string& c : controls) n.add_input(c);
    *out.add_node() = std::move(n);
  }
  for (tfc::NodeDef& n : created) *out.add_node() = std::move(n);
  for (tfc::NodeDef& n : kept_noops) *out.add_node() = std::move(n);
  graph.Swap(&out);
  return counts;
}

bool parse_npu_graph(const std::string& graph, const std::vector<std::string>& outputs_of,
                     NpuGraphSpec* out, std::string* error) {
  tfc::GraphDef sub;
  if (!sub.ParseFromString(graph)) {
    *error = "attribute 'graph' is not a GraphDef";
    return false;
  }
  NpuGraphSpec spec;
  std::map<std::string, int> node_of, const_of;
  for (const tfc::NodeDef& n : sub.node()) {
    if (n.op() != "Const") continue;
    tfc::Tensor value;
    const auto it = n.attr().find("value");
    if (it == n.attr().end() || !value.FromProto(it->second.tensor())) {
      *error = "Const '" + n.name() + "' has no readable value";
      return false;
    }
    NpuGraphSpec::HostConst c;
    c.tf_dtype = static_cast<int>(value.dtype());
    for (int64_t d : value.shape().dim_sizes()) c.shape.push_back(d);
    const auto data = value.tensor_data();
    c.bytes.assign(data.data(), data.size());
    const_of[n.name()] = static_cast<int>(spec.consts.size());
    spec.consts.push_back(std::move(c));
  }
  for (tfc::NodeDef n : sub.node()) {
    if (n.op() == "Const") continue;
    // Attributes left at their defaults are absent from graph NodeDefs; a kernel TensorFlow
    // creates sees them (as CompiledOpKernel does node by node).
    const tfc::OpDef* def = nullptr;
    if (tfc::OpRegistry::Global()->LookUpOpDef(n.op(), &def).ok())
      tfc::AddDefaultsToNodeDef(*def, &n);
    NpuGraphSpec::Node node;
    node.name = n.name();
    node.op = n.op();
    if (const auto m = n.attr().find("_npusim_members"); m != n.attr().end())
      node.members.assign(m->second.list().s().begin(), m->second.list().s().end());
    if (const auto t = n.attr().find("_npusim_report_type"); t != n.attr().end())
      node.report_type = t->second.s();
    if (const auto l = n.attr().find(kFilterLayoutAttr); l != n.attr().end())
      node.attrs["filter_layout"] = l->second.s();  // as CompiledOpKernel reads it
    for (const auto& [name, value] : n.attr()) {
      if (!name.empty() && name[0] == '_') continue;
      switch (value.value_case()) {
        case tfc::AttrValue::kType: {
          const std::string t = compiler_type_name(static_cast<int>(value.type()));
          if (!t.empty()) node.attrs[name] = t;
          break;
        }
        case tfc::AttrValue::kB: node.attrs[name] = value.b(); break;
        case tfc::AttrValue::kI: node.attrs[name] = static_cast<int64_t>(value.i()); break;
        case tfc::AttrValue::kF: node.attrs[name] = static_cast<double>(value.f()); break;
        case tfc::AttrValue::kS: node.attrs[name] = value.s(); break;
        case tfc::AttrValue::kList:
          if (value.list().s_size() > 0)
            node.attrs[name] =
                std::vector<std::string>(value.list().s().begin(), value.list().s().end());
          else if (value.list().type_size() == 0)
            node.attrs[name] =
                std::vector<int64_t>(value.list().i().begin(), value.list().i().end());
          break;
        default: break;
      }
    }
    for (const std::string& in : n.input()) {
      NpuGraphSpec::Source s;
      if (in.rfind(kGraphInputPrefix, 0) == 0) {
        s.input = std::stoi(in.substr(std::string(kGraphInputPrefix).size()));
        spec.num_inputs = std::max(spec.num_inputs, s.input + 1);
      } else if (in.rfind(kGraphVariablePrefix, 0) == 0) {
        s.variable = std::stoi(in.substr(std::string(kGraphVariablePrefix).size()));
        spec.num_variables = std::max(spec.num_variables, s.variable + 1);
      } else {
        const auto [src, port] = split_input(in);
        if (const_of.count(src)) {
          s.host_const = const_of[src];
        } else if (node_of.count(src) && port >= 0) {
          s.node = node_of[src];
          s.port = port;
        } else {
          *error = "node '" + n.name() + "' reads '" + in + "', which is no earlier node";
          return false;
        }
      }
      node.inputs.push_back(s);
    }
    node_of[n.name()] = static_cast<int>(spec.nodes.size());
    spec.nodes.push_back(std::move(node));
  }
  for (const std::string& t : outputs_of) {
    const auto [src, port] = split_input(t);
    if (!node_of.count(src) || port < 0) {
      *error = "output '" + t + "' names no node of the graph";
      return false;
    }
    NpuGraphSpec::Source s;
    s.node = node_of[src];
    s.port = port;
    spec.outputs.push_back(s);
  }
  *out = std::move(spec);
  return true;
}

}  // namespace npusim::tf
