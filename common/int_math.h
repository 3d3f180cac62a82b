// Integer helpers for sizes, counts and tilings, shared by the compiler's ops, the ISA's layouts
// (isa/layout.h) and the simulator (one definition). Arguments are non-negative and the divisor
// positive; results are exact (no floating point).
#pragma once

#include <cstdint>
#include <type_traits>

namespace npusim {

// Smallest q with q * b >= a.
inline constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Smallest multiple of b that is >= a.
inline constexpr int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
// The same in uint64_t arithmetic (wrapping, never undefined, for operand values a program
// controls), chosen only when both arguments are uint64_t; any other call takes the int64_t form.
template <typename U, std::enable_if_t<std::is_same_v<U, uint64_t>, int> = 0>
inline constexpr U ceil_div(U a, U b) {
  return (a + b - 1) / b;
}
template <typename U, std::enable_if_t<std::is_same_v<U, uint64_t>, int> = 0>
inline constexpr U round_up(U a, U b) {
  return ceil_div(a, b) * b;
}
// Smallest l with 2^l >= v (v >= 1): the exact log2 of a power of two, e.g. a shift amount.
inline constexpr int ceil_log2(int64_t v) {
  int l = 0;
  while ((int64_t{1} << l) < v) ++l;
  return l;
}

}  // namespace npusim
