#include "adapter/tf/plugin/dense_update.h"

#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/plugin_device.h"

namespace npusim::tf {

DenseUpdateStatus run_compiled_update(TF_OpKernelContext* tf_ctx, const std::string& op_type,
                                      const std::vector<std::pair<std::string, bool>>& bool_attrs,
                                      const std::vector<UpdateTensor>& inputs,
                                      const std::vector<UpdateTensor>& outputs,
                                      const UpdateAttrs& more) {
  OpKernelContext ctx(tf_ctx);
  // Every message starts with `where` (rt::guard adds it to exceptions).
  const std::string where = ctx.op_name() + " (" + op_type + " on the NPU)";
  auto in_context = [&](const rt::Status& s) {
    return s.ok() ? s : rt::Status(s.code(), where + ": " + s.message());
  };
  rt::Status st = rt::guard(where, [&]() -> rt::Status {
    if (inputs.empty())
      return in_context(rt::Status(rt::StatusCode::internal, "no inputs"));
    compiler::OpDesc op;
    op.type = op_type;
    std::vector<uint64_t> input_addrs, output_addrs;
    for (const UpdateTensor& t : inputs) {
      auto dt = from_tf_dtype(t.dtype);
      if (!dt)
        return in_context(rt::Status(rt::StatusCode::unsupported,
                                     "dtype " + tf_dtype_name(t.dtype) +
                                         " cannot live on the NPU"));
      op.inputs.push_back({*dt, t.shape});
      input_addrs.push_back(t.address);
    }
    // The attributes the compiled-op kernels pass (T first), so an update shares its compiled
    // op with a plain op of the same signature.
    op.attrs["T"] = std::string(compiler::data_type_name(op.inputs[0].dtype));
    for (const auto& [name, value] : bool_attrs) op.attrs[name] = value;
    for (const auto& [name, value] : more.ints) op.attrs[name] = value;
    for (const auto& [name, value] : more.int_lists) op.attrs[name] = value;
    for (const auto& [name, value] : more.string_lists) op.attrs[name] = value;

    std::shared_ptr<rt::Device> device;
    std::shared_ptr<const CompiledOp> compiled;
    rt::Status s = compile_op(ctx, op, &device, &compiled);
    if (!s.ok()) return in_context(s);
    const std::vector<compiler::TensorDesc>& outs = compiled->kernel.outputs;
    if (outs.size() != outputs.size())
      return in_context(rt::Status(rt::StatusCode::internal,
                                   op.str() + ": the compiler gives " +
                                       std::to_string(outs.size()) + " outputs, expected " +
                                       std::to_string(outputs.size())));
    for (size_t i = 0; i < outs.size(); ++i) {
      auto dt = from_tf_dtype(outputs[i].dtype);
      if (!dt || outs[i].dtype != *dt || outs[i].shape != outputs[i].shape)
        return in_context(rt::Status(rt::StatusCode::internal,
                                     op.str() + ": the compiler's output " + std::to_string(i) +
                                         " is not a " + tf_dtype_name(outputs[i].dtype) +
                                         " tensor of the variable's shape"));
      output_addrs.push_back(outputs[i].address);
    }
    return in_context(launch_compiled_op(&ctx, device, op, *compiled, input_addrs, output_addrs,
                                         {}, more.members, more.report_type, more.dispatch));
  });
  if (st.ok()) return {};
  return {tf_code(st.code()), st.message()};
}

uint64_t new_dispatch_id() { return next_dispatch_id(); }

DenseUpdateStatus copy_on_device(TF_OpKernelContext* ctx, TF_DataType dtype, int64_t elements,
                                 uint64_t from, uint64_t to) {
  UpdateAttrs attrs;
  attrs.ints = {{"N", 1}, {"axis", 0}};
  return run_compiled_update(ctx, "Pack", {}, {{dtype, {elements}, from}},
                             {{dtype, {1, elements}, to}}, attrs);
}

DenseUpdateStatus run_dense_update(TF_OpKernelContext* ctx, const char* binary_op,
                                   TF_DataType dtype, const std::vector<int64_t>& shape,
                                   uint64_t lhs, uint64_t rhs, uint64_t out) {
  // The elementwise kernel class passes only T (compiled_op_table.cpp), as run_compiled_update
  // does.
  return run_compiled_update(ctx, binary_op, {}, {{dtype, shape, lhs}, {dtype, shape, rhs}},
                             {{dtype, shape, out}});
}

}  // namespace npusim::tf
