// Host dispatch (docs/runtime.md, "Host dispatch"): a labelled launch pays its op's host
// dispatch on the device timeline before it runs, once per LaunchLabel::dispatch value:
// host.op_dispatch_us for an eager op, host.graph_dispatch_us for a graph run, nothing for
// HostDispatch::none or an unlabelled launch. On tiny with the two keys set apart, so that the
// test tells them apart.
#include <catch2/catch.hpp>

#include <cmath>
#include <memory>
#include <vector>

#include "tests/runtime/runtime_test_util.h"

using namespace npusim;
using HostDispatch = rt::LaunchLabel::HostDispatch;

namespace {

std::shared_ptr<const rt::LaunchLabel> label(uint64_t dispatch, HostDispatch kind) {
  auto l = std::make_shared<rt::LaunchLabel>();
  l->op_name = "op";
  l->op_type = "Op";
  l->dispatch = dispatch;
  l->host_dispatch = kind;
  return l;
}

}  // namespace

TEST_CASE("host dispatch: eager ops and graph runs pay it once per dispatch, before the launch") {
  std::shared_ptr<rt::Device> dev;
  REQUIRE(rt::Device::open("tiny", {"host.op_dispatch_us=20", "host.graph_dispatch_us=50"},
                           SimOptions{}, rt::RuntimeOptions{}, &dev)
              .ok());
  const ChipConfig& cfg = dev->config();
  auto cycles = [&](double us) { return static_cast<uint64_t>(std::llround(us * cfg.clock_mhz)); };
  const uint64_t op = cycles(20), graph = cycles(50);
  REQUIRE(op != graph);

  auto vadd = test::load_kernel("kernels/vadd_f16.s");
  const uint64_t n = 256, bytes = n * 2;
  uint64_t dx = 0, dz = 0;
  REQUIRE(dev->malloc(bytes, &dx).ok());
  REQUIRE(dev->malloc(bytes, &dz).ok());
  rt::Stream s;
  REQUIRE(dev->create_stream(&s).ok());
  dev->clear_launch_records();

  // (label or null, the host dispatch it pays)
  const std::vector<std::pair<std::shared_ptr<const rt::LaunchLabel>, uint64_t>> launches = {
      {label(7, HostDispatch::eager_op), op},  // an eager op's first launch
      {label(7, HostDispatch::eager_op), 0},   // its second launch: the op paid already
      {label(0, HostDispatch::eager_op), op},  // dispatch 0: every launch pays
      {label(0, HostDispatch::eager_op), op},
      {label(100, HostDispatch::graph), graph},  // a graph run: once for all its launches
      {label(100, HostDispatch::graph), 0},
      {label(100, HostDispatch::graph), 0},
      {label(8, HostDispatch::none), 0},
      {nullptr, 0},  // unlabelled (raw runtime use)
      {label(9, HostDispatch::eager_op), op},
      {label(10, HostDispatch::eager_op), op},  // another op's launch in between (streams
      {label(9, HostDispatch::eager_op), 0},    // interleave): op 9 has paid already
  };
  for (const auto& [l, paid] : launches)
    REQUIRE(dev->launch_kernel(s, vadd, {dx, dx, dz, n}, 1, l).ok());
  REQUIRE(dev->synchronize_stream(s).ok());

  const std::vector<rt::LaunchRecord> recs = dev->launch_records();
  REQUIRE(recs.size() == launches.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    INFO("launch " << i);
    CHECK(recs[i].host_dispatch_cycles == launches[i].second);
    // The device idles while the host dispatches: the launch starts that long after the one
    // before it ended; its own duration does not include it.
    if (i > 0)
      CHECK(recs[i].start_cycle ==
            recs[i - 1].start_cycle + recs[i - 1].cycles + launches[i].second);
    CHECK(recs[i].cycles == recs[0].cycles);
  }
  REQUIRE(dev->destroy_stream(s).ok());
  for (uint64_t a : {dx, dz}) REQUIRE(dev->free(a).ok());
}
