// The chip's kernels as a TensorFlow profiler XSpace (tsl/profiler/protobuf/xplane.proto), the
// format `tf.profiler.experimental` writes to `plugins/profile/<run>/<host>.xplane.pb` and
// TensorBoard's profile plugin reads. The TF plugin returns it from its pluggable profiler
// (adapter/tf/plugin/tf_profiler.cpp); TensorFlow merges its planes into the host's XSpace.
//
// The message is written here with a small protobuf wire-format writer instead of TensorFlow's
// generated C++ classes: those need TensorFlow's protobuf and abseil headers and the wheel's ABI
// flags in the translation unit, which then could include no npusim header (the split of
// kernels_resource_variables.cpp), and would tie this library, which the command line uses
// without TensorFlow, to TensorFlow. XSpace is four small nested messages.
//
// Docs: docs/reports.md, "TensorBoard (TensorFlow's profiler)".
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "adapter/runtime/stream.h"
#include "sim/config/chip_config.h"

namespace npusim::prof {

// Protobuf wire format (varints, 64-bit doubles, length-delimited fields), enough for XSpace.
class ProtoWriter {
 public:
  void int64_field(int field, int64_t v);  // proto int64: two's complement varint
  void uint64_field(int field, uint64_t v);
  void double_field(int field, double v);
  void string_field(int field, const std::string& bytes);  // string, bytes or a sub-message
  const std::string& bytes() const { return m_bytes; }

 private:
  void varint(uint64_t v);
  void tag(int field, int wire_type);
  std::string m_bytes;
};

// What maps the device timeline onto the profile's: the device time `origin_cycle` (AI-core
// cycles) is the host wall-clock instant `origin_walltime_ns` (ns since the Unix epoch, the
// clock of TensorFlow's host events), and device time advances at the chip's clock_mhz from
// there. Launches that start in [origin_cycle, end_cycle) are in the profile.
struct XPlaneWindow {
  int device_ordinal = 0;
  uint64_t origin_cycle = 0;
  uint64_t end_cycle = std::numeric_limits<uint64_t>::max();
  int64_t origin_walltime_ns = 0;
};

// The plane's name: "/device:CUSTOM:NPU:<ordinal>". TensorBoard's trace viewer shows host
// planes and device planes named "/device:GPU:", "/device:TPU:" or "/device:CUSTOM:" only; a
// "/device:NPU:0" plane would be in the file but never drawn.
std::string npu_plane_name(int device_ordinal);

// Picoseconds of `cycles` AI-core cycles at `clock_mhz`, rounded to the nearest.
int64_t cycles_to_ps(uint64_t cycles, double clock_mhz);

// The serialized XSpace with one plane, npu_plane_name(w.device_ordinal):
//   - a line per runtime stream ("Stream #<id>", line id stream + 1) with one event per launch:
//     metadata name = the kernel, offset = cycles_to_ps(start_cycle - origin_cycle), duration =
//     cycles_to_ps(the report's task_duration_cycles), stats tf_op ("<node name>:<op type>", as
//     TensorFlow's host events), task_id (position in the window), task_type, block_dim,
//     start_cycle, cycles;
//   - a line "TensorFlow Ops" (id 0) with one event per run of a TF op, from its first kernel's
//     start to its last kernel's end (metadata name = node name, stats tf_op, kernels);
//   - plane stats clock_mhz, origin_cycle, end_cycle, chip.
// `launches` are the device's launches that start at or after w.origin_cycle, in launch order
// (those from end_cycle on only serve to give the window's last task the report's duration).
std::string npu_xspace(const std::vector<rt::LaunchRecord>& launches, const ChipConfig& cfg,
                       const XPlaneWindow& w);

// One such plane (a serialized XPlane) for chip w.device_ordinal of a system, with, besides
// npu_xspace's lines, a line "Communication" (id kCommLineId) with one event per collective of
// `comms` whose communicator holds the chip and that starts in the window: metadata name
// "hcom_<collective>" (e.g. hcom_all_reduce), offset and duration from its start and end cycle,
// stats id, label, algorithm, bytes (one rank's buffer), chips ("0,1"), rank, start_cycle,
// cycles.
inline constexpr int64_t kCommLineId = int64_t{1} << 40;
std::string npu_xplane(const std::vector<rt::LaunchRecord>& launches,
                       const std::vector<rt::CollectiveRecord>& comms, const ChipConfig& cfg,
                       const XPlaneWindow& w);

// A serialized XSpace of serialized XPlanes.
std::string xspace_of(const std::vector<std::string>& planes);

}  // namespace npusim::prof
