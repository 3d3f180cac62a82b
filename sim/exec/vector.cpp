// The vector unit (pipe V): plan_vector() decodes, checks and costs a V instruction
// (vector_insn.cpp); execute_vector() applies it to the UB, bit-accurately, with the element
// functions of vector_ops.h. Semantics are documented in vector_ops.h (arithmetic, types) and
// vector_insn.h (operand geometry); the mask rules follow the brief's data-layout contract:
// inactive destination lanes are left unchanged, vcmp writes 0 bits for inactive lanes,
// reductions see only active lanes.
//
// Execution order: repeats in order; element-wise families read all sources of a run (the
// whole repeat when every operand's blocks are adjacent, else one block) before writing its
// destination, so a fully overlapping (in-place) operand is exact. Hardware requires a repeat's
// source and destination to overlap fully or not at all; for partial overlaps the result is
// this order's.
//
// Speed: the op and data type are resolved once per instruction (templates); per repeat the
// lanes that are contiguous in every operand (the whole repeat when all block strides are one
// block, else one block of the widest operand) are processed as one run, with a mask-free loop
// when all its lanes are active.
#include <algorithm>
#include <array>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#include <fmt/format.h>

#include "common/convert.h"
#include "common/error.h"
#include "sim/exec/exec.h"
#include "sim/exec/f16_bulk.h"
#include "sim/exec/host_simd.h"
#include "sim/exec/vector_insn.h"
#include "sim/exec/vector_ops.h"

namespace npusim {
namespace {

using isa::Dtype;
using vec::Family;
using vec::kBlockBytes;
using vec::Lanes;
using vec::VecInsn;
using vec::VecOperand;

// Storage-only access (bits moved unchanged).
template <class S>
struct Raw {
  using storage = S;
  using compute = S;
  static S load(const uint8_t* p) { return load_bits<S>(p); }
  static S from_compute(S v) { return v; }
};
template <int Size>
using RawOfSize = Raw<std::conditional_t<Size == 4, uint32_t, uint16_t>>;

// Calls body(r, p, first, run, active) for each run of lanes [first, first + run) of repeat r
// that is contiguous in each of the N operands; p[k] points at lane `first` of operand k, `run`
// is a std::integral_constant (the whole repeat when every operand's blocks are adjacent, else
// one 32-byte block of the widest operand, whose element size is Widest).
template <int Widest, size_t N, class Body>
void for_each_run(const VecInsn& vi, uint8_t* ub, std::array<const VecOperand*, N> ops,
                  Body&& body) {
  bool contiguous = true;
  for (const VecOperand* o : ops)
    if (o->blocks_per_repeat() > 1 && o->blk_bytes != static_cast<uint64_t>(kBlockBytes))
      contiguous = false;
  auto runs = [&](auto run) {
    for (uint64_t r = 0; r < vi.repeats; ++r) {
      const Lanes active = vi.active(r);
      for (int first = 0; first < vi.lanes; first += run) {
        std::array<uint8_t*, N> p;
        for (size_t k = 0; k < N; ++k) p[k] = ub + ops[k]->lane_addr(r, first);
        body(r, p, first, run, active);
      }
    }
  };
  if (contiguous)
    runs(std::integral_constant<int, vec::kRepeatBytes / Widest>{});
  else
    runs(std::integral_constant<int, kBlockBytes / Widest>{});
}

// Whether an element function also converts whole runs: F::bulk(src, out, n) writes
// out[i] = f(element i at src) for i < n (one source operand only).
template <class F, class = void>
struct HasBulk : std::false_type {};
template <class F>
struct HasBulk<F, std::void_t<decltype(&F::bulk)>> : std::true_type {};

// Runs shorter than this (one block of 8 lanes) take the element loop, inlined, even where F
// has bulk_f32: a call costs more than the four-lane loop saves there.
constexpr int kBulkF32MinRun = 64;
// Whether an element function of two f32 sources also computes whole runs: F::bulk_f32(a, b,
// out, n) writes out[i] = the f32 bits of f(a[i], b[i]) (NaN canonical) for i < n.
template <class F, class = void>
struct HasBulkF32 : std::false_type {};
template <class F>
struct HasBulkF32<F, std::void_t<decltype(&F::bulk_f32)>> : std::true_type {};

// Whether an element function computes f16 from f16 sources only (Elem<F16> policies: widen_f16
// on load, narrow_f16_rne on store). Runs of at least kBulkF16MinRun lanes of such an op widen
// each source and narrow the results in bulk on the host's converters (F16C), element for
// element the same bits as widen_f16 / narrow_f16_rne (f16_bulk.h: f16_to_f32_n keeps NaN
// payloads as widen_f16 does; f32_to_f16_canonical_n is narrow_f16_rne), around the same
// element function on the same floats.
template <class Dst, class... Src>
constexpr bool kAllF16 = std::is_same_v<Dst, Elem<Dtype::F16>> && sizeof...(Src) > 0 &&
                         (std::is_same_v<Src, Elem<Dtype::F16>> && ...);
constexpr int kBulkF16MinRun = 64;
// Elements of a dense f16 span widened at a time (elementwise_reusing): 12 KiB of floats on the
// stack for three sources.
constexpr int kDenseF16Chunk = 1024;

// dst = f(src...) on the active lanes of each run; Dst/Src are access policies (Elem<D> or
// Raw<S>). A run's results are computed into a local buffer first (all its sources are read
// before its destination is written), which lets the compiler vectorise the element loop.
// Reuse (one source only): a lane whose source bits equal the previous lane's takes that lane's
// result instead of calling f again, for element functions costly enough to pay for the compare
// (libm's expf/logf, conversions with a rounding mode); f is a pure function of the source bits,
// so the results are the same. Broadcast operands (a scalar spread over a tile) hit it.
template <class Dst, class F, bool Reuse, class... Src>
struct Elementwise {
  F f;
  template <size_t N, class Run>
  void operator()(uint64_t, const std::array<uint8_t*, N>& p, int first, Run, const Lanes& active) {
    split<Run::value>(p, first, active, std::make_index_sequence<N - 1>{});
  }
  template <int Run, size_t N, size_t... I>
  void split(const std::array<uint8_t*, N>& p, int first, const Lanes& active,
             std::index_sequence<I...>) {
    lanes<Run>(first, active, p[0], static_cast<const uint8_t*>(p[1 + I])...);
  }
  template <int Run, class... P>
  void lanes(int first, const Lanes& active, uint8_t* d, P... s) {
    using DS = typename Dst::storage;
    constexpr int dsize = sizeof(DS);
    DS out[Run];
    if constexpr (HasBulk<F>::value) {
      static_assert(sizeof...(P) == 1, "bulk element functions take one source");
      F::bulk(s..., out, Run);
    } else if constexpr (HasBulkF32<F>::value && Run >= kBulkF32MinRun) {
      static_assert(sizeof...(P) == 2 && dsize == 4, "bulk_f32 takes two f32 sources");
      F::bulk_f32(s..., out, Run);
    } else if constexpr (Reuse) {
      static_assert(sizeof...(Src) == 1, "reuse compares one source");
      using SS = typename std::tuple_element_t<0, std::tuple<Src...>>::storage;
      const uint8_t* src = std::get<0>(std::make_tuple(s...));
      SS prev{};
      for (int i = 0; i < Run; ++i) {
        const SS bits = load_bits<SS>(src + i * sizeof(SS));
        if (i > 0 && bits == prev) {
          out[i] = out[i - 1];
        } else {
          out[i] = Dst::from_compute(f(Src::load(src + i * sizeof(SS))...));
          prev = bits;
        }
      }
    } else if constexpr (kAllF16<Dst, Src...> && Run >= kBulkF16MinRun) {
      static const bool hw = f16_bulk_uses_hardware();
      if (hw) {
        wide_f16<Run>(out, std::make_index_sequence<sizeof...(P)>{}, s...);
      } else {
        for (int i = 0; i < Run; ++i)
          out[i] = Dst::from_compute(f(Src::load(s + i * sizeof(typename Src::storage))...));
      }
    } else {
      for (int i = 0; i < Run; ++i)
        out[i] = Dst::from_compute(f(Src::load(s + i * sizeof(typename Src::storage))...));
    }
    if (active.all(first, Run)) {
      std::memcpy(d, out, sizeof(out));
    } else {
      for (int i = 0; i < Run; ++i)
        if (active.test(first + i)) std::memcpy(d + i * dsize, &out[i], dsize);
    }
  }
  // Elements [first, first + Run) of a dense f16 span (elementwise_reusing): d and s[k] point at
  // element 0 of the destination and of source k.
  template <int Run, size_t M>
  void dense_f16(uint8_t* d, const std::array<const uint8_t*, M>& s, uint64_t first) {
    uint16_t out[Run];
    dense_f16_sources<Run>(out, s, first, std::make_index_sequence<M>{});
    std::memcpy(d + first * sizeof(uint16_t), out, sizeof(out));
  }
  template <int Run, size_t M, size_t... K>
  void dense_f16_sources(uint16_t* out, const std::array<const uint8_t*, M>& s, uint64_t first,
                         std::index_sequence<K...> k) {
    wide_f16<Run>(out, k, (s[K] + first * sizeof(uint16_t))...);
  }
  // out[i] = narrow_f16_rne(f(widen_f16(source k lane i)...)) for i < Run (kAllF16 ops): the
  // sources widened, f applied and the results narrowed, each in one pass over the run.
  template <int Run, size_t... K, class... P>
  void wide_f16(uint16_t* out, std::index_sequence<K...>, P... s) {
    float wide[sizeof...(P)][Run];
    ((f16_to_f32_n(s, wide[K], Run)), ...);
    float result[Run];
    for (int i = 0; i < Run; ++i) result[i] = f(wide[K][i]...);
    f32_to_f16_canonical_n(result, out, Run);
  }
};

// How many leading elements of a dense span the instruction writes, or 0 where it is not one
// span: each operand's blocks and repeats lie back to back (lane i of repeat r is element
// r * lanes + i of the operand's byte range), the active lanes are exactly the first n of
// those elements (no mask, a counter mask, or a normal mask with every lane set), and the
// destination's range overlaps no source's (in_place: or is exactly a source's range, of the
// same element size). Then one pass over n elements gives what the repeat-by-repeat order
// gives (each element's result depends on its own sources only; an in-place pass reads each
// element's sources before it writes that element, and no other element reads it).
template <size_t N>
uint64_t dense_span_elements(const VecInsn& vi, const std::array<const VecOperand*, N>& ops,
                             bool in_place = false) {
  const uint64_t lanes = static_cast<uint64_t>(vi.lanes), total = vi.repeats * lanes;
  for (const VecOperand* o : ops) {
    const uint64_t per_repeat = static_cast<uint64_t>(o->bytes_per_repeat);
    if (o->dense || per_repeat != lanes * static_cast<uint64_t>(o->elem_size) ||
        o->rep_bytes != per_repeat ||
        (o->blocks_per_repeat() > 1 && o->blk_bytes != static_cast<uint64_t>(kBlockBytes)))
      return 0;
  }
  const VecOperand& d = *ops[0];
  for (size_t k = 1; k < N; ++k) {
    const VecOperand& s = *ops[k];
    if (in_place && s.addr == d.addr && s.elem_size == d.elem_size) continue;
    if (d.addr < s.addr + vi.repeats * s.rep_bytes && s.addr < d.addr + vi.repeats * d.rep_bytes)
      return 0;
  }
  if (!vi.masked) return total;
  if (vi.mask.counter_mode) return std::min<uint64_t>(vi.mask.count, total);
  return vi.active(0).all(0, vi.lanes) ? total : 0;
}

template <bool Reuse, class Dst, class... Src, class F>
void elementwise_reusing(const VecInsn& vi, uint8_t* ub, F f) {
  constexpr size_t N = 1 + sizeof...(Src);
  constexpr int widest =
      std::max({int(sizeof(typename Dst::storage)), int(sizeof(typename Src::storage))...});
  std::array<const VecOperand*, N> ops{};
  for (size_t k = 0; k < N; ++k) ops[k] = &vi.operand[k];  // dst, src0, src1 slots
  if constexpr (HasBulk<F>::value) {  // a cast of a whole tile: one bulk conversion
    if (const uint64_t n = dense_span_elements(vi, ops)) {
      F::bulk(ub + ops[1]->addr, reinterpret_cast<typename Dst::storage*>(ub + ops[0]->addr),
              static_cast<int>(n));
      return;
    }
  } else if constexpr (HasBulkF32<F>::value) {
    // f32 add, sub, mul, div of a whole tile, in place or not: one bulk pass (bulk_f32 loads
    // each group of lanes before it stores it), without the runs' staging buffer.
    if (const uint64_t n = dense_span_elements(vi, ops, /*in_place=*/true)) {
      F::bulk_f32(ub + ops[1]->addr, ub + ops[2]->addr,
                  reinterpret_cast<uint32_t*>(ub + ops[0]->addr), static_cast<int>(n));
      return;
    }
  } else if constexpr (kAllF16<Dst, Src...> && !Reuse) {
    // An f16 op of a whole tile, in place or not: widened, computed and narrowed a chunk at a
    // time as a run's wide_f16 does (a chunk's sources are read before its results are stored).
    static const bool hw = f16_bulk_uses_hardware();
    if (hw)
      if (const uint64_t n = dense_span_elements(vi, ops, /*in_place=*/true)) {
        Elementwise<Dst, F, Reuse, Src...> e{f};
        constexpr int chunk = kDenseF16Chunk;
        uint8_t* d = ub + ops[0]->addr;
        std::array<const uint8_t*, N - 1> s;
        for (size_t k = 1; k < N; ++k) s[k - 1] = ub + ops[k]->addr;
        uint64_t i = 0;
        for (; i + chunk <= n; i += chunk) e.template dense_f16<chunk>(d, s, i);
        for (; i + kBulkF16MinRun <= n; i += kBulkF16MinRun)
          e.template dense_f16<kBulkF16MinRun>(d, s, i);
        for (; i < n; ++i) e.template dense_f16<1>(d, s, i);
        return;
      }
  }
  for_each_run<widest>(vi, ub, ops, Elementwise<Dst, F, Reuse, Src...>{f});
}
// Without reuse: every lane calls f.
template <class Dst, class... Src, class F>
void elementwise(const VecInsn& vi, uint8_t* ub, F f) {
  elementwise_reusing<false, Dst, Src...>(vi, ub, f);
}

// The scalar operand as a compute value: fp32 bits rounded to nearest even for float types,
// the register's low bits for integer types.
template <Dtype D>
typename Elem<D>::compute scalar_value(int64_t reg) {
  using E = Elem<D>;
  if constexpr (E::is_float)
    return E::to_compute(E::from_compute(bits_to_f32(static_cast<uint32_t>(reg))));
  else
    return static_cast<typename E::compute>(reg);
}

template <isa::Cmp C, class T>
bool compare(T a, T b) {
  switch (C) {
    case isa::Cmp::EQ: return a == b;
    case isa::Cmp::NE: return a != b;
    case isa::Cmp::LT: return a < b;
    case isa::Cmp::GT: return a > b;
    case isa::Cmp::LE: return a <= b;
    case isa::Cmp::GE: return a >= b;
  }
  return false;
}

#if defined(__SSE2__)
// compare<C> on four f32 lanes: all ones where it holds. The SSE predicates treat NaN as
// compare() does (false but for NE; -0 == +0).
template <isa::Cmp C>
__m128 compare4(__m128 a, __m128 b) {
  switch (C) {
    case isa::Cmp::EQ: return _mm_cmpeq_ps(a, b);
    case isa::Cmp::NE: return _mm_cmpneq_ps(a, b);
    case isa::Cmp::LT: return _mm_cmplt_ps(a, b);
    case isa::Cmp::GT: return _mm_cmpgt_ps(a, b);
    case isa::Cmp::LE: return _mm_cmple_ps(a, b);
    case isa::Cmp::GE: return _mm_cmpge_ps(a, b);
  }
  return _mm_setzero_ps();
}

// Four 32-bit lanes, all ones where bit i of `nibble` is set.
inline __m128i nibble_lanes(unsigned nibble) {
  return _mm_sub_epi32(
      _mm_setzero_si128(),
      _mm_set_epi32(static_cast<int>((nibble >> 3) & 1u), static_cast<int>((nibble >> 2) & 1u),
                    static_cast<int>((nibble >> 1) & 1u), static_cast<int>(nibble & 1u)));
}
#endif

template <Dtype D, isa::Cmp C>
void run_compare_as(const VecInsn& vi, uint8_t* ub) {
  using E = Elem<D>;
  constexpr int size = sizeof(typename E::storage);
  const VecOperand& dst = vi.operand[vec::kDst];
  std::array<const VecOperand*, 2> ops{&vi.operand[vec::kSrc0], &vi.operand[vec::kSrc1]};
  Lanes bits;
  // After a repeat's last run: its bits to the destination row (lane i is bit i % 8 of byte
  // i / 8).
  const auto finish_repeat = [&](uint64_t r, int first, int n) {
    if (first + n != vi.lanes) return;
    uint8_t* row = ub + dst.addr + r * dst.rep_bytes;
    for (int byte = 0; byte < dst.bytes_per_repeat; ++byte)
      row[byte] = static_cast<uint8_t>(
          (byte < 8 ? bits.lo >> (8 * byte) : bits.hi >> (8 * (byte - 8))) & 0xffu);
  };
  for_each_run<size>(
      vi, ub, ops,
      [&](uint64_t r, std::array<uint8_t*, 2> p, int first, int n, const Lanes& active) {
        if (first == 0) bits = Lanes{};
        if (active.all(first, n)) {
      // Without branches on the data, 64 lanes to a word: a run never crosses a word (it is a
      // whole repeat, or one block of 8 or 16 lanes starting at a multiple of its size).
#if defined(__SSE2__)
          if constexpr (D == Dtype::F32) {  // 4 lanes at a time (a run is 8 or 64 lanes)
            uint64_t word = 0;
            for (int i = 0; i < n; i += 4)
              word |= uint64_t(_mm_movemask_ps(compare4<C>(
                          _mm_loadu_ps(reinterpret_cast<const float*>(p[0] + i * size)),
                          _mm_loadu_ps(reinterpret_cast<const float*>(p[1] + i * size)))))
                      << i;
            (first < 64 ? bits.lo : bits.hi) |= word << (first & 63);
            return finish_repeat(r, first, n);
          }
#endif
          for (int base = 0; base < n; base += 64) {
            uint64_t word = 0;
            for (int i = base; i < std::min(n, base + 64); ++i)
              word |= uint64_t{compare<C>(E::load(p[0] + i * size), E::load(p[1] + i * size))}
                      << (i - base);
            const int lane = first + base;
            (lane < 64 ? bits.lo : bits.hi) |= word << (lane & 63);
          }
        } else {
          for (int i = 0; i < n; ++i)
            if (active.test(first + i) &&
                compare<C>(E::load(p[0] + i * size), E::load(p[1] + i * size)))
              bits.set(first + i);
        }
        finish_repeat(r, first, n);
      });
}

template <Dtype D>
void run_compare(const VecInsn& vi, uint8_t* ub) {
  switch (vi.cmp) {
    case isa::Cmp::EQ: return run_compare_as<D, isa::Cmp::EQ>(vi, ub);
    case isa::Cmp::NE: return run_compare_as<D, isa::Cmp::NE>(vi, ub);
    case isa::Cmp::LT: return run_compare_as<D, isa::Cmp::LT>(vi, ub);
    case isa::Cmp::GT: return run_compare_as<D, isa::Cmp::GT>(vi, ub);
    case isa::Cmp::LE: return run_compare_as<D, isa::Cmp::LE>(vi, ub);
    case isa::Cmp::GE: return run_compare_as<D, isa::Cmp::GE>(vi, ub);
  }
}

// f32 add, sub, mul and div of whole runs in AVX-512 or AVX registers where the host has them:
// each lane is the same IEEE operation as the scalar `a op b` (rounded to nearest even under
// the same MXCSR), then a NaN is replaced by the canonical NaN (Elem<F32>::from_compute), so
// the bits are those of the element loop. The element loop, compiled for SSE2, computed four
// lanes at a time; the batch-norm and optimizer kernels spend most of their vector time here.
enum class WideF32 { kAdd, kSub, kMul, kDiv };
template <class Fn>
constexpr WideF32 wide_f32_of() {
  if constexpr (std::is_same_v<Fn, vec::Add>)
    return WideF32::kAdd;
  else if constexpr (std::is_same_v<Fn, vec::Sub>)
    return WideF32::kSub;
  else if constexpr (std::is_same_v<Fn, vec::Mul>)
    return WideF32::kMul;
  else
    return WideF32::kDiv;
}
template <class Fn>
inline constexpr bool kWideF32 = std::is_same_v<Fn, vec::Add> || std::is_same_v<Fn, vec::Sub> ||
                                 std::is_same_v<Fn, vec::Mul> || std::is_same_v<Fn, vec::Div>;

// out[i] = bits of canonical_f32(a[i] op b[i]) for i in [from, n), one lane at a time.
template <WideF32 W>
void binary_f32_scalar(const uint8_t* a, const uint8_t* b, uint32_t* out, int from, int n) {
  for (int i = from; i < n; ++i) {
    const float x = Elem<Dtype::F32>::load(a + 4 * i), y = Elem<Dtype::F32>::load(b + 4 * i);
    float r;
    if constexpr (W == WideF32::kAdd)
      r = x + y;
    else if constexpr (W == WideF32::kSub)
      r = x - y;
    else if constexpr (W == WideF32::kMul)
      r = x * y;
    else
      r = x / y;
    out[i] = Elem<Dtype::F32>::from_compute(r);
  }
}

#if defined(__GNUC__) && defined(__x86_64__)
#define NPUSIM_VECTOR_X86_VARIANTS 1
template <WideF32 W>
__attribute__((target("avx512f"))) void binary_f32_avx512(const uint8_t* a, const uint8_t* b,
                                                          uint32_t* out, int n) {
  const __m512 nan = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(kF32CanonicalNan)));
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(a + 4 * i), y = _mm512_loadu_ps(b + 4 * i);
    __m512 r;
    if constexpr (W == WideF32::kAdd)
      r = _mm512_add_ps(x, y);
    else if constexpr (W == WideF32::kSub)
      r = _mm512_sub_ps(x, y);
    else if constexpr (W == WideF32::kMul)
      r = _mm512_mul_ps(x, y);
    else
      r = _mm512_div_ps(x, y);
    r = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q), r, nan);
    _mm512_storeu_ps(out + i, r);
  }
  binary_f32_scalar<W>(a, b, out, i, n);
}
template <WideF32 W>
__attribute__((target("avx"))) void binary_f32_avx(const uint8_t* a, const uint8_t* b,
                                                   uint32_t* out, int n) {
  const __m256 nan = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(kF32CanonicalNan)));
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(reinterpret_cast<const float*>(a + 4 * i));
    const __m256 y = _mm256_loadu_ps(reinterpret_cast<const float*>(b + 4 * i));
    __m256 r;
    if constexpr (W == WideF32::kAdd)
      r = _mm256_add_ps(x, y);
    else if constexpr (W == WideF32::kSub)
      r = _mm256_sub_ps(x, y);
    else if constexpr (W == WideF32::kMul)
      r = _mm256_mul_ps(x, y);
    else
      r = _mm256_div_ps(x, y);
    // (and / andnot / or: GCC splits _mm256_blendv_ps with a compare's mask into lanes)
    const __m256 is_nan = _mm256_cmp_ps(r, r, _CMP_UNORD_Q);
    r = _mm256_or_ps(_mm256_andnot_ps(is_nan, r), _mm256_and_ps(is_nan, nan));
    _mm256_storeu_ps(reinterpret_cast<float*>(out + i), r);
  }
  binary_f32_scalar<W>(a, b, out, i, n);
}
#endif

// The element function of a binary f32 op with bulk_f32 (Elementwise) for whole runs.
template <class Fn>
struct WideBinaryF32 {
  static constexpr WideF32 kOp = wide_f32_of<Fn>();
  float operator()(float a, float b) const { return Fn::apply(a, b); }
  static void bulk_f32(const uint8_t* a, const uint8_t* b, uint32_t* out, int n) {
#ifdef NPUSIM_VECTOR_X86_VARIANTS
    static const int isa_level = static_cast<int>(host_simd());
    if (isa_level == 2) return binary_f32_avx512<kOp>(a, b, out, n);
    if (isa_level == 1) return binary_f32_avx<kOp>(a, b, out, n);
#endif
    binary_f32_scalar<kOp>(a, b, out, 0, n);
  }
};

template <class Op, Dtype D>
void run_typed(const VecInsn& vi, uint8_t* ub) {
  using E = Elem<D>;
  using T = typename E::compute;
  if constexpr (Op::family == Family::kBinary) {
    using Fn = typename Op::Elementwise;
    if constexpr (D == Dtype::F32 && kWideF32<Fn>)
      elementwise<E, E, E>(vi, ub, WideBinaryF32<Fn>{});
    else
      elementwise<E, E, E>(vi, ub, [](T a, T b) { return Fn::apply(a, b); });
  } else if constexpr (Op::family == Family::kUnary) {
    if constexpr (Op::kMove) {
      using R = RawOfSize<sizeof(typename E::storage)>;
      elementwise<R, R>(vi, ub, [](typename R::storage a) { return a; });
    } else {
      using Fn = typename Op::Elementwise;
      constexpr bool costly = Op::cost == vec::CostClass::kTranscendental;
      elementwise_reusing<costly, E, E>(vi, ub, [](T a) { return Fn::apply(a); });
    }
  } else if constexpr (Op::family == Family::kScalar) {
    using Fn = typename Op::Elementwise;
    const T s = scalar_value<D>(vi.scalar);
    elementwise<E, E>(vi, ub, [s](T a) { return Fn::apply(a, s); });
  } else if constexpr (Op::family == Family::kDup) {
    using R = RawOfSize<sizeof(typename E::storage)>;
    typename R::storage bits;
    if constexpr (D == Dtype::F32)
      bits = static_cast<uint32_t>(vi.scalar);  // the fp32 bits themselves
    else
      bits = E::from_compute(scalar_value<D>(vi.scalar));
    elementwise<R>(vi, ub, [bits]() { return bits; });
  } else if constexpr (Op::family == Family::kSelect) {
    using R = RawOfSize<sizeof(typename E::storage)>;
    constexpr int size = sizeof(typename R::storage);
    const VecOperand& sel = vi.operand[vec::kSel];
    std::array<const VecOperand*, 3> ops{&vi.operand[vec::kDst], &vi.operand[vec::kSrc0],
                                         &vi.operand[vec::kSrc1]};
    for_each_run<size>(
        vi, ub, ops,
        [&](uint64_t r, std::array<uint8_t*, 3> p, int first, int n, const Lanes& active) {
          const uint8_t* bits = ub + sel.addr + r * sel.rep_bytes;
          // All lanes active and each source the destination itself or apart from it: the lanes
          // do not see each other's results, so a loop without branches on the data gives the
          // lane-by-lane result below.
          const auto apart = [&](const uint8_t* q) {
            return q == p[0] || q + n * size <= p[0] || p[0] + n * size <= q;
          };
          if (active.all(first, n) && apart(p[1]) && apart(p[2])) {
#if defined(__SSE2__)
            if constexpr (size == 4) {  // 4 lanes at a time, a nibble of selector bits each
              for (int i = 0; i < n; i += 4) {
                const int lane = first + i;  // a multiple of 4: its nibble lies in one byte
                const __m128i m = nibble_lanes((bits[lane / 8] >> (lane % 8)) & 0xfu);
                const __m128i a =
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[1] + i * size));
                const __m128i b =
                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(p[2] + i * size));
                _mm_storeu_si128(reinterpret_cast<__m128i*>(p[0] + i * size),
                                 _mm_or_si128(_mm_and_si128(m, a), _mm_andnot_si128(m, b)));
              }
              return;
            }
#endif
            using S = typename R::storage;
            for (int i = 0; i < n; ++i) {
              const int lane = first + i;
              const S take0 =
                  static_cast<S>(0) - static_cast<S>((bits[lane / 8] >> (lane % 8)) & 1u);
              const S v = static_cast<S>((load_bits<S>(p[1] + i * size) & take0) |
                                         (load_bits<S>(p[2] + i * size) & static_cast<S>(~take0)));
              store_bits<S>(p[0] + i * size, v);
            }
            return;
          }
          for (int i = 0; i < n; ++i) {
            int lane = first + i;
            if (!active.test(lane)) continue;
            bool take0 = (bits[lane / 8] >> (lane % 8)) & 1u;
            std::memcpy(p[0] + i * size, (take0 ? p[1] : p[2]) + i * size, size);
          }
        });
  } else if constexpr (Op::family == Family::kCompare) {
    run_compare<D>(vi, ub);
  } else if constexpr (Op::family == Family::kReduce) {
    const VecOperand& dst = vi.operand[vec::kDst];
    std::array<const VecOperand*, 1> ops{&vi.operand[vec::kSrc0]};
    constexpr int size = sizeof(typename E::storage);
    T acc = Op::template identity<T>();
    for_each_run<size>(
        vi, ub, ops,
        [&](uint64_t r, std::array<uint8_t*, 1> p, int first, int n, const Lanes& active) {
          if (first == 0) acc = Op::template identity<T>();  // a new repeat
          for (int i = 0; i < n; ++i)
            if (active.test(first + i)) acc = Op::combine(acc, E::load(p[0] + i * size));
          if (first + n == vi.lanes) E::store(ub + dst.addr + r * dst.rep_bytes, acc);
        });
  }
}

// The f32 <-> f16 conversions of casts, whole runs at a time (f16_bulk.h); element for element
// the same as convert_element (f32 -> f16 with RoundMode::kRint; f16 -> f32 is exact in every
// mode).
struct F32ToF16Rint {
  uint16_t operator()(uint32_t s) const {
    return convert_element<Dtype::F16, Dtype::F32>(s, RoundMode::kRint);
  }
  static void bulk(const uint8_t* src, uint16_t* out, int n) {
    f32_to_f16_canonical_n(src, out, static_cast<size_t>(n));
  }
};
struct F16ToF32 {
  uint32_t operator()(uint16_t s) const {
    return convert_element<Dtype::F32, Dtype::F16>(s, RoundMode::kRint);
  }
  static void bulk(const uint8_t* src, uint32_t* out, int n) {
    f16_to_f32_canonical_n(src, out, static_cast<size_t>(n));
  }
};

template <Dtype To, Dtype From>
void run_convert(const VecInsn& vi, uint8_t* ub) {
  using DR = Raw<typename Elem<To>::storage>;
  using SR = Raw<typename Elem<From>::storage>;
  const RoundMode m = vi.round;
  if constexpr (To == Dtype::F16 && From == Dtype::F32) {
    if (m == RoundMode::kRint) return elementwise<DR, SR>(vi, ub, F32ToF16Rint{});
  } else if constexpr (To == Dtype::F32 && From == Dtype::F16) {
    return elementwise<DR, SR>(vi, ub, F16ToF32{});
  }
  elementwise_reusing<true, DR, SR>(
      vi, ub, [m](typename SR::storage s) { return convert_element<To, From>(s, m); });
}

void run_transpose(const VecInsn& vi, uint8_t* ub) {
  constexpr int n = vec::kTransposeSide;
  std::array<uint16_t, n * n> m;  // copied first, so src and dst may overlap
  std::memcpy(m.data(), ub + vi.operand[vec::kSrc0].addr, sizeof(m));
  uint8_t* dst = ub + vi.operand[vec::kDst].addr;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) store_bits<uint16_t>(dst + (j * n + i) * 2, m[i * n + j]);
}

// Calls f(std::integral_constant<Dtype, t>{}) if t is in Types (plan() rejects other types).
template <vec::TypeSet Types, class F>
void visit_supported(Dtype t, F&& f) {
  visit_elem_dtype(t, [&](auto d) {
    if constexpr ((Types & vec::type_bit(decltype(d)::value)) != 0) f(d);
  });
}

}  // namespace

namespace {

// vmla: dst = src0 * src1 + dst on the active lanes (vec::MulAddDst); the accumulator is the
// fourth operand (dst read, decode_vector), so each run reads all three before writing dst.
template <Dtype D>
void run_multiply_accumulate(const VecInsn& vi, uint8_t* ub) {
  using E = Elem<D>;
  using T = typename E::compute;
  const std::array<const VecOperand*, 4> ops{&vi.operand[vec::kDst], &vi.operand[vec::kSrc0],
                                             &vi.operand[vec::kSrc1], &vi.operand[vec::kSel]};
  const auto f = [](T a, T b, T acc) { return vec::MulAddDst<E>::apply(a, b, acc); };
  for_each_run<sizeof(typename E::storage)>(vi, ub, ops,
                                            Elementwise<E, decltype(f), false, E, E, E>{f});
}

}  // namespace

ExecCost plan_vector(const IssuedOp& op, const ExecContext& ctx) {
  if (!ctx.core.has(isa::Pipe::V))
    throw KernelFault(fmt::format("{}: this core has no vector pipe", op.insn->desc().mnemonic));
  VecInsn vi = vec::decode_vector(op, ctx.cfg);
  vec::check_vector_bounds(vi, ctx.local);
  return vec::vector_cost(vi, ctx.cfg);
}

namespace {

// A decoded vector instruction, carried out on the UB (execute_vector, prepare_vector).
struct VectorExec {
  VecInsn vi;

  void run(ExecContext& ctx) const {
    if (vi.repeats == 0) return;
    uint8_t* ub = ctx.local.at(isa::Buf::UB, 0, ctx.local.capacity(isa::Buf::UB));
    vec::visit_vector_op(vi.op, [&](auto o) {
      using Op = decltype(o);
      if constexpr (Op::family == Family::kTranspose) {
        run_transpose(vi, ub);
      } else if constexpr (Op::family == Family::kBinaryConvert) {
        // decode_vector admits f16 <- f32 only (vector_pair_ok).
        elementwise<Raw<uint16_t>, Elem<Dtype::F32>, Elem<Dtype::F32>>(
            vi, ub, [](float a, float b) { return vec::AddReluConvF32ToF16::apply(a, b); });
      } else if constexpr (Op::family == Family::kMultiplyAccumulate) {
        visit_supported<Op::types>(
            vi.type, [&](auto d) { run_multiply_accumulate<decltype(d)::value>(vi, ub); });
      } else if constexpr (Op::family == Family::kConvert) {
        visit_supported<Op::types>(vi.type, [&](auto to) {
          visit_supported<Op::types>(vi.src_type, [&](auto from) {
            run_convert<decltype(to)::value, decltype(from)::value>(vi, ub);
          });
        });
      } else {
        visit_supported<Op::types>(vi.type,
                                   [&](auto d) { run_typed<Op, decltype(d)::value>(vi, ub); });
      }
    });
  }
};

}  // namespace

void execute_vector(const IssuedOp& op, ExecContext& ctx) {
  VectorExec{vec::decode_vector(op, ctx.cfg)}.run(ctx);
}

std::unique_ptr<PreparedOp> prepare_vector(const IssuedOp& op, const ExecContext& ctx) {
  return std::make_unique<PreparedDescriptor<VectorExec>>(
      VectorExec{vec::decode_vector(op, ctx.cfg)});
}

}  // namespace npusim
