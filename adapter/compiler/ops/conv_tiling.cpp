// The cube convolution's tiling (ops/conv.h, CubeConvTiling): every tiling that fits the cube
// core, each with a modelled cost for the busiest core, and the choice among them.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/conv_slab.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "common/int_math.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Pipe;

namespace {

constexpr int64_t kRepeatBytes = 256;  // one vector repeat (a masked one reads all of it)

// The chip's rates (bytes per cycle) and latencies (cycles) the cost model reads.
struct ConvRates {
  double gm_rate, l2_rate, l0a_rate, l0b_rate, fix_rate, l1_lat, cube_lat, gm_lat;
  // Resident weights' later chunks load in their step's load stage (chips with FIXPIPE to GM:
  // ConvEmitter::chunks_ahead), else in the compute stage, behind the next step's slab.
  bool weights_ahead = false;
  // Vector cycles per output element of the batch norm in the epilogue (bn_affine): its
  // passes over the f32 tile (multiply, add, the rounding or packing copy into the output
  // tile) and the activation's and the residual's over the output tile, 0 without. A pass
  // that reads and writes the same UB banks (in place) takes two bank accesses per block:
  // twice the cycles (docs/chip_model.md's bank model). affine_per_elem_result32: the same
  // with the f32 result tile (CubePipeline::ChannelAffine::result32: the f32 passes out of
  // place), where a tiling leaves the UB room for it.
  double affine_per_elem = 0, affine_per_elem_result32 = 0;
  uint64_t ub_bank_span = 0;  // UB banks x bank width (bytes), 0 without a bank model
  // The batch norm's way out through the UB as stages (chips without an l0c->gm path,
  // CubePipeline::to_ub): FIXPIPE's f32 tile into the UB (l0c_ub_rate), the vector passes,
  // MTE3's store (ub_gm_rate) and the store's landing (the path's latency and the write's
  // memory latency, which the store's set_flag waits for before the tile's UB buffers are free
  // again; MTE3 itself waits for it where the set_flag holds the pipe, store_holds): a store
  // with a byte that misses the L2 lands at HBM's latency (store_miss_latency), one whose lines
  // are all present at the L2's (store_hit_latency; sim/chip/memory_system.cpp: one latency
  // per transfer). Off (false) on chips with FIXPIPE to GM.
  bool way_stages = false, store_holds = false;
  double l0c_ub_rate = 0, ub_gm_rate = 0, store_miss_latency = 0, store_hit_latency = 0;
};

ConvRates conv_rates(const ChipConfig& cfg, const CoreKindConfig& core) {
  ConvRates r;
  r.gm_rate = cfg.path_rate(Buf::GM, Buf::L1);
  // Data read again (a slab once per n tile, streamed weights once per stack of images) comes
  // from L2 after its first read: at the core's L2 read port or its share of L2's bandwidth
  // (docs/chip_model.md), not slower than the GM path.
  r.l2_rate = cube_l2_read_rate(cfg, core);
  r.l0a_rate = cfg.path_rate(Buf::L1, Buf::L0A);
  r.l0b_rate = cfg.path_rate(Buf::L1, Buf::L0B);
  r.fix_rate = cube_store_rate(cfg);
  r.l1_lat = cfg.path_latency(Buf::L1, Buf::L0A);
  r.cube_lat = cfg.cube_latency_cycles;
  // A GM read's latency: the path's start latency and an L2 miss (cold data).
  r.gm_lat = cfg.path_latency(Buf::GM, Buf::L1) + cfg.hbm_latency_cycles;
  r.weights_ahead = cfg.has_path(Buf::L0C, Buf::GM);
  return r;
}

ConvRates conv_rates(const ChipConfig& cfg, const CoreKindConfig& core, const CubeConvSpec& s) {
  ConvRates r = conv_rates(cfg, core);
  if (s.bn_affine) {
    const bool narrow = s.out_type != isa::Dtype::F32;
    // Passes over the output tile, in bank accesses per element byte: ReLU6 on a narrower
    // output goes out of place (two passes), ReLU in place (one pass, two accesses), the
    // residual add in place.
    const int act = s.act == Activation::kRelu6 ? 2 : s.act == Activation::kRelu ? 2 : 0;
    const double out_passes = narrow ? act + (s.residual ? 2 : 0) : 0;
    // f32 passes: the multiply (unless a is in the filter), the add, each in place or not,
    // then the rounding (or packing copy) into the output tile; an f32 output's activation
    // runs in place on the f32 result.
    const int f32_passes = s.bn_a_in_filter ? 1 : 2;
    const double f32_tail = 1 + (narrow ? 0 : act);
    auto per_elem = [&](double f32_pass_accesses) {
      return (static_cast<double>(f32_passes) * f32_pass_accesses + f32_tail) * kL0cElemBytes /
                 cfg.vector_bytes_per_cycle +
             out_passes * isa::dtype_size(s.out_type) / cfg.vector_bytes_per_cycle;
    };
    r.affine_per_elem = per_elem(2);
    r.affine_per_elem_result32 = per_elem(1);
    r.ub_bank_span = static_cast<uint64_t>(std::max(0, cfg.ub_banks)) *
                     static_cast<uint64_t>(std::max(0, cfg.ub_bank_width_bytes));
    if (!cfg.has_path(Buf::L0C, Buf::GM) && cfg.has_path(Buf::L0C, Buf::UB) &&
        cfg.has_path(Buf::UB, Buf::GM)) {
      r.way_stages = true;
      r.store_holds = cfg.set_flag_holds_pipe;
      r.l0c_ub_rate = cfg.path_rate(Buf::L0C, Buf::UB);
      r.ub_gm_rate = cfg.path_rate(Buf::UB, Buf::GM);
      // A write-through L2 sends a store's missing lines to HBM; a write-back one takes them.
      r.store_hit_latency = cfg.path_latency(Buf::UB, Buf::GM) + cfg.l2_latency_cycles;
      r.store_miss_latency = cfg.l2_write_back
                                 ? r.store_hit_latency
                                 : cfg.path_latency(Buf::UB, Buf::GM) + cfg.hbm_latency_cycles;
    }
  }
  return r;
}

// Output tile widths: powers of two from 16 to 256 and, for each count of n tiles per group,
// the balanced width (512 channels -> 3 tiles of 176, 176, 160: the cores' work comes in finer
// steps).
std::vector<int64_t> tile_widths(const CubeConvSpec& s, const std::string& op) {
  std::vector<int64_t> tns;
  if (s.b_diagonal) {  // one n tile per group: every column block in the tile
    if (round_up(s.cg_out, kBlk) > kMaxTile)
      throw CompileError(
          fmt::format("{}: {} output channels per block-diagonal group exceed one "
                      "{}-wide tile",
                      op, s.cg_out, kMaxTile));
    tns.push_back(round_up(s.cg_out, kBlk));
    return tns;
  }
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
      if (tn <= kMaxTile && std::find(tns.begin(), tns.end(), tn) == tns.end()) tns.push_back(tn);
    }
  }
  if (tns.empty())
    throw CompileError(fmt::format("{}: {} output channels per group exceed one {}-wide tile", op,
                                   s.cg_out, kMaxTile));
  return tns;
}

// Stackings: `stack` if given (> 0), else one image per map and (without zero insertion) every
// count of images whose tall map fits one m tile (at most kMaxTile output positions).
std::vector<int64_t> stack_counts(const CubeConvSpec& s, const std::string& op, int64_t stack) {
  const bool zero_insertion = s.up_h > 1 || s.up_w > 1 || s.ext_h > 0 || s.ext_w > 0;
  if (s.x_row != 0 && (zero_insertion || stack > 1))
    throw CompileError(
        fmt::format("{}: a strided view of x takes no zero insertion or stacking", op));
  if (s.residual && stack > 1)  // the residual's rows are loaded as one run per tile
    throw CompileError(fmt::format("{}: a residual epilogue takes no stacking", op));
  const bool strided_y = s.y_strided.run_rows > 0;  // stored run by run, one image per map
  if (strided_y && stack > 1)
    throw CompileError(fmt::format("{}: a strided y takes no stacking", op));
  std::vector<int64_t> counts;
  if (stack > 0) {
    if (stack > 1 && (zero_insertion || stack > s.images))
      throw CompileError(fmt::format("{}: cannot stack {} images ({} images{})", op, stack,
                                     s.images, zero_insertion ? ", zero insertion" : ""));
    counts.push_back(stack);
    return counts;
  }
  counts.push_back(1);
  for (int64_t st = 2;
       !zero_insertion && s.x_row == 0 && !s.residual && !strided_y && st <= s.images; ++st) {
    if (stack_geom(s, st).tall_oh * s.ow() > kMaxTile) break;
    counts.push_back(st);
  }
  return counts;
}

// Output tile heights for `positions` per (tall) map: every multiple of 16 up to max_tm, and the
// balanced height for each count of tiles per map (784 positions -> 7 tiles of 112 rather than 6
// of 128 and one of 16).
std::set<int64_t> tile_heights(int64_t positions, int64_t max_tm) {
  std::set<int64_t> tms;
  for (int64_t tm = kBlk; tm <= max_tm; tm += kBlk) {
    tms.insert(std::min(tm, round_up(positions, kBlk)));
    tms.insert(round_up(ceil_div(positions, ceil_div(positions, tm)), kBlk));
  }
  return tms;
}

// A candidate tiling as the cost model sees it (t: the fields plan_cube_conv fills; mts: its m
// tiles; kchunk: k per chunk; wv, taps of the spec).
struct Candidate {
  CubeConvTiling t;
  std::vector<SlabGeom> mts;
  int64_t kchunk = 0, wv = 0, taps = 0, osz = 0;
  bool stack_gap = false;  // a stack's images are more than hv rows apart (gap rows)
  int64_t b_block = 0;     // block-diagonal B: a diagonal block's columns (else 0)
  // Every tile's store writes lines no other tile writes (y_whole_rows, hbm_time): each store
  // misses the L2. Else a block's first store misses (the cores start on lines nobody wrote)
  // and the later ones land in lines the other tiles of their rows have allocated.
  bool y_whole_rows = true;
  double affine_per_elem = 0;  // the epilogue's vector cycles per element for this tiling
  // A dense slab (SlabEmitter: one image a map, no zero insertion or strided view), loaded as
  // t.whole_pixels says (dense_slab_load); the map's channels and element bytes.
  bool dense_slab = false;
  int64_t cs = 0, isz = 2;
  // B's rows in GM (CubeConvSpec::b_mode, b_row): a k-block's nd2nz reads 16 rows of its
  // columns (input channels as rows: kRowsK, block-diagonal) or n_act rows of 16 channels.
  bool b_rows_k = true;
  int64_t b_pitch_bytes = 0;
  bool b_n16 = false;  // a filter in blocks of 16 output channels (CubeConvSpec::b_nblock)
  // A strided view of x (one image a map) whose slab can go per pixel
  // (SlabEmitter::strided_blocks) and whose issue the planner prices
  // (conv_strided_slab_switch not "0"): the view's form as before (per plane and column or per
  // plane and row, SlabEmitter::load_slab), x's pixels and rows apart in bytes.
  bool strided_priced = false;
  StridedSlabForm strided_before = StridedSlabForm::kPlaneRows;
  int64_t x_pixel_bytes = 0, x_row_bytes = 0;
  // The columns of B one k-block of n_act output columns reaches (loaded, multiplied).
  int64_t b_cols(int64_t n_act) const { return b_block ? b_block : round_up(n_act, kBlk); }
  // The mmad steps of a chunk: a block-diagonal chunk's channel blocks each in their own.
  int64_t mmad_steps() const {
    return b_block ? t.kc1 * ceil_div(taps * kBlk, t.tk0) : ceil_div(kchunk, t.tk0);
  }
  int64_t cg_in = 0;  // input channels per group (B's k rows per tap)
  // The DMA's issue minimum of a chunk of B of n_act columns (copy_issue_estimate): its kc1 x
  // taps nd2nz, or by tap (kRowsN, CubeConvTiling::weights_by_tap) its taps nd2nz of n_act
  // rows of the chunk's channels.
  double weight_issue(const ChipConfig& cfg, int64_t n_act, bool by_tap) const {
    if (b_n16 && !b_rows_k)  // per k-block one run of its n_act rows of 16 channels
      return static_cast<double>(std::min(t.kc1, ceil_div(cg_in, kBlk)) * taps) *
             copy_issue_estimate(cfg, 1, n_act * kBlk * isz, n_act * kBlk * isz);
    if (b_n16) {  // per column block and tap one run of the chunk's kc1 fractals
      const int64_t run = std::min(t.kc1 * kBlk, cg_in) * kBlk * isz;
      return static_cast<double>(ceil_div(n_act, kBlk) * taps) *
             copy_issue_estimate(cfg, 1, run, run);
    }
    if (by_tap)
      return static_cast<double>(taps) *
             copy_issue_estimate(cfg, n_act, std::min(t.kc1 * kBlk, cg_in) * isz, b_pitch_bytes);
    const double issue =
        b_rows_k ? copy_issue_estimate(cfg, kBlk, (b_block ? b_block : n_act) * isz, b_pitch_bytes)
                 : copy_issue_estimate(cfg, n_act, kBlk * isz, b_pitch_bytes);
    return static_cast<double>(t.kc1 * taps) * issue;
  }
  // MTE2's cycles for a chunk of B of n_act columns: its bytes at `rate`, or the DMA's issue
  // minimum where that is more.
  double weight_load(const ChipConfig& cfg, double rate, int64_t n_act) const {
    const double flow = static_cast<double>(kchunk * b_cols(n_act) * 2) / rate;
    return std::max(flow, weight_issue(cfg, n_act, t.weights_by_tap));
  }
};

// Cost of one tile (cycles, see docs/compiler.md): the slowest of cube (+ FIXPIPE with one L0C
// buffer), MTE2 (slab + streamed weights, or resident weights arriving chunk by chunk during the
// first tile of a (group, n tile): `first`), MTE1, FIXPIPE. Per step (one chunk of one tile):
// the period of the kernel's pipeline (conv_step_period) over cube, MTE2 (the chunk's slab and
// weights, plus the GM latency), MTE1 and the scalar unit (~60 instructions per mmad step and
// ~200 per step, one cycle each, ~18 to 20 per plane and image of a stacked slab and ~15 per
// k-block of weights loaded); FIXPIPE once per tile, hidden behind the next tile's steps with two
// L0C buffers (a staged way out with two: staged_block). A tile's way out (cycles), by stage:
// FIXPIPE (with a store through the UB, as one rate, where the way out is not staged:
// ConvRates::way_stages), the epilogue's vector passes, MTE3's store and its landing.
struct WayOut {
  double fix = 0, vec = 0, store = 0, latency = 0;
  double chain() const { return fix + vec + store + latency; }  // one tile alone, in sequence
};

WayOut tile_way_out(const ConvRates& r, const Candidate& c, const SlabGeom& g, int64_t n_act,
                    bool store_misses = true) {
  WayOut w;
  w.vec =
      static_cast<double>(g.m_act * round_up(n_act, kBlkBytes / kL0cElemBytes)) * c.affine_per_elem;
  if (!r.way_stages) {
    w.fix = static_cast<double>(g.m_act * n_act * c.osz) / r.fix_rate;
    return w;
  }
  // FIXPIPE moves the f32 tile in rows of whole blocks; MTE3 the output rows in whole blocks.
  w.fix =
      static_cast<double>(g.m_act * round_up(n_act, kBlkBytes / kL0cElemBytes) * kL0cElemBytes) /
      r.l0c_ub_rate;
  w.store =
      static_cast<double>(g.m_act * round_up(n_act, kBlkBytes / c.osz) * c.osz) / r.ub_gm_rate;
  w.latency = store_misses ? r.store_miss_latency : r.store_hit_latency;
  return w;
}

// A tile's way out in sequence (cycles): what the block's last tile adds after its last step,
// and what each tile adds with one L0C buffer.
double tile_store(const ConvRates& r, const Candidate& c, const SlabGeom& g, int64_t n_act) {
  return tile_way_out(r, c, g, n_act).chain();
}

// One step's stages (cycles): MTE2's load (slab and weights, with the GM latency), MTE1's
// moves into L0A / L0B, the cube's mmads and the scalar unit's issue; `period`, what a step
// costs in the double-buffered pipeline (conv_step_period).
struct StepStages {
  double load = 0, mte1 = 0, cube = 0, scalar = 0, period = 0;
};

}  // namespace

double stacked_slab_scalar_per_image(int64_t stack, bool gap_rows) {
  return static_cast<double>(17 + (gap_rows ? 19 : 18) * (stack - 1) + 6) /
         static_cast<double>(stack);
}

double conv_step_period(const ChipConfig& cfg, const ConvStepProgram& p) {
  enum { kMte2, kMte1, kCube, kPipes };
  constexpr int kSteps = 8, kMeasured = 4;
  const int64_t depth = std::max(1, cfg.issue_queue_depth);
  // Per pipe: when its last instruction ends, and the instructions issued to it so far as
  // groups (an mmad step's wait, moves and set: one group), each with its count of
  // instructions up to and including it and its start; the scalar unit issues instruction i
  // once instruction i - depth has started (left the queue).
  struct Group {
    int64_t through = 0;
    double start = 0;
  };
  double pipe_free[kPipes] = {0, 0, 0};
  std::vector<Group> groups[kPipes];
  size_t oldest_queued[kPipes] = {0, 0, 0};
  double scalar = 0, landed = 0;
  // Flags by parity, when set: every buffer starts free.
  double l1_free[2] = {0, 0}, l1_full[2] = {0, 0}, l0_free[2] = {0, 0}, l0_full[2] = {0, 0};
  double weights_full = 0;
  // A group of `insns` instructions on `pipe`, issued after `cycles` of scalar work (and one a
  // pipe instruction), started when its pipe and the flag it waits for (ready) allow, taking
  // `duration`; returns its start.
  auto issue = [&](int pipe, double cycles, double ready, double duration, int64_t insns = 1) {
    std::vector<Group>& g = groups[pipe];
    const int64_t through = (g.empty() ? 0 : g.back().through) + insns;
    size_t& k = oldest_queued[pipe];  // the group holding instruction through - depth
    while (k < g.size() && g[k].through < through - depth) ++k;
    const double room = k < g.size() && through - depth > 0 ? g[k].start : 0.0;
    scalar = std::max(scalar + cycles, room) + static_cast<double>(insns);
    const double start = std::max({scalar, pipe_free[pipe], ready});
    g.push_back({through, start});
    pipe_free[pipe] = start + duration;
    return start;
  };
  auto transfer = [&](double cycles, double flow, int64_t insns = 1) {
    issue(kMte2, cycles, 0, flow, insns);
    landed = std::max(landed, pipe_free[kMte2] + p.latency);
  };
  // MTE2's set_flag: the flag's time.
  auto set_landed = [&]() {
    const double start = issue(kMte2, 0, 0, 0);
    const double at = std::max(start, landed);
    if (cfg.set_flag_holds_pipe) pipe_free[kMte2] = at;
    return at;
  };
  auto weights = [&](double& flag) {
    for (int64_t i = 0; i < p.weight_insns; ++i)
      transfer(p.scalar_weight_block, p.weight_flow / static_cast<double>(p.weight_insns));
    flag = set_landed();
  };
  const int64_t mmad_steps = std::max<int64_t>(p.mmad_steps, 1);
  const double mte1_step = p.mte1 / static_cast<double>(mmad_steps),
               cube_step = p.cube / static_cast<double>(mmad_steps);
  std::vector<double> mmads_done;
  int64_t l0_steps = 0;
  for (int t = 0; t <= kSteps; ++t) {
    if (t < kSteps) {  // load(t)
      const int q = t & 1;
      issue(kMte2, p.scalar_step / 2, l1_free[q], 0);
      const double slab_insn_flow =
          p.slab_flow / static_cast<double>(std::max<int64_t>(p.slab_insns, 1));
      for (int64_t i = 0; i < p.slab_insns; i += p.slab_batch) {
        const int64_t n = std::min(p.slab_batch, p.slab_insns - i);
        transfer(p.scalar_plane * static_cast<double>(n), slab_insn_flow * static_cast<double>(n),
                 n);
      }
      double unused = 0;
      if (p.weight_insns > 0 && p.weights_in_load) weights(unused);
      l1_full[q] = set_landed();
    }
    if (t > 0) {  // compute(t - 1)
      const int q = (t - 1) & 1;
      if (p.weight_insns > 0 && !p.weights_in_load) weights(weights_full);
      issue(kMte1, p.scalar_step / 2, std::max(l1_full[q], p.weights_in_load ? 0 : weights_full),
            0);
      for (int64_t j = 0; j < mmad_steps; ++j, ++l0_steps) {
        const int lq = static_cast<int>(l0_steps & 1);
        issue(kMte1, p.scalar_mmad_step * 2 / 3, l0_free[lq], mte1_step, 4);
        l0_full[lq] = pipe_free[kMte1];
        issue(kCube, p.scalar_mmad_step / 3, l0_full[lq], cube_step, 3);
        l0_free[lq] = pipe_free[kCube];
      }
      l1_free[q] = issue(kMte1, 0, 0, 0);
      mmads_done.push_back(pipe_free[kCube]);
    }
  }
  return (mmads_done[kSteps - 1] - mmads_done[kSteps - 1 - kMeasured]) / kMeasured;
}

namespace {

// conv_step_period, remembered per thread: the planner prices every tile of every block of every
// candidate, and a compile's tiles share few distinct programs (a walk of eight steps each, up to
// hundreds of instructions: without this a ResNet-50 convolution's plan took ~0.5 s). The key
// is every input the period depends on: the program and the chip's queue depth and set_flag
// rule. The table is emptied when it grows past kMaxRemembered entries.
double remembered_step_period(const ChipConfig& cfg, const ConvStepProgram& p) {
  using Key = std::array<double, 16>;
  constexpr size_t kMaxRemembered = 1 << 16;
  thread_local std::map<Key, double> periods;
  const Key key = {static_cast<double>(p.slab_insns),
                   static_cast<double>(p.slab_batch),
                   static_cast<double>(p.weight_insns),
                   static_cast<double>(p.mmad_steps),
                   p.slab_flow,
                   p.weight_flow,
                   p.latency,
                   p.mte1,
                   p.cube,
                   p.weights_in_load ? 1.0 : 0.0,
                   p.scalar_step,
                   p.scalar_plane,
                   p.scalar_weight_block,
                   p.scalar_mmad_step,
                   static_cast<double>(cfg.issue_queue_depth),
                   cfg.set_flag_holds_pipe ? 1.0 : 0.0};
  const auto it = periods.find(key);
  if (it != periods.end()) return it->second;
  if (periods.size() >= kMaxRemembered) periods.clear();
  const double period = conv_step_period(cfg, p);
  periods.emplace(key, period);
  return period;
}

StepStages step_stages(const ChipConfig& cfg, const ConvRates& r, const Candidate& c,
                       const SlabGeom& g, int64_t n_act, bool first) {
  const CubeConvTiling& t = c.t;
  const int64_t steps_mmad = c.mmad_steps(), st = t.stack, kc1 = t.kc1;
  const double n16 = static_cast<double>(ceil_div(c.b_block ? c.b_block : n_act, cfg.cube_n));
  const bool loads_weights = !t.resident || first;
  StepStages s;
  s.cube = static_cast<double>(steps_mmad) * r.cube_lat +
           static_cast<double>(ceil_div(g.m_act, cfg.cube_m)) * n16 *
               static_cast<double>(c.kchunk / cfg.cube_k);
  double slab_flow = static_cast<double>(kc1 * g.h * c.wv * kBlkBytes) / r.l2_rate;
  int64_t slab_insns = kc1 * st + (st > 1 ? 1 : 0);  // an nd2nz per plane (and image), the zeroing
  if (st > 1) {
    // A stacked slab: an nd2nz per plane and image, a 32-byte run per pixel of the slab's rows
    // (gap rows counted too: # estimate, they are zeroed, not read), at least the DMA's issue.
    slab_flow =
        std::max(slab_flow, static_cast<double>(kc1) *
                                (copy_issue_estimate(cfg, g.h * c.wv, kBlkBytes, c.cs * c.isz) +
                                 static_cast<double>(st - 1) * cfg.copy_issue_cycles));
  } else if (c.dense_slab) {
    const SlabLoad l =
        dense_slab_load(cfg, t.whole_pixels ? PixelLoads::kWholePixels : PixelLoads::kPerPlane,
                        g.h * c.wv, kc1, c.cs, c.isz, r.l2_rate, r.gm_rate);
    slab_flow = l.cycles;
    slab_insns = l.insns;
  } else if (c.strided_priced) {
    // A strided view: per pixel a copy of one run of the chunk's planes, its data at the GM
    // path's rate (each run's lines misses, as whole pixels in dense_slab_load); as before
    // its data at the L2's rate. Either at least its DMA's issue (0 without the keys).
    const StridedSlabForm form = t.strided_pixels ? StridedSlabForm::kPerPixel : c.strided_before;
    const double issue =
        strided_slab_issue(cfg, form, g.h, c.wv, kc1, c.x_pixel_bytes, c.x_row_bytes);
    if (t.strided_pixels) {
      slab_flow = static_cast<double>(kc1 * g.h * c.wv * kBlkBytes) / r.gm_rate;
      slab_insns = g.h * c.wv;
    }
    slab_flow = std::max(slab_flow, issue);
  }
  // The per-pixel copies in at most kPixelCopyGroups groups (conv_step_period walks each
  // group, not each copy: the planner's time), ~4 scalar cycles a copy (its loop's two
  // address additions, count and branch; # estimate).
  constexpr int64_t kPixelCopyGroups = 16;
  const int64_t slab_batch = t.strided_pixels ? ceil_div(slab_insns, kPixelCopyGroups) : 1;
  const double weight_flow = loads_weights ? c.weight_load(cfg, r.l2_rate, n_act) : 0.0;
  s.load = slab_flow + weight_flow + r.gm_lat;
  // (A load3d and a load2d an mmad step; by tap a load2d per k-block.)
  const bool b_by_tap = t.weights_by_tap && c.taps > 1;
  const int64_t b_loads = b_by_tap ? kc1 * c.taps : steps_mmad;
  s.mte1 = static_cast<double>(round_up(g.m_act, kBlk) * c.kchunk * 2) / r.l0a_rate +
           static_cast<double>(c.kchunk * c.b_cols(n_act) * 2) / r.l0b_rate +
           static_cast<double>(steps_mmad + b_loads) * r.l1_lat;
  // Scalar cycles: ~200 a step, ~60 an mmad step, ~18 to 20 per plane and image of a stacked
  // slab (stacked_slab_scalar_per_image), ~15 per k-block of weights loaded.
  ConvStepProgram prog;
  prog.slab_insns = slab_insns;
  prog.slab_batch = slab_batch;
  prog.slab_flow = slab_flow;
  // an nd2nz per k-block, by tap one per tap
  prog.weight_insns = loads_weights ? (t.weights_by_tap ? c.taps : kc1 * c.taps) : 0;
  prog.weight_flow = weight_flow;
  prog.latency = r.gm_lat;
  prog.weights_in_load = !t.resident || r.weights_ahead;
  prog.mmad_steps = std::max<int64_t>(steps_mmad, 1);
  prog.mte1 = s.mte1;
  prog.cube = s.cube;
  prog.scalar_step = 200.0;
  prog.scalar_plane = st > 1             ? stacked_slab_scalar_per_image(st, c.stack_gap)
                      : t.strided_pixels ? 4.0
                                         : 0.0;
  prog.scalar_weight_block = 15.0;
  // By tap: ~10 more per k-block's L0B load (load_b_by_tap). # estimate: its loop's count
  prog.scalar_mmad_step =
      60.0 + (b_by_tap ? 10.0 * static_cast<double>(kc1 * c.taps) /
                             static_cast<double>(std::max<int64_t>(steps_mmad, 1))
                       : 0.0);
  s.scalar = prog.scalar_step + prog.scalar_mmad_step * static_cast<double>(steps_mmad) +
             prog.scalar_plane * static_cast<double>(kc1 * st) +
             prog.scalar_weight_block * static_cast<double>(prog.weight_insns);
  s.period = remembered_step_period(cfg, prog);
  return s;
}

double tile_cost(const ChipConfig& cfg, const ConvRates& r, const Candidate& c, const SlabGeom& g,
                 int64_t n_act, bool first) {
  const double step = step_stages(cfg, r, c, g, n_act, first).period;
  const double fix = tile_store(r, c, g, n_act);
  const CubeConvTiling& t = c.t;
  return static_cast<double>(t.chunks) * step + (t.l0c_buffers == 1 ? fix : 0) +
         std::max(0.0, fix - static_cast<double>(t.chunks) * step);
}

// The pipeline's fill at a block's start (cycles): its first step's mmads (MTE1's moves and
// the cube, which overlap each other) wait for the step's whole slab, so the first step costs
// load + compute where the steps after it cost the slower of the two (busiest_block counts the
// slower once per step): the lesser of the two is added. A block of one step (one tile of one
// chunk) thus runs its stages one after the other; splitting k or n shortens the fill to one
// smaller step's. Resident weights' first chunk is counted apart (busiest_block), so the load
// here is the slab's (with a streamed chunk of weights).
double pipeline_fill(const ChipConfig& cfg, const ConvRates& r, const Candidate& c,
                     const SlabGeom& g, int64_t n_act) {
  const StepStages s = step_stages(cfg, r, c, g, n_act, false);
  return std::min(s.load, std::max(s.mte1, s.cube));
}

// A block's cycles with a staged way out and two L0C (and UB tile) buffers
// (ConvRates::way_stages), tile by tile as the kernel's flags order them (ConvEmitter,
// CubePipeline::to_ub): tile j of the block uses buffers j & 1; its steps start when the cube
// is done with the previous tile and its L0C buffer is free (FIXPIPE done with tile j - 2),
// taking `steps(j)`; FIXPIPE moves it into the UB when the steps are done, FIXPIPE is done with
// tile j - 1 and the UB buffers are free (tile j - 2 stored and landed); then the vector passes
// (in order), then MTE3's store (in order, after the previous store, or its landing where the
// set_flag holds MTE3). The block ends when its last store has landed. start: the block's
// cycles before its first step; tile(j): (m tile geometry, active columns); steps(j): the
// tile's steps' cycles (tile_cost's, without its way out).
template <typename TileOf, typename StepsOf>
double staged_block(const ConvRates& r, const Candidate& c, int64_t lo, int64_t hi, double start,
                    const TileOf& tile, const StepsOf& steps) {
  double cube_end = start, fix_end = start, vec_end = start, mte3_free = start, land = start;
  double fix_done[2] = {start, start}, landed[2] = {start, start};
  for (int64_t j = lo; j < hi; ++j) {
    const int q = static_cast<int>((j - lo) & 1);
    const auto [g, n_act] = tile(j);
    const WayOut w = tile_way_out(r, c, *g, n_act, j == lo || c.y_whole_rows);
    cube_end = std::max(cube_end, fix_done[q]) + steps(j);
    fix_end = std::max({cube_end, fix_end, landed[q]}) + w.fix;
    fix_done[q] = fix_end;
    vec_end = std::max(fix_end, vec_end) + w.vec;
    const double store_end = std::max(vec_end, mte3_free) + w.store;
    land = store_end + w.latency;
    landed[q] = land;
    mte3_free = r.store_holds ? land : store_end;
  }
  return std::max(cube_end, land);
}

// A candidate's figures per m tile (cycles), for its full n tiles (tn wide) and its last
// (n_last): tile_cost and the steps' cycles (t.chunks times the step's period) of a tile that
// loads no weights, tile_cost of one that does (a key's first) and the pipeline's fill. Of an m
// tile the cost model (tile_cost, step_stages, tile_way_out) reads its rows h and active rows m_act
// only, and most of an image's m tiles have the same two (a map's first and last differ), so each
// such geometry is priced once, by the same calls: every figure is the one pricing each m tile
// gives. The busiest block's walk asks them for every m tile of every candidate, and a candidate
// per tile (thousands of steps' periods per compile before).
struct MTileCosts {
  std::vector<double> tile_full, tile_last, steps_full, steps_last, first_full, first_last,
      fill_full, fill_last;
  int64_t tn = 0;
  MTileCosts(const ChipConfig& cfg, const ConvRates& r, const Candidate& c, int64_t n_last)
      : tn(c.t.tn) {
    std::map<std::pair<int64_t, int64_t>, size_t> priced;  // (h, m_act) -> its first m tile
    for (size_t i = 0; i < c.mts.size(); ++i) {
      const SlabGeom& g = c.mts[i];
      const auto [it, added] = priced.emplace(std::pair{g.h, g.m_act}, i);
      if (!added) {
        const size_t k = it->second;
        tile_full.push_back(tile_full[k]);
        tile_last.push_back(tile_last[k]);
        steps_full.push_back(steps_full[k]);
        steps_last.push_back(steps_last[k]);
        first_full.push_back(first_full[k]);
        first_last.push_back(first_last[k]);
        fill_full.push_back(fill_full[k]);
        fill_last.push_back(fill_last[k]);
        continue;
      }
      tile_full.push_back(tile_cost(cfg, r, c, g, tn, false));
      tile_last.push_back(tile_cost(cfg, r, c, g, n_last, false));
      steps_full.push_back(static_cast<double>(c.t.chunks) *
                           step_stages(cfg, r, c, g, tn, false).period);
      steps_last.push_back(static_cast<double>(c.t.chunks) *
                           step_stages(cfg, r, c, g, n_last, false).period);
      first_full.push_back(tile_cost(cfg, r, c, g, tn, true));
      first_last.push_back(tile_cost(cfg, r, c, g, n_last, true));
      fill_full.push_back(pipeline_fill(cfg, r, c, g, tn));
      fill_last.push_back(pipeline_fill(cfg, r, c, g, n_last));
    }
  }
  // m tile mt's figures for a tile of n_act columns (tn or n_last)
  double tile(int64_t mt, int64_t n_act) const {
    return (n_act == tn ? tile_full : tile_last)[static_cast<size_t>(mt)];
  }
  double steps(int64_t mt, int64_t n_act) const {
    return (n_act == tn ? steps_full : steps_last)[static_cast<size_t>(mt)];
  }
  double first(int64_t mt, int64_t n_act) const {
    return (n_act == tn ? first_full : first_last)[static_cast<size_t>(mt)];
  }
  double fill(int64_t mt, int64_t n_act) const {
    return (n_act == tn ? fill_full : fill_last)[static_cast<size_t>(mt)];
  }
};

// The busiest block's modelled cycles, exactly: tile t has m tile t % MT and weight key
// t / (MT * stacks); within one key the costs repeat with period MT (prefix sums), and the first
// tile of each key in a block also loads the weights.
// busiest_block for the position-major order (weights streamed): tile t has weight key
// t % keys and m tile (t / keys) % MT. Tile by tile (at most a few thousand).
double busiest_block_spatial(const ChipConfig& cfg, const ConvRates& r, const Candidate& c,
                             int64_t cg_out) {
  const CubeConvTiling& t = c.t;
  const int64_t tn = t.tn, n_last = cg_out - (t.n_tiles - 1) * tn, per = t.tiles_per_block;
  auto n_act_of = [&](int64_t i) {
    return (i % t.keys) % t.n_tiles == t.n_tiles - 1 ? n_last : tn;
  };
  auto mt_of = [&](int64_t i) { return (i / t.keys) % t.m_tiles; };
  auto geom_of = [&](int64_t i) -> const SlabGeom& { return c.mts[static_cast<size_t>(mt_of(i))]; };
  const MTileCosts costs(cfg, r, c, n_last);
  double worst = 0;
  for (int64_t b = 0; b < t.block_dim; ++b) {
    const int64_t lo = b * per, hi = std::min(t.tiles, (b + 1) * per);
    double cost = 0;
    for (int64_t i = lo; i < hi; ++i) cost += costs.tile(mt_of(i), n_act_of(i));
    if (c.affine_per_elem > 0 && t.l0c_buffers > 1 && hi > lo)
      cost += tile_store(r, c, geom_of(hi - 1), n_act_of(hi - 1));  // as busiest_block
    // The block's start, before its first step: the pipeline's fill and the cold first step.
    const double fill = hi > lo ? costs.fill(mt_of(lo), n_act_of(lo)) : 0.0;
    const double cold = hi > lo ? static_cast<double>(t.kc1 * geom_of(lo).h * c.wv * kBlkBytes +
                                                      c.kchunk * c.b_cols(tn) * 2) /
                                          r.gm_rate +
                                      r.gm_lat
                                : 0.0;
    cost += fill;
    cost += cold;
    if (r.way_stages && t.l0c_buffers == 2)
      cost = staged_block(
          r, c, lo, hi, fill + cold,
          [&](int64_t i) {
            return std::pair{&geom_of(i), n_act_of(i)};
          },
          [&](int64_t i) { return costs.steps(mt_of(i), n_act_of(i)); });
    worst = std::max(worst, cost);
  }
  return worst;
}

double busiest_block(const ChipConfig& cfg, const ConvRates& r, const Candidate& c,
                     int64_t cg_out) {
  const CubeConvTiling& t = c.t;
  if (t.spatial_major) return busiest_block_spatial(cfg, r, c, cg_out);
  const int64_t mt_count = t.m_tiles, per_key = mt_count * t.stacks, tn = t.tn;
  const int64_t n_last = cg_out - (t.n_tiles - 1) * tn, per = t.tiles_per_block;
  const MTileCosts costs(cfg, r, c, n_last);
  std::vector<double> pre_full(static_cast<size_t>(mt_count) + 1, 0), pre_last = pre_full;
  for (int64_t i = 0; i < mt_count; ++i) {
    pre_full[static_cast<size_t>(i + 1)] = pre_full[static_cast<size_t>(i)] + costs.tile(i, tn);
    pre_last[static_cast<size_t>(i + 1)] =
        pre_last[static_cast<size_t>(i)] + costs.tile_last[static_cast<size_t>(i)];
  }
  auto prefix = [&](const std::vector<double>& p, int64_t x) {  // tiles [0, x) of a key
    return static_cast<double>(x / mt_count) * p.back() + p[static_cast<size_t>(x % mt_count)];
  };
  auto hi_last = [&](int64_t b) { return std::min(t.tiles, (b + 1) * per); };
  double worst = 0;
  for (int64_t b = 0; b < t.block_dim; ++b) {
    double cost = 0;
    for (int64_t i = b * per, hi = std::min(t.tiles, (b + 1) * per); i < hi;) {
      const int64_t key = i / per_key, end = std::min(hi, (key + 1) * per_key);
      const int64_t n_act = key % t.n_tiles == t.n_tiles - 1 ? n_last : tn;
      const std::vector<double>& p = n_act == tn ? pre_full : pre_last;
      cost += prefix(p, end - key * per_key) - prefix(p, i - key * per_key);
      cost += costs.first(i % mt_count, n_act) - costs.tile(i % mt_count, n_act);
      if (t.resident)  // the first chunk's weights are not overlapped
        cost += c.weight_load(cfg, r.l2_rate, n_act) + r.gm_lat;
      i = end;
    }
    if (c.affine_per_elem > 0 && t.l0c_buffers > 1 && hi_last(b) > b * per) {
      // With the batch norm in the epilogue the block's last tile's way out (its vector
      // passes and store) follows its last step: nothing overlaps it.
      const int64_t last = hi_last(b) - 1;
      const int64_t n_act = (last / per_key) % t.n_tiles == t.n_tiles - 1 ? n_last : tn;
      cost += tile_store(r, c, c.mts[static_cast<size_t>(last % mt_count)], n_act);
    }
    // The block's start, before its first step: the pipeline's fill and, with streamed
    // weights, the cold first step.
    double fill = 0, cold = 0;
    if (hi_last(b) > b * per) {
      const int64_t first = b * per;
      const int64_t n_act = (first / per_key) % t.n_tiles == t.n_tiles - 1 ? n_last : tn;
      fill = costs.fill(first % mt_count, n_act);
      cost += fill;
    }
    if (!t.resident) {  // the block's first step waits for its slab and weights, cold
      const SlabGeom& g = c.mts[static_cast<size_t>((b * per) % mt_count)];
      cold = static_cast<double>(t.kc1 * g.h * c.wv * kBlkBytes + c.kchunk * c.b_cols(tn) * 2) /
                 r.gm_rate +
             r.gm_lat;
      cost += cold;
    }
    if (r.way_stages && t.l0c_buffers == 2) {
      // Tile by tile: a key's first tile in the block loads its weights (as above).
      auto n_act_of = [&](int64_t i) {
        return (i / per_key) % t.n_tiles == t.n_tiles - 1 ? n_last : tn;
      };
      cost = staged_block(
          r, c, b * per, hi_last(b), fill + cold,
          [&](int64_t i) {
            return std::pair{&c.mts[static_cast<size_t>(i % mt_count)], n_act_of(i)};
          },
          [&](int64_t i) {
            const bool first = i == b * per || i % per_key == 0;
            if (!first) return costs.steps(i % mt_count, n_act_of(i));
            const SlabGeom& g = c.mts[static_cast<size_t>(i % mt_count)];
            return static_cast<double>(t.chunks) *
                       step_stages(cfg, r, c, g, n_act_of(i), first).period +
                   (t.resident ? c.weight_load(cfg, r.l2_rate, n_act_of(i)) + r.gm_lat : 0.0);
          });
    }
    worst = std::max(worst, cost);
  }
  return worst;
}

// Whether each tile writes whole rows of y (every channel of its positions: one run per tile),
// so that no other tile writes into its lines.
bool y_whole_rows(const CubeConvSpec& s, const CubeConvTiling& t) {
  const int64_t osz = isa::dtype_size(s.out_type);
  const int64_t run = round_up(std::min(t.tn, s.cg_out), kBlk) * osz;
  return s.y_packed || (s.groups == 1 && t.n_tiles == 1 && run >= s.pitch() * osz);
}

// The launch's time in the device memory (cycles): the bytes it moves over HBM (LPDDR on the
// 310P) at HBM's rate, all cores together. The busiest core's estimate (busiest_block) takes
// its reads at its own path's rate and its stores at the L2's, as if it had the HBM to itself;
// the cores' contention for HBM is added to it, not overlapped (the launches that move much
// HBM traffic wait on it: MobileNetV2's 56x56 24 -> 144 expansion on the 310P in 48x144 tiles,
// 27,858 cycles as a launch alone, LPDDR busy 23,426 of them). The bytes, as the memory model
// moves them (sim/chip/l2_tags.cpp, docs/chip_model.md "Memory system"): x and the weights
// read once (the L2 cold at every launch unless the chip keeps it; read again, they hit), and
// y's writes. A write-back L2 takes y's writes (evicted later, not counted here); with
// write-through timing a write that misses goes to HBM and allocates its line, and the writes
// that follow into a line present are absorbed by the L2. Where a tile covers every channel of
// its rows (one run of y per tile) every line of y goes to HBM. With several n tiles (or
// groups) per row a tile writes a run of `run` bytes per output position, the other tiles'
// runs beside it: a line holds on average 1 + line / run pieces of runs and the piece of the
// first to write it misses, so about run / (run + line) of y goes to HBM (the same launch in
// 224x48 tiles, runs of 96 bytes: 0.60 of y's 3.61 MB to LPDDR, this estimate 0.57; in
// 48x144 tiles, whole rows, all of it). Whether the 310P's L2 absorbs write hits so is not
// sourced (docs/validation.md): this estimates what the model does, not silicon.
struct HbmBytes {
  double x = 0, w = 0, y = 0;  // x's and the weights' first reads, y's writes
};

HbmBytes hbm_bytes(const ChipConfig& cfg, const CubeConvSpec& s, const CubeConvTiling& t) {
  const int64_t in_size = isa::dtype_size(s.in_type), osz = isa::dtype_size(s.out_type);
  const int64_t taps = s.kh * s.kw;
  HbmBytes b;
  if (!cfg.l2_keep_across_launches) {
    const int64_t x_elems = s.images * (s.x_image ? s.x_image : s.hs * s.ws * s.cs);
    const int64_t w_elems =
        s.b_diagonal ? s.groups * s.cg_out * kBlk * taps : s.groups * s.cg_in * taps * s.cg_out;
    b.x = static_cast<double>(x_elems * in_size);
    b.w = static_cast<double>(w_elems * in_size);
  }
  if (!cfg.l2_write_back) {
    const double y_bytes = static_cast<double>(s.images * s.oh() * s.ow() * s.cy * osz);
    const int64_t run = round_up(std::min(t.tn, s.cg_out), kBlk) * osz;
    const bool whole_rows = y_whole_rows(s, t);
    const double line = static_cast<double>(std::max<uint32_t>(cfg.l2_line_bytes, 1));
    b.y = cfg.l2_bytes == 0 || whole_rows
              ? y_bytes
              : y_bytes * static_cast<double>(run) / (static_cast<double>(run) + line);
  }
  return b;
}

// HBM's rate (bytes per cycle) for the launch's mix of reads and writes; 0 without an HBM rate.
double hbm_rate(const ChipConfig& cfg, const HbmBytes& b) {
  const double all = b.x + b.w + b.y;
  if (cfg.hbm_sustained_bytes_per_cycle() <= 0 || all <= 0) return 0;
  return cfg.hbm_mixed_bytes_per_cycle(b.y / all);
}

double hbm_time(const ChipConfig& cfg, const CubeConvSpec& s, const CubeConvTiling& t) {
  const HbmBytes b = hbm_bytes(cfg, s, t);
  const double rate = hbm_rate(cfg, b);
  return rate > 0 ? (b.x + b.w + b.y) / rate : 0;
}

// Where several groups read the same rows of x (grouped and depthwise convolutions), the
// launch's HBM traffic and its cores' work overlap as far as x's first reads are spread over the
// launch (docs/validation.md, "MobileNetV2 on the 310P: the depthwise launches' first reads").
// A read that misses the L2 fills whole lines (memory.l2.line_bytes) from HBM, and a line of x
// holds the channels of every group (a 16-channel plane reads 32 bytes of each pixel's 2 * C),
// so the first tile of any group to read a row of x reads all of it from HBM and the other
// groups' tiles find it in the L2. With the blocks in lock step (step i: every block's i-th
// tile in the kernel's order, key-major or position-major), first_read_rows gives per step
// the rows of x (image, input row) that its tiles read first: in key-major order the cores
// start on different keys at nearby positions or far apart, so x's first reads come at the
// launch's start (each row read again by the other cores later: from the L2) or spread over it.
std::vector<int64_t> first_read_rows(const CubeConvSpec& s, const Candidate& c) {
  const CubeConvTiling& t = c.t;
  const int64_t per = t.tiles_per_block, per_key = t.m_tiles * t.stacks, hv = s.hv();
  const int64_t period = t.stack > 1 ? t.period : hv;
  std::vector<char> read(static_cast<size_t>(s.images * hv), 0);
  std::vector<int64_t> rows(static_cast<size_t>(per), 0);
  for (int64_t i = 0; i < per; ++i)
    for (int64_t b = 0; b < t.block_dim && b * per + i < t.tiles; ++b) {
      const int64_t j = b * per + i, pos = t.spatial_major ? j / t.keys : j % per_key;
      const SlabGeom& g = c.mts[static_cast<size_t>(pos % t.m_tiles)];
      for (int64_t r = g.r0; r < g.r0 + g.h; ++r) {
        const int64_t image = pos / t.m_tiles * t.stack + r / period, row = r % period;
        if (row >= hv || image >= s.images) continue;  // a stack's gap rows, missing images
        char& seen = read[static_cast<size_t>(image * hv + row)];
        if (!seen) ++rows[static_cast<size_t>(i)];
        seen = 1;
      }
    }
  return rows;
}

// Whether fill_front_time prices the launch: groups that read the same rows of x (block-diagonal
// groups too: the depthwise convolutions' count per step is chosen between both forms), x in
// its plain layout (no strided view or fold, no zero insertion), the L2 cold at the launch.
bool groups_share_x(const ChipConfig& cfg, const CubeConvSpec& s) {
  return (s.groups > 1 || s.b_diagonal) && s.x_row == 0 && s.x_image == 0 && s.hv() == s.hs &&
         s.wv() == s.ws && !cfg.l2_keep_across_launches;
}

// The launch's cycles with x's first reads in lock step (first_read_rows): per step, HBM
// moves that step's first reads of x (the weights with the first step) and an even share of
// y's writes, and the cores do an even share of the busiest block's work (`busiest`), each
// step's work after its reads and after the step before, each step's reads after the step
// before's and once the step two before is done (the slabs are double-buffered). So the
// launch takes the sum of HBM's and the cores' times where x is read at its start, and about
// the larger where x's first reads are spread over the launch.
double fill_front_time(const ChipConfig& cfg, const CubeConvSpec& s, const Candidate& c,
                       double busiest) {
  const HbmBytes b = hbm_bytes(cfg, s, c.t);
  const double rate = hbm_rate(cfg, b);
  if (rate <= 0) return busiest;
  const std::vector<int64_t> rows = first_read_rows(s, c);
  const double per = static_cast<double>(rows.size());
  const double row_bytes = static_cast<double>(s.ws * s.cs * isa::dtype_size(s.in_type));
  double read_end = 0, done = 0, done_before = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const double moved =
        static_cast<double>(rows[i]) * row_bytes + (i == 0 ? b.w : 0.0) + b.y / per;
    read_end = std::max(read_end, done_before) + moved / rate;
    done_before = done;
    done = std::max(done, read_end) + busiest / per;
  }
  return done;
}

// Among the plans within kPlanTieBand of the lowest modelled cost (the model cannot tell them
// apart: it is tens of per cent off either way, docs/compiler.md): the largest tile (tm * tn:
// the least data read again per output), then the largest chunk, then resident weights, then
// the lowest cost. tm == 0 if there are none.
CubeConvTiling choose(const std::vector<CubeConvTiling>& plans) {
  double lowest = std::numeric_limits<double>::infinity();
  for (const CubeConvTiling& p : plans) lowest = std::min(lowest, p.est_cycles);
  CubeConvTiling best;
  for (const CubeConvTiling& p : plans) {
    if (p.est_cycles > lowest * (1 + kPlanTieBand)) continue;
    if (best.tm == 0 ||
        std::make_tuple(p.tm * p.tn, p.kc1, p.resident, -p.est_cycles) >
            std::make_tuple(best.tm * best.tn, best.kc1, best.resident, -best.est_cycles))
      best = p;
  }
  return best;
}

// Whether every k chunk of kc1 channel blocks holds channels of every group: false where the
// channels end inside the last group (merged depthwise groups, merge_diagonal_groups, over a
// count that the merged width does not divide) before its last chunk, which the kernel would
// load and multiply as a chunk of no channels (an nd2nz of 0 columns, a fault).
bool last_group_fills_chunks(const CubeConvSpec& s, int64_t kc1) {
  // (the last group's channels: at most cg_in, which a row view's pixels exceed)
  const int64_t last_c1 = ceil_div(std::min(s.cs - (s.groups - 1) * s.cg_in, s.cg_in), kBlk);
  return ceil_div(last_c1, kc1) == ceil_div(s.c1_in(), kc1);
}

// What plan_cube_conv's loops share: the spec, the chip, its cube core and rates.
struct ConvPlanner {
  const CubeConvSpec& s;
  const ChipConfig& cfg;
  const CoreKindConfig& core;
  const ConvRates rates;
  const int64_t forced_stack;
  const bool via_ub;                     // tiles leave L0C through the UB: a tile must fit it
  const PixelLoads pixel_loads;          // NPUSIM_CONV_PIXEL_LOADS
  const WeightLoads weight_loads;        // NPUSIM_CONV_WEIGHT_RUNS
  const StridedSlabLoads strided_loads;  // NPUSIM_CONV_STRIDED_PIXELS
  std::vector<CubeConvTiling> plans;

  // Every tiling of stack count st that fits, into plans.
  void add_stacking(int64_t st, const std::vector<int64_t>& tns) {
    if (s.y_packed && st > 1) return;  // a packed tile is one run of one image's rows
    const StackGeom sg = stack_geom(s, st);
    const int64_t positions = sg.tall_oh * s.ow();
    const int64_t ru16 = field_max(isa::FieldKind::RU16);
    // The blocks' tiles: a tile's cost depends on its m tile (rows, slab) and its n tile.
    for (int64_t tm :
         tile_heights(positions, s.max_tile_height > 0 ? s.max_tile_height : kMaxTile)) {
      Candidate c;
      c.mts = m_tiles(positions, tm, s.ow(), sg.ht, s.kh, s.sh, s.dh, s.pt);
      // The planner makes a stack one m tile (stacking serves images smaller than a tile;
      // several m tiles per tall map measured slower than the model predicts, e.g. 11 images
      // of 7x7 in 208-row tiles); a forced stacking may take several.
      if (st > 1 && c.mts.size() > 1 && forced_stack == 0) continue;
      for (const SlabGeom& g : c.mts) c.t.slab_rows = std::max(c.t.slab_rows, g.h);
      if (c.t.slab_rows * s.wv() > ru16 - kBlk) continue;  // nd2nz rows / dst_rows
      c.t.stack = st;
      c.t.period = sg.period;
      c.t.stacks = ceil_div(s.images, st);
      c.t.tall_oh = sg.tall_oh;
      c.t.tm = tm;
      c.t.m_tiles = static_cast<int64_t>(c.mts.size());
      c.wv = s.wv();
      c.stack_gap = st > 1 && sg.period != s.hv();
      c.taps = s.kh * s.kw;
      c.osz = isa::dtype_size(s.out_type);
      c.b_block = s.b_diagonal ? s.b_cols(0) : 0;
      c.isz = isa::dtype_size(s.in_type);
      c.cs = s.cs;
      c.dense_slab =
          st == 1 && s.x_row == 0 && s.up_h == 1 && s.up_w == 1 && s.ext_h == 0 && s.ext_w == 0;
      c.b_rows_k = s.b_diagonal || s.b_mode == CubeConvSpec::BMode::kRowsK;
      c.b_pitch_bytes = s.b_row * c.isz;
      c.b_n16 = s.b_nblock > 0;
      c.cg_in = s.cg_in;
      if (st == 1 && s.x_row != 0 && strided_loads != StridedSlabLoads::kAsBefore) {
        const SlabEmitter::Geometry view = conv_slab_geometry(s, c.t);
        c.strided_priced = SlabEmitter::strided_blocks(view);
        c.strided_before = SlabEmitter::strided_columns(view) ? StridedSlabForm::kColumns
                                                              : StridedSlabForm::kPlaneRows;
        c.x_pixel_bytes = s.x_pixel * c.isz;
        c.x_row_bytes = s.x_row * c.isz;
      }
      for (int64_t tn : tns) add_width(c, tn);
    }
  }

  // Every chunking of the candidate with output tiles tn wide that fits, into plans.
  void add_width(Candidate c, int64_t tn) {
    if (s.y_packed && tn < s.cg_out) return;  // a packed tile holds every channel
    const int64_t tn16 = round_up(std::min(tn, s.cg_out), kBlk);
    // The bias of a tile: one f32 row per L0 parity in BT, one per L1 parity in L1.
    const int64_t bias_bytes = s.bias ? tn16 * kL0cElemBytes : 0;
    if (2 * bias_bytes > static_cast<int64_t>(core.capacity(Buf::BT))) return;
    c.t.l0c_buffers = l0c_buffer_count(core, cfg, c.t.tm * tn16 * kL0cElemBytes);
    if (!c.t.l0c_buffers) return;
    // Through the UB: the output tile (with the batch norm an f32 and an output tile per L0C
    // buffer, and the tables; f32 rows of at most 255 blocks: a vector repeat stride).
    int64_t ub_bytes = c.t.tm * tn16 * c.osz;
    if (s.bn_affine) {
      if (tn16 / 8 > field_max(isa::FieldKind::RU8)) return;
      const ConvBnTables bt = conv_bn_tables(s, tn);
      ub_bytes = c.t.l0c_buffers * c.t.tm * tn16 * (c.osz * (s.residual ? 2 : 1) + kL0cElemBytes) +
                 2 * (bt.plain_bytes + bt.rep_bytes);
    }
    if (via_ub && ub_bytes > static_cast<int64_t>(core.capacity(Buf::UB))) return;
    if (s.bn_affine) {
      // The result tile where it fits (the emitter's layout pads the placed f32 tiles to
      // their banks: up to a bank span each of three, counted here).
      const int64_t with_result32 = ub_bytes + c.t.tm * tn16 * kL0cElemBytes + kRepeatBytes +
                                    3 * static_cast<int64_t>(rates.ub_bank_span);
      c.affine_per_elem =
          rates.ub_bank_span > 0 && with_result32 <= static_cast<int64_t>(core.capacity(Buf::UB))
              ? rates.affine_per_elem_result32
              : rates.affine_per_elem;
      // Packed rows need the result tile (the packing pass writes the other f32 tile).
      if (s.y_packed && with_result32 > static_cast<int64_t>(core.capacity(Buf::UB))) return;
    }
    c.t.tn = tn;
    c.t.n_tiles = ceil_div(s.cg_out, tn);
    c.t.tiles = s.groups * c.t.n_tiles * c.t.stacks * c.t.m_tiles;
    c.t.keys = s.groups * c.t.n_tiles;
    c.y_whole_rows = y_whole_rows(s, c.t);
    c.t.spatial_major = s.tiles_spatial_major && c.t.keys > 1;
    const CubeSplit split = contiguous_split(c.t.tiles, core.count);
    c.t.tiles_per_block = split.per;
    c.t.block_dim = split.block_dim;
    const int64_t c1_in = s.c1_in();
    std::set<int64_t> kc1s;
    for (int64_t parts = 1; parts <= c1_in; ++parts) kc1s.insert(ceil_div(c1_in, parts));
    for (int64_t kc1 : kc1s)
      for (bool resident : {true, false}) add_chunking(c, tn16, kc1, resident);
  }

  void add_chunking(Candidate c, int64_t tn16, int64_t kc1, bool resident) {
    if (!last_group_fills_chunks(s, kc1)) return;
    const int64_t ru12 = field_max(isa::FieldKind::RU12), ru16 = field_max(isa::FieldKind::RU16);
    CubeConvTiling& t = c.t;
    // Position-major: a block's consecutive tiles change weight key, so each step streams its
    // chunk of B with the slab (every key's B resident in L1, each loaded by the block's first
    // tile of its key, measured slower on MobileNetV2's depthwise layers: docs/validation.md).
    if (resident && t.spatial_major) return;
    t.kc1 = kc1;
    t.resident = resident;
    t.chunks = ceil_div(s.c1_in(), kc1);
    c.kchunk = kc1 * c.taps * kBlk;
    if (c.kchunk > ru16) return;  // load3d k_start
    t.tk0 = cube_k_step(core, cfg, t.tm, s.b_cols(tn16), 2,
                        std::min(s.b_diagonal ? c.taps * kBlk : c.kchunk, ru12));
    if (t.tk0 < kBlk) return;
    // A stacked slab is zeroed by one nd2nz (dst_rows: its pixels + 16).
    if (t.stack > 1 && kc1 * t.slab_rows * c.wv + kBlk > ru16) return;
    t.slab_bytes = slab_buffer_bytes(kc1, t.slab_rows, c.wv);
    t.whole_pixels = c.dense_slab && dense_slab_load(cfg, pixel_loads, t.slab_rows * c.wv, kc1,
                                                     c.cs, c.isz, rates.l2_rate, rates.gm_rate)
                                         .whole_pixels;
    // Resident: one buffer of the whole B of a (group, n tile); streamed: two chunk buffers.
    t.b_bytes =
        weight_buffer_bytes(resident ? s.c1_in() * c.taps * kBlk : c.kchunk, s.b_cols(tn16));
    if (!plan_fits(conv_l1_buffers(t, s.bias ? tn16 * kL0cElemBytes : 0).plan, cfg, core)) return;
    // Grouped convolutions read the same rows of x from each group: their x is read from HBM
    // once, by whichever tile comes first (fill_front_time); other convolutions add HBM's
    // time to the busiest core's.
    // kRowsN weights per k-block, or by tap (its nd2nz's rows are runs of the chunk's
    // channels, not 32 bytes; an L0B load per k-block) where forced, or as a plan of its own
    // where the chip prices GM bursts (with the keys at 0 the presets' kernels stay as they
    // are). Not with a bias or a strided y where there are several taps (the mmad step's
    // scalar registers).
    // (A blocked filter's k-blocks are a run each: per k-block.)
    const bool by_tap_too = !c.b_rows_k && !c.b_n16 && kc1 > 1 &&
                            (c.taps == 1 || (!s.bias && s.y_strided.run_rows == 0)) &&
                            (weight_loads == WeightLoads::kByTap ||
                             (weight_loads == WeightLoads::kByEstimate &&
                              (cfg.copy_issue_cycles != 0 || cfg.burst_cycles != 0)));
    // A strided view per pixel: a plan of its own where the chip prices the DMA's issue (with
    // the keys at 0 the presets' kernels stay as they are), the only one where forced.
    const bool per_pixel_too =
        c.strided_priced && (strided_loads == StridedSlabLoads::kPerPixel ||
                             cfg.copy_issue_cycles != 0 || cfg.burst_cycles != 0);
    for (bool per_pixel : {false, true}) {
      if (per_pixel && !per_pixel_too) break;
      if (!per_pixel && per_pixel_too && strided_loads == StridedSlabLoads::kPerPixel) continue;
      t.strided_pixels = per_pixel;
      for (bool by_tap : {false, true}) {
        if (by_tap && !by_tap_too) break;
        if (!by_tap && by_tap_too && weight_loads == WeightLoads::kByTap) continue;
        t.weights_by_tap = by_tap;
        const double busiest = busiest_block(cfg, rates, c, s.cg_out);
        t.est_cycles = groups_share_x(cfg, s) ? fill_front_time(cfg, s, c, busiest)
                                              : busiest + hbm_time(cfg, s, t);
        plans.push_back(t);
      }
    }
  }
};

}  // namespace

CubeConvSpec merge_diagonal_groups(const CubeConvSpec& s, int64_t per, const std::string& op) {
  if (s.cg_in != kBlk || s.b_diagonal || s.b_mode != CubeConvSpec::BMode::kRowsK || s.b_flip ||
      per < 1)
    throw CompileError(fmt::format(
        "{}: merging {} block-diagonal groups needs groups of one 16-channel block (kRowsK, no "
        "flip; {} input channels per group)",
        op, per, s.cg_in));
  CubeConvSpec m = s;
  m.groups = ceil_div(s.groups, per);
  m.cg_in = s.cg_in * per;
  m.cg_out = s.cg_out * per;
  m.b_diagonal = per > 1;
  return m;
}

ConvBnTables conv_bn_tables(const CubeConvSpec& s, int64_t tn) {
  ConvBnTables t;
  if (!s.bn_affine) return t;
  constexpr int64_t kLanes = 64;  // f32 lanes of one vector repeat
  t.plain_bytes = channel_table_bytes(s.cy);
  const int64_t w = round_up(std::min(tn, s.cg_out), kBlk);
  if (w != 16 && w != 32) {
    if (s.groups != 1 || w % kLanes == 0 || isa::dtype_size(s.out_type) >= kL0cElemBytes) return t;
    t.width = w;
    t.period = std::lcm(w, kLanes);
    const int64_t n_tiles = ceil_div(s.cg_out, tn);
    t.plain_bytes = channel_table_bytes(n_tiles * w);
    t.rep_bytes = n_tiles * t.period * kL0cElemBytes;
    return t;
  }
  // Every tile's output row (n_act channels) must be whole blocks of exactly w lanes: the
  // first and last group's first and last n tile cover the n_act values there are.
  const int64_t per_block = kBlkBytes / isa::dtype_size(s.out_type),
                n_tiles = ceil_div(s.cg_out, tn);
  for (int64_t g : {int64_t{0}, s.groups - 1})
    for (int64_t nt : {int64_t{0}, n_tiles - 1}) {
      const int64_t n_act = std::min(tn, std::min(s.cg_out, s.cy - g * s.cg_out) - nt * tn);
      if (n_act <= 0 || round_up(n_act, per_block) != w) return t;
    }
  t.dense = true;
  t.width = w;
  t.rep_bytes = ceil_div(s.cy, w) * kLanes * kL0cElemBytes;
  return t;
}

std::string CubeConvTiling::str() const {
  return fmt::format(
      "tiles {}x{} ({} m x {} n per {}/group, {} tiles over {} blocks of {}), "
      "{}k {} per mmad, {} channel blocks per chunk ({} chunk(s){}), slab {} rows "
      "({} B{}), B {} B{}, {} L0C buffer(s), ~{:.0f} cycles",
      tm, tn, m_tiles, n_tiles,
      stack == 1 ? std::string("image")
                 : fmt::format("stack of {} images (period {} rows)", stack, period),
      tiles, block_dim, tiles_per_block, spatial_major ? "position-major, " : "", tk0, kc1, chunks,
      resident ? ", weights resident" : "", slab_rows, slab_bytes,
      whole_pixels     ? ", by whole pixels"
      : strided_pixels ? ", per pixel"
                       : "",
      b_bytes, weights_by_tap ? " by tap" : "", l0c_buffers, est_cycles);
}

bool conv_y_packable(const CubeConvSpec& s) {
  const int64_t osz = isa::dtype_size(s.out_type);
  return s.bn_affine && s.groups == 1 && s.pitch() == s.cy && s.cy % 8 == 0 &&
         round_up(s.cy, kBlk) <= 32 && (s.cy * osz) % kBlkBytes != 0 &&
         (kBlk * s.cy * osz) % kBlkBytes == 0 && (s.oh() * s.ow() * s.cy * osz) % kBlkBytes == 0;
}

int64_t forced_plan_rank(const char* variable, const std::string& op) {
  const char* v = std::getenv(variable);
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long long k = std::strtoll(v, &end, 10);
  if (*end != '\0' || k < 1)
    throw CompileError(
        fmt::format("{}: {}='{}' is not a positive rank (1: the plan with the lowest estimate)", op,
                    variable, v));
  return k;
}

CubeConvTiling plan_cube_conv(const CubeConvSpec& s, const ChipConfig& cfg, const std::string& op,
                              int64_t stack) {
  const CoreKindConfig& core = cube_core(cfg, op);
  const bool via_ub = cube_store_via_ub(cfg, core, op);
  const int64_t osz = isa::dtype_size(s.out_type);
  if (s.y_packed && (!via_ub || !conv_y_packable(s)))
    throw CompileError(fmt::format(
        "{}: packed output rows need the UB path, the batch norm in the epilogue, one group, "
        "at most 32 channels in whole f32 blocks and every tile's rows whole 32-byte blocks "
        "({} channels of {} bytes, {}x{} outputs per image, chip {})",
        op, s.cy, osz, s.oh(), s.ow(), cfg.name));
  if (via_ub && !s.y_packed &&
      (s.pitch() * osz % kBlkBytes != 0 ||
       (s.groups > 1 && s.group_pitch() * osz % kBlkBytes != 0)))
    throw CompileError(fmt::format(
        "{}: chip {} has no l0c->gm path: the output leaves through the UB in whole 32-byte "
        "blocks, so its row pitch ({} x {} bytes) and, with groups, the channels per group ({}) "
        "must be whole blocks (pad them: CubeConvSpec::y_pitch, y_group_pitch)",
        op, cfg.name, s.pitch(), osz, s.group_pitch()));
  const int64_t hv = s.hv(), wv = s.wv(), oh = s.oh(), ow = s.ow();
  check_geometry(op, hv, wv, s.kh, s.kw, s.sh, s.sw, s.dh, s.dw, s.pt, s.pb, s.pl, s.pr);
  if (oh < 1 || ow < 1) throw CompileError(fmt::format("{}: empty output", op));
  if (s.bias && (s.groups != 1 || !cfg.has_path(Buf::L1, Buf::BT)))
    throw CompileError(
        fmt::format("{}: a convolution bias needs groups == 1 and an l1->bt path "
                    "(groups {}, chip {})",
                    op, s.groups, cfg.name));
  if (s.b_diagonal && (s.b_mode != CubeConvSpec::BMode::kRowsK || s.b_flip || s.bias ||
                       s.cg_in % kBlk != 0 || s.cg_out % s.c1_in() != 0 || s.b_cols(0) % kBlk != 0))
    throw CompileError(fmt::format(
        "{}: a block-diagonal B needs kRowsK weights without flip or bias, whole 16-channel "
        "input blocks and whole 16-column output blocks ({} -> {} channels per group)",
        op, s.cg_in, s.cg_out));
  const bool rows_k = s.b_mode == CubeConvSpec::BMode::kRowsK;
  if (s.b_nblock > 0 && (s.b_diagonal || s.b_row != kBlk || s.in_type == isa::Dtype::F32 ||
                         (rows_k && (s.b_flip || s.cy % kBlk != 0 || s.cg_out % kBlk != 0)) ||
                         (!rows_k && s.cg_in % kBlk != 0)))
    throw CompileError(fmt::format(
        "{}: weights in blocks of 16 output channels need rows of 16, no block-diagonal "
        "packing, a 16-bit cube input, and each group's whole 16-channel blocks of n without "
        "flip (kRowsK) or of k (kRowsN) ({} -> {} channels a group, {} groups)",
        op, s.cg_in, s.cg_out, s.groups));
  if ((s.b_tap_row != 0 || s.b_last_col_rows != 0) &&
      (!rows_k || s.b_flip || s.b_diagonal || s.cg_in > kBlk || s.b_last_col_rows < 0 ||
       s.b_last_col_rows >= s.cg_in))
    throw CompileError(fmt::format(
        "{}: a stride-packed B (b_tap_row {}, b_last_col_rows {}) needs kRowsK weights without "
        "flip or block-diagonal packing, at most 16 input channels (one k-block a tap) and "
        "fewer last-column rows than the {} input channels",
        op, s.b_tap_row, s.b_last_col_rows, s.cg_in));
  const std::vector<int64_t> tns = tile_widths(s, op);
  ConvPlanner planner{s,
                      cfg,
                      core,
                      conv_rates(cfg, core, s),
                      stack,
                      via_ub,
                      pixel_loads_switch(op),
                      weight_loads_switch(op),
                      conv_strided_slab_switch(op),
                      {}};
  for (int64_t st : stack_counts(s, op, stack)) planner.add_stacking(st, tns);
  // NPUSIM_CONV_PLAN_RANK (forced_plan_rank): benchmarks/conv_plan_ranks.py.
  const int64_t rank = forced_plan_rank("NPUSIM_CONV_PLAN_RANK", op);
  CubeConvTiling best = choose(planner.plans);
  if (rank > 0) {
    std::vector<CubeConvTiling> by_cost = planner.plans;
    std::stable_sort(by_cost.begin(), by_cost.end(),
                     [](const CubeConvTiling& a, const CubeConvTiling& b) {
                       return a.est_cycles < b.est_cycles;
                     });
    if (rank > static_cast<int64_t>(by_cost.size()))
      throw CompileError(fmt::format("{}: NPUSIM_CONV_PLAN_RANK={} but only {} tilings fit", op,
                                     rank, by_cost.size()));
    best = by_cost[static_cast<size_t>(rank - 1)];
  }
  if (best.tm == 0)
    throw CompileError(fmt::format(
        "{}: no convolution tile fits the cube core of chip {} (L1 {} B, L0A {} B, L0B {} B, "
        "L0C {} B; the smallest needs a 16-position slab of {} rows x {} columns x 16 channels "
        "and 16x16 outputs, double-buffered)",
        op, cfg.name, core.capacity(Buf::L1), core.capacity(Buf::L0A), core.capacity(Buf::L0B),
        core.capacity(Buf::L0C), m_tiles(oh * ow, kBlk, ow, hv, s.kh, s.sh, s.dh, s.pt).front().h,
        wv));
  return best;
}

CubeConvTiling rechunk_cube_conv(const CubeConvSpec& s, CubeConvTiling t, int64_t kc1,
                                 bool resident, const ChipConfig& cfg, const std::string& op) {
  const CoreKindConfig& core = cube_core(cfg, op);
  const int64_t taps = s.kh * s.kw, tn16 = round_up(std::min(t.tn, s.cg_out), kBlk);
  if (!last_group_fills_chunks(s, kc1))
    throw CompileError(fmt::format(
        "{}: chunks of {} channel block(s) over groups of {}: the last group's chunk {} "
        "holds no channels ({} of {} input channels in the last group)",
        op, kc1, s.c1_in(), ceil_div(ceil_div(s.cs - (s.groups - 1) * s.cg_in, kBlk), kc1) + 1,
        s.cs - (s.groups - 1) * s.cg_in, s.cs));
  t.kc1 = kc1;
  t.chunks = ceil_div(s.c1_in(), kc1);
  t.resident = resident;
  t.slab_bytes = slab_buffer_bytes(kc1, t.slab_rows, s.wv());
  t.b_bytes = weight_buffer_bytes((resident ? s.c1_in() : kc1) * taps * kBlk, s.b_cols(tn16));
  if (resident && t.spatial_major)
    throw CompileError(fmt::format("{}: position-major tiles stream their weights", op));
  t.tk0 = std::min(t.tk0, kc1 * taps * kBlk);
  if (!plan_fits(conv_l1_buffers(t, s.bias ? tn16 * kL0cElemBytes : 0).plan, cfg, core))
    throw CompileError(fmt::format("{}: tiling {} does not fit L1", op, t.str()));
  return t;
}

}  // namespace npusim::compiler::ops
