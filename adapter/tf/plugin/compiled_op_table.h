// Registration of compiled ops as a table: one row per TF op names the attributes the compiler
// reads, the shape-like inputs read on the host into attributes, and the type constraints.
// Every row is served by one kernel class (a CompiledOpKernel configured from its row, looked up
// by the node's op type when TensorFlow creates the kernel), so a family file is its table.
#pragma once

#include <string>
#include <vector>

#include "adapter/tf/plugin/compiled_op_kernel.h"

namespace npusim::tf {

// A HostMemory input: TF's argument name (for the kernel def) and where its value goes.
struct HostArg {
  const char* tf_arg;
  HostAttrInput input;
};

struct TypeConstraintDef {
  const char* attr;
  std::vector<TF_DataType> types;
};

struct CompiledOpDef {
  std::string op;
  std::vector<TypeConstraintDef> constraints;  // each combination is one registration
  std::vector<AttrSpec> attrs;                 // read from the node when present
  std::vector<HostArg> host_args;
};

// Registers every row for the NPU. A row that TensorFlow refuses (an unknown op, a bad
// constraint) does not stop the others; the first refusal is returned, naming its op. An op
// may appear in one row only (of all tables).
rt::Status register_compiled_ops(const std::vector<CompiledOpDef>& defs);

// Type lists shared by the tables.
inline const std::vector<TF_DataType> kFloatTypes = {TF_FLOAT, TF_HALF, TF_BFLOAT16};
inline const std::vector<TF_DataType> kFloatS32Types = {TF_FLOAT, TF_HALF, TF_BFLOAT16,
                                                        TF_INT32};
inline const std::vector<TF_DataType> kIndexTypes = {TF_INT32, TF_INT64};
// Every type the chip holds: the data movement ops copy them bit-exactly.
inline const std::vector<TF_DataType> kMoveTypes = {TF_FLOAT, TF_HALF,  TF_BFLOAT16, TF_INT32,
                                                    TF_INT64, TF_INT16, TF_UINT16,   TF_INT8,
                                                    TF_UINT8, TF_BOOL};

}  // namespace npusim::tf
