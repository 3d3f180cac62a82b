// TF_InitProfiler: TensorFlow's pluggable profiler (tensorflow/c/experimental/pluggable_profiler/
// pluggable_profiler.h). `tf.profiler.experimental.start(logdir)` / `stop()` (and Keras'
// TensorBoard(profile_batch=...)) call start and stop, then collect_data_xspace, whose XSpace
// TensorFlow merges into the host's before it writes `<logdir>/plugins/profile/<run>/
// <host>.xplane.pb`. Profiling records only the window's bounds: the kernels come from the
// runtime's launch records afterwards (prof::npu_xspace), the records the reports use.
//
// Time: the device timeline at start() is the host's wall clock at start(); device time runs at
// the chip's clock_mhz from there (docs/reports.md, "TensorBoard (TensorFlow's profiler)").
#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "adapter/profiler/xplane_writer.h"
#include "adapter/tf/plugin/launch_window.h"
#include "adapter/tf/plugin/plugin_device.h"
#include "tensorflow/c/experimental/pluggable_profiler/pluggable_profiler.h"

namespace npusim::tf {
namespace {

// The one profile window of the process (TensorFlow runs one profiler session at a time).
struct ProfileState {
  std::mutex mutex;
  bool running = false;
  prof::XPlaneWindow window;  // chip 0's (NPU:0); origin_walltime_ns is every chip's
  // Several NPUs: each chip's own timeline at start and stop (its launches in the window).
  std::vector<uint64_t> origins, ends;
  std::string xspace;  // serialized between collect_data_xspace's size query and its copy
};

ProfileState& state() {
  static ProfileState* s = new ProfileState;  // never destroyed: TensorFlow may call late
  return *s;
}

// The device timeline now, after everything queued so far (0 if the device is not open yet:
// its timeline starts at 0 when it opens).
rt::Status device_now(uint64_t* cycles) {
  *cycles = 0;
  std::shared_ptr<rt::Device> dev = device_if_open();
  return dev ? dev->device_time_cycles(cycles) : rt::ok_status();
}

// Every open chip's timeline now (empty if the device is not open yet).
rt::Status chips_now(std::vector<uint64_t>* cycles) {
  cycles->clear();
  for (const std::shared_ptr<rt::Device>& d : open_devices()) {
    uint64_t t = 0;
    if (rt::Status s = d->device_time_cycles(&t); !s.ok()) return s;
    cycles->push_back(t);
  }
  return rt::ok_status();
}

int64_t wall_clock_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void set_error(TF_Status* status, TF_Code code, const std::string& message) {
  TF_SetStatus(status, code, ("npusim profiler: " + message).c_str());
}

void profiler_start(const TP_Profiler*, TF_Status* status) {
  ProfileState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.running) return set_error(status, TF_FAILED_PRECONDITION, "already started");
  uint64_t origin = 0;
  rt::Status st = device_now(&origin);
  if (st.ok()) st = chips_now(&s.origins);
  if (!st.ok()) return set_tf_status(st, status);
  s.ends.clear();
  s.window = prof::XPlaneWindow{};
  s.window.origin_cycle = origin;
  s.window.origin_walltime_ns = wall_clock_ns();
  s.xspace.clear();
  s.running = true;
  TF_SetStatus(status, TF_OK, "");
}

void profiler_stop(const TP_Profiler*, TF_Status* status) {
  ProfileState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!s.running) return TF_SetStatus(status, TF_OK, "");
  uint64_t end = 0;
  rt::Status st = device_now(&end);
  if (st.ok()) st = chips_now(&s.ends);
  if (!st.ok()) return set_tf_status(st, status);
  s.window.end_cycle = end;
  s.running = false;
  TF_SetStatus(status, TF_OK, "");
}

// The window's XSpace; empty when the device never opened (TensorFlow then adds no plane).
// Several NPUs: a plane per chip k, "/device:CUSTOM:NPU:k", with the launches that started on
// its timeline between its position at start and at stop, and its collectives' lane. The chips'
// timelines count one clock (a collective starts at the same cycle on all its chips), so every
// plane maps device cycles onto the host's clock from one origin: the earliest chip timeline at
// start is the host's wall clock at start (on one chip: its timeline, as before). (An origin
// moved back before start would put a plane's lines before the session's start, which
// TensorFlow then leaves un-normalised.)
rt::Status build_xspace(const ProfileState& s, std::string* out) {
  const prof::XPlaneWindow& w = s.window;
  std::shared_ptr<rt::Device> dev = device_if_open();
  if (!dev) return rt::ok_status();
  if (!opened_settings().record_launches)
    log_warning("the NPU's profile plane has no kernels: NPUSIM_RECORD_LAUNCHES=0");
  const std::vector<std::shared_ptr<rt::Device>> devices = open_devices();
  if (devices.size() <= 1) {
    std::vector<rt::LaunchRecord> launches;
    window_records(*dev, w.origin_cycle, 0, &launches, nullptr);
    *out = prof::npu_xspace(launches, dev->config(), w);
    return rt::ok_status();
  }
  const std::vector<rt::CollectiveRecord> comms = dev->collective_records();
  // Each chip's window from its timeline at start (a chip opened since: from chip 0's origin).
  auto from = [&](size_t k) { return k < s.origins.size() ? s.origins[k] : w.origin_cycle; };
  uint64_t origin = w.origin_cycle;
  for (size_t k = 0; k < devices.size(); ++k) origin = std::min(origin, from(k));
  std::vector<std::string> planes;
  for (size_t k = 0; k < devices.size(); ++k) {
    rt::Device& d = *devices[k];
    prof::XPlaneWindow ck = w;
    ck.device_ordinal = static_cast<int>(k);
    ck.origin_cycle = origin;
    ck.end_cycle = k < s.ends.size() ? s.ends[k] : w.end_cycle;
    // Chip k's launches and collectives from its own start on (those before ran before the
    // window, even if they lie after another chip's start).
    std::vector<rt::LaunchRecord> launches;
    window_records(d, from(k), 0, &launches, nullptr);
    std::vector<rt::CollectiveRecord> mine;
    for (const rt::CollectiveRecord& c : comms)
      if (c.start_cycle >= from(k)) mine.push_back(c);
    planes.push_back(prof::npu_xplane(launches, mine, d.config(), ck));
  }
  *out = prof::xspace_of(planes);
  return rt::ok_status();
}

// TensorFlow asks for the size (buffer null), then for the bytes with a buffer of that size.
void profiler_collect_data_xspace(const TP_Profiler*, uint8_t* buffer, size_t* size_in_bytes,
                                  TF_Status* status) {
  ProfileState& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (!buffer) {
    s.xspace.clear();
    rt::Status st = rt::guard("collect_data_xspace", [&] { return build_xspace(s, &s.xspace); });
    *size_in_bytes = s.xspace.size();
    return set_tf_status(st, status);
  }
  if (*size_in_bytes < s.xspace.size())
    return set_error(status, TF_INVALID_ARGUMENT,
                     "collect_data_xspace: buffer of " + std::to_string(*size_in_bytes) +
                         " bytes for an XSpace of " + std::to_string(s.xspace.size()));
  std::memcpy(buffer, s.xspace.data(), s.xspace.size());
  *size_in_bytes = s.xspace.size();
  s.xspace.clear();
  TF_SetStatus(status, TF_OK, "");
}

void destroy_profiler(TP_Profiler*) {}
void destroy_profiler_fns(TP_ProfilerFns*) {}

}  // namespace
}  // namespace npusim::tf

extern "C" __attribute__((visibility("default"))) void TF_InitProfiler(
    TF_ProfilerRegistrationParams* params, TF_Status* status) {
  using namespace npusim::tf;
  params->struct_size = TF_PROFILER_REGISTRATION_PARAMS_STRUCT_SIZE;
  params->major_version = TP_MAJOR;
  params->minor_version = TP_MINOR;
  params->patch_version = TP_PATCH;
  params->profiler->struct_size = TP_PROFILER_STRUCT_SIZE;
  params->profiler->device_type = "NPU";
  params->profiler_fns->struct_size = TP_PROFILER_FNS_STRUCT_SIZE;
  params->profiler_fns->start = profiler_start;
  params->profiler_fns->stop = profiler_stop;
  params->profiler_fns->collect_data_xspace = profiler_collect_data_xspace;
  params->destroy_profiler = destroy_profiler;
  params->destroy_profiler_fns = destroy_profiler_fns;
  TF_SetStatus(status, TF_OK, "");
}
