// Device memory: the allocator on its own (best fit, coalescing, stats, out of memory), then
// malloc/free, memset, device-to-device copies and freed-page discard on the tiny chip.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>

#include "adapter/runtime/allocator.h"
#include "tests/runtime/runtime_test_util.h"

using namespace npusim;
using rt::HbmAllocator;
using rt::StatusCode;

namespace {

constexpr uint64_t kA = HbmAllocator::kAlignment;  // 512

uint64_t alloc(HbmAllocator& a, uint64_t bytes) {
  uint64_t addr = 0;
  rt::Status st = a.allocate(bytes, &addr);
  INFO(st.to_string());
  REQUIRE(st.ok());
  return addr;
}

}  // namespace

TEST_CASE("allocator: blocks are 512-byte aligned, start at base and never at 0") {
  HbmAllocator a(100, 100 * kA);  // base rounds up to 512, end down to 512*100
  CHECK(a.base() == kA);
  CHECK(a.end() == 100 * kA);
  const uint64_t p = alloc(a, 1);
  const uint64_t q = alloc(a, kA + 1);
  CHECK(p == kA);
  CHECK(q == 2 * kA);  // p took one 512-byte unit
  CHECK(p % kA == 0);
  CHECK(q % kA == 0);
  rt::AllocatorStats s = a.stats();
  CHECK(s.bytes_in_use == 3 * kA);  // 512 + 1024
  CHECK(s.num_allocs == 2);
  CHECK(s.bytes_limit == 99 * kA);
  CHECK(s.largest_free_block == 96 * kA);
  CHECK(s.largest_alloc_size == 2 * kA);
  CHECK_THROWS(HbmAllocator(0, 1024));    // address 0 would be handed out
  CHECK_THROWS(HbmAllocator(512, 1000));  // no whole block
}

TEST_CASE("allocator: a larger alignment (the device's L2 line) gives every block whole lines") {
  const uint64_t line = 4 * kA;  // a 2 KiB L2 line
  HbmAllocator a(100, 100 * line, line);
  CHECK(a.alignment() == line);
  CHECK(a.base() == line);
  const uint64_t p = alloc(a, 1);
  const uint64_t q = alloc(a, line + 1);
  const uint64_t r = alloc(a, 3);
  CHECK(p == line);
  CHECK(q == 2 * line);  // p took one line
  CHECK(r == 4 * line);  // q took two
  CHECK(a.stats().bytes_in_use == 4 * line);
  CHECK_THROWS(HbmAllocator(kA, 100 * kA, kA / 2));  // below the 512-byte minimum
  CHECK_THROWS(HbmAllocator(kA, 100 * kA, 3 * kA));  // not a power of two
}

TEST_CASE("allocator: reset_peak restarts the peak from the bytes in use") {
  HbmAllocator a(kA, 65 * kA);
  const uint64_t p = alloc(a, 8 * kA);
  const uint64_t q = alloc(a, 2 * kA);
  REQUIRE(a.release(p).ok());
  CHECK(a.stats().peak_bytes_in_use == 10 * kA);
  a.reset_peak();
  CHECK(a.stats().peak_bytes_in_use == 2 * kA);
  alloc(a, kA);
  CHECK(a.stats().peak_bytes_in_use == 3 * kA);
  REQUIRE(a.release(q).ok());
  CHECK(a.stats().peak_bytes_in_use == 3 * kA);
}

TEST_CASE("allocator: best fit picks the smallest hole, frees coalesce with both neighbours") {
  HbmAllocator a(kA, 65 * kA);  // 64 units
  uint64_t b[6];
  const uint64_t units[6] = {4, 1, 2, 1, 8, 1};
  for (int i = 0; i < 6; ++i) b[i] = alloc(a, units[i] * kA);
  // Holes of 4 units (b0) and 2 units (b2), separated by live blocks.
  REQUIRE(a.release(b[0]).ok());
  REQUIRE(a.release(b[2]).ok());
  CHECK(alloc(a, 2 * kA) == b[2]);  // the 2-unit hole fits exactly; the 4-unit one is larger
  CHECK(alloc(a, 3 * kA) == b[0]);  // the 4-unit hole, split from its low end
  CHECK(alloc(a, kA) == b[0] + 3 * kA);

  // Free everything in an order that exercises merging with the lower, the upper and both
  // neighbours; afterwards one free block spans the whole range again.
  HbmAllocator c(kA, 65 * kA);
  uint64_t x = alloc(c, kA), y = alloc(c, kA), z = alloc(c, kA), w = alloc(c, kA);
  REQUIRE(c.release(x).ok());
  REQUIRE(c.release(z).ok());
  CHECK(c.stats().largest_free_block == 60 * kA);  // the tail after w
  REQUIRE(c.release(y).ok());                      // merges x, y, z
  CHECK(c.stats().largest_free_block == 60 * kA);
  CHECK(alloc(c, 3 * kA) == x);                    // x..z is one 3-unit block now
  REQUIRE(c.release(x).ok());
  REQUIRE(c.release(w).ok());                      // merges with x..z below and the tail above
  rt::AllocatorStats s = c.stats();
  CHECK(s.largest_free_block == 64 * kA);
  CHECK(s.bytes_in_use == 0);
  CHECK(s.num_allocs == 0);
  CHECK(s.peak_bytes_in_use == 4 * kA);
  CHECK(s.total_allocs == 5);
}

TEST_CASE("allocator: out of memory names the request and what is free, then recovers") {
  HbmAllocator a(kA, 9 * kA);  // 8 units
  uint64_t p = alloc(a, 3 * kA), q = alloc(a, 2 * kA);
  alloc(a, 3 * kA);
  REQUIRE(a.release(p).ok());  // 3 units free at the bottom
  uint64_t addr = 0;
  rt::Status st = a.allocate(4 * kA - 100, &addr);
  CHECK(st.code() == StatusCode::out_of_memory);
  CHECK_THAT(st.message(), Catch::Contains("cannot allocate 1948 bytes"));
  CHECK_THAT(st.message(), Catch::Contains("2048 with 512-byte alignment"));
  CHECK_THAT(st.message(), Catch::Contains("1536 of 4096 bytes free"));
  CHECK_THAT(st.message(), Catch::Contains("largest free block 1536 bytes"));
  CHECK(a.allocate(~0ull, &addr).code() == StatusCode::out_of_memory);  // no overflow
  CHECK(a.allocate(0, &addr).code() == StatusCode::invalid_argument);
  // Still usable: the free 3 units serve smaller requests, and freeing q makes room for 4+.
  CHECK(alloc(a, 3 * kA) == p);
  REQUIRE(a.release(p).ok());
  REQUIRE(a.release(q).ok());
  CHECK(alloc(a, 5 * kA) == p);
}

TEST_CASE("allocator: double free and foreign addresses are invalid_argument; contains()") {
  HbmAllocator a(kA, 9 * kA);
  uint64_t p = alloc(a, 2 * kA);
  CHECK(a.contains(p, 2 * kA));
  CHECK(a.contains(p + 100, 900));
  CHECK_FALSE(a.contains(p + 100, 2 * kA));  // runs past the block
  CHECK_FALSE(a.contains(p + 2 * kA, 1));    // free memory
  CHECK(a.release(p + kA).code() == StatusCode::invalid_argument);
  REQUIRE(a.release(p).ok());
  rt::Status st = a.release(p);
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(), Catch::Contains("not the start of a live allocation"));
}

TEST_CASE("allocator: block_of names the live block holding an address (the L2 files by it)") {
  HbmAllocator a(kA, 9 * kA);
  const uint64_t p = alloc(a, 2 * kA), q = alloc(a, 700);  // q's block: 1024 bytes
  uint64_t start = 0, bytes = 0;
  CHECK(a.block_of(p, &start, &bytes));
  CHECK((start == p && bytes == 2 * kA));
  CHECK(a.block_of(q + 1023, &start, &bytes));
  CHECK((start == q && bytes == 2 * kA));
  CHECK_FALSE(a.block_of(q + 1024, &start, &bytes));  // free memory after q
  CHECK_FALSE(a.block_of(kA - 1, &start, &bytes));    // below the first block
  REQUIRE(a.release(p).ok());
  CHECK_FALSE(a.block_of(p, &start, &bytes));
}

TEST_CASE("device: malloc/free report usage; out of memory fails cleanly and the device stays "
          "usable") {
  auto dev = test::tiny_device();
  const rt::AllocatorStats s0 = dev->memory_stats();
  // tiny: memory.hbm.bytes = 1 GiB; the runtime manages [64 KiB, 1 GiB).
  CHECK(s0.bytes_limit == dev->config().hbm_bytes - rt::Device::kHbmBase);

  uint64_t a = 0, b = 0;
  REQUIRE(dev->malloc(1000, &a).ok());
  REQUIRE(dev->malloc(3 * kA, &b).ok());
  CHECK(a >= rt::Device::kHbmBase);
  CHECK(a % kA == 0);
  rt::AllocatorStats s1 = dev->memory_stats();
  CHECK(s1.bytes_in_use - s0.bytes_in_use == 1024 + 3 * kA);
  CHECK(s1.num_allocs - s0.num_allocs == 2);

  uint64_t huge = 0;
  rt::Status st = dev->malloc(2ull << 30, &huge);  // 2 GiB on a 1 GiB chip
  CHECK(st.code() == StatusCode::out_of_memory);
  CHECK_THAT(st.message(), Catch::Contains("malloc of 2147483648 bytes on chip 'tiny'"));
  CHECK_THAT(st.message(), Catch::Contains("largest free block"));

  // Fill the device to the last byte, fail once more, free, and allocate again.
  uint64_t rest = 0;
  REQUIRE(dev->malloc(dev->memory_stats().largest_free_block, &rest).ok());
  CHECK(dev->memory_stats().largest_free_block == 0);
  CHECK(dev->malloc(1, &huge).code() == StatusCode::out_of_memory);
  REQUIRE(dev->free(rest).ok());
  REQUIRE(dev->free(a).ok());
  REQUIRE(dev->free(b).ok());
  CHECK(dev->memory_stats().bytes_in_use == s0.bytes_in_use);
  REQUIRE(dev->malloc(1 << 20, &a).ok());
  REQUIRE(dev->free(a).ok());
  CHECK(dev->free(0).ok());
  CHECK(dev->free(a).code() == StatusCode::invalid_argument);
}

TEST_CASE("device: memset8/memset32/memcpy_d2d have their functional effect, checked ranges") {
  auto dev = test::tiny_device();
  constexpr uint64_t n = 4096;
  uint64_t a = 0, b = 0;
  REQUIRE(dev->malloc(n, &a).ok());
  REQUIRE(dev->malloc(n, &b).ok());
  REQUIRE(dev->memset8(a, 0x5a, n).ok());
  REQUIRE(dev->memset32(a + 64, 0x11223344u, 256).ok());
  std::vector<uint8_t> host(n);
  REQUIRE(dev->memcpy_d2h(host.data(), a, n).ok());
  for (uint64_t i = 0; i < n; ++i) {
    const uint8_t want = (i >= 64 && i < 320) ? uint8_t(0x44332211u >> (8 * (3 - (i - 64) % 4)))
                                              : uint8_t(0x5a);
    if (host[i] != want) FAIL("byte " << i << " is " << int(host[i]) << ", want " << int(want));
  }
  // d2d, then an overlapping d2d (memmove semantics) on the same buffer.
  std::vector<uint8_t> pattern(n);
  for (uint64_t i = 0; i < n; ++i) pattern[i] = static_cast<uint8_t>(i * 13 + 1);
  REQUIRE(dev->memcpy_h2d(a, pattern.data(), n).ok());
  REQUIRE(dev->memcpy_d2d(b, a, n).ok());
  REQUIRE(dev->memcpy_d2d(b + 100, b, 1000).ok());
  std::vector<uint8_t> want = pattern;
  std::memmove(want.data() + 100, want.data(), 1000);
  REQUIRE(dev->memcpy_d2h(host.data(), b, n).ok());
  CHECK(host == want);

  rt::Status st = dev->memset32(a + 2, 0, 8);
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(), Catch::Contains("multiples of 4"));
  st = dev->memcpy_d2d(b, a + 1, n);  // source runs one byte past its allocation
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(), Catch::Contains("source device range"));
  CHECK(dev->memcpy_h2d(a, nullptr, 16).code() == StatusCode::invalid_argument);
  REQUIRE(dev->free(a).ok());
  REQUIRE(dev->free(b).ok());
  st = dev->memset8(a, 0, 16);  // use after free
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(), Catch::Contains("not inside one live allocation"));
}

TEST_CASE("device: free discards the block's pages; the next owner reads zeros") {
  auto dev = test::tiny_device();
  constexpr uint64_t n = 1 << 20;  // 16 device-memory pages of 64 KiB
  uint64_t resident0 = 0, resident1 = 0, resident2 = 0;
  REQUIRE(dev->resident_bytes(&resident0).ok());
  uint64_t a = 0;
  REQUIRE(dev->malloc(n, &a).ok());
  REQUIRE(dev->memset8(a, 0xff, n).ok());
  REQUIRE(dev->resident_bytes(&resident1).ok());
  // The block may share its first and last page with memory touched before.
  CHECK(resident1 >= resident0 + n - 2 * DeviceMemory::kPageBytes);
  REQUIRE(dev->free(a).ok());
  REQUIRE(dev->resident_bytes(&resident2).ok());
  CHECK(resident2 <= resident0 + 2 * DeviceMemory::kPageBytes);  // at most two partial pages
  uint64_t b = 0;
  REQUIRE(dev->malloc(n, &b).ok());
  CHECK(b == a);  // best fit hands the same block back
  std::vector<uint8_t> host(n, 1);
  REQUIRE(dev->memcpy_d2h(host.data(), b, n).ok());
  CHECK(std::all_of(host.begin(), host.end(), [](uint8_t v) { return v == 0; }));
  // Released pages are recycled: a partial write into one (here 100 bytes in the middle of the
  // block's 9th page) must still leave the rest of the page reading zero.
  const uint64_t at = b + 8 * DeviceMemory::kPageBytes + 1000;
  std::vector<uint8_t> bytes(100, 0x5a);
  REQUIRE(dev->free(b).ok());
  REQUIRE(dev->malloc(n, &b).ok());
  REQUIRE(dev->memcpy_h2d(at, bytes.data(), bytes.size()).ok());
  REQUIRE(dev->memcpy_d2h(host.data(), b, n).ok());
  for (uint64_t i = 0; i < n; ++i) {
    const bool inside = b + i >= at && b + i < at + bytes.size();
    if (host[i] != (inside ? 0x5a : 0)) FAIL("byte " << i << " reads " << int(host[i]));
  }
  REQUIRE(dev->free(b).ok());
}

TEST_CASE("device: a d2d copy and a memset advance the device timeline by the HBM formula") {
  auto dev = test::tiny_device();
  const ChipConfig& cfg = dev->config();
  constexpr uint64_t n = 256 * 1024;
  uint64_t a = 0, b = 0;
  REQUIRE(dev->malloc(n, &a).ok());
  REQUIRE(dev->malloc(n, &b).ok());
  rt::Stream s;
  rt::Event e0, e1, e2;
  REQUIRE(dev->create_stream(&s).ok());
  for (rt::Event* e : {&e0, &e1, &e2}) REQUIRE(dev->create_event(e).ok());
  REQUIRE(dev->record_event(e0, s).ok());
  REQUIRE(dev->memcpy_d2d_async(s, b, a, n).ok());
  REQUIRE(dev->record_event(e1, s).ok());
  REQUIRE(dev->memset32_async(s, a, 0x3c003c00u, n).ok());
  REQUIRE(dev->record_event(e2, s).ok());
  REQUIRE(dev->synchronize_stream(s).ok());
  double d2d_us = 0, memset_us = 0;
  REQUIRE(dev->event_elapsed_us(e0, e1, &d2d_us).ok());
  REQUIRE(dev->event_elapsed_us(e1, e2, &memset_us).ok());
  // tiny (from 910b): hbm_latency_cycles 500, hbm 1800 GB/s at 1850 MHz = 972.97 B/cycle.
  // d2d moves the bytes twice: ceil(500 + 2 * 262144 / 972.97) = ceil(1038.85) = 1039 cycles;
  // memset once: ceil(500 + 262144 / 972.97) = ceil(769.43) = 770 cycles.
  const double bpc = cfg.hbm_sustained_bytes_per_cycle();
  const double d2d_cycles = std::ceil(cfg.hbm_latency_cycles + 2.0 * n / bpc);
  const double memset_cycles = std::ceil(cfg.hbm_latency_cycles + 1.0 * n / bpc);
  CHECK(d2d_cycles == 1039);
  CHECK(memset_cycles == 770);
  CHECK(d2d_us * cfg.clock_mhz == Approx(d2d_cycles).margin(1e-6));
  CHECK(memset_us * cfg.clock_mhz == Approx(memset_cycles).margin(1e-6));
  REQUIRE(dev->destroy_stream(s).ok());
  for (rt::Event e : {e0, e1, e2}) REQUIRE(dev->destroy_event(e).ok());
  REQUIRE(dev->free(a).ok());
  REQUIRE(dev->free(b).ok());
}

TEST_CASE("device memory write epochs: per 256-byte block, every kind of write, clear and "
          "restore") {
  constexpr uint64_t kPage = DeviceMemory::kPageBytes, kBlock = DeviceMemory::kEpochBlockBytes;
  DeviceMemory m(4096 * kPage * 2 + kPage);  // spans more than two page tables
  const uint64_t a = 3 * kPage + 5 * kBlock;  // a range across a page boundary
  const uint64_t n = kPage;
  CHECK(m.last_write_epoch(a, n) == 0);  // never written
  const uint8_t bytes[16] = {1};
  m.write(a + n - 1, bytes, 1);  // the range's last byte
  uint64_t e = m.advance_write_epoch();
  CHECK(m.last_write_epoch(a, n) <= e);
  // Writes next to the range, in other blocks, leave it alone; one byte of its blocks does not.
  m.write(a - 1, bytes, 1);
  m.write(a + n + kBlock, bytes, 16);
  m.fill(a - kBlock, 7, kBlock);
  CHECK(m.last_write_epoch(a, n) <= e);
  CHECK(m.last_write_epoch(a - 1, 1) > e);
  // A byte outside a range that starts and ends inside blocks counts when it shares a block.
  CHECK(m.last_write_epoch(a + 10, n - 20) <= e);
  m.write(a + n - 5, bytes, 1);
  CHECK(m.last_write_epoch(a + 10, n - 20) > e);
  CHECK(m.last_write_epoch(a, n) > e);
  e = m.advance_write_epoch();
  m.fill(a + kPage / 2, 0, 3);  // zero-filling written memory counts
  CHECK(m.last_write_epoch(a, n) > e);
  e = m.advance_write_epoch();
  m.fill(9 * kPage, 0, kPage);  // zero-filling never-written memory changes nothing
  CHECK(m.last_write_epoch(9 * kPage, kPage) <= e);
  m.discard(a + 2 * kBlock, 1);
  CHECK(m.last_write_epoch(a, n) > e);
  e = m.advance_write_epoch();
  m.discard(3 * kPage, 2 * kPage);  // whole pages released
  CHECK(m.last_write_epoch(a, n) > e);
  // A range in a page table never touched, and one reaching into it.
  CHECK(m.last_write_epoch(4096 * kPage + 10, 100) == 0);
  CHECK(m.last_write_epoch(4095 * kPage, 2 * kPage) == 0);
  // restore stamps exactly the blocks whose bytes it changes (also in pages it releases);
  // clear invalidates everything.
  m.write(a, bytes, 16);
  const DeviceMemory::Snapshot snap = m.snapshot();
  e = m.advance_write_epoch();
  m.restore(snap);  // the same bytes
  CHECK(m.last_write_epoch(0, 40 * kPage) <= e);
  const uint8_t other[1] = {9};
  m.write(a + 3 * kBlock + 1, other, 1);
  m.write(30 * kPage + 7, other, 1);  // a page the snapshot does not have
  e = m.advance_write_epoch();
  m.restore(snap);
  CHECK(m.last_write_epoch(a, 3 * kBlock) <= e);
  CHECK(m.last_write_epoch(a + 3 * kBlock, 1) > e);
  CHECK(m.last_write_epoch(a + 4 * kBlock, n - 4 * kBlock) <= e);
  CHECK(m.last_write_epoch(30 * kPage, 1) > e);
  CHECK(m.last_write_epoch(30 * kPage + kBlock, kPage - kBlock) <= e);
  e = m.advance_write_epoch();
  m.clear();
  CHECK(m.last_write_epoch(20 * kPage, 1) > e);
}
