// Random ops on the NPU: StatelessRandomGetKeyCounter and StatelessRandomUniformV2, what Keras
// 3's Dropout (tf.nn.experimental.stateless_dropout) and tf.random.stateless_uniform run, and
// the stateful RandomUniform (tf-keras' Dropout, tf.random.uniform). The compiler's kernels (adapter/compiler/ops/random.h: Philox4x32-10 on the scalar unit)
// give TensorFlow's CPU bits for the same seed / key / counter.
//
// TF's key and counter are uint64 tensors, a type the compiler does not list: these kernels
// describe them to the compiler as s64 (the same 8 bytes; the kernels only move and split the
// words) and allocate them as uint64. Shape and alg are HostMemory (as TF's GPU kernels): their
// values become the compiler's "shape" and "alg" attributes. Key and counter stay in device
// memory, so GetKeyCounter -> UniformV2 never leaves the chip. In whole-graph runs the two
// stateless ops are steps of an NpuGraph task list instead (npu_graph_kernel.cpp describes the
// key and counter the same way; task_list_op_attrs names the attribute these kernels pass).
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/compiled_op_table.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {
namespace {

constexpr char kUniformV2[] = "StatelessRandomUniformV2";
// StatelessRandomUniformV2's inputs (TF's op definition).
constexpr int kShapeInput = 0, kAlgInput = 3;


// A tensor as the compiler sees it: uint64 as s64 (same bits), other types as Tensor::desc.
rt::Status random_desc(const Tensor& t, compiler::TensorDesc* out) {
  if (t.dtype() == TF_UINT64) {
    *out = compiler::TensorDesc{compiler::DataType::S64, t.shape()};
    return rt::ok_status();
  }
  return t.desc(out);
}

// Compiles `op` and runs it for the kernel in ctx: outputs allocated with TensorFlow's
// expected dtypes (uint64 for the compiler's s64 key / counter); `before_launch`, if given, runs
// after compiling (with the device and the op's stream) and may rewrite the input addresses,
// e.g. to upload a key and counter.
using BeforeLaunch = std::function<rt::Status(rt::Device&, std::vector<uint64_t>*)>;

rt::Status run_random_op(OpKernelContext* ctx, const compiler::OpDesc& op,
                         std::vector<uint64_t> input_addrs, const BeforeLaunch& before_launch) {
  std::shared_ptr<rt::Device> device;
  std::shared_ptr<const CompiledOp> compiled;
  rt::Status st = compile_op(*ctx, op, &device, &compiled);
  if (!st.ok()) return st;
  const compiler::CompiledKernel& k = compiled->kernel;
  if (static_cast<int>(k.outputs.size()) != ctx->num_outputs())
    return rt::Status(rt::StatusCode::internal,
                      op.str() + ": the compiler gives " + std::to_string(k.outputs.size()) +
                          " outputs, TensorFlow expects " + std::to_string(ctx->num_outputs()));
  std::vector<Tensor> outputs(k.outputs.size());
  std::vector<uint64_t> output_addrs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const TF_DataType expected = ctx->expected_output_dtype(static_cast<int>(i));
    const bool same = expected == TF_UINT64 ? k.outputs[i].dtype == compiler::DataType::S64
                                            : to_tf_dtype(k.outputs[i].dtype) == expected;
    if (!same)
      return rt::Status(rt::StatusCode::internal,
                        op.str() + ": output " + std::to_string(i) + " compiled as " +
                            compiler::data_type_name(k.outputs[i].dtype) +
                            ", TensorFlow expects " + tf_dtype_name(expected));
    st = ctx->allocate_output(static_cast<int>(i), expected, k.outputs[i].shape, &outputs[i]);
    if (!st.ok()) return st;
    output_addrs.push_back(outputs[i].device_address());
  }
  if (k.launches.empty()) return rt::ok_status();
  if (before_launch) {
    st = before_launch(*device, &input_addrs);
    if (!st.ok()) return st;
  }
  return launch_compiled_op(ctx, device, op, *compiled, input_addrs, output_addrs);
}

class RandomOpKernel : public OpKernel {
 public:
  explicit RandomOpKernel(OpKernelConstruction* ctx) : m_type(ctx->type_string()) {
    if (m_type != kUniformV2) return;
    TF_DataType dtype = TF_FLOAT;
    rt::Status st = ctx->GetAttr("dtype", &dtype);
    auto t = from_tf_dtype(dtype);
    if (st.ok() && !t)
      st = rt::Status(rt::StatusCode::invalid_argument,
                      m_type + ": dtype " + tf_dtype_name(dtype) + " cannot live on the NPU");
    if (!st.ok()) {
      ctx->CtxFailure(st);
      return;
    }
    m_attrs["dtype"] = std::string(compiler::data_type_name(*t));
  }

  void Compute(OpKernelContext* ctx) override {
    compiler::OpDesc op;
    op.type = m_type;
    op.attrs = m_attrs;
    std::vector<Tensor> inputs(static_cast<size_t>(ctx->num_inputs()));
    std::vector<uint64_t> input_addrs;
    for (size_t i = 0; i < inputs.size(); ++i) {
      NPU_OP_REQUIRES_OK(ctx, ctx->input(static_cast<int>(i), &inputs[i]));
      compiler::TensorDesc d;
      NPU_OP_REQUIRES_OK(ctx, random_desc(inputs[i], &d));
      op.inputs.push_back(std::move(d));
      input_addrs.push_back(inputs[i].device_address());
    }
    if (m_type == kUniformV2 && inputs.size() == 4) {
      std::vector<int64_t> shape, alg;
      NPU_OP_REQUIRES_OK(ctx, host_ints(m_type, inputs[kShapeInput], kShapeInput, &shape));
      NPU_OP_REQUIRES_OK(ctx, host_ints(m_type, inputs[kAlgInput], kAlgInput, &alg));
      if (alg.size() != 1) {
        ctx->CtxFailure(rt::Status(rt::StatusCode::invalid_argument,
                                   m_type + ": alg must be a scalar"));
        return;
      }
      op.attrs["shape"] = shape;
      op.attrs["alg"] = alg[0];
      input_addrs[kShapeInput] = input_addrs[kAlgInput] = 0;  // host memory
    }

    NPU_OP_REQUIRES_OK(ctx, run_random_op(ctx, op, input_addrs, nullptr));
  }

 private:
  std::string m_type;
  std::map<std::string, compiler::AttrValue> m_attrs;
};

// RandomUniform (stateful; tf-keras' Dropout, tf.random.uniform): TensorFlow's
// PhiloxRandomOp with its GuardedPhiloxRandom on the host. The generator starts at
// PhiloxRandom(seed, seed2) (key = seed's two u32 words, counter = {0, 0, seed2's words}), or at
// two random 64-bit seeds when both attributes are 0 (as TF's New64(): not reproducible either
// way); each run reserves n * 256 Philox groups (ReserveRandomOutputs(n, 256): the counter
// advances by that much) and fills the output from the counter it had before, exactly as
// StatelessRandomUniformV2 with that key and counter. So the state stays on the host, per kernel
// instance as in TF, and each run uploads 24 bytes (key, counter) to a temporary on the op's
// stream before the compiled StatelessRandomUniformV2 kernel reads them.
class StatefulUniformKernel : public OpKernel {
 public:
  explicit StatefulUniformKernel(OpKernelConstruction* ctx) {
    TF_DataType dtype = TF_FLOAT;
    int64_t seed = 0, seed2 = 0;
    rt::Status st = ctx->GetAttr("dtype", &dtype);
    if (st.ok()) st = ctx->GetAttr("seed", &seed);
    if (st.ok()) st = ctx->GetAttr("seed2", &seed2);
    auto t = from_tf_dtype(dtype);
    if (st.ok() && !t)
      st = rt::Status(rt::StatusCode::invalid_argument,
                      std::string("RandomUniform: dtype ") + tf_dtype_name(dtype) +
                          " cannot live on the NPU");
    if (!st.ok()) {
      ctx->CtxFailure(st);
      return;
    }
    m_dtype = compiler::data_type_name(*t);
    if (seed == 0 && seed2 == 0) {
      std::random_device rd;
      auto word = [&rd] { return uint64_t{rd()} << 32 | rd(); };
      seed = static_cast<int64_t>(word());
      seed2 = static_cast<int64_t>(word());
    }
    m_key = static_cast<uint64_t>(seed);
    m_counter_hi = static_cast<uint64_t>(seed2);
  }

  void Compute(OpKernelContext* ctx) override {
    Tensor shape_t;
    NPU_OP_REQUIRES_OK(ctx, ctx->input(0, &shape_t));
    std::vector<int64_t> shape;
    NPU_OP_REQUIRES_OK(ctx, host_ints("RandomUniform", shape_t, 0, &shape));
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    compiler::OpDesc op;
    op.type = kUniformV2;
    op.attrs = {{"shape", shape}, {"alg", int64_t{1}}, {"dtype", m_dtype}};
    compiler::TensorDesc shape_desc;
    NPU_OP_REQUIRES_OK(ctx, shape_t.desc(&shape_desc));
    op.inputs = {shape_desc, compiler::TensorDesc{compiler::DataType::S64, {1}},
                 compiler::TensorDesc{compiler::DataType::S64, {2}},
                 compiler::TensorDesc{compiler::DataType::S32, {}}};
    // key, counter low and high 64 bits (TF's uint64 key / counter layout)
    uint64_t words[3];
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      words[0] = m_key;
      words[1] = m_counter_lo;
      words[2] = m_counter_hi;
      const uint64_t skip = static_cast<uint64_t>(n) * 256;  // ReserveRandomOutputs(n, 256)
      m_counter_lo += skip;
      if (m_counter_lo < skip) ++m_counter_hi;
    }
    Tensor key_counter;
    auto upload = [&](rt::Device& device, std::vector<uint64_t>* addrs) {
      rt::Status st = ctx->allocate_temp(TF_UINT8, {64}, &key_counter);
      if (!st.ok()) return st;
      rt::Stream stream;
      st = ctx->npu_stream(&stream);
      if (!st.ok()) return st;
      const uint64_t a = key_counter.device_address();
      // `words` outlives the copy: launch_compiled_op waits for the stream.
      st = device.memcpy_h2d_async(stream, a, words, sizeof words);
      (*addrs)[1] = a;
      (*addrs)[2] = a + 8;
      return st;
    };
    NPU_OP_REQUIRES_OK(ctx, run_random_op(ctx, op, {0, 0, 0, 0}, upload));
  }

 private:
  std::string m_dtype;
  std::mutex m_mutex;
  uint64_t m_key = 0, m_counter_lo = 0, m_counter_hi = 0;
};

}  // namespace

rt::Status register_random_kernels(const std::vector<TableKernelDef>& compiler_ops) {
  for (const TableKernelDef& d : compiler_ops) {
    rt::Status st = register_kernel<RandomOpKernel>(kernel_def_builder(d));
    if (!st.ok()) return st;
  }
  return register_kernel<StatefulUniformKernel>(
      KernelDefBuilder("RandomUniform")
          .TypeConstraint("dtype", tf_types(compiler::ops::kFloatTypes))
          .TypeConstraint("T", tf_types(compiler::ops::kIndexTypes))
          .HostMemory("shape"));
}

}  // namespace npusim::tf
