#include "adapter/profiler/pipe_trace.h"

namespace npusim::prof {

using trace_events::core_pid;
using trace_events::lane_tid;

void PipeTraceCollector::reset(PipeTraceOptions opts) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_opts = opts;
  m_stats = Stats();
  m_in_detail = false;
  m_launch_begin.clear();
  m_events.clear();
  m_strings.clear();
}

PipeTraceOptions PipeTraceCollector::options() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_opts;
}

PipeTraceCollector::Stats PipeTraceCollector::stats() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_stats;
}

std::vector<uint64_t> PipeTraceCollector::detailed_launch_begins() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_launch_begin;
}

bool PipeTraceCollector::admit_locked() {
  if (!m_in_detail) return false;
  if (m_stats.events >= m_opts.max_events) {
    ++m_stats.dropped_events;
    m_stats.last_detailed_truncated = true;
    return false;
  }
  ++m_stats.events;
  return true;
}

void PipeTraceCollector::on_core(int core, const std::string& name) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_cores.emplace_back(core, name);
}

bool PipeTraceCollector::wants_launch_detail() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_stats.launches_detailed < m_opts.detail_launches && m_stats.events < m_opts.max_events;
}

void PipeTraceCollector::on_kernel_begin(const isa::Program& prog, int, uint64_t t_ps) {
  std::lock_guard<std::mutex> lock(m_mutex);
  ++m_stats.launches_seen;
  m_in_detail =
      m_stats.launches_detailed < m_opts.detail_launches && m_stats.events < m_opts.max_events;
  if (!m_in_detail) return;
  ++m_stats.launches_detailed;
  m_launch_begin.push_back(t_ps);
  m_strings.begin_program(prog);
}

void PipeTraceCollector::on_kernel_end(const isa::Program&, uint64_t, bool) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_in_detail = false;
}

void PipeTraceCollector::on_instruction(int core, Lane lane, uint64_t start_ps, uint64_t end_ps,
                                        uint32_t pc, const isa::Instruction& in,
                                        const isa::Section& section) {
  if (!m_in_detail.load(std::memory_order_acquire)) return;  // no lock outside a detailed launch
  std::lock_guard<std::mutex> lock(m_mutex);
  if (!admit_locked()) return;
  const auto [text, loc] = m_strings.instruction(in, section);
  m_events.push_back({Kind::Slice, lane, static_cast<uint32_t>(core),
                      static_cast<uint32_t>(m_launch_begin.size() - 1), start_ps, end_ps, pc, text,
                      loc});
}

void PipeTraceCollector::on_flow_begin(int core, Lane lane, uint64_t t_ps, uint64_t flow) {
  if (!m_in_detail.load(std::memory_order_acquire)) return;  // no lock outside a detailed launch
  std::lock_guard<std::mutex> lock(m_mutex);
  if (!admit_locked()) return;
  m_events.push_back({Kind::FlowBegin, lane, static_cast<uint32_t>(core),
                      static_cast<uint32_t>(m_launch_begin.size() - 1), t_ps, t_ps, flow, 0, 0});
}

void PipeTraceCollector::on_flow_end(int core, Lane lane, uint64_t t_ps, uint64_t flow) {
  if (!m_in_detail.load(std::memory_order_acquire)) return;  // no lock outside a detailed launch
  std::lock_guard<std::mutex> lock(m_mutex);
  if (!admit_locked()) return;
  m_events.push_back({Kind::FlowEnd, lane, static_cast<uint32_t>(core),
                      static_cast<uint32_t>(m_launch_begin.size() - 1), t_ps, t_ps, flow, 0, 0});
}

namespace {

// A JSON number as nlohmann::json::dump() writes it (shortest round-trip form, null if not
// finite), so the streamed events read byte for byte as the documents' dump.
void append_number(std::string& out, double v) { out += nlohmann::json(v).dump(); }
void append_number(std::string& out, uint64_t v) { out += std::to_string(v); }

}  // namespace

void PipeTraceCollector::render(double clock_mhz, const std::vector<int64_t>& offsets,
                                const std::function<void(std::string_view)>& emit) const {
  std::lock_guard<std::mutex> lock(m_mutex);
  auto us = [&](uint64_t ps) { return static_cast<double>(ps) / 1000.0 / clock_mhz; };
  {
    nlohmann::json meta = nlohmann::json::array();
    for (const auto& [core, name] : m_cores)
      trace_events::append_core_process(meta, core, name, 10 + core);
    for (const nlohmann::json& e : meta) emit(e.dump());
  }
  // The string table's entries as JSON strings (escaped and quoted), each formatted once.
  std::vector<std::string> quoted;
  auto quote = [&](uint32_t i) -> const std::string& {
    if (i >= quoted.size()) quoted.resize(i + 1);
    if (quoted[i].empty()) quoted[i] = nlohmann::json(m_strings[i]).dump();
    return quoted[i];
  };
  // The keys in nlohmann's order (std::map: sorted), the fields of trace_events::instruction
  // and trace_events::flag_flow.
  std::string e;
  for (const Event& ev : m_events) {
    if (ev.launch >= offsets.size() || offsets[ev.launch] < 0) continue;
    const uint64_t shift = static_cast<uint64_t>(offsets[ev.launch]);
    const uint32_t pid = core_pid(static_cast<int>(ev.core)), tid = lane_tid(ev.lane);
    const double ts = us(ev.start_ps + shift);
    e.clear();
    if (ev.kind == Kind::Slice) {
      const std::string& text = quote(ev.text);
      e += "{\"args\":{\"insn\":";
      e += text;
      e += ",\"line\":";
      e += quote(ev.loc);
      e += ",\"pc\":";
      append_number(e, ev.id);
      e += "},\"cat\":\"insn\",\"dur\":";
      append_number(e, us(ev.end_ps - ev.start_ps));
      e += ",\"name\":";
      e += text;
      e += ",\"ph\":\"X\"";
    } else {
      e += ev.kind == Kind::FlowEnd ? "{\"bp\":\"e\",\"cat\":\"sync\",\"id\":"
                                    : "{\"cat\":\"sync\",\"id\":";
      append_number(e, ev.id);
      e += ",\"name\":\"flag\",\"ph\":";
      e += ev.kind == Kind::FlowEnd ? "\"f\"" : "\"s\"";
    }
    e += ",\"pid\":";
    append_number(e, uint64_t{pid});
    e += ",\"tid\":";
    append_number(e, uint64_t{tid});
    e += ",\"ts\":";
    append_number(e, ts);
    e += '}';
    emit(e);
  }
}

}  // namespace npusim::prof
