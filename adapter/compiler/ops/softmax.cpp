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
// and whole 32-byte blocks of rows (8 or 16). Rows too long for that are streamed instead, also
// double-buffered (three passes over GM per row: max, sum of exponentials, outputs), each core
// taking a range of rows whose first row starts on a 32-byte block in every tensor; output rows
// that start inside a block get the block's head (the end of the previous row, kept from that
// row) copied in before the block is written, so every block is written once and whole.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "adapter/compiler/ops/cast.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/int64.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/convert.h"
#include "common/int_math.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;

namespace {

constexpr int64_t kBlock = 32;
constexpr int64_t kLaneBytes = 4;
constexpr uint64_t kSlack = 32;
constexpr int64_t kF32One = 0x3f800000;
constexpr int64_t kF32Nan = 0x7fc00000;

int64_t rnd(int64_t bytes) { return round_up(bytes, kBlock); }
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

Args declare_args(KernelBuilder& b, const Spec& s, Launch& l) {
  b.declare_arg("in0", s.t, {s.rows, s.C});
  l.args.push_back(ArgRef{ArgRef::Kind::kInput, 0, 0});
  if (s.kind == Kind::kXent) b.declare_arg("in1", s.t, {s.rows, s.C});
  if (s.kind == Kind::kSparseXent) b.declare_arg("in1", Dtype::S32, {s.rows});
  if (s.xent()) {
    l.args.push_back(ArgRef{ArgRef::Kind::kInput, 1, 0});
    b.declare_arg("out", s.t, {s.rows});
    b.declare_arg("out1", s.t, {s.rows, s.C});
    l.args.push_back(ArgRef{ArgRef::Kind::kOutput, 0, 0});
    l.args.push_back(ArgRef{ArgRef::Kind::kOutput, 1, 0});
  } else {
    b.declare_arg("out", s.t, {s.rows, s.C});
    l.args.push_back(ArgRef{ArgRef::Kind::kOutput, 0, 0});
  }
  Args a;
  a.x = b.load_arg("in0");
  if (s.xent()) {
    a.labels = b.load_arg("in1");
    a.loss = b.load_arg("out");
    a.y = b.load_arg("out1");
  } else {
    a.y = b.load_arg("out");
  }
  return a;
}

// Constants of the sparse labels: lane indices, zeros, NaNs, C.
struct SparseConsts {
  uint64_t iota64 = 0, t64 = 0, zero64 = 0, nan64 = 0, c64 = 0;
};

SparseConsts alloc_sparse_consts(KernelBuilder& b, int64_t C) {
  SparseConsts k;
  k.iota64 = b.alloc(Buf::UB, kSlotBytes, "iota 0..63");
  k.t64 = b.alloc(Buf::UB, kSlotBytes, "column indices");
  k.zero64 = b.alloc(Buf::UB, kSlotBytes, "zeros");
  k.nan64 = b.alloc(Buf::UB, kSlotBytes, "NaNs");
  k.c64 = b.alloc(Buf::UB, kSlotBytes, "C");
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
  int64_t group = 0, per = 0;
  int block_dim = 0;
};

// UB bytes of a group of `rows` rows.
uint64_t rows_bytes(const Spec& s, int64_t rows) {
  uint64_t total = 0;
  auto add = [&](int64_t bytes) { total += static_cast<uint64_t>(rnd(bytes)) + kSlack; };
  const int64_t n = rows * s.C;
  const bool conv = s.t != Dtype::F32;
  for (int q = 0; q < 2; ++q) {          // ping and pong copies (PingPong)
    add(n * s.size());                   // features as loaded
    add(n * s.size());                   // output rows
    if (s.kind == Kind::kXent) add(n * s.size());  // labels as loaded
    if (s.xent()) add(rows * s.size());  // loss
    if (s.kind == Kind::kSparseXent) add(rows * kLaneBytes);  // labels
  }
  if (conv) add(n * kLaneBytes);         // widened
  if (s.kind != Kind::kSoftmax) add(n * kLaneBytes);  // exponentials
  if (s.kind == Kind::kXent && conv) add(n * kLaneBytes);
  add(rows * kSlotBytes);                // lane slots
  add(rows * kLaneBytes * 3);            // dense values
  add(rows * kBlock);                    // replicated
  add(static_cast<int64_t>(replicate_scratch_bytes(rows)));
  add(static_cast<int64_t>(alt_pattern_bytes(rows)));
  if (s.kind == Kind::kSparseXent) {
    add(rows * kBlock);                  // replicated labels
    add(rows * kSlotBytes);              // span scratch
    add(rows * 8 * 2);                   // compare bits
    add(5 * kSlotBytes);
  }
  return total;
}

std::optional<RowsPlan> plan_rows(const Spec& s, uint64_t ub, int64_t cores) {
  RowsPlan p;
  const int64_t granule = kBlock / s.size();
  p.layout = SuperRowLayout::make(s.C, granule);
  // Rows per step: whole super-rows and whole 32-byte blocks of a per-row output (the loss; also
  // the s32 labels' 8). Softmax / LogSoftmax would only need whole super-rows, but a group of
  // very few long rows costs one instruction per 64-lane span and pass (rows_to_lanes,
  // rows_bcast): such rows are faster streamed (a few counter-mode instructions per chunk).
  const int64_t q = std::max<int64_t>(p.layout.rows, granule);
  p.per = round_up(ceil_div(s.rows, cores), q);
  p.block_dim = static_cast<int>(ceil_div(s.rows, p.per));
  for (int64_t g = std::min(kMaxGroupRows / q * q, p.per); g >= q; g -= q)
    if (rows_bytes(s, g) <= ub) {
      p.group = g;
      return p;
    }
  return std::nullopt;
}

Launch build_rows(const Spec& s, const RowsPlan& p, const ChipConfig& cfg) {
  KernelBuilder b(fmt::format("{}_rows", s.op.substr(0, s.op.find('('))), s.op, cfg);
  const isa::CoreKind kind = b.vector_core_kind();
  const SuperRowLayout& L = p.layout;
  const int64_t G = p.group, g = L.rows, n = G * s.C;
  const bool conv = s.t != Dtype::F32;
  const int sz = s.size();
  b.begin_section(kind);
  Launch launch;
  Args args = declare_args(b, s, launch);
  // Double-buffered (PingPong, loads and stores in lockstep): what MTE2 loads (features,
  // labels) and what MTE3 stores (output rows, loss) have a ping and a pong copy; the widened
  // rows, exponentials and per-row values are V's alone.
  const Twin raw_x = alloc_twin(b, rnd(n * sz), "features");
  const uint64_t xw = conv ? b.alloc(Buf::UB, rnd(n * kLaneBytes), "widened features") : 0;
  const Twin out = alloc_twin(b, rnd(n * sz), "output rows");
  const uint64_t e =
      s.kind != Kind::kSoftmax ? b.alloc(Buf::UB, rnd(n * kLaneBytes), "exponentials") : 0;
  Twin raw_y;
  uint64_t yw = 0;
  if (s.kind == Kind::kXent) {
    raw_y = alloc_twin(b, rnd(n * sz), "labels");
    yw = conv ? b.alloc(Buf::UB, rnd(n * kLaneBytes), "widened labels") : 0;
  }
  const uint64_t acc = b.alloc(Buf::UB, static_cast<uint64_t>(G * kSlotBytes), "lane slots");
  const uint64_t d0 = b.alloc(Buf::UB, rnd(G * kLaneBytes), "row values");
  const uint64_t d1 = b.alloc(Buf::UB, rnd(G * kLaneBytes), "row values 2");
  const uint64_t d2 = b.alloc(Buf::UB, rnd(G * kLaneBytes), "row values 3");
  const uint64_t rep = b.alloc(Buf::UB, static_cast<uint64_t>(G * kBlock), "replicated");
  const uint64_t scratch = b.alloc(Buf::UB, replicate_scratch_bytes(G), "replicate scratch");
  const uint64_t alt = b.alloc(Buf::UB, alt_pattern_bytes(G), "alternating pattern");
  const Twin loss_out = alloc_twin(b, s.xent() ? rnd(G * sz) : 0, "loss");
  uint64_t rep_lbl = 0, span = 0, bits = 0, bits2 = 0;
  Twin lbl;
  SparseConsts k;
  if (s.kind == Kind::kSparseXent) {
    lbl = alloc_twin(b, rnd(G * kLaneBytes), "labels");
    rep_lbl = b.alloc(Buf::UB, static_cast<uint64_t>(G * kBlock), "replicated labels");
    span = b.alloc(Buf::UB, static_cast<uint64_t>(G * kSlotBytes), "span scratch");
    bits = b.alloc(Buf::UB, rnd(G * 8), "compare bits");
    bits2 = b.alloc(Buf::UB, rnd(G * 8), "compare bits 2");
    k = alloc_sparse_consts(b, s.C);
  }
  fill_alt_pattern(b, alt, G);
  PingPong sync(b);

  Reg r = b.reg("first row of the group"), end = b.reg("end of this block's rows");
  {
    KernelBuilder::Origin o(b, fmt::format("block range: {} rows per block", p.per));
    b.emit(Opcode::op_get_block_id, {r});
    b.mul(r, r, p.per);
    b.add(end, r, p.per);
    b.min(end, end, s.rows);
  }
  Reg rows = b.reg("rows in the group"), supers = b.reg("super-rows"), slots = b.reg("slots");
  Reg lanes = b.reg("lanes of the group"), r0 = b.reg("first row of the block");
  Reg steps = b.reg("groups of this block");
  b.mov(r0, r);
  b.sub(steps, end, r0);
  b.add(steps, steps, G - 1);
  b.div(steps, steps, G);
  // Group t: rows r .. r + rows - 1, r = r0 + t * G.
  auto group = [&](const Reg& t) {
    b.mul_add(r, t, G, r0);
    b.sub(rows, end, r);
    b.min(rows, rows, G);
    b.add(supers, rows, g - 1);
    b.shr(supers, supers, ceil_log2(g));
    b.mul(slots, supers, g);
    b.mul(lanes, supers, L.lanes);
  };
  sync.pipeline(steps, [&](const Reg& t, int q) {
    KernelBuilder::Origin o(b, "load the group");
    group(t);
    sync.wait_load_free(q);
    Reg src = b.reg("source"), blocks = b.reg("blocks");
    count_blocks(b, blocks, rows, s.C * sz);
    b.mul_add(src, r, s.C * sz, args.x);
    b.emit(Opcode::op_copy_gm2ub, {raw_x[q], src, 1, blocks, 0, 0}, "features");
    if (s.kind == Kind::kXent) {
      b.mul_add(src, r, s.C * sz, args.labels);
      b.emit(Opcode::op_copy_gm2ub, {raw_y[q], src, 1, blocks, 0, 0}, "labels");
    }
    if (s.kind == Kind::kSparseXent) {
      count_blocks(b, blocks, rows, kLaneBytes);
      b.mul_add(src, r, kLaneBytes, args.labels);
      b.emit(Opcode::op_copy_gm2ub, {lbl[q], src, 1, blocks, 0, 0}, "labels");
    }
    sync.load_done(q);
  }, [&](const Reg& t, int q) {
  const uint64_t x = conv ? xw : raw_x[q];
  const uint64_t y = s.kind != Kind::kXent ? 0 : conv ? yw : raw_y[q];
  group(t);
  sync.wait_loaded(q);
  if (conv) {
    vec_convert(b, Dtype::F32, s.t, x, raw_x[q], RoundMode::kRint, lanes);
    if (s.kind == Kind::kXent) vec_convert(b, Dtype::F32, s.t, y, raw_y[q], RoundMode::kRint, lanes);
  }
  // The load copy is free once widened (sparse labels are read to the end).
  const bool early_release = conv && s.kind != Kind::kSparseXent;
  if (early_release) sync.release_load(q);
  const RowGroup gx{&L, x, &supers, &slots};
  const uint64_t ex = s.kind == Kind::kSoftmax ? x : e;
  const RowGroup ge_{&L, ex, &supers, &slots};
  // Row sums / maxima into dense d: rows_to_lanes + lanes_reduce.
  auto row_reduce = [&](const RowGroup& grp, Combine c, uint64_t d) {
    rows_to_lanes(b, grp, c, Dtype::F32, acc);
    lanes_reduce(b, c, Dtype::F32, acc, slots, d, d2);
  };
  auto replicate = [&](uint64_t d, uint64_t to) { replicate_rows(b, d, slots, to, scratch, alt); };
  // shifted = x - max; e = exp(shifted); sum = d0.
  row_reduce(gx, Combine::kMax, d0);
  replicate(d0, rep);
  rows_bcast(b, gx, Opcode::op_vsub, Dtype::F32, rep);
  vec_unary(b, Opcode::op_vexp, Dtype::F32, ex, x, lanes);
  row_reduce(ge_, Combine::kSum, d0);
  sync.wait_out_free(q);
  const uint64_t result = conv ? x : out[q];  // where the f32 output rows are computed
  switch (s.kind) {
    case Kind::kSoftmax:
      replicate(d0, rep);
      rows_bcast(b, gx, Opcode::op_vdiv, Dtype::F32, rep, false, result);
      break;
    case Kind::kLogSoftmax:
      vec_unary(b, Opcode::op_vln, Dtype::F32, d0, d0, slots);
      replicate(d0, rep);
      rows_bcast(b, gx, Opcode::op_vsub, Dtype::F32, rep, false, result);
      break;
    case Kind::kXent: {
      vec_unary(b, Opcode::op_vln, Dtype::F32, d1, d0, slots);
      replicate(d0, rep);
      rows_bcast(b, ge_, Opcode::op_vdiv, Dtype::F32, rep);
      vec_binary(b, Opcode::op_vsub, Dtype::F32, e, e, y, lanes);
      // loss = sum(labels * (log(sum) - shifted)), in x.
      replicate(d1, rep);
      rows_bcast(b, gx, Opcode::op_vsub, Dtype::F32, rep, true);
      vec_binary(b, Opcode::op_vmul, Dtype::F32, x, x, y, lanes);
      row_reduce(gx, Combine::kSum, d1);
      break;
    }
    case Kind::kSparseXent: {
      vec_unary(b, Opcode::op_vln, Dtype::F32, d1, d0, slots);
      replicate(d0, rep);
      rows_bcast(b, ge_, Opcode::op_vdiv, Dtype::F32, rep);
      // Per row span: lanes whose column is the label: backprop - 1, and shifted summed.
      replicate_rows(b, lbl[q], slots, rep_lbl, scratch, alt);
      {
        KernelBuilder::Origin o(b, "one-hot of the labels");
        Reg n64 = b.reg("slot lanes");
        b.mul(n64, slots, kLanes32);
        vec_fill32(b, acc, 0, n64);
        Reg minus1 = b.reg_imm("-1.0", vector_scalar_bits(Dtype::F32, -1.0));
        Reg lanes64 = b.reg_imm("64", kLanes32), col = b.reg("column of lane 0");
        const int64_t slot_rep = g * (kSlotBytes / kBlock);
        for_superrow_batches(b, gx, [&](const Reg& first, Opnd count, int64_t xrep) {
          Reg xa = b.reg("shifted span"), ea = b.reg("backprop span"), la = b.reg("label");
          Reg aa = b.reg("slot");
          for (int64_t j = 0; j < g; ++j) {
            b.mul_add(la, first, g * kBlock, static_cast<int64_t>(rep_lbl) + j * kBlock);
            b.mul_add(aa, first, g * kSlotBytes, static_cast<int64_t>(acc) + j * kSlotBytes);
            for (const RowSpan& sp : L.spans[static_cast<size_t>(j)]) {
              b.movi(col, sp.offset - j * s.C);
              vec_scalar(b, Opcode::op_vadds, Dtype::S32, k.t64, k.iota64, col, lanes64);
              set_mask_lanes(b, sp.mask);
              b.mul_add(xa, first, L.lanes * kLaneBytes,
                        static_cast<int64_t>(x) + sp.offset * kLaneBytes);
              b.mul_add(ea, first, L.lanes * kLaneBytes,
                        static_cast<int64_t>(e) + sp.offset * kLaneBytes);
              const VOperand xs(xa, 1, xrep), es(ea, 1, xrep), sc(span, 1, 8);
              vec_compare_strided(b, Dtype::S32, isa::Cmp::EQ, bits, VOperand(k.t64, 1, 0),
                                  VOperand(la, 0, g), count);
              vec_scalar_strided(b, Opcode::op_vadds, Dtype::F32, sc, es, minus1, count);
              vec_select_strided(b, Dtype::F32, es, sc, es, bits, count);
              vec_select_strided(b, Dtype::F32, sc, xs, VOperand(k.zero64, 1, 0), bits, count);
              vec_binary_strided(b, Opcode::op_vadd, Dtype::F32, VOperand(aa, 1, slot_rep),
                                 VOperand(aa, 1, slot_rep), sc, count);
            }
          }
        });
      }
      lanes_reduce(b, Combine::kSum, Dtype::F32, acc, slots, d0, d2);
      vec_binary(b, Opcode::op_vsub, Dtype::F32, d1, d1, d0, slots);  // loss
      label_validity(b, k, lbl[q], slots, bits, bits2, d0);
      vec_binary(b, Opcode::op_vadd, Dtype::F32, d1, d1, d0, slots);
      replicate(d0, rep);
      rows_bcast(b, ge_, Opcode::op_vadd, Dtype::F32, rep);
      break;
    }
  }
  if (!early_release) sync.release_load(q);
  // Output rows (and loss) in the output type.
  const uint64_t rows_f32 = s.xent() ? e : result;
  if (conv || s.xent()) {
    if (conv) vec_convert(b, s.t, Dtype::F32, out[q], rows_f32, RoundMode::kRint, lanes);
    else vec_copy_bits(b, kLaneBytes, out[q], rows_f32, lanes);
  }
  if (s.xent()) {
    if (conv) vec_convert(b, s.t, Dtype::F32, loss_out[q], d1, RoundMode::kRint, slots);
    else vec_copy_bits(b, kLaneBytes, loss_out[q], d1, slots);
  }
  sync.out_ready(q);
  {
    Reg dst = b.reg("destination"), blocks = b.reg("blocks");
    b.mul_add(dst, r, s.C * sz, args.y);
    count_blocks(b, blocks, rows, s.C * sz);
    b.emit(Opcode::op_copy_ub2gm, {dst, out[q], 1, blocks, 0, 0}, "output rows");
    if (s.xent()) {
      b.mul_add(dst, r, sz, args.loss);
      count_blocks(b, blocks, rows, sz);
      b.emit(Opcode::op_copy_ub2gm, {dst, loss_out[q], 1, blocks, 0, 0}, "loss");
    }
  }
  sync.stored(q);
  });
  sync.drain();
  b.end();
  launch.block_dim = p.block_dim;
  launch.summary = fmt::format("{}: {} rows of {} {}, {} blocks of {} rows, groups of {} ({} per "
                               "super-row), double-buffered",
                               b.op(), s.rows, s.C, isa::dtype_name(s.t), p.block_dim, p.per, G, g);
  launch.kernel = b.finish();
  return launch;
}

// ---- long rows resident one at a time (Softmax, LogSoftmax) ----

// A row of whole 32-byte blocks that fits the UB on its own (with both copies) but not 16 at a
// time: one GM read and one write per row instead of the streamed kernel's three reads. Per row
// (one PingPong step): load, widen, max and sum folded in halves into one 64-lane slot
// (fold_into_slot: a few counter-mode instructions, not one per 64-lane span), the per-row
// values replicated to a block and applied with block stride 0 over the whole row.
struct LongRowPlan {
  int64_t per = 0;
  int block_dim = 0;
};

// UB bytes per lane: features as loaded (ping, pong), widened (f16/bf16), exponentials,
// output (ping, pong).
int64_t long_row_lane_bytes(const Spec& s) {
  return 2 * s.size() + (s.t != Dtype::F32 ? kLaneBytes : 0) + kLaneBytes + 2 * s.size();
}

std::optional<LongRowPlan> plan_long_rows(const Spec& s, uint64_t ub, int64_t cores) {
  if (s.xent() || (s.C * s.size()) % kBlock != 0) return std::nullopt;
  const int64_t fixed = kSlotBytes + 3 * kBlock + static_cast<int64_t>(replicate_scratch_bytes(1)) +
                        static_cast<int64_t>(alt_pattern_bytes(1)) + 10 * static_cast<int64_t>(kSlack);
  if (s.C * long_row_lane_bytes(s) + fixed > static_cast<int64_t>(ub)) return std::nullopt;
  LongRowPlan p;
  p.per = ceil_div(s.rows, cores);
  p.block_dim = static_cast<int>(ceil_div(s.rows, p.per));
  return p;
}

Launch build_long_rows(const Spec& s, const LongRowPlan& p, const ChipConfig& cfg) {
  KernelBuilder b(fmt::format("{}_long_rows", s.op.substr(0, s.op.find('('))), s.op, cfg);
  const int64_t C = s.C;
  const int sz = s.size();
  const bool conv = s.t != Dtype::F32;
  b.begin_section(b.vector_core_kind());
  Launch launch;
  Args args = declare_args(b, s, launch);
  // Double-buffered (PingPong, one step per row): the loaded row and the output row have a ping
  // and a pong copy; x (widened, or the loaded copy itself for f32) and e are V's.
  const Twin raw_x = alloc_twin(b, rnd(C * sz), "features row");
  const uint64_t xw = conv ? b.alloc(Buf::UB, rnd(C * kLaneBytes), "widened row") : 0;
  const uint64_t e = b.alloc(Buf::UB, rnd(C * kLaneBytes), "exponentials / fold scratch");
  const Twin out = alloc_twin(b, rnd(C * sz), "output row");
  const uint64_t acc = b.alloc(Buf::UB, kSlotBytes, "lane slot");
  const uint64_t d = b.alloc(Buf::UB, kBlock, "row value");
  const uint64_t d2 = b.alloc(Buf::UB, kBlock, "lanes_reduce scratch");
  const uint64_t rep = b.alloc(Buf::UB, kBlock, "replicated row value");
  const uint64_t scratch = b.alloc(Buf::UB, replicate_scratch_bytes(1), "replicate scratch");
  const uint64_t alt = b.alloc(Buf::UB, alt_pattern_bytes(1), "alternating pattern");
  fill_alt_pattern(b, alt, 1);
  PingPong sync(b);

  Reg r = b.reg("row"), end = b.reg("end of this block's rows");
  {
    KernelBuilder::Origin o(b, fmt::format("block range: {} rows per block", p.per));
    b.emit(Opcode::op_get_block_id, {r});
    b.mul(r, r, p.per);
    b.add(end, r, p.per);
    b.min(end, end, s.rows);
  }
  Reg n = b.reg_imm("row lanes", C), one = b.reg_imm("one row", 1);
  // dst lanes [0, C) = op(src lanes, the row's value) (the value's block read 8 times per repeat).
  auto with_row_value = [&](Opcode op, uint64_t dst, uint64_t src) {
    b.emit(Opcode::op_set_mask_count, {n});
    vec_binary_strided(b, op, Dtype::F32, VOperand(dst), VOperand(src), VOperand(rep, 0, 0), 0);
  };
  // The row's combination of lanes [0, C) of buf (overwritten) -> d, replicated into rep.
  auto row_value = [&](Combine c, uint64_t buf) {
    vec_fill32(b, acc, combine_identity_bits(c, Dtype::F32), kLanes32);
    fold_into_slot(b, c, Dtype::F32, buf, n, acc);
    lanes_reduce(b, c, Dtype::F32, acc, one, d, d2);
  };
  Reg steps = b.reg("rows of this block"), gm = b.reg("row address");
  Reg blocks = b.reg_imm("row blocks", C * sz / kBlock);
  b.sub(steps, end, r);
  // Step t: row r + t.
  sync.pipeline(
      steps,
      [&](const Reg& t, int q) {
        b.add(gm, r, t);
        b.mul_add(gm, gm, C * sz, args.x);
        sync.wait_load_free(q);
        b.emit(Opcode::op_copy_gm2ub, {raw_x[q], gm, 1, blocks, 0, 0}, "features row");
        sync.load_done(q);
      },
      [&](const Reg& t, int q) {
      const uint64_t x = conv ? xw : raw_x[q];
      sync.wait_loaded(q);
      if (conv) {
        vec_convert(b, Dtype::F32, s.t, x, raw_x[q], RoundMode::kRint, n);
        sync.release_load(q);
      }
      {
        KernelBuilder::Origin o(b, "row maximum");
        vec_copy_bits(b, kLaneBytes, e, x, n);
        row_value(Combine::kMax, e);
        replicate_rows(b, d, one, rep, scratch, alt);
      }
      uint64_t result = 0;
      {
        KernelBuilder::Origin o(b, "shifted, exponentials, their sum");
        with_row_value(Opcode::op_vsub, x, x);
        vec_unary(b, Opcode::op_vexp, Dtype::F32, e, x, n);
        if (s.kind == Kind::kSoftmax) {
          vec_copy_bits(b, kLaneBytes, x, e, n);  // shifted no longer needed
          row_value(Combine::kSum, x);
          replicate_rows(b, d, one, rep, scratch, alt);
          with_row_value(Opcode::op_vdiv, e, e);
          result = e;
        } else {
          row_value(Combine::kSum, e);
          vec_unary(b, Opcode::op_vln, Dtype::F32, d, d, one);
          replicate_rows(b, d, one, rep, scratch, alt);
          with_row_value(Opcode::op_vsub, x, x);
          result = x;
        }
      }
      sync.wait_out_free(q);
      if (conv) vec_convert(b, s.t, Dtype::F32, out[q], result, RoundMode::kRint, n);
      else vec_copy_bits(b, kLaneBytes, out[q], result, n);
      if (!conv) sync.release_load(q);
      sync.out_ready(q);
      b.add(gm, r, t);
      b.mul_add(gm, gm, C * sz, args.y);
      b.emit(Opcode::op_copy_ub2gm, {gm, out[q], 1, blocks, 0, 0}, "output row");
      sync.stored(q);
      });
  sync.drain();
  b.end();
  launch.block_dim = p.block_dim;
  launch.summary = fmt::format("{}: {} rows of {} {}, {} blocks of {} rows, one row resident at "
                               "a time, double-buffered",
                               b.op(), s.rows, C, isa::dtype_name(s.t), p.block_dim, p.per);
  launch.kernel = b.finish();
  return launch;
}

// ---- long rows, streamed (three passes per row) ----

struct StreamPlan {
  int64_t group = 0;  // rows per group (whole loss blocks)
  int64_t chunk = 0;  // lanes per chunk / window (multiple of 64)
  int64_t per = 0;
  int block_dim = 0;
};

std::optional<StreamPlan> plan_stream(const Spec& s, uint64_t ub, int64_t cores) {
  StreamPlan p;
  const int64_t granule = kBlock / s.size();
  const int64_t g = SuperRowLayout::make(s.C, granule).rows;
  const int64_t q = std::max<int64_t>(g, granule);
  p.per = round_up(ceil_div(s.rows, cores), q);
  p.block_dim = static_cast<int>(ceil_div(s.rows, p.per));
  p.group = q;
  uint64_t fixed = 0;
  auto add = [&](int64_t bytes) { fixed += static_cast<uint64_t>(rnd(bytes)) + kSlack; };
  const int64_t G = p.group;
  add(G * kSlotBytes);
  add(G * kLaneBytes * 4);
  add(G * kBlock * 4);
  add(static_cast<int64_t>(replicate_scratch_bytes(G)));
  add(static_cast<int64_t>(alt_pattern_bytes(G)));
  add(G * s.size());
  add(G * s.size());  // loss: ping and pong
  add(kBlock);
  if (s.kind == Kind::kSparseXent) add(5 * kSlotBytes + 2 * G * 8 + 2 * G * kLaneBytes);
  // Per lane: features as loaded (ping, pong), widened, exponentials, output (ping, pong);
  // labels (ping, pong); loss terms; indices.
  int64_t per_lane = 2 * s.size() + 3 * kLaneBytes + 2 * s.size();
  if (s.kind == Kind::kXent) per_lane += 2 * s.size() + 2 * kLaneBytes;
  if (s.kind == Kind::kSparseXent) per_lane += 2 * kLaneBytes + 1;
  const int64_t left = static_cast<int64_t>(ub) - static_cast<int64_t>(fixed) -
                       8 * static_cast<int64_t>(kSlack);
  p.chunk = std::min(left / per_lane / kLanes32 * kLanes32, round_up(s.C + granule, kLanes32));
  if (p.chunk < kLanes32) return std::nullopt;
  return p;
}

Launch build_stream(const Spec& s, const StreamPlan& p, const ChipConfig& cfg) {
  KernelBuilder b(fmt::format("{}_streamed", s.op.substr(0, s.op.find('('))), s.op, cfg);
  const int64_t G = p.group, T = p.chunk;
  const int sz = s.size();
  const int64_t og = kBlock / sz;
  const bool conv = s.t != Dtype::F32;
  b.begin_section(b.vector_core_kind());
  Launch launch;
  Args args = declare_args(b, s, launch);
  // Double-buffered (PingPong): chunks / windows alternate between two copies of what MTE2
  // loads (load parity), output windows and losses between two copies of what MTE3 stores
  // (output parity). x / y: the widened copies (V's), or the loaded copy q itself for f32.
  const Twin raw_x = alloc_twin(b, rnd(T * sz), "features chunk");
  const uint64_t xw = conv ? b.alloc(Buf::UB, rnd(T * kLaneBytes), "widened") : 0;
  const uint64_t e = b.alloc(Buf::UB, rnd(T * kLaneBytes), "exponentials / results");
  const Twin out_w = alloc_twin(b, rnd(T * sz), "output window");
  Twin raw_y;
  uint64_t yw = 0, t = 0, iota = 0, bits = 0;
  if (s.kind == Kind::kXent) {
    raw_y = alloc_twin(b, rnd(T * sz), "labels window");
    yw = conv ? b.alloc(Buf::UB, rnd(T * kLaneBytes), "widened labels") : 0;
  }
  auto x_of = [&](int q) { return conv ? xw : raw_x[q]; };
  auto y_of = [&](int q) { return s.kind != Kind::kXent ? 0 : conv ? yw : raw_y[q]; };
  if (s.xent()) t = b.alloc(Buf::UB, rnd(T * kLaneBytes), "loss terms");
  const uint64_t acc = b.alloc(Buf::UB, static_cast<uint64_t>(G * kSlotBytes), "lane slots");
  const uint64_t dm = b.alloc(Buf::UB, rnd(G * kLaneBytes), "row maxima");
  const uint64_t ds = b.alloc(Buf::UB, rnd(G * kLaneBytes), "row sums");
  const uint64_t dl = b.alloc(Buf::UB, rnd(G * kLaneBytes), "log of the row sums");
  const uint64_t d2 = b.alloc(Buf::UB, rnd(G * kLaneBytes), "row values");
  const uint64_t rep_m = b.alloc(Buf::UB, static_cast<uint64_t>(G * kBlock), "maxima blocks");
  const uint64_t rep_s = b.alloc(Buf::UB, static_cast<uint64_t>(G * kBlock), "sum blocks");
  const uint64_t rep_l = b.alloc(Buf::UB, static_cast<uint64_t>(G * kBlock), "log-sum blocks");
  const uint64_t rep_a = b.alloc(Buf::UB, static_cast<uint64_t>(G * kBlock), "label blocks");
  const uint64_t scratch = b.alloc(Buf::UB, replicate_scratch_bytes(G), "replicate scratch");
  const uint64_t alt = b.alloc(Buf::UB, alt_pattern_bytes(G), "alternating pattern");
  const Twin loss_out = alloc_twin(b, rnd(G * sz), "loss");
  const uint64_t carry = b.alloc(Buf::UB, kBlock, "previous row's last block");
  uint64_t bits_a = 0, bits_b = 0, addv = 0, rep_v = 0;
  Twin lbl;
  SparseConsts k;
  if (s.kind == Kind::kSparseXent) {
    lbl = alloc_twin(b, rnd(G * kLaneBytes), "labels");
    bits_a = b.alloc(Buf::UB, rnd(G * 8), "compare bits");
    bits_b = b.alloc(Buf::UB, rnd(G * 8), "compare bits 2");
    addv = b.alloc(Buf::UB, rnd(G * kLaneBytes), "NaN for invalid labels");
    rep_v = b.alloc(Buf::UB, static_cast<uint64_t>(G * kBlock), "NaN blocks");
    iota = b.alloc(Buf::UB, rnd(T * kLaneBytes), "lane indices");
    bits = b.alloc(Buf::UB, rnd(T / 8), "one-hot bits");
    k = alloc_sparse_consts(b, s.C);
    KernelBuilder::Origin o(b, "lane indices 0..T-1");
    vec_copy_bits(b, kLaneBytes, iota, k.iota64, kLanes32);
    for (int64_t h = kLanes32; h < T; h *= 2) {
      Reg v = b.reg_imm("offset", h), cnt = b.reg_imm("lanes", std::min(h, T - h));
      vec_scalar(b, Opcode::op_vadds, Dtype::S32, iota + static_cast<uint64_t>(h * kLaneBytes),
                 iota, v, cnt);
    }
  }
  fill_alt_pattern(b, alt, G);
  PingPong sync(b);

  Reg r0 = b.reg("first row of the group"), rend = b.reg("end of this block's rows");
  {
    KernelBuilder::Origin o(b, fmt::format("block range: {} rows per block", p.per));
    b.emit(Opcode::op_get_block_id, {r0});
    b.mul(r0, r0, p.per);
    b.add(rend, r0, p.per);
    b.min(rend, rend, s.rows);
  }
  Reg rows = b.reg("rows in the group");
  const Reg& slots = rows;
  Label top = b.label("group"), done = b.label("groups_done");
  b.bind(top);
  b.branch(ge(r0, rend), done);
  b.sub(rows, rend, r0);
  b.min(rows, rows, G);
  auto fill_slots = [&](int64_t bits32) {
    Reg n = b.reg("slot lanes");
    b.mul(n, rows, kLanes32);
    vec_fill32(b, acc, bits32, n);
  };
  auto replicate = [&](uint64_t d, uint64_t to) { replicate_rows(b, d, rows, to, scratch, alt); };
  // x_of(q) (f32) = the n features at GM element `elem` (loaded into copy q at the UB block
  // start). With widening, copy q is released here (done: whether it was).
  auto load = [&](int q, const Reg& elem, const Reg& n, bool labels_too) {
    sync.wait_load_free(q);
    Reg src = b.reg("source"), blocks = b.reg("blocks");
    count_blocks(b, blocks, n, sz);
    b.mul_add(src, elem, sz, args.x);
    b.emit(Opcode::op_copy_gm2ub, {raw_x[q], src, 1, blocks, 0, 0}, "features");
    if (labels_too) {
      b.mul_add(src, elem, sz, args.labels);
      b.emit(Opcode::op_copy_gm2ub, {raw_y[q], src, 1, blocks, 0, 0}, "labels");
    }
    sync.loaded(q);
    if (conv) {
      vec_convert(b, Dtype::F32, s.t, xw, raw_x[q], RoundMode::kRint, n);
      if (labels_too) vec_convert(b, Dtype::F32, s.t, yw, raw_y[q], RoundMode::kRint, n);
      sync.release_load(q);
    }
  };
  auto release = [&](int q) {
    if (!conv) sync.release_load(q);
  };
  // lanes [0, n) op= the row's replicated value (block at rep + j * 32).
  auto with_row_value = [&](Opcode op, uint64_t dst, uint64_t src, const Reg& j, uint64_t rep,
                            const Reg& n, bool rep_first = false) {
    Reg ra = b.reg("row value block");
    b.mul_add(ra, j, kBlock, static_cast<int64_t>(rep));
    b.emit(Opcode::op_set_mask_count, {n});
    const VOperand v(ra, 0, 0), a(src);
    vec_binary_strided(b, op, Dtype::F32, VOperand(dst), rep_first ? v : a, rep_first ? a : v, 0);
  };
  // Passes 1 and 2: per row, chunks from the row's first element.
  auto row_pass = [&](Combine c,
                      const std::function<void(uint64_t x, const Reg& j, const Reg& n)>& chunk) {
    Reg j = b.reg("row of the group");
    b.for_range(j, 0, rows, 1, [&] {
      Reg start = b.reg("row start"), cpos = b.reg("chunk"), n = b.reg("chunk lanes");
      Reg slot = b.reg("slot"), elem = b.reg("element");
      b.add(start, r0, j);
      b.mul(start, start, s.C);
      b.mul_add(slot, j, kSlotBytes, static_cast<int64_t>(acc));
      b.for_range(cpos, 0, s.C, T, [&] {
        b.movi(n, s.C);
        b.sub(n, n, cpos);
        b.min(n, n, T);
        b.add(elem, start, cpos);
        sync.load_step([&](int q) {
          load(q, elem, n, false);
          chunk(x_of(q), j, n);
          fold_into_slot(b, c, Dtype::F32, x_of(q), n, slot);
          release(q);
        });
      });
    });
  };
  {
    KernelBuilder::Origin o(b, "pass 1: row maxima");
    fill_slots(combine_identity_bits(Combine::kMax, Dtype::F32));
    row_pass(Combine::kMax, [](uint64_t, const Reg&, const Reg&) {});
    lanes_reduce(b, Combine::kMax, Dtype::F32, acc, slots, dm, d2);
    replicate(dm, rep_m);
  }
  {
    KernelBuilder::Origin o(b, "pass 2: sums of exp(x - max)");
    fill_slots(0);
    row_pass(Combine::kSum, [&](uint64_t x, const Reg& j, const Reg& n) {
      with_row_value(Opcode::op_vsub, x, x, j, rep_m, n);
      vec_unary(b, Opcode::op_vexp, Dtype::F32, x, x, n);
    });
    lanes_reduce(b, Combine::kSum, Dtype::F32, acc, slots, ds, d2);
    vec_unary(b, Opcode::op_vln, Dtype::F32, dl, ds, slots);
    replicate(ds, rep_s);
    replicate(dl, rep_l);
  }
  if (s.kind == Kind::kSparseXent) {
    KernelBuilder::Origin o(b, "labels of the group");
    sync.load_step([&](int q) {
      sync.wait_load_free(q);
      Reg src = b.reg("source"), blocks = b.reg("blocks");
      count_blocks(b, blocks, rows, kLaneBytes);
      b.mul_add(src, r0, kLaneBytes, args.labels);
      b.emit(Opcode::op_copy_gm2ub, {lbl[q], src, 1, blocks, 0, 0}, "labels");
      sync.loaded(q);
      replicate(lbl[q], rep_a);
      label_validity(b, k, lbl[q], rows, bits_a, bits_b, addv);
      replicate(addv, rep_v);
      sync.release_load(q);
    });
  }
  {
    KernelBuilder::Origin o(b, "pass 3: outputs, window by window");
    if (s.xent()) fill_slots(0);
    Reg j = b.reg("row of the group");
    b.for_range(j, 0, rows, 1, [&] {
      Reg start = b.reg("row start"), w = b.reg("window"), rowend = b.reg("row end");
      Reg a = b.reg("row's first lane in the window"), n = b.reg("window lanes");
      Reg slot = b.reg("slot"), last_row = b.reg("last row of the block");
      b.add(start, r0, j);
      b.add(last_row, start, 1);
      b.sub(last_row, last_row, rend);  // 0 for the block's last row
      b.mul(start, start, s.C);
      b.add(rowend, start, s.C);
      b.mul_add(slot, j, kSlotBytes, static_cast<int64_t>(acc));
      b.and_(w, start, -og);
      b.for_range(w, w, rowend, T, [&] {
        b.sub(a, start, w);
        b.max(a, a, 0);
        b.sub(n, rowend, w);
        b.min(n, n, T);
        sync.load_step([&](int q) {
        const uint64_t x = x_of(q), y = y_of(q);
        load(q, w, n, s.kind == Kind::kXent);
        with_row_value(Opcode::op_vsub, x, x, j, rep_m, n);  // shifted
        switch (s.kind) {
          case Kind::kSoftmax:
            vec_unary(b, Opcode::op_vexp, Dtype::F32, e, x, n);
            with_row_value(Opcode::op_vdiv, e, e, j, rep_s, n);
            break;
          case Kind::kLogSoftmax:
            with_row_value(Opcode::op_vsub, e, x, j, rep_l, n);
            break;
          case Kind::kXent:
            vec_unary(b, Opcode::op_vexp, Dtype::F32, e, x, n);
            with_row_value(Opcode::op_vdiv, e, e, j, rep_s, n);
            vec_binary(b, Opcode::op_vsub, Dtype::F32, e, e, y, n);
            with_row_value(Opcode::op_vsub, t, x, j, rep_l, n, true);
            vec_binary(b, Opcode::op_vmul, Dtype::F32, t, t, y, n);
            break;
          case Kind::kSparseXent: {
            vec_unary(b, Opcode::op_vexp, Dtype::F32, e, x, n);
            with_row_value(Opcode::op_vdiv, e, e, j, rep_s, n);
            Reg col = b.reg("column of lane 0"), la = b.reg("label block");
            b.sub(col, w, start);
            vec_scalar(b, Opcode::op_vadds, Dtype::S32, iota, iota, col, n);
            b.mul_add(la, j, kBlock, static_cast<int64_t>(rep_a));
            b.emit(Opcode::op_set_mask_count, {n});
            vec_compare_strided(b, Dtype::S32, isa::Cmp::EQ, bits, VOperand(iota),
                                VOperand(la, 0, 0), 0);
            Reg neg = b.reg_imm("minus the column of lane 0", 0);
            b.sub(neg, neg, col);
            vec_scalar(b, Opcode::op_vadds, Dtype::S32, iota, iota, neg, n);
            // backprop - 1 and the loss term ln(sum) - shifted on the label's lane.
            Reg minus1 = b.reg_imm("-1.0", vector_scalar_bits(Dtype::F32, -1.0));
            vec_scalar(b, Opcode::op_vadds, Dtype::F32, t, e, minus1, n);
            vec_select_strided(b, Dtype::F32, VOperand(e), VOperand(t), VOperand(e), bits, 0);
            with_row_value(Opcode::op_vsub, t, x, j, rep_l, n, true);
            b.emit(Opcode::op_set_mask_count, {n});
            vec_select_strided(b, Dtype::F32, VOperand(t), VOperand(t), VOperand(k.zero64, 1, 0),
                               bits, 0);
            with_row_value(Opcode::op_vadd, e, e, j, rep_v, n);  // NaN rows
            break;
          }
        }
        if (s.xent()) {
          vec_fill32(b, t, 0, a);  // lanes of the previous row
          fold_into_slot(b, Combine::kSum, Dtype::F32, t, n, slot);
        }
        release(q);
        });
        sync.out_step([&](int oq) {
        sync.wait_out_free(oq);
        const uint64_t ow = out_w[oq];
        if (conv) vec_convert(b, s.t, Dtype::F32, ow, e, RoundMode::kRint, n);
        else vec_copy_bits(b, kLaneBytes, ow, e, n);
        // The window's head lanes belong to the previous row: its last block, kept in carry.
        vec_copy_bits(b, sz, ow, carry, a);
        Reg blocks = b.reg("blocks to store"), rest = b.reg("lanes to the row end");
        count_blocks(b, blocks, n, sz);
        b.sub(rest, rowend, w);
        b.if_(lt(rest, T + 1), [&] {
          b.if_(ne(last_row, 0), [&] {
            // The row's last block is shared with the next row: keep it, store the rest.
            KernelBuilder::Origin oc(b, "keep the row's last partial block");
            Reg src = b.reg("last block");
            b.shr(blocks, n, ceil_log2(og));
            b.mul_add(src, blocks, kBlock, static_cast<int64_t>(ow));
            vec_copy_bits(b, sz, carry, src, og);
          });
        });
        sync.out_ready(oq);
        b.if_(ge(blocks, 1), [&] {
          Reg dst = b.reg("destination");
          b.mul_add(dst, w, sz, args.y);
          b.emit(Opcode::op_copy_ub2gm, {dst, ow, 1, blocks, 0, 0}, "output window");
        });
        sync.stored(oq);
        });
      });
    });
  }
  if (s.xent()) {
    KernelBuilder::Origin o(b, "loss of the group's rows");
    sync.out_step([&](int oq) {
      sync.wait_out_free(oq);
      lanes_reduce(b, Combine::kSum, Dtype::F32, acc, slots, dm, d2);
      if (s.kind == Kind::kSparseXent)
        vec_binary(b, Opcode::op_vadd, Dtype::F32, dm, dm, addv, rows);
      if (conv) vec_convert(b, s.t, Dtype::F32, loss_out[oq], dm, RoundMode::kRint, rows);
      else vec_copy_bits(b, kLaneBytes, loss_out[oq], dm, rows);
      sync.out_ready(oq);
      Reg dst = b.reg("destination"), blocks = b.reg("blocks");
      b.mul_add(dst, r0, sz, args.loss);
      count_blocks(b, blocks, rows, sz);
      b.emit(Opcode::op_copy_ub2gm, {dst, loss_out[oq], 1, blocks, 0, 0}, "loss");
      sync.stored(oq);
    });
  }
  b.add(r0, r0, G);
  b.jmp(top);
  b.bind(done);
  sync.drain();
  b.end();
  launch.block_dim = p.block_dim;
  launch.summary = fmt::format("{}: {} rows of {} {}, {} blocks of {} rows, windows of {} lanes, "
                               "groups of {} rows, double-buffered",
                               b.op(), s.rows, s.C, isa::dtype_name(s.t), p.block_dim, p.per, T, G);
  launch.kernel = b.finish();
  return launch;
}

// The launches of one softmax-family op on [rows, C] tensors at the given arguments (features,
// labels as the kernel takes them; outputs).
void append_softmax(LaunchPlan& plan, const CompileContext& ctx, const Spec& s,
                    const std::vector<ArgRef>& args) {
  const ChipConfig& cfg = ctx.cfg;
  const CoreKindConfig& core =
      *cfg.core_kind(cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE);
  if (auto p = plan_rows(s, core.capacity(Buf::UB), core.count)) {
    plan.add(build_rows(s, *p, cfg), args);
    return;
  }
  if (auto p = plan_long_rows(s, core.capacity(Buf::UB), core.count)) {
    plan.add(build_long_rows(s, *p, cfg), args);
    return;
  }
  if (auto p = plan_stream(s, core.capacity(Buf::UB), core.count)) {
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
