// The chip model's public face: elaborate a chip once per process, then run kernels on it and
// move data over the host-device link. Not thread-safe: one thread (the runtime's driver thread)
// owns a Simulator. SystemC elaborates once per process, so at most one Simulator may ever be
// constructed in a process; constructing a second throws npusim::Error.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "isa/isa.h"
#include "sim/chip/l2_placement.h"
#include "sim/config/chip_config.h"
#include "sim/counters/counters.h"
#include "sim/memory/device_memory.h"

namespace npusim {

class ChipObserver;  // sim/counters/observer.h

struct SimOptions {
  bool functional = true;  // false: timing-only (no functional effect; identical cycle counts)
  bool trace = false;      // record a Chrome-trace timeline of every instruction
  uint64_t trace_max_events = 2'000'000;  // past this, further instruction events are dropped
  // Watchdog: a block that executes more scalar-unit instructions (issued pipe instructions
  // included) than its budget faults, so an endless loop in a kernel is an error, not a hang.
  // The budget scales with the work: max_insns_per_block for every kWatchdogDataBytes of the
  // data the launch's typed (tensor) arguments span, at least once (watchdog_budget()). The
  // default, 2^23 per 128 KiB, is 64 instructions per byte: the scalar-unit kernels
  // (stateless random, ~14 instructions per output byte) fit 4x over even in one block, and a
  // launch with little data stops an endless loop after 8.4 M instructions (a few seconds).
  // The 4096^3 GEMM needs about 10^5 per block. 0 disables the watchdog. The command line's
  // --max-insns-per-block and the TF plugin's NPUSIM_MAX_INSNS_PER_BLOCK set it.
  static constexpr uint64_t kWatchdogDataBytes = 128 * 1024;
  uint64_t max_insns_per_block = uint64_t{1} << 23;
  // Launch replay (sim/replay/launch_replay.h): a launch identical to one already simulated
  // (program, arguments, block count) is carried out without simulating time again and gets
  // the recorded cycles and counters. on: replay; off: simulate every launch; check: replay,
  // then also simulate it and throw npusim::Error if memory, cycles or counters differ.
  // The environment variable NPUSIM_REPLAY (on|off|check) overrides this.
  enum class Replay { on, off, check };
  Replay replay = Replay::on;
  // With a cold L2 only: a launch whose recording provably times it at its tensor addresses by
  // translation alone (translated_writes, sim/replay/launch_replay.h: the program moves with
  // its tensors and they lie in blocks laid out as then) is replayed without the check. A
  // timing-only run (functional false) does so without walking its program, also when
  // `replay` is off, which then records only such programs; a functional run walks it once for
  // its effects (with `replay` on). Exact: the same cycles and counters as simulating
  // (Replay::check verifies every one). The environment variable NPUSIM_REPLAY_TRANSLATED
  // (on|off) overrides it; NPUSIM_REPLAY=off turns it off too.
  bool replay_translated = true;
  // With replay_translated: a launch whose tensors lie at other offsets in their blocks (or in
  // blocks of other sizes) than the recording's is also replayed by translation, when the
  // launch can evict no L2 line and its arguments keep their offsets modulo the L2 line and
  // which lines they share (relocated_writes, sim/replay/launch_replay.h). Exact, as
  // translation is. The environment variable NPUSIM_REPLAY_RELOCATE (on|off) overrides it.
  bool replay_relocate = true;
  // Host threads a replayed launch's cores run on; 0: the host's hardware threads (at most 8).
  // NPUSIM_REPLAY_THREADS overrides it.
  int replay_threads = 0;
  // Recorded launches kept for replay, at most this many keys and about this much host memory
  // (least recently used dropped first). A training step at new addresses adds a key per
  // launch (most of them aliases of a recording: a key each, no copy), and ResNet-50 trains with
  // ~7,500 launches a step: the keys must hold more than a step, or the next step finds the
  // recordings it would replay gone.
  size_t replay_memo_launches = 65536;
  uint64_t replay_memo_bytes = uint64_t(1) << 30;
  // A launch being recorded for replay holds its cores' effect order and GM ranges in host
  // memory (a few bytes per pipe instruction). Past this many bytes the recording is dropped
  // and the launch runs on unrecorded (it will not be replayed), so a long or endless launch
  // holds bounded memory. A quarter of replay_memo_bytes: a larger recording would push most
  // others out of the memo.
  uint64_t replay_record_max_bytes = uint64_t(1) << 28;
  // If set, every launch appends one line to this file: kernel name, block_dim, cycles (0 for a
  // launch that failed), isa::program_digest in hex, and counter_digest() of the launch's
  // counters in hex, tab-separated. Comparing two such logs (benchmarks/compare_launch_logs.py)
  // shows whether a change moved any kernel's code, timing or counters. The environment
  // variable NPUSIM_LAUNCH_LOG sets it.
  std::string launch_log;
  // If set, every launch appends one line to this file: kernel name, block_dim, cycles (0 for a
  // launch that failed), the simulation thread's CPU microseconds from the launch's start to
  // its log line (a replay's worker threads not counted), whether it was replayed or
  // simulated, and how or why (tab-separated): a replay by its own key, by translation,
  // relocated or after a check; a simulated launch the reason no recording timed it (the first
  // of its program, untyped arguments and block count; the condition the latest recording at
  // another layout failed, e.g. an L2 eviction possible; an address flow the analysis does not
  // follow; an observer), then what its own recording gives later launches. The environment
  // variable NPUSIM_REPLAY_LOG sets it.
  std::string replay_log;
};

// `o` with the environment's overrides applied (NPUSIM_REPLAY, NPUSIM_REPLAY_TRANSLATED,
// NPUSIM_REPLAY_RELOCATE, NPUSIM_REPLAY_THREADS, NPUSIM_LAUNCH_LOG, NPUSIM_REPLAY_LOG); throws
// ConfigError for a malformed value. Simulator and SystemSimulator
// apply it to the options they are given.
SimOptions with_environment(SimOptions o);

// A digest of a launch's counters: every (counter name, reported value) pair of `delta`,
// independent of the order in which the counters were registered, so two runs that count
// alike give the same digest (for SimOptions::launch_log).
uint64_t counter_digest(const CounterDelta& delta);

// The watchdog's instruction budget per block for a launch of `program` with `args`:
// opts.max_insns_per_block x max(1, ceil(data / SimOptions::kWatchdogDataBytes)), where data is
// launch_data_bytes(); 0 (no watchdog) if opts.max_insns_per_block is 0. Saturates at
// UINT64_MAX.
uint64_t watchdog_budget(const SimOptions& opts, const isa::Program& program,
                         const std::vector<uint64_t>& args);
// The bytes of the launch's typed arguments (isa::ArgInfo: dtype size x the product of the
// dims, a named dim taking that argument's value); untyped arguments count 0. Saturates.
uint64_t launch_data_bytes(const isa::Program& program, const std::vector<uint64_t>& args);

struct KernelLaunch {
  const isa::Program* program = nullptr;
  std::vector<uint64_t> args;  // read by ldarg i (GM addresses or scalar parameters)
  int block_dim = 1;           // number of blocks; block i sees get_block_id == i
  // Build KernelResult::counters (the JSON tree). false: it stays null and only
  // KernelResult::counter_delta is filled (what a caller that keeps many launches wants: the
  // tree of a 72-core chip costs more than a small launch's simulation).
  bool counter_tree = true;
  // The device's allocations (the runtime's allocator; an offline model's two regions,
  // graph::OfflineRunner): with a cold L2 the launch's lines are filed by allocation, so its L2
  // outcome does not depend on where its buffers were placed (sim/chip/l2_placement.h). Empty:
  // lines are filed at their device addresses.
  GmBlockLookup gm_blocks;
  // Buffers a static memory plan placed inside one allocation (a TF graph's arena: device
  // address ranges [start, start + bytes), pairwise disjoint, any order). With a cold L2 at the
  // launch its lines in them are filed by buffer rather than by the whole allocation, so its L2
  // outcome does not depend on where the plan put them either (MemorySystem::select_l2 decides;
  // a buffer not starting on an L2 line is filed with its allocation). Ignored with a kept L2
  // (a graph run's, or across launches). Empty: by allocation.
  PlannedBlocks planned_blocks;
  // Nonzero: the launch belongs to one run of a graph (a TF graph's task list, an offline
  // model's run), every launch of the run carrying the same value, unique to the run, and the
  // run issuing the same launches in the same order every time. With
  // memory.l2.keep_within_graph_run the run's launches share one L2, cold at its first launch
  // (MemorySystem::select_l2). 0: no run.
  uint64_t l2_run = 0;
};

struct KernelResult {
  bool ok = false;
  // Carried out as a replay of an identical earlier launch (SimOptions::replay): same cycles
  // and counters as simulating it, without simulating time again.
  bool replayed = false;
  std::string error;            // on failure: "core <name> pc <n> (<file:line>): <insn>: <what>"
  uint64_t start_cycle = 0;     // simulated cycle the launch began
  uint64_t cycles = 0;          // simulated duration in AI-core cycles
  double time_us = 0;           // the same in microseconds at the configured clock
  // Counter tree of this launch (see Simulator::counters) with only the counters that changed:
  // a counter missing from it is 0 (cores that ran no block, idle units, absent stall causes).
  // Built only if KernelLaunch::counter_tree; counter_delta.tree() gives the same tree.
  nlohmann::json counters;
  CounterDelta counter_delta;  // the same counters, flat
};

// One launch of a concurrent group (Simulator::run_concurrent), the cores it may use and the
// launches it waits for.
struct ConcurrentLaunch {
  KernelLaunch launch;
  // The cores the launch may use, by name ("aic0", "aiv3"; "aicore5" on a coupled chip): its
  // blocks run on these only (its workers are built from them as a lone launch's are from all
  // the chip's cores), as a CANN stream's task runs on the cores it was given. Two launches may
  // share a core only if one waits for the other (`after`, directly or through others): a
  // stream's launches reuse its cores one after another. Empty: of each core kind its program
  // runs on, the first cores in chip order that no launch of the group names and no earlier
  // launch took that this one may overlap (one it does not wait for), as many as block_dim (a
  // mix kernel: block_dim groups of a free cube core and its mix_aiv_per_block vector cores), at
  // least one; fixed before the group runs. Launches that take their cores when ready
  // (take_cores_when_ready) are not among those: they name none and take none before.
  std::vector<std::string> cores;
  // The launches this one waits for, by index in the group; each must be an earlier one's
  // (which also rules out cycles). Empty: it begins at the group's start. Otherwise it begins
  // when the last of them has ended (its end_time: blocks, completion overhead, write-backs),
  // as a CANN stream's task waits for the events recorded after other tasks; if one of them
  // failed it does not run.
  std::vector<size_t> after;
  // true (cores must be empty): the launch takes its cores as they free, as Ascend's task
  // scheduler dispatches a task's blocks (docs/chip_model.md "Concurrent launches"). Once it is
  // ready (each launch of `after` has ended) it begins as soon as one worker is free (a core of
  // the kind its program runs on; mix: a cube core with its mix_aiv_per_block vector cores),
  // taking the free workers first in chip order, one per block. A worker that finishes a block
  // takes the launch's next block (after the block start overhead); one with no block left goes
  // back to the chip at once (not at the launch's end: the completion overhead holds no core).
  // Workers that go back are served to the launches that are ready and have blocks no worker
  // holds, in index order (the order the streams' tasks were issued), each taking one per such
  // block; so a launch's blocks run in waves, on as many workers as it gets, and block_dim may
  // exceed the chip's workers. Deterministic: the same group gives the same cycles and
  // counters. Its cores come only from those no launch with fixed cores (named or taken before
  // the run) uses: those launches hold theirs for the whole group; a launch with no worker
  // among the others is refused before anything runs (npusim::Error naming the launch), as are
  // names in `cores`. It always gets a worker: the cores it may take are held only by launches
  // that began, which wait for nothing and free them; one that failed keeps the cores it held
  // to the group's end, and a launch that finds no other does not run (its error names the
  // failed ones). start_cycle: when it began (took its first workers); counters: see
  // ConcurrentResult.
  bool take_cores_when_ready = false;
};

// What run_concurrent gives back.
struct ConcurrentResult {
  // Each launch's result, in the order given. start_cycle is its own start (the group's start
  // for a launch that waits for none, unless it waited for cores: take_cores_when_ready);
  // cycles its own duration (from its start to its end: Chip::end_time; 0 for a launch that
  // did not run). counter_delta / counters hold only the
  // counters of the launch's own cores (names "chip.<core>."): what its blocks did (on cores
  // it shares with ordered launches, a stream's, their growth from its start to its end; a
  // high-water counter there gives the group's maximum). A launch that takes its cores when
  // ready counts each core it ran blocks on from when it took that core to when it gave it
  // back, so a core that ran blocks of several such launches counts each launch's blocks in
  // that launch's counters only (their sum is the group's, high-water counters aside).
  std::vector<KernelResult> launches;
  uint64_t start_cycle = 0;
  uint64_t cycles = 0;  // makespan: from the start to the last launch's end
  double time_us = 0;
  // Every counter that moved while the group ran, the launches' cores and the chip-level ones
  // (chip.memory.*: L2, HBM; chip.total_cycles, task overheads): the memory system is shared,
  // so its counters are the group's, not split by launch.
  CounterDelta counters;
};

struct HdcResult {
  uint64_t start_cycle = 0;
  uint64_t cycles = 0;
  double time_us = 0;
};

class Simulator {
 public:
  Simulator(const ChipConfig& cfg, const SimOptions& opts);
  ~Simulator();
  Simulator(const Simulator&) = delete;
  Simulator& operator=(const Simulator&) = delete;

  const ChipConfig& config() const;
  DeviceMemory& gm();

  // Runs one kernel to completion (or to its first fault or deadlock) and returns its timing
  // and counters. Never throws for faults inside the kernel: they come back in KernelResult.
  // Throws npusim::Error only for a malformed launch (no program, no section for this chip).
  KernelResult run(const KernelLaunch& launch);

  // Runs several launches at once on one chip, those that wait for no other (ConcurrentLaunch::
  // after) starting now on one clock edge, the others when the launches they wait for have
  // ended, each on its own cores (ConcurrentLaunch::cores, shared only between ordered
  // launches, or taken when it is ready: take_cores_when_ready) with its own task scheduler
  // state (blocks, workers, dispatch / block start / completion overheads as if alone), until every
  // one has finished, faulted, deadlocked or not run (a launch it waits for failed: its error names
  // that one). The L2 and HBM are shared: the launches' transfers share their bandwidth, and the
  // group starts with the L2 select_l2 chooses for its first launch (l2_run, gm_blocks,
  // planned_blocks; every launch must have the same l2_run); where the chip starts every launch
  // cold (that L2 not carried over), each launch sees it empty at its own start, as in order
  // (MemorySystem::begin_launch_view: lines filled since, by it and the launches beside it, it
  // sees). Its members are never replayed one by one. In a timing-only simulator a group with a
  // cold L2, none of whose members has an ld that may steer it, is recorded as a whole, and the
  // same group again (every member's program, arguments, block extents, after and cores:
  // sim/replay/group_replay.h) gets the recorded results (KernelResult::replayed) without
  // simulating: a key lookup, no walk, so on where the translated replay is (replay on, or
  // replay_translated; NPUSIM_REPLAY=off turns both off and simulates every group); check
  // replays, then simulates it and throws npusim::Error at a difference. A fault or deadlock in
  // one launch is that launch's error: its cores and transfers are aborted there and the other
  // launches run on to their end and report normally. Throws npusim::Error naming the launch (its
  // index and kernel) for a malformed group: no program, an unknown core name, more cores than the
  // chip has, a core in two launches neither of which waits for the other (both named), an `after`
  // index that is not an earlier launch's, no core the program can run on, different l2_run values,
  // a launch that takes its cores when ready and names cores or has no worker it may take
  // (ConcurrentLaunch::take_cores_when_ready); nothing runs then. The launch log
  // (SimOptions::launch_log) gets a line per launch in the order given. Attached observers see
  // the launches interleaved (docs/chip_model.md "Concurrent launches": the trace and the
  // profiler are written for one launch at a time).
  ConcurrentResult run_concurrent(const std::vector<ConcurrentLaunch>& launches);

  // Host <-> device copy over the HDC link model. Functional: copies the bytes.
  HdcResult copy_host_to_device(uint64_t dev_addr, const void* src, uint64_t bytes);
  HdcResult copy_device_to_host(void* dst, uint64_t dev_addr, uint64_t bytes);

  // Counters accumulated since construction (or reset_counters()): a JSON tree named after the
  // module hierarchy; each leaf is {"value": v, "unit": "...", "desc": "..."}.
  nlohmann::json counters() const;
  void reset_counters();
  // Chrome-trace JSON ({"traceEvents": [...]}) of everything run since construction.
  nlohmann::json trace() const;
  uint64_t now_cycles() const;

  // Attaches an observer of the chip (sim/counters/observer.h), e.g. a profiler, between
  // launches: it is told about every core (on_core) at once, then sees every later launch,
  // instruction, flow and HDC copy. The caller keeps ownership; the observer must stay alive
  // until it is removed or the Simulator is destroyed. Attaching one twice is a no-op. With no
  // observer attached the model does no observer work.
  void add_observer(ChipObserver* observer);
  // Detaches it (a no-op if it is not attached).
  void remove_observer(ChipObserver* observer);

 private:
  KernelResult run_launch(const KernelLaunch& launch);
  struct Impl;
  std::unique_ptr<Impl> m_impl;
};

}  // namespace npusim
