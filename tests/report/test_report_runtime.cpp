// The report of a run through the runtime (a TF program), from hand-made launch and copy records
// (no chip elaborated): LaunchRecord -> OpRecord, per-op-type summary, the wait breakdown, the
// pipe-trace collector's trimming and time shift, the folder's TF-specific parts, and the plot
// script run beside the writing of trace.json.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "adapter/profiler/runtime_report.h"
#include "isa/disassembler.h"
#include "sim/config/chip_config.h"

using namespace npusim;
using nlohmann::json;

namespace {

json leaf(uint64_t v) { return {{"value", v}, {"unit", "x"}, {"desc", "test"}}; }

json cube_core(uint64_t active, uint64_t m_busy, uint64_t macs) {
  return {{"active_cycles", leaf(active)},
          {"blocks", leaf(1)},
          {"s", {{"busy_cycles", leaf(active / 10)}}},
          {"mte2", {{"busy_cycles", leaf(active / 2)}}},
          {"m", {{"busy_cycles", leaf(m_busy)}, {"macs", leaf(macs)}}}};
}

json vector_core(uint64_t active, uint64_t v_busy, uint64_t repeats) {
  return {{"active_cycles", leaf(active)},
          {"blocks", leaf(1)},
          {"s", {{"busy_cycles", leaf(active / 10)}}},
          {"mte2", {{"busy_cycles", leaf(active / 4)}}},
          {"mte3", {{"busy_cycles", leaf(active / 8)}}},
          {"v", {{"busy_cycles", leaf(v_busy)}, {"repeats", leaf(repeats)}}}};
}

std::shared_ptr<const isa::Program> program_with(const std::string& name,
                                                 std::initializer_list<isa::CoreKind> kinds) {
  auto p = std::make_shared<isa::Program>();
  p->name = name;
  for (auto k : kinds) {
    isa::Section s;
    s.kind = k;
    p->sections.push_back(s);
  }
  return p;
}

std::shared_ptr<const rt::LaunchLabel> label(const std::string& name, const std::string& type,
                                             uint64_t dispatch) {
  auto l = std::make_shared<rt::LaunchLabel>();
  l->op_name = name;
  l->op_type = type;
  l->inputs = {{{4, 8}, "DT_FLOAT"}, {{8, 16}, "DT_FLOAT"}};
  l->outputs = {{{4, 16}, "DT_FLOAT"}};
  l->dispatch = dispatch;
  return l;
}

rt::LaunchRecord launch(const std::string& kernel, uint64_t start, uint64_t cycles,
                        json chip, std::shared_ptr<const rt::LaunchLabel> l = nullptr) {
  rt::LaunchRecord r;
  r.kernel = kernel;
  r.stream = 3;
  r.block_dim = 2;
  r.start_cycle = start;
  r.sim_start_cycle = start;
  r.cycles = cycles;
  r.ok = true;
  r.counter_delta = CounterDelta(json{{"chip", std::move(chip)}});
  r.label = std::move(l);
  return r;
}

rt::CopyRecord copy(rt::OpKind kind, uint64_t start, uint64_t cycles, uint64_t bytes) {
  rt::CopyRecord c;
  c.kind = kind;
  c.start_cycle = start;
  c.cycles = cycles;
  c.bytes = bytes;
  return c;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("runtime report: a labelled launch becomes a row with the TF op's name and tensors") {
  const ChipConfig cfg = load_chip_config("tiny");
  REQUIRE(cfg.split);
  json chip = {{"aic0", cube_core(1000, 600, 4096)}, {"aiv0", vector_core(900, 300, 10)}};
  rt::LaunchRecord r = launch("matmul_f32_4x8x16", 500, 1200, chip, label("dense/MatMul", "MatMul", 7));
  r.program = program_with(r.kernel, {isa::CoreKind::AIC, isa::CoreKind::AIV});
  const prof::OpRecord op = prof::op_record(r, cfg);
  CHECK(op.op_name == "dense/MatMul");
  CHECK(op.op_type == "MatMul");
  CHECK(op.kernel == "matmul_f32_4x8x16");
  CHECK(op.task_type == "MIX_AIC");
  CHECK(op.mix_block_dim == 2 * cfg.aiv_per_aic);
  CHECK(op.stream == 3);
  CHECK(op.block_dim == 2);
  CHECK(op.start_cycle == 500);
  CHECK(op.cycles == 1200);
  REQUIRE(op.inputs.size() == 2);
  CHECK(op.inputs[1].shape == std::vector<int64_t>{8, 16});
  CHECK(op.inputs[1].dtype == "DT_FLOAT");
  REQUIRE(op.outputs.size() == 1);
  CHECK(op.outputs[0].shape == std::vector<int64_t>{4, 16});

  // Without a label: the kernel names both; without a program: the task type from the cores
  // that ran (only aiv here).
  rt::LaunchRecord plain = launch("vadd", 0, 10, {{"aiv0", vector_core(10, 5, 1)}});
  const prof::OpRecord p = prof::op_record(plain, cfg);
  CHECK(p.op_name == "vadd");
  CHECK(p.op_type == "vadd");
  CHECK(p.task_type == "AI_VECTOR_CORE");
  CHECK(p.mix_block_dim == 0);
  CHECK(p.inputs.empty());
}

TEST_CASE("runtime report: per op type, runs count dispatches and utilisation is of the chip peak") {
  const ChipConfig cfg = load_chip_config("tiny");
  // MatMul run 1 = two launches (a cast and the GEMM, dispatch 1), MatMul run 2 = one launch;
  // one BiasAdd launch.
  std::vector<rt::LaunchRecord> ls = {
      launch("cast", 0, 100, {{"aiv0", vector_core(100, 50, 20)}}, label("mm", "MatMul", 1)),
      launch("gemm", 100, 400, {{"aic0", cube_core(400, 300, 100000)}}, label("mm", "MatMul", 1)),
      launch("gemm", 600, 400, {{"aic0", cube_core(400, 300, 100000)}}, label("mm", "MatMul", 2)),
      launch("badd", 1000, 50, {{"aiv0", vector_core(50, 40, 8)}}, label("b", "BiasAdd", 3))};
  const auto rows = prof::op_type_summary(ls, cfg);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].op_type == "MatMul");  // longest first
  CHECK(rows[0].count == 2);
  CHECK(rows[0].tasks == 3);
  CHECK(rows[0].time_us == Approx(900 / cfg.clock_mhz));
  // Cube peak per cycle: cube_m*cube_k*cube_n MACs per cube core; the tiny chip's cube cores are
  // its aic cores.
  int cube_cores = 0, vector_cores = 0;
  for (const auto& k : cfg.core_kinds) {
    if (k.has(isa::Pipe::M)) cube_cores += k.count;
    if (k.has(isa::Pipe::V)) vector_cores += k.count;
  }
  const double peak = double(cfg.cube_m) * cfg.cube_k * cfg.cube_n * cube_cores;
  CHECK(rows[0].cube_utilization_pct == Approx(100.0 * 200000 / (peak * 900)));
  // A vector repeat is 256 bytes against vector_bytes_per_cycle per vector core.
  CHECK(rows[0].vector_utilization_pct ==
        Approx(100.0 * 20 * 256 / (double(cfg.vector_bytes_per_cycle) * vector_cores * 900)));
  CHECK(rows[1].op_type == "BiasAdd");
  CHECK(rows[1].count == 1);
  CHECK(rows[1].cube_utilization_pct == 0);
  CHECK(prof::op_type_summary(ls, cfg, 1).size() == 1);
}

TEST_CASE("runtime report: waits split into the copies that filled them") {
  // Origin 100. Kernel A [300, 400), kernel B [700, 800). Gap 1 [100, 300): h2d [100, 250),
  // memset [250, 300). Gap 2 [400, 700): d2h [400, 450), h2d [450, 700). After B: d2h [800, 900).
  std::vector<prof::OpRecord> ops(2);
  ops[0].start_cycle = 300;
  ops[0].cycles = 100;
  ops[1].start_cycle = 700;
  ops[1].cycles = 100;
  const std::vector<rt::CopyRecord> copies = {
      copy(rt::OpKind::memcpy_h2d, 100, 150, 1000), copy(rt::OpKind::memset32, 250, 50, 64),
      copy(rt::OpKind::memcpy_d2h, 400, 50, 10), copy(rt::OpKind::memcpy_h2d, 450, 250, 2000),
      copy(rt::OpKind::memcpy_d2h, 800, 100, 500)};
  const prof::WaitBreakdown w = prof::wait_breakdown(ops, copies, 100);
  CHECK(w.wait_cycles == 200 + 300);
  CHECK(w.h2d_cycles == 150 + 250);
  CHECK(w.d2h_cycles == 50);
  CHECK(w.device_cycles == 50);
  CHECK(w.after_last_copies == 1);
  CHECK(w.after_last_cycles == 100);
}

TEST_CASE("runtime report: the pipe trace keeps the first launches and shifts them") {
  prof::PipeTraceCollector c({/*detail_launches=*/2, /*max_events=*/100});
  c.on_core(0, "aic0");
  isa::Program prog;
  prog.name = "k";
  isa::Section sec;
  isa::Instruction nop;
  for (int launch = 0; launch < 3; ++launch) {
    const uint64_t t = 1'000'000 * uint64_t(launch);
    CHECK_FALSE(c.wants_instructions());  // between launches
    c.on_kernel_begin(prog, 1, t);
    // The chip's cores call the instruction hooks during the detailed launches only.
    CHECK(c.wants_instructions() == (launch < 2));
    c.on_instruction(0, Lane::SCALAR, t, t + 2000, 0, nop, sec);
    c.on_instruction(0, Lane::CUBE, t + 2000, t + 5000, 1, nop, sec);
    c.on_kernel_end(prog, t + 5000, true);
  }
  CHECK_FALSE(c.wants_instructions());
  const auto s = c.stats();
  CHECK(s.launches_seen == 3);
  CHECK(s.launches_detailed == 2);
  CHECK(s.events == 4);
  json ev = json::array();
  // Launch 0 stays, launch 1 moves by 7 cycles (7000 ps).
  c.append_events(ev, 1000.0, [](uint64_t begin_ps) -> int64_t {
    return begin_ps == 0 ? 0 : 7000;
  });
  std::vector<double> ts;
  for (const json& e : ev)
    if (e["ph"] == "X") ts.push_back(e["ts"].get<double>());
  // At 1000 MHz one cycle is 1 ns = 0.001 us.
  REQUIRE(ts.size() == 4);
  CHECK(ts[0] == Approx(0.0));
  CHECK(ts[1] == Approx(0.002));
  CHECK(ts[2] == Approx(1.0 + 0.007));
  CHECK(ts[3] == Approx(1.002 + 0.007));

  // The event cap cuts inside a detailed launch and is reported.
  c.reset({10, 3});
  c.on_kernel_begin(prog, 1, 0);
  for (int i = 0; i < 5; ++i) c.on_instruction(0, Lane::SCALAR, i * 1000, i * 1000 + 1000, 0, nop, sec);
  c.on_kernel_end(prog, 5000, true);
  CHECK(c.stats().events == 3);
  CHECK(c.stats().dropped_events == 2);
  CHECK(c.stats().last_detailed_truncated);
}

TEST_CASE("runtime report: the pipe trace's streamed events are the JSON documents' dump") {
  // Reference: trace_events::instruction / flag_flow / append_core_process built as JSON
  // documents and dumped by nlohmann; the collector writes the same text without them. A source
  // name that needs escaping, and times whose shortest form needs an exponent (1 ps at 1850 MHz).
  const double clock_mhz = 1850.0;
  prof::PipeTraceCollector c({/*detail_launches=*/2, /*max_events=*/100});
  c.on_core(0, "aic0");
  c.on_core(3, "aiv\"1\\");
  isa::Program prog;
  prog.name = "k";
  prog.source = "dir/k \"q\"\\.s";
  isa::Section sec;
  isa::Instruction nop, lined;
  lined.src_line = 12;
  c.on_kernel_begin(prog, 1, 0);
  c.on_instruction(0, Lane::SCALAR, 1, 2, 7, nop, sec);
  c.on_flow_begin(0, Lane::SCALAR, 2000, 5);
  c.on_flow_end(3, Lane::VECTOR, 3333, 5);
  c.on_instruction(3, Lane::VECTOR, 3333, 123'456'789'012, 4'000'000'000u, lined, sec);
  c.on_kernel_end(prog, 5000, true);
  const int64_t shift_ps = 7'000;
  std::vector<std::string> got;
  c.write_events(clock_mhz, [&](uint64_t) -> int64_t { return shift_ps; },
                 [&](std::string_view e) { got.emplace_back(e); });

  auto us = [&](uint64_t ps) { return double(ps) / 1000.0 / clock_mhz; };
  const std::string text = isa::disassemble(nop, &sec);
  const std::string src = prog.source;
  json meta = json::array();
  trace_events::append_core_process(meta, 0, "aic0", 10);
  trace_events::append_core_process(meta, 3, "aiv\"1\\", 13);
  std::vector<std::string> want;
  for (const json& e : meta) want.push_back(e.dump());
  want.push_back(trace_events::instruction(100, trace_events::lane_tid(Lane::SCALAR),
                                           us(1 + shift_ps), us(2 - 1), 7, text, src)
                     .dump());
  want.push_back(trace_events::flag_flow(100, trace_events::lane_tid(Lane::SCALAR),
                                         us(2000 + shift_ps), true, 5)
                     .dump());
  want.push_back(trace_events::flag_flow(103, trace_events::lane_tid(Lane::VECTOR),
                                         us(3333 + shift_ps), false, 5)
                     .dump());
  want.push_back(trace_events::instruction(103, trace_events::lane_tid(Lane::VECTOR),
                                           us(3333 + shift_ps), us(123'456'789'012 - 3333),
                                           4'000'000'000u, isa::disassemble(lined, &sec),
                                           src + ":12")
                     .dump());
  CHECK(got == want);
  CHECK(want[meta.size()].find("e-07") != std::string::npos);  // the exponent form ran
}

TEST_CASE("runtime report: trace.json streams the pipe trace after the launches' events") {
  const ChipConfig cfg = load_chip_config("tiny");
  prof::PipeTraceCollector c({/*detail_launches=*/5, /*max_events=*/100});
  c.on_core(0, "aic0");
  isa::Program prog;
  prog.name = "gemm";
  isa::Section sec;
  isa::Instruction nop;
  c.on_kernel_begin(prog, 1, 0);
  c.on_instruction(0, Lane::CUBE, 0, 3000, 1, nop, sec);
  c.on_kernel_end(prog, 3000, true);
  prof::RuntimeReportInput in;
  in.title = "test";
  in.config = &cfg;
  in.launches = {launch("gemm", 400, 300, {{"aic0", cube_core(300, 200, 50000)}},
                        label("mm", "MatMul", 1))};
  in.launches[0].sim_start_cycle = 0;  // the collector saw it begin at 0, the device at 400
  in.pipe_trace = &c;
  const std::string dir =
      (std::filesystem::temp_directory_path() / "npusim_test_runtime_report_stream").string();
  std::filesystem::remove_all(dir);
  prof::write_runtime_report(dir, in);

  // The file is what one JSON document's dump() writes (sorted keys, shortest numbers) ...
  const std::string text = read_file(dir + "/trace.json");
  const json trace = json::parse(text);
  CHECK(text == trace.dump() + "\n");
  // ... runtime_trace's events, then the collector's, the instruction moved by 400 cycles.
  const json head = prof::runtime_trace(in, {prof::op_record(in.launches[0], cfg)});
  json tail = json::array();
  prof::pipe_trace_events(in, [&](std::string_view e) { tail.push_back(json::parse(e)); });
  REQUIRE(trace["traceEvents"].size() == head["traceEvents"].size() + tail.size());
  CHECK(trace["otherData"] == head["otherData"]);
  CHECK(trace["otherData"]["instruction_events"] == 1);
  const json& last = trace["traceEvents"].back();
  CHECK(last == tail.back());
  CHECK(last["cat"] == "insn");
  CHECK(last["ts"].get<double>() == Approx(400 / cfg.clock_mhz));
  CHECK(last["dur"].get<double>() == Approx(3 / cfg.clock_mhz));
}

TEST_CASE("runtime report: the folder has TF names, a kernel column, a host lane and waits") {
  const ChipConfig cfg = load_chip_config("tiny");
  prof::RuntimeReportInput in;
  in.title = "test";
  in.config = &cfg;
  in.origin_cycle = 100;
  in.launches = {
      launch("cast", 300, 100, {{"aiv0", vector_core(100, 50, 20)}}, label("mm", "MatMul", 1)),
      launch("gemm", 400, 300, {{"aic0", cube_core(300, 200, 50000)}}, label("mm", "MatMul", 1))};
  in.copies = {copy(rt::OpKind::memcpy_h2d, 100, 200, 4096),
               copy(rt::OpKind::memcpy_d2h, 700, 40, 256)};
  in.extra = {{"cpu_fallback_ops", {{"StringFormat", 2}}}};
  const std::string dir =
      (std::filesystem::temp_directory_path() / "npusim_test_runtime_report").string();
  std::filesystem::remove_all(dir);
  // The plots' hook runs once, with the tables and chip.yaml written and trace.json not yet.
  int hook_calls = 0;
  in.tables_written = [&] {
    ++hook_calls;
    for (const char* f : {"op_summary.csv", "op_statistic.csv", "chip.yaml"})
      CHECK(std::filesystem::exists(dir + "/" + f));
    CHECK_FALSE(std::filesystem::exists(dir + "/trace.json"));
    CHECK_FALSE(std::filesystem::exists(dir + "/summary.txt"));
  };
  prof::write_runtime_report(dir, in);
  CHECK(hook_calls == 1);

  std::ifstream csv(dir + "/op_summary.csv");
  std::string header, row0, row1;
  std::getline(csv, header);
  std::getline(csv, row0);
  std::getline(csv, row1);
  CHECK(header.substr(header.size() - 7) == ",kernel");
  CHECK(row0.find(",mm,MatMul,AI_VECTOR_CORE,") != std::string::npos);
  CHECK(row0.substr(row0.size() - 5) == ",cast");
  CHECK(row1.find(",mm,MatMul,AI_CORE,") != std::string::npos);
  CHECK(row0.find("\"4,8;8,16\"") != std::string::npos);

  const json trace = json::parse(read_file(dir + "/trace.json"));
  int tf_ops = 0, h2d = 0, kernels = 0;
  for (const json& e : trace["traceEvents"]) {
    if (e["ph"] != "X") continue;
    if (e["cat"] == "tf_op") {
      ++tf_ops;
      // The span of dispatch 1: the cast's start to the GEMM's end.
      CHECK(e["ts"].get<double>() == Approx(300 / cfg.clock_mhz));
      CHECK(e["dur"].get<double>() == Approx(400 / cfg.clock_mhz));
      CHECK(e["name"] == "mm");
    }
    if (e["cat"] == "copy" && e["name"] == "memcpy_h2d") ++h2d;
    if (e["cat"] == "kernel") ++kernels;
  }
  CHECK(tf_ops == 1);
  CHECK(h2d == 1);
  CHECK(kernels == 2);

  const std::string summary = read_file(dir + "/summary.txt");
  // Waits: only the first launch's, [100, 300), filled by the h2d copy.
  CHECK(summary.find(fmt::format("simulated time {:.3f} us", 600 / cfg.clock_mhz)) !=
        std::string::npos);  // last end 700 - origin 100
  CHECK(summary.find("TF ops by op type") != std::string::npos);
  CHECK(summary.find("waiting for data (host->device copies before a kernel): " +
                     fmt::format("{:.3f}", 200 / cfg.clock_mhz)) != std::string::npos);
  CHECK(summary.find("StringFormat: 2") != std::string::npos);
  CHECK(summary.find("after the last kernel (not in the simulated time): 1 copies") !=
        std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("runtime report: a task end rounded past the next start is cut to it") {
  const ChipConfig cfg = load_chip_config("tiny");
  // Records round starts down and durations up: [0, 100) then a launch at 99 (its true start
  // lay inside cycle 99, after the first ended). The first counts 99 cycles, so the times add
  // up to the span 0..200.
  std::vector<rt::LaunchRecord> ls = {
      launch("a", 0, 100, {{"aiv0", vector_core(100, 50, 1)}}, label("x", "Mul", 1)),
      launch("b", 99, 101, {{"aiv0", vector_core(101, 50, 1)}}, label("y", "Mul", 2))};
  const auto rows = prof::op_type_summary(ls, cfg);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].time_us == Approx(200 / cfg.clock_mhz));
  // A real overlap (more than a cycle) is left alone.
  ls[1].start_cycle = 50;
  CHECK(prof::op_type_summary(ls, cfg)[0].time_us == Approx(201 / cfg.clock_mhz));
}

TEST_CASE("runtime report: a system run's top level splits every chip's time, not only chip 0's") {
  const ChipConfig cfg = load_chip_config("tiny");
  prof::RuntimeReportInput in;
  in.title = "test";
  in.config = &cfg;
  // Chip 0 computes over [0, 100), chip 1 over [50, 200) and [250, 300) (a record one cycle past
  // the next start: cut as op_records cuts); an all-reduce of both runs over [80, 260).
  in.launches = {launch("a", 0, 100, {{"aiv0", vector_core(100, 50, 1)}}, label("x", "Mul", 1))};
  std::vector<rt::LaunchRecord> chip1 = {
      launch("b", 50, 151, {{"aiv0", vector_core(151, 50, 1)}}, label("y", "Mul", 2)),
      launch("c", 200, 100, {{"aiv0", vector_core(100, 50, 1)}}, label("z", "Mul", 3))};
  for (rt::LaunchRecord& r : chip1) r.chip = 1;
  const auto spans = prof::kernel_spans(chip1);
  REQUIRE(spans.size() == 2);
  CHECK(spans[0] == std::pair<uint64_t, uint64_t>{50, 200});
  CHECK(spans[1] == std::pair<uint64_t, uint64_t>{200, 300});
  in.other_chip_kernels[1] = spans;
  prof::CommRecord c;
  c.op_name = "hcom_allReduce_0";
  c.op_type = "HcomAllReduce";
  c.collective = "all_reduce";
  c.algorithm = "mesh";
  c.chips = {0, 1};
  c.dtype = "DT_FLOAT";
  c.reduce_op = "sum";
  c.bytes = 1024;
  c.start_cycle = 80;
  c.cycles = 180;
  in.comms = {c};
  const std::string dir =
      (std::filesystem::temp_directory_path() / "npusim_test_runtime_report_system").string();
  std::filesystem::remove_all(dir);
  prof::write_runtime_report(dir, in);
  const std::string summary = read_file(dir + "/summary.txt");
  INFO(summary);
  auto us = [&](uint64_t cycles) { return fmt::format("{:.3f}", cycles / cfg.clock_mhz); };
  auto row = [&](int chip, uint64_t compute, uint64_t comm, uint64_t both) {
    return fmt::format("{:>7} {:>14} {:>14} {:>14} {:>14} {:>14}", chip, us(compute), us(comm),
                       us(both), us(comm - both), us(compute + comm - both));
  };
  // Chip 0: compute [0, 100), overlap [80, 100); chip 1: compute [50, 300), overlap [80, 260).
  CHECK(summary.find(row(0, 100, 180, 20)) != std::string::npos);
  CHECK(summary.find(row(1, 250, 180, 180)) != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("runtime report: kinds of work and phases, each phase name's last occurrence a folder") {
  const ChipConfig cfg = load_chip_config("tiny");
  prof::OpMetrics cube, vec, none;
  cube.macs = 10;
  vec.vector_repeats = 3;
  CHECK(prof::work_kind("IncreFlashAttention", cube) == prof::WorkKind::attention);
  CHECK(prof::work_kind("XlaDynamicUpdateSlice", vec) == prof::WorkKind::slice_update);
  CHECK(prof::work_kind("ResourceScatterUpdate", none) == prof::WorkKind::slice_update);
  CHECK(prof::work_kind("MatMul", cube) == prof::WorkKind::cube);
  CHECK(prof::work_kind("MatMul", vec) == prof::WorkKind::vector);  // e.g. its input's cast
  CHECK(prof::work_kind("Pack", none) == prof::WorkKind::data_movement);

  prof::RuntimeReportInput in;
  in.title = "test";
  in.config = &cfg;
  in.origin_cycle = 100;
  in.launches = {
      launch("gemm", 300, 100, {{"aic0", cube_core(100, 50, 50000)}}, label("mm", "MatMul", 1)),
      launch("add", 600, 100, {{"aiv0", vector_core(100, 50, 20)}}, label("add", "AddV2", 2)),
      launch("fa", 900, 200, {{"aic0", cube_core(200, 50, 9000)}},
             label("fa", "FlashAttention", 3)),
      launch("copy", 1150, 50, {{"aiv0", vector_core(50, 0, 0)}}, label("p", "Pack", 4))};
  in.copies = {copy(rt::OpKind::memcpy_h2d, 820, 30, 64)};
  // "a": [100, 500); "b" twice: [500, 800) and [800, end).
  in.phases = {
      {"a", 100, 500, 1, "tokens"}, {"b", 500, 800, 1, "tokens"}, {"b", 800, 0, 1, "tokens"}};
  const std::string dir =
      (std::filesystem::temp_directory_path() / "npusim_test_runtime_phases").string();
  std::filesystem::remove_all(dir);
  prof::write_runtime_report(dir, in);

  const std::string top = read_file(dir + "/summary.txt");
  // Whole window: 1100 cycles = 450 of kernels without overheads and 650 of waits (30 of them
  // the h2d copy), by kind.
  CHECK(top.find(fmt::format("the simulated time, {:.3f} us,", 1100 / cfg.clock_mhz)) !=
        std::string::npos);
  // Each row: launches, time without the task overheads (none in these records), share, ...
  const auto row_us = [&](const std::string& name) {
    const size_t at = top.find("  " + name);
    REQUIRE(at != std::string::npos);
    std::istringstream fields(top.substr(at + 2 + name.size(), top.find('\n', at) - at));
    std::vector<std::string> f;
    for (std::string w; fields >> w;) f.push_back(w);
    return f;
  };
  const auto us = [&](uint64_t cycles) { return fmt::format("{:.3f}", cycles / cfg.clock_mhz); };
  CHECK(row_us("cube products (w/o task overheads)")[0] == "1");
  CHECK(row_us("cube products (w/o task overheads)")[1] == us(100));
  CHECK(row_us("attention (w/o task overheads)")[1] == us(200));
  CHECK(row_us("vector ops (w/o task overheads)")[1] == us(100));
  CHECK(row_us("data movement (w/o task overheads)")[1] == us(50));
  CHECK(row_us("waits: copies and fills")[0] == us(30));
  CHECK(row_us("waits: other")[0] == us(620));
  CHECK(row_us("waits: host dispatch")[0] == us(0));
  // Phases: "b" twice, 1.5 launches each; its times 200 and 400 cycles (start to last end).
  const double b_mean = 300 / cfg.clock_mhz;
  const std::vector<std::string> b_row = row_us("b ");
  REQUIRE(b_row.size() >= 5);
  CHECK(b_row[0] == "2");
  CHECK(b_row[1] == "1.5");
  CHECK(b_row[2] == fmt::format("{:.3f}", b_mean));
  CHECK(b_row[3] == us(200));
  CHECK(b_row[4] == us(400));
  CHECK(top.find(fmt::format("{:.1f} tokens/s", 1.0 / (b_mean * 1e-6))) != std::string::npos);

  // phases/b/ is its last occurrence: the attention and the copy, from cycle 800.
  const std::string b = read_file(dir + "/phases/b/summary.txt");
  CHECK(b.find("test: phase b (occurrence 2 of 2)") == 0);
  CHECK(b.find(fmt::format("2 ops: task time {} us, waits {} us, simulated time {} us", us(250),
                           us(150), us(400))) !=
        std::string::npos);
  std::ifstream csv(dir + "/phases/a/op_summary.csv");
  std::string line;
  int rows = 0;
  while (std::getline(csv, line)) ++rows;
  CHECK(rows == 2);  // the header and the GEMM

  in.phases = {{"../x", 100, 0, 0, ""}};
  CHECK_THROWS_WITH(prof::write_runtime_report(dir, in),
                    Catch::Contains("report phase '../x'"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("runtime report: the plot script runs beside the caller until it is finished") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / "npusim_test_plot_process";
  fs::remove_all(dir);
  fs::create_directories(dir);
  // A stand-in for the plot script, run by /bin/sh as the Python: it takes a while, then writes
  // a file into the folder it is given and prints a line.
  const std::string script = (dir / "plots.sh").string();
  std::ofstream(script) << "sleep 2\necho drawn > \"$1/plot.png\"\necho plotted $1\n";
  {
    prof::PlotProcess p = prof::start_plot_script(dir.string(), "/bin/sh", script);
    CHECK(p.started());
    CHECK_FALSE(fs::exists(dir / "plot.png"));  // started, not waited for
    const prof::PlotResult r = prof::finish_plot_script(p);
    CHECK(r.ok);
    CHECK(r.output == "plotted " + dir.string() + "\n");
    CHECK(read_file((dir / "plot.png").string()) == "drawn\n");
    // Finished once: a second finish has nothing to wait for.
    CHECK_FALSE(prof::finish_plot_script(p).ok);
  }
  fs::remove(dir / "plot.png");
  {
    // One not finished is waited for when it goes.
    prof::PlotProcess p = prof::start_plot_script(dir.string(), "/bin/sh", script);
  }
  CHECK(fs::exists(dir / "plot.png"));
  // A failing script, and none to run.
  std::ofstream(script) << "exit 3\n";
  prof::PlotProcess failing = prof::start_plot_script(dir.string(), "/bin/sh", script);
  const prof::PlotResult f = prof::finish_plot_script(failing);
  CHECK_FALSE(f.ok);
  CHECK(f.output.rfind("failed: ", 0) == 0);
  prof::PlotProcess none = prof::start_plot_script(dir.string(), "", script);
  CHECK(none.started());
  const prof::PlotResult n = prof::finish_plot_script(none);
  CHECK_FALSE(n.ok);
  CHECK(n.output.find("NPUSIM_PYTHON") != std::string::npos);
  fs::remove_all(dir);
}
