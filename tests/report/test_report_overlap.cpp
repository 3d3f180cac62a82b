// A collective and kernels on the same chips at once (SystemSimulator::run_alongside), and the
// report of it: each takes the time it takes alone (the links and the cores share nothing in
// the model), so the elapsed time is the longer of the two, and summary.txt's overlap per chip is
// the shorter one (both start on the same clock edge). Results are checked as well.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "adapter/profiler/comm_record.h"
#include "adapter/profiler/report_writer.h"
#include "common/numeric.h"
#include "isa/assembler.h"
#include "sim/collective/collective.h"
#include "sim/config/system_config.h"
#include "sim/system/system_simulator.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;

namespace {

constexpr uint64_t kX = 0x100000, kY = 0x200000, kZ = 0x300000;  // the kernels' f16 vectors
constexpr uint64_t kSend = 0x1000000, kRecv = 0x2000000;         // the collective's buffers
constexpr uint64_t kCount = 1 << 16;                             // all_reduce f32 elements
constexpr int kRanks = 4;

// vadd of n f16 elements on each of the ranks' chips.
std::vector<ChipLaunch> vadd_launches(SystemSimulator& s, const isa::Program& p, uint64_t kN) {
  std::vector<ChipLaunch> launches;
  for (int chip = 0; chip < kRanks; ++chip) {
    std::vector<uint16_t> x(kN), y(kN), z(kN, 0);
    for (uint64_t i = 0; i < kN; ++i)
      x[i] = f32_to_f16(float(i % 50 + chip)), y[i] = f32_to_f16(1.0f);
    s.gm(chip).write(kX, x.data(), 2 * kN);
    s.gm(chip).write(kY, y.data(), 2 * kN);
    s.gm(chip).write(kZ, z.data(), 2 * kN);
    launches.push_back({chip, test::kernel_launch(p, {kX, kY, kZ, kN}, 4)});
  }
  return launches;
}

CollectiveCall ring_all_reduce(SystemSimulator& s) {
  CollectiveCall c;
  for (int r = 0; r < kRanks; ++r) c.chips.push_back(r);
  c.send.assign(kRanks, kSend);
  c.recv.assign(kRanks, kRecv);
  c.count = kCount;
  c.algo = CollectiveAlgo::ring;
  for (int r = 0; r < kRanks; ++r) {
    const auto in = exact_reduction_inputs(isa::Dtype::F32, ReduceOp::sum, kCount, r + 1);
    s.gm(r).write(kSend, in.data(), in.size());
  }
  return c;
}

void check_results(SystemSimulator& s, uint64_t kN) {
  std::vector<std::vector<float>> in(kRanks, std::vector<float>(kCount));
  for (int r = 0; r < kRanks; ++r) {
    const auto bytes = exact_reduction_inputs(isa::Dtype::F32, ReduceOp::sum, kCount, r + 1);
    std::memcpy(in[r].data(), bytes.data(), bytes.size());
  }
  for (int chip = 0; chip < kRanks; ++chip) {
    std::vector<uint16_t> z(kN);
    s.gm(chip).read(kZ, z.data(), 2 * kN);
    for (uint64_t i = 0; i < kN; i += 7) REQUIRE(f16_to_f32(z[i]) == float(i % 50 + chip + 1));
    std::vector<float> out(kCount);
    s.gm(chip).read(kRecv, out.data(), 4 * kCount);
    for (uint64_t i = 0; i < kCount; i += 7)
      REQUIRE(out[i] == in[0][i] + in[1][i] + in[2][i] + in[3][i]);
  }
}

}  // namespace

TEST_CASE("a collective overlaps kernels on the same chips; the report shows the overlap") {
  SystemSimulator s(load_system_config("tiny-x8"), SimOptions{});
  const isa::Program p = isa::assemble_file(test::source_dir() + "/kernels/vadd_f16.s");
  // Kernels shorter than the collective, then longer.
  for (const uint64_t kN : {uint64_t{1} << 16, uint64_t{1} << 19}) {
    INFO("vadd of " << kN);

    // Alone: the kernels, then the collective.
    std::vector<KernelResult> alone = s.run(vadd_launches(s, p, kN));
    REQUIRE(alone[0].ok);
    const uint64_t kernel_cycles = alone[0].cycles;
    const CollectiveResult coll_alone = run_collective(s, ring_all_reduce(s));
    const uint64_t coll_cycles = coll_alone.cycles;
    check_results(s, kN);

    // Together: both start on one clock edge and take their own time.
    const auto launches = vadd_launches(s, p, kN);
    const CollectiveCall call = ring_all_reduce(s);
    std::vector<uint8_t> junk(4 * kCount, 0xee);
    for (int chip = 0; chip < kRanks; ++chip) s.gm(chip).write(kRecv, junk.data(), junk.size());
    const auto links_before = prof::fabric_channel_bytes(s.counters());
    CollectiveResult coll;
    const std::vector<KernelResult> kernels =
        s.run_alongside(launches, [&] { coll = run_collective(s, call); });
    for (const KernelResult& k : kernels) {
      REQUIRE(k.ok);
      CHECK(k.cycles == kernel_cycles);
      CHECK(k.start_cycle == coll.start_cycle);
    }
    CHECK(coll.cycles == coll_cycles);
    const uint64_t elapsed = s.now_cycles() - coll.start_cycle;
    CHECK(elapsed >= std::max(kernel_cycles, coll_cycles) - 1);
    CHECK(elapsed <= std::max(kernel_cycles, coll_cycles));
    CHECK(elapsed < kernel_cycles + coll_cycles);
    check_results(s, kN);

    // Inside `alongside` a launch is an error; the kernels still end.
    CHECK_THROWS_WITH(
        s.run_alongside(vadd_launches(s, p, kN), [&] { s.run(vadd_launches(s, p, kN)); }),
        Catch::Contains("already run alongside"));

    // The report: per chip, compute = the kernel, communication = the collective, overlap = the
    // shorter of the two.
    prof::ReportInput in;
    in.title = "overlap";
    in.config = &s.config().chip;
    for (int chip = 0; chip < kRanks; ++chip) {
      prof::OpRecord op;
      op.op_name = op.op_type = "vadd_f16";
      op.task_type = "AI_VECTOR_CORE";
      op.chip = chip;
      op.start_cycle = kernels[chip].start_cycle;
      op.cycles = kernels[chip].cycles;
      op.counters = CounterDelta(
          nlohmann::json{{"chip", nlohmann::json::object()}});  // the figures here need no counters
      in.ops.push_back(op);
    }
    in.comms.push_back(prof::comm_record(s, call, coll, links_before, 0));
    const auto dir = std::filesystem::temp_directory_path() / "npusim_report_overlap";
    std::filesystem::remove_all(dir);
    prof::write_report(dir.string(), in);
    std::ifstream f(dir / "summary.txt");
    std::stringstream text;
    text << f.rdbuf();
    const double mhz = s.config().chip.clock_mhz;
    auto us = [&](uint64_t c) { return fmt::format("{:.3f}", double(c) / mhz); };
    const uint64_t both = std::min(kernel_cycles, coll_cycles);
    INFO(text.str());
    for (int chip = 0; chip < kRanks; ++chip)
      CHECK(text.str().find(
                fmt::format("{:>7} {:>14} {:>14} {:>14} {:>14} {:>14}", chip, us(kernel_cycles),
                            us(coll_cycles), us(both), us(coll_cycles - both),
                            us(std::max(kernel_cycles, coll_cycles)))) != std::string::npos);
  }
}
