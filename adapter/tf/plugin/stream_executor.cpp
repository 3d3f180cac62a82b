// SE_InitPlugin: registers platform "NPU" (device type "NPU") with TensorFlow's StreamExecutor C
// API. Each SP_StreamExecutor callback is one call of the host runtime (docs/runtime.md, "How the
// TensorFlow plugin maps onto it"); the opaque pointer of an SP_DeviceMemoryBase is the device
// byte address itself, tagged with its chip above kChipShift (plugin_device.h: chip 0's pointers
// are plain addresses). With several chips (NPUSIM_CHIPS, NPUSIM_SYSTEM) NPU:k is chip k of one
// SystemSimulator; TensorFlow copies a tensor between two NPUs with memcpy_dtod on the sending
// device's stream with the receiver's pointer as destination (PluggableDeviceUtil::
// DeviceToDeviceCopy), which runs as a peer copy over the modelled links.
//
// Error policy. TensorFlow treats a non-ok stream status as fatal (LOG(FATAL)), so the
// callbacks that report a stream's state (get_stream_status, block_host_until_done,
// synchronize_all_activity) always succeed and log the runtime's pending error instead; kernels
// synchronise their own launches and report failures through their TF_Status (kernel.h). Errors
// found when an operation is queued (a bad range, an unknown handle) are returned, as TensorFlow
// expects from the copy and event callbacks.
#include <cxxabi.h>
#include <execinfo.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "adapter/compiler/op_desc.h"
#include "adapter/tf/plugin/derived_tensor_cache.h"
#include "adapter/tf/plugin/plugin_device.h"
#include "adapter/tf/plugin/se_handles.h"

namespace npusim::tf {
namespace {

constexpr char kPlatformName[] = "NPU";
constexpr char kDeviceType[] = "NPU";
constexpr char kVendor[] = "npusim";

// What SP_Device::device_handle points to.
struct DeviceHandle {
  std::shared_ptr<rt::Device> device;
  std::string hardware_name;  // "npusim <chip>", printed by TensorFlow
};

rt::Device& dev(const SP_Device* d) {
  return *static_cast<DeviceHandle*>(d->device_handle)->device;
}

uint64_t pointer(const SP_DeviceMemoryBase* m) { return reinterpret_cast<uint64_t>(m->opaque); }
// The chip's own address of a pointer of this device (a pointer of another chip is not
// translated: the runtime's range check then reports it).
uint64_t addr(const SP_DeviceMemoryBase* m) { return local_address(pointer(m)); }

// ---- platform

// One device per chip: 1 unless NPUSIM_CHIPS / NPUSIM_SYSTEM ask for a system of chips.
void get_device_count(const SP_Platform*, int* count, TF_Status* status) {
  *count = device_count();
  TF_SetStatus(status, TF_OK, "");
}

void create_device(const SP_Platform*, SE_CreateDeviceParams* params, TF_Status* status) {
  auto handle = std::make_unique<DeviceHandle>();
  rt::Status st = open_device(params->ordinal, &handle->device);
  if (!st.ok()) {
    set_tf_status(st, status);
    return;
  }
  handle->hardware_name = "npusim " + handle->device->config().name;
  if (handle->device->chips() > 1)
    handle->hardware_name += " (chip " + std::to_string(params->ordinal) + " of " +
                             std::to_string(handle->device->chips()) + ")";
  SP_Device* d = params->device;
  d->struct_size = SP_DEVICE_STRUCT_SIZE;
  d->ext = nullptr;
  d->ordinal = params->ordinal;
  d->hardware_name = handle->hardware_name.c_str();
  d->device_vendor = kVendor;
  d->pci_bus_id = nullptr;
  d->device_handle = handle.release();
  TF_SetStatus(status, TF_OK, "");
}

// Releases the handle only: the runtime device stays open (plugin_device.h).
void destroy_device(const SP_Platform*, SP_Device* device) {
  delete static_cast<DeviceHandle*>(device->device_handle);
  device->device_handle = nullptr;
}

int32_t get_numa_node(const SP_Device*) { return -1; }

int64_t get_memory_bandwidth(const SP_Device* d) {
  return static_cast<int64_t>(dev(d).config().hbm_gbps * 1e9);  // GB/s = 10^9 B/s
}

void create_device_fns(const SP_Platform*, SE_CreateDeviceFnsParams* params, TF_Status* status) {
  SP_DeviceFns* fns = params->device_fns;
  fns->struct_size = SP_DEVICE_FNS_STRUCT_SIZE;
  fns->get_numa_node = get_numa_node;
  fns->get_memory_bandwidth = get_memory_bandwidth;
  fns->get_gflops = nullptr;  // optional; no single figure for cube vs vector work
  TF_SetStatus(status, TF_OK, "");
}

void destroy_device_fns(const SP_Platform*, SP_DeviceFns*) {}

// ---- memory

// Every tensor is a malloc_tensor block (plugin_device.h): a guard line before it and
// kDeviceBufferAlign spare bytes after it that TensorFlow never sees, since compiled kernels may
// read that far around an input (op_desc.h buffer contract).
void allocate(const SP_Device* d, uint64_t size, int64_t /*memory_space*/,
              SP_DeviceMemoryBase* mem) {
  mem->struct_size = SP_DEVICE_MEMORY_BASE_STRUCT_SIZE;
  mem->opaque = nullptr;
  mem->size = 0;
  mem->payload = 0;
  if (size == 0) return;
  uint64_t a = 0;
  rt::Status st = malloc_tensor(dev(d), size, &a);
  if (!st.ok()) return;  // a null opaque pointer is TensorFlow's out-of-memory signal
  mem->opaque = reinterpret_cast<void*>(tf_pointer(dev(d).chip(), a));
  mem->size = size;
}

void deallocate(const SP_Device* d, SP_DeviceMemoryBase* mem) {
  if (!mem->opaque) return;
  const uint64_t a = addr(mem);
  rt::Status st = free_tensor(dev(d), a);
  if (!st.ok()) log_error("deallocate: " + st.message());
  // What the derived-tensor cache kept of this tensor (a weight's fp16 copy) is stale now.
  DerivedTensorCache::instance().source_freed(dev(d), a, mem->size);
  mem->opaque = nullptr;
  mem->size = 0;
}

// Host staging memory needs no registration with the simulated link.
void* host_memory_allocate(const SP_Device*, uint64_t size) {
  constexpr uint64_t kAlign = 64;
  if (size == 0) return nullptr;
  return std::aligned_alloc(kAlign, (size + kAlign - 1) / kAlign * kAlign);
}

void host_memory_deallocate(const SP_Device*, void* mem) { std::free(mem); }

TF_Bool get_allocator_stats(const SP_Device* d, SP_AllocatorStats* stats) {
  rt::AllocatorStats s = dev(d).memory_stats();
  stats->struct_size = SP_ALLOCATORSTATS_STRUCT_SIZE;
  stats->num_allocs = static_cast<int64_t>(s.total_allocs);
  stats->bytes_in_use = static_cast<int64_t>(s.bytes_in_use);
  stats->peak_bytes_in_use = static_cast<int64_t>(s.peak_bytes_in_use);
  stats->largest_alloc_size = static_cast<int64_t>(s.largest_alloc_size);
  stats->has_bytes_limit = 1;
  stats->bytes_limit = static_cast<int64_t>(s.bytes_limit);
  stats->bytes_reserved = 0;
  stats->peak_bytes_reserved = 0;
  stats->has_bytes_reservable_limit = 0;
  stats->bytes_reservable_limit = 0;
  stats->largest_free_block_bytes = static_cast<int64_t>(s.largest_free_block);
  return 1;
}

TF_Bool device_memory_usage(const SP_Device* d, int64_t* free, int64_t* total) {
  rt::AllocatorStats s = dev(d).memory_stats();
  *free = static_cast<int64_t>(s.bytes_free);
  *total = static_cast<int64_t>(s.bytes_limit);
  return 1;
}

// ---- streams

// The streams TensorFlow created on each chip, which synchronize_all_activity waits for (the
// synchronous copies wait for themselves). Not the chip's collective stream (collective_bridge.cpp): a
// part there may wait for ranks whose ops TensorFlow has yet to run, possibly after this very
// synchronisation (an eager copy from the chip syncs it first), and TensorFlow sees a
// collective's outputs only once it has run.
struct TfStreams {
  std::mutex mutex;
  std::map<int, std::set<uint64_t>> of_chip;  // chip -> stream ids
};
TfStreams& tf_streams() {
  static TfStreams* s = new TfStreams();  // never destroyed, like the devices
  return *s;
}

void create_stream(const SP_Device* d, SP_Stream* stream, TF_Status* status) {
  auto s = std::make_unique<SP_Stream_st>();
  s->chip = dev(d).chip();
  rt::Status st = dev(d).create_stream(&s->stream);
  set_tf_status(st, status);
  if (st.ok()) {
    std::lock_guard<std::mutex> lock(tf_streams().mutex);
    tf_streams().of_chip[s->chip].insert(s->stream.id);
  }
  *stream = st.ok() ? s.release() : nullptr;
}

void destroy_stream(const SP_Device* d, SP_Stream stream) {
  if (!stream) return;
  {
    std::lock_guard<std::mutex> lock(tf_streams().mutex);
    tf_streams().of_chip[stream->chip].erase(stream->stream.id);
  }
  rt::Status st = dev(d).destroy_stream(stream->stream);
  if (!st.ok()) log_error("destroy_stream: " + st.message());
  delete stream;
}

void create_stream_dependency(const SP_Device* d, SP_Stream dependent, SP_Stream other,
                              TF_Status* status) {
  set_tf_status(dev(d).stream_wait_stream(dependent->stream, other->stream), status);
}

// Always ok (see the error policy above); a pending error is left for the stream's kernels.
void get_stream_status(const SP_Device*, SP_Stream, TF_Status* status) {
  TF_SetStatus(status, TF_OK, "");
}

// Waits for the stream; its pending error is logged, not returned (error policy above).
void block_host_until_done(const SP_Device* d, SP_Stream stream, TF_Status* status) {
  rt::Status st = dev(d).synchronize_stream(stream->stream);
  if (!st.ok()) log_error("stream " + std::to_string(stream->stream.id) + ": " + st.message());
  TF_SetStatus(status, TF_OK, "");
}

// Waits for the chip's TensorFlow streams (tf_streams); pending errors are logged (error
// policy above).
void synchronize_all_activity(const SP_Device* d, TF_Status* status) {
  std::set<uint64_t> ids;
  {
    std::lock_guard<std::mutex> lock(tf_streams().mutex);
    const std::set<uint64_t>& of_chip = tf_streams().of_chip[dev(d).chip()];
    ids.insert(of_chip.begin(), of_chip.end());
  }
  for (uint64_t id : ids) {
    rt::Status st = dev(d).synchronize_stream(rt::Stream{id});
    if (!st.ok())
      log_error("synchronize_all_activity: stream " + std::to_string(id) + ": " + st.message());
  }
  TF_SetStatus(status, TF_OK, "");
}

// ---- events

void create_event(const SP_Device* d, SP_Event* event, TF_Status* status) {
  auto e = std::make_unique<SP_Event_st>();
  rt::Status st = dev(d).create_event(&e->event);
  set_tf_status(st, status);
  *event = st.ok() ? e.release() : nullptr;
}

void destroy_event(const SP_Device* d, SP_Event event) {
  if (!event) return;
  rt::Status st = dev(d).destroy_event(event->event);
  if (!st.ok()) log_error("destroy_event: " + st.message());
  delete event;
}

SE_EventStatus get_event_status(const SP_Device* d, SP_Event event) {
  bool complete = false;
  rt::Status st = dev(d).query_event(event->event, &complete);
  if (!st.ok()) {
    log_error("get_event_status: " + st.message());
    return SE_EVENT_ERROR;
  }
  return complete ? SE_EVENT_COMPLETE : SE_EVENT_PENDING;
}

void record_event(const SP_Device* d, SP_Stream stream, SP_Event event, TF_Status* status) {
  set_tf_status(dev(d).record_event(event->event, stream->stream), status);
}

void wait_for_event(const SP_Device* const d, SP_Stream stream, SP_Event event,
                    TF_Status* const status) {
  set_tf_status(dev(d).stream_wait_event(stream->stream, event->event), status);
}

void block_host_for_event(const SP_Device* d, SP_Event event, TF_Status* status) {
  set_tf_status(dev(d).synchronize_event(event->event), status);
}

// ---- timers (device time between two events, as aclrtEventElapsedTime)

void create_timer(const SP_Device* d, SP_Timer* timer, TF_Status* status) {
  auto t = std::make_unique<SP_Timer_st>();
  t->device = &dev(d);
  rt::Status st = t->device->create_event(&t->start);
  if (st.ok()) {
    st = t->device->create_event(&t->stop);
    if (!st.ok()) (void)t->device->destroy_event(t->start);
  }
  set_tf_status(st, status);
  *timer = st.ok() ? t.release() : nullptr;
}

void destroy_timer(const SP_Device* d, SP_Timer timer) {
  if (!timer) return;
  (void)dev(d).destroy_event(timer->start);
  (void)dev(d).destroy_event(timer->stop);
  delete timer;
}

void start_timer(const SP_Device* d, SP_Stream stream, SP_Timer timer, TF_Status* status) {
  set_tf_status(dev(d).record_event(timer->start, stream->stream), status);
}

void stop_timer(const SP_Device* d, SP_Stream stream, SP_Timer timer, TF_Status* status) {
  set_tf_status(dev(d).record_event(timer->stop, stream->stream), status);
}

// Simulated nanoseconds between start and stop; waits for the stop record. 0 on error.
uint64_t timer_nanoseconds(SP_Timer timer) {
  rt::Status st = timer->device->synchronize_event(timer->stop);
  double us = 0;
  if (st.ok()) st = timer->device->event_elapsed_us(timer->start, timer->stop, &us);
  if (!st.ok()) {
    log_error("timer: " + st.message());
    return 0;
  }
  return static_cast<uint64_t>(us * 1000.0 + 0.5);
}

void create_timer_fns(const SP_Platform*, SP_TimerFns* fns, TF_Status* status) {
  fns->struct_size = SP_TIMER_FNS_STRUCT_SIZE;
  fns->nanoseconds = timer_nanoseconds;
  TF_SetStatus(status, TF_OK, "");
}

void destroy_timer_fns(const SP_Platform*, SP_TimerFns*) {}

// ---- copies and fills

// TensorFlow queues its copies out of a device on a copy stream that first waits for everything
// queued so far on the compute stream (PluggableDeviceUtil); how much that is depends on how far
// its executor threads had got. On a system of chips the copies are therefore timed by their data
// (rt::CopyTiming::data): a copy starts when its source was written, whatever else was queued, so
// a step's timelines repeat from run to run (docs/runtime.md, "Copies timed by data"). Its copies
// into a device too: its executor threads queue a step's inputs (a distributed dataset's
// batches) in an order of their own, and on the compute timeline each copy moved the kernels
// the driver served after it; timed by data, an input copy starts when the host queued it and
// the kernels that read it wait for its end.
// NPUSIM_COPY_LOG=1: one stderr line per copy TensorFlow asks for, "npusim: copy <kind> <bytes>
// bytes (<stream or sync>) for <caller>", where the caller is the first function on the calling
// thread's stack that is not copy machinery: tensorflow::RecvOp::ComputeAsync (a receive that
// partitioning added: a function argument from the host, a HostConst read in device memory),
// tensorflow::ConstantOp::ConstantOp (a device Const uploaded when its kernel is built),
// tensorflow::TensorHandle::Resolve (the host reading an eager tensor). It finds the copies that
// land on a timeline in a different place from run to run (docs/runtime.md, "The same timeline
// in every run"); read once, when the first copy is queued.
bool copy_log_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("NPUSIM_COPY_LOG");
    return v && *v && std::string(v) != "0";
  }();
  return on;
}

// The caller of a copy, as above ("?" when the stack has no symbol names).
std::string copy_caller() {
  void* frames[48];
  const int n = backtrace(frames, 48);
  char** symbols = backtrace_symbols(frames, n);
  std::string caller = "?";
  for (int i = 0; symbols && i < n; ++i) {
    // "object(mangled+offset) [address]"
    const std::string line = symbols[i];
    const size_t open = line.find('('), plus = line.find('+', open);
    if (open == std::string::npos || plus == std::string::npos || plus == open + 1) continue;
    const std::string mangled = line.substr(open + 1, plus - open - 1);
    int st = 0;
    char* demangled = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &st);
    std::string name = st == 0 && demangled ? demangled : mangled;
    std::free(demangled);
    name = name.substr(0, name.find('('));
    static const char* const kMachinery[] = {"npusim::", "stream_executor::", "Memcpy",
                                             "Copy",     "Rendezvous",        "PluggableDevice"};
    if (std::any_of(std::begin(kMachinery), std::end(kMachinery),
                    [&name](const char* m) { return name.find(m) != std::string::npos; }))
      continue;
    caller = name;
    break;
  }
  std::free(symbols);
  return caller;
}

void log_copy(const char* kind, uint64_t bytes, const SP_Stream stream) {
  if (!copy_log_enabled()) return;
  std::string where = "sync";
  if (stream) where = "stream " + std::to_string(stream->stream.id);
  std::fprintf(stderr, "npusim: copy %s %llu bytes (%s) for %s\n", kind,
               static_cast<unsigned long long>(bytes), where.c_str(), copy_caller().c_str());
}

void memcpy_dtoh(const SP_Device* d, SP_Stream stream, void* host_dst,
                 const SP_DeviceMemoryBase* src, uint64_t size, TF_Status* status) {
  log_copy("d2h", size, stream);
  set_tf_status(dev(d).memcpy_d2h_async(stream->stream, host_dst, addr(src), size,
                                        rt::CopyTiming::data),
                status);
}

void memcpy_htod(const SP_Device* d, SP_Stream stream, SP_DeviceMemoryBase* dst,
                 const void* host_src, uint64_t size, TF_Status* status) {
  log_copy("h2d", size, stream);
  set_tf_status(dev(d).memcpy_h2d_async(stream->stream, addr(dst), host_src, size,
                                        rt::CopyTiming::data),
                status);
}

// The device owning a pointer's chip: this one, or (a copy between NPUs) another chip's.
rt::Status device_of(const SP_Device* d, const SP_DeviceMemoryBase* m,
                     std::shared_ptr<rt::Device>* out) {
  const int chip = chip_of_pointer(pointer(m));
  if (chip == dev(d).chip()) {
    *out = static_cast<DeviceHandle*>(d->device_handle)->device;
    return rt::ok_status();
  }
  return open_device(chip, out);
}

// Within the device's chip: a d2d copy; to another chip: a peer copy over the links. (The
// source is always this device's: TensorFlow queues a copy on the sender's stream.)
void memcpy_dtod(const SP_Device* d, SP_Stream stream, SP_DeviceMemoryBase* dst,
                 const SP_DeviceMemoryBase* src, uint64_t size, TF_Status* status) {
  log_copy("d2d", size, stream);
  std::shared_ptr<rt::Device> to;
  rt::Status st = device_of(d, dst, &to);
  if (st.ok())
    st = to.get() == &dev(d)
             ? dev(d).memcpy_d2d_async(stream->stream, addr(dst), addr(src), size)
             : dev(d).memcpy_peer_async(stream->stream, *to, addr(dst), addr(src), size,
                                        rt::CopyTiming::data);
  set_tf_status(st, status);
}

void sync_memcpy_dtoh(const SP_Device* d, void* host_dst, const SP_DeviceMemoryBase* src,
                      uint64_t size, TF_Status* status) {
  log_copy("d2h", size, nullptr);
  set_tf_status(dev(d).memcpy_d2h(host_dst, addr(src), size), status);
}

void sync_memcpy_htod(const SP_Device* d, SP_DeviceMemoryBase* dst, const void* host_src,
                      uint64_t size, TF_Status* status) {
  log_copy("h2d", size, nullptr);
  set_tf_status(dev(d).memcpy_h2d(addr(dst), host_src, size), status);
}

void sync_memcpy_dtod(const SP_Device* d, SP_DeviceMemoryBase* dst,
                      const SP_DeviceMemoryBase* src, uint64_t size, TF_Status* status) {
  log_copy("d2d", size, nullptr);
  std::shared_ptr<rt::Device> to;
  rt::Status st = device_of(d, dst, &to);
  if (st.ok())
    st = to.get() == &dev(d) ? dev(d).memcpy_d2d(addr(dst), addr(src), size)
                             : dev(d).memcpy_peer(*to, addr(dst), addr(src), size);
  set_tf_status(st, status);
}

void mem_zero(const SP_Device* d, SP_Stream stream, SP_DeviceMemoryBase* location, uint64_t size,
              TF_Status* status) {
  set_tf_status(dev(d).memset8_async(stream->stream, addr(location), 0, size), status);
}

void memset8(const SP_Device* d, SP_Stream stream, SP_DeviceMemoryBase* location,
             uint8_t pattern, uint64_t size, TF_Status* status) {
  set_tf_status(dev(d).memset8_async(stream->stream, addr(location), pattern, size), status);
}

void memset32(const SP_Device* d, SP_Stream stream, SP_DeviceMemoryBase* location,
              uint32_t pattern, uint64_t size, TF_Status* status) {
  set_tf_status(dev(d).memset32_async(stream->stream, addr(location), pattern, size), status);
}

// Runs callback_fn on the runtime's driver thread in stream order; its TF_Status becomes the
// stream's error (logged by the next block_host_until_done).
TF_Bool host_callback(const SP_Device* d, SP_Stream stream, SE_StatusCallbackFn callback_fn,
                      void* callback_arg) {
  rt::Status st = dev(d).launch_callback(stream->stream, [callback_fn, callback_arg]() {
    TF_Status* tf = TF_NewStatus();
    callback_fn(callback_arg, tf);
    rt::Status result = from_tf_status(tf, "host callback");
    TF_DeleteStatus(tf);
    return result;
  });
  if (!st.ok()) log_error("host_callback: " + st.message());
  return st.ok() ? 1 : 0;
}

void create_stream_executor(const SP_Platform*, SE_CreateStreamExecutorParams* params,
                            TF_Status* status) {
  SP_StreamExecutor* se = params->stream_executor;
  se->struct_size = SP_STREAMEXECUTOR_STRUCT_SIZE;
  se->allocate = allocate;
  se->deallocate = deallocate;
  se->host_memory_allocate = host_memory_allocate;
  se->host_memory_deallocate = host_memory_deallocate;
  se->unified_memory_allocate = nullptr;  // supports_unified_memory is false
  se->unified_memory_deallocate = nullptr;
  se->get_allocator_stats = get_allocator_stats;
  se->device_memory_usage = device_memory_usage;
  se->create_stream = create_stream;
  se->destroy_stream = destroy_stream;
  se->create_stream_dependency = create_stream_dependency;
  se->get_stream_status = get_stream_status;
  se->create_event = create_event;
  se->destroy_event = destroy_event;
  se->get_event_status = get_event_status;
  se->record_event = record_event;
  se->wait_for_event = wait_for_event;
  se->create_timer = create_timer;
  se->destroy_timer = destroy_timer;
  se->start_timer = start_timer;
  se->stop_timer = stop_timer;
  se->memcpy_dtoh = memcpy_dtoh;
  se->memcpy_htod = memcpy_htod;
  se->memcpy_dtod = memcpy_dtod;
  se->sync_memcpy_dtoh = sync_memcpy_dtoh;
  se->sync_memcpy_htod = sync_memcpy_htod;
  se->sync_memcpy_dtod = sync_memcpy_dtod;
  se->block_host_for_event = block_host_for_event;
  se->block_host_until_done = block_host_until_done;
  se->synchronize_all_activity = synchronize_all_activity;
  se->mem_zero = mem_zero;
  se->memset = memset8;
  se->memset32 = memset32;
  se->host_callback = host_callback;
  TF_SetStatus(status, TF_OK, "");
}

void destroy_stream_executor(const SP_Platform*, SP_StreamExecutor*) {}
void destroy_platform(SP_Platform*) {}
void destroy_platform_fns(SP_PlatformFns*) {}

}  // namespace
}  // namespace npusim::tf

extern "C" __attribute__((visibility("default"))) void SE_InitPlugin(
    SE_PlatformRegistrationParams* params, TF_Status* status) {
  using namespace npusim::tf;
  SP_Platform* p = params->platform;
  p->struct_size = SP_PLATFORM_STRUCT_SIZE;
  p->ext = nullptr;
  p->name = kPlatformName;
  p->type = kDeviceType;
  p->supports_unified_memory = 0;
  // Every tensor is a block of the runtime's allocator, not a chunk of TensorFlow's BFC
  // allocator: blocks lie on whole L2 lines (allocator.h), while BFC packs tensors at 256 bytes,
  // so two tensors could share a line and a launch's L2 hits, HBM bytes and cycles depended on
  // where TF happened to put them (different from run to run). TF's allocator statistics are
  // then answered from the runtime's (python/npusim/_memory.py).
  p->use_bfc_allocator = 0;
  p->force_memory_growth = 0;

  SP_PlatformFns* f = params->platform_fns;
  f->struct_size = SP_PLATFORM_FNS_STRUCT_SIZE;
  f->ext = nullptr;
  f->get_device_count = get_device_count;
  f->create_device = create_device;
  f->destroy_device = destroy_device;
  f->create_device_fns = create_device_fns;
  f->destroy_device_fns = destroy_device_fns;
  f->create_stream_executor = create_stream_executor;
  f->destroy_stream_executor = destroy_stream_executor;
  f->create_timer_fns = create_timer_fns;
  f->destroy_timer_fns = destroy_timer_fns;

  params->destroy_platform = destroy_platform;
  params->destroy_platform_fns = destroy_platform_fns;
  TF_SetStatus(status, TF_OK, "");
}
