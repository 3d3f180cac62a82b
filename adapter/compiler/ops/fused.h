// The batch norm at inference as launch builders, shared by BatchNormInference (ops/fused.cpp)
// and the convolution with a batch norm folded in (Conv2DBatchNormInference, ops/conv2d.cpp);
// the bias epilogue of Conv2DBiasAdd and MatMulBiasAdd where the cube has no bias table.
#pragma once

#include <cstdint>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/ops/elementwise.h"
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

// Appends the fold launch (BatchNormInferenceFold). The op's inputs from `first` up to `end`
// (exclusive; -1: the last input) are scale, offset, mean, variance and optionally bias, each
// f32 [c] (leading 1s allowed) with c the last dimension of y_shape; attribute epsilon
// (default 0.001). Fails naming a wrong input.
BatchNormFold append_batch_norm_fold(CompiledKernel& k, const CompileContext& ctx, int first,
                                     const std::vector<int64_t>& y_shape, int end = -1);

// The activation a fused inference op applies to its f32 result before the one rounding to
// its output type: none, ReLU max(y, 0), or ReLU6 min(max(y, 0), 6) (MobileNet's; the same
// vmaxs / vmins pair as the Relu6 kernel, so bit for bit the unfused Relu6 of the f32 value).
enum class Activation { kNone, kRelu, kRelu6 };

// The op's activation from its bool attributes relu6 (taken first) and relu (both default false).
Activation activation_attr(const OpDesc& op);

// "", "Relu" or "Relu6": the kernel-name suffix of an activation.
const char* activation_name(Activation act);

// Emits `act` in place on `count` elements of type t (f32 or f16) at UB address y.
void append_activation(KernelBuilder& b, Activation act, uint64_t y, const Reg& count,
                       isa::Dtype t = isa::Dtype::F32);

// Appends y = x * a + shift (then the activation) over `shape` (channels last), from the tensor
// x to output 0 (x may be output 0 itself when of y's type: each tile is read before it is
// written). x is x_type, y y_type, each f32 or f16 (widened exactly, computed in f32, rounded
// once). With `placed` and x or y f16, no instruction writes a tile it reads and the tiles sit
// in UB bank windows of their own (StreamSpec::out_window; the same values, fewer bank
// conflicts; BNTrainingUpdate's apply, docs/compiler.md "The batch norm's passes in bank
// windows").
void append_batch_norm_apply(CompiledKernel& k, const CompileContext& ctx, const ArgRef& x,
                             const std::vector<int64_t>& shape, const BatchNormFold& fold,
                             Activation act, isa::Dtype x_type, isa::Dtype y_type,
                             bool placed = false);

// The stream kernel of append_batch_norm_apply: inputs x, a, shift (in[0..2]; a and shift
// broadcast f32 [c]), output y; its compute reads a and shift from their tiles only.
StreamSpec batch_norm_apply_spec(const std::vector<int64_t>& shape, Activation act,
                                 isa::Dtype x_type, isa::Dtype y_type, bool placed = false);

// Appends y = y + bias[c] (then max(y, 0) with relu) in place on output 0 (f32, or f16: widened
// exactly, computed in f32, rounded once; channels last), bias = input `bias_input` (f32 [c]):
// what BiasAdd (and Relu) compute, in one pass.
void append_bias_epilogue(CompiledKernel& k, const CompileContext& ctx, int bias_input, bool relu);

// Appends y = act(y + residual) in place on output 0 (f32 or f16), residual = input
// `residual_input` of y's type and shape, added and clamped in y's type: a fused convolution's
// residual (Conv2D + BNInference + Add) where its kernel cannot add it on the way out. The
// same values as the epilogue's add (conv2d.cpp): y is rounded to its type first.
void append_residual_add(CompiledKernel& k, const CompileContext& ctx, int residual_input,
                         Activation act);

}  // namespace npusim::compiler::ops
