// s32 <-> s64 element conversions done by the scalar unit: no vector or cube instruction computes
// on 8-byte integers (op_desc.h), so ops producing or taking TF int64 tensors (ArgMax's
// output_type, SparseSoftmaxCrossEntropyWithLogits' labels) convert them in a launch of their
// own. Each vector core takes a range of element pairs and moves them with 8-byte ld / st at GM
// byte addresses (scalar_alu semantics: 64-bit registers, logical shr).
#pragma once

#include <cstdint>
#include <string>

#include "adapter/compiler/compiler.h"

namespace npusim::compiler::ops {

// Arguments in (s32[n]), out (s64[n]): out[i] = in[i], sign-extended. n >= 1.
Launch build_widen_s32_to_s64(const std::string& op, int64_t n, const ChipConfig& cfg);

// Arguments in (s64[n]), out (s32[n]): out[i] = min(max(in[i], lo), hi) (lo, hi in the s32
// range), so out-of-range values stay recognisable (e.g. lo = -1, hi = C for class labels).
// n >= 1. Writes whole 8-byte pairs: for odd n the 4 bytes after the tensor, inside its
// rounded-up buffer (op_desc.h).
Launch build_narrow_s64_to_s32(const std::string& op, int64_t n, int64_t lo, int64_t hi,
                               const ChipConfig& cfg);

}  // namespace npusim::compiler::ops
