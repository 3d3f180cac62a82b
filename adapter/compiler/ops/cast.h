// Cast as a building block for other families (e.g. MatMul's fp32 -> fp16 input casts).
#pragma once

#include <cstdint>
#include <vector>

#include "adapter/compiler/op_desc.h"
#include "adapter/compiler/ops/elementwise.h"

namespace npusim::compiler::ops {

// The stream spec converting a tensor of `shape` from src to dst with TF's Cast rounding
// (truncate: TF's Truncate attribute). The caller checks that the pair is supported.
StreamSpec cast_spec(DataType src, DataType dst, bool truncate, const std::vector<int64_t>& shape);

}  // namespace npusim::compiler::ops
