// Bulk f16 <-> f32 conversions (sim/exec/f16_bulk.h): bit-identical to the scalar functions of
// common/numeric.h for every f16 pattern and for a sweep plus a large random set of f32 patterns,
// on the hardware path where the host has one (F16C; AVX-512 for f16_to_f32_n) and on the
// portable path; non-NaN results are also checked against GCC's _Float16 (IEEE round to nearest
// even).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/numeric.h"
#include "sim/exec/f16_bulk.h"

using namespace npusim;

namespace {

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float f32_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t ref_f16_bits(float f) {  // GCC's conversion: round to nearest even
  _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
float ref_f16_value(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}

// f32 patterns: a prime stride through all 2^32, every f16 value with the midpoints around it
// (ties and near-ties), the format edges, NaNs with assorted payloads, and 2^20 random patterns.
std::vector<uint32_t> f32_patterns() {
  std::vector<uint32_t> p;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 4099) p.push_back(static_cast<uint32_t>(b));
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    float v = ref_f16_value(static_cast<uint16_t>(h));
    float mid = (v + ref_f16_value(static_cast<uint16_t>(h + 1))) / 2;  // exact in f32
    for (float f : {v, mid, std::nextafterf(mid, 0.0f), std::nextafterf(mid, INFINITY)}) {
      p.push_back(f32_bits(f));
      p.push_back(f32_bits(-f));
    }
  }
  for (uint32_t u : {0x7f800000u, 0xff800000u, 0x7f800001u, 0x7fc00000u, 0x7fffffffu, 0xffc00001u,
                     0x7fa02000u, 0x7f801fffu, 0x477fefffu, 0x477ff000u, 0x47800000u, 0x33000000u,
                     0x33000001u, 0x32ffffffu, 0x00000001u, 0x80000001u, 0x387fc000u})
    p.push_back(u);
  std::mt19937 rng(2024);
  for (int i = 0; i < (1 << 20); ++i) p.push_back(static_cast<uint32_t>(rng()));
  return p;
}

void check_f16_to_f32(bool hw) {
  std::vector<uint16_t> in(0x10000);
  for (uint32_t b = 0; b < 0x10000u; ++b) in[b] = static_cast<uint16_t>(b);
  // Converted from an odd byte offset and with a tail shorter than a group of eight.
  std::vector<uint8_t> raw(2 * in.size() + 1);
  std::memcpy(raw.data() + 1, in.data(), 2 * in.size());
  std::vector<float> out(in.size() + 1, -1.0f);
  f16_to_f32_n(raw.data() + 1, out.data(), in.size() - 3, hw);
  f16_to_f32_n(raw.data() + 1 + 2 * (in.size() - 3), out.data() + in.size() - 3, 3, hw);
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    float want = ref_f16_value(in[b]);
    bool ok = f32_bits(out[b]) == f32_bits(f16_to_f32(in[b])) &&
              (std::isnan(want) ? std::isnan(out[b]) : f32_bits(out[b]) == f32_bits(want));
    if (ok) continue;  // one assertion per mismatch keeps the sweep fast
    INFO("f16 bits " << b << (hw ? " (hardware path)" : " (portable path)"));
    CHECK(f32_bits(out[b]) == f32_bits(f16_to_f32(in[b])));
    CHECK(f32_bits(out[b]) == f32_bits(want));
    FAIL("mismatch");
  }
  CHECK(out.back() == -1.0f);  // nothing written past n
}

void check_f32_to_f16(bool hw) {
  std::vector<uint32_t> bits = f32_patterns();
  std::vector<float> in(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) in[i] = f32_of(bits[i]);
  std::vector<uint8_t> raw(2 * in.size() + 3, 0xab);
  f32_to_f16_n(in.data(), raw.data() + 1, in.size(), hw);
  CHECK(raw[2 * in.size() + 1] == 0xab);  // nothing written past n
  for (size_t i = 0; i < in.size(); ++i) {
    uint16_t got;
    std::memcpy(&got, raw.data() + 1 + 2 * i, 2);
    // NaN: the canonical f16 NaN (with the sign), as f32_to_f16.
    uint16_t want = std::isnan(in[i]) ? uint16_t(0x7e00u | ((bits[i] >> 16) & 0x8000u))
                                      : ref_f16_bits(in[i]);
    if (got == want && got == f32_to_f16(in[i])) continue;
    INFO("f32 bits " << bits[i] << (hw ? " (hardware path)" : " (portable path)"));
    CHECK(got == f32_to_f16(in[i]));
    CHECK(got == want);
    FAIL("mismatch");
  }
}

}  // namespace

TEST_CASE("f16_to_f32_n matches f16_to_f32 for every f16 pattern") {
  INFO("host F16C path: " << f16_bulk_uses_hardware());
  check_f16_to_f32(true);
  check_f16_to_f32(false);
}

TEST_CASE("f32_to_f16_n matches f32_to_f16 (round to nearest even, NaN canonical)") {
  INFO("host F16C path: " << f16_bulk_uses_hardware());
  check_f32_to_f16(true);
  check_f32_to_f16(false);
}
