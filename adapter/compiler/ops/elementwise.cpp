#include "adapter/compiler/ops/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <string_view>

#include <fmt/format.h>

#include "adapter/compiler/buffer_plan.h"
#include "adapter/compiler/ops/conv_slab.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;
using isa::Pipe;
using layout::kBlockBytes;

namespace {

using vec::kRepeatBytes;               // one vector repeat: 8 blocks of 32 bytes (isa.def)
constexpr int64_t kTileQuantum = 128;  // tiles are whole multiples of 128 elements
constexpr int kLog2Block = 5;          // log2(kBlockBytes)

// The u16 / s32 view used to move elements of a size without interpreting them.
Dtype bits_type(int elem_bytes) { return elem_bytes == 4 ? Dtype::S32 : Dtype::U16; }

}  // namespace

// ---- broadcast views ----

bool BroadcastView::identity() const {
  return dims.empty() || (dims.size() == 1 && strides[0] == 1);
}

bool BroadcastView::splat() const {
  return !dims.empty() &&
         std::all_of(strides.begin(), strides.end(), [](int64_t s) { return s == 0; });
}

int64_t BroadcastView::period() const {
  return dims.size() == 2 && strides[0] == 0 && strides[1] == 1 ? dims[1] : 0;
}

BroadcastView broadcast_view(const std::vector<int64_t>& in_shape,
                             const std::vector<int64_t>& out_shape) {
  const size_t rank = out_shape.size();
  if (in_shape.size() > rank) throw Error("broadcast_view: input rank exceeds output rank");
  std::vector<int64_t> in(rank - in_shape.size(), 1);
  in.insert(in.end(), in_shape.begin(), in_shape.end());
  std::vector<int64_t> natural(rank, 1);
  for (size_t i = rank; i-- > 1;) natural[i - 1] = natural[i] * in[i];
  BroadcastView v;
  for (size_t i = 0; i < rank; ++i) {
    if (out_shape[i] == 1) continue;
    const int64_t d = out_shape[i];
    const int64_t s = in[i] == 1 ? 0 : natural[i];
    if (!v.dims.empty()) {
      int64_t& D = v.dims.back();
      int64_t& S = v.strides.back();
      if ((S == 0 && s == 0) || (s != 0 && S == s * d)) {
        D *= d;
        S = s;
        continue;
      }
    }
    v.dims.push_back(d);
    v.strides.push_back(s);
  }
  return v;
}

// ---- vector helpers ----

bool multiply_accumulate_enabled(KernelBuilder& b) {
  // The value is checked on every chip, with the instruction or not.
  const char* v = std::getenv("NPUSIM_VECTOR_MULTIPLY_ACCUMULATE");
  if (!v || std::string_view(v) == "1") return b.config().vector_multiply_accumulate;
  if (std::string_view(v) == "0") return false;
  b.fail(fmt::format("NPUSIM_VECTOR_MULTIPLY_ACCUMULATE='{}' is neither '0' nor '1'", v));
}

void vec_binary(KernelBuilder& b, Opcode op, Dtype t, Opnd dst, Opnd src0, Opnd src1,
                const Reg& count) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(op, {t, dst, src0, src1, 0, 1, 1, 1, 8, 8, 8});
}

void vec_unary(KernelBuilder& b, Opcode op, Dtype t, Opnd dst, Opnd src, const Reg& count) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(op, {t, dst, src, 0, 1, 1, 8, 8});
}

void vec_bitwise(KernelBuilder& b, Opcode op, Dtype t, Opnd dst, Opnd src0, Opnd src1,
                 const Reg& count) {
  const auto on_lanes = [&](const Reg& lanes) {
    if (op == Opcode::op_vnot)
      vec_unary(b, op, Dtype::U16, dst, src0, lanes);
    else
      vec_binary(b, op, Dtype::U16, dst, src0, src1, lanes);
  };
  if (isa::dtype_size(t) == 2) return on_lanes(count);
  Reg lanes = b.reg("u16 lanes");
  b.shl(lanes, count, 1);
  on_lanes(lanes);
}

void vec_scalar(KernelBuilder& b, Opcode op, Dtype t, Opnd dst, Opnd src, const Reg& scalar,
                const Reg& count) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(op, {t, dst, src, scalar, 0, 1, 1, 8, 8});
}

void vec_convert(KernelBuilder& b, Dtype dst_type, Dtype src_type, Opnd dst, Opnd src,
                 RoundMode round, const Reg& count) {
  // Lanes per repeat = 256 / the wider element; each operand advances lanes * size bytes.
  const int dsz = isa::dtype_size(dst_type), ssz = isa::dtype_size(src_type);
  const int lanes = kRepeatBytes / std::max(dsz, ssz);
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vconv, {dst_type, src_type, dst, src, 0, 1, 1, lanes * dsz / kBlockBytes,
                            lanes * ssz / kBlockBytes, static_cast<int64_t>(round)});
}

bool widens_bf16(Dtype type, const ChipConfig& cfg) {
  return type == Dtype::BF16 && !cfg.vector_bf16_arithmetic;
}

void widen_bf16_tile_work(StreamSpec& spec, size_t inputs, WidenedResult result) {
  if (spec.resident_compute) throw std::logic_error("widen_bf16_tile_work: resident_compute");
  const size_t first = spec.temps.size();
  for (size_t i = 0; i < inputs; ++i)
    spec.temps.push_back(TempSpec{fmt::format("in{} in f32", i), 4, 0});
  if (result == WidenedResult::kRounded) spec.temps.push_back(TempSpec{"result in f32", 4, 0});
  spec.compute = [f32_work = std::move(spec.compute), first, inputs, result](
                     KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    TileOperands wide = t;
    for (size_t i = 0; i < inputs; ++i) {
      wide.in[i] = t.temp[first + i];
      vec_convert(b, Dtype::F32, Dtype::BF16, wide.in[i], t.in[i], RoundMode::kRint, n);
    }
    if (result != WidenedResult::kBool) {
      wide.out = result == WidenedResult::kRounded ? t.temp[first + inputs] : wide.in[0];
      if (!wide.outs.empty()) wide.outs[0] = wide.out;
    }
    f32_work(b, wide);
    if (result != WidenedResult::kBool)
      vec_convert(b, Dtype::BF16, Dtype::F32, t.out, wide.out, RoundMode::kRint, n);
  };
}

void vec_binary_bf16_in_f32(KernelBuilder& b, Opcode op, Opnd dst, Opnd src0, Opnd src1, Opnd wide0,
                            Opnd wide1, const Reg& count) {
  vec_convert(b, Dtype::F32, Dtype::BF16, wide0, src0, RoundMode::kRint, count);
  vec_convert(b, Dtype::F32, Dtype::BF16, wide1, src1, RoundMode::kRint, count);
  vec_binary(b, op, Dtype::F32, wide0, wide0, wide1, count);
  vec_convert(b, Dtype::BF16, Dtype::F32, dst, wide0, RoundMode::kRint, count);
}

void vec_unary_bf16_in_f32(KernelBuilder& b, Opcode op, Opnd dst, Opnd src, Opnd wide0,
                           const Reg& count) {
  vec_convert(b, Dtype::F32, Dtype::BF16, wide0, src, RoundMode::kRint, count);
  vec_unary(b, op, Dtype::F32, wide0, wide0, count);
  vec_convert(b, Dtype::BF16, Dtype::F32, dst, wide0, RoundMode::kRint, count);
}

void vec_dup_bits(KernelBuilder& b, int elem_bytes, Opnd dst, Opnd bits, Opnd count) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vdup, {bits_type(elem_bytes), dst, bits, 0, 1, 8});
}

void vec_copy_bits(KernelBuilder& b, int elem_bytes, Opnd dst, Opnd src, Opnd count) {
  if (elem_bytes == 1) {
    // No 8-bit vcopy: move byte pairs as u16. An odd count writes one byte past the range
    // (callers' UB tiles are whole multiples of 128 elements, so it stays in the buffer).
    if (count.kind() == Opnd::Kind::kImm) {
      vec_copy_bits(b, 2, dst, src, (count.value() + 1) / 2);
      return;
    }
    Reg pairs = b.reg("byte pairs");
    b.emit(Opcode::op_add, {pairs, count, 1});
    b.shr(pairs, pairs, 1);
    vec_copy_bits(b, 2, dst, src, pairs);
    return;
  }
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vcopy, {bits_type(elem_bytes), dst, src, 0, 1, 1, 8, 8});
}

void vec_compare(KernelBuilder& b, Dtype t, isa::Cmp cmp, Opnd bits, Opnd src0, Opnd src1,
                 const Reg& count, bool src1_const) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vcmp, {t, cmp, bits, src0, src1, 0, 1, 1, 8, src1_const ? 0 : 8});
}

void vec_select(KernelBuilder& b, Dtype t, Opnd dst, Opnd src0, Opnd src1, Opnd bits,
                const Reg& count, bool src0_const, bool src1_const) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vsel,
         {t, dst, src0, src1, bits, 0, 1, 1, 1, 8, src0_const ? 0 : 8, src1_const ? 0 : 8});
}

void vec_fill_repeat(KernelBuilder& b, Dtype t, uint64_t dst, double value) {
  Reg bits = b.reg("constant");
  Reg count = b.reg_imm("constant lanes", kRepeatBytes / isa::dtype_size(t));
  b.movi(bits, vector_scalar_bits(t, value));
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vdup, {t, dst, bits, 0, 1, 8});
}

int64_t vector_scalar_bits(Dtype t, double value) {
  if (isa::dtype_is_float(t)) return static_cast<int64_t>(f32_to_bits(static_cast<float>(value)));
  return static_cast<int64_t>(value);
}

void emit_block_range(KernelBuilder& b, const Reg& pos, const Reg& end, int64_t per, int64_t n) {
  KernelBuilder::Origin o(b, fmt::format("block range: {} elements per block", per));
  b.emit(Opcode::op_get_block_id, {pos});
  b.mul(pos, pos, per);
  b.add(end, pos, per);
  b.min(end, end, n);
}

// ---- shared reads in staggered parts ----

namespace {

// NPUSIM_STAGGERED_SHARED_READS: unset or "1" on, "0" off; anything else a CompileError naming
// the variable and op. Read at every compile.
bool staggered_shared_reads_enabled(const std::string& op) {
  const char* v = std::getenv("NPUSIM_STAGGERED_SHARED_READS");
  if (!v || std::string_view(v) == "1") return true;
  if (std::string_view(v) == "0") return false;
  throw CompileError(
      fmt::format("{}: NPUSIM_STAGGERED_SHARED_READS='{}' is neither '0' nor '1'", op, v));
}

}  // namespace

SharedReadParts plan_shared_read_parts(const ChipConfig& cfg, int64_t piece_bytes,
                                       int64_t block_dim, const std::string& op) {
  const double line_rate = cfg.l2_line_read_bytes_per_cycle;  // R, bytes per cycle
  const int64_t line = cfg.l2_line_bytes;
  if (line_rate <= 0 || block_dim <= 1 || line <= 0 || line % kBlockBytes != 0 ||
      piece_bytes <= line || !staggered_shared_reads_enabled(op))
    return {};
  const double port = cfg.l2_read_bytes_per_cycle;  // 0: no port limit
  // One load of `bytes` with `sharers` blocks on its lines: the DMA's issue or its bytes at
  // the line's share, whichever is longer.
  const auto load_cycles = [&](int64_t bytes, int64_t sharers) {
    const double share = line_rate / static_cast<double>(sharers);
    const double rate = port > 0 ? std::min(port, share) : share;
    return std::max(copy_issue_estimate(cfg, 1, bytes, bytes), static_cast<double>(bytes) / rate);
  };
  const int64_t lines = ceil_div(piece_bytes, line);
  double best = load_cycles(piece_bytes, block_dim);  // unsplit: every block in step on it
  SharedReadParts plan;
  for (int64_t per = 1; per < lines; ++per) {
    const int64_t parts = ceil_div(lines, per), sharers = ceil_div(block_dim, parts);
    const double cycles = static_cast<double>(parts) * load_cycles(per * line, sharers);
    if (cycles < best) {
      best = cycles;
      plan = {per * line, parts, sharers};
    }
  }
  return plan;
}

int64_t shared_read_part_at(int64_t parts, int64_t block, int64_t step) {
  return (block + step) % parts;
}

// ---- the streaming kernel ----

namespace {

enum class Access { kFlat, kResident, kGather };

const char* access_name(Access a) {
  return a == Access::kFlat ? "flat" : a == Access::kResident ? "resident" : "gather";
}

struct InputPlan {
  Access access = Access::kFlat;
  int size = 0;        // bytes per element
  int64_t period = 0;  // kResident: the broadcast period (1 for a splat)
  Twin buf;            // UB tiles (kResident: one)
  // StreamInput::part_only taken: a resident splat of kResidentPart elements.
  bool part_only = false;
};

bool needs_scratch(const BroadcastView& v) {
  return !v.dims.empty() && v.strides.back() != 0;  // pieces are contiguous runs
}

// The kernel's UB buffers for the inputs' current accesses, in tile elements, in allocation
// order: the input tiles (two per streamed input, one per resident input), two tiles per output,
// the gather scratch (a piece's phase adds up to one block), the spec's temporaries. The gather
// scratch is reserved wherever an input could be gathered in contiguous runs (a tile's, or a
// resident one), as the tile plan has always counted it; where every such input is resident and
// loaded whole (gather_scratch_size() 0) it is dead UB, and the first accumulator
// (StreamSpec::accumulators) that fits in it lives there: its UB does not shrink the tile.
// (Dropping the dead reservation instead makes the tiles larger, and measured slower for
// BNTrainingReduceGrad on the 910b: docs/graph_engine.md, the bias gradients' accumulator.)
struct StreamBuffers {
  BufferPlan plan;
  std::vector<BufferPlan::Id> in, out, temp;
  BufferPlan::Id scratch = -1;
  // The temporary (index into StreamSpec::temps) that lives in the gather scratch instead of a
  // buffer of its own; -1: none (StreamEmitter::declare_buffers).
  int temp_in_scratch = -1;
};

// The registers of one gather loop, allocated in declaration order.
struct GatherRegs {
  explicit GatherRegs(KernelBuilder& b)
      : f(b.reg("gather: end of the piece")),
        row(b.reg("gather: row / offsets")),
        a(b.reg("gather: start of the piece")),
        src(b.reg("gather: source address")),
        t(b.reg("gather: temporary")),
        rest(b.reg("gather: row index / destination")) {}
  Reg f, row, a, src, t, rest;
  // The last piece loaded in this tile (StreamEmitter::emit_gather's row reuse): its source
  // address, its destination in the tile and its elements (0: none yet). Absent without reuse.
  std::optional<Reg> last_src, last_dst, last_len;
};

// Builds one streaming kernel (elementwise.h): the planning steps choose the inputs' accesses,
// the tile and the work split from one BufferPlan; the emitting steps follow program order.
class StreamEmitter {
 public:
  StreamEmitter(const std::string& op, const StreamSpec& spec, const ChipConfig& cfg);
  // Multi-tensor mode (build_multi_stream_kernel): one segment per spec.
  StreamEmitter(const std::string& op, const std::vector<StreamSpec>& segments,
                const ChipConfig& cfg);
  Launch build();
  // Plans the inputs' accesses and the tile only; true if every broadcast input stays resident.
  bool keeps_resident();
  // Plans the inputs' accesses only; the elements a tile holds (fit_tile()).
  int64_t tile_capacity();

 private:
  void plan_inputs();
  void plan_segment_inputs();
  void plan_segment_ranges();
  void emit_block_bounds(const Reg& id, const Reg& first, const Reg& last, int lo, int hi,
                         const Label& done);
  void emit_segments(Launch& launch);
  StreamBuffers declare_buffers() const;
  int64_t fit_tile() const;
  void plan_tiles();
  void plan_tile_once();  // plan_tiles() with or without pieces (m_pieces)
  void plan_l2();

  void allocate();
  void load_args(Launch& launch);
  void init_flags();
  // Builds the resident tiles: one period gathered, then (doubled) repeated over the tile.
  // first_tile_loads (if given) is emitted right after the direct resident loads, before their
  // flag (first_tile_ahead).
  void build_resident_inputs(bool doubled = true,
                             const std::function<void()>& first_tile_loads = {});
  // Whether the block's first tile is loaded together with the resident inputs loaded straight
  // into their tiles, so that the two round trips overlap (build()).
  bool first_tile_ahead() const;
  void double_resident_input(size_t k);
  int64_t resident_built(size_t k) const;
  // Whether input k is resident and loaded straight into its tile, one contiguous run (no
  // gather scratch): a per-channel vector whose period is the resident period, in whole 32-byte
  // blocks (build_resident_inputs).
  bool resident_loaded_whole(size_t k) const;
  // Bytes per element of the gather scratch the inputs' accesses need: the largest element of
  // an input gathered in contiguous runs (a tile's, or a resident one not loaded whole); 0: none.
  int gather_scratch_size() const;
  void compute_resident();      // StreamSpec::resident_compute, once before the tile loop
  void check_resident() const;  // what resident_per_period and resident_stores need
  // The period of the resident inputs as planned so far: the lcm of theirs and the granule.
  int64_t resident_period() const;
  // StreamSpec::work_piece's elements for the inputs as planned so far; 0 without pieces.
  int64_t work_piece() const;
  void store_resident_results();  // StreamSpec::resident_stores
  void emit_tile(int q, const Label& drain);
  // emit_tile's two halves: its range check, element count and loads (MTE2, gathers), then its
  // compute and store once the loads have landed.
  void emit_tile_loads(int q, const Label& drain);
  void emit_tile_compute(int q);
  void load_flat_inputs(int q);
  void compute(int q);
  void store_outputs(int q);
  void emit_drain();
  void emit_gather(int k, uint64_t buf, const Reg& pos, const Reg& cnt, bool reuse_rows);
  // Shared reads staggered (plan_shared_read_parts): each input's part bytes (0: one load a
  // piece), planned once the blocks and the tile are; and a piece's load in parts from this
  // block's part on (g.src, g.t blocks into the gather scratch).
  // load_in_parts: `blocks` (clobbered: the load's end) 32-byte blocks of input k from GM
  // `src` to UB `dst` in parts, `first_block` a scratch register.
  void plan_shared_reads();
  void load_in_parts(int k, const Reg& src, const Reg& first_block, const Reg& blocks,
                     uint64_t dst);
  void add_outer_offsets(const BroadcastView& v, int size, GatherRegs& g);
  void fill_piece(int k, int size, bool contiguous, const Reg& pos, uint64_t buf, GatherRegs& g);
  std::string summary() const;
  // StreamSpec::blocked_row: the longest row of the spec or of any segment (0: none), checked;
  // the elements of a tile of the current segment (m_tile, whole rows of its blocked_row);
  // store_outputs' copies of a blocked output tile.
  int64_t blocked_row_max() const;
  int64_t segment_tile() const;
  void store_blocked_output(int q);

  KernelBuilder m_b;
  const StreamSpec* m_spec;  // the segment being emitted (the only one outside multi mode)
  // Multi-tensor mode: the segments' specs, each one's access per input, and its first
  // element in the concatenated range (each segment padded to whole output granules).
  std::vector<const StreamSpec*> m_segments;
  std::vector<std::vector<Access>> m_seg_access;
  std::vector<int64_t> m_seg_start;
  const isa::CoreKind m_kind;
  const CoreKindConfig& m_core;
  std::vector<isa::Dtype> m_out_types;  // out_type, then more_out_types
  int64_t m_n = 1;                      // output elements
  int64_t m_granule = 0;                // output elements per 32-byte block (smallest output)
  std::vector<InputPlan> m_in;
  std::vector<SharedReadParts> m_shared_parts;  // per input (plan_shared_reads)
  int m_scratch_size = 0;                       // bytes per element of the gather scratch; 0: none
  bool m_any_flat = false;
  int64_t m_period = 0;  // tiles and block ranges are whole multiples of it
  int64_t m_tile = 0;    // elements per tile
  // Elements of the resident tiles and temporaries: m_tile, or a piece of it (work_piece()).
  int64_t m_piece = 0;
  bool m_pieces = false;  // StreamSpec::work_piece taken (plan_tiles)
  int64_t m_per = 0;      // elements per block (balanced ranges: the longest range)
  int m_block_dim = 0;
  // Multi-tensor mode, ranges balanced over the segments (plan_segment_ranges): block b's range
  // of the concatenated segments is [m_bounds[b], m_bounds[b + 1]). Empty: m_per each.
  std::vector<int64_t> m_bounds;

  std::vector<Twin> m_out_buf;
  uint64_t m_scratch = 0;
  std::vector<uint64_t> m_temp;
  FlagPair m_in_free, m_in_ready, m_out_ready, m_out_free;
  int m_scratch_free = -1;    // flag v -> mte2: scratch may be overwritten
  int m_scratch_ready = -1;   // flag mte2 -> v: scratch loaded
  int m_resident_ready = -1;  // flag mte2 -> v: resident inputs loaded straight into their tiles
  // Multi-tensor mode: whether segment g streams (flat) an input that segment g - 1 held as a
  // resident tile in the ping tile of that input's buffer. Every tile's compute of g - 1 reads
  // it, the last maybe a pong tile computed after the ping tile's free flag was set, so g's
  // first loads into that ping tile wait for V to drain (pipe_barrier V).
  bool resident_then_flat(size_t g) const;
  std::vector<Reg> m_in_addr, m_out_addr, m_rout_addr;
  Reg m_pos, m_end, m_cnt;  // tile start, end of this block's range, elements in this tile
  // StreamSpec::stagger_first_tiles: the elements the next tile may hold at most (this block's
  // first tile: its staggered share, then m_tile). Absent without staggering.
  std::optional<Reg> m_tile_limit;
  void init_stagger();
  // The L2 policies of the flat inputs and of the outputs: plan_l2().
  isa::L2Hint m_in_l2 = isa::L2Hint::NORMAL, m_out_l2 = isa::L2Hint::NORMAL;
};

StreamEmitter::StreamEmitter(const std::string& op, const StreamSpec& spec, const ChipConfig& cfg)
    : m_b(spec.kernel_name, op, cfg),
      m_spec(&spec),
      m_kind(m_b.vector_core_kind()),
      m_core(*cfg.core_kind(m_kind)) {
  m_out_types.push_back(spec.out_type);
  m_out_types.insert(m_out_types.end(), spec.more_out_types.begin(), spec.more_out_types.end());
  for (int64_t d : spec.out_shape) m_n *= d;
  if (m_n <= 0) m_b.fail("internal: build_stream_kernel needs a non-empty output");
  int osize = kBlockBytes;
  for (isa::Dtype t : m_out_types) osize = std::min(osize, isa::dtype_size(t));
  m_granule = kBlockBytes / osize;
}

StreamEmitter::StreamEmitter(const std::string& op, const std::vector<StreamSpec>& segments,
                             const ChipConfig& cfg)
    : StreamEmitter(op, segments.at(0), cfg) {
  const StreamSpec& first = segments[0];
  m_n = 0;
  for (size_t g = 0; g < segments.size(); ++g) {
    const StreamSpec& s = segments[g];
    bool period_only = false;
    for (const StreamInput& in : s.inputs) period_only |= in.period_only;
    for (const TempSpec& t : s.temps) period_only |= t.period_only;
    if (s.resident_per_period || !s.resident_stores.empty() || period_only || s.work_piece)
      m_b.fail(fmt::format(
          "internal: multi-tensor segment {} asks for resident_per_period, resident_stores, "
          "period-only buffers or work pieces, which only build_stream_kernel supports",
          g));
    if (s.inputs.size() != first.inputs.size() || s.out_type != first.out_type ||
        s.more_out_types != first.more_out_types || s.temps.size() != first.temps.size())
      m_b.fail(
          fmt::format("internal: multi-tensor segment {} differs from segment 0 in its "
                      "inputs, outputs or temporaries",
                      g));
    for (size_t k = 0; k < s.inputs.size(); ++k)
      if (s.inputs[k].type != first.inputs[k].type)
        m_b.fail(fmt::format("internal: multi-tensor segment {}: input {} is {}, segment 0's {}", g,
                             k, isa::dtype_name(s.inputs[k].type),
                             isa::dtype_name(first.inputs[k].type)));
    int64_t n = 1;
    for (int64_t d : s.out_shape) n *= d;
    if (n <= 0) m_b.fail(fmt::format("internal: multi-tensor segment {} is empty", g));
    m_segments.push_back(&s);
    m_seg_start.push_back(m_n);
    m_n += round_up(n, m_granule);
  }
}

void StreamEmitter::plan_inputs() {
  for (const StreamInput& in : m_spec->inputs) {
    InputPlan p;
    p.size = isa::dtype_size(in.type);
    if (in.view.identity()) {
      p.access = Access::kFlat;
    } else if (in.view.splat() || in.view.period() > 0) {
      p.access = Access::kResident;
      p.period = in.view.splat() ? 1 : in.view.period();
    } else {
      p.access = Access::kGather;
    }
    if (p.access != Access::kFlat && p.size == 1)
      m_b.fail("broadcasting a 1-byte input is not supported yet");
    p.part_only = in.part_only && in.view.splat() && !m_spec->resident_results.empty();
    m_in.push_back(p);
  }
}

// Multi-tensor mode: each segment's inputs are flat (its output's shape) or splats (built per
// segment as a resident tile); the declared buffer of an input is two tiles if any segment
// streams it, else one. Every segment has a flat input (FusedVariableUpdate's variables are).
void StreamEmitter::plan_segment_inputs() {
  for (size_t g = 0; g < m_segments.size(); ++g) {
    std::vector<Access> access;
    for (size_t k = 0; k < m_segments[g]->inputs.size(); ++k) {
      const BroadcastView& v = m_segments[g]->inputs[k].view;
      if (v.identity())
        access.push_back(Access::kFlat);
      else if (v.splat())
        access.push_back(Access::kResident);
      else
        m_b.fail(
            fmt::format("internal: multi-tensor segment {}: input {} is neither of the "
                        "output's shape nor one element",
                        g, k));
    }
    if (std::find(access.begin(), access.end(), Access::kFlat) == access.end())
      m_b.fail(fmt::format("internal: multi-tensor segment {} has no input of its shape", g));
    m_seg_access.push_back(access);
  }
  for (size_t k = 0; k < m_segments[0]->inputs.size(); ++k) {
    InputPlan p;
    p.size = isa::dtype_size(m_segments[0]->inputs[k].type);
    p.access = Access::kResident;
    p.period = 1;
    for (const std::vector<Access>& a : m_seg_access)
      if (a[k] == Access::kFlat) p.access = Access::kFlat;
    if (p.access != Access::kFlat && p.size == 1)
      m_b.fail("broadcasting a 1-byte input is not supported yet");
    p.part_only = p.access == Access::kResident &&
                  std::all_of(m_segments.begin(), m_segments.end(), [&](const StreamSpec* s) {
                    return s->inputs[k].part_only && !s->resident_results.empty();
                  });
    m_in.push_back(p);
  }
}

StreamBuffers StreamEmitter::declare_buffers() const {
  StreamBuffers d;
  // StreamSpec's bank windows: one repeat each, span / 256 of them (none: no placement).
  const ChipConfig& cfg = m_b.config();
  const uint64_t span = static_cast<uint64_t>(std::max(0, cfg.ub_banks)) *
                        static_cast<uint64_t>(std::max(0, cfg.ub_bank_width_bytes));
  const uint64_t windows = span % kRepeatBytes == 0 ? span / kRepeatBytes : 0;
  auto place = [&](BufferPlan::Id id, int w) {
    if (w >= 0 && windows > 1)
      d.plan.place(id, span, static_cast<uint64_t>(w) % windows * kRepeatBytes);
    return id;
  };
  int scratch_size = 0;
  // Period-only buffers (StreamInput / TempSpec::period_only): fixed bytes for one period;
  // with pieces, the resident tiles and the temporaries: fixed bytes for one piece.
  const uint64_t period = static_cast<uint64_t>(resident_period());
  const uint64_t piece = static_cast<uint64_t>(work_piece());
  for (size_t k = 0; k < m_in.size(); ++k) {
    const InputPlan& p = m_in[k];
    const bool period_only = m_spec->inputs[k].period_only && p.access == Access::kResident;
    const std::string name = fmt::format("in{} tile", k);
    const uint64_t size = static_cast<uint64_t>(p.size);
    const bool part_only = p.part_only && p.access == Access::kResident;
    d.in.push_back(place(period_only ? d.plan.add(fmt::format("in{} period", k), 0, period * size)
                         : part_only ? d.plan.add(fmt::format("in{} first elements", k), 0,
                                                  static_cast<uint64_t>(kResidentPart) * size)
                         : p.access != Access::kResident ? d.plan.add(name, p.size, 0, 2)
                         : piece                         ? d.plan.add(name, 0, piece * size)
                                                         : d.plan.add(name, p.size, 0),
                         m_spec->inputs[k].window));
    if (p.access != Access::kFlat && needs_scratch(m_spec->inputs[k].view))
      scratch_size = std::max(scratch_size, p.size);
  }
  for (size_t j = 0; j < m_out_types.size(); ++j)
    d.out.push_back(place(d.plan.add(j ? fmt::format("out{} tile", j) : "out tile",
                                     isa::dtype_size(m_out_types[j]), 0, 2),
                          m_spec->out_window));
  d.scratch = d.plan.add("gather scratch", scratch_size, kBlockBytes, 1, scratch_size > 0);
  const auto fixed = [](uint64_t elements, double bytes_per_element) {
    return static_cast<uint64_t>(std::ceil(static_cast<double>(elements) * bytes_per_element));
  };
  // An accumulator of at most scratch_size bytes per element and kBlockBytes more holds a tile
  // or a piece (piece <= tile) within the scratch's tile * scratch_size + kBlockBytes bytes.
  if (scratch_size > 0 && gather_scratch_size() == 0)
    for (size_t i : m_spec->accumulators) {
      const TempSpec& t = m_spec->temps.at(i);
      if (!t.period_only && t.bytes_per_element <= scratch_size && t.fixed_bytes <= kBlockBytes) {
        d.temp_in_scratch = static_cast<int>(i);
        break;
      }
    }
  for (size_t i = 0; i < m_spec->temps.size(); ++i) {
    const TempSpec& t = m_spec->temps[i];
    const bool own = static_cast<int>(i) != d.temp_in_scratch;
    d.temp.push_back(place(
        t.period_only ? d.plan.add(t.name, 0, fixed(period, t.bytes_per_element), 1, own)
        : piece ? d.plan.add(t.name, 0, fixed(piece, t.bytes_per_element) + t.fixed_bytes, 1, own)
                : d.plan.add(t.name, t.bytes_per_element, t.fixed_bytes, 1, own),
        t.window));
  }
  return d;
}

// The most multiples of kTileQuantum elements whose buffers fit in the UB with one alignment
// unit of slack each (a bound of what alignment adds, whatever the layout; the tile therefore
// does not depend on how the sizes round), 0 if none.
int64_t StreamEmitter::fit_tile() const {
  const uint64_t ub = m_core.capacity(isa::Buf::UB);
  const BufferPlan plan = declare_buffers().plan;
  const uint64_t slack = static_cast<uint64_t>(plan.allocations(kTileQuantum)) *
                         KernelBuilder::alignment(m_b.config(), isa::Buf::UB);
  if (slack >= ub) return 0;
  return plan.fit(ub - slack, 1, kTileQuantum, static_cast<int64_t>(ub));
}

// The tile: fit_tile() rounded down to whole periods. Resident periods must divide the tile:
// the longest is demoted to a gather until the period (their lcm with the granule) fits. Then
// the split: each block takes `per` elements (whole periods and 32-byte output blocks) and the
// tile is at most `per`.
int64_t StreamEmitter::resident_period() const {
  int64_t period = m_granule;
  for (const InputPlan& p : m_in)
    if (p.access == Access::kResident) period = std::lcm(period, p.period);
  // One stream's blocked rows: tiles and block ranges of whole rows. (Multi-tensor mode rounds
  // each segment's range to its rows instead: emit_segments.)
  if (m_segments.empty() && m_spec->blocked_row > 0) period = std::lcm(period, m_spec->blocked_row);
  return period;
}

int64_t StreamEmitter::blocked_row_max() const {
  int64_t row = 0;
  const std::vector<const StreamSpec*> specs =
      m_segments.empty() ? std::vector<const StreamSpec*>{m_spec} : m_segments;
  for (const StreamSpec* s : specs) {
    if (s->blocked_row <= 0) continue;
    const int size = isa::dtype_size(s->out_type);
    const int64_t n =
        std::accumulate(s->out_shape.begin(), s->out_shape.end(), int64_t{1}, std::multiplies<>());
    if (!s->more_out_types.empty() || (s->blocked_row * size) % kBlockBytes != 0 ||
        s->blocked_row * size / kBlockBytes > 65536 || n % s->blocked_row != 0)
      m_b.fail(fmt::format(
          "internal: {}: blocked store of rows of {} elements of {} over {} elements: it needs "
          "one output, rows of whole 32-byte blocks (at most 65,536) and whole rows",
          s->kernel_name, s->blocked_row, isa::dtype_name(s->out_type), n));
    if (!m_segments.empty() && s->stagger_first_tiles)
      m_b.fail("internal: a blocked store in a multi-tensor launch with staggered first tiles");
    row = std::max(row, s->blocked_row);
  }
  return row;
}

int64_t StreamEmitter::segment_tile() const {
  const int64_t row = m_spec->blocked_row;
  return row > 0 ? m_tile / row * row : m_tile;
}

// StreamSpec::work_piece rounded up to whole periods, and to whole bank spans of each flat
// input and output tile (a piece's offset into them) where that stays within twice the asked
// elements.
int64_t StreamEmitter::work_piece() const {
  const int64_t asked = m_spec->work_piece;
  if (!m_pieces || asked <= 0) return 0;
  const int64_t period = resident_period();
  const ChipConfig& cfg = m_b.config();
  const int64_t span = static_cast<int64_t>(std::max(0, cfg.ub_banks)) *
                       static_cast<int64_t>(std::max(0, cfg.ub_bank_width_bytes));
  int64_t unit = period;
  if (span > 0) {
    std::vector<int> sizes;
    for (const InputPlan& p : m_in)
      if (p.access == Access::kFlat) sizes.push_back(p.size);
    for (isa::Dtype t : m_out_types) sizes.push_back(isa::dtype_size(t));
    for (int size : sizes) unit = std::lcm(unit, span / std::gcd(span, int64_t{size}));
  }
  const int64_t spans = round_up(asked, unit);
  return spans <= 2 * asked ? spans : round_up(asked, period);
}

void StreamEmitter::plan_tiles() {
  m_pieces = false;
  plan_tile_once();
  const StreamSpec& s = *m_spec;
  if (s.work_piece > 0 && ceil_div(m_per, m_tile) >= s.work_piece_min_tiles) {
    m_pieces = true;
    plan_tile_once();
  }
}

void StreamEmitter::plan_tile_once() {
  const uint64_t ub = m_core.capacity(isa::Buf::UB);
  for (;;) {
    const int64_t fit = fit_tile();
    m_period = resident_period();
    InputPlan* longest = nullptr;
    for (InputPlan& p : m_in) {
      if (p.access != Access::kResident) continue;
      if (!longest || p.period > longest->period) longest = &p;
    }
    if (fit == 0)
      m_b.fail(
          fmt::format("not even {} elements per tile fit in the {} bytes of UB", kTileQuantum, ub));
    if (m_period <= fit) {
      m_tile = fit / m_period * m_period;
      break;
    }
    if (!longest)  // the period is the blocked rows' (StreamSpec::blocked_row)
      m_b.fail(fmt::format("a tile of {} elements cannot hold a row of {} (the blocked store)", fit,
                           m_spec->blocked_row));
    longest->access = Access::kGather;  // its period does not fit a tile: gather it per tile
  }
  if (m_bounds.empty()) {
    m_per = round_up(ceil_div(m_n, m_core.count), m_period);
    m_block_dim = static_cast<int>(ceil_div(m_n, m_per));
  } else {  // balanced ranges (plan_segment_ranges): the tile may reach the longest
    m_per = 0;
    for (size_t b = 0; b + 1 < m_bounds.size(); ++b)
      m_per = std::max(m_per, m_bounds[b + 1] - m_bounds[b]);
  }
  m_tile = std::min(m_tile, m_per);
  // Multi-tensor mode: a tile holds a row of every blocked segment (segment_tile()).
  const int64_t row = m_segments.empty() ? 0 : blocked_row_max();
  if (row > 0) m_tile = std::max(m_tile, round_up(row, m_period));
  // Placed buffers (bank windows): the padding depends on where each buffer lands, so the
  // tile's own layout is checked, a period less until it fits.
  const BufferPlan plan = declare_buffers().plan;
  if (plan.has_placed()) {
    const uint64_t align = KernelBuilder::alignment(m_b.config(), isa::Buf::UB);
    while (m_tile > m_period && plan.extent(m_tile, align) > ub) m_tile -= m_period;
  }
  if (row > 0 && (m_tile < row || m_tile > fit_tile()))
    m_b.fail(fmt::format("a tile of {} elements cannot hold a row of {} (the blocked store)",
                         fit_tile(), row));
  m_piece = work_piece() ? std::min(work_piece(), m_tile) : m_tile;
  for (size_t k = 0; k < m_in.size(); ++k) {
    if (m_in[k].access == Access::kFlat)
      m_any_flat = true;
    else if (needs_scratch(m_spec->inputs[k].view))
      m_scratch_size = std::max(m_scratch_size, m_in[k].size);
  }
}

int StreamEmitter::gather_scratch_size() const {
  int size = 0;
  for (size_t k = 0; k < m_in.size(); ++k)
    if (m_in[k].access != Access::kFlat && needs_scratch(m_spec->inputs[k].view) &&
        !resident_loaded_whole(k))
      size = std::max(size, m_in[k].size);
  return size;
}

// Flat inputs are read once and outputs written once. Streams larger than the L2 cannot still
// be there when the next kernel reads them (under LRU each evicts its own start), so
// allocating their lines would only evict lines that can be read again: this kernel's resident
// and gathered inputs (read by every core), weights and other small tensors of the kernels
// around it. So (as CANN marks such tensors not cacheable, and as Huawei's Add sample disables
// its inputs' L2 allocation): flat inputs move with noalloc when inputs and outputs together
// exceed the L2; outputs do when they alone exceed it. An output that fits stays normal, so the
// next kernel can hit on it when the L2 is kept across launches. NPUSIM_L2_STREAM_POLICY=0 in
// the environment keeps every stream normal (to measure what the policy gains; read once per
// process, so the kernel cache never mixes the two).
void StreamEmitter::plan_l2() {
  static const bool enabled = [] {
    const char* v = std::getenv("NPUSIM_L2_STREAM_POLICY");
    return !(v && std::strcmp(v, "0") == 0);
  }();
  // With the L2 cold at every launch and written through, no later launch can read a stream's
  // lines and no write is absorbed, so the policy cannot help there; it was measured to cost up
  // to 6 % (an 8192^2 f16 AddV2 on 910b): a tile ending inside a line leaves it allocated for
  // the next tile, which a noalloc read misses. So streams stay normal on such a chip.
  const ChipConfig& cfg = m_b.config();
  if (!enabled || !(cfg.l2_keep_across_launches || cfg.l2_write_back)) return;
  uint64_t in_bytes = 0, out_bytes = 0;
  const uint64_t n = static_cast<uint64_t>(m_n);
  for (const InputPlan& p : m_in)
    if (p.access == Access::kFlat) in_bytes += static_cast<uint64_t>(p.size) * n;
  for (isa::Dtype t : m_out_types) out_bytes += static_cast<uint64_t>(isa::dtype_size(t)) * n;
  const uint64_t l2 = cfg.l2_bytes;
  m_in_l2 = in_bytes + out_bytes > l2 ? isa::L2Hint::NOALLOC : isa::L2Hint::NORMAL;
  m_out_l2 = out_bytes > l2 ? isa::L2Hint::NOALLOC : isa::L2Hint::NORMAL;
}

void StreamEmitter::allocate() {
  const StreamBuffers d = declare_buffers();
  const BufferPlan::Placed at = d.plan.allocate(m_b, m_tile);
  for (size_t k = 0; k < m_in.size(); ++k) m_in[k].buf = at.twin(d.in[k]);
  for (BufferPlan::Id id : d.out) m_out_buf.push_back(at.twin(id));
  m_scratch = at[d.scratch];
  for (size_t i = 0; i < d.temp.size(); ++i)
    m_temp.push_back(static_cast<int>(i) == d.temp_in_scratch ? m_scratch : at[d.temp[i]]);
}

// Arguments in0..in<n-1>, out, out1.., their addresses, and this block's range [pos, end).
void StreamEmitter::load_args(Launch& launch) {
  for (size_t k = 0; k < m_spec->inputs.size(); ++k) {
    m_b.declare_arg(fmt::format("in{}", k), m_spec->inputs[k].type, m_spec->inputs[k].shape);
    launch.args.push_back(ArgRef{ArgRef::Kind::kInput, static_cast<int>(k), 0});
  }
  for (size_t j = 0; j < m_out_types.size(); ++j) {
    m_b.declare_arg(j ? fmt::format("out{}", j) : "out", m_out_types[j], m_spec->out_shape);
    launch.args.push_back(ArgRef{ArgRef::Kind::kOutput, static_cast<int>(j), 0});
  }
  for (size_t k = 0; k < m_spec->inputs.size(); ++k)
    m_in_addr.push_back(m_b.load_arg(fmt::format("in{}", k)));
  for (size_t i = 0; i < m_spec->resident_stores.size(); ++i) {
    const StreamSpec::ResidentStore& r = m_spec->resident_stores[i];
    m_b.declare_arg(fmt::format("rout{}", i), m_spec->inputs.at(r.input).type, {r.elements});
    launch.args.push_back(
        ArgRef{ArgRef::Kind::kOutput, static_cast<int>(m_out_types.size() + i), 0});
  }
  for (int i = 0; i < m_spec->tail_args; ++i)
    launch.args.push_back(
        ArgRef{ArgRef::Kind::kOutput,
               static_cast<int>(m_out_types.size() + m_spec->resident_stores.size()) + i, 0});
  for (size_t j = 0; j < m_out_types.size(); ++j)
    m_out_addr.push_back(m_b.load_arg(j ? fmt::format("out{}", j) : "out"));
  for (size_t i = 0; i < m_spec->resident_stores.size(); ++i)
    m_rout_addr.push_back(m_b.load_arg(fmt::format("rout{}", i)));
  m_pos = m_b.reg("tile start");
  m_end = m_b.reg("end of this block's range");
  m_cnt = m_b.reg("tile elements");
  emit_block_range(m_b, m_pos, m_end, m_per, m_n);
}

// Input tiles: loaded by MTE2, read by V; output tiles: written by V, stored by MTE3; the gather
// scratch: loaded by MTE2, read by V. All start free.
void StreamEmitter::init_flags() {
  if (m_any_flat) {
    m_in_free = m_b.flag_pair(Pipe::V, Pipe::MTE2, "input tile free");
    m_in_ready = m_b.flag_pair(Pipe::MTE2, Pipe::V, "input tile loaded");
  }
  m_out_ready = m_b.flag_pair(Pipe::V, Pipe::MTE3, "output tile computed");
  m_out_free = m_b.flag_pair(Pipe::MTE3, Pipe::V, "output tile stored");
  if (m_scratch_size) {
    m_scratch_free = m_b.flag(Pipe::V, Pipe::MTE2, "gather scratch free");
    m_scratch_ready = m_b.flag(Pipe::MTE2, Pipe::V, "gather scratch loaded");
  }
  KernelBuilder::Origin o(m_b, "all buffers start free");
  for (int q = 0; q < 2; ++q) {
    if (m_any_flat) m_b.set_flag(m_in_free, q);
    m_b.set_flag(m_out_free, q);
  }
  if (m_scratch_size) m_b.set_flag(Pipe::V, Pipe::MTE2, m_scratch_free);
}

// Resident inputs: one period (or, for a splat, the whole tile, unless resident_compute runs
// per period) gathered, then doubled. An input whose period is that built part and whole 32-byte
// blocks (a per-channel vector of C * size a multiple of 32 bytes, the period C) is one
// contiguous run from its start: those are loaded straight into their tiles, one load each,
// all issued before the one wait for them (no gather scratch, its round trip and its vector
// copy per input).
void StreamEmitter::build_resident_inputs(bool doubled,
                                          const std::function<void()>& first_tile_loads) {
  std::vector<size_t> direct, gathered;
  for (size_t k = 0; k < m_in.size(); ++k) {
    const InputPlan& p = m_in[k];
    if (p.access != Access::kResident) continue;
    (resident_loaded_whole(k) ? direct : gathered).push_back(k);
  }
  if (!direct.empty()) {
    if (m_resident_ready < 0)
      m_resident_ready = m_b.flag(Pipe::MTE2, Pipe::V, "resident inputs loaded");
    for (size_t k : direct) {
      KernelBuilder::Origin o(m_b, fmt::format("resident in{}: period {}, loaded", k, m_period));
      const int64_t blocks = m_period * m_in[k].size / kBlockBytes;
      if (m_shared_parts[k].part_bytes > 0) {
        Reg first = m_b.reg("resident: first block"), end = m_b.reg_imm("resident: blocks", blocks);
        load_in_parts(static_cast<int>(k), m_in_addr[k], first, end, m_in[k].buf[0]);
        continue;
      }
      m_b.emit(Opcode::op_copy_gm2ub, {m_in[k].buf[0], m_in_addr[k], 1, blocks, 0, 0},
               fmt::format("load in{}'s period", k));
    }
    if (first_tile_loads) first_tile_loads();
    m_b.set_flag(Pipe::MTE2, Pipe::V, m_resident_ready);
  }
  for (size_t k : gathered) {
    const InputPlan& p = m_in[k];
    KernelBuilder::Origin o(m_b, fmt::format("resident in{}: period {}", k, p.period));
    const int64_t built = resident_built(k);
    Reg zero = m_b.reg_imm("resident: position 0", 0);
    Reg len = m_b.reg_imm("resident: elements", built);
    emit_gather(static_cast<int>(k), p.buf[0], zero, len, false);
    if (doubled) double_resident_input(k);
  }
  if (direct.empty()) return;
  m_b.wait_flag(Pipe::MTE2, Pipe::V, m_resident_ready, "resident inputs loaded");
  if (doubled)
    for (size_t k : direct) double_resident_input(k);
}

// A load's set_flag holds MTE2 until its transfers have landed (sync.set_flag_holds_pipe), so
// a block that loads its resident inputs, then flags them, then loads its first tile waits two
// memory round trips before its first tile's compute. Where the resident inputs are all loaded
// straight into their tiles (no gather, which needs V between its loads) and every other input
// is flat, the first tile's loads are issued right after the resident ones, before their flag:
// one round trip for both; the resident work then runs once both have landed. Every block of
// build_stream_kernel has at least one element (block_dim = ceil(n / per)), so the first tile
// is never empty; its branch to the drain stays as a guard, skipping the resident flag's set
// and wait together. Only with staggered first tiles (m_tile_limit; without, a whole first
// tile's round trip no longer overlaps the resident work and was measured slower on the 910b)
// and on split chips (on the coupled 310P, whose DDR the stagger serves too, it was measured
// slower: docs/compiler.md "The first tile with the resident inputs").
bool StreamEmitter::first_tile_ahead() const {
  if (!m_any_flat || !m_segments.empty() || !m_tile_limit || !m_b.config().split) return false;
  bool direct = false;
  for (size_t k = 0; k < m_in.size(); ++k) {
    if (m_in[k].access == Access::kGather) return false;
    if (m_in[k].access != Access::kResident) continue;
    if (!resident_loaded_whole(k)) return false;
    direct = true;
  }
  return direct;
}

// The elements of resident input k built before doubling: a splat's whole tile (or piece; its
// first kResidentPart elements if part_only), else one period.
int64_t StreamEmitter::resident_built(size_t k) const {
  if (m_in[k].part_only) return std::min(m_piece, kResidentPart);
  return m_spec->inputs[k].view.splat() && !m_spec->resident_per_period ? m_piece : m_period;
}

bool StreamEmitter::resident_loaded_whole(size_t k) const {
  const InputPlan& p = m_in[k];
  const BroadcastView& v = m_spec->inputs[k].view;
  // (resident_built's elements: one period, for a resident input that is not a splat)
  const int64_t period = resident_period();
  return p.access == Access::kResident && !p.part_only && !v.splat() && v.period() == period &&
         (period * p.size) % kBlockBytes == 0;
}

// Repeats resident input k's first period (m_period elements) over its tile (or piece); a
// part_only input keeps its first elements only.
void StreamEmitter::double_resident_input(size_t k) {
  const InputPlan& p = m_in[k];
  const int64_t built = resident_built(k);
  const int64_t extent = p.part_only ? built : m_piece;
  for (int64_t have = built; have < extent;) {
    const int64_t more = std::min(have, extent - have);
    vec_copy_bits(m_b, p.size, p.buf[0] + static_cast<uint64_t>(have * p.size), p.buf[0], more);
    have += more;
  }
}

void StreamEmitter::check_resident() const {
  const StreamSpec& s = *m_spec;
  bool period_only = false;
  for (const StreamInput& in : s.inputs) period_only |= in.period_only;
  for (const TempSpec& t : s.temps) period_only |= t.period_only;
  if (period_only && !s.resident_per_period)
    m_b.fail("internal: period-only inputs or temporaries need resident_per_period");
  if (!s.resident_per_period && s.resident_stores.empty()) return;
  if (s.resident_per_period && (!s.resident_compute || !s.resident_results.empty()))
    m_b.fail("internal: resident_per_period needs resident_compute and no resident_results");
  for (size_t k = 0; k < m_in.size(); ++k)
    if (m_in[k].access == Access::kGather)
      m_b.fail(fmt::format(
          "internal: input {} is gathered per tile (not periodic, or its period does not fit a "
          "tile), and resident_per_period / resident_stores need every broadcast input "
          "resident (check stream_keeps_resident first)",
          k));
  for (const StreamSpec::ResidentStore& r : s.resident_stores) {
    const InputPlan* p = r.input < m_in.size() ? &m_in[r.input] : nullptr;
    if (!p || p->access != Access::kResident || r.elements <= 0 || r.elements > m_period ||
        (r.elements * p->size) % kBlockBytes != 0)
      m_b.fail(fmt::format(
          "internal: resident store of input {}, {} elements: not a resident input's whole "
          "32-byte blocks within its first {} elements",
          r.input, r.elements, m_period));
  }
}

// Block 0 stores the resident results once resident_compute has written them (V -> MTE3); the
// tiles' compute only reads the resident tiles after that, so the store overlaps the loop.
void StreamEmitter::store_resident_results() {
  KernelBuilder::Origin o(m_b, "resident results: stored by block 0");
  const int computed = m_b.flag(Pipe::V, Pipe::MTE3, "resident results computed");
  m_b.set_flag(Pipe::V, Pipe::MTE3, computed);
  m_b.wait_flag(Pipe::V, Pipe::MTE3, computed);
  Reg block = m_b.reg("block id");
  m_b.emit(Opcode::op_get_block_id, {block});
  m_b.if_(eq(block, 0), [&] {
    for (size_t i = 0; i < m_spec->resident_stores.size(); ++i) {
      const StreamSpec::ResidentStore& r = m_spec->resident_stores[i];
      const InputPlan& p = m_in[r.input];
      m_b.emit(Opcode::op_copy_ub2gm,
               {m_rout_addr[i], p.buf[0], 1, r.elements * p.size / kBlockBytes, 0, 0,
                isa::L2Hint::NORMAL},
               fmt::format("store resident result rout{} (in{})", i, r.input));
    }
  });
}

// StreamSpec::stagger_first_tiles: this block's first tile limit, (id + 1) / block_dim of a
// tile rounded up to whole periods (emit_staggered_first_tile: at least one period, block_dim - 1
// a whole tile). Only where it can pay: the blocks' round trips leave HBM idle
// (load_round_trips_idle_hbm) and a block's range holds at least two tiles (else its one tile
// would only be cut in two, a round trip more).
void StreamEmitter::init_stagger() {
  if (!m_spec->stagger_first_tiles || m_block_dim <= 1 || m_tile <= m_period || m_per < 2 * m_tile)
    return;
  if (!m_segments.empty() && blocked_row_max() > 0) return;  // (refused there: blocked_row_max)
  if (!load_round_trips_idle_hbm(m_b.config(), m_block_dim)) return;
  KernelBuilder::Origin o(m_b, fmt::format("staggered first tile: {} phases", m_block_dim));
  m_tile_limit.emplace(m_b.reg("elements the next tile may hold"));
  const Reg& limit = *m_tile_limit;
  m_b.emit(Opcode::op_get_block_id, {limit});  // (a launch of its own: blocks 0 .. block_dim-1)
  emit_staggered_first_tile(m_b, limit, limit, m_block_dim, m_tile / m_period, m_period);
}

// One tile of the loop (q: 0 ping, 1 pong buffers).
void StreamEmitter::emit_tile(int q, const Label& drain) {
  emit_tile_loads(q, drain);
  emit_tile_compute(q);
}

void StreamEmitter::emit_tile_loads(int q, const Label& drain) {
  KernelBuilder::Origin o(m_b, fmt::format("tile ({})", q ? "pong" : "ping"));
  m_b.branch(ge(m_pos, m_end), drain);
  m_b.sub(m_cnt, m_end, m_pos);
  if (m_tile_limit) {
    m_b.min(m_cnt, m_cnt, *m_tile_limit, "elements in this tile");
    m_b.movi(*m_tile_limit, m_tile, "the later tiles: whole tiles");
  } else {
    m_b.min(m_cnt, m_cnt, segment_tile(), "elements in this tile");
  }
  if (m_any_flat) load_flat_inputs(q);
  for (size_t k = 0; k < m_in.size(); ++k)
    if (m_in[k].access == Access::kGather)
      emit_gather(static_cast<int>(k), m_in[k].buf[q], m_pos, m_cnt, true);
}

void StreamEmitter::emit_tile_compute(int q) {
  KernelBuilder::Origin o(m_b, fmt::format("tile ({})", q ? "pong" : "ping"));
  if (m_any_flat) m_b.wait_flag(m_in_ready, q);
  m_b.wait_flag(m_out_free, q);
  compute(q);
  if (m_any_flat) m_b.set_flag(m_in_free, q);
  m_b.set_flag(m_out_ready, q);
  m_b.wait_flag(m_out_ready, q);
  store_outputs(q);
  m_b.set_flag(m_out_free, q);
  m_b.add(m_pos, m_pos, m_cnt);
}

void StreamEmitter::load_flat_inputs(int q) {
  m_b.wait_flag(m_in_free, q);
  Reg src = m_b.reg("input tile source");
  Reg blocks = m_b.reg("input tile blocks");
  for (size_t k = 0; k < m_in.size(); ++k) {
    if (m_in[k].access != Access::kFlat) continue;
    const int size = m_in[k].size;
    m_b.mul(src, m_pos, size);
    m_b.add(src, src, m_in_addr[k]);
    m_b.mul(blocks, m_cnt, size);
    m_b.add(blocks, blocks, kBlockBytes - 1);
    m_b.shr(blocks, blocks, kLog2Block);
    m_b.emit(Opcode::op_copy_gm2ub, {m_in[k].buf[q], src, 1, blocks, 0, 0, m_in_l2},
             fmt::format("load in{} tile", k));
  }
  m_b.set_flag(m_in_ready, q);
}

void StreamEmitter::compute(int q) {
  const auto operands = [&](int64_t at) {  // the tile's operands from element `at` on
    TileOperands t;
    for (size_t k = 0; k < m_in.size(); ++k) {
      const InputPlan& p = m_in[k];
      t.in.push_back(p.access == Access::kResident ? p.buf[0]
                                                   : p.buf[q] + static_cast<uint64_t>(at * p.size));
    }
    for (size_t j = 0; j < m_out_buf.size(); ++j)
      t.outs.push_back(m_out_buf[j][q] +
                       static_cast<uint64_t>(at * isa::dtype_size(m_out_types[j])));
    t.out = t.outs[0];
    t.temp = m_temp;
    t.tile_elems = m_piece;
    return t;
  };
  if (m_piece == m_tile) {
    KernelBuilder::Origin c(m_b, "compute");
    TileOperands t = operands(0);
    t.count = &m_cnt;
    m_spec->compute(m_b, t);
    return;
  }
  // The pieces, unrolled (immediate UB addresses); a short tile leaves after its last piece.
  Label done = m_b.label(fmt::format("tile_computed_{}", q));
  Reg count = m_b.reg("piece elements");
  for (int64_t at = 0; at < m_tile; at += m_piece) {
    KernelBuilder::Origin c(m_b, fmt::format("compute: piece at {}", at));
    if (at) m_b.branch(lt(m_cnt, at + 1), done);
    m_b.sub(count, m_cnt, at);
    m_b.min(count, count, m_piece, "elements in this piece");
    TileOperands t = operands(at);
    t.count = &count;
    m_spec->compute(m_b, t);
  }
  m_b.bind(done);
}

void StreamEmitter::compute_resident() {
  TileOperands t;
  for (const InputPlan& p : m_in) t.in.push_back(p.access == Access::kResident ? p.buf[0] : 0);
  t.temp = m_temp;
  const bool part = !m_spec->resident_results.empty();
  const int64_t elems = m_spec->resident_per_period ? m_period
                        : part                      ? std::min(m_piece, kResidentPart)
                                                    : m_piece;
  Reg count = m_b.reg_imm(m_spec->resident_per_period ? "resident work: one period"
                          : part                      ? "resident work: the first elements"
                                                      : "resident work: a whole tile",
                          elems);
  t.count = &count;
  t.tile_elems = m_piece;
  KernelBuilder::Origin c(m_b, "resident work (the same for every tile)");
  m_spec->resident_compute(m_b, t);
  // Each result the tiles read, doubled over the whole tile (its value is the same everywhere).
  for (const auto& [temp, size] : m_spec->resident_results)
    for (int64_t have = elems; have < m_piece;) {
      const int64_t more = std::min(have, m_piece - have);
      vec_copy_bits(m_b, size, m_temp.at(temp) + static_cast<uint64_t>(have * size),
                    m_temp.at(temp), more);
      have += more;
    }
}

void StreamEmitter::store_outputs(int q) {
  if (m_spec->blocked_row > 0) {
    store_blocked_output(q);
    return;
  }
  Reg dst = m_b.reg("output tile destination");
  Reg blocks = m_b.reg("output tile blocks");
  for (size_t j = 0; j < m_out_types.size(); ++j) {
    const int osize = isa::dtype_size(m_out_types[j]);
    m_b.mul(dst, m_pos, osize);
    m_b.add(dst, dst, m_out_addr[j]);
    m_b.mul(blocks, m_cnt, osize);
    m_b.add(blocks, blocks, kBlockBytes - 1);
    m_b.shr(blocks, blocks, kLog2Block);
    m_b.emit(Opcode::op_copy_ub2gm, {dst, m_out_buf[j][q], 1, blocks, 0, 0, m_out_l2},
             j ? fmt::format("store the out{} tile", j) : "store the output tile");
  }
}

// The tile holds rows [pos / row, (pos + cnt) / row) of the output's `rows` rows, each row
// `col_blocks` 32-byte column blocks. Column block c of tile row i is at UB out tile + (i *
// col_blocks + c) * 32 and goes to GM out + (c * rows + pos / row + i) * 32: per column block one
// copy of the tile's rows, bursts of one block, src_gap col_blocks - 1, dst_gap 0 (one GM run).
void StreamEmitter::store_blocked_output(int q) {
  const int64_t row = m_spec->blocked_row;
  const int64_t col_blocks = row * isa::dtype_size(m_out_types[0]) / kBlockBytes;
  const int64_t rows = std::accumulate(m_spec->out_shape.begin(), m_spec->out_shape.end(),
                                       int64_t{1}, std::multiplies<>()) /
                       row;
  KernelBuilder::Origin o(m_b,
                          fmt::format("store in {} column blocks of {} rows", col_blocks, rows));
  Reg dst = m_b.reg("column block's destination");
  Reg src = m_b.reg("column block in the output tile");
  Reg tile_rows = m_b.reg("rows in this tile");
  Reg c = m_b.reg("column block");
  m_b.div(dst, m_pos, row, "the tile's first row");
  m_b.mul(dst, dst, kBlockBytes);
  m_b.add(dst, dst, m_out_addr[0], "its block in column block 0");
  m_b.div(tile_rows, m_cnt, row);
  m_b.movi(src, static_cast<int64_t>(m_out_buf[0][q]));
  m_b.for_range(c, 0, col_blocks, 1, [&] {
    m_b.emit(Opcode::op_copy_ub2gm, {dst, src, tile_rows, 1, col_blocks - 1, 0, m_out_l2},
             "store a column block of the tile's rows");
    m_b.add(dst, dst, rows * kBlockBytes, "the next column block's rows");
    m_b.add(src, src, kBlockBytes);
  });
}

void StreamEmitter::emit_drain() {
  KernelBuilder::Origin o(m_b, "drain: consume the free flags");
  for (int q = 0; q < 2; ++q) {
    if (m_any_flat) m_b.wait_flag(m_in_free, q);
    m_b.wait_flag(m_out_free, q);
  }
  if (m_scratch_size) m_b.wait_flag(Pipe::V, Pipe::MTE2, m_scratch_free);
}

// Fills UB [buf, buf + cnt*size) with input k's values for output positions [pos, pos + cnt),
// pieces from last to first (see elementwise.h). buf must hold output position pos at a 32-byte
// boundary (tiles start at multiples of the output granule). reuse_rows: a tile's gather may
// copy repeated rows within the tile (below); false for a resident input's one build.
void StreamEmitter::emit_gather(int k, uint64_t buf, const Reg& pos, const Reg& cnt,
                                bool reuse_rows) {
  const BroadcastView& v = m_spec->inputs[static_cast<size_t>(k)].view;
  const int size = m_in[static_cast<size_t>(k)].size;
  const int64_t inner = v.dims.back();
  const bool contiguous = v.strides.back() != 0;
  KernelBuilder::Origin origin(m_b, fmt::format("gather in{}: dims {} strides {}", k,
                                                shape_str(v.dims), shape_str(v.strides)));
  GatherRegs g(m_b);
  // Row reuse: when the dim above the contiguous rows is broadcast (an attention mask
  // [B, 1, 1, S] over [B, N, S, S]: each row read S times over in a row), a piece whose
  // source is the previous piece's (pieces go from the tile's end to its start) and no longer
  // is copied from that piece's place in the tile by the vector unit instead of loaded again
  // (the load's round trip through MTE2 and the scratch's flags per row). Only where every
  // piece starts on a 32-byte block (whole-block rows, tiles starting on whole input blocks),
  // so a piece's copy is its source's bytes from the start. Per tile only (reuse_rows): a
  // resident input's one period is built once.
  const size_t rank = v.dims.size();
  const bool reuse = reuse_rows && contiguous && rank >= 2 && v.strides[rank - 2] == 0 &&
                     (inner * size) % kBlockBytes == 0 && (m_granule * size) % kBlockBytes == 0;
  if (reuse) {
    g.last_src.emplace(m_b.reg("gather: source of the last loaded piece"));
    g.last_dst.emplace(m_b.reg("gather: its place in the tile"));
    g.last_len.emplace(m_b.reg("gather: its elements"));
    m_b.movi(*g.last_len, 0, "no piece loaded yet in this tile");
    // Its comparison's outcome does not matter while last_len is 0 (the piece is loaded), but
    // it is set so that it always holds the input's address plus an offset: the timing-only
    // replay's address flow (sim/replay/address_flow.h) then follows fill_piece's comparison
    // of two addresses of one input, whose outcome is the same for the input at any address
    // (a register left at its reset value would mix 0 in).
    m_b.mov(*g.last_src, m_in_addr[static_cast<size_t>(k)], "no piece loaded yet: the input");
  }
  m_b.add(g.f, pos, cnt, "gather: pieces from the end of the tile");
  Label top = m_b.label("gather_in" + std::to_string(k));
  m_b.bind(top);
  m_b.sub(g.row, g.f, 1);
  m_b.div(g.row, g.row, inner, "row = (piece end - 1) / inner dim");
  m_b.mov(g.src, m_in_addr[static_cast<size_t>(k)]);
  add_outer_offsets(v, size, g);
  m_b.mul(g.row, g.row, inner, "row start");
  m_b.max(g.a, g.row, pos, "piece start = max(row start, tile start)");
  if (contiguous) {
    m_b.sub(g.t, g.a, g.row);
    m_b.mul(g.t, g.t, size);
    m_b.add(g.src, g.src, g.t, "source of the piece start");
  }
  fill_piece(k, size, contiguous, pos, buf, g);
  m_b.mov(g.f, g.a);
  m_b.branch(lt(pos, g.f), top);
}

// src += sum over the outer dims d of (index_d * stride_d) * size for the row g.row, innermost
// outer dim first (nothing when every outer dim is broadcast).
void StreamEmitter::add_outer_offsets(const BroadcastView& v, int size, GatherRegs& g) {
  const size_t rank = v.dims.size();
  // nonzero_below[d]: some outer dim before d has a nonzero stride (the row index must still be
  // divided down to reach it).
  std::vector<bool> nonzero_below(rank, false);
  for (size_t d = 1; d < rank; ++d)
    nonzero_below[d] = nonzero_below[d - 1] || v.strides[d - 1] != 0;
  if (rank < 2 || !nonzero_below[rank - 1]) return;
  m_b.mov(g.rest, g.row);
  for (size_t d = rank - 1; d-- > 0;) {
    if (v.strides[d] != 0) {
      m_b.rem(g.t, g.rest, v.dims[d], fmt::format("index in dim {}", d));
      m_b.mul(g.t, g.t, v.strides[d] * size);
      m_b.add(g.src, g.src, g.t);
    }
    if (!nonzero_below[d]) break;
    m_b.div(g.rest, g.rest, v.dims[d]);
  }
}

// Writes the piece [g.a, g.f) of the tile starting at output position pos: from the piece's
// 32-byte block start, a contiguous run through the gather scratch or one broadcast element.
void StreamEmitter::fill_piece(int k, int size, bool contiguous, const Reg& pos, uint64_t buf,
                               GatherRegs& g) {
  const int log2_epb = ceil_log2(kBlockBytes / size);  // elements per 32-byte block
  m_b.sub(g.t, g.a, pos, "piece start in the tile");
  m_b.shr(g.rest, g.t, log2_epb);
  m_b.shl(g.rest, g.rest, log2_epb, "rounded down to a 32-byte block");
  if (contiguous) {
    m_b.sub(g.t, g.t, g.rest);
    m_b.mul(g.t, g.t, size);
    m_b.sub(g.src, g.src, g.t, "load from the block start: the piece lands at its phase");
  }
  m_b.sub(g.f, g.f, pos);
  m_b.sub(g.f, g.f, g.rest, "elements from the block start to the piece end");
  m_b.mul(g.rest, g.rest, size);
  m_b.add(g.rest, g.rest, buf, "destination in the tile");
  if (!contiguous) {
    m_b.emit(Opcode::op_ld, {g.t, g.src}, "the broadcast element (low bits)");
    vec_dup_bits(m_b, size, g.rest, g.t, g.f);
    return;
  }
  std::optional<Label> done;
  if (g.last_len) {
    // The last loaded piece's source and at least this piece's elements: copy it from there.
    const Label load = m_b.label("gather_load");
    done = m_b.label("gather_piece_done");
    m_b.branch(ne(g.src, *g.last_src), load);
    m_b.branch(lt(*g.last_len, g.f), load);
    vec_copy_bits(m_b, size, g.rest, *g.last_dst, g.f);
    m_b.jmp(*done);
    m_b.bind(load);
  }
  m_b.mul(g.t, g.f, size);
  m_b.add(g.t, g.t, kBlockBytes - 1);
  m_b.shr(g.t, g.t, kLog2Block, "blocks to load");
  m_b.wait_flag(Pipe::V, Pipe::MTE2, m_scratch_free, "gather scratch free");
  if (static_cast<size_t>(k) < m_shared_parts.size() &&
      m_shared_parts[static_cast<size_t>(k)].part_bytes > 0)
    load_in_parts(k, g.src, g.row, g.t, m_scratch);
  else
    m_b.emit(Opcode::op_copy_gm2ub, {m_scratch, g.src, 1, g.t, 0, 0},
             fmt::format("load the piece of in{}", k));
  m_b.set_flag(Pipe::MTE2, Pipe::V, m_scratch_ready);
  m_b.wait_flag(Pipe::MTE2, Pipe::V, m_scratch_ready);
  vec_copy_bits(m_b, size, g.rest, m_scratch, g.f);
  m_b.set_flag(Pipe::V, Pipe::MTE2, m_scratch_free);
  if (g.last_len) {
    m_b.mov(*g.last_src, g.src);
    m_b.mov(*g.last_dst, g.rest);
    m_b.mov(*g.last_len, g.f);
    m_b.bind(*done);
  }
}

// Inputs with a broadcast dim above contiguous rows, every block reading the same rows: those
// gathered in contiguous runs (pieces of at most a row, the innermost dim, and a tile), and the
// resident ones loaded whole (one period).
void StreamEmitter::plan_shared_reads() {
  m_shared_parts.assign(m_in.size(), SharedReadParts{});
  for (size_t k = 0; k < m_in.size(); ++k) {
    const BroadcastView& v = m_spec->inputs[k].view;
    if (m_in[k].access == Access::kFlat || !needs_scratch(v) ||
        std::none_of(v.strides.begin(), v.strides.end(), [](int64_t s) { return s == 0; }))
      continue;
    const int64_t piece =
        (resident_loaded_whole(k) ? m_period : std::min(v.dims.back(), m_tile)) * m_in[k].size;
    m_shared_parts[k] =
        plan_shared_read_parts(m_b.config(), piece, m_block_dim, m_spec->kernel_name);
  }
}

// The load's blocks [S, E) counted from the input's start less one part (so that the 32-byte
// block start of a gather's first piece, which may lie before the input, counts from a positive
// offset), part p being blocks [p * P, (p + 1) * P): the parts first .. first + n - 1 the load
// touches, loaded from part first + block_id % n on, wrapping (shared_read_part_at), each a copy
// of its blocks of the load to their place from dst.
void StreamEmitter::load_in_parts(int k, const Reg& src, const Reg& first_block, const Reg& blocks,
                                  uint64_t dst) {
  const SharedReadParts& parts = m_shared_parts[static_cast<size_t>(k)];
  const int64_t P = parts.part_bytes / kBlockBytes;  // blocks a part
  KernelBuilder::Origin o(m_b, fmt::format("load in{} in parts of {} bytes, from this block's on",
                                           k, parts.part_bytes));
  Reg first = m_b.reg("parts: first block of the piece's first part");
  Reg wrap = m_b.reg("parts: end of the piece's last part");
  Reg cur = m_b.reg("parts: first block of the part loaded now");
  Reg left = m_b.reg("parts: parts left to load");
  Reg lo = m_b.reg("parts: first block of the load");
  Reg hi = m_b.reg("parts: end of the load");
  Reg from = m_b.reg("parts: source of the load");
  const Reg &S = first_block, &E = blocks;
  m_b.sub(S, src, m_in_addr[static_cast<size_t>(k)]);
  m_b.add(S, S, parts.part_bytes);
  m_b.shr(S, S, kLog2Block, "S: the load's first block, from one part before the input");
  m_b.add(E, E, S, "E: the end of the load's blocks");
  m_b.div(first, S, P);
  m_b.mul(first, first, P, "the first part's first block");
  m_b.sub(wrap, E, 1);
  m_b.div(wrap, wrap, P);
  m_b.add(wrap, wrap, 1);
  m_b.mul(wrap, wrap, P, "the last part's end");
  m_b.sub(left, wrap, first);
  m_b.div(left, left, P, "n: the parts the load touches");
  m_b.emit(Opcode::op_get_block_id, {cur});
  m_b.rem(cur, cur, left, "this block's first part: block_id % n");
  m_b.mul(cur, cur, P);
  m_b.add(cur, cur, first);
  const Label top = m_b.label(fmt::format("in{}_part", k));
  m_b.bind(top);
  m_b.max(lo, cur, S, "the part's blocks of the load");
  m_b.add(hi, cur, P);
  m_b.min(hi, hi, E);
  m_b.sub(hi, hi, lo, "blocks");
  m_b.sub(lo, lo, S, "from the load's first block");
  m_b.shl(lo, lo, kLog2Block);
  m_b.add(from, src, lo);
  m_b.add(lo, lo, static_cast<int64_t>(dst));
  m_b.emit(Opcode::op_copy_gm2ub, {lo, from, 1, hi, 0, 0}, fmt::format("load a part of in{}", k));
  m_b.add(cur, cur, P, "the next part");
  m_b.if_(ge(cur, wrap), [&] { m_b.mov(cur, first, "wrapped to the first part"); });
  m_b.sub(left, left, 1);
  m_b.branch(ne(left, 0), top);
}

std::string StreamEmitter::summary() const {
  std::string accesses;
  for (size_t k = 0; k < m_in.size(); ++k)
    accesses +=
        fmt::format("{}in{} {}{}", k ? ", " : "", k, access_name(m_in[k].access),
                    k < m_shared_parts.size() && m_shared_parts[k].part_bytes > 0
                        ? fmt::format(" in staggered parts of {} B", m_shared_parts[k].part_bytes)
                        : std::string());
  std::string outs;
  for (size_t j = 1; j < m_out_types.size(); ++j)
    outs += fmt::format(" + {}", isa::dtype_name(m_out_types[j]));
  const std::string pieces =
      m_piece < m_tile ? fmt::format(" in pieces of {}", m_piece) : std::string();
  return fmt::format("{}: {} elements of {}{}, {} blocks of {}{}, tile {} elements{}{}{}",
                     m_spec->kernel_name, m_n, isa::dtype_name(m_out_types[0]), outs, m_block_dim,
                     m_bounds.empty() ? "" : "at most ", m_per, m_tile, pieces,
                     accesses.empty() ? "" : "; ", accesses);
}

// Multi-tensor mode: each segment a block meets costs that block a setup (its addresses, its
// resident work, its first tile's round trip to HBM, which no earlier tile of that segment
// hides), so the uniform split (m_per elements a block) leaves the blocks whose range crosses
// many small segments the longest. Estimated cost of a block, in cycles: per segment it meets
// the HBM latency (memory.hbm.latency_cycles) plus its elements' flat bytes (flat inputs and
// outputs) at its GM -> UB port's rate. The launch takes at least its flat bytes at HBM's
// sustained rate (plus one latency): the blocks share HBM, and a block done early leaves its
// share to the others. The ranges are cut (whole periods) to the smallest largest block cost (a
// binary search over the greedy cut); taken only where that saves the launch's estimate (the
// larger of the two) at least one setup over the uniform split, else the program is the
// uniform one.
void StreamEmitter::plan_segment_ranges() {
  m_bounds.clear();
  const ChipConfig& cfg = m_b.config();
  const size_t n_seg = m_segments.size();
  const double setup = std::max(0, cfg.hbm_latency_cycles);
  const double rate = cfg.path_rate(isa::Buf::GM, isa::Buf::UB);
  const double hbm = cfg.hbm_sustained_bytes_per_cycle();
  if (n_seg < 2 || setup <= 0 || rate <= 0 || hbm <= 0 || m_core.count < 2) return;
  double hbm_floor = setup;  // the launch's flat bytes at HBM's sustained rate
  std::vector<double> cycles_per_element(n_seg), seg_end(n_seg);
  for (size_t g = 0; g < n_seg; ++g) {
    int bytes = 0;
    for (size_t k = 0; k < m_seg_access[g].size(); ++k)
      if (m_seg_access[g][k] == Access::kFlat)
        bytes += isa::dtype_size(m_segments[g]->inputs[k].type);
    for (isa::Dtype t : m_out_types) bytes += isa::dtype_size(t);
    cycles_per_element[g] = bytes / rate;
    seg_end[g] = static_cast<double>(g + 1 < n_seg ? m_seg_start[g + 1] : m_n);
    hbm_floor += (seg_end[g] - static_cast<double>(m_seg_start[g])) * bytes / hbm;
  }
  // The cost of the range [a, b).
  auto cost = [&](int64_t a, int64_t b) {
    double c = 0;
    for (size_t g = 0; g < n_seg; ++g) {
      const int64_t lo = std::max(a, m_seg_start[g]);
      const int64_t hi = std::min<int64_t>(b, static_cast<int64_t>(seg_end[g]));
      if (lo < hi) c += setup + static_cast<double>(hi - lo) * cycles_per_element[g];
    }
    return c;
  };
  // The greedy cut at most `limit` cycles a block (at least one period a block).
  auto cut = [&](double limit) {
    std::vector<int64_t> bounds{0};
    int64_t pos = 0;
    size_t g = 0;
    while (pos < m_n) {
      double left = limit;
      for (bool first = true;; first = false) {
        while (static_cast<double>(pos) >= seg_end[g]) ++g;
        const int64_t end = static_cast<int64_t>(seg_end[g]);
        left -= setup;
        int64_t take = static_cast<int64_t>(std::max(0.0, left) / cycles_per_element[g]);
        take = take / m_period * m_period;
        if (take <= 0 && !first) break;
        take = std::clamp<int64_t>(take, m_period, end - pos);
        pos += take;
        left -= static_cast<double>(take) * cycles_per_element[g];
        if (pos < end || pos >= m_n) break;
      }
      bounds.push_back(std::min(pos, m_n));
    }
    return bounds;
  };
  double uniform = 0;  // m_per: the uniform split's (plan_tiles before any bounds)
  for (int64_t a = 0; a < m_n; a += m_per)
    uniform = std::max(uniform, cost(a, std::min(a + m_per, m_n)));
  double lo = 0, hi = uniform;
  for (int i = 0; i < 40; ++i) {
    const double mid = (lo + hi) / 2;
    (static_cast<int64_t>(cut(mid).size()) - 1 <= m_core.count ? hi : lo) = mid;
  }
  std::vector<int64_t> bounds = cut(hi);
  double balanced = 0;
  for (size_t b = 0; b + 1 < bounds.size(); ++b)
    balanced = std::max(balanced, cost(bounds[b], bounds[b + 1]));
  if (static_cast<int64_t>(bounds.size()) - 1 > m_core.count ||
      std::max(uniform, hbm_floor) - std::max(balanced, hbm_floor) < setup)
    return;
  m_bounds = std::move(bounds);
  m_block_dim = static_cast<int>(m_bounds.size()) - 1;
}

// first, last = m_bounds[id], m_bounds[id + 1] for the block id in [lo, hi): a
// binary search over the block ids (log2(blocks) branches).
void StreamEmitter::emit_block_bounds(const Reg& id, const Reg& first, const Reg& last, int lo,
                                      int hi, const Label& done) {
  if (hi - lo == 1) {
    m_b.movi(first, m_bounds[lo]);
    m_b.movi(last, m_bounds[lo + 1]);
    m_b.jmp(done);
    return;
  }
  const int mid = lo + (hi - lo) / 2;
  Label upper = m_b.label(fmt::format("blocks {} to {}", mid, hi - 1));
  m_b.branch(ge(id, mid), upper);
  emit_block_bounds(id, first, last, lo, mid, done);
  m_b.bind(upper);
  emit_block_bounds(id, first, last, mid, hi, done);
}

// Multi-tensor mode: this block's range of the concatenated segments, then per segment (code
// for each, in order) the part of the range inside it as one single-tensor stream: the
// segment's addresses loaded, its resident tiles and uniform work built, its tile loop; one
// drain at the end.
// A segment's outputs get whole 32-byte blocks of its own buffer (segments start at whole
// granules of the range), so no two blocks write one output block.
void StreamEmitter::emit_segments(Launch& launch) {
  const size_t n_in = m_segments[0]->inputs.size(), n_out = m_out_types.size();
  for (size_t g = 0; g < m_segments.size(); ++g) {
    for (size_t k = 0; k < n_in; ++k) {
      m_b.declare_arg(fmt::format("s{}_in{}", g, k), m_segments[g]->inputs[k].type,
                      m_segments[g]->inputs[k].shape);
      launch.args.push_back(ArgRef{ArgRef::Kind::kInput, static_cast<int>(g * n_in + k), 0});
    }
    for (size_t j = 0; j < n_out; ++j) {
      m_b.declare_arg(fmt::format("s{}_out{}", g, j), m_out_types[j], m_segments[g]->out_shape);
      launch.args.push_back(ArgRef{ArgRef::Kind::kOutput, static_cast<int>(g * n_out + j), 0});
    }
  }
  for (size_t k = 0; k < n_in; ++k) m_in_addr.push_back(m_b.reg(fmt::format("in{} address", k)));
  for (size_t j = 0; j < n_out; ++j) m_out_addr.push_back(m_b.reg(fmt::format("out{} address", j)));
  Reg first = m_b.reg("start of this block's range (all segments)");
  Reg last = m_b.reg("end of this block's range (all segments)");
  if (m_bounds.empty()) {
    emit_block_range(m_b, first, last, m_per, m_n);
  } else {
    KernelBuilder::Origin o(
        m_b, fmt::format("block ranges balanced over the segments: {} blocks", m_block_dim));
    Reg id = m_b.reg("block id");
    m_b.emit(Opcode::op_get_block_id, {id});
    Label done = m_b.label("block range known");
    emit_block_bounds(id, first, last, 0, m_block_dim, done);
    m_b.bind(done);
  }
  m_pos = m_b.reg("tile start");
  m_end = m_b.reg("end of this block's range in the segment");
  m_cnt = m_b.reg("tile elements");
  init_flags();
  init_stagger();
  if (m_segments[0]->prologue) {
    KernelBuilder::Origin o(m_b, "prologue");
    m_segments[0]->prologue(m_b, m_temp);
  }
  for (size_t g = 0; g < m_segments.size(); ++g) {
    m_spec = m_segments[g];
    for (size_t k = 0; k < n_in; ++k) m_in[k].access = m_seg_access[g][k];
    if (resident_then_flat(g))
      m_b.emit(Opcode::op_pipe_barrier, {Pipe::V},
               "the previous segment's tiles read a resident tile this segment loads over");
    int64_t n = 1;
    for (int64_t d : m_spec->out_shape) n *= d;
    const int64_t start = m_seg_start[g];
    KernelBuilder::Origin o(m_b, fmt::format("segment {}: {} elements at {}", g, n, start));
    Label next = m_b.label(fmt::format("segment{}_done", g));
    m_b.sub(m_pos, first, start);
    m_b.max(m_pos, m_pos, 0, "first element of the segment in this block's range");
    m_b.sub(m_end, last, start);
    m_b.min(m_end, m_end, n, "end of it");
    if (const int64_t row = m_spec->blocked_row; row > 0) {
      // Whole rows: each row to the block whose range holds its first element (both ends
      // rounded up to a row; n is whole rows).
      for (const Reg* r : {&m_pos, &m_end}) {
        m_b.add(*r, *r, row - 1);
        m_b.div(*r, *r, row);
        m_b.mul(*r, *r, row, "whole rows (blocked store)");
      }
    }
    m_b.branch(ge(m_pos, m_end), next);
    for (size_t k = 0; k < n_in; ++k)
      m_b.emit(Opcode::op_ldarg, {m_in_addr[k], static_cast<int64_t>(g * (n_in + n_out) + k)},
               fmt::format("segment {} in{}", g, k));
    for (size_t j = 0; j < n_out; ++j)
      m_b.emit(Opcode::op_ldarg,
               {m_out_addr[j], static_cast<int64_t>(g * (n_in + n_out) + n_in + j)},
               fmt::format("segment {} out{}", g, j));
    // A segment with resident work (its single-element inputs built into tiles, its uniform
    // steps) issues its first tile's loads before that work: MTE2 brings the tile in while V
    // builds the resident tiles (the work reads and writes no flat input tile), instead of
    // waiting for that work and V then waiting the load's round trip. The first tile exists
    // (the range check above); the loop then starts at the pong tile. Without resident work the
    // tile loop is as in build().
    bool resident = static_cast<bool>(m_spec->resident_compute);
    for (const InputPlan& p : m_in) resident |= p.access == Access::kResident;
    if (resident && m_any_flat) emit_tile_loads(0, next);
    build_resident_inputs();
    if (m_spec->resident_compute) compute_resident();
    // The tile loop exits to the next segment without a drain: each parity's free flags are
    // set once between any two tiles, whichever parity comes next, so the next segment starts
    // with its ping tile as the first segment did.
    Label loop = m_b.label(fmt::format("segment{}_tiles", g));
    if (resident && m_any_flat) {
      emit_tile_compute(0);
      m_b.bind(loop);
      for (int q : {1, 0}) emit_tile(q, next);
    } else {
      m_b.bind(loop);
      for (int q = 0; q < 2; ++q) emit_tile(q, next);
    }
    m_b.jmp(loop);
    m_b.bind(next);
  }
  emit_drain();
}

bool StreamEmitter::resident_then_flat(size_t g) const {
  if (g == 0 || g >= m_seg_access.size()) return false;
  for (size_t k = 0; k < m_seg_access[g].size(); ++k)
    if (m_seg_access[g - 1][k] == Access::kResident && m_seg_access[g][k] == Access::kFlat)
      return true;
  return false;
}

Launch StreamEmitter::build() {
  blocked_row_max();  // (checks every StreamSpec::blocked_row)
  if (!m_segments.empty()) {
    plan_segment_inputs();
    plan_tiles();
    plan_segment_ranges();
    if (!m_bounds.empty()) plan_tiles();  // the tile for the longest balanced range
    plan_l2();
    m_b.begin_section(m_kind);
    allocate();
    Launch launch;
    emit_segments(launch);
    m_b.end();
    launch.summary = fmt::format("{} segments; {}", m_segments.size(), summary());
    launch.block_dim = m_block_dim;
    launch.kernel = m_b.finish();
    return launch;
  }
  plan_inputs();
  plan_tiles();
  check_resident();
  plan_l2();
  plan_shared_reads();
  m_b.begin_section(m_kind);
  allocate();
  Launch launch;
  load_args(launch);
  init_flags();
  init_stagger();
  const bool per_period = m_spec->resident_per_period;
  // The tile loop, unrolled twice (ping: buffers 0, pong: buffers 1); with first_tile_ahead the
  // first ping tile's loads go out with the resident inputs and the loop is entered at its
  // compute.
  Label loop = m_b.label("tile_loop"), drain = m_b.label("drain"),
        first_compute = m_b.label("first_tile_compute");
  const bool ahead = first_tile_ahead();
  if (ahead)
    build_resident_inputs(!per_period, [&] { emit_tile_loads(0, drain); });
  else
    build_resident_inputs(!per_period);
  if (m_spec->prologue) {
    KernelBuilder::Origin o(m_b, "prologue");
    m_spec->prologue(m_b, m_temp);
  }
  if (m_spec->resident_compute) compute_resident();
  if (per_period)
    for (size_t k = 0; k < m_in.size(); ++k)
      if (m_in[k].access == Access::kResident && !m_spec->inputs[k].period_only) {
        KernelBuilder::Origin o(m_b, fmt::format("resident in{}: doubled", k));
        double_resident_input(k);
      }
  if (!m_spec->resident_stores.empty()) store_resident_results();
  if (!m_spec->accumulators.empty()) {
    KernelBuilder::Origin o(m_b, "accumulators: cleared");
    Reg zero = m_b.reg_imm("0.0f bits", 0);
    for (size_t t : m_spec->accumulators) vec_dup_bits(m_b, 4, m_temp.at(t), zero, m_piece);
  }
  if (ahead) m_b.jmp(first_compute);
  m_b.bind(loop);
  for (int q = 0; q < 2; ++q) {
    emit_tile_loads(q, drain);
    if (ahead && q == 0) m_b.bind(first_compute);
    emit_tile_compute(q);
  }
  m_b.jmp(loop);
  m_b.bind(drain);
  emit_drain();
  if (m_spec->block_finish) {
    KernelBuilder::Origin o(m_b, "after the tiles: the block's finish");
    TileOperands t;
    t.temp = m_temp;
    t.tile_elems = m_piece;
    m_spec->block_finish(m_b, t, m_block_dim);
  }
  m_b.end();
  launch.summary = summary();
  launch.block_dim = m_block_dim;
  launch.kernel = m_b.finish();
  return launch;
}

}  // namespace

Launch build_stream_kernel(const std::string& op, const StreamSpec& spec, const ChipConfig& cfg) {
  return StreamEmitter(op, spec, cfg).build();
}

bool StreamEmitter::keeps_resident() {
  plan_inputs();
  plan_tiles();
  for (const InputPlan& p : m_in)
    if (p.access == Access::kGather) return false;
  return true;
}

int64_t StreamEmitter::tile_capacity() {
  plan_inputs();
  return fit_tile();
}

int64_t stream_tile_capacity(const StreamSpec& spec, const ChipConfig& cfg) {
  return StreamEmitter("stream_tile_capacity", spec, cfg).tile_capacity();
}

bool load_round_trips_idle_hbm(const ChipConfig& cfg, int64_t vector_cores) {
  const double ports =
      static_cast<double>(vector_cores) * cfg.path_rate(isa::Buf::GM, isa::Buf::UB);
  return cfg.set_flag_holds_pipe && ports > cfg.hbm_sustained_bytes_per_cycle();
}

void emit_staggered_first_tile(KernelBuilder& b, const Reg& limit, const Reg& block, int64_t blocks,
                               int64_t units, int64_t unit) {
  b.add(limit, block, 1);
  b.mul(limit, limit, units);
  b.add(limit, limit, blocks - 1);
  b.div(limit, limit, blocks);  // ceil((block + 1) * units / blocks): 1 .. units
  b.mul(limit, limit, unit, "this block's first tile");
}

bool stream_keeps_resident(const StreamSpec& spec, const ChipConfig& cfg) {
  return StreamEmitter("stream_keeps_resident", spec, cfg).keeps_resident();
}

Launch build_multi_stream_kernel(const std::string& op, const std::vector<StreamSpec>& segments,
                                 const ChipConfig& cfg) {
  if (segments.empty()) throw std::logic_error("build_multi_stream_kernel: no segments");
  for (const StreamSpec& s : segments)
    if (!s.accumulators.empty() || s.block_finish || s.tail_args)
      throw std::logic_error(
          "build_multi_stream_kernel: accumulators, block_finish and tail_args are "
          "build_stream_kernel's only");
  return StreamEmitter(op, segments, cfg).build();
}

std::vector<Launch> multi_tensor_launches(
    const std::string& op, const std::vector<MultiTensorSegment>& segments, size_t n_inputs,
    size_t n_outputs, const std::function<int(size_t member, size_t k)>& input_index,
    const std::function<int(size_t member, size_t j)>& output_index, const ChipConfig& cfg) {
  if (n_outputs == 0) throw std::logic_error("multi_tensor_launches: segments without outputs");
  const CoreKindConfig* vector =
      cfg.core_kind(cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE);
  const int64_t limit = int64_t{1024} * (vector ? vector->count : 1);
  std::vector<const MultiTensorSegment*> by_kind[2];  // [0] small, [1] large
  for (const MultiTensorSegment& s : segments) {
    const int64_t elements = std::accumulate(s.spec.out_shape.begin(), s.spec.out_shape.end(),
                                             int64_t{1}, std::multiplies<>());
    by_kind[elements > limit ? 1 : 0].push_back(&s);
  }
  const size_t per_launch =
      std::max<size_t>(1, static_cast<size_t>(KernelBuilder::max_args()) / (n_inputs + n_outputs));
  std::vector<Launch> launches;
  for (const std::vector<const MultiTensorSegment*>& kind : by_kind) {
    for (size_t first = 0, n = 0; first < kind.size(); first += n) {
      uint64_t bytes = kind[first]->bytes;
      for (n = 1; n < per_launch && first + n < kind.size() &&
                  bytes + kind[first + n]->bytes <= cfg.l2_bytes;
           ++n)
        bytes += kind[first + n]->bytes;
      std::vector<StreamSpec> part;
      for (size_t s = first; s < first + n; ++s) part.push_back(kind[s]->spec);
      Launch l =
          n == 1 ? build_stream_kernel(op, part[0], cfg) : build_multi_stream_kernel(op, part, cfg);
      for (ArgRef& a : l.args) {
        // build_multi_stream_kernel numbers segment s's input k as s * n_inputs + k, its output
        // j as s * n_outputs + j; a single segment's stream as k and j.
        if (a.kind == ArgRef::Kind::kInput) {
          const size_t k = static_cast<size_t>(a.index);
          a.index = input_index(kind[first + k / n_inputs]->member, k % n_inputs);
        } else if (a.kind == ArgRef::Kind::kOutput) {
          const size_t j = static_cast<size_t>(a.index);
          a.index = output_index(kind[first + j / n_outputs]->member, j % n_outputs);
        }
      }
      launches.push_back(std::move(l));
    }
  }
  return launches;
}

CompiledKernel stream_kernel(const CompileContext& ctx, const TensorDesc& out,
                             const StreamSpec& spec) {
  CompiledKernel k;
  k.outputs = {out};
  if (out.num_elements() > 0)
    k.launches.push_back(build_stream_kernel(ctx.op.str(), spec, ctx.cfg));
  return k;
}

std::vector<StreamInput> stream_inputs(const std::vector<TensorDesc>& inputs,
                                       const std::vector<int64_t>& out_shape) {
  std::vector<StreamInput> v;
  for (const TensorDesc& t : inputs)
    v.push_back(StreamInput{device_dtype(t.dtype), broadcast_view(t.shape, out_shape), t.shape});
  return v;
}

}  // namespace npusim::compiler::ops
