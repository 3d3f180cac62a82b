// The Simulator: owns the elaborated chip and drives SystemC. Each kernel launch or HDC copy
// is one or more sc_start() runs to quiescence; simulated time only moves forward.
#include "sim/simulator.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>
#include <systemc>

#include "common/error.h"
#include "sim/chip/chip.h"
#include "sim/counters/counters.h"
#include "sim/counters/trace.h"

namespace npusim {

using sc_core::sc_time;
using sc_core::sc_time_stamp;

namespace {

bool g_elaborated = false;  // SystemC elaborates once per process
constexpr const char* kChipName = "chip";  // the chip module: root of the counter tree
constexpr uint64_t kPsPerCycle = 1000;

uint64_t ceil_cycles(uint64_t ps) { return (ps + kPsPerCycle - 1) / kPsPerCycle; }

void check_config(const ChipConfig& cfg) {
  if (!(cfg.clock_mhz > 0))
    throw ConfigError(fmt::format("{}: clock_mhz ({}) must be positive", cfg.source_file,
                                  cfg.clock_mhz));
  if (cfg.total_cores() <= 0)
    throw ConfigError(fmt::format("{}: chip '{}' has no cores", cfg.source_file, cfg.name));
  if (cfg.scalar_cycles_per_insn < 0)
    throw ConfigError(fmt::format("{}: scalar.cycles_per_insn ({}) must not be negative",
                                  cfg.source_file, cfg.scalar_cycles_per_insn));
  // Checked again by the modules; checked here so that a bad config fails before SystemC
  // elaborates anything (which can happen only once per process).
  if (!(cfg.hbm_gbps > 0))
    throw ConfigError(fmt::format("{}: memory.hbm.gbps ({}) must be positive", cfg.source_file,
                                  cfg.hbm_gbps));
  if (cfg.l2_bytes > 0 && (!(cfg.l2_gbps > 0) || cfg.l2_line_bytes == 0 || cfg.l2_ways <= 0))
    throw ConfigError(fmt::format("{}: memory.l2 needs positive gbps, line_bytes and ways (got "
                                  "{}, {}, {})", cfg.source_file, cfg.l2_gbps,
                                  cfg.l2_line_bytes, cfg.l2_ways));
  if (!(cfg.hdc_gbps > 0) || cfg.hdc_latency_us < 0)
    throw ConfigError(fmt::format("{}: hdc.gbps ({}) must be positive and hdc.latency_us ({}) "
                                  "not negative", cfg.source_file, cfg.hdc_gbps,
                                  cfg.hdc_latency_us));
}

// Runs the simulation until nothing is left to do, turning SystemC errors into npusim::Error.
void run_to_quiescence() {
  try {
    sc_core::sc_start();
  } catch (const sc_core::sc_report& e) {
    throw Error(std::string("SystemC: ") + e.what());
  }
}

}  // namespace

struct Simulator::Impl {
  Impl(const ChipConfig& c, const SimOptions& o) : cfg(c), opts(o), gm(c.hbm_bytes) {}
  ChipConfig cfg;
  SimOptions opts;
  DeviceMemory gm;
  CounterRegistry counters;
  std::vector<uint64_t> launch_base;  // counter snapshot at the start of the launch (reused)
  std::unique_ptr<TraceRecorder> trace;
  std::unique_ptr<Chip> chip;

  HdcResult hdc_copy(bool host_to_device, uint64_t bytes) {
    HdcLink::Copy copy;
    copy.host_to_device = host_to_device;
    copy.bytes = bytes;
    chip->hdc().submit(&copy);
    run_to_quiescence();
    if (!copy.done) throw Error("HDC copy did not complete");
    HdcResult r;
    r.start_cycle = copy.start_ps / kPsPerCycle;
    r.cycles = ceil_cycles(copy.end_ps - copy.start_ps);
    r.time_us = cfg.cycles_to_us(static_cast<double>(copy.end_ps - copy.start_ps) / kPsPerCycle);
    return r;
  }
};

Simulator::Simulator(const ChipConfig& cfg, const SimOptions& opts) {
  if (g_elaborated)
    throw Error("a Simulator was already constructed in this process; SystemC elaborates one "
                "chip per process (run another configuration in another process)");
  check_config(cfg);
  g_elaborated = true;
  setenv("SYSTEMC_DISABLE_COPYRIGHT_MESSAGE", "1", 0);
  try {
    // One AI-core cycle is 1 ns; 1 ps resolution keeps fractional cycles of shared bandwidth.
    sc_core::sc_set_time_resolution(1, sc_core::SC_PS);
  } catch (const sc_core::sc_report& e) {
    throw Error(std::string("cannot set the SystemC time resolution to 1 ps: ") + e.what());
  }
  if (sc_core::sc_get_time_resolution() != sc_time(1, sc_core::SC_PS))
    throw Error("the SystemC time resolution is not 1 ps");
  m_impl = std::make_unique<Impl>(cfg, opts);
  std::vector<ChipObserver*> observers;
  if (opts.trace) {
    m_impl->trace = std::make_unique<TraceRecorder>(cfg.clock_mhz, opts.trace_max_events);
    observers.push_back(m_impl->trace.get());
  }
  try {
    m_impl->chip = std::make_unique<Chip>(kChipName, m_impl->cfg, m_impl->gm, m_impl->counters,
                                          observers);
    // End elaboration now so that elaboration errors surface here, not in the first run.
    sc_core::sc_start(sc_core::SC_ZERO_TIME);
  } catch (const sc_core::sc_report& e) {
    throw Error(std::string("SystemC elaboration failed: ") + e.what());
  }
}

Simulator::~Simulator() = default;

const ChipConfig& Simulator::config() const { return m_impl->cfg; }
DeviceMemory& Simulator::gm() { return m_impl->gm; }

KernelResult Simulator::run(const KernelLaunch& launch) {
  if (!launch.program) throw Error("run: the launch has no program");
  Impl& I = *m_impl;
  I.counters.snapshot(I.launch_base);
  const sc_time start = sc_time_stamp();
  I.chip->begin_launch(*launch.program, launch.args, launch.block_dim, I.opts.functional,
                         I.opts.max_insns_per_block);
  run_to_quiescence();

  KernelResult r;
  switch (I.chip->outcome()) {
    case Chip::Outcome::Done:
      r.ok = true;
      break;
    case Chip::Outcome::Fault:
      r.error = I.chip->fault_message();
      break;
    case Chip::Outcome::Deadlock:
      r.error = I.chip->deadlock_report();
      I.chip->abort();
      run_to_quiescence();  // unwinds every blocked process (zero simulated time)
      break;
  }
  const uint64_t duration_ps = time_ps(I.chip->end_time() - start);
  I.chip->end_launch(r.ok);
  r.start_cycle = time_ps(start) / kPsPerCycle;
  r.cycles = ceil_cycles(duration_ps);
  r.time_us = I.cfg.cycles_to_us(static_cast<double>(duration_ps) / kPsPerCycle);
  r.counter_delta = I.counters.delta_since(I.launch_base);
  r.counter_delta.set_root(kChipName);
  if (launch.counter_tree) r.counters = r.counter_delta.tree();
  return r;
}

HdcResult Simulator::copy_host_to_device(uint64_t dev_addr, const void* src, uint64_t bytes) {
  if (!m_impl->gm.in_bounds(dev_addr, bytes))
    throw Error(fmt::format("copy_host_to_device: device range [{:#x}, {:#x}) is outside device "
                            "memory of {} bytes", dev_addr, dev_addr + bytes,
                            m_impl->gm.capacity()));
  if (bytes) m_impl->gm.write(dev_addr, src, bytes);
  return m_impl->hdc_copy(true, bytes);
}

HdcResult Simulator::copy_device_to_host(void* dst, uint64_t dev_addr, uint64_t bytes) {
  if (!m_impl->gm.in_bounds(dev_addr, bytes))
    throw Error(fmt::format("copy_device_to_host: device range [{:#x}, {:#x}) is outside device "
                            "memory of {} bytes", dev_addr, dev_addr + bytes,
                            m_impl->gm.capacity()));
  HdcResult r = m_impl->hdc_copy(false, bytes);
  if (bytes) m_impl->gm.read(dev_addr, dst, bytes);
  return r;
}

nlohmann::json Simulator::counters() const { return m_impl->counters.dump(); }
void Simulator::reset_counters() { m_impl->counters.reset(); }

nlohmann::json Simulator::trace() const {
  if (m_impl->trace) return m_impl->trace->to_json();
  return {{"traceEvents", nlohmann::json::array()}, {"displayTimeUnit", "ns"}};
}

uint64_t Simulator::now_cycles() const { return time_ps(sc_time_stamp()) / kPsPerCycle; }

void Simulator::add_observer(ChipObserver* observer) { m_impl->chip->add_observer(observer); }
void Simulator::remove_observer(ChipObserver* observer) {
  m_impl->chip->remove_observer(observer);
}

}  // namespace npusim

// libsystemc.so defines main() calling sc_main(); npusim executables have their own main() and
// drive SystemC through Simulator, so sc_main is only here to satisfy the library's reference.
extern "C" int sc_main(int, char*[]) {
  std::fprintf(stderr, "npusim: sc_main is not used; construct an npusim::Simulator instead\n");
  return 1;
}
