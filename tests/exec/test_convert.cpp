// Element conversions (common/convert.h) against the independent references of
// test_convert_ref.h, GCC's _Float16 and hand-rounded bf16.
#include <catch2/catch.hpp>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/convert.h"
#include "common/error.h"
#include "common/numeric.h"
#include "tests/exec/test_convert_ref.h"

using namespace npusim;
using namespace npusim::test;
using isa::Dtype;

namespace {

// f32 bit patterns that sweep every exponent (a prime stride through all 2^32 patterns) plus
// the edges of the f16 and bf16 formats.
std::vector<uint32_t> f32_patterns() {
  std::vector<uint32_t> p;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 65521) p.push_back(static_cast<uint32_t>(b));
  auto add = [&](float f) {
    p.push_back(ref_f32_bits(f));
    p.push_back(ref_f32_bits(-f));
  };
  for (float f : {0.0f, 1.0f, 65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e30f, INFINITY,
                  std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25),
                  std::ldexp(1.5f, -25), std::ldexp(1.0f, -26), std::ldexp(3.0f, -25),
                  2049.0f, 2051.0f, 1.0f + std::ldexp(1.0f, -11), 1.0f + std::ldexp(3.0f, -11),
                  1.0f + std::ldexp(1.0f, -8), 1.0f + std::ldexp(3.0f, -8),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min(),
                  std::numeric_limits<float>::min(), 3.3895314e38f /* bf16 max */})
    add(f);
  // Every f16 value and the midpoints just around each (ties and near-ties).
  for (uint32_t h = 0; h < 0x7c00u; h += 7) {
    float v = static_cast<float>(ref_f16(static_cast<uint16_t>(h)));
    float next = static_cast<float>(ref_f16(static_cast<uint16_t>(h + 1)));
    float mid = (v + next) / 2;  // exact in f32
    add(v);
    add(mid);
    add(std::nextafterf(mid, 0.0f));
    add(std::nextafterf(mid, INFINITY));
  }
  return p;
}

}  // namespace

TEST_CASE("widen_f16 is exact for every f16 bit pattern") {
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    auto h = static_cast<uint16_t>(b);
    float want = static_cast<float>(ref_f16(h));
    float got = widen_f16(h);
    INFO("f16 bits " << b);
    if (std::isnan(want)) {
      CHECK(std::isnan(got));
      CHECK(ref_f32_bits(got) == ref_f32_bits(f16_to_f32(h)));  // payload as numeric.h keeps it
    } else {
      CHECK(ref_f32_bits(got) == ref_f32_bits(want));
    }
  }
  for (uint32_t b = 0; b < 0x10000u; b += 3)
    CHECK(ref_f32_bits(widen_bf16(static_cast<uint16_t>(b))) == b << 16);
}

TEST_CASE("narrow_f16_rne and narrow_bf16_rne round to nearest even, canonical NaN") {
  for (uint32_t p : f32_patterns()) {
    float f = ref_f32(p);
    INFO("f32 bits " << std::hex << p);
    if (std::isnan(f)) {
      CHECK(narrow_f16_rne(f) == kF16CanonicalNan);
      CHECK(narrow_bf16_rne(f) == kBf16CanonicalNan);
      continue;
    }
    REQUIRE(narrow_f16_rne(f) == ref_f16_bits(static_cast<_Float16>(f)));
    REQUIRE(narrow_bf16_rne(f) == ref_bf16_round(f));
    CHECK(narrow_f16_rne(f) == f32_to_f16(f));  // agrees with common/numeric.h off NaN
  }
  CHECK(ref_f32_bits(canonical_f32(NAN)) == kF32CanonicalNan);
  CHECK(ref_f32_bits(canonical_f32(-NAN)) == kF32CanonicalNan);
}

TEST_CASE("hand-picked f16 and bf16 roundings") {
  // f16 has 10 fraction bits: 2049 lies halfway between 2048 and 2050 -> even 2048 (0x6800);
  // 2051 halfway between 2050 and 2052 -> 2052 (0x6802).
  CHECK(narrow_f16_rne(2049.0f) == 0x6800);
  CHECK(narrow_f16_rne(2051.0f) == 0x6802);
  // 65520 = 65504 + half an ulp (32/2): tie, 65504's fraction 0x3ff is odd -> overflows to inf.
  CHECK(narrow_f16_rne(65519.996f) == 0x7bff);
  CHECK(narrow_f16_rne(65520.0f) == 0x7c00);
  CHECK(narrow_f16_rne(-65520.0f) == 0xfc00);
  // Smallest subnormal 2^-24 = 0x0001; 2^-25 is the tie with 0 -> 0; 1.5*2^-25 -> 0x0001.
  CHECK(narrow_f16_rne(std::ldexp(1.0f, -24)) == 0x0001);
  CHECK(narrow_f16_rne(std::ldexp(1.0f, -25)) == 0x0000);
  CHECK(narrow_f16_rne(-std::ldexp(1.0f, -25)) == 0x8000);
  CHECK(narrow_f16_rne(std::ldexp(1.5f, -25)) == 0x0001);
  CHECK(narrow_f16_rne(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 * 2^-24: tie -> even 2
  // bf16 has 7 fraction bits: 1 + 2^-8 ties to 1.0 (0x3f80); 1 + 3*2^-8 ties to 1 + 2^-6.
  CHECK(narrow_bf16_rne(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);
  CHECK(narrow_bf16_rne(1.0f + std::ldexp(3.0f, -8)) == 0x3f82);
  CHECK(narrow_bf16_rne(std::numeric_limits<float>::max()) == 0x7f80);
}

TEST_CASE("round_to_f16/bf16/f32 follow every rounding mode") {
  const std::vector<uint32_t> patterns = f32_patterns();
  for (int mode = 0; mode < kNumRoundModes; ++mode) {
    auto m = static_cast<RoundMode>(mode);
    auto rm = static_cast<RefRound>(mode);
    INFO("mode " << round_mode_name(m));
    for (size_t i = 0; i < patterns.size(); i += 3) {
      float f = ref_f32(patterns[i]);
      if (std::isnan(f) || std::isinf(f)) continue;
      INFO("f32 bits " << std::hex << patterns[i]);
      REQUIRE(round_to_f16(f, m) == ref_round_16(ref_f16_table(), f, rm));
      REQUIRE(round_to_bf16(f, m) == ref_round_16(ref_bf16_table(), f, rm));
    }
    // s32 -> f32 needs rounding above 2^24.
    for (int64_t v : {int64_t{16777217}, int64_t{16777219}, int64_t{-16777217}, int64_t{INT32_MAX},
                      int64_t{INT32_MIN}, int64_t{123456789}, int64_t{-987654321}}) {
      INFO("s32 " << v);
      CHECK(ref_f32_bits(round_to_f32(static_cast<double>(v), m)) ==
            ref_f32_bits(ref_round_f32(v, rm)));
    }
  }
  // Directed modes past the f16 range: floor/trunc stop at the largest finite value.
  CHECK(round_to_f16(1e6, RoundMode::kFloor) == 0x7bff);
  CHECK(round_to_f16(1e6, RoundMode::kTrunc) == 0x7bff);
  CHECK(round_to_f16(1e6, RoundMode::kCeil) == 0x7c00);
  CHECK(round_to_f16(-1e6, RoundMode::kCeil) == 0xfbff);
  CHECK(round_to_f16(-1e6, RoundMode::kFloor) == 0xfc00);
  // A tiny negative value rounds up to -0 under ceil and trunc.
  CHECK(round_to_f16(-1e-10, RoundMode::kCeil) == 0x8000);
  CHECK(round_to_f16(-1e-10, RoundMode::kFloor) == 0x8001);
}

TEST_CASE("round_to_integral ignores the host rounding mode") {
  // rint: ties to even; round: ties away.
  CHECK(round_to_integral(2.5, RoundMode::kRint) == 2.0);
  CHECK(round_to_integral(3.5, RoundMode::kRint) == 4.0);
  CHECK(round_to_integral(-2.5, RoundMode::kRint) == -2.0);
  CHECK(round_to_integral(-2.5, RoundMode::kAway) == -3.0);
  CHECK(std::signbit(round_to_integral(-0.3, RoundMode::kRint)));
  std::fesetround(FE_UPWARD);
  double r = round_to_integral(2.5, RoundMode::kRint);
  std::fesetround(FE_TONEAREST);
  CHECK(r == 2.0);
}

TEST_CASE("float -> int conversions round by mode and saturate; NaN gives 0") {
  std::vector<uint32_t> patterns = f32_patterns();
  for (float f : {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 127.5f, 128.5f, -128.5f, 255.5f,
                  32767.5f, -32768.5f, 65535.5f, 2147483520.0f, 2147483648.0f, -2147483904.0f,
                  0.49999997f, -0.49999997f})
    patterns.push_back(ref_f32_bits(f));
  for (int mode = 0; mode < kNumRoundModes; ++mode) {
    auto m = static_cast<RoundMode>(mode);
    auto rm = static_cast<RefRound>(mode);
    INFO("mode " << round_mode_name(m));
    for (size_t i = 0; i < patterns.size(); i += 2) {
      uint32_t p = patterns[i];
      INFO("f32 bits " << std::hex << p);
      for (Dtype d : {Dtype::S32, Dtype::S16, Dtype::U16, Dtype::S8, Dtype::U8}) {
        INFO("to " << isa::dtype_name(d));
        uint32_t got = 0;
        convert_element(d, &got, Dtype::F32, &p, m);
        REQUIRE(got == ref_convert(d, Dtype::F32, p, rm));
      }
    }
  }
  // Saturation and NaN, by hand.
  CHECK(saturate_float_to_int<int8_t>(200.0, RoundMode::kRint) == 127);
  CHECK(saturate_float_to_int<uint8_t>(-3.0, RoundMode::kRint) == 0);
  CHECK(saturate_float_to_int<int32_t>(INFINITY, RoundMode::kRint) == INT32_MAX);
  CHECK(saturate_float_to_int<int32_t>(-INFINITY, RoundMode::kRint) == INT32_MIN);
  CHECK(saturate_float_to_int<int16_t>(NAN, RoundMode::kFloor) == 0);
  CHECK(saturate_float_to_int<int16_t>(-2.5, RoundMode::kRint) == -2);
  CHECK(saturate_float_to_int<int16_t>(-2.5, RoundMode::kAway) == -3);
  CHECK(saturate_float_to_int<int16_t>(-2.5, RoundMode::kFloor) == -3);
  CHECK(saturate_float_to_int<int16_t>(-2.5, RoundMode::kCeil) == -2);
  CHECK(saturate_float_to_int<int16_t>(-2.5, RoundMode::kTrunc) == -2);
}

TEST_CASE("int -> int conversions saturate") {
  CHECK(saturate_int<int8_t>(300) == 127);
  CHECK(saturate_int<int8_t>(-300) == -128);
  CHECK(saturate_int<uint16_t>(-1) == 0);
  CHECK(saturate_int<uint16_t>(70000) == 65535);
  CHECK(saturate_int<int16_t>(40000) == 32767);
  CHECK(saturate_int<uint8_t>(255) == 255);
}

TEST_CASE("convert_element: every pair of element types and every mode") {
  const Dtype types[] = {Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::S32,
                         Dtype::S16, Dtype::S8,  Dtype::U8,   Dtype::U16};
  std::mt19937 rng(7);
  for (Dtype src : types) {
    // Random bit patterns plus values near each integer type's limits and rounding ties.
    std::vector<uint32_t> values;
    for (int i = 0; i < 300; ++i) values.push_back(rng());
    for (float f : {0.5f, 2.5f, -2.5f, 127.5f, 200.0f, -129.0f, 40000.5f, -40000.0f, 70000.0f,
                    3e9f, -3e9f, 1e-30f, -0.0f, INFINITY, -INFINITY, NAN}) {
      uint32_t b = 0;
      convert_element(src, &b, Dtype::F32, &f, RoundMode::kTrunc);  // in src's encoding
      values.push_back(b);
    }
    for (Dtype dst : types) {
      for (int mode = 0; mode < kNumRoundModes; ++mode) {
        INFO(isa::dtype_name(src) << " -> " << isa::dtype_name(dst) << " mode " << mode);
        for (uint32_t v : values) {
          uint32_t s = v & (isa::dtype_size(src) == 4 ? 0xffffffffu
                                                        : (1u << (8 * isa::dtype_size(src))) - 1);
          uint32_t got = 0;
          convert_element(dst, &got, src, &s, static_cast<RoundMode>(mode));
          INFO("source bits " << std::hex << s);
          REQUIRE(got == ref_convert(dst, src, s, static_cast<RefRound>(mode)));
        }
      }
    }
  }
  uint32_t x = 0;
  CHECK_THROWS_AS(convert_element(Dtype::S64, &x, Dtype::F32, &x, RoundMode::kRint), Error);
}

TEST_CASE("int -> float at the edge of exact integers, in any host rounding mode") {
  // Integers the destination holds exactly convert without rounding (a fast path); the first
  // ones past it round by mode. Both sides of each edge against the reference, also with the
  // host rounding upward (the fast path must not depend on it).
  std::vector<int32_t> values;
  for (int64_t edge : {int64_t{1} << 8, int64_t{1} << 11, int64_t{1} << 24})
    for (int64_t d = -5; d <= 5; ++d)
      for (int64_t sign : {1, -1}) values.push_back(static_cast<int32_t>(sign * (edge + d)));
  values.push_back(std::numeric_limits<int32_t>::min());
  values.push_back(std::numeric_limits<int32_t>::max());
  for (int host : {FE_TONEAREST, FE_UPWARD}) {
    std::fesetround(host);
    for (Dtype dst : {Dtype::F32, Dtype::F16, Dtype::BF16})
      for (int mode = 0; mode < kNumRoundModes; ++mode)
        for (int32_t v : values) {
          uint32_t got = 0;
          convert_element(dst, &got, Dtype::S32, &v, static_cast<RoundMode>(mode));
          std::fesetround(FE_TONEAREST);  // for the reference's and Catch's own arithmetic
          const uint32_t want =
              ref_convert(dst, Dtype::S32, static_cast<uint32_t>(v), static_cast<RefRound>(mode));
          INFO(isa::dtype_name(dst) << " mode " << mode << " value " << v << " host " << host);
          REQUIRE(got == want);
          std::fesetround(host);
        }
    std::fesetround(FE_TONEAREST);
  }
  // round_to_integral's ties at the largest magnitudes that have them (below 2^52).
  for (double x : {4503599627370495.5, -4503599627370495.5, 4503599627370494.5, 2251799813685248.5})
    for (int mode = 0; mode < kNumRoundModes; ++mode)
      CHECK(round_to_integral(x, static_cast<RoundMode>(mode)) ==
            static_cast<double>(ref_round_integer(x, static_cast<RefRound>(mode))));
}

TEST_CASE("int -> float past the exact integers: ties and near-ties, in any host rounding mode") {
  // f32 and bf16 round such integers in integer arithmetic (round_integer_to_bits), f16 by the
  // general routine: every mode against the reference at each rounding boundary -- the kept bits
  // even and odd, the dropped bits just below, at and above half -- for 1..8 and 20 dropped bits.
  std::vector<int32_t> values;
  for (int kept_bits : {8, 11, 24})
    for (int drop : {1, 2, 3, 8, 20}) {
      if (kept_bits + drop > 31) continue;
      const int64_t unit = int64_t{1} << drop, half = unit / 2;
      for (int64_t kept : {(int64_t{1} << (kept_bits - 1)) + 1, (int64_t{1} << kept_bits) - 2,
                           (int64_t{1} << kept_bits) - 1, int64_t{1} << (kept_bits - 1)})
        for (int64_t dropped : {int64_t{0}, int64_t{1}, half - 1, half, half + 1, unit - 1})
          for (int64_t sign : {1, -1})
            values.push_back(static_cast<int32_t>(sign * (kept * unit + dropped)));
    }
  std::mt19937 rng(11);
  for (int i = 0; i < 2000; ++i) values.push_back(static_cast<int32_t>(rng()));
  for (int host : {FE_TONEAREST, FE_UPWARD, FE_TOWARDZERO}) {
    for (Dtype dst : {Dtype::F32, Dtype::F16, Dtype::BF16})
      for (int mode = 0; mode < kNumRoundModes; ++mode)
        for (int32_t v : values) {
          std::fesetround(host);
          uint32_t got = 0;
          convert_element(dst, &got, Dtype::S32, &v, static_cast<RoundMode>(mode));
          std::fesetround(FE_TONEAREST);
          const uint32_t want =
              ref_convert(dst, Dtype::S32, static_cast<uint32_t>(v), static_cast<RefRound>(mode));
          INFO(isa::dtype_name(dst) << " mode " << mode << " value " << v << " host " << host);
          REQUIRE(got == want);
        }
  }
  // 64-bit magnitudes: the largest rounds up to 2^63 without overflow, the smallest is exact.
  const int64_t lo = std::numeric_limits<int64_t>::min(), hi = std::numeric_limits<int64_t>::max();
  for (int mode = 0; mode < kNumRoundModes; ++mode) {
    const auto m = static_cast<RoundMode>(mode);
    CHECK(round_integer_to_bits(lo, 24, m) == -std::ldexp(1.0, 63));
    const bool up = m == RoundMode::kRint || m == RoundMode::kAway || m == RoundMode::kCeil;
    CHECK(round_integer_to_bits(hi, 24, m) ==
          (up ? std::ldexp(1.0, 63) : std::ldexp(1.0, 63) - std::ldexp(1.0, 39)));
  }
}

TEST_CASE("round mode field decoding") {
  CHECK(round_mode_from_field(0) == RoundMode::kRint);
  CHECK(round_mode_from_field(4) == RoundMode::kTrunc);
  CHECK(!round_mode_from_field(5));
  CHECK(!round_mode_from_field(-1));
  CHECK(std::string(round_mode_name(RoundMode::kAway)) == "round");
}
