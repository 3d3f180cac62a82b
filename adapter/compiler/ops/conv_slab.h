// What the cube convolution and img2col kernels share (ops/conv_tiling.cpp, conv_emitter.cpp,
// img2col.cpp; ops/conv_slab.cpp implements it): channel-block sizes, the slab geometry of an
// m tile at compile time (SlabGeom, StackGeom) and at run time (SlabEmitter: the slab rows of a
// tile, loading the slab into L1, set_fmatrix), and the ISA's geometry limits.
//
// A slab is the input rows one m tile of output positions needs, all columns, some channel
// blocks, in L1 as NC1HWC0 [c1][rows][Wv][16] (one 16-channel plane per channel block), read by
// load3d (img2col) into L0A.
#pragma once

#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "adapter/compiler/buffer_plan.h"
#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/ops/conv.h"
#include "isa/isa.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

constexpr int64_t kBlk = 16;  // channels per block: C0 of 16-bit types = fractal rows
constexpr int64_t kBlkBytes = vec::kBlockBytes;  // one channel block of one pixel
constexpr int64_t kMaxTile = 256;                // output tile side limit (as MatMul)

inline int64_t field_max(isa::FieldKind k) { return static_cast<int64_t>(isa::field_imm_max(k)); }

// L1 bytes of one slab buffer (kc1 planes of slab_rows x wv pixels, one block of room before
// for zeroing and 16 pixels after for spilled zero padding) and of one weight buffer.
int64_t slab_buffer_bytes(int64_t kc1, int64_t slab_rows, int64_t wv);
int64_t weight_buffer_bytes(int64_t k, int64_t tn16);

// The convolution kernel's L1 buffers in declaration order: two slabs, the weights (one
// resident or two streamed chunk buffers) and two bias rows of bias_bytes (none if 0). The
// tiling checks this list against L1 and the kernel allocates it.
struct ConvL1Buffers {
  BufferPlan plan{isa::Buf::L1};
  BufferPlan::Id slab, weights, bias;
};
ConvL1Buffers conv_l1_buffers(const CubeConvTiling& t, int64_t bias_bytes);

// The slab of output positions [m0, m0 + m_act) of one image: input rows [r0, r0 + h) of the
// (virtual) map, with top/bottom paddings ptl/pbl for load3d and the first row of the slab's
// img2col that is the tile's (m_start).
struct SlabGeom {
  int64_t m0, m_act, r0, h, ptl, pbl, m_start;
};
SlabGeom slab_geom(int64_t m0, int64_t m_act, int64_t ow, int64_t hv, int64_t kh, int64_t sh,
                   int64_t dh, int64_t pt);
// The m tiles of an image of `positions` outputs in tiles of tm.
std::vector<SlabGeom> m_tiles(int64_t positions, int64_t tm, int64_t ow, int64_t hv, int64_t kh,
                              int64_t sh, int64_t dh, int64_t pt);

// Stacking (CubeConvTiling): the rows per image `period` (Hv and a gap of zero rows at least the
// window's overhang before an image (pt) and after it, rounded up so that sh divides the
// period), the tall map's rows `ht` (no gap after the last image) and output rows `tall_oh`.
struct StackGeom {
  int64_t period, ht, tall_oh;
};
StackGeom stack_geom(const CubeConvSpec& s, int64_t stack);

// Geometry limits of load3d / set_fmatrix / set_l3d_geom (isa.def field widths) and of the
// slab scheme (every tile's slab holds at least one input row); CompileError naming op.
void check_geometry(const std::string& op, int64_t hv, int64_t wv, int64_t kh, int64_t kw,
                    int64_t sh, int64_t sw, int64_t dh, int64_t dw, int64_t pt, int64_t pb,
                    int64_t pl, int64_t pr);

// How a dense slab (one image a map, no zero insertion, no strided view of x) goes into L1.
// NPUSIM_CONV_PIXEL_LOADS (read at every compile): unset or empty, the load of the lower
// estimate (dense_slab_load); "0", per 16-channel plane; "1", by whole pixels. Anything else
// is a CompileError naming op.
enum class PixelLoads { kByEstimate, kPerPlane, kWholePixels };
PixelLoads pixel_loads_switch(const std::string& op);

// How kRowsN weights go into L1 (CubeConvTiling::weights_by_tap). NPUSIM_CONV_WEIGHT_RUNS (read
// at every compile): unset or empty, by tap where the chip prices GM bursts and the estimate
// (copy_issue_estimate) is lower; "0", one nd2nz per (16 channels, tap); "1", by tap. Anything
// else is a CompileError naming op.
enum class WeightLoads { kByEstimate, kPerBlock, kByTap };
WeightLoads weight_loads_switch(const std::string& op);

// How the fused filter gradient's strided view of x (its 1x1 strided windows, the width fold)
// goes into L1 (FilterGradTiling::strided_pixels). NPUSIM_FILTER_GRAD_STRIDED_PIXELS (read at
// every compile): unset or empty, per pixel where it can (SlabEmitter::strided_blocks), the chip
// prices the DMA's issue and the estimate (strided_slab_issue) is lower, the planner pricing
// the issue of the form taken; "0", as before (per plane and column, or per plane and row, as
// SlabEmitter::load_slab decides; no issue in the planner's estimate); "1", per pixel where it
// can. Anything else is a CompileError naming op.
enum class StridedSlabLoads { kByEstimate, kAsBefore, kPerPixel };
StridedSlabLoads strided_slab_switch(const std::string& op);
// The same choice for the convolution's strided view of x (its 1x1 strided windows, the
// stride-2 1x1 layers: CubeConvTiling::strided_pixels). NPUSIM_CONV_STRIDED_PIXELS (read at
// every compile): unset or empty, per pixel where it can (SlabEmitter::strided_blocks) as a
// plan of its own where the chip prices the DMA's issue, taken where the planner's estimate
// (which then prices the issue of either form, strided_slab_issue) is the lower; "0", as before
// (no issue in the view's estimate); "1", per pixel where it can. Anything else is a
// CompileError naming op.
StridedSlabLoads conv_strided_slab_switch(const std::string& op);

// The DMA's issue minimum (copy_issue_estimate) of one strided-view slab of `rows` rows of `ws`
// pixels and `planes` 16-channel planes, x's pixels and rows pixel_bytes and row_bytes apart, as
// SlabEmitter::load_slab loads it:
//   kPlaneRows: per plane and row, an nd2nz of the row's pixels, a 32-byte run each;
//   kColumns: per plane and column, a copy of a 32-byte run a row, where rows >= planes (the
//     run-time rule of load_strided_columns), else per pixel;
//   kPerPixel: per pixel, one copy of one run of its planes' blocks.
// 0 on a chip without the keys.
enum class StridedSlabForm { kPlaneRows, kColumns, kPerPixel };
double strided_slab_issue(const ChipConfig& cfg, StridedSlabForm form, int64_t rows, int64_t ws,
                          int64_t planes, int64_t pixel_bytes, int64_t row_bytes);

// The minimum cycles the DMA spends issuing one GM copy (ChipConfig::copy_issue_cycles +
// burst_cycles per GM burst; sim/exec/mte_common.h) whose GM ranges are `runs` runs of
// run_bytes, pitch_bytes apart (one contiguous run where the two are equal); 0 on a chip
// without those keys. # estimate: a run starts at a 32-byte-aligned address anywhere in its
// 512-byte block, so a run of n bytes makes (n + 480) / 512 bursts on average (a 32-byte run
// exactly one).
double copy_issue_estimate(const ChipConfig& cfg, int64_t runs, int64_t run_bytes,
                           int64_t pitch_bytes);

// The rate (bytes per cycle) a cube core reads data that is in the L2: its L2 read port or its
// share of the L2's bandwidth, not slower than the GM path (docs/chip_model.md).
double cube_l2_read_rate(const ChipConfig& cfg, const CoreKindConfig& core);

// MTE2's load of a dense slab of `pixels` pixels and `planes` 16-channel planes from a map of
// `cs` channels of isz bytes, each way the larger of its data's time and its issue minimum
// (copy_issue_estimate):
//   per plane: `planes` nd2nz of one 32-byte run a pixel; the data at l2_rate (the first
//     plane's requests bring the slab's lines into the L2 at HBM's rate beside the core's
//     port, the planes after it hit: sim/chip/memory_system.cpp);
//   whole pixels: one nd2nz of a run of the planes' channels a pixel (one run for the slab
//     where they are all the map's); the data at gm_rate (each line a miss through the core's
//     GM port).
// mode kByEstimate takes the lower (per plane on a tie), and per plane on a chip without the
// DMA's issue keys (nothing changes there). # estimate: the slab's lines taken as not in the
// L2 (a slab read again for another n tile, or its halo rows, hit either way).
struct SlabLoad {
  bool whole_pixels = false;
  int64_t insns = 0;  // nd2nz a slab
  double cycles = 0;  // MTE2's cycles for the slab
  double issue = 0;   // of which the DMA's issue minimum (0 on a chip without the keys)
};
SlabLoad dense_slab_load(const ChipConfig& cfg, PixelLoads mode, int64_t pixels, int64_t planes,
                         int64_t cs, int64_t isz, double l2_rate, double gm_rate);

// The slab at run time, for one kernel's geometry.
class SlabEmitter {
 public:
  struct Geometry {
    isa::Dtype type = isa::Dtype::F16;
    int64_t images = 1, hs = 1, ws = 1, cs = 1, up_h = 1, up_w = 1, ext_h = 0, ext_w = 0;
    int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pb = 0, pl = 0, pr = 0;
    int64_t oh = 1, ow = 1, tm = 16;  // oh: output rows of the (tall) map
    int64_t stack = 1, period = 0;    // images per tall map, rows per image (CubeConvTiling)
    int64_t x_pixel = 0, x_row = 0, x_image = 0;  // CubeConvSpec's strided view of x
    // A dense slab (no zero insertion, stacking or strided view) whose planes are whole
    // fractals at run time (h * Wv a multiple of 16) is loaded by one nd2nz for all its
    // planes, 32 * planes-byte rows, instead of one per plane (the block-diagonal groups).
    bool planes_at_once = false;
    // A dense slab by one nd2nz of whole pixels (SlabLoad::whole_pixels): each pixel's
    // channels of the slab one GM run, the nd2nz's column blocks a plane apart.
    bool whole_pixels = false;
    // A strided view of x (strided_blocks) per pixel at every slab: one copy of the pixel's
    // planes (one GM run), not per plane and column or per plane and row
    // (FilterGradTiling::strided_pixels, CubeConvTiling::strided_pixels).
    bool strided_by_pixel = false;
  };

  // The window fields (kh .. pr) of a spec with those fields (CubeConvSpec, Img2colSpec).
  template <typename Spec>
  static void set_window(Geometry& g, const Spec& s) {
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
  }

  // The geometry of an unstacked map without zero insertion from a spec with in_type, images,
  // h, w, c, the window fields, oh(), ow() and x's strides (Img2colSpec, FilterGradSpec), in
  // tiles of tm positions.
  template <typename Spec>
  static Geometry image_geometry(const Spec& s, int64_t tm) {
    Geometry g;
    g.type = s.in_type;
    g.images = s.images;
    g.hs = s.h;
    g.ws = s.w;
    g.cs = s.c;
    set_window(g, s);
    g.oh = s.oh();
    g.ow = s.ow();
    g.tm = tm;
    g.x_pixel = s.x_pixel;
    g.x_row = s.x_row;
    g.x_image = s.x_image;
    return g;
  }

  SlabEmitter(KernelBuilder& b, const Geometry& g);

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

  // From the m tile index mt: its first position m0 and positions m_act.
  void tile_positions(const Reg& mt, const Reg& m0, const Reg& m_act);
  // The tile's slab (slab_geom): first row r0 and rows h.
  void slab_rows(const Reg& m0, const Reg& m_act, const Reg& r0, const Reg& h);
  // msl = m0 - (m0 / OW) * OW: the tile's first img2col row within its slab.
  void slab_first_row(const Reg& msl, const Reg& m0);
  // set_fmatrix for the tile (m0, m_act) whose slab has h rows. The slab's top and bottom
  // paddings are immediates, so branch to the instruction for the tile's pair.
  void set_fmatrix(const Reg& m0, const Reg& m_act, const Reg& h);

  // What load_slab reads and writes: channel blocks [c1a, c1a + ncb) (counted from channel
  // cbase of the map) of image img (stacked: of the tall map whose first image is img), rows
  // [r0, r0 + h), into L1 at dst; channels >= cvalid (counted from cbase) are zero.
  struct SlabArgs {
    const Reg &dst, &x, &img, &r0, &h, &cbase, &c1a, &ncb, &cvalid;
  };
  // MTE2: the slab into L1 at dst as [ncb][h][Wv][16]. The slab's last plane may be followed
  // by up to 15 pixels of zeros, and with zero insertion or stacking the 32 bytes before dst
  // are written too (see plan_cube_conv's sizes).
  void load_slab(const SlabArgs& a);
  // Whether a strided view of x (x_row set) is loaded per plane and column rather than per
  // plane and row: its pixels and rows are whole 32-byte blocks apart, its channels fill every
  // plane (nothing past the tensor is read) and it has fewer columns than a slab's usual rows
  // (the filter gradient's 1x1 stride-2 view of 7 or 14 columns over a tall map): fewer
  // instructions for the scalar unit and MTE2's queue.
  bool strided_columns() const { return strided_columns(m_g); }
  static bool strided_columns(const Geometry& g);
  // Whether a strided view of x can be loaded per pixel (Geometry::strided_by_pixel): the
  // copies' conditions of strided_columns (whole blocks, the gaps within their fields), any
  // number of columns.
  static bool strided_blocks(const Geometry& g);

 private:
  struct Scratch;
  void load_stacked(const SlabArgs& a, Scratch& r);
  void load_dense(const SlabArgs& a, Scratch& r);
  void load_zero_inserted(const SlabArgs& a, Scratch& r, const Reg& uu);
  // Per plane and column (strided_columns), one copy_gm2l1 of a block per row; where the slab
  // has fewer rows than planes (at run time) or Geometry::strided_by_pixel says so, per pixel
  // instead, one copy_gm2l1 of its ncb blocks (contiguous in x) to the planes.
  void load_strided_columns(const SlabArgs& a, Scratch& r);
  // Per plane, per slab row uu in [u, uend) by `step`: an nd2nz of the row's ws pixels,
  // `pixel` elements apart. source(c) sets r.src to x's address of row uu's block c; it runs
  // once (row u, block c1a), the rows after it are `row_bytes` apart in x, the planes 16
  // channels, so each row costs the nd2nz and two additions of the scalar unit.
  void plane_rows(const SlabArgs& a, Scratch& r, const Reg& uu, const Reg& u, const Reg& uend,
                  int64_t step, int64_t pixel, int64_t row_bytes,
                  const std::function<void(const Reg&)>& source, const char* what);
  // Zeroes the slab's planes: an nd2nz of one element to the block before dst, whose
  // zero-filled padding rows cover [dst, dst + (ncb * plane + 15) * 32). t, d: scratch.
  void zero_slab(const Reg& dst, const Reg& x, const Reg& ncb, const Reg& plane, const Reg& t,
                 const Reg& d);

  KernelBuilder& m_b;
  Geometry m_g;
  int64_t m_isz;
  std::set<std::pair<int64_t, int64_t>> m_pads;  // (top, bottom) slab paddings of the m tiles
};

// The slab's geometry of the cube convolution of spec s and tiling t (conv_emitter.cpp: what
// its kernel loads; the planner asks it whether a strided view can go per pixel).
SlabEmitter::Geometry conv_slab_geometry(const CubeConvSpec& s, const CubeConvTiling& t);

}  // namespace npusim::compiler::ops
