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
// it; a reader of the mask does. In a whole-graph run the NpuGraph kernel queues the same task
// as a step of its task list (gen_mask_task.h, npu_graph_kernel.cpp).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "adapter/runtime/ai_cpu.h"
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/gen_mask.h"
#include "adapter/tf/plugin/gen_mask_task.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/op_defs.h"

namespace npusim::tf {
namespace {

constexpr int kAlgPhilox = 1, kAlgAutoSelect = 3;  // TF's rng_alg.h

// The mask's shape is the shape input's value, which the C shape API cannot read: unknown.
void gen_mask_shape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeInferenceContextSetUnknownShape(ctx, status);
}

rt::Status invalid(const std::string& what) {
  return rt::Status(rt::StatusCode::invalid_argument, std::string(kGenMaskOp) + ": " + what);
}

class GenMaskKernel : public OpKernel {
 public:
  explicit GenMaskKernel(OpKernelConstruction* ctx) {
    TF_DataType dtype = TF_FLOAT;
    rt::Status st = ctx->GetAttr("dtype", &dtype);
    if (st.ok()) st = ctx->GetAttr("rate", &m_rate);
    if (st.ok()) st = gen_mask_uniform_type(dtype, &m_type);
    if (!st.ok()) ctx->CtxFailure(st);
  }

  void Compute(OpKernelContext* ctx) override {
    Tensor shape_t, key_t, counter_t, alg_t;
    NPU_OP_REQUIRES_OK(ctx, ctx->input(kGenMaskShapeInput, &shape_t));
    NPU_OP_REQUIRES_OK(ctx, ctx->input(kGenMaskKeyInput, &key_t));
    NPU_OP_REQUIRES_OK(ctx, ctx->input(kGenMaskCounterInput, &counter_t));
    NPU_OP_REQUIRES_OK(ctx, ctx->input(kGenMaskAlgInput, &alg_t));
    std::vector<int64_t> shape, alg;
    NPU_OP_REQUIRES_OK(ctx, host_ints(kGenMaskOp, shape_t, kGenMaskShapeInput, &shape));
    NPU_OP_REQUIRES_OK(ctx, host_ints(kGenMaskOp, alg_t, kGenMaskAlgInput, &alg));
    GenMaskTask task;
    NPU_OP_REQUIRES_OK(ctx, check_gen_mask_inputs(shape, alg, key_t.NumElements(),
                                                  counter_t.NumElements(), &task.elements));
    Tensor mask;
    NPU_OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TF_BOOL, shape, &mask));
    if (task.elements == 0) return;

    std::shared_ptr<rt::Device> device;
    NPU_OP_REQUIRES_OK(ctx, ctx->npu_device(&device));
    rt::Stream stream;
    NPU_OP_REQUIRES_OK(ctx, ctx->npu_stream(&stream));
    task.type = m_type;
    task.rate = m_rate;
    task.key_addr = key_t.device_address();
    task.counter_addr = counter_t.device_address();
    task.mask_addr = mask.device_address();
    auto label = gen_mask_label(ctx->op_name(), shape);
    label->dispatch = next_dispatch_id();
    rt::Status st = queue_gen_mask(*device, stream, task, std::move(label));
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

rt::Status gen_mask_uniform_type(TF_DataType dtype, UniformType* out) {
  if (dtype == TF_FLOAT)
    *out = UniformType::f32;
  else if (dtype == TF_HALF)
    *out = UniformType::f16;
  else if (dtype == TF_BFLOAT16)
    *out = UniformType::bf16;
  else
    return invalid(std::string("dtype ") + tf_dtype_name(dtype) +
                   " is not a uniform's (float, half, bfloat16)");
  return rt::ok_status();
}

rt::Status check_gen_mask_inputs(const std::vector<int64_t>& shape, const std::vector<int64_t>& alg,
                                 int64_t key_elements, int64_t counter_elements,
                                 uint64_t* elements) {
  if (alg.size() != 1) return invalid("alg must be a scalar");
  if (alg[0] != kAlgPhilox && alg[0] != kAlgAutoSelect)
    return invalid("unsupported algorithm id " + std::to_string(alg[0]) +
                   " (1: Philox, 3: auto-select)");
  if (key_elements != 1)
    return invalid("key must hold 1 uint64, got " + std::to_string(key_elements));
  if (counter_elements < 2)
    return invalid("counter must hold at least 2 uint64, got " + std::to_string(counter_elements));
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return invalid("negative dimension in the shape");
    n *= d;
  }
  *elements = static_cast<uint64_t>(n);
  return rt::ok_status();
}

std::shared_ptr<rt::LaunchLabel> gen_mask_label(const std::string& node,
                                                const std::vector<int64_t>& shape) {
  auto label = std::make_shared<rt::LaunchLabel>();
  label->op_name = node;
  label->op_type = kGenMaskOp;
  label->inputs = {{{1}, "DT_UINT64"}, {{2}, "DT_UINT64"}};
  label->outputs = {{shape, "DT_BOOL"}};
  return label;
}

rt::Status queue_gen_mask(rt::Device& device, rt::Stream stream, const GenMaskTask& t,
                          std::shared_ptr<const rt::LaunchLabel> label) {
  if (device.config().ai_cpu_cores <= 0)
    return rt::Status(rt::StatusCode::failed_precondition,
                      std::string(kGenMaskOp) + " (node '" + (label ? label->op_name : "") +
                          "'): chip '" + device.config().name +
                          "' models no AI CPU (its config has no ai_cpu section)");
  rt::AiCpuTask task;
  task.kernel = kGenMaskOp;
  task.inputs = {{t.key_addr, 8}, {t.counter_addr, 16}};
  task.outputs = {{t.mask_addr, t.elements}};
  task.cycles = rt::gen_mask_cycles(device.config(), t.elements);
  task.compute = [t](DeviceMemory& mem) -> rt::Status {
    uint64_t key = 0, counter[2] = {0, 0};
    mem.read(t.key_addr, &key, sizeof key);
    mem.read(t.counter_addr, counter, sizeof counter);
    std::vector<uint8_t> bits(t.elements);
    gen_mask(key, counter[0], counter[1], t.type, t.rate, bits.data(), t.elements);
    mem.write(t.mask_addr, bits.data(), t.elements);
    return rt::ok_status();
  };
  task.label = std::move(label);
  return device.ai_cpu_task_async(stream, std::move(task));
}

rt::Status register_gen_mask_kernel() {
  rt::Status st =
      register_op_def({kGenMaskOp,
                       {"shape: Tshape", "key: uint64", "counter: uint64", "alg: int32"},
                       {"mask: bool"},
                       {"dtype: {float, half, bfloat16} = DT_FLOAT", "rate: float",
                        "Tshape: {int32, int64} = DT_INT32"},
                       gen_mask_shape});
  if (!st.ok()) return st;
  st = register_kernel<GenMaskKernel>(
      KernelDefBuilder(kGenMaskOp).HostMemory("shape").HostMemory("alg"));
  g_gen_mask_registered = st.ok();
  return st;
}

}  // namespace npusim::tf
