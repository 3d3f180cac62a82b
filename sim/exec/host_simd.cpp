#include "sim/exec/host_simd.h"

#include <cstdlib>
#include <stdexcept>
#include <string>

#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>
#define NPUSIM_HOST_SIMD_X86 1
#endif

namespace npusim {
namespace {

HostSimd detected_simd() {
#ifdef NPUSIM_HOST_SIMD_X86
  // F16C from CPUID leaf 1 (ECX bit 29): __builtin_cpu_supports does not know it on every
  // compiler.
  unsigned eax, ebx, ecx, edx;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
  const bool avx2 = __builtin_cpu_supports("avx") && __builtin_cpu_supports("avx2") &&
                    __builtin_cpu_supports("fma") && f16c;
  if (avx2 && __builtin_cpu_supports("avx512f")) return HostSimd::kAvx512;
  if (avx2) return HostSimd::kAvx2;
#endif
  return HostSimd::kGeneric;
}

HostSimd capped_simd() {
  const HostSimd host = detected_simd();
  const char* cap = std::getenv("NPUSIM_HOST_SIMD");
  if (cap == nullptr || *cap == '\0') return host;
  const std::string value(cap);
  HostSimd limit;
  if (value == "avx512") {
    limit = HostSimd::kAvx512;
  } else if (value == "avx2") {
    limit = HostSimd::kAvx2;
  } else if (value == "generic") {
    limit = HostSimd::kGeneric;
  } else {
    throw std::invalid_argument("NPUSIM_HOST_SIMD='" + value +
                                "': expected avx512, avx2 or generic");
  }
  return static_cast<int>(limit) < static_cast<int>(host) ? limit : host;
}

}  // namespace

HostSimd host_simd() {
  static const HostSimd level = capped_simd();
  return level;
}

}  // namespace npusim
