// RmsNorm (CANN's op type; keras-hub's Llama / Gemma layer norm without centering):
//
//   y = x * rsqrt(mean(x^2 over the last axis) + epsilon) * gamma
//
// inputs x [..., H] (f32, f16 or bf16) and gamma [H] of x's dtype; attribute epsilon (float,
// default 1e-6); output y of x's shape and dtype. CANN's RmsNorm also returns rstd; this one
// returns y only (what a decoder's forward pass consumes).
//
// One row kernel (ops/row_kernel.h): rows of H resident in the UB in groups, double-buffered;
// per group: widen to f32, squares, per-row sums (lane accumulator), r = rsqrt(sum / H + eps)
// per row, x * r (one value per row replicated onto its lanes), * gamma (an f32 row built once,
// read with a repeat stride of 0 for every row), rounded once to the output type.
//
// Numerics against keras-hub (which casts to f32, computes the same formula and casts back): the
// sum of squares is accumulated lane-wise then folded (a different order than a sequential sum:
// relative difference ~ log2(H) f32 ulps), vrsqrt is the f32 reciprocal square root; the result
// is rounded once.
//
// LayerNorm (CANN's op type; GPT-2's keras LayerNormalization over the last axis):
//
//   y = (x - mean) * rsqrt(mean((x - mean)^2) + epsilon) * gamma + beta
//
// inputs x [..., H], gamma and beta [H] of x's dtype; attribute epsilon (default 1e-5); output y.
// CANN's LayerNorm also returns mean and variance (and takes begin_norm_axis /
// begin_params_axis): this one normalises over the last axis and returns y only. The same row
// kernel as RmsNorm's with two more steps: per-row sums of x first, x - sum / H replicated onto
// the row's lanes (in place), and + beta (a resident f32 row as gamma) at the end. The variance
// is that of the centred values, as TensorFlow's SquaredDifference(x, mean) gives it.
//
// Supported: H a multiple of 16 (each row a whole number of 32-byte blocks in every dtype, so
// a super-row is one row); otherwise a CompileError.
#include <fmt/format.h>

#include "adapter/compiler/buffer_plan.h"
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
  BufferPlan::Id raw_x, xw, out, sq, acc, r, rep, scratch, alt, gamma_raw, gamma, beta_raw, beta;
};

// Units: rows per group. center: LayerNorm's beta rows too.
NormBuffers norm_buffers(int64_t H, Dtype t, bool center) {
  NormBuffers n;
  BufferPlan& p = n.plan;
  const int64_t sz = isa::dtype_size(t);
  const bool conv = t != Dtype::F32;
  n.raw_x = p.add_sized("x rows", blocks_of(H * sz), 2);
  n.xw = p.add_sized("x rows (f32)", blocks_of(H * kLaneBytes), 1, conv);
  n.out = p.add_sized("y rows", blocks_of(H * sz), 2);
  n.sq = p.add_sized("squares / f32 result", blocks_of(H * kLaneBytes));
  n.acc = p.add_sized("lane slots", blocks_of(kSlotBytes));
  n.r = p.add_sized("row factor", blocks_of(kLaneBytes));
  n.rep = p.add_sized("replicated", blocks_of(kBlock));
  n.scratch = p.add_sized("replicate scratch", replicate_scratch_bytes);
  n.alt = p.add_sized("alternating pattern", alt_pattern_bytes);
  n.gamma_raw = p.add_fixed("gamma", static_cast<uint64_t>(rnd(H * sz)), 1, conv);
  n.gamma = p.add_fixed("gamma (f32)", static_cast<uint64_t>(rnd(H * kLaneBytes)));
  n.beta_raw = p.add_fixed("beta", static_cast<uint64_t>(rnd(H * sz)), 1, conv && center);
  n.beta = p.add_fixed("beta (f32)", static_cast<uint64_t>(rnd(H * kLaneBytes)), 1, center);
  declare_repeat_overhang(p);
  return n;
}

// RmsNorm's kernel, or LayerNorm's where center (x centred first, + beta last).
class RmsNormEmitter {
 public:
  RmsNormEmitter(const OpDesc& op, const ChipConfig& cfg, int64_t rows, int64_t H, Dtype t,
                 double eps, bool center)
      : m_k((center ? "LayerNorm_" : "RmsNorm_") + std::string(isa::dtype_name(t)), op.str(), cfg),
        m_center(center),
        m_b(m_k.b()),
        m_rows(rows),
        m_h(H),
        m_t(t),
        m_eps(eps),
        m_layout(SuperRowLayout::make(H, kBlock / isa::dtype_size(t))) {}

  Launch build(const ChipConfig& cfg) {
    const VectorCores cores = VectorCores::of(cfg);
    const NormBuffers bufs = norm_buffers(m_h, m_t, m_center);
    const BlockSplit split = BlockSplit::make(m_rows, cores.count, kBlockLanes32);
    // Groups of whole 8-row blocks where they fit; long rows (Llama's H = 2048 and up in f16 /
    // bf16: 32 KiB of buffers per row) in groups of fewer rows, down to one.
    int64_t G = bufs.plan.fit(cfg, cores.kind, kBlockLanes32,
                              std::min(kMaxGroupRows / kBlockLanes32 * kBlockLanes32, split.per));
    if (G == 0) G = bufs.plan.fit(cfg, cores.kind, 1, kBlockLanes32);
    if (G == 0) m_b.fail(fmt::format("a row of {} does not fit the UB", m_h));
    m_k.arg("x", m_t, {m_rows, m_h}, ArgRef{ArgRef::Kind::kInput, 0, 0});
    m_k.arg("gamma", m_t, {m_h}, ArgRef{ArgRef::Kind::kInput, 1, 0});
    if (m_center) m_k.arg("beta", m_t, {m_h}, ArgRef{ArgRef::Kind::kInput, 2, 0});
    m_k.arg("y", m_t, {m_rows, m_h}, ArgRef{ArgRef::Kind::kOutput, 0, 0});
    std::vector<Reg> args = m_k.load_args();
    m_x = std::move(args[0]);
    m_y = std::move(args[m_center ? 3 : 2]);
    const BufferPlan::Placed at = m_k.allocate(bufs.plan, G);
    take_twins(at, {{&m_raw_x, bufs.raw_x}, {&m_out, bufs.out}});
    take_buffers(at, {{&m_xw, bufs.xw},
                      {&m_sq, bufs.sq},
                      {&m_acc, bufs.acc},
                      {&m_r, bufs.r},
                      {&m_rep, bufs.rep},
                      {&m_scratch, bufs.scratch},
                      {&m_alt, bufs.alt},
                      {&m_gamma, bufs.gamma}});
    load_row(args[1], at[bufs.gamma_raw], m_gamma, "gamma");
    if (m_center) {
      m_beta = at[bufs.beta];
      load_row(args[2], at[bufs.beta_raw], m_beta, "beta");
    }
    fill_alt_pattern(m_b, m_alt, G);
    m_k.start_pingpong();
    m_k.resident_groups(
        split, m_rows, G, m_layout, [this](const GroupRegs& g, int q) { load(g, q); },
        [this](const GroupRegs& g, int q) { compute(g, q); });
    return m_k.finish(split.block_dim,
                      fmt::format("{}: {} rows of {} {}, {} blocks of {} rows, groups of {}",
                                  m_center ? "LayerNorm" : "RmsNorm", m_rows, m_h,
                                  isa::dtype_name(m_t), split.block_dim, split.per, G));
  }

 private:
  // gamma (beta) -> f32 row `row`, once (single-buffered: MTE2 then V).
  void load_row(const Reg& src, uint64_t raw, uint64_t row, const char* name) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, fmt::format("{} (f32, resident)", name));
    const int64_t sz = isa::dtype_size(m_t);
    const uint64_t dst = m_t == Dtype::F32 ? row : raw;
    b.emit(Opcode::op_copy_gm2ub, {dst, src, 1, rnd(m_h * sz) / kBlock, 0, 0}, name);
    const int id = b.flag(isa::Pipe::MTE2, isa::Pipe::V, fmt::format("{} loaded", name));
    b.set_flag(isa::Pipe::MTE2, isa::Pipe::V, id);
    b.wait_flag(isa::Pipe::MTE2, isa::Pipe::V, id);
    if (m_t != Dtype::F32) {
      Reg n = b.reg_imm("H", m_h);
      vec_convert(b, Dtype::F32, m_t, row, raw, RoundMode::kRint, n);
    }
  }

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

  void compute(const GroupRegs& g, int q) {
    KernelBuilder& b = m_b;
    PingPong& sync = m_k.sync();
    const bool conv = m_t != Dtype::F32;
    const uint64_t x = conv ? m_xw : m_raw_x[q];
    Reg lanes = b.reg("lanes of the group");
    b.mul(lanes, g.rows, m_h);
    sync.wait_loaded(q);
    if (conv) {
      vec_convert(b, Dtype::F32, m_t, x, m_raw_x[q], RoundMode::kRint, lanes);
      sync.release_load(q);
    }
    if (m_center) {
      // x -= sum(x) / H per row, in place (x is this group's f32 rows, read only here).
      vec_copy_bits(b, kLaneBytes, m_sq, x, lanes);
      const RowGroup xr{&m_layout, m_sq, &g.supers, &g.slots};
      rows_to_lanes(b, xr, Combine::kSum, Dtype::F32, m_acc);
      lanes_reduce(b, Combine::kSum, Dtype::F32, m_acc, g.rows, m_r, m_sq);
      Reg inv_h = b.reg_imm("1/H", vector_scalar_bits(Dtype::F32, 1.0 / static_cast<double>(m_h)));
      vec_scalar(b, Opcode::op_vmuls, Dtype::F32, m_r, m_r, inv_h, g.rows);
      replicate_rows(b, m_r, g.rows, m_rep, m_scratch, m_alt);
      const RowGroup xc{&m_layout, x, &g.supers, &g.slots};
      rows_bcast(b, xc, Opcode::op_vsub, Dtype::F32, m_rep, false, x);
    }
    // r = rsqrt(sum(x^2) / H + eps) per row.
    vec_binary(b, Opcode::op_vmul, Dtype::F32, m_sq, x, x, lanes);
    const RowGroup sq{&m_layout, m_sq, &g.supers, &g.slots};
    rows_to_lanes(b, sq, Combine::kSum, Dtype::F32, m_acc);
    lanes_reduce(b, Combine::kSum, Dtype::F32, m_acc, g.rows, m_r, m_sq);
    {
      Reg inv_h = b.reg_imm("1/H", vector_scalar_bits(Dtype::F32, 1.0 / static_cast<double>(m_h)));
      Reg eps = b.reg_imm("epsilon", vector_scalar_bits(Dtype::F32, m_eps));
      vec_scalar(b, Opcode::op_vmuls, Dtype::F32, m_r, m_r, inv_h, g.rows);
      vec_scalar(b, Opcode::op_vadds, Dtype::F32, m_r, m_r, eps, g.rows);
      vec_unary(b, Opcode::op_vrsqrt, Dtype::F32, m_r, m_r, g.rows);
    }
    replicate_rows(b, m_r, g.rows, m_rep, m_scratch, m_alt);
    // y = x * r * gamma, f32 in m_sq.
    const RowGroup xs{&m_layout, x, &g.supers, &g.slots};
    rows_bcast(b, xs, Opcode::op_vmul, Dtype::F32, m_rep, false, m_sq);
    if (!conv) sync.release_load(q);
    // * gamma: per 64-lane span of the row, all rows at once (a row stride of at most 255
    // blocks), else row by row.
    const RowGroup ys{&m_layout, m_sq, &g.supers, &g.slots};
    for_superrow_batches(b, ys, [&](const Reg& first, Opnd count, int64_t row_rep) {
      Reg ya = b.reg("y span");
      for (int64_t c = 0; c * kLanes32 < m_h; ++c) {
        set_mask_lanes(b, lane_range(0, std::min<int64_t>(kLanes32, m_h - c * kLanes32)));
        const int64_t off = c * kSlotBytes;
        b.mul_add(ya, first, m_h * kLaneBytes, static_cast<int64_t>(m_sq) + off);
        const VOperand y(ya, 1, row_rep);
        vec_binary_strided(b, Opcode::op_vmul, Dtype::F32, y, y,
                           VOperand(static_cast<int64_t>(m_gamma) + off, 1, 0), count);
        if (m_center)
          vec_binary_strided(b, Opcode::op_vadd, Dtype::F32, y, y,
                             VOperand(static_cast<int64_t>(m_beta) + off, 1, 0), count);
      }
    });
    sync.wait_out_free(q);
    if (conv)
      vec_convert(b, m_t, Dtype::F32, m_out[q], m_sq, RoundMode::kRint, lanes);
    else
      vec_copy_bits(b, kLaneBytes, m_out[q], m_sq, lanes);
    sync.out_ready(q);
    {
      const int64_t sz = isa::dtype_size(m_t);
      Reg dst = b.reg("destination"), blocks = b.reg("blocks");
      b.mul_add(dst, g.r, m_h * sz, m_y);
      count_blocks(b, blocks, g.rows, m_h * sz);
      b.emit(Opcode::op_copy_ub2gm, {dst, m_out[q], 1, blocks, 0, 0}, "y rows");
    }
    sync.stored(q);
  }

  RowKernel m_k;
  bool m_center;
  KernelBuilder& m_b;
  int64_t m_rows, m_h;
  Dtype m_t;
  double m_eps;
  SuperRowLayout m_layout;
  Reg m_x, m_y;
  Twin m_raw_x, m_out;
  uint64_t m_xw = 0, m_sq = 0, m_acc = 0, m_r = 0, m_rep = 0, m_scratch = 0, m_alt = 0, m_gamma = 0,
           m_beta = 0;
};

}  // namespace

CompiledKernel compile_norm(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const bool center = op.type == "LayerNorm";
  const size_t n_in = center ? 3 : 2;
  if (op.inputs.size() != n_in)
    op.invalid(fmt::format("takes x, gamma{}: {} inputs given", center ? " and beta" : "",
                           op.inputs.size()));
  const TensorDesc& x = op.inputs[0];
  if (!data_type_is_float(x.dtype)) op.fail("x must be of a float dtype (f32, f16, bf16)");
  if (x.shape.empty()) op.invalid("x must have at least one dimension");
  const int64_t H = x.shape.back();
  for (size_t i = 1; i < n_in; ++i) {
    const char* name = i == 1 ? "gamma" : "beta";
    if (op.inputs[i].dtype != x.dtype)
      op.fail(fmt::format("{} must have x's dtype {}", name, data_type_name(x.dtype)));
    if (op.inputs[i].shape != std::vector<int64_t>{H})
      op.invalid(fmt::format("{} must be [{}] (x's last dimension)", name, H));
  }
  CompiledKernel out;
  out.outputs = {x};
  if (x.num_elements() == 0) return out;
  if (H % kRowMultiple != 0)
    op.fail(fmt::format("last dimension {}: a multiple of {} is supported", H, kRowMultiple));
  RmsNormEmitter e(op, ctx.cfg, x.num_elements() / H, H, device_dtype(x.dtype),
                   op.attr_float("epsilon", center ? 1e-5 : 1e-6), center);
  out.launches.push_back(e.build(ctx.cfg));
  return out;
}

}  // namespace npusim::compiler::ops
