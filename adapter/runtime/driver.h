// The driver thread: the only thread that touches the Simulator, or the SystemSimulator of a
// device opened on a system of chips (SystemC is single-threaded and elaborates once per
// process). With a system, one driver serves the devices of all its chips: every stream belongs
// to one chip, and operations of all chips run one at a time on the one simulation; each chip
// has its own device timeline (below), so kernels of different chips overlap in simulated time
// (copies between chips and collectives move over the modelled links). Host threads hand it work
// through queues guarded by one mutex:
//   - tasks: short jobs on the simulator state (scrub freed memory, read counters), run at the
//     next operation boundary, before any stream operation;
//   - streams: in-order queues of DeviceOps. Among streams whose head operation is ready the
//     driver serves them round-robin in id order (the first ready stream after the one served
//     last), so the choice depends only on the queue contents. A head is ready unless it is a
//     wait_event whose record has not run, a barrier with an earlier op of its chip still
//     queued, or a collective part whose group is not complete at the heads of its streams.
// One operation runs at a time, to completion; a failed one sets its stream's error and the
// driver carries on (later operations of that stream still run).
//
// Device timelines (docs/runtime.md, "Simulated time"): every chip has its own, in AI-core
// cycles. An operation of chip c starts at the later of chip c's timeline and its stream's ready
// time (the end of the stream's previous operation, raised by the records it waited for), plus
// the host dispatch of a labelled launch; it lasts what the simulation's clock advanced while it
// ran (or the runtime's own model, for d2d copies and memsets) and moves chip c's timeline to its
// end. A peer copy is the source chip's operation (the destination's readers wait for an
// event recorded after it). A collective runs on its ranks' communication timelines (HCCL's
// stream, one per chip), not their compute timelines: it starts at the latest of every rank's
// communication timeline, stream and the readiness of the input it sends (when the operation
// that last wrote those bytes ended, from the device memory's write epochs), and moves only the
// communication timelines; an operation reading its output waits for its end (see "Data
// readiness" at m_written). An AI CPU task (stream.h, AiCpuTask) runs likewise on its chip's AI
// CPU timeline: it starts at the latest of that timeline, its stream's ready time, the host clock
// and what it reads, moves only the AI CPU timeline, and its outputs are pending for their
// readers until its end (m_ai_cpu_outputs; on a single chip too). The chips share nothing but
// the links, so placing each operation, simulated alone, on its chip's timeline is exact for
// kernels and host copies. With one chip the timeline is the simulator's clock plus the time the
// runtime models itself, as before timelines existed.
//
// The host clock (systems only; docs/runtime.md, "The host clock"): the chips' timelines are
// tied together by what the host waits for. The host's time is the latest device time it has
// observed:
//   - blocking: the end of what a synchronize_stream, synchronize_all, synchronize_event or a
//     synchronous op (submit_sync) waited for (the host thread stood still until then), unless
//     the wait is the emulator's own (synchronize_stream's host_waits);
//   - asynchronous (query_event or query_stream finding the work complete, a host callback
//     running): the end of the latest device-to-host copy the observed work includes, i.e. a
//     result read back (StreamState::read_cycle). Only read-backs: TensorFlow polls events and
//     runs callbacks for every copy and asynchronous kernel, and one that merely completes
//     tells the host nothing it acts on; its executor threads queue independent ops in their
//     own order, which must not move simulated time.
// Every op is stamped with the host clock when it is queued (DeviceOp::host_cycle) and starts no
// earlier on its chip: a kernel the host queues on chip 1 after reading a result of chip 0
// starts after that read ended on chip 0's timeline. With one chip nothing is stamped (the host
// never observes a time past the chip's timeline).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "adapter/runtime/status.h"
#include "adapter/runtime/stream.h"
#include "sim/config/chip_config.h"
#include "sim/config/system_config.h"
#include "sim/simulator.h"
#include "sim/system/system_simulator.h"

namespace npusim::rt {

class Driver {
 public:
  // Starts the driver thread, which elaborates the chip; returns once the Simulator is built
  // (or failed: the status says why and the thread has ended).
  Driver(const ChipConfig& cfg, const SimOptions& opts, bool record_launches);
  // The same for a system of chips: the thread elaborates a SystemSimulator (every SimOptions
  // applies to each chip as to a single one: replay shared by the chips, trace, launch log).
  Driver(const SystemConfig& cfg, const SimOptions& opts, bool record_launches);
  // Runs every queued operation that can still run, then ends the thread (which destroys the
  // Simulator). Must not run on the driver thread (i.e. not from a host callback).
  ~Driver();
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  const Status& start_status() const { return m_start_status; }
  bool on_driver_thread() const { return std::this_thread::get_id() == m_driver_id; }

  int chips() const { return m_chips; }  // 1 for a single chip

  Status create_stream(Stream* out, int chip = 0);
  Status destroy_stream(Stream s);  // queued operations still run; the id becomes invalid
  // Queues op on s and returns at once (record/wait events get their generation here).
  Status submit(Stream s, DeviceOp op);
  // Queues op as a barrier on the driver's internal stream and waits for it: it runs after
  // every op submitted before it on any stream. Returns the op's own status.
  Status submit_sync(DeviceOp op);
  // Runs fn on the driver thread at the next operation boundary and waits for it (runs it
  // directly when called on the driver thread). fn may use the accessors below.
  Status run_task(const std::function<Status()>& fn);
  // Driver thread only: the simulation (exactly one of the two is non-null) and a chip's memory.
  Simulator* simulator() { return m_sim.get(); }
  SystemSimulator* system() { return m_sys.get(); }
  DeviceMemory& gm(int chip);

  // Waits for the ops queued on s before the call; returns the stream's error and clears it.
  // host_waits: the program's host waits (the host clock learns the end of what it waited
  // for); false: a wait of the emulator's own that the program would not make (the TF
  // plugin's kernels wait for their launches before Compute returns, where a real device's
  // kernels return at once), which the host clock counts as an asynchronous observation.
  Status synchronize_stream(Stream s, bool host_waits = true);
  Status query_stream(Stream s, bool* idle);
  Status stream_error(Stream s);  // the pending error, not cleared
  // Waits for the ops queued on every stream of `chip` before the call; returns (and clears) the
  // errors of those streams, combined into one status (code of the lowest stream id's error).
  Status synchronize_all(int chip = 0);

  Status create_event(Event* out);
  Status destroy_event(Event e);
  Status query_event(Event e, bool* complete);
  Status synchronize_event(Event e);
  Status elapsed_us(Event start, Event end, double* us);

  // The records of one chip's launches and copies (a peer copy counts for its source chip).
  std::vector<LaunchRecord> launch_records(int chip = 0) const;
  std::vector<CopyRecord> copy_records(int chip = 0) const;
  std::vector<CollectiveRecord> collective_records() const;
  std::vector<AiCpuRecord> ai_cpu_records(int chip = 0) const;
  // Of every chip, and the copy, collective and AI CPU records.
  void clear_launch_records();

  // Driver thread only: chip `chip`'s device (compute) timeline now, AI-core cycles.
  uint64_t device_cycles(int chip = 0) const;
  // Driver thread only: chip `chip`'s communication timeline (the end of its latest collective;
  // 0 if it ran none), AI-core cycles.
  uint64_t comm_cycles(int chip = 0) const;
  // Driver thread only: the end of chip `chip`'s latest copy timed by its data (below; 0 if
  // none), AI-core cycles.
  uint64_t copy_cycles(int chip = 0) const;
  // Driver thread only: chip `chip`'s AI CPU timeline (the end of its latest AI CPU task; 0 if it
  // ran none), AI-core cycles.
  uint64_t ai_cpu_cycles(int chip = 0) const;
  // The host clock (above) now, AI-core cycles; 0 on a single chip.
  uint64_t host_cycles() const;

 private:
  struct StreamState {
    int chip = 0;
    std::deque<DeviceOp> queue;
    uint64_t submitted = 0, completed = 0;  // ops ever queued / finished
    bool executing = false;
    bool destroyed = false;
    // Driver thread (set in finish_locked): when the stream's next op may start on its chip's
    // timeline, AI-core cycles. Unused for the internal stream 0, whose ops belong to any chip.
    uint64_t ready_cycle = 0;
    // Host threads in synchronize_stream / synchronize_all waiting for the stream's op number
    // `completed` (key) to finish: its ready_cycle and read_cycle then (filled in by
    // finish_locked) and the number of waiters. The host clock learns exactly the end of what
    // it waited for, not that of ops queued meanwhile by other threads.
    struct SyncTarget {
      uint64_t ready = 0, read = 0;
      int waiters = 0;
    };
    std::map<uint64_t, SyncTarget> sync_targets;
    // Driver thread (set in finish_locked): the end of the latest memcpy_d2h the stream ran,
    // AI-core cycles (what an asynchronous observation of the stream tells the host clock).
    uint64_t read_cycle = 0;
    // Driver thread: the stream's latest op that took time was a copy timed by its data (a
    // record then stamps that copy's end, not the chip's compute timeline).
    bool after_data_timed_copy = false;
    Status error;                   // first unreported failure
    uint64_t more_errors = 0;       // failures after it, before it was reported
  };
  struct EventState {
    uint64_t recorded = 0;   // records queued (generation of the latest)
    uint64_t completed = 0;  // generation of the latest record that ran
    uint64_t cycle = 0;      // where that record ran on its chip's timeline
    uint64_t read_cycle = 0; // its stream's read_cycle then (the read-backs it follows)
    bool destroyed = false;
  };
  struct Task {
    std::function<Status()> fn;
    std::shared_ptr<OpCompletion> completion;
  };

  // Starts the thread, which builds the simulation with `build` (throwing on failure).
  void start(std::function<void()> build, const std::string& what);
  void thread_main(const std::function<void()>& build, const std::string& what);
  void loop();
  StreamState* pick_ready_locked(uint64_t* id);
  bool head_ready_locked(uint64_t id, const StreamState& s) const;
  // A collective part is ready once every rank's part is queued and at the head of its stream
  // (or the group has run, or failed when a part was queued).
  bool collective_ready_locked(const DeviceOp& op) const;
  // Runs op (driver thread, no lock held). *ready: in, when op's stream is ready on its chip's
  // timeline (StreamState::ready_cycle); out, when the stream's next op may start (op's end).
  // *event_cycle receives the time of a record_event.
  Status execute(uint64_t stream, DeviceOp& op, uint64_t* ready, uint64_t* event_cycle);
  Status run_launch(uint64_t stream, const DeviceOp& op, uint64_t* ready);
  // A launch_group (DeviceOp::members): on a single chip one Simulator::run_concurrent, each
  // member beginning when its group_after have ended and it has taken its cores
  // (take_cores_when_ready); the group placed on the timeline as one op after the members' host
  // dispatches (their sum) and the readiness of what they read; each member's record starts at
  // its own start and lasts its own cycles. On a chip of a system the members run one after
  // another as launches. Returns the first failed member's status (naming its node, as
  // run_launch does).
  Status run_launch_group(uint64_t stream, const DeviceOp& op, uint64_t* ready);
  // The simulator's description of a launch op.
  static KernelLaunch kernel_launch(const DeviceOp& op);
  // Where an op placed on the timelines ran: its start on them and the simulation's clock when
  // it began, so that a cycle of the simulation's clock during the op maps onto the timeline.
  struct Placement {
    uint64_t start = 0, sim_start = 0;
    uint64_t write_epoch = 0;  // the epoch the op's writes stamp on its first chip (begin_writes)
    uint64_t at(uint64_t sim_cycle) const { return start + (sim_cycle - sim_start); }
  };
  // Counts and records launch `op` (placed at p, its result r) and returns its status: ok, or
  // kernel_fault naming the kernel (and its node, for a graph's launch).
  Status finish_launch(uint64_t stream, const DeviceOp& op, KernelResult r, const Placement& p,
                       double wall_us, uint64_t host_dispatch, uint64_t reads_collective);
  // Runs `run` (which advances the simulation's clock, or not) as an op of `chips`, whose
  // streams are ready at `ready`, after `idle` cycles of host time: it starts at the latest of
  // the chips' timelines and `ready`, plus idle, and every chip's timeline moves to its end (its
  // start plus the simulation's advance plus `modelled`, the cycles the runtime models itself).
  // `data_ready`: when what the op reads is ready (a collective's output, comm_output_ready);
  // the op starts no earlier, but its host dispatch (`idle`) overlaps the wait.
  Placement place(const std::vector<int>& chips, uint64_t ready, uint64_t idle,
                  uint64_t modelled, const std::function<void()>& run, uint64_t data_ready = 0);
  // Runs `run` (a collective: run_collective) on the communication timelines of call.chips:
  // it starts at the latest of `ready`, those timelines and the readiness of the ranks' send
  // buffers; moves those timelines to its end, which it returns, and leaves the receive buffers
  // pending for their readers until then (comm_output_ready). *p: where it ran.
  // `id`: the collective's CollectiveRecord::id (its outputs carry it for their readers);
  // *input_launch: per rank, input_launch() of the bytes it sends (-1: sends none).
  uint64_t place_collective(const CollectiveCall& call, uint64_t id, uint64_t ready, Placement* p,
                            const std::function<void()>& run,
                            std::vector<int64_t>* input_launch);
  // Copies timed by their data (DeviceOp::timed_by_data, systems only): a copy engine's transfer,
  // beside the chip's compute. Runs `run` (the copy) starting at the later of when the bytes
  // `op` reads were written (input_ready, comm_output_ready) and the host clock when it was
  // queued (a read-back the host asks for after observing a time does not start before it):
  // not at its stream's ready time (the framework's wait for a whole stream, which depends on
  // how far the host had queued), nor at a timeline of its chip, which it leaves alone.
  // Copies of a chip do not queue behind each other (an engine per copy: optimistic where a
  // chip's copies overlap). A peer copy's destination bytes are ready at its end (write epochs).
  // An h2d copy reads the host's bytes, ready when it was queued: it starts at its host clock,
  // and its destination bytes are pending until its end for the chip's kernels too (kept with
  // the collectives' outputs, comm_output_ready): the kernel reading an input TensorFlow copied
  // in starts after the copy, not where the copy stream's wait put it among the kernels.
  // Returns where it ran; *end: its end, which also raises copy_cycles(op.chip).
  Placement place_by_data(const DeviceOp& op, const std::function<void()>& run, uint64_t* end);
  uint64_t sim_cycles() const;  // the simulation's clock
  // On a system, lets the rest of the current AI-core cycle pass (sc_driver::
  // start_on_clock_edge). place() and place_collective() call it before an op's start and after
  // its end are read off the simulation's clock: every op then starts on a clock edge and spans
  // ceil(its duration) cycles of its timeline, the cycles its record gives, whatever the phase
  // at which the simulation reached it. (Without it an op's span took the floor of its end and
  // the rest of the cycle the op before had left: a cycle more or less depending on the order
  // in which TensorFlow issued the chips' independent ops, and a record one cycle past the next
  // op's start, which the reports cut, at places that moved with that order.) A single chip's
  // timeline is left as it was.
  void align_simulation();
  // The chip model's host link and kernel runs, on the Simulator or on chip `chip` of the system.
  KernelResult run_on_chip(int chip, const KernelLaunch& launch);
  HdcResult hdc_copy(const DeviceOp& op);
  Status run_peer_copy(uint64_t stream, const DeviceOp& op, uint64_t* ready);
  Status run_collective_part(uint64_t stream, const DeviceOp& op, uint64_t* ready);
  // An AI CPU task (OpKind::ai_cpu_task), its stream ready at `ready`, which it leaves alone.
  Status run_ai_cpu_task(uint64_t stream, const DeviceOp& op, uint64_t ready);
  // The host dispatch `op` pays before it runs (LaunchLabel::host_dispatch), cycles: once per
  // dispatch value (among the latest kRecentDispatches); marks its dispatch value as paid.
  uint64_t take_host_dispatch(const DeviceOp& op);
  // A launch with a DerivedSource: left out or run (stream.h, DerivedState).
  Status run_derived_launch(uint64_t stream, const DeviceOp& op, uint64_t* ready);
  // Keeps a CopyRecord of a copy or fill of `bytes` over [start_cycle, +cycles) (if recording).
  void record_copy(uint64_t stream, const DeviceOp& op, uint64_t start_cycle, uint64_t cycles);
  // A d2d copy or fill the runtime times itself: places it on its chip's timeline, records it.
  void add_modelled_time(uint64_t stream, const DeviceOp& op, uint64_t cycles, uint64_t* ready);
  void finish_locked(uint64_t stream_id, StreamState& s, const DeviceOp& op, Status st,
                     uint64_t ready, uint64_t event_cycle);
  Status find_stream_locked(Stream s, const char* what, StreamState** out);
  // Enters a collective part into its group (rank, chip, buffers, stream); a bad part also
  // fails the group, so the parts already queued complete with the error.
  Status join_collective_locked(uint64_t stream, const DeviceOp& op);
  Status find_event_locked(Event e, const char* what, EventState** out);
  Status take_error_locked(uint64_t id, StreamState& s);
  // The host has observed device time `cycle` (systems only): the host clock moves to it.
  void observe_locked(uint64_t cycle);
  // Waits (lock held, released while waiting) until each of `targets` (stream id -> op count)
  // has completed that many ops, then observes where each stream stood after its target op
  // (host_waits) or the read-backs up to it (not).
  void wait_streams_locked(std::unique_lock<std::mutex>& lock,
                           const std::map<uint64_t, uint64_t>& targets, bool host_waits);
  Status not_on_driver_thread(const char* what) const;

  const bool m_record_launches;
  std::unique_ptr<Simulator> m_sim;        // driver thread only; null with a system
  std::unique_ptr<SystemSimulator> m_sys;  // driver thread only; null with a single chip
  int m_chips = 1;
  const ChipConfig* m_cfg = nullptr; // the simulator's copy (every chip's, with a system)
  bool m_functional = true;
  // Driver thread only: every chip's device timeline, AI-core cycles (see above).
  std::vector<uint64_t> m_timeline;
  // Driver thread only: every chip's communication (HCCL stream) timeline, AI-core cycles.
  std::vector<uint64_t> m_comm_timeline;
  // Driver thread only: every chip's latest end of a copy timed by its data, AI-core cycles.
  std::vector<uint64_t> m_copy_end;

  // Data readiness (systems only; nothing of it runs on a single chip). A collective starts
  // when the bytes it sends are ready, not when its chips are idle, so the driver keeps, per
  // chip, when the operations that wrote device memory ended on the timelines:
  //   - every operation that may write chip c's memory (kernels, copies and fills, a peer copy
  //     for its destination chip, a collective for its ranks) advances c's write epoch before
  //     it runs (begin_writes); its writes stamp the new epoch, and end_writes maps that epoch to
  //     the operation's end. The bytes of a range were last written by the operation of the
  //     range's latest epoch (DeviceMemory::last_write_epoch, 256-byte blocks: a neighbouring
  //     write to a shared block can only make a range later, never earlier);
  //   - a collective's outputs are also kept as ranges with their ready cycle (timing-only runs
  //     write no data): a copy reading such a range, or a kernel with an argument inside one,
  //     waits for it while it is pending (the chip's compute timeline has not passed it; until
  //     then an overwritten one is dropped), and a launch reading a part of one not overwritten
  //     since records it (LaunchRecord::reads_collective; passed ones are kept for that, the
  //     latest kCommOutputs). The
  //     runtime does not know which kernel arguments are addresses: a scalar argument that falls
  //     inside a pending output range makes the kernel wait too (conservative).
  struct WrittenBy {
    std::map<uint64_t, uint64_t> end_of;  // write epoch -> end of the op that stamped it
    uint64_t floor = 0;  // the latest end among the entries dropped (at most kWriteEntries kept)
    // Also the destination of an h2d copy timed by its data (collective 0): it runs beside the
    // chip's compute, so its readers wait for it as for a collective's output.
    struct CommOutput {
      uint64_t addr = 0, bytes = 0;
      uint64_t ready = 0;  // the collective's (copy's) end, AI-core cycles
      uint64_t epoch = 0;  // the write epoch of the collective (a later write supersedes it)
      uint64_t collective = 0;  // its CollectiveRecord::id; 0: an h2d copy's destination
    };
    std::vector<CommOutput> comm_outputs;
    // write epoch -> LaunchRecord::index of the launch whose writes stamped it (launches only;
    // at most kWriteEntries kept): which kernel wrote a collective's input.
    std::map<uint64_t, uint64_t> launch_of;
  };
  static constexpr size_t kWriteEntries = 1 << 15;
  static constexpr size_t kCommOutputs = 1 << 12;  // comm_outputs kept once passed
  std::vector<WrittenBy> m_written;
  // The epoch the writes of the op about to run on `chip` stamp (0 on a single chip).
  uint64_t begin_writes(int chip);
  // That op ended at `end`: writes stamped `epoch` on `chip` are ready then.
  void end_writes(int chip, uint64_t epoch, uint64_t end);
  // When [addr, addr + bytes) of chip `chip` was last written, AI-core cycles on the timelines
  // (0: before anything the driver timed; a collective's pending output counts).
  uint64_t input_ready(int chip, uint64_t addr, uint64_t bytes);
  // LaunchRecord::index of the latest launch on `chip` whose write epoch is at or below the
  // range's last write (the kernel that wrote it, or the last one before the copy that did);
  // -1: none known.
  int64_t input_launch(int chip, uint64_t addr, uint64_t bytes) const;
  // When the collective outputs that `op` reads are ready (0 if it reads none): its source
  // range (copies), derived source ranges, or a kernel argument inside a pending output.
  // *collective (if given): the latest CollectiveRecord::id among the outputs it reads that were
  // not overwritten since, pending or not (0: none).
  uint64_t comm_output_ready(const DeviceOp& op, uint64_t* collective = nullptr);
  uint64_t comm_ready(const DeviceOp& op, uint64_t* collective);  // the collectives' part of it
  // AI CPU outputs pending for their readers (single chips and systems): the ranges an AI CPU
  // task wrote and its end. An operation that reads one (comm_output_ready's ranges) starts no
  // earlier while it is pending (chip `chip`'s compute timeline has not passed its end); passed
  // ones are dropped. A later writer of the range waits too (the runtime cannot tell what a
  // kernel writes): the order of the writes is kept.
  struct AiCpuOutput {
    uint64_t addr = 0, bytes = 0;
    uint64_t ready = 0;  // the task's end, AI-core cycles
  };
  std::vector<std::vector<AiCpuOutput>> m_ai_cpu_outputs;  // per chip
  // When the pending AI CPU outputs that [addr, addr + bytes) of chip `chip` overlaps are ready
  // (0: none).
  uint64_t ai_cpu_output_ready(int chip, uint64_t addr, uint64_t bytes);
  // Driver thread only: every chip's AI CPU timeline and AI CPU task count.
  std::vector<uint64_t> m_ai_cpu_timeline, m_ai_cpu_count;
  uint64_t m_collective_count = 0;  // driver thread only: collectives placed (ids)
  // Driver thread only: the latest LaunchLabel::dispatch values that paid their host dispatch
  // (launches of ops on several streams may interleave).
  static constexpr size_t kRecentDispatches = 64;
  std::deque<uint64_t> m_charged_dispatches;
  std::vector<uint64_t> m_launch_count;  // driver thread only: launches per chip

  mutable std::mutex m_mutex;
  std::condition_variable m_work;  // driver waits: new op, task, or stop
  std::condition_variable m_done;  // host threads wait: an op or task finished
  std::map<uint64_t, StreamState> m_streams;  // id -> stream; 0 is the internal sync stream
  std::map<uint64_t, EventState> m_events;
  std::deque<Task> m_tasks;
  std::vector<LaunchRecord> m_records;
  std::vector<CopyRecord> m_copy_records;
  std::vector<CollectiveRecord> m_collective_records;
  std::vector<AiCpuRecord> m_ai_cpu_records;
  uint64_t m_next_stream = 1, m_next_event = 1, m_next_seq = 1;
  uint64_t m_host_cycle = 0;  // the host clock (above), AI-core cycles; stays 0 on one chip
  uint64_t m_last_served = 0;
  bool m_started = false, m_stop = false;
  Status m_start_status;
  std::thread::id m_driver_id;  // set before the constructor returns
  std::thread m_thread;
};

}  // namespace npusim::rt
