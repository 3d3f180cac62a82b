// Launch replay: a kernel launch identical to one already simulated (same program, arguments
// and block count, on the same chip) takes the same simulated time and moves every counter by
// the same amount, because
//   - timing depends only on operand values and the config, never on buffer contents
//     (sim/exec/exec.h: plan()), and a program that can be replayed has no instruction that
//     turns data into an operand value (ld) or waits on another core (cc_set / cc_wait; such
//     programs replay only by translation, Translation below, a functional replay carrying out
//     their effects in the recorded order across the cores, RecordedLaunch::effect_cores);
//   - every launch starts from the same state: L2 cold, cores reset, the chip otherwise idle
//     (one launch at a time).
// So the Simulator records the first run of such a launch (RecordedLaunch) and, when the same
// launch comes again, only carries out its functional effect: each core runs the blocks it ran
// then, in the same order, without time, its instructions taking effect in the order they did
// then (sim/replay/functional_core.h), several cores at once on host threads; then simulated
// time advances and the counters move by the recorded amounts.
// Results, cycles and counters are those of a simulated run; SimOptions::replay = check
// verifies exactly that on every replayed launch. Launches with an observer attached (trace,
// profiler) are always simulated.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "isa/isa.h"
#include "sim/chip/l2_placement.h"
#include "sim/core/core_env.h"
#include "sim/counters/counters.h"
#include "sim/memory/device_memory.h"
#include "sim/replay/address_flow.h"
#include "sim/replay/fingerprint.h"
#include "sim/replay/functional_core.h"

namespace npusim {

class AiCore;
class Chip;
class L2Tags;
class MemorySystem;
class WorkerPool;

struct LaunchKey {
  uint64_t program_hash[2] = {0, 0};  // two independent hashes of every section's code
  std::vector<uint64_t> args;
  int block_dim = 0;
  bool operator==(const LaunchKey& o) const {
    return program_hash[0] == o.program_hash[0] && program_hash[1] == o.program_hash[1] &&
           block_dim == o.block_dim && args == o.args;
  }
};
struct LaunchKeyHash {
  size_t operator()(const LaunchKey& k) const;
};

// The key of a launch. `similar` gets the key with every tensor address (a typed argument,
// isa::ArgInfo) left out: the launches a recording may time after a check of their addresses
// (verify_translation). `loads` (may be null): whether the program has an ld, so that data can
// reach its control flow or operands: a recording then times a launch only after
// verify_translation with the launch's data, even under the same key. `cross_core` (may be
// null): whether the program has cc_set or cc_wait, whose timing depends on other cores'
// progress; such a program replays only by translation, and a functional replay then carries
// out its effects in the recorded order across the cores, not the cores apart
// (RecordedLaunch::effect_cores). With `cross_core` null such a program has no key (false).
bool replay_key(const isa::Program& program, const std::vector<uint64_t>& args, int block_dim,
                LaunchKey* key, LaunchKey* similar, bool* loads = nullptr,
                bool* cross_core = nullptr);

// An allocation block a translated key refers to: a block of the runtime's allocator or a
// buffer a static memory plan placed in one (KernelLaunch::planned_blocks), as the cold L2's
// lookup gives it for an argument (MemorySystem::select_l2).
struct GmBlock {
  uint64_t start = 0, bytes = 0;
};

// Fixed blocks: the one rule by which a translated key (a single launch's, ChipLauncher; a
// concurrent group's, group_key in sim/replay/group_replay.h) holds blocks that may not move.
// The cold L2 files an address by the block the lookup gives for it, except where an address
// lies in a block placed before in the launch (L2Placement::l2_address): where two blocks
// overlap (an arena an argument points into and a planned buffer in it that another argument,
// or none, points into), which of the two files an address depends on which the launch
// touched first, and on where the one lies in the other. Keyed by blocks and offsets alone, a
// launch whose planned buffer lies elsewhere in the same arena looks alike, yet its lines are
// filed elsewhere. So each of `blocks` (those the arguments point into, each once) that
// overlaps another of them or a planned buffer, other than itself, is fixed: appends to *key,
// per block, its start if fixed (~0 otherwise) and its bytes, then every planned buffer
// overlapping a fixed block. With their addresses keyed, the fixed blocks and the buffers in
// them lie as recorded, the launch touches them in the recorded order (by induction over its
// lookups), and every address files as then. The others overlap nothing the lookup gives, so
// any of their addresses files by them wherever they lie. Returns, per block, whether fixed.
std::vector<bool> append_fixed_blocks(const std::vector<GmBlock>& blocks,
                                      const PlannedBlocks& planned, std::vector<uint64_t>* key);

// What replaying a launch needs from its simulated run.
struct RecordedLaunch {
  uint64_t duration_ps = 0;   // launch start to its end (KernelResult::cycles before rounding)
  uint64_t quiescent_ps = 0;  // launch start to the simulation going idle (next launch's start)
  CounterRegistry::RawDelta counters;
  // The registry `counters` indexes: the recording chip's (a chip of the same simulation
  // replaying it translates them into its own, CounterRegistry::translate).
  const CounterRegistry* registry = nullptr;
  // The same counters as reported (CounterRegistry::delta_of(counters)), built once: every
  // replay's KernelResult::counter_delta shares it.
  CounterDelta delta;
  // The decoded sections the blocks ran, with their index in Program::sections (the `section`
  // pointer is set to the replayed launch's program before use).
  std::vector<SectionRun> runs;
  std::vector<int> run_section;
  struct Block {
    int run, block, subblock;  // run: index into runs
  };
  struct CoreBlocks {
    int core;                             // chip index
    std::vector<Block> blocks;            // in the order the core ran them
    std::vector<uint8_t> order;           // CoreRecording::exec_order of the recorded run
    CoreFingerprint fingerprint;          // CoreRecording::fingerprint of the recorded run
    std::vector<uint8_t> transfer_pipes;  // CoreRecording::transfer_pipes of the recorded run
  };
  std::vector<CoreBlocks> cores;
  // A launch whose cores hand each other data through GM (cross-core flags: a mix kernel's cube
  // core storing tiles its vector cores then reduce): the core of each effect (an index into
  // `cores`), in the order the effects took place across the cores in the simulated run
  // (Chip::effect_order). replay_blocks then carries the effects out one at a time in this
  // order, not the cores apart, so every core reads what the others had written by then.
  // Empty: no core touched bytes another wrote, and the cores replay apart.
  std::vector<uint16_t> effect_cores;
  // MemorySystem::transfer_order and l2_fingerprint of the recorded run.
  std::vector<uint16_t> transfer_order;
  uint64_t l2_fingerprint = 0;
  // Set if a timing-only simulator may carry out this launch at other tensor addresses by
  // translation alone (record_translation): the GM ranges it writes, relative to its arguments.
  struct Translation {
    std::vector<uint64_t> args;  // the recorded launch's
    struct Write {
      uint32_t arg;  // index into args
      // The range [args[arg] + offset, + bytes) (offset mod 2^64: a range may lie below its
      // argument, in the argument's block).
      uint64_t offset, bytes;
    };
    std::vector<Write> writes;  // every range the launch wrote, merged (their union)
    // A program whose loaded values steer it (AddressFlow::steered): every range its loads
    // read, merged, relative to its argument as `writes`, and the bytes read there (at `first`
    // in `loaded`). A launch replays from this recording only if the same bytes lie there
    // again (loads_as_recorded). Empty for a program whose loads reach data operands only.
    struct Load {
      uint32_t arg;
      uint64_t offset, bytes;
      size_t first;
    };
    std::vector<Load> loads;
    std::vector<uint8_t> loaded;
    // For a replay at other offsets in the arguments' blocks (relocated_writes): per argument,
    // where it lay and the span of the GM ranges that derive from it.
    struct Extent {
      bool touched = false;      // some GM range derives from it (it then lies in a block)
      uint64_t block_start = 0;  // its block's first device address
      uint64_t offset = 0;       // args[k] - block_start
      uint64_t lo = 0, hi = 0;   // the span [lo, hi) of its ranges, as offsets in its block
      // The L2 address the L2's filing by block gave its block (sim/chip/l2_placement.h),
      // relative to L2Placement::kPackedBase (valid when Translation::l2_placed).
      uint64_t l2_base = 0;
    };
    std::vector<Extent> extents;  // [argument]
    // Whether no set of the L2 can receive more distinct lines than it has ways, wherever each
    // argument's span lies (sum over the touched arguments of ceil(lines of its span / sets)
    // at most the ways): then the launch evicts no line, at any line-aligned placement.
    bool fits_any_placement = false;
    // Whether the touched blocks, filed back to back on lines of their own
    // (sim/chip/l2_placement.h), take at most sets x ways lines: then each set receives at most
    // `ways` of them and the launch evicts no line under that filing, whatever its spans. A
    // launch of many small tensors (a multi-tensor optimizer update) fits so, not at any
    // placement (its bound above counts a way per tensor).
    bool fits_packed = false;
    // fits_any_placement or fits_packed: relocated_writes may time this launch elsewhere (a
    // relocation onto blocks of other sizes then checks fits_packed for those too).
    bool fits_l2 = false;
    // Whether every touched argument's block was filed by block and its L2 address is in
    // extents (l2_base): then relocated_writes may also time a launch that may evict, where
    // every set's lines move to one other set together (see there).
    bool l2_placed = false;
    // fits_l2 or l2_placed: the recording may time a launch at another block layout.
    bool relocatable() const { return fits_l2 || l2_placed; }
    // The sum of the first bound and the L2's ways (fits_any_placement: ways_needed <= ways),
    // for the replay log.
    uint32_t ways_needed = 0, ways = 0;
    uint32_t line_bytes = 0;  // the L2 line the spans were counted in
    uint64_t sets = 0;        // the L2's sets (set: L2Tags::set_in)
    // Whether the L2 rotates its pages (memory.l2.page_rotation: pages counted from each
    // block's first filed line, L2Tags::set_in).
    bool page_rotation = false;
    // A graph run's launch (memory.l2.keep_within_graph_run), whose L2 outcome depends on the
    // run's earlier launches: every GM range the memory system looked up in the L2
    // (MemorySystem::l2_trace), in the recorded run's lookup order, relative to the argument
    // it derives from (the one touched argument whose span holds it), and the hash of their
    // outcomes (l2_fingerprint). Set only when every range lies in a touched argument's span
    // (l2_traced); a run's launch is replayed by translation only from such a recording and
    // only after run_l2_lookups_match.
    struct L2Lookup {
      uint32_t arg;  // index into args
      isa::L2Hint l2;
      bool write;
      uint64_t offset, bytes;  // [args[arg] + offset, + bytes), offset mod 2^64 as Write's
    };
    std::vector<L2Lookup> l2_lookups;
    // (argument, argument a lookup is kept relative to) for each argument whose span also
    // holds that lookup (overlapping spans in one block): which of the two the lookup derives
    // from is not known, so a replay must move both by the same displacement.
    std::vector<std::pair<uint32_t, uint32_t>> l2_block_mates;
    bool l2_traced = false;
    uint64_t l2_trace_fingerprint = 0;
    // GM ranges that leave the block of the argument they derive from (a tail load of one
    // instruction's span reading a few bytes past a buffer a graph's memory plan placed in its
    // arena: the bytes past it are the next planned buffer's, or the arena's where that buffer
    // does not start on an L2 line). Such an argument is pinned: a launch replays from this
    // recording only with it at its recorded address (outside_blocks_alike), so each range
    // outside lies where it lay. Each range is kept as the pieces the L2's filing by block
    // splits it into (L2Placement::l2_address: a piece in a block runs to the block's end; an
    // address in no block files the rest at itself), with the block each lay in, the touched
    // arguments whose block that was, and those whose block overlapped it (a planned buffer in
    // the arena the piece lies in: which of the two files an address depends on which the
    // launch touched first), which are pinned too, with their blocks. As for fixed blocks
    // (append_fixed_blocks), every block a range outside touches, and every block overlapping
    // it, then lies as recorded, so the cold L2 places the same blocks in the same first-touch
    // order (the lookups come in the recorded order, by induction over the run) and every
    // lookup hits and misses as recorded. A recording with such ranges is not relocatable and
    // keeps no L2 lookups (relocated_writes, run_l2_lookups_match refuse it).
    // Pinning and fixed blocks are two rules, not one, because they hold different things in
    // place: fixed blocks follow from the layout before the launch runs (arguments' blocks that
    // overlap another or a planned buffer), so the key holds them and a lookup decides; a pinned
    // argument follows from the run (a range that left its block), and the blocks its pieces
    // lie in are no argument's, unknown to the key, so they are compared with the recording
    // when it is found (outside_blocks_alike). A single launch's key has both; a concurrent
    // group's has fixed blocks only, and a member's range outside its block and outside every
    // fixed block leaves the group untranslatable (GroupRecorder).
    struct Outside {
      uint64_t addr = 0, bytes = 0;  // device addresses (its argument is pinned)
      bool in_block = false;         // filed by a block (else at itself)
      uint64_t block_start = 0, block_bytes = 0;
      std::vector<uint32_t> same_block;  // touched arguments in that block, ascending
      struct Overlap {
        uint32_t arg;           // a touched argument whose block overlaps the piece's, not being it
        uint64_t start, bytes;  // that block
      };
      std::vector<Overlap> overlapping;  // ascending by argument
    };
    std::vector<Outside> outside;
    // Arguments some range of `outside` derives from, or whose block overlaps a piece's block
    // (Outside::overlapping), ascending.
    std::vector<uint32_t> pinned;
  };
  std::shared_ptr<const Translation> translation;
  // Host memory the recording holds, roughly (for LaunchMemo's limit).
  uint64_t bytes() const;
};

// A replayed launch's effects kept for the next replay of the same launch (the same key:
// program, arguments, block count): each core's effects in the order they took effect, decoded
// once (PreparedEffects, sim/replay/functional_core.h), in the order of RecordedLaunch::cores.
// Running them does what walking the blocks again would: the walk of a program without ld is a
// function of the key alone, and so is every effect it issues. An inference loop replays each
// launch of its step so, after the first replay.
struct PreparedLaunch {
  std::vector<PreparedEffects> cores;
  bool complete = false;  // every core's effects were kept (none loads)
  uint64_t bytes() const;
};
// The host memory a PreparedLaunch of `rec` would take, roughly (from the number of effects).
uint64_t prepared_bytes_estimate(const RecordedLaunch& rec);
// The host memory a functional replay of `rec` in the recorded order across the cores holds
// while it runs (replay_blocks: every effect its cores' walks issue, until carried out); 0
// without RecordedLaunch::effect_cores.
uint64_t issued_bytes_estimate(const RecordedLaunch& rec);

// The blocks each core of `chip` ran in the launch now ending, recorded (Chip::recordings) and
// about to end (call before Chip::end_launch), with the memory system's record. False if the
// launch cannot be replayed core by core: one core wrote GM bytes another core read or wrote,
// so the result depends on the order of the cores (in a simulated run, on their timing). A lean
// recording (CoreRecording, translation only) is never refused so: its replay runs nothing; nor
// is one made with the effects' order across the cores (Chip::effect_order), which its replay
// follows (RecordedLaunch::effect_cores).
bool record_blocks(const isa::Program& program, const Chip& chip, RecordedLaunch* rec);

// Timing-only replay by translation. A launch of the same program with the same untyped
// arguments and block count (LaunchKey's `similar`) at other tensor addresses takes the recorded
// launch's cycles and counters, and writes its ranges moved with their arguments, if
//   (1) the program moves with its tensors (analyze_address_flow: its control flow and every
//       operand but the transfers' GM addresses are the same, and each GM address moves by the
//       displacement of the one argument it derives from), so every instruction's plan() is the
//       same but for its GM ranges, which move with their argument (plan() reads a GM address
//       only to form its ranges and to check it against the GM alignment, which a displacement
//       by a multiple of that alignment keeps);
//   (2) every GM range of the recorded run lies inside the allocation block of its argument
//       (checked here), and each argument lies in a block of the same size at the same offset as
//       then, arguments sharing a block then sharing one now (the launch's key holds both), so
//       under the L2's filing by block (sim/chip/l2_placement.h, a cold L2) every range has the
//       same L2 address as then: the same hits and misses in the same order, the same timing;
//   (3) no core touches bytes another writes, as then (the blocks keep their relative layout).
// Nothing of the launch is walked: its check is a key lookup and one subtraction per argument.
// Fills rec->translation when `flow` is ok and (2) holds for the launch `chip` just recorded
// (call before Chip::end_launch); gm_blocks is the launch's (KernelLaunch::gm_blocks).
// A program whose loaded values steer it (AddressFlow::steered; timing-only simulators only, the
// caller's part) is translatable too when no range its loads read is written by the launch:
// the bytes its loads read, which are then those in `gm` at the launch's end, are kept
// (Translation::loads), and (1) holds for a launch that loads the same bytes
// (loads_as_recorded).
// l2_trace (a graph run's launch, recorded with Chip::begin_launch's record_l2_trace): the
// memory system's lookups, kept relative to the arguments (Translation::l2_lookups).
void record_translation(const isa::Program& program, const AddressFlow& flow, const Chip& chip,
                        const std::vector<uint64_t>& args, const GmBlockLookup& gm_blocks,
                        const DeviceMemory& gm, RecordedLaunch* rec,
                        const std::vector<GmAccess>* l2_trace = nullptr);
// Translated replay inside a graph run. A run's launch starts with the L2 and the block
// placement its run's earlier launches left (MemorySystem::select_l2), so the cold translation's
// argument ("every range has the L2 address it had then") does not make its timing the
// recorded one. What does: the program moves with its tensors (translated_writes' conditions,
// checked by the caller), so the cores issue the recorded transfers, moved with their
// arguments, as long as the memory system times each as it did then, and it sees a transfer
// only through its L2 outcome. By induction over the lookups in the recorded order (the
// induction of point 6 in docs/chip_model.md "Timing-only replay by translation"): if the first
// i outcomes are the recorded ones, the simulated launch reaches the (i+1)-th recorded lookup
// next, moved, on the L2 those i lookups left. So this repeats the recorded lookups
// (Translation::l2_lookups, moved to `args`) with access_placed on `l2` and `placement` (copies
// of the run's, as this launch starts with them; new blocks are placed at their first touch,
// in lookup order, as simulating would) and returns true if the hash of the outcomes equals
// the recorded one: the launch then takes the recorded cycles and counters, and `l2` and
// `placement` are what simulating it would have left (the caller installs them). False for a
// recording with no lookups kept (!l2_traced). Costs one L2 lookup per line touched.
bool run_l2_lookups_match(const RecordedLaunch& rec, const std::vector<uint64_t>& args, L2Tags& l2,
                          L2Placement& placement);
// Whether a launch of `rec`'s program at `args` loads what the recorded one loaded: for a
// program whose loaded values steer it, the bytes at each recorded load range, moved with its
// argument, are the recorded ones in `gm` as the launch begins, and no moved write range
// overlaps a moved load range (the recorded launch wrote none of them: record_translation). Then,
// by induction over each core's run, every ld reads the recorded value, and the launch is the
// recorded one moved with its tensors (address_flow.h). True for a recording without loads kept.
// why (may be null): on false, where the bytes differ (the replay log's reason).
bool loads_as_recorded(const RecordedLaunch& rec, const std::vector<uint64_t>& args,
                       const DeviceMemory& gm, std::string* why = nullptr);
// Whether a cold launch at `args`, its lines filed by `blocks`, files the ranges `rec`'s
// recording touched outside their arguments' blocks as then (Translation::outside): every pinned
// argument at its recorded address, each piece in the block it lay in (or in none, as then),
// and each touched argument's block the same as a piece's block exactly where it was then,
// overlapping it exactly where it did (the same block), and otherwise disjoint from it. Together
// with translated_writes' conditions and the launch's key (its arguments' block extents and
// sharing), every range then has the L2 address it had. True for a recording without such ranges.
// why (may be null): on false, what differs.
bool outside_blocks_alike(const RecordedLaunch& rec, const std::vector<uint64_t>& args,
                          const GmBlockLookup& blocks, std::string* why = nullptr);
// The ranges a launch with arguments `args` writes when `rec` times it by translation (in
// *writes), or false if a displacement is not a multiple of `granule` bytes (the GM alignment).
bool translated_writes(const RecordedLaunch& rec, const std::vector<uint64_t>& args,
                       uint64_t granule, std::vector<GmAccess>* writes);
// Relocation (SimOptions::replay_relocate): whether `rec` (timed by translation at other offsets
// in its arguments' blocks, or in blocks of other sizes) times this launch exactly. The L2's
// outcome for a launch that evicts no line depends only on which of its accesses share a line
// (a lookup hits iff an earlier one filled its line and no bypassing write dropped it), and on
// how each range splits into lines. So it holds if
//   (1) the recorded launch evicts no line at any placement (Translation::fits_any_placement),
//       and so does this one (its spans are the same sizes, at the same offsets modulo a line);
//       or, under the L2's filing by block, both launches' touched blocks put at most `ways`
//       lines in any set (Translation::fits_packed, checked for this launch's blocks here;
//       with the L2's page rotation one more line a set for each block's partial last page);
//   (2) each touched argument lies at the same offset modulo the L2 line in its block as then,
//       and its moved span lies inside its block (under the L2's filing by block,
//       sim/chip/l2_placement.h, every range then moves by whole lines, as one piece);
//   (3) two touched arguments whose spans share a line, then or now, lie in one block, then and
//       now, at the same distance from each other: every other pair touches disjoint lines
//       (blocks are filed on lines of their own), so the same accesses share lines and bytes
//       as then, and no core touches bytes another writes, as then.
// Together with translated_writes' conditions (the program moves with its tensors, every
// displacement a multiple of the GM alignment), every lookup then hits and misses as recorded,
// so every transfer, and the launch, takes the recorded time.
// A launch that may evict (it fails (1)) is timed so too if, besides (2) and (3),
//   (1') the L2 sees the recorded lookups with its sets renamed: touched arguments that shared
//       a block then share one now (each block now a union of recorded blocks, so the blocks
//       are filed in the order of the earliest filed recorded block each holds, the order the
//       lookups first reach them, Translation::l2_placed giving where the recorded ones were
//       filed), and any two touched arguments whose spans' lines fall in a common set, then
//       or now, move by the same number of sets (modulo the sets). With the L2's page rotation
//       (pages counted from each block's first filed line, L2Tags::set_in) a block's lines
//       move by the block's own displacement in sets only where they keep their place in it:
//       every touched argument keeps its offset in its block, or its span lies in one page of
//       its block then and now (the sets it covers: a cyclic run per page); else refused.
//       Each set's LRU state depends only on the sequence of lines looked up in it, and every
//       line then lands in the set its recorded counterpart's set moved to, one set for all
//       lines of a set, as a distinct line (by (3)), so every set sees the recorded sequence
//       renamed, and hits, misses, fills and write-backs are the recorded ones. The order of
//       the lookups is the recorded one by induction over the run (every transfer takes the
//       recorded time while every earlier lookup did, sim/replay/address_flow.h).
// Fills *writes as translated_writes does. why (may be null): on false, the condition that
// failed (the replay log's reason, SimOptions::replay_log). sets_moved (may be null): set when
// the launch was timed by (1') rather than (1).
bool relocated_writes(const RecordedLaunch& rec, const std::vector<uint64_t>& args,
                      const GmBlockLookup& blocks, uint64_t granule, std::vector<GmAccess>* writes,
                      std::string* why = nullptr, bool* sets_moved = nullptr);

// Runs the recorded blocks again on the cores' buffers and `gm`, cores spread over `pool`; with
// rec.effect_cores, the cores' walks spread over `pool` (each keeping the effects it issues),
// then every effect on this thread, in the recorded order across the cores (with `prepared`,
// no core walks: each runs its kept effects in that order).
// Returns "" or the first fault (lowest core index first) as
// "core aic3 pc 12 (k.s:30): <instruction>: <what>".
// prepared (may be null): this launch's effects kept by an earlier replay of it (same key): they
// are run instead of the blocks. keep (may be null, functional runs only): filled with this
// replay's effects (complete unless the program loads).
std::string replay_blocks(RecordedLaunch& rec, const isa::Program& program,
                          const std::vector<uint64_t>& args, int block_dim,
                          const std::vector<std::unique_ptr<AiCore>>& cores, DeviceMemory& gm,
                          const ChipConfig& cfg, bool functional, WorkerPool& pool,
                          const PreparedLaunch* prepared = nullptr, PreparedLaunch* keep = nullptr);

// Whether `rec` (recorded with other tensor addresses) times this launch exactly. Running the
// launch's blocks without effect (FunctionalCore verify mode, cores on `pool`) must give every
// core the recorded timing fingerprint: the same control flow and every instruction's cost but
// for its GM addresses. Then only the memory system could tell the launches apart, and it sees
// addresses only through the L2: looking up the new GM ranges in `l2` (the L2 the launch would
// start with: cold, or a copy of the chip's when it keeps its lines across launches) in the
// recorded order of transfers must give the recorded L2 fingerprint (every range the same hits
// and misses). Also no core may touch bytes another writes (as for any recording). Changes
// nothing but `l2`, which then holds the L2 as the launch leaves it. writes (may be null): on
// success, every GM range the launch writes (each pipe instruction's written ranges and each
// st's 8 bytes, core by core in execution order), which is all a timing-only simulator needs
// to carry the launch out (DeviceMemory::invalidate of each range, as replay_blocks would),
// without running its blocks again.
// effects (may be null; functional simulators): on success, each core's effects in effect
// order (in the order of rec.cores), which run_verified carries out as replay_blocks would, the
// check having walked the blocks already; `valid` is false when they would take more than
// `effects_max_bytes` of host memory, and on failure. rec's runs are pointed at `program`'s
// sections (as replay_blocks does).
struct VerifiedEffects {
  std::vector<IssuedEffects> cores;  // storage reused from check to check (capacity kept)
  bool valid = false;                // `cores` holds the effects of the check that passed last
};
bool verify_translation(RecordedLaunch& rec, const isa::Program& program,
                        const std::vector<uint64_t>& args, int block_dim,
                        const std::vector<std::unique_ptr<AiCore>>& cores, DeviceMemory& gm,
                        const ChipConfig& cfg, WorkerPool& pool, L2Tags& l2, L2Placement& placement,
                        std::vector<GmAccess>* writes = nullptr, VerifiedEffects* effects = nullptr,
                        uint64_t effects_max_bytes = 0);
// Carries out the effects verify_translation kept for `rec` and this launch (cores on `pool`):
// what replay_blocks(rec, ...) would do, without walking the blocks. Returns "" or the first
// fault as replay_blocks does.
std::string run_verified(const VerifiedEffects& effects, const RecordedLaunch& rec,
                         const isa::Program& program,
                         const std::vector<std::unique_ptr<AiCore>>& cores, DeviceMemory& gm,
                         const ChipConfig& cfg, WorkerPool& pool);

// Recorded launches by key, at most `capacity` keys and about `max_bytes` of recordings (the
// least recently used key goes first). A recording verified for other addresses is also kept
// under the new launch's key, shared, not copied.
class LaunchMemo {
 public:
  LaunchMemo(size_t capacity, uint64_t max_bytes) : m_capacity(capacity), m_max_bytes(max_bytes) {}
  RecordedLaunch* find(const LaunchKey& key);  // marks it most recently used
  // The recordings inserted with this similar key (replay_key) that are still kept, latest
  // first, at most kSimilar.
  static constexpr size_t kSimilar = 4;
  std::vector<std::shared_ptr<RecordedLaunch>> find_similar(const LaunchKey& similar);
  // The recordings inserted with this loose key (the similar key without the arguments'
  // block extents: relocated_writes' candidates), latest first, at most kLoose. More than
  // kSimilar: a launch that may evict relocates only from a recording whose blocks' sizes
  // move its arguments' L2 sets alike, which the latest few seldom are (# estimate: 16 costs
  // a key lookup and a check of a few arguments per candidate, for a launch not replayed).
  static constexpr size_t kLoose = 16;
  std::vector<std::shared_ptr<RecordedLaunch>> find_loose(const LaunchKey& loose);
  // A new recording: under `key`, one of those `similar` finds and, if `loose` is given, one
  // of those find_loose(*loose) finds.
  void insert(LaunchKey key, LaunchKey similar, RecordedLaunch rec,
              const LaunchKey* loose = nullptr);
  // `rec` (kept under another key, from find_similar) found to time the launch `key` too.
  void alias(LaunchKey key, std::shared_ptr<RecordedLaunch> rec);
  void erase(const LaunchKey& key);
  // The effects kept for `key` (keep_prepared), or null.
  const PreparedLaunch* prepared(const LaunchKey& key) const;
  // Keeps `p` with the recording of `key` (which must be kept), counted in the memo's bytes.
  void keep_prepared(const LaunchKey& key, std::unique_ptr<PreparedLaunch> p);
  size_t size() const { return m_map.size(); }
  uint64_t bytes() const { return m_bytes; }

 private:
  struct Entry {
    LaunchKey key;
    std::shared_ptr<RecordedLaunch> rec;
    std::unique_ptr<PreparedLaunch> prepared;  // this key's own (the recording may be shared)
  };
  void make_room();
  void add(LaunchKey key, std::shared_ptr<RecordedLaunch> rec);
  void drop(std::list<Entry>::iterator it);
  size_t m_capacity;
  uint64_t m_max_bytes, m_bytes = 0;
  std::list<Entry> m_lru;  // most recently used first
  std::unordered_map<LaunchKey, std::list<Entry>::iterator, LaunchKeyHash> m_map;
  using Index = std::unordered_map<LaunchKey, std::vector<LaunchKey>, LaunchKeyHash>;
  std::vector<std::shared_ptr<RecordedLaunch>> kept(const Index& index, const LaunchKey& k) const;
  // Adds `key` first to index[k], keeping at most `limit` keys there.
  static void index(Index& index, LaunchKey k, const LaunchKey& key, size_t limit);
  void prune(Index& index);
  // similar key -> exact keys, latest first; the same for loose keys
  Index m_similar, m_loose;
};

}  // namespace npusim
