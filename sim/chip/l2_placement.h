// Where the L2 model files a launch's GM lines: the launch's allocations laid out back to back.
//
// Which L2 set a line falls in depends on its address (set = line % sets), so when a launch's
// working set overflows the L2, its conflict misses depend on where its buffers lie relative to
// each other. The runtime's allocator places TensorFlow's tensors in the order TensorFlow's
// threads happen to ask for them, which changes from run to run; the same script then gave a
// different report (docs/tf_plugin.md, "Device memory"). With a cold L2 at every launch (the
// default, memory.l2.keep_across_launches false), a launch's L2 outcome depends only on the
// relative placement of what it touches, so the model takes that placement from the launch
// itself: every allocation (block) the launch touches is given an L2 address range of its own,
// in the order the launch first touches the blocks (the simulated order, which is the same on
// every run), each on a fresh L2 line, packed one after another from one fixed, way-aligned
// base. Offsets inside a block are kept, so a tensor's own lines conflict with each other as at
// any line-aligned placement; what no longer matters is where the allocator put the blocks. It
// is the placement a static memory plan for that launch would give (tensors contiguous, in
// use order), the same for every run.
//
// An address outside every block (no lookup given, or memory the allocator does not manage) is
// filed at its own address. With a kept L2 (keep_across_launches) the runtime gives no lookup:
// lines then carry over between launches and are filed at their device addresses, as silicon
// files them.
//
// Within a graph run (memory.l2.keep_within_graph_run) one placement serves every launch of the
// run (continue_launch): a block keeps the L2 range its first touch in the run gave it, so the
// next launch reading a block finds the lines the previous one left there, and a block the run
// touches for the first time is packed after the others (first-touch order over the run: the
// simulated order, the same every run). Contract: every block the run touches stays allocated
// until the run's last launch (the TF plugin's NpuGraph holds its inputs, outputs, arena and
// variables until it synchronises), so no block start is reused for another allocation while
// the placement holds it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "sim/chip/l2_tags.h"
#include "sim/exec/exec.h"

namespace npusim {

// The device allocation holding `addr`: sets *start and *bytes of its block and returns true, or
// returns false if no live block holds it (the runtime's allocator answers; thread-safe).
using GmBlockLookup = std::function<bool(uint64_t addr, uint64_t* start, uint64_t* bytes)>;

// What a launch's L2 outcome depends on, besides its program and arguments, when its lines are
// filed by block: the extent of each block its arguments point into (the sizes set where the
// packed blocks start). Appends (argument index, offset in its block, block bytes) for every
// argument inside a block to *out: the launch replay keys a recording with them, so a launch
// replays only onto blocks of the same extents (sim/simulator.cpp).
void append_block_extents(const GmBlockLookup& blocks, const std::vector<uint64_t>& args,
                          std::vector<uint64_t>* out);

// Device address ranges [start, start + bytes) of buffers that a static memory plan placed inside
// one allocation (KernelLaunch::planned_blocks), pairwise disjoint, in any order.
using PlannedBlocks = std::vector<std::pair<uint64_t, uint64_t>>;

// The lookup a cold launch with planned buffers files its lines by: an address inside one of
// `planned` that starts on an L2 line (line_bytes) is in that buffer; any other address is looked
// up in `blocks` (none: false). A buffer that starts inside a line is left out, as filing it on a
// fresh line would move its bytes within their lines. `blocks` itself if no buffer is left. A
// binary search per address (the buffers sorted once here).
GmBlockLookup planned_block_lookup(const PlannedBlocks& planned, uint32_t line_bytes,
                                   GmBlockLookup blocks);

class L2Placement {
 public:
  // First L2 address of the packed blocks: above any device address, and a multiple of every
  // power-of-two way size (l2_bytes / ways), so the first block touched starts in set 0.
  static constexpr uint64_t kPackedBase = uint64_t(1) << 62;

  explicit L2Placement(uint32_t line_bytes) : m_line_bytes(line_bytes) {}

  // Start of a launch: forgets the previous launch's blocks. An empty lookup files every address
  // at itself.
  void begin_launch(GmBlockLookup blocks) {
    m_lookup = std::move(blocks);
    m_blocks.clear();
    m_next = kPackedBase;
    m_last = {};
  }

  // Start of the next launch of the same graph run: the blocks placed so far keep their L2
  // ranges, blocks touched for the first time are packed after them.
  void continue_launch(GmBlockLookup blocks) {
    m_lookup = std::move(blocks);
    m_last = {};
  }

  // Calls f(l2_address, bytes, page_origin) for each piece of device range [addr, addr + bytes)
  // that lies in a block placed so far (a host copy into a run's block drops those lines), with
  // the block's L2 address as page origin (l2_address); places nothing.
  template <class F>
  void for_each_placed(uint64_t addr, uint64_t bytes, F f) const {
    const uint64_t end = addr + bytes;
    auto it = m_blocks.upper_bound(addr);
    if (it != m_blocks.begin()) --it;
    for (; it != m_blocks.end() && it->first < end; ++it) {
      const uint64_t lo = std::max(addr, it->first), hi = std::min(end, it->second.end);
      if (lo < hi) f(it->second.l2_base + (lo - it->first), hi - lo, it->second.l2_base);
    }
  }

  // The L2 address of device address `addr`; *run = how many bytes from addr on keep a
  // contiguous L2 address (to the end of addr's block, or everything for an unplaced address);
  // *page_origin = the L2 address of the first byte of addr's block (line-aligned), from which
  // the L2's page rotation counts the block's pages (L2Tags::set_in), or 0 for an address filed
  // at itself (absolute pages).
  uint64_t l2_address(uint64_t addr, uint64_t* run, uint64_t* page_origin);

  // Whether `o` gives the same blocks the same L2 ranges and packs the next block where this
  // does (the lookup and the search cache aside): the replay check compares the placement a
  // replay left with the one simulating left.
  bool same_placement(const L2Placement& o) const {
    return m_next == o.m_next && m_blocks.size() == o.m_blocks.size() &&
           std::equal(m_blocks.begin(), m_blocks.end(), o.m_blocks.begin(),
                      [](const auto& a, const auto& b) {
                        return a.first == b.first && a.second.end == b.second.end &&
                               a.second.l2_base == b.second.l2_base;
                      });
  }

  // The L2 address this launch gave the block starting at device address `block_start`
  // (*l2_base), or false if the launch has not touched that block (or files by address).
  bool block_l2_base(uint64_t block_start, uint64_t* l2_base) const {
    auto it = m_blocks.find(block_start);
    if (it == m_blocks.end()) return false;
    *l2_base = it->second.l2_base;
    return true;
  }

 private:
  struct Placed {
    uint64_t end;      // device address past the block
    uint64_t l2_base;  // L2 address of the block's first byte
  };
  // The block of the latest l2_address() that found one (start, and its placement; end 0:
  // none). A transfer's ranges (rows of a strided copy) mostly lie in the block of the range
  // before, which this finds without searching m_blocks.
  struct Last {
    uint64_t start = 0;
    Placed placed{0, 0};
  };
  uint32_t m_line_bytes;
  GmBlockLookup m_lookup;
  std::map<uint64_t, Placed> m_blocks;  // device start -> placement, blocks this launch touched
  uint64_t m_next = kPackedBase;        // L2 address of the next block touched
  Last m_last;
};

// Looks GM range `r` up in `l2` at its L2 addresses under `placement`, piece by piece (a range
// that runs out of its block continues at the next piece's address); the sum of the pieces'
// outcomes. The memory system times a transfer with it, and the launch replay's check
// (verify_translation) repeats the lookups with it.
L2Outcome access_placed(L2Tags& l2, L2Placement& placement, const GmAccess& r);

}  // namespace npusim
