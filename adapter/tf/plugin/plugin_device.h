// The process's NPU as the TensorFlow plugin sees it: the settings read from the environment, the
// one runtime device (adapter/runtime) that every StreamExecutor callback and every kernel uses,
// and the conversion of runtime statuses into TF_Status.
//
// Settings (read when TensorFlow creates the device, i.e. at its first op or
// list_logical_devices(), not when the plugin is loaded; npusim.configure() sets them):
//   NPUSIM_CHIP             preset name or YAML path (default "910b")
//   NPUSIM_CHIP_OVERRIDES   "dotted.key=value" overrides separated by ';' or newlines
//   NPUSIM_PRECISION_MODE   CANN precision mode for cube ops (default allow_fp32_to_fp16)
//   NPUSIM_RECORD_LAUNCHES  "0" turns off the runtime's per-launch records (default on; each
//                           holds the launch's changed counters, shared between launches
//                           that counted alike)
//   NPUSIM_MAX_INSNS_PER_BLOCK  the simulator's watchdog (SimOptions::max_insns_per_block): a
//                           block executing more than this many scalar-unit instructions per
//                           128 KiB of its launch's tensor arguments (at least this many)
//                           faults (default 2^23; 0 disables it)
//   NPUSIM_CHIPS            N >= 1: N NPU devices, each a chip of one SystemSimulator (default:
//                           one chip, no system). With NPUSIM_SYSTEM: its first N chips; else
//                           N chips of NPUSIM_CHIP joined as the 910b-x8 preset joins its chips
//                           (one full-mesh server of N for N <= 8, else N / 8 such servers)
//   NPUSIM_SYSTEM           a system preset (configs/systems: 910b-x8, 910b-x16, tiny-x8) or a
//                           system YAML: every chip of it is an NPU device (NPUSIM_CHIP, if
//                           set, replaces its chip; NPUSIM_CHIP_OVERRIDES apply to the chip)
//   NPUSIM_FUNCTIONAL       "0": timing-only (SimOptions::functional = false): kernels take
//                           their simulated time and count as in a functional run but compute
//                           nothing, and device memory holds no data (reads give zeros);
//                           launches are not replayed unless NPUSIM_REPLAY says so; default
//                           "1" (docs/tf_plugin.md, "Timing-only runs")
// SystemC elaborates once per process, so the device (or the system's devices) opens once and
// stays open until the process exits (it is deliberately never destroyed: its driver thread must
// not be joined during static destruction, after SystemC's own statics are gone).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/runtime/device.h"
#include "adapter/runtime/status.h"
#include "adapter/tf/plugin/tf_pointer.h"
#include "sim/config/system_config.h"
#include "tensorflow/c/tf_status.h"

namespace npusim::tf {

struct PluginSettings {
  std::string chip = "910b";
  std::vector<std::string> overrides;
  compiler::PrecisionMode precision = compiler::PrecisionMode::kAllowFp32ToFp16;
  bool record_launches = true;
  uint64_t max_insns_per_block = SimOptions{}.max_insns_per_block;
  bool functional = true;   // NPUSIM_FUNCTIONAL
  bool chip_given = false;  // NPUSIM_CHIP was set (with a system: it replaces the system's chip)
  int chips = 0;            // NPUSIM_CHIPS; 0: not given
  std::string system;       // NPUSIM_SYSTEM; empty: none
  // NPUSIM_MODIFY_MIXLIST: CANN's modify_mixlist json for allow_mix_precision
  // (mixed_precision.h); empty: the built-in lists. Checked when the settings are read.
  std::string modify_mixlist;
  // Several chips (a system) rather than the one chip of a plain device.
  bool multichip() const { return !system.empty() || chips > 1; }
};

// Reads the NPUSIM_* variables above; an unknown precision mode is invalid_argument.
rt::Status settings_from_env(PluginSettings* out);

// The settings the device was opened with (valid once device_if_open() is non-null).
const PluginSettings& opened_settings();

// The system the settings ask for (multichip() settings only; NPUSIM_CHIPS and NPUSIM_SYSTEM
// above). invalid_argument naming the setting, file and key when it does not load, or when
// NPUSIM_CHIPS asks for more chips than NPUSIM_SYSTEM has or for a count its servers cannot
// make.
rt::Status system_from_settings(const PluginSettings& s, SystemConfig* out);

// The number of NPU devices: the opened devices' count, else what the environment asks for (1
// when it asks for nothing, or is invalid: the error then comes at the device's open).
int device_count();

// Opens the device (or the system's devices) with settings_from_env() on first call; later
// calls return the same device. A failed open is returned to every caller (the chip cannot be
// elaborated twice). The first form gives chip 0's device; a chip that does not exist is
// invalid_argument.
rt::Status open_device(std::shared_ptr<rt::Device>* out);
rt::Status open_device(int chip, std::shared_ptr<rt::Device>* out);

// Device memory for a tensor of `bytes` (TensorFlow's tensors, derived tensors), isolated in L2
// lines of its own: compiled kernels may read up to compiler::kDeviceBufferAlign bytes before
// and past a tensor (op_desc.h), so the block holds one guard line before the tensor and that
// many bytes after it. No other tensor's line is then ever touched by a launch reading this
// one, and the launch's L2 hits do not depend on what lies next to it (docs/tf_plugin.md,
// "Device memory"). free_tensor takes the address malloc_tensor gave.
rt::Status malloc_tensor(rt::Device& device, uint64_t bytes, uint64_t* addr);
rt::Status free_tensor(rt::Device& device, uint64_t addr);

// The device if it has been opened, else null (several NPUs: chip 0's).
std::shared_ptr<rt::Device> device_if_open();
// Every NPU device (chip k's at k) if they have been opened, else none.
std::vector<std::shared_ptr<rt::Device>> open_devices();

// TF status code for a runtime status code (docs/runtime.md, "How the TensorFlow plugin maps").
TF_Code tf_code(rt::StatusCode code);
// Copies st into tf (TF_OK and an empty message when st is ok).
void set_tf_status(const rt::Status& st, TF_Status* tf);
// The runtime status for a TF_Status (used for host callbacks' results).
rt::Status from_tf_status(const TF_Status* tf, const std::string& where);

// Writes "npusim: <message>" to stderr: for errors TensorFlow gives no way to report (a stream
// error is fatal to TensorFlow, so the StreamExecutor callbacks log them instead).
void log_error(const std::string& message);
// Writes "npusim: warning: <message>" to stderr: for what works but the user should know
// (an op falling back to the CPU, cpu_fallbacks.h).
void log_warning(const std::string& message);

}  // namespace npusim::tf
