// The convolution family's shared pieces (ops/conv2d.cpp compiles the TF ops, ops/pool.cpp and
// ops/batchnorm.cpp use the window geometry and the launch helpers):
//   - ConvWindow: TF's window attributes (strides, dilations, padding SAME/VALID/EXPLICIT,
//     data_format) resolved for one spatial input size;
//   - the cube convolution kernel (ops/conv_emitter.cpp; tiling ops/conv_tiling.cpp): img2col
//     by load3d from an NHWC tensor in GM, weights from any strided layout, grouped
//     convolutions, zero insertion between input pixels (for the input gradient of strided
//     convolutions), tiled from the config;
//   - the cube img2col kernel (ops/img2col.cpp): the img2col matrix written to GM (for the
//     filter gradients);
//   - launch helpers (ops/conv_launch.cpp): casts into the workspace, the strided -> dense copy.
// Window geometry: ops/conv_window.cpp. The slab both cube kernels load: ops/conv_slab.h. Both
// run on the cube skeleton (ops/cube_pipeline.h).
// Layouts: docs/assembly.md "Data layouts", isa/layout.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "adapter/compiler/ops/fused.h"
#include "adapter/compiler/ops/registry.h"
#include "isa/isa.h"
#include "isa/layout.h"
#include "sim/config/chip_config.h"

namespace npusim::compiler::ops {

// ---- window geometry (TF conventions) ----

// One spatial dimension of a window op: input size, window size, stride, dilation, padding and
// the output size, after TF (tensorflow/core/framework/kernel_shape_util.cc):
//   VALID:    out = ceil((in - dk + 1) / s), no padding (dk = (k - 1) * d + 1)
//   SAME:     out = ceil(in / s), pad_total = max((out - 1) * s + dk - in, 0),
//             before = pad_total / 2, after = pad_total - before
//   EXPLICIT: out = (in + before + after - dk) / s + 1
struct WindowDim {
  int64_t in = 0, k = 1, s = 1, d = 1, before = 0, after = 0, out = 0;
  int64_t extent() const { return (k - 1) * d + 1; }  // dilated window size
};

struct ConvWindow {
  WindowDim h, w;
  std::string padding;  // "SAME", "VALID" or "EXPLICIT"
};

// Reads strides, dilations (unless `pooling`: then ksize and no dilations), padding,
// explicit_paddings and data_format (NHWC only) from op for an input of in_h x in_w and a
// window of kh x kw (pooling: read from ksize; pass 0). Fails naming the attribute on anything
// unsupported: strides or dilations on N or C, a window larger than the padded input, ...
ConvWindow conv_window(const OpDesc& op, int64_t in_h, int64_t in_w, int64_t kh, int64_t kw,
                       bool pooling);

// ---- the cube convolution kernel ----

// A convolution filter's layout in GM, the op attribute "filter_layout" (the TF plugin's
// "_npusim_filter_layout" on a forward convolution, written by graph rewrite 19's
// MultiTensorCast: docs/graph_engine.md "The forward convolutions' weights in blocks of 16
// output channels"). Absent or "HWIO": TensorFlow's [KH][KW][Cin][Cout]. kFilterLayoutN16:
// the output channels in blocks of 16, block-major, [Cout/16][KH][KW][Cin][16]: element
// (kh, kw, ci, co) at ((co / 16) * KH * KW * Cin + (kh * KW + kw) * Cin + ci) * 16 + co % 16,
// the same bytes as HWIO. A core's n tile of weights is then whole 512-byte fractals, a tap's
// channel blocks one GM run, where HWIO gives it one run per (kh, kw, ci) row of its n-tile
// width. For a Cout that is not a multiple of 16 (no partial block fits the same bytes) the
// layout is HWIO itself: the cast writes such a member as HWIO and the convolutions read it
// so; the attribute then never needs the filter's shape where it is written (graph rewrite 19b
// may not know it). Grouped filters: the same layout over the whole Cout (conv2d.cpp
// n16_filter_read: groups of whole blocks read it in place, others an HWIO copy).
inline constexpr const char* kFilterLayoutN16 = "N16_HWI16";
// Whether op's attribute "filter_layout" names kFilterLayoutN16 (CompileError naming op for
// any value but that and "HWIO").
bool filter_layout_n16(const OpDesc& op);
// The element offset of filter element (kh, kw, ci, co) of an HWIO-shaped filter `f` in
// kFilterLayoutN16 (Cout a multiple of 16).
inline int64_t filter_n16_offset(const std::vector<int64_t>& f, int64_t kh, int64_t kw, int64_t ci,
                                 int64_t co) {
  return ((co / 16) * f[0] * f[1] * f[2] + (kh * f[1] + kw) * f[2] + ci) * 16 + co % 16;
}

// What the kernel computes, for every image i, group g and output position m = oh * OW + ow:
//   y[i][m][g * cg_out + n] = sum_k img2col(x[i], channels of group g)[m][k] * B_g[k][n]
// with k = ((c1 * KH + kh) * KW + kw) * 16 + c0 over the group's input channels
// c = c1 * 16 + c0 (load3d's column order) and n < cg_out. The feature map is x, NHWC
// [images][hs][ws][cs] in GM; with zero insertion (up_h, up_w > 1) the kernel convolves the
// virtual map of (hs - 1) * up_h + 1 rows and (ws - 1) * up_w + 1 columns holding x[u / up_h]
// [v / up_w] where both divide and 0 elsewhere, followed by ext_h zero rows and ext_w zero
// columns. Geometry (kh .. pr) is over that virtual map.
struct CubeConvSpec {
  isa::Dtype in_type = isa::Dtype::F16;   // cube input: f16 or bf16 (x and w)
  isa::Dtype out_type = isa::Dtype::F16;  // FIXPIPE output: f32, f16 or bf16
  int64_t images = 1, hs = 1, ws = 1, cs = 1;
  int64_t up_h = 1, up_w = 1;
  int64_t ext_h = 0, ext_w = 0;  // zero rows / columns appended to the virtual map
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pb = 0, pl = 0, pr = 0;
  int64_t groups = 1;
  int64_t cg_in = 1;          // input channels per group (group g: [g * cg_in, min(cs, ...)))
  int64_t cg_out = 1;         // output channels per group
  int64_t cy = 1;             // output channels in total; the last group may be partial
  int64_t y_pitch = 0;        // y's row pitch in elements, >= cy (0: cy); through the UB (coupled
                              // chips) pitch and group_pitch() must be whole 32-byte blocks
  int64_t y_group_pitch = 0;  // elements from one group's first channel in a row of y to the
                              // next group's, >= cg_out (0: cg_out)
  // Weights B_g[k][n] for k-block (c1, kh, kw), element c0 of the block, column n: the weight
  // element at w + g * b_group + tap * b_tap + ... (elements), tap = kh * KW + kw, or the
  // flipped tap (KH-1-kh) * KW + (KW-1-kw) when b_flip. Either
  //   kRowsK: ... + (c1 * 16 + c0) * b_row + n  (rows are input channels, e.g. HWIO), or
  //   kRowsN: ... + n * b_row + c1 * 16 + c0    (rows are output channels, e.g. HWIO read as
  //                                              the transposed filter of the input gradient).
  enum class BMode { kRowsK, kRowsN };
  BMode b_mode = BMode::kRowsK;
  bool b_flip = false;
  int64_t b_group = 0, b_tap = 0, b_row = 0;
  // The stride-packed view of ops/conv2d.cpp (kRowsK, no flip or block-diagonal packing,
  // cg_in <= 16: one k-block a tap): B's taps are not KW * b_tap apart from one row of taps to
  // the next but b_tap_row (elements): tap (kh, kw) at kh * b_tap_row + kw * b_tap (0: KW *
  // b_tap, the plain formula above). b_last_col_rows (> 0): the k-blocks of the last column of
  // taps (kw = KW - 1) hold only their first b_last_col_rows rows (input channels) of B, the
  // rows after them are zero (not read): the last packed pixel of a window of odd width holds
  // fewer real taps than sw.
  int64_t b_tap_row = 0, b_last_col_rows = 0;
  // A filter in kFilterLayoutN16: its output channels in blocks of 16, block j at j * b_nblock
  // (elements), b_row = 16. kRowsK (the forward convolutions): B's column n at (n / 16) *
  // b_nblock + n % 16 instead of n, so that one k-block's 16 x 16 fractal of a column block is
  // 512 contiguous bytes and a chunk's channel blocks of one tap are one run; needs no flip and
  // whole 16-column blocks of n (cy a multiple of 16). kRowsN (the input gradient, flipped): B's
  // k-block c1 at c1 * b_nblock instead of c1 * 16, so that a k-block's n rows of 16 are one
  // run of n x 32 bytes; needs whole 16-row k-blocks (cg_in a multiple of 16). Groups: group
  // g's blocks start at g * b_group, so each group's blocked dimension (kRowsK n: cg_out,
  // kRowsN k: cg_in) is whole blocks. Neither takes block-diagonal packing (checked by the
  // tiling). 0: HWIO.
  int64_t b_nblock = 0;
  // Block-diagonal groups (the depthwise convolutions' several 16-channel groups per step):
  // B_g is zero but for its c1_in() diagonal blocks, block j being channel block j's rows
  // (16 input channels, all taps) by columns [j * bd, (j + 1) * bd), bd = cg_out / c1_in()
  // (a multiple of 16): B_g[k][j * bd + n] at w + (g * c1_in() + j) * b_group + tap * b_tap +
  // c0 * b_row + n (kRowsK, no flip, no bias), so b_group is one block's stride. The kernel
  // multiplies each channel block into its own column block of the tile (one n tile per
  // group) and loads only the blocks, not the zeros.
  bool b_diagonal = false;
  // Tile order across the cube cores (CubeConvTiling::spatial_major): false, weight-key-major
  // (each core walks a (group, n tile) over the positions: few weight loads); true,
  // position-major (each core walks its positions and, at each, every (group, n tile)), so
  // that the first reads of x, which fill whole L2 lines holding every group's channels, are
  // spread over the launch rather than all at its start. Used where there are several keys.
  bool tiles_spatial_major = false;
  // The tallest output tile the planner may choose (output positions; 0: kMaxTile, 256, as
  // MatMul's). The depthwise convolutions allow taller ones: their k is one group's taps (144
  // for 3x3), so a tile's cube work is small beside its per-tile costs (a slab load whose
  // landing holds MTE2, the flag hand-overs), and a taller tile pays those once for more
  // positions and reloads fewer halo rows; L0C, the UB, L1 and the instruction fields still
  // bound it (plan_cube_conv).
  int64_t max_tile_height = 0;
  // Epilogue: bias adds an f32 [cy] argument "bias" (after y) to every output position, through
  // the bias table (mmad init 2 on a tile's first step; groups == 1 only, and the argument must
  // be readable in whole 32-byte blocks: a workspace slice); relu applies max(y, 0) in FIXPIPE.
  bool bias = false, relu = false;
  // Batch norm at inference in the way out through the UB (coupled chips, where L0C -> UB
  // passes the vector unit): FIXPIPE writes the tile to the UB as f32, the vector unit computes
  // y = y * a[c] + shift[c] and the activation `act` on it and rounds it once to out_type, MTE3
  // stores it. a and shift are f32 [cy] arguments "a" and "shift" (after y and bias, readable
  // in whole 32-byte blocks: a workspace slice), loaded into the UB once per block. Needs
  // the UB path (not with bias or bn_stats); groups' and tiles' first channels are multiples
  // of 8 (whole f32 blocks).
  bool bn_affine = false;
  bool bn_a_in_filter = false;  // bn_affine with a folded into w: y = y + shift[c] (a unread)
  // bn_affine with a residual (CANN's Conv2D + BNInference + Add, the projection of a residual
  // block): argument "residual" (after a and shift), out_type with y's shape and pitch (y
  // dense: pitch() == cy), added to each tile after the rounding to out_type, in out_type,
  // before `act`. Not with stacked images (a tile's rows are one run of y's rows).
  bool residual = false;
  // bn_affine through the UB with y's rows cy channels unpadded though cy * size is not whole
  // 32-byte blocks (24 f16 channels: 48 bytes), where the whole tile is: one group, cy <= 32
  // (the replicated tables: ConvBnTables::dense), one n tile of every channel, one image per
  // tile, every tile's rows * cy * size whole blocks (oh * ow * cy * size and 16 * cy * size
  // are). The epilogue packs the tile's f32 rows to cy lanes, rounds them as one run and MTE3
  // stores the tile as one contiguous run of y (CubePipeline::ChannelAffine::packed); a
  // residual is loaded the same way.
  bool y_packed = false;
  Activation act = Activation::kNone;
  // Batch-norm statistics (CANN's Conv2D + BNTrainingReduce fusion; split chips only): the
  // kernel becomes a mix kernel whose vector cores, once every cube core has stored its tiles,
  // read y back (from the L2 it was just written to) and sum its channels: per vector core f32
  // partials of sum y^2 and sum y (ops/channel.h's sums as a section, workspace arguments
  // "partials" and "partials2" after y and bias), then after a barrier of the vector cores
  // fold the partials pairwise (BNTrainingReduce's epilogue in the kernel) into the
  // arguments "output0" (sum, f32 [cy]) and "output1" (square_sum). y dense (pitch() == cy),
  // its pixels whole 32-byte blocks.
  bool bn_stats = false;
  // bn_stats: the vector cores one per cube core unless NPUSIM_MIX_ONE_TO_ONE says otherwise
  // (mix_one_to_one_asked: the op's caller's choice; mix_one_to_one_enabled's by_default).
  bool bn_stats_one_to_one_by_default = false;
  // With bn_stats, unstacked tiles and one group: the vector cores sum each tile as their cube
  // core stores it (bn_stats_per_tile, the default) rather than all of y after a barrier of
  // the cube cores: after each tile's FIXPIPE the cube core hands the tile to its vector cores
  // (cross-core flag, mode 2), each of which sums its ceil(rows / aiv_per_aic) of the tile's
  // rows into per-channel
  // running sums over all cy channels while the cube computes the next tiles; a vector core
  // hands each tile back once it has taken it, and the cube core waits for that before it
  // hands over a tile more than cross_core_max_pending / aiv_per_aic tiles ahead (the flag
  // counters' bound). Partials: one row per vector core of the launch (zeros for channels its
  // tiles do not cover), then after a barrier of the vector cores their rows folded pairwise
  // per 64-channel tile into output0 and output1 (not BNTrainingReduce's block-order epilogue).
  bool bn_stats_per_tile = true;
  // x's element strides in GM between pixels, rows and images (0: NHWC of hs x ws x cs, the
  // default). Other strides view x differently, e.g. the width fold of ops/conv2d.cpp: pixels
  // cin apart holding kw * cin channels (overlapping windows). No zero insertion or stacking.
  int64_t x_pixel = 0, x_row = 0, x_image = 0;
  // Strided y (the strided input gradient of ops/conv2d.cpp): y_strided.run_rows > 0 (= ow)
  // places y's positions as StridedRows says (a run: one row of y; a group: an image; the row
  // pitch pitch()), argument "y" of y_strided.elements elements, a tile leaving L0C by
  // store_strided_rows; with y_zero_fill the launch's vector cores write zeros to every other
  // element of y (emit_strided_zeros). FIXPIPE to GM, one group, unstacked tiles, no bias,
  // batch norm or residual.
  StridedRows y_strided;
  bool y_zero_fill = false;
  std::string name;  // kernel name

  int64_t hv() const { return (hs - 1) * up_h + 1 + ext_h; }
  int64_t wv() const { return (ws - 1) * up_w + 1 + ext_w; }
  int64_t oh() const { return (hv() + pt + pb - (kh - 1) * dh - 1) / sh + 1; }
  int64_t ow() const { return (wv() + pl + pr - (kw - 1) * dw - 1) / sw + 1; }
  int64_t c1_in() const { return (cg_in + 15) / 16; }  // channel blocks of a full group
  // The columns one k-block of B reaches: a diagonal block's, or all of a group's.
  int64_t b_cols(int64_t tn16) const { return b_diagonal ? cg_out / c1_in() : tn16; }
  int64_t pitch() const { return y_pitch ? y_pitch : cy; }
  int64_t group_pitch() const { return y_group_pitch ? y_group_pitch : cg_out; }
};

// bn_affine's UB tables for tiles tn wide (each of a and shift): the plain table, f32 per
// channel with 64 lanes of slack (the last column group's masked lanes); and for narrow tiles
// (dense: every tile's f32 rows exactly `width` = 16 or 32 lanes, its output rows whole blocks
// of that width) the replicated table, 256 bytes per `width` channels holding them 64 / width
// times, so that one 64-lane repeat covers 64 / width rows of the tile.
// Else, for tiles whose f32 rows (width = tn16 lanes, not a multiple of 64) are rounded into
// a narrower output (one group: tile t holds channels [t * width, (t + 1) * width)), the
// periodic table: per n tile `period` = lcm(width, 64) lanes holding its channels period /
// width times, so that the tile's f32 lanes, taken as runs of every (period / 64)-th repeat,
// meet the same 64 table lanes in every repeat of a run (CubePipeline::ChannelAffine::period:
// a pass costs rows * width / 64 repeats, not rows * ceil(width / 64)); the plain table then
// has room for every n tile's width channels.
struct ConvBnTables {
  bool dense = false;
  int64_t width = 0;                       // dense or period: the tiles' row width in f32 lanes
  int64_t period = 0;                      // the periodic table's lanes per n tile (0: none)
  int64_t plain_bytes = 0, rep_bytes = 0;  // each of a and shift
};
ConvBnTables conv_bn_tables(const CubeConvSpec& s, int64_t tn);

// Whether s (its out_type the output's) can be written with CubeConvSpec::y_packed: the
// batch norm in the epilogue, one group, y unpadded with rows that are not whole 32-byte
// blocks, at most 32 channels (the dense tables) whose f32 rows are whole blocks, and every
// tile of 16 * j rows of one image whole blocks. The UB path is the caller's to check.
bool conv_y_packable(const CubeConvSpec& s);

// The tiling: tiles of tm output positions x tn output channels (within one group); k in chunks
// of kc1 channel blocks (all taps); one L0C buffer per tile.
// Stacking (stack > 1, convolutions without zero insertion): `stack` consecutive images form one
// tall map, image j's rows at j * period (period = Hv + gap zero rows, a multiple of sh, the gap
// covering the window's overhang past an image on both sides), so a tile's positions run across
// images and only the boundary between images (period / sh - OH output rows) is padding, not
// every image's positions rounded up to 16. Output row j * period / sh + oh of the tall map is
// row oh of image j; the rows between images are computed and dropped. The last stack may hold
// fewer images (missing images read zeros, their rows are dropped).
struct CubeConvTiling {
  int64_t stack = 1;       // images per tall map
  int64_t period = 0;      // tall map rows per image (Hv when stack == 1)
  int64_t stacks = 0;      // ceil(images / stack)
  int64_t tall_oh = 0;     // output rows of one tall map
  int64_t tm = 0, tn = 0;  // output tile (multiples of 16)
  int64_t tk0 = 0;         // k per mmad (multiple of 16); two L0A and two L0B buffers
  int64_t kc1 = 0;         // channel blocks per k chunk
  int64_t chunks = 0;      // k chunks per tile
  bool resident = false;   // the whole B of a (group, n tile) stays in L1 (loaded chunk by
                           // chunk during the first tile that needs it); else each step
                           // streams its chunk of B with the slab
  int64_t m_tiles = 0, n_tiles = 0, tiles = 0;  // tiles = groups * n_tiles * stacks * m_tiles
  // Tile index order: key-major ((key * stacks + stack) * m_tiles + m tile, key = group *
  // n_tiles + n tile) or, spatial_major, ((stack * m_tiles + m tile) * keys + key), keys =
  // groups * n_tiles (CubeConvSpec::tiles_spatial_major with more than one key; weights then
  // streamed, never resident).
  bool spatial_major = false;
  int64_t keys = 1;        // groups * n_tiles
  int64_t slab_rows = 0;   // the most input rows one tile's feature-map slab spans
  int64_t slab_bytes = 0;  // one slab buffer in L1 (two are allocated)
  // A dense slab is loaded by one nd2nz of whole pixels, not one per plane (dense_slab_load,
  // SlabEmitter::Geometry::whole_pixels).
  bool whole_pixels = false;
  // kRowsN weights (the input gradient's transposed filter) by tap: one nd2nz per tap of the
  // chunk's channels (rows of 16 * ncb channels, one GM run per row) instead of one per
  // (16 channels, tap) (a 32-byte run per row); the chunk's k-block (c, tap) then lies at
  // fractal (tap * ncb + c) * nb of its B in L1 and each mmad step loads L0B per k-block
  // (weight_loads_switch, Candidate::weight_load).
  bool weights_by_tap = false;
  // A strided view of x (CubeConvSpec::x_row, SlabEmitter::strided_blocks) loaded per pixel:
  // one copy of the pixel's planes (one GM run) instead of per plane and row or per plane and
  // column (conv_strided_slab_switch, SlabEmitter::Geometry::strided_by_pixel).
  bool strided_pixels = false;
  int64_t b_bytes = 0;     // one weight buffer in L1 (resident: one; chunked: two)
  int l0c_buffers = 1;
  int block_dim = 0;
  int64_t tiles_per_block = 0;  // block b takes tiles [b * per, min(tiles, (b + 1) * per))
  double est_cycles = 0;  // the planner's estimate: the busiest core's, plus the launch's HBM time
  std::string str() const;
};

// The spec s of groups of one 16-channel block with block-diagonal weights (the depthwise
// convolutions' 16-channel groups: cg_in == 16, B_g the group's 16 x cg_out block at
// w + g * b_group) with `per` of its groups in each group (CubeConvSpec::b_diagonal for per
// > 1, the same b_group: one block's stride), so that one kernel step serves `per` of them;
// CompileError (naming op) unless s has such groups.
CubeConvSpec merge_diagonal_groups(const CubeConvSpec& s, int64_t per, const std::string& op);

// One step of the convolution's pipeline (a k chunk of a tile) as the kernel issues it
// (ConvEmitter, CubePipeline), for conv_step_period: MTE2's slab (slab_insns nd2nz moving
// slab_flow cycles of data in all) and, where the step loads weights, weight_insns nd2nz
// (weight_flow cycles), in the load stage (weights_in_load) or in the compute stage (resident
// weights on chips whose tiles leave through the UB), their data landing `latency` cycles after
// the last byte; then mmad_steps steps of MTE1's moves (mte1 cycles in all) and the cube's mmads
// (cube cycles in all). Scalar cycles: per step (half before each stage), per slab plane, per
// k-block of weights and per mmad step (two thirds before MTE1's moves, a third before the mmad).
struct ConvStepProgram {
  int64_t slab_insns = 0, weight_insns = 0, mmad_steps = 1;
  int64_t slab_batch = 1;  // the slab's instructions walked as one group (each a transfer of n)
  double slab_flow = 0, weight_flow = 0, latency = 0, mte1 = 0, cube = 0;
  bool weights_in_load = true;
  double scalar_step = 0, scalar_plane = 0, scalar_weight_block = 0, scalar_mmad_step = 0;
};

// The period (cycles from one step's last mmad to the next's) of a long run of identical steps
// p on chip cfg, by the kernel's pipeline in program order (KernelBuilder::pipelined_steps:
// iteration t issues load(t), then compute(t - 1)), each pipe taking its queue in order:
//   MTE2  load(t): wait L1 free (t & 1; set by MTE1 at the end of step t - 2), the slab's
//         nd2nz, the weights', set L1 full, which holds MTE2 until its transfers have landed
//         (sync.set_flag_holds_pipe; else only the flag waits for the landing);
//   MTE1  compute(t - 1): wait L1 full (and the weights loaded in the compute stage), then per
//         mmad step (parity q: the count of mmad steps' low bit) wait L0 free q (set by the
//         cube two mmad steps back), load3d and load2d, set L0 full q; at the end set L1 free;
//   M     per mmad step: wait L0 full q, mmad, set L0 free q;
// the scalar unit issuing each instruction after its scalar cycles and stalling while the pipe's
// queue holds issue_queue_depth instructions (so a load of more nd2nz than that holds back the
// compute stage issued after it). Every flag a wait matches is set by an instruction issued
// before it, so one pass in program order times them all; the period is the mean of the last
// four of eight steps.
double conv_step_period(const ChipConfig& cfg, const ConvStepProgram& p);

// A planner's measuring switch `variable`=k in the environment (read at every compile): build
// the plan with the k-th lowest estimate instead of the planner's choice, so that the kernels of
// the candidates can be measured against their estimates. Unset or empty: 0 (the choice);
// anything but a positive count is a CompileError naming op.
int64_t forced_plan_rank(const char* variable, const std::string& op);

// The scalar instructions the kernel issues per plane and image of a stacked slab of `stack`
// images (> 1) besides the image's nd2nz (ConvStepProgram::scalar_plane): ConvEmitter's loop
// over a plane's images spends 17 on the first image's rows (bounds, addresses, count) and 18
// on each later one (its skip test too; 19 where gap rows lie between the stack's images, the
// row offset), and 6 per plane after them (the next plane's addresses, the count, the branch),
// shared by the plane's images.
double stacked_slab_scalar_per_image(int64_t stack, bool gap_rows);

// Plans whose estimates (CubeConvTiling::est_cycles) are within this fraction of the lowest
// count as equal: the planner's model cannot tell them apart (docs/compiler.md).
constexpr double kPlanTieBand = 0.005;

// Chooses the tiling for the cube cores of cfg; CompileError (naming op) if nothing fits or a
// geometry field exceeds the ISA (kernel > 255, stride or dilation > 15, padding > 255).
// stack > 0 restricts the choice to tilings stacking that many images (for tests and tools;
// CompileError if that stacking is impossible: zero insertion, or more than the images).
CubeConvTiling plan_cube_conv(const CubeConvSpec& s, const ChipConfig& cfg, const std::string& op,
                              int64_t stack = 0);

// The tiling t with kc1 channel blocks per k chunk and resident or streamed weights (sizes
// and k per mmad recomputed); CompileError if it does not fit. For tests and tools that
// exercise a particular kernel shape.
CubeConvTiling rechunk_cube_conv(const CubeConvSpec& s, CubeConvTiling t, int64_t kc1,
                                 bool resident, const ChipConfig& cfg, const std::string& op);

// The kernel. Arguments: x (the feature map), w (the weights), y (the output) [, bias]
// [, partials, partials2, sum, square_sum]. With bn_stats, *stats_blocks (if given) is set to
// the vector blocks that write partials ([stats_blocks][cy] f32 each).
Launch build_cube_conv(const CubeConvSpec& s, const CubeConvTiling& t, const ChipConfig& cfg,
                       const std::string& op, int* stats_blocks = nullptr);
// The convolution's weights loaded in a staggered order (build_cube_conv), for a chip that
// serialises reads of one L2 line by several cores (memory.l2.line_read_bytes_per_cycle R > 0;
// docs/validation.md "The convolutions' shared loads staggered"): the blocks that load one weight
// key's chunk at once (resident weights at their first tile of the key, streamed ones every
// step) would read its rows in the same order. Staggered, a chunk's k-blocks (one nd2nz each:
// n = channel blocks x taps of them) are loaded from k-block block_id % n on, wrapping, each to
// the place the loop in order gives it; by tap (CubeConvTiling::weights_by_tap) the taps from
// block_id % taps on; a forward filter in blocks of 16 columns (CubeConvSpec::b_nblock, kRowsK:
// a copy per (column block, tap)) its nb x taps pairs from block_id % (nb x taps) on. The same
// bytes land in L1 before MTE1 reads them (the chunk's flag), so the mmads and their bits are
// unchanged. True where R > 0, with more than one block, unless the filter is the stride-packed
// blocked view (b_tap_row: its taps unrolled), blocked with a group's channels no whole blocks
// of 16, or a by-tap load has one tap, and not under
// NPUSIM_CONV_STAGGERED_LOADS=0 (another value: a CompileError naming op).
bool conv_staggered_weights(const CubeConvSpec& s, const CubeConvTiling& t, const ChipConfig& cfg,
                            const std::string& op);

// ---- the cube img2col kernel ----

// Writes the img2col matrix of x (NHWC, geometry as above without zero insertion, groups of
// 16 channels) to GM: for image i, position m, tap (kh, kw) and channel c, the values
// x[i][oh*sh - pt + kh*dh][ow*sw - pl + kw*dw][c] (0 in the padding), each repeated `rep`
// times, at
//   out + ((i * OH*OW + m) * row_stride + tap * tap_stride + c * rep + r)  (elements).
// It runs load3d (one tap, one 16-channel block at a time) and multiplies by a 16 x 16*rep
// 0/1 matrix on the cube (the only way from L0A back to GM), so the values are exact; FIXPIPE
// writes them as out_type. Arguments (bind them): x, out, rep (img2col_rep_bytes of workspace:
// each block fills a copy of its own with the 0/1 matrix by scalar stores and reads only that
// copy, so no block touches bytes another writes). Output columns of a position that no channel
// maps to are not written.
struct Img2colSpec {
  isa::Dtype in_type = isa::Dtype::F16, out_type = isa::Dtype::F16;
  int64_t images = 1, h = 1, w = 1, c = 1;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pb = 0, pl = 0, pr = 0;
  int64_t rep = 1;
  int64_t row_stride = 0, tap_stride = 0;
  // x's element strides between pixels, rows and images (0: NHWC of h x w x c), as
  // CubeConvSpec's: e.g. the width fold of ops/conv2d.cpp (pixels c_orig apart holding
  // kw * c_orig channels), whose img2col matrix is the unfolded one's, column for column.
  int64_t x_pixel = 0, x_row = 0, x_image = 0;
  int64_t oh() const { return (h + pt + pb - (kh - 1) * dh - 1) / sh + 1; }
  int64_t ow() const { return (w + pl + pr - (kw - 1) * dw - 1) / sw + 1; }
};
Launch build_img2col(const Img2colSpec& s, const ChipConfig& cfg, const std::string& op);
// The bytes of one block's copy of the repetition matrix (a 16 x 16*rep fp16 matrix in the Zn
// layout), and of the "rep" workspace of an img2col launch of block_dim blocks.
inline uint64_t img2col_rep_copy_bytes(int64_t rep) {
  return layout::kFractalBytes * static_cast<uint64_t>(rep);
}
inline uint64_t img2col_rep_bytes(int64_t rep, int block_dim) {
  return img2col_rep_copy_bytes(rep) * static_cast<uint64_t>(block_dim);
}

// ---- the filter gradient's fused kernel ----

// dW = img2col(x)^T x dy on the cube, img2col never in GM: per output tile (tk rows of
// img2col's columns in load3d's order (c1, kh, kw, c0) x tn output channels) and per chunk of
// tp output positions of one image, MTE2 loads the chunk's slab of x (the tile's channel
// blocks) and its dy rows into L1, load3dt writes the slab's img2col window transposed into
// L0A (A: tk x positions), load2d dy's fractals into L0B (B: positions x tn), and mmad sums over
// the positions. The tile's rows go out as out_type, each 16-row block (one channel block c1 of one
// tap) to its HWIO rows:
//   out + ((part * KH*KW*C + tap * C + c1 * 16 + c0) * pitch + n) * size  (c1 * 16 + c0 < C)
// where the chunks (image, m tile), image-major, are cut into `parts` equal ranges, each its own
// partial product (the k split), summed by the caller. x may be a strided view (x_pixel, x_row,
// x_image as Img2colSpec: the width fold; HWIO rows tap * C + c are then the unfolded rows).
// Grouped (groups > 1, x dense NHWC): x has groups * c channels and dy cout = groups * cg
// channels; group g multiplies img2col of x's channels [g * c, (g + 1) * c) by dy's channels
// [g * cg, (g + 1) * cg) into those columns of out (each tile: one group's rows and columns).
// Arguments (bind them): x, dy ([images][OH*OW][cout], the same type), out.
struct FilterGradSpec {
  isa::Dtype in_type = isa::Dtype::F16;  // 16-bit (load3dt)
  int64_t images = 1, h = 1, w = 1, c = 1, cout = 1;
  int64_t groups = 1;  // c: one group's input channels (the filter's Cin); cout all groups'
  int64_t cg_out() const { return cout / groups; }
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pb = 0, pl = 0, pr = 0;
  int64_t x_pixel = 0, x_row = 0, x_image = 0;
  // Elements from one pixel of a dense x to the next where that is not groups * c: the row view
  // of a 1x1-wide window of stride sw along W (plan_fused_filter_grad), x [N,H,W,C] read as the
  // dense map [N,H,W/sw,sw*C] whose pixels' first c channels are x's strided pixels, the
  // window's stride along W then 1. 0: groups * c.
  int64_t pixel_channels = 0;
  int64_t x_channels() const { return pixel_channels != 0 ? pixel_channels : groups * c; }
  int64_t parts = 1;  // must divide the chunks (plan_filter_grad skips chunk sizes it does not)
  int64_t pitch = 0;  // elements per output row (>= cout; whole 32-byte blocks via the UB)
  // Grouped: elements from one group's first column in a row of out to the next group's
  // (>= cg_out(); 0: cg_out()), so that through the UB each group's columns are whole blocks.
  int64_t group_pitch = 0;
  isa::Dtype out_type = isa::Dtype::F32;  // or f16 / bf16 (FIXPIPE rounds to nearest even)
  // Split chips, parts > 1, out f32 without padding (pitch = cout): the launch's vector cores
  // add the parts' products after a barrier of its cube cores (a mix kernel, fifth argument dw
  // of dw_type, f32 or f16, the sums rounded to nearest even) instead of a Sum launch.
  bool add_parts = false;
  isa::Dtype dw_type = isa::Dtype::F32;
  // add_parts: the vector cores one per cube core unless NPUSIM_MIX_ONE_TO_ONE says otherwise
  // (mix_one_to_one_asked: the op's caller's choice; mix_one_to_one_enabled's by_default).
  bool one_to_one_by_default = false;
  int64_t oh() const { return (h + pt + pb - (kh - 1) * dh - 1) / sh + 1; }
  int64_t ow() const { return (w + pl + pr - (kw - 1) * dw - 1) / sw + 1; }
};
// The kernel's tiling and its modelled cycles on the busiest cube core (plan_filter_grad).
struct FilterGradTiling {
  int64_t tk = 0, tn = 0, tp = 0, ks = 0;  // tile rows, tile channels, chunk positions, L0 k step
  int64_t kc1 = 0, slab_rows = 0, slab_bytes = 0;  // slab planes and rows (largest), L1 bytes
  int64_t k_tiles = 0, n_tiles = 0, m_tiles = 0, tiles = 0, chunks = 0, per = 0;  // n: per group
  int block_dim = 0, l0c_buffers = 0;
  bool whole_pixels = false;  // the slab by one nd2nz of whole pixels (dense_slab_load)
  // The strided view of x (SlabEmitter::strided_blocks) loaded per pixel at every chunk
  // (SlabEmitter::Geometry::strided_by_pixel; strided_slab_switch).
  bool strided_pixels = false;
  // dy's rows of a chunk in staggered parts (filter_grad_dy_part_blocks): 16-row blocks a part;
  // 0: one nd2nz a chunk.
  int64_t dy_part_blocks = 0;
  double cycles = 0;
};
// The filter gradient's dy rows loaded in staggered parts, for a chip that serialises reads of
// one L2 line by several cores (memory.l2.line_read_bytes_per_cycle R > 0; docs/validation.md
// "The convolutions' shared loads staggered"). The cores running the k tiles of the weight keys
// whose channels share an L2 line (readers: up to min(block_dim, ceil(k_tiles x those keys /
// per))) load the same chunk's dy lines at the same step: in one nd2nz each, every core reads
// each line at R / readers. Staggered, the
// chunk's rows [0, m_act) are cut into parts of P = 16 x dy_part_blocks rows, part j an nd2nz
// of its rows into its own NZ block of the dy buffer (at j x P x tn elements, column blocks P
// rows apart, rows past the chunk zero), and core b loads them from part b % n on (n =
// ceil(m_act / P), wrapping: shared_read_part_at), so that cores in step read different
// parts. The L0 steps read each 16 positions' fractals from their part: L0B holds the same
// values, the mmad sequence and its accumulation order are unchanged, so are the bits. The
// part size is the one of least estimated cycles for the chunk's rows: per part the longer of
// the DMA's issue (copy_issue_estimate) and its bytes at min(the core's L2 read port, R /
// ceil(readers / parts)), against one load's (R / readers). Returns 0 (one nd2nz a chunk) where
// R = 0, with one reader, one row block, where splitting is estimated no faster, or under
// NPUSIM_CONV_STAGGERED_LOADS=0 (read at every compile; unset or "1" on, another value a
// CompileError naming op).
int64_t filter_grad_dy_part_blocks(const FilterGradSpec& s, const FilterGradTiling& t,
                                   const ChipConfig& cfg, const std::string& op);
// NPUSIM_CONV_STAGGERED_LOADS: whether the convolutions may load their shared operands in
// staggered parts (unset or "1" yes, "0" no; anything else a CompileError naming op).
bool conv_staggered_loads_enabled(const std::string& op);
// The mix kernels whose vector cores are little busy, which NPUSIM_MIX_ONE_TO_ONE may run one
// vector core per cube core (KernelBuilder::set_aiv_per_aic(1), Ascend C
// KERNEL_TYPE_MIX_AIC_1_1), leaving the other vector core of each group free for concurrent
// launches: the filter gradient that adds its parts (FilterGradSpec::add_parts; named
// `filter_grad` in the switch) and the convolution with batch-norm statistics
// (CubeConvSpec::bn_stats: Conv2DBNTrainingReduce; `bn_reduce`).
enum class OneToOneMix { filter_grad, bn_reduce };
// NPUSIM_MIX_ONE_TO_ONE: whether `kernel` runs 1:1. The switch names the kernels, comma-separated
// ("filter_grad", "bn_reduce", "filter_grad,bn_reduce"); "1" all of them; "0" none; unset:
// `by_default`, the caller's choice (mix_one_to_one_asked, the kernel's spec). Anything else (an
// unknown or empty name, "1" or "0" within a list) a CompileError naming op, the value and the
// names it takes. Read at every compile.
bool mix_one_to_one_enabled(const std::string& op, OneToOneMix kernel, bool by_default = false);
// The compile option kMixOneToOneAttr: whether op's caller asks `kernel` 1:1 where
// NPUSIM_MIX_ONE_TO_ONE is unset. The attribute is a string in the switch's grammar (absent:
// "0"); the TF plugin's NpuGraph plan sets "filter_grad" under NPUSIM_GRAPH_CONCURRENT=1
// (docs/graph_engine.md, "The filter gradients 1:1 under streams"). Being an attribute it is
// part of op.key(), so the kernel cache tells the two apart. A bad value: a CompileError naming
// op, the attribute and the value.
inline constexpr char kMixOneToOneAttr[] = "mix_one_to_one";
bool mix_one_to_one_asked(const OpDesc& op, OneToOneMix kernel);
// Every tiling that fits the cube core, each with its modelled cycles, in the planner's order;
// CompileError naming op if none fits.
std::vector<FilterGradTiling> filter_grad_tilings(const FilterGradSpec& s, const ChipConfig& cfg,
                                                  const std::string& op);
// The cheapest tiling (the first of the lowest modelled cycles); CompileError naming op if none
// fits the cube core.
FilterGradTiling plan_filter_grad(const FilterGradSpec& s, const ChipConfig& cfg,
                                  const std::string& op);
Launch build_filter_grad(const FilterGradSpec& s, const FilterGradTiling& t, const ChipConfig& cfg,
                         const std::string& op);

// ---- launch helpers ----

// Workspace offsets are rounded to this (keeps every workspace tensor 512-byte aligned).
uint64_t workspace_align(uint64_t bytes);

// Reserves `bytes` of the op's workspace; returns the ArgRef of its start.
ArgRef workspace_take(CompiledKernel& k, uint64_t bytes);

// Appends a launch copying a rows x cols matrix stored at src with a row pitch of `pitch`
// elements (type from) densely to dst (type to, converted with RNE when it differs).
void append_strided_copy(CompiledKernel& k, const OpDesc& op, const ArgRef& src, const ArgRef& dst,
                         int64_t rows, int64_t cols, int64_t pitch, DataType from, DataType to,
                         const ChipConfig& cfg);

// Appends a launch copying a [pixels, c] tensor at src to [pixels, cp] at dst (cp >= c, type
// dt). The extra channels of a pixel hold the next pixel's first values (the last pixel's up
// to 30 bytes past the tensor, which kernels may read): layouts where every pixel is whole
// 32-byte blocks, for kernels that keep channels apart and drop the extra ones.
void append_channel_pad(CompiledKernel& k, const OpDesc& op, const ArgRef& src, const ArgRef& dst,
                        int64_t pixels, int64_t c, int64_t cp, DataType dt, const ChipConfig& cfg);

// Rebinds a launch's arguments (in declaration order).
Launch with_args(Launch l, std::vector<ArgRef> args);

inline ArgRef input_ref(int i) { return ArgRef{ArgRef::Kind::kInput, i, 0}; }
inline ArgRef output_ref(int i) { return ArgRef{ArgRef::Kind::kOutput, i, 0}; }

}  // namespace npusim::compiler::ops
