// A canonical launch order for each NPU's nodes of a function graph (docs/multichip.md, "Launch
// order"), applied by the plugin's grappler optimizer (graph_optimizer.cpp) as its last pass.
//
// Why: TensorFlow's executor hands a device's independent ops (an int64 iteration counter, a
// metric's Add, the labels' Cast) to the plugin in whatever order its threads reach them. The
// chip runs its operations one at a time in the order the driver gets them, so that order moved
// the kernels on the chip's timeline, the host dispatch gaps, the data readiness of the
// gradients and with it the collectives' starts: a multi-chip step's timeline and report
// changed from run to run, and the order of a single chip's report rows too. Chaining a
// device's nodes with control edges in one order fixed by the graph makes the executor issue
// them in that order, whatever its threads do; every kernel is still simulated as it arrives.
//
// The order: a topological order of the whole graph (every device's nodes, data and control
// edges), restricted to each NPU's chained nodes. Among the nodes that are ready it takes first
// the ones fewer asynchronous ops (NpuCollective: a replica's collective part) lie upstream of,
// then the node's position in the GraphDef (the order in which the program built it: Keras
// builds the forward pass, the backward pass, then the updates). So a device runs everything
// that does not wait for a collective before anything that does (its backward pass before its
// updates, as the executor did when a collective took wall-clock time), and:
//   - the augmented graph stays acyclic (every added edge goes forward in one topological
//     order), so no node waits for itself;
//   - no device waits, before a collective's input, for a node that reads a collective that
//     needs a later input: a node with k collectives upstream comes after every node with
//     fewer on its device, and a collective's inputs have fewer than its readers. This holds
//     when the ranks of a collective have inputs with the same number of collectives upstream
//     (replicas of one program, as MirroredStrategy builds them).
// Chained: nodes assigned to an NPU that run work there (kernels, variable reads and updates,
// NpuGraph nodes), not function plumbing (_Arg, _Retval, NoOp, Const), function calls (their
// bodies are graphs of their own, ordered when they are optimized) or asynchronous ops, which
// must not hold the chain while the other replicas catch up. A graph with control flow
// (Switch, Merge, Enter, Exit, NextIteration: a lowered cond or loop) is left as it is: a control
// edge from a node of a dead branch would make its successor dead, and edges between frames are
// invalid.
//
// The meta-optimizer calls the optimizer more than once on a graph, with TensorFlow's passes in
// between: the chain stays, and each call adds only the edges it lacks (over the nodes the
// fusions made since). The chain must not come off: TensorFlow's dependency optimizer drops
// control edges that the chain makes redundant (the automatic control dependencies between a
// variable's reads and updates among them), so a graph without the chain lost them (an earlier
// version removed it at each call: an SGD fit read and updated variables out of order, and a
// multi-tensor update was given one variable twice). Each added edge is named in the
// attribute kOrderAfterAttr of the node it enters.
#pragma once

#include <string>

namespace tensorflow {
class GraphDef;
}

namespace npusim::tf {

// The name of the node a chained node's added control edge comes from (a string attribute;
// TensorFlow ignores attributes whose name starts with '_').
inline constexpr const char* kOrderAfterAttr = "_npusim_order_after";

// NPUSIM_LAUNCH_ORDER=1 in the environment (read at each graph optimization) turns the chain
// on; by default graphs run in the order TensorFlow's executor issues them (opt-in until the
// test suite has run with it on: docs/multichip.md, "Launch order").
bool launch_order_enabled();

// Chains each NPU's nodes of `graph` in the canonical order above with control edges; returns
// the edges added (0 for a graph with control flow or without two chained nodes on a device).
int order_npu_launches(tensorflow::GraphDef& graph);

}  // namespace npusim::tf
