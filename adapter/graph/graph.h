// The graph engine's intermediate representation: a whole inference graph of TensorFlow-named ops
// with static shapes and dtypes, constants holding their bytes. No TensorFlow here: the
// frontend (tools/npusim_compile_frontend.py) writes a graph as JSON plus one .npy per constant
// (docs/graph_engine.md, "Graph format"), and load_graph_json() reads it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "adapter/compiler/op_desc.h"

namespace npusim::graph {

// TensorFlow's v1 control-flow ops: a lowered tf.cond (Switch, Merge), tf.case / switch_case
// (_SwitchN on the branch index) or tf.while_loop (Enter, Exit, NextIteration, LoopCond), which
// route tensors between frames and branches. An offline
// model (one static task list) has none: load_graph_json refuses them, naming every such node.
bool is_tf_control_flow_op(const std::string& op);

// One output of one node: the value an edge carries.
struct TensorRef {
  int node = -1;
  int port = 0;
  bool operator==(const TensorRef& o) const { return node == o.node && port == o.port; }
  bool operator<(const TensorRef& o) const {
    return node != o.node ? node < o.node : port < o.port;
  }
};

struct Node {
  std::string name;  // the TF node name (kept in reports)
  std::string op;    // TF op type, or a fused op of the compiler (Conv2DBatchNormInference, ...)
  std::vector<TensorRef> inputs;  // data inputs (control inputs are dropped)
  std::map<std::string, compiler::AttrValue> attrs;
  std::vector<compiler::TensorDesc> outputs;  // static shapes and dtypes
  std::vector<uint8_t> value;                 // Const: the tensor's bytes, row-major
  std::vector<std::string> fused;             // names of the nodes a pass folded into this one
  bool dead = false;                          // removed by a pass
};

struct GraphIo {
  std::string name;  // the signature's name for it
  TensorRef tensor;
};

struct Graph {
  // In a topological order (every input before its consumer), except the Const nodes a pass
  // appends at the end.
  std::vector<Node> nodes;
  std::vector<GraphIo> inputs, outputs;  // inputs: Placeholder nodes

  const compiler::TensorDesc& desc(const TensorRef& t) const {
    return nodes.at(t.node).outputs.at(t.port);
  }
  bool is_const(const TensorRef& t) const { return nodes.at(t.node).op == "Const"; }
  // Per tensor, the nodes (alive) reading it, one entry per reading input.
  std::map<TensorRef, std::vector<int>> consumers() const;
  // Whether t is a graph output.
  bool is_output(const TensorRef& t) const;
};

// The numpy descr of a tensor of type t ("b1" for bool, "u2" for bf16 bits).
std::string npy_descr(compiler::DataType t);

// Reads graph.json and the constants it names (paths relative to its folder). Throws
// npusim::Error naming the file, the node and the key for anything malformed: an unknown dtype,
// an input naming no earlier node, a constant whose .npy disagrees with its declared type.
Graph load_graph_json(const std::string& path);

}  // namespace npusim::graph
