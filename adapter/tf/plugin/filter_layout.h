// The node attribute by which graph rewrite 19 (graph_fusion.h, the weights' casts in one
// MultiTensorCast) tells a forward convolution that its filter input is written in blocks of
// 16 output channels: a string, the compiler's attribute filter_layout (adapter/compiler/ops/
// conv.h kFilterLayoutN16). A leading underscore makes it an internal attribute that
// TensorFlow's op-def checks let pass (Conv2D is TensorFlow's op). The node-by-node kernels
// (compiled_op_kernel.cpp) and the graph cluster (graph_cluster.cpp) hand it to the compiler
// as filter_layout. Standard-library only, as stable_inputs.h.
#pragma once

namespace npusim::tf {

inline constexpr const char* kFilterLayoutAttr = "_npusim_filter_layout";

}  // namespace npusim::tf
