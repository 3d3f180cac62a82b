// Chrome-trace (Perfetto) timeline recorder: an observer of the chip.
// Layout: one process per core (named after the core, "aic0"), one thread per lane (SCALAR, MTE1,
// MTE2, MTE3, CUBE, VECTOR, FIXP); a "chip" process with a "kernels" lane holding one slice per
// launch; an "hdc" process with "h2d" and "d2h" lanes. Instructions are complete events
// ("ph":"X", ts/dur in microseconds at the chip clock, args pc, source line, instruction text);
// flag edges are flow events ("ph":"s" at the set, "ph":"f" at the released wait, same id).
// After `max_events` instruction/flow/HDC events further ones are dropped (counted).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/counters/observer.h"

namespace npusim {

class TraceRecorder : public ChipObserver {
 public:
  TraceRecorder(double clock_mhz, uint64_t max_events)
      : m_clock_mhz(clock_mhz), m_max_events(max_events) {}

  void on_core(int core, const std::string& name) override;
  void on_kernel_begin(const isa::Program& prog, int block_dim, uint64_t t_ps) override;
  void on_kernel_end(const isa::Program& prog, uint64_t t_ps, bool ok) override;
  void on_instruction(int core, Lane lane, uint64_t start_ps, uint64_t end_ps, uint32_t pc,
                      const isa::Instruction& in, const isa::Section& section) override;
  void on_flow_begin(int core, Lane lane, uint64_t t_ps, uint64_t flow) override;
  void on_flow_end(int core, Lane lane, uint64_t t_ps, uint64_t flow) override;
  void on_hdc(bool host_to_device, uint64_t start_ps, uint64_t end_ps, uint64_t bytes) override;

  // {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}.
  nlohmann::json to_json() const;
  uint64_t dropped_events() const { return m_dropped; }

 private:
  enum class Kind : uint8_t { Slice, FlowBegin, FlowEnd };
  struct Event {
    Kind kind;
    uint32_t pid, tid;
    uint64_t start_ps, end_ps;  // flows: start_ps only
    uint64_t id;                // flows: flow id; slices: pc
    uint32_t name, loc;         // string table indices (slices)
    uint64_t arg;               // slices: bytes for HDC, block_dim for kernels
  };
  bool admit();
  uint32_t intern(const std::string& s);
  double us(uint64_t ps) const { return static_cast<double>(ps) / 1000.0 / m_clock_mhz; }

  double m_clock_mhz;
  uint64_t m_max_events;
  uint64_t m_recorded = 0, m_dropped = 0;
  std::vector<std::pair<int, std::string>> m_cores;
  std::vector<Event> m_events;
  std::vector<std::string> m_strings;
  std::unordered_map<std::string, uint32_t> m_string_index;
  // Per launch: instruction -> (text, location) string indices, so each is formatted once.
  std::unordered_map<const isa::Instruction*, std::pair<uint32_t, uint32_t>> m_insn_text;
  std::string m_source;           // source file of the running program
  uint64_t m_kernel_start = 0;
  int m_block_dim = 0;
};

}  // namespace npusim
