// MatMul (attrs transpose_a, transpose_b, T) on the cube:
//   f16 -> f16 and bf16 -> bf16 (bf16 where the cube has it): fp32 accumulation in L0C, the
//     result rounded once by FIXPIPE;
//   f32 under the precision modes (compiler.h): cast to f16 by a vector launch into the GM
//     workspace (allow_fp32_to_fp16, allow_mix_precision; the latter also rounds the result to
//     f16 and widens it back by a last vector launch), or fp32 on the cube
//     (must_keep_origin_dtype) where cube_fp32_rate_divisor > 0; with k = 1 under
//     allow_fp32_to_fp16 an f32 broadcast Mul on the vector unit (outer_product_on_vector).
//
// The cube kernel (one block per cube core, blocks take output tiles round-robin, or under
// NPUSIM_MATMUL_CORE_SPLIT each block the tiles of its own region of C: apply_matmul_core_split):
//   for every (tile, k chunk) step of the block, software-pipelined by one step:
//     MTE2   nd2nz A and B chunks from GM (ND, any M/N/K: rows and columns past the matrix are
//            zero-filled) into L1 buffer step&1
//     MTE1   per mmad step (tk_l0 of k): load2d A into L0A (Zz) and B into L0B (Zn), buffer
//            l0_step&1; transposes come from load2d's 16x16 transpose where the stored layout
//            needs one
//     M      mmad into the tile's L0C buffer (init 0 on the tile's first step, else accumulate)
//     FIX    after the tile's last chunk: L0C -> GM (ND, exactly m x n elements, converted);
//            on chips without an l0c->gm path (coupled 910/310P-like cores) L0C -> UB, then
//            MTE3 UB -> GM row by row. UB -> GM moves whole 32-byte blocks, so when a row of C
//            is not a whole number of blocks the cube kernel writes C with rows padded to
//            32 bytes into the workspace and a vector launch copies it to the output.
//   Flags: L1 full/free (mte2 <-> mte1), L0 full/free (mte1 <-> m), L0C full/free (m <-> fix),
//   a ping/pong pair each; parities are run-time values, so each flag instruction is a two-way
//   branch (KernelBuilder::set_flag/wait_flag with a parity register).
// Layouts: docs/assembly.md "Data layouts" and isa/layout.h.
//
// Batched products (BatchMatMulV2, ops/batch_matmul.cpp) run the same kernel over the tiles of
// every product (MatmulTiling's batch fields).
//
// MatMulBiasAdd(a, b, bias [n]; transpose_a, transpose_b, relu), a and b f32 or f16, the bias
// f32: the TF plugin's graph fusion of MatMul -> BiasAdd [-> Relu] (CANN's MatMul epilogue; f16
// a and b with the f32 bias: allow_mix_precision's graph pass, CANN's MatMulV2 with a bias under
// mixed precision): the tile's bias goes GM -> L1 with its first k chunk and L1 -> BT before its
// first mmad, which starts from it (init 2); FIXPIPE applies the ReLU. On coupled chips (C
// leaves L0C through the UB) the vector unit adds the bias to the f32 tile in the UB. Numerics:
// C = bias + sum a16 * b16 in fp32, rounded once to C's type (the unfused chain rounds the sum to
// C's type first, then the sum with the bias: in f16 two roundings). Chips without a bias table
// or room in the UB, and products off the cube (k = 0, and k = 1 in f32 under
// allow_fp32_to_fp16: outer_product_on_vector), add the bias (and ReLU) by a vector launch on C.
//
// Not supported yet: f32 on the cube with transpose_a or without transpose_b (load2d
// transposes only 16-bit fractals; the vector-side transposer of ops/transpose.h could
// pre-transpose the operand into the workspace), s32, a bias on batched products.
#include "adapter/compiler/ops/matmul.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "adapter/compiler/ops/cast.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/fused.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using isa::Pipe;
using layout::kFractalBytes;

constexpr int64_t kFractalRows = static_cast<int64_t>(layout::kFractalRows);

namespace {

constexpr int64_t kTileCandidates[] = {16, 32, 64, 128, 256};  // output tile sides
constexpr int64_t kKStep = 16;  // k granularity of mmad steps and L1 chunks (a 16-bit fractal)

int64_t field_max(isa::FieldKind k) { return static_cast<int64_t>(isa::field_imm_max(k)); }

// The L1 chunks of A (tm x k) and B (k x tn), ping then pong, in units of k: the list that
// sizes the chunk (plan_matmul_tiling) and allocates it (MatmulEmitter).
// With a bias, two bias rows of tn f32 follow (ids 4, 5 as one twin: id 4).
BufferPlan l1_chunks(int64_t tm, int64_t tn, int64_t isz, bool bias = false) {
  BufferPlan plan(Buf::L1);
  for (int q = 0; q < 2; ++q) {
    plan.add(fmt::format("A chunk {}", q), static_cast<double>(tm * isz));
    plan.add(fmt::format("B chunk {}", q), static_cast<double>(tn * isz));
  }
  plan.add_fixed("bias row", static_cast<uint64_t>(tn * kL0cElemBytes), 2, bias);
  return plan;
}

}  // namespace

std::string MatmulTiling::str() const {
  return fmt::format(
             "{}x{}x{} {}{} {}->{}: tiles {}x{} ({}x{} = {} over {} blocks), k {} per "
             "mmad, {} per L1 chunk, {} L0C buffer(s)",
             m, n, k, trans_a ? "A^T" : "A", trans_b ? "B^T" : "B", isa::dtype_name(in_type),
             isa::dtype_name(out_type), tm, tn, tiles_m, tiles_n, tiles_m * tiles_n, block_dim,
             tk_l0, tk_l1, l0c_buffers) +
         (batch > 1 ? fmt::format("; batch {} ({} tiles)", batch, batch * tiles_m * tiles_n)
                    : std::string()) +
         (region_tiles_m > 0
              ? fmt::format("; core split {}x{} (regions of {}x{} tiles)", region_tiles_m * tm,
                            region_tiles_n * tn, region_tiles_m, region_tiles_n)
              : std::string()) +
         (stagger_bands > 0 ? fmt::format("; staggered tiles, groups of {} bands", stagger_bands)
                            : std::string()) +
         (c_strided.run_rows > 0
              ? fmt::format("; C strided: runs of {} rows {} apart{}", c_strided.run_rows,
                            c_strided.row_pitch,
                            c_zero_fill ? ", the zeros between by the vector cores" : "")
              : std::string());
}

namespace {

// Whether plan_matmul_tiling weighs L1 chunks of whole GM bursts (burst_chunk_k) and prices the
// loads' DMA issue (tile_cost_cycles) on a chip whose keys price it (ChipConfig::burst_cycles,
// copy_issue_cycles); NPUSIM_MATMUL_BURST_CHUNKS=0: neither, the largest chunk that fits as
// before. Read at every compile.
bool burst_chunks_enabled() {
  const char* v = std::getenv("NPUSIM_MATMUL_BURST_CHUNKS");
  return !(v && std::string(v) == "0");
}

// The DMA's GM burst as the simulator counts it (sim/exec/mte_common.h, kGmBurstBytes: no burst
// crosses a multiple of 512 bytes, the 910b's L2 line; ChipConfig::burst_cycles prices each).
constexpr int64_t kGmBurstBytes = 512;

// Elements of one GM burst of an operand of isz-byte elements.
int64_t burst_elems(int64_t isz) { return kGmBurstBytes / isz; }

// The GM bursts of one nd2nz of `rows` rows of `cols` elements (isz bytes each) of an operand
// of `pitch` elements a row. Rows that are all of the pitch are one contiguous run: its bytes
// in bursts. Others: ceil(row bytes / burst) a row, the rows taken to start on burst boundaries
// (k chunks of whole bursts in operands whose rows are whole bursts: burst_chunk_k); an
// estimate for rows off a boundary, which may take one burst more.
double nd2nz_bursts(int64_t rows, int64_t cols, int64_t pitch, int64_t isz) {
  if (cols >= pitch) return static_cast<double>(ceil_div(rows * pitch * isz, kGmBurstBytes));
  return static_cast<double>(rows * ceil_div(cols * isz, kGmBurstBytes));
}

// Whether the planner counts an A^T x B product's loads by their column tiles' offsets
// (column_tile_bursts); NPUSIM_MATMUL_COLUMN_TILE_BURSTS=0: by nd2nz_bursts as before. Read at
// every compile.
bool column_tile_bursts_enabled() {
  const char* v = std::getenv("NPUSIM_MATMUL_COLUMN_TILE_BURSTS");
  return !(v && std::string(v) == "0");
}

// The GM bursts of one nd2nz of a tile's `rows` rows of `cols` elements where the operand's
// rows of `pitch` elements are cut into column tiles of `cols` (the last one narrower) and each
// tile is read as often as the others: the mean over the tiles of their bursts, where a row's
// run starts at its tile's offset within a burst (rows a whole number of bursts apart: the
// offsets are the same on every row). Where the rows are not whole bursts apart, nd2nz_bursts'
// estimate. A^T x B products (A stored k x m, x^T x dy of the filter gradients) read both
// operands by column tiles.
double column_tile_bursts(int64_t rows, int64_t cols, int64_t pitch, int64_t isz) {
  if (cols >= pitch || (pitch * isz) % kGmBurstBytes != 0)
    return nd2nz_bursts(rows, cols, pitch, isz);
  const int64_t tiles = ceil_div(pitch, cols);
  int64_t bursts = 0;
  for (int64_t j = 0; j < tiles; ++j) {
    const int64_t first = j * cols * isz, bytes = std::min(cols, pitch - j * cols) * isz;
    bursts += (first + bytes - 1) / kGmBurstBytes - first / kGmBurstBytes + 1;
  }
  return static_cast<double>(rows * bursts) / static_cast<double>(tiles);
}

// The k per mmad (*tk0: two L0A and two L0B buffers) and per L1 chunk (*tk1, a multiple of
// *tk0: two A and two B chunks, l1_chunks) of a tm x tn tile; false if not even k 16 fits.
bool k_steps(const CoreKindConfig& core, const ChipConfig& cfg, int64_t tm, int64_t tn, int64_t isz,
             int64_t k, int64_t* tk0, int64_t* tk1, bool bias) {
  const uint64_t l1 = core.capacity(Buf::L1), l1_align = KernelBuilder::alignment(cfg, Buf::L1);
  *tk0 = cube_k_step(core, cfg, tm, tn, isz,
                     std::min(round_up(k, kKStep), field_max(isa::FieldKind::RU12)));
  if (*tk0 < kKStep) return false;
  const BufferPlan chunks = l1_chunks(tm, tn, isz, bias);
  *tk1 = chunks.fit(l1, l1_align, *tk0,
                    std::min(round_up(k, *tk0), field_max(isa::FieldKind::RU16) / *tk0 * *tk0));
  if (*tk1 < *tk0) {
    // L1 cannot hold two chunks of this k step: shrink the step to what fits.
    *tk0 = chunks.fit(l1, l1_align, kKStep, *tk0);
    if (*tk0 < kKStep) return false;
    *tk1 = *tk0;
  }
  return true;
}

// The L1 chunk of whole GM bursts below k_steps' tk1 (which fits, so this does): the largest
// multiple of lcm(tk0, burst_elems) up to tk1, when tk1 is more than a burst's elements but less
// than k and is not one already; else 0. Its rows of k (A, and B stored transposed) are then
// whole bursts from a burst boundary (where the operand's rows are whole bursts), where tk1's
// (e.g. 320 f16, 640 bytes) take a burst and a part; CANN's MatMul loads stepKa x baseK =
// 4 x 64 f16 of k a chunk the same way (512-byte rows).
int64_t burst_chunk_k(int64_t tk0, int64_t tk1, int64_t k, int64_t isz) {
  const int64_t row = burst_elems(isz), whole = std::lcm(tk0, row);
  if (tk1 <= row || tk1 >= k || tk1 < whole || tk1 % whole == 0) return 0;
  return tk1 / whole * whole;
}

// What plan_matmul_tiling's cost model needs of one candidate tiling.
struct TileCandidate {
  int64_t m, n, k, batch;    // the product(s)
  int64_t tm, tn, tk0, tk1;  // tile sides, k per mmad and per L1 chunk
  int64_t isz, osz;          // bytes per input and output element
  int64_t tiles, blocks;     // tiles of all products, cores that run them
  int l0c_buffers;
  bool via_ub, trans_a, trans_b;
  bool issue_priced;  // the loads' DMA issue in the cost (off: NPUSIM_MATMUL_BURST_CHUNKS=0)
  bool column_tiles;  // A^T x B: bursts by column tile (NPUSIM_MATMUL_COLUMN_TILE_BURSTS)
  double cube_div;    // the cube's rate divisor for the input type
};

// Cycles the busiest core takes for its tiles, from the chip config alone:
// - Loads: a tile reads (tm + tn) * k input elements over gm->l1. Every operand byte comes from
//   HBM once and the other reads hit the L2 (the tiles running together share A's row blocks
//   and B's column blocks; taken to hold even where the operands exceed the L2). Misses move at
//   the core's gm->l1 rate, hits at the core's L2 read port, each capped by its share (over the
//   cores that run) of the sustained HBM or the L2 bandwidth; a chip without an L2 misses all.
//   Each chunk's load also waits its path's and the memory's access latency, and takes at
//   least the DMA's issue of its bursts (mte.copy_issue_cycles, mte.burst_cycles; the 910b
//   preset's, 0 on the others).
// - The cube: per mmad of ks, its latency plus ceil(tm/cube_m) * ceil(tn/cube_n) *
//   ceil(ks/cube_k) cycles; under it (two L0A and two L0B buffers) MTE1 fills the next mmad's L0A
//   and L0B: one load2d per 16-row block of A and one per k block of B (MatmulEmitter::load_l0a,
//   load_l0b), each its path's latency plus its bytes at the path's rate. A chunk's mmads cost
//   the slower of the two.
// - The pipeline: two L1 chunk buffers, so chunk i+1's load runs under chunk i's mmads (the next
//   tile's first chunk after a tile's last); a tile costs the sum over its chunks of the slower
//   of the two; the core's first load runs alone and its last chunk's mmads have none under them.
// - The epilogue (L0C -> GM, through the UB on coupled chips): with one L0C buffer it holds the
//   next tile's mmads; with two only the last tile's is exposed.
double tile_cost_cycles(const TileCandidate& c, const ChipConfig& cfg) {
  const int64_t waves = ceil_div(c.tiles, c.blocks);
  const double cores = static_cast<double>(c.blocks);
  const double loaded =
      static_cast<double>(c.tiles) * static_cast<double>((c.tm + c.tn) * c.k * c.isz);
  const double unique = static_cast<double>(c.batch * (c.m * c.k + c.k * c.n) * c.isz);
  const CubeLoadRate rate = cube_load_rate(cfg, cores, unique, loaded);
  const double cycles_per_byte = rate.cycles_per_byte;

  const double tile_elems = static_cast<double>(c.tm * c.tn);
  const double epilogue =
      c.via_ub ? tile_elems * kL0cElemBytes / cfg.path_rate(Buf::L0C, Buf::UB) +
                     tile_elems * static_cast<double>(c.osz) / cfg.path_rate(Buf::UB, Buf::GM)
               : tile_elems * static_cast<double>(c.osz) / cfg.path_rate(Buf::L0C, Buf::GM);

  std::vector<int64_t> chunks(static_cast<size_t>(c.k / c.tk1), c.tk1);
  if (c.k % c.tk1 || chunks.empty()) chunks.push_back(c.k % c.tk1);  // k = 0: one empty chunk
  // A chunk's A and B transfers start together: one access latency per chunk (the L2's for the
  // hitting share, HBM's for the rest) on top of the gm->l1 path's.
  const double load_latency = cfg.path_latency(Buf::GM, Buf::L1) + rate.access_latency;
  // The DMA's issue of the chunk's two nd2nz (ChipConfig::copy_issue_cycles, burst_cycles: 0
  // but on the 910b): MTE2 is held for the longer of it and the flow.
  const auto issue = [&](int64_t kc) {
    const bool by_tile = c.trans_a && c.column_tiles;
    const double a = by_tile     ? column_tile_bursts(kc, c.tm, c.m, c.isz)  // A stored k x m
                     : c.trans_a ? nd2nz_bursts(kc, c.tm, c.m, c.isz)
                                 : nd2nz_bursts(c.tm, kc, c.k, c.isz);  // A stored m x k
    const double b = c.trans_b ? nd2nz_bursts(c.tn, kc, c.k, c.isz)     // B stored n x k
                     : by_tile ? column_tile_bursts(kc, c.tn, c.n, c.isz)
                               : nd2nz_bursts(kc, c.tn, c.n, c.isz);  // B stored k x n
    return c.issue_priced ? 2 * cfg.copy_issue_cycles + cfg.burst_cycles * (a + b) : 0.0;
  };
  const auto load = [&](int64_t kc) {
    return load_latency +
           std::max(static_cast<double>((c.tm + c.tn) * kc * c.isz) * cycles_per_byte, issue(kc));
  };
  const double fractals =
      static_cast<double>(ceil_div(c.tm, cfg.cube_m) * ceil_div(c.tn, cfg.cube_n));
  // k per B load2d: a fractal of 16 rows, or of one 32-byte block of k when B is transposed.
  const int64_t b_k_block = c.trans_b ? layout::kBlockBytes / c.isz : kFractalRows;
  const auto mmads = [&](int64_t kc) {
    double cube = 0, mte1 = 0;
    for (int64_t kk = 0; kk < kc; kk += c.tk0) {
      const int64_t ks = std::min(c.tk0, kc - kk);
      cube += cfg.cube_latency_cycles +
              fractals * static_cast<double>(ceil_div(ks, cfg.cube_k)) * c.cube_div;
      mte1 +=
          static_cast<double>(ceil_div(c.tm, kFractalRows)) * cfg.path_latency(Buf::L1, Buf::L0A) +
          static_cast<double>(round_up(c.tm, kFractalRows) * ks * c.isz) /
              cfg.path_rate(Buf::L1, Buf::L0A) +
          static_cast<double>(ceil_div(ks, b_k_block)) * cfg.path_latency(Buf::L1, Buf::L0B) +
          static_cast<double>(round_up(c.tn, kFractalRows) * ks * c.isz) /
              cfg.path_rate(Buf::L1, Buf::L0B);
    }
    return std::max(cube, mte1);
  };
  double tile = 0, last = 0;  // last: the mmads (and epilogue) of a tile's last chunk
  for (size_t i = 0; i < chunks.size(); ++i) {
    last = mmads(chunks[i]) + (i + 1 == chunks.size() && c.l0c_buffers == 1 ? epilogue : 0.0);
    tile += std::max(load(chunks[(i + 1) % chunks.size()]), last);
  }
  // The core's first load runs alone and cold (every core loads its first chunk at once, before
  // any other has brought its lines into the L2): HBM's latency and the miss rate; its last
  // chunk has no next load under it.
  const double first =
      cfg.path_latency(Buf::GM, Buf::L1) + cfg.hbm_latency_cycles +
      std::max(static_cast<double>((c.tm + c.tn) * chunks[0] * c.isz) / rate.miss_rate,
               issue(chunks[0]));
  return first + static_cast<double>(waves) * tile - std::max(first, last) + last +
         (c.l0c_buffers == 1 ? 0.0 : epilogue);
}

}  // namespace

int64_t matmul_bias_band_cols(int64_t tn) { return std::min<int64_t>(tn, kLanes32); }

int64_t matmul_bias_ub_bytes(int64_t tm, int64_t tn, int64_t osz, int64_t n) {
  return 2 * tm * matmul_bias_band_cols(tn) * (kL0cElemBytes + osz) + channel_table_bytes(n);
}

MatmulTiling plan_matmul_tiling(int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                                Dtype in_type, Dtype out_type, const ChipConfig& cfg,
                                const std::string& op, int64_t batch, bool any_side, bool bias,
                                bool bias_in_ub, const MatmulCoreSplit* split) {
  if (split && (split->empty() || batch != 1)) split = nullptr;
  const CoreKindConfig& core = cube_core(cfg, op);
  const int64_t isz = isa::dtype_size(in_type);
  const bool via_ub = cube_store_via_ub(cfg, core, op);
  const int64_t ub = static_cast<int64_t>(core.capacity(Buf::UB));
  const int64_t osz = isa::dtype_size(out_type);
  // The cost of a candidate: the busiest core's cycles (tile_cost_cycles).
  const double cube_div = in_type == Dtype::F32 ? std::max(1, cfg.cube_fp32_rate_divisor) : 1;
  // Chunks of whole bursts are weighed where the chip prices the DMA's issue (the 910b preset;
  // where it does not, the largest chunk that fits: fewest instructions, the plans as before).
  const bool burst_chunks =
      burst_chunks_enabled() && (cfg.copy_issue_cycles > 0 || cfg.burst_cycles > 0);
  const bool column_tiles = column_tile_bursts_enabled();
  MatmulTiling best;
  double best_cost = std::numeric_limits<double>::infinity();
  // With burst_chunks: the lowest cost of the largest chunks without the issue, the estimate
  // the planner gave before (est_cycles below).
  double unpriced_best = std::numeric_limits<double>::infinity();
  // Tile sides: the powers of two, or (any_side) every multiple of 16 up to 256.
  std::vector<int64_t> sides(std::begin(kTileCandidates), std::end(kTileCandidates));
  if (any_side) {
    sides.clear();
    for (int64_t v = kFractalRows; v <= kTileCandidates[4]; v += kFractalRows) sides.push_back(v);
  }
  for (int64_t tm : sides) {
    for (int64_t tn : sides) {
      // Sides past the matrix (rounded to 16) only waste work, except the smallest that covers it.
      if (tm > 16 && tm / 2 >= round_up(m, kFractalRows)) continue;
      if (tn > 16 && tn / 2 >= round_up(n, kFractalRows)) continue;
      if (via_ub && tm * tn * osz > ub) continue;  // the C tile passes through the UB
      // A bias row per L0 parity in the bias table (f32).
      if (bias && static_cast<uint64_t>(2 * tn * kL0cElemBytes) > core.capacity(Buf::BT)) continue;
      const int l0c_buffers = l0c_buffer_count(core, cfg, tm * tn * kL0cElemBytes);
      if (!l0c_buffers) continue;
      if (bias_in_ub && matmul_bias_ub_bytes(tm, tn, osz, n) > ub) continue;
      if (split && (split->m % tm != 0 || split->n % tn != 0)) continue;
      int64_t tk0 = 0, tk1_fit = 0;
      if (!k_steps(core, cfg, tm, tn, isz, k, &tk0, &tk1_fit, bias)) continue;
      int64_t tiles = ceil_div(m, tm) * ceil_div(n, tn) * batch;
      int64_t blocks = std::min<int64_t>(core.count, tiles);
      if (split) {  // one block per region; the busiest computes a whole region's tiles
        blocks = ceil_div(m, split->m) * ceil_div(n, split->n);
        tiles = blocks * ceil_div(std::min(m, split->m), tm) * ceil_div(std::min(n, split->n), tn);
      }
      // The L1 chunk: the largest that fits, or (burst_chunks) one of whole GM bursts.
      for (const int64_t tk1 : {tk1_fit, burst_chunks ? burst_chunk_k(tk0, tk1_fit, k, isz) : 0}) {
        if (tk1 == 0) continue;
        TileCandidate candidate{m,           n,      k,       batch,   tm,           tn,
                                tk0,         tk1,    isz,     osz,     tiles,        blocks,
                                l0c_buffers, via_ub, trans_a, trans_b, burst_chunks, column_tiles,
                                cube_div};
        const double cost = tile_cost_cycles(candidate, cfg);
        if (burst_chunks && tk1 == tk1_fit) {  // the same candidate with its issue unpriced
          candidate.issue_priced = false;
          unpriced_best = std::min(unpriced_best, tile_cost_cycles(candidate, cfg));
        }
        // Ties (within rounding): the larger tile, then the longer L1 chunk (fewer instructions).
        const bool tie = cost <= best_cost * (1 + 1e-9);
        const bool better = cost < best_cost * (1 - 1e-9) ||
                            (tie && (tm * tn > best.tm * best.tn ||
                                     (tm * tn == best.tm * best.tn && tk1 > best.tk_l1)));
        if (!better) continue;
        best_cost = std::min(best_cost, cost);
        best.est_cycles = cost;
        best.tm = tm;
        best.tn = tn;
        best.tk_l0 = tk0;
        best.tk_l1 = tk1;
        best.l0c_buffers = l0c_buffers;
        best.tiles_m = ceil_div(m, tm);
        best.tiles_n = ceil_div(n, tn);
        best.block_dim = static_cast<int>(blocks);
      }
    }
  }
  if (best.tm == 0 && split)  // no tile divides the split
    return plan_matmul_tiling(m, n, k, trans_a, trans_b, in_type, out_type, cfg, op, batch,
                              any_side, bias, bias_in_ub);
  if (best.tm == 0)
    throw CompileError(fmt::format(
        "{}: no MatMul tile fits the cube core of chip {} (L1 {} B, L0A {} B, L0B {} B, L0C {} B; "
        "the smallest tile needs 16x16 outputs with k 16, double-buffered)",
        op, cfg.name, core.capacity(Buf::L1), core.capacity(Buf::L0A), core.capacity(Buf::L0B),
        core.capacity(Buf::L0C)));
  // The estimate other kernels' plans are weighed against (a convolution's, conv2d.cpp) prices
  // no DMA issue, as theirs do not: with the issue priced here alone (or a plan that minimises
  // it), near-ties would move work off the MatMul onto kernels whose loads the keys slow more
  // (the ResNet-50 step with set A: a strided input gradient). So the kernel choice stays the
  // issue-free one until the convolutions price the issue too.
  best.issue_est_cycles = best.est_cycles;
  if (burst_chunks) best.est_cycles = unpriced_best;
  best.m = m;
  best.n = n;
  best.k = k;
  best.trans_a = trans_a;
  best.trans_b = trans_b;
  best.in_type = in_type;
  best.out_type = out_type;
  best.via_ub = via_ub;
  best.batch = batch;
  best.bias = bias;
  best.bias_in_ub = bias_in_ub;
  // Through the UB, C's rows must be whole 32-byte blocks in GM: pad them if they are not.
  const int64_t per_block = layout::kBlockBytes / osz;
  best.c_pitch = via_ub ? round_up(n, per_block) : n;
  best.stagger_bands = matmul_stagger_bands(best, cfg);
  return best;
}

namespace {

// NPUSIM_MATMUL_STAGGERED_TILES: unset or "1" on, "0" off; anything else a CompileError
// naming the variable and op. Read at every compile.
// NPUSIM_MATMUL_UNIT_FLAG: unset or "0" off, "1" on (UnitFlag between the tile's mmads and
// its FIXPIPE: CubePipeline::unit_flags); anything else a CompileError naming the variable and
// op. Read at every compile.
bool unit_flag_enabled(const std::string& op) {
  const char* v = std::getenv("NPUSIM_MATMUL_UNIT_FLAG");
  if (!v || std::string(v) == "0") return false;
  if (std::string(v) == "1") return true;
  throw CompileError(fmt::format("{}: NPUSIM_MATMUL_UNIT_FLAG='{}' is neither '0' nor '1'", op, v));
}

bool staggered_tiles_enabled(const std::string& op) {
  const char* v = std::getenv("NPUSIM_MATMUL_STAGGERED_TILES");
  if (!v || std::string(v) == "1") return true;
  if (std::string(v) == "0") return false;
  throw CompileError(
      fmt::format("{}: NPUSIM_MATMUL_STAGGERED_TILES='{}' is neither '0' nor '1'", op, v));
}

}  // namespace

int64_t matmul_stagger_bands(const MatmulTiling& t, const ChipConfig& cfg) {
  const double line_rate = cfg.l2_line_read_bytes_per_cycle;  // R, bytes per cycle
  if (line_rate <= 0 || t.block_dim <= 1 || t.tiles_m <= 1 || t.tiles_n <= 1 ||
      t.region_tiles_m > 0 || !staggered_tiles_enabled("MatMul"))
    return 0;
  // The cores that may read one line together at no loss: R / sharers is still at least the
  // core's L2 read port (no port given: one).
  const double port = cfg.l2_read_bytes_per_cycle;
  const int64_t sharers =
      port > 0 ? std::max<int64_t>(1, static_cast<int64_t>(std::floor(line_rate / port))) : 1;
  const int64_t min_bands = ceil_div(static_cast<int64_t>(t.block_dim), sharers);
  // groups of floor(tiles_m / groups) >= min_bands bands, the last also the remainder (fewer
  // than min_bands: floor(tiles_m / bands) is again `groups`).
  const int64_t groups = std::max<int64_t>(1, t.tiles_m / min_bands);
  return t.tiles_m / groups;
}

MatmulTileCoord matmul_tile_at(const MatmulTiling& t, int64_t tile) {
  if (t.stagger_bands == 0) return {tile / t.tiles_n, tile % t.tiles_n};
  const int64_t g = t.stagger_bands, last = t.tiles_m / g - 1;  // the last group
  const int64_t group = std::min(tile / (g * t.tiles_n), last);
  const int64_t first = group * g;  // the group's first band
  const int64_t bands = group == last ? t.tiles_m - first : g;
  const int64_t u = tile - first * t.tiles_n;  // the tile within the group
  return {first + u % bands, (u / bands + u % bands) % t.tiles_n};
}

const std::string& matmul_core_split_from_env() {
  static const std::string value = [] {
    const char* v = std::getenv("NPUSIM_MATMUL_CORE_SPLIT");
    return std::string(v ? v : "");
  }();
  return value;
}

MatmulCoreSplit parse_matmul_core_split(const std::string& value, const std::string& op) {
  if (value.empty()) return {};
  long long sm = 0, sn = 0;
  char x = 0, extra = 0;
  if (std::sscanf(value.c_str(), "%lld%c%lld%c", &sm, &x, &sn, &extra) != 3 || x != 'x' ||
      sm <= 0 || sn <= 0)
    throw CompileError(
        fmt::format("{}: NPUSIM_MATMUL_CORE_SPLIT='{}' is not MxN (elements of C per cube core, "
                    "e.g. 2048x1536)",
                    op, value));
  return {static_cast<int64_t>(sm), static_cast<int64_t>(sn)};
}

void apply_matmul_core_split(MatmulTiling& t, const std::string& value, const ChipConfig& cfg,
                             const std::string& op) {
  if (value.empty() || t.batch != 1) return;
  const MatmulCoreSplit split = parse_matmul_core_split(value, op);
  const int64_t sm = split.m, sn = split.n;
  if (sm % t.tm != 0 || sn % t.tn != 0)
    throw CompileError(
        fmt::format("{}: NPUSIM_MATMUL_CORE_SPLIT={}x{} is not a multiple of the {}x{} tile", op,
                    sm, sn, t.tm, t.tn));
  t.region_tiles_m = sm / t.tm;
  t.region_tiles_n = sn / t.tn;
  t.regions_m = ceil_div(t.tiles_m, t.region_tiles_m);
  const int64_t regions = t.regions_m * ceil_div(t.tiles_n, t.region_tiles_n);
  const int cores = cube_core(cfg, op).count;
  if (regions > cores)
    throw CompileError(fmt::format(
        "{}: NPUSIM_MATMUL_CORE_SPLIT={}x{} cuts the {}x{} product into {} regions, more than the "
        "{} cube cores",
        op, sm, sn, t.m, t.n, regions, cores));
  t.block_dim = static_cast<int>(regions);
  t.stagger_bands = 0;  // regions: each block its own tiles, row by row
}

namespace {

// Emits the cube kernel of a tiling. Arguments: a, b, c.
class MatmulEmitter {
 public:
  MatmulEmitter(const MatmulTiling& t, const ChipConfig& cfg, const std::string& op)
      : m_t(t),
        m_b(fmt::format("MatMul_{}_{}", isa::dtype_name(t.in_type), isa::dtype_name(t.out_type)),
            op, cfg),
        m_isz(isa::dtype_size(t.in_type)),
        m_osz(isa::dtype_size(t.out_type)),
        m_c0(static_cast<int64_t>(layout::c0_of(static_cast<uint64_t>(m_isz)))),
        m_chunks(ceil_div(t.k, t.tk_l1)),
        m_pipe(m_b, t.l0c_buffers) {}

  BuiltKernel emit() {
    KernelBuilder& b = m_b;
    b.begin_section(b.cube_core_kind());
    allocate();
    const int64_t am = m_t.trans_a ? m_t.k : m_t.m, ak = m_t.trans_a ? m_t.m : m_t.k;
    const int64_t bk = m_t.trans_b ? m_t.n : m_t.k, bn = m_t.trans_b ? m_t.k : m_t.n;
    if (m_t.batch > 1) {
      b.declare_arg("a", m_t.in_type, {m_t.a_count, am, ak});
      b.declare_arg("b", m_t.in_type, {m_t.b_count, bk, bn});
      b.declare_arg("c", m_t.out_type, {m_t.batch, m_t.m, m_t.c_pitch});
    } else {
      b.declare_arg("a", m_t.in_type, {am, ak});
      b.declare_arg("b", m_t.in_type, {bk, bn});
      if (m_t.c_strided.run_rows > 0)
        b.declare_arg("c", m_t.out_type, {m_t.c_strided.elements});
      else
        b.declare_arg("c", m_t.out_type, {m_t.m, m_t.c_pitch});
    }
    if (m_t.bias || m_t.bias_in_ub) b.declare_arg("bias", Dtype::F32, {m_t.n});
    Reg steps = b.reg("steps of this block: tiles x k chunks");
    if (m_t.region_tiles_m > 0) {
      KernelBuilder::Origin o(b, "my tiles: the rows x columns of tiles of my region");
      Reg r0 = b.reg("region: first tile row"), c0 = b.reg("region: first tile column"),
          cols = b.reg("region: tile columns");
      region_of_block(r0, c0, cols, &steps);
      b.mul(steps, steps, cols);
      b.mul(steps, steps, m_chunks);
    } else {
      m_pipe.block_steps_round_robin(steps, m_t.batch * m_t.tiles_m * m_t.tiles_n, m_chunks);
    }
    // UnitFlag on the direct way out (FIXPIPE to GM, one fixpipe per tile).
    if (unit_flag_enabled("MatMul") && !m_t.via_ub && m_t.c_strided.run_rows == 0)
      m_pipe.unit_flags();
    m_pipe.declare_flags({"L1 chunk loaded", "L1 chunk free", "L0 step loaded", "L0 step free",
                          "L0C tile computed", "L0C tile stored"});
    CubePipeline::Hooks hooks;
    if (m_t.bias_in_ub)
      hooks.setup = [&] {
        KernelBuilder::Origin o(b, "bias into the UB");
        load_channel_tables(b, {{"bias", m_bias_ub}}, m_t.n, "bias table loaded");
      };
    m_pipe.run(
        steps, [&](const Reg& t) { load_step(t); }, [&](const Reg& s) { compute_step(s); }, hooks);
    if (m_t.c_zero_fill) {  // (the vector section begins with no register held)
      steps.release();
      m_pipe.release_registers();
    }
    b.end();
    if (m_t.c_zero_fill) emit_strided_zeros(b, m_t.c_strided, m_osz, m_t.block_dim, "c");
    return b.finish();
  }

 private:
  // One plan per buffer kind: L1 (l1_chunks), L0A, L0B, L0C and, via the UB, the UB (with
  // bias_in_ub: two column bands as f32 and as the output type, and the bias table).
  void allocate() {
    if (m_t.bias_in_ub && (!m_t.via_ub || m_t.bias || m_t.batch > 1))
      m_b.fail("internal: the bias in the UB needs the UB path, no bias table and one product");
    if (m_t.c_strided.run_rows > 0 && (m_t.via_ub || m_t.batch > 1 || m_t.bias_in_ub))
      m_b.fail("internal: a strided C needs FIXPIPE to GM and one product");
    const BufferPlan::Placed l1 =
        l1_chunks(m_t.tm, m_t.tn, m_isz, m_t.bias).allocate(m_b, m_t.tk_l1);
    m_l1a = Twin{{l1[0], l1[2]}};
    m_l1b = Twin{{l1[1], l1[3]}};
    if (m_t.bias) {
      m_bias_l1 = l1.twin(4);
      BufferPlan bt(Buf::BT);
      const auto row =
          bt.add_fixed("bias (L0 parity)", static_cast<uint64_t>(m_t.tn * kL0cElemBytes), 2);
      m_bias_bt = bt.allocate(m_b, 0).twin(row);
    }
    BufferPlan l0a(Buf::L0A), l0b(Buf::L0B), l0c(Buf::L0C), ub(Buf::UB);
    const auto a = l0a.add_fixed("A step", static_cast<uint64_t>(m_t.tm * m_t.tk_l0 * m_isz), 2);
    const auto b = l0b.add_fixed("B step", static_cast<uint64_t>(m_t.tk_l0 * m_t.tn * m_isz), 2);
    const auto c = l0c.add_fixed("C tile", static_cast<uint64_t>(m_t.tm * m_t.tn * kL0cElemBytes),
                                 m_t.l0c_buffers);
    // bias_in_ub: the output and f32 buffers hold one column band each, two of each.
    const int64_t ub_cols = m_t.bias_in_ub ? matmul_bias_band_cols(m_t.tn) : m_t.tn;
    const int tiles_in_ub = m_t.bias_in_ub ? 2 : 1;
    const auto cu = ub.add_fixed("C tile (UB)", static_cast<uint64_t>(m_t.tm * ub_cols * m_osz),
                                 tiles_in_ub, m_t.via_ub);
    const auto c32 = ub.add_fixed("C band (f32, before the bias)",
                                  static_cast<uint64_t>(m_t.tm * ub_cols * kL0cElemBytes),
                                  tiles_in_ub, m_t.bias_in_ub);
    const auto table = ub.add_fixed("bias table", static_cast<uint64_t>(channel_table_bytes(m_t.n)),
                                    1, m_t.bias_in_ub);
    m_l0a = l0a.allocate(m_b, 0).twin(a);
    m_l0b = l0b.allocate(m_b, 0).twin(b);
    m_l0c = l0c.allocate(m_b, 0).twin(c);
    const BufferPlan::Placed pu = ub.allocate(m_b, 0);
    if (m_t.via_ub) m_pipe.store_via_ub(pu[cu]);
    if (m_t.bias_in_ub) {
      m_bias_ub = pu[table];
      CubePipeline::ChannelAffine e;
      e.tile32 = pu.twin(c32);
      e.out = pu.twin(cu);
      e.buffers = tiles_in_ub;
      e.a = e.shift = m_bias_ub;
      e.shift_only = true;
      e.what = "bias";
      e.act = m_t.relu ? Activation::kRelu : Activation::kNone;
      e.max_rows = m_t.tm;
      e.max_cols = ub_cols;
      e.row_blocks32 = ub_cols / kBlockLanes32;
      e.band_tile_cols = m_t.tn;
      m_pipe.affine_via_ub(e);
    }
  }

  // The region of this block (core split, MatmulTiling::region_tiles_m): its first tile row r0
  // and column c0, its tile columns cols and (rows) tile rows, both clipped at the matrix's edge.
  void region_of_block(const Reg& r0, const Reg& c0, const Reg& cols, const Reg* rows) {
    KernelBuilder& b = m_b;
    b.emit(Opcode::op_get_block_id, {r0});
    b.div(c0, r0, m_t.regions_m, "region column = block / regions down M");
    b.rem(r0, r0, m_t.regions_m, "region row = block % regions down M");
    b.mul(r0, r0, m_t.region_tiles_m);
    b.mul(c0, c0, m_t.region_tiles_n);
    b.movi(cols, m_t.tiles_n);
    b.sub(cols, cols, c0);
    b.min(cols, cols, m_t.region_tiles_n, "tile columns of the region");
    if (rows) {
      b.movi(*rows, m_t.tiles_m);
      b.sub(*rows, *rows, r0);
      b.min(*rows, *rows, m_t.region_tiles_m, "tile rows of the region");
    }
  }

  // Tile j of the block when tiles go round-robin: tile = block + j * blocks, as tile row m0
  // and column n0 (row by row, or staggered: matmul_tile_at) and the product *bidx of a
  // batched tiling.
  void round_robin_tile(const Reg& j, const Reg& m0, const Reg& n0, const Reg* bidx) {
    KernelBuilder& b = m_b;
    b.emit(Opcode::op_get_block_num, {m0});
    b.mul(m0, m0, j);
    b.emit(Opcode::op_get_block_id, {n0});
    b.add(m0, m0, n0, "tile = block + j * blocks");
    if (bidx) {
      b.div(*bidx, m0, m_t.tiles_m * m_t.tiles_n, "product of the tile");
      b.rem(m0, m0, m_t.tiles_m * m_t.tiles_n);
    }
    if (m_t.stagger_bands > 0) {
      staggered_tile(m0, n0);
      return;
    }
    b.rem(n0, m0, m_t.tiles_n);
    b.div(m0, m0, m_t.tiles_n);
  }

  // matmul_tile_at's staggered order on the scalar unit: the tile index in m0 -> tile row m0
  // and column n0 (groups of stagger_bands bands, the last with the remainder; within one of
  // `bands` bands, tile u at band u % bands, column (u / bands + u % bands) % tiles_n).
  void staggered_tile(const Reg& m0, const Reg& n0) {
    KernelBuilder& b = m_b;
    const int64_t g = m_t.stagger_bands, last = m_t.tiles_m / g - 1;
    Reg first = b.reg("staggered: first band of the group"),
        bands = b.reg("staggered: bands in the group");
    b.div(first, m0, g * m_t.tiles_n);
    b.min(first, first, last, "the tile's group of bands");
    b.movi(bands, g);
    b.if_(eq(first, last), [&] { b.movi(bands, m_t.tiles_m - last * g, "the last group"); });
    b.mul(first, first, g, "its first band");
    b.mul(n0, first, m_t.tiles_n);
    b.sub(m0, m0, n0, "u: the tile within its group");
    b.rem(n0, m0, bands, "u % bands");
    b.div(m0, m0, bands, "u / bands");
    b.add(m0, m0, n0);
    b.add(n0, n0, first, "tile row: first + u % bands");
    b.rem(m0, m0, m_t.tiles_n, "tile column: (u / bands + u % bands) % tiles_n");
    b.mov(bands, m0);
    b.mov(m0, n0);
    b.mov(n0, bands);
  }

  // Tile coordinates of step s: tile = block + (s / chunks) * blocks, chunk = s % chunks
  // (or, under a core split, tile j of the block's region).
  // Sets j (tile index within the block) and ch, and the sizes m_act, n_act, kc; returns m0,
  // n0, k0 through the given registers, and for a batched tiling the product index (tiles of
  // product b are b * tiles_m * tiles_n ...) through *bidx.
  void coords(const Reg& s, const Reg& j, const Reg& ch, const Reg& m0, const Reg& n0,
              const Reg& k0, const Reg& m_act, const Reg& n_act, const Reg& kc,
              const Reg* bidx = nullptr) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "step -> tile and k chunk");
    b.div(j, s, m_chunks);
    b.rem(ch, s, m_chunks);
    if (m_t.region_tiles_m > 0) {
      // Core split: tile j of the block is (r0 + j / cols, c0 + j % cols) of its region.
      Reg cols = b.reg("region: tile columns"), t = b.reg("region: tile offset");
      region_of_block(m0, n0, cols, nullptr);
      b.div(t, j, cols);
      b.add(m0, m0, t, "tile row");
      b.rem(t, j, cols);
      b.add(n0, n0, t, "tile column");
    } else {
      round_robin_tile(j, m0, n0, bidx);
    }
    b.mul(m0, m0, m_t.tm, "first row");
    b.mul(n0, n0, m_t.tn, "first column");
    b.mul(k0, ch, m_t.tk_l1, "first k");
    b.movi(m_act, m_t.m);
    b.sub(m_act, m_act, m0);
    b.min(m_act, m_act, m_t.tm, "rows in the tile");
    b.movi(n_act, m_t.n);
    b.sub(n_act, n_act, n0);
    b.min(n_act, n_act, m_t.tn, "columns in the tile");
    b.movi(kc, m_t.k);
    b.sub(kc, kc, k0);
    b.min(kc, kc, m_t.tk_l1, "k in the chunk");
  }

  // MTE2: the A and B chunks of step s into L1 buffer s & 1.
  void load_step(const Reg& s) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "load: A and B chunks into L1");
    Reg j = b.reg("load: tile index"), ch = b.reg("load: chunk"), m0 = b.reg("load: m0"),
        n0 = b.reg("load: n0"), k0 = b.reg("load: k0"), m_act = b.reg("load: rows"),
        n_act = b.reg("load: columns"), kc = b.reg("load: k");
    Reg bi;
    if (m_t.batch > 1) bi = b.reg("load: product");
    coords(s, j, ch, m0, n0, k0, m_act, n_act, kc, m_t.batch > 1 ? &bi : nullptr);
    Reg p = b.reg("load: L1 parity");
    m_pipe.l1_parity(p, s);
    m_pipe.l1_wait_free(p, "L1 buffer free");
    Reg dst = b.reg("load: L1 address"), src = b.reg("load: GM address"),
        rows = b.reg("load: padded rows");
    select(m_b, dst, p, m_l1a);
    if (!m_t.trans_a)  // A stored m x k
      load_nd_chunk(dst, src, rows, m0, k0, m_act, kc, m_t.k, m_t.a_batch_strides, bi, "a",
                    "A chunk (m x k)");
    else  // A stored k x m
      load_nd_chunk(dst, src, rows, k0, m0, kc, m_act, m_t.m, m_t.a_batch_strides, bi, "a",
                    "A^T chunk (k x m)");
    select(m_b, dst, p, m_l1b);
    if (!m_t.trans_b)  // B stored k x n
      load_nd_chunk(dst, src, rows, k0, n0, kc, n_act, m_t.n, m_t.b_batch_strides, bi, "b",
                    "B chunk (k x n)");
    else  // B stored n x k
      load_nd_chunk(dst, src, rows, n0, k0, n_act, kc, m_t.k, m_t.b_batch_strides, bi, "b",
                    "B^T chunk (n x k)");
    if (m_t.bias)  // the tile's bias with its first chunk, in the chunk's L1 parity
      b.if_(eq(ch, 0), [&] {
        KernelBuilder::Origin r(b, "bias of the tile's columns");
        select(m_b, dst, p, m_bias_l1);
        b.add(rows, n_act, 7);
        b.shr(rows, rows, 3, "32-byte blocks of n_act f32");
        b.mul(src, n0, kL0cElemBytes);
        Reg bias = b.load_arg("bias");
        b.add(src, src, bias);
        b.emit(Opcode::op_copy_gm2l1, {dst, src, 1, rows, 0, 0}, "bias[n0, n0 + n_act)");
      });
    m_pipe.l1_loaded(p, "L1 chunk loaded");
  }

  // MTE2: the row_act x col_act block at (r0, c0) of an ND operand with `pitch` elements per row
  // (of product bi when batched) -> NZ at dst in L1, rows padded to 16. src and rows are
  // scratch registers.
  void load_nd_chunk(const Reg& dst, const Reg& src, const Reg& rows, const Reg& r0, const Reg& c0,
                     const Reg& row_act, const Reg& col_act, int64_t pitch,
                     const std::vector<int64_t>& batch_strides, const Reg& bi, const char* arg,
                     const char* what) {
    KernelBuilder& b = m_b;
    b.mul(src, r0, pitch);
    b.add(src, src, c0);
    round16(m_b, rows, row_act);
    if (m_t.batch > 1) add_batch_offset(src, bi, batch_strides);
    finish_src(src, arg);
    b.emit(Opcode::op_nd2nz, {m_t.in_type, dst, src, row_act, col_act, pitch, rows}, what);
  }

  // d += the element offset of product bidx in an operand with the given batch strides.
  void add_batch_offset(const Reg& d, const Reg& bidx, const std::vector<int64_t>& strides) {
    KernelBuilder& b = m_b;
    Reg i = b.reg("batch index"), t = b.reg("batch offset");
    int64_t below = m_t.batch;
    for (size_t dim = 0; dim < m_t.batch_dims.size(); ++dim) {
      below /= m_t.batch_dims[dim];
      if (strides[dim] == 0) continue;
      b.div(i, bidx, below);
      b.rem(i, i, m_t.batch_dims[dim]);
      b.mul(t, i, strides[dim]);
      b.add(d, d, t);
    }
  }

  // src = argument `arg` + src * element size.
  void finish_src(const Reg& src, const char* arg) {
    m_b.mul(src, src, m_isz);
    Reg base = m_b.load_arg(arg);
    m_b.add(src, src, base);
  }

  // MTE1 + M (+ FIX after a tile's last chunk) for step s.
  void compute_step(const Reg& s) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "compute: L1 -> L0 -> cube");
    Reg ch = b.reg("compute: chunk"), m_act = b.reg("compute: rows"),
        n_act = b.reg("compute: columns"), kc = b.reg("compute: k"),
        cdst = b.reg("compute: C address"), pt = b.reg("compute: L0C parity");
    Reg col0;  // bias_in_ub: the tile's first column (its bias table entry)
    if (m_t.bias_in_ub) col0 = b.reg("compute: first column");
    Reg row0;  // strided C: the tile's first row
    const bool strided = m_t.c_strided.run_rows > 0;
    if (strided) row0 = b.reg("compute: first row");
    {
      Reg j = b.reg("compute: tile index"), m0 = b.reg("compute: m0"), n0 = b.reg("compute: n0"),
          k0 = b.reg("compute: k0");
      Reg bi;
      if (m_t.batch > 1) bi = b.reg("compute: product");
      coords(s, j, ch, m0, n0, k0, m_act, n_act, kc, m_t.batch > 1 ? &bi : nullptr);
      if (m_t.bias_in_ub) b.mov(col0, n0);
      if (strided) {
        b.mov(row0, m0);
        b.movi(cdst, 0, "strided C: rows placed by the store");
      } else {
        b.mul(cdst, m0, m_t.c_pitch);
      }
      b.add(cdst, cdst, n0);
      if (m_t.batch > 1) {
        b.mul(j, bi, m_t.m * m_t.c_pitch);
        b.add(cdst, cdst, j, "C of the product");
        b.div(j, s, m_chunks, "tile index within the block (again)");
      }
      b.mul(cdst, cdst, m_osz);
      Reg c = b.load_arg("c");
      b.add(cdst, cdst, c, "C tile address");
      if (m_t.l0c_buffers == 2)
        b.and_(pt, j, 1, "L0C buffer: tile index & 1");
      else
        b.movi(pt, 0);
    }
    Reg p = b.reg("compute: L1 parity");
    m_pipe.l1_parity(p, s);
    m_pipe.l1_wait_loaded(p, "L1 chunk loaded");
    Reg kk = b.reg("compute: k within the chunk");
    b.for_range(kk, 0, kc, m_t.tk_l0, [&] { mmad_step(p, pt, ch, kk, kc, m_act, n_act); });
    m_pipe.l1_read(p, "L1 chunk read");
    b.if_(eq(ch, m_chunks - 1), [&] {
      KernelBuilder::Origin f(b, "store: L0C -> C");
      Reg l0c = b.reg("store: L0C address");
      m_pipe.l0c_ready(pt, l0c, m_l0c);
      if (strided) {
        store_strided_rows(b, m_t.c_strided, m_t.out_type, m_t.relu, cdst, l0c, row0, m_act, n_act);
        m_pipe.l0c_stored(pt);
      } else {
        m_pipe.store({m_t.out_type, cdst, l0c, m_act, n_act, m_t.c_pitch, m_t.relu,
                      m_t.bias_in_ub ? &col0 : nullptr},
                     pt);
      }
    });
  }

  // One mmad step: k [kk, kk + ks) of the chunk in L1 buffer p, into L0C buffer pt.
  void mmad_step(const Reg& p, const Reg& pt, const Reg& ch, const Reg& kk, const Reg& kc,
                 const Reg& m_act, const Reg& n_act) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "mmad step");
    Reg ks = b.reg("step: k"), q = b.reg("step: L0 parity");
    b.sub(ks, kc, kk);
    b.min(ks, ks, m_t.tk_l0, "k in this step");
    m_pipe.l0_parity(q);
    m_pipe.l0_wait_free(q, "L0 buffers free");
    load_l0a(p, q, kk, ks, kc, m_act);
    load_l0b(p, q, kk, ks, kc, n_act);
    // With a bias, a tile's first step copies its bias into the BT row of the L0 parity (free:
    // the mmad that last read it, two steps back, freed the L0 buffers waited for above).
    Reg bt;
    if (m_t.bias) {
      bt = b.reg("step: bias row in BT");
      Label later = b.label("bias_loaded");
      b.branch(ne(ch, 0), later);
      b.branch(ne(kk, 0), later);
      Reg src = b.reg("step: bias in L1"), n = b.reg("step: bias blocks");
      select(m_b, bt, q, m_bias_bt);
      select(m_b, src, p, m_bias_l1);
      b.add(n, n_act, 7);
      b.shr(n, n, 3, "32-byte blocks of n_act f32");
      b.emit(Opcode::op_copy_l12bt, {bt, src, n}, "the tile's bias into BT");
      b.bind(later);
    }
    m_pipe.l0_loaded(q, "L0 step loaded");
    {
      Reg l0a = b.reg("step: L0A address"), l0b = b.reg("step: L0B address"),
          l0c = b.reg("step: L0C address");
      select(m_b, l0a, q, m_l0a);
      select(m_b, l0b, q, m_l0b);
      select(m_b, l0c, pt, m_l0c);
      Reg last;  // unit flags: 1 on the tile's last step (its last chunk's last k), else 0
      if (m_pipe.unit_flags_on()) {
        last = b.reg("step: the tile's last (unit flag)");
        Label not_last = b.label("not_the_tiles_last_step");
        b.movi(last, 0);
        b.branch(ne(ch, m_chunks - 1), not_last);
        Reg rest = b.reg("step: k left in the chunk");
        b.sub(rest, kc, kk);
        b.branch(ne(rest, ks), not_last);
        b.movi(last, 1);
        b.bind(not_last);
      }
      const Reg* last_step = m_pipe.unit_flags_on() ? &last : nullptr;
      if (m_t.bias) {
        select(m_b, bt, q, m_bias_bt);
        m_pipe.mmad({m_t.in_type, l0c, l0a, l0b, m_act, ks, n_act}, pt, ch, kk, 2, &bt,
                    "C = bias + A * B", nullptr, last_step);
      } else {
        m_pipe.mmad({m_t.in_type, l0c, l0a, l0b, m_act, ks, n_act}, pt, ch, kk, 0, nullptr,
                    "C = A * B", nullptr, last_step);
      }
    }
    m_pipe.l0_read(q, "L0 buffers read");
    m_pipe.next_l0_step();
  }

  // L0A (Zz) for k [kk, kk + ks): one load2d per 16-row block of A.
  void load_l0a(const Reg& p, const Reg& q, const Reg& kk, const Reg& ks, const Reg& kc,
                const Reg& m_act) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "L0A: one load2d per 16-row block");
    Reg src = b.reg("L0A: source"), dst = b.reg("L0A: destination"),
        nfrac = b.reg("L0A: fractals per row block"), step = b.reg("L0A: source step"),
        blocks = b.reg("L0A: row blocks");
    select(m_b, dst, q, m_l0a);
    select(m_b, src, p, m_l1a);
    if (!m_t.trans_a) {
      // NZ A (m x kc, rows padded to R = round16(m)): k block j of row block i at
      // j*R*32 + i*512 bytes; one row block = ceil(ks/C0) fractals at a stride of R/16.
      round16(m_b, step, m_act);
      b.mul(blocks, kk, m_isz);
      b.mul(blocks, blocks, step);
      b.add(src, src, blocks, "k block kk/C0: kk * size * R bytes");
      b.shr(step, step, 4, "source stride R/16 fractals");
      emit_ceil_div(nfrac, ks, m_c0);
      Reg i = b.reg("L0A: row block");
      round16(m_b, blocks, m_act);
      b.shr(blocks, blocks, 4);
      b.for_range(i, 0, blocks, 1, [&] {
        b.emit(Opcode::op_load2d, {m_t.in_type, Buf::L0A, dst, src, nfrac, step, 0});
        b.add(src, src, static_cast<int64_t>(kFractalBytes));
        Reg t = b.reg("L0A: destination step");
        b.mul(t, nfrac, static_cast<int64_t>(kFractalBytes));
        b.add(dst, dst, t);
      });
    } else {
      // NZ A^T (kc x m, rows padded to K = round16(kc)): fractal (k block j, m block i) at
      // i*K*32 + j*512; transposing each gives A's fractal (i, j). Stride 1 along k.
      round16(m_b, step, kc);
      b.mul(step, step, 32, "row block step K*32 bytes");
      b.mul(blocks, kk, 32);
      b.add(src, src, blocks, "k block kk/16: kk*32 bytes");
      emit_ceil_div(nfrac, ks, kFractalRows);
      Reg i = b.reg("L0A: row block");
      round16(m_b, blocks, m_act);
      b.shr(blocks, blocks, 4);
      b.for_range(i, 0, blocks, 1, [&] {
        b.emit(Opcode::op_load2d, {m_t.in_type, Buf::L0A, dst, src, nfrac, 1, 1});
        b.add(src, src, step);
        Reg t = b.reg("L0A: destination step");
        b.mul(t, nfrac, static_cast<int64_t>(kFractalBytes));
        b.add(dst, dst, t);
      });
    }
  }

  // L0B (Zn) for k [kk, kk + ks): one load2d per k block of B.
  void load_l0b(const Reg& p, const Reg& q, const Reg& kk, const Reg& ks, const Reg& kc,
                const Reg& n_act) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "L0B: one load2d per k block");
    Reg src = b.reg("L0B: source"), dst = b.reg("L0B: destination"),
        nfrac = b.reg("L0B: fractals per k block"), step = b.reg("L0B: source step"),
        blocks = b.reg("L0B: k blocks");
    select(m_b, dst, q, m_l0b);
    select(m_b, src, p, m_l1b);
    emit_ceil_div(nfrac, n_act, kFractalRows);
    Reg i = b.reg("L0B: k block");
    if (!m_t.trans_b) {
      // NZ B (kc x n, rows padded to K = round16(kc)): fractal (k block i, n block j) at
      // j*K*32 + i*512; transposed (16-bit) it is the Zn fractal. Stride K/16 along n.
      round16(m_b, step, kc);
      b.shr(step, step, 4, "source stride K/16 fractals");
      b.mul(blocks, kk, 32);
      b.add(src, src, blocks, "k block kk/16: kk*32 bytes");
      emit_ceil_div(blocks, ks, kFractalRows);
      b.for_range(i, 0, blocks, 1, [&] {
        b.emit(Opcode::op_load2d, {m_t.in_type, Buf::L0B, dst, src, nfrac, step, 1});
        b.add(src, src, static_cast<int64_t>(kFractalBytes));
        Reg t = b.reg("L0B: destination step");
        b.mul(t, nfrac, static_cast<int64_t>(kFractalBytes));
        b.add(dst, dst, t);
      });
    } else {
      // NZ B^T (n x kc, rows padded to R = round16(n)): fractal (n block j, k block i of C0)
      // at i*R*32 + j*512, already column-major (Zn). Stride 1 along n.
      round16(m_b, step, n_act);
      b.mul(blocks, kk, m_isz);
      b.mul(blocks, blocks, step);
      b.add(src, src, blocks, "k block kk/C0: kk * size * R bytes");
      b.mul(step, step, 32, "k block step R*32 bytes");
      emit_ceil_div(blocks, ks, m_c0);
      b.for_range(i, 0, blocks, 1, [&] {
        b.emit(Opcode::op_load2d, {m_t.in_type, Buf::L0B, dst, src, nfrac, 1, 0});
        b.add(src, src, step);
        Reg t = b.reg("L0B: destination step");
        b.mul(t, nfrac, static_cast<int64_t>(kFractalBytes));
        b.add(dst, dst, t);
      });
    }
  }

  void emit_ceil_div(const Reg& d, const Reg& x, int64_t by) {
    m_b.add(d, x, by - 1);
    m_b.div(d, d, by);
  }

  const MatmulTiling& m_t;
  KernelBuilder m_b;
  const int64_t m_isz, m_osz, m_c0, m_chunks;
  CubePipeline m_pipe;
  Twin m_l1a, m_l1b, m_l0a, m_l0b, m_l0c;
  Twin m_bias_l1, m_bias_bt;  // with a bias (MatmulTiling::bias)
  uint64_t m_bias_ub = 0;     // bias_in_ub: the bias table in the UB
};

}  // namespace

Launch build_matmul_launch(const MatmulTiling& t, const ChipConfig& cfg, const std::string& op) {
  Launch l;
  l.kernel = MatmulEmitter(t, cfg, op).emit();
  l.block_dim = t.block_dim;
  l.summary = "cube: " + t.str();
  return l;
}

namespace {

// A launch writing zeros to the output (MatMul with k = 0).
Launch zero_fill(const OpDesc& op, const TensorDesc& out, const ChipConfig& cfg) {
  StreamSpec spec;
  spec.kernel_name = fmt::format("Fill0_{}", data_type_name(out.dtype));
  spec.out_type = device_dtype(out.dtype);
  spec.out_shape = out.shape;
  spec.compute = [size = data_type_bytes(out.dtype)](KernelBuilder& b, const TileOperands& t) {
    vec_dup_bits(b, size, t.out, 0, *t.count);  // x0 = 0
  };
  return build_stream_kernel(op.str(), spec, cfg);
}

}  // namespace

namespace {

// The cube input type, the FIXPIPE output type and the casts around the cube kernel, by dtype
// and precision mode (the file comment).
struct CubeTypes {
  Dtype cube_in, fix_out;
  bool cast_inputs, cast_output;
};

CubeTypes cube_types(const CompileContext& ctx, DataType dt, const MatmulProblem& p) {
  const OpDesc& op = ctx.op;
  const ChipConfig& cfg = ctx.cfg;
  CubeTypes t{device_dtype(dt), device_dtype(dt), false, false};
  if (dt == DataType::BF16 && !cfg.cube_bf16)
    op.fail(fmt::format("bf16 is not supported by the cube of chip {}", cfg.name));
  if (dt == DataType::F32) {
    switch (ctx.precision) {
      case PrecisionMode::kKeepFp32:
        if (cfg.cube_fp32_rate_divisor <= 0)
          op.fail(
              fmt::format("precision mode {}: the cube of chip {} has no fp32 "
                          "(cube.fp32_rate_divisor = 0)",
                          precision_mode_name(ctx.precision), cfg.name));
        if (p.trans_a || !p.trans_b)
          op.fail(
              fmt::format("precision mode {}: fp32 on the cube needs transpose_a = false and "
                          "transpose_b = true (load2d transposes only 16-bit fractals); "
                          "use allow_fp32_to_fp16",
                          precision_mode_name(ctx.precision)));
        break;
      case PrecisionMode::kAllowFp32ToFp16:
        t.cube_in = Dtype::F16;
        t.cast_inputs = true;
        break;
      case PrecisionMode::kAllowMixPrecision:
        t.cube_in = Dtype::F16;
        t.fix_out = Dtype::F16;
        t.cast_inputs = t.cast_output = true;
        break;
    }
  }
  return t;
}

// C = A x B with k = 1 in f32 under allow_fp32_to_fp16: an outer product (every element of C
// is one product, nothing is accumulated), compiled as an f32 broadcast Mul on the vector
// unit. CANN's precision_mode documentation gives allow_fp32_to_fp16 fp16 for matrix (cube)
// operators and keeps f32 for vector operators that have it; the cube's fp16 operands would
// round each input to 11 bits (keras-hub's rotary tables, positions x inverse frequencies:
// positions above 2048 not exact, each angle off by up to position x 2^-11 rad), where the
// vector product is f32's exact product rounded once, as TF's CPU kernels compute it.
// With k = 1 the transposes move no data: each product reads m values of A and n of B, so A is
// viewed as [a's batch dims, m, 1] and B as [b's batch dims, 1, n] (a batch dim is 1 in the
// view where that operand broadcasts: batch stride 0).
bool outer_product_on_vector_applies(const CompileContext& ctx, DataType dt,
                                     const MatmulProblem& p) {
  return p.k == 1 && dt == DataType::F32 && ctx.precision == PrecisionMode::kAllowFp32ToFp16;
}

CompiledKernel outer_product_on_vector(const CompileContext& ctx, const MatmulProblem& p,
                                       const TensorDesc& c) {
  auto view = [&](const std::vector<int64_t>& batch_strides, int64_t rows, int64_t cols) {
    std::vector<int64_t> shape;
    for (size_t d = 0; d < p.batch_dims.size(); ++d)
      shape.push_back(batch_strides[d] != 0 ? p.batch_dims[d] : 1);
    shape.insert(shape.end(), {rows, cols});
    return shape;
  };
  OpDesc mul;
  mul.type = "Mul";
  mul.inputs = {TensorDesc{DataType::F32, view(p.a_batch_strides, p.m, 1)},
                TensorDesc{DataType::F32, view(p.b_batch_strides, 1, p.n)}};
  CompiledKernel out = compile(mul, ctx.cfg, ctx.precision);
  for (Launch& l : out.launches)
    l.summary = fmt::format("k = 1 in f32 on the vector unit: {}", l.summary);
  out.outputs = {c};  // the Mul's [batch, m, n] in the op's own shape (same elements)
  return out;
}

}  // namespace

CompiledKernel compile_matmul(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const bool bias_add = op.type == "MatMulBiasAdd";
  const size_t n_inputs = bias_add ? 3 : 2;
  if (op.inputs.size() != n_inputs)
    op.fail(fmt::format("takes {} inputs, {} given", n_inputs, op.inputs.size()));
  const TensorDesc& a = op.inputs[0];
  const TensorDesc& b = op.inputs[1];
  const DataType dt = a.dtype;
  if (b.dtype != dt)
    op.fail(fmt::format("inputs have different dtypes ({} and {})", data_type_name(dt),
                        data_type_name(b.dtype)));
  if (bias_add && dt != DataType::F32 && dt != DataType::F16)
    op.fail(fmt::format("dtype {} is not supported (f32, or f16 with an f32 bias)",
                        data_type_name(dt)));
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the inputs' {}", data_type_name(*t),
                        data_type_name(dt)));
  if (a.shape.size() != 2 || b.shape.size() != 2)
    op.invalid("inputs must be matrices (rank 2); batched products are BatchMatMul");
  const bool ta = op.attr_bool("transpose_a", false), tb = op.attr_bool("transpose_b", false);
  const int64_t m = ta ? a.shape[1] : a.shape[0], k = ta ? a.shape[0] : a.shape[1];
  const int64_t kb = tb ? b.shape[1] : b.shape[0], n = tb ? b.shape[0] : b.shape[1];
  if (k != kb)
    op.invalid(fmt::format("inner dimensions differ: A gives k = {}, B gives k = {}", k, kb));
  MatmulProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.trans_a = ta;
  p.trans_b = tb;
  if (bias_add) {
    const TensorDesc& bias = op.inputs[2];
    if (bias.dtype != DataType::F32 || bias.shape != std::vector<int64_t>{n})
      op.invalid(fmt::format("bias {} is not f32[{}], the product's columns", bias.str(), n));
    if (auto t = op.attr_type("Tbias"); t && *t != DataType::F32)
      op.fail(
          fmt::format("attribute Tbias = {} is not supported (f32: the bias is added to the "
                      "f32 sum)",
                      data_type_name(*t)));
    p.bias = true;
    p.relu = op.attr_bool("relu", false);
  }
  return matmul_launches(ctx, dt, p, TensorDesc{dt, {m, n}});
}

namespace {

// Where MatMulBiasAdd's bias (and ReLU) is applied (MatmulProblem::bias).
enum class BiasAt {
  kNone,    // no bias
  kCube,    // the cube starts from it (bias table, MatmulTiling::bias); ReLU in FIXPIPE
  kUb,      // the vector unit on the tiles in the UB (MatmulTiling::bias_in_ub)
  kLaunch,  // a vector launch on C after the product (append_bias_epilogue)
};

CompiledKernel product_launches(const CompileContext& ctx, DataType dt, const MatmulProblem& p,
                                const TensorDesc& c, BiasAt bias_at);

// A batched product whose B is shared by every product (all of B's batch strides 0: one stored
// matrix, e.g. keras' EinsumDense `btd,dnh->btnh` as BatchMatMulV2 of x [b, t, d] by the weight
// [d, n*h]) and whose A products are stored one after another untransposed (A [batch.., m, k]
// row-major, no broadcast dim) is one product of A viewed as [batch * m, k] by B: C [batch.., m,
// n] is the same bytes as [batch * m, n] (the product keras' Dense computes for the same layer
// through Tensordot's Reshapes). Batched, each product's m rows (padded to the cube's 16) read
// all of B again; folded, B is read once per row tile of up to tm rows: llama-7b's attention
// projections at batch 16 (m = 1) read their weights once instead of 16 times. Numerics as
// MatMul's (f32 accumulation, one rounding of C).
MatmulProblem fold_shared_b_batch(const MatmulProblem& p) {
  if (p.batch_dims.empty() || p.trans_a || p.b_count != 1) return p;
  int64_t batch = 1;
  for (size_t d = p.batch_dims.size(); d-- > 0;) {
    if (p.batch_dims[d] == 1) continue;  // any stride
    if (p.b_batch_strides[d] != 0 || p.a_batch_strides[d] != batch * p.m * p.k) return p;
    batch *= p.batch_dims[d];
  }
  MatmulProblem folded = p;
  folded.m = batch * p.m;
  folded.batch_dims.clear();
  folded.a_batch_strides.clear();
  folded.b_batch_strides.clear();
  folded.a_count = 1;
  return folded;
}

}  // namespace

CompiledKernel matmul_launches(const CompileContext& ctx, DataType dt, const MatmulProblem& given,
                               const TensorDesc& c) {
  const MatmulProblem p = fold_shared_b_batch(given);
  if (!p.bias) return product_launches(ctx, dt, p, c, BiasAt::kNone);
  if (!p.batch_dims.empty() || c.shape.size() != 2)
    ctx.op.fail("a bias is supported on single (unbatched) products only");
  // Where the product runs on the cube (k >= 1, not outer_product_on_vector): the cube starts from
  // the bias where it has a bias table; where C leaves L0C through the UB in the op's own type
  // (f32, or f16 for an f16 op: the f32 tile gets the bias, then one rounding; not an f32 op
  // whose C is rounded to f16 in FIXPIPE and widened after, allow_mix_precision's cube
  // rounding) and the UB holds the bias table beside the smallest tile, the vector unit adds it
  // there. Else the bias (and ReLU) follow as a vector launch (on an f16 C: a second rounding).
  const ChipConfig& cfg = ctx.cfg;
  BiasAt at = BiasAt::kLaunch;
  if (p.k >= 1 && p.m > 0 && p.n > 0 && !outer_product_on_vector_applies(ctx, dt, p)) {
    const std::string op = ctx.op.str();
    const CoreKindConfig& core = cube_core(cfg, op);
    const CubeTypes types = cube_types(ctx, dt, p);
    const int64_t osz = isa::dtype_size(types.fix_out);
    if (cfg.has_path(Buf::L1, Buf::BT))
      at = BiasAt::kCube;
    else if (cube_store_via_ub(cfg, core, op) && !types.cast_output &&
             matmul_bias_ub_bytes(kFractalRows, kFractalRows, osz, p.n) <=
                 static_cast<int64_t>(core.capacity(Buf::UB)))
      at = BiasAt::kUb;
  }
  CompiledKernel out = product_launches(ctx, dt, p, c, at);
  if (at == BiasAt::kLaunch && c.num_elements() > 0) append_bias_epilogue(out, ctx, 2, p.relu);
  return out;
}

namespace {

// The product's launches; with the bias at kCube or kUb, the cube kernel adds input 2 (f32
// [n]) and applies p.relu (kLaunch: the caller appends them).
CompiledKernel product_launches(const CompileContext& ctx, DataType dt, const MatmulProblem& p,
                                const TensorDesc& c, BiasAt bias_at) {
  const OpDesc& op = ctx.op;
  const ChipConfig& cfg = ctx.cfg;
  const int64_t m = p.m, n = p.n, k = p.k;
  const bool ta = p.trans_a, tb = p.trans_b;
  int64_t batch = 1;
  for (int64_t d : p.batch_dims) batch *= d;
  CompiledKernel out;
  out.outputs = {c};
  if (dt != DataType::F16 && dt != DataType::BF16 && dt != DataType::F32)
    op.fail(
        fmt::format("dtype {} is not supported on the cube (f16, bf16, f32)", data_type_name(dt)));
  if (m == 0 || n == 0 || batch == 0) return out;  // nothing to compute
  if (k == 0) {
    out.launches.push_back(zero_fill(op, c, cfg));
    return out;
  }

  if (outer_product_on_vector_applies(ctx, dt, p)) return outer_product_on_vector(ctx, p, c);

  const CubeTypes types = cube_types(ctx, dt, p);
  const Dtype cube_in = types.cube_in, fix_out = types.fix_out;
  const bool cast_inputs = types.cast_inputs, cast_output = types.cast_output;
  const bool kernel_bias = bias_at == BiasAt::kCube || bias_at == BiasAt::kUb;
  // Under NPUSIM_MATMUL_CORE_SPLIT the tiles are planned for the split's cores and regions.
  const MatmulCoreSplit split = parse_matmul_core_split(matmul_core_split_from_env(), op.str());
  MatmulTiling tiling =
      plan_matmul_tiling(m, n, k, ta, tb, cube_in, fix_out, cfg, op.str(), batch, false,
                         bias_at == BiasAt::kCube, bias_at == BiasAt::kUb, &split);
  tiling.relu = kernel_bias && p.relu;
  tiling.batch_dims = p.batch_dims;
  tiling.a_batch_strides = p.a_batch_strides;
  tiling.b_batch_strides = p.b_batch_strides;
  tiling.a_count = p.a_count;
  tiling.b_count = p.b_count;
  apply_matmul_core_split(tiling, matmul_core_split_from_env(), cfg, op.str());

  // Workspace: the f16 copies of A and B, and the f16 result before widening.
  ArgRef a_arg{ArgRef::Kind::kInput, 0, 0}, b_arg{ArgRef::Kind::kInput, 1, 0};
  ArgRef c_arg{ArgRef::Kind::kOutput, 0, 0};
  if (cast_inputs) {
    a_arg = append_input_cast(out, op, 0, DataType::F16, cfg);
    b_arg = append_input_cast(out, op, 1, DataType::F16, cfg);
  }
  // The cube's C goes to the workspace when it is widened afterwards or has padded rows.
  const bool c_in_workspace = cast_output || tiling.c_pitch != n;
  if (c_in_workspace) {
    c_arg = ArgRef{ArgRef::Kind::kWorkspace, 0, out.workspace_bytes};
    out.workspace_bytes += workspace_align(device_buffer_bytes(
        static_cast<uint64_t>(batch * m * tiling.c_pitch * isa::dtype_size(fix_out))));
  }
  Launch mm;
  mm.kernel = MatmulEmitter(tiling, cfg, op.str()).emit();
  mm.block_dim = tiling.block_dim;
  mm.args = {a_arg, b_arg, c_arg};
  if (kernel_bias) mm.args.push_back(input_ref(2));
  mm.summary = "cube: " + tiling.str();
  out.launches.push_back(std::move(mm));
  if (c_in_workspace) {
    // Workspace C (batch * m x c_pitch, of the FIXPIPE type) -> the output (batch * m x n,
    // dt): a copy or the f16 -> f32 widening, reading rows at the workspace pitch.
    StreamSpec spec = cast_spec(from_device_dtype(fix_out), dt, false, c.shape);
    if (tiling.c_pitch != n && batch * m > 1) {
      spec.inputs[0].view = BroadcastView{{batch * m, n}, {tiling.c_pitch, 1}};
      spec.inputs[0].shape = {batch * m, tiling.c_pitch};
    }
    Launch l = build_stream_kernel(op.str(), spec, cfg);
    l.args = {c_arg, ArgRef{ArgRef::Kind::kOutput, 0, 0}};
    l.summary = fmt::format("workspace C ({} x {} {}) -> output ({})", batch * m, tiling.c_pitch,
                            isa::dtype_name(fix_out), l.summary);
    out.launches.push_back(std::move(l));
  }
  return out;
}

}  // namespace

}  // namespace npusim::compiler::ops
