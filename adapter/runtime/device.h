// The host runtime's device: an ACL-like API (aclrtSetDevice, aclrtMalloc, aclrtMemcpyAsync,
// aclrtCreateStream, aclrtRecordEvent, ...) over one simulated chip: the process's one chip
// (open), or one chip of a system of chips (open_system: one Device per chip, sharing one
// SystemSimulator and one driver thread; copies between them go over the modelled links and
// collectives run on the chips' collective engine). Every call returns a Status
// and never throws; after any failure (out of memory, a faulting kernel, a bad argument) the
// device stays usable. docs/runtime.md describes the model; this header states the contracts.
//
// Threading. Any number of host threads may call any method at once. Operations queued on one
// stream run in queue order; a single driver thread (driver.h) runs all operations on the
// Simulator, one at a time. Async calls return once the operation is queued; their errors
// surface at the stream's next synchronize_stream (or synchronize_device).
//
// Host callbacks run on the driver thread, in stream order, while no other operation runs. A
// callback may queue work, allocate and free memory, and record events; calls that wait for the
// device (synchronize_*, the synchronous memcpy/memset) return failed_precondition there. The
// last reference to the Device must not be dropped inside a callback.
//
// Simulated time. The device timeline (AI-core cycles) is the simulator's clock plus the
// durations of device-to-device copies and memsets, which the runtime models itself: each is one
// HBM access plus its bytes at the sustained HBM rate, a d2d copy's bytes counted twice (read and
// write): cycles = ceil(hbm_latency_cycles + k * bytes / hbm_sustained_bytes_per_cycle), k = 2
// for d2d, 1 for memset; and the host dispatch of labelled launches (LaunchLabel::host_dispatch,
// the chip's host.op_dispatch_us or host.graph_dispatch_us), during which the device idles
// before the launch. Operations of one chip run one after another, so kernels of different streams
// do not overlap on the chip (concurrent kernels are not modelled yet) and the timeline does not
// advance while the device is idle. Host<->device copies are timed by the simulator's HDC link.
// On a system every chip has its own timeline (driver.h): an operation starts at the later of
// its chip's timeline and what its stream waited for (events of any chip), a peer copy is its
// source chip's operation, a collective holds every rank's chip; records, events and
// device_time_cycles are the chip's.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "adapter/runtime/allocator.h"
#include "adapter/runtime/kernel_cache.h"
#include "adapter/runtime/status.h"
#include "adapter/runtime/stream.h"
#include "isa/isa.h"
#include "sim/config/chip_config.h"
#include "sim/config/system_config.h"
#include "sim/simulator.h"

namespace npusim::rt {

class Driver;

struct RuntimeOptions {
  // free() returns the block's simulated pages to the never-written state (pages wholly inside
  // are released, so freed memory costs no host RAM; the next owner reads zeros). Off: freed
  // bytes keep their contents and pages stay resident until overwritten.
  bool discard_freed_memory = true;
  // Keep a LaunchRecord (with its counter tree) for every launch, and a CopyRecord for every
  // copy and fill, until clear_launch_records().
  bool record_launches = true;
};

class Device {
 public:
  // Device memory handed out starts at this address; [0, kHbmBase) is never allocated, so 0 is
  // never a valid allocation (one DeviceMemory page).
  static constexpr uint64_t kHbmBase = 64 * 1024;

  // Opens the process's device on `cfg` (aclrtSetDevice). SystemC elaborates one chip per
  // process, so the chip config is fixed at the first open: while that device is alive, opening
  // with the same config and options returns the same Device; another config or options, or any
  // open after the device was destroyed, is failed_precondition naming both configs.
  static Status open(const ChipConfig& cfg, const SimOptions& sim_opts,
                     const RuntimeOptions& rt_opts, std::shared_ptr<Device>* out);
  // The same, loading the config with load_chip_config(chip, overrides) (errors:
  // invalid_argument naming the file and key).
  static Status open(const std::string& chip, const std::vector<std::string>& overrides,
                     const SimOptions& sim_opts, const RuntimeOptions& rt_opts,
                     std::shared_ptr<Device>* out);
  // Opens the devices of a system of chips (out[k] is chip k), all on one SystemSimulator
  // elaborated once per process, as open() does for one chip: while they are alive the same
  // system and options return the same devices; anything else (another system, a single-chip
  // device, or any open after they were destroyed) is failed_precondition naming both. The
  // SystemSimulator has no launch replay, observers or trace (add_observer and trace are
  // unsupported; SimOptions::launch_log is not written). Memory, streams and events are per
  // chip; each chip has its own device timeline (device_time_cycles is this chip's), so work
  // of different chips overlaps in simulated time (see "Simulated time" above).
  static Status open_system(const SystemConfig& cfg, const SimOptions& sim_opts,
                            const RuntimeOptions& rt_opts,
                            std::vector<std::shared_ptr<Device>>* out);

  // Drains every queued operation, then stops the driver thread and the chip model.
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const ChipConfig& config() const { return m_cfg; }
  int chip() const { return m_chip; }    // this device's chip in its system (0 for one chip)
  int chips() const;                     // chips in the system (1 for a single-chip device)
  const std::string& chip_identity() const { return m_cache.chip_identity(); }

  // ---- Memory (aclrtMalloc / aclrtFree / aclrtGetMemInfo)
  // A block of at least `bytes` bytes, aligned to max(HbmAllocator::kAlignment = 512, the L2
  // line), so no two blocks share an L2 line.
  Status malloc(uint64_t bytes, uint64_t* dev_addr);
  // Frees a block returned by malloc (0 is a no-op). Synchronous: returns after the block is
  // back in the free list (and its pages discarded, see RuntimeOptions). Operations still queued
  // that use the block must have run first (as with aclrtFree); the runtime does not wait.
  Status free(uint64_t dev_addr);
  AllocatorStats memory_stats() const;
  void reset_memory_peak() { m_allocator->reset_peak(); }
  // Where blocks start and what their sizes round up to: max(512, the L2 line), bytes.
  uint64_t memory_alignment() const { return m_allocator->alignment(); }
  // Host bytes the simulated device memory occupies now (touched pages).
  Status resident_bytes(uint64_t* bytes);

  // ---- Streams and events (aclrtCreateStream, aclrtRecordEvent, aclrtStreamWaitEvent, ...)
  Status create_stream(Stream* out);
  // Queued operations still run; the handle is invalid at once.
  Status destroy_stream(Stream s);
  // Waits until the operations queued on s before the call have run; returns the first failure
  // among them (kernel_fault, ...) and clears it, so the next synchronize is ok.
  Status synchronize_stream(Stream s);
  // The same, for a wait the program itself would not make (an emulator's kernel that waits for
  // its launches before returning, where a real device's returns at once): the host clock
  // (Driver, "The host clock") learns only the read-backs it covers, not where the stream stands.
  Status wait_stream_unobserved(Stream s);
  // idle: every queued operation has run.
  Status query_stream(Stream s, bool* idle);
  // The failure synchronize_stream would return now (not cleared); ok if none.
  Status stream_status(Stream s);
  // Waits for every operation queued on any stream before the call; returns and clears every
  // stream's failure.
  Status synchronize_device();

  Status create_event(Event* out);
  Status destroy_event(Event e);  // a pending record still runs
  // Completes once the operations queued on s before it have run; stamps the device time.
  Status record_event(Event e, Stream s);
  // Operations queued on s after this wait run only after the event's latest record (at the
  // time of this call) has completed. An event never recorded is no dependency.
  Status stream_wait_event(Stream s, Event e);
  // Operations queued on `waiter` after this call run only after those queued on `other` before
  // it (TF's create_stream_dependency): an internal event recorded on other and waited for.
  // order_only: they run after those, but their device time is not raised to their end (a
  // collective stream: a collective starts when its input is ready, driver.h).
  Status stream_wait_stream(Stream waiter, Stream other, bool order_only = false);
  // complete: its latest record has run (true for an event never recorded).
  Status query_event(Event e, bool* complete);
  Status synchronize_event(Event e);  // blocks the calling host thread until query is true
  // Device time between two completed records, microseconds at the chip clock (end - start).
  // failed_precondition if either was never recorded or has not completed.
  Status event_elapsed_us(Event start, Event end, double* us);

  // ---- Copies and fills. Device ranges must lie inside one live allocation; host pointers of
  // async copies must stay valid until the copy has run. h2d/d2h move over the HDC link model;
  // d2d and memset are timed as in "Simulated time" above. Zero bytes is a no-op.
  // CopyTiming::data (h2d, d2h and peer copies on a system of chips; elsewhere as stream): the
  // copy is a copy engine's (DMA) transfer that starts when the bytes it reads were written
  // (their last writer's end: the driver's data readiness; a host source: when the host queued
  // it) and no earlier than the host clock when it was queued, not at its stream's ready time
  // or its chip's compute timeline; it occupies no compute timeline and its stream's next
  // record stamps its end. Its destination bytes are ready at its end: a kernel with an
  // argument inside an h2d copy's destination starts no earlier (driver.h, "Data readiness"). For a framework that orders a copy after the
  // whole stream that produced its source (TensorFlow's copy streams wait for the compute
  // stream), where the copy lands among the chip's kernels would otherwise depend on how far
  // the host had queued when it asked for the copy (docs/runtime.md, "Copies timed by data").
  Status memcpy_h2d_async(Stream s, uint64_t dst, const void* src, uint64_t bytes,
                          CopyTiming timing = CopyTiming::stream);
  Status memcpy_d2h_async(Stream s, void* dst, uint64_t src, uint64_t bytes,
                          CopyTiming timing = CopyTiming::stream);
  Status memcpy_d2d_async(Stream s, uint64_t dst, uint64_t src, uint64_t bytes);  // memmove
  Status memset8_async(Stream s, uint64_t dst, uint8_t value, uint64_t bytes);
  // Fills with a little-endian 32-bit pattern; dst and bytes must be multiples of 4.
  Status memset32_async(Stream s, uint64_t dst, uint32_t pattern, uint64_t bytes);
  // Synchronous forms: run after every operation queued before the call on any stream (like
  // CUDA's legacy default stream), wait for the copy, and return its own status.
  Status memcpy_h2d(uint64_t dst, const void* src, uint64_t bytes);
  Status memcpy_d2h(void* dst, uint64_t src, uint64_t bytes);
  Status memcpy_d2d(uint64_t dst, uint64_t src, uint64_t bytes);
  Status memset8(uint64_t dst, uint8_t value, uint64_t bytes);
  Status memset32(uint64_t dst, uint32_t pattern, uint64_t bytes);
  // Copies to another chip of this device's system over the links (SystemSimulator::copy_peer,
  // timed by the Fabric), queued on s (a stream of this chip); dst lies in dst_device's memory.
  // invalid_argument if dst_device is not a chip of the same system, or a range is not inside
  // one live allocation of its chip. The synchronous form runs as memcpy_d2d's does.
  Status memcpy_peer_async(Stream s, Device& dst_device, uint64_t dst, uint64_t src,
                           uint64_t bytes, CopyTiming timing = CopyTiming::stream);
  Status memcpy_peer(Device& dst_device, uint64_t dst, uint64_t src, uint64_t bytes);

  // ---- Collectives (HCCL: HcclAllReduce, HcclBroadcast, ... on a communicator)
  // Queues rank `rank`'s part of `group` on s (a stream of this chip): send and recv are its
  // buffers (collective_send_bytes / collective_recv_bytes of `count` elements of the group's
  // dtype, each inside one live allocation). The collective runs once every rank's part is
  // queued and has reached the head of its stream (stream.h, CollectiveGroup); each part's
  // stream then carries the collective's status (e.g. ranks of different element counts:
  // invalid_argument naming them). A rank given twice, two ranks on one chip, or a device that
  // is not a chip of a system: invalid_argument now, and the group fails.
  Status collective_async(Stream s, const std::shared_ptr<CollectiveGroup>& group, int rank,
                          uint64_t send, uint64_t recv, uint64_t count);
  // The same with this rank's buffers in pieces (each inside one live allocation), read and
  // written one after the other as one buffer of `count` elements (all_reduce and broadcast:
  // HCCL's fused gradient segment, CollectiveCall::send_pieces).
  Status collective_async(Stream s, const std::shared_ptr<CollectiveGroup>& group, int rank,
                          std::vector<CollectivePiece> send, std::vector<CollectivePiece> recv,
                          uint64_t count);

  // ---- Kernels (aclrtLaunchKernel)
  // Queues one launch. Checked before queueing, each failure invalid_argument naming the kernel:
  // a program, block_dim >= 1, as many args as the program's .arg directives (when it declares
  // any), and isa::verify_or_throw on this chip (once per program object). A fault or deadlock
  // on the chip is kernel_fault at the stream's next synchronize, naming the kernel, the core,
  // pc and instruction.
  Status launch_kernel(Stream s, std::shared_ptr<const isa::Program> program,
                       std::vector<uint64_t> args, int block_dim);
  // The same, with what the launch is for (kept in its LaunchRecord; null: none).
  Status launch_kernel(Stream s, std::shared_ptr<const isa::Program> program,
                       std::vector<uint64_t> args, int block_dim,
                       std::shared_ptr<const LaunchLabel> label);
  // A launch computing a buffer from `source` (stream.h, DerivedState): checked like
  // launch_kernel, and each source range must lie inside one live allocation. When it is left
  // out (no source range written since its last run, may_skip) it runs nothing, takes no simulated time and leaves no LaunchRecord.
  Status launch_derived(Stream s, std::shared_ptr<const isa::Program> program,
                        std::vector<uint64_t> args, int block_dim,
                        std::shared_ptr<const LaunchLabel> label, DerivedSource source);
  // One launch of a group (launch_group).
  struct GroupLaunch {
    std::shared_ptr<const isa::Program> program;
    std::vector<uint64_t> args;
    int block_dim = 1;
    std::shared_ptr<const LaunchLabel> label;  // null: none
    // The launches of the group it waits for (indices, each earlier): it begins when they have
    // ended, as a CANN task waits for the events of tasks on other streams. Empty: at the
    // group's start.
    std::vector<size_t> after;
  };
  // Queues launches that run as one group, as CANN runs a graph's tasks on several streams: on
  // a single chip one Simulator::run_concurrent, each launch beginning when those it waits for
  // (`after`) have ended, the L2 and HBM shared. Cores: each launch takes them when it is ready
  // (Simulator's ConcurrentLaunch::take_cores_when_ready, as a stream's task is given cores as
  // they free): it begins once ready with the free cores of its kernel's kind (a mix kernel:
  // groups of a cube core and its vector cores), the first in core order, one per block, and
  // its blocks run on cores as they free (in waves where block_dim exceeds them); a core goes
  // back when no block is left for it, the ready launches served in group order. The group
  // starts once the stream is ready, after the launches' host dispatches; each LaunchRecord
  // starts at its launch's own start and lasts its own cycles. Never replayed. The caller guarantees that
  // launches that may overlap are independent (no one writes what another reads or writes).
  // Checked as launch_kernel checks each (invalid_argument naming the kernel); a launch for
  // which the idle chip has no worker (CoreTaker::idle_workers: no core of its kind, a mix
  // kernel declaring more vector cores per cube core than the chip has), or an `after` naming
  // no earlier launch, is invalid_argument naming it. block_dim may exceed the workers: the
  // blocks run in waves. A member's fault is kernel_fault at the next synchronize, naming it (and its
  // node, for a graph's launch); the members that wait for it do not run ("did not run"), nor
  // do those that wait for the cores it keeps to the group's end (their error names it); the
  // others run to their end. One launch: launch_kernel. On a chip of a system the launches run
  // one after another.
  Status launch_group(Stream s, std::vector<GroupLaunch> launches);
  // Queues a host callback (aclrtLaunchCallback); see "Host callbacks" above.
  Status launch_callback(Stream s, HostCallback callback);

  // ---- AI CPU (an AI CPU kernel beside the AI cores; stream.h, AiCpuTask)
  // Queues `task` on s: it runs on the chip's AI CPU timeline, its outputs pending for their
  // readers until its end (docs/runtime.md, "The AI CPU timeline"). invalid_argument now if it
  // has no compute function or a range is not inside one live allocation; failed_precondition
  // at the stream's next synchronize if the chip's config models no AI CPU (ai_cpu.cores).
  Status ai_cpu_task_async(Stream s, AiCpuTask task);

  // ---- Profiling
  std::vector<LaunchRecord> launch_records() const;
  // Copies and fills run since open or the last clear_launch_records() (with record_launches).
  std::vector<CopyRecord> copy_records() const;
  // The collectives run on the system since open or the last clear (every chip's).
  std::vector<CollectiveRecord> collective_records() const;
  // This chip's AI CPU tasks run since open or the last clear (with record_launches).
  std::vector<AiCpuRecord> ai_cpu_records() const;
  // Clears the launch records, the copy records, the collective and the AI CPU records (of every
  // chip of the system).
  void clear_launch_records();
  // Attaches / detaches a ChipObserver (Simulator::add_observer; a chip of a system:
  // SystemSimulator::add_observer on this device's chip) between operations, on the driver
  // thread. Its callbacks then run on the driver thread, in simulator time
  // (LaunchRecord::sim_start_cycle). The caller keeps ownership; the observer must stay alive
  // until removed or the device is destroyed.
  Status add_observer(ChipObserver* observer);
  Status remove_observer(ChipObserver* observer);
  // The device timeline now: the latest of the chip's compute, communication and AI CPU
  // timelines (and its copies timed by data).
  Status device_time_cycles(uint64_t* cycles);
  // The host clock of the device's system (Driver, "The host clock"): the latest device time the
  // host has observed, which every op queued from now on starts no earlier than; 0 on a single
  // chip.
  Status host_time_cycles(uint64_t* cycles);
  // Simulator::counters() since open; a chip of a system: its own subtree ("chip<k>").
  Status counters(nlohmann::json* tree);
  // The system's counters (SystemSimulator::counters(): every chip and the links' "fabric"
  // channels); for a single-chip device the same as counters().
  Status system_counters(nlohmann::json* tree);
  // Simulator::trace() (SimOptions::trace); a chip of a system: that chip's.
  Status trace(nlohmann::json* chrome_trace);

  KernelCache& kernel_cache() { return m_cache; }

 private:
  struct Key {};  // restricts construction to open()

 public:
  Device(Key, const ChipConfig& cfg, const SimOptions& sim_opts, const RuntimeOptions& rt_opts);
  // Chip `chip` of a system whose driver the devices share.
  Device(Key, const ChipConfig& cfg, const RuntimeOptions& rt_opts, std::shared_ptr<Driver> driver,
         int chip);

 private:
  // `which` ("source", "destination") of `what` must lie inside one live allocation.
  Status check_range(const char* what, const char* which, uint64_t addr, uint64_t bytes) const;
  Status check_launch(const std::shared_ptr<const isa::Program>& program,
                      const std::vector<uint64_t>& args, int block_dim);
  Status enqueue(Stream s, DeviceOp op);
  // Checks and queues a launch (a derived one when derived.state is set).
  Status submit_launch(Stream s, std::shared_ptr<const isa::Program> program,
                       std::vector<uint64_t> args, int block_dim,
                       std::shared_ptr<const LaunchLabel> label, DerivedSource derived);
  // Checks a copy or fill (host pointers, ranges, alignment) and queues it on *s, or, with s
  // null, runs it synchronously.
  Status submit_transfer(const Stream* s, DeviceOp op);
  Status submit_peer_copy(const Stream* s, Device& dst_device, uint64_t dst, uint64_t src,
                          uint64_t bytes, CopyTiming timing = CopyTiming::stream);

  const ChipConfig m_cfg;
  const RuntimeOptions m_rt_opts;
  const int m_chip = 0;
  // Shared with the launches queued on the driver: the chip's L2 model files a launch's lines
  // by allocation (KernelLaunch::gm_blocks).
  std::shared_ptr<HbmAllocator> m_allocator;
  KernelCache m_cache;
  // Programs that passed the verifier: the weak pointer proves the address still names the
  // same program object.
  std::mutex m_verified_mutex;
  std::unordered_map<const isa::Program*, std::weak_ptr<const isa::Program>> m_verified;
  std::shared_ptr<Driver> m_driver;  // last: stopped first (by the system's last device)
};

}  // namespace npusim::rt
