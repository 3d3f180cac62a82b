// The per-instruction view of kernel launches, like the Ascend op simulator's instruction table:
// an observer of the chip (sim/counters/observer.h; attach it with Simulator::add_observer) that
// counts, for every instruction of every launch, how often it ran (summed over the cores that ran
// it) and how long it kept its unit busy. Its busy times are defined exactly as the chip's
// busy_cycles counters, so per launch and lane they add up to those counters:
//   sum of busy over a pipe lane's rows  = sum over cores of <pipe>.busy_cycles (pipes mte1, mte2,
//                                          mte3, m, v, fix)
//   sum of busy over the SCALAR rows + S x (calls of all pipe-lane rows) = sum of s.busy_cycles
// (S = scalar_cycles_per_insn; every pipe instruction also took one issue slot of the scalar unit).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "isa/isa.h"
#include "sim/config/chip_config.h"
#include "sim/counters/observer.h"

namespace npusim::prof {

// One instruction of one section of a launched kernel, summed over the cores that ran it.
struct InstructionStat {
  isa::CoreKind section = isa::CoreKind::AICORE;  // the section (core kind) it belongs to
  uint32_t pc = 0;
  std::string location;      // "file.s:42" (the file alone if the line is unknown)
  std::string text;          // isa::disassemble(instruction, section)
  Lane lane = Lane::SCALAR;  // the unit that executed it
  uint64_t calls = 0;
  // Picoseconds it kept its unit busy, as that unit's busy_cycles counter counts: a pipe
  // instruction's execution (for a GM transfer its bandwidth phase); S cycles for each
  // scalar-unit instruction except `end`; 0 for set_flag, wait_flag, cc_set, cc_wait on a pipe.
  uint64_t busy_ps = 0;
  // Picoseconds it held its lane beyond busy_ps: waiting for a flag or cross-core flag, for GM
  // data to land (set_flag after a transfer), in pipe_barrier, or (`end`) for the pipes to drain.
  uint64_t wait_ps = 0;
};

struct InstructionTable {
  std::string kernel;  // isa::Program::name
  bool ok = true;      // the launch ended without a fault or deadlock
  std::vector<InstructionStat> rows;  // instructions that ran: sections in program order, by pc
};

class InstructionProfiler : public ChipObserver {
 public:
  // The chip's scalar_cycles_per_insn gives the scalar unit's busy time per instruction.
  explicit InstructionProfiler(const ChipConfig& cfg);

  // One table per launch seen (in launch order) since construction or the last take().
  const std::vector<std::shared_ptr<const InstructionTable>>& launches() const {
    return m_launches;
  }
  // The tables, leaving none.
  std::vector<std::shared_ptr<const InstructionTable>> take();

  void on_core(int core, const std::string& name) override {}
  void on_kernel_begin(const isa::Program& prog, int block_dim, uint64_t t_ps) override;
  void on_kernel_end(const isa::Program& prog, uint64_t t_ps, bool ok) override;
  void on_instruction(int core, Lane lane, uint64_t start_ps, uint64_t end_ps, uint32_t pc,
                      const isa::Instruction& in, const isa::Section& section) override;
  void on_flow_begin(int core, Lane lane, uint64_t t_ps, uint64_t flow) override {}
  void on_flow_end(int core, Lane lane, uint64_t t_ps, uint64_t flow) override {}
  void on_hdc(bool host_to_device, uint64_t start_ps, uint64_t end_ps, uint64_t bytes) override {}

 private:
  struct Acc {
    uint64_t calls = 0, busy_ps = 0, wait_ps = 0;
    Lane lane = Lane::SCALAR;
  };
  struct SectionAcc {
    const isa::Section* section;
    std::vector<Acc> by_pc;
  };
  std::vector<Acc>& accumulators(const isa::Section& section);

  uint64_t m_scalar_ps;
  std::vector<SectionAcc> m_sections;  // of the launch in progress (at most one per core kind)
  std::vector<std::shared_ptr<const InstructionTable>> m_launches;
};

// The counter name of the pipe behind a lane: SCALAR "s", MTE1 "mte1", CUBE "m", VECTOR "v",
// FIXP "fix" (the ISA's pipe names, as in chip.<core>.<pipe>.busy_cycles).
const char* lane_counter_pipe(Lane lane);

}  // namespace npusim::prof
