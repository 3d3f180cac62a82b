// The compiler's ops registered from its op table (adapter/compiler/ops/registry.cpp): each row
// names the plugin's kernel class (compiler::ops::TfKernel), the type constraints and the inputs
// read on the host; here are each kernel class's attributes and the one loop that registers
// every row (register_compiler_op_kernels, kernel_families.h). The classes that are a
// CompiledOpKernel are one kernel configured from its row, looked up by the node's op type when
// TensorFlow creates the kernel.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "adapter/compiler/ops/registry.h"
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {

// TensorFlow's types for the compiler's.
std::vector<TF_DataType> tf_types(const std::vector<compiler::DataType>& types);

// The registration a table kernel def says (kernel.h).
KernelDefBuilder kernel_def_builder(const TableKernelDef& def);

// Registers the CompiledOpKernel of def.op: it reads the attributes of its row's kernel class and
// the row's host-memory inputs.
rt::Status register_compiled_op_kernel(const TableKernelDef& def);

// For an op registered as a CompiledOpKernel: the attributes its kernel class reads and its
// host-memory inputs; null for any other op (random, resource, plugin-only ops).
const std::vector<AttrSpec>* compiled_op_attrs(const std::string& op,
                                               const std::vector<HostAttrInput>** host_inputs);

// For an op an NpuGraph task list may run as a compiled step: a CompiledOpKernel's op
// (compiled_op_attrs) or a stateless random op (kernels_random.cpp: the attribute its kernel
// passes to the compiler, dtype, and the row's host inputs, shape and alg). Null for any other.
const std::vector<AttrSpec>* task_list_op_attrs(const std::string& op,
                                                const std::vector<HostAttrInput>** host_inputs);

// Whether the kernel the plugin registers for a table op takes a node's types: `types` maps each
// type attribute of the node to its value (a list attribute to its values). False for an op
// without a table row and where none of the row's type-constraint lists admits them: then
// TensorFlow's DEVICE_DEFAULT kernel runs the node (int32 shape arithmetic in host memory: Less,
// AddV2 ... on int32) or no kernel does, so a task list must not run it as a compiled step.
bool table_kernel_takes_types(const std::string& op,
                              const std::map<std::string, std::vector<TF_DataType>>& types);

}  // namespace npusim::tf
