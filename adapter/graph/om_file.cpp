#include <fmt/format.h>

#include <cstring>
#include <fstream>

#include "adapter/graph/model.h"
#include "common/error.h"
#include "common/input_file.h"
#include "isa/kernel_file.h"

namespace npusim::graph {
namespace {

using nlohmann::json;

constexpr size_t kPrefixBytes = 32;  // magic, version, 0, payload size, checksum
constexpr uint64_t kMaxOmFileBytes = uint64_t{16} << 30;

void put_u64(std::vector<uint8_t>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(uint8_t(v >> (8 * i)));
}

uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

json desc_json(const compiler::TensorDesc& t) {
  return {{"dtype", compiler::data_type_name(t.dtype)}, {"shape", t.shape}};
}

compiler::TensorDesc desc_from(const json& j) {
  auto d = compiler::data_type_from_name(j.at("dtype").get<std::string>());
  if (!d) throw Error("unknown dtype " + j.at("dtype").dump());
  return {*d, j.at("shape").get<std::vector<int64_t>>()};
}

json tensors_json(const std::vector<compiler::TensorDesc>& ts) {
  json a = json::array();
  for (const auto& t : ts) a.push_back(desc_json(t));
  return a;
}

std::vector<compiler::TensorDesc> tensors_from(const json& j) {
  std::vector<compiler::TensorDesc> ts;
  for (const json& t : j) ts.push_back(desc_from(t));
  return ts;
}

json task_json(const Task& t) {
  json args = json::array();
  for (const ArgValue& a : t.args)
    args.push_back(a.scalar ? json{{"scalar", a.value}}
                            : json{{"region", int(a.region)}, {"offset", a.value}});
  json buffers = json::array();
  for (const TaskBuffer& b : t.buffers)
    buffers.push_back({{"region", int(b.region)},
                       {"offset", b.offset},
                       {"bytes", b.bytes},
                       {"written", b.written}});
  return {{"node", t.node},
          {"op_type", t.op_type},
          {"kernel", t.kernel},
          {"block_dim", t.block_dim},
          {"args", args},
          {"inputs", tensors_json(t.inputs)},
          {"outputs", tensors_json(t.outputs)},
          {"buffers", buffers}};
}

Region region_from(const json& j, const std::string& node) {
  const int r = j.at("region").get<int>();
  if (r != 0 && r != 1) throw Error(fmt::format("task of node '{}': region {}", node, r));
  return Region(r);
}

Task task_from(const json& j) {
  Task t;
  t.node = j.at("node").get<std::string>();
  t.op_type = j.at("op_type").get<std::string>();
  t.kernel = j.at("kernel").get<int>();
  t.block_dim = j.at("block_dim").get<int>();
  for (const json& a : j.at("args")) {
    ArgValue v;
    v.scalar = a.contains("scalar");
    v.value = v.scalar ? a.at("scalar").get<uint64_t>() : a.at("offset").get<uint64_t>();
    if (!v.scalar) v.region = region_from(a, t.node);
    t.args.push_back(v);
  }
  t.inputs = tensors_from(j.at("inputs"));
  t.outputs = tensors_from(j.at("outputs"));
  if (j.contains("buffers"))  // absent in an .om written before tasks recorded them
    for (const json& b : j.at("buffers")) {
      const Region r = region_from(b, t.node);
      // Absent in an .om written before tasks recorded it: an activation buffer may be written.
      const bool written =
          b.contains("written") ? b.at("written").get<bool>() : r == Region::kActivation;
      t.buffers.push_back(
          {r, b.at("offset").get<uint64_t>(), b.at("bytes").get<uint64_t>(), written});
    }
  return t;
}

json io_json(const std::vector<IoBinding>& ios) {
  json a = json::array();
  for (const IoBinding& b : ios)
    a.push_back({{"name", b.name},
                 {"tensor", desc_json(b.desc)},
                 {"region", int(b.region)},
                 {"offset", b.offset}});
  return a;
}

std::vector<IoBinding> io_from(const json& j) {
  std::vector<IoBinding> ios;
  for (const json& b : j)
    ios.push_back({b.at("name").get<std::string>(), desc_from(b.at("tensor")),
                   Region(b.at("region").get<int>() == 0 ? 0 : 1), b.at("offset").get<uint64_t>()});
  return ios;
}

// The region a task argument or binding points into must hold `bytes` at its offset.
void check_in_region(const OmModel& m, Region r, uint64_t offset, uint64_t bytes,
                     const std::string& what) {
  const uint64_t size = r == Region::kConstant ? m.constants.size() : m.activation_bytes;
  if (offset > size || bytes > size - offset)
    throw Error(
        fmt::format("{} lies outside its region ({} + {} > {} bytes)", what, offset, bytes, size));
}

void check_model(const OmModel& m) {
  for (const auto* list : {&m.init_tasks, &m.tasks})
    for (const Task& t : *list) {
      if (t.kernel < 0 || size_t(t.kernel) >= m.kernels.size())
        throw Error(fmt::format("task of node '{}' names kernel {} of {}", t.node, t.kernel,
                                m.kernels.size()));
      if (t.args.size() != m.kernels[t.kernel].arg_names.size())
        throw Error(fmt::format("task of node '{}' has {} arguments, its kernel {}", t.node,
                                t.args.size(), m.kernels[t.kernel].arg_names.size()));
      for (const ArgValue& a : t.args)
        if (!a.scalar)
          check_in_region(m, a.region, a.value, 0, "an argument of node '" + t.node + "'");
      for (const TaskBuffer& b : t.buffers)
        check_in_region(m, b.region, b.offset, b.bytes, "a buffer of node '" + t.node + "'");
    }
  for (const auto* list : {&m.inputs, &m.outputs})
    for (const IoBinding& b : *list)
      check_in_region(m, b.region, b.offset, b.desc.bytes(), "tensor '" + b.name + "'");
}

}  // namespace

uint64_t om_checksum(const uint8_t* payload, size_t bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < bytes; ++i) h = (h ^ payload[i]) * 0x100000001b3ull;
  return h;
}

std::vector<uint8_t> serialize_om(const OmModel& m) {
  std::vector<uint8_t> blobs;
  json kernels = json::array();
  for (const isa::Program& p : m.kernels) {
    const std::vector<uint8_t> k = isa::write_kernel(p);
    kernels.push_back({{"offset", blobs.size()}, {"bytes", k.size()}});
    blobs.insert(blobs.end(), k.begin(), k.end());
  }
  const uint64_t const_offset = blobs.size();
  blobs.insert(blobs.end(), m.constants.begin(), m.constants.end());
  json init = json::array(), tasks = json::array();
  for (const Task& t : m.init_tasks) init.push_back(task_json(t));
  for (const Task& t : m.tasks) tasks.push_back(task_json(t));
  const json header = {{"chip", m.chip_name},
                       {"chip_yaml", m.chip_yaml},
                       {"precision", m.precision},
                       {"inputs", io_json(m.inputs)},
                       {"outputs", io_json(m.outputs)},
                       {"kernels", kernels},
                       {"constants", {{"offset", const_offset}, {"bytes", m.constants.size()}}},
                       {"activation_bytes", m.activation_bytes},
                       {"init_tasks", init},
                       {"tasks", tasks},
                       {"info", m.info}};
  const std::string text = header.dump();
  std::vector<uint8_t> payload;
  put_u64(payload, text.size());
  payload.insert(payload.end(), text.begin(), text.end());
  payload.insert(payload.end(), blobs.begin(), blobs.end());
  std::vector<uint8_t> out(kOmMagic, kOmMagic + 8);
  put_u64(out, kOmVersion);  // u32 version, u32 0
  put_u64(out, payload.size());
  put_u64(out, om_checksum(payload.data(), payload.size()));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

OmModel parse_om(const std::vector<uint8_t>& bytes, const std::string& source) {
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kOmMagic, 8) != 0)
    throw Error(source + ": not an npusim offline model (.om): bad magic");
  if (bytes.size() < kPrefixBytes)
    throw Error(fmt::format("{}: truncated: {} bytes, the header alone is {}", source, bytes.size(),
                            kPrefixBytes));
  const uint64_t version = get_u64(bytes.data() + 8) & 0xffffffffu;
  if (version != kOmVersion)
    throw Error(
        fmt::format("{}: format version {}, this npusim reads version {} (compile the "
                    "model again)",
                    source, version, kOmVersion));
  const uint64_t size = get_u64(bytes.data() + 16);
  if (size != bytes.size() - kPrefixBytes)
    throw Error(
        fmt::format("{}: truncated or padded: the header announces {} payload bytes, the "
                    "file holds {}",
                    source, size, bytes.size() - kPrefixBytes));
  const uint8_t* payload = bytes.data() + kPrefixBytes;
  if (om_checksum(payload, size) != get_u64(bytes.data() + 24))
    throw Error(source + ": corrupt: the checksum does not match the contents");
  try {
    if (size < 8) throw Error("no header size: the payload is shorter than 8 bytes");
    const uint64_t hsize = get_u64(payload);
    if (hsize > size - 8) throw Error("header size out of range");
    const json h = json::parse(payload + 8, payload + 8 + hsize);
    const uint8_t* blobs = payload + 8 + hsize;
    const uint64_t blob_bytes = size - 8 - hsize;
    auto blob = [&](const json& j) {
      const uint64_t off = j.at("offset").get<uint64_t>(), n = j.at("bytes").get<uint64_t>();
      if (off > blob_bytes || n > blob_bytes - off) throw Error("a blob lies outside the file");
      return std::vector<uint8_t>(blobs + off, blobs + off + n);
    };
    OmModel m;
    m.chip_name = h.at("chip").get<std::string>();
    m.chip_yaml = h.at("chip_yaml").get<std::string>();
    m.precision = h.at("precision").get<std::string>();
    m.inputs = io_from(h.at("inputs"));
    m.outputs = io_from(h.at("outputs"));
    for (const json& k : h.at("kernels"))
      m.kernels.push_back(
          isa::read_kernel(blob(k), fmt::format("{} kernel {}", source, m.kernels.size())));
    m.constants = blob(h.at("constants"));
    m.activation_bytes = h.at("activation_bytes").get<uint64_t>();
    for (const json& t : h.at("init_tasks")) m.init_tasks.push_back(task_from(t));
    for (const json& t : h.at("tasks")) m.tasks.push_back(task_from(t));
    m.info = h.at("info");
    check_model(m);
    return m;
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}: malformed header: {}", source, e.what()));
  } catch (const IsaError& e) {
    throw Error(fmt::format("{}: malformed kernel: {}", source, e.what()));
  } catch (const Error& e) {
    if (std::string(e.what()).rfind(source, 0) == 0) throw;
    throw Error(fmt::format("{}: malformed: {}", source, e.what()));
  }
}

void write_om_file(const OmModel& m, const std::string& path) {
  const std::vector<uint8_t> bytes = serialize_om(m);
  std::ofstream out(path, std::ios::binary);
  if (!out) throw Error("cannot write '" + path + "'");
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!out) throw Error("cannot write '" + path + "'");
}

OmModel read_om_file(const std::string& path) {
  const std::string s = read_input_file(path, "offline model", kMaxOmFileBytes);
  return parse_om(std::vector<uint8_t>(s.begin(), s.end()), path);
}

}  // namespace npusim::graph
