// The AI CPU timeline on a system of chips (docs/runtime.md, "The AI CPU timeline"): each chip
// has its own; a task's output is ready for a collective that sends it at the task's end (the
// driver's write epochs), while the chip's next kernel runs meanwhile. On tiny-x8 with an ai_cpu
// section set in its chip config (tiny models none).
#include <catch2/catch.hpp>

#include <cstring>
#include <memory>
#include <vector>

#include "adapter/runtime/ai_cpu.h"
#include "tests/runtime/runtime_test_util.h"

using namespace npusim;

TEST_CASE("a collective sending an AI CPU task's output starts at the task's end") {
  SystemConfig sys = load_system_config("tiny-x8");
  sys.chip.ai_cpu_cores = 2;
  sys.chip.ai_cpu_clock_mhz = 1000;
  sys.chip.ai_cpu_task_us = 40;
  sys.chip.ai_cpu_gen_mask_cycles_per_128_bits = 16;
  std::vector<std::shared_ptr<rt::Device>> d;
  rt::RuntimeOptions ro;
  ro.record_launches = true;
  REQUIRE(rt::Device::open_system(sys, SimOptions{}, ro, &d).ok());

  const uint64_t n = 4096, bytes = n * 2;  // f16
  const auto vadd = test::load_kernel("kernels/vadd_f16.s");
  struct Chip {
    rt::Stream s, h;
    uint64_t mask = 0, recv = 0, x = 0, z = 0;
  } c[2];
  CollectiveCall call;
  call.kind = CollectiveKind::all_reduce;
  call.dtype = isa::Dtype::F16;
  call.op = ReduceOp::sum;
  auto group = std::make_shared<rt::CollectiveGroup>(call, 2, "mask");
  // Chip 1's task takes longer (more elements' worth of cycles): the collective waits for the
  // later of the two.
  const uint64_t task_cycles[2] = {rt::gen_mask_cycles(sys.chip, 8 * bytes),
                                   rt::gen_mask_cycles(sys.chip, 64 * bytes)};
  for (int i = 0; i < 2; ++i) {
    rt::Device& dev = *d[static_cast<size_t>(i)];
    Chip& k = c[i];
    REQUIRE(dev.create_stream(&k.s).ok());
    REQUIRE(dev.create_stream(&k.h).ok());
    for (uint64_t* a : {&k.mask, &k.recv, &k.x, &k.z}) REQUIRE(dev.malloc(bytes, a).ok());
    REQUIRE(dev.memset8(k.x, 0, bytes).ok());
    rt::AiCpuTask task;
    task.kernel = "TestMask";
    task.outputs = {{k.mask, bytes}};
    task.cycles = task_cycles[i];
    task.compute = [addr = k.mask, bytes](DeviceMemory& gm) {
      const std::vector<uint16_t> ones(bytes / 2, 0x3c00);  // f16 1.0
      gm.write(addr, ones.data(), bytes);
      return rt::Status();
    };
    REQUIRE(dev.ai_cpu_task_async(k.s, task).ok());
    REQUIRE(dev.launch_kernel(k.s, vadd, {k.x, k.x, k.z, n}, 1).ok());  // independent
    REQUIRE(dev.stream_wait_stream(k.h, k.s, /*order_only=*/true).ok());
    REQUIRE(dev.collective_async(k.h, group, i, k.mask, k.recv, n).ok());
  }
  for (int i = 0; i < 2; ++i) {
    REQUIRE(d[static_cast<size_t>(i)]->synchronize_stream(c[i].h).ok());
    REQUIRE(d[static_cast<size_t>(i)]->synchronize_stream(c[i].s).ok());
  }
  uint64_t latest_end = 0;
  for (int i = 0; i < 2; ++i) {
    rt::Device& dev = *d[static_cast<size_t>(i)];
    const auto tasks = dev.ai_cpu_records();
    const auto launches = dev.launch_records();
    REQUIRE(tasks.size() == 1);
    REQUIRE(launches.size() == 1);
    CHECK(tasks[0].chip == i);
    CHECK(tasks[0].cycles == task_cycles[i]);
    // The independent kernel does not wait for the task (both start where the stream was).
    CHECK(launches[0].start_cycle == tasks[0].start_cycle);
    CHECK(launches[0].start_cycle + launches[0].cycles < tasks[0].start_cycle + task_cycles[i]);
    latest_end = std::max(latest_end, tasks[0].start_cycle + tasks[0].cycles);
  }
  const rt::CollectiveRecord coll = d[0]->collective_records().back();
  CHECK(coll.start_cycle == latest_end);
  // The collective summed what the tasks wrote: 1 + 1 = 2 everywhere.
  std::vector<uint16_t> back(n);
  REQUIRE(d[0]->memcpy_d2h(back.data(), c[0].recv, bytes).ok());
  for (uint64_t i = 0; i < n; ++i) REQUIRE(back[i] == 0x4000);
}
