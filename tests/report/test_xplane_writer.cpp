// The TensorBoard profile plane (adapter/profiler/xplane_writer.h): the protobuf wire format
// against the encodings the protobuf specification gives, and npu_xspace's plane read back with
// a reader written from that specification and xplane.proto's field numbers (no chip
// elaborated; tests/tf/test_tensorboard_profile.py reads a real profile with TensorFlow's proto).
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "adapter/profiler/xplane_writer.h"

using namespace npusim;

namespace {

std::string bytes(std::initializer_list<int> b) {
  std::string s;
  for (int c : b) s.push_back(static_cast<char>(c));
  return s;
}

// One message's fields: varints and fixed64 as numbers, length-delimited ones as bytes.
struct Fields {
  std::multimap<int, uint64_t> num;
  std::multimap<int, std::string> str;
  std::vector<std::string> all_str(int field) const {
    std::vector<std::string> out;
    for (auto [it, end] = str.equal_range(field); it != end; ++it) out.push_back(it->second);
    return out;
  }
  uint64_t one(int field) const {
    REQUIRE(num.count(field) == 1);
    return num.find(field)->second;
  }
};

uint64_t read_varint(const std::string& s, size_t& i) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    REQUIRE(i < s.size());
    const uint8_t b = static_cast<uint8_t>(s[i++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) return v;
  }
}

Fields parse(const std::string& s) {
  Fields f;
  for (size_t i = 0; i < s.size();) {
    const uint64_t key = read_varint(s, i);
    const int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (wire == 0) {
      f.num.emplace(field, read_varint(s, i));
    } else if (wire == 1) {
      uint64_t v = 0;
      for (int k = 0; k < 8; ++k)
        v |= static_cast<uint64_t>(static_cast<uint8_t>(s[i + k])) << (8 * k);
      f.num.emplace(field, v);
      i += 8;
    } else {
      REQUIRE(wire == 2);
      const uint64_t n = read_varint(s, i);
      REQUIRE(i + n <= s.size());
      f.str.emplace(field, s.substr(i, n));
      i += n;
    }
  }
  return f;
}

std::shared_ptr<const isa::Program> vector_program(const std::string& name) {
  auto p = std::make_shared<isa::Program>();
  p->name = name;
  isa::Section s;
  s.kind = isa::CoreKind::AIV;
  p->sections.push_back(s);
  return p;
}

rt::LaunchRecord launch(const std::string& kernel, uint64_t start, uint64_t cycles,
                        uint64_t dispatch) {
  rt::LaunchRecord r;
  r.kernel = kernel;
  r.stream = 3;
  r.block_dim = 2;
  r.start_cycle = start;
  r.cycles = cycles;
  r.ok = true;
  r.program = vector_program(kernel);
  auto l = std::make_shared<rt::LaunchLabel>();
  l->op_name = "dense/MatMul";
  l->op_type = "MatMul";
  l->dispatch = dispatch;
  r.label = l;
  return r;
}

// The plane's id -> name map of metadata field `field` (event_metadata 4, stat_metadata 5).
std::map<uint64_t, std::string> metadata(const Fields& plane, int field) {
  std::map<uint64_t, std::string> out;
  for (const std::string& entry : plane.all_str(field)) {
    const Fields e = parse(entry);
    const Fields meta = parse(e.all_str(2).at(0));
    CHECK(meta.one(1) == e.one(1));
    out[e.one(1)] = meta.all_str(2).at(0);
  }
  return out;
}

}  // namespace

TEST_CASE("xplane writer: the protobuf wire format") {
  prof::ProtoWriter w;
  w.uint64_field(1, 300);
  CHECK(w.bytes() == bytes({0x08, 0xac, 0x02}));
  prof::ProtoWriter n;
  n.int64_field(2, -1);  // int64: ten-byte two's complement varint
  CHECK(n.bytes() == bytes({0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}));
  prof::ProtoWriter d;
  d.double_field(3, 1.0);
  CHECK(d.bytes() == bytes({0x19, 0, 0, 0, 0, 0, 0, 0xf0, 0x3f}));
  prof::ProtoWriter s;
  s.string_field(4, "ab");
  CHECK(s.bytes() == bytes({0x22, 0x02, 'a', 'b'}));
}

TEST_CASE("xplane writer: cycles to ps at the chip's clock, rounded to the nearest") {
  CHECK(prof::cycles_to_ps(1634, 1850) == 883243);  // 883243.24
  CHECK(prof::cycles_to_ps(2, 3) == 666667);        // 666666.67
  CHECK(prof::cycles_to_ps(1000, 1000) == 1000000);
  CHECK(prof::cycles_to_ps(0, 1850) == 0);
}

TEST_CASE("xplane writer: the window's launches on a stream line and a TF op line") {
  const ChipConfig cfg = load_chip_config("tiny");
  // Two kernels of one MatMul run (dispatch 5) inside the window, one before, one after it.
  const std::vector<rt::LaunchRecord> launches = {
      launch("before", 100, 50, 4), launch("cast", 1000, 200, 5), launch("mm", 1200, 300, 5),
      launch("after", 2000, 10, 6)};
  prof::XPlaneWindow w;
  w.device_ordinal = 0;
  w.origin_cycle = 900;
  w.end_cycle = 2000;
  w.origin_walltime_ns = 1234567;
  const Fields space = parse(prof::npu_xspace(launches, cfg, w));
  REQUIRE(space.all_str(1).size() == 1);
  const Fields plane = parse(space.all_str(1)[0]);
  CHECK(plane.all_str(2).at(0) == "/device:CUSTOM:NPU:0");
  const auto events = metadata(plane, 4);
  const auto stats = metadata(plane, 5);
  std::map<std::string, Fields> lines;
  for (const std::string& l : plane.all_str(3)) {
    const Fields line = parse(l);
    CHECK(line.one(3) == 1234567);  // timestamp_ns: the wall clock at the window's origin
    lines[line.all_str(2).at(0)] = line;
  }
  REQUIRE(lines.count("Stream #3") == 1);
  REQUIRE(lines.count("TensorFlow Ops") == 1);
  const std::vector<std::string> kernels = lines["Stream #3"].all_str(4);
  REQUIRE(kernels.size() == 2);
  const Fields cast = parse(kernels[0]), mm = parse(kernels[1]);
  CHECK(events.at(cast.one(1)) == "cast");
  CHECK(events.at(mm.one(1)) == "mm");
  CHECK(cast.one(2) == static_cast<uint64_t>(prof::cycles_to_ps(100, cfg.clock_mhz)));
  CHECK(cast.one(3) == static_cast<uint64_t>(prof::cycles_to_ps(200, cfg.clock_mhz)));
  CHECK(mm.one(2) == static_cast<uint64_t>(prof::cycles_to_ps(300, cfg.clock_mhz)));
  std::map<std::string, std::string> mm_str;
  std::map<std::string, uint64_t> mm_num;
  for (const std::string& st : mm.all_str(4)) {
    const Fields f = parse(st);
    const std::string name = stats.at(f.one(1));
    if (!f.all_str(5).empty())
      mm_str[name] = f.all_str(5)[0];
    else
      mm_num[name] = f.num.find(f.num.count(3) ? 3 : 4)->second;
  }
  CHECK(mm_str["tf_op"] == "dense/MatMul:MatMul");
  CHECK(mm_str["task_type"] == "AI_VECTOR_CORE");
  CHECK(mm_num["task_id"] == 1);
  CHECK(mm_num["start_cycle"] == 1200);
  CHECK(mm_num["cycles"] == 300);
  // The TF op's run spans both kernels: from the cast's start to the MatMul's end.
  const std::vector<std::string> runs = lines["TensorFlow Ops"].all_str(4);
  REQUIRE(runs.size() == 1);
  const Fields run = parse(runs[0]);
  CHECK(events.at(run.one(1)) == "dense/MatMul");
  CHECK(run.one(2) == static_cast<uint64_t>(prof::cycles_to_ps(100, cfg.clock_mhz)));
  CHECK(run.one(3) == static_cast<uint64_t>(prof::cycles_to_ps(500, cfg.clock_mhz)));
}

TEST_CASE("xplane writer: a task ending a cycle past the next one's start ends at that start") {
  // As in op_summary.csv (runtime_report.h, op_records): the window's last task is cut by the
  // launch after the window.
  const ChipConfig cfg = load_chip_config("tiny");
  const std::vector<rt::LaunchRecord> launches = {launch("a", 0, 101, 1), launch("b", 100, 5, 2)};
  prof::XPlaneWindow w;
  w.end_cycle = 100;
  const Fields plane = parse(parse(prof::npu_xspace(launches, cfg, w)).all_str(1).at(0));
  for (const std::string& l : plane.all_str(3)) {
    const Fields line = parse(l);
    if (line.all_str(2).at(0) != "Stream #3") continue;
    REQUIRE(line.all_str(4).size() == 1);
    CHECK(parse(line.all_str(4)[0]).one(3) ==
          static_cast<uint64_t>(prof::cycles_to_ps(100, cfg.clock_mhz)));
  }
}
