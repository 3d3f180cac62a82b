// Softmax, LogSoftmax (over the last axis, any rank >= 1), SoftmaxCrossEntropyWithLogits
// (features and labels [N, C], broadcastable to each other) and
// SparseSoftmaxCrossEntropyWithLogits (features [N, C], labels [N] of s32 or s64).
//
// Formulas (TF's CPU kernels, tensorflow/core/kernels/softmax_op_functor.h, xent_op.h,
// sparse_xent_op.h), per row x with shifted = x - max(x):
//   Softmax     exp(shifted) / sum(exp(shifted))
//   LogSoftmax  shifted - log(sum(exp(shifted)))
//   Xent        loss = sum(labels * (log(sum(exp(shifted))) - shifted)),
//               backprop = exp(shifted) / sum(exp(shifted)) - labels
//   SparseXent  loss = log(sum(exp(shifted))) - shifted[label],
//               backprop = exp(shifted) / sum(exp(shifted)) - onehot(label)
// A label outside [0, C) makes its row's loss and backprop NaN (TF's GPU kernels do this; the
// CPU kernel fails the step, which a kernel cannot do). int64 labels are clamped to s32 by a
// scalar launch first (ops/int64.h), keeping out-of-range values out of range.
//
// Numerics: f16/bf16 are widened to f32, everything is computed in f32 (exp/ln from the vector
// unit, correctly rounded in fp32 in practice; sums in lane / fold order) and rounded once to
// the output type; TF's half kernels round after each Eigen op, so f16 results may differ from
// TF's by an ulp or two (closer to the exact value).
//
// Kernel: rows grouped into super-rows (vector_rows.h) resident in the UB: one copy per group
// in, max / sum per row through the lane accumulator, per-row values replicated back onto the
// row's lanes, one copy out; double-buffered (vector_rows.h PingPong: the next group loads
// while this one computes, and is stored while the next computes). A group is whole super-rows
// and whole 32-byte blocks of rows (8 or 16). Softmax / LogSoftmax rows too long for that but
// fitting the UB alone are resident one row at a time (LongRowEmitter; rows whose bytes are not
// whole blocks too, loaded from the block holding their first element; single-buffered and
// with each row value broadcast onto a row before it is applied, as CANN's SoftmaxV2
// schedules it: single_buffer(), row_broadcast()). Other rows too long
// for a group are streamed instead, also
// double-buffered (three passes over GM per row: max, sum of exponentials, outputs), each core
// taking a range of rows whose first row starts on a 32-byte block in every tensor; output rows
// that start inside a block get the block's head (the end of the previous row, kept from that
// row) copied in before the block is written, so every block is written once and whole.
// All three kernels run on the row skeleton (row_kernel.h: arguments, block range, group loops,
// buffers declared once in a BufferPlan); their bodies are emitter classes (RowsEmitter,
// LongRowEmitter, StreamEmitter).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "adapter/compiler/ops/cast.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/int64.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/row_kernel.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/convert.h"
#include "common/int_math.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;

namespace {

constexpr int64_t kF32One = 0x3f800000;
constexpr int64_t kF32Nan = 0x7fc00000;

enum class Kind { kSoftmax, kLogSoftmax, kXent, kSparseXent };

struct Spec {
  Kind kind = Kind::kSoftmax;
  Dtype t = Dtype::F32;  // features, labels (Xent), outputs
  int64_t rows = 0, C = 0;
  std::string op;
  bool xent() const { return kind == Kind::kXent || kind == Kind::kSparseXent; }
  int size() const { return isa::dtype_size(t); }
};

// Kernel arguments: in0 features [, in1 labels], out [, out1]: Softmax/LogSoftmax out = y;
// the Xent ops out = loss [rows], out1 = backprop [rows, C].
struct Args {
  Reg x, labels, y, loss;
};

Args declare_args(RowKernel& k, const Spec& s) {
  k.arg("in0", s.t, {s.rows, s.C}, ArgRef{ArgRef::Kind::kInput, 0, 0});
  if (s.kind == Kind::kXent) k.arg("in1", s.t, {s.rows, s.C}, ArgRef{ArgRef::Kind::kInput, 1, 0});
  if (s.kind == Kind::kSparseXent)
    k.arg("in1", Dtype::S32, {s.rows}, ArgRef{ArgRef::Kind::kInput, 1, 0});
  if (s.xent()) {
    k.arg("out", s.t, {s.rows}, ArgRef{ArgRef::Kind::kOutput, 0, 0});
    k.arg("out1", s.t, {s.rows, s.C}, ArgRef{ArgRef::Kind::kOutput, 1, 0});
  } else {
    k.arg("out", s.t, {s.rows, s.C}, ArgRef{ArgRef::Kind::kOutput, 0, 0});
  }
  std::vector<Reg> regs = k.load_args();
  Args a;
  a.x = std::move(regs[0]);
  if (s.xent()) {
    a.labels = std::move(regs[1]);
    a.loss = std::move(regs[2]);
    a.y = std::move(regs[3]);
  } else {
    a.y = std::move(regs[1]);
  }
  return a;
}

// Constants of the sparse labels: lane indices, zeros, NaNs, C.
struct SparseConsts {
  uint64_t iota64 = 0, t64 = 0, zero64 = 0, nan64 = 0, c64 = 0;
};

struct SparseConstIds {
  BufferPlan::Id iota64, t64, zero64, nan64, c64;
};

SparseConstIds declare_sparse_consts(BufferPlan& p, bool enabled) {
  SparseConstIds id;
  id.iota64 = p.add_fixed("iota 0..63", kSlotBytes, 1, enabled);
  id.t64 = p.add_fixed("column indices", kSlotBytes, 1, enabled);
  id.zero64 = p.add_fixed("zeros", kSlotBytes, 1, enabled);
  id.nan64 = p.add_fixed("NaNs", kSlotBytes, 1, enabled);
  id.c64 = p.add_fixed("C", kSlotBytes, 1, enabled);
  return id;
}

// The constants at their allocated addresses, filled.
SparseConsts fill_sparse_consts(KernelBuilder& b, const BufferPlan::Placed& at,
                                const SparseConstIds& id, int64_t C) {
  SparseConsts k;
  k.iota64 = at[id.iota64];
  k.t64 = at[id.t64];
  k.zero64 = at[id.zero64];
  k.nan64 = at[id.nan64];
  k.c64 = at[id.c64];
  fill_iota64(b, k.iota64);
  vec_fill32(b, k.zero64, 0, kLanes32);
  vec_fill32(b, k.nan64, kF32Nan, kLanes32);
  vec_fill32(b, k.c64, C, kLanes32);
  return k;
}

// addv[r] = 0 if 0 <= label[r] < C else NaN, for `count` dense labels.
void label_validity(KernelBuilder& b, const SparseConsts& k, uint64_t labels, const Reg& count,
                    uint64_t bits, uint64_t bits2, uint64_t addv) {
  KernelBuilder::Origin o(b, "labels outside [0, C): NaN");
  b.emit(Opcode::op_set_mask_count, {count});
  vec_compare_strided(b, Dtype::S32, isa::Cmp::GE, bits, VOperand(labels), VOperand(k.zero64, 1, 0),
                      0);
  vec_compare_strided(b, Dtype::S32, isa::Cmp::LT, bits2, VOperand(labels), VOperand(k.c64, 1, 0),
                      0);
  Reg words = b.reg("u16 words of bits");
  b.add(words, count, kLanes32 - 1);
  b.shr(words, words, 6);
  b.shl(words, words, 2);  // 8 bytes per 64 lanes
  vec_binary(b, Opcode::op_vand, Dtype::U16, bits, bits, bits2, words);
  b.emit(Opcode::op_set_mask_count, {count});
  vec_select_strided(b, Dtype::F32, VOperand(addv), VOperand(k.zero64, 1, 0),
                     VOperand(k.nan64, 1, 0), bits, 0);
}

// ---- rows resident in the UB (super-row groups) ----

struct RowsPlan {
  SuperRowLayout layout;
  int64_t group = 0;
  BlockSplit split;
};

// The resident-rows kernel's buffers; units: rows per group. Double-buffered (PingPong, loads
// and stores in lockstep): what MTE2 loads (features, labels) and what MTE3 stores (output
// rows, loss) have a ping and a pong copy; the widened rows, exponentials and per-row values
// are V's alone.
struct RowsBuffers {
  BufferPlan plan;
  BufferPlan::Id raw_x, xw, out, e, raw_y, yw, acc, d0, d1, d2, rep, scratch, alt, loss;
  BufferPlan::Id lbl, rep_lbl, span, bits, bits2;  // sparse labels
  SparseConstIds consts;
};

// Rows of 1, 2, 4 or 8 f32 lanes: whole rows in every 8-lane block (RowsEmitter spreads their
// per-row values onto their lanes instead of applying them row by row).
bool tiny_rows(const Spec& s) { return s.C <= kBlockLanes32 && kBlockLanes32 % s.C == 0; }

// The row blocks spread_tiny_rows reads: whole groups of 8 rows (replicate_rows), and every
// block of the group's last 64-lane repeat (rows rounded up to 64 covers that for any C).
uint64_t tiny_rep_bytes(int64_t rows) {
  return std::max(replicated_bytes(rows), static_cast<uint64_t>(round_up(rows, kLanes32) * kBlock));
}

RowsBuffers rows_buffers(const Spec& s, const ChipConfig& cfg) {
  RowsBuffers r;
  BufferPlan& p = r.plan;
  const bool conv = s.t != Dtype::F32, sparse = s.kind == Kind::kSparseXent;
  const bool xent = s.kind == Kind::kXent;
  r.raw_x = p.add_sized("features", blocks_of(s.C * s.size()), 2);
  r.xw = p.add_sized("widened features", blocks_of(s.C * kLaneBytes), 1, conv);
  r.out = p.add_sized("output rows", blocks_of(s.C * s.size()), 2);
  // Softmax / LogSoftmax: the shifted rows; the Xent ops: the exponentials.
  r.e = p.add_sized("shifted rows / exponentials", blocks_of(s.C * kLaneBytes));
  r.raw_y = p.add_sized("labels", blocks_of(s.C * s.size()), 2, xent);
  r.yw = p.add_sized("widened labels", blocks_of(s.C * kLaneBytes), 1, xent && conv);
  r.acc = p.add_sized("lane slots", blocks_of(kSlotBytes));
  r.d0 = p.add_sized("row values", blocks_of(kLaneBytes));
  r.d1 = p.add_sized("row values 2", blocks_of(kLaneBytes));
  r.d2 = p.add_sized("row values 3", blocks_of(kLaneBytes));
  r.rep = p.add_sized("replicated", tiny_rows(s) ? tiny_rep_bytes : replicated_bytes);
  r.scratch = p.add_sized("replicate scratch", replicate_scratch_bytes);
  r.alt = p.add_sized("alternating pattern", alt_pattern_bytes);
  r.loss = p.add_sized("loss", blocks_of(s.size()), 2, s.xent());
  r.lbl = p.add_sized("labels", blocks_of(kLaneBytes), 2, sparse);
  r.rep_lbl = p.add_sized("replicated labels", replicated_bytes, 1, sparse);
  r.span = p.add_sized("span scratch", blocks_of(kSlotBytes), 1, sparse);
  r.bits = p.add_sized("compare bits", blocks_of(8), 1, sparse);
  r.bits2 = p.add_sized("compare bits 2", blocks_of(8), 1, sparse);
  r.consts = declare_sparse_consts(p, sparse);
  // The f32 rows (x: the widened copy, or the loaded one), e and (f32) the output rows start a
  // quarter or half of a bank window apart, so the dense instructions between them (vexp, the
  // row value applied) read and write each repeat in different UB banks.
  const uint64_t span = static_cast<uint64_t>(std::max(0, cfg.ub_banks)) *
                        static_cast<uint64_t>(std::max(0, cfg.ub_bank_width_bytes));
  if (span > 0) {
    p.place(conv ? r.xw : r.raw_x, span, 0);
    p.place(r.e, span, span / 2);
    if (!conv) p.place(r.out, span, span / 4);
  }
  declare_repeat_overhang(p);
  return r;
}

std::optional<RowsPlan> plan_rows(const Spec& s, const ChipConfig& cfg) {
  const VectorCores cores = VectorCores::of(cfg);
  RowsPlan p;
  const int64_t granule = kBlock / s.size();
  p.layout = SuperRowLayout::make(s.C, granule);
  // Rows per step: whole super-rows and whole 32-byte blocks of a per-row output (the loss; also
  // the s32 labels' 8). Softmax / LogSoftmax would only need whole super-rows, but a group of
  // very few long rows costs one instruction per 64-lane span and pass (rows_to_lanes,
  // rows_bcast): such rows are faster streamed (a few counter-mode instructions per chunk).
  const int64_t q = std::max<int64_t>(p.layout.rows, granule);
  p.split = BlockSplit::make(s.rows, cores.count, q);
  p.group = rows_buffers(s, cfg).plan.fit(cfg, cores.kind, q, std::min(kMaxGroupRows / q * q,
                                                                   p.split.per));
  if (p.group == 0) return std::nullopt;
  return p;
}

// The resident-rows kernel: one group of rows per PingPong step (RowKernel::resident_groups).
class RowsEmitter {
 public:
  RowsEmitter(const Spec& s, const RowsPlan& p, const ChipConfig& cfg)
      : m_s(s), m_p(p), m_k(fmt::format("{}_rows", s.op.substr(0, s.op.find('('))), s.op, cfg),
        m_b(m_k.b()), m_conv(s.t != Dtype::F32) {}

  Launch build() {
    const int64_t G = m_p.group;
    m_args = declare_args(m_k, m_s);
    const RowsBuffers bufs = rows_buffers(m_s, m_k.b().config());
    const BufferPlan::Placed at = m_k.allocate(bufs.plan, G);
    take_twins(at, {{&m_raw_x, bufs.raw_x}, {&m_out, bufs.out}, {&m_raw_y, bufs.raw_y},
                    {&m_loss, bufs.loss}, {&m_lbl, bufs.lbl}});
    take_buffers(at, {{&m_xw, bufs.xw}, {&m_e, bufs.e}, {&m_yw, bufs.yw}, {&m_acc, bufs.acc},
                      {&m_d0, bufs.d0}, {&m_d1, bufs.d1}, {&m_d2, bufs.d2}, {&m_rep, bufs.rep},
                      {&m_scratch, bufs.scratch}, {&m_alt, bufs.alt}, {&m_rep_lbl, bufs.rep_lbl},
                      {&m_span, bufs.span}, {&m_bits, bufs.bits}, {&m_bits2, bufs.bits2}});
    if (m_s.kind == Kind::kSparseXent) m_consts = fill_sparse_consts(m_b, at, bufs.consts, m_s.C);
    fill_alt_pattern(m_b, m_alt, G);
    m_k.start_pingpong();
    m_k.resident_groups(
        m_p.split, m_s.rows, G, m_p.layout,
        [this](const GroupRegs& grp, int q) { load(grp, q); },
        [this](const GroupRegs& grp, int q) { compute(grp, q); });
    return m_k.finish(m_p.split.block_dim,
                      fmt::format("{}: {} rows of {} {}, {} blocks of {} rows, groups of {} ({} "
                                  "per super-row), double-buffered",
                                  m_b.op(), m_s.rows, m_s.C, isa::dtype_name(m_s.t),
                                  m_p.split.block_dim, m_p.split.per, G, m_p.layout.rows));
  }

 private:
  // One group in the vector unit: load copy q, x the f32 features (the widened copy, or copy q
  // itself), y the f32 labels (Xent), e the exponentials (x itself for Softmax).
  struct Group {
    const GroupRegs& regs;
    int q;
    uint64_t x, y, e;
    const Reg& lanes;
    RowGroup gx, ge;
  };

  void load(const GroupRegs& grp, int q) {
    KernelBuilder& b = m_b;
    const int sz = m_s.size();
    m_k.sync().wait_load_free(q);
    Reg src = b.reg("source"), blocks = b.reg("blocks");
    count_blocks(b, blocks, grp.rows, m_s.C * sz);
    b.mul_add(src, grp.r, m_s.C * sz, m_args.x);
    b.emit(Opcode::op_copy_gm2ub, {m_raw_x[q], src, 1, blocks, 0, 0}, "features");
    if (m_s.kind == Kind::kXent) {
      b.mul_add(src, grp.r, m_s.C * sz, m_args.labels);
      b.emit(Opcode::op_copy_gm2ub, {m_raw_y[q], src, 1, blocks, 0, 0}, "labels");
    }
    if (m_s.kind == Kind::kSparseXent) {
      count_blocks(b, blocks, grp.rows, kLaneBytes);
      b.mul_add(src, grp.r, kLaneBytes, m_args.labels);
      b.emit(Opcode::op_copy_gm2ub, {m_lbl[q], src, 1, blocks, 0, 0}, "labels");
    }
    m_k.sync().load_done(q);
  }

  void compute(const GroupRegs& grp, int q) {
    KernelBuilder& b = m_b;
    PingPong& sync = m_k.sync();
    const uint64_t x = m_conv ? m_xw : m_raw_x[q];
    const uint64_t y = m_s.kind != Kind::kXent ? 0 : m_conv ? m_yw : m_raw_y[q];
    Reg lanes = b.reg("lanes of the group");
    b.mul(lanes, grp.supers, m_p.layout.lanes);
    sync.wait_loaded(q);
    if (m_conv) {
      vec_convert(b, Dtype::F32, m_s.t, x, m_raw_x[q], RoundMode::kRint, lanes);
      if (m_s.kind == Kind::kXent)
        vec_convert(b, Dtype::F32, m_s.t, y, m_raw_y[q], RoundMode::kRint, lanes);
    }
    // The load copy is free once widened (sparse labels are read to the end).
    const bool early_release = m_conv && m_s.kind != Kind::kSparseXent;
    if (early_release) sync.release_load(q);
    // Every full-width instruction out of place (in place, each block is read and written in
    // the same UB bank). Softmax / LogSoftmax: shifted into e, the exponentials back into x; the
    // Xent ops keep shifted in x (their loss reads it) and the exponentials in e.
    const bool xent_op = m_s.xent();
    const uint64_t shifted = xent_op ? x : m_e, ex = xent_op ? m_e : x;
    const Group g{grp, q, x, y, ex, lanes, RowGroup{&m_p.layout, x, &grp.supers, &grp.slots},
                  RowGroup{&m_p.layout, ex, &grp.supers, &grp.slots}};
    const RowGroup gs{&m_p.layout, shifted, &grp.supers, &grp.slots};
    // shifted = x - max; exponentials = exp(shifted); sum = d0.
    row_reduce(g, g.gx, Combine::kMax, m_d0, true);
    apply_row_value(g, g.gx, Opcode::op_vsub, m_d0, false, xent_op ? 0 : shifted);
    vec_unary(b, Opcode::op_vexp, Dtype::F32, ex, shifted, lanes);
    row_reduce(g, g.ge, Combine::kSum, m_d0, true);
    sync.wait_out_free(q);
    // Where the f32 output rows are computed: the output copy itself for f32, else a free f32
    // buffer (Softmax: shifted's, LogSoftmax: the exponentials').
    uint64_t result = m_out[q];
    switch (m_s.kind) {
      case Kind::kSoftmax:
        if (m_conv) result = shifted;
        apply_row_value(g, g.ge, Opcode::op_vdiv, m_d0, false, result);
        break;
      case Kind::kLogSoftmax:
        if (m_conv) result = ex;
        vec_unary(b, Opcode::op_vln, Dtype::F32, m_d0, m_d0, grp.slots);
        apply_row_value(g, gs, Opcode::op_vsub, m_d0, false, result);
        break;
      case Kind::kXent: xent(g); break;
      case Kind::kSparseXent: sparse_xent(g); break;
    }
    if (!early_release) sync.release_load(q);
    store(g, m_s.xent() ? m_e : result);
  }

  // Row sums / maxima of the group into dense d: rows_to_lanes (or slots_from_span_pairs) +
  // lanes_reduce. from_pairs: op(identity, x) is x bit for bit for every lane (max; a sum of
  // values never -0, such as exponentials), so rows of whole 64-lane spans may skip the identity.
  void row_reduce(const Group& g, const RowGroup& rows, Combine c, uint64_t d,
                  bool from_pairs = false) {
    if (from_pairs && whole_span_rows()) slots_from_span_pairs(rows, c);
    else rows_to_lanes(m_b, rows, c, Dtype::F32, m_acc);
    lanes_reduce(m_b, c, Dtype::F32, m_acc, g.regs.slots, d, m_d2);
  }
  // One row per super-row, of two or more 64-lane spans with every lane the row's.
  bool whole_span_rows() const {
    const SuperRowLayout& L = m_p.layout;
    if (L.rows != 1 || L.spans[0].size() < 2) return false;
    return std::all_of(L.spans[0].begin(), L.spans[0].end(),
                       [](const RowSpan& sp) { return sp.mask == kAllLanes; });
  }
  // rows_to_lanes' slots for whole_span_rows(): slot r = op(span 0, span 1) of row r, out of
  // place, then the further spans combined in, instead of the identity and one in-place
  // instruction per span (in place, each block is read and written in the same UB bank).
  void slots_from_span_pairs(const RowGroup& rows, Combine c) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "row reduction: whole 64-lane spans -> lane slots");
    const SuperRowLayout& L = m_p.layout;
    const Opcode op = combine_opcode(c);
    const int64_t slot_rep = kSlotBytes / kBlock;  // one slot per row (super-row)
    set_mask_lanes(b, kAllLanes);
    for_superrow_batches(b, rows, [&](const Reg& first, Opnd count, int64_t xrep) {
      Reg slot = b.reg("lane slot"), span = b.reg("row span"), span2 = b.reg("row span 2");
      auto span_at = [&](const Reg& r, const RowSpan& sp) {
        b.mul_add(r, first, L.lanes * kLaneBytes,
                  static_cast<int64_t>(rows.x) + sp.offset * kLaneBytes);
      };
      b.mul_add(slot, first, kSlotBytes, static_cast<int64_t>(m_acc));
      const VOperand slots(slot, 1, slot_rep);
      span_at(span, L.spans[0][0]);
      span_at(span2, L.spans[0][1]);
      vec_binary_strided(b, op, Dtype::F32, slots, VOperand(span, 1, xrep),
                         VOperand(span2, 1, xrep), count);
      for (size_t i = 2; i < L.spans[0].size(); ++i) {
        span_at(span, L.spans[0][i]);
        vec_binary_strided(b, op, Dtype::F32, slots, slots, VOperand(span, 1, xrep), count);
      }
    });
  }
  // For every row of the group: row lanes = op(row lanes, d[row]) (rep_first: op(d[row], lanes)),
  // into dst (0: in place), d dense per-row f32 values. d is replicated to a block per row
  // (m_rep); rows of more than one 64-lane repeat then read it widened to a repeat per row
  // (widen_row_groups), written into the lane slots (free between reductions; a group is whole
  // blocks of 8 rows, so they hold the rows rounded up to 8): one block read 8 times per repeat
  // is 8 accesses to one UB bank, a widened repeat 8 banks once each.
  // Rows of 1, 2, 4 or 8 lanes (tiny_rows()) instead get the value on each of their lanes in the
  // lane slots (spread_tiny_rows) and one dense instruction over the group's lanes: a few
  // instructions per group, not one per row of the super-row, each on the row's lanes only.
  void apply_row_value(const Group& g, const RowGroup& rows, Opcode op, uint64_t d,
                       bool rep_first = false, uint64_t dst = 0) {
    replicate_rows(m_b, d, g.regs.slots, m_rep, m_scratch, m_alt);
    if (tiny_rows(m_s)) {
      spread_tiny_rows(g);
      const uint64_t out = dst ? dst : rows.x;
      vec_binary(m_b, op, Dtype::F32, out, rep_first ? m_acc : rows.x, rep_first ? rows.x : m_acc,
                 g.lanes);
      return;
    }
    const bool wide = m_s.C > kLanes32;
    if (wide) widen_row_groups(m_b, m_rep, g.regs.slots, m_acc);
    rows_bcast(m_b, rows, op, Dtype::F32, wide ? m_acc : m_rep, rep_first, dst, wide);
  }
  // Lane r*C + c of the lane slots (dense, the group's row-major lanes) = the value of row r,
  // from its block in m_rep: instruction i (of 8 / C) writes in every 8-lane block b the lanes
  // of row (8 / C) b + i, read from that row's block (block stride 8 / C), under a lane mask.
  // The blocks read past the group's rows are in m_rep (tiny_rep_bytes) and land on lanes past
  // the group's, which the dense instruction does not read.
  void spread_tiny_rows(const Group& g) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "per-row values onto the rows' lanes (rows of 8 lanes or fewer)");
    const int64_t C = m_s.C, per_block = kBlockLanes32 / C;
    Reg repeats = b.reg("64-lane repeats of the group");
    b.add(repeats, g.lanes, kLanes32 - 1);
    b.shr(repeats, repeats, ceil_log2(kLanes32));
    for (int64_t i = 0; i < per_block; ++i) {
      uint64_t mask = 0;
      for (int64_t blk = 0; blk < kLanes32 / kBlockLanes32; ++blk)
        for (int64_t c = 0; c < C; ++c) mask |= uint64_t{1} << (blk * kBlockLanes32 + i * C + c);
      set_mask_lanes(b, mask);
      vec_unary_strided(b, Opcode::op_vcopy, Dtype::S32,
                        VOperand(m_acc, 1, kLanes32 / kBlockLanes32),
                        VOperand(static_cast<int64_t>(m_rep) + i * kBlock, per_block,
                                 kLanes32 / C),
                        repeats);
    }
  }

  // backprop = e / sum - labels (in e); loss = sum(labels * (log(sum) - shifted)) (in d1).
  void xent(const Group& g) {
    KernelBuilder& b = m_b;
    vec_unary(b, Opcode::op_vln, Dtype::F32, m_d1, m_d0, g.regs.slots);
    apply_row_value(g, g.ge, Opcode::op_vdiv, m_d0);
    vec_binary(b, Opcode::op_vsub, Dtype::F32, m_e, m_e, g.y, g.lanes);
    // loss = sum(labels * (log(sum) - shifted)), in x.
    apply_row_value(g, g.gx, Opcode::op_vsub, m_d1, true);
    vec_binary(b, Opcode::op_vmul, Dtype::F32, g.x, g.x, g.y, g.lanes);
    row_reduce(g, g.gx, Combine::kSum, m_d1);
  }

  // backprop = e / sum - onehot(label) (in e); loss = log(sum) - shifted[label] (in d1); rows
  // with a label outside [0, C) NaN.
  void sparse_xent(const Group& g) {
    KernelBuilder& b = m_b;
    const Reg& slots = g.regs.slots;
    vec_unary(b, Opcode::op_vln, Dtype::F32, m_d1, m_d0, slots);
    apply_row_value(g, g.ge, Opcode::op_vdiv, m_d0);
    // Per row span: lanes whose column is the label: backprop - 1, and shifted summed.
    replicate_rows(b, m_lbl[g.q], slots, m_rep_lbl, m_scratch, m_alt);
    one_hot(g);
    lanes_reduce(b, Combine::kSum, Dtype::F32, m_acc, slots, m_d0, m_d2);
    vec_binary(b, Opcode::op_vsub, Dtype::F32, m_d1, m_d1, m_d0, slots);  // loss
    label_validity(b, m_consts, m_lbl[g.q], slots, m_bits, m_bits2, m_d0);
    vec_binary(b, Opcode::op_vadd, Dtype::F32, m_d1, m_d1, m_d0, slots);
    apply_row_value(g, g.ge, Opcode::op_vadd, m_d0);
  }

  // On each row's label lane: backprop - 1 (in e), and shifted combined into the row's slot.
  void one_hot(const Group& g) {
    KernelBuilder& b = m_b;
    const SuperRowLayout& L = m_p.layout;
    const int64_t rg = L.rows;
    KernelBuilder::Origin o(b, "one-hot of the labels");
    Reg n64 = b.reg("slot lanes");
    b.mul(n64, g.regs.slots, kLanes32);
    vec_fill32(b, m_acc, 0, n64);
    Reg minus1 = b.reg_imm("-1.0", vector_scalar_bits(Dtype::F32, -1.0));
    Reg lanes64 = b.reg_imm("64", kLanes32), col = b.reg("column of lane 0");
    const int64_t slot_rep = rg * (kSlotBytes / kBlock);
    for_superrow_batches(b, g.gx, [&](const Reg& first, Opnd count, int64_t xrep) {
      Reg xa = b.reg("shifted span"), ea = b.reg("backprop span"), la = b.reg("label");
      Reg aa = b.reg("slot");
      for (int64_t j = 0; j < rg; ++j) {
        b.mul_add(la, first, rg * kBlock, static_cast<int64_t>(m_rep_lbl) + j * kBlock);
        b.mul_add(aa, first, rg * kSlotBytes, static_cast<int64_t>(m_acc) + j * kSlotBytes);
        for (const RowSpan& sp : L.spans[static_cast<size_t>(j)]) {
          b.movi(col, sp.offset - j * m_s.C);
          vec_scalar(b, Opcode::op_vadds, Dtype::S32, m_consts.t64, m_consts.iota64, col,
                     lanes64);
          set_mask_lanes(b, sp.mask);
          b.mul_add(xa, first, L.lanes * kLaneBytes,
                    static_cast<int64_t>(g.x) + sp.offset * kLaneBytes);
          b.mul_add(ea, first, L.lanes * kLaneBytes,
                    static_cast<int64_t>(m_e) + sp.offset * kLaneBytes);
          const VOperand xs(xa, 1, xrep), es(ea, 1, xrep), sc(m_span, 1, 8);
          vec_compare_strided(b, Dtype::S32, isa::Cmp::EQ, m_bits, VOperand(m_consts.t64, 1, 0),
                              VOperand(la, 0, rg), count);
          vec_scalar_strided(b, Opcode::op_vadds, Dtype::F32, sc, es, minus1, count);
          vec_select_strided(b, Dtype::F32, es, sc, es, m_bits, count);
          vec_select_strided(b, Dtype::F32, sc, xs, VOperand(m_consts.zero64, 1, 0), m_bits,
                             count);
          vec_binary_strided(b, Opcode::op_vadd, Dtype::F32, VOperand(aa, 1, slot_rep),
                             VOperand(aa, 1, slot_rep), sc, count);
        }
      }
    });
  }

  // The f32 output rows at rows_f32 (and the loss in d1) in the output type, stored.
  void store(const Group& g, uint64_t rows_f32) {
    KernelBuilder& b = m_b;
    const int q = g.q, sz = m_s.size();
    if (m_conv || m_s.xent()) {
      if (m_conv) vec_convert(b, m_s.t, Dtype::F32, m_out[q], rows_f32, RoundMode::kRint, g.lanes);
      else vec_copy_bits(b, kLaneBytes, m_out[q], rows_f32, g.lanes);
    }
    if (m_s.xent()) {
      if (m_conv)
        vec_convert(b, m_s.t, Dtype::F32, m_loss[q], m_d1, RoundMode::kRint, g.regs.slots);
      else vec_copy_bits(b, kLaneBytes, m_loss[q], m_d1, g.regs.slots);
    }
    m_k.sync().out_ready(q);
    {
      Reg dst = b.reg("destination"), blocks = b.reg("blocks");
      b.mul_add(dst, g.regs.r, m_s.C * sz, m_args.y);
      count_blocks(b, blocks, g.regs.rows, m_s.C * sz);
      b.emit(Opcode::op_copy_ub2gm, {dst, m_out[q], 1, blocks, 0, 0}, "output rows");
      if (m_s.xent()) {
        b.mul_add(dst, g.regs.r, sz, m_args.loss);
        count_blocks(b, blocks, g.regs.rows, sz);
        b.emit(Opcode::op_copy_ub2gm, {dst, m_loss[q], 1, blocks, 0, 0}, "loss");
      }
    }
    m_k.sync().stored(q);
  }

  const Spec& m_s;
  const RowsPlan& m_p;
  RowKernel m_k;
  KernelBuilder& m_b;
  const bool m_conv;
  Args m_args;
  Twin m_raw_x, m_out, m_raw_y, m_loss, m_lbl;
  uint64_t m_xw = 0, m_e = 0, m_yw = 0, m_acc = 0, m_d0 = 0, m_d1 = 0, m_d2 = 0, m_rep = 0;
  uint64_t m_scratch = 0, m_alt = 0, m_rep_lbl = 0, m_span = 0, m_bits = 0, m_bits2 = 0;
  SparseConsts m_consts;
};

Launch build_rows(const Spec& s, const RowsPlan& p, const ChipConfig& cfg) {
  return RowsEmitter(s, p, cfg).build();
}

// ---- long rows resident one at a time (Softmax, LogSoftmax) ----

// A row that fits the UB on its own (with both copies) but not 16 at a time: one GM read and
// one write per row instead of the streamed kernel's three reads. Per row (one PingPong step):
// load, widen, max and sum folded in halves into one 64-lane slot (fold_into_slot: a few
// counter-mode instructions, not one per 64-lane span), the per-row values replicated to a
// block and applied with block stride 0 over the row.
//
// Rows of whole 32-byte blocks start on a block in GM and are loaded and stored as they are.
// A row whose bytes are not whole blocks (ragged) starts inside a block: it is loaded from the
// block holding its first element, so its a < og head lanes in the UB are the previous row's
// tail (og = elements per block); those lanes are set to -inf before the maximum (exp gives 0
// there: they add nothing to the sum) and, in the output, replaced by the previous row's last
// partial block (carry), so every output block is written whole and once. A block's rows are
// any range (spread over all vector cores); a block whose first row starts inside a block
// first computes the row before it without storing it (for its last partial block), and leaves
// its own last row's partial block to the next block, which does the same; the tensor's last
// row stores its partial block (the bytes past the tensor's end are the buffer's padding).
struct LongRowPlan {
  BlockSplit split;
  bool ragged = false;        // rows of C elements are not whole 32-byte blocks
  bool row_broadcast = true;  // row values applied from a broadcast row (row_broadcast())
  bool single_buffer = true;  // one copy of the loaded and output rows (single_buffer())
};

// The long-rows kernel's buffers (fixed: one row). Double-buffered (PingPong, one step per
// row): the loaded row and the output row have a ping and a pong copy; x (widened, or the
// loaded copy itself for f32) and e are V's. Single-buffered: one copy of each, and x is a
// buffer of its own for f32 too (the shifted row, so that the loaded copy is free after the
// subtract). Ragged rows take up to og - 1 head lanes and the block after the row's last lane
// (carry's source) more.
struct LongRowBuffers {
  BufferPlan plan;
  BufferPlan::Id raw_x, xw, e, out, acc, d, d2, rep, scratch, alt, carry;
};

LongRowBuffers long_row_buffers(const Spec& s, bool ragged, bool single_buffer) {
  LongRowBuffers r;
  BufferPlan& p = r.plan;
  const int64_t lanes = s.C + (ragged ? 2 * (kBlock / s.size()) : 0);
  // The f32 rows (x: the widened copy, or the loaded one for f32) padded to whole 128-lanes.
  const int64_t f32_bytes = round_up(lanes, 2 * kLanes32) * kLaneBytes;
  const bool conv = s.t != Dtype::F32;
  const int copies = single_buffer ? 1 : 2;
  r.raw_x = p.add_sized("features row", fixed_blocks(conv ? lanes * s.size() : f32_bytes), copies);
  r.xw = p.add_sized(conv ? "widened row" : "shifted row", fixed_blocks(f32_bytes), 1,
                     conv || single_buffer);
  r.e = p.add_sized("exponentials / fold scratch", fixed_blocks(f32_bytes));
  r.out = p.add_sized("output row", fixed_blocks(lanes * s.size()), copies);
  r.acc = p.add_fixed("lane slot", kSlotBytes);
  r.d = p.add_fixed("row value", kBlock);
  r.d2 = p.add_fixed("lanes_reduce scratch", kBlock);
  // replicate_rows writes a whole group of 8 row blocks even for one row.
  r.rep = p.add_fixed("replicated row value", replicated_bytes(1));
  r.scratch = p.add_fixed("replicate scratch", replicate_scratch_bytes(1));
  r.alt = p.add_fixed("alternating pattern", alt_pattern_bytes(1));
  r.carry = p.add_fixed("previous row's last block", kBlock, 1, ragged);
  declare_repeat_overhang(p);
  return r;
}

// A lowering switch NAME read at every compile of an op it applies to: unset, empty or "1" is
// on, "0" off; anything else is a CompileError naming op.
bool softmax_switch_on(const OpDesc& op, const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v || std::string_view(v) == "1") return true;
  if (std::string_view(v) == "0") return false;
  op.fail(fmt::format("{}='{}' is neither '0' nor '1'", name, v));
}

// Whether ragged rows that fit the UB take the long-rows kernel: unless
// NPUSIM_SOFTMAX_RAGGED_RESIDENT=0 (the streamed kernel, for comparison; plan_long_rows on
// ragged rows).
bool ragged_rows_resident(const OpDesc& op) {
  return softmax_switch_on(op, "NPUSIM_SOFTMAX_RAGGED_RESIDENT");
}

// Whether the long-rows kernel applies a row's max / sum from a broadcast row (the value written
// onto every lane of a row-sized buffer first, then a dense vsub / vdiv, as CANN's SoftmaxV2
// schedules its last-axis broadcasts: a stage of their own) rather than from the value's
// 32-byte block read with block stride 0 (NPUSIM_SOFTMAX_ROW_BROADCAST=0, for comparison).
bool row_broadcast(const OpDesc& op) {
  return softmax_switch_on(op, "NPUSIM_SOFTMAX_ROW_BROADCAST");
}

// Whether the long-rows kernel runs single-buffered, as CANN's SoftmaxV2 does on the 910B (its
// dynamic norm tiling never enables double buffering): one copy of the loaded and the output
// row; row t + 1 is loaded once row t's last reader of the loaded row is done, where CANN's
// compute (softmax_v2.py) last reads its input: bf16 the cast to f32, f16 and f32 the subtract
// of the maximum; row t + 1's outputs are written once row t's are stored. Unless
// NPUSIM_SOFTMAX_SINGLE_BUFFER=0: ping and pong copies, row t + 1 loaded while row t computes.
bool single_buffer(const OpDesc& op) {
  return softmax_switch_on(op, "NPUSIM_SOFTMAX_SINGLE_BUFFER");
}

std::optional<LongRowPlan> plan_long_rows(const Spec& s, const ChipConfig& cfg,
                                          const OpDesc& op) {
  if (s.xent()) return std::nullopt;
  LongRowPlan p;
  p.ragged = (s.C * s.size()) % kBlock != 0;
  p.row_broadcast = row_broadcast(op);
  p.single_buffer = single_buffer(op);
  // A ragged row's head lanes must all be the previous row's: C >= og.
  if (p.ragged && (s.C < kBlock / s.size() || !ragged_rows_resident(op))) return std::nullopt;
  const VectorCores cores = VectorCores::of(cfg);
  if (long_row_buffers(s, p.ragged, p.single_buffer).plan.fit(cfg, cores.kind, 1, 1) == 0)
    return std::nullopt;
  p.split = BlockSplit::make(s.rows, cores.count);
  return p;
}

// The long-rows kernel: one row per PingPong step (pipelined over the block's rows).
class LongRowEmitter {
 public:
  LongRowEmitter(const Spec& s, const LongRowPlan& p, const ChipConfig& cfg)
      : m_s(s), m_p(p),
        m_k(fmt::format("{}_long_rows", s.op.substr(0, s.op.find('('))), s.op, cfg),
        m_b(m_k.b()), m_conv(s.t != Dtype::F32), m_og(kBlock / s.size()) {}

  Launch build() {
    KernelBuilder& b = m_b;
    const int64_t C = m_s.C, sz = m_s.size();
    m_args = declare_args(m_k, m_s);
    const LongRowBuffers bufs = long_row_buffers(m_s, m_p.ragged, m_p.single_buffer);
    const BufferPlan::Placed at = m_k.allocate(bufs.plan, 1);
    take_twins(at, {{&m_raw_x, bufs.raw_x}, {&m_out, bufs.out}});
    take_buffers(at, {{&m_xw, bufs.xw}, {&m_e, bufs.e}, {&m_acc, bufs.acc}, {&m_d, bufs.d},
                      {&m_d2, bufs.d2}, {&m_rep, bufs.rep}, {&m_scratch, bufs.scratch},
                      {&m_alt, bufs.alt}, {&m_carry, bufs.carry}});
    fill_alt_pattern(b, m_alt, 1);
    PingPong& sync = m_k.start_pingpong();
    Reg r = b.reg("row"), end = b.reg("end of this block's rows");
    m_k.block_range(r, end, m_p.split.per, m_s.rows);
    if (m_p.ragged) {
      m_r = &r;
      build_ragged(end);
    } else {
      Reg n = b.reg_imm("row lanes", C), one = b.reg_imm("one row", 1);
      m_n = &n;
      m_one = &one;
      Reg steps = b.reg("rows of this block"), gm = b.reg("row address");
      Reg blocks = b.reg_imm("row blocks", C * sz / kBlock);
      b.sub(steps, end, r);
      // Step t: row r + t.
      sync.pipeline(
          steps,
          [&](const Reg& t, int step_copy) {
            const int q = copy_of(step_copy);
            b.add(gm, r, t);
            b.mul_add(gm, gm, C * sz, m_args.x);
            sync.wait_load_free(q);
            b.emit(Opcode::op_copy_gm2ub, {m_raw_x[q], gm, 1, blocks, 0, 0}, "features row");
            sync.load_done(q);
          },
          [&](const Reg& t, int step_copy) {
            const int q = copy_of(step_copy);
            const uint64_t result = compute(q);
            to_output(q, result);
            sync.out_ready(q);
            b.add(gm, r, t);
            b.mul_add(gm, gm, C * sz, m_args.y);
            b.emit(Opcode::op_copy_ub2gm, {gm, m_out[q], 1, blocks, 0, 0}, "output row");
            sync.stored(q);
          });
    }
    return m_k.finish(m_p.split.block_dim,
                      fmt::format("{}: {} rows of {} {}, {} blocks of {} rows, one row resident "
                                  "at a time{}, {}-buffered{}",
                                  b.op(), m_s.rows, C, isa::dtype_name(m_s.t),
                                  m_p.split.block_dim, m_p.split.per,
                                  m_p.ragged ? " (rows inside blocks)" : "",
                                  m_p.single_buffer ? "single" : "double",
                                  m_p.row_broadcast ? ", row values broadcast" : ""));
  }

 private:
  // The registers of ragged row `row`: its first element `start`, the block start w holding
  // it, its head lanes a = start - w and the lanes n = a + C from w to the row's end.
  struct RaggedRow {
    Reg row, start, w, a, n;
    RaggedRow(KernelBuilder& b, const Reg& first, const Reg& t, int64_t C, int64_t og)
        : row(b.reg("row")), start(b.reg("row's first element")),
          w(b.reg("its block's first element")), a(b.reg("head lanes")),
          n(b.reg("lanes to the row's end")) {
      b.add(row, first, t);
      b.mul(start, row, C);
      b.and_(w, start, -og);
      b.sub(a, start, w);
      b.add(n, a, C);
    }
  };

  // Ragged rows: step t is row first + t, first = r - 1 where row r starts inside a block (that
  // row is computed for its last partial block only).
  void build_ragged(const Reg& end) {
    KernelBuilder& b = m_b;
    PingPong& sync = m_k.sync();
    const int64_t C = m_s.C, sz = m_s.size();
    Reg one = b.reg_imm("one row", 1);
    m_one = &one;
    Reg first = b.reg("first row computed"), steps = b.reg("rows computed");
    b.mul(first, *m_r, C);
    b.and_(first, first, m_og - 1);
    b.min(first, first, 1);  // 1 if row r starts inside a block
    b.sub(first, *m_r, first);
    b.sub(steps, end, first);
    sync.pipeline(
        steps,
        [&](const Reg& t, int step_copy) {
          const int q = copy_of(step_copy);
          const RaggedRow rr(b, first, t, C, m_og);
          Reg gm = b.reg("row's block address"), blocks = b.reg("row blocks");
          b.mul_add(gm, rr.w, sz, m_args.x);
          count_blocks(b, blocks, rr.n, sz);
          sync.wait_load_free(q);
          b.emit(Opcode::op_copy_gm2ub, {m_raw_x[q], gm, 1, blocks, 0, 0}, "features row");
          sync.load_done(q);
        },
        [&](const Reg& t, int step_copy) {
          const int q = copy_of(step_copy);
          const RaggedRow rr(b, first, t, C, m_og);
          m_n = &rr.n;
          m_a = &rr.a;
          const uint64_t result = compute(q);
          to_output(q, result);
          // The head lanes are the previous row's tail (its last partial block); this row's
          // last partial block is kept for the next row, stored only at the tensor's end.
          vec_copy_bits(b, sz, m_out[q], m_carry, rr.a);
          Reg blocks = b.reg("whole blocks to store"), src = b.reg("last partial block");
          b.shr(blocks, rr.n, ceil_log2(m_og));
          b.mul_add(src, blocks, kBlock, static_cast<int64_t>(m_out[q]));
          vec_copy_bits(b, sz, m_carry, src, m_og);
          b.if_(eq(rr.row, m_s.rows - 1), [&] { count_blocks(b, blocks, rr.n, sz); });
          sync.out_ready(q);
          b.if_(ge(rr.row, *m_r), [&] {  // not the row before the block's first
            Reg gm = b.reg("row's block address");
            b.mul_add(gm, rr.w, sz, m_args.y);
            b.emit(Opcode::op_copy_ub2gm, {gm, m_out[q], 1, blocks, 0, 0}, "output row");
          });
          sync.stored(q);
        });
  }

  // The f32 results at `result` in the output type in output copy q (V waits for it first).
  void to_output(int q, uint64_t result) {
    KernelBuilder& b = m_b;
    m_k.sync().wait_out_free(q);
    if (m_conv) vec_convert(b, m_s.t, Dtype::F32, m_out[q], result, RoundMode::kRint, *m_n);
    else vec_copy_bits(b, kLaneBytes, m_out[q], result, *m_n);
    if (!m_conv && !m_p.single_buffer) m_k.sync().release_load(q);
  }

  // The buffer copy and flags of a pipeline step whose copy is step_copy (t & 1): copy 0 for
  // every step when single-buffered.
  int copy_of(int step_copy) const { return m_p.single_buffer ? 0 : step_copy; }

  // The f32 results of the row in load copy q: returns their UB address (e or x).
  // Folds read whole 128-lane pairs of repeats: lanes [n, P) of the row's f32 buffers
  // (P = n rounded up to 128 lanes) are padded with the reduction's identity, so each row value
  // is one out-of-place halving into a scratch buffer and a fold there (row_value), with no copy
  // of the row first.
  uint64_t compute(int q) {
    KernelBuilder& b = m_b;
    const Reg &n = *m_n, &one = *m_one;
    // x0: the f32 row the maximum is taken over (the widened copy, or the loaded one for f32);
    // x: the shifted row (x0 itself, but a buffer of its own for single-buffered f32, whose
    // loaded copy is released after the subtract).
    const uint64_t x0 = m_conv ? m_xw : m_raw_x[q], e = m_e;
    const uint64_t x = m_conv || !m_p.single_buffer ? x0 : m_xw;
    // Single-buffered: the loaded copy is free after its last reader in CANN's compute (the
    // cast for bf16, the subtract for f16 and f32; single_buffer()).
    const bool free_after_cast = !m_p.single_buffer || m_s.t == Dtype::BF16;
    Reg p = b.reg("lanes in whole 128-lane pairs");
    b.add(p, n, 2 * kLanes32 - 1);
    b.and_(p, p, -2 * kLanes32);
    m_k.sync().wait_loaded(q);
    if (m_conv) {
      vec_convert(b, Dtype::F32, m_s.t, x0, m_raw_x[q], RoundMode::kRint, n);
      if (free_after_cast) m_k.sync().release_load(q);
    }
    {
      KernelBuilder::Origin o(b, "row maximum");
      // -inf: ragged rows' head lanes (the previous row's) and the lanes past the row's end,
      // out of the maximum; exp turns them into 0, out of the sum.
      const int64_t minus_inf = combine_identity_bits(Combine::kMax, Dtype::F32);
      if (m_p.ragged) vec_fill32(b, x0, minus_inf, *m_a);
      pad_lanes(x0, minus_inf, p);
      row_value(Combine::kMax, x0, e, p);
      replicate_rows(b, m_d, one, m_rep, m_scratch, m_alt);
    }
    KernelBuilder::Origin o(b, "shifted, exponentials, their sum");
    with_row_value(Opcode::op_vsub, x, x0, p, e);  // e: free after the maximum's fold
    if (m_p.single_buffer && !free_after_cast) m_k.sync().release_load(q);
    vec_unary(b, Opcode::op_vexp, Dtype::F32, e, x, p);
    if (m_s.kind == Kind::kSoftmax) {
      row_value(Combine::kSum, e, x, p);  // shifted no longer needed
      replicate_rows(b, m_d, one, m_rep, m_scratch, m_alt);
      with_row_value(Opcode::op_vdiv, e, e, n, x);
      return e;
    }
    row_value(Combine::kSum, e, e, p);
    vec_unary(b, Opcode::op_vln, Dtype::F32, m_d, m_d, one);
    replicate_rows(b, m_d, one, m_rep, m_scratch, m_alt);
    with_row_value(Opcode::op_vsub, x, x, n, e);  // e: folded in place, free
    return x;
  }

  // Lanes [n, p) of buf = bits (32-bit lanes): the last partial 64-lane repeat under a lane
  // mask, then whole repeats in counter mode.
  void pad_lanes(uint64_t buf, int64_t bits, const Reg& p) {
    KernelBuilder& b = m_b;
    const Reg& n = *m_n;
    Reg k = b.reg("row lanes in the last partial repeat"), at = b.reg("pad address");
    b.and_(k, n, kLanes32 - 1);
    b.if_(ne(k, 0), [&] {
      Reg mask = b.reg_imm("lanes k .. 63", -1);
      b.shl(mask, mask, k);
      b.sub(at, n, k);
      b.mul_add(at, at, kLaneBytes, static_cast<int64_t>(buf));
      b.emit(Opcode::op_set_mask, {0, mask});
      b.emit(Opcode::op_vdup, {Dtype::S32, at, static_cast<int64_t>(static_cast<int32_t>(bits)),
                               1, 1, 8});
    });
    Reg whole = b.reg("pad lanes in whole repeats");
    b.add(at, n, kLanes32 - 1);
    b.and_(at, at, -kLanes32);
    b.sub(whole, p, at);
    b.mul_add(at, at, kLaneBytes, static_cast<int64_t>(buf));
    vec_fill32(b, at, bits, whole);
  }

  // dst lanes [0, count) = op(src lanes, the row's value in m_rep's block). Row broadcast
  // (m_p.row_broadcast): lanes [0, count) of `free` (a row-sized f32 buffer not otherwise live)
  // = the value first (the block widened to a repeat in the lane slot by one vcopy, then one
  // vcopy of count lanes reading that repeat with repeat stride 0: 8 banks per repeat), and op
  // reads both operands densely. Otherwise op reads the block itself with block and repeat
  // stride 0 (one UB bank 8 times per repeat).
  void with_row_value(Opcode op, uint64_t dst, uint64_t src, const Reg& count, uint64_t free) {
    KernelBuilder& b = m_b;
    if (!m_p.row_broadcast) {
      b.emit(Opcode::op_set_mask_count, {count});
      vec_binary_strided(b, op, Dtype::F32, VOperand(dst), VOperand(src), VOperand(m_rep, 0, 0),
                         0);
      return;
    }
    KernelBuilder::Origin o(b, "the row's value broadcast onto a row");
    widen_rows(b, m_rep, *m_one, m_acc);
    b.emit(Opcode::op_set_mask_count, {count});
    vec_unary_strided(b, Opcode::op_vcopy, Dtype::S32, VOperand(free), VOperand(m_acc, 1, 0), 0);
    vec_binary(b, op, Dtype::F32, dst, src, free, count);
  }
  // The row's combination of lanes [0, p) of src (p a multiple of 128, identity-padded) -> d:
  // scratch [0, p/2) = op(the halves of src), folded into the lane slot (src kept unless it is
  // scratch).
  void row_value(Combine c, uint64_t src, uint64_t scratch, const Reg& p) {
    KernelBuilder& b = m_b;
    Reg h = b.reg("half"), hi = b.reg("upper half");
    b.shr(h, p, 1);
    b.mul_add(hi, h, kLaneBytes, static_cast<int64_t>(src));
    vec_binary(b, combine_opcode(c), Dtype::F32, scratch, src, hi, h);
    vec_fill32(b, m_acc, combine_identity_bits(c, Dtype::F32), kLanes32);
    fold_into_slot(b, c, Dtype::F32, scratch, h, m_acc);
    lanes_reduce(b, c, Dtype::F32, m_acc, *m_one, m_d, m_d2);
  }

  const Spec& m_s;
  const LongRowPlan& m_p;
  RowKernel m_k;
  KernelBuilder& m_b;
  const bool m_conv;
  const int64_t m_og;  // elements per 32-byte block
  Args m_args;
  Twin m_raw_x, m_out;
  uint64_t m_xw = 0, m_e = 0, m_acc = 0, m_d = 0, m_d2 = 0, m_rep = 0, m_scratch = 0, m_alt = 0;
  uint64_t m_carry = 0;
  const Reg* m_n = nullptr;    // the row's lanes from the first loaded (C, or a + C ragged)
  const Reg* m_a = nullptr;    // ragged: the head lanes (the previous row's)
  const Reg* m_one = nullptr;  // 1
  const Reg* m_r = nullptr;    // ragged: the block's first row
};

Launch build_long_rows(const Spec& s, const LongRowPlan& p, const ChipConfig& cfg) {
  return LongRowEmitter(s, p, cfg).build();
}

// ---- long rows, streamed (three passes per row) ----

struct StreamPlan {
  int64_t group = 0;  // rows per group (whole loss blocks)
  int64_t chunk = 0;  // lanes per chunk / window (multiple of 64)
  BlockSplit split;
};

// The streamed kernel's buffers; units: lanes per chunk, for groups of G rows. Double-buffered
// (PingPong): chunks / windows alternate between two copies of what MTE2 loads (load parity),
// output windows and losses between two copies of what MTE3 stores (output parity).
struct StreamBuffers {
  BufferPlan plan;
  BufferPlan::Id raw_x, xw, e, out_w, raw_y, yw, t, acc, dm, ds, dl, d2;
  BufferPlan::Id rep_m, rep_s, rep_l, rep_a, scratch, alt, loss, carry;
  BufferPlan::Id lbl, bits_a, bits_b, addv, rep_v, iota, bits;  // sparse labels
  SparseConstIds consts;
};

StreamBuffers stream_buffers(const Spec& s, int64_t G) {
  StreamBuffers r;
  BufferPlan& p = r.plan;
  const bool conv = s.t != Dtype::F32, sparse = s.kind == Kind::kSparseXent;
  const bool xent = s.kind == Kind::kXent;
  auto rows = [G](int64_t bytes) { return fixed_blocks(G * bytes); };
  r.raw_x = p.add_sized("features chunk", blocks_of(s.size()), 2);
  r.xw = p.add_sized("widened", blocks_of(kLaneBytes), 1, conv);
  r.e = p.add_sized("exponentials / results", blocks_of(kLaneBytes));
  r.out_w = p.add_sized("output window", blocks_of(s.size()), 2);
  r.raw_y = p.add_sized("labels window", blocks_of(s.size()), 2, xent);
  r.yw = p.add_sized("widened labels", blocks_of(kLaneBytes), 1, xent && conv);
  r.t = p.add_sized("loss terms", blocks_of(kLaneBytes), 1, s.xent());
  r.acc = p.add_sized("lane slots", rows(kSlotBytes));
  r.dm = p.add_sized("row maxima", rows(kLaneBytes));
  r.ds = p.add_sized("row sums", rows(kLaneBytes));
  r.dl = p.add_sized("log of the row sums", rows(kLaneBytes));
  r.d2 = p.add_sized("row values", rows(kLaneBytes));
  // replicate_rows writes whole groups of 8 row blocks (G is a multiple of 8 here).
  const BufferPlan::SizeFn rep = fixed_blocks(static_cast<int64_t>(replicated_bytes(G)));
  r.rep_m = p.add_sized("maxima blocks", rep);
  r.rep_s = p.add_sized("sum blocks", rep);
  r.rep_l = p.add_sized("log-sum blocks", rep);
  r.rep_a = p.add_sized("label blocks", rep);
  r.scratch = p.add_fixed("replicate scratch", replicate_scratch_bytes(G));
  r.alt = p.add_fixed("alternating pattern", alt_pattern_bytes(G));
  r.loss = p.add_sized("loss", rows(s.size()), 2);
  r.carry = p.add_fixed("previous row's last block", kBlock);
  r.lbl = p.add_sized("labels", rows(kLaneBytes), 2, sparse);
  r.bits_a = p.add_sized("compare bits", rows(8), 1, sparse);
  r.bits_b = p.add_sized("compare bits 2", rows(8), 1, sparse);
  r.addv = p.add_sized("NaN for invalid labels", rows(kLaneBytes), 1, sparse);
  r.rep_v = p.add_sized("NaN blocks", rep, 1, sparse);
  r.iota = p.add_sized("lane indices", blocks_of(kLaneBytes), 1, sparse);
  r.bits = p.add_sized("one-hot bits", [](int64_t lanes) { return rnd(lanes / 8); }, 1, sparse);
  r.consts = declare_sparse_consts(p, sparse);
  declare_repeat_overhang(p);
  return r;
}

// The largest chunk the streamed kernel uses: the window size its cycles were measured with
// (the UB shared out as if every per-lane buffer existed and every buffer took 32 bytes more).
// A tuning cap, not a budget: fit() decides what fits. Exact fits give larger windows that
// move these launches' cycles by several percent either way (fewer windows against less
// overlap of a row's first load and last store, and other UB bank conflicts).
int64_t stream_chunk_cap(const Spec& s, const ChipConfig& cfg) {
  const int64_t G = std::max<int64_t>(SuperRowLayout::make(s.C, kBlock / s.size()).rows,
                                      kBlock / s.size());
  int64_t fixed = 0, buffers = 0;
  auto add = [&](int64_t bytes) {
    fixed += rnd(bytes);
    ++buffers;
  };
  add(G * kSlotBytes);
  add(G * kLaneBytes * 4);
  add(G * kBlock * 4);
  add(static_cast<int64_t>(replicate_scratch_bytes(G)));
  add(static_cast<int64_t>(alt_pattern_bytes(G)));
  add(G * s.size());
  add(G * s.size());
  add(kBlock);
  if (s.kind == Kind::kSparseXent) add(5 * kSlotBytes + 2 * G * 8 + 2 * G * kLaneBytes);
  int64_t per_lane = 2 * s.size() + 3 * kLaneBytes + 2 * s.size();
  if (s.kind == Kind::kXent) per_lane += 2 * s.size() + 2 * kLaneBytes;
  if (s.kind == Kind::kSparseXent) per_lane += 2 * kLaneBytes + 1;
  const int64_t ub =
      static_cast<int64_t>(cfg.core_kind(VectorCores::of(cfg).kind)->capacity(Buf::UB));
  return (ub - fixed - (buffers + 8) * kBlock) / per_lane / kLanes32 * kLanes32;
}

std::optional<StreamPlan> plan_stream(const Spec& s, const ChipConfig& cfg) {
  const VectorCores cores = VectorCores::of(cfg);
  StreamPlan p;
  const int64_t granule = kBlock / s.size();
  const int64_t g = SuperRowLayout::make(s.C, granule).rows;
  const int64_t q = std::max<int64_t>(g, granule);
  p.split = BlockSplit::make(s.rows, cores.count, q);
  p.group = q;
  const int64_t fit = stream_buffers(s, p.group)
                          .plan.fit(cfg, cores.kind, kLanes32,
                                    std::min(round_up(s.C + granule, kLanes32),
                                             stream_chunk_cap(s, cfg)));
  if (fit < kLanes32) return std::nullopt;
  p.chunk = fit;
  return p;
}

// The streamed kernel: groups of G rows (RowKernel::streamed_groups), each row read in chunks in
// three passes (maxima, sums of exponentials, outputs window by window).
class StreamEmitter {
 public:
  StreamEmitter(const Spec& s, const StreamPlan& p, const ChipConfig& cfg)
      : m_s(s), m_p(p),
        m_k(fmt::format("{}_streamed", s.op.substr(0, s.op.find('('))), s.op, cfg),
        m_b(m_k.b()), m_conv(s.t != Dtype::F32), m_sz(s.size()), m_og(kBlock / s.size()),
        m_T(p.chunk) {}

  Launch build() {
    m_args = declare_args(m_k, m_s);
    const StreamBuffers bufs = stream_buffers(m_s, m_p.group);
    const BufferPlan::Placed at = m_k.allocate(bufs.plan, m_T);
    take_twins(at, {{&m_raw_x, bufs.raw_x}, {&m_out_w, bufs.out_w}, {&m_raw_y, bufs.raw_y},
                    {&m_loss, bufs.loss}, {&m_lbl, bufs.lbl}});
    take_buffers(at, {{&m_xw, bufs.xw}, {&m_e, bufs.e}, {&m_yw, bufs.yw}, {&m_t, bufs.t},
                      {&m_acc, bufs.acc}, {&m_dm, bufs.dm}, {&m_ds, bufs.ds}, {&m_dl, bufs.dl},
                      {&m_d2, bufs.d2}, {&m_rep_m, bufs.rep_m}, {&m_rep_s, bufs.rep_s},
                      {&m_rep_l, bufs.rep_l}, {&m_rep_a, bufs.rep_a}, {&m_scratch, bufs.scratch},
                      {&m_alt, bufs.alt}, {&m_carry, bufs.carry}, {&m_bits_a, bufs.bits_a},
                      {&m_bits_b, bufs.bits_b}, {&m_addv, bufs.addv}, {&m_rep_v, bufs.rep_v},
                      {&m_iota, bufs.iota}, {&m_bits, bufs.bits}});
    if (m_s.kind == Kind::kSparseXent) {
      m_consts = fill_sparse_consts(m_b, at, bufs.consts, m_s.C);
      fill_lane_indices();
    }
    fill_alt_pattern(m_b, m_alt, m_p.group);
    m_k.start_pingpong();
    m_k.streamed_groups(m_p.split, m_s.rows, m_p.group,
                        [this](const Reg& r0, const Reg& rend, const Reg& rows) {
                          group(r0, rend, rows);
                        });
    return m_k.finish(m_p.split.block_dim,
                      fmt::format("{}: {} rows of {} {}, {} blocks of {} rows, windows of {} "
                                  "lanes, groups of {} rows, double-buffered",
                                  m_b.op(), m_s.rows, m_s.C, isa::dtype_name(m_s.t),
                                  m_p.split.block_dim, m_p.split.per, m_T, m_p.group));
  }

 private:
  // The registers of one output window of row j: lanes [w, w + n) of the tensor, the row's
  // lanes from a on (the head belongs to the previous row).
  struct Window {
    const Reg &j, &start, &w, &rowend, &a, &n, &slot, &last_row;
  };

  // iota = s32 0 .. T-1 (the sparse labels' one-hot compares).
  void fill_lane_indices() {
    KernelBuilder::Origin o(m_b, "lane indices 0..T-1");
    vec_copy_bits(m_b, kLaneBytes, m_iota, m_consts.iota64, kLanes32);
    for (int64_t h = kLanes32; h < m_T; h *= 2) {
      Reg v = m_b.reg_imm("offset", h), cnt = m_b.reg_imm("lanes", std::min(h, m_T - h));
      vec_scalar(m_b, Opcode::op_vadds, Dtype::S32,
                 m_iota + static_cast<uint64_t>(h * kLaneBytes), m_iota, v, cnt);
    }
  }

  // Rows r0 .. r0 + rows - 1 (rend: the end of the block's rows).
  void group(const Reg& r0, const Reg& rend, const Reg& rows) {
    m_r0 = &r0;
    m_rend = &rend;
    m_rows = &rows;
    {
      KernelBuilder::Origin o(m_b, "pass 1: row maxima");
      fill_slots(combine_identity_bits(Combine::kMax, Dtype::F32));
      row_pass(Combine::kMax, [](uint64_t, const Reg&, const Reg&) {});
      lanes_reduce(m_b, Combine::kMax, Dtype::F32, m_acc, rows, m_dm, m_d2);
      replicate(m_dm, m_rep_m);
    }
    {
      KernelBuilder::Origin o(m_b, "pass 2: sums of exp(x - max)");
      fill_slots(0);
      row_pass(Combine::kSum, [&](uint64_t x, const Reg& j, const Reg& n) {
        with_row_value(Opcode::op_vsub, x, x, j, m_rep_m, n);
        vec_unary(m_b, Opcode::op_vexp, Dtype::F32, x, x, n);
      });
      lanes_reduce(m_b, Combine::kSum, Dtype::F32, m_acc, rows, m_ds, m_d2);
      vec_unary(m_b, Opcode::op_vln, Dtype::F32, m_dl, m_ds, rows);
      replicate(m_ds, m_rep_s);
      replicate(m_dl, m_rep_l);
    }
    if (m_s.kind == Kind::kSparseXent) sparse_labels();
    output_pass();
    if (m_s.xent()) store_loss();
  }

  uint64_t x_of(int q) const { return m_conv ? m_xw : m_raw_x[q]; }
  uint64_t y_of(int q) const {
    return m_s.kind != Kind::kXent ? 0 : m_conv ? m_yw : m_raw_y[q];
  }
  void fill_slots(int64_t bits32) {
    Reg n = m_b.reg("slot lanes");
    m_b.mul(n, *m_rows, kLanes32);
    vec_fill32(m_b, m_acc, bits32, n);
  }
  void replicate(uint64_t d, uint64_t to) {
    replicate_rows(m_b, d, *m_rows, to, m_scratch, m_alt);
  }

  // x_of(q) (f32) = the n features at GM element `elem` (loaded into copy q at the UB block
  // start). With widening, copy q is released here (release(): whether it was).
  void load(int q, const Reg& elem, const Reg& n, bool labels_too) {
    KernelBuilder& b = m_b;
    PingPong& sync = m_k.sync();
    sync.wait_load_free(q);
    Reg src = b.reg("source"), blocks = b.reg("blocks");
    count_blocks(b, blocks, n, m_sz);
    b.mul_add(src, elem, m_sz, m_args.x);
    b.emit(Opcode::op_copy_gm2ub, {m_raw_x[q], src, 1, blocks, 0, 0}, "features");
    if (labels_too) {
      b.mul_add(src, elem, m_sz, m_args.labels);
      b.emit(Opcode::op_copy_gm2ub, {m_raw_y[q], src, 1, blocks, 0, 0}, "labels");
    }
    sync.loaded(q);
    if (m_conv) {
      vec_convert(b, Dtype::F32, m_s.t, m_xw, m_raw_x[q], RoundMode::kRint, n);
      if (labels_too) vec_convert(b, Dtype::F32, m_s.t, m_yw, m_raw_y[q], RoundMode::kRint, n);
      sync.release_load(q);
    }
  }
  void release(int q) {
    if (!m_conv) m_k.sync().release_load(q);
  }

  // lanes [0, n) of dst = op(lanes of src, the row's replicated value (block at rep + j * 32)).
  void with_row_value(Opcode op, uint64_t dst, uint64_t src, const Reg& j, uint64_t rep,
                      const Reg& n, bool rep_first = false) {
    Reg ra = m_b.reg("row value block");
    m_b.mul_add(ra, j, kBlock, static_cast<int64_t>(rep));
    m_b.emit(Opcode::op_set_mask_count, {n});
    const VOperand v(ra, 0, 0), a(src);
    vec_binary_strided(m_b, op, Dtype::F32, VOperand(dst), rep_first ? v : a, rep_first ? a : v,
                       0);
  }

  // Passes 1 and 2: per row, chunks from the row's first element: chunk(x, j, n), then the n
  // lanes folded into row j's slot.
  void row_pass(Combine c,
                const std::function<void(uint64_t x, const Reg& j, const Reg& n)>& chunk) {
    KernelBuilder& b = m_b;
    Reg j = b.reg("row of the group");
    b.for_range(j, 0, *m_rows, 1, [&] {
      Reg start = b.reg("row start"), cpos = b.reg("chunk"), n = b.reg("chunk lanes");
      Reg slot = b.reg("slot"), elem = b.reg("element");
      b.add(start, *m_r0, j);
      b.mul(start, start, m_s.C);
      b.mul_add(slot, j, kSlotBytes, static_cast<int64_t>(m_acc));
      b.for_range(cpos, 0, m_s.C, m_T, [&] {
        b.movi(n, m_s.C);
        b.sub(n, n, cpos);
        b.min(n, n, m_T);
        b.add(elem, start, cpos);
        m_k.sync().load_step([&](int q) {
          load(q, elem, n, false);
          chunk(x_of(q), j, n);
          fold_into_slot(b, c, Dtype::F32, x_of(q), n, slot);
          release(q);
        });
      });
    });
  }

  // The group's labels, replicated per row (rep_a), and NaN for rows with a label outside
  // [0, C) (addv, replicated: rep_v).
  void sparse_labels() {
    KernelBuilder& b = m_b;
    PingPong& sync = m_k.sync();
    KernelBuilder::Origin o(b, "labels of the group");
    sync.load_step([&](int q) {
      sync.wait_load_free(q);
      Reg src = b.reg("source"), blocks = b.reg("blocks");
      count_blocks(b, blocks, *m_rows, kLaneBytes);
      b.mul_add(src, *m_r0, kLaneBytes, m_args.labels);
      b.emit(Opcode::op_copy_gm2ub, {m_lbl[q], src, 1, blocks, 0, 0}, "labels");
      sync.loaded(q);
      replicate(m_lbl[q], m_rep_a);
      label_validity(b, m_consts, m_lbl[q], *m_rows, m_bits_a, m_bits_b, m_addv);
      replicate(m_addv, m_rep_v);
      sync.release_load(q);
    });
  }

  // Pass 3: per row, windows of T lanes from the row's first block.
  void output_pass() {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "pass 3: outputs, window by window");
    if (m_s.xent()) fill_slots(0);
    Reg j = b.reg("row of the group");
    b.for_range(j, 0, *m_rows, 1, [&] {
      Reg start = b.reg("row start"), w = b.reg("window"), rowend = b.reg("row end");
      Reg a = b.reg("row's first lane in the window"), n = b.reg("window lanes");
      Reg slot = b.reg("slot"), last_row = b.reg("last row of the block");
      b.add(start, *m_r0, j);
      b.add(last_row, start, 1);
      b.sub(last_row, last_row, *m_rend);  // 0 for the block's last row
      b.mul(start, start, m_s.C);
      b.add(rowend, start, m_s.C);
      b.mul_add(slot, j, kSlotBytes, static_cast<int64_t>(m_acc));
      b.and_(w, start, -m_og);
      const Window win{j, start, w, rowend, a, n, slot, last_row};
      b.for_range(w, w, rowend, m_T, [&] {
        b.sub(a, start, w);
        b.max(a, a, 0);
        b.sub(n, rowend, w);
        b.min(n, n, m_T);
        m_k.sync().load_step([&](int q) { window_outputs(win, q); });
        m_k.sync().out_step([&](int oq) { store_window(win, oq); });
      });
    });
  }

  // The window's outputs into e (f32); the Xent loss terms folded into the row's slot.
  void window_outputs(const Window& win, int q) {
    KernelBuilder& b = m_b;
    const uint64_t x = x_of(q), y = y_of(q), e = m_e, t = m_t;
    const Reg &j = win.j, &n = win.n;
    load(q, win.w, n, m_s.kind == Kind::kXent);
    with_row_value(Opcode::op_vsub, x, x, j, m_rep_m, n);  // shifted
    switch (m_s.kind) {
      case Kind::kSoftmax:
        vec_unary(b, Opcode::op_vexp, Dtype::F32, e, x, n);
        with_row_value(Opcode::op_vdiv, e, e, j, m_rep_s, n);
        break;
      case Kind::kLogSoftmax: with_row_value(Opcode::op_vsub, e, x, j, m_rep_l, n); break;
      case Kind::kXent:
        vec_unary(b, Opcode::op_vexp, Dtype::F32, e, x, n);
        with_row_value(Opcode::op_vdiv, e, e, j, m_rep_s, n);
        vec_binary(b, Opcode::op_vsub, Dtype::F32, e, e, y, n);
        with_row_value(Opcode::op_vsub, t, x, j, m_rep_l, n, true);
        vec_binary(b, Opcode::op_vmul, Dtype::F32, t, t, y, n);
        break;
      case Kind::kSparseXent: sparse_window(win, x); break;
    }
    if (m_s.xent()) {
      vec_fill32(b, t, 0, win.a);  // lanes of the previous row
      fold_into_slot(b, Combine::kSum, Dtype::F32, t, n, win.slot);
    }
    release(q);
  }

  // Sparse Xent: backprop e / sum - 1 on the label's lane (else e / sum), the loss term
  // ln(sum) - shifted there (else 0) in t; NaN rows for invalid labels.
  void sparse_window(const Window& win, uint64_t x) {
    KernelBuilder& b = m_b;
    const uint64_t e = m_e, t = m_t;
    const Reg &j = win.j, &n = win.n;
    vec_unary(b, Opcode::op_vexp, Dtype::F32, e, x, n);
    with_row_value(Opcode::op_vdiv, e, e, j, m_rep_s, n);
    Reg col = b.reg("column of lane 0"), la = b.reg("label block");
    b.sub(col, win.w, win.start);
    vec_scalar(b, Opcode::op_vadds, Dtype::S32, m_iota, m_iota, col, n);
    b.mul_add(la, j, kBlock, static_cast<int64_t>(m_rep_a));
    b.emit(Opcode::op_set_mask_count, {n});
    vec_compare_strided(b, Dtype::S32, isa::Cmp::EQ, m_bits, VOperand(m_iota), VOperand(la, 0, 0),
                        0);
    Reg neg = b.reg_imm("minus the column of lane 0", 0);
    b.sub(neg, neg, col);
    vec_scalar(b, Opcode::op_vadds, Dtype::S32, m_iota, m_iota, neg, n);
    // backprop - 1 and the loss term ln(sum) - shifted on the label's lane.
    Reg minus1 = b.reg_imm("-1.0", vector_scalar_bits(Dtype::F32, -1.0));
    vec_scalar(b, Opcode::op_vadds, Dtype::F32, t, e, minus1, n);
    vec_select_strided(b, Dtype::F32, VOperand(e), VOperand(t), VOperand(e), m_bits, 0);
    with_row_value(Opcode::op_vsub, t, x, j, m_rep_l, n, true);
    b.emit(Opcode::op_set_mask_count, {n});
    vec_select_strided(b, Dtype::F32, VOperand(t), VOperand(t), VOperand(m_consts.zero64, 1, 0),
                       m_bits, 0);
    with_row_value(Opcode::op_vadd, e, e, j, m_rep_v, n);  // NaN rows
  }

  // The window's outputs in the output type, whole blocks stored once: the head lanes come from
  // the previous row's last block (carry); a last block shared with the next row is kept.
  void store_window(const Window& win, int oq) {
    KernelBuilder& b = m_b;
    PingPong& sync = m_k.sync();
    const Reg& n = win.n;
    sync.wait_out_free(oq);
    const uint64_t ow = m_out_w[oq];
    if (m_conv) vec_convert(b, m_s.t, Dtype::F32, ow, m_e, RoundMode::kRint, n);
    else vec_copy_bits(b, kLaneBytes, ow, m_e, n);
    // The window's head lanes belong to the previous row: its last block, kept in carry.
    vec_copy_bits(b, m_sz, ow, m_carry, win.a);
    Reg blocks = b.reg("blocks to store"), rest = b.reg("lanes to the row end");
    count_blocks(b, blocks, n, m_sz);
    b.sub(rest, win.rowend, win.w);
    b.if_(lt(rest, m_T + 1), [&] {
      b.if_(ne(win.last_row, 0), [&] {
        // The row's last block is shared with the next row: keep it, store the rest.
        KernelBuilder::Origin oc(b, "keep the row's last partial block");
        Reg src = b.reg("last block");
        b.shr(blocks, n, ceil_log2(m_og));
        b.mul_add(src, blocks, kBlock, static_cast<int64_t>(ow));
        vec_copy_bits(b, m_sz, m_carry, src, m_og);
      });
    });
    sync.out_ready(oq);
    b.if_(ge(blocks, 1), [&] {
      Reg dst = b.reg("destination");
      b.mul_add(dst, win.w, m_sz, m_args.y);
      b.emit(Opcode::op_copy_ub2gm, {dst, ow, 1, blocks, 0, 0}, "output window");
    });
    sync.stored(oq);
  }

  // The loss of the group's rows: their slots reduced (plus NaN for invalid sparse labels).
  void store_loss() {
    KernelBuilder& b = m_b;
    PingPong& sync = m_k.sync();
    const Reg& rows = *m_rows;
    KernelBuilder::Origin o(b, "loss of the group's rows");
    sync.out_step([&](int oq) {
      sync.wait_out_free(oq);
      lanes_reduce(b, Combine::kSum, Dtype::F32, m_acc, rows, m_dm, m_d2);
      if (m_s.kind == Kind::kSparseXent)
        vec_binary(b, Opcode::op_vadd, Dtype::F32, m_dm, m_dm, m_addv, rows);
      if (m_conv) vec_convert(b, m_s.t, Dtype::F32, m_loss[oq], m_dm, RoundMode::kRint, rows);
      else vec_copy_bits(b, kLaneBytes, m_loss[oq], m_dm, rows);
      sync.out_ready(oq);
      Reg dst = b.reg("destination"), blocks = b.reg("blocks");
      b.mul_add(dst, *m_r0, m_sz, m_args.loss);
      count_blocks(b, blocks, rows, m_sz);
      b.emit(Opcode::op_copy_ub2gm, {dst, m_loss[oq], 1, blocks, 0, 0}, "loss");
      sync.stored(oq);
    });
  }

  const Spec& m_s;
  const StreamPlan& m_p;
  RowKernel m_k;
  KernelBuilder& m_b;
  const bool m_conv;
  const int m_sz;
  const int64_t m_og, m_T;
  Args m_args;
  // x / y: the widened copies (V's), or the loaded copy q itself for f32.
  Twin m_raw_x, m_out_w, m_raw_y, m_loss, m_lbl;
  uint64_t m_xw = 0, m_e = 0, m_yw = 0, m_t = 0, m_acc = 0, m_dm = 0, m_ds = 0, m_dl = 0;
  uint64_t m_d2 = 0, m_rep_m = 0, m_rep_s = 0, m_rep_l = 0, m_rep_a = 0, m_scratch = 0;
  uint64_t m_alt = 0, m_carry = 0, m_bits_a = 0, m_bits_b = 0, m_addv = 0, m_rep_v = 0;
  uint64_t m_iota = 0, m_bits = 0;
  SparseConsts m_consts;
  const Reg* m_r0 = nullptr;    // the group: first row,
  const Reg* m_rend = nullptr;  // end of the block's rows,
  const Reg* m_rows = nullptr;  // rows in the group (= lane slots)
};

Launch build_stream(const Spec& s, const StreamPlan& p, const ChipConfig& cfg) {
  return StreamEmitter(s, p, cfg).build();
}

// The launches of one softmax-family op on [rows, C] tensors at the given arguments (features,
// labels as the kernel takes them; outputs).
void append_softmax(LaunchPlan& plan, const CompileContext& ctx, const Spec& s,
                    const std::vector<ArgRef>& args) {
  const ChipConfig& cfg = ctx.cfg;
  if (auto p = plan_rows(s, cfg)) {
    plan.add(build_rows(s, *p, cfg), args);
    return;
  }
  if (auto p = plan_long_rows(s, cfg, ctx.op)) {
    plan.add(build_long_rows(s, *p, cfg), args);
    return;
  }
  if (auto p = plan_stream(s, cfg)) {
    plan.add(build_stream(s, *p, cfg), args);
    return;
  }
  ctx.op.fail(fmt::format("the buffers for rows of {} classes do not fit in the UB", s.C));
}

// A stream kernel copying `in` broadcast to `shape` (for Xent operands of different shapes).
Launch broadcast_copy(const std::string& op, const TensorDesc& in,
                      const std::vector<int64_t>& shape, const ChipConfig& cfg) {
  StreamSpec spec = cast_spec(in.dtype, in.dtype, false, shape);
  spec.kernel_name = fmt::format("BroadcastTo_{}", data_type_name(in.dtype));
  spec.inputs[0].view = broadcast_view(in.shape, shape);
  spec.inputs[0].shape = in.shape;
  return build_stream_kernel(op, spec, cfg);
}

}  // namespace

CompiledKernel compile_softmax(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  Spec s;
  s.op = op.str();
  if (op.type == "Softmax") s.kind = Kind::kSoftmax;
  else if (op.type == "LogSoftmax") s.kind = Kind::kLogSoftmax;
  else if (op.type == "SoftmaxCrossEntropyWithLogits") s.kind = Kind::kXent;
  else if (op.type == "SparseSoftmaxCrossEntropyWithLogits") s.kind = Kind::kSparseXent;
  else op.fail("internal: not a softmax op");
  const size_t want_inputs = s.xent() ? 2 : 1;
  if (op.inputs.size() != want_inputs)
    op.fail(fmt::format("takes {} input(s), {} given", want_inputs, op.inputs.size()));
  const TensorDesc& x = op.inputs[0];
  const DataType dt = x.dtype;
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the input's {}", data_type_name(*t),
                        data_type_name(dt)));
  if (!data_type_is_float(dt))
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16)", data_type_name(dt)));
  s.t = device_dtype(dt);
  const ArgRef in0 = LaunchPlan::input(0), in1 = LaunchPlan::input(1);
  const ArgRef out0 = LaunchPlan::output(0), out1 = LaunchPlan::output(1);
  if (!s.xent()) {
    if (x.shape.empty()) op.invalid("logits must have at least one dimension");
    s.C = x.shape.back();
    s.rows = s.C ? x.num_elements() / s.C : 0;
    LaunchPlan plan({x});
    if (x.num_elements() > 0) append_softmax(plan, ctx, s, {in0, out0});
    return std::move(plan).finish();
  }
  const TensorDesc& labels = op.inputs[1];
  if (x.shape.size() != 2) op.invalid("features must be 2-dimensional [batch, classes]");
  if (s.kind == Kind::kXent) {
    if (labels.dtype != dt)
      op.fail(fmt::format("labels ({}) and features ({}) have different dtypes",
                          data_type_name(labels.dtype), data_type_name(dt)));
    if (labels.shape.size() != 2) op.invalid("labels must be 2-dimensional [batch, classes]");
    auto shape = broadcast_shapes(x.shape, labels.shape);
    if (!shape)
      op.invalid(fmt::format("features {} and labels {} are not broadcast-compatible",
                             shape_str(x.shape), shape_str(labels.shape)));
    s.rows = (*shape)[0];
    s.C = (*shape)[1];
    LaunchPlan plan({TensorDesc{dt, {s.rows}}, TensorDesc{dt, {s.rows, s.C}}});
    if (s.rows == 0) return std::move(plan).finish();
    if (s.C == 0) {  // sum over no classes: loss 0, empty backprop
      StreamSpec fill;
      fill.kernel_name = "Fill_0";
      fill.out_type = s.t;
      fill.out_shape = {s.rows};
      fill.compute = [sz = s.size()](KernelBuilder& b, const TileOperands& t) {
        vec_dup_bits(b, sz, t.out, 0, *t.count);
      };
      plan.add(build_stream_kernel(op.str(), fill, ctx.cfg), {out0}, "no classes");
      return std::move(plan).finish();
    }
    std::vector<ArgRef> ins{in0, in1};
    for (int i = 0; i < 2; ++i) {
      const TensorDesc& t = op.inputs[static_cast<size_t>(i)];
      if (t.shape == *shape) continue;
      ins[static_cast<size_t>(i)] = plan.workspace(static_cast<uint64_t>(s.rows * s.C) *
                                                   static_cast<uint64_t>(s.size()));
      plan.add(broadcast_copy(op.str(), t, *shape, ctx.cfg),
               {LaunchPlan::input(i), ins[static_cast<size_t>(i)]},
               i ? "labels broadcast" : "features broadcast");
    }
    append_softmax(plan, ctx, s, {ins[0], ins[1], out0, out1});
    return std::move(plan).finish();
  }
  // Sparse labels.
  if (labels.dtype != DataType::S32 && labels.dtype != DataType::S64)
    op.fail(fmt::format("labels dtype {} is not supported (s32, s64)",
                        data_type_name(labels.dtype)));
  if (auto t = op.attr_type("Tlabels"); t && *t != labels.dtype)
    op.fail(fmt::format("attribute Tlabels = {} does not match the labels' {}",
                        data_type_name(*t), data_type_name(labels.dtype)));
  s.rows = x.shape[0];
  s.C = x.shape[1];
  if (labels.shape != std::vector<int64_t>{s.rows})
    op.invalid(fmt::format("labels {} must be [batch] = [{}]", shape_str(labels.shape), s.rows));
  if (s.C == 0) op.invalid("must have at least one class (TF fails too)");
  LaunchPlan plan({TensorDesc{dt, {s.rows}}, TensorDesc{dt, {s.rows, s.C}}});
  if (s.rows == 0) return std::move(plan).finish();
  ArgRef lbl = in1;
  if (labels.dtype == DataType::S64) {
    lbl = plan.workspace(static_cast<uint64_t>(s.rows) * 4);
    plan.add(build_narrow_s64_to_s32(op.str(), s.rows, -1, s.C, ctx.cfg), {in1, lbl},
             "labels s64 -> s32");
  }
  append_softmax(plan, ctx, s, {in0, lbl, out0, out1});
  return std::move(plan).finish();
}

}  // namespace npusim::compiler::ops
