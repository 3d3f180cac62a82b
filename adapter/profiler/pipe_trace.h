// The per-pipe instruction timeline of a long run (a TF training step), trimmed so the trace stays
// loadable in Perfetto: an observer of the chip (attach it with rt::Device::add_observer or
// Simulator::add_observer) that keeps every instruction and flag edge of the first
// `detail_launches` launches it sees, up to `max_events` events in all, and nothing of later
// launches (their kernel spans come from the launch records). Thread-safe: the chip calls it on
// the driver thread while another thread may read or reset it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/counters/trace.h"

namespace npusim::prof {

struct PipeTraceOptions {
  uint64_t detail_launches = 50;    // launches recorded in full detail (from the first seen)
  uint64_t max_events = 1'000'000;  // instruction + flow events kept in all
};

class PipeTraceCollector : public ChipObserver {
 public:
  explicit PipeTraceCollector(PipeTraceOptions opts = {}) : m_opts(opts) {}

  // Forgets every launch and event and starts again with `opts` (a new report window).
  void reset(PipeTraceOptions opts);
  PipeTraceOptions options() const;

  struct Stats {
    uint64_t launches_seen = 0;            // since the last reset
    uint64_t launches_detailed = 0;        // of those, recorded (at least partly) in detail
    uint64_t events = 0;                   // instruction and flow events kept
    uint64_t dropped_events = 0;           // events of detailed launches past max_events
    bool last_detailed_truncated = false;  // max_events was reached inside a detailed launch
  };
  Stats stats() const;

  // Chrome-trace events (core processes with one lane per pipe, pid 100 + core as the CLI trace)
  // of the detailed launches, shifted onto the device timeline: `offset_ps_of(sim_begin_ps)`
  // returns, for a launch that began at simulator time sim_begin_ps, the picoseconds to add (the
  // runtime's modelled time before it), or a negative value to leave the launch out. Also the
  // process and lane names of every core. Times in us at `clock_mhz`.
  // write_events hands `emit` each event's JSON text, byte for byte what nlohmann::json::dump()
  // writes for trace_events::instruction / flag_flow / meta (trace.json streams them: a million
  // events as a JSON document take ~1 GiB of host memory); append_events adds them to `events`.
  template <typename OffsetFn>
  void write_events(double clock_mhz, OffsetFn offset_ps_of,
                    const std::function<void(std::string_view)>& emit) const;
  template <typename OffsetFn>
  void append_events(nlohmann::json& events, double clock_mhz, OffsetFn offset_ps_of) const;

  // Begin times (simulator ps) of the detailed launches, in order.
  std::vector<uint64_t> detailed_launch_begins() const;

  void on_core(int core, const std::string& name) override;
  void on_kernel_begin(const isa::Program& prog, int block_dim, uint64_t t_ps) override;
  void on_kernel_end(const isa::Program& prog, uint64_t t_ps, bool ok) override;
  void on_instruction(int core, Lane lane, uint64_t start_ps, uint64_t end_ps, uint32_t pc,
                      const isa::Instruction& in, const isa::Section& section) override;
  void on_flow_begin(int core, Lane lane, uint64_t t_ps, uint64_t flow) override;
  void on_flow_end(int core, Lane lane, uint64_t t_ps, uint64_t flow) override;
  void on_hdc(bool host_to_device, uint64_t start_ps, uint64_t end_ps, uint64_t bytes) override {}
  // True while the next launch would be recorded in detail.
  bool wants_launch_detail() const override;
  // True while a launch is recorded in detail (between its on_kernel_begin and on_kernel_end):
  // outside one the chip's cores do not call the instruction and flow hooks.
  bool wants_instructions() const override { return m_in_detail.load(std::memory_order_acquire); }

 private:
  enum class Kind : uint8_t { Slice, FlowBegin, FlowEnd };
  struct Event {
    Kind kind;
    Lane lane;
    uint32_t core;
    uint32_t launch;            // index into m_launch_begin
    uint64_t start_ps, end_ps;  // flows: start_ps only
    uint64_t id;                // slices: pc; flows: flow id
    uint32_t text, loc;         // slices: string table indices
  };
  bool admit_locked();
  void render(double clock_mhz, const std::vector<int64_t>& launch_offsets_ps,
              const std::function<void(std::string_view)>& emit) const;

  mutable std::mutex m_mutex;
  PipeTraceOptions m_opts;
  std::vector<std::pair<int, std::string>> m_cores;  // kept across resets
  Stats m_stats;
  // The running launch is recorded; written under m_mutex, read without it by the event hooks,
  // which return at once outside a detailed launch (every instruction of every simulated launch
  // calls them while the collector is attached).
  std::atomic<bool> m_in_detail{false};
  std::vector<uint64_t> m_launch_begin;  // detailed launches' begin, simulator ps
  std::vector<Event> m_events;
  trace_events::Strings m_strings;
};

template <typename OffsetFn>
void PipeTraceCollector::write_events(double clock_mhz, OffsetFn offset_ps_of,
                                      const std::function<void(std::string_view)>& emit) const {
  std::vector<int64_t> offsets;
  for (uint64_t begin : detailed_launch_begins()) offsets.push_back(offset_ps_of(begin));
  render(clock_mhz, offsets, emit);
}

template <typename OffsetFn>
void PipeTraceCollector::append_events(nlohmann::json& events, double clock_mhz,
                                       OffsetFn offset_ps_of) const {
  write_events(clock_mhz, offset_ps_of,
               [&](std::string_view e) { events.push_back(nlohmann::json::parse(e)); });
}

}  // namespace npusim::prof
