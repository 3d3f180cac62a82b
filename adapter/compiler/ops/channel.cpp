#include "adapter/compiler/ops/channel.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/pixel_ops.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/convert.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using isa::Pipe;

namespace {

constexpr int64_t kMaxTilePixels = 128;  // a power of two <= PixelOps::kPixChunk
constexpr int64_t kF32Tile = 64;         // epilogue channel tiles: whole f32 repeats
// Tiles per block and channel group from which the channel sums ping-pong in a smaller tile
// (measured at ResNet-50's shapes, docs/compiler.md: 5 and 17 gain, 2 lose).
constexpr int64_t kPingPongTiles = 4;
// The smallest tile (pixels x channels) ChannelSumSpec::raw_tile_first takes for a larger raw
// tile: 32 f32 repeats. Measured on BNTrainingUpdateGrad (910b, docs/compiler.md "The channel
// sums' raw tile first"): at 1024 the 14x14x1024 and 28x28x512 layers took tiles of 1 and 2
// pixels and lost 23 % and 2 % to the instructions' fixed costs; at 4096 the same as 2048.
constexpr int64_t kRawFirstMinTile = 2048;

// Bank windows (ChannelSumEmitter::allocate) of the buffers the ReLU-masked sums place
// otherwise than the other sums. a (0), b (1) and the scratch t (4) stay. A tile's per-pixel
// instructions (PixelOps: the pre-activation t = a * fa, z = t + fs, the centring t = a - m)
// step their flat operands by a pixel's ct f32 a repeat, an even number of 256-byte windows
// where ct is a multiple of 128 (a span holds 6 windows on the 910B), so those operands keep the parity
// of their first window and never meet a per-channel vector of the other parity (read at
// repeat stride 0, the same banks every repeat): fa and fs odd (3) against a and t, z even
// (2), m odd (5, as for every centred sum). The accumulators then move to 5, apart from t and
// z, which the vmla reads with them, and their pong (chips without vmla: the sums add the
// product, in a's tile, to them) to 2; the mask bits stay at 3 (no instruction reads them with
// fa or fs). Measured on the 910b (docs/graph_engine.md "the masked channel sums' bank
// windows"): at 8x14x14x256 a tile's per-pixel vmul took 38 cycles, its vadd 33, each 28
// placed. NPUSIM_MASKED_SUM_WINDOWS=0 (read at every compile; anything but unset, "0" or "1"
// is a CompileError naming it) keeps the windows of the other sums and the constant repeats
// where they come, the layout before: the same instructions and bits.
struct MaskWindows {
  uint64_t z = 5, fa_fs = 2, acc = 2, acc_pong = 5;
  bool constants = false;  // the select's and the compare's constant repeats placed too
};
MaskWindows relu_mask_windows(KernelBuilder& b, bool relu_mask) {
  if (!relu_mask) return {};
  const char* v = std::getenv("NPUSIM_MASKED_SUM_WINDOWS");
  if (!v || std::string_view(v) == "1") return MaskWindows{2, 3, 5, 2, true};
  if (std::string_view(v) == "0") return {};
  b.fail(fmt::format("NPUSIM_MASKED_SUM_WINDOWS='{}' is neither '0' nor '1'", v));
}
constexpr uint64_t kMaskBitsWindow = 3;

// Whether the ReLU-masked sums of f16 tensors mask b in f16, before its widening: the select of
// 1 or 0 and the product b * factor on the raw tile (128 lanes a repeat: half the f32 repeats),
// then the product widened. b * 1 and b * 0 are exact in f16 and widen exactly, so the masked
// b32 is the f32 path's value (ReluGrad's product: a NaN where an infinite or NaN b is masked;
// only a NaN's payload may differ). Measured on the 910b (docs/graph_engine.md "the masked
// channel sums' mask in f16"). NPUSIM_MASKED_SUM_F16_MASK=0 (read at every compile; anything but
// unset, "0" or "1" is a CompileError naming it) keeps the mask in f32 after the widening.
bool masked_sum_f16_mask(KernelBuilder& b, const ChannelSumSpec& s) {
  if (!s.relu_mask || s.b_type != Dtype::F16) return false;
  const char* v = std::getenv("NPUSIM_MASKED_SUM_F16_MASK");
  if (!v || std::string_view(v) == "1") return true;
  if (std::string_view(v) == "0") return false;
  b.fail(fmt::format("NPUSIM_MASKED_SUM_F16_MASK='{}' is neither '0' nor '1'", v));
}

// Every vector core of the launch signals once its partials are in GM (cc_set from MTE3, which
// issues after the stores and waits for them to land) and waits for all (MTE2: the first to
// read another core's partials).
void partials_barrier(KernelBuilder& b, int id) {
  KernelBuilder::Origin o(b, "barrier: every vector core's partials stored");
  b.emit(Opcode::op_cc_set, {Pipe::MTE3, 0, id}, "this core's partials stored");
  b.emit(Opcode::op_cc_wait, {Pipe::MTE2, id}, "wait: every vector core's partials");
}

// Whether a block's `per` pixels, loaded `raw` at a time, are enough for its first raw tile to
// be staggered (ChannelSumSpec::stagger_first_tiles): more than one raw tile, so that the block
// loads two raw tiles or more whether staggered or not (one would only be cut in two, a round
// trip more); with NPUSIM_STAGGER_PARTIAL_TILES=0 two whole raw tiles, the rule before (read at
// every compile; anything but unset, "0" or "1" is a CompileError naming it). Measured on
// BNTrainingUpdateGrad at 8x7x7x512 with the mask (910b, 9 pixels a block in raw tiles of 8):
// 8,481 -> 8,182 cycles, docs/graph_engine.md.
bool stagger_range_long_enough(KernelBuilder& b, int64_t per, int64_t raw) {
  const char* v = std::getenv("NPUSIM_STAGGER_PARTIAL_TILES");
  if (!v || std::string_view(v) == "1") return per > raw;
  if (std::string_view(v) == "0") return per >= 2 * raw;
  b.fail(fmt::format("NPUSIM_STAGGER_PARTIAL_TILES='{}' is neither '0' nor '1'", v));
}

}  // namespace

void f32_binary(KernelBuilder& b, Opcode op, uint64_t d, uint64_t a, uint64_t c, const Reg& count) {
  vec_binary(b, op, Dtype::F32, d, a, c, count);
}
void f32_unary(KernelBuilder& b, Opcode op, uint64_t d, uint64_t a, const Reg& count) {
  vec_unary(b, op, Dtype::F32, d, a, count);
}
void f32_scalar(KernelBuilder& b, Opcode op, uint64_t d, uint64_t a, double v, const Reg& count) {
  Reg s = b.reg_imm("scalar (f32 bits)", vector_scalar_bits(Dtype::F32, v));
  vec_scalar(b, op, Dtype::F32, d, a, s, count);
}
void f32_copy(KernelBuilder& b, uint64_t d, uint64_t a, const Reg& count) {
  vec_copy_bits(b, 4, d, a, count);
}
void fold_rows_pairwise(KernelBuilder& b, uint64_t dst, uint64_t base, int64_t rows,
                        int64_t pitch, int64_t lanes) {
  fold_rows_pairwise(b, {FoldedRows{dst, base}}, rows, pitch, lanes);
}
void fold_rows_pairwise(KernelBuilder& b, const std::vector<FoldedRows>& sets, int64_t rows,
                        int64_t pitch, int64_t lanes) {
  if (rows < 1 || lanes < 1 || lanes > pitch)
    b.fail(fmt::format("a pairwise fold of {} rows of {} lanes at a pitch of {} f32", rows,
                       lanes, pitch));
  if (rows == 1) {
    for (const FoldedRows& s : sets)
      if (s.dst != s.base) {
        Reg n = b.reg_imm("channels", lanes);
        f32_copy(b, s.dst, s.base, n);
      }
    return;
  }
  const uint64_t pitch_bytes = static_cast<uint64_t>(pitch) * 4;
  while (rows > 1) {
    const int64_t half = rows / 2;
    // Rows [rows - half, rows) onto rows [0, half): one vadd over the rows and the gaps
    // between them (a gap's lanes are added too and never read).
    Reg n = b.reg_imm("elements", (half - 1) * pitch + lanes);
    for (const FoldedRows& s : sets)
      f32_binary(b, Opcode::op_vadd, rows == 2 ? s.dst : s.base, s.base,
                 s.base + static_cast<uint64_t>(rows - half) * pitch_bytes, n);
    rows -= half;
  }
}
void f32_fill(KernelBuilder& b, uint64_t d, double v, const Reg& count) {
  Reg s = b.reg_imm("fill (f32 bits)", vector_scalar_bits(Dtype::F32, v));
  vec_dup_bits(b, 4, d, s, count);
}

float relu_mask_threshold(Dtype t) {
  if (t == Dtype::F32) return 0.0f;
  if (t != Dtype::F16)
    throw Error(fmt::format("a ReLU mask for outputs of type {} (f32, f16)", isa::dtype_name(t)));
  // The largest positive f32 whose conversion is +0 (conversion is monotone in the bits of
  // positive values): bisect on them, with the simulator's own conversion.
  uint32_t lo = 0, hi = f32_to_bits(1.0f);  // rounds to 0, does not
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    (convert_element<Dtype::F16, Dtype::F32>(mid, RoundMode::kRint) == 0 ? lo : hi) = mid;
  }
  return bits_to_f32(lo);
}

namespace {

// core = this vector core's index in a mix launch's vector section: vector core v of group g
// is g * aiv_per_aic + v.
void section_vector_core(KernelBuilder& b, const Reg& core) {
  Reg sub = b.reg("vector core in the group");
  b.emit(Opcode::op_get_block_id, {core});
  b.emit(Opcode::op_get_subblock_id, {sub});
  b.mul_add(core, core, static_cast<int64_t>(b.aiv_per_aic()), sub);
}

// Emits build_channel_sum's kernel: the tile (tp pixels x ct channels) and the split first, then
// per item and channel group: clear the sums, (centered) load m, accumulate the tiles, fold the
// tp running sums and store them. The raw inputs are loaded rt tiles at a time into
// double-buffered raw tiles (ping and pong, the loop unrolled twice, each raw tile's rt tiles
// unrolled): MTE2 loads raw tile t+1 while V widens and accumulates the tiles of raw tile t.
// A raw tile is handed over by one flag, and a flag from MTE2 waits until the pipe's transfers
// have landed (a memory latency per raw tile), so the raw tile takes what UB the f32 work
// leaves (plan_tile).
class ChannelSumEmitter {
 public:
  using Kind = ChannelSumSpec::Kind;
  // Emits into b: a kernel of its own (build), or the vector section of a mix kernel
  // (emit_section).
  ChannelSumEmitter(KernelBuilder& b, const ChannelSumSpec& s);
  // A kernel of its own, with the epilogue e after the sums if given
  // (build_channel_sum_with_epilogue).
  ChannelSumLaunch build(std::optional<ChannelEpilogueSpec> e = std::nullopt);
  int emit_section(const ChannelSumSection& sec);

 private:
  void plan_tile();
  void allocate();
  void allocate_mask_constants(
      const std::function<uint64_t(const std::string&, uint64_t)>* alloc_at, uint64_t w_one = 0);
  void declare_args(ChannelSumLaunch& out);
  void emit_group(const Reg& p0, const Reg& p1, const Reg& blk, const Reg& item, const Reg& g);
  void load_vectors(const Reg& g);
  void vectors_ready();
  void load_vector(const std::string& arg, uint64_t dst, const Reg& g);
  uint64_t relu_mask(uint64_t a32, uint64_t b, const Reg& n, const Reg& cnt);
  void accumulate_tiles(const Reg& p0, const Reg& p1, const Reg& blk, const Reg& item,
                        const Reg& g);
  void fold_into_first(const uint64_t (&acc)[2], int from);
  void load_raw_tile(int q, const Reg& t0, const Reg& p1, const Reg& item, const Reg& g);
  void accumulate_raw_tile(int q, const Reg& t0, const Reg& p1, const Label (&exit)[2]);
  void accumulate_tile(int q, int k, int j, const Reg& n, const Reg* elements = nullptr);
  void accumulate_tail(const Reg& item);
  void load_tile(const char* arg, uint64_t dst, int64_t size, int64_t bstride, const Reg& n,
                 const Reg& t0, const Reg& item, const Reg& g);
  void store_sums(const char* arg, uint64_t acc, const Reg& blk, const Reg& item, const Reg& g);
  void emit_partials_barrier(int id);
  // The section's body from its first instruction to its end; blk = this core's block among
  // m_blocks (computed by `block`), `wait` issued before any input is read.
  void emit_body(const std::function<void(const Reg& blk)>& block,
                 const std::function<void()>& wait);

  KernelBuilder& m_b;
  const ChannelSumSpec& m_s;
  const isa::CoreKind m_kind;
  const CoreKindConfig& m_core;
  const bool m_has_b;
  const int64_t m_sa, m_sb;  // bytes per element of a and b
  int64_t m_tp = 1;          // pixels per tile (a power of two)
  int64_t m_rt = 1;          // tiles per raw tile (a power of two): loaded under one flag
  int64_t m_ct = 0;          // channels per group (divides cp)
  int64_t m_per = 0;         // rows per block
  // The rows summed (ChannelSumSpec::channels: whole rows of m_row_pixels pixels; else pixels),
  // and the elements of the partial row after them (the last block's).
  int64_t m_row_pixels = 1, m_rows = 0, m_tail = 0;
  bool m_stagger = false;    // ChannelSumSpec::stagger_first_tiles taken
  int m_blocks = 0;
  uint64_t m_tile = 0;                                // elements per tile
  uint64_t m_a_raw[2] = {0, 0}, m_b_raw[2] = {0, 0};  // ping, pong
  // The running sums (and the plain ones) ping-pong where the tile stays as large: a tile's
  // sums go from acc[q] into acc[1 - q] (q its ping / pong), never in place (the bank model: a
  // destination that is also a source takes a second access to its banks per repeat).
  // With m_mla the squares' or products' sums (m_acc) are in place (acc[1] == acc[0]), each
  // tile's added by one vmla, whose destination is also its accumulator.
  uint64_t m_acc[2] = {0, 0}, m_acc2[2] = {0, 0};
  bool m_mla = false;  // the squares or products accumulated by vmla (multiply_accumulate_enabled)
  uint64_t m_a32 = 0, m_b32 = 0, m_m = 0, m_t = 0;
  uint64_t m_fa = 0, m_fs = 0, m_z = 0, m_bits = 0, m_one = 0, m_zero = 0;  // relu_mask
  uint64_t m_threshold = 0;      // relu_mask: a repeat of relu_mask_threshold (m_zero where 0)
  bool m_f16_mask = false;       // relu_mask: b masked in f16 (masked_sum_f16_mask; m_one f16)
  std::vector<uint64_t> m_mask;  // relu_mask: the mask vectors' group
  std::optional<PixelOps> m_px;
  FlagPair m_in_free, m_in_ready;
  // m_stagger: the pixels the next raw tile may hold (this block's share first, then a raw
  // tile), and the end pixel of the raw tile in buffers q.
  std::optional<Reg> m_raw_limit, m_raw_end[2];
  int m_m_free = 0, m_m_ready = 0, m_acc_ready = 0, m_acc_free = 0;
  bool m_vectors = false;       // per-group vectors (m, fa, fs) to load
  bool m_pingpong = false;      // the sums ping-pong (else acc[1] == acc[0]: in place)
  const char* m_a_arg = "a";    // the argument holding a
  int64_t m_vector_blocks = 0;  // a section's vector cores (0: a kernel of its own, the
                                // chip's vector cores)
  uint64_t m_ub_reserved = 0;   // UB bytes the sums leave to a section's epilogue
};

ChannelSumEmitter::ChannelSumEmitter(KernelBuilder& b, const ChannelSumSpec& s)
    : m_b(b),
      m_s(s),
      m_kind(m_b.vector_core_kind()),
      m_core(*b.config().core_kind(m_kind)),
      m_has_b(s.kind == Kind::kSumProduct),
      m_sa(isa::dtype_size(s.a_type)),
      m_sb(m_has_b ? isa::dtype_size(s.b_type) : 0),
      m_vectors(s.centered || s.relu_mask) {
  m_mla = s.kind != Kind::kSum && multiply_accumulate_enabled(b);
  m_f16_mask = masked_sum_f16_mask(b, s);
  if (s.channels) {
    if (s.channels % 8 != 0 || s.cp % s.channels != 0 || s.pixels < s.cp / s.channels)
      b.fail(
          fmt::format("channel sums over rows of {} channels of {}-channel pixels: the "
                      "channels must be a multiple of 8 dividing the row, the tensor at least "
                      "one row ({} pixels)",
                      s.cp, s.channels, s.pixels));
    m_row_pixels = s.cp / s.channels;
  }
  m_rows = s.pixels / m_row_pixels;
  m_tail = (s.pixels % m_row_pixels) * (s.channels ? s.channels : s.cp);
}

// Tile: T pixels x ct channels, T a power of two; bytes per pixel-channel: a (2 raw + f32),
// b (2 raw + f32), the accumulators (f32 copies only for f16 / bf16 inputs).
void ChannelSumEmitter::plan_tile() {
  const ChannelSumSpec& s = m_s;
  const int64_t sa = m_sa, sb = m_sb;
  const bool has_b = m_has_b;
  if (s.plain_sum && s.kind == Kind::kSum)
    m_b.fail("a second plain sum needs kSumSquares or kSumProduct");
  if (s.relu_mask && (!has_b || !s.centered || !s.mask_fold || s.a_type != s.b_type ||
                      (s.a_type != Dtype::F32 && s.a_type != Dtype::F16)))
    m_b.fail("a ReLU mask needs a centered kSumProduct of f32 or f16 tensors and its fold");
  if ((s.cp * sa) % 32 != 0 || (has_b && (s.cp * sb) % 32 != 0) || s.cp % 8 != 0)
    m_b.fail(fmt::format("channel sums need whole 32-byte pixels, got {} channels", s.cp));
  const uint64_t ub = m_core.capacity(Buf::UB) - m_ub_reserved;
  const int64_t unit = std::max<int64_t>({8, 32 / sa, has_b ? 32 / sb : 8});
  // r tiles per raw tile: the raw ping and pong hold r tiles each.
  auto need = [&](int64_t t, int64_t ct, bool pingpong, int64_t r = 1) {
    const int accs = pingpong ? 2 : 1;
    const auto input = [r](int64_t size) { return 2 * r * size + (size == 4 ? 0 : 4); };
    // relu_mask: the pre-activation (f32) and the mask bits; fa, fs, the mask vectors and two
    // constant repeats.
    const int vectors = 1 + (s.relu_mask ? 2 + s.mask_vectors : 0);
    const uint64_t per =
        static_cast<uint64_t>(input(sa) + (has_b ? input(sb) : 0) + accs * 4 +
                              (s.kind != Kind::kSum || s.centered ? 4 : 0) +
                              (s.plain_sum ? accs * 4 : 0) + (s.relu_mask ? 5 : 0));
    // (each buffer may be padded to its bank window: at most a span, 1.5 KiB on the 910B)
    const uint64_t span = static_cast<uint64_t>(m_b.config().ub_banks) *
                          static_cast<uint64_t>(m_b.config().ub_bank_width_bytes);
    return static_cast<uint64_t>(t * ct) * per + static_cast<uint64_t>(ct * 4 * vectors) +
           static_cast<uint64_t>(10 + 2 * accs + vectors) * (PixelOps::kPixelSlack + 32 + span);
  };
  // Blocks split the pixels; a tile holds at most a block's pixels (its accumulators are
  // cleared and folded per channel group, whatever the pixels it accumulates; measured: sizing
  // it to hold all of a block's 9 or 33 pixels costs more in that than a remnant tile does).
  const int64_t cores = m_vector_blocks ? m_vector_blocks : m_core.count;
  m_per = ceil_div(m_rows, std::min<int64_t>(cores, m_rows));
  m_blocks = static_cast<int>(ceil_div(m_rows, m_per));
  // The largest tile (channels first, then pixels) for in-place sums; ping-pong sums where
  // the same tile fits them, or where their own largest tile still leaves a block at least
  // kPingPongTiles tiles per channel group (measured, docs/compiler.md "The channel sums'
  // pipeline": with fewer, the smaller tile's extra groups, each cleared, folded and stored,
  // cost more than the in-place accumulation; with more, the accumulation dominates).
  // Channels first: a pixel's ct channels are one MTE2 burst (32 f16 channels: 64 bytes, a
  // GM transfer each), and the per-channel vectors' broadcasts repeat once per pixel at ct f32
  // wide, half the vector's 256 bytes below 64 channels; a group also reads a piece of every
  // pixel's lines, so with the groups outside the pixel loop each group fetches the block's
  // lines again once the L2 cannot hold them in between. Measured against pixels first
  // (docs/compiler.md "The channel sums' pipeline", 2026-12-04): faster for every ResNet-50
  // shape of BNTrainingReduce and BNTrainingUpdateGrad, f16 and f32, with and without the ReLU
  // mask.
  // A tile's pixels are the repeats of its instructions: a pixel's widest row (ct f32 values)
  // is the repeat stride, at most kMaxRepeat blocks (the RU8 stride fields).
  auto channels_fit = [&](int64_t c) {
    return s.cp % c == 0 && c * 4 <= kMaxRepeat * vec::kBlockBytes;
  };
  auto largest = [&](bool pingpong) {
    int64_t tp = 1;
    while (tp * 2 <= kMaxTilePixels && tp * 2 <= m_per) tp *= 2;
    for (int64_t c = s.cp / unit * unit; c >= unit; c -= unit) {
      // (rows of pixels: the whole row, one group)
      if (!channels_fit(c) || (s.channels && c != s.cp)) continue;
      for (int64_t t = tp; t >= 1; t /= 2)
        if (need(t, c, pingpong) <= ub) return std::pair<int64_t, int64_t>{t, c};
    }
    return std::pair<int64_t, int64_t>{tp, int64_t{0}};
  };
  auto [tp, ct] = largest(false);
  if (!ct)
    m_b.fail(
        fmt::format("not even one pixel of {} channels fits the UB", s.channels ? s.cp : unit));
  const auto [tp2, ct2] = largest(true);
  // (Not the ReLU-masked sums: their pre-activation and mask buffers make the smaller tile
  // much smaller; measured slower, docs/compiler.md.)
  m_pingpong = ct2 > 0 && ((tp2 == tp && ct2 == ct) ||
                           (!s.relu_mask && ceil_div(m_per, tp2) >= kPingPongTiles));
  if (m_pingpong) {
    tp = tp2;
    ct = ct2;
  }
  // The raw tile: rt tiles under one flag (each raw tile waits a memory latency, the tiles'
  // f32 work does not), as many as the UB left by the tile holds while a block keeps at least
  // two raw tiles (with one, its load and its vector work cannot overlap). Measured
  // (docs/compiler.md "The channel sums' pipeline"): halving the tile for a larger raw tile
  // costs the vector unit more instructions than it saves MTE2 where the vector unit is busy.
  const auto raw_tiles = [&](int64_t t, bool pingpong) {
    int64_t r = 1;
    while (t * r * 2 * 2 <= m_per && need(t, ct, pingpong, r * 2) <= ub) r *= 2;
    return r;
  };
  int64_t rt = raw_tiles(tp, m_pingpong);
  if (s.raw_tile_first) {
    // ChannelSumSpec::raw_tile_first: of the tiles of ct channels from the largest down to
    // kRawFirstMinTile elements (each with in-place or ping-pong sums), the one whose raw tile
    // holds the most pixels (the fewest round trips); on a tie the larger tile, then ping-pong.
    // Only a raw tile of more pixels than the tile chosen above replaces it: with as many round
    // trips there is nothing to win (measured: BNTrainingReduce's 8x28x28x128 and 8x14x14x512
    // lost 4-6 % to the larger tile of a tie, docs/compiler.md).
    const int64_t top = largest(false).first;
    int64_t best = tp * rt;
    for (int64_t t = top; t >= 1 && (t == top || t * ct >= kRawFirstMinTile); t /= 2)
      for (bool pingpong : {true, false}) {
        if ((pingpong && s.relu_mask) || need(t, ct, pingpong) > ub) continue;
        const int64_t r = raw_tiles(t, pingpong);
        if (t * r <= best) continue;
        best = t * r;
        tp = t;
        rt = r;
        m_pingpong = pingpong;
      }
  }
  m_tp = tp;
  m_rt = rt;
  m_ct = ct;
  m_tile = static_cast<uint64_t>(tp * ct);
  m_stagger = s.stagger_first_tiles && !m_pingpong && m_blocks > 1 &&
              stagger_range_long_enough(m_b, m_per, tp * rt) &&
              load_round_trips_idle_hbm(m_b.config(), m_blocks);
}

// UB buffers, each starting in a bank window of its own among those an instruction combines
// (the vector unit's bank model: a repeat's operands in the same banks take turns; the UB's
// banks x width bytes hold span / 256 windows of one repeat): a 0, b 1, the accumulators 2
// (ping) and 5 (pong), the plain ones 3 and 4, the product 4, m 5 (none of them meets the
// accumulators in an instruction; an accumulation combines its two accumulators with a, b or
// the product). The ReLU-masked sums (relu_mask_windows) place theirs otherwise.
void ChannelSumEmitter::allocate() {
  KernelBuilder& b = m_b;
  const uint64_t slack = PixelOps::kPixelSlack;
  const uint64_t tile = m_tile;
  const ChipConfig& cfg = m_b.config();
  const uint64_t span = static_cast<uint64_t>(cfg.ub_banks) * cfg.ub_bank_width_bytes;
  const uint64_t windows = span / vec::kRepeatBytes;
  // Allocates `bytes` starting at bank window w (mod the windows there are; none: as it comes).
  auto alloc = [&](uint64_t bytes, const std::string& name, uint64_t w) {
    if (windows > 1 && span % vec::kRepeatBytes == 0) {
      const uint64_t used = m_core.capacity(Buf::UB) - b.free_bytes(Buf::UB);
      const uint64_t at = (w % windows) * vec::kRepeatBytes;
      const uint64_t pad = (at + span - used % span) % span;
      if (pad) b.alloc(Buf::UB, pad, "bank window padding");
    }
    return b.alloc(Buf::UB, bytes, name);
  };
  // f32 inputs are computed on in their raw buffer (m_a32 / m_b32 = 0: that tile's raw one).
  for (int q = 0; q < 2; ++q) {
    const char* name = q ? "a (raw, pong)" : "a (raw, ping)";
    const uint64_t raw = tile * static_cast<uint64_t>(m_rt);
    m_a_raw[q] = alloc(raw * static_cast<uint64_t>(m_sa) + slack, name, 0);
    if (m_has_b)
      m_b_raw[q] = alloc(raw * static_cast<uint64_t>(m_sb) + slack,
                         q ? "b (raw, pong)" : "b (raw, ping)", 1);
  }
  if (m_sa != 4) m_a32 = alloc(tile * 4 + slack, "a (f32)", 0);
  if (m_has_b && m_sb != 4) m_b32 = alloc(tile * 4 + slack, "b (f32)", 1);
  if (m_s.kind != Kind::kSum || m_s.centered)
    m_t = alloc(tile * 4 + slack, "scratch: a - m, or the products", 4);
  if (m_s.centered) m_m = alloc(static_cast<uint64_t>(m_ct) * 4 + slack, "m", 5);
  const MaskWindows mw = relu_mask_windows(b, m_s.relu_mask);
  if (m_s.relu_mask) {
    m_fa = alloc(static_cast<uint64_t>(m_ct) * 4 + slack, "fa", mw.fa_fs);
    m_fs = alloc(static_cast<uint64_t>(m_ct) * 4 + slack, "fs", mw.fa_fs);
    m_z = alloc(tile * 4 + slack, "pre-activation fa * a + fs", mw.z);
    m_bits = alloc(ceil_div(tile, 8) + slack, "mask bits", kMaskBitsWindow);
    for (int i = 0; i < m_s.mask_vectors; ++i)
      m_mask.push_back(b.alloc(Buf::UB, static_cast<uint64_t>(m_ct) * 4 + slack,
                               fmt::format("mask vector {}", i)));
    if (!mw.constants) allocate_mask_constants(nullptr);
  }
  m_acc[0] = alloc(tile * 4 + slack, "accumulators", mw.acc);
  // (the tile was sized for ping-pong sums: with vmla the pong is left free)
  m_acc[1] = m_pingpong && !m_mla ? alloc(tile * 4 + slack, "accumulators (pong)", mw.acc_pong)
                                   : m_acc[0];
  if (m_s.plain_sum) {
    m_acc2[0] = alloc(tile * 4 + slack, "plain accumulators", 3);
    m_acc2[1] = m_pingpong ? alloc(tile * 4 + slack, "plain accumulators (pong)", 4) : m_acc2[0];
  }
  if (m_s.relu_mask && mw.constants) {
    // The constant repeats (read at repeat stride 0, so in the same 8 banks every repeat) in
    // the windows after those the mask bits cover (8 bytes a repeat from kMaskBitsWindow), so
    // that the select's bits never share a bank with its 1.0f or 0.0f (which cost the select
    // a second access every repeat: 150 cycles for 64 repeats at the 910b's 14x14x256 tile,
    // 108 placed). The threshold, read by the compare only, shares the 1.0f's window. Placed
    // where the windows and the UB left allow it (plan_tile allows a span of padding for each
    // of 18 buffers or more with the mask; with these, at most 17 are padded here, 19 of 20
    // with ping-pong sums); else as they come.
    const uint64_t bits_windows = ceil_div(ceil_div(tile, 8), vec::kRepeatBytes);
    const bool placed = windows > 1 && span % vec::kRepeatBytes == 0 &&
                        bits_windows + 2 <= windows &&
                        b.free_bytes(Buf::UB) >= 3 * (span + vec::kRepeatBytes);
    const uint64_t w_one = kMaskBitsWindow + bits_windows;
    const std::function<uint64_t(const std::string&, uint64_t)> at_window =
        [&](const std::string& name, uint64_t w) { return alloc(vec::kRepeatBytes, name, w); };
    allocate_mask_constants(placed ? &at_window : nullptr, w_one);
  }
}

// The ReLU mask's constant repeats: 1.0f, 0.0f and the threshold (m_zero where it is 0), at
// the windows w_one, w_one + 1 and w_one (alloc_at: allocate at a window), or where they come.
void ChannelSumEmitter::allocate_mask_constants(
    const std::function<uint64_t(const std::string&, uint64_t)>* alloc_at, uint64_t w_one) {
  KernelBuilder& b = m_b;
  const auto repeat = [&](const std::string& name, uint64_t w) {
    return alloc_at ? (*alloc_at)(name, w) : b.alloc(Buf::UB, vec::kRepeatBytes, name);
  };
  m_one = repeat("1.0f repeat", w_one);
  m_zero = repeat("0.0f repeat", w_one + 1);
  m_threshold = relu_mask_threshold(m_s.a_type) == 0.0f
                    ? m_zero
                    : repeat("ReLU mask threshold repeat", w_one);
}

void ChannelSumEmitter::declare_args(ChannelSumLaunch& out) {
  KernelBuilder& b = m_b;
  const ChannelSumSpec& s = m_s;
  b.declare_arg(m_a_arg, s.a_type, {});
  out.launch.args.push_back(ArgRef{ArgRef::Kind::kInput, 0, 0});
  if (m_has_b) {
    b.declare_arg("b", s.b_type, {});
    out.launch.args.push_back(ArgRef{ArgRef::Kind::kInput, 1, 0});
  }
  if (s.centered) {
    b.declare_arg("m", Dtype::F32, {s.channels ? s.channels : s.cp});
    out.launch.args.push_back(ArgRef{ArgRef::Kind::kInput, 2, 0});
  }
  for (int i = 0; s.relu_mask && i < s.mask_vectors; ++i) {
    b.declare_arg(fmt::format("mask{}", i), Dtype::F32, {s.channels ? s.channels : s.cp});
    out.launch.args.push_back(ArgRef{ArgRef::Kind::kInput, 3 + i, 0});
  }
  b.declare_arg("partials", Dtype::F32, {s.batch, m_blocks, s.cp});
  out.launch.args.push_back(ArgRef{ArgRef::Kind::kOutput, 0, 0});
  if (s.plain_sum) {
    b.declare_arg("partials2", Dtype::F32, {s.batch, m_blocks, s.cp});
    out.launch.args.push_back(ArgRef{ArgRef::Kind::kOutput, 1, 0});
  }
}

// Where an epilogue's tiles go: channel tiles of ct f32 spread over `blocks` cores (tile k on
// core k mod blocks).
struct EpiloguePlan {
  int64_t ct = kF32Tile;
  int blocks = 1;
  uint64_t need = 0;  // UB bytes of its buffers (with their alignment)
  // Every partial set in a buffer of its own, loaded with the vectors under one MTE2 -> V flag
  // (one memory round trip per tile); else the sets take turns in one buffer, a round trip each.
  bool sets_at_once = false;
};

// The largest channel tile whose buffers fit `ub` bytes of UB with one partials buffer (with
// spread, at most c / cores channels in whole f32 repeats, so that every one of `cores` cores
// gets a tile). With at_once, the partial sets then take a buffer each where that tile's buffers
// still fit `ub` (the same tile either way).
EpiloguePlan plan_epilogue(KernelBuilder& b, const ChannelEpilogueSpec& s, uint64_t ub, int cores,
                           bool at_once = false) {
  int max_blocks = 1;
  for (int k : s.partial_blocks) max_blocks = std::max(max_blocks, k);
  const int sets = static_cast<int>(s.partial_blocks.size());
  const int nbuf = sets + s.vectors + s.outputs + s.temps;
  if (s.out_type != Dtype::F32 &&
      (s.out_type != Dtype::F16 || (s.c * isa::dtype_size(s.out_type)) % 32 != 0))
    b.fail(fmt::format("channel epilogue outputs of {} x {} (f32, or f16 in whole 32-byte blocks)",
                       s.c, isa::dtype_name(s.out_type)));
  // One channel tile of ct f32 in every buffer (partials: max_blocks rows of it, per set
  // `partial_buffers` times).
  auto need = [&](int64_t c, int partial_buffers = 1) {
    return static_cast<uint64_t>(c) * 4 *
               (static_cast<uint64_t>(max_blocks) * static_cast<uint64_t>(partial_buffers) +
                static_cast<uint64_t>(nbuf)) +
           static_cast<uint64_t>(nbuf + partial_buffers) * 64;
  };
  const int64_t cap =
      s.spread
          ? static_cast<int64_t>(round_up(static_cast<uint64_t>(ceil_div(s.c, cores)), kF32Tile))
          : std::numeric_limits<int64_t>::max();
  EpiloguePlan p;
  while (p.ct * 2 <= static_cast<int64_t>(round_up(static_cast<uint64_t>(s.c), kF32Tile)) &&
         p.ct * 2 <= cap && need(p.ct * 2) <= ub)
    p.ct *= 2;
  p.blocks = s.spread ? static_cast<int>(std::min<int64_t>(ceil_div(s.c, p.ct), cores)) : 1;
  p.need = need(p.ct);
  if (p.need > ub) b.fail("the channel epilogue does not fit the UB");
  if (at_once && sets > 1 && need(p.ct, sets) <= ub) {
    p.sets_at_once = true;
    p.need = need(p.ct, sets);
  }
  return p;
}

// The epilogue's tiles in the section begun in b (arguments declared by the caller: partial
// set i in partial_args[i], "vector{i}", "output{i}"); core = this core's index among
// p.blocks (unused when p.blocks is 1; cores past p.blocks take no tile). With over_ub, the
// buffers are laid out from the UB's start over what the section allocated before (p planned
// for the whole UB): the caller's flags keep every pipe off those buffers by then.
void emit_epilogue_tiles(KernelBuilder& b, const ChannelEpilogueSpec& s, const EpiloguePlan& p,
                         const std::vector<std::string>& partial_args, const Reg* core,
                         bool over_ub = false) {
  const int64_t ct = p.ct;
  int max_blocks = 1;
  for (int k : s.partial_blocks) max_blocks = std::max(max_blocks, k);
  const uint64_t row = static_cast<uint64_t>(ct) * 4;  // whole 32-byte blocks (ct: kF32Tile's)
  uint64_t next = 0;
  auto alloc = [&](uint64_t bytes, const std::string& name) {
    if (!over_ub) return b.alloc(Buf::UB, bytes, name);
    const uint64_t at = next;
    next += round_up(bytes, b.alignment(Buf::UB));
    return at;
  };
  EpilogueOperands ops;
  std::vector<uint64_t> partial = {alloc(row * static_cast<uint64_t>(max_blocks), "partials")};
  for (size_t i = 1; p.sets_at_once && i < s.partial_blocks.size(); ++i)
    partial.push_back(alloc(row * static_cast<uint64_t>(max_blocks), fmt::format("partials {}", i)));
  for (size_t i = 0; i < s.partial_blocks.size(); ++i)
    ops.sums.push_back(alloc(row, fmt::format("sum {}", i)));
  for (int i = 0; i < s.vectors; ++i)
    ops.vectors.push_back(alloc(row, fmt::format("vector {}", i)));
  for (int i = 0; i < s.outputs; ++i)
    ops.outputs.push_back(alloc(row, fmt::format("output {}", i)));
  for (int i = 0; i < s.temps; ++i) ops.temps.push_back(alloc(row, fmt::format("temp {}", i)));
  const int ready = b.flag(Pipe::MTE2, Pipe::V, "inputs loaded");
  const int consumed = p.sets_at_once ? -1 : b.flag(Pipe::V, Pipe::MTE2, "partials summed");
  const int done = b.flag(Pipe::V, Pipe::MTE3, "outputs computed");
  const int stored = b.flag(Pipe::MTE3, Pipe::MTE2, "outputs stored");
  Reg item = b.reg("item");
  b.for_range(item, 0, s.batch, 1, [&] {
    for (int64_t c0 = 0; c0 < s.c; c0 += ct) {
      const auto tile = [&, c0] {
        KernelBuilder::Origin o(b, fmt::format("channels [{}, {})", c0, std::min(s.c, c0 + ct)));
        const int64_t cn = std::min(ct, s.c - c0);
        const int64_t blocks = ceil_div(cn * 4, 32);
        const auto load_set = [&](size_t i) {
          const int nb = s.partial_blocks[i];
          Reg src = b.load_arg(partial_args[i]), t = b.reg("offset"),
              d = b.reg_imm("partials", int64_t(partial[p.sets_at_once ? i : 0]));
          b.mul(t, item, nb * s.partial_cp * 4);
          b.add(src, src, t);
          b.add(src, src, c0 * 4);
          // One strided copy of the nb partial rows, or one copy per row where the rows lie
          // further apart than copy_gm2ub's 16-bit source gap reaches (a filter gradient's
          // partial rows are a whole filter apart: 512 x 2048 f32 is 131,072 blocks).
          const int64_t src_gap = s.partial_cp * 4 / 32 - blocks;
          if (static_cast<uint64_t>(src_gap) <= isa::field_imm_max(isa::FieldKind::RU16)) {
            b.emit(Opcode::op_copy_gm2ub, {d, src, nb, blocks, src_gap, ct * 4 / 32 - blocks},
                   "the blocks' partial sums");
          } else {
            for (int k = 0; k < nb; ++k) {
              if (k > 0) {
                b.add(src, src, s.partial_cp * 4);
                b.add(d, d, row);
              }
              b.emit(Opcode::op_copy_gm2ub, {d, src, 1, blocks, 0, 0},
                     fmt::format("block {}'s partial sums", k));
            }
          }
        };
        const auto load_vectors = [&] {
          for (int i = 0; i < s.vectors; ++i) {
            Reg src = b.load_arg(fmt::format("vector{}", i)),
                d = b.reg_imm("vector", int64_t(ops.vectors[static_cast<size_t>(i)]));
            b.add(src, src, c0 * 4);
            b.emit(Opcode::op_copy_gm2ub, {d, src, 1, blocks, 0, 0}, "input vector");
          }
        };
        // Set i's partials folded pairwise (fold_rows_pairwise: the same sums wherever this
        // epilogue runs); the partials buffer is overwritten.
        const auto add_set = [&](size_t i) {
          fold_rows_pairwise(b, ops.sums[i], partial[p.sets_at_once ? i : 0],
                             s.partial_blocks[i], ct, cn);
        };
        if (p.sets_at_once) {
          for (size_t i = 0; i < s.partial_blocks.size(); ++i) load_set(i);
          load_vectors();
          b.set_flag(Pipe::MTE2, Pipe::V, ready);
          b.wait_flag(Pipe::MTE2, Pipe::V, ready);
          for (size_t i = 0; i < s.partial_blocks.size(); ++i) add_set(i);
        } else {
          for (size_t i = 0; i < s.partial_blocks.size(); ++i) {
            load_set(i);
            b.set_flag(Pipe::MTE2, Pipe::V, ready);
            b.wait_flag(Pipe::MTE2, Pipe::V, ready);
            add_set(i);
            // The partials buffer is reused by the next set: V is done with it before MTE2 loads.
            b.set_flag(Pipe::V, Pipe::MTE2, consumed);
            b.wait_flag(Pipe::V, Pipe::MTE2, consumed);
          }
          load_vectors();
          b.set_flag(Pipe::MTE2, Pipe::V, ready);
          b.wait_flag(Pipe::MTE2, Pipe::V, ready);
        }
        Reg n = b.reg_imm("channels", cn);
        ops.count = &n;
        s.compute(b, ops);
        b.set_flag(Pipe::V, Pipe::MTE3, done);
        b.wait_flag(Pipe::V, Pipe::MTE3, done);
        const int64_t out_size = isa::dtype_size(s.out_type);
        for (int i = 0; i < s.outputs; ++i) {
          Reg dst = b.load_arg(fmt::format("output{}", i)), t = b.reg("offset"),
              src = b.reg_imm("output", int64_t(ops.outputs[static_cast<size_t>(i)]));
          b.mul(t, item, s.out_pitch * out_size);
          b.add(dst, dst, t);
          b.add(dst, dst, c0 * out_size);
          b.emit(Opcode::op_copy_ub2gm, {dst, src, 1, ceil_div(cn * out_size, 32), 0, 0},
                 "output vector");
        }
        // The next tile's loads overwrite buffers the stores read.
        b.set_flag(Pipe::MTE3, Pipe::MTE2, stored);
        b.wait_flag(Pipe::MTE3, Pipe::MTE2, stored);
      };
      if (p.blocks > 1) {
        b.if_(eq(*core, (c0 / ct) % p.blocks), tile);  // tile k on core k mod blocks
      } else {
        tile();
      }
    }
  });
}

int ChannelSumEmitter::emit_section(const ChannelSumSection& sec) {
  KernelBuilder& b = m_b;
  const ChannelSumSpec& s = m_s;
  if (m_has_b || s.centered || s.relu_mask || s.batch != 1 || s.channels)
    b.fail(
        "a channel-sum section sums one tensor a (kSum or kSumSquares, one item, whole-block "
        "pixels)");
  if (sec.groups < 1) b.fail("a channel-sum section needs at least one group");
  m_a_arg = sec.a_arg;
  m_vector_blocks = sec.groups * static_cast<int64_t>(b.aiv_per_aic());
  const int cores = static_cast<int>(m_vector_blocks);
  std::optional<ChannelEpilogueSpec> e;
  if (sec.epilogue) {
    e = *sec.epilogue;
    if (e->vectors != 0 || e->batch != 1 || e->c > s.cp)
      b.fail("a channel-sum section's epilogue reads the section's partial sets, no vectors");
    e->partial_cp = s.cp;
    // The UB its tiles need with as many partials as there are vector cores (the most blocks
    // the sums can have), kept from the sums' tiles.
    e->partial_blocks.assign(sec.epilogue_sets.size(), cores);
    m_ub_reserved = plan_epilogue(b, *e, m_core.capacity(Buf::UB), cores).need;
  }
  plan_tile();
  b.begin_section(m_kind);
  allocate();
  m_px.emplace(b, m_ct);
  b.declare_arg("partials", Dtype::F32, {s.batch, m_blocks, s.cp});
  if (s.plain_sum) b.declare_arg("partials2", Dtype::F32, {s.batch, m_blocks, s.cp});
  if (sec.epilogue)
    for (int i = 0; i < sec.epilogue->outputs; ++i)
      b.declare_arg(fmt::format("output{}", i), sec.epilogue->out_type, {});
  emit_body([&](const Reg& blk) { section_vector_core(m_b, blk); },
            sec.wait ? [&] { sec.wait(b); } : std::function<void()>());
  if (e) {
    e->partial_blocks.assign(sec.epilogue_sets.size(), m_blocks);
    emit_partials_barrier(sec.barrier_flag);
    m_px.reset();
    const EpiloguePlan p = plan_epilogue(b, *e, b.free_bytes(Buf::UB), cores);
    Reg core = b.reg("vector core of the launch");
    section_vector_core(m_b, core);
    emit_epilogue_tiles(b, *e, p, sec.epilogue_sets, &core);
  }
  b.end();
  return m_blocks;
}

ChannelSumLaunch ChannelSumEmitter::build(std::optional<ChannelEpilogueSpec> e) {
  KernelBuilder& b = m_b;
  const ChannelSumSpec& s = m_s;
  if (e && !b.config().split)
    b.fail("channel sums with their epilogue in the kernel need a split chip (cross-core flags)");
  if (e && (e->batch != s.batch || e->c > s.cp))
    b.fail(
        fmt::format("a channel-sum epilogue of {} items and {} channels after sums of {} items "
                    "and {} channels",
                    e->batch, e->c, s.batch, s.cp));
  // The sums' tiles are the same with an epilogue: it takes the UB again once they are stored.
  plan_tile();
  b.begin_section(m_kind);
  allocate();
  m_px.emplace(b, m_ct);
  ChannelSumLaunch out;
  declare_args(out);
  const int first = static_cast<int>(out.launch.args.size());
  for (int i = 0; e && i < e->vectors; ++i) {
    b.declare_arg(fmt::format("vector{}", i), Dtype::F32, {e->c});
    out.launch.args.push_back(ArgRef{ArgRef::Kind::kInput, first + i, 0});
  }
  for (int i = 0; e && i < e->outputs; ++i) {
    b.declare_arg(fmt::format("output{}", i), e->out_type, {});
    out.launch.args.push_back(ArgRef{ArgRef::Kind::kOutput, first + e->vectors + i, 0});
  }
  emit_body([&](const Reg& blk) { b.emit(Opcode::op_get_block_id, {blk}); }, nullptr);
  // The partials as [rows][pitch] (ChannelSumSpec::channels: a row's pixels are rows of them).
  const int64_t pitch = s.channels ? s.channels : s.cp;
  const int rows_per_block = static_cast<int>(m_row_pixels);
  std::string epilogue;
  if (e) {
    std::vector<std::string> sets = {"partials"};
    if (s.plain_sum) sets.push_back("partials2");
    e->partial_cp = pitch;
    // Every block has pixels (m_blocks splits them): all of them meet at the barrier.
    m_px.reset();
    emit_partials_epilogue(b, *e, sets, static_cast<int>(m_blocks), 0, rows_per_block);
    e->partial_blocks.assign(sets.size(), m_blocks * rows_per_block);
    const EpiloguePlan p = plan_epilogue(b, *e, m_core.capacity(Buf::UB), m_blocks);
    epilogue = fmt::format("; then {} in the kernel, tiles of {} channels on {} blocks", e->name,
                           p.ct, p.blocks);
  }
  b.end();
  out.launch.kernel = b.finish();
  out.launch.block_dim = m_blocks;
  out.blocks = m_blocks;
  out.partial_rows = m_blocks * rows_per_block;
  out.partial_pitch = pitch;
  const std::string rows =
      s.channels ? fmt::format(" ({} channels, {} pixels a row{})", s.channels, m_row_pixels,
                               m_tail ? fmt::format(", a partial row of {}", m_tail) : "")
                 : "";
  out.launch.summary = fmt::format(
      "channel sums of {} x {} x {} {}{}: {} blocks of {} pixels, "
      "tiles of {} pixels x {} channels, loaded {} pixels at a time{}{}",
      s.batch, m_rows, s.cp, isa::dtype_name(s.a_type), rows, m_blocks, m_per, m_tp, m_ct,
      m_tp * m_rt, m_stagger ? " (the blocks' first raw tiles staggered)" : "", epilogue);
  return out;
}

// Every vector core of the launch, including those without pixels, signals once its partials
// are in GM (cc_set from MTE3, which issues after the stores and waits for them to land) and
// waits for all (MTE2: the first to read another core's partials).
void ChannelSumEmitter::emit_partials_barrier(int id) { partials_barrier(m_b, id); }

void ChannelSumEmitter::emit_body(const std::function<void(const Reg& blk)>& block,
                                  const std::function<void()>& wait) {
  KernelBuilder& b = m_b;
  const ChannelSumSpec& s = m_s;
  m_in_free = b.flag_pair(Pipe::V, Pipe::MTE2, "tile free");
  m_in_ready = b.flag_pair(Pipe::MTE2, Pipe::V, "tile loaded");
  m_m_free = b.flag(Pipe::V, Pipe::MTE2, "m free");
  m_m_ready = b.flag(Pipe::MTE2, Pipe::V, "m loaded");
  m_acc_ready = b.flag(Pipe::V, Pipe::MTE3, "sums ready");
  m_acc_free = b.flag(Pipe::MTE3, Pipe::V, "sums stored");
  // The block id stays live (it indexes the partials): the range is computed from it.
  Reg p0 = b.reg("first pixel"), p1 = b.reg("end pixel"), blk = b.reg("block");
  Label done = b.label("no pixels for this block");
  if (m_vector_blocks) {
    block(blk);
    if (wait) wait();
    // Vector cores past the pixels write nothing.
    if (m_vector_blocks > m_blocks) b.branch(ge(blk, m_blocks), done);
  }
  for (int q = 0; q < 2; ++q) b.set_flag(m_in_free, q);
  b.set_flag(Pipe::V, Pipe::MTE2, m_m_free);
  if (s.relu_mask) {
    vec_fill_repeat(b, m_f16_mask ? Dtype::F16 : Dtype::F32, m_one, 1.0);
    vec_fill_repeat(b, Dtype::F32, m_zero, 0.0);  // (all bits 0: f16's 0 too)
    if (m_threshold != m_zero)
      vec_fill_repeat(b, Dtype::F32, m_threshold, relu_mask_threshold(s.a_type));
  }
  b.set_flag(Pipe::MTE3, Pipe::V, m_acc_free);
  if (!m_vector_blocks) block(blk);
  b.mul(p0, blk, m_per);
  b.add(p1, p0, m_per);
  b.min(p1, p1, m_rows);
  Reg item = b.reg("item"), g = b.reg("channel group");
  b.for_range(item, 0, s.batch, 1, [&] {
    b.for_range(g, 0, s.cp / m_ct, 1, [&] { emit_group(p0, p1, blk, item, g); });
  });
  for (int q = 0; q < 2; ++q) b.wait_flag(m_in_free, q);
  b.wait_flag(Pipe::V, Pipe::MTE2, m_m_free);
  b.wait_flag(Pipe::MTE3, Pipe::V, m_acc_free);
  b.bind(done);
}

void ChannelSumEmitter::emit_group(const Reg& p0, const Reg& p1, const Reg& blk, const Reg& item,
                                   const Reg& g) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, "one item and channel group: tiles of pixels");
  b.wait_flag(Pipe::MTE3, Pipe::V, m_acc_free);
  {
    Reg n = b.reg_imm("elements", static_cast<int64_t>(m_tile));
    vec_dup_bits(b, 4, m_acc[0], 0, n);
    if (m_s.plain_sum) vec_dup_bits(b, 4, m_acc2[0], 0, n);
  }
  if (m_vectors) load_vectors(g);     // (their flag after the first raw tile's loads)
  accumulate_tiles(p0, p1, blk, item, g);  // the group's folded sums in acc[0] (and acc2[0])
  b.set_flag(Pipe::V, Pipe::MTE3, m_acc_ready);
  b.wait_flag(Pipe::V, Pipe::MTE3, m_acc_ready);
  store_sums("partials", m_acc[0], blk, item, g);
  if (m_s.plain_sum) store_sums("partials2", m_acc2[0], blk, item, g);
  b.set_flag(Pipe::MTE3, Pipe::V, m_acc_free);
}

// The group's per-channel vectors (m; the mask vectors, then fa and fs from them), once per
// group; V releases them after the group's last tile. Their loads only: vectors_ready hands
// them to V.
void ChannelSumEmitter::load_vectors(const Reg& g) {
  KernelBuilder& b = m_b;
  b.wait_flag(Pipe::V, Pipe::MTE2, m_m_free);
  if (m_s.centered) load_vector("m", m_m, g);
  for (size_t i = 0; i < m_mask.size(); ++i) load_vector(fmt::format("mask{}", i), m_mask[i], g);
}

// The vectors load_vectors loaded, to V (and the ReLU's fold from them). Issued after the
// group's first raw tile's loads: a set_flag holds MTE2 until its loads have landed
// (sync.set_flag_holds_pipe), so the vectors and that raw tile take one memory round trip, not
// one each.
void ChannelSumEmitter::vectors_ready() {
  KernelBuilder& b = m_b;
  b.set_flag(Pipe::MTE2, Pipe::V, m_m_ready);
  b.wait_flag(Pipe::MTE2, Pipe::V, m_m_ready);
  if (m_s.relu_mask) {
    KernelBuilder::Origin o(b, "the ReLU's fold, channel group");
    std::vector<uint64_t> vectors = {m_m};
    vectors.insert(vectors.end(), m_mask.begin(), m_mask.end());
    Reg n = b.reg_imm("channels", m_ct);
    m_s.mask_fold(b, n, vectors, m_fa, m_fs, m_z);
  }
}

void ChannelSumEmitter::load_vector(const std::string& arg, uint64_t dst, const Reg& g) {
  KernelBuilder& b = m_b;
  Reg src = b.load_arg(arg), t = b.reg("temp"), d = b.reg_imm("vector buffer", int64_t(dst));
  if (m_s.channels) {  // the one group: the [channels] vector once per pixel of the row
    const int64_t bytes = m_s.channels * 4;
    for (int64_t p = 0; p < m_row_pixels; ++p) {
      if (p) b.add(d, d, bytes);
      b.emit(Opcode::op_copy_gm2ub, {d, src, 1, bytes / 32, 0, 0},
             fmt::format("{}, for pixel {} of the row", arg, p));
    }
    return;
  }
  b.mul(t, g, m_ct * 4);
  b.add(src, src, t);
  b.emit(Opcode::op_copy_gm2ub, {d, src, 1, m_ct * 4 / 32, 0, 0},
         fmt::format("{}, channel group", arg));
}

// b * (fa * a32 + fs > threshold ? 1 : 0) over the tile's n pixels (cnt elements), returned as
// f32: the pre-activation with the instructions BNTrainingUpdate's apply uses (vmul, then vadd:
// the same bits), compared with relu_mask_threshold of the type it is stored in (so the mask is
// ReluGrad's on the stored output), the factor and product as ReluGrad's. b is b32 (f32, the
// product into the pre-activation's tile, which is returned) or, with m_f16_mask, b's raw f16
// tile (the factor and product in f16, the product into the pre-activation's tile, then widened
// into m_b32, which is returned). No step in place (the bank model, below): the product
// fa * a32 and the factor go through the scratch m_t, free until the centring.
uint64_t ChannelSumEmitter::relu_mask(uint64_t a32, uint64_t b, const Reg& n, const Reg& cnt) {
  KernelBuilder& kb = m_b;
  PixelOps& px = *m_px;
  px.binary(Opcode::op_vmul, m_t, 1, a32, 1, m_fa, 0, n);
  px.binary(Opcode::op_vadd, m_z, 1, m_t, 1, m_fs, 0, n);
  vec_compare(kb, Dtype::F32, isa::Cmp::GT, m_bits, m_z, m_threshold, cnt, true);
  const Dtype t = m_f16_mask ? Dtype::F16 : Dtype::F32;
  vec_select(kb, t, m_t, m_one, m_zero, m_bits, cnt, true, true);
  vec_binary(kb, Opcode::op_vmul, t, m_z, b, m_t, cnt);
  if (!m_f16_mask) return m_z;
  px.widen(m_b32, m_z, Dtype::F16, cnt);
  return m_b32;
}

// The block's tiles of pixels [p0, p1) in the group, raw tiles alternately into the ping and
// the pong buffers (the loop unrolled twice, as the streaming kernel's), then the group's
// vectors released and the running sums folded into acc[0]: with ping-pong sums the j-th tile
// of the group reads acc[j % 2], so the loop leaves before an even tile with the sums in
// acc[0], before an odd one (or after a partial one, in place) with them in acc[1], and each
// exit folds from its own.
void ChannelSumEmitter::accumulate_tiles(const Reg& p0, const Reg& p1, const Reg& blk,
                                         const Reg& item, const Reg& g) {
  KernelBuilder& b = m_b;
  Reg t0 = b.reg("tile start");
  b.mov(t0, p0);
  Label loop = b.label("tiles"), end = b.label("tiles_end");
  // In place (acc[1] == acc[0]) both exits are the same.
  const int exits = m_pingpong ? 2 : 1;
  Label exit[2] = {b.label("tiles_end_sums_in_ping"),
                   m_pingpong ? b.label("tiles_end_sums_in_pong") : Label{}};
  if (!m_pingpong) exit[1] = exit[0];
  const int64_t raw = m_tp * m_rt;
  if (m_stagger) {
    // this block's share of a raw tile first: ceil((blk + 1) * raw / blocks) pixels
    // (emit_staggered_first_tile).
    // blk is the block among m_blocks that owns pixels [p0, p1) (in a mix kernel's section the
    // vector core's index, not the cube block's get_block_id), so the phases run 0 .. m_blocks
    // - 1 over the blocks. Each group starts its pixels anew (its sums are stored and cleared
    // in between, the blocks' equal work bringing them back in step), so each is staggered.
    KernelBuilder::Origin o(b, fmt::format("staggered first raw tile: {} phases", m_blocks));
    if (!m_raw_limit) {
      m_raw_limit.emplace(b.reg("pixels the next raw tile may hold"));
      for (auto& e : m_raw_end) e.emplace(b.reg("end of the raw tile"));
    }
    emit_staggered_first_tile(b, *m_raw_limit, blk, m_blocks, raw, 1);
  }
  if (m_vectors) {  // the first raw tile's loads before the vectors' flag
    Label none = b.label("no_first_raw_tile");
    b.branch(ge(t0, p1), none);
    load_raw_tile(0, t0, p1, item, g);
    b.bind(none);
    vectors_ready();
    b.branch(ge(t0, p1), exit[0]);
  } else {
    b.branch(ge(t0, p1), exit[0]);
    load_raw_tile(0, t0, p1, item, g);
  }
  b.bind(loop);
  for (int q = 0; q < 2; ++q) {
    {
      // The next raw tile's loads are issued before this one's vector work (the scalar unit
      // issues in order and waits while the vector queue is full).
      Label none = b.label("no_next_raw_tile");
      Reg next = b.reg("next raw tile");
      if (m_stagger)
        b.mov(next, *m_raw_end[q]);
      else
        b.add(next, t0, raw);
      b.branch(ge(next, p1), none);
      load_raw_tile(1 - q, next, p1, item, g);
      b.bind(none);
    }
    accumulate_raw_tile(q, t0, p1, exit);
    b.branch(ge(t0, p1), exit[((q + 1) * m_rt) % 2]);
  }
  b.jmp(loop);
  for (int q = 0; q < exits; ++q) {
    b.bind(exit[q]);
    // the group's vectors are done (with a partial row: after it)
    if (m_vectors && !m_tail) b.set_flag(Pipe::V, Pipe::MTE2, m_m_free);
    fold_into_first(m_acc, q);
    if (m_s.plain_sum) fold_into_first(m_acc2, q);
    if (q + 1 < exits) b.jmp(end);
  }
  b.bind(end);
  if (m_tail) {
    b.if_(eq(blk, m_blocks - 1), [&] { accumulate_tail(item); });
    if (m_vectors) b.set_flag(Pipe::V, Pipe::MTE2, m_m_free);
  }
}

// The partial row after the whole ones (ChannelSumSpec::channels; the last block's, the one
// group's sums folded into acc[0]): its m_tail elements (whole pixels, fewer than a row's) into
// the ping raw buffers, 32-byte blocks rounded up as the streaming kernels load (the lanes past
// them are never added), then accumulate_tile's steps over one pixel of the row, added in
// place onto the first m_tail sums: element l of the row is channel l mod channels, as in a
// whole row.
void ChannelSumEmitter::accumulate_tail(const Reg& item) {
  KernelBuilder& b = m_b;
  const ChannelSumSpec& s = m_s;
  KernelBuilder::Origin o(b, fmt::format("the partial row: {} elements", m_tail));
  b.wait_flag(m_in_free, 0);
  const auto load = [&](const char* arg, uint64_t dst, int64_t size, int64_t bstride) {
    Reg src = b.load_arg(arg), q = b.reg("offset"), d = b.reg_imm("tile", int64_t(dst));
    b.mul(q, item, bstride);
    b.add(q, q, m_rows * s.cp);
    b.mul(q, q, size);
    b.add(src, src, q);
    b.emit(Opcode::op_copy_gm2ub, {d, src, 1, ceil_div(m_tail * size, 32), 0, 0},
           fmt::format("{}: the partial row", arg));
  };
  load(m_a_arg, m_a_raw[0], m_sa, s.a_batch_stride);
  if (m_has_b) load("b", m_b_raw[0], m_sb, s.b_batch_stride);
  b.set_flag(m_in_ready, 0);
  b.wait_flag(m_in_ready, 0);
  Reg n = b.reg_imm("pixels (one row)", 1), elements = b.reg_imm("elements", m_tail);
  accumulate_tile(0, 0, 0, n, &elements);
  b.set_flag(m_in_free, 0);
}

// The raw tile at pixel t0 (< p1) into buffers q: up to rt tiles of a (and b) under one flag.
void ChannelSumEmitter::load_raw_tile(int q, const Reg& t0, const Reg& p1, const Reg& item,
                                      const Reg& g) {
  KernelBuilder& b = m_b;
  const ChannelSumSpec& s = m_s;
  KernelBuilder::Origin o(b, fmt::format("raw tile load ({})", q ? "pong" : "ping"));
  Reg n = b.reg("raw tile pixels");
  b.sub(n, p1, t0);
  if (m_stagger) {
    b.min(n, n, *m_raw_limit);
    b.movi(*m_raw_limit, m_tp * m_rt, "the later raw tiles: whole ones");
    b.add(*m_raw_end[q], t0, n);
  } else {
    b.min(n, n, m_tp * m_rt);
  }
  b.wait_flag(m_in_free, q);
  load_tile(m_a_arg, m_a_raw[q], m_sa, s.a_batch_stride, n, t0, item, g);
  if (m_has_b) load_tile("b", m_b_raw[q], m_sb, s.b_batch_stride, n, t0, item, g);
  b.set_flag(m_in_ready, q);
}

// The raw tile at pixel t0 (< p1) in buffers q, loaded by load_raw_tile: accumulate its tiles
// (t0 advancing by tp per tile), the raw buffers released before the loop's exits: where the
// pixels end before the raw tile's last tile, and (ping-pong sums) after a partial tile, to
// exit[j % 2], j the tile's index in the group.
void ChannelSumEmitter::accumulate_raw_tile(int q, const Reg& t0, const Reg& p1,
                                            const Label (&exit)[2]) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, fmt::format("raw tile ({})", q ? "pong" : "ping"));
  b.wait_flag(m_in_ready, q);
  const auto leave = [&](Label to) {
    b.set_flag(m_in_free, q);
    b.jmp(to);
  };
  // Staggered, a raw tile may end before p1 and before its last tile (the block's first): its
  // tiles end at its own end, and the loop goes on from there (the sums are in place: no exit
  // depends on the tile's parity).
  const Reg& end = m_stagger ? *m_raw_end[q] : p1;
  Label raw_done = m_stagger ? b.label("raw_tile_done") : Label{};
  for (int k = 0; k < m_rt; ++k) {
    const int j = static_cast<int>((q * m_rt + k) % 2);
    if (k > 0) {
      Label more = b.label("raw_tile_more_pixels");
      b.branch(lt(t0, end), more);
      leave(m_stagger ? raw_done : exit[j]);
      b.bind(more);
    }
    Reg n = b.reg("tile pixels");
    b.sub(n, end, t0);
    b.min(n, n, m_tp);
    accumulate_tile(q, k, j, n);
    if (k + 1 == m_rt) b.set_flag(m_in_free, q);
    if (m_pingpong) {
      if (k + 1 == m_rt) {
        b.branch(lt(n, m_tp), exit[j]);
      } else {
        Label full = b.label("full_tile");
        b.branch(ge(n, m_tp), full);
        leave(exit[j]);
        b.bind(full);
      }
    }
    b.add(t0, t0, m_tp);
  }
  if (m_stagger) {
    b.bind(raw_done);
    b.mov(t0, *m_raw_end[q]);
  }
}

// Tile k of raw tile q just loaded, n pixels (at most tp), the group's j-th tile (mod 2): widen
// to f32, (centered) subtract m, square or multiply, add into the running sums: from acc[j]
// into acc[1 - j]; a partial tile (fewer than tp pixels: the block's last) adds in place into
// acc[j], as acc[1 - j] would keep stale sums past its pixels (the caller leaves the loop after
// it, the sums in acc[j]).
// With `elements` (the partial row, accumulate_tail): that many of the n pixels' elements, added
// in place into acc[j].
void ChannelSumEmitter::accumulate_tile(int q, int k, int j, const Reg& n, const Reg* elements) {
  KernelBuilder& b = m_b;
  const ChannelSumSpec& s = m_s;
  PixelOps& px = *m_px;
  KernelBuilder::Origin o(b, fmt::format("tile {} of the raw tile", k));
  Reg cnt = b.reg("tile elements");
  if (elements)
    b.mov(cnt, *elements);
  else
    b.mul(cnt, n, m_ct);
  auto accumulate = [&](const uint64_t(&acc)[2], uint64_t src) {
    if (!m_pingpong || elements) {
      vec_binary(b, Opcode::op_vadd, Dtype::F32, acc[0], acc[0], src, cnt);
      return;
    }
    Label full = b.label("full_tile"), next = b.label("accumulated");
    b.branch(ge(n, m_tp), full);
    vec_binary(b, Opcode::op_vadd, Dtype::F32, acc[j], acc[j], src, cnt);
    b.jmp(next);
    b.bind(full);
    vec_binary(b, Opcode::op_vadd, Dtype::F32, acc[1 - j], acc[j], src, cnt);
    b.bind(next);
  };
  const uint64_t at = m_tile * static_cast<uint64_t>(k);  // the tile's first element
  const uint64_t a_raw = m_a_raw[q] + at * static_cast<uint64_t>(m_sa);
  const uint64_t b_raw = m_has_b ? m_b_raw[q] + at * static_cast<uint64_t>(m_sb) : 0;
  const uint64_t a32 = m_sa == 4 ? a_raw : m_a32;
  uint64_t b32 = m_has_b && m_sb == 4 ? b_raw : m_b32;
  px.widen(a32, a_raw, s.a_type, cnt);
  if (m_has_b && !m_f16_mask) px.widen(b32, b_raw, s.b_type, cnt);
  if (s.relu_mask) b32 = relu_mask(a32, m_f16_mask ? b_raw : b32, n, cnt);
  if (s.plain_sum) accumulate(m_acc2, m_has_b ? b32 : a32);
  // No step in place where it can be helped (the bank model: a destination that is also a
  // source takes a second access to its banks per repeat): a - m into the scratch, the square
  // or product into whichever of the scratch and a's tile is not its source.
  uint64_t x = a32;
  if (s.centered) px.binary(Opcode::op_vsub, x = m_t, 1, a32, 1, m_m, 0, n);
  if (m_mla) {
    // The square or product added into the sums in place by one vmla (the bits of vmul then
    // vadd): 2 cycles a repeat in the bank model (the sums' banks read and written; x read
    // twice or x and b once each), against vmul and vadd's 3 (ping-pong) or 4 (in place).
    vec_binary(b, Opcode::op_vmla, Dtype::F32, m_acc[0], x,
               s.kind == Kind::kSumSquares ? x : b32, cnt);
    return;
  }
  const uint64_t product = x == a32 ? m_t : a32;
  uint64_t term = x;
  if (s.kind == Kind::kSumSquares)
    vec_binary(b, Opcode::op_vmul, Dtype::F32, term = product, x, x, cnt);
  if (m_has_b) vec_binary(b, Opcode::op_vmul, Dtype::F32, term = product, x, b32, cnt);
  accumulate(m_acc, term);
}

// n pixels of the group's channels from `arg` into dst.
void ChannelSumEmitter::load_tile(const char* arg, uint64_t dst, int64_t size, int64_t bstride,
                                  const Reg& n, const Reg& t0, const Reg& item, const Reg& g) {
  KernelBuilder& b = m_b;
  const int64_t cp = m_s.cp, ct = m_ct;
  // a + (item * batch stride + t0 * cp + g * ct) * size
  Reg src = b.load_arg(arg), t = b.reg("temp"), d = b.reg_imm("tile", int64_t(dst));
  Reg q = b.reg("offset");
  b.mul(q, item, bstride);
  b.mul(t, t0, cp);
  b.add(q, q, t);
  b.mul(t, g, ct);
  b.add(q, q, t);
  b.mul(q, q, size);
  b.add(src, src, q);
  b.emit(Opcode::op_copy_gm2ub, {d, src, n, ct * size / 32, (cp - ct) * size / 32, 0},
         fmt::format("{}: tile pixels, the group's channels", arg));
}

// Folds the tp running sums at acc[from] pairwise, each step from one buffer into the other
// (never in place), the group's ct sums ending in acc[0] (a copy of them if the steps end in
// acc[1]).
void ChannelSumEmitter::fold_into_first(const uint64_t (&acc)[2], int from) {
  int at = from;
  for (int64_t h = m_tp / 2; h >= 1; h /= 2, at = 1 - at) {
    Reg n = m_b.reg_imm("elements", h * m_ct);
    vec_binary(m_b, Opcode::op_vadd, Dtype::F32, acc[1 - at], acc[at],
               acc[at] + static_cast<uint64_t>(h * m_ct) * 4, n);
  }
  if (acc[at] != acc[0]) {
    Reg n = m_b.reg_imm("channels", m_ct);
    f32_copy(m_b, acc[0], acc[1], n);
  }
}

// arg[item][blk][g * ct, (g + 1) * ct) = the group's sums at acc.
void ChannelSumEmitter::store_sums(const char* arg, uint64_t acc, const Reg& blk, const Reg& item,
                                   const Reg& g) {
  KernelBuilder& b = m_b;
  Reg dst = b.load_arg(arg), q = b.reg("offset"), sacc = b.reg_imm("sums", int64_t(acc));
  b.mul(q, item, m_blocks);
  b.add(q, q, blk);
  b.mul(q, q, m_s.cp);
  Reg t = b.reg("temp");
  b.mul(t, g, m_ct);
  b.add(q, q, t);
  b.mul(q, q, 4);
  b.add(dst, dst, q);
  b.emit(Opcode::op_copy_ub2gm, {dst, sacc, 1, m_ct * 4 / 32, 0, 0}, "partial sums");
}

}  // namespace

ChannelSumLaunch build_channel_sum(const ChannelSumSpec& s, const ChipConfig& cfg,
                                   const std::string& op) {
  KernelBuilder b(fmt::format("ChannelSum_{}", isa::dtype_name(s.a_type)), op, cfg);
  return ChannelSumEmitter(b, s).build();
}

ChannelSumLaunch build_channel_sum_with_epilogue(const ChannelSumSpec& s,
                                                 const ChannelEpilogueSpec& e,
                                                 const ChipConfig& cfg, const std::string& op) {
  KernelBuilder b(fmt::format("ChannelSum_{}_{}", isa::dtype_name(s.a_type), e.name), op, cfg);
  return ChannelSumEmitter(b, s).build(e);
}

std::optional<ChannelSumRow> channel_sum_row(int64_t pixels, int64_t c, int64_t elem_bytes) {
  const int64_t unit = std::max<int64_t>(8, 32 / elem_bytes);  // channels of whole blocks
  if (c % unit == 0) return ChannelSumRow{c, 0};
  const char* v = std::getenv("NPUSIM_BN_RAGGED_CHANNELS");
  if (v && std::string_view(v) == "0") return std::nullopt;
  const int64_t cp = std::lcm(c, unit);
  // (a row of cp f32 at most one repeat stride: the sums' one channel group)
  if (c % 8 != 0 || cp * 4 > kMaxRepeat * vec::kBlockBytes || pixels < cp / c) return std::nullopt;
  return ChannelSumRow{cp, c};
}

bool channel_epilogue_in_kernel(const ChipConfig& cfg) {
  static const bool enabled = [] {
    const char* v = std::getenv("NPUSIM_FUSION_CHANNEL_EPILOGUE");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  return enabled && cfg.split;
}

void append_channel_sum_epilogue(CompiledKernel& k, const std::string& op, const ChannelSumSpec& s,
                                 std::vector<ArgRef> args, ChannelEpilogueSpec e,
                                 const std::vector<ArgRef>& tail, const ChipConfig& cfg,
                                 bool in_kernel) {
  if (static_cast<int>(tail.size()) != e.vectors + e.outputs)
    throw Error(fmt::format("{}: {} arguments for an epilogue of {} vectors and {} outputs", op,
                            tail.size(), e.vectors, e.outputs));
  ChannelSumLaunch sum =
      in_kernel ? build_channel_sum_with_epilogue(s, e, cfg, op) : build_channel_sum(s, cfg, op);
  const uint64_t bytes = static_cast<uint64_t>(s.batch * sum.blocks * s.cp) * 4;
  std::vector<ArgRef> partials = {workspace_take(k, bytes)};
  if (s.plain_sum) partials.push_back(workspace_take(k, bytes));
  args.insert(args.end(), partials.begin(), partials.end());
  if (in_kernel) {
    args.insert(args.end(), tail.begin(), tail.end());
    k.launches.push_back(with_args(std::move(sum.launch), std::move(args)));
    return;
  }
  k.launches.push_back(with_args(std::move(sum.launch), std::move(args)));
  e.partial_cp = sum.partial_pitch;
  e.partial_blocks.assign(partials.size(), sum.partial_rows);
  partials.insert(partials.end(), tail.begin(), tail.end());
  k.launches.push_back(with_args(build_channel_epilogue(e, cfg, op), std::move(partials)));
}

void emit_partials_epilogue(KernelBuilder& b, ChannelEpilogueSpec e,
                            const std::vector<std::string>& partial_args, int blocks,
                            int barrier_flag, int rows_per_block) {
  if (!b.config().split)
    b.fail("a channel epilogue in the kernel needs a split chip (cross-core flags)");
  e.partial_blocks.assign(partial_args.size(), blocks * rows_per_block);
  partials_barrier(b, barrier_flag);
  // The epilogue's buffers over the kernel's (stored before the barrier; V's last use of them
  // came before its flag to MTE3, whose stores came before the barrier that MTE2's loads wait
  // for).
  const EpiloguePlan p = plan_epilogue(
      b, e, b.config().core_kind(b.vector_core_kind())->capacity(Buf::UB), blocks, true);
  Reg blk = b.reg("block");
  b.emit(Opcode::op_get_block_id, {blk});
  if (p.blocks > 1) {
    emit_epilogue_tiles(b, e, p, partial_args, &blk, true);
  } else {  // one channel tile: block 0's
    b.if_(eq(blk, 0), [&] { emit_epilogue_tiles(b, e, p, partial_args, nullptr, true); });
  }
}

ChannelEpilogueSpec rounded_sums_epilogue(const std::string& name, int64_t c, Dtype out_type) {
  ChannelEpilogueSpec e;
  e.name = name;
  e.spread = true;
  e.c = c;
  e.outputs = 1;
  e.out_type = out_type;
  e.compute = [out_type](KernelBuilder& b, const EpilogueOperands& o) {
    if (out_type == Dtype::F32) {
      f32_copy(b, o.outputs[0], o.sums[0], *o.count);
    } else {
      vec_convert(b, out_type, Dtype::F32, o.outputs[0], o.sums[0], RoundMode::kRint, *o.count);
    }
  };
  return e;
}

size_t add_stream_channel_sums(StreamSpec& spec, int64_t c, const ChannelEpilogueSpec& e,
                               bool in_kernel) {
  if (c <= 0 || c % 8 != 0)
    throw Error(
        fmt::format("{}: per-channel sums of a stream need whole 32-byte blocks of f32 "
                    "channels, got {} channels",
                    spec.kernel_name, c));
  const size_t acc = spec.temps.size();
  spec.temps.push_back(TempSpec{"channel sums", 4, 0});
  spec.accumulators.push_back(acc);
  spec.tail_args = in_kernel ? 1 + e.outputs : 1;
  spec.block_finish = [acc, c, e, in_kernel](KernelBuilder& b, const TileOperands& t, int blocks) {
    b.declare_arg("partials", Dtype::F32, {blocks, c});
    for (int i = 0; in_kernel && i < e.outputs; ++i)
      b.declare_arg(fmt::format("output{}", i), e.out_type, {});
    const uint64_t sums = t.temp.at(acc);
    {
      KernelBuilder::Origin o(b, "channel sums: the tile's rows folded");
      fold_rows_pairwise(b, sums, sums, t.tile_elems / c, c, c);
    }
    const int folded = b.flag(Pipe::V, Pipe::MTE3, "channel sums folded");
    b.set_flag(Pipe::V, Pipe::MTE3, folded);
    b.wait_flag(Pipe::V, Pipe::MTE3, folded);
    Reg dst = b.load_arg("partials"), blk = b.reg("block"), src = b.reg_imm("sums", int64_t(sums));
    b.emit(Opcode::op_get_block_id, {blk});
    b.mul_add(dst, blk, c * 4, dst);
    b.emit(Opcode::op_copy_ub2gm, {dst, src, 1, c * 4 / 32, 0, 0}, "the block's partial sums");
    if (in_kernel) {
      ChannelEpilogueSpec ek = e;
      ek.partial_cp = c;
      emit_partials_epilogue(b, ek, {"partials"}, blocks, 0);
    }
  };
  return acc;
}

int emit_channel_sum_section(KernelBuilder& b, const ChannelSumSpec& s,
                             const ChannelSumSection& sec) {
  return ChannelSumEmitter(b, s).emit_section(sec);
}

void emit_epilogue_section(KernelBuilder& b, const ChannelEpilogueSpec& e,
                           const std::vector<std::string>& partial_args, int groups,
                           const std::function<void(KernelBuilder&)>& wait) {
  if (e.vectors != 0 || partial_args.size() != e.partial_blocks.size() || groups < 1)
    b.fail("an epilogue section reads its partial sets (one argument each) and no vectors");
  const isa::CoreKind kind = b.vector_core_kind();
  const int cores = groups * b.aiv_per_aic();
  b.begin_section(kind);
  const EpiloguePlan p = plan_epilogue(b, e, b.free_bytes(Buf::UB), cores);
  for (int i = 0; i < e.outputs; ++i) b.declare_arg(fmt::format("output{}", i), e.out_type, {});
  wait(b);
  Reg core = b.reg("vector core of the launch");
  section_vector_core(b, core);
  emit_epilogue_tiles(b, e, p, partial_args, &core);
  b.end();
}

Launch build_channel_epilogue(const ChannelEpilogueSpec& s, const ChipConfig& cfg,
                              const std::string& op) {
  KernelBuilder b(s.name.empty() ? "ChannelEpilogue" : s.name, op, cfg);
  const isa::CoreKind kind = b.vector_core_kind();
  const EpiloguePlan p =
      plan_epilogue(b, s, cfg.core_kind(kind)->capacity(Buf::UB), cfg.core_kind(kind)->count);
  b.begin_section(kind);
  Launch l;
  std::vector<std::string> partial_args;
  for (size_t i = 0; i < s.partial_blocks.size(); ++i) {
    partial_args.push_back(fmt::format("partials{}", i));
    b.declare_arg(partial_args.back(), Dtype::F32, {s.batch, s.partial_blocks[i], s.partial_cp});
    l.args.push_back(ArgRef{ArgRef::Kind::kInput, static_cast<int>(i), 0});
  }
  for (int i = 0; i < s.vectors; ++i) {
    b.declare_arg(fmt::format("vector{}", i), Dtype::F32, {s.c});
    l.args.push_back(
        ArgRef{ArgRef::Kind::kInput, static_cast<int>(s.partial_blocks.size()) + i, 0});
  }
  for (int i = 0; i < s.outputs; ++i) {
    b.declare_arg(fmt::format("output{}", i), s.out_type, {});
    l.args.push_back(ArgRef{ArgRef::Kind::kOutput, i, 0});
  }
  std::optional<Reg> blk;  // spread: which tiles are this block's
  if (p.blocks > 1) {
    blk.emplace(b.reg("block"));
    b.emit(Opcode::op_get_block_id, {*blk});
  }
  emit_epilogue_tiles(b, s, p, partial_args, blk ? &*blk : nullptr);
  b.end();
  l.kernel = b.finish();
  l.block_dim = p.blocks;
  l.summary = fmt::format("{}: {} channels x {} items, tiles of {}", s.name, s.c, s.batch, p.ct);
  return l;
}

}  // namespace npusim::compiler::ops
