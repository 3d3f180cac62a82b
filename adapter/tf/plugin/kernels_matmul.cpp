// MatMul, BatchMatMul(V2) and Einsum (as BatchMatMul + transposes) on the cube (compiled by
// adapter/compiler/ops/matmul.cpp, batch_matmul.cpp). How f32 uses the cube follows the
// precision mode (NPUSIM_PRECISION_MODE, plugin_device.h).
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/compiled_op_table.h"
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
  rt::Status st = register_kernel<MatMulOp>(
      KernelDefBuilder("MatMul").TypeConstraint("T", {TF_FLOAT, TF_HALF, TF_BFLOAT16}));
  if (!st.ok()) return st;
  using K = AttrSpec::Kind;
  const std::vector<AttrSpec> bmm = {{"T", K::kType}, {"adj_x", K::kBool}, {"adj_y", K::kBool}};
  // Einsum: the equations that are one batched product plus transposes (docs/compiler.md);
  // others fail as UnimplementedError naming the equation.
  return register_compiled_ops({
      {"BatchMatMulV2", {{"T", kFloatTypes}}, bmm, {}},
      {"BatchMatMul", {{"T", kFloatTypes}}, bmm, {}},
      {"Einsum", {{"T", kFloatTypes}}, {{"T", K::kType}, {"equation", K::kString}, {"N", K::kInt}},
       {}},
  });
}

}  // namespace npusim::tf
