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
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "sim/counters/observer.h"

namespace npusim {

// The per-core part of a chip timeline, shared by TraceRecorder and the profiler's pipe trace
// (adapter/profiler/pipe_trace.h) so that both read alike in Perfetto: one process per core from
// pid kCorePidBase, one thread per lane (tid Lane + 1), instruction slices and flag flows.
namespace trace_events {

constexpr uint32_t kCorePidBase = 100;
inline uint32_t core_pid(int core) { return kCorePidBase + static_cast<uint32_t>(core); }
inline uint32_t lane_tid(Lane l) { return static_cast<uint32_t>(l) + 1; }

// A metadata event ("ph":"M") `what` of process `pid` (and of thread `tid` if >= 0) with args
// {key: value}.
nlohmann::json meta(const char* what, uint32_t pid, int64_t tid, const char* key,
                    nlohmann::json value);
// The metadata of core `core`'s process: its name, its sort index, and its lanes' threads (named
// after the lanes, sorted in lane order).
void append_core_process(nlohmann::json& events, int core, const std::string& name, int sort_index);
// An instruction's complete event ("ph":"X", category "insn") on (pid, tid) from ts_us for
// dur_us: named by its text, args pc, source line and text.
nlohmann::json instruction(uint32_t pid, uint32_t tid, double ts_us, double dur_us, uint64_t pc,
                           const std::string& text, const std::string& line);
// A flag edge's flow event `id` on (pid, tid) at ts_us: "s" at the set (begin), "f" at the
// released wait (bound to the enclosing slice).
nlohmann::json flag_flow(uint32_t pid, uint32_t tid, double ts_us, bool begin, uint64_t id);

// A trace's strings, each stored once, and the running program's instructions' (text, source
// line) string indices, each formatted once per launch.
class Strings {
 public:
  uint32_t intern(const std::string& s);
  const std::string& operator[](uint32_t i) const { return m_strings[i]; }
  // A launch of `prog` begins: its instructions' lines are "<source>:<line>", source being the
  // program's source file (its name without one). Forgets the earlier launch's instructions
  // (their addresses may be reused).
  void begin_program(const isa::Program& prog);
  const std::string& source() const { return m_source; }
  // (text, line) of instruction `in` of the running program's `section`.
  std::pair<uint32_t, uint32_t> instruction(const isa::Instruction& in,
                                            const isa::Section& section);
  void clear();  // everything

 private:
  std::vector<std::string> m_strings;
  std::unordered_map<std::string, uint32_t> m_index;
  std::unordered_map<const isa::Instruction*, std::pair<uint32_t, uint32_t>> m_insn_text;
  std::string m_source;
};

}  // namespace trace_events

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
  double us(uint64_t ps) const { return static_cast<double>(ps) / 1000.0 / m_clock_mhz; }

  double m_clock_mhz;
  uint64_t m_max_events;
  uint64_t m_recorded = 0, m_dropped = 0;
  std::vector<std::pair<int, std::string>> m_cores;
  std::vector<Event> m_events;
  trace_events::Strings m_strings;
  uint64_t m_kernel_start = 0;
  int m_block_dim = 0;
};

}  // namespace npusim
