#include "sim/replay/chip_launcher.h"

#include <algorithm>
#include <fstream>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "common/error.h"
#include "common/thread_cpu_time.h"
#include "sim/chip/chip.h"
#include "sim/chip/l2_placement.h"
#include "sim/chip/l2_tags.h"
#include "sim/counters/counters.h"
#include "sim/counters/observer.h"
#include "sim/sc_driver.h"

namespace npusim {

using sc_core::sc_time;
using sc_core::sc_time_stamp;
using namespace sc_driver;

namespace {

// The effects a check keeps for its replay (VerifiedEffects, ~240 bytes each) stay allocated from
// launch to launch, per chip, so they are bounded by this share of replay_memo_bytes (32 MiB of
// the default 1 GiB, ~140 k effects: the checked launches of a training step are mostly far
// smaller); a larger launch walks its program again. # estimate: host memory, no hardware figure.
constexpr uint64_t kVerifiedEffectsShare = 32;

// The extra key argument of a graph run's launch (begin()); any value would do, as no cold key
// of the same program has the same number of arguments.
constexpr uint64_t kGraphRunKeyMark = 0x4c3252554e000000ull;  // "L2RUN"

int replay_thread_count(const SimOptions& o) {
  if (o.replay == SimOptions::Replay::off) return 1;
  if (o.replay_threads > 0) return o.replay_threads;
  return static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
}

// For each argument inside an allocation block, the index of the first argument in the same
// block: with append_block_extents (offset and size of each argument's block), how the
// launch's arguments share blocks, which the translated replay needs to be the same.
void append_block_sharing(const GmBlockLookup& blocks, const std::vector<uint64_t>& args,
                          std::vector<uint64_t>* out) {
  if (!blocks) return;
  std::vector<std::pair<uint64_t, size_t>> starts;  // block start, first argument in it
  for (size_t i = 0; i < args.size(); ++i) {
    uint64_t start = 0, bytes = 0;
    if (!blocks(args[i], &start, &bytes)) continue;
    size_t first = i;
    for (const auto& [s, j] : starts)
      if (s == start) first = j;
    if (first == i) starts.emplace_back(start, i);
    out->push_back(first);
  }
}

// The blocks `args` point into (`blocks` gives them), each once, in order of first appearance.
std::vector<GmBlock> arg_blocks(const GmBlockLookup& blocks, const std::vector<uint64_t>& args) {
  std::vector<GmBlock> out;
  if (!blocks) return out;
  for (uint64_t a : args) {
    GmBlock b;
    if (!blocks(a, &b.start, &b.bytes)) continue;
    if (std::none_of(out.begin(), out.end(),
                     [&](const GmBlock& o) { return o.start == b.start && o.bytes == b.bytes; }))
      out.push_back(b);
  }
  return out;
}

}  // namespace

ReplayStore::ReplayStore(const SimOptions& o)
    : opts(o), memo(o.replay_memo_launches, o.replay_memo_bytes), pool(replay_thread_count(o)) {}

const AddressFlow& ReplayStore::address_flow(const LaunchKey& key, const isa::Program& program) {
  auto [it, added] = m_flows.try_emplace({key.program_hash[0], key.program_hash[1]});
  if (added) it->second = analyze_address_flow(program);
  return it->second;
}

// The launch begin() started on the chip, until finish().
struct ChipLauncher::Pending {
  const KernelLaunch* launch = nullptr;
  sc_time start;
  LaunchKey key, similar;
  // `similar` without the block extents (set with `flow` when relocation is on).
  LaunchKey loose;
  // Some block of its arguments overlaps another or a planned buffer: its keys hold those
  // blocks' addresses (append_fixed_blocks), and it is not relocated (a cold launch).
  bool fixed = false;
  // The lookup its lines are filed by (MemorySystem::select_l2): its replay keys and checks too.
  GmBlockLookup blocks;
  bool record = false;                 // record it for replay (Chip::begin_launch's record)
  bool lean = false;                   // ... for replays by translation only (CoreRecording)
  bool ordered = false;                // ... with the effects' order across the cores
  bool keep_l2 = false;                // it starts with a kept L2 (MemorySystem::l2_carried)
  bool in_run = false;                 // ... a graph run's (its recording keeps its L2 lookups)
  const AddressFlow* flow = nullptr;   // set if its recording may be made translatable
  RecordedLaunch* recorded = nullptr;  // check mode: the recording it was replayed from
  std::string replay_error;            // check mode: the replay's fault, if any
  DeviceMemory::Snapshot replayed;     // check mode: device memory as the replay left it
  KernelResult result;                 // the outcome (settle())
  std::string note;                    // replay log: how it was replayed, or why it was not
};

ChipLauncher::ChipLauncher(Chip& chip, DeviceMemory& gm, CounterRegistry& counters,
                           const ChipConfig& cfg, ReplayStore& store, std::string counter_root)
    : m_chip(chip),
      m_gm(gm),
      m_counters(counters),
      m_cfg(cfg),
      m_store(store),
      m_root(std::move(counter_root)),
      m_verify_l2(std::make_unique<L2Tags>(
          store.opts.replay == SimOptions::Replay::off ? 0 : cfg.l2_bytes, cfg.l2_line_bytes,
          cfg.l2_ways, cfg.l2_write_back, cfg.l2_page_rotation)),
      m_verify_placement(std::make_unique<L2Placement>(m_verify_l2->line_bytes())) {}

ChipLauncher::~ChipLauncher() = default;

bool ChipLauncher::detail_wanted() const {
  const auto& observers = m_chip.observers();
  return std::any_of(observers.begin(), observers.end(),
                     [](const ChipObserver* o) { return o->wants_launch_detail(); });
}

bool ChipLauncher::verify(RecordedLaunch& rec, const KernelLaunch& launch,
                          const GmBlockLookup& blocks, std::vector<GmAccess>* writes,
                          VerifiedEffects* effects) {
  // The L2 and the placement the launch starts with (MemorySystem::select_l2): copies of a
  // kept L2's (across launches, or the graph run's), which a replay then installs.
  const MemorySystem& memory = m_chip.memory();
  if (memory.l2_carried()) {
    *m_verify_l2 = memory.l2();
    *m_verify_placement = memory.placement();
  } else {
    m_verify_l2->invalidate_all();
    m_verify_placement->begin_launch(blocks);
  }
  return verify_translation(rec, *launch.program, launch.args, launch.block_dim, m_chip.cores(),
                            m_gm, m_cfg, m_store.pool, *m_verify_l2, *m_verify_placement, writes,
                            effects, m_store.opts.replay_memo_bytes / kVerifiedEffectsShare);
}

CounterRegistry::RawDelta ChipLauncher::own_counters(const RecordedLaunch& rec) {
  if (rec.registry == &m_counters || !rec.registry) return rec.counters;
  return m_counters.translate(rec.counters, *rec.registry, m_counter_maps[rec.registry]);
}

// The result of a replayed launch: simulated time moves on (the caller's part) as it did when the
// launch was simulated, and the counters move by what it counted then.
KernelResult ChipLauncher::replayed_result(const KernelLaunch& launch, const RecordedLaunch& rec,
                                           const sc_time& start) {
  const uint64_t start_ps = time_ps(start);
  m_chip.notify_kernel_begin(*launch.program, launch.block_dim, start_ps);
  m_chip.notify_kernel_end(*launch.program, start_ps + rec.duration_ps, true);
  if (rec.registry == &m_counters || !rec.registry)
    m_counters.apply(rec.counters);
  else
    m_counters.apply(own_counters(rec));
  KernelResult r;
  r.ok = true;
  r.replayed = true;
  r.start_cycle = start_ps / kPsPerCycle;
  r.cycles = ceil_cycles(rec.duration_ps);
  r.time_us = m_cfg.cycles_to_us(static_cast<double>(rec.duration_ps) / kPsPerCycle);
  // Shares the recording's values (delta_of(rec.counters)); every chip names its counters alike.
  r.counter_delta = rec.delta;
  r.counter_delta.set_root(m_root);
  if (launch.counter_tree) r.counters = r.counter_delta.tree();
  return r;
}

ChipLauncher::Begun ChipLauncher::begin(const KernelLaunch& launch, const sc_time& start,
                                        bool alone) {
  const SimOptions& opts = m_store.opts;
  LaunchMemo& memo = m_store.memo;
  auto P = std::make_unique<Pending>();
  P->launch = &launch;
  P->start = start;
  // A launch run before is replayed unless an observer wants to see its instructions, and only
  // one that runs alone (see `alone` in the header). A timing-only run with a cold L2 also
  // replays by translation (SimOptions::replay_translated), even with `replay` off.
  // A kept L2 (across launches, or a graph run's): every replay is checked against the L2 and
  // placement the launch starts with, and leaves them as simulating would have.
  MemorySystem& memory = m_chip.memory();
  P->blocks = memory.select_l2(launch.l2_run, launch.gm_blocks, launch.planned_blocks);
  const bool keep_l2 = memory.l2_carried();
  // A graph run's launch (its L2 kept from the run's previous launch, lines filed by block):
  // replayed by translation only after its recorded L2 lookups, moved, give the recorded
  // outcomes on the run's L2 (run_l2_lookups_match).
  const bool in_run = memory.l2_in_graph_run();
  P->keep_l2 = keep_l2;
  P->in_run = in_run;
  // A functional run replays a translated launch by walking its blocks at its own arguments
  // (the translation stands in for the check, not for the effects), so only with `walk`.
  const bool walk = opts.replay != SimOptions::Replay::off;  // replays that walk the program
  // The L2's page rotation (memory.l2.page_rotation) counts a block's pages from the block's
  // first filed line (L2Tags::set_in), so moving a block moves all its lines' sets alike, as
  // modulo indexing does: translation holds with it (relocated_writes' conditions).
  const bool translate = (!opts.functional || walk) && opts.replay_translated &&
                         (!keep_l2 || in_run) && bool(P->blocks);
  bool loads = false, cross_core = false;
  bool replayable = alone && (walk || translate) && launch.block_dim >= 1 &&
                    replay_key(*launch.program, launch.args, launch.block_dim, &P->key, &P->similar,
                               &loads, &cross_core);
  // A program with cross-core flags replays by translation only: its timing holds by the
  // induction in sim/replay/address_flow.h (every core reaches each flag when it did then). A
  // timing-only replay runs nothing. A functional one carries out the effects in the order the
  // recorded run took them across the cores (RecordedLaunch::effect_cores: the same timing,
  // hence the same order), not the cores apart, since a core reads what another wrote, the
  // very thing such flags order (a mix kernel's cube core storing tiles its vector cores then
  // reduce). Not with ld: the walk that issues the effects would need each loaded value
  // before the other cores' effects preceding it had run.
  const bool translation_only = cross_core;
  if (cross_core && (!translate || (opts.functional && loads))) replayable = false;
  // The replay log's line (SimOptions::replay_log): why a launch is simulated, else how it was
  // replayed. Built only when the log is written.
  const bool logging = !opts.replay_log.empty();
  if (logging) m_begin_cpu_ns = thread_cpu_ns();
  std::string why;
  if (logging)
    why = !alone ? "runs beside other launches"
          : !(walk || translate)
              ? "replay off (translation: timing-only, a cold L2 or a graph run's, blocks)"
          : launch.block_dim < 1 ? "no blocks"
          : !replayable && !translate
              ? "the program has cc_set or cc_wait (replayed only by translation: a cold L2 or "
                "a graph run's, allocation blocks)"
          : !replayable ? "the program has cc_set or cc_wait and ld (not replayed functionally)"
                        : "";
  if (replayable && translate) {
    P->flow = &m_store.address_flow(P->key, *launch.program);
    // A program whose loaded values steer it replays in a timing-only simulator only, where
    // nothing a replay does depends on them but the check of its loads' bytes
    // (loads_as_recorded); a functional replay would walk it with this launch's values.
    const bool followed = P->flow->ok || (P->flow->steered && !opts.functional);
    if (logging && !followed) why = "address flow not followed: " + P->flow->why;
    if (!followed)
      P->flow = nullptr;
    else if (opts.replay_relocate)
      P->loose = P->similar;  // before the extents below
  }
  if ((!walk || translation_only) && !P->flow) replayable = false;  // nothing to record it for
  // The cold L2 files lines by block. (A graph run's launch is keyed without: its recorded L2
  // lookups are checked on the run's L2 at any layout, run_l2_lookups_match.)
  // Blocks overlapping another or a planned buffer are keyed by address (append_fixed_blocks),
  // and such a launch is not relocated (relocated_writes moves every block).
  if (replayable && !keep_l2) {
    std::vector<uint64_t> fixed_words;
    const std::vector<bool> fixed = append_fixed_blocks(arg_blocks(P->blocks, launch.args),
                                                        launch.planned_blocks, &fixed_words);
    P->fixed = std::find(fixed.begin(), fixed.end(), true) != fixed.end();
    for (LaunchKey* k : {&P->key, &P->similar}) {
      append_block_extents(P->blocks, launch.args, &k->args);
      append_block_sharing(P->blocks, launch.args, &k->args);
      k->args.insert(k->args.end(), fixed_words.begin(), fixed_words.end());
    }
  }
  // A graph run's launch, which starts with the run's L2, is recorded apart from the cold
  // launches (which replay their own key unchecked): its key gets one more argument than any
  // cold key of the program can have (those get four per argument in a block, or none).
  if (replayable && in_run)
    for (LaunchKey* k : {&P->key, &P->similar, &P->loose})
      if (k != &P->loose || P->flow) k->args.push_back(kGraphRunKeyMark);
  RecordedLaunch* found = replayable ? memo.find(P->key) : nullptr;
  const bool detail = detail_wanted();
  const auto in_time = [&](const RecordedLaunch& r) {
    return time_ps(start) + r.quiescent_ps <= kSimTimeLimitPs;
  };
  // A timing-only simulator carries out a launch that passed the check by invalidating the GM
  // ranges the check found it writes: that is all its replay would do (replay_blocks plans
  // every instruction again to find them).
  std::vector<GmAccess> writes;
  std::vector<GmAccess>* const verified_writes = opts.functional ? nullptr : &writes;
  bool have_writes = false;
  // A functional simulator keeps the effects of the launch a check passes for (the check walks
  // the blocks; the replay then runs what it issued rather than walking them again).
  m_verified.valid = false;
  VerifiedEffects* const verified_effects = opts.functional ? &m_verified : nullptr;
  RecordedLaunch* recorded = nullptr;
  bool stale = false;
  std::string how;  // replay log: how `recorded` times it
  if (logging && replayable && detail) why = "an observer wants its instructions";
  if (P->flow && !detail) {
    // By translation: its own recording, or the latest one at other addresses that applies.
    const uint64_t granule = [&] {
      auto it = m_cfg.align_bytes.find(isa::Buf::GM);
      return it == m_cfg.align_bytes.end() || it->second == 0 ? uint64_t{1} : uint64_t{it->second};
    }();
    // Whether `r` (which times the launch by its addresses) loads what it loaded then.
    std::string other_loads;
    const auto loads_alike = [&](const RecordedLaunch& r) {
      return loads_as_recorded(r, launch.args, m_gm, logging ? &other_loads : nullptr);
    };
    // In a graph run: whether `r`'s L2 lookups, moved to this launch's arguments, find what
    // they found then on copies of the run's L2 and placement, which then hold the state
    // simulating would leave (installed below, when replayed). A cold launch: always.
    bool run_l2_differs = false;
    const auto l2_alike = [&](const RecordedLaunch& r) {
      if (!in_run) return true;
      *m_verify_l2 = memory.l2();
      *m_verify_placement = memory.placement();
      const bool same = run_l2_lookups_match(r, launch.args, *m_verify_l2, *m_verify_placement);
      run_l2_differs |= !same;
      return same;
    };
    // A recording with ranges past its arguments' blocks times only the launch that files
    // them as then (a cold launch; a graph run's keeps no L2 lookups for it).
    std::string outside_differs;
    const auto outside_alike = [&](const RecordedLaunch& r) {
      return outside_blocks_alike(r, launch.args, P->blocks, logging ? &outside_differs : nullptr);
    };
    const bool own = found && in_time(*found) &&
                     translated_writes(*found, launch.args, granule, &writes) &&
                     outside_alike(*found);
    if (own && loads_alike(*found) && l2_alike(*found)) {
      recorded = found;
      how = in_run ? "translated, its own key, its L2 lookups alike in the run"
                   : "translated, its own key";
    } else {
      // Its own recording loaded other bytes, or found another L2 in the run: simulated, the
      // launch is recorded afresh.
      stale = own;
      size_t candidates = 0;
      // In a graph run the loose candidates below are these (its keys have no block extents).
      for (std::shared_ptr<RecordedLaunch>& candidate :
           in_run ? std::vector<std::shared_ptr<RecordedLaunch>>{}
                  : memo.find_similar(P->similar)) {
        ++candidates;
        const bool timed = in_time(*candidate);
        const bool moves = timed && translated_writes(*candidate, launch.args, granule, &writes);
        const bool outside = moves && outside_alike(*candidate);
        const bool loads = outside && loads_alike(*candidate);
        if (loads && l2_alike(*candidate)) {
          memo.alias(P->key, candidate);  // the next step finds it by its own key
          recorded = candidate.get();     // the memo keeps it (just added: not evicted)
          how = "translated, other addresses in blocks laid out alike";
          break;
        }
        // The latest candidate's reason.
        if (logging)
          why = "in blocks laid out alike: " +
                (!candidate->translation ? std::string("its recording is not translatable")
                 : !timed                ? std::string("past the time limit")
                 : !moves   ? std::string("an argument moved by other than the GM alignment")
                 : !outside ? "its ranges past an argument's block differ: " + outside_differs
                 : !loads   ? "its recording loaded other bytes: " + other_loads
                            : std::string("its L2 lookups differ in the run"));
      }
      // At other offsets in its blocks, or in blocks of other sizes: a launch that can evict
      // no line (relocated_writes). In a graph run, at any addresses and layout, a launch whose
      // moved L2 lookups find what they found then (the outcomes decide its timing, not the
      // layout), in a timing-only simulator only: a functional replay walks the cores apart,
      // which needs the recorded layout's guarantee that no core touches bytes another writes
      // (a functional run's launch at other addresses is checked by walking, below).
      if (!recorded && opts.replay_relocate && !P->fixed && (!in_run || !opts.functional))
        for (std::shared_ptr<RecordedLaunch>& candidate : memo.find_loose(P->loose)) {
          std::string refused;
          bool sets_moved = false;
          const bool moves =
              in_run ? translated_writes(*candidate, launch.args, granule, &writes)
                     : relocated_writes(*candidate, launch.args, P->blocks, granule, &writes,
                                        logging ? &refused : nullptr, &sets_moved);
          if (in_run && !moves && logging) refused = "a displacement is not GM-aligned";
          if (in_time(*candidate) && moves && loads_alike(*candidate) && l2_alike(*candidate)) {
            memo.alias(P->key, candidate);
            recorded = candidate.get();
            how = in_run       ? "translated, other addresses, its L2 lookups alike in the run"
                  : sets_moved ? "relocated, its L2 sets moved alike"
                               : "relocated";
            break;
          }
          // The latest recording's reason (the first refusal) stands for the others.
          if (logging && candidates++ == 0)
            why = "other block layout: " + (refused.empty() ? "past the time limit" : refused);
        }
      if (logging && !recorded && !other_loads.empty())
        why = "its recordings loaded other bytes: " + other_loads;
      else if (logging && !recorded && run_l2_differs)
        why = "its recordings' L2 lookups found other lines in the run's L2";
      else if (logging && !recorded && in_run && candidates == 0 && !own && !opts.functional)
        why = "no recording of its program, untyped arguments and block count in a graph run";
      else if (logging && !recorded && candidates == 0) {
        auto it = m_store.unrelocatable.find(P->loose);
        why = opts.replay_relocate && it != m_store.unrelocatable.end()
                  ? "other block layout: " + it->second
                  : "no recording of its program, untyped arguments and block count";
      }
    }
    // A timing-only run carries it out by the translated ranges alone; a functional one runs
    // its effects below (replay_blocks at these arguments).
    have_writes = recorded != nullptr && !opts.functional;
    if (logging && recorded && P->flow->steered) how += ", its loads read as recorded";
  }
  // A functional replay in the recorded order across the cores holds every effect its cores'
  // walks issue until it carries them out: unless this key's effects are kept already, a launch
  // whose effects would take more than the check's share of the memo (VerifiedEffects) is
  // simulated, as one whose check could not keep its effects walks again.
  const uint64_t effects_max_bytes = opts.replay_memo_bytes / kVerifiedEffectsShare;
  if (recorded && opts.functional && issued_bytes_estimate(*recorded) > effects_max_bytes &&
      !memo.prepared(P->key)) {
    if (logging)
      why = fmt::format("its effects in order would take {} MiB (more than {} MiB)",
                        issued_bytes_estimate(*recorded) >> 20, effects_max_bytes >> 20);
    recorded = nullptr;
  }
  if (!recorded && walk && !translation_only) {
    // A replay moves time on by the recorded amount: past the limit, simulate (to fault there).
    recorded = detail || (found && !in_time(*found)) ? nullptr : found;
    // With an ld, this launch's data may steer it elsewhere than the recorded run's: the
    // recording must pass the check with this launch's data first, as one made at other
    // addresses does; one that fails is recorded afresh below.
    // So must every recording when the L2 keeps its lines across launches: the L2 this launch
    // starts with may differ from the recorded run's.
    // Not needed under its own key when the loaded values reach data operands only (the
    // program's address flow is followed, analyze_address_flow): every operand that plan()
    // reads, every branch, loop count, mask and address is then the same for any data, so the
    // walk times as recorded (the same ranges, no core touching bytes another writes, as
    // recorded or checked at these addresses when it was aliased) whatever ld reads. The
    // replay's walk reads each ld where the recorded order places it (replay_blocks).
    const bool data_only_loads = loads && recorded && recorded == found && !keep_l2 &&
                                 m_store.address_flow(P->key, *launch.program).ok;
    // (A steered flow is not ok: its loaded values reach more than data operands.)
    const bool checked = recorded && ((loads && !data_only_loads) || keep_l2);
    stale = checked && !verify(*recorded, launch, P->blocks, verified_writes, verified_effects);
    have_writes = checked && !stale && verified_writes;
    if (stale) recorded = nullptr;
    if (replayable && !recorded && !detail) {
      // The same launch at other tensor addresses (a training step): replay it if the recorded
      // timing provably holds for these addresses.
      for (std::shared_ptr<RecordedLaunch>& candidate : memo.find_similar(P->similar))
        if (in_time(*candidate) &&
            verify(*candidate, launch, P->blocks, verified_writes, verified_effects)) {
          have_writes = verified_writes != nullptr;
          // Kept under this launch's own key too: the next step finds it without the check.
          memo.alias(P->key, candidate);
          recorded = candidate.get();  // the memo keeps it (just added: not evicted)
          how = "checked at other addresses";
          break;
        }
    }
    if (logging && recorded && how.empty())
      how = data_only_loads      ? "its own key, loads reach data operands only"
            : (loads || keep_l2) ? "its own key, checked"
                                 : "its own key";
    if (logging && !recorded && replayable && !detail && P->flow == nullptr)
      why = stale   ? "its recording failed the check"
            : found ? "past the time limit"
                    : "no recording passed the check";
  }
  if (logging) P->note = recorded ? "replayed\t" + how : "simulated\t" + why;
  if (recorded) {
    const bool check = opts.replay == SimOptions::Replay::check;
    // The check replays, then simulates the same launch from the same state: device memory
    // and the buffers of the cores it runs on (a kernel may store bytes it never wrote).
    DeviceMemory::Snapshot before;
    std::vector<std::vector<std::vector<uint8_t>>> buffers;
    if (check) {
      before = m_gm.snapshot();
      for (const RecordedLaunch::CoreBlocks& cb : recorded->cores)
        buffers.push_back(m_chip.cores()[static_cast<size_t>(cb.core)]->local().save());
    }
    std::string replay_error;
    if (have_writes) {
      for (const GmAccess& a : writes) m_gm.invalidate(a.addr, a.bytes);
    } else if (m_verified.valid) {  // the check passed for `recorded` and kept them
      replay_error = run_verified(m_verified, *recorded, *launch.program, m_chip.cores(), m_gm,
                                  m_cfg, m_store.pool);
    } else {
      // The same launch replayed again (its own key, no ld): run the effects its last replay
      // kept, or keep them this time (PreparedLaunch) when they fit an eighth of the memo.
      const bool same = recorded == found && !loads && opts.functional;
      const PreparedLaunch* prepared = same ? memo.prepared(P->key) : nullptr;
      std::unique_ptr<PreparedLaunch> keep;
      if (same && !prepared && prepared_bytes_estimate(*recorded) <= opts.replay_memo_bytes / 8)
        keep = std::make_unique<PreparedLaunch>();
      replay_error =
          replay_blocks(*recorded, *launch.program, launch.args, launch.block_dim, m_chip.cores(),
                        m_gm, m_cfg, opts.functional, m_store.pool, prepared, keep.get());
      if (keep && keep->complete && replay_error.empty())
        memo.keep_prepared(P->key, std::move(keep));
    }
    if (!check) {
      Begun b;
      b.done = true;
      if (!replay_error.empty()) {
        // Cannot happen for a launch that ran cleanly with the same operands; report it as the
        // kernel's fault rather than pretend, and simulate the launch next time.
        memo.erase(P->key);
        m_replay_note = "replayed\tfaulted: " + replay_error;
        b.result.error = "replay: " + replay_error;
        b.result.start_cycle = time_ps(start) / kPsPerCycle;
        return b;
      }
      // The L2 and its placement as the simulated launch would have left them (verified above).
      if (keep_l2) {
        std::swap(memory.l2(), *m_verify_l2);
        std::swap(memory.placement(), *m_verify_placement);
      }
      m_counters.restart_windows();  // what the snapshot before a simulated launch does
      m_replay_note = std::move(P->note);
      b.busy_ps = recorded->quiescent_ps;
      b.result = replayed_result(launch, *recorded, start);
      return b;
    }
    P->replayed = m_gm.snapshot();
    P->replay_error = std::move(replay_error);
    m_gm.restore(before);
    for (size_t i = 0; i < buffers.size(); ++i)
      m_chip.cores()[static_cast<size_t>(recorded->cores[i].core)]->local().restore(buffers[i]);
    P->recorded = recorded;
  }

  // The counters at the start of the simulated launch (a replay above needs no snapshot).
  m_counters.snapshot(m_launch_base);
  P->record = replayable && !recorded && (!found || stale);
  // Without replays that walk the program, the recording serves translation only; so it does
  // for cross-core flags in a timing-only simulator. A functional one records them with the
  // order of the effects across the cores.
  P->lean = !walk || (translation_only && !opts.functional);
  P->ordered = translation_only && !P->lean;
  m_chip.begin_launch(*launch.program, launch.args, launch.block_dim, opts.functional,
                      watchdog_budget(opts, *launch.program, launch.args), P->record,
                      opts.replay_record_max_bytes, P->lean, P->ordered,
                      P->in_run && P->flow != nullptr);
  m_pending = std::move(P);
  return Begun{};
}

bool ChipLauncher::settle() {
  if (!m_pending) throw Error("ChipLauncher::settle: no launch runs on the chip");
  KernelResult& r = m_pending->result;
  switch (m_chip.outcome()) {
    case Chip::Outcome::Done: r.ok = true; return false;
    case Chip::Outcome::Fault: r.error = m_chip.fault_message(); return false;
    case Chip::Outcome::Deadlock:
      r.error = m_chip.deadlock_report();
      m_chip.abort();  // the caller's next run unwinds every blocked process (zero time)
      return true;
  }
  return false;
}

KernelResult ChipLauncher::finish() {
  if (!m_pending) throw Error("ChipLauncher::finish: no launch runs on the chip");
  std::unique_ptr<Pending> P = std::move(m_pending);
  const KernelLaunch& launch = *P->launch;
  KernelResult r = std::move(P->result);
  const uint64_t duration_ps = time_ps(m_chip.end_time() - P->start);
  const uint64_t quiescent_ps = time_ps(sc_time_stamp() - P->start);
  RecordedLaunch rec;
  // A recording dropped on the way (SimOptions::replay_record_max_bytes) is not kept. A mix
  // kernel (a cube core and its vector cores per block, each core running its own section's
  // blocks) is kept as any launch is: each core's blocks are recorded with their section,
  // block and subblock ids (record_blocks), and record_blocks refuses a launch where a core
  // read or wrote GM bytes another core wrote (unless lean or in the recorded effect order).
  // The cores of a mix kernel share nothing but GM and the cross-core flags, which carry no
  // data, so with no such bytes each core's effects depend on the launch alone and the cores
  // replay apart exactly (the strided input gradient: the cube core writes dx's strided
  // positions while its vector cores zero the others).
  const bool keep =
      P->record && m_chip.launch().record && r.ok && record_blocks(*launch.program, m_chip, &rec);
  if (keep && P->flow) {
    record_translation(
        *launch.program, *P->flow, m_chip, launch.args, P->blocks, m_gm, &rec,
        P->in_run && m_chip.memory().l2_traced() ? &m_chip.memory().l2_trace() : nullptr);
    // A lean recording serves translation only: its walk (sections, effect order, transfer
    // order) is never read and need not take memo space.
    if (P->lean) {
      rec.runs.clear();
      rec.run_section.clear();
      for (RecordedLaunch::CoreBlocks& cb : rec.cores) {
        std::vector<uint8_t>().swap(cb.order);
        std::vector<uint8_t>().swap(cb.transfer_pipes);
        cb.blocks.clear();
      }
      std::vector<uint16_t>().swap(rec.transfer_order);
    }
  }
  m_chip.end_launch(r.ok);
  r.start_cycle = time_ps(P->start) / kPsPerCycle;
  r.cycles = ceil_cycles(duration_ps);
  r.time_us = m_cfg.cycles_to_us(static_cast<double>(duration_ps) / kPsPerCycle);
  r.counter_delta = m_counters.delta_since(m_launch_base);
  r.counter_delta.set_root(m_root);
  if (launch.counter_tree) r.counters = r.counter_delta.tree();
  r.replayed = P->recorded != nullptr;  // check mode: replayed, then verified by simulating
  if (P->recorded) check_replay(*launch.program, *P, r, duration_ps, quiescent_ps);
  if (keep) {
    rec.duration_ps = duration_ps;
    rec.quiescent_ps = quiescent_ps;
    rec.counters = m_counters.raw_delta_since(m_launch_base);
    rec.registry = &m_counters;
    rec.delta = m_counters.delta_of(rec.counters);
    // A graph run's recording serves any block layout in a timing-only simulator (its L2
    // lookups are checked); a cold one only where it provably cannot evict differently.
    const bool relocatable = P->flow && m_store.opts.replay_relocate && rec.translation &&
                             !P->fixed &&
                             (P->in_run ? rec.translation->l2_traced && !m_store.opts.functional
                                        : rec.translation->relocatable());
    if (!m_store.opts.replay_log.empty()) {
      const RecordedLaunch::Translation* t = rec.translation.get();
      P->note +=
          !P->flow    ? "; recorded"
          : !t        ? "; recorded, not translatable (a GM range outside its argument's block)"
          : P->in_run ? (t->l2_traced ? "; recorded in a graph run, with its L2 lookups"
                                      : "; recorded in a graph run, no L2 lookups (a range "
                                        "outside its arguments' blocks)")
          : P->fixed  ? "; recorded, its overlapping blocks keyed by address"
          : !t->outside.empty()
              ? fmt::format(
                    "; recorded, {} argument(s) pinned at their addresses (a GM range "
                    "past its argument's block)",
                    t->pinned.size())
          : t->fits_l2
              ? "; recorded, relocatable"
              : fmt::format("; recorded, may evict ({} L2 ways of {}){}", t->ways_needed, t->ways,
                            t->l2_placed ? ", relocatable where its sets move alike" : "");
      if (P->flow && m_store.opts.replay_relocate && !P->in_run) {
        if (relocatable)
          m_store.unrelocatable.erase(P->loose);
        else
          m_store.unrelocatable[P->loose] =
              !t         ? "its recordings are not translatable"
              : P->fixed ? "its arguments' blocks overlap (keyed by address)"
              : !t->outside.empty()
                  ? "a range past an argument's block pins it at its recorded address"
                  : fmt::format("may evict: its spans need {} L2 ways of {} at some placement",
                                t->ways_needed, t->ways);
      }
    }
    m_store.memo.insert(std::move(P->key), std::move(P->similar), std::move(rec),
                        relocatable ? &P->loose : nullptr);
  } else if (P->record && !m_store.opts.replay_log.empty()) {
    P->note += !r.ok                     ? "; not recorded: failed"
               : !m_chip.launch().record ? "; not recorded: past replay_record_max_bytes"
                                         : "; not recorded: a core touched bytes another wrote";
  }
  if (P->recorded && !P->note.empty()) P->note += ", checked by simulating";
  m_replay_note = std::move(P->note);
  return r;
}

// Replay check (SimOptions::Replay::check): the launch was replayed into P.replayed, then
// simulated from the same memory into `r`. Throws npusim::Error naming the first difference.
void ChipLauncher::check_replay(const isa::Program& program, const Pending& P,
                                const KernelResult& r, uint64_t duration_ps,
                                uint64_t quiescent_ps) {
  const RecordedLaunch& rec = *P.recorded;
  const std::string what = fmt::format("replay check of kernel '{}'", program.name);
  if (!r.ok || !P.replay_error.empty())
    throw Error(fmt::format("{}: simulated: {}; replayed: {}", what, r.ok ? "ok" : r.error,
                            P.replay_error.empty() ? "ok" : P.replay_error));
  if (duration_ps != rec.duration_ps || quiescent_ps != rec.quiescent_ps)
    throw Error(fmt::format("{}: simulated {} ps (idle after {} ps), recorded {} ps ({} ps)", what,
                            duration_ps, quiescent_ps, rec.duration_ps, rec.quiescent_ps));
  const CounterRegistry::RawDelta now = m_counters.raw_delta_since(m_launch_base);
  if (const CounterRegistry::RawDelta recorded = own_counters(rec); now != recorded) {
    // Name the first counters that differ (a JSON patch from the recorded to the simulated).
    const nlohmann::json patch =
        nlohmann::json::diff(m_counters.delta_of(recorded).tree(), m_counters.delta_of(now).tree());
    std::string first;
    for (size_t i = 0; i < patch.size() && i < 3; ++i) first += " " + patch[i].dump();
    throw Error(fmt::format("{}: the counters differ from the recorded run ({} vs {} moved):{}",
                            what, now.size(), rec.counters.size(), first));
  }
  // A kept L2: the replay left its end state in the check's copies (verify, or
  // run_l2_lookups_match), which it would have installed.
  if (P.keep_l2 && !m_chip.memory().l2().same_lines(*m_verify_l2))
    throw Error(
        fmt::format("{}: the L2 differs between the simulated and the replayed launch", what));
  if (P.keep_l2 && !m_chip.memory().placement().same_placement(*m_verify_placement))
    throw Error(fmt::format(
        "{}: the L2 placement differs between the simulated and the replayed launch", what));
  if (auto addr = m_gm.first_difference(P.replayed))
    throw Error(
        fmt::format("{}: device memory differs at {:#x} between the simulated and the "
                    "replayed launch",
                    what, *addr));
}

void ChipLauncher::begin_beside() {
  if (m_store.opts.replay_log.empty()) return;
  m_begin_cpu_ns = thread_cpu_ns();
  m_replay_note = "simulated\truns beside other launches";
}

void ChipLauncher::log(const KernelLaunch& launch, const KernelResult& r) {
  const SimOptions& opts = m_store.opts;
  const uint64_t cycles = r.ok ? r.cycles : 0;
  if (!opts.launch_log.empty()) {
    std::ofstream log(opts.launch_log, std::ios::app);
    log << launch.program->name << '\t' << launch.block_dim << '\t' << cycles << '\t'
        << fmt::format("{:016x}", isa::program_digest(*launch.program)) << '\t'
        << fmt::format("{:016x}", counter_digest(r.counter_delta)) << '\n';
    if (!log) throw Error(fmt::format("NPUSIM_LAUNCH_LOG: cannot append to '{}'", opts.launch_log));
  }
  if (!opts.replay_log.empty()) {
    std::ofstream log(opts.replay_log, std::ios::app);
    const uint64_t now_ns = thread_cpu_ns();
    log << launch.program->name << '\t' << launch.block_dim << '\t' << cycles << '\t'
        << (now_ns - m_begin_cpu_ns) / 1000 << '\t' << m_replay_note << '\n';
    m_begin_cpu_ns = now_ns;  // the next line of a group counts from here
    if (!log) throw Error(fmt::format("NPUSIM_REPLAY_LOG: cannot append to '{}'", opts.replay_log));
  }
}

}  // namespace npusim
