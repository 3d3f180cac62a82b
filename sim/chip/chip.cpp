#include "sim/chip/chip.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "isa/disassembler.h"
#include "sim/replay/core_recording.h"

namespace npusim {

using isa::CoreKind;
using sc_core::sc_time_stamp;

namespace {
constexpr uint64_t kPsPerCycle = 1000;

// The instruction as text for messages; safe for opcodes outside the table.
std::string insn_text(const isa::Instruction& in, const isa::Section* section) {
  if (static_cast<int>(in.op) >= isa::kNumOpcodes)
    return fmt::format("<opcode {}>", static_cast<int>(in.op));
  return isa::disassemble(in, section);
}
}  // namespace

Chip::Chip(sc_core::sc_module_name name, const ChipConfig& cfg, DeviceMemory& gm,
           CounterRegistry& counters, std::vector<ChipObserver*> observers,
           const std::string& counter_root)
    : sc_module(name),
      m_counter_root(counter_root.empty() ? std::string(basename()) : counter_root),
      m_cfg(cfg),
      m_gm(gm),
      m_observers(std::move(observers)),
      m_total_cycles(counters.add(m_counter_root + ".total_cycles", "cycles",
                                  "cycles spent running kernels (launch to last block done)",
                                  kPsPerCycle)),
      m_task_overhead_cycles(counters.add(
          m_counter_root + ".task_overhead_cycles", "cycles",
          "task overheads in the launches' durations: dispatch, the block starts of the worker "
          "that ended last, completion (docs/chip_model.md)",
          kPsPerCycle)),
      m_launches(counters.add(m_counter_root + ".launches", "launches",
                              "kernel launches run")),
      m_failed_launches(counters.add(m_counter_root + ".failed_launches", "launches",
                                     "kernel launches that faulted or deadlocked")) {
  const CounterGroup chip(counters, m_counter_root);
  int index = 0;
  for (const CoreKindConfig& kind : cfg.core_kinds) {
    for (int i = 0; i < kind.count; ++i, ++index) {
      const std::string core_name = fmt::format("{}{}", isa::core_kind_name(kind.kind), i);
      m_cores.push_back(std::make_unique<AiCore>(core_name.c_str(), index, i, kind, *this,
                                                 chip.sub(core_name)));
      for (ChipObserver* o : m_observers) o->on_core(index, core_name);
    }
  }
  m_memory = std::make_unique<MemorySystem>("memory", cfg, m_abort, chip);
  for (auto& core : m_cores) core->gm_port.bind(m_memory->port);
  m_hdc = std::make_unique<HdcLink>("hdc", cfg, chip.sub("hdc"), m_observers);
  SC_METHOD(dispatch_blocks);
  sensitive << m_worker_freed;
  dont_initialize();
  SC_METHOD(start_blocks);
  sensitive << m_block_start_due;
  dont_initialize();
}

void Chip::add_observer(ChipObserver* observer) {
  if (std::find(m_observers.begin(), m_observers.end(), observer) != m_observers.end()) return;
  m_observers.push_back(observer);
  for (const auto& core : m_cores) observer->on_core(core->chip_index(), core->basename());
}

void Chip::remove_observer(ChipObserver* observer) {
  m_observers.erase(std::remove(m_observers.begin(), m_observers.end(), observer),
                    m_observers.end());
}

void Chip::dispatch_blocks() {
  if (m_abort.active()) return;
  m_scheduler.dispatch_free();
  schedule_starts();
}

void Chip::start_blocks() {
  if (m_abort.active()) return;
  m_scheduler.start_due();
  schedule_starts();
}

void Chip::schedule_starts() {
  // An earlier pending notification stays (sc_event keeps the earliest); starts are handed
  // out in time order, so the earliest is the queue's front.
  if (auto t = m_scheduler.next_start()) m_block_start_due.notify(*t - sc_time_stamp());
}

void Chip::stop_at_time_limit() {
  m_fault = fmt::format("simulated time would pass {} ps (cycle {}), half of SystemC's range "
                        "of 2^64 ps: the launch (begun at cycle {}) is stopped at cycle {}; later "
                        "launches get the time that remains (a chip this slow needs shorter "
                        "kernels)",
                        kSimTimeLimitPs, kSimTimeLimitPs / kPsPerCycle,
                        time_ps(m_start) / kPsPerCycle, time_ps(sc_time_stamp()) / kPsPerCycle);
  m_end = sc_time_stamp();
  raise_abort();
}

Chip::~Chip() = default;

const SectionRun& Chip::prepare_section(const isa::Section& s) {
  auto run = std::make_unique<SectionRun>();
  run->section = &s;
  run->illegal.reserve(s.code.size());
  run->decoded.assign(s.code.size(), DecodedInsn{});
  for (size_t pc = 0; pc < s.code.size(); ++pc) {
    const isa::Instruction& in = s.code[pc];
    if (static_cast<int>(in.op) >= isa::kNumOpcodes) {
      run->illegal.push_back(fmt::format("opcode {} is not in the instruction set",
                                         static_cast<int>(in.op)));
      continue;
    }
    auto why = isa::illegal_operand(in);
    run->illegal.push_back(why ? *why : std::string());
    if (why) continue;
    DecodedInsn& d = run->decoded[pc];
    d.legal = true;
    d.pipe = in.exec_pipe();
    d.local = d.pipe == isa::Pipe::S && is_scalar_local(in.op);
    const auto& fields = in.desc().fields;
    for (size_t f = 0; f < fields.size(); ++f) {
      const isa::FieldKind k = fields[f].kind;
      if (k == isa::FieldKind::Reg || (isa::field_is_reg_or_imm(k) && in.ops[f].is_reg))
        d.reg_fields |= 1u << f;
    }
  }
  m_runs.push_back(std::move(run));
  return *m_runs.back();
}

std::vector<TaskScheduler::Worker> Chip::make_workers(const isa::Program& program) {
  auto cores_of = [&](CoreKind k) {
    std::vector<AiCore*> v;
    for (auto& c : m_cores)
      if (c->core_kind() == k) v.push_back(c.get());
    return v;
  };
  auto single = [&](CoreKind k, const isa::Section& s) {
    const SectionRun& run = prepare_section(s);
    std::vector<TaskScheduler::Worker> workers;
    for (AiCore* c : cores_of(k)) workers.push_back({{{c, &run, 0}}, 0, -1});
    if (workers.empty())
      throw Error(fmt::format("kernel '{}': chip '{}' has no {} cores", program.name, m_cfg.name,
                              isa::core_kind_name(k)));
    return workers;
  };
  m_mix = false;
  if (!m_cfg.split) {
    const isa::Section* s = program.find(CoreKind::AICORE);
    if (!s && program.sections.size() == 1) s = &program.sections.front();
    if (!s)
      throw Error(fmt::format("kernel '{}' has {} sections and none is 'aicore'; chip '{}' is "
                              "coupled, so one section must run on every AI core", program.name,
                              program.sections.size(), m_cfg.name));
    return single(CoreKind::AICORE, *s);
  }
  const isa::Section* aic = program.find(CoreKind::AIC);
  const isa::Section* aiv = program.find(CoreKind::AIV);
  if (!aic && !aiv)
    throw Error(fmt::format("kernel '{}' has no aic or aiv section; chip '{}' is split into "
                            "cube and vector cores", program.name, m_cfg.name));
  if (!aic || !aiv) return aic ? single(CoreKind::AIC, *aic) : single(CoreKind::AIV, *aiv);
  // Mix kernel: one cube core with aiv_per_aic vector cores per block.
  m_mix = true;
  const SectionRun& aic_run = prepare_section(*aic);
  const SectionRun& aiv_run = prepare_section(*aiv);
  const std::vector<AiCore*> cubes = cores_of(CoreKind::AIC), vecs = cores_of(CoreKind::AIV);
  const int per = std::max(1, m_cfg.aiv_per_aic);
  const size_t groups = std::min(cubes.size(), vecs.size() / static_cast<size_t>(per));
  if (groups == 0)
    throw Error(fmt::format("kernel '{}' is a mix kernel but chip '{}' has no group of one aic "
                            "and {} aiv cores", program.name, m_cfg.name, per));
  std::vector<TaskScheduler::Worker> workers(groups);
  for (size_t g = 0; g < groups; ++g) {
    workers[g].members.push_back({cubes[g], &aic_run, 0});
    for (int i = 0; i < per; ++i)
      workers[g].members.push_back({vecs[g * static_cast<size_t>(per) + static_cast<size_t>(i)],
                                    &aiv_run, i});
  }
  return workers;
}

void Chip::begin_launch(const isa::Program& program, const std::vector<uint64_t>& args,
                        int block_dim, bool functional, uint64_t max_insns_per_block,
                        bool record, uint64_t record_max_bytes, bool record_lean,
                        bool record_effect_order, bool record_l2_trace) {
  if (block_dim < 1)
    throw Error(fmt::format("kernel '{}': block_dim {} must be at least 1", program.name,
                            block_dim));
  m_runs.clear();
  m_fault.clear();
  m_cc_arrivals.clear();
  std::vector<TaskScheduler::Worker> workers = make_workers(program);
  m_launch = LaunchInfo{&program, &args, block_dim, functional, max_insns_per_block, record,
                        record_max_bytes};
  m_recorded_bytes = 0;
  detach_recordings();  // those of a launch that was not ended
  if (record)
    for (const auto& core : m_cores) {
      m_recordings.push_back(std::make_unique<CoreRecording>(*this, record_lean));
      if (record_effect_order && !record_lean)
        m_recordings.back()->order_across_cores(&m_effect_order,
                                                static_cast<uint16_t>(core->chip_index()));
      core->attach_recorder(m_recordings.back().get());
    }
  // The lookups a graph run's recording keeps count against the same bound as the cores'.
  m_memory->begin_launch(record && !record_lean,
                         record && record_l2_trace ? record_max_bytes / sizeof(GmAccess) : 0);
  m_start = m_end = sc_time_stamp();
  for (ChipObserver* o : m_observers) o->on_kernel_begin(program, block_dim, time_ps(m_start));
  m_scheduler.start(std::move(workers), block_dim, static_cast<int>(m_cores.size()),
                    cycles_to_time(static_cast<double>(m_cfg.task_dispatch_cycles())),
                    cycles_to_time(m_cfg.task_block_start_cycles));
  schedule_starts();
}

Chip::Outcome Chip::outcome() const {
  if (!m_fault.empty()) return Outcome::Fault;
  return m_scheduler.all_done() ? Outcome::Done : Outcome::Deadlock;
}

sc_core::sc_time Chip::end_time() const {
  switch (outcome()) {
    case Outcome::Deadlock: return sc_time_stamp();
    case Outcome::Done: return std::max(m_end, m_memory->writebacks_end());
    case Outcome::Fault: break;
  }
  return m_end;
}

std::string Chip::deadlock_report() const {
  std::vector<std::string> waits;
  for (const auto& c : m_cores)
    for (std::string& w : c->blocked_waits()) waits.push_back(std::move(w));
  if (waits.empty())
    return fmt::format("deadlock: {} of {} blocks unfinished and no process can make progress",
                       m_launch.block_dim - m_scheduler.blocks_done(), m_launch.block_dim);
  std::string out = "deadlock: ";
  for (size_t i = 0; i < waits.size(); ++i) out += (i ? "; " : "") + waits[i];
  return out;
}

void Chip::raise_abort() {
  m_abort.raise();
  m_memory->abort_transfers();
}

void Chip::abort() { raise_abort(); }

void Chip::end_launch(bool ok) {
  const sc_core::sc_time end = end_time();
  m_total_cycles.add(time_ps(end - m_start));
  m_launches.inc();
  if (!ok) m_failed_launches.inc();
  for (ChipObserver* o : m_observers) o->on_kernel_end(*m_launch.program, time_ps(end), ok);
  for (auto& c : m_cores) c->reset();
  detach_recordings();
  m_memory->abort_transfers();
  m_scheduler.clear();
  m_block_start_due.cancel();
  m_cc_arrivals.clear();
  m_abort.clear();
}

void Chip::recorded(uint64_t bytes) {
  if (!m_launch.record) return;
  m_recorded_bytes += bytes;
  if (m_recorded_bytes <= m_launch.record_max_bytes) return;
  // Too long a launch to keep for replay: stop recording and free what was recorded.
  // The records stay allocated until end_launch: the caller is one of them.
  m_launch.record = false;
  for (auto& c : m_cores) c->attach_recorder(nullptr);
  for (auto& r : m_recordings) r->drop();
  std::vector<uint16_t>().swap(m_effect_order);
  m_memory->drop_recording();
}

void Chip::detach_recordings() {
  m_effect_order.clear();
  if (m_recordings.empty()) return;
  for (auto& c : m_cores) c->attach_recorder(nullptr);
  m_recordings.clear();
}

void Chip::fault(const AiCore& core, uint32_t pc, const isa::Instruction* in,
                 const std::string& what) {
  if (m_abort.active()) return;  // only the first fault of a launch is reported
  m_fault = fmt::format("core {} {}: ", core.core_name(), core.where(pc, in));
  if (in) m_fault += insn_text(*in, core.current_section()) + ": ";
  m_fault += what;
  m_end = sc_time_stamp();
  raise_abort();
}

void Chip::block_done(AiCore& core) {
  if (m_scheduler.core_done(core)) m_worker_freed.notify(sc_core::SC_ZERO_TIME);
  if (!m_scheduler.all_done()) return;
  // The launch ends once its completion is reported; the worker of this core ended last, so
  // its blocks' starts lie on the path from the launch's begin to its end.
  const uint64_t done = m_cfg.task_done_cycles();
  m_end = sc_time_stamp() + cycles_to_time(static_cast<double>(done));
  m_task_done.notify(cycles_to_time(static_cast<double>(done)));
  const uint64_t starts = static_cast<uint64_t>(m_scheduler.worker_of(core)->blocks_run) *
                          static_cast<uint64_t>(m_cfg.task_block_start_cycles);
  m_task_overhead_cycles.add((m_cfg.task_dispatch_cycles() + starts + done) * kPsPerCycle);
}

void Chip::post(AiCore& from, Lane lane, AiCore& to, int id) {
  if (to.cross_core_pending(id) >= m_cfg.cross_core_max_pending)
    throw KernelFault(fmt::format("cross-core flag {} of core {} already has {} pending sets "
                                  "(the chip allows {})", id, to.core_name(),
                                  to.cross_core_pending(id), m_cfg.cross_core_max_pending));
  const uint64_t flow = new_flow_id();
  for (ChipObserver* o : m_observers) o->on_flow_begin(from.chip_index(), lane, now_ps(), flow);
  to.post_cross_core(id, flow);
}

void Chip::cross_core_set(AiCore& core, Lane lane, int mode, int id) {
  if (!m_cfg.split) throw KernelFault("cc_set needs a split chip (cube and vector cores)");
  if (id < 0 || id >= m_cfg.cross_core_flag_ids)
    throw KernelFault(fmt::format("cross-core flag id {} out of range: the chip has ids 0..{}",
                                  id, m_cfg.cross_core_flag_ids - 1));
  const TaskScheduler::Worker* w = m_scheduler.worker_of(core);
  if (!w) throw KernelFault("cc_set from a core that is not part of the launch");
  const bool is_cube = core.core_kind() == CoreKind::AIC;
  if ((mode == 1 || mode == 2) && !m_mix)
    throw KernelFault(fmt::format("cc_set mode {} synchronises a cube core's group and needs a "
                                  "mix kernel (aic and aiv sections)", mode));
  switch (mode) {
    case 0:
    case 1: {
      // Barrier: every participant sets once; then each participant's flag counts one.
      std::vector<AiCore*> participants;
      if (mode == 0) {
        for (const auto& worker : m_scheduler.workers()) {
          if (&worker - &m_scheduler.workers().front() >= m_launch.block_dim) break;
          for (const auto& m : worker.members)
            if (m.core->core_kind() == core.core_kind()) participants.push_back(m.core);
        }
      } else {
        if (is_cube)
          throw KernelFault("cc_set mode 1 synchronises vector cores; this is a cube core");
        for (const auto& m : w->members)
          if (m.core->core_kind() == CoreKind::AIV) participants.push_back(m.core);
      }
      const int group = mode == 0 ? -1 - static_cast<int>(core.core_kind())
                                  : static_cast<int>(w - &m_scheduler.workers().front());
      int& arrived = m_cc_arrivals[{group, id}];
      if (++arrived < static_cast<int>(participants.size())) return;
      arrived = 0;
      for (AiCore* p : participants) post(core, lane, *p, id);
      return;
    }
    case 2:
      // A cube core signals its vector cores; a vector core signals its cube core.
      for (const auto& m : w->members)
        if ((m.core->core_kind() == CoreKind::AIC) != is_cube) post(core, lane, *m.core, id);
      return;
    default:
      throw KernelFault(fmt::format("cc_set mode {} is not defined (0: all cube cores, 1: the "
                                    "group's vector cores, 2: cube core with its vector cores)",
                                    mode));
  }
}

}  // namespace npusim
