#include "tools/device_buffers.h"

#include <algorithm>
#include <cstdint>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "adapter/compiler/op_desc.h"
#include "common/error.h"
#include "isa/disassembler.h"

namespace npusim::cli {

DeviceArena::DeviceArena(Simulator& sim)
    : m_sim(sim),
      m_allocator(std::make_shared<rt::HbmAllocator>(
          kBase, sim.gm().capacity(),
          // rt::Device's alignment: no two blocks share an L2 line.
          std::max<uint64_t>(rt::HbmAllocator::kAlignment, sim.config().l2_line_bytes))),
      m_tensor_block{m_allocator->alignment(), compiler::kDeviceBufferAlign} {}

uint64_t DeviceArena::allocate(uint64_t bytes, const std::string& what) {
  uint64_t addr = 0;
  const rt::Status st = m_allocator->allocate(std::max<uint64_t>(bytes, 1), &addr);
  if (!st.ok())
    throw Error(fmt::format("{}: {} bytes do not fit in the device memory of {} bytes ({})", what,
                            bytes, m_sim.gm().capacity(), st.message()));
  return addr;
}

uint64_t DeviceArena::allocate_tensor(uint64_t bytes, const std::string& what) {
  return m_tensor_block.tensor_at(allocate(m_tensor_block.block_bytes(bytes), what));
}

GmBlockLookup DeviceArena::blocks() const {
  return [allocator = m_allocator](uint64_t addr, uint64_t* start, uint64_t* bytes) {
    return allocator->block_of(addr, start, bytes);
  };
}

KernelLaunch DeviceArena::launch(const isa::Program& program, std::vector<uint64_t> args,
                                 int block_dim) const {
  KernelLaunch l;
  l.program = &program;
  l.args = std::move(args);
  l.block_dim = block_dim;
  l.gm_blocks = blocks();
  return l;
}

uint64_t DeviceArena::upload(const NpyArray& a, const std::string& what) {
  uint64_t addr = allocate(a.data.size(), what);
  if (!a.data.empty()) m_hdc_us += m_sim.copy_host_to_device(addr, a.data.data(), a.data.size()).time_us;
  return addr;
}

void DeviceArena::download(uint64_t addr, NpyArray& a) {
  a.data.resize(static_cast<size_t>(a.elements()) * a.item_size());
  if (!a.data.empty()) m_hdc_us += m_sim.copy_device_to_host(a.data.data(), addr, a.data.size()).time_us;
}

TensorSpec parse_tensor_spec(const std::string& spec, const std::string& where) {
  auto colon = spec.find(':');
  if (colon == std::string::npos)
    throw Error(fmt::format("{}: expected DTYPE:SHAPE (e.g. f16:256x256), got '{}'", where, spec));
  std::string dt = spec.substr(0, colon), shape = spec.substr(colon + 1);
  auto dtype = isa::dtype_from_name(dt);
  if (!dtype) throw Error(fmt::format("{}: unknown dtype '{}'", where, dt));
  TensorSpec t;
  t.dtype = *dtype;
  size_t pos = 0;
  while (pos <= shape.size()) {
    size_t x = shape.find('x', pos);
    std::string dim = shape.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    try {
      size_t used = 0;
      long long v = std::stoll(dim, &used);
      if (used != dim.size() || v < 0) throw std::invalid_argument(dim);
      t.shape.push_back(v);
    } catch (const std::exception&) {
      throw Error(fmt::format("{}: bad dimension '{}' in shape '{}'", where, dim, shape));
    }
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  return t;
}

NpyArray empty_array(const TensorSpec& t) {
  NpyArray a;
  a.dtype = npy_dtype(t.dtype);
  a.shape = t.shape;
  return a;
}

namespace {

// numpy's name of a descr: "float16" for "f2"; the descr itself if unknown.
std::string numpy_name(const std::string& descr) {
  static const std::map<std::string, std::string> names = {
      {"f2", "float16"}, {"f4", "float32"}, {"f8", "float64"}, {"i1", "int8"},
      {"i2", "int16"},   {"i4", "int32"},   {"i8", "int64"},   {"u1", "uint8"},
      {"u2", "uint16"},  {"b1", "bool"}};
  auto it = names.find(descr);
  return it == names.end() ? descr : it->second;
}

// "float16 ('f2') data", and for bf16 "uint16 ('u2') data (bf16 bit patterns)".
std::string expected_npy(isa::Dtype t) {
  std::string d = npy_dtype(t);
  std::string s = fmt::format("{} ('{}') data", numpy_name(d), d);
  if (t == isa::Dtype::BF16) s += " (bf16 bit patterns)";
  return s;
}

// numpy's tuple notation: "(64, 32)", "(16,)", "()".
template <typename Dims, typename Text>
std::string tuple_text(const Dims& dims, Text text) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + text(i);
  return "(" + s + (dims.size() == 1 ? ",)" : ")");
}

std::string shape_tuple(const std::vector<int64_t>& shape) {
  return tuple_text(shape, [&](size_t i) { return std::to_string(shape[i]); });
}

// True if `shape` has the argument's rank and agrees with every known dimension (always true for
// an argument of any shape).
bool shape_agrees(const ArgShape& s, const std::vector<int64_t>& shape) {
  if (s.dims.empty()) return true;
  if (shape.size() != s.dims.size()) return false;
  for (size_t i = 0; i < shape.size(); ++i)
    if (s.dims[i] && *s.dims[i] != shape[i]) return false;
  return true;
}

}  // namespace

bool ArgShape::all_known() const {
  for (const auto& d : dims)
    if (!d) return false;
  return true;
}

std::string ArgShape::describe() const {
  if (!arg.typed()) return "untyped";
  std::string type = isa::arg_type_text(arg);
  if (dims.empty()) return type + " (any shape)";
  std::vector<std::string> known, unknown;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (isa::dim_literal(arg.dims[i])) continue;
    const std::string& name = arg.dims[i];
    auto& list = dims[i] ? known : unknown;
    std::string item = dims[i] ? fmt::format("{}={}", name, *dims[i]) : name;
    if (std::find(list.begin(), list.end(), item) == list.end()) list.push_back(item);
  }
  if (!known.empty()) type += fmt::format(" with {}", fmt::join(known, ", "));
  if (!unknown.empty()) type += fmt::format(" ({} not given with --arg)", fmt::join(unknown, ", "));
  return type;
}

std::string ArgShape::shape_text() const {
  return tuple_text(dims, [&](size_t i) {
    return dims[i] ? std::to_string(*dims[i]) : arg.dims[i];
  });
}

ArgShape resolve_arg_shape(const isa::ArgInfo& arg, const std::map<std::string, uint64_t>& scalars) {
  ArgShape s;
  s.arg = arg;
  for (const auto& d : arg.dims) {
    if (auto v = isa::dim_literal(d)) {
      s.dims.push_back(*v);
      continue;
    }
    auto it = scalars.find(d);
    if (it == scalars.end()) {
      s.dims.push_back(std::nullopt);
      continue;
    }
    if (it->second > uint64_t(INT64_MAX))
      throw Error(fmt::format("--arg {}={}: too large for a dimension of argument '{}'", d,
                              it->second, arg.name));
    s.dims.push_back(static_cast<int64_t>(it->second));
  }
  return s;
}

void check_input(const ArgShape& s, const NpyArray& a, const std::string& file,
                 const std::string& where) {
  if (!s.arg.typed()) return;
  std::string want = npy_dtype(s.arg.dtype);
  if (a.dtype != want)
    throw Error(fmt::format("{}: argument '{}' is {} and needs {}, but {} holds {} ('{}')",
                            where, s.arg.name, s.describe(), expected_npy(s.arg.dtype), file,
                            numpy_name(a.dtype), a.dtype));
  if (!shape_agrees(s, a.shape))
    throw Error(fmt::format("{}: argument '{}' is {} and needs shape {}, but {} has shape {}",
                            where, s.arg.name, s.describe(), s.shape_text(), file,
                            shape_tuple(a.shape)));
}

NpyArray output_array(const ArgShape& s, const std::string& spec, const std::string& file,
                      const std::string& where) {
  TensorSpec t;
  if (!spec.empty()) {
    t = parse_tensor_spec(spec, where);
    if (s.arg.typed() && t.dtype != s.arg.dtype)
      throw Error(fmt::format("{}: argument '{}' is {}, but the spec says {}", where, s.arg.name,
                              s.describe(), isa::dtype_name(t.dtype)));
    if (s.arg.typed() && !shape_agrees(s, t.shape))
      throw Error(fmt::format("{}: argument '{}' is {} and needs shape {}, but the spec says {}",
                              where, s.arg.name, s.describe(), s.shape_text(),
                              shape_tuple(t.shape)));
  } else if (!s.arg.typed()) {
    throw Error(fmt::format("{}: argument '{}' is untyped: give the element type and shape as "
                            "{}={}:DTYPE:SHAPE (e.g. f16:64x64)",
                            where, s.arg.name, s.arg.name, file));
  } else if (s.dims.empty() || !s.all_known()) {
    throw Error(fmt::format("{}: argument '{}' is {}: give the shape as {}={}:{}:SHAPE{}", where,
                            s.arg.name, s.describe(), s.arg.name, file,
                            isa::dtype_name(s.arg.dtype),
                            s.dims.empty() ? "" : " or the missing dimensions with --arg"));
  } else {
    t.dtype = s.arg.dtype;
    for (const auto& d : s.dims) t.shape.push_back(*d);
  }
  // The byte size must be representable (the arena then checks it fits the device).
  uint64_t bytes = static_cast<uint64_t>(isa::dtype_size(t.dtype));
  for (int64_t d : t.shape)
    if (__builtin_mul_overflow(bytes, static_cast<uint64_t>(d), &bytes))
      throw Error(fmt::format("{}: shape {} is too large", where, shape_tuple(t.shape)));
  return empty_array(t);
}

}  // namespace npusim::cli
