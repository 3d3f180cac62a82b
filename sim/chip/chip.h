// The chip top: the AI cores (aic/aiv on a split chip, aicore on a coupled one), the task
// scheduler, the memory system (L2 + HBM) behind every core's GM port, and the HDC link. It
// implements the cores' environment (faults, aborts, block completion, cross-core flags) and the
// launch protocol the Simulator drives between sc_start() calls:
//   begin_launch(); sc_start(); outcome(); [deadlock: abort(); sc_start();] end_launch().
// Several launches at once on disjoint cores (Simulator::run_concurrent):
//   begin_concurrent(); sc_start(); [deadlocks: abort_deadlocked(); sc_start();]
//   outcome(i), end_time(i) ...; end_concurrent().
// Each launch has its own slot: task scheduler, workers, task overheads, fault, cross-core
// barriers and abort (its cores' abort signals); the memory system and the HDC link are shared.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <systemc>

#include "isa/isa.h"
#include "sim/chip/hdc_link.h"
#include "sim/chip/memory_system.h"
#include "sim/chip/task_scheduler.h"
#include "sim/core/ai_core.h"
#include "sim/core/core_env.h"
#include "sim/counters/counters.h"

namespace npusim {

class CoreRecording;

class Chip : public sc_core::sc_module, public CoreEnv {
 public:
  SC_HAS_PROCESS(Chip);
  enum class Outcome { Done, Fault, Deadlock };

  // Counters register under `counter_root` (the module's name if empty: "chip"); `observers`
  // are called at every probe point. The chips of a system are modules chip0, chip1, ... with a
  // counter registry each, their counters all under "chip" as a single chip's.
  Chip(sc_core::sc_module_name name, const ChipConfig& cfg, DeviceMemory& gm,
       CounterRegistry& counters, std::vector<ChipObserver*> observers,
       const std::string& counter_root = {});
  ~Chip() override;

  // Prepares a launch and dispatches its first blocks (they start when the simulation runs).
  // Throws npusim::Error for a launch this chip cannot run (no section for it, block_dim < 1).
  // record: attach a CoreRecording to every core for the launch (recordings()), dropped if the
  // recording passes record_max_bytes (launch().record is then false).
  // The memory system's L2 state is the one memory().select_l2() chose for the launch.
  // record_lean: the recordings are lean (CoreRecording), for a timing-only replay by
  // translation only, and the memory system records nothing.
  // record_effect_order (not lean): also record the order of the effects across the cores
  // (effect_order()), for a launch whose cores hand each other data.
  // record_l2_trace: the memory system also keeps every range its L2 looks up
  // (MemorySystem::l2_trace, at most record_max_bytes of them), for a graph run's launch
  // replayed by translation.
  void begin_launch(const isa::Program& program, const std::vector<uint64_t>& args,
                    int block_dim, bool functional, uint64_t max_insns_per_block,
                    bool record = false, uint64_t record_max_bytes = UINT64_MAX,
                    bool record_lean = false, bool record_effect_order = false,
                    bool record_l2_trace = false);
  // After sc_start() returned: how the launch ended.
  Outcome outcome() const;
  const std::string& fault_message() const { return fault_message(0); }
  // "deadlock: core aic0 pc 12 (k.s:30) wait_flag mte2, m, 1 never set; ..."
  std::string deadlock_report() const;
  // Aborts the launch from outside the simulation (after a deadlock); sc_start() then unwinds
  // every process.
  void abort();
  // Faults the launch from outside the simulation because its next event lies past
  // kSimTimeLimitPs, then aborts it like abort().
  void stop_at_time_limit();
  // Simulated time the launch ended: its last block's end (with the task's completion
  // overhead) or, if later, the end of the last write-back flow of its evicted L2 lines
  // (MemorySystem::writebacks_end); its fault; or (deadlock) the last activity.
  sc_core::sc_time end_time() const;
  // Ends the launch: resets cores, scheduler and abort signal so the next launch starts clean;
  // accounts the launch's cycles.
  void end_launch(bool ok);

  // One launch of a concurrent group: what begin_launch takes, the cores it may use (chip
  // indices, as cores()) and the launches it waits for (indices of earlier launches of the
  // group). Two launches may share a core only if one waits for the other, directly or through
  // others (ordered launches: a stream's). take_cores_when_ready (cores empty): the launch
  // takes workers' cores as they free once it is ready, among the cores no launch with fixed
  // cores uses (Simulator's ConcurrentLaunch::take_cores_when_ready). Never recorded.
  struct GroupLaunch {
    const isa::Program* program = nullptr;
    const std::vector<uint64_t>* args = nullptr;
    int block_dim = 1;
    uint64_t max_insns_per_block = 0;
    std::vector<int> cores;
    std::vector<size_t> after;
    bool take_cores_when_ready = false;
  };
  // waits[i][j]: launch i of `group` waits for launch j, directly (GroupLaunch::after) or
  // through others. Throws npusim::Error naming the launch for an index in `after` that is not
  // an earlier launch's (itself, a later one, none: a cycle could only be made so).
  static std::vector<std::vector<bool>> waits_for(const std::vector<GroupLaunch>& group);
  // Begins the group now: every launch that waits for none begins now, each on its own cores
  // with its own task scheduler (dispatch, block starts, completion overheads as a lone
  // launch's); a launch that waits for others begins when the last of them has ended
  // (end_time), on a clean set of its cores (as a lone launch after another), or does not run
  // if one of them failed (its fault_message names that one). The memory system's L2 state is
  // the one memory().select_l2() chose for the group. Throws npusim::Error naming the launch
  // (its index in `group`) for one this chip cannot run on its cores (no section for them, no
  // core of the kind its section needs among them, block_dim < 1, a core outside the chip,
  // listed twice, or also another launch's that neither waits for, a bad `after`; cores named
  // with take_cores_when_ready, or no worker on the cores outside the fixed launches'); nothing
  // is begun then. A fault in one launch aborts its cores and its transfers only: the others
  // run on to their end. Launches that take their cores when ready get them from the cores no
  // launch with fixed cores uses, a worker at a time (serve_free_cores): such a launch begins
  // when it is ready and at least one worker is free, taking as many free workers (first in
  // chip order) as it has blocks; a worker that finishes a block takes the launch's next one,
  // and one with no block left goes back to the chip, where the launches in index order that
  // are ready and have blocks no worker holds take it (its blocks run in waves, block_dim may
  // exceed the chip's workers). A launch that failed keeps the cores it held to the group's end.
  void begin_concurrent(const std::vector<GroupLaunch>& group, bool functional);
  // After sc_start() returned, of launch i of the group (Outcome::Deadlock: still unfinished,
  // or not begun while what it waits for runs; Outcome::Fault also: it did not run).
  Outcome outcome(size_t i) const;
  const std::string& fault_message(size_t i) const;
  std::string deadlock_report(size_t i) const;
  // Launch i's begin: the group's, or the end of the last launch it waited for (a launch that
  // did not run: when the failure of what it waited for was known).
  sc_core::sc_time start_time(size_t i) const { return m_slots[i]->start; }
  // The raw counter values (CounterRegistry::raw_values) when launch i began, if it began
  // after the group's start, and when it ended, if a later launch waited for it; else nullptr
  // (then the group's start or end bounds its counters).
  const std::vector<uint64_t>* counters_at_start(size_t i) const {
    const Slot& s = *m_slots[i];
    return s.started && (!s.after.empty() || s.take_cores_when_ready) ? &s.raw_at_start : nullptr;
  }
  // The chip indices of the cores launch i of the group ran on (for one that took its cores
  // when ready: every core that ran a block of it; none if it did not run).
  std::vector<int> launch_cores(size_t i) const;
  const std::vector<uint64_t>* counters_at_end(size_t i) const {
    return m_slots[i]->ended && m_slots[i]->fault.empty() ? &m_slots[i]->raw_at_end : nullptr;
  }
  // Of a launch that took its cores when ready and began (else nullopt): the growth of each of
  // its cores' counters ("<root>.<core>.") over the time it held that core, from taking it to
  // giving it back (a core it still holds, having failed: to `now`, raw_values at the group's
  // end), so a core that ran blocks of several launches counts each one's work in its own.
  // Other counters: 0, but high-water ones, which report the group's maximum (delta_between).
  std::optional<CounterDelta> held_counters(size_t i, const std::vector<uint64_t>& now);
  // Launch i's end: its last block's end with the completion overhead, or if later the end of
  // the last write-back flow of the lines its cores' transfers evicted; its fault; or
  // (deadlock) now. A launch that did not run ends where it began.
  sc_core::sc_time end_time(size_t i) const;
  // After the simulation went quiescent with launches unfinished (deadlocked): faults them and
  // aborts their cores, and the launches waiting for them do not run; sc_start() then unwinds
  // their blocked processes. Returns whether any was.
  bool abort_deadlocked();
  // Stops every unfinished launch of the group at the time limit (as stop_at_time_limit).
  void stop_group_at_time_limit();
  // Ends the group as end_launch ends a launch (chip.total_cycles counts each launch's own
  // duration, so the launches' overlap is counted once per launch).
  void end_concurrent();

  HdcLink& hdc() { return *m_hdc; }
  const MemorySystem& memory() const { return *m_memory; }
  MemorySystem& memory() { return *m_memory; }
  // Attaches an observer between launches (Simulator::add_observer): it gets on_core for every
  // core now. Not while a launch runs. Attaching one already attached is a no-op.
  void add_observer(ChipObserver* observer);
  void remove_observer(ChipObserver* observer);
  // Tells every observer that a launch began / ended at t_ps (the chip's own launches, and the
  // launcher's replayed ones, which the observers see only as these two calls), then asks their
  // wants_instructions() anew: the only moments its answer may change.
  void notify_kernel_begin(const isa::Program& program, int block_dim, uint64_t t_ps);
  void notify_kernel_end(const isa::Program& program, uint64_t t_ps, bool ok);
  const std::vector<std::unique_ptr<AiCore>>& cores() const { return m_cores; }
  // The records of the launch in progress, by core chip index, while it is being recorded
  // (until end_launch); empty otherwise.
  const std::vector<std::unique_ptr<CoreRecording>>& recordings() const { return m_recordings; }
  // While the launch is recorded with record_effect_order: the chip index of the core of every
  // effect (each entry of the cores' CoreRecording::exec_order), in the order the effects took
  // place across the cores (each pipe instruction's execute() and each scalar ld / st, done at
  // one simulated instant, so this is the order the cores' data saw). Empty otherwise.
  const std::vector<uint16_t>& effect_order() const { return m_effect_order; }

  // The lone launch in progress (or last begun): what begin_launch was given.
  const LaunchInfo& launch() const { return m_slots.front()->launch; }

  // CoreEnv
  const ChipConfig& config() const override { return m_cfg; }
  DeviceMemory& gm() override { return m_gm; }
  const std::vector<ChipObserver*>& observers() const override { return m_observers; }
  const std::vector<ChipObserver*>& instruction_observers() const override {
    return m_instruction_observers;
  }
  uint64_t new_flow_id() override { return ++m_flow_ids; }
  void recorded(uint64_t bytes) override;
  void fault(const AiCore& core, uint32_t pc, const isa::Instruction* in,
             const std::string& what) override;
  void block_done(AiCore& core) override;
  void cross_core_set(AiCore& core, Lane lane, int mode, int id) override;

 private:
  // A launch in progress: the lone launch (slot 0), or one of a concurrent group.
  struct Slot {
    LaunchInfo launch;
    TaskScheduler scheduler;
    std::vector<std::unique_ptr<SectionRun>> runs;
    std::string fault;
    sc_core::sc_time start, end;
    bool mix = false;
    bool aborted = false;  // its cores' abort signals are raised
    // The cores it may use, by chip index (all of them for the lone launch).
    std::vector<bool> cores;
    // Barrier-mode cross-core sets (modes 0 and 1) that arrived so far: (group, id) -> count.
    std::map<std::pair<int, int>, int> cc_arrivals;
    sc_core::sc_event task_done;  // the launch's completion overhead has passed
    // Ordered concurrent launches (GroupLaunch::after): the launches this one waits for, the
    // workers it begins with (made by begin_concurrent), whether it has begun, whether some
    // launch waits for it and, for such a launch, whether and when it ended (end_time).
    std::vector<size_t> after;
    std::vector<TaskScheduler::Worker> workers;
    bool started = false;
    bool awaited = false;
    bool ended = false;
    sc_core::sc_time ended_at;
    std::vector<uint64_t> raw_at_start, raw_at_end;  // counters_at_start / counters_at_end
    // GroupLaunch::take_cores_when_ready: `cores` is the cores it holds now (empty until it
    // begins, none once every worker went back), `used` every core that ran a block of it.
    bool take_cores_when_ready = false;
    std::vector<bool> used;
    uint64_t view = 0;  // its L2 view (MemorySystem::begin_launch_view), for cores that join
    // held_counters: raw values when each worker (by index in the scheduler) joined, and the
    // values bounding the intervals of the workers given back: from / to, by counter index.
    std::vector<std::vector<uint64_t>> raw_at_join;
    std::vector<uint64_t> held_from, held_to;
  };
  // The cores a launch's transfers came from: those it was given, or (one that took its cores
  // when ready) every core that ran a block of it. Its end waits for their write-backs: where a
  // core ran blocks of a later launch too, for that one's as well (the memory system knows a
  // transfer's core, not its launch).
  static const std::vector<bool>& ran_on(const Slot& s) {
    return s.take_cores_when_ready ? s.used : s.cores;
  }
  Slot& slot_of(const AiCore& core) {
    return *m_slots[static_cast<size_t>(m_slot_of_core[static_cast<size_t>(core.chip_index())])];
  }
  // Resets slot `s` for a new launch and makes its workers (throws like begin_launch);
  // start_slot() begins it.
  void prepare_slot(Slot& s, const isa::Program& program, const std::vector<uint64_t>& args,
                    int block_dim, bool functional, uint64_t max_insns_per_block);
  // Begins launch `i` of the group now: its cores become its own (slot_of) and are reset if a
  // launch ran on them before in the group, its first blocks are dispatched.
  void start_slot(size_t i);
  // Ordered launches: notes the ends of awaited launches that have ended, begins the launches
  // whose awaited launches have all ended, marks as not run those waiting for a failed one.
  // may_start false (outside the simulation, after a deadlock or the time limit): begins none,
  // and every launch still not begun does not run.
  void settle_waiting(bool may_start);
  void start_waiting();  // method: settle_waiting(true) when a launch may have ended
  std::vector<TaskScheduler::Worker> make_workers(Slot& slot, const isa::Program& program);
  // The cores of each worker `program` gets from the cores in `mask` (by chip index), in chip
  // order: one core of the kind its section runs on or, for a mix kernel, a cube core and the
  // first mix_aiv_per_block of its aiv_per_aic vector cores (cube core g with vector cores
  // g * aiv_per_aic ...), the groups whose cores are all in `mask`. Empty for a split chip's program with no aic / aiv section.
  std::vector<std::vector<AiCore*>> worker_cores(const isa::Program& program,
                                                 const std::vector<bool>& mask) const;
  // Launch i of the group takes its cores when ready: if it is ready (begun with blocks no
  // worker holds, or not begun and every launch it waits for ended well) it takes free
  // workers (m_free_cores, first in chip order), one per block no worker holds; one that had
  // not begun begins if it got any. Returns whether it began.
  bool take_free_cores(size_t i);
  // take_free_cores for every launch in index order (the task scheduler serves the streams'
  // tasks in the order they were issued); schedules the blocks' starts.
  void serve_free_cores();
  // Gives back the idle workers of launch i (take_cores_when_ready) that have no block left:
  // their cores become free and their counters' intervals end. Returns whether any was.
  bool release_idle_workers(size_t i);
  // The worker of slot s (its sections prepared by make_workers) on the cores of group g
  // (worker_cores: one core, or a cube core and its vector cores).
  TaskScheduler::Worker group_worker(const Slot& s, const std::vector<AiCore*>& g) const;
  // The counter indices of each core's counters (by chip index; "<root>.<core>."), extended to
  // the counters registered so far.
  const std::vector<std::vector<uint32_t>>& core_counter_indices();
  // Why launch i (take_cores_when_ready, ready) did not run: too few free cores, and the failed
  // launches that keep the others.
  std::string no_cores_message(size_t i) const;
  const SectionRun& prepare_section(Slot& slot, const isa::Section& s);
  void post(AiCore& from, Lane lane, AiCore& to, int id);
  void raise_abort(Slot& s);
  void end_slot(Slot& s, const sc_core::sc_time& end, bool ok);
  // Clears the cores, recordings, transfers, schedulers and abort signals after the launches.
  void reset_after_launches();
  // Detaches the recordings from the cores and frees them (recordings() is then empty).
  void detach_recordings();
  void dispatch_blocks();  // method: hands blocks to the workers freed in the last delta cycle
  void start_blocks();     // method: starts the blocks whose task overheads have passed
  void schedule_starts();  // notifies m_block_start_due for the next block start, if any

  const std::string m_counter_root;  // declared first: the counters below register under it
  CounterRegistry& m_counters;
  const ChipConfig& m_cfg;
  DeviceMemory& m_gm;
  std::vector<ChipObserver*> m_observers;
  // Those of m_observers that want instructions and flag edges (refresh_instruction_observers).
  std::vector<ChipObserver*> m_instruction_observers;
  void refresh_instruction_observers();
  std::vector<std::unique_ptr<AiCore>> m_cores;  // chip index order: aic..., aiv... (or aicore)
  std::unique_ptr<MemorySystem> m_memory;
  std::unique_ptr<HdcLink> m_hdc;
  sc_core::sc_event m_worker_freed;
  sc_core::sc_event m_block_start_due;
  // A launch's completion or fault, for the launches waiting for it (one notification each).
  sc_core::sc_event_queue m_launch_ended;
  bool m_waiting = false;  // the group has launches that wait for others (settle_waiting)
  // By chip index: the core is free for a launch that takes its cores when ready (no launch
  // with fixed cores uses it, and no launch that took it holds it).
  std::vector<bool> m_free_cores;
  // core_counter_indices(): the indices so far, and how many counters were looked at.
  std::vector<std::vector<uint32_t>> m_core_counters;
  size_t m_core_counters_seen = 0;

  // The launches in progress: slot 0 the lone launch; slots 0..m_active_slots-1 a concurrent
  // group's. Slots are kept for later launches (their events stay alive).
  std::vector<std::unique_ptr<Slot>> m_slots;
  size_t m_active_slots = 1;
  std::vector<int> m_slot_of_core;  // by chip index: the slot whose launch may use the core
  std::vector<std::unique_ptr<CoreRecording>> m_recordings;  // see recordings()
  uint64_t m_recorded_bytes = 0;  // host memory held by the launch's recording (about)
  std::vector<uint16_t> m_effect_order;  // see effect_order()
  uint64_t m_flow_ids = 0;

  Counter& m_total_cycles;
  Counter& m_task_overhead_cycles;
  Counter& m_launches;
  Counter& m_failed_launches;
};

}  // namespace npusim
