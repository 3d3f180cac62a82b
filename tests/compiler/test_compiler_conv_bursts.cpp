// A convolution's feature-map load by whole pixels (SlabEmitter::Geometry::whole_pixels): the
// GM bursts its nd2nz issues, derived from the slab's bytes and rows, on a chip whose DMA
// prices each burst (mte.burst_cycles). One Simulator per process, hence a file of its own.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "sim/counters/observer.h"
#include "tests/compiler/compiler_test_util.h"
#include "tests/compiler/conv_reference.h"

using namespace npusim;
using namespace npusim::test;
using namespace npusim::test::conv;
using compiler::DataType;

namespace {
// The MTE2 cycles of every nd2nz whose src_stride is the immediate `pitch` (the slab's: x's
// channels; B's and dy's rows are other pitches in the cases below), per core.
struct SlabLoadTimes : ChipObserver {
  int64_t pitch = 0;
  std::vector<double> cycles;
  void on_core(int, const std::string&) override {}
  void on_kernel_begin(const isa::Program&, int, uint64_t) override {}
  void on_kernel_end(const isa::Program&, uint64_t, bool) override {}
  void on_instruction(int, Lane lane, uint64_t start, uint64_t end, uint32_t,
                      const isa::Instruction& in, const isa::Section&) override {
    if (lane != Lane::MTE2 || in.op != isa::Opcode::op_nd2nz) return;
    const isa::Operand& stride =
        in.ops[static_cast<size_t>(isa::field_index(isa::Opcode::op_nd2nz, "src_stride"))];
    if (!stride.is_reg && stride.value == pitch)
      cycles.push_back(static_cast<double>(end - start) / 1000.0);
  }
  void on_flow_begin(int, Lane, uint64_t, uint64_t) override {}
  void on_flow_end(int, Lane, uint64_t, uint64_t) override {}
  void on_hdc(bool, uint64_t, uint64_t, uint64_t) override {}
};
}  // namespace

TEST_CASE("A dense slab by whole pixels: bytes / 512 + rows GM bursts at most") {
  // On a chip whose DMA spends 1000 cycles a GM burst (mte.burst_cycles; no per-copy cost)
  // the planner takes whole pixels by its estimate, and the slab's nd2nz holds MTE2 for its
  // bursts x 1000 cycles (its data takes a few hundred). One image of 8 x 8 pixels of C
  // channels of 2 bytes, a 1x1 window: the slab is one contiguous run of 64 x 2C bytes from
  // x's 512-byte-aligned start, 2C / 8 bursts, and at most bytes / 512 + rows (8) wherever a
  // slab starts; per plane it would be 64 bursts a plane (C / 16 planes).
  static Simulator sim(
      load_chip_config(test_chip_name(), {"mte.copy_issue_cycles=0", "mte.burst_cycles=1000"}),
      SimOptions{});
  const ChipConfig& cfg = sim.config();
  for (int64_t c : {64, 40}) {
    INFO("channels " << c);
    const ConvCase cc{1, 8, 8, c, 1, 1, 16};
    HostTensor x = random_tensor(DataType::F16, {1, 8, 8, c}, -2, 2, 313);
    HostTensor f = random_tensor(DataType::F16, {1, 1, c, 16}, -1, 1, 314);
    const compiler::CompiledKernel k =
        compiler::compile(make_op("Conv2D", {x.desc, f.desc}, cc.attrs()), cfg);
    summarize(k);
    bool whole = false;
    for (const compiler::Launch& l : k.launches)
      whole = whole || l.summary.find("by whole pixels") != std::string::npos;
    REQUIRE(whole);
    SlabLoadTimes times;
    times.pitch = c;
    sim.add_observer(&times);
    run_compiled(sim, k, {x, f});
    sim.remove_observer(&times);
    // (the tiny chip may split the 64 positions into a tile per core: the bounds hold for the
    // slabs' sums)
    REQUIRE(!times.cycles.empty());
    const double bytes = 64.0 * 2 * static_cast<double>(c);
    double bursts = 0;
    for (double t : times.cycles) bursts += t / 1000;
    CHECK(bursts >= std::ceil(bytes / 512) - 0.5);
    CHECK(bursts <= bytes / 512 + 8 + 1);                       // + 1: the data's own cycles
    CHECK(bursts < 64.0 * static_cast<double>((c + 15) / 16));  // per plane's count
  }
}
