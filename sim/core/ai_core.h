// One AI core (aic, aiv or coupled aicore): a scalar unit that fetches the block's instructions
// in program order, and one process per pipe (MTE1, MTE2, MTE3, M, V, FIX, those the core kind
// has), each popping its bounded instruction queue in order. Pipes run concurrently and are
// ordered only by flags (set_flag / wait_flag), barriers and cross-core flags. The contract and
// the timing equations are in docs/chip_model.md.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <systemc>
#include <tlm>
#include <tlm_utils/simple_initiator_socket.h>

#include "isa/isa.h"
#include "sim/chip/gm_transfer.h"
#include "sim/core/core_env.h"
#include "sim/core/core_recorder.h"
#include "sim/core/scalar_state.h"
#include "sim/counters/counters.h"
#include "sim/exec/exec.h"

namespace npusim {

class AiCore : public sc_core::sc_module {
 public:
  // chip_index: position among all cores of the chip; kind_index: position among cores of its
  // kind (what get_core_id returns). Counters register under `counters` (e.g. "chip.aic0").
  AiCore(sc_core::sc_module_name name, int chip_index, int kind_index,
         const CoreKindConfig& kind, CoreEnv& env, const CounterGroup& counters);
  ~AiCore() override;

  // GM port: bound to the memory system.
  tlm_utils::simple_initiator_socket<AiCore> gm_port;

  int chip_index() const { return m_chip_index; }
  int kind_index() const { return m_kind_index; }
  isa::CoreKind core_kind() const { return m_kind.kind; }
  const std::string& core_name() const { return m_name; }
  // The section of the block being (or last) run; nullptr before the first block.
  const isa::Section* current_section() const { return m_run ? m_run->section : nullptr; }
  // The section run (its section and launch) of the block being (or last) run; nullptr before
  // the first block. A concurrent group's recorder tells its launches apart by it.
  const SectionRun* current_run() const { return m_run; }
  // The core's abort signal: the chip raises it when the launch the core runs faults or is
  // aborted, and clears it when the launch ends (its transfers in the memory system wait on it
  // too). Launches beside each other on disjoint cores are aborted apart.
  AbortSignal& abort_signal() { return m_abort; }

  const CoreKindConfig& kind_config() const { return m_kind; }
  // The core's buffers (L1, L0A/B/C, UB, ...). The launch replay runs blocks on them directly
  // between launches, so buffer contents carry over from block to block as in a simulated run.
  CoreMemory& local() { return *m_local; }
  // The blocks this core was given in the launch now ending, in order: what the launch replay
  // records (cleared by reset()).
  struct AssignedBlock {
    const SectionRun* run;
    int block, subblock;
  };
  const std::vector<AssignedBlock>& assigned_blocks() const { return m_assigned_blocks; }
  // Attaches `recorder` (nullptr: none) to the core's probe points (sim/core/core_recorder.h):
  // the chip attaches one while a launch is being recorded. Zero time.
  void attach_recorder(CoreRecorder* recorder) { m_recorder = recorder; }

  // Starts `run` as block `block` (subblock `subblock`) now. The core must be idle. Zero time.
  void assign_block(const SectionRun& run, int block, int subblock);
  bool idle() const { return !m_assigned && !m_running; }

  // Between launches, with every process idle: raises the buffer high-water counters to this
  // launch's marks, then clears queues, flags, cross-core counts, the marks and all per-block
  // state, so the next launch starts clean.
  void reset();

  // Cross-core flag `id` posted to this core by a cc_set; `flow` links it in the trace.
  void post_cross_core(int id, uint64_t flow);
  int cross_core_pending(int id) const;

  // For the deadlock report: one line per flag / cross-core wait a process of this core is
  // blocked in, e.g. "core aic0 pc 12 (k.s:30) wait_flag mte2, m, 1 never set".
  std::vector<std::string> blocked_waits() const;
  // "pc 12 (k.s:30)" for this core's current section.
  std::string where(uint32_t pc, const isa::Instruction* in) const;

 private:
  // What a process is blocked on (for the deadlock report).
  struct Blocked {
    const isa::Instruction* insn = nullptr;  // nullptr: not blocked on a flag
    uint32_t pc = 0;
  };
  // What one process of the core (the scalar unit or a pipe) blocks on besides its own
  // condition: its abort wake-up (AbortSignal::wake_on_raise), alone and with the core's flag
  // event.
  struct Waiter {
    explicit Waiter(AbortSignal& abort, const sc_core::sc_event& flag_event);
    sc_core::sc_event abort;
    sc_core::sc_event_or_list flag_or_abort;
  };
  struct PipeUnit;
  struct Flag {
    bool set = false;
    // When the set takes effect: the setting pipe's GM transfers issued before the set_flag have
    // landed by then. A wait_flag that finds the flag set waits until this time.
    sc_core::sc_time effective_at = sc_core::SC_ZERO_TIME;
    uint64_t flow = 0;
  };
  struct CrossCoreFlag {
    std::deque<uint64_t> flows;  // one entry per pending set (its trace flow id)
  };
  static constexpr int kMaxFlagIds = 16;  // the U4 id field

  void scalar_thread();
  void pipe_thread(PipeUnit& u);
  void run_block();
  // Executes scalar-unit instruction `in` at `pc`; returns the next pc.
  uint32_t exec_scalar(const isa::Instruction& in, uint32_t pc);
  void issue(const isa::Instruction& in, uint32_t pc, isa::Pipe pipe);
  void run_pipe_op(PipeUnit& u, const IssuedOp& op);
  void run_gm_transfer(PipeUnit& u, const ExecCost& cost);

  // Flags. set_flag faults if the flag is already set; the set takes effect at `effective_at`
  // (not before now). wait_flag blocks until the flag is set and in effect, then clears it.
  void check_flag_operands(int src, int dst, int id) const;
  void set_flag(Lane lane, int src, int dst, int id, sc_core::sc_time effective_at);
  void wait_flag(Lane lane, Waiter& w, int src, int dst, int id, Blocked& blocked, uint32_t pc,
                 const isa::Instruction& in, Counter& stall);
  void wait_cross_core(Lane lane, Waiter& w, int id, Blocked& blocked, uint32_t pc,
                       const isa::Instruction& in, Counter& stall);
  void check_pipe_operand(isa::Pipe p, const char* what) const;

  // UnitFlag (isa::UnitFlag, docs/chip_model.md "UnitFlag"): an mmad chain with unit flags and
  // the fixpipe .uf3 that drains its tile synchronise through the tile itself, keyed by its L0C
  // byte address (the mmads' xc, the fixpipe's xsrc), with no flag between M and FIX.
  struct UnitFlagTile {
    bool chain_begun = false;   // an mmad with a unit flag into the tile has started
    bool last_started = false;  // the chain's .uf3 mmad has started (the tile is complete at
                                // last_end); cleared when the fixpipe has drained the tile
    sc_core::sc_time last_start = sc_core::SC_ZERO_TIME, last_end = sc_core::SC_ZERO_TIME;
    uint64_t last_l0c_bytes = 0;  // the L0C bytes the .uf3 mmad writes
    bool last_executed = false;   // the .uf3 mmad has taken effect (the fixpipe's data is there)
  };
  // An mmad with a unit flag: waits while the tile's previous chain is not drained (a stall
  // like a wait_flag's), then marks the chain begun and, for .uf3, its last mmad started now,
  // ending after cost.cycles.
  void unit_flag_mmad(PipeUnit& u, const IssuedOp& op, const ExecCost& cost, UnitFlagTile& t);
  // A fixpipe .uf3, once its chain has begun (the caller waited): moves the tile at the pipe's
  // rate as the last mmad completes it, 512 L0C bytes at a time; returns when the last unit
  // has moved (the fixpipe's data then lands as its GM transfer's latency says).
  void unit_flag_fixpipe(PipeUnit& u, const IssuedOp& op, const ExecCost& cost, UnitFlagTile& t);
  // Clears every flag (those set are counted in m_flags_set).
  void clear_flags();

  // Scalar time not yet spent in simulated time (the scalar unit runs ahead of sc_time between
  // instructions that interact with other processes); sync_local() spends it.
  void sync_local();
  void wait_drained(PipeUnit& u);
  // Until every GM transfer issued by u has landed (its latency tail elapsed).
  void wait_transfers_complete(PipeUnit& u);
  void wait_all_drained();
  void wait_abortable(const sc_core::sc_event_or_list& events);
  // Waits t, or until the launch is aborted (w: the calling process's Waiter).
  void wait_abortable(const sc_core::sc_time& t, Waiter& w);
  PipeUnit* pipe_unit(isa::Pipe p) const { return m_pipes[static_cast<int>(p)].get(); }
  void notify_instruction(Lane lane, const sc_core::sc_time& start, const sc_core::sc_time& end,
                          uint32_t pc, const isa::Instruction& in);
  Counter& insn_counter(const CounterGroup& group, std::array<Counter*, isa::kNumOpcodes>& cache,
                        isa::Opcode op);
  // Counts one `op` in its insn.<mnemonic> counter (registered on first use).
  void count_insn(const CounterGroup& group, std::array<Counter*, isa::kNumOpcodes>& cache,
                  isa::Opcode op) {
    Counter* c = cache[static_cast<size_t>(op)];
    (c ? *c : insn_counter(group, cache, op)).inc();
  }

  const int m_chip_index, m_kind_index;
  const CoreKindConfig& m_kind;
  CoreEnv& m_env;
  const ChipConfig& m_cfg;
  AbortSignal m_abort;  // see abort_signal(); declared before the Waiters that register on it
  // The launch of the block being (or last) run (SectionRun::launch; nullptr before the first).
  const LaunchInfo* m_launch = nullptr;
  // The environment's device memory and the observers that want instructions and flag edges
  // (CoreEnv returns the same objects for the chip's life): read per instruction, so looked up
  // once.
  DeviceMemory& m_gm;
  const std::vector<ChipObserver*>& m_observers;
  const std::string m_name;
  std::unique_ptr<CoreMemory> m_local;  // L1/L0/UB/BT/FB, allocated in functional mode

  // Pipes present, indexed by isa::Pipe (S and absent pipes are null).
  std::array<std::unique_ptr<PipeUnit>, isa::kNumExecPipes> m_pipes;
  std::vector<PipeUnit*> m_pipe_list;

  // Block state.
  const SectionRun* m_run = nullptr;
  int m_block = 0, m_subblock = 0;
  bool m_assigned = false, m_running = false;
  std::vector<AssignedBlock> m_assigned_blocks;  // this launch's blocks, in order
  CoreRecorder* m_recorder = nullptr;            // see attach_recorder()
  sc_core::sc_event m_assign_event;
  ScalarState m_scalar;  // registers and special registers of the running block
  sc_core::sc_time m_local_time;
  uint32_t m_pc = 0;
  Blocked m_scalar_blocked;

  // Flags [src pipe][dst pipe][id], and cross-core flags by id.
  std::array<std::array<std::array<Flag, kMaxFlagIds>, isa::kNumExecPipes>, isa::kNumExecPipes>
      m_flags{};
  std::array<CrossCoreFlag, kMaxFlagIds> m_cross_core{};
  int m_flags_set = 0;  // flags in m_flags now set: clearing them is skipped when 0
  // The core got a block or a cross-core flag since the last reset(): only then has it state
  // to clear (a launch with few blocks leaves most cores of a large chip untouched).
  bool m_touched = false;
  // UnitFlag state by L0C address; cleared with the flags (a block starts with none).
  std::unordered_map<int64_t, UnitFlagTile> m_unit_flag_tiles;
  sc_core::sc_event m_flag_event;  // any flag, cross-core flag or unit flag of this core changed
  Waiter m_scalar_wait;            // the scalar unit's

  // Counters.
  CounterGroup m_counters, m_scalar_counters;
  Counter& m_active_cycles;
  Counter& m_blocks;
  Counter& m_scalar_busy;
  Counter& m_scalar_issued;
  Counter& m_stall_queue_full;
  Counter& m_stall_scalar_flag;
  Counter& m_stall_scalar_cross_core;
  Counter& m_stall_barrier;
  std::array<Counter*, isa::kNumOpcodes> m_scalar_insn{};
  // "buffer.<buf>.high_water" per buffer the core has (null for absent buffers): the highest
  // byte offset (addr + bytes) any instruction touched in it, in bytes (a high-water counter).
  std::array<Counter*, isa::kNumBufs> m_buffer_high_water{};
};

}  // namespace npusim
