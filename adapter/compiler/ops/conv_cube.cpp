// The cube convolution kernel and the cube img2col kernel (ops/conv.h), the window geometry and
// the family's launch helpers.
//
// Convolution kernel, one block per cube core; block b takes a contiguous range of tiles, tile
// index = ((g * n_tiles + nt) * stacks + stack) * m_tiles + mt, so consecutive tiles of a block
// share their weights. A stack is one image, or with stacking (CubeConvTiling::stack > 1)
// several images placed one above the other with zero rows between them (one tall map whose
// m tiles run across images: small images are not each rounded up to 16 positions). For
// every (tile, k chunk) step, software-pipelined by one step:
//   MTE2  the feature-map slab of the tile (the input rows its output rows need, all columns,
//         the chunk's channel blocks) into L1 buffer step & 1 as NC1HWC0 [c1][rows][W][16]:
//         one nd2nz per channel block (NHWC rows -> one 16-channel plane, padding channels
//         zero); with zero insertion the slab is zeroed first (an nd2nz whose zero-filled
//         padding covers it) and the stored pixels are copied into place (nd2nz per row when
//         up_w = 1, else copy_gm2l1 per pixel over all planes). Streamed weights: the chunk's
//         B in L1 too, one nd2nz per k-block (16 input channels, one tap) straight from the
//         weight layout, so L1 holds B's L0B image (kRowsN) or its fractal transpose (kRowsK).
//   MTE1  per mmad step: load3d (img2col of the slab, the tile's rows, k range) into L0A and one
//         load2d of B into L0B (transposing each fractal for kRowsK);
//   M     mmad into the tile's L0C buffer; FIX after the last chunk: L0C -> y (ND, exact rows
//         and channels, so NHWC outputs with any channel count are written in place; stacked:
//         per image of the tile and 16 channels, dropping the rows between images).
//   Stacked slabs are zeroed first (one nd2nz whose zero padding covers them), then each
//   image's rows are copied into each plane.
//   Resident weights: the whole B of a (group, n tile) in one L1 buffer. The first tile of a
//   block that needs it loads it chunk by chunk, each chunk in the compute step that first
//   reads it (MTE2 -> MTE1 flag), the first chunk after MTE1 has drained the previous weights
//   (MTE1 -> MTE2 flag); blocks change weights rarely since their tiles are contiguous.
// load3d's set_fmatrix takes the paddings as immediates; a tile's slab starts at the first
// input row it needs (top padding only for the first output rows, bottom only for the last),
// so the kernel selects among the few (top, bottom) pairs the tiling produces.
//
// Img2col kernel: tiles of output positions; per tile the slab as above (all channels); per
// tap and channel block a load3d of 16 columns and an mmad by a 16 x 16*rep 0/1 matrix B into
// L0C, one FIXPIPE per tap writing the tap's channels of every position.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "adapter/compiler/ops/cast.h"
#include "adapter/compiler/ops/conv.h"
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

constexpr int64_t kBlk = 16;       // channels per block: C0 of 16-bit types = fractal rows
constexpr int64_t kBlkBytes = 32;  // one channel block of one pixel
constexpr int64_t kMaxTile = 256;  // output tile side limit (as MatMul)
constexpr double kTieBand = 0.005;  // plans this close in modelled cycles count as equal
constexpr int64_t kL0cBytes = 4;


int64_t field_max(isa::FieldKind k) { return static_cast<int64_t>(isa::field_imm_max(k)); }

// L1 bytes of one slab buffer (kc1 planes of slab_rows x wv pixels, one block of room before
// for zeroing and 16 pixels after for spilled zero padding) and of one weight buffer.
int64_t slab_buffer_bytes(int64_t kc1, int64_t slab_rows, int64_t wv) {
  return round_up(kc1 * slab_rows * wv * kBlkBytes + (kBlk + 1) * kBlkBytes, 512);
}
int64_t weight_buffer_bytes(int64_t k, int64_t tn16) { return round_up(k * tn16 * 2, 512); }

// The slab of output positions [m0, m0 + m_act) of one image: input rows [r0, r0 + h) of the
// (virtual) map, with top/bottom paddings ptl/pbl for load3d and the first row of the slab's
// img2col that is the tile's (m_start).
struct SlabGeom {
  int64_t m0, m_act, r0, h, ptl, pbl, m_start;
};

SlabGeom slab_geom(int64_t m0, int64_t m_act, int64_t ow, int64_t hv, int64_t kh, int64_t sh,
                   int64_t dh, int64_t pt) {
  const int64_t oh0 = m0 / ow, oh1 = (m0 + m_act - 1) / ow;
  const int64_t r_start = oh0 * sh - pt, r_end = oh1 * sh - pt + (kh - 1) * dh + 1;
  const int64_t r0 = std::max<int64_t>(0, r_start), r1 = std::min(hv, r_end);
  return SlabGeom{m0, m_act, r0, r1 - r0, r0 - r_start, r_end - r1, m0 - oh0 * ow};
}

// The m tiles of an image of `positions` outputs in tiles of tm.
std::vector<SlabGeom> m_tiles(int64_t positions, int64_t tm, int64_t ow, int64_t hv, int64_t kh,
                              int64_t sh, int64_t dh, int64_t pt) {
  std::vector<SlabGeom> v;
  for (int64_t m0 = 0; m0 < positions; m0 += tm)
    v.push_back(slab_geom(m0, std::min(tm, positions - m0), ow, hv, kh, sh, dh, pt));
  return v;
}

// Stacking (CubeConvTiling): the rows per image `period` (Hv and a gap of zero rows at least the
// window's overhang before an image (pt) and after it, rounded up so that sh divides the
// period), the tall map's rows `ht` (no gap after the last image) and output rows `tall_oh`.
struct StackGeom {
  int64_t period, ht, tall_oh;
};

StackGeom stack_geom(const CubeConvSpec& s, int64_t stack) {
  const int64_t hv = s.hv(), oh = s.oh(), ekh = (s.kh - 1) * s.dh + 1;
  if (stack == 1) return StackGeom{hv, hv, oh};
  const int64_t after = std::max<int64_t>(0, (oh - 1) * s.sh - s.pt + ekh - hv);
  int64_t gap = std::max(s.pt, after);
  gap += (s.sh - (hv + gap) % s.sh) % s.sh;
  const int64_t period = hv + gap;
  return StackGeom{period, stack * period - gap, (stack - 1) * period / s.sh + oh};
}

// Geometry limits of load3d / set_fmatrix / set_l3d_geom (isa.def field widths) and of the
// slab scheme (every tile's slab holds at least one input row).
void check_geometry(const std::string& op, int64_t hv, int64_t wv, int64_t kh, int64_t kw,
                    int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pb,
                    int64_t pl, int64_t pr) {
  auto fail = [&](const std::string& what) {
    throw CompileError(fmt::format("{}: {}", op, what));
  };
  const int64_t u8 = field_max(isa::FieldKind::U8), u4 = field_max(isa::FieldKind::U4);
  const int64_t ru16 = field_max(isa::FieldKind::RU16);
  if (kh > u8 || kw > u8)
    fail(fmt::format("window {}x{} exceeds load3d's {} (set_l3d_geom kh/kw are 8-bit)", kh, kw,
                     u8));
  if (sh > u4 || sw > u4 || dh > u4 || dw > u4)
    fail(fmt::format("strides {}x{} / dilations {}x{} exceed load3d's {} (4-bit fields)", sh, sw,
                     dh, dw, u4));
  if (pt > u8 || pb > u8 || pl > u8 || pr > u8)
    fail(fmt::format("paddings {},{},{},{} exceed set_fmatrix's {}", pt, pb, pl, pr, u8));
  const int64_t ekh = (kh - 1) * dh + 1, ekw = (kw - 1) * dw + 1;
  if (pt >= ekh || pb >= ekh || pl >= ekw || pr >= ekw)
    fail(fmt::format("paddings {},{},{},{} (top, bottom, left, right) must be smaller than the "
                     "dilated window {}x{}",
                     pt, pb, pl, pr, ekh, ekw));
  if (hv + pt + pb < ekh || wv + pl + pr < ekw)
    fail(fmt::format("the dilated window {}x{} does not fit the padded input {}x{}", ekh, ekw,
                     hv + pt + pb, wv + pl + pr));
  if (wv > ru16 || hv > ru16) fail(fmt::format("input {}x{} exceeds {} (set_fmatrix)", hv, wv, ru16));
}

}  // namespace

// ---- window geometry ----

ConvWindow conv_window(const OpDesc& op, int64_t in_h, int64_t in_w, int64_t kh, int64_t kw,
                       bool pooling) {
  const std::string fmt_attr = op.attr_string("data_format", "NHWC");
  if (fmt_attr != "NHWC")
    op.fail(fmt::format("data_format {} is not supported (NHWC only)", fmt_attr));
  auto four = [&](const char* name, bool required) {
    std::vector<int64_t> v = op.attr_ints(name);
    if (v.empty() && !required) return std::vector<int64_t>{1, 1, 1, 1};
    if (v.size() != 4)
      op.invalid(fmt::format("attribute {} must have 4 entries (N, H, W, C), got {}", name,
                             v.size()));
    if (v[0] != 1 || v[3] != 1)
      op.fail(fmt::format("attribute {} = {}: only H and W may differ from 1", name,
                          shape_str(v)));
    for (int64_t x : v)
      if (x < 1) op.invalid(fmt::format("attribute {} = {} must be positive", name, shape_str(v)));
    return v;
  };
  ConvWindow cw;
  const std::vector<int64_t> strides = four("strides", true);
  std::vector<int64_t> dil{1, 1, 1, 1};
  if (pooling) {
    const std::vector<int64_t> ks = four("ksize", true);
    kh = ks[1];
    kw = ks[2];
  } else {
    dil = four("dilations", false);
  }
  cw.padding = op.attr_string("padding", "");
  if (cw.padding != "SAME" && cw.padding != "VALID" && cw.padding != "EXPLICIT")
    op.fail(fmt::format("padding '{}' is not supported (SAME, VALID, EXPLICIT)", cw.padding));
  std::vector<int64_t> ex = op.attr_ints("explicit_paddings");
  if (cw.padding == "EXPLICIT") {
    if (ex.size() != 8)
      op.invalid(fmt::format("explicit_paddings must have 8 entries, got {}", ex.size()));
    if (ex[0] || ex[1] || ex[6] || ex[7])
      op.fail("explicit_paddings on N or C are not supported");
    for (int64_t p : ex)
      if (p < 0) op.invalid("explicit_paddings must be non-negative");
  }
  auto dim = [&](int64_t in, int64_t k, int64_t s, int64_t d, int idx) {
    WindowDim r{in, k, s, d, 0, 0, 0};
    const int64_t ek = r.extent();
    if (cw.padding == "VALID") {
      r.out = in >= ek ? (in - ek) / s + 1 : 0;
    } else if (cw.padding == "SAME") {
      r.out = ceil_div(in, s);
      const int64_t total = std::max<int64_t>((r.out - 1) * s + ek - in, 0);
      r.before = total / 2;
      r.after = total - r.before;
    } else {
      r.before = ex[static_cast<size_t>(2 * idx)];
      r.after = ex[static_cast<size_t>(2 * idx + 1)];
      r.out = in + r.before + r.after >= ek ? (in + r.before + r.after - ek) / s + 1 : 0;
    }
    return r;
  };
  if (kh < 1 || kw < 1) op.invalid(fmt::format("window {}x{} must be at least 1x1", kh, kw));
  cw.h = dim(in_h, kh, strides[1], dil[1], 1);
  cw.w = dim(in_w, kw, strides[2], dil[2], 2);
  return cw;
}

// ---- launch helpers ----

uint64_t workspace_align(uint64_t bytes) { return round_up(bytes, 512); }

ArgRef workspace_take(CompiledKernel& k, uint64_t bytes) {
  ArgRef r{ArgRef::Kind::kWorkspace, 0, k.workspace_bytes};
  k.workspace_bytes += workspace_align(device_buffer_bytes(bytes));
  return r;
}

Launch with_args(Launch l, std::vector<ArgRef> args) {
  l.args = std::move(args);
  return l;
}

void append_strided_copy(CompiledKernel& k, const OpDesc& op, const ArgRef& src,
                         const ArgRef& dst, int64_t rows, int64_t cols, int64_t pitch,
                         DataType from, DataType to, const ChipConfig& cfg) {
  if (rows * cols == 0) return;
  StreamSpec spec = cast_spec(from, to, false, {rows, cols});
  if (pitch != cols && rows > 1) {
    spec.inputs[0].view = BroadcastView{{rows, cols}, {pitch, 1}};
    spec.inputs[0].shape = {rows, pitch};
  }
  Launch l = build_stream_kernel(op.str(), spec, cfg);
  l.summary = fmt::format("{} x {} (pitch {}) {} -> dense {} ({})", rows, cols, pitch,
                          data_type_name(from), data_type_name(to), l.summary);
  k.launches.push_back(with_args(std::move(l), {src, dst}));
}

void append_channel_pad(CompiledKernel& k, const OpDesc& op, const ArgRef& src,
                        const ArgRef& dst, int64_t pixels, int64_t c, int64_t cp, DataType dt,
                        const ChipConfig& cfg) {
  StreamSpec spec = cast_spec(dt, dt, false, {pixels, cp});
  spec.inputs[0].view = BroadcastView{{pixels, cp}, {c, 1}};
  spec.inputs[0].shape = {pixels, c};
  Launch l = build_stream_kernel(op.str(), spec, cfg);
  l.summary = fmt::format("channels {} -> {} ({})", c, cp, l.summary);
  k.launches.push_back(with_args(std::move(l), {src, dst}));
}

// ---- the convolution tiling ----

std::string CubeConvTiling::str() const {
  return fmt::format("tiles {}x{} ({} m x {} n per {}/group, {} tiles over {} blocks of {}), "
                     "k {} per mmad, {} channel blocks per chunk ({} chunk(s){}), slab {} rows "
                     "({} B), B {} B, {} L0C buffer(s), ~{:.0f} cycles",
                     tm, tn, m_tiles, n_tiles,
                     stack == 1 ? std::string("image")
                                : fmt::format("stack of {} images (period {} rows)", stack, period),
                     tiles, block_dim, tiles_per_block, tk0, kc1,
                     chunks, resident ? ", weights resident" : "", slab_rows, slab_bytes,
                     b_bytes, l0c_buffers, est_cycles);
}

CubeConvTiling plan_cube_conv(const CubeConvSpec& s, const ChipConfig& cfg,
                              const std::string& op, int64_t stack) {
  const isa::CoreKind kind = cfg.split ? isa::CoreKind::AIC : isa::CoreKind::AICORE;
  const CoreKindConfig* core = cfg.core_kind(kind);
  if (!core || !core->has(Pipe::M))
    throw CompileError(fmt::format("{}: chip {} has no cube cores", op, cfg.name));
  if (!cfg.has_path(Buf::L0C, Buf::GM))
    throw CompileError(fmt::format("{}: chip {} has no l0c->gm path; convolutions need FIXPIPE "
                                   "to write GM (not supported on coupled chips yet)",
                                   op, cfg.name));
  const int64_t hv = s.hv(), wv = s.wv(), oh = s.oh(), ow = s.ow();
  check_geometry(op, hv, wv, s.kh, s.kw, s.sh, s.sw, s.dh, s.dw, s.pt, s.pb, s.pl, s.pr);
  if (oh < 1 || ow < 1) throw CompileError(fmt::format("{}: empty output", op));
  const int64_t taps = s.kh * s.kw;
  const int64_t c1_in = s.c1_in();
  const int64_t l1 = static_cast<int64_t>(core->capacity(Buf::L1));
  const int64_t l0a = static_cast<int64_t>(core->capacity(Buf::L0A));
  const int64_t l0b = static_cast<int64_t>(core->capacity(Buf::L0B));
  const int64_t l0c = static_cast<int64_t>(core->capacity(Buf::L0C));
  const int64_t bt = static_cast<int64_t>(core->capacity(Buf::BT));
  if (s.bias && (s.groups != 1 || !cfg.has_path(Buf::L1, Buf::BT)))
    throw CompileError(fmt::format("{}: a convolution bias needs groups == 1 and an l1->bt path "
                                   "(groups {}, chip {})",
                                   op, s.groups, cfg.name));
  const int64_t osz = isa::dtype_size(s.out_type);
  const int64_t ru12 = field_max(isa::FieldKind::RU12), ru16 = field_max(isa::FieldKind::RU16);
  const double gm_rate = cfg.path_rate(Buf::GM, Buf::L1);
  // Data read again (a slab once per n tile, streamed weights once per stack of images) comes
  // from L2 after its first read: at the core's L2 read port or its share of L2's bandwidth
  // (docs/chip_model.md), not slower than the GM path.
  double l2_rate = gm_rate;
  if (cfg.l2_read_bytes_per_cycle > 0 && cfg.l2_gbps > 0)
    l2_rate = std::max(gm_rate, std::min(cfg.l2_read_bytes_per_cycle,
                                         cfg.l2_bytes_per_cycle() / core->count));
  const double l0a_rate = cfg.path_rate(Buf::L1, Buf::L0A);
  const double l0b_rate = cfg.path_rate(Buf::L1, Buf::L0B);
  const double fix_rate = cfg.path_rate(Buf::L0C, Buf::GM);
  const double l1_lat = cfg.path_latency(Buf::L1, Buf::L0A);
  const double cube_lat = cfg.cube_latency_cycles;
  // A GM read's latency: the path's start latency and an L2 miss (cold data).
  const double gm_lat = cfg.path_latency(Buf::GM, Buf::L1) + cfg.hbm_latency_cycles;
  // What a step adds beyond its slowest pipe: the hand-overs between pipes, each paying its
  // start latency once (GM -> L1, L1 -> L0A and L0B, the cube's pipeline).
  const double step_overhead = cfg.path_latency(Buf::GM, Buf::L1) + 2 * l1_lat + cube_lat;

  // Output tile widths: powers of two from 16 to 256 and, for each count of n tiles per group,
  // the balanced width (512 channels -> 3 tiles of 176, 176, 160: the cores' work comes in finer
  // steps).
  std::vector<int64_t> tns;
  for (int64_t tn : {16, 32, 64, 128, 256}) {
    if (s.cy < s.groups * s.cg_out) {  // a partial last group: one n tile per group
      if (tn >= s.cg_out && (tn == 16 || tn / 2 < s.cg_out)) tns.push_back(tn);
    } else if (tn == 16 || tn / 2 < round_up(s.cg_out, kBlk)) {
      tns.push_back(tn);
    }
  }
  if (s.cy >= s.groups * s.cg_out) {
    for (int64_t parts = 1; parts <= ceil_div(s.cg_out, kBlk); ++parts) {
      const int64_t tn = round_up(ceil_div(s.cg_out, parts), kBlk);
      if (tn <= kMaxTile && std::find(tns.begin(), tns.end(), tn) == tns.end())
        tns.push_back(tn);
    }
  }
  if (tns.empty())
    throw CompileError(fmt::format("{}: {} output channels per group exceed one {}-wide tile",
                                   op, s.cg_out, kMaxTile));
  std::set<int64_t> kc1s;
  for (int64_t parts = 1; parts <= c1_in; ++parts) kc1s.insert(ceil_div(c1_in, parts));

  // Stackings: one image per map, and (without zero insertion) every count of images whose
  // tall map fits one m tile (at most kMaxTile output positions).
  const bool zero_insertion = s.up_h > 1 || s.up_w > 1 || s.ext_h > 0 || s.ext_w > 0;
  if (s.x_row != 0 && (zero_insertion || stack > 1))
    throw CompileError(fmt::format("{}: a strided view of x takes no zero insertion or stacking",
                                   op));
  std::vector<int64_t> stack_counts;
  if (stack > 0) {
    if (stack > 1 && (zero_insertion || stack > s.images))
      throw CompileError(fmt::format("{}: cannot stack {} images ({} images{})", op, stack,
                                     s.images, zero_insertion ? ", zero insertion" : ""));
    stack_counts.push_back(stack);
  } else {
    stack_counts.push_back(1);
    for (int64_t st = 2; !zero_insertion && s.x_row == 0 && st <= s.images; ++st) {
      if (stack_geom(s, st).tall_oh * ow > kMaxTile) break;
      stack_counts.push_back(st);
    }
  }
  // Every plan that fits, with its modelled cost (est_cycles); chosen below.
  std::vector<CubeConvTiling> plans;
  for (int64_t st : stack_counts) {
    const StackGeom sg = stack_geom(s, st);
    const int64_t positions = sg.tall_oh * ow, stacks = ceil_div(s.images, st);
    const int64_t ht = sg.ht;
    // Output tile heights: every multiple of 16 up to 256, and the balanced height for each count
    // of tiles per image (784 positions -> 7 tiles of 112 rather than 6 of 128 and one of 16).
    std::set<int64_t> tms;
    for (int64_t tm = kBlk; tm <= kMaxTile; tm += kBlk) {
      tms.insert(std::min(tm, round_up(positions, kBlk)));
      tms.insert(round_up(ceil_div(positions, ceil_div(positions, tm)), kBlk));
    }
    // The blocks' tiles: a tile's cost depends on its m tile (rows, slab) and its n tile.
    for (int64_t tm : tms) {
      const std::vector<SlabGeom> mts = m_tiles(positions, tm, ow, ht, s.kh, s.sh, s.dh, s.pt);
      // The planner makes a stack one m tile (stacking serves images smaller than a tile;
      // several m tiles per tall map measured slower than the model predicts, e.g. 11 images
      // of 7x7 in 208-row tiles); a forced stacking may take several.
      if (st > 1 && mts.size() > 1 && stack == 0) continue;
      int64_t slab_rows = 0;
      for (const SlabGeom& g : mts) slab_rows = std::max(slab_rows, g.h);
      if (slab_rows * wv > ru16 - kBlk) continue;  // nd2nz rows / dst_rows
      for (int64_t tn : tns) {
        const int64_t tn16 = round_up(std::min(tn, s.cg_out), kBlk);
        // The bias of a tile: one f32 row per L0 parity in BT, one per L1 parity in L1.
        const int64_t bias_bytes = s.bias ? tn16 * kL0cBytes : 0;
        if (2 * bias_bytes > bt) continue;
        const int l0c_buffers = 2 * tm * tn16 * kL0cBytes <= l0c ? 2
                                : tm * tn16 * kL0cBytes <= l0c ? 1
                                                                : 0;
        if (!l0c_buffers) continue;
        const int64_t n_tiles = ceil_div(s.cg_out, tn);
        for (int64_t kc1 : kc1s) for (bool resident : {true, false}) {
          const int64_t chunks = ceil_div(c1_in, kc1);
          const int64_t kchunk = kc1 * taps * kBlk;
          if (kchunk > ru16) continue;  // load3d k_start
          int64_t tk0 = std::min({l0a / (2 * tm * 2), l0b / (2 * tn16 * 2), kchunk, ru12});
          tk0 = tk0 / kBlk * kBlk;
          if (tk0 < kBlk) continue;
          // A stacked slab is zeroed by one nd2nz (dst_rows: its pixels + 16).
          if (st > 1 && kc1 * slab_rows * wv + kBlk > ru16) continue;
          const int64_t slab_bytes = slab_buffer_bytes(kc1, slab_rows, wv);
          const int64_t k_total = c1_in * taps * kBlk;
          // Resident: one buffer of the whole B of a (group, n tile); streamed: two chunk
          // buffers.
          const int64_t b_bytes = weight_buffer_bytes(resident ? k_total : kchunk, tn16);
          const int64_t l1_need = 2 * slab_bytes + (resident ? 1 : 2) * b_bytes + 2 * bias_bytes;
          if (l1_need > l1) continue;
          // Cost of each tile (cycles, see docs/compiler.md): the slowest of cube (+ FIXPIPE
          // with one L0C buffer), MTE2 (slab + streamed weights, or resident weights arriving
          // chunk by chunk during the first tile of a (group, n tile)), MTE1, FIXPIPE.
          // Per step (one chunk of one tile): the slowest of cube, MTE2 (the chunk's slab and
          // weights, plus the GM latency: a step's data must land within the previous step, the
          // buffers being double), MTE1 and the scalar unit (~60 instructions per mmad step and
          // ~200 per step, one cycle each, ~14 per plane and image of a stacked slab and ~15
          // per k-block of weights loaded);
          // FIXPIPE once per tile, hidden behind the next tile's steps with two L0C buffers.
          const int64_t steps_mmad = ceil_div(kchunk, tk0);
          auto tile_cost = [&](const SlabGeom& g, int64_t n_act, bool first) {
            const double n16 = static_cast<double>(ceil_div(n_act, cfg.cube_n));
            const double cube = static_cast<double>(steps_mmad) * cube_lat +
                                static_cast<double>(ceil_div(g.m_act, cfg.cube_m)) * n16 *
                                    static_cast<double>(kchunk / cfg.cube_k);
            const double fix = static_cast<double>(g.m_act * n_act * osz) / fix_rate;
            double load = static_cast<double>(kc1 * g.h * wv * kBlkBytes) / l2_rate + gm_lat;
            if (!resident || first)
              load += static_cast<double>(kchunk * round_up(n_act, kBlk) * 2) / l2_rate;
            const double mte1 =
                static_cast<double>(round_up(g.m_act, kBlk) * kchunk * 2) / l0a_rate +
                static_cast<double>(kchunk * round_up(n_act, kBlk) * 2) / l0b_rate +
                2.0 * static_cast<double>(steps_mmad) * l1_lat;
            const double scalar = 200.0 + 60.0 * static_cast<double>(steps_mmad) +
                                  (st > 1 ? 14.0 * static_cast<double>(kc1 * st) : 0.0) +
                                  (!resident ? 15.0 * static_cast<double>(kc1 * taps) : 0.0);
            // MTE2 instructions of the step: an nd2nz per plane (per plane and image when
            // stacked, and the zeroing), one per k-block of weights loaded. Past the issue
            // queue's depth the scalar unit waits for MTE2 to drain them, holding back the
            // step's other instructions.
            const double mte2_insns =
                static_cast<double>(kc1 * st + (st > 1 ? 1 : 0) + (!resident ? kc1 * taps : 0));
            const double queue_wait =
                std::max(0.0, mte2_insns - cfg.issue_queue_depth) * load / mte2_insns;
            const double step =
                std::max({cube, load, mte1, scalar}) + step_overhead + queue_wait;
            return static_cast<double>(chunks) * step + (l0c_buffers == 1 ? fix : 0) +
                   std::max(0.0, fix - static_cast<double>(chunks) * step);
          };
          const int64_t tiles = s.groups * n_tiles * stacks * static_cast<int64_t>(mts.size());
          const int64_t blocks0 = std::min<int64_t>(core->count, tiles);
          const int64_t per = ceil_div(tiles, blocks0);
          const int64_t blocks = ceil_div(tiles, per);
          // The busiest block, exactly: tile t has m tile t % MT and weight key
          // t / (MT * stacks); within one key the costs repeat with period MT (prefix sums), and
          // the first tile of each key in a block also loads the weights.
          const int64_t mt_count = static_cast<int64_t>(mts.size()), per_key = mt_count * stacks;
          const int64_t n_last = s.cg_out - (n_tiles - 1) * tn;
          std::vector<double> pre_full(static_cast<size_t>(mt_count) + 1, 0), pre_last = pre_full;
          for (int64_t i = 0; i < mt_count; ++i) {
            pre_full[static_cast<size_t>(i + 1)] =
                pre_full[static_cast<size_t>(i)] +
                tile_cost(mts[static_cast<size_t>(i)], tn, false);
            pre_last[static_cast<size_t>(i + 1)] =
                pre_last[static_cast<size_t>(i)] +
                tile_cost(mts[static_cast<size_t>(i)], n_last, false);
          }
          auto prefix = [&](const std::vector<double>& p, int64_t x) {  // tiles [0, x) of a key
            return static_cast<double>(x / mt_count) * p.back() +
                   p[static_cast<size_t>(x % mt_count)];
          };
          double worst = 0;
          for (int64_t b = 0; b < blocks; ++b) {
            double c = 0;
            for (int64_t t = b * per, hi = std::min(tiles, (b + 1) * per); t < hi;) {
              const int64_t key = t / per_key, end = std::min(hi, (key + 1) * per_key);
              const int64_t n_act = key % n_tiles == n_tiles - 1 ? n_last : tn;
              const std::vector<double>& p = n_act == tn ? pre_full : pre_last;
              c += prefix(p, end - key * per_key) - prefix(p, t - key * per_key);
              const SlabGeom& g = mts[static_cast<size_t>(t % mt_count)];
              c += tile_cost(g, n_act, true) - tile_cost(g, n_act, false);
              if (resident)  // the first chunk's weights are not overlapped
                c += static_cast<double>(kchunk * round_up(n_act, kBlk) * 2) / l2_rate + gm_lat;
              t = end;
            }
            if (!resident) {  // the block's first step waits for its slab and weights, cold
              const SlabGeom& g = mts[static_cast<size_t>((b * per) % mt_count)];
              c += static_cast<double>(kc1 * g.h * wv * kBlkBytes +
                                       kchunk * round_up(tn, kBlk) * 2) /
                       gm_rate +
                   gm_lat;
            }
            worst = std::max(worst, c);
          }
          CubeConvTiling& plan = plans.emplace_back();
          plan.stack = st;
          plan.period = sg.period;
          plan.stacks = stacks;
          plan.tall_oh = sg.tall_oh;
          plan.tm = tm;
          plan.tn = tn;
          plan.tk0 = tk0;
          plan.kc1 = kc1;
          plan.chunks = chunks;
          plan.resident = resident;
          plan.m_tiles = static_cast<int64_t>(mts.size());
          plan.n_tiles = n_tiles;
          plan.tiles = tiles;
          plan.slab_rows = slab_rows;
          plan.slab_bytes = slab_bytes;
          plan.b_bytes = b_bytes;
          plan.l0c_buffers = l0c_buffers;
          plan.block_dim = static_cast<int>(blocks);
          plan.tiles_per_block = per;
          plan.est_cycles = worst;
        }
      }
    }
  }

  // Among the plans within kTieBand of the lowest modelled cost (the model cannot tell them
  // apart: it is tens of per cent off either way, docs/compiler.md): the largest tile (tm * tn:
  // the least data read again per output), then the largest chunk, then resident weights, then
  // the lowest cost.
  double lowest = std::numeric_limits<double>::infinity();
  for (const CubeConvTiling& p : plans) lowest = std::min(lowest, p.est_cycles);
  CubeConvTiling best;
  for (const CubeConvTiling& p : plans) {
    if (p.est_cycles > lowest * (1 + kTieBand)) continue;
    if (best.tm == 0 ||
        std::make_tuple(p.tm * p.tn, p.kc1, p.resident, -p.est_cycles) >
            std::make_tuple(best.tm * best.tn, best.kc1, best.resident, -best.est_cycles))
      best = p;
  }
  if (best.tm == 0)
    throw CompileError(fmt::format(
        "{}: no convolution tile fits the cube core of chip {} (L1 {} B, L0A {} B, L0B {} B, "
        "L0C {} B; the smallest needs a 16-position slab of {} rows x {} columns x 16 channels "
        "and 16x16 outputs, double-buffered)",
        op, cfg.name, l1, l0a, l0b, l0c,
        m_tiles(oh * ow, kBlk, ow, hv, s.kh, s.sh, s.dh, s.pt).front().h, wv));
  return best;
}


CubeConvTiling rechunk_cube_conv(const CubeConvSpec& s, CubeConvTiling t, int64_t kc1,
                                 bool resident, const ChipConfig& cfg, const std::string& op) {
  const CoreKindConfig& core = *cfg.core_kind(cfg.split ? isa::CoreKind::AIC : isa::CoreKind::AICORE);
  const int64_t taps = s.kh * s.kw, tn16 = round_up(std::min(t.tn, s.cg_out), kBlk);
  t.kc1 = kc1;
  t.chunks = ceil_div(s.c1_in(), kc1);
  t.resident = resident;
  t.slab_bytes = slab_buffer_bytes(kc1, t.slab_rows, s.wv());
  t.b_bytes = weight_buffer_bytes((resident ? s.c1_in() : kc1) * taps * kBlk, tn16);
  t.tk0 = std::min(t.tk0, kc1 * taps * kBlk);
  if (2 * t.slab_bytes + (resident ? 1 : 2) * t.b_bytes >
      static_cast<int64_t>(core.capacity(Buf::L1)))
    throw CompileError(fmt::format("{}: tiling {} does not fit L1", op, t.str()));
  return t;
}

namespace {

void round16(KernelBuilder& b, const Reg& d, const Reg& x) {
  b.add(d, x, kBlk - 1);
  b.shr(d, d, 4);
  b.shl(d, d, 4);
}

// What the convolution and img2col kernels share: the slab geometry at run time, loading a
// slab into L1, and set_fmatrix for a slab.
class SlabEmitter {
 public:
  struct Geometry {
    Dtype type = Dtype::F16;
    int64_t images = 1, hs = 1, ws = 1, cs = 1, up_h = 1, up_w = 1, ext_h = 0, ext_w = 0;
    int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pb = 0, pl = 0, pr = 0;
    int64_t oh = 1, ow = 1, tm = 16;  // oh: output rows of the (tall) map
    int64_t stack = 1, period = 0;     // images per tall map, rows per image (CubeConvTiling)
    int64_t x_pixel = 0, x_row = 0, x_image = 0;  // CubeConvSpec's strided view of x
  };

  SlabEmitter(KernelBuilder& b, const Geometry& g)
      : m_b(b), m_g(g), m_isz(isa::dtype_size(g.type)) {
    for (const SlabGeom& t : m_tiles(g.oh * g.ow, g.tm, g.ow, hv(), g.kh, g.sh, g.dh, g.pt))
      m_pads.insert({t.ptl, t.pbl});
  }

  // Rows of one image's (virtual) map and of the map the tiles cover (tall when stacked).
  int64_t image_hv() const { return (m_g.hs - 1) * m_g.up_h + 1 + m_g.ext_h; }
  int64_t hv() const {
    return m_g.stack == 1 ? image_hv() : m_g.stack * m_g.period - (m_g.period - image_hv());
  }
  int64_t wv() const { return (m_g.ws - 1) * m_g.up_w + 1 + m_g.ext_w; }
  int64_t ekh() const { return (m_g.kh - 1) * m_g.dh + 1; }
  bool zero_insertion() const {
    return m_g.up_h > 1 || m_g.up_w > 1 || m_g.ext_h > 0 || m_g.ext_w > 0;
  }
  int64_t isz() const { return m_isz; }

  // From the m tile index mt: its first position m0 and positions m_act.
  void tile_positions(const Reg& mt, const Reg& m0, const Reg& m_act) {
    m_b.mul(m0, mt, m_g.tm, "first output position of the tile");
    m_b.movi(m_act, m_g.oh * m_g.ow);
    m_b.sub(m_act, m_act, m0);
    m_b.min(m_act, m_act, m_g.tm, "positions in the tile");
  }

  // The tile's slab (slab_geom): first row r0 and rows h.
  void slab_rows(const Reg& m0, const Reg& m_act, const Reg& r0, const Reg& h) {
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
  // paddings are immediates, so branch to the instruction for the tile's pair.
  void set_fmatrix(const Reg& m0, const Reg& m_act, const Reg& h) {
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

  // MTE2: channel blocks [c1a, c1a + ncb) (counted from channel cbase of the map) of image img
  // (stacked: of the tall map whose first image is img), rows [r0, r0 + h), into L1 at dst as
  // [ncb][h][Wv][16]; channels >= cvalid (counted from cbase) are zero. The slab's last plane
  // may be followed by up to 15 pixels of zeros, and with zero insertion or stacking the 32
  // bytes before dst are written too (see plan_cube_conv's sizes).
  void load_slab(const Reg& dst, const Reg& x, const Reg& img, const Reg& r0, const Reg& h,
                 const Reg& cbase, const Reg& c1a, const Reg& ncb, const Reg& cvalid) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "slab: NHWC rows -> 16-channel planes in L1");
    Reg plane = b.reg("slab: pixels per plane");
    b.mul(plane, h, wv());
    Reg src = b.reg("slab: source"), c = b.reg("slab: channel block"),
        t = b.reg("slab: temp"), d = b.reg("slab: destination"), end = b.reg("slab: end");
    if (m_g.stack > 1) {
      zero_slab(dst, x, ncb, plane, t, d);
      // Per plane, per image j of the stack (unrolled): its rows [j * period, j * period + Hv)
      // within the slab, one nd2nz (padding to 16 pixels spills zeros into pixels written
      // afterwards: the gap, the next image's rows or the next plane). Images past the last
      // one stay zero.
      Reg sc = b.reg("slab: the plane's source (image img, row 0)"), dc = b.reg("slab: plane"),
          u0 = b.reg("slab: first row of the image"), u1 = b.reg("slab: end row of the image"),
          chans = b.reg("slab: channels from the plane's first");
      b.mul(sc, img, m_g.hs * m_g.ws * m_g.cs);
      b.add(sc, sc, cbase);
      b.mul(t, c1a, kBlk);
      b.add(sc, sc, t);
      b.mul(sc, sc, m_isz);
      b.add(sc, sc, x);
      b.mov(dc, dst);
      b.mul(chans, c1a, kBlk);
      b.sub(chans, cvalid, chans);
      b.add(end, c1a, ncb);
      b.for_range(c, c1a, end, 1, [&] {
        Label planed = b.label("slab_plane_done");
        for (int64_t j = 0; j < m_g.stack; ++j) {
          const int64_t top = j * m_g.period;
          Label skip = b.label("slab_image_skipped");
          if (j > 0) b.branch(ge(img, m_g.images - j), planed);  // no image j
          b.movi(u0, top);
          b.max(u0, u0, r0, "first row of the image in the slab");
          b.add(u1, r0, h);
          b.min(u1, u1, top + m_g.hs, "end row of the image in the slab");
          b.branch(ge(u0, u1), skip);
          // src = sc + (u0 + j * (hs - period)) * ws * cs * size (row u0 - top of image j)
          b.add(src, u0, j * (m_g.hs - m_g.period));
          b.mul(src, src, m_g.ws * m_g.cs * m_isz);
          b.add(src, src, sc);
          b.sub(d, u0, r0);
          b.mul(d, d, wv() * kBlkBytes);
          b.add(d, d, dc);
          b.sub(u1, u1, u0);
          b.mul(u1, u1, m_g.ws, "pixels");
          round16(b, u0, u1);
          b.min(t, chans, kBlk, "channels in the block");
          b.emit(Opcode::op_nd2nz, {m_g.type, d, src, u1, t, m_g.cs, u0},
                 "the image's rows of one plane");
          b.bind(skip);
        }
        b.bind(planed);
        b.add(sc, sc, kBlk * m_isz);
        b.mul(t, plane, kBlkBytes);
        b.add(dc, dc, t);
        b.sub(chans, chans, kBlk);
      });
      return;
    }
    Reg uu = b.reg("slab: row");
    // Per plane, per slab row uu in [u, uend) by `step`: an nd2nz of the row's ws pixels,
    // `pixel` elements apart, from source(c) (x's address of the row's block c). Its padding to
    // 16 pixels spills zeros into the following pixels: rows written afterwards (rows and
    // planes go in order), zero rows, or past the last plane.
    auto plane_rows = [&](const Reg& u, const Reg& uend, int64_t step, int64_t pixel,
                          const std::function<void(const Reg&)>& source, const char* what) {
      const int64_t rows = round_up(m_g.ws, kBlk);
      b.add(end, c1a, ncb);
      b.for_range(c, c1a, end, 1, [&] {
        b.for_range(uu, u, uend, step, [&] {
          source(c);
          // d = dst + ((c - c1a) * plane + (uu - r0) * Wv) * 32
          b.sub(d, c, c1a);
          b.mul(d, d, plane);
          b.sub(t, uu, r0);
          b.mul(t, t, wv());
          b.add(d, d, t);
          b.mul(d, d, kBlkBytes);
          b.add(d, d, dst);
          b.mul(t, c, kBlk);
          b.sub(t, cvalid, t);
          b.min(t, t, kBlk, "channels in the block");
          b.emit(Opcode::op_nd2nz, {m_g.type, d, src, m_g.ws, t, pixel, rows}, what);
        });
      });
    };
    if (m_g.x_row != 0) {
      // x with its own strides (CubeConvSpec::x_pixel...): every slab row, pixels x_pixel
      // apart (the nd2nz rows may overlap in GM).
      Reg uend = b.reg("slab: end row");
      b.add(uend, r0, h);
      plane_rows(r0, uend, 1, m_g.x_pixel, [&](const Reg& cblock) {
        // src = x + (img * x_image + uu * x_row + cbase + cblock * 16) * size
        b.mul(src, img, m_g.x_image);
        b.mul(t, uu, m_g.x_row);
        b.add(src, src, t);
        b.add(src, src, cbase);
        b.mul(t, cblock, kBlk);
        b.add(src, src, t);
        b.mul(src, src, m_isz);
        b.add(src, src, x);
      }, "one row of one plane (strided view of x)");
      return;
    }
    if (!zero_insertion()) {
      // Per plane: nd2nz of the h * ws pixels (padding rows up to a multiple of 16 spill zeros
      // into the next plane, which is written afterwards).
      Reg rows = b.reg("slab: padded pixels");
      b.add(rows, plane, kBlk - 1);
      b.shr(rows, rows, 4);
      b.shl(rows, rows, 4);
      b.mul(src, img, m_g.hs);
      b.add(src, src, r0);
      b.mul(src, src, m_g.ws * m_g.cs);
      b.add(src, src, cbase);
      b.mul(t, c1a, kBlk);
      b.add(src, src, t);
      b.mul(src, src, m_isz);
      b.add(src, src, x, "source of the first block");
      b.mov(d, dst);
      b.add(end, c1a, ncb);
      b.for_range(c, c1a, end, 1, [&] {
        b.mul(t, c, kBlk);
        b.sub(t, cvalid, t);
        b.min(t, t, kBlk, "channels in the block");
        b.emit(Opcode::op_nd2nz, {m_g.type, d, src, plane, t, m_g.cs, rows},
               "one 16-channel plane");
        b.add(src, src, kBlk * m_isz);
        b.mul(t, plane, kBlkBytes);
        b.add(d, d, t);
      });
      return;
    }
    zero_slab(dst, x, ncb, plane, t, d);
    // Stored rows: virtual rows u = srow * up_h in [r0, r0 + h).
    Reg u = b.reg("slab: first stored row"), uend = b.reg("slab: end row");
    b.add(u, r0, m_g.up_h - 1);
    b.div(u, u, m_g.up_h);
    b.mul(u, u, m_g.up_h);
    b.add(uend, r0, h);
    b.min(uend, uend, (m_g.hs - 1) * m_g.up_h + 1, "stored rows end before the appended ones");
    auto row_source = [&](const Reg& cblock) {
      // src = x + ((img * hs + uu / up_h) * ws * cs + cbase + cblock * 16) * size
      b.div(src, uu, m_g.up_h);
      b.mul(t, img, m_g.hs);
      b.add(src, src, t);
      b.mul(src, src, m_g.ws * m_g.cs);
      b.add(src, src, cbase);
      b.mul(t, cblock, kBlk);
      b.add(src, src, t);
      b.mul(src, src, m_isz);
      b.add(src, src, x);
    };
    if (m_g.up_w == 1) {  // per plane, per stored row
      plane_rows(u, uend, m_g.up_h, m_g.cs, row_source, "stored row");
      return;
    }
    // Per stored pixel: copy_gm2l1 of its ncb channel blocks, one block per plane. The last
    // block may read past the pixel's channels (into the next pixel or up to 30 bytes past the
    // tensor): those channels are >= cvalid, which load3d never reads.
    Reg gap = b.reg("slab: plane gap");
    b.sub(gap, plane, 1);
    b.for_range(uu, u, uend, m_g.up_h, [&] {
      row_source(c1a);
      b.sub(d, uu, r0);
      b.mul(d, d, wv() * kBlkBytes);
      b.add(d, d, dst);
      b.for_range(c, 0, m_g.ws, 1, [&] {
        b.emit(Opcode::op_copy_gm2l1, {d, src, ncb, 1, 0, gap}, "stored pixel, all planes");
        b.add(src, src, m_g.cs * m_isz);
        b.add(d, d, m_g.up_w * kBlkBytes);
      });
    });
  }

 private:
  // Zeroes the slab's planes: an nd2nz of one element to the block before dst, whose
  // zero-filled padding rows cover [dst, dst + (ncb * plane + 15) * 32). t, d: scratch.
  void zero_slab(const Reg& dst, const Reg& x, const Reg& ncb, const Reg& plane, const Reg& t,
                 const Reg& d) {
    KernelBuilder& b = m_b;
    b.mul(t, ncb, plane);
    b.add(t, t, kBlk);
    b.shr(t, t, 4);
    b.shl(t, t, 4);
    b.sub(d, dst, kBlkBytes);
    b.emit(Opcode::op_nd2nz, {m_g.type, d, x, 1, 1, 1, t}, "zero the slab");
  }

  KernelBuilder& m_b;
  Geometry m_g;
  int64_t m_isz;
  std::set<std::pair<int64_t, int64_t>> m_pads;  // (top, bottom) slab paddings of the m tiles
};

// d = base[0] + parity * (base[1] - base[0])
void select(KernelBuilder& b, const Reg& d, const Reg& parity, const uint64_t base[2]) {
  b.mul(d, parity, static_cast<int64_t>(base[1] - base[0]));
  b.add(d, d, static_cast<int64_t>(base[0]));
}

SlabEmitter::Geometry slab_geometry(const CubeConvSpec& s, const CubeConvTiling& t) {
  SlabEmitter::Geometry g;
  g.type = s.in_type;
  g.images = s.images;
  g.hs = s.hs;
  g.ws = s.ws;
  g.cs = s.cs;
  g.up_h = s.up_h;
  g.up_w = s.up_w;
  g.ext_h = s.ext_h;
  g.ext_w = s.ext_w;
  g.kh = s.kh;
  g.kw = s.kw;
  g.sh = s.sh;
  g.sw = s.sw;
  g.dh = s.dh;
  g.dw = s.dw;
  g.pt = s.pt;
  g.pb = s.pb;
  g.pl = s.pl;
  g.pr = s.pr;
  g.oh = t.tall_oh;
  g.ow = s.ow();
  g.tm = t.tm;
  g.stack = t.stack;
  g.period = t.period;
  g.x_pixel = s.x_pixel;
  g.x_row = s.x_row;
  g.x_image = s.x_image;
  return g;
}

// The convolution kernel of a tiling (see the file comment).
class ConvEmitter {
 public:
  ConvEmitter(const CubeConvSpec& s, const CubeConvTiling& t, const ChipConfig& cfg,
              const std::string& op)
      : m_s(s),
        m_t(t),
        m_b(s.name.empty() ? fmt::format("Conv_{}_{}", isa::dtype_name(s.in_type),
                                         isa::dtype_name(s.out_type))
                           : s.name,
            op, cfg),
        m_slab(m_b, slab_geometry(s, t)),
        m_isz(isa::dtype_size(s.in_type)),
        m_osz(isa::dtype_size(s.out_type)),
        m_taps(s.kh * s.kw) {}

  BuiltKernel emit() {
    KernelBuilder& b = m_b;
    b.begin_section(b.cube_core_kind());
    allocate();
    b.declare_arg("x", m_s.in_type, {m_s.images, m_s.hs, m_s.ws, m_s.cs});
    b.declare_arg("w", m_s.in_type, {});
    b.declare_arg("y", m_s.out_type, {m_s.images, m_s.oh(), m_s.ow(), m_s.cy});
    if (m_s.bias) b.declare_arg("bias", Dtype::F32, {m_s.cy});
    b.emit(Opcode::op_set_l3d_geom, {m_s.kh, m_s.kw, m_s.sh, m_s.sw, m_s.dh, m_s.dw},
           "window geometry (fixed)");
    Reg steps = b.reg("steps of this block: tiles x chunks");
    Reg tbeg = b.reg("first tile of this block");
    m_tbeg = &tbeg;
    {
      KernelBuilder::Origin o(b, fmt::format("my tiles: [block * {0}, min({1}, block * {0} + {0}))",
                                             m_t.tiles_per_block, m_t.tiles));
      b.emit(Opcode::op_get_block_id, {tbeg});
      b.mul(tbeg, tbeg, m_t.tiles_per_block);
      b.movi(steps, m_t.tiles);
      b.sub(steps, steps, tbeg);
      b.min(steps, steps, m_t.tiles_per_block);
      b.mul(steps, steps, m_t.chunks);
    }
    m_l1_full = b.flag_pair(Pipe::MTE2, Pipe::MTE1, "L1 slab loaded");
    m_l1_free = b.flag_pair(Pipe::MTE1, Pipe::MTE2, "L1 slab free");
    m_l0_full = b.flag_pair(Pipe::MTE1, Pipe::M, "L0 step loaded");
    m_l0_free = b.flag_pair(Pipe::M, Pipe::MTE1, "L0 step free");
    m_l0c_full = b.flag_pair(Pipe::M, Pipe::FIX, "L0C tile computed");
    m_l0c_free = b.flag_pair(Pipe::FIX, Pipe::M, "L0C tile stored");
    if (resident()) {
      m_b_drained = b.flag(Pipe::MTE1, Pipe::MTE2, "weights no longer read");
      m_b_loaded = b.flag(Pipe::MTE2, Pipe::MTE1, "weights loaded");
    }
    {
      KernelBuilder::Origin o(b, "all buffers start free");
      for (int q = 0; q < 2; ++q) {
        b.set_flag(m_l1_free, q);
        b.set_flag(m_l0_free, q);
        if (q < m_t.l0c_buffers) b.set_flag(m_l0c_free, q);
      }
    }
    Reg l0_steps = b.reg_imm("L0 steps so far (parity of the L0 buffers)", 0);
    m_l0_steps = &l0_steps;
    Reg prev_key = b.reg_imm("resident weights: 2 * (group * n_tiles + n tile) + loading "
                             "(-2: none)",
                             -2);
    m_prev_key = &prev_key;
    b.pipelined_steps(steps, [&](const Reg& t) { load_step(t); },
                      [&](const Reg& s) { compute_step(s); });
    {
      KernelBuilder::Origin o(b, "drain: consume the free flags");
      for (int q = 0; q < 2; ++q) {
        b.wait_flag(m_l1_free, q);
        b.wait_flag(m_l0_free, q);
        if (q < m_t.l0c_buffers) b.wait_flag(m_l0c_free, q);
      }
    }
    b.end();
    return b.finish();
  }

 private:
  bool resident() const { return m_t.resident; }

  void allocate() {
    for (int q = 0; q < 2; ++q) {
      // A slab buffer: one block of room before (zeroing) and 16 pixels after (spill).
      m_slab_buf[q] = m_b.alloc(Buf::L1, static_cast<uint64_t>(m_t.slab_bytes),
                                fmt::format("slab {}", q)) + kBlkBytes;
    }
    for (int q = 0; q < (resident() ? 1 : 2); ++q)
      m_bbuf[q] = m_b.alloc(Buf::L1, static_cast<uint64_t>(m_t.b_bytes),
                            fmt::format("weights {}", q));
    if (resident()) m_bbuf[1] = m_bbuf[0];
    const int64_t tn16 = round_up(std::min(m_t.tn, m_s.cg_out), kBlk);
    for (int q = 0; q < 2; ++q) {
      m_l0a[q] = m_b.alloc(Buf::L0A, static_cast<uint64_t>(m_t.tm * m_t.tk0 * m_isz),
                           fmt::format("A step {}", q));
      m_l0b[q] = m_b.alloc(Buf::L0B, static_cast<uint64_t>(m_t.tk0 * tn16 * m_isz),
                           fmt::format("B step {}", q));
    }
    for (int q = 0; q < m_t.l0c_buffers; ++q)
      m_l0c[q] = m_b.alloc(Buf::L0C, static_cast<uint64_t>(m_t.tm * tn16 * kL0cBytes),
                           fmt::format("C tile {}", q));
    if (m_t.l0c_buffers == 1) m_l0c[1] = m_l0c[0];
    if (m_s.bias)
      for (int q = 0; q < 2; ++q) {
        const uint64_t bytes = static_cast<uint64_t>(tn16 * kL0cBytes);
        m_bias_l1[q] = m_b.alloc(Buf::L1, bytes, fmt::format("bias {} (L1 parity)", q));
        m_bias_bt[q] = m_b.alloc(Buf::BT, bytes, fmt::format("bias {} (L0 parity)", q));
      }
  }

  bool stacked() const { return m_t.stack > 1; }

  // Step s -> chunk ch, m tile mt, image img (stacked: the stack's first image), weight key
  // (group * n_tiles + n tile).
  void decompose(const Reg& s, const Reg& ch, const Reg& mt, const Reg& img, const Reg& key) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "step -> tile (group, n tile, stack, m tile) and chunk");
    b.rem(ch, s, m_t.chunks);
    b.div(key, s, m_t.chunks);
    b.add(key, key, *m_tbeg, "tile");
    b.rem(mt, key, m_t.m_tiles);
    b.div(key, key, m_t.m_tiles);
    b.rem(img, key, m_t.stacks);
    b.div(key, key, m_t.stacks);
    if (stacked()) b.mul(img, img, m_t.stack, "first image of the stack");
  }

  // Group values of key: the channel base cbase = g * cg_in and the group's valid input
  // channels cvalid; n0 (group-relative first output channel) and n_act.
  void group_channels(const Reg& key, const Reg& cbase, const Reg& cvalid) {
    KernelBuilder& b = m_b;
    b.div(cbase, key, m_t.n_tiles);
    b.mul(cbase, cbase, m_s.cg_in, "first input channel of the group");
    b.movi(cvalid, m_s.cs);
    b.sub(cvalid, cvalid, cbase);
    b.min(cvalid, cvalid, m_s.cg_in, "input channels of the group");
  }
  void n_range(const Reg& key, const Reg& n0, const Reg& n_act) {
    KernelBuilder& b = m_b;
    // n_act = min(tn, min(cg_out, cy - g * cg_out) - n0)
    b.div(n_act, key, m_t.n_tiles);
    b.mul(n_act, n_act, m_s.cg_out);
    b.movi(n0, m_s.cy);
    b.sub(n_act, n0, n_act);
    b.min(n_act, n_act, m_s.cg_out, "output channels of the group");
    b.rem(n0, key, m_t.n_tiles);
    b.mul(n0, n0, m_t.tn, "first output channel (in the group)");
    b.sub(n_act, n_act, n0);
    b.min(n_act, n_act, m_t.tn, "output channels of the tile");
  }
  // The chunk's channel blocks: c1a = ch * kc1, ncb = clamp(ceil(cvalid/16) - c1a, 0, kc1).
  void chunk_blocks(const Reg& ch, const Reg& cvalid, const Reg& c1a, const Reg& ncb) {
    KernelBuilder& b = m_b;
    b.mul(c1a, ch, m_t.kc1, "first channel block of the chunk");
    b.add(ncb, cvalid, kBlk - 1);
    b.shr(ncb, ncb, 4);
    b.sub(ncb, ncb, c1a);
    b.min(ncb, ncb, m_t.kc1);
    b.max(ncb, ncb, 0, "channel blocks in the chunk");
  }

  // MTE2: the slab (and chunked weights) of step s into L1 buffer s & 1.
  void load_step(const Reg& s) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "load: slab (and weights) into L1");
    Reg ch = b.reg("load: chunk"), img = b.reg("load: image"), key = b.reg("load: weight key");
    Reg r0 = b.reg("load: first row"), h = b.reg("load: rows");
    {
      Reg mt = b.reg("load: m tile");
      decompose(s, ch, mt, img, key);
      Reg m0 = b.reg("load: m0"), m_act = b.reg("load: positions");
      m_slab.tile_positions(mt, m0, m_act);
      m_slab.slab_rows(m0, m_act, r0, h);
    }
    Reg p = b.reg("load: L1 parity");
    b.and_(p, s, 1);
    b.wait_flag(m_l1_free, p, "L1 buffers free");
    Reg cbase = b.reg("load: group channel base"), cvalid = b.reg("load: group channels");
    group_channels(key, cbase, cvalid);
    Reg c1a = b.reg("load: first block"), ncb = b.reg("load: blocks");
    chunk_blocks(ch, cvalid, c1a, ncb);
    {
      Reg dst = b.reg("load: slab address"), x = b.load_arg("x");
      select(b, dst, p, m_slab_buf);
      m_slab.load_slab(dst, x, img, r0, h, cbase, c1a, ncb, cvalid);
    }
    if (m_s.bias) {
      b.if_(eq(ch, 0), [&] {
        KernelBuilder::Origin r(b, "bias of the tile's channels (its first chunk)");
        Reg dst = b.reg("load: bias address"), src = b.reg("load: bias source"),
            blocks = b.reg("load: bias blocks");
        select(b, dst, p, m_bias_l1);
        n_range(key, src, blocks);
        b.add(blocks, blocks, 7);
        b.shr(blocks, blocks, 3, "32-byte blocks of n_act f32");
        b.mul(src, src, kL0cBytes);
        Reg bias = b.load_arg("bias");
        b.add(src, src, bias);
        b.emit(Opcode::op_copy_gm2l1, {dst, src, 1, blocks, 0, 0}, "bias[n0, n0 + n_act)");
      });
    }
    if (!resident()) {
      Reg dst = b.reg("load: weights address"), n0 = b.reg("load: n0"),
          n_act = b.reg("load: columns");
      select(b, dst, p, m_bbuf);
      n_range(key, n0, n_act);
      load_weights(dst, key, n0, n_act, c1a, ncb, cvalid);
    }
    b.set_flag(m_l1_full, p, "L1 buffers loaded");
  }

  // MTE2: B for channel blocks [c1a, c1a + ncb) of the weight key into L1 at dst, one nd2nz per
  // k-block (c1, tap), k-block i at dst + i * nb * 512 (nb = ceil(n_act / 16)).
  void load_weights(const Reg& dst, const Reg& key, const Reg& n0, const Reg& n_act,
                    const Reg& c1a, const Reg& ncb, const Reg& cvalid) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "weights: one nd2nz per (16 input channels, tap)");
    Reg base = b.reg("weights: group base"), d = b.reg("weights: destination");
    // base = w + (g * b_group + (kRowsK ? n0 : n0 * b_row)) * size
    b.div(base, key, m_t.n_tiles);
    b.mul(base, base, m_s.b_group);
    Reg t = b.reg("weights: temp");
    if (m_s.b_mode == CubeConvSpec::BMode::kRowsK) {
      b.add(base, base, n0);
    } else {
      b.mul(t, n0, m_s.b_row);
      b.add(base, base, t);
    }
    b.mul(base, base, m_isz);
    {
      Reg w = b.load_arg("w");
      b.add(base, base, w);
    }
    Reg nrows = b.reg("weights: n rows padded");
    round16(b, nrows, n_act);
    b.mov(d, dst);
    Reg c = b.reg("weights: block"), end = b.reg("weights: end block");
    b.add(end, c1a, ncb);
    b.for_range(c, c1a, end, 1, [&] {
      Reg rows = b.reg("weights: channels in block"), src = b.reg("weights: source"),
          tap = b.reg("weights: tap");
      b.mul(rows, c, kBlk);
      b.sub(rows, cvalid, rows);
      b.min(rows, rows, kBlk);
      b.for_range(tap, 0, m_taps, 1, [&] {
        // source tap = flip ? taps - 1 - tap : tap
        if (m_s.b_flip) {
          b.movi(src, m_taps - 1);
          b.sub(src, src, tap);
        } else {
          b.mov(src, tap);
        }
        b.mul(src, src, m_s.b_tap);
        if (m_s.b_mode == CubeConvSpec::BMode::kRowsK) {
          b.mul(t, c, kBlk * m_s.b_row);
          b.add(src, src, t);
          b.mul(src, src, m_isz);
          b.add(src, src, base);
          b.emit(Opcode::op_nd2nz, {m_s.in_type, d, src, rows, n_act, m_s.b_row, kBlk},
                 "k-block: 16 input channels x n (fractal rows = k)");
        } else {
          b.mul(t, c, kBlk);
          b.add(src, src, t);
          b.mul(src, src, m_isz);
          b.add(src, src, base);
          b.emit(Opcode::op_nd2nz, {m_s.in_type, d, src, n_act, rows, m_s.b_row, nrows},
                 "k-block: n x 16 input channels (fractal rows = n, the L0B layout)");
        }
        b.mul(t, nrows, kBlk * m_isz);
        b.add(d, d, t, "next k-block: nb * 512 bytes");
      });
    });
  }

  // MTE1 + M (+ FIX after the tile's last chunk) for step s.
  void compute_step(const Reg& s) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "compute: L1 -> L0 -> cube");
    Reg ch = b.reg("compute: chunk"), m_act = b.reg("compute: positions"),
        msl = b.reg("compute: first img2col row in the slab"), chan = b.reg("compute: channels"),
        kc = b.reg("compute: k in the chunk"), n_act = b.reg("compute: columns"),
        cdst = b.reg("compute: output address"), bbase = b.reg("compute: B of the chunk in L1");
    {
      Reg key = b.reg("compute: weight key"), n0 = b.reg("compute: n0");
      {
        Reg img = b.reg("compute: image"), m0 = b.reg("compute: m0");
        {
          Reg mt = b.reg("compute: m tile");
          decompose(s, ch, mt, img, key);
          m_slab.tile_positions(mt, m0, m_act);
        }
        {
          Reg r0 = b.reg("compute: first row"), h = b.reg("compute: rows");
          m_slab.slab_rows(m0, m_act, r0, h);
          m_slab.set_fmatrix(m0, m_act, h);
        }
        b.div(msl, m0, m_s.ow());
        b.mul(msl, msl, m_s.ow());
        b.sub(msl, m0, msl, "m0 - oh0 * OW");
        n_range(key, n0, n_act);
        // y + ((img * OH*OW + m0) * cy + g * cg_out + n0) * size (stacked: without the
        // position, added per image when storing)
        if (stacked()) {
          b.movi(cdst, 0);
        } else {
          b.mul(cdst, img, m_s.oh() * m_s.ow());
          b.add(cdst, cdst, m0);
          b.mul(cdst, cdst, m_s.cy);
        }
        b.div(m0, key, m_t.n_tiles);
        b.mul(m0, m0, m_s.cg_out);
        b.add(cdst, cdst, m0);
        b.add(cdst, cdst, n0);
        b.mul(cdst, cdst, m_osz);
        Reg y = b.load_arg("y");
        b.add(cdst, cdst, y, "output tile address");
      }
      {
        Reg cbase = b.reg("compute: group channel base"), cvalid = b.reg("compute: channels");
        group_channels(key, cbase, cvalid);
        cbase.release();
        Reg c1a = b.reg("compute: first block"), ncb = b.reg("compute: blocks");
        chunk_blocks(ch, cvalid, c1a, ncb);
        b.mul(chan, c1a, kBlk);
        b.sub(chan, cvalid, chan, "channels from the chunk's first block");
        b.mul(kc, ncb, m_taps * kBlk, "k of the chunk");
        if (!resident()) {
          Reg p = b.reg("compute: L1 parity");
          b.and_(p, s, 1);
          select(b, bbase, p, m_bbuf);
        } else {
          // The chunk's k-blocks in the resident buffer: B + c1a * taps * nb * 512.
          round16(b, bbase, n_act);
          b.mul(bbase, bbase, c1a);
          b.mul(bbase, bbase, m_taps * kBlk * m_isz);
          b.add(bbase, bbase, static_cast<int64_t>(m_bbuf[0]), "B of the chunk in L1");
          // The first tile of a (group, n tile) loads the weights chunk by chunk; its first
          // chunk waits for MTE1 to finish with the previous weights.
          Reg t = b.reg("compute: loading");
          b.if_(eq(ch, 0), [&] {
            b.add(t, key, key);
            Label same = b.label("same_weights");
            Reg prev = b.reg("compute: previous key x 2");
            b.shr(prev, *m_prev_key, 1);
            b.shl(prev, prev, 1);
            b.branch(eq(t, prev), same);
            b.add(t, t, 1);
            KernelBuilder::Origin r(b, "weights of a new (group, n tile)");
            b.set_flag(Pipe::MTE1, Pipe::MTE2, m_b_drained, "MTE1 done with the old weights");
            b.wait_flag(Pipe::MTE1, Pipe::MTE2, m_b_drained);
            b.bind(same);
            b.mov(*m_prev_key, t);
          });
          b.and_(t, *m_prev_key, 1);
          b.if_(ne(t, 0), [&] {
            KernelBuilder::Origin r(b, "resident weights: this chunk's k-blocks");
            t.release();
            load_weights(bbase, key, n0, n_act, c1a, ncb, cvalid);
            b.set_flag(Pipe::MTE2, Pipe::MTE1, m_b_loaded);
            b.wait_flag(Pipe::MTE2, Pipe::MTE1, m_b_loaded);
          });
        }
      }
    }
    Reg p = b.reg("compute: L1 parity"), pt = b.reg("compute: L0C parity");
    b.and_(p, s, 1);
    if (m_t.l0c_buffers == 2) {
      b.div(pt, s, m_t.chunks);
      b.and_(pt, pt, 1, "L0C buffer: tile index in the block & 1");
    } else {
      b.movi(pt, 0);
    }
    b.wait_flag(m_l1_full, p, "L1 buffers loaded");
    {
      // What every mmad step of the chunk uses, computed once (StepRegs).
      StepRegs r{b.reg("compute: L1 slab"), b.reg("compute: L0C address"),
                 b.reg("compute: fractal rows of the tile"), b.reg("compute: n blocks"),
                 b.reg("compute: B of the step in L1"), b.reg("compute: B bytes per step"),
                 b.reg("compute: bias in L1")};
      if (m_s.bias) select(b, r.bias, p, m_bias_l1);
      select(b, r.slab, p, m_slab_buf);
      select(b, r.l0c, pt, m_l0c);
      round16(b, r.m16, m_act);
      round16(b, r.nb, n_act);
      b.shr(r.nb, r.nb, 4, "nb");
      b.mov(r.bsrc, bbase);
      b.mul(r.bstep, r.nb, m_t.tk0 * 32, "tk0/16 * nb * 512");
      Reg kk = b.reg("compute: k within the chunk");
      b.for_range(kk, 0, kc, m_t.tk0,
                  [&] { mmad_step(r, pt, ch, kk, kc, msl, chan, m_act, n_act); });
    }
    b.set_flag(m_l1_free, p, "L1 buffers read");
    p.release();
    kc.release();
    msl.release();
    chan.release();
    bbase.release();
    b.if_(eq(ch, m_t.chunks - 1), [&] {
      KernelBuilder::Origin f(b, "store: L0C -> y (ND rows of the tile's channels)");
      b.set_flag(m_l0c_full, pt);
      b.wait_flag(m_l0c_full, pt);
      Reg l0c = b.reg("store: L0C address");
      select(b, l0c, pt, m_l0c);
      if (stacked())
        store_stacked(s, l0c, cdst, m_act, n_act);
      else
        b.emit(Opcode::op_fixpipe, {Dtype::F32, m_s.out_type, Buf::GM, cdst, l0c, m_act, n_act,
                                    m_s.cy, 1, m_s.relu ? 1 : 0, 0});
      b.set_flag(m_l0c_free, pt);
    });
  }

  // FIX of a stacked tile (step s; C m_act x n_act at l0c, NZ with M16 = round16(m_act)): per
  // image j of the stack, its positions [j * P * OW, (j * P + OH) * OW) (P = period / sh) that
  // the tile covers, one fixpipe per 16 output channels (a 16-column block of L0C is
  // [M16][16]: any first row works), to y + (((img + j) * OH*OW + position) * cy) * size +
  // cdst (cdst: y and the tile's first channel).
  void store_stacked(const Reg& s, const Reg& l0c, const Reg& cdst, const Reg& m_act,
                     const Reg& n_act) {
    KernelBuilder& b = m_b;
    const int64_t positions = m_s.oh() * m_s.ow();
    const int64_t pitch = m_t.period / m_s.sh * m_s.ow();  // tall positions per image
    Reg img = b.reg("store: first image"), m0 = b.reg("store: m0");
    {
      Reg ch = b.reg("store: chunk"), mt = b.reg("store: m tile"), key = b.reg("store: key");
      decompose(s, ch, mt, img, key);
      m_slab.tile_positions(mt, m0, ch);
    }
    Reg j = b.reg("store: image in the stack"), jend = b.reg("store: images in the stack"),
        a = b.reg("store: first position"), e = b.reg("store: end position"),
        src = b.reg("store: L0C rows"), dst = b.reg("store: destination"),
        cb = b.reg("store: column block"), t = b.reg("store: temp");
    b.movi(jend, m_s.images);
    b.sub(jend, jend, img);
    b.min(jend, jend, m_t.stack, "images of this stack");
    Reg nb = b.reg("store: column blocks"), m16 = b.reg("store: L0C column block bytes");
    b.add(nb, n_act, kBlk - 1);
    b.shr(nb, nb, 4);
    round16(b, m16, m_act);
    b.mul(m16, m16, kBlk * kL0cBytes);
    b.for_range(j, 0, jend, 1, [&] {
      // The image's tall positions [pj, pj + OH*OW) within [m0, m0 + m_act).
      b.mul(t, j, pitch, "pj: the image's first tall position");
      b.max(a, t, m0, "first position");
      b.add(e, t, positions);
      b.add(dst, m0, m_act);
      b.min(e, e, dst, "end position");
      b.if_(lt(a, e), [&] {
        b.sub(dst, a, t, "position in the image");
        b.add(t, img, j);
        b.mul(t, t, positions);
        b.add(dst, dst, t);
        b.mul(dst, dst, m_s.cy * m_osz);
        b.add(dst, dst, cdst, "first row of the image's part");
        b.sub(src, a, m0);
        b.mul(src, src, kBlk * kL0cBytes);
        b.add(src, src, l0c, "its first L0C row");
        b.sub(e, e, a, "rows");
        b.for_range(cb, 0, nb, 1, [&] {
          b.mul(t, cb, kBlk);
          b.sub(t, n_act, t);
          b.min(t, t, kBlk, "channels of the block");
          b.emit(Opcode::op_fixpipe, {Dtype::F32, m_s.out_type, Buf::GM, dst, src, e, t,
                                      m_s.cy, 1, m_s.relu ? 1 : 0, 0},
                 "the image's rows, 16 channels");
          b.add(dst, dst, kBlk * m_osz);
          b.add(src, src, m16);
        });
      });
    });
  }

  // Registers an mmad step reads, set once per chunk: the chunk's slab in L1 (buffer p), the
  // tile's L0C buffer, round16(m_act), nb = round16(n_act) / 16, and B's L1 address for the
  // next step (advanced by bstep = tk0 / 16 * nb fractals per step).
  struct StepRegs {
    Reg slab, l0c, m16, nb, bsrc, bstep, bias;  // bias: the tile's bias in L1 (with a bias)
  };

  // One mmad step: k [kk, kk + ks) of the chunk, into L0C buffer pt. The L0 parity (the step
  // count's low bit) selects one of two copies of the step, so its flags and L0 addresses are
  // immediates. With a bias, a tile's first step copies its bias into the BT row of the L0
  // parity (free: the mmad that last read it, two steps back, freed the L0 buffers MTE1 waited
  // for) and its mmad starts from it (init 2).
  void mmad_step(const StepRegs& r, const Reg& pt, const Reg& ch, const Reg& kk, const Reg& kc,
                 const Reg& msl, const Reg& chan, const Reg& m_act, const Reg& n_act) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "mmad step: load3d A, load2d B, mmad");
    Reg ks = b.reg("step: k"), q = b.reg("step: L0 parity");
    b.sub(ks, kc, kk);
    b.min(ks, ks, m_t.tk0, "k in this step");
    Reg a = b.reg("step: L0A address"), l0b = b.reg("step: L0B address"),
        n = b.reg("step: fractals"), bt = b.reg("step: bias row in BT");
    // B: fractals [kk/16 * nb, (kk + ks)/16 * nb) of the L1 image, one load2d.
    b.shr(n, ks, 4);
    b.mul(n, n, r.nb, "fractals of the step");
    b.and_(q, *m_l0_steps, 1);
    b.by_parity(q, [&](int par) {
      b.wait_flag(m_l0_free, par, "L0 buffers free");
      b.movi(a, static_cast<int64_t>(m_l0a[par]));
      b.emit(Opcode::op_load3d, {m_s.in_type, a, r.slab, chan, msl, r.m16, kk, ks},
             "img2col rows of the tile, k [kk, kk + ks)");
      b.movi(l0b, static_cast<int64_t>(m_l0b[par]));
      b.emit(Opcode::op_load2d, {m_s.in_type, Buf::L0B, l0b, r.bsrc, n, 1,
                                 m_s.b_mode == CubeConvSpec::BMode::kRowsK ? 1 : 0},
             "B of the step");
      if (m_s.bias) {  // (bt is read by this step's init-2 mmad only: the same condition)
        Label later = b.label("bias_loaded");
        b.branch(ne(ch, 0), later);
        b.branch(ne(kk, 0), later);
        b.movi(bt, static_cast<int64_t>(m_bias_bt[par]));
        b.add(n, n_act, 7);
        b.shr(n, n, 3, "32-byte blocks of n_act f32");
        b.emit(Opcode::op_copy_l12bt, {bt, r.bias, n}, "the tile's bias into BT");
        b.bind(later);
      }
      b.set_flag(m_l0_full, par, "L0 step loaded");
      b.wait_flag(m_l0_full, par);
      Label acc = b.label("accumulate"), issued = b.label("mmad_issued");
      b.branch(ne(ch, 0), acc);
      b.branch(ne(kk, 0), acc);
      b.wait_flag(m_l0c_free, pt, "first step of the tile: L0C free");
      if (m_s.bias)
        b.emit(Opcode::op_mmad, {m_s.in_type, r.l0c, a, l0b, m_act, ks, n_act, 2, bt},
               "C = bias + A * B");
      else
        b.emit(Opcode::op_mmad, {m_s.in_type, r.l0c, a, l0b, m_act, ks, n_act, 0, 0},
               "C = A * B");
      b.jmp(issued);
      b.bind(acc);
      b.emit(Opcode::op_mmad, {m_s.in_type, r.l0c, a, l0b, m_act, ks, n_act, 1, 0}, "C += A * B");
      b.bind(issued);
      b.set_flag(m_l0_free, par, "L0 buffers read");
    });
    b.add(r.bsrc, r.bsrc, r.bstep);
    b.add(*m_l0_steps, *m_l0_steps, 1);
  }

  const CubeConvSpec& m_s;
  const CubeConvTiling& m_t;
  KernelBuilder m_b;
  SlabEmitter m_slab;
  const int64_t m_isz, m_osz, m_taps;
  uint64_t m_slab_buf[2] = {0, 0}, m_bbuf[2] = {0, 0}, m_l0a[2] = {0, 0}, m_l0b[2] = {0, 0},
           m_l0c[2] = {0, 0}, m_bias_l1[2] = {0, 0}, m_bias_bt[2] = {0, 0};
  int m_b_drained = -1, m_b_loaded = -1;
  const Reg* m_l0_steps = nullptr;
  const Reg* m_prev_key = nullptr;
  const Reg* m_tbeg = nullptr;
  FlagPair m_l1_full, m_l1_free, m_l0_full, m_l0_free, m_l0c_full, m_l0c_free;
};

}  // namespace

Launch build_cube_conv(const CubeConvSpec& s, const CubeConvTiling& t, const ChipConfig& cfg,
                       const std::string& op) {
  Launch l;
  l.kernel = ConvEmitter(s, t, cfg, op).emit();
  l.block_dim = t.block_dim;
  l.args = {input_ref(0), input_ref(1), output_ref(0)};
  if (s.bias) l.args.push_back(input_ref(2));  // (callers rebind the arguments)
  l.summary = fmt::format("cube conv{}{} {}x{}x{}x{} {} ({}x{} window, stride {}x{}, dilation "
                          "{}x{}, zero insertion {}x{}, {} group(s) of {} -> {}): {}",
                          s.bias ? " + bias" : "", s.relu ? " + relu" : "", s.images, s.hs, s.ws, s.cs, isa::dtype_name(s.in_type), s.kh, s.kw,
                          s.sh, s.sw, s.dh, s.dw, s.up_h, s.up_w, s.groups, s.cg_in, s.cg_out,
                          t.str());
  return l;
}

namespace {

struct Img2colTiling {
  int64_t tm = 0, kc1 = 0, chunks = 0, m_tiles = 0, tiles = 0, slab_rows = 0, slab_bytes = 0;
  int block_dim = 0;
  int64_t per = 0;
};

Img2colTiling plan_img2col(const Img2colSpec& s, const ChipConfig& cfg, const std::string& op) {
  const isa::CoreKind kind = cfg.split ? isa::CoreKind::AIC : isa::CoreKind::AICORE;
  const CoreKindConfig* core = cfg.core_kind(kind);
  if (!core || !core->has(Pipe::M))
    throw CompileError(fmt::format("{}: chip {} has no cube cores", op, cfg.name));
  if (!cfg.has_path(Buf::L0C, Buf::GM))
    throw CompileError(fmt::format("{}: chip {} has no l0c->gm path (img2col needs FIXPIPE "
                                   "to write GM)",
                                   op, cfg.name));
  check_geometry(op, s.h, s.w, s.kh, s.kw, s.sh, s.sw, s.dh, s.dw, s.pt, s.pb, s.pl, s.pr);
  const int64_t positions = s.oh() * s.ow(), c1 = ceil_div(s.c, kBlk);
  const int64_t l1 = static_cast<int64_t>(core->capacity(Buf::L1));
  const int64_t l0a = static_cast<int64_t>(core->capacity(Buf::L0A));
  const int64_t l0b = static_cast<int64_t>(core->capacity(Buf::L0B));
  const int64_t l0c = static_cast<int64_t>(core->capacity(Buf::L0C));
  const int64_t ru12 = field_max(isa::FieldKind::RU12);
  if (kFractalBytes * static_cast<uint64_t>(s.rep) > static_cast<uint64_t>(l0b) ||
      kBlk * s.rep > ru12)
    throw CompileError(fmt::format("{}: repetition {} too large for L0B / mmad n", op, s.rep));
  // The largest balanced tile height, then the most channel blocks that fit.
  for (int64_t tm = std::min<int64_t>(kMaxTile, round_up(positions, kBlk)); tm >= kBlk;
       tm -= kBlk) {
    const int64_t tmb = round_up(ceil_div(positions, ceil_div(positions, tm)), kBlk);
    if (2 * tmb * kBlk * 2 > l0a) continue;
    const std::vector<SlabGeom> mts = m_tiles(positions, tmb, s.ow(), s.h, s.kh, s.sh, s.dh, s.pt);
    int64_t rows = 0;
    for (const SlabGeom& g : mts) rows = std::max(rows, g.h);
    for (int64_t kc1 = c1; kc1 >= 1; --kc1) {
      if (2 * tmb * kc1 * kBlk * s.rep * kL0cBytes > l0c || kc1 * kBlk * s.rep > ru12) continue;
      const int64_t slab = round_up(kc1 * rows * s.w * kBlkBytes + (kBlk + 1) * kBlkBytes, 512);
      if (2 * slab + static_cast<int64_t>(kFractalBytes) * s.rep > l1) continue;
      Img2colTiling t;
      t.tm = tmb;
      t.kc1 = kc1;
      t.chunks = ceil_div(c1, kc1);
      t.m_tiles = static_cast<int64_t>(mts.size());
      t.tiles = s.images * t.m_tiles;
      t.slab_rows = rows;
      t.slab_bytes = slab;
      const int64_t blocks0 = std::min<int64_t>(core->count, t.tiles);
      t.per = ceil_div(t.tiles, blocks0);
      t.block_dim = static_cast<int>(ceil_div(t.tiles, t.per));
      return t;
    }
  }
  throw CompileError(fmt::format("{}: no img2col tile fits the cube core of chip {}", op,
                                 cfg.name));
}

class Img2colEmitter {
 public:
  Img2colEmitter(const Img2colSpec& s, const Img2colTiling& t, const ChipConfig& cfg,
                 const std::string& op)
      : m_s(s),
        m_t(t),
        m_b(fmt::format("Img2col_{}_{}", isa::dtype_name(s.in_type), isa::dtype_name(s.out_type)),
            op, cfg),
        m_slab(m_b, geometry(s, t.tm)),
        m_isz(isa::dtype_size(s.in_type)),
        m_osz(isa::dtype_size(s.out_type)),
        m_taps(s.kh * s.kw) {}

  BuiltKernel emit() {
    KernelBuilder& b = m_b;
    b.begin_section(b.cube_core_kind());
    b.declare_arg("x", m_s.in_type, {m_s.images, m_s.h, m_s.w, m_s.c});
    b.declare_arg("out", m_s.out_type, {});
    b.declare_arg("rep", Dtype::U16, {16 * m_s.rep * 16});
    for (int q = 0; q < 2; ++q) {
      m_slab_buf[q] =
          b.alloc(Buf::L1, static_cast<uint64_t>(m_t.slab_bytes), fmt::format("slab {}", q)) +
          kBlkBytes;
      m_l0a[q] = b.alloc(Buf::L0A, static_cast<uint64_t>(m_t.tm * kBlk * m_isz),
                         fmt::format("A {}", q));
      m_l0c[q] = b.alloc(Buf::L0C,
                         static_cast<uint64_t>(m_t.tm * m_t.kc1 * kBlk * m_s.rep * kL0cBytes),
                         fmt::format("C {}", q));
    }
    const uint64_t rep_bytes = kFractalBytes * static_cast<uint64_t>(m_s.rep);
    const uint64_t l1_rep = b.alloc(Buf::L1, rep_bytes, "repetition matrix");
    const uint64_t l0b_rep = b.alloc(Buf::L0B, rep_bytes, "repetition matrix");
    b.emit(Opcode::op_set_l3d_geom, {m_s.kh, m_s.kw, m_s.sh, m_s.sw, m_s.dh, m_s.dw},
           "window geometry (fixed)");
    write_rep_matrix();
    {
      KernelBuilder::Origin o(b, "repetition matrix: GM -> L1 -> L0B");
      const int f = b.flag(Pipe::MTE2, Pipe::MTE1, "repetition matrix in L1");
      const int g = b.flag(Pipe::MTE1, Pipe::M, "repetition matrix in L0B");
      Reg src = b.load_arg("rep"), dst = b.reg_imm("L1", static_cast<int64_t>(l1_rep));
      b.emit(Opcode::op_copy_gm2l1,
             {dst, src, 1, static_cast<int64_t>(rep_bytes / kBlkBytes), 0, 0});
      b.set_flag(Pipe::MTE2, Pipe::MTE1, f);
      b.wait_flag(Pipe::MTE2, Pipe::MTE1, f);
      b.movi(src, static_cast<int64_t>(l0b_rep));
      b.emit(Opcode::op_load2d, {m_s.in_type, Buf::L0B, src, dst, m_s.rep, 1, 0});
      b.set_flag(Pipe::MTE1, Pipe::M, g);
      b.wait_flag(Pipe::MTE1, Pipe::M, g);
    }
    m_l0b = l0b_rep;
    Reg steps = b.reg("steps"), tbeg = b.reg("first tile");
    m_tbeg = &tbeg;
    b.emit(Opcode::op_get_block_id, {tbeg});
    b.mul(tbeg, tbeg, m_t.per);
    b.movi(steps, m_t.tiles);
    b.sub(steps, steps, tbeg);
    b.min(steps, steps, m_t.per);
    b.mul(steps, steps, m_t.chunks);
    m_l1_full = b.flag_pair(Pipe::MTE2, Pipe::MTE1, "slab loaded");
    m_l1_free = b.flag_pair(Pipe::MTE1, Pipe::MTE2, "slab free");
    m_l0_full = b.flag_pair(Pipe::MTE1, Pipe::M, "A loaded");
    m_l0_free = b.flag_pair(Pipe::M, Pipe::MTE1, "A free");
    m_l0c_full = b.flag_pair(Pipe::M, Pipe::FIX, "C computed");
    m_l0c_free = b.flag_pair(Pipe::FIX, Pipe::M, "C stored");
    for (int q = 0; q < 2; ++q) {
      b.set_flag(m_l1_free, q);
      b.set_flag(m_l0_free, q);
      b.set_flag(m_l0c_free, q);
    }
    Reg l0n = b.reg_imm("A loads so far", 0), cn = b.reg_imm("C tiles so far", 0);
    m_l0n = &l0n;
    m_cn = &cn;
    b.pipelined_steps(steps, [&](const Reg& t) { load_step(t); },
                      [&](const Reg& s) { compute_step(s); });
    for (int q = 0; q < 2; ++q) {
      b.wait_flag(m_l1_free, q);
      b.wait_flag(m_l0_free, q);
      b.wait_flag(m_l0c_free, q);
    }
    b.end();
    return b.finish();
  }

 private:
  static SlabEmitter::Geometry geometry(const Img2colSpec& s, int64_t tm) {
    SlabEmitter::Geometry g;
    g.type = s.in_type;
    g.images = s.images;
    g.hs = s.h;
    g.ws = s.w;
    g.cs = s.c;
    g.kh = s.kh;
    g.kw = s.kw;
    g.sh = s.sh;
    g.sw = s.sw;
    g.dh = s.dh;
    g.dw = s.dw;
    g.pt = s.pt;
    g.pb = s.pb;
    g.pl = s.pl;
    g.pr = s.pr;
    g.oh = s.oh();
    g.ow = s.ow();
    g.tm = tm;
    return g;
  }

  // The 16 x 16*rep matrix B (B[k][n] = 1 iff n / rep == k) in the L0B (Zn) layout, written to
  // the "rep" workspace by scalar stores (every block writes the same bytes).
  void write_rep_matrix() {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "repetition matrix (Zn) -> GM by scalar stores");
    const uint64_t one = m_s.in_type == Dtype::BF16 ? 0x3F80 : 0x3C00;
    Reg addr = b.load_arg("rep"), v = b.reg("word");
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
    b.and_(p, s, 1);
    b.wait_flag(m_l1_free, p);
    Reg c1a = b.reg("first block"), ncb = b.reg("blocks"), cvalid = b.reg_imm("channels", m_s.c);
    chunk_blocks(ch, c1a, ncb);
    Reg dst = b.reg("slab"), x = b.load_arg("x"), cbase = b.reg_imm("channel base", 0);
    select(b, dst, p, m_slab_buf);
    m_slab.load_slab(dst, x, img, r0, h, cbase, c1a, ncb, cvalid);
    b.set_flag(m_l1_full, p);
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
      b.div(msl, m0, m_s.ow());
      b.mul(msl, msl, m_s.ow());
      b.sub(msl, m0, msl);
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
    b.and_(p, s, 1);
    round16(b, m16, m_act);
    b.wait_flag(m_l1_full, p);
    Reg tap = b.reg("tap");
    b.for_range(tap, 0, m_taps, 1, [&] {
      Reg pc = b.reg("C parity"), c = b.reg("block");
      b.and_(pc, *m_cn, 1);
      b.wait_flag(m_l0c_free, pc);
      b.for_range(c, 0, ncb, 1, [&] {
        Reg q = b.reg("A parity"), a = b.reg("A"), src = b.reg("slab"), k = b.reg("k start"),
            cc = b.reg("C");
        b.and_(q, *m_l0n, 1);
        b.wait_flag(m_l0_free, q);
        select(b, a, q, m_l0a);
        select(b, src, p, m_slab_buf);
        b.mul(k, c, m_taps);
        b.add(k, k, tap);
        b.mul(k, k, kBlk, "k-block (c, tap)");
        b.emit(Opcode::op_load3d, {m_s.in_type, a, src, chan, msl, m16, k, kBlk});
        b.set_flag(m_l0_full, q);
        b.wait_flag(m_l0_full, q);
        select(b, cc, pc, m_l0c);
        b.mul(k, c, m_s.rep * kBlk * kL0cBytes);
        b.mul(k, k, m16, "column blocks c * rep of the C tile");
        b.add(cc, cc, k);
        b.emit(Opcode::op_mmad, {m_s.in_type, cc, a, static_cast<int64_t>(m_l0b), m_act, kBlk,
                                 kBlk * m_s.rep, 0, 0},
               "one channel block, repeated");
        b.set_flag(m_l0_free, q);
        b.add(*m_l0n, *m_l0n, 1);
      });
      b.set_flag(m_l0c_full, pc);
      b.wait_flag(m_l0c_full, pc);
      Reg cc = b.reg("C"), d = b.reg("destination");
      select(b, cc, pc, m_l0c);
      b.mul(d, tap, m_s.tap_stride * m_osz);
      b.add(d, d, dst);
      b.emit(Opcode::op_fixpipe, {Dtype::F32, m_s.out_type, Buf::GM, d, cc, m_act, ncols,
                                  m_s.row_stride, 1, 0, 0},
             "the tap's channels of every position");
      b.set_flag(m_l0c_free, pc);
      b.add(*m_cn, *m_cn, 1);
    });
    b.set_flag(m_l1_free, p);
  }

  const Img2colSpec& m_s;
  const Img2colTiling& m_t;
  KernelBuilder m_b;
  SlabEmitter m_slab;
  const int64_t m_isz, m_osz, m_taps;
  uint64_t m_slab_buf[2] = {0, 0}, m_l0a[2] = {0, 0}, m_l0c[2] = {0, 0}, m_l0b = 0;
  const Reg* m_tbeg = nullptr;
  const Reg* m_l0n = nullptr;
  const Reg* m_cn = nullptr;
  FlagPair m_l1_full, m_l1_free, m_l0_full, m_l0_free, m_l0c_full, m_l0c_free;
};

}  // namespace

Launch build_img2col(const Img2colSpec& s, const ChipConfig& cfg, const std::string& op) {
  const Img2colTiling t = plan_img2col(s, cfg, op);
  Launch l;
  l.kernel = Img2colEmitter(s, t, cfg, op).emit();
  l.block_dim = t.block_dim;
  l.summary = fmt::format("cube img2col {}x{}x{}x{} ({}x{} window, rep {}): tiles of {} "
                          "positions x {} channel blocks, {} tiles over {} blocks",
                          s.images, s.h, s.w, s.c, s.kh, s.kw, s.rep, t.tm, t.kc1, t.tiles,
                          t.block_dim);
  return l;
}

}  // namespace npusim::compiler::ops
