// The chip's shared memory system behind every core's GM port: L2 (tags only, set-associative
// LRU) in front of HBM, each a bandwidth resource shared among the transfers using it.
//
// Timing of one GM instruction (a TLM blocking transport, annotated delay = the instruction's
// own cycles):
//   1. classify its bytes line by line: hit bytes H (served by L2), miss bytes M (served by HBM,
//      filling L2);
//   2. the fixed latency — the annotated delay (the instruction's own start latency) plus one
//      memory latency (hbm_latency_cycles if M > 0, else l2_latency_cycles) — is NOT waited
//      here: it is returned in the annotated delay, and the initiating pipe counts the data as
//      landed that long after the bandwidth phase. The pipe itself moves on to its next
//      instruction at once (a DMA engine keeps requests in flight), so back-to-back transfers
//      of one pipe overlap their latencies; set_flag/cc_set from that pipe and draining it wait
//      for the landing;
//   3. move M bytes over HBM, then H bytes over L2, as a fluid flow: while n transfers are
//      active on a resource of bandwidth B bytes/cycle, each moves at
//      rate = min(port, B / n), recomputed whenever a transfer starts or ends (one simulation
//      event per change, never per byte or burst). port is the core's GM path rate
//      (ExecCost::gm_core_rate) for the HBM phase and, for the L2 phase, the path's L2 rate
//      (GmTransfer::l2_port_rate: a UB -> GM write's l2_ub_write_bytes_per_cycle) or else the
//      core's L2 port rate for the direction (l2_read/write_bytes_per_cycle; the path rate if 0),
//      each capped by the instruction's request issue rate (GmTransfer::request_rate: an
//      nd2nz: its row bytes per mte.nd2nz_row_cycles) where it has one, and, for a read's L2
//      phase under memory.l2.line_read_bytes_per_cycle (R), by R / k: a line serves the reads
//      of it one after another at R bytes per cycle, k the byte-weighted mean number of
//      transfers in their L2 phase reading the transfer's lines (same-line serialisation).
//      Under memory.l2.read_granule_bytes (G) a read's L2 phase takes its share B / n of the
//      L2 in whole aligned granules of G bytes: it moves (B / n) / f bytes per cycle, f its
//      ranges' granule bytes over their bytes (GmTransfer::l2_granule_factor).
// Writes are timed like reads (lines present in L2 absorb them at L2 bandwidth; missing lines
// are written to HBM and allocated), unless the L2 is write-back (memory.l2.write_back): then
// an allocating write miss is absorbed at L2 bandwidth too, and the dirty lines a transfer's
// allocations evict go from the L2 to HBM as a write-back flow of their own: one more user of
// HBM's bandwidth, with no port limit, which the evicting transfer does not wait for (unless
// memory.l2.write_back_waits: then it completes only when its write-back flow has too). A
// launch ends when its blocks are done and its write-back flows have drained (writebacks_end).
// HBM's
// bandwidth B is the sustained rate less memory.hbm.turnaround_loss x 2 min(f, 1 - f) of it,
// f the write share of the bytes the HBM phases in flight move. Each range carries its
// instruction's L2 policy (isa.h L2Hint): noalloc leaves missing lines unallocated, bypass
// skips the L2 (all bytes over HBM). The full derivation is in docs/chip_model.md.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include <systemc>
#include <tlm>
#include <tlm_utils/multi_passthrough_target_socket.h>

#include "sim/chip/gm_transfer.h"
#include "sim/chip/l2_placement.h"
#include "sim/chip/l2_tags.h"
#include "sim/chip/line_counts.h"
#include "sim/config/chip_config.h"
#include "sim/core/core_env.h"
#include "sim/replay/fingerprint.h"
#include "sim/counters/counters.h"

namespace npusim {

class MemorySystem : public sc_core::sc_module {
 public:
  SC_HAS_PROCESS(MemorySystem);
  MemorySystem(sc_core::sc_module_name name, const ChipConfig& cfg,
               const CounterGroup& chip_counters);

  // Target of every core's GM port.
  tlm_utils::multi_passthrough_target_socket<MemorySystem> port;

  // The L2 state the next launch starts with; called before every launch, replayed or simulated
  // (ChipLauncher::begin). The L2 starts cold, so a launch's timing does not depend on earlier
  // ones, with its lines filed by `planned` (KernelLaunch::planned_blocks) and then `blocks`
  // (the device's allocations, l2_placement.h; empty: at their device addresses), unless the
  // chip keeps it:
  // - memory.l2.keep_across_launches: the tags as the last launch left them, lines filed at
  //   their device addresses (`blocks` and `planned` ignored);
  // - memory.l2.keep_within_graph_run and `run` nonzero (KernelLaunch::l2_run): the run's own
  //   L2, lines filed by `blocks` (`planned` ignored: a block keeps one L2 range through the
  //   run, so an address the plan reuses is one line). Its first launch starts cold with a
  //   fresh placement; each later one starts with the tags and the block placement the run's
  //   previous launch left (L2Placement::continue_launch). A launch in no run (or of another
  //   run) gets its own L2 and the run's is set aside, untouched, for the run's next launch:
  //   the states of up to kRunsAside runs under way at once are kept (a run whose state was
  //   dropped for a newer one continues cold).
  // Returns the lookup the launch's lines are filed by (empty: at their device addresses),
  // which the launch replay keys and checks recordings with.
  GmBlockLookup select_l2(uint64_t run, GmBlockLookup blocks, const PlannedBlocks& planned);
  // Whether the L2 select_l2 chose carries over to later launches (kept across launches, or a
  // graph run's): a replay must then leave tags and placement as simulating would have.
  bool l2_carried() const { return m_l2_carried; }
  // Whether that L2 is a graph run's (memory.l2.keep_within_graph_run): carried over from the
  // run's previous launch, lines filed by block, to be dropped when the run ends. Implies
  // l2_carried(); false under memory.l2.keep_across_launches.
  bool l2_in_graph_run() const { return m_l2_carried && m_l2_run != 0; }
  // Start of a launch on the L2 select_l2 chose. record: keep the launch's transfer order and
  // L2 fingerprint (for the launch replay). trace_max > 0: keep every GM range looked up in
  // the L2, in lookup order (l2_trace), up to trace_max ranges, and the L2 fingerprint: a graph
  // run's launch recorded for a replay by translation, which repeats those lookups on the
  // run's L2 (launch_replay.h).
  void begin_launch(bool record = false, uint64_t trace_max = 0);
  // A launch of a concurrent group begins on the cores `ports` (by core chip index; Chip's
  // start_slot, after begin_launch). Where select_l2 chose an L2 that is not carried over
  // (l2_carried() false: the chip starts every launch cold, as memory.l2.keep_across_launches
  // and keep_within_graph_run false do), the launch sees the L2 as a lone launch does: empty
  // at its start. The lines already there (its predecessors', those of launches beside it)
  // are absent for its lookups from now on, while the launches beside it keep theirs
  // (L2Tags::stamp_fills and set_view: a stamp per launch start; the lines filled since are
  // seen by every launch then running, so launches that overlap share their lines as the
  // chip's one L2 does). With a carried L2 (kept across launches, a graph run's) it does
  // nothing: the group's launches share the L2 as the run's launches in order do.
  // docs/chip_model.md "Concurrent launches".
  // Returns the view's stamp (0 with a carried L2), for cores that join the launch later.
  uint64_t begin_launch_view(const std::vector<bool>& ports);
  // Cores `ports` join a launch begun with begin_launch_view (a launch that takes cores as they
  // free: Chip::begin_concurrent): their lookups take its view, `stamp`, from now on (they see
  // what it sees: the lines filled since its start). Nothing with a carried L2 (stamp 0).
  void join_launch_view(const std::vector<bool>& ports, uint64_t stamp);
  // The L2's tags between launches: the launch replay checks a recording against a copy of
  // them and installs the copy's end state when it replays (sim/simulator.cpp).
  const L2Tags& l2() const { return m_l2; }
  L2Tags& l2() { return m_l2; }
  // Where the launch now running files its blocks in the L2 (l2_placement.h); the replay
  // checks a graph run's launch with a copy of it and installs the copy's end state.
  const L2Placement& placement() const { return m_placement; }
  L2Placement& placement() { return m_placement; }
  // A host-to-device copy wrote device range [addr, addr + bytes): the data arrived in HBM, so
  // a kept L2 (across launches, or any graph run's, wherever the run filed the range) drops the
  // lines it held there. A cold L2 holds nothing between launches.
  void drop_host_write(uint64_t addr, uint64_t bytes);
  static constexpr size_t kRunsAside = 4;  // # estimate: graph runs interleaved at once
  // Of the launch being recorded: the port (= core chip index) of every transfer in the order
  // the memory system timed them, and a hash of every range's L2 outcome in that order
  // (l2_fingerprint).
  const std::vector<uint16_t>& transfer_order() const { return m_transfer_order; }
  uint64_t l2_fingerprint() const { return m_l2_fingerprint; }
  // Of the launch being traced (begin_launch's trace_l2): every GM range the L2 looked up (at
  // its device address, with its policy and direction), in lookup order.
  const std::vector<GmAccess>& l2_trace() const { return m_l2_trace; }
  // Whether l2_trace() holds every range of the launch (tracing was asked for and the launch
  // looked up no more than trace_max ranges).
  bool l2_traced() const { return m_tracing; }
  // Stops recording the launch in progress and frees its record (Chip::recorded).
  void drop_recording() {
    m_recording = m_tracing = false;
    std::vector<uint16_t>().swap(m_transfer_order);
    std::vector<GmAccess>().swap(m_l2_trace);
  }
  // When the last write-back flow that finished since begin_launch finished (the launch's start
  // if none did); with none in flight, the launch's write-backs are all in HBM by then. The
  // launch is not over before (Chip::end_time): a write that evicts returns at L2 speed, so
  // without this a launch writing more than the L2 holds could end before HBM moved its lines.
  sc_core::sc_time writebacks_end() const { return m_writebacks_end; }
  // The same for the write-back flows of the transfers from `ports` (by core chip index: a
  // launch's cores among concurrent ones); the launch's start if none finished.
  sc_core::sc_time writebacks_end_of(const std::vector<bool>& ports) const;
  // Whether a write-back flow of a transfer from `ports` is still moving lines to HBM.
  bool writebacks_in_flight_of(const std::vector<bool>& ports) const;
  // Notified (in the next delta cycle) whenever a write-back flow has finished, while watched:
  // a launch that others wait for (Chip, ordered concurrent launches) may have ended then.
  // begin_launch stops the watch, so a launch nobody waits for pays no notification.
  const sc_core::sc_event& writeback_finished() const { return m_writeback_finished; }
  void watch_writebacks() { m_watch_writebacks = true; }
  // Abort: drops the transfers in flight (their initiators unwind on their abort signals,
  // GmTransfer::abort_signal) and the pending rate-change event, so simulated time stops at the
  // fault.
  void abort_transfers();
  // Abort of one launch among concurrent ones (Chip::begin_concurrent): drops the transfers
  // from `ports` (by core chip index) only; the others go on, sharing the bandwidth without
  // them from now. Write-back flows those transfers started go on (the lines still reach HBM).
  // Zero time.
  void abort_transfers_of(const std::vector<bool>& ports);

 private:
  enum Resource { kHbm = 0, kL2 = 1 };
  void b_transport(int id, tlm::tlm_generic_payload& p, sc_core::sc_time& delay);
  void on_rate_change();  // method: a transfer's current phase may have completed
  void advance();         // bring every active transfer's remaining bytes to now
  void settle();          // complete finished phases, recompute rates, schedule next change
  // Adds a write-back flow of `bytes` (dirty lines evicted to HBM) to the active flows; call
  // between advance() and settle(). evictor (may be null): the transfer that waits for it.
  // origin: the port of the transfer that evicted the lines (GmTransfer::origin).
  void start_writeback(uint64_t bytes, GmTransfer* evictor, int origin);
  // Same-line serialisation (memory.l2.line_read_bytes_per_cycle): t's read lines start or stop
  // counting among the lines' readers (its L2 phase starts or ends).
  void count_line_reads(GmTransfer* t, bool add);

  const ChipConfig& m_cfg;
  L2Tags m_l2;
  L2Placement m_placement;
  bool m_l2_carried = false;  // select_l2's choice carries over (l2_carried())
  uint64_t m_l2_run = 0;      // the graph run whose state m_l2 and m_placement are (0: none)
  // begin_launch_view: the stamp of the latest launch start (never reset, so a stamp always
  // follows every earlier one), and by port (core chip index) the view its lookups take (the
  // stamp of its launch's start; empty: views off, every lookup sees every line).
  uint64_t m_view_stamp = 0;
  void end_views();  // every lookup sees every line again; no stamps kept
  std::vector<uint64_t> m_view_of_port;
  // The L2 state of a graph run set aside while other launches run (run 0: a free slot).
  struct RunL2 {
    uint64_t run = 0;
    uint64_t aside_since = 0;  // m_asides when it was set aside (the oldest is dropped first)
    L2Tags tags;
    L2Placement placement;
  };
  std::vector<std::unique_ptr<RunL2>> m_runs_aside;
  uint64_t m_asides = 0;
  bool m_recording = false;
  bool m_tracing = false;   // tracing, and every range so far is in m_l2_trace
  uint64_t m_trace_max = 0;  // begin_launch's trace_max
  std::vector<uint16_t> m_transfer_order;
  std::vector<GmAccess> m_l2_trace;
  uint64_t m_l2_fingerprint = kL2FingerprintSeed;
  double m_bandwidth[2];  // bytes per cycle of HBM and L2
  std::vector<GmTransfer*> m_active;
  // Write-back flows: all ever made (reused), and those not in m_active.
  std::vector<std::unique_ptr<GmTransfer>> m_writeback_flows;
  std::vector<GmTransfer*> m_idle_writeback_flows;
  sc_core::sc_time m_writebacks_end;
  sc_core::sc_time m_launch_begin;  // begin_launch's time
  std::vector<sc_core::sc_time> m_writebacks_end_of;  // by origin port (writebacks_end_of)
  int m_users[2] = {0, 0};  // active transfers per resource (as of the last settle)
  // Same-line serialisation: transfers in their L2 phase reading each GM line (address /
  // l2_line_bytes), and the lines [lo, hi] spanning every line whose count changed while
  // another transfer also read it, since the readers' means were last computed (lo > hi:
  // none). Only a transfer reading a line in that span can have a changed mean (count_line_reads).
  LineCounts m_line_readers;
  uint64_t m_shared_changed_lo = UINT64_MAX, m_shared_changed_hi = 0;
  uint64_t m_last_ps = 0;
  sc_core::sc_event m_rate_change;
  sc_core::sc_event m_writeback_finished;  // see writeback_finished()
  bool m_watch_writebacks = false;         // see writeback_finished()

  Counter& m_l2_hits;
  Counter& m_l2_misses;
  Counter& m_l2_noalloc_hits;
  Counter& m_l2_noalloc_misses;
  Counter& m_l2_bypass_lines;
  Counter& m_l2_writeback_bytes;
  Counter& m_l2_read_bytes;
  Counter& m_l2_write_bytes;
  Counter& m_l2_busy;
  Counter& m_hbm_read_bytes;
  Counter& m_hbm_write_bytes;
  Counter& m_hbm_busy;
  Counter& m_transfers;
};

}  // namespace npusim
