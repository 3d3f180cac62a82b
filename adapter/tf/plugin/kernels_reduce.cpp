// Reductions (Sum, Mean, Max, Min, Prod, ArgMax, ArgMin on f32/f16/bf16, all but Mean on s32;
// adapter/compiler/ops/reduce.cpp) and the layout ops Tile, BroadcastTo, StridedSlice
// (ops/layout.cpp) on every type the chip holds. TF gives their shape-like
// arguments (reduction axes, multiples, shape, begin/end/strides) as int32/int64 tensors, the
// compiler as list(int) attributes: the arguments are registered HostMemory and read into the
// attributes named in docs/compiler.md at Compute (CompiledOpKernel's HostAttrInput). Each
// distinct value compiles once (the attributes are part of the cache key).
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/compiled_op_table.h"
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

}  // namespace

rt::Status register_reduce_kernels() {
  // int32 sums wrap as TF's; the compiler has no int32 Mean (TF divides int64 sums).
  for (const char* op : {"Sum", "Mean", "Max", "Min", "Prod"}) {
    const bool s32 = std::string(op) != "Mean";
    rt::Status st = register_kernel<ReduceOp>(KernelDefBuilder(op)
                                                  .TypeConstraint("T", s32 ? kFloatS32Types
                                                                           : kFloatTypes)
                                                  .HostMemory("reduction_indices"));
    if (!st.ok()) return st;
  }
  // The movers copy any type bit-exactly; int32 included (TF has no DEVICE_DEFAULT int32 kernel
  // for them: shape arithmetic in a graph placed on the NPU needs them there).
  rt::Status st = register_kernel<TileOp>(
      KernelDefBuilder("Tile").TypeConstraint("T", kMoveTypes).HostMemory("multiples"));
  if (!st.ok()) return st;
  st = register_kernel<BroadcastToOp>(
      KernelDefBuilder("BroadcastTo").TypeConstraint("T", kMoveTypes).HostMemory("shape"));
  if (!st.ok()) return st;
  // ArgMax/ArgMin: the dimension input read into `axis`; output_type int32 or int64.
  using K = AttrSpec::Kind;
  st = register_compiled_ops({
      {"ArgMax", {{"T", kFloatS32Types}, {"output_type", kIndexTypes}},
       {{"T", K::kType}, {"output_type", K::kType}},
       {{"dimension", {1, "axis", HostAttrInput::Kind::kInt}}}},
      {"ArgMin", {{"T", kFloatS32Types}, {"output_type", kIndexTypes}},
       {{"T", K::kType}, {"output_type", K::kType}},
       {{"dimension", {1, "axis", HostAttrInput::Kind::kInt}}}},
  });
  if (!st.ok()) return st;
  return register_kernel<StridedSliceOp>(KernelDefBuilder("StridedSlice")
                                             .TypeConstraint("T", kMoveTypes)
                                             .HostMemory("begin")
                                             .HostMemory("end")
                                             .HostMemory("strides"));
}

}  // namespace npusim::tf
