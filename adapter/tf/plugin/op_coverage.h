// Which TF ops the plugin serves on the NPU, against the compiler's op table
// (adapter/compiler/ops/registry.cpp). A TF op is named in the compiler's table, in its family's
// file and in a kernels_<family>.cpp registration; the two lists here name, with the reason, the
// ops on which the table and the registrations deliberately disagree. tests/tf/test_op_list.py
// checks every other op is both a compiler op and a registered NPU kernel.
#pragma once

#include <vector>

namespace npusim::tf {

struct OpReason {
  const char* op;
  const char* reason;  // one line
};

// Compiler ops the plugin registers no NPU kernel for.
const std::vector<OpReason>& unregistered_compiler_ops();
// NPU kernels for ops the compiler has no row for (composed, host-side or refusing kernels).
const std::vector<OpReason>& plugin_only_ops();

}  // namespace npusim::tf
