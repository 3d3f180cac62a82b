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
// Launches: Momentum computes accum' first and var' from it; Adam computes m', v', then var'
// from them (the scalar expressions are recomputed per tile from the broadcast scalars: a few
// vector instructions per tile).
#include <fmt/format.h>

#include "adapter/compiler/ops/compose.h"
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

// Checks op.inputs against the input list of `base` (the op type without "Resource"): every
// input of var's float type, the scalars single elements, the others var's shape.
void check_inputs(const OpDesc& op, const std::string& base) {
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
}

// The vector operations of the updates over `n` elements of UB tiles, in the variable's type.
class UpdateMath {
 public:
  explicit UpdateMath(Dtype type) : m_type(type) {}
  void bin(KernelBuilder& b, Opcode o, uint64_t d, uint64_t x, uint64_t y, const Reg& n) const {
    vec_binary(b, o, m_type, d, x, y, n);
  }
  void sqrt(KernelBuilder& b, uint64_t d, uint64_t x, const Reg& n) const {
    vec_unary(b, Opcode::op_vsqrt, m_type, d, x, n);
  }
  // 1 - x into dst (x a tile of the broadcast scalar).
  void one_minus(KernelBuilder& b, uint64_t dst, uint64_t x, const Reg& n) const {
    Reg minus_one = b.reg_imm("-1", vector_scalar_bits(m_type, -1.0));
    Reg one = b.reg_imm("1", vector_scalar_bits(m_type, 1.0));
    vec_scalar(b, Opcode::op_vmuls, m_type, dst, x, minus_one, n);
    vec_scalar(b, Opcode::op_vadds, m_type, dst, dst, one, n);
  }

 private:
  Dtype m_type;
};

// What every update step needs: the variable's and the scalars' descs, the math, the attribute.
struct UpdateContext {
  TensorDesc var;
  TensorDesc scalar;
  UpdateMath math;
  bool nesterov = false;
};

// The element-wise launch computing output `out` of the op from `args` (ArgRefs of the plan,
// with their descs); compute sees the tile operands in the same order and `temps` temporaries
// of the variable's type.
struct UpdateStep {
  std::string what;
  int out = 0;
  std::vector<ArgRef> args;
  std::vector<TensorDesc> descs;
  int temps = 0;
  std::function<void(KernelBuilder&, const TileOperands&)> compute;
};

ArgRef in(int i) { return LaunchPlan::input(i); }
ArgRef out(int i) { return LaunchPlan::output(i); }

// in: var, alpha, delta
std::vector<UpdateStep> gradient_descent_steps(const UpdateContext& c) {
  const UpdateMath m = c.math;
  return {{"var",
           0,
           {in(0), in(1), in(2)},
           {c.var, c.scalar, c.var},
           0,
           [m](KernelBuilder& b, const TileOperands& t) {
             const Reg& n = *t.count;
             m.bin(b, Opcode::op_vmul, t.out, t.in[2], t.in[1], n);
             m.bin(b, Opcode::op_vsub, t.out, t.in[0], t.out, n);
           }}};
}

// in: var, accum, lr, grad, momentum. accum' first, then var' from it.
std::vector<UpdateStep> momentum_steps(const UpdateContext& c) {
  const UpdateMath m = c.math;
  const bool nesterov = c.nesterov;
  std::vector<UpdateStep> steps;
  // accum' from accum, grad, momentum
  steps.push_back({"accum",
                   1,
                   {in(1), in(3), in(4)},
                   {c.var, c.var, c.scalar},
                   0,
                   [m](KernelBuilder& b, const TileOperands& t) {
                     const Reg& n = *t.count;
                     m.bin(b, Opcode::op_vmul, t.out, t.in[0], t.in[2], n);
                     m.bin(b, Opcode::op_vadd, t.out, t.out, t.in[1], n);
                   }});
  // var' from var, accum', lr, grad, momentum
  steps.push_back({"var",
                   0,
                   {in(0), out(1), in(2), in(3), in(4)},
                   {c.var, c.var, c.scalar, c.var, c.scalar},
                   1,
                   [m, nesterov](KernelBuilder& b, const TileOperands& t) {
                     const Reg& n = *t.count;
                     const uint64_t tmp = t.temp[0];
                     if (nesterov) {
                       m.bin(b, Opcode::op_vmul, tmp, t.in[3], t.in[2], n);    // grad * lr
                       m.bin(b, Opcode::op_vmul, t.out, t.in[1], t.in[4], n);  // accum' * mom
                       m.bin(b, Opcode::op_vmul, t.out, t.out, t.in[2], n);    // ... * lr
                       m.bin(b, Opcode::op_vadd, tmp, tmp, t.out, n);
                     } else {
                       m.bin(b, Opcode::op_vmul, tmp, t.in[2], t.in[1], n);  // lr * accum'
                     }
                     m.bin(b, Opcode::op_vsub, t.out, t.in[0], tmp, n);
                   }});
  return steps;
}

// Adam's var' tile from the operands var, m', v', beta1_power, beta2_power, lr, epsilon
// (+ beta1, grad: nesterov) and two temporaries.
void adam_var_update(KernelBuilder& b, const TileOperands& t, const UpdateMath& m, bool nesterov) {
  const Reg& n = *t.count;
  const uint64_t alpha = t.temp[0], tmp = t.temp[1];
  // alpha = lr * sqrt(1 - beta2_power) / (1 - beta1_power)
  m.one_minus(b, alpha, t.in[4], n);
  m.sqrt(b, alpha, alpha, n);
  m.bin(b, Opcode::op_vmul, alpha, t.in[5], alpha, n);
  m.one_minus(b, tmp, t.in[3], n);
  m.bin(b, Opcode::op_vdiv, alpha, alpha, tmp, n);
  if (nesterov) {
    // (grad * (1 - beta1) + beta1 * m') * alpha
    m.one_minus(b, tmp, t.in[7], n);
    m.bin(b, Opcode::op_vmul, tmp, t.in[8], tmp, n);
    m.bin(b, Opcode::op_vmul, t.out, t.in[7], t.in[1], n);
    m.bin(b, Opcode::op_vadd, tmp, tmp, t.out, n);
    m.bin(b, Opcode::op_vmul, alpha, tmp, alpha, n);
  } else {
    m.bin(b, Opcode::op_vmul, alpha, t.in[1], alpha, n);  // m' * alpha
  }
  // / (sqrt(v') + epsilon)
  m.sqrt(b, tmp, t.in[2], n);
  m.bin(b, Opcode::op_vadd, tmp, tmp, t.in[6], n);
  m.bin(b, Opcode::op_vdiv, alpha, alpha, tmp, n);
  m.bin(b, Opcode::op_vsub, t.out, t.in[0], alpha, n);
}

// in: var, m, v, beta1_power, beta2_power, lr, beta1, beta2, epsilon, grad. m', v', then var'.
std::vector<UpdateStep> adam_steps(const UpdateContext& c) {
  const UpdateMath m = c.math;
  const bool nesterov = c.nesterov;
  std::vector<UpdateStep> steps;
  // m' from m, grad, beta1
  steps.push_back({"m",
                   1,
                   {in(1), in(9), in(6)},
                   {c.var, c.var, c.scalar},
                   1,
                   [m](KernelBuilder& b, const TileOperands& t) {
                     const Reg& n = *t.count;
                     m.one_minus(b, t.temp[0], t.in[2], n);
                     m.bin(b, Opcode::op_vsub, t.out, t.in[1], t.in[0], n);
                     m.bin(b, Opcode::op_vmul, t.out, t.out, t.temp[0], n);
                     m.bin(b, Opcode::op_vadd, t.out, t.in[0], t.out, n);
                   }});
  // v' from v, grad, beta2
  steps.push_back({"v",
                   2,
                   {in(2), in(9), in(7)},
                   {c.var, c.var, c.scalar},
                   1,
                   [m](KernelBuilder& b, const TileOperands& t) {
                     const Reg& n = *t.count;
                     m.one_minus(b, t.temp[0], t.in[2], n);
                     m.bin(b, Opcode::op_vmul, t.out, t.in[1], t.in[1], n);
                     m.bin(b, Opcode::op_vsub, t.out, t.out, t.in[0], n);
                     m.bin(b, Opcode::op_vmul, t.out, t.out, t.temp[0], n);
                     m.bin(b, Opcode::op_vadd, t.out, t.in[0], t.out, n);
                   }});
  // var' from var, m', v', beta1_power, beta2_power, lr, epsilon (+ beta1, grad: nesterov)
  UpdateStep var{"var",
                 0,
                 {in(0), out(1), out(2), in(3), in(4), in(5), in(8)},
                 {c.var, c.var, c.var, c.scalar, c.scalar, c.scalar, c.scalar},
                 2,
                 [m, nesterov](KernelBuilder& b, const TileOperands& t) {
                   adam_var_update(b, t, m, nesterov);
                 }};
  if (nesterov) {
    var.args.insert(var.args.end(), {in(6), in(9)});
    var.descs.insert(var.descs.end(), {c.scalar, c.var});
  }
  steps.push_back(std::move(var));
  return steps;
}

}  // namespace

CompiledKernel compile_optimizer(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  std::string base = op.type;
  if (base.rfind("Resource", 0) == 0) base = base.substr(8);
  check_inputs(op, base);
  const TensorDesc& var = op.inputs[0];
  const DataType dt = var.dtype;
  std::vector<TensorDesc> outs = {var};
  if (base == "ApplyMomentum") outs.push_back(var);
  if (base == "ApplyAdam") outs = {var, var, var};
  LaunchPlan plan(outs);
  if (var.num_elements() == 0) return std::move(plan).finish();

  const UpdateContext c{var, TensorDesc{dt, {}}, UpdateMath(device_dtype(dt)),
                        op.attr_bool("use_nesterov", false)};
  const std::vector<UpdateStep> steps = base == "ApplyGradientDescent" ? gradient_descent_steps(c)
                                        : base == "ApplyMomentum"      ? momentum_steps(c)
                                                                       : adam_steps(c);
  for (const UpdateStep& s : steps) {
    StreamSpec spec;
    spec.kernel_name = fmt::format("{}_{}_{}", base, s.what, data_type_name(dt));
    spec.inputs = stream_inputs(s.descs, var.shape);
    spec.out_type = device_dtype(dt);
    spec.out_shape = var.shape;
    for (int i = 0; i < s.temps; ++i)
      spec.temps.push_back(
          TempSpec{fmt::format("temporary {}", i), static_cast<double>(data_type_bytes(dt)), 0});
    spec.compute = s.compute;
    Launch l = build_stream_kernel(op.str(), spec, ctx.cfg);
    std::vector<ArgRef> args = s.args;
    args.push_back(out(s.out));  // the launch's output is this step's result
    plan.add(std::move(l), args, "new " + s.what);
  }
  return std::move(plan).finish();
}

}  // namespace npusim::compiler::ops
