// Timing-only mode (opts.functional = false) gives the same cycles and counters as a functional
// run, and moves device memory's write epochs as it does. SystemC elaborates one chip per
// process, so each mode runs in a forked child process that reports its results as JSON; this
// process never constructs a Simulator itself.
#include <catch2/catch.hpp>

#include <string>

#include "common/numeric.h"
#include "isa/assembler.h"
#include "sim/config/chip_config.h"
#include "tests/common/child_process.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using nlohmann::json;
using npusim::test::launch;
using npusim::test::read_gm;
using npusim::test::write_gm;

namespace {

constexpr uint64_t kX = 0x1000000, kY = 0x2000000, kZ = 0x3000000, kScalar = 0x4000000;

// Runs the workload on a fresh chip in this (child) process.
json workload(bool functional) {
  SimOptions opts;
  opts.functional = functional;
  Simulator sim(load_chip_config("tiny"), opts);
  json out;
  auto record = [&](const char* name, const KernelResult& r) {
    out[name] = {{"ok", r.ok}, {"error", r.error}, {"cycles", r.cycles},
                 {"counters", r.counters}};
  };
  // Vector add over 3 blocks on the vector cores.
  const uint64_t n = 20000;
  std::vector<uint16_t> hx(n), hy(n);
  for (uint64_t i = 0; i < n; ++i) {
    hx[i] = f32_to_f16(static_cast<float>(i % 100));
    hy[i] = f32_to_f16(1.5f);
  }
  write_gm(sim, kX, hx);
  write_gm(sim, kY, hy);
  const isa::Program& vadd = test::repo_kernel("vadd_f16.s");
  const uint64_t epoch_before_vadd = sim.gm().advance_write_epoch();
  record("vadd", launch(sim, vadd, {kX, kY, kZ, n}, 3));
  out["z_written"] = sim.gm().last_write_epoch(kZ, 2 * n) > epoch_before_vadd;
  out["z_holds_data"] = sim.gm().holds_data(kZ, 2 * n);
  const uint64_t epoch_after_vadd = sim.gm().advance_write_epoch();
  auto hz = read_gm<uint16_t>(sim, kZ, n);
  bool vadd_correct = true;
  for (uint64_t i = 0; i < n; ++i)
    vadd_correct &= hz[i] == f32_to_f16(f16_to_f32(hx[i]) + f16_to_f32(hy[i]));
  out["vadd_correct"] = vadd_correct;
  // GEMM on the cube cores.
  const isa::Program& gemm = test::repo_kernel("gemm_f16.s");
  record("gemm", launch(sim, gemm, {kX, kY, kZ + 0x100000, 256, 256, 512}, 2));
  // Scalar ld/st: ld reads device memory in both modes (here a value the host wrote, which a
  // timing-only memory keeps; the loop's length depends on it), st leaves undefined bytes
  // (zeros) in timing-only mode.
  write_gm(sim, kScalar, std::vector<int64_t>{1234});
  isa::Program ldst = isa::assemble(R"(
.arg p
.section aiv
    ldarg x1, p
    ld x2, x1
    movi x4, 0
loop:
    add x4, x4, 1
    blt x4, x2, loop
    add x2, x2, 1
    add x3, x1, 8
    st x2, x3
    end
)", "ldst.s");
  record("ldst", launch(sim, ldst, {kScalar}, 1));
  out["st_value"] = read_gm<int64_t>(sim, kScalar + 8, 1)[0];
  // The bytes the vadd wrote: undefined in timing-only mode, yet stamped as written.
  out["z_written_since_gemm"] = sim.gm().last_write_epoch(kZ, 2 * n) > epoch_after_vadd;
  // A fault is a fault in both modes.
  isa::Program oob = isa::assemble(
      ".section aiv\n    movi x1, 0x40000\n    copy_ub2gm x1, x1, 1, 8, 0, 0\n    end\n", "oob.s");
  record("oob", launch(sim, oob, {}, 1));
  return out;
}

json run_in_child(bool functional) {
  return json::parse(test::run_in_child([functional] { return workload(functional).dump(); }));
}

}  // namespace

TEST_CASE("timing-only runs take exactly the cycles of functional runs") {
  const json f = run_in_child(true);
  const json t = run_in_child(false);
  for (const char* k : {"vadd", "gemm", "ldst"}) {
    INFO(k);
    CHECK(f[k]["ok"] == true);
    CHECK(t[k]["ok"] == true);
    CHECK(f[k]["cycles"] == t[k]["cycles"]);
    CHECK(f[k]["counters"] == t[k]["counters"]);
    CHECK(f[k]["cycles"].get<uint64_t>() > 0);
  }
  // The functional run computed; the timing-only run moved no data.
  CHECK(f["vadd_correct"] == true);
  CHECK(t["vadd_correct"] == false);
  CHECK(f["st_value"] == 1235);  // ld read 1234
  CHECK(t["st_value"] == 0);     // st left undefined bytes
  CHECK(t["ldst"]["cycles"].get<uint64_t>() > 1234);  // the loop ran 1234 times in both
  // Kernel writes move the write epochs in both modes; only the functional memory holds them.
  CHECK(f["z_written"] == true);
  CHECK(t["z_written"] == true);
  CHECK(f["z_holds_data"] == true);
  CHECK(t["z_holds_data"] == false);
  CHECK(f["z_written_since_gemm"] == t["z_written_since_gemm"]);
  // Faults come from plan(), which both modes run.
  CHECK(f["oob"]["ok"] == false);
  CHECK(f["oob"]["error"] == t["oob"]["error"]);
  CHECK(f["oob"]["cycles"] == t["oob"]["cycles"]);
}
