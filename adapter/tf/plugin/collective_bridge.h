// Between the NPU collective kernel (kernels_collective.cpp, TensorFlow's C++ kernel API) and the
// runtime (collective_bridge.cpp): C API types only, like dense_update.h, so TensorFlow's C++
// headers and npusim's never meet in one file.
//
// A collective is HCCL's op on a communicator: each of `group_size` replicas (one per NPU, i.e.
// per chip of the process's system) runs an NpuCollective op with the same group_key and its own
// rank; the k-th op a rank runs under a key joins the k-th collective of that key (TensorFlow
// runs a replica's ops on a key in program order: the Python layer chains them with control
// dependencies). queue_collective queues this rank's part on the chip's collective stream (one
// per chip, behind what the op's NPU stream holds so far) and returns at once; the driver runs
// the collective (run_collective: the chips' links and reductions) once every rank has queued
// its part, and `done` is then called from a helper thread with the collective's status, so no
// executor thread and no op queued on an NPU stream waits for the other replicas.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "adapter/tf/plugin/dense_update.h"
#include "tensorflow/c/kernels.h"
#include "tensorflow/c/tf_datatype.h"

namespace npusim::tf {

struct CollectiveTensor {
  TF_DataType dtype = TF_FLOAT;
  std::vector<int64_t> shape;
  uint64_t input = 0;   // device address (the chip's own) of this rank's input
  uint64_t output = 0;  // and of its output, of the same shape
};

struct CollectiveSpec {
  std::string collective;  // "all_reduce" or "broadcast"
  std::string reduction;   // all_reduce: "sum", "prod", "max", "min"
  int root = 0;            // broadcast: the rank whose input every output receives
  int group_size = 0;
  int rank = 0;
  std::string group_key;
  // all_reduce, broadcast: the op's tensors are one collective, each rank's buffer their
  // concatenation (HCCL's fused gradient segment; CollectiveCall::send_pieces), instead of one
  // collective per tensor.
  bool fuse = false;
};

// Queues this rank's part of one collective per tensor (in order; with spec.fuse one for all of
// them) on the chip's collective stream, after what ctx's stream holds; `done` gets the first
// failure among them, or ok. A malformed call (rank outside the group, a device that is not a chip
// of a system, a dtype HCCL cannot reduce) fails at once: the returned status, and `done` is not
// called. Errors found when the collective runs (ranks whose tensors differ in element count) reach
// `done` for every rank, naming the ranks.
DenseUpdateStatus queue_collective(TF_OpKernelContext* ctx, const CollectiveSpec& spec,
                                   const std::vector<CollectiveTensor>& tensors,
                                   std::function<void(DenseUpdateStatus)> done);

}  // namespace npusim::tf
