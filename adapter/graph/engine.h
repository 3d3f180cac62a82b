// The graph engine: a whole inference graph (graph.h) -> an offline model (model.h). It runs the
// fusion passes (passes.h), compiles every remaining node with the kernel compiler
// (adapter/compiler, docs/compiler.md "Contract with the runtime"), plans the activation memory
// statically by liveness (memory_plan.h) and binds every launch's arguments to region offsets.
// Nodes without kernels: Const (the constant region), Placeholder (graph inputs), NoOp, and the
// views Identity, Snapshot, StopGradient, Reshape, Squeeze, ExpandDims (same bytes as their
// input). docs/graph_engine.md.
#pragma once

#include <string>

#include "adapter/compiler/compiler.h"
#include "adapter/graph/graph.h"
#include "adapter/graph/model.h"
#include "sim/config/chip_config.h"

namespace npusim::graph {

struct EngineOptions {
  compiler::PrecisionMode precision = compiler::PrecisionMode::kAllowFp32ToFp16;
  bool fusion = true;  // false: every node compiled on its own (to compare)
};

// Raised when nodes cannot be mapped to the chip: the message lists every such node with its op
// and the compiler's reason (no silent fallback in an offline model).
struct UnmappableOpsError : Error {
  using Error::Error;
};

// Compiles `g` (consumed: the passes rewrite it) for `cfg`. OmModel::info holds the compile
// report's data: "fusions", "nodes" (the fused graph with launches per node), "memory".
OmModel compile_graph(Graph g, const ChipConfig& cfg, const EngineOptions& opts = {});

}  // namespace npusim::graph
