// MatMul's tiling, exposed so tests and tools can see how a config shapes the kernel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "adapter/compiler/ops/registry.h"
#include "isa/isa.h"
#include "sim/config/chip_config.h"

namespace npusim::compiler::ops {

// C (m x n) = A (m x k) * B (k x n) on the cube, A stored k x m if trans_a, B stored n x k if
// trans_b. All sizes in elements.
struct MatmulTiling {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  isa::Dtype in_type = isa::Dtype::F16;   // cube input type (f16, bf16 or f32)
  isa::Dtype out_type = isa::Dtype::F16;  // FIXPIPE output type
  int64_t tm = 0, tn = 0;   // output tile (multiples of 16); one tile = one L0C buffer
  int64_t tk_l0 = 0;        // k per mmad (multiple of 16); two L0A and two L0B buffers
  int64_t tk_l1 = 0;        // k per L1 chunk (multiple of tk_l0); two L1 buffers of A and B
  int l0c_buffers = 1;      // 2: FIXPIPE of a tile overlaps the next tile's mmads
  int64_t tiles_m = 0, tiles_n = 0;
  int block_dim = 0;        // cube cores used: min(cores, tiles)
  bool via_ub = false;      // no l0c->gm path: C leaves L0C through the UB (coupled chips)
  int64_t c_pitch = 0;      // elements per row of C as the cube kernel writes it (n, or n
                            // padded to 32 bytes via the UB; the caller then unpads)
  // Batched products (BatchMatMul): `batch` products; product b (row-major over batch_dims)
  // reads A at element offset sum_d idx_d * a_batch_strides[d] (0 where A broadcasts the dim),
  // B likewise, and writes C at b * m * c_pitch. The tiles of all products are spread over the
  // cube cores together. a_count / b_count: products stored in A / B (typed arguments).
  int64_t batch = 1;
  std::vector<int64_t> batch_dims, a_batch_strides, b_batch_strides;
  int64_t a_count = 1, b_count = 1;
  // MatMulBiasAdd (not batched): C starts from bias[n] (argument "bias", f32 [n], copied
  // L1 -> BT per tile, mmad init 2) and FIXPIPE applies max(C, 0) with relu. Needs the BT.
  bool bias = false, relu = false;
  // MatMulBiasAdd through the UB (coupled chips: via_ub, no BT; not batched; out_type f32 or
  // f16, rounded once after the bias):
  // the argument "bias" (f32 [n]) is loaded once per block into a UB table and the vector unit
  // adds it to each f32 tile in the UB, then applies max(C, 0) with relu (there, not in
  // FIXPIPE), before MTE3 stores
  // the tile (CubePipeline::affine_via_ub). A tile leaves L0C in column bands of at most 64
  // (one f32 repeat's lanes), two band buffers (f32 and output) in turn
  // (ChannelAffine::band_tile_cols), so the UB holds two bands and the table
  // (matmul_bias_ub_bytes) whatever the tile's width.
  bool bias_in_ub = false;
  // Core split (not batched; MatmulCoreSplit): 0 = the default, tiles round-robin over the
  // blocks. Else C is cut into regions of region_tiles_m x region_tiles_n tiles (smaller at the
  // matrix's last row / column of regions), regions_m of them down M; block b computes region
  // (b % regions_m, b / regions_m), its tiles row by row, and block_dim is the region count.
  int64_t region_tiles_m = 0, region_tiles_n = 0, regions_m = 0;
  // Strided C (not batched, C leaving L0C by FIXPIPE to GM; the strided input gradient of
  // ops/conv2d.cpp): c_strided.run_rows > 0 places C's rows as c_strided says (argument "c" of
  // c_strided.elements elements; the elements between untouched), a tile leaving L0C by
  // store_strided_rows. With c_zero_fill the launch's vector cores write zeros to every other
  // element of c while the cube cores compute (emit_strided_zeros; strided_zeros_fit).
  StridedRows c_strided;
  bool c_zero_fill = false;
  // The staggered tile order (round robin only; matmul_stagger_bands): > 0, the tile rows
  // (bands of A) are taken in groups of this many and each group's tiles diagonally
  // (matmul_tile_at), so that the block_dim tiles the cores run at a time read few of the same
  // A bands and B columns; 0, tiles row by row. Set by plan_matmul_tiling.
  int64_t stagger_bands = 0;
  // plan_matmul_tiling's modelled cycles of the busiest cube core for this tiling (its loads
  // with the L2's reuse, mmads, epilogue and pipeline; no task overheads): what callers compare
  // against other kernels' estimates. Where the chip prices the DMA's issue
  // (mte.copy_issue_cycles, burst_cycles), that chooses among the MatMul's own chunks but is not
  // in this estimate, as in no other kernel's: it is the issue-free planner's (the largest
  // chunks').
  double est_cycles = 0;
  // The same with the DMA's issue priced: the cost this tiling was chosen by (est_cycles where
  // the chip does not price the issue or NPUSIM_MATMUL_BURST_CHUNKS=0). What the pointwise
  // filter gradient weighs against the fused kernel's estimate, which prices the issue too
  // (compile_conv2d_backprop_filter).
  double issue_est_cycles = 0;
  // "128x128x1024 AB f16->f16: tiles 64x128 (2x1 = 2 over 2 blocks), k 128 per mmad, ..."
  std::string str() const;
};

// Chooses the tiling for the cube cores of cfg (sizes from their L1/L0A/L0B/L0C capacities,
// core count, cube shape and the gm->l1 rate). op names the op in errors (CompileError when no
// tile fits).
// batch: independent products of this size (BatchMatMul), counted in the cost model's waves.
// any_side: tile sides may be any multiple of 16 up to 256, not only powers of two (so that a
// few tiles can be cut into one per cube core; MatMul itself keeps the powers of two).
// bias: L1 also holds two bias rows of the tile (MatmulTiling::bias).
// bias_in_ub: the bias is added in the UB (MatmulTiling::bias_in_ub): tiles whose UB buffers
// (matmul_bias_ub_bytes) do not fit are skipped.
// split (batch 1): the fixed per-core split apply_matmul_core_split then applies: only tiles
// whose sides divide the split's, costed as the busiest core computing one whole region with
// the regions' cores sharing the memory; where no tile divides the split, the plan without it
// (apply_matmul_core_split then names the mismatch).
struct MatmulCoreSplit;
MatmulTiling plan_matmul_tiling(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                                isa::Dtype in_type, isa::Dtype out_type, const ChipConfig& cfg,
                                const std::string& op, int64_t batch = 1, bool any_side = false,
                                bool bias = false, bool bias_in_ub = false,
                                const MatmulCoreSplit* split = nullptr);

// UB bytes of MatmulTiling::bias_in_ub for a tm x tn tile, output elements of osz bytes and n
// columns: two column bands (matmul_bias_band_cols) as f32 and as the output type, and the
// bias table.
int64_t matmul_bias_ub_bytes(int64_t tm, int64_t tn, int64_t osz, int64_t n);
// Columns per band of MatmulTiling::bias_in_ub: min(tn, 64), one f32 repeat's lanes.
int64_t matmul_bias_band_cols(int64_t tn);

// A fixed per-core split of C, as hand-written Ascend C kernels give their blocks (singleCoreM x
// singleCoreN elements of C per cube core; the last row / column of regions takes what is
// left). `split` is "MxN" in elements (e.g. "2048x1536"); empty: no change, MatMul spreads its
// tiles round-robin. MatMul takes it from NPUSIM_MATMUL_CORE_SPLIT in the environment (read
// once per process, matmul_core_split_from_env), to time npusim's MatMul under a measured
// kernel's work split (docs/validation.md); the compiler never chooses it. Applies to unbatched
// products (batch 1; others unchanged); sets the region fields and block_dim of `t`. Errors
// (CompileError naming the op): a malformed value, a split whose sides are not multiples of
// the tile's, more regions than cube cores.
void apply_matmul_core_split(MatmulTiling& t, const std::string& split, const ChipConfig& cfg,
                             const std::string& op);
const std::string& matmul_core_split_from_env();
// A split "MxN" parsed: elements of C per cube core (0 x 0: the value is empty, no split).
// A malformed value is a CompileError naming op.
struct MatmulCoreSplit {
  int64_t m = 0, n = 0;
  bool empty() const { return m == 0; }
};
MatmulCoreSplit parse_matmul_core_split(const std::string& split, const std::string& op);

// The staggered tile order (MatmulTiling::stagger_bands), for a chip that serialises reads of
// one L2 line by several cores (memory.l2.line_read_bytes_per_cycle R > 0; docs/validation.md
// "The MatMul's cores on staggered tiles"). With round-robin tiles the block_dim cores run
// tiles block_dim consecutive in row-major order at a time, which share one or two bands of A:
// up to tiles_n cores load the same A chunk together, each at R / (their count). The staggered
// order keeps each block's tile count (tile index block + j x block_dim) and maps the index to
// tile coordinates so that at most `sharers` = max(1, floor(R / memory.l2.core_read_bytes_per_
// cycle)) of the cores running together read one band of A (a line read by that many still
// serves each at its port's rate), and few one column of B: groups of g = floor(tiles_m /
// floor(tiles_m / ceil(block_dim / sharers))) bands (the last also the remainder), and within a
// group of `bands` bands tile u at band u % bands, column (u / bands + u % bands) % tiles_n. Each group's tiles read its
// bands and all of B, so the L2 holds g bands of A where row by row holds one. Returns 0 (row
// by row) where R = 0, with one core, one tile row or column, a core split, or under
// NPUSIM_MATMUL_STAGGERED_TILES=0 (read at every compile). The accumulation order in k is
// unchanged: the same bits either way.
int64_t matmul_stagger_bands(const MatmulTiling& t, const ChipConfig& cfg);
// Tile coordinates (tile row, tile column) of tile index `tile` (0 .. tiles_m x tiles_n - 1)
// of one product under t's order: row by row, or staggered (stagger_bands). The kernel's own
// order (the emitter computes the same on the scalar unit).
struct MatmulTileCoord {
  int64_t m = 0, n = 0;
};
MatmulTileCoord matmul_tile_at(const MatmulTiling& t, int64_t tile);

// The cube kernel of a tiling, for families that multiply operands they prepared themselves
// (e.g. Conv2DBackpropFilter: img2col^T x dy). Arguments a, b, c (bind Launch::args); C is
// written with rows of t.c_pitch elements.
Launch build_matmul_launch(const MatmulTiling& t, const ChipConfig& cfg, const std::string& op);

// C = op(A) x op(B), optionally batched, as MatMul compiles it (precision modes, f32 input
// casts into the workspace, FIXPIPE output type, C through the workspace where its rows are
// padded, zeros for k = 0, an f32 vector Mul for k = 1 under allow_fp32_to_fp16), shared by
// MatMul and BatchMatMulV2. The batch fields are those of MatmulTiling (empty batch_dims: one
// product).
struct MatmulProblem {
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  std::vector<int64_t> batch_dims, a_batch_strides, b_batch_strides;
  int64_t a_count = 1, b_count = 1;
  // MatMulBiasAdd: input 2 is an f32 bias [n] added to C (then max(C, 0) with relu): in the
  // cube where it has a bias table (MatmulTiling::bias), on the tiles in the UB where they
  // leave L0C that way (MatmulTiling::bias_in_ub), else as a vector launch on C.
  bool bias = false, relu = false;
};
CompiledKernel matmul_launches(const CompileContext& ctx, DataType dt, const MatmulProblem& p,
                               const TensorDesc& c);

}  // namespace npusim::compiler::ops
