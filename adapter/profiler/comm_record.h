// Communication tasks in the reports (docs/reports.md, "Communication (HCCL) tasks"): what a
// report knows about one collective, as msprof lists HCCL's tasks. A caller that ran collectives
// on a SystemSimulator fills one CommRecord per collective (comm_record() does it from the call,
// its result and the link counters) and passes them in ReportInput::comms; the report writer
// then gives
//   op_summary.csv  a row per collective and rank, Task Type HCCL: collective, algorithm, bytes,
//                   bandwidths, the bytes the rank's links sent and their utilisation
//   op_statistic    the rows by Hcom op type
//   trace.json      a communication lane per chip (the collective, its steps) with a flow from
//                   the sending chip to the receiving one for every transfer of a step
//   summary.txt     the collectives, and per chip its compute, communication and their overlap
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "adapter/runtime/stream.h"
#include "sim/collective/collective.h"
#include "sim/config/system_config.h"

namespace npusim::prof {

// One link direction (a Fabric channel) during a collective.
struct CommLinkUse {
  std::string channel;  // the Fabric's name: "c0->c1" (HCCS), "c0.nic_out", "c0.nic_in" (RoCE)
  int chip = -1;        // the chip that sends on it (c0->c1, c0.nic_out: 0); -1 for a nic_in
  double gbps = 0;      // its bandwidth per direction (system config: link.gbps or nic.gbps)
  uint64_t bytes = 0;   // bytes it carried during the collective
};

// One collective as its communicator ran it (HCCL's task).
struct CommRecord {
  std::string op_name;     // msprof "Op Name", e.g. "hcom_allReduce_3"
  std::string op_type;     // CANN's op type: HcomAllReduce, HcomAllGather, ... (hcom_op_type)
  std::string collective;  // all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, ...
  std::string algorithm;   // the one that ran: mesh, ring, halving_doubling, mesh_ring, ...
  std::vector<int> chips;  // the communicator: rank r is chips[r]
  std::string dtype;       // msprof name, "DT_FLOAT"
  std::string reduce_op;   // sum, prod, max, min; "" for collectives that do not reduce
  uint64_t send_count = 0, recv_count = 0;  // elements of one rank's send / receive buffer
  // The size as nccl-tests counts it (bytes of one buffer; all_gather: the gathered output;
  // reduce_scatter: the input): algbw = bytes / time, busbw = algbw x bus_factor.
  uint64_t bytes = 0;
  double bus_factor = 1;
  uint64_t stream = 0;
  uint64_t start_cycle = 0;  // on the system's timeline (AI-core cycles, every chip's clock)
  uint64_t cycles = 0;
  uint64_t reduce_cycles = 0;         // of `cycles`: vector reduce kernels (a reduction not inline)
  std::vector<CollectiveStep> steps;  // optional: the steps and their transfers (trace flows)
  std::vector<CommLinkUse> links;     // the channels that carried bytes
};

// CANN's op type of a collective (HcomAllReduce, HcomAllGather, HcomReduceScatter, HcomBroadcast,
// HcomAllToAll, HcomSend) and msprof's op name stem (hcom_allReduce, ...).
std::string hcom_op_type(CollectiveKind k);
std::string hcom_op_name(CollectiveKind k, uint64_t index);
// nccl-tests' bus bandwidth factor (doc/PERFORMANCE.md): all_reduce 2(n-1)/n; all_gather,
// reduce_scatter, all_to_all (n-1)/n; broadcast and send_recv 1.
double collective_bus_factor(CollectiveKind k, int ranks);
// The size nccl-tests reports for the call (CommRecord::bytes).
uint64_t collective_size_bytes(const CollectiveCall& call);

// Bytes per Fabric channel from SystemSimulator::counters() ("fabric" subtree), by channel name.
std::map<std::string, uint64_t> fabric_channel_bytes(const nlohmann::json& system_counters);

// The record of a collective that ran on `sys`: `before` is fabric_channel_bytes of the
// counters just before run_collective (the links' bytes are the growth since).
CommRecord comm_record(const SystemSimulator& sys, const CollectiveCall& call,
                       const CollectiveResult& result,
                       const std::map<std::string, uint64_t>& before, uint64_t index);

// The record of a collective the runtime ran (Device::collective_records(): a TensorFlow run's
// NpuCollective ops, ...): the same fields from the runtime's record, its start on the device
// timeline. `index` numbers the op name (hcom_allReduce_<index>).
CommRecord comm_record(const rt::CollectiveRecord& rec, uint64_t index);

// Per rank (a row of op_summary.csv): what the chip's own links sent (its HCCS links and NIC out
// that carried bytes) and their utilisation: bytes / (their summed bandwidth x the collective's
// time).
struct CommRankMetrics {
  int chip = 0;
  uint64_t link_bytes = 0;
  double link_gbps = 0;         // summed bandwidth of the links it sent on
  double link_utilization = 0;  // in [0, 1]; 0 if it sent nothing
};
CommRankMetrics comm_rank_metrics(const CommRecord& c, int rank, double clock_mhz);
double comm_time_us(const CommRecord& c, double clock_mhz);
double comm_algbw_gbps(const CommRecord& c, double clock_mhz);

// A communication lane per chip of the collectives (one process per chip, "chip<c> HCCL": the
// collective as a slice, its steps nested in it) and a flow from sender to receiver for each
// transfer of a step, at most `max_flows` of them (later ones are left out and counted in
// otherData.hccl_dropped_flows). Appended to `trace` (a Chrome trace object; created if null).
void add_comm_trace(nlohmann::json& trace, const std::vector<CommRecord>& comms, double clock_mhz,
                    uint64_t max_flows = 200000);

}  // namespace npusim::prof
