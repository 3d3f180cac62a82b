// Element-wise binary ops with numpy broadcasting (compiled by adapter/compiler/ops/binary.cpp):
// arithmetic (Pow included) on f32/f16/bf16, comparisons producing bool, LogicalAnd/LogicalOr
// on bool.
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/compiled_op_table.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {
namespace {

class BinaryOp : public CompiledOpKernel {
 public:
  explicit BinaryOp(OpKernelConstruction* ctx)
      : CompiledOpKernel(ctx, {{"T", AttrSpec::Kind::kType}}) {}
};

}  // namespace

rt::Status register_binary_kernels() {
  for (const char* op :
       {"AddV2", "Add", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "SquaredDifference", "Equal",
        "NotEqual", "Less", "LessEqual", "Greater", "GreaterEqual", "DivNoNan", "Pow"}) {
    rt::Status st =
        register_kernel<BinaryOp>(KernelDefBuilder(op).TypeConstraint("T", kFloatTypes));
    if (!st.ok()) return st;
  }
  // bool only: the op has no type attribute.
  for (const char* op : {"LogicalAnd", "LogicalOr"}) {
    rt::Status st = register_kernel<BinaryOp>(KernelDefBuilder(op));
    if (!st.ok()) return st;
  }
  return rt::ok_status();
}

}  // namespace npusim::tf
