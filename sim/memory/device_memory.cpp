#include "sim/memory/device_memory.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {

void DeviceMemory::check(uint64_t addr, uint64_t n) const {
  if (!in_bounds(addr, n))
    throw KernelFault(fmt::format("GM access [{:#x}, {:#x}) is outside device memory of {} bytes",
                                  addr, addr + n, m_capacity));
}

void DeviceMemory::read(uint64_t addr, void* dst, uint64_t n) const {
  check(addr, n);
  auto* out = static_cast<uint8_t*>(dst);
  while (n > 0) {
    uint64_t page = addr / kPageBytes, off = addr % kPageBytes;
    uint64_t len = std::min(n, kPageBytes - off);
    auto it = m_pages.find(page);
    if (it == m_pages.end()) std::memset(out, 0, len);
    else std::memcpy(out, it->second.get() + off, len);
    out += len;
    addr += len;
    n -= len;
  }
}

void DeviceMemory::write(uint64_t addr, const void* src, uint64_t n) {
  check(addr, n);
  auto* in = static_cast<const uint8_t*>(src);
  while (n > 0) {
    uint64_t page = addr / kPageBytes, off = addr % kPageBytes;
    uint64_t len = std::min(n, kPageBytes - off);
    std::memcpy(page_for_write(page, len == kPageBytes) + off, in, len);
    in += len;
    addr += len;
    n -= len;
  }
}

void DeviceMemory::fill(uint64_t addr, uint8_t value, uint64_t n) {
  check(addr, n);
  while (n > 0) {
    uint64_t page = addr / kPageBytes, off = addr % kPageBytes;
    uint64_t len = std::min(n, kPageBytes - off);
    auto it = m_pages.find(page);
    if (it != m_pages.end() || value != 0) {
      std::memset(page_for_write(page, len == kPageBytes) + off, value, len);
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
    auto it = m_pages.find(page);
    if (it != m_pages.end()) {
      if (len == kPageBytes) release(it);
      else std::memset(it->second.get() + off, 0, len);
    }
    addr += len;
    n -= len;
  }
}

uint8_t* DeviceMemory::page_for_write(uint64_t page, bool whole) {
  Page& p = m_pages[page];
  if (p) return p.get();
  if (m_spare.empty()) {
    p.reset(new uint8_t[kPageBytes]());  // zero-initialised: unwritten bytes read as zero
  } else {
    p = std::move(m_spare.back());
    m_spare.pop_back();
    if (!whole) std::memset(p.get(), 0, kPageBytes);
  }
  return p.get();
}

void DeviceMemory::release(std::unordered_map<uint64_t, Page>::iterator it) {
  if (m_spare.size() < kMaxSparePages) m_spare.push_back(std::move(it->second));
  m_pages.erase(it);
}

}  // namespace npusim
