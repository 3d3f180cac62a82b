#include "sim/chip/l2_tags.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {

namespace {

// A range's page origin (L2Tags::set_in) must not lie above its first line: the placement gives
// the first line of the range's block.
void require_origin_below(uint64_t addr, uint64_t page_origin, uint64_t origin_line,
                          uint64_t first_line) {
  if (origin_line > first_line)
    throw Error(
        fmt::format("L2: range at {:#x} lies before its page origin {:#x}", addr, page_origin));
}

}  // namespace

L2Tags::L2Tags(uint64_t capacity_bytes, uint32_t line_bytes, int ways, bool write_back,
               bool page_rotation)
    : m_line_bytes(line_bytes),
      m_ways(ways),
      m_write_back(write_back),
      m_page_rotation(page_rotation) {
  if (capacity_bytes > 0 && (line_bytes == 0 || ways <= 0))
    throw ConfigError(
        fmt::format("L2: line_bytes ({}) and ways ({}) must be positive", line_bytes, ways));
  if (capacity_bytes == 0) {  // no L2: lookups still walk GM ranges in lines, all missing
    m_line_bytes = line_bytes ? line_bytes : kDefaultLineBytes;
    m_ways = 1;
  }
  const uint64_t set_bytes = static_cast<uint64_t>(line_bytes) * static_cast<uint64_t>(ways);
  m_sets = capacity_bytes == 0 ? 0 : std::max<uint64_t>(1, capacity_bytes / set_bytes);
  m_set.assign(static_cast<size_t>(m_sets), SetState{});  // every set older than generation 1
  m_entry.assign(static_cast<size_t>(m_sets * static_cast<uint64_t>(ways)), 0);
}

long L2Tags::find(uint64_t line, uint64_t origin) const {
  if (m_sets == 0) return -1;
  const size_t set = set_of(line, origin);
  if (!set_current(set)) return -1;
  const uint64_t* e = m_entry.data() + set * static_cast<size_t>(m_ways);
  for (uint32_t i = 0; i < m_set[set].count; ++i)
    if (entry_line(e[i]) == line) return static_cast<long>(i);
  return -1;
}

bool L2Tags::contains(uint64_t addr, uint64_t page_origin) const {
  return find(addr / m_line_bytes, page_origin / m_line_bytes) >= 0;
}

void L2Tags::erase(size_t set, size_t i) {
  const size_t base = set * static_cast<size_t>(m_ways);
  uint64_t* e = m_entry.data() + base;
  uint32_t& count = m_set[set].count;
  std::copy(e + i + 1, e + count, e + i);
  if (m_stamp_fills > 0) {
    uint64_t* st = m_stamp.data() + base;
    std::copy(st + i + 1, st + count, st + i);
  }
  --count;
}

void L2Tags::stamp_fills(uint64_t stamp) {
  if (stamp > 0 && m_stamp.empty()) m_stamp.assign(m_entry.size(), 0);
  m_stamp_fills = stamp;
}

void L2Tags::invalidate_range(uint64_t addr, uint64_t bytes, uint64_t page_origin) {
  if (m_sets == 0 || bytes == 0) return;
  const uint64_t first = addr / m_line_bytes, last = (addr + bytes - 1) / m_line_bytes;
  if (last - first >= m_entry.size()) {  // more lines than the L2 holds: scan the sets once
    for (size_t set = 0; set < m_set.size(); ++set) {
      if (!set_current(set)) continue;
      uint64_t* e = m_entry.data() + set * static_cast<size_t>(m_ways);
      uint32_t& count = m_set[set].count;
      // Keeps the lines outside [first, last] in their order (and their stamps with them).
      auto dropped = [&](uint64_t x) { return entry_line(x) >= first && entry_line(x) <= last; };
      if (m_stamp_fills == 0) {
        count = static_cast<uint32_t>(std::remove_if(e, e + count, dropped) - e);
        continue;
      }
      uint64_t* st = m_stamp.data() + set * static_cast<size_t>(m_ways);
      uint32_t kept = 0;
      for (uint32_t i = 0; i < count; ++i)
        if (!dropped(e[i])) {
          e[kept] = e[i];
          st[kept++] = st[i];
        }
      count = kept;
    }
    return;
  }
  const uint64_t origin = page_origin / m_line_bytes;
  require_origin_below(addr, page_origin, origin, first);
  for (uint64_t line = first; line <= last; ++line) {
    const long i = find(line, origin);
    if (i >= 0) erase(set_of(line, origin), static_cast<size_t>(i));
  }
}

bool L2Tags::access(uint64_t line, size_t set, bool allocate, bool write, uint64_t* writeback) {
  const uint64_t dirty = m_write_back && write ? kDirty : 0;
  refresh_set(set);
  if (m_stamp_fills > 0) return access_stamped(line, set, allocate, dirty, writeback);
  uint64_t* e = m_entry.data() + set * static_cast<size_t>(m_ways);
  uint32_t& count = m_set[set].count;
  for (uint32_t i = 0; i < count; ++i) {
    if (entry_line(e[i]) != line) continue;
    // A hit becomes the most recently used: the lines more recent than it move down by one.
    const uint64_t hit = e[i] | dirty;
    std::copy_backward(e, e + i, e + i + 1);
    e[0] = hit;
    return true;
  }
  if (!allocate) return false;
  if (count == static_cast<uint32_t>(m_ways)) {  // full: the least recently used line leaves
    if (e[count - 1] & kDirty) *writeback += m_line_bytes;
    --count;
  }
  std::copy_backward(e, e + count, e + count + 1);
  e[0] = line << 1 | dirty;
  ++count;
  return false;
}

bool L2Tags::access_stamped(uint64_t line, size_t set, bool allocate, uint64_t dirty,
                            uint64_t* writeback) {
  const size_t base = set * static_cast<size_t>(m_ways);
  uint64_t* e = m_entry.data() + base;
  uint64_t* st = m_stamp.data() + base;
  uint32_t& count = m_set[set].count;
  // Entry i becomes the most recently used, holding `entry` with `stamp`.
  const auto to_front = [&](uint32_t i, uint64_t entry, uint64_t stamp) {
    std::copy_backward(e, e + i, e + i + 1);
    std::copy_backward(st, st + i, st + i + 1);
    e[0] = entry;
    st[0] = stamp;
  };
  for (uint32_t i = 0; i < count; ++i) {
    if (entry_line(e[i]) != line) continue;
    if (!hidden(set, i)) {
      to_front(i, e[i] | dirty, st[i]);
      return true;
    }
    // Absent for this view: a miss, which takes the line over if it allocates.
    if (allocate) to_front(i, line << 1 | dirty, m_stamp_fills);
    return false;
  }
  if (!allocate) return false;
  uint32_t slot = count;  // a free way, else the victim's
  if (count == static_cast<uint32_t>(m_ways)) {
    slot = count - 1;  // the least recently used line, unless an absent line is there to take
    for (uint32_t i = count; i-- > 0;)
      if (hidden(set, i)) {
        slot = i;
        break;
      }
    if (!hidden(set, slot) && (e[slot] & kDirty)) *writeback += m_line_bytes;
  } else {
    ++count;
  }
  to_front(slot, line << 1 | dirty, m_stamp_fills);
  return false;
}

L2Outcome L2Tags::access_range(uint64_t addr, uint64_t bytes, isa::L2Hint l2, bool write,
                               uint64_t page_origin) {
  L2Outcome o;
  if (bytes == 0) return o;
  const uint64_t end = addr + bytes;
  const uint64_t first = addr / m_line_bytes, lines = (end - 1) / m_line_bytes - first + 1;
  if (l2 == isa::L2Hint::BYPASS) {
    o.miss_bytes = bytes;
    o.bypass_lines = lines;
    if (write) invalidate_range(addr, bytes, page_origin);
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
  const uint64_t origin = page_origin / m_line_bytes;
  require_origin_below(addr, page_origin, origin, first);
  size_t set = set_of(first, origin);
  uint64_t line = first;
  uint64_t page_left = m_sets - (first - origin) % m_sets;  // lines to the end of its page
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
    if (--page_left == 0) {  // a new page: its own rotation
      set = set_of(line, origin);
      page_left = m_sets;
    } else {
      set = set == last_set ? 0 : set + 1;  // the next line's set
    }
  }
  return o;
}

void L2Tags::invalidate_all() {
  if (++m_generation == 0) {  // wrapped: really clear
    std::fill(m_set.begin(), m_set.end(), SetState{});
    m_generation = 1;
  }
}

bool L2Tags::same_lines(const L2Tags& o) const {
  if (m_sets != o.m_sets || m_ways != o.m_ways || m_line_bytes != o.m_line_bytes ||
      m_page_rotation != o.m_page_rotation)
    return false;
  const size_t ways = static_cast<size_t>(m_ways);
  for (size_t set = 0; set < m_sets; ++set) {
    const uint32_t n = set_current(set) ? m_set[set].count : 0;
    const uint32_t n_other = o.set_current(set) ? o.m_set[set].count : 0;
    if (n != n_other || !std::equal(m_entry.begin() + static_cast<ptrdiff_t>(set * ways),
                                    m_entry.begin() + static_cast<ptrdiff_t>(set * ways + n),
                                    o.m_entry.begin() + static_cast<ptrdiff_t>(set * ways)))
      return false;
  }
  return true;
}

}  // namespace npusim
