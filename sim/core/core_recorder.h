// The probe points at which an AI core reports what the replay of a launch needs (the recorder
// is sim/replay/core_recording.h). A recorder is attached to a core (AiCore::attach_recorder)
// only while its launch is being recorded, so a run that is not recorded pays one null test per
// probe point.
#pragma once

#include <cstdint>

#include "isa/isa.h"
#include "sim/exec/exec.h"

namespace npusim {

class CoreRecorder {
 public:
  virtual ~CoreRecorder() = default;
  // The scalar unit executes the instruction at `pc` (`end` included), in program order.
  virtual void on_scalar_pc(uint32_t pc) = 0;
  // The scalar ld (access.write false) or st at `pc` took effect on its 8 GM bytes.
  virtual void on_scalar_gm(uint32_t pc, const GmAccess& access) = 0;
  // Pipe instruction `pc` took effect on `pipe` with `cost` (its plan(), GM ranges included).
  // With on_scalar_gm, in the order effects take place on this core.
  virtual void on_pipe_op(isa::Pipe pipe, uint32_t pc, const ExecCost& cost) = 0;
  // A pipe instruction of `pipe` hands its GM transfer to the memory system (its L2 lookup),
  // before it takes effect (on_pipe_op). Pipes overlap, so a core's transfers reach the memory
  // system in an order that may differ from the order they take effect in; within one pipe
  // both orders are the same.
  virtual void on_gm_transfer(isa::Pipe pipe) = 0;
};

}  // namespace npusim
