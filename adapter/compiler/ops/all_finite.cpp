// AllFinite (the TF plugin's op, graph_fusion.h rewrite 20: a loss scale's overflow check):
// x: N tensors of one float type T (f32, f16, bf16) -> y: a bool scalar, true exactly when every
// element of every x[i] is finite (MindSpore's amp.all_finite; CANN checks a list of gradients
// in one multi-tensor launch too, ForeachNonFiniteCheckAndUnscale). TensorFlow's graph computes
// it as All(Pack(All(IsFinite(x[i]), every axis) ...), [0]): four launches per tensor here.
// Attribute `ranks` (optional): the rank the graph reduced of each x[i]; an input of another rank
// is a CompileError (the fusion assumed every axis).
//
// The kernel, one launch on split chips with cross-core flags (two elsewhere):
//  - The tensors' 32-byte blocks, each tensor padded to whole blocks, form one range cut into B
//    equal parts of whole blocks, one per vector core (B = min(vector cores, blocks)). The cut is
//    known when compiling, so each core's code names its pieces (tensor, first element, count)
//    directly; a piece streams through the UB in tiles of up to L elements, double-buffered
//    (MTE2 loads tile t + 1 while V works on tile t).
//  - Per tile, d = x - x in f32 (f16 / bf16 converted to f32 first, exactly) is +0 for a finite
//    x and NaN for an infinity or a NaN; d is added into an f32 accumulator of L lanes. A sum
//    of +0s is +0 and NaN + anything is NaN, so the accumulator stays all +0 exactly when every
//    element was finite. Counts are exact: no lane past a tensor's end takes part (the bytes
//    after it in its last 32-byte block are not its elements).
//  - Each core folds its accumulator to 64 lanes (fold_rows_pairwise) and stores them as its
//    row of the partials (workspace, B x 64 f32). After a barrier of the launch's vector cores
//    (cross-core flag 0), core 0 loads the B rows, folds them to one row, sums its 64 lanes
//    (vcadd) and stores (sum == 0) as the bool (vcmp, vsel of f16 1 / 0, vconv to u8: as
//    IsFinite's kernel makes its bools). Coupled chips (no cross-core flags): that last step is
//    a second launch of one block.
//  - More inputs than one kernel's arguments reach (KernelBuilder::max_args(), less the partials
//    and the bool): the inputs go in G launches of at most that many each, in order, each cut
//    over the cores as above. Launch g > 0 starts each core's accumulator from the core's row of
//    the launches before (rows are +0 or NaN, so the sum keeps its meaning), and only the last
//    launch takes the barrier and computes the bool (or the result launch does, as above).
//    Launches run in stream order, so the rows are complete when the next launch reads them.
//    Chosen over a wider argument index: the ISA and every kernel stay as they are, and ops
//    with many tensors already split so (the multi-tensor launches, ConcatV2).
#include <optional>

#include <fmt/format.h>

#include "adapter/compiler/ops/channel.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/int_math.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using isa::Pipe;

namespace {

constexpr int64_t kBlockBytes = 32;
constexpr int64_t kRowBytes = kLanes32 * 4;  // a core's partial row: 64 f32 lanes
constexpr int kBarrierFlag = 0;              // cross-core flag id of the partials' barrier

// A part of one tensor that one core checks: elements [first, first + count) of input `input`.
struct Piece {
  size_t input = 0;
  int64_t first = 0, count = 0;
};

// The cores' pieces of inputs [first, end): their 32-byte blocks (each input padded to whole
// blocks) as one range cut into equal parts of whole blocks, part b for core b; empty inputs
// take no part.
std::vector<std::vector<Piece>> cut_pieces(const std::vector<TensorDesc>& inputs, size_t first,
                                           size_t end, int cores) {
  int64_t total = 0;
  for (size_t i = first; i < end; ++i)
    total += ceil_div(static_cast<int64_t>(inputs[i].bytes()), kBlockBytes);
  const int64_t per = std::max<int64_t>(1, ceil_div(total, cores));
  const int64_t parts = std::max<int64_t>(1, ceil_div(total, per));
  std::vector<std::vector<Piece>> pieces(static_cast<size_t>(parts));
  int64_t start = 0;  // the input's first block in the range
  for (size_t i = first; i < end; ++i) {
    const int64_t n = inputs[i].num_elements();
    const int64_t per_block = kBlockBytes / data_type_bytes(inputs[i].dtype);
    const int64_t blocks = ceil_div(n, per_block);
    for (int64_t blk = 0; blk < blocks;) {
      const int64_t part = (start + blk) / per;
      const int64_t end = std::min(blocks, (part + 1) * per - start);
      const int64_t first = blk * per_block;
      pieces[static_cast<size_t>(part)].push_back(
          Piece{i, first, std::min(n, end * per_block) - first});
      blk = end;
    }
    start += blocks;
  }
  return pieces;
}

// The UB buffers of one core.
struct Buffers {
  uint64_t tile[2] = {0, 0};                    // ping / pong input tiles (L elements of T)
  uint64_t wide = 0;                            // f16 / bf16: the tile in f32
  uint64_t acc = 0;                             // L f32: the sums of x - x
  uint64_t rows = 0;                            // the partial rows (the last step)
  uint64_t zeros = 0, ones16 = 0, zeros16 = 0;  // one repeat each of f32 0, f16 1, f16 0
  uint64_t sum = 0;                             // the last step's sum of the 64 lanes
  uint64_t bits = 0, half = 0, result = 0;      // the last step's compare bits, f16, u8
  int64_t tile_elems = 0;                       // L
};

Buffers allocate(KernelBuilder& b, Dtype type, int rows) {
  Buffers u;
  const uint64_t repeat = vec::kRepeatBytes;
  u.rows = b.alloc(Buf::UB, static_cast<uint64_t>(rows) * kRowBytes, "partial rows");
  u.zeros = b.alloc(Buf::UB, repeat, "f32 zeros");
  u.ones16 = b.alloc(Buf::UB, repeat, "f16 ones");
  u.zeros16 = b.alloc(Buf::UB, repeat, "f16 zeros");
  u.sum = b.alloc(Buf::UB, kBlockBytes, "sum of the lanes");
  u.bits = b.alloc(Buf::UB, kBlockBytes, "compare bits");
  u.half = b.alloc(Buf::UB, repeat, "f16 result");
  u.result = b.alloc(Buf::UB, kBlockBytes, "bool result");
  // Per element: two tiles of T, the f32 accumulator and (f16 / bf16) the widened tile; the
  // slack covers the four buffers' alignment.
  const int64_t size = isa::dtype_size(type);
  const int64_t per_elem = 2 * size + 4 + (type == Dtype::F32 ? 0 : 4);
  const int64_t slack = 4 * static_cast<int64_t>(b.alignment(Buf::UB));  // four allocations
  const int64_t free = static_cast<int64_t>(b.free_bytes(Buf::UB)) - slack;
  u.tile_elems = free / per_elem / kLanes32 * kLanes32;
  if (u.tile_elems < kLanes32)
    b.fail(fmt::format("the UB leaves {} bytes for the tiles, less than one repeat's", free));
  const auto bytes = [&](int64_t s) { return static_cast<uint64_t>(u.tile_elems * s); };
  u.tile[0] = b.alloc(Buf::UB, bytes(size), "tile (ping)");
  u.tile[1] = b.alloc(Buf::UB, bytes(size), "tile (pong)");
  u.acc = b.alloc(Buf::UB, bytes(4), "accumulator: sums of x - x");
  if (type != Dtype::F32) u.wide = b.alloc(Buf::UB, bytes(4), "tile in f32");
  return u;
}

// Streams one piece through the tiles into the accumulator (the freed flags are set for both
// parities before the first piece and waited after the last).
void check_piece(KernelBuilder& b, const Buffers& u, Dtype type, const Piece& p,
                 const FlagPair& loaded, const FlagPair& freed) {
  KernelBuilder::Origin o(
      b, fmt::format("x{}: elements {} .. {}", p.input, p.first, p.first + p.count));
  const int64_t size = isa::dtype_size(type), L = u.tile_elems;
  Reg base = b.load_arg(fmt::format("x{}", p.input));
  b.add(base, base, p.first * size);
  Reg steps = b.reg_imm("tiles of the piece", ceil_div(p.count, L));
  Reg n = b.reg("elements of the tile"), a = b.reg("tile address"), q = b.reg("parity");
  const auto tile_elements = [&](const Reg& step) {  // n = min(L, count - step * L)
    b.mul(n, step, -L);
    b.add(n, n, p.count);
    b.min(n, n, L);
  };
  b.pipelined_steps(
      steps,
      [&](const Reg& step) {
        tile_elements(step);
        b.mul_add(a, step, L * size, base);
        Reg blocks = b.reg("32-byte blocks of the tile");
        count_blocks(b, blocks, n, size);
        b.and_(q, step, 1);
        b.by_parity(q, [&](int r) {
          b.wait_flag(freed, r);
          b.emit(Opcode::op_copy_gm2ub, {u.tile[r], a, 1, blocks, 0, 0}, "load the tile");
          b.set_flag(loaded, r);
        });
      },
      [&](const Reg& step) {
        tile_elements(step);
        b.and_(q, step, 1);
        b.by_parity(q, [&](int r) {
          b.wait_flag(loaded, r);
          uint64_t d = u.tile[r];
          if (type != Dtype::F32) {
            vec_convert(b, Dtype::F32, type, u.wide, u.tile[r], RoundMode::kRint, n);
            d = u.wide;
            b.set_flag(freed, r);
          }
          vec_binary(b, Opcode::op_vsub, Dtype::F32, d, d, d, n);
          vec_binary(b, Opcode::op_vadd, Dtype::F32, u.acc, u.acc, d, n);
          if (type == Dtype::F32) b.set_flag(freed, r);
        });
      });
}

// Core 0's (or the second launch's) last step: the partial rows at `partials` (GM) folded, their
// 64 lanes summed and (sum == 0) stored to `out` as a bool.
void emit_result(KernelBuilder& b, const Buffers& u, int rows, const Reg& partials,
                 const Reg& out) {
  KernelBuilder::Origin o(b, "the cores' partial rows -> the bool");
  const int in = b.flag(Pipe::MTE2, Pipe::V, "partial rows loaded");
  const int done = b.flag(Pipe::V, Pipe::MTE3, "bool computed");
  b.emit(Opcode::op_copy_gm2ub, {u.rows, partials, 1, rows * kRowBytes / kBlockBytes, 0, 0});
  b.set_flag(Pipe::MTE2, Pipe::V, in);
  b.wait_flag(Pipe::MTE2, Pipe::V, in);
  fold_rows_pairwise(b, u.rows, u.rows, rows, kLanes32, kLanes32);
  set_mask_lanes(b, kAllLanes);
  vec_reduce_strided(b, Opcode::op_vcadd, Dtype::F32, u.sum, VOperand(u.rows), 1);
  Reg one = b.reg_imm("one element", 1);
  vec_compare(b, Dtype::F32, isa::Cmp::EQ, u.bits, u.sum, u.zeros, one, true);
  vec_select(b, Dtype::F16, u.half, u.ones16, u.zeros16, u.bits, one, true, true);
  vec_convert(b, Dtype::U8, Dtype::F16, u.result, u.half, RoundMode::kRint, one);
  b.set_flag(Pipe::V, Pipe::MTE3, done);
  b.wait_flag(Pipe::V, Pipe::MTE3, done);
  b.emit(Opcode::op_copy_ub2gm, {out, u.result, 1, 1, 0, 0}, "store the bool");
}

void fill_constants(KernelBuilder& b, const Buffers& u) {
  vec_fill_repeat(b, Dtype::F32, u.zeros, 0);
  vec_fill_repeat(b, Dtype::F16, u.ones16, 1);
  vec_fill_repeat(b, Dtype::F16, u.zeros16, 0);
}

}  // namespace

CompiledKernel compile_all_finite(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const int64_t n = op.attr_int("N", static_cast<int64_t>(op.inputs.size()));
  if (op.inputs.empty() || n != static_cast<int64_t>(op.inputs.size()))
    op.invalid(
        fmt::format("attribute N = {} must count the {} inputs (at least 1)", n, op.inputs.size()));
  const std::optional<DataType> t = op.attr_type("T").value_or(op.inputs[0].dtype);
  if (!data_type_is_float(*t))
    op.invalid(fmt::format("T = {} is not a float type", data_type_name(*t)));
  const std::vector<int64_t> ranks = op.attr_ints("ranks");
  if (!ranks.empty() && ranks.size() != op.inputs.size())
    op.invalid(fmt::format("attribute ranks has {} entries for {} inputs", ranks.size(),
                           op.inputs.size()));
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    if (op.inputs[i].dtype != *t)
      op.invalid(fmt::format("input {} is {}, attribute T {}", i,
                             data_type_name(op.inputs[i].dtype), data_type_name(*t)));
    if (!ranks.empty() && static_cast<int64_t>(op.inputs[i].shape.size()) != ranks[i])
      op.invalid(
          fmt::format("input {} has rank {}, but the graph reduced {} of its axes: its "
                      "check was not of every element (NPUSIM_FUSION_ALL_FINITE=0 leaves "
                      "such checks as TensorFlow's ops)",
                      i, op.inputs[i].shape.size(), ranks[i]));
  }
  const Dtype type = device_dtype(*t);
  const ChipConfig& cfg = ctx.cfg;
  const CoreKindConfig* vector =
      cfg.core_kind(cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE);
  const bool one_launch = cfg.split && cfg.cross_core_flag_ids > kBarrierFlag;

  // The launches' inputs: [first, end) each, at most max_args() - 2 of them (the partials and
  // the bool take the other two), as many in each as the count allows.
  struct Part {
    size_t first = 0, end = 0;
    std::vector<std::vector<Piece>> pieces;  // per core
  };
  const size_t inputs = op.inputs.size();
  const size_t per_launch = static_cast<size_t>(KernelBuilder::max_args()) - 2;
  const size_t n_parts = (inputs + per_launch - 1) / per_launch;
  const size_t per_part = (inputs + n_parts - 1) / n_parts;
  std::vector<Part> parts;
  int rows = 0;  // the partial rows: the most cores any launch uses
  for (size_t first = 0; first < inputs; first += per_part) {
    Part part;
    part.first = first;
    part.end = std::min(inputs, first + per_part);
    part.pieces = cut_pieces(op.inputs, part.first, part.end, vector ? vector->count : 1);
    rows = std::max(rows, static_cast<int>(part.pieces.size()));
    parts.push_back(std::move(part));
  }

  LaunchPlan plan({TensorDesc{DataType::BOOL, {}}});
  const ArgRef partials = plan.workspace(static_cast<uint64_t>(rows) * kRowBytes);
  const std::string name = fmt::format("AllFinite_{}", data_type_name(*t));

  int rows_written = 0;  // rows the launches before this one stored
  for (size_t p = 0; p < parts.size(); ++p) {
    const Part& part = parts[p];
    const bool last = p + 1 == parts.size();
    const int cores = static_cast<int>(part.pieces.size());
    KernelBuilder b(parts.size() == 1 ? name : fmt::format("{}_part{}", name, p), op.str(), cfg);
    b.begin_section(b.vector_core_kind());
    std::vector<ArgRef> args;
    for (size_t i = part.first; i < part.end; ++i) {
      b.declare_arg(fmt::format("x{}", i), type, op.inputs[i].shape);
      args.push_back(LaunchPlan::input(static_cast<int>(i)));
    }
    b.declare_arg("partials", Dtype::F32, {rows, kLanes32});
    args.push_back(partials);
    if (last && one_launch) {
      b.declare_arg("y", Dtype::U8, {});
      args.push_back(LaunchPlan::output(0));
    }
    const Buffers u = allocate(b, type, rows);
    fill_constants(b, u);
    const FlagPair loaded = b.flag_pair(Pipe::MTE2, Pipe::V, "tile loaded");
    const FlagPair freed = b.flag_pair(Pipe::V, Pipe::MTE2, "tile free");
    const int folded = b.flag(Pipe::V, Pipe::MTE3, "accumulator folded");
    {
      KernelBuilder::Origin o(b, "accumulator cleared");
      Reg zero = b.reg_imm("0.0f bits", 0), lanes = b.reg_imm("accumulator lanes", u.tile_elems);
      vec_dup_bits(b, 4, u.acc, zero, lanes);
    }
    Reg core = b.reg("vector core");
    b.emit(Opcode::op_get_block_id, {core});
    if (rows_written > 0) {
      KernelBuilder::Origin o(b, "the launches before: this core's partial row resumed");
      const int cleared = b.flag(Pipe::V, Pipe::MTE2, "accumulator cleared");
      const int resumed = b.flag(Pipe::MTE2, Pipe::V, "partial row loaded");
      b.set_flag(Pipe::V, Pipe::MTE2, cleared);
      b.wait_flag(Pipe::V, Pipe::MTE2, cleared);
      b.if_(lt(core, rows_written), [&] {
        Reg row = b.load_arg("partials");
        b.mul_add(row, core, kRowBytes, row);
        b.emit(Opcode::op_copy_gm2ub, {u.acc, row, 1, kRowBytes / kBlockBytes, 0, 0},
               "the row into the accumulator's first 64 lanes");
      });
      b.set_flag(Pipe::MTE2, Pipe::V, resumed);
      b.wait_flag(Pipe::MTE2, Pipe::V, resumed);
    }
    b.set_flag(freed, 0);
    b.set_flag(freed, 1);
    for (int c = 0; c < cores; ++c)
      if (!part.pieces[static_cast<size_t>(c)].empty())
        b.if_(eq(core, c), [&] {
          for (const Piece& piece : part.pieces[static_cast<size_t>(c)])
            check_piece(b, u, type, piece, loaded, freed);
        });
    b.wait_flag(freed, 0, "drain");
    b.wait_flag(freed, 1, "drain");
    {
      KernelBuilder::Origin o(b, "the accumulator folded to this core's partial row");
      fold_rows_pairwise(b, u.acc, u.acc, u.tile_elems / kLanes32, kLanes32, kLanes32);
      b.set_flag(Pipe::V, Pipe::MTE3, folded);
      b.wait_flag(Pipe::V, Pipe::MTE3, folded);
      Reg row = b.load_arg("partials");
      b.mul_add(row, core, kRowBytes, row);
      b.emit(Opcode::op_copy_ub2gm, {row, u.acc, 1, kRowBytes / kBlockBytes, 0, 0});
    }
    int64_t elements = 0;
    for (size_t i = part.first; i < part.end; ++i) elements += op.inputs[i].num_elements();
    std::string what = fmt::format("{} tensors, {} elements over {} vector cores, tiles of {}",
                                   part.end - part.first, elements, cores, u.tile_elems);
    if (parts.size() > 1)
      what = fmt::format("launch {} of {}: x{} .. x{}, {}{}", p + 1, parts.size(), part.first,
                         part.end - 1, what,
                         rows_written > 0 ? ", added to the launches' before" : "");
    if (last && one_launch) {
      b.emit(Opcode::op_cc_set, {Pipe::MTE3, 0, kBarrierFlag}, "this core's partial row stored");
      b.emit(Opcode::op_cc_wait, {Pipe::MTE2, kBarrierFlag}, "wait: every core's partial row");
      b.if_(eq(core, 0), [&] {
        Reg row_base = b.load_arg("partials"), out = b.load_arg("y");
        emit_result(b, u, rows, row_base, out);
      });
    }
    b.end();
    Launch l;
    l.kernel = b.finish();
    l.block_dim = cores;
    l.summary = what + (last && one_launch ? "; the bool after a barrier of the cores" : "");
    l.args = args;
    plan.add(std::move(l), args);
    rows_written = std::max(rows_written, cores);
  }
  if (!one_launch) {
    KernelBuilder r(name + "_result", op.str(), cfg);
    r.begin_section(r.vector_core_kind());
    r.declare_arg("partials", Dtype::F32, {rows, kLanes32});
    r.declare_arg("y", Dtype::U8, {});
    const Buffers ur = allocate(r, type, rows);
    fill_constants(r, ur);
    Reg row_base = r.load_arg("partials"), out = r.load_arg("y");
    emit_result(r, ur, rows, row_base, out);
    r.end();
    Launch lr;
    lr.kernel = r.finish();
    lr.block_dim = 1;
    lr.summary = fmt::format("the {} partial rows -> the bool", rows);
    const std::vector<ArgRef> result_args = {partials, LaunchPlan::output(0)};
    lr.args = result_args;
    plan.add(std::move(lr), result_args);
  }
  return std::move(plan).finish();
}

}  // namespace npusim::compiler::ops
