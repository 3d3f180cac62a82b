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
#include "sim/memory/device_memory.h"

#ifndef NPUSIM_CONFIG_DIR
#define NPUSIM_CONFIG_DIR "configs/chips"
#endif

namespace npusim {
namespace {

namespace fs = std::filesystem;
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
    "scalar.cycles_per_insn",
    "issue_queue_depth",
    "paths.<path>.bytes_per_cycle",
    "paths.<path>.latency_cycles",
    "memory.hbm.bytes",
    "memory.hbm.gbps",
    "memory.hbm.latency_cycles",
    "memory.l2.bytes",
    "memory.l2.gbps",
    "memory.l2.line_bytes",
    "memory.l2.ways",
    "memory.l2.latency_cycles",
    "memory.l2.core_read_bytes_per_cycle",
    "memory.l2.core_write_bytes_per_cycle",
    "task.dispatch_us",
    "task.block_start_cycles",
    "task.done_us",
    "host.op_dispatch_us",
    "host.graph_dispatch_us",
    "hdc.gbps",
    "hdc.latency_us",
    "sync.flag_ids",
    "sync.cross_core_flag_ids",
    "sync.cross_core_max_pending",
};

constexpr CoreKind kCoreKinds[] = {CoreKind::AIC, CoreKind::AIV, CoreKind::AICORE};

struct Leaf {
  YAML::Node value;    // scalar, sequence or null
  std::string origin;  // "file:line", or "file: override 'key=value'"
};
using Tree = std::map<std::string, Leaf>;  // dotted key -> leaf

std::vector<std::string> split_key(const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string::npos) return parts;
    start = dot + 1;
  }
}

std::string join_key(const std::vector<std::string>& parts, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; ++i) s += (i ? "." : "") + parts[i];
  return s;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

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

bool component_matches(const std::string& pattern, const std::string& part) {
  if (pattern.empty() || pattern[0] != '<') return pattern == part;
  if (pattern == "<path>") return parse_path_name(part).has_value();
  auto values = placeholder_values(pattern);
  return std::find(values.begin(), values.end(), part) != values.end();
}

// How a dotted key relates to the schema.
enum class KeyMatch { Leaf, Map /* a proper prefix of a schema key */, BelowLeaf, Unknown };

KeyMatch match_schema(const std::string& key) {
  auto parts = split_key(key);
  KeyMatch best = KeyMatch::Unknown;
  for (const char* pattern : kSchemaKeys) {
    auto pp = split_key(pattern);
    size_t n = std::min(pp.size(), parts.size());
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) ok = component_matches(pp[i], parts[i]);
    if (!ok) continue;
    if (pp.size() == parts.size()) return KeyMatch::Leaf;
    best = pp.size() > parts.size() ? KeyMatch::Map : KeyMatch::BelowLeaf;
  }
  return best;
}

// Every concrete key of the schema (placeholders expanded), for "did you mean" suggestions.
std::vector<std::string> all_schema_keys() {
  std::vector<std::string> out;
  for (const char* pattern : kSchemaKeys) {
    std::vector<std::string> partial = {""};
    for (const auto& part : split_key(pattern)) {
      std::vector<std::string> values =
          part[0] == '<' ? placeholder_values(part) : std::vector<std::string>{part};
      std::vector<std::string> next;
      for (const auto& p : partial)
        for (const auto& v : values) next.push_back(p.empty() ? v : p + "." + v);
      partial = std::move(next);
    }
    out.insert(out.end(), partial.begin(), partial.end());
  }
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1] ? 1 : 0)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string nearest(const std::string& key, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  for (const auto& c : candidates) {
    size_t d = edit_distance(key, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

std::string did_you_mean(const std::string& key, const std::vector<std::string>& candidates) {
  std::string n = nearest(key, candidates);
  return n.empty() ? "" : fmt::format(" (did you mean '{}'?)", n);
}

std::string describe_value(const YAML::Node& n) {
  if (n.IsScalar()) return fmt::format("'{}'", n.Scalar());
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a map";
  return "nothing";
}

// Removes `key` and everything below it.
void erase_subtree(Tree& t, const std::string& key) {
  t.erase(key);
  const std::string prefix = key + ".";
  for (auto it = t.lower_bound(prefix); it != t.end() && starts_with(it->first, prefix);)
    it = t.erase(it);
}

bool has_subtree(const Tree& t, const std::string& key) {
  const std::string prefix = key + ".";
  auto it = t.lower_bound(prefix);
  return it != t.end() && starts_with(it->first, prefix);
}

// Lays one leaf over the tree: it replaces the key, anything below it and any leaf above it;
// a null value deletes the key.
void set_leaf(Tree& t, const std::string& key, Leaf leaf) {
  erase_subtree(t, key);
  auto parts = split_key(key);
  for (size_t n = 1; n < parts.size(); ++n) t.erase(join_key(parts, n));
  if (!leaf.value.IsNull()) t[key] = std::move(leaf);
}

// Flattens a YAML map into (dotted key, leaf) pairs laid over `out` in document order.
// origin_file: used as "file:line" unless fixed_origin is given (overrides).
void flatten(const YAML::Node& map, const std::string& prefix, const std::string& origin_file,
             const std::string& fixed_origin, Tree& out) {
  std::set<std::string> seen;
  for (const auto& kv : map) {
    if (prefix.empty() && kv.first.IsScalar() && kv.first.Scalar() == "extends") continue;
    std::string where = fixed_origin.empty()
                            ? fmt::format("{}:{}", origin_file, kv.first.Mark().line + 1)
                            : fixed_origin;
    if (!kv.first.IsScalar())
      throw ConfigError(fmt::format("{}: key under '{}' is not a plain name", where, prefix));
    std::string key = prefix.empty() ? kv.first.Scalar() : prefix + "." + kv.first.Scalar();
    if (!seen.insert(kv.first.Scalar()).second)
      throw ConfigError(fmt::format("{}: key '{}' appears twice", where, key));
    if (kv.second.IsMap()) {
      if (kv.second.size() == 0) {
        erase_subtree(out, key);  // "key: {}" empties a map
        continue;
      }
      flatten(kv.second, key, origin_file, fixed_origin, out);
    } else {
      set_leaf(out, key, Leaf{kv.second, where});
    }
  }
}

std::string presets_hint() {
  std::string names;
  for (const auto& p : list_chip_presets()) names += (names.empty() ? "" : ", ") + p;
  return fmt::format("available presets in {}: {}", chip_config_dir(),
                     names.empty() ? "(none)" : names);
}

bool looks_like_path(const std::string& s) {
  auto ext = fs::path(s).extension().string();
  return s.find('/') != std::string::npos || ext == ".yaml" || ext == ".yml";
}

// Whether p names a regular file; false (never an exception) for a name the OS refuses, such as
// one longer than NAME_MAX.
bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// Resolves a preset name or a file path (relative paths against `relative_to`, if given).
fs::path resolve_config_file(const std::string& name_or_path, const fs::path& relative_to,
                             const std::string& referrer) {
  const std::string by = referrer.empty() ? "" : referrer + ": ";
  if (looks_like_path(name_or_path)) {
    fs::path p = name_or_path;
    if (p.is_relative() && !relative_to.empty()) p = relative_to / p;
    if (!is_file(p))
      throw ConfigError(fmt::format("{}chip config file '{}' not found; {}", by, p.string(),
                                    presets_hint()));
    return p;
  }
  fs::path p = fs::path(chip_config_dir()) / (name_or_path + ".yaml");
  if (!is_file(p))
    throw ConfigError(fmt::format("{}unknown chip '{}' (no file {}); {}, or give a path to a "
                                  "YAML file",
                                  by, name_or_path, p.string(), presets_hint()));
  return p;
}

// Loads one file and, recursively, the file it extends. `chain` holds the files being loaded
// (to reject a cycle of extends).
Tree load_tree(const fs::path& file, std::vector<std::string>& chain) {
  const std::string fname = file.string();
  std::error_code ec;
  std::string canonical = fs::weakly_canonical(file, ec).string();
  if (ec) canonical = fname;
  if (std::find(chain.begin(), chain.end(), canonical) != chain.end())
    throw ConfigError(fmt::format("{}: 'extends' leads back to this file (a cycle)", fname));
  YAML::Node root;
  try {
    root = YAML::Load(read_input_file<ConfigError>(fname, "chip config", kMaxConfigFileBytes));
  } catch (const YAML::BadFile&) {
    throw ConfigError(fmt::format("{}: cannot read file", fname));
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}:{}:{}: YAML syntax error: {}", fname, e.mark.line + 1,
                                  e.mark.column + 1, e.msg));
  }
  if (root.IsNull()) throw ConfigError(fmt::format("{}: the file is empty", fname));
  if (!root.IsMap())
    throw ConfigError(fmt::format("{}:{}: expected a map of keys at the top level", fname,
                                  root.Mark().line + 1));
  Tree tree;
  const YAML::Node& const_root = root;
  if (const YAML::Node base = const_root["extends"]) {
    std::string where = fmt::format("{}:{}", fname, base.Mark().line + 1);
    if (!base.IsScalar())
      throw ConfigError(fmt::format("{}: key 'extends': expected a preset name or file path, "
                                    "got {}",
                                    where, describe_value(base)));
    chain.push_back(canonical);
    tree = load_tree(resolve_config_file(base.Scalar(), file.parent_path(), where), chain);
    chain.pop_back();
    tree.erase("name");  // a file's name is its own (or its file name), never inherited
  }
  flatten(root, "", fname, "", tree);  // skips the top-level "extends"
  return tree;
}

// Applies one "dotted.key=value" override; the key must already exist in the tree.
void apply_override(Tree& tree, const std::string& text, const std::string& file) {
  const std::string origin = fmt::format("{}: override '{}'", file, text);
  size_t eq = text.find('=');
  auto trim = [](std::string s) {
    s.erase(0, s.find_first_not_of(" \t"));
    s.erase(s.find_last_not_of(" \t") + 1);
    return s;
  };
  std::string key = trim(text.substr(0, eq));
  if (eq == std::string::npos || key.empty())
    throw ConfigError(fmt::format("{}: expected dotted.key=value", origin));
  std::string value_text = trim(text.substr(eq + 1));
  if (value_text.empty())
    throw ConfigError(
        fmt::format("{}: key '{}': empty value (use ~ to delete a key)", origin, key));
  if (!tree.count(key) && !has_subtree(tree, key)) {
    std::vector<std::string> existing;
    for (const auto& kv : tree) existing.push_back(kv.first);
    throw ConfigError(fmt::format("{}: key '{}' does not exist in this configuration{}", origin,
                                  key, did_you_mean(key, existing)));
  }
  YAML::Node value;
  try {
    value = YAML::Load(value_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: key '{}': value is not valid YAML: {}", origin, key, e.msg));
  }
  if (value.IsMap()) {
    erase_subtree(tree, key);
    flatten(value, key, file, origin, tree);
  } else {
    set_leaf(tree, key, Leaf{value, origin});
  }
}

void check_known_keys(const Tree& tree) {
  std::vector<std::string> schema;
  for (const auto& [key, leaf] : tree) {
    switch (match_schema(key)) {
      case KeyMatch::Leaf:
        break;
      case KeyMatch::Map:
        throw ConfigError(fmt::format("{}: key '{}': expected a map (keys below it), got {}",
                                      leaf.origin, key, describe_value(leaf.value)));
      case KeyMatch::BelowLeaf: {
        auto parts = split_key(key);
        size_t n = parts.size() - 1;
        while (n > 1 && match_schema(join_key(parts, n)) != KeyMatch::Leaf) --n;
        throw ConfigError(fmt::format("{}: key '{}': expected a value, got a map", leaf.origin,
                                      join_key(parts, n)));
      }
      case KeyMatch::Unknown:
        if (schema.empty()) schema = all_schema_keys();
        throw ConfigError(fmt::format("{}: unknown key '{}'{}", leaf.origin, key,
                                      did_you_mean(key, schema)));
    }
  }
}

// "64 GiB" for a whole number of a binary unit, else the plain byte count.
std::string format_bytes(uint64_t v) {
  static const std::pair<const char*, int> kUnits[] = {{"TiB", 40}, {"GiB", 30}, {"MiB", 20},
                                                       {"KiB", 10}};
  for (const auto& [unit, shift] : kUnits)
    if (v != 0 && v % (1ull << shift) == 0) return fmt::format("{} {}", v >> shift, unit);
  return fmt::format("{}", v);
}

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

// Typed access to the flattened tree; every error names the file (and line) and the key.
class Reader {
 public:
  Reader(const Tree& tree, std::string file) : m_tree(tree), m_file(std::move(file)) {}

  bool has(const std::string& key) const { return m_tree.count(key) != 0; }

  // Where a key (or, for a map key, the first key below it) was set; the file if it is absent.
  std::string where(const std::string& key) const {
    auto it = m_tree.find(key);
    if (it != m_tree.end()) return it->second.origin;
    it = m_tree.lower_bound(key + ".");
    return it == m_tree.end() || !starts_with(it->first, key + ".") ? m_file : it->second.origin;
  }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw ConfigError(fmt::format("{}: key '{}': {}", where(key), key, what));
  }

  // Names of the direct children of a map key, in order.
  std::vector<std::string> children(const std::string& key) const {
    std::vector<std::string> out;
    const std::string prefix = key + ".";
    for (auto it = m_tree.lower_bound(prefix); it != m_tree.end() && starts_with(it->first, prefix);
         ++it) {
      std::string child = it->first.substr(prefix.size());
      child = child.substr(0, child.find('.'));
      if (out.empty() || out.back() != child) out.push_back(child);
    }
    return out;
  }
  void require_map(const std::string& key) const {
    if (children(key).empty())
      throw ConfigError(fmt::format("{}: missing required key '{}'", m_file, key));
  }

  const YAML::Node& node(const std::string& key) const {
    auto it = m_tree.find(key);
    if (it == m_tree.end())
      throw ConfigError(fmt::format("{}: missing required key '{}'", m_file, key));
    return it->second.value;
  }
  std::string scalar(const std::string& key, const char* expected) const {
    const YAML::Node& n = node(key);
    if (!n.IsScalar()) fail(key, fmt::format("expected {}, got {}", expected, describe_value(n)));
    return n.Scalar();
  }

  std::string get_string(const std::string& key) const { return scalar(key, "a name"); }

  // An integer in [min, max].
  int get_int(const std::string& key, int min, int max = std::numeric_limits<int>::max()) const {
    const std::string expected = max == std::numeric_limits<int>::max()
                                     ? fmt::format("an integer >= {}", min)
                                     : fmt::format("an integer in [{}, {}]", min, max);
    std::string s = scalar(key, expected.c_str());
    errno = 0;
    char* end = nullptr;
    long long v = std::strtoll(s.c_str(), &end, 10);
    if (s.empty() || *end != '\0' || errno == ERANGE || v < min || v > max)
      fail(key, fmt::format("expected {}, got '{}'", expected, s));
    return static_cast<int>(v);
  }

  // A finite number > min (or >= min when !exclusive), and <= max.
  double get_number(const std::string& key, double min, bool exclusive,
                    double max = std::numeric_limits<double>::max()) const {
    const std::string expected =
        max == std::numeric_limits<double>::max()
            ? fmt::format("a number {} {}", exclusive ? ">" : ">=", min)
            : fmt::format("a number in {}{:g}, {:g}]", exclusive ? "(" : "[", min, max);
    std::string s = scalar(key, expected.c_str());
    char* end = nullptr;
    double v = std::strtod(s.c_str(), &end);
    if (s.empty() || *end != '\0' || !std::isfinite(v) || v < min || (exclusive && v == min) ||
        v > max)
      fail(key, fmt::format("expected {}, got '{}'", expected, s));
    return v;
  }

  // A rate in GB/s (10^9 B/s) whose bytes per cycle at `clock_mhz` lie in [min_bpc, max_bpc].
  double get_gbps(const std::string& key, double clock_mhz, double min_bpc,
                  double max_bpc) const {
    const double gbps = get_number(key, 0, true);
    const double per_cycle = gbps * 1e3 / clock_mhz;
    if (!(per_cycle >= min_bpc && per_cycle <= max_bpc))
      fail(key, fmt::format("{} GB/s is {:g} bytes per cycle at clock_mhz {}; expected {:g} to "
                            "{:g} bytes per cycle, i.e. {:g} to {:g} GB/s at this clock",
                            gbps, per_cycle, clock_mhz, min_bpc, max_bpc,
                            min_bpc * clock_mhz / 1e3, max_bpc * clock_mhz / 1e3));
    return gbps;
  }

  bool get_bool(const std::string& key) const {
    std::string s = scalar(key, "true or false");
    if (s == "true" || s == "True" || s == "TRUE") return true;
    if (s == "false" || s == "False" || s == "FALSE") return false;
    fail(key, fmt::format("expected true or false, got '{}'", s));
  }

  // A size in bytes in [1, max]: an integer, or an integer with a unit B, KiB, MiB, GiB or TiB.
  uint64_t get_bytes(const std::string& key, uint64_t max) const {
    const std::string expected = fmt::format(
        "a size in bytes from 1 to {} (e.g. 65536 or 64 KiB)", format_bytes(max));
    std::string s = scalar(key, expected.c_str());
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    bool ok = !s.empty() && std::isdigit(static_cast<unsigned char>(s[0])) && errno != ERANGE;
    std::string unit = end;
    unit.erase(0, unit.find_first_not_of(' '));
    static const std::pair<const char*, int> kUnits[] = {
        {"", 0}, {"B", 0}, {"KiB", 10}, {"MiB", 20}, {"GiB", 30}, {"TiB", 40}};
    int shift = -1;
    for (const auto& [name, sh] : kUnits)
      if (unit == name) shift = sh;
    if (!ok || shift < 0 || v == 0 || v > (max >> shift))
      fail(key, fmt::format("expected {}, got '{}'", expected, s));
    return static_cast<uint64_t>(v) << shift;
  }

  std::vector<std::string> get_names(const std::string& key, const char* expected) const {
    const YAML::Node& n = node(key);
    if (!n.IsSequence()) fail(key, fmt::format("expected {}, got {}", expected, describe_value(n)));
    std::vector<std::string> out;
    for (const auto& item : n) {
      if (!item.IsScalar()) fail(key, fmt::format("expected {}, got a nested item", expected));
      out.push_back(item.Scalar());
    }
    return out;
  }

  const std::string& file() const { return m_file; }

 private:
  const Tree& m_tree;
  std::string m_file;
};

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
  c.host_op_dispatch_us = r.get_number("host.op_dispatch_us", 0, false, max_us);
  c.host_graph_dispatch_us = r.get_number("host.graph_dispatch_us", 0, false, max_us);
}

ChipConfig parse_tree(const Tree& tree, const std::string& file, const std::string& default_name) {
  check_known_keys(tree);
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

  c.scalar_cycles_per_insn = r.get_int("scalar.cycles_per_insn", 1, kMaxLatencyCycles);
  c.issue_queue_depth = r.get_int("issue_queue_depth", 1, kMaxIssueQueueDepth);

  parse_paths(r, c);
  parse_memory(r, c);

  parse_overheads(r, c);
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
  return c;
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("''") : std::string(1, ch);
  return q + "'";
}

}  // namespace

std::string chip_config_dir() {
  const char* env = std::getenv("NPUSIM_CONFIG_DIR");
  return env && *env ? std::string(env) : std::string(NPUSIM_CONFIG_DIR);
}

std::vector<std::string> list_chip_presets() {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(chip_config_dir(), ec))
    if (entry.is_regular_file() && entry.path().extension() == ".yaml")
      names.push_back(entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

ChipConfig load_chip_config(const std::string& name_or_path,
                            const std::vector<std::string>& overrides) {
  fs::path file = resolve_config_file(name_or_path, {}, "");
  std::vector<std::string> chain;
  Tree tree = load_tree(file, chain);
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
      "  transcendental_factor: {}\n",
      c.vector_bytes_per_cycle, c.vector_latency_cycles, c.vector_reduce_factor,
      c.vector_transcendental_factor);
  o << fmt::format("scalar:\n  cycles_per_insn: {}\n", c.scalar_cycles_per_insn);
  o << fmt::format("issue_queue_depth: {}\n", c.issue_queue_depth);
  o << "paths:\n";
  for (const auto& [path, rate] : c.path_bytes_per_cycle)
    o << fmt::format("  {}: {{bytes_per_cycle: {}, latency_cycles: {}}}\n",
                     path_name(path.first, path.second), rate,
                     c.path_latency(path.first, path.second));
  o << fmt::format("memory:\n  hbm:\n    bytes: {}\n    gbps: {}\n    latency_cycles: {}\n",
                   format_bytes(c.hbm_bytes), c.hbm_gbps, c.hbm_latency_cycles);
  o << fmt::format(
      "  l2:\n    bytes: {}\n    gbps: {}\n    line_bytes: {}\n    ways: {}\n"
      "    latency_cycles: {}\n    core_read_bytes_per_cycle: {}\n"
      "    core_write_bytes_per_cycle: {}\n",
      format_bytes(c.l2_bytes), c.l2_gbps, c.l2_line_bytes, c.l2_ways, c.l2_latency_cycles,
      c.l2_read_bytes_per_cycle, c.l2_write_bytes_per_cycle);
  o << fmt::format("task:\n  dispatch_us: {}\n  block_start_cycles: {}\n  done_us: {}\n",
                   c.task_dispatch_us, c.task_block_start_cycles, c.task_done_us);
  o << fmt::format("host:\n  op_dispatch_us: {}\n  graph_dispatch_us: {}\n",
                   c.host_op_dispatch_us, c.host_graph_dispatch_us);
  o << fmt::format("hdc:\n  gbps: {}\n  latency_us: {}\n", c.hdc_gbps, c.hdc_latency_us);
  o << fmt::format(
      "sync:\n  flag_ids: {}\n  cross_core_flag_ids: {}\n  cross_core_max_pending: {}\n",
      c.flag_ids, c.cross_core_flag_ids, c.cross_core_max_pending);
  return o.str();
}

}  // namespace npusim
