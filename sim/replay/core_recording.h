// One core's record of a launch for its replay (sim/replay/launch_replay.h): the order in which
// its instructions took effect, the GM ranges they touched and its timing fingerprint. The chip
// attaches one to every core while a launch is being recorded (Chip::begin_launch) and reports
// the host memory it grows by to CoreEnv::recorded, which drops the records of a launch that
// grows past its bound.
#pragma once

#include <cstdint>
#include <vector>

#include "sim/core/core_env.h"
#include "sim/core/core_recorder.h"
#include "sim/replay/fingerprint.h"

namespace npusim {

class CoreRecording final : public CoreRecorder {
 public:
  // lean: record only what a timing-only replay by translation needs (record_translation,
  // sim/replay/launch_replay.h): the GM ranges written, with their pcs, and spans(); no effect
  // order, fingerprint, transfer pipes or ranges read. A long launch then records a fraction
  // of the bytes (its reads are most of its ranges) and stays under the recording's bound.
  explicit CoreRecording(CoreEnv& env, bool lean = false) : m_env(env), m_lean(lean) {}
  // Also append `core` (the core's chip index) to *effects for each entry of exec_order(): the
  // chip's order of effects across all its cores, which a launch whose cores hand each other
  // data (cross-core flags) replays in (RecordedLaunch::effect_cores). Not with lean.
  void order_across_cores(std::vector<uint16_t>* effects, uint16_t core) {
    m_effects = effects;
    m_core = core;
  }

  void on_scalar_pc(uint32_t pc) override {
    if (!m_lean) m_fingerprint.add_pc(pc);
  }
  void on_scalar_gm(uint32_t pc, const GmAccess& access) override;
  void on_pipe_op(isa::Pipe pipe, uint32_t pc, const ExecCost& cost) override;
  void on_gm_transfer(isa::Pipe pipe) override;
  // Frees the records: the launch is no longer recorded (no probe follows).
  void drop();

  // One entry per pipe instruction that took effect (its pipe) or scalar ld / st (isa::Pipe::S),
  // sync instructions left out, in the order they took effect: the replay executes in this
  // order.
  const std::vector<uint8_t>& exec_order() const { return m_exec_order; }
  bool lean() const { return m_lean; }
  // The GM ranges the core's instructions touched, in the same order (lean: those written).
  const std::vector<GmAccess>& gm_accesses() const { return m_gm_accesses; }
  // For each instruction with GM ranges (pipe instructions, ld, st), in the same order: its pc
  // and the index of its first range in gm_accesses() (its ranges run to the next one's first,
  // or to the end).
  struct GmOp {
    uint32_t pc, first;
  };
  const std::vector<GmOp>& gm_ops() const { return m_gm_ops; }
  // By pc: the span [begin, end) of every GM range (read or written) the instruction at that
  // pc touched in the launch; end 0 if none (pcs of the section the core ran).
  struct Span {
    uint64_t begin = UINT64_MAX, end = 0;
  };
  const std::vector<Span>& spans() const { return m_spans; }
  // The ranges the core's ld instructions read (8 bytes each), in order, a load of the same pc
  // that continues or repeats the previous one joined to it (a core reading a run of indices
  // keeps one range). A program whose loaded values steer it (AddressFlow::steered) replays
  // only where the same bytes lie there again (record_translation keeps them).
  struct Load {
    uint32_t pc;
    uint64_t addr, bytes;
  };
  const std::vector<Load>& loads() const { return m_loads; }
  // The pipe of each GM transfer, in the order the transfers reached the memory system (its
  // L2 lookups, MemorySystem::transfer_order), not the order they took effect in.
  const std::vector<uint8_t>& transfer_pipes() const { return m_transfer_pipes; }
  // The run's timing fingerprint (sim/replay/fingerprint.h).
  const CoreFingerprint& fingerprint() const { return m_fingerprint; }

 private:
  // Notes `access` of the instruction at pc: its span, and (lean: if written) the range.
  // Returns the bytes recorded.
  uint64_t note(uint32_t pc, const GmAccess& access);
  // An exec_order() entry (its pipe), and the core's place in the chip's order if kept.
  // Returns the bytes recorded.
  uint64_t took_effect(isa::Pipe pipe);
  CoreEnv& m_env;
  bool m_lean;
  std::vector<uint16_t>* m_effects = nullptr;  // order_across_cores
  uint16_t m_core = 0;
  std::vector<Span> m_spans;
  std::vector<uint8_t> m_exec_order;
  std::vector<GmAccess> m_gm_accesses;
  std::vector<GmOp> m_gm_ops;
  std::vector<Load> m_loads;
  std::vector<uint8_t> m_transfer_pipes;
  CoreFingerprint m_fingerprint;
};

}  // namespace npusim
