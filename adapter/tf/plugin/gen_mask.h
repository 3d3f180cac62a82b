// The host's dropout mask generator behind DropOutGenMask (kernels_gen_mask.cpp): TensorFlow's
// StatelessRandomUniformV2 bits (Philox4x32-10 as tsl/lib/random/philox_random.h computes it,
// the uniform distributions of random_distributions.h; adapter/compiler/ops/random.h derives
// them) compared with a rate, as the AI CPU computes the mask.
#pragma once

#include <array>
#include <cstdint>

namespace npusim::tf {

// The uniform's dtype: which mantissa bits of a 32-bit Philox word make the value in [0, 1).
enum class UniformType { f32, f16, bf16 };

// Philox4x32-10 of the 128-bit counter c (four u32 words, low first) under the 64-bit key
// (k0 low word, k1 high): the generator's four u32 outputs.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> c, uint32_t k0, uint32_t k1);

// TF's uniform value in [0, 1) of dtype `type` for the Philox word u, as a float (exact: the
// dtype's value has at most 23 mantissa bits).
float uniform_value(uint32_t u, UniformType type);

// mask[i] = 1 if uniform element i >= rate else 0, for i < n: element i is word i % 4 of
// Philox of the counter (counter_lo, counter_hi) + i / 4 (128-bit add) under `key` (TF's
// uint64 key and counter tensors).
void gen_mask(uint64_t key, uint64_t counter_lo, uint64_t counter_hi, UniformType type, float rate,
              uint8_t* mask, uint64_t n);

}  // namespace npusim::tf
