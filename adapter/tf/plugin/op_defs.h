// Op definitions of the ops TensorFlow lacks and the plugin adds (the graph fusion's ops,
// kernels_fused.cpp; the decoder-model ops, kernels_llm.cpp), registered through
// tensorflow/c/ops.h (exported by libtensorflow_framework.so.2).
#pragma once

#include <vector>

#include "adapter/runtime/status.h"
#include "tensorflow/c/ops.h"

namespace npusim::tf {

// One op definition: TF's "name: type" argument and attribute strings, and its shape function.
struct OpDefSpec {
  const char* name;
  std::vector<const char*> inputs, outputs, attrs;
  void (*shape_fn)(TF_ShapeInferenceContext*, TF_Status*);
  bool stateful = false;  // writes state (variables): never pruned, merged or moved
};

// Registers the definition; an error status naming the op if TensorFlow refuses it.
rt::Status register_op_def(const OpDefSpec& spec);

// Shape function: output 0 has the shape of input 0.
void same_as_input0(TF_ShapeInferenceContext* ctx, TF_Status* status);

// Shape function helper: of `outputs` outputs, those from `first` on are [C], C the last
// dimension of input `input` (unknown where its rank is); those before `first` have that
// input's shape.
void channel_outputs(TF_ShapeInferenceContext* ctx, int input, int first, int outputs,
                     TF_Status* status);

}  // namespace npusim::tf
