// StatelessRandomUniformV2 on the vector unit: Philox4x32-10 for a tile of groups at once, from
// the vector instructions the ISA has (random.h says what is computed; this file how).
//
// Data: the four counter words of a tile of TG groups live in four s32 arrays of the UB, lane l
// of array j holding word j of group tile_start + lane_group(l) (a bit permutation of l, below),
// each word's u32 bits in an s32 lane. The operations Philox needs, composed:
// - x * M mod 2^32 (the product's low word): vmuls.s32 (wrapping).
// - the product's high word: 16-bit pieces (below), exact s32 products, and arithmetic shifts by
//   16 as asr16(v) = vconv.s32.f32.floor(vmuls.f32(vconv.f32.s32.floor(v), 2^-16)): rounding v
//   DOWN to fp32's 24 bits keeps it >= floor(v / 2^16) * 2^16 (representable), so the floor of
//   the scaled value is floor(v / 2^16) exactly, for every s32 v.
// - v & 0xffff and the other masks: vand on the u16 view (bitwise, so per 16-bit half) with one
//   repeat of the mask read by every repeat (repeat stride 0).
// - a ^ b = (a | b) - (a & b) (a & b is a subset of a | b's bits: no borrow), 3 instructions.
//
// High word of M * x (M a u32 constant with its top bit set, as both Philox multipliers have; x
// a word): with M_s = M - 2^32 = MH * 2^16 + ML (ML the sign-extended low 16 bits, |MH|,
// |ML| <= 2^15) and x = xH * 2^16 + xL (unsigned 16-bit pieces), M * x = M_s * x + 2^32 * x, so
//   hi(M * x) = floor(M_s * x / 2^32) + x (mod 2^32).
// The high piece may be taken as xK = xH + K with K = 0 or -2^16 (x' = x + K * 2^16; for
// K = -2^16, x' = x - 2^32 and floor(M_s * x / 2^32) = floor(M_s * x' / 2^32) + M_s): with the
// exact s32 products a = ML * xL, b = MH * xL, d = ML * xK, e = MH * xK,
//   floor(M_s * x' / 2^32) = e + floor((b + d + a / 2^16) / 2^16) = e + asr16(b + d + asr16(a))
// (floor((N + y) / 2^16) = floor((N + floor(y)) / 2^16) for an integer N) when b + d + asr16(a)
// stays in s32 for every x: K = 0 for M0; M1's b and d have one sign (both halves negative),
// and K = -2^16 moves d to the other (mul_offset). xK is the pieces' vand with 0xffff, or their
// vor with 0xffff0000 (xH - 2^16). 20 vector instructions per product (21 with the + M_s), 6
// per three-way xor with the round key (a repeat of the key, dup'd once per block), 53 per round
// over the tile; the uniform floats 3 (f32) or 4 (f16, bf16) per word. Every result goes to a
// fresh UB array in a bank window none of its sources is in (ArrayPool): no instruction writes
// an operand it reads, and few share banks.
//
// Output order: element 4g + j is word j of group g, but the words are in separate arrays, and
// vector operands and MTE bursts move whole 32-byte blocks. The interleave goes through
// vtranspose (16 x 16 2-byte elements), with the groups laid out over the lanes so that whole
// blocks move between transposes:
// - f32 (chunks of 128 groups, 512 lanes = 16 rows of 8 u32 per word): lane l = 128c + 8r + m
//   holds group 128c + 32(m >> 1) + 2r + (m & 1). Transposing chunk c of word j puts u32 column
//   m of its 16 rows as two rows (low and high halves): 16 words of groups 128c + 32q + 2k + t
//   (k = 0..15, m = 2q + t). For each q, the 16 rows (low, high) of (t, j), i = 4t + j, stacked
//   and transposed again give row k = words 0..3 of groups 128c + 32q + 2k and + 2k + 1: 512
//   bytes of the output in order. Per chunk: 4 + 4 vtransposes and a share of 16 block copies.
// - f16 / bf16 (chunks of 64 groups): lane l = 64c + 16s + p (s < 4, p < 16) holds group
//   64c + s + 4p; rows 4s + j = block s of word j's chunk, transposed, are the chunk's 512 bytes.
// The lane_group permutation's contribution of each bit of l is a weight (lane_bit_weight);
// the lanes' group offsets are built once per block by doubling.
//
// Counters: per tile the scalar unit computes the tile's first counter (128-bit add) and its
// words b0..b3, and (b1..b3) + 1 (the carry when the low word wraps inside the tile); lanes get
// c0 = b0 + offset and c3 selected by offset >= 2^32 - b0 (vcmp / vsel). c1 and c2 are the
// same in every lane but for that carry, and so are round 0's M1 half and round 1's M0 product:
// the scalar unit computes both values of each and the lanes select them too
// (emit_tile_counters), so rounds 0 and 1 take 26 + 29 vector instructions. No branch depends
// on the key or counter (a launch replays at the next step's key).
//
// Tiles: TG groups, a power of two from the chunk up to kMaxTileGroups, as large as the work per
// core calls for and the UB holds; tiles are split over the vector cores. The last tile
// computes whole chunks and stores the output's bytes rounded up to 32 (the buffer contract,
// op_desc.h). The store of tile t (MTE3) overlaps the rounds of tile t + 1.
#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/random.h"
#include "adapter/compiler/ops/row_kernel.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/convert.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;
using isa::Pipe;

namespace {

constexpr int64_t kLow32 = 0xffffffff;
constexpr int64_t kRepeat = vec::kRepeatBytes;  // 256 bytes: 64 s32 lanes
constexpr int64_t kBlockB = vec::kBlockBytes;   // 32 bytes
constexpr int64_t kTransposeBytes = 512;        // one vtranspose: 16 x 16 2-byte elements
// Largest tile: the f16 / bf16 block copy's source block stride, TG / 16 blocks, is an RU8 (and
// no chip's UB holds the arrays of 4096 groups).
constexpr int64_t kMaxTileGroups = 2048;

// A Philox multiplier M (top bit set) as M - 2^32 = hi * 2^16 + lo, |hi|, |lo| <= 2^15.
struct SignedHalves {
  int64_t lo, hi;
};
constexpr SignedHalves signed_halves(int64_t m) {
  const int64_t ms = m - (int64_t{1} << 32);
  const int64_t lo = ((ms & 0xffff) ^ 0x8000) - 0x8000;
  return {lo, (ms - lo) / 65536};
}
static_assert(kPhiloxM0 >= (int64_t{1} << 31) && kPhiloxM1 >= (int64_t{1} << 31));
static_assert(signed_halves(kPhiloxM0).hi >= -32768 && signed_halves(kPhiloxM1).hi >= -32768);

// The weight of bit k of a lane index in its group offset (the layouts in the file comment).
int64_t lane_bit_weight(int k, int elem_bytes) {
  static constexpr int64_t kF32[] = {1, 32, 64, 2, 4, 8, 16};  // bits 0..6, then 2^k
  static constexpr int64_t kF16[] = {4, 8, 16, 32, 1, 2};      // bits 0..5, then 2^k
  if (elem_bytes == 4) return k < 7 ? kF32[k] : int64_t{1} << k;
  return k < 6 ? kF16[k] : int64_t{1} << k;
}

// UB layout of one block's work (byte offsets; every region a whole number of repeats).
struct Layout {
  int64_t tile_groups = 0;
  int64_t array = 0;  // bytes of one s32 array of the tile
  uint64_t lane_offsets = 0, carry_bits = 0;
  uint64_t mask16 = 0, high16 = 0, mantissa = 0, one_bits = 0, keys = 0, tile_words = 0;
  std::vector<uint64_t> pool;               // s32 arrays for the words and temporaries
  uint64_t floats = 0, stage = 0, out = 0;  // float words, transposed stage, output (contiguous)
  int64_t bytes = 0;
};

constexpr int kPoolArrays = 16;  // words, products and temporaries live at once (below)
constexpr int kRounds = 10;

// The UB's bank windows: (address / 256) modulo windows() is the window of an address; two
// operands of a vector instruction in one window take turns in its banks on every repeat (they
// advance together when their repeat strides are equal). 1 when the chip has no bank model.
int64_t bank_windows(const ChipConfig& cfg) {
  const int64_t span = int64_t{cfg.ub_banks} * cfg.ub_bank_width_bytes;
  return span >= kRepeat ? span / kRepeat : 1;
}

Layout make_layout(int64_t tg, int elem_bytes, int64_t windows) {
  Layout l;
  l.tile_groups = tg;
  l.array = 4 * tg;
  int64_t at = 0;
  auto take = [&](int64_t bytes) {
    const uint64_t a = static_cast<uint64_t>(at);
    at += round_up(bytes, kRepeat);
    return a;
  };
  l.mask16 = take(kRepeat);
  l.high16 = take(kRepeat);
  l.mantissa = take(kRepeat);
  l.one_bits = take(kRepeat);
  l.keys = take(2 * kRounds * kRepeat);
  l.tile_words = take(9 * kRepeat);  // emit_tile_counters
  l.carry_bits = take(tg / 8);
  l.lane_offsets = take(l.array);
  // Array i starts in window i (mod windows): the stride is 1 mod windows, in repeats.
  int64_t stride = l.array / kRepeat;
  while (stride % windows != 1 % windows) ++stride;
  const int64_t pool = take(stride * kRepeat * kPoolArrays);
  for (int i = 0; i < kPoolArrays; ++i)
    l.pool.push_back(static_cast<uint64_t>(pool + i * stride * kRepeat));
  const int64_t words_bytes = 4 * tg * elem_bytes;
  // floats, stage and out are adjacent: the masked block copies read (never use) blocks past
  // floats and stage, up to the size of the region that follows each.
  l.floats = take(words_bytes);
  l.stage = take(words_bytes);
  l.out = take(words_bytes);
  l.bytes = at;
  return l;
}

// Emits the vector instructions over one tile's s32 arrays (normal mode, full mask).
class TileOps {
 public:
  TileOps(KernelBuilder& b, const Layout& l) : m_b(b), m_l(l), m_reps(l.array / kRepeat) {}

  // dst = src0 <op> src1 over the tile (type t, a view of the 4-byte lanes); src1_const: src1
  // is one repeat read by every repeat.
  void binary(Opcode op, Dtype t, uint64_t dst, uint64_t src0, uint64_t src1,
              bool src1_const = false) {
    vec_binary_strided(m_b, op, t, VOperand(dst), VOperand(src0),
                       VOperand(src1, 1, src1_const ? 0 : 8), m_reps);
  }
  void scalar(Opcode op, Dtype t, uint64_t dst, uint64_t src, const Reg& s) {
    vec_scalar_strided(m_b, op, t, VOperand(dst), VOperand(src), s, m_reps);
  }
  void convert(Dtype to, Dtype from, uint64_t dst, uint64_t src, RoundMode r) {
    // 64 lanes per repeat; a 2-byte destination advances 128 bytes (4 blocks) per repeat.
    m_b.emit(Opcode::op_vconv, {to, from, dst, src, m_reps, 1, 1, 8 * isa::dtype_size(to) / 4,
                                8 * isa::dtype_size(from) / 4, static_cast<int64_t>(r)});
  }
  void mask_low16(uint64_t dst, uint64_t src) {
    binary(Opcode::op_vand, Dtype::U16, dst, src, m_l.mask16, true);
  }
  int64_t repeats() const { return m_reps; }

 private:
  KernelBuilder& m_b;
  const Layout& m_l;
  int64_t m_reps;
};

// The offset K (0 or -2^16) of x's high piece for which b + d + asr16(a) stays in s32 for every
// x (file comment), from the ranges of the three terms; 1 when neither does.
constexpr int64_t mul_offset(SignedHalves h) {
  struct Range {
    int64_t lo, hi;
  };
  auto times = [](int64_t c, Range r) {  // c * [r.lo, r.hi]
    return c >= 0 ? Range{c * r.lo, c * r.hi} : Range{c * r.hi, c * r.lo};
  };
  auto floor16 = [](int64_t v) { return v >= 0 ? v / 65536 : -((-v + 65535) / 65536); };
  const Range x_lo{0, 0xffff};
  for (int64_t k : {int64_t{0}, int64_t{-65536}}) {
    const Range b = times(h.hi, x_lo), d = times(h.lo, Range{k, k + 0xffff});
    const Range a = times(h.lo, x_lo);
    const int64_t lo = b.lo + d.lo + floor16(a.lo), hi = b.hi + d.hi + floor16(a.hi);
    if (lo >= -(int64_t{1} << 31) && hi < (int64_t{1} << 31)) return k;
  }
  return 1;
}
static_assert(mul_offset(signed_halves(kPhiloxM0)) == 0);       // 20 instructions a product
static_assert(mul_offset(signed_halves(kPhiloxM1)) == -65536);  // 21: + M_s

// The scalar registers holding one multiplier's pieces.
struct Multiplier {
  Reg m, lo, hi;
  int64_t offset;  // K, mul_offset
  Reg m_signed;    // M - 2^32, added when K = -2^16 (else no register)
};

// The tile's s32 arrays, handed out at compile time as each instruction's destination: a free
// array in a bank window that none of the instruction's UB sources is in when there is one, so
// that no instruction writes an operand it reads and few share banks.
class ArrayPool {
 public:
  ArrayPool(KernelBuilder& b, const std::vector<uint64_t>& arrays, int64_t windows)
      : m_b(b), m_free(arrays.begin(), arrays.end()), m_windows(windows) {}
  uint64_t take(std::initializer_list<uint64_t> sources) {
    if (m_free.empty()) m_b.fail("internal: the random kernel's UB array pool is exhausted");
    auto clash = [&](uint64_t a) {
      for (uint64_t s : sources)
        if (window(a) == window(s)) return true;
      return false;
    };
    auto it = std::find_if(m_free.begin(), m_free.end(), [&](uint64_t a) { return !clash(a); });
    if (it == m_free.end()) it = m_free.begin();
    const uint64_t a = *it;
    m_free.erase(it);
    return a;
  }
  void give(uint64_t a) { m_free.push_back(a); }

 private:
  int64_t window(uint64_t a) const { return static_cast<int64_t>(a / kRepeat) % m_windows; }
  KernelBuilder& m_b;
  std::vector<uint64_t> m_free;
  int64_t m_windows;
};

// The vector arithmetic of the rounds on pool arrays; every result is a new array, the
// arguments stay the caller's.
class PhiloxOps {
 public:
  PhiloxOps(TileOps& v, ArrayPool& pool, const Layout& l, const Reg& two_pow_minus16)
      : m_v(v), m_pool(pool), m_l(l), m_scale(two_pow_minus16) {}

  uint64_t low16(uint64_t x) {
    const uint64_t d = m_pool.take({x, m_l.mask16});
    m_v.mask_low16(d, x);
    return d;
  }
  uint64_t add(uint64_t x, uint64_t y) {
    const uint64_t d = m_pool.take({x, y});
    m_v.binary(Opcode::op_vadd, Dtype::S32, d, x, y);
    return d;
  }
  uint64_t mul(uint64_t x, const Reg& m) {
    const uint64_t d = m_pool.take({x});
    m_v.scalar(Opcode::op_vmuls, Dtype::S32, d, x, m);
    return d;
  }
  // floor(x / 2^16) (the file comment says why this is exact).
  uint64_t asr16(uint64_t x) {
    const uint64_t f = m_pool.take({x});
    m_v.convert(Dtype::F32, Dtype::S32, f, x, RoundMode::kFloor);
    const uint64_t g = m_pool.take({f});
    m_v.scalar(Opcode::op_vmuls, Dtype::F32, g, f, m_scale);
    m_pool.give(f);
    const uint64_t d = m_pool.take({g});
    m_v.convert(Dtype::S32, Dtype::F32, d, g, RoundMode::kFloor);
    m_pool.give(g);
    return d;
  }
  // x ^ y = (x | y) - (x & y); y_const: y is one repeat (a round key).
  uint64_t xor_(uint64_t x, uint64_t y, bool y_const) {
    const uint64_t o = m_pool.take({x, y}), a = m_pool.take({x, y});
    m_v.binary(Opcode::op_vor, Dtype::U16, o, x, y, y_const);
    m_v.binary(Opcode::op_vand, Dtype::U16, a, x, y, y_const);
    const uint64_t d = m_pool.take({o, a});
    m_v.binary(Opcode::op_vsub, Dtype::S32, d, o, a);
    m_pool.give(o);
    m_pool.give(a);
    return d;
  }
  // h ^ c ^ key (key: one repeat, a round key word); h and c are given back.
  uint64_t mix(uint64_t h, uint64_t c, uint64_t key) {
    const uint64_t hc = xor_(h, c, false);
    m_pool.give(h);
    m_pool.give(c);
    const uint64_t d = xor_(hc, key, true);
    m_pool.give(hc);
    return d;
  }
  // (high word, low word) of M * x, lane by lane (the file comment derives the steps).
  std::pair<uint64_t, uint64_t> mul_hi_lo(uint64_t x, const Multiplier& m) {
    const uint64_t lo = mul(x, m.m);
    const uint64_t x_lo = low16(x);
    const uint64_t x_hi_s = asr16(x);
    uint64_t x_hi = 0;  // xK = xH + K
    if (m.offset == 0) {
      x_hi = low16(x_hi_s);
    } else {
      x_hi = m_pool.take({x_hi_s, m_l.high16});
      m_v.binary(Opcode::op_vor, Dtype::U16, x_hi, x_hi_s, m_l.high16, true);
    }
    m_pool.give(x_hi_s);
    const uint64_t a = mul(x_lo, m.lo), b = mul(x_lo, m.hi);
    const uint64_t d = mul(x_hi, m.lo), e = mul(x_hi, m.hi);
    m_pool.give(x_lo);
    m_pool.give(x_hi);
    // hi = e + asr16(b + d + asr16(a)) + x (+ M_s when K = -2^16)
    const uint64_t bd = add(b, d), a_hi = asr16(a);
    for (uint64_t t : {b, d, a}) m_pool.give(t);
    const uint64_t sum = add(bd, a_hi);
    m_pool.give(bd);
    m_pool.give(a_hi);
    const uint64_t sum_hi = asr16(sum);
    m_pool.give(sum);
    uint64_t hi = add(e, sum_hi);
    m_pool.give(e);
    m_pool.give(sum_hi);
    const uint64_t hi_x = add(hi, x);
    m_pool.give(hi);
    if (m.offset == 0) return {hi_x, lo};
    const uint64_t hi_m = m_pool.take({hi_x});
    m_v.scalar(Opcode::op_vadds, Dtype::S32, hi_m, hi_x, m.m_signed);
    m_pool.give(hi_x);
    return {hi_m, lo};
  }

 private:
  TileOps& m_v;
  ArrayPool& m_pool;
  const Layout& m_l;
  const Reg& m_scale;
};

void set_mask128(KernelBuilder& b, uint64_t hi, uint64_t lo) {
  b.emit(Opcode::op_set_mask, {static_cast<int64_t>(hi), static_cast<int64_t>(lo)});
}
constexpr uint64_t kAll = ~uint64_t{0};

void dup32(KernelBuilder& b, uint64_t dst, const Reg& bits) {
  b.emit(Opcode::op_vdup, {Dtype::S32, dst, bits, 1, 1, 8});
}

// lane_offsets[l] = lane_group(l) for l < TG: bits 0..2 by masked adds within the first block,
// then each higher bit k doubles the filled lanes (lanes [2^k, 2^(k+1)) = lanes [0, 2^k) +
// weight k). Leaves the full mask set.
void emit_lane_offsets(KernelBuilder& b, const Layout& l, int elem_bytes) {
  KernelBuilder::Origin o(b, "each lane's group in the tile");
  Reg w = b.reg_imm("weight", 0);
  set_mask128(b, 0, 0xff);
  dup32(b, l.lane_offsets, w);
  for (int k = 0; k < 3; ++k) {
    uint64_t lanes = 0;
    for (int i = 0; i < 8; ++i)
      if (i >> k & 1) lanes |= uint64_t{1} << i;
    set_mask128(b, 0, lanes);
    b.movi(w, lane_bit_weight(k, elem_bytes));
    vec_scalar_strided(b, Opcode::op_vadds, Dtype::S32, VOperand(l.lane_offsets),
                       VOperand(l.lane_offsets), w, 1);
  }
  for (int k = 3; (int64_t{1} << k) < l.tile_groups; ++k) {
    const int64_t n = int64_t{1} << k;
    set_mask128(b, 0, n < kLanes32 ? (uint64_t{1} << n) - 1 : kAll);
    b.movi(w, lane_bit_weight(k, elem_bytes));
    vec_scalar_strided(b, Opcode::op_vadds, Dtype::S32,
                       VOperand(l.lane_offsets + static_cast<uint64_t>(4 * n)),
                       VOperand(l.lane_offsets), w, std::max<int64_t>(1, n / kLanes32));
  }
  set_mask128(b, kAll, kAll);
}

// The tile's counter words from its first counter (lo, hi: the 128-bit counter's 64-bit
// halves), and the Philox steps that depend on the lane only through the counter's carry. The
// counter: c0 = b0 + lane offset; c1..c3 = b1..b3, or (b1..b3) + 1 in the lanes whose low word
// wrapped (offset >= 2^32 - b0). So round 0's words 0 and 1, u0 = hi(M1 c2) ^ c1 ^ k0 and
// u1 = lo(M1 c2), take one of two values, and so do round 1's products of u0: hi(M0 u0) ^ k1'
// (k1' round 1's key word 1) and lo(M0 u0). The scalar unit computes them (its exact 64-bit
// product) and vsel picks them per lane. Writes words = {c0, c3, u1, hi(M0 u0) ^ k1', lo(M0 u0)}.
struct TileStart {
  uint64_t c0, c3, u1, r1_hi, r1_lo;
};
void emit_tile_counters(KernelBuilder& b, TileOps& v, const Layout& l, const Reg& lo, const Reg& hi,
                        const Reg& round0_k0, const Reg& round1_k1, const TileStart& words) {
  KernelBuilder::Origin o(b, "the tile's counters and the steps they fix (rounds 0, 1)");
  Reg b0 = b.reg("b0"), c1 = b.reg("c1"), c2 = b.reg("c2"), c3 = b.reg("c3");
  Reg z = b.reg("carry"), p = b.reg("product"), u0 = b.reg("u0");
  const uint64_t tw = l.tile_words;
  // tile_words: repeats 0..3 = u1, c3, hi(M0 u0) ^ k1', lo(M0 u0); 4..7 the same for the
  // carried counter; 8 = the wrap threshold.
  constexpr int kCarried = 4;
  b.and_(b0, lo, kLow32);
  b.movi(z, int64_t{1} << 32);
  b.sub(z, z, b0);
  b.min(z, z, int64_t{1} << 30);  // any threshold above the tile's lane offsets is the same
  dup32(b, tw + 8 * kRepeat, z);
  b.shr(c1, lo, 32);
  b.and_(c2, hi, kLow32);
  b.shr(c3, hi, 32);
  for (int carried = 0; carried < 2; ++carried) {
    if (carried) {  // (c1, c2, c3) + 1 with the carries, each kept to 32 bits
      b.add(c1, c1, 1);
      b.shr(z, c1, 32);
      b.and_(c1, c1, kLow32);
      b.add(c2, c2, z);
      b.shr(z, c2, 32);
      b.and_(c2, c2, kLow32);
      b.add(c3, c3, z);
      b.and_(c3, c3, kLow32);
    }
    const uint64_t at = tw + static_cast<uint64_t>(kCarried * carried) * kRepeat;
    b.mul(p, c2, kPhiloxM1);
    emit_philox_mix(b, u0, p, p, c1, round0_k0);  // c1..c3 stay for the carried pass
    dup32(b, at, p);
    dup32(b, at + kRepeat, c3);
    b.mul(p, u0, kPhiloxM0);
    b.shr(z, p, 32);
    b.emit(Opcode::op_xor, {z, z, round1_k1});
    b.and_(p, p, kLow32);
    dup32(b, at + 2 * kRepeat, z);
    dup32(b, at + 3 * kRepeat, p);
  }
  v.scalar(Opcode::op_vadds, Dtype::S32, words.c0, l.lane_offsets, b0);
  vec_compare_strided(b, Dtype::S32, isa::Cmp::GE, l.carry_bits, VOperand(l.lane_offsets),
                      VOperand(tw + 8 * kRepeat, 1, 0), v.repeats());
  const uint64_t selected[] = {words.u1, words.c3, words.r1_hi, words.r1_lo};  // by repeat
  for (int r = 0; r < 4; ++r)
    vec_select_strided(b, Dtype::S32, VOperand(selected[r]),
                       VOperand(tw + (kCarried + r) * kRepeat, 1, 0),
                       VOperand(tw + r * kRepeat, 1, 0), l.carry_bits, v.repeats());
}

}  // namespace

Launch build_uniform_vector_launch(const OpDesc& op, DataType dtype, int64_t n,
                                   const ChipConfig& cfg) {
  const int elem_bytes = dtype == DataType::F32 ? 4 : 2;
  const int mantissa_bits = dtype == DataType::F32 ? 23 : dtype == DataType::F16 ? 10 : 7;
  const int64_t groups = ceil_div(n, kPhiloxGroup);
  KernelBuilder b(fmt::format("RandomUniform_{}", data_type_name(dtype)), op.str(), cfg);
  const int64_t cores = cfg.core_kind(b.vector_core_kind())->count;
  const int64_t ub =
      static_cast<int64_t>(cfg.core_kind(b.vector_core_kind())->capacity(isa::Buf::UB));

  // Tile: from one transpose chunk, doubled while a core has that much work and the UB holds it.
  const int64_t chunk = elem_bytes == 4 ? 128 : 64;
  int64_t tg = chunk;
  const int64_t windows = bank_windows(cfg);
  if (make_layout(tg, elem_bytes, windows).bytes > ub)
    op.fail(fmt::format("the vector-unit Philox needs {} bytes of UB, the chip has {}",
                        make_layout(tg, elem_bytes, windows).bytes, ub));
  while (2 * tg <= kMaxTileGroups && tg < ceil_div(groups, cores) &&
         make_layout(2 * tg, elem_bytes, windows).bytes <= ub)
    tg *= 2;
  const Layout l = make_layout(tg, elem_bytes, windows);
  const int64_t tiles = ceil_div(groups, tg);
  const BlockSplit split = BlockSplit::make(tiles, cores);

  b.begin_section(b.vector_core_kind());
  b.declare_arg("key", Dtype::S64, op.inputs[1].shape);
  b.declare_arg("counter", Dtype::S64, op.inputs[2].shape);
  b.declare_arg("out", device_dtype(dtype),
                op.outputs.empty() ? std::vector<int64_t>{n} : op.outputs[0].shape);
  TileOps v(b, l);
  Reg out_addr = b.load_arg("out");
  Reg lo = b.reg("counter low 64 bits"), hi = b.reg("counter high 64 bits");
  Reg tile = b.reg("tile"), end = b.reg("end of this block's tiles");
  Reg round0_k0 = b.reg("key word 0 (round 0)"), round1_k1 = b.reg("key word 1 (round 1)");
  {
    KernelBuilder::Origin o(b, "constants, round keys, lane offsets");
    Reg w = b.reg_imm("constant", 0xffff);
    set_mask128(b, kAll, kAll);
    dup32(b, l.mask16, w);
    b.movi(w, int64_t{0xffff0000});
    dup32(b, l.high16, w);
    b.movi(w, (int64_t{1} << mantissa_bits) - 1);
    dup32(b, l.mantissa, w);
    b.movi(w, 0x3f800000);  // 1.0f
    dup32(b, l.one_bits, w);
    Reg key = b.reg("key"), k1 = b.reg("key word 1");
    {
      Reg a = b.load_arg("key");
      b.emit(Opcode::op_ld, {key, a});
    }
    b.shr(k1, key, 32);
    b.and_(key, key, kLow32);
    b.mov(round0_k0, key);
    b.add(round1_k1, k1, kPhiloxW1);
    b.and_(round1_k1, round1_k1, kLow32);
    for (int r = 0; r < kRounds; ++r) {
      if (r > 0) {
        b.add(key, key, kPhiloxW0, "raise the key");
        b.and_(key, key, kLow32);
        b.add(k1, k1, kPhiloxW1);
        b.and_(k1, k1, kLow32);
      }
      dup32(b, l.keys + static_cast<uint64_t>(2 * r) * kRepeat, key);
      dup32(b, l.keys + static_cast<uint64_t>(2 * r + 1) * kRepeat, k1);
    }
    emit_lane_offsets(b, l, elem_bytes);
  }
  {
    KernelBuilder::Origin o(b, "this block's tiles and the first tile's counter");
    Reg a = b.load_arg("counter");
    b.emit(Opcode::op_ld, {lo, a});
    b.add(a, a, 8);
    b.emit(Opcode::op_ld, {hi, a});
    emit_block_range(b, tile, end, split.per, tiles);
    Reg g = b.reg("first group");
    b.mul(g, tile, tg);
    emit_counter_add(b, lo, hi, g);
  }
  auto multiplier = [&](int64_t m, const char* name) {
    const SignedHalves h = signed_halves(m);
    return Multiplier{b.reg_imm(name, m), b.reg_imm(fmt::format("{} - 2^32, low half", name), h.lo),
                      b.reg_imm(fmt::format("{} - 2^32, high half", name), h.hi), mul_offset(h),
                      mul_offset(h) == 0
                          ? Reg()
                          : b.reg_imm(fmt::format("{} - 2^32", name), m - (int64_t{1} << 32))};
  };
  const Multiplier m0 = multiplier(kPhiloxM0, "M0"), m1 = multiplier(kPhiloxM1, "M1");
  Reg two_pow_minus16 = b.reg_imm("2^-16", vector_scalar_bits(Dtype::F32, 1.0 / 65536));
  Reg tile_step = b.reg_imm("groups per tile", tg);
  b.set_flag(Pipe::MTE3, Pipe::V, 0, "the output tile is free");
  b.for_range(tile, tile, end, 1, [&] {
    ArrayPool pool(b, l.pool, windows);
    PhiloxOps ops(v, pool, l, two_pow_minus16);
    const TileStart start{pool.take({}), pool.take({}), pool.take({}), pool.take({}),
                          pool.take({})};
    emit_tile_counters(b, v, l, lo, hi, round0_k0, round1_k1, start);
    // c' = {hi(M1 c2) ^ c1 ^ k0, lo(M1 c2), hi(M0 c0) ^ c3 ^ k1, lo(M0 c0)}; the words of rounds
    // 0 and 1 that the carry fixes come from emit_tile_counters.
    auto key = [&](int r, int j) { return l.keys + static_cast<uint64_t>(2 * r + j) * kRepeat; };
    std::array<uint64_t, 4> w{};
    {
      KernelBuilder::Origin o(b, "Philox rounds 0 and 1");
      const auto [hi0, lo0] = ops.mul_hi_lo(start.c0, m0);
      pool.give(start.c0);
      // Round 0's words: u0, u1 (the scalar unit's), r0_w2, lo0.
      const uint64_t r0_w2 = ops.mix(hi0, start.c3, key(0, 1));
      const auto [hi1, lo1] = ops.mul_hi_lo(r0_w2, m1);
      pool.give(r0_w2);
      const uint64_t r1_w0 = ops.mix(hi1, start.u1, key(1, 0));
      const uint64_t r1_w2 = ops.xor_(start.r1_hi, lo0, false);
      pool.give(start.r1_hi);
      pool.give(lo0);
      w = {r1_w0, lo1, r1_w2, start.r1_lo};
    }
    for (int r = 2; r < kRounds; ++r) {
      KernelBuilder::Origin o(b, fmt::format("Philox round {}", r));
      const auto [hi1, lo1] = ops.mul_hi_lo(w[2], m1);
      pool.give(w[2]);
      const uint64_t mixed1 = ops.mix(hi1, w[1], key(r, 0));
      const auto [hi0, lo0] = ops.mul_hi_lo(w[0], m0);
      pool.give(w[0]);
      const uint64_t mixed0 = ops.mix(hi0, w[3], key(r, 1));
      w = {mixed1, lo1, mixed0, lo0};
    }
    {
      KernelBuilder::Origin o(b, "uniform floats of the four words");
      const uint64_t word_bytes = static_cast<uint64_t>(tg * elem_bytes);
      if (elem_bytes == 4) {
        // TF's 1.mantissa - 1: exact.
        Reg minus_one = b.reg_imm("-1.0f", vector_scalar_bits(Dtype::F32, -1.0));
        for (int j = 0; j < 4; ++j) {
          const uint64_t m = pool.take({w[j], l.mantissa});
          v.binary(Opcode::op_vand, Dtype::U16, m, w[j], l.mantissa, true);
          const uint64_t one_m = pool.take({m, l.one_bits});
          v.binary(Opcode::op_vor, Dtype::U16, one_m, m, l.one_bits, true);
          v.scalar(Opcode::op_vadds, Dtype::F32, l.floats + j * word_bytes, one_m, minus_one);
          pool.give(m);
          pool.give(one_m);
        }
      } else {
        // mantissa * 2^-W in f32, then to the 2-byte type: every step exact.
        Reg scale =
            b.reg_imm("2^-W", vector_scalar_bits(Dtype::F32, std::ldexp(1.0, -mantissa_bits)));
        const Dtype out_t = device_dtype(dtype);
        for (int j = 0; j < 4; ++j) {
          const uint64_t m = pool.take({w[j], l.mantissa});
          v.binary(Opcode::op_vand, Dtype::U16, m, w[j], l.mantissa, true);
          const uint64_t f = pool.take({m});
          v.convert(Dtype::F32, Dtype::S32, f, m, RoundMode::kRint);
          const uint64_t scaled = pool.take({f});
          v.scalar(Opcode::op_vmuls, Dtype::F32, scaled, f, scale);
          v.convert(out_t, Dtype::F32, l.floats + j * word_bytes, scaled, RoundMode::kRint);
          for (uint64_t a : {m, f, scaled}) pool.give(a);
        }
      }
    }
    {
      KernelBuilder::Origin o(b, "interleave the words (two transposes) into output order");
      const int64_t transposes = 4 * tg * elem_bytes / kTransposeBytes;
      if (elem_bytes == 4) {
        for (int64_t k = 0; k < transposes; ++k)
          b.emit(Opcode::op_vtranspose, {static_cast<int64_t>(l.stage + k * kTransposeBytes),
                                         static_cast<int64_t>(l.floats + k * kTransposeBytes)});
        // Rows (t, j, half) of each 32-group quarter: one copy per (t, h, j) moves quarter q's
        // (4 per chunk) block from stage + 32 (2t + h) + 128 q + j * (a word's bytes) to
        // floats + 32 (8t + h) + 512 q + 64 j (bytes), 8 quarters per repeat (4 when the tile
        // is one chunk): strides that do not grow with the tile.
        const int64_t rows = 4 * (tg / 128), rows_per_repeat = std::min<int64_t>(8, rows);
        set_mask128(b, 0, lane_range(0, 8 * rows_per_repeat));
        for (int t = 0; t < 2; ++t)
          for (int h = 0; h < 2; ++h)
            for (int j = 0; j < 4; ++j)
              vec_unary_strided(
                  b, Opcode::op_vcopy, Dtype::S32,
                  VOperand(l.floats + (8 * t + h) * kBlockB + j * 2 * kBlockB, 16, 128),
                  VOperand(l.stage + (2 * t + h) * kBlockB + j * l.array, 4, 32),
                  rows / rows_per_repeat);
        set_mask128(b, kAll, kAll);
        b.wait_flag(Pipe::MTE3, Pipe::V, 0, "the previous tile's output is stored");
        for (int64_t k = 0; k < transposes; ++k)
          b.emit(Opcode::op_vtranspose, {static_cast<int64_t>(l.out + k * kTransposeBytes),
                                         static_cast<int64_t>(l.floats + k * kTransposeBytes)});
      } else {
        // rows 4s + j of each 64-group chunk: block s of word j.
        set_mask128(b, 0, kAll);
        vec_unary_strided(b, Opcode::op_vcopy, Dtype::U16, VOperand(l.stage, 1, 4),
                          VOperand(l.floats, tg * 2 / kBlockB, 1), tg / 16);
        set_mask128(b, kAll, kAll);
        b.wait_flag(Pipe::MTE3, Pipe::V, 0, "the previous tile's output is stored");
        for (int64_t k = 0; k < transposes; ++k)
          b.emit(Opcode::op_vtranspose, {static_cast<int64_t>(l.out + k * kTransposeBytes),
                                         static_cast<int64_t>(l.stage + k * kTransposeBytes)});
      }
    }
    {
      KernelBuilder::Origin o(b, "store the tile's outputs (whole 32-byte blocks)");
      Reg first = b.reg("first output"), blocks = b.reg("blocks"), dst = b.reg("destination");
      b.mul(first, tile, kPhiloxGroup * tg);
      b.movi(blocks, n);
      b.sub(blocks, blocks, first);
      b.min(blocks, blocks, kPhiloxGroup * tg);
      b.mul_add(blocks, blocks, elem_bytes, kBlockB - 1);
      b.shr(blocks, blocks, 5);
      b.mul_add(dst, first, elem_bytes, out_addr);
      b.set_flag(Pipe::V, Pipe::MTE3, 0);
      b.wait_flag(Pipe::V, Pipe::MTE3, 0);
      b.emit(Opcode::op_copy_ub2gm, {dst, static_cast<int64_t>(l.out), 1, blocks, 0, 0});
      b.set_flag(Pipe::MTE3, Pipe::V, 0, "the output tile is free");
    }
    emit_counter_add(b, lo, hi, tile_step);
  });
  b.wait_flag(Pipe::MTE3, Pipe::V, 0, "the last tile's output is stored");
  b.end();
  Launch launch;
  launch.block_dim = split.block_dim;
  launch.args = {ArgRef{ArgRef::Kind::kInput, 1, 0}, ArgRef{ArgRef::Kind::kInput, 2, 0},
                 ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  launch.summary =
      fmt::format("vector unit: {} Philox groups in tiles of {}, {} blocks of {} tiles", groups, tg,
                  split.block_dim, split.per);
  launch.kernel = b.finish();
  return launch;
}

}  // namespace npusim::compiler::ops
