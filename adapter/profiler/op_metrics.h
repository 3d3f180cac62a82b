// What a report knows about one kernel launch (an "op", as msprof calls a task), and the figures
// computed from it and the chip config: the numbers behind op_summary.csv, op_statistic.csv and
// summary.txt (docs/reports.md gives every formula).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "adapter/profiler/instruction_profiler.h"
#include "isa/isa.h"
#include "sim/config/chip_config.h"
#include "sim/counters/counters.h"

namespace npusim::prof {

// One input or output tensor of an op, as msprof lists them.
struct TensorDesc {
  std::vector<int64_t> shape;
  std::string dtype;            // msprof/TF name: "DT_FLOAT16", "DT_FLOAT", "DT_BF16", "DT_INT8"
  std::string format = "ND";    // "ND" (GM tensors of the kernels here are row-major)
};
// The msprof name of an ISA element type ("DT_FLOAT16" for f16); "UNDEFINED" for NONE.
std::string msprof_dtype(isa::Dtype t);

// One kernel launch. The runtime's LaunchRecord or the CLI's KernelResult fill it; a TF run adds
// the op's name, type and tensors.
struct OpRecord {
  std::string op_name;    // msprof "Op Name": the kernel, or the TF node name
  std::string op_type;    // msprof "OP Type": the kernel name for hand-written kernels, TF op type
  std::string task_type;  // "AI_CORE", "AI_VECTOR_CORE" or "MIX_AIC" (task_type_of)
  // The kernel (isa::Program::name) when it differs from op_name: a TF op's launches; op_summary
  // then has a `kernel` column. "" for the CLI's ops.
  std::string kernel;
  // A launch of a multi-tensor optimizer update (rt::LaunchLabel::members): the original node
  // names of the members it computes (op_name is the merged node's); op_summary then has a
  // `members` column (the names joined by ';'). Empty otherwise.
  std::vector<std::string> members;
  uint64_t stream = 0;
  int chip = 0;              // the chip it ran on (a system run's reports; 0 for one chip)
  uint64_t start_cycle = 0;  // on the device timeline, AI-core cycles
  uint64_t cycles = 0;       // duration
  uint64_t wait_cycles = 0;  // gap since the previous op on the timeline ended (set_wait_cycles)
  // Host dispatch of the op paid just before the launch (rt::LaunchRecord), inside wait_cycles.
  uint64_t host_dispatch_cycles = 0;
  int block_dim = 0;
  int mix_block_dim = 0;     // blocks of the mix partner (vector) cores; 0 unless MIX_AIC
  std::vector<TensorDesc> inputs, outputs;
  // The launch's counters (KernelResult::counter_delta, rt::LaunchRecord::counter_delta): flat and
  // shared, so a run's thousands of records hold no trees; read_launch_counters reads it,
  // .tree() builds the tree where a report writes one.
  CounterDelta counters;
  std::shared_ptr<const InstructionTable> instructions;  // null if not profiled
};

// msprof's task type of a program on a chip: split chips: "AI_CORE" (cube only), "AI_VECTOR_CORE"
// (vector only), "MIX_AIC" (both); coupled chips: "AI_CORE".
std::string task_type_of(const isa::Program& prog, const ChipConfig& cfg);
// Mix Block Dim: for a mix kernel on a split chip, block_dim x its vector cores per block
// (mix_aiv_per_block: the program's declared ratio, else the chip's aiv_per_aic; the vector blocks
// that run with the cube blocks); else 0.
int mix_block_dim_of(const isa::Program& prog, const ChipConfig& cfg, int block_dim);
// Sets each op's wait_cycles to its start minus the end of the op before it in `ops` (the first:
// minus `origin_cycle`), or 0 if they overlap. The ops must be in launch order.
void set_wait_cycles(std::vector<OpRecord>& ops, uint64_t origin_cycle = 0);

// Chip peaks, per AI-core cycle, from the config.
struct ChipPeaks {
  int cube_cores = 0;            // cores with a cube pipe (aic or aicore)
  int vector_cores = 0;          // cores with a vector pipe (aiv or aicore)
  double macs_per_cycle = 0;     // cube_m * cube_k * cube_n * cube_cores (fp16)
  double vector_bytes_per_cycle = 0;  // vector_bytes_per_cycle * vector_cores
  double hbm_bytes_per_cycle = 0;
};
ChipPeaks chip_peaks(const ChipConfig& cfg);

// The units behind msprof's ratio columns, in column order: the ratio's name ("aic_<name>_ratio"),
// the pipe and the pipe counter it reads. msprof counts an instruction's cycles; for MTE1 its
// documentation says the time excludes waiting for the transfer, for the pipes that move data
// to or from GM (MTE2, MTE3, FIXPIPE) it does not, so those read inflight_cycles (from an
// instruction's start until its data has landed) and the others busy_cycles (docs/reports.md).
struct UnitRatio {
  const char* name;
  const char* pipe;
  const char* counter = "busy_cycles";
};
inline constexpr UnitRatio kCubeSideUnits[] = {{"mac", "m"},
                                               {"scalar", "s"},
                                               {"mte1", "mte1"},
                                               {"mte2", "mte2", "inflight_cycles"},
                                               {"fixpipe", "fix", "inflight_cycles"}};
inline constexpr UnitRatio kVectorSideUnits[] = {
    {"vec", "v"}, {"scalar", "s"}, {"mte2", "mte2", "inflight_cycles"},
    {"mte3", "mte3", "inflight_cycles"}};

// The msprof ratios of one side of an op: the cube side ("aic": mac, scalar, mte1, mte2, fixpipe)
// or the vector side ("aiv": vec, scalar, mte2, mte3). On a coupled chip both sides describe the
// same AI cores (the aic side their cube, the aiv side their vector unit).
struct SideMetrics {
  bool present = false;     // cores of this side ran the op
  int cores = 0;            // cores that ran a block
  uint64_t total_cycles = 0;  // sum over those cores of active_cycles (msprof *_total_cycles)
  double time_us = 0;       // total_cycles / cores / clock_mhz: mean active time per core
  // busy cycles of the unit summed over those cores / total_cycles; keys as in msprof
  // ("mac", "scalar", "mte1", "mte2", "fixpipe"; "vec", "scalar", "mte2", "mte3").
  std::map<std::string, double> ratio;
};

struct OpMetrics {
  double start_us = 0, duration_us = 0, wait_us = 0;
  // The task overheads in the duration (counter chip.task_overhead_cycles: dispatch, block
  // starts of the worker that ended last, completion; docs/chip_model.md "Task overheads").
  uint64_t task_overhead_cycles = 0;
  double task_overhead_us = 0;
  SideMetrics aic, aiv;
  uint64_t macs = 0;            // cube MACs (fp16 equivalents)
  uint64_t vector_repeats = 0;
  // 100 x macs / (ChipPeaks::macs_per_cycle x cycles): against the whole chip's cube peak.
  double cube_utilization_pct = 0;
  // mte2_ratio / max(mac_ratio, vec_ratio), the mte2 ratio of the side(s) that ran (the larger);
  // nullopt when neither the cube nor the vector unit was busy.
  std::optional<double> memory_bound;
  // Roofline: the shortest time the chip's peaks allow, in cycles:
  //   max(macs / macs_per_cycle, vector_repeats x 256 B / vector_bytes_per_cycle,
  //       (hbm_read_bytes + hbm_write_bytes) / hbm_bytes_per_cycle)
  // (a vector repeat processes 256 bytes; HBM bytes are the GM bytes that missed L2).
  double roofline_bound_cycles = 0;
  double roofline_bound_us = 0;
  std::optional<double> roofline_ratio;  // cycles / roofline_bound_cycles; nullopt if bound 0
  uint64_t gm_read_bytes = 0, gm_write_bytes = 0;   // over data paths from / to GM
  uint64_t hbm_read_bytes = 0, hbm_write_bytes = 0;
  uint64_t l2_hits = 0, l2_misses = 0;              // lines
  std::optional<double> l2_hit_rate;               // hits / (hits + misses)
  std::map<std::string, uint64_t> stall_cycles;    // cause -> cycles summed over cores and units
  std::map<std::string, uint64_t> path_bytes;      // "gm_to_l1" -> bytes
};

OpMetrics compute_op_metrics(const OpRecord& op, const ChipConfig& cfg);

// The roofline bound in cycles of work that does `macs` cube MACs (fp16 equivalents),
// `vector_repeats` vector repeats and moves `hbm_bytes` to or from HBM (formula above).
double roofline_cycles(const ChipPeaks& peaks, uint64_t macs, uint64_t vector_repeats,
                             uint64_t hbm_bytes);

}  // namespace npusim::prof
