// Cast (TF attrs SrcT, DstT, Truncate) between f32, f16, bf16, s32, and to/from bool, as one
// vconv per tile with TF's rounding:
//   float -> float    round to nearest even (Truncate=true: toward zero)
//   float -> integer  toward zero (C++ static_cast, as TF); values outside the integer range
//                     and infinities saturate, NaN gives 0 (the vector unit's vconv, and the
//                     scalar unit's s64 conversion likewise), where TF's result is undefined
//                     behaviour (x86 gives INT_MIN / INT64_MIN; docs/tf_plugin.md)
//   integer -> float  round to nearest even, once (TF's s32 -> f16 goes through f32 and may
//                     round twice: it differs for |x| > 2048 in rare ties)
//   bool -> any       0 / 1 (bool bytes are u8; to s8 / u8 a byte copy)
//   any -> bool       x != 0: vcmp against zero, then 1 / 0 bytes
// Same type: a copy. Integer -> narrower integer is rejected: TF wraps, the vector unit
// saturates. S64 (either side) runs on the scalar unit (ops/int64.h): s64 -> narrower integers
// wrap and s64 -> bool is x != 0 (as TF); s64 <-> f32 by integer arithmetic (round to nearest
// even / toward zero, saturating as above); s64 <-> f16 / bf16
// through f32, as TF (Eigen converts int64 to half through float).
//
// MultiTensorCast (the TF plugin's op, graph_fusion.h rewrite 19: the float16 copies of the
// weights that allow_mix_precision's Casts make at a step's start): N tensors of one float type
// SrcT to float type DstT (Truncate as Cast's), output i the cast of input i, each element
// converted by Cast's own tile work (cast_spec), so bit for bit the Casts' outputs; the tensors
// are the segments of multi-tensor streams (multi_tensor_launches), a few launches for all.
// Members named by attribute filter_n16 (graph rewrite 19b: filters forward convolutions read)
// are written in the convolutions' kFilterLayoutN16 (ops/conv.h) by the cast's own store: each
// tile whole (kh, kw, ci) rows of Cout elements, stored one copy per 16-column block into its
// place (StreamSpec::blocked_row), no launch of their own. A member whose row does not fit a
// tile (a chip of small UB) is cast as HWIO into the workspace instead, then transposed by a
// launch of its own (ops/transpose.h) into the output.
#include <fmt/format.h>

#include "adapter/compiler/ops/cast.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/int64.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/transpose.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

bool castable(DataType t) {
  return data_type_is_float(t) || t == DataType::S32 || t == DataType::BOOL ||
         t == DataType::S16 || t == DataType::S8 || t == DataType::U8 || t == DataType::U16;
}

enum CastToBoolTemp { kBits, kHalf, kOnes, kZeros, kZeroIn };
constexpr uint64_t kRepeat = vec::kRepeatBytes;  // one vector repeat of constants

}  // namespace

// A stream spec converting `src` elements to `dst` (no checks beyond the vector unit's).
StreamSpec cast_spec(DataType src, DataType dst, bool truncate, const std::vector<int64_t>& shape) {
  StreamSpec spec;
  spec.kernel_name = fmt::format("Cast_{}_{}", data_type_name(src), data_type_name(dst));
  spec.inputs = {StreamInput{device_dtype(src), broadcast_view(shape, shape), shape}};
  spec.out_type = device_dtype(dst);
  spec.out_shape = shape;
  const Dtype s = device_dtype(src), d = device_dtype(dst);
  // Same type, or bool -> s8 / u8: the bytes as they are (bool bytes are 0 / 1, the s8 / u8
  // values TF gives; a vconv between two 8-bit types is refused by the vector unit).
  if (src == dst || (src == DataType::BOOL && data_type_bytes(dst) == 1)) {
    spec.compute = [size = data_type_bytes(src)](KernelBuilder& b, const TileOperands& t) {
      vec_copy_bits(b, size, t.out, t.in[0], *t.count);
    };
  } else if (dst == DataType::BOOL) {
    // x != 0 -> 1 / 0. vcmp needs a 16- or 32-bit type; an 8-bit source is widened first, a
    // bf16 one to f32 (exactly; the presets' vector units compare no bf16: vector.bf16_arithmetic).
    const Dtype cmp_type = isa::dtype_size(s) == 1 ? Dtype::F16 : s == Dtype::BF16 ? Dtype::F32 : s;
    const double widened_bytes = cmp_type == s ? 2 : isa::dtype_size(cmp_type);
    spec.temps = {TempSpec{"bits", 1.0 / 8, 32}, TempSpec{"widened values, then f16", widened_bytes, 0},
                  TempSpec{"f16 ones", 0, kRepeat}, TempSpec{"f16 zeros", 0, kRepeat},
                  TempSpec{"zero of the source type", 0, kRepeat}};
    spec.prologue = [cmp_type](KernelBuilder& b, const std::vector<uint64_t>& temp) {
      Reg bits = b.reg("constant");
      Reg count = b.reg_imm("constant lanes", 128);
      b.emit(Opcode::op_set_mask_count, {count});
      b.movi(bits, vector_scalar_bits(Dtype::F16, 1.0));
      b.emit(Opcode::op_vdup, {Dtype::F16, temp[kOnes], bits, 0, 1, 8}, "f16 ones");
      b.movi(bits, 0);
      b.emit(Opcode::op_vdup, {Dtype::F16, temp[kZeros], bits, 0, 1, 8}, "f16 zeros");
      b.emit(Opcode::op_vdup, {cmp_type, temp[kZeroIn], bits, 0, 1, 8}, "source-type zeros");
    };
    spec.compute = [s, cmp_type](KernelBuilder& b, const TileOperands& t) {
      const Reg& count = *t.count;
      uint64_t x = t.in[0];
      if (cmp_type != s) {
        vec_convert(b, cmp_type, s, t.temp[kHalf], x, RoundMode::kRint, count);
        x = t.temp[kHalf];
      }
      b.emit(Opcode::op_set_mask_count, {count});
      b.emit(Opcode::op_vcmp, {cmp_type, isa::Cmp::NE, t.temp[kBits], x, t.temp[kZeroIn], 0, 1,
                               1, 8, 0},
             "x != 0");
      b.emit(Opcode::op_vsel, {Dtype::F16, t.temp[kHalf], t.temp[kOnes], t.temp[kZeros],
                               t.temp[kBits], 0, 1, 1, 1, 8, 0, 0});
      vec_convert(b, Dtype::U8, Dtype::F16, t.out, t.temp[kHalf], RoundMode::kRint, count);
    };
  } else {
    RoundMode round = RoundMode::kRint;
    if (data_type_is_float(src) && !data_type_is_float(dst)) round = RoundMode::kTrunc;
    if (data_type_is_float(src) && data_type_is_float(dst) && truncate) round = RoundMode::kTrunc;
    spec.compute = [s, d, round](KernelBuilder& b, const TileOperands& t) {
      vec_convert(b, d, s, t.out, t.in[0], round, *t.count);
    };
  }
  return spec;
}

CompiledKernel compile_cast(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 1) op.fail(fmt::format("takes 1 input, {} given", op.inputs.size()));
  const DataType src = op.inputs[0].dtype;
  auto src_attr = op.attr_type("SrcT");
  auto dst_attr = op.attr_type("DstT");
  if (!dst_attr) op.fail("attribute DstT is missing");
  if (src_attr && *src_attr != src)
    op.fail(fmt::format("attribute SrcT = {} does not match the input's {}",
                        data_type_name(*src_attr), data_type_name(src)));
  const DataType dst = *dst_attr;
  if ((src == DataType::S64) != (dst == DataType::S64)) return compile_s64_cast(ctx, src, dst);
  if (src == DataType::S64) return compile_s64_cast(ctx, src, DataType::S64);
  for (DataType t : {src, dst})
    if (!castable(t))
      op.fail(fmt::format("cast {} -> {}: {} is not supported", data_type_name(src),
                          data_type_name(dst), data_type_name(t)));
  const bool src_int = !data_type_is_float(src) && src != DataType::BOOL;
  const bool dst_int = !data_type_is_float(dst) && dst != DataType::BOOL;
  if (src_int && dst_int && src != dst && data_type_bytes(dst) <= data_type_bytes(src))
    op.fail(fmt::format("cast {} -> {}: TF wraps out-of-range integers, the vector unit "
                        "saturates; not supported",
                        data_type_name(src), data_type_name(dst)));
  const TensorDesc out{dst, op.inputs[0].shape};
  return stream_kernel(ctx, out, cast_spec(src, dst, op.attr_bool("Truncate", false), out.shape));
}

CompiledKernel compile_multi_tensor_cast(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const int64_t n = op.attr_int("N", static_cast<int64_t>(op.inputs.size()));
  if (op.inputs.empty() || n != static_cast<int64_t>(op.inputs.size()))
    op.invalid(fmt::format("attribute N = {} must count the {} inputs (at least 1)", n,
                           op.inputs.size()));
  const auto src_attr = op.attr_type("SrcT");
  const auto dst_attr = op.attr_type("DstT");
  if (!src_attr || !dst_attr) op.invalid("attributes SrcT and DstT are required");
  const DataType src = *src_attr, dst = *dst_attr;
  if (!data_type_is_float(src) || !data_type_is_float(dst))
    op.fail(fmt::format("cast {} -> {}: only between float types", data_type_name(src),
                        data_type_name(dst)));
  const bool truncate = op.attr_bool("Truncate", false);
  // Members written in kFilterLayoutN16 (attribute filter_n16: their indices): stored blocked
  // by the cast's tiles where a tile holds a row of Cout (blocked_row), else (n16_transposed)
  // cast into a workspace slice as HWIO, then [KH * KW * Cin][Cout / 16][16] -> [Cout / 16]
  // [KH * KW * Cin][16] by a transpose of whole 32-byte rows into the output.
  std::vector<bool> n16(op.inputs.size(), false), n16_transposed(op.inputs.size(), false);
  for (int64_t m : op.attr_ints("filter_n16")) {
    if (m < 0 || m >= n)
      op.invalid(fmt::format("attribute filter_n16 names member {} of {}", m, n));
    const std::vector<int64_t>& shape = op.inputs[static_cast<size_t>(m)].shape;
    if (shape.size() != 4 || data_type_bytes(dst) != 2)
      op.invalid(fmt::format(
          "member {} ({} {} -> {}) cannot be written in {}: it needs a rank-4 HWIO filter "
          "cast to a 16-bit type",
          m, data_type_name(src), shape_str(shape), data_type_name(dst), kFilterLayoutN16));
    // (output channels not a multiple of 16: the layout is HWIO itself, conv.h)
    n16[static_cast<size_t>(m)] = shape[3] % 16 == 0;
  }
  std::vector<TensorDesc> outputs;
  std::vector<MultiTensorSegment> segments;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    const TensorDesc& in = op.inputs[i];
    if (in.dtype != src)
      op.invalid(fmt::format("input {} is {}, attribute SrcT {}", i, data_type_name(in.dtype),
                             data_type_name(src)));
    const TensorDesc out{dst, in.shape};
    outputs.push_back(out);
    if (out.num_elements() == 0) continue;
    StreamSpec spec = cast_spec(src, dst, truncate, in.shape);
    if (n16[i]) {
      if (in.shape[3] <= stream_tile_capacity(spec, ctx.cfg))
        spec.blocked_row = in.shape[3];
      else
        n16_transposed[i] = true;
    }
    segments.push_back(MultiTensorSegment{std::move(spec), i, in.bytes() + out.bytes()});
  }
  const std::vector<Launch> casts = multi_tensor_launches(
      op.str(), segments, 1, 1, [](size_t i, size_t) { return static_cast<int>(i); },
      [](size_t i, size_t) { return static_cast<int>(i); }, ctx.cfg);
  LaunchPlan plan(outputs);
  std::vector<ArgRef> hwio(op.inputs.size());
  for (size_t i = 0; i < op.inputs.size(); ++i)
    hwio[i] = n16_transposed[i] ? plan.workspace(outputs[i].bytes())
                                : LaunchPlan::output(static_cast<int>(i));
  for (const Launch& l : casts) {
    std::vector<ArgRef> args = l.args;
    for (ArgRef& a : args)
      if (a.kind == ArgRef::Kind::kOutput) a = hwio[static_cast<size_t>(a.index)];
    plan.add(l, args);
  }
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    if (!n16_transposed[i]) continue;
    const std::vector<int64_t>& f = outputs[i].shape;
    append_transpose(plan, op.str(), ctx.cfg, dst, {f[0] * f[1] * f[2], f[3] / 16, 16}, {1, 0, 2},
                     hwio[i], LaunchPlan::output(static_cast<int>(i)));
  }
  return std::move(plan).finish();
}

}  // namespace npusim::compiler::ops
