// Replay of a concurrent launch group (Simulator::run_concurrent) that repeats: a TF graph's step
// under NPUSIM_GRAPH_CONCURRENT=1 submits the same group of launches every step. The group's
// timing is a function of what its key holds, by the argument of a single launch's replay
// (sim/replay/launch_replay.h):
//   - every member's program (its code, hashed), arguments, block count and, with a cold L2
//     filing its lines by block, the extent of each block its arguments point into
//     (append_block_extents, as a single launch's key); plan() reads no data, and a member's
//     program either has no ld or its loaded values provably reach data operands only (its
//     address flow is ok: sim/replay/address_flow.h), so no data reaches its control flow,
//     addresses or timing (under the translated key below a member may also be steered by
//     them: (3)); cross-core flags order time only, deterministically;
//   - the group's structure: every member's `after` edges, named cores, whether it takes its
//     cores when ready, and the members' order (which serves waiting launches);
//   - the state the group starts from: a cold L2 (a kept L2, across launches or a graph run's,
//     is not keyed: such a group is simulated), cores reset, the chip otherwise idle (the
//     Simulator runs one thing at a time), the chip config and the simulator's options (one
//     per Simulator).
// So a group with the key of one simulated before gives the recorded results (each member's
// start, cycles and counters, the group's makespan and counters) without simulating.
//
// Translated form (the rule of a single launch's translated replay, launch_replay.h
// translated_writes, applied to the whole group). A TF step places some tensors at new
// addresses every step, so the group is keyed by where its arguments lie in their allocation
// blocks rather than by their addresses: every member's program, untyped arguments and block
// count, and for each argument inside a block its offset there, the block's size and which of
// the group's blocks it is (numbered in order of first appearance over the members' arguments,
// so arguments sharing a block share one again, across members too). A recording times the
// group at other addresses if
//   (1) every member's program moves with its tensors (its address flow ok, or steered, below:
//       sim/replay/address_flow.h), so each instruction's plan() is the recorded one but for its
//       GM ranges, which move with the argument they derive from;
//   (2) every GM range the recorded run touched (read or written, ld and st included) lay inside
//       the block of the argument it derives from (GroupRecorder checks it per instruction),
//       and each block moved by a multiple of the GM alignment: under the L2's filing by block
//       (a cold L2, sim/chip/l2_placement.h) every range then has its recorded L2 address, so
//       every lookup hits and misses as then and every member takes its recorded time;
//   (3) a member whose loaded values steer it (AddressFlow::steered, a timing-only simulator
//       only) loads its recorded values: in a timing-only run a byte an ld reads holds either
//       what it held at the group's start or, if an earlier effect of the group wrote it, zero
//       (a timing-only write, DeviceMemory::invalidate; st too). The recording keeps, per byte
//       that an ld read before any effect of the group wrote it, the value read; a group
//       replays only where those bytes, moved with their blocks, hold the same at its start.
//       By induction over the group's effects in simulated order (each the recorded one, moved,
//       while every earlier ld read its recorded value), every ld then reads its recorded value.
// A block that overlaps another of the group's blocks or a statically planned buffer (an
// arena and the buffers planned in it: the lookup files an address by the buffer where one
// holds it) is fixed (GroupLayout::fixed): the translated key holds its address and the planned
// buffers overlapping it, so its addresses file as then, and a range derived from its argument
// may lie anywhere in the fixed blocks.
// A group that fails (1) or (2) is recorded under its exact key (addresses and extents), as
// before; one with a steering member and no translation is not replayed.
//
// Only in a timing-only simulator (SimOptions::functional false), where the translated replay is
// on (SimOptions::replay on, or replay_translated: a lookup and no walk, as that replay; a
// timing-only TF run keeps the walking replay off): there a group's only effect
// on device memory is the undefined bytes its members write (DeviceMemory::invalidate), recorded
// while the group is simulated (GroupWriteCollector) and carried out again by the replay. A
// functional group is simulated every time (its members' effects would have to be carried out in
// an order its `after` edges allow: not done).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "sim/chip/l2_placement.h"
#include "sim/core/core_recorder.h"
#include "sim/counters/counters.h"
#include "sim/exec/exec.h"
#include "sim/replay/address_flow.h"
#include "sim/replay/launch_replay.h"
#include "sim/simulator.h"

namespace npusim {

class AiCore;
class DeviceMemory;
struct ReplayStore;  // sim/replay/chip_launcher.h

// What a group's timing depends on besides the chip and the options (see the file's comment).
struct GroupKey {
  std::vector<uint64_t> words;     // per member: code hashes, block_dim, arguments, extents, edges
  std::vector<std::string> cores;  // every member's named cores, in order (counted in `words`)
  uint64_t hash = 0;
  bool operator==(const GroupKey& o) const {
    return hash == o.hash && words == o.words && cores == o.cores;
  }
};
struct GroupKeyHash {
  size_t operator()(const GroupKey& k) const { return static_cast<size_t>(k.hash); }
};

// Where a group's arguments lie, for its translated key (see the file's comment).
struct GroupLayout {
  bool translated = false;  // the group has a translated key (group_key's `translated`)
  std::string why_not;      // if not, why (naming the member)
  using Block = GmBlock;
  std::vector<Block> blocks;  // the blocks its arguments point into, by number
  // [block]: it overlaps another block or a planned buffer (KernelLaunch::planned_blocks), so
  // the lookup may file its addresses by the other: keyed at its address, it does not move.
  std::vector<bool> fixed;
  // [member][argument]: the number of the block the argument points into, or -1.
  std::vector<std::vector<int32_t>> arg_block;
  // [member]: its program's address flow (ok or steered; null where neither).
  std::vector<const AddressFlow*> flows;
  std::vector<bool> steered;  // [member]: its loaded values steer it (AddressFlow::steered)
  bool any_steered = false;
  // The launches without their layout: every member's program, block count, argument count,
  // `after` edges, named cores and whether it takes its cores when ready, hashed
  // (GroupLayoutSketch's index: the same launches laid out otherwise).
  uint64_t launches_hash = 0;
};

// What a group's translated key holds of its arguments' layout, kept per launches_hash for the
// replay log: a translated lookup that misses names what differs from the last recording of the
// same launches (layout_difference).
struct GroupLayoutSketch {
  struct Arg {
    int32_t block = -1;  // the block's number (GroupLayout::blocks), or -1: none
    uint64_t value = 0;  // its offset in the block, or (no block) the argument itself
    uint64_t block_bytes = 0;
  };
  std::vector<std::string> names;         // [member]: its program's name
  std::vector<std::vector<Arg>> args;     // [member][argument]
  std::vector<GroupLayout::Block> fixed;  // [block]: its start and size if fixed, else {0, 0}
  uint64_t key_hash = 0;                  // the translated key's hash (GroupKey::hash)
};
// The sketch of a group with translated key `key` and `layout` (group_key's).
GroupLayoutSketch layout_sketch(const std::vector<ConcurrentLaunch>& launches,
                                const GroupLayout& layout, const GroupKey& key);
// How `now` differs from `recorded` (sketches of groups with the same launches_hash): how many
// arguments differ and the first of them in member order, e.g. "launch 2 ('vadd') argument 1
// shares a block with launch 2 argument 0 in the recording, not here (1 argument differs)";
// where every argument lies as recorded, whether the keys differ (in the planned buffers that
// overlap a fixed block) or not (the recording was dropped from the memo since).
std::string layout_difference(const GroupLayoutSketch& recorded, const GroupLayoutSketch& now);

// The keys of `launches` (a group that passed run_concurrent's checks) whose lines are filed by
// `blocks` (MemorySystem::select_l2's lookup for a cold L2; may be empty): *exact by addresses,
// *translated by blocks and offsets with *layout (translated->words empty and
// layout->translated false where some member's program does not move with its tensors, or
// without `blocks`). Returns an empty string if the group may be replayed, else why not (naming
// the member): a member with ld whose values may steer it and no translated key.
std::string group_key(const std::vector<ConcurrentLaunch>& launches, const GmBlockLookup& blocks,
                      ReplayStore& store, GroupKey* exact, GroupKey* translated,
                      GroupLayout* layout);

// What a translated replay of a group needs besides its timing: where it wrote and what its
// steering loads read, relative to the group's blocks (GroupLayout::blocks).
struct GroupTranslation {
  // A range in a fixed block (GroupLayout::fixed) by its address.
  static constexpr uint32_t kFixed = UINT32_MAX;
  struct Range {
    uint32_t block;          // the block's number, or kFixed
    uint64_t offset, bytes;  // [block start + offset, + bytes); kFixed: [offset, + bytes)
  };
  std::vector<uint64_t> block_starts;  // the recorded group's, by block number
  // The union of the ranges written, split at block ends; and the written ranges of a page or
  // more (the only ones that can cover a page whole, wherever the block lies), none inside
  // another: normalized_writes of both, moved, is that of the ranges one by one, moved.
  std::vector<Range> spans, long_writes;
  // The bytes a steering ld read before any effect of the group wrote them, merged into runs;
  // each run's bytes at `first` in `loaded`.
  std::vector<Range> loads;
  std::vector<size_t> load_first;
  std::vector<uint8_t> loaded;
  uint64_t bytes() const;
};

// Whether `t` times a group laid out as `now` (its translated key equal to the recording's):
// every block moved by a multiple of `granule` (the GM alignment) and the steering loads'
// bytes, moved, hold the recorded values in `gm`. On true, *writes holds the ranges the group
// writes there, normalized (normalized_writes). why (may be null): on false, which failed.
bool translated_group_writes(const GroupTranslation& t, const GroupLayout& now, uint64_t granule,
                             const DeviceMemory& gm, std::vector<GmAccess>* writes,
                             std::string* why = nullptr);

// What a timing-only group does while it is simulated, from every core's probe points (a probe
// per core, AiCore::attach_recorder; the simulation runs on one thread, in simulated order):
// the GM ranges it writes and, with a translated layout, whether its recording is translatable
// ((2) and (3) of the file's comment) and its GroupTranslation.
class GroupRecorder {
 public:
  // `launches` and `layout` (group_key's) and `gm` outlive the recorder.
  GroupRecorder(const std::vector<ConcurrentLaunch>& launches, const GroupLayout& layout,
                const DeviceMemory& gm);
  ~GroupRecorder();
  GroupRecorder(const GroupRecorder&) = delete;
  GroupRecorder& operator=(const GroupRecorder&) = delete;
  // The probe to attach to `core` (owned by the recorder).
  CoreRecorder* probe(const AiCore& core);
  // The ranges written, as normalized_writes() gives them.
  std::vector<GmAccess> writes() const;
  // The translation of the recorded run, or null with *why set (why it is not translatable).
  std::shared_ptr<const GroupTranslation> translation(std::string* why) const;

 private:
  class Probe;
  void access(const AiCore& core, uint32_t pc, const GmAccess& a, bool scalar);
  void add_write(uint64_t addr, uint64_t bytes);
  void fail(std::string why);
  const std::vector<ConcurrentLaunch>& m_launches;
  const GroupLayout& m_layout;
  const DeviceMemory& m_gm;
  std::vector<std::unique_ptr<Probe>> m_probes;
  std::unordered_map<const std::vector<uint64_t>*, size_t> m_member_of;  // by args
  std::vector<GmAccess> m_ranges;  // written, merged into their union past a bound
  std::vector<GmAccess> m_long;    // written, a page or more each
  std::string m_untranslatable;    // why not, once known ("" while translatable)
  std::vector<GmAccess> m_fixed;   // the fixed blocks' union (GroupLayout::fixed)
  // Steering loads: the blocks they may read ([start, end)), the bytes written there so far
  // (begin -> end, merged) and the bytes loaded before a write (address -> value).
  std::vector<std::pair<uint64_t, uint64_t>> m_watched;
  std::map<uint64_t, uint64_t> m_written_watched;
  std::map<uint64_t, uint8_t> m_loaded;
};

// Ranges whose invalidation, one after another in any order, leaves device memory as the
// invalidation of `ranges` in their order does (DeviceMemory::invalidate: the same bytes written
// undefined and write epochs stamped; a page holding data released exactly where one range
// covered the whole page): the union of `ranges`, sorted, each page that some range covered
// whole inside one range, every other piece shorter than a page. Idempotent: normalizing its own
// output (with more ranges) is exact as well.
std::vector<GmAccess> normalized_writes(std::vector<GmAccess> ranges);

// What replaying a group needs from its simulated run. Times relative to the group's start.
struct RecordedGroup {
  uint64_t quiescent_ps = 0;  // the group's start to the simulation going idle
  uint64_t makespan_ps = 0;   // the group's start to its last member's end
  struct Member {
    uint64_t start_offset_ps = 0;  // its start after the group's
    uint64_t duration_ps = 0;      // its start to its end
    CounterDelta counters;         // KernelResult::counter_delta as simulated
  };
  std::vector<Member> members;
  CounterRegistry::RawDelta counters;  // every counter's growth over the group
  CounterDelta delta;                  // the same as ConcurrentResult::counters reported them
  std::vector<GmAccess> writes;        // normalized_writes of what the members wrote
  // Set for a recording under a translated key (`writes` then empty: the replay moves these).
  std::shared_ptr<const GroupTranslation> translation;
  uint64_t bytes() const;  // host memory held, about
};

// Recorded groups by key, least recently used dropped first past `capacity` groups or about
// `max_bytes` of host memory.
class GroupMemo {
 public:
  GroupMemo(size_t capacity, uint64_t max_bytes) : m_capacity(capacity), m_max_bytes(max_bytes) {}
  const RecordedGroup* find(const GroupKey& key);  // marks it most recently used
  void insert(GroupKey key, RecordedGroup group);
  void erase(const GroupKey& key);
  size_t size() const { return m_map.size(); }

 private:
  using Entry = std::pair<GroupKey, std::unique_ptr<RecordedGroup>>;
  size_t m_capacity;
  uint64_t m_max_bytes;
  uint64_t m_bytes = 0;
  std::list<Entry> m_lru;  // most recently used first
  std::unordered_map<GroupKey, std::list<Entry>::iterator, GroupKeyHash> m_map;
};

}  // namespace npusim
