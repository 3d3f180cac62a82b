// RotaryPositionEmbedding (CANN's op type) in the half-split ("rotate half") layout keras-hub's
// Llama and Gemma use:
//
//   y = x * cos + rotate_half(x) * sin,   rotate_half(x) = concat(-x[..., D/2:], x[..., :D/2])
//
// inputs x [B, S, N, D] (BSND, f32 / f16 / bf16), cos and sin [S, D] (or [1, S, 1, D]) of x's
// dtype: one row per position, shared by the batch and the heads; output y of x's shape. D a
// multiple of 16 (each half a whole number of 32-byte blocks of f32).
//
// A vector kernel: the B * S positions are split over the vector cores; per position the N * D
// elements of x (one contiguous piece in BSND) and the position's cos and sin rows are loaded,
// widened to f32 and combined with strided instructions whose repeats walk the N heads (repeat
// stride D, the cos / sin row read with a repeat stride of 0); the result is rounded once and
// stored. Loads, vector work and stores overlap through ping/pong copies (PingPong).
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

constexpr int64_t kDimMultiple = 16;

class RopeEmitter {
 public:
  RopeEmitter(const OpDesc& op, const ChipConfig& cfg, int64_t positions, int64_t seq,
              int64_t heads, int64_t dim, Dtype t)
      : m_k("RotaryPositionEmbedding_" + std::string(isa::dtype_name(t)), op.str(), cfg),
        m_b(m_k.b()),
        m_positions(positions),
        m_seq(seq),
        m_heads(heads),
        m_dim(dim),
        m_t(t),
        m_sz(isa::dtype_size(t)) {}

  Launch build(const ChipConfig& cfg) {
    KernelBuilder& b = m_b;
    const VectorCores cores = VectorCores::of(cfg);
    const bool conv = m_t != Dtype::F32;
    const int64_t row = m_heads * m_dim;
    BufferPlan plan;
    const auto raw_x = plan.add_fixed("x rows", rnd(row * m_sz), 2);
    const auto raw_cs = plan.add_fixed("cos and sin rows", rnd(2 * m_dim * m_sz), 2);
    const auto out = plan.add_fixed("y rows", rnd(row * m_sz), 2);
    const auto xw = plan.add_fixed("x (f32)", row * kLaneBytes, 1, conv);
    const auto cs = plan.add_fixed("cos and sin (f32)", 2 * m_dim * kLaneBytes, 1, conv);
    const auto yw = plan.add_fixed("y (f32)", row * kLaneBytes);
    const auto tmp = plan.add_fixed("rotated half * sin", row * kLaneBytes);
    declare_repeat_overhang(plan);
    if (plan.fit(cfg, cores.kind, 1, 1) != 1)
      b.fail(fmt::format("a position of {} heads x {} does not fit the UB", m_heads, m_dim));
    if (m_heads > kMaxRepeat || m_dim / kBlockLanes32 > kMaxRepeat)
      b.fail(fmt::format("{} heads of {}: at most {} heads, head_dim at most {}", m_heads, m_dim,
                         kMaxRepeat, kMaxRepeat * kBlockLanes32));
    m_k.arg("x", m_t, {m_positions, row}, ArgRef{ArgRef::Kind::kInput, 0, 0});
    m_k.arg("cos", m_t, {m_seq, m_dim}, ArgRef{ArgRef::Kind::kInput, 1, 0});
    m_k.arg("sin", m_t, {m_seq, m_dim}, ArgRef{ArgRef::Kind::kInput, 2, 0});
    m_k.arg("y", m_t, {m_positions, row}, ArgRef{ArgRef::Kind::kOutput, 0, 0});
    std::vector<Reg> args = m_k.load_args();
    const BufferPlan::Placed at = m_k.allocate(plan, 1);
    const Twin x_in = at.twin(raw_x), cs_in = at.twin(raw_cs), y_out = at.twin(out);
    const uint64_t y = at[yw], t = at[tmp];
    PingPong& sync = m_k.start_pingpong();
    const BlockSplit split = BlockSplit::make(m_positions, cores.count);
    Reg p0 = b.reg("first position"), end = b.reg("end of this block's positions");
    m_k.block_range(p0, end, split.per, m_positions);
    Reg steps = b.reg("positions of this block");
    b.sub(steps, end, p0);
    Reg p = b.reg("position"), s = b.reg("sequence index");
    auto position = [&](const Reg& step) {
      b.add(p, p0, step);
      b.rem(s, p, m_seq, "sequence index of the position");
    };
    sync.pipeline(
        steps,
        [&](const Reg& step, int q) {
          KernelBuilder::Origin o(b, "load x, cos, sin of a position");
          position(step);
          sync.wait_load_free(q);
          Reg src = b.reg("source");
          b.mul_add(src, p, row * m_sz, args[0]);
          b.emit(Opcode::op_copy_gm2ub, {x_in[q], src, 1, rnd(row * m_sz) / kBlock, 0, 0}, "x row");
          for (int k = 0; k < 2; ++k) {
            b.mul_add(src, s, m_dim * m_sz, args[1 + k]);
            b.emit(Opcode::op_copy_gm2ub,
                   {static_cast<int64_t>(cs_in[q]) + k * m_dim * m_sz, src, 1,
                    m_dim * m_sz / kBlock, 0, 0},
                   k == 0 ? "cos row" : "sin row");
          }
          sync.load_done(q);
        },
        [&](const Reg& step, int q) {
          KernelBuilder::Origin o(b, "y = x cos + rotate_half(x) sin");
          position(step);
          sync.wait_loaded(q);
          const uint64_t x = conv ? at[xw] : x_in[q];
          const uint64_t c = conv ? at[cs] : cs_in[q];
          if (conv) {
            Reg n = b.reg_imm("x lanes", row);
            vec_convert(b, Dtype::F32, m_t, x, x_in[q], RoundMode::kRint, n);
            b.movi(n, 2 * m_dim);
            vec_convert(b, Dtype::F32, m_t, c, cs_in[q], RoundMode::kRint, n);
          }
          rotate(x, c, c + m_dim * kLaneBytes, y, t);
          sync.release_load(q);
          sync.wait_out_free(q);
          {
            Reg n = b.reg_imm("y lanes", row);
            if (conv)
              vec_convert(b, m_t, Dtype::F32, y_out[q], y, RoundMode::kRint, n);
            else
              vec_copy_bits(b, kLaneBytes, y_out[q], y, n);
          }
          sync.out_ready(q);
          Reg dst = b.reg("destination");
          b.mul_add(dst, p, row * m_sz, args[3]);
          b.emit(Opcode::op_copy_ub2gm, {dst, y_out[q], 1, rnd(row * m_sz) / kBlock, 0, 0},
                 "y row");
          sync.stored(q);
        });
    return m_k.finish(
        split.block_dim,
        fmt::format("RotaryPositionEmbedding: {} positions of {} heads x {} {}, "
                    "{} blocks",
                    m_positions, m_heads, m_dim, isa::dtype_name(m_t), split.block_dim));
  }

 private:
  // y = x * cos + rotate_half(x) * sin for the N heads of one position (f32, head stride D).
  void rotate(uint64_t x, uint64_t cos, uint64_t sin, uint64_t y, uint64_t t) {
    KernelBuilder& b = m_b;
    const int64_t half = m_dim / 2, rep = m_dim * kLaneBytes / kBlock;
    // op over lanes [0, n) of each head: dst[h] = a[h] op b (b: a row read for every head).
    auto heads = [&](Opcode op, int64_t dst, int64_t a, int64_t row_b, bool b_per_head, int64_t n) {
      for (int64_t c = 0; c * kLanes32 < n; ++c) {
        set_mask_lanes(b, lane_range(0, std::min<int64_t>(kLanes32, n - c * kLanes32)));
        const int64_t off = c * kSlotBytes;
        vec_binary_strided(b, op, Dtype::F32, VOperand(dst + off, 1, rep),
                           VOperand(a + off, 1, rep),
                           VOperand(row_b + off, 1, b_per_head ? rep : 0), m_heads);
      }
    };
    const int64_t hx = static_cast<int64_t>(x), hy = static_cast<int64_t>(y),
                  ht = static_cast<int64_t>(t), hb = half * kLaneBytes;
    heads(Opcode::op_vmul, hy, hx, static_cast<int64_t>(cos), false, m_dim);           // x cos
    heads(Opcode::op_vmul, ht, hx + hb, static_cast<int64_t>(sin), false, half);       // x2 sin1
    heads(Opcode::op_vmul, ht + hb, hx, static_cast<int64_t>(sin) + hb, false, half);  // x1 sin2
    heads(Opcode::op_vsub, hy, hy, ht, true, half);                 // first half: - x2 sin
    heads(Opcode::op_vadd, hy + hb, hy + hb, ht + hb, true, half);  // second half: + x1 sin
  }

  RowKernel m_k;
  KernelBuilder& m_b;
  int64_t m_positions, m_seq, m_heads, m_dim;
  Dtype m_t;
  int64_t m_sz;
};

}  // namespace

CompiledKernel compile_rope(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 3)
    op.invalid(fmt::format("takes x, cos and sin, {} inputs given", op.inputs.size()));
  const TensorDesc &x = op.inputs[0], &cos = op.inputs[1], &sin = op.inputs[2];
  if (!data_type_is_float(x.dtype) || cos.dtype != x.dtype || sin.dtype != x.dtype)
    op.fail("x, cos and sin must have one float dtype (f32, f16, bf16)");
  if (op.attr_int("mode", 0) != 0)
    op.fail("mode: only 0 (rotate half, keras-hub's layout) is supported");
  if (x.shape.size() != 4) op.invalid("x must be [batch, seq, heads, head_dim] (BSND)");
  const int64_t S = x.shape[1], N = x.shape[2], D = x.shape[3];
  const std::vector<int64_t> flat = {S, D}, bsnd = {1, S, 1, D};
  if ((cos.shape != flat && cos.shape != bsnd) || sin.shape != cos.shape)
    op.invalid(fmt::format("cos and sin must be [{}, {}] or [1, {}, 1, {}]", S, D, S, D));
  CompiledKernel out;
  out.outputs = {x};
  if (x.num_elements() == 0) return out;
  if (D % kDimMultiple != 0)
    op.fail(fmt::format("head_dim {}: a multiple of {} is supported", D, kDimMultiple));
  RopeEmitter e(op, ctx.cfg, x.shape[0] * S, S, N, D, device_dtype(x.dtype));
  out.launches.push_back(e.build(ctx.cfg));
  return out;
}

}  // namespace npusim::compiler::ops
