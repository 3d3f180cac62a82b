// Whole-graph execution of NPU graphs: the plugin's grappler optimizer (graph_optimizer.cpp,
// after the fusions of graph_fusion.h) replaces each maximal connected set of NPU nodes that run
// as compiled ops (graph_cluster.cpp) by one NpuGraph node; its kernel (npu_graph_kernel.cpp)
// runs the set as one task list per step, as CANN's graph engine runs a graph's device partition
// (its GEOP): every node compiled once per input-shape signature, the intermediates placed by a
// static memory plan with reuse by liveness (adapter/graph/memory_plan.h) in one device arena,
// every launch queued on the stream, the host dispatch paid once per run (the chip's
// host.graph_dispatch_us) and one stream synchronisation at the end.
//
//   NpuGraph(inputs: Tin, variables: V * resource) -> outputs: Tout     (stateful)
//     Tin: list(type) >= 0; Tout: list(type) >= 0; V: int >= 0 (default 0);
//     graph: string, the set as a serialized GraphDef (kGraphAttr below);
//     outputs_of: list(string), "node:port" of each output, in order.
//
// Variable updates: the set may hold FusedVariableUpdate nodes (graph_fusion.h, rewrite 5) of
// distinct variables; their resource handles are the NpuGraph node's `variables` (host memory).
// A run locks every variable (npusim::tf::GraphVariables, dense_update.h: address order),
// computes each update into a new buffer as a step of the one task list (in the set's order,
// like any node), and after the stream synchronisation makes the new buffers the variables'
// tensors; a failed run leaves every variable as it was. A preserved update (a function's
// control output) stays as a NoOp of its name after the NpuGraph node. NPUSIM_GRAPH_UPDATES=0
// keeps updates out of sets (each runs on its own, as before).
//
// KV-cache updates: the set may hold ResourceDynamicUpdateSlice nodes (npusim.llm.
// update_variable_slice) and the ReadVariableOps of their variables ordered after them; their
// handles are variables too. An update runs as the compiler's XlaDynamicUpdateSlice with
// in_place, writing only the update's rows into the variable's own buffer (the run first makes
// the buffer the variable's alone: GraphVariables::own_buffer), and a read is that buffer, no
// launch; an update the compiler cannot write in place writes a new buffer, as above. So a
// decode step holding its cache in variables (models/llm.py, ResidentCacheDecoder) is one run
// that moves only the new rows of the cache.
//
// Reads after an update: a ReadVariableOp tf.function ordered after an update of its variable
// (a FusedVariableUpdate's or a cache update's, graph_cluster.cpp) joins the update's set and
// reads the update step's new value there, no launch: a metric's `total / count` after the
// metric's update, Lamb's trust ratio after the moments' updates, in the same task list.
//
// The subgraph GraphDef holds the set's nodes in a topological order (device cleared, control
// inputs dropped: the order is the task list's), their data inputs rewritten: an input from
// outside the set is "_npu_graph_input:K" (the NpuGraph node's input K), an update's resource
// handle "_npu_graph_variable:K" (its variable K); an input the compiler
// takes as an attribute (the op table's host inputs: reduction axes, ...) reads a copy of the
// Const node producing it, which the subgraph holds too. Launch records keep each node's name
// and op type, so reports look as they do node by node.
//
// NPUSIM_GRAPH=0 in the environment (read at each graph optimization, so
// npusim.configure(graph_mode=False) before a tf.function is traced works) leaves graphs node by
// node. Standard-library and compiler-header only: included by graph_cluster.cpp (built against
// TensorFlow's C++ headers) and by the C API kernel.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "adapter/compiler/op_desc.h"

namespace tensorflow {
class GraphDef;
}

namespace npusim::tf {

inline constexpr const char* kNpuGraphOp = "NpuGraph";
inline constexpr const char* kGraphAttr = "graph";
inline constexpr const char* kOutputsOfAttr = "outputs_of";
inline constexpr const char* kGraphInputPrefix = "_npu_graph_input:";
inline constexpr const char* kGraphVariablePrefix = "_npu_graph_variable:";
inline constexpr const char* kVariablesAttr = "V";
inline constexpr const char* kVariableUpdateOp = "FusedVariableUpdate";
inline constexpr const char* kCacheUpdateOp = "ResourceDynamicUpdateSlice";

// The NpuGraph kernel's view of its subgraph (parse_npu_graph).
struct NpuGraphSpec {
  // Where a node's input comes from: exactly one of node (a node before it, its output `port`),
  // input (the NpuGraph node's input), variable (its variable: an update's resource input) or
  // host_const (consts[host_const]) is >= 0.
  struct Source {
    int node = -1, port = 0;
    int input = -1;
    int variable = -1;
    int host_const = -1;
  };
  // A Const read on the host (an attribute input): its TensorFlow dtype (TF_DataType value),
  // shape and bytes (host order).
  struct HostConst {
    int tf_dtype = 0;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  struct Node {
    std::string name, op;
    // Every attribute of the NodeDef that maps to a compiler attribute (type attributes as
    // compiler type names); the kernel keeps those its op's kernel class reads.
    std::map<std::string, compiler::AttrValue> attrs;
    std::vector<Source> inputs;
    // A multi-tensor update's `_npusim_members` (the original nodes' names, for its launches'
    // labels: launch_label); empty for other nodes.
    std::vector<std::string> members;
    // The node's `_npusim_report_type` (the op type its launches are reported under:
    // launch_label); empty: its op.
    std::string report_type;
  };
  std::vector<Node> nodes;  // in task order
  std::vector<HostConst> consts;
  std::vector<Source> outputs;  // each a node's output
  int num_inputs = 0;
  int num_variables = 0;
};

// Reads the NpuGraph node's `graph` and `outputs_of` attributes (graph_cluster.cpp); false with
// `error` set if they are malformed.
bool parse_npu_graph(const std::string& graph, const std::vector<std::string>& outputs_of,
                     NpuGraphSpec* out, std::string* error);

struct ClusterCounts {
  int clusters = 0;  // NpuGraph nodes created
  int nodes = 0;     // nodes they replaced
};

// Replaces each maximal connected set of >= 2 clusterable NPU nodes (graph_cluster.cpp states
// the rules) by an NpuGraph node. `preserve`: nodes TensorFlow must keep (never absorbed).
ClusterCounts cluster_npu_graph(tensorflow::GraphDef& graph,
                                const std::unordered_set<std::string>& preserve);

// Whether NPUSIM_GRAPH asks for whole-graph execution (anything but "0"; read at each call)
// and the NpuGraph op is registered.
bool graph_mode_enabled();
// Whether sets may hold variable updates: graph mode, and NPUSIM_GRAPH_UPDATES is not "0".
bool graph_updates_enabled();
// How a graph with v1 control flow (a lowered cond or loop) is clustered, by
// NPUSIM_GRAPH_CONTROL_FLOW (read at each call): unset (or anything else) `all`, sets of nodes
// of one liveness class (graph_liveness.h: inside a loop's body, a cond's branch, and around
// them); "top" only nodes no control-flow op reaches (always live, in the top frame); "0" none:
// such a graph is left node by node.
enum class ControlFlowClustering { off, top, all };
ControlFlowClustering graph_control_flow_clustering();
// Whether a plan places contiguous slices in their inputs and concatenations' pieces in their
// outputs instead of running them (NPUSIM_GRAPH_IN_PLACE is not "0"; read when a plan is built).
bool in_place_enabled();
// Whether a plan runs its steps as streams (NPUSIM_GRAPH_CONCURRENT is "1"; read when a plan is
// built): the run's launches submitted as one rt::Device::launch_group, each beginning when the
// launches it depends on (data, and the memory plan's reuse of bytes) have ended and it has
// taken its cores (when ready: rt::Device::launch_group); the memory plan's lifetimes counted
// in the schedule's positions (docs/graph_engine.md, "Concurrent steps of a TF graph"). Off:
// one by one in task order, every figure as before.
bool graph_concurrent_enabled();

// The shape ops a set holds as placements, not launches (CANN's graph engine likewise emits no
// task for them): Reshape (its shape a host input from a Const), ExpandDims (its axis likewise),
// Squeeze, and Bitcast between types of one size (the clustering checks the sizes). A view's
// output is its input's bytes under another shape or type: the plan gives it its input's place.
// Node by node TensorFlow runs them on the host (no launch) but each one ends an NpuGraph set,
// which cut keras' Dense over 3-D inputs (Tensordot: Reshape, MatMul, Reshape) out of the sets
// around it. `host_inputs` receives the positions read on the host (Const values).
inline bool npu_graph_view_op(const std::string& op, std::vector<int>* host_inputs) {
  if (op == "Reshape" || op == "ExpandDims") {
    *host_inputs = {1};
    return true;
  }
  if (op == "Squeeze" || op == "Bitcast") {
    host_inputs->clear();
    return true;
  }
  return false;
}

// ---- Implemented by the C API side (npu_graph_kernel.cpp), for graph_cluster.cpp:
// Whether `op` runs on the NPU as a CompiledOpKernel of the compiler's op table, a stateless
// random op or DropOutGenMask (the ops a cluster may hold); `host_inputs` receives the
// positions of its inputs read on the host as attributes (< 0 counts from the end).
bool npu_graph_clusterable_op(const std::string& op, std::vector<int>* host_inputs);
// The compiler's name of a TensorFlow dtype (a TF_DataType / DataType value); empty if the chip
// has none.
std::string compiler_type_name(int tf_dtype);
// Whether the NpuGraph op and its kernel were registered (register_npu_graph_kernel).
bool npu_graph_registered();

// The static memory plans the NpuGraph kernels built in this process (one per graph and input
// signature): how many, and the largest arena (the plan's peak) and the largest sum of the same
// buffers without reuse, bytes. The arenas: device blocks allocated for them in this process
// (one per kernel instance and signature, more only while runs of one graph overlap), and those
// held now (kept across runs until the kernel is destroyed or its input shapes change) with
// their bytes.
struct NpuGraphStats {
  uint64_t plans = 0, max_arena_bytes = 0, max_unplanned_bytes = 0;
  uint64_t arena_allocations = 0, arenas_held = 0, arena_bytes_held = 0;
};
NpuGraphStats npu_graph_stats();

}  // namespace npusim::tf
