// The kernel every NPU op uses: it describes the op to the kernel compiler (adapter/compiler),
// which tiles it for the chip, and launches the compiled programs on the op's stream.
//
// Compute(ctx):
//   1. OpDesc from the op type, the attributes named at construction and the inputs' dtypes and
//      shapes; the compiled op comes from the plugin's cache (CompiledOpCache) or the compiler;
//   2. outputs (and one GM workspace, if the compiled op needs it) allocated by TensorFlow on
//      the NPU;
//   3. each launch queued on the op's runtime stream (Device::launch_kernel), in order;
//   4. the stream synchronised, so a kernel fault or a failed launch becomes this op's error
//      (TF_Status) instead of a stream error, which TensorFlow would treat as fatal.
// A compile error (an unsupported shape or attribute) is TF_UNIMPLEMENTED naming the op.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/runtime/device.h"
#include "adapter/tf/plugin/kernel.h"

namespace npusim::tf {

// A compiled op ready to launch: the compiler's result, plus a shared copy of each launch's
// program, so the runtime verifies each program once (it remembers verified program objects).
struct CompiledOp {
  compiler::CompiledKernel kernel;
  std::vector<std::shared_ptr<const isa::Program>> programs;  // one per kernel.launches entry
};

struct CompiledOpCacheStats {
  uint64_t hits = 0, misses = 0, failed_compiles = 0, entries = 0;
};

// Compiled ops keyed by compiler::kernel_cache_key (op, dtypes, shapes, attributes, chip,
// precision mode). The runtime's KernelCache holds one program per key; a compiled op is
// several launches plus how to bind their arguments, so the plugin keeps its own cache with the
// same once-per-key semantics: concurrent requests for one key compile once, a failed compile
// is returned to its waiters and not cached. Thread-safe.
class CompiledOpCache {
 public:
  static CompiledOpCache& instance();

  rt::Status get_or_compile(const compiler::OpDesc& op, const ChipConfig& cfg,
                            compiler::PrecisionMode precision,
                            std::shared_ptr<const CompiledOp>* out);
  CompiledOpCacheStats stats() const;
  std::vector<std::string> keys() const;

 private:
  struct Entry {
    bool done = false;
    rt::Status status;
    std::shared_ptr<const CompiledOp> op;
  };
  mutable std::mutex m_mutex;
  std::condition_variable m_compiled;
  std::map<std::string, std::shared_ptr<Entry>> m_entries;
  CompiledOpCacheStats m_stats;
};

// The compiled op for `op` on the process's NPU (opened if needed), from CompiledOpCache or the
// compiler; a compile error is `unsupported` naming the op. `device` receives the device.
rt::Status compile_op(const compiler::OpDesc& op, std::shared_ptr<rt::Device>* device,
                      std::shared_ptr<const CompiledOp>* out);

// Runs a compiled op for the kernel running in `ctx`: allocates its workspace (if any) through
// TensorFlow, queues every launch on the op's NPU stream with the inputs and outputs at the given
// device addresses (buffers the caller allocated to the compiled op's output shapes), and waits
// for the stream, so a failed launch or a fault on the chip is returned here (naming op.str())
// rather than left as a stream error.
rt::Status launch_compiled_op(OpKernelContext* ctx, rt::Device& device, const compiler::OpDesc& op,
                              const CompiledOp& compiled, const std::vector<uint64_t>& input_addrs,
                              const std::vector<uint64_t>& output_addrs);

// The attributes an op family passes to the compiler, and their TF types.
struct AttrSpec {
  enum class Kind { kType, kBool, kInt, kFloat, kString, kInts };
  const char* name;
  Kind kind;
};

// An int32/int64 input that TF passes as a tensor but the compiler takes as a list(int)
// attribute (reduction axes, Tile multiples, ...): registered HostMemory, so Compute reads its
// values on the host into attribute `attr`. The input stays in the OpDesc's inputs (the
// compiler ignores it; docs/compiler.md).
struct HostAttrInput {
  int input;
  const char* attr;
};

class CompiledOpKernel : public OpKernel {
 public:
  // Reads `attrs` (those present on the node) into the compiler's attribute map.
  CompiledOpKernel(OpKernelConstruction* ctx, const std::vector<AttrSpec>& attrs,
                   std::vector<HostAttrInput> host_attrs = {});
  void Compute(OpKernelContext* ctx) override;

 private:
  std::string m_type;
  std::map<std::string, compiler::AttrValue> m_attrs;
  std::vector<HostAttrInput> m_host_attrs;
};

}  // namespace npusim::tf
