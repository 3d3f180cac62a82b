// The plugin's StreamExecutor C API layer without TensorFlow's runtime: SE_InitPlugin is called
// the way TensorFlow calls it (stream_executor.cc: InitStreamExecutorPlugin, GetUncachedExecutor)
// and every callback is driven directly against the tiny chip (NPUSIM_CHIP=tiny, set by ctest).
// Data results are checked against host buffers built here; the one timing check derives its
// figure from the chip config.
#include <catch2/catch.hpp>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "sim/config/chip_config.h"
#include "tensorflow/c/experimental/stream_executor/stream_executor.h"

namespace {

// A StreamExecutor C API struct as TensorFlow makes them: its struct_size set, every other member
// zero (value-initialised, where `T t{SIZE}` leaves them to -Wmissing-field-initializers).
template <typename T>
T se_struct(size_t struct_size) {
  T t{};
  t.struct_size = struct_size;
  return t;
}

struct StatusDeleter {
  void operator()(TF_Status* s) const { TF_DeleteStatus(s); }
};
using StatusPtr = std::unique_ptr<TF_Status, StatusDeleter>;

// The platform, its device and stream executor, set up once per process (one chip).
struct Plugin {
  SE_PlatformRegistrationParams params =
      se_struct<SE_PlatformRegistrationParams>(SE_PLATFORM_REGISTRATION_PARAMS_STRUCT_SIZE);
  SP_Platform platform = se_struct<SP_Platform>(SP_PLATFORM_STRUCT_SIZE);
  SP_PlatformFns platform_fns = se_struct<SP_PlatformFns>(SP_PLATFORM_FNS_STRUCT_SIZE);
  SP_DeviceFns device_fns = se_struct<SP_DeviceFns>(SP_DEVICE_FNS_STRUCT_SIZE);
  SP_StreamExecutor se = se_struct<SP_StreamExecutor>(SP_STREAMEXECUTOR_STRUCT_SIZE);
  SP_TimerFns timer_fns = se_struct<SP_TimerFns>(SP_TIMER_FNS_STRUCT_SIZE);
  SP_Device device = se_struct<SP_Device>(SP_DEVICE_STRUCT_SIZE);
  StatusPtr status{TF_NewStatus()};

  Plugin() {
    params.major_version = SE_MAJOR;
    params.minor_version = SE_MINOR;
    params.patch_version = SE_PATCH;
    params.platform = &platform;
    params.platform_fns = &platform_fns;
    SE_InitPlugin(&params, status.get());
    REQUIRE(TF_GetCode(status.get()) == TF_OK);

    auto dfp = se_struct<SE_CreateDeviceFnsParams>(SE_CREATE_DEVICE_FNS_PARAMS_STRUCT_SIZE);
    dfp.device_fns = &device_fns;
    platform_fns.create_device_fns(&platform, &dfp, status.get());
    REQUIRE(TF_GetCode(status.get()) == TF_OK);

    auto sep =
        se_struct<SE_CreateStreamExecutorParams>(SE_CREATE_STREAM_EXECUTOR_PARAMS_STRUCT_SIZE);
    sep.stream_executor = &se;
    platform_fns.create_stream_executor(&platform, &sep, status.get());
    REQUIRE(TF_GetCode(status.get()) == TF_OK);

    platform_fns.create_timer_fns(&platform, &timer_fns, status.get());
    REQUIRE(TF_GetCode(status.get()) == TF_OK);

    auto cdp = se_struct<SE_CreateDeviceParams>(SE_CREATE_DEVICE_PARAMS_STRUCT_SIZE);
    cdp.ordinal = 0;
    cdp.device = &device;
    platform_fns.create_device(&platform, &cdp, status.get());
    REQUIRE(TF_GetCode(status.get()) == TF_OK);
  }

  SP_DeviceMemoryBase allocate(uint64_t bytes) {
    auto m = se_struct<SP_DeviceMemoryBase>(SP_DEVICE_MEMORY_BASE_STRUCT_SIZE);
    se.allocate(&device, bytes, 0, &m);
    return m;
  }
  SP_Stream stream() {
    SP_Stream s = nullptr;
    se.create_stream(&device, &s, status.get());
    REQUIRE(TF_GetCode(status.get()) == TF_OK);
    return s;
  }
  void ok() { REQUIRE(TF_GetCode(status.get()) == TF_OK); }
};

Plugin& plugin() {
  static Plugin* p = new Plugin();  // the device outlives the test run, as in TensorFlow
  return *p;
}

}  // namespace

TEST_CASE("SE_InitPlugin registers platform NPU with every required callback") {
  Plugin& p = plugin();
  CHECK(std::string(p.platform.name) == "NPU");
  CHECK(std::string(p.platform.type) == "NPU");
  CHECK(p.platform.use_bfc_allocator == 0);  // tensors are runtime blocks on whole L2 lines
  CHECK(p.platform.supports_unified_memory == 0);
  CHECK(p.params.destroy_platform != nullptr);
  CHECK(p.params.destroy_platform_fns != nullptr);
  int count = 0;
  p.platform_fns.get_device_count(&p.platform, &count, p.status.get());
  p.ok();
  CHECK(count == 1);
  // The list TensorFlow's ValidateSPStreamExecutor checks, plus the optional ones we provide.
  const SP_StreamExecutor& se = p.se;
  for (bool set :
       {se.allocate != nullptr, se.deallocate != nullptr, se.get_allocator_stats != nullptr,
        se.host_memory_allocate != nullptr, se.host_memory_deallocate != nullptr,
        se.device_memory_usage != nullptr, se.create_stream != nullptr,
        se.destroy_stream != nullptr, se.create_stream_dependency != nullptr,
        se.get_stream_status != nullptr, se.create_event != nullptr, se.destroy_event != nullptr,
        se.get_event_status != nullptr, se.record_event != nullptr,
        se.wait_for_event != nullptr, se.create_timer != nullptr, se.destroy_timer != nullptr,
        se.start_timer != nullptr, se.stop_timer != nullptr, se.memcpy_dtoh != nullptr,
        se.memcpy_htod != nullptr, se.memcpy_dtod != nullptr, se.sync_memcpy_dtoh != nullptr,
        se.sync_memcpy_htod != nullptr, se.sync_memcpy_dtod != nullptr,
        se.block_host_for_event != nullptr, se.block_host_until_done != nullptr,
        se.synchronize_all_activity != nullptr, se.mem_zero != nullptr, se.memset != nullptr,
        se.memset32 != nullptr, se.host_callback != nullptr})
    CHECK(set);
  CHECK(p.device.device_handle != nullptr);
  CHECK(std::string(p.device.hardware_name) == "npusim tiny");
  const npusim::ChipConfig cfg = npusim::load_chip_config("tiny");
  CHECK(p.device_fns.get_memory_bandwidth(&p.device) ==
        static_cast<int64_t>(cfg.hbm_gbps * 1e9));
}

TEST_CASE("copies and fills run in stream order on device memory") {
  Plugin& p = plugin();
  constexpr uint64_t kBytes = 4096;
  SP_DeviceMemoryBase a = p.allocate(kBytes), b = p.allocate(kBytes);
  REQUIRE(a.opaque != nullptr);
  REQUIRE(b.opaque != nullptr);
  CHECK(a.size == kBytes);
  SP_Stream s = p.stream();

  std::vector<uint8_t> host(kBytes), back(kBytes, 0xee);
  for (uint64_t i = 0; i < kBytes; ++i) host[i] = static_cast<uint8_t>(i * 7 + 3);
  // Expected device contents of a after: host, then bytes [256, 512) = 0x5a, bytes [1024, 1536)
  // = little-endian 0x11223344, bytes [2048, 2100) = 0.
  std::vector<uint8_t> want = host;
  std::memset(want.data() + 256, 0x5a, 256);
  for (uint64_t i = 1024; i < 1536; i += 4) {
    const uint8_t le[4] = {0x44, 0x33, 0x22, 0x11};
    std::memcpy(want.data() + i, le, 4);
  }
  std::memset(want.data() + 2048, 0, 52);

  p.se.memcpy_htod(&p.device, s, &a, host.data(), kBytes, p.status.get());
  p.ok();
  SP_DeviceMemoryBase part = a;
  part.opaque = static_cast<uint8_t*>(a.opaque) + 256;
  p.se.memset(&p.device, s, &part, 0x5a, 256, p.status.get());
  p.ok();
  part.opaque = static_cast<uint8_t*>(a.opaque) + 1024;
  p.se.memset32(&p.device, s, &part, 0x11223344u, 512, p.status.get());
  p.ok();
  part.opaque = static_cast<uint8_t*>(a.opaque) + 2048;
  p.se.mem_zero(&p.device, s, &part, 52, p.status.get());
  p.ok();
  p.se.memcpy_dtod(&p.device, s, &b, &a, kBytes, p.status.get());
  p.ok();
  p.se.memcpy_dtoh(&p.device, s, back.data(), &b, kBytes, p.status.get());
  p.ok();
  p.se.block_host_until_done(&p.device, s, p.status.get());
  p.ok();
  CHECK(back == want);

  // Synchronous forms.
  std::vector<uint8_t> sync_back(kBytes, 0);
  p.se.sync_memcpy_htod(&p.device, &a, host.data(), kBytes, p.status.get());
  p.ok();
  p.se.sync_memcpy_dtod(&p.device, &b, &a, kBytes, p.status.get());
  p.ok();
  p.se.sync_memcpy_dtoh(&p.device, sync_back.data(), &b, kBytes, p.status.get());
  p.ok();
  CHECK(sync_back == host);

  p.se.destroy_stream(&p.device, s);
  p.se.deallocate(&p.device, &a);
  p.se.deallocate(&p.device, &b);
  CHECK(a.opaque == nullptr);
}

TEST_CASE("a bad copy is reported when queued; the stream stays usable and reports ok") {
  Plugin& p = plugin();
  SP_DeviceMemoryBase a = p.allocate(1024);
  SP_Stream s = p.stream();
  std::vector<uint8_t> host(4096, 1);
  // 4096 bytes into a 1024-byte block (+32 bytes of padding): outside the allocation.
  p.se.memcpy_htod(&p.device, s, &a, host.data(), 4096, p.status.get());
  CHECK(TF_GetCode(p.status.get()) == TF_INVALID_ARGUMENT);
  CHECK(std::string(TF_Message(p.status.get())).find("not inside one live allocation") !=
        std::string::npos);
  p.se.get_stream_status(&p.device, s, p.status.get());
  CHECK(TF_GetCode(p.status.get()) == TF_OK);
  p.se.memcpy_htod(&p.device, s, &a, host.data(), 1024, p.status.get());
  p.ok();
  p.se.block_host_until_done(&p.device, s, p.status.get());
  p.ok();
  p.se.destroy_stream(&p.device, s);
  p.se.deallocate(&p.device, &a);
}

TEST_CASE("allocation failure is a null pointer; stats follow allocations") {
  Plugin& p = plugin();
  SP_DeviceMemoryBase huge = p.allocate(uint64_t{4} << 30);  // tiny has 1 GiB of HBM
  CHECK(huge.opaque == nullptr);
  SP_DeviceMemoryBase zero = p.allocate(0);
  CHECK(zero.opaque == nullptr);

  SP_AllocatorStats before = se_struct<SP_AllocatorStats>(SP_ALLOCATORSTATS_STRUCT_SIZE);
  REQUIRE(p.se.get_allocator_stats(&p.device, &before));
  SP_DeviceMemoryBase a = p.allocate(10000);
  SP_AllocatorStats during = se_struct<SP_AllocatorStats>(SP_ALLOCATORSTATS_STRUCT_SIZE);
  REQUIRE(p.se.get_allocator_stats(&p.device, &during));
  // A guard line (tiny: memory.l2.line_bytes = 512) + 10000 bytes + 32 bytes of read-past
  // padding, rounded up to whole 512-byte lines (plugin_device.h malloc_tensor).
  CHECK(during.bytes_in_use - before.bytes_in_use == (512 + 10000 + 32 + 511) / 512 * 512);
  // The tensor starts one line into its block, on a line boundary.
  CHECK(reinterpret_cast<uint64_t>(a.opaque) % 512 == 0);
  CHECK(during.has_bytes_limit == 1);
  int64_t free = 0, total = 0;
  REQUIRE(p.se.device_memory_usage(&p.device, &free, &total));
  CHECK(total == during.bytes_limit);
  CHECK(free == total - during.bytes_in_use);
  p.se.deallocate(&p.device, &a);

  void* h = p.se.host_memory_allocate(&p.device, 100);
  REQUIRE(h != nullptr);
  CHECK(reinterpret_cast<uintptr_t>(h) % 64 == 0);
  p.se.host_memory_deallocate(&p.device, h);
}

TEST_CASE("events, stream dependencies and host callbacks order work across streams") {
  Plugin& p = plugin();
  constexpr uint64_t kBytes = 1 << 16;
  SP_DeviceMemoryBase a = p.allocate(kBytes);
  SP_Stream producer = p.stream(), consumer = p.stream();
  std::vector<uint8_t> host(kBytes, 0x42), back(kBytes, 0);

  SP_Event e = nullptr;
  p.se.create_event(&p.device, &e, p.status.get());
  p.ok();
  p.se.memcpy_htod(&p.device, producer, &a, host.data(), kBytes, p.status.get());
  p.ok();
  p.se.record_event(&p.device, producer, e, p.status.get());
  p.ok();
  p.se.wait_for_event(&p.device, consumer, e, p.status.get());
  p.ok();
  p.se.memcpy_dtoh(&p.device, consumer, back.data(), &a, kBytes, p.status.get());
  p.ok();

  // The callback runs after the copy before it on its stream, and sees its bytes.
  struct Seen {
    const std::vector<uint8_t>* buffer;
    std::atomic<int> calls{0};
    bool copied = false;
  } seen{&back};
  auto callback = [](void* arg, TF_Status* st) {
    auto* s = static_cast<Seen*>(arg);
    s->copied = (*s->buffer)[0] == 0x42 && s->buffer->back() == 0x42;
    ++s->calls;
    TF_SetStatus(st, TF_OK, "");
  };
  CHECK(p.se.host_callback(&p.device, consumer, callback, &seen) == 1);

  p.se.block_host_for_event(&p.device, e, p.status.get());
  p.ok();
  CHECK(p.se.get_event_status(&p.device, e) == SE_EVENT_COMPLETE);
  p.se.block_host_until_done(&p.device, consumer, p.status.get());
  p.ok();
  CHECK(seen.calls == 1);
  CHECK(seen.copied);
  CHECK(back == host);

  // create_stream_dependency: work queued on consumer after it waits for producer's work.
  std::vector<uint8_t> host2(kBytes, 0x17);
  p.se.memcpy_htod(&p.device, producer, &a, host2.data(), kBytes, p.status.get());
  p.ok();
  p.se.create_stream_dependency(&p.device, consumer, producer, p.status.get());
  p.ok();
  p.se.memcpy_dtoh(&p.device, consumer, back.data(), &a, kBytes, p.status.get());
  p.ok();
  p.se.synchronize_all_activity(&p.device, p.status.get());
  p.ok();
  CHECK(back == host2);

  p.se.destroy_event(&p.device, e);
  p.se.destroy_stream(&p.device, producer);
  p.se.destroy_stream(&p.device, consumer);
  p.se.deallocate(&p.device, &a);
}

TEST_CASE("a timer measures simulated device time of the host link") {
  Plugin& p = plugin();
  const npusim::ChipConfig cfg = npusim::load_chip_config("tiny");
  constexpr uint64_t kBytes = 4096;
  SP_DeviceMemoryBase a = p.allocate(kBytes);
  SP_Stream s = p.stream();
  std::vector<uint8_t> host(kBytes, 1);
  SP_Timer t = nullptr;
  p.se.create_timer(&p.device, &t, p.status.get());
  p.ok();
  p.se.start_timer(&p.device, s, t, p.status.get());
  p.ok();
  p.se.memcpy_htod(&p.device, s, &a, host.data(), kBytes, p.status.get());
  p.ok();
  p.se.stop_timer(&p.device, s, t, p.status.get());
  p.ok();
  // One h2d copy over the HDC link (docs/runtime.md, "Timing"): hdc_latency_us plus the bytes
  // at hdc_gbps. On tiny (910b link, 64 GB/s, 5 us): 5 us + 4096 B / 64000 B/us = 5064 ns.
  const double want_ns = (cfg.hdc_latency_us + kBytes / (cfg.hdc_gbps * 1e3)) * 1e3;
  // Events stamp whole AI-core cycles: allow one cycle (1000 / clock_mhz ns) plus rounding.
  const double ns = static_cast<double>(p.timer_fns.nanoseconds(t));
  CHECK(std::fabs(ns - want_ns) <= 1000.0 / cfg.clock_mhz + 0.5);
  p.se.destroy_timer(&p.device, t);
  p.se.destroy_stream(&p.device, s);
  p.se.deallocate(&p.device, &a);
}
