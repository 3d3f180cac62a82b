// Reductions (Sum, Mean, Max, Min, Prod; adapter/compiler/ops/reduce.cpp) and the layout ops
// Tile, BroadcastTo, StridedSlice (ops/layout.cpp) on f32/f16/bf16. TF gives their shape-like
// arguments (reduction axes, multiples, shape, begin/end/strides) as int32/int64 tensors, the
// compiler as list(int) attributes: the arguments are registered HostMemory and read into the
// attributes named in docs/compiler.md at Compute (CompiledOpKernel's HostAttrInput). Each
// distinct value compiles once (the attributes are part of the cache key).
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {
namespace {

class ReduceOp : public CompiledOpKernel {
 public:
  explicit ReduceOp(OpKernelConstruction* ctx)
      : CompiledOpKernel(ctx, {{"T", AttrSpec::Kind::kType}, {"keep_dims", AttrSpec::Kind::kBool}},
                         {{1, "axes"}}) {}
};

class TileOp : public CompiledOpKernel {
 public:
  explicit TileOp(OpKernelConstruction* ctx)
      : CompiledOpKernel(ctx, {{"T", AttrSpec::Kind::kType}}, {{1, "multiples"}}) {}
};

class BroadcastToOp : public CompiledOpKernel {
 public:
  explicit BroadcastToOp(OpKernelConstruction* ctx)
      : CompiledOpKernel(ctx, {{"T", AttrSpec::Kind::kType}}, {{1, "shape"}}) {}
};

class StridedSliceOp : public CompiledOpKernel {
 public:
  explicit StridedSliceOp(OpKernelConstruction* ctx)
      : CompiledOpKernel(ctx,
                         {{"T", AttrSpec::Kind::kType},
                          {"begin_mask", AttrSpec::Kind::kInt},
                          {"end_mask", AttrSpec::Kind::kInt},
                          {"ellipsis_mask", AttrSpec::Kind::kInt},
                          {"new_axis_mask", AttrSpec::Kind::kInt},
                          {"shrink_axis_mask", AttrSpec::Kind::kInt}},
                         {{1, "begin"}, {2, "end"}, {3, "strides"}}) {}
};

const std::vector<TF_DataType> kFloatTypes = {TF_FLOAT, TF_HALF, TF_BFLOAT16};

}  // namespace

rt::Status register_reduce_kernels() {
  for (const char* op : {"Sum", "Mean", "Max", "Min", "Prod"}) {
    rt::Status st = register_kernel<ReduceOp>(KernelDefBuilder(op)
                                                  .TypeConstraint("T", kFloatTypes)
                                                  .HostMemory("reduction_indices"));
    if (!st.ok()) return st;
  }
  rt::Status st = register_kernel<TileOp>(
      KernelDefBuilder("Tile").TypeConstraint("T", kFloatTypes).HostMemory("multiples"));
  if (!st.ok()) return st;
  st = register_kernel<BroadcastToOp>(
      KernelDefBuilder("BroadcastTo").TypeConstraint("T", kFloatTypes).HostMemory("shape"));
  if (!st.ok()) return st;
  return register_kernel<StridedSliceOp>(KernelDefBuilder("StridedSlice")
                                             .TypeConstraint("T", kFloatTypes)
                                             .HostMemory("begin")
                                             .HostMemory("end")
                                             .HostMemory("strides"));
}

}  // namespace npusim::tf
