// What an AI core needs from the chip around it: fault and block-completion reporting,
// cross-core flags and the observers. The chip implements it; the core knows nothing else of the
// chip. The launch a core runs comes with each block (SectionRun::launch); each core has its
// own abort signal (AiCore::abort_signal), raised by the chip for the cores of a launch that
// faulted, so that launches running beside each other (Chip::begin_concurrent) end apart.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <systemc>

#include "isa/isa.h"
#include "sim/config/chip_config.h"
#include "sim/counters/observer.h"
#include "sim/memory/device_memory.h"

namespace npusim {

class AiCore;

// Simulated time: one AI-core cycle is 1 ns of sc_time; the time resolution is 1 ps, so
// fractional cycles (from bandwidth sharing) are kept to the picosecond.
inline sc_core::sc_time cycles_to_time(double cycles) {
  return sc_core::sc_time(cycles, sc_core::SC_NS);
}
inline uint64_t time_ps(const sc_core::sc_time& t) { return t.value(); }
inline uint64_t now_ps() { return sc_core::sc_time_stamp().value(); }
inline double time_to_cycles(const sc_core::sc_time& t) { return t.value() / 1000.0; }
// The simulated time a launch may not pass (it is stopped with an error at its last event
// before): half of sc_time's range of 2^64 ps. No single wait a valid config allows is longer
// than 2^62 ps (sim/config/config_loader.cpp bounds every transfer to 2^52 cycles and every
// latency to 2^20), so nothing scheduled before this time passes the end of the range.
inline constexpr uint64_t kSimTimeLimitPs = uint64_t{1} << 63;

// Thrown inside the model's threads to unwind them after the kernel was aborted.
struct Aborted {};

// One per AI core (AiCore::abort_signal). The chip raises the signals of a launch's cores on
// its first fault (or the driver after a deadlock): every blocking wait of the core's threads,
// and of the memory system's transfers they started (GmTransfer::abort_signal), also waits on
// event(), or on an event of its own registered with wake_on_raise(), and throws Aborted once
// active().
class AbortSignal {
 public:
  bool active() const { return m_active; }
  const sc_core::sc_event& event() const { return m_event; }
  // `e` is notified (delta) with event() whenever the signal is raised. A process that blocks
  // very often (a core's scalar unit and pipes: every instruction) waits on its own event
  // rather than on event(): SystemC removes a woken process from every event it waited on by
  // a linear search of that event's waiters, and event() has every waiting process of the
  // chip among them. `e` must outlive the signal's use.
  void wake_on_raise(sc_core::sc_event& e) { m_wake.push_back(&e); }
  void raise() {
    if (m_active) return;
    m_active = true;
    m_event.notify(sc_core::SC_ZERO_TIME);
    for (sc_core::sc_event* e : m_wake) e->notify(sc_core::SC_ZERO_TIME);
  }
  void clear() { m_active = false; }
  void check() const {
    if (m_active) throw Aborted{};
  }

 private:
  bool m_active = false;
  sc_core::sc_event m_event;
  std::vector<sc_core::sc_event*> m_wake;
};

// What the scalar unit needs of one legal instruction, decoded once per launch instead of per
// execution (the scalar loop of a conv kernel runs millions of instructions).
struct DecodedInsn {
  bool legal = false;             // SectionRun::illegal[pc] is ""
  isa::Pipe pipe = isa::Pipe::S;  // Instruction::exec_pipe()
  uint32_t reg_fields = 0;        // bit i: field i names a register to read (else an immediate)
  // exec_scalar_local executes it (is_scalar_local): it reads and writes only the scalar
  // state, so the core runs it without looking at time or any other process.
  bool local = false;
};

// One section of the running program as a core executes it, with the per-instruction legality
// checks and decoding done once per launch.
struct LaunchInfo;
struct SectionRun {
  const isa::Section* section = nullptr;
  const LaunchInfo* launch = nullptr;  // the launch the section runs in (outlives the launch)
  std::vector<std::string> illegal;  // per pc: why the instruction is illegal, or ""
  std::vector<DecodedInsn> decoded;  // per pc; meaningful only where illegal[pc] is ""
};

struct LaunchInfo {
  const isa::Program* program = nullptr;
  const std::vector<uint64_t>* args = nullptr;
  int block_dim = 0;
  bool functional = true;
  // Watchdog: instructions a block may execute (0: no limit), from SimOptions'
  // max_insns_per_block by watchdog_budget() (sim/simulator.h).
  uint64_t max_insns_per_block = 0;
  // The launch is being recorded for replay: every core has a recorder attached
  // (sim/core/core_recorder.h). Cleared during the launch once the recording passes
  // record_max_bytes (CoreEnv::recorded): the records are dropped and the launch is not
  // replayable.
  bool record = false;
  uint64_t record_max_bytes = 0;
};

class CoreEnv {
 public:
  virtual ~CoreEnv() = default;
  virtual const ChipConfig& config() const = 0;
  virtual DeviceMemory& gm() = 0;
  virtual const std::vector<ChipObserver*>& observers() const = 0;
  // The observers that want instructions and flag edges now (ChipObserver::wants_instructions):
  // the same vector object for the chip's life, its contents updated between calls.
  virtual const std::vector<ChipObserver*>& instruction_observers() const = 0;
  // A core recorded `bytes` more for the launch's replay (LaunchInfo::record). Zero time.
  virtual void recorded(uint64_t bytes) = 0;
  // A fresh id for a flow (flag edge) in the trace.
  virtual uint64_t new_flow_id() = 0;
  // Records the launch's first fault (later ones are ignored) and aborts every core.
  virtual void fault(const AiCore& core, uint32_t pc, const isa::Instruction* in,
                     const std::string& what) = 0;
  // The core finished its block (all its pipes drained). Zero time; may assign the next block.
  virtual void block_done(AiCore& core) = 0;
  // cc_set from `core` (executed on `lane`) with `mode` and flag `id`: posts the flag to the
  // cores the mode names. Throws KernelFault naming what is illegal.
  virtual void cross_core_set(AiCore& core, Lane lane, int mode, int id) = 0;
};

}  // namespace npusim
