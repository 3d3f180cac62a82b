// Element-wise binary ops with numpy/TF broadcasting: AddV2, Add, Sub, Mul, RealDiv, Maximum,
// Minimum, SquaredDifference, DivNoNan, Pow, ReciprocalGrad, SqrtGrad, RsqrtGrad, LogicalAnd,
// LogicalOr (bool), BitwiseAnd, BitwiseOr (int32, int16, uint16), and the comparisons Equal,
// NotEqual, Less, LessEqual, Greater, GreaterEqual (bool output). Streamed by ops/elementwise
// (tiling, broadcasting, double buffering, core split); this file only says which vector
// instructions compute a tile.
//
// Numerics (vector_ops.h): f16/bf16 are computed in fp32 and rounded once per instruction, as
// TF's CPU kernels do for Eigen::half/bfloat16, so Add/Sub/Mul/RealDiv/Maximum/Minimum match TF
// bit for bit; SquaredDifference rounds the difference, then the square (as TF's half kernel).
// s32 wraps on overflow (as TF). s64 inputs (the arithmetic ops and comparisons, not the
// divisions or Pow) run on the scalar unit, wrapping as TF (ops/int64.h); so do Equal /
// NotEqual of bool inputs. Maximum/Minimum propagate NaN (TF >= 2.x on CPU).
// DivNoNan: x / y, then 0 where y == 0 (also for x NaN, as TF); bit-exact with TF.
// Pow (float): f16/bf16 widened to f32; exp(y * log|x|), negated for a negative base with an
// odd integer exponent, NaN for a negative base with a non-integer one, then 1 where y == 0 or
// x == 1 (TF / C pow special cases). x = 0 gives 0 (y > 0) / inf (y < 0), x = inf gives inf / 0,
// both as pow. Relative error grows with |y * log(x)|: about (2 + |y log x|) f32 ulp (the
// rounding of y * log(x) is amplified by exp); f16/bf16 are within 1 ulp. Differs from TF:
// x = -0 is treated as +0 (pow(-0, -1) gives +inf, TF -inf); a negative base with |y| >= 2^31
// gives NaN (TF: |x|^y, such y being even); s32 Pow is not supported.
// ReciprocalGrad (y = 1/x, dy): -(y * y) * dy; SqrtGrad (y = sqrt(x), dy): (0.5 / y) * dy as
// 1/y then * 0.5 (exact scaling: the same rounding as 0.5 / y above the subnormals); both 0
// where dy == 0 (also for y = 0 / inf / NaN). TF's CPU kernels vectorise the same formulas
// (Eigen packets, mul_no_nan(factor, dy)); their scalar tails compute -y * y * dy and
// (0.5 * dy) / y instead, which can differ by an ulp. Each step rounds to the type.
// RsqrtGrad (y = rsqrt(x), dy; Keras' unfused BatchNormalization): (-0.5 * (y * y)) * (y * dy),
// 0 where dy == 0, the order of TF's packets (mul_no_nan(-0.5 * (y * y), mul_no_nan(y, dy)));
// its scalar tail, -0.5 * (dy * y) * (y * y), rounds the same two products, and the scaling by
// -0.5 is exact, so f32 and f16 match TF bit for bit (bf16 without bf16 arithmetic rounds once,
// below).
// LogicalAnd / LogicalOr (bool): vand / vor of the 0 / 1 bytes, two per u16 lane; broadcast
// inputs are first expanded by a BroadcastTo launch (the streaming kernel does not broadcast
// 1-byte inputs).
// BitwiseAnd / BitwiseOr: vand / vor, which take only 16-bit lanes; an int32 element is two u16
// lanes (the op acts on each bit alone, so the halves' order does not matter); exact.
#include <limits>

#include <fmt/format.h>

#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/int64.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

enum class Kind {
  kArith,
  kSquaredDifference,
  kCompare,
  kDivNoNan,
  kPow,
  kLogical,
  kBitwise,
  kGrad
};
enum class Types { kFloat, kFloatS32, kBool, kInt };

struct BinaryOp {
  const char* tf_op;
  Kind kind;
  Opcode vop;    // kArith, kLogical, kBitwise: the vector instruction
  isa::Cmp cmp;  // kCompare
  Types types;
};

const BinaryOp kOps[] = {
    {"AddV2", Kind::kArith, Opcode::op_vadd, isa::Cmp::EQ, Types::kFloatS32},
    {"Add", Kind::kArith, Opcode::op_vadd, isa::Cmp::EQ, Types::kFloatS32},
    {"Sub", Kind::kArith, Opcode::op_vsub, isa::Cmp::EQ, Types::kFloatS32},
    {"Mul", Kind::kArith, Opcode::op_vmul, isa::Cmp::EQ, Types::kFloatS32},
    {"RealDiv", Kind::kArith, Opcode::op_vdiv, isa::Cmp::EQ, Types::kFloat},
    {"Maximum", Kind::kArith, Opcode::op_vmax, isa::Cmp::EQ, Types::kFloatS32},
    {"Minimum", Kind::kArith, Opcode::op_vmin, isa::Cmp::EQ, Types::kFloatS32},
    {"SquaredDifference", Kind::kSquaredDifference, Opcode::op_vsub, isa::Cmp::EQ,
     Types::kFloatS32},
    {"Equal", Kind::kCompare, Opcode::op_vcmp, isa::Cmp::EQ, Types::kFloatS32},
    {"NotEqual", Kind::kCompare, Opcode::op_vcmp, isa::Cmp::NE, Types::kFloatS32},
    {"Less", Kind::kCompare, Opcode::op_vcmp, isa::Cmp::LT, Types::kFloatS32},
    {"LessEqual", Kind::kCompare, Opcode::op_vcmp, isa::Cmp::LE, Types::kFloatS32},
    {"Greater", Kind::kCompare, Opcode::op_vcmp, isa::Cmp::GT, Types::kFloatS32},
    {"GreaterEqual", Kind::kCompare, Opcode::op_vcmp, isa::Cmp::GE, Types::kFloatS32},
    {"DivNoNan", Kind::kDivNoNan, Opcode::op_vdiv, isa::Cmp::EQ, Types::kFloat},
    {"Pow", Kind::kPow, Opcode::op_vexp, isa::Cmp::EQ, Types::kFloat},
    {"LogicalAnd", Kind::kLogical, Opcode::op_vand, isa::Cmp::EQ, Types::kBool},
    {"LogicalOr", Kind::kLogical, Opcode::op_vor, isa::Cmp::EQ, Types::kBool},
    {"BitwiseAnd", Kind::kBitwise, Opcode::op_vand, isa::Cmp::EQ, Types::kInt},
    {"BitwiseOr", Kind::kBitwise, Opcode::op_vor, isa::Cmp::EQ, Types::kInt},
    {"ReciprocalGrad", Kind::kGrad, Opcode::op_vmul, isa::Cmp::EQ, Types::kFloat},
    {"SqrtGrad", Kind::kGrad, Opcode::op_vrec, isa::Cmp::EQ, Types::kFloat},
    {"RsqrtGrad", Kind::kGrad, Opcode::op_vrsqrt, isa::Cmp::EQ, Types::kFloat},
};

// Comparisons: vcmp writes one bit per element; vsel turns bits into f16 1.0 / 0.0 (from two
// one-repeat constant buffers read with repeat stride 0), and vconv narrows those to the
// bool bytes 1 / 0.
enum CompareTemp { kBits, kHalf, kOnes, kZeros };
constexpr int kF16RepeatBytes = 256;  // one repeat of f16 constants (128 lanes)

void compare_prologue(KernelBuilder& b, const std::vector<uint64_t>& temp) {
  Reg bits = b.reg("f16 constant");
  Reg count = b.reg_imm("constant lanes", kF16RepeatBytes / 2);
  b.movi(bits, vector_scalar_bits(Dtype::F16, 1.0));
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vdup, {Dtype::F16, temp[kOnes], bits, 0, 1, 8}, "f16 ones");
  b.movi(bits, vector_scalar_bits(Dtype::F16, 0.0));
  b.emit(Opcode::op_vdup, {Dtype::F16, temp[kZeros], bits, 0, 1, 8}, "f16 zeros");
}

void compare_tile(KernelBuilder& b, const TileOperands& t, Dtype type, isa::Cmp cmp) {
  const Reg& count = *t.count;
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vcmp, {type, cmp, t.temp[kBits], t.in[0], t.in[1], 0, 1, 1, 8, 8},
         "compare: one bit per element");
  b.emit(Opcode::op_vsel,
         {Dtype::F16, t.temp[kHalf], t.temp[kOnes], t.temp[kZeros], t.temp[kBits], 0, 1, 1, 1, 8, 0,
          0},
         "bits -> f16 1.0 / 0.0");
  vec_convert(b, Dtype::U8, Dtype::F16, t.out, t.temp[kHalf], RoundMode::kRint, count);
}

constexpr uint64_t kConst = 256;  // one repeat of constants

// DivNoNan: q = x / y, then zeros where y == 0.
void div_no_nan_spec(StreamSpec& spec, Dtype type) {
  enum { kBits, kZeros };
  spec.temps = {TempSpec{"bits", 1.0 / 8, 32}, TempSpec{"zeros", 0, kConst}};
  spec.prologue = [type](KernelBuilder& b, const std::vector<uint64_t>& temp) {
    vec_fill_repeat(b, type, temp[kZeros], 0);
  };
  spec.compute = [type](KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    vec_compare(b, type, isa::Cmp::EQ, t.temp[kBits], t.in[1], t.temp[kZeros], n, true);
    vec_binary(b, Opcode::op_vdiv, type, t.out, t.in[0], t.in[1], n);
    vec_select(b, type, t.out, t.temp[kZeros], t.out, t.temp[kBits], n, true, false);
  };
}

// ReciprocalGrad (vop vmul), SqrtGrad (vop vrec) and RsqrtGrad (vop vrsqrt, which names the op:
// no vrsqrt is issued) of (y, dy): the factor -(y * y), 0.5 / y or -0.5 * (y * y), times dy (times
// y * dy for RsqrtGrad), then zeros where dy == 0 (see the header comment).
void unary_grad_spec(StreamSpec& spec, Dtype type, Opcode vop) {
  enum { kBits, kZeros, kYDy };
  spec.temps = {TempSpec{"bits", 1.0 / 8, 32}, TempSpec{"zeros", 0, kConst}};
  if (vop == Opcode::op_vrsqrt) spec.temps.push_back(TempSpec{"y * dy", 4, 0});
  spec.prologue = [type](KernelBuilder& b, const std::vector<uint64_t>& temp) {
    vec_fill_repeat(b, type, temp[kZeros], 0);
  };
  spec.compute = [type, vop](KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    const uint64_t y = t.in[0], dy = t.in[1];
    if (vop == Opcode::op_vmul || vop == Opcode::op_vrsqrt) {
      const bool rsqrt = vop == Opcode::op_vrsqrt;
      vec_binary(b, Opcode::op_vmul, type, t.out, y, y, n);
      vec_scalar(b, Opcode::op_vmuls, type, t.out, t.out,
                 b.reg_imm(rsqrt ? "-0.5" : "-1", vector_scalar_bits(type, rsqrt ? -0.5 : -1.0)),
                 n);
    } else {
      vec_unary(b, Opcode::op_vrec, type, t.out, y, n);
      vec_scalar(b, Opcode::op_vmuls, type, t.out, t.out,
                 b.reg_imm("0.5", vector_scalar_bits(type, 0.5)), n);
    }
    if (vop == Opcode::op_vrsqrt) {
      vec_binary(b, Opcode::op_vmul, type, t.temp[kYDy], y, dy, n);
      vec_binary(b, Opcode::op_vmul, type, t.out, t.out, t.temp[kYDy], n);
    } else {
      vec_binary(b, Opcode::op_vmul, type, t.out, t.out, dy, n);
    }
    vec_compare(b, type, isa::Cmp::EQ, t.temp[kBits], dy, t.temp[kZeros], n, true);
    vec_select(b, type, t.out, t.temp[kZeros], t.out, t.temp[kBits], n, true, false);
  };
}

// Pow in f32 (see the header comment): m = exp(y * log|x|); for x < 0, m where y is an even
// integer, -m where odd, NaN otherwise (integer: y == f32(s32(y)); odd: floor(y/2) != y/2);
// then 1 where y == 0 or x == 1.
void pow_spec(StreamSpec& spec, Dtype type) {
  enum { kBits, kOnes, kZeros, kNaN, kInt, kRound, kHalf, kNegBase, kX, kY, kOut };
  const bool widen = type != Dtype::F32;
  spec.temps = {TempSpec{"bits", 1.0 / 8, 32},         TempSpec{"f32 ones", 0, kConst},
                TempSpec{"f32 zeros", 0, kConst},      TempSpec{"f32 NaN", 0, kConst},
                TempSpec{"s32 rounded", 4, 0},         TempSpec{"rounded in f32", 4, 0},
                TempSpec{"y / 2, then -result", 4, 0}, TempSpec{"negative-base result", 4, 0}};
  if (widen)
    for (const char* name : {"x in f32", "y in f32", "result in f32"})
      spec.temps.push_back(TempSpec{name, 4, 0});
  spec.prologue = [](KernelBuilder& b, const std::vector<uint64_t>& temp) {
    vec_fill_repeat(b, Dtype::F32, temp[kOnes], 1);
    vec_fill_repeat(b, Dtype::F32, temp[kZeros], 0);
    vec_fill_repeat(b, Dtype::F32, temp[kNaN], std::numeric_limits<double>::quiet_NaN());
  };
  spec.compute = [type, widen](KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    const uint64_t x = widen ? t.temp[kX] : t.in[0], y = widen ? t.temp[kY] : t.in[1];
    const uint64_t out = widen ? t.temp[kOut] : t.out, bits = t.temp[kBits];
    const uint64_t ones = t.temp[kOnes], rounded = t.temp[kRound], half = t.temp[kHalf];
    const uint64_t neg = t.temp[kNegBase];
    const Dtype f = Dtype::F32;
    if (widen) {
      vec_convert(b, f, type, x, t.in[0], RoundMode::kRint, n);
      vec_convert(b, f, type, y, t.in[1], RoundMode::kRint, n);
    }
    vec_unary(b, Opcode::op_vabs, f, out, x, n);
    vec_unary(b, Opcode::op_vln, f, out, out, n);
    vec_binary(b, Opcode::op_vmul, f, out, y, out, n);
    vec_unary(b, Opcode::op_vexp, f, out, out, n);
    // Negative bases.
    vec_convert(b, Dtype::S32, f, t.temp[kInt], y, RoundMode::kRint, n);
    vec_convert(b, f, Dtype::S32, rounded, t.temp[kInt], RoundMode::kRint, n);
    vec_compare(b, f, isa::Cmp::EQ, bits, rounded, y, n);
    vec_select(b, f, neg, out, t.temp[kNaN], bits, n, false, true);
    Reg half_scalar = b.reg_imm("0.5f", vector_scalar_bits(f, 0.5));
    vec_scalar(b, Opcode::op_vmuls, f, half, y, half_scalar, n);
    vec_convert(b, Dtype::S32, f, t.temp[kInt], half, RoundMode::kFloor, n);
    vec_convert(b, f, Dtype::S32, rounded, t.temp[kInt], RoundMode::kRint, n);
    vec_compare(b, f, isa::Cmp::NE, bits, rounded, half, n);
    Reg minus_one = b.reg_imm("-1.0f", vector_scalar_bits(f, -1.0));
    vec_scalar(b, Opcode::op_vmuls, f, half, neg, minus_one, n);
    vec_select(b, f, neg, half, neg, bits, n);
    vec_compare(b, f, isa::Cmp::LT, bits, x, t.temp[kZeros], n, true);
    vec_select(b, f, out, neg, out, bits, n);
    // Special cases.
    vec_compare(b, f, isa::Cmp::EQ, bits, y, t.temp[kZeros], n, true);
    vec_select(b, f, out, ones, out, bits, n, true, false);
    vec_compare(b, f, isa::Cmp::EQ, bits, x, ones, n, true);
    vec_select(b, f, out, ones, out, bits, n, true, false);
    if (widen) vec_convert(b, type, f, t.out, out, RoundMode::kRint, n);
  };
}

// LogicalAnd / LogicalOr: the bitwise op on byte pairs (an odd count computes one byte past the
// tile's last element, inside the tile buffers, as vec_copy_bits).
void logical_spec(StreamSpec& spec, Opcode vop) {
  spec.compute = [vop](KernelBuilder& b, const TileOperands& t) {
    Reg pairs = b.reg("byte pairs");
    b.emit(Opcode::op_add, {pairs, *t.count, 1});
    b.shr(pairs, pairs, 1);
    vec_binary(b, vop, Dtype::U16, t.out, t.in[0], t.in[1], pairs);
  };
}

// BitwiseAnd / BitwiseOr of `type` (s32, s16, u16): vec_bitwise.
void bitwise_spec(StreamSpec& spec, Dtype type, Opcode vop) {
  spec.compute = [type, vop](KernelBuilder& b, const TileOperands& t) {
    vec_bitwise(b, vop, type, t.out, t.in[0], t.in[1], *t.count);
  };
}

// LogicalAnd / LogicalOr of broadcast bool inputs: the streaming kernel does not broadcast
// 1-byte inputs, so each input of another shape is first expanded to the output's shape by a
// BroadcastTo (ops/layout.cpp, bytes assembled as u16 lanes) into a workspace slice, then the
// same-shape op runs on the expanded operands. Costs one extra copy kernel per broadcast input.
CompiledKernel logical_broadcast(const CompileContext& ctx, const TensorDesc& out) {
  const OpDesc& op = ctx.op;
  LaunchPlan plan({out});
  std::vector<ArgRef> ins;
  OpDesc same = op;
  same.outputs.clear();
  for (int i = 0; i < 2; ++i) {
    const TensorDesc& in = op.inputs[static_cast<size_t>(i)];
    same.inputs[static_cast<size_t>(i)] = out;
    if (in.shape == out.shape) {
      ins.push_back(LaunchPlan::input(i));
      continue;
    }
    OpDesc bcast;
    bcast.type = "BroadcastTo";
    bcast.inputs = {in};
    bcast.attrs = {{"shape", out.shape}};
    ArgRef ws = plan.workspace(out.bytes());
    plan.add(compile(bcast, ctx.cfg, ctx.precision), {LaunchPlan::input(i)}, {ws},
             fmt::format("broadcast in{}", i));
    ins.push_back(ws);
  }
  plan.add(compile(same, ctx.cfg, ctx.precision), ins, {LaunchPlan::output(0)});
  return std::move(plan).finish();
}

// SquaredDifference's f32 work on widened bf16 operands, in place (widen_bf16_tile_work's
// kRoundedInPlace): the difference rounded to bf16 and back before the square, so that both
// steps round as the native bf16 kernel's do; the widened y tile (a temporary of
// widen_bf16_tile_work's, not the op's input) holds the difference's bf16 bits in between.
void squared_difference_of_bf16_spec(StreamSpec& spec) {
  spec.compute = [](KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    const Dtype f = Dtype::F32, h = Dtype::BF16;
    vec_binary(b, Opcode::op_vsub, f, t.out, t.in[0], t.in[1], n);
    vec_convert(b, h, f, t.in[1], t.out, RoundMode::kRint, n);
    vec_convert(b, f, h, t.out, t.in[1], RoundMode::kRint, n);
    vec_binary(b, Opcode::op_vmul, f, t.out, t.out, t.out, n);
  };
}

// Sets spec.temps, prologue and compute: the vector work of one tile of `kind` at `type`, on
// the vector unit's own type (no widening).
void native_tile_work(const BinaryOp& kind, Dtype type, StreamSpec& spec) {
  switch (kind.kind) {
    case Kind::kArith:
      spec.compute = [type, vop = kind.vop](KernelBuilder& b, const TileOperands& t) {
        vec_binary(b, vop, type, t.out, t.in[0], t.in[1], *t.count);
      };
      break;
    case Kind::kSquaredDifference:
      spec.compute = [type](KernelBuilder& b, const TileOperands& t) {
        vec_binary(b, Opcode::op_vsub, type, t.out, t.in[0], t.in[1], *t.count);
        vec_binary(b, Opcode::op_vmul, type, t.out, t.out, t.out, *t.count);
      };
      break;
    case Kind::kCompare:
      // bits: one per element plus a partial repeat row; half: the f16 0/1 values.
      spec.temps = {TempSpec{"compare bits", 1.0 / 8, 32}, TempSpec{"compare f16", 2, 0},
                    TempSpec{"f16 ones", 0, kF16RepeatBytes},
                    TempSpec{"f16 zeros", 0, kF16RepeatBytes}};
      spec.prologue = compare_prologue;
      spec.compute = [type, cmp = kind.cmp](KernelBuilder& b, const TileOperands& t) {
        compare_tile(b, t, type, cmp);
      };
      break;
    case Kind::kDivNoNan: div_no_nan_spec(spec, type); break;
    case Kind::kPow: pow_spec(spec, type); break;
    case Kind::kLogical: logical_spec(spec, kind.vop); break;
    case Kind::kBitwise: bitwise_spec(spec, type, kind.vop); break;
    case Kind::kGrad: unary_grad_spec(spec, type, kind.vop); break;
  }
}

// native_tile_work, where `bf16_arithmetic` (the chip's ChipConfig::vector_bf16_arithmetic) is
// false with bf16 widened to f32 (widen_bf16_tile_work; Pow computes in f32 itself): bit-
// identical to the native kernels, which compute in fp32 and round once, but SquaredDifference
// (rounded twice as natively) and DivNoNan / ReciprocalGrad / SqrtGrad / RsqrtGrad, which round
// once instead of after every instruction.
void tile_work(const BinaryOp& kind, Dtype type, bool bf16_arithmetic, StreamSpec& spec) {
  if (type != Dtype::BF16 || bf16_arithmetic || kind.kind == Kind::kPow)
    return native_tile_work(kind, type, spec);
  if (kind.kind == Kind::kSquaredDifference)
    squared_difference_of_bf16_spec(spec);
  else
    native_tile_work(kind, Dtype::F32, spec);
  // The arithmetic and SquaredDifference compute in place (x's f32 tile), the others (their
  // chains read operands after writing) into a tile of their own.
  const bool in_place = kind.kind == Kind::kArith || kind.kind == Kind::kSquaredDifference;
  widen_bf16_tile_work(spec, 2,
                       kind.kind == Kind::kCompare ? WidenedResult::kBool
                       : in_place                  ? WidenedResult::kRoundedInPlace
                                                   : WidenedResult::kRounded);
}

const BinaryOp* find_binary(const std::string& tf_op) {
  for (const BinaryOp& k : kOps)
    if (tf_op == k.tf_op) return &k;
  return nullptr;
}

}  // namespace

bool binary_tile_work(const std::string& tf_op, Dtype type, bool bf16_arithmetic,
                      StreamSpec& spec) {
  const BinaryOp* kind = find_binary(tf_op);
  if (!kind || !isa::dtype_is_float(type) || kind->kind == Kind::kCompare ||
      kind->kind == Kind::kLogical)
    return false;
  tile_work(*kind, type, bf16_arithmetic, spec);
  return true;
}

CompiledKernel compile_binary(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const BinaryOp* kind = find_binary(op.type);
  if (!kind) op.fail("internal: not a binary op");
  if (op.inputs.size() != 2) op.fail(fmt::format("takes 2 inputs, {} given", op.inputs.size()));
  const DataType dt = op.inputs[0].dtype;
  if (op.inputs[1].dtype != dt)
    op.fail(fmt::format("inputs have different dtypes ({} and {})", data_type_name(dt),
                        data_type_name(op.inputs[1].dtype)));
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the inputs' {}", data_type_name(*t),
                        data_type_name(dt)));
  if (dt == DataType::S64 && kind->types == Types::kFloatS32) return compile_s64_binary(ctx);
  if (dt == DataType::BOOL && (op.type == "Equal" || op.type == "NotEqual"))
    return compile_s64_binary(ctx);  // the scalar unit compares the 0 / 1 bytes
  const bool ok =
      kind->types == Types::kBool ? dt == DataType::BOOL
      : kind->types == Types::kInt
          ? dt == DataType::S32 || dt == DataType::S16 || dt == DataType::U16
          : data_type_is_float(dt) || (kind->types == Types::kFloatS32 && dt == DataType::S32);
  if (!ok)
    op.fail(fmt::format("dtype {} is not supported ({})", data_type_name(dt),
                        kind->types == Types::kBool       ? "bool"
                        : kind->types == Types::kInt      ? "s32, s16, u16"
                        : kind->types == Types::kFloatS32 ? "f32, f16, bf16, s32"
                                                          : "f32, f16, bf16"));
  auto shape = broadcast_shapes(op.inputs[0].shape, op.inputs[1].shape);
  if (!shape)
    op.invalid(fmt::format("shapes {} and {} are not broadcast-compatible",
                           shape_str(op.inputs[0].shape), shape_str(op.inputs[1].shape)));
  const TensorDesc out{kind->kind == Kind::kCompare ? DataType::BOOL : dt, *shape};
  if (kind->kind == Kind::kLogical && out.num_elements() > 0 &&
      (op.inputs[0].shape != out.shape || op.inputs[1].shape != out.shape))
    return logical_broadcast(ctx, out);

  StreamSpec spec;
  spec.kernel_name = fmt::format("{}_{}", op.type, data_type_name(dt));
  spec.inputs = stream_inputs(op.inputs, out.shape);
  spec.out_type = device_dtype(out.dtype);
  spec.out_shape = out.shape;
  tile_work(*kind, device_dtype(dt), ctx.cfg.vector_bf16_arithmetic, spec);
  return stream_kernel(ctx, out, spec);
}

}  // namespace npusim::compiler::ops
