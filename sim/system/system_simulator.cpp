#include "sim/system/system_simulator.h"

#include <algorithm>

#include <fmt/format.h>
#include <systemc>

#include "common/error.h"
#include "sim/chip/chip.h"
#include "sim/counters/counters.h"
#include "sim/counters/observer.h"
#include "sim/counters/trace.h"
#include "sim/replay/chip_launcher.h"
#include "sim/sc_driver.h"
#include "sim/system/fabric.h"

namespace npusim {

using namespace sc_driver;
using sc_core::sc_time;
using sc_core::sc_time_stamp;

namespace {
constexpr const char* kChipCounterRoot = "chip";  // every chip's counters, as a single chip's
}  // namespace

// One chip of the system: its memory, counters (under "chip", as a single chip's), module,
// launcher (replays shared with the other chips through the system's ReplayStore) and trace.
struct SystemChip {
  std::unique_ptr<DeviceMemory> gm;
  std::unique_ptr<CounterRegistry> counters;
  std::unique_ptr<TraceRecorder> trace;  // SimOptions::trace
  std::unique_ptr<Chip> chip;
  std::unique_ptr<ChipLauncher> launcher;
};

struct SystemSimulator::Impl {
  SystemConfig cfg;
  SimOptions opts;
  std::unique_ptr<ReplayStore> store;
  std::vector<SystemChip> chips;
  CounterRegistry fabric_counters;  // the links' ("fabric")
  std::unique_ptr<Fabric> fabric;

  SystemChip& at(int i) {
    if (i < 0 || i >= cfg.chips())
      throw Error(fmt::format("chip {} does not exist: system '{}' has {} chips (0 to {})", i,
                              cfg.name, cfg.chips(), cfg.chips() - 1));
    return chips[static_cast<size_t>(i)];
  }
  Chip& chip(int i) { return *at(i).chip; }
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
  // Launches begun by begin_launches: when they began, which of them run on their chip (the
  // others were replayed: their results are final) and how long the replayed ones keep their
  // chips busy.
  struct Begun {
    sc_time start;
    std::vector<bool> running;
    uint64_t busy_until_ps = 0;
  };
  // Checks the launches (distinct chips, a program each), starts them now on one clock edge
  // (each chip's launcher replays it or begins it on the chip) and fills the replayed ones'
  // results. alone: nothing runs alongside.
  Begun begin_launches(const std::vector<ChipLaunch>& launches, bool alone,
                       std::vector<KernelResult>& results);
  // Runs the simulation until `done` holds: to quiescence when no launch runs alongside, else
  // event by event (the running kernels' events too) until then.
  void run_until(const std::function<bool()>& done, const char* what);
  // Ends the launches begun after the simulation stopped; fills the results of those that ran
  // on their chips and lets the replayed ones' time pass.
  void finish_launches(const std::vector<ChipLaunch>& launches, const Begun& begun,
                       std::vector<KernelResult>& results);
};

SystemSimulator::SystemSimulator(const SystemConfig& cfg, const SimOptions& opts) {
  begin_elaboration();
  m_impl = std::make_unique<Impl>();
  Impl& I = *m_impl;
  I.cfg = cfg;
  I.opts = with_environment(opts);
  I.store = std::make_unique<ReplayStore>(I.opts);
  I.chips.resize(static_cast<size_t>(cfg.chips()));
  try {
    for (int c = 0; c < cfg.chips(); ++c) {
      SystemChip& sc = I.chips[static_cast<size_t>(c)];
      sc.gm = std::make_unique<DeviceMemory>(I.cfg.chip.hbm_bytes);
      sc.counters = std::make_unique<CounterRegistry>();
      std::vector<ChipObserver*> observers;
      if (I.opts.trace) {
        sc.trace = std::make_unique<TraceRecorder>(I.cfg.chip.clock_mhz, I.opts.trace_max_events);
        observers.push_back(sc.trace.get());
      }
      const std::string name = fmt::format("chip{}", c);
      sc.chip = std::make_unique<Chip>(name.c_str(), I.cfg.chip, *sc.gm, *sc.counters, observers,
                                       kChipCounterRoot);
      sc.launcher = std::make_unique<ChipLauncher>(*sc.chip, *sc.gm, *sc.counters, I.cfg.chip,
                                                   *I.store, kChipCounterRoot);
    }
    I.fabric = std::make_unique<Fabric>("fabric", I.cfg, I.fabric_counters);
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
  return *m_impl->at(chip).gm;  // checks the index
}

SystemSimulator::Impl::Begun SystemSimulator::Impl::begin_launches(
    const std::vector<ChipLaunch>& launches, bool alone, std::vector<KernelResult>& results) {
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
  Begun b;
  b.start = sc_time_stamp();
  b.busy_until_ps = time_ps(b.start);
  b.running.resize(launches.size());
  results.resize(launches.size());
  // A launch's time to quiescence is its own only if it runs alone in the simulation.
  const bool one = alone && launches.size() == 1;
  for (size_t i = 0; i < launches.size(); ++i) {
    ChipLauncher::Begun r = at(launches[i].chip).launcher->begin(launches[i].launch, b.start, one);
    b.running[i] = !r.done;
    if (r.done) {
      results[i] = std::move(r.result);
      b.busy_until_ps = std::max(b.busy_until_ps, time_ps(b.start) + r.busy_ps);
    }
  }
  return b;
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
  std::vector<KernelResult> results;
  const Impl::Begun begun = I.begin_launches(launches, /*alone=*/true, results);
  I.finish_launches(launches, begun, results);
  return results;
}

std::vector<KernelResult> SystemSimulator::run_alongside(const std::vector<ChipLaunch>& launches,
                                                         const std::function<void()>& alongside) {
  Impl& I = *m_impl;
  std::vector<KernelResult> results;
  const Impl::Begun begun = I.begin_launches(launches, /*alone=*/false, results);
  I.launches_running = true;
  try {
    alongside();
  } catch (...) {
    I.launches_running = false;
    I.finish_launches(launches, begun, results);  // the kernels end before the error goes on
    throw;
  }
  I.launches_running = false;
  I.finish_launches(launches, begun, results);
  return results;
}

void SystemSimulator::Impl::finish_launches(const std::vector<ChipLaunch>& launches,
                                            const Begun& begun,
                                            std::vector<KernelResult>& results) {
  // (Launches that ran alongside may have ended already: then nothing is left to run.)
  if (sc_core::sc_pending_activity() && !run_to_quiescence_or_limit()) {
    for (size_t i = 0; i < launches.size(); ++i)  // still running at the limit: a fault
      if (begun.running[i] && chip(launches[i].chip).outcome() == Chip::Outcome::Deadlock)
        chip(launches[i].chip).stop_at_time_limit();
    run_to_quiescence();  // unwinds every process
  }
  bool aborted = false;
  for (size_t i = 0; i < launches.size(); ++i)
    if (begun.running[i] && at(launches[i].chip).launcher->settle()) aborted = true;
  if (aborted) run_to_quiescence();  // unwinds every blocked process
  for (size_t i = 0; i < launches.size(); ++i)
    if (begun.running[i]) results[i] = at(launches[i].chip).launcher->finish();
  // The replayed launches keep their chips busy as long as their simulated runs did.
  const uint64_t now = time_ps(sc_time_stamp());
  if (begun.busy_until_ps > now)
    run_for(sc_time(static_cast<double>(begun.busy_until_ps - now), sc_core::SC_PS));
  for (size_t i = 0; i < launches.size(); ++i)
    at(launches[i].chip).launcher->log(launches[i].launch, results[i]);
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
  m_impl->chip(chip).memory().drop_host_write(dev_addr, bytes);
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

nlohmann::json SystemSimulator::counters() const {
  nlohmann::json all = m_impl->fabric_counters.dump();
  for (int c = 0; c < chips(); ++c)
    all[fmt::format("chip{}", c)] = chip_counters(c)[kChipCounterRoot];
  return all;
}

nlohmann::json SystemSimulator::chip_counters(int chip) const {
  return m_impl->at(chip).counters->dump();
}

nlohmann::json SystemSimulator::trace(int chip) const {
  if (const TraceRecorder* t = m_impl->at(chip).trace.get()) return t->to_json();
  return {{"traceEvents", nlohmann::json::array()}, {"displayTimeUnit", "ns"}};
}

void SystemSimulator::add_observer(int chip, ChipObserver* observer) {
  m_impl->chip(chip).add_observer(observer);
}

void SystemSimulator::remove_observer(int chip, ChipObserver* observer) {
  m_impl->chip(chip).remove_observer(observer);
}

}  // namespace npusim
