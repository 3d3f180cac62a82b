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

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/profiler/pipe_trace.h"
#include "adapter/runtime/device.h"
#include "adapter/tf/plugin/kernel.h"
#include "adapter/tf/plugin/stable_inputs.h"

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
// precision mode, the lowering switches set). The runtime's KernelCache holds one program per key;
// a compiled op is several launches plus how to bind their arguments, so the plugin keeps its own
// cache with the same once-per-key semantics: concurrent requests for one key compile once, a
// failed compile is returned to its waiters and not cached. Thread-safe.
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

// The compiled op for `op` on the NPU the kernel in `ctx` runs on (opened if needed; with
// several chips, the chip of ctx's stream), from CompiledOpCache or the compiler; a compile error
// is `unsupported` naming the op. `device` receives the device.
rt::Status compile_op(const OpKernelContext& ctx, const compiler::OpDesc& op,
                      std::shared_ptr<rt::Device>* device, std::shared_ptr<const CompiledOp>* out);

// Runs a compiled op for the kernel running in `ctx`: allocates its workspace (if any) through
// TensorFlow, queues every launch on the op's NPU stream with the inputs and outputs at the given
// device addresses (buffers the caller allocated to the compiled op's output shapes), and waits
// for the stream, so a failed launch or a fault on the chip is returned here (naming op.str())
// rather than left as a stream error. Every launch carries an rt::LaunchLabel for reports: the
// node name (ctx->op_name()), op.type, the OpDesc's input and the compiled output tensors, and
// one dispatch id per call (so the launches of one run of the op share it). Derived tensors
// (the casts of cube operands) are kept across runs where their source is stable
// (derived_tensor_cache.h, keep_derived_tensors()).
// stable_inputs: what the graph optimizer marked (stable_inputs.h): the inputs that are variable
// values or constants, and whether an unmarked input may be watched.
// members: the names of the original nodes an op of several members stands for (a multi-tensor
// update's `_npusim_members`), which name its launches (launch_label); empty for other ops.
// report_type: the op type its launches are reported under instead of op.type (a node's
// `_npusim_report_type`, launch_label); empty: op.type.
// dispatch: the launches' LaunchLabel::dispatch, to share one host dispatch between the compiled
// ops one kernel's Compute runs (next_dispatch_id); 0: a new one for this call.
rt::Status launch_compiled_op(OpKernelContext* ctx, const std::shared_ptr<rt::Device>& device,
                              const compiler::OpDesc& op, const CompiledOp& compiled,
                              const std::vector<uint64_t>& input_addrs,
                              const std::vector<uint64_t>& output_addrs,
                              const StableInputs& stable_inputs = {},
                              const std::vector<std::string>& members = {},
                              const std::string& report_type = {}, uint64_t dispatch = 0);

// Where a caller that queues several ops puts their derived tensors (compiler::DerivedTensor),
// to share one between ops of a run (the NpuGraph kernel: two MatMuls reading one f32 tensor
// cast it once). Per derived tensor of the compiled op (empty vectors: none given):
//   reuse: nonzero: an op queued earlier on the stream computed this tensor there; its launch
//          is left out and the op reads it there;
//   fallback: nonzero: where it is computed when the derived-tensor cache gives it no buffer of
//          its own (else its workspace slice, gone after the op).
// placed (if set) receives where each derived tensor lives (0: its workspace slice).
struct DerivedPlacement {
  std::vector<uint64_t> reuse, fallback;
  std::vector<uint64_t>* placed = nullptr;
};

// Queues every launch of `compiled` on `stream` without waiting: launch_compiled_op's work after
// the workspace, for callers that queue several ops and synchronise once (the NpuGraph kernel,
// npu_graph.h). Every launch carries `label` (for an op of several members narrowed to the
// members the launch computes: launch_label); `hold` receives what must stay alive until the
// launches have run (derived tensors' buffers). An error is the first launch that could not be
// queued; faults come at the stream's synchronisation.
rt::Status queue_compiled_op(const std::shared_ptr<rt::Device>& device, rt::Stream stream,
                             const compiler::OpDesc& op, const CompiledOp& compiled,
                             const std::vector<uint64_t>& input_addrs,
                             const std::vector<uint64_t>& output_addrs, uint64_t workspace_addr,
                             const StableInputs& stable_inputs,
                             const std::shared_ptr<const rt::LaunchLabel>& label,
                             std::vector<std::shared_ptr<const void>>* hold,
                             const DerivedPlacement* placement = nullptr);

// One launch of a compiled op as queue_compiled_op would queue it: launch_kernel's arguments,
// and for a launch computing a derived tensor kept across runs its source (rt::Device::
// launch_derived; state null: a plain launch).
struct PreparedLaunch {
  std::shared_ptr<const isa::Program> program;
  std::vector<uint64_t> args;
  int block_dim = 1;
  std::shared_ptr<const rt::LaunchLabel> label;
  rt::DerivedSource source;
};

// queue_compiled_op's launches in order, not queued (*out), for a caller that submits them
// otherwise (the NpuGraph kernel's launches as one group, npu_graph.h); `hold` and `placement`
// as queue_compiled_op's. queue_prepared queues them one by one on `stream`.
rt::Status prepare_compiled_op(const std::shared_ptr<rt::Device>& device,
                               const compiler::OpDesc& op, const CompiledOp& compiled,
                               const std::vector<uint64_t>& input_addrs,
                               const std::vector<uint64_t>& output_addrs, uint64_t workspace_addr,
                               const StableInputs& stable_inputs,
                               const std::shared_ptr<const rt::LaunchLabel>& label,
                               std::vector<std::shared_ptr<const void>>* hold,
                               const DerivedPlacement* placement, std::vector<PreparedLaunch>* out);
rt::Status queue_prepared(rt::Device& device, rt::Stream stream,
                          std::vector<PreparedLaunch> launches);

// Whether `compiled` can be kept whole across runs by queue_kept_output_op: one launch, no
// workspace, one non-empty output, no derived tensors of its own.
bool keepable_output(const CompiledOp& compiled);

// Queues a step whose every input is stable (a graph's Cast of a variable's value:
// derived_tensor_cache.h) so that its output is kept across runs: the output goes to a buffer of
// the derived-tensor cache and the launch is left out by the driver while no input byte was
// written since it last filled that buffer (rt::Device::launch_derived). Without a buffer (the
// budget is spent, NPUSIM_KEEP_DERIVED=0, !keepable_output) it runs as queue_compiled_op with its
// output at `fallback_output`. *output_addr: where the output is in this run.
rt::Status queue_kept_output_op(const std::shared_ptr<rt::Device>& device, rt::Stream stream,
                                const compiler::OpDesc& op, const CompiledOp& compiled,
                                const std::vector<uint64_t>& input_addrs, uint64_t fallback_output,
                                const std::shared_ptr<const rt::LaunchLabel>& label,
                                std::vector<std::shared_ptr<const void>>* hold,
                                uint64_t* output_addr);

// The label of a run of `op` (compiled as `k`) for node `node`: its name, op type and tensors;
// dispatch 0 and host_dispatch eager_op, for the caller to set. members: for a node that merged
// several (a multi-tensor update, attribute members > 1), the members' names in order (its
// `_npusim_members`): queue_compiled_op then gives each launch the names and tensors of the
// members whose outputs it writes (rt::LaunchLabel::members), op_name the node's.
// report_type: the op type reports show instead of op.type (the node's `_npusim_report_type`:
// CANN's name for a fused pattern, e.g. LambUpdateWithLR for a Lamb variable's update,
// graph_fusion.h rewrite 17); empty: op.type.
std::shared_ptr<rt::LaunchLabel> launch_label(const std::string& node, const compiler::OpDesc& op,
                                              const compiler::CompiledKernel& k,
                                              const std::vector<std::string>& members = {},
                                              const std::string& report_type = {});
// A new LaunchLabel::dispatch value (one per run of an op or of a graph), never 0.
uint64_t next_dispatch_id();

// Whether launch_compiled_op keeps derived tensors across runs (derived_tensor_cache.h): yes
// unless the environment sets NPUSIM_KEEP_DERIVED=0 (every cast then runs every time).
bool keep_derived_tensors();

// The msprof name of a compiler data type ("DT_FLOAT16", "DT_BOOL").
std::string msprof_dtype_name(compiler::DataType t);

// Collects the per-pipe instruction detail of the NPU's launches for reports (python_hooks.cpp,
// adapter/profiler/runtime_report.h). Profiling starts when the Python package asks
// (npusim.profile) or, at the device's opening, when NPUSIM_REPORT_DIR is set; a collector per
// chip (several NPUs: each a chip of one system) is attached to every device once they are
// open. Thread-safe.
class ReportProfiler {
 public:
  static ReportProfiler& instance();
  // Starts collecting again from the next launch with `opts` (attaching now if the devices are
  // open, else at their first op).
  rt::Status start(const prof::PipeTraceOptions& opts);
  // After the devices opened (every compile_op; cheap once settled): attaches the collectors if
  // profiling was asked for, or NPUSIM_REPORT_DIR is set.
  void attach_if_requested(rt::Device& device);
  // Chip `chip`'s collector if profiling ever started (and that chip's device opened), else null.
  const prof::PipeTraceCollector* collector(int chip = 0) const;
  // Limits from NPUSIM_TRACE_DETAIL_LAUNCHES and NPUSIM_TRACE_MAX_EVENTS (defaults:
  // PipeTraceOptions').
  static prof::PipeTraceOptions options_from_env();

 private:
  mutable std::mutex m_mutex;
  std::atomic<bool> m_settled{false};  // nothing to do in attach_if_requested
  bool m_requested = false;
  prof::PipeTraceOptions m_opts;
  // By chip; a chip's collector exists once it is attached to that chip's device.
  std::vector<std::unique_ptr<prof::PipeTraceCollector>> m_collectors;
  // Attaches a collector to every open device that has none (m_mutex held).
  rt::Status attach_all();
};

// The attributes an op family passes to the compiler, and their TF types.
struct AttrSpec {
  enum class Kind { kType, kBool, kInt, kFloat, kString, kInts, kStrings };
  const char* name;
  Kind kind;
};

// A tensor input the compiler takes as an attribute, read on the host (the op table's rows
// name them: adapter/compiler/ops/registry.h).
using HostAttrInput = compiler::ops::HostAttrInput;

// The value of host-memory input `index` (t, of op `op_type`) as the attribute `kind` describes.
rt::Status read_host_attr(const std::string& op_type, const Tensor& t, int index,
                          HostAttrInput::Kind kind, compiler::AttrValue* out);

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
  StableInputs m_stable_inputs;  // kStableInputsAttr, if the graph optimizer set it
  // `_npusim_members`, if the graph optimizer set it (a node of several original nodes: a
  // multi-tensor SquareSumV1): its launches' LaunchLabel::members.
  std::vector<std::string> m_members;
};

}  // namespace npusim::tf
