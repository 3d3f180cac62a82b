// The runtime over a system of chips (Device::open_system on tiny-x8): per-chip memory, streams
// and kernels, copies between chips over the links (with their link counters and records),
// collectives queued rank by rank on the chips' streams, the errors of each, and copies timed by
// their data.
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <thread>

#include "sim/config/system_config.h"
#include "tests/runtime/runtime_test_util.h"

using namespace npusim;
using rt::StatusCode;

namespace {

// The process's devices: the eight tiny chips of tiny-x8 (two servers of four).
const std::vector<std::shared_ptr<rt::Device>>& chips() {
  static std::vector<std::shared_ptr<rt::Device>> devices = [] {
    std::vector<std::shared_ptr<rt::Device>> d;
    rt::Status st = rt::Device::open_system(load_system_config("tiny-x8"), SimOptions{},
                                            rt::RuntimeOptions{}, &d);
    if (!st.ok()) throw std::runtime_error("cannot open tiny-x8: " + st.to_string());
    return d;
  }();
  return devices;
}

std::vector<float> host_floats(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i % 17) - 8.0f;  // exact sums
  return v;
}

uint64_t fabric_bytes(const std::string& channel) {
  nlohmann::json tree;
  REQUIRE(chips()[0]->system_counters(&tree).ok());
  return tree.at("fabric").at(channel).at("bytes").at("value").get<uint64_t>();
}

}  // namespace

TEST_CASE("a system opens as one device per chip, each with its own memory and streams") {
  const auto& d = chips();
  REQUIRE(d.size() == 8);
  for (int c = 0; c < 8; ++c) {
    CHECK(d[static_cast<size_t>(c)]->chip() == c);
    CHECK(d[static_cast<size_t>(c)]->chips() == 8);
  }
  // The same address on two chips holds two different values.
  uint64_t a0 = 0, a5 = 0;
  REQUIRE(d[0]->malloc(4096, &a0).ok());
  REQUIRE(d[5]->malloc(4096, &a5).ok());
  CHECK(a0 == a5);  // the allocators are alike; the memories are not
  const std::vector<float> x = host_floats(1024, 1), y = host_floats(1024, 100);
  REQUIRE(d[0]->memcpy_h2d(a0, x.data(), 4096).ok());
  REQUIRE(d[5]->memcpy_h2d(a5, y.data(), 4096).ok());
  std::vector<float> back(1024);
  REQUIRE(d[0]->memcpy_d2h(back.data(), a0, 4096).ok());
  CHECK(back == x);
  REQUIRE(d[5]->memcpy_d2h(back.data(), a5, 4096).ok());
  CHECK(back == y);
  CHECK(d[0]->free(a0).ok());
  CHECK(d[5]->free(a5).ok());

  // A second open with the same system gives the same devices; a single chip is refused.
  std::vector<std::shared_ptr<rt::Device>> again;
  REQUIRE(rt::Device::open_system(load_system_config("tiny-x8"), SimOptions{}, rt::RuntimeOptions{},
                                  &again)
              .ok());
  CHECK(again[3] == d[3]);
  std::shared_ptr<rt::Device> single;
  rt::Status st = rt::Device::open("tiny", {}, SimOptions{}, rt::RuntimeOptions{}, &single);
  CHECK(st.code() == StatusCode::failed_precondition);
  CHECK_THAT(st.message(), Catch::Contains("system 'tiny-x8'"));
}

TEST_CASE("a kernel runs on the chip whose stream queues it") {
  const auto& d = chips();
  rt::Device& dev = *d[2];
  rt::Stream s;
  REQUIRE(dev.create_stream(&s).ok());
  const uint64_t n = 4096, bytes = n * 2;
  const auto x = test::random_f16(n, 1), y = test::random_f16(n, 2);
  uint64_t dx = 0, dy = 0, dz = 0;
  for (uint64_t* p : {&dx, &dy, &dz}) REQUIRE(dev.malloc(bytes, p).ok());
  REQUIRE(dev.memcpy_h2d_async(s, dx, x.data(), bytes).ok());
  REQUIRE(dev.memcpy_h2d_async(s, dy, y.data(), bytes).ok());
  const int blocks = dev.config().core_kind(isa::CoreKind::AIV)->count;
  REQUIRE(
      dev.launch_kernel(s, test::load_kernel("kernels/vadd_f16.s"), {dx, dy, dz, n}, blocks).ok());
  std::vector<uint16_t> z(n);
  REQUIRE(dev.memcpy_d2h_async(s, z.data(), dz, bytes).ok());
  REQUIRE(dev.synchronize_stream(s).ok());
  CHECK(z == test::reference_add_f16(x, y));
  const auto records = dev.launch_records();
  REQUIRE(records.size() == 1);
  CHECK(records[0].chip == 2);
  CHECK(records[0].cycles > 0);
  CHECK(d[1]->launch_records().empty());
  // A stream belongs to its chip: another chip's device cannot queue on it.
  uint64_t other = 0;
  REQUIRE(d[3]->malloc(bytes, &other).ok());
  CHECK(d[3]->memset8_async(s, other, 0, bytes).code() == StatusCode::invalid_argument);
  for (uint64_t p : {dx, dy, dz}) CHECK(dev.free(p).ok());
  CHECK(d[3]->free(other).ok());
}

TEST_CASE("a copy between chips moves over the links and is recorded") {
  const auto& d = chips();
  const uint64_t bytes = 64 * 1024;
  uint64_t src = 0, dst = 0;
  REQUIRE(d[0]->malloc(bytes, &src).ok());
  REQUIRE(d[3]->malloc(bytes, &dst).ok());
  const std::vector<float> x = host_floats(bytes / 4, 7);
  REQUIRE(d[0]->memcpy_h2d(src, x.data(), bytes).ok());
  const uint64_t before = fabric_bytes("c0->c3");
  d[0]->clear_launch_records();
  rt::Stream s;
  REQUIRE(d[0]->create_stream(&s).ok());
  REQUIRE(d[0]->memcpy_peer_async(s, *d[3], dst, src, bytes).ok());
  REQUIRE(d[0]->synchronize_stream(s).ok());
  std::vector<float> back(bytes / 4);
  REQUIRE(d[3]->memcpy_d2h(back.data(), dst, bytes).ok());
  CHECK(back == x);
  CHECK(fabric_bytes("c0->c3") - before == bytes);
  const auto copies = d[0]->copy_records();
  REQUIRE(copies.size() == 1);
  CHECK(copies[0].kind == rt::OpKind::memcpy_peer);
  CHECK(copies[0].chip == 0);
  CHECK(copies[0].dst_chip == 3);
  CHECK(copies[0].bytes == bytes);
  // Derived from tiny-x8 (configs/systems/910b-x8.yaml): 2 us latency + bytes at 56 GB/s,
  // at the tiny chip's clock.
  const SystemConfig sys = load_system_config("tiny-x8");
  const double us = sys.link.latency_us + static_cast<double>(bytes) / (sys.link.gbps * 1e3);
  CHECK(copies[0].cycles == Approx(sys.chip.us_to_cycles(us)).margin(2));

  // Errors: a range outside any allocation of the destination chip; a device of no system.
  CHECK(d[0]->memcpy_peer_async(s, *d[3], dst + bytes, src, bytes).code() ==
        StatusCode::invalid_argument);
  CHECK(d[0]->memcpy_peer_async(s, *d[0], src, src, bytes).ok() == false);
  CHECK(d[0]->free(src).ok());
  CHECK(d[3]->free(dst).ok());
}

TEST_CASE("an all-reduce queued rank by rank runs once every rank is at its stream's head") {
  const auto& d = chips();
  const int ranks = 4;
  const uint64_t count = 3000, bytes = count * 4;
  CollectiveCall call;
  call.kind = CollectiveKind::all_reduce;
  call.dtype = isa::Dtype::F32;
  call.op = ReduceOp::sum;
  auto group = std::make_shared<rt::CollectiveGroup>(call, ranks, "test");
  std::vector<rt::Stream> streams(ranks);
  std::vector<uint64_t> send(ranks), recv(ranks);
  std::vector<float> expected(count, 0.0f);
  for (int r = 0; r < ranks; ++r) {
    rt::Device& dev = *d[static_cast<size_t>(r)];
    REQUIRE(dev.create_stream(&streams[static_cast<size_t>(r)]).ok());
    REQUIRE(dev.malloc(bytes, &send[static_cast<size_t>(r)]).ok());
    REQUIRE(dev.malloc(bytes, &recv[static_cast<size_t>(r)]).ok());
    const std::vector<float> x = host_floats(count, static_cast<float>(r));
    for (uint64_t i = 0; i < count; ++i) expected[i] += x[i];
    REQUIRE(dev.memcpy_h2d(send[static_cast<size_t>(r)], x.data(), bytes).ok());
  }
  d[0]->clear_launch_records();
  // Ranks 0..2 queue their parts: nothing runs yet.
  for (int r = 0; r < ranks - 1; ++r)
    REQUIRE(d[static_cast<size_t>(r)]
                ->collective_async(streams[static_cast<size_t>(r)], group, r,
                                   send[static_cast<size_t>(r)], recv[static_cast<size_t>(r)],
                                   count)
                .ok());
  bool idle = true;
  REQUIRE(d[0]->query_stream(streams[0], &idle).ok());
  CHECK_FALSE(idle);
  REQUIRE(d[3]->collective_async(streams[3], group, 3, send[3], recv[3], count).ok());
  for (int r = 0; r < ranks; ++r) {
    REQUIRE(d[static_cast<size_t>(r)]->synchronize_stream(streams[static_cast<size_t>(r)]).ok());
    std::vector<float> out(count);
    REQUIRE(d[static_cast<size_t>(r)]
                ->memcpy_d2h(out.data(), recv[static_cast<size_t>(r)], bytes)
                .ok());
    CHECK(out == expected);
  }
  const auto records = d[2]->collective_records();
  REQUIRE(records.size() == 1);
  CHECK(records[0].collective == "all_reduce");
  CHECK(records[0].algorithm == "mesh");  // four chips of one full-mesh server
  CHECK(records[0].op == "sum");
  CHECK(records[0].dtype == "f32");
  CHECK(records[0].bytes == bytes);
  CHECK(records[0].chips == std::vector<int>{0, 1, 2, 3});
  CHECK(records[0].end_cycle > records[0].start_cycle);

  SECTION("ranks of different element counts fail on every rank's stream, naming them") {
    auto bad = std::make_shared<rt::CollectiveGroup>(call, 2, "bad");
    REQUIRE(d[0]->collective_async(streams[0], bad, 0, send[0], recv[0], count).ok());
    REQUIRE(d[1]->collective_async(streams[1], bad, 1, send[1], recv[1], count - 1).ok());
    for (int r = 0; r < 2; ++r) {
      rt::Status st =
          d[static_cast<size_t>(r)]->synchronize_stream(streams[static_cast<size_t>(r)]);
      CHECK(st.code() == StatusCode::invalid_argument);
      CHECK_THAT(st.message(), Catch::Contains("rank"));
    }
  }
  SECTION("two ranks on one chip, or a rank given twice, fail the group when queued") {
    auto bad = std::make_shared<rt::CollectiveGroup>(call, 2, "bad");
    REQUIRE(d[0]->collective_async(streams[0], bad, 0, send[0], recv[0], count).ok());
    rt::Status st = d[0]->collective_async(streams[0], bad, 1, send[0], recv[0], count);
    CHECK(st.code() == StatusCode::invalid_argument);
    CHECK_THAT(st.message(), Catch::Contains("chip 0 is already rank 0"));
    // The part already queued completes with the group's failure.
    CHECK(d[0]->synchronize_stream(streams[0]).code() == StatusCode::invalid_argument);
  }
  for (int r = 0; r < ranks; ++r) {
    CHECK(d[static_cast<size_t>(r)]->free(send[static_cast<size_t>(r)]).ok());
    CHECK(d[static_cast<size_t>(r)]->free(recv[static_cast<size_t>(r)]).ok());
  }
}

namespace {

// Queues rank r's part of one f32 all-reduce of `count` elements on chips[r]'s stream
// streams[r], in place on bufs[r].
void all_reduce_async(const std::vector<int>& chip_ids, const std::vector<rt::Stream>& streams,
                      const std::vector<uint64_t>& bufs, uint64_t count) {
  CollectiveCall call;
  call.kind = CollectiveKind::all_reduce;
  call.dtype = isa::Dtype::F32;
  call.op = ReduceOp::sum;
  const int ranks = static_cast<int>(chip_ids.size());
  auto group = std::make_shared<rt::CollectiveGroup>(call, ranks, "timeline");
  for (int r = 0; r < ranks; ++r) {
    const size_t i = static_cast<size_t>(r);
    REQUIRE(chips()[static_cast<size_t>(chip_ids[i])]
                ->collective_async(streams[i], group, r, bufs[i], bufs[i], count)
                .ok());
  }
}

uint64_t timeline(int chip) {
  uint64_t t = 0;
  REQUIRE(chips()[static_cast<size_t>(chip)]->device_time_cycles(&t).ok());
  return t;
}

}  // namespace

TEST_CASE("each chip has its own device timeline: kernels of two chips overlap") {
  const auto& d = chips();
  rt::Device &dev0 = *d[0], &dev1 = *d[1];
  const uint64_t n = 8192, bytes = n * 2;
  const auto x = test::random_f16(n, 3), y = test::random_f16(n, 4);
  const auto program = test::load_kernel("kernels/vadd_f16.s");
  const int blocks = dev0.config().core_kind(isa::CoreKind::AIV)->count;
  struct Buffers {
    uint64_t x = 0, y = 0, z = 0, sum = 0;
  } b[2];
  rt::Stream s[2];
  for (int c = 0; c < 2; ++c) {
    rt::Device& dev = *d[static_cast<size_t>(c)];
    for (uint64_t* p : {&b[c].x, &b[c].y, &b[c].z, &b[c].sum}) REQUIRE(dev.malloc(bytes, p).ok());
    REQUIRE(dev.memcpy_h2d(b[c].x, x.data(), bytes).ok());
    REQUIRE(dev.memcpy_h2d(b[c].y, y.data(), bytes).ok());
    REQUIRE(dev.memset8(b[c].sum, 0, bytes).ok());
    REQUIRE(dev.create_stream(&s[c]).ok());
  }
  const std::vector<rt::Stream> streams{s[0], s[1]};
  const std::vector<uint64_t> sums{b[0].sum, b[1].sum};
  auto kernel_on = [&](int c) {
    rt::Device& dev = *d[static_cast<size_t>(c)];
    REQUIRE(dev.launch_kernel(s[c], program, {b[c].x, b[c].y, b[c].z, n}, blocks).ok());
  };
  // A collective holds both chips until its end: afterwards both timelines stand there, whatever
  // the earlier tests left on them.
  dev0.clear_launch_records();
  all_reduce_async({0, 1}, streams, sums, n / 2);
  for (int c = 0; c < 2; ++c) REQUIRE(d[static_cast<size_t>(c)]->synchronize_stream(s[c]).ok());
  const uint64_t aligned = dev0.collective_records().at(0).end_cycle;
  CHECK(timeline(0) == aligned);
  CHECK(timeline(1) == aligned);

  // The same kernel on chip 0 (once) and chip 1 (twice), queued from two threads: chip 0's and
  // chip 1's first launch both start where the collective ended; chip 1's second follows its
  // first. Each chip's timeline moved by its own work only.
  rt::Event chip1_done;
  REQUIRE(dev1.create_event(&chip1_done).ok());
  std::thread t0([&] { kernel_on(0); });
  std::thread t1([&] {
    kernel_on(1);
    kernel_on(1);
    REQUIRE(dev1.record_event(chip1_done, s[1]).ok());
  });
  t0.join();
  t1.join();
  for (int c = 0; c < 2; ++c) REQUIRE(d[static_cast<size_t>(c)]->synchronize_stream(s[c]).ok());
  const auto k0 = dev0.launch_records(), k1 = dev1.launch_records();
  REQUIRE(k0.size() == 1);
  REQUIRE(k1.size() >= 2);
  const rt::LaunchRecord &a = k0[0], &b1 = k1[k1.size() - 2], &b2 = k1.back();
  // A launch waits for its chip clock's next edge on the one simulation clock: up to a cycle.
  CHECK(a.start_cycle - aligned <= 1);
  CHECK(b1.start_cycle - aligned <= 1);  // overlaps chip 0's kernel: no wait for it
  CHECK(b2.start_cycle >= b1.start_cycle + b1.cycles);
  const uint64_t end0 = timeline(0), end1 = timeline(1);
  CHECK(end0 >= a.start_cycle + a.cycles);
  CHECK(end0 < b2.start_cycle + b2.cycles);  // chip 0 is done before chip 1's second kernel
  CHECK(end1 >= b2.start_cycle + b2.cycles);
  // Two kernels on chip 1 and one on chip 0 took, on the timelines, the time of two, not three.
  CHECK(std::max(end0, end1) - aligned < a.cycles + b1.cycles + b2.cycles);

  // A stream of chip 0 waiting for chip 1's event: its next kernel starts where chip 1 recorded
  // it (chip 0 idles until then).
  REQUIRE(dev0.stream_wait_event(s[0], chip1_done).ok());
  kernel_on(0);
  REQUIRE(dev0.synchronize_stream(s[0]).ok());
  const rt::LaunchRecord after_wait = dev0.launch_records().back();
  CHECK(after_wait.start_cycle - end1 <= 1);
  const uint64_t end0_wait = timeline(0);
  CHECK(end0_wait > end1);
  CHECK(timeline(1) == end1);  // chip 1 was idle meanwhile

  // A collective after them starts at the later chip's end and leaves both chips there.
  kernel_on(1);
  kernel_on(1);  // chip 1 now ends after chip 0
  REQUIRE(dev1.synchronize_stream(s[1]).ok());
  const uint64_t end1_later = timeline(1);
  CHECK(end1_later > end0_wait);
  all_reduce_async({0, 1}, streams, sums, n / 2);
  for (int c = 0; c < 2; ++c) REQUIRE(d[static_cast<size_t>(c)]->synchronize_stream(s[c]).ok());
  const rt::CollectiveRecord coll = dev0.collective_records().back();
  CHECK(coll.start_cycle == end1_later);
  CHECK(timeline(0) == coll.end_cycle);
  CHECK(timeline(1) == coll.end_cycle);
  REQUIRE(!coll.step_records.empty());
  CHECK(coll.step_records.front().start_cycle == coll.start_cycle);  // steps on the timeline

  // A peer copy is its source chip's operation: queued on chip 1 (busier than chip 0), it starts
  // where chip 1 is free and leaves chip 0's timeline alone; chip 0's kernel that reads the
  // bytes waits for an event recorded after the copy.
  kernel_on(1);
  kernel_on(1);
  REQUIRE(dev1.synchronize_stream(s[1]).ok());
  const uint64_t free0 = timeline(0), free1 = timeline(1);
  CHECK(free1 > free0);
  dev0.clear_launch_records();
  REQUIRE(dev1.memcpy_peer_async(s[1], dev0, b[0].x, b[1].z, bytes).ok());
  rt::Event copied;
  REQUIRE(dev1.create_event(&copied).ok());
  REQUIRE(dev1.record_event(copied, s[1]).ok());
  REQUIRE(dev1.synchronize_stream(s[1]).ok());
  const auto copies = dev1.copy_records();
  REQUIRE(copies.size() == 1);
  CHECK(copies[0].start_cycle == free1);
  CHECK(timeline(0) == free0);  // the destination chip did not wait for the copy
  const uint64_t copy_end = timeline(1);
  CHECK(copy_end + 1 >= copies[0].start_cycle + copies[0].cycles);  // cycles: rounded up
  REQUIRE(dev0.stream_wait_event(s[0], copied).ok());
  kernel_on(0);
  REQUIRE(dev0.synchronize_stream(s[0]).ok());
  CHECK(dev0.launch_records().back().start_cycle - copy_end <= 1);
  CHECK(dev0.destroy_event(copied).ok());

  // Event times are on the chips' timelines: chip 1's record lies after chip 0's start.
  double us = 0;
  rt::Event start0;
  REQUIRE(dev0.create_event(&start0).ok());
  REQUIRE(dev0.record_event(start0, s[0]).ok());
  REQUIRE(dev0.synchronize_stream(s[0]).ok());
  kernel_on(1);
  kernel_on(1);  // chip 1 ends after chip 0
  REQUIRE(dev1.record_event(chip1_done, s[1]).ok());
  REQUIRE(dev1.synchronize_stream(s[1]).ok());
  REQUIRE(dev0.event_elapsed_us(start0, chip1_done, &us).ok());
  CHECK(us == Approx(dev0.config().cycles_to_us(double(timeline(1) - timeline(0)))));
  CHECK(us > 0);

  for (int c = 0; c < 2; ++c) {
    rt::Device& dev = *d[static_cast<size_t>(c)];
    for (uint64_t p : {b[c].x, b[c].y, b[c].z, b[c].sum}) CHECK(dev.free(p).ok());
  }
  CHECK(dev0.destroy_event(start0).ok());
  CHECK(dev1.destroy_event(chip1_done).ok());
}

namespace {

// One rank of a two-chip collective test: f16 inputs x and y (from seeds `seed` and seed + 10)
// on its chip, four more buffers of their size, a compute stream s and a collective stream h.
struct Rank {
  rt::Device* dev = nullptr;
  std::vector<uint16_t> x, y;
  uint64_t x_at = 0, y_at = 0;
  std::array<uint64_t, 4> buf{};
  rt::Stream s, h;
};

Rank open_rank(int chip, uint64_t n, uint32_t seed) {
  Rank r;
  r.dev = chips()[static_cast<size_t>(chip)].get();
  r.x = test::random_f16(n, seed);
  r.y = test::random_f16(n, seed + 10);
  for (uint64_t* p : {&r.x_at, &r.y_at, &r.buf[0], &r.buf[1], &r.buf[2], &r.buf[3]})
    REQUIRE(r.dev->malloc(n * 2, p).ok());
  REQUIRE(r.dev->memcpy_h2d(r.x_at, r.x.data(), n * 2).ok());
  REQUIRE(r.dev->memcpy_h2d(r.y_at, r.y.data(), n * 2).ok());
  REQUIRE(r.dev->create_stream(&r.s).ok());
  REQUIRE(r.dev->create_stream(&r.h).ok());
  return r;
}

void close_rank(const Rank& r) {
  for (uint64_t p : {r.x_at, r.y_at, r.buf[0], r.buf[1], r.buf[2], r.buf[3]})
    CHECK(r.dev->free(p).ok());
}

}  // namespace

TEST_CASE(
    "a collective runs on the communication timeline: it overlaps later independent "
    "kernels, starts when its input was written, and its readers wait for it") {
  // HCCL's way (docs/runtime.md, "Simulated time on a system"): each chip computes on a stream
  // (s), its collectives run on a stream of their own (h) that waits for the compute stream in
  // execution order only, as the TF plugin queues them.
  const auto& d = chips();
  const std::vector<int> ids{2, 3};
  const uint64_t n = 8192, bytes = n * 2;
  const auto program = test::load_kernel("kernels/vadd_f16.s");
  const int blocks = d[2]->config().core_kind(isa::CoreKind::AIV)->count;
  Rank c[2] = {open_rank(2, n, 10), open_rank(3, n, 11)};
  d[0]->clear_launch_records();
  CollectiveCall call;
  call.kind = CollectiveKind::all_reduce;
  call.dtype = isa::Dtype::F16;
  call.op = ReduceOp::sum;
  auto group = std::make_shared<rt::CollectiveGroup>(call, 2, "overlap");
  for (int i = 0; i < 2; ++i) {
    rt::Device& dev = *c[i].dev;
    // The "gradient" (x + y), then the collective of it, then an independent kernel.
    REQUIRE(
        dev.launch_kernel(c[i].s, program, {c[i].x_at, c[i].y_at, c[i].buf[0], n}, blocks).ok());
    REQUIRE(dev.stream_wait_stream(c[i].h, c[i].s, /*order_only=*/true).ok());
    REQUIRE(dev.collective_async(c[i].h, group, i, c[i].buf[0], c[i].buf[2], n).ok());
    REQUIRE(
        dev.launch_kernel(c[i].s, program, {c[i].x_at, c[i].x_at, c[i].buf[1], n}, blocks).ok());
  }
  for (int i = 0; i < 2; ++i) {
    rt::Device& dev = *c[i].dev;
    REQUIRE(dev.synchronize_stream(c[i].h).ok());
    REQUIRE(dev.synchronize_stream(c[i].s).ok());
  }
  const rt::CollectiveRecord coll = d[0]->collective_records().back();
  REQUIRE(coll.chips == ids);
  uint64_t grad_end = 0;
  std::vector<rt::LaunchRecord> independent;
  for (int i = 0; i < 2; ++i) {
    const auto k = c[i].dev->launch_records();
    REQUIRE(k.size() >= 2);
    const rt::LaunchRecord &grad = k[k.size() - 2], &other = k.back();
    grad_end = std::max(grad_end, grad.start_cycle + grad.cycles);
    independent.push_back(other);
    // The independent kernel follows the gradient's on the compute timeline, whatever the
    // collective does.
    CHECK(other.start_cycle - (grad.start_cycle + grad.cycles) <= 1);
  }
  // The collective starts when the later rank's gradient was written (its producer's end), not
  // after the kernels queued on the chips before the collective was run.
  CHECK(coll.start_cycle == grad_end);
  // ... and the chips computed meanwhile: the independent kernels overlap it.
  for (const rt::LaunchRecord& other : independent) {
    CHECK(other.start_cycle < coll.end_cycle);
    CHECK(other.start_cycle + other.cycles > coll.start_cycle);
  }
  REQUIRE(independent[0].start_cycle + independent[0].cycles < coll.end_cycle);  // a short kernel

  // A kernel reading the collective's output waits for its end (its host dispatch overlaps the
  // wait); one that does not read it does not.
  rt::Device& dev = *d[2];
  REQUIRE(
      dev.launch_kernel(c[0].s, program, {c[0].buf[2], c[0].x_at, c[0].buf[3], n}, blocks).ok());
  REQUIRE(dev.synchronize_stream(c[0].s).ok());
  const rt::LaunchRecord reader = dev.launch_records().back();
  CHECK(reader.start_cycle - coll.end_cycle <= 1);
  CHECK(reader.start_cycle >= coll.end_cycle);
  // The data: every rank holds the sum of the gradients.
  const auto expected = test::reference_add_f16(test::reference_add_f16(c[0].x, c[0].y),
                                                test::reference_add_f16(c[1].x, c[1].y));
  for (int i = 0; i < 2; ++i) {
    std::vector<uint16_t> got(n);
    REQUIRE(c[i].dev->memcpy_d2h(got.data(), c[i].buf[2], bytes).ok());
    CHECK(got == expected);
  }
  // A chip's device time is the later of its compute and communication timelines.
  uint64_t t3 = 0;
  REQUIRE(d[3]->device_time_cycles(&t3).ok());
  CHECK(t3 >= coll.end_cycle);

  SECTION(
      "a collective after independent work on its own stream starts no earlier than its "
      "previous collective") {
    auto second = std::make_shared<rt::CollectiveGroup>(call, 2, "second");
    for (int i = 0; i < 2; ++i)
      REQUIRE(c[i].dev->collective_async(c[i].h, second, i, c[i].x_at, c[i].buf[1], n).ok());
    for (int i = 0; i < 2; ++i) REQUIRE(c[i].dev->synchronize_stream(c[i].h).ok());
    const rt::CollectiveRecord next = d[0]->collective_records().back();
    // Its input (x) was written long before, but it was queued after the host read the sums
    // back (the synchronous copies above, chip 3's last, ending where chip 3's timeline
    // stands): the host clock holds it back, past its previous collective's end.
    CHECK(t3 > coll.end_cycle);
    CHECK(next.start_cycle == t3);
  }
  for (const Rank& r : c) close_rank(r);
}

TEST_CASE(
    "a fused all-reduce over buffer pieces equals one all-reduce per piece and starts "
    "when its last piece was written") {
  // HCCL's fused gradient segment: each rank's buffer is two tensors that are not contiguous.
  const auto& d = chips();
  const uint64_t n = 2048, bytes = n * 2;
  const auto program = test::load_kernel("kernels/vadd_f16.s");
  const int blocks = d[4]->config().core_kind(isa::CoreKind::AIV)->count;
  Rank c[2] = {open_rank(4, n, 30), open_rank(5, n, 31)};
  CollectiveCall call;
  call.kind = CollectiveKind::all_reduce;
  call.dtype = isa::Dtype::F16;
  call.op = ReduceOp::sum;
  auto fused = std::make_shared<rt::CollectiveGroup>(call, 2, "fused");
  d[0]->clear_launch_records();
  for (int i = 0; i < 2; ++i) {
    rt::Device& dev = *c[i].dev;
    // Piece a = x + y, then piece b = x + x: b is written last.
    REQUIRE(
        dev.launch_kernel(c[i].s, program, {c[i].x_at, c[i].y_at, c[i].buf[0], n}, blocks).ok());
    REQUIRE(
        dev.launch_kernel(c[i].s, program, {c[i].x_at, c[i].x_at, c[i].buf[1], n}, blocks).ok());
    REQUIRE(dev.stream_wait_stream(c[i].h, c[i].s, /*order_only=*/true).ok());
    // The pieces' bytes must add up to the count's.
    CHECK(dev.collective_async(c[i].h, fused, i, {{c[i].buf[0], bytes}}, {{c[i].buf[2], bytes}},
                               2 * n)
              .code() == StatusCode::invalid_argument);
    REQUIRE(dev.collective_async(c[i].h, fused, i, {{c[i].buf[0], bytes}, {c[i].buf[1], bytes}},
                                 {{c[i].buf[2], bytes}, {c[i].buf[3], bytes}}, 2 * n)
                .ok());
  }
  uint64_t b_end = 0;
  for (int i = 0; i < 2; ++i) {
    rt::Device& dev = *c[i].dev;
    REQUIRE(dev.synchronize_stream(c[i].h).ok());
    REQUIRE(dev.synchronize_stream(c[i].s).ok());
    const rt::LaunchRecord last = dev.launch_records().back();
    b_end = std::max(b_end, last.start_cycle + last.cycles);
  }
  const rt::CollectiveRecord coll = d[0]->collective_records().back();
  CHECK(coll.count == 2 * n);
  CHECK(coll.bytes == 2 * bytes);
  CHECK(coll.start_cycle == b_end);  // the later piece's writer, on the later chip
  // Every rank holds, piece by piece, the sum of the ranks' pieces.
  auto sum = [&](auto piece) { return test::reference_add_f16(piece(c[0]), piece(c[1])); };
  const auto expect_a = sum([](const Rank& p) { return test::reference_add_f16(p.x, p.y); });
  const auto expect_b = sum([](const Rank& p) { return test::reference_add_f16(p.x, p.x); });
  for (int i = 0; i < 2; ++i) {
    rt::Device& dev = *c[i].dev;
    std::vector<uint16_t> got_a(n), got_b(n);
    REQUIRE(dev.memcpy_d2h(got_a.data(), c[i].buf[2], bytes).ok());
    REQUIRE(dev.memcpy_d2h(got_b.data(), c[i].buf[3], bytes).ok());
    CHECK(got_a == expect_a);
    CHECK(got_b == expect_b);
  }
  for (const Rank& r : c) close_rank(r);
}

TEST_CASE(
    "the host clock: work queued after the host read a chip's result starts after that read, "
    "on every chip; a completion the host only polls does not hold the chips") {
  // docs/runtime.md, "The host clock". Chip 6 is kept busier than chip 7, so chip 7's own
  // timeline would let its kernels start before chip 6's work ended.
  const auto& d = chips();
  const uint64_t n = 8192, bytes = n * 2;
  const auto program = test::load_kernel("kernels/vadd_f16.s");
  const int blocks = d[6]->config().core_kind(isa::CoreKind::AIV)->count;
  Rank c[2] = {open_rank(6, n, 50), open_rank(7, n, 51)};
  rt::Device &dev6 = *c[0].dev, &dev7 = *c[1].dev;
  auto kernels = [&](Rank& r, int count) {
    for (int k = 0; k < count; ++k)
      REQUIRE(r.dev->launch_kernel(r.s, program, {r.x_at, r.y_at, r.buf[0], n}, blocks).ok());
  };
  auto last_launch = [](rt::Device& dev) { return dev.launch_records().back(); };
  auto poll = [](rt::Device& dev, rt::Event e) {  // until complete, as a host thread polls
    bool done = false;
    rt::Status st;
    do st = dev.query_event(e, &done);
    while (st.ok() && !done);
    REQUIRE(st.ok());
  };
  std::vector<uint16_t> back(n);

  // Blocking: the host waits for chip 6's stream (a synchronous read), then queues on chip 7.
  kernels(c[0], 4);
  REQUIRE(dev6.memcpy_d2h_async(c[0].s, back.data(), c[0].buf[0], bytes).ok());
  REQUIRE(dev6.synchronize_stream(c[0].s).ok());
  const uint64_t read6 = timeline(6);  // the copy's end: the stream's last op
  const uint64_t free7 = timeline(7);
  REQUIRE(free7 < read6);  // chip 7 could start earlier on its own
  kernels(c[1], 1);
  REQUIRE(dev7.synchronize_stream(c[1].s).ok());
  const rt::LaunchRecord after_sync = last_launch(dev7);
  CHECK(after_sync.start_cycle >= read6);
  CHECK(after_sync.start_cycle - read6 <= 1 + after_sync.host_dispatch_cycles);

  // Asynchronous: chip 6 reads a result back behind more kernels and records an event; the host
  // polls the event until it completes (as TensorFlow's event manager does), then queues on
  // chip 7.
  kernels(c[0], 6);
  REQUIRE(dev6.memcpy_d2h_async(c[0].s, back.data(), c[0].buf[0], bytes).ok());
  rt::Event read;
  REQUIRE(dev6.create_event(&read).ok());
  REQUIRE(dev6.record_event(read, c[0].s).ok());
  poll(dev6, read);
  const auto copies6 = dev6.copy_records();
  REQUIRE(!copies6.empty());
  const rt::CopyRecord& copy = copies6.back();
  REQUIRE(copy.kind == rt::OpKind::memcpy_d2h);
  const uint64_t copy_end = copy.start_cycle + copy.cycles;
  REQUIRE(timeline(7) < copy.start_cycle);
  kernels(c[1], 1);
  REQUIRE(dev7.synchronize_stream(c[1].s).ok());
  const rt::LaunchRecord after_poll = last_launch(dev7);
  CHECK(after_poll.start_cycle + 1 >= copy_end);  // the copy's cycles are rounded up
  CHECK(after_poll.start_cycle <= copy_end + 1 + after_poll.host_dispatch_cycles);

  // A completion without a read-back (kernels, then an event the host polls) tells the host
  // nothing: chip 7's next kernel starts where chip 7 stands, long before chip 6's end.
  const uint64_t stand7 = timeline(7);
  kernels(c[0], 6);
  rt::Event computed;
  REQUIRE(dev6.create_event(&computed).ok());
  REQUIRE(dev6.record_event(computed, c[0].s).ok());
  poll(dev6, computed);
  kernels(c[1], 1);
  REQUIRE(dev7.synchronize_stream(c[1].s).ok());
  const rt::LaunchRecord independent = last_launch(dev7);
  CHECK(independent.start_cycle - stand7 <= 1 + independent.host_dispatch_cycles);
  CHECK(independent.start_cycle < timeline(6));

  REQUIRE(dev6.synchronize_stream(c[0].s).ok());
  CHECK(dev6.destroy_event(read).ok());
  CHECK(dev6.destroy_event(computed).ok());
  for (const Rank& r : c) close_rank(r);
}

TEST_CASE("a copy timed by its data starts when its source was written, beside the compute") {
  // As TensorFlow reads a result back: the copy stream waits for everything queued on the
  // compute stream, then copies the first kernel's output. Timed by its stream, the copy starts
  // after the last kernel queued before it (how far the host had queued); timed by its data,
  // when the first kernel ended, and the compute timeline goes on without it.
  rt::Device& dev = *chips()[4];
  const uint64_t n = 8192, bytes = n * 2;
  const auto x = test::random_f16(n, 5), y = test::random_f16(n, 6);
  const auto program = test::load_kernel("kernels/vadd_f16.s");
  const int blocks = dev.config().core_kind(isa::CoreKind::AIV)->count;
  uint64_t bx = 0, by = 0, z1 = 0, z2 = 0;
  for (uint64_t* p : {&bx, &by, &z1, &z2}) REQUIRE(dev.malloc(bytes, p).ok());
  REQUIRE(dev.memcpy_h2d(bx, x.data(), bytes).ok());
  REQUIRE(dev.memcpy_h2d(by, y.data(), bytes).ok());
  rt::Stream compute, copies;
  REQUIRE(dev.create_stream(&compute).ok());
  REQUIRE(dev.create_stream(&copies).ok());
  rt::Event written, read;
  REQUIRE(dev.create_event(&written).ok());
  REQUIRE(dev.create_event(&read).ok());
  struct Run {
    std::vector<rt::LaunchRecord> launches;  // z1 = x + y, z2 twice, then one after the copy
    rt::CopyRecord copy;
    double written_to_read_us = 0;
    std::vector<uint16_t> host;
  };
  auto run = [&](rt::CopyTiming timing) {
    Run r;
    r.host.assign(n, 0);
    dev.clear_launch_records();
    REQUIRE(dev.launch_kernel(compute, program, {bx, by, z1, n}, blocks).ok());
    REQUIRE(dev.record_event(written, compute).ok());
    REQUIRE(dev.launch_kernel(compute, program, {bx, by, z2, n}, blocks).ok());
    REQUIRE(dev.launch_kernel(compute, program, {z2, by, z2, n}, blocks).ok());
    REQUIRE(dev.stream_wait_stream(copies, compute).ok());
    REQUIRE(dev.memcpy_d2h_async(copies, r.host.data(), z1, bytes, timing).ok());
    REQUIRE(dev.record_event(read, copies).ok());
    // Queued before the host waits for the read (after it, the host clock holds it back).
    REQUIRE(dev.launch_kernel(compute, program, {z2, bx, z2, n}, blocks).ok());
    REQUIRE(dev.synchronize_stream(copies).ok());
    REQUIRE(dev.synchronize_stream(compute).ok());
    r.launches = dev.launch_records();
    r.copy = dev.copy_records().back();
    REQUIRE(dev.event_elapsed_us(written, read, &r.written_to_read_us).ok());
    return r;
  };
  const Run by_stream = run(rt::CopyTiming::stream), by_data = run(rt::CopyTiming::data);
  std::vector<uint16_t> z1_now(n);
  REQUIRE(dev.memcpy_d2h(z1_now.data(), z1, bytes).ok());
  CHECK(by_data.host == z1_now);  // the copy still read what the first kernel wrote
  CHECK(by_stream.host == z1_now);
  for (const Run* r : {&by_stream, &by_data}) {
    REQUIRE(r->launches.size() == 4);
    REQUIRE(r->copy.kind == rt::OpKind::memcpy_d2h);
  }
  auto end = [](const rt::LaunchRecord& l) { return l.start_cycle + l.cycles; };
  // By its stream: after the third kernel, holding the chip's timeline (the fourth kernel runs
  // before or after it, as the driver gets them).
  CHECK(by_stream.copy.start_cycle >= end(by_stream.launches[2]));
  // By its data: at the first kernel's end (on the next clock edge), before the third kernel
  // even starts; the fourth kernel follows the third, not the copy; the record after the copy
  // stamps the copy's end.
  const rt::LaunchRecord* l = by_data.launches.data();
  CHECK(by_data.copy.start_cycle - end(l[0]) <= 1);
  CHECK(by_data.copy.start_cycle < l[2].start_cycle);
  CHECK(l[3].start_cycle - end(l[2]) <= 1);
  CHECK(by_data.copy.cycles == by_stream.copy.cycles);
  const double copy_us =
      dev.config().cycles_to_us(double(by_data.copy.start_cycle + by_data.copy.cycles - end(l[0])));
  CHECK(std::abs(by_data.written_to_read_us - copy_us) <= dev.config().cycles_to_us(2.0));

  CHECK(dev.destroy_event(written).ok());
  CHECK(dev.destroy_event(read).ok());
  CHECK(dev.destroy_stream(compute).ok());
  CHECK(dev.destroy_stream(copies).ok());
  for (uint64_t p : {bx, by, z1, z2}) CHECK(dev.free(p).ok());
}

TEST_CASE(
    "an input copy timed by its data runs beside the compute: whether the host queued it before "
    "or after an independent kernel does not move that kernel, and its reader waits for its end") {
  // As TensorFlow copies a step's inputs in: its executor threads queue the copy before or after
  // an independent kernel, in an order of their own, then the host polls the copy's event and
  // queues the kernel that reads it. Timed by its stream the copy holds the chip's compute
  // timeline, so the independent kernel starts later when the driver got the copy first; timed
  // by its data the copy starts when the host queued it, beside the compute, and only its reader
  // waits for it. (Each order is made certain by polling the first op's event before queueing
  // the second: a completion without a read-back does not move the host clock.)
  // open_rank: x and y on the chip, outputs buf[0] and buf[1], a compute stream s and a copy
  // stream h.
  const uint64_t n = 8192, bytes = n * 2, in_n = 16 * n, in_bytes = in_n * 2;
  Rank c = open_rank(5, n, 7);
  rt::Device& dev = *c.dev;
  const auto input = test::random_f16(in_n, 9);
  const auto program = test::load_kernel("kernels/vadd_f16.s");
  const int blocks = dev.config().core_kind(isa::CoreKind::AIV)->count;
  uint64_t bin = 0;
  REQUIRE(dev.malloc(in_bytes, &bin).ok());
  const uint64_t bx = c.x_at, by = c.y_at, z1 = c.buf[0], z2 = c.buf[1];
  const rt::Stream compute = c.s, copies = c.h;
  rt::Event copied, computed;
  REQUIRE(dev.create_event(&copied).ok());
  REQUIRE(dev.create_event(&computed).ok());
  auto poll = [&](rt::Event e) {  // until complete, as TensorFlow's event manager polls
    bool done = false;
    rt::Status st;
    do st = dev.query_event(e, &done);
    while (st.ok() && !done);
    REQUIRE(st.ok());
  };
  struct Run {
    uint64_t host = 0;  // the host clock when the run began
    uint64_t from = 0;  // where the chip could start then: the later of it and the timeline
    rt::LaunchRecord independent, reader;
    rt::CopyRecord copy;
  };
  auto run = [&](rt::CopyTiming timing, bool copy_first) {
    REQUIRE(dev.synchronize_device().ok());
    Run r;
    REQUIRE(dev.host_time_cycles(&r.host).ok());
    r.from = std::max(r.host, timeline(5));  // (earlier tests' reads moved the host clock)
    dev.clear_launch_records();
    auto copy_in = [&] {
      REQUIRE(dev.memcpy_h2d_async(copies, bin, input.data(), in_bytes, timing).ok());
      REQUIRE(dev.record_event(copied, copies).ok());
      poll(copied);
    };
    auto independent = [&] {
      REQUIRE(dev.launch_kernel(compute, program, {bx, by, z1, n}, blocks).ok());
      REQUIRE(dev.record_event(computed, compute).ok());
      poll(computed);
    };
    if (copy_first)
      copy_in(), independent();
    else
      independent(), copy_in();
    REQUIRE(dev.launch_kernel(compute, program, {bin, by, z2, n}, blocks).ok());
    REQUIRE(dev.synchronize_stream(compute).ok());
    const auto launches = dev.launch_records();
    REQUIRE(launches.size() == 2);
    r.independent = launches[0];
    r.reader = launches[1];
    r.copy = dev.copy_records().back();
    REQUIRE(r.copy.kind == rt::OpKind::memcpy_h2d);
    return r;
  };
  auto end = [](const auto& rec) { return rec.start_cycle + rec.cycles; };
  auto offset = [](const Run& r, uint64_t cycle) { return int64_t(cycle) - int64_t(r.from); };
  const Run stream_first = run(rt::CopyTiming::stream, true),
            stream_after = run(rt::CopyTiming::stream, false);
  const Run data_first = run(rt::CopyTiming::data, true),
            data_after = run(rt::CopyTiming::data, false);

  // The reader computed input + y from the copied bytes.
  std::vector<uint16_t> z2_now(n);
  REQUIRE(dev.memcpy_d2h(z2_now.data(), z2, bytes).ok());
  CHECK(z2_now ==
        test::reference_add_f16(std::vector<uint16_t>(input.begin(), input.begin() + n), c.y));

  // By its stream: got first, the copy holds the timeline and the independent kernel follows
  // it; got after, the kernel starts at once.
  const int64_t at_once = offset(stream_after, stream_after.independent.start_cycle);
  CHECK(at_once <= int64_t(1 + stream_after.independent.host_dispatch_cycles));
  CHECK(offset(stream_first, stream_first.independent.start_cycle) >=
        at_once + int64_t(stream_first.copy.cycles));
  // By its data: the independent kernel starts at once in both orders; the copy when the host
  // queued it; the reader at the copy's end, which outlasts the independent kernel.
  for (const Run* r : {&data_first, &data_after}) {
    CHECK(r->copy.cycles == stream_first.copy.cycles);
    CHECK(offset(*r, r->independent.start_cycle) == at_once);
    CHECK(r->copy.start_cycle - r->host <= 1);
    REQUIRE(end(r->copy) > end(r->independent));
    CHECK(r->reader.start_cycle >= end(r->copy));
    CHECK(r->reader.start_cycle - end(r->copy) <= 1 + r->reader.host_dispatch_cycles);
  }
  CHECK(offset(data_first, data_first.reader.start_cycle) ==
        offset(data_after, data_after.reader.start_cycle));

  CHECK(dev.destroy_event(copied).ok());
  CHECK(dev.destroy_event(computed).ok());
  CHECK(dev.free(bin).ok());
  close_rank(c);
}
