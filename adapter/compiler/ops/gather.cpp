// Index-driven data movement on the vector cores (tiles assembled in the UB, ops/assemble.h);
// the indices are read by the scalar unit (ld, sign-extended):
//   GatherV2 (inputs params, indices; attrs axis, batch_dims = 0): output
//     params.shape[:axis] + indices.shape[batch_dims:] + params.shape[axis+1:]; batch_dims > 0
//     rewrites the indices into flat row numbers first (gather_batched); each output row of
//     prod(params.shape[axis+1:]) elements is one run of params (copy_gm2ub + vcopy; short rows
//     element by element). An index outside [0, params.shape[axis]) gives zeros, as TF's GPU
//     kernel (TF's CPU kernel fails the op).
//   UnsortedSegmentSum (inputs data, segment_ids; attr num_segments): every output row starts
//     at zero and each data row is added into its segment's row in order of the rows: the same
//     sequence of roundings as TF's CPU kernel (output += data row by row, in the element
//     type), so f16/bf16/f32 results are bit-identical and s32 wraps as TF (bf16 where the
//     vector unit has no bf16 arithmetic: summed in f32 between Casts, rounded once, closer to
//     the exact sum than TF's per-add rounding; compile_bf16_in_f32). Negative ids are
//     dropped (as TF); ids >= num_segments are dropped too (TF fails the op). Types f32, f16,
//     bf16, s32; s64 by the scalar unit (build_s64_segment_sum, ops/int64.h: wrapping, same
//     id rules). Three kernels: segment owners (build_segment_owner_sum: each core owns output
//     rows and reads every segment id once) when rows are whole 32-byte blocks and every
//     vector core owns a segment; column owners (build_segment_column_sum: each core owns a
//     slice of columns of every segment, held in the UB) for such rows and fewer segments;
//     else output tiles (build_segment_tile_sum: every tile reads every segment id, cost ~
//     tiles x rows).
//   OneHot (inputs indices, on_value, off_value; attrs depth, axis = -1): each tile is filled
//     with off_value, then on_value is placed (one-lane vdup) for every index that lands in
//     the tile; indices outside [0, depth) give a row of off_value (as TF). Any output dtype.
// Index types: s32, s64 (OneHot also u8, s8).
#include <fmt/format.h>

#include <optional>

#include "adapter/compiler/ops/assemble.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/int64.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/int_math.h"

namespace npusim::compiler::ops {

namespace {

bool index_type(DataType t, bool narrow_ok) {
  return t == DataType::S32 || t == DataType::S64 ||
         (narrow_ok && (t == DataType::U8 || t == DataType::S8));
}

void check_t_attr(const OpDesc& op, const char* attr, DataType dt) {
  if (auto t = op.attr_type(attr); t && *t != dt)
    op.fail(fmt::format("attribute {} = {} does not match the input's {}", attr,
                        data_type_name(*t), data_type_name(dt)));
}

// GatherV2 with batch_dims = B > 0, as a gather on axis 0: params seen as
// [Bt * O * N, inner] (Bt = prod(shape[:B]), O = prod(shape[B:axis]), N = shape[axis]), and
// the indices rewritten by a scalar-unit launch (ops/int64.h) to
//   idx'[b, o, j] = (b * O + o) * N + idx[b, j]   (-1 where idx is outside [0, N): zeros)
// in a workspace slice of shape [Bt, O, J] (J = prod(indices.shape[B:])); the gather of those
// rows is the output [Bt, O, J, inner] as it is laid out.
CompiledKernel gather_batched(const CompileContext& ctx, const TensorDesc& out, size_t axis,
                              size_t batch_dims) {
  const OpDesc& op = ctx.op;
  const TensorDesc& params = op.inputs[0];
  const TensorDesc& indices = op.inputs[1];
  const int64_t bt = dims_product(params.shape, 0, batch_dims);
  const int64_t o = dims_product(params.shape, batch_dims, axis);
  const int64_t n = params.shape[axis];
  const int64_t inner = dims_product(params.shape, axis + 1, params.shape.size());
  const int64_t j = dims_product(indices.shape, batch_dims, indices.shape.size());
  const DataType it = bt * o * n > (int64_t{1} << 31) - 1 ? DataType::S64 : indices.dtype;
  LaunchPlan plan({out});
  ScalarMapSpec spec;
  spec.kernel_name = fmt::format("GatherV2_batch_indices_{}", data_type_name(indices.dtype));
  spec.inputs = {{indices.dtype, {bt, 1, j}}};
  spec.out_type = it;
  spec.out_shape = {bt, o, j};
  spec.compute = [n, j](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in,
                        const Reg& index) {
    b.movi(d, -1);
    b.if_(ge(in[0], 0), [&] {
      b.if_(lt(in[0], n), [&] {
        b.div(d, index, j);
        b.mul_add(d, d, n, in[0]);
      });
    });
  };
  const TensorDesc flat_idx{it, {bt * o * j}};
  ArgRef ws = plan.workspace(flat_idx.bytes());
  plan.add(build_scalar_map(op.str(), spec, ctx.cfg), {LaunchPlan::input(1), ws},
           "batch indices to rows");
  OpDesc g;
  g.type = "GatherV2";
  g.inputs = {TensorDesc{params.dtype, {bt * o * n, inner}}, flat_idx};
  g.attrs = {{"axis", int64_t{0}}};
  plan.add(compile(g, ctx.cfg, ctx.precision), {LaunchPlan::input(0), ws},
           {LaunchPlan::output(0)});
  return std::move(plan).finish();
}

CompiledKernel compile_gather_v2(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 2)
    op.fail(fmt::format("takes 2 inputs (params, indices; axis is an attribute), {} given",
                        op.inputs.size()));
  const TensorDesc& params = op.inputs[0];
  const TensorDesc& indices = op.inputs[1];
  const DataType dt = params.dtype;
  check_t_attr(op, "Tparams", dt);
  if (!index_type(indices.dtype, false))
    op.fail(fmt::format("indices {} must be s32 or s64", indices.str()));
  if (!op.attrs.count("axis")) op.fail("attribute axis is missing");
  const int64_t rank = static_cast<int64_t>(params.shape.size());
  const int64_t irank = static_cast<int64_t>(indices.shape.size());
  if (rank == 0) op.invalid("params must have rank >= 1");
  int64_t axis = op.attr_int("axis", 0);
  if (axis < -rank || axis >= rank)
    op.invalid(fmt::format("axis = {} is out of range for params of rank {}", axis, rank));
  if (axis < 0) axis += rank;
  int64_t batch_dims = op.attr_int("batch_dims", 0);
  if (batch_dims < 0) batch_dims += irank;
  if (batch_dims < 0 || batch_dims > irank || batch_dims > axis)
    op.invalid(fmt::format("batch_dims = {} must be in [-{}, {}] and at most axis = {}",
                           op.attr_int("batch_dims", 0), irank, irank, axis));
  for (int64_t d = 0; d < batch_dims; ++d)
    if (params.shape[static_cast<size_t>(d)] != indices.shape[static_cast<size_t>(d)])
      op.invalid(fmt::format("params {} and indices {} differ in batch dim {}",
                             shape_str(params.shape), shape_str(indices.shape), d));
  const size_t a = static_cast<size_t>(axis);
  std::vector<int64_t> out_shape(params.shape.begin(), params.shape.begin() + axis);
  out_shape.insert(out_shape.end(), indices.shape.begin() + batch_dims, indices.shape.end());
  out_shape.insert(out_shape.end(), params.shape.begin() + axis + 1, params.shape.end());
  const TensorDesc out{dt, out_shape};
  CompiledKernel k;
  k.outputs = {out};
  if (out.num_elements() == 0) return k;
  if (batch_dims > 0) return gather_batched(ctx, out, a, static_cast<size_t>(batch_dims));
  const int64_t outer = dims_product(params.shape, 0, a);
  const int64_t n = params.shape[a];
  const int64_t inner = dims_product(params.shape, a + 1, params.shape.size());
  AssembleSpec spec;
  spec.kernel_name = fmt::format("GatherV2_{}_{}", data_type_name(dt),
                                 data_type_name(indices.dtype));
  spec.dtype = dt;
  spec.inputs = op.inputs;
  spec.out_shape = out_shape;
  spec.rows = {outer, indices.num_elements()};
  spec.width = inner;
  AsmRegion r = full_region(spec, 0, 0, {n * inner, inner}, 1);
  r.rows[1].index = 1;
  r.rows[1].index_bound = n;
  r.fill = AsmFill{-1, 0};
  spec.regions.push_back(r);
  k.launches.push_back(build_assemble_kernel(op.str(), spec, ctx.cfg));
  return k;
}

// The tile kernel (any shape): each tile of the output is zeroed, then every data row whose
// segment id falls in the tile is added; every tile reads every segment id (cost ~ tiles x
// rows).
Launch build_segment_tile_sum(const std::string& op_name, const std::vector<TensorDesc>& inputs,
                              const std::vector<int64_t>& out_shape, int64_t rows,
                              int64_t inner, const ChipConfig& cfg) {
  const TensorDesc& ids = inputs[1];
  const DataType dt = inputs[0].dtype;
  const int esize = data_type_bytes(dt);
  const int isize = data_type_bytes(ids.dtype);
  TileKernel::Options opt;
  opt.kernel_name = fmt::format("UnsortedSegmentSum_{}_{}", data_type_name(dt),
                                data_type_name(ids.dtype));
  opt.dtype = dt;
  opt.inputs = inputs;
  opt.out_shape = out_shape;
  opt.direct = false;  // rows are added, never copied
  TileKernel tk(op_name, opt, cfg);
  Launch l = tk.build([&](TileKernel& t) {
    KernelBuilder& b = t.b();
    {
      Reg zero = b.reg_imm("zero", 0);
      t.splat(zero, t.cnt(), zero);
    }
    if (rows == 0) return;
    Reg lo = b.reg("first segment of the tile"), hi = b.reg("last segment of the tile");
    b.div(lo, t.pos(), inner);
    b.add(hi, t.pos(), t.cnt());
    b.sub(hi, hi, 1);
    b.div(hi, hi, inner);
    Reg i = b.reg("data row"), s = b.reg("segment id");
    b.for_range(i, 0, rows, 1, [&] {
      KernelBuilder::Origin o(b, "one data row");
      Label skip = b.label("row_skip");
      {
        Reg a = t.input_addr(1);
        b.mul(s, i, isize);
        b.add(s, s, a);
        t.load_index(s, s, ids.dtype);
      }
      b.branch(lt(s, lo), skip);
      b.branch(lt(hi, s), skip);
      Reg rs = b.reg("segment start in the tile"), cl = b.reg("first column"),
          ch = b.reg("end column");
      b.mul(rs, s, inner);
      b.sub(rs, rs, t.pos());
      b.emit(isa::Opcode::op_sub, {cl, Opnd::reg_number(0), rs});
      b.max(cl, cl, 0);
      b.sub(ch, t.cnt(), rs);
      b.min(ch, ch, inner);
      Reg src = b.reg("data source");
      {
        Reg a = t.input_addr(0);
        b.mul(src, i, inner);
        b.add(src, src, cl);
        b.mul(src, src, esize);
        b.add(src, src, a);
      }
      b.add(rs, rs, cl, "tile offset");
      b.sub(ch, ch, cl, "length");
      t.accumulate_run(rs, ch, src);
      b.bind(skip);
    });
  });
  l.summary += fmt::format("; {} data rows of {} scanned per tile", rows, inner);
  return l;
}

// The two owner kernels' common parts (build_segment_owner_sum, build_segment_column_sum).
// Begins kernel `b`'s vector section and declares its arguments: in0 the data [rows, inner] of
// dt, in1 the segment ids [rows] of id_type, out [segments, inner].
void declare_segment_sum_args(KernelBuilder& b, DataType dt, DataType id_type, int64_t rows,
                              int64_t inner, int64_t segments) {
  const isa::Dtype t = device_dtype(dt);
  b.begin_section(b.vector_core_kind());
  b.declare_arg("in0", t, {rows, inner});
  b.declare_arg("in1", device_dtype(id_type), {rows});
  b.declare_arg("out", t, {segments, inner});
}
// s = the segment id at GM `p` (isize bytes: 4 or 8), p advanced past it; branches to `skip`
// where the id is outside [0, segments) (such rows are dropped).
void load_segment_id(KernelBuilder& b, const Reg& s, const Reg& p, int isize, int64_t segments,
                     const Label& skip) {
  b.emit(isa::Opcode::op_ld, {s, p}, "segment id");
  b.add(p, p, isize);
  // Unsigned view of an s32 id: a negative id becomes >= 2^31, past every segment.
  if (isize == 4) b.and_(s, s, 0xffffffffLL, "the s32 id, zero-extended");
  if (isize == 8) b.branch(lt(s, 0), skip);
  b.branch(ge(s, segments), skip);
}

// The segment-owner kernel: with D = min(vector cores, segments) blocks, block b owns the
// segments s with s % D == b (whole output rows, so no 32-byte block of the output is written
// by two cores and no atomics are needed; cyclic rather than contiguous ranges so that ids
// clustered at the low end, as positions 0..S-1 of a table of 512, still spread over every
// core). It zeroes its rows (a vdup'd UB buffer stored by MTE3, many rows per strided store),
// then reads every segment id (scalar ld) and adds each data row it owns, in row order, into
// its output row in GM: a run of owned rows with one segment is added into one UB copy of the
// output row (MTE2 loads it when the run starts, MTE3 stores it when the run ends), the data
// rows streamed through ping/pong buffers (MTE2 -> V -> vadd), consecutive data rows of a run
// in one copy of up to batch_rows rows (a set_flag waits for all of its pipe's transfers, so a
// copy and a flag per row would keep one transfer in flight). A segment's rows are therefore
// added in TF's order, one rounding each, into the zeroed row: bit-identical to TF's CPU
// kernel. Rows longer than a row buffer go chunk by chunk of columns (the ids read once per
// chunk).
// Ordering: a run's output-row load waits for the store of the run two before (the output
// buffer's MTE3 -> MTE2 flag, set after every earlier store); the run just before has another
// segment by construction, so every store of the loaded row is complete. Cost per core: rows
// scalar id checks + its rows' loads; with one segment for every row (ids a kernel computed, in
// a timing-only run: docs/tf_plugin.md) one core streams every row.
// Needs rows of whole 32-byte blocks (inner * element bytes % 32 == 0).
Launch build_segment_owner_sum(const std::string& op_name, DataType dt, DataType id_type,
                               int64_t rows, int64_t inner, int64_t segments,
                               const ChipConfig& cfg) {
  using isa::Opcode;
  using isa::Pipe;
  KernelBuilder b(fmt::format("UnsortedSegmentSum_owner_{}_{}", data_type_name(dt),
                              data_type_name(id_type)),
                  op_name, cfg);
  const isa::Dtype t = device_dtype(dt);
  const int esize = data_type_bytes(dt);
  const int isize = data_type_bytes(id_type);
  const int64_t row_bytes = inner * esize;
  const int64_t cores = cfg.core_kind(b.vector_core_kind())->count;
  const int64_t owners = std::min(cores, segments);  // D
  const int64_t per = ceil_div(segments, owners);     // segments per block, at most
  declare_segment_sum_args(b, dt, id_type, rows, inner, segments);
  // UB: two output row buffers (ping/pong) of up to an eighth of the UB each, two data buffers
  // of batch_rows rows each (together at most half of the UB), the rest (at most one block's
  // rows) the zero buffer.
  const int64_t row_blocks = row_bytes / 32;
  const int64_t ub = static_cast<int64_t>(b.free_bytes(isa::Buf::UB));
  const int64_t chunk_bytes = std::min(row_bytes, ub / 8 / 256 * 256);
  const int64_t chunk = chunk_bytes / esize;  // elements per chunk
  const int64_t batch_rows = std::max<int64_t>(1, ub / 2 / (2 * chunk_bytes));
  const int64_t zero_bytes =
      std::min((ub - (2 + 2 * batch_rows) * chunk_bytes - 256) / 256 * 256,
               round_up(per * row_bytes, 256));
  Twin acc, dat;
  for (int q = 0; q < 2; ++q) {
    acc.a[q] = b.alloc(isa::Buf::UB, static_cast<uint64_t>(chunk_bytes),
                       fmt::format("output row {}", q));
    dat.a[q] = b.alloc(isa::Buf::UB, static_cast<uint64_t>(batch_rows * chunk_bytes),
                       fmt::format("data rows {}", q));
  }
  const uint64_t zeros = b.alloc(isa::Buf::UB, static_cast<uint64_t>(zero_bytes), "zeros");
  const FlagPair acc_free = b.flag_pair(Pipe::MTE3, Pipe::MTE2, "output buffer stored");
  const FlagPair added = b.flag_pair(Pipe::V, Pipe::MTE3, "output row added");
  const FlagPair dat_free = b.flag_pair(Pipe::V, Pipe::MTE2, "data buffer read");
  const FlagPair dat_loaded = b.flag_pair(Pipe::MTE2, Pipe::V, "rows loaded");
  const int zeros_ready = b.flag(Pipe::V, Pipe::MTE3, "zeros filled");
  Reg data = b.load_arg("in0"), ids = b.load_arg("in1"), out = b.load_arg("out");
  Reg bid = b.reg("block id = first owned segment");
  b.emit(Opcode::op_get_block_id, {bid});
  {
    KernelBuilder::Origin o(b, "zero the owned output rows");
    vec_fill32(b, zeros, 0, zero_bytes / 4);
    b.set_flag(Pipe::V, Pipe::MTE3, zeros_ready);
    b.wait_flag(Pipe::V, Pipe::MTE3, zeros_ready);
    Reg r = b.reg("owned segment"), a = b.reg("output address"), n = b.reg("rows or blocks");
    const int64_t gap = (owners - 1) * row_blocks;  // blocks between two owned rows
    const int64_t rows_per_store = std::min<int64_t>(zero_bytes / row_bytes, 65535);
    if (rows_per_store >= 1 && gap <= 65535) {
      // One strided store per rows_per_store owned rows.
      b.for_range(r, bid, segments, rows_per_store * owners, [&] {
        b.sub(n, r, segments);
        b.emit(Opcode::op_sub, {n, Opnd::reg_number(0), n}, "segments - r");
        b.add(n, n, owners - 1);
        b.div(n, n, owners, "owned rows from r on");
        b.min(n, n, rows_per_store);
        b.mul_add(a, r, row_bytes, out);
        b.emit(Opcode::op_copy_ub2gm, {a, zeros, n, row_blocks, 0, gap});
      });
    } else {
      // Row by row, in stores of at most the zero buffer.
      Reg cb = b.reg("first byte of the store");
      b.for_range(r, bid, segments, owners, [&] {
        b.for_range(cb, 0, row_bytes, zero_bytes, [&] {
          b.sub(n, cb, row_bytes);
          b.emit(Opcode::op_sub, {n, Opnd::reg_number(0), n}, "row bytes - cb");
          b.min(n, n, zero_bytes);
          b.shr(n, n, 5, "bytes to 32-byte blocks");
          b.mul_add(a, r, row_bytes, out);
          b.add(a, a, cb);
          b.emit(Opcode::op_copy_ub2gm, {a, zeros, 1, n, 0, 0});
        });
      });
    }
    // The zero stores come before every row load: both buffers start free after them.
    b.set_flag(acc_free, 0);
    b.set_flag(acc_free, 1);
    b.set_flag(dat_free, 0);
    b.set_flag(dat_free, 1);
  }
  KernelBuilder::Origin o(b, "add the owned rows");
  Reg c = b.reg("first column of the chunk"), len = b.reg("chunk elements"),
      n = b.reg("chunk blocks");
  Reg i = b.reg("data row"), p = b.reg("segment id address"), s = b.reg("segment id");
  Reg prev = b.reg("segment held in the output buffer (-1: none)");
  Reg qa = b.reg_imm("output buffer parity", 0), qd = b.reg_imm("data buffer parity", 0);
  Reg a = b.reg("address");
  // Stores the held output row (segment prev, columns from c) from acc[qa], then flips qa.
  auto store_held = [&] {
    b.by_parity(qa, [&](int r) {
      b.set_flag(added, r);
      b.wait_flag(added, r);
      b.mul_add(a, prev, inner, c);
      b.mul_add(a, a, esize, out);
      b.emit(Opcode::op_copy_ub2gm, {a, acc[r], 1, n, 0, 0}, "store the output row");
      b.set_flag(acc_free, r);
    });
    b.emit(Opcode::op_xor, {qa, qa, 1});
  };
  // Adds the pending data rows (pend_n consecutive rows from pend_start, all of segment prev)
  // into acc[qa]: one MTE2 copy of their chunks, one vadd per row.
  Reg pend_start = b.reg("first pending data row"), pend_n = b.reg("pending data rows");
  Reg j = b.reg("pending row"), row_step = b.reg("chunk bytes");
  auto flush = [&] {
    b.if_(ne(pend_n, 0), [&] {
      b.mul_add(a, pend_start, inner, c);
      b.mul_add(a, a, esize, data);
      b.by_parity(qd, [&](int d) {
        b.wait_flag(dat_free, d, "data buffer read");
        Reg gap = b.reg("blocks between two rows' chunks");
        b.sub(gap, n, row_blocks);
        b.emit(Opcode::op_sub, {gap, Opnd::reg_number(0), gap}, "row blocks - chunk blocks");
        b.emit(Opcode::op_copy_gm2ub, {dat[d], a, pend_n, n, gap, 0}, "load the data rows");
        b.set_flag(dat_loaded, d);
        b.wait_flag(dat_loaded, d);
        b.emit(Opcode::op_set_mask_count, {len});
        b.by_parity(qa, [&](int r) {
          b.for_range(j, 0, pend_n, 1, [&] {
            b.mul_add(a, j, row_step, static_cast<int64_t>(dat[d]));
            b.emit(Opcode::op_vadd, {t, acc[r], acc[r], a, 0, 1, 1, 1, 8, 8, 8});
          });
        });
        b.set_flag(dat_free, d);
      });
      b.emit(Opcode::op_xor, {qd, qd, 1});
      b.movi(pend_n, 0);
    });
  };
  b.for_range(c, 0, inner, chunk, [&] {
    b.sub(len, c, inner);
    b.emit(Opcode::op_sub, {len, Opnd::reg_number(0), len}, "inner - column");
    b.min(len, len, chunk);
    b.mul(row_step, len, esize);
    b.shr(n, row_step, 5, "bytes to 32-byte blocks");
    b.movi(prev, -1);
    b.movi(pend_n, 0);
    b.mov(p, ids);
    b.for_range(i, 0, rows, 1, [&] {
      Label skip = b.label("row_skip"), append = b.label("row_append");
      load_segment_id(b, s, p, isize, segments, skip);
      b.rem(a, s, owners);
      b.branch(ne(a, bid), skip);
      b.if_(ne(s, prev), [&] {
        flush();
        b.if_(ge(prev, 0), store_held);
        b.mov(prev, s);
        b.mul_add(a, s, inner, c);
        b.mul_add(a, a, esize, out);
        b.by_parity(qa, [&](int r) {
          b.wait_flag(acc_free, r, "output buffer stored");
          // No flag of its own: the data rows' MTE2 -> V flag is set after both loads (a
          // set_flag waits for all of its pipe's earlier work), so the latencies overlap.
          b.emit(Opcode::op_copy_gm2ub, {acc[r], a, 1, n, 0, 0}, "load the output row");
        });
      });
      // The same segment: appended to the pending rows when it is the next data row and the
      // batch has room, else they are added first.
      b.branch(eq(pend_n, 0), append);
      b.add(a, pend_start, pend_n);
      b.if_(ne(a, i), flush);
      b.if_(eq(pend_n, batch_rows), flush);
      b.bind(append);
      b.if_(eq(pend_n, 0), [&] { b.mov(pend_start, i); });
      b.add(pend_n, pend_n, 1);
      b.bind(skip);
    });
    flush();
    b.if_(ge(prev, 0), store_held);
  });
  for (int r = 0; r < 2; ++r) {
    b.wait_flag(acc_free, r, "drain");
    b.wait_flag(dat_free, r, "drain");
  }
  b.end();
  Launch l;
  l.block_dim = static_cast<int>(owners);
  l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kInput, 1, 0},
            ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  l.summary = fmt::format(
      "segment owners: {} blocks of <= {} segments of {} {} (every {}th), {} data rows, chunks "
      "of {} elements, batches of <= {} consecutive rows",
      owners, per, inner, data_type_name(dt), owners, rows, chunk, batch_rows);
  l.kernel = b.finish();
  return l;
}

// The column-owner kernel, for fewer segments than vector cores (BERT's 2-row token-type
// table): block b owns a slice of 32-byte column blocks of every output row, keeps the slice of
// every segment in the UB (zeroed by one vdup), and streams the data rows' slices in batches of
// many rows (one strided MTE2 copy per batch, ping/pong); V adds each row's slice into its
// segment's slice in row order (the id read by the scalar unit), so each element sees TF's
// sequence of roundings. One strided store writes the block's slices at the end.
// Needs rows of whole 32-byte blocks and every segment's slice in the UB (column_sum_fits).
struct ColumnSumPlan {
  int64_t row_blocks = 0;    // 32-byte blocks per row
  int64_t slice_blocks = 0;  // per block (the last one may have fewer)
  int block_dim = 0;
  int64_t batch_rows = 0;    // data rows per batch
};

std::optional<ColumnSumPlan> plan_column_sum(const ChipConfig& cfg, DataType dt, int64_t rows,
                                             int64_t inner, int64_t segments) {
  const CoreKindConfig* core =
      cfg.core_kind(cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE);
  const int64_t row_bytes = inner * data_type_bytes(dt);
  if (!core || row_bytes % 32 != 0 || rows == 0) return std::nullopt;
  ColumnSumPlan p;
  p.row_blocks = row_bytes / 32;
  p.slice_blocks = ceil_div(p.row_blocks, std::min<int64_t>(core->count, p.row_blocks));
  p.block_dim = static_cast<int>(ceil_div(p.row_blocks, p.slice_blocks));
  const int64_t slice_bytes = p.slice_blocks * 32;
  // UB: the segments' slices, two batches, a few blocks held back for alignment.
  const int64_t ub = static_cast<int64_t>(core->capacity(isa::Buf::UB)) - 1024;
  const int64_t acc_bytes = segments * slice_bytes;
  p.batch_rows = std::min<int64_t>({rows, (ub - acc_bytes) / (2 * slice_bytes), 4095});
  if (acc_bytes > ub / 2 || p.batch_rows < 1 || p.row_blocks > 65535) return std::nullopt;
  return p;
}

Launch build_segment_column_sum(const std::string& op_name, DataType dt, DataType id_type,
                                int64_t rows, int64_t inner, int64_t segments,
                                const ColumnSumPlan& p, const ChipConfig& cfg) {
  using isa::Opcode;
  using isa::Pipe;
  KernelBuilder b(fmt::format("UnsortedSegmentSum_columns_{}_{}", data_type_name(dt),
                              data_type_name(id_type)),
                  op_name, cfg);
  const isa::Dtype t = device_dtype(dt);
  const int esize = data_type_bytes(dt);
  const int isize = data_type_bytes(id_type);
  const int64_t slice_bytes = p.slice_blocks * 32;
  declare_segment_sum_args(b, dt, id_type, rows, inner, segments);
  const uint64_t acc = b.alloc(isa::Buf::UB, static_cast<uint64_t>(segments * slice_bytes),
                               "every segment's slice");
  Twin batch;
  for (int q = 0; q < 2; ++q)
    batch.a[q] = b.alloc(isa::Buf::UB, static_cast<uint64_t>(p.batch_rows * slice_bytes),
                         fmt::format("data rows' slices {}", q));
  const FlagPair loaded = b.flag_pair(Pipe::MTE2, Pipe::V, "batch loaded");
  const FlagPair freed = b.flag_pair(Pipe::V, Pipe::MTE2, "batch added");
  const int summed = b.flag(Pipe::V, Pipe::MTE3, "slices summed");
  Reg data = b.load_arg("in0"), ids = b.load_arg("in1"), out = b.load_arg("out");
  Reg col = b.reg("first column block"), nb = b.reg("column blocks of this block");
  Reg lanes = b.reg("elements of the slice"), gap = b.reg("blocks between two rows' slices");
  Reg sgap = b.reg("blocks after the slice in the UB");
  b.emit(Opcode::op_get_block_id, {col});
  b.mul(col, col, p.slice_blocks);
  b.sub(nb, col, p.row_blocks);
  b.emit(Opcode::op_sub, {nb, Opnd::reg_number(0), nb}, "row blocks - first");
  b.min(nb, nb, p.slice_blocks);
  b.mul(lanes, nb, 32 / esize);
  b.sub(gap, nb, p.row_blocks);
  b.emit(Opcode::op_sub, {gap, Opnd::reg_number(0), gap}, "row blocks - slice blocks");
  b.sub(sgap, nb, p.slice_blocks);
  b.emit(Opcode::op_sub, {sgap, Opnd::reg_number(0), sgap}, "slice blocks - blocks");
  b.shl(col, col, 5, "first column byte");
  vec_fill32(b, acc, 0, segments * slice_bytes / 4);
  b.set_flag(freed, 0);
  b.set_flag(freed, 1);
  Reg steps = b.reg_imm("batches", ceil_div(rows, p.batch_rows));
  Reg a = b.reg("address"), n = b.reg("rows of the batch"), s = b.reg("segment id");
  Reg j = b.reg("row of the batch"), idp = b.reg("segment id address");
  auto batch_rows = [&](const Reg& step) {  // n = rows of batch `step`
    b.mul(n, step, p.batch_rows);
    b.sub(n, n, rows);
    b.emit(Opcode::op_sub, {n, Opnd::reg_number(0), n}, "rows left");
    b.min(n, n, p.batch_rows);
  };
  b.pipelined_steps(
      steps,
      [&](const Reg& step) {
        KernelBuilder::Origin o(b, "load a batch of the rows' slices");
        batch_rows(step);
        b.mul(a, step, p.batch_rows * inner * esize);
        b.add(a, a, data);
        b.add(a, a, col);
        Reg q = b.reg("parity");
        b.and_(q, step, 1);
        b.by_parity(q, [&](int r) {
          b.wait_flag(freed, r);
          b.emit(Opcode::op_copy_gm2ub, {batch[r], a, n, nb, gap, sgap});
          b.set_flag(loaded, r);
        });
      },
      [&](const Reg& step) {
        KernelBuilder::Origin o(b, "add each row's slice into its segment's");
        batch_rows(step);
        b.mul_add(idp, step, p.batch_rows * isize, ids);
        Reg q = b.reg("parity");
        b.and_(q, step, 1);
        b.by_parity(q, [&](int r) {
          b.wait_flag(loaded, r);
          b.emit(Opcode::op_set_mask_count, {lanes});
          b.for_range(j, 0, n, 1, [&] {
            Label skip = b.label("row_skip");
            load_segment_id(b, s, idp, isize, segments, skip);
            b.mul_add(s, s, slice_bytes, static_cast<int64_t>(acc));
            b.mul_add(a, j, slice_bytes, static_cast<int64_t>(batch[r]));
            b.emit(Opcode::op_vadd, {t, s, s, a, 0, 1, 1, 1, 8, 8, 8});
            b.bind(skip);
          });
          b.set_flag(freed, r);
        });
      });
  b.set_flag(Pipe::V, Pipe::MTE3, summed);
  b.wait_flag(Pipe::V, Pipe::MTE3, summed);
  b.add(a, out, col);
  b.emit(Opcode::op_copy_ub2gm, {a, acc, segments, nb, sgap, gap}, "store the slices");
  b.wait_flag(freed, 0, "drain");
  b.wait_flag(freed, 1, "drain");
  b.end();
  Launch l;
  l.block_dim = p.block_dim;
  l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kInput, 1, 0},
            ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  l.summary = fmt::format(
      "column owners: {} blocks of {} column blocks of {} segments of {} {}, {} data rows in "
      "batches of {}",
      p.block_dim, p.slice_blocks, segments, inner, data_type_name(dt), rows, p.batch_rows);
  l.kernel = b.finish();
  return l;
}

// The owner kernel when every vector core owns at least one segment and output rows are whole
// 32-byte blocks; else the tile kernel (few segments: the owners would be few cores adding
// every row while the tile kernel spreads the columns over all cores).
bool use_segment_owners(const ChipConfig& cfg, DataType dt, int64_t inner, int64_t segments) {
  const CoreKindConfig* core =
      cfg.core_kind(cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE);
  const int64_t row_bytes = inner * data_type_bytes(dt);
  // (The batched data-row copy's source gap, row blocks less a chunk's, is a 16-bit field.)
  return core && row_bytes % 32 == 0 && row_bytes / 32 <= 65535 && segments >= core->count;
}

CompiledKernel compile_unsorted_segment_sum(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 2)
    op.fail(fmt::format("takes 2 inputs (data, segment_ids; num_segments is an attribute), {} "
                        "given",
                        op.inputs.size()));
  const TensorDesc& data = op.inputs[0];
  const TensorDesc& ids = op.inputs[1];
  const DataType dt = data.dtype;
  check_t_attr(op, "T", dt);
  if (!data_type_is_float(dt) && dt != DataType::S32 && dt != DataType::S64)
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16, s32, s64)",
                        data_type_name(dt)));
  if (!index_type(ids.dtype, false))
    op.fail(fmt::format("segment_ids {} must be s32 or s64", ids.str()));
  if (!op.attrs.count("num_segments")) op.fail("attribute num_segments is missing");
  const int64_t segments = op.attr_int("num_segments", 0);
  if (segments < 0) op.invalid(fmt::format("num_segments = {} is negative", segments));
  if (ids.shape.size() > data.shape.size() ||
      !std::equal(ids.shape.begin(), ids.shape.end(), data.shape.begin()))
    op.invalid(fmt::format("segment_ids {} must be a prefix of data {}", shape_str(ids.shape),
                           shape_str(data.shape)));
  std::vector<int64_t> out_shape = {segments};
  out_shape.insert(out_shape.end(), data.shape.begin() + static_cast<int64_t>(ids.shape.size()),
                   data.shape.end());
  const TensorDesc out{dt, out_shape};
  CompiledKernel k;
  k.outputs = {out};
  if (out.num_elements() == 0) return k;
  const int64_t inner = dims_product(data.shape, ids.shape.size(), data.shape.size());
  const int64_t rows = ids.num_elements();
  // bf16 without bf16 arithmetic: summed in f32, rounded once (compile_bf16_in_f32).
  if (widens_bf16(device_dtype(dt), ctx.cfg)) return compile_bf16_in_f32(ctx);
  if (dt == DataType::S64) {  // the scalar unit (ops/int64.h)
    k.launches.push_back(build_s64_segment_sum(op.str(), rows, inner, segments, ids.dtype,
                                               ctx.cfg));
    return k;
  }
  if (use_segment_owners(ctx.cfg, dt, inner, segments))
    k.launches.push_back(
        build_segment_owner_sum(op.str(), dt, ids.dtype, rows, inner, segments, ctx.cfg));
  else if (auto p = plan_column_sum(ctx.cfg, dt, rows, inner, segments))
    k.launches.push_back(
        build_segment_column_sum(op.str(), dt, ids.dtype, rows, inner, segments, *p, ctx.cfg));
  else
    k.launches.push_back(build_segment_tile_sum(op.str(), op.inputs, out_shape, rows, inner,
                                                ctx.cfg));
  return k;
}

CompiledKernel compile_one_hot(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 3)
    op.fail(fmt::format("takes 3 inputs (indices, on_value, off_value; depth is an attribute), "
                        "{} given",
                        op.inputs.size()));
  const TensorDesc& indices = op.inputs[0];
  const DataType dt = op.inputs[1].dtype;
  if (op.inputs[2].dtype != dt)
    op.fail(fmt::format("on_value {} and off_value {} differ in dtype", op.inputs[1].str(),
                        op.inputs[2].str()));
  check_t_attr(op, "T", dt);
  for (int i = 1; i <= 2; ++i)
    if (op.inputs[static_cast<size_t>(i)].num_elements() != 1)
      op.invalid(fmt::format("{} {} must be a scalar", i == 1 ? "on_value" : "off_value",
                             op.inputs[static_cast<size_t>(i)].str()));
  if (!index_type(indices.dtype, true))
    op.fail(fmt::format("indices {} must be s32, s64, u8 or s8", indices.str()));
  if (!op.attrs.count("depth")) op.fail("attribute depth is missing");
  const int64_t depth = op.attr_int("depth", 0);
  if (depth < 0) op.invalid(fmt::format("depth = {} is negative", depth));
  const int64_t rank = static_cast<int64_t>(indices.shape.size());
  int64_t axis = op.attr_int("axis", -1);
  if (axis < -1 || axis > rank)
    op.invalid(fmt::format("axis = {} is out of range [-1, {}]", axis, rank));
  if (axis == -1) axis = rank;
  std::vector<int64_t> out_shape = indices.shape;
  out_shape.insert(out_shape.begin() + axis, depth);
  const TensorDesc out{dt, out_shape};
  CompiledKernel k;
  k.outputs = {out};
  if (out.num_elements() == 0) return k;
  const int64_t inner = dims_product(indices.shape, static_cast<size_t>(axis));
  const int64_t plane = depth * inner;  // output elements per outer index
  const int isize = data_type_bytes(indices.dtype);
  TileKernel::Options opt;
  opt.kernel_name = fmt::format("OneHot_{}_{}", data_type_name(dt), data_type_name(indices.dtype));
  opt.dtype = dt;
  opt.inputs = op.inputs;
  opt.out_shape = out_shape;
  opt.runs = false;
  TileKernel tk(op.str(), opt, ctx.cfg);
  Launch l = tk.build([&](TileKernel& t) {
    KernelBuilder& b = t.b();
    {
      Reg off = b.reg("off value"), zero = b.reg_imm("zero", 0);
      Reg a = t.input_addr(2);
      t.load_element(off, a);
      t.splat(zero, t.cnt(), off);
    }
    Reg on = b.reg("on value");
    {
      Reg a = t.input_addr(1);
      t.load_element(on, a);
    }
    // Outer indices whose plane overlaps the tile; every index of each is checked.
    Reg o = b.reg("outer index"), o_end = b.reg("end outer index"), j = b.reg("inner index"),
        v = b.reg("index value"), p = b.reg("position in the tile");
    b.div(o, t.pos(), plane);
    b.add(o_end, t.pos(), t.cnt());
    b.add(o_end, o_end, plane - 1);
    b.div(o_end, o_end, plane);
    Label top = b.label("outer_loop");
    b.bind(top);
    b.for_range(j, 0, inner, 1, [&] {
      Label skip = b.label("index_skip");
      {
        Reg a = t.input_addr(0);
        b.mul(v, o, inner);
        b.add(v, v, j);
        b.mul(v, v, isize);
        b.add(v, v, a);
        t.load_index(v, v, indices.dtype);
      }
      b.branch(lt(v, 0), skip);
      b.branch(ge(v, depth), skip);
      // position = o * depth * inner + v * inner + j - pos
      b.mul(p, v, inner);
      b.add(p, p, j);
      b.mul(v, o, plane);
      b.add(p, p, v);
      b.sub(p, p, t.pos());
      b.branch(lt(p, 0), skip);
      b.branch(ge(p, t.cnt()), skip);
      t.place(p, on);
      b.bind(skip);
    });
    b.add(o, o, 1);
    b.branch(lt(o, o_end), top);
  });
  k.launches.push_back(std::move(l));
  return k;
}

}  // namespace

CompiledKernel compile_gather(const CompileContext& ctx) {
  const std::string& t = ctx.op.type;
  // TF's full input lists: drop the shape operands (attributes here).
  const size_t n = ctx.op.inputs.size();
  if ((t == "GatherV2" && n == 3) || (t == "UnsortedSegmentSum" && n == 3))
    return compile_without_inputs(ctx, {2}, compile_gather);
  if (t == "OneHot" && n == 4) return compile_without_inputs(ctx, {1}, compile_gather);
  if (t == "GatherV2") return compile_gather_v2(ctx);
  if (t == "UnsortedSegmentSum") return compile_unsorted_segment_sum(ctx);
  if (t == "OneHot") return compile_one_hot(ctx);
  ctx.op.fail("internal: not a gather op");
}

}  // namespace npusim::compiler::ops
