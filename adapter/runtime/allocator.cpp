#include "adapter/runtime/allocator.h"

#include <limits>

#include <fmt/format.h>

namespace npusim::rt {

HbmAllocator::HbmAllocator(uint64_t base, uint64_t end, uint64_t alignment)
    : m_alignment(alignment) {
  if (alignment < kAlignment || (alignment & (alignment - 1)) != 0)
    throw Error(fmt::format("device allocator: alignment {} is not a power of two of at least {} "
                            "bytes", alignment, kAlignment));
  m_base = base > std::numeric_limits<uint64_t>::max() - (m_alignment - 1)
               ? 0
               : (base + m_alignment - 1) / m_alignment * m_alignment;
  m_end = end / m_alignment * m_alignment;
  if (base == 0 || m_base >= m_end)
    throw Error(fmt::format("device allocator: range [{:#x}, {:#x}) holds no {}-byte block above "
                            "address 0", base, end, m_alignment));
  insert_free(m_base, m_end - m_base);
  m_stats.bytes_limit = m_end - m_base;
}

void HbmAllocator::insert_free(uint64_t addr, uint64_t size) {
  m_free.emplace(addr, size);
  m_by_size.emplace(size, addr);
}

void HbmAllocator::erase_free(std::map<uint64_t, uint64_t>::iterator it) {
  m_by_size.erase({it->second, it->first});
  m_free.erase(it);
}

uint64_t HbmAllocator::largest_free_locked() const {
  return m_by_size.empty() ? 0 : m_by_size.rbegin()->first;
}

Status HbmAllocator::allocate(uint64_t bytes, uint64_t* addr) {
  if (bytes == 0) return Status(StatusCode::invalid_argument, "cannot allocate 0 bytes");
  std::lock_guard<std::mutex> lock(m_mutex);
  const bool too_big = bytes > std::numeric_limits<uint64_t>::max() - (m_alignment - 1);
  const uint64_t size = too_big ? 0 : (bytes + m_alignment - 1) / m_alignment * m_alignment;
  auto fit = too_big ? m_by_size.end() : m_by_size.lower_bound({size, 0});
  if (fit == m_by_size.end())
    return Status(StatusCode::out_of_memory,
                  fmt::format("out of device memory: cannot allocate {} bytes ({} with {}-byte "
                              "alignment); {} of {} bytes free, largest free block {} bytes, {} "
                              "allocations live",
                              bytes, too_big ? bytes : size, m_alignment,
                              m_stats.bytes_limit - m_stats.bytes_in_use, m_stats.bytes_limit,
                              largest_free_locked(), m_live.size()));
  const uint64_t start = fit->second, block = fit->first;
  erase_free(m_free.find(start));
  if (block > size) insert_free(start + size, block - size);
  m_live.emplace(start, size);
  m_stats.bytes_in_use += size;
  m_stats.peak_bytes_in_use = std::max(m_stats.peak_bytes_in_use, m_stats.bytes_in_use);
  m_stats.total_allocs++;
  m_stats.largest_alloc_size = std::max(m_stats.largest_alloc_size, size);
  *addr = start;
  return Status();
}

Status HbmAllocator::begin_release(uint64_t addr, uint64_t* block_bytes) {
  std::lock_guard<std::mutex> lock(m_mutex);
  auto it = m_live.find(addr);
  if (it == m_live.end()) {
    if (m_releasing.count(addr))
      return Status(StatusCode::invalid_argument,
                    fmt::format("device address {:#x} is already being freed", addr));
    return Status(StatusCode::invalid_argument,
                  fmt::format("device address {:#x} is not the start of a live allocation "
                              "(never allocated, or already freed)", addr));
  }
  *block_bytes = it->second;
  m_releasing.emplace(it->first, it->second);
  m_live.erase(it);
  return Status();
}

void HbmAllocator::finish_release(uint64_t addr) {
  std::lock_guard<std::mutex> lock(m_mutex);
  auto it = m_releasing.find(addr);
  if (it == m_releasing.end()) return;
  uint64_t start = it->first, size = it->second;
  m_releasing.erase(it);
  m_stats.bytes_in_use -= size;
  // Coalesce with the free block that ends at `start` and the one that begins at start + size.
  auto next = m_free.lower_bound(start);
  if (next != m_free.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      size += prev->second;
      erase_free(prev);
    }
  }
  if (next != m_free.end() && next->first == start + size) {
    size += next->second;
    erase_free(next);
  }
  insert_free(start, size);
}

Status HbmAllocator::release(uint64_t addr) {
  uint64_t size = 0;
  Status s = begin_release(addr, &size);
  if (s.ok()) finish_release(addr);
  return s;
}

bool HbmAllocator::contains(uint64_t addr, uint64_t bytes) const {
  std::lock_guard<std::mutex> lock(m_mutex);
  auto it = m_live.upper_bound(addr);
  if (it == m_live.begin()) return false;
  --it;
  const uint64_t end = it->first + it->second;
  return addr < end && bytes <= end - addr;
}

bool HbmAllocator::block_of(uint64_t addr, uint64_t* start, uint64_t* bytes) const {
  std::lock_guard<std::mutex> lock(m_mutex);
  auto it = m_live.upper_bound(addr);
  if (it == m_live.begin()) return false;
  --it;
  if (addr - it->first >= it->second) return false;
  *start = it->first;
  *bytes = it->second;
  return true;
}

void HbmAllocator::reset_peak() {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_stats.peak_bytes_in_use = m_stats.bytes_in_use;
}

AllocatorStats HbmAllocator::stats() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  AllocatorStats s = m_stats;
  s.num_allocs = m_live.size() + m_releasing.size();
  s.largest_free_block = largest_free_locked();
  s.bytes_free = s.bytes_limit - s.bytes_in_use;
  return s;
}

}  // namespace npusim::rt
