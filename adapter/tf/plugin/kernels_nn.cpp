// Neural-network ops of a Keras train step on f32/f16/bf16: bias add and its gradient, ReLU's
// gradient, softmax and the (sparse) softmax cross entropy, activations (Relu6, Elu, Selu,
// Softplus, Sigmoid, Tanh) with their gradients, L2Loss (compiled by adapter/compiler/ops/
// bias.cpp, activation.cpp, softmax.cpp). TF has no Gelu op: tf.nn.gelu and Keras' gelu are
// compositions of element-wise ops (Erf, Tanh, Pow, ...), which run op by op.
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/compiled_op_table.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {
namespace {

// T; data_format (BiasAdd, BiasAddGrad); Tlabels (SparseSoftmaxCrossEntropyWithLogits). An
// attribute the node does not have is not read.
class NnOp : public CompiledOpKernel {
 public:
  explicit NnOp(OpKernelConstruction* ctx)
      : CompiledOpKernel(ctx, {{"T", AttrSpec::Kind::kType},
                               {"data_format", AttrSpec::Kind::kString},
                               {"Tlabels", AttrSpec::Kind::kType}}) {}
};

}  // namespace

rt::Status register_nn_kernels() {
  for (const char* op :
       {"BiasAdd", "BiasAddGrad", "ReluGrad", "Softmax", "LogSoftmax", "Sigmoid", "Tanh",
        "SigmoidGrad", "TanhGrad", "Relu6", "Relu6Grad", "Elu", "EluGrad", "Selu", "SeluGrad",
        "Softplus", "SoftplusGrad", "L2Loss", "SoftmaxCrossEntropyWithLogits"}) {
    rt::Status st = register_kernel<NnOp>(KernelDefBuilder(op).TypeConstraint("T", kFloatTypes));
    if (!st.ok()) return st;
  }
  // Labels live on the NPU (int32 or int64); the compiler makes an out-of-range label's row NaN.
  return register_kernel<NnOp>(KernelDefBuilder("SparseSoftmaxCrossEntropyWithLogits")
                                   .TypeConstraint("T", kFloatTypes)
                                   .TypeConstraint("Tlabels", {TF_INT32, TF_INT64}));
}

}  // namespace npusim::tf
