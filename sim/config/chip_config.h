// A chip description, loaded from configs/chips/<name>.yaml plus overrides. All hardware numbers
// of the model come from here; units are in the field names (bytes, cycles, MHz, GB/s).
// The simulator's time unit is one AI-core clock cycle; bandwidths given in GB/s are converted to
// bytes per core cycle with clock_mhz.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "isa/isa.h"

namespace npusim {

// Per core kind (aic, aiv or aicore): which pipes and buffers it has.
struct CoreKindConfig {
  isa::CoreKind kind = isa::CoreKind::AICORE;
  int count = 0;                                // number of cores of this kind
  std::vector<isa::Pipe> pipes;                 // pipes present (S always)
  std::map<isa::Buf, uint64_t> buffer_bytes;    // on-chip buffers present and their capacity
  bool has(isa::Pipe p) const;
  bool has(isa::Buf b) const;
  uint64_t capacity(isa::Buf b) const;          // 0 if absent
};

struct ChipConfig {
  std::string name;         // preset name, e.g. "910b"
  std::string source_file;  // YAML file it came from (for error messages)

  // chip
  double clock_mhz = 0;     // AI core clock
  bool split = false;       // split cube (aic) and vector (aiv) cores, else coupled (aicore)
  std::vector<CoreKindConfig> core_kinds;  // split: {aic, aiv}; coupled: {aicore}
  int aiv_per_aic = 2;      // split chips: vector cores per cube core in a mix group

  // buffer alignment requirements in bytes
  std::map<isa::Buf, uint32_t> align_bytes;

  // UB banking: banks, bank groups, bytes per bank row; one read or one write per group per cycle
  int ub_banks = 0, ub_bank_groups = 0, ub_bank_width_bytes = 0;

  // cube
  int cube_m = 16, cube_k = 16, cube_n = 16;  // fp16 MACs per cycle = m*k*n
  int cube_int8_k = 32;                       // int8 k per cycle (16x32x16)
  int cube_fp32_rate_divisor = 0;             // fp32 on the cube at 1/N rate; 0 = not supported
  bool cube_bf16 = true;
  int cube_latency_cycles = 0;                // pipeline fill per mmad

  // vector
  int vector_bytes_per_cycle = 256;           // one repeat (256 B) per cycle
  int vector_latency_cycles = 0;              // pipeline fill per instruction
  int vector_reduce_factor = 2;               // reductions take N x an element-wise repeat
  int vector_transcendental_factor = 1;       // exp/ln/sqrt/div take N x an add repeat
  // The vector unit has Ascend's AddReluCast (vaddreluconv: add, max 0, f32 -> f16 in one
  // instruction); chips whose arch the API reference lists (docs/assembly.md).
  bool vector_add_relu_conv = false;
  // The vector unit has Ascend's MulAddDst (vmla: dst = src0 * src1 + dst, f16 and f32);
  // chips whose products the API reference lists (docs/assembly.md).
  bool vector_multiply_accumulate = false;
  // Whether the vector unit computes on bf16 operands (arithmetic, compares, reductions);
  // false: bf16 only moves (vcopy, vsel, vtranspose) and converts (vconv, vdup), the verifier
  // refuses the rest, and the compiler computes bf16 in f32 (docs/compiler.md).
  bool vector_bf16_arithmetic = true;
  // Whether the vector unit converts to and from bf16 (vconv, and vdup's fp32 scalar rounded to
  // bf16); false: no bf16 at all (the 910 and 310P: Ascend C's Cast tables list no bf16 there),
  // and the compiler refuses bf16 tensors (docs/compiler.md).
  bool vector_bf16_conversion = true;

  // scalar
  int scalar_cycles_per_insn = 1;
  int issue_queue_depth = 32;                 // per-pipe instruction queue capacity

  // data paths: bytes per cycle per core for "src->dst" (e.g. "gm->l1", "l1->l0a"), and their
  // fixed start latency in cycles. A path absent here is illegal on this chip.
  std::map<std::pair<isa::Buf, isa::Buf>, double> path_bytes_per_cycle;
  std::map<std::pair<isa::Buf, isa::Buf>, int> path_latency_cycles;
  bool has_path(isa::Buf src, isa::Buf dst) const;
  double path_rate(isa::Buf src, isa::Buf dst) const;   // throws ConfigError if absent
  int path_latency(isa::Buf src, isa::Buf dst) const;

  // memory system (shared by all cores)
  uint64_t hbm_bytes = 0;           // device memory capacity
  double hbm_gbps = 0;              // HBM peak bandwidth, GB/s (10^9 B/s)
  // Sustained / peak HBM rate, in (0, 1]: what the memory system moves per cycle of a stream is
  // hbm_gbps * hbm_efficiency (refresh, bank and bus-turnaround losses of the DRAM); peak
  // figures (rooflines, the bandwidth TensorFlow is told) keep hbm_gbps.
  double hbm_efficiency = 1.0;
  // Share of that sustained rate lost while HBM carries an even mix of reads and writes (the
  // data bus turning around between directions), in [0, 1); at a write share f of the bytes in
  // flight the loss is hbm_turnaround_loss * 2 * min(f, 1 - f): none for a one-way stream.
  double hbm_turnaround_loss = 0.0;
  uint64_t l2_bytes = 0;            // L2 capacity
  double l2_gbps = 0;               // L2 bandwidth, GB/s
  uint32_t l2_line_bytes = 512;
  int l2_ways = 16;
  int hbm_latency_cycles = 0;       // added once per GM transfer that misses L2
  // Per-core port rates into the memory system, bytes per cycle: GM traffic that hits in L2
  // moves at up to l2_*_bytes_per_cycle per core; traffic that misses goes to HBM at up to the
  // core's GM path rate (path_bytes_per_cycle of gm->l1 / gm->ub / ub->gm / l0c->gm).
  double l2_read_bytes_per_cycle = 0;
  double l2_write_bytes_per_cycle = 0;
  // A vector core's UB -> GM writes that land in L2 move at up to this rate instead (the
  // platform file's ub_to_l2_rate); 0: l2_write_bytes_per_cycle, as every other writer.
  double l2_ub_write_bytes_per_cycle = 0;
  int l2_latency_cycles = 0;        // added once per GM transfer that hits L2
  // false: the L2 starts cold at every launch (a launch's timing does not depend on what ran
  // before it); true: its lines stay from one launch to the next, as on silicon, so a consumer
  // can hit on its producer's output (host-to-device copies drop the lines they overwrite).
  bool l2_keep_across_launches = false;
  // With l2_keep_across_launches false: true keeps the L2 from one launch to the next within a
  // graph run (KernelLaunch::l2_run: a TF graph's launches queued as one task list, an offline
  // model's run), which issues the same launches in the same order every time. The run starts
  // cold; its lines are filed by allocation block with one block placement for the whole run
  // (sim/chip/l2_placement.h), so its timing does not depend on where the allocator put its
  // tensors. A launch in no run starts cold and leaves the run's L2 as it was.
  bool l2_keep_within_graph_run = false;
  // false: writes go through to HBM (a write into a line present is absorbed by it); true:
  // write-back, write-allocate: a write miss allocates a dirty line at L2 bandwidth and HBM sees
  // the line only when it is evicted (sim/chip/l2_tags.h).
  bool l2_write_back = false;
  // Write-back L2 only. false: the dirty lines a transfer evicts go to HBM in a flow of their
  // own that the transfer does not wait for; true: the transfer completes only once that flow
  // has (the L2 holds the allocation until its victims are out).
  bool l2_write_back_waits = false;
  // The L2's set index: false, a line's set is its line address modulo the sets; true, each
  // page of `sets` consecutive lines is rotated by its own offset (L2Tags::set_of), so strided
  // accesses whose pitch divides the sets do not crowd a fraction of them while every run of
  // consecutive lines still spreads as evenly as under modulo (docs/chip_model.md "Memory
  // system").
  bool l2_page_rotation = false;
  // Bytes per cycle one L2 line serves to the reads of it in flight, shared among them: reads
  // of one line by several transfers at once are served one after another, so each of k
  // concurrent readers of a line gets this / k of it (MemorySystem; docs/chip_model.md "Memory
  // system"). 0: no such limit (every reader at its own port rate).
  double l2_line_read_bytes_per_cycle = 0;
  // The L2 serves a read in whole granules of this many bytes, aligned to it: each GM range a
  // read looks up takes the L2's shared bandwidth (memory.l2.gbps) for every granule it
  // touches, whole, while the core's port moves only the bytes asked for (MemorySystem;
  // docs/chip_model.md "Memory system"). 0: no rounding (the bytes asked for).
  uint64_t l2_read_granule_bytes = 0;

  // MTE2's ND -> NZ loads (nd2nz): the engine issues one GM request per ND row and at most one
  // row every nd2nz_row_cycles cycles, so a row takes max(its bytes at the path's rate,
  // nd2nz_row_cycles); 0: no per-row cost (docs/chip_model.md "Memory system").
  double nd2nz_row_cycles = 0;
  // The DMA's issue of a GM <-> UB / L1 copy (copy_gm2ub, copy_gm2l1, nd2nz on MTE2;
  // copy_ub2gm on MTE3): the pipe spends at least copy_issue_cycles + burst_cycles x (the
  // copy's GM bursts: each contiguous GM run cut at 512-byte boundaries, mte::gm_bursts) on
  // the copy, cycles of this clock; its data still moves as the memory system's flow, so the
  // copy holds the pipe max(that, the flow's time). 0 and 0: no such minimum
  // (docs/chip_model.md "Memory system").
  double copy_issue_cycles = 0;
  double burst_cycles = 0;

  // Task overheads (docs/chip_model.md, "Task overheads"): a launch's Task Duration is
  // task_dispatch + for the blocks of the worker that ends last (task_block_start + its busy
  // time) + task_done, as msprof's Task Duration includes them.
  double task_dispatch_us = 0;      // per launch: the task scheduler reads the task and hands
                                    // out the first blocks
  int task_block_start_cycles = 0;  // per block: a core starts it (fetch, arguments)
  double task_done_us = 0;          // per launch: completion of the last block reported and
                                    // the stream notified
  // Host-side dispatch (docs/runtime.md, "Host dispatch"): what the host spends launching one
  // op in eager execution, and one graph run as one task list.
  double host_op_dispatch_us = 0;
  double host_graph_dispatch_us = 0;

  // The AI CPU (docs/runtime.md, "The AI CPU timeline"): the SoC's ARM cores that run AI CPU
  // kernels beside the AI cores, on a timeline of their own. 0 cores (no `ai_cpu:` section): the
  // chip models none, and an AI CPU task is refused.
  int ai_cpu_cores = 0;
  double ai_cpu_clock_mhz = 0;
  double ai_cpu_task_us = 0;  // per task: the AI CPU scheduler starts it and reports its end
  // DropOutGenMask on one AI CPU core: AI CPU cycles per 128 mask bits (one bit per element).
  double ai_cpu_gen_mask_cycles_per_128_bits = 0;

  // host-device link (HDC over PCIe)
  double hdc_gbps = 0;              // GB/s per direction
  double hdc_latency_us = 0;        // per transfer

  // synchronisation
  int flag_ids = 8;                 // event ids per pipe pair
  int cross_core_flag_ids = 11;     // cross-core flag ids (split chips)
  int cross_core_max_pending = 15;
  // Whether a set_flag executed by a pipe holds that pipe until the GM transfers it issued
  // before have landed (true), or lets the pipe go on at once and only delays the flag's
  // effect to the landing (false; CANN's CCE intrinsics reference: set_flag "does not block
  // the next instruction of the same pipe"). docs/chip_model.md, "Pipes".
  bool set_flag_holds_pipe = true;

  // derived helpers
  double hbm_bytes_per_cycle() const { return hbm_gbps * 1e3 / clock_mhz; }  // peak
  // What a transfer over HBM moves per cycle (peak x efficiency): every simulated HBM access.
  double hbm_sustained_bytes_per_cycle() const { return hbm_bytes_per_cycle() * hbm_efficiency; }
  // The memory system's HBM rate, bytes per cycle, while a share write_share of its bytes in
  // flight are writes (sustained rate less the turnaround loss of that mix).
  double hbm_mixed_bytes_per_cycle(double write_share) const;
  double l2_bytes_per_cycle() const { return l2_gbps * 1e3 / clock_mhz; }
  double hdc_bytes_per_cycle() const { return hdc_gbps * 1e3 / clock_mhz; }
  double cycles_to_us(double cycles) const { return cycles / clock_mhz; }
  // Microseconds as whole AI-core cycles at clock_mhz (rounded to nearest).
  uint64_t us_to_cycles(double us) const;
  uint64_t task_dispatch_cycles() const { return us_to_cycles(task_dispatch_us); }
  uint64_t task_done_cycles() const { return us_to_cycles(task_done_us); }
  const CoreKindConfig* core_kind(isa::CoreKind k) const;  // nullptr if the chip has none
  int total_cores() const;
};

// Loads a preset by name (looked up in configs/chips/) or a YAML file path, then applies
// overrides: each "dotted.key=value" replaces one key of the YAML tree before it is parsed.
// Errors (missing file, unknown/missing key, bad value, inconsistent values) throw ConfigError
// naming the file and the key.
ChipConfig load_chip_config(const std::string& name_or_path,
                            const std::vector<std::string>& overrides = {});

// The directory that holds the chip presets (NPUSIM_CONFIG_DIR or the source tree's configs/chips).
std::string chip_config_dir();
// Names of all presets found in chip_config_dir().
std::vector<std::string> list_chip_presets();

// The resolved configuration as YAML text (written next to every result).
std::string dump_chip_config_yaml(const ChipConfig& cfg);

}  // namespace npusim
