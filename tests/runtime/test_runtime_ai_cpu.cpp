// The AI CPU timeline (docs/runtime.md, "The AI CPU timeline"): an AI CPU task runs beside the
// AI cores. It starts when its stream is ready, takes the cycles its cost model derives from the
// chip config's ai_cpu section, does not hold the stream's next kernel, and a kernel or copy that
// reads its output starts no earlier than its end. On tiny with an ai_cpu section set in its
// config (tiny models none).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "adapter/runtime/ai_cpu.h"
#include "tests/runtime/runtime_test_util.h"

using namespace npusim;

namespace {

constexpr int kCores = 4;
constexpr double kAiCpuMhz = 2000, kTaskUs = 30, kCyclesPer128 = 64;

std::shared_ptr<rt::Device> device() {
  static std::shared_ptr<rt::Device> dev = [] {
    std::shared_ptr<rt::Device> d;
    rt::RuntimeOptions ro;
    ro.record_launches = true;
    ChipConfig cfg = load_chip_config("tiny");
    cfg.ai_cpu_cores = kCores;
    cfg.ai_cpu_clock_mhz = kAiCpuMhz;
    cfg.ai_cpu_task_us = kTaskUs;
    cfg.ai_cpu_gen_mask_cycles_per_128_bits = kCyclesPer128;
    const rt::Status st = rt::Device::open(cfg, SimOptions{}, ro, &d);
    if (!st.ok()) throw std::runtime_error("cannot open tiny with an AI CPU: " + st.to_string());
    return d;
  }();
  return dev;
}

}  // namespace

TEST_CASE("gen_mask_cycles: the task overhead plus the busiest core's 128-bit units") {
  const ChipConfig& cfg = device()->config();
  REQUIRE(cfg.ai_cpu_cores == kCores);
  // 1000 elements: 8 units of 128 bits over 4 cores, 2 units on each; 1025: 9 units, 3 on one.
  auto expect = [&](uint64_t units_per_core) {
    return static_cast<uint64_t>(std::ceil(
        kTaskUs * cfg.clock_mhz + units_per_core * kCyclesPer128 * cfg.clock_mhz / kAiCpuMhz));
  };
  CHECK(rt::gen_mask_cycles(cfg, 0) == expect(0));
  CHECK(rt::gen_mask_cycles(cfg, 1000) == expect(2));
  CHECK(rt::gen_mask_cycles(cfg, 1024) == expect(2));
  CHECK(rt::gen_mask_cycles(cfg, 1025) == expect(3));
}

TEST_CASE("an AI CPU task overlaps the stream's kernels; its reader waits for its end") {
  auto dev = device();
  auto vadd = test::load_kernel("kernels/vadd_f16.s");
  const uint64_t n = 256, bytes = n * 2;
  uint64_t dx = 0, dz = 0, mask = 0;
  REQUIRE(dev->malloc(bytes, &dx).ok());
  REQUIRE(dev->malloc(bytes, &dz).ok());
  REQUIRE(dev->malloc(bytes, &mask).ok());
  rt::Stream s;
  REQUIRE(dev->create_stream(&s).ok());
  dev->clear_launch_records();

  // The task writes a pattern the read-back checks (the host computes it, as for DropOutGenMask).
  const uint64_t task_cycles = rt::gen_mask_cycles(dev->config(), 8 * bytes);
  rt::AiCpuTask task;
  task.kernel = "TestMask";
  task.outputs = {{mask, bytes}};
  task.cycles = task_cycles;
  task.compute = [mask, bytes](DeviceMemory& gm) {
    std::vector<uint8_t> pattern(bytes);
    for (uint64_t i = 0; i < bytes; ++i) pattern[i] = static_cast<uint8_t>(i * 7 + 1);
    gm.write(mask, pattern.data(), bytes);
    return rt::Status();
  };

  REQUIRE(dev->launch_kernel(s, vadd, {dx, dx, dz, n}, 1).ok());    // A
  REQUIRE(dev->ai_cpu_task_async(s, task).ok());                    // T
  REQUIRE(dev->launch_kernel(s, vadd, {dx, dx, dz, n}, 1).ok());    // B: does not read the mask
  REQUIRE(dev->launch_kernel(s, vadd, {mask, dx, dz, n}, 1).ok());  // R: reads it
  std::vector<uint8_t> back(bytes);
  REQUIRE(dev->memcpy_d2h_async(s, back.data(), mask, bytes).ok());
  REQUIRE(dev->synchronize_stream(s).ok());

  const auto launches = dev->launch_records();
  const auto tasks = dev->ai_cpu_records();
  const auto copies = dev->copy_records();
  REQUIRE(launches.size() == 3);
  REQUIRE(tasks.size() == 1);
  REQUIRE(copies.size() == 1);
  const rt::LaunchRecord &a = launches[0], &b = launches[1], &r = launches[2];
  const rt::AiCpuRecord& t = tasks[0];
  const uint64_t a_end = a.start_cycle + a.cycles, b_end = b.start_cycle + b.cycles;
  const uint64_t t_end = t.start_cycle + t.cycles;
  CHECK(t.kernel == "TestMask");
  CHECK(t.cycles == task_cycles);
  // The task starts when its stream is ready (A's end); B does not wait for it.
  CHECK(t.start_cycle == a_end);
  CHECK(b.start_cycle == a_end);
  // The overlap is real: the task outlasts B (30 us of overhead alone), and R starts at its end.
  REQUIRE(t_end > b_end);
  CHECK(r.start_cycle == t_end);
  CHECK(copies[0].start_cycle >= t_end);
  // The device time covers the AI CPU's timeline; the AI cores' work alone ends before it would
  // have serialised: A + T + B + R back to back is longer.
  uint64_t now = 0;
  REQUIRE(dev->device_time_cycles(&now).ok());
  CHECK(now >= r.start_cycle + r.cycles);
  CHECK(r.start_cycle + r.cycles < a.cycles + t.cycles + b.cycles + r.cycles + a.start_cycle);
  // The host computed the output.
  for (uint64_t i = 0; i < bytes; ++i) REQUIRE(back[i] == static_cast<uint8_t>(i * 7 + 1));

  // A second task queues behind the first on the AI CPU timeline, not behind the AI cores.
  dev->clear_launch_records();
  REQUIRE(dev->ai_cpu_task_async(s, task).ok());
  REQUIRE(dev->ai_cpu_task_async(s, task).ok());
  REQUIRE(dev->synchronize_stream(s).ok());
  const auto two = dev->ai_cpu_records();
  REQUIRE(two.size() == 2);
  CHECK(two[1].start_cycle == two[0].start_cycle + two[0].cycles);
  REQUIRE(dev->destroy_stream(s).ok());
}

TEST_CASE("ai_cpu_task_async checks its task") {
  auto dev = device();
  rt::Stream s;
  REQUIRE(dev->create_stream(&s).ok());
  rt::AiCpuTask task;
  task.kernel = "Bad";
  const rt::Status none = dev->ai_cpu_task_async(s, task);
  CHECK(none.code() == rt::StatusCode::invalid_argument);
  CHECK_THAT(none.message(), Catch::Contains("no compute function"));
  task.compute = [](DeviceMemory&) { return rt::Status(); };
  task.outputs = {{0x10, 64}};  // not an allocation
  const rt::Status range = dev->ai_cpu_task_async(s, task);
  CHECK(range.code() == rt::StatusCode::invalid_argument);
  CHECK_THAT(range.message(), Catch::Contains("output device range"));
  // A failing compute is the stream's error, naming the task.
  uint64_t buf = 0;
  REQUIRE(dev->malloc(64, &buf).ok());
  task.outputs = {{buf, 64}};
  task.compute = [](DeviceMemory&) {
    return rt::Status(rt::StatusCode::invalid_argument, "keep_prob 2 is not in [0, 1]");
  };
  REQUIRE(dev->ai_cpu_task_async(s, task).ok());
  const rt::Status st = dev->synchronize_stream(s);
  CHECK(st.code() == rt::StatusCode::invalid_argument);
  CHECK_THAT(st.message(), Catch::Contains("AI CPU task 'Bad'"));
  CHECK_THAT(st.message(), Catch::Contains("keep_prob 2"));
  REQUIRE(dev->destroy_stream(s).ok());
}
