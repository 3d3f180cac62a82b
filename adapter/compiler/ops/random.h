// Stateless random numbers with TensorFlow's bits: Philox4x32-10 (Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3", SC'11) as TF implements it (tsl/lib/random/
// philox_random.h: 128-bit counter as four u32 words, 64-bit key as two u32 words, ten rounds,
// the key raised by (0x9E3779B9, 0xBB67AE85) between rounds, multipliers 0xD2511F53 and
// 0xCD9E8D57), and TF's uniform distributions (random_distributions.h).
//
// The ops (registered in ops/registry.cpp):
// - StatelessRandomGetKeyCounter: inputs seed (s32 or s64 [2]); outputs key (s64[1]) and
//   counter (s64[2]), TF's uint64 tensors stored as s64 (same bits). TF's scrambling: the seeds,
//   sign-extended to 64 bits, are the counter (seed0 low word first), the key is (0x3ec8f720,
//   0x02461e29); one Philox call gives mix[0..3]; key = mix[0] | mix[1] << 32, counter =
//   {0, mix[2] | mix[3] << 32}.
// - StatelessRandomUniformV2: inputs (shape, key s64[1], counter s64[>= 2], alg s32[]), the
//   shape and alg tensors in host memory (their values come as attributes "shape" (list(int);
//   else OpDesc::outputs[0] gives the shape) and "alg" (int, default 1); no kernel reads those
//   inputs); attribute "dtype" f32 (default), f16 or bf16. alg 1 (Philox) and 3 (auto-select:
//   Philox, as TF); 2 (ThreeFry) is rejected, as TF's CPU kernel does.
//   Output element i = TF's UniformDistribution of sample i % 4 of group g = i / 4, group g
//   being Philox of counter + g (128-bit add; TF's FillPhiloxRandom skips the generator by g):
//   f32: (u & 0x7fffff) * 2^-23, f16: (u & 0x3ff) * 2^-10, bf16: (u & 0x7f) * 2^-7 (TF builds
//   1.mantissa and subtracts 1, which is exact, so these are its values bit for bit).
//
// StatelessRandomUniformV2 of kRandomVectorMinGroups groups or more runs on the vector unit
// (random_vector.cpp: Philox over a tile of groups at once from 16-bit pieces, the words
// interleaved into output order by vtranspose; ~5.2 cycles per f32 output on the 910, 15x fewer
// than the scalar kernel, docs/compiler.md "Random numbers"). Smaller tensors and
// StatelessRandomGetKeyCounter run on the scalar unit (sim/exec/scalar_alu.h: 64-bit registers;
// a 64-bit `mul` of two zero-extended u32 words is the exact 32x32->64 product Philox needs).
// Scalar cost: ~14 scalar instructions per Philox round, ~140 per group of four outputs, 36 per
// f32 output to build its float bits (no scalar float unit: a leading-zero count by binary
// search, without branches so that the timing does not depend on the random bits and a launch
// replays at the next step's key; 30 for f16, 24 for bf16), ~75 scalar instructions per f32
// output in all; groups are spread over the vector cores (at least kRandomMinGroupsPerBlock per
// block).
#pragma once

#include <array>
#include <cstdint>

#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

inline constexpr int64_t kRandomMinGroupsPerBlock = 64;
// From this many Philox groups on, StatelessRandomUniformV2 runs on the vector unit: the
// crossover measured on 910b (one vector tile, 13.3 k cycles, against the scalar kernel's ~300
// cycles per group up to kRandomMinGroupsPerBlock per block: 13.0 k cycles for 32 groups,
// 17.9 k for 48; `npusim op StatelessRandomUniformV2 ... --attr shape=[N]`, 2026-12-04).
inline constexpr int64_t kRandomVectorMinGroups = 33;

// Philox4x32 constants (philox_random.h): round multipliers and the key schedule's increments.
inline constexpr int64_t kPhiloxM0 = 0xD2511F53;
inline constexpr int64_t kPhiloxM1 = 0xCD9E8D57;
inline constexpr int64_t kPhiloxW0 = 0x9E3779B9;
inline constexpr int64_t kPhiloxW1 = 0xBB67AE85;
inline constexpr int64_t kPhiloxGroup = 4;  // outputs per Philox call

// (hi, lo) += g: the 128-bit counter as its 64-bit halves, g a register (0 <= g < 2^63), on the
// scalar unit without a branch.
void emit_counter_add(KernelBuilder& b, const Reg& lo, const Reg& hi, const Reg& g);

// StatelessRandomUniformV2 of n elements of dtype (F32, F16, BF16) on the vector unit
// (random_vector.cpp); op's inputs 1 and 2 are the key and counter, checked by the caller.
Launch build_uniform_vector_launch(const OpDesc& op, DataType dtype, int64_t n,
                                   const ChipConfig& cfg);

// One half of a Philox round on the scalar unit: hi_out = (product >> 32) ^ c ^ k, lo_out =
// product & (2^32 - 1), product the exact 64-bit product of a word and its multiplier; c is read
// before lo_out is written (they may be one register).
void emit_philox_mix(KernelBuilder& b, const Reg& hi_out, const Reg& lo_out, const Reg& product,
                     const Reg& c, const Reg& k);

// Philox4x32-10 in place on the scalar unit: c[0..3] (u32 words, zero-extended in 64-bit
// registers) become the generator's output for counter c and key (k0, k1) (u32 words); k0, k1
// are clobbered (raised nine times, kept to 32 bits).
void emit_philox4x32_10(KernelBuilder& b, const std::array<const Reg*, 4>& c, const Reg& k0,
                        const Reg& k1);

CompiledKernel compile_random(const CompileContext& ctx);

}  // namespace npusim::compiler::ops
