// Bulk f16 <-> f32 conversions for the element loops of the model (cube inputs, FIXPIPE
// outputs), bit-identical element by element to common/numeric.h's f16_to_f32 / f32_to_f16
// (round to nearest even, subnormals, infinities and NaN payloads as those define them) for
// every input; on x86-64 hosts with F16C they run on the hardware converters.
#pragma once

#include <cstddef>

namespace npusim {

// dst[i] = f16_to_f32(f16 bits i at src), i < n; src: 2n bytes, little endian, any alignment.
// allow_hw = false forces the portable scalar path (the tests compare the two).
void f16_to_f32_n(const void* src, float* dst, size_t n, bool allow_hw = true);
// f16 bits i at dst = f32_to_f16(src[i]), i < n; dst: 2n bytes, any alignment.
void f32_to_f16_n(const float* src, void* dst, size_t n, bool allow_hw = true);
// The vector unit's conversions (common/convert.h contract: a NaN result is the canonical NaN),
// element by element bit-identical to narrow_f16_rne / widen_f16 + canonical_f32:
// f16 bits i at dst = narrow_f16_rne(fp32 bits i at src), i < n;
void f32_to_f16_canonical_n(const void* src, void* dst, size_t n, bool allow_hw = true);
// fp32 bits i at dst = f32_to_bits(canonical_f32(widen_f16(f16 bits i at src))), i < n.
// src and dst: any alignment, not overlapping.
void f16_to_f32_canonical_n(const void* src, void* dst, size_t n, bool allow_hw = true);
// Whether this host runs the hardware (F16C) path.
bool f16_bulk_uses_hardware();

}  // namespace npusim
