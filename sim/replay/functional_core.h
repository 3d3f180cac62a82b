// One AI core's blocks run again without simulated time, with the functional effect of the
// timed run they replay (sim/replay/launch_replay.h). The scalar unit walks the program and
// issues each pipe instruction into its pipe's queue, as in the core model
// (sim/core/ai_core.h); the pipes then execute their queues' heads in the order the timed run
// executed them, which it recorded per core (CoreRecording::exec_order). So even a kernel whose
// pipes race (a missing wait_flag) computes what its timed run computed: the result depends
// only on the order in which instructions took effect, and that order is replayed. Flags and
// barriers only order time, so they are skipped; nothing is timed or counted.
//
// One FunctionalCore touches only its own CoreMemory and the bytes of device memory its
// instructions name, so the replay runs several cores at once on host threads. Cores that hand
// each other data through device memory (cross-core flags) cannot run apart: their walks only
// issue their effects (Mode::issue), which the caller carries out in the recorded order across
// the cores (RecordedLaunch::effect_cores); cc_set and cc_wait are skipped as flags are.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "sim/config/chip_config.h"
#include "sim/core/core_env.h"
#include "sim/core/scalar_state.h"
#include "sim/exec/exec.h"
#include "sim/memory/device_memory.h"
#include "sim/replay/fingerprint.h"

namespace npusim {

// One core's effects in a replayed launch, in the order they took effect, each decoded and
// checked once (PreparedOp): what a replay of the same launch with the same arguments does
// again, without walking the program (sim/replay/launch_replay.h, RecordedLaunch::prepared).
struct PreparedEffects {
  struct Where {
    const SectionRun* run;  // the block's section (for a fault's message)
    uint32_t pc;
  };
  std::vector<std::unique_ptr<PreparedOp>> ops;
  std::vector<Where> where;  // of each op
  uint64_t bytes = 0;        // host memory held, roughly
};

// One core's effects in a launch that passed the replay check (verify mode), in the order they
// take effect, as the scalar unit issued them (operands resolved): running them in order
// (run_issued) does what a replay walking the core's blocks in execute mode would. The check
// has walked the program once already; this spares the replay a second walk.
struct IssuedEffects {
  std::vector<IssuedOp> ops;                 // pipe instructions and scalar st, no ld
  std::vector<PreparedEffects::Where> where;  // of each op
};
// Carries out `effects` in their order on ctx (a scalar st writes its 8 bytes; anything else
// is execute()d). *at: the index of the op running (of the one that threw, if one faults).
void run_issued(const IssuedEffects& effects, ExecContext& ctx, size_t* at);
// Carries out op (a pipe instruction or a scalar st, issued on ctx's core) as run_issued
// would, decoding it once (prepare) and appending it to *out, to be run again by a replay of
// the same launch.
void keep_effect(const IssuedOp& op, ExecContext& ctx, PreparedEffects::Where where,
                 PreparedEffects* out);

class FunctionalCore {
 public:
  // order: the pipes whose instructions took effect one after another in the timed run, over
  // all the blocks this core ran (CoreRecording::exec_order; isa::Pipe::S: a scalar st or ld).
  // functional: false for a timing-only simulator (nothing is computed, buffers stay as they
  // are).
  // execute: carry out each instruction's effect. verify: change nothing, but compute each
  // instruction's cost (plan()) for the timing fingerprint and the GM accesses, to check that
  // the recorded timing holds for this launch's arguments (launch_replay.h). issue: change
  // nothing, keep each effect issued in effect order (keep_issued) for the caller to carry out
  // (a program without ld: one that loads needs each value when the walk reaches it).
  enum class Mode { execute, verify, issue };
  // Instructions issued to one pipe (or, for S, scalar stores), not yet executed.
  struct Queue {
    std::vector<IssuedOp> ops;  // [head, size) pending
    size_t head = 0;
    bool empty() const { return head == ops.size(); }
  };
  using Queues = std::array<Queue, isa::kNumExecPipes>;
  // queues: storage to use for the pipe queues (emptied here, capacity kept), so that a thread
  // replaying many cores allocates it once (a core's queues are ~90 KB); null: the core's own.
  FunctionalCore(const ChipConfig& cfg, const CoreKindConfig& kind, CoreMemory& local,
                 DeviceMemory& gm, const std::vector<uint8_t>& order, bool functional,
                 Mode mode = Mode::execute, Queues* queues = nullptr);
  FunctionalCore(const FunctionalCore&) = delete;
  FunctionalCore& operator=(const FunctionalCore&) = delete;

  // Execute mode of a functional run: also keep every effect taken in `out` (appended, with
  // the SectionRun of the block it came from). A program that loads (ld) cannot be kept so:
  // its effects depend on the data it reads; kept_all() is then false.
  void keep_effects(PreparedEffects* out) { m_keep = out; }
  bool kept_all() const { return m_keep && !m_keep_failed; }
  // Verify mode of a functional run (and issue mode): also keep every effect the blocks issue,
  // in effect order, in `out` (appended). The ld values the walk uses are the launch's own only if the check
  // passes (no core loads bytes the launch writes), and only then are they the replay's.
  void keep_issued(IssuedEffects* out) { m_issued = out; }
  // Runs one block of `run` to its `end`. Throws KernelFault if the block does not match the
  // recorded order (it cannot, for the launch that was recorded) or an instruction faults;
  // fault_pc() then names the instruction.
  void run_block(const SectionRun& run, const BlockIdentity& id);
  uint32_t fault_pc() const { return m_pc; }
  // Every recorded step was replayed (check after the core's last block).
  bool finished() const { return m_next == m_order.size(); }
  // Verify mode, of the blocks run: the timing fingerprint; the GM ranges of the timed
  // transfers (one per pipe instruction with GM ranges, transfer_sizes() ranges each), in
  // execution order; the scalar stores' ranges.
  const CoreFingerprint& fingerprint() const { return m_fingerprint; }
  const std::vector<GmAccess>& transfer_ranges() const { return m_ranges; }
  const std::vector<uint32_t>& transfer_sizes() const { return m_sizes; }
  const std::vector<uint8_t>& transfer_pipes() const { return m_pipes; }  // each transfer's pipe
  const std::vector<GmAccess>& stores() const { return m_stores; }
  // Verify mode: the scalar loads' ranges.
  const std::vector<GmAccess>& loads() const { return m_loads; }

 private:
  // Executes recorded steps while the pipe each names has an instruction issued.
  void execute_ready();
  // Executes op (a pipe instruction, or a scalar st or ld when S).
  void take_effect(const IssuedOp& op);

  ExecContext m_ctx;
  PreparedEffects* m_keep = nullptr;
  IssuedEffects* m_issued = nullptr;
  const SectionRun* m_run = nullptr;  // of the block running
  bool m_keep_failed = false;
  const std::vector<uint8_t>& m_order;
  size_t m_next = 0;  // next step of m_order
  const bool m_functional;
  const bool m_verify;
  const bool m_issue;
  CoreFingerprint m_fingerprint;
  std::vector<GmAccess> m_ranges, m_stores, m_loads;
  int64_t m_loaded = 0;  // the value the last ld read
  std::vector<uint32_t> m_sizes;
  std::vector<uint8_t> m_pipes;
  Queues m_own_queues;  // unused when the caller lends storage
  Queues& m_queues;
  ScalarState m_scalar;
  uint32_t m_pc = 0;
};

}  // namespace npusim
