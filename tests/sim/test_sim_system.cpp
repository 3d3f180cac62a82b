// The multi-chip system (tiny-x8: two servers of four tiny chips) in one process: links,
// kernels on several chips, and every collective against a reference computed here element by
// element on 2, 4 and 8 chips, each dtype, with the ring all-reduce's time derived from the
// link config.
#include <catch2/catch.hpp>

#include <cmath>

#include "common/numeric.h"
#include "isa/assembler.h"
#include "sim/collective/collective.h"
#include "sim/config/system_config.h"
#include "sim/system/system_simulator.h"
#include "sim_test_util.h"

using namespace npusim;
using isa::Dtype;

namespace {

SystemSimulator& sys() {
  static SystemSimulator s(load_system_config("tiny-x8"), SimOptions{});
  return s;
}

// Cycles a transfer of `bytes` over one link direction of `gbps` takes after `lat_us`, at the
// chip's clock (bytes per cycle = gbps x 1000 / clock_mhz), rounded up to whole cycles (every
// step starts on a clock edge). Simulated time resolves 1/1000 cycle.
uint64_t step_cycles(uint64_t bytes, double gbps, double lat_us) {
  const double mhz = sys().config().chip.clock_mhz;
  const uint64_t lat_millicycles = static_cast<uint64_t>(std::llround(lat_us * mhz * 1e3));
  const uint64_t move_millicycles =
      static_cast<uint64_t>(std::ceil(static_cast<double>(bytes) / (gbps * 1e3 / mhz) * 1e3));
  return (lat_millicycles + move_millicycles + 999) / 1000;
}

// Element values as doubles, and back, for the types under test.
double get(Dtype t, const std::vector<uint8_t>& b, size_t i) {
  switch (t) {
    case Dtype::F32: {
      float v;
      std::memcpy(&v, &b[4 * i], 4);
      return v;
    }
    case Dtype::S32: {
      int32_t v;
      std::memcpy(&v, &b[4 * i], 4);
      return v;
    }
    case Dtype::F16: {
      uint16_t v;
      std::memcpy(&v, &b[2 * i], 2);
      return f16_to_f32(v);
    }
    default: {
      uint16_t v;
      std::memcpy(&v, &b[2 * i], 2);
      return bf16_to_f32(v);
    }
  }
}
double combine(ReduceOp op, double a, double b) {
  switch (op) {
    case ReduceOp::sum: return a + b;
    case ReduceOp::prod: return a * b;
    case ReduceOp::max: return std::max(a, b);
    default: return std::min(a, b);
  }
}

constexpr uint64_t kSend = 0x100000, kRecv = 0x4000000;

// Runs `call` on random inputs and checks every rank's output against the reference.
CollectiveResult check_collective(CollectiveCall call) {
  SystemSimulator& s = sys();
  const int n = static_cast<int>(call.chips.size());
  const uint32_t seed =
      static_cast<uint32_t>(call.count * 31 + n * 7 + static_cast<int>(call.kind)) * 100;
  call.send.assign(n, kSend);
  call.recv.assign(n, kRecv);
  const size_t es = static_cast<size_t>(isa::dtype_size(call.dtype));
  const size_t in_elems = collective_send_bytes(call) / es,
               out_elems = collective_recv_bytes(call) / es;
  std::vector<std::vector<uint8_t>> in(n);
  for (int r = 0; r < n; ++r) {
    in[r] = exact_reduction_inputs(call.dtype, call.op, in_elems, seed + r);
    s.gm(call.chips[r]).write(kSend, in[r].data(), in[r].size());
    std::vector<uint8_t> junk(out_elems * es, 0xa5);
    s.gm(call.chips[r]).write(kRecv, junk.data(), junk.size());
  }
  const CollectiveResult res = run_collective(s, call);
  const uint64_t c = call.count;
  for (int r = 0; r < n; ++r) {
    if (call.kind == CollectiveKind::send_recv && r != 1) continue;
    std::vector<uint8_t> out(out_elems * es);
    s.gm(call.chips[r]).read(kRecv, out.data(), out.size());
    for (size_t i = 0; i < out_elems; ++i) {
      double want = 0;
      switch (call.kind) {
        case CollectiveKind::all_reduce:
        case CollectiveKind::reduce_scatter: {
          const size_t at = call.kind == CollectiveKind::all_reduce ? i : r * c + i;
          want = get(call.dtype, in[0], at);
          for (int q = 1; q < n; ++q) want = combine(call.op, want, get(call.dtype, in[q], at));
          break;
        }
        case CollectiveKind::all_gather: want = get(call.dtype, in[i / c], i % c); break;
        case CollectiveKind::broadcast: want = get(call.dtype, in[call.root], i); break;
        case CollectiveKind::all_to_all: want = get(call.dtype, in[i / c], r * c + i % c); break;
        case CollectiveKind::send_recv: want = get(call.dtype, in[0], i); break;
      }
      INFO(collective_name(call.kind)
           << " " << reduce_op_name(call.op) << " " << isa::dtype_name(call.dtype) << " on " << n
           << " chips (" << res.algorithm << "), rank " << r << " element " << i);
      REQUIRE(get(call.dtype, out, i) == want);
    }
  }
  return res;
}

std::vector<int> first_chips(int n) {
  std::vector<int> v(n);
  for (int i = 0; i < n; ++i) v[i] = i;
  return v;
}

}  // namespace

TEST_CASE("a link direction is shared by the transfers that cross it", "[system]") {
  SystemSimulator& s = sys();
  const SystemConfig& cfg = s.config();
  const uint64_t bytes = 1 << 20;
  std::vector<uint8_t> a(bytes), b(bytes);
  for (size_t i = 0; i < bytes; ++i)
    a[i] = static_cast<uint8_t>(i * 7), b[i] = static_cast<uint8_t>(i * 13);
  s.gm(0).write(kSend, a.data(), bytes);
  s.gm(0).write(kSend + bytes, b.data(), bytes);
  // Two copies 0 -> 1 share the one link: each moves at half its bandwidth.
  PeerCopyResult shared =
      s.copy_peer({{0, kSend, 1, kRecv, bytes}, {0, kSend + bytes, 1, kRecv + bytes, bytes}});
  CHECK(shared.cycles == step_cycles(2 * bytes, cfg.link.gbps, cfg.link.latency_us));
  // 0 -> 1 and 0 -> 2 take different links of the mesh: no sharing.
  PeerCopyResult apart =
      s.copy_peer({{0, kSend, 1, kRecv, bytes}, {0, kSend + bytes, 2, kRecv, bytes}});
  CHECK(apart.cycles == step_cycles(bytes, cfg.link.gbps, cfg.link.latency_us));
  // Between servers: NIC out, switch, NIC in.
  PeerCopyResult remote = s.copy_peer({{0, kSend, 5, kRecv, bytes}});
  CHECK(remote.cycles ==
        step_cycles(bytes, cfg.nic.gbps, cfg.nic.latency_us + cfg.switch_latency_us));
  std::vector<uint8_t> got(bytes);
  s.gm(1).read(kRecv + bytes, got.data(), bytes);
  CHECK(got == b);
  s.gm(5).read(kRecv, got.data(), bytes);
  CHECK(got == a);
  CHECK_THROWS_WITH(s.copy_peer({{0, kSend, 1, kRecv, 64}, {2, kSend, 2, kRecv, 64}}),
                    Catch::Contains("no route from chip 2 to chip 2"));
  CHECK(s.copy_peer({{0, kSend, 1, kRecv, 64}}).cycles > 0);  // nothing left behind
  CHECK_THROWS_WITH(s.gm(8),
                    Catch::Contains("chip 8 does not exist") && Catch::Contains("8 chips"));
}

TEST_CASE("kernels run on several chips at once", "[system]") {
  SystemSimulator& s = sys();
  const isa::Program& p = test::repo_kernel("vadd_f16.s");
  const uint64_t n = 4096;
  std::vector<ChipLaunch> launches;
  for (int chip : {2, 6}) {
    std::vector<uint16_t> x(n), y(n);
    for (uint64_t i = 0; i < n; ++i)
      x[i] = f32_to_f16(float(i % 50 + chip)), y[i] = f32_to_f16(1.0f);
    s.gm(chip).write(kSend, x.data(), 2 * n);
    s.gm(chip).write(kSend + 2 * n, y.data(), 2 * n);
    launches.push_back({chip, test::kernel_launch(p, {kSend, kSend + 2 * n, kRecv, n}, 4)});
  }
  const uint64_t before = s.now_cycles();
  std::vector<KernelResult> r = s.run(launches);
  REQUIRE(r[0].ok);
  REQUIRE(r[1].ok);
  CHECK(r[0].start_cycle == r[1].start_cycle);  // concurrent, not one after the other
  CHECK(r[0].cycles == r[1].cycles);
  CHECK(s.now_cycles() - before < r[0].cycles + r[1].cycles);
  for (int chip : {2, 6}) {
    std::vector<uint16_t> z(n);
    s.gm(chip).read(kRecv, z.data(), 2 * n);
    for (uint64_t i = 0; i < n; ++i) REQUIRE(f16_to_f32(z[i]) == float(i % 50 + chip + 1));
  }
}

TEST_CASE("every collective matches the reference on 2, 4 and 8 chips, each dtype",
          "[collective]") {
  const Dtype dtypes[] = {Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::S32};
  for (int n : {2, 4, 8}) {
    for (Dtype t : dtypes) {
      for (CollectiveKind k : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter}) {
        for (ReduceOp op : {ReduceOp::sum, ReduceOp::prod, ReduceOp::max, ReduceOp::min}) {
          CollectiveCall c;
          c.kind = k;
          c.chips = first_chips(n);
          c.count = 37;  // blocks of unequal size
          c.dtype = t;
          c.op = op;
          check_collective(c);
        }
      }
      for (CollectiveKind k :
           {CollectiveKind::all_gather, CollectiveKind::broadcast, CollectiveKind::all_to_all}) {
        CollectiveCall c;
        c.kind = k;
        c.chips = first_chips(n);
        c.count = 21;
        c.dtype = t;
        c.root = n - 1;
        check_collective(c);
      }
    }
  }
  CollectiveCall sr;
  sr.kind = CollectiveKind::send_recv;
  sr.chips = {3, 6};
  sr.count = 100;
  CHECK(check_collective(sr).algorithm == "direct");
}

TEST_CASE("each algorithm computes the same results", "[collective]") {
  for (CollectiveAlgo a :
       {CollectiveAlgo::mesh, CollectiveAlgo::ring, CollectiveAlgo::halving_doubling}) {
    for (int n : {2, 4, 8}) {
      if (a == CollectiveAlgo::mesh && n == 8) continue;  // two servers: no mesh
      for (CollectiveKind k : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                               CollectiveKind::all_gather, CollectiveKind::broadcast}) {
        CollectiveCall c;
        c.kind = k;
        c.chips = first_chips(n);
        c.count = 1000;
        c.algo = a;
        c.root = 1;
        CHECK(check_collective(c).algorithm == collective_algo_name(a));
      }
    }
  }
  for (CollectiveAlgo a : {CollectiveAlgo::mesh_ring, CollectiveAlgo::mesh_halving_doubling}) {
    CollectiveCall c;
    c.chips = first_chips(8);  // two servers of four
    c.count = 1001;
    c.algo = a;
    c.dtype = Dtype::BF16;
    c.op = ReduceOp::max;
    CHECK(check_collective(c).algorithm == collective_algo_name(a));
    c.chips = {4, 1, 6, 3};  // two servers of two, ranks interleaved
    CHECK(check_collective(c).algorithm == collective_algo_name(a));
  }
  CollectiveCall c;
  c.chips = first_chips(4);
  c.count = 64;
  CHECK(check_collective(c).algorithm == "mesh");  // one full-mesh server: HCCL's Mesh
  c.chips = first_chips(8);
  CHECK(check_collective(c).algorithm == "mesh_ring");  // across servers: level 0 + level 1
  c.kind = CollectiveKind::all_gather;
  CHECK(check_collective(c).algorithm == "ring");  // flat across servers
}

TEST_CASE("hierarchical all-reduce time follows from the link and NIC config", "[collective]") {
  SystemSimulator& s = sys();
  const SystemConfig& cfg = s.config();
  CollectiveCall c;
  c.chips = first_chips(8);
  c.send.assign(8, kSend);
  c.recv.assign(8, kSend);
  c.count = 1 << 20;                       // 4 MiB of f32
  const uint64_t block = c.count * 4 / 4;  // level 0: 4 chips per server
  // Level 0 mesh reduce-scatter and all-gather: each rank sends a block to each of its 3 peers,
  // every link its own; level 1 ring over 2 servers: one step each way, half a block per NIC.
  const uint64_t level0 = step_cycles(block, cfg.link.gbps, cfg.link.latency_us);
  const uint64_t level1 =
      step_cycles(block / 2, cfg.nic.gbps, cfg.nic.latency_us + cfg.switch_latency_us);
  const CollectiveResult r = run_collective(s, c);
  CHECK(r.algorithm == "mesh_ring");
  CHECK(r.steps == 4);
  CHECK(r.cycles == 2 * level0 + 2 * level1);
}

TEST_CASE("ring all-reduce time follows from the link config", "[collective]") {
  SystemSimulator& s = sys();
  const SystemConfig& cfg = s.config();
  CollectiveCall c;
  c.chips = first_chips(4);  // one server: each rank sends to the next over its own link
  c.send.assign(4, kSend);
  c.recv.assign(4, kSend);  // in place
  c.count = 1 << 20;        // 4 MiB of f32: blocks of 1 MiB
  c.algo = CollectiveAlgo::ring;
  const uint64_t block = c.count / 4 * 4;
  // 2 (n - 1) steps, each one block over one link after its latency; sum reduces inline.
  const uint64_t per_step = step_cycles(block, cfg.link.gbps, cfg.link.latency_us);
  CollectiveResult r = run_collective(s, c);
  CHECK(r.steps == 6);
  CHECK(r.inline_reduce);
  CHECK(r.cycles == 6 * per_step);
  CHECK(r.link_bytes == 6 * 4 * block);
  // prod is not reduced in the DMA: each of the 3 reduce-scatter steps adds a vector reduce of
  // one block on the receiving chips' AI vector cores (launch, then HBM-bound: 3 accesses per
  // byte).
  c.op = ReduceOp::prod;
  const ChipConfig& chip = cfg.chip;
  const double vec = double(block) / (chip.core_kinds[1].count * chip.vector_bytes_per_cycle);
  const double mem = 3.0 * double(block) / chip.hbm_sustained_bytes_per_cycle();
  const uint64_t reduce = static_cast<uint64_t>(
      std::ceil(cfg.reduce_kernel_launch_us * chip.clock_mhz + std::max(vec, mem)));
  r = run_collective(s, c);
  CHECK_FALSE(r.inline_reduce);
  CHECK(r.reduce_cycles == 3 * reduce);
  CHECK(r.cycles == 6 * per_step + 3 * reduce);
}

TEST_CASE("collective errors name what is wrong", "[collective]") {
  SystemSimulator& s = sys();
  CollectiveCall c;
  c.count = 16;
  c.chips = first_chips(8);
  c.chips.push_back(8);
  c.send.assign(9, kSend);
  c.recv.assign(9, kRecv);
  CHECK_THROWS_WITH(run_collective(s, c),
                    Catch::Contains("9 chips in the communicator") && Catch::Contains("has 8"));
  c.chips = {0, 1, 9};
  c.send.assign(3, kSend);
  c.recv.assign(3, kRecv);
  CHECK_THROWS_WITH(run_collective(s, c), Catch::Contains("chip 9 does not exist"));
  c.chips = {0, 1, 1};
  CHECK_THROWS_WITH(run_collective(s, c), Catch::Contains("chip 1 appears twice"));
  c.chips = {0, 1, 2, 3};
  CHECK_THROWS_WITH(run_collective(s, c),
                    Catch::Contains("3 send and 3 receive buffers for 4 chips"));
  c.send.assign(4, kSend);
  c.recv.assign(4, kRecv);
  c.rank_counts = {16, 16, 12, 16};  // replicas of different sizes
  CHECK_THROWS_WITH(run_collective(s, c), Catch::Contains("rank 2 (chip 2) has 12 elements"));
  c.rank_counts = {16, 16, 16, 16};
  CHECK_NOTHROW(run_collective(s, c));
  c.rank_counts.clear();
  c.recv.assign(4, s.gm(0).capacity() - 8);
  CHECK_THROWS_WITH(run_collective(s, c), Catch::Contains("rank 0 (chip 0): receive buffer") &&
                                              Catch::Contains("outside"));
  c.recv.assign(4, kRecv);
  c.chips = {0, 1, 2};
  c.send.assign(3, kSend);
  c.recv.assign(3, kRecv);
  c.algo = CollectiveAlgo::halving_doubling;
  CHECK_THROWS_WITH(run_collective(s, c), Catch::Contains("power-of-two"));
  c.chips = {0, 4};
  c.send.assign(2, kSend);
  c.recv.assign(2, kRecv);
  c.algo = CollectiveAlgo::mesh;
  CHECK_THROWS_WITH(run_collective(s, c),
                    Catch::Contains("mesh needs its chips inside one server"));
  c.algo = CollectiveAlgo::mesh_ring;
  c.kind = CollectiveKind::reduce_scatter;
  CHECK_THROWS_WITH(run_collective(s, c), Catch::Contains("hierarchical all_reduce only"));
  c.kind = CollectiveKind::all_reduce;
  c.chips = {0, 1};
  CHECK_THROWS_WITH(run_collective(s, c), Catch::Contains("2 or more full-mesh servers"));
  c.chips = {0, 1, 4};
  c.send.assign(3, kSend);
  c.recv.assign(3, kRecv);
  CHECK_THROWS_WITH(run_collective(s, c), Catch::Contains("as many in each"));
  c.send.assign(2, kSend);
  c.recv.assign(2, kRecv);
  c.chips = {0, 4};
  c.algo = CollectiveAlgo::automatic;
  c.dtype = Dtype::U8;
  CHECK_THROWS_WITH(run_collective(s, c), Catch::Contains("cannot reduce u8"));
  CHECK_THROWS_WITH(collective_algo_from_name("tree"), Catch::Contains("unknown algorithm 'tree'"));
}
