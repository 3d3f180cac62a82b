// The vector unit's bulk f32 <-> f16 conversions (sim/exec/f16_bulk.h, *_canonical_n): every
// non-NaN result equals GCC's _Float16 conversion (IEEE round to nearest even; widening exact),
// every NaN result is the canonical NaN of common/convert.h (f16 0x7e00, f32 0x7fc00000), on the
// hardware (F16C) path where the host has one and on the portable path.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "sim/exec/f16_bulk.h"

using namespace npusim;

namespace {

uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
uint16_t ref_narrow(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  if (std::isnan(f)) return 0x7e00u;
  _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
uint32_t ref_widen(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  float f = static_cast<float>(h);
  return std::isnan(f) ? 0x7fc00000u : f32_bits(f);
}

// f32 patterns: a prime stride through all 2^32 (every class: zeros, subnormals, normals,
// infinities, NaNs with assorted payloads), every f16 value and the midpoints around it (ties
// and near-ties), the f16 overflow edge, and random patterns.
std::vector<uint32_t> f32_patterns() {
  std::vector<uint32_t> p;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 65521) p.push_back(static_cast<uint32_t>(b));
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    _Float16 a, c;
    uint16_t hb = static_cast<uint16_t>(h), hn = static_cast<uint16_t>(h + 1);
    std::memcpy(&a, &hb, 2);
    std::memcpy(&c, &hn, 2);
    float v = static_cast<float>(a), mid = (v + static_cast<float>(c)) / 2;  // exact in f32
    for (float f : {v, mid, std::nextafterf(mid, 0.0f), std::nextafterf(mid, INFINITY)}) {
      p.push_back(f32_bits(f));
      p.push_back(f32_bits(-f));
    }
  }
  for (uint32_t u : {0x7f800000u, 0xff800000u, 0x7f800001u, 0x7fc00000u, 0xffc00001u, 0x7fa02000u,
                     0x477fefffu, 0x477ff000u, 0x47800000u, 0x33000000u, 0x33000001u})
    p.push_back(u);
  std::mt19937 rng(7);
  for (int i = 0; i < (1 << 16); ++i) p.push_back(static_cast<uint32_t>(rng()));
  return p;
}

}  // namespace

TEST_CASE("f32_to_f16_canonical_n rounds to nearest even and canonicalises NaN", "[f16_bulk]") {
  const std::vector<uint32_t> in = f32_patterns();
  for (bool hw : {true, false}) {
    // From an odd byte offset, with a tail shorter than a group of eight.
    std::vector<uint8_t> src(4 * in.size() + 1), dst(2 * in.size() + 1);
    std::memcpy(src.data() + 1, in.data(), 4 * in.size());
    const size_t head = in.size() - 5;
    f32_to_f16_canonical_n(src.data() + 1, dst.data() + 1, head, hw);
    f32_to_f16_canonical_n(src.data() + 1 + 4 * head, dst.data() + 1 + 2 * head, 5, hw);
    for (size_t i = 0; i < in.size(); ++i) {
      uint16_t got;
      std::memcpy(&got, dst.data() + 1 + 2 * i, 2);
      if (got == ref_narrow(in[i])) continue;  // one assertion per mismatch keeps it fast
      INFO("f32 bits " << in[i] << (hw ? " (hardware path)" : " (portable path)"));
      CHECK(got == ref_narrow(in[i]));
    }
  }
}

TEST_CASE("f16_to_f32_canonical_n widens exactly and canonicalises NaN", "[f16_bulk]") {
  for (bool hw : {true, false}) {
    std::vector<uint8_t> src(2 * 0x10000 + 1), dst(4 * 0x10000 + 1);
    for (uint32_t b = 0; b < 0x10000u; ++b) {
      uint16_t h = static_cast<uint16_t>(b);
      std::memcpy(src.data() + 1 + 2 * b, &h, 2);
    }
    const size_t head = 0x10000 - 3;
    f16_to_f32_canonical_n(src.data() + 1, dst.data() + 1, head, hw);
    f16_to_f32_canonical_n(src.data() + 1 + 2 * head, dst.data() + 1 + 4 * head, 3, hw);
    for (uint32_t b = 0; b < 0x10000u; ++b) {
      uint32_t got;
      std::memcpy(&got, dst.data() + 1 + 4 * b, 4);
      uint32_t want = ref_widen(static_cast<uint16_t>(b));
      if (got == want) continue;
      INFO("f16 bits " << b << (hw ? " (hardware path)" : " (portable path)"));
      CHECK(got == want);
    }
  }
}
