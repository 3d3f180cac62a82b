#include "sim/replay/group_replay.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <utility>

#include <fmt/format.h>

#include "sim/core/ai_core.h"
#include "sim/memory/device_memory.h"
#include "sim/replay/chip_launcher.h"
#include "sim/replay/launch_replay.h"

namespace npusim {

namespace {

// A 64-bit mix (splitmix64's finaliser) folded into a running hash.
uint64_t mix(uint64_t h, uint64_t v) {
  v += 0x9e3779b97f4a7c15ull + h;
  v = (v ^ (v >> 30)) * 0xbf58476d1ce4e5b9ull;
  v = (v ^ (v >> 27)) * 0x94d049bb133111ebull;
  return v ^ (v >> 31);
}

// The recorder merges the ranges it gathered into their union (those of a page or more: drops
// those inside another) once it holds this many, so a long group holds bounded host memory
// (# estimate: 16 MiB of ranges, a bound on host memory only).
constexpr size_t kCompactRanges = size_t{1} << 20;

// Marks a translated key's first word (an exact key's is the member count).
constexpr uint64_t kTranslatedKey = uint64_t{1} << 63;

// The union of `ranges`, merged and sorted.
std::vector<GmAccess> union_of(std::vector<GmAccess> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const GmAccess& a, const GmAccess& b) { return a.addr < b.addr; });
  std::vector<GmAccess> out;
  for (const GmAccess& a : ranges) {
    if (!out.empty() && a.addr <= out.back().addr + out.back().bytes)
      out.back().bytes =
          std::max(out.back().addr + out.back().bytes, a.addr + a.bytes) - out.back().addr;
    else
      out.push_back({a.addr, a.bytes, true});
  }
  return out;
}

// `ranges` without those inside another (a range inside another covers no page whole that the
// other does not).
std::vector<GmAccess> outermost(std::vector<GmAccess> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const GmAccess& a, const GmAccess& b) {
    return a.addr != b.addr ? a.addr < b.addr : a.bytes > b.bytes;
  });
  std::vector<GmAccess> out;
  uint64_t reach = 0;  // the furthest end so far
  for (const GmAccess& a : ranges) {
    if (!out.empty() && a.addr + a.bytes <= reach) continue;
    out.push_back(a);
    reach = std::max(reach, a.addr + a.bytes);
  }
  return out;
}

// normalized_writes of ranges whose union is `spans` and whose ranges of a page or more are
// `long_writes` (the others cover no page whole): the spans go in as pieces shorter than a page.
std::vector<GmAccess> normalized_from(const std::vector<GmAccess>& spans,
                                      const std::vector<GmAccess>& long_writes) {
  constexpr uint64_t kPage = DeviceMemory::kPageBytes;
  std::vector<GmAccess> in = long_writes;
  for (const GmAccess& s : spans)
    for (uint64_t a = s.addr, end = s.addr + s.bytes; a < end;) {
      const uint64_t n = std::min(end - a, kPage - 1);
      in.push_back({a, n, true});
      a += n;
    }
  return normalized_writes(std::move(in));
}

}  // namespace

std::string group_key(const std::vector<ConcurrentLaunch>& launches, const GmBlockLookup& blocks,
                      ReplayStore& store, GroupKey* exact, GroupKey* translated,
                      GroupLayout* layout) {
  *layout = GroupLayout{};
  exact->words.clear();
  exact->cores.clear();
  translated->words.clear();
  translated->cores.clear();
  std::vector<uint64_t>& w = exact->words;
  std::vector<uint64_t>& t = translated->words;
  w.push_back(launches.size());
  t.push_back(kTranslatedKey | launches.size());
  bool translatable = bool(blocks);
  if (!translatable) layout->why_not = "no allocation blocks (a kept L2)";
  // (start, bytes) -> number: a planned buffer at its arena's start is a block of its own.
  std::map<std::pair<uint64_t, uint64_t>, int32_t> block_number;
  layout->arg_block.resize(launches.size());
  layout->flows.resize(launches.size(), nullptr);
  layout->steered.resize(launches.size(), false);
  for (size_t i = 0; i < launches.size(); ++i) {
    const ConcurrentLaunch& c = launches[i];
    const KernelLaunch& l = c.launch;
    LaunchKey member, similar;
    bool loads = false, cross_core = false;
    if (l.block_dim < 1) return fmt::format("launch {} ('{}') has no blocks", i, l.program->name);
    replay_key(*l.program, l.args, l.block_dim, &member, &similar, &loads, &cross_core);
    // A loaded value may reach control flow, an address or a loop count, unless the program's
    // address flow is followed (then loaded values reach data operands only), or the program
    // is steered by them and the group translatable ((3) in the header).
    const AddressFlow& flow = store.address_flow(member, *l.program);
    if (flow.ok || flow.steered) {
      layout->flows[i] = &flow;
    } else if (translatable) {
      translatable = false;
      layout->why_not = fmt::format("launch {} ('{}'): address flow not followed: {}", i,
                                    l.program->name, flow.why);
    }
    if (loads && !flow.ok) {
      if (!flow.steered || !translatable)
        return fmt::format(
            "launch {} ('{}') has ld whose values may steer it{}", i, l.program->name,
            flow.steered ? " and the group no translated key: " + layout->why_not : "");
      layout->steered[i] = true;
      layout->any_steered = true;
    }
    append_block_extents(blocks, l.args, &member.args);
    uint64_t& h = layout->launches_hash;
    for (uint64_t v :
         {member.program_hash[0], member.program_hash[1], static_cast<uint64_t>(l.block_dim),
          uint64_t{l.args.size()}, uint64_t{c.after.size()}})
      h = mix(h, v);
    for (size_t a : c.after) h = mix(h, a);
    h = mix(h, c.take_cores_when_ready ? 1 : 0);
    for (const std::string& core : c.cores)
      for (unsigned char ch : core) h = mix(h, ch);
    h = mix(h, c.cores.size());
    // The translated key's arguments: typed ones inside a block by their place in it (below),
    // any other by value.
    std::vector<int32_t>& arg_block = layout->arg_block[i];
    arg_block.assign(l.args.size(), -1);
    std::vector<uint64_t> places;
    for (size_t k = 0; k < l.args.size() && blocks; ++k) {
      uint64_t start = 0, bytes = 0;
      if (!blocks(l.args[k], &start, &bytes)) {
        similar.args[k] = l.args[k];
        continue;
      }
      auto [it, added] =
          block_number.try_emplace({start, bytes}, static_cast<int32_t>(block_number.size()));
      if (added) layout->blocks.push_back({start, bytes});
      arg_block[k] = it->second;
      places.insert(places.end(), {k, l.args[k] - start, bytes, static_cast<uint64_t>(it->second)});
    }
    for (std::vector<uint64_t>* words : {&w, &t}) {
      words->push_back(member.program_hash[0]);
      words->push_back(member.program_hash[1]);
      words->push_back(static_cast<uint64_t>(l.block_dim));
      words->push_back(l.args.size());
      const std::vector<uint64_t>& args = words == &w ? member.args : similar.args;
      words->push_back(args.size());
      words->insert(words->end(), args.begin(), args.end());
      if (words == &t) {
        words->push_back(places.size());
        words->insert(words->end(), places.begin(), places.end());
      }
      words->push_back(c.after.size());
      words->insert(words->end(), c.after.begin(), c.after.end());
      words->push_back(c.take_cores_when_ready ? 1 : 0);
      words->push_back(c.cores.size());
    }
    exact->cores.insert(exact->cores.end(), c.cores.begin(), c.cores.end());
  }
  // Which blocks may move: a block overlapping another block or a planned buffer is fixed,
  // keyed by address (append_fixed_blocks, the rule of a single launch's key too); the others
  // move freely (every range in one lies in it, and the lookup gives it there).
  layout->fixed = append_fixed_blocks(layout->blocks,
                                      launches.front().launch.planned_blocks /* select_l2's */, &t);
  const auto hash = [](GroupKey* key) {
    uint64_t h = 0;
    for (uint64_t v : key->words) h = mix(h, v);
    for (const std::string& s : key->cores)
      for (unsigned char ch : s) h = mix(h, ch);
    key->hash = h;
  };
  hash(exact);
  layout->translated = translatable;
  if (translatable) {
    translated->cores = exact->cores;
    hash(translated);
  } else {
    translated->words.clear();
    if (layout->any_steered)
      return "a launch has ld whose values may steer it and the group no translated key: " +
             layout->why_not;
  }
  return {};
}

GroupLayoutSketch layout_sketch(const std::vector<ConcurrentLaunch>& launches,
                                const GroupLayout& layout, const GroupKey& key) {
  GroupLayoutSketch out;
  out.key_hash = key.hash;
  for (size_t i = 0; i < launches.size() && i < layout.arg_block.size(); ++i) {
    const KernelLaunch& l = launches[i].launch;
    out.names.push_back(l.program->name);
    std::vector<GroupLayoutSketch::Arg>& args = out.args.emplace_back();
    for (size_t k = 0; k < l.args.size() && k < layout.arg_block[i].size(); ++k) {
      const int32_t b = layout.arg_block[i][k];
      if (b < 0) {
        args.push_back({-1, l.args[k], 0});
      } else {
        const GroupLayout::Block& blk = layout.blocks[static_cast<size_t>(b)];
        args.push_back({b, l.args[k] - blk.start, blk.bytes});
      }
    }
  }
  for (size_t b = 0; b < layout.blocks.size(); ++b)
    out.fixed.push_back(b < layout.fixed.size() && layout.fixed[b] ? layout.blocks[b]
                                                                   : GroupLayout::Block{});
  return out;
}

std::string layout_difference(const GroupLayoutSketch& recorded, const GroupLayoutSketch& now) {
  using Arg = GroupLayoutSketch::Arg;
  // The first argument, in member order, whose block is `b` (the one numbering it, as blocks
  // are numbered in order of first appearance).
  const auto first_in = [](const GroupLayoutSketch& s, int32_t b) {
    for (size_t i = 0; i < s.args.size(); ++i)
      for (size_t k = 0; k < s.args[i].size(); ++k)
        if (s.args[i][k].block == b) return std::pair<size_t, size_t>{i, k};
    return std::pair<size_t, size_t>{SIZE_MAX, SIZE_MAX};
  };
  std::string first;
  size_t differ = 0;
  const size_t members = std::min(recorded.args.size(), now.args.size());
  for (size_t i = 0; i < members; ++i) {
    const std::string who = fmt::format("launch {} ('{}')", i, now.names[i]);
    if (recorded.args[i].size() != now.args[i].size()) {
      ++differ;
      if (first.empty())
        first = fmt::format("{} has {} arguments, {} in the recording", who, now.args[i].size(),
                            recorded.args[i].size());
      continue;
    }
    for (size_t k = 0; k < now.args[i].size(); ++k) {
      const Arg &r = recorded.args[i][k], &n = now.args[i][k];
      std::string why;
      if ((r.block < 0) != (n.block < 0)) {
        why = n.block < 0 ? "lies in no allocation block here, in one in the recording"
                          : "lies in an allocation block here, in none in the recording";
      } else if (n.block < 0) {
        if (r.value != n.value)
          why = fmt::format("is {:#x} here, {:#x} in the recording", n.value, r.value);
      } else if (r.block_bytes != n.block_bytes) {
        why = fmt::format("lies in a block of {} bytes here, of {} in the recording", n.block_bytes,
                          r.block_bytes);
      } else if (r.value != n.value) {
        why = fmt::format("lies at offset {} of its block here, {} in the recording", n.value,
                          r.value);
      } else {
        // Blocks are numbered in order of first appearance: a number that differs, or that
        // differs in whether it is fixed, shows an argument sharing its block otherwise.
        const auto [ri, rk] = first_in(recorded, r.block);
        const auto [ni, nk] = first_in(now, n.block);
        const bool r_shares = ri != i || rk != k, n_shares = ni != i || nk != k;
        if (r_shares && n_shares && (ri != ni || rk != nk))
          why = fmt::format(
              "shares a block with launch {} argument {} here, with launch {} argument {} in "
              "the recording",
              ni, nk, ri, rk);
        else if (r_shares != n_shares)
          why = fmt::format("shares a block with launch {} argument {} {}", n_shares ? ni : ri,
                            n_shares ? nk : rk,
                            n_shares ? "here, not in the recording" : "in the recording, not here");
        else if (static_cast<size_t>(n.block) < now.fixed.size() &&
                 static_cast<size_t>(r.block) < recorded.fixed.size()) {
          const GroupLayout::Block &rf = recorded.fixed[static_cast<size_t>(r.block)],
                                   &nf = now.fixed[static_cast<size_t>(n.block)];
          if ((rf.bytes != 0) != (nf.bytes != 0))
            why = fmt::format(
                "lies in a block that overlaps another or a planned buffer {}",
                nf.bytes != 0 ? "here, not in the recording" : "in the recording, not here");
          else if (rf.start != nf.start)
            why = fmt::format("lies in a fixed block at {:#x} here, at {:#x} in the recording",
                              nf.start, rf.start);
        }
      }
      if (why.empty()) continue;
      ++differ;
      if (first.empty()) first = fmt::format("{} argument {} {}", who, k, why);
    }
  }
  if (recorded.args.size() != now.args.size())
    return fmt::format("{} launches here, {} in the recording", now.args.size(),
                       recorded.args.size());
  if (first.empty())
    return now.key_hash == recorded.key_hash
               ? "every argument lies as recorded: the recording was dropped from the memo"
               : "every argument lies as recorded, the planned buffers overlapping a fixed block "
                 "differ";
  return fmt::format("{} ({} argument{} differ{})", first, differ, differ == 1 ? "" : "s",
                     differ == 1 ? "s" : "");
}

uint64_t GroupTranslation::bytes() const {
  return sizeof(GroupTranslation) + block_starts.size() * 8 +
         (spans.size() + long_writes.size() + loads.size()) * sizeof(Range) +
         load_first.size() * 8 + loaded.size();
}

bool translated_group_writes(const GroupTranslation& t, const GroupLayout& now, uint64_t granule,
                             const DeviceMemory& gm, std::vector<GmAccess>* writes,
                             std::string* why) {
  if (t.block_starts.size() != now.blocks.size() || granule == 0) {
    if (why) *why = "another number of blocks";
    return false;
  }
  for (size_t b = 0; b < now.blocks.size(); ++b)
    if (b >= now.fixed.size() || (now.fixed[b] && now.blocks[b].start != t.block_starts[b])) {
      if (why) *why = fmt::format("block {} is fixed, and moved", b);  // not reached: keyed
      return false;
    } else if ((now.blocks[b].start - t.block_starts[b]) % granule != 0) {
      if (why)
        *why = fmt::format(
            "block {} moved by a multiple of {} bytes, not of the GM "
            "alignment",
            b, granule);
      return false;
    }
  std::vector<uint8_t> bytes;
  for (size_t i = 0; i < t.loads.size(); ++i) {
    const GroupTranslation::Range& r = t.loads[i];
    const uint64_t addr =
        r.block == GroupTranslation::kFixed ? r.offset : now.blocks[r.block].start + r.offset;
    bytes.resize(r.bytes);
    if (!gm.in_bounds(addr, r.bytes)) return false;
    gm.read(addr, bytes.data(), r.bytes);
    if (!std::equal(bytes.begin(), bytes.end(),
                    t.loaded.begin() + static_cast<ptrdiff_t>(t.load_first[i]))) {
      if (why)
        *why = fmt::format("a steering ld's bytes differ ({} at offset {} in block {})", r.bytes,
                           r.offset, r.block);
      return false;
    }
  }
  const auto moved = [&](const std::vector<GroupTranslation::Range>& ranges) {
    std::vector<GmAccess> out;
    out.reserve(ranges.size());
    for (const GroupTranslation::Range& r : ranges)
      out.push_back(
          {r.block == GroupTranslation::kFixed ? r.offset : now.blocks[r.block].start + r.offset,
           r.bytes, true});
    return out;
  };
  *writes = normalized_from(union_of(moved(t.spans)), moved(t.long_writes));
  return true;
}

// A core's probe: each access with the core that made it.
class GroupRecorder::Probe final : public CoreRecorder {
 public:
  Probe(GroupRecorder& g, const AiCore& core) : m_g(g), m_core(core) {}
  void on_scalar_pc(uint32_t) override {}
  void on_scalar_gm(uint32_t pc, const GmAccess& access) override {
    m_g.access(m_core, pc, access, true);
  }
  void on_pipe_op(isa::Pipe, uint32_t pc, const ExecCost& cost) override {
    for (const GmAccess& a : cost.gm) m_g.access(m_core, pc, a, false);
  }
  void on_gm_transfer(isa::Pipe) override {}

 private:
  GroupRecorder& m_g;
  const AiCore& m_core;
};

GroupRecorder::GroupRecorder(const std::vector<ConcurrentLaunch>& launches,
                             const GroupLayout& layout, const DeviceMemory& gm)
    : m_launches(launches), m_layout(layout), m_gm(gm) {
  for (size_t i = 0; i < launches.size(); ++i) m_member_of[&launches[i].launch.args] = i;
  if (!layout.translated) {
    m_untranslatable = "no translated key: " + layout.why_not;
    return;
  }
  for (size_t b = 0; b < layout.blocks.size(); ++b)
    if (layout.fixed[b]) m_fixed.push_back({layout.blocks[b].start, layout.blocks[b].bytes, true});
  m_fixed = union_of(std::move(m_fixed));
  // The blocks a steering member's ld may read: those of the arguments its lds derive from.
  for (size_t i = 0; i < launches.size(); ++i) {
    if (!layout.steered[i]) continue;
    const isa::Program& p = *launches[i].launch.program;
    for (size_t s = 0; s < p.sections.size() && s < layout.flows[i]->gm_arg.size(); ++s)
      for (size_t pc = 0; pc < p.sections[s].code.size(); ++pc) {
        if (p.sections[s].code[pc].op != isa::Opcode::op_ld) continue;
        const int k = pc < layout.flows[i]->gm_arg[s].size() ? layout.flows[i]->gm_arg[s][pc] : -1;
        const int b = k >= 0 && static_cast<size_t>(k) < layout.arg_block[i].size()
                          ? layout.arg_block[i][static_cast<size_t>(k)]
                          : -1;
        if (b < 0) continue;  // such an ld fails the range check when it runs
        const GroupLayout::Block& blk = layout.blocks[static_cast<size_t>(b)];
        m_watched.emplace_back(blk.start, blk.start + blk.bytes);
        if (layout.fixed[static_cast<size_t>(b)])  // its lds may read any fixed block
          for (const GmAccess& f : m_fixed) m_watched.emplace_back(f.addr, f.addr + f.bytes);
      }
  }
  std::sort(m_watched.begin(), m_watched.end());
  m_watched.erase(std::unique(m_watched.begin(), m_watched.end()), m_watched.end());
}

GroupRecorder::~GroupRecorder() = default;

CoreRecorder* GroupRecorder::probe(const AiCore& core) {
  m_probes.push_back(std::make_unique<Probe>(*this, core));
  return m_probes.back().get();
}

void GroupRecorder::fail(std::string why) {
  if (m_untranslatable.empty()) m_untranslatable = std::move(why);
}

void GroupRecorder::access(const AiCore& core, uint32_t pc, const GmAccess& a, bool scalar) {
  if (a.bytes == 0) return;
  if (m_untranslatable.empty()) {
    // (2): the range lies in the block of the argument it derives from.
    const SectionRun* run = core.current_run();
    const auto it = run && run->launch ? m_member_of.find(run->launch->args) : m_member_of.end();
    if (it == m_member_of.end()) {
      fail(fmt::format("core {}'s launch is not the group's", core.core_name()));
    } else {
      const size_t m = it->second;
      const isa::Program& p = *m_launches[m].launch.program;
      const size_t s = static_cast<size_t>(run->section - p.sections.data());
      const AddressFlow* flow = m_layout.flows[m];
      const int k =
          flow && s < flow->gm_arg.size() && pc < flow->gm_arg[s].size() ? flow->gm_arg[s][pc] : -1;
      const int b = k >= 0 && static_cast<size_t>(k) < m_layout.arg_block[m].size()
                        ? m_layout.arg_block[m][static_cast<size_t>(k)]
                        : -1;
      const GroupLayout::Block* blk = b >= 0 ? &m_layout.blocks[static_cast<size_t>(b)] : nullptr;
      // A fixed block's range (at its recorded address, the block keyed by address) may lie
      // anywhere in the fixed blocks: the key holds where they and the planned buffers in them
      // lie, so the lookup files it as then.
      const auto inside = [&](uint64_t start, uint64_t bytes) {
        return a.addr >= start && a.addr + a.bytes <= start + bytes && a.addr + a.bytes > a.addr;
      };
      bool in = blk && inside(blk->start, blk->bytes);
      if (blk && !in && m_layout.fixed[static_cast<size_t>(b)]) {
        auto f = std::upper_bound(m_fixed.begin(), m_fixed.end(), a.addr,
                                  [](uint64_t x, const GmAccess& r) { return x < r.addr; });
        in = f != m_fixed.begin() && inside(std::prev(f)->addr, std::prev(f)->bytes);
      }
      if (!in) {
        fail(
            fmt::format("launch {} ('{}') pc {}: a GM range outside the block of the argument "
                        "it derives from",
                        m, p.name, pc));
      } else if (scalar && !a.write && m_layout.steered[m]) {
        // (3): the bytes of this ld that no earlier effect wrote, with the value read.
        uint8_t value[8] = {};
        const uint64_t n = std::min<uint64_t>(a.bytes, sizeof(value));
        m_gm.read(a.addr, value, n);
        for (uint64_t i = 0; i < n; ++i) {
          const uint64_t addr = a.addr + i;
          auto w = m_written_watched.upper_bound(addr);
          const bool written = w != m_written_watched.begin() && std::prev(w)->second > addr;
          if (!written) m_loaded.emplace(addr, value[i]);
        }
      }
    }
  }
  if (!a.write) return;
  add_write(a.addr, a.bytes);
  if (m_watched.empty()) return;
  // A write into a block steering lds read: noted (merged) for the lds after it.
  const uint64_t end = a.addr + a.bytes;
  bool watched = false;
  for (const auto& [lo, hi] : m_watched) watched = watched || (a.addr < hi && lo < end);
  if (!watched) return;
  uint64_t lo = a.addr, hi = end;
  auto it = m_written_watched.upper_bound(lo);
  if (it != m_written_watched.begin() && std::prev(it)->second >= lo) --it;
  while (it != m_written_watched.end() && it->first <= hi) {
    lo = std::min(lo, it->first);
    hi = std::max(hi, it->second);
    it = m_written_watched.erase(it);
  }
  m_written_watched.emplace(lo, hi);
}

void GroupRecorder::add_write(uint64_t addr, uint64_t bytes) {
  if (bytes >= DeviceMemory::kPageBytes) {
    m_long.push_back({addr, bytes, true});
    if (m_long.size() >= kCompactRanges) m_long = outermost(std::move(m_long));
  }
  if (!m_ranges.empty()) {  // the same range as the last one (a store repeated): nothing new
    const GmAccess& last = m_ranges.back();
    if (last.addr == addr && last.bytes == bytes) return;
  }
  m_ranges.push_back({addr, bytes, true});
  if (m_ranges.size() >= kCompactRanges) m_ranges = union_of(std::move(m_ranges));
}

std::vector<GmAccess> GroupRecorder::writes() const {
  return normalized_from(union_of(m_ranges), outermost(m_long));
}

std::shared_ptr<const GroupTranslation> GroupRecorder::translation(std::string* why) const {
  if (!m_untranslatable.empty()) {
    *why = m_untranslatable;
    return nullptr;
  }
  auto t = std::make_shared<GroupTranslation>();
  for (const GroupLayout::Block& b : m_layout.blocks) t->block_starts.push_back(b.start);
  // The blocks that move by start (disjoint from every other block: group_key), and the fixed
  // ones' union, to place an address: in a moving block (relative to it) or a fixed one (its
  // address, GroupTranslation::kFixed).
  std::vector<std::pair<uint64_t, uint32_t>> moving;
  std::vector<GmAccess> fixed;
  for (size_t b = 0; b < m_layout.blocks.size(); ++b) {
    const GroupLayout::Block& blk = m_layout.blocks[b];
    if (m_layout.fixed[b])
      fixed.push_back({blk.start, blk.bytes, true});
    else
      moving.emplace_back(blk.start, static_cast<uint32_t>(b));
  }
  std::sort(moving.begin(), moving.end());
  fixed = union_of(std::move(fixed));
  // Where [addr, end) begins: the block (kFixed) and the end of the piece in it; false if
  // outside every block.
  const auto place = [&](uint64_t addr, uint64_t end, uint32_t* b, uint64_t* piece_end) {
    auto it = std::upper_bound(moving.begin(), moving.end(), std::make_pair(addr, UINT32_MAX));
    if (it != moving.begin()) {
      const GroupLayout::Block& blk = m_layout.blocks[std::prev(it)->second];
      if (addr - blk.start < blk.bytes) {
        *b = std::prev(it)->second;
        *piece_end = std::min(end, blk.start + blk.bytes);
        return true;
      }
    }
    auto f = std::upper_bound(fixed.begin(), fixed.end(), addr,
                              [](uint64_t a, const GmAccess& r) { return a < r.addr; });
    if (f == fixed.begin() || addr - std::prev(f)->addr >= std::prev(f)->bytes) return false;
    *b = GroupTranslation::kFixed;
    *piece_end = std::min(end, std::prev(f)->addr + std::prev(f)->bytes);
    return true;
  };
  const auto relative = [&](uint32_t b, uint64_t addr) {
    return b == GroupTranslation::kFixed ? addr : addr - m_layout.blocks[b].start;
  };
  // The union's spans split at block ends (every range lay in its block: each piece does).
  for (const GmAccess& s : union_of(m_ranges)) {
    for (uint64_t a = s.addr, end = s.addr + s.bytes; a < end;) {
      uint32_t b = 0;
      uint64_t piece_end = 0;
      if (!place(a, end, &b, &piece_end)) {
        *why = "a range written outside the group's blocks";
        return nullptr;
      }
      t->spans.push_back({b, relative(b, a), piece_end - a});
      a = piece_end;
    }
  }
  for (const GmAccess& l : outermost(m_long)) {
    uint32_t b = 0;
    uint64_t piece_end = 0;
    if (!place(l.addr, l.addr + l.bytes, &b, &piece_end) || piece_end != l.addr + l.bytes) {
      *why = "a range written outside the group's blocks";
      return nullptr;
    }
    t->long_writes.push_back({b, relative(b, l.addr), l.bytes});
  }
  // The loaded bytes in runs of consecutive addresses within a block.
  for (const auto& [addr, value] : m_loaded) {
    uint32_t b = 0;
    uint64_t piece_end = 0;
    if (!place(addr, addr + 1, &b, &piece_end)) {
      *why = "a steering ld read outside the group's blocks";
      return nullptr;
    }
    const uint64_t offset = relative(b, addr);
    if (!t->loads.empty() && t->loads.back().block == b &&
        t->loads.back().offset + t->loads.back().bytes == offset) {
      ++t->loads.back().bytes;
    } else {
      t->loads.push_back({b, offset, 1});
      t->load_first.push_back(t->loaded.size());
    }
    t->loaded.push_back(value);
  }
  return t;
}

std::vector<GmAccess> normalized_writes(std::vector<GmAccess> ranges) {
  constexpr uint64_t kPage = DeviceMemory::kPageBytes;
  // The pages some range covered whole (DeviceMemory::invalidate releases those that held data),
  // as page index intervals [first, end).
  std::vector<std::pair<uint64_t, uint64_t>> whole;
  for (const GmAccess& a : ranges) {
    const uint64_t first = (a.addr + kPage - 1) / kPage, end = (a.addr + a.bytes) / kPage;
    if (first < end) whole.emplace_back(first, end);
  }
  std::sort(whole.begin(), whole.end());
  std::vector<std::pair<uint64_t, uint64_t>> pages;  // merged
  for (const auto& p : whole) {
    if (!pages.empty() && p.first <= pages.back().second)
      pages.back().second = std::max(pages.back().second, p.second);
    else
      pages.push_back(p);
  }
  // The union of the ranges, merged.
  std::sort(ranges.begin(), ranges.end(),
            [](const GmAccess& a, const GmAccess& b) { return a.addr < b.addr; });
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [begin, end)
  for (const GmAccess& a : ranges) {
    const uint64_t end = a.addr + a.bytes;
    if (!spans.empty() && a.addr <= spans.back().second)
      spans.back().second = std::max(spans.back().second, end);
    else
      spans.emplace_back(a.addr, end);
  }
  // Each span: the wholly covered pages in one range each, the rest in pieces shorter than a
  // page (so none covers a page whole).
  std::vector<GmAccess> out;
  const auto partial = [&](uint64_t begin, uint64_t end) {
    for (uint64_t a = begin; a < end;) {
      const uint64_t n = std::min(end - a, kPage - 1);
      out.push_back({a, n, true});
      a += n;
    }
  };
  size_t p = 0;
  for (const auto& [begin, end] : spans) {
    uint64_t at = begin;
    while (p < pages.size() && pages[p].second * kPage <= begin) ++p;
    for (size_t q = p; q < pages.size() && pages[q].first * kPage < end; ++q) {
      const uint64_t wb = pages[q].first * kPage, we = pages[q].second * kPage;  // inside the span
      partial(at, wb);
      out.push_back({wb, we - wb, true});
      at = we;
    }
    partial(at, end);
  }
  return out;
}

uint64_t RecordedGroup::bytes() const {
  uint64_t b = sizeof(RecordedGroup) + writes.size() * sizeof(GmAccess) +
               counters.size() * sizeof(counters.front());
  b += members.size() * sizeof(Member);
  // The members' and the group's deltas: a (counter, value) pair each.
  for (const Member& m : members) b += m.counters.size() * 16;
  b += delta.size() * 16;
  if (translation) b += translation->bytes();
  return b;
}

const RecordedGroup* GroupMemo::find(const GroupKey& key) {
  auto it = m_map.find(key);
  if (it == m_map.end()) return nullptr;
  m_lru.splice(m_lru.begin(), m_lru, it->second);
  return it->second->second.get();
}

void GroupMemo::erase(const GroupKey& key) {
  auto it = m_map.find(key);
  if (it == m_map.end()) return;
  m_bytes -= it->second->second->bytes() + key.words.size() * 8;
  m_lru.erase(it->second);
  m_map.erase(it);
}

void GroupMemo::insert(GroupKey key, RecordedGroup group) {
  erase(key);
  const uint64_t bytes = group.bytes() + key.words.size() * 8;
  if (bytes > m_max_bytes || m_capacity == 0) return;  // would push every other group out
  while (!m_lru.empty() && (m_map.size() >= m_capacity || m_bytes + bytes > m_max_bytes))
    erase(m_lru.back().first);
  m_lru.emplace_front(std::move(key), std::make_unique<RecordedGroup>(std::move(group)));
  m_map.emplace(m_lru.front().first, m_lru.begin());
  m_bytes += bytes;
}

}  // namespace npusim
