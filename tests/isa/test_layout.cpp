// The ISA's layout geometry (isa/layout.h) and the integer helpers it uses (common/int_math.h):
// each extent is the smallest prefix holding every element of its layout, and sizes a program
// controls are computed in uint64_t arithmetic.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/int_math.h"
#include "isa/layout.h"

using namespace npusim;

TEST_CASE("ceil_div and round_up keep uint64_t sizes in uint64_t arithmetic") {
  const uint64_t big = uint64_t{1} << 63;  // not an int64_t value
  static_assert(std::is_same_v<decltype(ceil_div(big, uint64_t{2})), uint64_t>);
  CHECK(ceil_div(big, uint64_t{2}) == uint64_t{1} << 62);
  CHECK(ceil_div(big + 1, uint64_t{2}) == (uint64_t{1} << 62) + 1);
  CHECK(round_up(big - 3, uint64_t{16}) == big);
  // Mixed and signed arguments keep the int64_t form.
  static_assert(std::is_same_v<decltype(ceil_div(uint64_t{7}, 2)), int64_t>);
  static_assert(std::is_same_v<decltype(ceil_div(7, 2)), int64_t>);
  CHECK(round_up(int64_t{33}, int64_t{16}) == 48);
}

TEST_CASE("each layout extent is one past the largest offset of its elements") {
  for (uint64_t elem_bytes : {1, 2, 4}) {
    const uint64_t k0 = layout::c0_of(elem_bytes);
    CHECK(k0 * elem_bytes == layout::kBlockBytes);
    for (uint64_t m : {1, 15, 16, 17, 40})
      for (uint64_t k : {uint64_t{1}, k0 - 1, k0, k0 + 1, 3 * k0 + 5}) {
        uint64_t zz = 0, zn = 0, l0c = 0;
        for (uint64_t r = 0; r < m; ++r)
          for (uint64_t c = 0; c < k; ++c) {
            zz = std::max(zz, layout::zz_offset(r, c, (k + k0 - 1) / k0, k0) + 1);
            // B is k x n: here k rows (kk < k) and m columns (nn < m).
            zn = std::max(zn, layout::zn_offset(c, r, (m + 15) / 16, k0) + 1);
            l0c = std::max(l0c, layout::l0c_offset(r, c, (m + 15) / 16 * 16) + 1);
          }
        INFO("elem_bytes " << elem_bytes << " m " << m << " k " << k);
        CHECK(layout::zz_extent(m, k, k0) == zz);
        CHECK(layout::zn_extent(k, m, k0) == zn);
        CHECK(layout::l0c_extent(m, k) == l0c);
      }
  }
}

TEST_CASE("a vector repeat is 8 blocks of 32 bytes") {
  CHECK(vec::kBlockBytes == 32);
  CHECK(vec::kRepeatBytes == vec::kBlocksPerRepeat * 32);
  CHECK(vec::kTransposeBytes == 2 * vec::kRepeatBytes);  // vtranspose counts two repeats
}
