// A compiled offline model: what an .om file holds and what the runner executes
// (docs/graph_engine.md, ".om file"). Device memory is two regions the runner places anywhere:
// the constant region (weights, and the derived tensors of weights computed once when the model
// is loaded) and the activation region (every activation, graph input and output and op
// workspace at the offset the static memory plan gave it).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "adapter/compiler/op_desc.h"
#include "isa/isa.h"

namespace npusim::graph {

enum class Region : uint8_t { kConstant = 0, kActivation = 1 };

// One kernel argument: a scalar, or a byte offset into a region.
struct ArgValue {
  bool scalar = false;
  Region region = Region::kActivation;
  uint64_t value = 0;  // the scalar, or the offset
};

// A buffer of the static plan: an activation buffer, a constant, or a weight's derived tensor
// kept in the constant region; [offset, offset + bytes) of its region. `written`: the task may
// write it (an output or the workspace of its node), else it only reads it (an input, a constant,
// a kept derived tensor). An .om written before tasks recorded it reads every activation buffer
// as written.
struct TaskBuffer {
  Region region = Region::kActivation;
  uint64_t offset = 0, bytes = 0;
  bool written = false;
};

// One launch of the task list.
struct Task {
  std::string node;     // the graph node it belongs to (original TF name)
  std::string op_type;  // the (fused) op type, as reports show it
  int kernel = 0;       // index into OmModel::kernels
  int block_dim = 1;
  std::vector<ArgValue> args;                         // in ldarg order
  std::vector<compiler::TensorDesc> inputs, outputs;  // the node's tensors, for reports
  // The buffers its tensors lie in (inputs, outputs, workspace, kept derived tensors), each
  // once, pairwise disjoint: the runner passes them as the launch's planned blocks
  // (KernelLaunch::planned_blocks), so a cold L2 files the launch's lines by buffer. Empty in an
  // .om written before tasks recorded them (the launch's lines are then filed by region).
  std::vector<TaskBuffer> buffers;
};

// A graph input or output: where its bytes live.
struct IoBinding {
  std::string name;  // the signature's name
  compiler::TensorDesc desc;
  Region region = Region::kActivation;
  uint64_t offset = 0;
};

struct OmModel {
  std::string chip_name;
  std::string chip_yaml;  // dump_chip_config_yaml of the chip compiled for
  std::string precision;  // CANN precision mode name
  std::vector<IoBinding> inputs, outputs;
  std::vector<isa::Program> kernels;
  std::vector<Task>
      init_tasks;           // run once after the constants are loaded (weights' derived tensors)
  std::vector<Task> tasks;  // run per inference, in order, on one stream
  std::vector<uint8_t> constants;  // the constant region's initial bytes
  uint64_t activation_bytes = 0;   // the activation region's size (the plan's peak)
  nlohmann::json info;             // the fused graph, fusions and memory plan (compile report)
};

// The .om format: the magic "NPUSIMOM", a little-endian u32 format version, u32 0, u64 payload
// size, u64 FNV-1a 64 checksum of the payload, then the payload: u64 header size, the header
// (JSON: chip, precision, inputs, outputs, tasks, info, where each blob lies) and the blobs
// (each kernel in the .npuk format, docs/assembly.md, and the constant region).
inline constexpr char kOmMagic[8] = {'N', 'P', 'U', 'S', 'I', 'M', 'O', 'M'};
inline constexpr uint32_t kOmVersion = 1;

std::vector<uint8_t> serialize_om(const OmModel& m);
// The checksum of a payload (FNV-1a 64), as the file stores it.
uint64_t om_checksum(const uint8_t* payload, size_t bytes);
// Throws npusim::Error starting with `source` for a file that is not an .om, of another format
// version, truncated, corrupt (checksum), or malformed inside (a blob out of range, a task
// naming no kernel, an argument outside its region).
OmModel parse_om(const std::vector<uint8_t>& bytes, const std::string& source);

void write_om_file(const OmModel& m, const std::string& path);
OmModel read_om_file(const std::string& path);

}  // namespace npusim::graph
