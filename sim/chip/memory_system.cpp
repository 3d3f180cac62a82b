#include "sim/chip/memory_system.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"

namespace npusim {

using sc_core::sc_time;
using sc_core::SC_ZERO_TIME;

namespace {
constexpr uint64_t kPsPerCycle = 1000;
}

MemorySystem::MemorySystem(sc_core::sc_module_name name, const ChipConfig& cfg,
                           const CounterGroup& chip_counters)
    : sc_module(name),
      port("port"),
      m_cfg(cfg),
      m_l2(cfg.l2_bytes, cfg.l2_line_bytes, cfg.l2_ways, cfg.l2_write_back, cfg.l2_page_rotation),
      m_placement(m_l2.line_bytes()),
      m_l2_hits(chip_counters.add("l2.hits", "lines", "GM line accesses that hit in L2")),
      m_l2_misses(chip_counters.add("l2.misses", "lines", "GM line accesses that missed L2")),
      m_l2_noalloc_hits(chip_counters.add("l2.noalloc_hits", "lines",
                                          "of l2.hits: accesses with the noalloc policy")),
      m_l2_noalloc_misses(chip_counters.add("l2.noalloc_misses", "lines",
                                            "of l2.misses: accesses with the noalloc policy "
                                            "(the line was not allocated)")),
      m_l2_bypass_lines(chip_counters.add("l2.bypass_lines", "lines",
                                          "GM lines accessed with the bypass policy (no L2 "
                                          "lookup; served by HBM)")),
      m_l2_writeback_bytes(chip_counters.add("l2.writeback_bytes", "bytes",
                                             "dirty L2 lines evicted to HBM (write-back L2; "
                                             "included in hbm.write_bytes)")),
      m_l2_read_bytes(chip_counters.add("l2.read_bytes", "bytes", "GM bytes read from L2 (hits)")),
      m_l2_write_bytes(chip_counters.add(
          "l2.write_bytes", "bytes",
          "GM bytes written into L2 lines (present, or allocated by a write-back L2)")),
      m_l2_busy(chip_counters.add("l2.busy_cycles", "cycles",
                                  "cycles with at least one transfer moving data over L2",
                                  kPsPerCycle)),
      m_hbm_read_bytes(chip_counters.add("hbm.read_bytes", "bytes",
                                         "GM bytes read from HBM (L2 misses)")),
      m_hbm_write_bytes(chip_counters.add("hbm.write_bytes", "bytes",
                                          "GM bytes written to HBM (lines missing in L2)")),
      m_hbm_busy(chip_counters.add("hbm.busy_cycles", "cycles",
                                   "cycles with at least one transfer moving data over HBM",
                                   kPsPerCycle)),
      m_transfers(chip_counters.add("gm.transfers", "transfers",
                                    "GM instructions timed by the memory system")) {
  if (!(cfg.hbm_gbps > 0) || !(cfg.clock_mhz > 0))
    throw ConfigError(fmt::format("{}: memory.hbm.gbps ({}) and clock_mhz ({}) must be positive",
                                  cfg.source_file, cfg.hbm_gbps, cfg.clock_mhz));
  if (cfg.l2_bytes > 0 && !(cfg.l2_gbps > 0))
    throw ConfigError(fmt::format("{}: memory.l2.gbps ({}) must be positive when the chip has "
                                  "an L2", cfg.source_file, cfg.l2_gbps));
  m_bandwidth[kHbm] = cfg.hbm_sustained_bytes_per_cycle();  // peak x memory.hbm.efficiency
  m_bandwidth[kL2] = cfg.l2_bytes > 0 ? cfg.l2_bytes_per_cycle() : m_bandwidth[kHbm];
  port.register_b_transport(this, &MemorySystem::b_transport);
  SC_METHOD(on_rate_change);
  sensitive << m_rate_change;
  dont_initialize();
}

void MemorySystem::end_views() {
  m_view_of_port.clear();
  m_l2.stamp_fills(0);
  m_l2.set_view(0);
}

GmBlockLookup MemorySystem::select_l2(uint64_t run, GmBlockLookup blocks,
                                     const PlannedBlocks& planned) {
  end_views();  // a replayed launch's lookups see every line, as a simulated lone launch's
  if (m_cfg.l2_keep_across_launches) {
    m_placement.begin_launch({});
    m_l2_carried = true;
    return {};
  }
  if (!m_cfg.l2_keep_within_graph_run) run = 0;
  if (run != 0 && run == m_l2_run) {  // the run's next launch
    m_placement.continue_launch(blocks);
    m_l2_carried = true;
    return blocks;
  }
  if (m_l2_run != 0) {  // set the run under way aside, in a free slot or the oldest one's
    RunL2* slot = nullptr;
    for (const auto& r : m_runs_aside)
      if (r->run == 0 && !slot) slot = r.get();
    if (!slot && m_runs_aside.size() < kRunsAside) {
      m_runs_aside.push_back(std::make_unique<RunL2>(
          RunL2{0, 0, L2Tags(m_cfg.l2_bytes, m_cfg.l2_line_bytes, m_cfg.l2_ways,
                             m_cfg.l2_write_back, m_cfg.l2_page_rotation),
                L2Placement(m_l2.line_bytes())}));
      slot = m_runs_aside.back().get();
    }
    if (!slot)
      for (const auto& r : m_runs_aside)
        if (!slot || r->aside_since < slot->aside_since) slot = r.get();
    slot->run = m_l2_run;
    slot->aside_since = ++m_asides;
    std::swap(slot->tags, m_l2);
    std::swap(slot->placement, m_placement);
    m_l2_run = 0;
  }
  m_l2_carried = run != 0;
  m_l2_run = run;
  for (const auto& r : m_runs_aside)
    if (run != 0 && r->run == run) {  // the run's state comes back as it was set aside
      std::swap(r->tags, m_l2);
      std::swap(r->placement, m_placement);
      r->run = 0;
      m_placement.continue_launch(blocks);
      return blocks;
    }
  m_l2.invalidate_all();
  // A cold L2 (no run): the launch's planned buffers are filed apart.
  if (run == 0) blocks = planned_block_lookup(planned, m_l2.line_bytes(), std::move(blocks));
  m_placement.begin_launch(blocks);
  return blocks;
}

void MemorySystem::drop_host_write(uint64_t addr, uint64_t bytes) {
  const auto drop = [&](L2Tags& tags, const L2Placement& placement) {
    tags.invalidate_range(addr, bytes);  // lines filed at their device addresses
    placement.for_each_placed(addr, bytes, [&](uint64_t l2_addr, uint64_t n, uint64_t origin) {
      tags.invalidate_range(l2_addr, n, origin);
    });
  };
  if (m_cfg.l2_keep_across_launches || m_l2_run != 0) drop(m_l2, m_placement);
  for (const auto& r : m_runs_aside)
    if (r->run != 0) drop(r->tags, r->placement);
}

void MemorySystem::begin_launch(bool record, uint64_t trace_max) {
  m_recording = record;
  m_tracing = trace_max > 0;
  m_trace_max = trace_max;
  m_writebacks_end = m_launch_begin = sc_core::sc_time_stamp();
  end_views();  // views off until a group's launch begins (begin_launch_view)
  m_writebacks_end_of.clear();
  m_transfer_order.clear();
  m_l2_trace.clear();
  m_l2_fingerprint = kL2FingerprintSeed;
  m_watch_writebacks = false;
}

uint64_t MemorySystem::begin_launch_view(const std::vector<bool>& ports) {
  if (m_l2_carried) return 0;
  m_l2.stamp_fills(++m_view_stamp);
  join_launch_view(ports, m_view_stamp);
  return m_view_stamp;
}

void MemorySystem::join_launch_view(const std::vector<bool>& ports, uint64_t stamp) {
  if (m_l2_carried || stamp == 0) return;
  if (m_view_of_port.size() < ports.size()) m_view_of_port.resize(ports.size(), 0);
  for (size_t p = 0; p < ports.size(); ++p)
    if (ports[p]) m_view_of_port[p] = stamp;
}

void MemorySystem::abort_transfers() {
  m_active.clear();
  m_idle_writeback_flows.clear();
  for (const auto& f : m_writeback_flows) m_idle_writeback_flows.push_back(f.get());
  m_users[kHbm] = m_users[kL2] = 0;
  m_line_readers.clear();
  m_shared_changed_lo = UINT64_MAX;
  m_shared_changed_hi = 0;
  m_rate_change.cancel();
}

void MemorySystem::abort_transfers_of(const std::vector<bool>& ports) {
  const auto of = [&](const GmTransfer* t) {
    return t->origin >= 0 && static_cast<size_t>(t->origin) < ports.size() &&
           ports[static_cast<size_t>(t->origin)];
  };
  advance();  // the other transfers' bytes moved so far, at the rates they had
  for (size_t i = 0; i < m_active.size();) {
    GmTransfer* t = m_active[i];
    if (t->writeback_flow) {
      // The evicted lines still go to HBM; no aborted transfer waits for them.
      if (t->evictor && of(t->evictor)) t->evictor = nullptr;
      ++i;
    } else if (of(t)) {
      if (t->lines_registered) count_line_reads(t, false);
      m_active.erase(m_active.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  settle();  // the others' rates without them
}

bool MemorySystem::writebacks_in_flight_of(const std::vector<bool>& ports) const {
  return std::any_of(m_active.begin(), m_active.end(), [&](const GmTransfer* t) {
    return t->writeback_flow && t->origin >= 0 && static_cast<size_t>(t->origin) < ports.size() &&
           ports[static_cast<size_t>(t->origin)];
  });
}

sc_core::sc_time MemorySystem::writebacks_end_of(const std::vector<bool>& ports) const {
  sc_core::sc_time end = m_launch_begin;
  for (size_t i = 0; i < m_writebacks_end_of.size() && i < ports.size(); ++i)
    if (ports[i]) end = std::max(end, m_writebacks_end_of[i]);
  return end;
}

void MemorySystem::b_transport(int id, tlm::tlm_generic_payload& p, sc_time& delay) {
  GmTransfer* t = p.get_extension<GmTransfer>();
  if (!t || !t->ranges) {
    p.set_response_status(tlm::TLM_GENERIC_ERROR_RESPONSE);
    return;
  }
  if (!t->abort_signal) {  // every initiator (a core's pipe) names the signal that unwinds it
    p.set_response_status(tlm::TLM_GENERIC_ERROR_RESPONSE);
    return;
  }
  AbortSignal& abort = *t->abort_signal;
  t->origin = id;
  const bool write = p.get_command() == tlm::TLM_WRITE_COMMAND;
  // 1. L2 lookup, line by line. own_miss: the instruction's own bytes that go to HBM; the rest
  // of `miss` is the fill of the lines its reads allocate beyond the bytes asked for (HBM -> L2
  // only). `writeback`: dirty lines its allocations evict (HBM writes of a flow of their own).
  uint64_t hit = 0, miss = 0, own_miss = 0, writeback = 0;
  // The view of the port's launch (begin_launch_view); 0: every line.
  if (!m_view_of_port.empty())
    m_l2.set_view(static_cast<size_t>(id) < m_view_of_port.size()
                      ? m_view_of_port[static_cast<size_t>(id)]
                      : 0);
  for (const GmAccess& r : *t->ranges) {
    const L2Outcome o = access_placed(m_l2, m_placement, r);
    hit += o.hit_bytes + o.absorbed_bytes;
    miss += o.miss_bytes + o.fill_bytes;
    own_miss += o.miss_bytes;
    writeback += o.writeback_bytes;
    m_l2_hits.add(o.hit_lines);
    m_l2_misses.add(o.miss_lines);
    if (r.l2 == isa::L2Hint::NOALLOC) {
      m_l2_noalloc_hits.add(o.hit_lines);
      m_l2_noalloc_misses.add(o.miss_lines);
    }
    m_l2_bypass_lines.add(o.bypass_lines);
    (r.write ? m_l2_write_bytes : m_l2_read_bytes).add(o.hit_bytes + o.absorbed_bytes);
    (r.write ? m_hbm_write_bytes : m_hbm_read_bytes).add(o.miss_bytes);
    m_hbm_read_bytes.add(o.fill_bytes);
    m_hbm_write_bytes.add(o.writeback_bytes);
    m_l2_writeback_bytes.add(o.writeback_bytes);
    if (m_recording || m_tracing) m_l2_fingerprint = npusim::l2_fingerprint(m_l2_fingerprint, o);
    if (m_tracing && m_l2_trace.size() < m_trace_max) {
      m_l2_trace.push_back(r);
    } else if (m_tracing) {  // too long a launch to keep its lookups: drop them
      m_tracing = false;
      std::vector<GmAccess>().swap(m_l2_trace);
    }
  }
  if (m_recording) m_transfer_order.push_back(static_cast<uint16_t>(id));
  m_transfers.inc();
  t->hit_bytes = hit;
  t->miss_bytes = miss;
  // 2. Annotated delay plus the access latency.
  const int latency = hit + miss == 0 ? 0 : miss > 0 ? m_cfg.hbm_latency_cycles
                                                     : m_cfg.l2_latency_cycles;
  // The fixed latencies (the instruction's own, in `delay`, plus the memory access) are returned
  // to the initiator in `delay`: the initiator's pipe is occupied only by the bandwidth phase and
  // the data lands `delay` after it (requests stay in flight while the pipe moves on).
  delay += cycles_to_time(latency);
  abort.check();
  // 3. The bandwidth-shared flow. Misses move at up to the core's GM path rate; hits at up to
  // the core's L2 port rate for the direction (the path rate if the chip gives none). A read's
  // line fill beyond the bytes asked for goes from HBM into the L2 only, not through the core:
  // it shares the HBM phase but not the port, whose limit is scaled so that the core's own
  // bytes move at the path rate (no limit when the phase has none of the core's own bytes).
  // Evicted dirty lines go from the L2 to HBM in a flow of their own, started with this one.
  // The instruction's request issue (GmTransfer::request_rate) caps the core's own bytes in
  // both phases, as the port does.
  const double l2_port = write ? m_cfg.l2_write_bytes_per_cycle : m_cfg.l2_read_bytes_per_cycle;
  const auto capped = [&](double port_rate) {  // 0 = unlimited, on either side
    if (t->request_rate <= 0) return port_rate;
    return port_rate > 0 ? std::min(port_rate, t->request_rate) : t->request_rate;
  };
  const double hbm_port = capped(t->port_rate);
  t->port[kHbm] = own_miss == 0 || hbm_port <= 0
                      ? 0
                      : hbm_port * static_cast<double>(miss) / static_cast<double>(own_miss);
  t->hbm_write_share = miss == 0 || !write ? 0 : static_cast<double>(own_miss) /
                                                     static_cast<double>(miss);
  t->port[kL2] =
      capped(t->l2_port_rate > 0 ? t->l2_port_rate : l2_port > 0 ? l2_port : t->port_rate);
  // Same-line serialisation: the lines a read's L2 phase reads, each once with the bytes of it
  // read (ranges looked up in the L2; a bypassing range is HBM's alone).
  const double line_rate = m_cfg.l2_line_read_bytes_per_cycle;
  t->read_lines.clear();
  t->lines_registered = false;
  t->line_readers = 1;
  if (line_rate > 0 && !write && hit > 0) {
    const uint64_t line = m_cfg.l2_line_bytes;
    for (const GmAccess& r : *t->ranges) {
      if (r.write || r.bytes == 0 || r.l2 == isa::L2Hint::BYPASS) continue;
      const uint64_t end = r.addr + r.bytes;
      for (uint64_t l = r.addr / line; l <= (end - 1) / line; ++l)
        t->read_lines.emplace_back(l, std::min(end, (l + 1) * line) - std::max(r.addr, l * line));
    }
    std::sort(t->read_lines.begin(), t->read_lines.end());
    size_t n = 0;  // merge a line read by several of the ranges
    for (const auto& lb : t->read_lines) {
      if (n > 0 && t->read_lines[n - 1].first == lb.first) t->read_lines[n - 1].second += lb.second;
      else t->read_lines[n++] = lb;
    }
    t->read_lines.resize(n);
  }
  // Read granules: the L2 serves a read range in whole aligned granules of G bytes, so its L2
  // phase takes (the granules its ranges touch x G) / (their bytes) of the L2's bandwidth per
  // byte moved; the port moves the bytes asked for.
  t->l2_granule_factor = 1;
  if (m_cfg.l2_read_granule_bytes > 0 && !write && hit > 0) {
    const uint64_t g = m_cfg.l2_read_granule_bytes;
    uint64_t bytes = 0, granule_bytes = 0;
    for (const GmAccess& r : *t->ranges) {
      if (r.write || r.bytes == 0 || r.l2 == isa::L2Hint::BYPASS) continue;
      bytes += r.bytes;
      granule_bytes += ((r.addr + r.bytes + g - 1) / g - r.addr / g) * g;
    }
    if (bytes > 0)
      t->l2_granule_factor = static_cast<double>(granule_bytes) / static_cast<double>(bytes);
  }
  t->alone_cycles = 0;
  for (int r : {kHbm, kL2}) {
    const double bytes = static_cast<double>(r == kHbm ? miss : hit);
    const double bandwidth = r == kHbm ? m_cfg.hbm_mixed_bytes_per_cycle(t->hbm_write_share)
                                       : m_bandwidth[r] / t->l2_granule_factor;
    double alone_rate = t->port[r] > 0 ? std::min(t->port[r], bandwidth) : bandwidth;
    if (r == kL2 && !t->read_lines.empty()) alone_rate = std::min(alone_rate, line_rate);
    t->alone_cycles += bytes / alone_rate;
  }
  const sc_time start = sc_core::sc_time_stamp();
  t->writeback_pending = false;
  if (hit + miss + writeback > 0) {
    advance();
    if (writeback > 0) {
      t->writeback_pending = m_cfg.l2_write_back_waits;
      start_writeback(writeback, t->writeback_pending ? t : nullptr, id);
    }
    t->remaining[kHbm] = static_cast<double>(miss);
    t->remaining[kL2] = static_cast<double>(hit);
    t->phase = hit + miss == 0 ? 2 : miss > 0 ? kHbm : kL2;
    t->rate = 0;
    if (t->phase < 2) m_active.push_back(t);
    settle();
    if (t->done_or_abort.size() == 0) {  // the transfer's first use: wake it on an abort
      abort.wake_on_raise(t->abort);
      t->done_or_abort |= t->done;
      t->done_or_abort |= t->abort;
    }
    while (t->phase < 2 || t->writeback_pending) {
      wait(t->done_or_abort);
      abort.check();
    }
  }
  t->transfer_time = sc_core::sc_time_stamp() - start;
  p.set_response_status(tlm::TLM_OK_RESPONSE);
}

void MemorySystem::start_writeback(uint64_t bytes, GmTransfer* evictor, int origin) {
  if (m_idle_writeback_flows.empty()) {
    m_writeback_flows.push_back(std::make_unique<GmTransfer>());
    m_writeback_flows.back()->writeback_flow = true;
    m_idle_writeback_flows.push_back(m_writeback_flows.back().get());
  }
  GmTransfer* f = m_idle_writeback_flows.back();
  m_idle_writeback_flows.pop_back();
  f->remaining[kHbm] = static_cast<double>(bytes);
  f->remaining[kL2] = 0;
  f->phase = kHbm;
  f->port[kHbm] = f->port[kL2] = 0;  // from the L2 to HBM: no core's port
  f->hbm_write_share = 1;
  f->rate = 0;
  f->evictor = evictor;
  f->origin = origin;
  m_active.push_back(f);
}

// A line's count changing moves the byte-weighted mean of every other transfer reading it, so
// when some other transfer reads one of t's lines (shared), the span of t's lines is marked for
// settle to recompute the means of the transfers reading in it. Otherwise no other transfer's
// mean moves, and t, registered, reads each of its lines alone: its mean is exactly 1 (the
// recomputed sum over its lines of bytes x 1 over their bytes).
void MemorySystem::count_line_reads(GmTransfer* t, bool add) {
  bool shared = false;
  for (const auto& lb : t->read_lines) {
    if (add)
      shared |= m_line_readers.increment(lb.first) > 0;
    else
      shared |= m_line_readers.decrement(lb.first) > 0;
  }
  t->lines_registered = add;
  if (add) t->line_readers = 1;
  if (shared) {  // read_lines is ascending and not empty (registered only then)
    m_shared_changed_lo = std::min(m_shared_changed_lo, t->read_lines.front().first);
    m_shared_changed_hi = std::max(m_shared_changed_hi, t->read_lines.back().first);
  }
}

void MemorySystem::on_rate_change() {
  advance();
  settle();
}

void MemorySystem::advance() {
  const uint64_t now = now_ps();
  if (now == m_last_ps) return;
  const uint64_t dt_ps = now - m_last_ps;
  const double dt = static_cast<double>(dt_ps) / kPsPerCycle;
  for (GmTransfer* t : m_active) t->remaining[t->phase] -= t->rate * dt;
  if (m_users[kHbm] > 0) m_hbm_busy.add(dt_ps);
  if (m_users[kL2] > 0) m_l2_busy.add(dt_ps);
  m_last_ps = now;
}

void MemorySystem::settle() {
  // Complete the phases that have (to within a picosecond of their rate) no bytes left.
  for (size_t i = 0; i < m_active.size();) {
    GmTransfer* t = m_active[i];
    const double eps = std::max(t->rate / kPsPerCycle, 1e-9);
    while (t->phase < 2 && t->remaining[t->phase] <= eps) {
      ++t->phase;
      t->rate = 0;
    }
    // A read counts among its lines' readers while its L2 phase runs.
    if (t->lines_registered != (t->phase == kL2 && !t->read_lines.empty()))
      count_line_reads(t, !t->lines_registered);
    if (t->phase == 2) {
      if (t->writeback_flow) {
        m_idle_writeback_flows.push_back(t);
        m_writebacks_end = sc_core::sc_time_stamp();
        if (t->origin >= 0) {
          const size_t o = static_cast<size_t>(t->origin);
          if (m_writebacks_end_of.size() <= o) m_writebacks_end_of.resize(o + 1, m_launch_begin);
          m_writebacks_end_of[o] = m_writebacks_end;
        }
        if (m_watch_writebacks) m_writeback_finished.notify(SC_ZERO_TIME);
        if (t->evictor) {
          t->evictor->writeback_pending = false;
          t->evictor->done.notify(SC_ZERO_TIME);
        }
      } else {
        t->done.notify(SC_ZERO_TIME);
      }
      m_active.erase(m_active.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  // Rates: each transfer gets min(its port rate, resource bandwidth / users of the resource).
  // HBM's bandwidth is that of the read/write mix of its users, each weighing as the share it
  // would get at the sustained rate (memory.hbm.turnaround_loss; none unless the chip sets it).
  m_users[kHbm] = m_users[kL2] = 0;
  for (const GmTransfer* t : m_active) ++m_users[t->phase];
  double bandwidth[2] = {m_bandwidth[kHbm], m_bandwidth[kL2]};
  if (m_users[kHbm] > 0 && m_cfg.hbm_turnaround_loss > 0) {
    const double share = m_bandwidth[kHbm] / m_users[kHbm];
    double bytes = 0, written = 0;
    for (const GmTransfer* t : m_active) {
      if (t->phase != kHbm) continue;
      const double rate = t->port[kHbm] > 0 ? std::min(t->port[kHbm], share) : share;
      bytes += rate;
      written += rate * t->hbm_write_share;
    }
    bandwidth[kHbm] = m_cfg.hbm_mixed_bytes_per_cycle(written / bytes);
  }
  // Same-line serialisation: a read in its L2 phase reads its lines one after another, each
  // shared with the other transfers reading it (k of them in all: R / k of the line's R bytes
  // per cycle), so it moves at R over the byte-weighted mean k of its lines.
  if (m_shared_changed_lo <= m_shared_changed_hi) {
    for (GmTransfer* t : m_active) {
      if (!t->lines_registered || t->read_lines.back().first < m_shared_changed_lo ||
          t->read_lines.front().first > m_shared_changed_hi)
        continue;
      double bytes = 0, weighted = 0;
      for (const auto& lb : t->read_lines) {
        bytes += static_cast<double>(lb.second);
        weighted += static_cast<double>(lb.second) * m_line_readers.at(lb.first);
      }
      t->line_readers = weighted / bytes;
    }
    m_shared_changed_lo = UINT64_MAX;
    m_shared_changed_hi = 0;
  }
  double next = std::numeric_limits<double>::infinity();
  for (GmTransfer* t : m_active) {
    // A read's L2 phase takes its share of the L2 in whole granules (memory.l2.read_granule_
    // bytes): the bytes it moves are that share over its granule factor.
    const double share = t->phase == kL2 && t->l2_granule_factor != 1
                             ? bandwidth[kL2] / m_users[kL2] / t->l2_granule_factor
                             : bandwidth[t->phase] / m_users[t->phase];
    const double port = t->port[t->phase];
    t->rate = port > 0 ? std::min(port, share) : share;
    if (t->lines_registered)
      t->rate = std::min(t->rate, m_cfg.l2_line_read_bytes_per_cycle / t->line_readers);
    next = std::min(next, t->remaining[t->phase] / t->rate);
  }
  m_rate_change.cancel();
  if (!m_active.empty()) {
    sc_time dt = cycles_to_time(next);
    if (dt == SC_ZERO_TIME) dt = sc_time::from_value(1);
    m_rate_change.notify(dt);
  }
}

}  // namespace npusim
