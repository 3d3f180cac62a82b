// The YAML layer shared by the chip and system configuration loaders: a file is flattened into
// a map from dotted key ("memory.l2.bytes") to a leaf value (scalar, list or null) that remembers
// where it was set; `extends` lays a file over the base it names; "dotted.key=value" overrides
// are laid over the result; keys are checked against a schema; Reader gives typed access whose
// errors name the file (and line) and the key.
#pragma once

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "common/error.h"

namespace npusim::config_tree {

namespace fs = std::filesystem;

struct Leaf {
  YAML::Node value;    // scalar, sequence or null
  std::string origin;  // "file:line", or "file: override 'key=value'"
};
using Tree = std::map<std::string, Leaf>;  // dotted key -> leaf

// Where the presets of one kind of configuration live, and what it is called in errors.
struct PresetDir {
  std::string kind;                        // "chip" or "system"
  std::string dir;                         // directory of <name>.yaml presets
  std::vector<std::string> names() const;  // the *.yaml stems in dir, sorted
};

std::vector<std::string> split_key(const std::string& key);
std::string join_key(const std::vector<std::string>& parts, size_t n);
bool starts_with(const std::string& s, const std::string& prefix);
std::string did_you_mean(const std::string& key, const std::vector<std::string>& candidates);
std::string describe_value(const YAML::Node& n);
bool has_subtree(const Tree& t, const std::string& key);
// "64 GiB" for a whole number of a binary unit, else the plain byte count.
std::string format_bytes(uint64_t v);
// 'text' with single quotes doubled (a YAML single-quoted scalar).
std::string quote(const std::string& s);

// Whether a configuration reference is a file path (has a '/' or ends in .yaml/.yml), not a
// preset name.
bool looks_like_path(const std::string& s);
// A preset name (looked up as <dir>/<name>.yaml) or a path to a YAML file (anything with a '/'
// or ending in .yaml/.yml; relative paths against `relative_to` if given). `referrer` prefixes
// errors ("file:line" of an extends).
fs::path resolve_config_file(const std::string& name_or_path, const fs::path& relative_to,
                             const std::string& referrer, const PresetDir& presets);
// Loads one file and, recursively, the file it extends (resolved in `presets`). The base's
// "name" is never inherited.
Tree load_tree(const fs::path& file, const PresetDir& presets);
// Applies one "dotted.key=value" override; the key must already exist in the tree.
void apply_override(Tree& tree, const std::string& text, const std::string& file);

// How a dotted key relates to a schema.
enum class KeyMatch { Leaf, Map /* a proper prefix of a schema key */, BelowLeaf, Unknown };
// A schema: the patterns of its keys ("cores.<kind>.count") and what a placeholder stands for.
struct Schema {
  std::vector<std::string> patterns;
  // Whether `part` is a value of placeholder `pattern` ("<kind>"); unset: no placeholders.
  std::function<bool(const std::string& pattern, const std::string& part)> placeholder_matches;
  // Every value of a placeholder, for "did you mean" suggestions.
  std::function<std::vector<std::string>(const std::string& pattern)> placeholder_values;
  KeyMatch match(const std::string& key) const;
  std::vector<std::string> all_keys() const;
};
// Throws ConfigError for the first key that is not a leaf of the schema.
void check_known_keys(const Tree& tree, const Schema& schema);

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
  double get_gbps(const std::string& key, double clock_mhz, double min_bpc, double max_bpc) const {
    const double gbps = get_number(key, 0, true);
    const double per_cycle = gbps * 1e3 / clock_mhz;
    if (!(per_cycle >= min_bpc && per_cycle <= max_bpc))
      fail(key, fmt::format("{} GB/s is {:g} bytes per cycle at clock_mhz {}; expected {:g} to "
                            "{:g} bytes per cycle, i.e. {:g} to {:g} GB/s at this clock",
                            gbps, per_cycle, clock_mhz, min_bpc, max_bpc, min_bpc * clock_mhz / 1e3,
                            max_bpc * clock_mhz / 1e3));
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
    const std::string expected =
        fmt::format("a size in bytes from 1 to {} (e.g. 65536 or 64 KiB)", format_bytes(max));
    std::string s = scalar(key, expected.c_str());
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(s.c_str(), &end, 10);
    bool ok = !s.empty() && std::isdigit(static_cast<unsigned char>(s[0])) && errno != ERANGE;
    std::string unit = end;
    unit.erase(0, unit.find_first_not_of(' '));
    static const std::pair<const char*, int> kUnits[] = {{"", 0},     {"B", 0},    {"KiB", 10},
                                                         {"MiB", 20}, {"GiB", 30}, {"TiB", 40}};
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

}  // namespace npusim::config_tree
