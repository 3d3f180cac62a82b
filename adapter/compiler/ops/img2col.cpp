// The cube img2col kernel (ops/conv.h, build_img2col) on the cube skeleton
// (ops/cube_pipeline.h): tiles of output positions; per tile the slab (ops/conv_slab.h, all
// channels); per tap and channel block a load3d of 16 columns and an mmad by a 16 x 16*rep 0/1
// matrix B into L0C, one FIXPIPE per tap writing the tap's channels of every position.
#include <algorithm>

#include <fmt/format.h>

#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/conv_slab.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using isa::Pipe;
using layout::kFractalBytes;

namespace {

struct Img2colTiling {
  int64_t tm = 0, kc1 = 0, chunks = 0, m_tiles = 0, tiles = 0, slab_rows = 0, slab_bytes = 0;
  int block_dim = 0;
  int64_t per = 0;
};

// The kernel's buffers for tiles of tm positions x kc1 channel blocks, one plan per buffer
// kind: the same lists decide whether a tiling fits and allocate it.
struct Img2colBuffers {
  BufferPlan l1{Buf::L1}, l0a{Buf::L0A}, l0b{Buf::L0B}, l0c{Buf::L0C};
  BufferPlan::Id slab, l1_rep, a, l0b_rep, c;

  Img2colBuffers(const Img2colSpec& s, int64_t tm, int64_t kc1, int64_t slab_bytes) {
    const uint64_t rep_bytes = img2col_rep_copy_bytes(s.rep);
    slab = l1.add_fixed("slab", static_cast<uint64_t>(slab_bytes), 2);
    l1_rep = l1.add_fixed("repetition matrix", rep_bytes);
    a = l0a.add_fixed("A", static_cast<uint64_t>(tm * kBlk * isa::dtype_size(s.in_type)), 2);
    l0b_rep = l0b.add_fixed("repetition matrix", rep_bytes);
    c = l0c.add_fixed("C", static_cast<uint64_t>(tm * kc1 * kBlk * s.rep * kL0cElemBytes), 2);
  }
  bool fit(const CoreKindConfig& core, const ChipConfig& cfg) const {
    return plan_fits(l1, cfg, core) && plan_fits(l0a, cfg, core) && plan_fits(l0b, cfg, core) &&
           plan_fits(l0c, cfg, core);
  }
};

// Through the UB (no l0c->gm path) each (position, tap) row of a chunk reaches GM in whole
// 32-byte blocks: the strides must be whole blocks and the block-rounded channels of a tap,
// ceil(c * rep) to a block, must stay within that (position, tap)'s own columns (callers pad
// the layout). CompileError naming op otherwise.
void check_ub_layout(const Img2colSpec& s, bool via_ub, const ChipConfig& cfg,
                     const std::string& op) {
  if (!via_ub) return;
  const int64_t osz = isa::dtype_size(s.out_type), per_block = kBlkBytes / osz;
  const int64_t cols = round_up(s.c * s.rep, per_block), taps = s.kh * s.kw;
  const int64_t positions = s.images * s.oh() * s.ow();
  const bool aligned = s.row_stride % per_block == 0 && s.tap_stride % per_block == 0;
  // position-major rows [tap][c * rep] or tap-major planes [tap][position][c * rep]
  const bool fits = s.row_stride >= s.tap_stride ? cols <= s.tap_stride || taps == 1
                                                 : cols <= s.row_stride || positions == 1;
  const bool inside = s.row_stride >= s.tap_stride
                          ? (taps - 1) * s.tap_stride + cols <= s.row_stride
                          : (positions - 1) * s.row_stride + cols <= s.tap_stride;
  if (!aligned || !fits || !inside)
    throw CompileError(fmt::format(
        "{}: chip {} has no l0c->gm path: img2col rows leave through the UB in whole 32-byte "
        "blocks, which the layout (row stride {}, tap stride {}, {} channels x {}) does not "
        "leave room for",
        op, cfg.name, s.row_stride, s.tap_stride, s.c, s.rep));
}

Img2colTiling plan_img2col(const Img2colSpec& s, const ChipConfig& cfg, const std::string& op) {
  const CoreKindConfig& core = cube_core(cfg, op);
  const bool via_ub = cube_store_via_ub(cfg, core, op);
  check_ub_layout(s, via_ub, cfg, op);
  check_geometry(op, s.h, s.w, s.kh, s.kw, s.sh, s.sw, s.dh, s.dw, s.pt, s.pb, s.pl, s.pr);
  const int64_t positions = s.oh() * s.ow(), c1 = ceil_div(s.c, kBlk);
  const int64_t ru12 = field_max(isa::FieldKind::RU12);
  if (kFractalBytes * static_cast<uint64_t>(s.rep) > core.capacity(Buf::L0B) || kBlk * s.rep > ru12)
    throw CompileError(fmt::format("{}: repetition {} too large for L0B / mmad n", op, s.rep));
  // Per balanced tile height, the most channel blocks that fit; among those the tiling whose
  // busiest core has the least work: its tiles (`per`) times the positions of a tile plus one
  // fractal row (# estimate: a tile's fixed cost, its slab halo and pipeline start, taken as 16
  // positions' worth), so that few large images' tiles are cut until every core has some.
  // Within 5 % of the least work (the estimate's precision) the taller tile wins.
  Img2colTiling best;
  double best_work = 0;
  for (int64_t tm = std::min<int64_t>(kMaxTile, round_up(positions, kBlk)); tm >= kBlk;
       tm -= kBlk) {
    const int64_t tmb = round_up(ceil_div(positions, ceil_div(positions, tm)), kBlk);
    if (best.tm && tmb >= best.tm) continue;  // a balanced height already seen
    const std::vector<SlabGeom> mts = m_tiles(positions, tmb, s.ow(), s.h, s.kh, s.sh, s.dh, s.pt);
    int64_t rows = 0;
    for (const SlabGeom& g : mts) rows = std::max(rows, g.h);
    for (int64_t kc1 = c1; kc1 >= 1; --kc1) {
      if (kc1 * kBlk * s.rep > ru12) continue;
      const int64_t slab = slab_buffer_bytes(kc1, rows, s.w);
      if (!Img2colBuffers(s, tmb, kc1, slab).fit(core, cfg)) continue;
      if (via_ub && tmb * round_up(kc1 * kBlk * s.rep, kBlk) * isa::dtype_size(s.out_type) >
                        static_cast<int64_t>(core.capacity(Buf::UB)))
        continue;  // the C tile passes through the UB
      Img2colTiling t;
      t.tm = tmb;
      t.kc1 = kc1;
      t.chunks = ceil_div(c1, kc1);
      t.m_tiles = static_cast<int64_t>(mts.size());
      t.tiles = s.images * t.m_tiles;
      t.slab_rows = rows;
      t.slab_bytes = slab;
      const CubeSplit split = contiguous_split(t.tiles, core.count);
      t.per = split.per;
      t.block_dim = split.block_dim;
      const double work = static_cast<double>(t.per * (t.tm + kBlk));
      if (!best.tm || work < best_work * 0.95) {
        best = t;
        best_work = work;
      }
      break;
    }
  }
  if (best.tm) return best;
  throw CompileError(
      fmt::format("{}: no img2col tile fits the cube core of chip {}", op, cfg.name));
}

class Img2colEmitter {
 public:
  Img2colEmitter(const Img2colSpec& s, const Img2colTiling& t, const ChipConfig& cfg,
                 const std::string& op)
      : m_s(s),
        m_t(t),
        m_b(fmt::format("Img2col_{}_{}", isa::dtype_name(s.in_type), isa::dtype_name(s.out_type)),
            op, cfg),
        m_slab(m_b, SlabEmitter::image_geometry(s, t.tm)),
        m_isz(isa::dtype_size(s.in_type)),
        m_osz(isa::dtype_size(s.out_type)),
        m_taps(s.kh * s.kw),
        m_pipe(m_b, 2) {}

  BuiltKernel emit() {
    KernelBuilder& b = m_b;
    b.begin_section(b.cube_core_kind());
    b.declare_arg("x", m_s.in_type, {m_s.images, m_s.h, m_s.w, m_s.c});
    b.declare_arg("out", m_s.out_type, {});
    b.declare_arg("rep", Dtype::U16, {16 * m_s.rep * 16 * m_t.block_dim});
    const Img2colBuffers plan(m_s, m_t.tm, m_t.kc1, m_t.slab_bytes);
    const BufferPlan::Placed l1 = plan.l1.allocate(b, 0);
    m_slab_buf = l1.twin(plan.slab);
    for (uint64_t& at : m_slab_buf.a) at += kBlkBytes;  // one block of room before (zeroing)
    m_l0a = plan.l0a.allocate(b, 0).twin(plan.a);
    m_l0c = plan.l0c.allocate(b, 0).twin(plan.c);
    m_l0b = plan.l0b.allocate(b, 0)[plan.l0b_rep];
    if (cube_store_via_ub(b.config(), cube_core(b.config(), b.op()), b.op())) {
      BufferPlan ub(Buf::UB);
      const auto cu = ub.add_fixed(
          "C tile (UB)",
          static_cast<uint64_t>(m_t.tm * round_up(m_t.kc1 * kBlk * m_s.rep, kBlk) * m_osz));
      m_pipe.store_via_ub(ub.allocate(b, 0)[cu]);
    }
    b.emit(Opcode::op_set_l3d_geom, {m_s.kh, m_s.kw, m_s.sh, m_s.sw, m_s.dh, m_s.dw},
           "window geometry (fixed)");
    write_rep_matrix();
    load_rep_matrix(l1[plan.l1_rep]);
    Reg steps = b.reg("steps"), tbeg = b.reg("first tile");
    m_tbeg = &tbeg;
    m_pipe.block_steps_contiguous(steps, tbeg, m_t.tiles, m_t.per, m_t.chunks);
    m_pipe.declare_flags(
        {"slab loaded", "slab free", "A loaded", "A free", "C computed", "C stored"});
    Reg cn;
    CubePipeline::Hooks hooks;
    hooks.setup = [&] {
      cn = b.reg_imm("C tiles so far", 0);
      m_cn = &cn;
    };
    m_pipe.run(
        steps, [&](const Reg& t) { load_step(t); }, [&](const Reg& s) { compute_step(s); }, hooks);
    b.end();
    return b.finish();
  }

 private:
  // This block's copy of the repetition matrix in the "rep" workspace (one copy per
  // block, img2col_rep_bytes: no block touches bytes another writes, so the launch's result
  // does not depend on the order of the cores, and it can be recorded for replay).
  Reg rep_copy() {
    KernelBuilder& b = m_b;
    Reg addr = b.load_arg("rep"), blk = b.reg("block");
    b.emit(Opcode::op_get_block_id, {blk});
    b.mul(blk, blk, static_cast<int64_t>(img2col_rep_copy_bytes(m_s.rep)));
    b.add(addr, addr, blk, "this block's copy");
    return addr;
  }

  // The repetition matrix (written to GM by write_rep_matrix): GM -> L1 at l1_rep -> L0B.
  void load_rep_matrix(uint64_t l1_rep) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "repetition matrix: GM -> L1 -> L0B");
    const uint64_t rep_bytes = img2col_rep_copy_bytes(m_s.rep);
    const int f = b.flag(Pipe::MTE2, Pipe::MTE1, "repetition matrix in L1");
    const int g = b.flag(Pipe::MTE1, Pipe::M, "repetition matrix in L0B");
    Reg src = rep_copy(), dst = b.reg_imm("L1", static_cast<int64_t>(l1_rep));
    b.emit(Opcode::op_copy_gm2l1, {dst, src, 1, static_cast<int64_t>(rep_bytes / kBlkBytes), 0, 0});
    b.set_flag(Pipe::MTE2, Pipe::MTE1, f);
    b.wait_flag(Pipe::MTE2, Pipe::MTE1, f);
    b.movi(src, static_cast<int64_t>(m_l0b));
    b.emit(Opcode::op_load2d, {m_s.in_type, Buf::L0B, src, dst, m_s.rep, 1, 0});
    b.set_flag(Pipe::MTE1, Pipe::M, g);
    b.wait_flag(Pipe::MTE1, Pipe::M, g);
  }

  // The 16 x 16*rep matrix B (B[k][n] = 1 iff n / rep == k) in the L0B (Zn) layout, written to
  // this block's copy in the "rep" workspace by scalar stores.
  void write_rep_matrix() {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "repetition matrix (Zn) -> GM by scalar stores");
    const uint64_t one = m_s.in_type == Dtype::BF16 ? 0x3F80 : 0x3C00;
    Reg addr = rep_copy(), v = b.reg("word");
    const int64_t halves = 256 * m_s.rep;
    for (int64_t w0 = 0; w0 < halves; w0 += 4) {
      uint64_t word = 0;
      for (int64_t i = w0; i < w0 + 4; ++i) {
        const int64_t j = i / 256, nn = (i % 256) / 16, kk = i % 16;
        if ((j * 16 + nn) / m_s.rep == kk) word |= one << (16 * (i - w0));
      }
      if (word) {
        b.movi(v, static_cast<int64_t>(word));
        b.emit(Opcode::op_st, {v, addr});
      } else {
        b.emit(Opcode::op_st, {0, addr});
      }
      b.add(addr, addr, 8);
    }
  }

  void decompose(const Reg& s, const Reg& ch, const Reg& mt, const Reg& img) {
    m_b.rem(ch, s, m_t.chunks);
    m_b.div(img, s, m_t.chunks);
    m_b.add(img, img, *m_tbeg);
    m_b.rem(mt, img, m_t.m_tiles);
    m_b.div(img, img, m_t.m_tiles);
  }

  void chunk_blocks(const Reg& ch, const Reg& c1a, const Reg& ncb) {
    m_b.mul(c1a, ch, m_t.kc1);
    m_b.movi(ncb, ceil_div(m_s.c, kBlk));
    m_b.sub(ncb, ncb, c1a);
    m_b.min(ncb, ncb, m_t.kc1);
  }

  void load_step(const Reg& s) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "load: slab");
    Reg ch = b.reg("chunk"), img = b.reg("image"), r0 = b.reg("first row"), h = b.reg("rows");
    {
      Reg mt = b.reg("m tile"), m0 = b.reg("m0"), m_act = b.reg("positions");
      decompose(s, ch, mt, img);
      m_slab.tile_positions(mt, m0, m_act);
      m_slab.slab_rows(m0, m_act, r0, h);
    }
    Reg p = b.reg("parity");
    m_pipe.l1_parity(p, s);
    m_pipe.l1_wait_free(p);
    Reg c1a = b.reg("first block"), ncb = b.reg("blocks"), cvalid = b.reg_imm("channels", m_s.c);
    chunk_blocks(ch, c1a, ncb);
    Reg dst = b.reg("slab"), x = b.load_arg("x"), cbase = b.reg_imm("channel base", 0);
    select(b, dst, p, m_slab_buf);
    m_slab.load_slab({dst, x, img, r0, h, cbase, c1a, ncb, cvalid});
    m_pipe.l1_loaded(p);
  }

  void compute_step(const Reg& s) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "compute: per tap, load3d + mmad per channel block, FIXPIPE");
    Reg ch = b.reg("chunk"), m_act = b.reg("positions"), msl = b.reg("first row in slab"),
        chan = b.reg("channels from the chunk start"), ncb = b.reg("blocks"),
        dst = b.reg("output address"), c1a = b.reg("first block");
    {
      Reg img = b.reg("image"), m0 = b.reg("m0");
      {
        Reg mt = b.reg("m tile");
        decompose(s, ch, mt, img);
        m_slab.tile_positions(mt, m0, m_act);
      }
      {
        Reg r0 = b.reg("first row"), h = b.reg("rows");
        m_slab.slab_rows(m0, m_act, r0, h);
        m_slab.set_fmatrix(m0, m_act, h);
      }
      m_slab.slab_first_row(msl, m0);
      chunk_blocks(ch, c1a, ncb);
      // out + ((img * OH*OW + m0) * row_stride + c1a * 16 * rep) * size
      b.mul(dst, img, m_s.oh() * m_s.ow());
      b.add(dst, dst, m0);
      b.mul(dst, dst, m_s.row_stride);
      b.mul(m0, c1a, kBlk * m_s.rep);
      b.add(dst, dst, m0);
      b.mul(dst, dst, m_osz);
      Reg out = b.load_arg("out");
      b.add(dst, dst, out);
    }
    b.movi(chan, m_s.c);
    b.mul(c1a, c1a, kBlk);
    b.sub(chan, chan, c1a, "channels from the chunk's first block");
    Reg ncols = b.reg("output columns");
    b.min(ncols, chan, m_t.kc1 * kBlk);
    b.mul(ncols, ncols, m_s.rep, "chunk channels x rep");
    Reg p = b.reg("parity"), m16 = b.reg("rows padded");
    m_pipe.l1_parity(p, s);
    round16(b, m16, m_act);
    m_pipe.l1_wait_loaded(p);
    Reg tap = b.reg("tap");
    b.for_range(tap, 0, m_taps, 1, [&] {
      tap_step(TapRegs{p, tap, ncb, chan, msl, m16, m_act, ncols, dst});
    });
    m_pipe.l1_read(p);
  }

  // What a tap of the step reads: the L1 parity p, the tap, the chunk's channel blocks ncb and
  // channels chan, the tile's first img2col row msl in the slab, its positions m_act (m16:
  // rounded up to 16), its output columns and output address.
  struct TapRegs {
    const Reg &p, &tap, &ncb, &chan, &msl, &m16, &m_act, &ncols, &dst;
  };

  // One tap: per channel block a load3d of its 16 columns and an mmad by the repetition matrix
  // into the C tile (L0C buffer: C tiles so far & 1), then one FIXPIPE of the tap's channels.
  void tap_step(const TapRegs& r) {
    KernelBuilder& b = m_b;
    Reg pc = b.reg("C parity"), c = b.reg("block");
    b.and_(pc, *m_cn, 1);
    m_pipe.l0c_wait_free(pc);
    b.for_range(c, 0, r.ncb, 1, [&] {
      Reg q = b.reg("A parity"), a = b.reg("A"), src = b.reg("slab"), k = b.reg("k start"),
          cc = b.reg("C");
      m_pipe.l0_parity(q);
      m_pipe.l0_wait_free(q);
      select(b, a, q, m_l0a);
      select(b, src, r.p, m_slab_buf);
      b.mul(k, c, m_taps);
      b.add(k, k, r.tap);
      b.mul(k, k, kBlk, "k-block (c, tap)");
      b.emit(Opcode::op_load3d, {m_s.in_type, a, src, r.chan, r.msl, r.m16, k, kBlk});
      m_pipe.l0_loaded(q);
      select(b, cc, pc, m_l0c);
      b.mul(k, c, m_s.rep * kBlk * kL0cElemBytes);
      b.mul(k, k, r.m16, "column blocks c * rep of the C tile");
      b.add(cc, cc, k);
      b.emit(Opcode::op_mmad,
             {m_s.in_type, cc, a, static_cast<int64_t>(m_l0b), r.m_act, kBlk, kBlk * m_s.rep, 0, 0},
             "one channel block, repeated");
      m_pipe.l0_read(q);
      m_pipe.next_l0_step();
    });
    Reg cc = b.reg("C"), d = b.reg("destination");
    m_pipe.l0c_ready(pc, cc, m_l0c);
    b.mul(d, r.tap, m_s.tap_stride * m_osz);
    b.add(d, d, r.dst);
    m_pipe.store({m_s.out_type, d, cc, r.m_act, r.ncols, m_s.row_stride}, pc);
    b.add(*m_cn, *m_cn, 1);
  }

  const Img2colSpec& m_s;
  const Img2colTiling& m_t;
  KernelBuilder m_b;
  SlabEmitter m_slab;
  const int64_t m_isz, m_osz, m_taps;
  CubePipeline m_pipe;
  Twin m_slab_buf, m_l0a, m_l0c;
  uint64_t m_l0b = 0;
  const Reg* m_tbeg = nullptr;
  const Reg* m_cn = nullptr;
};

}  // namespace

Launch build_img2col(const Img2colSpec& s, const ChipConfig& cfg, const std::string& op) {
  const Img2colTiling t = plan_img2col(s, cfg, op);
  Launch l;
  l.kernel = Img2colEmitter(s, t, cfg, op).emit();
  l.block_dim = t.block_dim;
  l.summary = fmt::format(
      "cube img2col {}x{}x{}x{} ({}x{} window, rep {}): tiles of {} "
      "positions x {} channel blocks, {} tiles over {} blocks",
      s.images, s.h, s.w, s.c, s.kh, s.kw, s.rep, t.tm, t.kc1, t.tiles, t.block_dim);
  return l;
}

}  // namespace npusim::compiler::ops
