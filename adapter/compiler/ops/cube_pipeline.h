// The cube skeleton shared by the cube kernels (MatMul / BatchMatMul, the convolution, img2col):
//
//   the split over the cube cores: a block's steps are (its tiles) x (k chunks per tile), its
//     tiles taken round robin (tile = block + j * blocks) or as one contiguous range;
//   the pipeline over a block's steps, software-pipelined by one step (KernelBuilder::
//     pipelined_steps): MTE2 fills L1 buffer step & 1; MTE1 moves a step of k from L1 into L0A
//     and L0B buffer (L0 step count) & 1; M runs mmad into the tile's L0C buffer (init on the
//     tile's first step, accumulate after); FIX takes the tile out of L0C;
//   its flags, a ping/pong pair for each hand-over: L1 full/free (MTE2 <-> MTE1), L0 full/free
//     (MTE1 <-> M), L0C full/free (M <-> FIX); every buffer starts free and the drain consumes
//     the free flags, so a kernel ends with no flag set;
//   the tile choice's shared parts: the cube core, the k per mmad step from the L0A / L0B
//     budgets (BufferPlan), the L0C buffer count, the contiguous split of tiles over cores.
//
// An op supplies how its A / B tiles reach L1 and L0 (its load and compute steps, between the
// skeleton's flag calls) and where its output goes (CubePipeline::store, or its own FIXPIPE
// between l0c_ready and l0c_stored).
//
// The way out of L0C: FIXPIPE writes GM where the chip has an l0c->gm path (split 910B-like
// AIC cores); coupled cores (910, 310P) have none, so FIXPIPE writes the tile into a UB buffer
// and MTE3 copies its rows to GM (FIX -> MTE3 "tile in UB" and MTE3 -> FIX "UB free" flags, one
// UB buffer). UB -> GM moves whole 32-byte blocks: the op keeps its GM rows block-aligned
// (cube_store_via_ub says which way the chip takes).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "adapter/compiler/buffer_plan.h"
#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/ops/fused.h"
#include "isa/isa.h"
#include "sim/config/chip_config.h"

namespace npusim::compiler::ops {

// L0C holds the cube's accumulators as f32: bytes per output element.
constexpr int64_t kL0cElemBytes = 4;

// The cube cores of cfg (AIC on split chips, else AICORE); CompileError naming op if the chip
// has none.
const CoreKindConfig& cube_core(const ChipConfig& cfg, const std::string& op);
// CompileError naming op unless cfg has an l0c->gm path (FIXPIPE writes GM); `what` ends the
// message (who needs it).
void require_l0c_to_gm(const ChipConfig& cfg, const std::string& op, const std::string& what);

// Whether the cube's tiles leave L0C through the UB (no l0c->gm path: coupled chips);
// CompileError naming op if the chip has neither that nor l0c->ub, ub->gm and MTE3 on core.
bool cube_store_via_ub(const ChipConfig& cfg, const CoreKindConfig& core, const std::string& op);

// Bytes per cycle from L0C to GM: the l0c->gm path, or through the UB the l0c->ub and ub->gm
// copies one after the other (one UB buffer: a tile's FIXPIPE waits for the previous tile's
// MTE3).
double cube_store_rate(const ChipConfig& cfg);

// How a cube kernel's GM -> L1 loads move when its `cores` cores read `loaded` bytes in all,
// `unique` of them distinct: each distinct byte comes from HBM once, at the slower of the
// core's gm->l1 path and its share of the sustained HBM bandwidth; the other reads hit the L2
// (the tiles running together share their operands' rows), at the core's L2 read port
// (memory.l2.core_read_bytes_per_cycle) or its share of the L2's bandwidth, the lower. A chip
// without an L2 misses all. cycles_per_byte: the mean over the bytes; hit_share: the share that
// hits; access_latency: a load's wait for the memory (cycles), the L2's latency for the hitting
// share and HBM's for the rest (the gm->l1 path's own start latency not included).
// miss_rate: the bytes per cycle of a miss (a cold load).
struct CubeLoadRate {
  double cycles_per_byte = 0, hit_share = 0, access_latency = 0, miss_rate = 0;
};
CubeLoadRate cube_load_rate(const ChipConfig& cfg, double cores, double unique, double loaded);

// The largest k per mmad step (a multiple of 16, at most max_k) for an output tile of tm x tn
// with inputs of isz bytes: two L0A buffers of tm x k and two L0B buffers of k x tn on core
// (BufferPlan). 0 if not even 16 fits.
int64_t cube_k_step(const CoreKindConfig& core, const ChipConfig& cfg, int64_t tm, int64_t tn,
                    int64_t isz, int64_t max_k);

// L0C buffers for a tile of tile_bytes on core: 2 (FIXPIPE of a tile overlaps the next tile's
// mmads) if two fit, else 1, else 0.
int l0c_buffer_count(const CoreKindConfig& core, const ChipConfig& cfg, int64_t tile_bytes);

// Whether plan's buffers, laid out from the start of its buffer kind, fit on core.
bool plan_fits(const BufferPlan& plan, const ChipConfig& cfg, const CoreKindConfig& core);

// Tiles split into contiguous ranges: block b takes tiles [b * per, min(tiles, (b + 1) * per)).
struct CubeSplit {
  int64_t per = 0;
  int block_dim = 0;
};
CubeSplit contiguous_split(int64_t tiles, int64_t cores);

// Flag names of an op's pipeline (shown in the listing).
struct CubeFlagNames {
  const char* l1_full;
  const char* l1_free;
  const char* l0_full;
  const char* l0_free;
  const char* l0c_full;
  const char* l0c_free;
};

// d = base[0] + parity * (base[1] - base[0])
void select(KernelBuilder& b, const Reg& d, const Reg& parity, const Twin& base);
// d = round_up(x, 16)
void round16(KernelBuilder& b, const Reg& d, const Reg& x);

// Bytes of a UB table of f32 entries, one per channel, for CubePipeline::ChannelAffine: the
// channels rounded up to whole vector repeats (64 f32 lanes) plus one more repeat, so that a
// column group's repeat starting at any channel stays inside the table (lanes past the last
// channel are read and masked off).
int64_t channel_table_bytes(int64_t channels);

// MTE2 copies each f32 GM argument (name, `channels` entries) into its UB table (address), then
// hands the tables to the vector unit (an MTE2 -> V flag named `what`, set and waited here).
// Call once per block before any tile reaches the vector unit (CubePipeline::Hooks::setup).
struct ChannelTable {
  const char* arg;
  uint64_t ub;
};
void load_channel_tables(KernelBuilder& b, const std::vector<ChannelTable>& tables,
                         int64_t channels, const char* what);

// One cube kernel's pipeline: flags, split and step loop. Call in this order: block_steps_*,
// declare_flags, run (whose load and compute steps use the flag calls below).
class CubePipeline {
 public:
  CubePipeline(KernelBuilder& b, int l0c_buffers) : m_b(b), m_l0c_buffers(l0c_buffers) {}

  // Tiles leave L0C through the UB buffer at ub_tile (its UB address, room for the largest
  // tile as the output type with rows rounded up to 32-byte blocks): call before declare_flags
  // when cube_store_via_ub.
  void store_via_ub(uint64_t ub_tile) {
    m_via_ub = true;
    m_ub_tile = ub_tile;
  }
  bool via_ub() const { return m_via_ub; }

  // A per-channel affine epilogue on the way through the UB (the batch norm at inference on
  // coupled chips, CubeConvSpec::bn_affine; MatMul's bias, MatmulTiling::bias_in_ub): FIXPIPE
  // writes the tile as f32 into the UB buffer at tile32 (room for the largest tile in rows of
  // row_blocks32 blocks), the vector unit computes y = y * a[c] + shift[c] in place and rounds it
  // once (RNE) into store_via_ub's buffer as the output type, then applies `act` there (an f32
  // output: `act` in place, then copied there, its rows packed to the output's pitch), MTE3 stores
  // that. a and shift: UB addresses of f32 tables indexed by channel (the Store's channel0 +
  // column), readable 64 lanes past the last channel, loaded by the op before the steps (its own
  // MTE2 -> V hand-over). Call after store_via_ub, before declare_flags. max_rows x max_cols: the
  // largest tile; row_blocks32: the f32 tile's row pitch in blocks
  // (>= max_cols / 8, at most a repeat stride's 255). dense (ConvBnTables): every tile's rows
  // are exactly max_cols (16 or 32) lanes in both the f32 tile and the output, so the tile is
  // one contiguous run and a and shift are the replicated tables, 256 bytes per max_cols
  // channels (the tile's at channel0 / max_cols * 256).
  // buffers (1, or 2 with two L0C buffers): f32 and output tiles (tile32 and `out`, the
  // latter replacing store_via_ub's) per L0C parity, so that one tile's vector pass overlaps
  // the next tile's FIXPIPE and the previous tile's store.
  struct ChannelAffine {
    Twin tile32, out;
    int buffers = 1;
    uint64_t a = 0, shift = 0;
    Activation act = Activation::kNone;
    int64_t max_rows = 0, max_cols = 0, row_blocks32 = 0;
    bool dense = false;
    // y + shift[c] only: the factor is in the cube's filter (the convolution's f16(W * a)) or
    // there is none (MatMul's bias); `a` is then not read.
    bool shift_only = false;
    // One more f32 tile at result32_at (one for both parities: the vector unit works on one
    // tile at a time) in other UB banks than tile32's: y * a goes there and + shift back into
    // tile32 (with a in the filter, y + shift goes there), so no f32 pass reads and writes the
    // same banks in a repeat. Without it the passes run in place.
    bool result32 = false;
    uint64_t result32_at = 0;
    const char* what = "batch norm";  // the epilogue's name in the listing
    // > 0 (MatMul's bias): tiles up to band_tile_cols columns leave L0C in column bands of
    // max_cols columns (L0C's NZ column blocks are contiguous), each band FIXPIPE'd into the
    // f32 buffer, shifted, rounded and stored on its own, the bands taking the two buffer pairs
    // in turn (buffers = 2, whatever the L0C buffers): the UB holds two bands, not whole tiles,
    // and one band's vector pass and store overlap the next band's FIXPIPE. Not with dense,
    // result32 or a residual.
    int64_t band_tile_cols = 0;
    // y's rows unpadded though not whole blocks (CubeConvSpec::y_packed; needs dense and
    // result32): every tile holds all Store::pitch channels of its rows, which are
    // consecutive rows of y, and rows * pitch elements are whole 32-byte blocks. After the
    // affine pass the vector unit packs the f32 rows to pitch lanes into the f32 tile the
    // pass left free, rounds them as one run into the output tile and MTE3 stores the tile as
    // one run of rows * pitch elements (a residual loaded and added the same way).
    bool packed = false;
    // > 0 (not with dense; a narrower output): the tiles' f32 rows are max_cols lanes, not a
    // multiple of 64, and a and shift are periodic tables (ConvBnTables::period): per n tile
    // (the Store's channel0 / max_cols) `period` lanes, its max_cols channels repeated. The
    // affine passes run over the tile's lanes as period / 64 runs, run j taking every
    // (period / 64)-th repeat from repeat j and table lanes [64 j, 64 j + 64): rows rounded
    // up to whole periods (max_rows must be a multiple of period / max_cols), every lane of
    // every repeat used, where column groups of 64 lanes leave the last one partly masked.
    int64_t period = 0;
  };
  void affine_via_ub(const ChannelAffine& e) {
    m_affine = true;
    m_aff = e;
    m_add_relu_conv = add_relu_conv_enabled();
  }
  // A residual added on the way out (CANN's Conv2D + BNInference + Add): for each tile MTE2
  // loads the residual's rows (GM at the tile's y address - y + residual: the residual has y's
  // type and row pitch) into `tiles` (output tiles' size, one per L0C parity) while the cube
  // and FIXPIPE work; after the rounding to the output type the vector unit adds them to the
  // output tile (in the output type), then applies the activation. The kernel's arguments
  // y_arg and residual_arg give the two base addresses. Call after affine_via_ub, before
  // declare_flags.
  void residual_via_ub(const Twin& tiles, std::string y_arg, std::string residual_arg) {
    m_residual = true;
    m_res_tiles = tiles;
    m_res_args = {std::move(y_arg), std::move(residual_arg)};
  }

  // steps = (tiles of this block: tile = block + j * blocks, j = 0, 1, ...) * chunks.
  void block_steps_round_robin(const Reg& steps, int64_t tiles, int64_t chunks);
  // steps = (tiles in [first, min(tiles, first + per)), first = block * per) * chunks.
  void block_steps_contiguous(const Reg& steps, const Reg& first, int64_t tiles, int64_t per,
                              int64_t chunks);
  void declare_flags(const CubeFlagNames& names);

  // Every buffer free, the L0 step counter, setup() (the op's own registers and flags), the
  // pipelined steps, the drain. start_free / drain: the op's own buffers' flags (inside the
  // skeleton's).
  struct Hooks {
    std::function<void()> start_free, setup, drain;
  };
  void run(const Reg& steps, const std::function<void(const Reg&)>& load,
           const std::function<void(const Reg&)>& compute, const Hooks& hooks = {});
  // Releases the pipeline's own register (after run, before another section of the kernel
  // begins: no register may be held then).
  void release_registers() { m_l0_steps.release(); }

  // p = step & 1 (the L1 buffer of step s).
  void l1_parity(const Reg& p, const Reg& s) { m_b.and_(p, s, 1); }
  // MTE2 side: wait until L1 buffer p is free; signal it loaded.
  void l1_wait_free(const Reg& p, const std::string& c = {}) { m_b.wait_flag(m_l1_free, p, c); }
  void l1_loaded(const Reg& p, const std::string& c = {}) { m_b.set_flag(m_l1_full, p, c); }
  // MTE1 side: wait until L1 buffer p is loaded; signal it read.
  void l1_wait_loaded(const Reg& p, const std::string& c = {}) { m_b.wait_flag(m_l1_full, p, c); }
  void l1_read(const Reg& p, const std::string& c = {}) { m_b.set_flag(m_l1_free, p, c); }

  // q = (L0 steps so far) & 1; next_l0_step() counts a step.
  void l0_parity(const Reg& q) { m_b.and_(q, m_l0_steps, 1); }
  void next_l0_step() { m_b.add(m_l0_steps, m_l0_steps, 1); }
  // L0 buffers q: MTE1 waits until free, then hands them to M (set and wait: M waits for
  // MTE1's loads); M frees them after its mmad.
  template <typename Parity>
  void l0_wait_free(const Parity& q, const std::string& c = {}) {
    m_b.wait_flag(m_l0_free, q, c);
  }
  template <typename Parity>
  void l0_loaded(const Parity& q, const std::string& c = {}) {
    m_b.set_flag(m_l0_full, q, c);
    m_b.wait_flag(m_l0_full, q);
  }
  template <typename Parity>
  void l0_read(const Parity& q, const std::string& c = {}) {
    m_b.set_flag(m_l0_free, q, c);
  }

  // The mmad of one step into L0C buffer pt: on the tile's first step (chunk ch == 0 and k
  // offset kk == 0) it waits for the L0C buffer and starts with init `first_init` (0: zeros,
  // 2: the bias row bt in BT), after that it accumulates (init 1). With block_start (the k
  // offset where the step's column block of a block-diagonal B begins, CubeConvSpec::
  // b_diagonal) a later step with kk == block_start starts its column block from zeros too.
  struct Mmad {
    isa::Dtype type;
    const Reg &l0c, &l0a, &l0b, &m, &k, &n;
  };
  // With unit_flags() on, last_step (nonzero on the tile's last step, else 0) picks each
  // mmad's unit flag: .uf3 on the tile's last step, .uf2 before it.
  void mmad(const Mmad& op, const Reg& pt, const Reg& ch, const Reg& kk, int first_init = 0,
            const Reg* bt = nullptr, const char* first_comment = "C = A * B",
            const Reg* block_start = nullptr, const Reg* last_step = nullptr);

  // UnitFlag between the cube and FIXPIPE (isa::UnitFlag; Ascend C's MmadParams::unitFlag and
  // FixpipeParamsV220::unitFlag): a tile's mmads carry unit flags (mmad's last_step), store()'s
  // FIXPIPE is .uf3 and l0c_ready sets and waits no M -> FIX flag: FIXPIPE starts once the
  // tile's chain has begun and moves C as the last mmad completes it. The L0C free flags stay.
  // Only on the direct way out (FIXPIPE to GM, not store_via_ub); call before run.
  void unit_flags() { m_unit_flags = true; }
  bool unit_flags_on() const { return m_unit_flags; }

  // M's tiles in L0C buffer pt (FIX side): l0c_ready signals and waits for the tile and sets
  // l0c to its L0C address; l0c_stored frees the buffer after the op's FIXPIPE.
  void l0c_wait_free(const Reg& pt, const std::string& c = {}) { m_b.wait_flag(m_l0c_free, pt, c); }
  void l0c_ready(const Reg& pt, const Reg& l0c, const Twin& l0c_buf);
  void l0c_stored(const Reg& pt) { m_b.set_flag(m_l0c_free, pt); }

  // The tile's rows x cols (ND, f32 in L0C at l0c) to dst in GM as out_type, `pitch` elements
  // per GM row, max(y, 0) with relu; then frees L0C buffer pt. Through the UB (store_via_ub)
  // every row moves as whole 32-byte blocks: pitch * element size and dst must be multiples of
  // 32 bytes, and the columns up to the next block boundary must be the caller's to overwrite.
  struct Store {
    isa::Dtype out_type;
    const Reg &dst, &l0c, &rows, &cols;
    int64_t pitch;
    bool relu = false;
    const Reg* channel0 = nullptr;  // affine_via_ub: the tile's first channel (a multiple of 8)
  };
  void store(const Store& s, const Reg& pt);
  // Through the UB in parts (a tile whose rows go to several places in GM): to_ub writes the
  // tile into the UB buffer (ND, rows of row_blocks 32-byte blocks: set here) once it is free
  // and frees L0C buffer pt; ub_to_gm copies `rows` UB rows from row *first (nullptr: row 0) to
  // dst, pitch_blocks blocks apart in GM; ub_done frees the UB buffer.
  void to_ub(const Store& s, const Reg& pt, const Reg& row_blocks);
  // ChannelAffine::band_tile_cols: the tile's column bands through the UB to GM, then frees
  // L0C buffer pt.
  void store_in_bands(const Store& s, const Reg& pt);
  void ub_to_gm(const Reg& dst, const Reg* first, const Reg& rows, const Reg& row_blocks,
                int64_t pitch_blocks);
  void ub_done();

 private:
  // f(flag pair, parity) for every buffer's free flag, in the order they are set and drained.
  void each_free_flag(const std::function<void(const FlagPair&, int)>& f) const;

  KernelBuilder& m_b;
  int m_l0c_buffers;
  Reg m_l0_steps;
  FlagPair m_l1_full, m_l1_free, m_l0_full, m_l0_free, m_l0c_full, m_l0c_free;
  // The affine epilogue on the UB tile (after FIXPIPE, before MTE3): rows x cols f32 at
  // tile32 in rows of row_blocks32 blocks -> the output tile (rows of row_blocks blocks).
  void affine_in_ub(const Store& s, const Reg& pt, const Reg& row_blocks);
  // ChannelAffine::period: the affine passes over the f32 tile of parity pt as runs (registers
  // the caller's scratch: mask, rep, table, y, res).
  void affine_periodic(const Store& s, const Reg& pt, const Reg& mask, const Reg& rep,
                       const Reg& table, const Reg& y, const Reg& res);
  // dense: the tile as one run of rows * max_cols lanes (counter mode).
  void affine_dense_in_ub(const Store& s, const Reg& pt);
  // ChannelAffine::packed, after the affine pass (its f32 result at y): the rows packed to
  // s.pitch lanes into the free f32 tile (at: set here), then rounded (or copied) into the
  // output tile of parity pt as one run; n a scratch.
  void affine_pack_rows(const Store& s, const Reg& pt, const Reg& y, const Reg& at, const Reg& n);
  // The f32 run at f32 (the current mask count's lanes) rounded once (an f32 output: copied)
  // into the output tile of parity pt (out: set to its address); `what` comments the rounding.
  void affine_round_run(const Store& s, const Reg& pt, const Reg& out, const Reg& f32,
                        const char* what);
  // The blocks of the largest packed tile (max_rows x s.pitch elements).
  int64_t packed_run_blocks(const Store& s) const;
  // The activation in place on the lanes of type t at y (the current mask), `scalar` a scratch.
  void affine_activation(isa::Dtype t, Opnd y, Opnd repeat, int64_t rep_stride, const Reg& scalar);
  // The activation after the rounding to a narrower output (or after the residual) on the
  // output tile of parity pt, rows of row_blocks blocks, as one run.
  void affine_output_activation(const Store& s, const Reg& pt, const Reg& row_blocks);
  // The same without vaddreluconv's ReLU: ReLU or ReLU6's two clamps.
  void affine_output_activation_unfused(const Store& s, const Reg& pt, const Reg& row_blocks);
  // ReLU6 on the output tile (type t, `scalar` lanes in counter mode) through a scratch in
  // the f32 tile's room of parity pt (free after the rounding), where it fits
  // (clamp_scratch_fits); clamp_scratch_offset(q): the scratch's offset in f32 tile q.
  bool clamp_scratch_fits() const;
  uint64_t clamp_scratch_offset(int q) const;
  // The UB bank span (banks x bank width, bytes; one block without bank geometry) the clamp
  // scratches are placed in (half a span from the output tile modulo it); 0 when half a span
  // is not a multiple of the UB alignment (a scratch there would be a misaligned operand): the
  // clamps then run in place.
  uint64_t clamp_scratch_span() const;
  void affine_relu6_via_scratch(isa::Dtype t, const Reg& out, const Reg& pt, const Reg& scalar);
  // residual_via_ub: MTE2 loads the tile's residual rows (rows of row_blocks blocks); the
  // vector unit adds them to the output tile of parity pt.
  void load_residual(const Store& s, const Reg& pt, const Reg& row_blocks);
  void add_residual(const Store& s, const Reg& pt, const Reg& row_blocks);

  // Whether the chip's vector unit has vaddreluconv (vector.add_relu_conv) and
  // NPUSIM_FUSION_ADD_RELU_CAST is not "0" (read at every compile; anything but unset, "0" or
  // "1" fails the compile naming the variable).
  bool add_relu_conv_enabled() const;
  // Whether the way out of an f16 tile with ReLU6 (no residual) takes the last f32 pass
  // (+ shift), the ReLU and the rounding in one vaddreluconv into the output tile (Ascend's
  // AddReluCast): the dense run, the periodic runs when the tile's columns are whole_cols, the
  // column groups. ReLU6 then clamps at 6 only, on the f16 lanes (min(round(x), 6) =
  // round(min(x, 6)): rounding is monotone and 6 exact).
  bool add_relu_conv(const Store& s) const;
  // n = the output tile's lanes (rows of row_blocks blocks of s.out_type) and the counter mask
  // set to them.
  void count_output_lanes(const Store& s, const Reg& row_blocks, const Reg& n);
  // Where vaddreluconv writes the f16 result: the output tile, or for ReLU6 a scratch half a
  // bank span from the output tile modulo the span, from which min 6 goes into the output tile
  // out of place (in place each repeat reads and writes the same banks: docs/chip_model.md's
  // bank model): in the result tile where the pass leaves it free (shift_only, result32;
  // relu6_scratch_at(q) for output tile q), or in the f32 tile where the dense pass has moved
  // y * a to the result tile (clamp_scratch_offset).
  Twin add_relu_conv_dst() const;
  uint64_t relu6_scratch_at(int q) const;
  // The column count whose f16 rows fill both the output tile's and the f32 tile's rows exactly
  // (the rounding then is one counter-mode run over the tile); 0: none (an f32 output).
  int64_t whole_cols(const Store& s) const;
  // affine_periodic's runs: + shift into the f32 result (fused false) or, fused, + shift, ReLU
  // and the rounding into the output tile (tiles of whole_cols columns only; out: a scratch).
  void periodic_runs(bool fused, const Reg& pt, const Reg& rep, const Reg& table, const Reg& y,
                     const Reg& res, const Reg& out);

  // One mmad of mmad(): with unit flags and last_step, one for each flag by last_step.
  void emit_mmad(const Mmad& op, int init, const Reg* bias, const char* comment,
                 const Reg* last_step);

  bool m_via_ub = false;
  bool m_unit_flags = false;
  bool m_add_relu_conv = false;
  uint64_t m_ub_tile = 0;
  int m_ub_full = -1, m_ub_free = -1;  // FIX -> MTE3 and MTE3 -> FIX (through the UB)
  bool m_affine = false;
  ChannelAffine m_aff;
  // affine: FIX -> V (the f32 tile in the UB), V -> MTE3 (the output tile), MTE3 -> FIX (both
  // free), by L0C parity; m_aff_pt: the parity of the tile being stored (to_ub .. ub_done).
  // With bands (ChannelAffine::band_tile_cols) m_aff_free is MTE3 -> V (the output band
  // stored) and m_aff_f32_free V -> FIX (the f32 band read).
  FlagPair m_aff_f32_full, m_aff_full, m_aff_free, m_aff_f32_free;
  const Reg* m_aff_pt = nullptr;
  // residual_via_ub: MTE2 -> V (the residual tile loaded), V -> MTE2 (added: free), by parity.
  bool m_residual = false;
  Twin m_res_tiles;
  std::pair<std::string, std::string> m_res_args;  // y, residual
  FlagPair m_res_full, m_res_free;
};

// Rows of a cube product stored at strided places of an argument (the strided input gradient:
// dx's positions (sh*i, sw*j)): row t of run q goes to element (q / runs_per_group) *
// group_pitch + (q % runs_per_group) * run_pitch + t * row_pitch, `cols` elements each; the
// argument holds `elements` elements. run_rows 0: not strided.
struct StridedRows {
  int64_t run_rows = 0, row_pitch = 0, run_pitch = 0, runs_per_group = 0, group_pitch = 0;
  int64_t cols = 0, elements = 0;
};

// The UB buffer of zeros emit_strided_zeros copies from (bytes).
inline constexpr int64_t kStridedZeroBufferBytes = 32 * 1024;

// Whether emit_strided_zeros can write r's zeros on cfg for elements of osz bytes: vector cores,
// and cols, the pitches and the gaps whole 32-byte blocks, a run's gaps within the zero buffer.
bool strided_zeros_fit(const StridedRows& r, int64_t osz, const ChipConfig& cfg);

// Whether cfg's L0C alignment lets store_strided_rows start a fixpipe at any row of an L0C
// column block (a run may begin at any row of a tile): the rows of a 16-column block lie 16 f32
// (64 bytes) apart, so alignment.l0c must divide 64 bytes. Where it does not, no strided input
// gradient applies (append_strided_input_grad).
bool strided_rows_fit_l0c(const ChipConfig& cfg);

// FIXPIPE (to GM) of a tile's rows [r0, r0 + rows) of r, at L0C address l0c (NZ, rows padded to
// round16(rows)), `cols` columns, to dst (the argument's address plus the tile's first column,
// bytes), run by run: one ND fixpipe per (run the tile holds, 16-column block). A block's rows
// are contiguous in L0C from any row; a fixpipe of more blocks would read them round16(its
// rows) apart. The caller frees the L0C buffer after it. A CompileError naming alignment.l0c
// unless strided_rows_fit_l0c.
void store_strided_rows(KernelBuilder& b, const StridedRows& r, isa::Dtype out_type, bool relu,
                        const Reg& dst, const Reg& l0c, const Reg& r0, const Reg& rows,
                        const Reg& cols);

// The vector section of a launch whose cube cores store r's rows: writes zeros to every element
// of argument `arg` (of osz bytes) the rows do not (after each row of a run but its last, the
// row pitch's gap; after a run's last row, up to the next run or the group's end). Vector core
// v of the launch's block_dim * aiv_per_aic takes runs v, v + those, ...: from a zeroed UB
// buffer by MTE3, one copy of run_rows - 1 bursts for the gaps, then the span in pieces of the
// buffer. Bytes disjoint from the cube cores', so no flag between them. Needs
// strided_zeros_fit.
void emit_strided_zeros(KernelBuilder& b, const StridedRows& r, int64_t osz, int block_dim,
                        const std::string& arg);

}  // namespace npusim::compiler::ops
