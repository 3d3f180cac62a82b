// The NPU kernel families, one file each (kernels_<family>.cpp). TF_InitKernel (init_kernels.cpp)
// calls every register function listed here; a new family adds its function here and there.
#pragma once

#include "adapter/runtime/status.h"

namespace npusim::tf {

rt::Status register_binary_kernels();    // element-wise binary ops and comparisons
rt::Status register_unary_kernels();     // element-wise unary ops
rt::Status register_cast_kernels();      // Cast between floating-point types
rt::Status register_matmul_kernels();    // MatMul, BatchMatMul(V2), Einsum on the cube
// Conv2D, depthwise, their gradients, pooling, FusedBatchNormV3 and its gradient (NHWC)
rt::Status register_conv_kernels();
// transpose, concat, pack, split, slice, pad, select, fill, gather, one-hot, cumsum, range
rt::Status register_layout_kernels();
// ops the compiler lacks, as sequences of compiled ops: AddN, RsqrtGrad
rt::Status register_composed_kernels();
rt::Status register_nn_kernels();        // bias add, softmax, cross entropy, activations, grads
// reductions and Tile/BroadcastTo/StridedSlice (shape-like arguments read from host memory)
rt::Status register_reduce_kernels();
rt::Status register_variable_kernels();  // refusals replacing unsafe DEVICE_DEFAULT variable ops
// AssignAdd/AssignSubVariableOp on the chip (TensorFlow's C++ kernel API; the only family not
// built on kernel.h: kernels_resource_variables.cpp says why).
rt::Status register_resource_variable_kernels();
// ResourceApplyGradientDescent/Momentum/Adam on the chip (C++ kernel API, kernels_optimizer.cpp)
rt::Status register_optimizer_kernels();
// int64 element-wise arithmetic, comparisons and Cast to/from floats (the scalar unit)
rt::Status register_int64_kernels();
// StatelessRandomGetKeyCounter / StatelessRandomUniformV2 (Philox on the scalar unit)
rt::Status register_random_kernels();
// Bitcast: the output aliases the input's buffer (kernels_bitcast.cpp, kernel C API directly)
rt::Status register_bitcast_kernels();
// the tf.data Optional ops, TensorFlow's CPU kernels on host-memory arguments (kernels_host_ops.cpp)
rt::Status register_host_routed_kernels();

}  // namespace npusim::tf
