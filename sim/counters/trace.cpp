#include "sim/counters/trace.h"

#include <fmt/format.h>

#include "isa/disassembler.h"

namespace npusim {

namespace trace_events {

nlohmann::json meta(const char* what, uint32_t pid, int64_t tid, const char* key,
                    nlohmann::json value) {
  nlohmann::json e = {{"ph", "M"}, {"name", what}, {"pid", pid}, {"args", {{key, value}}}};
  if (tid >= 0) e["tid"] = tid;
  return e;
}

void append_core_process(nlohmann::json& events, int core, const std::string& name,
                         int sort_index) {
  const uint32_t pid = core_pid(core);
  events.push_back(meta("process_name", pid, -1, "name", name));
  events.push_back(meta("process_sort_index", pid, -1, "sort_index", sort_index));
  for (int l = 0; l < kNumLanes; ++l) {
    events.push_back(meta("thread_name", pid, lane_tid(Lane(l)), "name", lane_name(Lane(l))));
    events.push_back(meta("thread_sort_index", pid, lane_tid(Lane(l)), "sort_index", l));
  }
}

nlohmann::json instruction(uint32_t pid, uint32_t tid, double ts_us, double dur_us, uint64_t pc,
                           const std::string& text, const std::string& line) {
  return {{"pid", pid},    {"tid", tid},
          {"ts", ts_us},   {"ph", "X"},
          {"dur", dur_us}, {"name", text},
          {"cat", "insn"}, {"args", {{"pc", pc}, {"line", line}, {"insn", text}}}};
}

nlohmann::json flag_flow(uint32_t pid, uint32_t tid, double ts_us, bool begin, uint64_t id) {
  nlohmann::json j = {{"pid", pid},     {"tid", tid},    {"ts", ts_us}, {"ph", begin ? "s" : "f"},
                      {"name", "flag"}, {"cat", "sync"}, {"id", id}};
  if (!begin) j["bp"] = "e";
  return j;
}

uint32_t Strings::intern(const std::string& s) {
  auto [it, fresh] = m_index.emplace(s, static_cast<uint32_t>(m_strings.size()));
  if (fresh) m_strings.push_back(s);
  return it->second;
}

void Strings::begin_program(const isa::Program& prog) {
  m_insn_text.clear();
  m_source = prog.source.empty() ? prog.name : prog.source;
}

std::pair<uint32_t, uint32_t> Strings::instruction(const isa::Instruction& in,
                                                   const isa::Section& section) {
  auto it = m_insn_text.find(&in);
  if (it == m_insn_text.end()) {
    std::string loc = in.src_line ? fmt::format("{}:{}", m_source, in.src_line) : m_source;
    it = m_insn_text
             .emplace(&in, std::make_pair(intern(isa::disassemble(in, &section)), intern(loc)))
             .first;
  }
  return it->second;
}

void Strings::clear() {
  m_strings.clear();
  m_index.clear();
  m_insn_text.clear();
  m_source.clear();
}

}  // namespace trace_events

namespace {

using trace_events::core_pid;
using trace_events::kCorePidBase;
using trace_events::lane_tid;
using trace_events::meta;

// Process ids: the chip-level lanes first, then one per core (from kCorePidBase).
constexpr uint32_t kChipPid = 1, kHdcPid = 2;
constexpr uint32_t kKernelTid = 1, kH2dTid = 1, kD2hTid = 2;

}  // namespace

const char* lane_name(Lane l) {
  static const char* const names[kNumLanes] = {"SCALAR", "MTE1",   "MTE2", "MTE3",
                                               "CUBE",   "VECTOR", "FIXP"};
  return names[static_cast<int>(l)];
}

Lane lane_of(isa::Pipe p) {
  switch (p) {
    case isa::Pipe::MTE1: return Lane::MTE1;
    case isa::Pipe::MTE2: return Lane::MTE2;
    case isa::Pipe::MTE3: return Lane::MTE3;
    case isa::Pipe::M: return Lane::CUBE;
    case isa::Pipe::V: return Lane::VECTOR;
    case isa::Pipe::FIX: return Lane::FIXP;
    default: return Lane::SCALAR;
  }
}

bool TraceRecorder::admit() {
  if (m_recorded >= m_max_events) {
    ++m_dropped;
    return false;
  }
  ++m_recorded;
  return true;
}

void TraceRecorder::on_core(int core, const std::string& name) { m_cores.emplace_back(core, name); }

void TraceRecorder::on_kernel_begin(const isa::Program& prog, int block_dim, uint64_t t_ps) {
  m_strings.begin_program(prog);
  m_kernel_start = t_ps;
  m_block_dim = block_dim;
}

void TraceRecorder::on_kernel_end(const isa::Program& prog, uint64_t t_ps, bool ok) {
  std::string name = ok ? prog.name : prog.name + " (failed)";
  m_events.push_back({Kind::Slice, kChipPid, kKernelTid, m_kernel_start, t_ps, 0,
                      m_strings.intern(name), m_strings.intern(m_strings.source()),
                      static_cast<uint64_t>(m_block_dim)});
}

void TraceRecorder::on_instruction(int core, Lane lane, uint64_t start_ps, uint64_t end_ps,
                                   uint32_t pc, const isa::Instruction& in,
                                   const isa::Section& section) {
  if (!admit()) return;
  const auto [text, loc] = m_strings.instruction(in, section);
  m_events.push_back(
      {Kind::Slice, core_pid(core), lane_tid(lane), start_ps, end_ps, pc, text, loc, 0});
}

void TraceRecorder::on_flow_begin(int core, Lane lane, uint64_t t_ps, uint64_t flow) {
  if (admit())
    m_events.push_back(
        {Kind::FlowBegin, core_pid(core), lane_tid(lane), t_ps, t_ps, flow, 0, 0, 0});
}

void TraceRecorder::on_flow_end(int core, Lane lane, uint64_t t_ps, uint64_t flow) {
  if (admit())
    m_events.push_back({Kind::FlowEnd, core_pid(core), lane_tid(lane), t_ps, t_ps, flow, 0, 0, 0});
}

void TraceRecorder::on_hdc(bool host_to_device, uint64_t start_ps, uint64_t end_ps,
                           uint64_t bytes) {
  if (!admit()) return;
  m_events.push_back({Kind::Slice, kHdcPid, host_to_device ? kH2dTid : kD2hTid, start_ps, end_ps, 0,
                      m_strings.intern(host_to_device ? "host->device" : "device->host"), 0,
                      bytes});
}

nlohmann::json TraceRecorder::to_json() const {
  nlohmann::json ev = nlohmann::json::array();
  ev.push_back(meta("process_name", kChipPid, -1, "name", "chip"));
  ev.push_back(meta("process_sort_index", kChipPid, -1, "sort_index", 0));
  ev.push_back(meta("thread_name", kChipPid, kKernelTid, "name", "kernels"));
  ev.push_back(meta("process_name", kHdcPid, -1, "name", "hdc"));
  ev.push_back(meta("process_sort_index", kHdcPid, -1, "sort_index", 1));
  ev.push_back(meta("thread_name", kHdcPid, kH2dTid, "name", "h2d"));
  ev.push_back(meta("thread_name", kHdcPid, kD2hTid, "name", "d2h"));
  for (const auto& [core, name] : m_cores)
    trace_events::append_core_process(ev, core, name, 2 + core);
  for (const Event& e : m_events) {
    const double ts = us(e.start_ps);
    if (e.kind != Kind::Slice) {
      ev.push_back(trace_events::flag_flow(e.pid, e.tid, ts, e.kind == Kind::FlowBegin, e.id));
      continue;
    }
    if (e.pid >= kCorePidBase) {
      ev.push_back(trace_events::instruction(e.pid, e.tid, ts, us(e.end_ps - e.start_ps), e.id,
                                             m_strings[e.name], m_strings[e.loc]));
      continue;
    }
    nlohmann::json j = {{"pid", e.pid},
                        {"tid", e.tid},
                        {"ts", ts},
                        {"ph", "X"},
                        {"dur", us(e.end_ps - e.start_ps)},
                        {"name", m_strings[e.name]}};
    if (e.pid == kChipPid) {
      j["cat"] = "kernel";
      j["args"] = {{"source", m_strings[e.loc]}, {"block_dim", e.arg}};
    } else {
      j["cat"] = "hdc";
      j["args"] = {{"bytes", e.arg}};
    }
    ev.push_back(std::move(j));
  }
  return {{"traceEvents", std::move(ev)},
          {"displayTimeUnit", "ns"},
          {"otherData", {{"clock_mhz", m_clock_mhz}, {"dropped_events", m_dropped}}}};
}

}  // namespace npusim
