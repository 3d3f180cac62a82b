// WeightQuantBatchMatmulV2 (CANN's weight-only quantised MatMul, as Ascend's quantised
// inference runs decoder models):
//
//   y[M, N] = x[M, K] @ (weight[K, N] * antiquant_scale[N])
//
// x, antiquant_scale and y of type T (f16 or bf16); weight int8, one scale per output channel
// (column). Leading dims of x are flattened into M ([..., K] -> [..., N]). Not supported (a
// clear CompileError): antiquant_offset, per-group scales, transposes, bias, quant_scale.
//
// One mix kernel (split chips: per block a cube core and its aiv_per_aic vector cores), as
// CANN's kernel on 910B does it: the vector cores read the int8 weights from GM and dequantise
// them on chip, the cube multiplies in T with f32 accumulation. HBM sees the weights once, as
// int8: half the bytes of a T weight.
//
// A block takes units (row block of mq rows of x) x (column tile of tn columns) round robin;
// for each unit, K in chunks of tk rows of the weight:
//
//   vector core v     rows [v * half, (v + 1) * half) of the chunk (half = tk / aiv_per_aic):
//                       int8 rows from GM (copy_gm2ub, row stride N) -> vconv to f16 ->
//                       [f16 -> f32] vmul by the tile's scales (one row of tn, read for every
//                       weight row: src1 repeat stride 0) [-> vconv to bf16] -> the block's
//                       workspace slot g & 1 (g: the block's chunk count so far), cc_set
//                       kWeightReady.
//   cube core         per chunk: wait kWeightReady from every vector core; x rows (nd2nz, rows
//                       past M zero) and the dequantised chunk (nd2nz) into L1, cc_set
//                       kSlotFree; load2d into L0A (Zz) / L0B (Zn); mmad into L0C (init on the
//                       unit's first chunk); after the last chunk FIXPIPE rounds the unit's
//                       valid rows to T into y.
//
// Synchronisation: inside a core every buffer is a Channel (producer pipe, consumer pipe, a full
// and a free flag); between the cores cross-core counting flags (cc_set mode 2): vector core v's
// weight_ready(v) counts on the cube core (once per chunk), kSlotFree on each vector core. The
// cube core sets kSlotFree twice at the start (both slots free), the vector cores wait for it
// before writing a slot and twice more at the end, so every set is consumed. Each vector core
// has its own ready id: with two slots a vector core may finish chunks g and g + 1 before the
// other finishes g, and one shared counter would then let the cube read slot g half written.
//
// Numerics: the dequantised weight is round_T(w * s): the product of an int8 (exact in f16) and
// a T scale is exact in f32, so the f16 vmul and bf16's f32 vmul each round it once. The
// products accumulate in f32 in L0C, rounded once to T by FIXPIPE: y is the T MatMul of x and
// the dequantised weight, as an unfused Cast, Mul and MatMul in T would compute it.
// Traffic: x is read once per column tile (from L2 after the first), the weight once as int8,
// the workspace (two slots of tk x tn T per block) written and re-read within L2, y written.
#include <algorithm>

#include <fmt/format.h>

#include "adapter/compiler/buffer_plan.h"
#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/pipe_channel.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/row_kernel.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using isa::Pipe;

namespace {

constexpr int64_t kFrac = 16;                          // rows / columns of a fractal
constexpr int64_t kFracBytes = layout::kFractalBytes;  // one 16 x 16 16-bit fractal
constexpr int64_t kRowsMax = 128;                      // mq at most (the cube's m per unit)
constexpr uint64_t kLine = 512;                        // workspace slots start on L2 lines
constexpr int64_t kCcMode = 2;                         // cube core <-> its vector cores
constexpr int kSlotFree = 0;                           // cross-core flag ids: kSlotFree and
int weight_ready(int v) { return 1 + v; }              // one per vector core of the group

struct QuantMatmulProblem {
  int64_t m = 0, k = 0, n = 0;
  Dtype type = Dtype::F16;  // x, scale, y
};

struct QuantMatmulTiling {
  int64_t mq = 0;    // rows of x per unit (multiple of 16)
  int64_t tn = 0;    // weight columns per unit (32, 64 or 128; divides N)
  int64_t tk = 0;    // weight rows per chunk (divides K)
  int64_t half = 0;  // weight rows per vector core and chunk
  int64_t m_blocks = 0, n_tiles = 0, units = 0, chunks = 0;
  int block_dim = 0;
  uint64_t slot_bytes = 0;  // one workspace slot (tk x tn of T), whole L2 lines
  std::string str() const {
    return fmt::format(
        "mq {} tn {} tk {} ({} rows per vector core), {} units x {} chunks over "
        "{} groups",
        mq, tn, tk, half, units, chunks, block_dim);
  }
};

using Channel = PipeChannel;  // ops/pipe_channel.h

// The buffers of a tile choice (one plan per buffer kind: the fit check and the allocation use
// the same lists).
struct QuantMatmulPlans {
  BufferPlan l1{Buf::L1}, l0a{Buf::L0A}, l0b{Buf::L0B}, l0c{Buf::L0C}, ub{Buf::UB};
  BufferPlan::Id l1_x, l1_w, l0a_x, l0b_w, l0c_y, ub_w8, ub_w[2], ub_w32, ub_scale, ub_scale32;

  QuantMatmulPlans(int64_t mq, int64_t tn, int64_t tk, int64_t half, Dtype t) {
    const int64_t tsz = isa::dtype_size(t);
    const bool wide = t != Dtype::F16;  // bf16 scales in f32 (the vector unit has no bf16 mul)
    l1_x = l1.add_fixed("x rows (NZ)", mq * tk * tsz);
    l1_w = l1.add_fixed("dequantised weight chunk (NZ)", tk * tn * tsz);
    l0a_x = l0a.add_fixed("x (Zz)", mq * tk * tsz);
    l0b_w = l0b.add_fixed("weight (Zn)", tk * tn * tsz);
    l0c_y = l0c.add_fixed("y accumulators", mq * tn * kL0cElemBytes);
    ub_w8 = ub.add_fixed("int8 weight rows", rnd(half * tn));
    for (BufferPlan::Id& w : ub_w)  // ping / pong by chunk: a store overlaps the next chunk
      w = ub.add_fixed("dequantised weight rows", rnd(half * tn * tsz));
    ub_w32 = ub.add_fixed("weight rows (f32)", wide ? half * tn * kLaneBytes : 0);
    ub_scale = ub.add_fixed("scales of the column tile", rnd(tn * tsz));
    ub_scale32 = ub.add_fixed("scales (f32)", wide ? tn * kLaneBytes : 0);
    declare_repeat_overhang(ub);
  }
};

class QuantMatmulKernel {
 public:
  QuantMatmulKernel(const QuantMatmulProblem& p, const QuantMatmulTiling& t, const ChipConfig& cfg,
                    const std::string& op)
      : m_p(p),
        m_t(t),
        m_cfg(cfg),
        m_tsz(isa::dtype_size(p.type)),
        m_plans(t.mq, t.tn, t.tk, t.half, p.type),
        m_b(fmt::format("WeightQuantMatmul_{}", isa::dtype_name(p.type)), op, cfg) {}

  BuiltKernel build() {
    m_b.declare_arg("x", m_p.type, {m_p.m, m_p.k});
    m_b.declare_arg("weight", Dtype::S8, {m_p.k, m_p.n});
    m_b.declare_arg("antiquant_scale", m_p.type, {m_p.n});
    m_b.declare_arg("y", m_p.type, {m_p.m, m_p.n});
    m_b.declare_arg("ws");
    cube_section();
    vector_section();
    return m_b.finish();
  }

 private:
  // The block's units u = block, block + blocks, ...; body(u, m0 (first row), n0 (first column)).
  void for_units(const std::function<void(const Reg& m0, const Reg& n0)>& body) {
    KernelBuilder& b = m_b;
    Reg u = b.reg("unit"), blocks = b.reg("blocks");
    b.emit(Opcode::op_get_block_id, {u});
    b.emit(Opcode::op_get_block_num, {blocks});
    b.for_range(u, u, m_t.units, blocks, [&] {
      Reg m0 = b.reg("unit: first row"), n0 = b.reg("unit: first column");
      b.div(m0, u, m_t.n_tiles);
      b.mul(m0, m0, m_t.mq);
      b.rem(n0, u, m_t.n_tiles);
      b.mul(n0, n0, m_t.tn);
      body(m0, n0);
    });
  }

  // m_slot = this block's workspace; d = its slot g & 1.
  void load_slot() {
    KernelBuilder& b = m_b;
    m_slot = b.reg("workspace of this group");
    Reg blk = b.reg("block");
    b.emit(Opcode::op_get_block_id, {blk});
    b.mul(m_slot, blk, static_cast<int64_t>(2 * m_t.slot_bytes));
    Reg ws = b.load_arg("ws");
    b.add(m_slot, m_slot, ws);
    m_g = b.reg_imm("chunks so far (slot parity)", 0);
  }
  void slot_addr(const Reg& d) {
    m_b.and_(d, m_g, 1);
    m_b.mul_add(d, d, static_cast<int64_t>(m_t.slot_bytes), m_slot, "slot g & 1");
  }

  // ---- cube core ----

  void cube_section() {
    KernelBuilder& b = m_b;
    b.begin_section(b.cube_core_kind());
    const auto l1 = m_plans.l1.allocate(b, 0);
    const auto l0a = m_plans.l0a.allocate(b, 0);
    const auto l0b = m_plans.l0b.allocate(b, 0);
    const auto l0c = m_plans.l0c.allocate(b, 0);
    m_l1_x = l1[m_plans.l1_x];
    m_l1_w = l1[m_plans.l1_w];
    m_l0a = l0a[m_plans.l0a_x];
    m_l0b = l0b[m_plans.l0b_w];
    m_l0c = l0c[m_plans.l0c_y];
    const Channel cl1(b, Pipe::MTE2, Pipe::MTE1, "L1 x and weight"),
        cl0(b, Pipe::MTE1, Pipe::M, "L0A / L0B"), cl0c(b, Pipe::M, Pipe::FIX, "L0C y");
    for (const Channel* c : {&cl1, &cl0, &cl0c}) c->start(b);
    load_slot();
    for (int s = 0; s < 2; ++s)
      b.emit(Opcode::op_cc_set, {Pipe::MTE2, kCcMode, kSlotFree}, "workspace slot free");
    for_units([&](const Reg& m0, const Reg& n0) {
      Reg rows = b.reg("unit: valid rows");
      b.movi(rows, m_p.m);
      b.sub(rows, rows, m0);
      b.min(rows, rows, m_t.mq);
      cl0c.acquire(b);
      Reg c = b.reg("chunk");
      b.movi(c, 0);
      cube_chunk(c, m0, rows, cl1, cl0, 0);
      b.for_range(c, 1, m_t.chunks, 1, [&] { cube_chunk(c, m0, rows, cl1, cl0, 1); });
      cl0c.publish(b);
      cl0c.take(b);
      {
        KernelBuilder::Origin o(b, "y tile (T, ND)");
        Reg dst = b.reg("y address");
        b.mul_add(dst, m0, m_p.n, n0);
        b.mul(dst, dst, m_tsz);
        Reg y = b.load_arg("y");
        b.add(dst, dst, y);
        b.emit(Opcode::op_fixpipe,
               {Dtype::F32, m_p.type, Buf::GM, dst, m_l0c, rows, m_t.tn, m_p.n, 1, 0, 0},
               "y rows, rounded once");
      }
      cl0c.release(b);
    });
    m_slot.release();
    m_g.release();
    for (const Channel* c : {&cl1, &cl0, &cl0c}) c->drain(b);
    b.end();
  }

  // Chunk c of the unit: x[m0 : m0 + rows, c * tk : (c + 1) * tk] and the dequantised weight
  // chunk (slot g & 1) -> L1 -> L0A / L0B -> mmad (init 0: the unit's first chunk, else 1).
  void cube_chunk(const Reg& c, const Reg& m0, const Reg& rows, const Channel& cl1,
                  const Channel& cl0, int init) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "one K chunk: x and the dequantised weight -> L1 -> L0 -> mmad");
    for (int v = 0; v < m_cfg.aiv_per_aic; ++v)
      b.emit(Opcode::op_cc_wait, {Pipe::MTE2, weight_ready(v)},
             "wait: weight rows of vector core " + std::to_string(v));
    {
      Reg src = b.reg("x address");
      b.mul(src, m0, m_p.k);
      b.mul_add(src, c, m_t.tk, src);
      b.mul(src, src, m_tsz);
      Reg x = b.load_arg("x");
      b.add(src, src, x);
      cl1.acquire(b);
      b.emit(Opcode::op_nd2nz, {m_p.type, m_l1_x, src, rows, m_t.tk, m_p.k, m_t.mq},
             "x rows (ND -> NZ, rows past M zero)");
      slot_addr(src);
      b.emit(Opcode::op_nd2nz, {m_p.type, m_l1_w, src, m_t.tk, m_t.tn, m_t.tn, m_t.tk},
             "dequantised weight chunk (ND -> NZ)");
      b.emit(Opcode::op_cc_set, {Pipe::MTE2, kCcMode, kSlotFree}, "workspace slot read");
      b.add(m_g, m_g, 1);
      cl1.publish(b);
    }
    cl1.take(b);
    cl0.acquire(b);
    // A: NZ [tk/16][mq][16] -> Zz: row block i = tk/16 fractals at a stride of mq/16.
    for (int64_t i = 0; i < m_t.mq / kFrac; ++i)
      b.emit(Opcode::op_load2d,
             {m_p.type, Buf::L0A, m_l0a + i * (m_t.tk / kFrac) * kFracBytes,
              m_l1_x + i * kFracBytes, m_t.tk / kFrac, m_t.mq / kFrac, 0},
             "x row block");
    // B: NZ [tn/16][tk][16]; k block i = tn/16 fractals at a stride of tk/16, transposed (Zn).
    for (int64_t i = 0; i < m_t.tk / kFrac; ++i)
      b.emit(Opcode::op_load2d,
             {m_p.type, Buf::L0B, m_l0b + i * (m_t.tn / kFrac) * kFracBytes,
              m_l1_w + i * kFracBytes, m_t.tn / kFrac, m_t.tk / kFrac, 1},
             "weight k block");
    cl1.release(b);
    cl0.publish(b);
    cl0.take(b);
    // m = the unit's valid rows: L0C's layout then has the row blocks FIXPIPE reads.
    b.emit(Opcode::op_mmad, {m_p.type, m_l0c, m_l0a, m_l0b, rows, m_t.tk, m_t.tn, init, 0},
           init ? "y += x w" : "y = x w");
    cl0.release(b);
  }

  // ---- vector cores ----

  // Normal-mode mask: lanes [0, lanes) of a repeat (up to 128).
  void set_mask(int64_t lanes) {
    const uint64_t lo = lane_range(0, std::min<int64_t>(lanes, 64));
    const uint64_t hi = lanes > 64 ? lane_range(0, lanes - 64) : 0;
    m_b.emit(Opcode::op_set_mask, {static_cast<int64_t>(hi), static_cast<int64_t>(lo)});
  }

  // dst rows (half rows of tn lanes of type t, contiguous) *= the scale row at `scale`: per
  // 256-byte column slab one vmul over all rows, the scale's repeat stride 0.
  void scale_rows(Dtype t, uint64_t rows_at, uint64_t scale_at) {
    const int64_t esz = isa::dtype_size(t), lanes = vec::kRepeatBytes / esz;
    const int64_t row_blocks = m_t.tn * esz / kBlock;
    for (int64_t c0 = 0; c0 < m_t.tn; c0 += lanes) {
      set_mask(std::min(lanes, m_t.tn - c0));
      const uint64_t off = static_cast<uint64_t>(c0 * esz);
      vec_binary_strided(m_b, Opcode::op_vmul, t, VOperand(rows_at + off, 1, row_blocks),
                         VOperand(rows_at + off, 1, row_blocks), VOperand(scale_at + off, 1, 0),
                         m_t.half);
    }
  }

  void vector_section() {
    KernelBuilder& b = m_b;
    b.begin_section(b.vector_core_kind());
    const auto ub = m_plans.ub.allocate(b, 0);
    const uint64_t w8 = ub[m_plans.ub_w8], w32 = ub[m_plans.ub_w32], scale = ub[m_plans.ub_scale],
                   scale32 = ub[m_plans.ub_scale32];
    const bool wide = m_p.type != Dtype::F16;
    const Channel cin(b, Pipe::MTE2, Pipe::V, "int8 weight rows"),
        cs(b, Pipe::MTE2, Pipe::V, "scales");
    const uint64_t w_at[2] = {ub[m_plans.ub_w[0]], ub[m_plans.ub_w[1]]};
    const Channel cout[2] = {Channel(b, Pipe::V, Pipe::MTE3, "dequantised rows (ping)"),
                             Channel(b, Pipe::V, Pipe::MTE3, "dequantised rows (pong)")};
    for (const Channel* c : {&cin, &cs, &cout[0], &cout[1]}) c->start(b);
    Reg sub = b.reg("vector core in the group");
    b.emit(Opcode::op_get_subblock_id, {sub});
    load_slot();
    const int64_t lanes = m_t.half * m_t.tn;
    for_units([&](const Reg& m0, const Reg& n0) {
      (void)m0;
      {
        KernelBuilder::Origin o(b, "scales of the column tile");
        Reg src = b.reg("scale address");
        b.mul(src, n0, m_tsz);
        Reg a = b.load_arg("antiquant_scale");
        b.add(src, src, a);
        cs.acquire(b);
        b.emit(Opcode::op_copy_gm2ub, {scale, src, 1, rnd(m_t.tn * m_tsz) / kBlock, 0, 0},
               "scales");
        cs.publish(b);
        cs.take(b);
        if (wide) {
          Reg n = b.reg_imm("scales", m_t.tn);
          vec_convert(b, Dtype::F32, m_p.type, scale32, scale, RoundMode::kRint, n);
        }
      }
      Reg c = b.reg("chunk");
      b.for_range(c, 0, m_t.chunks, 1, [&] {
        KernelBuilder::Origin o(b, "dequantise this core's rows of a K chunk");
        {
          // Weight rows k0 = c * tk + sub * half .. + half, columns n0 .. n0 + tn.
          Reg src = b.reg("weight address");
          b.mul(src, c, m_t.tk);
          b.mul_add(src, sub, m_t.half, src);
          b.mul_add(src, src, m_p.n, n0);
          Reg wa = b.load_arg("weight");
          b.add(src, src, wa);
          cin.acquire(b);
          b.emit(Opcode::op_copy_gm2ub,
                 {w8, src, m_t.half, m_t.tn / kBlock, (m_p.n - m_t.tn) / kBlock, 0},
                 "int8 weight rows (one row a burst)");
          cin.publish(b);
        }
        cin.take(b);
        // Buffer g & 1 (the workspace slot's parity): chunk g + 1 converts while g is stored.
        Reg parity = b.reg("chunk parity");
        b.and_(parity, m_g, 1);
        b.by_parity(parity, [&](int par) {
          const Channel& co = cout[par];
          const uint64_t w = w_at[par];
          co.acquire(b);
          Reg n = b.reg_imm("weight elements", lanes);
          if (wide) {
            vec_convert(b, Dtype::F16, Dtype::S8, w, w8, RoundMode::kRint, n);
            cin.release(b);
            vec_convert(b, Dtype::F32, Dtype::F16, w32, w, RoundMode::kRint, n);
            scale_rows(Dtype::F32, w32, scale32);
            vec_convert(b, m_p.type, Dtype::F32, w, w32, RoundMode::kRint, n);
          } else {
            vec_convert(b, Dtype::F16, Dtype::S8, w, w8, RoundMode::kRint, n);
            cin.release(b);
            scale_rows(Dtype::F16, w, scale);
          }
          co.publish(b);
          co.take(b);
          b.emit(Opcode::op_cc_wait, {Pipe::MTE3, kSlotFree}, "wait: workspace slot free");
          {
            Reg dst = b.reg("slot rows");
            slot_addr(dst);
            b.mul_add(dst, sub, m_t.half * m_t.tn * m_tsz, dst);
            b.emit(Opcode::op_copy_ub2gm, {dst, w, 1, rnd(lanes * m_tsz) / kBlock, 0, 0},
                   "dequantised rows to the workspace");
          }
          for (int v = 0; v < m_cfg.aiv_per_aic; ++v)  // this core's id: v == sub
            b.if_(eq(sub, v), [&] {
              b.emit(Opcode::op_cc_set, {Pipe::MTE3, kCcMode, weight_ready(v)},
                     "weight rows ready");
            });
          co.release(b);
        });
        b.add(m_g, m_g, 1);
      });
      cs.release(b);
    });
    for (int s = 0; s < 2; ++s)
      b.emit(Opcode::op_cc_wait, {Pipe::MTE3, kSlotFree}, "the cube's last two slot frees");
    m_slot.release();
    m_g.release();
    for (const Channel* c : {&cin, &cs, &cout[0], &cout[1]}) c->drain(b);
    b.end();
  }

  const QuantMatmulProblem& m_p;
  const QuantMatmulTiling& m_t;
  const ChipConfig& m_cfg;
  int64_t m_tsz;
  QuantMatmulPlans m_plans;
  KernelBuilder m_b;
  Reg m_slot, m_g;
  uint64_t m_l1_x = 0, m_l1_w = 0, m_l0a = 0, m_l0b = 0, m_l0c = 0;
};

QuantMatmulTiling plan_quant_matmul(const QuantMatmulProblem& p, const ChipConfig& cfg,
                                    const std::string& op) {
  if (!cfg.split)
    throw CompileError(op +
                       ": WeightQuantBatchMatmulV2 is a mix kernel (cube and vector cores of a "
                       "split chip); this chip is coupled");
  const CoreKindConfig& cube = cube_core(cfg, op);
  require_l0c_to_gm(cfg, op, "the quantised MatMul's y tiles");
  const VectorCores vec = VectorCores::of(cfg);
  const int64_t per = cfg.aiv_per_aic;
  if (weight_ready(cfg.aiv_per_aic - 1) >= cfg.cross_core_flag_ids)
    throw CompileError(fmt::format(
        "{}: WeightQuantBatchMatmulV2 needs {} cross-core flag ids (one per vector core of a "
        "group and one more); the chip has {} (sync.cross_core_flag_ids)",
        op, weight_ready(cfg.aiv_per_aic - 1) + 1, cfg.cross_core_flag_ids));
  QuantMatmulTiling t;
  t.mq = std::min(kRowsMax, round_up(p.m, kFrac));
  // tn: of 128, 64, 32 dividing N, the one with the least work on the busiest core: rounds of
  // units over the cube cores x (tn + 32), a unit's work taken as its columns plus a fixed cost
  // of about 32 columns (its chunks' hand-overs; an estimate). A decode step's K / V projections
  // (N 512) get narrow tiles spread over the cores, wide layers 128 columns.
  const int64_t m_blocks = ceil_div(p.m, t.mq);
  int64_t best = 0;
  for (int64_t tn : {int64_t{128}, int64_t{64}, int64_t{32}}) {
    if (p.n % tn) continue;
    const int64_t cost = ceil_div(m_blocks * (p.n / tn), cube.count) * (tn + 32);
    if (t.tn == 0 || cost < best) {
      t.tn = tn;
      best = cost;
    }
  }
  // tk: divides K, each vector core's share a whole number of 16-row fractal rows.
  for (int64_t tk : {int64_t{256}, int64_t{128}, int64_t{64}, int64_t{32}}) {
    if (t.tk || p.k % tk || tk % (per * kFrac)) continue;
    QuantMatmulPlans plans(t.mq, t.tn, tk, tk / per, p.type);
    if (plan_fits(plans.l1, cfg, cube) && plan_fits(plans.l0a, cfg, cube) &&
        plan_fits(plans.l0b, cfg, cube) && plan_fits(plans.l0c, cfg, cube) &&
        plans.ub.fit(cfg, vec.kind, 1, 1) == 1)
      t.tk = tk;
  }
  if (t.tk == 0)
    throw CompileError(
        fmt::format("{}: no tile fits the chip's buffers (K {}, N {})", op, p.k, p.n));
  t.half = t.tk / per;
  t.m_blocks = ceil_div(p.m, t.mq);
  t.n_tiles = p.n / t.tn;
  t.units = t.m_blocks * t.n_tiles;
  t.chunks = p.k / t.tk;
  t.block_dim = static_cast<int>(std::min<int64_t>(cube.count, t.units));
  t.slot_bytes = round_up(static_cast<uint64_t>(t.tk * t.tn * isa::dtype_size(p.type)), kLine);
  return t;
}

// Checks the op: inputs (x [..., K], weight [K, N] int8, antiquant_scale [N] or any shape of N
// elements), T f16 or bf16.
QuantMatmulProblem parse(const OpDesc& op) {
  if (op.inputs.size() != 3)
    op.fail(
        fmt::format("takes x, weight and antiquant_scale ({} inputs given); antiquant_offset, "
                    "quant_scale, quant_offset and bias are not supported",
                    op.inputs.size()));
  const TensorDesc &x = op.inputs[0], &w = op.inputs[1], &s = op.inputs[2];
  if (x.dtype != DataType::F16 && x.dtype != DataType::BF16)
    op.fail(fmt::format("x is {}; takes f16 or bf16", data_type_name(x.dtype)));
  if (w.dtype != DataType::S8) op.invalid(fmt::format("weight {} must be int8", w.str()));
  if (s.dtype != x.dtype) op.invalid("antiquant_scale must have x's dtype");
  if (op.attr_bool("transpose_x", false) || op.attr_bool("transpose_weight", false))
    op.fail("transpose_x / transpose_weight are not supported");
  if (op.attr_int("antiquant_group_size", 0) != 0)
    op.fail("per-group scales (antiquant_group_size) are not supported: one scale per column");
  if (x.shape.empty() || w.shape.size() != 2 || x.shape.back() != w.shape[0])
    op.invalid(
        fmt::format("x {} and weight {} do not chain ([..., K] x [K, N])", x.str(), w.str()));
  QuantMatmulProblem p;
  p.k = w.shape[0];
  p.n = w.shape[1];
  p.m = x.num_elements() / std::max<int64_t>(p.k, 1);
  p.type = device_dtype(x.dtype);
  if (s.num_elements() != p.n)
    op.invalid(
        fmt::format("antiquant_scale {} must have one value per output column ({})", s.str(), p.n));
  if (p.n % 32 != 0 || p.k % 32 != 0)
    op.fail(fmt::format("K {} and N {} must be multiples of 32", p.k, p.n));
  return p;
}

}  // namespace

CompiledKernel compile_weight_quant_matmul(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const QuantMatmulProblem p = parse(op);
  CompiledKernel out;
  std::vector<int64_t> y_shape = op.inputs[0].shape;
  y_shape.back() = p.n;
  out.outputs = {TensorDesc{op.inputs[0].dtype, y_shape}};
  if (p.m == 0 || p.n == 0) return out;
  if (p.k == 0) op.fail("K = 0 is not supported");
  const QuantMatmulTiling t = plan_quant_matmul(p, ctx.cfg, op.str());
  QuantMatmulKernel k(p, t, ctx.cfg, op.str());
  Launch l;
  l.kernel = k.build();
  l.block_dim = t.block_dim;
  l.args = {{ArgRef::Kind::kInput, 0},
            {ArgRef::Kind::kInput, 1},
            {ArgRef::Kind::kInput, 2},
            {ArgRef::Kind::kOutput, 0},
            {ArgRef::Kind::kWorkspace, 0, 0}};
  l.summary = "weight-only int8 MatMul: " + t.str();
  out.launches.push_back(std::move(l));
  out.workspace_bytes = static_cast<uint64_t>(t.block_dim) * 2 * t.slot_bytes;
  return out;
}

}  // namespace npusim::compiler::ops
