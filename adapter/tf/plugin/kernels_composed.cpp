// Ops the compiler has no kernel for, run as a fixed sequence of compiled ops on the op's stream
// (each compiled once per shape through CompiledOpCache, intermediate results in TensorFlow
// temporaries; a compiled op's outputs never alias its inputs). (AddN, once composed here, is a
// compiled op of the table now: ops/fused_elementwise.cpp, one launch, clusterable.)
// - RsqrtGrad (Keras' BatchNormalization normalises with Rsqrt): TF's CPU kernel evaluates
//   -0.5 * (dy * y) * (y * y) per element (Eigen's scalar_rsqrt_gradient_op); here the same
//   products as compiled Mul launches, the constant -0.5 a scalar written by a memset on the
//   stream. Scaling by -0.5 is exact, so f32 results equal TF's bit for bit (f16/bf16: TF's half
//   kernels also round after each product).
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/compiled_op_table.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/plugin_device.h"

namespace npusim::tf {
namespace {

// Compiles `op` (cached) and runs it on ctx's stream with the given device addresses.
rt::Status run_compiled(OpKernelContext* ctx, const compiler::OpDesc& op,
                        const std::vector<uint64_t>& inputs, const std::vector<uint64_t>& outputs) {
  std::shared_ptr<rt::Device> device;
  std::shared_ptr<const CompiledOp> compiled;
  rt::Status st = compile_op(*ctx, op, &device, &compiled);
  if (!st.ok()) return st;
  return launch_compiled_op(ctx, device, op, *compiled, inputs, outputs);
}

// Inputs 0..n-1 of ctx, all of one dtype and shape (`what` names the op in errors).
rt::Status same_shape_inputs(OpKernelContext* ctx, const char* what, std::vector<Tensor>* x,
                             compiler::TensorDesc* desc) {
  x->resize(static_cast<size_t>(ctx->num_inputs()));
  for (int i = 0; i < ctx->num_inputs(); ++i) {
    rt::Status st = ctx->input(i, &(*x)[i]);
    if (!st.ok()) return st;
  }
  rt::Status st = (*x)[0].desc(desc);
  if (!st.ok()) return st;
  for (size_t i = 1; i < x->size(); ++i)
    if ((*x)[i].shape() != desc->shape || (*x)[i].dtype() != (*x)[0].dtype())
      return rt::Status(rt::StatusCode::invalid_argument,
                        std::string(what) + ": input " + std::to_string(i) +
                            " differs in shape or dtype from input 0");
  return rt::ok_status();
}

compiler::OpDesc binary_op(const char* type, const compiler::TensorDesc& a,
                           const compiler::TensorDesc& b) {
  compiler::OpDesc op;
  op.type = type;
  op.inputs = {a, b};
  return op;
}

// -0.5 in the bits of `t`, repeated to fill 32 bits (memset32's pattern).
uint32_t minus_half_pattern(TF_DataType t) {
  switch (t) {
    case TF_HALF: return 0xB800B800u;
    case TF_BFLOAT16: return 0xBF00BF00u;
    default: return 0xBF000000u;  // f32
  }
}

class RsqrtGradOp : public OpKernel {
 public:
  explicit RsqrtGradOp(OpKernelConstruction*) {}

  void Compute(OpKernelContext* ctx) override {
    std::vector<Tensor> in;  // y, dy
    compiler::TensorDesc d;
    NPU_OP_REQUIRES_OK(ctx, same_shape_inputs(ctx, "RsqrtGrad", &in, &d));
    const TF_DataType t = in[0].dtype();
    Tensor out, dy_y, y_y, scaled, minus_half;
    NPU_OP_REQUIRES_OK(ctx, ctx->allocate_output(0, t, d.shape, &out));
    if (out.NumElements() == 0) return;
    for (Tensor* tmp : {&dy_y, &y_y, &scaled})
      NPU_OP_REQUIRES_OK(ctx, ctx->allocate_temp(t, d.shape, tmp));
    // The scalar constant: 4 bytes (one f32, or two 16-bit values) written by memset32.
    NPU_OP_REQUIRES_OK(ctx, ctx->allocate_temp(t, {t == TF_FLOAT ? 1 : 2}, &minus_half));
    std::shared_ptr<rt::Device> device;
    NPU_OP_REQUIRES_OK(ctx, ctx->npu_device(&device));
    rt::Stream stream;
    NPU_OP_REQUIRES_OK(ctx, ctx->npu_stream(&stream));
    NPU_OP_REQUIRES_OK(ctx, device->memset32_async(stream, minus_half.device_address(),
                                                   minus_half_pattern(t), 4));
    const compiler::TensorDesc scalar{d.dtype, {}};
    const uint64_t y = in[0].device_address(), dy = in[1].device_address();
    const compiler::OpDesc mul = binary_op("Mul", d, d);
    NPU_OP_REQUIRES_OK(ctx, run_compiled(ctx, mul, {dy, y}, {dy_y.device_address()}));
    NPU_OP_REQUIRES_OK(ctx, run_compiled(ctx, mul, {y, y}, {y_y.device_address()}));
    NPU_OP_REQUIRES_OK(ctx, run_compiled(ctx, binary_op("Mul", scalar, d),
                                         {minus_half.device_address(), dy_y.device_address()},
                                         {scaled.device_address()}));
    NPU_OP_REQUIRES_OK(ctx, run_compiled(ctx, mul,
                                         {scaled.device_address(), y_y.device_address()},
                                         {out.device_address()}));
  }
};

}  // namespace

rt::Status register_composed_kernels() {
  const std::vector<TF_DataType> floats = tf_types(compiler::ops::kFloatTypes);
  return register_kernel<RsqrtGradOp>(KernelDefBuilder("RsqrtGrad").TypeConstraint("T", floats));
}

}  // namespace npusim::tf
