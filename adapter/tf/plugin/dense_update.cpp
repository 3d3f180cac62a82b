#include "adapter/tf/plugin/dense_update.h"

#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/plugin_device.h"

namespace npusim::tf {

DenseUpdateStatus run_dense_update(TF_OpKernelContext* tf_ctx, const char* binary_op,
                                   TF_DataType dtype, const std::vector<int64_t>& shape,
                                   uint64_t lhs, uint64_t rhs, uint64_t out) {
  OpKernelContext ctx(tf_ctx);
  // Every message starts with `where` (rt::guard adds it to exceptions).
  const std::string where = ctx.op_name() + " (" + binary_op + " on the NPU)";
  auto in_context = [&](const rt::Status& s) {
    return s.ok() ? s : rt::Status(s.code(), where + ": " + s.message());
  };
  rt::Status st = rt::guard(where, [&]() -> rt::Status {
    auto dt = from_tf_dtype(dtype);
    if (!dt)
      return in_context(rt::Status(rt::StatusCode::unsupported,
                                   "dtype " + tf_dtype_name(dtype) + " cannot live on the NPU"));
    compiler::OpDesc op;
    op.type = binary_op;
    // The attributes the binary family's kernels pass (kernels_binary.cpp), so an update shares
    // its compiled op with a plain AddV2/Sub of the same shape.
    op.attrs["T"] = std::string(compiler::data_type_name(*dt));
    op.inputs = {{*dt, shape}, {*dt, shape}};

    std::shared_ptr<rt::Device> device;
    std::shared_ptr<const CompiledOp> compiled;
    rt::Status s = compile_op(op, &device, &compiled);
    if (!s.ok()) return in_context(s);
    const std::vector<compiler::TensorDesc>& outs = compiled->kernel.outputs;
    if (outs.size() != 1 || outs[0].dtype != *dt || outs[0].shape != shape)
      return in_context(rt::Status(rt::StatusCode::internal,
                                   op.str() + ": the compiler's output is not one " +
                                       compiler::data_type_name(*dt) +
                                       " tensor of the inputs' shape"));
    return in_context(launch_compiled_op(&ctx, *device, op, *compiled, {lhs, rhs}, {out}));
  });
  if (st.ok()) return {};
  return {tf_code(st.code()), st.message()};
}

}  // namespace npusim::tf
