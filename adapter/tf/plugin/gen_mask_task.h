// DropOutGenMask's AI CPU task (kernels_gen_mask.cpp), shared by its kernel (node by node) and
// by the NpuGraph kernel (npu_graph_kernel.cpp), where the mask is one step of a graph's task
// list: the op's inputs checked the same way, the task queued the same way.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "adapter/runtime/device.h"
#include "adapter/tf/plugin/gen_mask.h"
#include "tensorflow/c/tf_datatype.h"

namespace npusim::tf {

inline constexpr const char* kGenMaskOp = "DropOutGenMask";
// The op's inputs (kernels_gen_mask.cpp's definition); shape and alg are host inputs.
inline constexpr int kGenMaskShapeInput = 0, kGenMaskKeyInput = 1, kGenMaskCounterInput = 2,
                     kGenMaskAlgInput = 3;

// One mask of a run: its attributes (the uniform's dtype, the rate in it) and its tensors'
// device addresses. key: 1 uint64; counter: 2 uint64 (low, high: TF's layout); both read from
// device memory when the task runs (so an earlier step of the same stream may write them);
// mask: `elements` bytes, 0 or 1 each.
struct GenMaskTask {
  UniformType type = UniformType::f32;
  float rate = 0;
  uint64_t key_addr = 0, counter_addr = 0, mask_addr = 0, elements = 0;
};

// The uniform type of the op's `dtype` attribute; invalid_argument naming it for another type.
rt::Status gen_mask_uniform_type(TF_DataType dtype, UniformType* out);

// Checks the op's inputs (the shape's and alg's values, the key's and counter's element
// counts) and gives the mask's element count; invalid_argument naming what is wrong.
rt::Status check_gen_mask_inputs(const std::vector<int64_t>& shape, const std::vector<int64_t>& alg,
                                 int64_t key_elements, int64_t counter_elements,
                                 uint64_t* elements);

// The label of node `node`'s mask of `shape` (op type DropOutGenMask; its uint64 inputs and
// bool output), dispatch 0, for the caller to set.
std::shared_ptr<rt::LaunchLabel> gen_mask_label(const std::string& node,
                                                const std::vector<int64_t>& shape);

// Queues `task` (elements > 0) as one AI CPU task on `stream` (Device::ai_cpu_task_async),
// timed by rt::gen_mask_cycles: the stream's next kernel does not wait for it, a reader of the
// mask does. failed_precondition naming the node if the chip models no AI CPU.
rt::Status queue_gen_mask(rt::Device& device, rt::Stream stream, const GenMaskTask& task,
                          std::shared_ptr<const rt::LaunchLabel> label);

}  // namespace npusim::tf
