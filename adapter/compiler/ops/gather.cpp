// Index-driven data movement on the vector cores (tiles assembled in the UB, ops/assemble.h);
// the indices are read by the scalar unit (ld, sign-extended):
//   GatherV2 (inputs params, indices; attrs axis, batch_dims = 0): output
//     params.shape[:axis] + indices.shape[batch_dims:] + params.shape[axis+1:]; batch_dims > 0
//     rewrites the indices into flat row numbers first (gather_batched); each output row of
//     prod(params.shape[axis+1:]) elements is one run of params (copy_gm2ub + vcopy; short rows
//     element by element). An index outside [0, params.shape[axis]) gives zeros, as TF's GPU
//     kernel (TF's CPU kernel fails the op).
//   UnsortedSegmentSum (inputs data, segment_ids; attr num_segments): each tile of the output
//     is zeroed, then every data row whose segment id falls in the tile is added (copy_gm2ub +
//     vadd under the exact-lane mask), in order of the rows: the same sequence of roundings as
//     TF's CPU kernel (output += data row by row, in the element type), so f16/bf16/f32
//     results are bit-identical and s32 wraps as TF. Negative ids are dropped (as TF); ids >=
//     num_segments are dropped too (TF fails the op). Types f32, f16, bf16, s32; s64 by the
//     scalar unit (build_s64_segment_sum, ops/int64.h: wrapping, same id rules). Every tile
//     reads every segment id (scalar ld): cost ~ tiles x rows.
//   OneHot (inputs indices, on_value, off_value; attrs depth, axis = -1): each tile is filled
//     with off_value, then on_value is placed (one-lane vdup) for every index that lands in
//     the tile; indices outside [0, depth) give a row of off_value (as TF). Any output dtype.
// Index types: s32, s64 (OneHot also u8, s8).
#include <fmt/format.h>

#include "adapter/compiler/ops/assemble.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/int64.h"
#include "adapter/compiler/ops/registry.h"

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
  if (dt == DataType::S64) {  // the scalar unit (ops/int64.h)
    k.launches.push_back(build_s64_segment_sum(op.str(), rows, inner, segments, ids.dtype,
                                               ctx.cfg));
    return k;
  }
  const int esize = data_type_bytes(dt);
  const int isize = data_type_bytes(ids.dtype);
  TileKernel::Options opt;
  opt.kernel_name = fmt::format("UnsortedSegmentSum_{}_{}", data_type_name(dt),
                                data_type_name(ids.dtype));
  opt.dtype = dt;
  opt.inputs = op.inputs;
  opt.out_shape = out_shape;
  opt.direct = false;  // rows are added, never copied
  TileKernel tk(op.str(), opt, ctx.cfg);
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
  k.launches.push_back(std::move(l));
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
