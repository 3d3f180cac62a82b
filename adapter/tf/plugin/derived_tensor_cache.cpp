#include "adapter/tf/plugin/derived_tensor_cache.h"

#include <fmt/format.h>

#include "adapter/tf/plugin/plugin_device.h"

namespace npusim::tf {

struct DerivedTensorCache::Entry {
  std::list<std::string>::iterator lru;
  // Runs in the op's workspace: watches whether the source changes between runs.
  std::shared_ptr<rt::DerivedState> watch = std::make_shared<rt::DerivedState>();
  // Once the source was seen unchanged: the tensor's own buffer and its state.
  std::shared_ptr<rt::Device> device;
  uint64_t buffer = 0, buffer_bytes = 0;
  std::shared_ptr<rt::DerivedState> kept;

  Entry() = default;
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;
  ~Entry() {
    if (buffer) (void)free_tensor(*device, buffer);  // (a failure would only leak the block)
  }
};

DerivedTensorCache& DerivedTensorCache::instance() {
  // Never destroyed, like the device its buffers belong to.
  static DerivedTensorCache* c = new DerivedTensorCache();
  return *c;
}

DerivedTensorCache::Use DerivedTensorCache::use(const std::shared_ptr<rt::Device>& device,
                                                const compiler::CompiledKernel& kernel, size_t d,
                                                const std::vector<rt::DerivedRange>& sources,
                                                bool stable_sources) {
  const compiler::DerivedTensor& t = kernel.derived.at(d);
  // Addresses are a chip's own: the same address on two chips is two tensors.
  std::string key = fmt::format("{}#{}@chip{}", kernel.key, d, device->chip());
  for (const rt::DerivedRange& r : sources) key += fmt::format("@{:#x}", r.addr);
  const uint64_t budget = device->memory_stats().bytes_limit / kBudgetDivisor;
  std::lock_guard<std::mutex> lock(m_mutex);
  std::shared_ptr<Entry>& slot = m_entries[key];
  if (!slot) {
    slot = std::make_shared<Entry>();
    m_lru.push_front(key);
    slot->lru = m_lru.begin();
    ++m_stats.tracked;
  } else {
    m_lru.splice(m_lru.begin(), m_lru, slot->lru);
  }
  const std::shared_ptr<Entry> e = slot;  // (evict_locked may erase the slot)
  if (!e->kept && (stable_sources || e->watch->unchanged.load() > 0)) {
    // A stable source: give the tensor a buffer of its own (if the budget and the device
    // memory allow; otherwise it stays in the workspace and is tried again next run).
    const uint64_t bytes = compiler::device_buffer_bytes(t.bytes);
    bool fits = m_stats.buffer_bytes + bytes <= budget;
    if (!fits && bytes <= budget) {
      evict_locked(budget - bytes);
      fits = m_stats.buffer_bytes + bytes <= budget;
    }
    uint64_t addr = 0;
    if (fits && malloc_tensor(*device, t.bytes, &addr).ok()) {
      e->buffer = addr;
      e->device = device;
      e->kept = std::make_shared<rt::DerivedState>();
      e->buffer_bytes = bytes;
      m_stats.buffer_bytes += bytes;
      ++m_stats.buffers;
    }
  }
  if (m_entries.size() > kMaxTracked) evict_locked(budget);
  Use u;
  u.source.addr = sources.at(0).addr;
  u.source.bytes = sources.at(0).bytes;
  u.source.more.assign(sources.begin() + 1, sources.end());
  if (e->kept) {
    u.addr = e->buffer;
    u.source.state = e->kept;
    u.source.may_skip = true;
  } else {
    u.source.state = e->watch;
  }
  u.hold = e;
  return u;
}

// Drops least recently used entries until the buffers fit `budget` bytes and at most
// kMaxTracked entries remain. The most recently used entry (the caller's) is kept.
void DerivedTensorCache::evict_locked(uint64_t budget) {
  while (m_lru.size() > 1 &&
         (m_stats.buffer_bytes > budget || m_entries.size() > kMaxTracked)) {
    auto it = m_entries.find(m_lru.back());
    m_lru.pop_back();
    if (it == m_entries.end()) continue;
    if (it->second->kept) {
      m_stats.buffer_bytes -= it->second->buffer_bytes;
      --m_stats.buffers;
      ++m_stats.evictions;
    }
    m_entries.erase(it);  // the buffer is freed once no running op holds the entry
    --m_stats.tracked;
  }
}

DerivedTensorCacheStats DerivedTensorCache::stats() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_stats;
}

}  // namespace npusim::tf
