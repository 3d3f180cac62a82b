// Concurrent launches with a write-back L2 (Simulator::run_concurrent, docs/chip_model.md
// "Concurrent launches"): a launch ends when the write-back flows of the lines its own cores'
// transfers evicted have drained, not those of the launch beside it. Config as
// test_sim_l2_write_back.cpp: tiny at 1000 MHz, HBM 48 B/cycle, write-back L2, writes that
// evict not waiting for the write-back.
#include <catch2/catch.hpp>

#include <string>

#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::counter;
using npusim::test::kernel_launch;

namespace {

Simulator& sim() {
  static Simulator s(
      load_chip_config("tiny", {"clock_mhz=1000", "memory.hbm.gbps=48", "memory.l2.write_back=true",
                                "memory.l2.write_back_waits=false"}),
      SimOptions{});
  return s;
}

// Bytes between two addresses of the same L2 set: sets x line bytes.
uint64_t set_stride() {
  const ChipConfig& c = sim().config();
  return c.l2_bytes / (static_cast<uint64_t>(c.l2_ways) * c.l2_line_bytes) * c.l2_line_bytes;
}

// `dst` <- UB: 16 runs of `lines` consecutive lines a set stride apart, filling the sets of
// `lines` lines from dst's (16 ways) when they start empty.
std::string write_sets(const std::string& dst, int lines) {
  const uint64_t gap_blocks = (set_stride() - 512 * static_cast<uint64_t>(lines)) / 32;
  return "    copy_ub2gm " + dst + ", x2, 16, " + std::to_string(16 * lines) + ", 0, " +
         std::to_string(gap_blocks) + "\n";
}

}  // namespace

TEST_CASE("each launch ends after its own cores' write-backs, not the other launch's") {
  // Launch 0 fills 16 sets with dirty lines, then writes 16 x 16 new lines into them: its
  // 131072 bytes of write-back drain at 48 B/cycle long after its last block (see
  // test_sim_l2_write_back.cpp). Launch 1 on another core runs one scalar instruction.
  const uint64_t base = 0x1000000;
  isa::Program evict = isa::assemble(
      ".arg a\n.section aiv\n    ldarg x1, a\n    movi x2, 0\n"
      "    movi x4, " +
          std::to_string(base + 16 * set_stride()) + "\n" + write_sets("x1", 16) +
          write_sets("x4", 16) + "    end\n",
      "evict.s");
  isa::Program nop = isa::assemble(".section aiv\n    nop\n    end\n", "nop.s");
  KernelResult evict_alone = sim().run(kernel_launch(evict, {base}, 1));
  KernelResult nop_alone = sim().run(kernel_launch(nop, {}, 1));
  REQUIRE(evict_alone.ok);
  REQUIRE(nop_alone.ok);
  REQUIRE(counter(evict_alone.counters, "chip.l2.writeback_bytes") == 16 * 16 * 512);
  REQUIRE(nop_alone.cycles == test::task_overhead(sim().config()) + 1);
  ConcurrentResult g = sim().run_concurrent(
      {{kernel_launch(evict, {base}, 1), {"aiv0"}}, {kernel_launch(nop, {}, 1), {"aiv1"}}});
  REQUIRE(g.launches[0].ok);
  REQUIRE(g.launches[1].ok);
  // The nop launch does no GM traffic: each launch takes its time alone, the nop's end not
  // moved to the other's write-back drain.
  CHECK(g.launches[0].cycles == evict_alone.cycles);
  CHECK(g.launches[1].cycles == nop_alone.cycles);
  CHECK(g.cycles == evict_alone.cycles);
  CHECK(counter(g.counters.tree(), "chip.l2.writeback_bytes") == 16 * 16 * 512);
}
