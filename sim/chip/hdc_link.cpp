#define SC_INCLUDE_DYNAMIC_PROCESSES
#include "sim/chip/hdc_link.h"

#include <fmt/format.h>

#include "common/error.h"
#include "sim/core/core_env.h"

namespace npusim {

HdcLink::HdcLink(sc_core::sc_module_name name, const ChipConfig& cfg,
                 const CounterGroup& counters, const std::vector<ChipObserver*>& observers)
    : sc_module(name), m_cfg(cfg), m_observers(observers) {
  if (!(cfg.hdc_gbps > 0) || cfg.hdc_latency_us < 0)
    throw ConfigError(fmt::format("{}: hdc.gbps ({}) must be positive and hdc.latency_us ({}) "
                                  "not negative", cfg.source_file, cfg.hdc_gbps,
                                  cfg.hdc_latency_us));
  const char* dir_name[2] = {"h2d", "d2h"};
  const char* dir_desc[2] = {"host to device", "device to host"};
  for (int d = 0; d < 2; ++d) {
    const std::string n = dir_name[d], desc = dir_desc[d];
    m_bytes[d] = &counters.add(n + "_bytes", "bytes", "bytes copied " + desc);
    m_busy[d] = &counters.add(n + "_busy_cycles", "cycles",
                              "cycles the " + desc + " DMA was busy (latency included)", 1000);
    m_copies[d] = &counters.add(n + "_copies", "copies", "copies " + desc);
    sc_core::sc_spawn([this, d] { direction_thread(d); }, dir_name[d]);
  }
}

void HdcLink::submit(Copy* copy) {
  const int d = copy->host_to_device ? 0 : 1;
  m_queue[d].push_back(copy);
  m_submitted[d].notify(sc_core::SC_ZERO_TIME);
}

void HdcLink::direction_thread(int d) {
  for (;;) {
    while (m_queue[d].empty()) wait(m_submitted[d]);
    Copy* c = m_queue[d].front();
    m_queue[d].pop_front();
    const double cycles = m_cfg.hdc_latency_us * m_cfg.clock_mhz +
                          static_cast<double>(c->bytes) / m_cfg.hdc_bytes_per_cycle();
    c->start_ps = now_ps();
    wait(cycles_to_time(cycles));
    c->end_ps = now_ps();
    m_bytes[d]->add(c->bytes);
    m_busy[d]->add(c->end_ps - c->start_ps);
    m_copies[d]->inc();
    for (ChipObserver* o : m_observers) o->on_hdc(d == 0, c->start_ps, c->end_ps, c->bytes);
    c->done = true;
  }
}

}  // namespace npusim
