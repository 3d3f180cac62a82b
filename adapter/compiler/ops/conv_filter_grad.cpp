// The filter gradient's fused cube kernel (ops/conv.h, build_filter_grad) on the cube skeleton
// (ops/cube_pipeline.h): dW = img2col(x)^T x dy with img2col made in L0A by load3dt.
//
// Tiles: (part, weight key, k tile), tile = (part * keys + key) * k_tiles + kt, key = group *
// n_tiles + n tile (keys = groups * n_tiles); each cube core takes a contiguous range. A tile's
// steps are its part's chunks: chunk = (image of the part, m tile of tp positions). Per step,
// software-pipelined by one step:
//   MTE2  the chunk's slab (ops/conv_slab.h: the input rows its positions need, the tile's
//         channel blocks) into L1 buffer step & 1, and dy's rows [m0, m0 + m_act) x the tile's
//         channels into the dy buffer of the same parity as NZ with tp rows (rows past m_act
//         zero: positions that are not the chunk's add nothing); with dy_part_blocks (staggered
//         parts, conv.h filter_grad_dy_part_blocks) as one NZ block of P rows a part, the
//         parts loaded from part block_id % n on;
//   MTE1  per L0 step of ks positions: load3dt of the slab's img2col window (the tile's rows of
//         img2col's columns x the step's positions) into L0A, one load2d (transposed) per 16
//         positions of dy's fractals into L0B;
//   M     mmad C[tk][tn] (+)= A x B into the tile's L0C buffer;
//   FIX   after the tile's last chunk: each 16-row block (one channel block of one tap) to its
//         HWIO rows of out as f32: per 16 channels a FIXPIPE (a column block of L0C is
//         [M16][16], any first row works), or through the UB (coupled chips) the whole tile,
//         then one copy per row block.
// With add_parts (split chips), the vector section: after a barrier of the cube cores (every
// part's products in GM), each vector core adds the parts of its tiles of dW's elements in part
// order and rounds them to dw_type (channel.h's epilogue section, as a Sum launch would).
#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "adapter/compiler/ops/channel.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/conv_slab.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "adapter/compiler/ops/elementwise.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using isa::Pipe;
using layout::kFractalBytes;

namespace {

// The largest chunk (positions of one image per L1 load). # estimate: beyond this the slab's
// halo rows are a few per cent of its rows at ResNet-50's widths, and L1 decides anyway.
constexpr int64_t kMaxChunk = 2048;
// The most rows of a tile (img2col columns): within load3dt's k_ext and mmad's m (12-bit
// fields); L0C, L0A and the UB decide below that. Tall tiles read a chunk's data once for more
// rows: at large batches the chunks' slabs and dy rows no longer stay in L2 between the tiles
// that read them again (ResNet-50's 3x3 64 -> 64 at batch 256: 576 rows in one tile read x and
// dy once instead of three times).
constexpr int64_t kMaxTileRows = 1024;

// The kernel's buffers, one plan per buffer kind: the same lists decide whether a tiling fits
// and allocate it.
struct FilterGradBuffers {
  BufferPlan l1{Buf::L1}, l0a{Buf::L0A}, l0b{Buf::L0B}, l0c{Buf::L0C};
  BufferPlan::Id slab, dy, a, b, c;

  FilterGradBuffers(const FilterGradTiling& t, int64_t isz, int l0c_buffers) {
    slab = l1.add_fixed("slab", static_cast<uint64_t>(t.slab_bytes), 2);
    dy = l1.add_fixed("dy rows (NZ)", static_cast<uint64_t>(dy_rows(t) * t.tn * isz), 2);
    a = l0a.add_fixed("A = img2col^T", static_cast<uint64_t>(t.tk * t.ks * isz), 2);
    b = l0b.add_fixed("B = dy", static_cast<uint64_t>(t.ks * t.tn * isz), 2);
    c = l0c.add_fixed("C", static_cast<uint64_t>(t.tk * t.tn * kL0cElemBytes), l0c_buffers);
  }
  bool fit(const CoreKindConfig& core, const ChipConfig& cfg) const {
    return plan_fits(l1, cfg, core) && plan_fits(l0a, cfg, core) && plan_fits(l0b, cfg, core) &&
           plan_fits(l0c, cfg, core);
  }
  // The dy buffer's rows: tp, or in staggered parts whole parts of 16 x dy_part_blocks rows.
  static int64_t dy_rows(const FilterGradTiling& t) {
    if (t.dy_part_blocks == 0) return t.tp;
    const int64_t part = t.dy_part_blocks * kBlk;
    return ceil_div(t.tp, part) * part;
  }
};

// Balanced sides: for every count of pieces of `total`, the piece rounded up to 16, at most
// `limit`, each once (largest first).
std::vector<int64_t> balanced_sides(int64_t total, int64_t limit) {
  std::vector<int64_t> v;
  for (int64_t n = 1;; ++n) {
    const int64_t side = round_up(ceil_div(total, n), kBlk);
    if (side <= limit && (v.empty() || side < v.back())) v.push_back(side);
    if (side == kBlk) break;
  }
  return v;
}

class FilterGradEmitter {
 public:
  FilterGradEmitter(const FilterGradSpec& s, const FilterGradTiling& t, const ChipConfig& cfg,
                    const std::string& op)
      : m_s(s),
        m_t(t),
        m_b(fmt::format("FilterGrad_{}", isa::dtype_name(s.in_type)), op, cfg),
        m_slab(m_b, slab_geometry(s, t)),
        m_isz(isa::dtype_size(s.in_type)),
        m_osz(isa::dtype_size(s.out_type)),
        m_taps(s.kh * s.kw),
        m_k3(ceil_div(s.c, kBlk) * s.kh * s.kw * kBlk),
        m_pipe(m_b, t.l0c_buffers) {}

  // The slab's geometry: x's pixels hold every group's channels (the row view: sw pixels').
  static SlabEmitter::Geometry slab_geometry(const FilterGradSpec& s, const FilterGradTiling& t) {
    SlabEmitter::Geometry g = SlabEmitter::image_geometry(s, t.tp);
    g.cs = s.x_channels();
    g.whole_pixels = t.whole_pixels;
    g.strided_by_pixel = t.strided_pixels;
    return g;
  }

  // Whether the slab is loaded per plane and column (SlabEmitter::strided_columns).
  bool slab_by_columns() const {
    return m_s.x_row != 0 && !m_t.strided_pixels && m_slab.strided_columns();
  }

  BuiltKernel emit() {
    // The vector cores only add the parts once every product is stored: one per cube core
    // under NPUSIM_MIX_ONE_TO_ONE=filter_grad or 1, or where unset and the caller asks it
    // (one_to_one_by_default; emit_epilogue_section spreads the sums over the launch's vector
    // cores, block_dim x the builder's ratio).
    if (m_s.add_parts &&
        mix_one_to_one_enabled(m_b.op(), OneToOneMix::filter_grad, m_s.one_to_one_by_default))
      m_b.set_aiv_per_aic(1);
    cube_section();
    if (m_s.add_parts) emit_parts_sum();
    return m_b.finish();
  }

 private:
  // The cube section (its registers released before a vector section begins).
  void cube_section() {
    KernelBuilder& b = m_b;
    b.begin_section(b.cube_core_kind());
    b.declare_arg("x", m_s.in_type, {});
    b.declare_arg("dy", m_s.in_type, {m_s.images, m_s.oh() * m_s.ow(), m_s.cout});
    b.declare_arg("out", m_s.out_type, {m_s.parts, m_taps * m_s.c, m_s.pitch});
    const FilterGradBuffers plan(m_t, m_isz, m_t.l0c_buffers);
    const BufferPlan::Placed l1 = plan.l1.allocate(b, 0);
    m_slab_buf = l1.twin(plan.slab);
    for (uint64_t& at : m_slab_buf.a) at += kBlkBytes;  // one block of room before (zeroing)
    m_dy_buf = l1.twin(plan.dy);
    m_l0a = plan.l0a.allocate(b, 0).twin(plan.a);
    m_l0b = plan.l0b.allocate(b, 0).twin(plan.b);
    m_l0c = plan.l0c.allocate(b, 0).twin(plan.c);
    if (cube_store_via_ub(b.config(), cube_core(b.config(), b.op()), b.op())) {
      BufferPlan ub(Buf::UB);
      const auto cu =
          ub.add_fixed("C tile (UB)", static_cast<uint64_t>(m_t.tk * m_t.tn * kL0cElemBytes));
      m_pipe.store_via_ub(ub.allocate(b, 0)[cu]);
    }
    b.emit(Opcode::op_set_l3d_geom, {m_s.kh, m_s.kw, m_s.sh, m_s.sw, m_s.dh, m_s.dw},
           "window geometry (fixed)");
    Reg steps = b.reg("steps"), tbeg = b.reg("first tile");
    m_tbeg = &tbeg;
    m_pipe.block_steps_contiguous(steps, tbeg, m_t.tiles, m_t.per, m_t.chunks);
    m_pipe.declare_flags({"slab and dy loaded", "slab and dy free", "L0 loaded", "L0 free",
                          "C computed", "C stored"});
    m_pipe.run(
        steps, [&](const Reg& st) { load_step(st); }, [&](const Reg& st) { compute_step(st); });
    if (m_s.add_parts) {
      // FIX is in order: after its last FIXPIPE this core's products are in GM. A barrier of
      // the launch's cube cores, then each tells its own vector cores.
      KernelBuilder::Origin o(b, "products stored: hand them to the vector cores");
      b.emit(Opcode::op_cc_set, {Pipe::FIX, kCcAllCube, kTilesStored}, "this core's tiles stored");
      b.emit(Opcode::op_cc_wait, {Pipe::FIX, kTilesStored}, "wait: every cube core's tiles");
      b.emit(Opcode::op_cc_set, {Pipe::FIX, kCcGroup, kProductsStored},
             "products stored: to the vector cores");
    }
    m_pipe.release_registers();
    b.end();
  }

  // Cross-core flags of add_parts (cc_set modes: 0 all cores of the setter's kind in the
  // launch, 2 a cube core with its vector cores).
  static constexpr int kCcAllCube = 0, kCcGroup = 2;
  static constexpr int kTilesStored = 0, kProductsStored = 1;

  // add_parts: dw = the sum over the parts of out ([parts][taps * C * cout] f32), in part order,
  // rounded to dw_type: the vector cores' section.
  void emit_parts_sum() {
    if (m_pipe.via_ub() || m_s.pitch != m_s.cout)
      m_b.fail("internal: the filter gradient's parts are added where FIXPIPE writes dense rows");
    ChannelEpilogueSpec e;
    e.name = "FilterGradParts";
    e.c = m_taps * m_s.c * m_s.cout;
    e.partial_cp = e.c;
    e.partial_blocks = {static_cast<int>(m_s.parts)};
    e.outputs = 1;
    e.out_type = m_s.dw_type;
    e.spread = true;
    const Dtype dw = m_s.dw_type;
    e.compute = [dw](KernelBuilder& b, const EpilogueOperands& o) {
      if (dw == Dtype::F32)
        f32_copy(b, o.outputs[0], o.sums[0], *o.count);
      else
        vec_convert(b, dw, Dtype::F32, o.outputs[0], o.sums[0], RoundMode::kRint, *o.count);
    };
    emit_epilogue_section(m_b, e, {"out"}, m_t.block_dim, [](KernelBuilder& b) {
      b.emit(Opcode::op_cc_wait, {Pipe::MTE2, kProductsStored},
             "wait: the products stored by every cube core");
    });
  }

 private:
  // Step st: its chunk ch, the tile's k tile kt and weight key nt (group * n_tiles + n tile;
  // the n tile with one group), the chunk's image img and m tile mt.
  struct StepRegs {
    const Reg &ch, &kt, &nt, &img, &mt;
  };
  void decompose(const Reg& st, const StepRegs& r) {
    KernelBuilder& b = m_b;
    b.rem(r.ch, st, m_t.chunks);
    b.div(r.kt, st, m_t.chunks);
    b.add(r.kt, r.kt, *m_tbeg, "tile");
    b.div(r.nt, r.kt, m_t.k_tiles);
    b.rem(r.kt, r.kt, m_t.k_tiles, "k tile");
    b.div(r.img, r.nt, keys(), "part");
    b.rem(r.nt, r.nt, keys(), m_s.groups > 1 ? "weight key" : "n tile");
    b.mul(r.img, r.img, m_t.chunks, "the part's first chunk");
    b.add(r.img, r.img, r.ch, "chunk of the op: image * m tiles + m tile");
    b.rem(r.mt, r.img, m_t.m_tiles, "m tile");
    b.div(r.img, r.img, m_t.m_tiles, "image");
  }

  // The tile's first channel block c1a (of the slab) and channel blocks ncb: those of its
  // img2col columns [kt * tk, min(K3, kt * tk + tk)).
  void tile_blocks(const Reg& kt, const Reg& c1a, const Reg& ncb) {
    KernelBuilder& b = m_b;
    const int64_t per_c1 = m_taps * kBlk;
    b.mul(c1a, kt, m_t.tk);
    b.add(ncb, c1a, m_t.tk);
    b.min(ncb, ncb, m_k3);
    b.sub(ncb, ncb, 1);
    b.div(ncb, ncb, per_c1, "last channel block");
    b.div(c1a, c1a, per_c1, "first channel block");
    b.sub(ncb, ncb, c1a);
    b.add(ncb, ncb, 1, "channel blocks of the tile");
  }

  int64_t keys() const { return m_s.groups * m_t.n_tiles; }

  // n_act = min(tn, cout / groups - (nt % n_tiles) * tn): the tile's channels (weight key nt).
  void tile_channels(const Reg& nt, const Reg& n_act) {
    if (m_s.groups == 1) {
      remaining(n_act, nt, m_t.tn, m_s.cout);
      return;
    }
    Reg n = m_b.reg("n tile");
    m_b.rem(n, nt, m_t.n_tiles);
    remaining(n_act, n, m_t.tn, m_s.cg_out());
  }
  // col = the tile's first channel: (nt / n_tiles) * group_pitch + (nt % n_tiles) * tn (weight
  // key nt; dy's group pitch is cout / groups, out's FilterGradSpec::group_pitch).
  void tile_first_channel(const Reg& col, const Reg& nt, int64_t group_pitch) {
    KernelBuilder& b = m_b;
    if (m_s.groups == 1) {
      b.mul(col, nt, m_t.tn);
      return;
    }
    Reg t = b.reg("group's first channel");
    b.div(t, nt, m_t.n_tiles);
    b.mul(t, t, group_pitch);
    b.rem(col, nt, m_t.n_tiles);
    b.mul(col, col, m_t.tn);
    b.add(col, col, t, "the tile's first channel");
  }

  // d = min(per, total - i * per): what piece i of `total` in pieces of `per` holds.
  void remaining(const Reg& d, const Reg& i, int64_t per, int64_t total) {
    Reg t = m_b.reg("piece start");
    m_b.mul(t, i, per);
    m_b.movi(d, total);
    m_b.sub(d, d, t);
    m_b.min(d, d, per);
  }

  void load_step(const Reg& st) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "load: slab and dy rows");
    Reg p = b.reg("parity"), img = b.reg("image"), m0 = b.reg("m0"), m_act = b.reg("positions"),
        nt = b.reg("n tile"), c1a = b.reg("first block"), ncb = b.reg("blocks");
    {
      Reg ch = b.reg("chunk"), kt = b.reg("k tile"), mt = b.reg("m tile");
      decompose(st, {ch, kt, nt, img, mt});
      m_slab.tile_positions(mt, m0, m_act);
      tile_blocks(kt, c1a, ncb);
    }
    m_pipe.l1_parity(p, st);
    m_pipe.l1_wait_free(p);
    {
      Reg r0 = b.reg("first row"), h = b.reg("rows"), dst = b.reg("slab"), x = b.load_arg("x"),
          cbase = b.reg_imm("channel base", 0), cvalid = b.reg_imm("channels", m_s.c);
      if (m_s.groups > 1) {
        b.div(cbase, nt, m_t.n_tiles);
        b.mul(cbase, cbase, m_s.c, "the group's first channel of x");
      }
      m_slab.slab_rows(m0, m_act, r0, h);
      select(b, dst, p, m_slab_buf);
      m_slab.load_slab({dst, x, img, r0, h, cbase, c1a, ncb, cvalid});
    }
    // dy + ((img * OH*OW + m0) * cout + the tile's first channel) * size, rows m_act, the
    // tile's channels.
    Reg src = b.load_arg("dy"), t = b.reg("offset"), dst = b.reg("dy buffer");
    b.mul(t, img, m_s.oh() * m_s.ow());
    b.add(t, t, m0);
    b.mul(t, t, m_s.cout);
    tile_first_channel(m0, nt, m_s.cg_out());
    b.add(t, t, m0);
    b.mul(t, t, m_isz);
    b.add(src, src, t);
    tile_channels(nt, ncb);
    select(b, dst, p, m_dy_buf);
    if (m_t.dy_part_blocks == 0)
      b.emit(Opcode::op_nd2nz, {m_s.in_type, dst, src, m_act, ncb, m_s.cout, m_t.tp},
             "dy rows -> NZ (rows past the chunk zero)");
    else
      load_dy_in_parts(src, dst, m_act, ncb);
    m_pipe.l1_loaded(p);
  }

  // dy's rows [0, m_act) of the chunk (from src, rows cout elements apart) x n_act channels in
  // parts of P = 16 x dy_part_blocks rows: part j an nd2nz of rows [j * P, min(m_act, j * P +
  // P)) to dst + j * P * tn elements as NZ of P rows (rows past the chunk zero), n = ceil(m_act
  // / P) parts loaded from part block_id % n on, wrapping (shared_read_part_at).
  void load_dy_in_parts(const Reg& src, const Reg& dst, const Reg& m_act, const Reg& n_act) {
    KernelBuilder& b = m_b;
    const int64_t part = m_t.dy_part_blocks * kBlk;
    KernelBuilder::Origin o(b, fmt::format("dy rows in staggered parts of {} rows", part));
    Reg n = b.reg("parts"), cur = b.reg("part loaded now"), i = b.reg("parts loaded"),
        rows = b.reg("rows of the part"), from = b.reg("part source"), to = b.reg("part NZ"),
        t = b.reg("temp");
    b.add(n, m_act, part - 1);
    b.div(n, n, part, "n: the parts the chunk's rows touch");
    b.emit(Opcode::op_get_block_id, {cur});
    b.rem(cur, cur, n, "this core's first part: block_id % n");
    b.for_range(i, 0, n, 1, [&] {
      b.mul(rows, cur, -part);
      b.add(rows, rows, m_act);
      b.min(rows, rows, part, "rows of the part");
      b.mul(t, cur, part * m_s.cout * m_isz);
      b.add(from, src, t);
      b.mul(t, cur, part * m_t.tn * m_isz);
      b.add(to, dst, t);
      b.emit(Opcode::op_nd2nz, {m_s.in_type, to, from, rows, n_act, m_s.cout, part},
             "a part of dy's rows -> NZ (rows past the chunk zero)");
      b.add(cur, cur, 1, "the next part");
      b.if_(ge(cur, n), [&] { b.movi(cur, 0, "wrapped to the first part"); });
    });
  }

  void compute_step(const Reg& st) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "compute: load3dt + load2d + mmad per L0 step");
    Reg ch = b.reg("chunk"), kt = b.reg("k tile"), nt = b.reg("n tile"), m_act = b.reg("positions"),
        msl = b.reg("first row in slab"), p = b.reg("parity"), pt = b.reg("C parity");
    {
      Reg img = b.reg("image"), mt = b.reg("m tile"), m0 = b.reg("m0");
      decompose(st, {ch, kt, nt, img, mt});
      m_slab.tile_positions(mt, m0, m_act);
      Reg r0 = b.reg("first row"), h = b.reg("rows");
      m_slab.slab_rows(m0, m_act, r0, h);
      m_slab.set_fmatrix(m0, m_act, h);
      m_slab.slab_first_row(msl, m0);
    }
    m_pipe.l1_parity(p, st);
    if (m_t.l0c_buffers == 2) {
      b.div(pt, st, m_t.chunks);
      b.and_(pt, pt, 1, "L0C buffer: tile index in the block & 1");
    } else {
      b.movi(pt, 0);
    }
    m_pipe.l1_wait_loaded(p);
    {
      Reg kstart = b.reg("k start in the slab"), chan = b.reg("slab channels"),
          kext = b.reg("tile rows"), n_act = b.reg("tile channels"), nb = b.reg("column blocks"),
          m16 = b.reg("positions padded"), kk = b.reg("position step");
      {
        Reg c1a = b.reg("first block");
        tile_blocks(kt, c1a, kext);
        b.mul(kstart, kt, m_t.tk);
        b.mul(chan, c1a, m_taps * kBlk);
        b.sub(kstart, kstart, chan, "the tile's first column in the slab's img2col");
        Reg t = b.reg("temp");
        b.mul(t, c1a, kBlk);
        b.movi(chan, m_s.c);
        b.sub(chan, chan, t, "channels from the slab's first block");
      }
      tile_rows(kt, kext);
      tile_channels(nt, n_act);
      b.add(nb, n_act, kBlk - 1);
      b.shr(nb, nb, 4, "column blocks of the tile");
      round16(b, m16, m_act);
      b.for_range(kk, 0, m16, m_t.ks, [&] {
        l0_step(L0Regs{p, pt, ch, kk, m16, msl, kstart, chan, kext, n_act, nb});
      });
    }
    m_pipe.l1_read(p);
    b.if_(eq(ch, m_t.chunks - 1), [&] { store_tile(st, kt, nt, pt); });
  }

  // kext = min(tk, K3 - kt * tk): the tile's rows.
  void tile_rows(const Reg& kt, const Reg& kext) { remaining(kext, kt, m_t.tk, m_k3); }

  struct L0Regs {
    const Reg &p, &pt, &ch, &kk, &m16, &msl, &kstart, &chan, &kext, &n_act, &nb;
  };

  // Positions [kk, kk + ks) of the chunk (at most m16): A = their img2col columns transposed,
  // B = their dy rows, C (+)= A x B.
  void l0_step(const L0Regs& r) {
    KernelBuilder& b = m_b;
    Reg q = b.reg("L0 parity"), a = b.reg("A"), bb = b.reg("B"), src = b.reg("source"),
        k = b.reg("positions of the step"), t = b.reg("temp");
    b.sub(k, r.m16, r.kk);
    b.min(k, k, m_t.ks, "positions of the step");
    m_pipe.l0_parity(q);
    m_pipe.l0_wait_free(q);
    select(b, a, q, m_l0a);
    select(b, src, r.p, m_slab_buf);
    b.add(t, r.msl, r.kk);
    b.emit(Opcode::op_load3dt, {m_s.in_type, a, src, r.chan, t, k, r.kstart, r.kext},
           "img2col^T: the tile's columns x the step's positions");
    select(b, bb, q, m_l0b);
    select(b, src, r.p, m_dy_buf);
    if (m_t.dy_part_blocks == 0) {
      b.mul(t, r.kk, kBlk * m_isz);
      b.add(src, src, t, "the step's first dy row (NZ)");
      Reg i = b.reg("k block"), d = b.reg("L0B fractal");
      b.mov(d, bb);
      b.mul(t, r.nb, kFractalBytes);
      b.for_range(i, 0, k, kBlk, [&] {
        b.emit(Opcode::op_load2d, {m_s.in_type, Buf::L0B, d, src, r.nb, m_t.tp / kBlk, 1},
               "dy: 16 positions x the tile's channels (Zn)");
        b.add(d, d, t);
        b.add(src, src, kBlk * kBlk * m_isz);
      });
    } else {
      // Staggered parts: position pos's 16-row block at part pos / P, row pos % P of it.
      const int64_t part = m_t.dy_part_blocks * kBlk;
      Reg i = b.reg("k block"), d = b.reg("L0B fractal"), pos = b.reg("position"),
          at = b.reg("dy fractal (NZ)");
      b.mov(d, bb);
      b.for_range(i, 0, k, kBlk, [&] {
        b.add(pos, r.kk, i);
        b.div(t, pos, part, "its part");
        b.mul(t, t, part * m_t.tn * m_isz);
        b.add(at, src, t);
        b.rem(pos, pos, part);
        b.mul(pos, pos, kBlk * m_isz, "its row in the part");
        b.add(at, at, pos);
        b.emit(Opcode::op_load2d, {m_s.in_type, Buf::L0B, d, at, r.nb, m_t.dy_part_blocks, 1},
               "dy: 16 positions x the tile's channels (Zn)");
        b.mul(t, r.nb, kFractalBytes);
        b.add(d, d, t);
      });
    }
    m_pipe.l0_loaded(q);
    Reg c = b.reg("C");
    select(b, c, r.pt, m_l0c);
    m_pipe.mmad({m_s.in_type, c, a, bb, r.kext, k, r.n_act}, r.pt, r.ch, r.kk);
    m_pipe.l0_read(q);
    m_pipe.next_l0_step();
  }

  // The tile's rows to out: row block i (img2col column block g = kt * tk / 16 + i: channel
  // block c1 = g / taps, tap = g % taps) to rows part * taps*C + tap * C + c1 * 16, min(16,
  // C - c1 * 16) of them.
  void store_tile(const Reg& st, const Reg& kt, const Reg& nt, const Reg& pt) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "store: the tile's row blocks to their HWIO rows (f32)");
    Reg kext = b.reg("tile rows"), n_act = b.reg("tile channels"), cdst = b.reg("tile columns"),
        l0c = b.reg("C"), i = b.reg("row block"), g = b.reg("column block of img2col"),
        dst = b.reg("destination"), rows = b.reg("rows"), t = b.reg("temp");
    tile_rows(kt, kext);
    tile_channels(nt, n_act);
    {
      // out + (part * taps*C * pitch + the tile's first channel) * 4
      Reg part = b.reg("part");
      b.div(part, st, m_t.chunks);
      b.add(part, part, *m_tbeg);
      b.div(part, part, m_t.k_tiles * keys(), "part");
      b.mul(part, part, m_taps * m_s.c * m_s.pitch);
      tile_first_channel(cdst, nt, m_s.group_pitch ? m_s.group_pitch : m_s.cg_out());
      b.add(cdst, cdst, part);
      b.mul(cdst, cdst, m_osz);
      Reg out = b.load_arg("out");
      b.add(cdst, cdst, out, "the tile's columns of its part's rows");
    }
    m_pipe.l0c_ready(pt, l0c, m_l0c);
    Reg nb = b.reg("column blocks"), first = b.reg("first row");
    if (m_pipe.via_ub()) {
      m_pipe.to_ub({m_s.out_type, cdst, l0c, kext, n_act, m_s.pitch}, pt, nb);
    } else {
      b.add(nb, n_act, kBlk - 1);
      b.shr(nb, nb, 4);
    }
    b.shr(kext, kext, 4, "row blocks");
    b.for_range(i, 0, kext, 1, [&] {
      b.mul(g, kt, m_t.tk / kBlk);
      b.add(g, g, i);
      b.div(t, g, m_taps, "channel block");
      b.mul(t, t, kBlk, "its first channel");
      b.movi(rows, m_s.c);
      b.sub(rows, rows, t);
      b.min(rows, rows, kBlk, "its channels");
      b.rem(g, g, m_taps, "tap");
      b.mul(g, g, m_s.c);
      b.add(g, g, t, "HWIO row");
      b.mul(g, g, m_s.pitch * m_osz);
      b.add(dst, cdst, g);
      b.mul(first, i, kBlk);
      if (m_pipe.via_ub()) {
        m_pipe.ub_to_gm(dst, &first, rows, nb, m_s.pitch * m_osz / kBlkBytes);
        return;
      }
      // The block's rows of each 16-column block: L0C (j * M16 + i * 16) * 16 elements.
      Reg j = b.reg("column block"), src = b.reg("L0C rows"), cols = b.reg("columns"),
          m16 = b.reg("C column block bytes");
      b.mul(src, first, kBlk * kL0cElemBytes);
      b.add(src, src, l0c);
      b.mul(m16, kext, kBlk * kBlk * kL0cElemBytes);
      b.for_range(j, 0, nb, 1, [&] {
        b.mul(cols, j, -kBlk);
        b.add(cols, cols, n_act);
        b.min(cols, cols, kBlk, "channels of the block");
        b.emit(Opcode::op_fixpipe,
               {Dtype::F32, m_s.out_type, Buf::GM, dst, src, rows, cols, m_s.pitch, 1, 0, 0},
               "16 rows x 16 channels to their HWIO rows");
        b.add(dst, dst, kBlk * m_osz);
        b.add(src, src, m16);
      });
    });
    if (m_pipe.via_ub())
      m_pipe.ub_done();
    else
      m_pipe.l0c_stored(pt);
  }

  const FilterGradSpec& m_s;
  const FilterGradTiling& m_t;
  KernelBuilder m_b;
  SlabEmitter m_slab;
  const int64_t m_isz, m_osz, m_taps, m_k3;
  CubePipeline m_pipe;
  Twin m_slab_buf, m_dy_buf, m_l0a, m_l0b, m_l0c;
  const Reg* m_tbeg = nullptr;
};

}  // namespace

bool conv_staggered_loads_enabled(const std::string& op) {
  const char* v = std::getenv("NPUSIM_CONV_STAGGERED_LOADS");
  if (!v || std::string_view(v) == "1") return true;
  if (std::string_view(v) == "0") return false;
  throw CompileError(
      fmt::format("{}: NPUSIM_CONV_STAGGERED_LOADS='{}' is neither '0' nor '1'", op, v));
}

namespace {

// Whether `value`, in NPUSIM_MIX_ONE_TO_ONE's grammar, names `kernel`; a bad value a CompileError
// "<op>: <what>='<value>': ..." (what: the switch or the attribute).
bool names_one_to_one(const std::string& op, const std::string& what, std::string_view value,
                      OneToOneMix kernel) {
  if (value == "0") return false;
  if (value == "1") return true;
  constexpr std::pair<std::string_view, OneToOneMix> kNames[] = {
      {"filter_grad", OneToOneMix::filter_grad}, {"bn_reduce", OneToOneMix::bn_reduce}};
  bool named = false;
  std::string_view rest = value;
  while (true) {
    const size_t comma = rest.find(',');
    const std::string_view name = rest.substr(0, comma);
    const auto* it = std::find_if(std::begin(kNames), std::end(kNames),
                                  [&](const auto& k) { return k.first == name; });
    if (it == std::end(kNames))
      throw CompileError(
          fmt::format("{}: {}='{}': '{}' is not a kernel it names "
                      "(filter_grad, bn_reduce, comma-separated; or '1' all, '0' none)",
                      op, what, value, name));
    named = named || it->second == kernel;
    if (comma == std::string_view::npos) return named;
    rest.remove_prefix(comma + 1);
  }
}

}  // namespace

bool mix_one_to_one_enabled(const std::string& op, OneToOneMix kernel, bool by_default) {
  const char* v = std::getenv("NPUSIM_MIX_ONE_TO_ONE");
  if (!v) return by_default;
  return names_one_to_one(op, "NPUSIM_MIX_ONE_TO_ONE", v, kernel);
}

bool mix_one_to_one_asked(const OpDesc& op, OneToOneMix kernel) {
  return names_one_to_one(op.str(), std::string("attribute ") + kMixOneToOneAttr,
                          op.attr_string(kMixOneToOneAttr, "0"), kernel);
}

int64_t filter_grad_dy_part_blocks(const FilterGradSpec& s, const FilterGradTiling& t,
                                   const ChipConfig& cfg, const std::string& op) {
  const double line_rate = cfg.l2_line_read_bytes_per_cycle;  // R, bytes per cycle
  const int64_t row_blocks = t.tp / kBlk;
  const int64_t isz = isa::dtype_size(s.in_type);
  const int64_t run = std::min(t.tn, s.cg_out()) * isz, pitch = s.cout * isz;  // a row's bytes
  // The cores loading one chunk's dy lines together: those on the k tiles of the weight keys
  // whose channels share a line (a key's k_tiles tiles are consecutive, per a core).
  const int64_t line = std::max<int64_t>(1, static_cast<int64_t>(cfg.l2_line_bytes));
  const int64_t line_keys =
      std::min(s.groups * t.n_tiles, std::max<int64_t>(1, line / std::max<int64_t>(1, run)));
  const int64_t readers =
      std::min<int64_t>(t.block_dim, ceil_div(t.k_tiles * line_keys, std::max<int64_t>(1, t.per)));
  if (line_rate <= 0 || row_blocks <= 1 || readers <= 1 || !conv_staggered_loads_enabled(op))
    return 0;
  const double port = cfg.l2_read_bytes_per_cycle;  // 0: no port limit
  // One load of `rows` rows with `sharers` cores in step on its lines: the DMA's issue or its
  // bytes at the line's share, whichever is longer.
  const auto load_cycles = [&](int64_t rows, int64_t sharers) {
    const double share = line_rate / static_cast<double>(sharers);
    const double rate = port > 0 ? std::min(port, share) : share;
    return std::max(copy_issue_estimate(cfg, rows, run, pitch),
                    static_cast<double>(rows * run) / rate);
  };
  double best = load_cycles(t.tp, readers);  // one nd2nz: every reader in step on it
  int64_t blocks = 0;
  for (int64_t q = 1; q < row_blocks; ++q) {
    const int64_t parts = ceil_div(row_blocks, q);
    const double cycles =
        static_cast<double>(parts) * load_cycles(q * kBlk, ceil_div(readers, parts));
    if (cycles < best) {
      best = cycles;
      blocks = q;
    }
  }
  return blocks;
}

std::vector<FilterGradTiling> filter_grad_tilings(const FilterGradSpec& s, const ChipConfig& cfg,
                                                  const std::string& op) {
  const CoreKindConfig& core = cube_core(cfg, op);
  const bool via_ub = cube_store_via_ub(cfg, core, op);
  check_geometry(op, s.h, s.w, s.kh, s.kw, s.sh, s.sw, s.dh, s.dw, s.pt, s.pb, s.pl, s.pr);
  if (isa::dtype_size(s.in_type) != 2)
    throw CompileError(fmt::format("{}: the fused filter gradient takes 16-bit types", op));
  if (s.parts < 1) throw CompileError(fmt::format("{}: {} parts", op, s.parts));
  if (s.pixel_channels != 0 &&
      (s.groups != 1 || s.x_row != 0 || s.pixel_channels < s.c || s.kw != 1 || s.sw != 1))
    throw CompileError(fmt::format(
        "{}: pixels of {} channels hold x's {} channels only in a dense map of one group under "
        "a 1x1-wide window of stride 1 along W",
        op, s.pixel_channels, s.c));
  if (s.groups < 1 || s.cout % s.groups != 0 || (s.groups > 1 && s.x_row != 0) ||
      (s.group_pitch != 0 && (s.group_pitch < s.cg_out() || s.groups * s.group_pitch > s.pitch)))
    throw CompileError(fmt::format(
        "{}: {} groups of {} output channels (group pitch {}, row pitch {}){}", op, s.groups,
        s.cout, s.group_pitch, s.pitch, s.x_row != 0 ? " over a strided view of x" : ""));
  const int64_t isz = 2, taps = s.kh * s.kw, per_c1 = taps * kBlk;
  const int64_t k3 = ceil_div(s.c, kBlk) * per_c1, positions = s.oh() * s.ow();
  // Rates (bytes per cycle) and a step's fixed cost beyond its slowest pipe: the hand-overs'
  // start latencies (GM -> L1, L1 -> L0A and L0B, the cube's pipeline), as the convolution's
  // planner counts them (ops/conv_tiling.cpp).
  const double gm_rate = cfg.path_rate(Buf::GM, Buf::L1), l2_rate = cube_l2_read_rate(cfg, core);
  const PixelLoads pixel_loads = pixel_loads_switch(op);
  const StridedSlabLoads strided_loads =
      s.x_row != 0 ? strided_slab_switch(op) : StridedSlabLoads::kAsBefore;
  const double l0a_rate = cfg.path_rate(Buf::L1, Buf::L0A),
               l0b_rate = cfg.path_rate(Buf::L1, Buf::L0B);
  const double l1_lat = cfg.path_latency(Buf::L1, Buf::L0A),
               l0b_lat = cfg.path_latency(Buf::L1, Buf::L0B);
  const double overhead = cfg.path_latency(Buf::GM, Buf::L1) + 2 * l1_lat + cfg.cube_latency_cycles;
  const double store_rate = cube_store_rate(cfg);
  const int64_t osz = isa::dtype_size(s.out_type);  // bytes per stored element
  // Per k-tile height: the largest slab planes of a tile and their mean over the tiles.
  struct Rows {
    int64_t tk, kc1;
    double mean_c1;
  };
  std::vector<Rows> tks;
  for (int64_t tk : balanced_sides(k3, kMaxTileRows)) {
    Rows r{tk, 0, 0};
    const int64_t n = ceil_div(k3, tk);
    for (int64_t kt = 0; kt < n; ++kt) {
      const int64_t c = (std::min(k3, kt * tk + tk) - 1) / per_c1 - kt * tk / per_c1 + 1;
      r.kc1 = std::max(r.kc1, c);
      r.mean_c1 += static_cast<double>(c) / static_cast<double>(n);
    }
    tks.push_back(r);
  }
  const std::vector<int64_t> tns = balanced_sides(s.cg_out(), kMaxTile);
  // x's rows the view reads and dy, each once (bytes).
  const double operand_bytes =
      static_cast<double>(s.images * s.h * s.w * s.groups * round_up(s.c, kBlk) * isz) +
      static_cast<double>(s.images * positions * s.cout * isz);
  std::vector<FilterGradTiling> tilings;
  for (int64_t tp : balanced_sides(positions, kMaxChunk)) {
    const std::vector<SlabGeom> mts = m_tiles(positions, tp, s.ow(), s.h, s.kh, s.sh, s.dh, s.pt);
    int64_t rows = 0;
    double mean_rows = 0;
    for (const SlabGeom& g : mts) {
      rows = std::max(rows, g.h);
      mean_rows += static_cast<double>(g.h) / static_cast<double>(mts.size());
    }
    const int64_t all_chunks = s.images * static_cast<int64_t>(mts.size());
    if (all_chunks % s.parts != 0) continue;  // parts of equal chunks
    const int64_t chunks = all_chunks / s.parts;
    const double mean_tp = static_cast<double>(positions) / static_cast<double>(mts.size());
    for (const Rows& kr : tks) {
      for (int64_t tn : tns) {
        FilterGradTiling t;
        t.tk = kr.tk;
        t.tn = tn;
        t.tp = tp;
        t.ks = cube_k_step(core, cfg, t.tk, t.tn, isz, std::min(tp, kMaxTile));
        if (t.ks == 0) continue;
        t.kc1 = kr.kc1;
        t.slab_rows = rows;
        t.slab_bytes = slab_buffer_bytes(t.kc1, rows, s.w);
        t.l0c_buffers = l0c_buffer_count(core, cfg, t.tk * t.tn * kL0cElemBytes);
        if (t.l0c_buffers == 0) continue;
        t.k_tiles = ceil_div(k3, t.tk);
        t.n_tiles = ceil_div(s.cg_out(), t.tn);
        t.m_tiles = static_cast<int64_t>(mts.size());
        t.chunks = chunks;
        t.tiles = s.parts * s.groups * t.k_tiles * t.n_tiles;
        const CubeSplit split = contiguous_split(t.tiles, core.count);
        t.per = split.per;
        t.block_dim = split.block_dim;
        t.dy_part_blocks = filter_grad_dy_part_blocks(s, t, cfg, op);
        if (t.dy_part_blocks > 0 && !FilterGradBuffers(t, isz, t.l0c_buffers).fit(core, cfg))
          t.dy_part_blocks = 0;  // the parts' whole rows past tp do not fit: one nd2nz
        if (!FilterGradBuffers(t, isz, t.l0c_buffers).fit(core, cfg)) continue;
        if (via_ub && t.tk * t.tn * kL0cElemBytes > static_cast<int64_t>(core.capacity(Buf::UB)))
          continue;
        // A chunk: the slowest of its loads (slab planes x rows x width, dy rows) and its L0
        // steps (each the slower of the cube and the L1 -> L0 copies), plus the hand-overs.
        // The loads of later chunks mostly hit the L2 (every tile of a part reads the same
        // positions' x and dy): the distinct bytes come from HBM once, the rest at the L2's
        // rate (cube_load_rate); a core's first chunk is cold (first_chunk below).
        const double slab = kr.mean_c1 * mean_rows * static_cast<double>(s.w) * kBlkBytes;
        const double chunk_bytes = slab + mean_tp * static_cast<double>(tn * isz);
        const double loaded = static_cast<double>(t.tiles * chunks) * chunk_bytes;
        const CubeLoadRate rate =
            cube_load_rate(cfg, static_cast<double>(t.block_dim), operand_bytes, loaded);
        // A dense slab (x without a strided view) by whole pixels or per plane
        // (dense_slab_load); MTE2 takes at least the DMA's issue of the slab's nd2nz and dy's
        // (copy_issue_estimate; 0 on chips without the keys).
        // (dy's rows in staggered parts are priced as one nd2nz: the estimate prices no
        // same-line serialisation either, so the choice of tiling stays the one without R.)
        double issue = copy_issue_estimate(cfg, static_cast<int64_t>(std::ceil(mean_tp)),
                                           std::min(tn, s.cout) * isz, s.cout * isz);
        if (s.x_row == 0) {
          const SlabLoad l =
              dense_slab_load(cfg, pixel_loads,
                              static_cast<int64_t>(std::ceil(mean_rows * static_cast<double>(s.w))),
                              t.kc1, s.x_channels(), isz, l2_rate, gm_rate);
          t.whole_pixels = l.whole_pixels;
          issue += l.issue;
        } else if (strided_loads != StridedSlabLoads::kAsBefore) {
          // A strided view (the strided windows of one tap a column): its load as before (by
          // columns or per plane and row) or per pixel where it can and where forced or its
          // issue is the lower (both 0 on chips without the keys: the kernel as before).
          const SlabEmitter::Geometry view = FilterGradEmitter::slab_geometry(s, t);
          const auto slab_issue = [&](StridedSlabForm form) {
            return strided_slab_issue(cfg, form, static_cast<int64_t>(std::ceil(mean_rows)), s.w,
                                      t.kc1, s.x_pixel * isz, s.x_row * isz);
          };
          const double as_before =
              slab_issue(SlabEmitter::strided_columns(view) ? StridedSlabForm::kColumns
                                                            : StridedSlabForm::kPlaneRows);
          const double per_pixel = slab_issue(StridedSlabForm::kPerPixel);
          t.strided_pixels =
              SlabEmitter::strided_blocks(view) &&
              (strided_loads == StridedSlabLoads::kPerPixel || per_pixel < as_before);
          issue += t.strided_pixels ? per_pixel : as_before;
        }
        const double mte2 =
            rate.access_latency + std::max(chunk_bytes * rate.cycles_per_byte, issue);
        const double cold = cfg.hbm_latency_cycles + chunk_bytes / gm_rate;
        const double l0_steps = std::ceil(mean_tp / static_cast<double>(t.ks));
        // An L0 step: one mmad (its latency and fractals), and on MTE1 one load3dt of the
        // tile's rows into L0A and a load2d per 16 positions of dy into L0B, each its path's
        // latency plus its bytes (as MatMul's tile_cost_cycles counts them). A step takes the
        // chunk's positions (rounded up to 16, as the kernel's m16) over its steps, at most ks:
        // the last step of a chunk holds only what the others left.
        const double step_k =
            static_cast<double>(round_up(static_cast<int64_t>(std::ceil(mean_tp)), kBlk)) /
            l0_steps;
        const double cube =
            cfg.cube_latency_cycles +
            step_k * static_cast<double>(ceil_div(t.tk, cfg.cube_m) * ceil_div(t.tn, cfg.cube_n)) /
                static_cast<double>(cfg.cube_k);
        const double mte1 = l1_lat + step_k * static_cast<double>(t.tk * isz) / l0a_rate +
                            std::ceil(step_k / kBlk) * l0b_lat +
                            step_k * static_cast<double>(t.tn * isz) / l0b_rate;
        const double chunk = std::max(mte2, l0_steps * std::max(cube, mte1)) + overhead;
        // A tile's store: its elements of out_type (f32 partial products, or dW itself where
        // one part writes it) at the path's rate (cube_store_rate), as MatMul's epilogue.
        const double store = static_cast<double>(t.tk * t.tn * osz) / store_rate;
        // The pipeline's fill: a core's first chunk loads before any L0 step, with every core
        // loading its own at once (L2 cold): the slower of its gm->l1 path and its share of HBM.
        const double first_chunk =
            std::max(cold, cfg.hbm_latency_cycles + static_cast<double>(t.block_dim) * chunk_bytes /
                                                        cfg.hbm_bytes_per_cycle());
        t.cycles = static_cast<double>(t.per) * (static_cast<double>(chunks) * chunk + store) +
                   first_chunk;
        // Every tile reads its chunks' slabs and dy rows: all cores' loads share HBM. Where x's
        // and dy's bytes fit in the L2 they come from HBM once (the tiles of a part read the
        // same positions, as cube_load_rate counts); else every read is counted at HBM (the
        // chunks' data no longer stays in the L2 between the tiles that read it).
        const bool operands_stay =
            cfg.l2_bytes > 0 && operand_bytes <= static_cast<double>(cfg.l2_bytes);
        const double bytes = (operands_stay ? operand_bytes : loaded) +
                             static_cast<double>(t.tiles * t.tk * t.tn * osz);
        t.cycles = std::max(t.cycles, bytes / cfg.hbm_bytes_per_cycle());
        tilings.push_back(t);
      }
    }
  }
  if (tilings.empty())
    throw CompileError(
        fmt::format("{}: no filter-gradient tile fits the cube core of chip {}", op, cfg.name));
  return tilings;
}

FilterGradTiling plan_filter_grad(const FilterGradSpec& s, const ChipConfig& cfg,
                                  const std::string& op) {
  const std::vector<FilterGradTiling> tilings = filter_grad_tilings(s, cfg, op);
  return *std::min_element(
      tilings.begin(), tilings.end(),
      [](const FilterGradTiling& a, const FilterGradTiling& b) { return a.cycles < b.cycles; });
}

Launch build_filter_grad(const FilterGradSpec& s, const FilterGradTiling& t, const ChipConfig& cfg,
                         const std::string& op) {
  Launch l;
  FilterGradEmitter e(s, t, cfg, op);
  l.kernel = e.emit();
  l.block_dim = t.block_dim;
  l.summary = fmt::format(
      "img2col(x)^T x dy by load3dt, x {}x{}x{}x{} ({}x{} window) x {} channels, {} parts: tiles "
      "of {} rows x {} channels over chunks of {} positions (L0 steps of {}), {} tiles over {} "
      "blocks, modelled ~{:.0f} cycles",
      s.images, s.h, s.w, s.c, s.kh, s.kw, s.cout, s.parts, t.tk, t.tn, t.tp, t.ks, t.tiles,
      t.block_dim, t.cycles);
  if (s.groups > 1)
    l.summary += fmt::format("; {} groups of {} -> {} channels", s.groups, s.c, s.cg_out());
  if (s.add_parts)
    l.summary += l.kernel.program.aiv_per_aic == 1
                     ? "; the parts added by the vector cores, one per cube core"
                     : "; the parts added by the vector cores";
  if (t.dy_part_blocks > 0)
    l.summary += fmt::format("; dy rows in staggered parts of {} rows", t.dy_part_blocks * kBlk);
  if (s.pixel_channels != 0)
    l.summary += fmt::format("; x's rows read whole, pixels of {} channels{}", s.pixel_channels,
                             t.whole_pixels ? ", slab by whole pixels" : "");
  if (s.x_row != 0)
    l.summary +=
        fmt::format("; x viewed with pixels {} and rows {} elements apart{}", s.x_pixel, s.x_row,
                    t.strided_pixels      ? ", slab loaded per pixel"
                    : e.slab_by_columns() ? ", slab loaded by columns"
                                          : "");
  return l;
}

}  // namespace npusim::compiler::ops
