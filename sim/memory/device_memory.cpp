#include "sim/memory/device_memory.h"

#include <algorithm>
#include <cstring>
#include <new>

#include <sys/mman.h>

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {

DeviceMemory::DeviceMemory(uint64_t capacity_bytes) : m_capacity(capacity_bytes) {
  if (capacity_bytes > kMaxCapacity)
    throw Error(fmt::format("device memory of {} bytes is larger than the {} bytes (2^48) of "
                            "the device address space", capacity_bytes, kMaxCapacity));
  const uint64_t pages = capacity_bytes / kPageBytes + (capacity_bytes % kPageBytes != 0);
  m_dir_size = pages / kTablePages + (pages % kTablePages != 0);
  static_assert(std::atomic<Table*>::is_always_lock_free &&
                    sizeof(std::atomic<Table*>) == sizeof(Table*),
                "a zero-filled directory must read as null pointers");
  m_dir.reset(static_cast<std::atomic<Table*>*>(
      std::calloc(std::max<uint64_t>(m_dir_size, 1), sizeof(std::atomic<Table*>))));
  if (!m_dir) throw std::bad_alloc();
}

DeviceMemory::~DeviceMemory() {
  clear();
  for (void* chunk : m_chunks) munmap(chunk, kChunkBytes);
  for (uint64_t i = 0, end = m_dir_used.load(); i < end; ++i) {
    Table* t = m_dir[i].load();
    if (!t) continue;
    for (auto& e : t->epochs) delete[] e.load();
    delete t;
  }
}

void DeviceMemory::check(uint64_t addr, uint64_t n) const {
  if (!in_bounds(addr, n))
    throw KernelFault(fmt::format("GM access [{:#x}, {:#x}) is outside device memory of {} bytes",
                                  addr, addr + n, m_capacity));
}

template <typename F>
void DeviceMemory::for_each_page(F&& f) const {
  for (uint64_t t = 0, end = m_dir_used.load(std::memory_order_acquire); t < end; ++t) {
    const Table* table = m_dir[t].load(std::memory_order_acquire);
    if (!table) continue;
    for (uint64_t i = 0; i < kTablePages; ++i)
      if (uint8_t* p = table->pages[i].load(std::memory_order_acquire)) f(t * kTablePages + i, p);
  }
}

void DeviceMemory::read(uint64_t addr, void* dst, uint64_t n) const {
  check(addr, n);
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    uint64_t page = addr / kPageBytes, off = addr % kPageBytes;
    uint64_t len = std::min(n, kPageBytes - off);
    const uint8_t* p = find_page(page);
    if (!p) std::memset(out, 0, len);
    else std::memcpy(out, p + off, len);
    out += len;
    addr += len;
    n -= len;
  }
}

const uint8_t* DeviceMemory::view(uint64_t addr, uint64_t n) const {
  static const std::vector<uint8_t> zero_page(kPageBytes, 0);
  check(addr, n);
  const uint64_t off = addr % kPageBytes;
  if (off + n > kPageBytes) return nullptr;
  const uint8_t* p = find_page(addr / kPageBytes);
  return (p ? p : zero_page.data()) + off;
}

void DeviceMemory::write(uint64_t addr, const void* src, uint64_t n) {
  check(addr, n);
  auto* in = static_cast<const uint8_t*>(src);
  while (n > 0) {
    uint64_t page = addr / kPageBytes, off = addr % kPageBytes;
    uint64_t len = std::min(n, kPageBytes - off);
    std::memcpy(page_for_write(page, len == kPageBytes) + off, in, len);
    stamp(page, off, len);
    in += len;
    addr += len;
    n -= len;
  }
}

uint8_t* DeviceMemory::span_for_write(uint64_t addr, uint64_t n) {
  check(addr, n);
  const uint64_t page = addr / kPageBytes, off = addr % kPageBytes;
  if (n == 0 || off + n > kPageBytes) return nullptr;
  uint8_t* p = page_for_write(page, n == kPageBytes) + off;
  stamp(page, off, n);
  return p;
}

void DeviceMemory::fill(uint64_t addr, uint8_t value, uint64_t n) {
  check(addr, n);
  while (n > 0) {
    uint64_t page = addr / kPageBytes, off = addr % kPageBytes;
    uint64_t len = std::min(n, kPageBytes - off);
    if (value != 0 || holds(find_page(page))) {
      std::memset(page_for_write(page, len == kPageBytes) + off, value, len);
      stamp(page, off, len);
    } else if (find_page(page)) {  // undefined: it reads as zero already
      stamp(page, off, len);
    }
    addr += len;
    n -= len;
  }
}

void DeviceMemory::discard(uint64_t addr, uint64_t n) {
  check(addr, n);
  while (n > 0) {
    uint64_t page = addr / kPageBytes, off = addr % kPageBytes;
    uint64_t len = std::min(n, kPageBytes - off);
    if (uint8_t* p = find_page(page)) {
      stamp(page, off, len);
      if (len == kPageBytes) release(page);
      else if (holds(p)) std::memset(p + off, 0, len);
    }
    addr += len;
    n -= len;
  }
}

void DeviceMemory::invalidate(uint64_t addr, uint64_t n) {
  check(addr, n);
  while (n > 0) {
    uint64_t page = addr / kPageBytes, off = addr % kPageBytes;
    uint64_t len = std::min(n, kPageBytes - off);
    uint8_t* p = find_page(page);
    if (holds(p) && len < kPageBytes) {
      std::memset(p + off, 0, len);
    } else if (p != undefined_page()) {  // never written, or wholly overwritten
      std::lock_guard<std::mutex> lock(m_alloc);
      std::atomic<uint8_t*>& entry = table_with_epochs(page)->pages[page % kTablePages];
      uint8_t* old = entry.load(std::memory_order_acquire);
      if (!old || len == kPageBytes) {
        entry.store(undefined_page(), std::memory_order_release);
        if (holds(old)) {
          --m_resident;
          m_spare.push_back(old);
        }
      } else if (holds(old)) {  // another thread gave it data meanwhile
        std::memset(old + off, 0, len);
      }
    }
    stamp(page, off, len);
    addr += len;
    n -= len;
  }
}

bool DeviceMemory::holds_data(uint64_t addr, uint64_t n) const {
  check(addr, n);
  if (n == 0) return false;
  for (uint64_t page = addr / kPageBytes, end = (addr + n - 1) / kPageBytes; page <= end; ++page)
    if (holds(find_page(page))) return true;
  return false;
}

uint8_t* DeviceMemory::undefined_page() {
  static uint8_t* const page = [] {
    void* p = mmap(nullptr, kPageBytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    return static_cast<uint8_t*>(p);
  }();
  return page;
}

DeviceMemory::Table* DeviceMemory::table_with_epochs(uint64_t page) {
  std::atomic<Table*>& slot = m_dir[page / kTablePages];
  Table* table = slot.load(std::memory_order_acquire);
  if (!table) {
    table = new Table;
    for (auto& e : table->pages) e.store(nullptr, std::memory_order_relaxed);
    for (auto& e : table->epochs) e.store(nullptr, std::memory_order_relaxed);
    slot.store(table, std::memory_order_release);
    const uint64_t end = page / kTablePages + 1;
    if (m_dir_used.load(std::memory_order_relaxed) < end)
      m_dir_used.store(end, std::memory_order_release);
  }
  std::atomic<std::atomic<uint64_t>*>& epochs = table->epochs[page % kTablePages];
  if (!epochs.load(std::memory_order_relaxed)) {
    auto* e = new std::atomic<uint64_t>[kEpochBlocks];
    for (uint64_t b = 0; b < kEpochBlocks; ++b) e[b].store(0, std::memory_order_relaxed);
    epochs.store(e, std::memory_order_release);
  }
  return table;
}

uint8_t* DeviceMemory::page_for_write(uint64_t page, bool whole) {
  if (uint8_t* p = find_page(page); holds(p)) return p;
  std::lock_guard<std::mutex> lock(m_alloc);
  std::atomic<uint8_t*>& entry = table_with_epochs(page)->pages[page % kTablePages];
  if (uint8_t* p = entry.load(std::memory_order_acquire); holds(p)) return p;  // another thread's
  uint8_t* p;
  if (m_spare.empty()) {
    // A new chunk of pages, backed by huge pages where the host allows (the functional copies
    // of a kernel sweep megabytes of device memory; 4 KiB host pages cost TLB misses).
    void* chunk = mmap(nullptr, kChunkBytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (chunk == MAP_FAILED) throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
    madvise(chunk, kChunkBytes, MADV_HUGEPAGE);
#endif
    m_chunks.push_back(chunk);
    for (uint64_t i = kChunkBytes / kPageBytes; i-- > 1;)  // zero pages from the host
      m_spare.push_back(static_cast<uint8_t*>(chunk) + i * kPageBytes);
    p = static_cast<uint8_t*>(chunk);
    if (!whole) std::memset(p, 0, kPageBytes);  // (already zero; kept for the spare's rule)
  } else {
    p = m_spare.back();
    m_spare.pop_back();
    if (!whole) std::memset(p, 0, kPageBytes);  // an undefined page reads as zero too
  }
  entry.store(p, std::memory_order_release);
  ++m_resident;
  return p;
}

void DeviceMemory::release(uint64_t page) {
  std::lock_guard<std::mutex> lock(m_alloc);
  Table* table = m_dir[page / kTablePages].load();
  uint8_t* p = table->pages[page % kTablePages].exchange(nullptr);
  if (!holds(p)) return;
  --m_resident;
  m_spare.push_back(p);
}

void DeviceMemory::clear() {
  for_each_page([&](uint64_t index, uint8_t*) { release(index); });
  m_epoch_floor.store(m_write_epoch.load());
}

uint64_t DeviceMemory::last_write_epoch(uint64_t addr, uint64_t n) const {
  check(addr, n);
  uint64_t last = m_epoch_floor.load();
  if (n == 0) return last;
  for (uint64_t page = addr / kPageBytes, end = (addr + n - 1) / kPageBytes; page <= end;
       ++page) {
    const Table* t = m_dir[page / kTablePages].load(std::memory_order_acquire);
    if (!t) {
      page |= kTablePages - 1;  // no page of this table was ever written
      continue;
    }
    const std::atomic<uint64_t>* e = t->epochs[page % kTablePages].load(std::memory_order_acquire);
    if (!e) continue;  // never written
    const uint64_t first = page == addr / kPageBytes ? addr % kPageBytes : 0;
    const uint64_t last_byte = page == end ? (addr + n - 1) % kPageBytes : kPageBytes - 1;
    for (uint64_t b = first / kEpochBlockBytes; b <= last_byte / kEpochBlockBytes; ++b)
      last = std::max(last, e[b].load(std::memory_order_relaxed));
  }
  return last;
}

DeviceMemory::Snapshot DeviceMemory::snapshot() const {
  Snapshot s;
  for_each_page([&](uint64_t index, uint8_t* p) { s[index].assign(p, p + kPageBytes); });
  return s;
}

void DeviceMemory::restore(const Snapshot& s) {
  static const std::vector<uint8_t> zero(kPageBytes, 0);
  // Stamps the blocks of page `index` whose bytes differ between `from` and `to` (a check of
  // a replayed launch restores memory around it: blocks it leaves as they were stay unchanged).
  auto stamp_changes = [&](uint64_t index, const uint8_t* from, const uint8_t* to) {
    for (uint64_t off = 0; off < kPageBytes; off += kEpochBlockBytes)
      if (std::memcmp(from + off, to + off, kEpochBlockBytes) != 0)
        stamp(index, off, kEpochBlockBytes);
  };
  for_each_page([&](uint64_t index, uint8_t* p) {
    if (s.count(index)) return;
    stamp_changes(index, p, zero.data());
    release(index);
  });
  for (const auto& [index, bytes] : s) {
    if (uint8_t* old = find_page(index); holds(old)) {  // compared in place, overwritten
      stamp_changes(index, old, bytes.data());
      std::memcpy(old, bytes.data(), kPageBytes);
    } else {  // stamped once the page (and its epochs) exist; undefined reads as zero
      std::memcpy(page_for_write(index, true), bytes.data(), kPageBytes);
      stamp_changes(index, zero.data(), bytes.data());
    }
  }
}

std::optional<uint64_t> DeviceMemory::first_difference(const Snapshot& s) const {
  static const std::vector<uint8_t> zero(kPageBytes, 0);
  std::optional<uint64_t> first;
  auto compare = [&](uint64_t index, const uint8_t* a, const uint8_t* b) {
    for (uint64_t i = 0; i < kPageBytes; ++i)
      if (a[i] != b[i]) {
        const uint64_t addr = index * kPageBytes + i;
        if (!first || addr < *first) first = addr;
        return;
      }
  };
  for_each_page([&](uint64_t index, uint8_t* p) {
    auto it = s.find(index);
    compare(index, p, it == s.end() ? zero.data() : it->second.data());
  });
  for (const auto& [index, bytes] : s)
    if (!find_page(index)) compare(index, zero.data(), bytes.data());
  return first;
}

}  // namespace npusim
