#include "adapter/profiler/pipe_trace.h"

#include <fmt/format.h>

#include "isa/disassembler.h"

namespace npusim::prof {
namespace {

// The CLI trace's ids (sim/counters/trace.cpp): one process per core from pid 100, lane tid =
// Lane + 1.
constexpr uint32_t kCorePidBase = 100;
uint32_t lane_tid(Lane l) { return static_cast<uint32_t>(l) + 1; }

nlohmann::json meta(const char* what, uint32_t pid, int64_t tid, const char* key,
                    nlohmann::json value) {
  nlohmann::json e = {{"ph", "M"}, {"name", what}, {"pid", pid}, {"args", {{key, value}}}};
  if (tid >= 0) e["tid"] = tid;
  return e;
}

}  // namespace

void PipeTraceCollector::reset(PipeTraceOptions opts) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_opts = opts;
  m_stats = Stats();
  m_in_detail = false;
  m_launch_begin.clear();
  m_events.clear();
  m_strings.clear();
  m_string_index.clear();
  m_insn_text.clear();
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

uint32_t PipeTraceCollector::intern_locked(const std::string& s) {
  auto [it, fresh] = m_string_index.emplace(s, static_cast<uint32_t>(m_strings.size()));
  if (fresh) m_strings.push_back(s);
  return it->second;
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
  m_in_detail = m_stats.launches_detailed < m_opts.detail_launches &&
                m_stats.events < m_opts.max_events;
  if (!m_in_detail) return;
  ++m_stats.launches_detailed;
  m_launch_begin.push_back(t_ps);
  m_insn_text.clear();  // instruction addresses of an earlier program may be reused
  m_source = prog.source.empty() ? prog.name : prog.source;
}

void PipeTraceCollector::on_kernel_end(const isa::Program&, uint64_t, bool) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_in_detail = false;
}

void PipeTraceCollector::on_instruction(int core, Lane lane, uint64_t start_ps, uint64_t end_ps,
                                        uint32_t pc, const isa::Instruction& in,
                                        const isa::Section& section) {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (!admit_locked()) return;
  auto it = m_insn_text.find(&in);
  if (it == m_insn_text.end()) {
    std::string loc = in.src_line ? fmt::format("{}:{}", m_source, in.src_line) : m_source;
    it = m_insn_text
             .emplace(&in, std::make_pair(intern_locked(isa::disassemble(in, &section)),
                                          intern_locked(loc)))
             .first;
  }
  m_events.push_back({Kind::Slice, lane, static_cast<uint32_t>(core),
                      static_cast<uint32_t>(m_launch_begin.size() - 1), start_ps, end_ps, pc,
                      it->second.first, it->second.second});
}

void PipeTraceCollector::on_flow_begin(int core, Lane lane, uint64_t t_ps, uint64_t flow) {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (!admit_locked()) return;
  m_events.push_back({Kind::FlowBegin, lane, static_cast<uint32_t>(core),
                      static_cast<uint32_t>(m_launch_begin.size() - 1), t_ps, t_ps, flow, 0, 0});
}

void PipeTraceCollector::on_flow_end(int core, Lane lane, uint64_t t_ps, uint64_t flow) {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (!admit_locked()) return;
  m_events.push_back({Kind::FlowEnd, lane, static_cast<uint32_t>(core),
                      static_cast<uint32_t>(m_launch_begin.size() - 1), t_ps, t_ps, flow, 0, 0});
}

void PipeTraceCollector::render(nlohmann::json& ev, double clock_mhz,
                                const std::vector<int64_t>& offsets) const {
  std::lock_guard<std::mutex> lock(m_mutex);
  auto us = [&](uint64_t ps) { return static_cast<double>(ps) / 1000.0 / clock_mhz; };
  for (const auto& [core, name] : m_cores) {
    const uint32_t pid = kCorePidBase + static_cast<uint32_t>(core);
    ev.push_back(meta("process_name", pid, -1, "name", name));
    ev.push_back(meta("process_sort_index", pid, -1, "sort_index", 10 + core));
    for (int l = 0; l < kNumLanes; ++l) {
      ev.push_back(meta("thread_name", pid, lane_tid(Lane(l)), "name", lane_name(Lane(l))));
      ev.push_back(meta("thread_sort_index", pid, lane_tid(Lane(l)), "sort_index", l));
    }
  }
  for (const Event& e : m_events) {
    if (e.launch >= offsets.size() || offsets[e.launch] < 0) continue;
    const uint64_t shift = static_cast<uint64_t>(offsets[e.launch]);
    nlohmann::json j = {{"pid", kCorePidBase + e.core},
                        {"tid", lane_tid(e.lane)},
                        {"ts", us(e.start_ps + shift)}};
    switch (e.kind) {
      case Kind::Slice:
        j["ph"] = "X";
        j["dur"] = us(e.end_ps - e.start_ps);
        j["name"] = m_strings[e.text];
        j["cat"] = "insn";
        j["args"] = {{"pc", e.id}, {"line", m_strings[e.loc]}, {"insn", m_strings[e.text]}};
        break;
      case Kind::FlowBegin:
      case Kind::FlowEnd:
        j["ph"] = e.kind == Kind::FlowBegin ? "s" : "f";
        if (e.kind == Kind::FlowEnd) j["bp"] = "e";
        j["name"] = "flag";
        j["cat"] = "sync";
        j["id"] = e.id;
        break;
    }
    ev.push_back(std::move(j));
  }
}

}  // namespace npusim::prof
