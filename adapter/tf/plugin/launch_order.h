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
// must not hold the chain while the other replicas catch up.
//
// Control flow (Switch, Merge, Enter, Exit, NextIteration: a lowered cond or loop; its nodes one
// by one or as NpuGraph nodes, graph_liveness.h): a control edge from a node of a dead branch
// would make its successor dead, and edges between frames are invalid, so the chain is not one
// sequence there. The order is a topological order of the graph without the edges out of
// NextIteration, with each loop's Enters before its Exits (an Exit fires only once its frame's
// first iteration, all Enters, is done: an edge from after an Exit into an Enter of its own loop
// would never be satisfied), and a loop's first Enter taken only when nothing else is ready (then
// the loop runs to its Exits before another loop starts): a loop's nodes, which no chain edge
// orders against the parent frame's, are not interleaved with them (the Keras LSTM step's
// gradient Fills raced the forward loop's first copy onto the device). Each NPU has a chain per
// frame: each chained node waits for the
// latest earlier node of its device's chain in the frame it runs in (a chained node, the input
// gate, or the Exit of a loop holding chained nodes of the device), and each Enter of a loop for
// the latest such node of each device with chained nodes in the loop (in the frame of its
// input). The edge comes straight from that node when its liveness atoms are a subset of the
// waiting node's (it runs in every execution the node runs in, in the same iteration); else
// (a node of one branch of a cond and one of the other branch, or after the cond, or of another
// cond) through a join: a ControlTrigger on the device reading it, which TensorFlow's executor
// runs once its input ran or was found dead and never marks dead, so the waiting node neither
// dies of it nor passes it. So a frame's chained nodes run one after another per iteration,
// whichever branches run: a cond's branches after the nodes before the cond, the nodes after
// it after the branch that ran, a loop after the nodes before it and the nodes after it after
// its Exits. Every loop holding a chained node (directly or in a nested loop) gets
// parallel_iterations = 1 on its Enters: TensorFlow's executor otherwise starts the next
// iteration's nodes (tf.while_loop's default: 10 in flight) while this one's still run, and the
// chain has no edge between iterations. Several NPUs each get their chains; a device's chain
// waits for no other device's node but through the Exit of a loop it has nodes in.
//
// Input gate: a function argument that lies on another device (the host's int32 labels of a
// Keras step) reaches an NPU through a receive that TensorFlow's partitioning adds after this
// pass, and the receive copies it onto the device when an executor thread gets to it: on one
// chip the copy sits on the compute timeline between whichever of the device's kernels the
// driver had been given, and moved those after it by its time from run to run. An int32 Const
// on the NPU is a HostConst (its output in host memory), so a reader that takes it in device
// memory (an NpuGraph's int32 operand: a gather axis, a slice index) gets it through such a
// receive too, every step, and the Const has no inputs to hold it back. So each NPU's chain
// starts with an IdentityN on that device reading every such argument and HostConst output its
// chained nodes read in device memory (it shares their receives and launches nothing): the
// device's first chained node waits for it, and with it every copy into the device comes
// before the step's kernels. Arguments and Consts without inputs have no predecessors, so the
// gate's edge goes forward in the order too.
//
// Copy gates: a chained node whose output lies in host memory (an NPU kernel of int32 index
// arithmetic, e.g. the embedding's Less / AddV2 of its ids) read by a chained node in device
// memory gets its output copied onto the device by a copy TensorFlow adds after this pass, which
// runs when an executor thread gets to it: the Keras LSTM step's 320-byte copy landed before or
// after its first kernel from run to run. Such a node is followed in the chain by an IdentityN
// on its device reading those outputs (it shares the readers' copies and launches nothing), so
// the next chained node waits for the copies.
//
// Read-back gates: a chained node whose output lies in device memory read in host memory by a
// node on its device (the Keras LSTM's backward loop pops int32 list elements, a TensorList's
// index, length and element shape, which TensorListReserve and TensorListSetItem read in host
// memory) gets it copied to the host by a send and a host receive that TensorFlow's memory-type
// pass adds after this one, and the copy went onto the chip's stream when an executor thread got
// to the receive: between whichever kernels the driver had been given, moving those after it by
// its time (a 4-byte copy: 5 us on the 910B) from run to run. Such a node is followed in the chain
// by an IdentityN on its device reading those outputs in host memory (`_input_hostmem`; it
// shares the readers' receive, one per output, and launches nothing), so the next chained node
// waits for the copies to the host. Gates of all kinds come off with the chain.
//
// The meta-optimizer calls the optimizer more than once on a graph, with TensorFlow's passes in
// between, and nothing tells a call that it is the last. Each call therefore takes the chain of
// the call before off first (unchain_npu_launches), runs the fusions and the whole-graph
// clustering on the graph without it, and chains the result again: a chain left on would keep
// nodes out of the sets the clustering forms (a path from one member to another through a
// chained node outside the set: the single-chip CNN of models/ launched more and ran 17 %
// longer). Taking the chain off must not lose an ordering: TensorFlow's dependency optimizer
// drops control edges that the chain makes redundant (the automatic control dependencies
// between a variable's reads and updates among them; a version that only removed the chain had
// an SGD fit read and update variables out of order). So each chained node records the control
// inputs it had before its chain edge (kOwnControlInputsAttr), and unchaining gives them back.
// A recorded input that was a NoOp records the nodes it waited for too, and where TensorFlow's
// dependency optimizer bypassed it (handing its inputs on, then dropping those the chain made
// redundant) unchaining gives those nodes back instead. Where a recorded input's node is gone
// otherwise, the chain stays and the call adds only the edges it lacks, as the graph then has no
// record of what the chain replaced. Each chain edge is named in the
// attribute kOrderAfterAttr of the node it enters; gates and joins come off with the chain.
#pragma once

#include <string>

namespace tensorflow {
class GraphDef;
}

namespace npusim::tf {

// The name of the node a chained node's added control edge comes from (a string attribute;
// TensorFlow ignores attributes whose name starts with '_').
inline constexpr const char* kOrderAfterAttr = "_npusim_order_after";
// Marks the input gate of an NPU device (a boolean; below).
inline constexpr const char* kInputGateAttr = "_npusim_order_input_gate";
// Marks a copy gate (a boolean; below).
inline constexpr const char* kCopyGateAttr = "_npusim_order_copy_gate";
// Marks a read-back gate (a boolean; below).
inline constexpr const char* kReadBackGateAttr = "_npusim_order_read_back_gate";
// Marks a join: a ControlTrigger through which a node of a graph with control flow waits for a
// node that may not run (a boolean; "Control flow" above).
inline constexpr const char* kJoinAttr = "_npusim_order_join";
// The names of a chained node's control inputs other than its chain edge, when it was chained (a
// list of strings).
inline constexpr const char* kOwnControlInputsAttr = "_npusim_order_own_control";
// For each of those that is a NoOp, the nodes it waits for (through NoOps), as "noop>node" (a
// list of strings): TensorFlow's dependency optimizer may bypass the NoOp meanwhile.
inline constexpr const char* kOwnControlViaAttr = "_npusim_order_own_control_via";

// On unless NPUSIM_LAUNCH_ORDER=0 in the environment (read at each graph optimization): then
// graphs run in the order TensorFlow's executor issues them.
bool launch_order_enabled();

// Chains each NPU's nodes of `graph` in the canonical order above with control edges; returns
// the edges added plus the loops' Enters set to one parallel iteration (0 for a graph without
// two chained nodes on a device).
int order_npu_launches(tensorflow::GraphDef& graph);

// Takes the chain an earlier call added off `graph`, giving each chained node back its own
// control inputs (above); returns the nodes unchained and gates removed, -1 where it keeps the
// chain.
int unchain_npu_launches(tensorflow::GraphDef& graph);

}  // namespace npusim::tf
