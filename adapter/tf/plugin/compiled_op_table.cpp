#include "adapter/tf/plugin/compiled_op_table.h"

#include <map>
#include <stdexcept>

namespace npusim::tf {
namespace {

// Rows by op type. Filled by register_compiled_ops during TF_InitKernel, before TensorFlow
// creates any kernel; only read afterwards.
std::map<std::string, CompiledOpDef>& rows() {
  static auto* m = new std::map<std::string, CompiledOpDef>();
  return *m;
}

const CompiledOpDef& row_of(const std::string& op) {
  auto it = rows().find(op);
  if (it == rows().end())
    throw std::logic_error("no compiled-op table row for op " + op);
  return it->second;
}

std::vector<HostAttrInput> host_inputs(const CompiledOpDef& d) {
  std::vector<HostAttrInput> v;
  for (const HostArg& h : d.host_args) v.push_back(h.input);
  return v;
}

class TableOp : public CompiledOpKernel {
 public:
  explicit TableOp(OpKernelConstruction* ctx) : TableOp(ctx, row_of(ctx->type_string())) {}

 private:
  TableOp(OpKernelConstruction* ctx, const CompiledOpDef& d)
      : CompiledOpKernel(ctx, d.attrs, host_inputs(d)) {}
};

}  // namespace

rt::Status register_compiled_ops(const std::vector<CompiledOpDef>& defs) {
  rt::Status first = rt::ok_status();
  for (const CompiledOpDef& d : defs) {
    if (!rows().emplace(d.op, d).second) {
      if (first.ok())
        first = rt::Status(rt::StatusCode::internal, d.op + " is in two compiled-op tables");
      continue;
    }
    KernelDefBuilder def(d.op);
    for (const TypeConstraintDef& c : d.constraints) def.TypeConstraint(c.attr, c.types);
    for (const HostArg& h : d.host_args) def.HostMemory(h.tf_arg);
    rt::Status st = register_kernel<TableOp>(def);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

}  // namespace npusim::tf
