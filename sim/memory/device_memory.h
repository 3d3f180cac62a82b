// Global memory (HBM) of the device: sparse, pages allocated on first write, so a 64 GiB chip
// runs on a host with far less RAM. Unwritten bytes read as zero. Addresses are device byte
// addresses in [0, capacity).
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace npusim {

class DeviceMemory {
 public:
  static constexpr uint64_t kPageBytes = 64 * 1024;
  explicit DeviceMemory(uint64_t capacity_bytes) : m_capacity(capacity_bytes) {}
  uint64_t capacity() const { return m_capacity; }
  // Throws KernelFault naming the range if [addr, addr+n) is outside the device memory.
  void read(uint64_t addr, void* dst, uint64_t n) const;
  void write(uint64_t addr, const void* src, uint64_t n);
  void fill(uint64_t addr, uint8_t value, uint64_t n);
  // Returns [addr, addr+n) to the never-written state (reads as zero): pages wholly inside the
  // range are released, the covered parts of other pages are zeroed. Throws like write().
  void discard(uint64_t addr, uint64_t n);
  bool in_bounds(uint64_t addr, uint64_t n) const { return n <= m_capacity && addr <= m_capacity - n; }
  uint64_t resident_bytes() const { return m_pages.size() * kPageBytes; }
  void clear() { m_pages.clear(); }

 private:
  using Page = std::unique_ptr<uint8_t[]>;
  // Released pages kept for reuse, at most this many (64 KiB each: 256 MiB). A framework frees
  // and reallocates its buffers every step; without the pool each step paid a fresh host
  // allocation, heap growth and page faults per page.
  static constexpr size_t kMaxSparePages = 4096;
  void check(uint64_t addr, uint64_t n) const;
  // The page at index `page`, allocated if it was never written: zero-filled, unless `whole`
  // (the caller overwrites all of it).
  uint8_t* page_for_write(uint64_t page, bool whole);
  void release(std::unordered_map<uint64_t, Page>::iterator it);
  uint64_t m_capacity;
  std::unordered_map<uint64_t, Page> m_pages;  // page index -> page
  std::vector<Page> m_spare;                   // released pages, contents undefined
};

}  // namespace npusim
