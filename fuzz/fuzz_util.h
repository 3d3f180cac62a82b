// Shared pieces of the libFuzzer targets (fuzz/README.md). A target accepts an input when the
// code under test returns normally or throws npusim::Error (the documented way to reject bad
// input); any other exception escapes LLVMFuzzerTestOneInput and aborts, and a broken invariant
// of an accepted input aborts through fuzz_require, so libFuzzer reports either as a crash
// with the input saved.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"

namespace npusim::fuzz {

// Aborts with `what` when `ok` is false.
inline void fuzz_require(bool ok, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what.c_str());
  std::abort();
}

// Runs f; npusim::Error is a rejection (returns false), anything else escapes.
template <typename F>
bool accepted(F&& f) {
  try {
    f();
    return true;
  } catch (const Error&) {
    return false;
  }
}

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// A config input's directives (YAML comment lines): every "#set KEY=VALUE" is an override, in
// order; a first line "<preset_tag>NAME" (e.g. "#chip ") names a preset to load instead of the
// text.
struct ConfigDirectives {
  std::string preset;  // empty: load the text itself
  std::vector<std::string> overrides;
};
inline ConfigDirectives config_directives(std::string_view text, std::string_view preset_tag) {
  ConfigDirectives d;
  for (size_t pos = 0; pos < text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    const std::string_view line = text.substr(pos, nl - pos);
    if (line.substr(0, 5) == "#set ") d.overrides.emplace_back(line.substr(5));
    if (pos == 0 && line.substr(0, preset_tag.size()) == preset_tag)
      d.preset = line.substr(preset_tag.size());
    pos = nl + 1;
  }
  return d;
}

}  // namespace npusim::fuzz
