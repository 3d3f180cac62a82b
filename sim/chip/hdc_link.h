// The host-device link (HDC over PCIe): one DMA engine per direction, each serving its copies
// in submission order. A copy of N bytes occupies its direction for
//   hdc_latency_us * clock_mhz + N / hdc_bytes_per_cycle   cycles
// (hdc_bytes_per_cycle = hdc_gbps * 1000 / clock_mhz). The functional copy is the caller's.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include <systemc>

#include "sim/config/chip_config.h"
#include "sim/counters/counters.h"
#include "sim/counters/observer.h"

namespace npusim {

class HdcLink : public sc_core::sc_module {
 public:
  struct Copy {
    bool host_to_device = true;
    uint64_t bytes = 0;
    bool done = false;
    uint64_t start_ps = 0, end_ps = 0;  // filled in when it ran
  };

  HdcLink(sc_core::sc_module_name name, const ChipConfig& cfg, const CounterGroup& counters,
          const std::vector<ChipObserver*>& observers);
  // Queues `copy` on its direction (from outside or inside the simulation); it runs when the
  // simulation runs and sets copy->done. `copy` must outlive that.
  void submit(Copy* copy);

 private:
  void direction_thread(int dir);  // dir 0: host->device, 1: device->host

  const ChipConfig& m_cfg;
  const std::vector<ChipObserver*>& m_observers;
  std::deque<Copy*> m_queue[2];
  sc_core::sc_event m_submitted[2];
  Counter* m_bytes[2];
  Counter* m_busy[2];
  Counter* m_copies[2];
};

}  // namespace npusim
