// The kernel compiler: one TF op (OpDesc) -> kernels in npusim's instruction set, tiled for the
// loaded chip config (buffer sizes, cube shape, core counts), each verified by
// isa::verify_or_throw before it is returned.
//
// How a caller (the runtime / TF plugin) runs a CompiledKernel:
//   1. allocate the outputs (CompiledKernel::outputs; device_buffer_bytes() each, see
//      op_desc.h for the buffer contract) and, if workspace_bytes > 0, one GM workspace;
//   2. for each Launch in order, on one stream: args = launch.bind(input addrs, output addrs,
//      workspace addr), then run {program, args, block_dim};
//   3. launches.empty() means there is nothing to run: every output has zero elements.
// A caller may also keep derived tensors (CompiledKernel::derived: e.g. the f16 copy of an f32
// weight) in buffers of its own across runs, pass their addresses to bind() and leave out the
// launch computing one while its source input is unchanged (the runtime's launch_derived).
// The op table is in ops/registry.cpp; docs/compiler.md explains how to add an op.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/op_desc.h"
#include "sim/config/chip_config.h"

namespace npusim::compiler {

// Precision modes after CANN's precision_mode option. They decide how fp32 ops use the cube
// (vector ops always compute in their own dtype):
enum class PrecisionMode {
  // CANN "must_keep_origin_dtype": fp32 stays fp32. Cube ops run fp32 on the cube where the chip
  // supports it (cube_fp32_rate_divisor > 0) and the operand layout allows; otherwise
  // compile() fails naming the reason.
  kKeepFp32,
  // CANN "allow_fp32_to_fp16" (CANN's default for training): fp32 inputs of cube ops are cast
  // to fp16 (round to nearest even) on the way in; the cube accumulates in fp32 and the output
  // stays fp32.
  kAllowFp32ToFp16,
  // CANN "allow_mix_precision": cube ops run in fp16 end to end: inputs cast to fp16, fp32
  // accumulation, the result rounded to fp16 and widened back to the op's fp32 output.
  kAllowMixPrecision,
};
const char* precision_mode_name(PrecisionMode m);  // the CANN name
std::optional<PrecisionMode> precision_mode_from_name(const std::string& s);

// Where one kernel argument comes from.
struct ArgRef {
  // kDerived: a derived tensor of the op (DerivedTensor), whole; it lives in the workspace
  // unless the caller gives it a buffer of its own.
  enum class Kind { kInput, kOutput, kWorkspace, kScalar, kDerived };
  Kind kind = Kind::kInput;
  int index = 0;       // kInput / kOutput / kDerived: which tensor of the op
  uint64_t value = 0;  // kWorkspace, kDerived: byte offset into the workspace; kScalar: the value
  uint64_t inner = 0;  // kDerived: byte offset inside the tensor (a part of it, e.g. one vector)
};

// A tensor computed by one launch from some inputs of the op alone, as a pure function of their
// bytes (the precision casts of cube operands: one input; a convolution's weights with a batch
// norm folded in: the filter, scale and variance). The launch reads those inputs and workspace
// tensors that earlier launches of the op computed from those inputs alone, and writes nothing
// but the tensor; later launches read it through ArgRef kDerived. A caller that keeps it may
// leave the launch out while none of `inputs` changed.
struct DerivedTensor {
  std::vector<int> inputs;  // the op inputs it is computed from (at least one)
  size_t launch = 0;   // index in CompiledKernel::launches of the launch computing it
  uint64_t bytes = 0;  // its size (a whole workspace slice)
  std::string what;    // e.g. "f16 copy", for logs
};

// One kernel launch of a compiled op.
struct Launch {
  BuiltKernel kernel;         // verified program + listing with origin comments
  int block_dim = 1;          // blocks to launch (at most the cores the program runs on)
  std::vector<ArgRef> args;   // in ldarg order (kernel.program.arg_names names them)
  std::string summary;        // what it does and how it is tiled, for logs and tests
  // The argument values for this launch. derived[i], when given and nonzero, is where derived
  // tensor i lives instead of its workspace slice.
  std::vector<uint64_t> bind(const std::vector<uint64_t>& inputs,
                             const std::vector<uint64_t>& outputs, uint64_t workspace,
                             const std::vector<uint64_t>& derived = {}) const;
};

struct CompiledKernel {
  std::string key;                   // OpDesc::key() + precision mode
  PrecisionMode precision = PrecisionMode::kAllowFp32ToFp16;
  std::vector<TensorDesc> outputs;   // the op's outputs (shape inference)
  std::vector<Launch> launches;      // run in order; empty: nothing to run
  uint64_t workspace_bytes = 0;      // GM scratch shared by the launches (0: none)
  std::vector<DerivedTensor> derived;  // tensors a caller may keep across runs (see top)
  // Placements a graph's memory planner may make instead of running the launches (CANN's
  // graph engine likewise emits no task for a slice it reads in place or a concatenation whose
  // inputs it allocates contiguously). Byte offsets; -1 (or empty): not so.
  // view_offsets[j] >= 0: output j equals the bytes of input view_input from that offset on
  //   (a slice that is contiguous in the input). A planner placing every output there runs
  //   nothing.
  // concat_offsets[i] >= 0: input i equals the bytes of output 0 from that offset on (a
  //   concatenation of contiguous pieces). A planner having every input's producer write its
  //   piece there runs nothing. The pieces' offsets and sizes need not be multiples of
  //   kDeviceBufferAlign: the planner checks that a producer's tail write stays in its piece.
  std::vector<int64_t> view_offsets;
  int view_input = 0;
  std::vector<int64_t> concat_offsets;
};

// Compiles `op` for chip `cfg`. Throws CompileError naming the op and the reason for an unknown
// op, an unsupported dtype/attribute/shape, or a tile that does not fit; never returns an
// unverified kernel.
CompiledKernel compile(const OpDesc& op, const ChipConfig& cfg,
                       PrecisionMode precision = PrecisionMode::kAllowFp32ToFp16);

// The kernel cache key: OpDesc::key(), the precision mode, the chip's name (the chip config is
// fixed once a device opens, so its name identifies it within a process) and the value of every
// lowering switch that is set (lowering_switches()), so a switch changed within a process gives
// the kernels compiled under it, not those cached before.
std::string kernel_cache_key(const OpDesc& op, const ChipConfig& cfg, PrecisionMode precision);

// The environment variables the compiler reads that change what it emits for an op (switches
// that give an older lowering back, forced plans; docs/compiler.md), by name. Every
// "NPUSIM_..." name the compiler's sources read is here (tests/compiler/test_compiler_cache_key.cpp
// checks the sources).
const std::vector<std::string>& lowering_switches();

// Every TF op name compile() accepts, in table order.
std::vector<std::string> supported_ops();

}  // namespace npusim::compiler
