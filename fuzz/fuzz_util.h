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

}  // namespace npusim::fuzz
