// The op table's interface: each op family (one .cpp file under ops/) exposes one compile
// function; registry.cpp lists which TF ops each family compiles and how the TF plugin
// registers each op's NPU kernel. That table is the ONLY place an op is registered (no static
// initialisers), for the compiler and for TensorFlow.
#pragma once

#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"

namespace npusim::compiler::ops {

struct CompileContext {
  const OpDesc& op;
  const ChipConfig& cfg;
  PrecisionMode precision;
};

// Fills outputs, launches and workspace_bytes (compile() fills key and precision and checks
// the caller's expected outputs).
using CompileFn = CompiledKernel (*)(const CompileContext&);

// How TensorFlow runs an op on the NPU: the TF plugin registers its kernels from the rows of this
// table (adapter/tf/plugin/compiled_op_table.cpp); the compiler itself does not read it.

// The plugin's NPU kernel classes, each reading the node's attributes of its list (those the
// node has; compiled_op_table.cpp) into the OpDesc and running the compiled op:
enum class TfKernel {
  kNone,            // no NPU kernel: TfRegistration::unregistered says why
  kElementwise,     // T
  kCast,            // SrcT, DstT, Truncate
  kCubeProduct,     // MatMul's, BatchMatMul's and Einsum's attributes
  kDataMovement,    // the layout and gather ops' attributes (N, axis, masks, batch_dims, ...)
  kReduction,       // T, keep_dims, output_type, exclusive, reverse
  kGenerator,       // T, Tidx
  kNn,              // T, data_format, Tlabels, alpha
  kWindow,          // convolution, pooling and batch-norm attributes (NHWC)
  kFusedInference,  // the graph fusion's ops (their op definitions are the plugin's)
  kRandom,          // key and counter as uint64 (kernels_random.cpp)
  kResourceApply,   // variables in, new values into them (TF's C++ kernel API)
  kLlm,             // decoder-model ops (op definitions are the plugin's, kernels_llm.cpp)
};

// TF type attribute `attr` (a kernel def's type constraint) takes these types.
struct TypeConstraint {
  const char* attr;
  std::vector<DataType> types;
};

// An input that TF passes as a tensor but the compiler takes as an attribute (reduction axes,
// Tile multiples, a concat axis, Range's bounds, ...): registered HostMemory, so the kernel
// reads its values on the host into attribute `attr`. The input stays in the OpDesc's inputs
// (the compiler ignores it; docs/compiler.md). `input` < 0 counts from the end (-1: ConcatV2's
// axis, after its N values).
struct HostAttrInput {
  enum class Kind {
    kInts,      // int32/int64 of rank <= 1 -> list(int)
    kFlatInts,  // int32/int64 of any rank, row-major -> list(int) (Pad's [rank, 2] paddings)
    kInt,       // int32/int64 with one element -> int
    kNumber,    // one element -> int (int32/int64) or float (float32)
  };
  const char* tf_arg;  // TF's argument name (the kernel def's HostMemory)
  int input;
  const char* attr;
  Kind kind = Kind::kInts;
};

struct TfRegistration {
  TfKernel kernel = TfKernel::kNone;
  // One kernel def per list; within a list every combination of the constraints' types. Most
  // ops have one list (one with no constraint: the op has no type attribute); Cast has one per
  // DstT, so that the (SrcT, DstT) pairs need not be a product.
  std::vector<std::vector<TypeConstraint>> types;
  std::vector<HostAttrInput> host_inputs;
  const char* unregistered = nullptr;  // kNone: why TF gets no NPU kernel (one line)
};

struct OpEntry {
  const char* tf_op;   // TF op name
  const char* family;  // the ops/<family>.cpp file that compiles it
  CompileFn compile;
  TfRegistration tf;
};

// Type lists of the table's constraints.
inline const std::vector<DataType> kFloatTypes = {DataType::F32, DataType::F16, DataType::BF16};
inline const std::vector<DataType> kFloatS32Types = {DataType::F32, DataType::F16, DataType::BF16,
                                                     DataType::S32};
inline const std::vector<DataType> kHalfTypes = {DataType::F16, DataType::BF16};
inline const std::vector<DataType> kIndexTypes = {DataType::S32, DataType::S64};
// Every type the chip holds: the data movement ops copy them bit-exactly.
inline const std::vector<DataType> kMoveTypes = {
    DataType::F32, DataType::F16, DataType::BF16, DataType::S32, DataType::S64,
    DataType::S16, DataType::U16, DataType::S8,   DataType::U8,  DataType::BOOL};

// The table (ops/registry.cpp).
const std::vector<OpEntry>& op_table();

// Family entry points.
CompiledKernel compile_binary(const CompileContext& ctx);             // ops/binary.cpp
CompiledKernel compile_unary(const CompileContext& ctx);              // ops/unary.cpp
CompiledKernel compile_cast(const CompileContext& ctx);               // ops/cast.cpp
CompiledKernel compile_multi_tensor_cast(const CompileContext& ctx);  // ops/cast.cpp
CompiledKernel compile_all_finite(const CompileContext& ctx);         // ops/all_finite.cpp
CompiledKernel compile_matmul(const CompileContext& ctx);             // ops/matmul.cpp
// Data movement, gathers, generators, selection, scans, batched products (docs/compiler.md
// "Data movement ops"):
CompiledKernel compile_layout(const CompileContext& ctx);        // ops/layout.cpp
CompiledKernel compile_fill(const CompileContext& ctx);          // ops/fill.cpp
CompiledKernel compile_select(const CompileContext& ctx);        // ops/select.cpp
CompiledKernel compile_scan(const CompileContext& ctx);          // ops/scan.cpp
CompiledKernel compile_gather(const CompileContext& ctx);        // ops/gather.cpp
CompiledKernel compile_batch_matmul(const CompileContext& ctx);  // ops/batch_matmul.cpp
// Reductions, softmax, activations (docs/compiler.md):
CompiledKernel compile_reduce(const CompileContext& ctx);      // ops/reduce.cpp
CompiledKernel compile_softmax(const CompileContext& ctx);     // ops/softmax.cpp
CompiledKernel compile_activation(const CompileContext& ctx);  // ops/activation.cpp
CompiledKernel compile_bias(const CompileContext& ctx);        // ops/bias.cpp
// Convolutions, pooling, batch normalisation (docs/compiler.md "Convolutions"):
CompiledKernel compile_conv2d(const CompileContext& ctx);     // ops/conv2d.cpp
CompiledKernel compile_pool(const CompileContext& ctx);       // ops/pool.cpp
CompiledKernel compile_batchnorm(const CompileContext& ctx);  // ops/batchnorm.cpp
// Fused optimizer updates (docs/compiler.md "Optimizer updates"):
CompiledKernel compile_optimizer(const CompileContext& ctx);  // ops/optimizer.cpp
// Inference fusions of the TF plugin's graph pass (BatchNormInference, AddRelu):
CompiledKernel compile_fused(const CompileContext& ctx);  // ops/fused.cpp
// A chain of element-wise ops as one streaming kernel (FusedElementwise):
CompiledKernel compile_fused_elementwise(const CompileContext& ctx);  // ops/fused_elementwise.cpp
// Decoder-model kernels (docs/compiler.md "Decoder-model kernels"):
CompiledKernel compile_attention(const CompileContext& ctx);            // ops/attention.cpp
CompiledKernel compile_weight_quant_matmul(const CompileContext& ctx);  // ops/quant_matmul.cpp
CompiledKernel compile_norm(const CompileContext& ctx);                 // ops/norm.cpp (RmsNorm)
CompiledKernel compile_rope(const CompileContext& ctx);                 // ops/rope.cpp
// Such a chain writing the new values of variables (FusedVariableUpdate, fused_elementwise.h):
CompiledKernel compile_fused_variable_update(const CompileContext& ctx);

}  // namespace npusim::compiler::ops
