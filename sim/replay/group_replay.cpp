#include "sim/replay/group_replay.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>

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

// The collector normalizes what it gathered once it holds this many ranges, so a long group
// holds bounded host memory (# estimate: 16 MiB of ranges, a bound on host memory only).
constexpr size_t kCompactRanges = size_t{1} << 20;

}  // namespace

std::string group_key(const std::vector<ConcurrentLaunch>& launches, const GmBlockLookup& blocks,
                      ReplayStore& store, GroupKey* key) {
  key->words.clear();
  key->cores.clear();
  key->words.push_back(launches.size());
  for (size_t i = 0; i < launches.size(); ++i) {
    const ConcurrentLaunch& c = launches[i];
    const KernelLaunch& l = c.launch;
    LaunchKey member, similar;
    bool loads = false, cross_core = false;
    if (l.block_dim < 1) return fmt::format("launch {} ('{}') has no blocks", i, l.program->name);
    replay_key(*l.program, l.args, l.block_dim, &member, &similar, &loads, &cross_core);
    // A loaded value may reach control flow, an address or a loop count, unless the program's
    // address flow is followed (then loaded values reach data operands only).
    if (loads && !store.address_flow(member, *l.program).ok)
      return fmt::format("launch {} ('{}') has ld whose values may steer it", i, l.program->name);
    append_block_extents(blocks, l.args, &member.args);
    std::vector<uint64_t>& w = key->words;
    w.push_back(member.program_hash[0]);
    w.push_back(member.program_hash[1]);
    w.push_back(static_cast<uint64_t>(l.block_dim));
    w.push_back(l.args.size());
    w.push_back(member.args.size());
    w.insert(w.end(), member.args.begin(), member.args.end());
    w.push_back(c.after.size());
    w.insert(w.end(), c.after.begin(), c.after.end());
    w.push_back(c.take_cores_when_ready ? 1 : 0);
    w.push_back(c.cores.size());
    key->cores.insert(key->cores.end(), c.cores.begin(), c.cores.end());
  }
  uint64_t h = 0;
  for (uint64_t v : key->words) h = mix(h, v);
  for (const std::string& s : key->cores)
    for (unsigned char ch : s) h = mix(h, ch);
  key->hash = h;
  return {};
}

void GroupWriteCollector::add(uint64_t addr, uint64_t bytes) {
  if (bytes == 0) return;
  if (!m_ranges.empty()) {  // the same range as the last one (a store repeated): nothing new
    const GmAccess& last = m_ranges.back();
    if (last.addr == addr && last.bytes == bytes) return;
  }
  m_ranges.push_back({addr, bytes, true});
  if (m_ranges.size() >= kCompactRanges) m_ranges = normalized_writes(std::move(m_ranges));
}

std::vector<GmAccess> GroupWriteCollector::take() {
  std::vector<GmAccess> out = normalized_writes(std::move(m_ranges));
  m_ranges.clear();
  return out;
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
