// Probe points of the chip model. Tracing and other optional recorders attach to the chip as
// observers; the model calls every attached observer at these points and does nothing when none
// is attached. Times are simulated picoseconds (1 AI-core cycle = 1000 ps).
#pragma once

#include <cstdint>
#include <string>

#include "isa/isa.h"

namespace npusim {

// The timeline lanes of one core: the scalar unit and one per pipe.
enum class Lane : uint8_t { SCALAR, MTE1, MTE2, MTE3, CUBE, VECTOR, FIXP };
inline constexpr int kNumLanes = 7;
const char* lane_name(Lane l);  // "SCALAR", "MTE1", ..., "FIXP"
Lane lane_of(isa::Pipe p);      // S -> SCALAR, M -> CUBE, V -> VECTOR, FIX -> FIXP, MTEn -> MTEn

class ChipObserver {
 public:
  virtual ~ChipObserver() = default;
  // A core exists: `core` is its chip-wide index, `name` e.g. "aic0". Called at elaboration.
  virtual void on_core(int core, const std::string& name) = 0;
  // A kernel launch begins / ends (ok = no fault and no deadlock).
  virtual void on_kernel_begin(const isa::Program& prog, int block_dim, uint64_t t_ps) = 0;
  virtual void on_kernel_end(const isa::Program& prog, uint64_t t_ps, bool ok) = 0;
  // Instruction `pc` of `section` occupied `lane` of `core` over [start_ps, end_ps).
  virtual void on_instruction(int core, Lane lane, uint64_t start_ps, uint64_t end_ps,
                              uint32_t pc, const isa::Instruction& in,
                              const isa::Section& section) = 0;
  // A synchronisation edge: `flow` (unique per launch sequence) was signalled on (core, lane)
  // and later released a wait on (core, lane).
  virtual void on_flow_begin(int core, Lane lane, uint64_t t_ps, uint64_t flow) = 0;
  virtual void on_flow_end(int core, Lane lane, uint64_t t_ps, uint64_t flow) = 0;
  // A host-device copy over the HDC link.
  virtual void on_hdc(bool host_to_device, uint64_t start_ps, uint64_t end_ps, uint64_t bytes) = 0;
  // Whether this observer needs the instructions and flag edges of the next launch. If no
  // attached observer does, the Simulator may replay a launch it has run before
  // (sim/replay/launch_replay.h): the observers then see only on_kernel_begin / on_kernel_end
  // of it, at the times the simulated run had.
  virtual bool wants_launch_detail() const { return true; }
  // Whether this observer needs on_instruction / on_flow_begin / on_flow_end now. The chip asks
  // after every on_kernel_begin and on_kernel_end (and when observers are attached or removed);
  // the answer may change only at those calls. The cores skip these calls, and reading the time
  // for them, while no attached observer wants them.
  virtual bool wants_instructions() const { return true; }
};

}  // namespace npusim
