// The cube convolution kernel (ops/conv.h, build_cube_conv) on the cube skeleton
// (ops/cube_pipeline.h: split, flags, pipelined steps, mmad init/accumulate, L0C hand-over).
//
// One block per cube core; block b takes a contiguous range of tiles, tile
// index = ((g * n_tiles + nt) * stacks + stack) * m_tiles + mt, so consecutive tiles of a block
// share their weights, or position-major (CubeConvTiling::spatial_major) ((stack * m_tiles + mt)
// * keys + g * n_tiles + nt), so that a block walks its positions and at each every weight key
// (weights then streamed: a block's consecutive tiles change key). A stack is one image, or with
// stacking (CubeConvTiling::stack > 1) several images placed one above the other with zero rows
// between them (one tall map whose m tiles run across images: small images are not each rounded up
// to 16 positions). For every (tile, k chunk) step, software-pipelined by one step:
//   MTE2  the feature-map slab of the tile (the input rows its output rows need, all columns,
//         the chunk's channel blocks) into L1 buffer step & 1 as NC1HWC0 [c1][rows][W][16]:
//         one nd2nz per channel block (NHWC rows -> one 16-channel plane, padding channels
//         zero), or where the tiling says so (CubeConvTiling::whole_pixels: the chip prices
//         the per-plane load's 32-byte GM bursts) one nd2nz of whole pixels whose column
//         blocks are the planes (dst_rows = the plane's pixels); with zero insertion the slab is
//         zeroed first (an nd2nz whose zero-filled padding covers it) and the stored pixels are
//         copied into place (nd2nz per row when up_w = 1, else copy_gm2l1 per pixel over all
//         planes). Streamed weights: the chunk's B in L1 too, one nd2nz per k-block (16 input
//         channels, one tap) straight from the weight layout, so L1 holds B's L0B image (kRowsN) or
//         its fractal transpose (kRowsK); kRowsN by tap (CubeConvTiling::weights_by_tap: the chip
//         prices the 32-byte rows' bursts) one nd2nz per tap of all the chunk's channels, the
//         chunk's k-blocks then tap-major in L1.
//   MTE1  per mmad step: load3d (img2col of the slab, the tile's rows, k range) into L0A and one
//         load2d of B into L0B (transposing each fractal for kRowsK; by tap one per k-block);
//   M     mmad into the tile's L0C buffer; FIX after the last chunk: L0C -> y (ND, exact rows
//         and channels, so NHWC outputs with any channel count are written in place; stacked:
//         per image of the tile and 16 channels, dropping the rows between images). Coupled
//         chips (no l0c->gm path): L0C -> UB, then MTE3 copies the rows (stacked: each image's
//         rows) to y in whole 32-byte blocks (CubePipeline::store).
//   Stacked slabs are zeroed first (one nd2nz whose zero padding covers them), then each
//   image's rows are copied into each plane.
//   Resident weights: the whole B of a (group, n tile) in one L1 buffer. The first tile of a
//   block that needs it loads it chunk by chunk, each chunk in the compute step that first
//   reads it (MTE2 -> MTE1 flag), the first chunk after MTE1 has drained the previous weights
//   (MTE1 -> MTE2 flag); blocks change weights rarely since their tiles are contiguous. On
//   split chips the later chunks whose key is settled load in their step's load stage, right
//   after its slab (weights_ahead), not behind the next step's slab.
// Block-diagonal groups (CubeConvSpec::b_diagonal, several depthwise 16-channel groups per
// step): L1 holds only B's diagonal blocks (one nd2nz per k-block of a block's columns), each
// channel block's mmad steps write only its own column block of the L0C tile (the first from
// zeros), and a dense slab whose planes are whole fractals is loaded by one nd2nz for all
// its planes; one FIXPIPE, epilogue and store serve the step's groups.
// load3d's set_fmatrix takes the paddings as immediates; a tile's slab starts at the first
// input row it needs (top padding only for the first output rows, bottom only for the last),
// so the kernel selects among the few (top, bottom) pairs the tiling produces.
#include <algorithm>
#include <numeric>

#include <fmt/format.h>

#include "adapter/compiler/ops/batchnorm.h"
#include "adapter/compiler/ops/channel.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/conv_slab.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/int_math.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using isa::Pipe;

namespace {

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
  SlabEmitter::set_window(g, s);
  g.oh = t.tall_oh;
  g.ow = s.ow();
  g.tm = t.tm;
  g.stack = t.stack;
  g.period = t.period;
  g.x_pixel = s.x_pixel;
  g.x_row = s.x_row;
  g.x_image = s.x_image;
  g.planes_at_once = s.b_diagonal && t.stack == 1 && s.x_row == 0 && s.up_h == 1 && s.up_w == 1 &&
                     s.ext_h == 0 && s.ext_w == 0;
  g.whole_pixels = t.whole_pixels;
  g.strided_by_pixel = t.strided_pixels;
  return g;
}

// The convolution kernel of a tiling (see the file comment).
class ConvEmitter {
 public:
  ConvEmitter(const CubeConvSpec& s, const CubeConvTiling& t, const ChipConfig& cfg,
              const std::string& op)
      : m_s(s),
        m_t(t),
        m_b(s.name.empty()
                ? fmt::format("Conv_{}_{}", isa::dtype_name(s.in_type), isa::dtype_name(s.out_type))
                : s.name,
            op, cfg),
        m_slab(m_b, slab_geometry(s, t)),
        m_isz(isa::dtype_size(s.in_type)),
        m_osz(isa::dtype_size(s.out_type)),
        m_taps(s.kh * s.kw),
        m_pipe(m_b, t.l0c_buffers),
        m_staggered_weights(conv_staggered_weights(s, t, cfg, op)) {}

  BuiltKernel emit() {
    // bn_stats needs cross-core flag ids 0 to kPartialsStored (after a barrier) and up to
    // kTileTaken per tile (stats_per_tile() falls back to the barrier where those do not fit).
    if (m_s.bn_stats && kPartialsStored >= m_b.config().cross_core_flag_ids)
      m_b.fail(fmt::format(
          "the convolution with batch-norm statistics needs {} cross-core flag ids; the chip "
          "has {} (sync.cross_core_flag_ids)",
          kPartialsStored + 1, m_b.config().cross_core_flag_ids));
    // The statistics on one vector core per cube core under NPUSIM_MIX_ONE_TO_ONE=bn_reduce or 1,
    // or where unset and the caller asks it (bn_stats_one_to_one_by_default; both sections split
    // the block's rows and partials by the builder's ratio).
    if (m_s.bn_stats && mix_one_to_one_enabled(m_b.op(), OneToOneMix::bn_reduce,
                                               m_s.bn_stats_one_to_one_by_default))
      m_b.set_aiv_per_aic(1);
    cube_section();
    if (m_s.y_zero_fill) emit_strided_zeros(m_b, m_s.y_strided, m_osz, m_t.block_dim, "y");
    if (stats_per_tile())
      emit_tile_stats();
    else if (m_s.bn_stats)
      emit_stats();
    return m_b.finish();
  }

  int stats_blocks() const { return m_stats_blocks; }

 private:
  // The cube section (its registers released before a vector section begins).
  void cube_section() {
    KernelBuilder& b = m_b;
    b.begin_section(b.cube_core_kind());
    if (m_t.spatial_major && resident())
      b.fail("internal: position-major tiles stream their weights");
    allocate();
    b.declare_arg("x", m_s.in_type, {m_s.images, m_s.hs, m_s.ws, m_s.cs});
    b.declare_arg("w", m_s.in_type, {});
    if (strided_y()) {
      if (stacked() || m_s.groups > 1 || m_s.bias || m_s.bn_affine || m_s.bn_stats ||
          m_s.residual || m_pipe.via_ub() || m_s.y_strided.run_rows != m_s.ow() ||
          m_s.y_strided.row_pitch != m_s.pitch())
        b.fail(
            "internal: a strided y needs FIXPIPE to GM, one group, unstacked tiles, no "
            "epilogue but ReLU, runs of ow positions pitch() apart");
      b.declare_arg("y", m_s.out_type, {m_s.y_strided.elements});
    } else {
      b.declare_arg("y", m_s.out_type, {m_s.images, m_s.oh(), m_s.ow(), m_s.pitch()});
    }
    if (m_s.bias) b.declare_arg("bias", Dtype::F32, {m_s.cy});
    if (m_s.bn_affine) {
      b.declare_arg("a", Dtype::F32, {m_s.cy});
      b.declare_arg("shift", Dtype::F32, {m_s.cy});
    }
    if (m_s.residual)
      b.declare_arg("residual", m_s.out_type, {m_s.images, m_s.oh(), m_s.ow(), m_s.pitch()});
    if (m_s.residual) {
      if (!m_s.bn_affine || stacked() || m_s.pitch() != m_s.cy ||
          (!m_s.y_packed && (m_s.cy * m_osz) % 32 != 0))
        b.fail(
            "internal: a residual needs the batch norm in the epilogue, unstacked tiles and "
            "a dense y");
      m_pipe.residual_via_ub(m_res_tiles, "y", "residual");
    }
    b.emit(Opcode::op_set_l3d_geom, {m_s.kh, m_s.kw, m_s.sh, m_s.sw, m_s.dh, m_s.dw},
           "window geometry (fixed)");
    Reg steps = b.reg("steps of this block: tiles x chunks");
    Reg tbeg = b.reg("first tile of this block");
    m_tbeg = &tbeg;
    m_pipe.block_steps_contiguous(steps, tbeg, m_t.tiles, m_t.tiles_per_block, m_t.chunks);
    m_pipe.declare_flags({"L1 slab loaded", "L1 slab free", "L0 step loaded", "L0 step free",
                          "L0C tile computed", "L0C tile stored"});
    if (resident()) {
      m_b_drained = b.flag(Pipe::MTE1, Pipe::MTE2, "weights no longer read");
      m_b_loaded = b.flag(Pipe::MTE2, Pipe::MTE1, "weights loaded");
      if (chunks_ahead())
        m_b_ahead = b.flag_pair(Pipe::MTE2, Pipe::MTE1, "weights loaded by load_step");
    }
    Reg prev_key;
    CubePipeline::Hooks hooks;
    hooks.setup = [&] {
      if (m_s.bn_affine) load_bn_tables();
      prev_key =
          b.reg_imm("resident weights: 2 * (group * n_tiles + n tile) + loading (-2: none)", -2);
      m_prev_key = &prev_key;
    };
    m_pipe.run(
        steps, [&](const Reg& t) { load_step(t); }, [&](const Reg& s) { compute_step(s); }, hooks);
    if (stats_per_tile()) {
      m_pipe.release_registers();  // (each tile was handed over after its FIXPIPE)
    } else if (m_s.bn_stats) {
      // FIX is in order: after its last tile's FIXPIPE this block's part of y is in GM. A
      // barrier of the launch's cube cores, then each tells its own vector cores.
      KernelBuilder::Origin o(b, "y complete: hand it to the vector cores");
      b.emit(Opcode::op_cc_set, {Pipe::FIX, kCcAllCube, kTilesStored}, "this core's tiles stored");
      b.emit(Opcode::op_cc_wait, {Pipe::FIX, kTilesStored}, "wait: every cube core's tiles");
      b.emit(Opcode::op_cc_set, {Pipe::FIX, kCcGroup, kYStored}, "y stored: to the vector cores");
      m_pipe.release_registers();
    } else if (m_s.y_zero_fill) {
      m_pipe.release_registers();
    }
    m_tbeg = nullptr;  // (its register ends with the section)
    b.end();
  }

  // Cross-core flags of bn_stats (cc_set modes: 0 all cores of the setter's kind in the
  // launch, 2 a cube core with its vector cores).
  static constexpr int kCcAllCube = 0, kCcGroup = 2;
  static constexpr int kTilesStored = 0, kYStored = 1, kPartialsStored = 2;
  // bn_stats_per_tile: a tile stored (cube -> its vector cores), a tile taken (each vector core
  // -> its cube core).
  static constexpr int kTileStored = 3, kTileTaken = 4;
  // Channels per tile of add_partials: one f32 repeat.
  static constexpr int64_t kStatsEpilogueChannels = 64;

  // Tiles a cube core may hand over before its vector cores have taken the first of them: the
  // flag counters hold cross_core_max_pending sets, and a cube core's kTileTaken counts one
  // per vector core and tile.
  int64_t tile_window() const {
    return m_b.config().cross_core_max_pending / std::max(1, m_b.aiv_per_aic());
  }

  // CubeConvSpec::bn_stats_per_tile, where it applies (its flag ids among the chip's).
  bool stats_per_tile() const {
    return m_s.bn_stats && m_s.bn_stats_per_tile && !stacked() && m_s.groups == 1 &&
           tile_window() >= 1 && kTileTaken < m_b.config().cross_core_flag_ids;
  }

  // bn_stats_per_tile, cube side, after the FIXPIPE of the block's tile s / chunks (FIX, in
  // order: its cc_set waits for the tile to land in GM): hands the tile to this core's vector
  // cores; from the block's tile tile_window() on, first waits until each vector core has
  // taken the tile tile_window() before it (so that no counter exceeds its bound).
  void hand_over_tile(const Reg& s) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "tile stored: hand it to the vector cores");
    // (A block of at most tile_window() tiles never waits.)
    if (m_t.tiles_per_block > tile_window()) {
      Reg i = b.reg("store: tile of the block");
      b.div(i, s, m_t.chunks);
      b.if_(ge(i, tile_window()), [&] {
        for (int v = 0; v < b.aiv_per_aic(); ++v)
          b.emit(Opcode::op_cc_wait, {Pipe::FIX, kTileTaken},
                 "wait: a vector core took an earlier tile");
      });
    }
    b.emit(Opcode::op_cc_set, {Pipe::FIX, kCcGroup, kTileStored},
           "tile stored: to the vector cores");
  }

  // bn_stats_per_tile, the vector section: vector core v of group g takes the tiles of cube
  // core g in its order, each as the cube core hands it over, and sums rows [v * h, (v + 1) * h)
  // of it (h = ceil(rows / aiv_per_aic)) in chunks of up to T rows (TileStats): MTE2 loads a
  // chunk's rows of the tile's channels from y (the L2 it was just written to; ping / pong
  // buffers) as rows tn16 channels apart in the UB, V widens it to f32 and squares it, and adds
  // both into T-row running sums (a whole chunk from one sums buffer into the other, a last
  // partial chunk in place). The running sums carry over the tiles of one weight key (the same
  // channels; a block's tiles are key-major); when the key changes, and after the last tile,
  // they are folded to one row and added into the per-channel sums of all cy channels at the
  // key's first channel (flush_tile_sums). Then MTE3 stores those as this core's partials
  // (squares in "partials", plain sums in "partials2") and add_partials folds the launch's
  // partials pairwise (a fixed order) into output0 and output1.
  void emit_tile_stats() {
    check_stats_layout();
    KernelBuilder& b = m_b;
    const int aiv = b.aiv_per_aic();
    const int cores = m_t.block_dim * aiv;
    const int64_t cy = m_s.cy;
    b.begin_section(b.vector_core_kind());
    TileStats st = plan_tile_stats();
    b.declare_arg("partials", Dtype::F32, {1, cores, cy});
    b.declare_arg("partials2", Dtype::F32, {1, cores, cy});
    for (int i = 0; i < 2; ++i) b.declare_arg(fmt::format("output{}", i), Dtype::F32, {});
    st.in_free = b.flag_pair(Pipe::V, Pipe::MTE2, "rows free");
    st.in_ready = b.flag_pair(Pipe::MTE2, Pipe::V, "rows loaded");
    const int sums_ready = b.flag(Pipe::V, Pipe::MTE3, "per-channel sums complete");
    {
      Reg core = b.reg("vector core of the launch"), tbeg = b.reg("first tile of the group"),
          count = b.reg("tiles of the group"), sub = b.reg("vector core in the group");
      b.emit(Opcode::op_get_block_id, {tbeg});
      b.emit(Opcode::op_get_subblock_id, {sub});
      b.mul_add(core, tbeg, static_cast<int64_t>(aiv), sub);
      b.mul(tbeg, tbeg, m_t.tiles_per_block);
      b.movi(count, m_t.tiles);
      b.sub(count, count, tbeg);
      b.min(count, count, m_t.tiles_per_block, "tiles of the group");
      {
        Reg n = b.reg_imm("channels", cy);
        vec_dup_bits(b, 4, st.sum, 0, n);
        vec_dup_bits(b, 4, st.squares, 0, n);
        b.movi(n, st.rows * st.pitch);
        for (uint64_t acc : {st.acc_sum[0], st.acc_sq[0]}) vec_dup_bits(b, 4, acc, 0, n);
      }
      for (int q = 0; q < 2; ++q) b.set_flag(st.in_free, q);
      Reg chunks = b.reg_imm("chunks loaded", 0), i = b.reg("tile of the group");
      Reg key_n0 = b.reg_imm("the running sums' first channel (-1: none yet)", -1),
          key_n = b.reg("the running sums' channels"),
          parity = b.reg_imm("the running sums' buffer", 0);
      TileStatsRegs r{chunks, key_n0, key_n, parity, sub};
      m_tbeg = &tbeg;
      b.for_range(i, 0, count, 1, [&] {
        b.emit(Opcode::op_cc_wait, {Pipe::MTE2, kTileStored}, "wait: the tile stored");
        if (m_t.tiles_per_block > tile_window()) {  // (hand_over_tile waits for these)
          Reg t = b.reg("tiles after it");
          b.sub(t, count, i);
          b.if_(ge(t, tile_window() + 1), [&] {
            b.emit(Opcode::op_cc_set, {Pipe::MTE2, kCcGroup, kTileTaken}, "tile taken");
          });
        }
        sum_tile_rows(i, st, r);
      });
      b.if_(ge(key_n0, 0), [&] { flush_tile_sums(st, r, true); });
      for (int q = 0; q < 2; ++q) b.wait_flag(st.in_free, q);
      b.set_flag(Pipe::V, Pipe::MTE3, sums_ready);
      b.wait_flag(Pipe::V, Pipe::MTE3, sums_ready);
      KernelBuilder::Origin o(b, "this vector core's partials");
      for (const auto& [arg, acc] : {std::pair<const char*, uint64_t>{"partials", st.squares},
                                     std::pair<const char*, uint64_t>{"partials2", st.sum}}) {
        Reg dst = b.load_arg(arg), off = b.reg("offset"), src = b.reg_imm("sums", int64_t(acc));
        b.mul(off, core, cy * 4);
        b.add(dst, dst, off);
        b.emit(Opcode::op_copy_ub2gm, {dst, src, 1, cy * 4 / kBlkBytes, 0, 0}, "partial sums");
      }
      m_tbeg = nullptr;  // (its register ends with this block)
    }
    add_partials(cores);
    b.end();
    m_stats_blocks = cores;
  }

  // The vector section's last phase after emit_tile_stats' partials: once every vector core
  // has stored its own (a barrier of the launch's vector cores: cc_set mode 0 from MTE3, which
  // waits for the stores to land), channel tile k (64 channels) goes to vector core k mod
  // cores, which loads the tile's row of every core's partials of both sets, folds each set's
  // rows pairwise in place (fold_rows_pairwise: the upper half added onto the lower, an odd
  // middle row kept, a fixed order; the channel epilogues' sums) and stores row 0 as output0 (sum,
  // from "partials2") and output1 (square_sum, from "partials"). Its buffers lie over the section's
  // earlier ones (every pipe is past them by the barrier).
  void add_partials(int cores) {
    KernelBuilder& b = m_b;
    const int64_t cy = m_s.cy, ct = kStatsEpilogueChannels, tiles = ceil_div(cy, ct);
    const uint64_t set_bytes = static_cast<uint64_t>(cores * ct) * 4;
    {
      KernelBuilder::Origin o(b, "barrier: every vector core's partials stored");
      b.emit(Opcode::op_cc_set, {Pipe::MTE3, kCcAllCube, kPartialsStored},
             "this core's partials stored");
      b.emit(Opcode::op_cc_wait, {Pipe::MTE2, kPartialsStored}, "wait: every vector core's");
    }
    if (2 * set_bytes > b.core().capacity(Buf::UB))
      b.fail(fmt::format("the partials of {} vector cores do not fit the UB", cores));
    const uint64_t sets[2] = {0, round_up(set_bytes, kBlkBytes)};  // (over the section's UB)
    const int ready = b.flag(Pipe::MTE2, Pipe::V, "partials loaded");
    const int done = b.flag(Pipe::V, Pipe::MTE3, "channel tile added");
    const int stored = b.flag(Pipe::MTE3, Pipe::MTE2, "channel tile stored");
    Reg k = b.reg("channel tile"), c0 = b.reg("first channel"), cn = b.reg("channels"),
        t = b.reg("temp"), u = b.reg("temp");
    b.emit(Opcode::op_get_block_id, {k});
    b.emit(Opcode::op_get_subblock_id, {t});
    b.mul_add(k, k, static_cast<int64_t>(b.aiv_per_aic()), t);
    KernelBuilder::Origin o(b, "the partials added, a channel tile");
    b.for_range(k, k, tiles, cores, [&] {
      b.mul(c0, k, ct);
      b.movi(cn, cy);
      b.sub(cn, cn, c0);
      b.min(cn, cn, ct, "channels of the tile");
      Reg len = b.reg("blocks of a row"), gap = b.reg("source gap"), dgap = b.reg("UB gap");
      b.shr(len, cn, 3, "32-byte blocks of the tile's f32");
      b.movi(gap, cy / 8);
      b.sub(gap, gap, len);
      b.movi(dgap, ct / 8);
      b.sub(dgap, dgap, len);
      for (int i = 0; i < 2; ++i) {
        Reg src = b.load_arg(i ? "partials" : "partials2"),
            d = b.reg_imm("partials", int64_t(sets[i]));
        b.shl(t, c0, 2);
        b.add(src, src, t);
        b.emit(Opcode::op_copy_gm2ub, {d, src, cores, len, gap, dgap}, "every core's partials");
      }
      b.set_flag(Pipe::MTE2, Pipe::V, ready);
      b.wait_flag(Pipe::MTE2, Pipe::V, ready);
      fold_rows_pairwise(b, {FoldedRows{sets[0], sets[0]}, FoldedRows{sets[1], sets[1]}}, cores, ct,
                         ct);
      b.set_flag(Pipe::V, Pipe::MTE3, done);
      b.wait_flag(Pipe::V, Pipe::MTE3, done);
      for (int i = 0; i < 2; ++i) {
        Reg dst = b.load_arg(fmt::format("output{}", i)), s = b.reg_imm("sums", int64_t(sets[i]));
        b.shl(u, c0, 2);
        b.add(dst, dst, u);
        b.emit(Opcode::op_copy_ub2gm, {dst, s, 1, len, 0, 0}, i ? "square_sum" : "sum");
      }
      b.set_flag(Pipe::MTE3, Pipe::MTE2, stored);
      b.wait_flag(Pipe::MTE3, Pipe::MTE2, stored);
    });
  }

  // The vector section's UB (emit_tile_stats): chunks of `rows` rows `pitch` (tn16) f32 apart.
  struct TileStats {
    int64_t rows = 0, pitch = 0;
    uint64_t raw[2] = {0, 0}, a32 = 0, sq = 0;         // a32: raw[q] itself for f32 y
    uint64_t acc_sum[2] = {0, 0}, acc_sq[2] = {0, 0};  // T-row running sums, ping / pong
    uint64_t sum = 0, squares = 0;                     // per channel, all cy
    // The squares added by vmla (multiply_accumulate_enabled): their running sums in place in
    // acc_sq[0] (the plain sums still ping-pong), no squares buffer written.
    bool mla = false;
    FlagPair in_free, in_ready;
  };
  // The vector section's registers that emit_tile_stats' helpers share (references: they
  // live in emit_tile_stats' scope): chunks loaded so far (the ping / pong parity of the raw
  // buffers), the running sums' first channel (-1 before the first tile) and channel count,
  // the running sums' buffer (0 / 1), and the vector core's index in its group.
  struct TileStatsRegs {
    const Reg &chunks, &key_n0, &key_n, &parity, &sub;
  };

  // The chunk rows T: as many as the tile's rows per vector core, at most what the UB holds,
  // a multiple of the rows whose f32 bytes fill whole bank spans (so that the widened chunk,
  // its squares and the running sums each start in a bank window of their own: a32 0, squares
  // 1, sums 2 and 4, sums of squares 3 and 5, in 256-byte windows of the span).
  TileStats plan_tile_stats() {
    KernelBuilder& b = m_b;
    const ChipConfig& cfg = b.config();
    const int64_t cy = m_s.cy, pitch = round_up(std::min(m_t.tn, m_s.cg_out), kBlk);
    const uint64_t span = static_cast<uint64_t>(std::max(0, cfg.ub_banks)) *
                          static_cast<uint64_t>(std::max(0, cfg.ub_bank_width_bytes));
    const bool windows = span >= 6 * vec::kRepeatBytes && span % vec::kRepeatBytes == 0;
    const int64_t row_bytes = pitch * 4;
    const int64_t unit =
        windows ? static_cast<int64_t>(span) / std::gcd(static_cast<int64_t>(span), row_bytes) : 1;
    const uint64_t acc_bytes = round_up(static_cast<uint64_t>(cy) * 4, kBlkBytes);
    // Per chunk row: the raw ping and pong, the f32 copy (f16 y), squares, 4 running sums.
    const int64_t per_row = pitch * (2 * m_osz + (m_osz == 4 ? 0 : 4) + 4 + 16);
    const int64_t room = static_cast<int64_t>(b.free_bytes(Buf::UB)) -
                         static_cast<int64_t>(2 * acc_bytes + 8 * span + 8 * b.alignment(Buf::UB));
    const int64_t most = std::min(room / per_row, ceil_div(m_t.tm, b.aiv_per_aic()));
    TileStats st;
    st.mla = multiply_accumulate_enabled(b);
    st.pitch = pitch;
    st.rows = most >= unit ? most / unit * unit : most;
    if (st.rows < 1)
      b.fail(fmt::format("the statistics of tiles {} channels wide do not fit the UB", pitch));
    const uint64_t chunk = static_cast<uint64_t>(st.rows * pitch);
    auto alloc = [&](uint64_t bytes, const char* name, uint64_t w) {
      if (windows) {
        const uint64_t used = b.core().capacity(Buf::UB) - b.free_bytes(Buf::UB);
        const uint64_t pad = (w * vec::kRepeatBytes + span - used % span) % span;
        if (pad) b.alloc(Buf::UB, pad, "bank window padding");
      }
      return b.alloc(Buf::UB, bytes, name);
    };
    st.a32 = alloc(chunk * 4, "y rows (f32)", 0);
    st.sq = alloc(chunk * 4, "squares", 1);
    st.acc_sum[0] = alloc(chunk * 4, "running sums (ping)", 2);
    st.acc_sq[0] = alloc(chunk * 4, "running sums of squares (ping)", 3);
    st.acc_sum[1] = alloc(chunk * 4, "running sums (pong)", 4);
    st.acc_sq[1] = alloc(chunk * 4, "running sums of squares (pong)", 5);
    for (int q = 0; q < 2; ++q)
      st.raw[q] =
          m_osz == 4 ? 0 : b.alloc(Buf::UB, chunk * m_osz, q ? "y rows (pong)" : "y rows (ping)");
    if (m_osz == 4) {  // f32 y: loaded into the f32 chunk and a second one
      st.raw[0] = st.a32;
      st.raw[1] = alloc(chunk * 4, "y rows (pong)", 0);
    }
    st.sum = b.alloc(Buf::UB, acc_bytes, "per-channel sums");
    st.squares = b.alloc(Buf::UB, acc_bytes, "per-channel sums of squares");
    return st;
  }

  // The rows of the group's tile i that vector core r.sub sums (emit_tile_stats), chunk by
  // chunk (r.chunks: the chunks loaded so far, whose parity picks the raw buffer).
  void sum_tile_rows(const Reg& i, const TileStats& st, const TileStatsRegs& r) {
    KernelBuilder& b = m_b;
    const int aiv = b.aiv_per_aic();
    Reg src = b.reg("stats: the rows in y"), r1 = b.reg("stats: end row"),
        n_act = b.reg("stats: channels"), row = b.reg("stats: first row");
    {
      Reg ch = b.reg("stats: chunk"), mt = b.reg("stats: m tile"), img = b.reg("stats: image"),
          key = b.reg("stats: weight key"), n0 = b.reg("stats: n0");
      {
        Reg step = b.reg("stats: the tile's first step");
        b.mul(step, i, m_t.chunks);
        decompose(step, ch, mt, img, key);
      }
      Reg m0 = b.reg("stats: m0"), m_act = b.reg("stats: positions");
      m_slab.tile_positions(mt, m0, m_act);
      n_range(key, n0, n_act);  // (one group: n0 is the channel)
      // A new key: the running sums so far belong to the previous one's channels.
      b.if_(ne(n0, r.key_n0), [&] {
        b.if_(ge(r.key_n0, 0), [&] { flush_tile_sums(st, r, false); });
        b.mov(r.key_n0, n0);
        b.mov(r.key_n, n_act);
      });
      // rows [sub * h, min(m_act, (sub + 1) * h)), h = ceil(m_act / aiv)
      b.add(key, m_act, aiv - 1);
      b.div(key, key, aiv, "h");
      b.mul(row, r.sub, key);
      b.add(r1, row, key);
      b.min(r1, r1, m_act, "end row");
      // y + ((img * OH*OW + m0 + row) * cy + n0) * size: the core's first row
      b.mul(src, img, m_s.oh() * m_s.ow());
      b.add(src, src, m0);
      b.add(src, src, row);
      b.mul(src, src, m_s.cy);
      b.add(src, src, n0);
      b.mul(src, src, m_osz);
      Reg y = b.load_arg("y");
      b.add(src, src, y);
    }
    Reg cnt = b.reg("stats: rows of the chunk"), q = b.reg("stats: parity"),
        len = b.reg("stats: blocks of a row"), gap = b.reg("stats: gap between rows");
    b.mul(len, n_act, m_osz);
    b.shr(len, len, 5, "32-byte blocks of the tile's channels");
    b.movi(gap, m_s.cy * m_osz / kBlkBytes);
    b.sub(gap, gap, len, "source gap");
    Reg dgap = b.reg("stats: UB gap between rows");
    b.movi(dgap, st.pitch * m_osz / kBlkBytes);
    b.sub(dgap, dgap, len, "destination gap");
    b.for_range(row, row, r1, st.rows, [&] {
      b.sub(cnt, r1, row);
      b.min(cnt, cnt, st.rows, "rows of the chunk");
      b.and_(q, r.chunks, 1);
      b.by_parity(q, [&](int par) {
        KernelBuilder::Origin o(b, "statistics: a chunk of the tile's rows");
        b.wait_flag(st.in_free, par);
        {
          Reg d = b.reg_imm("stats: rows buffer", int64_t(st.raw[par]));
          b.emit(Opcode::op_copy_gm2ub, {d, src, cnt, len, gap, dgap},
                 "the chunk's rows, the tile's channels");
        }
        b.set_flag(st.in_ready, par);
        b.wait_flag(st.in_ready, par);
        accumulate_chunk(st, r, st.raw[par], cnt);
        b.set_flag(st.in_free, par);
      });
      b.add(r.chunks, r.chunks, 1);
      b.mul(q, cnt, m_s.cy * m_osz);
      b.add(src, src, q, "the next chunk's rows");
    });
  }

  // V: the chunk of cnt rows (pitch apart) at raw into the T-row running sums: a whole chunk
  // from the sums buffer r.parity into the other, a partial one in place.
  void accumulate_chunk(const TileStats& st, const TileStatsRegs& r, uint64_t raw, const Reg& cnt) {
    KernelBuilder& b = m_b;
    const uint64_t a = m_osz == 4 ? raw : st.a32;
    Reg n = b.reg("stats: elements");
    b.mul(n, cnt, st.pitch);
    if (m_osz != 4) vec_convert(b, Dtype::F32, m_s.out_type, a, raw, RoundMode::kRint, n);
    // The squares: with vmla added in place into acc_sq[0] (the bits of vmul then vadd; 2
    // cycles a repeat in the bank model against vmul's 2 and vadd's 1), else squared into sq.
    if (st.mla)
      vec_binary(b, Opcode::op_vmla, Dtype::F32, st.acc_sq[0], a, a, n);
    else
      vec_binary(b, Opcode::op_vmul, Dtype::F32, st.sq, a, a, n);
    Reg from = b.reg("stats: sums"), to = b.reg("stats: sums out");
    const int64_t step = static_cast<int64_t>(st.acc_sum[1]) - static_cast<int64_t>(st.acc_sum[0]);
    const int64_t sq_off = static_cast<int64_t>(st.acc_sq[0]) - static_cast<int64_t>(st.acc_sum[0]);
    b.mul(from, r.parity, step);
    b.add(from, from, static_cast<int64_t>(st.acc_sum[0]), "this buffer's sums");
    b.mov(to, from);
    b.if_(eq(cnt, st.rows), [&] {
      b.movi(to, static_cast<int64_t>(st.acc_sum[0] + st.acc_sum[1]));
      b.sub(to, to, from, "the other buffer's");
      b.sub(r.parity, r.parity, 1);
      b.and_(r.parity, r.parity, 1, "a whole chunk: the sums change buffers");
    });
    vec_binary(b, Opcode::op_vadd, Dtype::F32, to, from, a, n);
    if (st.mla) return;
    b.add(to, to, sq_off);
    b.add(from, from, sq_off);
    vec_binary(b, Opcode::op_vadd, Dtype::F32, to, from, st.sq, n);
  }

  // V: the T-row running sums of buffer r.parity folded to one row (in place, halving), added
  // into the per-channel sums at channel r.key_n0 (its r.key_n channels), and cleared for the
  // next key's (unless `last`).
  void flush_tile_sums(const TileStats& st, const TileStatsRegs& r, bool last) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "statistics: the key's running sums into the channels' sums");
    Reg base = b.reg("stats: sums"), n = b.reg("stats: elements"), t = b.reg("stats: address"),
        u = b.reg("stats: address");
    const int64_t step = static_cast<int64_t>(st.acc_sum[1]) - static_cast<int64_t>(st.acc_sum[0]);
    const int64_t sq_off = static_cast<int64_t>(st.acc_sq[0]) - static_cast<int64_t>(st.acc_sum[0]);
    b.mul(base, r.parity, step);
    b.add(base, base, static_cast<int64_t>(st.acc_sum[0]));
    // dst = the running sums' address: the plain ones' (off 0) or the squares' (sq_off past
    // them, or with vmla in place in acc_sq[0]).
    const auto sums_at = [&](const Reg& dst, int64_t off) {
      if (off != 0 && st.mla)
        b.movi(dst, static_cast<int64_t>(st.acc_sq[0]));
      else
        b.add(dst, base, off);
    };
    for (int64_t left = st.rows; left > 1; left -= left / 2) {
      const int64_t h = left / 2;
      b.movi(n, h * st.pitch);
      for (int64_t off : {int64_t{0}, sq_off}) {
        sums_at(t, off);
        b.add(u, t, (left - h) * st.pitch * 4);
        vec_binary(b, Opcode::op_vadd, Dtype::F32, t, t, u, n);
      }
    }
    for (const auto& [off, dst] : {std::pair<int64_t, uint64_t>{0, st.sum},
                                   std::pair<int64_t, uint64_t>{sq_off, st.squares}}) {
      b.mul(t, r.key_n0, 4);
      b.add(t, t, static_cast<int64_t>(dst), "the key's channels");
      sums_at(u, off);
      vec_binary(b, Opcode::op_vadd, Dtype::F32, t, t, u, r.key_n);
      if (last) continue;
      b.movi(n, st.rows * st.pitch);
      vec_dup_bits(b, 4, u, 0, n);
    }
  }

  // bn_stats' contract on y: dense (pitch() == cy) with whole 32-byte pixels, so that the
  // vector cores read each pixel's channels as whole blocks; else a CompileError.
  void check_stats_layout() const {
    if (m_s.pitch() != m_s.cy || (m_s.cy * m_osz) % 32 != 0)
      m_b.fail(
          fmt::format("batch-norm statistics need y dense with whole 32-byte pixels ({} "
                      "channels of {} bytes, pitch {})",
                      m_s.cy, m_osz, m_s.pitch()));
  }

  // bn_stats: the vector section, sum and sum of squares of y per channel, then (after a
  // barrier of the vector cores) their epilogue adding the vector cores' partials in block
  // order into the outputs sum and square_sum.
  void emit_stats() {
    check_stats_layout();
    ChannelSumSpec cs;
    cs.kind = ChannelSumSpec::Kind::kSumSquares;
    cs.plain_sum = true;
    cs.a_type = m_s.out_type;
    cs.pixels = m_s.images * m_s.oh() * m_s.ow();
    cs.cp = m_s.cy;
    ChannelSumSection sec;
    sec.a_arg = "y";
    sec.groups = m_t.block_dim;
    sec.wait = [](KernelBuilder& b) {
      b.emit(Opcode::op_cc_wait, {Pipe::MTE2, kYStored}, "wait: y stored by every cube core");
    };
    const ChannelEpilogueSpec e = bn_training_reduce_sums_epilogue(0, m_s.cy, m_s.cy);
    sec.epilogue = &e;
    sec.epilogue_sets = {"partials2", "partials"};  // plain sums, sums of squares
    sec.barrier_flag = kPartialsStored;
    m_stats_blocks = emit_channel_sum_section(m_b, cs, sec);
  }

  bool resident() const { return m_t.resident; }

  // bn_affine: the batch norm's a and shift (f32 [cy] each) into the UB tables, once per block,
  // before any tile reaches the vector unit.
  void load_bn_tables() {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "batch-norm a and shift into the UB");
    load_channel_tables(b, {{"a", m_bn_a}, {"shift", m_bn_shift}}, m_s.cy,
                        "batch-norm tables loaded");
    if (m_bn.period > 0) {
      load_periodic_tables();
      return;
    }
    if (!m_bn.dense) return;
    // Replicated: channel group i (width w) at i * 256 bytes, copy r at r * w lanes: one
    // masked vector copy per copy r, a repeat per group (source repeat stride w / 8 blocks).
    const int64_t w = m_bn.width, groups = ceil_div(m_s.cy, w);
    set_mask_lanes(b, lane_range(0, w));
    for (const auto& [from, to] : {std::pair<uint64_t, uint64_t>{m_bn_a, m_bn_rep_a},
                                   std::pair<uint64_t, uint64_t>{m_bn_shift, m_bn_rep_shift}})
      for (int64_t r = 0; r < kLanes32 / w; ++r)
        for (int64_t g0 = 0; g0 < groups; g0 += kMaxRepeat)
          b.emit(Opcode::op_vcopy,
                 {Dtype::S32, static_cast<int64_t>(to) + (g0 * kLanes32 + r * w) * kL0cElemBytes,
                  static_cast<int64_t>(from) + g0 * w * kL0cElemBytes,
                  std::min(kMaxRepeat, groups - g0), 1, 1, 8, w / 8},
                 "replicate the channel group");
  }

  // ConvBnTables::period: n tile t's table at t * period lanes, copy r of its width channels at
  // r * width lanes: per copy and 64-channel part one masked vector copy, a repeat per n tile
  // (destination repeat stride period / 8 blocks, source width / 8).
  void load_periodic_tables() {
    KernelBuilder& b = m_b;
    const int64_t w = m_bn.width, period = m_bn.period, tiles = m_t.n_tiles;
    for (const auto& [from, to] : {std::pair<uint64_t, uint64_t>{m_bn_a, m_bn_rep_a},
                                   std::pair<uint64_t, uint64_t>{m_bn_shift, m_bn_rep_shift}})
      for (int64_t r = 0; r < period / w; ++r)
        for (int64_t c = 0; c < w; c += kLanes32) {
          set_mask_lanes(b, lane_range(0, std::min(kLanes32, w - c)));
          for (int64_t t0 = 0; t0 < tiles; t0 += kMaxRepeat)
            b.emit(
                Opcode::op_vcopy,
                {Dtype::S32, static_cast<int64_t>(to) + (t0 * period + r * w + c) * kL0cElemBytes,
                 static_cast<int64_t>(from) + (t0 * w + c) * kL0cElemBytes,
                 std::min(kMaxRepeat, tiles - t0), 1, 1, period / 8, w / 8},
                "the n tile's channels, repeated over the period");
        }
  }

  // One plan per buffer kind: L1 (conv_l1_buffers, as the tiling checked it), L0A, L0B, L0C, BT
  // and, through the UB, the UB.
  void allocate() {
    const int64_t tn16 = round_up(std::min(m_t.tn, m_s.cg_out), kBlk);
    const int64_t bias_bytes = m_s.bias ? tn16 * kL0cElemBytes : 0;
    const ConvL1Buffers l1 = conv_l1_buffers(m_t, bias_bytes);
    BufferPlan l0a(Buf::L0A), l0b(Buf::L0B), l0c(Buf::L0C), bt(Buf::BT);
    const auto a = l0a.add_fixed("A step", static_cast<uint64_t>(m_t.tm * m_t.tk0 * m_isz), 2);
    const auto bb =
        l0b.add_fixed("B step", static_cast<uint64_t>(m_t.tk0 * m_s.b_cols(tn16) * m_isz), 2);
    const auto c = l0c.add_fixed("C tile", static_cast<uint64_t>(m_t.tm * tn16 * kL0cElemBytes),
                                 m_t.l0c_buffers);
    const auto bias_bt =
        bt.add_fixed("bias (L0 parity)", static_cast<uint64_t>(bias_bytes), 2, m_s.bias);
    const bool via_ub =
        cube_store_via_ub(m_b.config(), cube_core(m_b.config(), m_b.op()), m_b.op());
    if (m_s.bn_affine && !via_ub)
      m_b.fail("internal: the batch norm in the convolution's epilogue needs the UB path");
    // With the batch norm: an f32 and an output tile per L0C buffer (CubePipeline::
    // ChannelAffine::buffers).
    const int tiles_in_ub = m_s.bn_affine ? m_t.l0c_buffers : 1;
    m_bn = conv_bn_tables(m_s, m_t.tn);
    // With the batch norm, where the UB has room for it: one more f32 tile (the vector unit
    // works on one tile at a time) for the epilogue's f32 passes to write out of place, the f32
    // tiles and it placed half a UB bank span apart (CubePipeline::ChannelAffine::result32).
    const uint64_t span = static_cast<uint64_t>(std::max(0, m_b.config().ub_banks)) *
                          static_cast<uint64_t>(std::max(0, m_b.config().ub_bank_width_bytes));
    const uint64_t ub_align = m_b.alignment(Buf::UB);
    const bool placeable = span >= 2 * ub_align && span % (2 * ub_align) == 0;
    struct UbIds {
      BufferPlan::Id cu, c32, ta, ts, rt, ra, rs, r32;
    };
    auto ub_plan = [&](bool result32, UbIds& id) {
      BufferPlan ub(Buf::UB);
      id.cu = ub.add_fixed("C tile (UB)", static_cast<uint64_t>(m_t.tm * tn16 * m_osz), tiles_in_ub,
                           via_ub);
      id.c32 = ub.add_fixed("C tile (f32, before the batch norm)",
                            static_cast<uint64_t>(m_t.tm * tn16 * kL0cElemBytes), tiles_in_ub,
                            m_s.bn_affine);
      id.ta =
          ub.add_fixed("batch-norm a", static_cast<uint64_t>(m_bn.plain_bytes), 1, m_s.bn_affine);
      id.ts = ub.add_fixed("batch-norm shift", static_cast<uint64_t>(m_bn.plain_bytes), 1,
                           m_s.bn_affine);
      id.rt = ub.add_fixed("residual tile", static_cast<uint64_t>(m_t.tm * tn16 * m_osz),
                           tiles_in_ub, m_s.residual);
      const bool replicated = m_bn.dense || m_bn.period > 0;
      id.ra = ub.add_fixed("batch-norm a (replicated)", static_cast<uint64_t>(m_bn.rep_bytes), 1,
                           replicated);
      id.rs = ub.add_fixed("batch-norm shift (replicated)", static_cast<uint64_t>(m_bn.rep_bytes),
                           1, replicated);
      // A last column group's masked repeat spans 64 lanes from its first column: up to one
      // repeat (256 bytes) past the last row's end.
      id.r32 = ub.add_fixed(
          "C tile (f32, the batch norm's result)",
          static_cast<uint64_t>(m_t.tm * tn16 * kL0cElemBytes) + vec::kRepeatBytes, 1, result32);
      if (result32 && placeable) {
        ub.place(id.c32, span, 0);
        ub.place(id.r32, span, span / 2);
      }
      return ub;
    };
    UbIds id{};
    BufferPlan ub = ub_plan(false, id);
    // Packed rows take the result tile wherever it can go (the planner counted its room).
    if (m_s.bn_affine && via_ub && (placeable || m_s.y_packed)) {
      UbIds with{};
      BufferPlan trial = ub_plan(true, with);
      if (trial.extent(0, ub_align) <= cube_core(m_b.config(), m_b.op()).capacity(Buf::UB)) {
        ub = trial;
        id = with;
        m_result32 = true;
      }
    }
    if (m_s.y_packed && (!m_result32 || !m_bn.dense))
      m_b.fail("internal: packed output rows need the f32 result tile and the dense tables");
    const bool replicated = m_bn.dense || m_bn.period > 0;
    const auto cu = id.cu, c32 = id.c32, ta = id.ta, ts = id.ts, rt = id.rt, ra = id.ra, rs = id.rs;
    if (via_ub) {
      const BufferPlan::Placed pu = ub.allocate(m_b, 0);
      m_pipe.store_via_ub(pu[cu]);
      m_bn_a = pu[ta];
      m_bn_shift = pu[ts];
      m_bn_rep_a = pu[ra];
      m_bn_rep_shift = pu[rs];
      m_res_tiles = pu.twin(rt);
      if (m_s.bn_affine)
        m_pipe.affine_via_ub({pu.twin(c32), pu.twin(cu), tiles_in_ub, replicated ? pu[ra] : pu[ta],
                              replicated ? pu[rs] : pu[ts], m_s.act, m_t.tm, tn16, tn16 / 8,
                              m_bn.dense, m_s.bn_a_in_filter, m_result32,
                              m_result32 ? pu[id.r32] : 0, "batch norm", 0, m_s.y_packed,
                              m_bn.period});
    }
    const BufferPlan::Placed p1 = l1.plan.allocate(m_b, 0);
    // A slab buffer: one block of room before (zeroing) and 16 pixels after (spill).
    m_slab_buf = p1.twin(l1.slab);
    for (uint64_t& at : m_slab_buf.a) at += kBlkBytes;
    m_bbuf = p1.twin(l1.weights);
    m_bias_l1 = p1.twin(l1.bias);
    m_l0a = l0a.allocate(m_b, 0).twin(a);
    m_l0b = l0b.allocate(m_b, 0).twin(bb);
    m_l0c = l0c.allocate(m_b, 0).twin(c);
    m_bias_bt = bt.allocate(m_b, 0).twin(bias_bt);
  }

  bool stacked() const { return m_t.stack > 1; }
  bool strided_y() const { return m_s.y_strided.run_rows > 0; }

  // Step s -> chunk ch, m tile mt, image img (stacked: the stack's first image), weight key
  // (group * n_tiles + n tile).
  void decompose(const Reg& s, const Reg& ch, const Reg& mt, const Reg& img, const Reg& key) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "step -> tile (group, n tile, stack, m tile) and chunk");
    b.rem(ch, s, m_t.chunks);
    b.div(key, s, m_t.chunks);
    b.add(key, key, *m_tbeg, "tile");
    if (m_t.spatial_major) {
      b.div(img, key, m_t.keys);
      b.rem(key, key, m_t.keys, "weight key");
      b.rem(mt, img, m_t.m_tiles);
      b.div(img, img, m_t.m_tiles);
    } else {
      b.rem(mt, key, m_t.m_tiles);
      b.div(key, key, m_t.m_tiles);
      b.rem(img, key, m_t.stacks);
      b.div(key, key, m_t.stacks);
    }
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
    Reg cbase = b.reg("load: group channel base"), cvalid = b.reg("load: group channels");
    group_channels(key, cbase, cvalid);
    Reg c1a = b.reg("load: first block"), ncb = b.reg("load: blocks");
    chunk_blocks(ch, cvalid, c1a, ncb);
    Reg p = b.reg("load: L1 parity");
    m_pipe.l1_parity(p, s);
    m_pipe.l1_wait_free(p, "L1 buffers free");
    {
      Reg dst = b.reg("load: slab address"), x = b.load_arg("x");
      select(b, dst, p, m_slab_buf);
      m_slab.load_slab({dst, x, img, r0, h, cbase, c1a, ncb, cvalid});
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
        b.mul(src, src, kL0cElemBytes);
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
    } else {
      // Resident weights of the block's first step: loaded here, after its slab and ahead of
      // the next step's (the pipeline issues load(1) before compute(0), which loads the
      // weights of the block's later keys and chunks), so its mmads do not wait for that slab.
      b.if_(eq(s, 0), [&] {
        KernelBuilder::Origin r(b, "resident weights of the block's first step");
        {
          Reg t = b.reg("load: scratch");
          resident_key(ch, key, t);
        }
        Reg dst = b.reg("load: weights address"), n0 = b.reg("load: n0"),
            n_act = b.reg("load: columns");
        n_range(key, n0, n_act);
        resident_chunk_address(dst, n_act, c1a);
        load_resident_chunk(dst, key, n0, n_act, c1a, ncb, cvalid);
      });
    }
    if (chunks_ahead()) {
      // A later chunk of the weights being loaded comes right after this step's slab: in
      // compute(s), issued after load(s + 1), it would queue behind the next slab, whose
      // buffer frees only when MTE1 has finished step s - 1, and MTE1 would wait for the chunk
      // at every step of the key's first tile. Its flag by the step's parity: the set of step
      // s + 2 follows the L1 hand-over of step s, after MTE1's wait of step s.
      Reg ahead = b.reg("load: weights ahead");
      weights_ahead(s, ch, ahead);
      b.if_(ne(ahead, 0), [&] {
        KernelBuilder::Origin r(b, "resident weights: this chunk's k-blocks, after its slab");
        ahead.release();
        Reg dst = b.reg("load: weights address"), n0 = b.reg("load: n0"),
            n_act = b.reg("load: columns");
        n_range(key, n0, n_act);
        resident_chunk_address(dst, n_act, c1a);
        load_weights(dst, key, n0, n_act, c1a, ncb, cvalid);
        b.set_flag(m_b_ahead, p);
      });
    }
    m_pipe.l1_loaded(p, "L1 buffers loaded");
  }

  // kRowsN weights by tap (CubeConvTiling::weights_by_tap).
  bool by_tap() const { return m_t.weights_by_tap; }
  // ... with an L0B load per k-block: with one tap the tap-major layout is the per-block one
  // (k-block c at c * nb fractals), loaded as that.
  bool b_by_tap_in_l0b() const { return by_tap() && m_taps > 1; }

  // MTE2: B for channel blocks [c1a, c1a + ncb) of the weight key into L1 at dst, one nd2nz per
  // k-block (c1, tap), k-block i at dst + i * nb * 512 (nb = ceil(n_act / 16)); by tap
  // (load_weights_by_tap) k-block (c1a + c, tap) at dst + (tap * ncb + c) * nb * 512.
  void load_weights(const Reg& dst, const Reg& key, const Reg& n0, const Reg& n_act, const Reg& c1a,
                    const Reg& ncb, const Reg& cvalid) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "weights: one nd2nz per (16 input channels, tap)");
    Reg base = b.reg("weights: group base"), d = b.reg("weights: destination");
    // base = w + (g * b_group + (kRowsK ? n0 : n0 * b_row)) * size; block-diagonal: w +
    // g * c1_in * b_group (one n tile: n0 = 0)
    b.div(base, key, m_t.n_tiles);
    b.mul(base, base, m_s.b_diagonal ? m_s.c1_in() * m_s.b_group : m_s.b_group);
    Reg t = b.reg("weights: temp");
    if (m_s.b_diagonal) {
      // (the diagonal block's stride is added per channel block below)
    } else if (m_s.b_nblock > 0 && m_s.b_mode == CubeConvSpec::BMode::kRowsK) {
      b.div(t, n0, kBlk);
      b.mul(t, t, m_s.b_nblock);
      b.add(base, base, t, "the n tile's first column block");
    } else if (m_s.b_mode == CubeConvSpec::BMode::kRowsK) {
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
    if (m_s.b_diagonal)
      b.movi(nrows, diagonal_cols(), "a diagonal block's columns");
    else
      round16(b, nrows, n_act);
    b.mov(d, dst);
    if (by_tap()) return load_weights_by_tap(base, d, nrows, n_act, c1a, ncb, cvalid);
    if (m_s.b_nblock > 0 && m_s.b_mode == CubeConvSpec::BMode::kRowsK && m_s.b_tap_row != 0)
      return load_weights_n16_packed(base, d, nrows, t);
    if (m_s.b_nblock > 0 && m_s.b_mode == CubeConvSpec::BMode::kRowsK)
      return load_weights_n16(base, d, nrows, c1a, ncb, t);
    // The k-block (c, tap) of `rows` channels to d (src: scratch).
    const auto k_block = [&](const Reg& c, const Reg& tap, const Reg& rows, const Reg& src) {
      // source tap = flip ? taps - 1 - tap : tap
      if (m_s.b_flip) {
        b.movi(src, m_taps - 1);
        b.sub(src, src, tap);
      } else {
        b.mov(src, tap);
      }
      b.mul(src, src, m_s.b_tap);
      if (m_s.b_diagonal) {
        b.mul(t, c, m_s.b_group);
        b.add(src, src, t);
        b.mul(src, src, m_isz);
        b.add(src, src, base);
        b.emit(Opcode::op_nd2nz, {m_s.in_type, d, src, rows, nrows, m_s.b_row, kBlk},
               "k-block: 16 input channels x their diagonal block's columns");
      } else if (m_s.b_mode == CubeConvSpec::BMode::kRowsK && m_s.b_tap_row != 0) {
        load_packed_tap(base, d, src, t, tap, c, rows, n_act);
      } else if (m_s.b_mode == CubeConvSpec::BMode::kRowsK) {
        b.mul(t, c, kBlk * m_s.b_row);
        b.add(src, src, t);
        b.mul(src, src, m_isz);
        b.add(src, src, base);
        b.emit(Opcode::op_nd2nz, {m_s.in_type, d, src, rows, n_act, m_s.b_row, kBlk},
               "k-block: 16 input channels x n (fractal rows = k)");
      } else {
        // (blocked filter: k-block c at c * b_nblock, its n rows of 16 one run)
        b.mul(t, c, m_s.b_nblock > 0 ? m_s.b_nblock : kBlk);
        b.add(src, src, t);
        b.mul(src, src, m_isz);
        b.add(src, src, base);
        b.emit(Opcode::op_nd2nz, {m_s.in_type, d, src, n_act, rows, m_s.b_row, nrows},
               "k-block: n x 16 input channels (fractal rows = n, the L0B layout)");
      }
    };
    // rows = min(16, cvalid - c * 16): the channels of block c.
    const auto block_rows = [&](const Reg& rows, const Reg& c) {
      b.mul(rows, c, kBlk);
      b.sub(rows, cvalid, rows);
      b.min(rows, rows, kBlk);
    };
    if (m_staggered_weights)
      return load_k_blocks_staggered(dst, d, nrows, c1a, ncb, k_block, block_rows);
    Reg c = b.reg("weights: block"), end = b.reg("weights: end block");
    b.add(end, c1a, ncb);
    b.for_range(c, c1a, end, 1, [&] {
      Reg rows = b.reg("weights: channels in block"), src = b.reg("weights: source"),
          tap = b.reg("weights: tap");
      block_rows(rows, c);
      b.for_range(tap, 0, m_taps, 1, [&] {
        k_block(c, tap, rows, src);
        b.mul(t, nrows, kBlk * m_isz);
        b.add(d, d, t, "next k-block: nb * 512 bytes");
      });
    });
  }

  // Staggered weights (conv_staggered_weights): the chunk's n = ncb * taps k-blocks, k-block j
  // = (c - c1a) * taps + tap at dst + j * nrows * 32 bytes as the loop in order places it,
  // loaded from k-block block_id % n on, wrapping (shared_read_part_at), until j is back there:
  // the cores loading one weight key's chunk at once read different k-blocks' rows. The same
  // bytes land in L1. No more registers than the loop in order (the mmad step's are live): j
  // the only state, n and the first k-block recomputed where needed.
  template <typename KBlock, typename BlockRows>
  void load_k_blocks_staggered(const Reg& dst, const Reg& d, const Reg& nrows, const Reg& c1a,
                               const Reg& ncb, const KBlock& k_block, const BlockRows& block_rows) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "weights: the chunk's k-blocks from block_id % n on");
    Reg j = b.reg("weights: k-block loaded now"), c = b.reg("weights: block"),
        rows = b.reg("weights: channels in block"), src = b.reg("weights: source"),
        tap = b.reg("weights: tap");
    // r = the first k-block, block_id % n (n = ncb * taps; c: scratch)
    const auto first = [&](const Reg& r) {
      b.mul(c, ncb, m_taps, "n: the chunk's k-blocks");
      b.emit(Opcode::op_get_block_id, {r});
      b.rem(r, r, c, "this core's first k-block: block_id % n");
    };
    first(j);
    const Label top = b.label("staggered_k_blocks");
    b.bind(top);
    b.div(c, j, m_taps);
    b.add(c, c, c1a, "its channel block");
    b.rem(tap, j, m_taps, "its tap");
    b.mul(d, j, nrows);
    b.mul(d, d, kBlk * m_isz);
    b.add(d, d, dst, "its place: dst + j * nb * 512 bytes");
    block_rows(rows, c);
    k_block(c, tap, rows, src);
    b.add(j, j, 1, "the next k-block");
    b.mul(c, ncb, m_taps);
    b.if_(ge(j, c), [&] { b.movi(j, 0, "wrapped to the first k-block"); });
    first(rows);
    b.branch(ne(j, rows), top);
  }

  // The k-block (c, tap) of the stride-packed view's kRowsK B (CubeConvSpec::b_tap_row) into
  // L1 at d: its rows at base + ((tap / KW) * b_tap_row + (tap % KW) * b_tap + c * 16 * b_row)
  // * size, `rows` of them, at most b_last_col_rows in the last column of taps (the rows after
  // them zero-filled by the nd2nz, as past cvalid). src and t are scratch.
  void load_packed_tap(const Reg& base, const Reg& d, const Reg& src, const Reg& t, const Reg& tap,
                       const Reg& c, const Reg& rows, const Reg& n_act) {
    KernelBuilder& b = m_b;
    b.div(src, tap, m_s.kw);
    b.mul(src, src, m_s.b_tap_row, "the tap's row of taps");
    b.rem(t, tap, m_s.kw);
    b.mul(t, t, m_s.b_tap);
    b.add(src, src, t, "and its column");
    b.mul(t, c, kBlk * m_s.b_row);
    b.add(src, src, t);
    b.mul(src, src, m_isz);
    b.add(src, src, base);
    const auto emit = [&](const Reg& n_rows) {
      b.emit(Opcode::op_nd2nz, {m_s.in_type, d, src, n_rows, n_act, m_s.b_row, kBlk},
             "k-block: a packed pixel's channels x n (fractal rows = k)");
    };
    if (m_s.b_last_col_rows == 0) return emit(rows);
    const Label other = b.label("packed_other_column"), done = b.label("packed_tap_done");
    b.rem(t, tap, m_s.kw);
    b.branch(ne(t, m_s.kw - 1), other);
    b.min(t, rows, m_s.b_last_col_rows, "the last column of taps: its real rows");
    emit(t);
    b.jmp(done);
    b.bind(other);
    emit(rows);
    b.bind(done);
  }

  // kRowsK weights in blocks of 16 columns (CubeConvSpec::b_nblock): k-block (c, tap)'s
  // fractal of column block j is the rows' 16 columns at base + (j * b_nblock + tap * b_tap +
  // c * 16 * b_row) * size, 512 contiguous bytes for a whole block, and the chunk's blocks c of
  // one tap follow each other in GM; so per (j, tap) one copy_gm2l1 of the chunk's whole
  // blocks' fractals (one GM run) to L1's k-blocks (c - c1a) * taps + tap, taps * nb fractals
  // apart: the same L1 image as load_weights' nd2nz per k-block. The group's last block, when
  // cg_in is not a multiple of 16 (a chunk reaching it), is one nd2nz of its rows per (j, tap),
  // zero-padded to 16.
  // base, d, nrows and t are the caller's and are clobbered (the mmad step's registers are
  // live around the load: few of its own).
  void load_weights_n16(const Reg& base, const Reg& d, const Reg& nrows, const Reg& c1a,
                        const Reg& ncb, const Reg& t) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "weights in blocks of 16 columns: one copy per (column block, tap)");
    constexpr int64_t kFrac = kBlkBytes * kBlk;  // one fractal's bytes (16-bit elements)
    const int64_t whole = m_s.cg_in / kBlk, part_rows = m_s.cg_in % kBlk;
    const int64_t tap_bytes = m_s.b_tap * m_isz, taps_bytes = m_taps * tap_bytes;
    const Reg& nb = nrows;
    Reg j = b.reg("weights: column block"), tap = b.reg("weights: tap"),
        gap = b.reg("weights: L1 gap"), full = b.reg("weights: whole blocks of the chunk");
    b.div(nb, nrows, kBlk, "column blocks");
    b.mul(gap, nb, m_taps * kFrac / 32);
    b.sub(gap, gap, kFrac / 32, "taps * nb fractals apart, less the one copied (32-byte units)");
    b.movi(full, whole);
    b.sub(full, full, c1a);
    b.min(full, full, ncb, "the chunk's whole blocks (a partial block last)");
    b.mul(t, c1a, kBlk * m_s.b_row * m_isz);
    b.add(base, base, t, "the chunk's first channel block");
    // The copies of one (column block, tap): from its tap's fractals in GM (src) to its
    // fractal of k-block (c1a, tap) in L1 (dst).
    const auto copies = [&](const Reg& src, const Reg& dst) {
      b.if_(ge(full, 1), [&] {
        b.emit(Opcode::op_copy_gm2l1, {dst, src, full, kFrac / 32, 0, gap},
               "the chunk's whole fractals of one (column block, tap)");
      });
      if (part_rows > 0)
        b.if_(lt(full, ncb), [&] {
          Reg ps = b.reg("weights: partial block source"),
              pd = b.reg("weights: partial block destination");
          b.mul(ps, full, kBlk * m_s.b_row * m_isz);
          b.add(ps, ps, src);
          b.mul(pd, full, m_taps * kFrac);
          b.mul(pd, pd, nb);
          b.add(pd, pd, dst);
          b.emit(Opcode::op_nd2nz, {m_s.in_type, pd, ps, part_rows, kBlk, m_s.b_row, kBlk},
                 "the group's last block: its rows x 16 columns, zero-padded");
        });
    };
    if (m_staggered_weights) {
      // Staggered (conv_staggered_weights; whole channel blocks only, so no partial block's
      // registers): the n = nb * taps pairs (column block jb, tap) by index i = jb * taps + tap
      // from i = block_id % n on, wrapping; each copy from base + jb * b_nblock + tap * b_tap
      // elements to d + (tap * nb + jb) fractals (base and d moved there and back: the mmad
      // step's registers leave few).
      // j: the pair loaded now (the only state; n and the first pair recomputed where needed,
      // no register more than in order).
      KernelBuilder::Origin so(b, "weights: the (column block, tap) pairs from block_id % n on");
      const auto first = [&](const Reg& r) {
        b.mul(t, nb, m_taps, "n: (column block, tap) pairs");
        b.emit(Opcode::op_get_block_id, {r});
        b.rem(r, r, t, "this core's first pair: block_id % n");
      };
      first(j);
      const Label top = b.label("staggered_pairs");
      b.bind(top);
      b.rem(tap, j, m_taps, "its tap");
      b.mul(tap, tap, nb);
      b.div(t, j, m_taps, "its column block");
      b.add(tap, tap, t);
      b.mul(tap, tap, kFrac, "its place: (tap * nb + column block) fractals on");
      b.mul(t, t, m_s.b_nblock * m_isz);
      b.add(base, base, t);
      b.rem(t, j, m_taps);
      b.mul(t, t, tap_bytes);
      b.add(base, base, t, "its source");
      b.add(d, d, tap);
      copies(base, d);
      b.sub(d, d, tap);
      b.div(tap, j, m_taps);
      b.mul(tap, tap, m_s.b_nblock * m_isz);
      b.add(t, t, tap);
      b.sub(base, base, t, "back to the chunk's first block");
      b.add(j, j, 1, "the next pair");
      b.mul(t, nb, m_taps);
      b.if_(ge(j, t), [&] { b.movi(j, 0, "wrapped to the first pair"); });
      first(tap);
      b.branch(ne(j, tap), top);
      return;
    }
    // Per column block j: base at its tap 0 in GM, d at its fractal of k-block 0 in L1; per tap
    // both advance (tap_bytes, nb fractals) and step back after the last.
    b.for_range(j, 0, nb, 1, [&] {
      b.for_range(tap, 0, m_taps, 1, [&] {
        copies(base, d);
        b.add(base, base, tap_bytes, "next tap");
        b.mul(t, nb, kFrac);
        b.add(d, d, t, "next tap: nb fractals on");
      });
      if (m_s.b_nblock * m_isz != taps_bytes)  // (equal unless the k rows are a view)
        b.add(base, base, m_s.b_nblock * m_isz - taps_bytes, "next column block's tap 0");
      b.mul(t, nb, m_taps * kFrac);
      b.sub(d, d, t);
      b.add(d, d, kFrac, "next column block's fractal of k-block 0");
    });
  }

  // load_weights_n16 for the stride-packed view (CubeConvSpec::b_tap_row; the group's channels
  // one block, cg_in <= 16, checked by the tiling): per column block j and tap (kh, kw)
  // one nd2nz of the tap's cg_in rows (b_last_col_rows in the last column) x 16 columns at
  // base + (j * b_nblock + kh * b_tap_row + kw * b_tap) * size, zero-padded to 16 rows, to
  // k-block tap's fractal j in L1: d + (tap * nb + j) * 512, the layout of load_weights. The
  // columns of taps unrolled. base, d, nrows and t are the caller's and are clobbered.
  void load_weights_n16_packed(const Reg& base, const Reg& d, const Reg& nrows, const Reg& t) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "stride-packed weights in blocks of 16 columns: nd2nz per tap");
    constexpr int64_t kFrac = kBlkBytes * kBlk;  // one fractal's bytes (16-bit elements)
    const Reg& nb = nrows;
    Reg j = b.reg("weights: column block"), kh = b.reg("weights: row of taps"),
        ps = b.reg("weights: source"), pd = b.reg("weights: destination");
    b.div(nb, nrows, kBlk, "column blocks");
    b.mul(t, nb, kFrac, "a k-block's nb fractals");
    b.for_range(j, 0, nb, 1, [&] {
      b.mul(ps, j, m_s.b_nblock * m_isz);
      b.add(ps, ps, base, "column block j's tap (0, 0)");
      b.mul(pd, j, kFrac);
      b.add(pd, pd, d, "k-block 0's fractal j");
      b.for_range(kh, 0, m_s.kh, 1, [&] {
        for (int64_t kw = 0; kw < m_s.kw; ++kw) {
          const bool last = kw == m_s.kw - 1;
          const int64_t rows = last && m_s.b_last_col_rows ? m_s.b_last_col_rows : m_s.cg_in;
          b.emit(Opcode::op_nd2nz, {m_s.in_type, pd, ps, rows, kBlk, m_s.b_row, kBlk},
                 "a packed pixel's rows x 16 columns, zero-padded");
          b.add(ps, ps, (last ? m_s.b_tap_row - (m_s.kw - 1) * m_s.b_tap : m_s.b_tap) * m_isz,
                last ? "next row of taps" : "next column of taps");
          b.add(pd, pd, t, "next k-block");
        }
      });
    });
  }

  // kRowsN by tap: per tap one nd2nz of n_act rows (output columns, b_row apart) x the chunk's
  // channels (one GM run a row; the whole tap one run where the chunk holds every channel and
  // the n tile every row) into d: its column blocks are the chunk's k-blocks of that tap, nrows
  // 32-byte rows apart (nb fractals each, B's L0B image); the next tap ncb * nb * 512 bytes on.
  // base: w + (g * b_group + n0 * b_row) * size.
  void load_weights_by_tap(const Reg& base, const Reg& d, const Reg& nrows, const Reg& n_act,
                           const Reg& c1a, const Reg& ncb, const Reg& cvalid) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "weights by tap: one nd2nz of n rows x the chunk's channels");
    Reg cols = b.reg("weights: the chunk's channels"), src = b.reg("weights: source"),
        tap = b.reg("weights: tap"), step = b.reg("weights: tap bytes in L1");
    b.mul(cols, c1a, kBlk);
    b.sub(cols, cvalid, cols);
    b.mul(step, ncb, kBlk);
    b.min(cols, cols, step, "channels of the chunk");
    b.mul(step, c1a, kBlk * m_isz);
    b.add(base, base, step, "the chunk's first channel");
    b.mul(step, ncb, nrows);
    b.mul(step, step, kBlkBytes, "ncb * nb * 512 bytes a tap");
    if (m_staggered_weights) {
      // Staggered (conv_staggered_weights): the taps from tap block_id % taps on, wrapping,
      // each to its own place (d + tap * step, step recomputed: no register more than in order),
      // until tap is back at the first.
      const auto first = [&](const Reg& r) {
        b.emit(Opcode::op_get_block_id, {r});
        b.rem(r, r, m_taps, "this core's first tap: block_id % taps");
      };
      first(tap);
      const Label top = b.label("staggered_taps");
      b.bind(top);
      if (m_s.b_flip) {
        b.movi(src, m_taps - 1);
        b.sub(src, src, tap, "source tap (flipped)");
      } else {
        b.mov(src, tap);
      }
      b.mul(src, src, m_s.b_tap * m_isz);
      b.add(src, src, base);
      b.mul(step, tap, ncb);
      b.mul(step, step, nrows);
      b.mul(step, step, kBlkBytes, "the tap's place: tap * ncb * nb * 512 bytes on");
      b.add(d, d, step);
      b.emit(Opcode::op_nd2nz, {m_s.in_type, d, src, n_act, cols, m_s.b_row, nrows},
             "the tap's k-blocks: n x the chunk's channels (fractal rows = n)");
      b.sub(d, d, step);
      b.add(tap, tap, 1, "the next tap");
      b.if_(ge(tap, m_taps), [&] { b.movi(tap, 0, "wrapped to the first tap"); });
      first(step);
      b.branch(ne(tap, step), top);
      return;
    }
    b.for_range(tap, 0, m_taps, 1, [&] {
      if (m_s.b_flip) {
        b.movi(src, m_taps - 1);
        b.sub(src, src, tap, "source tap (flipped)");
      } else {
        b.mov(src, tap);
      }
      b.mul(src, src, m_s.b_tap * m_isz);
      b.add(src, src, base);
      b.emit(Opcode::op_nd2nz, {m_s.in_type, d, src, n_act, cols, m_s.b_row, nrows},
             "the tap's k-blocks: n x the chunk's channels (fractal rows = n)");
      b.add(d, d, step, "next tap");
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
    Reg chan0 = b.reg("compute: the tile's first channel");
    Reg p0;  // strided y: the tile's first position in y (images' positions one after another)
    if (strided_y()) p0 = b.reg("compute: the tile's first position");
    {
      Reg key = b.reg("compute: weight key"), n0 = b.reg("compute: n0");
      TileRegs t{
          ch, m_act, msl, chan, kc, n_act, cdst, bbase, key, n0, strided_y() ? &p0 : nullptr};
      tile_output(s, t);
      chunk_operands(s, t);
      b.div(chan0, key, m_t.n_tiles);
      b.mul(chan0, chan0, m_s.cg_out);
      b.add(chan0, chan0, n0, "first channel: group * cg_out + n0");
    }
    if (!m_s.bn_affine) chan0.release();
    Reg p = b.reg("compute: L1 parity"), pt = b.reg("compute: L0C parity");
    m_pipe.l1_parity(p, s);
    if (m_t.l0c_buffers == 2) {
      b.div(pt, s, m_t.chunks);
      b.and_(pt, pt, 1, "L0C buffer: tile index in the block & 1");
    } else {
      b.movi(pt, 0);
    }
    m_pipe.l1_wait_loaded(p, "L1 buffers loaded");
    chunk_mmads(p, pt, ch, ChunkRegs{m_act, n_act, msl, chan, kc, bbase});
    m_pipe.l1_read(p, "L1 buffers read");
    p.release();
    kc.release();
    msl.release();
    chan.release();
    bbase.release();
    b.if_(eq(ch, m_t.chunks - 1), [&] {
      KernelBuilder::Origin f(b, "store: L0C -> y (ND rows of the tile's channels)");
      Reg l0c = b.reg("store: L0C address");
      m_pipe.l0c_ready(pt, l0c, m_l0c);
      const CubePipeline::Store st{
          m_s.out_type, cdst,        l0c,      m_act,
          n_act,        m_s.pitch(), m_s.relu, m_s.bn_affine ? &chan0 : nullptr};
      if (stacked()) {
        store_stacked(s, st, pt);
      } else if (strided_y()) {
        store_strided_rows(b, m_s.y_strided, m_s.out_type, m_s.relu, cdst, l0c, p0, m_act, n_act);
        m_pipe.l0c_stored(pt);
      } else {
        m_pipe.store(st, pt);
      }
      if (stats_per_tile()) hand_over_tile(s);
    });
  }

  // The registers compute_step sets for a step: from its tile (tile_output) ch, m_act, msl
  // (the tile's first img2col row in the slab), n_act, cdst (its output address), key and n0;
  // from its chunk (chunk_operands) chan (channels from the chunk's first block), kc (k of the
  // chunk) and bbase (the chunk's B in L1).
  struct TileRegs {
    const Reg &ch, &m_act, &msl, &chan, &kc, &n_act, &cdst, &bbase, &key, &n0;
    const Reg* p0;  // strided y: set to the tile's first position in y (else nullptr)
  };

  // The tile of step s: chunk, positions, set_fmatrix for its slab, channels and output address.
  void tile_output(const Reg& s, const TileRegs& t) {
    KernelBuilder& b = m_b;
    Reg img = b.reg("compute: image"), m0 = b.reg("compute: m0");
    {
      Reg mt = b.reg("compute: m tile");
      decompose(s, t.ch, mt, img, t.key);
      m_slab.tile_positions(mt, m0, t.m_act);
    }
    {
      Reg r0 = b.reg("compute: first row"), h = b.reg("compute: rows");
      m_slab.slab_rows(m0, t.m_act, r0, h);
      m_slab.set_fmatrix(m0, t.m_act, h);
    }
    m_slab.slab_first_row(t.msl, m0);
    n_range(t.key, t.n0, t.n_act);
    // y + ((img * OH*OW + m0) * pitch + g * group pitch + n0) * size (stacked: without the
    // position, added per image when storing; strided y: the position placed by the store)
    if (stacked()) {
      b.movi(t.cdst, 0);
    } else if (t.p0) {
      b.mul(*t.p0, img, m_s.oh() * m_s.ow());
      b.add(*t.p0, *t.p0, m0, "the tile's first position in y");
      b.movi(t.cdst, 0);
    } else {
      b.mul(t.cdst, img, m_s.oh() * m_s.ow());
      b.add(t.cdst, t.cdst, m0);
      b.mul(t.cdst, t.cdst, m_s.pitch());
    }
    b.div(m0, t.key, m_t.n_tiles);
    b.mul(m0, m0, m_s.group_pitch());
    b.add(t.cdst, t.cdst, m0);
    b.add(t.cdst, t.cdst, t.n0);
    b.mul(t.cdst, t.cdst, m_osz);
    Reg y = b.load_arg("y");
    b.add(t.cdst, t.cdst, y, "output tile address");
  }

  // The chunk of step s: its channels, k, and its B in L1 (resident weights: loaded here by the
  // first tile of a (group, n tile) that reads them).
  void chunk_operands(const Reg& s, const TileRegs& t) {
    KernelBuilder& b = m_b;
    Reg cbase = b.reg("compute: group channel base"), cvalid = b.reg("compute: channels");
    group_channels(t.key, cbase, cvalid);
    cbase.release();
    Reg c1a = b.reg("compute: first block"), ncb = b.reg("compute: blocks");
    chunk_blocks(t.ch, cvalid, c1a, ncb);
    b.mul(t.chan, c1a, kBlk);
    b.sub(t.chan, cvalid, t.chan, "channels from the chunk's first block");
    b.mul(t.kc, ncb, m_taps * kBlk, "k of the chunk");
    if (!resident()) {
      Reg p = b.reg("compute: L1 parity");
      m_pipe.l1_parity(p, s);
      select(b, t.bbase, p, m_bbuf);
      return;
    }
    resident_chunk_address(t.bbase, t.n_act, c1a);
    // The block's first step: load_step has loaded its weights.
    b.if_(ne(s, 0), [&] {
      Reg loading = b.reg("compute: loading");
      auto load_here = [&] {
        resident_key(t.ch, t.key, loading);
        b.and_(loading, *m_prev_key, 1);
        b.if_(ne(loading, 0), [&] {
          KernelBuilder::Origin r(b, "resident weights: this chunk's k-blocks");
          loading.release();
          load_resident_chunk(t.bbase, t.key, t.n0, t.n_act, c1a, ncb, cvalid);
        });
      };
      if (!chunks_ahead()) return load_here();
      weights_ahead(s, t.ch, loading);
      // Loaded by load_step after the slab: MTE1 waits for them.
      b.if_(ne(loading, 0), [&] {
        Reg p = b.reg("compute: L1 parity");
        m_pipe.l1_parity(p, s);
        b.wait_flag(m_b_ahead, p);
      });
      b.if_(eq(loading, 0), load_here);
    });
  }

  // Resident weights' later chunks loaded by load_step (weights_ahead). Split chips only: the
  // coupled chips' kernels (tiles out through the UB) keep every chunk in compute_step, their
  // launches not measured with it.
  bool chunks_ahead() const { return resident() && !m_pipe.via_ub(); }

  // Resident weights: ahead = 1 where load_step(s) (chunk ch) loads a chunk of the weights being
  // loaded (prev_key's low bit) rather than compute_step(s), else 0. Only where the
  // step's weight key is settled when the scalar unit issues load(s) (after compute(s - 2)):
  // chunks from the third on, whose tile's first chunk compute_step has passed (its
  // resident_key: the MTE1 -> MTE2 hand-over of a new key's buffer comes first), and the
  // block's second step, whose key load_step(0) has taken. The same answer in compute(s).
  void weights_ahead(const Reg& s, const Reg& ch, const Reg& ahead) {
    KernelBuilder& b = m_b;
    b.min(ahead, ch, 2);
    b.shr(ahead, ahead, 1, "chunk 2 and later");
    b.if_(eq(s, 1), [&] { b.mov(ahead, ch, "the block's second step: its chunk 1"); });
    Reg loading = b.reg("weights ahead: loading");
    b.and_(loading, *m_prev_key, 1);
    b.and_(ahead, ahead, loading);
  }

  // The chunk's k-blocks in the resident buffer: B + c1a * taps * nb * 512 (nb * 16: the
  // columns of a k-block).
  void resident_chunk_address(const Reg& d, const Reg& n_act, const Reg& c1a) {
    KernelBuilder& b = m_b;
    if (m_s.b_diagonal)
      b.movi(d, diagonal_cols());
    else
      round16(b, d, n_act);
    b.mul(d, d, c1a);
    b.mul(d, d, m_taps * kBlk * m_isz);
    b.add(d, d, static_cast<int64_t>(m_bbuf[0]), "B of the chunk in L1");
  }

  // MTE2 loads a chunk of resident weights at dst (resident_chunk_address) and hands it to MTE1.
  void load_resident_chunk(const Reg& dst, const Reg& key, const Reg& n0, const Reg& n_act,
                           const Reg& c1a, const Reg& ncb, const Reg& cvalid) {
    load_weights(dst, key, n0, n_act, c1a, ncb, cvalid);
    m_b.set_flag(Pipe::MTE2, Pipe::MTE1, m_b_loaded);
    m_b.wait_flag(Pipe::MTE2, Pipe::MTE1, m_b_loaded);
  }

  // Resident weights: the first tile of a (group, n tile) loads them chunk by chunk; on its
  // first chunk prev_key becomes 2 * key + 1 (loading) after MTE1 has finished with the
  // previous weights, on the first chunk of a later tile of the same key 2 * key. t: scratch.
  void resident_key(const Reg& ch, const Reg& key, const Reg& t) {
    KernelBuilder& b = m_b;
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
  }

  // Registers an mmad step reads, set once per chunk: the chunk's slab in L1 (buffer p), the
  // tile's L0C buffer, round16(m_act), nb = round16(n_act) / 16, and B's L1 address for the
  // next step (advanced by bstep = tk0 / 16 * nb fractals per step).
  struct StepRegs {
    Reg slab, l0c, m16, nb, bsrc, bstep, bias;  // bias: the tile's bias in L1 (with a bias)
  };

  // Where a step's mmad writes: its L0C address and columns, and (block-diagonal B) the k
  // where its column block begins (CubePipeline::mmad's block_start).
  struct MmadOut {
    const Reg &l0c, &n;
    const Reg* block_start;
  };

  struct ChunkRegs {
    const Reg &m_act, &n_act, &msl, &chan, &kc, &bbase;
  };

  // The chunk's mmad steps (L1 buffer p, L0C buffer pt), with what every step uses computed
  // once (StepRegs).
  void chunk_mmads(const Reg& p, const Reg& pt, const Reg& ch, const ChunkRegs& c) {
    KernelBuilder& b = m_b;
    StepRegs r{b.reg("compute: L1 slab"),
               b.reg("compute: L0C address"),
               b.reg("compute: fractal rows of the tile"),
               b.reg("compute: n blocks"),
               b.reg("compute: B of the step in L1"),
               b.reg("compute: B bytes per step"),
               b.reg("compute: bias in L1")};
    if (m_s.bias) select(b, r.bias, p, m_bias_l1);
    select(b, r.slab, p, m_slab_buf);
    select(b, r.l0c, pt, m_l0c);
    round16(b, r.m16, c.m_act);
    Reg kk = b.reg("compute: k within the chunk");
    if (m_s.b_diagonal) {
      b.mov(r.bsrc, c.bbase);
      diagonal_mmads(r, pt, ch, kk, c);
      return;
    }
    round16(b, r.nb, c.n_act);
    b.shr(r.nb, r.nb, 4, "nb");
    b.mov(r.bsrc, c.bbase);
    if (b_by_tap_in_l0b()) {  // (no bias: plan_cube_conv)
      r.bias.release();
      b.mul(r.bstep, r.nb, c.kc);
      b.div(r.bstep, r.bstep, m_taps * kBlk);
      b.shl(r.bstep, r.bstep, 9, "a tap's B: ncb * nb * 512 bytes");
    } else {
      b.mul(r.bstep, r.nb, m_t.tk0 * 32, "tk0/16 * nb * 512");
    }
    b.for_range(kk, 0, c.kc, m_t.tk0, [&] {
      mmad_step(r, pt, ch, kk, c.kc, c.msl, c.chan, c.m_act, MmadOut{r.l0c, c.n_act, nullptr});
    });
  }

  int64_t diagonal_cols() const { return m_s.cg_out / m_s.c1_in(); }

  // Block-diagonal B: per channel block of the chunk (k [kb0, kb0 + taps * 16) of the chunk),
  // its mmad steps into its own column block of the tile (absolute block c1 = ch * kc1 +
  // kb0 / (taps * 16): L0C columns [c1 * bd, c1 * bd + bd), bd * M16 * 4 bytes per block,
  // min(bd, n_act - c1 * bd) of them valid; L0C holds tn16 = c1_in * bd columns), the block's
  // first step starting from zeros.
  // r.l0c walks the column blocks.
  void diagonal_mmads(StepRegs& r, const Reg& pt, const Reg& ch, const Reg& kk,
                      const ChunkRegs& c) {
    KernelBuilder& b = m_b;
    const int64_t bd = diagonal_cols(), kblock = m_taps * kBlk;
    b.movi(r.nb, bd / kBlk, "nb: a diagonal block's fractal columns");
    r.bstep.release();  // (steps advance B by their own k; no bias)
    r.bias.release();
    Reg kend = b.reg("compute: end of the block's k"),
        cols = b.reg("compute: columns of the block"), kb0 = b.reg("compute: the block's first k");
    // r.l0c += ch * kc1 * bd * M16 * 4: the chunk's first column block
    b.mul(cols, ch, m_t.kc1 * bd * kL0cElemBytes);
    b.mul(cols, cols, r.m16);
    b.add(r.l0c, r.l0c, cols, "the chunk's first column block in L0C");
    b.for_range(kb0, 0, c.kc, kblock, [&] {
      // Every block's mmads write all bd columns (L0B holds the block's bd / 16 fractal
      // columns per k-block, so the mmad's n must be bd to read them; in a partial last block
      // the columns past n_act, zero weights, are not stored).
      b.movi(cols, bd, "columns of the block");
      b.add(kend, kb0, kblock);
      b.for_range(kk, kb0, kend, m_t.tk0, [&] {
        mmad_step(r, pt, ch, kk, kend, c.msl, c.chan, c.m_act, MmadOut{r.l0c, cols, &kb0});
      });
      b.mul(cols, r.m16, bd * kL0cElemBytes);
      b.add(r.l0c, r.l0c, cols, "next column block");
    });
  }

  // FIX of a stacked tile (step s; C m_act x n_act at l0c, NZ with M16 = round16(m_act)): per
  // image j of the stack, its positions [j * P * OW, (j * P + OH) * OW) (P = period / sh) that
  // the tile covers, one fixpipe per 16 output channels (a 16-column block of L0C is
  // [M16][16]: any first row works), to y + (((img + j) * OH*OW + position) * pitch) * size +
  // cdst (cdst: y and the tile's first channel). Through the UB: the whole tile into the UB,
  // then one copy of each image's rows. Frees L0C buffer pt.
  void store_stacked(const Reg& s, const CubePipeline::Store& st, const Reg& pt) {
    KernelBuilder& b = m_b;
    const Reg &l0c = st.l0c, &cdst = st.dst, &m_act = st.rows, &n_act = st.cols;
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
    if (m_pipe.via_ub()) {
      m_pipe.to_ub(st, pt, nb);  // nb: 32-byte blocks per UB row
    } else {
      b.add(nb, n_act, kBlk - 1);
      b.shr(nb, nb, 4);
      round16(b, m16, m_act);
      b.mul(m16, m16, kBlk * kL0cElemBytes);
    }
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
        b.mul(dst, dst, m_s.pitch() * m_osz);
        b.add(dst, dst, cdst, "first row of the image's part");
        b.sub(src, a, m0);
        if (m_pipe.via_ub()) {
          b.sub(e, e, a, "rows");
          m_pipe.ub_to_gm(dst, &src, e, nb, m_s.pitch() * m_osz / kBlkBytes);
          return;
        }
        b.mul(src, src, kBlk * kL0cElemBytes);
        b.add(src, src, l0c, "its first L0C row");
        b.sub(e, e, a, "rows");
        b.for_range(cb, 0, nb, 1, [&] {
          b.mul(t, cb, kBlk);
          b.sub(t, n_act, t);
          b.min(t, t, kBlk, "channels of the block");
          b.emit(Opcode::op_fixpipe,
                 {Dtype::F32, m_s.out_type, Buf::GM, dst, src, e, t, m_s.pitch(), 1,
                  m_s.relu ? 1 : 0, 0},
                 "the image's rows, 16 channels");
          b.add(dst, dst, kBlk * m_osz);
          b.add(src, src, m16);
        });
      });
    });
    if (m_pipe.via_ub())
      m_pipe.ub_done();
    else
      m_pipe.l0c_stored(pt);
  }

  // One mmad step: k [kk, kk + ks) of the chunk (ks = min(tk0, kend - kk)), into L0C buffer
  // pt at out.l0c (its out.n columns). The L0 parity (the step
  // count's low bit) selects one of two copies of the step, so its flags and L0 addresses are
  // immediates. With a bias, a tile's first step copies its bias into the BT row of the L0
  // parity (free: the mmad that last read it, two steps back, freed the L0 buffers MTE1 waited
  // for) and its mmad starts from it (init 2).
  void mmad_step(const StepRegs& r, const Reg& pt, const Reg& ch, const Reg& kk, const Reg& kend,
                 const Reg& msl, const Reg& chan, const Reg& m_act, const MmadOut& out) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "mmad step: load3d A, load2d B, mmad");
    const Reg& n_act = out.n;
    Reg ks = b.reg("step: k"), q = b.reg("step: L0 parity");
    b.sub(ks, kend, kk);
    b.min(ks, ks, m_t.tk0, "k in this step");
    Reg a = b.reg("step: L0A address"), l0b = b.reg("step: L0B address"),
        n = b.reg("step: fractals");
    Reg bt;
    if (m_s.bias) bt = b.reg("step: bias row in BT");
    // B: fractals [kk/16 * nb, (kk + ks)/16 * nb) of the L1 image, one load2d.
    b.shr(n, ks, 4);
    b.mul(n, n, r.nb, "fractals of the step");
    m_pipe.l0_parity(q);
    b.by_parity(q, [&](int par) {
      m_pipe.l0_wait_free(par, "L0 buffers free");
      b.movi(a, static_cast<int64_t>(m_l0a[par]));
      b.emit(Opcode::op_load3d, {m_s.in_type, a, r.slab, chan, msl, r.m16, kk, ks},
             "img2col rows of the tile, k [kk, kk + ks)");
      b.movi(l0b, static_cast<int64_t>(m_l0b[par]));
      if (b_by_tap_in_l0b()) {
        b.add(n, kk, ks);
        b.shr(n, n, 4, "the step's end k-block");
        load_b_by_tap(r, l0b, kk, n);
        b.movi(l0b, static_cast<int64_t>(m_l0b[par]));
      } else {
        b.emit(Opcode::op_load2d,
               {m_s.in_type, Buf::L0B, l0b, r.bsrc, n, 1,
                m_s.b_mode == CubeConvSpec::BMode::kRowsK ? 1 : 0},
               "B of the step");
      }
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
      m_pipe.l0_loaded(par, "L0 step loaded");
      if (m_s.bias)
        m_pipe.mmad({m_s.in_type, out.l0c, a, l0b, m_act, ks, n_act}, pt, ch, kk, 2, &bt,
                    "C = bias + A * B");
      else
        m_pipe.mmad({m_s.in_type, out.l0c, a, l0b, m_act, ks, n_act}, pt, ch, kk, 0, nullptr,
                    "C = A * B", out.block_start);
      m_pipe.l0_read(par, "L0 buffers read");
    });
    if (out.block_start) {  // a block's last step may be short: advance by this step's fractals
      b.shl(n, n, 9, "fractals x 512 bytes");
      b.add(r.bsrc, r.bsrc, n);
    } else if (b_by_tap_in_l0b()) {
      // (r.bsrc stays the chunk's B: load_b_by_tap addresses each k-block from it)
    } else {
      b.add(r.bsrc, r.bsrc, r.bstep);
    }
    m_pipe.next_l0_step();
  }

  // B of the step by tap (load_weights_by_tap's layout; r.bsrc: the chunk's B in L1, r.bstep:
  // a tap's bytes there, ncb * nb * 512): per k-block i in [kk / 16, iend), (c, tap) = (i / taps,
  // i % taps), one load2d of its nb fractals from r.bsrc + tap * r.bstep + c * nb * 512 to l0b +
  // (i - kk / 16) * nb * 512 (L0B's k-block order). Advances l0b (the caller sets it again).
  void load_b_by_tap(const StepRegs& r, const Reg& l0b, const Reg& kk, const Reg& iend) {
    KernelBuilder& b = m_b;
    Reg i = b.reg("B by tap: k-block"), c = b.reg("B by tap: channel block"),
        src = b.reg("B by tap: source");
    b.shr(i, kk, 4);
    b.for_range(i, i, iend, 1, [&] {
      b.div(c, i, m_taps);
      b.mul(src, c, m_taps);
      b.sub(src, i, src, "tap");
      b.mul(src, src, r.bstep);
      b.mul(c, c, r.nb);
      b.shl(c, c, 9, "c * nb fractals x 512 bytes");
      b.add(src, src, c);
      b.add(src, src, r.bsrc);
      b.emit(Opcode::op_load2d, {m_s.in_type, Buf::L0B, l0b, src, r.nb, 1, 0},
             "a k-block of B (L0B image)");
      b.shl(c, r.nb, 9);
      b.add(l0b, l0b, c, "next k-block in L0B");
    });
  }

  const CubeConvSpec& m_s;
  const CubeConvTiling& m_t;
  KernelBuilder m_b;
  SlabEmitter m_slab;
  const int64_t m_isz, m_osz, m_taps;
  CubePipeline m_pipe;
  const bool m_staggered_weights;  // conv_staggered_weights
  Twin m_slab_buf, m_bbuf, m_l0a, m_l0b, m_l0c, m_bias_l1, m_bias_bt;
  int m_b_drained = -1, m_b_loaded = -1;
  FlagPair m_b_ahead{};  // resident weights loaded by load_step (weights_ahead), by L1 parity
  const Reg* m_prev_key = nullptr;
  ConvBnTables m_bn;        // bn_affine: its UB tables
  bool m_result32 = false;  // bn_affine: the f32 passes write out of place (allocate())
  Twin m_res_tiles;         // residual: its UB tiles
  uint64_t m_bn_a = 0, m_bn_shift = 0, m_bn_rep_a = 0, m_bn_rep_shift = 0;
  const Reg* m_tbeg = nullptr;
  int m_stats_blocks = 0;
};

}  // namespace

SlabEmitter::Geometry conv_slab_geometry(const CubeConvSpec& s, const CubeConvTiling& t) {
  return slab_geometry(s, t);
}

bool conv_staggered_weights(const CubeConvSpec& s, const CubeConvTiling& t, const ChipConfig& cfg,
                            const std::string& op) {
  if (cfg.l2_line_read_bytes_per_cycle <= 0 || t.block_dim <= 1) return false;
  // The blocked filter's stride-packed view (its taps unrolled, load_weights_n16_packed) and
  // groups of a partial channel block (an nd2nz for it: registers the staggered loop lacks).
  if (s.b_nblock > 0 && s.b_mode == CubeConvSpec::BMode::kRowsK &&
      (s.b_tap_row != 0 || s.cg_in % kBlk != 0))
    return false;
  if (t.weights_by_tap && s.kh * s.kw <= 1) return false;  // one tap: nothing to rotate
  return conv_staggered_loads_enabled(op);
}

Launch build_cube_conv(const CubeConvSpec& s, const CubeConvTiling& t, const ChipConfig& cfg,
                       const std::string& op, int* stats_blocks) {
  Launch l;
  ConvEmitter e(s, t, cfg, op);
  l.kernel = e.emit();
  if (stats_blocks) *stats_blocks = e.stats_blocks();
  l.block_dim = t.block_dim;
  l.args = {input_ref(0), input_ref(1), output_ref(0)};
  if (s.bias) l.args.push_back(input_ref(2));  // (callers rebind the arguments)
  l.summary = fmt::format(
      "cube conv{}{}{} {}x{}x{}x{} {} ({}x{} window, stride {}x{}, dilation "
      "{}x{}, zero insertion {}x{}, {} group(s) of {} -> {}): {}",
      s.bias ? " + bias" : "", s.relu ? " + relu" : "",
      s.bn_stats ? " + batch-norm statistics" : "", s.images, s.hs, s.ws, s.cs,
      isa::dtype_name(s.in_type), s.kh, s.kw, s.sh, s.sw, s.dh, s.dw, s.up_h, s.up_w, s.groups,
      s.cg_in, s.cg_out, t.str());
  if (s.y_strided.run_rows > 0)
    l.summary += fmt::format("; y strided: runs of {} positions {} apart{}", s.y_strided.run_rows,
                             s.y_strided.row_pitch,
                             s.y_zero_fill ? ", the zeros between by the vector cores" : "");
  if (conv_staggered_weights(s, t, cfg, op))
    l.summary += t.weights_by_tap ? "; weights' taps staggered"
                 : s.b_nblock > 0 && s.b_mode == CubeConvSpec::BMode::kRowsK
                     ? "; weights' (column block, tap) copies staggered"
                     : "; weights' k-blocks staggered";
  return l;
}

}  // namespace npusim::compiler::ops
