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
// Data movement, gathers, generators, selection, scans, batched products (docs/compiler.md
// "Data movement ops"):
CompiledKernel compile_layout(const CompileContext& ctx);        // ops/layout.cpp
CompiledKernel compile_fill(const CompileContext& ctx);          // ops/fill.cpp
CompiledKernel compile_select(const CompileContext& ctx);        // ops/select.cpp
CompiledKernel compile_scan(const CompileContext& ctx);          // ops/scan.cpp
CompiledKernel compile_gather(const CompileContext& ctx);        // ops/gather.cpp
CompiledKernel compile_batch_matmul(const CompileContext& ctx);  // ops/batch_matmul.cpp
// Reductions, softmax, activations (docs/compiler.md):
CompiledKernel compile_reduce(const CompileContext& ctx);      // ops/reduce.cpp
CompiledKernel compile_softmax(const CompileContext& ctx);     // ops/softmax.cpp
CompiledKernel compile_activation(const CompileContext& ctx);  // ops/activation.cpp
CompiledKernel compile_bias(const CompileContext& ctx);        // ops/bias.cpp
// Convolutions, pooling, batch normalisation (docs/compiler.md "Convolutions"):
CompiledKernel compile_conv2d(const CompileContext& ctx);     // ops/conv2d.cpp
CompiledKernel compile_pool(const CompileContext& ctx);       // ops/pool.cpp
CompiledKernel compile_batchnorm(const CompileContext& ctx);  // ops/batchnorm.cpp
// Fused optimizer updates (docs/compiler.md "Optimizer updates"):
CompiledKernel compile_optimizer(const CompileContext& ctx);  // ops/optimizer.cpp
// Inference fusions of the TF plugin's graph pass (BatchNormInference, AddRelu):
CompiledKernel compile_fused(const CompileContext& ctx);  // ops/fused.cpp

}  // namespace npusim::compiler::ops
