// Replay of a concurrent launch group (Simulator::run_concurrent) that repeats: a TF graph's step
// under NPUSIM_GRAPH_CONCURRENT=1 submits the same group of launches every step. The group's
// timing is a function of what its key holds, by the argument of a single launch's replay
// (sim/replay/launch_replay.h):
//   - every member's program (its code, hashed), arguments, block count and, with a cold L2
//     filing its lines by block, the extent of each block its arguments point into
//     (append_block_extents, as a single launch's key); plan() reads no data, and a member's
//     program either has no ld or its loaded values provably reach data operands only (its
//     address flow is ok: sim/replay/address_flow.h), so no data reaches its control flow,
//     addresses or timing; cross-core flags order time only, deterministically;
//   - the group's structure: every member's `after` edges, named cores, whether it takes its
//     cores when ready, and the members' order (which serves waiting launches);
//   - the state the group starts from: a cold L2 (a kept L2, across launches or a graph run's,
//     is not keyed: such a group is simulated), cores reset, the chip otherwise idle (the
//     Simulator runs one thing at a time), the chip config and the simulator's options (one
//     per Simulator).
// So a group with the key of one simulated before gives the recorded results (each member's
// start, cycles and counters, the group's makespan and counters) without simulating.
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
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "sim/chip/l2_placement.h"
#include "sim/core/core_recorder.h"
#include "sim/counters/counters.h"
#include "sim/exec/exec.h"
#include "sim/simulator.h"

namespace npusim {

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

// The key of `launches` (a group that passed run_concurrent's checks) whose lines are filed by
// `blocks` (MemorySystem::select_l2's lookup for a cold L2; may be empty). Returns an empty string
// and sets *key if every member may be replayed, else why not (naming the member).
std::string group_key(const std::vector<ConcurrentLaunch>& launches, const GmBlockLookup& blocks,
                      ReplayStore& store, GroupKey* key);

// The GM ranges a timing-only group writes, gathered from every core's probe points while it is
// simulated (attached to each core with AiCore::attach_recorder; the simulation runs on one
// thread, so the cores share one collector).
class GroupWriteCollector final : public CoreRecorder {
 public:
  void on_scalar_pc(uint32_t) override {}
  void on_scalar_gm(uint32_t, const GmAccess& access) override {
    if (access.write) add(access.addr, access.bytes);
  }
  void on_pipe_op(isa::Pipe, uint32_t, const ExecCost& cost) override {
    for (const GmAccess& a : cost.gm)
      if (a.write) add(a.addr, a.bytes);
  }
  void on_gm_transfer(isa::Pipe) override {}
  // The ranges written, as normalized_writes() gives them.
  std::vector<GmAccess> take();

 private:
  void add(uint64_t addr, uint64_t bytes);
  std::vector<GmAccess> m_ranges;
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
  uint64_t bytes() const;              // host memory held, about
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
