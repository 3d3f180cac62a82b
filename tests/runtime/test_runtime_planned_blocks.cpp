// A launch's L2 lines filed by the static plan's buffers inside one device block
// (rt::LaunchLabel::planned_blocks, passed as KernelLaunch::planned_blocks and filed by
// MemorySystem::select_l2): its timing does not depend on where the plan put the buffers in the
// block, as a launch's timing does not depend on where the allocator put tensors allocated on
// their own.
#include <catch2/catch.hpp>

#include "sim/simulator.h"
#include "tests/runtime/runtime_test_util.h"

using namespace npusim;

namespace {

// The tiny chip with a write-back L2 of 2 ways of 32 KiB (64 sets of 512-byte lines), smaller
// than the three 48 KiB tensors of the launch: which of z's dirty lines are evicted (written back
// within the launch) depends on which lines share a set, i.e. on the tensors' offsets modulo the
// way.
// Every launch simulated (no replay), so equal timings are the model's, not a replay's.
std::shared_ptr<rt::Device> small_l2_device() {
  SimOptions sim;
  sim.replay = SimOptions::Replay::off;
  sim.replay_translated = false;
  std::shared_ptr<rt::Device> d;
  const rt::Status st = rt::Device::open("tiny",
                                         {"memory.l2.bytes=64 KiB", "memory.l2.ways=2",
                                          "memory.l2.line_bytes=512", "memory.l2.write_back=true"},
                                         sim, rt::RuntimeOptions{}, &d);
  if (!st.ok()) throw std::runtime_error(st.to_string());
  return d;
}

struct Timing {
  uint64_t cycles = 0, counters = 0;  // duration and counter_digest of the launch
  bool operator==(const Timing& o) const { return cycles == o.cycles && counters == o.counters; }
};

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kTensorBytes = 48 * kKiB;  // 24576 f16 elements

// z = x + y with x, y and z at offsets `off` of one block (an arena); with `planned`, the launch
// names the three tensors' buffers as its planned blocks.
Timing vadd_in_block(rt::Device& dev, const std::vector<uint64_t>& off, bool planned) {
  rt::Stream s;
  REQUIRE(dev.create_stream(&s).ok());
  uint64_t block = 0;
  REQUIRE(dev.malloc(256 * kKiB, &block).ok());
  const uint64_t n = kTensorBytes / 2;
  const auto x = test::random_f16(n, 1), y = test::random_f16(n, 2);
  REQUIRE(dev.memcpy_h2d(block + off[0], x.data(), kTensorBytes).ok());
  REQUIRE(dev.memcpy_h2d(block + off[1], y.data(), kTensorBytes).ok());
  auto label = std::make_shared<rt::LaunchLabel>();
  label->op_name = "vadd";
  label->op_type = "AddV2";
  if (planned)
    for (uint64_t o : off) label->planned_blocks.push_back({block + o, kTensorBytes});
  static const auto vadd = test::load_kernel("kernels/vadd_f16.s");
  const size_t before = dev.launch_records().size();
  const rt::Status st =
      dev.launch_kernel(s, vadd, {block + off[0], block + off[1], block + off[2], n}, 2, label);
  INFO(st.to_string());
  REQUIRE(st.ok());
  REQUIRE(dev.synchronize_stream(s).ok());
  std::vector<uint16_t> z(n);
  REQUIRE(dev.memcpy_d2h(z.data(), block + off[2], kTensorBytes).ok());
  CHECK(z == test::reference_add_f16(x, y));
  const std::vector<rt::LaunchRecord> records = dev.launch_records();
  REQUIRE(records.size() == before + 1);
  REQUIRE(records.back().ok);
  REQUIRE(dev.free(block).ok());
  REQUIRE(dev.destroy_stream(s).ok());
  return {records.back().cycles, counter_digest(records.back().counter_delta)};
}

}  // namespace

TEST_CASE("planned blocks: a launch's timing does not depend on where the plan put its buffers") {
  auto dev = small_l2_device();
  // Offsets a multiple of the way (32 KiB) apart: each tensor's lines i fall in one set; packed
  // one after another (48 KiB each): y's lines are shifted by half a way against x's and z's.
  const std::vector<uint64_t> same_sets{0, 64 * kKiB, 128 * kKiB};
  const std::vector<uint64_t> packed{0, 48 * kKiB, 96 * kKiB};
  const std::vector<uint64_t> shuffled{192 * kKiB, 0, 80 * kKiB};
  // Filed by the whole block, the layout shows.
  const Timing by_block_same = vadd_in_block(*dev, same_sets, false);
  const Timing by_block_packed = vadd_in_block(*dev, packed, false);
  CHECK_FALSE(by_block_same == by_block_packed);
  // Filed by the planned buffers, every layout times as the packed one (the buffers are packed
  // in the order the launch first touches them, whatever their offsets in the block).
  const Timing planned_same = vadd_in_block(*dev, same_sets, true);
  const Timing planned_packed = vadd_in_block(*dev, packed, true);
  const Timing planned_shuffled = vadd_in_block(*dev, shuffled, true);
  CHECK(planned_same == planned_packed);
  CHECK(planned_shuffled == planned_packed);
  CHECK(planned_packed == by_block_packed);
}
