#include "sim/replay/launch_replay.h"

#include <algorithm>
#include <array>
#include <iterator>
#include <map>
#include <set>

#include <fmt/format.h>

#include "common/error.h"
#include "isa/disassembler.h"
#include "sim/chip/chip.h"
#include "sim/chip/l2_placement.h"
#include "sim/chip/l2_tags.h"
#include "sim/chip/memory_system.h"
#include "sim/core/ai_core.h"
#include "sim/replay/core_recording.h"
#include "sim/replay/functional_core.h"
#include "sim/replay/worker_pool.h"

namespace npusim {

using isa::Opcode;

namespace {

// Two 64-bit multiply-mix hashes with different seeds (a collision needs both to collide).
struct Hasher {
  uint64_t a = 0x9e3779b97f4a7c15ull, b = 0xc2b2ae3d27d4eb4full;
  void add(uint64_t v) {
    a = (a ^ v) * 0xff51afd7ed558ccdull;
    a ^= a >> 32;
    b = (b + v) * 0xc4ceb9fe1a85ec53ull;
    b ^= b >> 29;
  }
};

}  // namespace

size_t LaunchKeyHash::operator()(const LaunchKey& k) const {
  Hasher h;
  h.add(k.program_hash[0]);
  for (uint64_t a : k.args) h.add(a);
  h.add(static_cast<uint64_t>(k.block_dim));
  return static_cast<size_t>(h.a);
}

bool replay_key(const isa::Program& program, const std::vector<uint64_t>& args, int block_dim,
                LaunchKey* key, LaunchKey* similar, bool* loads, bool* cross_core) {
  Hasher h;
  bool has_ld = false, has_cc = false;
  for (const isa::Section& s : program.sections) {
    h.add(0x5ec7000000000000ull | static_cast<uint64_t>(s.kind));
    h.add(s.code.size());
    for (const isa::Instruction& in : s.code) {
      has_cc = has_cc || in.op == Opcode::op_cc_set || in.op == Opcode::op_cc_wait;
      has_ld = has_ld || in.op == Opcode::op_ld;
      h.add(static_cast<uint64_t>(in.op));
      const size_t n = static_cast<int>(in.op) < isa::kNumOpcodes ? in.desc().fields.size() : 0;
      for (size_t f = 0; f < n; ++f)
        h.add(static_cast<uint64_t>(in.ops[f].value) * 2 + (in.ops[f].is_reg ? 1 : 0));
    }
  }
  if (has_cc && !cross_core) return false;
  if (loads) *loads = has_ld;
  if (cross_core) *cross_core = has_cc;
  key->program_hash[0] = h.a;
  key->program_hash[1] = h.b;
  key->args = args;
  key->block_dim = block_dim;
  *similar = *key;
  for (size_t i = 0; i < args.size() && i < program.arg_names.size(); ++i)
    if (program.arg(i).typed()) similar->args[i] = 0;
  return true;
}

namespace {

// The most lines any one set of the L2 (`sets` sets, > 0) receives from blocks (start -> bytes)
// filed back to back, each from a fresh line (sim/chip/l2_placement.h), wherever the first one
// falls. The blocks lie on L consecutive lines, which modulo indexing spreads ceil(L / sets) to
// a set at most. The page rotation (L2Tags::set_in, pages counted from each block's first
// line) leaves a block's first page as modulo files it and puts a whole page, as any `sets`
// consecutive lines, once in every set; only the last page of a block longer than a page, when
// partial, is a run of sets other than modulo's: one more line in a set at most, each.
uint64_t packed_per_set(const std::map<uint64_t, uint64_t>& blocks, uint64_t line, uint64_t sets,
                        bool page_rotation) {
  uint64_t lines = 0, rotated_tails = 0;
  for (const auto& [start, bytes] : blocks) {
    const uint64_t n = (bytes + line - 1) / line;
    lines += n;
    if (page_rotation && n > sets && n % sets != 0) ++rotated_tails;
  }
  return (lines + sets - 1) / sets + rotated_tails;
}

// Whether the cyclic runs of sets [a, a + na) and [b, b + nb) (modulo `sets`) have a set in
// common.
bool sets_meet(uint64_t a, uint64_t na, uint64_t b, uint64_t nb, uint64_t sets) {
  if (na == 0 || nb == 0) return false;
  if (na >= sets || nb >= sets) return true;
  return (b + sets - a) % sets < na || (a + sets - b) % sets < nb;
}

// Condition (1') of relocated_writes: whether the L2 sees the recorded launch's lookups with its
// sets renamed when its touched arguments lie as `now` says (their blocks' bytes in
// now_blocks); else false and *why.
bool sets_move_alike(const RecordedLaunch::Translation& t,
                     const std::vector<RecordedLaunch::Translation::Extent>& now,
                     const std::map<uint64_t, uint64_t>& now_blocks, std::string* why) {
  const std::vector<RecordedLaunch::Translation::Extent>& then = t.extents;
  const uint64_t line = t.line_bytes, sets = t.sets;
  const size_t n = now.size();
  // Arguments that shared a block then share one now (a block now is a union of recorded
  // blocks): a block is filed when the launch first touches it, which is when it first touches
  // any of its arguments, so a block now is filed when the earliest filed of its recorded
  // blocks was (the lookups come in the recorded order), and the blocks now are filed in the
  // order of their earliest recorded L2 addresses, each from a fresh line. Arguments that
  // shared a block then and not now would be filed in the order the launch first touched each
  // of them, which the recording does not keep.
  for (size_t j = 0; j < n; ++j)
    for (size_t k = j + 1; k < n; ++k)
      if (now[j].touched && now[k].touched && then[j].block_start == then[k].block_start &&
          now[j].block_start != now[k].block_start) {
        *why = fmt::format("arguments {} and {} shared a block then, not now", j, k);
        return false;
      }
  std::map<uint64_t, uint64_t> filing;  // recorded L2 address -> the block's start now
  for (size_t k = 0; k < n; ++k)
    if (now[k].touched) filing.emplace(then[k].l2_base, now[k].block_start);
  std::map<uint64_t, uint64_t> now_base;  // block start now -> its L2 address now
  uint64_t next = 0;
  for (const auto& [recorded, start] : filing) {
    if (now_base.count(start)) continue;  // filed with an earlier recorded block
    now_base[start] = next;
    next += (now_blocks.at(start) + line - 1) / line * line;
  }
  // Per argument: the sets its span's lines fall in, then and now (cyclic runs, one per page
  // of its block the span touches, L2Tags::set_in, or every set for a span of `sets` lines or
  // more), and the number of sets it moved by. Addresses are relative to
  // L2Placement::kPackedBase, the same constant then and now: that shifts every set alike, so
  // runs compare and moves hold. With the page rotation a span's lines keep their pages' offsets
  // only if they keep their lines in their block (the same offset) or the span lies in one
  // page of its block then and now; then they all move by one number of sets.
  using Runs = std::vector<std::pair<uint64_t, uint64_t>>;  // (first set, sets)
  const auto runs_of = [&](uint64_t origin, uint64_t lo, uint64_t hi) {
    const uint64_t first = lo / line, end = (hi + line - 1) / line;  // lines in the block
    if (end - first >= sets) return Runs{{0, sets}};
    Runs runs;
    for (uint64_t l = first; l < end;) {
      const uint64_t page_end = std::min(end, (l / sets + 1) * sets);
      runs.push_back({L2Tags::set_in(origin + l, origin, sets, t.page_rotation), page_end - l});
      l = page_end;
    }
    return runs;
  };
  const auto meet = [sets](const Runs& a, const Runs& b) {
    for (const auto& [a_first, a_count] : a)
      for (const auto& [b_first, b_count] : b)
        if (sets_meet(a_first, a_count, b_first, b_count, sets)) return true;
    return false;
  };
  const auto one_page = [&](uint64_t lo, uint64_t hi) {
    return lo / line / sets == ((hi + line - 1) / line - 1) / sets;
  };
  struct Sets {
    Runs then, now;
    uint64_t moved = 0;
  };
  std::vector<Sets> runs(n);
  for (size_t k = 0; k < n; ++k) {
    if (!now[k].touched) continue;
    if (t.page_rotation && now[k].lo != then[k].lo &&
        !(one_page(then[k].lo, then[k].hi) && one_page(now[k].lo, now[k].hi))) {
      *why = fmt::format("argument {} moves to other lines of its block's rotated L2 pages", k);
      return false;
    }
    const uint64_t then_origin = then[k].l2_base / line;
    const uint64_t now_origin = now_base.at(now[k].block_start) / line;
    Sets& r = runs[k];
    r.then = runs_of(then_origin, then[k].lo, then[k].hi);
    r.now = runs_of(now_origin, now[k].lo, now[k].hi);
    const uint64_t then_first =
        L2Tags::set_in(then_origin + then[k].lo / line, then_origin, sets, t.page_rotation);
    const uint64_t now_first =
        L2Tags::set_in(now_origin + now[k].lo / line, now_origin, sets, t.page_rotation);
    r.moved = (now_first + sets - then_first) % sets;
  }
  for (size_t j = 0; j < n; ++j)
    for (size_t k = j + 1; k < n; ++k) {
      if (!now[j].touched || !now[k].touched || runs[j].moved == runs[k].moved) continue;
      const Sets &a = runs[j], &b = runs[k];
      if (meet(a.then, b.then) || meet(a.now, b.now)) {
        *why = fmt::format("arguments {} and {} move by other numbers of L2 sets ({} and {})", j, k,
                           a.moved, b.moved);
        return false;
      }
    }
  return true;
}

struct Range {
  uint64_t begin, end;
  int core;
};

// The ranges sorted by begin, overlapping and adjacent ones merged (their union as maximal
// disjoint ranges, so the result does not depend on how it is computed).
std::vector<Range> merged(std::vector<Range> v) {
  // A core's ranges come in execution order, and a tile's rows mostly continue each other:
  // joining those first leaves the sort few ranges (a large launch has millions).
  size_t n = 0;
  for (const Range& r : v) {
    if (n > 0 && r.begin >= v[n - 1].begin && r.begin <= v[n - 1].end)
      v[n - 1].end = std::max(v[n - 1].end, r.end);
    else
      v[n++] = r;
  }
  v.resize(n);
  auto by_begin = [](const Range& a, const Range& b) { return a.begin < b.begin; };
  if (!std::is_sorted(v.begin(), v.end(), by_begin)) std::sort(v.begin(), v.end(), by_begin);
  std::vector<Range> out;
  for (const Range& r : v) {
    if (!out.empty() && r.begin <= out.back().end)
      out.back().end = std::max(out.back().end, r.end);
    else
      out.push_back(r);
  }
  return out;
}

// Whether some core wrote bytes that another core read or wrote: the lists in accesses[c] are
// core c's.
using CoreAccesses = std::vector<std::vector<const std::vector<GmAccess>*>>;
bool cores_share_written_bytes(const CoreAccesses& accesses) {
  std::vector<Range> writes;                      // every core's, each core's merged
  std::vector<std::vector<Range>> reads_by_core;  // merged per core
  for (size_t c = 0; c < accesses.size(); ++c) {
    std::vector<Range> w, r;
    for (const std::vector<GmAccess>* list : accesses[c])
      for (const GmAccess& a : *list)
        (a.write ? w : r).push_back({a.addr, a.addr + a.bytes, static_cast<int>(c)});
    for (const Range& m : merged(std::move(w))) writes.push_back(m);
    if (!r.empty()) reads_by_core.push_back(merged(std::move(r)));
  }
  // Write against write: within a core the merged ranges are disjoint, so a range starting
  // below the largest end seen so far overlaps another core's range.
  std::sort(writes.begin(), writes.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  uint64_t max_end = 0;
  for (const Range& w : writes) {
    if (w.begin < max_end) return true;
    max_end = std::max(max_end, w.end);
  }
  // Read against another core's write (the writes are now disjoint and sorted).
  for (const auto& reads : reads_by_core)
    for (const Range& r : reads) {
      auto it = std::upper_bound(writes.begin(), writes.end(), r.begin,
                                 [](uint64_t addr, const Range& w) { return addr < w.begin; });
      if (it != writes.begin() && std::prev(it)->end > r.begin) --it;
      for (; it != writes.end() && it->begin < r.end; ++it)
        if (it->core != r.core) return true;
    }
  return false;
}

// Whether a core loads bytes it also writes in the launch. The check runs without effects, so
// such a load may have read a value the launch changes first: the check cannot vouch for what
// the core does with it. (Conservative: the order of the two is not looked at.)
bool loads_own_writes(const FunctionalCore& fc) {
  if (fc.loads().empty()) return false;
  std::vector<Range> writes, loads;
  for (const std::vector<GmAccess>* list : {&fc.transfer_ranges(), &fc.stores()})
    for (const GmAccess& a : *list)
      if (a.write) writes.push_back({a.addr, a.addr + a.bytes, 0});
  for (const GmAccess& a : fc.loads()) loads.push_back({a.addr, a.addr + a.bytes, 0});
  writes = merged(std::move(writes));
  loads = merged(std::move(loads));
  for (size_t w = 0, l = 0; w < writes.size() && l < loads.size();) {
    if (writes[w].begin < loads[l].end && loads[l].begin < writes[w].end) return true;
    if (writes[w].end <= loads[l].end)
      ++w;
    else
      ++l;
  }
  return false;
}

}  // namespace

bool record_blocks(const isa::Program& program, const Chip& chip, RecordedLaunch* rec) {
  const auto& recordings = chip.recordings();
  CoreAccesses accesses;
  for (const auto& r : recordings) accesses.push_back({&r->gm_accesses()});
  // A lean recording serves the timing-only translated replay alone, which runs nothing and
  // invalidates the union of the written ranges, stamping the current epoch as the simulated
  // run's writes did in whatever order: two cores writing the same bytes (a race a functional
  // run would settle by their order) leave it exactly what simulating leaves.
  const bool lean = !recordings.empty() && recordings.front()->lean();
  // With the effects' order across the cores, the replay carries them out in that order, so
  // cores may share bytes as they did.
  const std::vector<uint16_t>& order = chip.effect_order();
  if (!lean && order.empty() && cores_share_written_bytes(accesses)) return false;
  rec->transfer_order = chip.memory().transfer_order();
  rec->l2_fingerprint = chip.memory().l2_fingerprint();
  std::map<const SectionRun*, int> run_index;
  for (const auto& core : chip.cores()) {
    const auto& assigned = core->assigned_blocks();
    if (assigned.empty()) continue;
    const CoreRecording& r = *recordings[static_cast<size_t>(core->chip_index())];
    RecordedLaunch::CoreBlocks cb{
        core->chip_index(), {}, r.exec_order(), r.fingerprint(), r.transfer_pipes()};
    for (const AiCore::AssignedBlock& a : assigned) {
      auto [it, added] = run_index.emplace(a.run, static_cast<int>(rec->runs.size()));
      if (added) {
        rec->runs.push_back(*a.run);
        rec->run_section.push_back(static_cast<int>(a.run->section - program.sections.data()));
      }
      cb.blocks.push_back({it->second, a.block, a.subblock});
    }
    rec->cores.push_back(std::move(cb));
  }
  if (!lean && !order.empty()) {
    std::vector<int> slot(chip.cores().size(), -1);  // chip index -> position in rec->cores
    for (size_t i = 0; i < rec->cores.size(); ++i)
      slot[static_cast<size_t>(rec->cores[i].core)] = static_cast<int>(i);
    rec->effect_cores.reserve(order.size());
    for (uint16_t core : order) {
      // A core with effects ran blocks (it is in rec->cores).
      if (core >= slot.size() || slot[core] < 0) return false;
      rec->effect_cores.push_back(static_cast<uint16_t>(slot[core]));
    }
  }
  return true;
}

namespace {

// Translation::l2_lookups from the memory system's trace. Every range derives from one
// argument, and lies in that argument's span (Extent lo/hi: the union of the ranges of the
// instructions whose GM operand derives from it), so a range in the span of one touched
// argument only is that argument's; one in the spans of several (arguments of one block whose
// spans overlap) is kept relative to the one met first walking down the touched arguments from
// the nearest block start (the last of that block's in block-start order), and the others are
// its block mates: a replay must move them alike. A range in no touched argument's span leaves the
// translation untraced (run_l2_lookups_match then refuses it).
void record_l2_lookups(const std::vector<GmAccess>& trace, const std::vector<uint64_t>& args,
                       uint64_t fingerprint, RecordedLaunch::Translation* t) {
  using Extent = RecordedLaunch::Translation::Extent;
  std::vector<uint32_t> touched;  // the touched arguments, by block start
  for (size_t k = 0; k < args.size(); ++k)
    if (t->extents[k].touched) touched.push_back(static_cast<uint32_t>(k));
  std::sort(touched.begin(), touched.end(), [&](uint32_t j, uint32_t k) {
    return t->extents[j].block_start < t->extents[k].block_start;
  });
  std::set<std::pair<uint32_t, uint32_t>> mates;
  t->l2_lookups.clear();
  t->l2_lookups.reserve(trace.size());
  for (const GmAccess& a : trace) {
    // The touched arguments whose block starts at or below a.addr, the nearest block first.
    auto it = std::upper_bound(
        touched.begin(), touched.end(), a.addr,
        [&](uint64_t addr, uint32_t k) { return addr < t->extents[k].block_start; });
    int64_t owner = -1;
    while (it != touched.begin()) {
      const uint32_t k = *--it;
      const Extent& e = t->extents[k];
      if (owner >= 0 && e.block_start != t->extents[static_cast<size_t>(owner)].block_start) break;
      const uint64_t lo = a.addr - e.block_start;
      if (lo < e.lo || lo + a.bytes > e.hi || lo + a.bytes < lo) continue;
      if (owner < 0)
        owner = k;
      else
        mates.emplace(k, static_cast<uint32_t>(owner));
    }
    if (owner < 0) {
      t->l2_lookups.clear();
      t->l2_block_mates.clear();
      return;
    }
    const uint32_t k = static_cast<uint32_t>(owner);
    t->l2_lookups.push_back({k, a.l2, a.write, a.addr - args[k], a.bytes});
  }
  t->l2_block_mates.assign(mates.begin(), mates.end());
  t->l2_traced = true;
  t->l2_trace_fingerprint = fingerprint;
}

// The block `blocks` files `addr` by: true and *start, *bytes, or false (filed at itself), as
// L2Placement::l2_address asks it.
bool filing_block(const GmBlockLookup& blocks, uint64_t addr, uint64_t* start, uint64_t* bytes) {
  return blocks(addr, start, bytes) && *bytes > 0 && addr >= *start && addr - *start < *bytes;
}

// Whether [a_start, + a_bytes) and [b_start, + b_bytes) share a byte.
bool overlap(uint64_t a_start, uint64_t a_bytes, uint64_t b_start, uint64_t b_bytes) {
  return a_start < b_start + b_bytes && b_start < a_start + a_bytes;
}

// An argument's block as the L2's filing finds it (filing_block): `in` false where none holds
// the argument, or where the argument was not looked up.
struct ArgBlock {
  bool in = false;
  uint64_t start = 0, bytes = 0;
};
// The blocks of the arguments `wanted` names (wanted(k)), looked up once; the others not in one.
template <class Wanted>
std::vector<ArgBlock> arg_filing_blocks(const std::vector<uint64_t>& args,
                                        const GmBlockLookup& blocks, Wanted wanted) {
  std::vector<ArgBlock> out(args.size());
  for (size_t k = 0; k < args.size(); ++k)
    if (wanted(k)) out[k].in = filing_block(blocks, args[k], &out[k].start, &out[k].bytes);
  return out;
}
// Where an argument's block lies with respect to the block [start, + bytes) that files a piece
// of Translation::outside: it is that block (in), overlaps it being another (overlapping), or
// neither (beside; also an argument in no block).
enum class PieceRelation { beside, in, overlapping };
PieceRelation piece_relation(const ArgBlock& b, uint64_t start, uint64_t bytes) {
  if (!b.in) return PieceRelation::beside;
  if (b.start == start && b.bytes == bytes) return PieceRelation::in;
  return overlap(b.start, b.bytes, start, bytes) ? PieceRelation::overlapping
                                                 : PieceRelation::beside;
}

// Translation::outside and pinned from the spans leaving their arguments' blocks (device
// addresses, Range::core the argument): the parts outside the argument's block, merged, split
// into the pieces the L2's filing by block makes of them (L2Placement::l2_address), each with
// the touched arguments whose block is its block and those whose block overlaps it (pinned).
bool record_outside(const std::vector<Range>& spans, std::vector<bool> pinned,
                    const std::vector<uint64_t>& args, const GmBlockLookup& blocks,
                    RecordedLaunch::Translation* t) {
  // Each argument's block (the arguments some range derives from: touched or pinned).
  const std::vector<ArgBlock> arg_block =
      arg_filing_blocks(args, blocks, [&](size_t k) { return t->extents[k].touched || pinned[k]; });
  std::vector<Range> parts;
  for (const Range& r : spans) {
    const ArgBlock& b = arg_block[static_cast<size_t>(r.core)];
    if (!b.in) return false;
    if (r.begin < b.start) parts.push_back({r.begin, std::min(r.end, b.start), r.core});
    if (r.end > b.start + b.bytes)
      parts.push_back({std::max(r.begin, b.start + b.bytes), r.end, r.core});
  }
  for (const Range& part : merged(std::move(parts))) {
    for (uint64_t addr = part.begin; addr < part.end;) {
      RecordedLaunch::Translation::Outside o;
      o.addr = addr;
      o.in_block = filing_block(blocks, addr, &o.block_start, &o.block_bytes);
      o.bytes = o.in_block ? std::min(part.end, o.block_start + o.block_bytes) - addr
                           : part.end - addr;  // the rest files at itself
      if (o.in_block)
        for (size_t k = 0; k < args.size(); ++k) {
          const ArgBlock& b = arg_block[k];
          switch (piece_relation(b, o.block_start, o.block_bytes)) {
            case PieceRelation::in: o.same_block.push_back(static_cast<uint32_t>(k)); break;
            case PieceRelation::overlapping:
              o.overlapping.push_back({static_cast<uint32_t>(k), b.start, b.bytes});
              pinned[k] = true;
              break;
            case PieceRelation::beside: break;
          }
        }
      addr += o.bytes;
      t->outside.push_back(std::move(o));
    }
  }
  for (size_t k = 0; k < args.size(); ++k)
    if (pinned[k]) t->pinned.push_back(static_cast<uint32_t>(k));
  return true;
}

}  // namespace

void record_translation(const isa::Program& program, const AddressFlow& flow, const Chip& chip,
                        const std::vector<uint64_t>& args, const GmBlockLookup& gm_blocks,
                        const DeviceMemory& gm, RecordedLaunch* rec,
                        const std::vector<GmAccess>* l2_trace) {
  rec->translation.reset();
  if (!(flow.ok || flow.steered) || !gm_blocks || flow.gm_arg.size() != program.sections.size())
    return;
  // The block of each argument a GM operand derives from, looked up once.
  struct Block {
    bool looked = false, found = false;
    uint64_t start = 0, end = 0;
  };
  std::vector<Block> blocks(args.size());
  // The block of the argument the GM operand at `pc` derives from, or null.
  auto block_at = [&](const std::vector<int16_t>& gm_arg, uint32_t pc) -> const Block* {
    const int k = pc < gm_arg.size() ? gm_arg[pc] : -1;
    if (k < 0 || static_cast<size_t>(k) >= args.size()) return nullptr;
    Block& b = blocks[static_cast<size_t>(k)];
    if (!b.looked) {
      uint64_t start = 0, bytes = 0;
      b.looked = true;
      b.found = gm_blocks(args[static_cast<size_t>(k)], &start, &bytes);
      b.start = start;
      b.end = start + bytes;
    }
    return b.found ? &b : nullptr;
  };
  auto translation = std::make_shared<RecordedLaunch::Translation>();
  translation->args = args;
  std::vector<RecordedLaunch::Translation::Extent>& extents = translation->extents;
  extents.resize(args.size());
  std::vector<Range> writes;  // Range::core holds the argument
  std::vector<Range> loads;   // as offsets in the argument's block (steered programs)
  // Spans leaving their argument's block (device addresses; Range::core holds the argument),
  // and the arguments they pin (Translation::outside).
  std::vector<Range> outside;
  std::vector<bool> pinned(args.size(), false);
  const auto& recordings = chip.recordings();
  for (const auto& core : chip.cores()) {
    const auto& assigned = core->assigned_blocks();
    if (assigned.empty()) continue;
    // The section the core ran (a core of one kind runs one section).
    const isa::Section* section = assigned.front().run->section;
    for (const AiCore::AssignedBlock& a : assigned)
      if (a.run->section != section) return;
    const std::vector<int16_t>& gm_arg =
        flow.gm_arg[static_cast<size_t>(section - program.sections.data())];
    const CoreRecording& r = *recordings[static_cast<size_t>(core->chip_index())];
    // Every range each instruction touched lies in its argument's block (its span does), or
    // its argument is pinned (a steered program's loaded bytes are kept by block: not so).
    const std::vector<CoreRecording::Span>& spans = r.spans();
    for (uint32_t pc = 0; pc < spans.size(); ++pc) {
      if (spans[pc].end == 0) continue;
      const Block* b = block_at(gm_arg, pc);
      if (!b) return;
      const int k = gm_arg[pc];
      uint64_t lo = spans[pc].begin, hi = spans[pc].end;
      if (lo < b->start || hi > b->end) {
        if (flow.steered || hi < lo) return;
        outside.push_back({lo, hi, k});
        pinned[static_cast<size_t>(k)] = true;
        lo = std::max(lo, b->start);
        hi = std::min(hi, b->end);
        if (lo >= hi) continue;  // wholly outside: its block's span is the others'
      }
      RecordedLaunch::Translation::Extent& e = extents[static_cast<size_t>(k)];
      e.lo = e.touched ? std::min(e.lo, lo - b->start) : lo - b->start;
      e.hi = e.touched ? std::max(e.hi, hi - b->start) : hi - b->start;
      e.touched = true;
    }
    // The ranges written (a lean recording holds only those), by argument.
    const std::vector<GmAccess>& accesses = r.gm_accesses();
    const auto& ops = r.gm_ops();
    for (size_t o = 0; o < ops.size(); ++o) {
      const Block* b = block_at(gm_arg, ops[o].pc);
      if (!b) return;
      const int k = gm_arg[ops[o].pc];
      const size_t end = o + 1 < ops.size() ? ops[o + 1].first : accesses.size();
      for (size_t i = ops[o].first; i < end; ++i) {
        const GmAccess& a = accesses[i];
        if (a.addr + a.bytes < a.addr) return;
        // Outside its block: inside its instruction's span, which pinned its argument above.
        if ((a.addr < b->start || a.addr + a.bytes > b->end) && !pinned[static_cast<size_t>(k)])
          return;
        if (a.write) writes.push_back({a.addr - b->start, a.addr - b->start + a.bytes, k});
      }
    }
    if (flow.steered)
      for (const CoreRecording::Load& l : r.loads()) {
        const Block* b = block_at(gm_arg, l.pc);
        if (!b || l.addr < b->start || l.addr + l.bytes > b->end) return;
        loads.push_back({l.addr - b->start, l.addr - b->start + l.bytes, gm_arg[l.pc]});
      }
  }
  // What the loads read, kept to compare with a later launch's bytes (loads_as_recorded). Each
  // ld read its bytes as they were when the launch began only if no instruction of the launch
  // wrote them: a later launch is compared at its start. So a steered program that loads bytes
  // it writes is not translatable (# conservative: the order of the two is not looked at).
  if (flow.steered) {
    std::map<int, std::vector<Range>> loads_by_arg, writes_by_arg;
    for (const Range& l : loads) loads_by_arg[l.core].push_back(l);
    for (const Range& w : writes) writes_by_arg[w.core].push_back(w);
    std::vector<Range> written;  // device addresses
    for (auto& [k, list] : writes_by_arg)
      for (const Range& m : merged(std::move(list)))
        written.push_back({blocks[static_cast<size_t>(k)].start + m.begin,
                           blocks[static_cast<size_t>(k)].start + m.end, k});
    written = merged(std::move(written));
    for (auto& [k, list] : loads_by_arg) {
      const uint64_t start = blocks[static_cast<size_t>(k)].start;
      const uint64_t arg_offset = args[static_cast<size_t>(k)] - start;
      for (const Range& m : merged(std::move(list))) {
        const uint64_t lo = start + m.begin, hi = start + m.end;
        auto it = std::upper_bound(written.begin(), written.end(), lo,
                                   [](uint64_t addr, const Range& w) { return addr < w.begin; });
        if (it != written.begin() && std::prev(it)->end > lo) return;
        if (it != written.end() && it->begin < hi) return;
        translation->loads.push_back({static_cast<uint32_t>(k), m.begin - arg_offset,
                                      m.end - m.begin, translation->loaded.size()});
        translation->loaded.resize(translation->loaded.size() + (hi - lo));
        gm.read(lo, translation->loaded.data() + translation->loads.back().first, hi - lo);
      }
    }
  }
  // Their union, by argument: every write stamps the same epoch (DeviceMemory::invalidate).
  std::map<int, std::vector<Range>> by_arg;
  for (const Range& w : writes) by_arg[w.core].push_back(w);
  for (auto& [k, list] : by_arg)
    for (const Range& m : merged(std::move(list)))
      translation->writes.push_back(
          {static_cast<uint32_t>(k),
           m.begin - (args[static_cast<size_t>(k)] - blocks[static_cast<size_t>(k)].start),
           m.end - m.begin});
  if (!outside.empty() && !record_outside(outside, pinned, args, gm_blocks, translation.get()))
    return;
  // Where the touched arguments lay, and whether the launch fits the L2 at any placement: a
  // span of n lines (at a line-aligned L2 address plus its offset in its block) puts at most
  // ceil(n / sets) of them in any one set, one more with the L2's page rotation (one line per
  // page of its block it touches: L2Tags::set_in).
  const L2Tags& l2 = chip.memory().l2();
  const uint64_t line = l2.line_bytes(), sets = l2.sets();
  uint64_t per_set = 0;
  std::map<uint64_t, uint64_t> touched_blocks;  // block start -> bytes
  const L2Placement& placement = chip.memory().placement();
  bool placed = true;
  for (size_t k = 0; k < args.size(); ++k) {
    RecordedLaunch::Translation::Extent& e = extents[k];
    if (!e.touched) continue;
    e.block_start = blocks[k].start;
    e.offset = args[k] - blocks[k].start;
    uint64_t l2_base = 0;
    if (placement.block_l2_base(e.block_start, &l2_base) && l2_base >= L2Placement::kPackedBase)
      e.l2_base = l2_base - L2Placement::kPackedBase;
    else
      placed = false;
    touched_blocks[blocks[k].start] = blocks[k].end - blocks[k].start;
    const uint64_t lines = (e.hi + line - 1) / line - e.lo / line;
    if (sets > 0) per_set += (lines + sets - 1) / sets + (l2.page_rotation() ? 1 : 0);
  }
  translation->line_bytes = static_cast<uint32_t>(line);
  translation->page_rotation = l2.page_rotation();
  translation->fits_any_placement = sets > 0 && per_set <= static_cast<uint64_t>(l2.ways());
  translation->fits_packed =
      sets > 0 && packed_per_set(touched_blocks, line, sets, l2.page_rotation()) <=
                      static_cast<uint64_t>(l2.ways());
  translation->fits_l2 = translation->fits_any_placement || translation->fits_packed;
  translation->l2_placed = placed && sets > 0;
  translation->sets = sets;
  translation->ways_needed = static_cast<uint32_t>(std::min<uint64_t>(per_set, UINT32_MAX));
  translation->ways = static_cast<uint32_t>(l2.ways());
  if (!translation->outside.empty()) {
    // Pinned: neither relocated nor traced (Translation::outside).
    translation->fits_any_placement = translation->fits_packed = translation->fits_l2 = false;
    translation->l2_placed = false;
    l2_trace = nullptr;
  }
  if (l2_trace)
    record_l2_lookups(*l2_trace, args, chip.memory().l2_fingerprint(), translation.get());
  rec->translation = std::move(translation);
}

std::vector<bool> append_fixed_blocks(const std::vector<GmBlock>& blocks,
                                      const PlannedBlocks& planned, std::vector<uint64_t>* key) {
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // every block and planned buffer, once
  for (const GmBlock& b : blocks) spans.emplace_back(b.start, b.bytes);
  spans.insert(spans.end(), planned.begin(), planned.end());
  std::sort(spans.begin(), spans.end());
  spans.erase(std::unique(spans.begin(), spans.end()), spans.end());
  std::vector<bool> fixed(blocks.size(), false);
  for (size_t b = 0; b < blocks.size(); ++b) {
    const GmBlock& blk = blocks[b];
    for (const auto& [start, bytes] : spans)
      if ((start != blk.start || bytes != blk.bytes) && overlap(start, bytes, blk.start, blk.bytes))
        fixed[b] = true;
    key->insert(key->end(), {fixed[b] ? blk.start : ~uint64_t{0}, blk.bytes});
  }
  for (const auto& [start, bytes] : planned)  // those overlapping a fixed block
    for (size_t b = 0; b < blocks.size(); ++b)
      if (fixed[b] && overlap(start, bytes, blocks[b].start, blocks[b].bytes)) {
        key->insert(key->end(), {start, bytes});
        break;
      }
  return fixed;
}

bool run_l2_lookups_match(const RecordedLaunch& rec, const std::vector<uint64_t>& args, L2Tags& l2,
                          L2Placement& placement) {
  const RecordedLaunch::Translation* t = rec.translation.get();
  if (!t || !t->l2_traced || t->args.size() != args.size()) return false;
  for (const auto& [k, kept] : t->l2_block_mates)
    if (args[k] - t->args[k] != args[kept] - t->args[kept]) return false;
  uint64_t h = kL2FingerprintSeed;
  for (const RecordedLaunch::Translation::L2Lookup& k : t->l2_lookups)
    h = l2_fingerprint(
        h, access_placed(l2, placement, {args[k.arg] + k.offset, k.bytes, k.write, k.l2}));
  return h == t->l2_trace_fingerprint;
}

bool outside_blocks_alike(const RecordedLaunch& rec, const std::vector<uint64_t>& args,
                          const GmBlockLookup& blocks, std::string* why) {
  const RecordedLaunch::Translation* t = rec.translation.get();
  if (!t || t->outside.empty()) return true;
  const auto refuse = [why](std::string what) {
    if (why) *why = std::move(what);
    return false;
  };
  if (t->args.size() != args.size() || !blocks) return refuse("no allocation blocks");
  for (uint32_t k : t->pinned)
    if (args[k] != t->args[k])
      return refuse(fmt::format(
          "argument {} moved, and a range past its block was recorded at its address", k));
  // The touched and pinned arguments' blocks now, looked up once.
  const std::vector<ArgBlock> now = arg_filing_blocks(args, blocks, [&](size_t k) {
    return t->extents[k].touched || std::binary_search(t->pinned.begin(), t->pinned.end(), k);
  });
  for (const RecordedLaunch::Translation::Outside& o : t->outside) {
    uint64_t start = 0, bytes = 0;
    const bool in = filing_block(blocks, o.addr, &start, &bytes);
    if (in != o.in_block || (in && (start != o.block_start || bytes != o.block_bytes)))
      return refuse(
          fmt::format("the bytes at {:#x} past an argument's block lie in another "
                      "block than in the recording",
                      o.addr));
    if (!in) continue;
    size_t next = 0, next_overlap = 0;  // into o.same_block, o.overlapping
    for (size_t k = 0; k < args.size(); ++k) {
      const ArgBlock& b = now[k];
      const PieceRelation relation = piece_relation(b, start, bytes);
      const bool same = relation == PieceRelation::in;
      const bool overlaps = relation == PieceRelation::overlapping;
      const bool was = next < o.same_block.size() && o.same_block[next] == k;
      if (was) ++next;
      const RecordedLaunch::Translation::Outside::Overlap* then =
          next_overlap < o.overlapping.size() && o.overlapping[next_overlap].arg == k
              ? &o.overlapping[next_overlap++]
              : nullptr;
      const auto where = [](bool in, bool over) {
        return in ? "in" : over ? "overlapping" : "beside";
      };
      if (same != was || overlaps != (then != nullptr) ||
          (then && (b.start != then->start || b.bytes != then->bytes)))
        return refuse(fmt::format(
            "argument {} lies {} the block at {:#x} that a range past an argument's block reads, "
            "{} it in the recording{}",
            k, where(same, overlaps), start, where(was, then != nullptr),
            overlaps && then ? " (in another block)" : ""));
    }
  }
  return true;
}

bool translated_writes(const RecordedLaunch& rec, const std::vector<uint64_t>& args,
                       uint64_t granule, std::vector<GmAccess>* writes) {
  const RecordedLaunch::Translation* t = rec.translation.get();
  if (!t || t->args.size() != args.size() || granule == 0) return false;
  for (size_t k = 0; k < args.size(); ++k)
    if ((args[k] - t->args[k]) % granule != 0) return false;
  writes->clear();
  writes->reserve(t->writes.size());
  for (const RecordedLaunch::Translation::Write& w : t->writes)
    writes->push_back({args[w.arg] + w.offset, w.bytes, true, isa::L2Hint::NORMAL});
  return true;
}

bool loads_as_recorded(const RecordedLaunch& rec, const std::vector<uint64_t>& args,
                       const DeviceMemory& gm, std::string* why) {
  const RecordedLaunch::Translation* t = rec.translation.get();
  if (!t || t->loads.empty()) return true;
  if (t->args.size() != args.size()) return false;
  std::vector<uint8_t> now;
  for (const RecordedLaunch::Translation::Load& l : t->loads) {
    const uint64_t addr = args[l.arg] + l.offset;
    now.resize(l.bytes);
    if (gm.in_bounds(addr, l.bytes)) gm.read(addr, now.data(), l.bytes);
    if (!gm.in_bounds(addr, l.bytes) ||
        !std::equal(now.begin(), now.end(), t->loaded.begin() + static_cast<ptrdiff_t>(l.first))) {
      if (why)
        *why = fmt::format(
            "argument {} holds other bytes where the recorded launch loaded ({} at "
            "offset {})",
            l.arg, l.bytes, static_cast<int64_t>(l.offset));
      return false;
    }
  }
  // The recording read each load's bytes as they were at the launch's start because the launch
  // wrote none of them (record_translation); at other addresses the moved writes must keep off
  // the moved loads too, or a core would load what the launch itself wrote (a graph run's
  // launch relocates at any block layout; a cold one's condition (3) already keeps the layout).
  for (const RecordedLaunch::Translation::Load& l : t->loads) {
    const uint64_t lo = args[l.arg] + l.offset, hi = lo + l.bytes;
    for (const RecordedLaunch::Translation::Write& w : t->writes) {
      const uint64_t w_lo = args[w.arg] + w.offset, w_hi = w_lo + w.bytes;
      if (lo < w_hi && w_lo < hi) {
        if (why)
          *why = fmt::format(
              "argument {} is written where the recorded launch loaded ({} at offset {})", l.arg,
              l.bytes, static_cast<int64_t>(l.offset));
        return false;
      }
    }
  }
  return true;
}

bool relocated_writes(const RecordedLaunch& rec, const std::vector<uint64_t>& args,
                      const GmBlockLookup& blocks, uint64_t granule, std::vector<GmAccess>* writes,
                      std::string* why, bool* sets_moved) {
  using Extent = RecordedLaunch::Translation::Extent;
  const auto refuse = [why](std::string what) {
    if (why) *why = std::move(what);
    return false;
  };
  if (sets_moved) *sets_moved = false;
  const RecordedLaunch::Translation* t = rec.translation.get();
  if (!t || !blocks || t->args.size() != args.size() || t->extents.size() != args.size() ||
      t->line_bytes == 0)
    return refuse("the recording is not translatable");
  if (!t->outside.empty())
    return refuse("a range past an argument's block pins it at its recorded address");
  const std::string spans_evict = fmt::format(
      "may evict: its spans need {} L2 ways of {} at some placement", t->ways_needed, t->ways);
  if (!t->relocatable()) return refuse(spans_evict);
  const uint64_t line = t->line_bytes;
  // (2) Each touched argument now: its block, offset and moved span (as offsets in the block).
  std::vector<Extent> now(args.size());
  std::map<uint64_t, uint64_t> now_blocks;  // block start -> bytes (for (1) by fits_packed)
  for (size_t k = 0; k < args.size(); ++k) {
    const Extent& e = t->extents[k];
    if (!e.touched) continue;
    uint64_t start = 0, bytes = 0;
    if (!blocks(args[k], &start, &bytes) || args[k] < start)
      return refuse(fmt::format("argument {} lies in no allocation block", k));
    Extent& n = now[k];
    n.touched = true;
    n.block_start = start;
    n.offset = args[k] - start;
    // The same offset modulo a line in its block (the L2's filing) and in device memory.
    if (n.offset % line != e.offset % line || (args[k] - t->args[k]) % line != 0)
      return refuse(fmt::format("argument {} at another offset modulo the L2 line ({} against {})",
                                k, n.offset % line, e.offset % line));
    // The span moves with the argument: [lo, hi) - e.offset + n.offset, inside [0, bytes).
    n.lo = n.offset + e.lo - e.offset;
    n.hi = n.offset + e.hi - e.offset;
    if (n.offset + e.lo < e.offset || n.hi > bytes)
      return refuse(fmt::format("argument {}'s span would leave its block", k));
    now_blocks[start] = bytes;
  }
  // (1) for a recording that fits only under the filing by block: so must this launch's blocks.
  // evicts: why (1) does not hold ("": it does).
  std::string evicts = t->fits_l2 ? "" : spans_evict;
  if (t->fits_l2 && !t->fits_any_placement) {
    const uint64_t per_set = packed_per_set(now_blocks, line, t->sets, t->page_rotation);
    if (per_set > t->ways)
      evicts = fmt::format("may evict: its blocks may put {} lines in an L2 set of {} ways",
                           per_set, t->ways);
  }
  // (3) Arguments sharing a line, then or now, keep their distance in one block.
  const auto share_line = [line](const Extent& a, const Extent& b) {
    return a.block_start == b.block_start && a.lo / line < (b.hi + line - 1) / line &&
           b.lo / line < (a.hi + line - 1) / line;
  };
  for (size_t j = 0; j < args.size(); ++j) {
    if (!now[j].touched) continue;
    for (size_t k = j + 1; k < args.size(); ++k) {
      if (!now[k].touched) continue;
      const Extent &ej = t->extents[j], &ek = t->extents[k];
      if (!share_line(ej, ek) && !share_line(now[j], now[k])) continue;
      if (ej.block_start != ek.block_start || now[j].block_start != now[k].block_start ||
          ek.offset - ej.offset != now[k].offset - now[j].offset)
        return refuse(fmt::format("arguments {} and {} share L2 lines differently", j, k));
    }
  }
  // (1') for a launch that may evict: its sets move alike.
  if (!evicts.empty()) {
    if (!t->l2_placed) return refuse(evicts);
    std::string moved;
    if (!sets_move_alike(*t, now, now_blocks, &moved)) return refuse(evicts + ", and " + moved);
    if (sets_moved) *sets_moved = true;
  }
  if (!translated_writes(rec, args, granule, writes))
    return refuse(
        fmt::format("a displacement is not a multiple of the GM alignment ({} bytes)", granule));
  return true;
}

namespace {

// "core aic3 pc 12 (k.s:30): <instruction>: <what>" for a fault of a replayed block.
std::string replay_fault(const isa::Program& program, const AiCore& core, const SectionRun& run,
                         uint32_t pc, const std::string& what) {
  const auto& code = run.section->code;
  const std::string source = program.source.empty() ? program.name : program.source;
  std::string where = fmt::format("pc {} ({})", pc, source);
  std::string insn;
  if (pc < code.size()) {
    if (code[pc].src_line) where = fmt::format("pc {} ({}:{})", pc, source, code[pc].src_line);
    if (static_cast<int>(code[pc].op) < isa::kNumOpcodes)
      insn = isa::disassemble(code[pc], run.section) + ": ";
  }
  return fmt::format("core {} {}: {}{}", core.core_name(), where, insn, what);
}

// The message of the exception being handled.
std::string current_error() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown error";
  }
}

// Bytes a kept effect takes, roughly: the decoded instruction (~100-250 bytes, the vector
// unit's the largest) and its place in PreparedEffects. # estimate: for the memo's limit only.
constexpr uint64_t kPreparedEffectBytes = 320;

}  // namespace

uint64_t prepared_bytes_estimate(const RecordedLaunch& rec) {
  uint64_t effects = 0;
  for (const RecordedLaunch::CoreBlocks& cb : rec.cores) effects += cb.order.size();
  return effects * kPreparedEffectBytes;
}

uint64_t issued_bytes_estimate(const RecordedLaunch& rec) {
  return rec.effect_cores.size() * (sizeof(IssuedOp) + sizeof(PreparedEffects::Where));
}

uint64_t PreparedLaunch::bytes() const {
  uint64_t n = sizeof(*this);
  for (const PreparedEffects& e : cores) n += sizeof(e) + e.bytes;
  return n;
}

namespace {

// Runs the blocks core `cb` ran in the recorded launch on `fc`, in their order. Returns "" or
// the first fault, as replay_fault words it.
std::string run_core_blocks(FunctionalCore& fc, const RecordedLaunch& rec,
                            const RecordedLaunch::CoreBlocks& cb, const AiCore& core,
                            const isa::Program& program, const std::vector<uint64_t>& args,
                            int block_dim) {
  for (const RecordedLaunch::Block& b : cb.blocks) {
    const SectionRun& run = rec.runs[static_cast<size_t>(b.run)];
    try {
      fc.run_block(run, BlockIdentity{&args, b.block, block_dim, b.subblock, core.kind_index()});
    } catch (...) {
      return replay_fault(program, core, run, fc.fault_pc(), current_error());
    }
  }
  return {};
}

// replay_blocks of a launch with RecordedLaunch::effect_cores: each core's walk (on `pool`)
// keeps the effects it issues, in its own effect order; then this thread carries out every
// effect in the recorded order across the cores. Each pipe instruction's execute() and each
// scalar st of the simulated run happened at one simulated instant, in this order, so a core
// reads the bytes another core had written by then, as simulating it did.
// prepared (may be null): the effects an earlier replay of this key kept, decoded, per core in
// its own effect order: no core walks its blocks, and they run in the recorded order. keep (may
// be null, functional runs only): filled with this replay's effects, decoded as they run.
std::string replay_in_order(RecordedLaunch& rec, const isa::Program& program,
                            const std::vector<uint64_t>& args, int block_dim,
                            const std::vector<std::unique_ptr<AiCore>>& cores, DeviceMemory& gm,
                            const ChipConfig& cfg, bool functional, WorkerPool& pool,
                            const PreparedLaunch* prepared, PreparedLaunch* keep) {
  if (prepared && (!functional || prepared->cores.size() != rec.cores.size())) prepared = nullptr;
  if (keep && (!functional || prepared)) keep = nullptr;
  if (keep) {
    keep->cores.clear();
    keep->cores.resize(rec.cores.size());
    keep->complete = false;
  }
  std::vector<IssuedEffects> issued(prepared ? 0 : rec.cores.size());
  if (!prepared) {
    std::vector<std::string> faults(rec.cores.size());
    pool.run(rec.cores.size(), [&](size_t i) {
      const RecordedLaunch::CoreBlocks& cb = rec.cores[i];
      AiCore& core = *cores.at(static_cast<size_t>(cb.core));
      thread_local FunctionalCore::Queues queues;
      FunctionalCore fc(cfg, core.kind_config(), core.local(), gm, cb.order, functional,
                        FunctionalCore::Mode::issue, &queues);
      issued[i].ops.reserve(cb.order.size());
      issued[i].where.reserve(cb.order.size());
      fc.keep_issued(&issued[i]);
      faults[i] = run_core_blocks(fc, rec, cb, core, program, args, block_dim);
      if (!faults[i].empty()) return;
      if (!fc.finished())
        faults[i] = fmt::format("core {}: replay: the blocks ended before the recorded order",
                                core.core_name());
    });
    for (const std::string& f : faults)
      if (!f.empty()) return f;
  }
  // Per core: the number of effects it has to carry out (issued, or kept before).
  const auto effects_of = [&](size_t c) {
    return prepared ? prepared->cores[c].ops.size() : issued[c].ops.size();
  };
  std::vector<ExecContext> ctx;
  ctx.reserve(rec.cores.size());
  for (const RecordedLaunch::CoreBlocks& cb : rec.cores) {
    AiCore& core = *cores.at(static_cast<size_t>(cb.core));
    ctx.push_back(ExecContext{cfg, core.kind_config(), core.local(), gm});
  }
  std::vector<size_t> next(rec.cores.size(), 0);  // per core: its next effect
  std::string fault;
  for (uint16_t c : rec.effect_cores) {
    size_t& at = next[c];
    if (at >= effects_of(c)) {
      fault = fmt::format(
          "core {}: replay: the recorded order has more effects than the core "
          "issued",
          cores.at(static_cast<size_t>(rec.cores[c].core))->core_name());
      break;
    }
    try {
      if (prepared) {
        prepared->cores[c].ops[at]->run(ctx[c]);
      } else {
        const IssuedOp& op = issued[c].ops[at];
        if (!functional) {  // as FunctionalCore's timing-only execute mode
          if (op.op() == Opcode::op_st)
            gm.invalidate(static_cast<uint64_t>(op[1]), 8);
          else
            invalidate_gm_writes(plan(op, ctx[c]), gm);
        } else if (keep) {
          keep_effect(op, ctx[c], issued[c].where[at], &keep->cores[c]);
        } else if (op.op() == Opcode::op_st) {
          const int64_t v = op[0];
          gm.write(static_cast<uint64_t>(op[1]), &v, 8);
        } else {
          execute(op, ctx[c]);
        }
      }
    } catch (...) {
      const PreparedEffects::Where& w =
          prepared ? prepared->cores[c].where[at] : issued[c].where[at];
      fault = replay_fault(program, *cores.at(static_cast<size_t>(rec.cores[c].core)), *w.run, w.pc,
                           current_error());
      break;
    }
    ++at;
  }
  for (size_t i = 0; i < rec.cores.size() && fault.empty(); ++i)
    if (next[i] != effects_of(i))
      fault = fmt::format("core {}: replay: the core issued effects the recorded order lacks",
                          cores.at(static_cast<size_t>(rec.cores[i].core))->core_name());
  if (keep) {
    keep->complete = fault.empty();
    if (!keep->complete) keep->cores.clear();
  }
  // As replay_blocks: execute() notes buffer high-water marks, which the recorded counters
  // already hold.
  for (const RecordedLaunch::CoreBlocks& cb : rec.cores)
    cores.at(static_cast<size_t>(cb.core))->local().reset_high_water();
  return fault;
}

}  // namespace

std::string replay_blocks(RecordedLaunch& rec, const isa::Program& program,
                          const std::vector<uint64_t>& args, int block_dim,
                          const std::vector<std::unique_ptr<AiCore>>& cores, DeviceMemory& gm,
                          const ChipConfig& cfg, bool functional, WorkerPool& pool,
                          const PreparedLaunch* prepared, PreparedLaunch* keep) {
  for (size_t i = 0; i < rec.runs.size(); ++i)
    rec.runs[i].section = &program.sections.at(static_cast<size_t>(rec.run_section[i]));
  if (!rec.effect_cores.empty())
    return replay_in_order(rec, program, args, block_dim, cores, gm, cfg, functional, pool,
                           prepared, keep);
  if (prepared && (!functional || prepared->cores.size() != rec.cores.size())) prepared = nullptr;
  if (keep && (!functional || prepared)) keep = nullptr;
  if (keep) {
    keep->cores.clear();
    keep->cores.resize(rec.cores.size());
  }
  std::vector<std::string> faults(rec.cores.size());
  std::vector<char> kept(rec.cores.size(), 0);
  pool.run(rec.cores.size(), [&](size_t i) {
    const RecordedLaunch::CoreBlocks& cb = rec.cores[i];
    AiCore& core = *cores.at(static_cast<size_t>(cb.core));
    if (prepared) {  // the effects, decoded once, in their order: no program to walk
      const PreparedEffects& effects = prepared->cores[i];
      ExecContext ctx{cfg, core.kind_config(), core.local(), gm};
      size_t e = 0;
      try {
        for (; e < effects.ops.size(); ++e) effects.ops[e]->run(ctx);
      } catch (...) {
        faults[i] = replay_fault(program, core, *effects.where[e].run, effects.where[e].pc,
                                 current_error());
      }
      return;
    }
    // Each pool thread replays one core at a time: its queue storage serves them all.
    thread_local FunctionalCore::Queues queues;
    FunctionalCore fc(cfg, core.kind_config(), core.local(), gm, cb.order, functional,
                      FunctionalCore::Mode::execute, &queues);
    if (keep) fc.keep_effects(&keep->cores[i]);
    faults[i] = run_core_blocks(fc, rec, cb, core, program, args, block_dim);
    if (!faults[i].empty()) return;
    // execute() notes buffer high-water marks as plan() does; the recorded counters already
    // hold this launch's, so none may carry over into the core's next simulated launch.
    core.local().reset_high_water();
    if (!fc.finished())
      faults[i] = fmt::format("core {}: replay: the blocks ended before the recorded order",
                              core.core_name());
    kept[i] = fc.kept_all();
  });
  if (keep) {
    keep->complete = std::find(kept.begin(), kept.end(), 0) == kept.end();
    if (!keep->complete) keep->cores.clear();
  }
  for (const std::string& f : faults)
    if (!f.empty()) return f;
  return {};
}

bool verify_translation(RecordedLaunch& rec, const isa::Program& program,
                        const std::vector<uint64_t>& args, int block_dim,
                        const std::vector<std::unique_ptr<AiCore>>& cores, DeviceMemory& gm,
                        const ChipConfig& cfg, WorkerPool& pool, L2Tags& l2, L2Placement& placement,
                        std::vector<GmAccess>* writes, VerifiedEffects* effects,
                        uint64_t effects_max_bytes) {
  std::vector<SectionRun>& runs = rec.runs;
  for (size_t i = 0; i < runs.size(); ++i)
    runs[i].section = &program.sections.at(static_cast<size_t>(rec.run_section[i]));
  if (effects) {
    effects->valid = false;  // until this check passes
    uint64_t steps = 0;      // effects (and loads) of the recorded run
    for (const RecordedLaunch::CoreBlocks& cb : rec.cores) steps += cb.order.size();
    const uint64_t per_effect = sizeof(IssuedOp) + sizeof(PreparedEffects::Where);
    if (steps * per_effect <= effects_max_bytes) {
      effects->cores.resize(rec.cores.size());
      for (IssuedEffects& e : effects->cores) {
        e.ops.clear();
        e.where.clear();
      }
    } else {
      effects = nullptr;
    }
  }
  std::vector<std::unique_ptr<FunctionalCore>> verified(rec.cores.size());
  std::vector<char> ok(rec.cores.size(), 0);
  pool.run(rec.cores.size(), [&](size_t i) {
    const RecordedLaunch::CoreBlocks& cb = rec.cores[i];
    AiCore& core = *cores.at(static_cast<size_t>(cb.core));
    // As in replay_blocks, each pool thread lends its cores one queue storage (~90 KB a core
    // otherwise allocated and freed per check: a 48-core check took ~4 MB of heap). The queues
    // serve the walk only; `verified` keeps the cores for their ranges and fingerprints.
    thread_local FunctionalCore::Queues queues;
    auto fc = std::make_unique<FunctionalCore>(cfg, core.kind_config(), core.local(), gm, cb.order,
                                               true, FunctionalCore::Mode::verify, &queues);
    if (effects) {
      effects->cores[i].ops.reserve(cb.order.size());
      effects->cores[i].where.reserve(cb.order.size());
      fc->keep_issued(&effects->cores[i]);
    }
    bool ran = true;
    try {
      for (const RecordedLaunch::Block& b : cb.blocks)
        fc->run_block(runs[static_cast<size_t>(b.run)],
                      BlockIdentity{&args, b.block, block_dim, b.subblock, core.kind_index()});
    } catch (...) {
      ran = false;  // e.g. a range outside device memory: not the recorded timing
    }
    core.local().reset_high_water();  // plan() noted marks; the recorded counters hold them
    ok[i] = ran && fc->finished() && !loads_own_writes(*fc) && fc->fingerprint() == cb.fingerprint;
    verified[i] = std::move(fc);
  });
  if (std::find(ok.begin(), ok.end(), 0) != ok.end()) return false;
  // No core may touch bytes another core writes.
  CoreAccesses accesses;
  for (const auto& fc : verified)
    accesses.push_back({&fc->transfer_ranges(), &fc->stores(), &fc->loads()});
  if (cores_share_written_bytes(accesses)) return false;
  // The L2 outcome of every range, transfers in the recorded order: the order they reached the
  // memory system (MemorySystem::transfer_order), which is not the order they took effect in
  // when a core's pipes overlap (an MTE3 store still running while the next MTE2 load starts and
  // ends). A core's transfers in `verified` are in effect order, the same order within each pipe,
  // so its n-th lookup, on the pipe CoreBlocks::transfer_pipes names, is that pipe's next one.
  struct CoreTransfers {
    std::vector<size_t> first_range;  // per transfer, effect order: its first range
    std::array<std::vector<uint32_t>, isa::kNumExecPipes> by_pipe;  // transfers of each pipe
    std::array<size_t, isa::kNumExecPipes> next{};                  // of each pipe: next to look up
    size_t looked_up = 0;
  };
  std::vector<CoreTransfers> ct(rec.cores.size());
  for (size_t i = 0; i < rec.cores.size(); ++i) {
    const FunctionalCore& fc = *verified[i];
    if (fc.transfer_sizes().size() != rec.cores[i].transfer_pipes.size()) return false;
    size_t r = 0;
    for (size_t t = 0; t < fc.transfer_sizes().size(); ++t) {
      const uint8_t pipe = fc.transfer_pipes()[t];
      if (pipe >= isa::kNumExecPipes) return false;
      ct[i].first_range.push_back(r);
      ct[i].by_pipe[pipe].push_back(static_cast<uint32_t>(t));
      r += fc.transfer_sizes()[t];
    }
  }
  std::vector<int> slot(cores.size(), -1);  // chip index -> position in rec.cores
  for (size_t i = 0; i < rec.cores.size(); ++i)
    slot[static_cast<size_t>(rec.cores[i].core)] = int(i);
  uint64_t h = kL2FingerprintSeed;
  for (uint16_t port : rec.transfer_order) {
    const int i = port < slot.size() ? slot[port] : -1;
    if (i < 0) return false;
    const FunctionalCore& fc = *verified[static_cast<size_t>(i)];
    CoreTransfers& c = ct[static_cast<size_t>(i)];
    const std::vector<uint8_t>& pipes = rec.cores[static_cast<size_t>(i)].transfer_pipes;
    if (c.looked_up >= pipes.size()) return false;
    const uint8_t pipe = pipes[c.looked_up++];
    if (pipe >= isa::kNumExecPipes || c.next[pipe] >= c.by_pipe[pipe].size()) return false;
    const uint32_t t = c.by_pipe[pipe][c.next[pipe]++];
    for (size_t r = c.first_range[t], e = r + fc.transfer_sizes()[t]; r < e; ++r) {
      const GmAccess& a = fc.transfer_ranges()[r];
      h = l2_fingerprint(h, access_placed(l2, placement, a));
    }
  }
  for (const CoreTransfers& c : ct)
    if (c.looked_up != c.first_range.size()) return false;
  if (h != rec.l2_fingerprint) return false;
  if (writes) {
    writes->clear();
    for (const auto& fc : verified)
      for (const std::vector<GmAccess>* list : {&fc->transfer_ranges(), &fc->stores()})
        for (const GmAccess& a : *list)
          if (a.write) writes->push_back(a);
  }
  if (effects) effects->valid = true;
  return true;
}

std::string run_verified(const VerifiedEffects& effects, const RecordedLaunch& rec,
                         const isa::Program& program,
                         const std::vector<std::unique_ptr<AiCore>>& cores, DeviceMemory& gm,
                         const ChipConfig& cfg, WorkerPool& pool) {
  if (!effects.valid || effects.cores.size() != rec.cores.size())
    throw Error("run_verified: the effects are not those of this recording's cores");
  std::vector<std::string> faults(rec.cores.size());
  pool.run(rec.cores.size(), [&](size_t i) {
    AiCore& core = *cores.at(static_cast<size_t>(rec.cores[i].core));
    ExecContext ctx{cfg, core.kind_config(), core.local(), gm};
    const IssuedEffects& e = effects.cores[i];
    size_t at = 0;
    try {
      run_issued(e, ctx, &at);
    } catch (...) {
      faults[i] = replay_fault(program, core, *e.where[at].run, e.where[at].pc, current_error());
    }
    // As replay_blocks: execute() notes buffer high-water marks, which the recorded counters
    // already hold.
    core.local().reset_high_water();
  });
  for (const std::string& f : faults)
    if (!f.empty()) return f;
  return {};
}

uint64_t RecordedLaunch::bytes() const {
  uint64_t n = sizeof(*this) + counters.size() * sizeof(counters[0]) +
               delta.size() * sizeof(std::pair<const void*, uint64_t>) +
               transfer_order.size() * sizeof(transfer_order[0]);
  for (const SectionRun& r : runs)
    n += r.decoded.size() * (sizeof(DecodedInsn) + sizeof(std::string));
  n += effect_cores.size() * sizeof(effect_cores[0]);
  for (const CoreBlocks& c : cores)
    n += c.order.size() + c.transfer_pipes.size() + c.blocks.size() * sizeof(Block);
  if (translation)
    n += sizeof(*translation) + translation->args.size() * sizeof(uint64_t) +
         translation->writes.size() * sizeof(Translation::Write) +
         translation->extents.size() * sizeof(Translation::Extent) +
         translation->loads.size() * sizeof(Translation::Load) + translation->loaded.size() +
         translation->l2_lookups.size() * sizeof(Translation::L2Lookup) +
         translation->l2_block_mates.size() * sizeof(translation->l2_block_mates[0]);
  return n;
}

RecordedLaunch* LaunchMemo::find(const LaunchKey& key) {
  auto it = m_map.find(key);
  if (it == m_map.end()) return nullptr;
  m_lru.splice(m_lru.begin(), m_lru, it->second);
  return it->second->rec.get();
}

std::vector<std::shared_ptr<RecordedLaunch>> LaunchMemo::kept(const Index& index,
                                                              const LaunchKey& k) const {
  std::vector<std::shared_ptr<RecordedLaunch>> out;
  auto it = index.find(k);
  if (it == index.end()) return out;
  for (const LaunchKey& key : it->second) {
    auto e = m_map.find(key);
    if (e != m_map.end()) out.push_back(e->second->rec);
  }
  return out;
}

std::vector<std::shared_ptr<RecordedLaunch>> LaunchMemo::find_similar(const LaunchKey& similar) {
  return kept(m_similar, similar);
}

std::vector<std::shared_ptr<RecordedLaunch>> LaunchMemo::find_loose(const LaunchKey& loose) {
  return kept(m_loose, loose);
}

const PreparedLaunch* LaunchMemo::prepared(const LaunchKey& key) const {
  auto it = m_map.find(key);
  return it == m_map.end() ? nullptr : it->second->prepared.get();
}

void LaunchMemo::keep_prepared(const LaunchKey& key, std::unique_ptr<PreparedLaunch> p) {
  auto it = m_map.find(key);
  if (it == m_map.end() || !p) return;
  std::unique_ptr<PreparedLaunch>& slot = it->second->prepared;
  if (slot) m_bytes -= slot->bytes();
  slot = std::move(p);
  m_bytes += slot->bytes();
  m_lru.splice(m_lru.begin(), m_lru, it->second);
  make_room();
}

void LaunchMemo::drop(std::list<Entry>::iterator it) {
  if (it->rec.use_count() == 1) m_bytes -= it->rec->bytes();  // its last key
  if (it->prepared) m_bytes -= it->prepared->bytes();
  m_map.erase(it->key);
  m_lru.erase(it);
}

void LaunchMemo::make_room() {
  // Never evicting the most recently used key (just added or used).
  while ((m_map.size() > m_capacity || m_bytes > m_max_bytes) && m_lru.size() > 1)
    drop(std::prev(m_lru.end()));
}

void LaunchMemo::add(LaunchKey key, std::shared_ptr<RecordedLaunch> rec) {
  erase(key);
  const bool fresh = rec.use_count() == 1;
  if (fresh) m_bytes += rec->bytes();
  m_lru.push_front(Entry{key, std::move(rec), nullptr});
  m_map.emplace(std::move(key), m_lru.begin());
  make_room();
  prune(m_similar);
  prune(m_loose);
}

void LaunchMemo::prune(Index& index) {
  if (index.size() < 4 * m_capacity) return;
  // Drop the keys whose recording is gone.
  for (auto it = index.begin(); it != index.end();) {
    auto& keys = it->second;
    keys.erase(std::remove_if(keys.begin(), keys.end(),
                              [&](const LaunchKey& k) { return !m_map.count(k); }),
               keys.end());
    it = keys.empty() ? index.erase(it) : std::next(it);
  }
}

void LaunchMemo::index(Index& index, LaunchKey k, const LaunchKey& key, size_t limit) {
  std::vector<LaunchKey>& keys = index[std::move(k)];
  // A key recorded again (its recording replaced) moves to the front, once.
  keys.erase(std::remove(keys.begin(), keys.end(), key), keys.end());
  keys.insert(keys.begin(), key);
  if (keys.size() > limit) keys.pop_back();
}

void LaunchMemo::insert(LaunchKey key, LaunchKey similar, RecordedLaunch rec,
                        const LaunchKey* loose) {
  if (m_capacity == 0) return;
  index(m_similar, std::move(similar), key, kSimilar);
  if (loose) index(m_loose, *loose, key, kLoose);
  add(std::move(key), std::make_shared<RecordedLaunch>(std::move(rec)));
}

void LaunchMemo::alias(LaunchKey key, std::shared_ptr<RecordedLaunch> rec) {
  if (m_capacity == 0 || !rec) return;
  add(std::move(key), std::move(rec));
}

void LaunchMemo::erase(const LaunchKey& key) {
  auto it = m_map.find(key);
  if (it != m_map.end()) drop(it->second);
}

}  // namespace npusim
