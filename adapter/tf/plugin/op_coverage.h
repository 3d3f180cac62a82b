// Which TF ops the plugin serves on the NPU, against the compiler's op table
// (adapter/compiler/ops/registry.cpp), from which the plugin registers its kernels
// (compiled_op_table.h). The two lists here name, with the reason, the ops on which the table
// and TensorFlow's NPU kernels deliberately disagree; tests/tf/test_op_list.py checks every other
// op is both a compiler op and a registered NPU kernel.
#pragma once

#include <vector>

namespace npusim::tf {

struct OpReason {
  const char* op;
  const char* reason;  // one line
};

// Compiler ops the plugin registers no NPU kernel for: the table's rows with TfKernel::kNone that
// give a reason (a row without one is an op nobody decided on: the test fails on it).
const std::vector<OpReason>& unregistered_compiler_ops();
// NPU kernels for ops the compiler has no row for (composed, host-side or refusing kernels).
const std::vector<OpReason>& plugin_only_ops();

}  // namespace npusim::tf
