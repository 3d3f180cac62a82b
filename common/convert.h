// Element conversions between the model's data types (f32, f16, bf16, s32, s16, s8, u8, u16)
// with explicit rounding and saturation, as the vector unit's vconv (and any other unit that
// casts) performs them.
//
// Contract:
// - Every source value is exactly representable as a double, so a conversion is the exact source
//   value rounded ONCE to the destination with the requested mode.
// - float -> narrower float: rounded with the mode; a finite value past the destination's range
//   becomes infinity when the mode rounds away from zero in that direction (rint, round-away,
//   floor for negatives, ceil for positives), else the largest finite value of that sign.
//   Subnormals of the destination are produced (no flush to zero).
// - float -> int: rounded to an integer with the mode, then saturated to the destination range;
//   +-inf saturates; NaN converts to 0.
// - int -> int: saturated to the destination range.
// - int -> float: rounded with the mode (e.g. s32 -> f16 saturates per the float rule above).
// - Widening float -> float is exact.
// - A NaN result of a float conversion is the canonical quiet NaN of the destination (positive,
//   top fraction bit only: f32 0x7fc00000, f16 0x7e00, bf16 0x7fc0); same-type conversion keeps
//   the bits.
// The fast RNE helpers (narrow_f16_rne etc.) are branch-free so element loops vectorise; they
// agree with common/numeric.h except that NaN becomes the canonical NaN.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#include "common/numeric.h"
#include "isa/isa.h"

namespace npusim {

// Rounding modes; the values are the vconv `round` field encoding (isa.def).
enum class RoundMode : uint8_t {
  kRint = 0,   // to nearest, ties to even
  kFloor = 1,  // toward -infinity
  kCeil = 2,   // toward +infinity
  kAway = 3,   // to nearest, ties away from zero
  kTrunc = 4,  // toward zero
};
inline constexpr int kNumRoundModes = 5;
const char* round_mode_name(RoundMode m);  // "rint", "floor", "ceil", "round", "trunc"
// The mode encoded by a vconv round field value, or nullopt if the value is not a mode.
std::optional<RoundMode> round_mode_from_field(int64_t v);

inline constexpr uint32_t kF32CanonicalNan = 0x7fc00000u;
inline constexpr uint16_t kF16CanonicalNan = 0x7e00u;
inline constexpr uint16_t kBf16CanonicalNan = 0x7fc0u;

// Exact f16 -> f32 (NaN payloads kept). Branch-free.
inline float widen_f16(uint16_t h) {
  // Scale the 15 magnitude bits placed in an f32 by 2^112: normal and subnormal halves land on
  // the right exponent exactly; results at or above 2^16 were infinities or NaNs.
  const float magic = bits_to_f32((254u - 15u) << 23);
  const float was_infnan = bits_to_f32((127u + 16u) << 23);
  float f = bits_to_f32(static_cast<uint32_t>(h & 0x7fffu) << 13) * magic;
  uint32_t u = f32_to_bits(f);
  u |= f >= was_infnan ? (255u << 23) : 0u;
  u |= static_cast<uint32_t>(h & 0x8000u) << 16;
  return bits_to_f32(u);
}

// Exact bf16 -> f32.
inline float widen_bf16(uint16_t b) { return bits_to_f32(static_cast<uint32_t>(b) << 16); }

// f32 -> f16, round to nearest even; overflow -> inf; NaN -> canonical NaN. Branch-free.
inline uint16_t narrow_f16_rne(float v) {
  const uint32_t f32_inf = 255u << 23;
  const uint32_t f16_overflow = (127u + 16u) << 23;  // 65536: rounds to inf or is inf/NaN
  const uint32_t denorm_magic_bits = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t u = f32_to_bits(v);
  uint32_t sign = (u >> 16) & 0x8000u;
  u &= 0x7fffffffu;
  // Subnormal (or zero) result: adding 0.5 (2^-1) aligns the 10 result bits at the bottom of
  // the f32 fraction and the FP add rounds them to nearest even.
  uint32_t sub = f32_to_bits(bits_to_f32(u) + bits_to_f32(denorm_magic_bits)) - denorm_magic_bits;
  // Normal result: rebias the exponent, add half an ulp minus one plus the kept lsb, truncate.
  uint32_t norm = (u + ((15u - 127u) << 23) + 0xfffu + ((u >> 13) & 1u)) >> 13;
  // Selections as masks: GCC at -O2 does not if-convert the equivalent ?: chain.
  uint32_t use_sub = 0u - static_cast<uint32_t>(u < (113u << 23));
  uint32_t overflow = 0u - static_cast<uint32_t>(u >= f16_overflow);
  uint32_t nan = 0u - static_cast<uint32_t>(u > f32_inf);
  uint32_t r = (sub & use_sub) | (norm & ~use_sub);
  r = ((0x7c00u & overflow) | (r & ~overflow)) | sign;
  return static_cast<uint16_t>((kF16CanonicalNan & nan) | (r & ~nan));
}

// f32 -> bf16, round to nearest even; NaN -> canonical NaN.
inline uint16_t narrow_bf16_rne(float v) {
  uint32_t u = f32_to_bits(v);
  uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? kBf16CanonicalNan : r);
}

// NaN -> canonical NaN, other values unchanged.
inline float canonical_f32(float v) { return v != v ? bits_to_f32(kF32CanonicalNan) : v; }

// x rounded to an integral value with mode m (the sign of a zero result follows x).
// Inline: every float -> int element conversion runs it.
inline double round_to_integral(double x, RoundMode m) {
  double r = x;
  switch (m) {
    case RoundMode::kRint: {
      // Ties to even, independent of the host's current rounding mode. a - floor(a) is exact
      // for a >= 0 (Sterbenz for a >= 1; floor is 0 below). A tie has a < 2^52, so f fits an
      // int64 for the parity test.
      double a = std::fabs(x);
      double f = std::floor(a);
      double frac = a - f;
      if (frac > 0.5 || (frac == 0.5 && (static_cast<int64_t>(f) & 1) != 0)) f += 1.0;
      r = std::copysign(f, x);
      break;
    }
    case RoundMode::kFloor: r = std::floor(x); break;
    case RoundMode::kCeil: r = std::ceil(x); break;
    case RoundMode::kAway: r = std::round(x); break;
    case RoundMode::kTrunc: r = std::trunc(x); break;
  }
  return r == 0.0 ? std::copysign(0.0, x) : r;
}

// x rounded to a binary float format with frac_bits stored fraction bits and normal exponents
// [1 - max_exp, max_exp], per the contract above. Returns the rounded value (or +-inf) as a
// double; NaN stays NaN.
double round_to_float_format(double x, int frac_bits, int max_exp, RoundMode m);
inline float round_to_f32(double x, RoundMode m) {
  return canonical_f32(static_cast<float>(round_to_float_format(x, 23, 127, m)));
}
inline uint16_t round_to_f16(double x, RoundMode m) {
  return narrow_f16_rne(static_cast<float>(round_to_float_format(x, 10, 15, m)));
}
inline uint16_t round_to_bf16(double x, RoundMode m) {
  return narrow_bf16_rne(static_cast<float>(round_to_float_format(x, 7, 127, m)));
}

// v rounded with mode m to an integer with at most `bits` significant bits, as a double (exact:
// at most 53 significant bits). For an integer past a float format's exact range, this is the
// contract's single rounding done in integer arithmetic: the same value as
// round_to_float_format, without its ilogb/ldexp calls and independent of the host's rounding
// mode. The caller handles the format's overflow (none for f32 and bf16 from 32-bit integers).
// 1 <= bits <= 53.
inline double round_integer_to_bits(int64_t v, int bits, RoundMode m) {
  const bool negative = v < 0;
  const uint64_t a = negative ? uint64_t{0} - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  const int shift = a == 0 ? 0 : 64 - __builtin_clzll(a) - bits;  // dropped low bits
  if (shift <= 0) return static_cast<double>(v);
  const uint64_t dropped = a & ((uint64_t{1} << shift) - 1), half = uint64_t{1} << (shift - 1);
  uint64_t kept = a >> shift;
  bool up = false;  // away from zero
  switch (m) {
    case RoundMode::kRint: up = dropped > half || (dropped == half && (kept & 1) != 0); break;
    case RoundMode::kAway: up = dropped >= half; break;
    case RoundMode::kFloor: up = negative && dropped != 0; break;
    case RoundMode::kCeil: up = !negative && dropped != 0; break;
    case RoundMode::kTrunc: break;
  }
  kept += up ? 1 : 0;
  // kept * 2^shift <= 2^(significant bits of a) fits: 64 significant bits means a = 2^63, which
  // drops only zeros and never rounds up. At most `bits` + 1 significant bits: exact in a double.
  const double r = static_cast<double>(kept << shift);
  return negative ? -r : r;
}

// x rounded to an integer with mode m, saturated to Int's range; NaN -> 0.
template <class Int>
Int saturate_float_to_int(double x, RoundMode m) {
  if (x != x) return 0;
  double r = round_to_integral(x, m);
  if (r <= static_cast<double>(std::numeric_limits<Int>::min()))
    return std::numeric_limits<Int>::min();
  if (r >= static_cast<double>(std::numeric_limits<Int>::max()))
    return std::numeric_limits<Int>::max();
  return static_cast<Int>(r);
}

// v saturated to Int's range.
template <class Int>
Int saturate_int(int64_t v) {
  if (v < static_cast<int64_t>(std::numeric_limits<Int>::min()))
    return std::numeric_limits<Int>::min();
  if (v > static_cast<int64_t>(std::numeric_limits<Int>::max()))
    return std::numeric_limits<Int>::max();
  return static_cast<Int>(v);
}

// Per data type: how an element is stored in memory (`storage`, little endian) and the value
// type the vector unit computes with (`compute`: float for the float types, the integer itself
// for integer types). load/store move between memory and compute values; store rounds a float
// to nearest even and writes canonical NaNs.
template <isa::Dtype D>
struct Elem;

template <class Storage>
inline Storage load_bits(const uint8_t* p) {
  Storage s;
  std::memcpy(&s, p, sizeof(Storage));
  return s;
}
template <class Storage>
inline void store_bits(uint8_t* p, Storage s) {
  std::memcpy(p, &s, sizeof(Storage));
}

template <>
struct Elem<isa::Dtype::F32> {
  // Integers of magnitude up to this (24 significand bits) are exactly representable.
  static constexpr int kSignificandBits = 24;
  static constexpr int64_t kExactInt = int64_t{1} << kSignificandBits;
  using storage = uint32_t;
  using compute = float;
  static constexpr bool is_float = true;
  static float to_compute(uint32_t s) { return bits_to_f32(s); }
  static uint32_t from_compute(float v) { return f32_to_bits(canonical_f32(v)); }
  static float load(const uint8_t* p) { return to_compute(load_bits<uint32_t>(p)); }
  static void store(uint8_t* p, float v) { store_bits(p, from_compute(v)); }
  static uint32_t round_from(double x, RoundMode m) { return f32_to_bits(round_to_f32(x, m)); }
};
template <>
struct Elem<isa::Dtype::F16> {
  // Integers of magnitude up to this (11 significand bits) are exactly representable.
  static constexpr int kSignificandBits = 11;
  static constexpr int64_t kExactInt = int64_t{1} << kSignificandBits;
  using storage = uint16_t;
  using compute = float;
  static constexpr bool is_float = true;
  static float to_compute(uint16_t s) { return widen_f16(s); }
  static uint16_t from_compute(float v) { return narrow_f16_rne(v); }
  static float load(const uint8_t* p) { return to_compute(load_bits<uint16_t>(p)); }
  static void store(uint8_t* p, float v) { store_bits(p, from_compute(v)); }
  static uint16_t round_from(double x, RoundMode m) { return round_to_f16(x, m); }
};
template <>
struct Elem<isa::Dtype::BF16> {
  // Integers of magnitude up to this (8 significand bits) are exactly representable.
  static constexpr int kSignificandBits = 8;
  static constexpr int64_t kExactInt = int64_t{1} << kSignificandBits;
  using storage = uint16_t;
  using compute = float;
  static constexpr bool is_float = true;
  static float to_compute(uint16_t s) { return widen_bf16(s); }
  static uint16_t from_compute(float v) { return narrow_bf16_rne(v); }
  static float load(const uint8_t* p) { return to_compute(load_bits<uint16_t>(p)); }
  static void store(uint8_t* p, float v) { store_bits(p, from_compute(v)); }
  static uint16_t round_from(double x, RoundMode m) { return round_to_bf16(x, m); }
};
template <class Int>
struct IntElem {
  using storage = Int;
  using compute = Int;
  static constexpr bool is_float = false;
  static Int to_compute(Int s) { return s; }
  static Int from_compute(Int v) { return v; }
  static Int load(const uint8_t* p) { return load_bits<Int>(p); }
  static void store(uint8_t* p, Int v) { store_bits(p, v); }
  static Int round_from(double x, RoundMode m) { return saturate_float_to_int<Int>(x, m); }
};
template <>
struct Elem<isa::Dtype::S32> : IntElem<int32_t> {};
template <>
struct Elem<isa::Dtype::S16> : IntElem<int16_t> {};
template <>
struct Elem<isa::Dtype::U16> : IntElem<uint16_t> {};
template <>
struct Elem<isa::Dtype::S8> : IntElem<int8_t> {};
template <>
struct Elem<isa::Dtype::U8> : IntElem<uint8_t> {};

// Converts one stored element of type S to type D per the contract above.
template <isa::Dtype D, isa::Dtype S>
inline typename Elem<D>::storage convert_element(typename Elem<S>::storage s, RoundMode m) {
  using DE = Elem<D>;
  using SE = Elem<S>;
  if constexpr (D == S) {
    return s;
  } else if constexpr (DE::is_float && SE::is_float) {
    float v = SE::to_compute(s);  // exact
    if constexpr (D == isa::Dtype::F32) return DE::from_compute(v);  // widening: exact
    if (m == RoundMode::kRint) return DE::from_compute(v);
    return DE::round_from(static_cast<double>(v), m);
  } else if constexpr (SE::is_float) {
    return DE::round_from(static_cast<double>(SE::to_compute(s)), m);
  } else if constexpr (DE::is_float) {
    // An integer the destination represents exactly converts so in every mode (indices, counts,
    // labels: nearly every one), through float exactly; only larger ones need rounding.
    const int64_t v = static_cast<int64_t>(s);
    if (v >= -DE::kExactInt && v <= DE::kExactInt) return DE::from_compute(static_cast<float>(v));
    // Past it (random 32-bit words, hashes): rounded in integer arithmetic where no integer
    // source overflows the destination (f32, bf16); f16's overflow rule needs the general path.
    if constexpr (D != isa::Dtype::F16)
      return DE::from_compute(static_cast<float>(round_integer_to_bits(v, DE::kSignificandBits, m)));
    return DE::round_from(static_cast<double>(s), m);
  } else {
    return saturate_int<typename DE::storage>(static_cast<int64_t>(s));
  }
}

// The same for types known only at run time (slow: for reference code, tests and tools).
// Reads sizeof(src) bytes at src and writes sizeof(dst) bytes at dst. Throws npusim::Error for
// a type outside f32, f16, bf16, s32, s16, s8, u8, u16.
void convert_element(isa::Dtype dst_type, void* dst, isa::Dtype src_type, const void* src,
                     RoundMode m);

// Calls f(std::integral_constant<isa::Dtype, t>{}) for t in f32, f16, bf16, s32, s16, s8, u8,
// u16; returns false (without calling f) for any other type.
template <class F>
bool visit_elem_dtype(isa::Dtype t, F&& f) {
  using isa::Dtype;
  switch (t) {
    case Dtype::F32: f(std::integral_constant<Dtype, Dtype::F32>{}); return true;
    case Dtype::F16: f(std::integral_constant<Dtype, Dtype::F16>{}); return true;
    case Dtype::BF16: f(std::integral_constant<Dtype, Dtype::BF16>{}); return true;
    case Dtype::S32: f(std::integral_constant<Dtype, Dtype::S32>{}); return true;
    case Dtype::S16: f(std::integral_constant<Dtype, Dtype::S16>{}); return true;
    case Dtype::S8: f(std::integral_constant<Dtype, Dtype::S8>{}); return true;
    case Dtype::U8: f(std::integral_constant<Dtype, Dtype::U8>{}); return true;
    case Dtype::U16: f(std::integral_constant<Dtype, Dtype::U16>{}); return true;
    default: return false;
  }
}

}  // namespace npusim
