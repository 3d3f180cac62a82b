// The fused optimizer updates of TF1 / tf-keras (training_ops): ResourceApplyGradientDescent,
// ResourceApplyMomentum, ResourceApplyAdam (and their ref-variable forms ApplyGradientDescent,
// ApplyMomentum, ApplyAdam), types f32, f16, bf16.
//
// Contract (docs/compiler.md "Optimizer updates"): the variables (var, accum, m, v) are plain
// tensors (the plugin passes the variable's buffer); the updated values are the op's OUTPUTS,
// in this order: var (GradientDescent), var, accum (Momentum), var, m, v (Adam). The kernels
// are element-wise streams that read each element before writing the same element, never
// reading an output position written by another core, so output i may alias its variable's
// input (the plugin may pass the variable buffer as the output: an in-place update); this is
// the one exception to the "outputs must not alias inputs" rule of op_desc.h, tested.
// Scalars (lr, alpha, momentum, beta1_power, ...) are single-element tensors in GM of the
// variable's type, broadcast by the streaming kernel.
//
// Numerics: each step is one vector instruction in the variable's type, in TF's CPU functor
// order (training_ops.cc), so f32 results are bit-identical with TF's (no FMA contraction) and
// f16 / bf16 round after every operation as Eigen's half types do:
//   GradientDescent: var - delta * alpha
//   Momentum:        accum' = accum * momentum + grad
//                    var' = var - accum' * lr                      (TF: lr * accum, the same)
//                    nesterov: var' = var - (grad * lr + accum' * momentum * lr)
//   Adam:            alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power)
//                    m' = m + (grad - m) * (1 - beta1)
//                    v' = v + (grad * grad - v) * (1 - beta2)
//                    var' = var - (m' * alpha) / (sqrt(v') + epsilon)
//                    nesterov: var' = var - ((grad * (1 - beta1) + beta1 * m') * alpha)
//                                           / (sqrt(v') + epsilon)
// One launch per update: a stream over var's elements reading every input and writing every
// output per tile (several outputs, elementwise.h). Momentum computes accum' first and var'
// from it; Adam computes m', v', then var' from them, in the UB (the scalar expressions are
// recomputed per tile from the broadcast scalars: a few vector instructions per tile).
#include <array>

#include <fmt/format.h>

#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

struct Operand {
  const char* name;
  bool scalar;
};

// The TF input lists.
const std::vector<Operand> kGradientDescent = {{"var", false}, {"alpha", true}, {"delta", false}};
const std::vector<Operand> kMomentum = {
    {"var", false}, {"accum", false}, {"lr", true}, {"grad", false}, {"momentum", true}};
const std::vector<Operand> kAdam = {
    {"var", false}, {"m", false},    {"v", false},    {"beta1_power", true}, {"beta2_power", true},
    {"lr", true},   {"beta1", true}, {"beta2", true}, {"epsilon", true},     {"grad", false}};

// Checks op.inputs against the input list of `base` (the op type without "Resource") and
// returns it: every input of var's float type, the scalars single elements, the others var's
// shape.
const std::vector<Operand>& checked_inputs(const OpDesc& op, const std::string& base) {
  const std::vector<Operand>* sig = base == "ApplyGradientDescent" ? &kGradientDescent
                                    : base == "ApplyMomentum"      ? &kMomentum
                                    : base == "ApplyAdam"          ? &kAdam
                                                                   : nullptr;
  if (!sig) op.fail("internal: not an optimizer op");
  if (op.inputs.size() != sig->size())
    op.fail(fmt::format("takes {} inputs, {} given", sig->size(), op.inputs.size()));
  const TensorDesc& var = op.inputs[0];
  const DataType dt = var.dtype;
  if (!data_type_is_float(dt))
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16)", data_type_name(dt)));
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match var's {}", data_type_name(*t),
                        data_type_name(dt)));
  for (size_t i = 0; i < sig->size(); ++i) {
    const TensorDesc& in = op.inputs[i];
    const Operand& o = (*sig)[i];
    if (in.dtype != dt)
      op.fail(
          fmt::format("{} is {}, var is {}", o.name, data_type_name(in.dtype), data_type_name(dt)));
    if (o.scalar ? in.num_elements() != 1 : in.shape != var.shape)
      op.invalid(
          fmt::format("{} {} must {}", o.name, shape_str(in.shape),
                      o.scalar ? "be a scalar" : "have var's shape " + shape_str(var.shape)));
  }
  return *sig;
}

// The vector operations of the updates over `n` elements of UB tiles, in the variable's type;
// bf16 on a chip without bf16 arithmetic (widens_bf16) computed in f32 through the scratch
// tiles `wide` and rounded to bf16 after every operation, as the native instructions round.
class UpdateMath {
 public:
  UpdateMath(Dtype type, bool widen, std::array<uint64_t, 2> wide = {})
      : m_type(type), m_widen(widen), m_wide(wide) {}
  void bin(KernelBuilder& b, Opcode o, uint64_t d, uint64_t x, uint64_t y, const Reg& n) const {
    if (m_widen) return vec_binary_bf16_in_f32(b, o, d, x, y, m_wide[0], m_wide[1], n);
    vec_binary(b, o, m_type, d, x, y, n);
  }
  void sqrt(KernelBuilder& b, uint64_t d, uint64_t x, const Reg& n) const {
    if (m_widen) return vec_unary_bf16_in_f32(b, Opcode::op_vsqrt, d, x, m_wide[0], n);
    vec_unary(b, Opcode::op_vsqrt, m_type, d, x, n);
  }
  // 1 - x into dst (x a tile of the broadcast scalar): -x exact, then + 1 rounded once.
  void one_minus(KernelBuilder& b, uint64_t dst, uint64_t x, const Reg& n) const {
    const Dtype t = m_widen ? Dtype::F32 : m_type;
    Reg minus_one = b.reg_imm("-1", vector_scalar_bits(t, -1.0));
    Reg one = b.reg_imm("1", vector_scalar_bits(t, 1.0));
    const uint64_t w = m_widen ? m_wide[0] : dst;
    if (m_widen) vec_convert(b, Dtype::F32, m_type, w, x, RoundMode::kRint, n);
    vec_scalar(b, Opcode::op_vmuls, t, w, m_widen ? w : x, minus_one, n);
    vec_scalar(b, Opcode::op_vadds, t, w, w, one, n);
    if (m_widen) vec_convert(b, m_type, Dtype::F32, dst, w, RoundMode::kRint, n);
  }

 private:
  Dtype m_type;
  bool m_widen;
  std::array<uint64_t, 2> m_wide;
};

// One tile of an update: t.in[i] is TF input i, t.outs[j] output j, t.temp the temporaries.
using UpdateTile = void (*)(KernelBuilder& b, const TileOperands& t, const UpdateMath& m,
                            bool nesterov);

// in: var, alpha, delta. out: var'.
void gradient_descent_tile(KernelBuilder& b, const TileOperands& t, const UpdateMath& m, bool) {
  const Reg& n = *t.count;
  m.bin(b, Opcode::op_vmul, t.outs[0], t.in[2], t.in[1], n);
  m.bin(b, Opcode::op_vsub, t.outs[0], t.in[0], t.outs[0], n);
}

// in: var, accum, lr, grad, momentum. out: var', accum' (computed first, var' reads it). One
// temporary.
void momentum_tile(KernelBuilder& b, const TileOperands& t, const UpdateMath& m, bool nesterov) {
  const Reg& n = *t.count;
  const uint64_t accum = t.outs[1], tmp = t.temp[0];
  m.bin(b, Opcode::op_vmul, accum, t.in[1], t.in[4], n);
  m.bin(b, Opcode::op_vadd, accum, accum, t.in[3], n);
  if (nesterov) {
    m.bin(b, Opcode::op_vmul, tmp, t.in[3], t.in[2], n);          // grad * lr
    m.bin(b, Opcode::op_vmul, t.outs[0], accum, t.in[4], n);      // accum' * momentum
    m.bin(b, Opcode::op_vmul, t.outs[0], t.outs[0], t.in[2], n);  // ... * lr
    m.bin(b, Opcode::op_vadd, tmp, tmp, t.outs[0], n);
  } else {
    m.bin(b, Opcode::op_vmul, tmp, t.in[2], accum, n);  // lr * accum'
  }
  m.bin(b, Opcode::op_vsub, t.outs[0], t.in[0], tmp, n);
}

// Adam's m' (j = 1, from m, beta1) or v' (j = 2, from v, beta2) into t.outs[j]; temp[1]
// is clobbered.
void adam_moment(KernelBuilder& b, const TileOperands& t, const UpdateMath& m, int j) {
  const Reg& n = *t.count;
  const uint64_t moment = t.in[static_cast<size_t>(j)], grad = t.in[9], tmp = t.temp[1];
  const uint64_t beta = t.in[j == 1 ? 6 : 7], out = t.outs[static_cast<size_t>(j)];
  m.one_minus(b, tmp, beta, n);
  if (j == 1) {
    m.bin(b, Opcode::op_vsub, out, grad, moment, n);  // grad - m
  } else {
    m.bin(b, Opcode::op_vmul, out, grad, grad, n);  // grad * grad - v
    m.bin(b, Opcode::op_vsub, out, out, moment, n);
  }
  m.bin(b, Opcode::op_vmul, out, out, tmp, n);
  m.bin(b, Opcode::op_vadd, out, moment, out, n);
}

// in: var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad. out: var', m', v'
// (m' and v' first, var' reads them). Two temporaries.
void adam_tile(KernelBuilder& b, const TileOperands& t, const UpdateMath& m, bool nesterov) {
  adam_moment(b, t, m, 1);
  adam_moment(b, t, m, 2);
  const Reg& n = *t.count;
  const uint64_t alpha = t.temp[0], tmp = t.temp[1], var = t.outs[0];
  const uint64_t m_new = t.outs[1], v_new = t.outs[2];
  // alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power)
  m.one_minus(b, alpha, t.in[4], n);
  m.sqrt(b, alpha, alpha, n);
  m.bin(b, Opcode::op_vmul, alpha, t.in[5], alpha, n);
  m.one_minus(b, tmp, t.in[3], n);
  m.bin(b, Opcode::op_vdiv, alpha, alpha, tmp, n);
  if (nesterov) {
    // (grad * (1 - beta1) + beta1 * m') * alpha
    m.one_minus(b, tmp, t.in[6], n);
    m.bin(b, Opcode::op_vmul, tmp, t.in[9], tmp, n);
    m.bin(b, Opcode::op_vmul, var, t.in[6], m_new, n);
    m.bin(b, Opcode::op_vadd, tmp, tmp, var, n);
    m.bin(b, Opcode::op_vmul, alpha, tmp, alpha, n);
  } else {
    m.bin(b, Opcode::op_vmul, alpha, m_new, alpha, n);  // m' * alpha
  }
  // / (sqrt(v') + epsilon)
  m.sqrt(b, tmp, v_new, n);
  m.bin(b, Opcode::op_vadd, tmp, tmp, t.in[8], n);
  m.bin(b, Opcode::op_vdiv, alpha, alpha, tmp, n);
  m.bin(b, Opcode::op_vsub, var, t.in[0], alpha, n);
}

}  // namespace

CompiledKernel compile_optimizer(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  std::string base = op.type;
  if (base.rfind("Resource", 0) == 0) base = base.substr(8);
  const std::vector<Operand>& sig = checked_inputs(op, base);
  const TensorDesc& var = op.inputs[0];
  const DataType dt = var.dtype;
  const Dtype type = device_dtype(dt);
  // outputs (the new var, accum / m, v), temporaries, one tile's computation
  const int outputs = base == "ApplyGradientDescent" ? 1 : base == "ApplyMomentum" ? 2 : 3;
  const int temps = outputs - 1;
  const UpdateTile tile = outputs == 1   ? gradient_descent_tile
                          : outputs == 2 ? momentum_tile
                                         : adam_tile;
  CompiledKernel k;
  k.outputs.assign(static_cast<size_t>(outputs), var);
  if (var.num_elements() == 0) return k;

  StreamSpec spec;
  spec.kernel_name = fmt::format("{}_{}", base, data_type_name(dt));
  std::vector<TensorDesc> descs;
  for (const Operand& o : sig) descs.push_back(o.scalar ? TensorDesc{dt, {}} : var);
  spec.inputs = stream_inputs(descs, var.shape);
  spec.out_type = type;
  spec.more_out_types.assign(static_cast<size_t>(outputs - 1), type);
  spec.out_shape = var.shape;
  for (int i = 0; i < temps; ++i)
    spec.temps.push_back(
        TempSpec{fmt::format("temporary {}", i), static_cast<double>(data_type_bytes(dt)), 0});
  const bool widen = widens_bf16(type, ctx.cfg);
  if (widen)
    for (const char* name : {"operand 0 in f32", "operand 1 in f32"})
      spec.temps.push_back(TempSpec{name, 4, 0});
  const bool nesterov = op.attr_bool("use_nesterov", false);
  spec.compute = [tile, type, widen, temps, nesterov](KernelBuilder& b, const TileOperands& t) {
    const size_t w = static_cast<size_t>(temps);
    const UpdateMath m(
        type, widen,
        widen ? std::array<uint64_t, 2>{t.temp[w], t.temp[w + 1]} : std::array<uint64_t, 2>{});
    tile(b, t, m, nesterov);
  };
  k.launches.push_back(build_stream_kernel(op.str(), spec, ctx.cfg));
  return k;
}

}  // namespace npusim::compiler::ops
