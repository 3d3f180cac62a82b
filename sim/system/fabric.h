// The links between the chips of a system (SystemConfig): every link direction is a channel of
// fixed bandwidth shared by the transfers that cross it. A transfer from chip a to chip b
// follows its route (a full mesh: the a->b HCCS link; a ring: the hops around the shorter way;
// another server: a's NIC out, the switch, b's NIC in), waits the route's latency, then moves
// its bytes as a fluid: at every moment each transfer moves at the smallest share it gets on
// the channels of its route, a channel's bandwidth being split equally between the transfers
// crossing it. Rates are recomputed whenever a transfer joins or leaves. The functional copy is
// the caller's.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <systemc>

#include "sim/config/system_config.h"
#include "sim/counters/counters.h"

namespace npusim {

class Fabric : public sc_core::sc_module {
 public:
  SC_HAS_PROCESS(Fabric);
  struct Transfer {
    int src = 0, dst = 0;  // chip indices, src != dst
    uint64_t bytes = 0;
    bool done = false;
    uint64_t start_ps = 0, end_ps = 0;  // submitted, last byte arrived
  };
  struct Route {
    std::vector<int> channels;  // channel indices in order
    double latency_us = 0;
  };

  // Counters register under <name>.<channel>.{bytes,busy_cycles} (cycles of clock_mhz).
  Fabric(sc_core::sc_module_name name, const SystemConfig& cfg, CounterRegistry& counters);
  // Starts `t` now (from outside or inside the simulation); it completes while the simulation
  // runs and sets t->done. `t` must outlive that.
  void submit(Transfer* t);
  Route route(int src, int dst) const;
  const std::string& channel_name(int c) const { return m_channels[c].name; }
  double channel_gbps(int c) const { return m_channels[c].gbps; }
  size_t channel_count() const { return m_channels.size(); }

 private:
  struct Channel {
    std::string name;  // "c0->c1", "c0.nic_out", "c3.nic_in"
    double gbps = 0;
    Counter* bytes = nullptr;
    Counter* busy = nullptr;  // ps with at least one transfer moving (scaled to cycles)
    int active = 0;
  };
  struct Flow {
    Transfer* t;
    Route route;
    uint64_t ready_ps;  // latency passed: bytes start to move
    double remaining;   // bytes
    double rate = 0;    // bytes per ps while the current set of flows holds
  };
  // A bandwidth in bytes per simulated ps, a latency in simulated ps.
  double bytes_per_ps(double gbps) const;
  uint64_t us_to_ps(double us) const;
  int add_channel(const std::string& name, double gbps, CounterRegistry& counters);
  void build_routes();
  void run();          // the thread: admits, shares and completes flows
  void admit_ready();  // flows whose latency has passed start to move
  void share();        // recomputes every moving flow's rate
  void advance(uint64_t elapsed_ps);
  uint64_t next_event_ps() const;

  const SystemConfig& m_cfg;
  std::string m_prefix;
  std::vector<Channel> m_channels;
  std::vector<std::vector<int>> m_link;  // [src][dst] -> channel of a direct link, or -1
  std::vector<int> m_nic_out, m_nic_in;  // per chip (servers > 1)
  std::vector<Flow> m_waiting, m_moving;
  sc_core::sc_event m_submitted;
};

}  // namespace npusim
