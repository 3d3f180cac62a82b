// Same-line serialisation in the L2 (memory.l2.line_read_bytes_per_cycle = R): a line serves
// the reads of it one after another at R bytes per cycle, so N cores reading the same lines at
// once each move at min(port, L2 / N, R / N), and a core alone, or N cores reading lines of
// their own, at min(port, L2 / N) as without the key. Each expectation is derived from the
// config; the shared reads' fails without the mechanism (R / N is below the port's rate).
// One Simulator per process, hence a file of its own.
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
constexpr uint64_t kBytes = 8192;    // each core's read: 16 KiB-aligned, whole lines

// A read of kBytes (one contiguous copy_gm2ub) by every block, block b from kSrc + (b / group)
// x kBytes: blocks in one group of `group` read the same lines.
const isa::Program& reader() {
  static const isa::Program p = isa::assemble(
      ".arg src\n.arg group\n.section aiv\n"
      "    ldarg x1, src\n    ldarg x4, group\n    get_block_id x3\n    div x3, x3, x4\n"
      "    movi x5, " +
          std::to_string(kBytes) +
          "\n    mul x3, x3, x5\n    add x1, x1, x3\n"
          "    movi x2, 0\n    copy_gm2ub x2, x1, 1, " +
          std::to_string(kBytes / 32) + ", 0, 0\n    end\n",
      "line_reads.s");
  return p;
}

// MTE2 busy cycles of each of `blocks` vector cores reading as reader() says, on an L2 that
// holds every line (kept across launches, filled by a first launch reading them apart).
std::vector<double> mte2_busy(Simulator& s, int blocks, int group) {
  REQUIRE(launch(s, reader(), {kSrc, 1}, 4).ok);  // the 4 ranges, one core each: now in the L2
  KernelResult r = launch(s, reader(), {kSrc, static_cast<uint64_t>(group)}, blocks);
  REQUIRE(r.ok);
  REQUIRE(counter(r.counters, "chip.l2.misses") == 0);
  return per_core_counter(r.counters, "aiv", blocks, "mte2.busy_cycles");
}
}  // namespace

TEST_CASE("L2 same-line serialisation: N readers of one line share its read rate") {
  static Simulator s(load_chip_config("tiny", {"memory.l2.keep_across_launches=true",
                                               "memory.l2.line_read_bytes_per_cycle=200"}),
                     SimOptions{});
  const ChipConfig& c = s.config();
  const double port = c.l2_read_bytes_per_cycle, l2 = c.l2_bytes_per_cycle(),
               line = c.l2_line_read_bytes_per_cycle;
  REQUIRE(c.core_kind(isa::CoreKind::AIV) != nullptr);
  REQUIRE(c.core_kind(isa::CoreKind::AIV)->count >= 4);
  REQUIRE(line > port);  // a core alone is not held back by its line
  // n cores at once, each its bytes over its share: k readers of each of its lines.
  const auto expected = [&](int n, int k) { return kBytes / std::min({port, l2 / n, line / k}); };

  SECTION("one core alone: the port's rate") {
    for (double b : mte2_busy(s, 1, 1)) CHECK(b == Approx(expected(1, 1)).margin(1));
  }
  SECTION("4 cores, lines of their own: the port's rate") {
    for (double b : mte2_busy(s, 4, 1)) CHECK(b == Approx(expected(4, 1)).margin(1));
  }
  SECTION("2 pairs of cores, each pair one range: R / 2 each") {
    REQUIRE(line / 2 < port);  // slower than without the key
    for (double b : mte2_busy(s, 4, 2)) CHECK(b == Approx(expected(4, 2)).margin(1));
  }
  SECTION("4 cores, the same lines: R / 4 each, the line's reads one after another") {
    REQUIRE(line / 4 < std::min(port, l2 / 4));
    const double serial = 4 * kBytes / line;  // the 4 reads of every line in turn
    REQUIRE(expected(4, 4) == Approx(serial));
    for (double b : mte2_busy(s, 4, 4)) CHECK(b == Approx(serial).margin(1));
  }
}
