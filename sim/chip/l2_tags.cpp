#include "sim/chip/l2_tags.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {

L2Tags::L2Tags(uint64_t capacity_bytes, uint32_t line_bytes, int ways)
    : m_line_bytes(line_bytes), m_ways(ways) {
  if (capacity_bytes > 0 && (line_bytes == 0 || ways <= 0))
    throw ConfigError(fmt::format("L2: line_bytes ({}) and ways ({}) must be positive",
                                  line_bytes, ways));
  if (capacity_bytes == 0) {  // no L2: lookups still walk GM ranges in lines, all missing
    m_line_bytes = line_bytes ? line_bytes : kDefaultLineBytes;
    m_ways = 1;
  }
  const uint64_t set_bytes = static_cast<uint64_t>(line_bytes) * static_cast<uint64_t>(ways);
  m_sets = capacity_bytes == 0 ? 0 : std::max<uint64_t>(1, capacity_bytes / set_bytes);
  const size_t n = static_cast<size_t>(m_sets * static_cast<uint64_t>(ways));
  m_tag.assign(n, 0);
  m_used.assign(n, 0);
  m_valid_gen.assign(n, 0);
}

bool L2Tags::access(uint64_t addr) {
  if (m_sets == 0) return false;
  const uint64_t line = addr / m_line_bytes;
  const size_t base = static_cast<size_t>((line % m_sets) * static_cast<uint64_t>(m_ways));
  ++m_clock;
  size_t victim = base;
  bool victim_valid = true;
  for (size_t w = base; w < base + static_cast<size_t>(m_ways); ++w) {
    const bool valid = m_valid_gen[w] == m_generation;
    if (valid && m_tag[w] == line) {
      m_used[w] = m_clock;
      return true;
    }
    // Prefer an invalid way, else the least recently used one.
    if (victim_valid && (!valid || m_used[w] < m_used[victim])) {
      victim = w;
      victim_valid = valid;
    }
  }
  m_tag[victim] = line;
  m_used[victim] = m_clock;
  m_valid_gen[victim] = m_generation;
  return false;
}

L2Outcome L2Tags::access_range(uint64_t addr, uint64_t bytes) {
  L2Outcome o;
  const uint64_t end = addr + bytes;
  while (addr < end) {
    const uint64_t n = std::min(end, (addr / m_line_bytes + 1) * m_line_bytes) - addr;
    if (access(addr)) {
      o.hit_bytes += n;
      ++o.hit_lines;
    } else {
      o.miss_bytes += n;
      ++o.miss_lines;
    }
    addr += n;
  }
  return o;
}

void L2Tags::invalidate_all() {
  if (++m_generation == 0) {  // wrapped: really clear
    std::fill(m_valid_gen.begin(), m_valid_gen.end(), 0);
    m_generation = 1;
  }
}

}  // namespace npusim
