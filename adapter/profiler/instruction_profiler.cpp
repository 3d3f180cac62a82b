#include "adapter/profiler/instruction_profiler.h"

#include <fmt/format.h>

#include "isa/disassembler.h"

namespace npusim::prof {
namespace {

constexpr uint64_t kPsPerCycle = 1000;  // observer.h: 1 AI-core cycle = 1000 ps

// set_flag / wait_flag / cc_set / cc_wait: their time on a pipe is synchronisation, not work.
bool is_sync(const isa::Instruction& in) { return in.desc().pipe == isa::Pipe::SYNC; }

}  // namespace

const char* lane_counter_pipe(Lane lane) {
  switch (lane) {
    case Lane::SCALAR: return "s";
    case Lane::MTE1: return "mte1";
    case Lane::MTE2: return "mte2";
    case Lane::MTE3: return "mte3";
    case Lane::CUBE: return "m";
    case Lane::VECTOR: return "v";
    case Lane::FIXP: return "fix";
  }
  return "?";
}

InstructionProfiler::InstructionProfiler(const ChipConfig& cfg)
    : m_scalar_ps(static_cast<uint64_t>(cfg.scalar_cycles_per_insn) * kPsPerCycle) {}

std::vector<std::shared_ptr<const InstructionTable>> InstructionProfiler::take() {
  std::vector<std::shared_ptr<const InstructionTable>> out;
  out.swap(m_launches);
  return out;
}

void InstructionProfiler::on_kernel_begin(const isa::Program& prog, int block_dim,
                                          uint64_t t_ps) {
  m_sections.clear();
  for (const isa::Section& s : prog.sections)
    m_sections.push_back({&s, std::vector<Acc>(s.code.size())});
}

std::vector<InstructionProfiler::Acc>& InstructionProfiler::accumulators(
    const isa::Section& section) {
  for (SectionAcc& s : m_sections)
    if (s.section == &section) return s.by_pc;
  // A section not of the launched program (cannot happen with the chip's launch protocol).
  m_sections.push_back({&section, std::vector<Acc>(section.code.size())});
  return m_sections.back().by_pc;
}

void InstructionProfiler::on_instruction(int core, Lane lane, uint64_t start_ps, uint64_t end_ps,
                                         uint32_t pc, const isa::Instruction& in,
                                         const isa::Section& section) {
  std::vector<Acc>& by_pc = accumulators(section);
  if (pc >= by_pc.size()) by_pc.resize(pc + 1);
  Acc& a = by_pc[pc];
  const uint64_t span = end_ps > start_ps ? end_ps - start_ps : 0;
  uint64_t busy;
  if (lane == Lane::SCALAR) busy = in.op == isa::Opcode::op_end ? 0 : std::min(span, m_scalar_ps);
  else busy = is_sync(in) ? 0 : span;
  ++a.calls;
  a.busy_ps += busy;
  a.wait_ps += span - busy;
  a.lane = lane;
}

void InstructionProfiler::on_kernel_end(const isa::Program& prog, uint64_t t_ps, bool ok) {
  auto table = std::make_shared<InstructionTable>();
  table->kernel = prog.name;
  table->ok = ok;
  const std::string source = prog.source.empty() ? prog.name : prog.source;
  for (const SectionAcc& s : m_sections) {
    for (uint32_t pc = 0; pc < s.by_pc.size(); ++pc) {
      const Acc& a = s.by_pc[pc];
      if (a.calls == 0) continue;
      InstructionStat row;
      row.section = s.section->kind;
      row.pc = pc;
      if (pc < s.section->code.size()) {
        const isa::Instruction& in = s.section->code[pc];
        row.location = in.src_line ? fmt::format("{}:{}", source, in.src_line) : source;
        row.text = isa::disassemble(in, s.section);
      }
      row.lane = a.lane;
      row.calls = a.calls;
      row.busy_ps = a.busy_ps;
      row.wait_ps = a.wait_ps;
      table->rows.push_back(std::move(row));
    }
  }
  m_sections.clear();
  m_launches.push_back(std::move(table));
}

}  // namespace npusim::prof
