// The chip side of the resource-variable kernels (kernels_resource_variables.cpp,
// kernels_optimizer.cpp): the arithmetic of a variable update, run as a compiled op on the op's
// NPU stream.
//
// Those files are written against TensorFlow's C++ kernel API and compiled with
// TensorFlow's headers (its own Eigen, abseil, ...), while the rest of the plugin uses the C API
// and npusim's headers. This header is the only thing both sides include, so it uses nothing but
// the C API and the standard library.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensorflow/c/kernels.h"
#include "tensorflow/c/tf_datatype.h"
#include "tensorflow/c/tf_status.h"

namespace npusim::tf {

struct DenseUpdateStatus {
  TF_Code code = TF_OK;  // TF_Code values are abseil's status codes
  std::string message;
  bool ok() const { return code == TF_OK; }
};

// out = lhs <binary_op> rhs on the chip, where binary_op is an op of the compiler's binary family
// ("AddV2", "Sub", ...) and lhs, rhs, out are `dtype` tensors of `shape` at device addresses
// (out a distinct buffer: compiled kernels never write over their inputs). `ctx` is the running
// kernel's context: the launches go on its NPU stream, the workspace comes from its allocator,
// and the stream is synchronised before returning. A dtype or shape the compiler does not handle
// is TF_UNIMPLEMENTED naming the op; a fault on the chip is TF_INTERNAL. Never throws.
DenseUpdateStatus run_dense_update(TF_OpKernelContext* ctx, const char* binary_op,
                                   TF_DataType dtype, const std::vector<int64_t>& shape,
                                   uint64_t lhs, uint64_t rhs, uint64_t out);

// A tensor of a compiled update: dtype, shape and device address.
struct UpdateTensor {
  TF_DataType dtype;
  std::vector<int64_t> shape;
  uint64_t address;
};

// Attributes of a compiled update other than T and the booleans.
struct UpdateAttrs {
  std::vector<std::pair<std::string, int64_t>> ints;
  std::vector<std::pair<std::string, std::vector<int64_t>>> int_lists;
  std::vector<std::pair<std::string, std::vector<std::string>>> string_lists;
  // Not an attribute: the member names of a multi-tensor update (its `_npusim_members`), which
  // name its launches (launch_compiled_op).
  std::vector<std::string> members;
  // Not an attribute: the op type its launches are reported under (`_npusim_report_type`);
  // empty: the compiler op's.
  std::string report_type;
  // Not an attribute: the launches' host dispatch (new_dispatch_id), shared by the compiled
  // updates of one Compute so that the op pays its host dispatch once; 0: a new one per update.
  uint64_t dispatch = 0;
};

// A new host dispatch value for UpdateAttrs::dispatch (docs/runtime.md, "Host dispatch").
uint64_t new_dispatch_id();

// Runs the compiler's op `op_type` (e.g. "ResourceApplyAdam") with attribute T = inputs[0]'s
// dtype, the boolean attributes `bool_attrs` (e.g. {"use_nesterov", false}), the attributes
// `more`, the given inputs, and outputs at the given addresses, whose dtypes and shapes must be
// what the compiler produces (checked: TF_INTERNAL otherwise). Same stream, workspace, error and
// no-throw rules as run_dense_update.
DenseUpdateStatus run_compiled_update(TF_OpKernelContext* ctx, const std::string& op_type,
                                      const std::vector<std::pair<std::string, bool>>& bool_attrs,
                                      const std::vector<UpdateTensor>& inputs,
                                      const std::vector<UpdateTensor>& outputs,
                                      const UpdateAttrs& more = {});

// `elements` elements of `dtype` copied from device address `from` to `to` (distinct buffers),
// one launch of the compiler's Pack of one input (a [1, elements] output, a plain copy), on
// ctx's stream, synchronised before returning. Same error and no-throw rules as above.
DenseUpdateStatus copy_on_device(TF_OpKernelContext* ctx, TF_DataType dtype, int64_t elements,
                                 uint64_t from, uint64_t to);

// The variables an NpuGraph run updates (npu_graph.h): its resource inputs [first, first + n),
// looked up and locked (exclusively, in address order, as LockedVariables and TensorFlow's
// MaybeLockVariableInputMutexesInOrder: two kernels sharing variables cannot deadlock) from
// lock() until destruction. The kernel reads each variable's tensor (value), allocates a new
// buffer for its next value (allocate_new_value: TensorFlow's allocator, as the update kernels
// do, so a tensor read from the variable before keeps its value), queues its launches, waits
// for them, and only then calls publish(), which makes the new buffers the variables' tensors;
// without publish() (a fault, an error) every variable keeps its tensor. Implemented on
// TensorFlow's C++ API (kernels_optimizer.cpp); never throws.
class GraphVariables {
 public:
  // Looks up and locks the variables; an unknown handle, an uninitialized variable, or a
  // variable given twice (two updates of one variable in one run would read its old value) is
  // an error naming the input.
  static DenseUpdateStatus lock(TF_OpKernelContext* ctx, int first, int n,
                                std::unique_ptr<GraphVariables>* out);
  virtual ~GraphVariables() = default;
  virtual UpdateTensor value(int k) const = 0;
  // A new buffer of variable k's dtype and shape, at *address (called once per k at most).
  virtual DenseUpdateStatus allocate_new_value(TF_OpKernelContext* ctx, int k,
                                               uint64_t* address) = 0;
  // Makes variable k's tensor the only holder of its buffer, so that a run may write into it in
  // place (an in-place KV-cache update, npu_graph.h): when a tensor read from the variable
  // before still shares the buffer, the value is first copied to a new buffer (copy_on_device),
  // which becomes the variable's tensor at once (same value), as TensorFlow's in-place updates
  // copy on write; value(k) then names it.
  virtual DenseUpdateStatus own_buffer(TF_OpKernelContext* ctx, int k) = 0;
  virtual void publish() = 0;
};

}  // namespace npusim::tf
