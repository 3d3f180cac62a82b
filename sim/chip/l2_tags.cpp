#include "sim/chip/l2_tags.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {

L2Tags::L2Tags(uint64_t capacity_bytes, uint32_t line_bytes, int ways, bool write_back)
    : m_line_bytes(line_bytes), m_ways(ways), m_write_back(write_back) {
  if (capacity_bytes > 0 && (line_bytes == 0 || ways <= 0))
    throw ConfigError(
        fmt::format("L2: line_bytes ({}) and ways ({}) must be positive", line_bytes, ways));
  if (capacity_bytes == 0) {  // no L2: lookups still walk GM ranges in lines, all missing
    m_line_bytes = line_bytes ? line_bytes : kDefaultLineBytes;
    m_ways = 1;
  }
  const uint64_t set_bytes = static_cast<uint64_t>(line_bytes) * static_cast<uint64_t>(ways);
  m_sets = capacity_bytes == 0 ? 0 : std::max<uint64_t>(1, capacity_bytes / set_bytes);
  const size_t n = static_cast<size_t>(m_sets * static_cast<uint64_t>(ways));
  m_set_gen.assign(static_cast<size_t>(m_sets), 0);  // every set older than generation 1
  m_tag.assign(n, kInvalidTag);
  m_used.assign(n, 0);
  m_dirty.assign(m_write_back ? n : 0, 0);
}

long L2Tags::find(uint64_t line) const {
  if (m_sets == 0) return -1;
  const size_t set = static_cast<size_t>(line % m_sets);
  if (!set_current(set)) return -1;
  const size_t base = set * static_cast<size_t>(m_ways);
  for (size_t w = base; w < base + static_cast<size_t>(m_ways); ++w)
    if (m_tag[w] == line) return static_cast<long>(w);
  return -1;
}

bool L2Tags::contains(uint64_t addr) const { return find(addr / m_line_bytes) >= 0; }

void L2Tags::invalidate_range(uint64_t addr, uint64_t bytes) {
  if (m_sets == 0 || bytes == 0) return;
  const uint64_t first = addr / m_line_bytes, last = (addr + bytes - 1) / m_line_bytes;
  if (last - first >= m_tag.size()) {  // more lines than the L2 holds: scan the tags once
    // (A stale set's tags may be dropped too: refresh_set empties them anyway.)
    for (size_t w = 0; w < m_tag.size(); ++w)
      if (m_tag[w] >= first && m_tag[w] <= last) m_tag[w] = kInvalidTag;
    return;
  }
  for (uint64_t line = first; line <= last; ++line) {
    const long w = find(line);
    if (w >= 0) m_tag[static_cast<size_t>(w)] = kInvalidTag;
  }
}

bool L2Tags::access(uint64_t line, size_t set, bool allocate, bool write, uint64_t* writeback) {
  const bool dirty = m_write_back && write;
  refresh_set(set);
  const size_t base = set * static_cast<size_t>(m_ways);
  ++m_clock;
  size_t victim = base;
  bool victim_valid = true;
  for (size_t w = base; w < base + static_cast<size_t>(m_ways); ++w) {
    const bool valid = m_tag[w] != kInvalidTag;
    if (m_tag[w] == line) {
      m_used[w] = m_clock;
      if (dirty) m_dirty[w] = 1;
      return true;
    }
    if (!allocate) continue;
    // Prefer an invalid way, else the least recently used one.
    if (victim_valid && (!valid || m_used[w] < m_used[victim])) {
      victim = w;
      victim_valid = valid;
    }
  }
  if (!allocate) return false;
  if (m_write_back) {
    if (victim_valid && m_dirty[victim]) *writeback += m_line_bytes;
    m_dirty[victim] = dirty ? 1 : 0;
  }
  m_tag[victim] = line;
  m_used[victim] = m_clock;
  return false;
}

L2Outcome L2Tags::access_range(uint64_t addr, uint64_t bytes, isa::L2Hint l2, bool write) {
  L2Outcome o;
  if (bytes == 0) return o;
  const uint64_t end = addr + bytes;
  const uint64_t first = addr / m_line_bytes, lines = (end - 1) / m_line_bytes - first + 1;
  if (l2 == isa::L2Hint::BYPASS) {
    o.miss_bytes = bytes;
    o.bypass_lines = lines;
    if (write) invalidate_range(addr, bytes);
    return o;
  }
  if (m_sets == 0) {  // no L2: every line is a lookup that misses
    o.miss_bytes = bytes;
    o.miss_lines = lines;
    return o;
  }
  const bool allocate = l2 == isa::L2Hint::NORMAL;
  // A write miss that allocates a line of a write-back L2 is taken by the line.
  const bool absorb = allocate && write && m_write_back;
  const size_t last_set = static_cast<size_t>(m_sets - 1);
  size_t set = static_cast<size_t>(first % m_sets);
  uint64_t line = first;
  while (addr < end) {
    const uint64_t n = std::min(end, (line + 1) * m_line_bytes) - addr;
    if (access(line, set, allocate, write, &o.writeback_bytes)) {
      o.hit_bytes += n;
      ++o.hit_lines;
    } else {
      (absorb ? o.absorbed_bytes : o.miss_bytes) += n;
      if (allocate && !write) o.fill_bytes += m_line_bytes - n;  // the rest of the line
      ++o.miss_lines;
    }
    addr += n;
    ++line;
    set = set == last_set ? 0 : set + 1;  // the next line's set
  }
  return o;
}

void L2Tags::invalidate_all() {
  if (++m_generation == 0) {  // wrapped: really clear
    std::fill(m_set_gen.begin(), m_set_gen.end(), 0);
    m_generation = 1;
  }
}

}  // namespace npusim
