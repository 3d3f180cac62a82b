// int64 (s64) element-wise ops on the NPU: the training loop's 8-byte integers (Keras' iteration
// counter `iterations + 1`, its conversion to float for Adam's bias correction, int64 labels and
// metric counts). The compiler runs s64 arithmetic on the scalar unit (the vector unit has no
// 8-byte integers; adapter/compiler/ops/int64.h gives the cost model), so these kernels are
// correct but slow for large tensors; the tensors they see in training have a few elements.
//
// Registered apart from the float families (kernels_binary.cpp) with type constraints that do not
// overlap theirs: T = int64 only. Cast with int64 on either side is in kernels_cast.cpp's table.
// int32 is not registered: TensorFlow keeps int32 tensors (shapes, indices) in host memory, and
// shape arithmetic stays on the host (docs/tf_plugin.md).
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {
namespace {

class Int64BinaryOp : public CompiledOpKernel {
 public:
  explicit Int64BinaryOp(OpKernelConstruction* ctx)
      : CompiledOpKernel(ctx, {{"T", AttrSpec::Kind::kType}}) {}
};

}  // namespace

rt::Status register_int64_kernels() {
  // The compiler's s64 binary ops (ops/binary.cpp: arithmetic and comparisons; not RealDiv,
  // DivNoNan or Pow).
  // FloorMod / FloorDiv: ops/int64.h's compile_s64_floor (Keras 3's SeedGenerator reduces its
  // int64 seed state with FloorMod before Dropout's stateless random ops).
  for (const char* op : {"AddV2", "Add", "Sub", "Mul", "Maximum", "Minimum", "Equal", "NotEqual",
                         "Less", "LessEqual", "Greater", "GreaterEqual", "FloorMod", "FloorDiv"}) {
    rt::Status st =
        register_kernel<Int64BinaryOp>(KernelDefBuilder(op).TypeConstraint("T", {TF_INT64}));
    if (!st.ok()) return st;
  }
  return rt::ok_status();
}

}  // namespace npusim::tf
