// Tags of the shared L2: set-associative with LRU replacement, over line addresses only (the
// data lives in DeviceMemory, so no flush or write-back is ever needed for correctness). Lines
// fill on a miss unless the access's L2 policy says otherwise (isa.h L2Hint).
// invalidate_all() is O(1) (a generation number), so the cache can start cold at every launch
// cheaply.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "isa/isa.h"

namespace npusim {

// What looking up one GM range found. hit_bytes + absorbed_bytes are served by the L2,
// miss_bytes + fill_bytes + writeback_bytes by HBM. Bypassed bytes count as missing bytes (HBM)
// but are no lookups: they add to miss_bytes and bypass_lines, never to miss_lines.
struct L2Outcome {
  uint64_t hit_bytes = 0, miss_bytes = 0;  // bytes in lines that hit / missed (or bypassed)
  uint64_t hit_lines = 0, miss_lines = 0;  // lookups that hit / missed
  uint64_t bypass_lines = 0;               // lines of a BYPASS access (not looked up)
  // Write-back L2 only: bytes of a write that missed and were taken into a newly allocated
  // line (not in miss_bytes), and bytes of dirty lines evicted to make room (written to HBM).
  uint64_t absorbed_bytes = 0, writeback_bytes = 0;
  // A read that misses and allocates fills its whole line from HBM: the line's bytes the read
  // did not ask for (line_bytes - the bytes of the range in that line) are read from HBM too,
  // and a later access to them hits. Writes allocate without a fill (not counted here).
  uint64_t fill_bytes = 0;
};

class L2Tags {
 public:
  // capacity_bytes / (line_bytes * ways) sets (at least one set when capacity_bytes > 0);
  // capacity_bytes == 0 means no L2: every access misses.
  // write_back: writes into the L2 mark lines dirty, a write miss that allocates is taken by
  // the new line (write-allocate without a fill), and evicting a dirty line writes it to HBM.
  // Otherwise the L2 is written through: a write miss goes to HBM (and allocates, under NORMAL).
  // page_rotation: a line's set is set_of(line, origin), each page of `sets` lines counted from
  // the line's page origin rotated by its own offset; false: line % sets.
  L2Tags(uint64_t capacity_bytes, uint32_t line_bytes, int ways, bool write_back = false,
         bool page_rotation = false);
  uint32_t line_bytes() const { return m_line_bytes; }
  uint64_t sets() const { return m_sets; }  // 0: no L2
  bool page_rotation() const { return m_page_rotation; }
  // The set of line `line` (a line address: byte address / line bytes) whose pages count from
  // line `origin` (<= line): set_in(line, origin, sets(), page_rotation()). Requires sets > 0.
  size_t set_of(uint64_t line, uint64_t origin = 0) const {
    return static_cast<size_t>(set_in(line, origin, m_sets, m_page_rotation));
  }
  // The set of line `line` in an L2 of `sets` sets (> 0, < 2^32). Without page rotation
  // line % sets, whatever the origin. With it, the lines from `origin` on are cut into pages
  // of `sets` lines, page p = (line - origin) / sets, and page p is rotated by r(p), a fixed
  // pseudo-random offset per page (r(0) = 0):
  //   set = (origin + (line - origin) % sets + r(p)) % sets.
  // Within a page consecutive lines take consecutive sets as under modulo (page 0 exactly
  // modulo's), so any run of n consecutive lines puts at most ceil(n / sets) + 1 of them in one
  // set (one per page it touches), and a run of k whole pages from the origin exactly k in
  // each set; lines a multiple of `sets` apart (rows of a matrix whose pitch divides the sets)
  // land in different sets. The L2 placement (l2_placement.h) gives each block it files its
  // first line as origin, so a block's lines take (origin + f(line - origin)) % sets for one
  // fixed f: moving the block by d lines moves every one of its lines by d sets, as modulo
  // indexing does, which is what the launch replay's translation relies on
  // (sim/replay/launch_replay.h, relocated_writes). Lines filed at their own device addresses
  // (outside every block) take origin 0: pages of absolute line addresses.
  static uint64_t set_in(uint64_t line, uint64_t origin, uint64_t sets, bool page_rotation) {
    if (!page_rotation) return line % sets;
    const uint64_t from_origin = line - origin;
    return (origin % sets + from_origin % sets + page_offset(from_origin / sets, sets)) % sets;
  }
  int ways() const { return m_ways; }
  // Every line of [addr, addr + bytes) in address order (a GM range of a transfer) under policy
  // `l2`: NORMAL looks up and fills missing lines; NOALLOC looks up and leaves missing lines
  // absent; BYPASS looks nothing up (all bytes missing) and, for a write, drops the lines
  // present (their copy would be stale). page_origin: the L2 address (bytes) of the first line
  // of the block the range lies in (set_of's origin), 0 for lines filed at their own address;
  // at most addr.
  L2Outcome access_range(uint64_t addr, uint64_t bytes, isa::L2Hint l2 = isa::L2Hint::NORMAL,
                         bool write = false, uint64_t page_origin = 0);
  // Whether the line holding `addr` (pages from page_origin, as access_range) is present (no
  // LRU update).
  bool contains(uint64_t addr, uint64_t page_origin = 0) const;
  // Drops every line overlapping [addr, addr + bytes) (dirty ones too: their bytes are
  // overwritten); page_origin as access_range's.
  void invalidate_range(uint64_t addr, uint64_t bytes, uint64_t page_origin = 0);
  // Whether `o` holds the same lines as this, set by set in the same recency order, with the
  // same dirty bits (the geometry must match; generations do not matter). The replay check
  // compares the L2 a replay left with the one simulating left.
  bool same_lines(const L2Tags& o) const;
  // Drops every line. Dirty lines are not written back in simulated time: a launch's write-back
  // after its end is not part of any launch (docs/chip_model.md "Memory system").
  void invalidate_all();

  // Views (a concurrent group on a chip whose L2 starts cold at every launch: MemorySystem::
  // begin_launch_view, docs/chip_model.md "Concurrent launches", "The L2 of each launch").
  // stamp_fills(e), e > 0: every line filled from now on (a miss that allocates, or a line taken
  // over as below) carries stamp e, which the caller raises at each launch's start; 0 (the
  // default): no stamps are kept and every view sees every line. set_view(v): the lookups from
  // now on see only lines stamped v or later (0: every line), as a launch that began when the
  // stamp became v and found the L2 empty then. A line stamped before v is absent for them: a
  // lookup of it misses; if it allocates, it takes the line over (most recently used, stamped
  // anew, dirty only if this access writes: the old dirty bit is dropped without a write-back,
  // as invalidate_all drops it); a fill in a full set evicts the least recently used absent
  // line if the set has one (no write-back either), else the least recently used line. A
  // lookup that does not allocate leaves an absent line where it is. So a launch that begins
  // after others in one L2 sees exactly the hits and misses it would see in an L2 emptied at
  // its start, while the lines it cannot see still take no room from it.
  void stamp_fills(uint64_t stamp);
  void set_view(uint64_t visible_from) { m_visible_from = visible_from; }

 private:
  static constexpr uint32_t kDefaultLineBytes = 512;  // line granularity when there is no L2
  // The rotation of page `page` (set_in), in [0, sets): Fibonacci hashing, the top 32 bits of
  // the page number times 2^64 / golden ratio, scaled to the sets by a multiply and shift (no
  // modulo: the low bits of the product are poorly mixed); 0 for page 0. Requires sets < 2^32.
  static uint64_t page_offset(uint64_t page, uint64_t sets) {
    const uint64_t mixed = (page * 0x9E3779B97F4A7C15ull) >> 32;
    return (mixed * sets) >> 32;
  }
  // Looks up line `line` (a line address: byte address / line bytes) in its set `set`
  // (= set_of(line)); on a miss, fills it (evicting the least recently used line of a full set)
  // if `allocate`, adding a dirty victim's bytes to *writeback. A write marks the line dirty
  // (write-back L2). Returns true on a hit. Requires sets > 0. access_range walks a range's
  // lines with `set` stepping from set to set, so no line costs a division.
  bool access(uint64_t line, size_t set, bool allocate, bool write, uint64_t* writeback);
  // access() while stamping (stamp_fills): the same with the view's absent lines (set_view).
  // dirty: the dirty bit the access sets (kDirty or 0).
  bool access_stamped(uint64_t line, size_t set, bool allocate, uint64_t dirty,
                      uint64_t* writeback);
  // Position of `line` (pages from line `origin`) in its set's recency order (0 = most
  // recent), or -1.
  long find(uint64_t line, uint64_t origin) const;
  // Removes the entry at position `i` of set `set`, keeping the others' order.
  void erase(size_t set, size_t i);
  // Makes set `set` current: a set last touched before the latest invalidate_all() holds no
  // line and takes the current generation. Every lookup goes through it, so a set's entries
  // are its first m_set[set].count slots once it is current.
  void refresh_set(size_t set) {
    SetState& s = m_set[set];
    if (s.gen == m_generation) return;
    s.gen = m_generation;
    s.count = 0;
  }
  bool set_current(size_t set) const { return m_set[set].gen == m_generation; }
  // An entry: the line address shifted left by one, its low bit the dirty bit (written since
  // filled; write-back L2 only). Line addresses stay below 2^63 (device addresses, and the
  // L2 placement's packed addresses from 2^62: l2_placement.h), so the shift loses nothing.
  static uint64_t entry_line(uint64_t e) { return e >> 1; }
  static constexpr uint64_t kDirty = 1;
  struct SetState {
    uint32_t gen = 0;    // the generation the set's entries belong to
    uint32_t count = 0;  // lines held (valid while gen is current)
  };
  uint32_t m_line_bytes;
  int m_ways;
  bool m_write_back;
  bool m_page_rotation;
  uint64_t m_sets;
  // invalidate_all() starts a new generation; a set whose gen is older holds no line.
  uint32_t m_generation = 1;
  std::vector<SetState> m_set;  // [set]
  // [set * ways + i], i < the set's count: its lines from the most to the least recently used
  // (LRU order by position rather than by time stamps: one array of 8 bytes a way, so a
  // lookup reads a set's lines from one run of host memory, and a victim is the last entry).
  std::vector<uint64_t> m_entry;
  // Views (stamp_fills, set_view): the stamp fills now carry (0: none kept), and the oldest
  // stamp the lookups see (0: every line). m_stamp[set * ways + i]: entry i's stamp, kept in
  // step with m_entry while m_stamp_fills > 0 (allocated by the first stamp_fills).
  uint64_t m_stamp_fills = 0;
  uint64_t m_visible_from = 0;
  std::vector<uint64_t> m_stamp;
  // Whether entry i of set `set` is absent for the current view (m_stamp kept: stamping on).
  bool hidden(size_t set, size_t i) const {
    return m_visible_from > 0 && m_stamp[set * static_cast<size_t>(m_ways) + i] < m_visible_from;
  }
};

}  // namespace npusim
