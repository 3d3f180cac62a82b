// Launch groups (rt::Device::launch_group) on the tiny chip (4 vector cores): two vadd_f16
// launches of 2 blocks each on separate buffers run at once (Simulator::run_concurrent): each
// output equals the fp16 reference and the launches' outputs run in sequence; both records start
// at the group's start, each lasting its own cycles, and the stream's next launch starts after
// the later of them; together they take less time than in sequence. Streams: each launch takes
// its cores when it is ready (take_cores_when_ready), the first free ones: a launch waiting for
// another (`after`) begins at its end on the cores it freed, while a launch it does not wait for
// runs beside both on the next core; a launch that finds fewer free cores than blocks begins on
// those and runs its blocks as cores free, and a later one begins on a core freed by the first's
// blocks, before the first's end; a launch with more blocks than the chip's cores of its kind
// runs them in waves, its cycles derived from one block's; an `after` naming no earlier launch
// and a launch the chip cannot run are refused when queued, naming the launch; a member's
// fault is the stream's kernel_fault naming its kernel while the other member still runs to its
// correct end.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include <fmt/format.h>

#include "tests/runtime/runtime_test_util.h"

using namespace npusim;
using rt::StatusCode;

namespace {

constexpr uint64_t kElements = 16384, kBytes = kElements * 2;

// Two independent sums on the device: x0 + y0 -> z0 and x1 + y1 -> z1.
struct TwoSums {
  std::shared_ptr<rt::Device> dev = test::tiny_device();
  std::shared_ptr<const isa::Program> vadd = test::load_kernel("kernels/vadd_f16.s");
  rt::Stream s;
  uint64_t x[2] = {}, y[2] = {}, z[2] = {};
  std::vector<uint16_t> hx[2], hy[2];

  TwoSums() {
    REQUIRE(dev->create_stream(&s).ok());
    for (int i = 0; i < 2; ++i) {
      hx[i] = test::random_f16(kElements, 11 + i);
      hy[i] = test::random_f16(kElements, 21 + i);
      for (uint64_t* p : {&x[i], &y[i], &z[i]}) REQUIRE(dev->malloc(kBytes, p).ok());
      REQUIRE(dev->memcpy_h2d(x[i], hx[i].data(), kBytes).ok());
      REQUIRE(dev->memcpy_h2d(y[i], hy[i].data(), kBytes).ok());
    }
  }
  ~TwoSums() {
    for (int i = 0; i < 2; ++i)
      for (uint64_t p : {x[i], y[i], z[i]}) CHECK(dev->free(p).ok());
  }
  rt::Device::GroupLaunch sum(int i, int blocks) const {
    return {vadd, {x[i], y[i], z[i], kElements}, blocks, nullptr, {}};
  }
  void check_outputs() {
    for (int i = 0; i < 2; ++i) {
      std::vector<uint16_t> out(kElements);
      REQUIRE(dev->memcpy_d2h(out.data(), z[i], kBytes).ok());
      CHECK(out == test::reference_add_f16(hx[i], hy[i]));
    }
  }
};

// The cores a launch's blocks ran on: those of its record's counters ("chip.<core>.").
std::set<std::string> cores_of(const rt::LaunchRecord& r) {
  std::set<std::string> cores;
  r.counter_delta.for_each([&](const CounterInfo& info, uint64_t) {
    const std::string prefix = "chip.";
    const size_t end = info.name.find('.', prefix.size());
    if (info.name.compare(0, prefix.size(), prefix) == 0 && end != std::string::npos &&
        info.name.compare(prefix.size(), 2, "ai") == 0)
      cores.insert(info.name.substr(prefix.size(), end - prefix.size()));
  });
  return cores;
}

}  // namespace

TEST_CASE("a launch group runs its launches at once: same start, own cycles, shorter than in "
          "sequence") {
  TwoSums t;
  t.dev->clear_launch_records();
  // In sequence, each on 2 of the 4 vector cores.
  for (int i = 0; i < 2; ++i) {
    const rt::Device::GroupLaunch l = t.sum(i, 2);
    REQUIRE(t.dev->launch_kernel(t.s, l.program, l.args, l.block_dim).ok());
  }
  REQUIRE(t.dev->synchronize_stream(t.s).ok());
  t.check_outputs();
  for (uint64_t z : t.z) REQUIRE(t.dev->memset8(z, 0, kBytes).ok());
  // The same two as a group, then one more launch on the stream.
  REQUIRE(t.dev->launch_group(t.s, {t.sum(0, 2), t.sum(1, 2)}).ok());
  const rt::Device::GroupLaunch after = t.sum(0, 4);
  REQUIRE(t.dev->launch_kernel(t.s, after.program, after.args, after.block_dim).ok());
  REQUIRE(t.dev->synchronize_stream(t.s).ok());
  t.check_outputs();

  const std::vector<rt::LaunchRecord> r = t.dev->launch_records();
  REQUIRE(r.size() == 5);
  for (const rt::LaunchRecord& rec : r) CHECK(rec.ok);
  // In sequence: the second starts after the first's end.
  CHECK(r[1].start_cycle >= r[0].start_cycle + r[0].cycles);
  const uint64_t sequence = r[1].start_cycle + r[1].cycles - r[0].start_cycle;
  // The group: one start, each its own duration, the next launch after the later end.
  CHECK(r[2].start_cycle == r[3].start_cycle);
  CHECK(r[2].cycles > 0);
  CHECK(r[3].cycles > 0);
  CHECK(!r[2].replayed);
  CHECK(!r[3].replayed);
  const uint64_t group_end = std::max(r[2].start_cycle + r[2].cycles,
                                      r[3].start_cycle + r[3].cycles);
  CHECK(r[4].start_cycle >= group_end);
  CHECK(group_end - r[2].start_cycle < sequence);
  CHECK(r[2].index + 1 == r[3].index);
}

TEST_CASE("a launch waiting for another begins at its end on its cores; one beside runs on") {
  TwoSums t;
  uint64_t w = 0;
  REQUIRE(t.dev->malloc(kBytes, &w).ok());
  // chain: z0 = x0 + y0, then z1 = z0 + y1 (after it); beside both, on one core (twice as
  // long): w = x1 + y1.
  const rt::Device::GroupLaunch first = t.sum(0, 2);
  const rt::Device::GroupLaunch second{t.vadd, {t.z[0], t.y[1], t.z[1], kElements}, 2, nullptr,
                                       {0}};
  const rt::Device::GroupLaunch beside{t.vadd, {t.x[1], t.y[1], w, kElements}, 1, nullptr, {}};
  t.dev->clear_launch_records();
  REQUIRE(t.dev->launch_group(t.s, {first, second, beside}).ok());
  REQUIRE(t.dev->synchronize_stream(t.s).ok());
  std::vector<uint16_t> out(kElements);
  REQUIRE(t.dev->memcpy_d2h(out.data(), t.z[1], kBytes).ok());
  CHECK(out == test::reference_add_f16(test::reference_add_f16(t.hx[0], t.hy[0]), t.hy[1]));
  REQUIRE(t.dev->memcpy_d2h(out.data(), w, kBytes).ok());
  CHECK(out == test::reference_add_f16(t.hx[1], t.hy[1]));
  const std::vector<rt::LaunchRecord> r = t.dev->launch_records();
  REQUIRE(r.size() == 3);
  for (const rt::LaunchRecord& rec : r) CHECK(rec.ok);
  // Starts are whole cycles rounded down, durations rounded up: one cycle apart at most.
  CHECK(r[1].start_cycle + 1 >= r[0].start_cycle + r[0].cycles);
  CHECK(r[2].start_cycle == r[0].start_cycle);
  CHECK(r[2].start_cycle + r[2].cycles > r[1].start_cycle);  // beside the second as well
  // The cores, first free in core order when each is ready: the chain's second launch takes
  // those its first freed, the one beside the next.
  CHECK(cores_of(r[0]) == std::set<std::string>{"aiv0", "aiv1"});
  CHECK(cores_of(r[1]) == cores_of(r[0]));
  CHECK(cores_of(r[2]) == std::set<std::string>{"aiv2"});
  CHECK(t.dev->free(w).ok());
}

TEST_CASE("a launch that finds too few free cores begins on those; a later one takes a core "
          "as one frees") {
  TwoSums t;
  uint64_t w = 0;
  REQUIRE(t.dev->malloc(kBytes, &w).ok());
  // 3 of the 4 cores, then 2 blocks (one core free: it begins there at once, its second block
  // on the next core to free), then 1 (no core free: it waits for one of the first's).
  const rt::Device::GroupLaunch third{t.vadd, {t.x[1], t.y[1], w, kElements}, 1, nullptr, {}};
  t.dev->clear_launch_records();
  REQUIRE(t.dev->launch_group(t.s, {t.sum(0, 3), t.sum(1, 2), third}).ok());
  REQUIRE(t.dev->synchronize_stream(t.s).ok());
  t.check_outputs();
  std::vector<uint16_t> out(kElements);
  REQUIRE(t.dev->memcpy_d2h(out.data(), w, kBytes).ok());
  CHECK(out == test::reference_add_f16(t.hx[1], t.hy[1]));
  const std::vector<rt::LaunchRecord> r = t.dev->launch_records();
  REQUIRE(r.size() == 3);
  for (const rt::LaunchRecord& rec : r) CHECK(rec.ok);
  const std::set<std::string> first{"aiv0", "aiv1", "aiv2"};
  CHECK(cores_of(r[0]) == first);
  CHECK(r[1].start_cycle == r[0].start_cycle);  // on aiv3, the free core
  const std::set<std::string> second = cores_of(r[1]);
  CHECK(second.count("aiv3") == 1);
  CHECK(second.size() == 2);  // its other block on a core the first freed
  for (const std::string& c : second) CHECK((c == "aiv3" || first.count(c) == 1));
  // The third begins on a core the first's blocks freed, before the first's completion ends.
  const std::set<std::string> third_cores = cores_of(r[2]);
  REQUIRE(third_cores.size() == 1);
  CHECK(first.count(*third_cores.begin()) == 1);
  CHECK(r[2].start_cycle > r[0].start_cycle);
  CHECK(r[2].start_cycle < r[0].start_cycle + r[0].cycles);
  CHECK(t.dev->free(w).ok());
}

TEST_CASE("a launch group whose launch waits for no earlier launch is refused, naming it") {
  TwoSums t;
  rt::Device::GroupLaunch second = t.sum(1, 2);
  second.after = {1};
  const rt::Status st = t.dev->launch_group(t.s, {t.sum(0, 2), second});
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(),
             Catch::Contains("launch 1 (kernel 'vadd_f16') waits for launch 1, which is not "
                             "earlier"));
  CHECK(t.dev->synchronize_stream(t.s).ok());  // nothing was queued
}

namespace {

// A vector kernel whose every block spins `n` iterations of the scalar unit: no memory, so a
// block takes the same cycles on any core, beside any launch.
std::shared_ptr<const isa::Program> spin(int n) {
  return test::assemble_text(fmt::format(".kernel spin_{0}\n.section aiv\n    movi x4, 0\nloop:\n"
                                         "    add x4, x4, 1\n    blt x4, {0}, loop\n    end\n",
                                         n),
                             fmt::format("spin_{}.s", n));
}

// The overheads in the duration of a launch whose worker that ended last ran `blocks` blocks
// (docs/chip_model.md): dispatch + blocks x block start + done, in cycles.
uint64_t task_overhead(const ChipConfig& cfg, uint64_t blocks) {
  const auto cycles = [&](double us) { return static_cast<uint64_t>(std::llround(us * cfg.clock_mhz)); };
  return cycles(cfg.task_dispatch_us) + blocks * static_cast<uint64_t>(cfg.task_block_start_cycles) +
         cycles(cfg.task_done_us);
}

}  // namespace

TEST_CASE("a launch group's member with more blocks than the chip's cores runs in waves") {
  // 10 blocks of a spin kernel on the tiny chip's 4 vector cores: 3 waves (4, 4, 2), the core
  // that ends last runs 3 blocks, so the member lasts the task overheads of 3 blocks plus 3
  // blocks' cycles (one block's: a lone launch of one block less its overheads); a second
  // member waiting for it begins at its end.
  std::shared_ptr<rt::Device> dev = test::tiny_device();
  const ChipConfig& cfg = dev->config();
  REQUIRE(cfg.core_kind(isa::CoreKind::AIV)->count == 4);
  const std::shared_ptr<const isa::Program> p = spin(200);
  rt::Stream s;
  REQUIRE(dev->create_stream(&s).ok());
  dev->clear_launch_records();
  REQUIRE(dev->launch_kernel(s, p, {}, 1).ok());
  REQUIRE(dev->launch_group(s, {{p, {}, 10, nullptr, {}}, {p, {}, 1, nullptr, {0}}}).ok());
  REQUIRE(dev->synchronize_stream(s).ok());
  const std::vector<rt::LaunchRecord> r = dev->launch_records();
  REQUIRE(r.size() == 3);
  for (const rt::LaunchRecord& rec : r) REQUIRE(rec.ok);
  const uint64_t block = r[0].cycles - task_overhead(cfg, 1);
  const uint64_t waves = task_overhead(cfg, 3) + 3 * block;
  // Durations are whole cycles rounded up: one cycle apart at most.
  CHECK(r[1].cycles + 1 >= waves);
  CHECK(r[1].cycles <= waves + 1);
  CHECK(cores_of(r[1]) == std::set<std::string>{"aiv0", "aiv1", "aiv2", "aiv3"});
  CHECK(r[2].start_cycle + 1 >= r[1].start_cycle + r[1].cycles);
  CHECK(r[2].cycles + 1 >= task_overhead(cfg, 1) + block);
  CHECK(r[2].cycles <= task_overhead(cfg, 1) + block + 1);
}

TEST_CASE("a launch group whose launch the chip cannot run is refused, naming it") {
  TwoSums t;
  // A mix kernel declaring 3 vector cores per cube core: the tiny chip has 2.
  const auto wide = test::assemble_text(
      ".kernel wide\n.aiv_per_aic 3\n.section aic\n    end\n.section aiv\n    end\n",
      "wide.s");
  rt::Status st = t.dev->launch_group(t.s, {t.sum(0, 2), {wide, {}, 1, nullptr, {}}});
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(),
             Catch::Contains("launch 1 (kernel 'wide', block_dim 1) cannot run: kernel 'wide' "
                             "declares 3 vector core(s) per cube core (.aiv_per_aic); chip "
                             "'tiny' has 2"));
  // A coupled core's section on the split chip: the verifier refuses it, naming the kernel.
  const auto coupled =
      test::assemble_text(".kernel coupled\n.section aicore\n    end\n", "coupled.s");
  st = t.dev->launch_group(t.s, {t.sum(0, 2), {coupled, {}, 1, nullptr, {}}});
  CHECK(st.code() == StatusCode::invalid_argument);
  CHECK_THAT(st.message(), Catch::Contains("kernel 'coupled' fails verification on chip 'tiny'"));
  CHECK(t.dev->synchronize_stream(t.s).ok());  // nothing was queued
}

TEST_CASE("a fault in one launch of a group is the stream's kernel_fault; the other runs on") {
  TwoSums t;
  auto fault = test::ub_overrun_kernel();  // faults on a UB address past the UB
  const uint64_t ub_bytes =
      t.dev->config().core_kind(isa::CoreKind::AIV)->capacity(isa::Buf::UB);
  REQUIRE(t.dev->launch_group(t.s, {{fault, {ub_bytes, t.x[1]}, 1, nullptr, {}}, t.sum(0, 2)}).ok());
  const rt::Status st = t.dev->synchronize_stream(t.s);
  CHECK(st.code() == StatusCode::kernel_fault);
  CHECK_THAT(st.message(), Catch::Contains("kernel 'ub_overrun'"));
  std::vector<uint16_t> out(kElements);
  REQUIRE(t.dev->memcpy_d2h(out.data(), t.z[0], kBytes).ok());
  CHECK(out == test::reference_add_f16(t.hx[0], t.hy[0]));
}
