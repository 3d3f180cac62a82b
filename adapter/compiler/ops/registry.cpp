// THE op table: every TF op the compiler accepts, with the family that compiles it. Adding an
// op = adding a row here (and its code in the family's file); see docs/compiler.md.
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

const std::vector<OpEntry>& op_table() {
  static const std::vector<OpEntry> table = {
      // element-wise binary with broadcasting (ops/binary.cpp)
      {"AddV2", "binary", compile_binary},
      {"Add", "binary", compile_binary},
      {"Sub", "binary", compile_binary},
      {"Mul", "binary", compile_binary},
      {"RealDiv", "binary", compile_binary},
      {"Maximum", "binary", compile_binary},
      {"Minimum", "binary", compile_binary},
      {"SquaredDifference", "binary", compile_binary},
      {"Equal", "binary", compile_binary},
      {"NotEqual", "binary", compile_binary},
      {"Less", "binary", compile_binary},
      {"LessEqual", "binary", compile_binary},
      {"Greater", "binary", compile_binary},
      {"GreaterEqual", "binary", compile_binary},
      // element-wise unary (ops/unary.cpp)
      {"Neg", "unary", compile_unary},
      {"Abs", "unary", compile_unary},
      {"Exp", "unary", compile_unary},
      {"Log", "unary", compile_unary},
      {"Sqrt", "unary", compile_unary},
      {"Rsqrt", "unary", compile_unary},
      {"Square", "unary", compile_unary},
      {"Reciprocal", "unary", compile_unary},
      {"Relu", "unary", compile_unary},
      // dtype conversion (ops/cast.cpp)
      {"Cast", "cast", compile_cast},
      // cube (ops/matmul.cpp)
      {"MatMul", "matmul", compile_matmul},
  };
  return table;
}

}  // namespace npusim::compiler::ops
