#include "sim/chip/l2_placement.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <memory>

namespace npusim {

void append_block_extents(const GmBlockLookup& blocks, const std::vector<uint64_t>& args,
                          std::vector<uint64_t>* out) {
  if (!blocks) return;
  for (size_t i = 0; i < args.size(); ++i) {
    uint64_t start = 0, bytes = 0;
    if (blocks(args[i], &start, &bytes)) out->insert(out->end(), {i, args[i] - start, bytes});
  }
}

GmBlockLookup planned_block_lookup(const PlannedBlocks& planned, uint32_t line_bytes,
                                   GmBlockLookup blocks) {
  auto aligned = std::make_shared<PlannedBlocks>();
  for (const auto& b : planned)
    if (b.second > 0 && b.first % line_bytes == 0) aligned->push_back(b);
  if (aligned->empty()) return blocks;
  std::sort(aligned->begin(), aligned->end());
  return [aligned = std::shared_ptr<const PlannedBlocks>(std::move(aligned)),
          blocks = std::move(blocks)](uint64_t addr, uint64_t* start, uint64_t* bytes) {
    // The last buffer starting at or below addr: the only one that can hold it (disjoint).
    auto it = std::upper_bound(aligned->begin(), aligned->end(), addr,
                               [](uint64_t a, const auto& b) { return a < b.first; });
    if (it != aligned->begin()) {
      const auto& [b_start, b_bytes] = *std::prev(it);
      if (addr - b_start < b_bytes) {
        *start = b_start;
        *bytes = b_bytes;
        return true;
      }
    }
    return blocks && blocks(addr, start, bytes);
  };
}

L2Outcome access_placed(L2Tags& l2, L2Placement& placement, const GmAccess& r) {
  L2Outcome sum;
  uint64_t addr = r.addr, left = r.bytes;
  while (left > 0) {
    uint64_t run = 0, page_origin = 0;
    const uint64_t l2_addr = placement.l2_address(addr, &run, &page_origin);
    const uint64_t n = std::min(left, run);
    const L2Outcome o = l2.access_range(l2_addr, n, r.l2, r.write, page_origin);
    sum.hit_bytes += o.hit_bytes;
    sum.miss_bytes += o.miss_bytes;
    sum.hit_lines += o.hit_lines;
    sum.miss_lines += o.miss_lines;
    sum.bypass_lines += o.bypass_lines;
    sum.absorbed_bytes += o.absorbed_bytes;
    sum.writeback_bytes += o.writeback_bytes;
    sum.fill_bytes += o.fill_bytes;
    addr += n;
    left -= n;
  }
  return sum;
}

uint64_t L2Placement::l2_address(uint64_t addr, uint64_t* run, uint64_t* page_origin) {
  *run = std::numeric_limits<uint64_t>::max();
  *page_origin = 0;
  if (!m_lookup) return addr;
  if (addr >= m_last.start && addr < m_last.placed.end) {
    *run = m_last.placed.end - addr;
    *page_origin = m_last.placed.l2_base;
    return m_last.placed.l2_base + (addr - m_last.start);
  }
  auto it = m_blocks.upper_bound(addr);
  if (it != m_blocks.begin() && addr < std::prev(it)->second.end) {
    --it;
  } else {
    uint64_t start = 0, bytes = 0;
    if (!m_lookup(addr, &start, &bytes) || bytes == 0 || addr < start || addr - start >= bytes)
      return addr;
    const auto same_start = m_blocks.find(start);
    if (same_start != m_blocks.end() && addr < same_start->second.end) {
      it = same_start;  // placed before (an entry starting nearer addr lies inside it)
    } else {
      // A block sharing its start with one placed before but longer (a graph's arena and the
      // planned buffer at its start, both found by the lookup), or a block touched first: what
      // of it lies from the last placed end at or below addr up to the next placed block is
      // placed as a piece of its own (the block whole where nothing of it is placed yet).
      uint64_t end = start + bytes;
      if (same_start != m_blocks.end()) {
        start = std::max(same_start->second.end, std::prev(it)->second.end);
        if (it != m_blocks.end()) end = std::min(end, it->first);
      }
      it = m_blocks.emplace(start, Placed{end, m_next}).first;
      // The next block starts on a fresh line, as every allocator block does.
      m_next += (end - start + m_line_bytes - 1) / m_line_bytes * m_line_bytes;
    }
  }
  m_last = {it->first, it->second};
  *run = it->second.end - addr;
  *page_origin = it->second.l2_base;
  return it->second.l2_base + (addr - it->first);
}

}  // namespace npusim
