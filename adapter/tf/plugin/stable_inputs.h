// The node attribute by which the plugin's graph optimizer (graph_optimizer.cpp) tells an NPU
// kernel which of its data inputs are a variable's value (ReadVariableOp) or a constant: a
// list(int) of input positions. Such an input keeps its bytes from step to step until the
// variable is assigned, so the kernel gives what it derives from it (the f16 copy of an f32
// weight) a buffer of its own at once (derived_tensor_cache.h). A leading underscore makes it an
// internal attribute that TensorFlow's op-def checks let pass. Standard-library only: included
// by files built against TensorFlow's C++ headers and by the C API ones.
#pragma once

namespace npusim::tf {

inline constexpr const char* kStableInputsAttr = "_npusim_stable_inputs";

}  // namespace npusim::tf
