// Element-wise binary ops with numpy/TF broadcasting: AddV2, Add, Sub, Mul, RealDiv, Maximum,
// Minimum, SquaredDifference, and the comparisons Equal, NotEqual, Less, LessEqual, Greater,
// GreaterEqual (bool output). Streamed by ops/elementwise (tiling, broadcasting, double
// buffering, core split); this file only says which vector instructions compute a tile.
//
// Numerics (vector_ops.h): f16/bf16 are computed in fp32 and rounded once per instruction, as
// TF's CPU kernels do for Eigen::half/bfloat16, so Add/Sub/Mul/RealDiv/Maximum/Minimum match TF
// bit for bit; SquaredDifference rounds the difference, then the square (as TF's half kernel).
// s32 wraps on overflow (as TF). Maximum/Minimum propagate NaN (TF >= 2.x on CPU).
#include <fmt/format.h>

#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

enum class Kind { kArith, kSquaredDifference, kCompare };

struct BinaryOp {
  const char* tf_op;
  Kind kind;
  Opcode vop;     // kArith: the vector instruction
  isa::Cmp cmp;   // kCompare
  bool float_only;
};

const BinaryOp kOps[] = {
    {"AddV2", Kind::kArith, Opcode::op_vadd, isa::Cmp::EQ, false},
    {"Add", Kind::kArith, Opcode::op_vadd, isa::Cmp::EQ, false},
    {"Sub", Kind::kArith, Opcode::op_vsub, isa::Cmp::EQ, false},
    {"Mul", Kind::kArith, Opcode::op_vmul, isa::Cmp::EQ, false},
    {"RealDiv", Kind::kArith, Opcode::op_vdiv, isa::Cmp::EQ, true},
    {"Maximum", Kind::kArith, Opcode::op_vmax, isa::Cmp::EQ, false},
    {"Minimum", Kind::kArith, Opcode::op_vmin, isa::Cmp::EQ, false},
    {"SquaredDifference", Kind::kSquaredDifference, Opcode::op_vsub, isa::Cmp::EQ, false},
    {"Equal", Kind::kCompare, Opcode::op_vcmp, isa::Cmp::EQ, false},
    {"NotEqual", Kind::kCompare, Opcode::op_vcmp, isa::Cmp::NE, false},
    {"Less", Kind::kCompare, Opcode::op_vcmp, isa::Cmp::LT, false},
    {"LessEqual", Kind::kCompare, Opcode::op_vcmp, isa::Cmp::LE, false},
    {"Greater", Kind::kCompare, Opcode::op_vcmp, isa::Cmp::GT, false},
    {"GreaterEqual", Kind::kCompare, Opcode::op_vcmp, isa::Cmp::GE, false},
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
  b.emit(Opcode::op_vsel, {Dtype::F16, t.temp[kHalf], t.temp[kOnes], t.temp[kZeros],
                           t.temp[kBits], 0, 1, 1, 1, 8, 0, 0},
         "bits -> f16 1.0 / 0.0");
  vec_convert(b, Dtype::U8, Dtype::F16, t.out, t.temp[kHalf], RoundMode::kRint, count);
}

}  // namespace

CompiledKernel compile_binary(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const BinaryOp* kind = nullptr;
  for (const BinaryOp& k : kOps)
    if (op.type == k.tf_op) kind = &k;
  if (!kind) op.fail("internal: not a binary op");
  if (op.inputs.size() != 2)
    op.fail(fmt::format("takes 2 inputs, {} given", op.inputs.size()));
  const DataType dt = op.inputs[0].dtype;
  if (op.inputs[1].dtype != dt)
    op.fail(fmt::format("inputs have different dtypes ({} and {})", data_type_name(dt),
                        data_type_name(op.inputs[1].dtype)));
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the inputs' {}", data_type_name(*t),
                        data_type_name(dt)));
  const bool is_float = data_type_is_float(dt);
  if (!is_float && dt != DataType::S32)
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16{})", data_type_name(dt),
                        kind->float_only ? "" : ", s32"));
  if (kind->float_only && !is_float)
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16)", data_type_name(dt)));
  auto shape = broadcast_shapes(op.inputs[0].shape, op.inputs[1].shape);
  if (!shape)
    op.fail(fmt::format("shapes {} and {} are not broadcast-compatible",
                        shape_str(op.inputs[0].shape), shape_str(op.inputs[1].shape)));
  const TensorDesc out{kind->kind == Kind::kCompare ? DataType::BOOL : dt, *shape};

  StreamSpec spec;
  spec.kernel_name = fmt::format("{}_{}", op.type, data_type_name(dt));
  spec.inputs = stream_inputs(op.inputs, out.shape);
  spec.out_type = device_dtype(out.dtype);
  spec.out_shape = out.shape;
  const Dtype type = device_dtype(dt);
  switch (kind->kind) {
    case Kind::kArith:
      spec.compute = [type, vop = kind->vop](KernelBuilder& b, const TileOperands& t) {
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
      spec.temps = {TempSpec{"compare bits", 1.0 / 8, 32},
                    TempSpec{"compare f16", 2, 0},
                    TempSpec{"f16 ones", 0, kF16RepeatBytes},
                    TempSpec{"f16 zeros", 0, kF16RepeatBytes}};
      spec.prologue = compare_prologue;
      spec.compute = [type, cmp = kind->cmp](KernelBuilder& b, const TileOperands& t) {
        compare_tile(b, t, type, cmp);
      };
      break;
  }
  return stream_kernel(ctx, out, spec);
}

}  // namespace npusim::compiler::ops
