// The op table's interface: each op family (one .cpp file under ops/) exposes one compile
// function; registry.cpp lists which TF ops each family compiles. That table is the ONLY place
// an op is registered (no static initialisers).
#pragma once

#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"

namespace npusim::compiler::ops {

struct CompileContext {
  const OpDesc& op;
  const ChipConfig& cfg;
  PrecisionMode precision;
};

// Fills outputs, launches and workspace_bytes (compile() fills key and precision and checks
// the caller's expected outputs).
using CompileFn = CompiledKernel (*)(const CompileContext&);

struct OpEntry {
  const char* tf_op;   // TF op name
  const char* family;  // the ops/<family>.cpp file that compiles it
  CompileFn compile;
};

// The table (ops/registry.cpp).
const std::vector<OpEntry>& op_table();

// Family entry points.
CompiledKernel compile_binary(const CompileContext& ctx);  // ops/binary.cpp
CompiledKernel compile_unary(const CompileContext& ctx);   // ops/unary.cpp
CompiledKernel compile_cast(const CompileContext& ctx);    // ops/cast.cpp
CompiledKernel compile_matmul(const CompileContext& ctx);  // ops/matmul.cpp

}  // namespace npusim::compiler::ops
