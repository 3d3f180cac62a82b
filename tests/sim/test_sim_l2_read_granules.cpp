// Read granules of the L2 (memory.l2.read_granule_bytes = G): a read range takes the L2's shared
// bandwidth in whole G-byte granules, aligned to G, while the core's port moves only the bytes
// asked for. N cores reading short bursts of lines of their own, all in the L2, each move at
// min(port, (L2 / N) / f), f = the granules' bytes over the bytes read; a core alone, or whole
// aligned granules, move at min(port, L2 / N) as without the key. Each expectation is derived
// from the config; the short bursts' fail without the mechanism ((L2 / N) / f is below the
// port's rate). One Simulator per process, hence a file of its own.
#include <catch2/catch.hpp>

#include <algorithm>
#include <string>

#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::counter;
using npusim::test::launch;
using npusim::test::per_core_counter;

namespace {
constexpr uint64_t kSrc = 0x200000;  // 512-byte aligned GM
constexpr uint64_t kBursts = 256;    // bursts per copy (a copy of whole granules: 128 KiB of UB)
constexpr uint64_t kPitch = 512;     // GM bytes from one burst's start to the next's
constexpr uint64_t kCoreSpan = kBursts * kPitch;  // each core's GM range: lines of its own

// One copy_gm2ub per block of kBursts bursts of `blocks32` 32-byte blocks, kPitch apart, block
// b's from kSrc + offset + b x kCoreSpan.
isa::Program reader(uint64_t blocks32) {
  const uint64_t gap = kPitch / 32 - blocks32;
  return isa::assemble(
      ".arg src\n.arg offset\n.section aiv\n"
      "    ldarg x1, src\n    ldarg x4, offset\n    add x1, x1, x4\n    get_block_id x3\n"
      "    movi x5, " +
          std::to_string(kCoreSpan) +
          "\n    mul x3, x3, x5\n    add x1, x1, x3\n"
          "    movi x2, 0\n    copy_gm2ub x2, x1, " +
          std::to_string(kBursts) + ", " + std::to_string(blocks32) + ", " + std::to_string(gap) +
          ", 0\n    end\n",
      "read_granules.s");
}

// MTE2 busy cycles of each of `blocks` vector cores reading as reader(blocks32) says from
// kSrc + offset, on an L2 that holds every line (kept across launches, filled by a first launch
// of whole lines over the spans of kFillCores cores).
constexpr int kFillCores = 4;
std::vector<double> mte2_busy(Simulator& s, int blocks, uint64_t blocks32, uint64_t offset) {
  static const isa::Program fill = reader(kPitch / 32);  // every line of each span, whole
  REQUIRE(blocks < kFillCores + (offset == 0 ? 1 : 0));  // what the cores read is filled
  REQUIRE(launch(s, fill, {kSrc, 0}, kFillCores).ok);
  const isa::Program p = reader(blocks32);
  KernelResult r = launch(s, p, {kSrc, offset}, blocks);
  REQUIRE(r.ok);
  REQUIRE(counter(r.counters, "chip.l2.misses") == 0);
  return per_core_counter(r.counters, "aiv", blocks, "mte2.busy_cycles");
}
}  // namespace

TEST_CASE("L2 read granules: short bursts take the L2's bandwidth in whole granules") {
  static Simulator s(load_chip_config("tiny", {"memory.l2.keep_across_launches=true",
                                               "memory.l2.read_granule_bytes=512"}),
                     SimOptions{});
  const ChipConfig& c = s.config();
  const double port = c.l2_read_bytes_per_cycle, l2 = c.l2_bytes_per_cycle();
  const double g = static_cast<double>(c.l2_read_granule_bytes);
  REQUIRE(g == kPitch);  // one burst a granule (or two where it straddles one)
  REQUIRE(c.core_kind(isa::CoreKind::AIV) != nullptr);
  REQUIRE(c.core_kind(isa::CoreKind::AIV)->count >= 4);
  // n cores at once reading `bytes` each, whose ranges touch `granules` granules in all.
  const auto expected = [&](int n, double bytes, double granules) {
    return bytes / std::min(port, l2 / n / (granules * g / bytes));
  };

  SECTION("one core alone, 64-byte bursts: the port's rate") {
    const double bytes = kBursts * 64.0;
    REQUIRE(l2 / (g / 64) > port);  // its granules are within the L2's rate
    for (double b : mte2_busy(s, 1, 2, 0))
      CHECK(b == Approx(expected(1, bytes, kBursts)).margin(1));
  }
  SECTION("4 cores, whole aligned granules: the L2's share, as without the key") {
    const double bytes = kBursts * g;
    for (double b : mte2_busy(s, 4, kPitch / 32, 0))
      CHECK(b == Approx(expected(4, bytes, kBursts)).margin(1));
  }
  SECTION("4 cores, 64-byte bursts: a granule each, (L2 / 4) / 8") {
    const double bytes = kBursts * 64.0;
    REQUIRE(l2 / 4 / (g / 64) < port);  // slower than without the key
    for (double b : mte2_busy(s, 4, 2, 0)) CHECK(b == Approx(bytes * 4 * (g / 64) / l2).margin(1));
  }
  SECTION("3 cores, 64-byte bursts across granule boundaries: two granules each") {
    const double bytes = kBursts * 64.0;
    // Each burst starts 32 bytes before a granule's end; the last one reaches past the span
    // into the next core's first granule, in the L2 too (filled for a fourth core).
    const uint64_t offset = kPitch - 32;
    REQUIRE(l2 / 3 / (2 * g / 64) < port);
    std::vector<double> busy = mte2_busy(s, 3, 2, offset);
    for (double b : busy) CHECK(b == Approx(expected(3, bytes, 2.0 * kBursts)).margin(1));
  }
}
