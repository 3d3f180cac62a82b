// L2Tags (sim/chip/l2_tags.h) against a reference written here the plain way: per set a list of
// lines ordered from least to most recently used, a miss that allocates evicts the front when
// the set is full, a dropped line leaves the list, and emptying the cache clears every list. A
// seeded random sequence of lookups (every policy, reads and writes), range drops (some longer
// than the L2) and emptyings must give the same outcome, line by line, and the same contents.
// Small geometries, so sets fill, evict and hold dirty lines often.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "sim/chip/l2_tags.h"

using namespace npusim;

namespace {

struct RefLine {
  uint64_t line;
  bool dirty;
};

class RefL2 {
 public:
  // set_of: a line's set (line % sets unless given: the page rotation's, asked line by line).
  RefL2(uint64_t sets, uint32_t line_bytes, int ways, bool write_back,
        std::function<size_t(uint64_t)> set_of = nullptr)
      : m_sets(sets),
        m_line_bytes(line_bytes),
        m_ways(static_cast<size_t>(ways)),
        m_write_back(write_back),
        m_set_of(set_of ? std::move(set_of) : [sets](uint64_t line) { return line % sets; }),
        m_lru(sets) {}

  L2Outcome access_range(uint64_t addr, uint64_t bytes, isa::L2Hint l2, bool write) {
    L2Outcome o;
    for (uint64_t a = addr; a < addr + bytes;) {
      const uint64_t line = a / m_line_bytes;
      const uint64_t n = std::min(addr + bytes, (line + 1) * m_line_bytes) - a;
      a += n;
      if (l2 == isa::L2Hint::BYPASS) {
        o.miss_bytes += n;
        ++o.bypass_lines;
        if (write) drop(line);
        continue;
      }
      std::vector<RefLine>& set = m_lru[m_set_of(line)];
      auto it =
          std::find_if(set.begin(), set.end(), [&](const RefLine& l) { return l.line == line; });
      if (it != set.end()) {  // hit: becomes the most recently used
        RefLine hit = *it;
        hit.dirty = hit.dirty || (m_write_back && write);
        set.erase(it);
        set.push_back(hit);
        o.hit_bytes += n;
        ++o.hit_lines;
        continue;
      }
      ++o.miss_lines;
      const bool allocate = l2 == isa::L2Hint::NORMAL;
      if (allocate && write && m_write_back)
        o.absorbed_bytes += n;
      else
        o.miss_bytes += n;
      if (!allocate) continue;
      if (!write) o.fill_bytes += m_line_bytes - n;  // a read fills its whole line
      if (set.size() == m_ways) {                    // evict the least recently used
        if (m_write_back && set.front().dirty) o.writeback_bytes += m_line_bytes;
        set.erase(set.begin());
      }
      set.push_back({line, m_write_back && write});
    }
    return o;
  }
  void drop(uint64_t line) {
    std::vector<RefLine>& set = m_lru[m_set_of(line)];
    set.erase(
        std::remove_if(set.begin(), set.end(), [&](const RefLine& l) { return l.line == line; }),
        set.end());
  }
  void invalidate_range(uint64_t addr, uint64_t bytes) {
    if (bytes == 0) return;
    for (uint64_t line = addr / m_line_bytes; line <= (addr + bytes - 1) / m_line_bytes; ++line)
      drop(line);
  }
  void invalidate_all() {
    for (auto& set : m_lru) set.clear();
  }
  bool contains(uint64_t addr) const {
    const uint64_t line = addr / m_line_bytes;
    const auto& set = m_lru[m_set_of(line)];
    return std::any_of(set.begin(), set.end(), [&](const RefLine& l) { return l.line == line; });
  }

 private:
  uint64_t m_sets;
  uint32_t m_line_bytes;
  size_t m_ways;
  bool m_write_back;
  std::function<size_t(uint64_t)> m_set_of;
  std::vector<std::vector<RefLine>> m_lru;
};

void require_same(const L2Outcome& a, const L2Outcome& b, int step) {
  INFO("operation " << step);
  REQUIRE(a.hit_bytes == b.hit_bytes);
  REQUIRE(a.miss_bytes == b.miss_bytes);
  REQUIRE(a.hit_lines == b.hit_lines);
  REQUIRE(a.miss_lines == b.miss_lines);
  REQUIRE(a.bypass_lines == b.bypass_lines);
  REQUIRE(a.absorbed_bytes == b.absorbed_bytes);
  REQUIRE(a.writeback_bytes == b.writeback_bytes);
  REQUIRE(a.fill_bytes == b.fill_bytes);
}

// `sets` sets of `ways` lines of 64 bytes; addresses within `span` bytes. block_starts (byte
// offsets, line-aligned, ascending, the first 0): the span cut into blocks as the L2 placement
// files them, each range looked up with its block's start as page origin (ranges and short
// drops kept inside their block; a drop longer than the L2 crosses blocks, which L2Tags serves
// by scanning its sets).
void run_random(uint64_t sets, int ways, bool write_back, uint64_t span, uint32_t seed,
                bool page_rotation = false, std::vector<uint64_t> block_starts = {0}) {
  constexpr uint32_t kLine = 64;
  L2Tags l2(sets * kLine * static_cast<uint64_t>(ways), kLine, ways, write_back, page_rotation);
  // The start of the block holding byte address `addr`, and where that block ends.
  const auto origin_of = [&block_starts](uint64_t addr) {
    return *(std::upper_bound(block_starts.begin(), block_starts.end(), addr) - 1);
  };
  const auto block_end = [&block_starts, span](uint64_t addr) {
    auto it = std::upper_bound(block_starts.begin(), block_starts.end(), addr);
    return it == block_starts.end() ? span : *it;
  };
  // With the rotation the reference asks set_of for every line (with its block's origin); the
  // tags step from line to line and recompute the set only where a page starts.
  RefL2 ref(sets, kLine, ways, write_back,
            page_rotation ? std::function<size_t(uint64_t)>([&](uint64_t line) {
              return l2.set_of(line, origin_of(line * kLine) / kLine);
            })
                          : nullptr);
  std::mt19937_64 rng(seed);
  auto pick = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  for (int step = 0; step < 20000; ++step) {
    const uint64_t kind = pick(100);
    const uint64_t addr = pick(span);
    const uint64_t bytes = std::min(pick(6 * kLine), block_end(addr) - addr);  // 0 included
    const uint64_t origin = origin_of(addr);
    if (kind < 2) {
      l2.invalidate_all();
      ref.invalidate_all();
    } else if (kind < 6) {
      // One drop in four spans more lines than the L2 holds (L2Tags scans its sets instead).
      const uint64_t drop =
          kind == 5 ? sets * kLine * static_cast<uint64_t>(ways) + pick(span) : bytes;
      l2.invalidate_range(addr, drop, origin);
      ref.invalidate_range(addr, drop);
    } else {
      const uint64_t p = pick(10);
      const isa::L2Hint hint = p < 7   ? isa::L2Hint::NORMAL
                               : p < 9 ? isa::L2Hint::NOALLOC
                                       : isa::L2Hint::BYPASS;
      const bool write = pick(3) == 0;
      require_same(l2.access_range(addr, bytes, hint, write, origin),
                   ref.access_range(addr, bytes, hint, write), step);
    }
    const uint64_t probe = pick(span);
    INFO("operation " << step << ", line of " << probe);
    REQUIRE(l2.contains(probe, origin_of(probe)) == ref.contains(probe));
  }
}

}  // namespace

TEST_CASE("L2 tags match a plain LRU reference: write-through, sets fill and evict") {
  run_random(8, 4, false, 8 * 4 * 64 * 3, 1);
  run_random(3, 2, false, 3 * 2 * 64 * 4, 2);  // a set count that is no power of two
}

TEST_CASE("L2 tags match a plain LRU reference: write-back, dirty victims") {
  run_random(8, 4, true, 8 * 4 * 64 * 3, 3);
  run_random(5, 3, true, 5 * 3 * 64 * 2, 4);
}

TEST_CASE("L2 tags: one set, emptied by invalidate_all, then filled in LRU order again") {
  L2Tags l2(2 * 64, 64, 2, false);  // one set of two ways
  REQUIRE(l2.access_range(0, 64).miss_lines == 1);
  REQUIRE(l2.access_range(64, 64).miss_lines == 1);
  REQUIRE(l2.access_range(0, 64).hit_lines == 1);     // line 1 is now the LRU
  REQUIRE(l2.access_range(128, 64).miss_lines == 1);  // evicts line 1
  REQUIRE(l2.contains(0));
  REQUIRE_FALSE(l2.contains(64));
  l2.invalidate_all();
  REQUIRE_FALSE(l2.contains(0));
  REQUIRE_FALSE(l2.contains(128));
  REQUIRE(l2.access_range(0, 128).miss_lines == 2);  // both ways free again
  REQUIRE(l2.access_range(0, 128).hit_lines == 2);
}

TEST_CASE("L2 tags' views: lines stamped before a view's start are absent for its lookups") {
  // One set of two write-back ways; stamps as MemorySystem::begin_launch_view gives them: a
  // launch that began at stamp 1 (view 1), and one that began at stamp 2 (view 2) while the
  // first runs on.
  L2Tags l2(2 * 64, 64, 2, true);
  l2.stamp_fills(1);
  l2.set_view(1);
  REQUIRE(l2.access_range(64, 64, isa::L2Hint::NORMAL, true).absorbed_bytes == 64);  // dirty
  l2.stamp_fills(2);  // the second launch begins: lines filled from now on carry stamp 2
  REQUIRE(l2.access_range(0, 64).miss_lines == 1);  // view 1 fills line 0 (stamp 2)
  REQUIRE(l2.access_range(64, 64).hit_lines == 1);  // view 1 sees its own line 1 (stamp 1)
  // Line 1 (stamp 1, dirty) is the most recent, line 0 (stamp 2) the least. View 2 sees only
  // line 0: a NOALLOC lookup of line 1 misses and leaves it; a fill takes the way of line 1,
  // absent for view 2, not the least recently used line 0, and writes nothing back.
  l2.set_view(2);
  REQUIRE(l2.access_range(64, 64, isa::L2Hint::NOALLOC).miss_lines == 1);
  REQUIRE(l2.contains(64));
  REQUIRE(l2.access_range(0, 64).hit_lines == 1);  // filled by view 1 after view 2 began
  const L2Outcome fill = l2.access_range(128, 64);
  REQUIRE(fill.miss_lines == 1);
  REQUIRE(fill.writeback_bytes == 0);
  REQUIRE_FALSE(l2.contains(64));
  REQUIRE(l2.contains(0));
  // A line view 2 cannot see is taken over by its lookup: a miss, the line stamped anew, so
  // the next lookup of it hits; its old dirty bit is dropped (no write-back when it leaves).
  l2.set_view(1);
  REQUIRE(l2.access_range(192, 64, isa::L2Hint::NORMAL, true).miss_lines == 1);  // evicts 0
  l2.stamp_fills(3);
  l2.set_view(3);
  REQUIRE(l2.access_range(192, 64).miss_lines == 1);  // stamped 2: absent for view 3
  REQUIRE(l2.access_range(192, 64).hit_lines == 1);
  REQUIRE(l2.access_range(0, 128).writeback_bytes == 0);  // evicts 128 (clean), then 192
  // Views off (stamp_fills(0), set_view(0)): every line is seen again.
  l2.stamp_fills(0);
  l2.set_view(0);
  REQUIRE(l2.access_range(0, 128).hit_lines == 2);
}

TEST_CASE("L2 tags with page rotation match the LRU reference across page boundaries") {
  // Spans of many pages (a page is `sets` lines), ranges of up to 6 lines crossing them.
  run_random(8, 4, false, 8 * 64 * 40, 5, true);
  run_random(3, 2, true, 3 * 64 * 60, 6, true);
}

TEST_CASE("L2 tags with page rotation counted from each block's start match the LRU reference") {
  // Blocks of several pages starting off page boundaries (a page is `sets` lines of 64 bytes),
  // as the L2 placement packs them: ranges of up to 6 lines crossing their blocks' pages.
  run_random(8, 4, false, 8 * 64 * 40, 7, true, {0, 64 * 13, 64 * 30, 64 * 101, 64 * 200});
  run_random(3, 2, true, 3 * 64 * 60, 8, true, {0, 64 * 4, 64 * 11, 64 * 50});
}

TEST_CASE("L2 page rotation by block: a block's sets move with its start, as modulo's do") {
  // Pages counted from the block's first line: the block's sets are its start's set plus a
  // fixed function of the line's place in the block, so a block filed d lines further has
  // every line d sets further (the launch replay's translation moves blocks so).
  const uint64_t sets = 24, ways = 4, line = 64;
  L2Tags rot(sets * ways * line, line, static_cast<int>(ways), false, true);
  for (uint64_t origin : {0ull, 5ull, 24ull, 1000ull})
    for (uint64_t d : {1ull, 7ull, 24ull, 31ull})
      for (uint64_t j = 0; j < 10 * sets; ++j) {
        INFO("origin " << origin << " moved by " << d << " line " << j);
        REQUIRE(rot.set_of(origin + d + j, origin + d) ==
                (rot.set_of(origin + j, origin) + d) % sets);
      }
  // Its first page is modulo's; later pages are rotated unlike absolute pages.
  for (uint64_t j = 0; j < sets; ++j) REQUIRE(rot.set_of(1000 + j, 1000) == (1000 + j) % sets);
  // Origin 0: the absolute pages of lines filed at their own addresses.
  for (uint64_t l = 0; l < 10 * sets; ++l)
    REQUIRE(rot.set_of(l, 0) == L2Tags::set_in(l, 0, sets, true));
  // Without rotation the origin changes nothing.
  L2Tags mod(sets * ways * line, line, static_cast<int>(ways), false, false);
  for (uint64_t l = 100; l < 10 * sets; ++l) REQUIRE(mod.set_of(l, 37) == l % sets);
}

TEST_CASE("L2 page rotation by block: a block of `ways` pages fills every set `ways` times") {
  // The 910b's geometry (192 MiB, 512-byte lines, 16 ways: 24,576 sets): a 192 MiB block is 16
  // pages. Filed from any line, pages counted from its start put exactly 16 of its lines in
  // every set: a second pass hits every line. Counted from absolute pages, a block that does
  // not start on a page boundary straddles 17 of them and some sets receive 17 lines: the
  // second pass misses there.
  const uint64_t line = 512, l2_bytes = 192ull << 20, sets = 24576;
  for (uint64_t start_line : {uint64_t{0}, uint64_t{1}, uint64_t{12345}, 3 * sets + 24575})
    for (bool by_block : {true, false}) {
      L2Tags l2(l2_bytes, static_cast<uint32_t>(line), 16, false, true);
      REQUIRE(l2.sets() == sets);
      const uint64_t start = (start_line + (uint64_t(1) << 40) / line) * line;
      const uint64_t origin = by_block ? start : 0;
      std::vector<uint32_t> per_set(sets, 0);
      for (uint64_t l = start / line; l < start / line + 16 * sets; ++l)
        ++per_set[l2.set_of(l, origin / line)];
      const L2Outcome first = l2.access_range(start, l2_bytes, isa::L2Hint::NORMAL, false, origin);
      const L2Outcome second = l2.access_range(start, l2_bytes, isa::L2Hint::NORMAL, false, origin);
      INFO("first line " << start_line << (by_block ? ", pages from it" : ", absolute pages"));
      REQUIRE(first.miss_lines == 16 * sets);
      if (by_block) {
        REQUIRE(std::all_of(per_set.begin(), per_set.end(), [](uint32_t n) { return n == 16; }));
        REQUIRE(second.hit_lines == 16 * sets);
      } else if (start % (sets * line) != 0) {
        REQUIRE(*std::max_element(per_set.begin(), per_set.end()) == 17);
        REQUIRE(second.miss_lines > 0);
      }
    }
}

TEST_CASE("L2 page rotation: page 0 as modulo, consecutive lines spread, pages apart differ") {
  const uint64_t sets = 24, ways = 4, line = 64;
  L2Tags rot(sets * ways * line, line, static_cast<int>(ways), false, true);
  for (uint64_t l = 0; l < sets; ++l) REQUIRE(rot.set_of(l) == l);  // page 0: modulo's sets
  // Any run of n consecutive lines: at most ceil(n / sets) + 1 in one set.
  for (uint64_t start : {0ull, 5ull, 23ull, 24ull, 100ull, 1000ull})
    for (uint64_t n : {1ull, 7ull, 24ull, 25ull, 48ull, 200ull}) {
      std::vector<uint64_t> per(sets, 0);
      for (uint64_t l = start; l < start + n; ++l) ++per[rot.set_of(l)];
      INFO("start " << start << " n " << n);
      REQUIRE(*std::max_element(per.begin(), per.end()) <= (n + sets - 1) / sets + 1);
    }
  // Lines a whole page apart: modulo files them in one set, the rotation in several.
  std::vector<size_t> seen;
  for (uint64_t p = 0; p < 16; ++p) seen.push_back(rot.set_of(p * sets + 3));
  std::sort(seen.begin(), seen.end());
  REQUIRE(std::unique(seen.begin(), seen.end()) - seen.begin() >= 8);
}

TEST_CASE("L2 page rotation: a column slice of a matrix with a pitch dividing the sets") {
  // The 910b's geometry (192 MiB, 512-byte lines, 16 ways: 24,576 sets) and Huawei's DataCopy
  // sample's slice: 12,288 rows 24 KiB (48 lines) apart, 6 KiB (12 lines) of each, read twice.
  // Modulo files the rows in 24,576 * 12 / 48 = 6,144 sets, 24 lines a set: the second pass
  // misses every line. Rotated pages spread them: the 72 MiB fit the 192 MiB L2 and it hits.
  const uint64_t line = 512, l2_bytes = 192ull << 20, pitch = 48 * line, width = 12 * line;
  for (bool rotation : {false, true}) {
    L2Tags l2(l2_bytes, static_cast<uint32_t>(line), 16, false, rotation);
    REQUIRE(l2.sets() == 24576);
    L2Outcome second;
    for (int pass = 0; pass < 2; ++pass)
      for (uint64_t row = 0; row < 12288; ++row) {
        const L2Outcome o = l2.access_range(row * pitch, width);
        if (pass == 1) {
          second.hit_lines += o.hit_lines;
          second.miss_lines += o.miss_lines;
        }
      }
    INFO("page rotation " << rotation);
    REQUIRE(second.hit_lines + second.miss_lines == 12288 * 12);
    if (rotation)
      REQUIRE(second.miss_lines == 0);
    else
      REQUIRE(second.hit_lines == 0);
  }
}
