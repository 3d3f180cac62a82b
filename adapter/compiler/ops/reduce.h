// The reduction engine (ops/reduce.cpp), shared by the reduction ops (Sum, Mean, Max, Min, Prod,
// ArgMax, ArgMin) and by ops that end in a reduction (BiasAddGrad, L2Loss).
#pragma once

#include <cstdint>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

enum class ReduceKind { kSum, kMean, kMax, kMin, kProd, kArgMax, kArgMin };

struct ReduceRequest {
  ReduceKind kind = ReduceKind::kSum;
  TensorDesc input;              // f32, f16, bf16 or s32 (kMean: floats only)
  std::vector<bool> reduced;     // per input dim: reduce it (kArgMax / kArgMin: exactly one)
  // The result's type: Arg: S32 or S64; float inputs: any float type (computed in f32, rounded
  // to it at the end: the filter gradient's f32 partial products summed straight to f16);
  // s32: s32.
  DataType out_type = DataType::F32;
  bool square = false;           // reduce x * x instead of x (L2Loss)
  double scale = 1.0;            // multiply the result (L2Loss: 0.5); floats only
};

// Appends to `plan` the launches reducing the tensor at `in` (req.input) into `out`, a tensor of
// the reduced shape without the reduced dims (keep_dims does not change the bytes).
// Throws CompileError (via op.fail) for unsupported requests. No launch when the output is
// empty; an identity fill when a reduced dim is 0.
void append_reduce(LaunchPlan& plan, const CompileContext& ctx, const ReduceRequest& req,
                   ArgRef in, ArgRef out);

// Whether full sums of squares of f32 tensors of `elements` elements each may share a launch
// of SquareSumV1 with attribute N > 1 (compile_reduce) with the bits of each one's own launch:
// a whole number of 32-byte blocks (each tensor a row starting on a block of the launch's
// [N, elements] rows) and too few elements for the reduction to be split into parts over the
// cores (the parts' count follows the number of outputs, and with it the order of additions).
bool square_sums_share_rows(int64_t elements);

// Axes given as TF does (negative from the end, duplicates allowed) -> the per-dim flags.
// Fails naming the op for an axis outside [-rank, rank).
std::vector<bool> reduction_axes(const OpDesc& op, const std::vector<int64_t>& axes, size_t rank);

}  // namespace npusim::compiler::ops
