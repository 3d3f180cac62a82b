// DropOutGenMask: a dropout's keep mask made on the chip's AI CPU (docs/runtime.md, "The AI CPU
// timeline"), as CANN and MindSpore run DropOutGenMask beside the AI cores. It stands for what
// the graph rewrite (gen_mask_rewrite.cpp) replaces:
//   mask = GreaterEqual(StatelessRandomUniformV2(shape, key, counter, alg; dtype), rate)
// with TensorFlow's bits: element i is TF's uniform sample i of dtype (Philox4x32-10 of counter
// + i / 4, word i % 4; adapter/compiler/ops/random.h gives the derivation), compared in dtype
// with the rate (a float attribute holding the rate constant's dtype value exactly).
//
// Op definition: inputs shape (Tshape, host memory), key (uint64 [1]), counter (uint64 [>= 2]),
// alg (int32 scalar, host memory; 1 Philox or 3 auto-select, as the uniform's kernel takes);
// output mask (bool, the shape's elements, 0 or 1 per byte); attributes dtype (float, half or
// bfloat16: the uniform's), rate (float), Tshape (int32, int64).
//
// The kernel queues one AI CPU task (Device::ai_cpu_task_async) on the op's stream: it reads key
// and counter from device memory and writes the mask, on the AI CPU timeline, its cost
// rt::gen_mask_cycles of the mask's element count. The stream's next kernel does not wait for
// it; a reader of the mask does.
#include <cstdint>
#include <string>
#include <vector>

#include "adapter/runtime/ai_cpu.h"
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/gen_mask.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/op_defs.h"

namespace npusim::tf {
namespace {

constexpr char kGenMask[] = "DropOutGenMask";
constexpr int kAlgPhilox = 1, kAlgAutoSelect = 3;  // TF's rng_alg.h

// The mask's shape is the shape input's value, which the C shape API cannot read: unknown.
void gen_mask_shape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeInferenceContextSetUnknownShape(ctx, status);
}

rt::Status invalid(const std::string& what) {
  return rt::Status(rt::StatusCode::invalid_argument, std::string(kGenMask) + ": " + what);
}

class GenMaskKernel : public OpKernel {
 public:
  explicit GenMaskKernel(OpKernelConstruction* ctx) {
    TF_DataType dtype = TF_FLOAT;
    rt::Status st = ctx->GetAttr("dtype", &dtype);
    if (st.ok()) st = ctx->GetAttr("rate", &m_rate);
    if (st.ok()) {
      if (dtype == TF_FLOAT)
        m_type = UniformType::f32;
      else if (dtype == TF_HALF)
        m_type = UniformType::f16;
      else if (dtype == TF_BFLOAT16)
        m_type = UniformType::bf16;
      else
        st = invalid(std::string("dtype ") + tf_dtype_name(dtype) +
                     " is not a uniform's (float, half, bfloat16)");
    }
    if (!st.ok()) ctx->CtxFailure(st);
  }

  void Compute(OpKernelContext* ctx) override {
    Tensor shape_t, key_t, counter_t, alg_t;
    NPU_OP_REQUIRES_OK(ctx, ctx->input(0, &shape_t));
    NPU_OP_REQUIRES_OK(ctx, ctx->input(1, &key_t));
    NPU_OP_REQUIRES_OK(ctx, ctx->input(2, &counter_t));
    NPU_OP_REQUIRES_OK(ctx, ctx->input(3, &alg_t));
    std::vector<int64_t> shape, alg;
    NPU_OP_REQUIRES_OK(ctx, host_ints(kGenMask, shape_t, 0, &shape));
    NPU_OP_REQUIRES_OK(ctx, host_ints(kGenMask, alg_t, 3, &alg));
    if (alg.size() != 1) return ctx->CtxFailure(invalid("alg must be a scalar"));
    if (alg[0] != kAlgPhilox && alg[0] != kAlgAutoSelect)
      return ctx->CtxFailure(invalid("unsupported algorithm id " + std::to_string(alg[0]) +
                                     " (1: Philox, 3: auto-select)"));
    if (key_t.NumElements() != 1)
      return ctx->CtxFailure(
          invalid("key must hold 1 uint64, got " + std::to_string(key_t.NumElements())));
    if (counter_t.NumElements() < 2)
      return ctx->CtxFailure(invalid("counter must hold at least 2 uint64, got " +
                                     std::to_string(counter_t.NumElements())));
    int64_t n = 1;
    for (int64_t d : shape) {
      if (d < 0) return ctx->CtxFailure(invalid("negative dimension in the shape"));
      n *= d;
    }
    Tensor mask;
    NPU_OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TF_BOOL, shape, &mask));
    if (n == 0) return;

    std::shared_ptr<rt::Device> device;
    NPU_OP_REQUIRES_OK(ctx, ctx->npu_device(&device));
    rt::Stream stream;
    NPU_OP_REQUIRES_OK(ctx, ctx->npu_stream(&stream));
    const uint64_t key_addr = key_t.device_address(), counter_addr = counter_t.device_address();
    const uint64_t mask_addr = mask.device_address();
    const uint64_t elements = static_cast<uint64_t>(n);

    rt::AiCpuTask task;
    task.kernel = kGenMask;
    task.inputs = {{key_addr, 8}, {counter_addr, 16}};
    task.outputs = {{mask_addr, elements}};
    if (device->config().ai_cpu_cores <= 0)
      return ctx->CtxFailure(rt::Status(
          rt::StatusCode::failed_precondition,
          std::string(kGenMask) + " (node '" + ctx->op_name() + "'): chip '" +
              device->config().name + "' models no AI CPU (its config has no ai_cpu section)"));
    task.cycles = rt::gen_mask_cycles(device->config(), elements);
    const UniformType type = m_type;
    const float rate = m_rate;
    task.compute = [=](DeviceMemory& mem) -> rt::Status {
      uint64_t key = 0, counter[2] = {0, 0};
      mem.read(key_addr, &key, sizeof key);
      mem.read(counter_addr, counter, sizeof counter);
      std::vector<uint8_t> bits(elements);
      gen_mask(key, counter[0], counter[1], type, rate, bits.data(), elements);
      mem.write(mask_addr, bits.data(), elements);
      return rt::ok_status();
    };
    auto label = std::make_shared<rt::LaunchLabel>();
    label->op_name = ctx->op_name();
    label->op_type = kGenMask;
    label->inputs = {{{1}, "DT_UINT64"}, {{2}, "DT_UINT64"}};
    label->outputs = {{shape, "DT_BOOL"}};
    label->dispatch = next_dispatch_id();
    task.label = std::move(label);
    rt::Status st = device->ai_cpu_task_async(stream, std::move(task));
    // Wait, as launch_compiled_op does: the task reads key and counter, which TensorFlow may
    // reuse once Compute returns.
    const rt::Status sync = device->wait_stream_unobserved(stream);
    if (st.ok()) st = sync;
    NPU_OP_REQUIRES_OK(ctx, st);
  }

 private:
  UniformType m_type = UniformType::f32;
  float m_rate = 0;
};

bool g_gen_mask_registered = false;

}  // namespace

bool gen_mask_registered() { return g_gen_mask_registered; }

rt::Status register_gen_mask_kernel() {
  rt::Status st =
      register_op_def({kGenMask,
                       {"shape: Tshape", "key: uint64", "counter: uint64", "alg: int32"},
                       {"mask: bool"},
                       {"dtype: {float, half, bfloat16} = DT_FLOAT", "rate: float",
                        "Tshape: {int32, int64} = DT_INT32"},
                       gen_mask_shape});
  if (!st.ok()) return st;
  st = register_kernel<GenMaskKernel>(
      KernelDefBuilder(kGenMask).HostMemory("shape").HostMemory("alg"));
  g_gen_mask_registered = st.ok();
  return st;
}

}  // namespace npusim::tf
