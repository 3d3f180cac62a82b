#define SC_INCLUDE_DYNAMIC_PROCESSES
#include "sim/core/ai_core.h"

#include <algorithm>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "isa/disassembler.h"
#include "isa/layout.h"

namespace npusim {

using isa::Opcode;
using isa::Pipe;
using sc_core::sc_time;
using sc_core::sc_time_stamp;
using sc_core::SC_ZERO_TIME;

namespace {

// Coroutine stacks: pipe processes run plan()/execute() and the memory system's transport on
// their own stack, so they get more room than the scalar unit.
constexpr size_t kScalarStackBytes = 256 * 1024;
constexpr size_t kPipeStackBytes = 512 * 1024;
constexpr uint64_t kPsPerCycle = 1000;

bool has_pipe_operands(Opcode op) {
  return op == Opcode::op_set_flag || op == Opcode::op_wait_flag;
}

// A FIFO of at most `capacity` entries in one allocation: a pipe's issue queue never holds more
// than issue_queue_depth instructions, so pushing and popping need no allocation (a std::deque
// of IssuedOp allocates a block every few instructions).
template <typename T>
class BoundedQueue {
 public:
  explicit BoundedQueue(size_t capacity) : m_slots(std::max<size_t>(1, capacity)) {}
  bool empty() const { return m_size == 0; }
  size_t size() const { return m_size; }
  const T& front() const { return m_slots[m_head]; }
  void push_back(const T& v) {
    if (m_size == m_slots.size())
      throw std::logic_error(fmt::format("pipe queue overflow: {} entries", m_size));
    size_t tail = m_head + m_size;
    if (tail >= m_slots.size()) tail -= m_slots.size();
    m_slots[tail] = v;
    ++m_size;
  }
  void pop_front() {
    if (++m_head == m_slots.size()) m_head = 0;
    --m_size;
  }
  void clear() { m_head = m_size = 0; }

 private:
  std::vector<T> m_slots;
  size_t m_head = 0, m_size = 0;
};

size_t queue_depth(const ChipConfig& cfg) {
  return static_cast<size_t>(std::max(1, cfg.issue_queue_depth));
}

}  // namespace

AiCore::Waiter::Waiter(AbortSignal& abort_signal, const sc_core::sc_event& flag_event) {
  abort_signal.wake_on_raise(abort);
  flag_or_abort |= flag_event;
  flag_or_abort |= abort;
}

struct AiCore::PipeUnit {
  // scalar_abort: the scalar unit's abort wake-up (it alone waits for popped and drained).
  PipeUnit(Pipe p, const CounterGroup& g, AbortSignal& abort, const sc_core::sc_event& flag_event,
           const sc_core::sc_event& scalar_abort, size_t depth)
      : pipe(p), lane(lane_of(p)), queue(depth), waiter(abort, flag_event), counters(g),
        busy(g.add("busy_cycles", "cycles",
                   "cycles the pipe executed instructions (GM instructions: their bandwidth phase)",
                   kPsPerCycle)),
        inflight(g.add("inflight_cycles", "cycles",
                       "cycles an instruction of the pipe executed or its GM data was still in "
                       "flight (the union of [start, landed]; msprof's MTE2/MTE3/FIXPIPE time)",
                       kPsPerCycle)),
        stall_flag(g.add("stall.flag_wait", "cycles", "cycles blocked in wait_flag", kPsPerCycle)),
        stall_cross_core(g.add("stall.cross_core_wait", "cycles", "cycles blocked in cc_wait",
                               kPsPerCycle)),
        stall_mem(g.add("stall.mem_contention", "cycles",
                        "GM transfer cycles beyond bytes / port rate (shared L2/HBM bandwidth)",
                        kPsPerCycle)),
        stall_bank(g.add("stall.bank_conflict", "cycles",
                         "busy cycles caused by UB bank conflicts", kPsPerCycle)) {
    if (p == Pipe::M)
      macs = &g.add("macs", "MACs", "cube multiply-accumulates, in fp16-MAC equivalents");
    if (p == Pipe::V) repeats = &g.add("repeats", "repeats", "vector repeats executed");
    popped_or_abort |= popped;
    popped_or_abort |= scalar_abort;
    drained_or_abort |= drained;
    drained_or_abort |= scalar_abort;
    transfer = new GmTransfer;
    transfer->abort_signal = &abort;  // the core's: its launch's fault unwinds the transfer
    payload.set_extension(transfer);  // owned (and freed) by the payload
  }

  const Pipe pipe;
  const Lane lane;
  // An issued instruction and when it was queued (the DMA's issue may start from then).
  struct QueuedOp {
    IssuedOp op;
    sc_core::sc_time at;
  };
  BoundedQueue<QueuedOp> queue;  // issued, not yet started (at most queue_depth())
  sc_core::sc_time running_queued_at = sc_core::SC_ZERO_TIME;  // of the instruction running
  // When the pipe's DMA has issued the GM requests of its copies so far (ExecCost::
  // gm_issue_cycles). The issue runs ahead of the flows through the queue: a copy's requests
  // go out from max(this, when the copy was queued), so a copy queued behind a long flow has
  // issued its requests meanwhile; an instruction of any other kind (a wait_flag, a copy
  // without the minimum) sets it to its end, so the issue never runs past it.
  sc_core::sc_time issue_free = sc_core::SC_ZERO_TIME;
  bool executing = false;      // an instruction has left the queue and is running
  // When the GM transfers this pipe has issued are complete. A GM instruction occupies the pipe
  // for its bandwidth-limited transfer only; its fixed latency (path start + memory access)
  // overlaps the pipe's next instructions, as a DMA engine keeps requests in flight, and delays
  // only what must observe completion: set_flag / cc_set from this pipe and draining it.
  sc_core::sc_time complete_at = sc_core::SC_ZERO_TIME;
  // The end of the instruction intervals counted in `inflight` so far (they overlap: a GM
  // transfer's data lands after the pipe has moved on).
  sc_core::sc_time inflight_until = sc_core::SC_ZERO_TIME;
  sc_core::sc_event pushed, popped, drained;
  sc_core::sc_event_or_list popped_or_abort, drained_or_abort;  // waited by the scalar unit
  Waiter waiter;  // the pipe process's
  Blocked blocked;
  tlm::tlm_generic_payload payload;
  GmTransfer* transfer;

  CounterGroup counters;
  Counter& busy;
  Counter& inflight;
  Counter& stall_flag;
  Counter& stall_cross_core;
  Counter& stall_mem;
  Counter& stall_bank;
  Counter* macs = nullptr;
  Counter* repeats = nullptr;
  std::array<Counter*, isa::kNumOpcodes> insn{};
  // "bytes.<src>_to_<dst>" by [src][dst] buffer, registered on first use.
  std::array<std::array<Counter*, isa::kNumBufs>, isa::kNumBufs> path_bytes{};
};

AiCore::AiCore(sc_core::sc_module_name name, int chip_index, int kind_index,
               const CoreKindConfig& kind, CoreEnv& env, const CounterGroup& counters)
    : sc_module(name),
      gm_port("gm_port"),
      m_chip_index(chip_index),
      m_kind_index(kind_index),
      m_kind(kind),
      m_env(env),
      m_cfg(env.config()),
      m_gm(env.gm()),
      m_observers(env.instruction_observers()),
      m_name(basename()),
      m_local(std::make_unique<CoreMemory>(kind)),
      m_scalar_wait(m_abort, m_flag_event),
      m_counters(counters),
      m_scalar_counters(counters.sub("s")),
      m_active_cycles(counters.add("active_cycles", "cycles",
                                   "cycles the core ran blocks (first fetch to last pipe drained)",
                                   kPsPerCycle)),
      m_blocks(counters.add("blocks", "blocks", "blocks the core completed")),
      m_scalar_busy(m_scalar_counters.add("busy_cycles", "cycles",
                                          "cycles the scalar unit spent fetching and issuing",
                                          kPsPerCycle)),
      m_scalar_issued(m_scalar_counters.add("issued", "instructions",
                                            "instructions issued to pipe queues")),
      m_stall_queue_full(m_scalar_counters.add("stall.queue_full", "cycles",
                                               "cycles the scalar unit waited for queue space",
                                               kPsPerCycle)),
      m_stall_scalar_flag(m_scalar_counters.add("stall.flag_wait", "cycles",
                                                "cycles the scalar unit blocked in wait_flag",
                                                kPsPerCycle)),
      m_stall_scalar_cross_core(m_scalar_counters.add(
          "stall.cross_core_wait", "cycles", "cycles the scalar unit blocked in cc_wait",
          kPsPerCycle)),
      m_stall_barrier(m_scalar_counters.add("stall.barrier", "cycles",
                                            "cycles the scalar unit waited in pipe_barrier",
                                            kPsPerCycle)) {
  for (const auto& [buf, bytes] : kind.buffer_bytes)
    m_buffer_high_water[static_cast<int>(buf)] = &counters.add(
        fmt::format("buffer.{}.high_water", isa::buf_name(buf)), "bytes",
        fmt::format("highest byte offset (addr + bytes) any instruction touched in {} ({} bytes)",
                    isa::buf_name(buf), bytes),
        1, CounterKind::kHighWater);
  sc_core::sc_spawn_options scalar_opts;
  scalar_opts.set_stack_size(kScalarStackBytes);
  sc_core::sc_spawn([this] { scalar_thread(); }, "scalar", &scalar_opts);
  for (Pipe p : kind.pipes) {
    if (p == Pipe::S) continue;
    if (static_cast<int>(p) >= isa::kNumExecPipes)
      throw ConfigError(fmt::format("{}: core kind {} lists pipe '{}', which has no queue",
                                    m_cfg.source_file, isa::core_kind_name(kind.kind),
                                    isa::pipe_name(p)));
    auto unit = std::make_unique<PipeUnit>(p, counters.sub(isa::pipe_name(p)), m_abort,
                                           m_flag_event, m_scalar_wait.abort, queue_depth(m_cfg));
    PipeUnit* u = unit.get();
    m_pipes[static_cast<int>(p)] = std::move(unit);
    m_pipe_list.push_back(u);
    sc_core::sc_spawn_options opts;
    opts.set_stack_size(kPipeStackBytes);
    sc_core::sc_spawn([this, u] { pipe_thread(*u); }, isa::pipe_name(p), &opts);
  }
}

AiCore::~AiCore() = default;

void AiCore::assign_block(const SectionRun& run, int block, int subblock) {
  m_run = &run;
  m_launch = run.launch;
  m_block = block;
  m_subblock = subblock;
  m_assigned_blocks.push_back({&run, block, subblock});
  m_assigned = true;
  m_touched = true;
  m_assign_event.notify(SC_ZERO_TIME);
}

void AiCore::reset() {
  if (!m_touched) return;  // nothing ran here since the last reset: the state is still clean
  m_touched = false;
  for (int b = 0; b < isa::kNumBufs; ++b)
    if (Counter* c = m_buffer_high_water[b]) c->raise_to(m_local->high_water(isa::Buf(b)));
  m_local->reset_high_water();
  for (PipeUnit* u : m_pipe_list) {
    u->queue.clear();
    u->issue_free = SC_ZERO_TIME;
    u->executing = false;
    u->blocked = {};
    u->complete_at = SC_ZERO_TIME;
    u->inflight_until = SC_ZERO_TIME;
  }
  clear_flags();
  for (auto& f : m_cross_core) f.flows.clear();
  m_assigned = m_running = false;
  m_assigned_blocks.clear();
  m_scalar_blocked = {};
  m_local_time = SC_ZERO_TIME;
}

// ---- waiting ----

void AiCore::wait_abortable(const sc_core::sc_event_or_list& events) {
  m_abort.check();
  wait(events);
  m_abort.check();
}

void AiCore::wait_abortable(const sc_time& t, Waiter& w) {
  m_abort.check();
  if (t == SC_ZERO_TIME) return;
  wait(t, w.abort);
  m_abort.check();
}

void AiCore::sync_local() {
  if (m_local_time == SC_ZERO_TIME) return;
  const sc_time t = m_local_time;
  m_local_time = SC_ZERO_TIME;
  wait_abortable(t, m_scalar_wait);
}

void AiCore::wait_transfers_complete(PipeUnit& u) {
  if (u.complete_at > sc_time_stamp()) wait_abortable(u.complete_at - sc_time_stamp(), u.waiter);
}

void AiCore::wait_drained(PipeUnit& u) {
  while (!u.queue.empty() || u.executing) wait_abortable(u.drained_or_abort);
}

void AiCore::wait_all_drained() {
  for (PipeUnit* u : m_pipe_list) wait_drained(*u);
}

// ---- scalar unit ----

void AiCore::scalar_thread() {
  for (;;) {
    while (!m_assigned) wait(m_assign_event);
    m_assigned = false;
    m_running = true;
    const sc_time start = sc_time_stamp();
    bool completed = false, faulted = false;
    std::string what;
    try {
      run_block();
      completed = true;
    } catch (const Aborted&) {
    } catch (const std::exception& e) {
      faulted = true;
      what = e.what();
    }
    // A fault happens at the faulting instruction's time: spend the scalar time run ahead.
    if (faulted && m_local_time != SC_ZERO_TIME && !m_abort.active()) wait(m_local_time);
    m_local_time = SC_ZERO_TIME;
    m_scalar_blocked = {};
    m_running = false;
    m_active_cycles.add(time_ps(sc_time_stamp() - start));
    if (faulted) {
      const auto& code = m_run->section->code;
      m_env.fault(*this, m_pc, m_pc < code.size() ? &code[m_pc] : nullptr, what);
    }
    if (completed) {
      m_blocks.inc();
      m_env.block_done(*this);
    }
  }
}

void AiCore::run_block() {
  m_scalar.reset();
  m_local_time = SC_ZERO_TIME;
  clear_flags();
  const isa::Section& section = *m_run->section;
  const auto& code = section.code;
  const std::vector<DecodedInsn>& decoded = m_run->decoded;
  const sc_time issue_time = cycles_to_time(m_cfg.scalar_cycles_per_insn);
  const uint64_t issue_ps = time_ps(issue_time);
  const auto& observers = m_observers;
  // The instruction's start is read while any observer is attached: one that wants no
  // instructions at its start may want them by its end (a launch beside this one began).
  const auto& attached = m_env.observers();
  uint32_t pc = 0;
  const BlockIdentity id{m_launch->args, m_block, m_launch->block_dim, m_subblock, m_kind_index};
  const uint64_t budget = m_launch->max_insns_per_block;
  uint64_t executed = 0;
  for (;;) {
    m_pc = pc;
    if (budget && ++executed > budget)
      throw KernelFault(fmt::format(
          "watchdog: the block executed more than {} instructions (an endless loop?); the "
          "budget is --max-insns-per-block (npusim run/op) or NPUSIM_MAX_INSNS_PER_BLOCK "
          "(TensorFlow) instructions per 128 KiB of the launch's tensor arguments; raise it if "
          "the kernel really needs more (0 turns the watchdog off)",
          budget));
    if (pc >= code.size())
      throw KernelFault(fmt::format("pc out of range: section {} has {} instructions",
                                    isa::core_kind_name(section.kind), code.size()));
    const DecodedInsn& d = decoded[pc];
    if (!d.legal) throw KernelFault("illegal instruction: " + m_run->illegal[pc]);
    if (m_recorder) m_recorder->on_scalar_pc(pc);
    const isa::Instruction& in = code[pc];
    m_scalar.reg_fields = d.reg_fields;
    // The instruction's start, for observers only (reading the time costs a call).
    const sc_time begin = attached.empty() ? SC_ZERO_TIME : sc_time_stamp() + m_local_time;
    uint32_t next = pc + 1;
    if (in.op == Opcode::op_end) {
      // The block ends when every pipe has drained; `end` itself takes no issue slot.
      sync_local();
      wait_all_drained();
      count_insn(m_scalar_counters, m_scalar_insn, in.op);
      if (!observers.empty()) notify_instruction(Lane::SCALAR, begin, sc_time_stamp(), pc, in);
      return;
    }
    const Pipe pipe = d.pipe;
    if (d.local && (next = exec_scalar_local(m_scalar, in, pc, code.size(), id)) != kNotLocal) {
      // Only the scalar state changed: no other process can tell, so no sync with time.
      count_insn(m_scalar_counters, m_scalar_insn, in.op);
    } else if (pipe == Pipe::S) {
      next = exec_scalar(in, pc);
      count_insn(m_scalar_counters, m_scalar_insn, in.op);
    } else {
      issue(in, pc, pipe);
      m_scalar_issued.inc();
    }
    m_local_time += issue_time;
    m_scalar_busy.add(issue_ps);
    if (!observers.empty() && pipe == Pipe::S)
      notify_instruction(Lane::SCALAR, begin, sc_time_stamp() + m_local_time, pc, in);
    pc = next;
  }
}

uint32_t AiCore::exec_scalar(const isa::Instruction& in, uint32_t pc) {
  const BlockIdentity id{m_launch->args, m_block, m_launch->block_dim, m_subblock,
                         m_kind_index};
  const uint32_t local = exec_scalar_local(m_scalar, in, pc, m_run->section->code.size(), id);
  if (local != kNotLocal) return local;
  auto dst = [&]() -> int64_t& { return m_scalar.regs[static_cast<size_t>(in.ops[0].value)]; };
  const Opcode op = in.op;
  switch (op) {
    case Opcode::op_ld:
    case Opcode::op_st: {
      // 8 bytes, little endian, at a GM byte address. Timing-only runs read device memory as
      // it is (what the host copied in; kernels' outputs read as zero) and store nothing: the
      // 8 bytes become undefined (DeviceMemory::invalidate).
      const uint64_t addr = static_cast<uint64_t>(m_scalar.operand(in, 1));
      if (!m_gm.in_bounds(addr, 8))
        throw KernelFault(fmt::format("GM access [{:#x}, {:#x}) is outside device memory of {} "
                                      "bytes", addr, addr + 8, m_gm.capacity()));
      sync_local();  // the access happens at this instruction's time
      if (op == Opcode::op_ld) {
        int64_t v = 0;
        m_gm.read(addr, &v, 8);
        dst() = v;
        // Where it read, among the effects (the replay reads there).
        if (m_recorder) m_recorder->on_scalar_gm(pc, {addr, 8, false});
      } else {
        const int64_t v = m_scalar.operand(in, 0);
        if (m_launch->functional) m_gm.write(addr, &v, 8);
        else m_gm.invalidate(addr, 8);
        if (m_recorder) m_recorder->on_scalar_gm(pc, {addr, 8, true});
      }
      break;
    }
    case Opcode::op_set_flag: {  // src is the scalar unit: set now
      const int src = static_cast<int>(in.ops[0].value);
      const int dst_pipe = static_cast<int>(in.ops[1].value);
      const int id = static_cast<int>(in.ops[2].value);
      check_flag_operands(src, dst_pipe, id);
      sync_local();
      set_flag(Lane::SCALAR, src, dst_pipe, id, sc_time_stamp());
      break;
    }
    case Opcode::op_wait_flag: {  // dst is the scalar unit: block it
      const int src = static_cast<int>(in.ops[0].value);
      const int dst_pipe = static_cast<int>(in.ops[1].value);
      const int id = static_cast<int>(in.ops[2].value);
      check_flag_operands(src, dst_pipe, id);
      sync_local();
      wait_flag(Lane::SCALAR, m_scalar_wait, src, dst_pipe, id, m_scalar_blocked, pc, in,
                m_stall_scalar_flag);
      break;
    }
    case Opcode::op_cc_set:
      sync_local();
      m_env.cross_core_set(*this, Lane::SCALAR, static_cast<int>(in.ops[1].value),
                           static_cast<int>(in.ops[2].value));
      break;
    case Opcode::op_cc_wait:
      sync_local();
      wait_cross_core(Lane::SCALAR, m_scalar_wait, static_cast<int>(in.ops[1].value),
                      m_scalar_blocked, pc, in, m_stall_scalar_cross_core);
      break;
    case Opcode::op_pipe_barrier: {
      const Pipe p = static_cast<Pipe>(in.ops[0].value);
      if (p != Pipe::ALL && p != Pipe::S) check_pipe_operand(p, "pipe_barrier");
      sync_local();
      const sc_time t0 = sc_time_stamp();
      if (p == Pipe::ALL) wait_all_drained();
      else if (p != Pipe::S) wait_drained(*pipe_unit(p));
      m_stall_barrier.add(time_ps(sc_time_stamp() - t0));
      break;
    }
    default:
      throw KernelFault(fmt::format("illegal instruction: {} is not executed by the scalar unit",
                                    in.desc().mnemonic));
  }
  return pc + 1;
}

void AiCore::check_pipe_operand(Pipe p, const char* what) const {
  if (static_cast<int>(p) >= isa::kNumExecPipes)
    throw KernelFault(fmt::format("illegal instruction: {} names pipe {}, which is not one pipe",
                                  what, isa::pipe_name(p)));
  if (!pipe_unit(p))
    throw KernelFault(fmt::format("illegal instruction: {} names pipe {}, which {} cores do not "
                                  "have", what, isa::pipe_name(p),
                                  isa::core_kind_name(m_kind.kind)));
}

void AiCore::check_flag_operands(int src, int dst, int id) const {
  for (int p : {src, dst})
    if (static_cast<Pipe>(p) != Pipe::S) check_pipe_operand(static_cast<Pipe>(p), "the flag");
  if (id >= m_cfg.flag_ids || id >= kMaxFlagIds)
    throw KernelFault(fmt::format("flag id {} out of range: the chip has ids 0..{}", id,
                                  m_cfg.flag_ids - 1));
}

void AiCore::issue(const isa::Instruction& in, uint32_t pc, Pipe pipe) {
  const isa::InstrDesc& desc = in.desc();
  check_pipe_operand(pipe, desc.mnemonic);
  if (has_pipe_operands(in.op))
    check_flag_operands(static_cast<int>(in.ops[0].value), static_cast<int>(in.ops[1].value),
                        static_cast<int>(in.ops[2].value));
  const IssuedOp op = m_scalar.issued(in, pc);
  sync_local();
  PipeUnit& u = *pipe_unit(pipe);
  const size_t depth = queue_depth(m_cfg);
  if (u.queue.size() >= depth) {
    const sc_time t0 = sc_time_stamp();
    while (u.queue.size() >= depth) wait_abortable(u.popped_or_abort);
    m_stall_queue_full.add(time_ps(sc_time_stamp() - t0));
  }
  u.queue.push_back({op, sc_time_stamp()});
  u.pushed.notify(SC_ZERO_TIME);
}

// ---- flags ----

void AiCore::clear_flags() {
  if (!m_unit_flag_tiles.empty()) m_unit_flag_tiles.clear();
  if (m_flags_set == 0) return;
  for (auto& by_dst : m_flags)
    for (auto& by_id : by_dst) by_id.fill(Flag{});
  m_flags_set = 0;
}

void AiCore::set_flag(Lane lane, int src, int dst, int id, sc_time effective_at) {
  Flag& f = m_flags[src][dst][id];
  if (f.set)
    throw KernelFault(fmt::format("flag {}->{} id {} is already set (set twice without a "
                                  "wait_flag in between)", isa::pipe_name(Pipe(src)),
                                  isa::pipe_name(Pipe(dst)), id));
  f.set = true;
  f.effective_at = std::max(effective_at, sc_time_stamp());
  ++m_flags_set;
  f.flow = m_env.new_flow_id();
  m_flag_event.notify(SC_ZERO_TIME);
  for (ChipObserver* o : m_observers) o->on_flow_begin(m_chip_index, lane, now_ps(), f.flow);
}

void AiCore::wait_flag(Lane lane, Waiter& w, int src, int dst, int id, Blocked& blocked,
                       uint32_t pc, const isa::Instruction& in, Counter& stall) {
  Flag& f = m_flags[src][dst][id];
  if (!f.set) {
    const sc_time t0 = sc_time_stamp();
    blocked = {&in, pc};
    while (!f.set) wait_abortable(w.flag_or_abort);
    blocked = {};
    stall.add(time_ps(sc_time_stamp() - t0));
  }
  if (f.effective_at > sc_time_stamp()) {  // set, but the setter's transfers have not landed
    const sc_time t0 = sc_time_stamp();
    blocked = {&in, pc};
    wait_abortable(f.effective_at - t0, w);
    blocked = {};
    stall.add(time_ps(sc_time_stamp() - t0));
  }
  f.set = false;
  --m_flags_set;
  for (ChipObserver* o : m_observers) o->on_flow_end(m_chip_index, lane, now_ps(), f.flow);
}

void AiCore::post_cross_core(int id, uint64_t flow) {
  m_touched = true;
  m_cross_core[static_cast<size_t>(id)].flows.push_back(flow);
  m_flag_event.notify(SC_ZERO_TIME);
}

int AiCore::cross_core_pending(int id) const {
  return static_cast<int>(m_cross_core[static_cast<size_t>(id)].flows.size());
}

void AiCore::wait_cross_core(Lane lane, Waiter& w, int id, Blocked& blocked, uint32_t pc,
                             const isa::Instruction& in, Counter& stall) {
  if (id >= m_cfg.cross_core_flag_ids || id >= kMaxFlagIds)
    throw KernelFault(fmt::format("cross-core flag id {} out of range: the chip has ids 0..{}",
                                  id, m_cfg.cross_core_flag_ids - 1));
  auto& flows = m_cross_core[static_cast<size_t>(id)].flows;
  if (flows.empty()) {
    const sc_time t0 = sc_time_stamp();
    blocked = {&in, pc};
    while (flows.empty()) wait_abortable(w.flag_or_abort);
    blocked = {};
    stall.add(time_ps(sc_time_stamp() - t0));
  }
  const uint64_t flow = flows.front();
  flows.pop_front();
  for (ChipObserver* o : m_observers) o->on_flow_end(m_chip_index, lane, now_ps(), flow);
}

// ---- pipes ----

void AiCore::pipe_thread(PipeUnit& u) {
  for (;;) {
    // Idle until work arrives. After an abort the queue is dropped by reset(), not executed.
    while (u.queue.empty() || m_abort.active()) wait(u.pushed);
    const IssuedOp op = u.queue.front().op;
    u.running_queued_at = u.queue.front().at;
    u.queue.pop_front();
    u.executing = true;
    u.popped.notify(SC_ZERO_TIME);
    bool faulted = false;
    std::string what;
    try {
      run_pipe_op(u, op);
    } catch (const Aborted&) {
    } catch (const std::exception& e) {
      faulted = true;
      what = e.what();
    }
    if (!faulted && u.queue.empty()) {
      try {
        wait_transfers_complete(u);
      } catch (const Aborted&) {
      }
    }
    u.executing = false;
    u.blocked = {};
    if (faulted) m_env.fault(*this, op.pc, op.insn, what);
    if (u.queue.empty()) u.drained.notify(SC_ZERO_TIME);
  }
}

namespace {
// Operand indices of the UnitFlag fields and the L0C tile address (isa.def).
struct UnitFlagFields {
  int mmad_uf = isa::field_index(Opcode::op_mmad, "unit_flag");
  int mmad_xc = isa::field_index(Opcode::op_mmad, "xc");
  int mmad_m = isa::field_index(Opcode::op_mmad, "m");
  int mmad_n = isa::field_index(Opcode::op_mmad, "n");
  int fix_uf = isa::field_index(Opcode::op_fixpipe, "unit_flag");
  int fix_xsrc = isa::field_index(Opcode::op_fixpipe, "xsrc");
  int fix_m = isa::field_index(Opcode::op_fixpipe, "m");
  int fix_n = isa::field_index(Opcode::op_fixpipe, "n");
};
const UnitFlagFields& unit_flag_fields() {
  static const UnitFlagFields f;
  return f;
}
// The unit flag of an mmad or fixpipe (OFF for any other instruction).
// Called for every instruction a pipe issues: the opcode is tested before the fields are fetched.
isa::UnitFlag unit_flag_of(const IssuedOp& op) {
  if (op.op() == Opcode::op_mmad)
    return static_cast<isa::UnitFlag>(op[unit_flag_fields().mmad_uf]);
  if (op.op() == Opcode::op_fixpipe)
    return static_cast<isa::UnitFlag>(op[unit_flag_fields().fix_uf]);
  return isa::UnitFlag::OFF;
}
// The L0C bytes of an m x n tile (NZ, f32 / s32 words; isa/layout.h).
uint64_t l0c_tile_bytes(int64_t m, int64_t n) {
  return layout::l0c_extent(static_cast<uint64_t>(m), static_cast<uint64_t>(n)) * 4;
}
// UnitFlag moves L0C in units of this many bytes (the Ascend C UnitFlag page: 512 B).
constexpr double kUnitFlagBytes = 512;
}  // namespace

void AiCore::unit_flag_mmad(PipeUnit& u, const IssuedOp& op, const ExecCost& cost,
                            UnitFlagTile& t) {
  if (t.last_started) {  // the previous chain's fixpipe has not drained the tile
    const sc_time t0 = sc_time_stamp();
    u.blocked = {op.insn, op.pc};
    while (t.last_started) wait_abortable(u.waiter.flag_or_abort);
    u.blocked = {};
    u.stall_flag.add(time_ps(sc_time_stamp() - t0));
  }
  t.chain_begun = true;
  if (unit_flag_of(op) == isa::UnitFlag::LAST) {
    const UnitFlagFields& f = unit_flag_fields();
    t.last_started = true;
    t.last_start = sc_time_stamp();
    t.last_end = t.last_start + cycles_to_time(static_cast<double>(cost.cycles));
    t.last_l0c_bytes = l0c_tile_bytes(op[f.mmad_m], op[f.mmad_n]);
  }
  m_flag_event.notify(SC_ZERO_TIME);
}

void AiCore::unit_flag_fixpipe(PipeUnit& u, const IssuedOp& op, const ExecCost& cost,
                               UnitFlagTile& t) {
  // In flight from here: the chain has begun; its last mmad may not have.
  u.blocked = {op.insn, op.pc};
  while (!t.last_started) wait_abortable(u.waiter.flag_or_abort);
  u.blocked = {};
  const UnitFlagFields& f = unit_flag_fields();
  // The first 512 B of the tile are complete a unit's share into the last mmad.
  const sc_time first_unit =
      t.last_start + (t.last_end - t.last_start) *
                         std::min(1.0, kUnitFlagBytes / static_cast<double>(t.last_l0c_bytes));
  if (sc_time_stamp() < first_unit) wait_abortable(first_unit - sc_time_stamp(), u.waiter);
  const sc_time t0 = sc_time_stamp();
  sc_time landed_after = SC_ZERO_TIME;  // the GM transfer's latency still to elapse
  if (cost.gm.empty()) {
    wait_abortable(cycles_to_time(static_cast<double>(cost.cycles)), u.waiter);
  } else {
    run_gm_transfer(u, cost);
    if (u.complete_at > sc_time_stamp()) landed_after = u.complete_at - sc_time_stamp();
  }
  // A constant-rate flow behind the cube's: it cannot end before the last unit, complete at
  // last_end, has moved at the rate this transfer had (its time's share of one unit).
  const double unit_share = std::min(
      1.0, kUnitFlagBytes / static_cast<double>(l0c_tile_bytes(op[f.fix_m], op[f.fix_n])));
  const sc_time done = t.last_end + (sc_time_stamp() - t0) * unit_share;
  if (sc_time_stamp() < done) {
    wait_abortable(done - sc_time_stamp(), u.waiter);
    u.complete_at = std::max(u.complete_at, sc_time_stamp() + landed_after);
  }
}

void AiCore::run_pipe_op(PipeUnit& u, const IssuedOp& op) {
  const isa::Instruction& in = *op.insn;
  sc_time start = sc_time_stamp();
  bool is_issue_timed = false;  // a GM copy with the DMA issue's minimum (run_gm_transfer)
  switch (in.op) {
    case Opcode::op_set_flag:
      // The set takes effect once this pipe's earlier GM transfers have landed. With
      // sync.set_flag_holds_pipe the pipe waits for that; without, its next instructions go on
      // at once (docs/chip_model.md, "Pipes").
      if (m_cfg.set_flag_holds_pipe) wait_transfers_complete(u);
      set_flag(u.lane, static_cast<int>(op[0]), static_cast<int>(op[1]), static_cast<int>(op[2]),
               u.complete_at);
      break;
    case Opcode::op_wait_flag:
      wait_flag(u.lane, u.waiter, static_cast<int>(op[0]), static_cast<int>(op[1]),
                static_cast<int>(op[2]), u.blocked, op.pc, in, u.stall_flag);
      break;
    case Opcode::op_cc_set:
      wait_transfers_complete(u);
      m_env.cross_core_set(*this, u.lane, static_cast<int>(op[1]), static_cast<int>(op[2]));
      break;
    case Opcode::op_cc_wait:
      wait_cross_core(u.lane, u.waiter, static_cast<int>(op[1]), u.blocked, op.pc, in,
                      u.stall_cross_core);
      break;
    default: {
      ExecContext ctx{m_cfg, m_kind, *m_local, m_gm};
      const ExecCost cost = plan(op, ctx);
      UnitFlagTile* tile = nullptr;  // an mmad's or fixpipe's with a unit flag
      if (unit_flag_of(op) != isa::UnitFlag::OFF) {
        const UnitFlagFields& f = unit_flag_fields();
        const bool mmad = in.op == Opcode::op_mmad;
        tile = &m_unit_flag_tiles[op[mmad ? f.mmad_xc : f.fix_xsrc]];
        if (mmad) {
          unit_flag_mmad(u, op, cost, *tile);
        } else if (!tile->chain_begun) {  // the fixpipe starts once its chain has begun
          const sc_time t0 = sc_time_stamp();
          u.blocked = {&in, op.pc};
          while (!tile->chain_begun) wait_abortable(u.waiter.flag_or_abort);
          u.blocked = {};
          u.stall_flag.add(time_ps(sc_time_stamp() - t0));
        }
        start = sc_time_stamp();
      }
      if (tile && in.op == Opcode::op_fixpipe) unit_flag_fixpipe(u, op, cost, *tile);
      else if (cost.gm.empty())
        wait_abortable(cycles_to_time(static_cast<double>(cost.cycles)), u.waiter);
      else run_gm_transfer(u, cost);
      is_issue_timed = cost.gm_issue_cycles > 0;
      // A fixpipe .uf3 ends after its last mmad (unit_flag_fixpipe), but within one time step
      // the M process may not have run yet: the tile's data are taken after the mmad's.
      while (tile && in.op == Opcode::op_fixpipe && !tile->last_executed)
        wait_abortable(u.waiter.flag_or_abort);
      if (m_launch->functional) execute(op, ctx);
      else invalidate_gm_writes(cost, m_gm);
      if (tile && in.op == Opcode::op_mmad && unit_flag_of(op) == isa::UnitFlag::LAST) {
        tile->last_executed = true;
        m_flag_event.notify(SC_ZERO_TIME);
      } else if (tile && in.op == Opcode::op_fixpipe) {  // drained: free for a new chain
        tile->chain_begun = tile->last_started = tile->last_executed = false;
        m_flag_event.notify(SC_ZERO_TIME);
      }
      if (m_recorder) m_recorder->on_pipe_op(u.pipe, op.pc, cost);
      u.busy.add(time_ps(sc_time_stamp() - start));
      // In flight from its start until its data has landed (complete_at covers this transfer).
      const sc_time end =
          cost.gm.empty() ? sc_time_stamp() : std::max(sc_time_stamp(), u.complete_at);
      const sc_time from = std::max(start, u.inflight_until);
      if (end > from) u.inflight.add(time_ps(end - from));
      u.inflight_until = std::max(u.inflight_until, end);
      u.stall_bank.add(cost.bank_conflict_cycles * kPsPerCycle);
      if (cost.path_src != cost.path_dst && cost.bytes) {
        Counter*& c = u.path_bytes[static_cast<size_t>(cost.path_src)]
                                  [static_cast<size_t>(cost.path_dst)];
        if (!c) {
          const std::string path = fmt::format("{}->{}", isa::buf_name(cost.path_src),
                                               isa::buf_name(cost.path_dst));
          c = &u.counters.get_or_add(fmt::format("bytes.{}_to_{}", isa::buf_name(cost.path_src),
                                                 isa::buf_name(cost.path_dst)),
                                     "bytes", "bytes moved over the " + path + " data path");
        }
        c->add(cost.bytes);
      }
      if (u.macs) u.macs->add(cost.macs);
      if (u.repeats) u.repeats->add(cost.vector_repeats);
    }
  }
  count_insn(u.counters, u.insn, in.op);
  if (u.issue_free < sc_time_stamp() && !is_issue_timed)
    u.issue_free = sc_time_stamp();  // the DMA's issue does not run past this instruction
  if (!m_observers.empty()) notify_instruction(u.lane, start, sc_time_stamp(), op.pc, in);
}

void AiCore::run_gm_transfer(PipeUnit& u, const ExecCost& cost) {
  GmTransfer& t = *u.transfer;
  t.ranges = &cost.gm;
  t.port_rate = cost.gm_core_rate;
  t.request_rate = cost.gm_request_rate;
  t.l2_port_rate = cost.path_src == isa::Buf::UB && cost.path_dst == isa::Buf::GM
                       ? m_cfg.l2_ub_write_bytes_per_cycle
                       : 0;
  uint64_t bytes = 0;
  for (const GmAccess& a : cost.gm) bytes += a.bytes;
  tlm::tlm_generic_payload& p = u.payload;
  p.set_command(cost.gm.front().write ? tlm::TLM_WRITE_COMMAND : tlm::TLM_READ_COMMAND);
  p.set_address(cost.gm.front().addr);
  p.set_data_ptr(nullptr);
  p.set_data_length(static_cast<unsigned int>(std::min<uint64_t>(bytes, UINT32_MAX)));
  p.set_streaming_width(p.get_data_length());
  p.set_byte_enable_ptr(nullptr);
  p.set_dmi_allowed(false);
  p.set_response_status(tlm::TLM_INCOMPLETE_RESPONSE);
  sc_time delay = cycles_to_time(static_cast<double>(cost.cycles));
  if (m_recorder) m_recorder->on_gm_transfer(u.pipe);
  // The DMA issues the copy's requests (ExecCost::gm_issue_cycles) from when it has issued
  // the previous copy's and this one was queued (PipeUnit::issue_free), beside the flow.
  const sc_time issue_end = std::max(u.issue_free, u.running_queued_at) +
                            cycles_to_time(cost.gm_issue_cycles);
  if (cost.gm_issue_cycles > 0) u.issue_free = issue_end;
  gm_port->b_transport(p, delay);
  // The pipe is held until the flow has moved (its bandwidth shares stay the memory system's,
  // not stretched) and the last request has gone out: it waits out the rest of the issue.
  if (sc_time_stamp() < issue_end) wait_abortable(issue_end - sc_time_stamp(), u.waiter);
  // The target returns after the bandwidth phase; `delay` is then the latency still to elapse
  // before the data has landed, which overlaps this pipe's next instructions.
  u.complete_at = std::max(u.complete_at, sc_time_stamp() + delay);
  if (p.is_response_error())
    throw KernelFault("GM transfer failed: " + p.get_response_string());
  // Contention: time beyond what the transfer takes alone at the core's port rates.
  const double alone_ps = t.alone_cycles * kPsPerCycle;
  const double actual_ps = static_cast<double>(time_ps(t.transfer_time));
  if (actual_ps > alone_ps) u.stall_mem.add(static_cast<uint64_t>(actual_ps - alone_ps + 0.5));
}

// ---- reporting ----

Counter& AiCore::insn_counter(const CounterGroup& group,
                              std::array<Counter*, isa::kNumOpcodes>& cache, Opcode op) {
  Counter*& c = cache[static_cast<size_t>(op)];
  if (!c) {
    const char* mn = isa::describe(op).mnemonic;
    c = &group.get_or_add(fmt::format("insn.{}", mn), "instructions",
                          fmt::format("{} instructions executed", mn));
  }
  return *c;
}

void AiCore::notify_instruction(Lane lane, const sc_time& start, const sc_time& end, uint32_t pc,
                                const isa::Instruction& in) {
  for (ChipObserver* o : m_observers)
    o->on_instruction(m_chip_index, lane, time_ps(start), time_ps(end), pc, in, *m_run->section);
}

std::string AiCore::where(uint32_t pc, const isa::Instruction* in) const {
  const isa::Program* prog = m_launch ? m_launch->program : nullptr;
  std::string source = prog ? (prog->source.empty() ? prog->name : prog->source) : "?";
  if (in && in->src_line) return fmt::format("pc {} ({}:{})", pc, source, in->src_line);
  return fmt::format("pc {} ({})", pc, source);
}

std::vector<std::string> AiCore::blocked_waits() const {
  std::vector<std::string> out;
  auto describe = [&](const Blocked& b) {
    if (!b.insn) return;
    const bool unit_flag = b.insn->op == Opcode::op_mmad || b.insn->op == Opcode::op_fixpipe;
    out.push_back(fmt::format("core {} {} {} {}", m_name, where(b.pc, b.insn),
                              isa::disassemble(*b.insn, m_run ? m_run->section : nullptr),
                              unit_flag ? "waits on its L0C tile's unit flag (no mmad chain "
                                          "into it, or its fixpipe never came)"
                                        : "never set"));
  };
  describe(m_scalar_blocked);
  for (const PipeUnit* u : m_pipe_list) describe(u->blocked);
  return out;
}

}  // namespace npusim
