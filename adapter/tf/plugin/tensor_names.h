// TensorFlow's names of a node's inputs in a GraphDef, shared by the plugin's graph passes.
#pragma once

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

}  // namespace npusim::tf
