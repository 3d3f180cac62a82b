// The YAML layer of the configuration loaders (config_tree.h).
#include "sim/config/config_tree.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <set>

#include <fmt/format.h>

#include "common/error.h"
#include "common/input_file.h"

namespace npusim::config_tree {
namespace {

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

// Removes `key` and everything below it.
void erase_subtree(Tree& t, const std::string& key) {
  t.erase(key);
  const std::string prefix = key + ".";
  for (auto it = t.lower_bound(prefix); it != t.end() && starts_with(it->first, prefix);)
    it = t.erase(it);
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

// Whether p names a regular file; false (never an exception) for a name the OS refuses, such as
// one longer than NAME_MAX.
bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

std::string presets_hint(const PresetDir& presets) {
  std::string names;
  for (const auto& p : presets.names()) names += (names.empty() ? "" : ", ") + p;
  return fmt::format("available presets in {}: {}", presets.dir, names.empty() ? "(none)" : names);
}

}  // namespace

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

bool has_subtree(const Tree& t, const std::string& key) {
  const std::string prefix = key + ".";
  auto it = t.lower_bound(prefix);
  return it != t.end() && starts_with(it->first, prefix);
}

// "64 GiB" for a whole number of a binary unit, else the plain byte count.
std::string format_bytes(uint64_t v) {
  static const std::pair<const char*, int> kUnits[] = {
      {"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}};
  for (const auto& [unit, shift] : kUnits)
    if (v != 0 && v % (1ull << shift) == 0) return fmt::format("{} {}", v >> shift, unit);
  return fmt::format("{}", v);
}

bool looks_like_path(const std::string& s) {
  auto ext = fs::path(s).extension().string();
  return s.find('/') != std::string::npos || ext == ".yaml" || ext == ".yml";
}

std::string quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("''") : std::string(1, ch);
  return q + "'";
}

std::vector<std::string> PresetDir::names() const {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec))
    if (entry.is_regular_file() && entry.path().extension() == ".yaml")
      out.push_back(entry.path().stem().string());
  std::sort(out.begin(), out.end());
  return out;
}

fs::path resolve_config_file(const std::string& name_or_path, const fs::path& relative_to,
                             const std::string& referrer, const PresetDir& presets) {
  const std::string by = referrer.empty() ? "" : referrer + ": ";
  if (looks_like_path(name_or_path)) {
    fs::path p = name_or_path;
    if (p.is_relative() && !relative_to.empty()) p = relative_to / p;
    if (!is_file(p))
      throw ConfigError(fmt::format("{}{} config file '{}' not found; {}", by, presets.kind,
                                    p.string(), presets_hint(presets)));
    return p;
  }
  fs::path p = fs::path(presets.dir) / (name_or_path + ".yaml");
  if (!is_file(p))
    throw ConfigError(
        fmt::format("{}unknown {} '{}' (no file {}); {}, or give a path to a "
                    "YAML file",
                    by, presets.kind, name_or_path, p.string(), presets_hint(presets)));
  return p;
}

namespace {

// Loads one file and, recursively, the file it extends. `chain` holds the files being loaded
// (to reject a cycle of extends).
Tree load_tree(const fs::path& file, std::vector<std::string>& chain, const PresetDir& presets) {
  const std::string fname = file.string();
  std::error_code ec;
  std::string canonical = fs::weakly_canonical(file, ec).string();
  if (ec) canonical = fname;
  if (std::find(chain.begin(), chain.end(), canonical) != chain.end())
    throw ConfigError(fmt::format("{}: 'extends' leads back to this file (a cycle)", fname));
  YAML::Node root;
  try {
    root = YAML::Load(
        read_input_file<ConfigError>(fname, presets.kind + " config", kMaxConfigFileBytes));
  } catch (const YAML::BadFile&) {
    throw ConfigError(fmt::format("{}: cannot read file", fname));
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}:{}:{}: YAML syntax error: {}", fname, e.mark.line + 1,
                                  e.mark.column + 1, e.msg));
  }
  if (root.IsNull()) throw ConfigError(fmt::format("{}: the file is empty", fname));
  if (!root.IsMap())
    throw ConfigError(
        fmt::format("{}:{}: expected a map of keys at the top level", fname, root.Mark().line + 1));
  Tree tree;
  const YAML::Node& const_root = root;
  if (const YAML::Node base = const_root["extends"]) {
    std::string where = fmt::format("{}:{}", fname, base.Mark().line + 1);
    if (!base.IsScalar())
      throw ConfigError(
          fmt::format("{}: key 'extends': expected a preset name or file path, "
                      "got {}",
                      where, describe_value(base)));
    chain.push_back(canonical);
    tree = load_tree(resolve_config_file(base.Scalar(), file.parent_path(), where, presets), chain,
                     presets);
    chain.pop_back();
    tree.erase("name");  // a file's name is its own (or its file name), never inherited
  }
  flatten(root, "", fname, "", tree);  // skips the top-level "extends"
  return tree;
}

}  // namespace

Tree load_tree(const fs::path& file, const PresetDir& presets) {
  std::vector<std::string> chain;
  return load_tree(file, chain, presets);
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

namespace {

bool component_matches(const Schema& schema, const std::string& pattern, const std::string& part) {
  if (pattern.empty() || pattern[0] != '<') return pattern == part;
  return schema.placeholder_matches && schema.placeholder_matches(pattern, part);
}

}  // namespace

KeyMatch Schema::match(const std::string& key) const {
  auto parts = split_key(key);
  KeyMatch best = KeyMatch::Unknown;
  for (const std::string& pattern : patterns) {
    auto pp = split_key(pattern);
    size_t n = std::min(pp.size(), parts.size());
    bool ok = true;
    for (size_t i = 0; i < n && ok; ++i) ok = component_matches(*this, pp[i], parts[i]);
    if (!ok) continue;
    if (pp.size() == parts.size()) return KeyMatch::Leaf;
    best = pp.size() > parts.size() ? KeyMatch::Map : KeyMatch::BelowLeaf;
  }
  return best;
}

std::vector<std::string> Schema::all_keys() const {
  std::vector<std::string> out;
  for (const std::string& pattern : patterns) {
    std::vector<std::string> partial = {""};
    for (const auto& part : split_key(pattern)) {
      std::vector<std::string> values = part[0] == '<' && placeholder_values
                                            ? placeholder_values(part)
                                            : std::vector<std::string>{part};
      std::vector<std::string> next;
      for (const auto& p : partial)
        for (const auto& v : values) next.push_back(p.empty() ? v : p + "." + v);
      partial = std::move(next);
    }
    out.insert(out.end(), partial.begin(), partial.end());
  }
  return out;
}

void check_known_keys(const Tree& tree, const Schema& schema) {
  std::vector<std::string> known;
  for (const auto& [key, leaf] : tree) {
    switch (schema.match(key)) {
      case KeyMatch::Leaf: break;
      case KeyMatch::Map:
        throw ConfigError(fmt::format("{}: key '{}': expected a map (keys below it), got {}",
                                      leaf.origin, key, describe_value(leaf.value)));
      case KeyMatch::BelowLeaf: {
        auto parts = split_key(key);
        size_t n = parts.size() - 1;
        while (n > 1 && schema.match(join_key(parts, n)) != KeyMatch::Leaf) --n;
        throw ConfigError(fmt::format("{}: key '{}': expected a value, got a map", leaf.origin,
                                      join_key(parts, n)));
      }
      case KeyMatch::Unknown:
        if (known.empty()) known = schema.all_keys();
        throw ConfigError(
            fmt::format("{}: unknown key '{}'{}", leaf.origin, key, did_you_mean(key, known)));
    }
  }
}

}  // namespace npusim::config_tree
