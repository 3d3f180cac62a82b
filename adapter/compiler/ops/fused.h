// The batch norm at inference as launch builders, shared by BatchNormInference (ops/fused.cpp)
// and the convolution with a batch norm folded in (Conv2DBatchNormInference, ops/conv2d.cpp);
// the bias epilogue of Conv2DBiasAdd and MatMulBiasAdd where the cube has no bias table.
#pragma once

#include <cstdint>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

// The per-channel factors of a batch norm, f32 [c] each, the two parts of one derived tensor
// (compiler.h) of the batch norm's inputs:
//   a = rsqrt(variance + epsilon) * scale
//   shift = offset - mean * a, or offset + (bias - mean) * a with a bias
// so that y = x * a + shift.
struct BatchNormFold {
  ArgRef a, shift;
};

// Appends the fold launch (BatchNormInferenceFold). The op's inputs from `first` on are scale,
// offset, mean, variance and optionally bias, each f32 [c] (leading 1s allowed) with c the last
// dimension of y_shape; attribute epsilon (default 0.001). Fails naming a wrong input.
BatchNormFold append_batch_norm_fold(CompiledKernel& k, const CompileContext& ctx, int first,
                                     const std::vector<int64_t>& y_shape);

// Appends y = x * a + shift (then max(y, 0) with relu) over `shape` (channels last), from the
// tensor x to output 0 (x may be output 0 itself: each tile is read before it is written).
// x and y are io_type (f32, or f16: widened exactly, computed in f32, rounded once).
void append_batch_norm_apply(CompiledKernel& k, const CompileContext& ctx, const ArgRef& x,
                             const std::vector<int64_t>& shape, const BatchNormFold& fold,
                             bool relu, isa::Dtype io_type);

// Appends y = y + bias[c] (then max(y, 0) with relu) in place on output 0 (f32, or f16: widened
// exactly, computed in f32, rounded once; channels last), bias = input `bias_input` (f32 [c]):
// what BiasAdd (and Relu) compute, in one pass.
void append_bias_epilogue(CompiledKernel& k, const CompileContext& ctx, int bias_input, bool relu);

}  // namespace npusim::compiler::ops
