// The NPU kernel families. TF_InitKernel (init_kernels.cpp) calls every register function listed
// here; a new family adds its function here and there. The compiler's ops are registered from
// its op table (adapter/compiler/ops/registry.cpp) by one loop, register_compiler_op_kernels
// (compiled_op_table.cpp), which hands the families with their own kernel class (random, fused,
// optimizer) their rows; the other functions register the plugin-only ops (op_coverage.h).
//
// Plain C++ and TensorFlow's C types only: the files on TensorFlow's C++ kernel API include it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "adapter/runtime/status.h"
#include "tensorflow/c/tf_datatype.h"

namespace npusim::tf {

// One NPU kernel def that the compiler's op table asks for, in TensorFlow's terms: the op, its
// type constraints (attribute, allowed types), its HostMemory arguments.
struct TableKernelDef {
  std::string op;
  std::vector<std::pair<std::string, std::vector<TF_DataType>>> type_constraints;
  std::vector<std::string> host_memory;
};

// Every op of the compiler's op table that has an NPU kernel (compiled_op_table.h).
rt::Status register_compiler_op_kernels();

// The families with their own kernel class, given their rows of the op table:
// StatelessRandomGetKeyCounter / StatelessRandomUniformV2 (Philox on the scalar unit), and the
// stateful RandomUniform (kernels_random.cpp).
rt::Status register_random_kernels(const std::vector<TableKernelDef>& compiler_ops);
// ResourceApplyGradientDescent/Momentum/Adam, and ResourceApplyKerasMomentum composed of binary
// ops, on the chip (TensorFlow's C++ kernel API, kernels_optimizer.cpp).
rt::Status register_optimizer_kernels(const std::vector<TableKernelDef>& compiler_ops);
// The graph fusion's op definitions, then their NPU kernels (kernels_fused.cpp).
rt::Status register_fused_kernels(const std::vector<TableKernelDef>& compiler_ops);
// The decoder-model ops' definitions (fused attention, ...), then their NPU kernels
// (kernels_llm.cpp).
rt::Status register_llm_kernels(const std::vector<TableKernelDef>& compiler_ops);

// The NpuGraph op's definition and NPU kernel (npu_graph.h, npu_graph_kernel.cpp).
rt::Status register_npu_graph_kernel();

// Plugin-only ops:
rt::Status register_variable_kernels();  // refusals replacing unsafe DEVICE_DEFAULT variable ops
// AssignAdd/AssignSubVariableOp on the chip (TensorFlow's C++ kernel API; the only family not
// built on kernel.h: kernels_resource_variables.cpp says why).
rt::Status register_resource_variable_kernels();
// NpuCollective: all-reduce and broadcast between the NPUs of a system of chips, on the chips'
// collective engine (TensorFlow's C++ kernel API for an asynchronous kernel,
// kernels_collective.cpp)
rt::Status register_collective_kernels();
// DropOutGenMask: a dropout's keep mask as one task of the chip's AI CPU (kernels_gen_mask.cpp);
// gen_mask_registered() says whether its definition and kernel exist (the graph rewrite's
// condition, gen_mask_rewrite.cpp).
rt::Status register_gen_mask_kernel();
bool gen_mask_registered();
// Bitcast: the output aliases the input's buffer (kernels_bitcast.cpp, kernel C API directly)
rt::Status register_bitcast_kernels();
// the tf.data Optional ops, TensorFlow's CPU kernels on host-memory arguments
// (kernels_host_ops.cpp)
rt::Status register_host_routed_kernels();
// AddN and ZerosLike on variant TensorLists, the elements on the chip (TensorFlow's C++ kernel
// API, kernels_tensor_list.cpp)
rt::Status register_tensor_list_kernels();

}  // namespace npusim::tf
