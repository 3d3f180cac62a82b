// The vector unit's instructions as element functions: for each V instruction its family (how
// its operands are laid out), the data types it accepts, its cost class, and the function of one
// lane. plan() reads the type sets and cost classes from here, execute() the functions, so the
// two cannot disagree.
//
// Arithmetic semantics (bit-accurate):
// - f16/bf16 are computed in fp32 and rounded once to the type (nearest even); f32 in fp32.
//   add/sub/mul/div/sqrt are therefore correctly rounded for every float type. exp/ln use the
//   host libm's expf/logf (glibc: correctly rounded in practice); rsqrt is 1/sqrt(x) and rec 1/x
//   evaluated in fp32. IEEE subnormals, infinities and signed zeros; no flush to zero. Assumes the
//   host's default floating-point environment (round to nearest, no FTZ/DAZ).
// - Any float result that is NaN is stored as the canonical NaN (common/convert.h). Pure data
//   moves (vcopy, vsel, vdup of f32, vtranspose) keep bits.
// - max/min: a NaN operand gives NaN; otherwise the larger/smaller, the first operand on ties
//   (so max(-0, +0) = -0). relu(x) = max(x, 0); lrelu(x) = x >= 0 ? x : x * scalar.
// - Integer types wrap (two's complement, modulo 2^bits): add/sub/mul, abs(INT_MIN) = INT_MIN,
//   reductions.
// - Scalar operand (xscalar, VSCL and vdup): for float types the register's low 32 bits are an
//   fp32 value, rounded to nearest even to the type first (vdup.f32 stores the bits as given);
//   for integer types the register's low bits (wrapping, e.g. 70000 -> 4464 as s16).
// Types per instruction (anything else is a KernelFault in plan()):
//   vadd vsub vmul vmax vmin, vadds vmuls vmaxs vmins, vcmp, vcadd vcmax vcmin:
//                                        f32 f16 bf16 s32 s16 u16
//   vdiv vexp vln vsqrt vrsqrt vrec vlrelu:  f32 f16 bf16
//   vabs vrelu:                          f32 f16 bf16 s32 s16
//   vand vor vnot:                       s16 u16 (bitwise; use the u16 view for f16 bits)
//   vcopy vsel vdup:                     f32 f16 bf16 s32 s16 u16 (bits moved unchanged)
//   vconv:                               any pair of f32 f16 bf16 s32 s16 s8 u8 u16 except two
//                                        8-bit types (256 lanes would exceed the 128-bit mask)
//   vtranspose:                          2-byte elements, no type field
//   vaddreluconv:                        f16 <- f32 only (dst_type, src_type; vector_pair_ok);
//                                        on chips with vector.add_relu_conv only
//   vmla:                                f16 f32; on chips with vector.multiply_accumulate only
// bf16 in an instruction that computes (every one above but vconv, vcopy, vsel, vdup,
// vtranspose): on chips with vector.bf16_arithmetic only; bf16 in vconv and vdup: on chips with
// vector.bf16_conversion only (vector_insn.h).
// 8-bit types are vconv-only: a 256-lane repeat cannot be addressed by the 128-bit mask.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "common/convert.h"
#include "isa/isa.h"

namespace npusim::vec {

// How an instruction's operands are laid out (fields in isa.def):
enum class Family : uint8_t {
  kBinary,     // dst = f(src0, src1), element-wise (VBIN)
  kUnary,      // dst = f(src) (VUN)
  kScalar,     // dst = f(src, scalar) (VSCL)
  kCompare,    // bits = cmp(src0, src1), one bit per lane, dense per repeat (vcmp)
  kSelect,     // dst = sel bit ? src0 : src1 (vsel)
  kReduce,     // one result per repeat, dense (vcadd vcmax vcmin)
  kConvert,    // dst (dst_type) = convert(src (src_type)) (vconv)
  kDup,        // dst = scalar (vdup)
  kTranspose,  // 16x16 2-byte transpose (vtranspose)
  kBinaryConvert,  // dst (dst_type) = convert(f(src0, src1)) (src_type sources; vaddreluconv)
  kMultiplyAccumulate,  // dst = f(src0, src1, dst) (vmla: the binary operands, dst also read)
};

// Which config factor multiplies the per-repeat cycles.
enum class CostClass : uint8_t {
  kElementwise,     // 1
  kTranscendental,  // cfg.vector_transcendental_factor
  kReduce,          // cfg.vector_reduce_factor
};

using TypeSet = uint32_t;
constexpr TypeSet type_bit(isa::Dtype t) { return TypeSet{1} << static_cast<unsigned>(t); }
inline constexpr TypeSet kFloatTypes =
    type_bit(isa::Dtype::F32) | type_bit(isa::Dtype::F16) | type_bit(isa::Dtype::BF16);
inline constexpr TypeSet kSignedIntTypes = type_bit(isa::Dtype::S32) | type_bit(isa::Dtype::S16);
inline constexpr TypeSet kArithTypes = kFloatTypes | kSignedIntTypes | type_bit(isa::Dtype::U16);
inline constexpr TypeSet kSignedTypes = kFloatTypes | kSignedIntTypes;
inline constexpr TypeSet kBitwiseTypes = type_bit(isa::Dtype::S16) | type_bit(isa::Dtype::U16);
inline constexpr TypeSet kMoveTypes = kArithTypes;  // every 16- and 32-bit type
inline constexpr TypeSet kConvertTypes =
    kArithTypes | type_bit(isa::Dtype::S8) | type_bit(isa::Dtype::U8);

// Two's-complement wrapping arithmetic without signed overflow (16-bit types are promoted to a
// 32-bit unsigned so u16 * u16 cannot overflow int).
template <class T>
using WrapUnsigned = std::conditional_t<(sizeof(T) < 4), uint32_t, std::make_unsigned_t<T>>;
template <class T>
inline T wrap_add(T a, T b) {
  return static_cast<T>(static_cast<WrapUnsigned<T>>(a) + static_cast<WrapUnsigned<T>>(b));
}
template <class T>
inline T wrap_sub(T a, T b) {
  return static_cast<T>(static_cast<WrapUnsigned<T>>(a) - static_cast<WrapUnsigned<T>>(b));
}
template <class T>
inline T wrap_mul(T a, T b) {
  return static_cast<T>(static_cast<WrapUnsigned<T>>(a) * static_cast<WrapUnsigned<T>>(b));
}

template <class T>
inline constexpr bool kIsFloat = std::is_floating_point_v<T>;

// Common traits of an op: family, accepted types, cost class.
// `computes`: whether the instruction interprets its elements as numbers (arithmetic,
// comparison, reduction); false for the conversions and the pure data moves (vconv, vcopy, vsel,
// vdup, vtranspose), which chips without bf16 arithmetic still run on bf16 (vector_insn.h,
// bf16_arithmetic_refused).
template <Family F, TypeSet Types, CostClass C = CostClass::kElementwise>
struct OpTraits {
  static constexpr Family family = F;
  static constexpr TypeSet types = Types;
  static constexpr CostClass cost = C;
  static constexpr bool computes = F != Family::kConvert && F != Family::kSelect &&
                                   F != Family::kDup && F != Family::kTranspose;
};

// Element functions on compute values (float for float types, the integer for integer types).
struct Add {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (kIsFloat<T>) return a + b; else return wrap_add(a, b);
  }
};
struct Sub {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (kIsFloat<T>) return a - b; else return wrap_sub(a, b);
  }
};
struct Mul {
  template <class T>
  static T apply(T a, T b) {
    if constexpr (kIsFloat<T>) return a * b; else return wrap_mul(a, b);
  }
};
struct Div {
  template <class T>
  static T apply(T a, T b) { return a / b; }  // float types only
};
struct Max {
  template <class T>
  static T apply(T a, T b) { return (a < b || b != b) ? b : a; }
};
struct Min {
  template <class T>
  static T apply(T a, T b) { return (b < a || b != b) ? b : a; }
};
struct And {
  template <class T>
  static T apply(T a, T b) { return static_cast<T>(a & b); }
};
struct Or {
  template <class T>
  static T apply(T a, T b) { return static_cast<T>(a | b); }
};

struct Exp {
  template <class T>
  static T apply(T a) { return std::exp(a); }
};
struct Ln {
  template <class T>
  static T apply(T a) { return std::log(a); }
};
struct Sqrt {
  template <class T>
  static T apply(T a) { return std::sqrt(a); }
};
struct Rsqrt {
  template <class T>
  static T apply(T a) { return T(1) / std::sqrt(a); }
};
struct Rec {
  template <class T>
  static T apply(T a) { return T(1) / a; }
};
struct Abs {
  template <class T>
  static T apply(T a) {
    if constexpr (kIsFloat<T>) return std::fabs(a);
    else return a < 0 ? wrap_sub(T(0), a) : a;
  }
};
struct Relu {
  template <class T>
  static T apply(T a) { return Max::apply(a, T(0)); }
};
struct Not {
  template <class T>
  static T apply(T a) { return static_cast<T>(~a); }
};
struct LeakyRelu {
  template <class T>
  static T apply(T a, T slope) { return a >= T(0) ? a : a * slope; }
};

// The instructions. Binary/Unary/Scalar ops name their element function as `Fn`; kMove marks a
// pure data move (bits copied, no float interpretation).
template <class Fn, TypeSet Types, CostClass C = CostClass::kElementwise>
struct BinaryOp : OpTraits<Family::kBinary, Types, C> { using Elementwise = Fn; };
template <class Fn, TypeSet Types, CostClass C = CostClass::kElementwise>
struct UnaryOp : OpTraits<Family::kUnary, Types, C> {
  using Elementwise = Fn;
  static constexpr bool kMove = false;
};
struct CopyOp : OpTraits<Family::kUnary, kMoveTypes> {
  static constexpr bool kMove = true;
  static constexpr bool computes = false;
};
template <class Fn, TypeSet Types>
struct ScalarOp : OpTraits<Family::kScalar, Types> { using Elementwise = Fn; };
struct CompareOp : OpTraits<Family::kCompare, kArithTypes> {};
struct SelectOp : OpTraits<Family::kSelect, kMoveTypes> {};
// Reductions over the active lanes of a repeat, in lane order, in the compute type (fp32 for the
// float types, wrapping for integers); the result is rounded once to the type. A repeat without
// active lanes writes the identity: 0 for vcadd, -inf / the type's minimum for vcmax, +inf / the
// type's maximum for vcmin.
struct ReduceAdd : OpTraits<Family::kReduce, kArithTypes, CostClass::kReduce> {
  template <class T>
  static T identity() { return T(0); }
  template <class T>
  static T combine(T acc, T x) { return Add::apply(acc, x); }
};
struct ReduceMax : OpTraits<Family::kReduce, kArithTypes, CostClass::kReduce> {
  template <class T>
  static T identity() {
    if constexpr (kIsFloat<T>) return -std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::min();
  }
  template <class T>
  static T combine(T acc, T x) { return Max::apply(acc, x); }
};
struct ReduceMin : OpTraits<Family::kReduce, kArithTypes, CostClass::kReduce> {
  template <class T>
  static T identity() {
    if constexpr (kIsFloat<T>) return std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::max();
  }
  template <class T>
  static T combine(T acc, T x) { return Min::apply(acc, x); }
};
struct ConvertOp : OpTraits<Family::kConvert, kConvertTypes> {};
// Ascend's AddReluCast (CCE vaddreluconv_f322f16): the f32 sum a + b (rounded to f32), max with
// 0 (Relu: a NaN stays NaN, -0 stays -0), rounded once to f16 to nearest even (the instruction
// has no rounding mode: the conversion rules' CAST_NONE, i.e. CAST_RINT where precision is
// lost), saturating: a sum past the f16 range (+inf included) gives 65504, as the conversion
// rules' default overflow mode says (docs/assembly.md "Chip-dependent vector instructions"). A
// NaN gives the canonical f16 NaN (the sources say nothing of NaN). Returns the f16 bits.
struct AddReluConvF32ToF16 {
  static uint16_t apply(float a, float b) {
    const uint16_t h = narrow_f16_rne(Max::apply(a + b, 0.0f));
    constexpr uint16_t kInf = 0x7c00u, kMaxFinite = 0x7bffu;
    return (h & 0x7fffu) == kInf ? static_cast<uint16_t>((h & 0x8000u) | kMaxFinite) : h;
  }
};
struct AddReluConvOp : OpTraits<Family::kBinaryConvert,
                                type_bit(isa::Dtype::F16) | type_bit(isa::Dtype::F32)> {};

// Whether a V instruction of family kBinaryConvert takes the pair dst <- src (the type sets
// above admit each type alone).
constexpr bool vector_pair_ok(isa::Opcode op, isa::Dtype dst, isa::Dtype src) {
  return op != isa::Opcode::op_vaddreluconv || (dst == isa::Dtype::F16 && src == isa::Dtype::F32);
}
// Ascend's MulAddDst (CCE vmla): dst = src0 * src1 + dst. The sources give the formula and not
// the rounding; modelled (estimate) as the product rounded to the type, then the sum rounded:
// the same bits as vmul then vadd. Elem is the type's access policy (vector.cpp): its
// round-trip rounds an f16 product to f16 (an f32 product is rounded by the float multiply;
// the build has -ffp-contract=off, so no fused multiply-add).
template <class Elem>
struct MulAddDst {
  template <class T>
  static T apply(T a, T b, T acc) {
    return Add::apply(Elem::to_compute(Elem::from_compute(Mul::apply(a, b))), acc);
  }
};
struct MultiplyAccumulateOp : OpTraits<Family::kMultiplyAccumulate,
                                       type_bit(isa::Dtype::F16) | type_bit(isa::Dtype::F32)> {};
struct DupOp : OpTraits<Family::kDup, kMoveTypes> {};
struct TransposeOp : OpTraits<Family::kTranspose, 0> {};

// Calls v(Op{}) with the op type of a V instruction and returns true; returns false for an
// opcode that is not a V instruction. This switch is the only list of V instructions.
template <class Visitor>
bool visit_vector_op(isa::Opcode op, Visitor&& v) {
  using isa::Opcode;
  constexpr CostClass kTr = CostClass::kTranscendental;
  switch (op) {
    case Opcode::op_vadd: v(BinaryOp<Add, kArithTypes>{}); return true;
    case Opcode::op_vsub: v(BinaryOp<Sub, kArithTypes>{}); return true;
    case Opcode::op_vmul: v(BinaryOp<Mul, kArithTypes>{}); return true;
    case Opcode::op_vdiv: v(BinaryOp<Div, kFloatTypes, kTr>{}); return true;
    case Opcode::op_vmax: v(BinaryOp<Max, kArithTypes>{}); return true;
    case Opcode::op_vmin: v(BinaryOp<Min, kArithTypes>{}); return true;
    case Opcode::op_vand: v(BinaryOp<And, kBitwiseTypes>{}); return true;
    case Opcode::op_vor: v(BinaryOp<Or, kBitwiseTypes>{}); return true;
    case Opcode::op_vexp: v(UnaryOp<Exp, kFloatTypes, kTr>{}); return true;
    case Opcode::op_vln: v(UnaryOp<Ln, kFloatTypes, kTr>{}); return true;
    case Opcode::op_vsqrt: v(UnaryOp<Sqrt, kFloatTypes, kTr>{}); return true;
    case Opcode::op_vrsqrt: v(UnaryOp<Rsqrt, kFloatTypes, kTr>{}); return true;
    case Opcode::op_vrec: v(UnaryOp<Rec, kFloatTypes, kTr>{}); return true;
    case Opcode::op_vabs: v(UnaryOp<Abs, kSignedTypes>{}); return true;
    case Opcode::op_vrelu: v(UnaryOp<Relu, kSignedTypes>{}); return true;
    case Opcode::op_vnot: v(UnaryOp<Not, kBitwiseTypes>{}); return true;
    case Opcode::op_vcopy: v(CopyOp{}); return true;
    case Opcode::op_vadds: v(ScalarOp<Add, kArithTypes>{}); return true;
    case Opcode::op_vmuls: v(ScalarOp<Mul, kArithTypes>{}); return true;
    case Opcode::op_vmaxs: v(ScalarOp<Max, kArithTypes>{}); return true;
    case Opcode::op_vmins: v(ScalarOp<Min, kArithTypes>{}); return true;
    case Opcode::op_vlrelu: v(ScalarOp<LeakyRelu, kFloatTypes>{}); return true;
    case Opcode::op_vcmp: v(CompareOp{}); return true;
    case Opcode::op_vsel: v(SelectOp{}); return true;
    case Opcode::op_vcadd: v(ReduceAdd{}); return true;
    case Opcode::op_vcmax: v(ReduceMax{}); return true;
    case Opcode::op_vcmin: v(ReduceMin{}); return true;
    case Opcode::op_vconv: v(ConvertOp{}); return true;
    case Opcode::op_vdup: v(DupOp{}); return true;
    case Opcode::op_vtranspose: v(TransposeOp{}); return true;
    case Opcode::op_vaddreluconv: v(AddReluConvOp{}); return true;
    case Opcode::op_vmla: v(MultiplyAccumulateOp{}); return true;
    default: return false;
  }
}

}  // namespace npusim::vec
