// Streams, events, host callbacks and device opening on the tiny chip.
#include <catch2/catch.hpp>

#include <condition_variable>
#include <mutex>

#include "tests/runtime/runtime_test_util.h"

using namespace npusim;
using rt::StatusCode;

namespace {

// Holds the driver thread inside a host callback until release(), so that the test can queue
// operations on several streams and then let the driver choose among them.
class DriverGate {
 public:
  rt::HostCallback callback() {
    return [this] {
      std::unique_lock<std::mutex> lock(m_mutex);
      m_entered = true;
      m_cv.notify_all();
      m_cv.wait(lock, [&] { return m_released; });
      return rt::Status();
    };
  }
  void wait_entered() {
    std::unique_lock<std::mutex> lock(m_mutex);
    m_cv.wait(lock, [&] { return m_entered; });
  }
  void release() {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_released = true;
    m_cv.notify_all();
  }

 private:
  std::mutex m_mutex;
  std::condition_variable m_cv;
  bool m_entered = false, m_released = false;
};

enum class Dependency { none, event, stream };

// Runs one two-stream scenario: stream A copies `data` to X and records an event; stream B
// (created first, so the driver's round-robin would serve it first) waits for that event, or
// for stream A as a whole, or not at all, then copies X back to the host. Returns what B read.
std::vector<uint8_t> two_stream_copy(rt::Device& dev, const std::vector<uint8_t>& data,
                                     Dependency dep) {
  const uint64_t n = data.size();
  uint64_t x = 0;
  REQUIRE(dev.malloc(n, &x).ok());
  REQUIRE(dev.memset8(x, 0, n).ok());
  rt::Stream b, a, gate_stream;  // ids b < a < gate_stream
  REQUIRE(dev.create_stream(&b).ok());
  REQUIRE(dev.create_stream(&a).ok());
  REQUIRE(dev.create_stream(&gate_stream).ok());
  rt::Event copied;
  REQUIRE(dev.create_event(&copied).ok());
  DriverGate gate;
  REQUIRE(dev.launch_callback(gate_stream, gate.callback()).ok());
  gate.wait_entered();  // the driver is busy; nothing below runs before release()
  std::vector<uint8_t> out(n, 0xee);
  REQUIRE(dev.memcpy_h2d_async(a, x, data.data(), n).ok());
  REQUIRE(dev.record_event(copied, a).ok());
  if (dep == Dependency::event) REQUIRE(dev.stream_wait_event(b, copied).ok());
  if (dep == Dependency::stream) REQUIRE(dev.stream_wait_stream(b, a).ok());
  REQUIRE(dev.memcpy_d2h_async(b, out.data(), x, n).ok());
  bool complete = true;
  REQUIRE(dev.query_event(copied, &complete).ok());
  CHECK_FALSE(complete);  // its record is queued behind the gate
  gate.release();
  REQUIRE(dev.synchronize_stream(b).ok());
  REQUIRE(dev.synchronize_event(copied).ok());
  REQUIRE(dev.query_event(copied, &complete).ok());
  CHECK(complete);
  REQUIRE(dev.synchronize_device().ok());
  for (rt::Stream s : {a, b, gate_stream}) REQUIRE(dev.destroy_stream(s).ok());
  REQUIRE(dev.destroy_event(copied).ok());
  REQUIRE(dev.free(x).ok());
  return out;
}

}  // namespace

TEST_CASE("opening: the same config returns the same device; another config fails cleanly") {
  auto dev = test::tiny_device();
  std::shared_ptr<rt::Device> again;
  REQUIRE(rt::Device::open("tiny", {}, SimOptions{}, rt::RuntimeOptions{}, &again).ok());
  CHECK(again == dev);

  std::shared_ptr<rt::Device> other;
  rt::Status st =
      rt::Device::open("tiny", {"clock_mhz=1000"}, SimOptions{}, rt::RuntimeOptions{}, &other);
  CHECK(st.code() == StatusCode::failed_precondition);
  CHECK_THAT(st.message(), Catch::Contains("chip config is fixed at the first open"));
  CHECK_THAT(st.message(), Catch::Contains(dev->chip_identity()));
  CHECK(other == nullptr);

  SimOptions timing_only;
  timing_only.functional = false;
  st = rt::Device::open("tiny", {}, timing_only, rt::RuntimeOptions{}, &other);
  CHECK(st.code() == StatusCode::failed_precondition);
  CHECK_THAT(st.message(), Catch::Contains("functional=false"));

  st = rt::Device::open("no_such_chip", {}, SimOptions{}, rt::RuntimeOptions{}, &other);
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(), Catch::Contains("no_such_chip"));

  // The device is unaffected.
  uint64_t a = 0;
  REQUIRE(dev->malloc(64, &a).ok());
  REQUIRE(dev->free(a).ok());
}

TEST_CASE("stream B waits for an event recorded after a copy in stream A") {
  auto dev = test::tiny_device();
  std::vector<uint8_t> data(64 * 1024);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7 + 3);
  // Without the wait the driver serves B (the lower id) first and B reads the zeroed buffer;
  // this shows the scenario can tell the difference.
  std::vector<uint8_t> unordered = two_stream_copy(*dev, data, Dependency::none);
  CHECK(std::all_of(unordered.begin(), unordered.end(), [](uint8_t v) { return v == 0; }));
  // With the wait B's copy runs after A's copy and reads the data.
  CHECK(two_stream_copy(*dev, data, Dependency::event) == data);
  CHECK(two_stream_copy(*dev, data, Dependency::stream) == data);
}

TEST_CASE("event elapsed time of a host-to-device copy follows the HDC link model") {
  auto dev = test::tiny_device();
  const ChipConfig& cfg = dev->config();
  constexpr uint64_t n = 256 * 1024;
  std::vector<uint8_t> host(n, 0x42);
  uint64_t d = 0;
  REQUIRE(dev->malloc(n, &d).ok());
  rt::Stream s;
  rt::Event start, end, after_d2h;
  REQUIRE(dev->create_stream(&s).ok());
  REQUIRE(dev->create_event(&start).ok());
  REQUIRE(dev->create_event(&end).ok());
  REQUIRE(dev->create_event(&after_d2h).ok());
  double us = 0;
  rt::Status st = dev->event_elapsed_us(start, end, &us);
  CHECK(st.code() == StatusCode::failed_precondition);  // never recorded
  CHECK_THAT(st.message(), Catch::Contains("never recorded"));

  REQUIRE(dev->record_event(start, s).ok());
  REQUIRE(dev->memcpy_h2d_async(s, d, host.data(), n).ok());
  REQUIRE(dev->record_event(end, s).ok());
  REQUIRE(dev->memcpy_d2h_async(s, host.data(), d, n).ok());
  REQUIRE(dev->record_event(after_d2h, s).ok());
  REQUIRE(dev->synchronize_event(after_d2h).ok());
  REQUIRE(dev->event_elapsed_us(start, end, &us).ok());
  // tiny (from 910b): hdc latency 5 us, 64 GB/s = 64e3 bytes/us, clock 1850 MHz. A copy of
  // 262144 bytes takes 5 + 262144 / 64e3 = 5 + 4.096 = 9.096 us (16827.6 cycles). Events stamp
  // whole cycles, so the difference is within one cycle (1/1850 us) of that.
  const double expected_us = cfg.hdc_latency_us + n / (cfg.hdc_gbps * 1e3);
  CHECK(expected_us == Approx(9.096));
  CHECK(us > 0);
  CHECK(us == Approx(expected_us).margin(1.0 / cfg.clock_mhz));
  // The device-to-host direction has its own DMA with the same parameters.
  double back_us = 0;
  REQUIRE(dev->event_elapsed_us(end, after_d2h, &back_us).ok());
  CHECK(back_us == Approx(expected_us).margin(1.0 / cfg.clock_mhz));
  REQUIRE(dev->event_elapsed_us(after_d2h, start, &us).ok());
  CHECK(us < 0);  // end before start: negative, as cudaEventElapsedTime
  REQUIRE(dev->destroy_stream(s).ok());
  for (rt::Event e : {start, end, after_d2h}) REQUIRE(dev->destroy_event(e).ok());
  bool complete = false;
  CHECK(dev->query_event(start, &complete).code() == StatusCode::invalid_argument);
  CHECK(dev->query_event(end, nullptr).code() == StatusCode::invalid_argument);
  REQUIRE(dev->free(d).ok());
}

TEST_CASE("host callbacks run in stream order; a failing one becomes the stream's error") {
  auto dev = test::tiny_device();
  rt::Stream s, t;
  REQUIRE(dev->create_stream(&s).ok());
  REQUIRE(dev->create_stream(&t).ok());
  std::vector<int> order;  // written by the driver thread only
  uint64_t d = 0;
  REQUIRE(dev->malloc(512, &d).ok());
  uint32_t word = 0;
  REQUIRE(dev->memset32_async(s, d, 0xdeadbeefu, 512).ok());
  REQUIRE(dev->launch_callback(s, [&] {
    order.push_back(1);
    return rt::Status();
  }).ok());
  rt::Status inside_sync, inside_queue;
  REQUIRE(dev->launch_callback(s, [&] {
    order.push_back(2);
    // Waiting for the device from the driver thread would deadlock: refused. Queuing is fine.
    inside_sync = dev->synchronize_device();
    inside_queue = dev->memcpy_d2h_async(t, &word, d, 4);
    return rt::Status(StatusCode::unsupported, "op 'Foo': attribute 'bar' is not supported");
  }).ok());
  REQUIRE(dev->launch_callback(s, [&] {
    order.push_back(3);
    return rt::Status();
  }).ok());
  rt::Status st = dev->synchronize_stream(s);
  CHECK(st.code() == StatusCode::unsupported);
  CHECK_THAT(st.message(), Catch::Contains("host_callback: op 'Foo': attribute 'bar'"));
  CHECK(order == std::vector<int>{1, 2, 3});  // later ops of a failed stream still run
  CHECK(inside_sync.code() == StatusCode::failed_precondition);
  CHECK(inside_queue.ok());
  REQUIRE(dev->synchronize_stream(t).ok());
  CHECK(word == 0xdeadbeefu);

  // synchronize_device reports every stream's failure once.
  REQUIRE(dev->launch_callback(s, [] { return rt::Status(StatusCode::internal, "first"); }).ok());
  REQUIRE(dev->launch_callback(t, [] { return rt::Status(StatusCode::internal, "second"); }).ok());
  st = dev->synchronize_device();
  CHECK(st.code() == StatusCode::internal);
  CHECK_THAT(st.message(), Catch::Contains("first"));
  CHECK_THAT(st.message(), Catch::Contains("second"));
  CHECK(dev->synchronize_device().ok());
  CHECK(dev->stream_status(s).ok());

  REQUIRE(dev->destroy_stream(s).ok());
  CHECK(dev->memset8_async(s, d, 0, 4).code() == StatusCode::invalid_argument);
  CHECK(dev->synchronize_stream(s).code() == StatusCode::invalid_argument);
  REQUIRE(dev->destroy_stream(t).ok());
  REQUIRE(dev->free(d).ok());
}
