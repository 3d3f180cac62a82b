// Streams, events and the operations a stream queues (aclrtStream / aclrtEvent terms). The
// handles are plain ids: a stale or foreign handle is reported as invalid_argument, never
// undefined behaviour. DeviceOp is the runtime's internal description of one queued operation.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "adapter/runtime/status.h"
#include "isa/isa.h"
#include "sim/chip/l2_placement.h"
#include "sim/collective/collective.h"
#include "sim/counters/counters.h"

namespace npusim {
class DeviceMemory;
}

namespace npusim::rt {

// An in-order queue of device operations. Ids start at 1 and are never reused in a process.
struct Stream {
  uint64_t id = 0;
};

// A marker recorded into a stream; complete when every operation queued on that stream before
// the record has run. Ids start at 1 and are never reused.
struct Event {
  uint64_t id = 0;
};

// Runs on the driver thread, in stream order (see device.h for what it may call). A non-ok
// result becomes the stream's error.
using HostCallback = std::function<Status()>;

// A launch whose output is a pure function of source ranges of device memory: the compiler's
// input transforms (e.g. the f16 copy of an f32 weight that a cube op reads; a convolution's
// weights with a batch norm folded in, from the filter, scale and variance). The driver tells,
// from the device memory's write epochs (DeviceMemory::last_write_epoch), whether a source was
// written since the state's last launch; with may_skip it leaves out a launch whose source is
// unchanged, so the output buffer (which the launcher keeps, and nothing else writes) still
// holds the result. This is what CANN's graph engine does for variables read through trans ops
// (Cast, TransData): it keeps the variable in the transformed form until the variable is
// written. Timing-only simulation (no memory contents) never skips.
struct DerivedState {
  // Set by the driver thread, read by launchers (the counts are for the launcher's policy).
  std::atomic<bool> valid{false};      // the last launch succeeded and read the source as of...
  std::atomic<uint64_t> epoch{0};      // ...this write epoch
  std::atomic<uint64_t> unchanged{0};  // launches that found the source unchanged since the last
  std::atomic<uint64_t> skipped{0};    // launches left out (may_skip and unchanged)
};
struct DerivedRange {
  uint64_t addr = 0, bytes = 0;
};
struct DerivedSource {
  uint64_t addr = 0, bytes = 0;        // the source range (inside one live allocation)
  std::shared_ptr<DerivedState> state;
  bool may_skip = false;
  std::vector<DerivedRange> more;      // further source ranges, each inside a live allocation
};

// One tensor of a labelled launch (LaunchLabel), as the launcher names it.
struct LaunchTensor {
  std::vector<int64_t> shape;
  std::string dtype;  // free text; the TF plugin gives msprof names ("DT_FLOAT16", "DT_FLOAT")
};

// What a launch was for, given by the launcher (launch_kernel's `label` overload) and kept in
// its LaunchRecord: the TF plugin gives the TF op's node name and type and its tensors. Several
// launches may share one label (a TF op compiled into several kernels).
struct LaunchLabel {
  std::string op_name;  // e.g. the TF node name "sequential/dense/MatMul"
  std::string op_type;  // e.g. the TF op type "MatMul"
  std::vector<LaunchTensor> inputs, outputs;
  // Nonzero: launches with the same value came from one dispatch of the op (one TF Compute
  // call); 0: unknown.
  uint64_t dispatch = 0;
  // What the host spends dispatching the launch's op, paid on the device timeline before the
  // launch runs, once per `dispatch` value (every launch if it is 0): docs/runtime.md, "Host
  // dispatch". eager_op: the chip's host.op_dispatch_us (an op dispatched on its own); graph:
  // host.graph_dispatch_us (a graph run as one task list: give all its launches one `dispatch`
  // value); none: nothing.
  enum class HostDispatch { eager_op, graph, none };
  HostDispatch host_dispatch = HostDispatch::eager_op;
  // Nonzero: the launch belongs to one run of a graph submitted as one task list (the TF
  // plugin's NpuGraph); every launch of that run carries the same value. Each node of the graph
  // keeps its own `dispatch`, so reports show the nodes as before; the run's first launch pays
  // host_dispatch = graph, the others none. A fault names the node (op_name, op_type).
  uint64_t graph_run = 0;
  // The original nodes a launch computes when its node merged several (the members of a
  // multi-tensor optimizer update, docs/tf_plugin.md "Optimizer updates"): their names, in
  // order (one for a member's launch of its own, several for a multi-tensor launch); op_name
  // is the merged node's, inputs and outputs those members' tensors. Empty otherwise.
  std::vector<std::string> members;
  // The buffers of a static memory plan that the launch's tensors lie in, where the plan puts
  // several buffers in one device block (the TF plugin's NpuGraph arena): each [start, start +
  // bytes), pairwise disjoint. With a cold L2 at the launch the L2 model files its lines by
  // these buffers, as it files the lines of tensors allocated on their own, rather than by the
  // whole block (the driver passes them as KernelLaunch::planned_blocks): the launch's L2
  // outcome then does not depend on where the plan put its buffers in the arena. Empty: by
  // allocation.
  std::vector<std::pair<uint64_t, uint64_t>> planned_blocks;
};

// One kernel launch as the chip ran it; the profiler reads these.
struct LaunchRecord {
  uint64_t index = 0;        // 0-based position among this device's (chip's) launches
  int chip = 0;              // the chip it ran on (0 on a single-chip device)
  std::string kernel;        // isa::Program::name
  uint64_t stream = 0;       // Stream::id it was queued on
  int block_dim = 0;
  uint64_t start_cycle = 0;  // AI-core cycles on the device timeline (device.h, "Simulated time")
  uint64_t cycles = 0;       // duration, AI-core cycles
  double time_us = 0;        // duration at the chip's clock_mhz
  double wall_us = 0;        // host wall time the simulator took to run it (emulation cost)
  bool replayed = false;     // carried out as a replay of an identical launch (KernelResult)
  // Host dispatch paid just before this launch (LaunchLabel::host_dispatch), AI-core cycles:
  // the device timeline idled that long, so it is part of the launch's wait, not its duration.
  uint64_t host_dispatch_cycles = 0;
  bool ok = false;
  std::string error;         // on failure: the simulator's fault or deadlock report
  // Counters of this launch (KernelResult::counter_delta), kept flat; counters() builds the
  // tree (Simulator::counters layout, only the counters that changed).
  CounterDelta counter_delta;
  nlohmann::json counters() const { return counter_delta.tree(); }
  // The simulator's own clock at the start: start_cycle minus the d2d/memset and host-dispatch
  // time the runtime models itself (device.h, "Simulated time"). ChipObservers see this clock
  // (in ps).
  uint64_t sim_start_cycle = 0;
  std::shared_ptr<const isa::Program> program;  // the program launched
  std::shared_ptr<const LaunchLabel> label;      // null unless the launcher gave one
  // CollectiveRecord::id of the latest collective whose output this launch reads (an argument
  // inside one of its receive buffers, not overwritten since), 0: none. The launch started no
  // earlier than that collective's end (Driver, "Data readiness").
  uint64_t reads_collective = 0;
};

enum class OpKind {
  memcpy_h2d,
  memcpy_d2h,
  memcpy_d2d,
  memset8,
  memset32,
  launch,
  record_event,
  wait_event,
  host_callback,
  memcpy_peer,  // a copy to another chip of the system, over the links (SystemSimulator)
  collective,   // one rank's part of a collective over several chips (CollectiveGroup)
  ai_cpu_task,  // a task of the chip's AI CPU (AiCpuTask), on the chip's AI CPU timeline
  launch_group,  // launches at once on disjoint cores (DeviceOp::members, Device::launch_group)
};
const char* op_kind_name(OpKind k);  // "memcpy_h2d", ...

// How an asynchronous copy is placed on a system's timelines (Device::memcpy_d2h_async).
enum class CopyTiming {
  stream,  // at its stream's ready time and its chip's compute timeline, which it occupies
  data,    // a copy engine's transfer: when the bytes it reads were written (DeviceOp::timed_by_data)
};

// One copy or fill as the device ran it (kinds memcpy_h2d, memcpy_d2h, memcpy_d2d, memset8,
// memset32), recorded with the launches (RuntimeOptions::record_launches). Zero-byte ones are
// not recorded.
struct CopyRecord {
  OpKind kind = OpKind::memcpy_h2d;
  uint64_t stream = 0;       // Stream::id, 0 for a synchronous copy
  int chip = 0;              // the chip whose stream ran it (memcpy_peer: the source chip)
  int dst_chip = 0;          // memcpy_peer: the destination chip; else `chip`
  uint64_t bytes = 0;
  uint64_t start_cycle = 0;  // on the device timeline, AI-core cycles
  uint64_t cycles = 0;       // duration: the HDC link's time, or the HBM model of device.h
                             // (memcpy_peer: the links' time, SystemSimulator::copy_peer)
};

// One collective as the chips ran it (run_collective), recorded with the launches
// (RuntimeOptions::record_launches): what the profiler's communication rows read. Plain data.
struct CollectiveRecord {
  uint64_t id = 0;          // 1, 2, ...: the device's collectives in the order they ran
  std::string collective;   // collective_name(): "all_reduce", "broadcast", ...
  std::string algorithm;    // CollectiveResult::algorithm: "mesh", "ring", ...
  std::string op;           // reduce_op_name() for reductions ("sum", ...), else ""
  std::string dtype;        // isa dtype name of the elements ("f32", ...)
  std::string label;        // what the caller named it (the TF node of rank 0), may be empty
  uint64_t count = 0;       // elements per rank buffer (CollectiveCall::count)
  uint64_t bytes = 0;       // bytes of one rank's input buffer (collective_send_bytes)
  uint64_t link_bytes = 0;  // bytes sent over the links, all ranks together
  std::vector<int> chips;   // the communicator: rank r is chips[r]
  // Per rank: LaunchRecord::index (on chips[r]) of the latest launch at or before the last write
  // of the bytes the rank sends (the kernel that wrote them, or the last one before the copy or
  // fill that did); -1: none (nothing written by a launch, or a rank that sends nothing).
  std::vector<int64_t> input_launch;
  uint64_t start_cycle = 0; // on the device timeline, AI-core cycles
  uint64_t end_cycle = 0;   // start_cycle + the collective's cycles
  int steps = 0;
  bool inline_reduce = false;
  uint64_t recv_bytes = 0;     // bytes of one rank's output buffer (collective_recv_bytes)
  uint64_t reduce_cycles = 0;  // of the collective's cycles: vector reduce kernels
  std::vector<CollectiveStep> step_records;  // CollectiveResult::step_records
  // The link directions (Fabric channels) that carried the collective's transfers: each
  // transfer's bytes on every channel of its route.
  struct Link {
    std::string channel;  // "c0->c1", "c0.nic_out", "c1.nic_in"
    double gbps = 0;      // its bandwidth per direction (system config)
    uint64_t bytes = 0;
  };
  std::vector<Link> links;
};

// A task of the chip's AI CPU (an AI CPU kernel, as CANN runs DropOutGenMask on the 910): the
// runtime computes its outputs on the host and times it itself (docs/runtime.md, "The AI CPU
// timeline"). It runs on the chip's AI CPU timeline, beside the AI cores: it starts at the latest
// of its stream's ready time, the AI CPU timeline, the host clock and the readiness of what it
// reads; it moves only the AI CPU timeline, not the chip's compute timeline nor its stream's
// ready time (the stream's next kernel does not wait for it); its outputs are pending until its
// end, and an operation reading them (a kernel argument inside one, a copy from one) starts no
// earlier.
struct AiCpuTask {
  std::string kernel;  // what the record calls it, e.g. "DropOutGenMask"
  // Device memory it reads (their readiness bounds its start) and writes (pending until its
  // end); each range inside one live allocation.
  std::vector<DerivedRange> inputs, outputs;
  uint64_t cycles = 0;  // its duration on the AI CPU, in AI-core cycles (the chip's clock)
  // Computes the outputs from the inputs in the chip's memory, on the driver thread; not called
  // in timing-only runs (no memory contents). A non-ok status becomes the stream's error.
  std::function<Status(DeviceMemory&)> compute;
  std::shared_ptr<const LaunchLabel> label;  // optional, into its AiCpuRecord
};

// One AI CPU task as the chip ran it, recorded with the launches (RuntimeOptions::
// record_launches): the profiler's AI_CPU rows.
struct AiCpuRecord {
  uint64_t index = 0;        // 0-based position among this chip's AI CPU tasks
  int chip = 0;
  std::string kernel;        // AiCpuTask::kernel
  uint64_t stream = 0;       // Stream::id it was queued on
  uint64_t start_cycle = 0;  // on the chip's AI CPU timeline, AI-core cycles
  uint64_t cycles = 0;       // duration, AI-core cycles
  double time_us = 0;        // duration at the chip's clock_mhz
  std::shared_ptr<const LaunchLabel> label;
};

// One collective over several chips' streams, as HCCL runs an op on a communicator: every rank
// queues its part (Device::collective_async) on a stream of its own chip, and the driver runs the
// collective once every part has been queued and reached the head of its stream; then each part
// completes with the collective's status. All parts name the same group object; `call` holds
// kind, op, algo, root and dtype, the driver fills chips, send, recv, count and rank_counts from
// the parts. A group that never gets all its parts holds its streams forever (as an HCCL op
// missing a rank does).
struct CollectiveGroup {
  CollectiveGroup(CollectiveCall c, int ranks, std::string what)
      : call(std::move(c)),
        joined(static_cast<size_t>(ranks), false),
        streams(static_cast<size_t>(ranks), 0),
        label(std::move(what)) {
    call.chips.assign(static_cast<size_t>(ranks), -1);
    call.send.assign(static_cast<size_t>(ranks), 0);
    call.recv.assign(static_cast<size_t>(ranks), 0);
    call.rank_counts.assign(static_cast<size_t>(ranks), 0);
  }
  int ranks() const { return static_cast<int>(joined.size()); }
  CollectiveCall call;
  // Guarded by the driver's mutex.
  std::vector<bool> joined;
  std::vector<uint64_t> streams;  // Stream::id of each rank's part
  int joined_count = 0;
  bool ran = false;  // driver thread: the collective has run; `status` is its outcome
  // The latest host clock among its parts' submissions (DeviceOp::host_cycle): it starts no
  // earlier, on every rank.
  uint64_t host_cycle = 0;
  uint64_t end_cycle = 0;  // once ran: its end on the ranks' communication timelines (cycles)
  Status status;     // a failed join (set when queued) or the collective's outcome
  std::string label;
  // false: a failed collective leaves its parts' streams without error and the caller reads
  // `status` instead (in a host callback queued behind its part: the TF plugin hands it to the
  // op, so the stream's next user does not inherit it).
  bool stream_errors = true;
};

// Where the driver delivers the status of a synchronous op (instead of the stream's error).
struct OpCompletion {
  bool done = false;
  Status status;
  uint64_t end_cycle = 0;  // where the op ended on its chip's timeline, AI-core cycles
};

struct DeviceOp {
  OpKind kind = OpKind::memcpy_h2d;
  uint64_t dst = 0, src = 0;        // device byte addresses (as applicable)
  uint64_t bytes = 0;
  const void* host_src = nullptr;   // memcpy_h2d: must stay valid until the op has run
  void* host_dst = nullptr;         // memcpy_d2h: likewise
  uint32_t pattern = 0;             // memset8 (low byte) / memset32
  std::shared_ptr<const isa::Program> program;  // launch
  std::shared_ptr<const LaunchLabel> label;      // launch: optional, into its LaunchRecord
  std::vector<uint64_t> args;
  int block_dim = 1;
  DerivedSource derived;            // launch: state non-null for a derived launch (launch_derived)
  GmBlockLookup gm_blocks;          // launch: the device's allocations (KernelLaunch::gm_blocks)
  uint64_t event = 0;               // record_event / wait_event: Event::id
  // wait_event: order only. The stream's later ops run (execute) after the record, but their
  // start on the timeline is not raised to it: a collective stream's dependency on its inputs'
  // producers, whose time the driver takes from the inputs' readiness (driver.h).
  bool order_only = false;
  // memcpy_h2d / memcpy_d2h / memcpy_peer on a system of chips: a copy engine's transfer timed
  // by its data (Device::memcpy_d2h_async, CopyTiming::data): it starts when the bytes it reads
  // were written (a host source: when it was queued; no earlier than the host clock then), not
  // where its stream and chip stand, and occupies no compute timeline. record_event: set by the
  // driver when its stream's latest op was such a copy (the record then stamps that copy's end,
  // not the chip's compute timeline).
  bool timed_by_data = false;
  HostCallback callback;
  int chip = 0;                     // the chip whose stream queues it (of the device's system)
  int dst_chip = 0;                 // memcpy_peer: the destination chip (dst is in its memory)
  std::shared_ptr<CollectiveGroup> group;  // collective: the group; `rank` is this part's rank,
  int rank = 0;                            // src/dst its send/recv buffers on its chip and
  uint64_t count = 0;                      // count its element count (CollectiveCall)
  // collective: this rank's buffers in pieces (CollectiveCall::send_pieces); empty: src / dst.
  std::vector<CollectivePiece> send_pieces, recv_pieces;
  std::shared_ptr<const AiCpuTask> ai_cpu;  // ai_cpu_task: the task
  // launch_group: the launches (each kind `launch`, no derived source, this op's chip), run as
  // one Simulator::run_concurrent (Device::launch_group).
  std::vector<DeviceOp> members;
  // A member of a launch_group: the members it waits for (indices into `members`, each
  // earlier). It takes its cores when it is ready (ConcurrentLaunch::take_cores_when_ready).
  std::vector<size_t> group_after;

  // Filled in by the driver at submission.
  uint64_t seq = 0;                 // device-wide submission order
  // The host clock when it was queued (systems only; 0 on a single chip): the op starts no
  // earlier on its chip's timeline (Driver, "The host clock").
  uint64_t host_cycle = 0;
  uint64_t event_generation = 0;    // record: this record's number; wait: the record awaited
  bool barrier = false;             // runs after every op submitted before it, on any stream
  std::shared_ptr<OpCompletion> completion;  // synchronous ops only

  // One line naming the op and its operands, for error messages.
  std::string describe() const;
};

}  // namespace npusim::rt
