// TensorFlow's names in a GraphDef (a node's inputs, its device, its op), shared by the plugin's
// graph passes.
#pragma once

#include <set>
#include <string>
#include <utility>

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

// TensorFlow's v1 control-flow ops (frames and loops; _SwitchN: a lowered Case's switch on the
// branch index), which the graph passes leave alone.
inline bool is_control_flow_op(const std::string& op) {
  static const std::set<std::string> kOps = {
      "Switch",        "RefSwitch", "_SwitchN", "Merge",         "RefMerge",         "Enter",
      "RefEnter",      "Exit",      "RefExit",  "NextIteration", "RefNextIteration", "LoopCond",
      "ControlTrigger"};
  return kOps.count(op) > 0;
}

}  // namespace npusim::tf
