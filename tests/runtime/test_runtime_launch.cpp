// Kernel launches through the runtime on the tiny chip: vadd_f16 against a host reference,
// concurrent submission from several host threads, launch checks, faults and launch records.
#include <catch2/catch.hpp>

#include <thread>

#include "tests/runtime/runtime_test_util.h"

using namespace npusim;
using rt::StatusCode;

namespace {

std::shared_ptr<const isa::Program> vadd() {
  static auto p = test::load_kernel("kernels/vadd_f16.s");
  return p;
}

// x + y on the device over one stream: allocate, copy in, launch vadd_f16 on every vector core,
// copy out, free. Returns the status of the first failing call (the result is then partial).
rt::Status run_vadd(rt::Device& dev, rt::Stream s, const std::vector<uint16_t>& x,
                    const std::vector<uint16_t>& y, std::vector<uint16_t>* z) {
  const uint64_t n = x.size(), bytes = n * 2;
  z->assign(n, 0);
  uint64_t dx = 0, dy = 0, dz = 0;
  rt::Status st;
  auto step = [&](rt::Status r) {
    if (st.ok()) st = std::move(r);
    return st.ok();
  };
  const int blocks = dev.config().core_kind(isa::CoreKind::AIV)->count;
  step(dev.malloc(bytes, &dx)) && step(dev.malloc(bytes, &dy)) && step(dev.malloc(bytes, &dz)) &&
      step(dev.memcpy_h2d_async(s, dx, x.data(), bytes)) &&
      step(dev.memcpy_h2d_async(s, dy, y.data(), bytes)) &&
      step(dev.launch_kernel(s, vadd(), {dx, dy, dz, n}, blocks)) &&
      step(dev.memcpy_d2h_async(s, z->data(), dz, bytes)) && step(dev.synchronize_stream(s));
  for (uint64_t a : {dx, dy, dz}) step(dev.free(a));
  return st;
}

// z = x + y by vadd on the tiny chip's vector cores, launched as a derived launch (z "derived"
// from its source ranges): buffers x, y, z and an unrelated one, x and y random f16.
struct DerivedAdd {
  std::shared_ptr<rt::Device> dev = test::tiny_device();
  rt::Stream s;
  const uint64_t n = 2048, bytes = n * 2;
  int blocks = 0;
  uint64_t dx = 0, dy = 0, dz = 0, other = 0;
  std::vector<uint16_t> x, y;

  DerivedAdd(uint32_t seed_x, uint32_t seed_y)
      : x(test::random_f16(n, seed_x)), y(test::random_f16(n, seed_y)) {
    REQUIRE(dev->create_stream(&s).ok());
    blocks = dev->config().core_kind(isa::CoreKind::AIV)->count;
    for (uint64_t* p : {&dx, &dy, &dz, &other}) REQUIRE(dev->malloc(bytes, p).ok());
    REQUIRE(dev->memcpy_h2d(dx, x.data(), bytes).ok());
    REQUIRE(dev->memcpy_h2d(dy, y.data(), bytes).ok());
  }
  ~DerivedAdd() {
    for (uint64_t p : {dx, dy, dz, other}) CHECK(dev->free(p).ok());
  }
  // Launches it and checks z = x + y (computed now, or kept from the last run); true if it ran.
  bool derive(const rt::DerivedSource& src) {
    const size_t before = dev->launch_records().size();
    rt::Status st = dev->launch_derived(s, vadd(), {dx, dy, dz, n}, blocks, nullptr, src);
    INFO(st.to_string());
    REQUIRE(st.ok());
    REQUIRE(dev->synchronize_stream(s).ok());
    std::vector<uint16_t> z(n);
    REQUIRE(dev->memcpy_d2h(z.data(), dz, bytes).ok());
    CHECK(z == test::reference_add_f16(x, y));
    return dev->launch_records().size() > before;
  }
};

}  // namespace

TEST_CASE("h2d -> vadd_f16 -> d2h equals the fp16 reference") {
  auto dev = test::tiny_device();
  rt::Stream s;
  REQUIRE(dev->create_stream(&s).ok());
  const size_t n = 4096;  // a multiple of 16, as vadd_f16 requires
  auto x = test::random_f16(n, 1), y = test::random_f16(n, 2);
  std::vector<uint16_t> z;
  rt::Status st = run_vadd(*dev, s, x, y, &z);
  INFO(st.to_string());
  REQUIRE(st.ok());
  CHECK(z == test::reference_add_f16(x, y));
  REQUIRE(dev->destroy_stream(s).ok());
}

TEST_CASE("4 host threads, each with its own stream, give the same bytes as a serial run") {
  auto dev = test::tiny_device();
  constexpr int kThreads = 4;
  std::vector<std::vector<uint16_t>> xs, ys, serial(kThreads), parallel(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    const size_t n = 1024 + 256 * t;  // different sizes, so block slices differ per thread
    xs.push_back(test::random_f16(n, 100 + t));
    ys.push_back(test::random_f16(n, 200 + t));
  }
  rt::Stream serial_stream;
  REQUIRE(dev->create_stream(&serial_stream).ok());
  for (int t = 0; t < kThreads; ++t)
    REQUIRE(run_vadd(*dev, serial_stream, xs[t], ys[t], &serial[t]).ok());

  std::vector<rt::Status> status(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      rt::Stream s;
      status[t] = dev->create_stream(&s);
      for (int rep = 0; rep < 3 && status[t].ok(); ++rep)  // several rounds to interleave
        status[t] = run_vadd(*dev, s, xs[t], ys[t], &parallel[t]);
      if (status[t].ok()) status[t] = dev->destroy_stream(s);
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    INFO("thread " << t << ": " << status[t].to_string());
    CHECK(status[t].ok());
    CHECK(parallel[t] == serial[t]);
    CHECK(serial[t] == test::reference_add_f16(xs[t], ys[t]));
  }
}

TEST_CASE("a faulting kernel returns kernel_fault naming it; the stream and device stay usable") {
  auto dev = test::tiny_device();
  auto fault = test::ub_overrun_kernel();  // faults on a UB address past the UB
  uint64_t src = 0;
  REQUIRE(dev->malloc(64, &src).ok());
  const uint64_t ub_bytes = dev->config().core_kind(isa::CoreKind::AIV)->capacity(isa::Buf::UB);
  rt::Stream s, other;
  REQUIRE(dev->create_stream(&s).ok());
  REQUIRE(dev->create_stream(&other).ok());
  dev->clear_launch_records();

  REQUIRE(dev->launch_kernel(s, fault, {ub_bytes, src}, 1).ok());  // async: queued fine
  auto x = test::random_f16(512, 7), y = test::random_f16(512, 8);
  std::vector<uint16_t> z;
  rt::Status other_st = run_vadd(*dev, other, x, y, &z);  // another stream is unaffected
  CHECK(other_st.ok());
  CHECK(z == test::reference_add_f16(x, y));

  rt::Status st = dev->synchronize_stream(s);
  CHECK(st.code() == StatusCode::kernel_fault);
  CHECK_THAT(st.message(), Catch::Contains("kernel 'ub_overrun'"));
  CHECK_THAT(st.message(), Catch::Contains("stream " + std::to_string(s.id)));
  CHECK_THAT(st.message(), Catch::Contains("copy_gm2ub"));
  CHECK(dev->synchronize_stream(s).ok());  // reported once, then cleared
  CHECK(dev->stream_status(s).ok());

  // The next launch on the same stream works.
  rt::Status again = run_vadd(*dev, s, x, y, &z);
  CHECK(again.ok());
  CHECK(z == test::reference_add_f16(x, y));

  // Launch records: vadd (other stream), the fault, vadd (same stream), in execution order of
  // the driver; the fault is recorded with its error.
  std::vector<rt::LaunchRecord> rec = dev->launch_records();
  REQUIRE(rec.size() == 3);
  int faults = 0;
  for (const rt::LaunchRecord& r : rec) {
    if (r.kernel == "ub_overrun") {
      ++faults;
      CHECK_FALSE(r.ok);
      CHECK(r.stream == s.id);
      CHECK(r.block_dim == 1);
      CHECK_THAT(r.error, Catch::Contains("copy_gm2ub"));
    } else {
      CHECK(r.kernel == "vadd_f16");
      CHECK(r.ok);
      CHECK(r.cycles > 0);
      CHECK(r.time_us == Approx(r.cycles / dev->config().clock_mhz).epsilon(1e-3));
      CHECK(r.block_dim == 4);
      CHECK(r.counters().is_object());
      CHECK(r.counters().contains("chip"));
    }
  }
  CHECK(faults == 1);
  CHECK(rec[1].start_cycle >= rec[0].start_cycle + rec[0].cycles);  // kernels do not overlap
  CHECK(rec[2].start_cycle >= rec[1].start_cycle + rec[1].cycles);
  dev->clear_launch_records();
  CHECK(dev->launch_records().empty());
  REQUIRE(dev->free(src).ok());
}

TEST_CASE("launch checks: no program, block_dim, argument count, verifier issues") {
  auto dev = test::tiny_device();
  rt::Stream s;
  REQUIRE(dev->create_stream(&s).ok());
  rt::Status st = dev->launch_kernel(s, nullptr, {}, 1);
  CHECK(st.code() == StatusCode::invalid_argument);
  st = dev->launch_kernel(s, vadd(), {0, 0, 0, 0}, 0);
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(), Catch::Contains("kernel 'vadd_f16': block_dim 0"));
  st = dev->launch_kernel(s, vadd(), {0, 0, 0}, 1);
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(), Catch::Contains("declares 4 arguments (x, y, z, n) but the launch "
                                           "passes 3"));
  // A flag set and never waited for: rejected by the verifier before anything is queued.
  auto bad = test::assemble_text(R"(
.kernel unpaired_flag
.section aiv
    set_flag mte2, v, 0
    end
)", "unpaired_flag.s");
  st = dev->launch_kernel(s, bad, {}, 1);
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(), Catch::Contains("kernel 'unpaired_flag' fails verification on chip "
                                           "'tiny'"));
  CHECK_THAT(st.message(), Catch::Contains("unpaired_flag.s:4"));
  // A cube-only kernel section on a vector-only launch is also the verifier's: a kernel with an
  // aicore section cannot run on the split tiny chip.
  auto coupled = test::assemble_text(".kernel coupled_only\n.section aicore\n    end\n", "c.s");
  CHECK(dev->launch_kernel(s, coupled, {}, 1).code() == StatusCode::invalid_argument);
  bool idle = false;
  REQUIRE(dev->query_stream(s, &idle).ok());
  CHECK(idle);  // nothing was queued
  CHECK(dev->synchronize_stream(s).ok());
  CHECK(dev->launch_kernel(rt::Stream{9999}, vadd(), {0, 0, 0, 0}, 1).code() ==
        StatusCode::invalid_argument);
}

TEST_CASE("launch_derived: left out while its source is unchanged, run again after any write "
          "to the source") {
  DerivedAdd t(3, 4);
  auto& dev = t.dev;
  auto& s = t.s;
  const uint64_t n = t.n, bytes = t.bytes;
  const int blocks = t.blocks;
  const uint64_t dx = t.dx, dy = t.dy, dz = t.dz, other = t.other;
  auto& x = t.x;
  auto& y = t.y;
  // z = x + y is "derived" from x (the test keeps y fixed, as a compiled op's cast reads only
  // its source).
  auto state = std::make_shared<rt::DerivedState>();
  rt::DerivedSource src{dx, bytes, state, true, {}};
  auto derive = [&]() { return t.derive(src); };
  CHECK(derive());
  CHECK_FALSE(derive());  // unchanged: left out, z still holds the result
  CHECK(state->skipped == 1);

  // A write elsewhere, even in the same page as x, does not count.
  REQUIRE(dev->memset8(other, 1, bytes).ok());
  REQUIRE(dev->memset8(dy, 0, 0).ok());
  CHECK_FALSE(derive());

  // Each kind of write to the source makes it run again: a host copy, a fill of one byte (of
  // its last 256-byte block), a kernel writing it, a device-to-device copy into it.
  x = test::random_f16(n, 5);
  REQUIRE(dev->memcpy_h2d(dx, x.data(), bytes).ok());
  CHECK(derive());
  CHECK_FALSE(derive());
  REQUIRE(dev->memset8(dx + bytes - 1, 0x3c, 1).ok());
  x[n - 1] = static_cast<uint16_t>((x[n - 1] & 0x00ff) | 0x3c00);
  CHECK(derive());
  REQUIRE(dev->launch_kernel(s, vadd(), {dy, dy, dx, n}, blocks).ok());  // x = y + y
  REQUIRE(dev->synchronize_stream(s).ok());
  x = test::reference_add_f16(y, y);
  CHECK(derive());
  CHECK_FALSE(derive());
  std::vector<uint16_t> w = test::random_f16(n, 6);
  REQUIRE(dev->memcpy_h2d(other, w.data(), bytes).ok());
  REQUIRE(dev->memcpy_d2d(dx, other, bytes).ok());
  x = w;
  CHECK(derive());

  // Without may_skip it always runs, counting the runs that found the source unchanged.
  src.may_skip = false;
  const uint64_t unchanged = state->unchanged;
  CHECK(derive());
  CHECK(derive());
  CHECK(state->unchanged == unchanged + 2);

  // A source not inside one allocation, or no state, is refused before anything is queued.
  rt::Status st = dev->launch_derived(s, vadd(), {dx, dy, dz, n}, blocks, nullptr,
                                      rt::DerivedSource{dx + bytes - 16, 32, state, true, {}});
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(), Catch::Contains("not inside one live allocation"));
  st = dev->launch_derived(s, vadd(), {dx, dy, dz, n}, blocks, nullptr,
                           rt::DerivedSource{dx, bytes, nullptr, true, {}});
  CHECK(st.code() == StatusCode::invalid_argument);
  st = dev->launch_derived(s, vadd(), {dx, dy, dz, n}, blocks, nullptr,
                           rt::DerivedSource{dx, bytes, state, true, {{dy + bytes - 16, 32}}});
  CHECK(st.code() == StatusCode::invalid_argument);
}

TEST_CASE("launch_derived with several sources: left out only while none of them changed") {
  DerivedAdd t(7, 8);
  // z = x + y derived from both x and y.
  auto state = std::make_shared<rt::DerivedState>();
  const rt::DerivedSource src{t.dx, t.bytes, state, true, {{t.dy, t.bytes}}};
  auto derive = [&]() { return t.derive(src); };
  CHECK(derive());
  CHECK_FALSE(derive());
  REQUIRE(t.dev->memset8(t.other, 1, t.bytes).ok());
  CHECK_FALSE(derive());
  t.y = test::random_f16(t.n, 9);  // the second source changes: it runs again
  REQUIRE(t.dev->memcpy_h2d(t.dy, t.y.data(), t.bytes).ok());
  CHECK(derive());
  CHECK_FALSE(derive());
  t.x = test::random_f16(t.n, 10);  // the first
  REQUIRE(t.dev->memcpy_h2d(t.dx, t.x.data(), t.bytes).ok());
  CHECK(derive());
  CHECK_FALSE(derive());
  CHECK(state->skipped == 4);
}
