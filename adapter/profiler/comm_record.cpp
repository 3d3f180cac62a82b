#include "adapter/profiler/comm_record.h"

#include <algorithm>
#include <cctype>
#include <optional>

#include <fmt/format.h>

#include "adapter/profiler/op_metrics.h"
#include "common/error.h"
#include "sim/counters/trace.h"
#include "sim/system/fabric.h"

namespace npusim::prof {
namespace {

using nlohmann::json;

// Trace processes of the communication lanes: one per chip, after every process of a chip's
// own trace (sim/counters/trace.cpp: cores from 100; runtime_report.cpp: host, chip).
constexpr uint32_t kCommPidBase = 10000;
constexpr uint32_t kCommTid = 1;
// Flow ids of the transfers, above the flag flows' (which count from 0).
constexpr uint64_t kFlowIdBase = uint64_t{1} << 40;

// The chip that sends on a channel: "c3->c5" and "c3.nic_out" -> 3; "c3.nic_in" -> -1.
int sending_chip(const std::string& channel) {
  if (channel.size() < 2 || channel[0] != 'c' || !std::isdigit(channel[1])) return -1;
  if (channel.find(".nic_in") != std::string::npos) return -1;
  return std::stoi(channel.substr(1));
}

void collect_bytes(const json& node, const std::string& path,
                   std::map<std::string, uint64_t>& out) {
  if (!node.is_object()) return;
  if (node.contains("value") && !node["value"].is_object()) {
    constexpr const char* kLeaf = ".bytes";
    const size_t n = path.size(), k = std::char_traits<char>::length(kLeaf);
    if (n > k && path.compare(n - k, k, kLeaf) == 0)
      out[path.substr(0, n - k)] = node["value"].get<uint64_t>();
    return;
  }
  for (const auto& [key, child] : node.items())
    collect_bytes(child, path.empty() ? key : path + "." + key, out);
}

using trace_events::meta;

}  // namespace

std::string hcom_op_type(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::all_reduce: return "HcomAllReduce";
    case CollectiveKind::all_gather: return "HcomAllGather";
    case CollectiveKind::reduce_scatter: return "HcomReduceScatter";
    case CollectiveKind::broadcast: return "HcomBroadcast";
    case CollectiveKind::all_to_all: return "HcomAllToAll";
    case CollectiveKind::send_recv: return "HcomSend";
  }
  return "Hcom";
}

std::string hcom_op_name(CollectiveKind k, uint64_t index) {
  std::string t = hcom_op_type(k).substr(4);  // "AllReduce"
  t[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(t[0])));
  return fmt::format("hcom_{}_{}", t, index);
}

double collective_bus_factor(CollectiveKind k, int n) {
  switch (k) {
    case CollectiveKind::all_reduce: return 2.0 * (n - 1) / n;
    case CollectiveKind::all_gather:
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_to_all: return double(n - 1) / n;
    default: return 1.0;
  }
}

uint64_t collective_size_bytes(const CollectiveCall& c) {
  switch (c.kind) {
    case CollectiveKind::all_gather: return collective_recv_bytes(c);
    case CollectiveKind::reduce_scatter: return collective_send_bytes(c);
    case CollectiveKind::all_to_all: return collective_send_bytes(c);
    default: return collective_send_bytes(c);
  }
}

std::map<std::string, uint64_t> fabric_channel_bytes(const json& system_counters) {
  std::map<std::string, uint64_t> out;
  if (system_counters.contains("fabric")) collect_bytes(system_counters["fabric"], "", out);
  return out;
}

CommRecord comm_record(const SystemSimulator& sys, const CollectiveCall& call,
                       const CollectiveResult& result,
                       const std::map<std::string, uint64_t>& before, uint64_t index) {
  CommRecord c;
  c.op_name = hcom_op_name(call.kind, index);
  c.op_type = hcom_op_type(call.kind);
  c.collective = collective_name(call.kind);
  c.algorithm = result.algorithm;
  c.chips = call.chips;
  c.dtype = msprof_dtype(call.dtype);
  const bool reduces =
      call.kind == CollectiveKind::all_reduce || call.kind == CollectiveKind::reduce_scatter;
  c.reduce_op = reduces ? reduce_op_name(call.op) : "";
  const uint64_t es = static_cast<uint64_t>(isa::dtype_size(call.dtype));
  c.send_count = collective_send_bytes(call) / es;
  c.recv_count = collective_recv_bytes(call) / es;
  c.bytes = collective_size_bytes(call);
  c.bus_factor = collective_bus_factor(call.kind, static_cast<int>(call.chips.size()));
  c.start_cycle = result.start_cycle;
  c.cycles = result.cycles;
  c.reduce_cycles = result.reduce_cycles;
  c.steps = result.step_records;
  const std::map<std::string, uint64_t> after = fabric_channel_bytes(sys.counters());
  const Fabric& fabric = sys.fabric();
  for (size_t i = 0; i < fabric.channel_count(); ++i) {
    const std::string& name = fabric.channel_name(static_cast<int>(i));
    auto a = after.find(name);
    auto b = before.find(name);
    const uint64_t grown = (a == after.end() ? 0 : a->second) - (b == before.end() ? 0 : b->second);
    if (grown)
      c.links.push_back(
          {name, sending_chip(name), fabric.channel_gbps(static_cast<int>(i)), grown});
  }
  return c;
}

double comm_time_us(const CommRecord& c, double clock_mhz) {
  return static_cast<double>(c.cycles) / clock_mhz;
}

double comm_algbw_gbps(const CommRecord& c, double clock_mhz) {
  const double us = comm_time_us(c, clock_mhz);
  return us > 0 ? static_cast<double>(c.bytes) / (us * 1e3) : 0.0;
}

CommRecord comm_record(const rt::CollectiveRecord& rec, uint64_t index) {
  const CollectiveKind kind = collective_from_name(rec.collective);
  const std::optional<isa::Dtype> dtype = isa::dtype_from_name(rec.dtype);
  if (!dtype) throw Error(fmt::format("collective record: unknown dtype '{}'", rec.dtype));
  CommRecord c;
  c.op_name = hcom_op_name(kind, index);
  c.op_type = hcom_op_type(kind);
  c.collective = rec.collective;
  c.algorithm = rec.algorithm;
  c.chips = rec.chips;
  c.dtype = msprof_dtype(*dtype);
  c.reduce_op = rec.op;
  const uint64_t es = static_cast<uint64_t>(isa::dtype_size(*dtype));
  c.send_count = rec.bytes / es;
  c.recv_count = rec.recv_bytes / es;
  // collective_size_bytes: the gathered output for all_gather, else one input buffer.
  c.bytes = kind == CollectiveKind::all_gather ? rec.recv_bytes : rec.bytes;
  c.bus_factor = collective_bus_factor(kind, static_cast<int>(rec.chips.size()));
  c.start_cycle = rec.start_cycle;
  c.cycles = rec.end_cycle - rec.start_cycle;
  c.reduce_cycles = rec.reduce_cycles;
  c.steps = rec.step_records;
  for (const rt::CollectiveRecord::Link& l : rec.links)
    c.links.push_back({l.channel, sending_chip(l.channel), l.gbps, l.bytes});
  return c;
}

CommRankMetrics comm_rank_metrics(const CommRecord& c, int rank, double clock_mhz) {
  CommRankMetrics m;
  m.chip = c.chips.at(static_cast<size_t>(rank));
  for (const CommLinkUse& l : c.links)
    if (l.chip == m.chip) {
      m.link_bytes += l.bytes;
      m.link_gbps += l.gbps;
    }
  const double capacity = m.link_gbps * 1e3 * comm_time_us(c, clock_mhz);  // bytes
  m.link_utilization = capacity > 0 ? static_cast<double>(m.link_bytes) / capacity : 0.0;
  return m;
}

void add_comm_trace(json& trace, const std::vector<CommRecord>& comms, double clock_mhz,
                    uint64_t max_flows) {
  if (!trace.is_object()) trace = json::object();
  if (!trace.contains("traceEvents")) trace["traceEvents"] = json::array();
  json& ev = trace["traceEvents"];
  auto us = [&](uint64_t cycles) { return static_cast<double>(cycles) / clock_mhz; };
  auto pid = [](int chip) { return kCommPidBase + static_cast<uint32_t>(chip); };
  std::vector<int> chips;
  for (const CommRecord& c : comms)
    for (int chip : c.chips)
      if (std::find(chips.begin(), chips.end(), chip) == chips.end()) chips.push_back(chip);
  std::sort(chips.begin(), chips.end());
  for (int chip : chips) {
    ev.push_back(meta("process_name", pid(chip), -1, "name", fmt::format("chip{} HCCL", chip)));
    ev.push_back(meta("process_sort_index", pid(chip), -1, "sort_index", 1000 + chip));
    ev.push_back(meta("thread_name", pid(chip), kCommTid, "name", "communication"));
  }
  uint64_t flows = 0, dropped = 0;
  for (const CommRecord& c : comms) {
    for (size_t r = 0; r < c.chips.size(); ++r)
      ev.push_back({{"ph", "X"},
                    {"pid", pid(c.chips[r])},
                    {"tid", kCommTid},
                    {"ts", us(c.start_cycle)},
                    {"dur", us(c.cycles)},
                    {"name", c.op_name},
                    {"cat", "hccl"},
                    {"args",
                     {{"collective", c.collective},
                      {"algorithm", c.algorithm},
                      {"rank", r},
                      {"bytes", c.bytes},
                      {"steps", c.steps.size()}}}});
    for (size_t s = 0; s < c.steps.size(); ++s) {
      const CollectiveStep& step = c.steps[s];
      for (int chip : c.chips)
        ev.push_back({{"ph", "X"},
                      {"pid", pid(chip)},
                      {"tid", kCommTid},
                      {"ts", us(step.start_cycle)},
                      {"dur", us(step.cycles)},
                      {"name", fmt::format("step {}", s)},
                      {"cat", "hccl"},
                      {"args", {{"reduce_cycles", step.reduce_cycles}}}});
      for (const CollectiveStepTransfer& t : step.transfers) {
        if (flows >= max_flows) {
          ++dropped;
          continue;
        }
        const uint64_t id = kFlowIdBase + flows++;
        // The arrival, inside the receiver's step slice (its end would bind to the next one).
        const double end =
            std::min(us(step.start_cycle + t.cycles), us(step.start_cycle + step.cycles) - 0.0005);
        ev.push_back({{"ph", "s"},
                      {"pid", pid(t.src_chip)},
                      {"tid", kCommTid},
                      {"ts", us(step.start_cycle)},
                      {"name", "transfer"},
                      {"cat", "hccl"},
                      {"id", id},
                      {"args", {{"bytes", t.bytes}, {"to", t.dst_chip}}}});
        ev.push_back({{"ph", "f"},
                      {"bp", "e"},
                      {"pid", pid(t.dst_chip)},
                      {"tid", kCommTid},
                      {"ts", std::max(end, us(step.start_cycle))},
                      {"name", "transfer"},
                      {"cat", "hccl"},
                      {"id", id}});
      }
    }
  }
  trace["otherData"]["hccl_flows"] = flows;
  trace["otherData"]["hccl_dropped_flows"] = dropped;
}

}  // namespace npusim::prof
