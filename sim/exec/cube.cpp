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
// apart), brow = &B[kk][0] in the tile's first column panel (the next panel b_panel further).
template <uint64_t MR, uint64_t NB>
__attribute__((target("avx512f,fma"), always_inline)) inline void fma_step_avx512(
    __m512 (&acc)[MR][NB], const float* acol, const float* brow, uint64_t b_panel) {
  constexpr uint64_t K0 = 16;
  __m512 bv[NB];
  for (uint64_t h = 0; h < NB; ++h) bv[h] = _mm512_loadu_ps(brow + h * b_panel);
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
    const float* __restrict a, const float* __restrict b, uint64_t b_panel, uint64_t k,
    const uint32_t* k_index, const CView<const float>& in, const CView<float>& out) {
  constexpr uint64_t K0 = 16;
  __m512 acc[MR][NB];
  for (uint64_t i = 0; i < MR; ++i)
    for (uint64_t h = 0; h < NB; ++h)
      acc[i][h] = in.p ? _mm512_loadu_ps(&in.at(i, h * kFractalRows)) : _mm512_setzero_ps();
  if (k_index) {
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t kk = k_index[j];
      fma_step_avx512<MR, NB>(acc, a + (kk / K0) * kFractalRows * K0 + kk % K0,
                              b + kk * kFractalRows, b_panel);
    }
  } else {
    for (uint64_t k0 = 0; k0 < k; k0 += K0) {
      const float* ablk = a + (k0 / K0) * kFractalRows * K0;
      const uint64_t k_cnt = std::min(K0, k - k0);
      for (uint64_t kk = 0; kk < k_cnt; ++kk)
        fma_step_avx512<MR, NB>(acc, ablk + kk, b + (k0 + kk) * kFractalRows, b_panel);
    }
  }
  for (uint64_t i = 0; i < MR; ++i)
    for (uint64_t h = 0; h < NB; ++h) _mm512_storeu_ps(&out.at(i, h * kFractalRows), acc[i][h]);
}

// The last rows < 8 rows of C's rows (m not a multiple of 8, e.g. a 7 x 7 map's 49 pixels), in
// place and without the rows past m that an 8-row tile would compute and drop.
template <uint64_t NB>
__attribute__((target("avx512f,fma"))) void tile_rows_fma_avx512(
    uint64_t rows, const float* __restrict a, const float* __restrict b, uint64_t b_panel,
    uint64_t k, const uint32_t* k_index, CView<const float> in, CView<float> out) {
  switch (rows) {
    case 1: return tile_product_fma_avx512<1, NB>(a, b, b_panel, k, k_index, in, out);
    case 2: return tile_product_fma_avx512<2, NB>(a, b, b_panel, k, k_index, in, out);
    case 3: return tile_product_fma_avx512<3, NB>(a, b, b_panel, k, k_index, in, out);
    case 4: return tile_product_fma_avx512<4, NB>(a, b, b_panel, k, k_index, in, out);
    case 5: return tile_product_fma_avx512<5, NB>(a, b, b_panel, k, k_index, in, out);
    case 6: return tile_product_fma_avx512<6, NB>(a, b, b_panel, k, k_index, in, out);
    case 7: return tile_product_fma_avx512<7, NB>(a, b, b_panel, k, k_index, in, out);
    default: throw KernelFault(fmt::format("mmad: a tail tile of {} rows", rows));
  }
}

// The same in AVX2 registers, for hosts without AVX-512 (AMD EPYC before Zen 4): MR <= 6 rows of
// one block of 16 columns (two ymm halves), up to 12 accumulators, A broadcast straight from memory
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
#pragma GCC unroll 8
  for (uint64_t i = 0; i < MR; ++i) {
    const __m256 av = _mm256_broadcast_ss(acol + i * K0);
    acc[i][0] = _mm256_fmadd_ps(av, b0, acc[i][0]);
    acc[i][1] = _mm256_fmadd_ps(av, b1, acc[i][1]);
  }
}

template <uint64_t MR>
__attribute__((target("avx2,fma"))) void tile_product_fma_avx2(const float* __restrict a,
                                                               const float* __restrict b,
                                                               uint64_t k, const uint32_t* k_index,
                                                               const CView<const float>& in,
                                                               const CView<float>& out) {
  constexpr uint64_t K0 = 16;
  // (Every loop over the accumulators unrolled: with one left as a loop GCC kept the array on
  // the stack, a store per multiply-add.)
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (uint64_t i = 0; i < MR; ++i) {
    acc[i][0] = in.p ? _mm256_loadu_ps(&in.at(i, 0)) : _mm256_setzero_ps();
    acc[i][1] = in.p ? _mm256_loadu_ps(&in.at(i, 0) + 8) : _mm256_setzero_ps();
  }
  if (k_index) {
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t kk = k_index[j];
      fma_step_avx2<MR>(acc, a + (kk / K0) * kFractalRows * K0 + kk % K0, b + kk * kFractalRows);
    }
  } else {
    for (uint64_t k0 = 0; k0 < k; k0 += K0) {
      const float* ablk = a + (k0 / K0) * kFractalRows * K0;
      const uint64_t k_cnt = std::min(K0, k - k0);
      for (uint64_t kk = 0; kk < k_cnt; ++kk)
        fma_step_avx2<MR>(acc, ablk + kk, b + (k0 + kk) * kFractalRows);
    }
  }
#pragma GCC unroll 8
  for (uint64_t i = 0; i < MR; ++i) {
    _mm256_storeu_ps(&out.at(i, 0), acc[i][0]);
    _mm256_storeu_ps(&out.at(i, 0) + 8, acc[i][1]);
  }
}

// A tile of 1 to 6 rows (rows) of one column block in place: the 6-row tiles of
// all_tiles_fused_avx2 and the last rows of m.
__attribute__((target("avx2,fma"))) void tile_rows_fma_avx2(
    uint64_t rows, const float* __restrict a, const float* __restrict b, uint64_t k,
    const uint32_t* k_index, const CView<const float>& in, const CView<float>& out) {
  switch (rows) {
    case 1: return tile_product_fma_avx2<1>(a, b, k, k_index, in, out);
    case 2: return tile_product_fma_avx2<2>(a, b, k, k_index, in, out);
    case 3: return tile_product_fma_avx2<3>(a, b, k, k_index, in, out);
    case 4: return tile_product_fma_avx2<4>(a, b, k, k_index, in, out);
    case 5: return tile_product_fma_avx2<5>(a, b, k, k_index, in, out);
    case 6: return tile_product_fma_avx2<6>(a, b, k, k_index, in, out);
    default: throw KernelFault(fmt::format("mmad: a tail tile of {} rows", rows));
  }
}
#endif

// One register tile: out(i, jj) = in(i, jj) (zero when in.p is null) + sum over kk < k in order
// of A[i][kk] * B[kk][jj], for i < MR, jj < NR; with k_index, over kk = k_index[j] for j < k
// instead.
//   a: A row 0 of the tile inside its Zz fractal row, widened: element (i, kk) at
//      a[(kk / K0) * 16 * K0 + i * K0 + kk % K0] (the tile's rows lie in one fractal row);
//   b: B (widened, in column panels: CubeOperands::b) at row 0 of the tile's first panel;
//      columns 16 .. 31 of a 32-column tile lie in the next panel, b_panel elements further.
// T = float (fp32 arithmetic) or uint32_t (integer arithmetic modulo 2^32).
// kFused: each step is one fused multiply-add, for fp16 operands only: the product of two
// fp16 values (11-bit significands, exponents within fp32's) is exact in fp32, so rounding it
// first changes nothing and fma(a, b, c) == (a * b) + c bit for bit.
template <typename T, uint64_t K0, uint64_t MR, uint64_t NR, bool kFused>
inline __attribute__((always_inline)) void tile_product(const T* __restrict a,
                                                        const T* __restrict b, uint64_t b_panel,
                                                        uint64_t k, const uint32_t* k_index,
                                                        CView<const T> in, CView<T> out) {
#if defined(__GNUC__) && defined(__x86_64__)
  // MR = 8 with kFused: only the AVX-512 variant (all_tiles_fused_avx512) instantiates it;
  // MR = 4, NR = 16 with kFused only the AVX2 one (all_tiles_fused_avx2).
  if constexpr (kFused && MR == 8 && (NR == 16 || NR == 32)) {
    tile_product_fma_avx512<8, NR / kFractalRows>(a, b, b_panel, k, k_index, in, out);
    return;
  } else if constexpr (kFused && MR == 4 && NR == 16) {
    tile_product_fma_avx2<4>(a, b, k, k_index, in, out);
    return;
  }
#endif
  T acc[MR][NR];
#pragma GCC unroll 8
  for (uint64_t i = 0; i < MR; ++i)
#pragma GCC unroll 32
    for (uint64_t jj = 0; jj < NR; ++jj) acc[i][jj] = in.p ? in.at(i, jj) : T(0);
  // acc[i][jj] += A[i][kk] * B[kk][jj], acol = &A[0][kk] (rows K0 apart), brow = &B[kk][0]
  // in the first panel (column jj at brow[(jj / 16) * b_panel + jj % 16]).
  auto step = [&acc, b_panel](const T* acol, const T* brow) __attribute__((always_inline)) {
#pragma GCC unroll 8
    for (uint64_t i = 0; i < MR; ++i) {
      const T av = acol[i * K0];
#pragma GCC unroll 32
      for (uint64_t jj = 0; jj < NR; ++jj) {
        const T bv = brow[(jj / kFractalRows) * b_panel + jj % kFractalRows];
        if constexpr (kFused) acc[i][jj] = __builtin_fmaf(av, bv, acc[i][jj]);
        else acc[i][jj] += av * bv;
      }
    }
  };
  if (k_index) {
    for (uint64_t j = 0; j < k; ++j) {
      const uint64_t kk = k_index[j];
      step(a + (kk / K0) * kFractalRows * K0 + kk % K0, b + kk * kFractalRows);
    }
  } else {
    for (uint64_t k0 = 0; k0 < k; k0 += K0) {
      const T* ablk = a + (k0 / K0) * kFractalRows * K0;
      const uint64_t k_cnt = std::min(K0, k - k0);
      for (uint64_t kk = 0; kk < k_cnt; ++kk) step(ablk + kk, b + (k0 + kk) * kFractalRows);
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
// With k_index set, the kernels sum over only some of A's columns (columns_to_keep_f16 below):
// k is their count and k_index[j] < k_blocks * K0 the j-th of them, in ascending order.
template <typename T>
struct CubeOperands {
  T* a_row;                 // one fractal row of A widened, Zz: 16 * k_blocks * K0 elements
  const uint8_t* a_stored;  // A as stored in L0A (Zz), a_elems elements of a_size bytes
  uint64_t a_elems, a_size;
  void (*widen_a)(const uint8_t* src, T* dst, uint64_t n);  // exact widening of n elements
  uint64_t k_blocks;
  const uint32_t* k_index;  // null: every column kk < k
  // B widened in column panels of 16: panel p (columns 16 p .. 16 p + 15, zero past column n)
  // is k x 16 row-major at b + p * b_panel, b_panel = 16 * k. (One k x n16 row-major image
  // instead, as before 2026-12-07, put a tile's k rows of B n16 * 4 bytes apart, a power of
  // two for most layers: they fell into a few sets of the host's caches and evicted each
  // other between the tiles that read them; a panel is k * 64 contiguous bytes.)
  const T* b;
  uint64_t b_panel;
  uint64_t n16;  // n rounded up to 16: the columns the tiles compute
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
template <typename T, uint64_t K0, uint64_t MR, uint64_t NR, bool kFused>
inline __attribute__((always_inline)) void row_tiles(const CubeOperands<T>& g, uint64_t r16,
                                                     uint64_t j) {
  static_assert(kFractalRows % MR == 0 && NR % kFractalRows == 0, "tiles inside fractals");
  for (uint64_t r = r16; r < std::min(g.m, r16 + kFractalRows); r += MR) {
    const T* a = g.a_row + (r % kFractalRows) * K0;
    const T* b = g.b + (j / kFractalRows) * g.b_panel;
    if (r + MR <= g.m && j + NR <= g.n) {
      tile_product<T, K0, MR, NR, kFused>(a, b, g.b_panel, g.k, g.k_index, at_tile(g.in, r, j),
                                          at_tile(g.out, r, j));
      continue;
    }
#if defined(__GNUC__) && defined(__x86_64__)
    if constexpr (kFused && MR == 8 && (NR == 16 || NR == 32)) {  // AVX-512 only (see above)
      if (j + NR <= g.n) {  // whole columns: only the rows left are computed, in place
        tile_rows_fma_avx512<NR / kFractalRows>(g.m - r, a, b, g.b_panel, g.k, g.k_index,
                                                at_tile(g.in, r, j), at_tile(g.out, r, j));
        continue;
      }
    } else if constexpr (kFused && MR == 4 && NR == 16) {  // AVX2 only (see above)
      if (j + NR <= g.n) {
        tile_rows_fma_avx2(g.m - r, a, b, g.k, g.k_index, at_tile(g.in, r, j),
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
    tile_product<T, K0, MR, NR, kFused>(a, b, g.b_panel, g.k, g.k_index,
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
  for (uint64_t r16 = 0; r16 < g.m; r16 += kFractalRows) {
    widen_a_row<T, K0>(g, r16 / kFractalRows);
    uint64_t j = 0;
    for (; j + NR <= g.n16; j += NR) row_tiles<T, K0, MR, NR, kFused>(g, r16, j);
    for (; j < g.n16; j += kFractalRows) row_tiles<T, K0, MR, kFractalRows, kFused>(g, r16, j);
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
// On AVX2 hosts a fractal row's 16 rows of one column block are three tiles of 6, 6 and 4
// rows: 12 ymm accumulators (15 of the 16 registers with B's two halves and A's broadcast),
// more independent sums in flight than the FMA pipes' latency needs, where 4-row tiles had just
// as many (8) and the 4-row tile over every row read B's panel 4 times instead of 3. Columns
// past n go through row_tiles' staging tile.
__attribute__((target("avx2,fma"))) void all_tiles_fused_avx2(const CubeOperands<float>& g) {
  constexpr uint64_t kRows = 6;
  for (uint64_t r16 = 0; r16 < g.m; r16 += kFractalRows) {
    widen_a_row<float, 16>(g, r16 / kFractalRows);
    const uint64_t rows16 = std::min(kFractalRows, g.m - r16);
    for (uint64_t j = 0; j < g.n16; j += kFractalRows) {
      if (j + kFractalRows > g.n) {
        row_tiles<float, 16, 4, 16, true>(g, r16, j);
        continue;
      }
      const float* b = g.b + (j / kFractalRows) * g.b_panel;
      for (uint64_t i = 0; i < rows16; i += kRows)
        tile_rows_fma_avx2(std::min(kRows, rows16 - i), g.a_row + i * 16, b, g.k, g.k_index,
                           at_tile(g.in, r16 + i, j), at_tile(g.out, r16 + i, j));
    }
  }
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
      // Unrolled, so that r stays in registers (GCC at -O2 kept the loop and r on the stack).
#pragma GCC unroll 8
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

// One fractal row of A widened (all_tiles) and B's widened column panels of the thread's
// latest mmad (Mmad), storage reused across calls.
template <typename T>
struct CubeScratch {
  std::vector<T> a_row, b_buf;
};
template <typename T>
CubeScratch<T>& scratch() {
  thread_local CubeScratch<T> s;
  return s;
}

// Columns of an fp16 A that are zero in every row (the first convolution of an image: 3
// channels padded to C0 = 16, 13 of every 16 columns zero; after a ReLU, channels that are zero
// at every pixel of the tile) are left out of the sums where that gives the same bits. A column
// kk of A that is +-0 in every row, with B's row kk finite, adds products that are all +-0, and
// acc + (+-0) == acc except that -0 + +0 == +0. So the sum without those terms (the kept terms
// in the same order) has the same bits as the full one, except that it may end at -0 where the
// full sum ends at +0: from the first term where the two differ (full +0, shortened -0) they
// agree again at the next kept term that is not -0 (x + 0 == x for x != 0, and both zeros plus
// +0 give +0), or stay so to the end. A NaN can only come from the initial value or a kept
// product (zero times a finite value is no NaN); a signalling NaN initial value would be
// quieted at different terms, so NaN results count as possibly different too. An mmad whose
// shortened result holds a -0 or a NaN is redone with every column. Worth its scan only when
// many columns go: at least k / kMinSkippedShare of them.
constexpr uint64_t kMinSkippedShare = 4;

// How many of bits[0 .. n) are +-0 (fp16 bits).
uint64_t zero_magnitudes(const uint16_t* bits16, uint64_t n) {
  uint64_t zero = 0, i = 0;
#if defined(__SSE2__)
  // Counted in the vector (each zero lane's all-ones mask is -1: madd by -1 gives per 32-bit
  // lane the count of its two 16-bit lanes), not by a popcount of the lane mask: the x86-64
  // baseline the build targets has no popcnt instruction, and GCC calls libgcc's
  // __popcountdi2 for it.
  const __m128i magnitude = _mm_set1_epi16(0x7fff), minus_one = _mm_set1_epi16(-1);
  __m128i counts = _mm_setzero_si128();  // four 32-bit counts, each at most n / 4
  for (; i + 8 <= n; i += 8) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bits16 + i));
    const __m128i is_zero = _mm_cmpeq_epi16(_mm_and_si128(v, magnitude), _mm_setzero_si128());
    counts = _mm_add_epi32(counts, _mm_madd_epi16(is_zero, minus_one));
  }
  uint32_t lane[4];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lane), counts);
  zero = uint64_t(lane[0]) + lane[1] + lane[2] + lane[3];
#endif
  for (; i < n; ++i) zero += (bits16[i] & 0x7fff) == 0;
  return zero;
}

// The columns of A to keep (ascending) in kept, and true, when at least k / kMinSkippedShare
// columns kk < k of an fp16 A can be left out: +-0 in every row r < m of A (stored in Zz:
// k_blocks column blocks of 16) and finite in B's row kk (b: widened in column panels of 16,
// b_panel elements apart, as CubeOperands::b; n columns used, zero past n). A is scanned
// fractal row by fractal row, stopping once too few zero columns are left.
bool columns_to_keep_f16(const uint8_t* a, uint64_t m, uint64_t k, uint64_t k_blocks,
                         const float* b, uint64_t b_panel, uint64_t n,
                         std::vector<uint16_t>& magnitude_bits, std::vector<uint32_t>& kept) {
  const uint64_t min_zero = std::max<uint64_t>(1, k / kMinSkippedShare);
  // Per column: the OR over its rows of the stored bits, the sign masked off below.
  magnitude_bits.assign(k_blocks * 16, 0);
  for (uint64_t r16 = 0; r16 < m; r16 += kFractalRows) {
    const uint64_t rows = std::min(kFractalRows, m - r16);
    for (uint64_t kb = 0; kb < k_blocks; ++kb) {
      const uint8_t* frac = a + ((r16 / kFractalRows) * k_blocks + kb) * kFractalRows * 16 * 2;
      uint16_t* acc = &magnitude_bits[kb * 16];
      if (kb * 16 + 16 <= k) {  // a whole block: its 32-byte rows ORed as four 64-bit words
        uint64_t w[4] = {0, 0, 0, 0};
        for (uint64_t i = 0; i < rows; ++i)
          for (uint64_t q = 0; q < 4; ++q) w[q] |= bits<uint64_t>(frac + i * 32 + q * 8);
        uint64_t old[4];
        std::memcpy(old, acc, sizeof(old));
        for (uint64_t q = 0; q < 4; ++q) old[q] |= w[q];
        std::memcpy(acc, old, sizeof(old));
        continue;
      }
      for (uint64_t i = 0; i < rows; ++i)  // the last columns < k only (the rest may lie past A)
        for (uint64_t c = 0; c < k - kb * 16; ++c)
          acc[c] |= bits<uint16_t>(frac + (i * 16 + c) * 2);
    }
    if (zero_magnitudes(magnitude_bits.data(), k) < min_zero) return false;
  }
  // Row kk of B: 16 values in each panel; the columns past n are zero, so whole panels are
  // checked.
  auto finite_row = [&](uint64_t kk) {
    uint32_t non_finite = 0;
    for (uint64_t p = 0; p * kFractalRows < n; ++p) {
      const float* row = b + p * b_panel + kk * kFractalRows;
#if defined(__SSE2__)
      const __m128i exponent = _mm_set1_epi32(0x7f800000);
      __m128i any = _mm_setzero_si128();
      for (uint64_t c = 0; c < kFractalRows; c += 4) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + c));
        any = _mm_or_si128(any, _mm_cmpeq_epi32(_mm_and_si128(v, exponent), exponent));
      }
      non_finite |= static_cast<uint32_t>(_mm_movemask_epi8(any));
#else
      for (uint64_t c = 0; c < kFractalRows; ++c)
        non_finite |= static_cast<uint32_t>(
            (bits<uint32_t>(reinterpret_cast<const uint8_t*>(row + c)) & 0x7f800000u) ==
            0x7f800000u);
#endif
    }
    return non_finite == 0;
  };
  kept.clear();
  for (uint64_t kk = 0; kk < k; ++kk)
    if ((magnitude_bits[kk] & 0x7fff) != 0 || !finite_row(kk))
      kept.push_back(static_cast<uint32_t>(kk));
  if (kept.empty()) kept.push_back(0);  // the kernels want one column at least
  return k - kept.size() >= min_zero;
}

// Whether any element r < m, c < n of C (L0C's NZ layout, m16 rows per column block) is -0 or
// a NaN.
bool any_negative_zero_or_nan(const float* c, uint64_t m, uint64_t n, uint64_t m16) {
  uint32_t found = 0;
  auto check = [&found](uint32_t u) {
    found |= static_cast<uint32_t>(u == 0x80000000u) |
             static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
  };
  for (uint64_t nb = 0; nb * kFractalRows < n; ++nb) {
    const uint64_t cols = std::min(kFractalRows, n - nb * kFractalRows);
    const float* block = c + nb * kFractalRows * m16;
    if (cols == kFractalRows) {  // rows r < m of a whole column block lie back to back
      uint64_t e = 0;
#if defined(__SSE2__)
      const __m128i negative_zero = _mm_set1_epi32(static_cast<int32_t>(0x80000000u));
      const __m128i magnitude = _mm_set1_epi32(0x7fffffff), infinity = _mm_set1_epi32(0x7f800000);
      __m128i any = _mm_setzero_si128();
      for (; e + 4 <= m * kFractalRows; e += 4) {
        const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + e));
        any = _mm_or_si128(any, _mm_cmpeq_epi32(v, negative_zero));
        // NaN: |u| > inf's bits, both below 2^31 so the signed compare orders them
        any = _mm_or_si128(any, _mm_cmpgt_epi32(_mm_and_si128(v, magnitude), infinity));
      }
      found |= static_cast<uint32_t>(_mm_movemask_epi8(any));
#endif
      for (; e < m * kFractalRows; ++e)
        check(bits<uint32_t>(reinterpret_cast<const uint8_t*>(block + e)));
      continue;
    }
    for (uint64_t r = 0; r < m; ++r) {
      const float* row = c + nb * kFractalRows * m16 + r * kFractalRows;
      for (uint64_t j = 0; j < cols; ++j) {
        check(bits<uint32_t>(reinterpret_cast<const uint8_t*>(row + j)));
      }
    }
  }
  return found != 0;
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
    const uint64_t m16 = round_up(m, kFractalRows);
    const uint64_t b_panel = k * kFractalRows;  // elements of one column panel of B

    // A is widened by the kernels, a fractal row at a time (all_tiles). B widened in its Zn
    // layout, then rearranged into column panels (CubeOperands::b): fractal (kb, nb) is rows
    // kb * K0 .. of panel nb, zero past column n. Scratch reused across calls.
    std::vector<T>& b_buf = scratch<T>().b_buf;
    thread_local std::vector<T> b_wide;
    const uint64_t b_elems = layout::zn_extent(k, n, k0);
    const uint8_t* b_stored = ctx.local.at(Buf::L0B, xb, b_elems * size);
    b_buf.resize(n_blocks * b_panel);
    auto b_fractal = [&](uint64_t kb, uint64_t nb) {
      return &b_buf[nb * b_panel + kb * K0 * kFractalRows];
    };
    if constexpr (kType == Dtype::F16) {
      // Whole fractals only (k and n multiples of 16: convolutions and MatMuls of 16-channel
      // multiples): each widened straight into its place, fractal (kb, nb) at zn_offset in L0B.
      if (k % K0 == 0 && n % kFractalRows == 0) {
        for (uint64_t kb = 0; kb < k_blocks; ++kb)
          for (uint64_t nb = 0; nb < n_blocks; ++nb)
            widen_transpose_fractal_f16(
                b_stored + layout::zn_offset(kb * K0, nb * kFractalRows, n_blocks, K0) * size,
                b_fractal(kb, nb), kFractalRows);
        return run_tiles<kType>(ctx, k_blocks, m16, b_panel);
      }
    }
    b_wide.resize(b_elems);
    In::widen(b_stored, b_wide.data(), b_elems);
    if (const uint64_t used = n % kFractalRows; used != 0) {  // the last panel's columns past n
      T* last = &b_buf[(n_blocks - 1) * b_panel];
      for (uint64_t kk = 0; kk < k; ++kk)
        std::fill(last + kk * kFractalRows + used, last + (kk + 1) * kFractalRows, T(0));
    }
    for (uint64_t kb = 0; kb < k_blocks; ++kb)
      for (uint64_t nb = 0; nb < n_blocks; ++nb) {
        const T* frac = &b_wide[layout::zn_offset(kb * K0, nb * kFractalRows, n_blocks, K0)];
        uint64_t n_cnt = std::min<uint64_t>(kFractalRows, n - nb * kFractalRows);
        uint64_t k_cnt = std::min(K0, k - kb * K0);
        T* dst = b_fractal(kb, nb);
        if (n_cnt == kFractalRows && k_cnt == K0) {
          if constexpr (std::is_same_v<T, float> && K0 == 16) {
            transpose_fractal(frac, dst, kFractalRows);
          } else {
            for (uint64_t kk = 0; kk < K0; ++kk)
              for (uint64_t nn = 0; nn < kFractalRows; ++nn)
                dst[kk * kFractalRows + nn] = frac[nn * K0 + kk];
          }
        } else {
          for (uint64_t kk = 0; kk < k_cnt; ++kk)
            for (uint64_t nn = 0; nn < n_cnt; ++nn)
              dst[kk * kFractalRows + nn] = frac[nn * K0 + kk];
        }
      }
    run_tiles<kType>(ctx, k_blocks, m16, b_panel);
  }

  // The products of g (fp16 operands) without A's zero columns where that gives the same
  // bits (columns_to_keep_f16), into C at c; false, with C as before, where the caller has to
  // compute them with every column.
  bool run_kept_columns_f16(const CubeOperands<float>& g, float* c) const {
    struct Kept {
      std::vector<uint16_t> magnitude_bits;
      std::vector<uint32_t> cols;
      std::vector<float> c_before;
    };
    thread_local Kept s;
    if (!columns_to_keep_f16(g.a_stored, m, k, g.k_blocks, g.b, g.b_panel, n, s.magnitude_bits,
                             s.cols))
      return false;
    const uint64_t m16 = round_up(m, kFractalRows);
    const uint64_t c_elems = layout::l0c_extent(m, n);
    if (init == 1) s.c_before.assign(c, c + c_elems);  // C is also the initial value
    CubeOperands<float> kept = g;
    kept.k = s.cols.size();
    kept.k_index = s.cols.data();
    run_all_tiles_f16(kept);
    if (!any_negative_zero_or_nan(c, m, n, m16)) return true;
    if (init == 1) std::copy(s.c_before.begin(), s.c_before.end(), c);
    return false;
  }

  // The products into L0C, from A in L0A (widened a fractal row at a time) and B widened and
  // rearranged into scratch<T>().b_buf (run_typed).
  template <Dtype kType>
  void run_tiles(ExecContext& ctx, uint64_t k_blocks, uint64_t m16, uint64_t b_panel) const {
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
                            scratch<T>().b_buf.data(),
                            b_panel,
                            round_up(n, kFractalRows),
                            m,
                            k,
                            n,
                            in,
                            CView<T>{c, kFractalRows, kFractalRows * m16}};
    if constexpr (kType == Dtype::F16) {
      if (!run_kept_columns_f16(g, c)) run_all_tiles_f16(g);
    } else {
      run_all_tiles<T, K0>(g);
    }
    if (c != reinterpret_cast<T*>(l0c)) std::memcpy(l0c, c, c_bytes);
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
