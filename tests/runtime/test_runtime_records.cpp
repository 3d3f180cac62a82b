// The runtime's profiling records on the tiny chip: a launch's label and program reach its
// LaunchRecord; copies and fills get CopyRecords on the device timeline; an observer attached with
// add_observer sees the launches in simulator time (LaunchRecord::sim_start_cycle).
#include <catch2/catch.hpp>

#include <cmath>

#include "sim/counters/observer.h"
#include "tests/runtime/runtime_test_util.h"

using namespace npusim;

namespace {

// Counts launches and remembers their begin times (simulator ps).
class LaunchWatcher : public ChipObserver {
 public:
  std::vector<uint64_t> begins;
  uint64_t instructions = 0;
  void on_core(int, const std::string&) override {}
  void on_kernel_begin(const isa::Program&, int, uint64_t t_ps) override { begins.push_back(t_ps); }
  void on_kernel_end(const isa::Program&, uint64_t, bool) override {}
  void on_instruction(int, Lane, uint64_t, uint64_t, uint32_t, const isa::Instruction&,
                      const isa::Section&) override {
    ++instructions;
  }
  void on_flow_begin(int, Lane, uint64_t, uint64_t) override {}
  void on_flow_end(int, Lane, uint64_t, uint64_t) override {}
  void on_hdc(bool, uint64_t, uint64_t, uint64_t) override {}
};

}  // namespace

TEST_CASE("records: labels, copies on the device timeline, observers in simulator time") {
  auto dev = test::tiny_device();
  auto vadd = test::load_kernel("kernels/vadd_f16.s");
  rt::Stream s;
  REQUIRE(dev->create_stream(&s).ok());
  dev->clear_launch_records();
  const uint64_t n = 256, bytes = n * 2;
  auto x = test::random_f16(n, 1);
  std::vector<uint16_t> z(n);
  uint64_t dx = 0, dz = 0;
  REQUIRE(dev->malloc(bytes, &dx).ok());
  REQUIRE(dev->malloc(bytes, &dz).ok());
  LaunchWatcher watcher;
  REQUIRE(dev->add_observer(&watcher).ok());

  auto label = std::make_shared<rt::LaunchLabel>();
  label->op_name = "model/add";
  label->op_type = "AddV2";
  label->outputs = {{{int64_t(n)}, "DT_FLOAT16"}};
  label->dispatch = 42;
  REQUIRE(dev->memcpy_h2d_async(s, dx, x.data(), bytes).ok());
  REQUIRE(dev->memset8_async(s, dz, 0, bytes).ok());  // timed by the runtime's HBM model
  REQUIRE(dev->launch_kernel(s, vadd, {dx, dx, dz, n}, 1, label).ok());
  REQUIRE(dev->launch_kernel(s, vadd, {dx, dx, dz, n}, 1).ok());  // unlabelled
  REQUIRE(dev->memcpy_d2h_async(s, z.data(), dz, bytes).ok());
  REQUIRE(dev->synchronize_stream(s).ok());
  REQUIRE(dev->remove_observer(&watcher).ok());

  const std::vector<rt::LaunchRecord> launches = dev->launch_records();
  REQUIRE(launches.size() == 2);
  REQUIRE(launches[0].label);
  CHECK(launches[0].label->op_name == "model/add");
  CHECK(launches[0].label->op_type == "AddV2");
  CHECK(launches[0].label->dispatch == 42);
  CHECK(launches[0].program == vadd);
  CHECK_FALSE(launches[1].label);

  const std::vector<rt::CopyRecord> copies = dev->copy_records();
  REQUIRE(copies.size() == 3);
  CHECK(copies[0].kind == rt::OpKind::memcpy_h2d);
  CHECK(copies[1].kind == rt::OpKind::memset8);
  CHECK(copies[2].kind == rt::OpKind::memcpy_d2h);
  for (const rt::CopyRecord& c : copies) {
    CHECK(c.bytes == bytes);
    CHECK(c.stream == s.id);
    CHECK(c.cycles > 0);
  }
  // One operation at a time, in stream order: h2d, memset, launch, launch, d2h (starts are
  // rounded down and durations up to whole cycles: an end may pass the next start by one).
  CHECK(copies[1].start_cycle + 1 >= copies[0].start_cycle + copies[0].cycles);
  CHECK(launches[0].start_cycle + 1 >= copies[1].start_cycle + copies[1].cycles);
  CHECK(launches[1].start_cycle >= launches[0].start_cycle + launches[0].cycles - 1);
  CHECK(copies[2].start_cycle + 1 >= launches[1].start_cycle + launches[1].cycles);
  // The memset's time and the labelled launch's host dispatch (LaunchLabel::host_dispatch is
  // eager_op unless set: host.op_dispatch_us) are on the device timeline but not the
  // simulator's (the only such ops of this process): launches after them start that much later
  // than the simulator's clock says. The unlabelled launch pays no host dispatch.
  const ChipConfig& cfg = dev->config();
  const auto host = static_cast<uint64_t>(std::llround(cfg.host_op_dispatch_us * cfg.clock_mhz));
  CHECK(launches[0].host_dispatch_cycles == host);
  CHECK(launches[1].host_dispatch_cycles == 0);
  CHECK(launches[0].start_cycle + 1 >= copies[1].start_cycle + copies[1].cycles + host);
  for (const rt::LaunchRecord& r : launches)
    CHECK(r.start_cycle - r.sim_start_cycle == copies[1].cycles + host);
  // The observer saw both launches, at their simulator start.
  REQUIRE(watcher.begins.size() == 2);
  CHECK(watcher.begins[0] / 1000 == launches[0].sim_start_cycle);
  CHECK(watcher.begins[1] / 1000 == launches[1].sim_start_cycle);
  CHECK(watcher.instructions > 0);

  dev->clear_launch_records();
  CHECK(dev->launch_records().empty());
  CHECK(dev->copy_records().empty());
  CHECK(dev->add_observer(nullptr).code() == rt::StatusCode::invalid_argument);
  for (uint64_t a : {dx, dz}) REQUIRE(dev->free(a).ok());
  REQUIRE(dev->destroy_stream(s).ok());
}
