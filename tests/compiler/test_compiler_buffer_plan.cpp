// BufferPlan: fit() picks the largest tile whose allocation succeeds (checked against real
// KernelBuilder::alloc calls, tile by tile), allocate() lays buffers out as extent() says, and
// disabled / two-copy / stepwise buffers count as declared.
#include <catch2/catch.hpp>

#include "adapter/compiler/buffer_plan.h"
#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"

using namespace npusim;
using namespace npusim::compiler;

namespace {

const ChipConfig& tiny() {
  static const ChipConfig cfg = load_chip_config("tiny");
  return cfg;
}

// Whether allocating `plan` at `units` succeeds on a fresh vector core after `before` bytes.
bool allocates(const BufferPlan& plan, int64_t units, uint64_t before) {
  KernelBuilder b("k", "PlanTest", tiny());
  b.begin_section(b.vector_core_kind());
  if (before) b.alloc(plan.buf(), before, "earlier");
  try {
    plan.allocate(b, units);
    return true;
  } catch (const CompileError&) {
    return false;
  }
}

BufferPlan example_plan() {
  BufferPlan p;
  p.add("input", 2.0, 0, 2);           // f16 tile, ping / pong
  p.add("widened", 4.0, 0, 1, false);  // disabled: takes nothing
  p.add("bits", 1.0 / 8, 0);           // one bit per unit
  p.add_fixed("constants", 256);
  p.add_sized("scratch", [](int64_t u) { return static_cast<uint64_t>((u + 15) / 16 * 96); });
  p.add("output", 4.0, 32, 2);
  return p;
}

}  // namespace

TEST_CASE("fit is the largest granule multiple whose allocation succeeds") {
  const BufferPlan plan = example_plan();
  KernelBuilder probe("k", "PlanTest", tiny());
  probe.begin_section(probe.vector_core_kind());
  const uint64_t cap = probe.free_bytes(isa::Buf::UB);
  for (uint64_t before : {uint64_t{0}, uint64_t{40}, uint64_t{1000}}) {
    for (int64_t granule : {int64_t{1}, int64_t{64}, int64_t{128}, int64_t{96}}) {
      KernelBuilder b("k", "PlanTest", tiny());
      b.begin_section(b.vector_core_kind());
      if (before) b.alloc(isa::Buf::UB, before, "earlier");
      const int64_t max_units = static_cast<int64_t>(cap);  // far beyond what fits
      const int64_t t = plan.fit(b, granule, max_units);
      INFO("before " << before << " granule " << granule << " tile " << t);
      REQUIRE(t % granule == 0);
      REQUIRE(t > 0);
      CHECK(allocates(plan, t, before));
      CHECK_FALSE(allocates(plan, t + granule, before));
    }
  }
}

TEST_CASE("fit respects max_units and reports 0 when nothing fits") {
  BufferPlan plan;
  plan.add("rows", 64.0);
  CHECK(plan.fit(tiny(), isa::CoreKind::AIV, 8, 20) == 16);  // max 20 -> the multiple of 8 below
  BufferPlan huge;
  huge.add_fixed("too big", uint64_t{1} << 40);
  CHECK(huge.fit(tiny(), isa::CoreKind::AIV, 1, 1000) == 0);
}

TEST_CASE("allocate lays the buffers out as extent says, copies apart, disabled at 0") {
  const BufferPlan plan = example_plan();
  KernelBuilder b("k", "PlanTest", tiny());
  b.begin_section(b.vector_core_kind());
  const int64_t units = 256;
  const BufferPlan::Placed at = plan.allocate(b, units);
  const uint64_t a = b.alignment(isa::Buf::UB);
  CHECK(at.twin(0)[0] == 0);
  CHECK(at.twin(0)[1] == (512 + a - 1) / a * a);  // 256 f16 per copy
  CHECK(at[1] == 0);                              // disabled
  CHECK(plan.bytes(2, units) == 32);              // 256 bits
  CHECK(at.twin(3)[0] == at.twin(3)[1]);          // one copy: both parities name it
  CHECK(plan.bytes(4, 17) == 192);                // the step function as given
  // input x2, bits, constants, scratch, output x2; at 0 units only the fixed bytes remain:
  // constants, output x2 (32 bytes each)
  CHECK(plan.allocations(units) == 7);
  CHECK(plan.allocations(0) == 3);
  const uint64_t end = at.twin(5)[1] + plan.bytes(5, units);
  CHECK(plan.extent(units, a) == end);
  CHECK(b.free_bytes(isa::Buf::UB) == b.core().capacity(isa::Buf::UB) - (end + a - 1) / a * a);
}

TEST_CASE("placed buffers start at their offset modulo the period, as extent says") {
  // f32 tiles that would all start at the same offset modulo 2048 (4 KiB each) placed in
  // windows 0, 3 and 5 of 256 bytes, the middle one two copies; a fixed buffer between them
  // moves the layout off its windows.
  BufferPlan plan;
  const uint64_t period = 2048, window = 256;
  plan.add("f0", 4.0);
  plan.add_fixed("odd", 100);
  plan.add("f1", 4.0, 0, 2);
  plan.add("f2", 4.0);
  plan.place(0, period, 0);
  plan.place(2, period, 3 * window);
  plan.place(3, period, 5 * window);
  CHECK(plan.has_placed());
  KernelBuilder b("k", "PlanTest", tiny());
  b.begin_section(b.vector_core_kind());
  b.alloc(isa::Buf::UB, 40, "earlier");  // the plan starts off a window
  const uint64_t a = b.alignment(isa::Buf::UB);
  const int64_t units = 1024;
  const BufferPlan::Placed at = plan.allocate(b, units);
  CHECK(at[0] % period == 0);
  CHECK(at.twin(2)[0] % period == 3 * window);
  CHECK(at.twin(2)[1] % period == 3 * window);
  CHECK(at[3] % period == 5 * window);
  CHECK(at[1] >= at[0] + 4 * units);  // the unplaced buffer follows f0 as it comes
  CHECK(at[1] < at[0] + 4 * units + a);
  const uint64_t end = at[3] + plan.bytes(3, units);
  CHECK(plan.extent(units, a, 40) == end);
  CHECK(allocates(plan, plan.fit(tiny(), isa::CoreKind::AIV, 128, 1 << 20), 0));
  CHECK_THROWS_AS(plan.place(1, period, period), Error);
}
