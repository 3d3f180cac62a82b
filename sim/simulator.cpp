// The Simulator: owns the elaborated chip and drives SystemC. Each kernel launch or HDC copy
// is one or more sc_start() runs to quiescence; simulated time only moves forward.
#include "sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>
#include <systemc>

#include "common/error.h"
#include "sim/chip/chip.h"
#include "sim/chip/l2_tags.h"
#include "sim/config/core_taker.h"
#include "sim/counters/counters.h"
#include "sim/counters/observer.h"
#include "sim/counters/trace.h"
#include "sim/replay/chip_launcher.h"
#include "sim/replay/group_replay.h"
#include "sim/sc_driver.h"

namespace npusim {

using sc_core::sc_time;
using sc_core::sc_time_stamp;
using namespace sc_driver;

namespace {

constexpr const char* kChipName = "chip";  // the chip module: root of the counter tree

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

}  // namespace

// Recorded launch groups kept for replay (sim/replay/group_replay.h): at most this many, in at
// most this share of SimOptions::replay_memo_bytes (a quarter: a group's record is mostly its
// written ranges, at most a range per page written plus the pieces around them). # estimate:
// host memory bounds only; a TF graph issues one group per step (or a few, split where a step
// is queued alone).
constexpr size_t kGroupMemoGroups = 256;
constexpr uint64_t kGroupMemoShare = 4;

struct Simulator::Impl {
  Impl(const ChipConfig& c, const SimOptions& o)
      : cfg(c),
        opts(o),
        gm(c.hbm_bytes),
        store(o),
        groups(kGroupMemoGroups, o.replay_memo_bytes / kGroupMemoShare) {}
  ChipConfig cfg;
  SimOptions opts;
  DeviceMemory gm;
  ReplayStore store;
  GroupMemo groups;  // launch groups recorded for replay (run_concurrent)
  // The layout of the last translatable recording of each group of launches
  // (GroupLayout::launches_hash), for the replay log: what differs where a lookup misses.
  std::unordered_map<uint64_t, GroupLayoutSketch> group_layouts;
  CounterRegistry counters;
  std::unique_ptr<TraceRecorder> trace;
  std::unique_ptr<Chip> chip;
  std::unique_ptr<ChipLauncher> launcher;  // after chip

  // Why a group run_concurrent was given (its lines filed by `blocks`) may not be replayed or
  // recorded, or "" with its keys and layout (group_key, sim/replay/group_replay.h).
  std::string group_unkeyed(const std::vector<ConcurrentLaunch>& launches,
                            const GmBlockLookup& blocks, GroupKey* exact, GroupKey* translated,
                            GroupLayout* layout) {
    if (opts.functional) return "a functional simulator (groups replay in timing-only ones)";
    // A key lookup without a walk: on where the translated replay is (a timing-only TF run
    // turns the walking replay off and keeps replay_translated; NPUSIM_REPLAY=off turns both).
    if (opts.replay == SimOptions::Replay::off && !opts.replay_translated)
      return "replay off (and the translated replay)";
    if (chip->memory().l2_carried())
      return "its L2 is kept (across launches, or a graph run's): not keyed";
    if (!chip->observers().empty()) return "an observer is attached";
    return group_key(launches, blocks, store, exact, translated, layout);
  }

  // Replay check of a group (SimOptions::Replay::check): `simulated` is the group's run from the
  // state `recorded` was replayed from, `out` its results, `replayed_writes` the ranges the
  // replay wrote, `replayed` device memory as the replay left it. Throws npusim::Error naming
  // the first difference.
  void check_group(const RecordedGroup& recorded, const RecordedGroup& simulated,
                   const ConcurrentResult& out, const std::vector<GmAccess>& replayed_writes,
                   const DeviceMemory::Snapshot& replayed) {
    const std::string what =
        fmt::format("replay check of a group of {} launches", recorded.members.size());
    const auto pairs = [](const CounterDelta& d) {
      std::vector<std::pair<std::string, uint64_t>> v;
      d.for_each([&](const CounterInfo& info, uint64_t value) { v.emplace_back(info.name, value); });
      return v;
    };
    for (size_t i = 0; i < out.launches.size(); ++i) {
      const KernelResult& r = out.launches[i];
      const RecordedGroup::Member &a = recorded.members[i], &b = simulated.members[i];
      const std::string who = fmt::format("{}: launch {}", what, i);
      if (!r.ok) throw Error(fmt::format("{}: simulated: {}; replayed: ok", who, r.error));
      if (a.start_offset_ps != b.start_offset_ps || a.duration_ps != b.duration_ps)
        throw Error(fmt::format("{}: simulated start +{} ps for {} ps, recorded +{} ps for {} ps",
                                who, b.start_offset_ps, b.duration_ps, a.start_offset_ps,
                                a.duration_ps));
      if (const auto pa = pairs(a.counters), pb = pairs(b.counters); pa != pb) {
        // Name the first counter that differs (a missing one counts 0).
        std::map<std::string, std::pair<uint64_t, uint64_t>> both;
        for (const auto& [name, v] : pa) both[name].first = v;
        for (const auto& [name, v] : pb) both[name].second = v;
        std::string first;
        for (const auto& [name, v] : both)
          if (v.first != v.second && first.empty())
            first = fmt::format("{}: simulated {}, recorded {}", name, v.second, v.first);
        throw Error(fmt::format("{}: its counters differ from the recorded run's ({})", who, first));
      }
    }
    if (recorded.makespan_ps != simulated.makespan_ps ||
        recorded.quiescent_ps != simulated.quiescent_ps)
      throw Error(fmt::format("{}: simulated {} ps (idle after {} ps), recorded {} ps ({} ps)",
                              what, simulated.makespan_ps, simulated.quiescent_ps,
                              recorded.makespan_ps, recorded.quiescent_ps));
    if (recorded.counters != simulated.counters)
      throw Error(fmt::format("{}: the chip's counters differ from the recorded run ({} vs {} "
                              "moved)", what, simulated.counters.size(),
                              recorded.counters.size()));
    if (replayed_writes.size() != simulated.writes.size() ||
        !std::equal(replayed_writes.begin(), replayed_writes.end(), simulated.writes.begin(),
                    [](const GmAccess& x, const GmAccess& y) {
                      return x.addr == y.addr && x.bytes == y.bytes;
                    }))
      throw Error(fmt::format("{}: the GM ranges written differ from the recorded run's ({} vs {} "
                              "ranges)", what, simulated.writes.size(), replayed_writes.size()));
    if (auto addr = gm.first_difference(replayed))
      throw Error(fmt::format("{}: device memory differs at {:#x} between the simulated and the "
                              "replayed group", what, *addr));
  }

  HdcResult hdc_copy(bool host_to_device, uint64_t bytes) {
    if (time_ps(sc_time_stamp()) >= kSimTimeLimitPs)
      throw Error(fmt::format("host-device copy: simulated time has reached {} ps, half of "
                              "SystemC's range; this simulator can run nothing more",
                              kSimTimeLimitPs));
    HdcLink::Copy copy;
    copy.host_to_device = host_to_device;
    copy.bytes = bytes;
    start_on_clock_edge();
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

SimOptions with_environment(SimOptions o) {
  if (const char* v = std::getenv("NPUSIM_REPLAY"); v && *v) {
    if (!std::strcmp(v, "on") || !std::strcmp(v, "1")) o.replay = SimOptions::Replay::on;
    else if (!std::strcmp(v, "off") || !std::strcmp(v, "0")) {
      o.replay = SimOptions::Replay::off;
      o.replay_translated = false;
    }
    else if (!std::strcmp(v, "check")) o.replay = SimOptions::Replay::check;
    else
      throw ConfigError(fmt::format("NPUSIM_REPLAY='{}': expected on, off or check", v));
  }
  if (const char* v = std::getenv("NPUSIM_REPLAY_TRANSLATED"); v && *v) {
    if (!std::strcmp(v, "on") || !std::strcmp(v, "1")) o.replay_translated = true;
    else if (!std::strcmp(v, "off") || !std::strcmp(v, "0")) o.replay_translated = false;
    else
      throw ConfigError(fmt::format("NPUSIM_REPLAY_TRANSLATED='{}': expected on or off", v));
  }
  if (const char* v = std::getenv("NPUSIM_REPLAY_RELOCATE"); v && *v) {
    if (!std::strcmp(v, "on") || !std::strcmp(v, "1")) o.replay_relocate = true;
    else if (!std::strcmp(v, "off") || !std::strcmp(v, "0")) o.replay_relocate = false;
    else
      throw ConfigError(fmt::format("NPUSIM_REPLAY_RELOCATE='{}': expected on or off", v));
  }
  if (const char* v = std::getenv("NPUSIM_REPLAY_THREADS"); v && *v) {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (!end || *end || n < 0 || n > 256)
      throw ConfigError(fmt::format("NPUSIM_REPLAY_THREADS='{}': expected a number of threads "
                                    "from 0 (all the host has) to 256", v));
    o.replay_threads = static_cast<int>(n);
  }
  if (const char* v = std::getenv("NPUSIM_LAUNCH_LOG"); v && *v) o.launch_log = v;
  if (const char* v = std::getenv("NPUSIM_REPLAY_LOG"); v && *v) o.replay_log = v;
  return o;
}

Simulator::Simulator(const ChipConfig& cfg, const SimOptions& opts) {
  check_config(cfg);
  begin_elaboration();
  m_impl = std::make_unique<Impl>(cfg, with_environment(opts));
  std::vector<ChipObserver*> observers;
  if (m_impl->opts.trace) {
    m_impl->trace = std::make_unique<TraceRecorder>(cfg.clock_mhz, m_impl->opts.trace_max_events);
    observers.push_back(m_impl->trace.get());
  }
  try {
    m_impl->chip = std::make_unique<Chip>(kChipName, m_impl->cfg, m_impl->gm, m_impl->counters,
                                          observers);
    m_impl->launcher = std::make_unique<ChipLauncher>(*m_impl->chip, m_impl->gm, m_impl->counters,
                                                      m_impl->cfg, m_impl->store, kChipName);
    // End elaboration now so that elaboration errors surface here, not in the first run.
    sc_core::sc_start(sc_core::SC_ZERO_TIME);
  } catch (const sc_core::sc_report& e) {
    throw Error(std::string("SystemC elaboration failed: ") + e.what());
  }
}

Simulator::~Simulator() = default;

const ChipConfig& Simulator::config() const { return m_impl->cfg; }
DeviceMemory& Simulator::gm() { return m_impl->gm; }

uint64_t launch_data_bytes(const isa::Program& program, const std::vector<uint64_t>& args) {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  auto mul = [](uint64_t a, uint64_t b) { return b != 0 && a > kMax / b ? kMax : a * b; };
  uint64_t total = 0;
  for (size_t i = 0; i < program.arg_names.size(); ++i) {
    const isa::ArgInfo a = program.arg(i);
    if (!a.typed()) continue;
    uint64_t bytes = static_cast<uint64_t>(isa::dtype_size(a.dtype));
    for (const std::string& dim : a.dims) {
      uint64_t n = 0;
      if (auto lit = isa::dim_literal(dim)) {
        n = static_cast<uint64_t>(*lit);
      } else {
        auto it = std::find(program.arg_names.begin(), program.arg_names.end(), dim);
        const size_t j = static_cast<size_t>(it - program.arg_names.begin());
        n = j < args.size() ? args[j] : 0;
      }
      bytes = mul(bytes, n);
    }
    total = bytes > kMax - total ? kMax : total + bytes;
  }
  return total;
}

uint64_t watchdog_budget(const SimOptions& opts, const isa::Program& program,
                         const std::vector<uint64_t>& args) {
  const uint64_t data = launch_data_bytes(program, args);
  const uint64_t units = std::max<uint64_t>(
      1, data / SimOptions::kWatchdogDataBytes + (data % SimOptions::kWatchdogDataBytes != 0));
  const uint64_t per = opts.max_insns_per_block;
  return units > std::numeric_limits<uint64_t>::max() / std::max<uint64_t>(per, 1)
             ? std::numeric_limits<uint64_t>::max()
             : per * units;
}

uint64_t counter_digest(const CounterDelta& delta) {
  // FNV-1a of each pair, mixed (splitmix64's finaliser) and summed: a sum does not depend on
  // the order of the pairs.
  uint64_t sum = 0;
  delta.for_each([&](const CounterInfo& info, uint64_t value) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : info.name) h = (h ^ c) * 1099511628211ull;
    h ^= value + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    sum += h ^ (h >> 31);
  });
  return sum;
}

KernelResult Simulator::run(const KernelLaunch& launch) {
  if (!launch.program) throw Error("run: the launch has no program");
  KernelResult r = run_launch(launch);
  m_impl->launcher->log(launch, r);
  return r;
}

KernelResult Simulator::run_launch(const KernelLaunch& launch) {
  Impl& I = *m_impl;
  start_on_clock_edge();
  const sc_time start = sc_time_stamp();
  if (time_ps(start) >= kSimTimeLimitPs) {
    KernelResult r;
    r.error = fmt::format("simulated time has reached {} ps, half of SystemC's range of 2^64 ps: "
                          "this simulator can run no more launches", kSimTimeLimitPs);
    r.start_cycle = time_ps(start) / kPsPerCycle;
    return r;
  }
  ChipLauncher::Begun b = I.launcher->begin(launch, start, /*alone=*/true);
  if (b.done) {
    // A replay: the chip is busy as long as the simulated run was.
    if (b.result.ok) run_for(sc_time(static_cast<double>(b.busy_ps), sc_core::SC_PS));
    return std::move(b.result);
  }
  if (!run_to_quiescence_or_limit() && I.chip->outcome() == Chip::Outcome::Deadlock) {
    I.chip->stop_at_time_limit();  // still running at the limit: a fault
    run_to_quiescence();  // unwinds every process
  }
  if (I.launcher->settle()) run_to_quiescence();  // a deadlock: unwinds every blocked process
  return I.launcher->finish();
}

namespace {

// The chip indices of the cores a concurrent launch names (ConcurrentLaunch::cores); throws
// Error naming the launch for an unknown name or more names than the chip has cores.
std::vector<int> named_cores(const Chip& chip, const ChipConfig& cfg, size_t i,
                             const ConcurrentLaunch& c) {
  const auto& cores = chip.cores();
  if (c.cores.size() > cores.size())
    throw Error(fmt::format("run_concurrent: launch {} ('{}') names {} cores; chip '{}' has {}", i,
                            c.launch.program->name, c.cores.size(), cfg.name, cores.size()));
  std::vector<int> out;
  for (const std::string& name : c.cores) {
    auto it = std::find_if(cores.begin(), cores.end(),
                           [&](const auto& core) { return core->core_name() == name; });
    if (it == cores.end()) {
      std::string have;
      for (const CoreKindConfig& k : cfg.core_kinds)
        have += fmt::format("{}{}0..{}{}", have.empty() ? "" : ", ",
                            isa::core_kind_name(k.kind), isa::core_kind_name(k.kind), k.count - 1);
      throw Error(fmt::format("run_concurrent: launch {} ('{}'): chip '{}' has no core '{}' (its "
                              "cores: {})", i, c.launch.program->name, cfg.name, name, have));
    }
    out.push_back((*it)->chip_index());
  }
  return out;
}

// The cores a launch with no names gets (ConcurrentLaunch::cores): free ones of the kinds its
// program runs on, marking them taken.
std::vector<int> free_cores(const Chip& chip, const ChipConfig& cfg, size_t i,
                            const ConcurrentLaunch& c, std::vector<bool>& taken) {
  const isa::Program& p = *c.launch.program;
  const auto& cores = chip.cores();
  const size_t want = static_cast<size_t>(std::max(1, c.launch.block_dim));
  std::vector<int> out;
  auto take = [&](isa::CoreKind kind) {
    size_t n = 0;
    for (const auto& core : cores) {
      if (n == want) break;
      const size_t ci = static_cast<size_t>(core->chip_index());
      if (core->core_kind() != kind || taken[ci]) continue;
      taken[ci] = true;
      out.push_back(core->chip_index());
      ++n;
    }
  };
  const bool aic = p.find(isa::CoreKind::AIC) != nullptr;
  const bool aiv = p.find(isa::CoreKind::AIV) != nullptr;
  if (!cfg.split) {
    take(isa::CoreKind::AICORE);
  } else if (aic && aiv) {
    // mix: cube core g with the first `per` of vector cores g * chip_per ... (Chip::worker_cores)
    std::vector<const AiCore*> vecs;
    for (const auto& core : cores)
      if (core->core_kind() == isa::CoreKind::AIV) vecs.push_back(core.get());
    const size_t chip_per = static_cast<size_t>(std::max(1, cfg.aiv_per_aic));
    const size_t per = static_cast<size_t>(mix_aiv_per_block(cfg, p));
    size_t n = 0;
    for (const auto& core : cores) {
      if (n == want || core->core_kind() != isa::CoreKind::AIC) continue;
      const size_t first = static_cast<size_t>(core->kind_index()) * chip_per;
      if (taken[static_cast<size_t>(core->chip_index())] || first + chip_per > vecs.size())
        continue;
      bool free = true;
      for (size_t k = 0; k < per; ++k)
        free = free && !taken[static_cast<size_t>(vecs[first + k]->chip_index())];
      if (!free) continue;
      out.push_back(core->chip_index());
      for (size_t k = 0; k < per; ++k) out.push_back(vecs[first + k]->chip_index());
      for (size_t k = out.size() - per - 1; k < out.size(); ++k)
        taken[static_cast<size_t>(out[k])] = true;
      ++n;
    }
  } else if (aic || aiv) {
    take(aic ? isa::CoreKind::AIC : isa::CoreKind::AIV);
  }
  if (out.empty())
    throw Error(fmt::format("run_concurrent: launch {} ('{}'): no free core of the kind{} its "
                            "program runs on is left",
                            i, p.name, cfg.split && aic && aiv ? "s" : ""));
  return out;
}

}  // namespace

ConcurrentResult Simulator::run_concurrent(const std::vector<ConcurrentLaunch>& launches) {
  Impl& I = *m_impl;
  if (launches.empty()) throw Error("run_concurrent: no launches");
  for (size_t i = 0; i < launches.size(); ++i) {
    if (!launches[i].launch.program)
      throw Error(fmt::format("run_concurrent: launch {} has no program", i));
    if (launches[i].launch.l2_run != launches.front().launch.l2_run)
      throw Error(fmt::format("run_concurrent: launch {} ('{}') belongs to graph run {}, launch 0 "
                              "to {}: the group shares one L2", i,
                              launches[i].launch.program->name, launches[i].launch.l2_run,
                              launches.front().launch.l2_run));
    if (launches[i].take_cores_when_ready && !launches[i].cores.empty())
      throw Error(
          fmt::format("run_concurrent: launch {} ('{}') names {} cores and takes its "
                      "cores when ready (take_cores_when_ready): it may do only one",
                      i, launches[i].launch.program->name, launches[i].cores.size()));
  }
  // The cores: named ones first, then the free ones for launches that name none (those that
  // take their cores when ready get them from the chip as they begin).
  std::vector<Chip::GroupLaunch> group(launches.size());
  for (size_t i = 0; i < launches.size(); ++i) {
    group[i].program = launches[i].launch.program;
    group[i].after = launches[i].after;
    group[i].take_cores_when_ready = launches[i].take_cores_when_ready;
  }
  const std::vector<std::vector<bool>> waits = Chip::waits_for(group);  // throws for a bad after
  std::vector<bool> named(I.chip->cores().size(), false);
  for (size_t i = 0; i < launches.size(); ++i) {
    group[i].cores = named_cores(*I.chip, I.cfg, i, launches[i]);
    for (int c : group[i].cores) named[static_cast<size_t>(c)] = true;
  }
  for (size_t i = 0; i < launches.size(); ++i) {
    const KernelLaunch& l = launches[i].launch;
    if (launches[i].cores.empty() && !launches[i].take_cores_when_ready) {
      // Taken for this launch: the named cores and those of earlier unnamed launches it may
      // overlap (it does not wait for them).
      std::vector<bool> taken = named;
      for (size_t j = 0; j < i; ++j)
        if (launches[j].cores.empty() && !launches[j].take_cores_when_ready && !waits[i][j])
          for (int c : group[j].cores) taken[static_cast<size_t>(c)] = true;
      group[i].cores = free_cores(*I.chip, I.cfg, i, launches[i], taken);
    }
    group[i].program = l.program;
    group[i].args = &l.args;
    group[i].block_dim = l.block_dim;
    group[i].max_insns_per_block = watchdog_budget(I.opts, *l.program, l.args);
  }

  ConcurrentResult out;
  out.launches.resize(launches.size());
  start_on_clock_edge();
  const sc_time start = sc_time_stamp();
  out.start_cycle = time_ps(start) / kPsPerCycle;
  if (time_ps(start) >= kSimTimeLimitPs) {
    for (KernelResult& r : out.launches) {
      r.error = fmt::format("simulated time has reached {} ps, half of SystemC's range of 2^64 "
                            "ps: this simulator can run no more launches", kSimTimeLimitPs);
      r.start_cycle = out.start_cycle;
    }
    return out;
  }
  const KernelLaunch& first = launches.front().launch;
  const GmBlockLookup blocks =
      I.chip->memory().select_l2(first.l2_run, first.gm_blocks, first.planned_blocks);
  I.launcher->begin_beside();
  // A group simulated before with the same key gives its recorded results
  // (sim/replay/group_replay.h); its first run is recorded.
  // Its translated key first (a recording there times the group at these addresses if its
  // blocks moved by the GM alignment and its steering loads read as recorded), then its exact
  // key (a recording that could not be translated).
  GroupKey exact, translated;
  GroupLayout layout;
  const std::string unkeyed = I.group_unkeyed(launches, blocks, &exact, &translated, &layout);
  const RecordedGroup* recorded = nullptr;
  // The ranges the replay writes undefined: the recording's, or its translation's moved.
  std::vector<GmAccess> moved_writes;
  const std::vector<GmAccess>* replay_writes = nullptr;
  std::string how, stale;               // replay log: how it replays, or why its recording did not
  std::string unlike;  // replay log: how it differs from the last recording of the same launches
  const auto in_time = [&](const RecordedGroup* r) {
    return r && time_ps(start) + r->quiescent_ps <= kSimTimeLimitPs;
  };
  if (unkeyed.empty() && layout.translated) {
    const RecordedGroup* r = I.groups.find(translated);
    const uint64_t granule = [&] {
      auto it = I.cfg.align_bytes.find(isa::Buf::GM);
      return it == I.cfg.align_bytes.end() || it->second == 0 ? uint64_t{1}
                                                              : uint64_t{it->second};
    }();
    if (in_time(r) && r->translation &&
        translated_group_writes(*r->translation, layout, granule, I.gm, &moved_writes, &stale)) {
      recorded = r;
      replay_writes = &moved_writes;
      how = r->translation->loads.empty()
                ? "blocks laid out alike"
                : "blocks laid out alike, its steering loads read as recorded";
    } else if (!r) {
      // No recording of this layout: where the same launches were recorded laid out otherwise,
      // the replay log says what differs.
      auto it = I.group_layouts.find(layout.launches_hash);
      if (it != I.group_layouts.end()) {
        unlike = "not laid out as the last recording of these launches: " +
                 layout_difference(it->second, layout_sketch(launches, layout, translated));
      }
    }
  }
  if (!recorded && unkeyed.empty() && !layout.any_steered) {
    const RecordedGroup* r = I.groups.find(exact);
    if (in_time(r)) {
      recorded = r;
      replay_writes = &r->writes;
      how = "its own key";
    }
  }
  const bool check = recorded && I.opts.replay == SimOptions::Replay::check;
  if (recorded && !check) {
    for (const GmAccess& w : *replay_writes) I.gm.invalidate(w.addr, w.bytes);
    I.counters.restart_windows();  // what the snapshot before a simulated group does
    I.counters.apply(recorded->counters);
    run_for(sc_time(static_cast<double>(recorded->quiescent_ps), sc_core::SC_PS));
    I.launcher->note_group(
        fmt::format("replayed\tgroup of {} launches, {}", launches.size(), how));
    for (size_t i = 0; i < launches.size(); ++i) {
      const RecordedGroup::Member& m = recorded->members[i];
      KernelResult& r = out.launches[i];
      r.ok = true;
      r.replayed = true;
      r.start_cycle = (time_ps(start) + m.start_offset_ps) / kPsPerCycle;
      r.cycles = ceil_cycles(m.duration_ps);
      r.time_us = I.cfg.cycles_to_us(static_cast<double>(m.duration_ps) / kPsPerCycle);
      r.counter_delta = m.counters;
      if (launches[i].launch.counter_tree) r.counters = r.counter_delta.tree();
      I.launcher->log(launches[i].launch, r);
    }
    out.cycles = ceil_cycles(recorded->makespan_ps);
    out.time_us = I.cfg.cycles_to_us(static_cast<double>(recorded->makespan_ps) / kPsPerCycle);
    out.counters = recorded->delta;
    return out;
  }
  // Check mode: the replay's effect on device memory, then the group simulated from the memory
  // it started with (compared below).
  DeviceMemory::Snapshot replayed;
  if (check) {
    const DeviceMemory::Snapshot before = I.gm.snapshot();
    for (const GmAccess& w : *replay_writes) I.gm.invalidate(w.addr, w.bytes);
    replayed = I.gm.snapshot();
    I.gm.restore(before);
  }
  // A group that may be replayed later is recorded on every core: the ranges it writes and
  // whether (and how) its recording translates (GroupRecorder).
  GroupRecorder recorder(launches, layout, I.gm);
  struct Collect {
    Chip& chip;
    bool on;
    Collect(Chip& c, GroupRecorder* g) : chip(c), on(g != nullptr) {
      if (on)
        for (const auto& core : chip.cores()) core->attach_recorder(g->probe(*core));
    }
    ~Collect() {
      if (on)
        for (const auto& core : chip.cores()) core->attach_recorder(nullptr);
    }
  } collect(*I.chip, unkeyed.empty() ? &recorder : nullptr);
  std::vector<uint64_t> base;
  I.counters.snapshot(base);
  I.chip->begin_concurrent(group, I.opts.functional);  // throws for a malformed group
  if (!run_to_quiescence_or_limit()) {
    I.chip->stop_group_at_time_limit();  // still running at the limit: a fault
    run_to_quiescence();                 // unwinds every process
  }
  if (I.chip->abort_deadlocked()) run_to_quiescence();  // unwinds every blocked process
  uint64_t makespan_ps = 0;
  bool all_ok = true;
  std::vector<uint64_t> begun_ps(launches.size()), duration_ps(launches.size());
  for (size_t i = 0; i < launches.size(); ++i) {
    KernelResult& r = out.launches[i];
    r.ok = I.chip->outcome(i) == Chip::Outcome::Done;
    all_ok = all_ok && r.ok;
    if (!r.ok) r.error = I.chip->fault_message(i);
    const sc_time begun = I.chip->start_time(i);
    makespan_ps = std::max(makespan_ps, time_ps(I.chip->end_time(i) - start));
    const uint64_t ps = time_ps(I.chip->end_time(i) - begun);
    begun_ps[i] = time_ps(begun);
    duration_ps[i] = ps;
    r.start_cycle = time_ps(begun) / kPsPerCycle;
    r.cycles = ceil_cycles(ps);
    r.time_us = I.cfg.cycles_to_us(static_cast<double>(ps) / kPsPerCycle);
    if (launches[i].take_cores_when_ready) group[i].cores = I.chip->launch_cores(i);
  }
  // The counters of the launches that took their cores when ready: each core's over the time
  // the launch held it (read before end_concurrent clears the launches' workers).
  std::vector<uint64_t> before_end;
  I.counters.raw_values(before_end);
  std::vector<std::optional<CounterDelta>> held(launches.size());
  for (size_t i = 0; i < launches.size(); ++i) held[i] = I.chip->held_counters(i, before_end);
  I.chip->end_concurrent();
  out.cycles = ceil_cycles(makespan_ps);
  out.time_us = I.cfg.cycles_to_us(static_cast<double>(makespan_ps) / kPsPerCycle);
  out.counters = I.counters.delta_since(base);
  std::vector<uint64_t> end_raw;
  I.counters.raw_values(end_raw);
  out.counters.set_root(kChipName);
  for (size_t i = 0; i < launches.size(); ++i) {
    // The launch's cores' counters: "chip.<core>." for each of its cores.
    std::vector<std::string> prefixes;
    for (int c : group[i].cores)
      prefixes.push_back(std::string(kChipName) + "." +
                         I.chip->cores()[static_cast<size_t>(c)]->core_name() + ".");
    KernelResult& r = out.launches[i];
    const auto own = [&](const CounterInfo& info) {
      return std::any_of(prefixes.begin(), prefixes.end(), [&](const std::string& p) {
        return info.name.compare(0, p.size(), p) == 0;
      });
    };
    const std::vector<uint64_t>* from = I.chip->counters_at_start(i);
    const std::vector<uint64_t>* to = I.chip->counters_at_end(i);
    if (held[i]) {
      held[i]->set_root(kChipName);
      r.counter_delta = held[i]->filtered(own);
    } else if (from || to) {
      // Its cores may have run other launches of the group before or after it: only the
      // counters' growth from its start to its end. A counter registered after its end (on
      // first use, by a later launch on its cores) did not move in it: 0 at its end, where
      // delta_between would count its value now.
      std::vector<uint64_t> until = to ? *to : end_raw;
      until.resize(end_raw.size(), 0);
      CounterDelta d = I.counters.delta_between(from ? *from : base, until);
      d.set_root(kChipName);
      r.counter_delta = d.filtered(own);
    } else {
      r.counter_delta = out.counters.filtered(own);
    }
    if (launches[i].launch.counter_tree) r.counters = r.counter_delta.tree();
  }
  std::string note = "simulated\truns beside other launches";
  if (unkeyed.empty()) {
    RecordedGroup rec;
    rec.quiescent_ps = time_ps(sc_time_stamp() - start);
    rec.makespan_ps = makespan_ps;
    for (size_t i = 0; i < launches.size(); ++i)
      rec.members.push_back({begun_ps[i] - std::min(begun_ps[i], time_ps(start)), duration_ps[i],
                             out.launches[i].counter_delta});
    rec.counters = I.counters.raw_delta_since(base);
    rec.delta = out.counters;
    rec.writes = recorder.writes();
    std::string untranslated;
    rec.translation = recorder.translation(&untranslated);
    if (check) {
      // throws naming the first difference
      I.check_group(*recorded, rec, out, *replay_writes, replayed);
      for (KernelResult& r : out.launches) r.replayed = true;
      note += fmt::format("; group of {} launches replayed ({}), checked by simulating",
                          launches.size(), how);
    } else if (!all_ok) {
      note += "; group not recorded: a launch failed";
    } else if (rec.translation) {
      rec.writes.clear();  // the replay moves the translation's
      if (I.group_layouts.size() >= kGroupMemoGroups) I.group_layouts.clear();  // bounded
      I.group_layouts[layout.launches_hash] = layout_sketch(launches, layout, translated);
      I.groups.insert(std::move(translated), std::move(rec));
      note += "; group recorded, translatable";
      if (!stale.empty()) note += " (its recording: " + stale + ")";
      if (!unlike.empty()) note += " (" + unlike + ")";
    } else if (!layout.any_steered) {
      I.groups.insert(std::move(exact), std::move(rec));
      note += "; group recorded under its addresses (not translatable: " + untranslated + ")";
    } else {
      note += "; group not recorded: a launch's ld may steer it and " + untranslated;
    }
  } else {
    note += "; group not replayed: " + unkeyed;
  }
  I.launcher->note_group(std::move(note));
  for (size_t i = 0; i < launches.size(); ++i) I.launcher->log(launches[i].launch, out.launches[i]);
  return out;
}

HdcResult Simulator::copy_host_to_device(uint64_t dev_addr, const void* src, uint64_t bytes) {
  if (!m_impl->gm.in_bounds(dev_addr, bytes))
    throw Error(fmt::format("copy_host_to_device: device range [{:#x}, {:#x}) is outside device "
                            "memory of {} bytes", dev_addr, dev_addr + bytes,
                            m_impl->gm.capacity()));
  if (bytes) m_impl->gm.write(dev_addr, src, bytes);
  // Data from the host arrives in HBM: a kept L2 drops what it held there.
  m_impl->chip->memory().drop_host_write(dev_addr, bytes);
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
