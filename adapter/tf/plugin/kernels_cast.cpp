// Cast between the floating-point types (compiled by adapter/compiler/ops/cast.cpp).
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {
namespace {

class CastOp : public CompiledOpKernel {
 public:
  explicit CastOp(OpKernelConstruction* ctx)
      : CompiledOpKernel(ctx, {{"SrcT", AttrSpec::Kind::kType},
                               {"DstT", AttrSpec::Kind::kType},
                               {"Truncate", AttrSpec::Kind::kBool}}) {}
};

}  // namespace

rt::Status register_cast_kernels() {
  const std::vector<TF_DataType> floats = {TF_FLOAT, TF_HALF, TF_BFLOAT16};
  return register_kernel<CastOp>(
      KernelDefBuilder("Cast").TypeConstraint("SrcT", floats).TypeConstraint("DstT", floats));
}

}  // namespace npusim::tf
