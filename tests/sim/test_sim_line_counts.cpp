// LineCounts (sim/chip/line_counts.h), the per-line reader counts of the L2's same-line
// serialisation, against std::map: random reads counted in and out, with lines chosen to
// collide in the table (long probe runs, removal by backward shift across the table's end)
// and enough of them to grow it; every count is compared after every step.
#include <catch2/catch.hpp>

#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <vector>

#include "sim/chip/line_counts.h"

using npusim::LineCounts;

namespace {

void require_same(const LineCounts& counts, const std::map<uint64_t, uint32_t>& reference) {
  for (const auto& [line, n] : reference) REQUIRE(counts.at(line) == n);
}

}  // namespace

TEST_CASE("LineCounts: counts as a map does, through collisions, removals and growth") {
  std::mt19937_64 rng(7);
  LineCounts counts;
  std::map<uint64_t, uint32_t> reference;
  std::vector<uint64_t> lines;
  // Lines 2^20 apart share their home in small tables; consecutive lines fill probe runs.
  for (uint64_t i = 0; i < 700; ++i) lines.push_back(i % 3 == 0 ? i << 20 : (i << 20) + i);
  for (int step = 0; step < 20000; ++step) {
    const uint64_t line = lines[rng() % lines.size()];
    const bool add = reference.count(line) == 0 || rng() % 2 == 0;
    if (add) {
      REQUIRE(counts.increment(line) == reference[line]);
      ++reference[line];
    } else {
      const uint32_t left = --reference[line];
      if (left == 0) reference.erase(line);
      REQUIRE(counts.decrement(line) == left);
    }
    if (step % 97 == 0) require_same(counts, reference);
  }
  require_same(counts, reference);
  REQUIRE(reference.size() > 256);  // the table grew past its first size's half
  for (const uint64_t line : lines)
    if (reference.count(line) == 0) REQUIRE_THROWS_AS(counts.at(line), std::logic_error);
  counts.clear();
  for (const uint64_t line : lines) REQUIRE_THROWS_AS(counts.at(line), std::logic_error);
  REQUIRE(counts.increment(lines[0]) == 0);
  REQUIRE(counts.at(lines[0]) == 1);
}
