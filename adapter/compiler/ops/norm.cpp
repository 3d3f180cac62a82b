// RmsNorm (CANN's op type; keras-hub's Llama / Gemma layer norm without centering):
//
//   y = x * rsqrt(mean(x^2 over the last axis) + epsilon) * gamma
//
// inputs x [..., H] (f32, f16 or bf16) and gamma [H] of x's dtype or f32; attribute epsilon (float,
// default 1e-6); output y of x's shape and dtype. CANN's RmsNorm also returns rstd; this one
// returns y only (what a decoder's forward pass consumes).
//
// One row kernel (ops/row_kernel.h): rows of H resident in the UB in groups, double-buffered;
// per group: widen to f32, squares, per-row sums (lane accumulator or span sums: row_sums_by_span),
// r = rsqrt(sum / H + eps) per row, x * r (one value per row replicated onto its lanes), * gamma
// (an f32 row built once, read with a repeat stride of 0 for every row), rounded once to the
// output type. Per-row operands go one instruction per span or per row (rows_apply_by_row).
//
// Numerics against keras-hub (which casts to f32, computes the same formula and casts back): the
// sum of squares is two nested sequential f32 sums (64 lanes and H / 64 spans, in either nesting:
// row_sums_by_span), vrsqrt is the f32 reciprocal square root; the result is rounded once.
//
// LayerNorm (CANN's op type; GPT-2's keras LayerNormalization over the last axis):
//
//   y = (x - mean) * rsqrt(mean((x - mean)^2) + epsilon) * gamma + beta
//
// inputs x [..., H], gamma and beta [H] of x's dtype or f32 (both one type); attribute epsilon
// (default 1e-5); output y. CANN's LayerNorm also returns mean and variance (and takes
// begin_norm_axis / begin_params_axis): this one normalises over the last axis and returns y only.
// The same row kernel as RmsNorm's with two more steps: per-row sums of x first, x - sum / H
// replicated onto the row's lanes (into a second buffer), and + beta (a resident f32 row as
// gamma) at the end.
// The variance is that of the centred values, as TensorFlow's SquaredDifference(x, mean) gives it.
//
// LayerNorm in training (CANN's op types; the TF plugin's rewrite 12b makes them):
//
//   LayerNormV3(x, gamma, beta; epsilon) -> y, mean, rstd: LayerNorm's kernel, which also copies
//     each row's mean and rsqrt(variance + epsilon) (f32, of x's shape with the last dimension
//     1) to output buffers and stores them with y (one launch).
//   LayerNormXBackpropV2(dy, x, rstd, mean, gamma) -> pd_x, res_for_gamma: a row kernel of the
//     same skeleton; per group of rows xhat = (x - mean) * rstd (stored as res_for_gamma, f32),
//     g = dy * gamma, the rows' means of g and of g * xhat (lane accumulator), and
//     pd_x = rstd * (g - mean(g) - xhat * mean(g * xhat)), rounded once to T. CANN's V2 takes
//     the variance; this one LayerNormV3's rstd, so the forward's rsqrt is not recomputed.
//   LayerNormBetaGammaBackpropV2(dy, res_for_gamma) -> pd_gamma, pd_beta (f32 [H]): the
//     column sums of dy * res_for_gamma and of dy, as ops/channel.h's per-channel sums (rows
//     as pixels) and their epilogue (two launches; the order of the additions: channel.h).
//
// Supported: H a multiple of 16 (each row a whole number of 32-byte blocks in every dtype, so
// a super-row is one row); otherwise a CompileError.
#include <fmt/format.h>

#include "adapter/compiler/buffer_plan.h"
#include "adapter/compiler/ops/channel.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/row_kernel.h"
#include "adapter/compiler/ops/vector_rows.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

constexpr int64_t kRowMultiple = 16;

struct NormBuffers {
  BufferPlan plan;
  BufferPlan::Id raw_x, xw, out, sq, acc, acc2, r, rep, scratch, alt, gamma_raw, gamma, beta_raw,
      beta, mean, mean_out, rstd_out, wide, gamma_rows, beta_rows, mean_staged, rstd_staged;
};

// The UB's bank windows (ub_banks x ub_bank_width_bytes bytes, one 256-byte repeat of 4-byte
// lanes per window): two operands of a vector instruction starting in the same window take
// turns in its banks on every repeat (a row of H a multiple of 512 f32 lanes is a whole number
// of windows, so every row of a buffer starts in the buffer's window). Buffer k of `ids` is
// placed in window k modulo the window count, so the row operands one instruction reads and
// writes together start in different windows; no placement without a bank model.
void place_in_windows(BufferPlan& p, const ChipConfig& cfg,
                      std::initializer_list<BufferPlan::Id> ids, uint64_t first_window = 0) {
  const uint64_t span = static_cast<uint64_t>(std::max(0, cfg.ub_banks)) *
                        static_cast<uint64_t>(std::max(0, cfg.ub_bank_width_bytes));
  const uint64_t windows = span % kSlotBytes == 0 ? span / kSlotBytes : 0;
  if (windows < 2) return;
  uint64_t w = first_window;
  for (BufferPlan::Id id : ids) p.place(id, span, w++ % windows * kSlotBytes);
}

// Staged statistics' sizes at groups of G rows: the values of up to G + 7 rows in whole blocks,
// and a block per row of them with the 7 blocks a repeat of 64 lanes reads past the last.
uint64_t staged_values_bytes(int64_t G) {
  return static_cast<uint64_t>(rnd((G + kBlockLanes32 - 1) * kLaneBytes));
}
uint64_t staged_bytes(int64_t G) {
  return static_cast<uint64_t>((G + 2 * (kBlockLanes32 - 1)) * kBlock);
}

// Units: rows per group. center: LayerNorm's beta rows too; stats: LayerNormV3's per-row mean
// and rstd (a copy of the mean, and both outputs double-buffered); param_rows: gamma (and beta)
// copied to every row of a group, so that * gamma and + beta are one instruction each; staged:
// the statistics gathered into whole 8-row blocks across groups (RmsNormEmitter::stage_rows): a
// block per row for up to G + 7 rows (and 7 blocks a 64-lane repeat reads past them), and output
// copies of the whole blocks those rows cover.
NormBuffers norm_buffers(int64_t H, Dtype t, Dtype pt, bool center, bool stats,
                         const ChipConfig& cfg, bool param_rows, bool staged) {
  NormBuffers n;
  BufferPlan& p = n.plan;
  const int64_t sz = isa::dtype_size(t), psz = isa::dtype_size(pt);
  const bool conv = t != Dtype::F32, pconv = pt != Dtype::F32;
  n.raw_x = p.add_sized("x rows", blocks_of(H * sz), 2);
  n.xw = p.add_sized("x rows (f32)", blocks_of(H * kLaneBytes), 1, conv);
  n.out = p.add_sized("y rows", blocks_of(H * sz), 2);
  n.sq = p.add_sized("squares / f32 result", blocks_of(H * kLaneBytes));
  n.acc = p.add_sized("lane slots", blocks_of(kSlotBytes));
  n.acc2 = p.add_sized("lane slots (alternate)", blocks_of(kSlotBytes));
  n.r = p.add_sized("row factor", blocks_of(kLaneBytes));
  n.rep = p.add_sized("replicated", replicated_bytes);
  n.wide = p.add_sized("replicated (a repeat per row)", widened_bytes);
  n.scratch = p.add_sized("replicate scratch", replicate_scratch_bytes);
  n.alt = p.add_sized("alternating pattern", alt_pattern_bytes);
  n.gamma_raw = p.add_fixed("gamma", static_cast<uint64_t>(rnd(H * psz)), 1, pconv);
  n.gamma = p.add_fixed("gamma (f32)", static_cast<uint64_t>(rnd(H * kLaneBytes)));
  n.beta_raw = p.add_fixed("beta", static_cast<uint64_t>(rnd(H * psz)), 1, pconv && center);
  n.beta = p.add_fixed("beta (f32)", static_cast<uint64_t>(rnd(H * kLaneBytes)), 1, center);
  n.mean = p.add_sized("row means", blocks_of(kLaneBytes), 1, stats && !staged);
  const BufferPlan::SizeFn out_bytes = staged ? staged_values_bytes : blocks_of(kLaneBytes);
  n.mean_out = p.add_sized("mean out", out_bytes, 2, stats);
  n.rstd_out = p.add_sized("rstd out", out_bytes, 2, stats);
  n.mean_staged = p.add_sized("means (a block per row, staged)", staged_bytes, 1, stats && staged);
  n.rstd_staged = p.add_sized("rstd (a block per row, staged)", staged_bytes, 1, stats && staged);
  n.gamma_rows = p.add_sized("gamma (f32, every row)", blocks_of(H * kLaneBytes), 1, param_rows);
  n.beta_rows =
      p.add_sized("beta (f32, every row)", blocks_of(H * kLaneBytes), 1, param_rows && center);
  place_in_windows(p, cfg, {n.raw_x, n.xw, n.sq, n.out, n.gamma, n.beta, n.acc, n.acc2});
  // Away from the row buffers' windows and from their own sources' (gamma's 4, beta's 5): in
  // beta's and gamma's.
  place_in_windows(p, cfg, {n.gamma_rows, n.beta_rows}, 5);
  declare_repeat_overhang(p);
  return n;
}

// Rows per resident group of a row kernel of `plan`'s buffers: whole 8-row blocks where they
// fit; long rows (Llama's H = 2048 and up in f16 / bf16: 32 KiB of buffers per row) in groups of
// fewer rows, down to one; a row of H that does not fit the UB is an error.
int64_t fit_group_rows(const BufferPlan& plan, const ChipConfig& cfg, const VectorCores& cores,
                       const BlockSplit& split) {
  const int64_t G = plan.fit(cfg, cores.kind, kBlockLanes32,
                             std::min(kMaxGroupRows / kBlockLanes32 * kBlockLanes32, split.per));
  return G != 0 ? G : plan.fit(cfg, cores.kind, 1, kBlockLanes32);
}
int64_t group_rows(const BufferPlan& plan, const ChipConfig& cfg, const VectorCores& cores,
                   const BlockSplit& split, KernelBuilder& b, int64_t H) {
  const int64_t G = fit_group_rows(plan, cfg, cores, split);
  if (G == 0) b.fail(fmt::format("a row of {} does not fit the UB", H));
  return G;
}

// gamma (beta) [H] of type t at GM `src` -> the resident f32 row `row` (through `raw` unless t
// is f32), once, single-buffered: MTE2 then V.
void load_param_row(KernelBuilder& b, Dtype t, int64_t H, const Reg& src, uint64_t raw,
                    uint64_t row, const char* name) {
  KernelBuilder::Origin o(b, fmt::format("{} (f32, resident)", name));
  const int64_t sz = isa::dtype_size(t);
  const uint64_t dst = t == Dtype::F32 ? row : raw;
  b.emit(Opcode::op_copy_gm2ub, {dst, src, 1, rnd(H * sz) / kBlock, 0, 0}, name);
  const int id = b.flag(isa::Pipe::MTE2, isa::Pipe::V, fmt::format("{} loaded", name));
  b.set_flag(isa::Pipe::MTE2, isa::Pipe::V, id);
  b.wait_flag(isa::Pipe::MTE2, isa::Pipe::V, id);
  if (t != Dtype::F32) {
    Reg n = b.reg_imm("H", H);
    vec_convert(b, Dtype::F32, t, row, raw, RoundMode::kRint, n);
  }
}

// Stores `rows` (a register) 4-byte values per row from UB `src` to GM `base` + first * 4, in
// whole 32-byte blocks: `first` a multiple of 8 (a block's first row), and the rows past the
// last whole block this core's to write (or past the tensor's end, inside its last block).
void store_row_values(KernelBuilder& b, const Reg& base, const Reg& first, const Reg& rows,
                      uint64_t src, const char* what) {
  Reg dst = b.reg("destination"), blocks = b.reg("blocks");
  b.mul_add(dst, first, kLaneBytes, base);
  count_blocks(b, blocks, rows, kLaneBytes);
  b.emit(Opcode::op_copy_ub2gm, {dst, src, 1, blocks, 0, 0}, what);
}

// The group's rows at dst.x (f32, H lanes each) = op(the rows at src, the resident f32 row
// param [H], read with a repeat stride of 0): per 64-lane span of the row, all rows at once (a
// row stride of at most 255 blocks), else row by row.
void apply_param_row(KernelBuilder& b, const RowGroup& dst, int64_t H, Opcode op, uint64_t src,
                     uint64_t param) {
  for_superrow_batches(b, dst, [&](const Reg& first, Opnd count, int64_t row_rep) {
    Reg da = b.reg("result span"), sa = b.reg("row span");
    for (int64_t c = 0; c * kLanes32 < H; ++c) {
      set_mask_lanes(b, lane_range(0, std::min<int64_t>(kLanes32, H - c * kLanes32)));
      const int64_t off = c * kSlotBytes;
      b.mul_add(da, first, H * kLaneBytes, static_cast<int64_t>(dst.x) + off);
      b.mul_add(sa, first, H * kLaneBytes, static_cast<int64_t>(src) + off);
      vec_binary_strided(b, op, Dtype::F32, VOperand(da, 1, row_rep), VOperand(sa, 1, row_rep),
                         VOperand(static_cast<int64_t>(param) + off, 1, 0), count);
    }
  });
}

// A per-row operand of rows_apply: the row's value as a 256-byte repeat (widen_rows' wide
// buffer: row_bytes 256, read with a repeat stride of 0 on every repeat of the row) or a
// resident f32 row of H lanes (gamma, beta: row_bytes 0, a repeat stride of one repeat).
struct RowOperand {
  uint64_t addr = 0;
  int64_t row_bytes = 0;   // bytes from one row's operand to the next
  int64_t rep_blocks = 0;  // repeat stride in 32-byte blocks
};
RowOperand row_value_repeats(uint64_t wide) { return {wide, kSlotBytes, 0}; }
RowOperand param_row(uint64_t row) { return {row, 0, kSlotBytes / kBlock}; }

// dst row r = op(src row r, operand of row r), f32, for the group's rows (rows of H lanes, H * 4
// bytes apart; dst and src any UB addresses): one instruction per row over its H lanes (counter
// mode: ceil(H / 64) repeats), rows in a run-time loop. The same lanes, operands and operation
// as the per-span form (rows_bcast_into, apply_param_row: one instruction per 64-lane span with a
// repeat per row), so the same results; the instructions are fewer and longer where a group has
// fewer rows than a row has spans (rows_apply_by_row): each instruction pays the vector latency
// once, so per-row costs rows x (latency + spans) cycles against spans x (latency + rows).
void rows_apply(KernelBuilder& b, const Reg& rows, int64_t H, Opcode op, uint64_t dst, uint64_t src,
                const RowOperand& v) {
  KernelBuilder::Origin o(b, fmt::format("per-row operand applied to each row, one instruction "
                                         "per row ({})",
                                         isa::describe(op).mnemonic));
  const int64_t row_bytes = H * kLaneBytes;
  constexpr int64_t kRepBlocks = kSlotBytes / kBlock;
  b.emit(Opcode::op_set_mask_count, {H});
  Reg r = b.reg("row"), da = b.reg("destination row"), sa = b.reg("source row"),
      va = b.reg_imm("operand row", static_cast<int64_t>(v.addr));
  b.for_range(r, 0, rows, 1, [&] {
    b.mul_add(da, r, row_bytes, static_cast<int64_t>(dst));
    b.mul_add(sa, r, row_bytes, static_cast<int64_t>(src));
    if (v.row_bytes != 0) b.mul_add(va, r, v.row_bytes, static_cast<int64_t>(v.addr));
    b.emit(op, {Dtype::F32, da, sa, va, 0, 1, 1, 1, kRepBlocks, kRepBlocks, v.rep_blocks});
  });
}

// Whether rows_apply beats the per-span form for groups of up to G rows of H lanes: fewer rows
// than 64-lane spans (the cost comparison above, whatever the latency).
bool rows_apply_by_row(int64_t G, int64_t H) { return G < ceil_div(H, kLanes32); }

// Per-row sums of f32 rows of H lanes, two ways:
//   lane slots (rows_to_lanes_alternating, then lanes_reduce): each row's 64-lane spans added
//     lane-wise in span order into its slot (an instruction per span, a repeat per row), then
//     each slot's 64 lanes in lane order (vcadd);
//   span sums (row_sums_by_span): each span's 64 lanes in lane order (one vcadd over the group,
//     a repeat per span), then each row's S = H / 64 span sums in span order (vcadd, a repeat
//     per row).
// Both sum each row in f32 as two nested sequential sums of 64 and S terms (in the other
// nesting), so the same error bound (about (64 + S) ulps of the sum of magnitudes); the results
// differ in the last bits. The span sums need rows of whole spans whose S sums are whole 32-byte
// blocks (H a multiple of 512, at most 4096: one repeat of sums per row).
bool span_sums_fit(int64_t H) {
  return H % (kLanes32 * kBlockLanes32) == 0 && H <= kLanes32 * kLanes32;
}

// Whether the span sums issue fewer vector cycles than the lane slots for groups of G rows of H
// lanes, at the chip's vector latency L and reduction factor f (cycles per repeat of vcadd):
// lane slots (L + G) (fill) + S (L + G) + (L + f G); span sums (L + f G S) + (L + f G).
bool row_sums_by_span(int64_t G, int64_t H, const ChipConfig& cfg) {
  if (!span_sums_fit(H)) return false;
  const int64_t S = H / kLanes32, L = std::max(0, cfg.vector_latency_cycles),
                f = std::max(1, cfg.vector_reduce_factor);
  return L + f * G * S < (S + 1) * (L + G);
}

// dense[r] = the sum of row r's H lanes at src (f32, rows H * 4 bytes apart), r < rows, by the
// span sums; partials: rows * H / 16 bytes (the S sums of each row).
void row_sums_of_spans(KernelBuilder& b, const Reg& rows, int64_t H, uint64_t src,
                       uint64_t partials, uint64_t dense) {
  KernelBuilder::Origin o(b, "row sums: 64-lane spans -> span sums -> one value per row");
  const int64_t S = H / kLanes32;
  Reg lanes = b.reg("lanes of the group");
  b.mul(lanes, rows, H);
  b.emit(Opcode::op_set_mask_count, {lanes});
  vec_reduce_strided(b, Opcode::op_vcadd, Dtype::F32, partials, VOperand(src), 0);
  set_mask_lanes(b, lane_range(0, S));
  vec_reduce_strided(b, Opcode::op_vcadd, Dtype::F32, dense,
                     VOperand(partials, 1, S * kLaneBytes / kBlock), rows);
}

// Whether gamma (beta) on every row of a group pays, at the chip's vector latency L (bank
// conflicts left out): per group, one instruction of G x H lanes (L + G S cycles) instead of G
// (L + S) or S (L + G) (rows_apply_by_row), over a block's `groups` groups, against the G copies
// of the row (G (L + S)) made once.
bool param_rows_pay(int64_t G, int64_t H, int64_t groups, const ChipConfig& cfg) {
  const int64_t S = ceil_div(H, kLanes32), L = std::max(0, cfg.vector_latency_cycles);
  const int64_t apart = rows_apply_by_row(G, H) ? G * (L + S) : S * (L + G);
  return groups * (apart - (L + G * S)) > G * (L + S);
}

// The resident f32 row `row` [H] copied to `rows` rows at dst (H * 4 bytes apart), once: one
// vcopy per row in a run-time loop.
void copy_to_rows(KernelBuilder& b, int64_t rows, int64_t H, uint64_t row, uint64_t dst,
                  const char* name) {
  KernelBuilder::Origin o(b, fmt::format("{} (f32) on every row of a group", name));
  b.emit(Opcode::op_set_mask_count, {H});
  Reg r = b.reg("row"), da = b.reg("destination row");
  b.for_range(r, 0, rows, 1, [&] {
    b.mul_add(da, r, H * kLaneBytes, static_cast<int64_t>(dst));
    b.emit(Opcode::op_vcopy, {Dtype::S32, da, static_cast<int64_t>(row), 0, 1, 1, 8, 8});
  });
}

// The forward kernels: RmsNorm's, LayerNorm's (x centred first, + beta last) and LayerNormV3's
// (LayerNorm's, also storing each row's mean and rstd).
enum class NormKind { kRms, kLayer, kLayerStats };

const char* norm_op_name(NormKind kind) {
  switch (kind) {
    case NormKind::kRms: return "RmsNorm";
    case NormKind::kLayer: return "LayerNorm";
    case NormKind::kLayerStats: return "LayerNormV3";
  }
  return "";
}

class RmsNormEmitter {
 public:
  // pt: gamma's (and beta's) type, t's or f32 (converted to a resident f32 row either way).
  RmsNormEmitter(const OpDesc& op, const ChipConfig& cfg, int64_t rows, int64_t H, Dtype t,
                 Dtype pt, double eps, NormKind kind)
      : m_k(norm_op_name(kind) + std::string("_") + isa::dtype_name(t), op.str(), cfg),
        m_kind(kind),
        m_center(kind != NormKind::kRms),
        m_stats(kind == NormKind::kLayerStats),
        m_b(m_k.b()),
        m_rows(rows),
        m_h(H),
        m_t(t),
        m_pt(pt),
        m_eps(eps),
        m_layout(SuperRowLayout::make(H, kBlock / isa::dtype_size(t))) {}

  Launch build(const ChipConfig& cfg) {
    const VectorCores cores = VectorCores::of(cfg);
    NormBuffers bufs = norm_buffers(m_h, m_t, m_pt, m_center, m_stats, cfg, false, false);
    // Blocks of whole 8-row blocks: a block's rows start on a 32-byte block of mean and rstd.
    const BlockSplit split = BlockSplit::make(m_rows, cores.count, kBlockLanes32);
    int64_t G = group_rows(bufs.plan, cfg, cores, split, m_b, m_h);
    // Groups of fewer rows than a block of mean / rstd: the statistics staged (the buffers for
    // it, and the group size refitted with them).
    m_staged = m_stats && G % kBlockLanes32 != 0;
    if (m_staged) {
      bufs = norm_buffers(m_h, m_t, m_pt, m_center, m_stats, cfg, false, true);
      G = group_rows(bufs.plan, cfg, cores, split, m_b, m_h);
    }
    // gamma and beta on every row of a group where that leaves the group size as it is and saves
    // more vector cycles over a block's groups than the copies cost (param_rows_pay).
    NormBuffers with_rows = norm_buffers(m_h, m_t, m_pt, m_center, m_stats, cfg, true, m_staged);
    m_param_rows = fit_group_rows(with_rows.plan, cfg, cores, split) == G &&
                   param_rows_pay(G, m_h, ceil_div(split.per, G), cfg);
    if (m_param_rows) bufs = std::move(with_rows);
    m_group = G;
    m_by_row = rows_apply_by_row(G, m_h);
    m_span_sums = row_sums_by_span(G, m_h, cfg);
    m_k.arg("x", m_t, {m_rows, m_h}, ArgRef{ArgRef::Kind::kInput, 0, 0});
    m_k.arg("gamma", m_pt, {m_h}, ArgRef{ArgRef::Kind::kInput, 1, 0});
    if (m_center) m_k.arg("beta", m_pt, {m_h}, ArgRef{ArgRef::Kind::kInput, 2, 0});
    m_k.arg("y", m_t, {m_rows, m_h}, ArgRef{ArgRef::Kind::kOutput, 0, 0});
    if (m_stats) {
      m_k.arg("mean", Dtype::F32, {m_rows}, ArgRef{ArgRef::Kind::kOutput, 1, 0});
      m_k.arg("rstd", Dtype::F32, {m_rows}, ArgRef{ArgRef::Kind::kOutput, 2, 0});
    }
    std::vector<Reg> args = m_k.load_args();
    m_x = std::move(args[0]);
    m_y = std::move(args[m_center ? 3 : 2]);
    if (m_stats) {
      m_mean_gm = std::move(args[4]);
      m_rstd_gm = std::move(args[5]);
    }
    const BufferPlan::Placed at = m_k.allocate(bufs.plan, G);
    take_twins(at, {{&m_raw_x, bufs.raw_x}, {&m_out, bufs.out}});
    if (m_stats) {
      take_twins(at, {{&m_mean_out, bufs.mean_out}, {&m_rstd_out, bufs.rstd_out}});
      m_mean = at[bufs.mean];
      if (m_staged) {
        m_mean_staged = at[bufs.mean_staged];
        m_rstd_staged = at[bufs.rstd_staged];
      }
    }
    take_buffers(at, {{&m_xw, bufs.xw},
                      {&m_sq, bufs.sq},
                      {&m_acc, bufs.acc},
                      {&m_acc2, bufs.acc2},
                      {&m_r, bufs.r},
                      {&m_rep, bufs.rep},
                      {&m_wide, bufs.wide},
                      {&m_scratch, bufs.scratch},
                      {&m_alt, bufs.alt},
                      {&m_gamma, bufs.gamma}});
    load_param_row(m_b, m_pt, m_h, args[1], at[bufs.gamma_raw], m_gamma, "gamma");
    if (m_center) {
      m_beta = at[bufs.beta];
      load_param_row(m_b, m_pt, m_h, args[2], at[bufs.beta_raw], m_beta, "beta");
    }
    if (m_param_rows) {
      m_gamma_rows = at[bufs.gamma_rows];
      copy_to_rows(m_b, G, m_h, m_gamma, m_gamma_rows, "gamma");
      if (m_center) {
        m_beta_rows = at[bufs.beta_rows];
        copy_to_rows(m_b, G, m_h, m_beta, m_beta_rows, "beta");
      }
    }
    fill_alt_pattern(m_b, m_alt, G);
    m_k.start_pingpong();
    m_k.resident_groups(
        split, m_rows, G, m_layout, [this](const GroupRegs& g, int q) { load(g, q); },
        [this](const GroupRegs& g, int q) { compute(g, q); });
    return m_k.finish(split.block_dim,
                      fmt::format("{}: {} rows of {} {}, {} blocks of {} rows, groups of {}",
                                  norm_op_name(m_kind), m_rows, m_h, isa::dtype_name(m_t),
                                  split.block_dim, split.per, G));
  }

 private:
  void load(const GroupRegs& g, int q) {
    KernelBuilder& b = m_b;
    const int64_t sz = isa::dtype_size(m_t);
    m_k.sync().wait_load_free(q);
    Reg src = b.reg("source"), blocks = b.reg("blocks");
    count_blocks(b, blocks, g.rows, m_h * sz);
    b.mul_add(src, g.r, m_h * sz, m_x);
    b.emit(Opcode::op_copy_gm2ub, {m_raw_x[q], src, 1, blocks, 0, 0}, "x rows");
    m_k.sync().load_done(q);
  }

  // Every step writes the other of two f32 row buffers than it reads (a = x's f32 rows, b =
  // m_sq), never in place: an in-place step is two accesses per bank and repeat in the UB bank
  // model, and a and b start in different bank windows (norm_buffers). With an f32 x, a is the
  // load buffer itself, released only when y has left it.
  void compute(const GroupRegs& g, int q) {
    KernelBuilder& b = m_b;
    PingPong& sync = m_k.sync();
    const bool conv = m_t != Dtype::F32;
    uint64_t cur = conv ? m_xw : m_raw_x[q], other = m_sq;
    const auto rows_of = [&](uint64_t buf) {
      return RowGroup{&m_layout, buf, &g.supers, &g.slots};
    };
    Reg lanes = b.reg("lanes of the group");
    b.mul(lanes, g.rows, m_h);
    // Staged statistics: the rows of the group's 8-row block staged before it, and with it.
    Reg lead = b.reg("staged rows before the group"), staged = b.reg("staged rows");
    if (m_staged) {
      b.and_(lead, g.r, kBlockLanes32 - 1);
      b.add(staged, lead, g.rows);
    }
    sync.wait_loaded(q);
    if (conv) {
      vec_convert(b, Dtype::F32, m_t, cur, m_raw_x[q], RoundMode::kRint, lanes);
      sync.release_load(q);
    }
    if (m_center) {
      // x - sum(x) / H per row (the centred rows, into the other buffer).
      row_sums(g, cur, m_r);
      Reg inv_h = b.reg_imm("1/H", vector_scalar_bits(Dtype::F32, 1.0 / static_cast<double>(m_h)));
      vec_scalar(b, Opcode::op_vmuls, Dtype::F32, m_r, m_r, inv_h, g.rows);
      if (m_stats && !m_staged) vec_copy_bits(b, kLaneBytes, m_mean, m_r, g.rows);
      apply_row_values(g, Opcode::op_vsub, cur, m_r, other);
      if (m_staged) stage_rows(g, lead, m_mean_staged);
      std::swap(cur, other);
    }
    // r = rsqrt(sum(x^2) / H + eps) per row (the squares in the other buffer).
    vec_binary(b, Opcode::op_vmul, Dtype::F32, other, cur, cur, lanes);
    row_sums(g, other, m_r);
    {
      Reg inv_h = b.reg_imm("1/H", vector_scalar_bits(Dtype::F32, 1.0 / static_cast<double>(m_h)));
      Reg eps = b.reg_imm("epsilon", vector_scalar_bits(Dtype::F32, m_eps));
      vec_scalar(b, Opcode::op_vmuls, Dtype::F32, m_r, m_r, inv_h, g.rows);
      vec_scalar(b, Opcode::op_vadds, Dtype::F32, m_r, m_r, eps, g.rows);
      vec_unary(b, Opcode::op_vrsqrt, Dtype::F32, m_r, m_r, g.rows);
    }
    // y = x * r * gamma (+ beta), f32, each product into the other buffer.
    apply_row_values(g, Opcode::op_vmul, cur, m_r, other);
    if (m_staged) stage_rows(g, lead, m_rstd_staged);
    std::swap(cur, other);
    // * gamma (+ beta), into the other buffer.
    const auto apply_param = [&](Opcode op, uint64_t param) {
      if (m_param_rows)
        vec_binary(b, op, Dtype::F32, other, cur, param == m_gamma ? m_gamma_rows : m_beta_rows,
                   lanes);
      else if (m_by_row)
        rows_apply(b, g.rows, m_h, op, other, cur, param_row(param));
      else
        apply_param_row(b, rows_of(other), m_h, op, cur, param);
      std::swap(cur, other);
    };
    apply_param(Opcode::op_vmul, m_gamma);
    if (m_center) apply_param(Opcode::op_vadd, m_beta);
    sync.wait_out_free(q);
    if (conv)
      vec_convert(b, m_t, Dtype::F32, m_out[q], cur, RoundMode::kRint, lanes);
    else
      vec_copy_bits(b, kLaneBytes, m_out[q], cur, lanes);
    if (!conv) sync.release_load(q);
    if (m_staged) {
      gather_staged(staged, m_mean_staged, m_mean_out[q]);
      gather_staged(staged, m_rstd_staged, m_rstd_out[q]);
    } else if (m_stats) {
      vec_copy_bits(b, kLaneBytes, m_mean_out[q], m_mean, g.rows);
      vec_copy_bits(b, kLaneBytes, m_rstd_out[q], m_r, g.rows);
    }
    sync.out_ready(q);
    {
      const int64_t sz = isa::dtype_size(m_t);
      Reg dst = b.reg("destination"), blocks = b.reg("blocks");
      b.mul_add(dst, g.r, m_h * sz, m_y);
      count_blocks(b, blocks, g.rows, m_h * sz);
      b.emit(Opcode::op_copy_ub2gm, {dst, m_out[q], 1, blocks, 0, 0}, "y rows");
    }
    if (m_staged) {
      Reg first = b.reg("first staged row");
      b.sub(first, g.r, lead);
      store_row_values(b, m_mean_gm, first, staged, m_mean_out[q], "mean");
      store_row_values(b, m_rstd_gm, first, staged, m_rstd_out[q], "rstd");
    } else if (m_stats) {
      store_row_values(b, m_mean_gm, g.r, g.rows, m_mean_out[q], "mean");
      store_row_values(b, m_rstd_gm, g.r, g.rows, m_rstd_out[q], "rstd");
    }
    sync.stored(q);
  }

  // Groups of fewer rows than a 32-byte block of statistics (G % 8 != 0): each group's mean and
  // rstd join the rows staged before it in its 8-row block, a block per row at `stage` (from row
  // `lead` = r mod 8: a block range starts on a whole block, so the staged rows are the block's
  // rows before r, none at a range's start). stage_rows copies the group's rows there from
  // replicate()'s blocks (m_rep, right after the value was replicated for its row step);
  // gather_staged makes out (dense, one f32 per row) of the `staged` = lead + rows staged rows,
  // each block's first lane taken by a vcadd of one active lane (0 + x: the value, but -0.0
  // reads +0.0), and moves the rows of the last, partial block (staged mod 8) to the stage's
  // start. The store (whole blocks from the block's first row) then holds the group's rows and,
  // before them, rows already stored with the same values, and ends at the group's end rounded up
  // to a block: inside the block range (a multiple of 8 rows) but at the tensor's end, whose last
  // block is written whole (the output buffer's 32-byte granule).
  void stage_rows(const GroupRegs& g, const Reg& lead, uint64_t stage) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "per-row statistic staged (a block per row)");
    Reg at = b.reg("staged row"), lanes = b.reg("lanes");
    b.mul_add(at, lead, kBlock, static_cast<int64_t>(stage));
    b.mul(lanes, g.rows, kBlockLanes32);
    vec_copy_bits(b, kLaneBytes, at, m_rep, lanes);
  }
  void gather_staged(const Reg& staged, uint64_t stage, uint64_t out) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "staged statistic: whole blocks of rows, the partial one kept");
    set_mask_lanes(b, lane_range(0, 1));
    vec_reduce_strided(b, Opcode::op_vcadd, Dtype::F32, out,
                       VOperand(static_cast<int64_t>(stage), 1, 1), staged);
    Reg keep = b.reg("rows of the partial block"), from = b.reg("first row of it");
    b.and_(keep, staged, kBlockLanes32 - 1);
    b.sub(from, staged, keep);
    b.if_(ne(from, 0), [&] {
      b.if_(ne(keep, 0), [&] {
        Reg at = b.reg("partial block's row"), lanes = b.reg("lanes");
        b.mul_add(at, from, kBlock, static_cast<int64_t>(stage));
        b.mul(lanes, keep, kBlockLanes32);
        vec_copy_bits(b, kLaneBytes, static_cast<int64_t>(stage), at, lanes);
      });
    });
  }

  // dense[r] = the sum of row r of the group's f32 rows at src (read only): span sums or lane
  // slots (row_sums_by_span); the slots' buffers hold the span sums.
  void row_sums(const GroupRegs& g, uint64_t src, uint64_t dense) {
    if (m_span_sums) {
      row_sums_of_spans(m_b, g.rows, m_h, src, m_acc, dense);
      return;
    }
    const RowGroup rows{&m_layout, src, &g.supers, &g.slots};
    const uint64_t sums =
        rows_to_lanes_alternating(m_b, rows, Combine::kSum, Dtype::F32, m_acc, m_acc2);
    lanes_reduce(m_b, Combine::kSum, Dtype::F32, sums, g.rows, dense, 0);
  }
  // Rows of more than one repeat read their row value from a repeat per row (widen_rows).
  bool wide() const { return m_h > kLanes32; }
  // The group's per-row values at `dense` replicated for rows_bcast: m_rep, or m_wide if wide().
  uint64_t replicate(const GroupRegs& g, uint64_t dense) {
    replicate_rows(m_b, dense, g.rows, m_rep, m_scratch, m_alt);
    if (!wide()) return m_rep;
    widen_rows_grouped(m_b, m_rep, g.rows, m_wide, m_group);
    return m_wide;
  }
  // dst rows = op(src rows, the row's value at dense[row]), f32: one instruction per row
  // (rows_apply) or per span (rows_bcast_into), whichever issues fewer cycles at this group size.
  void apply_row_values(const GroupRegs& g, Opcode op, uint64_t src, uint64_t dense, uint64_t dst) {
    const uint64_t rep = replicate(g, dense);
    const RowGroup rows{&m_layout, src, &g.supers, &g.slots};
    if (m_by_row)
      rows_apply(m_b, g.rows, m_h, op, dst, src, row_value_repeats(rep));
    else
      rows_bcast_into(m_b, rows, op, Dtype::F32, rep, false, dst, wide());
  }

  RowKernel m_k;
  NormKind m_kind;
  bool m_center, m_stats;
  int64_t m_group = 0;        // rows per group (G)
  bool m_by_row = false;      // rows_apply_by_row at this kernel's group size
  bool m_span_sums = false;   // row_sums_by_span at this kernel's group size
  bool m_param_rows = false;  // gamma (beta) copied to every row of a group
  bool m_staged = false;      // mean and rstd staged into whole blocks (stage_row_values)
  uint64_t m_gamma_rows = 0, m_beta_rows = 0, m_mean_staged = 0, m_rstd_staged = 0;
  KernelBuilder& m_b;
  int64_t m_rows, m_h;
  Dtype m_t, m_pt;
  double m_eps;
  SuperRowLayout m_layout;
  Reg m_x, m_y, m_mean_gm, m_rstd_gm;
  Twin m_raw_x, m_out, m_mean_out, m_rstd_out;
  uint64_t m_xw = 0, m_sq = 0, m_acc = 0, m_acc2 = 0, m_r = 0, m_rep = 0, m_wide = 0, m_scratch = 0,
           m_alt = 0, m_gamma = 0, m_beta = 0, m_mean = 0;
};

// LayerNormXBackpropV2's buffers; units: rows per group. staged_rows > 0: groups starting inside
// the statistics' last 32-byte granule load it whole (the rows of it before the group loaded and
// replicated too): staged_rows, the rows of that granule (1 to 8).
struct GradBuffers {
  BufferPlan plan;
  BufferPlan::Id raw_x, raw_dy, mean_in, rstd_in, xw, dyw, g, sq, acc, acc2, s1, s2, rep_block, rep,
      rep_rstd, rep_staged, scratch, alt, gamma_raw, gamma, dx_out, res_out;
};

GradBuffers grad_buffers(int64_t H, Dtype t, Dtype pt, const ChipConfig& cfg, int64_t staged_rows) {
  GradBuffers n;
  BufferPlan& p = n.plan;
  const int64_t sz = isa::dtype_size(t), psz = isa::dtype_size(pt);
  const bool conv = t != Dtype::F32;
  // A size of G rows' buffer, and of the staged rows where there are more (the same bytes for
  // groups of up to 8 rows).
  const auto with_staged = [staged_rows](BufferPlan::SizeFn f) -> BufferPlan::SizeFn {
    if (staged_rows == 0) return f;
    return [f, staged_rows](int64_t G) { return std::max(f(G), f(staged_rows)); };
  };
  n.raw_x = p.add_sized("x rows", blocks_of(H * sz), 2);
  n.raw_dy = p.add_sized("dy rows", blocks_of(H * sz), 2);
  n.mean_in = p.add_sized("row means", with_staged(blocks_of(kLaneBytes)), 2);
  n.rstd_in = p.add_sized("row rstd", with_staged(blocks_of(kLaneBytes)), 2);
  n.xw = p.add_sized("x rows (f32)", blocks_of(H * kLaneBytes), 1, conv);
  n.dyw = p.add_sized("dy rows (f32)", blocks_of(H * kLaneBytes), 1, conv);
  n.g = p.add_sized("dy * gamma", blocks_of(H * kLaneBytes));
  n.sq = p.add_sized("products", blocks_of(H * kLaneBytes));
  n.acc = p.add_sized("lane slots", blocks_of(kSlotBytes));
  n.acc2 = p.add_sized("lane slots (alternate)", blocks_of(kSlotBytes));
  n.s1 = p.add_sized("row sums of dy * gamma", blocks_of(kLaneBytes));
  n.s2 = p.add_sized("row sums of dy * gamma * xhat", blocks_of(kLaneBytes));
  // Row values replicated to a block per row, then (rows of more than one repeat) widened to a
  // repeat per row in rep / rep_rstd.
  n.rep_block = p.add_sized("replicated", replicated_bytes);
  n.rep = p.add_sized("replicated (wide)", widened_bytes);
  n.rep_rstd = p.add_sized("replicated rstd (wide)", widened_bytes);
  n.scratch = p.add_sized("replicate scratch", with_staged(replicate_scratch_bytes));
  n.alt = p.add_sized("alternating pattern", with_staged(alt_pattern_bytes));
  n.gamma_raw = p.add_fixed("gamma", static_cast<uint64_t>(rnd(H * psz)), 1, pt != Dtype::F32);
  n.gamma = p.add_fixed("gamma (f32)", static_cast<uint64_t>(rnd(H * kLaneBytes)));
  n.dx_out = p.add_sized("dx rows", blocks_of(H * sz), 2);
  n.res_out = p.add_sized("xhat rows (f32)", blocks_of(H * kLaneBytes), 2);
  // Last, so that the other buffers stay where they are without it.
  n.rep_staged = p.add_fixed("replicated (the statistics' last granule)",
                             replicated_bytes(staged_rows), 1, staged_rows > 0);
  place_in_windows(p, cfg,
                   {n.raw_x, n.raw_dy, n.xw, n.dyw, n.g, n.sq, n.gamma, n.res_out, n.acc, n.acc2});
  declare_repeat_overhang(p);
  return n;
}

// LayerNormXBackpropV2's kernel: per group of rows, xhat = (x - mean) * rstd (stored as
// res_for_gamma), g = dy * gamma, the row means of g and of g * xhat, then
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
class LayerNormGradEmitter {
 public:
  // pt: gamma's type, t's or f32.
  LayerNormGradEmitter(const OpDesc& op, const ChipConfig& cfg, int64_t rows, int64_t H, Dtype t,
                       Dtype pt)
      : m_k("LayerNormXBackpropV2_" + std::string(isa::dtype_name(t)), op.str(), cfg),
        m_b(m_k.b()),
        m_rows(rows),
        m_h(H),
        m_t(t),
        m_pt(pt),
        m_layout(SuperRowLayout::make(H, kBlock / isa::dtype_size(t))) {}

  Launch build(const ChipConfig& cfg) {
    const VectorCores cores = VectorCores::of(cfg);
    GradBuffers bufs = grad_buffers(m_h, m_t, m_pt, cfg, 0);
    // Blocks of whole 8-row blocks: a block's rows start on a 32-byte block of mean and rstd.
    const BlockSplit split = BlockSplit::make(m_rows, cores.count, kBlockLanes32);
    int64_t G = group_rows(bufs.plan, cfg, cores, split, m_b, m_h);
    // Groups starting inside the statistics' last 32-byte granule (groups of fewer than 8 rows)
    // would read past it: those load it whole, staged (the buffers for it, and the group size
    // refitted with them).
    if (starts_in_last_granule(split, G)) {
      const int64_t staged_rows = m_rows - last_granule_row();
      bufs = grad_buffers(m_h, m_t, m_pt, cfg, staged_rows);
      G = group_rows(bufs.plan, cfg, cores, split, m_b, m_h);
      if (starts_in_last_granule(split, G)) m_staged_rows = staged_rows;
    }
    m_group = G;
    m_by_row = rows_apply_by_row(G, m_h);
    m_span_sums = row_sums_by_span(G, m_h, cfg);
    m_k.arg("dy", m_t, {m_rows, m_h}, ArgRef{ArgRef::Kind::kInput, 0, 0});
    m_k.arg("x", m_t, {m_rows, m_h}, ArgRef{ArgRef::Kind::kInput, 1, 0});
    m_k.arg("rstd", Dtype::F32, {m_rows}, ArgRef{ArgRef::Kind::kInput, 2, 0});
    m_k.arg("mean", Dtype::F32, {m_rows}, ArgRef{ArgRef::Kind::kInput, 3, 0});
    m_k.arg("gamma", m_pt, {m_h}, ArgRef{ArgRef::Kind::kInput, 4, 0});
    m_k.arg("dx", m_t, {m_rows, m_h}, ArgRef{ArgRef::Kind::kOutput, 0, 0});
    m_k.arg("res_for_gamma", Dtype::F32, {m_rows, m_h}, ArgRef{ArgRef::Kind::kOutput, 1, 0});
    std::vector<Reg> args = m_k.load_args();
    m_dy = std::move(args[0]);
    m_x = std::move(args[1]);
    m_rstd_gm = std::move(args[2]);
    m_mean_gm = std::move(args[3]);
    m_dx = std::move(args[5]);
    m_res = std::move(args[6]);
    const BufferPlan::Placed at = m_k.allocate(bufs.plan, G);
    take_twins(at, {{&m_raw_x, bufs.raw_x},
                    {&m_raw_dy, bufs.raw_dy},
                    {&m_mean_in, bufs.mean_in},
                    {&m_rstd_in, bufs.rstd_in},
                    {&m_dx_out, bufs.dx_out},
                    {&m_res_out, bufs.res_out}});
    take_buffers(at, {{&m_xw, bufs.xw},
                      {&m_dyw, bufs.dyw},
                      {&m_g, bufs.g},
                      {&m_sq, bufs.sq},
                      {&m_acc, bufs.acc},
                      {&m_acc2, bufs.acc2},
                      {&m_s1, bufs.s1},
                      {&m_s2, bufs.s2},
                      {&m_rep_block, bufs.rep_block},
                      {&m_rep, bufs.rep},
                      {&m_rep_rstd, bufs.rep_rstd},
                      {&m_rep_staged, bufs.rep_staged},
                      {&m_scratch, bufs.scratch},
                      {&m_alt, bufs.alt},
                      {&m_gamma, bufs.gamma}});
    load_param_row(m_b, m_pt, m_h, args[4], at[bufs.gamma_raw], m_gamma, "gamma");
    fill_alt_pattern(m_b, m_alt, std::max(G, m_staged_rows));
    m_k.start_pingpong();
    m_k.resident_groups(
        split, m_rows, G, m_layout, [this](const GroupRegs& g, int q) { load(g, q); },
        [this](const GroupRegs& g, int q) { compute(g, q); });
    return m_k.finish(
        split.block_dim,
        fmt::format("LayerNormXBackpropV2: {} rows of {} {}, {} blocks of {} rows, "
                    "groups of {}",
                    m_rows, m_h, isa::dtype_name(m_t), split.block_dim, split.per, G));
  }

 private:
  void load_rows(const GroupRegs& g, const Reg& base, uint64_t dst, int64_t row_bytes,
                 const char* what) {
    KernelBuilder& b = m_b;
    Reg src = b.reg("source"), blocks = b.reg("blocks");
    count_blocks(b, blocks, g.rows, row_bytes);
    b.mul_add(src, g.r, row_bytes, base);
    b.emit(Opcode::op_copy_gm2ub, {dst, src, 1, blocks, 0, 0}, what);
  }

  // First row of the statistics' last 32-byte granule (8 rows of 4 bytes).
  int64_t last_granule_row() const { return (m_rows - 1) / kBlockLanes32 * kBlockLanes32; }
  // Whether a group of G rows starts inside the statistics' last granule, past its first row: its
  // statistics, read in whole 32-byte blocks from its first row, would pass the tensor's end.
  // The granule lies in the last block's range (ranges are whole 8-row blocks).
  bool starts_in_last_granule(const BlockSplit& split, int64_t G) const {
    const int64_t r0 = (split.block_dim - 1) * split.per, K = last_granule_row();
    // The block's first group starting past K (r0 <= K: both whole 8-row blocks).
    return r0 + ceil_div(K + 1 - r0, G) * G < m_rows;
  }

  // Emits direct() for the groups, or where staged, staged() for the groups starting inside the
  // statistics' last granule past its first row and direct() for the others (a branch on the
  // group's first row).
  void by_last_granule(const GroupRegs& g, const std::function<void()>& direct,
                       const std::function<void()>& staged) {
    if (m_staged_rows == 0) {
      direct();
      return;
    }
    KernelBuilder& b = m_b;
    Label other = b.label("not inside the last granule"), done = b.label("last granule done");
    b.branch(lt(g.r, last_granule_row() + 1), other);
    staged();
    b.jmp(done);
    b.bind(other);
    direct();
    b.bind(done);
  }

  // The group's statistics (4 bytes a row) from GM `base` to `dst` in whole 32-byte blocks: from
  // the group's first row, or staged the statistics' last granule whole, so that no block reaches
  // past the tensor's last 32-byte granule.
  void load_row_values(const GroupRegs& g, const Reg& base, uint64_t dst, const char* what) {
    by_last_granule(
        g, [&] { load_rows(g, base, dst, kLaneBytes, what); },
        [&] {
          KernelBuilder& b = m_b;
          Reg src = b.reg("source");
          b.add(src, base, last_granule_row() * kLaneBytes);
          b.emit(Opcode::op_copy_gm2ub, {dst, src, 1, 1, 0, 0}, what);
        });
  }

  void load(const GroupRegs& g, int q) {
    const int64_t sz = isa::dtype_size(m_t);
    m_k.sync().wait_load_free(q);
    load_rows(g, m_x, m_raw_x[q], m_h * sz, "x rows");
    load_rows(g, m_dy, m_raw_dy[q], m_h * sz, "dy rows");
    load_row_values(g, m_mean_gm, m_mean_in[q], "row means");
    load_row_values(g, m_rstd_gm, m_rstd_in[q], "row rstd");
    m_k.sync().load_done(q);
  }

  // Per-row sums of the f32 rows at src (read only) -> dense, scaled by 1/H.
  void row_means(const GroupRegs& g, uint64_t src, uint64_t dense) {
    KernelBuilder& b = m_b;
    if (m_span_sums) {
      row_sums_of_spans(b, g.rows, m_h, src, m_acc, dense);
    } else {
      const RowGroup rg{&m_layout, src, &g.supers, &g.slots};
      const uint64_t sums =
          rows_to_lanes_alternating(b, rg, Combine::kSum, Dtype::F32, m_acc, m_acc2);
      lanes_reduce(b, Combine::kSum, Dtype::F32, sums, g.rows, dense, m_sq);
    }
    Reg inv_h = b.reg_imm("1/H", vector_scalar_bits(Dtype::F32, 1.0 / static_cast<double>(m_h)));
    vec_scalar(b, Opcode::op_vmuls, Dtype::F32, dense, dense, inv_h, g.rows);
  }

  void compute(const GroupRegs& g, int q) {
    KernelBuilder& b = m_b;
    PingPong& sync = m_k.sync();
    const bool conv = m_t != Dtype::F32;
    // x's and dy's f32 rows; once read, the two serve as work rows for the steps after (every
    // step writes another buffer than it reads: no in-place bank double access). With an f32 x
    // they are the load buffers themselves, released only when dx has left them.
    const uint64_t x = conv ? m_xw : m_raw_x[q];
    const uint64_t dy = conv ? m_dyw : m_raw_dy[q];
    const uint64_t xhat = m_res_out[q];
    const auto rows_of = [&](uint64_t buf) {
      return RowGroup{&m_layout, buf, &g.supers, &g.slots};
    };
    Reg lanes = b.reg("lanes of the group");
    b.mul(lanes, g.rows, m_h);
    sync.wait_loaded(q);
    if (conv) {
      vec_convert(b, Dtype::F32, m_t, x, m_raw_x[q], RoundMode::kRint, lanes);
      vec_convert(b, Dtype::F32, m_t, dy, m_raw_dy[q], RoundMode::kRint, lanes);
    }
    // xhat = (x - mean) * rstd (x - mean in the products' buffer), into the res_for_gamma
    // output copy.
    sync.wait_out_free(q);
    replicate_loaded(g, m_mean_in[q], m_rep);
    replicate_loaded(g, m_rstd_in[q], m_rep_rstd);
    if (conv) sync.release_load(q);  // the rows' f32 copies and statistics are taken
    apply_row_values(g, Opcode::op_vsub, x, m_rep, m_sq);
    apply_row_values(g, Opcode::op_vmul, m_sq, m_rep_rstd, xhat);
    // g = dy * gamma.
    if (m_by_row)
      rows_apply(b, g.rows, m_h, Opcode::op_vmul, m_g, dy, param_row(m_gamma));
    else
      apply_param_row(b, rows_of(m_g), m_h, Opcode::op_vmul, dy, m_gamma);
    // s1 = mean(g), s2 = mean(g * xhat) per row.
    row_means(g, m_g, m_s1);
    vec_binary(b, Opcode::op_vmul, Dtype::F32, m_sq, m_g, xhat, lanes);
    row_means(g, m_sq, m_s2);
    // dx = (g - xhat * s2 - s1) * rstd, alternating between x's and dy's rows.
    replicate(g, m_s2, m_rep);
    apply_row_values(g, Opcode::op_vmul, xhat, m_rep, x);
    vec_binary(b, Opcode::op_vsub, Dtype::F32, dy, m_g, x, lanes);
    replicate(g, m_s1, m_rep);
    apply_row_values(g, Opcode::op_vsub, dy, m_rep, x);
    apply_row_values(g, Opcode::op_vmul, x, m_rep_rstd, dy);
    if (conv)
      vec_convert(b, m_t, Dtype::F32, m_dx_out[q], dy, RoundMode::kRint, lanes);
    else
      vec_copy_bits(b, kLaneBytes, m_dx_out[q], dy, lanes);
    if (!conv) sync.release_load(q);
    sync.out_ready(q);
    store_rows(g, m_dx, m_dx_out[q], m_h * isa::dtype_size(m_t), "dx rows");
    store_rows(g, m_res, xhat, m_h * kLaneBytes, "res_for_gamma rows");
    sync.stored(q);
  }

  // Rows of more than one repeat read their row value from a repeat per row (widen_rows).
  bool wide() const { return m_h > kLanes32; }
  // The group's per-row values at `dense` replicated for rows_bcast into dst (a block, or if
  // wide() a repeat, per row).
  void replicate(const GroupRegs& g, uint64_t dense, uint64_t dst) {
    if (!wide()) {
      replicate_rows(m_b, dense, g.rows, dst, m_scratch, m_alt);
      return;
    }
    replicate_rows(m_b, dense, g.rows, m_rep_block, m_scratch, m_alt);
    widen_rows_grouped(m_b, m_rep_block, g.rows, dst, m_group);
  }
  // The group's statistic as load_row_values left it at `loaded` replicated into dst as
  // replicate() does: staged, the granule's rows replicated, then the group's blocks (from the
  // granule's row r) copied to the front.
  void replicate_loaded(const GroupRegs& g, uint64_t loaded, uint64_t dst) {
    by_last_granule(
        g, [&] { replicate(g, loaded, dst); },
        [&] {
          KernelBuilder& b = m_b;
          KernelBuilder::Origin o(b, "statistic from the last granule: the group's rows");
          Reg rows = b.reg_imm("granule's rows", m_staged_rows), at = b.reg("group's first block"),
              lanes = b.reg("lanes");
          replicate_rows(b, loaded, rows, m_rep_staged, m_scratch, m_alt);
          // at = rep_staged + (r - K) blocks
          b.mul_add(at, g.r, kBlock,
                    static_cast<int64_t>(m_rep_staged) - last_granule_row() * kBlock);
          b.mul(lanes, g.rows, kBlockLanes32);
          const uint64_t blocks = wide() ? m_rep_block : dst;
          vec_copy_bits(b, kLaneBytes, static_cast<int64_t>(blocks), at, lanes);
          if (wide()) widen_rows_grouped(b, m_rep_block, g.rows, dst, m_group);
        });
  }
  // dst rows = op(src rows, the row's value replicated at rep), f32: one instruction per row
  // (rows_apply) or per span (rows_bcast_into), whichever issues fewer cycles at this group size.
  void apply_row_values(const GroupRegs& g, Opcode op, uint64_t src, uint64_t rep, uint64_t dst) {
    const RowGroup rows{&m_layout, src, &g.supers, &g.slots};
    if (m_by_row)
      rows_apply(m_b, g.rows, m_h, op, dst, src, row_value_repeats(rep));
    else
      rows_bcast_into(m_b, rows, op, Dtype::F32, rep, false, dst, wide());
  }

  void store_rows(const GroupRegs& g, const Reg& base, uint64_t src, int64_t row_bytes,
                  const char* what) {
    KernelBuilder& b = m_b;
    Reg dst = b.reg("destination"), blocks = b.reg("blocks");
    b.mul_add(dst, g.r, row_bytes, base);
    count_blocks(b, blocks, g.rows, row_bytes);
    b.emit(Opcode::op_copy_ub2gm, {dst, src, 1, blocks, 0, 0}, what);
  }

  RowKernel m_k;
  KernelBuilder& m_b;
  int64_t m_rows, m_h;
  Dtype m_t, m_pt;
  int64_t m_group = 0;        // rows per group (G)
  bool m_by_row = false;      // rows_apply_by_row at this kernel's group size
  bool m_span_sums = false;   // row_sums_by_span at this kernel's group size
  int64_t m_staged_rows = 0;  // the statistics' last granule's rows where staged, else 0
  SuperRowLayout m_layout;
  Reg m_dy, m_x, m_rstd_gm, m_mean_gm, m_dx, m_res;
  Twin m_raw_x, m_raw_dy, m_mean_in, m_rstd_in, m_dx_out, m_res_out;
  uint64_t m_xw = 0, m_dyw = 0, m_g = 0, m_sq = 0, m_acc = 0, m_acc2 = 0, m_s1 = 0, m_s2 = 0,
           m_rep_block = 0, m_rep = 0, m_rep_rstd = 0, m_rep_staged = 0, m_scratch = 0, m_alt = 0,
           m_gamma = 0;
};

}  // namespace

namespace {

// x's last dimension H and rows (the other dimensions' product); gamma (and beta) [H]: inputs
// `params` of op (gamma first, then beta), of one type, x's or f32 (an f16 / bf16 x with f32
// gamma and beta: allow_mix_precision's graph pass, as CANN's LayerNorm takes them; the kernels
// compute in f32 either way). *param_type: that type.
int64_t norm_rows(const OpDesc& op, size_t x_in, std::initializer_list<size_t> params, int64_t* h,
                  DataType* param_type) {
  const TensorDesc& x = op.inputs[x_in];
  if (!data_type_is_float(x.dtype)) op.fail("x must be of a float dtype (f32, f16, bf16)");
  if (x.shape.empty()) op.invalid("x must have at least one dimension");
  const int64_t H = x.shape.back();
  const DataType pt = op.inputs[*params.begin()].dtype;
  for (size_t i : params) {
    const char* name = i == *params.begin() ? "gamma" : "beta";
    if (op.inputs[i].dtype != x.dtype && op.inputs[i].dtype != DataType::F32)
      op.fail(fmt::format("{} is {}: x's dtype {} or f32 is supported", name,
                          data_type_name(op.inputs[i].dtype), data_type_name(x.dtype)));
    if (op.inputs[i].dtype != pt)
      op.fail(fmt::format("beta is {}, gamma {}: they must have one dtype",
                          data_type_name(op.inputs[i].dtype), data_type_name(pt)));
    if (op.inputs[i].shape != std::vector<int64_t>{H})
      op.invalid(fmt::format("{} must be [{}] (x's last dimension)", name, H));
  }
  *h = H;
  *param_type = pt;
  return H == 0 ? 0 : x.num_elements() / H;
}

void check_row_multiple(const OpDesc& op, int64_t H) {
  if (H % kRowMultiple != 0)
    op.fail(fmt::format("last dimension {}: a multiple of {} is supported", H, kRowMultiple));
}

// The per-row statistics' shape: x's with the last dimension 1 (keep_dims), f32.
TensorDesc row_stats_desc(const TensorDesc& x) {
  std::vector<int64_t> shape = x.shape;
  shape.back() = 1;
  return TensorDesc{DataType::F32, shape};
}

// LayerNormXBackpropV2(dy, x, rstd, mean, gamma) -> dx, res_for_gamma.
CompiledKernel compile_layer_norm_x_backprop(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 5)
    op.invalid(fmt::format("takes dy, x, rstd, mean and gamma: {} inputs given", op.inputs.size()));
  int64_t H = 0;
  DataType pt = DataType::F32;
  const int64_t rows = norm_rows(op, 1, {4}, &H, &pt);
  const TensorDesc& x = op.inputs[1];
  if (op.inputs[0].dtype != x.dtype || op.inputs[0].shape != x.shape)
    op.invalid(fmt::format("dy must be x's {}, got {}", x.str(), op.inputs[0].str()));
  const TensorDesc stats = row_stats_desc(x);
  for (size_t i : {2, 3})
    if (op.inputs[i].dtype != DataType::F32 || op.inputs[i].num_elements() != rows)
      op.invalid(fmt::format("{} must be {} (one f32 per row), got {}", i == 2 ? "rstd" : "mean",
                             stats.str(), op.inputs[i].str()));
  CompiledKernel out;
  out.outputs = {x, TensorDesc{DataType::F32, x.shape}};
  if (rows == 0) return out;
  check_row_multiple(op, H);
  LayerNormGradEmitter e(op, ctx.cfg, rows, H, device_dtype(x.dtype), device_dtype(pt));
  out.launches.push_back(e.build(ctx.cfg));
  return out;
}

// LayerNormBetaGammaBackpropV2(dy, res_for_gamma) -> pd_gamma = sum over rows of dy *
// res_for_gamma, pd_beta = sum over rows of dy (f32 [H]): the channel sums of ops/channel.h
// (rows as pixels, H as channels; a multiple of 16, so whole blocks), then an epilogue adding
// the blocks' partials.
CompiledKernel compile_layer_norm_beta_gamma_backprop(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 2)
    op.invalid(fmt::format("takes dy and res_for_gamma: {} inputs given", op.inputs.size()));
  const TensorDesc& dy = op.inputs[0];
  const TensorDesc& res = op.inputs[1];
  if (!data_type_is_float(dy.dtype) || dy.shape.empty())
    op.fail("dy must be a float tensor of at least one dimension");
  if (res.dtype != DataType::F32 || res.shape != dy.shape)
    op.invalid(fmt::format("res_for_gamma must be f32 of dy's shape {}, got {}",
                           shape_str(dy.shape), res.str()));
  const int64_t H = dy.shape.back();
  const int64_t rows = H == 0 ? 0 : dy.num_elements() / H;
  CompiledKernel k;
  const TensorDesc vec{DataType::F32, {H}};
  k.outputs = {vec, vec};
  if (H == 0) return k;
  check_row_multiple(op, H);
  if (rows == 0) op.fail("needs at least one row");
  ChannelSumSpec s;
  s.kind = ChannelSumSpec::Kind::kSumProduct;
  s.plain_sum = true;  // sum b = sum dy
  s.a_type = Dtype::F32;
  s.b_type = device_dtype(dy.dtype);
  s.pixels = rows;
  s.cp = H;
  ChannelSumLaunch cs = build_channel_sum(s, ctx.cfg, op.str());
  const uint64_t bytes = static_cast<uint64_t>(cs.blocks * H) * 4;
  const ArgRef products = workspace_take(k, bytes), sums = workspace_take(k, bytes);
  k.launches.push_back(
      with_args(std::move(cs.launch), {input_ref(1), input_ref(0), products, sums}));
  ChannelEpilogueSpec e;
  e.name = "LayerNormBetaGammaBackpropSums";
  e.spread = true;
  e.c = H;
  e.partial_cp = H;
  e.partial_blocks = {cs.blocks, cs.blocks};
  e.outputs = 2;
  e.compute = [](KernelBuilder& b, const EpilogueOperands& o) {
    f32_copy(b, o.outputs[0], o.sums[0], *o.count);
    f32_copy(b, o.outputs[1], o.sums[1], *o.count);
  };
  k.launches.push_back(with_args(build_channel_epilogue(e, ctx.cfg, op.str()),
                                 {products, sums, output_ref(0), output_ref(1)}));
  return k;
}

}  // namespace

CompiledKernel compile_norm(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.type == "LayerNormXBackpropV2") return compile_layer_norm_x_backprop(ctx);
  if (op.type == "LayerNormBetaGammaBackpropV2") return compile_layer_norm_beta_gamma_backprop(ctx);
  const NormKind kind = op.type == "RmsNorm"       ? NormKind::kRms
                        : op.type == "LayerNormV3" ? NormKind::kLayerStats
                                                   : NormKind::kLayer;
  const bool center = kind != NormKind::kRms;
  const size_t n_in = center ? 3 : 2;
  if (op.inputs.size() != n_in)
    op.invalid(fmt::format("takes x, gamma{}: {} inputs given", center ? " and beta" : "",
                           op.inputs.size()));
  int64_t H = 0;
  DataType pt = DataType::F32;
  const int64_t rows = center ? norm_rows(op, 0, {1, 2}, &H, &pt) : norm_rows(op, 0, {1}, &H, &pt);
  const TensorDesc& x = op.inputs[0];
  CompiledKernel out;
  out.outputs = {x};
  if (kind == NormKind::kLayerStats) {
    out.outputs.push_back(row_stats_desc(x));
    out.outputs.push_back(row_stats_desc(x));
  }
  if (rows == 0) return out;
  check_row_multiple(op, H);
  RmsNormEmitter e(op, ctx.cfg, rows, H, device_dtype(x.dtype), device_dtype(pt),
                   op.attr_float("epsilon", center ? 1e-5 : 1e-6), kind);
  out.launches.push_back(e.build(ctx.cfg));
  return out;
}

}  // namespace npusim::compiler::ops
