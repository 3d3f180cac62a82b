#include "adapter/compiler/ops/conv_slab.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "common/int_math.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

int64_t slab_buffer_bytes(int64_t kc1, int64_t slab_rows, int64_t wv) {
  return round_up(kc1 * slab_rows * wv * kBlkBytes + (kBlk + 1) * kBlkBytes, 512);
}
int64_t weight_buffer_bytes(int64_t k, int64_t tn16) { return round_up(k * tn16 * 2, 512); }

ConvL1Buffers conv_l1_buffers(const CubeConvTiling& t, int64_t bias_bytes) {
  ConvL1Buffers l1;
  l1.slab = l1.plan.add_fixed("slab", static_cast<uint64_t>(t.slab_bytes), 2);
  l1.weights = l1.plan.add_fixed("weights", static_cast<uint64_t>(t.b_bytes), t.resident ? 1 : 2);
  l1.bias =
      l1.plan.add_fixed("bias (L1 parity)", static_cast<uint64_t>(bias_bytes), 2, bias_bytes > 0);
  return l1;
}

SlabGeom slab_geom(int64_t m0, int64_t m_act, int64_t ow, int64_t hv, int64_t kh, int64_t sh,
                   int64_t dh, int64_t pt) {
  const int64_t oh0 = m0 / ow, oh1 = (m0 + m_act - 1) / ow;
  const int64_t r_start = oh0 * sh - pt, r_end = oh1 * sh - pt + (kh - 1) * dh + 1;
  const int64_t r0 = std::max<int64_t>(0, r_start), r1 = std::min(hv, r_end);
  return SlabGeom{m0, m_act, r0, r1 - r0, r0 - r_start, r_end - r1, m0 - oh0 * ow};
}

std::vector<SlabGeom> m_tiles(int64_t positions, int64_t tm, int64_t ow, int64_t hv, int64_t kh,
                              int64_t sh, int64_t dh, int64_t pt) {
  std::vector<SlabGeom> v;
  for (int64_t m0 = 0; m0 < positions; m0 += tm)
    v.push_back(slab_geom(m0, std::min(tm, positions - m0), ow, hv, kh, sh, dh, pt));
  return v;
}

StackGeom stack_geom(const CubeConvSpec& s, int64_t stack) {
  const int64_t hv = s.hv(), oh = s.oh(), ekh = (s.kh - 1) * s.dh + 1;
  if (stack == 1) return StackGeom{hv, hv, oh};
  const int64_t after = std::max<int64_t>(0, (oh - 1) * s.sh - s.pt + ekh - hv);
  int64_t gap = std::max(s.pt, after);
  gap += (s.sh - (hv + gap) % s.sh) % s.sh;
  const int64_t period = hv + gap;
  return StackGeom{period, stack * period - gap, (stack - 1) * period / s.sh + oh};
}

void check_geometry(const std::string& op, int64_t hv, int64_t wv, int64_t kh, int64_t kw,
                    int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pb,
                    int64_t pl, int64_t pr) {
  auto fail = [&](const std::string& what) { throw CompileError(fmt::format("{}: {}", op, what)); };
  const int64_t u8 = field_max(isa::FieldKind::U8), u4 = field_max(isa::FieldKind::U4);
  const int64_t ru16 = field_max(isa::FieldKind::RU16);
  if (kh > u8 || kw > u8)
    fail(
        fmt::format("window {}x{} exceeds load3d's {} (set_l3d_geom kh/kw are 8-bit)", kh, kw, u8));
  if (sh > u4 || sw > u4 || dh > u4 || dw > u4)
    fail(fmt::format("strides {}x{} / dilations {}x{} exceed load3d's {} (4-bit fields)", sh, sw,
                     dh, dw, u4));
  if (pt > u8 || pb > u8 || pl > u8 || pr > u8)
    fail(fmt::format("paddings {},{},{},{} exceed set_fmatrix's {}", pt, pb, pl, pr, u8));
  const int64_t ekh = (kh - 1) * dh + 1, ekw = (kw - 1) * dw + 1;
  if (pt >= ekh || pb >= ekh || pl >= ekw || pr >= ekw)
    fail(
        fmt::format("paddings {},{},{},{} (top, bottom, left, right) must be smaller than the "
                    "dilated window {}x{}",
                    pt, pb, pl, pr, ekh, ekw));
  if (hv + pt + pb < ekh || wv + pl + pr < ekw)
    fail(fmt::format("the dilated window {}x{} does not fit the padded input {}x{}", ekh, ekw,
                     hv + pt + pb, wv + pl + pr));
  if (wv > ru16 || hv > ru16)
    fail(fmt::format("input {}x{} exceeds {} (set_fmatrix)", hv, wv, ru16));
}

namespace {

// A three-way lowering switch: unset (or empty) -> by_estimate, "0" -> off, "1" -> on; any other
// value is a CompileError naming the op and the variable.
template <typename Choice>
Choice three_way_switch(const char* name, const std::string& op, Choice by_estimate, Choice off,
                        Choice on) {
  const char* v = std::getenv(name);
  const std::string_view value = v ? v : "";
  if (value.empty()) return by_estimate;
  if (value == "0") return off;
  if (value == "1") return on;
  throw CompileError(fmt::format("{}: {}='{}' is none of '', '0', '1'", op, name, value));
}

}  // namespace

PixelLoads pixel_loads_switch(const std::string& op) {
  return three_way_switch("NPUSIM_CONV_PIXEL_LOADS", op, PixelLoads::kByEstimate,
                          PixelLoads::kPerPlane, PixelLoads::kWholePixels);
}

WeightLoads weight_loads_switch(const std::string& op) {
  return three_way_switch("NPUSIM_CONV_WEIGHT_RUNS", op, WeightLoads::kByEstimate,
                          WeightLoads::kPerBlock, WeightLoads::kByTap);
}

StridedSlabLoads strided_slab_switch(const std::string& op) {
  return three_way_switch("NPUSIM_FILTER_GRAD_STRIDED_PIXELS", op, StridedSlabLoads::kByEstimate,
                          StridedSlabLoads::kAsBefore, StridedSlabLoads::kPerPixel);
}

StridedSlabLoads conv_strided_slab_switch(const std::string& op) {
  return three_way_switch("NPUSIM_CONV_STRIDED_PIXELS", op, StridedSlabLoads::kByEstimate,
                          StridedSlabLoads::kAsBefore, StridedSlabLoads::kPerPixel);
}

double strided_slab_issue(const ChipConfig& cfg, StridedSlabForm form, int64_t rows, int64_t ws,
                          int64_t planes, int64_t pixel_bytes, int64_t row_bytes) {
  if (form == StridedSlabForm::kPlaneRows)
    return static_cast<double>(planes * rows) *
           copy_issue_estimate(cfg, ws, kBlkBytes, pixel_bytes);
  if (form == StridedSlabForm::kColumns && rows >= planes)
    return static_cast<double>(planes * ws) * copy_issue_estimate(cfg, rows, kBlkBytes, row_bytes);
  return static_cast<double>(rows * ws) *
         copy_issue_estimate(cfg, 1, planes * kBlkBytes, planes * kBlkBytes);
}

double copy_issue_estimate(const ChipConfig& cfg, int64_t runs, int64_t run_bytes,
                           int64_t pitch_bytes) {
  if (cfg.copy_issue_cycles == 0 && cfg.burst_cycles == 0) return 0;
  constexpr double kBurst = 512, kStart = 32;  // mte::kGmBurstBytes, a run's start alignment
  const auto bursts = [&](double bytes) { return (bytes + kBurst - kStart) / kBurst; };
  const double n = run_bytes == pitch_bytes
                       ? bursts(static_cast<double>(runs * run_bytes))
                       : static_cast<double>(runs) * bursts(static_cast<double>(run_bytes));
  return cfg.copy_issue_cycles + cfg.burst_cycles * n;
}

double cube_l2_read_rate(const ChipConfig& cfg, const CoreKindConfig& core) {
  const double gm_rate = cfg.path_rate(isa::Buf::GM, isa::Buf::L1);
  if (cfg.l2_read_bytes_per_cycle <= 0 || cfg.l2_gbps <= 0) return gm_rate;
  return std::max(gm_rate, std::min(cfg.l2_read_bytes_per_cycle,
                                    cfg.l2_bytes_per_cycle() / static_cast<double>(core.count)));
}

SlabLoad dense_slab_load(const ChipConfig& cfg, PixelLoads mode, int64_t pixels, int64_t planes,
                         int64_t cs, int64_t isz, double l2_rate, double gm_rate) {
  const int64_t pitch = cs * isz, run = std::min(planes * kBlkBytes, pitch);
  const double bytes = static_cast<double>(pixels * planes * kBlkBytes);
  SlabLoad per_plane{false, planes, 0, 0}, whole{true, 1, 0, 0};
  per_plane.issue =
      static_cast<double>(planes) * copy_issue_estimate(cfg, pixels, kBlkBytes, pitch);
  per_plane.cycles = std::max(bytes / l2_rate, per_plane.issue);
  whole.issue = copy_issue_estimate(cfg, pixels, run, pitch);
  whole.cycles = std::max(static_cast<double>(pixels * run) / gm_rate, whole.issue);
  if (mode == PixelLoads::kPerPlane) return per_plane;
  if (mode == PixelLoads::kWholePixels) return whole;
  // Without the keys the kernels stay as they were (a plan change reorders the sums of the
  // statistics in the convolutions' epilogues): whole pixels only where the DMA's issue counts.
  if (cfg.copy_issue_cycles == 0 && cfg.burst_cycles == 0) return per_plane;
  return whole.cycles < per_plane.cycles ? whole : per_plane;
}

SlabEmitter::SlabEmitter(KernelBuilder& b, const Geometry& g)
    : m_b(b), m_g(g), m_isz(isa::dtype_size(g.type)) {
  for (const SlabGeom& t : m_tiles(g.oh * g.ow, g.tm, g.ow, hv(), g.kh, g.sh, g.dh, g.pt))
    m_pads.insert({t.ptl, t.pbl});
}

void SlabEmitter::tile_positions(const Reg& mt, const Reg& m0, const Reg& m_act) {
  m_b.mul(m0, mt, m_g.tm, "first output position of the tile");
  m_b.movi(m_act, m_g.oh * m_g.ow);
  m_b.sub(m_act, m_act, m0);
  m_b.min(m_act, m_act, m_g.tm, "positions in the tile");
}

void SlabEmitter::slab_first_row(const Reg& msl, const Reg& m0) {
  m_b.div(msl, m0, m_g.ow);
  m_b.mul(msl, msl, m_g.ow);
  m_b.sub(msl, m0, msl, "m0 - oh0 * OW");
}

void SlabEmitter::slab_rows(const Reg& m0, const Reg& m_act, const Reg& r0, const Reg& h) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, "slab rows: [max(0, oh0*sh - pt), min(Hv, oh1*sh - pt + ekh))");
  b.div(r0, m0, m_g.ow);
  b.mul(r0, r0, m_g.sh);
  b.sub(r0, r0, m_g.pt);
  b.add(h, m0, m_act);
  b.sub(h, h, 1);
  b.div(h, h, m_g.ow);
  b.mul(h, h, m_g.sh);
  b.add(h, h, ekh() - m_g.pt);
  b.min(h, h, hv(), "end row");
  b.max(r0, r0, 0, "first row");
  b.sub(h, h, r0, "rows");
}

// set_fmatrix for the tile (m0, m_act) whose slab has h rows. The slab's top and bottom

void SlabEmitter::set_fmatrix(const Reg& m0, const Reg& m_act, const Reg& h) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, "set_fmatrix: the tile's slab and paddings");
  if (m_pads.size() == 1) {
    b.emit(Opcode::op_set_fmatrix,
           {h, wv(), m_pads.begin()->first, m_pads.begin()->second, m_g.pl, m_g.pr});
    return;
  }
  // code = top * 256 + bottom with top = max(0, pt - oh0*sh),
  // bottom = max(0, oh1*sh - pt + ekh - Hv).
  Reg code = b.reg("fmatrix: padding pair"), t = b.reg("fmatrix: temp");
  b.div(t, m0, m_g.ow);
  b.mul(t, t, m_g.sh);
  b.movi(code, m_g.pt);
  b.sub(code, code, t);
  b.max(code, code, 0, "top padding");
  b.mul(code, code, 256);
  b.add(t, m0, m_act);
  b.sub(t, t, 1);
  b.div(t, t, m_g.ow);
  b.mul(t, t, m_g.sh);
  b.add(t, t, ekh() - m_g.pt - hv());
  b.max(t, t, 0, "bottom padding");
  b.add(code, code, t);
  Label done = b.label("fmatrix_set");
  size_t i = 0;
  for (const auto& [ptl, pbl] : m_pads) {
    if (++i == m_pads.size()) {
      b.emit(Opcode::op_set_fmatrix, {h, wv(), ptl, pbl, m_g.pl, m_g.pr});
      break;
    }
    Label next = b.label("fmatrix_next");
    b.branch(ne(code, ptl * 256 + pbl), next);
    b.emit(Opcode::op_set_fmatrix, {h, wv(), ptl, pbl, m_g.pl, m_g.pr});
    b.jmp(done);
    b.bind(next);
  }
  b.bind(done);
}

void SlabEmitter::zero_slab(const Reg& dst, const Reg& x, const Reg& ncb, const Reg& plane,
                            const Reg& t, const Reg& d) {
  KernelBuilder& b = m_b;
  b.mul(t, ncb, plane);
  b.add(t, t, kBlk);
  b.shr(t, t, 4);
  b.shl(t, t, 4);
  b.sub(d, dst, kBlkBytes);
  b.emit(Opcode::op_nd2nz, {m_g.type, d, x, 1, 1, 1, t}, "zero the slab");
}

// The registers every way of loading a slab uses.
struct SlabEmitter::Scratch {
  Reg plane, src, c, t, d, end;
};

void SlabEmitter::load_slab(const SlabArgs& a) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, "slab: NHWC rows -> 16-channel planes in L1");
  Scratch r;
  r.plane = b.reg("slab: pixels per plane");
  b.mul(r.plane, a.h, wv());
  r.src = b.reg("slab: source");
  r.c = b.reg("slab: channel block");
  r.t = b.reg("slab: temp");
  r.d = b.reg("slab: destination");
  r.end = b.reg("slab: end");
  if (m_g.stack > 1) {
    load_stacked(a, r);
    return;
  }
  Reg uu = b.reg("slab: row");
  if (m_g.x_row != 0 && (m_g.strided_by_pixel || strided_columns())) {
    load_strided_columns(a, r);
    return;
  }
  if (m_g.x_row != 0) {
    // x with its own strides (CubeConvSpec::x_pixel...): every slab row, pixels x_pixel
    // apart (the nd2nz rows may overlap in GM).
    Reg uend = b.reg("slab: end row");
    b.add(uend, a.r0, a.h);
    plane_rows(
        a, r, uu, a.r0, uend, 1, m_g.x_pixel, m_g.x_row * m_isz,
        [&](const Reg& cblock) {
          // src = x + (img * x_image + uu * x_row + cbase + cblock * 16) * size
          b.mul(r.src, a.img, m_g.x_image);
          b.mul(r.t, uu, m_g.x_row);
          b.add(r.src, r.src, r.t);
          b.add(r.src, r.src, a.cbase);
          b.mul(r.t, cblock, kBlk);
          b.add(r.src, r.src, r.t);
          b.mul(r.src, r.src, m_isz);
          b.add(r.src, r.src, a.x);
        },
        "one row of one plane (strided view of x)");
    return;
  }
  if (!zero_insertion())
    load_dense(a, r);
  else
    load_zero_inserted(a, r, uu);
}

// Stacked: the slab zeroed, then per plane, per image j of the stack (unrolled): its rows
// [j * period, j * period + Hv) within the slab, one nd2nz (padding to 16 pixels spills zeros
// into pixels written afterwards: the gap, the next image's rows or the next plane). Images past
// the last one stay zero.
void SlabEmitter::load_stacked(const SlabArgs& a, Scratch& r) {
  KernelBuilder& b = m_b;
  zero_slab(a.dst, a.x, a.ncb, r.plane, r.t, r.d);
  Reg sc = b.reg("slab: the plane's source (image img, row 0)"), dc = b.reg("slab: plane"),
      u0 = b.reg("slab: first row of the image"), u1 = b.reg("slab: end row of the image"),
      chans = b.reg("slab: channels from the plane's first");
  b.mul(sc, a.img, m_g.hs * m_g.ws * m_g.cs);
  b.add(sc, sc, a.cbase);
  b.mul(r.t, a.c1a, kBlk);
  b.add(sc, sc, r.t);
  b.mul(sc, sc, m_isz);
  b.add(sc, sc, a.x);
  b.mov(dc, a.dst);
  b.mul(chans, a.c1a, kBlk);
  b.sub(chans, a.cvalid, chans);
  b.add(r.end, a.c1a, a.ncb);
  b.for_range(r.c, a.c1a, r.end, 1, [&] {
    Label planed = b.label("slab_plane_done");
    for (int64_t j = 0; j < m_g.stack; ++j) {
      const int64_t top = j * m_g.period;
      Label skip = b.label("slab_image_skipped");
      if (j > 0) b.branch(ge(a.img, m_g.images - j), planed);  // no image j
      b.movi(u0, top);
      b.max(u0, u0, a.r0, "first row of the image in the slab");
      b.add(u1, a.r0, a.h);
      b.min(u1, u1, top + m_g.hs, "end row of the image in the slab");
      b.branch(ge(u0, u1), skip);
      // src = sc + (u0 + j * (hs - period)) * ws * cs * size (row u0 - top of image j)
      b.add(r.src, u0, j * (m_g.hs - m_g.period));
      b.mul(r.src, r.src, m_g.ws * m_g.cs * m_isz);
      b.add(r.src, r.src, sc);
      b.sub(r.d, u0, a.r0);
      b.mul(r.d, r.d, wv() * kBlkBytes);
      b.add(r.d, r.d, dc);
      b.sub(u1, u1, u0);
      b.mul(u1, u1, m_g.ws, "pixels");
      round16(b, u0, u1);
      b.min(r.t, chans, kBlk, "channels in the block");
      b.emit(Opcode::op_nd2nz, {m_g.type, r.d, r.src, u1, r.t, m_g.cs, u0},
             "the image's rows of one plane");
      b.bind(skip);
    }
    b.bind(planed);
    b.add(sc, sc, kBlk * m_isz);
    b.mul(r.t, r.plane, kBlkBytes);
    b.add(dc, dc, r.t);
    b.sub(chans, chans, kBlk);
  });
}

void SlabEmitter::plane_rows(const SlabArgs& a, Scratch& r, const Reg& uu, const Reg& u,
                             const Reg& uend, int64_t step, int64_t pixel, int64_t row_bytes,
                             const std::function<void(const Reg&)>& source, const char* what) {
  KernelBuilder& b = m_b;
  const int64_t rows = round_up(m_g.ws, kBlk);
  Reg sc = b.reg("slab: the plane's first row in x"), dc = b.reg("slab: the plane's first row"),
      chans = b.reg("slab: channels from the plane's first"), pb = b.reg("slab: plane bytes");
  b.mov(uu, u);
  source(a.c1a);
  b.mov(sc, r.src);
  // dc = dst + (u - r0) * Wv * 32
  b.sub(dc, u, a.r0);
  b.mul(dc, dc, wv() * kBlkBytes);
  b.add(dc, dc, a.dst);
  b.mul(chans, a.c1a, kBlk);
  b.sub(chans, a.cvalid, chans);
  b.mul(pb, r.plane, kBlkBytes);
  b.add(r.end, a.c1a, a.ncb);
  b.for_range(r.c, a.c1a, r.end, 1, [&] {
    b.min(r.t, chans, kBlk, "channels in the block");
    b.mov(r.src, sc);
    b.mov(r.d, dc);
    b.for_range(uu, u, uend, step, [&] {
      b.emit(Opcode::op_nd2nz, {m_g.type, r.d, r.src, m_g.ws, r.t, pixel, rows}, what);
      b.add(r.src, r.src, row_bytes);
      b.add(r.d, r.d, step * wv() * kBlkBytes);
    });
    b.add(sc, sc, kBlk * m_isz);
    b.add(dc, dc, pb);
    b.sub(chans, chans, kBlk);
  });
}

bool SlabEmitter::strided_blocks(const Geometry& g) {
  const int64_t field = field_max(isa::FieldKind::RU16);
  const int64_t isz = isa::dtype_size(g.type), wv = (g.ws - 1) * g.up_w + 1 + g.ext_w;
  const int64_t row_blocks = g.x_row * isz / kBlkBytes;
  return g.x_row != 0 && g.cs % kBlk == 0 && (g.x_pixel * isz) % kBlkBytes == 0 &&
         (g.x_row * isz) % kBlkBytes == 0 && row_blocks - 1 <= field && wv - 1 <= field;
}

bool SlabEmitter::strided_columns(const Geometry& g) {
  return strided_blocks(g) && g.ws < ceil_div(g.tm, g.ow);
}

void SlabEmitter::load_strided_columns(const SlabArgs& a, Scratch& r) {
  KernelBuilder& b = m_b;
  // src = x + (img * x_image + r0 * x_row + cbase + c1a * 16) * size: row r0, block c1a
  b.mul(r.src, a.img, m_g.x_image);
  b.mul(r.t, a.r0, m_g.x_row);
  b.add(r.src, r.src, r.t);
  b.add(r.src, r.src, a.cbase);
  b.mul(r.t, a.c1a, kBlk);
  b.add(r.src, r.src, r.t);
  b.mul(r.src, r.src, m_isz);
  b.add(r.src, r.src, a.x);
  b.mov(r.d, a.dst);
  Reg col = b.reg("slab: column"), s = b.reg("slab: the column in x"),
      d = b.reg("slab: the column in the slab"), pb = b.reg("slab: plane bytes");
  Label by_columns = b.label("slab_by_columns"), loaded = b.label("slab_loaded");
  if (!m_g.strided_by_pixel) b.branch(ge(a.h, a.ncb), by_columns);
  {
    // Fewer rows than planes: per pixel, its ncb blocks (contiguous in x) to the planes.
    Reg row = b.reg("slab: row");
    b.sub(pb, r.plane, 1, "plane gap (blocks)");
    b.for_range(row, 0, a.h, 1, [&] {
      b.mov(s, r.src);
      b.mov(d, r.d);
      b.for_range(col, 0, m_g.ws, 1, [&] {
        b.emit(Opcode::op_copy_gm2l1, {d, s, a.ncb, 1, 0, pb},
               "one pixel, all planes (strided view of x)");
        b.add(s, s, m_g.x_pixel * m_isz);
        b.add(d, d, kBlkBytes);
      });
      b.add(r.src, r.src, m_g.x_row * m_isz);
      b.add(r.d, r.d, wv() * kBlkBytes);
    });
    if (m_g.strided_by_pixel) return;
    b.jmp(loaded);
  }
  b.bind(by_columns);
  b.mul(pb, r.plane, kBlkBytes);
  b.add(r.end, a.c1a, a.ncb);
  const int64_t src_gap = m_g.x_row * m_isz / kBlkBytes - 1, dst_gap = wv() - 1;
  b.for_range(r.c, a.c1a, r.end, 1, [&] {
    b.mov(s, r.src);
    b.mov(d, r.d);
    b.for_range(col, 0, m_g.ws, 1, [&] {
      b.emit(Opcode::op_copy_gm2l1, {d, s, a.h, 1, src_gap, dst_gap},
             "one column of one plane: a block per row (strided view of x)");
      b.add(s, s, m_g.x_pixel * m_isz);
      b.add(d, d, kBlkBytes);
    });
    b.add(r.src, r.src, kBlk * m_isz);
    b.add(r.d, r.d, pb);
  });
  b.bind(loaded);
}

// Whole pixels (Geometry::whole_pixels): one nd2nz of the h * ws pixels' channels [16 * c1a, 16 *
// (c1a + ncb)) as a [pixels, channels] matrix whose column blocks are plane * 32 bytes apart
// (dst_rows = the plane's pixels): NHWC rows -> the slab's planes, each pixel's channels one
// contiguous GM run and the slab's rows back to back when they are all the map's channels.
// Else per plane: nd2nz of the h * ws pixels' 16 channels (one 32-byte
// run a pixel; padding rows up to a multiple of 16 spill zeros into the next plane, written
// afterwards), or one nd2nz for all planes where they are whole fractals (planes_at_once).
void SlabEmitter::load_dense(const SlabArgs& a, Scratch& r) {
  KernelBuilder& b = m_b;
  // r.src: GM address of the slab's first pixel's channel 16 * c1a (r.t: 16 * c1a).
  const auto first_channel_address = [&] {
    b.mul(r.src, a.img, m_g.hs);
    b.add(r.src, r.src, a.r0);
    b.mul(r.src, r.src, m_g.ws * m_g.cs);
    b.add(r.src, r.src, a.cbase);
    b.mul(r.t, a.c1a, kBlk);
    b.add(r.src, r.src, r.t);
    b.mul(r.src, r.src, m_isz);
    b.add(r.src, r.src, a.x, "the first pixel's channel 16 * c1a");
  };
  if (m_g.whole_pixels) {
    first_channel_address();
    b.sub(r.t, a.cvalid, r.t);
    b.shl(r.end, a.ncb, 4);
    b.min(r.t, r.t, r.end, "channels of the slab's planes");
    b.emit(Opcode::op_nd2nz, {m_g.type, a.dst, r.src, r.plane, r.t, m_g.cs, r.plane},
           "whole pixels: every plane at once");
    return;
  }
  Reg rows = b.reg("slab: padded pixels");
  b.add(rows, r.plane, kBlk - 1);
  b.shr(rows, rows, 4);
  b.shl(rows, rows, 4);
  first_channel_address();
  Label done;
  if (m_g.planes_at_once) {
    done = b.label("slab_loaded");
    // Planes of whole fractals: nd2nz's column block j (at j * rows * 32 bytes) is plane j,
    // so one nd2nz reads each pixel's min(cvalid - 16 * c1a, 16 * ncb) channels at once.
    Label per_plane = b.label("slab_per_plane");
    b.branch(ne(rows, r.plane), per_plane);
    b.mul(r.t, a.c1a, kBlk);
    b.sub(r.t, a.cvalid, r.t);
    b.shl(r.end, a.ncb, 4);
    b.min(r.t, r.t, r.end, "channels of the slab's planes");
    b.emit(Opcode::op_nd2nz, {m_g.type, a.dst, r.src, r.plane, r.t, m_g.cs, rows},
           "every plane at once");
    b.jmp(done);
    b.bind(per_plane);
  }
  b.mov(r.d, a.dst);
  b.add(r.end, a.c1a, a.ncb);
  b.for_range(r.c, a.c1a, r.end, 1, [&] {
    b.mul(r.t, r.c, kBlk);
    b.sub(r.t, a.cvalid, r.t);
    b.min(r.t, r.t, kBlk, "channels in the block");
    b.emit(Opcode::op_nd2nz, {m_g.type, r.d, r.src, r.plane, r.t, m_g.cs, rows},
           "one 16-channel plane");
    b.add(r.src, r.src, kBlk * m_isz);
    b.mul(r.t, r.plane, kBlkBytes);
    b.add(r.d, r.d, r.t);
  });
  if (m_g.planes_at_once) b.bind(done);
}

// Zero insertion: the slab zeroed, then the stored rows (virtual rows u = srow * up_h in
// [r0, r0 + h)) copied into place: per plane and row with up_w = 1, else per pixel.
void SlabEmitter::load_zero_inserted(const SlabArgs& a, Scratch& r, const Reg& uu) {
  KernelBuilder& b = m_b;
  zero_slab(a.dst, a.x, a.ncb, r.plane, r.t, r.d);
  Reg u = b.reg("slab: first stored row"), uend = b.reg("slab: end row");
  b.add(u, a.r0, m_g.up_h - 1);
  b.div(u, u, m_g.up_h);
  b.mul(u, u, m_g.up_h);
  b.add(uend, a.r0, a.h);
  b.min(uend, uend, (m_g.hs - 1) * m_g.up_h + 1, "stored rows end before the appended ones");
  auto row_source = [&](const Reg& cblock) {
    // src = x + ((img * hs + uu / up_h) * ws * cs + cbase + cblock * 16) * size
    b.div(r.src, uu, m_g.up_h);
    b.mul(r.t, a.img, m_g.hs);
    b.add(r.src, r.src, r.t);
    b.mul(r.src, r.src, m_g.ws * m_g.cs);
    b.add(r.src, r.src, a.cbase);
    b.mul(r.t, cblock, kBlk);
    b.add(r.src, r.src, r.t);
    b.mul(r.src, r.src, m_isz);
    b.add(r.src, r.src, a.x);
  };
  if (m_g.up_w == 1) {
    plane_rows(a, r, uu, u, uend, m_g.up_h, m_g.cs, m_g.ws * m_g.cs * m_isz, row_source,
               "stored row");
    return;
  }
  // Per stored pixel: copy_gm2l1 of its ncb channel blocks, one block per plane. The last
  // block may read past the pixel's channels (into the next pixel or up to 30 bytes past the
  // tensor): those channels are >= cvalid, which load3d never reads.
  Reg gap = b.reg("slab: plane gap");
  b.sub(gap, r.plane, 1);
  b.for_range(uu, u, uend, m_g.up_h, [&] {
    row_source(a.c1a);
    b.sub(r.d, uu, a.r0);
    b.mul(r.d, r.d, wv() * kBlkBytes);
    b.add(r.d, r.d, a.dst);
    b.for_range(r.c, 0, m_g.ws, 1, [&] {
      b.emit(Opcode::op_copy_gm2l1, {r.d, r.src, a.ncb, 1, 0, gap}, "stored pixel, all planes");
      b.add(r.src, r.src, m_g.cs * m_isz);
      b.add(r.d, r.d, m_g.up_w * kBlkBytes);
    });
  });
}

}  // namespace npusim::compiler::ops
