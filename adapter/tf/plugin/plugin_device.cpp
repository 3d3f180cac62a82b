#include "adapter/tf/plugin/plugin_device.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <mutex>

#include <fmt/format.h>

#include "adapter/runtime/tensor_block.h"
#include "adapter/tf/plugin/mixed_precision.h"

namespace npusim::tf {
namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

struct OpenState {
  std::mutex mutex;
  bool attempted = false;
  rt::Status status;
  PluginSettings settings;
  // Never deleted: see plugin_device.h. Chip k's device is (*devices)[k].
  std::vector<std::shared_ptr<rt::Device>>* devices = nullptr;
};

// A non-negative integer setting; false if `text` is not one.
bool parse_count(const std::string& text, uint64_t* out) {
  size_t used = 0;
  try {
    *out = std::stoull(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  return used == text.size() && !text.empty() && text[0] != '-';
}

OpenState& open_state() {
  static OpenState* state = new OpenState();  // leaked on purpose, like the device
  return *state;
}

}  // namespace

rt::Status settings_from_env(PluginSettings* out) {
  PluginSettings s;
  s.chip_given = !env_or("NPUSIM_CHIP", "").empty();
  s.chip = env_or("NPUSIM_CHIP", s.chip);
  s.system = env_or("NPUSIM_SYSTEM", "");
  const std::string chips = env_or("NPUSIM_CHIPS", "");
  if (!chips.empty()) {
    uint64_t n = 0;
    if (!parse_count(chips, &n) || n < 1 || n > 4096)
      return rt::Status(rt::StatusCode::invalid_argument,
                        "NPUSIM_CHIPS: '" + chips + "' is not a chip count from 1 to 4096");
    s.chips = static_cast<int>(n);
  }
  std::string list = env_or("NPUSIM_CHIP_OVERRIDES", "");
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find_first_of(";\n", start);
    if (end == std::string::npos) end = list.size();
    std::string item = trim(list.substr(start, end - start));
    if (!item.empty()) {
      if (item.find('=') == std::string::npos)
        return rt::Status(rt::StatusCode::invalid_argument,
                          "NPUSIM_CHIP_OVERRIDES: '" + item + "' is not of the form key=value");
      s.overrides.push_back(item);
    }
    start = end + 1;
  }
  std::string mode = env_or("NPUSIM_PRECISION_MODE", "");
  if (!mode.empty()) {
    auto m = compiler::precision_mode_from_name(mode);
    if (!m)
      return rt::Status(rt::StatusCode::invalid_argument,
                        "NPUSIM_PRECISION_MODE: unknown precision mode '" + mode +
                            "' (must_keep_origin_dtype, allow_fp32_to_fp16, "
                            "allow_mix_precision)");
    s.precision = *m;
  }
  s.modify_mixlist = env_or("NPUSIM_MODIFY_MIXLIST", "");
  if (!s.modify_mixlist.empty()) {
    MixLists lists;
    rt::Status st = load_mix_lists(s.modify_mixlist, &lists);
    if (!st.ok())
      return rt::Status(rt::StatusCode::invalid_argument, "NPUSIM_MODIFY_MIXLIST: " + st.message());
  }
  std::string record = env_or("NPUSIM_RECORD_LAUNCHES", "1");
  if (record != "0" && record != "1")
    return rt::Status(rt::StatusCode::invalid_argument,
                      "NPUSIM_RECORD_LAUNCHES: '" + record + "' is not 0 or 1");
  s.record_launches = record == "1";
  std::string functional = env_or("NPUSIM_FUNCTIONAL", "1");
  if (functional != "0" && functional != "1")
    return rt::Status(rt::StatusCode::invalid_argument,
                      "NPUSIM_FUNCTIONAL: '" + functional +
                          "' is not 0 (timing-only) or 1 (functional)");
  s.functional = functional == "1";
  std::string watchdog = env_or("NPUSIM_MAX_INSNS_PER_BLOCK", "");
  if (!watchdog.empty()) {
    uint64_t n = 0;
    if (!parse_count(watchdog, &n))
      return rt::Status(rt::StatusCode::invalid_argument,
                        "NPUSIM_MAX_INSNS_PER_BLOCK: '" + watchdog +
                            "' is not a non-negative integer");
    s.max_insns_per_block = n;
  }
  *out = std::move(s);
  return rt::ok_status();
}

const PluginSettings& opened_settings() { return open_state().settings; }

rt::Status system_from_settings(const PluginSettings& s, SystemConfig* out) {
  // The 910b-x8 preset's links for chips given by count: its server of 8 is the Ascend
  // server the system presets model (configs/systems/910b-x8.yaml gives the sources).
  constexpr int kServerChips = 8;
  std::vector<std::string> overrides;
  // A chip file named relative to the working directory (the system file's `chip` key is
  // relative to the system file).
  std::error_code ec;
  const std::string chip =
      std::filesystem::is_regular_file(s.chip, ec) ? std::filesystem::absolute(s.chip).string()
                                                   : s.chip;
  if (s.system.empty() || s.chip_given) overrides.push_back("chip=" + chip);
  for (const std::string& o : s.overrides) overrides.push_back("chip." + o);
  const std::string source = s.system.empty() ? "910b-x8" : s.system;
  const std::string what =
      s.system.empty() ? fmt::format("NPUSIM_CHIPS={} of chip '{}'", s.chips, s.chip)
                       : "NPUSIM_SYSTEM='" + s.system + "'";
  return rt::guard(what, [&]() -> rt::Status {
    SystemConfig full = load_system_config(source, overrides);
    const int n = s.chips > 0 ? s.chips : (s.system.empty() ? 1 : full.chips());
    if (s.system.empty()) {
      const int per_server = n <= kServerChips ? n : kServerChips;
      if (n % per_server != 0)
        return rt::Status(rt::StatusCode::invalid_argument,
                          fmt::format("{}: {} chips do not make whole servers of {} (give a "
                                      "multiple of {}, or NPUSIM_SYSTEM with a system file)",
                                      what, n, kServerChips, kServerChips));
      overrides.push_back(fmt::format("servers={}", n / per_server));
      overrides.push_back(fmt::format("chips_per_server={}", per_server));
    } else if (n != full.chips()) {
      if (n > full.chips())
        return rt::Status(rt::StatusCode::invalid_argument,
                          fmt::format("NPUSIM_CHIPS={}: system '{}' has only {} chips", n,
                                      full.name, full.chips()));
      if (n > full.chips_per_server && n % full.chips_per_server != 0)
        return rt::Status(rt::StatusCode::invalid_argument,
                          fmt::format("NPUSIM_CHIPS={}: the first {} chips of system '{}' are "
                                      "not whole servers of {}",
                                      n, n, full.name, full.chips_per_server));
      const int per_server = std::min(n, full.chips_per_server);
      overrides.push_back(fmt::format("servers={}", n / per_server));
      overrides.push_back(fmt::format("chips_per_server={}", per_server));
    }
    *out = load_system_config(source, overrides);
    if (out->chip.hbm_bytes > (uint64_t{1} << kChipShift))
      return rt::Status(rt::StatusCode::invalid_argument,
                        fmt::format("{}: memory.hbm.bytes ({}) exceeds the {} bytes a chip of "
                                    "a system may have here",
                                    what, out->chip.hbm_bytes, uint64_t{1} << kChipShift));
    return rt::ok_status();
  });
}

int device_count() {
  OpenState& st = open_state();
  {
    std::lock_guard<std::mutex> lock(st.mutex);
    if (st.devices) return static_cast<int>(st.devices->size());
  }
  PluginSettings s;
  if (!settings_from_env(&s).ok() || !s.multichip()) return 1;
  SystemConfig sys;
  if (!system_from_settings(s, &sys).ok()) return 1;
  return sys.chips();
}

rt::Status open_device(int chip, std::shared_ptr<rt::Device>* out) {
  OpenState& st = open_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  if (!st.attempted) {
    st.attempted = true;
    st.status = settings_from_env(&st.settings);
    if (st.status.ok()) {
      auto* devices = new std::vector<std::shared_ptr<rt::Device>>(1);
      rt::RuntimeOptions rt_opts;
      rt_opts.record_launches = st.settings.record_launches;
      // TensorFlow frees a tensor once its last user is queued, not once it ran: discarding
      // the pages at the next operation boundary could zero a queued kernel's input. Freed
      // blocks keep their pages until reused.
      rt_opts.discard_freed_memory = false;
      SimOptions sim_opts;
      sim_opts.max_insns_per_block = st.settings.max_insns_per_block;
      sim_opts.functional = st.settings.functional;
      // The walking replay saves a timing-only run no computation, only SystemC events, and
      // still plans every instruction (its writes become undefined) and checks the L2 for
      // launches at new addresses: it costs more than it saves (docs/tf_plugin.md, "Timing-only
      // runs"), so it is off here; NPUSIM_REPLAY=on still turns it on (Simulator reads it).
      // What timing-only runs replay instead is the translated replay, on by default
      // (SimOptions::replay_translated, docs/chip_model.md "Timing-only replay by translation"):
      // no walk, a key lookup; NPUSIM_REPLAY_TRANSLATED=off turns it off.
      if (!sim_opts.functional) sim_opts.replay = SimOptions::Replay::off;
      if (st.settings.multichip()) {
        SystemConfig sys;
        st.status = system_from_settings(st.settings, &sys);
        if (st.status.ok()) st.status = rt::Device::open_system(sys, sim_opts, rt_opts, devices);
      } else {
        st.status = rt::Device::open(st.settings.chip, st.settings.overrides, sim_opts, rt_opts,
                                     &devices->at(0));
      }
      if (st.status.ok()) {
        st.devices = devices;
      } else {
        delete devices;
      }
    }
    if (!st.status.ok())
      st.status = rt::Status(
          st.status.code(),
          (st.settings.multichip()
               ? fmt::format("opening the NPUs (NPUSIM_SYSTEM='{}', NPUSIM_CHIPS={})",
                             st.settings.system, st.settings.chips)
               : "opening the NPU (NPUSIM_CHIP='" + st.settings.chip + "')") +
              ": " + st.status.message());
  }
  if (!st.status.ok()) return st.status;
  if (chip < 0 || chip >= static_cast<int>(st.devices->size()))
    return rt::Status(rt::StatusCode::invalid_argument,
                      fmt::format("NPU {} does not exist: the process has {} NPU device(s)", chip,
                                  st.devices->size()));
  *out = (*st.devices)[static_cast<size_t>(chip)];
  return rt::ok_status();
}

rt::Status open_device(std::shared_ptr<rt::Device>* out) { return open_device(0, out); }

rt::Status malloc_tensor(rt::Device& device, uint64_t bytes, uint64_t* addr) {
  const rt::TensorBlock layout{device.memory_alignment(), compiler::kDeviceBufferAlign};
  uint64_t block = 0;
  rt::Status st = device.malloc(layout.block_bytes(bytes), &block);
  *addr = st.ok() ? layout.tensor_at(block) : 0;
  return st;
}

rt::Status free_tensor(rt::Device& device, uint64_t addr) {
  const rt::TensorBlock layout{device.memory_alignment(), compiler::kDeviceBufferAlign};
  return addr == 0 ? rt::ok_status() : device.free(layout.block_at(addr));
}

std::shared_ptr<rt::Device> device_if_open() {
  OpenState& st = open_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  return st.devices ? st.devices->at(0) : nullptr;
}

std::vector<std::shared_ptr<rt::Device>> open_devices() {
  OpenState& st = open_state();
  std::lock_guard<std::mutex> lock(st.mutex);
  return st.devices ? *st.devices : std::vector<std::shared_ptr<rt::Device>>{};
}

TF_Code tf_code(rt::StatusCode code) {
  switch (code) {
    case rt::StatusCode::ok: return TF_OK;
    case rt::StatusCode::invalid_argument: return TF_INVALID_ARGUMENT;
    case rt::StatusCode::out_of_memory: return TF_RESOURCE_EXHAUSTED;
    case rt::StatusCode::kernel_fault: return TF_INTERNAL;
    case rt::StatusCode::unsupported: return TF_UNIMPLEMENTED;
    case rt::StatusCode::failed_precondition: return TF_FAILED_PRECONDITION;
    case rt::StatusCode::internal: return TF_INTERNAL;
  }
  return TF_UNKNOWN;
}

void set_tf_status(const rt::Status& st, TF_Status* tf) {
  if (!tf) return;
  TF_SetStatus(tf, tf_code(st.code()), st.ok() ? "" : st.message().c_str());
}

rt::Status from_tf_status(const TF_Status* tf, const std::string& where) {
  switch (TF_GetCode(tf)) {
    case TF_OK: return rt::ok_status();
    case TF_INVALID_ARGUMENT:
      return rt::Status(rt::StatusCode::invalid_argument, where + ": " + TF_Message(tf));
    case TF_RESOURCE_EXHAUSTED:
      return rt::Status(rt::StatusCode::out_of_memory, where + ": " + TF_Message(tf));
    case TF_UNIMPLEMENTED:
      return rt::Status(rt::StatusCode::unsupported, where + ": " + TF_Message(tf));
    case TF_FAILED_PRECONDITION:
      return rt::Status(rt::StatusCode::failed_precondition, where + ": " + TF_Message(tf));
    default:
      return rt::Status(rt::StatusCode::internal, where + ": " + TF_Message(tf));
  }
}

void log_error(const std::string& message) {
  std::fprintf(stderr, "npusim: %s\n", message.c_str());
  std::fflush(stderr);
}

void log_warning(const std::string& message) {
  std::fprintf(stderr, "npusim: warning: %s\n", message.c_str());
  std::fflush(stderr);
}

}  // namespace npusim::tf
