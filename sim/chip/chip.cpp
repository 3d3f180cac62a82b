#include "sim/chip/chip.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "isa/disassembler.h"
#include "sim/config/core_taker.h"
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
      m_counters(counters),
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
  m_memory = std::make_unique<MemorySystem>("memory", cfg, chip);
  m_slots.push_back(std::make_unique<Slot>());
  m_slot_of_core.assign(m_cores.size(), 0);
  for (auto& core : m_cores) core->gm_port.bind(m_memory->port);
  m_hdc = std::make_unique<HdcLink>("hdc", cfg, chip.sub("hdc"), m_observers);
  refresh_instruction_observers();
  SC_METHOD(dispatch_blocks);
  sensitive << m_worker_freed;
  dont_initialize();
  SC_METHOD(start_blocks);
  sensitive << m_block_start_due;
  dont_initialize();
  SC_METHOD(start_waiting);
  sensitive << m_launch_ended << m_memory->writeback_finished();
  dont_initialize();
}

void Chip::add_observer(ChipObserver* observer) {
  if (std::find(m_observers.begin(), m_observers.end(), observer) != m_observers.end()) return;
  m_observers.push_back(observer);
  for (const auto& core : m_cores) observer->on_core(core->chip_index(), core->basename());
  refresh_instruction_observers();
}

void Chip::remove_observer(ChipObserver* observer) {
  m_observers.erase(std::remove(m_observers.begin(), m_observers.end(), observer),
                    m_observers.end());
  refresh_instruction_observers();
}

void Chip::refresh_instruction_observers() {
  m_instruction_observers.clear();
  for (ChipObserver* o : m_observers)
    if (o->wants_instructions()) m_instruction_observers.push_back(o);
}

void Chip::notify_kernel_begin(const isa::Program& program, int block_dim, uint64_t t_ps) {
  for (ChipObserver* o : m_observers) o->on_kernel_begin(program, block_dim, t_ps);
  refresh_instruction_observers();
}

void Chip::notify_kernel_end(const isa::Program& program, uint64_t t_ps, bool ok) {
  for (ChipObserver* o : m_observers) o->on_kernel_end(program, t_ps, ok);
  refresh_instruction_observers();
}

void Chip::dispatch_blocks() {
  // Every running launch's free workers (a launch none of whose workers was freed in this
  // delta cycle has none free with blocks left: dispatch_free does nothing for it). A worker
  // of a launch that takes its cores when ready that got no block (none left) goes back to
  // the chip, and the launches waiting for cores take what is free.
  bool freed = false;
  for (size_t i = 0; i < m_active_slots; ++i) {
    Slot& s = *m_slots[i];
    if (s.aborted) continue;
    s.scheduler.dispatch_free();
    if (s.take_cores_when_ready && s.started) freed = release_idle_workers(i) || freed;
  }
  if (freed) serve_free_cores();
  else schedule_starts();
}

void Chip::start_blocks() {
  for (size_t i = 0; i < m_active_slots; ++i)
    if (!m_slots[i]->aborted) m_slots[i]->scheduler.start_due();
  schedule_starts();
}

void Chip::schedule_starts() {
  // An earlier pending notification stays (sc_event keeps the earliest); starts are handed
  // out in time order, so the earliest of a launch is its queue's front.
  for (size_t i = 0; i < m_active_slots; ++i)
    if (auto t = m_slots[i]->scheduler.next_start())
      m_block_start_due.notify(*t - sc_time_stamp());
}

void Chip::stop_at_time_limit() {
  Slot& s = *m_slots.front();
  s.fault = fmt::format("simulated time would pass {} ps (cycle {}), half of SystemC's range "
                        "of 2^64 ps: the launch (begun at cycle {}) is stopped at cycle {}; later "
                        "launches get the time that remains (a chip this slow needs shorter "
                        "kernels)",
                        kSimTimeLimitPs, kSimTimeLimitPs / kPsPerCycle,
                        time_ps(s.start) / kPsPerCycle, time_ps(sc_time_stamp()) / kPsPerCycle);
  s.end = sc_time_stamp();
  raise_abort(s);
}

Chip::~Chip() = default;

const SectionRun& Chip::prepare_section(Slot& slot, const isa::Section& s) {
  auto run = std::make_unique<SectionRun>();
  run->section = &s;
  run->launch = &slot.launch;
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
  slot.runs.push_back(std::move(run));
  return *slot.runs.back();
}

std::vector<std::vector<AiCore*>> Chip::worker_cores(const isa::Program& program,
                                                     const std::vector<bool>& mask) const {
  std::vector<std::vector<AiCore*>> out;
  auto single = [&](CoreKind k) {
    for (const auto& c : m_cores)
      if (c->core_kind() == k && mask[static_cast<size_t>(c->chip_index())])
        out.push_back({c.get()});
    return out;
  };
  if (!m_cfg.split) return single(CoreKind::AICORE);
  const bool aic = program.find(CoreKind::AIC) != nullptr;
  const bool aiv = program.find(CoreKind::AIV) != nullptr;
  if (!aic || !aiv) return aic || aiv ? single(aic ? CoreKind::AIC : CoreKind::AIV) : out;
  // Mix kernel: cube core g (its kind index) with vector cores g * aiv_per_aic ..., of which
  // the block uses the first mix_aiv_per_block (all of them unless the program declares fewer).
  std::vector<AiCore*> chip_vecs;
  for (const auto& c : m_cores)
    if (c->core_kind() == CoreKind::AIV) chip_vecs.push_back(c.get());
  const size_t chip_per = static_cast<size_t>(std::max(1, m_cfg.aiv_per_aic));
  const size_t per = static_cast<size_t>(mix_aiv_per_block(m_cfg, program));
  for (const auto& cube : m_cores) {
    if (cube->core_kind() != CoreKind::AIC) continue;
    const size_t first = static_cast<size_t>(cube->kind_index()) * chip_per;
    if (first + chip_per > chip_vecs.size()) break;
    std::vector<AiCore*> group{cube.get()};
    for (size_t i = 0; i < per; ++i)
      if (mask[static_cast<size_t>(chip_vecs[first + i]->chip_index())])
        group.push_back(chip_vecs[first + i]);
    if (mask[static_cast<size_t>(cube->chip_index())] && group.size() == per + 1)
      out.push_back(std::move(group));
  }
  return out;
}

std::vector<TaskScheduler::Worker> Chip::make_workers(Slot& slot, const isa::Program& program) {
  const bool all_cores =
      std::all_of(slot.cores.begin(), slot.cores.end(), [](bool b) { return b; });
  const std::vector<std::vector<AiCore*>> groups = worker_cores(program, slot.cores);
  auto single = [&](CoreKind k, const isa::Section& s) {
    const SectionRun& run = prepare_section(slot, s);
    std::vector<TaskScheduler::Worker> workers;
    for (const std::vector<AiCore*>& g : groups) workers.push_back({{{g.front(), &run, 0}}, 0, -1});
    if (workers.empty() && all_cores)
      throw Error(fmt::format("kernel '{}': chip '{}' has no {} cores", program.name, m_cfg.name,
                              isa::core_kind_name(k)));
    if (workers.empty())
      throw Error(fmt::format("kernel '{}' runs on {} cores and none of the launch's cores is one",
                              program.name, isa::core_kind_name(k)));
    return workers;
  };
  slot.mix = false;
  mix_aiv_per_block(m_cfg, program);  // a declared ratio the chip cannot run is an error
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
  // Mix kernel: one cube core with mix_aiv_per_block vector cores per block (worker_cores),
  // get_subblock_id 0 .. per - 1.
  slot.mix = true;
  const SectionRun& aic_run = prepare_section(slot, *aic);
  const SectionRun& aiv_run = prepare_section(slot, *aiv);
  const size_t per = static_cast<size_t>(mix_aiv_per_block(m_cfg, program));
  std::vector<TaskScheduler::Worker> workers;
  for (const std::vector<AiCore*>& g : groups) {
    TaskScheduler::Worker w;
    w.members.push_back({g.front(), &aic_run, 0});
    for (size_t i = 0; i < per; ++i) w.members.push_back({g[i + 1], &aiv_run, static_cast<int>(i)});
    workers.push_back(std::move(w));
  }
  if (workers.empty() && all_cores)
    throw Error(fmt::format("kernel '{}' is a mix kernel but chip '{}' has no group of one aic "
                            "and {} aiv cores", program.name, m_cfg.name, per));
  if (workers.empty())
    throw Error(fmt::format("kernel '{}' is a mix kernel and the launch's cores hold no group of "
                            "one aic core and its {} aiv cores", program.name, per));
  return workers;
}

void Chip::prepare_slot(Slot& s, const isa::Program& program, const std::vector<uint64_t>& args,
                        int block_dim, bool functional, uint64_t max_insns_per_block) {
  if (block_dim < 1)
    throw Error(fmt::format("kernel '{}': block_dim {} must be at least 1", program.name,
                            block_dim));
  s.runs.clear();
  s.fault.clear();
  s.cc_arrivals.clear();
  s.aborted = false;
  s.workers = make_workers(s, program);
  s.launch = LaunchInfo{&program, &args, block_dim, functional, max_insns_per_block, false, 0};
  s.scheduler.clear();
  s.started = s.awaited = s.ended = false;
}

void Chip::start_slot(size_t i) {
  Slot& s = *m_slots[i];
  for (auto& c : m_cores) {
    const size_t ci = static_cast<size_t>(c->chip_index());
    if (!s.cores[ci]) continue;
    m_slot_of_core[ci] = static_cast<int>(i);
    // Clean after the launches it waited for or that held its cores before.
    if (!s.after.empty() || s.take_cores_when_ready) c->reset();
  }
  s.started = true;
  s.start = s.end = sc_time_stamp();
  s.view = m_memory->begin_launch_view(s.cores);  // an L2 cold at every launch: at this one's
  if (!s.after.empty() || s.take_cores_when_ready) m_counters.raw_values(s.raw_at_start);
  if (s.take_cores_when_ready) {
    // held_counters: every first worker's cores count for it from now.
    s.used = s.cores;
    s.raw_at_join.assign(s.workers.size(), s.raw_at_start);
    s.held_from.clear();
    s.held_to.clear();
  }
  notify_kernel_begin(*s.launch.program, s.launch.block_dim, time_ps(s.start));
  s.scheduler.start(std::move(s.workers), s.launch.block_dim, static_cast<int>(m_cores.size()),
                    cycles_to_time(static_cast<double>(m_cfg.task_dispatch_cycles())),
                    cycles_to_time(m_cfg.task_block_start_cycles));
  s.workers.clear();
}

std::vector<std::vector<bool>> Chip::waits_for(const std::vector<GroupLaunch>& group) {
  std::vector<std::vector<bool>> waits(group.size(), std::vector<bool>(group.size(), false));
  for (size_t i = 0; i < group.size(); ++i) {
    for (size_t j : group[i].after) {
      if (j >= i)
        throw Error(fmt::format("concurrent launch {} '{}' waits for launch {}: a launch can "
                                "wait only for earlier launches of the group ({})",
                                i, group[i].program ? group[i].program->name : "", j,
                                i == 0 ? "launch 0 has none" : fmt::format("0..{}", i - 1)));
      waits[i][j] = true;
      for (size_t k = 0; k < j; ++k)
        if (waits[j][k]) waits[i][k] = true;
    }
  }
  return waits;
}

void Chip::begin_launch(const isa::Program& program, const std::vector<uint64_t>& args,
                        int block_dim, bool functional, uint64_t max_insns_per_block,
                        bool record, uint64_t record_max_bytes, bool record_lean,
                        bool record_effect_order, bool record_l2_trace) {
  if (block_dim < 1)
    throw Error(fmt::format("kernel '{}': block_dim {} must be at least 1", program.name,
                            block_dim));
  Slot& s = *m_slots.front();
  m_active_slots = 1;
  s.cores.assign(m_cores.size(), true);
  m_slot_of_core.assign(m_cores.size(), 0);
  s.runs.clear();
  s.fault.clear();
  s.cc_arrivals.clear();
  s.aborted = false;
  s.after.clear();
  s.take_cores_when_ready = false;
  s.started = true;
  s.awaited = s.ended = false;
  std::vector<TaskScheduler::Worker> workers = make_workers(s, program);
  s.launch = LaunchInfo{&program, &args, block_dim, functional, max_insns_per_block, record,
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
  s.start = s.end = sc_time_stamp();
  notify_kernel_begin(program, block_dim, time_ps(s.start));
  s.scheduler.start(std::move(workers), block_dim, static_cast<int>(m_cores.size()),
                    cycles_to_time(static_cast<double>(m_cfg.task_dispatch_cycles())),
                    cycles_to_time(m_cfg.task_block_start_cycles));
  schedule_starts();
}

void Chip::begin_concurrent(const std::vector<GroupLaunch>& group, bool functional) {
  if (group.empty()) throw Error("begin_concurrent: no launches");
  // Check every launch before touching any slot: a bad one begins nothing.
  const std::vector<std::vector<bool>> waits = waits_for(group);
  // users: by chip index, the launches that use the core, in order.
  std::vector<std::vector<int>> users(m_cores.size());
  for (size_t i = 0; i < group.size(); ++i) {
    const GroupLaunch& g = group[i];
    const std::string name = g.program ? "'" + g.program->name + "'" : "(no program)";
    if (!g.program || !g.args)
      throw Error(fmt::format("concurrent launch {} {}: no program or arguments", i, name));
    if (g.take_cores_when_ready && !g.cores.empty())
      throw Error(
          fmt::format("concurrent launch {} {}: names {} cores and takes its cores when "
                      "ready: it may do only one",
                      i, name, g.cores.size()));
    if (g.cores.empty() && !g.take_cores_when_ready)
      throw Error(fmt::format("concurrent launch {} {}: no cores", i, name));
    for (int c : g.cores) {
      if (c < 0 || static_cast<size_t>(c) >= m_cores.size())
        throw Error(fmt::format("concurrent launch {} {}: core index {} is not on chip '{}' "
                                "({} cores)", i, name, c, m_cfg.name, m_cores.size()));
      // The launches before that use the core: each must be one this launch waits for.
      std::vector<int>& used = users[static_cast<size_t>(c)];
      for (int o : used)
        if (o == static_cast<int>(i) || !waits[i][static_cast<size_t>(o)])
          throw Error(fmt::format(
              "concurrent launch {} {}: core {} is {}", i, name,
              m_cores[static_cast<size_t>(c)]->core_name(),
              o == static_cast<int>(i)
                  ? "listed twice"
                  : fmt::format("also launch {}'s ('{}'), and neither waits for the other", o,
                                group[static_cast<size_t>(o)].program->name)));
      used.push_back(static_cast<int>(i));
    }
  }
  // The cores launches that take theirs when ready share: those no launch with fixed cores uses.
  std::vector<bool> shared(m_cores.size());
  for (size_t c = 0; c < m_cores.size(); ++c) shared[c] = users[c].empty();
  while (m_slots.size() < group.size()) m_slots.push_back(std::make_unique<Slot>());
  for (size_t i = 0; i < group.size(); ++i) {
    Slot& s = *m_slots[i];
    // A launch that takes its cores when ready is checked against all of the chip's (its
    // sections), then holds none until it begins.
    s.cores.assign(m_cores.size(), group[i].take_cores_when_ready);
    for (int c : group[i].cores) s.cores[static_cast<size_t>(c)] = true;
    s.after = group[i].after;
    s.take_cores_when_ready = group[i].take_cores_when_ready;
  }
  for (size_t i = 0; i < group.size(); ++i) {
    Slot& s = *m_slots[i];
    const GroupLaunch& g = group[i];
    try {
      prepare_slot(s, *g.program, *g.args, g.block_dim, functional, g.max_insns_per_block);
      if (g.take_cores_when_ready) {
        // Its workers are made as it takes cores (take_free_cores), from the sections
        // prepare_slot prepared; its blocks run in waves on as many as it gets, so it needs one.
        const size_t chip_workers = s.workers.size();
        const CoreKind kind = s.workers.front().members.front().core->core_kind();
        s.workers.clear();
        s.cores.assign(m_cores.size(), false);
        if (worker_cores(*g.program, shared).empty())
          throw Error(fmt::format(
              "kernel '{}' takes its cores when ready and needs {}: the chip has {}, none of "
              "them on cores no launch with fixed cores uses",
              g.program->name,
              s.mix ? fmt::format("a group of one aic and {} aiv cores",
                                  mix_aiv_per_block(m_cfg, *g.program))
                    : fmt::format("one {} core", isa::core_kind_name(kind)),
              chip_workers));
      }
    } catch (const Error& e) {
      for (size_t j = 0; j <= i; ++j) m_slots[j]->workers.clear();
      throw Error(fmt::format("concurrent launch {}: {}", i, e.what()));
    }
  }
  m_active_slots = group.size();
  m_waiting = false;
  // A core belongs to its first launch until a later one begins on it (start_slot).
  for (size_t c = 0; c < m_cores.size(); ++c)
    m_slot_of_core[c] = users[c].empty() ? 0 : users[c][0];
  for (size_t i = 0; i < group.size(); ++i)
    for (size_t j : group[i].after) {
      m_slots[j]->awaited = true;
      m_waiting = true;
    }
  // A launch that takes its cores when ready: its end is noted as an awaited launch's is
  // (settle_waiting), which also begins such launches when what they wait for ended.
  for (size_t i = 0; i < group.size(); ++i)
    if (group[i].take_cores_when_ready) m_slots[i]->awaited = m_waiting = true;
  m_free_cores = shared;
  m_recorded_bytes = 0;
  detach_recordings();
  m_memory->begin_launch();
  if (m_waiting) m_memory->watch_writebacks();
  for (size_t i = 0; i < group.size(); ++i) {
    if (!group[i].after.empty()) continue;
    if (group[i].take_cores_when_ready) take_free_cores(i);  // begins it if a worker is free
    else start_slot(i);
  }
  schedule_starts();
}

TaskScheduler::Worker Chip::group_worker(const Slot& s, const std::vector<AiCore*>& g) const {
  // make_workers prepared the sections: one, or a mix kernel's aic then aiv.
  TaskScheduler::Worker w;
  w.members.push_back({g.front(), s.runs.front().get(), 0});
  for (size_t k = 1; k < g.size(); ++k)
    w.members.push_back({g[k], s.runs.back().get(), static_cast<int>(k - 1)});
  return w;
}

bool Chip::take_free_cores(size_t i) {
  Slot& s = *m_slots[i];
  if (!s.take_cores_when_ready || !s.fault.empty() || s.aborted) return false;
  size_t want = 0;
  if (s.started) {
    // Blocks that neither a running worker will take nor an idle one takes at dispatch_free.
    const int left = s.scheduler.blocks_left() - s.scheduler.idle_workers();
    if (left <= 0) return false;
    want = static_cast<size_t>(left);
  } else {
    for (size_t j : s.after)
      if (!m_slots[j]->ended || !m_slots[j]->fault.empty()) return false;
    want = static_cast<size_t>(s.launch.block_dim);
  }
  const std::vector<std::vector<AiCore*>> free = worker_cores(*s.launch.program, m_free_cores);
  const size_t n = std::min(want, free.size());
  if (n == 0) return false;
  std::vector<bool> joining(m_cores.size(), false);
  for (size_t w = 0; w < n; ++w)
    for (AiCore* c : free[w]) {
      const size_t ci = static_cast<size_t>(c->chip_index());
      joining[ci] = true;
      m_free_cores[ci] = false;
    }
  if (!s.started) {
    s.cores = joining;
    for (size_t w = 0; w < n; ++w) s.workers.push_back(group_worker(s, free[w]));
    start_slot(i);
    return true;
  }
  // Joining a running launch: each core is cleaned after the launch that held it before, sees
  // the launch's L2 view, and its counters count for this launch from now.
  std::vector<uint64_t> raw;
  m_counters.raw_values(raw);
  for (size_t w = 0; w < n; ++w) {
    for (AiCore* c : free[w]) {
      const size_t ci = static_cast<size_t>(c->chip_index());
      s.cores[ci] = s.used[ci] = true;
      m_slot_of_core[ci] = static_cast<int>(i);
      c->reset();
    }
    const size_t wi = s.scheduler.add_worker(group_worker(s, free[w]),
                                             cycles_to_time(m_cfg.task_block_start_cycles));
    if (s.raw_at_join.size() <= wi) s.raw_at_join.resize(wi + 1);
    s.raw_at_join[wi] = raw;
  }
  m_memory->join_launch_view(joining, s.view);
  return false;
}

void Chip::serve_free_cores() {
  for (size_t i = 0; i < m_active_slots; ++i) take_free_cores(i);
  schedule_starts();
}

bool Chip::release_idle_workers(size_t i) {
  Slot& s = *m_slots[i];
  const std::vector<size_t> gone = s.scheduler.release_idle_workers();
  if (gone.empty()) return false;
  std::vector<uint64_t> raw;
  m_counters.raw_values(raw);
  const std::vector<std::vector<uint32_t>>& own = core_counter_indices();
  if (s.held_from.size() < raw.size()) s.held_from.resize(raw.size(), 0);
  if (s.held_to.size() < raw.size()) s.held_to.resize(raw.size(), 0);
  for (size_t wi : gone) {
    std::vector<uint64_t>& from = s.raw_at_join[wi];
    for (const TaskScheduler::Member& m : s.scheduler.workers()[wi].members) {
      const size_t ci = static_cast<size_t>(m.core->chip_index());
      s.cores[ci] = false;
      m_free_cores[ci] = true;
      for (uint32_t k : own[ci]) {
        s.held_from[k] = k < from.size() ? from[k] : 0;
        s.held_to[k] = raw[k];
      }
    }
    std::vector<uint64_t>().swap(from);
  }
  return true;
}

const std::vector<std::vector<uint32_t>>& Chip::core_counter_indices() {
  m_core_counters.resize(m_cores.size());
  // Counters register on first use, so the registry may have grown since the last call. Each
  // new one's name comes from a delta of it alone (large enough to report nonzero).
  for (size_t k = m_core_counters_seen; k < m_counters.size(); ++k) {
    const CounterDelta d = m_counters.delta_of({{static_cast<uint32_t>(k), uint64_t{1} << 62}});
    d.for_each([&](const CounterInfo& info, uint64_t) {
      const std::string root = m_counter_root + ".";
      if (info.name.compare(0, root.size(), root) != 0) return;
      const size_t dot = info.name.find('.', root.size());
      if (dot == std::string::npos) return;
      const std::string core = info.name.substr(root.size(), dot - root.size());
      for (const auto& c : m_cores)
        if (c->core_name() == core)
          m_core_counters[static_cast<size_t>(c->chip_index())].push_back(static_cast<uint32_t>(k));
    });
  }
  m_core_counters_seen = m_counters.size();
  return m_core_counters;
}

std::optional<CounterDelta> Chip::held_counters(size_t i, const std::vector<uint64_t>& now) {
  const Slot& s = *m_slots[i];
  if (!s.take_cores_when_ready || !s.started) return std::nullopt;
  std::vector<uint64_t> from = s.held_from, to = s.held_to;
  from.resize(now.size(), 0);
  to.resize(now.size(), 0);
  // The workers it still holds (a launch that failed keeps them): their intervals end now.
  const std::vector<std::vector<uint32_t>>& own = core_counter_indices();
  const auto& workers = s.scheduler.workers();
  for (size_t wi = 0; wi < workers.size() && wi < s.raw_at_join.size(); ++wi) {
    if (workers[wi].released) continue;
    for (const TaskScheduler::Member& m : workers[wi].members)
      for (uint32_t k : own[static_cast<size_t>(m.core->chip_index())]) {
        from[k] = k < s.raw_at_join[wi].size() ? s.raw_at_join[wi][k] : 0;
        to[k] = now[k];
      }
  }
  return m_counters.delta_between(from, to);
}

std::vector<int> Chip::launch_cores(size_t i) const {
  std::vector<int> out;
  const Slot& s = *m_slots[i];
  if (s.take_cores_when_ready && !s.started) return out;
  const std::vector<bool>& ran = s.take_cores_when_ready ? s.used : s.cores;
  for (size_t c = 0; c < ran.size(); ++c)
    if (ran[c]) out.push_back(static_cast<int>(c));
  return out;
}

std::string Chip::no_cores_message(size_t i) const {
  const Slot& s = *m_slots[i];
  const size_t free = worker_cores(*s.launch.program, m_free_cores).size();
  std::string holders;
  for (size_t j = 0; j < m_active_slots; ++j) {
    const Slot& o = *m_slots[j];
    if (!o.take_cores_when_ready || !o.started || o.fault.empty()) continue;
    holders += fmt::format("{}{} ('{}')", holders.empty() ? "" : ", ", j, o.launch.program->name);
  }
  return fmt::format(
      "did not run: it takes its cores when ready and none was free ({} of the {} workers "
      "it needs){}",
      free, s.launch.block_dim,
      holders.empty() ? std::string() : "; failed launches keep theirs: " + holders);
}

void Chip::start_waiting() { settle_waiting(true); }

void Chip::settle_waiting(bool may_start) {
  if (!m_waiting) return;
  bool begun = false;
  // The ends first (a launch that took its cores when ready gave each back when no block was
  // left for it, dispatch_blocks; one that failed keeps those it held to the group's end).
  for (size_t i = 0; i < m_active_slots; ++i) {
    Slot& s = *m_slots[i];
    if (!s.started || !s.awaited || s.ended) continue;
    if (!s.fault.empty()) {
      s.ended = true;
      s.ended_at = s.end;
    } else if (s.scheduler.all_done() && s.end <= sc_time_stamp() &&
               !m_memory->writebacks_in_flight_of(ran_on(s))) {
      s.ended = true;
      s.ended_at = std::max(s.end, m_memory->writebacks_end_of(ran_on(s)));
      m_counters.raw_values(s.raw_at_end);
    }
  }
  // Then the launches not begun, in index order: a launch waits only for earlier ones, so one
  // pass sees every change; a ready one that takes its cores when ready and finds too few free
  // waits, and a later one that fits may begin.
  for (size_t i = 0; i < m_active_slots; ++i) {
    Slot& s = *m_slots[i];
    if (s.started || !s.fault.empty()) continue;
    // Not begun: the first launch it waits for that failed, else whether all have ended.
    bool all_ended = true;
    const size_t* failed = nullptr;
    for (const size_t& j : s.after) {
      const Slot& w = *m_slots[j];
      if (w.ended && !w.fault.empty()) {
        failed = &j;
        break;
      }
      all_ended = all_ended && w.ended;
    }
    if (failed || !may_start) {
      s.start = s.end = sc_time_stamp();
      s.fault = failed ? fmt::format("did not run: launch {} ('{}') it waits for failed", *failed,
                                     m_slots[*failed]->launch.program->name)
                : all_ended && s.take_cores_when_ready
                    ? no_cores_message(i)
                    : std::string("did not run: a launch it waits for did not end");
      s.ended = true;
      s.ended_at = s.end;
    } else if (all_ended && s.take_cores_when_ready) {
      begun = take_free_cores(i) || begun;  // begins it if a worker is free
    } else if (all_ended) {
      start_slot(i);
      begun = true;
    }
  }
  if (begun) schedule_starts();
}

Chip::Outcome Chip::outcome(size_t i) const {
  const Slot& s = *m_slots[i];
  if (!s.fault.empty()) return Outcome::Fault;
  return s.started && s.scheduler.all_done() ? Outcome::Done : Outcome::Deadlock;
}

Chip::Outcome Chip::outcome() const { return outcome(0); }

const std::string& Chip::fault_message(size_t i) const { return m_slots[i]->fault; }

sc_core::sc_time Chip::end_time(size_t i) const {
  const Slot& s = *m_slots[i];
  switch (outcome(i)) {
    case Outcome::Deadlock: return sc_time_stamp();
    case Outcome::Done:
      // An awaited launch's end was noted when it came: a later launch may reuse its cores.
      if (s.ended) return s.ended_at;
      return std::max(s.end, m_active_slots == 1 ? m_memory->writebacks_end()
                                                 : m_memory->writebacks_end_of(ran_on(s)));
    case Outcome::Fault: break;
  }
  return s.end;
}

sc_core::sc_time Chip::end_time() const { return end_time(0); }

std::string Chip::deadlock_report(size_t i) const {
  const Slot& s = *m_slots[i];
  std::vector<std::string> waits;
  for (const auto& c : m_cores)
    if (s.cores[static_cast<size_t>(c->chip_index())])
      for (std::string& w : c->blocked_waits()) waits.push_back(std::move(w));
  if (waits.empty())
    return fmt::format("deadlock: {} of {} blocks unfinished and no process can make progress",
                       s.launch.block_dim - s.scheduler.blocks_done(), s.launch.block_dim);
  std::string out = "deadlock: ";
  for (size_t k = 0; k < waits.size(); ++k) out += (k ? "; " : "") + waits[k];
  return out;
}

std::string Chip::deadlock_report() const { return deadlock_report(0); }

void Chip::raise_abort(Slot& s) {
  s.aborted = true;
  for (auto& c : m_cores)
    if (s.cores[static_cast<size_t>(c->chip_index())]) c->abort_signal().raise();
  if (m_active_slots == 1) m_memory->abort_transfers();
  else m_memory->abort_transfers_of(s.cores);
}

void Chip::abort() { raise_abort(*m_slots.front()); }

bool Chip::abort_deadlocked() {
  bool any = false;
  for (size_t i = 0; i < m_active_slots; ++i) {
    Slot& s = *m_slots[i];
    if (!s.started || outcome(i) != Outcome::Deadlock) continue;
    s.fault = deadlock_report(i);
    s.end = sc_time_stamp();
    raise_abort(s);
    any = true;
  }
  settle_waiting(false);  // the launches waiting for them do not run
  return any;
}

void Chip::stop_group_at_time_limit() {
  for (size_t i = 0; i < m_active_slots; ++i) {
    Slot& s = *m_slots[i];
    if (!s.started || outcome(i) != Outcome::Deadlock) continue;
    s.fault = fmt::format("simulated time would pass {} ps (cycle {}), half of SystemC's range of "
                          "2^64 ps: the launch (begun at cycle {}) is stopped at cycle {}",
                          kSimTimeLimitPs, kSimTimeLimitPs / kPsPerCycle,
                          time_ps(s.start) / kPsPerCycle, time_ps(sc_time_stamp()) / kPsPerCycle);
    s.end = sc_time_stamp();
    raise_abort(s);
  }
  settle_waiting(false);
}

void Chip::end_slot(Slot& s, const sc_core::sc_time& end, bool ok) {
  if (!s.started) return;  // did not run: not a launch of the chip's
  m_total_cycles.add(time_ps(end - s.start));
  m_launches.inc();
  if (!ok) m_failed_launches.inc();
  notify_kernel_end(*s.launch.program, time_ps(end), ok);
}

void Chip::reset_after_launches() {
  for (auto& c : m_cores) {
    c->reset();
    c->abort_signal().clear();
  }
  detach_recordings();
  m_memory->abort_transfers();
  for (size_t i = 0; i < m_active_slots; ++i) {
    m_slots[i]->scheduler.clear();
    m_slots[i]->cc_arrivals.clear();
    m_slots[i]->aborted = false;
    m_slots[i]->workers.clear();
  }
  m_block_start_due.cancel();
  m_launch_ended.cancel_all();
  m_waiting = false;
}

void Chip::end_launch(bool ok) {
  end_slot(*m_slots.front(), end_time(0), ok);
  reset_after_launches();
}

void Chip::end_concurrent() {
  for (size_t i = 0; i < m_active_slots; ++i)
    end_slot(*m_slots[i], end_time(i), outcome(i) == Outcome::Done);
  reset_after_launches();
  m_active_slots = 1;
  m_slot_of_core.assign(m_cores.size(), 0);
}

void Chip::recorded(uint64_t bytes) {
  LaunchInfo& launch = m_slots.front()->launch;  // only a lone launch is recorded
  if (!launch.record) return;
  m_recorded_bytes += bytes;
  if (m_recorded_bytes <= launch.record_max_bytes) return;
  // Too long a launch to keep for replay: stop recording and free what was recorded.
  // The records stay allocated until end_launch: the caller is one of them.
  launch.record = false;
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
  Slot& s = slot_of(core);
  if (s.aborted) return;  // only the first fault of a launch is reported
  s.fault = fmt::format("core {} {}: ", core.core_name(), core.where(pc, in));
  if (in) s.fault += insn_text(*in, core.current_section()) + ": ";
  s.fault += what;
  s.end = sc_time_stamp();
  raise_abort(s);
  if (s.awaited) m_launch_ended.notify(sc_core::SC_ZERO_TIME);
}

void Chip::block_done(AiCore& core) {
  Slot& s = slot_of(core);
  if (s.scheduler.core_done(core)) m_worker_freed.notify(sc_core::SC_ZERO_TIME);
  if (!s.scheduler.all_done()) return;
  // The launch ends once its completion is reported; the worker of this core ended last, so
  // its blocks' starts lie on the path from the launch's begin to its end.
  const uint64_t done = m_cfg.task_done_cycles();
  s.end = sc_time_stamp() + cycles_to_time(static_cast<double>(done));
  s.task_done.notify(cycles_to_time(static_cast<double>(done)));
  if (s.awaited) m_launch_ended.notify(cycles_to_time(static_cast<double>(done)));
  const uint64_t starts = static_cast<uint64_t>(s.scheduler.worker_of(core)->blocks_run) *
                          static_cast<uint64_t>(m_cfg.task_block_start_cycles);
  m_task_overhead_cycles.add((m_cfg.task_dispatch_cycles() + starts + done) * kPsPerCycle);
}

void Chip::post(AiCore& from, Lane lane, AiCore& to, int id) {
  if (to.cross_core_pending(id) >= m_cfg.cross_core_max_pending)
    throw KernelFault(fmt::format("cross-core flag {} of core {} already has {} pending sets "
                                  "(the chip allows {})", id, to.core_name(),
                                  to.cross_core_pending(id), m_cfg.cross_core_max_pending));
  const uint64_t flow = new_flow_id();
  for (ChipObserver* o : m_instruction_observers)
    o->on_flow_begin(from.chip_index(), lane, now_ps(), flow);
  to.post_cross_core(id, flow);
}

void Chip::cross_core_set(AiCore& core, Lane lane, int mode, int id) {
  if (!m_cfg.split) throw KernelFault("cc_set needs a split chip (cube and vector cores)");
  if (id < 0 || id >= m_cfg.cross_core_flag_ids)
    throw KernelFault(fmt::format("cross-core flag id {} out of range: the chip has ids 0..{}",
                                  id, m_cfg.cross_core_flag_ids - 1));
  Slot& s = slot_of(core);
  const TaskScheduler::Worker* w = s.scheduler.worker_of(core);
  if (!w) throw KernelFault("cc_set from a core that is not part of the launch");
  const bool is_cube = core.core_kind() == CoreKind::AIC;
  if ((mode == 1 || mode == 2) && !s.mix)
    throw KernelFault(fmt::format("cc_set mode {} synchronises a cube core's group and needs a "
                                  "mix kernel (aic and aiv sections)", mode));
  switch (mode) {
    case 0:
    case 1: {
      // Barrier: every participant sets once; then each participant's flag counts one.
      std::vector<AiCore*> participants;
      if (mode == 0) {
        for (const auto& worker : s.scheduler.workers()) {
          if (&worker - &s.scheduler.workers().front() >= s.launch.block_dim) break;
          if (worker.released) continue;  // gone back to the chip (take_cores_when_ready)
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
                                  : static_cast<int>(w - &s.scheduler.workers().front());
      int& arrived = s.cc_arrivals[{group, id}];
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
