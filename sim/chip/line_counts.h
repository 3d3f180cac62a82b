// Per-line counts of the transfers reading each GM line (MemorySystem's same-line
// serialisation): an open-addressing hash table (linear probing, removal by backward shift)
// whose entries live in one array, so counting a transfer's lines in and out allocates nothing
// per line (a node-based map allocated and freed one node per line of every L2 read).
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace npusim {

class LineCounts {
 public:
  // Adds one reader of `line`; returns the count before (0: the line had no reader).
  uint32_t increment(uint64_t line) {
    if (2 * (m_size + 1) > m_slots.size()) grow();
    size_t i = home(line);
    while (m_slots[i].count != 0 && m_slots[i].line != line) i = (i + 1) & mask();
    Slot& s = m_slots[i];
    if (s.count == 0) {
      s.line = line;
      ++m_size;
    }
    return s.count++;
  }
  // Removes one reader of `line`, which must have one; returns the count after (the line is
  // dropped at 0).
  uint32_t decrement(uint64_t line) {
    size_t i = find(line);
    const uint32_t left = --m_slots[i].count;
    if (left == 0) {
      --m_size;
      // Backward shift: move each following entry of the probe run whose home does not lie
      // cyclically in (i, j] into the hole, so every entry stays reachable from its home.
      for (size_t j = (i + 1) & mask(); m_slots[j].count != 0; j = (j + 1) & mask()) {
        const size_t h = home(m_slots[j].line);
        const bool stays = i <= j ? (i < h && h <= j) : (i < h || h <= j);
        if (stays) continue;
        m_slots[i] = m_slots[j];
        m_slots[j].count = 0;
        i = j;
      }
    }
    return left;
  }
  // The count of `line`, which must have a reader.
  uint32_t at(uint64_t line) const { return m_slots[find(line)].count; }
  void clear() {
    for (Slot& s : m_slots) s.count = 0;
    m_size = 0;
  }

 private:
  struct Slot {
    uint64_t line = 0;
    uint32_t count = 0;  // 0: empty
  };
  size_t mask() const { return m_slots.size() - 1; }
  size_t home(uint64_t line) const {  // Fibonacci hashing onto the power-of-two table
    return static_cast<size_t>((line * 0x9E3779B97F4A7C15ull) >> m_shift);
  }
  size_t find(uint64_t line) const {
    if (!m_slots.empty())
      for (size_t i = home(line); m_slots[i].count != 0; i = (i + 1) & mask())
        if (m_slots[i].line == line) return i;
    throw std::logic_error("LineCounts: a line without readers asked for");
  }
  void grow() {
    std::vector<Slot> old(m_slots.empty() ? size_t{512} : 2 * m_slots.size());
    old.swap(m_slots);
    m_shift = 64;
    for (size_t n = m_slots.size(); n > 1; n >>= 1) --m_shift;
    m_size = 0;
    for (const Slot& s : old)
      if (s.count != 0) {
        size_t i = home(s.line);
        while (m_slots[i].count != 0) i = (i + 1) & mask();
        m_slots[i] = s;
        ++m_size;
      }
  }

  std::vector<Slot> m_slots;  // a power of two in size, at most half full
  size_t m_size = 0;          // lines with a reader
  int m_shift = 64;           // 64 - log2(m_slots.size())
};

}  // namespace npusim
