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
    auto& p = m_pages[page];
    if (!p) p.reset(new uint8_t[kPageBytes]());  // zero-initialised on first touch
    std::memcpy(p.get() + off, in, len);
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
      auto& p = m_pages[page];
      if (!p) p.reset(new uint8_t[kPageBytes]());
      std::memset(p.get() + off, value, len);
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
      if (len == kPageBytes) m_pages.erase(it);
      else std::memset(it->second.get() + off, 0, len);
    }
    addr += len;
    n -= len;
  }
}

}  // namespace npusim
