// MatMul on the cube (compiled by adapter/compiler/ops/matmul.cpp). How f32 uses the cube
// follows the precision mode (NPUSIM_PRECISION_MODE, plugin_device.h).
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {
namespace {

class MatMulOp : public CompiledOpKernel {
 public:
  explicit MatMulOp(OpKernelConstruction* ctx)
      : CompiledOpKernel(ctx, {{"T", AttrSpec::Kind::kType},
                               {"transpose_a", AttrSpec::Kind::kBool},
                               {"transpose_b", AttrSpec::Kind::kBool}}) {}
};

}  // namespace

rt::Status register_matmul_kernels() {
  return register_kernel<MatMulOp>(
      KernelDefBuilder("MatMul").TypeConstraint("T", {TF_FLOAT, TF_HALF, TF_BFLOAT16}));
}

}  // namespace npusim::tf
