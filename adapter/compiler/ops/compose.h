// Building one CompiledKernel out of several launches that hand tensors to each other through
// the op's GM workspace: a launch built for its own inputs/outputs (ArgRef kInput i / kOutput j)
// is appended with its arguments rebound to the op's inputs, outputs or workspace slices, and a
// whole sub-op compiled by compile() (e.g. Einsum's Transposes and BatchMatMulV2) is appended
// with its inputs, outputs and workspace remapped the same way.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

class LaunchPlan {
 public:
  explicit LaunchPlan(std::vector<TensorDesc> outputs);

  static ArgRef input(int i) { return ArgRef{ArgRef::Kind::kInput, i, 0}; }
  static ArgRef output(int i) { return ArgRef{ArgRef::Kind::kOutput, i, 0}; }
  // A new workspace slice of `bytes` (at least device_buffer_bytes(bytes), 512-byte aligned so
  // that slices never share a 32-byte block and every slice obeys the buffer contract).
  ArgRef workspace(uint64_t bytes);

  // Appends `l` with l.args[i] replaced by args[i] (same count). `what` prefixes the summary.
  void add(Launch l, const std::vector<ArgRef>& args, const std::string& what = {});
  // Appends every launch of `sub` (compiled for its own op): its input i becomes ins[i], its
  // output j becomes outs[j], its workspace a fresh slice of this plan's workspace.
  void add(const CompiledKernel& sub, const std::vector<ArgRef>& ins,
           const std::vector<ArgRef>& outs, const std::string& what = {});

  CompiledKernel finish() &&;

 private:
  CompiledKernel m_k;
};

// Appends a launch casting input `input` of `op` to dtype `to` (RNE, as Cast) into a new
// derived tensor of k (CompiledKernel::derived) homed in a new workspace slice; returns the
// ArgRef later launches read it by. An empty input needs no launch: a plain workspace ref.
ArgRef append_input_cast(CompiledKernel& k, const OpDesc& op, int input, DataType to,
                         const ChipConfig& cfg);

// The op compiled (compile()) on f32 copies of its bf16 inputs, its f32 outputs cast back to
// bf16 (RNE): a Cast launch per bf16 input, the f32 op's launches, a Cast launch per output.
// For kernels whose bf16 arithmetic a chip without it (widens_bf16, elementwise.h) runs in
// f32, as ops-nn's bf16 kernels do (Cast in, compute in float, Cast back); bit-identical to the
// bf16 kernel where the op's arithmetic is exact (a max), else rounded once at the end rather
// than after every operation. The op's outputs must all be bf16 where its inputs are.
CompiledKernel compile_bf16_in_f32(const CompileContext& ctx);

// TF passes some shape operands (perm, axis, paddings, ...) as tensors; the compiler takes them
// as attributes (docs/compiler.md). When the caller leaves those tensors in op.inputs as well
// (TF's full input list), this compiles `fn` on the op without the inputs at positions `drop`
// and maps the launches' input indices back to the caller's list.
CompiledKernel compile_without_inputs(const CompileContext& ctx, const std::vector<size_t>& drop,
                                      CompileFn fn);

}  // namespace npusim::compiler::ops
