// Element-wise unary ops: Neg, Abs, Exp, Log, Sqrt, Rsqrt, Square, Reciprocal, Relu, Floor,
// Ceil, Round, Sign, Log1p, IsFinite, LogicalNot, Invert, Sin, Cos. Streamed by ops/elementwise;
// this file only says which vector instructions compute a tile.
//
// Numerics (vector_ops.h): each instruction computes in fp32 and rounds once to the type.
// Neg is x * -1 (exact, keeps -0 for +0 as TF). Exp/Log use the host libm's expf/logf
// (correctly rounded in practice); TF's CPU kernels use Eigen's vectorised approximations,
// which differ by a few ulp. Rsqrt and Reciprocal are 1/sqrt(x) and 1/x evaluated in fp32.
// Floor/Ceil/Round (Round: half to even, as TF): vconv to s32 with the rounding mode and back,
// exact; |x| >= 2^23 (already integral, or beyond s32), inf and NaN pass through unchanged by a
// select on |x| < 2^23. Differs from TF only in the sign of a zero result (Ceil(-0.5) and
// Round(-0.4) give +0, TF -0).
// Sign: (x > 0) - (x < 0), NaN -> NaN (float), also s32; Sign(-0) = +0.
// Log1p: f16/bf16 are widened to f32, computed, rounded once. log(1 + x) loses all precision for
// |x| near the fp32 epsilon, so it uses log(u) * x / (u - 1) with u = 1 + x rounded (exact
// compensation, Goldberg 1991), x where u == 1, and log(u) for x >= 2^24 or inf/NaN;
// within 4 ulp of the exact result for x > -1 (tested from 1e-7 to 1e3).
// IsFinite (f32/f16/bf16 -> bool): x - x == 0, computed in the input's type; false exactly for
// NaN and +-Inf (Inf - Inf and NaN - NaN are NaN), true for denormals and the largest values.
// LogicalNot (bool): ~x & 0x0101 on byte pairs (bool bytes are 0 / 1).
// Invert (int32, int16, uint16): vnot on u16 lanes (vec_bitwise); exact.
// Sin, Cos (the vector unit has no transcendental but exp and ln): in f32 (f16/bf16 widened,
// rounded once), Cody-Waite reduction r = x - k pi/2 with k = rint(x 2/pi) and pi/2 split in
// three (8 + 11 + 24 significant bits: k pi/2's first two parts are exact for |k| < 2^13, so
// |x| < 12867), then Cephes' minimax polynomials for sin and cos on [-pi/4, pi/4] and the
// quadrant (k + 1 for Cos) choosing sin r, cos r and the sign. Within 2e-7 absolute of the
// exact value for |x| < 12867 (about 2 ulp near 1); beyond, the error grows as |x| 2^-24;
// beyond |x| = 2^31 pi/2 k saturates and the result, still in [-1, 1], is not sin x; +-inf and
// NaN give NaN. TF's CPU
// kernels (Eigen's psin/pcos) reduce exactly for all finite x and differ by a few ulp.
#include <fmt/format.h>

#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

enum class Kind {
  kUnary,
  kNeg,
  kSquare,
  kRound,
  kSign,
  kLog1p,
  kIsFinite,
  kLogicalNot,
  kInvert,
  kSin,
  kCos
};
enum class Types { kFloat, kFloatS32, kBool, kInt };

struct UnaryOp {
  const char* tf_op;
  Kind kind;
  Opcode vop;
  Types types;
  RoundMode round = RoundMode::kRint;  // kRound
};

const UnaryOp kOps[] = {
    {"Neg", Kind::kNeg, Opcode::op_vmuls, Types::kFloatS32},
    {"Abs", Kind::kUnary, Opcode::op_vabs, Types::kFloatS32},
    {"Exp", Kind::kUnary, Opcode::op_vexp, Types::kFloat},
    {"Log", Kind::kUnary, Opcode::op_vln, Types::kFloat},
    {"Sqrt", Kind::kUnary, Opcode::op_vsqrt, Types::kFloat},
    {"Rsqrt", Kind::kUnary, Opcode::op_vrsqrt, Types::kFloat},
    {"Square", Kind::kSquare, Opcode::op_vmul, Types::kFloatS32},
    {"Reciprocal", Kind::kUnary, Opcode::op_vrec, Types::kFloat},
    {"Relu", Kind::kUnary, Opcode::op_vrelu, Types::kFloatS32},
    {"Floor", Kind::kRound, Opcode::op_vconv, Types::kFloat, RoundMode::kFloor},
    {"Ceil", Kind::kRound, Opcode::op_vconv, Types::kFloat, RoundMode::kCeil},
    {"Round", Kind::kRound, Opcode::op_vconv, Types::kFloat, RoundMode::kRint},
    {"Sign", Kind::kSign, Opcode::op_vcmp, Types::kFloatS32},
    {"Log1p", Kind::kLog1p, Opcode::op_vln, Types::kFloat},
    {"IsFinite", Kind::kIsFinite, Opcode::op_vsub, Types::kFloat},
    {"LogicalNot", Kind::kLogicalNot, Opcode::op_vnot, Types::kBool},
    {"Invert", Kind::kInvert, Opcode::op_vnot, Types::kInt},
    {"Sin", Kind::kSin, Opcode::op_vmul, Types::kFloat},
    {"Cos", Kind::kCos, Opcode::op_vmul, Types::kFloat},
};

constexpr uint64_t kConst = 256;        // one repeat of constants
constexpr double kIntegral = 8388608;   // 2^23: every f32 of at least this magnitude is integral
constexpr double kLog1pLarge = 16777216;  // 2^24: 1 + x rounds to x, log(u) is log1p(x)

// Floor / Ceil / Round: x -> s32 (mode) -> x's type, kept where |x| < 2^23 (f16: all finite).
void round_spec(StreamSpec& spec, Dtype type, RoundMode mode) {
  enum { kInt, kAbs, kBits, kLimit };
  spec.temps = {TempSpec{"s32 values", 4, 0}, TempSpec{"|x|", double(isa::dtype_size(type)), 0},
                TempSpec{"bits", 1.0 / 8, 32}, TempSpec{"2^23", 0, kConst}};
  spec.prologue = [type](KernelBuilder& b, const std::vector<uint64_t>& temp) {
    vec_fill_repeat(b, type, temp[kLimit], kIntegral);
  };
  spec.compute = [type, mode](KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    vec_convert(b, Dtype::S32, type, t.temp[kInt], t.in[0], mode, n);
    vec_convert(b, type, Dtype::S32, t.out, t.temp[kInt], RoundMode::kRint, n);
    vec_unary(b, Opcode::op_vabs, type, t.temp[kAbs], t.in[0], n);
    vec_compare(b, type, isa::Cmp::LT, t.temp[kBits], t.temp[kAbs], t.temp[kLimit], n, true);
    vec_select(b, type, t.out, t.out, t.in[0], t.temp[kBits], n);
  };
}

// Sign: (x > 0 ? 1 : 0) - (x < 0 ? 1 : 0); float NaN kept by a select on x == x.
void sign_spec(StreamSpec& spec, Dtype type) {
  enum { kBits, kNeg, kOnes, kZeros };
  spec.temps = {TempSpec{"bits", 1.0 / 8, 32}, TempSpec{"x < 0", double(isa::dtype_size(type)), 0},
                TempSpec{"ones", 0, kConst}, TempSpec{"zeros", 0, kConst}};
  spec.prologue = [type](KernelBuilder& b, const std::vector<uint64_t>& temp) {
    vec_fill_repeat(b, type, temp[kOnes], 1);
    vec_fill_repeat(b, type, temp[kZeros], 0);
  };
  spec.compute = [type](KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    const uint64_t x = t.in[0], bits = t.temp[kBits];
    vec_compare(b, type, isa::Cmp::GT, bits, x, t.temp[kZeros], n, true);
    vec_select(b, type, t.out, t.temp[kOnes], t.temp[kZeros], bits, n, true, true);
    vec_compare(b, type, isa::Cmp::LT, bits, x, t.temp[kZeros], n, true);
    vec_select(b, type, t.temp[kNeg], t.temp[kOnes], t.temp[kZeros], bits, n, true, true);
    vec_binary(b, Opcode::op_vsub, type, t.out, t.out, t.temp[kNeg], n);
    if (isa::dtype_is_float(type)) {
      vec_compare(b, type, isa::Cmp::EQ, bits, x, x, n);
      vec_select(b, type, t.out, t.out, x, bits, n);
    }
  };
}

// Log1p in f32 (see the header comment).
void log1p_spec(StreamSpec& spec, Dtype type) {
  enum { kU, kD, kBits, kZeros, kLarge, kX, kOut };
  const bool widen = type != Dtype::F32;
  spec.temps = {TempSpec{"u = 1 + x, then log(u)", 4, 0}, TempSpec{"u - 1", 4, 0},
                TempSpec{"bits", 1.0 / 8, 32}, TempSpec{"f32 zeros", 0, kConst},
                TempSpec{"2^24", 0, kConst}};
  if (widen) spec.temps.push_back(TempSpec{"x in f32", 4, 0});
  if (widen) spec.temps.push_back(TempSpec{"result in f32", 4, 0});
  spec.prologue = [](KernelBuilder& b, const std::vector<uint64_t>& temp) {
    vec_fill_repeat(b, Dtype::F32, temp[kZeros], 0);
    vec_fill_repeat(b, Dtype::F32, temp[kLarge], kLog1pLarge);
  };
  spec.compute = [type, widen](KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    const uint64_t x = widen ? t.temp[kX] : t.in[0], out = widen ? t.temp[kOut] : t.out;
    const uint64_t u = t.temp[kU], d = t.temp[kD], bits = t.temp[kBits];
    if (widen) vec_convert(b, Dtype::F32, type, x, t.in[0], RoundMode::kRint, n);
    Reg one = b.reg_imm("1.0f", vector_scalar_bits(Dtype::F32, 1.0));
    Reg minus_one = b.reg_imm("-1.0f", vector_scalar_bits(Dtype::F32, -1.0));
    vec_scalar(b, Opcode::op_vadds, Dtype::F32, u, x, one, n);
    vec_scalar(b, Opcode::op_vadds, Dtype::F32, d, u, minus_one, n);
    vec_unary(b, Opcode::op_vln, Dtype::F32, u, u, n);
    vec_compare(b, Dtype::F32, isa::Cmp::NE, bits, d, t.temp[kZeros], n, true);
    vec_binary(b, Opcode::op_vdiv, Dtype::F32, d, x, d, n);
    vec_binary(b, Opcode::op_vmul, Dtype::F32, d, u, d, n);
    vec_select(b, Dtype::F32, out, d, x, bits, n);
    vec_compare(b, Dtype::F32, isa::Cmp::LT, bits, x, t.temp[kLarge], n, true);
    vec_select(b, Dtype::F32, out, out, u, bits, n);
    if (widen) vec_convert(b, type, Dtype::F32, t.out, out, RoundMode::kRint, n);
  };
}

// Sin (quadrant_shift 0) and Cos (1) in f32 (see the header comment).
void sin_cos_spec(StreamSpec& spec, Dtype type, int quadrant_shift) {
  enum { kInt, kK, kR, kR2, kP, kS, kC, kBits, kHalf, kX, kOut };
  const bool widen = type != Dtype::F32;
  spec.temps = {TempSpec{"k as s32", 4, 0},
                TempSpec{"k", 4, 0},
                TempSpec{"r, then quadrant", 4, 0},
                TempSpec{"r^2, then quadrant / 2", 4, 0},
                TempSpec{"polynomial", 4, 0},
                TempSpec{"sin r", 4, 0},
                TempSpec{"cos r", 4, 0},
                TempSpec{"bits", 1.0 / 8, 32},
                TempSpec{"0.5", 0, kConst}};
  if (widen) spec.temps.push_back(TempSpec{"x in f32", 4, 0});
  if (widen) spec.temps.push_back(TempSpec{"result in f32", 4, 0});
  spec.prologue = [](KernelBuilder& b, const std::vector<uint64_t>& temp) {
    vec_fill_repeat(b, Dtype::F32, temp[kHalf], 0.5);
  };
  spec.compute = [type, widen, quadrant_shift](KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    const uint64_t x = widen ? t.temp[kX] : t.in[0], out = widen ? t.temp[kOut] : t.out;
    const uint64_t k = t.temp[kK], r = t.temp[kR], r2 = t.temp[kR2], p = t.temp[kP];
    const uint64_t sin_r = t.temp[kS], cos_r = t.temp[kC], bits = t.temp[kBits];
    auto scalar = [&b](const char* name, double v) {
      return b.reg_imm(name, vector_scalar_bits(Dtype::F32, v));
    };
    auto muls = [&](uint64_t d, uint64_t a, const char* name, double v) {
      vec_scalar(b, Opcode::op_vmuls, Dtype::F32, d, a, scalar(name, v), n);
    };
    auto adds = [&](uint64_t d, uint64_t a, const char* name, double v) {
      vec_scalar(b, Opcode::op_vadds, Dtype::F32, d, a, scalar(name, v), n);
    };
    auto mul = [&](uint64_t d, uint64_t a, uint64_t c) {
      vec_binary(b, Opcode::op_vmul, Dtype::F32, d, a, c, n);
    };
    auto sub = [&](uint64_t d, uint64_t a, uint64_t c) {
      vec_binary(b, Opcode::op_vsub, Dtype::F32, d, a, c, n);
    };
    auto floor_of = [&](uint64_t d, uint64_t a) {  // d = floor(a), |a| < 2^31
      vec_convert(b, Dtype::S32, Dtype::F32, t.temp[kInt], a, RoundMode::kFloor, n);
      vec_convert(b, Dtype::F32, Dtype::S32, d, t.temp[kInt], RoundMode::kRint, n);
    };
    if (widen) vec_convert(b, Dtype::F32, type, x, t.in[0], RoundMode::kRint, n);
    // k = rint(x * 2/pi); r = x - k * (C1 + C2 + C3), C1 + C2 + C3 = pi/2.
    muls(k, x, "2/pi", 0.63661977236758134308);
    vec_convert(b, Dtype::S32, Dtype::F32, t.temp[kInt], k, RoundMode::kRint, n);
    vec_convert(b, Dtype::F32, Dtype::S32, k, t.temp[kInt], RoundMode::kRint, n);
    muls(p, k, "C1", 1.5703125);
    sub(r, x, p);
    muls(p, k, "C2", 4.837512969970703125e-4);
    sub(r, r, p);
    muls(p, k, "C3", 7.54978995489188216e-8);
    sub(r, r, p);
    mul(r2, r, r);
    // sin r = r + r^3 (s1 + r^2 (s2 + r^2 s3)) (Cephes sinf).
    muls(p, r2, "s3", -1.9515295891e-4);
    adds(p, p, "s2", 8.3321608736e-3);
    mul(p, p, r2);
    adds(p, p, "s1", -1.6666654611e-1);
    mul(p, p, r2);
    mul(p, p, r);
    vec_binary(b, Opcode::op_vadd, Dtype::F32, sin_r, r, p, n);
    // cos r = 1 - r^2 / 2 + r^4 (c1 + r^2 (c2 + r^2 c3)) (Cephes cosf).
    muls(p, r2, "c3", 2.443315711809948e-5);
    adds(p, p, "c2", -1.388731625493765e-3);
    mul(p, p, r2);
    adds(p, p, "c1", 4.166664568298827e-2);
    mul(p, p, r2);
    mul(p, p, r2);
    muls(cos_r, r2, "-0.5", -0.5);
    vec_binary(b, Opcode::op_vadd, Dtype::F32, cos_r, cos_r, p, n);
    adds(cos_r, cos_r, "1", 1.0);
    // quadrant q = (k + shift) mod 4 in r; half = floor(q / 2) in r2; odd = q - 2 half in q.
    if (quadrant_shift) adds(k, k, "quadrant shift", quadrant_shift);
    muls(p, k, "1/4", 0.25);
    floor_of(p, p);
    muls(p, p, "4", 4.0);
    sub(r, k, p);
    muls(p, r, "1/2", 0.5);
    floor_of(r2, p);
    muls(p, r2, "2", 2.0);
    sub(r, r, p);
    // odd quadrants take cos r, the upper two the negated value.
    vec_compare(b, Dtype::F32, isa::Cmp::GT, bits, r, t.temp[kHalf], n, true);
    vec_select(b, Dtype::F32, out, cos_r, sin_r, bits, n);
    muls(p, out, "-1", -1.0);
    vec_compare(b, Dtype::F32, isa::Cmp::GT, bits, r2, t.temp[kHalf], n, true);
    vec_select(b, Dtype::F32, out, p, out, bits, n);
    if (widen) vec_convert(b, type, Dtype::F32, t.out, out, RoundMode::kRint, n);
  };
}

// IsFinite: bits = (x - x == 0), selected into f16 ones / zeros and converted to u8 (bool bytes
// are 0 / 1), as Cast to bool does.
void is_finite_spec(StreamSpec& spec, Dtype type) {
  enum { kDiff, kBits, kHalf, kZeros, kOnes16, kZeros16 };
  spec.temps = {TempSpec{"x - x", double(isa::dtype_size(type)), 0},
                TempSpec{"bits", 1.0 / 8, 32}, TempSpec{"f16 result", 2, 0},
                TempSpec{"zeros", 0, kConst}, TempSpec{"f16 ones", 0, kConst},
                TempSpec{"f16 zeros", 0, kConst}};
  spec.prologue = [type](KernelBuilder& b, const std::vector<uint64_t>& temp) {
    vec_fill_repeat(b, type, temp[kZeros], 0);
    vec_fill_repeat(b, Dtype::F16, temp[kOnes16], 1);
    vec_fill_repeat(b, Dtype::F16, temp[kZeros16], 0);
  };
  spec.compute = [type](KernelBuilder& b, const TileOperands& t) {
    const Reg& n = *t.count;
    vec_binary(b, Opcode::op_vsub, type, t.temp[kDiff], t.in[0], t.in[0], n);
    vec_compare(b, type, isa::Cmp::EQ, t.temp[kBits], t.temp[kDiff], t.temp[kZeros], n, true);
    vec_select(b, Dtype::F16, t.temp[kHalf], t.temp[kOnes16], t.temp[kZeros16], t.temp[kBits], n,
               true, true);
    vec_convert(b, Dtype::U8, Dtype::F16, t.out, t.temp[kHalf], RoundMode::kRint, n);
  };
}

// LogicalNot on byte pairs: ~x & 0x0101 (an odd count computes one byte past the tile's last
// element, inside the tile buffer, as vec_copy_bits).
void logical_not_spec(StreamSpec& spec) {
  enum { kMask };
  spec.temps = {TempSpec{"0x0101", 0, kConst}};
  spec.prologue = [](KernelBuilder& b, const std::vector<uint64_t>& temp) {
    vec_fill_repeat(b, Dtype::U16, temp[kMask], 0x0101);
  };
  spec.compute = [](KernelBuilder& b, const TileOperands& t) {
    Reg pairs = b.reg("byte pairs");
    b.emit(Opcode::op_add, {pairs, *t.count, 1});
    b.shr(pairs, pairs, 1);
    vec_unary(b, Opcode::op_vnot, Dtype::U16, t.out, t.in[0], pairs);
    b.emit(Opcode::op_vand, {Dtype::U16, t.out, t.out, t.temp[kMask], 0, 1, 1, 1, 8, 8, 0});
  };
}

// Sets spec.temps, prologue and compute: the vector work of one tile of `kind` at `type`, on
// the vector unit's own type (no widening; Log1p, Sin and Cos compute in f32 themselves).
void native_tile_work(const UnaryOp& kind, Dtype type, StreamSpec& spec) {
  switch (kind.kind) {
    case Kind::kUnary:
      spec.compute = [type, vop = kind.vop](KernelBuilder& b, const TileOperands& t) {
        vec_unary(b, vop, type, t.out, t.in[0], *t.count);
      };
      break;
    case Kind::kNeg:
      spec.compute = [type](KernelBuilder& b, const TileOperands& t) {
        Reg minus_one = b.reg_imm("-1 as a vector scalar", vector_scalar_bits(type, -1.0));
        vec_scalar(b, Opcode::op_vmuls, type, t.out, t.in[0], minus_one, *t.count);
      };
      break;
    case Kind::kSquare:
      spec.compute = [type](KernelBuilder& b, const TileOperands& t) {
        vec_binary(b, Opcode::op_vmul, type, t.out, t.in[0], t.in[0], *t.count);
      };
      break;
    case Kind::kRound: round_spec(spec, type, kind.round); break;
    case Kind::kSign: sign_spec(spec, type); break;
    case Kind::kLog1p: log1p_spec(spec, type); break;
    case Kind::kIsFinite: is_finite_spec(spec, type); break;
    case Kind::kLogicalNot: logical_not_spec(spec); break;
    case Kind::kInvert:
      spec.compute = [type](KernelBuilder& b, const TileOperands& t) {
        vec_bitwise(b, Opcode::op_vnot, type, t.out, t.in[0], t.in[0], *t.count);
      };
      break;
    case Kind::kSin: sin_cos_spec(spec, type, 0); break;
    case Kind::kCos: sin_cos_spec(spec, type, 1); break;
  }
}

// native_tile_work, where `bf16_arithmetic` (the chip's ChipConfig::vector_bf16_arithmetic) is
// false with bf16 widened to f32 (widen_bf16_tile_work): one instruction, or exact steps
// (Floor, Ceil, Round, Sign, IsFinite), so bit-identical to the native kernels.
void tile_work(const UnaryOp& kind, Dtype type, bool bf16_arithmetic, StreamSpec& spec) {
  const bool f32_itself =
      kind.kind == Kind::kLog1p || kind.kind == Kind::kSin || kind.kind == Kind::kCos;
  if (type != Dtype::BF16 || bf16_arithmetic || f32_itself)
    return native_tile_work(kind, type, spec);
  native_tile_work(kind, Dtype::F32, spec);
  widen_bf16_tile_work(spec, 1,
                       kind.kind == Kind::kIsFinite ? WidenedResult::kBool : WidenedResult::kRounded);
}

const UnaryOp* find_unary(const std::string& tf_op) {
  for (const UnaryOp& k : kOps)
    if (tf_op == k.tf_op) return &k;
  return nullptr;
}

}  // namespace

bool unary_tile_work(const std::string& tf_op, Dtype type, bool bf16_arithmetic,
                     StreamSpec& spec) {
  const UnaryOp* kind = find_unary(tf_op);
  if (!kind || !isa::dtype_is_float(type) || kind->kind == Kind::kIsFinite ||
      kind->kind == Kind::kLogicalNot)
    return false;
  tile_work(*kind, type, bf16_arithmetic, spec);
  return true;
}

CompiledKernel compile_unary(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const UnaryOp* kind = find_unary(op.type);
  if (!kind) op.fail("internal: not a unary op");
  if (op.inputs.size() != 1) op.fail(fmt::format("takes 1 input, {} given", op.inputs.size()));
  const DataType dt = op.inputs[0].dtype;
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the input's {}", data_type_name(*t),
                        data_type_name(dt)));
  const bool ok =
      kind->types == Types::kBool ? dt == DataType::BOOL
      : kind->types == Types::kInt
          ? dt == DataType::S32 || dt == DataType::S16 || dt == DataType::U16
          : data_type_is_float(dt) || (kind->types == Types::kFloatS32 && dt == DataType::S32);
  if (!ok)
    op.fail(fmt::format("dtype {} is not supported ({})", data_type_name(dt),
                        kind->types == Types::kBool      ? "bool"
                        : kind->types == Types::kInt      ? "s32, s16, u16"
                        : kind->types == Types::kFloatS32 ? "f32, f16, bf16, s32"
                                                          : "f32, f16, bf16"));
  TensorDesc out = op.inputs[0];
  if (kind->kind == Kind::kIsFinite) out.dtype = DataType::BOOL;

  StreamSpec spec;
  spec.kernel_name = fmt::format("{}_{}", op.type, data_type_name(dt));
  spec.inputs = stream_inputs(op.inputs, out.shape);
  spec.out_type = device_dtype(out.dtype);
  spec.out_shape = out.shape;
  tile_work(*kind, device_dtype(dt), ctx.cfg.vector_bf16_arithmetic, spec);
  return stream_kernel(ctx, out, spec);
}

}  // namespace npusim::compiler::ops
