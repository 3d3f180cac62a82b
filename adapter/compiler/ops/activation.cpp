// Activations and their gradients, streamed element-wise by ops/elementwise (one output element
// from the inputs at the same position; the inputs of a gradient op must have the same shape, as
// TF requires), plus L2Loss (a reduction, ops/reduce.h).
//
// f16/bf16 inputs are widened to f32, the whole formula is evaluated in f32 and the result is
// rounded once (TF's half kernels round after every Eigen op, so they can differ by an ulp or
// two); s32 (Relu6, ReluGrad, Relu6Grad) is computed in s32.
//
// Formulas (TF's CPU kernels, tensorflow/core/kernels/relu_op_functor.h, softplus_op.h,
// cwise_ops.h; tf.nn.gelu):
//   Relu6        min(max(x, 0), 6)
//   Elu          x < 0 ? exp(x) - 1 : x
//   Selu         x < 0 ? scale_alpha * (exp(x) - 1) : scale * x   (scale 1.0507009873554805,
//                scale_alpha = scale * 1.6732632423543772)
//   Sigmoid      1 / (1 + exp(-x))
//   Tanh         -m / (m + 2), m = expm1(-2|x|), with the sign of x; expm1(y) is evaluated as
//                (u - 1) * y / ln(u), u = exp(y) (Kahan's formula: accurate to a few ulp where
//                exp(y) - 1 would cancel; y where u == 1); |x| is clamped to 10 (tanh = 1 in f32)
//   Softplus     x > -t ? x : x < t ? exp(x) : log1p(exp(x)), t = ln(eps of T) + 2 rounded to T
//                (TF's thresholds); log1p(z) = z * ln(w) / (w - 1), w = 1 + z (Kahan)
//   Gelu         approximate = false (tf.nn.gelu's default): 0.5 x (1 + erf(x / sqrt 2)),
//                evaluated as 0.5 x erfc(-x / sqrt 2) with erfc from Numerical Recipes' erfcc
//                (relative error < 1.2e-7 for every argument; erfc(-z) = 2 - erfc(z)), which
//                stays accurate for large negative x where 1 + erf cancels;
//                approximate = true: 0.5 x (1 + tanh(y)), y = sqrt(2/pi) (x + 0.044715 x^3),
//                evaluated as x / (1 + exp(-2 y)) (the same value, no cancellation)
//   Erfc         erfc(|x|) by erfcc (as Gelu's), 2 - erfc(|x|) for x < 0
//   Erf          |x| >= 1/2: sign(x) (1 - erfc(|x|)); |x| < 1/2, where that cancels: erf's
//                Maclaurin series to x^13 (truncation below 1e-9 relative)
//   GeluGrad     g * gelu'(x)   (g, x = gradients, features; attr approximate; see gelu_grad_*)
//   ReluGrad     g * (x > 0)          (g, x = gradients, features; a product, as TF, so
//   Relu6Grad    g * (0 < x < 6)       g = inf or NaN gives NaN where the factor is 0)
//   EluGrad      y < 0 ? (y + 1) * g : g                  (g, y = gradients, outputs)
//   SeluGrad     y < 0 ? g * (y + scale_alpha) : g * scale
//   SwiGlu       silu(gate) * up = gate / (1 + exp(-gate)) * up   (inputs gate, up; Llama's
//                feed-forward; exp(-gate) = inf gives -0 * up)
//   GeGlu        gelu(gate) * up   (inputs gate, up; Gemma's feed-forward; attr approximate
//                as CANN's, an int: 1 (default) Gelu's tanh form, 0 its erf form; Gelu's
//                approximate may also be such an int: the plugin's op definition)
//   SigmoidGrad  dy * y * (1 - y)                         (inputs y, dy)
//   TanhGrad     dy * (1 - y * y)                         (inputs y, dy)
//   SoftplusGrad g / (exp(-x) + 1)                        (g, x = gradients, features)
//   LeakyRelu    x > 0 ? x : x * alpha      (attr alpha, default 0.2, rounded to T first as TF's
//                static_cast<T>(alpha); one vlrelu, whose x >= 0 ? x : x * alpha gives the same
//                value at x = +-0 and NaN)
//   LeakyReluGrad features > 0 ? g : g * alpha            (g, features = gradients, features)
//   L2Loss       sum(x * x) / 2 over all elements (f32 accumulation), a scalar
#include <cmath>
#include <cstdlib>
#include <functional>
#include <iterator>
#include <stdexcept>
#include <string_view>
#include <variant>

#include <fmt/format.h>

#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/reduce.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/vector_rows.h"
#include "common/convert.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

constexpr double kSeluScale = 1.0507009873554804934193349852946;
constexpr double kSeluScaleAlpha = 1.7580993408473768599402175208123;
constexpr double kTanhClamp = 10;  // tanh(10) = 1 - 4e-9: 1 in f32
constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kGeluTanhC = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kGeluTanhCubic = 0.044715;
// Numerical Recipes' erfcc: erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), z >= 0.
constexpr double kErfc[] = {-1.26551223, 1.00002368, 0.37409196,  0.09678418, -0.18628806,
                            0.27886807,  -1.13520398, 1.48851587, -0.82215223, 0.17087277};
// erf's Maclaurin series: erf(x) = x sum_k kErfSeries[k] x^2k, kErfSeries[k] = 2 / sqrt(pi)
// (-1)^k / (k! (2k + 1)); for |x| < 1/2 the first term left out is below 1e-9 relative.
constexpr double kErfSeries[] = {1.1283791670955126,     -0.37612638903183754,
                                 0.11283791670955126,    -0.026866170645131252,
                                 0.0052239776254421878,  -0.00085483270234508529,
                                 0.00012055332981789664};

// Scratch buffers of the compute step (f32 or s32 lanes), after the widened inputs and output:
// at most kScratch, as many as the op's compute uses (ActOp::scratch).
constexpr int kScratch = 4;
// 64-lane constants, filled in the prologue.
enum Const { kZero, kOne, kSix, kNumConsts };

// What a compute function sees: f32 (or s32) operands of `n` lanes.
struct Lanes {
  KernelBuilder& b;
  Dtype t;                      // F32 or S32
  const Reg& n;
  std::vector<uint64_t> in;     // widened inputs
  uint64_t out = 0;             // result
  // The scratch buffers: tmp[i] for i below the op's ActOp::scratch; an index beyond it is a
  // compiler bug (the buffer is not declared), thrown when the kernel is built.
  struct Scratch {
    uint64_t addr[kScratch] = {};
    int count = 0;
    uint64_t operator[](int i) const {
      if (i < 0 || i >= count)
        throw std::logic_error(
            fmt::format("activation compute reads scratch buffer {} of {} declared", i, count));
      return addr[i];
    }
  } tmp;
  uint64_t bits = 0, bits2 = 0; // compare bits
  uint64_t konst[kNumConsts] = {};

  Reg scalar(double v) { return b.reg_imm("scalar", vector_scalar_bits(t, v)); }
  void bin(Opcode op, uint64_t d, uint64_t a, uint64_t c) { vec_binary(b, op, t, d, a, c, n); }
  void un(Opcode op, uint64_t d, uint64_t a) { vec_unary(b, op, t, d, a, n); }
  void sc(Opcode op, uint64_t d, uint64_t a, double v) {
    Reg r = scalar(v);
    vec_scalar(b, op, t, d, a, r, n);
  }
  void muls(uint64_t d, uint64_t a, double v) { sc(Opcode::op_vmuls, d, a, v); }
  void adds(uint64_t d, uint64_t a, double v) { sc(Opcode::op_vadds, d, a, v); }
  // bits = a <cmp> the constant k (64 lanes, repeat stride 0).
  void cmp(isa::Cmp c, uint64_t to, uint64_t a, Const k) {
    b.emit(Opcode::op_set_mask_count, {n});
    vec_compare_strided(b, t, c, to, VOperand(a), VOperand(konst[k], 1, 0), 0);
  }
  // d = bits ? a : c.
  void sel(uint64_t d, uint64_t bits_at, VOperand a, VOperand c) {
    b.emit(Opcode::op_set_mask_count, {n});
    vec_select_strided(b, t, VOperand(d), a, c, bits_at, 0);
  }
  VOperand k(Const c) const { return VOperand(konst[c], 1, 0); }
  // bits &= bits2 (as u16 words: 8 bytes per 64 lanes).
  void and_bits() {
    Reg words = b.reg("bit words");
    b.add(words, n, kLanes32 - 1);
    b.shr(words, words, 6);
    b.shl(words, words, 2);
    vec_binary(b, Opcode::op_vand, Dtype::U16, bits, bits, bits2, words);
  }
};

using ComputeFn = std::function<void(Lanes&, DataType)>;

struct ActOp {
  const char* tf_op;
  int inputs;
  bool ints;  // also s32
  ComputeFn compute;
  // The scratch buffers (Lanes::tmp) the compute uses, 1..kScratch: each is a tile of f32 (4
  // bytes per element) in the UB, so declaring only those used leaves a larger tile.
  int scratch = kScratch;
};

// tanh(x) into d (d != x; uses tmp[0..3], bits), m = expm1(-2|x|) by Kahan's formula (the
// file's head). Every
// instruction writing a buffer none of its sources is (an operand that is both takes two bank
// accesses per block: docs/chip_model.md's bank model), so with the buffers in bank windows of
// their own (act_tile_work) no repeat meets a conflict; the same instructions on the same
// values as the in-place form.
void tanh_lanes(Lanes& l, uint64_t d, uint64_t x) {
  l.un(Opcode::op_vabs, l.tmp[0], x);
  l.sc(Opcode::op_vmins, l.tmp[1], l.tmp[0], kTanhClamp);
  l.muls(l.tmp[0], l.tmp[1], -2);                         // y = -2|x|
  l.un(Opcode::op_vexp, l.tmp[2], l.tmp[0]);              // u
  l.adds(l.tmp[3], l.tmp[2], -1);                         // u - 1
  l.bin(Opcode::op_vmul, l.tmp[1], l.tmp[3], l.tmp[0]);   // (u - 1) y
  l.un(Opcode::op_vln, l.tmp[3], l.tmp[2]);               // ln u
  l.bin(Opcode::op_vdiv, d, l.tmp[1], l.tmp[3]);
  l.cmp(isa::Cmp::EQ, l.bits, l.tmp[2], kOne);            // u == 1: expm1(y) = y
  l.sel(l.tmp[1], l.bits, VOperand(l.tmp[0]), VOperand(d));  // m = expm1(y)
  l.adds(l.tmp[0], l.tmp[1], 2);
  l.bin(Opcode::op_vdiv, l.tmp[2], l.tmp[1], l.tmp[0]);   // m / (m + 2) = -tanh|x|
  l.muls(l.tmp[3], l.tmp[2], -1);                         // tanh|x|
  l.cmp(isa::Cmp::LT, l.bits, x, kZero);
  l.sel(d, l.bits, VOperand(l.tmp[2]), VOperand(l.tmp[3]));
}

// v rounded to float type dt (as TF's static_cast<T> of a double attribute or constant).
double round_to(DataType dt, double v) {
  const float f = static_cast<float>(v);
  if (dt == DataType::F16) return widen_f16(narrow_f16_rne(f));
  if (dt == DataType::BF16) return widen_bf16(narrow_bf16_rne(f));
  return f;
}

// The threshold of TF's Softplus for type dt: ln(eps) + 2, each step rounded to dt.
double softplus_threshold(DataType dt) {
  auto round = [dt](double v) { return round_to(dt, v); };
  const double eps = dt == DataType::F16 ? std::ldexp(1.0, -10)
                     : dt == DataType::BF16 ? std::ldexp(1.0, -7)
                                            : std::ldexp(1.0, -23);
  return round(round(std::log(eps)) + 2);
}

// erfc(z) for z = |v| * scale of the lanes at v, into d (uses tmp[1..3]; v is read first and d
// written last, so d may be v). scale 1 takes no multiplication.
void erfc_abs(Lanes& l, uint64_t d, uint64_t v, double scale) {
  l.un(Opcode::op_vabs, l.tmp[1], v);
  if (scale != 1) l.muls(l.tmp[1], l.tmp[1], scale);      // z
  l.muls(l.tmp[2], l.tmp[1], 0.5);
  l.adds(l.tmp[2], l.tmp[2], 1);
  l.un(Opcode::op_vrec, l.tmp[2], l.tmp[2]);              // t
  l.sc(Opcode::op_vmuls, l.tmp[3], l.tmp[2], kErfc[9]);   // Horner: P(t) without kErfc[0]
  for (int i = 8; i >= 1; --i) {
    l.adds(l.tmp[3], l.tmp[3], kErfc[i]);
    l.bin(Opcode::op_vmul, l.tmp[3], l.tmp[3], l.tmp[2]);
  }
  l.adds(l.tmp[3], l.tmp[3], kErfc[0]);
  l.bin(Opcode::op_vmul, l.tmp[1], l.tmp[1], l.tmp[1]);   // z^2
  l.bin(Opcode::op_vsub, l.tmp[3], l.tmp[3], l.tmp[1]);
  l.un(Opcode::op_vexp, l.tmp[3], l.tmp[3]);
  l.bin(Opcode::op_vmul, d, l.tmp[2], l.tmp[3]);
}

const ActOp kOps[] = {
    {"Relu6", 1, true,
     [](Lanes& l, DataType) {
       l.sc(Opcode::op_vmaxs, l.out, l.in[0], 0);
       l.sc(Opcode::op_vmins, l.out, l.out, 6);
     }},
    {"Elu", 1, false,
     [](Lanes& l, DataType) {
       l.un(Opcode::op_vexp, l.tmp[0], l.in[0]);
       l.adds(l.tmp[0], l.tmp[0], -1);
       l.cmp(isa::Cmp::LT, l.bits, l.in[0], kZero);
       l.sel(l.out, l.bits, VOperand(l.tmp[0]), VOperand(l.in[0]));
     }},
    {"Selu", 1, false,
     [](Lanes& l, DataType) {
       l.un(Opcode::op_vexp, l.tmp[0], l.in[0]);
       l.adds(l.tmp[0], l.tmp[0], -1);
       l.muls(l.tmp[0], l.tmp[0], kSeluScaleAlpha);
       l.muls(l.tmp[1], l.in[0], kSeluScale);
       l.cmp(isa::Cmp::LT, l.bits, l.in[0], kZero);
       l.sel(l.out, l.bits, VOperand(l.tmp[0]), VOperand(l.tmp[1]));
     }},
    {"Tanh", 1, false, [](Lanes& l, DataType) { tanh_lanes(l, l.out, l.in[0]); }},
    {"Softplus", 1, false,
     [](Lanes& l, DataType dt) {
       const double th = softplus_threshold(dt);
       const uint64_t x = l.in[0];
       l.un(Opcode::op_vexp, l.tmp[0], x);                        // z
       l.adds(l.tmp[1], l.tmp[0], 1);                             // w
       l.un(Opcode::op_vln, l.tmp[2], l.tmp[1]);
       l.bin(Opcode::op_vmul, l.tmp[2], l.tmp[2], l.tmp[0]);      // z ln w
       l.adds(l.tmp[1], l.tmp[1], -1);                            // w - 1
       l.bin(Opcode::op_vdiv, l.tmp[2], l.tmp[2], l.tmp[1]);      // log1p(z)
       // x < t: exp(x); x > -t: x (compared against 64-lane constants in tmp[3]).
       vec_fill32(l.b, l.tmp[3], f32_to_bits(static_cast<float>(th)), l.n);
       l.b.emit(Opcode::op_set_mask_count, {l.n});
       vec_compare_strided(l.b, Dtype::F32, isa::Cmp::LT, l.bits, VOperand(x),
                           VOperand(l.tmp[3]), 0);
       l.sel(l.tmp[2], l.bits, VOperand(l.tmp[0]), VOperand(l.tmp[2]));
       vec_fill32(l.b, l.tmp[3], f32_to_bits(static_cast<float>(-th)), l.n);
       l.b.emit(Opcode::op_set_mask_count, {l.n});
       vec_compare_strided(l.b, Dtype::F32, isa::Cmp::GT, l.bits, VOperand(x),
                           VOperand(l.tmp[3]), 0);
       l.sel(l.out, l.bits, VOperand(x), VOperand(l.tmp[2]));
     }},
    {"Erfc", 1, false,
     [](Lanes& l, DataType) {
       const uint64_t x = l.in[0];
       erfc_abs(l, l.tmp[0], x, 1);                             // erfc(|x|)
       l.muls(l.tmp[1], l.tmp[0], -1);
       l.adds(l.tmp[1], l.tmp[1], 2);                           // erfc(x) = 2 - erfc(-x)
       l.cmp(isa::Cmp::LT, l.bits, x, kZero);
       l.sel(l.out, l.bits, VOperand(l.tmp[1]), VOperand(l.tmp[0]));
     }},
    {"Erf", 1, false,
     [](Lanes& l, DataType) {
       const uint64_t x = l.in[0];
       // |x| >= 1/2: sign(x) (1 - erfc(|x|)).
       erfc_abs(l, l.tmp[0], x, 1);
       l.adds(l.tmp[1], l.tmp[0], -1);                          // -erf(|x|)
       l.muls(l.tmp[2], l.tmp[1], -1);                          // erf(|x|)
       l.cmp(isa::Cmp::LT, l.bits, x, kZero);
       l.sel(l.tmp[0], l.bits, VOperand(l.tmp[1]), VOperand(l.tmp[2]));
       // |x| < 1/2, where 1 - erfc cancels: the series x sum_k kErfSeries[k] x^2k by Horner.
       l.bin(Opcode::op_vmul, l.tmp[1], x, x);
       constexpr int kLast = static_cast<int>(std::size(kErfSeries)) - 1;
       l.muls(l.tmp[2], l.tmp[1], kErfSeries[kLast]);
       for (int k = kLast - 1; k >= 1; --k) {
         l.adds(l.tmp[2], l.tmp[2], kErfSeries[k]);
         l.bin(Opcode::op_vmul, l.tmp[2], l.tmp[2], l.tmp[1]);
       }
       l.adds(l.tmp[2], l.tmp[2], kErfSeries[0]);
       l.bin(Opcode::op_vmul, l.tmp[2], l.tmp[2], x);
       l.un(Opcode::op_vabs, l.tmp[3], x);
       l.muls(l.tmp[3], l.tmp[3], 2);
       l.cmp(isa::Cmp::LT, l.bits, l.tmp[3], kOne);             // 2|x| < 1
       l.sel(l.out, l.bits, VOperand(l.tmp[2]), VOperand(l.tmp[0]));
     }},
    {"ReluGrad", 2, true,
     [](Lanes& l, DataType) {
       l.cmp(isa::Cmp::GT, l.bits, l.in[1], kZero);
       l.sel(l.tmp[0], l.bits, l.k(kOne), l.k(kZero));
       l.bin(Opcode::op_vmul, l.out, l.in[0], l.tmp[0]);
     },
     1},
    {"Relu6Grad", 2, true,
     [](Lanes& l, DataType) {
       l.cmp(isa::Cmp::GT, l.bits, l.in[1], kZero);
       l.cmp(isa::Cmp::LT, l.bits2, l.in[1], kSix);
       l.and_bits();
       l.sel(l.tmp[0], l.bits, l.k(kOne), l.k(kZero));
       l.bin(Opcode::op_vmul, l.out, l.in[0], l.tmp[0]);
     },
     1},
    {"EluGrad", 2, false,
     [](Lanes& l, DataType) {
       l.adds(l.tmp[0], l.in[1], 1);
       l.bin(Opcode::op_vmul, l.tmp[0], l.tmp[0], l.in[0]);
       l.cmp(isa::Cmp::LT, l.bits, l.in[1], kZero);
       l.sel(l.out, l.bits, VOperand(l.tmp[0]), VOperand(l.in[0]));
     }},
    {"SeluGrad", 2, false,
     [](Lanes& l, DataType) {
       l.adds(l.tmp[0], l.in[1], kSeluScaleAlpha);
       l.bin(Opcode::op_vmul, l.tmp[0], l.in[0], l.tmp[0]);
       l.muls(l.tmp[1], l.in[0], kSeluScale);
       l.cmp(isa::Cmp::LT, l.bits, l.in[1], kZero);
       l.sel(l.out, l.bits, VOperand(l.tmp[0]), VOperand(l.tmp[1]));
     }},
    // SwiGlu(gate, up): silu(gate) * up = gate / (1 + exp(-gate)) * up (Llama's feed-forward).
    {"SwiGlu", 2, false,
     [](Lanes& l, DataType) {
       l.muls(l.tmp[0], l.in[0], -1);
       l.un(Opcode::op_vexp, l.tmp[0], l.tmp[0]);
       l.adds(l.tmp[0], l.tmp[0], 1);
       l.bin(Opcode::op_vdiv, l.tmp[0], l.in[0], l.tmp[0]);
       l.bin(Opcode::op_vmul, l.out, l.tmp[0], l.in[1]);
     }},
    {"SigmoidGrad", 2, false,
     [](Lanes& l, DataType) {
       l.bin(Opcode::op_vmul, l.tmp[0], l.in[1], l.in[0]);  // dy * y
       l.muls(l.tmp[1], l.in[0], -1);
       l.adds(l.tmp[1], l.tmp[1], 1);                        // 1 - y
       l.bin(Opcode::op_vmul, l.out, l.tmp[0], l.tmp[1]);
     }},
    {"TanhGrad", 2, false,
     [](Lanes& l, DataType) {
       l.bin(Opcode::op_vmul, l.tmp[0], l.in[0], l.in[0]);
       l.muls(l.tmp[0], l.tmp[0], -1);
       l.adds(l.tmp[0], l.tmp[0], 1);                        // 1 - y * y
       l.bin(Opcode::op_vmul, l.out, l.in[1], l.tmp[0]);
     }},
    {"SoftplusGrad", 2, false,
     [](Lanes& l, DataType) {
       l.muls(l.tmp[0], l.in[1], -1);
       l.un(Opcode::op_vexp, l.tmp[0], l.tmp[0]);
       l.adds(l.tmp[0], l.tmp[0], 1);
       l.bin(Opcode::op_vdiv, l.out, l.in[0], l.tmp[0]);
     }},
};

// Sigmoid 1 / (1 + exp(-x)): the four f32 steps of CANN's kernels (ops-nn's Ascend C Sigmoid
// and the TBE sigmoid.py on the 910B: Muls -1, Exp, Adds 1, then 1 / s; CANN divides a tile of
// ones, npusim takes vrec, the same quotient), after the widening of f16 / bf16 as theirs.
// sigmoid_in_place: every step writes the buffer it reads (CANN's kernels do, on one buffer);
// in the bank model (docs/chip_model.md) such an operand takes two accesses per bank each
// repeat, doubling the repeat time of every step but the first. sigmoid_alternating: the same
// instructions on the same values, each writing a buffer it does not read (out and one
// scratch, in bank windows of their own: act_tile_work), so no repeat meets a conflict;
// outputs bit-identical.
void sigmoid_in_place(Lanes& l, DataType) {
  l.muls(l.out, l.in[0], -1);
  l.un(Opcode::op_vexp, l.out, l.out);
  l.adds(l.out, l.out, 1);
  l.un(Opcode::op_vrec, l.out, l.out);
}

void sigmoid_alternating(Lanes& l, DataType) {
  l.muls(l.tmp[0], l.in[0], -1);                 // -x
  l.un(Opcode::op_vexp, l.out, l.tmp[0]);        // exp(-x)
  l.adds(l.tmp[0], l.out, 1);                    // 1 + exp(-x)
  l.un(Opcode::op_vrec, l.out, l.tmp[0]);
}

// Whether Sigmoid alternates its buffers (sigmoid_alternating): unless
// NPUSIM_SIGMOID_ALTERNATE_BUFFERS=0 (read at every compile of a Sigmoid; unset, empty or "1" is
// on, anything else a CompileError naming the op), which gives the in-place steps and the four
// scratch tiles of before back, for comparison.
bool sigmoid_alternates(const OpDesc& op) {
  const char* v = std::getenv("NPUSIM_SIGMOID_ALTERNATE_BUFFERS");
  if (!v || !*v || std::string_view(v) == "1") return true;
  if (std::string_view(v) == "0") return false;
  op.fail(fmt::format("NPUSIM_SIGMOID_ALTERNATE_BUFFERS='{}' is neither '0' nor '1'", v));
}

// Gelu: attr approximate selects the formula.
void gelu_exact(Lanes& l, DataType) {
  const uint64_t x = l.in[0];
  erfc_abs(l, l.tmp[0], x, kSqrtHalf);                      // erfc(|x| / sqrt 2)
  l.muls(l.tmp[1], l.tmp[0], -1);
  l.adds(l.tmp[1], l.tmp[1], 2);                            // 2 - erfc: x >= 0
  l.cmp(isa::Cmp::LT, l.bits, x, kZero);
  l.sel(l.tmp[0], l.bits, VOperand(l.tmp[0]), VOperand(l.tmp[1]));
  l.bin(Opcode::op_vmul, l.out, x, l.tmp[0]);
  l.muls(l.out, l.out, 0.5);
}

void gelu_tanh(Lanes& l, DataType) {
  // Alternating between tmp[0] and tmp[1]: no instruction writes a buffer it reads (as
  // tanh_lanes).
  const uint64_t x = l.in[0];
  l.bin(Opcode::op_vmul, l.tmp[0], x, x);
  l.bin(Opcode::op_vmul, l.tmp[1], l.tmp[0], x);
  l.muls(l.tmp[0], l.tmp[1], kGeluTanhCubic);
  l.bin(Opcode::op_vadd, l.tmp[1], l.tmp[0], x);
  l.muls(l.tmp[0], l.tmp[1], -2 * kGeluTanhC);              // -2 y
  l.un(Opcode::op_vexp, l.tmp[1], l.tmp[0]);
  l.adds(l.tmp[0], l.tmp[1], 1);
  l.bin(Opcode::op_vdiv, l.out, x, l.tmp[0]);
}

// GeGlu(gate, up): gelu(gate) * up, gelu written to l.out (from in[0] alone, its last step)
// then multiplied in place.
void geglu_tanh(Lanes& l, DataType dt) {
  gelu_tanh(l, dt);
  l.bin(Opcode::op_vmul, l.out, l.out, l.in[1]);
}

void geglu_exact(Lanes& l, DataType dt) {
  gelu_exact(l, dt);
  l.bin(Opcode::op_vmul, l.out, l.out, l.in[1]);
}

// GeluGrad (inputs gradients g, features x; attr approximate as Gelu): g * d gelu(x) / dx.
//   exact:       Phi(x) + x * exp(-x^2 / 2) / sqrt(2 pi), Phi(x) = 0.5 erfc(-x / sqrt 2)
//   approximate: 0.5 (1 + t) + 0.5 x (1 - t^2) y', t = tanh(y), y = c (x + 0.044715 x^3),
//                y' = c (1 + 3 * 0.044715 x^2), c = sqrt(2 / pi); evaluated with
//                e = exp(-2y) (clamped to exp(80)): 0.5 (1 + t) = 1 / (1 + e) and
//                0.5 (1 - t^2) = 2 e / (1 + e)^2, so no 1 - t^2 cancellation.
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)

void gelu_grad_exact(Lanes& l, DataType) {
  const uint64_t g = l.in[0], x = l.in[1];
  erfc_abs(l, l.tmp[0], x, kSqrtHalf);                      // erfc(|x| / sqrt 2)
  l.muls(l.tmp[1], l.tmp[0], -1);
  l.adds(l.tmp[1], l.tmp[1], 2);                            // 2 - erfc: x >= 0
  l.cmp(isa::Cmp::LT, l.bits, x, kZero);
  l.sel(l.tmp[0], l.bits, VOperand(l.tmp[0]), VOperand(l.tmp[1]));
  l.muls(l.tmp[0], l.tmp[0], 0.5);                          // Phi(x)
  l.bin(Opcode::op_vmul, l.tmp[1], x, x);
  l.muls(l.tmp[1], l.tmp[1], -0.5);
  l.un(Opcode::op_vexp, l.tmp[1], l.tmp[1]);
  l.muls(l.tmp[1], l.tmp[1], kInvSqrt2Pi);                  // phi(x)
  l.bin(Opcode::op_vmul, l.tmp[1], l.tmp[1], x);
  l.bin(Opcode::op_vadd, l.tmp[0], l.tmp[0], l.tmp[1]);
  l.bin(Opcode::op_vmul, l.out, g, l.tmp[0]);
}

void gelu_grad_tanh(Lanes& l, DataType) {
  const uint64_t g = l.in[0], x = l.in[1];
  l.bin(Opcode::op_vmul, l.tmp[0], x, x);                   // x^2
  l.muls(l.tmp[1], l.tmp[0], kGeluTanhCubic);
  l.adds(l.tmp[1], l.tmp[1], 1);
  l.bin(Opcode::op_vmul, l.tmp[1], l.tmp[1], x);
  l.muls(l.tmp[1], l.tmp[1], -2 * kGeluTanhC);              // -2 y
  l.sc(Opcode::op_vmins, l.tmp[1], l.tmp[1], 80);
  l.un(Opcode::op_vexp, l.tmp[1], l.tmp[1]);                // e
  l.muls(l.tmp[0], l.tmp[0], 3 * kGeluTanhCubic);
  l.adds(l.tmp[0], l.tmp[0], 1);
  l.muls(l.tmp[0], l.tmp[0], kGeluTanhC);                   // y'
  l.adds(l.tmp[2], l.tmp[1], 1);                            // 1 + e
  l.un(Opcode::op_vrec, l.tmp[3], l.tmp[2]);                // 0.5 (1 + t)
  l.bin(Opcode::op_vmul, l.tmp[2], l.tmp[2], l.tmp[2]);
  l.bin(Opcode::op_vdiv, l.tmp[2], l.tmp[1], l.tmp[2]);     // e / (1 + e)^2 (0 when it overflows)
  l.bin(Opcode::op_vmul, l.tmp[2], l.tmp[2], l.tmp[0]);
  l.bin(Opcode::op_vmul, l.tmp[2], l.tmp[2], x);
  l.muls(l.tmp[2], l.tmp[2], 2);                            // 0.5 x (1 - t^2) y'
  l.bin(Opcode::op_vadd, l.tmp[2], l.tmp[2], l.tmp[3]);
  l.bin(Opcode::op_vmul, l.out, g, l.tmp[2]);
}

// Gelu's / GeGlu's form from attribute approximate: a bool (tf.nn.gelu's; Gelu through
// `npusim op`) or an int (CANN's, the plugin's Gelu and GeGlu op definitions: 1 the tanh form,
// 0 the erf form); absent: `fallback`.
bool approximate_attr(const OpDesc& op, bool fallback) {
  auto it = op.attrs.find("approximate");
  if (it != op.attrs.end() && std::holds_alternative<int64_t>(it->second))
    return op.attr_int("approximate", 0) != 0;
  return op.attr_bool("approximate", fallback);
}

int64_t const_bits(Dtype t, double v) {
  return t == Dtype::F32 ? static_cast<int64_t>(f32_to_bits(static_cast<float>(v)))
                         : static_cast<int64_t>(v);
}

CompiledKernel compile_l2loss(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 1) op.fail(fmt::format("takes 1 input, {} given", op.inputs.size()));
  const TensorDesc& x = op.inputs[0];
  if (auto t = op.attr_type("T"); t && *t != x.dtype)
    op.fail(fmt::format("attribute T = {} does not match the input's {}", data_type_name(*t),
                        data_type_name(x.dtype)));
  if (!data_type_is_float(x.dtype))
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16)", data_type_name(x.dtype)));
  ReduceRequest req;
  req.kind = ReduceKind::kSum;
  req.input = x;
  req.reduced.assign(x.shape.size(), true);
  req.out_type = x.dtype;
  req.square = true;
  req.scale = 0.5;
  LaunchPlan plan({TensorDesc{x.dtype, {}}});
  if (x.num_elements() == 0) {
    // The sum of nothing: a zero scalar.
    req.input.shape = {0};
    req.reduced = {true};
  }
  append_reduce(plan, ctx, req, LaunchPlan::input(0), LaunchPlan::output(0));
  return std::move(plan).finish();
}

// The tile work of `kind` on operands and a result of type dt (f32, f16, bf16, or s32 where the
// op takes it): spec.temps, spec.prologue and spec.compute; reads TileOperands::in, writes out.
void act_tile_work(const ActOp& kind, DataType dt, StreamSpec& spec) {
  const Dtype type = device_dtype(dt);
  const Dtype ct = dt == DataType::S32 ? Dtype::S32 : Dtype::F32;
  const bool widen = type != ct;
  const int n_in = kind.inputs;
  // Temporaries: widened inputs and result (when widening), scratch, two bit rows, constants.
  // UB bank windows (StreamSpec): the compute's operands of its type ct, inputs, result and
  // scratch, start in windows 0, 1, ... in that order (taken modulo the windows the chip has),
  // so that an instruction combining distinct ones meets no bank conflict; when widening, the
  // stream's own tiles (read and written by the conversions only) come after them.
  spec.temps.clear();
  const int n_wide = widen ? n_in + 1 : 0;
  for (int i = 0; i < n_wide; ++i)
    spec.temps.push_back(TempSpec{fmt::format("f32 {}", i), 4, 0, i});
  const int n_scratch = kind.scratch;
  if (n_scratch < 1 || n_scratch > kScratch)
    throw std::logic_error(fmt::format("activation {}: {} scratch buffers (1..{})", kind.tf_op,
                                       n_scratch, kScratch));
  for (int i = 0; i < n_scratch; ++i)
    spec.temps.push_back(TempSpec{fmt::format("scratch {}", i), 4, 0, n_in + 1 + i});
  // The stream's tiles: spec.inputs as the caller set them (none for a fused step's work).
  const int first_stream = widen ? n_in + 1 + n_scratch : 0;
  for (size_t i = 0; i < spec.inputs.size(); ++i)
    spec.inputs[i].window = first_stream + static_cast<int>(i);
  spec.out_window = first_stream + n_in;
  spec.temps.push_back(TempSpec{"compare bits", 1.0 / 8, 32});
  spec.temps.push_back(TempSpec{"compare bits 2", 1.0 / 8, 32});
  for (int i = 0; i < kNumConsts; ++i)
    spec.temps.push_back(TempSpec{fmt::format("constant {}", i), 0, kSlotBytes});
  const size_t first_const = spec.temps.size() - kNumConsts;
  spec.prologue = [ct, first_const](KernelBuilder& b, const std::vector<uint64_t>& temp) {
    const double values[kNumConsts] = {0, 1, 6};
    for (int i = 0; i < kNumConsts; ++i)
      vec_fill32(b, temp[first_const + static_cast<size_t>(i)], const_bits(ct, values[i]),
                 kLanes32);
  };
  const ComputeFn compute = kind.compute;
  spec.compute = [=](KernelBuilder& b, const TileOperands& t) {
    Lanes l{b, ct, *t.count, {}, 0, {}, 0, 0, {}};
    size_t next = 0;
    for (int i = 0; i < n_in; ++i) {
      if (widen) {
        const uint64_t w = t.temp[next++];
        vec_convert(b, ct, type, w, t.in[static_cast<size_t>(i)], RoundMode::kRint, *t.count);
        l.in.push_back(w);
      } else {
        l.in.push_back(t.in[static_cast<size_t>(i)]);
      }
    }
    l.out = widen ? t.temp[next++] : t.out;
    l.tmp.count = n_scratch;
    for (int i = 0; i < n_scratch; ++i) l.tmp.addr[i] = t.temp[next++];
    l.bits = t.temp[next++];
    l.bits2 = t.temp[next++];
    for (int i = 0; i < kNumConsts; ++i) l.konst[i] = t.temp[next++];
    compute(l, dt);
    if (widen) vec_convert(b, type, ct, t.out, l.out, RoundMode::kRint, *t.count);
  };
}

}  // namespace

int activation_tile_work(const std::string& tf_op, Dtype type, StreamSpec& spec) {
  // ReluGrad, the one taken as a step so far (elementwise.h), on float types.
  if (tf_op != "ReluGrad" || (type != Dtype::F32 && type != Dtype::F16 && type != Dtype::BF16))
    return 0;
  for (const ActOp& k : kOps)
    if (tf_op == k.tf_op) {
      act_tile_work(k, from_device_dtype(type), spec);
      return k.inputs;
    }
  return 0;
}

CompiledKernel compile_activation(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.type == "L2Loss") return compile_l2loss(ctx);
  ActOp gelu{"Gelu", 1, false, approximate_attr(op, false) ? gelu_tanh : gelu_exact};
  ActOp gelu_grad{"GeluGrad", 2, false,
                  approximate_attr(op, false) ? gelu_grad_tanh : gelu_grad_exact};
  ActOp geglu{"GeGlu", 2, false, approximate_attr(op, true) ? geglu_tanh : geglu_exact};
  // LeakyRelu's slope: TF's attribute alpha (default 0.2), rounded to the operands' type.
  const double alpha = op.attr_float("alpha", 0.2);
  ActOp leaky_relu{"LeakyRelu", 1, false,
                   [alpha](Lanes& l, DataType dt) {
                     l.sc(Opcode::op_vlrelu, l.out, l.in[0], round_to(dt, alpha));
                   },
                   1};
  ActOp leaky_relu_grad{"LeakyReluGrad", 2, false,
                        [alpha](Lanes& l, DataType dt) {
                          l.muls(l.tmp[0], l.in[0], round_to(dt, alpha));
                          l.cmp(isa::Cmp::GT, l.bits, l.in[1], kZero);
                          l.sel(l.out, l.bits, VOperand(l.in[0]), VOperand(l.tmp[0]));
                        },
                        1};
  const ActOp sigmoid =
      op.type == "Sigmoid" && sigmoid_alternates(op)
          ? ActOp{"Sigmoid", 1, false, sigmoid_alternating, 1}
          : ActOp{"Sigmoid", 1, false, sigmoid_in_place};
  const ActOp* kind = op.type == "Gelu"       ? &gelu
                      : op.type == "GeluGrad" ? &gelu_grad
                      : op.type == "GeGlu"    ? &geglu
                      : op.type == "Sigmoid"  ? &sigmoid
                      : op.type == "LeakyRelu" ? &leaky_relu
                      : op.type == "LeakyReluGrad" ? &leaky_relu_grad
                                              : nullptr;
  for (const ActOp& k : kOps)
    if (op.type == k.tf_op) kind = &k;
  if (!kind) op.fail("internal: not an activation op");
  if (op.inputs.size() != static_cast<size_t>(kind->inputs))
    op.fail(fmt::format("takes {} input(s), {} given", kind->inputs, op.inputs.size()));
  const DataType dt = op.inputs[0].dtype;
  for (const TensorDesc& in : op.inputs) {
    if (in.dtype != dt)
      op.fail(fmt::format("inputs have different dtypes ({} and {})", data_type_name(dt),
                          data_type_name(in.dtype)));
    if (in.shape != op.inputs[0].shape)
      op.invalid(fmt::format("inputs must have the same shape ({} and {})",
                             shape_str(op.inputs[0].shape), shape_str(in.shape)));
  }
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the inputs' {}", data_type_name(*t),
                        data_type_name(dt)));
  if (!data_type_is_float(dt) && !(kind->ints && dt == DataType::S32))
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16{})", data_type_name(dt),
                        kind->ints ? ", s32" : ""));
  const TensorDesc out = op.inputs[0];
  StreamSpec spec;
  spec.kernel_name = fmt::format("{}_{}", op.type, data_type_name(dt));
  spec.inputs = stream_inputs(op.inputs, out.shape);
  spec.out_type = device_dtype(dt);
  spec.out_shape = out.shape;
  act_tile_work(*kind, dt, spec);
  return stream_kernel(ctx, out, spec);
}

}  // namespace npusim::compiler::ops
