// The report's figures from a hand-made counter tree (no chip elaborated): msprof ratios, cube
// utilisation, memory bound, roofline, L2 hit rate, stalls, waits, task types, CSV text; and the
// report folder's files.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "adapter/profiler/counter_view.h"
#include "adapter/profiler/op_metrics.h"
#include "adapter/profiler/report_writer.h"
#include "common/error.h"
#include "sim/counters/counters.h"
#include "sim/config/chip_config.h"
#include "tests/common/test_chip.h"

using namespace npusim;
using nlohmann::json;

namespace {

json leaf(uint64_t v) { return {{"value", v}, {"unit", "x"}, {"desc", "test"}}; }

// A cube core that ran: active cycles and the busy cycles of its pipes.
json cube_core(uint64_t active, uint64_t m, uint64_t s, uint64_t mte1, uint64_t mte2,
               uint64_t fix, uint64_t macs) {
  return {{"active_cycles", leaf(active)},
          {"blocks", leaf(active ? 1 : 0)},
          {"s", {{"busy_cycles", leaf(s)}, {"stall", {{"queue_full", leaf(7)}}}}},
          {"mte1", {{"busy_cycles", leaf(mte1)}, {"bytes", {{"l1_to_l0a", leaf(4096)}}}}},
          {"mte2",
           {{"busy_cycles", leaf(mte2)},
            {"bytes", {{"gm_to_l1", leaf(65536)}}},
            {"stall", {{"flag_wait", leaf(30)}, {"mem_contention", leaf(5)}}}}},
          {"m", {{"busy_cycles", leaf(m)}, {"macs", leaf(macs)}}},
          {"fix", {{"busy_cycles", leaf(fix)}, {"bytes", {{"l0c_to_gm", leaf(8192)}}}}}};
}

json vector_core(uint64_t active, uint64_t v, uint64_t s, uint64_t mte2, uint64_t mte3,
                 uint64_t repeats) {
  return {{"active_cycles", leaf(active)},
          {"blocks", leaf(active ? 2 : 0)},
          {"s", {{"busy_cycles", leaf(s)}}},
          {"mte2", {{"busy_cycles", leaf(mte2)}, {"bytes", {{"gm_to_ub", leaf(1000)}}}}},
          {"mte3", {{"busy_cycles", leaf(mte3)}, {"bytes", {{"ub_to_gm", leaf(500)}}}}},
          {"v", {{"busy_cycles", leaf(v)}, {"repeats", leaf(repeats)}}}};
}

json memory(uint64_t hits, uint64_t misses, uint64_t hbm_read, uint64_t hbm_write) {
  return {{"l2", {{"hits", leaf(hits)}, {"misses", leaf(misses)}}},
          {"hbm", {{"read_bytes", leaf(hbm_read)}, {"write_bytes", leaf(hbm_write)}}},
          {"launches", leaf(1)}};
}

isa::Program program_with(std::initializer_list<isa::CoreKind> kinds) {
  isa::Program p;
  p.name = "k";
  for (auto k : kinds) {
    isa::Section s;
    s.kind = k;
    p.sections.push_back(s);
  }
  return p;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace

TEST_CASE("metrics: MTE2, MTE3 and FIXPIPE ratios read in-flight cycles, the others busy") {
  // msprof counts an instruction's cycles; for MTE1 without the transfer's wait, for the pipes
  // that move GM data until it has landed (inflight_cycles). A tree without inflight_cycles
  // (recorded before the counter existed) falls back to busy_cycles.
  const ChipConfig cfg = load_chip_config("tiny");
  json chip = memory(30, 70, 200000, 8192);
  chip["aic0"] = cube_core(1000, 500, 100, 200, 300, 20, 1000);
  chip["aic0"]["mte2"]["inflight_cycles"] = leaf(900);
  chip["aic0"]["fix"]["inflight_cycles"] = leaf(70);
  chip["aic0"]["mte1"]["inflight_cycles"] = leaf(999);  // MTE1 reads busy_cycles: ignored
  chip["aiv0"] = vector_core(2000, 100, 50, 400, 300, 10);
  chip["aiv0"]["mte3"]["inflight_cycles"] = leaf(700);  // aiv0's mte2 has none: busy
  prof::OpRecord op;
  op.cycles = 2000;
  op.counters = CounterDelta(json{{"chip", chip}});
  const prof::OpMetrics m = prof::compute_op_metrics(op, cfg);
  CHECK(m.aic.ratio.at("mte2") == Approx(900.0 / 1000));
  CHECK(m.aic.ratio.at("fixpipe") == Approx(70.0 / 1000));
  CHECK(m.aic.ratio.at("mte1") == Approx(200.0 / 1000));
  CHECK(m.aic.ratio.at("mac") == Approx(500.0 / 1000));
  CHECK(m.aiv.ratio.at("mte3") == Approx(700.0 / 2000));
  CHECK(m.aiv.ratio.at("mte2") == Approx(400.0 / 2000));
}

TEST_CASE("metrics: a cube op on a split chip") {
  const ChipConfig cfg = load_chip_config("tiny");
  REQUIRE(cfg.split);
  json chip = memory(30, 70, 200000, 8192);
  // Two cube cores ran (aic0, aic1); aic2 did not (blocks 0) and must not count.
  chip["aic0"] = cube_core(1000, 500, 100, 200, 800, 50, 1'000'000);
  chip["aic1"] = cube_core(600, 300, 60, 100, 500, 30, 600'000);
  chip["aic2"] = cube_core(0, 0, 0, 0, 0, 0, 0);
  chip["aiv0"] = vector_core(0, 0, 0, 0, 0, 0);
  prof::OpRecord op;
  op.start_cycle = 5000;
  op.cycles = 1100;
  op.wait_cycles = 100;
  chip["task_overhead_cycles"] = leaf(300);
  op.counters = CounterDelta(json{{"chip", chip}});
  const prof::OpMetrics m = prof::compute_op_metrics(op, cfg);

  CHECK(m.start_us == Approx(5000 / cfg.clock_mhz));
  CHECK(m.task_overhead_cycles == 300);  // the chip's counter, as op_summary shows it
  CHECK(m.task_overhead_us == Approx(300 / cfg.clock_mhz));
  CHECK(m.duration_us == Approx(1100 / cfg.clock_mhz));
  CHECK(m.wait_us == Approx(100 / cfg.clock_mhz));
  REQUIRE(m.aic.present);
  CHECK_FALSE(m.aiv.present);
  CHECK(m.aic.cores == 2);
  CHECK(m.aic.total_cycles == 1600);
  CHECK(m.aic.time_us == Approx(800 / cfg.clock_mhz));  // mean active time per core
  CHECK(m.aic.ratio.at("mac") == Approx(800.0 / 1600));
  CHECK(m.aic.ratio.at("scalar") == Approx(160.0 / 1600));
  CHECK(m.aic.ratio.at("mte1") == Approx(300.0 / 1600));
  CHECK(m.aic.ratio.at("mte2") == Approx(1300.0 / 1600));
  CHECK(m.aic.ratio.at("fixpipe") == Approx(80.0 / 1600));
  CHECK(m.macs == 1'600'000);
  // The tiny chip's cube peak: 2 aic x 16 x 16 x 16 MACs per cycle.
  const double peak = 2.0 * cfg.cube_m * cfg.cube_k * cfg.cube_n;
  CHECK(m.cube_utilization_pct == Approx(100.0 * 1'600'000 / (peak * 1100)));
  REQUIRE(m.memory_bound);
  CHECK(*m.memory_bound == Approx(1300.0 / 800));
  CHECK(m.gm_read_bytes == 2 * 65536);
  CHECK(m.gm_write_bytes == 2 * 8192);
  CHECK(m.hbm_read_bytes == 200000);
  CHECK(m.hbm_write_bytes == 8192);
  REQUIRE(m.l2_hit_rate);
  CHECK(*m.l2_hit_rate == Approx(0.3));
  CHECK(m.stall_cycles.at("flag_wait") == 60);
  CHECK(m.stall_cycles.at("mem_contention") == 10);
  CHECK(m.stall_cycles.at("queue_full") == 14);
  CHECK(m.path_bytes.at("l1_to_l0a") == 8192);
  // Roofline: compute 1.6e6 / peak cycles vs HBM 208192 B / (hbm GB/s * 1000 / MHz) cycles.
  const double compute = 1'600'000 / peak;
  const double mem = 208192 / (cfg.hbm_gbps * 1000 / cfg.clock_mhz);
  CHECK(m.roofline_bound_cycles == Approx(std::max(compute, mem)));
  CHECK(m.roofline_bound_us == Approx(std::max(compute, mem) / cfg.clock_mhz));
  REQUIRE(m.roofline_ratio);
  CHECK(*m.roofline_ratio == Approx(1100 / std::max(compute, mem)));
}

TEST_CASE("metrics: a vector op's roofline uses the vector peak; no L2 lookups, no hit rate") {
  const ChipConfig cfg = load_chip_config("tiny");
  json chip = memory(0, 0, 100, 50);
  chip["aiv0"] = vector_core(4000, 3000, 100, 1000, 400, 12000);
  chip["aiv1"] = vector_core(2000, 1000, 100, 500, 200, 4000);
  prof::OpRecord op;
  op.cycles = 4000;
  op.counters = CounterDelta(json{{"chip", chip}});
  const prof::OpMetrics m = prof::compute_op_metrics(op, cfg);
  CHECK_FALSE(m.aic.present);
  REQUIRE(m.aiv.present);
  CHECK(m.aiv.ratio.at("vec") == Approx(4000.0 / 6000));
  CHECK(m.aiv.ratio.at("mte3") == Approx(600.0 / 6000));
  CHECK(m.cube_utilization_pct == 0);
  REQUIRE(m.memory_bound);
  CHECK(*m.memory_bound == Approx((1500.0 / 6000) / (4000.0 / 6000)));
  CHECK_FALSE(m.l2_hit_rate);
  // 16000 repeats of 256 B over 4 vector cores at vector_bytes_per_cycle each.
  const double vec = 16000.0 * 256 / (4.0 * cfg.vector_bytes_per_cycle);
  CHECK(m.roofline_bound_cycles == Approx(vec));
  CHECK(m.gm_read_bytes == 2000);
  CHECK(m.gm_write_bytes == 1000);
}

TEST_CASE("metrics: on a coupled chip both msprof sides describe the same cores") {
  const ChipConfig cfg = test::coupled_test_chip();
  json core = cube_core(1000, 400, 100, 200, 600, 50, 500'000);
  core["v"] = {{"busy_cycles", leaf(250)}, {"repeats", leaf(10)}};
  core["mte3"] = {{"busy_cycles", leaf(120)}};
  json chip = memory(1, 1, 10, 10);
  chip["aicore0"] = core;
  prof::OpRecord op;
  op.cycles = 1000;
  op.counters = CounterDelta(json{{"chip", chip}});
  const prof::OpMetrics m = prof::compute_op_metrics(op, cfg);
  REQUIRE(m.aic.present);
  REQUIRE(m.aiv.present);
  CHECK(m.aic.total_cycles == 1000);
  CHECK(m.aiv.total_cycles == 1000);
  CHECK(m.aic.ratio.at("mac") == Approx(0.4));
  CHECK(m.aiv.ratio.at("vec") == Approx(0.25));
  CHECK(m.aic.ratio.at("scalar") == m.aiv.ratio.at("scalar"));
  CHECK(m.aiv.ratio.at("mte2") == Approx(0.6));
  CHECK(m.aiv.ratio.at("mte3") == Approx(0.12));
  // Peak of the test chip: 2 coupled cores x 4096 MACs per cycle.
  CHECK(m.cube_utilization_pct == Approx(100.0 * 500'000 / (2.0 * 4096 * 1000)));
  CHECK(*m.memory_bound == Approx(0.6 / 0.4));
  CHECK(prof::task_type_of(program_with({isa::CoreKind::AICORE}), cfg) == "AI_CORE");
}

TEST_CASE("metrics: task types, mix block dim and waits") {
  const ChipConfig split = load_chip_config("tiny");
  using K = isa::CoreKind;
  CHECK(prof::task_type_of(program_with({K::AIC}), split) == "AI_CORE");
  CHECK(prof::task_type_of(program_with({K::AIV}), split) == "AI_VECTOR_CORE");
  CHECK(prof::task_type_of(program_with({K::AIC, K::AIV}), split) == "MIX_AIC");
  CHECK(prof::mix_block_dim_of(program_with({K::AIC, K::AIV}), split, 3) == 3 * split.aiv_per_aic);
  CHECK(prof::mix_block_dim_of(program_with({K::AIC}), split, 3) == 0);
  // A mix kernel that declares one vector core per cube core (.aiv_per_aic 1) runs 3 of them.
  isa::Program one_to_one = program_with({K::AIC, K::AIV});
  one_to_one.aiv_per_aic = 1;
  CHECK(prof::mix_block_dim_of(one_to_one, split, 3) == 3);

  std::vector<prof::OpRecord> ops(3);
  ops[0].start_cycle = 100, ops[0].cycles = 50;   // waits 100 from the origin
  ops[1].start_cycle = 150, ops[1].cycles = 10;   // back to back
  ops[2].start_cycle = 400, ops[2].cycles = 1;    // 240 after the previous end
  prof::set_wait_cycles(ops);
  CHECK(ops[0].wait_cycles == 100);
  CHECK(ops[1].wait_cycles == 0);
  CHECK(ops[2].wait_cycles == 240);
  prof::set_wait_cycles(ops, 40);
  CHECK(ops[0].wait_cycles == 60);
  CHECK(prof::msprof_dtype(isa::Dtype::F16) == "DT_FLOAT16");
  CHECK(prof::msprof_dtype(isa::Dtype::F32) == "DT_FLOAT");
  CHECK(prof::msprof_dtype(isa::Dtype::BF16) == "DT_BF16");
}

TEST_CASE("metrics: a counter tree without a chip is an error naming the op") {
  const ChipConfig cfg = load_chip_config("tiny");
  prof::ReportInput in;
  in.config = &cfg;
  in.ops.resize(1);
  in.ops[0].op_name = "broken";
  in.ops[0].counters = CounterDelta(json{{"nochip", 1}});
  const std::string dir = (std::filesystem::temp_directory_path() / "npusim_report_bad").string();
  CHECK_THROWS_WITH(prof::write_report(dir, in), Catch::Contains("op 0 ('broken')") &&
                                                     Catch::Contains("\"chip\""));
}

TEST_CASE("report text: CSV fields and cycles") {
  CHECK(prof::csv_field("plain") == "plain");
  CHECK(prof::csv_field("128,256") == "\"128,256\"");
  CHECK(prof::csv_field("a;b") == "\"a;b\"");
  CHECK(prof::csv_field("say \"hi\"") == "\"say \"\"hi\"\"\"");
  CHECK(prof::cycles_text(12000) == "12");
  CHECK(prof::cycles_text(12500) == "12.5");
  CHECK(prof::cycles_text(12345) == "12.345");
  CHECK(prof::cycles_text(7) == "0.007");
}

TEST_CASE("report folder: the files, their columns and one row per op") {
  const ChipConfig cfg = load_chip_config("tiny");
  json chip = memory(30, 70, 200000, 8192);
  chip["aic0"] = cube_core(1000, 500, 100, 200, 800, 50, 1'000'000);
  json vchip = memory(0, 10, 5000, 2500);
  vchip["aiv0"] = vector_core(900, 300, 20, 600, 200, 300);

  prof::ReportInput in;
  in.title = "unit test";
  in.config = &cfg;
  in.ops.resize(3);
  for (size_t i = 0; i < 3; ++i) {
    prof::OpRecord& op = in.ops[i];
    op.op_name = "op" + std::to_string(i);
    op.op_type = i == 1 ? "Add" : "MatMul";
    op.task_type = i == 1 ? "AI_VECTOR_CORE" : "AI_CORE";
    op.start_cycle = 1000 * (i + 1);
    op.cycles = i == 1 ? 900 : 1000;
    op.block_dim = 1;
    op.counters = CounterDelta(json{{"chip", i == 1 ? vchip : chip}});
    op.inputs = {{{128, 256}, "DT_FLOAT16", "ND"}, {{256, 64}, "DT_FLOAT16", "ND"}};
    op.outputs = {{{128, 64}, "DT_FLOAT", "ND"}};
  }
  prof::set_wait_cycles(in.ops);
  auto table = std::make_shared<prof::InstructionTable>();
  table->kernel = "op0";
  prof::InstructionStat row;
  row.section = isa::CoreKind::AIC;
  row.pc = 3;
  row.location = "k.s:7";
  row.text = "mmad.f16 x1, x2, x3, 16, 16, 16, 0";
  row.lane = Lane::CUBE;
  row.calls = 4;
  row.busy_ps = 10500;
  row.wait_ps = 2000;
  table->rows.push_back(row);
  in.ops[0].instructions = table;
  json trace = {{"traceEvents", json::array()}};
  in.trace = &trace;

  const auto dir = std::filesystem::temp_directory_path() / "npusim_report_unit";
  std::filesystem::remove_all(dir);
  const auto files = prof::write_report(dir.string(), in);
  for (const char* f : {"op_summary.csv", "op_statistic.csv", "instructions.csv", "counters.json",
                        "chip.yaml", "trace.json", "summary.txt"}) {
    INFO(f);
    CHECK(std::filesystem::file_size(dir / f) > 0);
  }
  CHECK(files.size() == 7);

  const auto summary = lines_of((dir / "op_summary.csv").string());
  REQUIRE(summary.size() == 4);
  CHECK(summary[0].rfind("Task ID,Stream ID,Op Name,OP Type,Task Type,Task Start Time(us),"
                         "Task Duration(us),Task Wait Time(us),Block Dim,Mix Block Dim,"
                         "Input Shapes,Input Data Types,Input Formats,Output Shapes,"
                         "Output Data Types,Output Formats,aic_time(us),aic_total_cycles,"
                         "aic_mac_ratio,aic_scalar_ratio,aic_mte1_ratio,aic_mte2_ratio,"
                         "aic_fixpipe_ratio,aiv_time(us),aiv_total_cycles,aiv_vec_ratio,"
                         "aiv_scalar_ratio,aiv_mte2_ratio,aiv_mte3_ratio,cube_utilization(%),"
                         "memory_bound,",
                         0) == 0);
  CHECK(summary[1].find("\"128,256;256,64\",\"DT_FLOAT16;DT_FLOAT16\",\"ND;ND\",\"128,64\","
                        "DT_FLOAT,ND") != std::string::npos);
  // op1 (vector only) has N/A for the cube side.
  CHECK(summary[2].find("AI_VECTOR_CORE") != std::string::npos);
  CHECK(summary[2].find("N/A,N/A,N/A,N/A,N/A,N/A,N/A") != std::string::npos);

  const auto stats = lines_of((dir / "op_statistic.csv").string());
  REQUIRE(stats.size() == 3);
  // MatMul: 2 ops of 1000 cycles, first by total time; 2000 of the 2900 cycles.
  const double us = 1000 / cfg.clock_mhz;
  std::ostringstream want;
  want << "MatMul,AI_CORE,2," << fmt::format("{:.3f},{:.3f},{:.3f},{:.3f},{:.3f}", 2 * us, us, us,
                                             us, 100.0 * 2000 / 2900);
  CHECK(stats[1] == want.str());

  const auto insns = lines_of((dir / "instructions.csv").string());
  REQUIRE(insns.size() == 2);
  CHECK(insns[1] == "0,op0,aic,3,k.s:7,\"mmad.f16 x1, x2, x3, 16, 16, 16, 0\",CUBE,4,10.5,2.625,2");

  std::ifstream cj(dir / "counters.json");
  const json counters = json::parse(cj);
  CHECK(counters["ops"].size() == 3);
  CHECK(counters["ops"][1]["op_name"] == "op1");
  CHECK(counters["ops"][1]["counters"]["chip"]["aiv0"]["v"]["repeats"]["value"] == 300);
  const ChipConfig back = load_chip_config((dir / "chip.yaml").string());
  CHECK(back.clock_mhz == cfg.clock_mhz);
  CHECK(back.hbm_gbps == cfg.hbm_gbps);
  std::filesystem::remove_all(dir);
}

TEST_CASE("a launch's flat counter delta reads as its tree does") {
  // Registry counters as the chip registers them: two cores that ran, one that only counted a
  // stall (no active_cycles: a group, not a core), chip-level counters and a nested group.
  CounterRegistry reg;
  for (const char* name :
       {"chip.aic0.active_cycles", "chip.aic0.blocks", "chip.aic0.m.busy_cycles",
        "chip.aic0.mte2.bytes.gm_to_l1", "chip.aiv1.active_cycles", "chip.aiv1.blocks",
        "chip.aiv1.v.repeats", "chip.aic10.active_cycles", "chip.aic10.blocks",
        "chip.aic2.s.stall.barrier", "chip.launches", "chip.l2.hits", "chip.hbm.read_bytes"})
    reg.add(name, "x", "test");
  const std::vector<uint64_t> base = reg.snapshot();
  uint64_t v = 3;
  for (const char* name : {"chip.aic0.active_cycles", "chip.aic0.blocks", "chip.aic0.m.busy_cycles",
                           "chip.aic0.mte2.bytes.gm_to_l1", "chip.aiv1.active_cycles",
                           "chip.aiv1.v.repeats", "chip.aic10.active_cycles", "chip.aic10.blocks",
                           "chip.aic2.s.stall.barrier", "chip.launches", "chip.l2.hits"})
    reg.find(name)->add(v += 5);  // aiv1 ran no block: not a core that ran
  const CounterDelta delta = reg.delta_since(base);
  REQUIRE_FALSE(delta.is_tree());

  const prof::LaunchCounters flat = prof::read_launch_counters(delta);
  const prof::LaunchCounters tree = prof::read_launch_counters(delta.tree());
  REQUIRE(flat.cores.size() == 2);
  REQUIRE(flat.cores.size() == tree.cores.size());
  for (size_t i = 0; i < flat.cores.size(); ++i) {
    CHECK(flat.cores[i].name == tree.cores[i].name);
    CHECK(flat.cores[i].kind == tree.cores[i].kind);
    CHECK(flat.cores[i].values == tree.cores[i].values);
  }
  CHECK(flat.cores[0].name == "aic0");
  CHECK(flat.cores[0].get("mte2.bytes.gm_to_l1") == 23);
  CHECK(flat.chip == tree.chip);
  CHECK(flat.chip_value("aic2.s.stall.barrier") == 48);
  CHECK(flat.chip_value("l2.hits") == 58);
  CHECK(flat.chip.count("hbm.read_bytes") == 0);  // unchanged: not in the delta

  // An empty delta and a ready tree read as their trees.
  CHECK_THROWS_AS(prof::read_launch_counters(CounterDelta()), Error);
  CHECK(prof::read_launch_counters(CounterDelta(json{{"chip", json::object()}})).cores.empty());
}
