// Fused attention as CANN has it for decoder models: FlashAttentionScore, PromptFlashAttention
// (prefill) and IncreFlashAttention (one decode step against a KV cache of a valid length).
//
//   O = softmax(Q K^T * scale + mask) V,  Q, O [B, Sq, N, D], K, V [B, Skv, Nkv, D] (BSND)
//
// One mix kernel (split chips: a cube core and its vector cores per block), FlashAttention's
// online softmax: the score matrix exists only one tile at a time and never as a tensor.
// A block takes units (ops/attention.h) round robin; for each unit of mq query rows:
//
//   cube core            Q -> L1 -> L0A once; per KV tile j of tk keys:
//                          S_j = Q K_j^T  (K_j: nd2nz, load2d into L0B as B^T, mmad, FIXPIPE
//                          f32 into the group's S slot j & 1 in the workspace), cc_set;
//                          then, after both vector cores published P_j:
//                          PV_j = P_j V_j (P_j and V_j: nd2nz, load2d, mmad, FIXPIPE f32), cc_set.
//                        S_{j+1} is computed before waiting for P_j, so the cube's S of the next
//                        tile overlaps the vector cores' softmax of this one.
//   vector core v        rows [v * half, (v + 1) * half) of the unit, f32 in the UB:
//                          m = -inf, l = 0, O = 0; per tile: S_j * scale, masked (key index >=
//                          the row's limit -> -inf), m' = max(m, rowmax S), alpha = exp(m - m'),
//                          P = exp(S - m'), l = l * alpha + rowsum P, P (input type) to the P
//                          slot, cc_set; then O = O * alpha + PV_j; at the end O / l, rounded
//                          to the output type, stored into O's rows. The softmax of tile j + 1
//                          runs before the update with PV_j, so the cube's PV_j overlaps it.
//                          The mask instructions run only on tiles some row sees partly.
//
// The row limit (keys [0, limit) visible) is min(kv_len, i + offset + 1) for query position i
// with a causal mask, else kv_len; tiles past the unit's last visible key are not visited.
// Keys past kv_len in the last tile are zero rows in L1 (nd2nz zero-fills), so they score 0,
// are masked to -inf and weigh 0 against zero V rows.
//
// Workspace: per mix group a ping and a pong slot (by KV tile parity) for each of S (f32), P (the
// input type) and P V (f32).
// Traffic: Q, K, V are read from GM and O written; the workspace is written and read again
// within L2, so HBM sees it once per group, not once per tile (test_compiler_attention.cpp
// checks the HBM counters against this).
//
// Synchronisation: within a core every buffer is a Channel (producer pipe, consumer pipe, a
// full and a free flag; buffers start free); between the cores cross-core counting flags
// (cc_set mode 2): kScoresReady and kPvReady count on each vector core, vector core v's
// probs_ready(v) on the cube core (once per KV tile). Each vector core has its own ready id: the
// cube computes S_{j+1} before it waits for P_j, so one vector core may publish P_j and P_{j+1}
// before the other publishes P_j; one counter shared by both would then let the cube read P slot
// j & 1 half written (and overwrite the S slot the slower core still reads).
//
// Numerics: S and P V accumulate in f32 on the cube; the softmax runs in f32 (vexp, f32 max
// and sums); P is rounded to the input type before the product with V (as CANN's kernels do);
// O is divided by l in f32 and rounded once. A row none of whose keys is visible cannot occur
// (key 0 is visible to every query: offset >= 0).
#include "adapter/compiler/ops/attention.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

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
constexpr int64_t kRowsMax = 128;                      // mq at most (cube m, UB rows)
constexpr uint64_t kLine = 512;                        // workspace pieces per L2 line
constexpr int64_t kCcMode = 2;                         // cube core <-> its vector cores
constexpr int kScoresReady = 0, kPvReady = 1;          // cross-core flag ids: these two and
int probs_ready(int v) { return 2 + v; }               // one per vector core of the group

using Channel = PipeChannel;  // ops/pipe_channel.h

// The buffers of a tile choice, one plan per buffer kind (declared once: the fit check and the
// allocation use the same lists).
struct AttentionPlans {
  BufferPlan l1{Buf::L1}, l0a{Buf::L0A}, l0b{Buf::L0B}, l0c{Buf::L0C}, ub{Buf::UB};
  BufferPlan::Id l1_q, l1_k, l1_p, l1_v, l0a_q, l0a_p, l0b_k, l0b_v, l0c_s, l0c_pv;
  BufferPlan::Id ub_s, ub_p, ub_pv, ub_o, ub_o16, ub_acc, ub_m, ub_l, ub_alpha, ub_alpha_prev,
      ub_red, ub_thr, ub_rep, ub_bits, ub_iota, ub_neginf, ub_scratch, ub_alt;

  AttentionPlans(int64_t mq, int64_t half, int64_t tk, int64_t dim, int64_t isz) {
    l1_q = l1.add_fixed("Q (NZ)", mq * dim * isz);
    l1_k = l1.add_fixed("K tile (NZ)", tk * dim * isz);
    l1_p = l1.add_fixed("P tile (NZ)", mq * tk * isz);
    l1_v = l1.add_fixed("V tile (NZ)", tk * dim * isz);
    l0a_q = l0a.add_fixed("Q (Zz)", mq * dim * isz);
    l0a_p = l0a.add_fixed("P (Zz)", mq * tk * isz);
    l0b_k = l0b.add_fixed("K^T (Zn)", tk * dim * isz);
    l0b_v = l0b.add_fixed("V (Zn)", tk * dim * isz);
    l0c_s = l0c.add_fixed("S", mq * tk * kL0cElemBytes);
    l0c_pv = l0c.add_fixed("P V", mq * dim * kL0cElemBytes);
    const int64_t dense = rnd(half * kLaneBytes);
    ub_s = ub.add_fixed("S rows (f32)", half * tk * kLaneBytes);
    ub_p = ub.add_fixed("P rows", rnd(half * tk * isz));
    ub_pv = ub.add_fixed("P V rows (f32)", half * dim * kLaneBytes);
    ub_o = ub.add_fixed("O accumulator (f32)", half * dim * kLaneBytes);
    ub_o16 = ub.add_fixed("O rows", rnd(half * dim * isz));
    ub_acc = ub.add_fixed("lane accumulator", half * kSlotBytes);
    ub_m = ub.add_fixed("row max m", dense);
    ub_l = ub.add_fixed("row sum l", dense);
    ub_alpha = ub.add_fixed("rescale exp(m - m') of the newest tile", dense);
    ub_alpha_prev = ub.add_fixed("rescale of the tile before", dense);
    ub_red = ub.add_fixed("tile row max / sum", dense);
    ub_thr = ub.add_fixed("row key limit", dense);
    ub_rep = ub.add_fixed("per-row value blocks", half * kBlock);
    ub_bits = ub.add_fixed("mask bits", rnd(half * 8));
    ub_iota = ub.add_fixed("key index 0..tk-1 (f32)", tk * kLaneBytes);
    ub_neginf = ub.add_fixed("-inf repeat", kSlotBytes);
    ub_scratch = ub.add_fixed("replicate scratch", replicate_scratch_bytes(half));
    ub_alt = ub.add_fixed("replicate pattern", alt_pattern_bytes(half));
    declare_repeat_overhang(ub);
  }
};

// The element offsets and extents of one unit (both sections compute them from u).
struct UnitRegs {
  Reg q_off;   // element offset of the unit's first row in Q (and O)
  Reg kv_off;  // element offset of key 0 of the unit's KV head in K (and V)
  Reg rows;    // valid rows of the unit (<= mq)
  Reg q0;      // position of row 0 (per-head units; 0 when grouped)
  Reg tiles;   // KV tiles to visit
  Reg kv_len;  // device lengths: the keys this unit's batch entry takes (else unused)
};

class AttentionKernel {
 public:
  AttentionKernel(const AttentionProblem& p, const AttentionTiling& t, const ChipConfig& cfg,
                  const std::string& op)
      : m_p(p),
        m_t(t),
        m_cfg(cfg),
        m_isz(isa::dtype_size(p.type)),
        m_plans(t.mq, t.half, t.tk, p.dim, m_isz),
        m_b(fmt::format("Attention_{}", isa::dtype_name(p.type)), op, cfg) {}

  BuiltKernel build() {
    const std::vector<int64_t> q_dims = {m_p.batch, m_p.seq_q, m_p.heads, m_p.dim};
    const std::vector<int64_t> kv_dims = {m_p.batch, m_p.seq_kv, m_p.kv_heads, m_p.dim};
    m_b.declare_arg("q", m_p.type, q_dims);
    m_b.declare_arg("k", m_p.type, kv_dims);
    m_b.declare_arg("v", m_p.type, kv_dims);
    m_b.declare_arg("o", m_p.type, q_dims);
    m_b.declare_arg("ws");
    if (m_p.device_len)
      m_b.declare_arg("actual_seq_lengths", device_dtype(m_p.len_type), {m_p.len_count});
    cube_section();
    vector_section();
    return m_b.finish();
  }

 private:
  int64_t q_row_stride() const { return m_t.grouped ? m_p.dim : m_p.heads * m_p.dim; }
  int64_t kv_row_stride() const { return m_p.kv_heads * m_p.dim; }

  // Unit u's coordinates (UnitRegs); registers allocated here.
  void unit_coords(const Reg& u, UnitRegs& r) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "unit coordinates");
    r.q_off = b.reg("unit: Q offset");
    r.kv_off = b.reg("unit: KV offset");
    r.rows = b.reg("unit: rows");
    r.q0 = b.reg("unit: first position");
    r.tiles = b.reg("unit: KV tiles");
    Reg bb = b.reg("unit: batch"), h = b.reg("unit: head");
    if (m_p.device_len && !m_t.grouped)
      b.fail("internal: device lengths need grouped units (one query position)");
    if (m_t.grouped) {
      // u = bb * Nkv + g: rows = the G query heads g*G .. g*G + G - 1 at position 0.
      b.div(bb, u, m_p.kv_heads);
      b.rem(h, u, m_p.kv_heads, "KV head");
      b.mul(r.q_off, bb, m_p.heads);
      b.mul_add(r.q_off, h, m_t.group, r.q_off);
      b.mul(r.q_off, r.q_off, m_p.dim);
      b.movi(r.rows, m_t.group);
      b.movi(r.q0, 0);
      if (m_p.device_len) {
        load_kv_len(bb, r);
        b.add(r.tiles, r.kv_len, m_t.tk - 1);
        b.div(r.tiles, r.tiles, m_t.tk, "KV tiles");
      } else {
        b.movi(r.tiles, ceil_div(visible_keys(0, 1), m_t.tk));
      }
    } else {
      // u = (bb * N + n) * q_blocks + qb.
      Reg qb = b.reg("unit: row block");
      b.rem(qb, u, m_t.q_blocks);
      b.div(h, u, m_t.q_blocks);
      b.div(bb, h, m_p.heads);
      b.rem(h, h, m_p.heads, "query head");
      b.mul(r.q0, qb, m_t.mq);
      b.movi(r.rows, m_p.seq_q);
      b.sub(r.rows, r.rows, r.q0);
      b.min(r.rows, r.rows, m_t.mq);
      b.mul_add(r.q_off, bb, m_p.seq_q, r.q0);
      b.mul_add(r.q_off, r.q_off, m_p.heads, h);
      b.mul(r.q_off, r.q_off, m_p.dim);
      b.div(h, h, m_t.group, "KV head");
      if (m_p.causal) {
        // Keys [0, min(kv_len, q0 + rows + offset)) are visible to some row of the unit.
        b.add(r.tiles, r.q0, r.rows);
        b.add(r.tiles, r.tiles, m_p.causal_offset);
        b.min(r.tiles, r.tiles, m_p.kv_len);
      } else {
        b.movi(r.tiles, m_p.kv_len);
      }
      b.add(r.tiles, r.tiles, m_t.tk - 1);
      b.div(r.tiles, r.tiles, m_t.tk, "KV tiles");
    }
    b.mul(r.kv_off, bb, m_p.seq_kv * m_p.kv_heads);
    b.add(r.kv_off, r.kv_off, h);
    b.mul(r.kv_off, r.kv_off, m_p.dim);
  }

  // r.kv_len = actual_seq_lengths[batch entry bb] (element 0 when one length is given) read by
  // the scalar unit, clamped to [1, seq_kv] (a length outside has no meaning for the cache).
  void load_kv_len(const Reg& bb, UnitRegs& r) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "actual_seq_lengths from device memory");
    r.kv_len = b.reg("unit: keys taken");
    Reg a = b.load_arg("actual_seq_lengths");
    const int64_t bytes = data_type_bytes(m_p.len_type);
    if (m_p.len_count > 1) b.mul_add(a, bb, bytes, a);
    b.emit(Opcode::op_ld, {r.kv_len, a}, "the length (8 bytes read)");
    if (m_p.len_type == DataType::S32) {  // sign extension of the low 32 bits
      b.and_(r.kv_len, r.kv_len, 0xffffffffLL);
      b.emit(Opcode::op_xor, {r.kv_len, r.kv_len, 0x80000000LL});
      b.sub(r.kv_len, r.kv_len, 0x80000000LL);
    }
    b.max(r.kv_len, r.kv_len, 1, "clamp to [1, seq_kv]");
    b.min(r.kv_len, r.kv_len, m_p.seq_kv);
  }

  // Keys visible to some of `rows` rows starting at position q0 (compile-time positions).
  int64_t visible_keys(int64_t q0, int64_t rows) const {
    if (!m_p.causal) return m_p.kv_len;
    return std::min(m_p.kv_len, q0 + rows + m_p.causal_offset);
  }

  // d = argument `arg` + (element offset off) * element bytes.
  void gm_addr(const Reg& d, const char* arg, const Reg& off) {
    m_b.mul(d, off, m_isz);
    Reg base = m_b.load_arg(arg);
    m_b.add(d, d, base);
  }

  // d = this group's workspace slot + base + (j & 1) * bytes (ping / pong tiles by KV tile).
  void slot_addr(const Reg& d, const Reg& j, uint64_t base, uint64_t bytes, const char* what) {
    m_b.and_(d, j, 1);
    m_b.mul_add(d, d, static_cast<int64_t>(bytes), m_slot, what);
    if (base) m_b.add(d, d, static_cast<int64_t>(base));
  }

  // m_slot = the workspace slot of this block's mix group.
  void load_slot() {
    KernelBuilder& b = m_b;
    m_slot = b.reg("workspace slot of this group");
    Reg blk = b.reg("block");
    b.emit(Opcode::op_get_block_id, {blk});
    b.mul(m_slot, blk, static_cast<int64_t>(m_t.slot_bytes));
    Reg ws = b.load_arg("ws");
    b.add(m_slot, m_slot, ws);
  }

  // The KV tiles of a unit, one tile ahead: ahead(0); then for j < tiles: each(), ahead(j + 1)
  // if j + 1 < tiles, step(j). (tiles >= 1.)
  void tiles_run_ahead(const Reg& tiles, const std::function<void(const Reg&)>& ahead,
                       const std::function<void(const Reg&)>& step,
                       const std::function<void()>& each = {}) {
    KernelBuilder& b = m_b;
    Reg j = b.reg("KV tile"), next = b.reg("next KV tile");
    b.movi(j, 0);
    ahead(j);
    b.for_range(j, 0, tiles, 1, [&] {
      if (each) each();
      b.add(next, j, 1);
      b.if_(lt(next, tiles), [&] { ahead(next); });
      step(j);
    });
  }

  // The block's loop over its units: u = block, block + blocks, ...
  void for_units(const std::function<void(const Reg& u)>& body) {
    KernelBuilder& b = m_b;
    Reg u = b.reg("unit"), blocks = b.reg("blocks");
    b.emit(Opcode::op_get_block_id, {u});
    b.emit(Opcode::op_get_block_num, {blocks});
    b.for_range(u, u, m_t.units, blocks, [&] { body(u); });
  }

  // ---- cube core ----

  void cube_section() {
    KernelBuilder& b = m_b;
    b.begin_section(b.cube_core_kind());
    const auto l1 = m_plans.l1.allocate(b, 0);
    const auto l0a = m_plans.l0a.allocate(b, 0);
    const auto l0b = m_plans.l0b.allocate(b, 0);
    const auto l0c = m_plans.l0c.allocate(b, 0);
    m_l1_q = l1[m_plans.l1_q];
    m_l1_k = l1[m_plans.l1_k];
    m_l1_p = l1[m_plans.l1_p];
    m_l1_v = l1[m_plans.l1_v];
    m_l0a_q = l0a[m_plans.l0a_q];
    m_l0a_p = l0a[m_plans.l0a_p];
    m_l0b_k = l0b[m_plans.l0b_k];
    m_l0b_v = l0b[m_plans.l0b_v];
    m_l0c_s = l0c[m_plans.l0c_s];
    m_l0c_pv = l0c[m_plans.l0c_pv];
    const Channel l1q(b, Pipe::MTE2, Pipe::MTE1, "L1 Q"), l1k(b, Pipe::MTE2, Pipe::MTE1, "L1 K"),
        l1pv(b, Pipe::MTE2, Pipe::MTE1, "L1 P and V"), l0q(b, Pipe::MTE1, Pipe::M, "L0A Q"),
        l0k(b, Pipe::MTE1, Pipe::M, "L0B K"), l0pv(b, Pipe::MTE1, Pipe::M, "L0 P and V"),
        cs(b, Pipe::M, Pipe::FIX, "L0C S"), cpv(b, Pipe::M, Pipe::FIX, "L0C P V");
    m_ch = {l1q, l1k, l1pv, l0q, l0k, l0pv, cs, cpv};
    for (const Channel& c : m_ch) c.start(b);
    load_slot();
    for_units([&](const Reg& u) {
      UnitRegs r;
      unit_coords(u, r);
      load_q(r, l1q, l0q);
      l0q.take(b);  // M: Q in L0A for the unit's S mmads
      tiles_run_ahead(
          r.tiles, [&](const Reg& j) { scores_tile(j, r, l1k, l0k, cs); },
          [&](const Reg& j) { pv_tile(j, r, l1pv, l0pv, cpv); });
      l0q.release(b);
    });
    m_slot.release();
    for (const Channel& c : m_ch) c.drain(b);
    b.end();
  }

  // Q rows of the unit -> L1 (NZ, rows past `rows` zero) -> L0A (Zz).
  void load_q(const UnitRegs& r, const Channel& l1q, const Channel& l0q) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "Q -> L1 -> L0A");
    {
      Reg src = b.reg("Q address");
      gm_addr(src, "q", r.q_off);
      l1q.acquire(b);
      b.emit(Opcode::op_nd2nz, {m_p.type, m_l1_q, src, r.rows, m_p.dim, q_row_stride(), m_t.mq},
             "Q rows (ND -> NZ)");
      l1q.publish(b);
    }
    l1q.take(b);
    l0q.acquire(b);
    load_a(m_l0a_q, m_l1_q, m_p.dim, "Q row block");
    l1q.release(b);
    l0q.publish(b);
  }

  // An A operand of mq rows and k columns, NZ [k/16][mq][16] in L1 -> Zz in L0A: row block i =
  // k/16 fractals at a stride of mq/16.
  void load_a(uint64_t l0a, uint64_t l1, int64_t k, const char* what) {
    for (int64_t i = 0; i < m_t.mq / kFrac; ++i)
      m_b.emit(Opcode::op_load2d,
               {m_p.type, Buf::L0A, l0a + i * (k / kFrac) * kFracBytes, l1 + i * kFracBytes,
                k / kFrac, m_t.mq / kFrac, 0},
               what);
  }

  // keys = min(tk, kv_len - j * tk); src = the GM address of key j * tk of `arg`.
  void kv_tile(const Reg& j, const UnitRegs& r, const char* arg, const Reg& keys, const Reg& src) {
    KernelBuilder& b = m_b;
    Reg j0 = b.reg("first key");
    b.mul(j0, j, m_t.tk);
    if (m_p.device_len)
      b.mov(keys, r.kv_len);
    else
      b.movi(keys, m_p.kv_len);
    b.sub(keys, keys, j0);
    b.min(keys, keys, m_t.tk, "keys in the tile");
    b.mul_add(src, j0, kv_row_stride(), r.kv_off);
    gm_addr(src, arg, src);
  }

  // S_j = Q K_j^T into the S slot j & 1; cc_set kScoresReady.
  void scores_tile(const Reg& j, const UnitRegs& r, const Channel& l1k, const Channel& l0k,
                   const Channel& cs) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "S = Q K^T (one KV tile)");
    {
      Reg keys = b.reg("keys"), src = b.reg("K address");
      kv_tile(j, r, "k", keys, src);
      l1k.acquire(b);
      b.emit(Opcode::op_nd2nz, {m_p.type, m_l1_k, src, keys, m_p.dim, kv_row_stride(), m_t.tk},
             "K tile (ND -> NZ, keys past the end zero)");
      l1k.publish(b);
    }
    l1k.take(b);
    l0k.acquire(b);
    // NZ K [D/16][tk][16] is K^T's Zn: k block i = tk/16 fractals at stride 1.
    for (int64_t i = 0; i < m_p.dim / kFrac; ++i)
      b.emit(Opcode::op_load2d,
             {m_p.type, Buf::L0B, m_l0b_k + i * (m_t.tk / kFrac) * kFracBytes,
              m_l1_k + i * m_t.tk * layout::kBlockBytes, m_t.tk / kFrac, 1, 0},
             "K^T k block");
    l1k.release(b);
    l0k.publish(b);
    l0k.take(b);
    cs.acquire(b);
    b.emit(Opcode::op_mmad, {m_p.type, m_l0c_s, m_l0a_q, m_l0b_k, m_t.mq, m_p.dim, m_t.tk, 0, 0},
           "S = Q K^T");
    l0k.release(b);
    cs.publish(b);
    cs.take(b);
    {
      Reg dst = b.reg("S slot");
      slot_addr(dst, j, 0, m_t.s_bytes, "S slot j & 1");
      b.emit(Opcode::op_fixpipe,
             {Dtype::F32, Dtype::F32, Buf::GM, dst, m_l0c_s, m_t.mq, m_t.tk, m_t.tk, 1, 0, 0},
             "S tile (f32, ND) to the workspace");
    }
    b.emit(Opcode::op_cc_set, {Pipe::FIX, kCcMode, kScoresReady}, "S ready -> vector cores");
    cs.release(b);
  }

  // PV_j = P_j V_j once the vector cores published P_j; cc_set kPvReady.
  void pv_tile(const Reg& j, const UnitRegs& r, const Channel& l1pv, const Channel& l0pv,
               const Channel& cpv) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "P V (one KV tile)");
    for (int v = 0; v < m_cfg.aiv_per_aic; ++v)
      b.emit(Opcode::op_cc_wait, {Pipe::MTE2, probs_ready(v)},
             "wait: P rows of vector core " + std::to_string(v));
    {
      Reg keys = b.reg("keys"), src = b.reg("V address");
      l1pv.acquire(b);
      slot_addr(src, j, 2 * m_t.s_bytes, m_t.p_bytes, "P slot j & 1");
      b.emit(Opcode::op_nd2nz, {m_p.type, m_l1_p, src, m_t.mq, m_t.tk, m_t.tk, m_t.mq},
             "P tile (ND -> NZ)");
      kv_tile(j, r, "v", keys, src);
      b.emit(Opcode::op_nd2nz, {m_p.type, m_l1_v, src, keys, m_p.dim, kv_row_stride(), m_t.tk},
             "V tile (ND -> NZ, keys past the end zero)");
      l1pv.publish(b);
    }
    l1pv.take(b);
    l0pv.acquire(b);
    load_a(m_l0a_p, m_l1_p, m_t.tk, "P row block");
    // V: NZ [D/16][tk][16]; k block i (keys 16i..) = D/16 fractals at a stride of tk/16, each
    // transposed into Zn.
    for (int64_t i = 0; i < m_t.tk / kFrac; ++i)
      b.emit(Opcode::op_load2d,
             {m_p.type, Buf::L0B, m_l0b_v + i * (m_p.dim / kFrac) * kFracBytes,
              m_l1_v + i * kFracBytes, m_p.dim / kFrac, m_t.tk / kFrac, 1},
             "V k block");
    l1pv.release(b);
    l0pv.publish(b);
    l0pv.take(b);
    cpv.acquire(b);
    b.emit(Opcode::op_mmad, {m_p.type, m_l0c_pv, m_l0a_p, m_l0b_v, m_t.mq, m_t.tk, m_p.dim, 0, 0},
           "P V");
    l0pv.release(b);
    cpv.publish(b);
    cpv.take(b);
    {
      Reg dst = b.reg("P V slot");
      slot_addr(dst, j, 2 * (m_t.s_bytes + m_t.p_bytes), m_t.pv_bytes, "P V slot j & 1");
      b.emit(Opcode::op_fixpipe,
             {Dtype::F32, Dtype::F32, Buf::GM, dst, m_l0c_pv, m_t.mq, m_p.dim, m_p.dim, 1, 0, 0},
             "P V tile (f32, ND) to the workspace");
    }
    b.emit(Opcode::op_cc_set, {Pipe::FIX, kCcMode, kPvReady}, "P V ready -> vector cores");
    cpv.release(b);
  }

  // ---- vector cores ----

  void vector_section() {
    KernelBuilder& b = m_b;
    b.begin_section(b.vector_core_kind());
    const auto ub = m_plans.ub.allocate(b, 0);
    auto at = [&](BufferPlan::Id id) { return ub[id]; };
    m_s = at(m_plans.ub_s);
    m_p16 = at(m_plans.ub_p);
    m_pv = at(m_plans.ub_pv);
    m_o = at(m_plans.ub_o);
    m_o16 = at(m_plans.ub_o16);
    m_acc = at(m_plans.ub_acc);
    m_m = at(m_plans.ub_m);
    m_l = at(m_plans.ub_l);
    m_alpha = at(m_plans.ub_alpha);
    m_alpha_prev = at(m_plans.ub_alpha_prev);
    m_red = at(m_plans.ub_red);
    m_thr = at(m_plans.ub_thr);
    m_rep = at(m_plans.ub_rep);
    m_bits = at(m_plans.ub_bits);
    m_iota = at(m_plans.ub_iota);
    m_neginf = at(m_plans.ub_neginf);
    m_scratch = at(m_plans.ub_scratch);
    m_alt = at(m_plans.ub_alt);
    m_s_rows = SuperRowLayout::make(m_t.tk, kBlockLanes32);
    m_o_rows = SuperRowLayout::make(m_p.dim, kBlockLanes32);

    const Channel s_in(b, Pipe::MTE2, Pipe::V, "S rows"), pv_in(b, Pipe::MTE2, Pipe::V, "P V rows"),
        p_out(b, Pipe::V, Pipe::MTE3, "P rows"), o_out(b, Pipe::V, Pipe::MTE3, "O rows");
    for (const Channel* c : {&s_in, &pv_in, &p_out, &o_out}) c->start(b);
    constants();
    m_half = b.reg_imm("rows per vector core", m_t.half);
    m_lim0 = b.reg("smallest key limit of the unit's rows on this core");
    m_sub = b.reg("vector core in the group");
    b.emit(Opcode::op_get_subblock_id, {m_sub});
    load_slot();
    for_units([&](const Reg& u) {
      UnitRegs r;
      unit_coords(u, r);
      init_rows(r);
      // Softmax of tile j + 1 before the update with P V_j: the cube's P V_j overlaps it.
      tiles_run_ahead(
          r.tiles, [&](const Reg& j) { softmax_tile(j, s_in, p_out); },
          [&](const Reg& j) { rescale_tile(j, pv_in); },
          [&] { vec_copy_bits(b, 4, m_alpha_prev, m_alpha, m_half); });
      store_rows(r, o_out);
    });
    for (const Channel* c : {&s_in, &pv_in, &p_out, &o_out}) c->drain(b);
    b.end();
  }

  // iota (f32 0..tk-1, also the row offsets 0..half-1), the -inf repeat, replicate's pattern.
  void constants() {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "constants");
    fill_iota64(b, m_iota);
    Reg n = b.reg_imm("lanes", kLanes32);
    vec_convert(b, Dtype::F32, Dtype::S32, m_iota, m_iota, RoundMode::kRint, n);
    Reg add = b.reg("64 * c");
    for (int64_t c = 1; c < m_t.tk / kLanes32; ++c) {
      b.movi(add, vector_scalar_bits(Dtype::F32, static_cast<double>(c * kLanes32)));
      vec_scalar(b, Opcode::op_vadds, Dtype::F32, m_iota + c * kSlotBytes, m_iota, add, n);
    }
    vec_fill_repeat(b, Dtype::F32, m_neginf, -std::numeric_limits<double>::infinity());
    fill_alt_pattern(b, m_alt, m_t.half);
  }

  // m = -inf, l = 0, O = 0; thr[r] = the number of keys row r sees (f32).
  void init_rows(const UnitRegs& r) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "rows: m = -inf, l = 0, O = 0, key limits");
    vec_fill32(b, m_m, combine_identity_bits(Combine::kMax, Dtype::F32), m_t.half);
    vec_fill32(b, m_l, 0, m_t.half);
    {
      Reg n = b.reg_imm("O lanes", m_t.half * m_p.dim);
      vec_dup_bits(b, 4, m_o, 0, n);
    }
    Reg kv = b.reg_imm("kv_len (f32 bits)",
                       vector_scalar_bits(Dtype::F32, static_cast<double>(m_p.kv_len)));
    if (m_p.causal && !m_t.grouped) {
      // thr[r] = min(kv_len, q0 + v * half + r + offset + 1): s32 splat, to f32, + r.
      Reg& c = m_lim0;
      b.mul_add(c, m_sub, m_t.half, r.q0);
      b.add(c, c, m_p.causal_offset + 1);
      vec_dup_bits(b, 4, m_thr, c, m_t.half);
      b.min(c, c, m_p.kv_len, "the smallest limit of this core's rows");
      vec_convert(b, Dtype::F32, Dtype::S32, m_thr, m_thr, RoundMode::kRint, m_half);
      vec_binary(b, Opcode::op_vadd, Dtype::F32, m_thr, m_thr, m_iota, m_half);
      vec_scalar(b, Opcode::op_vmins, Dtype::F32, m_thr, m_thr, kv, m_half);
    } else if (m_p.device_len) {
      // thr[r] = the unit's length for every row: s32 splat, to f32.
      vec_dup_bits(b, 4, m_thr, r.kv_len, m_t.half);
      vec_convert(b, Dtype::F32, Dtype::S32, m_thr, m_thr, RoundMode::kRint, m_half);
      b.mov(m_lim0, r.kv_len);
    } else {
      const int64_t lim = m_t.grouped ? visible_keys(0, 1) : m_p.kv_len;
      vec_fill32(b, m_thr, vector_scalar_bits(Dtype::F32, static_cast<double>(lim)), m_t.half);
      b.movi(m_lim0, lim);
    }
  }

  RowGroup rows_of(const SuperRowLayout& l, uint64_t x) const {
    RowGroup g;
    g.layout = &l;
    g.x = x;
    g.supers = &m_half;
    g.rows = &m_half;
    return g;
  }

  // dense[r] (f32, r < half) -> m_rep, one block per row.
  void replicate(uint64_t dense) { replicate_rows(m_b, dense, m_half, m_rep, m_scratch, m_alt); }

  // One KV tile's softmax step on this core's rows; P rows to the workspace.
  void softmax_tile(const Reg& j, const Channel& s_in, const Channel& p_out) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "online softmax (one KV tile)");
    const int64_t s_lanes = m_t.half * m_t.tk;
    b.emit(Opcode::op_cc_wait, {Pipe::MTE2, kScoresReady}, "wait: S tile from the cube");
    {
      Reg src = b.reg("S rows");
      slot_addr(src, j, 0, m_t.s_bytes, "S slot j & 1");
      Reg off = b.reg("row offset");
      b.mul(off, m_sub, m_t.half * m_t.tk * kLaneBytes);
      b.add(src, src, off);
      s_in.acquire(b);
      b.emit(Opcode::op_copy_gm2ub, {m_s, src, 1, s_lanes * kLaneBytes / kBlock, 0, 0},
             "S rows (f32)");
      s_in.publish(b);
    }
    s_in.take(b);
    const RowGroup g = rows_of(m_s_rows, m_s);
    {
      Reg n = b.reg_imm("S lanes", s_lanes);
      Reg scale = b.reg_imm("scale", vector_scalar_bits(Dtype::F32, m_p.scale));
      vec_scalar(b, Opcode::op_vmuls, Dtype::F32, m_s, m_s, scale, n);
    }
    // Keys at index >= thr[r] -> -inf (thr counts down by tk per tile); skipped when every row
    // of this core sees the whole tile (the smallest limit m_lim0 >= (j + 1) * tk).
    Reg end = b.reg("end of the tile");
    b.mul_add(end, j, m_t.tk, m_t.tk);
    b.if_(lt(m_lim0, end), [&] {
      replicate(m_thr);
      set_mask_lanes(b, kAllLanes);
      const int64_t row_rep = m_t.tk * kLaneBytes / kBlock;
      for (int64_t c = 0; c < m_t.tk / kLanes32; ++c) {
        const int64_t x = static_cast<int64_t>(m_s) + c * kSlotBytes;
        vec_compare_strided(b, Dtype::F32, isa::Cmp::LT, m_bits,
                            VOperand(static_cast<int64_t>(m_iota) + c * kSlotBytes, 1, 0),
                            VOperand(m_rep, 0, 1), m_half);
        vec_select_strided(b, Dtype::F32, VOperand(x, 1, row_rep), VOperand(x, 1, row_rep),
                           VOperand(m_neginf, 1, 0), m_bits, m_half);
      }
    });
    end.release();
    {
      Reg minus_tk = b.reg_imm("-tk", vector_scalar_bits(Dtype::F32, -static_cast<double>(m_t.tk)));
      vec_scalar(b, Opcode::op_vadds, Dtype::F32, m_thr, m_thr, minus_tk, m_half);
    }
    // m' = max(m, rowmax S); alpha = exp(m - m'); m = m'.
    rows_to_lanes(b, g, Combine::kMax, Dtype::F32, m_acc);
    lanes_reduce(b, Combine::kMax, Dtype::F32, m_acc, m_half, m_red, m_bits);
    vec_binary(b, Opcode::op_vmax, Dtype::F32, m_red, m_red, m_m, m_half);
    vec_binary(b, Opcode::op_vsub, Dtype::F32, m_alpha, m_m, m_red, m_half);
    vec_unary(b, Opcode::op_vexp, Dtype::F32, m_alpha, m_alpha, m_half);
    vec_copy_bits(b, 4, m_m, m_red, m_half);
    // P = exp(S - m'); l = l * alpha + rowsum P.
    replicate(m_m);
    rows_bcast(b, g, Opcode::op_vsub, Dtype::F32, m_rep);
    {
      Reg n = b.reg_imm("S lanes", s_lanes);
      vec_unary(b, Opcode::op_vexp, Dtype::F32, m_s, m_s, n);
    }
    rows_to_lanes(b, g, Combine::kSum, Dtype::F32, m_acc);
    lanes_reduce(b, Combine::kSum, Dtype::F32, m_acc, m_half, m_red, m_bits);
    vec_binary(b, Opcode::op_vmul, Dtype::F32, m_l, m_l, m_alpha, m_half);
    vec_binary(b, Opcode::op_vadd, Dtype::F32, m_l, m_l, m_red, m_half);
    p_out.acquire(b);
    {
      Reg n = b.reg_imm("S lanes", s_lanes);
      vec_convert(b, m_p.type, Dtype::F32, m_p16, m_s, RoundMode::kRint, n);
    }
    s_in.release(b);
    p_out.publish(b);
    p_out.take(b);
    {
      Reg dst = b.reg("P rows"), off = b.reg("row offset");
      slot_addr(dst, j, 2 * m_t.s_bytes, m_t.p_bytes, "P slot j & 1");
      b.mul(off, m_sub, m_t.half * m_t.tk * m_isz);
      b.add(dst, dst, off);
      b.emit(Opcode::op_copy_ub2gm, {dst, m_p16, 1, rnd(s_lanes * m_isz) / kBlock, 0, 0},
             "P rows to the workspace");
    }
    for (int v = 0; v < m_cfg.aiv_per_aic; ++v)  // this core's id: v == sub
      b.if_(eq(m_sub, v), [&] {
        b.emit(Opcode::op_cc_set, {Pipe::MTE3, kCcMode, probs_ready(v)}, "P rows ready -> cube");
      });
    p_out.release(b);
  }

  // O = O * alpha + P V_j (alpha of tile j: m_alpha_prev).
  void rescale_tile(const Reg& j, const Channel& pv_in) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "O = O * alpha + P V");
    const int64_t o_lanes = m_t.half * m_p.dim;
    b.emit(Opcode::op_cc_wait, {Pipe::MTE2, kPvReady}, "wait: P V tile from the cube");
    {
      Reg src = b.reg("P V rows"), off = b.reg("row offset");
      slot_addr(src, j, 2 * (m_t.s_bytes + m_t.p_bytes), m_t.pv_bytes, "P V slot j & 1");
      b.mul(off, m_sub, o_lanes * kLaneBytes);
      b.add(src, src, off);
      pv_in.acquire(b);
      b.emit(Opcode::op_copy_gm2ub, {m_pv, src, 1, o_lanes * kLaneBytes / kBlock, 0, 0},
             "P V rows (f32)");
      pv_in.publish(b);
    }
    replicate(m_alpha_prev);
    rows_bcast(b, rows_of(m_o_rows, m_o), Opcode::op_vmul, Dtype::F32, m_rep);
    pv_in.take(b);
    Reg n = b.reg_imm("O lanes", o_lanes);
    vec_binary(b, Opcode::op_vadd, Dtype::F32, m_o, m_o, m_pv, n);
    pv_in.release(b);
  }

  // O / l rounded to the output type, this core's valid rows stored.
  void store_rows(const UnitRegs& r, const Channel& o_out) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "O = O / l -> output rows");
    const int64_t o_lanes = m_t.half * m_p.dim;
    vec_unary(b, Opcode::op_vrec, Dtype::F32, m_l, m_l, m_half);
    replicate(m_l);
    rows_bcast(b, rows_of(m_o_rows, m_o), Opcode::op_vmul, Dtype::F32, m_rep);
    o_out.acquire(b);
    {
      Reg n = b.reg_imm("O lanes", o_lanes);
      vec_convert(b, m_p.type, Dtype::F32, m_o16, m_o, RoundMode::kRint, n);
    }
    o_out.publish(b);
    o_out.take(b);
    Reg rows = b.reg("rows of this core");
    b.mul(rows, m_sub, m_t.half);
    b.sub(rows, r.rows, rows);
    b.min(rows, rows, m_t.half);
    b.if_(ge(rows, 1), [&] {
      Reg dst = b.reg("O rows");
      b.mul(dst, m_sub, m_t.half * q_row_stride());
      b.add(dst, dst, r.q_off);
      gm_addr(dst, "o", dst);
      const int64_t row_blocks = m_p.dim * m_isz / kBlock;
      const int64_t gap = (q_row_stride() - m_p.dim) * m_isz / kBlock;
      b.emit(Opcode::op_copy_ub2gm, {dst, m_o16, rows, row_blocks, 0, gap}, "O rows");
    });
    o_out.release(b);
  }

  const AttentionProblem& m_p;
  const AttentionTiling& m_t;
  const ChipConfig& m_cfg;
  int64_t m_isz;
  AttentionPlans m_plans;
  KernelBuilder m_b;
  std::vector<Channel> m_ch;
  Reg m_slot, m_half, m_sub, m_lim0;
  uint64_t m_l1_q = 0, m_l1_k = 0, m_l1_p = 0, m_l1_v = 0, m_l0a_q = 0, m_l0a_p = 0, m_l0b_k = 0,
           m_l0b_v = 0, m_l0c_s = 0, m_l0c_pv = 0;
  uint64_t m_s = 0, m_p16 = 0, m_pv = 0, m_o = 0, m_o16 = 0, m_acc = 0, m_m = 0, m_l = 0,
           m_alpha = 0, m_alpha_prev = 0, m_red = 0, m_thr = 0, m_rep = 0, m_bits = 0, m_iota = 0,
           m_neginf = 0, m_scratch = 0, m_alt = 0;
  SuperRowLayout m_s_rows, m_o_rows;
};

}  // namespace

std::string AttentionTiling::str() const {
  return fmt::format("mq {} ({} rows per vector core) tk {}, {} units{} over {} groups", mq, half,
                     tk, units, grouped ? fmt::format(" (groups of {} heads)", group) : "",
                     block_dim);
}

AttentionTiling plan_attention(const AttentionProblem& p, const ChipConfig& cfg,
                               const std::string& op) {
  if (!cfg.split)
    throw CompileError(op +
                       ": fused attention is a mix kernel (cube and vector cores of a "
                       "split chip); this chip is coupled");
  const CoreKindConfig& cube = cube_core(cfg, op);
  require_l0c_to_gm(cfg, op, "fused attention's S and P V tiles");
  const VectorCores vec = VectorCores::of(cfg);
  const int64_t per = cfg.aiv_per_aic;
  if (probs_ready(cfg.aiv_per_aic - 1) >= cfg.cross_core_flag_ids)
    throw CompileError(fmt::format(
        "{}: fused attention needs {} cross-core flag ids (one per vector core of a group and "
        "two more); the chip has {} (sync.cross_core_flag_ids)",
        op, probs_ready(cfg.aiv_per_aic - 1) + 1, cfg.cross_core_flag_ids));
  AttentionTiling t;
  t.group = p.heads / p.kv_heads;
  t.grouped = p.seq_q == 1;
  const int64_t isz = isa::dtype_size(p.type);
  const int64_t rows_needed = t.grouped ? t.group : p.seq_q;
  // mq: a multiple of 16 (the cube) whose share per vector core is a multiple of 8 rows (the
  // per-row value replication works in groups of 8).
  const int64_t step = std::lcm(kFrac, per * kBlockLanes32);
  const int64_t mq_max = std::min(kRowsMax, round_up(rows_needed, step));
  if (t.grouped && t.group > kRowsMax)
    throw CompileError(
        fmt::format("{}: {} query heads per KV head; at most {}", op, t.group, kRowsMax));
  for (int64_t mq = mq_max; mq >= step && t.mq == 0; mq -= step) {
    if (t.grouped && mq < t.group) break;
    for (int64_t tk : {int64_t{128}, int64_t{64}}) {
      // The key index constant doubles as the row offsets: a core's rows <= tk.
      if (mq / per > tk) continue;
      AttentionPlans plans(mq, mq / per, tk, p.dim, isz);
      if (plan_fits(plans.l1, cfg, cube) && plan_fits(plans.l0a, cfg, cube) &&
          plan_fits(plans.l0b, cfg, cube) && plan_fits(plans.l0c, cfg, cube) &&
          plans.ub.fit(cfg, vec.kind, 1, 1) == 1) {
        t.mq = mq;
        t.tk = tk;
        break;
      }
    }
  }
  if (t.mq == 0)
    throw CompileError(
        fmt::format("{}: no attention tile fits the chip's buffers (head_dim {})", op, p.dim));
  t.half = t.mq / per;
  t.q_blocks = t.grouped ? 1 : ceil_div(p.seq_q, t.mq);
  t.units = p.batch * (t.grouped ? p.kv_heads : p.heads) * t.q_blocks;
  t.block_dim = static_cast<int>(std::min<int64_t>(cube.count, t.units));
  t.s_bytes = round_up(static_cast<uint64_t>(t.mq * t.tk * kL0cElemBytes), kLine);
  t.p_bytes = round_up(static_cast<uint64_t>(t.mq * t.tk * isz), kLine);
  t.pv_bytes = round_up(static_cast<uint64_t>(t.mq * p.dim * kL0cElemBytes), kLine);
  t.slot_bytes = 2 * (t.s_bytes + t.p_bytes + t.pv_bytes);
  return t;
}

namespace {

// Checks the op and fills the problem. Inputs q, k, v (and IncreFlashAttention's
// actual_seq_lengths: read by the kernel from device memory, or, when the attribute of that
// name is given, fixed at compile time).
AttentionProblem parse(const OpDesc& op) {
  const bool incre = op.type == "IncreFlashAttention";
  const size_t want = incre ? 4 : 3;
  if (op.inputs.size() != want)
    op.invalid(fmt::format("expects {} inputs (query, key, value{}), got {}", want,
                           incre ? ", actual_seq_lengths" : "", op.inputs.size()));
  const TensorDesc &q = op.inputs[0], &k = op.inputs[1], &v = op.inputs[2];
  if (q.dtype != DataType::F16 && q.dtype != DataType::BF16)
    op.fail(fmt::format("query is {}; fused attention takes f16 or bf16", data_type_name(q.dtype)));
  if (k.dtype != q.dtype || v.dtype != q.dtype)
    op.invalid("query, key and value must have one dtype");
  const std::string layout = op.attr_string("input_layout", "BSND");
  if (layout != "BSND")
    op.fail("input_layout " + layout + ": only BSND (batch, seq, heads, head_dim) is supported");
  if (q.shape.size() != 4 || k.shape.size() != 4 || v.shape.size() != 4)
    op.invalid("query, key and value must be rank 4 (BSND)");
  if (k.shape != v.shape) op.invalid("key and value shapes differ");
  AttentionProblem p;
  p.batch = q.shape[0];
  p.seq_q = q.shape[1];
  p.heads = q.shape[2];
  p.dim = q.shape[3];
  p.seq_kv = k.shape[1];
  p.kv_heads = k.shape[2];
  p.type = device_dtype(q.dtype);
  if (k.shape[0] != p.batch || k.shape[3] != p.dim)
    op.invalid("key's batch or head_dim differs from query's");
  if (p.kv_heads < 1 || p.heads % p.kv_heads != 0)
    op.invalid(fmt::format("{} query heads are not a multiple of {} key/value heads", p.heads,
                           p.kv_heads));
  // num_heads / num_key_value_heads: 0 or absent = from the shapes.
  const int64_t nh = op.attr_int("num_heads", 0), nkv = op.attr_int("num_key_value_heads", 0);
  if ((nh != 0 && nh != p.heads) || (nkv != 0 && nkv != p.kv_heads))
    op.invalid(
        fmt::format("num_heads {} / num_key_value_heads {} disagree with the shapes", nh, nkv));
  if (p.dim % kFrac != 0 || p.dim > 256)
    op.fail(fmt::format("head_dim {}: a multiple of 16 up to 256 is supported", p.dim));
  // scale_value: 0 or absent = 1 / sqrt(head_dim).
  p.scale = op.attr_float("scale_value", 0);
  if (p.scale == 0) p.scale = 1.0 / std::sqrt(static_cast<double>(p.dim));
  p.kv_len = p.seq_kv;
  if (incre && !op.attrs.count("actual_seq_lengths")) {
    const TensorDesc& len = op.inputs[3];
    const int64_t count = len.num_elements();
    if ((len.dtype != DataType::S32 && len.dtype != DataType::S64) || len.shape.size() > 1 ||
        (count != 1 && count != p.batch))
      op.invalid(
          fmt::format("actual_seq_lengths {} must be int32 or int64 of shape [], [1] or [{}]",
                      len.str(), p.batch));
    if (p.seq_q != 1) op.invalid("IncreFlashAttention takes one query position (seq 1)");
    if (p.seq_kv < 1) op.invalid("no keys");
    p.device_len = true;
    p.len_count = count;
    p.len_type = len.dtype;
  } else if (incre) {
    const std::vector<int64_t> lens = op.attr_ints("actual_seq_lengths");
    if (lens.empty()) op.invalid("actual_seq_lengths is missing");
    for (int64_t l : lens)
      if (l != lens[0])
        op.fail("actual_seq_lengths differ between batch entries; one length is supported");
    if (lens[0] < 1 || lens[0] > p.seq_kv)
      op.invalid(fmt::format("actual_seq_lengths {} outside [1, {}]", lens[0], p.seq_kv));
    if (p.seq_q != 1) op.invalid("IncreFlashAttention takes one query position (seq 1)");
    p.kv_len = lens[0];
  } else {
    const int64_t mode = op.attr_int("sparse_mode", 0);
    if (mode != 0 && mode != 2 && mode != 3)
      op.fail(
          fmt::format("sparse_mode {}: 0 (no mask), 2 (causal, left-up) and 3 (causal, "
                      "right-down) are supported",
                      mode));
    p.causal = mode != 0;
    p.causal_offset = mode == 3 ? p.seq_kv - p.seq_q : 0;
    if (p.causal_offset < 0)
      op.invalid(fmt::format("sparse_mode 3 needs at least as many keys ({}) as queries ({})",
                             p.seq_kv, p.seq_q));
    if (p.seq_kv < 1) op.invalid("no keys");
  }
  return p;
}

}  // namespace

CompiledKernel compile_attention(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const AttentionProblem p = parse(op);
  CompiledKernel out;
  out.outputs = {op.inputs[0]};
  if (p.batch == 0 || p.seq_q == 0 || p.heads == 0) return out;
  const AttentionTiling t = plan_attention(p, ctx.cfg, op.str());
  AttentionKernel k(p, t, ctx.cfg, op.str());
  Launch l;
  l.kernel = k.build();
  l.block_dim = t.block_dim;
  l.args = {{ArgRef::Kind::kInput, 0},
            {ArgRef::Kind::kInput, 1},
            {ArgRef::Kind::kInput, 2},
            {ArgRef::Kind::kOutput, 0},
            {ArgRef::Kind::kWorkspace, 0, 0}};
  if (p.device_len) l.args.push_back({ArgRef::Kind::kInput, 3});
  l.summary = "fused attention: " + t.str();
  out.launches.push_back(std::move(l));
  out.workspace_bytes = static_cast<uint64_t>(t.block_dim) * t.slot_bytes;
  return out;
}

}  // namespace npusim::compiler::ops
