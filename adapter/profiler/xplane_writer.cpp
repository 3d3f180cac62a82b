#include "adapter/profiler/xplane_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "adapter/profiler/runtime_report.h"

namespace npusim::prof {

void ProtoWriter::varint(uint64_t v) {
  while (v >= 0x80) {
    m_bytes.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  m_bytes.push_back(static_cast<char>(v));
}

void ProtoWriter::tag(int field, int wire_type) {
  varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

void ProtoWriter::int64_field(int field, int64_t v) {
  uint64_field(field, static_cast<uint64_t>(v));
}

void ProtoWriter::uint64_field(int field, uint64_t v) {
  tag(field, 0);
  varint(v);
}

void ProtoWriter::double_field(int field, double v) {
  tag(field, 1);
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  for (int i = 0; i < 8; ++i) m_bytes.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void ProtoWriter::string_field(int field, const std::string& bytes) {
  tag(field, 2);
  varint(bytes.size());
  m_bytes += bytes;
}

std::string npu_plane_name(int device_ordinal) {
  return fmt::format("/device:CUSTOM:NPU:{}", device_ordinal);
}

int64_t cycles_to_ps(uint64_t cycles, double clock_mhz) {
  return static_cast<int64_t>(std::llround(static_cast<long double>(cycles) * 1e6L / clock_mhz));
}

namespace {

// Field numbers of tsl/profiler/protobuf/xplane.proto.
enum XSpaceField { kSpacePlanes = 1 };
enum XPlaneField {
  kPlaneId = 1,
  kPlaneName = 2,
  kPlaneLines = 3,
  kPlaneEventMetadata = 4,
  kPlaneStatMetadata = 5,
  kPlaneStats = 6
};
enum XLineField {
  kLineId = 1,
  kLineName = 2,
  kLineTimestampNs = 3,
  kLineEvents = 4,
  kLineDurationPs = 9
};
enum XEventField {
  kEventMetadataId = 1,
  kEventOffsetPs = 2,
  kEventDurationPs = 3,
  kEventStats = 4
};
enum XStatField {
  kStatMetadataId = 1,
  kStatDouble = 2,
  kStatUint64 = 3,
  kStatInt64 = 4,
  kStatStr = 5
};
enum XMetadataField { kMetadataId = 1, kMetadataName = 2 };  // XEventMetadata and XStatMetadata
enum MapEntryField { kMapKey = 1, kMapValue = 2 };

// Interns event and stat names as the plane's metadata (ids from 1; 0 means none in XPlane).
class PlaneMetadata {
 public:
  int64_t event(const std::string& name) { return intern(m_events, name); }
  int64_t stat(const std::string& name) { return intern(m_stats, name); }
  // The plane's event_metadata and stat_metadata map entries.
  void write(ProtoWriter& plane) const {
    write_map(plane, kPlaneEventMetadata, m_events);
    write_map(plane, kPlaneStatMetadata, m_stats);
  }

 private:
  static int64_t intern(std::map<std::string, int64_t>& ids, const std::string& name) {
    return ids.try_emplace(name, static_cast<int64_t>(ids.size()) + 1).first->second;
  }
  static void write_map(ProtoWriter& plane, int field, const std::map<std::string, int64_t>& ids) {
    for (const auto& [name, id] : ids) {
      ProtoWriter meta, entry;
      meta.int64_field(kMetadataId, id);
      meta.string_field(kMetadataName, name);
      entry.int64_field(kMapKey, id);
      entry.string_field(kMapValue, meta.bytes());
      plane.string_field(field, entry.bytes());
    }
  }
  std::map<std::string, int64_t> m_events, m_stats;
};

// One XStat, written into an event or a plane (`field`: its stats field).
class StatWriter {
 public:
  StatWriter(ProtoWriter& owner, int field, PlaneMetadata& meta)
      : m_owner(owner), m_field(field), m_meta(meta) {}
  void str(const std::string& name, const std::string& v) {
    put(name, [&](ProtoWriter& s) { s.string_field(kStatStr, v); });
  }
  void u64(const std::string& name, uint64_t v) {
    put(name, [&](ProtoWriter& s) { s.uint64_field(kStatUint64, v); });
  }
  void i64(const std::string& name, int64_t v) {
    put(name, [&](ProtoWriter& s) { s.int64_field(kStatInt64, v); });
  }
  void f64(const std::string& name, double v) {
    put(name, [&](ProtoWriter& s) { s.double_field(kStatDouble, v); });
  }

 private:
  template <typename F>
  void put(const std::string& name, F value) {
    ProtoWriter s;
    s.int64_field(kStatMetadataId, m_meta.stat(name));
    value(s);
    m_owner.string_field(m_field, s.bytes());
  }
  ProtoWriter& m_owner;
  int m_field;
  PlaneMetadata& m_meta;
};

// A line being filled: its events and the end of the last one (ps after the line's start).
struct LineBuilder {
  ProtoWriter events;
  int64_t end_ps = 0;
};

std::string line_bytes(int64_t id, const std::string& name, int64_t timestamp_ns,
                       const LineBuilder& l) {
  ProtoWriter line;
  line.int64_field(kLineId, id);
  line.string_field(kLineName, name);
  line.int64_field(kLineTimestampNs, timestamp_ns);
  line.int64_field(kLineDurationPs, l.end_ps);
  return line.bytes() + l.events.bytes();  // events are field 4 entries, already tagged
}

// Starts an event in `line` (offset and duration in ps from the window's origin); returns the
// event's writer, which the caller gives stats, then closes with close_event.
ProtoWriter open_event(int64_t metadata_id, int64_t offset_ps, int64_t duration_ps) {
  ProtoWriter e;
  e.int64_field(kEventMetadataId, metadata_id);
  e.int64_field(kEventOffsetPs, offset_ps);
  e.int64_field(kEventDurationPs, duration_ps);
  return e;
}

void close_event(LineBuilder& line, const ProtoWriter& e, int64_t end_ps) {
  line.events.string_field(kLineEvents, e.bytes());
  line.end_ps = std::max(line.end_ps, end_ps);
}

std::string tf_op_text(const OpRecord& op) { return op.op_name + ":" + op.op_type; }

}  // namespace

namespace {

// The window's tasks on the device timeline, in ps from its origin.
struct PlaneBuild {
  const std::vector<OpRecord>& ops;
  const ChipConfig& cfg;
  const XPlaneWindow& w;
  PlaneMetadata meta;
  std::vector<std::pair<int64_t, int64_t>> task_ps;  // each task's [begin, end); set by kernels

  bool in_window(uint64_t start) const { return start >= w.origin_cycle && start < w.end_cycle; }
};

// One event per launch of the window, on its stream's line (by stream id).
std::map<uint64_t, LineBuilder> kernel_lines(PlaneBuild& b) {
  std::map<uint64_t, LineBuilder> streams;
  b.task_ps.assign(b.ops.size(), {0, 0});
  for (size_t i = 0, task = 0; i < b.ops.size(); ++i) {
    const OpRecord& op = b.ops[i];
    if (!b.in_window(op.start_cycle)) continue;
    const int64_t begin = cycles_to_ps(op.start_cycle - b.w.origin_cycle, b.cfg.clock_mhz);
    const int64_t dur = cycles_to_ps(op.cycles, b.cfg.clock_mhz);
    b.task_ps[i] = {begin, begin + dur};
    ProtoWriter e =
        open_event(b.meta.event(op.kernel.empty() ? op.op_name : op.kernel), begin, dur);
    StatWriter s(e, kEventStats, b.meta);
    s.str("tf_op", tf_op_text(op));
    s.u64("task_id", task++);
    s.str("task_type", op.task_type);
    s.i64("block_dim", op.block_dim);
    s.u64("start_cycle", op.start_cycle);
    s.u64("cycles", op.cycles);
    close_event(streams[op.stream], e, begin + dur);
  }
  return streams;
}

// One event per TF op run that starts in the window, spanning its kernels' events exactly
// (their ps, not its cycles rounded again). After kernel_lines.
LineBuilder tf_op_line(PlaneBuild& b, const std::vector<rt::LaunchRecord>& launches) {
  LineBuilder line;
  for (const TfOpSpan& span : tf_op_spans(launches, b.ops)) {
    if (!b.in_window(span.start_cycle)) continue;
    int64_t begin = b.task_ps[span.first_task].first, end = begin;
    for (size_t t : span.tasks) {
      if (!b.in_window(b.ops[t].start_cycle)) continue;
      begin = std::min(begin, b.task_ps[t].first);
      end = std::max(end, b.task_ps[t].second);
    }
    const OpRecord& op = b.ops[span.first_task];
    ProtoWriter e = open_event(b.meta.event(op.op_name), begin, end - begin);
    StatWriter s(e, kEventStats, b.meta);
    s.str("tf_op", tf_op_text(op));
    s.str("kernels", fmt::format("{}", fmt::join(span.kernels, ",")));
    close_event(line, e, end);
  }
  return line;
}

// One event per collective of the chip that starts in the window.
LineBuilder comm_line(PlaneBuild& b, const std::vector<rt::CollectiveRecord>& comms) {
  LineBuilder line;
  for (const rt::CollectiveRecord& c : comms) {
    const auto rank = std::find(c.chips.begin(), c.chips.end(), b.w.device_ordinal);
    if (rank == c.chips.end() || !b.in_window(c.start_cycle)) continue;
    const int64_t begin = cycles_to_ps(c.start_cycle - b.w.origin_cycle, b.cfg.clock_mhz);
    const int64_t dur = cycles_to_ps(c.end_cycle - c.start_cycle, b.cfg.clock_mhz);
    ProtoWriter e = open_event(b.meta.event("hcom_" + c.collective), begin, dur);
    StatWriter s(e, kEventStats, b.meta);
    s.u64("id", c.id);
    s.str("label", c.label);
    s.str("algorithm", c.algorithm);
    s.u64("bytes", c.bytes);
    s.str("chips", fmt::format("{}", fmt::join(c.chips, ",")));
    s.i64("rank", rank - c.chips.begin());
    s.u64("start_cycle", c.start_cycle);
    s.u64("cycles", c.end_cycle - c.start_cycle);
    close_event(line, e, begin + dur);
  }
  return line;
}

}  // namespace

std::string npu_xspace(const std::vector<rt::LaunchRecord>& launches, const ChipConfig& cfg,
                       const XPlaneWindow& w) {
  return xspace_of({npu_xplane(launches, {}, cfg, w)});
}

std::string xspace_of(const std::vector<std::string>& planes) {
  ProtoWriter space;
  for (const std::string& plane : planes) space.string_field(kSpacePlanes, plane);
  return space.bytes();
}

std::string npu_xplane(const std::vector<rt::LaunchRecord>& launches,
                       const std::vector<rt::CollectiveRecord>& comms, const ChipConfig& cfg,
                       const XPlaneWindow& w) {
  const std::vector<OpRecord> ops = op_records(launches, cfg);
  PlaneBuild b{ops, cfg, w, {}, {}};
  const std::map<uint64_t, LineBuilder> streams = kernel_lines(b);
  const LineBuilder tf_ops = tf_op_line(b, launches);
  ProtoWriter plane;
  plane.int64_field(kPlaneId, w.device_ordinal);
  plane.string_field(kPlaneName, npu_plane_name(w.device_ordinal));
  plane.string_field(kPlaneLines, line_bytes(0, "TensorFlow Ops", w.origin_walltime_ns, tf_ops));
  for (const auto& [stream, line] : streams)
    plane.string_field(
        kPlaneLines, line_bytes(static_cast<int64_t>(stream) + 1, fmt::format("Stream #{}", stream),
                                w.origin_walltime_ns, line));
  if (!comms.empty())
    plane.string_field(kPlaneLines, line_bytes(kCommLineId, "Communication", w.origin_walltime_ns,
                                               comm_line(b, comms)));
  StatWriter ps(plane, kPlaneStats, b.meta);
  ps.f64("clock_mhz", cfg.clock_mhz);
  ps.u64("origin_cycle", w.origin_cycle);
  ps.u64("end_cycle", w.end_cycle);
  ps.str("chip", cfg.name);
  b.meta.write(plane);
  return plane.bytes();
}

}  // namespace npusim::prof
