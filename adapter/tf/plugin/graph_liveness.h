// Which nodes of a graph with lowered control flow are live together, so that a set of them can
// run as one NpuGraph node (graph_cluster.cpp).
//
// TensorFlow lowers tf.cond and tf.while_loop to v1 control flow: Switch routes a tensor to one
// of two outputs by a boolean predicate, the other output is "dead"; a node with a dead input
// (data or control) does not run and its outputs are dead; Merge forwards whichever input is
// live; Enter / Exit move tensors into and out of a loop's frame, whose nodes run once per
// iteration; NextIteration carries a value to the next iteration. An NpuGraph node is one node
// for the executor: it runs when all its inputs are live, and then computes every member. So a
// set may only hold nodes that are live in exactly the same executions: same frame, same
// liveness.
//
// The analysis gives each node a liveness class: its frame and a liveness formula, a conjunction
// of atoms that must all hold for the node to run:
//  - a node without inputs is in the top frame, always live (no atoms);
//  - an ordinary node: its inputs' frame, the union of its inputs' atoms (data and control);
//  - Switch(data, pred): output 1 adds the atom "pred is true", output 0 "pred is false" (the
//    predicate named by its tensor and frame); its control output has the Switch's own atoms;
//  - _SwitchN(data, index) (a lowered Case, tf.switch_case): output k adds the atom "index
//    selects k" of the n outputs. It is a control-flow op like Switch: without that atom a
//    branch's nodes took the class of the nodes before the case, and a branch's lone op of
//    variable reads joined their set (run whatever the index, its output empty);
//  - Merge of a cond or Case (no NextIteration input): its inputs' formula when they agree; S
//    when the inputs are S and one literal each of one predicate, every value of it once (S and
//    "p", S and "not p"; or S and "index selects k" for k = 0 .. n-1); otherwise an atom of its
//    own;
//  - Merge of a loop (inputs: an Enter and a NextIteration): the Enter's formula, taken as
//    true in every iteration of the frame. TensorFlow's lowering gates every node of a loop's
//    body on the loop's predicate (the body's pivot), so all NextIterations of an iteration are
//    live or all dead, and the executor starts no iteration from a dead NextIteration: every
//    loop Merge of an iteration that runs is live. Any other Merge with a NextIteration input,
//    or a Merge with control inputs, gets an atom of its own;
//  - Enter: the inner frame, its input's atoms (fixed while the frame runs);
//  - Exit of Switch:0 of a loop (its predicate a LoopCond): the parent frame, the Switch's
//    atoms without the branch (an exit is live iff the loop's Merge was live when it ended),
//    provided those atoms all belong to the parent frame or outer ones; any other Exit gets an
//    atom of its own;
//  - LoopCond: its input's atoms; ControlTrigger: an atom of its own.
// Two nodes with the same class run in exactly the same executions: the same frame's iteration,
// the same atoms' values. Edges out of NextIteration go to the next iteration and are left out
// (the graph without them must be acyclic, or every node is unclassified).
#pragma once

#include <string>
#include <vector>

namespace tensorflow {
class GraphDef;
}

namespace npusim::tf {

struct LivenessClasses {
  // For each node of the GraphDef (in its order): its class, "" when it has none (a control-flow
  // op itself, inputs from different frames, an input naming no node, or a graph that stays
  // cyclic without its NextIteration edges). Equal non-empty strings: the same class.
  std::vector<std::string> of;
  // For each node: its frame, 0 the top frame (the function's own); control-flow ops included
  // (an Exit is in the frame it leads to); -1 where the analysis failed.
  std::vector<int> frame;
  // For each node: its liveness formula's atoms, sorted (control-flow ops included: a Switch's
  // and a Merge's own, an Exit's in the frame it leads to; an Enter's, fixed while its frame
  // runs); empty where the analysis failed. A node whose atoms are a subset of another's in the
  // same frame runs in every execution the other runs in (launch_order.cpp orders by this).
  std::vector<std::vector<std::string>> atoms;
};

LivenessClasses liveness_classes(const tensorflow::GraphDef& graph);

}  // namespace npusim::tf
