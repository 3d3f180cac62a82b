// TensorFlow's names in a GraphDef (a node's inputs, its device, its op), shared by the plugin's
// graph passes.
#pragma once

#include <set>
#include <string>
#include <utility>

#include "adapter/graph/graph.h"

namespace npusim::tf {

// "name:3" -> ("name", 3); "name" -> ("name", 0); "^name" (a control input) -> ("name", -1).
inline std::pair<std::string, int> split_input(const std::string& in) {
  if (!in.empty() && in[0] == '^') return {in.substr(1), -1};
  const size_t colon = in.rfind(':');
  if (colon == std::string::npos) return {in, 0};
  return {in.substr(0, colon), std::stoi(in.substr(colon + 1))};
}

// A node's requested or assigned device names one of the plugin's NPUs.
inline bool on_npu_device(const std::string& device) {
  return device.find("/device:NPU:") != std::string::npos;
}

// TensorFlow's v1 control-flow ops (frames, loops and branches), which the graph passes route
// around.
inline bool is_control_flow_op(const std::string& op) { return graph::is_tf_control_flow_op(op); }

}  // namespace npusim::tf
