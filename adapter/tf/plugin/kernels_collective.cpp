// NpuCollective: HCCL's collectives between NPUs (each a chip of the process's system) as a
// TensorFlow op, what npusim.distribute and its MirroredStrategy CrossDeviceOps run.
//
//   NpuCollective(input: N * T) -> output: N * T
//     T in {float, half, bfloat16, int32}; N >= 1; collective in {all_reduce, broadcast};
//     reduction in {sum, prod, max, min} (all_reduce); root: int (broadcast: the rank whose
//     inputs every rank's outputs receive; the other ranks' inputs give only shape and dtype);
//     group_size, rank: this replica's place in the communicator; group_key: names the
//     communicator's collectives (as NCCL ops' shared_name does); fuse: the N inputs are one
//     collective over their concatenation, read and written in place (HCCL's fused gradient
//     segment, whose tensors GE allocates contiguously), instead of N collectives.
//   Not stateful: tf.function's automatic control dependencies chain stateful ops in program
//   order, which would make replica 1's op wait for replica 0's, and replica 0's op finishes
//   only once replica 1's has joined. npusim.distribute orders each replica's collectives itself.
//
// Each replica runs one such op on its NPU; output i of every rank is the collective of the
// ranks' inputs i, computed by the chips' collective engine (sim/collective: the data moves over
// the modelled links and is reduced where HCCL reduces it), not staged through the host.
//
// Why an AsyncOpKernel on TensorFlow's C++ API: a replica's op must not hold an executor thread
// until the other replicas arrive (TensorFlow may run them on that very thread). ComputeAsync
// queues this rank's part on the NPU stream and returns; `done` runs once the collective has
// run (collective_bridge.h). The C API has no asynchronous kernels. As in
// kernels_resource_variables.cpp, this file includes only C-API bridge headers of npusim.
#include <string>
#include <vector>

#include "adapter/tf/plugin/collective_bridge.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/tf_cc_kernel_util.h"

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_def_builder.h"
#include "tensorflow/core/framework/shape_inference.h"
#pragma GCC diagnostic pop

namespace npusim::tf {
namespace {

using namespace cc;  // NOLINT: tfc, device_address, register_npu_kernel, ...

class NpuCollectiveOp : public tfc::AsyncOpKernel {
 public:
  explicit NpuCollectiveOp(tfc::OpKernelConstruction* c) : AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("collective", &m_spec.collective));
    OP_REQUIRES_OK(c, c->GetAttr("reduction", &m_spec.reduction));
    OP_REQUIRES_OK(c, c->GetAttr("root", &m_spec.root));
    OP_REQUIRES_OK(c, c->GetAttr("group_size", &m_spec.group_size));
    OP_REQUIRES_OK(c, c->GetAttr("rank", &m_spec.rank));
    OP_REQUIRES_OK(c, c->GetAttr("group_key", &m_spec.group_key));
    OP_REQUIRES_OK(c, c->GetAttr("fuse", &m_spec.fuse));
    OP_REQUIRES(c, m_spec.rank < m_spec.group_size,
                absl::InvalidArgumentError(absl::StrCat(
                    "rank ", m_spec.rank, " is outside the group of ", m_spec.group_size)));
    OP_REQUIRES(c, m_spec.root >= 0 && m_spec.root < m_spec.group_size,
                absl::InvalidArgumentError(absl::StrCat(
                    "root ", m_spec.root, " is outside the group of ", m_spec.group_size)));
  }

  void ComputeAsync(tfc::OpKernelContext* ctx, DoneCallback done) override {
    std::vector<CollectiveTensor> tensors;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      const tfc::Tensor& in = ctx->input(i);
      tfc::Tensor* out = nullptr;
      OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(i, in.shape(), &out), done);
      const auto dims = in.shape().dim_sizes();
      tensors.push_back({static_cast<TF_DataType>(in.dtype()),
                         std::vector<int64_t>(dims.begin(), dims.end()), device_address(in),
                         device_address(*out)});
    }
    const absl::Status st = guarded_compute(*this, [&] {
      // TF_OpKernelContext is TensorFlow's OpKernelContext behind a C name (tensorflow/c/
      // kernels.cc casts it back), so the C-API layer can find the op's stream and device.
      return to_absl(queue_collective(reinterpret_cast<TF_OpKernelContext*>(ctx), m_spec, tensors,
                                      [ctx, done](DenseUpdateStatus result) {
                                        if (!result.ok()) ctx->SetStatus(to_absl(result));
                                        done();
                                      }));
    });
    if (!st.ok()) {
      ctx->SetStatus(st);
      done();
    }
  }

 private:
  CollectiveSpec m_spec;
};

absl::Status register_op_def() {
  tfc::OpRegistry::Global()->Register([](tfc::OpRegistrationData* data) -> absl::Status {
    return tfc::OpDefBuilder("NpuCollective")
        .Input("input: N * T")
        .Output("output: N * T")
        .Attr("T: {float, half, bfloat16, int32}")
        .Attr("N: int >= 1")
        .Attr("collective: {'all_reduce', 'broadcast'}")
        .Attr("reduction: {'sum', 'prod', 'max', 'min'} = 'sum'")
        .Attr("root: int >= 0 = 0")
        .Attr("group_size: int >= 1")
        .Attr("rank: int >= 0")
        .Attr("group_key: string")
        .Attr("fuse: bool = false")
        .SetShapeFn([](tfc::shape_inference::InferenceContext* c) {
          for (int i = 0; i < c->num_inputs(); ++i) c->set_output(i, c->input(i));
          return absl::OkStatus();
        })
        .Finalize(data);
  });
  return absl::OkStatus();
}

}  // namespace

rt::Status register_collective_kernels() {
  return rt::guard("registering the NPU's collective op", [] {
    absl::Status st = register_op_def();
    if (!st.ok()) return rt::Status(rt::StatusCode::internal, std::string(st.message()));
    tfc::KernelDefBuilder builder("NpuCollective");
    builder.Device("NPU");
    register_npu_kernel<NpuCollectiveOp>(builder, "NpuCollective");
    return rt::ok_status();
  });
}

}  // namespace npusim::tf
