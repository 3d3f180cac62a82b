// The cube instruction mmad: C[m,n] (L0C, NZ) = init + A[m,k] (L0A, Zz) * B[k,n] (L0B, Zn).
// Layouts: isa/layout.h. Only elements r < m, c < k (A), c < k, n' < n (B) are read and only
// C[r < m][n' < n] is written, so partially used fractals are fine.
//
// Arithmetic (bit-accurate contract):
//   f16 / bf16 / f32 inputs, fp32 accumulator: every input is widened to fp32 exactly; each
//   product a*b is formed in fp32 (exact for f16 and bf16 inputs unless it leaves the fp32
//   range; rounded to nearest even for f32 inputs) and added to the accumulator in fp32,
//   rounding to nearest even after every addition. Summation order per output element:
//     C[r][c] = (((init + A[r][0]*B[0][c]) + A[r][1]*B[1][c]) + ...) + A[r][k-1]*B[k-1][c]
//   i.e. strictly sequential in k, starting from init (0, the L0C value, or bias[c]).
//   s8 inputs, s32 accumulator: exact integer sums, wrapping modulo 2^32 on overflow.
#include <algorithm>
#include <cstring>
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "common/int_math.h"
#include "common/numeric.h"
#include "isa/layout.h"
#include "sim/exec/exec.h"
#include "sim/exec/f16_bulk.h"
#include "sim/exec/host_simd.h"
#include "sim/exec/mte_common.h"

namespace npusim {
namespace {

using isa::Buf;
using isa::Dtype;
using layout::kFractalRows;
using mte::Operands;

// The inner product kernel. A register tile of MR rows x NR columns of C is held in
// accumulators while k runs, so every element still sums in sequential k order and the result
// does not depend on the tile shape or the instruction set. Variants for AVX-512 / AVX2 hosts
// are picked at run time; none may fuse the multiply and the add implicitly (FMA would round
// once instead of twice), hence fp-contract=off for this file (GCC contracts by default in C++
// modes); only the fp16 variant fuses, explicitly, where that is exact (kFused).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

// A view of an MR x NR tile of C in L0C's NZ form: element (i, jj) at
// p[(jj / 16) * block_stride + i * row_stride + jj % 16] (elements). L0C itself has
// row_stride 16 and block_stride 16 * m16; a bias row has row_stride 0 (every row reads it).
template <typename T>
struct CView {
  T* p;
  uint64_t row_stride, block_stride;
  inline __attribute__((always_inline)) T& at(uint64_t i, uint64_t jj) const {
    return p[(jj / kFractalRows) * block_stride + i * row_stride + jj % kFractalRows];
  }
};

#if defined(__GNUC__) && defined(__x86_64__)
// tile_product<float, 16, MR, 16 * NB, true> (below) in AVX-512 registers, MR <= 8 rows, NB = 1
// or 2 blocks of 16 columns: the same fused multiply-adds on every element in the same k order
// (so the same bits), written with intrinsics so that each A value is broadcast straight from
// memory (a load) rather than loaded as a vector and shuffled on the FMA ports: the generic loop
// compiled so ran at ~2/3 of the rate its FMAs allow.
// One step of the sum: acc[i][h] += A[i][kk] * B[kk][16 h ..], acol = &A[0][kk] (rows K0
// apart), brow = &B[kk][0].
template <uint64_t MR, uint64_t NB>
__attribute__((target("avx512f,fma"), always_inline)) inline void fma_step_avx512(
    __m512 (&acc)[MR][NB], const float* acol, const float* brow) {
  constexpr uint64_t K0 = 16;
  __m512 bv[NB];
  for (uint64_t h = 0; h < NB; ++h) bv[h] = _mm512_loadu_ps(brow + h * kFractalRows);
#pragma GCC unroll 8
  for (uint64_t i = 0; i < MR; ++i) {
    const __m512 av = _mm512_set1_ps(acol[i * K0]);
    for (uint64_t h = 0; h < NB; ++h) acc[i][h] = _mm512_fmadd_ps(av, bv[h], acc[i][h]);
  }
}

template <uint64_t MR, uint64_t NB>
// (The views by reference: passed by value, the caller's stores of their fields and the call's
// wider loads of them missed store forwarding, a stall per tile.)
__attribute__((target("avx512f,fma"))) void tile_product_fma_avx512(
    const float* __restrict a, const float* __restrict b, uint64_t ld_b, uint64_t k,
    const uint32_t* k_index, const CView<const float>& in, const CView<float>& out) {
  constexpr uint64_t K0 = 16;
  __m512 acc[MR][NB];
  for (uint64_t i = 0; i < MR; ++i)
    for (uint64_t h = 0; h < NB; ++h)
      acc[i][h] = in.p ? _mm512_loadu_ps(&in.at(i, h * kFractalRows)) : _mm512_setzero_ps();
  if (k_index) {
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t kk = k_index[j];
      fma_step_avx512<MR, NB>(acc, a + (kk / K0) * kFractalRows * K0 + kk % K0, b + kk * ld_b);
    }
  } else {
    for (uint64_t k0 = 0; k0 < k; k0 += K0) {
      const float* ablk = a + (k0 / K0) * kFractalRows * K0;
      const uint64_t k_cnt = std::min(K0, k - k0);
      for (uint64_t kk = 0; kk < k_cnt; ++kk)
        fma_step_avx512<MR, NB>(acc, ablk + kk, b + (k0 + kk) * ld_b);
    }
  }
  for (uint64_t i = 0; i < MR; ++i)
    for (uint64_t h = 0; h < NB; ++h) _mm512_storeu_ps(&out.at(i, h * kFractalRows), acc[i][h]);
}

// The last rows < 8 rows of C's rows (m not a multiple of 8, e.g. a 7 x 7 map's 49 pixels), in
// place and without the rows past m that an 8-row tile would compute and drop.
template <uint64_t NB>
__attribute__((target("avx512f,fma"))) void tile_rows_fma_avx512(
    uint64_t rows, const float* __restrict a, const float* __restrict b, uint64_t ld_b, uint64_t k,
    const uint32_t* k_index, CView<const float> in, CView<float> out) {
  switch (rows) {
    case 1: return tile_product_fma_avx512<1, NB>(a, b, ld_b, k, k_index, in, out);
    case 2: return tile_product_fma_avx512<2, NB>(a, b, ld_b, k, k_index, in, out);
    case 3: return tile_product_fma_avx512<3, NB>(a, b, ld_b, k, k_index, in, out);
    case 4: return tile_product_fma_avx512<4, NB>(a, b, ld_b, k, k_index, in, out);
    case 5: return tile_product_fma_avx512<5, NB>(a, b, ld_b, k, k_index, in, out);
    case 6: return tile_product_fma_avx512<6, NB>(a, b, ld_b, k, k_index, in, out);
    case 7: return tile_product_fma_avx512<7, NB>(a, b, ld_b, k, k_index, in, out);
    default: throw KernelFault(fmt::format("mmad: a tail tile of {} rows", rows));
  }
}

// The same in AVX2 registers, for hosts without AVX-512 (AMD EPYC before Zen 4): MR <= 4 rows of
// one block of 16 columns (two ymm halves), 8 accumulators, A broadcast straight from memory
// (`vbroadcastss m32`, a load). The generic loop compiled for AVX2 loaded A four values at a
// time and broadcast each by a shuffle, which waits on the FP pipes and split cache lines
// (~38 % of a ResNet-50 inference's perf samples on a Zen 3 host). A function apart from the
// AVX-512 one because a function calling intrinsics must carry their target itself, and a
// target cannot be a template parameter.
template <uint64_t MR>
__attribute__((target("avx2,fma"), always_inline)) inline void fma_step_avx2(
    __m256 (&acc)[MR][2], const float* acol, const float* brow) {
  constexpr uint64_t K0 = 16;
  const __m256 b0 = _mm256_loadu_ps(brow), b1 = _mm256_loadu_ps(brow + 8);
#pragma GCC unroll 4
  for (uint64_t i = 0; i < MR; ++i) {
    const __m256 av = _mm256_broadcast_ss(acol + i * K0);
    acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
    acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
  }
}

template <uint64_t MR>
__attribute__((target("avx2,fma"))) void tile_product_fma_avx2(
    const float* __restrict a, const float* __restrict b, uint64_t ld_b, uint64_t k,
    const uint32_t* k_index, const CView<const float>& in, const CView<float>& out) {
  constexpr uint64_t K0 = 16;
  // (Every loop over the accumulators unrolled: with one left as a loop GCC kept the array on
  // the stack, a store per multiply-add.)
  __m256 acc[MR][2];
#pragma GCC unroll 4
  for (uint64_t i = 0; i < MR; ++i) {
    acc[i][0] = in.p ? _mm256_loadu_ps(&in.at(i, 0)) : _mm256_setzero_ps();
    acc[i][1] = in.p ? _mm256_loadu_ps(&in.at(i, 0) + 8) : _mm256_setzero_ps();
  }
  if (k_index) {
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t kk = k_index[j];
      fma_step_avx2<MR>(acc, a + (kk / K0) * kFractalRows * K0 + kk % K0, b + kk * ld_b);
    }
  } else {
    for (uint64_t k0 = 0; k0 < k; k0 += K0) {
      const float* ablk = a + (k0 / K0) * kFractalRows * K0;
      const uint64_t k_cnt = std::min(K0, k - k0);
      for (uint64_t kk = 0; kk < k_cnt; ++kk)
        fma_step_avx2<MR>(acc, ablk + kk, b + (k0 + kk) * ld_b);
    }
  }
#pragma GCC unroll 4
  for (uint64_t i = 0; i < MR; ++i) {
    _mm256_storeu_ps(&out.at(i, 0), acc[i][0]);
    _mm256_storeu_ps(&out.at(i, 0) + 8, acc[i][1]);
  }
}

// tile_rows_fma_avx512's counterpart: the last 1 to 3 rows of C.
__attribute__((target("avx2,fma"))) void tile_rows_fma_avx2(
    uint64_t rows, const float* __restrict a, const float* __restrict b, uint64_t ld_b, uint64_t k,
    const uint32_t* k_index, const CView<const float>& in, const CView<float>& out) {
  switch (rows) {
    case 1: return tile_product_fma_avx2<1>(a, b, ld_b, k, k_index, in, out);
    case 2: return tile_product_fma_avx2<2>(a, b, ld_b, k, k_index, in, out);
    case 3: return tile_product_fma_avx2<3>(a, b, ld_b, k, k_index, in, out);
    default: throw KernelFault(fmt::format("mmad: a tail tile of {} rows", rows));
  }
}
#endif

// One register tile: out(i, jj) = in(i, jj) (zero when in.p is null) + sum over kk < k in order
// of A[i][kk] * B[kk][jj], for i < MR, jj < NR; with k_index, over kk = k_index[j] for j < k
// instead.
//   a: A row 0 of the tile inside its Zz fractal row, widened: element (i, kk) at
//      a[(kk / K0) * 16 * K0 + i * K0 + kk % K0] (the tile's rows lie in one fractal row);
//   b: B (widened, k x ld_b row-major) at the tile's first column.
// T = float (fp32 arithmetic) or uint32_t (integer arithmetic modulo 2^32).
// kFused: each step is one fused multiply-add, for fp16 operands only: the product of two
// fp16 values (11-bit significands, exponents within fp32's) is exact in fp32, so rounding it
// first changes nothing and fma(a, b, c) == (a * b) + c bit for bit.
template <typename T, uint64_t K0, uint64_t MR, uint64_t NR, bool kFused>
inline __attribute__((always_inline)) void tile_product(const T* __restrict a,
                                                        const T* __restrict b, uint64_t ld_b,
                                                        uint64_t k, const uint32_t* k_index,
                                                        CView<const T> in, CView<T> out) {
#if defined(__GNUC__) && defined(__x86_64__)
  // MR = 8 with kFused: only the AVX-512 variant (all_tiles_fused_avx512) instantiates it;
  // MR = 4, NR = 16 with kFused only the AVX2 one (all_tiles_fused_avx2).
  if constexpr (kFused && MR == 8 && (NR == 16 || NR == 32)) {
    tile_product_fma_avx512<8, NR / kFractalRows>(a, b, ld_b, k, k_index, in, out);
    return;
  } else if constexpr (kFused && MR == 4 && NR == 16) {
    tile_product_fma_avx2<4>(a, b, ld_b, k, k_index, in, out);
    return;
  }
#endif
  T acc[MR][NR];
#pragma GCC unroll 8
  for (uint64_t i = 0; i < MR; ++i)
#pragma GCC unroll 32
    for (uint64_t jj = 0; jj < NR; ++jj) acc[i][jj] = in.p ? in.at(i, jj) : T(0);
  // acc[i][jj] += A[i][kk] * B[kk][jj], acol = &A[0][kk] (rows K0 apart), brow = &B[kk][0].
  auto step = [&acc](const T* acol, const T* brow) __attribute__((always_inline)) {
#pragma GCC unroll 8
    for (uint64_t i = 0; i < MR; ++i) {
      const T av = acol[i * K0];
#pragma GCC unroll 32
      for (uint64_t jj = 0; jj < NR; ++jj) {
        if constexpr (kFused) acc[i][jj] = __builtin_fmaf(av, brow[jj], acc[i][jj]);
        else acc[i][jj] += av * brow[jj];
      }
    }
  };
  if (k_index) {
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t kk = k_index[j];
      step(a + (kk / K0) * kFractalRows * K0 + kk % K0, b + kk * ld_b);
    }
  } else {
    for (uint64_t k0 = 0; k0 < k; k0 += K0) {
      const T* ablk = a + (k0 / K0) * kFractalRows * K0;
      const uint64_t k_cnt = std::min(K0, k - k0);
      for (uint64_t kk = 0; kk < k_cnt; ++kk) step(ablk + kk, b + (k0 + kk) * ld_b);
    }
  }
#pragma GCC unroll 8
  for (uint64_t i = 0; i < MR; ++i)
#pragma GCC unroll 32
    for (uint64_t jj = 0; jj < NR; ++jj) out.at(i, jj) = acc[i][jj];
}

// The operands of one mmad, widened, and where C starts and ends. A is widened one fractal row
// at a time (16 rows of C: k_blocks fractals, contiguous in Zz) into a_row, just before that
// row's tiles run, so that the widened row is still in the host's L1 cache when the tiles read
// it (widen_a_row).
// With leave_out set (fp16 only, see "Zero terms left out" below), each tile of MR rows sums
// over only the columns of A that are not +-0 in all of its rows or that leave_out keeps: the
// columns of a fractal row's tiles are listed in group_index (all_tiles), tile q's
// (rows 16 * fr + q * MR ..) at group_index + q * k.
template <typename T>
struct CubeOperands {
  T* a_row;                 // one fractal row of A widened, Zz: 16 * k_blocks * K0 elements
  const uint8_t* a_stored;  // A as stored in L0A (Zz), a_elems elements of a_size bytes
  uint64_t a_elems, a_size;
  void (*widen_a)(const uint8_t* src, T* dst, uint64_t n);  // exact widening of n elements
  uint64_t k_blocks;
  // Per column block kb of 16: bit c set where column kb * 16 + c may be left out when zero;
  // or null (no column is left out).
  const uint16_t* leave_out;
  uint32_t* group_index;  // scratch for the tiles' column lists: kFractalRows * k + 8 entries
  const T* b;  // B as k x ld_b row-major, ld_b = 16 * ceil(n / 16), zero past column n
  uint64_t ld_b;
  uint64_t m, k, n;
  CView<const T> in;  // C's initial values at column 0 (in.p null: zero)
  CView<T> out;       // L0C at row 0, column 0
};

// view moved to row r, column j of C.
template <typename V>
inline __attribute__((always_inline)) V at_tile(V view, uint64_t r, uint64_t j) {
  if (view.p) view.p += (j / kFractalRows) * view.block_stride + r * view.row_stride;
  return view;
}

// Fractal row fr of A (rows 16 * fr .. 16 * fr + 15) widened into g.a_row; what lies past A's
// extent in L0A is zero (the kernels compute rows past m from it and drop them).
template <typename T, uint64_t K0>
void widen_a_row(const CubeOperands<T>& g, uint64_t fr) {
  const uint64_t row_elems = g.k_blocks * kFractalRows * K0, first = fr * row_elems;
  const uint64_t count = std::min(row_elems, g.a_elems - first);
  g.widen_a(g.a_stored + first * g.a_size, g.a_row, count);
  std::fill(g.a_row + count, g.a_row + row_elems, T(0));
}

// The tiles of fractal row r16 / 16 of C (A widened in g.a_row) and of its NR columns from
// column j, in place in L0C; tiles that reach past row m or column n go through a staging tile
// so that only C[r < m][c < n] is written. (Everything here is inlined into the
// target-specific variants below: a call would leave the host-ISA code generation.)
// Tile q of the fractal row sums over columns[q].index[0 .. count) (index null: every column
// kk < count = k).
struct TileColumns {
  const uint32_t* index;
  uint64_t count;
};

// The columns a tile of `rows` rows from row `row0` of the widened fractal row g.a_row sums
// over: every kk < k except those +-0 in all of the tile's rows that g.leave_out lets go, listed
// ascending at index (which may be written up to 8 entries past the list's end); index null
// (every column) where none goes.
template <typename T, uint64_t K0>
inline __attribute__((always_inline)) TileColumns tile_columns(const CubeOperands<T>& g,
                                                               uint64_t row0, uint64_t rows,
                                                               uint32_t* index) {
  static_assert(sizeof(T) == 4 && K0 == 16, "fp16 operands widened to 32 bits");
  uint64_t count = 0;
  for (uint64_t kb = 0; kb * K0 < g.k; ++kb) {
    const T* block = g.a_row + kb * kFractalRows * K0 + row0 * K0;
    uint32_t magnitude[K0] = {};  // per column, its rows' bits ORed, the sign masked off
    for (uint64_t i = 0; i < rows; ++i)
      for (uint64_t c = 0; c < K0; ++c) {
        uint32_t u;
        std::memcpy(&u, block + i * K0 + c, 4);
        magnitude[c] |= u & 0x7fffffffu;
      }
    const uint64_t cols = std::min(K0, g.k - kb * K0);
    for (uint64_t c = 0; c < cols; ++c)
      if (magnitude[c] != 0 || !((g.leave_out[kb] >> c) & 1u))
        index[count++] = static_cast<uint32_t>(kb * K0 + c);
  }
  if (count == g.k) return {nullptr, g.k};
  if (count == 0) index[count++] = 0;  // the kernels want one column at least
  return {index, count};
}

#if defined(__GNUC__) && defined(__x86_64__)
// The set bits of a byte, in ascending order (8 entries, the unused ones 0).
struct BitPositions {
  uint8_t pos[256][8];
  constexpr BitPositions() : pos() {
    for (int v = 0; v < 256; ++v)
      for (int b = 0, n = 0; b < 8; ++b)
        if ((v >> b) & 1) pos[v][n++] = static_cast<uint8_t>(b);
  }
};
constexpr BitPositions kBitPositions;

// tile_columns in AVX2 registers (the fused kernels' hosts): a column block's zero columns as a
// 16-bit mask (its rows ORed, compared with zero), the kept columns written 8 at a time from a
// table of bit positions. The scalar loop cost ~10 % of a ResNet-50 inference.
__attribute__((target("avx2"))) TileColumns tile_columns_avx2(const CubeOperands<float>& g,
                                                              uint64_t row0, uint64_t rows,
                                                              uint32_t* index) {
  constexpr uint64_t K0 = 16;
  const __m256i magnitude = _mm256_set1_epi32(0x7fffffff);
  uint64_t count = 0;
  for (uint64_t kb = 0; kb * K0 < g.k; ++kb) {
    const float* block = g.a_row + kb * kFractalRows * K0 + row0 * K0;
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (uint64_t i = 0; i < rows; ++i) {
      lo =
          _mm256_or_si256(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + i * K0)));
      hi = _mm256_or_si256(
          hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + i * K0 + 8)));
    }
    const __m256i zlo = _mm256_cmpeq_epi32(_mm256_and_si256(lo, magnitude), _mm256_setzero_si256());
    const __m256i zhi = _mm256_cmpeq_epi32(_mm256_and_si256(hi, magnitude), _mm256_setzero_si256());
    const uint32_t zero = static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(zlo))) |
                          static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(zhi))) << 8;
    const uint64_t cols = std::min(K0, g.k - kb * K0);
    const uint32_t keep = ~(zero & g.leave_out[kb]) & ((1u << cols) - 1u);
    for (uint32_t half = 0; half < 2; ++half) {
      const uint32_t byte = (keep >> (8 * half)) & 0xffu;
      const __m256i pos = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(kBitPositions.pos[byte])));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(index + count),
                          _mm256_add_epi32(pos, _mm256_set1_epi32(int(kb * K0 + 8 * half))));
      count += static_cast<uint64_t>(__builtin_popcount(byte));
    }
  }
  if (count == g.k) return {nullptr, g.k};
  if (count == 0) index[count++] = 0;  // the kernels want one column at least
  return {index, count};
}
#endif

template <typename T, uint64_t K0, uint64_t MR, uint64_t NR, bool kFused>
inline __attribute__((always_inline)) void row_tiles(const CubeOperands<T>& g, uint64_t r16,
                                                     uint64_t j, const TileColumns* columns) {
  static_assert(kFractalRows % MR == 0 && NR % kFractalRows == 0, "tiles inside fractals");
  for (uint64_t r = r16; r < std::min(g.m, r16 + kFractalRows); r += MR) {
    const T* a = g.a_row + (r % kFractalRows) * K0;
    const T* b = g.b + j;
    const uint32_t* k_index = columns[(r % kFractalRows) / MR].index;
    const uint64_t k = columns[(r % kFractalRows) / MR].count;
    if (r + MR <= g.m && j + NR <= g.n) {
      tile_product<T, K0, MR, NR, kFused>(a, b, g.ld_b, k, k_index, at_tile(g.in, r, j),
                                          at_tile(g.out, r, j));
      continue;
    }
#if defined(__GNUC__) && defined(__x86_64__)
    if constexpr (kFused && MR == 8 && (NR == 16 || NR == 32)) {  // AVX-512 only (see above)
      if (j + NR <= g.n) {  // whole columns: only the rows left are computed, in place
        tile_rows_fma_avx512<NR / kFractalRows>(g.m - r, a, b, g.ld_b, k, k_index,
                                                at_tile(g.in, r, j), at_tile(g.out, r, j));
        continue;
      }
    } else if constexpr (kFused && MR == 4 && NR == 16) {  // AVX2 only (see above)
      if (j + NR <= g.n) {
        tile_rows_fma_avx2(g.m - r, a, b, g.ld_b, k, k_index, at_tile(g.in, r, j),
                           at_tile(g.out, r, j));
        continue;
      }
    }
#endif
    // Edge tile: rows past m / columns past n are computed in the staging tile (from zero and
    // whatever A holds there) and dropped.
    T stage[MR * NR];
    const CView<T> st{stage, kFractalRows, kFractalRows * MR};
    const uint64_t rows = std::min(MR, g.m - r), cols = std::min(NR, g.n - j);
    const CView<const T> in = at_tile(g.in, r, j);
    for (uint64_t i = 0; i < MR; ++i)
      for (uint64_t jj = 0; jj < NR; ++jj)
        st.at(i, jj) = in.p && i < rows && jj < cols ? in.at(i, jj) : T(0);
    tile_product<T, K0, MR, NR, kFused>(a, b, g.ld_b, k, k_index,
                                        CView<const T>{stage, st.row_stride, st.block_stride}, st);
    const CView<T> out = at_tile(g.out, r, j);
    for (uint64_t i = 0; i < rows; ++i)
      for (uint64_t jj = 0; jj < cols; ++jj) out.at(i, jj) = st.at(i, jj);
  }
}

// Every tile of C, fractal row by fractal row of A (each widened first): in each, column tiles
// of NR, then one of 16 where the column blocks are left over. Each element of C is computed by
// one tile, so the order of the tiles does not change any result.
template <typename T, uint64_t K0, uint64_t MR, uint64_t NR, bool kFused>
inline __attribute__((always_inline)) void all_tiles(const CubeOperands<T>& g) {
  constexpr uint64_t kTiles = kFractalRows / MR;  // tiles of rows in a fractal row
  TileColumns columns[kTiles];
  for (uint64_t q = 0; q < kTiles; ++q) columns[q] = {nullptr, g.k};
  for (uint64_t r16 = 0; r16 < g.m; r16 += kFractalRows) {
    widen_a_row<T, K0>(g, r16 / kFractalRows);
    if constexpr (std::is_same_v<T, float> && K0 == 16) {  // fp16 operands only
      for (uint64_t q = 0; g.leave_out && q < kTiles && r16 + q * MR < g.m; ++q) {
        const uint64_t rows = std::min(MR, g.m - r16 - q * MR);
        uint32_t* index = g.group_index + q * g.k;
#if defined(__GNUC__) && defined(__x86_64__)
        if constexpr (kFused) {  // the AVX2 and AVX-512 hosts' variants
          columns[q] = tile_columns_avx2(g, q * MR, rows, index);
          continue;
        }
#endif
        columns[q] = tile_columns<T, K0>(g, q * MR, rows, index);
      }
    }
    uint64_t j = 0;
    for (; j + NR <= g.ld_b; j += NR) row_tiles<T, K0, MR, NR, kFused>(g, r16, j, columns);
    for (; j < g.ld_b; j += kFractalRows)
      row_tiles<T, K0, MR, kFractalRows, kFused>(g, r16, j, columns);
  }
}

#if defined(__GNUC__) && defined(__x86_64__)
#define NPUSIM_CUBE_X86_VARIANTS 1
template <typename T, uint64_t K0>
__attribute__((target("avx512f"))) void all_tiles_avx512(const CubeOperands<T>& g) {
  all_tiles<T, K0, 8, 32, false>(g);  // 16 zmm accumulators
}
template <typename T, uint64_t K0>
__attribute__((target("avx2"))) void all_tiles_avx2(const CubeOperands<T>& g) {
  all_tiles<T, K0, 4, 16, false>(g);  // 8 ymm accumulators
}
__attribute__((target("avx512f,fma"))) void all_tiles_fused_avx512(
    const CubeOperands<float>& g) {
  all_tiles<float, 16, 8, 32, true>(g);
}
__attribute__((target("avx2,fma"))) void all_tiles_fused_avx2(const CubeOperands<float>& g) {
  all_tiles<float, 16, 4, 16, true>(g);
}
#endif

// dst[j * dst_stride + i] = src[i * 16 + j] for i, j < 16: a full fractal of B (16 n rows of
// 16 k values, widened) into B's k x n layout. Exact copies in any order.
void transpose_fractal_scalar(const float* src, float* dst, uint64_t dst_stride) {
  for (uint64_t kk = 0; kk < 16; ++kk)
    for (uint64_t nn = 0; nn < 16; ++nn) dst[kk * dst_stride + nn] = src[nn * 16 + kk];
}

#ifdef NPUSIM_CUBE_X86_VARIANTS
// Eight rows of 8 floats (r[i]: row i) transposed into d: column j of them at
// d + j * dst_stride (unpack, shuffle, permute2f128).
__attribute__((target("avx"), always_inline)) inline void transpose_8x8_avx(const __m256 (&r)[8],
                                                                           float* d,
                                                                           uint64_t dst_stride) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  _mm256_storeu_ps(d + 0 * dst_stride, _mm256_permute2f128_ps(s0, s4, 0x20));
  _mm256_storeu_ps(d + 1 * dst_stride, _mm256_permute2f128_ps(s1, s5, 0x20));
  _mm256_storeu_ps(d + 2 * dst_stride, _mm256_permute2f128_ps(s2, s6, 0x20));
  _mm256_storeu_ps(d + 3 * dst_stride, _mm256_permute2f128_ps(s3, s7, 0x20));
  _mm256_storeu_ps(d + 4 * dst_stride, _mm256_permute2f128_ps(s0, s4, 0x31));
  _mm256_storeu_ps(d + 5 * dst_stride, _mm256_permute2f128_ps(s1, s5, 0x31));
  _mm256_storeu_ps(d + 6 * dst_stride, _mm256_permute2f128_ps(s2, s6, 0x31));
  _mm256_storeu_ps(d + 7 * dst_stride, _mm256_permute2f128_ps(s3, s7, 0x31));
}

// The same as four 8 x 8 transposes in AVX registers.
__attribute__((target("avx"))) void transpose_fractal_avx(const float* src, float* dst,
                                                         uint64_t dst_stride) {
  for (int bi = 0; bi < 2; ++bi)      // source rows (n) 8*bi..8*bi+7
    for (int bj = 0; bj < 2; ++bj) {  // source columns (k) 8*bj..8*bj+7
      const float* s = src + bi * 8 * 16 + bj * 8;
      __m256 r[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(s + i * 16);
      transpose_8x8_avx(r, dst + bj * 8 * dst_stride + bi * 8, dst_stride);
    }
}
#endif

void transpose_fractal(const float* src, float* dst, uint64_t dst_stride) {
#ifdef NPUSIM_CUBE_X86_VARIANTS
  static const bool avx = host_simd_at_least(HostSimd::kAvx2);
  if (avx) return transpose_fractal_avx(src, dst, dst_stride);
#endif
  transpose_fractal_scalar(src, dst, dst_stride);
}

// transpose_fractal of a full fractal of fp16 B as stored in L0B (16 n rows of 16 k values,
// 512 bytes at src, any alignment), widened on the way: dst[kk * dst_stride + nn] =
// f16_to_f32(src element nn * 16 + kk). The same floats as widening the fractal (f16_to_f32_n)
// and then transposing it, without the widened copy in between.
void widen_transpose_fractal_f16_scalar(const uint8_t* src, float* dst, uint64_t dst_stride) {
  float wide[kFractalRows * kFractalRows];
  f16_to_f32_n(src, wide, kFractalRows * kFractalRows);
  transpose_fractal(wide, dst, dst_stride);
}

#ifdef NPUSIM_CUBE_X86_VARIANTS
// The same with F16C: each source row of an 8 x 8 block widened by vcvtph2ps (exact) straight
// into the transpose's registers. vcvtph2ps quiets a signalling NaN where f16_to_f32 keeps its
// payload (sim/exec/f16_bulk.cpp), so a fractal holding any NaN is redone by the scalar path.
__attribute__((target("avx,f16c"))) void widen_transpose_fractal_f16_f16c(const uint8_t* src,
                                                                         float* dst,
                                                                         uint64_t dst_stride) {
  __m256 nan = _mm256_setzero_ps();
  for (int bi = 0; bi < 2; ++bi)      // source rows (n) 8*bi..8*bi+7
    for (int bj = 0; bj < 2; ++bj) {  // source columns (k) 8*bj..8*bj+7
      const uint8_t* s = src + (bi * 8 * 16 + bj * 8) * 2;
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        r[i] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i * 32)));
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(r[i], r[i], _CMP_UNORD_Q));
      }
      transpose_8x8_avx(r, dst + bj * 8 * dst_stride + bi * 8, dst_stride);
    }
  if (_mm256_movemask_ps(nan)) widen_transpose_fractal_f16_scalar(src, dst, dst_stride);
}
#endif

void widen_transpose_fractal_f16(const uint8_t* src, float* dst, uint64_t dst_stride) {
#ifdef NPUSIM_CUBE_X86_VARIANTS
  static const bool f16c = f16_bulk_uses_hardware();
  if (f16c) return widen_transpose_fractal_f16_f16c(src, dst, dst_stride);
#endif
  widen_transpose_fractal_f16_scalar(src, dst, dst_stride);
}

template <typename T, uint64_t K0>
void run_all_tiles(const CubeOperands<T>& g) {
#ifdef NPUSIM_CUBE_X86_VARIANTS
  static const int isa_level = static_cast<int>(host_simd());
  if (isa_level == 2) return all_tiles_avx512<T, K0>(g);
  if (isa_level == 1) return all_tiles_avx2<T, K0>(g);
#endif
  all_tiles<T, K0, 4, 16, false>(g);  // SSE2: 16 xmm accumulators
}

// The same for fp16 operands widened to fp32 (see kFused): with FMA where the host has it.
void run_all_tiles_f16(const CubeOperands<float>& g) {
#ifdef NPUSIM_CUBE_X86_VARIANTS
  static const int isa_level = static_cast<int>(host_simd());  // kAvx2 includes FMA
  if (isa_level == 2) return all_tiles_fused_avx512(g);
  if (isa_level == 1) return all_tiles_fused_avx2(g);
#endif
  run_all_tiles<float, 16>(g);
}

template <typename U>
U bits(const uint8_t* p) {
  U v;
  std::memcpy(&v, p, sizeof(U));
  return v;
}

// Widening of n stored input elements (at src, any alignment) to the arithmetic type.
template <Dtype kType>
struct Input;
template <>
struct Input<Dtype::F16> {
  using Storage = uint16_t;  // one stored element
  using Arith = float;
  static void widen(const uint8_t* src, float* dst, uint64_t n) { f16_to_f32_n(src, dst, n); }
};
template <>
struct Input<Dtype::BF16> {
  using Storage = uint16_t;  // one stored element
  using Arith = float;
  static void widen(const uint8_t* src, float* dst, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(bits<uint16_t>(src + 2 * i));
  }
};
template <>
struct Input<Dtype::F32> {
  using Storage = float;  // one stored element
  using Arith = float;
  static void widen(const uint8_t* src, float* dst, uint64_t n) { std::memcpy(dst, src, 4 * n); }
};
template <>
struct Input<Dtype::S8> {
  using Storage = int8_t;  // one stored element
  using Arith = uint32_t;  // two's complement arithmetic modulo 2^32
  static void widen(const uint8_t* src, uint32_t* dst, uint64_t n) {
    for (uint64_t i = 0; i < n; ++i)
      dst[i] = static_cast<uint32_t>(static_cast<int32_t>(static_cast<int8_t>(src[i])));
  }
};

// One fractal row of A widened (all_tiles) and B's widened k x ld_b image of the thread's
// latest mmad (Mmad), storage reused across calls.
template <typename T>
struct CubeScratch {
  std::vector<T> a_row, b_buf;
  std::vector<uint16_t> leave_out;    // per column block of A (CubeOperands::leave_out)
  std::vector<uint32_t> group_index;  // the tiles' column lists (CubeOperands::group_index)
};
template <typename T>
CubeScratch<T>& scratch() {
  thread_local CubeScratch<T> s;
  return s;
}

// Zero terms left out (fp16 operands). After a ReLU about half of an activation's values are
// zero, and a convolution's padding taps read zeros too: in the ResNet-50 inference about 37 %
// of the multiply-adds have a zero A value in every row of their 4-row register tile. Each tile
// sums over the columns of A that are not +-0 in all of its rows (tile_columns), where that
// gives the same bits as the sum over every column: a left-out term is A * B with A +-0 and B
// finite (leave_out: B's row kk finite in every column), an exact +-0, and acc + (+-0) == acc
// for every acc but -0 (-0 + +0 == +0; a quiet NaN stays the same NaN). The accumulator never
// becomes -0 unless it starts at -0 (a sum rounds to -0 only from -0 + -0; a non-zero exact sum
// stays non-zero, the products being exact), and a signalling NaN can only be the initial value
// (every NaN a sum produces is quiet). So an mmad whose initial values (zero, C in L0C, or the
// bias row) hold no -0 and no NaN gets the same bits from every tile's shortened sum; one whose
// initial values do is computed over every column.

// The rows kk < k of B (k x ld_b widened, n columns used) that are finite, as
// CubeOperands::leave_out's masks: bit kk % 16 of leave_out[kk / 16].
void finite_rows(const float* b, uint64_t k, uint64_t ld_b, uint64_t n,
                 std::vector<uint16_t>& leave_out) {
  leave_out.assign(ceil_div(k, uint64_t(16)), 0);
  for (uint64_t kk = 0; kk < k; ++kk) {
    const float* row = b + kk * ld_b;
    uint64_t c = 0;
    uint32_t non_finite = 0;
#if defined(__SSE2__)
    const __m128i exponent = _mm_set1_epi32(0x7f800000);
    __m128i any = _mm_setzero_si128();
    for (; c + 4 <= n; c += 4) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c));
      any = _mm_or_si128(any, _mm_cmpeq_epi32(_mm_and_si128(v, exponent), exponent));
    }
    non_finite = static_cast<uint32_t>(_mm_movemask_epi8(any));
#endif
    for (; c < n; ++c)
      non_finite |= static_cast<uint32_t>(
          (bits<uint32_t>(reinterpret_cast<const uint8_t*>(row + c)) & 0x7f800000u) == 0x7f800000u);
    if (non_finite == 0) leave_out[kk / 16] |= static_cast<uint16_t>(1u << (kk % 16));
  }
}

// Whether any of count consecutive floats at p is -0 or a NaN.
bool negative_zero_or_nan_generic(const float* p, uint64_t count) {
  uint32_t found = 0;
  uint64_t e = 0;
#if defined(__SSE2__)
  const __m128i negative_zero = _mm_set1_epi32(static_cast<int32_t>(0x80000000u));
  const __m128i magnitude = _mm_set1_epi32(0x7fffffff), infinity = _mm_set1_epi32(0x7f800000);
  __m128i any = _mm_setzero_si128();
  for (; e + 4 <= count; e += 4) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + e));
    any = _mm_or_si128(any, _mm_cmpeq_epi32(v, negative_zero));
    // NaN: |u| > inf's bits, both below 2^31 so the signed compare orders them
    any = _mm_or_si128(any, _mm_cmpgt_epi32(_mm_and_si128(v, magnitude), infinity));
  }
  found |= static_cast<uint32_t>(_mm_movemask_epi8(any));
#endif
  for (; e < count; ++e) {
    const uint32_t u = bits<uint32_t>(reinterpret_cast<const uint8_t*>(p + e));
    found |= static_cast<uint32_t>(u == 0x80000000u) |
             static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
  }
  return found != 0;
}

#ifdef NPUSIM_CUBE_X86_VARIANTS
// The same 8 lanes at a time: -0 by its bits, a NaN as unordered with itself.
__attribute__((target("avx2"))) bool negative_zero_or_nan_avx2(const float* p, uint64_t count) {
  const __m256i negative_zero = _mm256_set1_epi32(static_cast<int32_t>(0x80000000u));
  __m256i any = _mm256_setzero_si256();
  uint64_t e = 0;
  for (; e + 8 <= count; e += 8) {
    const __m256 v = _mm256_loadu_ps(p + e);
    any = _mm256_or_si256(any, _mm256_cmpeq_epi32(_mm256_castps_si256(v), negative_zero));
    any = _mm256_or_si256(any, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  }
  return !_mm256_testz_si256(any, any) || negative_zero_or_nan_generic(p + e, count - e);
}
#endif

bool negative_zero_or_nan(const float* p, uint64_t count) {
#ifdef NPUSIM_CUBE_X86_VARIANTS
  static const bool avx2 = host_simd_at_least(HostSimd::kAvx2);
  if (avx2) return negative_zero_or_nan_avx2(p, count);
#endif
  return negative_zero_or_nan_generic(p, count);
}

// Whether any element r < m, c < n of C (L0C's NZ layout, m16 rows per column block) is -0 or
// a NaN.
bool any_negative_zero_or_nan(const float* c, uint64_t m, uint64_t n, uint64_t m16) {
  for (uint64_t nb = 0; nb * kFractalRows < n; ++nb) {
    const uint64_t cols = std::min(kFractalRows, n - nb * kFractalRows);
    const float* block = c + nb * kFractalRows * m16;
    if (cols == kFractalRows) {  // rows r < m of a whole column block lie back to back
      if (negative_zero_or_nan(block, m * kFractalRows)) return true;
      continue;
    }
    for (uint64_t r = 0; r < m; ++r)
      if (negative_zero_or_nan(block + r * kFractalRows, cols)) return true;
  }
  return false;
}

struct Mmad {
  Dtype type;
  uint64_t size, k0, xa, xb, xc, xbias, m, k, n, init;

  Mmad(const Operands& o, const ExecContext& ctx) {
    const ChipConfig& cfg = ctx.cfg;
    type = o.dtype("type");
    bool legal = type == Dtype::F16 || type == Dtype::S8 ||
                 (type == Dtype::BF16 && cfg.cube_bf16) ||
                 (type == Dtype::F32 && cfg.cube_fp32_rate_divisor > 0);
    if (!legal)
      o.fault(fmt::format("type = {} is not supported by the cube of chip {}",
                          isa::dtype_name(type), cfg.name));
    size = static_cast<uint64_t>(isa::dtype_size(type));
    k0 = layout::c0_of(size);
    xa = o.addr("xa");
    xb = o.addr("xb");
    xc = o.addr("xc");
    xbias = o.addr("xbias");
    m = o.count("m", 1);
    k = o.count("k", 1);
    n = o.count("n", 1);
    init = o.count("init", 0);
    if (init > 2)
      o.fault(fmt::format("init = {} must be 0 (zero), 1 (accumulate) or 2 (bias)", init));
    mte::check_local(o, ctx, "xa", Buf::L0A, xa, layout::zz_extent(m, k, k0) * size);
    mte::check_local(o, ctx, "xb", Buf::L0B, xb, layout::zn_extent(k, n, k0) * size);
    mte::check_local(o, ctx, "xc", Buf::L0C, xc, layout::l0c_extent(m, n) * layout::kL0cElemBytes);
    if (init == 2) mte::check_local(o, ctx, "xbias", Buf::BT, xbias, n * layout::kL0cElemBytes);
  }

  // cycles = cube_latency_cycles + ceil(m/cube_m) * ceil(k/K) * ceil(n/cube_n) * R, where
  //   f16/bf16: K = cube_k,      R = 1
  //   s8:       K = cube_int8_k, R = 1
  //   f32:      K = cube_k,      R = cube_fp32_rate_divisor (fp32 runs at 1/R of the fp16 MAC
  //             rate cube_m*cube_k*cube_n per cycle, as the config documents)
  // macs in fp16 MAC-equivalents (exec.h): f16/bf16 m*k*n; s8 m*k*n*cube_k/cube_int8_k;
  // f32 m*k*n*cube_fp32_rate_divisor. A kernel that keeps the cube busy with full blocks thus
  // reaches cube_m*cube_k*cube_n macs per cycle for every type.
  ExecCost cost(const ChipConfig& cfg) const {
    uint64_t kdim = type == Dtype::S8 ? uint64_t(cfg.cube_int8_k) : uint64_t(cfg.cube_k);
    uint64_t rate_div = type == Dtype::F32 ? uint64_t(cfg.cube_fp32_rate_divisor) : 1;
    ExecCost c;
    c.cycles = uint64_t(cfg.cube_latency_cycles) +
               ceil_div(m, uint64_t(cfg.cube_m)) * ceil_div(k, kdim) *
                   ceil_div(n, uint64_t(cfg.cube_n)) * rate_div;
    uint64_t macs = m * k * n;
    if (type == Dtype::S8) c.macs = macs * uint64_t(cfg.cube_k) / uint64_t(cfg.cube_int8_k);
    else c.macs = macs * rate_div;
    return c;
  }

  void run(ExecContext& ctx) const {
    switch (type) {
      case Dtype::F16: return run_typed<Dtype::F16>(ctx);
      case Dtype::BF16: return run_typed<Dtype::BF16>(ctx);
      case Dtype::F32: return run_typed<Dtype::F32>(ctx);
      case Dtype::S8: return run_typed<Dtype::S8>(ctx);
      default: throw KernelFault("mmad: execute() without a successful plan()");
    }
  }

  template <Dtype kType>
  void run_typed(ExecContext& ctx) const {
    using In = Input<kType>;
    using T = typename In::Arith;
    static_assert(sizeof(T) == layout::kL0cElemBytes, "accumulators are 32-bit");
    // K0 elements of the input type fill one 32-byte block (= k0, known here at compile time so
    // the kernels' k loops and the full-fractal copies below are fixed-size).
    constexpr uint64_t K0 = layout::kBlockBytes / sizeof(typename In::Storage);
    const uint64_t k_blocks = ceil_div(k, K0), n_blocks = ceil_div(n, kFractalRows);
    const uint64_t m16 = round_up(m, kFractalRows), ld_b = n_blocks * kFractalRows;

    // A is widened by the kernels, a fractal row at a time (all_tiles). B widened in its Zn
    // layout, then rearranged as k x ld_b row-major, zero past column n. Scratch reused across
    // calls.
    std::vector<T>& b_buf = scratch<T>().b_buf;
    thread_local std::vector<T> b_wide;
    const uint64_t b_elems = layout::zn_extent(k, n, k0);
    const uint8_t* b_stored = ctx.local.at(Buf::L0B, xb, b_elems * size);
    b_buf.resize(k * ld_b);
    if constexpr (kType == Dtype::F16) {
      // Whole fractals only (k and n multiples of 16: convolutions and MatMuls of 16-channel
      // multiples): each widened straight into its place, fractal (kb, nb) at zn_offset in L0B.
      if (k % K0 == 0 && n % kFractalRows == 0) {
        for (uint64_t kb = 0; kb < k_blocks; ++kb)
          for (uint64_t nb = 0; nb < n_blocks; ++nb)
            widen_transpose_fractal_f16(
                b_stored + layout::zn_offset(kb * K0, nb * kFractalRows, n_blocks, K0) * size,
                &b_buf[kb * K0 * ld_b + nb * kFractalRows], ld_b);
        return run_tiles<kType>(ctx, k_blocks, m16, ld_b);
      }
    }
    b_wide.resize(b_elems);
    In::widen(b_stored, b_wide.data(), b_elems);
    if (ld_b != n)
      for (uint64_t kk = 0; kk < k; ++kk)
        std::fill(b_buf.begin() + kk * ld_b + n, b_buf.begin() + (kk + 1) * ld_b, T(0));
    for (uint64_t kb = 0; kb < k_blocks; ++kb)
      for (uint64_t nb = 0; nb < n_blocks; ++nb) {
        const T* frac = &b_wide[layout::zn_offset(kb * K0, nb * kFractalRows, n_blocks, K0)];
        uint64_t n_cnt = std::min<uint64_t>(kFractalRows, n - nb * kFractalRows);
        uint64_t k_cnt = std::min(K0, k - kb * K0);
        T* dst = &b_buf[kb * K0 * ld_b + nb * kFractalRows];
        if (n_cnt == kFractalRows && k_cnt == K0) {
          if constexpr (std::is_same_v<T, float> && K0 == 16) {
            transpose_fractal(frac, dst, ld_b);
          } else {
            for (uint64_t kk = 0; kk < K0; ++kk)
              for (uint64_t nn = 0; nn < kFractalRows; ++nn)
                dst[kk * ld_b + nn] = frac[nn * K0 + kk];
          }
        } else {
          for (uint64_t kk = 0; kk < k_cnt; ++kk)
            for (uint64_t nn = 0; nn < n_cnt; ++nn) dst[kk * ld_b + nn] = frac[nn * K0 + kk];
        }
      }
    run_tiles<kType>(ctx, k_blocks, m16, ld_b);
  }

  // The products into L0C, from A in L0A (widened a fractal row at a time) and B widened and
  // rearranged into scratch<T>().b_buf (run_typed).
  template <Dtype kType>
  void run_tiles(ExecContext& ctx, uint64_t k_blocks, uint64_t m16, uint64_t ld_b) const {
    using In = Input<kType>;
    using T = typename In::Arith;
    constexpr uint64_t K0 = layout::kBlockBytes / sizeof(typename Input<kType>::Storage);
    // C is read (init 1) and written in place in L0C, and the bias read in place in BT; where
    // the config's alignment leaves either unaligned for T, through an aligned copy.
    auto aligned = [](const uint8_t* p) {
      return reinterpret_cast<uintptr_t>(p) % alignof(T) == 0;
    };
    thread_local std::vector<T> c_bounce, bias_bounce;
    const uint64_t c_bytes = layout::l0c_extent(m, n) * layout::kL0cElemBytes;
    uint8_t* l0c = ctx.local.at(Buf::L0C, xc, c_bytes);
    T* c = reinterpret_cast<T*>(l0c);
    if (!aligned(l0c)) {
      c_bounce.resize(c_bytes / sizeof(T));
      std::memcpy(c_bounce.data(), l0c, c_bytes);
      c = c_bounce.data();
    }
    auto copy_back = [&] {  // C computed in the bounce buffer back into L0C
      if (c != reinterpret_cast<T*>(l0c)) std::memcpy(l0c, c, c_bytes);
    };
    CView<const T> in{nullptr, kFractalRows, kFractalRows * m16};  // init 0: from zero
    if (init == 1) in.p = c;
    if (init == 2) {
      const uint8_t* bt = ctx.local.at(Buf::BT, xbias, n * layout::kL0cElemBytes);
      in = {reinterpret_cast<const T*>(bt), 0, kFractalRows};  // every row reads the bias row
      if (!aligned(bt)) {
        bias_bounce.resize(n);
        std::memcpy(bias_bounce.data(), bt, n * layout::kL0cElemBytes);
        in.p = bias_bounce.data();
      }
    }
    std::vector<T>& a_row = scratch<T>().a_row;
    a_row.resize(kFractalRows * k_blocks * K0);
    const uint64_t a_elems = layout::zz_extent(m, k, k0);
    const CubeOperands<T> g{a_row.data(),
                            ctx.local.at(Buf::L0A, xa, a_elems * size),
                            a_elems,
                            size,
                            &In::widen,
                            k_blocks,
                            nullptr,
                            nullptr,
                            scratch<T>().b_buf.data(),
                            ld_b,
                            m,
                            k,
                            n,
                            in,
                            CView<T>{c, kFractalRows, kFractalRows * m16}};
    if constexpr (kType == Dtype::F16) {
      // Zero terms left out where the initial values allow it ("Zero terms left out").
      const bool exact = init == 0 || (init == 1 && !any_negative_zero_or_nan(c, m, n, m16)) ||
                         (init == 2 && !negative_zero_or_nan(in.p, n));
      if (exact) {
        CubeOperands<float> short_sums = g;
        std::vector<uint16_t>& leave_out = scratch<T>().leave_out;
        finite_rows(g.b, k, ld_b, n, leave_out);
        std::vector<uint32_t>& group_index = scratch<T>().group_index;
        group_index.resize(kFractalRows * k + 8);
        short_sums.leave_out = leave_out.data();
        short_sums.group_index = group_index.data();
        run_all_tiles_f16(short_sums);
      } else {
        run_all_tiles_f16(g);
      }
    } else {
      run_all_tiles<T, K0>(g);
    }
    copy_back();
  }
};

}  // namespace

ExecCost plan_cube(const IssuedOp& op, const ExecContext& ctx) {
  Operands o(op);
  if (op.op() != isa::Opcode::op_mmad) o.fault("not a cube instruction");
  return Mmad(o, ctx).cost(ctx.cfg);
}

void execute_cube(const IssuedOp& op, ExecContext& ctx) {
  Operands o(op);
  Mmad(o, ctx).run(ctx);
}

std::unique_ptr<PreparedOp> prepare_cube(const IssuedOp& op, const ExecContext& ctx) {
  Operands o(op);
  return std::make_unique<PreparedDescriptor<Mmad>>(Mmad(o, ctx));
}

}  // namespace npusim
