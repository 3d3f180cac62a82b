// The YAML loader of chip configurations: presets, `extends`, command-line overrides, checks and
// the resolved dump. The schema (every key, its unit and meaning) is documented in
// docs/configs.md; kSchemaKeys below is the list of keys the loader accepts.
//
// A file is flattened into a map from dotted key ("memory.l2.bytes") to a leaf value (scalar,
// list or null) that remembers where it was set. `extends` loads the base file's map and lays the
// file's own leaves over it (a null leaf deletes the key and everything below it); overrides are
// then laid over the result; only then is the map parsed into a ChipConfig.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "common/error.h"
#include "common/input_file.h"
#include "sim/config/chip_config.h"
#include "sim/config/config_tree.h"
#include "sim/memory/device_memory.h"

#ifndef NPUSIM_CONFIG_DIR
#define NPUSIM_CONFIG_DIR "configs/chips"
#endif

namespace npusim {
namespace {

namespace fs = std::filesystem;
using namespace config_tree;
using isa::Buf;
using isa::CoreKind;
using isa::Pipe;

// Every key of the schema. Placeholders: <kind> = aic | aiv | aicore; <buf> = an on-chip buffer
// (l1, l0a, l0b, l0c, ub, bt, fb); <anybuf> = gm or an on-chip buffer; <path> = <anybuf>-><anybuf>.
const char* const kSchemaKeys[] = {
    "name",
    "clock_mhz",
    "organisation",
    "cores.<kind>.count",
    "cores.aiv.per_aic",
    "cores.<kind>.pipes",
    "cores.<kind>.buffers.<buf>",
    "alignment.<anybuf>",
    "ub_banking.banks",
    "ub_banking.bank_groups",
    "ub_banking.bank_width_bytes",
    "cube.m",
    "cube.k",
    "cube.n",
    "cube.int8_k",
    "cube.fp32_rate_divisor",
    "cube.bf16",
    "cube.latency_cycles",
    "vector.bytes_per_cycle",
    "vector.latency_cycles",
    "vector.reduce_factor",
    "vector.transcendental_factor",
    "vector.add_relu_conv",
    "vector.multiply_accumulate",
    "vector.bf16_arithmetic",
    "vector.bf16_conversion",
    "scalar.cycles_per_insn",
    "issue_queue_depth",
    "paths.<path>.bytes_per_cycle",
    "paths.<path>.latency_cycles",
    "memory.hbm.bytes",
    "memory.hbm.gbps",
    "memory.hbm.efficiency",
    "memory.hbm.turnaround_loss",
    "memory.hbm.latency_cycles",
    "memory.l2.bytes",
    "memory.l2.gbps",
    "memory.l2.line_bytes",
    "memory.l2.ways",
    "memory.l2.latency_cycles",
    "memory.l2.core_read_bytes_per_cycle",
    "memory.l2.core_write_bytes_per_cycle",
    "memory.l2.ub_write_bytes_per_cycle",
    "memory.l2.keep_across_launches",
    "memory.l2.keep_within_graph_run",
    "memory.l2.write_back",
    "memory.l2.write_back_waits",
    "memory.l2.page_rotation",
    "memory.l2.line_read_bytes_per_cycle",
    "memory.l2.read_granule_bytes",
    "mte.nd2nz_row_cycles",
    "mte.copy_issue_cycles",
    "mte.burst_cycles",
    "task.dispatch_us",
    "task.block_start_cycles",
    "task.done_us",
    "host.op_dispatch_us",
    "host.graph_dispatch_us",
    "ai_cpu.cores",
    "ai_cpu.clock_mhz",
    "ai_cpu.task_us",
    "ai_cpu.gen_mask_cycles_per_128_bits",
    "hdc.gbps",
    "hdc.latency_us",
    "sync.flag_ids",
    "sync.cross_core_flag_ids",
    "sync.cross_core_max_pending",
    "sync.set_flag_holds_pipe",
};

constexpr CoreKind kCoreKinds[] = {CoreKind::AIC, CoreKind::AIV, CoreKind::AICORE};

std::optional<std::pair<Buf, Buf>> parse_path_name(const std::string& s) {
  size_t arrow = s.find("->");
  if (arrow == std::string::npos) return std::nullopt;
  auto src = isa::buf_from_name(s.substr(0, arrow));
  auto dst = isa::buf_from_name(s.substr(arrow + 2));
  if (!src || !dst) return std::nullopt;
  return std::make_pair(*src, *dst);
}

std::string path_name(Buf src, Buf dst) {
  return fmt::format("{}->{}", isa::buf_name(src), isa::buf_name(dst));
}

// The values a placeholder stands for.
std::vector<std::string> placeholder_values(const std::string& ph) {
  std::vector<std::string> v;
  if (ph == "<kind>") {
    for (CoreKind k : kCoreKinds) v.push_back(isa::core_kind_name(k));
  } else if (ph == "<buf>" || ph == "<anybuf>") {
    for (int b = ph == "<buf>" ? 1 : 0; b < isa::kNumBufs; ++b)
      v.push_back(isa::buf_name(static_cast<Buf>(b)));
  } else if (ph == "<path>") {
    for (int s = 0; s < isa::kNumBufs; ++s)
      for (int d = 0; d < isa::kNumBufs; ++d)
        if (s != d) v.push_back(path_name(static_cast<Buf>(s), static_cast<Buf>(d)));
  }
  return v;
}

// The chip schema: kSchemaKeys with their placeholders.
const Schema& chip_schema() {
  static const Schema schema{
      std::vector<std::string>(std::begin(kSchemaKeys), std::end(kSchemaKeys)),
      [](const std::string& pattern, const std::string& part) {
        if (pattern == "<path>") return parse_path_name(part).has_value();
        auto values = placeholder_values(pattern);
        return std::find(values.begin(), values.end(), part) != values.end();
      },
      placeholder_values};
  return schema;
}

PresetDir chip_presets() { return PresetDir{"chip", chip_config_dir()}; }

// Ranges of the values. Every bound follows from one of these facts of the model:
//  - Simulated time is an sc_time: a uint64 count of 1 ps steps (the resolution the Simulator
//    sets), one AI-core cycle being 1000 ps (sim/core/core_env.h). Its range is 2^64 ps, about
//    1.8e16 cycles (~2^54); its resolution 1/1000 cycle.
//  - Device addresses are 48 bits wide (the virtual address width of current 64-bit hosts and
//    NPUs): the device memory's page directory (sim/memory/device_memory.h) covers them with
//    8 MiB of host memory.
//  - Each core's buffers are mapped in host memory, and one instruction moves at most one
//    buffer's worth of data (its on-chip end lies in one buffer).
constexpr uint64_t kMaxSimCycles = ~uint64_t{0} / 1000;  // sc_time's range in cycles
constexpr uint64_t kMaxDeviceBytes = DeviceMemory::kMaxCapacity;  // 2^48: hbm and l2 bytes
// An on-chip buffer: at most 4 GiB (8,000 x the largest preset's L1), so that one transfer
// moves at most 2^32 bytes and a core's buffers fit in host memory.
constexpr uint64_t kMaxBufferBytes = uint64_t{1} << 32;
// Transfers must end within the simulated-time range: a rate (bytes per cycle) at which the
// largest transfer takes 2^52 cycles (a quarter of the range) is the slowest accepted. A
// rate at which the whole device address space moves within one picosecond (the resolution)
// is the fastest: anything faster cannot be told apart in simulated time.
constexpr double kMinBytesPerCycle = static_cast<double>(kMaxBufferBytes) / 0x1p52;  // 2^-20
constexpr double kMaxBytesPerCycle = static_cast<double>(kMaxDeviceBytes) * 1000;
// The host link copies at most the whole device memory at once: same rule, for 2^48 bytes.
constexpr double kMinHdcBytesPerCycle = static_cast<double>(kMaxDeviceBytes) / 0x1p52;  // 1/16
// A fixed latency (cycles) or per-instruction cost: at most 2^20 cycles, so that 2^32
// instructions each paying it (2^52 cycles) stay within the simulated-time range.
constexpr int kMaxLatencyCycles = 1 << 20;
// A per-launch overhead (task dispatch and completion, host dispatch): at most 2^32 cycles, paid
// once per launch, far within the range; block starts are latencies (paid per block).
constexpr double kMaxOverheadCycles = 0x1p32;
// Multipliers of an instruction's cost (reduce and transcendental factors, the fp32 cube rate
// divisor): at most 2^10, so that the costliest instruction (an mmad of 2^12 x 2^12 x 2^12 on a
// 1x1x1 cube: 2^36 steps) times the factor, 2^46 cycles, stays within 1/256 of the range.
constexpr int kMaxCostFactor = 1 << 10;
// The clock converts GB/s and microseconds into cycles; one cycle of a faster clock than
// 10^6 MHz (1 THz) would be shorter than SystemC's resolution of 1 ps.
constexpr double kMaxClockMhz = 1e6;
// mmad's m, k and n fields are 12 bits wide (isa.def): a cube dimension above 4096 can never be
// filled by one instruction.
constexpr int kMaxCubeDim = 1 << 12;
// One vector repeat is 256 bytes (sim/exec/vector_insn.cpp): a vector unit faster than a
// repeat per cycle cannot be told apart.
constexpr int kMaxVectorBytesPerCycle = 256;
// Instruction queues are allocated up front per pipe and core; 4096 entries is 128x the
// presets' depth.
constexpr int kMaxIssueQueueDepth = 4096;
// All cores together: each is a SystemC module whose scalar unit and pipes are threads with
// their own stacks (256 KiB and 512 KiB each, sim/core/ai_core.cpp; about 3.3 MiB a core),
// besides its buffers mapped in host memory: 1024 cores (14x the largest preset) map about
// 3.4 GiB of stacks. (The memory system records core ids as uint16: 65535 is the hard limit.)
constexpr int kMaxTotalCores = 1024;
// The L2's tags take 20 bytes of host memory per line, in two copies (the memory system and
// the replay's address check): at most 2^22 lines (160 MiB; 10x the largest preset's L2).
constexpr uint64_t kMaxL2Lines = uint64_t{1} << 22;
// Alignments are powers of two held in an int: at most 2^30 (a buffer's must also divide it).
constexpr int kMaxAlignBytes = 1 << 30;
// The model counts a vector instruction's accesses per UB bank and repeat: 4096 banks (85x the
// 910B's 48) keep that cost per instruction small; a bank row is at most 64 KiB, so that a
// row (banks x width) stays within a buffer of kMaxBufferBytes.
constexpr int kMaxUbBanks = 1 << 12;
constexpr int kMaxUbBankWidth = 1 << 16;
// Cross-core flag sets pending per flag: a queue of that many entries per flag and core.
constexpr int kMaxCrossCorePending = 1 << 16;
// The derivations above, checked.
static_assert(kMaxBufferBytes / kMinBytesPerCycle <= kMaxSimCycles / 4);
static_assert(kMaxDeviceBytes / kMinHdcBytesPerCycle <= kMaxSimCycles / 4);
static_assert((uint64_t{kMaxLatencyCycles} << 32) <= kMaxSimCycles);
static_assert((uint64_t{1} << 36) * kMaxCostFactor <= kMaxSimCycles / 256);

bool is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

CoreKindConfig parse_core_kind(const Reader& r, CoreKind kind) {
  const std::string base = fmt::format("cores.{}", isa::core_kind_name(kind));
  CoreKindConfig k;
  k.kind = kind;
  k.count = r.get_int(base + ".count", 1, kMaxTotalCores);

  const std::string pipes_key = base + ".pipes";
  const char* pipes_expected = "a list of pipe names (s, mte1, mte2, mte3, m, v, fix)";
  for (const auto& name : r.get_names(pipes_key, pipes_expected)) {
    auto p = isa::pipe_from_name(name);
    if (!p || static_cast<int>(*p) >= isa::kNumExecPipes)
      r.fail(pipes_key, fmt::format("unknown pipe '{}'; expected {}", name, pipes_expected));
    if (k.has(*p)) r.fail(pipes_key, fmt::format("pipe '{}' is listed twice", name));
    k.pipes.push_back(*p);
  }
  std::sort(k.pipes.begin(), k.pipes.end());
  if (!k.has(Pipe::S)) r.fail(pipes_key, "every core needs the scalar pipe 's'");

  const std::string bufs_key = base + ".buffers";
  r.require_map(bufs_key);
  for (const auto& name : r.children(bufs_key))
    k.buffer_bytes[*isa::buf_from_name(name)] =
        r.get_bytes(bufs_key + "." + name, kMaxBufferBytes);

  // A pipe is useless without the buffers it works on.
  struct Needs {
    Pipe pipe;
    std::vector<Buf> any_of;  // at least one of these
    std::vector<Buf> all_of;  // all of these
  };
  const Needs needs[] = {{Pipe::M, {}, {Buf::L0A, Buf::L0B, Buf::L0C}},
                         {Pipe::V, {}, {Buf::UB}},
                         {Pipe::MTE1, {}, {Buf::L1}},
                         {Pipe::MTE2, {Buf::L1, Buf::UB}, {}},
                         {Pipe::MTE3, {}, {Buf::UB}},
                         {Pipe::FIX, {}, {Buf::L0C}}};
  for (const auto& n : needs) {
    if (!k.has(n.pipe)) continue;
    for (Buf b : n.all_of)
      if (!k.has(b))
        r.fail(pipes_key, fmt::format("pipe '{}' needs buffer '{}', which {}.buffers lacks",
                                      isa::pipe_name(n.pipe), isa::buf_name(b), base));
    if (!n.any_of.empty() &&
        std::none_of(n.any_of.begin(), n.any_of.end(), [&](Buf b) { return k.has(b); }))
      r.fail(pipes_key, fmt::format("pipe '{}' needs buffer l1 or ub, which {}.buffers lacks",
                                    isa::pipe_name(n.pipe), base));
  }
  return k;
}

bool any_kind_has(const ChipConfig& c, Buf b) {
  return b == Buf::GM || std::any_of(c.core_kinds.begin(), c.core_kinds.end(),
                                     [&](const CoreKindConfig& k) { return k.has(b); });
}

// Core kinds: split chips have exactly aic and aiv, coupled chips exactly aicore.
void parse_cores(const Reader& r, ChipConfig& c) {
  r.require_map("cores");
  const std::vector<CoreKind> want = c.split
                                         ? std::vector<CoreKind>{CoreKind::AIC, CoreKind::AIV}
                                         : std::vector<CoreKind>{CoreKind::AICORE};
  const char* want_text = c.split ? "a split chip has cores.aic and cores.aiv"
                                  : "a coupled chip has cores.aicore only";
  for (const auto& name : r.children("cores")) {
    CoreKind k = *isa::core_kind_from_name(name);
    if (std::find(want.begin(), want.end(), k) == want.end())
      throw ConfigError(fmt::format("{}: key 'cores.{}': organisation is {}: {}",
                                    r.where("cores." + name), name,
                                    c.split ? "split" : "coupled", want_text));
  }
  for (CoreKind k : want) {
    const std::string key = fmt::format("cores.{}", isa::core_kind_name(k));
    if (r.children(key).empty())
      throw ConfigError(
          fmt::format("{}: missing required key '{}' ({})", r.file(), key, want_text));
    c.core_kinds.push_back(parse_core_kind(r, k));
  }
  if (c.total_cores() > kMaxTotalCores)
    r.fail("cores", fmt::format("{} cores in all; at most {}", c.total_cores(), kMaxTotalCores));
  // Coupled chips have no mix groups: aiv_per_aic 0 (its readers, mix kernels and Mix Block
  // Dim, are split-only).
  c.aiv_per_aic = 0;
  if (c.split) {
    c.aiv_per_aic = r.get_int("cores.aiv.per_aic", 1, kMaxTotalCores);
    const auto& aic = c.core_kinds[0];
    const auto& aiv = c.core_kinds[1];
    if (aiv.count != aic.count * c.aiv_per_aic)
      r.fail("cores.aiv.count",
             fmt::format("{} vector cores, but cores.aic.count x cores.aiv.per_aic = {} x {} = {}",
                         aiv.count, aic.count, c.aiv_per_aic, aic.count * c.aiv_per_aic));
  }
}

// Alignment of gm and of every buffer present, each a power of two dividing the buffer's size;
// then the UB bank geometry, which must tile the UB.
void parse_alignment_and_banking(const Reader& r, ChipConfig& c) {
  for (const auto& name : r.children("alignment"))
    if (!any_kind_has(c, *isa::buf_from_name(name)))
      r.fail("alignment." + name, fmt::format("no core kind has buffer '{}'", name));
  for (int i = 0; i < isa::kNumBufs; ++i) {
    Buf b = static_cast<Buf>(i);
    if (!any_kind_has(c, b)) continue;
    const std::string key = fmt::format("alignment.{}", isa::buf_name(b));
    const int a = r.get_int(key, 1, kMaxAlignBytes);
    if (!is_pow2(static_cast<uint64_t>(a)))
      r.fail(key, fmt::format("expected a power of two, got {}", a));
    c.align_bytes[b] = static_cast<uint32_t>(a);
    for (const auto& k : c.core_kinds)
      if (k.has(b) && k.capacity(b) % a != 0)
        r.fail(key, fmt::format("cores.{}.buffers.{} ({} bytes) is not a multiple of it ({})",
                                isa::core_kind_name(k.kind), isa::buf_name(b), k.capacity(b), a));
  }

  c.ub_banks = r.get_int("ub_banking.banks", 1, kMaxUbBanks);
  c.ub_bank_groups = r.get_int("ub_banking.bank_groups", 1, kMaxUbBanks);
  c.ub_bank_width_bytes = r.get_int("ub_banking.bank_width_bytes", 1, kMaxUbBankWidth);
  if (c.ub_banks % c.ub_bank_groups != 0)
    r.fail("ub_banking.bank_groups", fmt::format("{} banks do not divide into {} groups",
                                                 c.ub_banks, c.ub_bank_groups));
  const uint64_t row = static_cast<uint64_t>(c.ub_banks) * c.ub_bank_width_bytes;
  for (const auto& k : c.core_kinds)
    if (k.has(Buf::UB) && k.capacity(Buf::UB) % row != 0)
      r.fail("ub_banking.banks",
             fmt::format("cores.{}.buffers.ub ({} bytes) is not a whole number of rows of "
                         "banks x bank_width_bytes = {} bytes",
                         isa::core_kind_name(k.kind), k.capacity(Buf::UB), row));
}

// Data paths: each moves data inside one core kind, or between GM and one core kind.
void parse_paths(const Reader& r, ChipConfig& c) {
  for (const auto& name : r.children("paths")) {
    auto [src, dst] = *parse_path_name(name);
    const std::string key = "paths." + name;
    if (src == dst) r.fail(key, "a path needs two different buffers");
    for (Buf b : {src, dst})
      if (!any_kind_has(c, b))
        r.fail(key, fmt::format("names buffer '{}', which no core kind has", isa::buf_name(b)));
    bool same_core = std::any_of(c.core_kinds.begin(), c.core_kinds.end(), [&](const auto& k) {
      return (src == Buf::GM || k.has(src)) && (dst == Buf::GM || k.has(dst));
    });
    if (!same_core)
      r.fail(key, fmt::format("no core kind has both {} and {} (data between core kinds "
                              "passes through gm)",
                              isa::buf_name(src), isa::buf_name(dst)));
    c.path_bytes_per_cycle[{src, dst}] =
        r.get_number(key + ".bytes_per_cycle", kMinBytesPerCycle, false, kMaxBytesPerCycle);
    c.path_latency_cycles[{src, dst}] = r.get_int(key + ".latency_cycles", 0, kMaxLatencyCycles);
  }
}

void parse_memory(const Reader& r, ChipConfig& c) {
  c.hbm_bytes = r.get_bytes("memory.hbm.bytes", kMaxDeviceBytes);
  c.hbm_gbps =
      r.get_gbps("memory.hbm.gbps", c.clock_mhz, kMinBytesPerCycle, kMaxBytesPerCycle);
  if (r.has("memory.hbm.efficiency")) {
    c.hbm_efficiency = r.get_number("memory.hbm.efficiency", 0, true, 1);
    if (c.hbm_sustained_bytes_per_cycle() < kMinBytesPerCycle)
      r.fail("memory.hbm.efficiency",
             fmt::format("{} x memory.hbm.gbps {} is {:g} bytes per cycle at clock_mhz {}; "
                         "expected at least {:g}, i.e. an efficiency in [{:g}, 1] at this rate",
                         c.hbm_efficiency, c.hbm_gbps, c.hbm_sustained_bytes_per_cycle(),
                         c.clock_mhz, kMinBytesPerCycle,
                         kMinBytesPerCycle / c.hbm_bytes_per_cycle()));
  }
  if (r.has("memory.hbm.turnaround_loss")) {
    c.hbm_turnaround_loss = r.get_number("memory.hbm.turnaround_loss", 0, false, 0.9);
    if (c.hbm_mixed_bytes_per_cycle(0.5) < kMinBytesPerCycle)
      r.fail("memory.hbm.turnaround_loss",
             fmt::format("an even read/write mix would move {:g} bytes per cycle; expected at "
                         "least {:g}", c.hbm_mixed_bytes_per_cycle(0.5), kMinBytesPerCycle));
  }
  c.hbm_latency_cycles = r.get_int("memory.hbm.latency_cycles", 0, kMaxLatencyCycles);
  c.l2_bytes = r.get_bytes("memory.l2.bytes", kMaxDeviceBytes);
  c.l2_gbps = r.get_gbps("memory.l2.gbps", c.clock_mhz, kMinBytesPerCycle, kMaxBytesPerCycle);
  c.l2_line_bytes = static_cast<uint32_t>(
      r.get_int("memory.l2.line_bytes", 1, static_cast<int>(kMaxBufferBytes >> 2)));
  c.l2_ways = r.get_int("memory.l2.ways", 1, static_cast<int>(kMaxL2Lines));
  c.l2_latency_cycles = r.get_int("memory.l2.latency_cycles", 0, kMaxLatencyCycles);
  c.l2_read_bytes_per_cycle = r.get_number("memory.l2.core_read_bytes_per_cycle",
                                           kMinBytesPerCycle, false, kMaxBytesPerCycle);
  c.l2_write_bytes_per_cycle = r.get_number("memory.l2.core_write_bytes_per_cycle",
                                            kMinBytesPerCycle, false, kMaxBytesPerCycle);
  if (r.has("memory.l2.ub_write_bytes_per_cycle")) {  // 0: as core_write_bytes_per_cycle
    c.l2_ub_write_bytes_per_cycle =
        r.get_number("memory.l2.ub_write_bytes_per_cycle", 0, false, kMaxBytesPerCycle);
    if (c.l2_ub_write_bytes_per_cycle != 0 && c.l2_ub_write_bytes_per_cycle < kMinBytesPerCycle)
      r.fail("memory.l2.ub_write_bytes_per_cycle",
             fmt::format("expected 0 (as core_write_bytes_per_cycle) or at least {:g}, got {:g}",
                         kMinBytesPerCycle, c.l2_ub_write_bytes_per_cycle));
  }
  c.l2_keep_across_launches = r.has("memory.l2.keep_across_launches") &&
                              r.get_bool("memory.l2.keep_across_launches");
  c.l2_keep_within_graph_run = r.has("memory.l2.keep_within_graph_run") &&
                               r.get_bool("memory.l2.keep_within_graph_run");
  c.l2_write_back = r.has("memory.l2.write_back") && r.get_bool("memory.l2.write_back");
  c.l2_write_back_waits =
      r.has("memory.l2.write_back_waits") && r.get_bool("memory.l2.write_back_waits");
  c.l2_page_rotation = r.has("memory.l2.page_rotation") && r.get_bool("memory.l2.page_rotation");
  if (r.has("memory.l2.line_read_bytes_per_cycle")) {  // optional: 0 (no limit) without it
    c.l2_line_read_bytes_per_cycle =
        r.get_number("memory.l2.line_read_bytes_per_cycle", 0, false, kMaxBytesPerCycle);
    if (c.l2_line_read_bytes_per_cycle != 0 &&
        c.l2_line_read_bytes_per_cycle < kMinBytesPerCycle)
      r.fail("memory.l2.line_read_bytes_per_cycle",
             fmt::format("expected 0 (no limit) or at least {:g}, got {:g}", kMinBytesPerCycle,
                         c.l2_line_read_bytes_per_cycle));
  }
  if (r.has("memory.l2.read_granule_bytes")) {  // optional: 0 (no rounding) without it
    c.l2_read_granule_bytes = static_cast<uint64_t>(
        r.get_int("memory.l2.read_granule_bytes", 0, static_cast<int>(c.l2_line_bytes)));
    if (c.l2_read_granule_bytes != 0 && !is_pow2(c.l2_read_granule_bytes))
      r.fail("memory.l2.read_granule_bytes",
             fmt::format("expected 0 (no rounding) or a power of two, got {}",
                         c.l2_read_granule_bytes));
  }
  if (c.l2_bytes > c.hbm_bytes)
    r.fail("memory.l2.bytes", fmt::format("L2 ({} bytes) is larger than memory.hbm.bytes ({})",
                                          c.l2_bytes, c.hbm_bytes));
  if (!is_pow2(c.l2_line_bytes))
    r.fail("memory.l2.line_bytes",
           fmt::format("expected a power of two, got {}", c.l2_line_bytes));
  const uint64_t set_bytes = static_cast<uint64_t>(c.l2_line_bytes) * c.l2_ways;
  if (c.l2_bytes % set_bytes != 0)
    r.fail("memory.l2.bytes", fmt::format("{} bytes is not a whole number of sets of "
                                          "line_bytes x ways = {} bytes",
                                          c.l2_bytes, set_bytes));
  if (c.l2_bytes / c.l2_line_bytes > kMaxL2Lines)
    r.fail("memory.l2.bytes", fmt::format("{} bytes in lines of {} bytes are {} lines; at most {} "
                                          "lines (their tags are kept in host memory)",
                                          c.l2_bytes, c.l2_line_bytes,
                                          c.l2_bytes / c.l2_line_bytes, kMaxL2Lines));
}

// Task and host-dispatch overheads: each at most kMaxOverheadCycles at this clock.
void parse_overheads(const Reader& r, ChipConfig& c) {
  const double max_us = kMaxOverheadCycles / c.clock_mhz;
  c.task_dispatch_us = r.get_number("task.dispatch_us", 0, false, max_us);
  c.task_block_start_cycles = r.get_int("task.block_start_cycles", 0, kMaxLatencyCycles);
  c.task_done_us = r.get_number("task.done_us", 0, false, max_us);
  if (r.has("mte.nd2nz_row_cycles"))  // optional: 0 (no per-row cost) without it
    c.nd2nz_row_cycles = r.get_number("mte.nd2nz_row_cycles", 0, false, kMaxLatencyCycles);
  if (r.has("mte.copy_issue_cycles"))  // optional: 0 (no issue minimum) without it
    c.copy_issue_cycles = r.get_number("mte.copy_issue_cycles", 0, false, kMaxLatencyCycles);
  if (r.has("mte.burst_cycles"))  // optional, as above
    c.burst_cycles = r.get_number("mte.burst_cycles", 0, false, kMaxLatencyCycles);
  c.host_op_dispatch_us = r.get_number("host.op_dispatch_us", 0, false, max_us);
  c.host_graph_dispatch_us = r.get_number("host.graph_dispatch_us", 0, false, max_us);
}

// The AI CPU (optional section; all four keys together): cores, their clock, a task's overhead
// (at most kMaxOverheadCycles of the AI cores' clock) and DropOutGenMask's rate on one core.
void parse_ai_cpu(const Reader& r, ChipConfig& c) {
  if (!r.has("ai_cpu.cores") && !r.has("ai_cpu.clock_mhz") && !r.has("ai_cpu.task_us") &&
      !r.has("ai_cpu.gen_mask_cycles_per_128_bits"))
    return;  // a partial section fails below, naming the key it lacks
  c.ai_cpu_cores = r.get_int("ai_cpu.cores", 1, kMaxTotalCores);
  c.ai_cpu_clock_mhz = r.get_number("ai_cpu.clock_mhz", 0, true, kMaxClockMhz);
  c.ai_cpu_task_us = r.get_number("ai_cpu.task_us", 0, false, kMaxOverheadCycles / c.clock_mhz);
  c.ai_cpu_gen_mask_cycles_per_128_bits =
      r.get_number("ai_cpu.gen_mask_cycles_per_128_bits", 0, true, kMaxLatencyCycles);
}

ChipConfig parse_tree(const Tree& tree, const std::string& file, const std::string& default_name) {
  check_known_keys(tree, chip_schema());
  Reader r(tree, file);
  ChipConfig c;
  c.source_file = file;
  c.name = r.has("name") ? r.get_string("name") : default_name;
  c.clock_mhz = r.get_number("clock_mhz", 0, true, kMaxClockMhz);
  const std::string org = r.get_string("organisation");
  if (org != "split" && org != "coupled")
    r.fail("organisation", fmt::format("expected 'split' or 'coupled', got '{}'", org));
  c.split = org == "split";

  parse_cores(r, c);
  parse_alignment_and_banking(r, c);

  c.cube_m = r.get_int("cube.m", 1, kMaxCubeDim);
  c.cube_k = r.get_int("cube.k", 1, kMaxCubeDim);
  c.cube_n = r.get_int("cube.n", 1, kMaxCubeDim);
  c.cube_int8_k = r.get_int("cube.int8_k", 1, kMaxCubeDim);
  c.cube_fp32_rate_divisor = r.get_int("cube.fp32_rate_divisor", 0, kMaxCostFactor);
  c.cube_bf16 = r.get_bool("cube.bf16");
  c.cube_latency_cycles = r.get_int("cube.latency_cycles", 0, kMaxLatencyCycles);

  c.vector_bytes_per_cycle = r.get_int("vector.bytes_per_cycle", 1, kMaxVectorBytesPerCycle);
  c.vector_latency_cycles = r.get_int("vector.latency_cycles", 0, kMaxLatencyCycles);
  c.vector_reduce_factor = r.get_int("vector.reduce_factor", 1, kMaxCostFactor);
  c.vector_transcendental_factor = r.get_int("vector.transcendental_factor", 1, kMaxCostFactor);
  // optional: false (no vaddreluconv) without it
  c.vector_add_relu_conv = r.has("vector.add_relu_conv") && r.get_bool("vector.add_relu_conv");
  // optional: false (no vmla) without it
  c.vector_multiply_accumulate =
      r.has("vector.multiply_accumulate") && r.get_bool("vector.multiply_accumulate");
  if (r.has("vector.bf16_arithmetic"))  // optional: true without it
    c.vector_bf16_arithmetic = r.get_bool("vector.bf16_arithmetic");
  if (r.has("vector.bf16_conversion"))  // optional: true without it
    c.vector_bf16_conversion = r.get_bool("vector.bf16_conversion");

  c.scalar_cycles_per_insn = r.get_int("scalar.cycles_per_insn", 1, kMaxLatencyCycles);
  c.issue_queue_depth = r.get_int("issue_queue_depth", 1, kMaxIssueQueueDepth);

  parse_paths(r, c);
  parse_memory(r, c);

  parse_overheads(r, c);
  parse_ai_cpu(r, c);
  c.hdc_gbps = r.get_gbps("hdc.gbps", c.clock_mhz, kMinHdcBytesPerCycle, kMaxBytesPerCycle);
  // At most kMaxLatencyCycles at this clock.
  c.hdc_latency_us = r.get_number("hdc.latency_us", 0, false, kMaxLatencyCycles / c.clock_mhz);

  // Flag ids are encoded in a 4-bit instruction field (isa.def: set_flag/cc_set id).
  const int max_ids = static_cast<int>(isa::field_imm_max(isa::FieldKind::U4)) + 1;
  const int cross_min = c.split ? 1 : 0;  // coupled chips have no cross-core flags
  c.flag_ids = r.get_int("sync.flag_ids", 1, max_ids);
  c.cross_core_flag_ids = r.get_int("sync.cross_core_flag_ids", cross_min, max_ids);
  c.cross_core_max_pending =
      r.get_int("sync.cross_core_max_pending", cross_min, kMaxCrossCorePending);
  c.set_flag_holds_pipe =
      !r.has("sync.set_flag_holds_pipe") || r.get_bool("sync.set_flag_holds_pipe");
  return c;
}

}  // namespace

std::string chip_config_dir() {
  const char* env = std::getenv("NPUSIM_CONFIG_DIR");
  return env && *env ? std::string(env) : std::string(NPUSIM_CONFIG_DIR);
}

std::vector<std::string> list_chip_presets() { return chip_presets().names(); }

ChipConfig load_chip_config(const std::string& name_or_path,
                            const std::vector<std::string>& overrides) {
  fs::path file = resolve_config_file(name_or_path, {}, "", chip_presets());
  Tree tree = load_tree(file, chip_presets());
  for (const auto& o : overrides) apply_override(tree, o, file.string());
  return parse_tree(tree, file.string(), file.stem().string());
}

std::string dump_chip_config_yaml(const ChipConfig& c) {
  std::ostringstream o;
  o << fmt::format("# Resolved chip configuration '{}' (from {}); schema: docs/configs.md\n",
                   c.name, c.source_file.empty() ? "code" : c.source_file);
  o << fmt::format("name: {}\n", quote(c.name));
  o << fmt::format("clock_mhz: {}\n", c.clock_mhz);
  o << fmt::format("organisation: {}\n", c.split ? "split" : "coupled");
  o << "cores:\n";
  for (const auto& k : c.core_kinds) {
    o << fmt::format("  {}:\n    count: {}\n", isa::core_kind_name(k.kind), k.count);
    if (k.kind == CoreKind::AIV) o << fmt::format("    per_aic: {}\n", c.aiv_per_aic);
    std::string pipes;
    for (Pipe p : k.pipes) pipes += (pipes.empty() ? "" : ", ") + std::string(isa::pipe_name(p));
    o << fmt::format("    pipes: [{}]\n    buffers:\n", pipes);
    for (const auto& [b, bytes] : k.buffer_bytes)
      o << fmt::format("      {}: {}\n", isa::buf_name(b), format_bytes(bytes));
  }
  o << "alignment:\n";
  for (const auto& [b, a] : c.align_bytes) o << fmt::format("  {}: {}\n", isa::buf_name(b), a);
  o << fmt::format("ub_banking:\n  banks: {}\n  bank_groups: {}\n  bank_width_bytes: {}\n",
                   c.ub_banks, c.ub_bank_groups, c.ub_bank_width_bytes);
  o << fmt::format(
      "cube:\n  m: {}\n  k: {}\n  n: {}\n  int8_k: {}\n  fp32_rate_divisor: {}\n  bf16: {}\n"
      "  latency_cycles: {}\n",
      c.cube_m, c.cube_k, c.cube_n, c.cube_int8_k, c.cube_fp32_rate_divisor,
      c.cube_bf16 ? "true" : "false", c.cube_latency_cycles);
  o << fmt::format(
      "vector:\n  bytes_per_cycle: {}\n  latency_cycles: {}\n  reduce_factor: {}\n"
      "  transcendental_factor: {}\n  add_relu_conv: {}\n  multiply_accumulate: {}\n",
      c.vector_bytes_per_cycle, c.vector_latency_cycles, c.vector_reduce_factor,
      c.vector_transcendental_factor, c.vector_add_relu_conv ? "true" : "false",
      c.vector_multiply_accumulate ? "true" : "false");
  // Optional (as the keys below): only when set, so a default config dumps as it did before.
  if (!c.vector_bf16_arithmetic) o << "  bf16_arithmetic: false\n";
  if (!c.vector_bf16_conversion) o << "  bf16_conversion: false\n";
  o << fmt::format("scalar:\n  cycles_per_insn: {}\n", c.scalar_cycles_per_insn);
  o << fmt::format("issue_queue_depth: {}\n", c.issue_queue_depth);
  o << "paths:\n";
  for (const auto& [path, rate] : c.path_bytes_per_cycle)
    o << fmt::format("  {}: {{bytes_per_cycle: {}, latency_cycles: {}}}\n",
                     path_name(path.first, path.second), rate,
                     c.path_latency(path.first, path.second));
  o << fmt::format("memory:\n  hbm:\n    bytes: {}\n    gbps: {}\n", format_bytes(c.hbm_bytes),
                   c.hbm_gbps);
  // Optional, as the L2's keys below: dumped only when not at its default.
  if (c.hbm_efficiency != 1.0) o << fmt::format("    efficiency: {}\n", c.hbm_efficiency);
  if (c.hbm_turnaround_loss != 0.0)
    o << fmt::format("    turnaround_loss: {}\n", c.hbm_turnaround_loss);
  o << fmt::format("    latency_cycles: {}\n", c.hbm_latency_cycles);
  o << fmt::format(
      "  l2:\n    bytes: {}\n    gbps: {}\n    line_bytes: {}\n    ways: {}\n"
      "    latency_cycles: {}\n    core_read_bytes_per_cycle: {}\n"
      "    core_write_bytes_per_cycle: {}\n",
      format_bytes(c.l2_bytes), c.l2_gbps, c.l2_line_bytes, c.l2_ways, c.l2_latency_cycles,
      c.l2_read_bytes_per_cycle, c.l2_write_bytes_per_cycle);
  // The optional keys only when set: a config at their defaults dumps as it did before they
  // existed (offline models and kernel caches keyed by the dump stay valid).
  if (c.l2_ub_write_bytes_per_cycle != 0)
    o << fmt::format("    ub_write_bytes_per_cycle: {}\n", c.l2_ub_write_bytes_per_cycle);
  if (c.l2_keep_across_launches) o << "    keep_across_launches: true\n";
  if (c.l2_keep_within_graph_run) o << "    keep_within_graph_run: true\n";
  if (c.l2_write_back) o << "    write_back: true\n";
  if (c.l2_write_back_waits) o << "    write_back_waits: true\n";
  if (c.l2_page_rotation) o << "    page_rotation: true\n";
  if (c.l2_line_read_bytes_per_cycle != 0)
    o << fmt::format("    line_read_bytes_per_cycle: {}\n", c.l2_line_read_bytes_per_cycle);
  if (c.l2_read_granule_bytes != 0)
    o << fmt::format("    read_granule_bytes: {}\n", c.l2_read_granule_bytes);
  if (c.nd2nz_row_cycles != 0 || c.copy_issue_cycles != 0 || c.burst_cycles != 0) {
    o << "mte:\n";  // optional keys, as above
    if (c.nd2nz_row_cycles != 0) o << fmt::format("  nd2nz_row_cycles: {}\n", c.nd2nz_row_cycles);
    if (c.copy_issue_cycles != 0)
      o << fmt::format("  copy_issue_cycles: {}\n", c.copy_issue_cycles);
    if (c.burst_cycles != 0) o << fmt::format("  burst_cycles: {}\n", c.burst_cycles);
  }
  o << fmt::format("task:\n  dispatch_us: {}\n  block_start_cycles: {}\n  done_us: {}\n",
                   c.task_dispatch_us, c.task_block_start_cycles, c.task_done_us);
  o << fmt::format("host:\n  op_dispatch_us: {}\n  graph_dispatch_us: {}\n",
                   c.host_op_dispatch_us, c.host_graph_dispatch_us);
  if (c.ai_cpu_cores > 0)  // optional, as above
    o << fmt::format(
        "ai_cpu:\n  cores: {}\n  clock_mhz: {}\n  task_us: {}\n"
        "  gen_mask_cycles_per_128_bits: {}\n",
        c.ai_cpu_cores, c.ai_cpu_clock_mhz, c.ai_cpu_task_us,
        c.ai_cpu_gen_mask_cycles_per_128_bits);
  o << fmt::format("hdc:\n  gbps: {}\n  latency_us: {}\n", c.hdc_gbps, c.hdc_latency_us);
  o << fmt::format(
      "sync:\n  flag_ids: {}\n  cross_core_flag_ids: {}\n  cross_core_max_pending: {}\n",
      c.flag_ids, c.cross_core_flag_ids, c.cross_core_max_pending);
  if (!c.set_flag_holds_pipe) o << "  set_flag_holds_pipe: false\n";  // optional, as above
  return o.str();
}

}  // namespace npusim
