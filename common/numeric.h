// Bit-exact conversions between fp32 and the 16-bit float formats, as the hardware rounds them
// (IEEE round-to-nearest-even, with subnormals, infinities and NaN preserved). Eigen's half and
// bfloat16 types do the conversions.
#pragma once

#include <cstdint>
#include <cstring>

#include <Eigen/Core>

namespace npusim {

inline float f16_to_f32(uint16_t bits) {
  return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(bits));
}
inline uint16_t f32_to_f16(float v) {
  return Eigen::numext::bit_cast<uint16_t>(Eigen::half(v));
}
inline float bf16_to_f32(uint16_t bits) {
  return static_cast<float>(Eigen::numext::bit_cast<Eigen::bfloat16>(bits));
}
inline uint16_t f32_to_bf16(float v) {
  return Eigen::numext::bit_cast<uint16_t>(Eigen::bfloat16(v));
}
inline float bits_to_f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t f32_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

}  // namespace npusim
