// DeviceMemory's capacity: any size up to the 48-bit device address space works to its last
// byte, larger ones are refused with an error naming the limit (page counts near 2^64 used to
// wrap).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"
#include "sim/memory/device_memory.h"

using namespace npusim;

TEST_CASE("device memory up to 2^48 bytes works to its last byte") {
  constexpr uint64_t kLimit = uint64_t{1} << 48;
  REQUIRE(DeviceMemory::kMaxCapacity == kLimit);
  // The limit itself, and a size that is no whole number of pages or tables.
  for (uint64_t capacity : {kLimit, kLimit - 1, kLimit - DeviceMemory::kPageBytes - 3}) {
    INFO("capacity " << capacity);
    DeviceMemory m(capacity);
    CHECK(m.capacity() == capacity);
    const uint8_t last = 0xa5, first = 0x3c;
    m.write(capacity - 1, &last, 1);
    m.write(0, &first, 1);
    uint8_t back = 0;
    m.read(capacity - 1, &back, 1);
    CHECK(back == last);
    m.read(0, &back, 1);
    CHECK(back == first);
    CHECK(m.resident_bytes() == 2 * DeviceMemory::kPageBytes);
    // One past the end is outside, and says so.
    CHECK_THROWS_AS(m.read(capacity - 1, &back, 2), KernelFault);
    CHECK_FALSE(m.in_bounds(capacity, 1));
    // The written pages are found by a walk over the memory.
    CHECK(m.snapshot().size() == 2);
    m.clear();
    CHECK(m.resident_bytes() == 0);
  }
}

TEST_CASE("device memory larger than 2^48 bytes is refused, naming the limit") {
  for (uint64_t capacity : {~uint64_t{0}, ~uint64_t{0} - 8191, uint64_t{1} << 60,
                            (uint64_t{1} << 48) + 1}) {
    INFO("capacity " << capacity);
    try {
      DeviceMemory m(capacity);
      FAIL("constructed");
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK(msg.find(std::to_string(capacity)) != std::string::npos);
      CHECK(msg.find("2^48") != std::string::npos);
    }
  }
}

// invalidate(): a timing-only run's kernel writes. The bytes read as zero, whole pages hold no
// host memory, and the write epochs and the written state move exactly as a write() of the same
// range moves them (the runtime's derived buffers depend on it: docs/chip_model.md).
TEST_CASE("invalidate writes undefined bytes: zeros, no host memory, epochs as a write") {
  constexpr uint64_t kPage = DeviceMemory::kPageBytes;
  DeviceMemory written(64 * kPage), invalidated(64 * kPage);
  const std::vector<uint8_t> ones(3 * kPage + 100, 1);
  // Host data in page 2, then a "kernel" writes [2.5 pages, 6 pages + 10): part of page 2,
  // pages 3..5 whole, the start of page 6.
  for (DeviceMemory* m : {&written, &invalidated}) m->write(2 * kPage, ones.data(), kPage);
  const uint64_t e = written.advance_write_epoch();
  invalidated.advance_write_epoch();
  const uint64_t a = 2 * kPage + kPage / 2, n = 3 * kPage + kPage / 2 + 10;
  written.write(a, ones.data(), n);
  invalidated.invalidate(a, n);
  // Epochs and the written state agree block by block with the write.
  for (uint64_t addr = 0; addr < 8 * kPage; addr += DeviceMemory::kEpochBlockBytes) {
    INFO("block at " << addr);
    CHECK((written.last_write_epoch(addr, 1) > e) == (invalidated.last_write_epoch(addr, 1) > e));
  }
  CHECK(invalidated.last_write_epoch(a, 1) > e);
  CHECK(invalidated.last_write_epoch(a - 1, 1) <= e);
  CHECK(invalidated.last_write_epoch(a + n - 10 + DeviceMemory::kEpochBlockBytes, 1) <= e);
  // The host's bytes before the range stay, the range reads as zero, and only page 2 (the
  // host's data) takes host memory.
  std::vector<uint8_t> back(n + kPage / 2);
  invalidated.read(2 * kPage, back.data(), back.size());
  CHECK(back[0] == 1);
  CHECK(back[kPage / 2 - 1] == 1);
  for (uint64_t i = kPage / 2; i < back.size(); ++i) REQUIRE(back[i] == 0);
  CHECK(invalidated.resident_bytes() == kPage);
  CHECK_FALSE(invalidated.holds_data(3 * kPage, 4 * kPage));
  CHECK(invalidated.holds_data(2 * kPage, kPage));
  // A zero fill stamps an undefined page (it is written, as in the functional memory) but
  // allocates nothing; host data written into it then reads back, zeros around it.
  const uint64_t f = invalidated.advance_write_epoch();
  invalidated.fill(4 * kPage, 0, 16);
  CHECK(invalidated.last_write_epoch(4 * kPage, 16) > f);
  CHECK(invalidated.resident_bytes() == kPage);
  invalidated.write(4 * kPage + 8, ones.data(), 4);
  uint8_t w[16];
  invalidated.read(4 * kPage, w, 16);
  CHECK(w[7] == 0);
  CHECK(w[8] == 1);
  CHECK(w[12] == 0);
  CHECK(invalidated.resident_bytes() == 2 * kPage);
  // Invalidating a page that holds data releases it; discard forgets an undefined page.
  invalidated.invalidate(2 * kPage, kPage);
  CHECK(invalidated.resident_bytes() == kPage);
  invalidated.discard(3 * kPage, kPage);
  const uint64_t g = invalidated.advance_write_epoch();
  invalidated.fill(3 * kPage, 0, 16);  // never-written again: a zero fill writes nothing
  CHECK(invalidated.last_write_epoch(3 * kPage, 16) <= g);
}

TEST_CASE("span_for_write gives a range inside one page in place, as write() would store it") {
  constexpr uint64_t kPage = DeviceMemory::kPageBytes;
  DeviceMemory spans(16 * kPage), writes(16 * kPage);
  std::vector<uint8_t> bytes(300);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(i * 7 + 1);
  // Host data around the range in page 1; page 3 written undefined (a timing-only kernel);
  // page 5 never written.
  for (DeviceMemory* m : {&spans, &writes}) {
    m->write(kPage, bytes.data(), bytes.size());
    m->invalidate(3 * kPage, kPage);
  }
  const uint64_t e = spans.advance_write_epoch();
  writes.advance_write_epoch();
  for (uint64_t addr : {kPage + 100, 3 * kPage + 64, 5 * kPage + 1000}) {
    INFO("at " << addr);
    uint8_t* p = spans.span_for_write(addr, 100);
    REQUIRE(p != nullptr);
    std::copy(bytes.begin(), bytes.begin() + 100, p);
    writes.write(addr, bytes.data(), 100);
    CHECK(spans.last_write_epoch(addr, 100) > e);
    CHECK(spans.last_write_epoch(addr + 100 + DeviceMemory::kEpochBlockBytes, 1) <= e);
  }
  // The same bytes everywhere (zeros around the ranges in the pages they allocated).
  std::vector<uint8_t> a(8 * kPage), b(8 * kPage);
  spans.read(0, a.data(), a.size());
  writes.read(0, b.data(), b.size());
  CHECK(a == b);
  CHECK(spans.resident_bytes() == writes.resident_bytes());
  // A range crossing a page boundary is not given (write() it); one past the end faults.
  CHECK(spans.span_for_write(2 * kPage - 8, 16) == nullptr);
  CHECK(spans.span_for_write(kPage, kPage) != nullptr);
  CHECK_THROWS_AS(spans.span_for_write(16 * kPage - 8, 16), KernelFault);
}
