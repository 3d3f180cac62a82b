// DeviceMemory's capacity: any size up to the 48-bit device address space works to its last
// byte, larger ones are refused with an error naming the limit (page counts near 2^64 used to
// wrap).
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>

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
