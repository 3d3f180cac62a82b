// Data movement: Transpose, ConcatV2, Pack, Unpack, Split, SplitV, Slice, StridedSlice,
// StridedSliceGrad, ReverseV2, Pad, PadV2, MirrorPad, Tile, BroadcastTo, XlaDynamicUpdateSlice.
// Every op
// is a strided copy: its output described as rows x width with regions of the inputs
// (ops/assemble.h), assembled tile by tile in the UB of the vector cores; Transpose has its own
// strategies (ops/transpose.h). Ops with several outputs (Unpack, Split, SplitV) get one launch
// per output.
//
// Operands TF passes as (constant) tensors that determine shapes are attributes named after the
// TF input (docs/compiler.md): Transpose "perm", ConcatV2 "axis", Split "split_dim", SplitV
// "size_splits" and "split_dim", Slice "begin" and "size", StridedSlice(Grad) "begin", "end",
// "strides" (and StridedSliceGrad "shape"), ReverseV2 "axis", Pad/PadV2/MirrorPad "paddings" (flattened
// [rank, 2] list: before_0, after_0, before_1, ...), Tile "multiples", BroadcastTo "shape",
// XlaDynamicUpdateSlice "indices".
// PadV2's constant_values stays a (scalar) input. The shape tensors may also stay in `inputs`
// (TF's full input list): compile_layout drops them (compose.h, compile_without_inputs).
//
// Numerics: pure data movement, bit-exact for every dtype (f32 f16 bf16 s32 s16 s8 u8 u16 s64
// bool). Index errors TF reports at run time (a slice out of bounds, a bad perm) are compile
// errors here, as the operands are compile-time attributes.
#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "adapter/compiler/ops/assemble.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/transpose.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

namespace {

// ---- shared checks ----

// The dtype shared by inputs [first, first + count) (and the T attribute, if given).
DataType common_dtype(const OpDesc& op, size_t first, size_t count, const char* attr = "T") {
  if (op.inputs.size() < first + count || count == 0)
    op.fail(fmt::format("takes at least {} input(s), {} given", first + std::max<size_t>(count, 1),
                        op.inputs.size()));
  const DataType dt = op.inputs[first].dtype;
  for (size_t i = first + 1; i < first + count; ++i)
    if (op.inputs[i].dtype != dt)
      op.fail(fmt::format("inputs have different dtypes ({} and {})", data_type_name(dt),
                          data_type_name(op.inputs[i].dtype)));
  if (auto t = op.attr_type(attr); t && *t != dt)
    op.fail(fmt::format("attribute {} = {} does not match the input's {}", attr,
                        data_type_name(*t), data_type_name(dt)));
  return dt;
}

void require_inputs(const OpDesc& op, size_t n) {
  if (op.inputs.size() != n)
    op.fail(fmt::format("takes {} input(s), {} given (shape operands are attributes, see "
                        "docs/compiler.md)",
                        n, op.inputs.size()));
}

int64_t required_int(const OpDesc& op, const std::string& name) {
  if (!op.attrs.count(name)) op.fail(fmt::format("attribute {} is missing", name));
  return op.attr_int(name, 0);
}

std::vector<int64_t> required_ints(const OpDesc& op, const std::string& name, size_t n) {
  if (!op.attrs.count(name)) op.fail(fmt::format("attribute {} is missing", name));
  std::vector<int64_t> v = op.attr_ints(name);
  if (v.size() != n)
    op.invalid(fmt::format("attribute {} has {} values, {} expected", name, v.size(), n));
  return v;
}

// axis in [-rank, rank) -> [0, rank).
int64_t norm_axis(const OpDesc& op, int64_t axis, int64_t rank, const char* what) {
  if (axis < -rank || axis >= rank)
    op.invalid(fmt::format("{} = {} is out of range for rank {}", what, axis, rank));
  return axis < 0 ? axis + rank : axis;
}

std::string kname(const OpDesc& op, DataType dt) {
  return fmt::format("{}_{}", op.type, data_type_name(dt));
}

// One launch producing output `out` (none when it is empty).
CompiledKernel single(const CompileContext& ctx, const TensorDesc& out, const AssembleSpec& spec) {
  CompiledKernel k;
  k.outputs = {out};
  if (out.num_elements() > 0)
    k.launches.push_back(build_assemble_kernel(ctx.op.str(), spec, ctx.cfg));
  return k;
}

// The element offset of `v` in its input when it reads one contiguous run (dims of size 1
// aside, each stride the product of the later dims); nullopt otherwise.
std::optional<int64_t> contiguous_view_offset(const StridedView& v) {
  int64_t expect = 1;
  for (size_t d = v.dims.size(); d-- > 0;) {
    if (v.dims[d] == 0) return std::nullopt;
    if (v.dims[d] == 1) continue;
    if (v.strides[d] != expect) return std::nullopt;
    expect *= v.dims[d];
  }
  return v.offset;
}

// Several outputs, each a view of input 0: one launch per non-empty output; view_offsets where
// the view is contiguous.
CompiledKernel views(const CompileContext& ctx, DataType dt, const std::vector<TensorDesc>& outs,
                     const std::vector<StridedView>& vs) {
  LaunchPlan plan(outs);
  const TensorDesc& in = ctx.op.inputs[0];
  std::vector<int64_t> offsets;
  for (size_t j = 0; j < outs.size(); ++j) {
    const std::optional<int64_t> at = contiguous_view_offset(vs[j]);
    offsets.push_back(at ? *at * static_cast<int64_t>(data_type_bytes(dt)) : -1);
    if (outs[j].num_elements() == 0) continue;
    AssembleSpec spec = view_spec(fmt::format("{}_{}", kname(ctx.op, dt), j), dt, in.shape,
                                  outs[j].shape, vs[j]);
    plan.add(build_assemble_kernel(ctx.op.str(), spec, ctx.cfg),
             {LaunchPlan::input(0), LaunchPlan::output(static_cast<int>(j))},
             fmt::format("output {}", j));
  }
  CompiledKernel k = std::move(plan).finish();
  k.view_offsets = std::move(offsets);
  return k;
}

// ---- boxes: an output with one input region (and a background) ----

// One output dim: the region covers indices lo + k * step (k < count) of an output dim of
// `size`, reading source element stride * k.
struct BoxDim {
  int64_t size = 1;
  int64_t lo = 0, count = 1, step = 1;
  int64_t stride = 0;
  bool full() const { return lo == 0 && step == 1 && count == size; }
};

// Drops size-1 dims and merges a dim into the next one where the next is covered fully and the
// source strides chain, so runs get as long as possible.
std::vector<BoxDim> merge_box(const std::vector<BoxDim>& dims) {
  std::vector<BoxDim> out;
  for (const BoxDim& d : dims) {
    if (d.size == 1 && d.count == 1) continue;
    out.push_back(d);
  }
  for (size_t i = out.size(); i-- > 1;) {
    BoxDim& a = out[i - 1];
    const BoxDim& b = out[i];
    if (!b.full() || a.step != 1 || a.stride != b.stride * b.size) continue;
    a.lo *= b.size;
    a.count *= b.size;
    a.size *= b.size;
    a.stride = b.stride;
    out.erase(out.begin() + static_cast<std::ptrdiff_t>(i));
  }
  if (out.empty()) out.push_back(BoxDim{});
  return out;
}

// The spec of an output (out_shape) holding input `src` at the box (dims before merging) over a
// background; offset is the source element of the box's first element.
AssembleSpec box_spec(const std::string& name, DataType dt, const std::vector<TensorDesc>& inputs,
                      const std::vector<int64_t>& out_shape, const std::vector<BoxDim>& box,
                      int src, int64_t offset, std::optional<AsmFill> background) {
  AssembleSpec spec;
  spec.kernel_name = name;
  spec.dtype = dt;
  spec.inputs = inputs;
  spec.out_shape = out_shape;
  spec.background = background;
  const std::vector<BoxDim> dims = merge_box(box);
  for (const BoxDim& d : dims) {
    if (d.count == 0) {  // nothing of the input is visible: the background only
      spec.width = 1;
      for (int64_t s : out_shape) spec.width *= s;
      return spec;
    }
  }
  for (size_t i = 0; i + 1 < dims.size(); ++i) spec.rows.push_back(dims[i].size);
  spec.width = dims.back().size;
  AsmRegion r;
  for (size_t i = 0; i + 1 < dims.size(); ++i) {
    const BoxDim& d = dims[i];
    r.rows.push_back(
        AsmRowMap{d.lo, d.lo + (d.count - 1) * d.step + 1, d.step, d.stride, -1, 0, {}});
  }
  const BoxDim& c = dims.back();
  r.col_lo = c.lo;
  r.col_hi = c.lo + (c.count - 1) * c.step + 1;
  r.col_step = c.step;
  r.col_stride = c.stride;
  r.input = src;
  r.offset = offset;
  spec.regions.push_back(r);
  return spec;
}

// ---- ops ----

CompiledKernel compile_transpose(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  require_inputs(op, 1);
  const DataType dt = common_dtype(op, 0, 1);
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const size_t rank = shape.size();
  const std::vector<int64_t> perm = required_ints(op, "perm", rank);
  std::vector<bool> seen(rank, false);
  for (int64_t p : perm) {
    if (p < 0 || p >= static_cast<int64_t>(rank) || seen[static_cast<size_t>(p)])
      op.invalid(fmt::format("perm {} is not a permutation of 0..{}", shape_str(perm),
                             static_cast<int64_t>(rank) - 1));
    seen[static_cast<size_t>(p)] = true;
  }
  const TensorDesc out{dt, permuted_shape(shape, perm)};
  LaunchPlan plan({out});
  append_transpose(plan, op.str(), ctx.cfg, dt, shape, perm, LaunchPlan::input(0),
                   LaunchPlan::output(0));
  return std::move(plan).finish();
}

// A kernel addresses its arguments by ldarg's 8-bit index: one concatenation kernel takes at
// most this many inputs (half the index range, leaving room for the output and the rest).
CompiledKernel compile_concat(const CompileContext& ctx);

size_t max_concat_inputs() { return (isa::field_imm_max(isa::FieldKind::U8) + 1) / 2; }

// The concatenation along `axis` of inputs of `shapes` (Pack's with the new dim inserted) when
// there are more than one kernel can address: groups of max_concat_inputs() inputs are
// concatenated along the same axis into workspace slices, then the slices into the output (a
// group of groups again if there are still too many). Every level is a plain concatenation.
CompiledKernel concat_in_groups(const CompileContext& ctx, DataType dt,
                                const std::vector<std::vector<int64_t>>& shapes, int64_t axis,
                                const TensorDesc& out) {
  LaunchPlan plan({out});
  OpDesc top;
  top.type = "ConcatV2";
  top.attrs["axis"] = axis;
  std::vector<ArgRef> parts;
  const size_t group = max_concat_inputs();
  for (size_t g0 = 0; g0 < shapes.size(); g0 += group) {
    const size_t g1 = std::min(shapes.size(), g0 + group);
    OpDesc part;
    part.type = top.type;
    part.attrs = top.attrs;
    std::vector<ArgRef> ins;
    for (size_t k = g0; k < g1; ++k) {
      part.inputs.push_back(TensorDesc{dt, shapes[k]});
      ins.push_back(LaunchPlan::input(static_cast<int>(k)));
    }
    const CompiledKernel sub = compile_concat(CompileContext{part, ctx.cfg, ctx.precision});
    const TensorDesc& piece = sub.outputs[0];
    if (piece.num_elements() == 0) continue;  // contributes nothing along the axis
    const ArgRef slice = plan.workspace(piece.bytes());
    plan.add(sub, ins, {slice}, fmt::format("inputs {}..{}", g0, g1 - 1));
    top.inputs.push_back(piece);
    parts.push_back(slice);
  }
  if (!parts.empty())
    plan.add(compile_concat(CompileContext{top, ctx.cfg, ctx.precision}), parts,
             {LaunchPlan::output(0)}, fmt::format("{} groups", parts.size()));
  return std::move(plan).finish();
}

CompiledKernel concat_kernel(const CompileContext& ctx, DataType dt,
                             const std::vector<std::vector<int64_t>>& shapes, int64_t axis,
                             const TensorDesc& out);

// ConcatV2 (attr axis) and Pack (attr axis; inputs gain a dim of 1 there).
CompiledKernel compile_concat(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const bool pack = op.type == "Pack";
  if (op.inputs.empty()) op.fail("takes at least one input");
  const DataType dt = common_dtype(op, 0, op.inputs.size());
  if (op.attrs.count("N") && op.attr_int("N", 0) != static_cast<int64_t>(op.inputs.size()))
    op.fail(fmt::format("attribute N = {} but {} inputs are given", op.attr_int("N", 0),
                        op.inputs.size()));
  std::vector<std::vector<int64_t>> shapes;
  for (const TensorDesc& t : op.inputs) shapes.push_back(t.shape);
  int64_t axis = 0;
  if (pack) {
    const int64_t rank = static_cast<int64_t>(shapes[0].size()) + 1;
    axis = norm_axis(op, op.attr_int("axis", 0), rank, "axis");
    for (auto& s : shapes) s.insert(s.begin() + axis, 1);
  } else {
    const int64_t rank = static_cast<int64_t>(shapes[0].size());
    if (rank == 0) op.invalid("cannot concatenate scalars (rank 0)");
    axis = norm_axis(op, required_int(op, "axis"), rank, "axis");
  }
  std::vector<int64_t> out_shape = shapes[0];
  out_shape[static_cast<size_t>(axis)] = 0;
  for (size_t k = 0; k < shapes.size(); ++k) {
    if (shapes[k].size() != out_shape.size())
      op.invalid(fmt::format("input {} has rank {}, input 0 has rank {}", k,
                             op.inputs[k].shape.size(), op.inputs[0].shape.size()));
    for (size_t d = 0; d < out_shape.size(); ++d)
      if (d != static_cast<size_t>(axis) && shapes[k][d] != shapes[0][d])
        op.invalid(fmt::format("input {} {} does not match input 0 {} outside the axis", k,
                               op.inputs[k].str(), op.inputs[0].str()));
    out_shape[static_cast<size_t>(axis)] += shapes[k][static_cast<size_t>(axis)];
  }
  const TensorDesc out{dt, out_shape};
  CompiledKernel k = op.inputs.size() > max_concat_inputs()
                         ? concat_in_groups(ctx, dt, shapes, axis, out)
                         : concat_kernel(ctx, dt, shapes, axis, out);
  // With nothing before the axis (outer 1) every input is one contiguous piece of the output.
  if (dims_product(out_shape, 0, static_cast<size_t>(axis)) == 1) {
    const int64_t inner = dims_product(out_shape, static_cast<size_t>(axis) + 1);
    int64_t col = 0;
    for (const auto& shape : shapes) {
      k.concat_offsets.push_back(col * static_cast<int64_t>(data_type_bytes(dt)));
      col += shape[static_cast<size_t>(axis)] * inner;
    }
  }
  return k;
}

// compile_concat's single launch (at most max_concat_inputs() inputs).
CompiledKernel concat_kernel(const CompileContext& ctx, DataType dt,
                             const std::vector<std::vector<int64_t>>& shapes, int64_t axis,
                             const TensorDesc& out) {
  const OpDesc& op = ctx.op;
  const std::vector<int64_t>& out_shape = out.shape;
  AssembleSpec spec;
  spec.kernel_name = kname(op, dt);
  spec.dtype = dt;
  spec.inputs = op.inputs;
  spec.out_shape = out_shape;
  const int64_t outer = dims_product(out_shape, 0, static_cast<size_t>(axis));
  const int64_t inner = dims_product(out_shape, static_cast<size_t>(axis) + 1);
  spec.rows = {outer};
  spec.width = out_shape[static_cast<size_t>(axis)] * inner;
  int64_t col = 0;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const int64_t c = shapes[k][static_cast<size_t>(axis)] * inner;
    if (c == 0) continue;
    AsmRegion r = full_region(spec, static_cast<int>(k), 0, {c}, 1);
    r.col_lo = col;
    r.col_hi = col + c;
    spec.regions.push_back(r);
    col += c;
  }
  return single(ctx, out, spec);
}

// Unpack (attrs num, axis).
CompiledKernel compile_unpack(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  require_inputs(op, 1);
  const DataType dt = common_dtype(op, 0, 1);
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank == 0) op.invalid("cannot unpack a scalar");
  const int64_t axis = norm_axis(op, op.attr_int("axis", 0), rank, "axis");
  const int64_t num = shape[static_cast<size_t>(axis)];
  if (op.attrs.count("num") && op.attr_int("num", 0) != num)
    op.invalid(fmt::format("attribute num = {} but dim {} has size {}", op.attr_int("num", 0), axis,
                           num));
  std::vector<int64_t> out_shape = shape;
  out_shape.erase(out_shape.begin() + axis);
  const int64_t outer = dims_product(shape, 0, static_cast<size_t>(axis));
  const int64_t inner = dims_product(shape, static_cast<size_t>(axis) + 1);
  std::vector<TensorDesc> outs;
  std::vector<StridedView> vs;
  for (int64_t j = 0; j < num; ++j) {
    outs.push_back(TensorDesc{dt, out_shape});
    vs.push_back(StridedView{{outer, inner}, {num * inner, 1}, j * inner});
  }
  return views(ctx, dt, outs, vs);
}

// Split (attrs split_dim, num_split) and SplitV (attrs size_splits, split_dim).
CompiledKernel compile_split(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  require_inputs(op, 1);
  const DataType dt = common_dtype(op, 0, 1);
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (rank == 0) op.invalid("cannot split a scalar");
  const int64_t axis = norm_axis(op, required_int(op, "split_dim"), rank, "split_dim");
  const int64_t dim = shape[static_cast<size_t>(axis)];
  std::vector<int64_t> sizes;
  if (op.type == "Split") {
    const int64_t num = required_int(op, "num_split");
    if (num <= 0) op.invalid(fmt::format("num_split = {} must be positive", num));
    if (dim % num != 0)
      op.invalid(
          fmt::format("dim {} of size {} is not divisible by num_split = {}", axis, dim, num));
    sizes.assign(static_cast<size_t>(num), dim / num);
  } else {
    if (!op.attrs.count("size_splits")) op.fail("attribute size_splits is missing");
    sizes = op.attr_ints("size_splits");
    if (op.attrs.count("num_split") &&
        op.attr_int("num_split", 0) != static_cast<int64_t>(sizes.size()))
      op.invalid(fmt::format("num_split = {} but size_splits has {} values",
                             op.attr_int("num_split", 0), sizes.size()));
    int64_t known = 0, unknown = -1;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] == -1 && unknown < 0) unknown = static_cast<int64_t>(i);
      else if (sizes[i] < 0)
        op.invalid(fmt::format("size_splits {} may hold one -1 and otherwise sizes >= 0",
                               shape_str(sizes)));
      else known += sizes[i];
    }
    if (unknown >= 0) {
      if (known > dim)
        op.invalid(fmt::format("size_splits {} exceed dim {} of size {}", shape_str(sizes), axis,
                               dim));
      sizes[static_cast<size_t>(unknown)] = dim - known;
    } else if (known != dim) {
      op.invalid(fmt::format("size_splits {} do not add up to dim {} of size {}", shape_str(sizes),
                             axis, dim));
    }
  }
  const int64_t outer = dims_product(shape, 0, static_cast<size_t>(axis));
  const int64_t inner = dims_product(shape, static_cast<size_t>(axis) + 1);
  std::vector<TensorDesc> outs;
  std::vector<StridedView> vs;
  int64_t at = 0;
  for (int64_t s : sizes) {
    std::vector<int64_t> out_shape = shape;
    out_shape[static_cast<size_t>(axis)] = s;
    outs.push_back(TensorDesc{dt, out_shape});
    vs.push_back(StridedView{{outer, s * inner}, {dim * inner, 1}, at * inner});
    at += s;
  }
  return views(ctx, dt, outs, vs);
}

// Slice (attrs begin, size; size -1 = to the end).
CompiledKernel compile_slice(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  require_inputs(op, 1);
  const DataType dt = common_dtype(op, 0, 1);
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const std::vector<int64_t> begin = required_ints(op, "begin", shape.size());
  std::vector<int64_t> size = required_ints(op, "size", shape.size());
  const std::vector<int64_t> strides = contiguous_strides(shape);
  StridedView v;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (size[d] == -1) size[d] = shape[d] - begin[d];
    if (begin[d] < 0 || size[d] < 0 || begin[d] + size[d] > shape[d])
      op.invalid(fmt::format("begin {} size {} is outside the input in dim {} (size {})",
                             begin[d], size[d], d, shape[d]));
    v.dims.push_back(size[d]);
    v.strides.push_back(strides[d]);
    v.offset += begin[d] * strides[d];
  }
  const TensorDesc out{dt, size};
  return views(ctx, dt, {out}, {v});
}

// StridedSlice's canonical form (TF's ValidateStridedSliceOp): per input dim the first index,
// the step and the element count; and the output shape after new and shrunk axes.
struct DenseSlice {
  std::vector<int64_t> begin, stride, size;
  std::vector<int64_t> final_shape;
};

DenseSlice strided_slice_spec(const OpDesc& op, const std::vector<int64_t>& shape) {
  if (!op.attrs.count("begin") || !op.attrs.count("end") || !op.attrs.count("strides"))
    op.fail("attributes begin, end and strides are required");
  const std::vector<int64_t> begin = op.attr_ints("begin"), end = op.attr_ints("end"),
                             strides = op.attr_ints("strides");
  if (begin.size() != end.size() || begin.size() != strides.size())
    op.invalid(fmt::format("begin {}, end {} and strides {} differ in length", shape_str(begin),
                           shape_str(end), shape_str(strides)));
  const int64_t begin_mask = op.attr_int("begin_mask", 0), end_mask = op.attr_int("end_mask", 0),
                new_axis_mask = op.attr_int("new_axis_mask", 0),
                shrink_mask = op.attr_int("shrink_axis_mask", 0);
  int64_t ellipsis_mask = op.attr_int("ellipsis_mask", 0);
  if (ellipsis_mask & (ellipsis_mask - 1)) op.invalid("more than one ellipsis in ellipsis_mask");
  int sparse_dims = static_cast<int>(begin.size());
  int add_after_ellipsis = 0;
  bool ellipsis_seen = false;
  for (int i = 0; i < sparse_dims; ++i) {
    if (ellipsis_seen && ((int64_t{1} << i) & new_axis_mask)) ++add_after_ellipsis;
    if ((int64_t{1} << i) & ellipsis_mask) ellipsis_seen = true;
  }
  if (!ellipsis_seen) ellipsis_mask |= int64_t{1} << sparse_dims++;
  const int dims = static_cast<int>(shape.size());
  constexpr int64_t kNewAxis = -1, kShrinkAxis = -2;
  std::vector<int64_t> d_begin(static_cast<size_t>(dims), 0), d_end(d_begin), d_stride(d_begin);
  std::vector<bool> d_bmask(static_cast<size_t>(dims)), d_emask(d_bmask), d_shrink(d_bmask);
  std::vector<int64_t> gather;
  int full = 0;
  for (int i = 0; i < sparse_dims; ++i) {
    const int64_t bit = int64_t{1} << i;
    if (bit & ellipsis_mask) {
      const int next = std::min(dims - (sparse_dims - i) + 1 + add_after_ellipsis, dims);
      for (; full < next; ++full) {
        d_stride[static_cast<size_t>(full)] = 1;
        d_bmask[static_cast<size_t>(full)] = d_emask[static_cast<size_t>(full)] = true;
        gather.push_back(full);
      }
    } else if (bit & new_axis_mask) {
      gather.push_back(kNewAxis);
    } else {
      if (full >= dims)
        op.invalid(fmt::format("the slice spec indexes dim {}, the input has rank {}", full, dims));
      const size_t f = static_cast<size_t>(full);
      d_begin[f] = begin[static_cast<size_t>(i)];
      d_end[f] = end[static_cast<size_t>(i)];
      d_stride[f] = strides[static_cast<size_t>(i)];
      d_bmask[f] = (begin_mask & bit) != 0;
      d_emask[f] = (end_mask & bit) != 0;
      if (shrink_mask & bit) {
        d_shrink[f] = true;
        gather.push_back(kShrinkAxis);
      } else {
        gather.push_back(full);
      }
      ++full;
    }
  }
  DenseSlice s;
  for (size_t i = 0; i < static_cast<size_t>(dims); ++i) {
    const int64_t dim = shape[i], stride = d_stride[i];
    if (stride == 0) op.invalid(fmt::format("strides[{}] is 0", i));
    if (d_shrink[i] && stride <= 0)
      op.invalid("only stride 1 allowed on non-range indexing (shrink_axis_mask)");
    int64_t b = d_begin[i], e = d_end[i];
    if (d_shrink[i]) {
      const int64_t x = b < 0 ? dim + b : b;
      if (x < 0 || x >= dim)
        op.invalid(fmt::format("slice index {} of dim {} is out of bounds (size {})", b, i, dim));
      b = x;
      e = x + 1;
    } else {
      const int64_t lo = stride > 0 ? 0 : -1, hi = stride > 0 ? dim : dim - 1;
      auto canonical = [&](int64_t x, bool masked, bool is_end) {
        if (masked) return stride > 0 ? (is_end ? hi : lo) : (is_end ? lo : hi);
        const int64_t fwd = x < 0 ? dim + x : x;
        return std::clamp(fwd, lo, hi);
      };
      b = canonical(b, d_bmask[i], false);
      e = canonical(e, d_emask[i], true);
    }
    const int64_t len = e - b;
    int64_t n = 0;
    if (len != 0 && (len < 0) == (stride < 0)) n = len / stride + (len % stride != 0 ? 1 : 0);
    s.begin.push_back(b);
    s.stride.push_back(stride);
    s.size.push_back(n);
  }
  for (int64_t g : gather) {
    if (g == kNewAxis) s.final_shape.push_back(1);
    else if (g != kShrinkAxis) s.final_shape.push_back(s.size[static_cast<size_t>(g)]);
  }
  return s;
}

CompiledKernel compile_strided_slice(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  require_inputs(op, 1);
  const DataType dt = common_dtype(op, 0, 1);
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const DenseSlice s = strided_slice_spec(op, shape);
  const std::vector<int64_t> in_strides = contiguous_strides(shape);
  StridedView v;
  for (size_t d = 0; d < shape.size(); ++d) {
    v.dims.push_back(s.size[d]);
    v.strides.push_back(s.stride[d] * in_strides[d]);
    v.offset += s.begin[d] * in_strides[d];
  }
  return views(ctx, dt, {TensorDesc{dt, s.final_shape}}, {v});
}

// ReverseV2 (attr axis: the dims to reverse, each in [-rank, rank), none twice; Keras'
// RandomFlip, go_backwards recurrences, Bidirectional): a view of the input whose reversed dims
// step backwards from their last index, as StridedSlice's negative strides.
CompiledKernel compile_reverse(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  require_inputs(op, 1);
  const DataType dt = common_dtype(op, 0, 1);
  if (!op.attrs.count("axis")) op.fail("attribute axis is missing");
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const int64_t rank = static_cast<int64_t>(shape.size());
  std::vector<bool> reversed(shape.size(), false);
  for (int64_t a : op.attr_ints("axis")) {
    const size_t d = static_cast<size_t>(norm_axis(op, a, rank, "axis"));
    if (reversed[d]) op.invalid(fmt::format("axis {} is given more than once", d));
    reversed[d] = true;
  }
  const std::vector<int64_t> in_strides = contiguous_strides(shape);
  StridedView v;
  for (size_t d = 0; d < shape.size(); ++d) {
    v.dims.push_back(shape[d]);
    v.strides.push_back(reversed[d] ? -in_strides[d] : in_strides[d]);
    if (reversed[d] && shape[d] > 0) v.offset += (shape[d] - 1) * in_strides[d];
  }
  if (v.dims.empty()) {  // a scalar: one element, as a view of rank 1
    v.dims = {1};
    v.strides = {1};
  }
  return views(ctx, dt, {TensorDesc{dt, shape}}, {v});
}

// StridedSliceGrad (attrs shape, begin, end, strides, masks; input dy): zeros of `shape` with
// dy at the positions StridedSlice reads.
CompiledKernel compile_strided_slice_grad(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  require_inputs(op, 1);
  const DataType dt = common_dtype(op, 0, 1);
  if (!op.attrs.count("shape")) op.fail("attribute shape is missing");
  const std::vector<int64_t> shape = op.attr_ints("shape");
  for (int64_t d : shape)
    if (d < 0) op.invalid(fmt::format("shape {} has a negative dim", shape_str(shape)));
  const DenseSlice s = strided_slice_spec(op, shape);
  if (op.inputs[0].shape != s.final_shape)
    op.invalid(fmt::format("dy {} does not have the slice's shape {}", op.inputs[0].str(),
                           shape_str(s.final_shape)));
  const std::vector<int64_t> dy_strides = contiguous_strides(s.size);
  std::vector<BoxDim> box;
  int64_t offset = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    BoxDim b;
    b.size = shape[d];
    b.count = s.size[d];
    if (s.stride[d] > 0) {
      b.lo = s.begin[d];
      b.step = s.stride[d];
      b.stride = dy_strides[d];
    } else {  // descending indices: the box from the lowest, dy read backwards
      b.lo = s.begin[d] + (s.size[d] - 1) * s.stride[d];
      b.step = -s.stride[d];
      b.stride = -dy_strides[d];
      offset += (s.size[d] - 1) * dy_strides[d];
    }
    if (b.count == 0) b.lo = 0;
    box.push_back(b);
  }
  const TensorDesc out{dt, shape};
  return single(ctx, out,
                box_spec(kname(op, dt), dt, op.inputs, shape, box, 0, offset, AsmFill{-1, 0}));
}

// XlaDynamicUpdateSlice: the input with `update` written at the start indices. Each start is
// clamped to [0, input dim - update dim] as XLA's DynamicUpdateSlice does, so the update always
// lies inside (keras.ops.slice_update, keras-hub's KV-cache writes). The starts come either
//  - from device memory: inputs (input, update, indices: s32 or s64 [rank]), TF's op as the
//    plugin runs it; the kernel's scalar unit loads and clamps them (AsmShift), so one
//    compiled kernel serves every position (a decode step's cache write at any index), or
//  - from the attribute "indices" with inputs (input, update): starts fixed at compile time.
// Two regions: the whole input, then the update's box over it; the trailing dims the update
// covers fully are merged into the columns, so a cache row of heads x head_dim is one run.
// Attribute in_place (bool, default false; device starts only): the output IS the input's
// buffer (the caller passes one address for both: a KV cache held in a variable) and only the
// update's box is written, at its start read at run time, as CANN's in-place KV-cache update
// (ScatterUpdate) writes a new row: the bytes moved are the update's. The box must be runs of
// whole 32-byte blocks at 32-byte offsets, one tile per run (the update covers
// every dim before the first dim it does not cover fully: a [B, 1, N, D] row of a
// [B, L, N, D] cache is B runs), so no block outside it is written; otherwise the op is
// unimplemented.
CompiledKernel compile_dynamic_update_slice_in_place(const CompileContext& ctx);

CompiledKernel compile_dynamic_update_slice(const CompileContext& ctx) {
  if (ctx.op.attr_bool("in_place", false)) return compile_dynamic_update_slice_in_place(ctx);
  const OpDesc& op = ctx.op;
  const bool device_starts = op.inputs.size() == 3;
  if (!device_starts) require_inputs(op, 2);
  const DataType dt = common_dtype(op, 0, 2);
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const std::vector<int64_t>& upd = op.inputs[1].shape;
  const size_t rank = shape.size();
  if (upd.size() != rank)
    op.invalid(fmt::format("update {} must have the rank of input {}", op.inputs[1].str(),
                           op.inputs[0].str()));
  if (device_starts) {
    const TensorDesc& idx = op.inputs[2];
    if ((idx.dtype != DataType::S32 && idx.dtype != DataType::S64) || idx.shape.size() != 1 ||
        idx.shape[0] != static_cast<int64_t>(rank))
      op.invalid(fmt::format("indices {} must be int32 or int64 of shape [{}] (the rank of {})",
                             idx.str(), rank, op.inputs[0].str()));
  }
  std::vector<int64_t> start =
      device_starts ? std::vector<int64_t>(rank, 0) : required_ints(op, "indices", rank);
  for (size_t d = 0; d < rank; ++d) {
    if (upd[d] > shape[d])
      op.invalid(fmt::format("update {} is larger than input {} in dim {}", op.inputs[1].str(),
                             op.inputs[0].str(), d));
    start[d] = std::clamp<int64_t>(start[d], 0, shape[d] - upd[d]);
  }
  // Device starts: dim d's start is read at run time where it can move (update smaller than
  // the input there); elsewhere the clamp makes it 0.
  auto shift = [&](size_t d, int64_t scale) {
    AsmShift s;
    if (device_starts && upd[d] < shape[d])
      s = AsmShift{2, static_cast<int64_t>(d), shape[d] - upd[d], scale};
    return s;
  };
  // Columns: dim c and every dim after it, all of which the update covers fully.
  size_t c = rank == 0 ? 0 : rank - 1;
  while (c > 0 && upd[c] == shape[c]) --c;
  const int64_t inner = dims_product(shape, c + 1);
  AssembleSpec spec;
  spec.kernel_name = kname(op, dt);
  spec.dtype = dt;
  spec.inputs = op.inputs;
  spec.out_shape = shape;
  spec.rows.assign(shape.begin(), shape.begin() + static_cast<std::ptrdiff_t>(c));
  spec.width = dims_product(shape, c);
  const std::vector<int64_t> in_strides = contiguous_strides(shape);
  const std::vector<int64_t> upd_strides = contiguous_strides(upd);
  spec.regions.push_back(full_region(
      spec, 0, 0, std::vector<int64_t>(in_strides.begin(), in_strides.begin() + c), 1));
  if (dims_product(upd) > 0) {
    AsmRegion r;
    for (size_t d = 0; d < c; ++d)
      r.rows.push_back(
          AsmRowMap{start[d], start[d] + upd[d], 1, upd_strides[d], -1, 0, shift(d, 1)});
    r.col_lo = rank == 0 ? 0 : start[c] * inner;
    r.col_hi = rank == 0 ? 1 : (start[c] + upd[c]) * inner;
    if (rank > 0) r.col_shift = shift(c, inner);
    r.input = 1;
    spec.regions.push_back(r);
  }
  return single(ctx, TensorDesc{dt, shape}, spec);
}

CompiledKernel compile_dynamic_update_slice_in_place(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  require_inputs(op, 3);
  const DataType dt = common_dtype(op, 0, 2);
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const std::vector<int64_t>& upd = op.inputs[1].shape;
  const TensorDesc& idx = op.inputs[2];
  const size_t rank = shape.size();
  if (rank == 0 || upd.size() != rank)
    op.invalid(fmt::format("update {} must have the rank of input {} (at least 1)",
                           op.inputs[1].str(), op.inputs[0].str()));
  if ((idx.dtype != DataType::S32 && idx.dtype != DataType::S64) || idx.shape.size() != 1 ||
      idx.shape[0] != static_cast<int64_t>(rank))
    op.invalid(fmt::format("indices {} must be int32 or int64 of shape [{}] (the rank of {})",
                           idx.str(), rank, op.inputs[0].str()));
  for (size_t d = 0; d < rank; ++d)
    if (upd[d] > shape[d])
      op.invalid(fmt::format("update {} is larger than input {} in dim {}", op.inputs[1].str(),
                             op.inputs[0].str(), d));
  // c: the first dim (from the end) the update does not cover fully; a run is upd[c] rows of
  // the dims after c, at start[c] (read at run time), one run per index of the dims before c.
  size_t c = rank - 1;
  while (c > 0 && upd[c] == shape[c]) --c;
  const int64_t inner = dims_product(shape, c + 1);
  const int64_t run = upd[c] * inner;
  const int64_t esize = data_type_bytes(dt);
  constexpr int64_t kBlock = npusim::layout::kBlockBytes;
  for (size_t d = 0; d < c; ++d)
    if (upd[d] != shape[d])
      throw CompileError(fmt::format(
          "{}: in place, the update {} must cover input {} in dim {} (one run per index)", op.str(),
          op.inputs[1].str(), op.inputs[0].str(), d));
  if ((inner * esize) % kBlock != 0 || (run * esize) % kBlock != 0)
    throw CompileError(fmt::format(
        "{}: in place, the update's runs {} and the rows of input {} must be whole {}-byte "
        "blocks",
        op.str(), op.inputs[1].str(), op.inputs[0].str(), kBlock));
  CompiledKernel k;
  k.outputs = {TensorDesc{dt, shape}};
  if (run == 0) return k;
  // One launch: the update's elements (contiguous) are its runs, run j (an index over the dims
  // before c) at j * shape[c] * inner of the input, one run per tile.
  const int64_t runs = dims_product(upd) / run;
  AssembleSpec spec;
  spec.kernel_name = kname(op, dt) + "_in_place";
  spec.dtype = dt;
  spec.inputs = op.inputs;
  spec.out_shape = {runs * run};
  spec.width = runs * run;
  spec.regions.push_back(full_region(spec, 1, 0, {}, 1));
  spec.out_arg_shape = shape;
  if (runs > 1) {
    spec.out_run = run;
    spec.out_run_stride = shape[c] * inner;
  }
  if (upd[c] < shape[c])
    spec.out_shift = AsmShift{2, static_cast<int64_t>(c), shape[c] - upd[c], inner};
  k.launches.push_back(build_assemble_kernel(op.str(), spec, ctx.cfg));
  return k;
}

// paddings attribute: rank pairs (before, after), non-negative.
std::vector<std::pair<int64_t, int64_t>> paddings_of(const OpDesc& op, size_t rank) {
  const std::vector<int64_t> p = required_ints(op, "paddings", 2 * rank);
  std::vector<std::pair<int64_t, int64_t>> v;
  for (size_t d = 0; d < rank; ++d) {
    if (p[2 * d] < 0 || p[2 * d + 1] < 0)
      op.invalid(fmt::format("paddings {} must be non-negative", shape_str(p)));
    v.emplace_back(p[2 * d], p[2 * d + 1]);
  }
  return v;
}

// Pad (zeros) and PadV2 (input 1: the scalar constant_values).
CompiledKernel compile_pad(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const bool v2 = op.type == "PadV2";
  require_inputs(op, v2 ? 2 : 1);
  const DataType dt = common_dtype(op, 0, v2 ? 2 : 1);
  if (v2 && op.inputs[1].num_elements() != 1)
    op.invalid(fmt::format("constant_values {} must be a scalar", op.inputs[1].str()));
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const auto pads = paddings_of(op, shape.size());
  const std::vector<int64_t> strides = contiguous_strides(shape);
  std::vector<int64_t> out_shape;
  std::vector<BoxDim> box;
  for (size_t d = 0; d < shape.size(); ++d) {
    int64_t dim = 0;
    if (__builtin_add_overflow(pads[d].first, shape[d], &dim) ||
        __builtin_add_overflow(dim, pads[d].second, &dim))
      op.invalid(fmt::format("paddings of dim {} make it pass 2^63", d));
    out_shape.push_back(dim);
    box.push_back(BoxDim{out_shape.back(), pads[d].first, shape[d], 1, strides[d]});
  }
  const TensorDesc out{dt, out_shape};
  op.check_size(out, "output");
  return single(ctx, out,
                box_spec(kname(op, dt), dt, op.inputs, out_shape, box, 0, 0,
                         v2 ? AsmFill{1, 0} : AsmFill{-1, 0}));
}

// MirrorPad (attr mode REFLECT or SYMMETRIC): each padded dim has three segments (left
// mirror, the input, right mirror), each an affine map with stride +-1; the output is the
// product of the segments of the padded dims. Rows: the dims up to the last padded one; the
// unpadded dims after it are the columns (runs).
CompiledKernel compile_mirror_pad(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  require_inputs(op, 1);
  const DataType dt = common_dtype(op, 0, 1);
  const std::string mode = op.attr_string("mode", "");
  if (mode != "REFLECT" && mode != "SYMMETRIC")
    op.invalid(fmt::format("mode '{}' must be REFLECT or SYMMETRIC", mode));
  const int64_t edge = mode == "REFLECT" ? 1 : 0;  // REFLECT skips the edge element
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const auto pads = paddings_of(op, shape.size());
  std::vector<int64_t> out_shape;
  int64_t last_padded = -1;
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t limit = shape[d] - edge;
    if (pads[d].first > limit || pads[d].second > limit)
      op.invalid(fmt::format("paddings ({}, {}) of dim {} must be at most {} for {} (size {})",
                             pads[d].first, pads[d].second, d, limit, mode, shape[d]));
    out_shape.push_back(pads[d].first + shape[d] + pads[d].second);
    if (pads[d].first || pads[d].second) last_padded = static_cast<int64_t>(d);
  }
  const TensorDesc out{dt, out_shape};
  if (last_padded < 0) {  // no padding: a copy
    StridedView v{{out.num_elements()}, {1}, 0};
    return views(ctx, dt, {out}, {v});
  }
  // The padded dims (0..last_padded) and the unpadded inner block.
  const size_t lp = static_cast<size_t>(last_padded);
  const int64_t inner = dims_product(shape, lp + 1);
  std::vector<int64_t> in_strides = contiguous_strides(shape);
  // Segments of dim d: (output lo, output hi, source index at lo, direction).
  struct Seg {
    int64_t lo, hi, src, dir;
  };
  std::vector<std::vector<Seg>> segs(lp + 1);
  for (size_t d = 0; d <= lp; ++d) {
    const int64_t n = shape[d], pl = pads[d].first, pr = pads[d].second;
    if (pl > 0) segs[d].push_back(Seg{0, pl, pl - 1 + edge, -1});  // output 0 mirrors pl-1+edge
    segs[d].push_back(Seg{pl, pl + n, 0, 1});
    if (pr > 0) segs[d].push_back(Seg{pl + n, pl + n + pr, n - 1 - edge, -1});
  }
  AssembleSpec spec;
  spec.kernel_name = kname(op, dt);
  spec.dtype = dt;
  spec.inputs = op.inputs;
  spec.out_shape = out_shape;
  const bool columns_padded = inner == 1;  // the last padded dim is the last dim
  const size_t row_dims = columns_padded ? lp : lp + 1;
  for (size_t d = 0; d < row_dims; ++d) spec.rows.push_back(out_shape[d]);
  spec.width = columns_padded ? out_shape[lp] : inner;
  std::vector<size_t> choice(lp + 1, 0);
  for (;;) {
    AsmRegion r;
    r.input = 0;
    for (size_t d = 0; d <= lp; ++d) {
      const Seg& s = segs[d][choice[d]];
      const int64_t stride = s.dir * (d == lp && columns_padded ? 1 : in_strides[d]);
      r.offset += s.src * in_strides[d];
      if (d < row_dims) {
        r.rows.push_back(AsmRowMap{s.lo, s.hi, 1, stride, -1, 0, {}});
      } else {
        r.col_lo = s.lo;
        r.col_hi = s.hi;
        r.col_stride = stride;
      }
    }
    if (!columns_padded) {
      r.col_lo = 0;
      r.col_hi = inner;
      r.col_stride = 1;
    }
    spec.regions.push_back(r);
    size_t d = 0;
    for (; d <= lp; ++d) {
      if (++choice[d] < segs[d].size()) break;
      choice[d] = 0;
    }
    if (d > lp) break;
  }
  return single(ctx, out, spec);
}

// Tile (attr multiples): output dims [m0*d0, m1*d1, ...] seen as [m0, d0, m1, d1, ...] with
// source strides [0, s0, 0, s1, ...].
CompiledKernel compile_tile(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  require_inputs(op, 1);
  const DataType dt = common_dtype(op, 0, 1);
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const std::vector<int64_t> mult = required_ints(op, "multiples", shape.size());
  const std::vector<int64_t> strides = contiguous_strides(shape);
  std::vector<int64_t> out_shape;
  StridedView v;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (mult[d] < 0) op.invalid(fmt::format("multiples {} must be non-negative", shape_str(mult)));
    int64_t dim = 0;
    if (__builtin_mul_overflow(mult[d], shape[d], &dim))
      op.invalid(fmt::format("multiples {} make dimension {} pass 2^63", shape_str(mult), d));
    out_shape.push_back(dim);
    v.dims.insert(v.dims.end(), {mult[d], shape[d]});
    v.strides.insert(v.strides.end(), {0, strides[d]});
  }
  op.check_size(TensorDesc{dt, out_shape}, "output");
  return views(ctx, dt, {TensorDesc{dt, out_shape}}, {v});
}

// BroadcastTo (attr shape).
CompiledKernel compile_broadcast_to(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  require_inputs(op, 1);
  const DataType dt = common_dtype(op, 0, 1);
  if (!op.attrs.count("shape")) op.fail("attribute shape is missing");
  const std::vector<int64_t> out_shape = op.attr_ints("shape");
  op.check_size(TensorDesc{dt, out_shape}, "shape");
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  auto b = broadcast_shapes(shape, out_shape);
  if (!b || *b != out_shape)
    op.invalid(
        fmt::format("{} cannot be broadcast to {}", op.inputs[0].str(), shape_str(out_shape)));
  const std::vector<int64_t> strides = contiguous_strides(shape);
  StridedView v;
  const size_t lead = out_shape.size() - shape.size();
  for (size_t d = 0; d < out_shape.size(); ++d) {
    v.dims.push_back(out_shape[d]);
    v.strides.push_back(d < lead || shape[d - lead] == 1 ? 0 : strides[d - lead]);
  }
  return views(ctx, dt, {TensorDesc{dt, out_shape}}, {v});
}

}  // namespace

CompiledKernel compile_layout(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const std::string& t = op.type;
  // TF's full input lists (shape operands included): drop the shape operands.
  struct TfInputs {
    const char* op;
    size_t count;
    std::vector<size_t> shape_operands;
  };
  static const TfInputs kTfInputs[] = {
      {"Transpose", 2, {1}},     {"Split", 2, {0}},        {"SplitV", 3, {1, 2}},
      {"Slice", 3, {1, 2}},      {"StridedSlice", 4, {1, 2, 3}},
      {"StridedSliceGrad", 5, {0, 1, 2, 3}},               {"Pad", 2, {1}},
      {"PadV2", 3, {1}},         {"MirrorPad", 2, {1}},    {"Tile", 2, {1}},
      {"BroadcastTo", 2, {1}},   {"ReverseV2", 2, {1}},
  };
  for (const TfInputs& e : kTfInputs)
    if (t == e.op && op.inputs.size() == e.count)
      return compile_without_inputs(ctx, e.shape_operands, compile_layout);
  if (t == "ConcatV2" && op.inputs.size() >= 2) {
    const TensorDesc& last = op.inputs.back();
    const bool axis_tensor = op.attrs.count("N")
                                 ? op.attr_int("N", 0) + 1 == static_cast<int64_t>(op.inputs.size())
                                 : last.shape.empty() && (last.dtype == DataType::S32 ||
                                                          last.dtype == DataType::S64);
    if (axis_tensor) return compile_without_inputs(ctx, {op.inputs.size() - 1}, compile_layout);
  }
  if (t == "Transpose") return compile_transpose(ctx);
  if (t == "ConcatV2" || t == "Pack") return compile_concat(ctx);
  if (t == "Unpack") return compile_unpack(ctx);
  if (t == "Split" || t == "SplitV") return compile_split(ctx);
  if (t == "Slice") return compile_slice(ctx);
  if (t == "StridedSlice") return compile_strided_slice(ctx);
  if (t == "StridedSliceGrad") return compile_strided_slice_grad(ctx);
  if (t == "ReverseV2") return compile_reverse(ctx);
  if (t == "Pad" || t == "PadV2") return compile_pad(ctx);
  if (t == "MirrorPad") return compile_mirror_pad(ctx);
  if (t == "Tile") return compile_tile(ctx);
  if (t == "BroadcastTo") return compile_broadcast_to(ctx);
  if (t == "XlaDynamicUpdateSlice") return compile_dynamic_update_slice(ctx);
  ctx.op.fail("internal: not a layout op");
}

}  // namespace npusim::compiler::ops
