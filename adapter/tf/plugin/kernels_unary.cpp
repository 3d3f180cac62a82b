// Element-wise unary ops on f32/f16/bf16 (IsFinite: to bool), LogicalNot on bool (compiled by
// adapter/compiler/ops/unary.cpp).
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {
namespace {

class UnaryOp : public CompiledOpKernel {
 public:
  explicit UnaryOp(OpKernelConstruction* ctx)
      : CompiledOpKernel(ctx, {{"T", AttrSpec::Kind::kType}}) {}
};

}  // namespace

rt::Status register_unary_kernels() {
  for (const char* op :
       {"Neg", "Abs", "Exp", "Log", "Sqrt", "Rsqrt", "Square", "Reciprocal", "Relu", "Floor", "Ceil",
        "Round", "Sign", "Log1p", "IsFinite"}) {
    rt::Status st = register_kernel<UnaryOp>(
        KernelDefBuilder(op).TypeConstraint("T", {TF_FLOAT, TF_HALF, TF_BFLOAT16}));
    if (!st.ok()) return st;
  }
  return register_kernel<UnaryOp>(KernelDefBuilder("LogicalNot"));  // bool, no type attribute
}

}  // namespace npusim::tf
