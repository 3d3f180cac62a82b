#include "adapter/compiler/ops/int64.h"

#include <algorithm>
#include <functional>
#include <limits>

#include <fmt/format.h>

#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/ops/compose.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

constexpr int64_t kLow32 = 0xffffffff;
constexpr int64_t kSign32 = 0x80000000;

// `count` items split over the vector cores: `per` items per block (a multiple of `multiple`,
// at least `min_per` unless fewer items exist), block_dim blocks.
struct ItemRange {
  int64_t per = 0;
  int block_dim = 0;
};

ItemRange item_range(int64_t count, const KernelBuilder& b, int64_t multiple = 1,
                     int64_t min_per = 1) {
  const int64_t cores = b.config().core_kind(b.vector_core_kind())->count;
  const int64_t spread = static_cast<int64_t>(ceil_div(count, cores));
  ItemRange r;
  r.per = std::max<int64_t>(
      1, static_cast<int64_t>(
             std::min(round_up(std::max(spread, min_per), multiple), round_up(count, multiple))));
  r.block_dim = static_cast<int>(ceil_div(count, r.per));
  return r;
}

}  // namespace

Launch build_widen_s32_to_s64(const std::string& op, int64_t n, const ChipConfig& cfg) {
  KernelBuilder b("Widen_s32_s64", op, cfg);
  const ItemRange pr = item_range(n, b, 2);
  b.begin_section(b.vector_core_kind());
  b.declare_arg("in0", Dtype::S32, {n});
  b.declare_arg("out", Dtype::S64, {n});
  Reg in = b.load_arg("in0"), out = b.load_arg("out");
  Reg k = b.reg("element"), end = b.reg("end of this block's range");
  emit_block_range(b, k, end, pr.per, n);
  Reg v = b.reg("two s32"), x = b.reg("one s64"), a = b.reg("address");
  auto widen = [&](const Reg& dst, const Reg& src) {  // dst = sign-extended low 32 bits of src
    b.and_(dst, src, kLow32);
    b.emit(Opcode::op_xor, {dst, dst, kSign32});
    b.sub(dst, dst, kSign32);
  };
  b.for_range(k, k, end, 2, [&] {
    b.mul_add(a, k, 4, in);
    b.emit(Opcode::op_ld, {v, a}, "elements k, k+1");
    b.mul_add(a, k, 8, out);
    widen(x, v);
    b.emit(Opcode::op_st, {x, a});
    Reg k1 = b.reg("k + 1");
    b.add(k1, k, 1);
    b.if_(lt(k1, end), [&] {
      b.shr(v, v, 32);
      widen(x, v);
      b.add(a, a, 8);
      b.emit(Opcode::op_st, {x, a});
    });
  });
  b.end();
  Launch l;
  l.block_dim = pr.block_dim;
  l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  l.summary = fmt::format("s32 -> s64: {} elements, {} blocks of {}", n, pr.block_dim, pr.per);
  l.kernel = b.finish();
  return l;
}

Launch build_narrow_s64_to_s32(const std::string& op, int64_t n, int64_t lo, int64_t hi,
                               const ChipConfig& cfg) {
  KernelBuilder b("Narrow_s64_s32", op, cfg);
  const ItemRange pr = item_range(n, b, 2);
  b.begin_section(b.vector_core_kind());
  b.declare_arg("in0", Dtype::S64, {n});
  b.declare_arg("out", Dtype::S32, {n});
  Reg in = b.load_arg("in0"), out = b.load_arg("out");
  Reg k = b.reg("element"), end = b.reg("end of this block's range");
  emit_block_range(b, k, end, pr.per, n);
  Reg v = b.reg("pair"), w = b.reg("second"), a = b.reg("address");
  Reg lo_r = b.reg_imm("lower clamp", lo), hi_r = b.reg_imm("upper clamp", hi);
  auto clamp = [&](const Reg& r) {
    b.max(r, r, lo_r);
    b.min(r, r, hi_r);
    b.and_(r, r, kLow32);
  };
  b.for_range(k, k, end, 2, [&] {
    b.mul_add(a, k, 8, in);
    b.emit(Opcode::op_ld, {v, a}, "element k");
    clamp(v);
    Reg k1 = b.reg("k + 1");
    b.add(k1, k, 1);
    b.if_(lt(k1, end), [&] {
      b.add(a, a, 8);
      b.emit(Opcode::op_ld, {w, a}, "element k + 1");
      clamp(w);
      b.shl(w, w, 32);
      b.emit(Opcode::op_or, {v, v, w});
    });
    b.mul_add(a, k, 4, out);
    b.emit(Opcode::op_st, {v, a}, "elements k, k+1 as s32");
  });
  b.end();
  Launch l;
  l.block_dim = pr.block_dim;
  l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  l.summary = fmt::format("s64 -> s32 clamped to [{}, {}]: {} elements, {} blocks of {}", lo, hi,
                          n, pr.block_dim, pr.per);
  l.kernel = b.finish();
  return l;
}

// ---- the scalar element-wise kernel ----

namespace {

const Opnd kZeroReg = Opnd::reg_number(0);

void if_else(KernelBuilder& b, const Cond& c, const std::function<void()>& then_body,
             const std::function<void()>& else_body) {
  Label other = b.label("else"), done = b.label("endif");
  b.branch_unless(c, other);
  then_body();
  b.jmp(done);
  b.bind(other);
  else_body();
  b.bind(done);
}

bool is_signed_int(DataType t) {
  return t == DataType::S32 || t == DataType::S16 || t == DataType::S8 || t == DataType::S64;
}

// v = the element of type t in the low bytes of v, extended to 64 bits (see ScalarMapFn).
void extend_value(KernelBuilder& b, const Reg& v, DataType t) {
  const int bits = 8 * data_type_bytes(t);
  if (bits == 64) return;
  b.and_(v, v, (int64_t{1} << bits) - 1);
  if (is_signed_int(t)) {
    const int64_t sign = int64_t{1} << (bits - 1);
    b.emit(Opcode::op_xor, {v, v, sign});
    b.sub(v, v, sign);
  }
}

}  // namespace

void emit_s64_to_f32_bits(KernelBuilder& b, const Reg& dst, const Reg& src) {
  KernelBuilder::Origin o(b, "s64 -> f32 (round to nearest even)");
  Reg sign = b.reg("sign bit"), a = b.reg("|x|"), p = b.reg("msb of |x|"), t = b.reg("t"),
      u = b.reg("u"), m = b.reg("significand"), sh = b.reg("shift");
  Label done = b.label("s64 to f32 done");
  b.movi(dst, 0);
  b.branch(eq(src, 0), done);
  b.movi(sign, 0);
  b.mov(a, src);
  b.if_(lt(src, 0), [&] {
    b.movi(sign, kSign32);
    b.emit(Opcode::op_sub, {a, kZeroReg, src}, "|x| (2^63 for INT64_MIN, shifted logically)");
  });
  b.movi(p, 0);
  b.mov(t, a);
  for (int s : {32, 16, 8, 4, 2, 1}) {
    b.shr(u, t, s);
    b.if_(ne(u, 0), [&] {
      b.mov(t, u);
      b.add(p, p, s);
    });
  }
  if_else(
      b, lt(p, 24),
      [&] {  // exact: shift the value up to bit 23
        b.movi(sh, 23);
        b.sub(sh, sh, p);
        b.shl(m, a, sh);
      },
      [&] {  // keep 24 bits, round the dropped ones to nearest even
        b.sub(sh, p, 23);
        b.shr(m, a, sh);
        b.shl(t, m, sh);
        b.sub(t, a, t, "dropped bits");
        b.shl(t, t, 1);
        b.and_(u, m, 1);
        b.add(t, t, u, "2 * dropped + odd: rounds up iff > 2^shift");
        b.movi(u, 1);
        b.shl(u, u, sh);
        b.if_(lt(u, t), [&] { b.add(m, m, 1); });
      });
  // A significand rounded up to 2^24 carries into the exponent.
  b.add(dst, p, 127);
  b.shl(dst, dst, 23);
  b.add(dst, dst, m);
  b.sub(dst, dst, int64_t{1} << 23);
  b.emit(Opcode::op_or, {dst, dst, sign});
  b.bind(done);
}

void emit_f32_bits_to_s64(KernelBuilder& b, const Reg& dst, const Reg& src) {
  KernelBuilder::Origin o(b, "f32 -> s64 (toward zero)");
  Reg e = b.reg("exponent"), m = b.reg("significand"), t = b.reg("t");
  b.shr(e, src, 23);
  b.and_(e, e, 0xff);
  b.movi(dst, 0);  // |x| < 1
  b.if_(ge(e, 127), [&] {
    if_else(
        b, ge(e, 127 + 63),
        [&] {  // |x| >= 2^63, infinities and NaN: saturated as the vector unit's vconv
          b.movi(dst, std::numeric_limits<int64_t>::max(), "saturated");
          b.and_(t, src, kSign32);
          b.if_(ne(t, 0), [&] { b.movi(dst, std::numeric_limits<int64_t>::min(), "saturated"); });
          b.and_(m, src, 0x7fffff);
          b.if_(eq(e, 0xff), [&] { b.if_(ne(m, 0), [&] { b.movi(dst, 0, "NaN"); }); });
        },
        [&] {
          b.and_(m, src, 0x7fffff);
          b.emit(Opcode::op_or, {m, m, 0x800000});
          if_else(
              b, ge(e, 150),
              [&] {
                b.sub(e, e, 150);
                b.shl(m, m, e);
              },
              [&] {
                b.movi(t, 150);
                b.sub(t, t, e);
                b.shr(m, m, t);
              });
          b.and_(t, src, kSign32);
          b.if_(ne(t, 0), [&] { b.emit(Opcode::op_sub, {m, kZeroReg, m}); });
          b.mov(dst, m);
        });
  });
}

Launch build_scalar_map(const std::string& op, const ScalarMapSpec& spec, const ChipConfig& cfg) {
  KernelBuilder b(spec.kernel_name, op, cfg);
  int64_t n = 1;
  for (int64_t d : spec.out_shape) n *= d;
  if (n < 1) b.fail("internal: scalar map of an empty output");
  const int osize = data_type_bytes(spec.out_type);
  const int64_t w = 8 / osize;  // elements per stored word
  const ItemRange range = item_range(n, b, w, kScalarMapMinPerBlock);
  const int64_t per = range.per;
  const int block_dim = range.block_dim;
  b.begin_section(b.vector_core_kind());
  std::vector<BroadcastView> views;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    const ScalarMapInput& in = spec.inputs[i];
    b.declare_arg(fmt::format("in{}", i), device_dtype(in.dtype), in.shape);
    views.push_back(in.load ? broadcast_view(in.shape, spec.out_shape) : BroadcastView{});
  }
  b.declare_arg("out", device_dtype(spec.out_type), spec.out_shape);
  std::vector<Reg> addr;
  for (size_t i = 0; i < spec.inputs.size(); ++i) addr.push_back(b.load_arg(fmt::format("in{}", i)));
  Reg out = b.load_arg("out");
  Reg k = b.reg("element"), end = b.reg("end of this block's range");
  emit_block_range(b, k, end, range.per, n);
  Reg word = b.reg("packed output word"), idx = b.reg("element index"), v = b.reg("result");
  Reg a = b.reg("address"), q = b.reg("index along a dim");
  std::vector<Reg> val;
  for (size_t i = 0; i < spec.inputs.size(); ++i) val.push_back(b.reg(fmt::format("in{} value", i)));
  b.for_range(k, k, end, w, [&] {
    if (w > 1) b.movi(word, 0);
    for (int64_t j = 0; j < w; ++j) {
      KernelBuilder::Origin o(b, fmt::format("element k + {}", j));
      b.add(idx, k, j);
      b.min(idx, idx, n - 1, "past the end: recompute the last element (written as padding)");
      for (size_t i = 0; i < spec.inputs.size(); ++i) {
        if (!spec.inputs[i].load) {
          b.mov(val[i], addr[i], "base address (the compute step loads)");
          continue;
        }
        const BroadcastView& view = views[i];
        const int size = data_type_bytes(spec.inputs[i].dtype);
        if (view.splat()) {
          b.mov(a, addr[i]);
        } else if (view.identity()) {
          b.mul_add(a, idx, size, addr[i]);
        } else {
          b.mov(a, addr[i]);
          int64_t inner = 1;
          for (size_t d = view.dims.size(); d-- > 0;) {
            if (view.strides[d] != 0) {
              if (inner == 1) b.mov(q, idx); else b.div(q, idx, inner);
              if (d > 0) b.rem(q, q, view.dims[d]);
              b.mul(q, q, view.strides[d] * size);
              b.add(a, a, q);
            }
            inner *= view.dims[d];
          }
        }
        b.emit(Opcode::op_ld, {val[i], a}, fmt::format("in{}", i));
        extend_value(b, val[i], spec.inputs[i].dtype);
      }
      spec.compute(b, v, val, idx);
      if (w == 1) {
        b.mul_add(a, k, 8, out);
        b.emit(Opcode::op_st, {v, a});
      } else {
        b.and_(v, v, (int64_t{1} << (8 * osize)) - 1);
        if (j > 0) b.shl(v, v, 8 * osize * j);
        b.emit(Opcode::op_or, {word, word, v});
      }
    }
    if (w > 1) {
      b.mul_add(a, k, osize, out);
      b.emit(Opcode::op_st, {word, a}, "store the packed word");
    }
  });
  b.end();
  Launch l;
  l.block_dim = block_dim;
  for (size_t i = 0; i < spec.inputs.size(); ++i)
    l.args.push_back(ArgRef{ArgRef::Kind::kInput, static_cast<int>(i), 0});
  l.args.push_back(ArgRef{ArgRef::Kind::kOutput, 0, 0});
  l.summary = fmt::format("scalar unit: {} elements, {} blocks of {}", n, block_dim, per);
  l.kernel = b.finish();
  return l;
}

// ---- s64 ops ----

namespace {

CompiledKernel one_launch(const CompileContext& ctx, const TensorDesc& out,
                          const ScalarMapSpec& spec) {
  CompiledKernel k;
  k.outputs = {out};
  if (out.num_elements() > 0) k.launches.push_back(build_scalar_map(ctx.op.str(), spec, ctx.cfg));
  return k;
}

// dst = cond ? 1 : 0
void set_if(KernelBuilder& b, const Reg& dst, const Cond& c) {
  b.movi(dst, 0);
  b.if_(c, [&] { b.movi(dst, 1); });
}

}  // namespace

CompiledKernel compile_s64_binary(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const std::string t = op.type;
  auto shape = broadcast_shapes(op.inputs[0].shape, op.inputs[1].shape);
  if (!shape)
    op.invalid(fmt::format("shapes {} and {} are not broadcast-compatible",
                           shape_str(op.inputs[0].shape), shape_str(op.inputs[1].shape)));
  const bool compare = t == "Equal" || t == "NotEqual" || t == "Less" || t == "LessEqual" ||
                       t == "Greater" || t == "GreaterEqual";
  ScalarMapFn fn;
  if (t == "AddV2" || t == "Add")
    fn = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) { b.add(d, in[0], in[1]); };
  else if (t == "Sub")
    fn = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) { b.sub(d, in[0], in[1]); };
  else if (t == "Mul")
    fn = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) { b.mul(d, in[0], in[1]); };
  else if (t == "Maximum")
    fn = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) { b.max(d, in[0], in[1]); };
  else if (t == "Minimum")
    fn = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) { b.min(d, in[0], in[1]); };
  else if (t == "SquaredDifference")
    fn = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) {
      b.sub(d, in[0], in[1]);
      b.mul(d, d, d);
    };
  else if (t == "Equal")
    fn = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) { set_if(b, d, eq(in[0], in[1])); };
  else if (t == "NotEqual")
    fn = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) { set_if(b, d, ne(in[0], in[1])); };
  else if (t == "Less")
    fn = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) { set_if(b, d, lt(in[0], in[1])); };
  else if (t == "LessEqual")
    fn = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) { set_if(b, d, ge(in[1], in[0])); };
  else if (t == "Greater")
    fn = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) { set_if(b, d, lt(in[1], in[0])); };
  else if (t == "GreaterEqual")
    fn = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) { set_if(b, d, ge(in[0], in[1])); };
  else
    op.fail("dtype s64 is not supported (s64: AddV2, Add, Sub, Mul, Maximum, Minimum, "
            "SquaredDifference and the comparisons)");
  const DataType dt = op.inputs[0].dtype;
  if (dt == DataType::BOOL && t != "Equal" && t != "NotEqual")
    op.fail("dtype bool is not supported (bool: Equal, NotEqual, LogicalAnd, LogicalOr)");
  ScalarMapSpec spec;
  spec.kernel_name = fmt::format("{}_{}", t, data_type_name(dt));
  spec.inputs = {{dt, op.inputs[0].shape}, {dt, op.inputs[1].shape}};
  spec.out_type = compare ? DataType::BOOL : DataType::S64;
  spec.out_shape = *shape;
  spec.compute = fn;
  return one_launch(ctx, TensorDesc{spec.out_type, *shape}, spec);
}

CompiledKernel compile_s64_floor(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const std::string& t = op.type;
  if (t != "FloorMod" && t != "FloorDiv") op.fail("internal: not FloorMod / FloorDiv");
  if (op.inputs.size() != 2) op.fail("expects two inputs");
  for (const TensorDesc& in : op.inputs)
    if (in.dtype != DataType::S64)
      op.fail(fmt::format("dtype {} is not supported (s64 only; int32 stays on TensorFlow's "
                          "host kernels)", data_type_name(in.dtype)));
  auto shape = broadcast_shapes(op.inputs[0].shape, op.inputs[1].shape);
  if (!shape)
    op.invalid(fmt::format("shapes {} and {} are not broadcast-compatible",
                           shape_str(op.inputs[0].shape), shape_str(op.inputs[1].shape)));
  ScalarMapSpec spec;
  spec.kernel_name = fmt::format("{}_s64", t);
  spec.inputs = {{DataType::S64, op.inputs[0].shape}, {DataType::S64, op.inputs[1].shape}};
  spec.out_type = DataType::S64;
  spec.out_shape = *shape;
  const bool mod = t == "FloorMod";
  // r = x rem y (truncating); r != 0 with a sign other than y's means the truncated quotient
  // is one above the floor: FloorMod = r + y, FloorDiv = x / y - 1 (TF's floor_mod /
  // floor_div for signed integers). y == 0 faults on the scalar unit ("division by zero").
  spec.compute = [mod](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) {
    Reg r = b.reg("truncated remainder"), s = b.reg("r ^ y: sign differs when negative");
    b.rem(r, in[0], in[1]);
    if (mod) b.mov(d, r);
    else b.div(d, in[0], in[1]);
    b.emit(Opcode::op_xor, {s, r, in[1]});
    b.if_(lt(s, 0), [&] {
      b.if_(ne(r, 0), [&] {
        if (mod) b.add(d, d, in[1]);
        else b.sub(d, d, 1);
      });
    });
  };
  return one_launch(ctx, TensorDesc{DataType::S64, *shape}, spec);
}

CompiledKernel compile_s64_cast(const CompileContext& ctx, DataType src, DataType dst) {
  const OpDesc& op = ctx.op;
  const std::vector<int64_t>& shape = op.inputs[0].shape;
  const TensorDesc out{dst, shape};
  auto half = [](DataType t) { return t == DataType::F16 || t == DataType::BF16; };
  if (half(src) || half(dst)) {
    // Through f32 (TF casts int64 <-> half / bfloat16 through float too: Eigen's constructors).
    LaunchPlan plan({out});
    if (out.num_elements() == 0) return std::move(plan).finish();
    const TensorDesc mid{DataType::F32, shape};
    ArgRef ws = plan.workspace(mid.bytes());
    OpDesc vec = op;
    vec.outputs.clear();
    vec.attrs = {{"SrcT", std::string(data_type_name(half(src) ? src : DataType::F32))},
                 {"DstT", std::string(data_type_name(half(src) ? DataType::F32 : dst))}};
    if (half(src)) {
      vec.inputs = {op.inputs[0]};
      plan.add(compile(vec, ctx.cfg, ctx.precision), {LaunchPlan::input(0)}, {ws}, "to f32");
      OpDesc rest = op;
      rest.inputs = {mid};
      rest.attrs = {{"SrcT", std::string("f32")}, {"DstT", std::string("s64")}};
      plan.add(compile(rest, ctx.cfg, ctx.precision), {ws}, {LaunchPlan::output(0)});
    } else {
      OpDesc first = op;
      first.attrs = {{"SrcT", std::string("s64")}, {"DstT", std::string("f32")}};
      plan.add(compile(first, ctx.cfg, ctx.precision), {LaunchPlan::input(0)}, {ws});
      vec.inputs = {mid};
      plan.add(compile(vec, ctx.cfg, ctx.precision), {ws}, {LaunchPlan::output(0)}, "from f32");
    }
    return std::move(plan).finish();
  }
  ScalarMapSpec spec;
  spec.kernel_name = fmt::format("Cast_{}_{}", data_type_name(src), data_type_name(dst));
  spec.inputs = {{src, shape}};
  spec.out_type = dst;
  spec.out_shape = shape;
  if (src == DataType::S64 && dst == DataType::F32) {
    spec.compute = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) {
      emit_s64_to_f32_bits(b, d, in[0]);
    };
  } else if (src == DataType::F32) {
    spec.compute = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) {
      emit_f32_bits_to_s64(b, d, in[0]);
    };
  } else if (dst == DataType::BOOL) {
    spec.compute = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) {
      set_if(b, d, ne(in[0], 0));
    };
  } else {  // integer <-> integer, bool -> s64: the value, wrapped to the output's width
    spec.compute = [](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in, const Reg&) {
      b.mov(d, in[0]);
    };
  }
  return one_launch(ctx, out, spec);
}

CompiledKernel s64_range(const CompileContext& ctx, int64_t start, int64_t delta, int64_t n) {
  ScalarMapSpec spec;
  spec.kernel_name = "Range_s64";
  spec.out_type = DataType::S64;
  spec.out_shape = {n};
  spec.compute = [start, delta](KernelBuilder& b, const Reg& d, const std::vector<Reg>&,
                                const Reg& index) {
    b.mul(d, index, delta);
    b.add(d, d, start);
  };
  return one_launch(ctx, TensorDesc{DataType::S64, {n}}, spec);
}

void append_scalar_reduce(LaunchPlan& plan, const CompileContext& ctx, const std::string& kind,
                          const TensorDesc& input, const std::vector<bool>& reduced,
                          ArgRef in, ArgRef out) {
  const OpDesc& op = ctx.op;
  const DataType dt = input.dtype;
  const std::vector<int64_t>& shape = input.shape;
  int64_t n_out = 1, n_red = 1;
  for (size_t i = 0; i < shape.size(); ++i) (reduced[i] ? n_red : n_out) *= shape[i];
  if (n_out == 0) return;
  if (n_red == 0 && kind == "Mean")
    op.fail(fmt::format("integer Mean over an empty axis divides by zero (TF fails too)"));
  // [size, element stride, reduced] with size-1 dims dropped and neighbours merged.
  struct Dim {
    int64_t size, stride;
    bool reduced;
  };
  std::vector<Dim> dims;
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1) {
      if (!dims.empty() && dims.back().reduced == reduced[i] &&
          dims.back().stride * dims.back().size == stride)
        dims.back().size *= shape[i];
      else
        dims.push_back({shape[i], stride, reduced[i]});
    }
    stride *= shape[i];
  }
  std::reverse(dims.begin(), dims.end());  // outer to inner
  std::vector<Dim> kept, red;
  for (const Dim& d : dims) (d.reduced ? red : kept).push_back(d);
  const int esize = data_type_bytes(dt);
  ScalarMapSpec spec;
  spec.kernel_name = fmt::format("{}_{}_scalar", kind, data_type_name(dt));
  spec.inputs = {ScalarMapInput{dt, shape, false}};
  spec.out_type = dt;
  spec.out_shape = {n_out};
  spec.compute = [=](KernelBuilder& b, const Reg& d, const std::vector<Reg>& in_regs,
                     const Reg& index) {
    Reg base = b.reg("the output's first input element"), q = b.reg("coordinate");
    b.mov(base, in_regs[0]);
    int64_t inner = 1;
    for (size_t k = kept.size(); k-- > 0;) {
      if (inner == 1) b.mov(q, index); else b.div(q, index, inner);
      if (k > 0) b.rem(q, q, kept[k].size);
      b.mul(q, q, kept[k].stride * esize);
      b.add(base, base, q);
      inner *= kept[k].size;
    }
    const int64_t identity = kind == "Prod"  ? 1
                             : kind == "Max" ? std::numeric_limits<int64_t>::min()
                             : kind == "Min" ? std::numeric_limits<int64_t>::max()
                                             : 0;
    b.movi(d, identity);
    Reg v = b.reg("element");
    std::function<void(size_t, const Reg&)> loop = [&](size_t level, const Reg& addr) {
      if (level == red.size()) {
        b.emit(Opcode::op_ld, {v, addr});
        extend_value(b, v, dt);
        if (kind == "Prod") b.mul(d, d, v);
        else if (kind == "Max") b.max(d, d, v);
        else if (kind == "Min") b.min(d, d, v);
        else b.add(d, d, v);
        return;
      }
      Reg i = b.reg("reduced coordinate"), a = b.reg("reduced address");
      b.mov(a, addr);
      b.for_range(i, 0, red[level].size, 1, [&] {
        loop(level + 1, a);
        b.add(a, a, red[level].stride * esize);
      });
    };
    if (n_red > 0) loop(0, base);
    if (kind == "Mean") b.div(d, d, n_red, "TF: int64 sum / count, truncated");
  };
  plan.add(build_scalar_map(op.str(), spec, ctx.cfg), {in, out},
           fmt::format("{} of {} elements each", kind, n_red));
}

Launch build_s64_cumsum(const std::string& op, int64_t outer, int64_t n, int64_t inner,
                        bool exclusive, bool reverse, const ChipConfig& cfg) {
  KernelBuilder b("Cumsum_s64", op, cfg);
  const int64_t cols = outer * inner;
  const ItemRange r = item_range(cols, b);
  b.begin_section(b.vector_core_kind());
  b.declare_arg("in0", Dtype::S64, {outer, n, inner});
  b.declare_arg("out", Dtype::S64, {outer, n, inner});
  Reg x = b.load_arg("in0"), out = b.load_arg("out");
  Reg c = b.reg("column"), end = b.reg("end of this block's columns");
  emit_block_range(b, c, end, r.per, cols);
  Reg ax = b.reg("x address"), ao = b.reg("out address"), t = b.reg("t"), k = b.reg("step");
  Reg acc = b.reg("running sum"), v = b.reg("element");
  const int64_t step = inner * 8;
  b.for_range(c, c, end, 1, [&] {
    b.div(t, c, inner);
    b.mul(t, t, (n - 1) * inner, "column (o, i) starts at o * n * inner + i");
    b.add(t, t, c);
    b.mul(t, t, 8);
    if (reverse) b.add(t, t, (n - 1) * step, "reverse: from the last element");
    b.add(ax, x, t);
    b.add(ao, out, t);
    b.movi(acc, 0);
    b.for_range(k, 0, n, 1, [&] {
      b.emit(Opcode::op_ld, {v, ax});
      if (exclusive) b.emit(Opcode::op_st, {acc, ao}, "exclusive: the sum before");
      b.add(acc, acc, v);
      if (!exclusive) b.emit(Opcode::op_st, {acc, ao});
      if (reverse) {
        b.sub(ax, ax, step);
        b.sub(ao, ao, step);
      } else {
        b.add(ax, ax, step);
        b.add(ao, ao, step);
      }
    });
  });
  b.end();
  Launch l;
  l.block_dim = r.block_dim;
  l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  l.summary = fmt::format("s64 scan on the scalar unit: {} columns of {}, {} blocks of {}", cols,
                          n, r.block_dim, r.per);
  l.kernel = b.finish();
  return l;
}

Launch build_s64_segment_sum(const std::string& op, int64_t rows, int64_t inner,
                             int64_t segments, DataType id_type, const ChipConfig& cfg) {
  KernelBuilder b("UnsortedSegmentSum_s64", op, cfg);
  const ItemRange r = item_range(inner, b);
  b.begin_section(b.vector_core_kind());
  b.declare_arg("in0", Dtype::S64, {rows, inner});
  b.declare_arg("in1", device_dtype(id_type), {rows});
  b.declare_arg("out", Dtype::S64, {segments, inner});
  Reg data = b.load_arg("in0"), ids = b.load_arg("in1"), out = b.load_arg("out");
  Reg j0 = b.reg("first column"), j1 = b.reg("end of this block's columns");
  emit_block_range(b, j0, j1, r.per, inner);
  Reg i = b.reg("row / segment"), j = b.reg("column"), a = b.reg("address"), t = b.reg("t");
  Reg id = b.reg("segment id"), v = b.reg("value"), w = b.reg("sum");
  {
    KernelBuilder::Origin o(b, "zero this block's columns of every segment");
    b.for_range(i, 0, segments, 1, [&] {
      b.for_range(j, j0, j1, 1, [&] {
        b.mul_add(a, i, inner, j);
        b.mul_add(a, a, 8, out);
        b.emit(Opcode::op_st, {Opnd::reg_number(0), a});
      });
    });
  }
  KernelBuilder::Origin o(b, "add every row into its segment");
  const int isize = data_type_bytes(id_type);
  b.for_range(i, 0, rows, 1, [&] {
    b.mul_add(a, i, isize, ids);
    b.emit(Opcode::op_ld, {id, a}, "segment id");
    extend_value(b, id, id_type);
    b.if_(ge(id, 0), [&] {
      b.if_(lt(id, segments), [&] {
        b.for_range(j, j0, j1, 1, [&] {
          b.mul_add(a, i, inner, j);
          b.mul_add(a, a, 8, data);
          b.emit(Opcode::op_ld, {v, a});
          b.mul_add(t, id, inner, j);
          b.mul_add(t, t, 8, out);
          b.emit(Opcode::op_ld, {w, t});
          b.add(w, w, v);
          b.emit(Opcode::op_st, {w, t});
        });
      });
    });
  });
  b.end();
  Launch l;
  l.block_dim = r.block_dim;
  l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kInput, 1, 0},
            ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  l.summary = fmt::format("s64 segment sum on the scalar unit: {} rows of {} into {} segments, "
                          "{} blocks of {} columns",
                          rows, inner, segments, r.block_dim, r.per);
  l.kernel = b.finish();
  return l;
}

}  // namespace npusim::compiler::ops
