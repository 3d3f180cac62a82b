// Element-wise unary ops: Neg, Abs, Exp, Log, Sqrt, Rsqrt, Square, Reciprocal, Relu. Streamed
// by ops/elementwise; this file only says which vector instructions compute a tile.
//
// Numerics (vector_ops.h): each instruction computes in fp32 and rounds once to the type.
// Neg is x * -1 (exact, keeps -0 for +0 as TF). Exp/Log use the host libm's expf/logf
// (correctly rounded in practice); TF's CPU kernels use Eigen's vectorised approximations,
// which differ by a few ulp. Rsqrt and Reciprocal are 1/sqrt(x) and 1/x evaluated in fp32.
#include <fmt/format.h>

#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

enum class Kind { kUnary, kNeg, kSquare };

struct UnaryOp {
  const char* tf_op;
  Kind kind;
  Opcode vop;
  bool float_only;  // else f32/f16/bf16 and s32
};

const UnaryOp kOps[] = {
    {"Neg", Kind::kNeg, Opcode::op_vmuls, false},
    {"Abs", Kind::kUnary, Opcode::op_vabs, false},
    {"Exp", Kind::kUnary, Opcode::op_vexp, true},
    {"Log", Kind::kUnary, Opcode::op_vln, true},
    {"Sqrt", Kind::kUnary, Opcode::op_vsqrt, true},
    {"Rsqrt", Kind::kUnary, Opcode::op_vrsqrt, true},
    {"Square", Kind::kSquare, Opcode::op_vmul, false},
    {"Reciprocal", Kind::kUnary, Opcode::op_vrec, true},
    {"Relu", Kind::kUnary, Opcode::op_vrelu, false},
};

}  // namespace

CompiledKernel compile_unary(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const UnaryOp* kind = nullptr;
  for (const UnaryOp& k : kOps)
    if (op.type == k.tf_op) kind = &k;
  if (!kind) op.fail("internal: not a unary op");
  if (op.inputs.size() != 1) op.fail(fmt::format("takes 1 input, {} given", op.inputs.size()));
  const DataType dt = op.inputs[0].dtype;
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the input's {}", data_type_name(*t),
                        data_type_name(dt)));
  const bool ok = data_type_is_float(dt) || (!kind->float_only && dt == DataType::S32);
  if (!ok)
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16{})", data_type_name(dt),
                        kind->float_only ? "" : ", s32"));
  const TensorDesc out = op.inputs[0];

  StreamSpec spec;
  spec.kernel_name = fmt::format("{}_{}", op.type, data_type_name(dt));
  spec.inputs = stream_inputs(op.inputs, out.shape);
  spec.out_type = device_dtype(dt);
  spec.out_shape = out.shape;
  const Dtype type = device_dtype(dt);
  switch (kind->kind) {
    case Kind::kUnary:
      spec.compute = [type, vop = kind->vop](KernelBuilder& b, const TileOperands& t) {
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
  }
  return stream_kernel(ctx, out, spec);
}

}  // namespace npusim::compiler::ops
