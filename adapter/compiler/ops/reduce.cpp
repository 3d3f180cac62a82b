// Reductions: Sum, Mean, Max, Min, Prod, ArgMax, ArgMin over any set of axes (and All / Any of
// bool tensors, through s32: compile_logical_reduce; SquareSumV1, the Sum of squares), and the
// reduction engine (append_reduce) that BiasAddGrad and L2Loss use too.
//
// OpDesc contract (TF passes the axes as a const input tensor, whose VALUES the compiler cannot
// see): the axes come as attributes, filled by the caller from the const tensor --
//   Sum Mean Max Min Prod All Any: attr "axes" (list(int) or int; negative from the end, duplicates
//     allowed, empty = no reduction), attr "keep_dims" (bool, default false);
//   ArgMax ArgMin: attr "axis" (int), attr "output_type" ("s32" or "s64", TF's default s64);
//   SquareSumV1 (CANN's op: Sum(x * x), floats): attr "axis" (list(int), as Sum's "axes"),
//     attr "keep_dims"; attr "N" (int, default 1): N > 1 inputs, output i SquareSumV1 of input
//     i (compile_square_sums: Lamb's per-variable norms in one op).
// The op may have the axes tensor as a second input (s32/s64, rank <= 1, as TF's node has it);
// it is not read by any kernel.
//
// Types: f32, f16, bf16 and s32 on the vector unit; Mean of s32 (TF: the int64 sum divided by
// the count with truncation) and Sum / Mean / Max / Min / Prod of s64 run on the scalar unit
// (append_scalar_reduce, ops/int64.h). Arg* take the vector types.
//
// Numerics: f16/bf16 are widened to f32 and everything accumulates in f32 (s32 in s32,
// wrapping as TF's int32 sums do); the result is rounded once to the output type. Mean is the
// f32 sum divided (vdiv) by the element count, rounded once. Max/Min propagate NaN (TF 2.x's
// reducers use Eigen's PropagateNaN). ArgMax/ArgMin return the first index of the largest /
// smallest value and ignore NaN (an all-NaN row gives 0), as TF's CPU kernels do. Reducing an
// empty axis gives the identity (0, 1, -inf, +inf; s32: INT_MIN / INT_MAX) and Mean NaN;
// ArgMax/ArgMin over an empty axis are rejected (TF fails too). The summation order is not
// TF's (vcadd lane order, tree folds), so sums differ from TF's in the last bits.
//
// How (after dropping size-1 dims and merging adjacent dims of the same kind the tensor is
// [K0, R1, K1, R2, ...]): each group of reduced dims is one STAGE, innermost first, a reduction
// over the middle dim of [outer, R, inner]; intermediate results stay in f32/s32 in the GM
// workspace and only the last stage converts (and divides, for Mean). Per stage one of three
// vector kernels:
//   rows (inner == 1, R short enough that 16 rows fit in the UB): groups of super-rows
//     (vector_rows.h) loaded in one copy, reduced through the lane accumulator, one value per
//     row stored per group;
//   streamed rows (inner == 1, long rows): each row streamed through the UB in chunks, each
//     chunk folded in halves (counter mode) to 64 lanes and combined into the row's lane slot
//     (Arg: 64 lanes at a time, keeping the first strictly better lane); a group of rows' slots
//     reduced and stored like the above;
//   columns (inner > 1): the output is cut into staging tiles of whole 32-byte blocks; a tile
//     holds pieces (one outer index, a range of inner), computed last to first. For a piece,
//     groups of its R rows are loaded at the phase the piece has in its output block (MTE2
//     reads GM at any byte address; rows whose starts share a phase are one strided copy),
//     widened, folded in halves across rows (Arg: row after row), and combined into the
//     piece's accumulator, which is converted and copied into the tile from its block-aligned
//     start with an exact end (the head block's foreign lanes are rewritten by the piece before
//     it, which is computed next).
// All three run on the row skeleton (row_kernel.h: arguments, block range, group loops, buffers
// declared once in a BufferPlan) and are double-buffered (vector_rows.h PingPong): two UB
// copies of what MTE2 loads and of what MTE3 stores, so loads of the next group / chunk / row
// group and the store of the last results overlap the vector work; rows and streamed chunks
// are also software-pipelined.
// Few outputs and a long R: R is split into parts over the cores (first pass: partial results
// of every (output, part) in f32/s32 in the workspace, and for Arg their indices), then the
// columns kernel reduces the parts. Arg with output_type s64: the indices are computed as s32
// into the workspace and widened by the scalar unit (ops/int64.h).
#include "adapter/compiler/ops/reduce.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "adapter/compiler/ops/cast.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/int64.h"
#include "adapter/compiler/ops/row_kernel.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/convert.h"
#include "common/int_math.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;

namespace {

constexpr int64_t kMaxBurst = 65535;      // RU16 burst / gap fields
constexpr int64_t kStagingMax = 2048;     // columns kernel: output elements per staging tile
constexpr int64_t kSplitMinElems = 4096;  // a split part reduces at least this many elements

// One stage's kernel: reduce the middle dim of [outer, R, inner] (R split into `split` parts of
// split_len when split > 1; the output then has outer * split * inner partial results).
struct KernelSpec {
  std::string name;
  Combine combine = Combine::kSum;
  bool arg = false, is_max = false;
  Dtype in_type = Dtype::F32;   // input values
  Dtype ct = Dtype::F32;        // compute type: f32 or s32
  Dtype out_type = Dtype::F32;  // what output 0 holds (Arg: the s32 indices)
  bool idx_input = false;       // columns kernel: input 1 holds the s32 indices of the values
  bool partial_idx = false;     // Arg first pass of a split: output 0 holds the parts' best
                                // values (ct), output 1 their s32 indices
  bool square = false;
  double divisor = 0;           // > 0: divide the result by it
  double scale = 1;
  int64_t outer = 1, R = 1, inner = 1;
  int64_t split = 1, split_len = 0;
  std::string op;               // for errors
};

int64_t out_elems(const KernelSpec& s) { return s.outer * s.split * s.inner; }
// The type each output of the kernel holds (output 0; output 1 = s32 indices when partial_idx).
Dtype value_out_type(const KernelSpec& s) { return s.partial_idx ? s.ct : s.out_type; }

// The row skeleton, the arguments and the pieces every reduction kernel shares.
class ReduceKernel {
 public:
  ReduceKernel(const KernelSpec& s, const ChipConfig& cfg)
      : m_s(s), m_k(s.name, s.op, cfg), m_b(m_k.b()) {}

  RowKernel& k() { return m_k; }
  KernelBuilder& b() { return m_b; }

  // Declares in0 [, in1], out [, out1] and loads their addresses.
  void begin() {
    const int64_t n_in = m_s.outer * m_s.R * m_s.inner;
    m_k.arg("in0", m_s.in_type, {n_in}, ArgRef{ArgRef::Kind::kInput, 0, 0});
    if (m_s.idx_input) m_k.arg("in1", Dtype::S32, {n_in}, ArgRef{ArgRef::Kind::kInput, 1, 0});
    m_k.arg("out", value_out_type(m_s), {out_elems(m_s)}, ArgRef{ArgRef::Kind::kOutput, 0, 0});
    if (m_s.partial_idx)
      m_k.arg("out1", Dtype::S32, {out_elems(m_s)}, ArgRef{ArgRef::Kind::kOutput, 1, 0});
    std::vector<Reg> regs = m_k.load_args();
    auto next = regs.begin();
    m_in = std::move(*next++);
    if (m_s.idx_input) m_idx_in = std::move(*next++);
    m_out = std::move(*next++);
    if (m_s.partial_idx) m_out1 = std::move(*next++);
  }

  // Constant buffers (allocated by the kernel, filled in the prologue).
  void prologue(uint64_t divvec, int64_t div_lanes, const ArgScratch* arg, uint64_t iota64,
                int64_t max_rows) {
    KernelBuilder::Origin o(m_b, "constants");
    if (m_s.divisor > 0)
      vec_fill32(m_b, divvec, f32_to_bits(static_cast<float>(m_s.divisor)), div_lanes);
    if (arg) {
      vec_fill32(m_b, arg->big64, std::numeric_limits<int32_t>::max(), kLanes32);
      fill_alt_pattern(m_b, arg->alt, max_rows);
    }
    if (iota64) fill_iota64(m_b, iota64);
  }

  // Widens `count` input elements at src to the compute type at dst (no-op when the same).
  void widen(uint64_t dst, uint64_t src, const Reg& count) {
    if (m_s.in_type != m_s.ct) {
      vec_convert(m_b, m_s.ct, m_s.in_type, dst, src, RoundMode::kRint, count);
      src = dst;
    }
    if (m_s.square) vec_binary(m_b, Opcode::op_vmul, m_s.ct, dst, src, src, count);
  }
  bool converts() const { return m_s.in_type != m_s.ct; }

  // Final values of `count` results at vals (ct, modified) -> the output type at out_tmp.
  // Returns the UB address holding the values to store.
  uint64_t finalize(uint64_t vals, const Reg& count, uint64_t divvec, uint64_t out_tmp) {
    KernelBuilder::Origin o(m_b, "final values");
    if (m_s.divisor > 0) vec_binary(m_b, Opcode::op_vdiv, m_s.ct, vals, vals, divvec, count);
    if (m_s.scale != 1) {
      Reg sc = m_b.reg_imm("scale", vector_scalar_bits(m_s.ct, m_s.scale));
      vec_scalar(m_b, Opcode::op_vmuls, m_s.ct, vals, vals, sc, count);
    }
    const Dtype ot = value_out_type(m_s);
    if (ot == m_s.ct) return vals;
    vec_convert(m_b, ot, m_s.ct, out_tmp, vals, RoundMode::kRint, count);
    return out_tmp;
  }

  // Stores `count` elements of `size` bytes from UB src to GM dst_base + index * size.
  void store(const Reg& dst_base, const Reg& index, uint64_t src, const Reg& count, int size) {
    Reg dst = m_b.reg("store destination"), blocks = m_b.reg("store blocks");
    m_b.mul_add(dst, index, size, dst_base);
    count_blocks(m_b, blocks, count, size);
    m_b.emit(Opcode::op_copy_ub2gm, {dst, src, 1, blocks, 0, 0}, "store");
  }

  // The results of `count` outputs from `index` on: values (ct, dense) and, for Arg, indices
  // (s32, dense), in output copy q. Between sync.wait_out_free(q) (before the values were
  // computed) and the stores: finalises, then stores what the kernel outputs.
  void store_results(PingPong& sync, int q, const Reg& index, const Reg& count, uint64_t vals,
                     uint64_t idx, uint64_t divvec, uint64_t out_tmp) {
    if (!m_s.arg) {
      const uint64_t v = finalize(vals, count, divvec, out_tmp);
      sync.out_ready(q);
      store(m_out, index, v, count, isz(value_out_type(m_s)));
    } else if (m_s.partial_idx) {
      sync.out_ready(q);
      store(m_out, index, vals, count, isz(m_s.ct));
      store(m_out1, index, idx, count, isz(Dtype::S32));
    } else {
      sync.out_ready(q);
      store(m_out, index, idx, count, isz(Dtype::S32));
    }
    sync.stored(q);
  }

  Launch finish(int block_dim, std::string summary) {
    return m_k.finish(block_dim, std::move(summary));
  }

  const Reg& in() const { return m_in; }
  const Reg& idx_in() const { return m_idx_in; }
  const Reg& out() const { return m_out; }
  const Reg& out1() const { return m_out1; }

 private:
  const KernelSpec& m_s;
  RowKernel m_k;
  KernelBuilder& m_b;
  Reg m_in, m_idx_in, m_out, m_out1;
};

bool separate_x(const KernelSpec& s) { return s.in_type != s.ct || s.square; }

// The buffers of a lane-accumulator kernel (rows, streamed rows) after its input, for a group of
// rows(units) rows: the lane slots, what MTE3 stores (ping and pong), the divisor and the Arg
// scratch.
struct LaneIds {
  BufferPlan::Id acc, dense, tmp, out_tmp, divvec;
  BufferPlan::Id acc_idx, rep, replicate, alt, iota64, t64, big64, bits;  // Arg
};

LaneIds declare_lane_buffers(BufferPlan& plan, const KernelSpec& s,
                             const std::function<int64_t(int64_t units)>& rows) {
  auto per_row = [&rows](int64_t bytes) -> BufferPlan::SizeFn {
    return [rows, bytes](int64_t u) { return static_cast<uint64_t>(rnd(rows(u) * bytes)); };
  };
  auto scratch = [&rows](uint64_t (*f)(int64_t)) -> BufferPlan::SizeFn {
    return [rows, f](int64_t u) { return f(rows(u)); };
  };
  LaneIds id;
  id.acc = plan.add_sized("lane slots", per_row(kSlotBytes));
  id.dense = plan.add_sized("one value per row", per_row(kLaneBytes), 2);
  id.tmp = plan.add_sized("product lanes / indices", per_row(kLaneBytes), 2);
  id.out_tmp = plan.add_sized("output values", per_row(isz(s.out_type)), 2);
  id.divvec = plan.add_sized("divisor", per_row(kLaneBytes), 1, s.divisor > 0);
  id.acc_idx = plan.add_sized("index slots", per_row(kSlotBytes), 1, s.arg);
  // replicate_rows writes whole groups of 8 row blocks (a stream group or a rows-kernel group of
  // s64 results may hold fewer than 8, or not a multiple of 8, rows).
  id.rep = plan.add_sized("replicated row values", scratch(replicated_bytes), 1, s.arg);
  id.replicate = plan.add_sized("replicate scratch", scratch(replicate_scratch_bytes), 1, s.arg);
  id.alt = plan.add_sized("alternating pattern", scratch(alt_pattern_bytes), 1, s.arg);
  id.iota64 = plan.add_fixed("iota 0..63", kSlotBytes, 1, s.arg);
  id.t64 = plan.add_fixed("lane indices", kSlotBytes, 1, s.arg);
  id.big64 = plan.add_fixed("INT_MAX lanes", kSlotBytes, 1, s.arg);
  id.bits = plan.add_sized("compare bits", per_row(8), 1, s.arg);
  return id;
}

// A lane-accumulator kernel's buffers: the input (ping and pong; `in_unit` bytes per unit), the
// widened input (4-byte lanes per input element) and the lane buffers.
struct LaneKernelBuffers {
  BufferPlan plan;
  BufferPlan::Id in, xw;
  LaneIds lane;
};

LaneKernelBuffers lane_kernel_buffers(const KernelSpec& s, const char* what, int64_t elems_per_unit,
                                      const std::function<int64_t(int64_t units)>& rows) {
  LaneKernelBuffers k;
  k.in = k.plan.add_sized(fmt::format("input {}", what),
                          blocks_of(elems_per_unit * isz(s.in_type)), 2);
  k.xw = k.plan.add_sized(fmt::format("widened {}", what), blocks_of(elems_per_unit * kLaneBytes),
                          1, separate_x(s));
  k.lane = declare_lane_buffers(k.plan, s, rows);
  declare_repeat_overhang(k.plan);
  return k;
}

// The allocated lane buffers.
struct LaneBuffers {
  uint64_t acc = 0, divvec = 0;
  Twin dense, tmp, out_tmp;
  uint64_t acc_idx = 0, iota64 = 0, t64 = 0;
  ArgScratch arg;
  LaneBuffers(const BufferPlan::Placed& at, const LaneIds& id)
      : acc(at[id.acc]), divvec(at[id.divvec]), dense(at.twin(id.dense)), tmp(at.twin(id.tmp)),
        out_tmp(at.twin(id.out_tmp)), acc_idx(at[id.acc_idx]), iota64(at[id.iota64]),
        t64(at[id.t64]) {
    arg.rep = at[id.rep];
    arg.replicate = at[id.replicate];
    arg.alt = at[id.alt];
    arg.big64 = at[id.big64];
    arg.bits = at[id.bits];
  }
};

// The slots of `rows` rows (a register) reduced to one value per row in output copy q, then
// stored from output index `index` on (between wait_out_free and stored, ReduceKernel).
void reduce_slots(ReduceKernel& k, const KernelSpec& s, const LaneBuffers& lb, int q,
                  const Reg& rows, const Reg& index, const Reg& count) {
  KernelBuilder& b = k.b();
  if (s.arg) {
    lanes_reduce_arg(b, s.is_max, s.ct, lb.acc, lb.acc_idx, rows, lb.dense[q], lb.tmp[q], lb.arg);
    k.store_results(k.k().sync(), q, index, count, lb.dense[q], lb.tmp[q], lb.divvec,
                    lb.out_tmp[q]);
  } else {
    lanes_reduce(b, s.combine, s.ct, lb.acc, rows, lb.dense[q], lb.tmp[q]);
    k.store_results(k.k().sync(), q, index, count, lb.dense[q], 0, lb.divvec, lb.out_tmp[q]);
  }
}

// ---- rows kernel: inner == 1, groups of super-rows resident in the UB ----

struct RowsPlan {
  SuperRowLayout layout;
  int64_t group = 0;  // rows per group (multiple of q)
  BlockSplit split;   // rows per block
};

LaneKernelBuffers rows_buffers(const KernelSpec& s) {
  return lane_kernel_buffers(s, "rows", s.R, [](int64_t rows) { return rows; });
}

std::optional<RowsPlan> plan_rows(const KernelSpec& s, const ChipConfig& cfg) {
  if (s.split != 1) return std::nullopt;
  const VectorCores cores = VectorCores::of(cfg);
  const int64_t granule = kBlock / std::min(isz(s.in_type), isz(s.out_type));
  RowsPlan p;
  p.layout = SuperRowLayout::make(s.R, granule);
  const int64_t q = std::max<int64_t>(p.layout.rows, kBlock / isz(s.out_type));  // rows per step
  p.split = BlockSplit::make(s.outer, cores.count, q);
  p.group = rows_buffers(s).plan.fit(cfg, cores.kind, q, std::min(kMaxGroupRows / q * q,
                                                                   p.split.per));
  if (p.group == 0) return std::nullopt;
  return p;
}

Launch build_rows(const KernelSpec& s, const RowsPlan& p, const ChipConfig& cfg) {
  ReduceKernel k(s, cfg);
  KernelBuilder& b = k.b();
  const SuperRowLayout& L = p.layout;
  const int64_t G = p.group;
  k.begin();
  // Double-buffered: the input rows, and everything MTE3 stores (dense values, Arg indices,
  // converted outputs), have a ping and a pong copy; the widened rows and the lane slots are
  // V's alone.
  const LaneKernelBuffers bufs = rows_buffers(s);
  const BufferPlan::Placed at = k.k().allocate(bufs.plan, G);
  const Twin in_buf = at.twin(bufs.in);
  const uint64_t xw = at[bufs.xw];
  const LaneBuffers lb(at, bufs.lane);
  k.prologue(lb.divvec, G, s.arg ? &lb.arg : nullptr, lb.iota64, G);
  PingPong& sync = k.k().start_pingpong();
  k.k().resident_groups(
      p.split, s.outer, G, L,
      [&](const GroupRegs& grp, int q) {
        sync.wait_load_free(q);
        Reg src = b.reg("source"), blocks = b.reg("blocks");
        b.mul_add(src, grp.r, s.R * isz(s.in_type), k.in());
        count_blocks(b, blocks, grp.rows, s.R * isz(s.in_type));
        b.emit(Opcode::op_copy_gm2ub, {in_buf[q], src, 1, blocks, 0, 0}, "load the group's rows");
        sync.load_done(q);
      },
      [&](const GroupRegs& grp, int q) {
        const uint64_t x = separate_x(s) ? xw : in_buf[q];
        sync.wait_loaded(q);
        {
          Reg n = b.reg("lanes");
          b.mul(n, grp.supers, L.lanes);
          k.widen(x, in_buf[q], n);
        }
        if (separate_x(s)) sync.release_load(q);
        const RowGroup rg{&L, x, &grp.supers, &grp.slots};
        if (s.arg)
          rows_to_lanes_arg(b, rg, s.is_max, s.ct, lb.acc, lb.acc_idx, lb.iota64, lb.t64,
                            lb.arg.bits);
        else
          rows_to_lanes(b, rg, s.combine, s.ct, lb.acc);
        if (!separate_x(s)) sync.release_load(q);
        sync.wait_out_free(q);
        reduce_slots(k, s, lb, q, grp.slots, grp.r, grp.rows);
      });
  return k.finish(p.split.block_dim,
                  fmt::format("{}: rows {} x {} of {}, {} blocks of {} rows, groups of {} rows "
                              "({} per super-row), double-buffered",
                              s.name, s.outer, s.R, isa::dtype_name(s.in_type), p.split.block_dim,
                              p.split.per, G, L.rows));
}

// ---- streamed rows: inner == 1, each row (or part of a row) streamed in chunks ----

struct StreamPlan {
  int64_t group = 0;  // units (rows or parts) per group, one lane slot each
  int64_t chunk = 0;  // elements per chunk (multiple of 64)
  BlockSplit split;   // units per block
};

int64_t part_len(const KernelSpec& s) { return s.split > 1 ? s.split_len : s.R; }

LaneKernelBuffers stream_buffers(const KernelSpec& s, int64_t group) {
  return lane_kernel_buffers(s, "chunk", 1, [group](int64_t) { return group; });
}

StreamPlan plan_stream(const KernelSpec& s, const ChipConfig& cfg) {
  const VectorCores cores = VectorCores::of(cfg);
  StreamPlan p;
  const int64_t q = kBlock / isz(value_out_type(s));
  p.split = BlockSplit::make(s.outer * s.split, cores.count, q);
  p.group = std::min(kMaxGroupRows / q * q, p.split.per);
  const int64_t max_chunk = std::min(round_up(part_len(s), kLanes32),
                                     kMaxBurst * kBlock / isz(s.in_type) / kLanes32 * kLanes32);
  p.chunk = stream_buffers(s, p.group).plan.fit(cfg, cores.kind, kLanes32, max_chunk);
  if (p.chunk < kLanes32)
    throw CompileError(fmt::format("{}: the reduction's buffers do not fit in the {} bytes of UB",
                                   s.op, cfg.core_kind(cores.kind)->capacity(Buf::UB)));
  return p;
}

// Arg: the n lanes at x (element indices off + c, off + c + 1, ...: the chunk at c of the part
// at off) 64 at a time into unit j's value slot (`slot`) and index slot.
void arg_chunk(KernelBuilder& b, const KernelSpec& s, const LaneBuffers& lb, uint64_t x,
               const Reg& n, const Reg& off, const Reg& c, const Reg& j, const Reg& slot) {
  KernelBuilder::Origin oa(b, "64 lanes at a time into the slot");
  Reg islot = b.reg("index slot");
  b.mul_add(islot, j, kSlotBytes, static_cast<int64_t>(lb.acc_idx));
  Reg kk = b.reg("lane block"), cnt = b.reg("lanes"), i0 = b.reg("index of lane 0");
  Reg src = b.reg("lanes address");
  b.for_range(kk, 0, n, kLanes32, [&] {
    b.sub(cnt, n, kk);
    b.min(cnt, cnt, kLanes32);
    b.add(i0, off, c);
    b.add(i0, i0, kk);
    b.mul_add(src, kk, kLaneBytes, static_cast<int64_t>(x));
    lanes_arg_step(b, s.is_max, s.ct, src, cnt, i0, slot, islot, lb.iota64, lb.t64, lb.arg.bits);
  });
}

// The chunks of a group of `ug` units from u0 on folded into the units' lane slots: steps (unit
// j of the group, chunk c of its row or part), ceil(part_len / T) chunks per unit (a part
// shorter than part_len, the row's last, skips its missing chunks on both sides),
// software-pipelined.
void stream_chunks(ReduceKernel& k, const KernelSpec& s, int64_t T, const Twin& in_buf,
                   uint64_t xw, const LaneBuffers& lb, const Reg& u0, const Reg& ug) {
  KernelBuilder& b = k.b();
  PingPong& sync = k.k().sync();
  const int64_t cpu = ceil_div(part_len(s), T);
  Reg steps = b.reg("chunks of the group");
  b.mul(steps, ug, cpu);
  Reg j = b.reg("unit in the group"), c = b.reg("chunk start"), n = b.reg("chunk elements");
  Reg start = b.reg("first element"), off = b.reg("part offset");
  auto chunk = [&](const Reg& t) {
    KernelBuilder::Origin o(b, "one chunk of a row (or part of a row)");
    Reg u = b.reg("unit"), row = b.reg("row");
    b.div(j, t, cpu);
    b.mul(c, j, cpu);
    b.sub(c, t, c);
    b.mul(c, c, T);
    // unit u = u0 + j: row u / split, part u % split; n = min(len - c, T).
    b.add(u, u0, j);
    b.div(row, u, s.split);
    b.mul(off, row, s.split);
    b.sub(off, u, off);
    b.mul(off, off, part_len(s));
    b.movi(n, s.R);
    b.sub(n, n, off);
    b.min(n, n, part_len(s));
    b.sub(n, n, c);
    b.min(n, n, T);
    b.mul(start, row, s.R);
    b.add(start, start, off);
  };
  sync.pipeline(
      steps,
      [&](const Reg& t, int q) {
        chunk(t);
        b.if_(ge(n, 1), [&] {
          sync.wait_load_free(q);
          Reg src = b.reg("source"), blocks = b.reg("blocks");
          b.add(src, start, c);
          b.mul_add(src, src, isz(s.in_type), k.in());
          count_blocks(b, blocks, n, isz(s.in_type));
          b.emit(Opcode::op_copy_gm2ub, {in_buf[q], src, 1, blocks, 0, 0}, "load a chunk");
          sync.load_done(q);
        });
      },
      [&](const Reg& t, int q) {
        chunk(t);
        b.if_(ge(n, 1), [&] {
          const uint64_t x = separate_x(s) ? xw : in_buf[q];
          Reg slot = b.reg("lane slot");
          b.mul_add(slot, j, kSlotBytes, static_cast<int64_t>(lb.acc));
          sync.wait_loaded(q);
          k.widen(x, in_buf[q], n);
          if (separate_x(s)) sync.release_load(q);
          if (s.arg) {
            arg_chunk(b, s, lb, x, n, off, c, j, slot);
          } else {
            fold_into_slot(b, s.combine, s.ct, x, n, slot);
          }
          if (!separate_x(s)) sync.release_load(q);
        });
      });
}

Launch build_stream(const KernelSpec& s, const StreamPlan& p, const ChipConfig& cfg) {
  ReduceKernel k(s, cfg);
  KernelBuilder& b = k.b();
  const int64_t G = p.group, T = p.chunk;
  k.begin();
  // Double-buffered: chunks alternate between two input copies (load parity), groups between
  // two copies of what MTE3 stores (output parity).
  const LaneKernelBuffers bufs = stream_buffers(s, G);
  const BufferPlan::Placed at = k.k().allocate(bufs.plan, T);
  const LaneBuffers lb(at, bufs.lane);
  k.prologue(lb.divvec, G, s.arg ? &lb.arg : nullptr, lb.iota64, G);
  PingPong& sync = k.k().start_pingpong();
  const int64_t units = s.outer * s.split;
  k.k().streamed_groups(p.split, units, G, [&](const Reg& u0, const Reg&, const Reg& ug) {
    {
      Reg n = b.reg("slot lanes");
      b.mul(n, ug, kLanes32);
      if (s.arg) {
        vec_fill32(b, lb.acc,
                   combine_identity_bits(s.is_max ? Combine::kMax : Combine::kMin, s.ct), n);
        vec_fill32(b, lb.acc_idx, 0, n);
      } else {
        vec_fill32(b, lb.acc, combine_identity_bits(s.combine, s.ct), n);
      }
    }
    stream_chunks(k, s, T, at.twin(bufs.in), at[bufs.xw], lb, u0, ug);
    sync.out_step([&](int q) {
      sync.wait_out_free(q);
      reduce_slots(k, s, lb, q, ug, u0, ug);
    });
  });
  return k.finish(p.split.block_dim,
                  fmt::format("{}: {} rows of {} of {}{}, {} blocks of {}, chunks of {}, groups "
                              "of {}",
                              s.name, s.outer, s.R, isa::dtype_name(s.in_type),
                              s.split > 1 ? fmt::format(" in {} parts of {}", s.split, s.split_len)
                                          : std::string(),
                              p.split.block_dim, p.split.per, T, G));
}

// ---- columns: inner > 1 (or the parts of a split reduction) ----

struct ColumnPlan {
  BlockSplit split;   // output elements per block (whole 32-byte blocks)
  int64_t width = 0;  // output elements per staging tile
  int64_t pitch = 0;  // lanes per loaded row (>= any piece's phase + width)
  int64_t rows = 0;   // rows per load group
  int64_t classes = 1;  // rows loaded per strided copy are `classes` apart
  bool row_loads = false;  // one copy per row instead
};

// The columns kernel's buffers for tiles of `width` outputs and rows of `pitch` lanes; units:
// rows per load group.
struct ColumnBuffers {
  BufferPlan plan;
  BufferPlan::Id staging, staging_idx, in, idx, xw, acc, acc_idx, rvec, bits, out_tmp, divvec;
};

ColumnBuffers column_buffers(const KernelSpec& s, int64_t width, int64_t pitch) {
  ColumnBuffers c;
  BufferPlan& p = c.plan;
  const int64_t pitch4 = pitch * kLaneBytes;
  // Output tiles alternate between two staging copies (output parity), row groups between two
  // input copies (load parity); the widened rows and accumulators are V's.
  c.staging = p.add_sized("output tile", fixed_blocks(width * isz(value_out_type(s))), 2);
  c.staging_idx = p.add_sized("index tile", fixed_blocks(width * kLaneBytes), 2, s.partial_idx);
  c.in = p.add_sized("input rows", blocks_of(pitch * isz(s.in_type)), 2);
  c.idx = p.add_sized("input indices", blocks_of(pitch4), 2, s.idx_input);
  c.xw = p.add_sized("widened rows", blocks_of(pitch4), 1, separate_x(s));
  c.acc = p.add_sized("accumulator", fixed_blocks(pitch4));
  c.acc_idx = p.add_sized("index accumulator", fixed_blocks(pitch4), 1, s.arg);
  c.rvec = p.add_sized("row index", fixed_blocks(pitch4), 1, s.arg);
  c.bits = p.add_sized("compare bits", fixed_blocks(pitch / 8), 1, s.arg);
  c.out_tmp = p.add_sized("output values", fixed_blocks(pitch * isz(s.out_type)));
  c.divvec = p.add_sized("divisor", fixed_blocks(pitch4), 1, s.divisor > 0);
  declare_repeat_overhang(p);
  return c;
}

// The most rows per load group of the columns kernel for tiles of `width` outputs: the group
// size its cycles were measured with (the UB left by the other buffers, each taken 32 bytes
// larger, shared out per loaded row). A tuning cap, not a budget: fit() decides what fits.
// Exact fits give a few more rows, which moves these launches' cycles by up to 4% either way
// (the fold's operand offsets and UB bank conflicts change).
int64_t column_rows_cap(const KernelSpec& s, int64_t width, int64_t pitch, uint64_t ub) {
  int64_t fixed = 0, buffers = 0;
  auto add = [&](int64_t bytes) {
    fixed += rnd(bytes);
    ++buffers;
  };
  for (int q = 0; q < 2; ++q) {  // ping and pong output tiles
    add(width * isz(value_out_type(s)));
    if (s.partial_idx) add(width * kLaneBytes);
  }
  add(pitch * kLaneBytes);  // accumulator
  if (s.arg) {
    add(pitch * kLaneBytes * 2);  // index accumulator, row indices
    add(pitch / 8);               // compare bits
  }
  add(pitch * isz(s.out_type));
  if (s.divisor > 0) add(pitch * kLaneBytes);
  // Per loaded row: two copies of the input (and index) lanes, one widened.
  const int64_t per_row = pitch * (2 * isz(s.in_type) + (separate_x(s) ? kLaneBytes : 0) +
                                   (s.idx_input ? 2 * kLaneBytes : 0));
  return (static_cast<int64_t>(ub) - fixed - (buffers + 5) * kBlock) / per_row;
}

ColumnPlan plan_columns(const KernelSpec& s, const ChipConfig& cfg) {
  const VectorCores cores = VectorCores::of(cfg);
  ColumnPlan p;
  const int64_t og = kBlock / isz(value_out_type(s));
  p.split = BlockSplit::make(out_elems(s), cores.count, og);
  const uint64_t ub = cfg.core_kind(cores.kind)->capacity(Buf::UB);
  const int64_t gin = kBlock / isz(s.in_type);
  for (p.width = std::min(p.split.per, kStagingMax); p.width >= og;
       p.width = round_up(p.width / 2, og)) {
    p.pitch = round_up(p.width, std::max<int64_t>(gin, kBlockLanes32));
    p.rows = column_buffers(s, p.width, p.pitch)
                 .plan.fit(cfg, cores.kind, 1,
                           std::min(part_len(s), column_rows_cap(s, p.width, p.pitch, ub)));
    if (p.rows >= 1) break;
    if (p.width == og)
      throw CompileError(fmt::format("{}: the reduction's buffers do not fit in the {} bytes "
                                     "of UB",
                                     s.op, ub));
  }
  // Rows whose starts are `classes` apart share their phase in a block: one strided copy.
  const int64_t row_bytes = s.inner * isz(s.in_type);
  const int64_t max_lanes = std::min(p.width, og - 1 + s.inner);
  const int64_t max_burst = ceil_div(max_lanes * isz(s.in_type), kBlock);
  const int64_t g0 = kBlock / std::gcd(row_bytes, kBlock);
  p.classes = g0 * ceil_div(kBlock * max_burst, g0 * row_bytes);
  p.row_loads = p.classes * row_bytes / kBlock > kMaxBurst ||
                p.classes * p.pitch * isz(s.in_type) / kBlock > kMaxBurst || p.classes > 32;
  return p;
}

// The columns kernel: staging tiles of the block's outputs, each filled piece by piece (last to
// first), each piece's rows loaded and combined in groups of Gr rows.
class ColumnsEmitter {
 public:
  ColumnsEmitter(const KernelSpec& s, const ColumnPlan& p, const ChipConfig& cfg)
      : m_s(s), m_p(p), m_k(s, cfg), m_b(m_k.b()), m_osz(isz(value_out_type(s))),
        m_og(kBlock / m_osz) {}

  Launch build() {
    KernelBuilder& b = m_b;
    const int64_t W = m_p.width, Pc = m_p.pitch;
    m_k.begin();
    const ColumnBuffers bufs = column_buffers(m_s, W, Pc);
    const BufferPlan::Placed at = m_k.k().allocate(bufs.plan, m_p.rows);
    take_twins(at, {{&m_staging, bufs.staging}, {&m_staging_idx, bufs.staging_idx},
                    {&m_in, bufs.in}, {&m_idx, bufs.idx}});
    take_buffers(at, {{&m_xw, bufs.xw}, {&m_acc, bufs.acc}, {&m_acc_idx, bufs.acc_idx},
                      {&m_rvec, bufs.rvec}, {&m_bits, bufs.bits}, {&m_out_tmp, bufs.out_tmp},
                      {&m_divvec, bufs.divvec}});
    m_k.prologue(m_divvec, Pc, nullptr, 0, 0);
    PingPong& sync = m_k.k().start_pingpong();

    Reg q0 = b.reg("first output of the block"), qend = b.reg("end of the block's outputs");
    m_k.k().block_range(q0, qend, m_p.split.per, out_elems(m_s));
    Reg c0 = b.reg("tile start"), c1 = b.reg("tile end");
    b.for_range(c0, q0, qend, W, [&] {
      b.add(c1, c0, W);
      b.min(c1, c1, qend);
      sync.out_step([&](int oq) { tile(c0, c1, oq); });
    });
    return m_k.finish(m_p.split.block_dim, summary());
  }

 private:
  // One piece: unit u's inner positions [a, a + w) of the tile, at phase ph in its output
  // block; its rows row0 .. row0 + nrows of the unit's part, row 0's window at `base` elements.
  struct Piece {
    Reg a, w, ph, lanes, base, row0, nrows, burst;
  };

  // Output tile [c0, c1) in staging copy oq: its pieces, then the store.
  void tile(const Reg& c0, const Reg& c1, int oq) {
    KernelBuilder& b = m_b;
    PingPong& sync = m_k.k().sync();
    sync.wait_out_free(oq);
    Reg u = b.reg("piece: unit (outer index, part)"), ulo = b.reg("first unit of the tile");
    b.sub(u, c1, 1);
    b.div(u, u, m_s.inner);
    b.div(ulo, c0, m_s.inner);
    Label top = b.label("piece"), done = b.label("pieces_done");
    b.bind(top);
    b.branch(lt(u, ulo), done);
    {
      KernelBuilder::Origin op(b, "one piece: a unit's range of inner positions");
      Piece pc{b.reg("piece start"),          b.reg("piece end / width"),
               b.reg("phase"),                b.reg("lanes (phase + width)"),
               b.reg("row 0 window (bytes)"), b.reg("first row of the part"),
               b.reg("rows of the part"),     b.reg("blocks per row")};
      window(pc, u, c0, c1);
      reset_accumulator(pc);
      Reg r = b.reg("row group");
      reduce_rows(pc, r);
      into_tile(pc, c0, oq);
    }
    b.sub(u, u, 1);
    b.jmp(top);
    b.bind(done);
    sync.out_ready(oq);
    Reg cnt = b.reg("tile elements");
    b.sub(cnt, c1, c0);
    m_k.store(m_k.out(), c0, m_staging[oq], cnt, m_osz);
    if (m_s.partial_idx) m_k.store(m_k.out1(), c0, m_staging_idx[oq], cnt, kLaneBytes);
    sync.stored(oq);
  }

  // The piece of unit u in tile [c0, c1).
  void window(const Piece& pc, const Reg& u, const Reg& c0, const Reg& c1) {
    KernelBuilder& b = m_b;
    const int64_t plen = part_len(m_s);
    Reg t = b.reg("temporary");
    b.mul(t, u, m_s.inner);
    b.max(pc.a, c0, t);
    b.add(pc.w, t, m_s.inner);
    b.min(pc.w, pc.w, c1);
    b.sub(pc.w, pc.w, pc.a);
    b.sub(pc.ph, pc.a, c0);
    b.and_(pc.ph, pc.ph, m_og - 1);
    b.add(pc.lanes, pc.ph, pc.w);
    // unit u: outer index u / split, part u % split (rows row0 .. row0 + nrows).
    Reg o = b.reg("outer index");
    b.div(o, u, m_s.split);
    b.mul(pc.row0, o, m_s.split);
    b.sub(pc.row0, u, pc.row0);
    b.mul(pc.row0, pc.row0, plen);
    b.movi(pc.nrows, m_s.R);
    b.sub(pc.nrows, pc.nrows, pc.row0);
    b.min(pc.nrows, pc.nrows, plen);
    // window start (elements): (o * R + row0) * inner + (a - u * inner) - ph
    b.mul(pc.base, o, m_s.R);
    b.add(pc.base, pc.base, pc.row0);
    b.mul(pc.base, pc.base, m_s.inner);
    b.sub(t, pc.a, t);
    b.add(pc.base, pc.base, t);
    b.sub(pc.base, pc.base, pc.ph);
    count_blocks(b, pc.burst, pc.lanes, isz(m_s.in_type));
  }

  // The piece's accumulator (and Arg indices) = the identity.
  void reset_accumulator(const Piece& pc) {
    const KernelSpec& s = m_s;
    if (s.arg) {
      vec_fill32(m_b, m_acc,
                 combine_identity_bits(s.is_max ? Combine::kMax : Combine::kMin, s.ct), pc.lanes);
      vec_fill32(m_b, m_acc_idx, 0, pc.lanes);
    } else {
      vec_fill32(m_b, m_acc, combine_identity_bits(s.combine, s.ct), pc.lanes);
    }
  }

  // Every group of the piece's rows combined into the accumulator (r: the group's first row).
  void reduce_rows(const Piece& pc, const Reg& r) {
    KernelBuilder& b = m_b;
    const int64_t Gr = m_p.rows;
    b.for_range(r, 0, pc.nrows, Gr, [&] {
      Reg n = b.reg("rows in the group");
      b.sub(n, pc.nrows, r);
      b.min(n, n, Gr);
      m_k.k().sync().load_step([&](int q) { row_group(pc, r, n, q); });
    });
  }

  // Rows r .. r + n - 1 of the piece into load copy q, widened, combined into the accumulator.
  void row_group(const Piece& pc, const Reg& r, const Reg& n, int q) {
    KernelBuilder& b = m_b;
    PingPong& sync = m_k.k().sync();
    const uint64_t x = separate_x(m_s) ? m_xw : m_in[q];
    sync.wait_load_free(q);
    load_rows(pc, r, n, m_in[q], m_k.in(), isz(m_s.in_type));
    if (m_s.idx_input) load_rows(pc, r, n, m_idx[q], m_k.idx_in(), kLaneBytes);
    sync.loaded(q);
    {
      Reg cnt = b.reg("lanes of the group");
      b.mul(cnt, n, m_p.pitch);
      m_k.widen(x, m_in[q], cnt);
    }
    if (m_s.arg) arg_rows(pc, r, n, x, m_idx[q]);
    else fold_rows(pc, n, x);
    sync.release_load(q);
  }

  // Rows r .. r + n - 1 of the piece: row kk at window + (r + kk) * inner elements of `esz`
  // bytes from gm, into buf + kk * Pc elements.
  void load_rows(const Piece& pc, const Reg& r, const Reg& n, uint64_t buf, const Reg& gm,
                 int esz) {
    KernelBuilder& b = m_b;
    const int64_t Pc = m_p.pitch, classes = m_p.classes, inner = m_s.inner;
    KernelBuilder::Origin ol(b, "load the rows of the piece");
    Reg src = b.reg("source"), dst = b.reg("destination");
    Reg win = b.reg("window");
    b.mul_add(win, pc.base, esz, gm);
    if (m_p.row_loads) {
      Reg kk = b.reg("row");
      b.for_range(kk, 0, n, 1, [&] {
        b.add(src, r, kk);
        b.mul_add(src, src, inner * esz, win);
        b.mul_add(dst, kk, Pc * esz, static_cast<int64_t>(buf));
        b.emit(Opcode::op_copy_gm2ub, {dst, src, 1, pc.burst, 0, 0});
      });
      return;
    }
    Reg nb = b.reg("rows of the class"), sgap = b.reg("source gap");
    Reg dgap = b.reg("destination gap");
    b.movi(sgap, classes * inner * esz / kBlock);
    b.sub(sgap, sgap, pc.burst);
    b.movi(dgap, classes * Pc * esz / kBlock);
    b.sub(dgap, dgap, pc.burst);
    for (int64_t cls = 0; cls < classes; ++cls) {
      b.if_(ge(n, cls + 1), [&] {
        b.sub(nb, n, cls);
        b.add(nb, nb, classes - 1);
        b.div(nb, nb, classes);
        b.add(src, r, cls);
        b.mul_add(src, src, inner * esz, win);
        b.emit(Opcode::op_copy_gm2ub,
               {static_cast<int64_t>(buf) + cls * Pc * esz, src, nb, pc.burst, sgap, dgap},
               fmt::format("rows {} mod {}", cls, classes));
      });
    }
  }

  // Arg: the n rows at x in order into the accumulator, a lane taking a later row's value (and
  // index: idx_buf's, or the row's) only if strictly better.
  void arg_rows(const Piece& pc, const Reg& r, const Reg& n, uint64_t x, uint64_t idx_buf) {
    KernelBuilder& b = m_b;
    const KernelSpec& s = m_s;
    const int64_t Pc = m_p.pitch;
    KernelBuilder::Origin oa(b, "rows in order into the accumulator");
    Reg kk = b.reg("row"), row = b.reg("row lanes"), rv = b.reg("row index lanes");
    Reg ri = b.reg("row index");
    b.for_range(kk, 0, n, 1, [&] {
      b.mul_add(row, kk, Pc * kLaneBytes, static_cast<int64_t>(x));
      if (s.idx_input) {
        b.mul_add(rv, kk, Pc * kLaneBytes, static_cast<int64_t>(idx_buf));
      } else {
        b.add(ri, pc.row0, r);
        b.add(ri, ri, kk);
        b.emit(Opcode::op_set_mask_count, {pc.lanes});
        b.emit(Opcode::op_vdup, {Dtype::S32, m_rvec, ri, 0, 1, 8});
        b.movi(rv, static_cast<int64_t>(m_rvec));
      }
      b.emit(Opcode::op_set_mask_count, {pc.lanes});
      vec_compare_strided(b, s.ct, s.is_max ? isa::Cmp::GT : isa::Cmp::LT, m_bits,
                          VOperand(row), VOperand(m_acc), 0);
      vec_select_strided(b, s.ct, VOperand(m_acc), VOperand(row), VOperand(m_acc), m_bits, 0);
      vec_select_strided(b, Dtype::S32, VOperand(m_acc_idx), VOperand(rv), VOperand(m_acc_idx),
                         m_bits, 0);
    });
  }

  // The n rows at x folded in halves (rows [0, m - h) op= rows [h, m), h = ceil(m / 2)), then
  // combined into the accumulator.
  void fold_rows(const Piece& pc, const Reg& n, uint64_t x) {
    KernelBuilder& b = m_b;
    const Opcode op = combine_opcode(m_s.combine);
    KernelBuilder::Origin of(b, "fold the rows in halves");
    Reg m = b.reg("rows left"), h = b.reg("half"), cnt = b.reg("lanes"), hi = b.reg("rows h..");
    b.mov(m, n);
    Label fold = b.label("fold"), folded = b.label("folded");
    b.bind(fold);
    b.branch(lt(m, 2), folded);
    b.add(h, m, 1);
    b.shr(h, h, 1);
    b.sub(cnt, m, h);
    b.mul(cnt, cnt, m_p.pitch);
    b.mul_add(hi, h, m_p.pitch * kLaneBytes, static_cast<int64_t>(x));
    vec_binary(b, op, m_s.ct, x, x, hi, cnt);
    b.mov(m, h);
    b.jmp(fold);
    b.bind(folded);
    vec_binary(b, op, m_s.ct, m_acc, m_acc, x, pc.lanes);
  }

  // The piece's results into staging copy oq: from its block-aligned start, exact end.
  void into_tile(const Piece& pc, const Reg& c0, int oq) {
    KernelBuilder& b = m_b;
    const KernelSpec& s = m_s;
    Reg dst = b.reg("tile position");
    b.sub(dst, pc.a, c0);
    b.sub(dst, dst, pc.ph);
    if (s.arg && !s.partial_idx) {
      Reg d = b.reg("address");
      b.mul_add(d, dst, kLaneBytes, static_cast<int64_t>(m_staging[oq]));
      vec_copy_bits(b, kLaneBytes, d, m_acc_idx, pc.lanes);
      return;
    }
    const uint64_t v = s.arg ? m_acc : m_k.finalize(m_acc, pc.lanes, m_divvec, m_out_tmp);
    Reg d = b.reg("address");
    b.mul_add(d, dst, m_osz, static_cast<int64_t>(m_staging[oq]));
    vec_copy_bits(b, m_osz, d, v, pc.lanes);
    if (s.partial_idx) {
      b.mul_add(d, dst, kLaneBytes, static_cast<int64_t>(m_staging_idx[oq]));
      vec_copy_bits(b, kLaneBytes, d, m_acc_idx, pc.lanes);
    }
  }

  std::string summary() const {
    const KernelSpec& s = m_s;
    const ColumnPlan& p = m_p;
    return fmt::format(
        "{}: [{}, {}, {}] of {} over the middle dim{}, {} blocks of {} outputs, tiles of {}, {} "
        "rows x {} lanes per load{}",
        s.name, s.outer, s.R, s.inner, isa::dtype_name(s.in_type),
        s.split > 1 ? fmt::format(" in {} parts of {}", s.split, s.split_len) : std::string(),
        p.split.block_dim, p.split.per, p.width, p.rows, p.pitch,
        p.row_loads
            ? ", row by row, double-buffered"
            : fmt::format(", strided copies of every {}th row, double-buffered", p.classes));
  }

  const KernelSpec& m_s;
  const ColumnPlan& m_p;
  ReduceKernel m_k;
  KernelBuilder& m_b;
  const int m_osz;     // bytes per output value
  const int64_t m_og;  // output values per 32-byte block
  // Output tiles alternate between two staging copies (output parity), row groups between two
  // input copies (load parity); the widened rows and accumulators are V's.
  Twin m_staging, m_staging_idx, m_in, m_idx;
  uint64_t m_xw = 0, m_acc = 0, m_acc_idx = 0, m_rvec = 0, m_bits = 0, m_out_tmp = 0;
  uint64_t m_divvec = 0;
};

Launch build_columns(const KernelSpec& s, const ColumnPlan& p, const ChipConfig& cfg) {
  return ColumnsEmitter(s, p, cfg).build();
}

}  // namespace

// ---- stages and the public entry points ----

namespace {

Combine combine_of(ReduceKind k) {
  switch (k) {
    case ReduceKind::kMax: return Combine::kMax;
    case ReduceKind::kMin: return Combine::kMin;
    case ReduceKind::kProd: return Combine::kProd;
    default: return Combine::kSum;
  }
}

const char* kind_name(ReduceKind k) {
  switch (k) {
    case ReduceKind::kSum: return "Sum";
    case ReduceKind::kMean: return "Mean";
    case ReduceKind::kMax: return "Max";
    case ReduceKind::kMin: return "Min";
    case ReduceKind::kProd: return "Prod";
    case ReduceKind::kArgMax: return "ArgMax";
    case ReduceKind::kArgMin: return "ArgMin";
  }
  return "?";
}

// The bits of `value` in a float type (f32, f16, bf16) or of an integer in s32.
uint64_t value_bits(DataType t, double value) {
  switch (t) {
    case DataType::F32: return f32_to_bits(static_cast<float>(value));
    case DataType::F16: return narrow_f16_rne(static_cast<float>(value));
    case DataType::BF16: return narrow_bf16_rne(static_cast<float>(value));
    default: return static_cast<uint32_t>(static_cast<int32_t>(value));
  }
}

// The result of reducing no elements: the identity, NaN for Mean.
uint64_t empty_result_bits(ReduceKind k, DataType t) {
  const bool f = data_type_is_float(t);
  const double inf = std::numeric_limits<double>::infinity();
  switch (k) {
    case ReduceKind::kSum: return 0;
    case ReduceKind::kProd: return value_bits(t, 1);
    case ReduceKind::kMean: return value_bits(t, std::numeric_limits<double>::quiet_NaN());
    case ReduceKind::kMax:
      return f ? value_bits(t, -inf) : value_bits(t, std::numeric_limits<int32_t>::min());
    case ReduceKind::kMin:
      return f ? value_bits(t, inf) : value_bits(t, std::numeric_limits<int32_t>::max());
    default: return 0;
  }
}

// A launch writing `n` elements of `size` bytes (2 or 4) with `bits`; argument out (kOutput 0).
Launch fill_launch(const std::string& op, int64_t n, int size, uint64_t bits,
                   const ChipConfig& cfg) {
  StreamSpec spec;
  spec.kernel_name = fmt::format("Fill_{}", size * 8);
  spec.out_type = size == 2 ? Dtype::U16 : Dtype::S32;
  spec.out_shape = {n};
  spec.compute = [size, bits](KernelBuilder& b, const TileOperands& t) {
    vec_dup_bits(b, size, t.out, static_cast<int64_t>(bits), *t.count);
  };
  return build_stream_kernel(op, spec, cfg);
}

// No dim left to reduce (they were all of size 1): element-wise y = x as rt (x * x * scale for
// L2Loss, rt the input's type).
Launch elementwise_result(const std::string& op, const ReduceRequest& req, DataType rt,
                          const ChipConfig& cfg) {
  const DataType dt = req.input.dtype;
  const std::vector<int64_t> shape{req.input.num_elements()};
  if (!req.square && req.scale == 1) return build_stream_kernel(op, cast_spec(dt, rt, false, shape), cfg);
  StreamSpec spec;
  spec.kernel_name = fmt::format("Square_{}", data_type_name(dt));
  spec.inputs = {StreamInput{device_dtype(dt), broadcast_view(shape, shape), shape}};
  spec.out_type = device_dtype(dt);
  spec.out_shape = shape;
  spec.temps = {TempSpec{"f32 values", 4, 0}};
  const Dtype t = device_dtype(dt);
  spec.compute = [t, req](KernelBuilder& b, const TileOperands& tile) {
    const uint64_t f = t == Dtype::F32 ? tile.out : tile.temp[0];
    if (t != Dtype::F32) vec_convert(b, Dtype::F32, t, f, tile.in[0], RoundMode::kRint, *tile.count);
    const uint64_t src = t == Dtype::F32 ? tile.in[0] : f;
    if (req.square) vec_binary(b, Opcode::op_vmul, Dtype::F32, f, src, src, *tile.count);
    Reg sc = b.reg_imm("scale", vector_scalar_bits(Dtype::F32, req.scale));
    vec_scalar(b, Opcode::op_vmuls, Dtype::F32, f, req.square ? f : src, sc, *tile.count);
    if (t != Dtype::F32) vec_convert(b, t, Dtype::F32, tile.out, f, RoundMode::kRint, *tile.count);
  };
  return build_stream_kernel(op, spec, cfg);
}

// Splits R into parts when the stage has few outputs for the cores and a long R: the number of
// parts (1: no split).
int64_t split_parts(const KernelSpec& s, int64_t cores) {
  const int64_t outputs = s.outer * s.inner;
  const int64_t og = kBlock / isz(s.out_type);
  if (ceil_div(outputs, og) >= cores) return 1;
  const int64_t want = ceil_div(cores * kBlockLanes32, outputs);
  return std::max<int64_t>(1, std::min({want, s.R * s.inner / kSplitMinElems, s.R}));
}

// A stage split into `parts` over R (append_stage), first pass: the partial results of every
// (outer, part, inner) in the compute type.
KernelSpec split_first_pass(const KernelSpec& s, int64_t parts) {
  KernelSpec first = s;
  first.split_len = ceil_div(s.R, parts);
  first.split = ceil_div(s.R, first.split_len);
  first.name = s.name + "_parts";
  first.divisor = 0;
  first.scale = 1;
  if (s.arg)
    first.partial_idx = true;
  else
    first.out_type = s.ct;
  return first;
}

// Its second pass: the columns kernel reducing the parts (in order, so Arg keeps the first
// index).
KernelSpec split_combine(const KernelSpec& s, const KernelSpec& first) {
  KernelSpec second = s;
  second.name = s.name + "_combine";
  second.in_type = s.ct;
  second.square = false;
  second.idx_input = s.arg;
  second.R = first.split;
  return second;
}

// Appends the launch(es) of one stage: spec s (outer, R, inner, types, final settings) from
// `in` to `out`.
void append_stage(LaunchPlan& plan, const CompileContext& ctx, const KernelSpec& s, ArgRef in,
                  ArgRef out) {
  const ChipConfig& cfg = ctx.cfg;
  const int64_t cores = VectorCores::of(cfg).count;
  if (s.inner == 1) {
    if (auto rp = plan_rows(s, cfg)) {
      plan.add(build_rows(s, *rp, cfg), {in, out});
      return;
    }
  }
  int64_t parts = split_parts(s, cores);
  if (parts <= 1) {
    if (s.inner == 1) plan.add(build_stream(s, plan_stream(s, cfg), cfg), {in, out});
    else plan.add(build_columns(s, plan_columns(s, cfg), cfg), {in, out});
    return;
  }
  const KernelSpec first = split_first_pass(s, parts);
  const uint64_t partial_bytes = static_cast<uint64_t>(out_elems(first) * kLaneBytes);
  const ArgRef vals = plan.workspace(partial_bytes);
  const ArgRef idx = s.arg ? plan.workspace(partial_bytes) : ArgRef{};
  std::vector<ArgRef> first_args{in, vals};
  if (s.arg) first_args.push_back(idx);
  if (s.inner == 1) plan.add(build_stream(first, plan_stream(first, cfg), cfg), first_args);
  else plan.add(build_columns(first, plan_columns(first, cfg), cfg), first_args);
  const KernelSpec second = split_combine(s, first);
  std::vector<ArgRef> second_args{vals};
  if (s.arg) second_args.push_back(idx);
  second_args.push_back(out);
  plan.add(build_columns(second, plan_columns(second, cfg), cfg), second_args);
}

}  // namespace

std::vector<bool> reduction_axes(const OpDesc& op, const std::vector<int64_t>& axes,
                                 size_t rank) {
  std::vector<bool> reduced(rank, false);
  const int64_t r = static_cast<int64_t>(rank);
  for (int64_t a : axes) {
    if (a < -r || a >= r)
      op.invalid(fmt::format("reduction axis {} is out of range for a tensor of rank {}", a, r));
    reduced[static_cast<size_t>(a < 0 ? a + r : a)] = true;
  }
  return reduced;
}

bool square_sums_share_rows(int64_t elements) {
  return elements > 0 && elements % kBlockLanes32 == 0 && elements < 2 * kSplitMinElems;
}

void append_reduce(LaunchPlan& plan, const CompileContext& ctx, const ReduceRequest& req,
                   ArgRef in, ArgRef out) {
  const OpDesc& op = ctx.op;
  const DataType dt = req.input.dtype;
  const bool arg = req.kind == ReduceKind::kArgMax || req.kind == ReduceKind::kArgMin;
  if (!arg && !req.square && req.scale == 1 &&
      (dt == DataType::S64 || (dt == DataType::S32 && req.kind == ReduceKind::kMean))) {
    append_scalar_reduce(plan, ctx, kind_name(req.kind), req.input, req.reduced, in, out);
    return;
  }
  if (!data_type_is_float(dt) && dt != DataType::S32)
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16, s32)", data_type_name(dt)));
  if ((req.square || req.scale != 1) && !data_type_is_float(dt))
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16)", data_type_name(dt)));
  const std::vector<int64_t>& shape = req.input.shape;
  if (req.reduced.size() != shape.size()) op.fail("internal: reduced flags do not match the rank");
  int64_t n_out = 1, n_red = 1;
  for (size_t i = 0; i < shape.size(); ++i) (req.reduced[i] ? n_red : n_out) *= shape[i];
  if (n_out == 0) return;  // nothing to write
  // The values' type: a float input's result may be another float type (ReduceRequest).
  const DataType rt = data_type_is_float(dt) && data_type_is_float(req.out_type) ? req.out_type : dt;
  const std::string name = fmt::format("{}_{}", kind_name(req.kind), data_type_name(dt));
  if (n_red == 0) {
    if (arg) op.invalid("the reduction axis is empty (TF fails too)");
    plan.add(fill_launch(op.str(), n_out, data_type_bytes(rt), empty_result_bits(req.kind, rt),
                         ctx.cfg),
             {out}, "empty reduction");
    return;
  }
  // Drop size-1 dims, merge neighbours of the same kind: [K0, R1, K1, R2, ...].
  std::vector<std::pair<int64_t, bool>> dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (!dims.empty() && dims.back().second == req.reduced[i]) dims.back().first *= shape[i];
    else dims.emplace_back(shape[i], req.reduced[i]);
  }
  const bool any_reduced =
      std::any_of(dims.begin(), dims.end(), [](const auto& d) { return d.second; });
  if (!any_reduced) {
    if (arg) {  // every index is 0
      const int64_t words = req.out_type == DataType::S64 ? 2 * n_out : n_out;
      plan.add(fill_launch(op.str(), words, 4, 0, ctx.cfg), {out}, "reduced dims of size 1");
    } else {
      if (rt != dt && (req.square || req.scale != 1))
        op.fail("internal: a squared or scaled reduction of no dims to another type");
      plan.add(elementwise_result(op.str(), req, rt, ctx.cfg), {in, out}, "reduced dims of size 1");
    }
    return;
  }
  const Dtype ct = dt == DataType::S32 ? Dtype::S32 : Dtype::F32;
  const bool widen_idx = arg && req.out_type == DataType::S64;
  const ArgRef idx32 = widen_idx ? plan.workspace(static_cast<uint64_t>(n_out) * 4) : ArgRef{};
  ArgRef cur = in;
  for (int stage = 0;; ++stage) {
    size_t i = dims.size();
    while (i-- > 0 && !dims[i].second) {}
    int64_t outer = 1, inner = 1;
    for (size_t j = 0; j < i; ++j) outer *= dims[j].first;
    for (size_t j = i + 1; j < dims.size(); ++j) inner *= dims[j].first;
    KernelSpec s;
    s.op = op.str();
    s.name = fmt::format("{}_{}", name, inner == 1 ? "rows" : "columns");
    s.combine = combine_of(req.kind);
    s.arg = arg;
    s.is_max = req.kind == ReduceKind::kArgMax;
    s.in_type = stage == 0 ? device_dtype(dt) : ct;
    s.ct = ct;
    s.outer = outer;
    s.R = dims[i].first;
    s.inner = inner;
    s.square = req.square && stage == 0;
    dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(i));
    if (i > 0 && i < dims.size()) {  // the kept dims around it become one
      dims[i - 1].first *= dims[i].first;
      dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(i));
    }
    const bool last = std::none_of(dims.begin(), dims.end(), [](const auto& d) { return d.second; });
    if (last) {
      s.out_type = arg ? Dtype::S32 : device_dtype(rt);
      s.divisor = req.kind == ReduceKind::kMean ? static_cast<double>(n_red) : 0;
      s.scale = req.scale;
      append_stage(plan, ctx, s, cur, widen_idx ? idx32 : out);
      break;
    }
    s.out_type = ct;
    const ArgRef next = plan.workspace(static_cast<uint64_t>(outer * inner) * kLaneBytes);
    append_stage(plan, ctx, s, cur, next);
    cur = next;
  }
  if (widen_idx) plan.add(build_widen_s32_to_s64(op.str(), n_out, ctx.cfg), {idx32, out});
}

namespace {

// All / Any (compile_reduce): req is the bool input's reduction as Min / Sum; three launches
// through the workspace: the input cast to s32 (0 / 1), that reduction, its result cast to bool.
CompiledKernel compile_logical_reduce(const CompileContext& ctx, ReduceRequest req,
                                      const std::vector<int64_t>& out_shape) {
  const OpDesc& op = ctx.op;
  const TensorDesc out{DataType::BOOL, out_shape};
  const int64_t n_in = req.input.num_elements(), n_out = out.num_elements();
  if (n_out > 0 && n_in / n_out > std::numeric_limits<int32_t>::max())
    op.fail(fmt::format("{} values reduced into each output: at most 2^31 - 1", n_in / n_out));
  LaunchPlan plan({out});
  if (n_out == 0) return std::move(plan).finish();
  const ArgRef values = plan.workspace(static_cast<uint64_t>(n_in) * 4);
  if (n_in > 0)
    plan.add(build_stream_kernel(op.str(), cast_spec(DataType::BOOL, DataType::S32, false,
                                                     req.input.shape),
                                 ctx.cfg),
             {LaunchPlan::input(0), values}, "bool -> s32");
  const ArgRef reduced = plan.workspace(static_cast<uint64_t>(n_out) * 4);
  req.input.dtype = DataType::S32;
  req.out_type = DataType::S32;
  append_reduce(plan, ctx, req, values, reduced);
  plan.add(build_stream_kernel(op.str(), cast_spec(DataType::S32, DataType::BOOL, false, {n_out}),
                               ctx.cfg),
           {reduced, LaunchPlan::output(0)}, "s32 -> bool");
  return std::move(plan).finish();
}

// ---- SquareSumV1 over N > 1 tensors (Lamb's per-variable norms, graph_fusion.h rewrite 17b) ----

// A segment of a multi-tensor copy: `n` f32 elements from input to output, bit for bit.
StreamSpec copy_segment(const std::string& name, int64_t n) {
  StreamSpec s;
  s.kernel_name = name;
  s.inputs.push_back(StreamInput{Dtype::F32, broadcast_view({n}, {n}), {n}});
  s.out_type = Dtype::F32;
  s.out_shape = {n};
  s.compute = [](KernelBuilder& b, const TileOperands& t) {
    vec_copy_bits(b, 4, t.out, t.in[0], *t.count);
  };
  return s;
}

// Appends the launches copying `count` segments of `n` f32 elements each, segment g from
// in(g) to out(g): multi-tensor streams (build_multi_stream_kernel) of at most
// KernelBuilder::max_args() / 2 segments each (one input and one output per segment).
void append_copies(LaunchPlan& plan, const ChipConfig& cfg, const std::string& op,
                   const std::string& name, int64_t count, int64_t n,
                   const std::function<ArgRef(int64_t)>& in,
                   const std::function<ArgRef(int64_t)>& out) {
  const int64_t per_launch = KernelBuilder::max_args() / 2;
  for (int64_t first = 0; first < count; first += per_launch) {
    const int64_t c = std::min(per_launch, count - first);
    std::vector<StreamSpec> segments(static_cast<size_t>(c), copy_segment(name, n));
    Launch l = c == 1 ? build_stream_kernel(op, segments[0], cfg)
                      : build_multi_stream_kernel(op, segments, cfg);
    // Segment s's input is kInput s, its output kOutput s (a single stream's: 0 and 0).
    std::vector<ArgRef> args;
    for (const ArgRef& a : l.args) {
      if (a.kind == ArgRef::Kind::kInput)
        args.push_back(in(first + a.index));
      else if (a.kind == ArgRef::Kind::kOutput)
        args.push_back(out(first + a.index));
      else
        throw std::logic_error("append_copies: a copy stream with an argument of its own");
    }
    plan.add(std::move(l), args);
  }
}

// The one stage of an f32 tensor of r elements reduced whole with squares, as append_reduce
// makes it for SquareSumV1.
KernelSpec whole_square_sum(const OpDesc& op, int64_t r) {
  KernelSpec s;
  s.op = op.str();
  s.name = fmt::format("{}_{}_rows", kind_name(ReduceKind::kSum), data_type_name(DataType::F32));
  s.combine = Combine::kSum;
  s.in_type = Dtype::F32;
  s.ct = Dtype::F32;
  s.out_type = Dtype::F32;
  s.R = r;
  s.square = true;
  return s;
}

// SquareSumV1 with attribute N = n > 1 (as CANN's multi-tensor kernels walk a list of tensors in
// one op): output i is SquareSumV1(input i; axis, keep_dims), the inputs of any shapes and float
// types. Inputs that are f32, reduced whole by `axis` and of one element count R with
// square_sums_share_rows(R), at least kMinRowInputs of them, are reduced together: copied as the
// rows of an [count, R] workspace tensor (multi-tensor streams), that tensor's rows reduced by
// the reduction engine in one launch, the sums copied to their outputs (multi-tensor streams).
// Each such output has the bits of its input's own SquareSumV1 launch: a row starting on a
// 32-byte block and reduced in one stage sums in the order the same values alone do
// (tests/compiler/test_compiler_reduce.cpp, "a row's sum of squares has the same bits in a
// launch of many rows"), and the copies move bits. Every other input gets its own launches, as
// its own SquareSumV1 would.
CompiledKernel compile_square_sums(const CompileContext& ctx, int64_t n) {
  // Three launches replace this many inputs' own: fewer launches from four inputs on.
  constexpr int64_t kMinRowInputs = 4;
  // Split inputs: their first passes, one combine and one copy replace two launches each.
  constexpr int64_t kMinPartsInputs = 3;
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != static_cast<size_t>(n))
    op.invalid(fmt::format("attribute N = {} but {} inputs", n, op.inputs.size()));
  if (!op.attrs.count("axis")) op.fail("attribute 'axis' (the reduced axes) is missing");
  const std::vector<int64_t> axes = op.attr_ints("axis");
  const bool keep = op.attr_bool("keep_dims", false);
  std::vector<TensorDesc> outs(static_cast<size_t>(n));
  std::map<int64_t, std::vector<int>> rows_of;   // R -> the inputs reduced as rows of R
  std::map<int64_t, std::vector<int>> parts_of;  // R -> the inputs split into parts, one combine
  std::vector<int> alone;
  const int64_t cores = VectorCores::of(ctx.cfg).count;
  for (int i = 0; i < static_cast<int>(n); ++i) {
    const TensorDesc& x = op.inputs[static_cast<size_t>(i)];
    const std::vector<bool> red = reduction_axes(op, axes, x.shape.size());
    const bool whole = std::find(red.begin(), red.end(), false) == red.end();
    const int64_t r = x.num_elements();
    outs[static_cast<size_t>(i)] =
        TensorDesc{DataType::F32, std::vector<int64_t>(keep ? x.shape.size() : 0, int64_t{1})};
    if (x.dtype != DataType::F32 || !whole || r == 0)
      alone.push_back(i);
    else if (square_sums_share_rows(r))
      rows_of[r].push_back(i);
    else if (split_parts(whole_square_sum(op, r), cores) > 1)
      parts_of[r].push_back(i);
    else
      alone.push_back(i);
  }
  for (auto& [r, inputs] : rows_of)
    if (static_cast<int64_t>(inputs.size()) < kMinRowInputs) {
      alone.insert(alone.end(), inputs.begin(), inputs.end());
      inputs.clear();
    }
  for (auto& [r, inputs] : parts_of)
    if (static_cast<int64_t>(inputs.size()) < kMinPartsInputs) {
      alone.insert(alone.end(), inputs.begin(), inputs.end());
      inputs.clear();
    }
  // Their own launches: input i's SquareSumV1, its errors named as input i's.
  std::vector<std::pair<int, CompiledKernel>> own;
  std::sort(alone.begin(), alone.end());
  for (int i : alone) {
    OpDesc sub = op;
    sub.inputs = {op.inputs[static_cast<size_t>(i)]};
    sub.attrs.erase("N");
    try {
      own.emplace_back(i, compile_reduce(CompileContext{sub, ctx.cfg, ctx.precision}));
    } catch (const InvalidOpError& e) {
      op.invalid(fmt::format("input {}: {}", i, e.what()));
    } catch (const CompileError& e) {
      op.fail(fmt::format("input {}: {}", i, e.what()));
    }
    outs[static_cast<size_t>(i)] = own.back().second.outputs.at(0);
  }
  LaunchPlan plan(outs);
  for (const auto& [i, k] : own) plan.add(k, {LaunchPlan::input(i)}, {LaunchPlan::output(i)});
  auto at = [](const ArgRef& base, int64_t bytes) {
    return ArgRef{ArgRef::Kind::kWorkspace, 0, base.value + static_cast<uint64_t>(bytes)};
  };
  for (const auto& [r, inputs] : rows_of) {
    if (inputs.empty()) continue;
    const int64_t count = static_cast<int64_t>(inputs.size());
    auto input = [&inputs](int64_t g) { return inputs[static_cast<size_t>(g)]; };
    const ArgRef rows = plan.workspace(static_cast<uint64_t>(count * r) * kLaneBytes);
    const ArgRef sums = plan.workspace(static_cast<uint64_t>(count) * kLaneBytes);
    append_copies(
        plan, ctx.cfg, op.str(), "square_sum_rows", count, r,
        [&](int64_t g) { return LaunchPlan::input(input(g)); },
        [&](int64_t g) { return at(rows, g * r * kLaneBytes); });
    ReduceRequest req;
    req.kind = ReduceKind::kSum;
    req.square = true;
    req.input = TensorDesc{DataType::F32, {count, r}};
    req.reduced = {false, true};
    req.out_type = DataType::F32;
    append_reduce(plan, ctx, req, rows, sums);
    append_copies(
        plan, ctx.cfg, op.str(), "square_sum_outputs", count, 1,
        [&](int64_t g) { return at(sums, g * kLaneBytes); },
        [&](int64_t g) { return LaunchPlan::output(input(g)); });
  }
  // Split inputs of one size: each one's first pass as its own launch has it, the partial results
  // side by side in the workspace; one combine over them all (the columns kernel of the parts,
  // outer = the inputs); the sums copied to their outputs.
  for (const auto& [r, inputs] : parts_of) {
    if (inputs.empty()) continue;
    const int64_t count = static_cast<int64_t>(inputs.size());
    const KernelSpec one = whole_square_sum(op, r);
    const KernelSpec first = split_first_pass(one, split_parts(one, cores));
    const int64_t part_bytes = first.split * kLaneBytes;
    const ArgRef partials = plan.workspace(static_cast<uint64_t>(count * part_bytes));
    const Launch pass = build_stream(first, plan_stream(first, ctx.cfg), ctx.cfg);
    for (int64_t g = 0; g < count; ++g)
      plan.add(pass,
               {LaunchPlan::input(inputs[static_cast<size_t>(g)]), at(partials, g * part_bytes)});
    KernelSpec combine = split_combine(one, first);
    combine.outer = count;
    const ArgRef sums = plan.workspace(static_cast<uint64_t>(count) * kLaneBytes);
    plan.add(build_columns(combine, plan_columns(combine, ctx.cfg), ctx.cfg), {partials, sums});
    append_copies(
        plan, ctx.cfg, op.str(), "square_sum_outputs", count, 1,
        [&](int64_t g) { return at(sums, g * kLaneBytes); },
        [&](int64_t g) { return LaunchPlan::output(inputs[static_cast<size_t>(g)]); });
  }
  return std::move(plan).finish();
}

}  // namespace

CompiledKernel compile_reduce(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  static const std::pair<const char*, ReduceKind> kKinds[] = {
      {"Sum", ReduceKind::kSum},       {"Mean", ReduceKind::kMean},
      {"Max", ReduceKind::kMax},       {"Min", ReduceKind::kMin},
      {"Prod", ReduceKind::kProd},     {"ArgMax", ReduceKind::kArgMax},
      {"ArgMin", ReduceKind::kArgMin}};
  ReduceRequest req;
  bool found = false;
  for (const auto& [name, kind] : kKinds)
    if (op.type == name) {
      req.kind = kind;
      found = true;
    }
  // All / Any of a bool tensor: the reduction of its 0 / 1 values as s32 (All: Min, whose
  // identity INT32_MAX makes an empty reduction true; Any: Sum, the count of true values, 0 for
  // an empty one), then != 0 as bool.
  const bool logical = op.type == "All" || op.type == "Any";
  if (logical) {
    req.kind = op.type == "All" ? ReduceKind::kMin : ReduceKind::kSum;
    found = true;
  }
  // SquareSumV1 (CANN's op type; the TF plugin's graph pass makes it of Sum(Square(x)):
  // graph_fusion.h rewrite 17): the Sum of x * x over attribute "axis" (TF's axes), the squares
  // taken in the reduction's own f32 pass instead of a Square launch writing them out.
  const bool square_sum = op.type == "SquareSumV1";
  if (square_sum) {
    // Attribute N > 1: the sums of squares of N tensors in one op (compile_square_sums).
    const int64_t n = op.attr_int("N", 1);
    if (n < 1) op.invalid(fmt::format("attribute N = {} (at least 1)", n));
    if (n > 1) return compile_square_sums(ctx, n);
    req.kind = ReduceKind::kSum;
    req.square = true;
    found = true;
  }
  if (!found) op.fail("internal: not a reduction");
  const bool arg = req.kind == ReduceKind::kArgMax || req.kind == ReduceKind::kArgMin;
  if (op.inputs.empty() || op.inputs.size() > 2)
    op.fail(fmt::format("takes the input and optionally its axes tensor, {} inputs given",
                        op.inputs.size()));
  if (op.inputs.size() == 2) {
    const TensorDesc& ax = op.inputs[1];
    if ((ax.dtype != DataType::S32 && ax.dtype != DataType::S64) || ax.shape.size() > 1)
      op.fail(fmt::format("input 1 ({}) is not an axes tensor (s32 or s64, rank <= 1)", ax.str()));
  }
  req.input = op.inputs[0];
  if (logical && req.input.dtype != DataType::BOOL)
    op.fail(fmt::format("input 0 ({}) must be bool", req.input.str()));
  const DataType dt = req.input.dtype;
  if (square_sum && !data_type_is_float(dt))
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16)", data_type_name(dt)));
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the input's {}", data_type_name(*t),
                        data_type_name(dt)));
  const std::vector<int64_t>& shape = req.input.shape;
  std::vector<int64_t> out_shape;
  if (arg) {
    if (!op.attrs.count("axis"))
      op.fail("attribute 'axis' (the value of the dimension input) is missing");
    req.reduced = reduction_axes(op, {op.attr_int("axis", 0)}, shape.size());
    req.out_type = op.attr_type("output_type").value_or(DataType::S64);
    if (req.out_type != DataType::S32 && req.out_type != DataType::S64)
      op.fail(fmt::format("output_type {} is not supported (s32, s64)",
                          data_type_name(req.out_type)));
    for (size_t i = 0; i < shape.size(); ++i) {
      if (!req.reduced[i]) out_shape.push_back(shape[i]);
      else if (shape[i] == 0) op.invalid(fmt::format("reduction axis {} is empty", i));
    }
  } else {
    const char* axes_attr = square_sum ? "axis" : "axes";
    auto it = op.attrs.find(axes_attr);
    if (it == op.attrs.end())
      op.fail(square_sum
                  ? "attribute 'axis' (the reduced axes) is missing"
                  : "attribute 'axes' (the values of the reduction_indices input) is missing");
    std::vector<int64_t> axes;
    if (const int64_t* one = std::get_if<int64_t>(&it->second)) axes = {*one};
    else axes = op.attr_ints(axes_attr);
    req.reduced = reduction_axes(op, axes, shape.size());
    req.out_type = dt;
    const bool keep = op.attr_bool("keep_dims", false);
    for (size_t i = 0; i < shape.size(); ++i)
      if (!req.reduced[i]) out_shape.push_back(shape[i]);
      else if (keep) out_shape.push_back(1);
  }
  if (logical) return compile_logical_reduce(ctx, req, out_shape);
  LaunchPlan plan({TensorDesc{req.out_type, out_shape}});
  append_reduce(plan, ctx, req, LaunchPlan::input(0), LaunchPlan::output(0));
  return std::move(plan).finish();
}

}  // namespace npusim::compiler::ops
