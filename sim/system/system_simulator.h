// Several chips in one SystemC simulation (one process, one clock): each chip of the
// SystemConfig has its own cores, L2, HBM (its own DeviceMemory) and host link, and the chips are
// joined by the Fabric's links. Kernels run on chosen chips at the same simulated time; copies
// between chips move over the links and share them. The collective engine
// (sim/collective/collective.h) builds on this. Chips are addressed by index 0..chips()-1 (the
// TensorFlow plugin's device index); a device address is (chip, address in that chip's memory).
// Like Simulator, at most one SystemSimulator (or Simulator) per process; not thread-safe.
// Launch replay (SimOptions::replay, sim/replay/chip_launcher.h) works as on one chip, the
// recordings shared by the chips: a launch recorded on one chip replays on any chip.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/config/system_config.h"
#include "sim/memory/device_memory.h"
#include "sim/simulator.h"

namespace npusim {

class ChipObserver;
class Fabric;

struct ChipLaunch {
  int chip = 0;
  KernelLaunch launch;
};

// One copy from one chip's device memory to another's.
struct PeerCopy {
  int src_chip = 0;
  uint64_t src_addr = 0;
  int dst_chip = 0;
  uint64_t dst_addr = 0;
  uint64_t bytes = 0;
};

struct PeerCopyResult {
  uint64_t start_cycle = 0;
  uint64_t cycles = 0;  // until the last copy's last byte arrived
  double time_us = 0;
  std::vector<uint64_t> copy_cycles;  // each copy's own duration, in the order given
};

class SystemSimulator {
 public:
  // Throws npusim::Error if a simulator was already constructed in this process.
  SystemSimulator(const SystemConfig& cfg, const SimOptions& opts);
  ~SystemSimulator();
  SystemSimulator(const SystemSimulator&) = delete;
  SystemSimulator& operator=(const SystemSimulator&) = delete;

  const SystemConfig& config() const;
  int chips() const;
  // Chip `chip`'s device memory; throws npusim::Error naming the index if there is no such chip.
  DeviceMemory& gm(int chip);
  bool functional() const;  // false: timing-only (SimOptions::functional)

  // Runs one launch on each listed chip (distinct chips), all starting now on one clock edge,
  // until every one has finished, faulted or deadlocked. Results in the order given.
  std::vector<KernelResult> run(const std::vector<ChipLaunch>& launches);
  // The same launches while `alongside` runs: they start now on one clock edge, then
  // `alongside` is called and its transfer() and advance() calls (run_collective: HCCL's
  // collectives on the same chips) take simulated time while the kernels run; then the launches
  // run to their end. The links and the cores share nothing in this model (collectives are
  // zero-copy), so each takes the time it takes alone and the two overlap. Inside `alongside`,
  // run() and the host-link copies are errors.
  std::vector<KernelResult> run_alongside(const std::vector<ChipLaunch>& launches,
                                          const std::function<void()>& alongside);
  HdcResult copy_host_to_device(int chip, uint64_t dev_addr, const void* src, uint64_t bytes);
  HdcResult copy_device_to_host(int chip, void* dst, uint64_t dev_addr, uint64_t bytes);
  // Submits every copy now; they run concurrently over the links (sharing the channels they
  // cross) until the last one ends. Functional: every copy's source is read before any
  // destination is written, so copies of one call may exchange buffers.
  PeerCopyResult copy_peer(const std::vector<PeerCopy>& copies);
  // Link traffic without device memory: each transfer's bytes move from chip src to chip dst
  // over the links (all submitted now, sharing the channels), nothing is read or written. The
  // collective engine moves its data between its own buffers and times it with this.
  struct LinkTransfer {
    int src = 0, dst = 0;
    uint64_t bytes = 0;
  };
  PeerCopyResult transfer(const std::vector<LinkTransfer>& transfers);
  // Lets `cycles` of simulated time pass on every chip (work of known duration).
  void advance(uint64_t cycles);
  uint64_t now_cycles() const;
  // Counters since construction: {"chip0": {...}, ..., "fabric": {"c0->c1": {...}}}.
  nlohmann::json counters() const;
  // Chip `chip`'s counters since construction, as Simulator::counters() gives a single chip's:
  // {"chip": {...}} (each chip has its own registry; KernelResult::counters of a launch on it
  // has the same root). Throws npusim::Error naming the index if there is no such chip.
  nlohmann::json chip_counters(int chip) const;
  // Chip `chip`'s Chrome trace (SimOptions::trace), as Simulator::trace() gives a single chip's.
  nlohmann::json trace(int chip) const;
  // Attaches an observer to chip `chip` (as Simulator::add_observer): launches on that chip are
  // then simulated, not replayed, while an attached observer wants their detail.
  void add_observer(int chip, ChipObserver* observer);
  void remove_observer(int chip, ChipObserver* observer);
  const Fabric& fabric() const;

 private:
  // gm(chip), after checking that [addr, addr + bytes) lies in it (else an Error naming `what`).
  DeviceMemory& gm_range(int chip, uint64_t addr, uint64_t bytes, const std::string& what);
  struct Impl;
  std::unique_ptr<Impl> m_impl;
};

}  // namespace npusim
