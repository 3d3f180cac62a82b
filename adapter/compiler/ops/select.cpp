// Element-wise selection and clipping, streamed by ops/elementwise:
//   SelectV2 (condition, t, e): numpy broadcasting of all three; Select (condition, t, e): t
//     and e of one shape, condition of that shape, a scalar, or a vector matching t's first
//     dim. Per tile: the bool condition widened to f16 (vconv u8 -> f16), vcmp != 0 into bits,
//     vsel of t / e (bits moved unchanged, any dtype: 2- and 4-byte types directly, 8-byte as
//     s32 pairs, 1-byte types through f16). A condition (or a 1-byte t / e) that needs
//     broadcasting is first expanded into the GM workspace by a copy kernel (ops/assemble.h):
//     the streaming kernel cannot gather 1-byte inputs.
//   ClipByValue (t, clip_value_min, clip_value_max, each broadcastable to t): as TF's kernel,
//     t.cwiseMin(clip_value_max).cwiseMax(clip_value_min): vmin then vmax, so min > max gives
//     min; exact (no rounding). NaN in t gives NaN (as TF); a NaN bound gives NaN (TF's Eigen
//     min/max return t there). Types f32, f16, bf16, s32.
#include <fmt/format.h>

#include "adapter/compiler/ops/assemble.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/registry.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

using vec::kRepeatBytes;  // one repeat of f16 constants

// A tensor as the streaming kernel sees it: 8-byte elements become s32 pairs ([..., 2]).
TensorDesc lanes_view(const TensorDesc& t) {
  if (data_type_bytes(t.dtype) != 8) return t;
  TensorDesc v{DataType::S32, t.shape};
  v.shape.push_back(2);
  return v;
}

enum SelectTemp { kBits, kHalf, kZero, kT16, kE16 };

// SelectV2's tile work for elements of `esize` bytes (1, 2, 4 or 8 as s32 pairs): operands
// in[0] the bool condition (one byte per element, not broadcast), in[1] t, in[2] e.
void select_work(int esize, StreamSpec& spec) {
  spec.temps = {TempSpec{"condition bits", 1.0 / 8, 32}, TempSpec{"condition f16", 2, 0},
                TempSpec{"f16 zeros", 0, kRepeatBytes}};
  if (esize == 1)
    spec.temps.insert(spec.temps.end(), {TempSpec{"t as f16", 2, 0}, TempSpec{"e as f16", 2, 0}});
  spec.prologue = [](KernelBuilder& b, const std::vector<uint64_t>& temp) {
    Reg count = b.reg_imm("constant lanes", kRepeatBytes / 2);
    b.emit(Opcode::op_set_mask_count, {count});
    b.emit(Opcode::op_vdup, {Dtype::F16, temp[kZero], Opnd::reg_number(0), 0, 1, 8}, "f16 zeros");
  };
  const Dtype lane = esize == 4 || esize == 8 ? Dtype::S32 : Dtype::U16;
  spec.compute = [esize, lane](KernelBuilder& b, const TileOperands& o) {
    const Reg& n = *o.count;
    vec_convert(b, Dtype::F16, Dtype::U8, o.temp[kHalf], o.in[0], RoundMode::kRint, n);
    b.emit(Opcode::op_set_mask_count, {n});
    b.emit(Opcode::op_vcmp,
           {Dtype::F16, isa::Cmp::NE, o.temp[kBits], o.temp[kHalf], o.temp[kZero], 0, 1, 1, 8, 0},
           "condition != 0");
    if (esize == 1) {
      vec_convert(b, Dtype::F16, Dtype::U8, o.temp[kT16], o.in[1], RoundMode::kRint, n);
      vec_convert(b, Dtype::F16, Dtype::U8, o.temp[kE16], o.in[2], RoundMode::kRint, n);
      b.emit(Opcode::op_set_mask_count, {n});
      b.emit(Opcode::op_vsel, {Dtype::F16, o.temp[kHalf], o.temp[kT16], o.temp[kE16], o.temp[kBits],
                               0, 1, 1, 1, 8, 8, 8});
      vec_convert(b, Dtype::U8, Dtype::F16, o.out, o.temp[kHalf], RoundMode::kRint, n);
      return;
    }
    b.emit(Opcode::op_set_mask_count, {n});
    b.emit(Opcode::op_vsel, {lane, o.out, o.in[1], o.in[2], o.temp[kBits], 0, 1, 1, 1, 8, 8, 8},
           "condition ? t : e");
  };
}

CompiledKernel compile_select_op(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 3)
    op.fail(fmt::format("takes 3 inputs (condition, t, e), {} given", op.inputs.size()));
  TensorDesc cond = op.inputs[0];
  const TensorDesc& t = op.inputs[1];
  const TensorDesc& e = op.inputs[2];
  if (cond.dtype != DataType::BOOL) op.fail(fmt::format("condition {} must be bool", cond.str()));
  const DataType dt = t.dtype;
  if (e.dtype != dt) op.fail(fmt::format("t {} and e {} differ in dtype", t.str(), e.str()));
  if (auto a = op.attr_type("T"); a && *a != dt)
    op.fail(fmt::format("attribute T = {} does not match the inputs' {}", data_type_name(*a),
                        data_type_name(dt)));
  std::vector<int64_t> shape;
  if (op.type == "Select") {
    if (t.shape != e.shape)
      op.invalid(fmt::format("t {} and e {} must have one shape", t.str(), e.str()));
    shape = t.shape;
    if (cond.shape.size() == 1 && shape.size() > 1 && cond.shape[0] == shape[0]) {
      cond.shape.resize(shape.size(), 1);  // a vector selects whole rows
    } else if (!cond.shape.empty() && cond.shape != shape) {
      op.invalid(
          fmt::format("condition {} must be a scalar, have t's shape {}, or be a vector of "
                      "t's first dim",
                      cond.str(), shape_str(shape)));
    }
  } else {
    auto te = broadcast_shapes(t.shape, e.shape);
    auto all = te ? broadcast_shapes(cond.shape, *te) : std::nullopt;
    if (!all)
      op.invalid(fmt::format("condition {}, t {} and e {} are not broadcast-compatible", cond.str(),
                             t.str(), e.str()));
    shape = *all;
  }
  const TensorDesc out{dt, shape};
  LaunchPlan plan({out});
  if (out.num_elements() == 0) return std::move(plan).finish();

  // The streaming kernel's view: 8-byte elements as s32 pairs (the condition gains a dim of 1).
  const int esize = data_type_bytes(dt);
  const TensorDesc out_l = lanes_view(out);
  if (esize == 8) cond.shape.push_back(1);
  std::vector<TensorDesc> ins = {cond, lanes_view(t), lanes_view(e)};
  std::vector<ArgRef> args = {LaunchPlan::input(0), LaunchPlan::input(1), LaunchPlan::input(2)};
  // Pre-expand the condition (and 1-byte operands) where broadcasting is needed.
  for (size_t i = 0; i < 3; ++i) {
    const bool one_byte = data_type_bytes(ins[i].dtype) == 1;
    if (!one_byte || broadcast_view(ins[i].shape, out_l.shape).identity()) continue;
    args[i] = append_broadcast_copy(plan, ctx, ins[i], out_l.shape, args[i]);
    ins[i].shape = out_l.shape;
  }
  StreamSpec spec;
  spec.kernel_name = fmt::format("{}_{}", op.type, data_type_name(dt));
  spec.inputs = stream_inputs(ins, out_l.shape);
  spec.out_type = device_dtype(out_l.dtype);
  spec.out_shape = out_l.shape;
  select_work(esize, spec);
  Launch l = build_stream_kernel(op.str(), spec, ctx.cfg);
  plan.add(std::move(l), {args[0], args[1], args[2], LaunchPlan::output(0)});
  return std::move(plan).finish();
}

CompiledKernel compile_clip(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 3)
    op.fail(fmt::format("takes 3 inputs (t, clip_value_min, clip_value_max), {} given",
                        op.inputs.size()));
  const DataType dt = op.inputs[0].dtype;
  for (size_t i = 1; i < 3; ++i)
    if (op.inputs[i].dtype != dt)
      op.fail(fmt::format("inputs have different dtypes ({} and {})", data_type_name(dt),
                          data_type_name(op.inputs[i].dtype)));
  if (auto a = op.attr_type("T"); a && *a != dt)
    op.fail(fmt::format("attribute T = {} does not match the inputs' {}", data_type_name(*a),
                        data_type_name(dt)));
  if (!data_type_is_float(dt) && dt != DataType::S32)
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16, s32)", data_type_name(dt)));
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  for (size_t i = 1; i < 3; ++i) {
    auto b = broadcast_shapes(op.inputs[i].shape, shape);
    if (!b || *b != shape)
      op.invalid(fmt::format("{} {} cannot be broadcast to t's shape {}",
                             i == 1 ? "clip_value_min" : "clip_value_max", op.inputs[i].str(),
                             shape_str(shape)));
  }
  const TensorDesc out{dt, shape};
  StreamSpec spec;
  spec.kernel_name = fmt::format("ClipByValue_{}", data_type_name(dt));
  spec.inputs = stream_inputs(op.inputs, shape);
  spec.out_type = device_dtype(dt);
  spec.out_shape = shape;
  // bf16 without bf16 arithmetic: in f32 (min and max are exact, so the same bits).
  const bool widen = widens_bf16(device_dtype(dt), ctx.cfg);
  const Dtype type = widen ? Dtype::F32 : device_dtype(dt);
  spec.compute = [type](KernelBuilder& b, const TileOperands& o) {
    vec_binary(b, Opcode::op_vmin, type, o.out, o.in[0], o.in[2], *o.count);
    vec_binary(b, Opcode::op_vmax, type, o.out, o.out, o.in[1], *o.count);
  };
  if (widen) widen_bf16_tile_work(spec, 3);
  return stream_kernel(ctx, out, spec);
}

}  // namespace

ArgRef append_broadcast_copy(LaunchPlan& plan, const CompileContext& ctx, const TensorDesc& in,
                             const std::vector<int64_t>& shape, ArgRef src) {
  const std::vector<int64_t> strides = contiguous_strides(in.shape);
  StridedView v;
  const size_t lead = shape.size() - in.shape.size();
  for (size_t d = 0; d < shape.size(); ++d) {
    v.dims.push_back(shape[d]);
    v.strides.push_back(d < lead || in.shape[d - lead] == 1 ? 0 : strides[d - lead]);
  }
  const TensorDesc out{in.dtype, shape};
  AssembleSpec spec = view_spec(fmt::format("Broadcast_{}", data_type_name(in.dtype)), in.dtype,
                                in.shape, shape, v);
  ArgRef ws = plan.workspace(out.bytes());
  plan.add(build_assemble_kernel(ctx.op.str(), spec, ctx.cfg), {src, ws},
           fmt::format("expand {} to {}", in.str(), shape_str(shape)));
  return ws;
}

bool select_tile_work(Dtype type, StreamSpec& spec) {
  const int esize = static_cast<int>(isa::dtype_size(type));
  if (!isa::dtype_is_float(type) || (esize != 2 && esize != 4)) return false;
  select_work(esize, spec);
  return true;
}

CompiledKernel compile_select(const CompileContext& ctx) {
  const std::string& t = ctx.op.type;
  if (t == "Select" || t == "SelectV2") return compile_select_op(ctx);
  if (t == "ClipByValue") return compile_clip(ctx);
  ctx.op.fail("internal: not a select op");
}

}  // namespace npusim::compiler::ops
