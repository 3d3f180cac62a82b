// AI CPU tasks in the report (docs/runtime.md "The AI CPU timeline", docs/reports.md): runtime
// AiCpuRecords become op_summary.csv rows with Task Type AI_CPU after the kernels' rows, their
// waits measured on the AI CPU timeline, and op_statistic.csv lines of Core Type AI_CPU; at
// hand-picked times, so every figure can be derived by hand.
#include <catch2/catch.hpp>

#include <filesystem>

#include <fmt/format.h>

#include "adapter/profiler/report_writer.h"
#include "adapter/profiler/runtime_report.h"
#include "sim/config/chip_config.h"
#include "tests/report/report_test_util.h"

using namespace npusim;
using nlohmann::json;

namespace {

rt::AiCpuRecord task(uint64_t start, uint64_t cycles, bool labelled) {
  rt::AiCpuRecord t;
  t.kernel = "DropOutGenMask";
  t.stream = 3;
  t.start_cycle = start;
  t.cycles = cycles;
  if (labelled) {
    auto l = std::make_shared<rt::LaunchLabel>();
    l->op_name = "dropout/DropOutGenMask";
    l->op_type = "DropOutGenMask";
    l->inputs = {{{2}, "DT_UINT64"}};
    l->outputs = {{{8, 128}, "DT_BOOL"}};
    t.label = l;
  }
  return t;
}

}  // namespace

TEST_CASE("ai_cpu_rows: names from the label, waits on the AI CPU timeline") {
  // From origin 100: a task at [400, 1400), one at [1400, 1900), one at [2500, 2600).
  const auto rows = prof::ai_cpu_rows(
      {task(400, 1000, true), task(1400, 500, true), task(2500, 100, false)}, 100);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].op_name == "dropout/DropOutGenMask");
  CHECK(rows[0].op_type == "DropOutGenMask");
  CHECK(rows[0].outputs.at(0).shape == std::vector<int64_t>{8, 128});
  CHECK(rows[2].op_name == "DropOutGenMask");  // no label: the kernel
  CHECK(rows[0].wait_cycles == 300);
  CHECK(rows[1].wait_cycles == 0);
  CHECK(rows[2].wait_cycles == 600);
}

TEST_CASE("report: AI_CPU rows in op_summary.csv and op_statistic.csv") {
  const ChipConfig cfg = load_chip_config("tiny");
  prof::ReportInput in;
  in.title = "AI CPU unit test";
  in.config = &cfg;
  prof::OpRecord k;
  k.op_name = "dense/MatMul";
  k.op_type = "MatMul";
  k.task_type = "AI_CORE";
  k.start_cycle = 0;
  k.cycles = 2000;
  k.counters = CounterDelta(json{{"chip", json::object()}});
  in.ops = {k};
  prof::set_wait_cycles(in.ops);
  in.ai_cpu = prof::ai_cpu_rows({task(500, 1000, true), task(1500, 500, true)}, 0);

  const auto dir = std::filesystem::temp_directory_path() / "npusim_report_ai_cpu_unit";
  std::filesystem::remove_all(dir);
  prof::write_report(dir.string(), in);

  std::string header;
  const std::vector<std::string> rows = test::csv_lines(dir / "op_summary.csv", &header);
  REQUIRE(rows.size() == 3);
  // Task IDs follow the kernel's; stream, names, Task Type, start / duration / wait in us at the
  // chip's clock, Block Dim 0, the label's tensors.
  auto us = [&](double cycles) { return fmt::format("{:.3f}", cycles / cfg.clock_mhz); };
  CHECK(rows[1].rfind(fmt::format("1,3,dropout/DropOutGenMask,DropOutGenMask,AI_CPU,{},{},{},0,0,"
                                  "2,DT_UINT64,ND,\"8,128\",DT_BOOL,ND,",
                                  us(500), us(1000), us(500)),
                      0) == 0);
  CHECK(rows[2].find(fmt::format(",AI_CPU,{},{},{},", us(1500), us(500), us(0))) !=
        std::string::npos);
  CHECK(rows[1].find(",500,1000,500,") != std::string::npos);  // the cycle columns
  const std::string stat = test::read_text(dir / "op_statistic.csv");
  INFO(stat);
  CHECK(stat.find(fmt::format("DropOutGenMask,AI_CPU,2,{},", us(1500))) != std::string::npos);
}

TEST_CASE("a runtime report has the AI_CPU rows and an AI CPU lane in its trace") {
  const ChipConfig cfg = load_chip_config("tiny");
  prof::RuntimeReportInput in;
  in.title = "AI CPU runtime report";
  in.config = &cfg;
  in.ai_cpu = {task(200, 800, true), task(1000, 300, false)};
  const auto dir = std::filesystem::temp_directory_path() / "npusim_report_ai_cpu_runtime";
  std::filesystem::remove_all(dir);
  prof::write_runtime_report(dir.string(), in);
  std::string header;
  const std::vector<std::string> rows = test::csv_lines(dir / "op_summary.csv", &header);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].rfind("0,3,dropout/DropOutGenMask,DropOutGenMask,AI_CPU,", 0) == 0);
  CHECK(rows[1].rfind("1,3,DropOutGenMask,DropOutGenMask,AI_CPU,", 0) == 0);
  const json trace = json::parse(test::read_text(dir / "trace.json"));
  int lanes = 0;
  std::vector<double> starts;
  for (const json& e : trace["traceEvents"]) {
    if (e.value("name", "") == "thread_name" && e["args"]["name"] == "AI CPU") ++lanes;
    if (e.value("cat", "") == "ai_cpu") starts.push_back(e["ts"].get<double>());
  }
  CHECK(lanes == 1);
  CHECK(starts == std::vector<double>{cfg.cycles_to_us(200.0), cfg.cycles_to_us(1000.0)});
}
