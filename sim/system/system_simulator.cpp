#include "sim/system/system_simulator.h"

#include <algorithm>

#include <fmt/format.h>
#include <systemc>

#include "common/error.h"
#include "sim/chip/chip.h"
#include "sim/counters/counters.h"
#include "sim/sc_driver.h"
#include "sim/system/fabric.h"

namespace npusim {

using namespace sc_driver;
using sc_core::sc_time;
using sc_core::sc_time_stamp;

struct SystemSimulator::Impl {
  SystemConfig cfg;
  SimOptions opts;
  CounterRegistry counters;
  std::vector<std::unique_ptr<DeviceMemory>> gm;
  std::vector<std::unique_ptr<Chip>> chips;
  std::unique_ptr<Fabric> fabric;

  Chip& chip(int i) {
    if (i < 0 || i >= cfg.chips())
      throw Error(fmt::format("chip {} does not exist: system '{}' has {} chips (0 to {})", i,
                              cfg.name, cfg.chips(), cfg.chips() - 1));
    return *chips[static_cast<size_t>(i)];
  }
  double cycles_us(uint64_t ps) const {
    return cfg.chip.cycles_to_us(static_cast<double>(ps) / kPsPerCycle);
  }
  HdcResult hdc_copy(int c, bool host_to_device, uint64_t bytes) {
    HdcLink::Copy copy;
    copy.host_to_device = host_to_device;
    copy.bytes = bytes;
    if (launches_running) throw Error("a host-link copy while kernels run alongside");
    start_on_clock_edge();
    chip(c).hdc().submit(&copy);
    run_to_quiescence();
    if (!copy.done) throw Error("HDC copy did not complete");
    return HdcResult{copy.start_ps / kPsPerCycle, ceil_cycles(copy.end_ps - copy.start_ps),
                     cycles_us(copy.end_ps - copy.start_ps)};
  }
  // Launches begun by run_alongside are running: transfers then run only until they are done.
  bool launches_running = false;
  // Checks the launches (distinct chips, a program each), starts them now on one clock edge and
  // returns that time.
  sc_time begin_launches(const std::vector<ChipLaunch>& launches);
  // Runs the simulation until `done` holds: to quiescence when no launch runs alongside, else
  // event by event (the running kernels' events too) until then.
  void run_until(const std::function<bool()>& done, const char* what);
  // Ends the launches begun at `start` after the simulation stopped; fills their results.
  void finish_launches(const std::vector<ChipLaunch>& launches, const sc_time& start,
                       std::vector<KernelResult>& results);
};

SystemSimulator::SystemSimulator(const SystemConfig& cfg, const SimOptions& opts) {
  begin_elaboration();
  m_impl = std::make_unique<Impl>();
  Impl& I = *m_impl;
  I.cfg = cfg;
  I.opts = opts;
  try {
    for (int c = 0; c < cfg.chips(); ++c) {
      I.gm.push_back(std::make_unique<DeviceMemory>(I.cfg.chip.hbm_bytes));
      const std::string name = fmt::format("chip{}", c);
      I.chips.push_back(std::make_unique<Chip>(name.c_str(), I.cfg.chip, *I.gm.back(), I.counters,
                                               std::vector<ChipObserver*>{}));
    }
    I.fabric = std::make_unique<Fabric>("fabric", I.cfg, I.counters);
    sc_core::sc_start(sc_core::SC_ZERO_TIME);
  } catch (const sc_core::sc_report& e) {
    throw Error(std::string("SystemC elaboration failed: ") + e.what());
  }
}

SystemSimulator::~SystemSimulator() = default;

const SystemConfig& SystemSimulator::config() const { return m_impl->cfg; }
int SystemSimulator::chips() const { return m_impl->cfg.chips(); }
bool SystemSimulator::functional() const { return m_impl->opts.functional; }
const Fabric& SystemSimulator::fabric() const { return *m_impl->fabric; }

DeviceMemory& SystemSimulator::gm(int chip) {
  m_impl->chip(chip);  // checks the index
  return *m_impl->gm[static_cast<size_t>(chip)];
}

sc_time SystemSimulator::Impl::begin_launches(const std::vector<ChipLaunch>& launches) {
  if (launches_running) throw Error("run: kernels already run alongside");
  std::vector<bool> busy(static_cast<size_t>(cfg.chips()));
  for (const ChipLaunch& l : launches) {
    if (!l.launch.program)
      throw Error(fmt::format("run: the launch on chip {} has no program", l.chip));
    chip(l.chip);
    if (busy[static_cast<size_t>(l.chip)])
      throw Error(fmt::format("run: two launches on chip {} at once", l.chip));
    busy[static_cast<size_t>(l.chip)] = true;
  }
  start_on_clock_edge();
  const sc_time start = sc_time_stamp();
  for (const ChipLaunch& l : launches)
    chip(l.chip).begin_launch(*l.launch.program, l.launch.args, l.launch.block_dim, opts.functional,
                              watchdog_budget(opts, *l.launch.program, l.launch.args), false,
                              UINT64_MAX, l.launch.gm_blocks);
  return start;
}

void SystemSimulator::Impl::run_until(const std::function<bool()>& done, const char* what) {
  if (!launches_running) {
    run_to_quiescence();
  } else {
    while (!done()) {
      if (!sc_core::sc_pending_activity()) break;
      run_for(sc_core::sc_time_to_pending_activity());
    }
  }
  if (!done()) throw Error(fmt::format("{} did not complete", what));
}

std::vector<KernelResult> SystemSimulator::run(const std::vector<ChipLaunch>& launches) {
  Impl& I = *m_impl;
  const sc_time start = I.begin_launches(launches);
  std::vector<KernelResult> results(launches.size());
  I.finish_launches(launches, start, results);
  return results;
}

std::vector<KernelResult> SystemSimulator::run_alongside(const std::vector<ChipLaunch>& launches,
                                                         const std::function<void()>& alongside) {
  Impl& I = *m_impl;
  const sc_time start = I.begin_launches(launches);
  I.launches_running = true;
  try {
    alongside();
  } catch (...) {
    I.launches_running = false;
    std::vector<KernelResult> ignored(launches.size());
    I.finish_launches(launches, start, ignored);  // the kernels end before the error goes on
    throw;
  }
  I.launches_running = false;
  std::vector<KernelResult> results(launches.size());
  I.finish_launches(launches, start, results);
  return results;
}

void SystemSimulator::Impl::finish_launches(const std::vector<ChipLaunch>& launches,
                                            const sc_time& start,
                                            std::vector<KernelResult>& results) {
  // (Launches that ran alongside may have ended already: then nothing is left to run.)
  if (sc_core::sc_pending_activity() && !run_to_quiescence_or_limit()) {
    for (const ChipLaunch& l : launches)  // still running at the limit: a fault
      if (chip(l.chip).outcome() == Chip::Outcome::Deadlock) chip(l.chip).stop_at_time_limit();
    run_to_quiescence();  // unwinds every process
  }
  bool aborted = false;
  for (size_t i = 0; i < launches.size(); ++i) {
    Chip& c = chip(launches[i].chip);
    KernelResult& r = results[i];
    switch (c.outcome()) {
      case Chip::Outcome::Done: r.ok = true; break;
      case Chip::Outcome::Fault: r.error = c.fault_message(); break;
      case Chip::Outcome::Deadlock:
        r.error = c.deadlock_report();
        c.abort();
        aborted = true;
        break;
    }
  }
  if (aborted) run_to_quiescence();  // unwinds every blocked process
  for (size_t i = 0; i < launches.size(); ++i) {
    Chip& c = chip(launches[i].chip);
    KernelResult& r = results[i];
    const uint64_t duration_ps = time_ps(c.end_time() - start);
    c.end_launch(r.ok);
    r.start_cycle = time_ps(start) / kPsPerCycle;
    r.cycles = ceil_cycles(duration_ps);
    r.time_us = cycles_us(duration_ps);
  }
}

DeviceMemory& SystemSimulator::gm_range(int chip, uint64_t addr, uint64_t bytes,
                                        const std::string& what) {
  DeviceMemory& g = gm(chip);
  if (!g.in_bounds(addr, bytes))
    throw Error(
        fmt::format("{}: chip {}: range [{:#x}, {:#x}) is outside its device memory of {} "
                    "bytes",
                    what, chip, addr, addr + bytes, g.capacity()));
  return g;
}

HdcResult SystemSimulator::copy_host_to_device(int chip, uint64_t dev_addr, const void* src,
                                               uint64_t bytes) {
  DeviceMemory& g = gm_range(chip, dev_addr, bytes, "copy_host_to_device");
  if (bytes) g.write(dev_addr, src, bytes);
  // As Simulator::copy_host_to_device: a kept L2 drops the lines the host overwrote.
  if (m_impl->cfg.chip.l2_keep_across_launches)
    m_impl->chip(chip).memory().l2().invalidate_range(dev_addr, bytes);
  return m_impl->hdc_copy(chip, true, bytes);
}

HdcResult SystemSimulator::copy_device_to_host(int chip, void* dst, uint64_t dev_addr,
                                               uint64_t bytes) {
  DeviceMemory& g = gm_range(chip, dev_addr, bytes, "copy_device_to_host");
  HdcResult r = m_impl->hdc_copy(chip, false, bytes);
  if (bytes) g.read(dev_addr, dst, bytes);
  return r;
}

PeerCopyResult SystemSimulator::copy_peer(const std::vector<PeerCopy>& copies) {
  std::vector<std::vector<uint8_t>> data(copies.size());
  std::vector<LinkTransfer> transfers;
  for (size_t i = 0; i < copies.size(); ++i) {
    const PeerCopy& c = copies[i];
    const std::string what = fmt::format("peer copy {} -> {}", c.src_chip, c.dst_chip);
    gm_range(c.src_chip, c.src_addr, c.bytes, what);
    gm_range(c.dst_chip, c.dst_addr, c.bytes, what);
    if (functional()) {
      data[i].resize(c.bytes);
      gm(c.src_chip).read(c.src_addr, data[i].data(), c.bytes);
    }
    transfers.push_back({c.src_chip, c.dst_chip, c.bytes});
  }
  PeerCopyResult r = transfer(transfers);
  if (functional())
    for (size_t i = 0; i < copies.size(); ++i)
      gm(copies[i].dst_chip).write(copies[i].dst_addr, data[i].data(), data[i].size());
  return r;
}

PeerCopyResult SystemSimulator::transfer(const std::vector<LinkTransfer>& list) {
  Impl& I = *m_impl;
  for (const LinkTransfer& t : list) I.fabric->route(t.src, t.dst);  // throws before any starts
  start_on_clock_edge();
  const uint64_t start = time_ps(sc_time_stamp());
  std::vector<Fabric::Transfer> transfers(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    transfers[i].src = list[i].src;
    transfers[i].dst = list[i].dst;
    transfers[i].bytes = list[i].bytes;
    I.fabric->submit(&transfers[i]);
  }
  I.run_until(
      [&] {
        return std::all_of(transfers.begin(), transfers.end(),
                           [](const Fabric::Transfer& t) { return t.done; });
      },
      "link transfer");
  PeerCopyResult r;
  r.start_cycle = start / kPsPerCycle;
  uint64_t end = start;
  for (const Fabric::Transfer& t : transfers) {
    end = std::max(end, t.end_ps);
    r.copy_cycles.push_back(ceil_cycles(t.end_ps - start));
  }
  r.cycles = ceil_cycles(end - start);
  r.time_us = I.cycles_us(end - start);
  return r;
}

void SystemSimulator::advance(uint64_t cycles) {
  if (cycles) run_for(sc_time::from_value(cycles * kPsPerCycle));
}

uint64_t SystemSimulator::now_cycles() const { return time_ps(sc_time_stamp()) / kPsPerCycle; }

nlohmann::json SystemSimulator::counters() const { return m_impl->counters.dump(); }

}  // namespace npusim
