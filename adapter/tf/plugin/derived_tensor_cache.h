// Keeps the derived tensors of compiled ops (compiler::CompiledKernel::derived: the f16 copies
// of f32 tensors that cube ops read under allow_fp32_to_fp16 / allow_mix_precision) in device
// buffers of their own across runs, so the launch computing one is left out while its source is
// unchanged. This is the effect of CANN's graph engine keeping a variable in the form its
// consumers read (its "trans road" of Cast / TransData fused into the variable) until the
// variable is written: in inference the weights are cast once, in training after every update.
//
// Which sources get a buffer: those the graph optimizer marked as a variable's value or a
// constant (stable_inputs.h), at once; the other inputs of a marked node never (the caller does
// not ask: StableInputs::marked); any source of an op the optimizer did not see (eager ops) is
// first computed in the op's workspace while the runtime watches its source
// (rt::DerivedState), and once a run
// finds the source unchanged since the previous run (a weight; never an activation, which is
// rewritten every step) the next run gives it a buffer. From then on the driver leaves the
// launch out whenever the source has not been written since the buffer was filled (device
// memory write epochs; rt::Device::launch_derived). A stale result is never read: that decision
// is taken on the driver thread in stream order, just before the launch would run; the marks
// and the watching only decide where the tensor lives.
//
// A graph's Cast step reading a stable input alone (mixed precision's cast of a variable's value,
// mixed_precision.h) is kept the same way as a whole: its output gets a buffer (use_output) and
// its one launch is left out while the variable is unchanged (npu_graph_kernel.cpp).
//
// The buffers come from the runtime's allocator, as every tensor's do (stream_executor.cpp);
// they take at most 1/kBudgetDivisor of the device memory (NPUSIM_DERIVED_BUDGET: that many
// bytes instead), like CANN's separate variable memory pool. When the budget is short, a
// tensor's buffer is made room for by giving up buffers of lower rank only (Entry::ranks_above:
// the smaller first, then by kernel key), never by the order of lookups, which TensorFlow's
// executor threads set: which casts a step leaves out then does not vary from run to run. A
// buffer in use by a running op is freed when that op's launches are done. Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/runtime/device.h"
#include "adapter/runtime/stream.h"

namespace npusim::tf {

struct DerivedTensorCacheStats {
  uint64_t buffers = 0;       // derived tensors kept in buffers now
  uint64_t buffer_bytes = 0;  // their bytes
  uint64_t tracked = 0;       // derived tensors whose sources are watched (buffers included)
  uint64_t evictions = 0;     // buffers given up for the budget
};

class DerivedTensorCache {
 public:
  // Buffers take at most 1/kBudgetDivisor of the device memory (bytes_limit).
  static constexpr uint64_t kBudgetDivisor = 32;
  // At most this many derived tensors are watched (sources seen once each count).
  static constexpr size_t kMaxTracked = 4096;

  static DerivedTensorCache& instance();

  // How one run of an op computes its derived tensor: where it lives (0: its workspace slice)
  // and the source to pass to Device::launch_derived. `hold` keeps the buffer alive until the
  // run's launches are done.
  struct Use {
    uint64_t addr = 0;
    rt::DerivedSource source;
    std::shared_ptr<const void> hold;
  };
  // For derived tensor `d` of `kernel`, computed from the inputs at `sources` (one range per
  // DerivedTensor::inputs entry, in order) on `device` (which gives new buffers).
  // stable_sources: the graph marked every one of those inputs as a variable's value or a
  // constant (stable_inputs.h): it gets a buffer at once.
  Use use(const std::shared_ptr<rt::Device>& device, const compiler::CompiledKernel& kernel,
          size_t d, const std::vector<rt::DerivedRange>& sources, bool stable_sources);

  // For output 0 of `kernel`, a step of one launch that reads the inputs at `sources` alone,
  // each a stable input (a graph's Cast of a variable's value): as `use` for a stable derived
  // tensor; u.addr is where the step writes its output (0: no buffer, the caller's place).
  Use use_output(const std::shared_ptr<rt::Device>& device, const compiler::CompiledKernel& kernel,
                 const std::vector<rt::DerivedRange>& sources);

  // TensorFlow freed the tensor at [addr, addr + bytes) of `device`: what was derived from it is
  // dropped (a variable given a new buffer leaves no stale buffer holding the budget).
  void source_freed(const rt::Device& device, uint64_t addr, uint64_t bytes);

  DerivedTensorCacheStats stats() const;

  // The bytes the buffers may take on `device` (top of file).
  static uint64_t budget_bytes(const rt::Device& device);

 private:
  struct Entry;
  // `what`: the tensor without its sources (kernel key and tensor); tensor_bytes: its bytes.
  Use use_keyed(const std::shared_ptr<rt::Device>& device, const std::string& what,
                uint64_t tensor_bytes, const std::vector<rt::DerivedRange>& sources,
                bool stable_sources);
  bool make_room_locked(const Entry& e, uint64_t budget);
  void drop_watched_locked();
  void erase_locked(const std::string& key);

  mutable std::mutex m_mutex;
  std::list<std::string> m_lru;  // keys, most recently used first (for drop_watched_locked)
  std::unordered_map<std::string, std::shared_ptr<Entry>> m_entries;
  std::multimap<std::pair<int, uint64_t>, std::string> m_by_source;  // (chip, source) -> key
  DerivedTensorCacheStats m_stats;
};

}  // namespace npusim::tf
