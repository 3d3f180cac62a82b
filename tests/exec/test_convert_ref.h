// An independent reference for element conversions (common/convert.h), written differently from
// the implementation: the exact source value as a long double; float destinations by looking up
// the two neighbouring representable values (every finite f16 / bf16 value in a sorted table;
// f32 neighbours with nextafterf) and choosing by the rounding mode's definition; integer
// destinations by truncating and stepping by hand.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "isa/isa.h"
#include "tests/exec/test_vector_util.h"

namespace npusim::test {

enum class RefRound { kRint = 0, kFloor, kCeil, kAway, kTrunc };

// The exact value of an element given by its bits (low bytes of `bits`).
inline long double ref_elem_value(isa::Dtype t, uint32_t bits) {
  switch (t) {
    case isa::Dtype::F32: return ref_f32(bits);
    case isa::Dtype::F16: return static_cast<long double>(ref_f16(static_cast<uint16_t>(bits)));
    case isa::Dtype::BF16: return ref_bf16_value(static_cast<uint16_t>(bits));
    case isa::Dtype::S32: return static_cast<int32_t>(bits);
    case isa::Dtype::S16: return static_cast<int16_t>(bits);
    case isa::Dtype::U16: return static_cast<uint16_t>(bits);
    case isa::Dtype::S8: return static_cast<int8_t>(bits);
    case isa::Dtype::U8: return static_cast<uint8_t>(bits);
    default: FAIL("not an element type"); return 0;
  }
}

// Sorted table of a 16-bit float format's finite values (one zero) with their bits.
struct Ref16Table {
  std::vector<std::pair<long double, uint16_t>> values;
  explicit Ref16Table(bool bf16) {
    for (uint32_t b = 0; b < 0x10000u; ++b) {
      long double v = bf16 ? static_cast<long double>(ref_bf16_value(static_cast<uint16_t>(b)))
                           : static_cast<long double>(ref_f16(static_cast<uint16_t>(b)));
      if (std::isfinite(v) && b != 0x8000u) values.push_back({v, static_cast<uint16_t>(b)});
    }
    std::sort(values.begin(), values.end());
  }
};
inline const Ref16Table& ref_f16_table() {
  static const Ref16Table t(false);
  return t;
}
inline const Ref16Table& ref_bf16_table() {
  static const Ref16Table t(true);
  return t;
}

// Picks between neighbours lo <= x <= hi (values and whether each one's significand is even)
// per the mode. Returns true for hi.
inline bool ref_pick_upper(long double x, long double lo, long double hi, bool lo_even,
                           RefRound m) {
  switch (m) {
    case RefRound::kFloor: return false;
    case RefRound::kCeil: return true;
    case RefRound::kTrunc: return x < 0;
    case RefRound::kRint:
    case RefRound::kAway: {
      long double dlo = x - lo, dhi = hi - x;
      if (dlo != dhi) return dhi < dlo;
      if (m == RefRound::kRint) return lo_even ? false : true;
      return x > 0;  // tie: away from zero
    }
  }
  return false;
}

// x (finite, not NaN) rounded to f16/bf16 bits.
inline uint16_t ref_round_16(const Ref16Table& t, long double x, RefRound m) {
  const auto& v = t.values;
  const uint16_t sign = std::signbit(x) ? 0x8000u : 0;
  const long double max = v.back().first;
  const uint16_t inf = static_cast<uint16_t>(((v.back().second & 0x7fffu) + 1u));  // exp all ones
  auto zero_signed = [&](uint16_t bits) {
    return (bits & 0x7fffu) == 0 ? sign : bits;  // a zero result takes x's sign
  };
  if (x > max || x < -max) {
    // Past the largest finite value: the neighbours are max and the next power of two, which
    // is "infinity" once chosen.
    long double next = max + (max - v[v.size() - 2].first);
    long double ax = std::fabs(x);
    RefRound mag = m;  // mode on the magnitude
    if (x < 0 && m == RefRound::kFloor) mag = RefRound::kCeil;
    else if (x < 0 && m == RefRound::kCeil) mag = RefRound::kFloor;
    bool up = ref_pick_upper(ax, max, next, false, mag);
    return static_cast<uint16_t>(sign | (up ? inf : v.back().second));
  }
  auto it = std::lower_bound(v.begin(), v.end(), std::make_pair(x, uint16_t{0}),
                             [](const auto& a, const auto& b) { return a.first < b.first; });
  if (it != v.end() && it->first == x) return zero_signed(it->second);
  auto hi = it, lo = it - 1;
  bool up = ref_pick_upper(x, lo->first, hi->first, (lo->second & 1u) == 0, m);
  return zero_signed(up ? hi->second : lo->second);
}

// x (finite, not NaN) rounded to f32.
inline float ref_round_f32(long double x, RefRound m) {
  float f = static_cast<float>(x);  // some neighbour (round to nearest)
  if (static_cast<long double>(f) == x) return f;
  float lo = f, hi = f;
  if (static_cast<long double>(f) > x) lo = std::nextafterf(f, -INFINITY);
  else hi = std::nextafterf(f, INFINITY);
  // A neighbour that is infinite is really the next power of two for distance purposes.
  long double lov = std::isinf(lo) ? -std::ldexp(1.0L, 128) : lo;
  long double hiv = std::isinf(hi) ? std::ldexp(1.0L, 128) : hi;
  bool lo_even = std::isinf(lo) || (ref_f32_bits(lo) & 1u) == 0;
  float r = ref_pick_upper(x, lov, hiv, lo_even, m) ? hi : lo;
  return r == 0 ? std::copysign(0.0f, static_cast<float>(x)) : r;
}

// x rounded to an integer by the mode, by hand (truncate, then step).
inline long double ref_round_integer(long double x, RefRound m) {
  if (std::fabs(x) >= std::ldexp(1.0L, 62)) return x;  // integral already
  long double t = static_cast<long double>(static_cast<long long>(x));  // toward zero
  long double frac = x - t;                                             // exact, |frac| < 1
  switch (m) {
    case RefRound::kTrunc: return t;
    case RefRound::kFloor: return frac < 0 ? t - 1 : t;
    case RefRound::kCeil: return frac > 0 ? t + 1 : t;
    case RefRound::kAway: return std::fabs(frac) >= 0.5L ? t + (x > 0 ? 1 : -1) : t;
    case RefRound::kRint: {
      long double af = std::fabs(frac);
      bool odd = static_cast<long long>(t) % 2 != 0;
      if (af > 0.5L || (af == 0.5L && odd)) return t + (x > 0 ? 1 : -1);
      return t;
    }
  }
  return t;
}

inline void ref_int_range(isa::Dtype t, long double& lo, long double& hi) {
  switch (t) {
    case isa::Dtype::S32: lo = INT32_MIN; hi = INT32_MAX; break;
    case isa::Dtype::S16: lo = INT16_MIN; hi = INT16_MAX; break;
    case isa::Dtype::U16: lo = 0; hi = UINT16_MAX; break;
    case isa::Dtype::S8: lo = INT8_MIN; hi = INT8_MAX; break;
    case isa::Dtype::U8: lo = 0; hi = UINT8_MAX; break;
    default: FAIL("not an integer type");
  }
}

// The converted element's bits (in the low dtype_size(dst) bytes).
inline uint32_t ref_convert(isa::Dtype dst, isa::Dtype src, uint32_t src_bits, RefRound m) {
  using isa::Dtype;
  const int dsize = isa::dtype_size(dst);
  const uint32_t dmask = dsize == 4 ? 0xffffffffu : (1u << (8 * dsize)) - 1u;
  if (dst == src) return src_bits & dmask;
  long double x = ref_elem_value(src, src_bits);
  if (isa::dtype_is_float(dst)) {
    if (std::isnan(x))
      return dst == Dtype::F32 ? 0x7fc00000u : dst == Dtype::F16 ? 0x7e00u : 0x7fc0u;
    if (std::isinf(x)) {
      uint32_t inf = dst == Dtype::F32 ? 0x7f800000u : dst == Dtype::F16 ? 0x7c00u : 0x7f80u;
      uint32_t sign = dst == Dtype::F32 ? 0x80000000u : 0x8000u;
      return x < 0 ? inf | sign : inf;
    }
    if (dst == Dtype::F32) return ref_f32_bits(ref_round_f32(x, m));
    return ref_round_16(dst == Dtype::F16 ? ref_f16_table() : ref_bf16_table(), x, m);
  }
  long double lo = 0, hi = 0;
  ref_int_range(dst, lo, hi);
  long double r;
  if (std::isnan(x)) r = 0;
  else if (std::isinf(x)) r = x < 0 ? lo : hi;
  else r = std::min(hi, std::max(lo, ref_round_integer(x, m)));
  return static_cast<uint32_t>(static_cast<int64_t>(r)) & dmask;
}

}  // namespace npusim::test
