#include "adapter/tf/plugin/derived_tensor_cache.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include "adapter/tf/plugin/plugin_device.h"

namespace npusim::tf {

struct DerivedTensorCache::Entry {
  std::string what;    // the derived tensor without its sources: kernel key and tensor
  std::string key;     // what, chip and sources: the entry's key in m_entries
  uint64_t bytes = 0;  // its buffer's bytes (device_buffer_bytes)
  int chip = 0;
  std::vector<uint64_t> sources;  // the sources' start addresses (m_by_source)
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
  // Whether this entry's buffer is kept before `o`'s when the budget is short (make_room_locked):
  // the smaller first (a left-out cast saves the launch's fixed cost and time in proportion to its
  // bytes, so small ones save the most per budget byte), then by kernel key and tensor, then by
  // sources: a total order that does not depend on when entries were looked up.
  bool ranks_above(const Entry& o) const;
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
  return use_keyed(device, fmt::format("{}#{}", kernel.key, d), kernel.derived.at(d).bytes, sources,
                   stable_sources);
}

DerivedTensorCache::Use DerivedTensorCache::use_output(
    const std::shared_ptr<rt::Device>& device, const compiler::CompiledKernel& kernel,
    const std::vector<rt::DerivedRange>& sources) {
  return use_keyed(device, fmt::format("{}#out", kernel.key), kernel.outputs.at(0).bytes(), sources,
                   true);
}

DerivedTensorCache::Use DerivedTensorCache::use_keyed(const std::shared_ptr<rt::Device>& device,
                                                      const std::string& what,
                                                      uint64_t tensor_bytes,
                                                      const std::vector<rt::DerivedRange>& sources,
                                                      bool stable_sources) {
  // Addresses are a chip's own: the same address on two chips is two tensors.
  std::string key = fmt::format("{}@chip{}", what, device->chip());
  for (const rt::DerivedRange& r : sources) key += fmt::format("@{:#x}", r.addr);
  const uint64_t budget = budget_bytes(*device);
  std::lock_guard<std::mutex> lock(m_mutex);
  std::shared_ptr<Entry>& slot = m_entries[key];
  if (!slot) {
    slot = std::make_shared<Entry>();
    slot->what = what;
    slot->bytes = compiler::device_buffer_bytes(tensor_bytes);
    slot->key = key;
    slot->chip = device->chip();
    for (const rt::DerivedRange& r : sources) {
      slot->sources.push_back(r.addr);
      m_by_source.insert({{slot->chip, r.addr}, key});
    }
    m_lru.push_front(key);
    slot->lru = m_lru.begin();
    ++m_stats.tracked;
  } else {
    m_lru.splice(m_lru.begin(), m_lru, slot->lru);
  }
  const std::shared_ptr<Entry> e = slot;  // (evicting may erase the slot)
  if (!e->kept && (stable_sources || e->watch->unchanged.load() > 0)) {
    // A stable source: give the tensor a buffer of its own if the budget allows, making room by
    // giving up buffers of lower rank only (otherwise it stays in the workspace and is tried
    // again next run), and if the device memory allows.
    const uint64_t bytes = e->bytes;
    if (bytes <= budget && make_room_locked(*e, budget - bytes)) {
      uint64_t addr = 0;
      if (malloc_tensor(*device, tensor_bytes, &addr).ok()) {
        e->buffer = addr;
        e->device = device;
        e->kept = std::make_shared<rt::DerivedState>();
        e->buffer_bytes = bytes;
        m_stats.buffer_bytes += bytes;
        ++m_stats.buffers;
      }
    }
  }
  if (m_entries.size() > kMaxTracked) drop_watched_locked();
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

uint64_t DerivedTensorCache::budget_bytes(const rt::Device& device) {
  if (const char* v = std::getenv("NPUSIM_DERIVED_BUDGET")) {
    char* end = nullptr;
    const unsigned long long b = std::strtoull(v, &end, 10);
    if (end != v && *end == '\0') return b;
  }
  return device.memory_stats().bytes_limit / kBudgetDivisor;
}

bool DerivedTensorCache::Entry::ranks_above(const Entry& o) const {
  if (bytes != o.bytes) return bytes < o.bytes;
  if (what != o.what) return what < o.what;
  return key < o.key;
}

// Gives up kept buffers of rank below `e`'s, lowest first, until the buffers take at most
// `budget` bytes; gives up none if that cannot be reached. Which buffers a run keeps then
// follows from the tensors alone, not from the order in which TensorFlow's executor threads
// looked them up: the kept set settles on the highest-ranked tensors that fit.
bool DerivedTensorCache::make_room_locked(const Entry& e, uint64_t budget) {
  if (m_stats.buffer_bytes <= budget) return true;
  std::vector<std::shared_ptr<Entry>> lower;
  uint64_t freeable = 0;
  for (const auto& [key, other] : m_entries)
    if (other->kept && e.ranks_above(*other)) {
      lower.push_back(other);
      freeable += other->buffer_bytes;
    }
  if (m_stats.buffer_bytes - freeable > budget) return false;
  std::sort(lower.begin(), lower.end(),
            [](const auto& a, const auto& b) { return b->ranks_above(*a); });  // lowest first
  for (const std::shared_ptr<Entry>& victim : lower) {
    if (m_stats.buffer_bytes <= budget) break;
    m_stats.buffer_bytes -= victim->buffer_bytes;
    --m_stats.buffers;
    ++m_stats.evictions;
    erase_locked(victim->key);
  }
  return true;
}

// Takes the entry of `key` out (its buffer is freed once no running op holds it).
void DerivedTensorCache::erase_locked(const std::string& key) {
  const auto it = m_entries.find(key);
  if (it == m_entries.end()) return;
  const std::shared_ptr<Entry> e = it->second;
  for (const uint64_t addr : e->sources) {
    auto [first, last] = m_by_source.equal_range({e->chip, addr});
    for (auto s = first; s != last;) s = s->second == key ? m_by_source.erase(s) : std::next(s);
  }
  m_lru.erase(e->lru);
  m_entries.erase(it);
  --m_stats.tracked;
}

void DerivedTensorCache::source_freed(const rt::Device& device, uint64_t addr, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(m_mutex);
  const int chip = device.chip();
  std::vector<std::string> stale;
  for (auto it = m_by_source.lower_bound({chip, addr});
       it != m_by_source.end() && it->first.first == chip && it->first.second < addr + bytes; ++it)
    stale.push_back(it->second);
  for (const std::string& key : stale) {
    const auto it = m_entries.find(key);
    if (it == m_entries.end()) continue;
    if (it->second->kept) {
      m_stats.buffer_bytes -= it->second->buffer_bytes;
      --m_stats.buffers;
    }
    erase_locked(key);
  }
}

// Drops watched entries without a buffer, least recently used first, until at most kMaxTracked
// entries remain (kept buffers are given up for the budget only: make_room_locked). The most
// recently used entry (the caller's) is kept.
void DerivedTensorCache::drop_watched_locked() {
  for (auto it = std::prev(m_lru.end()); m_entries.size() > kMaxTracked && it != m_lru.begin();) {
    const auto e = m_entries.find(*it);
    const auto prev = std::prev(it);
    if (e == m_entries.end()) {
      m_lru.erase(it);
    } else if (!e->second->kept) {
      erase_locked(*it);
    }
    it = prev;
  }
}

DerivedTensorCacheStats DerivedTensorCache::stats() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_stats;
}

}  // namespace npusim::tf
