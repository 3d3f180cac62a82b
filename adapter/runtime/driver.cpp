#include "adapter/runtime/driver.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "sim/memory/device_memory.h"
#include "sim/sc_driver.h"
#include "sim/system/fabric.h"

namespace npusim::rt {

namespace {

// Host staging buffer for copies inside the device memory, bytes.
constexpr uint64_t kStagingBytes = 1 << 20;

// memmove within the device memory, staged through host memory: forward when the destination
// lies below the source, backward otherwise, so overlapping ranges copy correctly.
void move_within_gm(DeviceMemory& gm, uint64_t dst, uint64_t src, uint64_t bytes) {
  std::vector<uint8_t> staging(std::min(bytes, kStagingBytes));
  const bool forward = dst <= src;
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t len = std::min<uint64_t>(bytes - done, staging.size());
    const uint64_t off = forward ? done : bytes - done - len;
    gm.read(src + off, staging.data(), len);
    gm.write(dst + off, staging.data(), len);
    done += len;
  }
}

// A device-to-device copy in a timing-only run: device memory there holds only what the host
// wrote, so a source without such bytes (a kernel's output) leaves the destination undefined,
// as a kernel writing it would; one with them is copied.
void copy_timing_only(DeviceMemory& gm, uint64_t dst, uint64_t src, uint64_t bytes) {
  if (gm.holds_data(src, bytes)) move_within_gm(gm, dst, src, bytes);
  else gm.invalidate(dst, bytes);
}

// Fills [dst, dst+bytes) with the little-endian 32-bit pattern (bytes a multiple of 4).
void fill32_gm(DeviceMemory& gm, uint64_t dst, uint32_t pattern, uint64_t bytes) {
  uint8_t b[4];
  std::memcpy(b, &pattern, 4);
  if (b[0] == b[1] && b[1] == b[2] && b[2] == b[3]) {
    gm.fill(dst, b[0], bytes);  // keeps untouched pages sparse for a zero pattern
    return;
  }
  std::vector<uint32_t> staging(std::min(bytes, kStagingBytes) / 4, pattern);
  for (uint64_t done = 0; done < bytes;) {
    const uint64_t len = std::min<uint64_t>(bytes - done, staging.size() * 4);
    gm.write(dst + done, staging.data(), len);
    done += len;
  }
}

// Simulated duration of moving `bytes` across the HBM interface: one HBM latency plus the bytes
// at the sustained HBM rate (peak x memory.hbm.efficiency; docs/runtime.md, "Timing").
uint64_t hbm_transfer_cycles(const ChipConfig& cfg, uint64_t bytes) {
  if (bytes == 0) return 0;
  return static_cast<uint64_t>(std::ceil(cfg.hbm_latency_cycles +
                                         static_cast<double>(bytes) / cfg.hbm_sustained_bytes_per_cycle()));
}

}  // namespace

Driver::Driver(const ChipConfig& cfg, const SimOptions& opts, bool record_launches)
    : m_record_launches(record_launches) {
  m_functional = opts.functional;
  start(
      [this, cfg, opts] {
        m_sim = std::make_unique<Simulator>(cfg, opts);
        m_cfg = &m_sim->config();
      },
      fmt::format("chip '{}'", cfg.name));
}

Driver::Driver(const SystemConfig& cfg, const SimOptions& opts, bool record_launches)
    : m_record_launches(record_launches), m_chips(cfg.chips()) {
  m_functional = opts.functional;
  start(
      [this, cfg, opts] {
        m_sys = std::make_unique<SystemSimulator>(cfg, opts);
        m_cfg = &m_sys->config().chip;
      },
      fmt::format("system '{}' ({} chips of '{}')", cfg.name, cfg.chips(), cfg.chip.name));
}

void Driver::start(std::function<void()> build, const std::string& what) {
  m_launch_count.assign(static_cast<size_t>(m_chips), 0);
  m_timeline.assign(static_cast<size_t>(m_chips), 0);
  m_comm_timeline.assign(static_cast<size_t>(m_chips), 0);
  m_ai_cpu_timeline.assign(static_cast<size_t>(m_chips), 0);
  m_ai_cpu_count.assign(static_cast<size_t>(m_chips), 0);
  m_ai_cpu_outputs.assign(static_cast<size_t>(m_chips), {});
  m_copy_end.assign(static_cast<size_t>(m_chips), 0);
  m_written.assign(static_cast<size_t>(m_chips), WrittenBy{});
  m_streams[0];  // the internal stream of synchronous operations
  m_thread = std::thread([this, build = std::move(build), what] { thread_main(build, what); });
  std::unique_lock<std::mutex> lock(m_mutex);
  m_done.wait(lock, [&] { return m_started; });
  if (!m_start_status.ok()) {
    lock.unlock();
    m_thread.join();
  }
}

Driver::~Driver() {
  if (!m_thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_stop = true;
  }
  m_work.notify_all();
  m_thread.join();
}

void Driver::thread_main(const std::function<void()>& build, const std::string& what) {
  Status st;
  try {
    build();
  } catch (const ConfigError& e) {
    st = Status(StatusCode::invalid_argument,
                fmt::format("opening a device on {}: {}", what, e.what()));
  } catch (const Error& e) {
    // The Simulator refuses a second construction in the process (SystemC elaborates once).
    st = Status(StatusCode::failed_precondition,
                fmt::format("opening a device on {}: {}", what, e.what()));
  } catch (const std::exception& e) {
    st = Status(StatusCode::internal, fmt::format("opening a device on {}: {}", what, e.what()));
  }
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_driver_id = std::this_thread::get_id();
    m_start_status = st;
    m_started = true;
  }
  m_done.notify_all();
  if (!st.ok()) return;
  loop();
  try {
    m_sim.reset();
    m_sys.reset();
  } catch (...) {
    // Destroying the chip model at shutdown must not take the process down.
  }
}

void Driver::loop() {
  std::unique_lock<std::mutex> lock(m_mutex);
  for (;;) {
    if (!m_tasks.empty()) {
      Task task = std::move(m_tasks.front());
      m_tasks.pop_front();
      lock.unlock();
      Status st = guard("driver task", [&] { return task.fn(); });
      lock.lock();
      task.completion->status = std::move(st);
      task.completion->done = true;
      m_done.notify_all();
      continue;
    }
    uint64_t id = 0;
    if (StreamState* s = pick_ready_locked(&id)) {
      DeviceOp op = std::move(s->queue.front());
      s->queue.pop_front();
      s->executing = true;
      m_last_served = id;
      // Queued after the host observed host_cycle: it starts no earlier (driver.h).
      uint64_t ready = std::max(id == 0 ? 0 : s->ready_cycle, op.host_cycle);
      if (op.kind == OpKind::record_event) op.timed_by_data = s->after_data_timed_copy;
      lock.unlock();
      uint64_t event_cycle = 0;
      Status st = execute(id, op, &ready, &event_cycle);
      lock.lock();
      finish_locked(id, *s, op, std::move(st), ready, event_cycle);  // map nodes are stable
      m_done.notify_all();
      continue;
    }
    if (m_stop) return;  // nothing left that can run
    m_work.wait(lock);
  }
}

bool Driver::head_ready_locked(uint64_t id, const StreamState& s) const {
  if (s.queue.empty() || s.executing) return false;
  const DeviceOp& op = s.queue.front();
  if (op.kind == OpKind::collective && !collective_ready_locked(op)) return false;
  if (op.kind == OpKind::wait_event) {
    auto e = m_events.find(op.event);
    if (e != m_events.end() && e->second.completed < op.event_generation) return false;
  }
  if (op.barrier) {
    for (const auto& [other_id, other] : m_streams)
      if (other_id != id && !other.queue.empty() && other.queue.front().chip == op.chip &&
          other.queue.front().seq < op.seq)
        return false;
  }
  return true;
}

Driver::StreamState* Driver::pick_ready_locked(uint64_t* id) {
  for (auto it = m_streams.upper_bound(m_last_served); it != m_streams.end(); ++it)
    if (head_ready_locked(it->first, it->second)) return *id = it->first, &it->second;
  for (auto it = m_streams.begin(); it != m_streams.end() && it->first <= m_last_served; ++it)
    if (head_ready_locked(it->first, it->second)) return *id = it->first, &it->second;
  return nullptr;
}

bool Driver::collective_ready_locked(const DeviceOp& op) const {
  const CollectiveGroup& g = *op.group;
  if (g.ran || !g.status.ok()) return true;
  if (g.joined_count < g.ranks()) return false;
  for (int r = 0; r < g.ranks(); ++r) {
    auto it = m_streams.find(g.streams[static_cast<size_t>(r)]);
    if (it == m_streams.end() || it->second.executing || it->second.queue.empty()) return false;
    const DeviceOp& head = it->second.queue.front();
    if (head.kind != OpKind::collective || head.group != op.group) return false;
  }
  return true;
}

uint64_t Driver::device_cycles(int chip) const { return m_timeline.at(static_cast<size_t>(chip)); }

uint64_t Driver::comm_cycles(int chip) const {
  return m_comm_timeline.at(static_cast<size_t>(chip));
}

uint64_t Driver::copy_cycles(int chip) const { return m_copy_end.at(static_cast<size_t>(chip)); }

uint64_t Driver::ai_cpu_cycles(int chip) const {
  return m_ai_cpu_timeline.at(static_cast<size_t>(chip));
}

uint64_t Driver::host_cycles() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_host_cycle;
}

void Driver::observe_locked(uint64_t cycle) {
  if (m_chips > 1) m_host_cycle = std::max(m_host_cycle, cycle);
}

uint64_t Driver::begin_writes(int chip) {
  if (!m_sys) return 0;
  return m_sys->gm(chip).advance_write_epoch() + 1;  // what writes stamp from now on
}

void Driver::end_writes(int chip, uint64_t epoch, uint64_t end) {
  if (!m_sys) return;
  WrittenBy& w = m_written.at(static_cast<size_t>(chip));
  uint64_t& e = w.end_of[epoch];
  e = std::max(e, end);
  while (w.end_of.size() > kWriteEntries) {  // forget the oldest: it ended no later than floor
    w.floor = std::max(w.floor, w.end_of.begin()->second);
    w.end_of.erase(w.end_of.begin());
  }
}

uint64_t Driver::input_ready(int chip, uint64_t addr, uint64_t bytes) {
  if (!m_sys || bytes == 0) return 0;
  WrittenBy& w = m_written.at(static_cast<size_t>(chip));
  // The op whose epoch is the latest at or below the range's: its writes (and the writes of
  // driver tasks that ran after it, before the next op) stamped that epoch.
  const uint64_t epoch = m_sys->gm(chip).last_write_epoch(addr, bytes);
  auto it = w.end_of.upper_bound(epoch);
  uint64_t ready = it == w.end_of.begin() ? w.floor : std::prev(it)->second;
  for (const WrittenBy::CommOutput& o : w.comm_outputs)
    if (addr < o.addr + o.bytes && o.addr < addr + bytes) ready = std::max(ready, o.ready);
  return ready;
}

int64_t Driver::input_launch(int chip, uint64_t addr, uint64_t bytes) const {
  if (!m_sys || bytes == 0) return -1;
  const WrittenBy& w = m_written.at(static_cast<size_t>(chip));
  auto it = w.launch_of.upper_bound(m_sys->gm(chip).last_write_epoch(addr, bytes));
  return it == w.launch_of.begin() ? -1 : static_cast<int64_t>(std::prev(it)->second);
}

namespace {

// Calls reads(addr, bytes) for each device range `op` reads (whose pending writers it waits
// for): a copy's source; a kernel's arguments (each as one byte: the runtime cannot tell
// addresses from scalars) and derived sources; an AI CPU task's inputs and the outputs it
// overwrites.
void for_each_read(const DeviceOp& op, const std::function<void(uint64_t, uint64_t)>& reads) {
  switch (op.kind) {
    case OpKind::memcpy_d2h:
    case OpKind::memcpy_d2d:
    case OpKind::memcpy_peer: reads(op.src, op.bytes); break;
    case OpKind::launch:
      for (uint64_t a : op.args) reads(a, 1);
      if (op.derived.state) {
        reads(op.derived.addr, op.derived.bytes);
        for (const DerivedRange& r : op.derived.more) reads(r.addr, r.bytes);
      }
      break;
    case OpKind::launch_group:
      for (const DeviceOp& m : op.members) for_each_read(m, reads);
      break;
    case OpKind::ai_cpu_task:
      for (const DerivedRange& r : op.ai_cpu->inputs) reads(r.addr, r.bytes);
      for (const DerivedRange& r : op.ai_cpu->outputs) reads(r.addr, r.bytes);
      break;
    default: break;
  }
}

}  // namespace

uint64_t Driver::ai_cpu_output_ready(int chip, uint64_t addr, uint64_t bytes) {
  auto& outs = m_ai_cpu_outputs.at(static_cast<size_t>(chip));
  if (outs.empty() || bytes == 0) return 0;
  const uint64_t now = m_timeline.at(static_cast<size_t>(chip));
  outs.erase(std::remove_if(outs.begin(), outs.end(),
                            [&](const AiCpuOutput& o) { return o.ready <= now; }),
             outs.end());
  uint64_t ready = 0;
  for (const AiCpuOutput& o : outs)
    if (addr < o.addr + o.bytes && o.addr < addr + bytes) ready = std::max(ready, o.ready);
  return ready;
}

uint64_t Driver::comm_output_ready(const DeviceOp& op, uint64_t* collective) {
  if (collective) *collective = 0;
  // The AI CPU's pending outputs that op reads (single chips and systems).
  uint64_t ai_cpu = 0;
  if (!m_ai_cpu_outputs.at(static_cast<size_t>(op.chip)).empty())
    for_each_read(op, [&](uint64_t addr, uint64_t bytes) {
      ai_cpu = std::max(ai_cpu, ai_cpu_output_ready(op.chip, addr, bytes));
    });
  return std::max(ai_cpu, comm_ready(op, collective));
}

uint64_t Driver::comm_ready(const DeviceOp& op, uint64_t* collective) {
  if (!m_sys) return 0;
  WrittenBy& w = m_written.at(static_cast<size_t>(op.chip));
  DeviceMemory& gm = m_sys->gm(op.chip);
  const uint64_t now = m_timeline.at(static_cast<size_t>(op.chip));
  // A pending output (the chip's compute timeline has not passed it) written since is done
  // with. Passed ones delay nothing (the timeline only moves on) but stay for the record of their
  // readers, up to kCommOutputs of them (the oldest go first); whether what a reader reads of one
  // was written since is checked on that part only (a whole segment's blocks per op would cost
  // more than the op).
  auto& outs = w.comm_outputs;
  outs.erase(std::remove_if(outs.begin(), outs.end(),
                            [&](const WrittenBy::CommOutput& o) {
                              return o.ready > now &&
                                     gm.last_write_epoch(o.addr, o.bytes) > o.epoch;
                            }),
             outs.end());
  for (auto it = outs.begin(); outs.size() > kCommOutputs && it != outs.end();)
    it = it->ready <= now ? outs.erase(it) : std::next(it);
  if (outs.empty()) return 0;
  uint64_t ready = 0, latest = 0;
  auto reads = [&](uint64_t addr, uint64_t bytes) {
    for (const WrittenBy::CommOutput& o : outs) {
      const uint64_t lo = std::max(addr, o.addr), hi = std::min(addr + bytes, o.addr + o.bytes);
      if (lo >= hi) continue;
      if (o.ready > now) {
        ready = std::max(ready, o.ready);
        latest = std::max(latest, o.collective);
      } else if (gm.last_write_epoch(lo, hi - lo) <= o.epoch) {
        latest = std::max(latest, o.collective);
      }
    }
  };
  for_each_read(op, reads);
  if (collective) *collective = latest;
  return ready;
}

uint64_t Driver::sim_cycles() const { return m_sys ? m_sys->now_cycles() : m_sim->now_cycles(); }

void Driver::align_simulation() {
  if (m_sys) sc_driver::start_on_clock_edge();
}

Driver::Placement Driver::place(const std::vector<int>& chips, uint64_t ready, uint64_t idle,
                                uint64_t modelled, const std::function<void()>& run,
                                uint64_t data_ready) {
  Placement p;
  p.start = ready;
  for (int c : chips) p.start = std::max(p.start, m_timeline.at(static_cast<size_t>(c)));
  p.start = std::max(p.start + idle, data_ready);
  align_simulation();
  p.sim_start = sim_cycles();
  std::vector<uint64_t> epochs;
  for (int c : chips) epochs.push_back(begin_writes(c));
  p.write_epoch = epochs.empty() ? 0 : epochs[0];
  // The chips' timelines move to the op's end even if it throws (the simulation may have moved).
  struct MoveTimelines {
    Driver& d;
    const std::vector<int>& chips;
    const std::vector<uint64_t>& epochs;
    const Placement& p;
    uint64_t modelled;
    ~MoveTimelines() {
      const uint64_t end = p.at(d.sim_cycles()) + modelled;
      for (size_t i = 0; i < chips.size(); ++i) {
        d.m_timeline[static_cast<size_t>(chips[i])] = end;
        d.end_writes(chips[i], epochs[i], end);
      }
    }
  } move{*this, chips, epochs, p, modelled};
  run();
  align_simulation();
  return p;
}

Driver::Placement Driver::place_by_data(const DeviceOp& op, const std::function<void()>& run,
                                        uint64_t* end) {
  Placement p;
  // An h2d copy's source is the host's: ready when the host queued it (its host clock).
  const bool h2d = op.kind == OpKind::memcpy_h2d;
  p.start = h2d ? op.host_cycle
                : std::max({op.host_cycle, input_ready(op.chip, op.src, op.bytes),
                            comm_output_ready(op)});
  align_simulation();
  p.sim_start = sim_cycles();
  // The chip whose memory the copy writes: a peer copy's destination chip, an h2d copy's own.
  const bool peer = op.kind == OpKind::memcpy_peer;
  const int dst_chip = peer ? op.dst_chip : op.chip;
  const uint64_t dst_epoch = peer || h2d ? begin_writes(dst_chip) : 0;
  auto finish = [&] {
    *end = p.at(sim_cycles());
    uint64_t& last = m_copy_end.at(static_cast<size_t>(op.chip));
    last = std::max(last, *end);
    if (peer || h2d) end_writes(dst_chip, dst_epoch, *end);
    // Off the compute timeline, the bytes are pending for the chip's kernels until its end (as a
    // collective's output: comm_output_ready).
    if (h2d)
      m_written.at(static_cast<size_t>(dst_chip))
          .comm_outputs.push_back({op.dst, op.bytes, *end, dst_epoch, 0});
  };
  try {
    run();
    align_simulation();
  } catch (...) {
    finish();
    throw;
  }
  finish();
  return p;
}

DeviceMemory& Driver::gm(int chip) { return m_sys ? m_sys->gm(chip) : m_sim->gm(); }

KernelResult Driver::run_on_chip(int chip, const KernelLaunch& launch) {
  if (!m_sys) return m_sim->run(launch);
  return m_sys->run({ChipLaunch{chip, launch}}).at(0);
}

HdcResult Driver::hdc_copy(const DeviceOp& op) {
  if (op.kind == OpKind::memcpy_h2d)
    return m_sys ? m_sys->copy_host_to_device(op.chip, op.dst, op.host_src, op.bytes)
                 : m_sim->copy_host_to_device(op.dst, op.host_src, op.bytes);
  return m_sys ? m_sys->copy_device_to_host(op.chip, op.host_dst, op.src, op.bytes)
               : m_sim->copy_device_to_host(op.host_dst, op.src, op.bytes);
}

Status Driver::run_peer_copy(uint64_t stream, const DeviceOp& op, uint64_t* ready) {
  if (!m_sys)
    return Status(StatusCode::failed_precondition,
                  "memcpy_peer: the device is a single chip, not a chip of a system");
  if (op.bytes == 0) return Status();
  // Queued on the source chip's stream: it starts when that stream and chip are free and holds
  // the source chip's timeline (a copy timed by its data: when its source was written, off the
  // timelines, place_by_data). The destination chip computes on meanwhile (the copy is the
  // source's DMA): its work that reads the bytes waits for an event recorded after the copy, as
  // TensorFlow orders it. (Holding the destination too chained the replicas of a
  // MirroredStrategy step: chip k-1 -> chip 0 moved chip 0 past chip k-1's compute, and chip
  // 0 -> chip k, which chip k's graph waited for, came after it.)
  PeerCopyResult r;
  const auto copy = [&] {
    r = m_sys->copy_peer({PeerCopy{op.chip, op.src, op.dst_chip, op.dst, op.bytes}});
  };
  if (op.timed_by_data) {
    const Placement p = place_by_data(op, copy, ready);
    record_copy(stream, op, p.at(r.start_cycle), r.cycles);
    return Status();
  }
  const uint64_t dst_epoch = begin_writes(op.dst_chip);
  const Placement p = place({op.chip}, *ready, 0, 0, copy, comm_output_ready(op));
  record_copy(stream, op, p.at(r.start_cycle), r.cycles);
  *ready = device_cycles(op.chip);
  end_writes(op.dst_chip, dst_epoch, *ready);
  return Status();
}

namespace {
// Bytes per Fabric channel of a collective's transfers (each on every channel of its route), in
// channel order.
std::vector<CollectiveRecord::Link> link_use(const Fabric& fabric,
                                             const std::vector<CollectiveStep>& steps) {
  std::vector<uint64_t> bytes(fabric.channel_count(), 0);
  for (const CollectiveStep& step : steps)
    for (const CollectiveStepTransfer& t : step.transfers)
      for (int c : fabric.route(t.src_chip, t.dst_chip).channels)
        bytes[static_cast<size_t>(c)] += t.bytes;
  std::vector<CollectiveRecord::Link> links;
  for (size_t c = 0; c < bytes.size(); ++c)
    if (bytes[c] > 0)
      links.push_back({fabric.channel_name(static_cast<int>(c)),
                       fabric.channel_gbps(static_cast<int>(c)), bytes[c]});
  return links;
}
}  // namespace

namespace {
// Rank r's buffer as pieces: its pieces in `list` if it has them, else the one buffer.
std::vector<CollectivePiece> pieces(const std::vector<std::vector<CollectivePiece>>& list,
                                    uint64_t addr, uint64_t bytes, size_t r) {
  if (r < list.size() && !list[r].empty()) return list[r];
  return {CollectivePiece{addr, bytes}};
}
}  // namespace

uint64_t Driver::place_collective(const CollectiveCall& call, uint64_t id, uint64_t ready,
                                  Placement* p, const std::function<void()>& run,
                                  std::vector<int64_t>* input_launch) {
  const size_t n = call.chips.size();
  // The ranks whose send buffer the collective reads: all, but the root of a broadcast and
  // rank 0 of a send_recv.
  auto sends = [&](size_t r) {
    if (call.kind == CollectiveKind::broadcast) return static_cast<int>(r) == call.root;
    if (call.kind == CollectiveKind::send_recv) return r == 0;
    return true;
  };
  const uint64_t send_bytes = collective_send_bytes(call), recv_bytes = collective_recv_bytes(call);
  p->start = ready;
  input_launch->assign(n, -1);
  for (size_t r = 0; r < n; ++r) {
    const int c = call.chips[r];
    if (c < 0 || c >= m_chips) continue;  // run_collective names it
    p->start = std::max(p->start, m_comm_timeline[static_cast<size_t>(c)]);
    if (!sends(r)) continue;
    for (const CollectivePiece& piece : pieces(call.send_pieces, call.send[r], send_bytes, r))
      if (m_sys->gm(c).in_bounds(piece.addr, piece.bytes)) {
        p->start = std::max(p->start, input_ready(c, piece.addr, piece.bytes));
        (*input_launch)[r] =
            std::max((*input_launch)[r], this->input_launch(c, piece.addr, piece.bytes));
      }
  }
  align_simulation();
  p->sim_start = sim_cycles();
  std::vector<uint64_t> epochs;
  for (int c : call.chips) epochs.push_back(c >= 0 && c < m_chips ? begin_writes(c) : 0);
  // The communication timelines move to the end even if it throws (the simulation may have
  // moved); the outputs are pending for their readers once it ran.
  uint64_t end = p->start;
  auto move = [&] {
    end = p->at(sim_cycles());
    for (size_t r = 0; r < n; ++r) {
      const int c = call.chips[r];
      if (c < 0 || c >= m_chips) continue;
      uint64_t& comm = m_comm_timeline[static_cast<size_t>(c)];
      comm = std::max(comm, end);
      end_writes(c, epochs[r], end);
    }
  };
  try {
    run();
    align_simulation();
  } catch (...) {
    move();
    throw;
  }
  move();
  for (size_t r = 0; r < n; ++r) {
    const bool writes = call.kind != CollectiveKind::send_recv || r == 1;
    if (!writes || !recv_bytes) continue;
    for (const CollectivePiece& piece : pieces(call.recv_pieces, call.recv[r], recv_bytes, r))
      m_written[static_cast<size_t>(call.chips[r])].comm_outputs.push_back(
          {piece.addr, piece.bytes, end, epochs[r], id});
  }
  return end;
}

Status Driver::run_collective_part(uint64_t stream, const DeviceOp& op, uint64_t* ready) {
  CollectiveGroup& g = *op.group;
  // Every rank's part is at the head of its stream (collective_ready_locked): the collective
  // starts once every rank's stream and communication timeline are ready and the bytes each rank
  // sends have been written (driver.h, "Data readiness"); its chips compute on meanwhile.
  uint64_t ranks_ready = *ready;
  {
    std::lock_guard<std::mutex> lock(m_mutex);
    if (g.ran || !g.status.ok()) {
      *ready = std::max(*ready, g.end_cycle);
      return g.stream_errors ? g.status : Status();
    }
    for (uint64_t id : g.streams)
      if (auto it = m_streams.find(id); it != m_streams.end() && id != 0)
        ranks_ready = std::max(ranks_ready, it->second.ready_cycle);
    ranks_ready = std::max(ranks_ready, g.host_cycle);  // queued after the host observed it
  }
  Status st;
  CollectiveResult r;
  Placement p;
  uint64_t end = *ready;
  const uint64_t id = ++m_collective_count;
  std::vector<int64_t> input_launch;
  if (!m_sys) {
    st = Status(StatusCode::failed_precondition,
                "collective: the device is a single chip, not a chip of a system");
  } else {
    const std::string where = fmt::format("stream {}: {}", stream, op.describe());
    st = guard(where, [&] {
      try {
        end = place_collective(g.call, id, ranks_ready, &p,
                               [&] { r = run_collective(*m_sys, g.call); }, &input_launch);
      } catch (const Error& e) {  // a malformed call (e.g. ranks of different counts)
        return Status(StatusCode::invalid_argument, where + ": " + e.what());
      }
      return Status();
    });
    if (!st.ok()) end = std::max(*ready, end);
  }
  if (st.ok() && m_record_launches) {
    CollectiveRecord rec;
    rec.id = id;
    rec.collective = collective_name(g.call.kind);
    rec.algorithm = r.algorithm;
    if (g.call.kind == CollectiveKind::all_reduce || g.call.kind == CollectiveKind::reduce_scatter)
      rec.op = reduce_op_name(g.call.op);
    rec.dtype = isa::dtype_name(g.call.dtype);
    rec.label = g.label;
    rec.count = g.call.count;
    rec.bytes = collective_send_bytes(g.call);
    rec.link_bytes = r.link_bytes;
    rec.chips = g.call.chips;
    rec.input_launch = std::move(input_launch);
    rec.start_cycle = p.at(r.start_cycle);
    // Its end on the communication timelines: the last cycle it occupied, counted whole
    // (align_simulation), the start of what waits for it.
    rec.end_cycle = std::max(rec.start_cycle + r.cycles, end);
    for (CollectiveStep& step : r.step_records) step.start_cycle = p.at(step.start_cycle);
    rec.steps = r.steps;
    rec.inline_reduce = r.inline_reduce;
    rec.recv_bytes = collective_recv_bytes(g.call);
    rec.reduce_cycles = r.reduce_cycles;
    rec.links = link_use(m_sys->fabric(), r.step_records);
    rec.step_records = std::move(r.step_records);
    std::lock_guard<std::mutex> lock(m_mutex);
    m_collective_records.push_back(std::move(rec));
  }
  std::lock_guard<std::mutex> lock(m_mutex);
  g.ran = true;
  g.status = st;
  g.end_cycle = end;
  *ready = end;
  return g.stream_errors ? st : Status();
}

Status Driver::execute(uint64_t stream, DeviceOp& op, uint64_t* ready, uint64_t* event_cycle) {
  const std::string where = stream == 0 ? "synchronous " + op.describe()
                                         : fmt::format("stream {}: {}", stream, op.describe());
  return guard(where, [&]() -> Status {
    DeviceMemory& gm = this->gm(op.chip);
    switch (op.kind) {
      case OpKind::memcpy_h2d:
      case OpKind::memcpy_d2h:
        if (op.bytes && op.timed_by_data && m_sys) {
          HdcResult r;
          const Placement p = place_by_data(op, [&] { r = hdc_copy(op); }, ready);
          record_copy(stream, op, p.at(r.start_cycle), r.cycles);
        } else if (op.bytes) {
          HdcResult r;
          const Placement p = place({op.chip}, *ready, 0, 0, [&] { r = hdc_copy(op); },
                                    comm_output_ready(op));
          record_copy(stream, op, p.at(r.start_cycle), r.cycles);
          *ready = device_cycles(op.chip);
        }
        return Status();
      case OpKind::memcpy_peer:
        return run_peer_copy(stream, op, ready);
      case OpKind::collective:
        return run_collective_part(stream, op, ready);
      case OpKind::ai_cpu_task:
        return run_ai_cpu_task(stream, op, *ready);
      case OpKind::memcpy_d2d:
        if (op.bytes && op.dst != op.src) {
          if (m_functional) move_within_gm(gm, op.dst, op.src, op.bytes);
          else copy_timing_only(gm, op.dst, op.src, op.bytes);
        }
        add_modelled_time(stream, op, hbm_transfer_cycles(*m_cfg, 2 * op.bytes),  // read+write
                          ready);
        return Status();
      case OpKind::memset8:  // the host's bytes: kept in timing-only runs too
        if (op.bytes) gm.fill(op.dst, static_cast<uint8_t>(op.pattern), op.bytes);
        add_modelled_time(stream, op, hbm_transfer_cycles(*m_cfg, op.bytes), ready);
        return Status();
      case OpKind::memset32:
        if (op.bytes) fill32_gm(gm, op.dst, op.pattern, op.bytes);
        add_modelled_time(stream, op, hbm_transfer_cycles(*m_cfg, op.bytes), ready);
        return Status();
      case OpKind::launch:
        return op.derived.state ? run_derived_launch(stream, op, ready)
                                : run_launch(stream, op, ready);
      case OpKind::launch_group:
        return run_launch_group(stream, op, ready);
      case OpKind::record_event:
        // Complete once its stream's earlier ops have run, on its chip's timeline (after a copy
        // timed by its data: at that copy's end, off the timeline).
        *event_cycle = op.timed_by_data ? *ready : std::max(device_cycles(op.chip), *ready);
        return Status();
      case OpKind::wait_event: {
        // Its stream's next op starts no earlier than the record it waited for (of any chip),
        // unless the wait orders execution only.
        std::lock_guard<std::mutex> lock(m_mutex);
        if (auto e = m_events.find(op.event); e != m_events.end() && !op.order_only)
          *ready = std::max(*ready, e->second.cycle);
        return Status();
      }
      case OpKind::host_callback: {
        {  // the host holds what its stream read back before it
          std::lock_guard<std::mutex> lock(m_mutex);
          if (auto it = m_streams.find(stream); it != m_streams.end())
            observe_locked(it->second.read_cycle);
        }
        Status st = op.callback ? op.callback() : Status();
        if (!st.ok()) return Status(st.code(), where + ": " + st.message());
        return st;
      }
    }
    return Status(StatusCode::internal, where + ": unknown operation");
  });
}

Status Driver::run_ai_cpu_task(uint64_t stream, const DeviceOp& op, uint64_t ready) {
  const AiCpuTask& task = *op.ai_cpu;
  const size_t chip = static_cast<size_t>(op.chip);
  if (m_cfg->ai_cpu_cores <= 0)
    return Status(StatusCode::failed_precondition,
                  fmt::format("AI CPU task '{}': chip '{}' models no AI CPU (its config has no "
                              "ai_cpu section)",
                              task.kernel, m_cfg->name));
  // Its start: its stream and the AI CPU are ready, the host has queued it, and what it reads
  // (and the outputs it overwrites) was written: on a system the write epochs tell; everywhere
  // pending collective and AI CPU outputs.
  uint64_t start =
      std::max({ready, m_ai_cpu_timeline[chip], op.host_cycle, comm_output_ready(op)});
  for (const DerivedRange& r : task.inputs)
    start = std::max(start, input_ready(op.chip, r.addr, r.bytes));
  const uint64_t epoch = begin_writes(op.chip);
  Status st;
  if (m_functional && task.compute) st = task.compute(gm(op.chip));
  const uint64_t end = start + task.cycles;
  m_ai_cpu_timeline[chip] = end;
  end_writes(op.chip, epoch, end);
  for (const DerivedRange& r : task.outputs)
    if (r.bytes) m_ai_cpu_outputs[chip].push_back({r.addr, r.bytes, end});
  const uint64_t index = m_ai_cpu_count[chip]++;
  if (m_record_launches) {
    AiCpuRecord rec;
    rec.index = index;
    rec.chip = op.chip;
    rec.kernel = task.kernel;
    rec.stream = stream;
    rec.start_cycle = start;
    rec.cycles = task.cycles;
    rec.time_us = static_cast<double>(task.cycles) / m_cfg->clock_mhz;
    rec.label = task.label;
    std::lock_guard<std::mutex> lock(m_mutex);
    m_ai_cpu_records.push_back(std::move(rec));
  }
  if (st.ok()) return st;
  return Status(st.code(), fmt::format("AI CPU task '{}'{}: {}", task.kernel,
                                       task.label ? " of node '" + task.label->op_name + "'" : "",
                                       st.message()));
}

void Driver::record_copy(uint64_t stream, const DeviceOp& op, uint64_t start_cycle,
                         uint64_t cycles) {
  if (!m_record_launches || op.bytes == 0) return;
  CopyRecord rec;
  rec.kind = op.kind;
  rec.stream = stream;
  rec.chip = op.chip;
  rec.dst_chip = op.kind == OpKind::memcpy_peer ? op.dst_chip : op.chip;
  rec.bytes = op.bytes;
  rec.start_cycle = start_cycle;
  rec.cycles = cycles;
  std::lock_guard<std::mutex> lock(m_mutex);
  m_copy_records.push_back(rec);
}

void Driver::add_modelled_time(uint64_t stream, const DeviceOp& op, uint64_t cycles,
                               uint64_t* ready) {
  const Placement p = place({op.chip}, *ready, 0, cycles, [] {}, comm_output_ready(op));
  record_copy(stream, op, p.start, cycles);
  *ready = device_cycles(op.chip);
}

KernelLaunch Driver::kernel_launch(const DeviceOp& op) {
  KernelLaunch launch;
  launch.program = op.program.get();
  launch.args = op.args;
  launch.gm_blocks = op.gm_blocks;
  // A graph's task list is one run (memory.l2.keep_within_graph_run keeps the L2 through it).
  launch.l2_run = op.label ? op.label->graph_run : 0;
  // The static plan's buffers its tensors lie in (the memory system files by them when the
  // launch's L2 starts cold).
  if (op.label) launch.planned_blocks = op.label->planned_blocks;
  launch.block_dim = op.block_dim;
  launch.counter_tree = false;  // records keep the flat delta; the tree is built when read
  return launch;
}

Status Driver::run_launch(uint64_t stream, const DeviceOp& op, uint64_t* ready) {
  const KernelLaunch launch = kernel_launch(op);
  // The device idles while the host dispatches the op.
  const uint64_t host_dispatch = take_host_dispatch(op);
  const auto wall_start = std::chrono::steady_clock::now();
  KernelResult r;
  uint64_t reads_collective = 0;
  const uint64_t data_ready = comm_output_ready(op, &reads_collective);
  const Placement p = place({op.chip}, *ready, host_dispatch, 0,
                            [&] { r = run_on_chip(op.chip, launch); }, data_ready);
  *ready = device_cycles(op.chip);
  const double wall_us = std::chrono::duration<double, std::micro>(
      std::chrono::steady_clock::now() - wall_start).count();
  return finish_launch(stream, op, std::move(r), p, wall_us, host_dispatch, reads_collective);
}

Status Driver::run_launch_group(uint64_t stream, const DeviceOp& op, uint64_t* ready) {
  if (m_sys) {  // a chip of a system: one after another (SystemSimulator runs lone launches)
    Status first;
    for (const DeviceOp& m : op.members) {
      DeviceOp member = m;
      member.host_cycle = op.host_cycle;
      Status st = run_launch(stream, member, ready);
      if (first.ok()) first = std::move(st);
    }
    return first;
  }
  std::vector<ConcurrentLaunch> launches;
  std::vector<uint64_t> host_dispatch, reads_collective(op.members.size(), 0);
  uint64_t idle = 0, data_ready = 0;
  for (size_t j = 0; j < op.members.size(); ++j) {
    const DeviceOp& m = op.members[j];
    ConcurrentLaunch c;
    c.launch = kernel_launch(m);
    c.after = m.group_after;
    c.take_cores_when_ready = true;  // a stream's task gets cores as they free
    launches.push_back(std::move(c));
    host_dispatch.push_back(take_host_dispatch(m));
    idle += host_dispatch.back();
    data_ready = std::max(data_ready, comm_output_ready(m, &reads_collective[j]));
  }
  const auto wall_start = std::chrono::steady_clock::now();
  ConcurrentResult r;
  const Placement p = place({op.chip}, *ready, idle, 0,
                            [&] { r = m_sim->run_concurrent(launches); }, data_ready);
  *ready = device_cycles(op.chip);
  // The host's time is the group's; each record gets an equal share.
  const double wall_us = std::chrono::duration<double, std::micro>(
                             std::chrono::steady_clock::now() - wall_start).count() /
                         static_cast<double>(op.members.size());
  Status first;
  for (size_t j = 0; j < op.members.size(); ++j) {
    Status st = finish_launch(stream, op.members[j], std::move(r.launches.at(j)), p, wall_us,
                              host_dispatch[j], reads_collective[j]);
    if (first.ok()) first = std::move(st);
  }
  return first;
}

Status Driver::finish_launch(uint64_t stream, const DeviceOp& op, KernelResult r,
                             const Placement& p, double wall_us, uint64_t host_dispatch,
                             uint64_t reads_collective) {
  const uint64_t index = m_launch_count.at(static_cast<size_t>(op.chip))++;
  if (m_sys) {  // the launch's writes stamped p.write_epoch: which kernel wrote what
    WrittenBy& w = m_written.at(static_cast<size_t>(op.chip));
    w.launch_of[p.write_epoch] = index;
    if (w.launch_of.size() > kWriteEntries) w.launch_of.erase(w.launch_of.begin());
  }
  const std::string& name = op.program->name;
  if (m_record_launches) {
    LaunchRecord rec;
    rec.index = index;
    rec.chip = op.chip;
    rec.kernel = name;
    rec.stream = stream;
    rec.block_dim = op.block_dim;
    rec.start_cycle = p.at(r.start_cycle);
    rec.cycles = r.cycles;
    rec.time_us = r.time_us;
    rec.wall_us = wall_us;
    rec.replayed = r.replayed;
    rec.host_dispatch_cycles = host_dispatch;
    rec.ok = r.ok;
    rec.error = r.error;
    rec.counter_delta = std::move(r.counter_delta);
    rec.sim_start_cycle = r.start_cycle;
    rec.program = op.program;
    rec.label = op.label;
    rec.reads_collective = reads_collective;
    std::lock_guard<std::mutex> lock(m_mutex);
    m_records.push_back(std::move(rec));
  }
  if (r.ok) return Status();
  // A graph's launches are synchronised once for the whole graph: name the node that faulted.
  const std::string node =
      op.label && op.label->graph_run != 0
          ? fmt::format(" of node '{}' ({})", op.label->op_name, op.label->op_type)
          : std::string();
  return Status(StatusCode::kernel_fault,
                fmt::format("kernel '{}'{} ({}stream {}, block_dim {}, launch #{}) failed: {}",
                            name, node, m_sys ? fmt::format("chip {}, ", op.chip) : "", stream,
                            op.block_dim, index, r.error));
}

uint64_t Driver::take_host_dispatch(const DeviceOp& op) {
  const LaunchLabel* label = op.label.get();
  if (!label || label->host_dispatch == LaunchLabel::HostDispatch::none) return 0;
  if (label->dispatch != 0) {
    auto& paid = m_charged_dispatches;
    if (std::find(paid.begin(), paid.end(), label->dispatch) != paid.end()) return 0;
    paid.push_back(label->dispatch);
    if (paid.size() > kRecentDispatches) paid.pop_front();
  }
  return m_cfg->us_to_cycles(label->host_dispatch == LaunchLabel::HostDispatch::graph
                                 ? m_cfg->host_graph_dispatch_us
                                 : m_cfg->host_op_dispatch_us);
}

Status Driver::run_derived_launch(uint64_t stream, const DeviceOp& op, uint64_t* ready) {
  DerivedState& state = *op.derived.state;
  DeviceMemory& gm = this->gm(op.chip);
  uint64_t written = gm.last_write_epoch(op.derived.addr, op.derived.bytes);
  for (const DerivedRange& r : op.derived.more)
    written = std::max(written, gm.last_write_epoch(r.addr, r.bytes));
  // Timing-only runs stamp the bytes kernels write too (DeviceMemory::invalidate), so a
  // derived launch is left out exactly where a functional run leaves it out.
  if (state.valid.load() && written <= state.epoch.load()) {
    ++state.unchanged;
    if (op.derived.may_skip) {
      ++state.skipped;
      return Status();
    }
  }
  state.valid.store(false);
  // Writes from here on (this launch's own included) stamp epochs above `seen`.
  const uint64_t seen = gm.advance_write_epoch();
  Status st = run_launch(stream, op, ready);
  if (st.ok()) {
    state.epoch.store(seen);
    state.valid.store(true);
  }
  return st;
}

void Driver::finish_locked(uint64_t stream_id, StreamState& s, const DeviceOp& op, Status st,
                           uint64_t ready, uint64_t event_cycle) {
  s.executing = false;
  s.completed++;
  if (stream_id != 0) s.ready_cycle = ready;
  if (op.kind == OpKind::memcpy_d2h && st.ok()) s.read_cycle = std::max(s.read_cycle, ready);
  if (op.kind != OpKind::record_event && op.kind != OpKind::wait_event &&
      op.kind != OpKind::host_callback)
    s.after_data_timed_copy = op.timed_by_data;
  if (auto t = s.sync_targets.find(s.completed); t != s.sync_targets.end()) {
    t->second.ready = ready;
    t->second.read = s.read_cycle;
  }
  if (op.kind == OpKind::record_event) {
    auto e = m_events.find(op.event);
    if (e != m_events.end()) {
      EventState& ev = e->second;
      if (op.event_generation > ev.completed) {
        ev.completed = op.event_generation;
        ev.cycle = event_cycle;
        ev.read_cycle = s.read_cycle;
      }
      if (ev.destroyed && ev.completed >= ev.recorded) m_events.erase(e);
    }
  }
  if (op.completion) {
    op.completion->status = std::move(st);
    op.completion->end_cycle = ready;
    op.completion->done = true;
  } else if (!st.ok()) {
    if (s.error.ok()) s.error = std::move(st);
    else s.more_errors++;
  }
  if (s.destroyed && s.queue.empty()) m_streams.erase(stream_id);
}

Status Driver::not_on_driver_thread(const char* what) const {
  return Status(StatusCode::failed_precondition,
                fmt::format("{} was called from a host callback: it waits for the driver thread, "
                            "which runs the callback; queue the work instead", what));
}

Status Driver::find_stream_locked(Stream s, const char* what, StreamState** out) {
  if (s.id == 0)
    return Status(StatusCode::invalid_argument,
                  fmt::format("{}: stream 0 is not a stream (create one with create_stream)",
                              what));
  auto it = m_streams.find(s.id);
  if (it == m_streams.end() || it->second.destroyed)
    return Status(StatusCode::invalid_argument,
                  fmt::format("{}: stream {} does not exist (never created, or destroyed)", what,
                              s.id));
  *out = &it->second;
  return Status();
}

Status Driver::find_event_locked(Event e, const char* what, EventState** out) {
  auto it = m_events.find(e.id);
  if (it == m_events.end() || it->second.destroyed)
    return Status(StatusCode::invalid_argument,
                  fmt::format("{}: event {} does not exist (never created, or destroyed)", what,
                              e.id));
  *out = &it->second;
  return Status();
}

Status Driver::create_stream(Stream* out, int chip) {
  if (chip < 0 || chip >= m_chips)
    return Status(StatusCode::invalid_argument,
                  fmt::format("create_stream: chip {} does not exist ({} chips)", chip, m_chips));
  std::lock_guard<std::mutex> lock(m_mutex);
  out->id = m_next_stream++;
  m_streams[out->id].chip = chip;
  return Status();
}

Status Driver::destroy_stream(Stream s) {
  std::lock_guard<std::mutex> lock(m_mutex);
  StreamState* st = nullptr;
  if (Status r = find_stream_locked(s, "destroy_stream", &st); !r.ok()) return r;
  st->destroyed = true;
  if (st->queue.empty() && !st->executing) m_streams.erase(s.id);
  return Status();
}

Status Driver::submit(Stream s, DeviceOp op) {
  std::lock_guard<std::mutex> lock(m_mutex);
  StreamState* st = nullptr;
  if (Status r = find_stream_locked(s, op_kind_name(op.kind), &st); !r.ok()) return r;
  if (op.kind == OpKind::record_event || op.kind == OpKind::wait_event) {
    EventState* ev = nullptr;
    if (Status r = find_event_locked(Event{op.event}, op_kind_name(op.kind), &ev); !r.ok())
      return r;
    // A wait on an event never recorded waits for nothing (as cudaStreamWaitEvent).
    op.event_generation = op.kind == OpKind::record_event ? ++ev->recorded : ev->recorded;
  }
  // Events are the system's: a stream of one chip may record or wait for an event of another
  // (TensorFlow orders a copy between NPUs with stream dependencies across the two devices).
  if (op.kind == OpKind::record_event || op.kind == OpKind::wait_event) op.chip = st->chip;
  if (op.chip != st->chip)
    return Status(StatusCode::invalid_argument,
                  fmt::format("{}: stream {} belongs to chip {}, not chip {}",
                              op_kind_name(op.kind), s.id, st->chip, op.chip));
  if (op.kind == OpKind::collective) {
    op.group->host_cycle = std::max(op.group->host_cycle, m_host_cycle);
    if (Status r = join_collective_locked(s.id, op); !r.ok()) {
      m_work.notify_one();  // the group failed: its parts already queued can now complete
      return r;
    }
  }
  op.seq = m_next_seq++;
  op.host_cycle = m_host_cycle;
  st->queue.push_back(std::move(op));
  st->submitted++;
  m_work.notify_one();
  return Status();
}

Status Driver::submit_sync(DeviceOp op) {
  if (on_driver_thread()) return not_on_driver_thread(op_kind_name(op.kind));
  auto completion = std::make_shared<OpCompletion>();
  op.completion = completion;
  op.barrier = true;
  std::unique_lock<std::mutex> lock(m_mutex);
  op.seq = m_next_seq++;
  op.host_cycle = m_host_cycle;
  StreamState& internal = m_streams[0];
  internal.queue.push_back(std::move(op));
  internal.submitted++;
  m_work.notify_one();
  m_done.wait(lock, [&] { return completion->done; });
  observe_locked(completion->end_cycle);
  return completion->status;
}

Status Driver::join_collective_locked(uint64_t stream, const DeviceOp& op) {
  CollectiveGroup& g = *op.group;
  const std::string what = fmt::format("{} rank {} on chip {}", collective_name(g.call.kind),
                                       op.rank, op.chip);
  auto fail = [&](const std::string& message) {
    Status st(StatusCode::invalid_argument, what + ": " + message);
    if (g.status.ok()) g.status = st;  // the parts already queued complete with it
    return st;
  };
  if (!g.status.ok()) return Status(g.status.code(), what + ": " + g.status.message());
  if (op.rank < 0 || op.rank >= g.ranks())
    return fail(fmt::format("the communicator has ranks 0 to {}", g.ranks() - 1));
  const size_t r = static_cast<size_t>(op.rank);
  if (g.joined[r]) return fail("this rank was already given");
  for (int q = 0; q < g.ranks(); ++q)
    if (g.joined[static_cast<size_t>(q)] && g.call.chips[static_cast<size_t>(q)] == op.chip)
      return fail(fmt::format("chip {} is already rank {} (one rank per chip)", op.chip, q));
  g.call.chips[r] = op.chip;
  g.call.send[r] = op.src;
  g.call.recv[r] = op.dst;
  g.call.rank_counts[r] = op.count;
  if (!op.send_pieces.empty() || !op.recv_pieces.empty()) {
    g.call.send_pieces.resize(g.call.chips.size());
    g.call.recv_pieces.resize(g.call.chips.size());
    g.call.send_pieces[r] = op.send_pieces;
    g.call.recv_pieces[r] = op.recv_pieces;
  }
  g.streams[r] = stream;
  g.joined[r] = true;
  if (++g.joined_count == g.ranks()) g.call.count = g.call.rank_counts[0];
  return Status();
}

Status Driver::run_task(const std::function<Status()>& fn) {
  if (on_driver_thread()) return guard("driver task", [&] { return fn(); });
  auto completion = std::make_shared<OpCompletion>();
  std::unique_lock<std::mutex> lock(m_mutex);
  m_tasks.push_back(Task{fn, completion});
  m_work.notify_one();
  m_done.wait(lock, [&] { return completion->done; });
  return completion->status;
}

Status Driver::take_error_locked(uint64_t id, StreamState& s) {
  Status err = std::move(s.error);
  s.error = Status();
  if (err.ok() || s.more_errors == 0) return err;
  const uint64_t more = s.more_errors;
  s.more_errors = 0;
  return Status(err.code(), fmt::format("{} (and {} later failure(s) on stream {})", err.message(),
                                        more, id));
}

Status Driver::synchronize_stream(Stream s, bool host_waits) {
  if (on_driver_thread()) return not_on_driver_thread("synchronize_stream");
  std::unique_lock<std::mutex> lock(m_mutex);
  StreamState* st = nullptr;
  if (Status r = find_stream_locked(s, "synchronize_stream", &st); !r.ok()) return r;
  wait_streams_locked(lock, {{s.id, st->submitted}}, host_waits);
  auto it = m_streams.find(s.id);
  if (it == m_streams.end()) return Status();
  return take_error_locked(s.id, it->second);
}

void Driver::wait_streams_locked(std::unique_lock<std::mutex>& lock,
                                 const std::map<uint64_t, uint64_t>& targets, bool host_waits) {
  // Register the ops waited for (stream 0's ops belong to any chip: their callers observe them).
  std::vector<std::pair<uint64_t, uint64_t>> registered;  // (stream id, target)
  for (const auto& [id, target] : targets) {
    auto it = m_streams.find(id);
    if (id == 0 || it == m_streams.end()) continue;
    if (it->second.completed >= target) {  // (== target: targets are counts queued so far)
      observe_locked(host_waits ? it->second.ready_cycle : it->second.read_cycle);
      continue;
    }
    it->second.sync_targets[target].waiters++;
    registered.emplace_back(id, target);
  }
  m_done.wait(lock, [&] {
    for (const auto& [id, target] : targets) {
      auto it = m_streams.find(id);
      if (it != m_streams.end() && it->second.completed < target) return false;
    }
    return true;
  });
  for (const auto& [id, target] : registered) {
    auto it = m_streams.find(id);
    if (it == m_streams.end()) continue;
    auto t = it->second.sync_targets.find(target);
    if (t == it->second.sync_targets.end()) continue;
    observe_locked(host_waits ? t->second.ready : t->second.read);
    if (--t->second.waiters == 0) it->second.sync_targets.erase(t);
  }
}

Status Driver::query_stream(Stream s, bool* idle) {
  std::lock_guard<std::mutex> lock(m_mutex);
  StreamState* st = nullptr;
  if (Status r = find_stream_locked(s, "query_stream", &st); !r.ok()) return r;
  *idle = st->completed == st->submitted;
  if (*idle) observe_locked(st->read_cycle);
  return Status();
}

Status Driver::stream_error(Stream s) {
  std::lock_guard<std::mutex> lock(m_mutex);
  StreamState* st = nullptr;
  if (Status r = find_stream_locked(s, "stream_error", &st); !r.ok()) return r;
  return st->error;
}

Status Driver::synchronize_all(int chip) {
  if (on_driver_thread()) return not_on_driver_thread("synchronize_device");
  std::unique_lock<std::mutex> lock(m_mutex);
  std::map<uint64_t, uint64_t> targets;
  for (const auto& [id, st] : m_streams)
    if (id == 0 || st.chip == chip) targets[id] = st.submitted;
  wait_streams_locked(lock, targets, /*host_waits=*/true);
  Status first;
  std::string all;
  for (auto& [id, st] : m_streams) {
    if (st.error.ok() || (id != 0 && st.chip != chip)) continue;
    Status e = take_error_locked(id, st);
    if (first.ok()) first = e;
    all += (all.empty() ? "" : "; ") + e.message();
  }
  if (first.ok()) return first;
  return Status(first.code(), all);
}

Status Driver::create_event(Event* out) {
  std::lock_guard<std::mutex> lock(m_mutex);
  out->id = m_next_event++;
  m_events[out->id];
  return Status();
}

Status Driver::destroy_event(Event e) {
  std::lock_guard<std::mutex> lock(m_mutex);
  EventState* ev = nullptr;
  if (Status r = find_event_locked(e, "destroy_event", &ev); !r.ok()) return r;
  if (ev->completed >= ev->recorded) m_events.erase(e.id);
  else ev->destroyed = true;  // erased when its last record has run
  return Status();
}

Status Driver::query_event(Event e, bool* complete) {
  std::lock_guard<std::mutex> lock(m_mutex);
  EventState* ev = nullptr;
  if (Status r = find_event_locked(e, "query_event", &ev); !r.ok()) return r;
  *complete = ev->completed >= ev->recorded;
  if (*complete && ev->recorded > 0) observe_locked(ev->read_cycle);
  return Status();
}

Status Driver::synchronize_event(Event e) {
  if (on_driver_thread()) return not_on_driver_thread("synchronize_event");
  std::unique_lock<std::mutex> lock(m_mutex);
  EventState* ev = nullptr;
  if (Status r = find_event_locked(e, "synchronize_event", &ev); !r.ok()) return r;
  const uint64_t target = ev->recorded;
  m_done.wait(lock, [&] {
    auto it = m_events.find(e.id);
    return it == m_events.end() || it->second.completed >= target;
  });
  // The record waited for, if no later one of the event ran meanwhile (its time is then gone).
  if (auto it = m_events.find(e.id); target > 0 && it != m_events.end() &&
                                     it->second.completed == target)
    observe_locked(it->second.cycle);
  return Status();
}

Status Driver::elapsed_us(Event start, Event end, double* us) {
  std::lock_guard<std::mutex> lock(m_mutex);
  EventState *a = nullptr, *b = nullptr;
  if (Status r = find_event_locked(start, "event_elapsed_us", &a); !r.ok()) return r;
  if (Status r = find_event_locked(end, "event_elapsed_us", &b); !r.ok()) return r;
  for (auto [id, ev] : {std::pair{start.id, a}, std::pair{end.id, b}}) {
    if (ev->recorded == 0)
      return Status(StatusCode::failed_precondition,
                    fmt::format("event_elapsed_us: event {} was never recorded", id));
    if (ev->completed < ev->recorded)
      return Status(StatusCode::failed_precondition,
                    fmt::format("event_elapsed_us: event {} has not completed yet", id));
  }
  *us = m_cfg->cycles_to_us(static_cast<double>(b->cycle) - static_cast<double>(a->cycle));
  return Status();
}

namespace {

// The records of one chip (every record, on a single chip).
template <typename Record>
std::vector<Record> records_of_chip(const std::vector<Record>& all, int chips, int chip) {
  if (chips == 1) return all;
  std::vector<Record> out;
  for (const Record& r : all)
    if (r.chip == chip) out.push_back(r);
  return out;
}

}  // namespace

std::vector<LaunchRecord> Driver::launch_records(int chip) const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return records_of_chip(m_records, m_chips, chip);
}

std::vector<CopyRecord> Driver::copy_records(int chip) const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return records_of_chip(m_copy_records, m_chips, chip);
}

std::vector<CollectiveRecord> Driver::collective_records() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_collective_records;
}

std::vector<AiCpuRecord> Driver::ai_cpu_records(int chip) const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return records_of_chip(m_ai_cpu_records, m_chips, chip);
}

void Driver::clear_launch_records() {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_records.clear();
  m_copy_records.clear();
  m_collective_records.clear();
  m_ai_cpu_records.clear();
}

}  // namespace npusim::rt
