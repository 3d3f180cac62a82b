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
#include <thread>
#include <utility>

#include <fmt/format.h>
#include <systemc>

#include "common/error.h"
#include "sim/chip/chip.h"
#include "sim/chip/l2_tags.h"
#include "sim/counters/counters.h"
#include "sim/counters/observer.h"
#include "sim/counters/trace.h"
#include "sim/replay/launch_replay.h"
#include "sim/replay/worker_pool.h"
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

// SimOptions with the environment's overrides (NPUSIM_REPLAY, NPUSIM_REPLAY_THREADS) applied.
SimOptions with_environment(SimOptions o) {
  if (const char* v = std::getenv("NPUSIM_REPLAY"); v && *v) {
    if (!std::strcmp(v, "on") || !std::strcmp(v, "1")) o.replay = SimOptions::Replay::on;
    else if (!std::strcmp(v, "off") || !std::strcmp(v, "0")) o.replay = SimOptions::Replay::off;
    else if (!std::strcmp(v, "check")) o.replay = SimOptions::Replay::check;
    else
      throw ConfigError(fmt::format("NPUSIM_REPLAY='{}': expected on, off or check", v));
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
  return o;
}

int replay_thread_count(const SimOptions& o) {
  if (o.replay_threads > 0) return o.replay_threads;
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

}  // namespace

struct Simulator::Impl {
  Impl(const ChipConfig& c, const SimOptions& o)
      : cfg(c), opts(o), gm(c.hbm_bytes), memo(o.replay_memo_launches, o.replay_memo_bytes),
        pool(o.replay == SimOptions::Replay::off ? 1 : replay_thread_count(o)),
        verify_l2(o.replay == SimOptions::Replay::off ? 0 : c.l2_bytes, c.l2_line_bytes,
                  c.l2_ways, c.l2_write_back) {}
  ChipConfig cfg;
  SimOptions opts;
  DeviceMemory gm;
  LaunchMemo memo;
  WorkerPool pool;
  L2Tags verify_l2;  // the L2 a launch at new tensor addresses is checked against
  L2Placement verify_placement{verify_l2.line_bytes()};  // where the check files its lines

  // verify_translation against the L2 this launch would start with (cold, or the chip's own
  // when it keeps its lines); `verify_l2` then holds the L2 as the launch leaves it, and
  // `writes` (may be null) the GM ranges it writes.
  bool verify(const RecordedLaunch& rec, const KernelLaunch& launch,
              std::vector<GmAccess>* writes) {
    if (cfg.l2_keep_across_launches) verify_l2 = chip->memory().l2();
    else verify_l2.invalidate_all();
    // As the memory system files them (MemorySystem::begin_launch).
    verify_placement.begin_launch(cfg.l2_keep_across_launches ? GmBlockLookup()
                                                               : launch.gm_blocks);
    return verify_translation(rec, *launch.program, launch.args, launch.block_dim, chip->cores(),
                              gm, cfg, pool, verify_l2, verify_placement, writes);
  }
  CounterRegistry counters;
  std::vector<uint64_t> launch_base;  // counter snapshot at the start of the launch (reused)
  std::unique_ptr<TraceRecorder> trace;
  std::unique_ptr<Chip> chip;

  // The result of a replayed launch: simulated time moves on as it did when the launch was
  // simulated, and the counters move by what it counted then.
  KernelResult replayed_result(const isa::Program& program, int block_dim,
                               const RecordedLaunch& rec, const sc_time& start,
                               bool counter_tree) {
    const uint64_t start_ps = time_ps(start);
    for (ChipObserver* o : chip->observers()) o->on_kernel_begin(program, block_dim, start_ps);
    run_for(sc_time(static_cast<double>(rec.quiescent_ps), sc_core::SC_PS));
    for (ChipObserver* o : chip->observers())
      o->on_kernel_end(program, start_ps + rec.duration_ps, true);
    counters.apply(rec.counters);
    KernelResult r;
    r.ok = true;
    r.replayed = true;
    r.start_cycle = time_ps(start) / kPsPerCycle;
    r.cycles = ceil_cycles(rec.duration_ps);
    r.time_us = cfg.cycles_to_us(static_cast<double>(rec.duration_ps) / kPsPerCycle);
    r.counter_delta = rec.delta;  // shares the recording's values (delta_of(rec.counters))
    r.counter_delta.set_root(kChipName);
    if (counter_tree) r.counters = r.counter_delta.tree();
    return r;
  }

  // Replay check (SimOptions::Replay::check): the launch was replayed into `replayed`, then
  // simulated from the same memory into `r`. Throws npusim::Error naming the first difference.
  void check_replay(const isa::Program& program, const RecordedLaunch& rec,
                    const std::string& replay_error, const DeviceMemory::Snapshot& replayed,
                    const KernelResult& r, uint64_t duration_ps, uint64_t quiescent_ps) {
    const std::string what = fmt::format("replay check of kernel '{}'", program.name);
    if (!r.ok || !replay_error.empty())
      throw Error(fmt::format("{}: simulated: {}; replayed: {}", what, r.ok ? "ok" : r.error,
                              replay_error.empty() ? "ok" : replay_error));
    if (duration_ps != rec.duration_ps || quiescent_ps != rec.quiescent_ps)
      throw Error(fmt::format("{}: simulated {} ps (idle after {} ps), recorded {} ps ({} ps)",
                              what, duration_ps, quiescent_ps, rec.duration_ps,
                              rec.quiescent_ps));
    const CounterRegistry::RawDelta now = counters.raw_delta_since(launch_base);
    if (now != rec.counters)
      throw Error(fmt::format("{}: the counters differ from the recorded run ({} vs {} moved)",
                              what, now.size(), rec.counters.size()));
    if (auto addr = gm.first_difference(replayed))
      throw Error(fmt::format("{}: device memory differs at {:#x} between the simulated and the "
                              "replayed launch", what, *addr));
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
  if (const std::string& path = m_impl->opts.launch_log; !path.empty()) {
    std::ofstream log(path, std::ios::app);
    log << launch.program->name << '\t' << launch.block_dim << '\t' << (r.ok ? r.cycles : 0)
        << '\t' << fmt::format("{:016x}", isa::program_digest(*launch.program)) << '\t'
        << fmt::format("{:016x}", counter_digest(r.counter_delta)) << '\n';
    if (!log) throw Error(fmt::format("NPUSIM_LAUNCH_LOG: cannot append to '{}'", path));
  }
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
  // A launch run before is replayed unless an observer wants to see its instructions.
  LaunchKey key, similar;
  bool loads = false;
  const bool replayable =
      I.opts.replay != SimOptions::Replay::off && launch.block_dim >= 1 &&
      replay_key(*launch.program, launch.args, launch.block_dim, &key, &similar, &loads);
  if (replayable && !I.cfg.l2_keep_across_launches)  // the cold L2 files lines by block
    for (LaunchKey* k : {&key, &similar})
      append_block_extents(launch.gm_blocks, launch.args, &k->args);
  RecordedLaunch* found = replayable ? I.memo.find(key) : nullptr;
  const auto& observers = I.chip->observers();
  const bool detail = std::any_of(observers.begin(), observers.end(),
                                  [](const ChipObserver* o) { return o->wants_launch_detail(); });
  // A replay moves time on by the recorded amount: past the limit, simulate (to fault there).
  RecordedLaunch* recorded =
      detail || (found && time_ps(start) + found->quiescent_ps > kSimTimeLimitPs) ? nullptr
                                                                                  : found;
  // A timing-only simulator carries out a launch that passed the check by invalidating the GM
  // ranges the check found it writes: that is all its replay would do (replay_blocks plans
  // every instruction again to find them).
  std::vector<GmAccess> writes;
  std::vector<GmAccess>* const verified_writes = I.opts.functional ? nullptr : &writes;
  bool have_writes = false;
  // With an ld, this launch's data may steer it elsewhere than the recorded run's: the
  // recording must pass the check with this launch's data first, as one made at other
  // addresses does; one that fails is recorded afresh below.
  // So must every recording when the L2 keeps its lines across launches: the L2 this launch
  // starts with may differ from the recorded run's.
  const bool keep_l2 = I.cfg.l2_keep_across_launches;
  const bool checked = recorded && (loads || keep_l2);
  const bool stale = checked && !I.verify(*recorded, launch, verified_writes);
  have_writes = checked && !stale && verified_writes;
  if (stale) recorded = nullptr;
  if (replayable && !recorded && !detail) {
    // The same launch at other tensor addresses (a training step): replay it if the recorded
    // timing provably holds for these addresses.
    for (std::shared_ptr<RecordedLaunch>& candidate : I.memo.find_similar(similar))
      if (time_ps(start) + candidate->quiescent_ps <= kSimTimeLimitPs &&
          I.verify(*candidate, launch, verified_writes)) {
        have_writes = verified_writes != nullptr;
        // Kept under this launch's own key too: the next step finds it without the check.
        I.memo.alias(key, candidate);
        recorded = candidate.get();  // the memo keeps it (just added: not evicted)
        break;
      }
  }
  DeviceMemory::Snapshot before, replayed;
  std::string replay_error;
  if (recorded) {
    const bool check = I.opts.replay == SimOptions::Replay::check;
    // The check replays, then simulates the same launch from the same state: device memory
    // and the buffers of the cores it runs on (a kernel may store bytes it never wrote).
    std::vector<std::vector<std::vector<uint8_t>>> buffers;
    if (check) {
      before = I.gm.snapshot();
      for (const RecordedLaunch::CoreBlocks& cb : recorded->cores)
        buffers.push_back(I.chip->cores()[static_cast<size_t>(cb.core)]->local().save());
    }
    if (have_writes) {
      for (const GmAccess& a : writes) I.gm.invalidate(a.addr, a.bytes);
    } else {
      // The same launch replayed again (its own key, no ld): run the effects its last replay
      // kept, or keep them this time (PreparedLaunch) when they fit an eighth of the memo.
      const bool same = recorded == found && !loads && I.opts.functional;
      const PreparedLaunch* prepared = same ? I.memo.prepared(key) : nullptr;
      std::unique_ptr<PreparedLaunch> keep;
      if (same && !prepared &&
          prepared_bytes_estimate(*recorded) <= I.opts.replay_memo_bytes / 8)
        keep = std::make_unique<PreparedLaunch>();
      replay_error = replay_blocks(*recorded, *launch.program, launch.args, launch.block_dim,
                                   I.chip->cores(), I.gm, I.cfg, I.opts.functional, I.pool,
                                   prepared, keep.get());
      if (keep && keep->complete && replay_error.empty())
        I.memo.keep_prepared(key, std::move(keep));
    }
    if (!check) {
      if (!replay_error.empty()) {
        // Cannot happen for a launch that ran cleanly with the same operands; report it as the
        // kernel's fault rather than pretend, and simulate the launch next time.
        I.memo.erase(key);
        KernelResult r;
        r.error = "replay: " + replay_error;
        r.start_cycle = time_ps(start) / kPsPerCycle;
        return r;
      }
      // The L2 as the simulated launch would have left it (verified above).
      if (keep_l2) std::swap(I.chip->memory().l2(), I.verify_l2);
      I.counters.restart_windows();  // what the snapshot before a simulated launch does
      return I.replayed_result(*launch.program, launch.block_dim, *recorded, start,
                               launch.counter_tree);
    }
    replayed = I.gm.snapshot();
    I.gm.restore(before);
    for (size_t i = 0; i < buffers.size(); ++i)
      I.chip->cores()[static_cast<size_t>(recorded->cores[i].core)]->local().restore(buffers[i]);
  }

  // The counters at the start of the simulated launch (a replay above needs no snapshot).
  I.counters.snapshot(I.launch_base);
  const bool record = replayable && !recorded && (!found || stale);
  I.chip->begin_launch(*launch.program, launch.args, launch.block_dim, I.opts.functional,
                       watchdog_budget(I.opts, *launch.program, launch.args), record,
                       I.opts.replay_record_max_bytes, launch.gm_blocks);
  if (!run_to_quiescence_or_limit() && I.chip->outcome() == Chip::Outcome::Deadlock) {
    I.chip->stop_at_time_limit();  // still running at the limit: a fault
    run_to_quiescence();  // unwinds every process
  }

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
  RecordedLaunch rec;
  // A recording dropped on the way (SimOptions::replay_record_max_bytes) is not kept.
  const bool keep = record && I.chip->launch().record && r.ok && !I.chip->mix() &&
                    record_blocks(*launch.program, *I.chip, &rec);
  I.chip->end_launch(r.ok);
  r.start_cycle = time_ps(start) / kPsPerCycle;
  r.cycles = ceil_cycles(duration_ps);
  r.time_us = I.cfg.cycles_to_us(static_cast<double>(duration_ps) / kPsPerCycle);
  r.counter_delta = I.counters.delta_since(I.launch_base);
  r.counter_delta.set_root(kChipName);
  if (launch.counter_tree) r.counters = r.counter_delta.tree();
  r.replayed = recorded != nullptr;  // check mode: replayed, then verified by simulating
  if (recorded) I.check_replay(*launch.program, *recorded, replay_error, replayed, r,
                               duration_ps, time_ps(sc_time_stamp() - start));
  if (keep) {
    rec.duration_ps = duration_ps;
    rec.quiescent_ps = time_ps(sc_time_stamp() - start);
    rec.counters = I.counters.raw_delta_since(I.launch_base);
    rec.delta = I.counters.delta_of(rec.counters);
    I.memo.insert(std::move(key), std::move(similar), std::move(rec));
  }
  return r;
}

HdcResult Simulator::copy_host_to_device(uint64_t dev_addr, const void* src, uint64_t bytes) {
  if (!m_impl->gm.in_bounds(dev_addr, bytes))
    throw Error(fmt::format("copy_host_to_device: device range [{:#x}, {:#x}) is outside device "
                            "memory of {} bytes", dev_addr, dev_addr + bytes,
                            m_impl->gm.capacity()));
  if (bytes) m_impl->gm.write(dev_addr, src, bytes);
  // Data from the host arrives in HBM: an L2 kept across launches drops what it held there.
  if (m_impl->cfg.l2_keep_across_launches)
    m_impl->chip->memory().l2().invalidate_range(dev_addr, bytes);
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
