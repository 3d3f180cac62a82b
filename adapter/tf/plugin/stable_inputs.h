// The node attribute by which the plugin's graph optimizer (graph_optimizer.cpp) tells an NPU
// kernel which of its data inputs are a variable's value (ReadVariableOp) or a constant: a
// list(int) of input positions. Such an input keeps its bytes from step to step until the
// variable is assigned, so the kernel gives what it derives from it (the f16 copy of an f32
// weight) a buffer of its own at once (derived_tensor_cache.h). A leading underscore makes it an
// internal attribute that TensorFlow's op-def checks let pass. Standard-library only: included
// by files built against TensorFlow's C++ headers and by the C API ones.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace npusim::tf {

inline constexpr const char* kStableInputsAttr = "_npusim_stable_inputs";

// What the graph optimizer told a kernel about its data inputs.
//   marked: the optimizer saw the node. It gives every NPU node of a graph the attribute (an
//     empty list where no input is stable), so an input not listed is, as far as the graph
//     knows, rewritten between runs (an activation, a graph argument): what is derived from it
//     is computed at every run and never kept. The launches of a graph's step then follow from
//     the graph alone, not from which addresses TensorFlow's allocation order gave its tensors
//     or how its executor threads interleaved (docs/tf_plugin.md, "Weights kept in fp16").
//   not marked (eager ops, graphs the optimizer did not see): the derived-tensor cache watches
//     every source and keeps what it finds unchanged from run to run.
//   positions: the stable inputs' positions.
struct StableInputs {
  bool marked = false;
  std::vector<int64_t> positions;

  bool stable(int64_t input) const {
    return std::find(positions.begin(), positions.end(), input) != positions.end();
  }
};

}  // namespace npusim::tf
