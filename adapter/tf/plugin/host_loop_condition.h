// A while loop's condition evaluated on the host, where its operands already are.
//
// TensorFlow's lowered while loop takes its predicate in host memory (LoopCond), and the int32
// comparisons a loop condition is made of (the counter against maximum_iterations, the step
// against the sequence length) run as TensorFlow's DEVICE_DEFAULT kernels on host memory. A
// condition of two of them (Keras' recurrent layers: `LogicalAnd(i < max, t < steps)`) put its
// bool LogicalAnd on the chip: per iteration two host-to-device copies of one byte, a launch
// with its host dispatch, and a device-to-host copy of the result for LoopCond. A graph engine
// evaluates such a condition on the host (or the AI CPU), never on the cube / vector units.
//
// The pass gives LogicalAnd / LogicalOr / LogicalNot nodes on the NPU whose every data input is
// such a host value (an int32 comparison's output, or a node it gives the label itself) and
// whose every data reader is a LoopCond or such a node the kernel label kHostKernelLabel
// (`_kernel`): the NPU kernel registered under it (kernels_host_ops.cpp) has every argument in
// host memory and runs TensorFlow's CPU kernel, so no copy and no launch is left. Any other
// logical op (bool tensors the chip computed, a result read by the chip) keeps the chip's kernel.
// NPUSIM_HOST_LOOP_CONDITION=0 (read at each call) leaves every node as it is.
#pragma once

namespace tensorflow {
class GraphDef;
}

namespace npusim::tf {

// The `_kernel` label of the NPU's host-memory logical kernels.
inline constexpr char kHostKernelLabel[] = "npusim_host";

bool host_loop_condition_enabled();

// Labels the nodes described above; returns how many.
int label_host_loop_conditions(tensorflow::GraphDef& graph);

}  // namespace npusim::tf
