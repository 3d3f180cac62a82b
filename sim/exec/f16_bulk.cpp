// Bulk f16 <-> f32 conversions (sim/exec/f16_bulk.h). On x86-64 hosts with F16C (and AVX) the
// hardware converters do eight values at a time (f16 -> f32 sixteen with AVX-512); they round
// like the scalar functions (IEEE round to nearest even, subnormals kept; the rounding mode is
// given in the instruction, not taken from MXCSR) and differ only on NaNs: vcvtph2ps quiets a
// signalling f16 NaN and vcvtps2ph keeps the top payload bits, where the scalar functions keep
// the f16 payload and produce the canonical f16 NaN. Groups holding a NaN are therefore redone
// with the scalar functions, so the bulk results are bit-identical to them for every input
// (tests/exec/test_f16_bulk.cpp).
#include "sim/exec/f16_bulk.h"

#include <cstdint>
#include <cstring>

#include "common/convert.h"
#include "common/numeric.h"
#include "sim/exec/host_simd.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define NPUSIM_NUMERIC_F16C 1
#endif

namespace npusim {
namespace {

void f16_to_f32_scalar(const void* src, float* dst, size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, s + 2 * i, 2);
    dst[i] = f16_to_f32(h);
  }
}

void f32_to_f16_scalar(const float* src, void* dst, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h = f32_to_f16(src[i]);
    std::memcpy(d + 2 * i, &h, 2);
  }
}

void f32_to_f16_canonical_scalar(const void* src, void* dst, size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < n; ++i)
    store_bits<uint16_t>(d + 2 * i, narrow_f16_rne(bits_to_f32(load_bits<uint32_t>(s + 4 * i))));
}

void f16_to_f32_canonical_scalar(const void* src, void* dst, size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < n; ++i)
    store_bits<uint32_t>(d + 4 * i,
                         f32_to_bits(canonical_f32(widen_f16(load_bits<uint16_t>(s + 2 * i)))));
}

#ifdef NPUSIM_NUMERIC_F16C
// Eight values at src widened into dst; the lanes that hold a NaN set (unordered compare).
__attribute__((target("avx,f16c"), always_inline)) inline __m256 widen8_f16c(const uint8_t* src,
                                                                            float* dst) {
  const __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  _mm256_storeu_ps(dst, f);
  return _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
}

__attribute__((target("avx,f16c"))) void f16_to_f32_f16c(const void* src, float* dst, size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  size_t i = 0;
  // 32 values a step, their NaN lanes ORed and tested once (one movemask and branch per 32
  // values instead of per 8); a step holding a NaN is redone whole by the scalar path.
  for (; i + 32 <= n; i += 32) {
    const __m256 nan = _mm256_or_ps(
        _mm256_or_ps(widen8_f16c(s + 2 * i, dst + i), widen8_f16c(s + 2 * i + 16, dst + i + 8)),
        _mm256_or_ps(widen8_f16c(s + 2 * i + 32, dst + i + 16),
                     widen8_f16c(s + 2 * i + 48, dst + i + 24)));
    if (_mm256_movemask_ps(nan)) f16_to_f32_scalar(s + 2 * i, dst + i, 32);
  }
  for (; i + 8 <= n; i += 8)
    if (_mm256_movemask_ps(widen8_f16c(s + 2 * i, dst + i)))
      f16_to_f32_scalar(s + 2 * i, dst + i, 8);
  f16_to_f32_scalar(s + 2 * i, dst + i, n - i);
}

// The same sixteen values at a time (AVX-512's vcvtph2ps, the same conversion); the last
// fewer than sixteen through the F16C variant.
__attribute__((target("avx512f,avx,f16c"))) void f16_to_f32_avx512(const void* src, float* dst,
                                                                   size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    // (zero-masking with every lane set: GCC 12 warns about the unmasked form's undefined
    // pass-through operand)
    __m512 f = _mm512_maskz_cvtph_ps(
        0xffff, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 2 * i)));
    _mm512_storeu_ps(dst + i, f);
    if (_mm512_cmp_ps_mask(f, f, _CMP_UNORD_Q)) f16_to_f32_scalar(s + 2 * i, dst + i, 16);
  }
  f16_to_f32_f16c(s + 2 * i, dst + i, n - i);
}

__attribute__((target("avx,f16c"))) void f32_to_f16_f16c(const float* src, void* dst, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_loadu_ps(src + i);
    __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * i), h);
    if (_mm256_movemask_ps(_mm256_cmp_ps(f, f, _CMP_UNORD_Q)))
      f32_to_f16_scalar(src + i, d + 2 * i, 8);
  }
  f32_to_f16_scalar(src + i, d + 2 * i, n - i);
}

// vcvtps2ph rounds like narrow_f16_rne; its NaN results (payload kept) become the canonical NaN.
__attribute__((target("avx,f16c"))) void f32_to_f16_canonical_f16c(const void* src, void* dst,
                                                                   size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  const __m128i canonical = _mm_set1_epi16(static_cast<short>(kF16CanonicalNan));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_loadu_ps(reinterpret_cast<const float*>(s + 4 * i));
    __m128i h = _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(nan), _mm256_extractf128_si256(nan, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 2 * i), _mm_blendv_epi8(h, canonical, nan16));
  }
  f32_to_f16_canonical_scalar(s + 4 * i, d + 2 * i, n - i);
}

// vcvtph2ps widens exactly (a NaN keeps its payload, quieted); NaNs become the canonical NaN.
__attribute__((target("avx,f16c"))) void f16_to_f32_canonical_f16c(const void* src, void* dst,
                                                                   size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  const __m256 canonical =
      _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kF32CanonicalNan)));
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 f = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 2 * i)));
    f = _mm256_blendv_ps(f, canonical, _mm256_cmp_ps(f, f, _CMP_UNORD_Q));
    _mm256_storeu_ps(reinterpret_cast<float*>(d + 4 * i), f);
  }
  f16_to_f32_canonical_scalar(s + 2 * i, d + 4 * i, n - i);
}

// The hardware converters need F16C (and AVX), part of host_simd()'s AVX2 level.
bool host_has_f16c() { return host_simd_at_least(HostSimd::kAvx2); }
#endif

}  // namespace

void f16_to_f32_n(const void* src, float* dst, size_t n, bool allow_hw) {
#ifdef NPUSIM_NUMERIC_F16C
  static const int level = static_cast<int>(host_simd());
  if (level == 2 && allow_hw) return f16_to_f32_avx512(src, dst, n);
  if (level == 1 && allow_hw) return f16_to_f32_f16c(src, dst, n);
#endif
  f16_to_f32_scalar(src, dst, n);
}

void f32_to_f16_n(const float* src, void* dst, size_t n, bool allow_hw) {
#ifdef NPUSIM_NUMERIC_F16C
  static const bool f16c = host_has_f16c();
  if (f16c && allow_hw) return f32_to_f16_f16c(src, dst, n);
#endif
  f32_to_f16_scalar(src, dst, n);
}

void f32_to_f16_canonical_n(const void* src, void* dst, size_t n, bool allow_hw) {
#ifdef NPUSIM_NUMERIC_F16C
  static const bool f16c = host_has_f16c();
  if (f16c && allow_hw) return f32_to_f16_canonical_f16c(src, dst, n);
#endif
  f32_to_f16_canonical_scalar(src, dst, n);
}

void f16_to_f32_canonical_n(const void* src, void* dst, size_t n, bool allow_hw) {
#ifdef NPUSIM_NUMERIC_F16C
  static const bool f16c = host_has_f16c();
  if (f16c && allow_hw) return f16_to_f32_canonical_f16c(src, dst, n);
#endif
  f16_to_f32_canonical_scalar(src, dst, n);
}

bool f16_bulk_uses_hardware() {
#ifdef NPUSIM_NUMERIC_F16C
  return host_has_f16c();
#else
  return false;
#endif
}

}  // namespace npusim
