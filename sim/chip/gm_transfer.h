// The core -> memory system interface: a TLM-2.0 generic payload per GM instruction, sent by
// blocking transport with the instruction's own (non-memory) cycles as annotated delay. The
// payload carries this extension with the instruction's GM ranges and the core's port rate; the
// memory system returns when the data has moved, filling in the result fields.
// Data itself is not carried: the functional copy is the instruction's execute() on the
// simulator's DeviceMemory after the transfer, so payload data pointers are null.
#pragma once

#include <cstdint>
#include <vector>

#include <systemc>
#include <tlm>

#include "sim/exec/exec.h"

namespace npusim {

class AbortSignal;  // sim/core/core_env.h

class GmTransfer : public tlm::tlm_extension<GmTransfer> {
 public:
  // Request.
  const std::vector<GmAccess>* ranges = nullptr;
  double port_rate = 0;  // bytes per cycle this core's path can move; 0 = not limited by the core
  // Bytes per cycle the path moves into or out of L2 lines; 0 = the chip's L2 port rate for
  // the direction (memory.l2.core_read/write_bytes_per_cycle).
  double l2_port_rate = 0;
  // Bytes per cycle the instruction's request issue allows in either phase (ExecCost::
  // gm_request_rate); 0: no such limit.
  double request_rate = 0;
  // The initiating core's abort signal (AiCore::abort_signal): the transfer unwinds when it is
  // raised. Set once by the initiator; never copied (copy_from).
  AbortSignal* abort_signal = nullptr;
  // Result.
  sc_core::sc_time transfer_time;  // time in the bandwidth-shared phase (after latency)
  double alone_cycles = 0;         // what that phase takes with no other transfer active
  uint64_t hit_bytes = 0, miss_bytes = 0;

  // Memory-system state while the transfer is in flight (one per initiating pipe thread).
  // phase 0 moves the L2-missing bytes over HBM, phase 1 the hitting bytes over L2.
  // A write-back flow (the memory system's own, MemorySystem::start_writeback) has only an HBM
  // phase and no initiator waiting on it.
  bool writeback_flow = false;
  // The memory-system port (the core's chip index) of the transfer, or for a write-back flow of
  // the transfer whose allocations evicted the lines; -1 before the first use. A launch among
  // concurrent ones that faults drops its cores' transfers only (MemorySystem::abort_transfers_of)
  // and ends after its cores' write-back flows (writebacks_end_of).
  int origin = -1;
  // Write-back flows under memory.l2.write_back_waits: the transfer whose allocations evicted
  // the lines, which completes only after them (its `writeback_pending` is cleared and its
  // `done` notified when this flow ends).
  GmTransfer* evictor = nullptr;
  bool writeback_pending = false;
  double remaining[2] = {0, 0};
  int phase = 0;
  double port[2] = {0, 0};  // the core's port rate in each phase (0: not limited by the core)
  // Of the HBM phase's bytes, the share HBM writes: a write's own missing bytes; 1 for a
  // write-back flow (memory.hbm.turnaround_loss prices the read/write mix).
  double hbm_write_share = 0;
  double rate = 0;          // current bytes per cycle
  // Under memory.l2.line_read_bytes_per_cycle, of a read with an L2 phase: the GM lines
  // (address / l2_line_bytes, ascending, each once) its ranges read and the bytes it reads of
  // each; whether they count among the lines' readers now (while its L2 phase runs); and the
  // byte-weighted mean number of transfers reading them, itself included (1: alone).
  std::vector<std::pair<uint64_t, uint64_t>> read_lines;
  bool lines_registered = false;
  double line_readers = 1;
  // Under memory.l2.read_granule_bytes, of a read: the bytes of the L2's shared bandwidth its L2
  // phase takes per byte it moves (its ranges' whole granules over their bytes; >= 1). 1 for a
  // write, a write-back flow, or with the key off.
  double l2_granule_factor = 1;
  sc_core::sc_event done;
  // What the initiating process waits on while the transfer flows: `done`, or `abort`, which
  // the memory system registers with the initiator's AbortSignal (wake_on_raise) at the
  // transfer's first use. A waiter of the signal's shared event would cost every wake-up a
  // linear search of all the chip's waiting transfers (docs/chip_model.md, "Performance").
  sc_core::sc_event abort;
  sc_core::sc_event_or_list done_or_abort;

  tlm::tlm_extension_base* clone() const override {
    auto* e = new GmTransfer;
    e->copy_from(*this);
    return e;
  }
  void copy_from(const tlm::tlm_extension_base& other) override {
    const auto& o = static_cast<const GmTransfer&>(other);
    ranges = o.ranges;
    port_rate = o.port_rate;
    l2_port_rate = o.l2_port_rate;
    request_rate = o.request_rate;
  }
};

}  // namespace npusim
