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
  explicit CoreRecording(CoreEnv& env) : m_env(env) {}

  void on_scalar_pc(uint32_t pc) override { m_fingerprint.add_pc(pc); }
  void on_scalar_gm(uint32_t pc, const GmAccess& access) override;
  void on_pipe_op(isa::Pipe pipe, uint32_t pc, const ExecCost& cost) override;
  void on_gm_transfer(isa::Pipe pipe) override;
  // Frees the records: the launch is no longer recorded (no probe follows).
  void drop();

  // One entry per pipe instruction that took effect (its pipe) or scalar ld / st (isa::Pipe::S),
  // sync instructions left out, in the order they took effect: the replay executes in this
  // order.
  const std::vector<uint8_t>& exec_order() const { return m_exec_order; }
  // The GM ranges the core's instructions touched, in the same order.
  const std::vector<GmAccess>& gm_accesses() const { return m_gm_accesses; }
  // For each instruction with GM ranges (pipe instructions, ld, st), in the same order: its pc
  // and the index of its first range in gm_accesses() (its ranges run to the next one's first,
  // or to the end).
  struct GmOp {
    uint32_t pc, first;
  };
  const std::vector<GmOp>& gm_ops() const { return m_gm_ops; }
  // The pipe of each GM transfer, in the order the transfers reached the memory system (its
  // L2 lookups, MemorySystem::transfer_order), not the order they took effect in.
  const std::vector<uint8_t>& transfer_pipes() const { return m_transfer_pipes; }
  // The run's timing fingerprint (sim/replay/fingerprint.h).
  const CoreFingerprint& fingerprint() const { return m_fingerprint; }

 private:
  CoreEnv& m_env;
  std::vector<uint8_t> m_exec_order;
  std::vector<GmAccess> m_gm_accesses;
  std::vector<GmOp> m_gm_ops;
  std::vector<uint8_t> m_transfer_pipes;
  CoreFingerprint m_fingerprint;
};

}  // namespace npusim
