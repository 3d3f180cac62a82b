// Tags of the shared L2: set-associative with LRU replacement, over line addresses only (the
// data lives in DeviceMemory). Lines fill on a miss. invalidate_all() is O(1) (a generation
// number), so the cache can start cold at every launch cheaply.
#pragma once

#include <cstdint>
#include <vector>

namespace npusim {

// What looking up one GM range found.
struct L2Outcome {
  uint64_t hit_bytes = 0, miss_bytes = 0;  // bytes in lines that hit / missed
  uint64_t hit_lines = 0, miss_lines = 0;  // lookups that hit / missed
};

class L2Tags {
 public:
  // capacity_bytes / (line_bytes * ways) sets (at least one set when capacity_bytes > 0);
  // capacity_bytes == 0 means no L2: every access misses.
  L2Tags(uint64_t capacity_bytes, uint32_t line_bytes, int ways);
  uint32_t line_bytes() const { return m_line_bytes; }
  // Looks up the line holding byte address `addr`; on a miss, fills it (evicting the LRU way).
  // Returns true on a hit.
  bool access(uint64_t addr);
  // Looks up every line of [addr, addr + bytes) in address order (a GM range of a transfer).
  L2Outcome access_range(uint64_t addr, uint64_t bytes);
  void invalidate_all();

 private:
  static constexpr uint32_t kDefaultLineBytes = 512;  // line granularity when there is no L2
  uint32_t m_line_bytes;
  int m_ways;
  uint64_t m_sets;
  uint64_t m_clock = 0;      // LRU time stamps
  uint32_t m_generation = 1;
  std::vector<uint64_t> m_tag;       // [set * ways + way]: line address
  std::vector<uint64_t> m_used;      // last access stamp
  std::vector<uint32_t> m_valid_gen; // valid iff == m_generation
};

}  // namespace npusim
