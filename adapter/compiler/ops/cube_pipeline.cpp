#include "adapter/compiler/ops/cube_pipeline.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>

#include <fmt/format.h>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using isa::Pipe;

const CoreKindConfig& cube_core(const ChipConfig& cfg, const std::string& op) {
  const CoreKindConfig* core =
      cfg.core_kind(cfg.split ? isa::CoreKind::AIC : isa::CoreKind::AICORE);
  if (!core || !core->has(Pipe::M))
    throw CompileError(fmt::format("{}: chip {} has no cube cores", op, cfg.name));
  return *core;
}

void require_l0c_to_gm(const ChipConfig& cfg, const std::string& op, const std::string& what) {
  if (!cfg.has_path(Buf::L0C, Buf::GM))
    throw CompileError(fmt::format("{}: chip {} has no l0c->gm path{}", op, cfg.name, what));
}

bool cube_store_via_ub(const ChipConfig& cfg, const CoreKindConfig& core, const std::string& op) {
  const bool via_ub = !cfg.has_path(Buf::L0C, Buf::GM);
  if (via_ub &&
      !(cfg.has_path(Buf::L0C, Buf::UB) && cfg.has_path(Buf::UB, Buf::GM) && core.has(Pipe::MTE3)))
    throw CompileError(
        fmt::format("{}: chip {} has neither an l0c->gm path nor l0c->ub and "
                    "ub->gm on its cube cores",
                    op, cfg.name));
  return via_ub;
}

double cube_store_rate(const ChipConfig& cfg) {
  if (cfg.has_path(Buf::L0C, Buf::GM)) return cfg.path_rate(Buf::L0C, Buf::GM);
  return 1.0 / (1.0 / cfg.path_rate(Buf::L0C, Buf::UB) + 1.0 / cfg.path_rate(Buf::UB, Buf::GM));
}

CubeLoadRate cube_load_rate(const ChipConfig& cfg, double cores, double unique, double loaded) {
  const double miss_rate =
      std::min(cfg.path_rate(Buf::GM, Buf::L1), cfg.hbm_sustained_bytes_per_cycle() / cores);
  const double l2_port = cfg.l2_read_bytes_per_cycle > 0 ? cfg.l2_read_bytes_per_cycle
                                                         : cfg.path_rate(Buf::GM, Buf::L1);
  const double hit_rate = std::min(l2_port, cfg.l2_bytes_per_cycle() / cores);
  CubeLoadRate r;
  r.miss_rate = miss_rate;
  r.hit_share = cfg.l2_bytes > 0 && loaded > 0 ? std::max(0.0, 1 - unique / loaded) : 0.0;
  r.cycles_per_byte =
      (r.hit_share > 0 ? r.hit_share / hit_rate : 0.0) + (1 - r.hit_share) / miss_rate;
  r.access_latency = (cfg.l2_bytes > 0 ? r.hit_share * cfg.l2_latency_cycles : 0.0) +
                     (1 - r.hit_share) * cfg.hbm_latency_cycles;
  return r;
}

namespace {

// The largest multiple of 16 units (k) whose two buffers of bytes_per_k * k fit `buf` of core.
int64_t pingpong_fit(const CoreKindConfig& core, const ChipConfig& cfg, Buf buf,
                     int64_t bytes_per_k, int64_t max_k) {
  BufferPlan plan(buf);
  plan.add("step", static_cast<double>(bytes_per_k), 0, 2);
  return plan.fit(core.capacity(buf), KernelBuilder::alignment(cfg, buf), 16, max_k);
}

}  // namespace

int64_t cube_k_step(const CoreKindConfig& core, const ChipConfig& cfg, int64_t tm, int64_t tn,
                    int64_t isz, int64_t max_k) {
  max_k = max_k / 16 * 16;
  if (max_k < 16) return 0;
  return std::min(pingpong_fit(core, cfg, Buf::L0A, tm * isz, max_k),
                  pingpong_fit(core, cfg, Buf::L0B, tn * isz, max_k));
}

int l0c_buffer_count(const CoreKindConfig& core, const ChipConfig& cfg, int64_t tile_bytes) {
  for (int copies : {2, 1}) {
    BufferPlan plan(Buf::L0C);
    plan.add_fixed("C tile", static_cast<uint64_t>(tile_bytes), copies);
    if (plan_fits(plan, cfg, core)) return copies;
  }
  return 0;
}

bool plan_fits(const BufferPlan& plan, const ChipConfig& cfg, const CoreKindConfig& core) {
  return plan.extent(0, KernelBuilder::alignment(cfg, plan.buf())) <= core.capacity(plan.buf());
}

CubeSplit contiguous_split(int64_t tiles, int64_t cores) {
  const int64_t blocks0 = std::min(cores, tiles);
  CubeSplit s;
  s.per = ceil_div(tiles, blocks0);
  s.block_dim = static_cast<int>(ceil_div(tiles, s.per));
  return s;
}

int64_t channel_table_bytes(int64_t channels) {
  return (round_up(channels, kLanes32) + kLanes32) * kL0cElemBytes;
}

void load_channel_tables(KernelBuilder& b, const std::vector<ChannelTable>& tables,
                         int64_t channels, const char* what) {
  const int64_t blocks = ceil_div(channels * kL0cElemBytes, layout::kBlockBytes);
  Reg dst = b.reg("tables: UB address");
  for (const ChannelTable& t : tables) {
    Reg src = b.load_arg(t.arg);
    b.movi(dst, static_cast<int64_t>(t.ub));
    b.emit(Opcode::op_copy_gm2ub, {dst, src, 1, blocks, 0, 0},
           fmt::format("{}[0, {})", t.arg, channels));
  }
  const int loaded = b.flag(Pipe::MTE2, Pipe::V, what);
  b.set_flag(Pipe::MTE2, Pipe::V, loaded);
  b.wait_flag(Pipe::MTE2, Pipe::V, loaded);
}

void select(KernelBuilder& b, const Reg& d, const Reg& parity, const Twin& base) {
  b.mul(d, parity, static_cast<int64_t>(base[1] - base[0]));
  b.add(d, d, static_cast<int64_t>(base[0]));
}

void round16(KernelBuilder& b, const Reg& d, const Reg& x) {
  b.add(d, x, 15);
  b.shr(d, d, 4);
  b.shl(d, d, 4);
}

void CubePipeline::block_steps_round_robin(const Reg& steps, int64_t tiles, int64_t chunks) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(
      b,
      fmt::format("my tiles = ceil(({} tiles - block) / blocks), {} k chunks each", tiles, chunks));
  Reg blk = b.reg("block id"), nblk = b.reg("block count");
  b.emit(Opcode::op_get_block_id, {blk});
  b.emit(Opcode::op_get_block_num, {nblk});
  b.movi(steps, tiles);
  b.sub(steps, steps, blk);
  b.add(steps, steps, nblk);
  b.sub(steps, steps, 1);
  b.div(steps, steps, nblk);
  b.mul(steps, steps, chunks);
}

void CubePipeline::block_steps_contiguous(const Reg& steps, const Reg& first, int64_t tiles,
                                          int64_t per, int64_t chunks) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(
      b, fmt::format("my tiles: [block * {0}, min({1}, block * {0} + {0}))", per, tiles));
  b.emit(Opcode::op_get_block_id, {first});
  b.mul(first, first, per);
  b.movi(steps, tiles);
  b.sub(steps, steps, first);
  b.min(steps, steps, per);
  b.mul(steps, steps, chunks);
}

void CubePipeline::declare_flags(const CubeFlagNames& n) {
  m_l1_full = m_b.flag_pair(Pipe::MTE2, Pipe::MTE1, n.l1_full);
  m_l1_free = m_b.flag_pair(Pipe::MTE1, Pipe::MTE2, n.l1_free);
  m_l0_full = m_b.flag_pair(Pipe::MTE1, Pipe::M, n.l0_full);
  m_l0_free = m_b.flag_pair(Pipe::M, Pipe::MTE1, n.l0_free);
  m_l0c_full = m_b.flag_pair(Pipe::M, Pipe::FIX, n.l0c_full);
  m_l0c_free = m_b.flag_pair(Pipe::FIX, Pipe::M, n.l0c_free);
  if (m_via_ub && m_affine) {
    m_aff_f32_full = m_b.flag_pair(Pipe::FIX, Pipe::V, "C tile (f32) in UB");
    m_aff_full =
        m_b.flag_pair(Pipe::V, Pipe::MTE3, fmt::format("C tile ({} applied) in UB", m_aff.what));
    if (m_aff.band_tile_cols > 0) {
      // Bands: the f32 band is free once the vector unit has read it (V -> FIX), the output
      // band once MTE3 has stored it (MTE3 -> V).
      m_aff_f32_free = m_b.flag_pair(Pipe::V, Pipe::FIX, "C band (f32) read");
      m_aff_free = m_b.flag_pair(Pipe::MTE3, Pipe::V, "C band (UB) stored");
    } else {
      m_aff_free = m_b.flag_pair(Pipe::MTE3, Pipe::FIX, "C tile (UB) stored");
    }
    if (m_residual) {
      m_res_full = m_b.flag_pair(Pipe::MTE2, Pipe::V, "residual tile in UB");
      m_res_free = m_b.flag_pair(Pipe::V, Pipe::MTE2, "residual tile added");
    }
  } else if (m_via_ub) {
    m_ub_full = m_b.flag(Pipe::FIX, Pipe::MTE3, "C tile in UB");
    m_ub_free = m_b.flag(Pipe::MTE3, Pipe::FIX, "C tile (UB) stored");
  }
}

void CubePipeline::each_free_flag(const std::function<void(const FlagPair&, int)>& f) const {
  for (int q = 0; q < 2; ++q) {
    f(m_l1_free, q);
    f(m_l0_free, q);
    if (q < m_l0c_buffers) f(m_l0c_free, q);
  }
}

void CubePipeline::run(const Reg& steps, const std::function<void(const Reg&)>& load,
                       const std::function<void(const Reg&)>& compute, const Hooks& hooks) {
  KernelBuilder& b = m_b;
  {
    KernelBuilder::Origin o(b, "all buffers start free");
    each_free_flag([&](const FlagPair& f, int q) { b.set_flag(f, q); });
    if (m_via_ub && m_affine)
      for (int q = 0; q < m_aff.buffers; ++q) {
        b.set_flag(m_aff_free, q);
        if (m_aff.band_tile_cols > 0) b.set_flag(m_aff_f32_free, q);
        if (m_residual) b.set_flag(m_res_free, q);
      }
    else if (m_via_ub)
      b.set_flag(Pipe::MTE3, Pipe::FIX, m_ub_free);
    if (hooks.start_free) hooks.start_free();
  }
  m_l0_steps = b.reg_imm("L0 steps so far (parity of the L0 buffers)", 0);
  if (hooks.setup) hooks.setup();
  b.pipelined_steps(steps, load, compute);
  {
    KernelBuilder::Origin o(b, "drain: consume the free flags");
    each_free_flag([&](const FlagPair& f, int q) { b.wait_flag(f, q); });
    if (m_via_ub && m_affine)
      for (int q = 0; q < m_aff.buffers; ++q) {
        b.wait_flag(m_aff_free, q);
        if (m_aff.band_tile_cols > 0) b.wait_flag(m_aff_f32_free, q);
        if (m_residual) b.wait_flag(m_res_free, q);
      }
    else if (m_via_ub)
      b.wait_flag(Pipe::MTE3, Pipe::FIX, m_ub_free);
    if (hooks.drain) hooks.drain();
  }
}

void CubePipeline::emit_mmad(const Mmad& op, int init, const Reg* bias, const char* comment,
                             const Reg* last_step) {
  KernelBuilder& b = m_b;
  const Opnd xbias = bias ? Opnd(*bias) : Opnd(0);
  if (!m_unit_flags || !last_step) {
    b.emit(Opcode::op_mmad, {op.type, op.l0c, op.l0a, op.l0b, op.m, op.k, op.n, init, xbias},
           comment);
    return;
  }
  Label last = b.label("mmad_last_of_tile"), done = b.label("mmad_flagged");
  b.branch(ne(*last_step, 0), last);
  b.emit(Opcode::op_mmad,
         {op.type, op.l0c, op.l0a, op.l0b, op.m, op.k, op.n, init, xbias,
          static_cast<int>(isa::UnitFlag::CHAIN)},
         fmt::format("{} (unit flag: the tile's chain goes on)", comment));
  b.jmp(done);
  b.bind(last);
  b.emit(Opcode::op_mmad,
         {op.type, op.l0c, op.l0a, op.l0b, op.m, op.k, op.n, init, xbias,
          static_cast<int>(isa::UnitFlag::LAST)},
         fmt::format("{} (unit flag: the tile's last mmad)", comment));
  b.bind(done);
}

void CubePipeline::mmad(const Mmad& op, const Reg& pt, const Reg& ch, const Reg& kk, int first_init,
                        const Reg* bt, const char* first_comment, const Reg* block_start,
                        const Reg* last_step) {
  KernelBuilder& b = m_b;
  Label acc = b.label("accumulate"), issued = b.label("mmad_issued");
  b.branch(ne(ch, 0), acc);
  b.branch(ne(kk, 0), acc);
  b.wait_flag(m_l0c_free, pt, "first step of the tile: L0C free");
  emit_mmad(op, first_init, bt, first_comment, last_step);
  b.jmp(issued);
  b.bind(acc);
  if (block_start) {
    Label accumulate = b.label("accumulate_block");
    b.branch(ne(kk, *block_start), accumulate);
    emit_mmad(op, 0, nullptr, "C block = A * B (first step of a column block)", last_step);
    b.jmp(issued);
    b.bind(accumulate);
  }
  emit_mmad(op, 1, nullptr, "C += A * B", last_step);
  b.bind(issued);
}

void CubePipeline::l0c_ready(const Reg& pt, const Reg& l0c, const Twin& l0c_buf) {
  if (!m_unit_flags) {  // with unit flags FIXPIPE synchronises with the mmads on the tile
    m_b.set_flag(m_l0c_full, pt);
    m_b.wait_flag(m_l0c_full, pt);
  }
  select(m_b, l0c, pt, l0c_buf);
}

void CubePipeline::store(const Store& s, const Reg& pt) {
  KernelBuilder& b = m_b;
  if (!m_via_ub && m_unit_flags) {
    b.emit(Opcode::op_fixpipe,
           {Dtype::F32, s.out_type, Buf::GM, s.dst, s.l0c, s.rows, s.cols, s.pitch, 1,
            s.relu ? 1 : 0, 0, isa::L2Hint::NORMAL, static_cast<int>(isa::UnitFlag::LAST)},
           "C tile to GM (ND) as the tile's last mmad completes it (unit flag)");
    l0c_stored(pt);
    return;
  }
  if (!m_via_ub) {
    b.emit(Opcode::op_fixpipe,
           {Dtype::F32, s.out_type, Buf::GM, s.dst, s.l0c, s.rows, s.cols, s.pitch, 1,
            s.relu ? 1 : 0, 0},
           "C tile to GM (ND)");
    l0c_stored(pt);
    return;
  }
  if (m_affine && m_aff.band_tile_cols > 0) {
    store_in_bands(s, pt);
    return;
  }
  Reg blocks = b.reg("store: blocks per row");
  to_ub(s, pt, blocks);
  if (m_affine && m_aff.packed) {  // one run of the tile's blocks
    Reg one = b.reg_imm("store: one run (packed rows)", 1);
    ub_to_gm(s.dst, nullptr, one, blocks, packed_run_blocks(s));
  } else {
    ub_to_gm(s.dst, nullptr, s.rows, blocks,
             s.pitch * isa::dtype_size(s.out_type) / layout::kBlockBytes);
  }
  ub_done();
}

int64_t CubePipeline::packed_run_blocks(const Store& s) const {
  return m_aff.max_rows * s.pitch * isa::dtype_size(s.out_type) / layout::kBlockBytes;
}

void CubePipeline::to_ub(const Store& s, const Reg& pt, const Reg& row_blocks) {
  KernelBuilder& b = m_b;
  // L0C -> UB (ND, rows of whole 32-byte blocks).
  Reg row = b.reg("store: UB row in elements");
  const int64_t per_block = layout::kBlockBytes / isa::dtype_size(s.out_type);
  b.add(row, s.cols, per_block - 1);
  b.div(row, row, per_block);
  b.mul(row_blocks, row, 1, "blocks per row");
  b.mul(row, row, per_block, "UB row pitch");
  if (m_affine) {
    // f32 rows of the widest tile's blocks for the vector unit, then the epilogue into the
    // output tile; both buffers of the L0C buffer's parity (one pair with one L0C buffer).
    m_aff_pt = &pt;
    // Packed rows: the output tile (and the residual) as one row of the tile's blocks, a
    // "pitch" of the largest tile's.
    Reg one;
    if (m_aff.packed) {
      if (!m_aff.dense || !m_aff.result32 || m_aff.band_tile_cols > 0)
        b.fail("internal: packed output rows need the dense tables and the f32 result tile");
      b.mul(row_blocks, s.rows, s.pitch * isa::dtype_size(s.out_type));
      b.div(row_blocks, row_blocks, layout::kBlockBytes, "blocks of the packed tile");
      one = b.reg_imm("store: one run (packed rows)", 1);
    }
    const int64_t run_pitch = m_aff.packed ? packed_run_blocks(s) *
                                                 static_cast<int64_t>(layout::kBlockBytes) /
                                                 isa::dtype_size(s.out_type)
                                           : s.pitch;
    const Store run{s.out_type, s.dst,     s.l0c,  m_aff.packed ? one : s.rows,
                    s.cols,     run_pitch, s.relu, s.channel0};
    if (m_residual) load_residual(run, pt, row_blocks);
    b.wait_flag(m_aff_free, pt, "C tiles (UB) free");
    select(b, row, pt, m_aff.tile32);
    b.emit(Opcode::op_fixpipe,
           {Dtype::F32, Dtype::F32, Buf::UB, row, s.l0c, s.rows, s.cols,
            m_aff.row_blocks32 * kBlockLanes32, 1, 0, 0},
           "C tile to UB (ND, f32)");
    row.release();
    l0c_stored(pt);
    b.set_flag(m_aff_f32_full, pt);
    b.wait_flag(m_aff_f32_full, pt);
    if (m_aff.dense)
      affine_dense_in_ub(s, pt);
    else
      affine_in_ub(s, pt, row_blocks);
    if (m_residual) add_residual(run, pt, row_blocks);
    affine_output_activation(run, pt, row_blocks);
    b.set_flag(m_aff_full, pt);
    b.wait_flag(m_aff_full, pt);
    return;
  }
  b.wait_flag(Pipe::MTE3, Pipe::FIX, m_ub_free, "C tile (UB) free");
  b.emit(Opcode::op_fixpipe,
         {Dtype::F32, s.out_type, Buf::UB, m_ub_tile, s.l0c, s.rows, s.cols, row, 1, s.relu ? 1 : 0,
          0},
         "C tile to UB (ND)");
  l0c_stored(pt);
  b.set_flag(Pipe::FIX, Pipe::MTE3, m_ub_full);
  b.wait_flag(Pipe::FIX, Pipe::MTE3, m_ub_full);
}

void CubePipeline::count_output_lanes(const Store& s, const Reg& row_blocks, const Reg& n) {
  KernelBuilder& b = m_b;
  b.mul(n, s.rows, row_blocks);
  b.mul(n, n, layout::kBlockBytes / isa::dtype_size(s.out_type), "rows x row lanes");
  b.emit(Opcode::op_set_mask_count, {n});
}

bool CubePipeline::add_relu_conv_enabled() const {
  // The value is checked on every chip, with the instruction or not.
  const char* v = std::getenv("NPUSIM_FUSION_ADD_RELU_CAST");
  if (!v || std::string_view(v) == "1") return m_b.config().vector_add_relu_conv;
  if (std::string_view(v) == "0") return false;
  m_b.fail(fmt::format("NPUSIM_FUSION_ADD_RELU_CAST='{}' is neither '0' nor '1'", v));
}

bool CubePipeline::add_relu_conv(const Store& s) const {
  // ReLU6 only: vaddreluconv saturates a sum past the f16 range to 65504 where the rounding
  // (vconv) and TensorFlow give +inf; the clamp at 6 hides that (6 either way), ReLU would not.
  return m_add_relu_conv && s.out_type == Dtype::F16 && !m_residual && !m_aff.packed &&
         m_aff.act == Activation::kRelu6;
}

uint64_t CubePipeline::clamp_scratch_span() const {
  const ChipConfig& cfg = m_b.config();
  const uint64_t span = cfg.ub_banks > 0 && cfg.ub_bank_width_bytes > 0
                            ? static_cast<uint64_t>(cfg.ub_banks) * cfg.ub_bank_width_bytes
                            : layout::kBlockBytes;
  // The vector operands' UB alignment (as the simulator checks it: alignment.ub, default 1).
  const auto it = cfg.align_bytes.find(Buf::UB);
  const uint64_t align = it == cfg.align_bytes.end() || it->second == 0 ? 1 : it->second;
  return span % (2 * align) == 0 ? span : 0;
}

uint64_t CubePipeline::relu6_scratch_at(int q) const {
  const uint64_t span = clamp_scratch_span();
  const uint64_t want = (m_aff.out[q] + span / 2) % span, at = m_aff.result32_at % span;
  return m_aff.result32_at + (want + span - at) % span;
}

Twin CubePipeline::add_relu_conv_dst() const {
  if (!m_aff.result32 || clamp_scratch_span() == 0) return m_aff.out;
  if (!m_aff.shift_only) {
    // y * a went into the result tile as one run (dense) before vaddreluconv reads it: the f32
    // tile is free, and affine_relu6_via_scratch's scratch in it serves (the column groups and
    // periodic runs read later parts of the f32 tile after each vaddreluconv: in place there).
    if (!m_aff.dense || !clamp_scratch_fits()) return m_aff.out;
    return Twin{{m_aff.tile32[0] + clamp_scratch_offset(0),
                 m_aff.tile32[m_aff.buffers - 1] + clamp_scratch_offset(m_aff.buffers - 1)}};
  }
  // The result tile holds max_rows x row_blocks32 blocks of f32; the f16 result at most
  // max_rows x max_cols x 2 bytes (the periodic runs' rows rounded up stay within max_rows).
  const uint64_t f32_bytes = static_cast<uint64_t>(m_aff.max_rows * m_aff.row_blocks32) *
                             layout::kBlockBytes,
                 out_bytes = static_cast<uint64_t>(m_aff.max_rows * m_aff.max_cols * 2);
  for (int q = 0; q < m_aff.buffers; ++q)
    if (relu6_scratch_at(q) - m_aff.result32_at + out_bytes > f32_bytes) return m_aff.out;
  return Twin{{relu6_scratch_at(0), relu6_scratch_at(m_aff.buffers - 1)}};
}

int64_t CubePipeline::whole_cols(const Store& s) const {
  const int64_t row_lanes32 = m_aff.row_blocks32 * kBlockLanes32;
  return s.out_type != Dtype::F32 &&
                 row_lanes32 % (layout::kBlockBytes / isa::dtype_size(s.out_type)) == 0
             ? row_lanes32
             : 0;
}

void CubePipeline::affine_output_activation(const Store& s, const Reg& pt, const Reg& row_blocks) {
  if ((s.out_type == Dtype::F32 && !m_residual) || m_aff.act == Activation::kNone) return;
  if (add_relu_conv(s)) {
    // vaddreluconv did the ReLU (every tile, or with periodic tables those of whole_cols
    // columns; the others as below): ReLU6 clamps at 6 from where it wrote the f16 result
    // (add_relu_conv_dst: a scratch, or the output tile itself) into the output tile.
    const auto clamp6 = [&] {
      KernelBuilder& b = m_b;
      Reg n = b.reg("affine: output lanes"), out = b.reg("affine: output tile"),
          from = b.reg("affine: the f16 result");
      count_output_lanes(s, row_blocks, n);
      select(b, out, pt, m_aff.out);
      select(b, from, pt, add_relu_conv_dst());
      b.movi(n, vector_scalar_bits(s.out_type, 6.0));
      b.emit(Opcode::op_vmins, {s.out_type, out, from, n, 0, 1, 1, 8, 8},
             "min 6 into the output tile (max 0 was in vaddreluconv)");
    };
    if (m_aff.period == 0 || m_aff.dense) return clamp6();
    m_b.if_(eq(s.cols, whole_cols(s)), clamp6);
    m_b.if_(ne(s.cols, whole_cols(s)),
            [&] { affine_output_activation_unfused(s, pt, row_blocks); });
    return;
  }
  affine_output_activation_unfused(s, pt, row_blocks);
}

void CubePipeline::affine_output_activation_unfused(const Store& s, const Reg& pt,
                                                    const Reg& row_blocks) {
  // A narrower output takes its activation after the rounding, on the output tile as one run
  // (rows of whole blocks; the padding lanes too): twice the lanes per repeat, and the same
  // values (rounding is monotone, 0 and 6 are exact in f16). With a residual the activation
  // follows the add, on the output tile whatever its type.
  KernelBuilder& b = m_b;
  Reg n = b.reg("affine: output lanes");
  count_output_lanes(s, row_blocks, n);
  Reg out = b.reg("affine: output tile");
  select(b, out, pt, m_aff.out);
  if (s.out_type != Dtype::F32 && m_aff.act == Activation::kRelu6 && clamp_scratch_fits())
    affine_relu6_via_scratch(s.out_type, out, pt, n);
  else
    affine_activation(s.out_type, out, 0, 8, n);
}

void CubePipeline::store_in_bands(const Store& s, const Reg& pt) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, fmt::format("C tile to GM in bands of {} columns ({} in the UB)",
                                         m_aff.max_cols, m_aff.what));
  if (!s.channel0) b.fail("internal: the affine epilogue needs the tile's first channel");
  if (m_aff.dense || m_aff.result32 || m_residual || m_aff.buffers != 2 ||
      m_aff.max_cols % static_cast<int64_t>(layout::kFractalRows) != 0)
    b.fail(
        "internal: column bands need two buffer pairs, whole L0C column blocks, no dense, "
        "out-of-place or residual pass");
  const int64_t osz = isa::dtype_size(s.out_type), per_block = layout::kBlockBytes / osz;
  Reg col_bytes = b.reg("band: L0C bytes per column"), src = b.reg("band: L0C address"),
      cols = b.reg("band: columns"), q = b.reg("band: UB buffer pair"),
      ch = b.reg("band: first channel"), blocks = b.reg("band: output blocks per row");
  // L0C holds the tile as [column blocks of 16][round_up(rows, 16)][16] f32: column c starts
  // c * round_up(rows, 16) * 4 bytes in (c a multiple of 16).
  round16(b, col_bytes, s.rows);
  b.mul(col_bytes, col_bytes, kL0cElemBytes, "L0C bytes per column");
  m_aff_pt = &q;
  for (int64_t c0 = 0, i = 0; c0 < m_aff.band_tile_cols; c0 += m_aff.max_cols, ++i) {
    b.if_(ge(s.cols, c0 + 1), [&] {
      b.sub(cols, s.cols, c0);
      b.min(cols, cols, m_aff.max_cols, "columns of the band");
      b.movi(q, i & 1, "the bands take the two buffer pairs in turn");
      b.wait_flag(m_aff_f32_free, q, "f32 band (UB) free");
      b.mul(src, col_bytes, c0);
      b.add(src, src, s.l0c, "the band's first column in L0C");
      select(b, ch, q, m_aff.tile32);
      b.emit(Opcode::op_fixpipe,
             {Dtype::F32, Dtype::F32, Buf::UB, ch, src, s.rows, cols,
              m_aff.row_blocks32 * kBlockLanes32, 1, 0, 0},
             "C band to UB (ND, f32)");
      b.set_flag(m_aff_f32_full, q);
      b.wait_flag(m_aff_f32_full, q);
      b.add(ch, *s.channel0, c0);
      b.add(blocks, cols, per_block - 1);
      b.div(blocks, blocks, per_block, "output blocks per row");
      const Store band{s.out_type, s.dst, src, s.rows, cols, s.pitch, s.relu, &ch};
      b.wait_flag(m_aff_free, q, "output band (UB) free");
      affine_in_ub(band, q, blocks);
      affine_output_activation(band, q, blocks);
      b.set_flag(m_aff_f32_free, q);
      b.set_flag(m_aff_full, q);
      b.wait_flag(m_aff_full, q);
      b.add(src, s.dst, c0 * osz, "the band's first column in GM");
      ub_to_gm(src, nullptr, s.rows, blocks, s.pitch * osz / layout::kBlockBytes);
      ub_done();
    });
  }
  // FIXPIPE runs in order: L0C is free after the last band's FIXPIPE.
  l0c_stored(pt);
  m_aff_pt = nullptr;
}

void CubePipeline::affine_in_ub(const Store& s, const Reg& pt, const Reg& blocks) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, fmt::format("{} on the tile in the UB: {}, activation", m_aff.what,
                                         m_aff.shift_only ? "y + shift" : "y * a + shift"));
  if (!s.channel0) b.fail("internal: the affine epilogue needs the tile's first channel");
  const bool narrow = s.out_type != Dtype::F32;
  const int64_t pitch32 = m_aff.row_blocks32, osz = isa::dtype_size(s.out_type);
  const int64_t to_shift =
      static_cast<int64_t>(m_aff.shift) - static_cast<int64_t>(m_aff.a);  // table to table
  // Unrolled over the tile's largest extent: column groups of 64 f32 lanes (one repeat; the
  // last group's lanes past cols masked off) and row chunks of kMaxRepeat rows (the repeats;
  // the tables' repeat stride 0: every row reads the same 64 channels). Four registers: the
  // mask (then the scalars and the output address), the rows, the table address and the f32
  // rows' address.
  Reg mask = b.reg("affine: lane mask"), rep = b.reg("affine: rows"),
      table = b.reg("affine: a (then shift) of the group"), y = b.reg("affine: f32 rows"),
      res = b.reg("affine: f32 result rows");
  // A narrower output tile whose columns fill both its rows and the f32 tile's exactly (cols ==
  // pitch32 * 8, a whole number of output blocks: no padding lanes in either) is rounded as one
  // counter-mode run over the whole tile after the column groups' passes: ceil(rows * cols / 64)
  // repeats in one instruction rather than rows repeats per column group, the last group's
  // masked lanes included. The same conversion of the same elements. whole_cols: that column
  // count (0: never).
  const int64_t whole_cols = this->whole_cols(s);
  const bool periodic = m_aff.period > 0;
  // AddReluCast: + shift, ReLU and the rounding in one pass (the periodic runs' when the
  // tile's columns are whole_cols, else each column group's), no rounding pass after them.
  const bool fused = add_relu_conv(s);
  Reg out = fused && !periodic ? b.reg("affine: output address") : Reg{};
  if (periodic) {
    if (!narrow || whole_cols != m_aff.max_cols)
      b.fail("internal: the periodic tables need a narrower output and rows of max_cols lanes");
    affine_periodic(s, pt, mask, rep, table, y, res);
  }
  // Per column group: the affine passes and (a narrower output) the rounding, or with the
  // periodic tables the rounding of a tile narrower than max_cols only.
  const auto column_groups = [&](const std::function<void()>& each) {
    if (periodic)
      b.if_(ne(s.cols, whole_cols), each);
    else
      each();
  };
  column_groups([&] {
    for (int64_t col = 0; col < m_aff.max_cols; col += kLanes32) {
      b.if_(ge(s.cols, col + 1), [&] {
        b.sub(mask, s.cols, col, "the group's lanes");
        b.movi(rep, -1, "all 64 lanes");
        b.if_(lt(mask, kLanes32), [&] {
          b.movi(rep, 1);
          b.shl(rep, rep, mask);
          b.sub(rep, rep, 1, "lanes [0, cols - col)");
        });
        b.emit(Opcode::op_set_mask, {0, rep});
        for (int64_t r0 = 0; r0 < m_aff.max_rows; r0 += kMaxRepeat) {
          b.if_(ge(s.rows, r0 + 1), [&] {
            b.sub(rep, s.rows, r0);
            b.min(rep, rep, kMaxRepeat, "rows of this instruction");
            if (fused && !periodic) {  // where the group's f16 result goes, while y is free
              b.mul(out, blocks, r0 * layout::kBlockBytes);
              select(b, y, pt, add_relu_conv_dst());
              b.add(out, out, y);
              b.add(out, out, col * osz, "output address");
            }
            b.add(table, *s.channel0, col);
            b.mul(table, table, kL0cElemBytes);
            b.add(table, table, static_cast<int64_t>(m_aff.a), "a[channel]");
            const int64_t rows_off = r0 * pitch32 * layout::kBlockBytes + col * kL0cElemBytes;
            select(b, y, pt, m_aff.tile32);
            b.add(y, y, rows_off, "the rows' first element of the group");
            if (periodic) {  // the passes are done: y names where the f32 result is
              if (m_aff.result32 && m_aff.shift_only)
                b.movi(y, static_cast<int64_t>(m_aff.result32_at) + rows_off, "the result's rows");
            } else if (fused) {
              // y * a (into the result tile where there is one), then + shift, ReLU and the
              // rounding into the output tile's group in one pass.
              if (!m_aff.shift_only) {
                const Reg& product = m_aff.result32 ? res : y;
                if (m_aff.result32) b.movi(res, static_cast<int64_t>(m_aff.result32_at) + rows_off);
                b.emit(Opcode::op_vmul,
                       {Dtype::F32, product, y, table, rep, 1, 1, 1, pitch32, pitch32, 0}, "y * a");
                if (m_aff.result32) b.mov(y, res);
              }
              b.add(table, table, to_shift, "shift[channel]");
              b.emit(Opcode::op_vaddreluconv,
                     {Dtype::F16, Dtype::F32, out, y, table, rep, 1, 1, 1, blocks, pitch32, 0},
                     "+ shift, ReLU, rounded once to f16 (AddReluCast)");
              return;
            } else if (m_aff.result32) {
              // Out of place: y * a into the result tile and + shift back (a in the filter:
              // y + shift into the result tile); y then names where the f32 result is.
              b.movi(res, static_cast<int64_t>(m_aff.result32_at) + rows_off, "the result's rows");
              if (!m_aff.shift_only)
                b.emit(Opcode::op_vmul,
                       {Dtype::F32, res, y, table, rep, 1, 1, 1, pitch32, pitch32, 0}, "y * a");
              b.add(table, table, to_shift, "shift[channel]");
              if (m_aff.shift_only) {
                b.emit(Opcode::op_vadd,
                       {Dtype::F32, res, y, table, rep, 1, 1, 1, pitch32, pitch32, 0}, "+ shift");
                b.mov(y, res);
              } else {
                b.emit(Opcode::op_vadd,
                       {Dtype::F32, y, res, table, rep, 1, 1, 1, pitch32, pitch32, 0}, "+ shift");
              }
            } else {
              if (!m_aff.shift_only)
                b.emit(Opcode::op_vmul,
                       {Dtype::F32, y, y, table, rep, 1, 1, 1, pitch32, pitch32, 0}, "y * a");
              b.add(table, table, to_shift, "shift[channel]");
              b.emit(Opcode::op_vadd, {Dtype::F32, y, y, table, rep, 1, 1, 1, pitch32, pitch32, 0},
                     "+ shift");
            }
            if (!narrow && !m_residual) affine_activation(Dtype::F32, y, rep, pitch32, mask);
            // The output tile: rows of `blocks` blocks, the group at col * osz bytes.
            b.mul(table, blocks, r0 * layout::kBlockBytes);
            select(b, mask, pt, m_aff.out);
            b.add(mask, mask, table);
            b.add(mask, mask, col * osz, "output address");
            if (narrow)
              b.if_(ne(s.cols, whole_cols), [&] {
                b.emit(Opcode::op_vconv,
                       {s.out_type, Dtype::F32, mask, y, rep, 1, 1, blocks, pitch32,
                        static_cast<int64_t>(RoundMode::kRint)},
                       "rounded once to the output type (this column group)");
              });
            else
              b.emit(Opcode::op_vcopy, {Dtype::S32, mask, y, rep, 1, 1, blocks, pitch32},
                     "rows packed to the output's pitch");
          });
        }
      });
    }
  });
  if (whole_cols == 0 || fused) return;
  b.if_(eq(s.cols, whole_cols), [&] {
    // y: where the f32 result is (the result tile, out of place with a in the filter).
    if (m_aff.result32 && m_aff.shift_only)
      b.movi(y, static_cast<int64_t>(m_aff.result32_at));
    else
      select(b, y, pt, m_aff.tile32);
    b.mul(rep, s.rows, whole_cols, "rows x row lanes");
    b.emit(Opcode::op_set_mask_count, {rep});
    select(b, mask, pt, m_aff.out);
    b.emit(Opcode::op_vconv,
           {s.out_type, Dtype::F32, mask, y, 0, 1, 1, kLanes32 * osz / layout::kBlockBytes, 8,
            static_cast<int64_t>(RoundMode::kRint)},
           "rounded once to the output type (the whole tile, one run)");
  });
}

void CubePipeline::affine_periodic(const Store& s, const Reg& pt, const Reg& mask, const Reg& rep,
                                   const Reg& table, const Reg& y, const Reg& res) {
  KernelBuilder& b = m_b;
  const int64_t w = m_aff.max_cols, runs = m_aff.period / kLanes32, per = m_aff.period / w;
  if (m_aff.dense || m_aff.period % w != 0 || m_aff.period % kLanes32 != 0 ||
      m_aff.max_rows % per != 0 || ceil_div(m_aff.max_rows, per) > kMaxRepeat ||
      runs * 8 > kMaxRepeat || m_aff.row_blocks32 * kBlockLanes32 != w)
    b.fail("internal: periodic tables need whole periods of rows within one instruction");
  b.add(rep, s.rows, per - 1);
  b.div(rep, rep, per, "periods of the tile's rows (rounded up: inside the tile's room)");
  b.movi(mask, -1, "all 64 lanes");
  b.emit(Opcode::op_set_mask, {0, mask});
  // channel0 / w periods of period lanes into the tables.
  b.mul(table, *s.channel0, m_aff.period * kL0cElemBytes / w);
  b.add(table, table, static_cast<int64_t>(m_aff.a), "a of the tile's n tile, periodic");
  if (add_relu_conv(s)) {
    // mask (set above) names the run's output lanes.
    b.if_(eq(s.cols, whole_cols(s)), [&] { periodic_runs(true, pt, rep, table, y, res, mask); });
    b.if_(ne(s.cols, whole_cols(s)), [&] { periodic_runs(false, pt, rep, table, y, res, mask); });
  } else {
    periodic_runs(false, pt, rep, table, y, res, mask);
  }
}

void CubePipeline::periodic_runs(bool fused, const Reg& pt, const Reg& rep, const Reg& table,
                                 const Reg& y, const Reg& res, const Reg& out) {
  KernelBuilder& b = m_b;
  const int64_t runs = m_aff.period / kLanes32;
  const int64_t to_shift = static_cast<int64_t>(m_aff.shift) - static_cast<int64_t>(m_aff.a);
  const int64_t stride = runs * 8;  // blocks from one repeat of a run to its next
  for (int64_t j = 0; j < runs; ++j) {
    const int64_t off = j * static_cast<int64_t>(vec::kRepeatBytes);
    select(b, y, pt, m_aff.tile32);
    b.add(y, y, off, "the run's first repeat");
    if (j > 0) b.add(table, table, static_cast<int64_t>(vec::kRepeatBytes), "the run's lanes");
    if (fused) {
      // Lane i of the tile (rows of max_cols lanes) is lane i of the output tile (whole_cols
      // columns): the run's f16 lanes at half the byte offset, repeats stride / 2 blocks apart.
      const Reg& src = m_aff.result32 && !m_aff.shift_only ? res : y;
      if (!m_aff.shift_only) {
        if (m_aff.result32)
          b.movi(res, static_cast<int64_t>(m_aff.result32_at) + off, "the run's y * a");
        b.emit(Opcode::op_vmul, {Dtype::F32, src, y, table, rep, 1, 1, 1, stride, stride, 0},
               "y * a");
      }
      b.add(table, table, to_shift, "shift, periodic");
      select(b, out, pt, add_relu_conv_dst());
      b.add(out, out, off / 2, "the run's first repeat (f16)");
      b.emit(Opcode::op_vaddreluconv,
             {Dtype::F16, Dtype::F32, out, src, table, rep, 1, 1, 1, stride / 2, stride, 0},
             "+ shift, ReLU, rounded once to f16 (AddReluCast)");
    } else if (m_aff.result32) {
      // Out of place as affine_in_ub's column groups: y * a into the result tile and + shift
      // back (a in the filter: y + shift into the result tile).
      b.movi(res, static_cast<int64_t>(m_aff.result32_at) + off, "the run's result");
      if (!m_aff.shift_only)
        b.emit(Opcode::op_vmul, {Dtype::F32, res, y, table, rep, 1, 1, 1, stride, stride, 0},
               "y * a");
      b.add(table, table, to_shift, "shift, periodic");
      if (m_aff.shift_only)
        b.emit(Opcode::op_vadd, {Dtype::F32, res, y, table, rep, 1, 1, 1, stride, stride, 0},
               "+ shift");
      else
        b.emit(Opcode::op_vadd, {Dtype::F32, y, res, table, rep, 1, 1, 1, stride, stride, 0},
               "+ shift");
    } else {
      if (!m_aff.shift_only)
        b.emit(Opcode::op_vmul, {Dtype::F32, y, y, table, rep, 1, 1, 1, stride, stride, 0},
               "y * a");
      b.add(table, table, to_shift, "shift, periodic");
      b.emit(Opcode::op_vadd, {Dtype::F32, y, y, table, rep, 1, 1, 1, stride, stride, 0},
             "+ shift");
    }
    b.sub(table, table, to_shift, "a, periodic");
  }
}

void CubePipeline::load_residual(const Store& s, const Reg& pt, const Reg& row_blocks) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, "residual rows of the tile into the UB");
  const int64_t pitch_bytes = s.pitch * isa::dtype_size(s.out_type);
  if (pitch_bytes % layout::kBlockBytes != 0)
    b.fail("internal: the residual's rows must be whole 32-byte blocks");
  Reg src = b.reg("residual: GM address"), gap = b.reg("residual: GM gap between rows"),
      dst = b.reg("residual: UB tile");
  b.wait_flag(m_res_free, pt, "residual tile (UB) free");
  {
    Reg base = b.load_arg(m_res_args.second);
    b.add(src, s.dst, base);
  }
  {
    Reg base = b.load_arg(m_res_args.first);
    b.sub(src, src, base, "the tile's rows in the residual");
  }
  b.movi(gap, pitch_bytes / layout::kBlockBytes);
  b.sub(gap, gap, row_blocks, "GM gap between rows in blocks");
  select(b, dst, pt, m_res_tiles);
  b.emit(Opcode::op_copy_gm2ub, {dst, src, s.rows, row_blocks, gap, 0},
         "residual rows (output tile layout)");
  b.set_flag(m_res_full, pt);
}

void CubePipeline::add_residual(const Store& s, const Reg& pt, const Reg& row_blocks) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, "y + residual on the output tile (output type)");
  Reg n = b.reg("residual: lanes"), out = b.reg("residual: output tile"),
      r = b.reg("residual: residual tile");
  count_output_lanes(s, row_blocks, n);
  select(b, out, pt, m_aff.out);
  select(b, r, pt, m_res_tiles);
  b.wait_flag(m_res_full, pt, "residual tile loaded");
  b.emit(Opcode::op_vadd, {s.out_type, out, out, r, 0, 1, 1, 1, 8, 8, 8}, "+ residual");
  b.set_flag(m_res_free, pt);
}

void CubePipeline::affine_activation(Dtype t, Opnd y, Opnd repeat, int64_t rep_stride,
                                     const Reg& scalar) {
  KernelBuilder& b = m_b;
  if (m_aff.act == Activation::kRelu)
    b.emit(Opcode::op_vrelu, {t, y, y, repeat, 1, 1, rep_stride, rep_stride}, "ReLU");
  if (m_aff.act != Activation::kRelu6) return;
  b.movi(scalar, vector_scalar_bits(t, 0.0));
  b.emit(Opcode::op_vmaxs, {t, y, y, scalar, repeat, 1, 1, rep_stride, rep_stride}, "max 0");
  b.movi(scalar, vector_scalar_bits(t, 6.0));
  b.emit(Opcode::op_vmins, {t, y, y, scalar, repeat, 1, 1, rep_stride, rep_stride}, "min 6");
}

// The f32 tile of a parity is free once its rounding into the output tile is issued (the
// vector unit runs in order), so ReLU6 on a narrower output goes out of place: max 0 into
// the f32 tile's room, min 6 back into the output tile. In place each repeat reads and writes
// the same UB banks (two accesses per bank: docs/chip_model.md's bank model); the scratch
// starts half the bank span after the output tile modulo the span, so a repeat's source and
// destination blocks fall in disjoint banks.
uint64_t CubePipeline::clamp_scratch_offset(int q) const {
  const uint64_t span = clamp_scratch_span();
  const uint64_t want = (m_aff.out[q] + span / 2) % span, at = m_aff.tile32[q] % span;
  return (want + span - at) % span;
}

bool CubePipeline::clamp_scratch_fits() const {
  if (clamp_scratch_span() == 0) return false;
  // The f32 tile holds rows x max_cols x 4 bytes, the output tile at most rows x max_cols x 2.
  const uint64_t out_bytes = static_cast<uint64_t>(m_aff.max_rows * m_aff.max_cols * 2),
                 f32_bytes = static_cast<uint64_t>(m_aff.max_rows * m_aff.row_blocks32) *
                             layout::kBlockBytes;
  for (int q = 0; q < m_aff.buffers; ++q)
    if (clamp_scratch_offset(q) + out_bytes > f32_bytes) return false;
  return true;
}

void CubePipeline::affine_relu6_via_scratch(Dtype t, const Reg& out, const Reg& pt,
                                            const Reg& scalar) {
  KernelBuilder& b = m_b;
  Reg scratch = b.reg("affine: clamp scratch (the f32 tile's room)");
  const Twin at{{m_aff.tile32[0] + clamp_scratch_offset(0),
                 m_aff.tile32[m_aff.buffers - 1] + clamp_scratch_offset(m_aff.buffers - 1)}};
  select(b, scratch, pt, at);
  b.movi(scalar, vector_scalar_bits(t, 0.0));
  b.emit(Opcode::op_vmaxs, {t, scratch, out, scalar, 0, 1, 1, 8, 8}, "max 0 (into the scratch)");
  b.movi(scalar, vector_scalar_bits(t, 6.0));
  b.emit(Opcode::op_vmins, {t, out, scratch, scalar, 0, 1, 1, 8, 8}, "min 6 (back)");
}

void CubePipeline::affine_dense_in_ub(const Store& s, const Reg& pt) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, fmt::format("{} on the tile in the UB (one run): {}", m_aff.what,
                                         m_aff.shift_only ? "y + shift" : "y * a + shift"));
  if (!s.channel0) b.fail("internal: the affine epilogue needs the tile's first channel");
  const int64_t w = m_aff.max_cols;
  Reg n = b.reg("affine: lanes of the tile"), table = b.reg("affine: a (then shift) of the tile"),
      y = b.reg("affine: f32 tile");
  select(b, y, pt, m_aff.tile32);
  b.mul(n, s.rows, w, "rows x width");
  b.emit(Opcode::op_set_mask_count, {n});
  b.mul(table, *s.channel0, kLanes32 * kL0cElemBytes / w);
  b.add(table, table, static_cast<int64_t>(m_aff.a), "a of the tile's channels, replicated");
  if (add_relu_conv(s)) {
    // y * a (into the result tile where there is one), then + shift, ReLU and the rounding
    // into the output tile in one pass.
    Reg out = b.reg("affine: output tile");
    if (!m_aff.shift_only) {
      if (m_aff.result32) {
        b.movi(out, static_cast<int64_t>(m_aff.result32_at));
        b.emit(Opcode::op_vmul, {Dtype::F32, out, y, table, 0, 1, 1, 1, 8, 8, 0}, "y * a");
        b.mov(y, out);
      } else {
        b.emit(Opcode::op_vmul, {Dtype::F32, y, y, table, 0, 1, 1, 1, 8, 8, 0}, "y * a");
      }
    }
    b.add(table, table, static_cast<int64_t>(m_aff.shift) - static_cast<int64_t>(m_aff.a),
          "shift (replicated)");
    select(b, out, pt, add_relu_conv_dst());
    b.emit(Opcode::op_vaddreluconv,
           {Dtype::F16, Dtype::F32, out, y, table, 0, 1, 1, 1, kLanes32 * 2 / layout::kBlockBytes,
            8, 0},
           "+ shift, ReLU, rounded once to f16 (AddReluCast)");
    return;
  }
  if (m_aff.result32) {
    // Out of place (ChannelAffine::result32); y then names where the f32 result is.
    Reg res = b.reg("affine: f32 result tile");
    b.movi(res, static_cast<int64_t>(m_aff.result32_at));
    if (!m_aff.shift_only)
      b.emit(Opcode::op_vmul, {Dtype::F32, res, y, table, 0, 1, 1, 1, 8, 8, 0}, "y * a");
    b.add(table, table, static_cast<int64_t>(m_aff.shift) - static_cast<int64_t>(m_aff.a),
          "shift (replicated)");
    if (m_aff.shift_only) {
      b.emit(Opcode::op_vadd, {Dtype::F32, res, y, table, 0, 1, 1, 1, 8, 8, 0}, "+ shift");
      b.mov(y, res);
    } else {
      b.emit(Opcode::op_vadd, {Dtype::F32, y, res, table, 0, 1, 1, 1, 8, 8, 0}, "+ shift");
    }
  } else {
    if (!m_aff.shift_only)
      b.emit(Opcode::op_vmul, {Dtype::F32, y, y, table, 0, 1, 1, 1, 8, 8, 0}, "y * a");
    b.add(table, table, static_cast<int64_t>(m_aff.shift) - static_cast<int64_t>(m_aff.a),
          "shift (replicated)");
    b.emit(Opcode::op_vadd, {Dtype::F32, y, y, table, 0, 1, 1, 1, 8, 8, 0}, "+ shift");
  }
  if (s.out_type == Dtype::F32 && !m_residual) affine_activation(Dtype::F32, y, 0, 8, n);
  if (m_aff.packed) {
    affine_pack_rows(s, pt, y, table, n);
    return;
  }
  affine_round_run(s, pt, table, y, "rounded once to the output type");
}

void CubePipeline::affine_round_run(const Store& s, const Reg& pt, const Reg& out, const Reg& f32,
                                    const char* what) {
  KernelBuilder& b = m_b;
  select(b, out, pt, m_aff.out);
  if (s.out_type != Dtype::F32)
    b.emit(Opcode::op_vconv,
           {s.out_type, Dtype::F32, out, f32, 0, 1, 1,
            kLanes32 * isa::dtype_size(s.out_type) / layout::kBlockBytes, 8,
            static_cast<int64_t>(RoundMode::kRint)},
           what);
  else
    b.emit(Opcode::op_vcopy, {Dtype::S32, out, f32, 0, 1, 1, 8, 8}, "to the output tile");
}

void CubePipeline::affine_pack_rows(const Store& s, const Reg& pt, const Reg& y, const Reg& at,
                                    const Reg& n) {
  KernelBuilder& b = m_b;
  const int64_t w = m_aff.max_cols, cols = s.pitch;
  if (cols > kLanes32 || cols % kBlockLanes32 != 0 || w % kBlockLanes32 != 0)
    b.fail("internal: packed rows need at most 64 channels in whole f32 blocks");
  // The f32 tile the affine pass left free: tile32 when the result went to the result tile
  // (a in the filter), else the result tile.
  if (m_aff.shift_only)
    select(b, at, pt, m_aff.tile32);
  else
    b.movi(at, static_cast<int64_t>(m_aff.result32_at));
  // One repeat per row: its first `cols` lanes, w lanes apart in y, cols lanes apart packed.
  set_mask_lanes(b, lane_range(0, cols));
  Reg src = b.reg("pack: f32 rows"), dst = b.reg("pack: packed rows");
  for (int64_t r0 = 0; r0 < m_aff.max_rows; r0 += kMaxRepeat) {
    b.if_(ge(s.rows, r0 + 1), [&] {
      b.sub(n, s.rows, r0);
      b.min(n, n, kMaxRepeat, "rows of this instruction");
      b.add(src, y, r0 * w * kL0cElemBytes);
      b.add(dst, at, r0 * cols * kL0cElemBytes);
      b.emit(Opcode::op_vcopy,
             {Dtype::S32, dst, src, n, 1, 1, cols / kBlockLanes32, w / kBlockLanes32},
             "the row's channels, packed");
    });
  }
  b.mul(n, s.rows, cols, "rows x channels");
  b.emit(Opcode::op_set_mask_count, {n});
  affine_round_run(s, pt, src, at, "rounded once to the output type (packed rows, one run)");
}

void CubePipeline::ub_to_gm(const Reg& dst, const Reg* first, const Reg& rows,
                            const Reg& row_blocks, int64_t pitch_blocks) {
  KernelBuilder& b = m_b;
  Reg gap = b.reg("store: GM gap between rows in blocks");
  b.movi(gap, pitch_blocks);
  b.sub(gap, gap, row_blocks, "GM gap between rows in blocks");
  if (!first && !m_affine) {
    b.emit(Opcode::op_copy_ub2gm, {dst, m_ub_tile, rows, row_blocks, 0, gap}, "C tile rows to GM");
    return;
  }
  Reg src = b.reg("store: UB address");
  if (first) {
    b.mul(src, *first, row_blocks);
    b.mul(src, src, layout::kBlockBytes);
  } else {
    b.movi(src, 0);
  }
  if (m_affine) {  // the output tile of the stored tile's parity
    select(b, gap, *m_aff_pt, m_aff.out);
    b.add(src, src, gap);
    b.movi(gap, pitch_blocks);
    b.sub(gap, gap, row_blocks, "GM gap between rows in blocks");
  } else {
    b.add(src, src, static_cast<int64_t>(m_ub_tile), "the first row's UB address");
  }
  b.emit(Opcode::op_copy_ub2gm, {dst, src, rows, row_blocks, 0, gap}, "C rows to GM");
}

void CubePipeline::ub_done() {
  if (m_affine)
    m_b.set_flag(m_aff_free, *m_aff_pt);
  else
    m_b.set_flag(Pipe::MTE3, Pipe::FIX, m_ub_free);
}

bool strided_zeros_fit(const StridedRows& r, int64_t osz, const ChipConfig& cfg) {
  if (r.run_rows <= 0 || !cfg.core_kind(isa::CoreKind::AIV) || cfg.aiv_per_aic <= 0) return false;
  const int64_t block = static_cast<int64_t>(layout::kBlockBytes) / osz;
  const int64_t gap = r.row_pitch - r.cols;
  return r.cols % block == 0 && r.row_pitch % block == 0 && r.run_pitch % block == 0 &&
         r.group_pitch % block == 0 && (r.run_rows - 1) * gap * osz <= kStridedZeroBufferBytes &&
         gap / block <= 65535 && r.cols / block <= 65535 && r.run_rows - 1 <= 65535;
}

bool strided_rows_fit_l0c(const ChipConfig& cfg) {
  const auto it = cfg.align_bytes.find(Buf::L0C);
  const uint64_t align = it == cfg.align_bytes.end() || it->second == 0 ? 1 : it->second;
  return (layout::kFractalRows * layout::kL0cElemBytes) % align == 0;
}

void store_strided_rows(KernelBuilder& b, const StridedRows& sr, Dtype out_type, bool relu,
                        const Reg& dst0, const Reg& l0c, const Reg& r0, const Reg& rows,
                        const Reg& cols) {
  using layout::kFractalRows;
  if (!strided_rows_fit_l0c(b.config()))
    b.fail(fmt::format(
        "chip {}: alignment.l0c = {} bytes: a strided store starts a fixpipe at any row of an "
        "L0C column block, rows {} bytes apart, so alignment.l0c must divide {}",
        b.config().name, b.config().align_bytes.at(Buf::L0C), kFractalRows * kL0cElemBytes,
        kFractalRows * kL0cElemBytes));
  KernelBuilder::Origin o(b, "store: L0C -> strided rows, run by run");
  const int64_t osz = isa::dtype_size(out_type);
  Reg r = b.reg("store: row"), end = b.reg("store: end row"), len = b.reg("store: run rows"),
      dst = b.reg("store: run address"), t = b.reg("store: scratch"),
      blk = b.reg("store: L0C column block bytes");
  b.add(end, r0, rows);
  b.mov(r, r0);
  round16(b, blk, rows);
  b.mul(blk, blk, kFractalRows * kL0cElemBytes, "bytes per 16-column block of the tile");
  Label next = b.label("strided_run");
  b.bind(next);
  {
    // len = min((r / R + 1) * R, end) - r; dst = the element of (run r / R, row r % R)
    b.div(t, r, sr.run_rows, "run");
    b.div(dst, t, sr.runs_per_group);
    b.mul(dst, dst, sr.group_pitch);
    b.rem(t, t, sr.runs_per_group);
    b.mul_add(dst, t, sr.run_pitch, dst, "run's first element");
    b.rem(t, r, sr.run_rows, "row within the run");
    b.mul_add(dst, t, sr.row_pitch, dst);
    b.sub(len, r, t);
    b.add(len, len, sr.run_rows, "the run's end row");
    b.min(len, len, end);
    b.sub(len, len, r, "rows of the run in the tile");
    b.mul(dst, dst, osz);
    b.add(dst, dst, dst0, "run address");
    Reg src = b.reg("store: L0C source"), cb = b.reg("store: column"), n = b.reg("store: columns");
    b.sub(src, r, r0);
    b.mul(src, src, kFractalRows * kL0cElemBytes);
    b.add(src, src, l0c, "the run's first row in column block 0");
    b.for_range(cb, 0, cols, kFractalRows, [&] {
      b.sub(n, cols, cb);
      b.min(n, n, kFractalRows);
      b.emit(Opcode::op_fixpipe,
             {Dtype::F32, out_type, Buf::GM, dst, src, len, n, sr.row_pitch, 1, relu ? 1 : 0, 0},
             "16 columns of a run (ND)");
      b.add(src, src, blk);
      b.add(dst, dst, kFractalRows * osz);
    });
    b.add(r, r, len);
  }
  b.branch(lt(r, end), next);
}

void emit_strided_zeros(KernelBuilder& b, const StridedRows& sr, int64_t osz, int block_dim,
                        const std::string& arg) {
  b.begin_section(b.vector_core_kind());
  KernelBuilder::Origin o(b, "zeros between the strided rows");
  const int64_t rows = sr.run_rows, runs = sr.runs_per_group;
  const int64_t block_elems = static_cast<int64_t>(layout::kBlockBytes) / osz;
  const int64_t gap = sr.row_pitch - sr.cols;  // elements between two rows of a run
  const int64_t run_end = (rows - 1) * sr.row_pitch + sr.cols;
  const int64_t tail = sr.run_pitch - run_end;  // to the next run
  const int64_t last_tail = sr.group_pitch - (runs - 1) * sr.run_pitch - run_end;
  BufferPlan ub(Buf::UB);
  const auto zeros = ub.add_fixed("zeros", static_cast<uint64_t>(kStridedZeroBufferBytes));
  const uint64_t zbuf = ub.allocate(b, 0)[zeros];
  Reg src = b.reg_imm("zeros: UB address", static_cast<int64_t>(zbuf));
  {
    Reg words = b.reg_imm("zeros: 32-bit words", kStridedZeroBufferBytes / 4);
    vec_dup_bits(b, 4, src, 0, words);
  }
  const int ready = b.flag(Pipe::V, Pipe::MTE3, "zeros written");
  b.set_flag(Pipe::V, Pipe::MTE3, ready);
  b.wait_flag(Pipe::V, Pipe::MTE3, ready);
  const int cores = block_dim * b.aiv_per_aic();
  Reg q = b.reg("run"), base = b.reg("run address"), t = b.reg("scratch"), n = b.reg("bursts"),
      len = b.reg("burst blocks"), g = b.reg("burst gap blocks");
  b.emit(Opcode::op_get_block_id, {q});
  b.emit(Opcode::op_get_subblock_id, {t});
  b.mul_add(q, q, static_cast<int64_t>(b.aiv_per_aic()), t, "this vector core");
  b.for_range(q, q, sr.elements / sr.group_pitch * runs, cores, [&] {
    b.div(base, q, runs);
    b.mul(base, base, sr.group_pitch);
    b.rem(t, q, runs);
    b.mul_add(base, t, sr.run_pitch, base, "the run's first element");
    b.mul(base, base, osz);
    Reg c = b.load_arg(arg);
    b.add(base, base, c, "the run's address");
    if (rows > 1 && gap > 0) {
      b.add(c, base, sr.cols * osz, "the first gap");
      b.movi(n, rows - 1);
      b.movi(len, gap / block_elems);
      b.movi(g, sr.cols / block_elems);
      b.emit(Opcode::op_copy_ub2gm, {c, src, n, len, 0, g}, "the gaps between the rows");
    }
    // From the last row's end: `tail` elements, or `last_tail` after a group's last run.
    b.rem(t, q, runs);
    b.movi(len, tail);
    b.if_(eq(t, runs - 1), [&] { b.movi(len, last_tail); });
    b.add(c, base, run_end * osz, "after the run's last row");
    b.movi(n, 1);
    Label more = b.label("zero_span");
    Label done = b.label("zero_span_done");
    b.bind(more);
    b.branch(lt(len, 1), done);
    b.min(t, len, kStridedZeroBufferBytes / osz);
    b.sub(len, len, t);
    b.mul(t, t, osz);
    b.add(g, c, t, "the next piece");
    b.shr(t, t, 5, "32-byte blocks");
    b.emit(Opcode::op_copy_ub2gm, {c, src, n, t, 0, 0}, "zeros after the run");
    b.mov(c, g);
    b.jmp(more);
    b.bind(done);
  });
  b.end();
}

}  // namespace npusim::compiler::ops
