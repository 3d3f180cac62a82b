#include "adapter/tf/plugin/compiled_op_table.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

namespace npusim::tf {
namespace {

using compiler::ops::OpEntry;
using compiler::ops::TfKernel;
using K = AttrSpec::Kind;

// The attributes each CompiledOpKernel class reads (those the node has) into the OpDesc: no op
// of a class has an attribute of its list that its compile function does not take.
const std::vector<AttrSpec>& kernel_attrs(TfKernel kernel) {
  static const std::map<TfKernel, std::vector<AttrSpec>> attrs = {
      {TfKernel::kElementwise, {{"T", K::kType}}},
      {TfKernel::kCast, {{"SrcT", K::kType}, {"DstT", K::kType}, {"Truncate", K::kBool}}},
      {TfKernel::kCubeProduct,
       {{"T", K::kType},
        {"transpose_a", K::kBool},
        {"transpose_b", K::kBool},
        {"adj_x", K::kBool},
        {"adj_y", K::kBool},
        {"equation", K::kString},
        {"N", K::kInt}}},
      {TfKernel::kDataMovement,
       {{"T", K::kType},
        {"N", K::kInt},
        {"axis", K::kInt},
        {"num", K::kInt},
        {"num_split", K::kInt},
        {"mode", K::kString},
        {"begin_mask", K::kInt},
        {"end_mask", K::kInt},
        {"ellipsis_mask", K::kInt},
        {"new_axis_mask", K::kInt},
        {"shrink_axis_mask", K::kInt},
        {"Tparams", K::kType},
        {"Tindices", K::kType},
        {"batch_dims", K::kInt}}},
      {TfKernel::kReduction,
       {{"T", K::kType},
        {"keep_dims", K::kBool},
        {"output_type", K::kType},
        {"exclusive", K::kBool},
        {"reverse", K::kBool}}},
      {TfKernel::kGenerator, {{"T", K::kType}, {"Tidx", K::kType}}},
      {TfKernel::kNn,
       {{"T", K::kType},
        {"data_format", K::kString},
        {"Tlabels", K::kType},
        {"alpha", K::kFloat}}},  // LeakyRelu(Grad)
      {TfKernel::kWindow,
       {{"T", K::kType},
        {"strides", K::kInts},
        {"padding", K::kString},
        {"explicit_paddings", K::kInts},
        {"data_format", K::kString},
        {"dilations", K::kInts},
        {"ksize", K::kInts},
        {"U", K::kType},
        {"epsilon", K::kFloat},
        {"exponential_avg_factor", K::kFloat},
        {"is_training", K::kBool},
        {"filter_layout", K::kString}}},  // (from _npusim_filter_layout: filter_layout.h)
      {TfKernel::kFusedInference,
       {{"T", K::kType},
        {"filter_layout", K::kString},  // (from _npusim_filter_layout: filter_layout.h)
        {"filter_n16", K::kInts},
        {"epsilon", K::kFloat},
        {"relu", K::kBool},
        {"relu6", K::kBool},
        {"N", K::kInt},
        {"R", K::kInt},
        {"strides", K::kInts},
        {"padding", K::kString},
        {"explicit_paddings", K::kInts},
        {"dilations", K::kInts},
        {"data_format", K::kString},
        {"Tx", K::kType},
        {"Tout", K::kType},
        {"steps", K::kStrings},
        {"transpose_a", K::kBool},
        {"transpose_b", K::kBool},
        {"axis", K::kInts},
        {"keep_dims", K::kBool},
        {"SrcT", K::kType},
        {"DstT", K::kType},
        {"Truncate", K::kBool},
        {"bias_grads", K::kInt},
        {"ranks", K::kInts}}},
      {TfKernel::kLlm,
       {{"T", K::kType},
        {"scale_value", K::kFloat},
        {"sparse_mode", K::kInt},
        {"input_layout", K::kString},
        {"num_heads", K::kInt},
        {"num_key_value_heads", K::kInt},
        {"epsilon", K::kFloat},
        {"mode", K::kInt},
        {"approximate", K::kInt}}},
  };
  auto it = attrs.find(kernel);
  if (it == attrs.end())
    throw std::logic_error("the op table's kernel class " +
                           std::to_string(static_cast<int>(kernel)) + " is no CompiledOpKernel");
  return it->second;
}

// The op table's row of TF op `op` (one per op), or null.
const OpEntry* find_row(const std::string& op) {
  static const auto* rows = [] {
    auto* m = new std::map<std::string, const OpEntry*>();
    for (const OpEntry& e : compiler::ops::op_table()) m->emplace(e.tf_op, &e);
    return m;
  }();
  const auto it = rows->find(op);
  return it == rows->end() ? nullptr : it->second;
}

const OpEntry& row_of(const std::string& op) {
  const OpEntry* row = find_row(op);
  if (!row) throw std::logic_error("no op table row for op " + op);
  return *row;
}

class TableOp : public CompiledOpKernel {
 public:
  explicit TableOp(OpKernelConstruction* ctx) : TableOp(ctx, row_of(ctx->type_string())) {}

 private:
  TableOp(OpKernelConstruction* ctx, const OpEntry& row)
      : CompiledOpKernel(ctx, kernel_attrs(row.tf.kernel), row.tf.host_inputs) {}
};

// The kernel defs of `row`: one per type-constraint list.
std::vector<TableKernelDef> kernel_defs(const OpEntry& row) {
  std::vector<TableKernelDef> defs;
  for (const auto& constraints : row.tf.types) {
    TableKernelDef d{row.tf_op, {}, {}};
    for (const compiler::ops::TypeConstraint& c : constraints)
      d.type_constraints.emplace_back(c.attr, tf_types(c.types));
    for (const HostAttrInput& h : row.tf.host_inputs) d.host_memory.emplace_back(h.tf_arg);
    defs.push_back(std::move(d));
  }
  return defs;
}

}  // namespace

const std::vector<AttrSpec>* compiled_op_attrs(const std::string& op,
                                               const std::vector<HostAttrInput>** host_inputs) {
  const OpEntry* row = find_row(op);
  if (!row) return nullptr;
  switch (row->tf.kernel) {
    case TfKernel::kNone:
    case TfKernel::kRandom:
    case TfKernel::kResourceApply: return nullptr;
    default: break;
  }
  *host_inputs = &row->tf.host_inputs;
  return &kernel_attrs(row->tf.kernel);
}

const std::vector<AttrSpec>* task_list_op_attrs(const std::string& op,
                                                const std::vector<HostAttrInput>** host_inputs) {
  if (const std::vector<AttrSpec>* attrs = compiled_op_attrs(op, host_inputs)) return attrs;
  const OpEntry* row = find_row(op);
  if (!row || row->tf.kernel != TfKernel::kRandom) return nullptr;
  static const std::vector<AttrSpec> random_attrs = {{"dtype", AttrSpec::Kind::kType}};
  *host_inputs = &row->tf.host_inputs;
  return &random_attrs;
}

bool table_kernel_takes_types(const std::string& op,
                              const std::map<std::string, std::vector<TF_DataType>>& types) {
  const OpEntry* row = find_row(op);
  if (!row) return false;
  for (const auto& constraints : row->tf.types) {
    bool admitted = true;
    for (const compiler::ops::TypeConstraint& c : constraints) {
      const auto it = types.find(c.attr);
      if (it == types.end()) continue;  // the node leaves it at a default the kernel checks
      const std::vector<TF_DataType> allowed = tf_types(c.types);
      for (const TF_DataType t : it->second)
        admitted = admitted && std::find(allowed.begin(), allowed.end(), t) != allowed.end();
    }
    if (admitted) return true;
  }
  return row->tf.types.empty();
}

std::vector<TF_DataType> tf_types(const std::vector<compiler::DataType>& types) {
  std::vector<TF_DataType> v;
  for (compiler::DataType t : types) v.push_back(to_tf_dtype(t));
  return v;
}

KernelDefBuilder kernel_def_builder(const TableKernelDef& def) {
  KernelDefBuilder b(def.op);
  for (const auto& [attr, types] : def.type_constraints) b.TypeConstraint(attr, types);
  for (const std::string& arg : def.host_memory) b.HostMemory(arg);
  return b;
}

rt::Status register_compiled_op_kernel(const TableKernelDef& def) {
  return register_kernel<TableOp>(kernel_def_builder(def));
}

rt::Status register_compiler_op_kernels() {
  // The defs by kernel class, in table order.
  std::map<TfKernel, std::vector<TableKernelDef>> defs;
  for (const OpEntry& row : compiler::ops::op_table())
    if (row.tf.kernel != TfKernel::kNone)
      for (TableKernelDef& d : kernel_defs(row)) defs[row.tf.kernel].push_back(std::move(d));
  // A refusal (an unknown op, a bad constraint) does not stop the others; the first is returned.
  rt::Status first = rt::ok_status();
  auto keep_first = [&first](const rt::Status& st) {
    if (!st.ok() && first.ok()) first = st;
  };
  for (const auto& [kernel, family_defs] : defs) {
    switch (kernel) {
      case TfKernel::kRandom: keep_first(register_random_kernels(family_defs)); break;
      case TfKernel::kResourceApply: keep_first(register_optimizer_kernels(family_defs)); break;
      case TfKernel::kFusedInference: keep_first(register_fused_kernels(family_defs)); break;
      case TfKernel::kLlm: keep_first(register_llm_kernels(family_defs)); break;
      default:
        for (const TableKernelDef& d : family_defs) keep_first(register_compiled_op_kernel(d));
    }
  }
  return first;
}

}  // namespace npusim::tf
