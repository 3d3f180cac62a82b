// Communication records in the report (adapter/profiler/comm_record.h) without running a system:
// kernels and collectives on two chips at hand-picked times, so summary.txt's compute /
// communication / overlap split per chip and the HCCL rows' waits and link figures can be derived
// by hand.
#include <catch2/catch.hpp>

#include <filesystem>

#include <fmt/format.h>

#include "adapter/profiler/comm_record.h"
#include "adapter/profiler/report_writer.h"
#include "sim/config/chip_config.h"
#include "tests/report/report_test_util.h"

using namespace npusim;
using nlohmann::json;

namespace {

prof::OpRecord kernel(int chip, uint64_t start, uint64_t cycles) {
  prof::OpRecord op;
  op.op_name = "k" + std::to_string(chip) + "_" + std::to_string(start);
  op.op_type = "MatMul";
  op.task_type = "AI_CORE";
  op.chip = chip;
  op.start_cycle = start;
  op.cycles = cycles;
  op.counters = CounterDelta(json{{"chip", json::object()}});
  return op;
}

}  // namespace

TEST_CASE("report: compute, communication and overlap per chip; HCCL rows") {
  const ChipConfig cfg = load_chip_config("tiny");
  prof::ReportInput in;
  in.title = "comm unit test";
  in.config = &cfg;
  // chip 0: kernels [0, 1000) and [1500, 2500); chip 1: kernel [0, 500).
  in.ops = {kernel(0, 0, 1000), kernel(1, 0, 500), kernel(0, 1500, 1000)};
  prof::set_wait_cycles(in.ops);
  // One all_reduce of 1 MiB on both chips over [800, 2000): chip 0 sent 32 KiB over one 56 GB/s
  // link, chip 1 16 KiB.
  prof::CommRecord c;
  c.op_name = "hcom_allReduce_0";
  c.op_type = "HcomAllReduce";
  c.collective = "all_reduce";
  c.algorithm = "ring";
  c.chips = {0, 1};
  c.dtype = "DT_FLOAT";
  c.reduce_op = "sum";
  c.send_count = c.recv_count = 262144;
  c.bytes = 1 << 20;
  c.bus_factor = 1.0;
  c.start_cycle = 800;
  c.cycles = 1200;
  c.links = {{"c0->c1", 0, 56.0, 32768}, {"c1->c0", 1, 56.0, 16384}};
  in.comms = {c};

  const auto dir = std::filesystem::temp_directory_path() / "npusim_report_comm_unit";
  std::filesystem::remove_all(dir);
  prof::write_report(dir.string(), in);

  // summary.txt, chip 0: compute = 1000 + 1000 cycles; communication 1200; overlap = [800, 1000)
  // + [1500, 2000) = 700; exposed 500; busy = [0, 2500) = 2500. chip 1: compute 500, overlap 0.
  const std::string summary = test::read_text(dir / "summary.txt");
  auto us = [&](double cycles) { return fmt::format("{:.3f}", cycles / cfg.clock_mhz); };
  INFO(summary);
  CHECK(summary.find(fmt::format("      0 {:>14} {:>14} {:>14} {:>14} {:>14}", us(2000), us(1200),
                                 us(700), us(500), us(2500))) != std::string::npos);
  CHECK(summary.find(fmt::format("      1 {:>14} {:>14} {:>14} {:>14} {:>14}", us(500), us(1200),
                                 us(0), us(1200), us(1700))) != std::string::npos);

  // op_summary.csv: three kernel rows, then an HCCL row per rank with its chip's wait (chip 0's
  // kernel ended at 1000 > 800: none ended before the collective, so the wait runs from 0;
  // chip 1's ended at 500) and the link figures.
  std::string header;
  const std::vector<std::string> rows = test::csv_lines(dir / "op_summary.csv", &header);
  REQUIRE(rows.size() == 5);
  CHECK(header.find(",chip,rank,ranks,collective,algorithm,reduce_op,comm_bytes,") !=
        std::string::npos);
  CHECK(rows[0].find(",0,N/A,N/A,N/A") != std::string::npos);  // a kernel row: chip 0
  CHECK(rows[3].rfind("3,0,hcom_allReduce_0,HcomAllReduce,HCCL,", 0) == 0);
  CHECK(rows[3].find(",800,1200,800,") != std::string::npos);  // start, duration, wait cycles
  CHECK(rows[4].find(",800,1200,300,") != std::string::npos);
  // chip 0: 32 KiB over 56 GB/s in 1200 cycles at the tiny chip's clock (about 90 %).
  const double util = 100.0 * 32768 / (56e3 * 1200 / cfg.clock_mhz);
  CHECK(rows[3].find(fmt::format(",0,0,2,all_reduce,ring,sum,1048576,")) != std::string::npos);
  CHECK(rows[3].find(fmt::format(",32768,56,{:.3f}", util)) != std::string::npos);
  CHECK(rows[4].find(fmt::format(",16384,56,{:.3f}", util / 2)) != std::string::npos);

  // op_statistic.csv counts one HCCL task per rank; trace.json has a lane per chip.
  CHECK(test::read_text(dir / "op_statistic.csv").find("HcomAllReduce,HCCL,2,") !=
        std::string::npos);
  const json trace = json::parse(test::read_text(dir / "trace.json"));
  int lanes = 0;
  for (const json& e : trace["traceEvents"])
    if (e.value("name", "") == "process_name" &&
        e["args"]["name"].get<std::string>().find(" HCCL") != std::string::npos)
      ++lanes;
  CHECK(lanes == 2);
}
