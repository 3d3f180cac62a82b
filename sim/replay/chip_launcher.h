// Kernel launches on one chip, replayed when they can be (sim/replay/launch_replay.h): what the
// single-chip Simulator and every chip of a SystemSimulator share. A ChipLauncher decides for
// each launch whether a recording times it (same key, or the same launch at other tensor
// addresses after verify_translation), carries out a replay, or begins the launch on the chip
// (recording it), and after the simulation ran builds the KernelResult: outcome, cycles,
// counters, the recording kept for later, and SimOptions::Replay::check's comparison.
//
// The chips of one simulation share a ReplayStore: a launch recorded on chip 0 replays on chip 1
// (the data-parallel replicas of a training step run the same kernels). That holds because the
// chips of a system have the same config and each chip's timing depends on its own cores, L2 and
// HBM only (kernels use no inter-chip link), and the chips' counter registries name their
// counters alike (CounterRegistry::translate maps a recording's counters onto another chip's).
//
// The caller owns simulated time: it starts the launch on a clock edge, lets the simulation run
// (with other chips' launches, in a system) and lets a replay's time pass.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <systemc>

#include "sim/memory/device_memory.h"
#include "sim/replay/launch_replay.h"
#include "sim/replay/worker_pool.h"
#include "sim/simulator.h"

namespace npusim {

class Chip;
class L2Placement;
class CounterRegistry;

// The recordings of one simulation and the host threads replays run on, shared by its chips.
struct ReplayStore {
  explicit ReplayStore(const SimOptions& opts);
  SimOptions opts;
  LaunchMemo memo;
  WorkerPool pool;
  // analyze_address_flow of each program seen, by LaunchKey::program_hash.
  const AddressFlow& address_flow(const LaunchKey& key, const isa::Program& program);
  // For the replay log (SimOptions::replay_log set): by relocation key (the similar key without
  // the block extents), why the latest recording of such a launch that relocation may not use
  // (it may evict an L2 line) refuses, so that a launch with no candidate says so.
  std::unordered_map<LaunchKey, std::string, LaunchKeyHash> unrelocatable;

 private:
  std::map<std::pair<uint64_t, uint64_t>, AddressFlow> m_flows;
};

class ChipLauncher {
 public:
  // `chip` registers its counters in `counters` under `counter_root` ("chip"); `gm` is its
  // device memory. All must outlive the launcher.
  ChipLauncher(Chip& chip, DeviceMemory& gm, CounterRegistry& counters, const ChipConfig& cfg,
               ReplayStore& store, std::string counter_root);
  ~ChipLauncher();

  // What begin() did.
  struct Begun {
    // The launch was carried out without simulating it (a replay, or the rare replay fault):
    // `result` is final and nothing runs on the chip. Else the launch runs on the chip now.
    bool done = false;
    // done: the simulated time from the start the chip stays busy (the recorded run's time to
    // quiescence); the caller lets at least this much pass before the chip's next work.
    uint64_t busy_ps = 0;
    KernelResult result;
  };
  // Starts `launch` at `start` (the current simulated time, on a clock edge). alone: nothing
  // else runs in the simulation until this launch is done. Only such a launch is recorded or
  // replayed: a launch that runs beside other chips' launches or link traffic may take a
  // fraction of a cycle more or less and count other L2 hits than alone, because SystemC runs
  // processes due at the same picosecond in an order that depends on every pending event of the
  // simulation (the cores of a chip then reach the L2 in another order). So it is simulated,
  // and the replay stays exact.
  Begun begin(const KernelLaunch& launch, const sc_core::sc_time& start, bool alone);
  // After the simulation stopped (quiescent, or at the time limit after Chip::stop_at_time_limit)
  // for a launch begin() started on the chip: reads its outcome. True if it deadlocked: the chip
  // was aborted and the caller must run the simulation to quiescence again before finish().
  bool settle();
  // Ends the launch begin() started on the chip; the simulation is quiescent. Returns its
  // result (throws npusim::Error in check mode if its replay differed from simulating it).
  KernelResult finish();
  // Appends the launch's line to SimOptions::launch_log and to SimOptions::replay_log, if set.
  // The replay log's CPU field is the calling thread's CPU time since begin() / begin_beside()
  // or since the previous line, whichever is later: a group's lines are written at its end, so
  // its CPU time falls on its first member's line and the lines sum to the time spent.
  void log(const KernelLaunch& launch, const KernelResult& r);
  // Launches that run beside each other on the chip (Simulator::run_concurrent) are simulated
  // without the launcher: this starts their replay-log entry ("simulated", beside other
  // launches; CPU time from now), which log() then writes for each of them.
  void begin_beside();
  // The replay-log entry log() writes for the launches of a group from now on (a group replayed
  // as a whole, or why it was simulated: Simulator::run_concurrent), CPU time still counted
  // from begin_beside().
  void note_group(std::string note) {
    if (!m_store.opts.replay_log.empty()) m_replay_note = std::move(note);
  }

  // Whether an observer attached to the chip needs the instructions of launches (no replay).
  bool detail_wanted() const;

 private:
  struct Pending;
  // verify_translation against the L2 this launch would start with (effects: see there).
  // blocks: the lookup the launch's lines are filed by (Pending::blocks).
  bool verify(RecordedLaunch& rec, const KernelLaunch& launch, const GmBlockLookup& blocks,
              std::vector<GmAccess>* writes, VerifiedEffects* effects);
  // rec's counters as this chip's registry's (CounterRegistry::translate).
  CounterRegistry::RawDelta own_counters(const RecordedLaunch& rec);
  KernelResult replayed_result(const KernelLaunch& launch, const RecordedLaunch& rec,
                               const sc_core::sc_time& start);
  void check_replay(const isa::Program& program, const Pending& P, const KernelResult& r,
                    uint64_t duration_ps, uint64_t quiescent_ps);

  Chip& m_chip;
  DeviceMemory& m_gm;
  CounterRegistry& m_counters;
  const ChipConfig& m_cfg;
  ReplayStore& m_store;
  std::string m_root;
  std::unique_ptr<L2Tags> m_verify_l2;  // the L2 a launch at new tensor addresses is checked on
  std::unique_ptr<L2Placement> m_verify_placement;  // where the check files its lines
  VerifiedEffects m_verified;           // the effects the last check kept (storage reused)
  std::vector<uint64_t> m_launch_base;  // counter snapshot at the start of the launch (reused)
  // CounterRegistry::translate's index maps, by the registry a recording was made on.
  std::unordered_map<const CounterRegistry*, std::vector<int64_t>> m_counter_maps;
  std::unique_ptr<Pending> m_pending;  // the launch running on the chip
  // The last launch's replay log entry: "replayed\t<how>" or "simulated\t<why>[; <recording>]"
  // (filled only when SimOptions::replay_log is set).
  std::string m_replay_note;
  // The calling thread's CPU time at begin() / begin_beside() or the last replay log line
  // (replay log only).
  uint64_t m_begin_cpu_ns = 0;
};

}  // namespace npusim
