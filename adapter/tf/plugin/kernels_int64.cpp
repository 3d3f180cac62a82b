// int64 (s64) element-wise ops on the NPU: the training loop's 8-byte integers (Keras' iteration
// counter `iterations + 1`, its conversion to float for Adam's bias correction, int64 labels and
// metric counts). The compiler runs s64 arithmetic on the scalar unit (the vector unit has no
// 8-byte integers; adapter/compiler/ops/int64.h gives the cost model), so these kernels are
// correct but slow for large tensors; the tensors they see in training have a few elements.
//
// Registered apart from the float families (kernels_binary.cpp, kernels_cast.cpp) with type
// constraints that do not overlap theirs: T = int64 only, and Cast with int64 on one side.
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

class Int64CastOp : public CompiledOpKernel {
 public:
  explicit Int64CastOp(OpKernelConstruction* ctx)
      : CompiledOpKernel(ctx, {{"SrcT", AttrSpec::Kind::kType},
                               {"DstT", AttrSpec::Kind::kType},
                               {"Truncate", AttrSpec::Kind::kBool}}) {}
};

}  // namespace

rt::Status register_int64_kernels() {
  // The compiler's s64 binary ops (ops/binary.cpp: arithmetic and comparisons; not the
  // divisions or Pow).
  for (const char* op : {"AddV2", "Add", "Sub", "Mul", "Maximum", "Minimum", "Equal", "NotEqual",
                         "Less", "LessEqual", "Greater", "GreaterEqual"}) {
    rt::Status st =
        register_kernel<Int64BinaryOp>(KernelDefBuilder(op).TypeConstraint("T", {TF_INT64}));
    if (!st.ok()) return st;
  }
  // Cast between int64 and the floating-point types, both ways (ops/cast.cpp).
  const std::vector<TF_DataType> floats = {TF_FLOAT, TF_HALF, TF_BFLOAT16};
  rt::Status st = register_kernel<Int64CastOp>(
      KernelDefBuilder("Cast").TypeConstraint("SrcT", {TF_INT64}).TypeConstraint("DstT", floats));
  if (!st.ok()) return st;
  return register_kernel<Int64CastOp>(
      KernelDefBuilder("Cast").TypeConstraint("SrcT", floats).TypeConstraint("DstT", {TF_INT64}));
}

}  // namespace npusim::tf
