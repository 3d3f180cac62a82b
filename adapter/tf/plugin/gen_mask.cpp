#include "adapter/tf/plugin/gen_mask.h"

namespace npusim::tf {
namespace {

// Philox4x32 constants (philox_random.h): the round multipliers and the key schedule's
// increments.
constexpr uint32_t kM0 = 0xD2511F53, kM1 = 0xCD9E8D57;
constexpr uint32_t kW0 = 0x9E3779B9, kW1 = 0xBB67AE85;
constexpr int kRounds = 10;
constexpr uint64_t kWordsPerCall = 4;

}  // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < kRounds; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    const uint64_t p0 = uint64_t{kM0} * c[0];
    const uint64_t p1 = uint64_t{kM1} * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k1, static_cast<uint32_t>(p0)};
  }
  return c;
}

float uniform_value(uint32_t u, UniformType type) {
  switch (type) {
    case UniformType::f16: return static_cast<float>(u & 0x3ffu) * 0x1p-10f;
    case UniformType::bf16: return static_cast<float>(u & 0x7fu) * 0x1p-7f;
    case UniformType::f32: break;
  }
  return static_cast<float>(u & 0x7fffffu) * 0x1p-23f;
}

void gen_mask(uint64_t key, uint64_t counter_lo, uint64_t counter_hi, UniformType type, float rate,
              uint8_t* mask, uint64_t n) {
  const uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (uint64_t g = 0; g * kWordsPerCall < n; ++g) {
    const uint64_t lo = counter_lo + g;
    const uint64_t hi = counter_hi + (lo < counter_lo ? 1 : 0);
    const std::array<uint32_t, 4> words =
        philox4x32_10({static_cast<uint32_t>(lo), static_cast<uint32_t>(lo >> 32),
                       static_cast<uint32_t>(hi), static_cast<uint32_t>(hi >> 32)},
                      k0, k1);
    for (uint64_t j = 0; j < kWordsPerCall && g * kWordsPerCall + j < n; ++j)
      mask[g * kWordsPerCall + j] = uniform_value(words[j], type) >= rate ? 1 : 0;
  }
}

}  // namespace npusim::tf
