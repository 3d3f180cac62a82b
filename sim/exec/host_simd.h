// The emulator's x86-64 fast paths (cube tiles, f16 <-> f32 bulk conversions, the vector
// unit's f32 element loops) are picked at run time by the host's SIMD level. Every fast path
// gives the generic code's bits for every input, so the level changes the emulator's speed,
// never a simulated value or cycle. NPUSIM_HOST_SIMD caps the level ("avx512", "avx2" or
// "generic"; unset: the host's own), so that one host runs the paths another host would:
// the exec tests run once per level (CMakeLists.txt), on an AVX-512 host that covers what an
// AVX2-only host (AMD EPYC before Zen 4) and a host without AVX run.
#pragma once

namespace npusim {

enum class HostSimd {
  kGeneric = 0,  // portable C++ (SSE2 on x86-64)
  kAvx2 = 1,     // AVX, AVX2, FMA and F16C
  kAvx512 = 2,   // the above and AVX-512F
};

// The level the fast paths use: the host's, capped by NPUSIM_HOST_SIMD. Read once per process.
// Throws std::invalid_argument naming the variable when its value is none of the three.
HostSimd host_simd();

// Whether the fast paths may use `level` (host_simd() >= level).
inline bool host_simd_at_least(HostSimd level) {
  return static_cast<int>(host_simd()) >= static_cast<int>(level);
}

}  // namespace npusim
