// C functions the Python package (adapter/tf/python/npusim) reads with ctypes from the same
// loaded library TensorFlow uses, so it sees the plugin's device, launch records and compiled
// op cache. Strings are returned as malloc'd JSON/YAML text the caller frees with
// npusim_tf_free; nothing here opens the device.
#include <cstdlib>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/plugin_device.h"

#define NPUSIM_TF_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

char* to_c_string(const std::string& s) {
  char* p = static_cast<char*>(std::malloc(s.size() + 1));
  if (p) std::memcpy(p, s.c_str(), s.size() + 1);
  return p;
}

nlohmann::json settings_json(const npusim::tf::PluginSettings& s) {
  return {{"chip", s.chip},
          {"overrides", s.overrides},
          {"precision_mode", npusim::compiler::precision_mode_name(s.precision)},
          {"record_launches", s.record_launches}};
}

}  // namespace

NPUSIM_TF_EXPORT void npusim_tf_free(char* p) { std::free(p); }

// {"open": bool, "settings": {...} (what the device was opened with, or what the environment
//  says now), "env_error": "..." (a bad environment), and, when open: "chip_identity",
//  "hbm_bytes", "memory": {allocator stats}}.
NPUSIM_TF_EXPORT char* npusim_tf_device_json() {
  using namespace npusim;
  nlohmann::json j;
  std::shared_ptr<rt::Device> dev = tf::device_if_open();
  j["open"] = dev != nullptr;
  if (dev) {
    j["settings"] = settings_json(tf::opened_settings());
    j["chip_identity"] = dev->chip_identity();
    j["hbm_bytes"] = dev->config().hbm_bytes;
    rt::AllocatorStats s = dev->memory_stats();
    j["memory"] = {{"bytes_in_use", s.bytes_in_use}, {"peak_bytes_in_use", s.peak_bytes_in_use},
                   {"bytes_limit", s.bytes_limit}, {"num_allocs", s.num_allocs}};
  } else {
    tf::PluginSettings s;
    rt::Status st = tf::settings_from_env(&s);
    j["settings"] = settings_json(s);
    if (!st.ok()) j["env_error"] = st.message();
  }
  return to_c_string(j.dump());
}

// Every kernel launch on the chip so far, oldest first: [{"index", "kernel", "stream",
// "block_dim", "start_cycle", "cycles", "time_us", "ok", "error"[, "counters"]}]. [] if the
// device is not open.
NPUSIM_TF_EXPORT char* npusim_tf_launch_records_json(int with_counters) {
  using namespace npusim;
  nlohmann::json j = nlohmann::json::array();
  if (std::shared_ptr<rt::Device> dev = tf::device_if_open()) {
    for (const rt::LaunchRecord& r : dev->launch_records()) {
      nlohmann::json e = {{"index", r.index},         {"kernel", r.kernel},
                          {"stream", r.stream},       {"block_dim", r.block_dim},
                          {"start_cycle", r.start_cycle}, {"cycles", r.cycles},
                          {"time_us", r.time_us},     {"ok", r.ok},
                          {"error", r.error}};
      if (with_counters) e["counters"] = r.counters;
      j.push_back(std::move(e));
    }
  }
  return to_c_string(j.dump());
}

NPUSIM_TF_EXPORT void npusim_tf_clear_launch_records() {
  if (auto dev = npusim::tf::device_if_open()) dev->clear_launch_records();
}

// The compiled op cache: {"hits", "misses", "failed_compiles", "entries", "keys": [...]}.
NPUSIM_TF_EXPORT char* npusim_tf_compiled_ops_json() {
  using npusim::tf::CompiledOpCache;
  npusim::tf::CompiledOpCacheStats s = CompiledOpCache::instance().stats();
  nlohmann::json j = {{"hits", s.hits},
                      {"misses", s.misses},
                      {"failed_compiles", s.failed_compiles},
                      {"entries", s.entries},
                      {"keys", CompiledOpCache::instance().keys()}};
  return to_c_string(j.dump());
}

// Checks the settings the environment holds now (NPUSIM_CHIP, NPUSIM_CHIP_OVERRIDES,
// NPUSIM_PRECISION_MODE) by loading the chip config, without opening the device. Returns null if
// they are valid, else the error message.
NPUSIM_TF_EXPORT char* npusim_tf_check_env_settings() {
  using namespace npusim;
  tf::PluginSettings s;
  rt::Status st = tf::settings_from_env(&s);
  if (st.ok())
    st = rt::guard("chip '" + s.chip + "'", [&] {
      (void)load_chip_config(s.chip, s.overrides);
      return rt::ok_status();
    });
  return st.ok() ? nullptr : to_c_string(st.message());
}

// The resolved chip config as YAML (written next to every report); null if not open.
NPUSIM_TF_EXPORT char* npusim_tf_chip_config_yaml() {
  auto dev = npusim::tf::device_if_open();
  return dev ? to_c_string(npusim::dump_chip_config_yaml(dev->config())) : nullptr;
}

// The simulator's counter tree since the device opened; null if not open or on error.
NPUSIM_TF_EXPORT char* npusim_tf_counters_json() {
  auto dev = npusim::tf::device_if_open();
  if (!dev) return nullptr;
  nlohmann::json tree;
  if (!dev->counters(&tree).ok()) return nullptr;
  return to_c_string(tree.dump());
}
