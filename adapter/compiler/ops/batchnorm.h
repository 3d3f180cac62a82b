// BNTrainingReduce's launches (ops/batchnorm.cpp) for the ops that produce the statistics
// themselves: the convolution with the batch norm's reduction as its epilogue
// (Conv2DBNTrainingReduce, ops/conv2d.cpp).
#pragma once

#include <cstdint>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/channel.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

// sum and square_sum (f32 [c], the op's outputs `out` and `out + 1`) of x ([pixels][c] of dt):
// the channel sum over x (through a channel-padded copy unless c * size is whole 32-byte
// blocks), then the epilogue adding its blocks' partials, as BNTrainingReduce.
void append_bn_training_reduce(CompiledKernel& k, const OpDesc& op, const ArgRef& x,
                               int64_t pixels, int64_t c, DataType dt, int out,
                               const ChipConfig& cfg);

// The epilogue's spec: partial sets (plain sums, sums of squares; with squares_first the other
// way round) of `blocks` blocks, c <= cp channels; outputs 0 and 1 = their sums (sum,
// square_sum). Also a mix kernel's in-kernel epilogue (ChannelSumSection::epilogue).
ChannelEpilogueSpec bn_training_reduce_sums_epilogue(int blocks, int64_t c, int64_t cp,
                                                     bool squares_first = false);

}  // namespace npusim::compiler::ops
