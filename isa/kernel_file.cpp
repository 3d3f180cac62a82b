// Binary kernel format writer and reader (layout: docs/assembly.md, "Binary kernel format").
#include "isa/kernel_file.h"

#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "common/error.h"
#include "common/input_file.h"
#include "isa/assembler.h"

namespace npusim::isa {
namespace {

// Fixed string table entries; argument and label names follow.
constexpr uint32_t kKernelNameString = 0;
constexpr uint32_t kSourceNameString = 1;
constexpr size_t kWordBytes = 16;

class Writer {
 public:
  void u8(uint8_t v) { m_out.push_back(v); }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void bytes(const void* p, size_t n) {
    auto b = static_cast<const uint8_t*>(p);
    m_out.insert(m_out.end(), b, b + n);
  }
  std::vector<uint8_t> take() { return std::move(m_out); }

 private:
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) m_out.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  std::vector<uint8_t> m_out;
};

class Reader {
 public:
  Reader(const std::vector<uint8_t>& b, const std::string& name) : m_b(b), m_name(name) {}

  [[noreturn]] void fail(size_t offset, const std::string& what) const {
    throw IsaError(fmt::format("{}: byte offset {}: {}", m_name, offset, what));
  }
  size_t pos() const { return m_pos; }
  size_t left() const { return m_b.size() - m_pos; }
  // Fails unless n more bytes (for `what`) are present.
  void need(uint64_t n, const char* what) const {
    if (n > left())
      fail(m_pos, fmt::format("truncated: {} needs {} bytes, {} left", what, n, left()));
  }
  uint64_t le(int n, const char* what) {
    need(n, what);
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(m_b[m_pos + i]) << (8 * i);
    m_pos += n;
    return v;
  }
  uint8_t u8(const char* what) { return static_cast<uint8_t>(le(1, what)); }
  uint16_t u16(const char* what) { return static_cast<uint16_t>(le(2, what)); }
  uint32_t u32(const char* what) { return static_cast<uint32_t>(le(4, what)); }
  uint64_t u64(const char* what) { return le(8, what); }
  std::string str(size_t n, const char* what) {
    need(n, what);
    std::string s(reinterpret_cast<const char*>(m_b.data() + m_pos), n);
    m_pos += n;
    return s;
  }

 private:
  const std::vector<uint8_t>& m_b;
  const std::string& m_name;
  size_t m_pos = 0;
};

// Interns strings into the table in first-use order.
struct StringTable {
  std::vector<std::string> strings;
  std::map<std::string, uint32_t> index;
  uint32_t add(const std::string& s) {
    auto [it, inserted] = index.emplace(s, static_cast<uint32_t>(strings.size()));
    if (inserted) strings.push_back(s);
    return it->second;
  }
};

// Why dimension `dim` of argument `owner` is illegal among `args` (a dimension is a decimal
// literal or the name of an untyped argument), or nullopt.
std::optional<std::string> dim_problem(const std::vector<ArgInfo>& args, const ArgInfo& owner,
                                       const std::string& dim) {
  if (dim_literal(dim)) return std::nullopt;
  for (const ArgInfo& a : args)
    if (a.name == dim) {
      if (!a.typed()) return std::nullopt;
      return fmt::format("argument '{}': dimension '{}' names a tensor argument", owner.name,
                         dim);
    }
  return fmt::format("argument '{}': dimension '{}' is neither a decimal literal nor an argument",
                     owner.name, dim);
}

// The arguments of p as written: p.args, or all untyped if p.args is empty. Throws IsaError
// naming p.source if they disagree with p.arg_names or a dimension is illegal.
std::vector<ArgInfo> checked_args(const Program& p) {
  std::vector<ArgInfo> args;
  for (size_t i = 0; i < p.arg_names.size(); ++i) args.push_back(p.arg(i));
  if (!p.args.empty() && p.args.size() != p.arg_names.size())
    throw IsaError(fmt::format("{}: {} argument declarations for {} argument names", p.source,
                               p.args.size(), p.arg_names.size()));
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i].name != p.arg_names[i])
      throw IsaError(fmt::format("{}: argument {} is declared as '{}' but named '{}'", p.source,
                                 i, args[i].name, p.arg_names[i]));
    if (!args[i].typed() && !args[i].dims.empty())
      throw IsaError(fmt::format("{}: untyped argument '{}' has dimensions", p.source,
                                 args[i].name));
    if (args[i].dims.size() > 0xFFFF)
      throw IsaError(fmt::format("{}: argument '{}' has {} dimensions (at most 65535)", p.source,
                                 args[i].name, args[i].dims.size()));
    for (const auto& d : args[i].dims)
      if (auto why = dim_problem(args, args[i], d))
        throw IsaError(fmt::format("{}: {}", p.source, *why));
  }
  return args;
}

}  // namespace

std::vector<uint8_t> write_kernel(const Program& p) {
  const std::vector<ArgInfo> args = checked_args(p);
  StringTable strings;
  strings.strings = {p.name, p.source};  // fixed entries 0 and 1, even if equal
  for (const auto& a : p.arg_names) strings.add(a);
  for (const auto& a : args)
    for (const auto& d : a.dims) strings.add(d);
  for (const auto& s : p.sections)
    for (const auto& [name, at] : s.labels) strings.add(name);

  if (p.aiv_per_aic < 0 || p.aiv_per_aic > kMaxAivPerAic)
    throw IsaError(fmt::format("{}: aiv_per_aic {} is outside 0..{}", p.source, p.aiv_per_aic,
                               kMaxAivPerAic));
  Writer w;
  w.bytes(kKernelMagic, 4);
  // A program without a declared mix ratio is written as version 2, byte for byte as before.
  w.u16(p.aiv_per_aic != 0 ? kKernelVersion : kKernelVersionWithoutMixRatio);
  if (p.sections.size() > 0xFFFF)
    throw IsaError(fmt::format("{}: too many sections ({})", p.source, p.sections.size()));
  w.u16(static_cast<uint16_t>(p.sections.size()));
  w.u32(static_cast<uint32_t>(strings.strings.size()));
  w.u32(static_cast<uint32_t>(p.arg_names.size()));
  for (const auto& s : strings.strings) {
    w.u32(static_cast<uint32_t>(s.size()));
    w.bytes(s.data(), s.size());
  }
  for (const auto& a : p.arg_names) w.u32(strings.index.at(a));
  for (const auto& a : args) {
    w.u8(a.typed() ? static_cast<uint8_t>(a.dtype) : kUntypedArgCode);
    w.u8(0);
    w.u16(static_cast<uint16_t>(a.dims.size()));
    for (const auto& d : a.dims) w.u32(strings.index.at(d));
  }
  if (p.aiv_per_aic != 0) {
    w.u8(static_cast<uint8_t>(p.aiv_per_aic));
    w.u8(0), w.u8(0), w.u8(0);
  }
  for (const auto& s : p.sections) {
    w.u8(static_cast<uint8_t>(s.kind));
    w.u8(0), w.u8(0), w.u8(0);
    w.u32(static_cast<uint32_t>(s.code.size()));
    w.u32(static_cast<uint32_t>(s.labels.size()));
    for (const auto& in : s.code) {
      EncodedWord word;
      try {
        word = encode(in);
      } catch (const IsaError& e) {
        throw IsaError(fmt::format("{}:{}:{}: {}", p.source, in.src_line, in.src_col, e.what()));
      }
      w.u64(word.lo);
      w.u64(word.hi);
    }
    for (const auto& in : s.code) {
      w.u32(in.src_line);
      w.u32(in.src_col);
    }
    for (const auto& [name, at] : s.labels) {
      w.u32(strings.index.at(name));
      w.u32(at);
    }
  }
  return w.take();
}

namespace {

// Version 2's argument type table, one entry per argument of p (whose args hold the names):
// u8 type code, u8 zero, u16 rank, rank x u32 dimension string index.
template <typename StringAt>
void read_arg_types(Reader& r, Program& p, StringAt& string_at) {
  std::vector<std::vector<size_t>> dim_offsets(p.args.size());
  for (size_t i = 0; i < p.args.size(); ++i) {
    ArgInfo& a = p.args[i];
    size_t at = r.pos();
    uint8_t code = r.u8("argument type code");
    r.u8("argument type padding");
    uint16_t rank = r.u16("argument rank");
    if (code != kUntypedArgCode && code >= static_cast<uint8_t>(Dtype::NONE))
      r.fail(at, fmt::format("argument '{}': bad type code {} (0..{} data types, {} untyped)",
                             a.name, code, static_cast<int>(Dtype::NONE) - 1, kUntypedArgCode));
    if (code == kUntypedArgCode && rank != 0)
      r.fail(at + 2, fmt::format("argument '{}' is untyped but has {} dimensions", a.name, rank));
    if (code != kUntypedArgCode) a.dtype = static_cast<Dtype>(code);
    r.need(uint64_t(rank) * 4, "argument dimensions");
    for (uint16_t d = 0; d < rank; ++d) {
      dim_offsets[i].push_back(r.pos());
      a.dims.push_back(string_at("argument dimension string index"));
    }
  }
  // Dimensions may name any argument, so they are checked once all types are known.
  for (size_t i = 0; i < p.args.size(); ++i)
    for (size_t d = 0; d < p.args[i].dims.size(); ++d)
      if (auto why = dim_problem(p.args, p.args[i], p.args[i].dims[d]))
        r.fail(dim_offsets[i][d], *why);
}

}  // namespace

Program read_kernel(const std::vector<uint8_t>& bytes, const std::string& source_name) {
  Reader r(bytes, source_name);
  if (bytes.size() < 4 || std::memcmp(bytes.data(), kKernelMagic, 4) != 0) {
    std::string got;
    for (size_t i = 0; i < std::min<size_t>(4, bytes.size()); ++i)
      got += fmt::format("{:02x}", bytes[i]);
    r.fail(0, fmt::format("bad magic {} (expected \"NPUK\", 4e50554b): not a binary kernel",
                          got.empty() ? "(empty file)" : "0x" + got));
  }
  r.str(4, "magic");
  size_t at = r.pos();
  uint16_t version = r.u16("version");
  if (version < kKernelOldestVersion || version > kKernelVersion)
    r.fail(at, fmt::format("unsupported version {} (this reader supports {} to {})", version,
                           kKernelOldestVersion, kKernelVersion));
  uint16_t nsections = r.u16("section count");
  at = r.pos();
  uint32_t nstrings = r.u32("string count");
  if (nstrings < 2)
    r.fail(at, fmt::format("string count {} < 2 (kernel and source names)", nstrings));
  uint32_t nargs = r.u32("argument count");

  std::vector<std::string> strings;
  r.need(uint64_t(nstrings) * 4, "string table");  // at least a length per string
  strings.reserve(nstrings);
  for (uint32_t i = 0; i < nstrings; ++i) {
    uint32_t len = r.u32("string length");
    strings.push_back(r.str(len, "string"));
  }
  auto string_at = [&](const char* what) -> const std::string& {
    size_t where = r.pos();
    uint32_t i = r.u32(what);
    if (i >= strings.size())
      r.fail(where, fmt::format("{} {} is not in the string table of {} strings", what, i,
                                strings.size()));
    return strings[i];
  };

  Program p;
  p.name = strings[kKernelNameString];
  p.source = strings[kSourceNameString].empty() ? source_name : strings[kSourceNameString];
  r.need(uint64_t(nargs) * 4, "argument table");
  for (uint32_t i = 0; i < nargs; ++i) {
    at = r.pos();
    const std::string& name = string_at("argument name index");
    for (const auto& a : p.arg_names)
      if (a == name) r.fail(at, fmt::format("duplicate argument '{}'", name));
    p.arg_names.push_back(name);
    ArgInfo info;
    info.name = name;
    p.args.push_back(std::move(info));
  }
  if (version >= 2) read_arg_types(r, p, string_at);
  if (version >= 3) {
    at = r.pos();
    p.aiv_per_aic = r.u8("mix ratio (aiv per aic)");
    if (p.aiv_per_aic == 0)
      r.fail(at, "mix ratio 0: a version 3 file declares 1..255 vector cores per cube core");
    r.str(3, "mix ratio padding");
  }

  for (uint16_t s = 0; s < nsections; ++s) {
    Section sec;
    at = r.pos();
    uint8_t kind = r.u8("section core kind");
    if (kind > static_cast<uint8_t>(CoreKind::AICORE))
      r.fail(at, fmt::format("bad core kind {} in section {} (0 aic, 1 aiv, 2 aicore)", kind,
                             s));
    sec.kind = static_cast<CoreKind>(kind);
    if (p.find(sec.kind))
      r.fail(at, fmt::format("section {} appears twice", core_kind_name(sec.kind)));
    r.str(3, "section header padding");
    uint32_t ninsns = r.u32("instruction count");
    uint32_t nlabels = r.u32("label count");
    // Check the whole section is present before allocating for it.
    r.need(uint64_t(ninsns) * (kWordBytes + 8) + uint64_t(nlabels) * 8,
           "section body (words, line table, labels)");
    sec.code.resize(ninsns);
    for (uint32_t i = 0; i < ninsns; ++i) {
      at = r.pos();
      EncodedWord w;
      w.lo = r.u64("instruction word");
      w.hi = r.u64("instruction word");
      try {
        sec.code[i] = decode(w);
      } catch (const IsaError& e) {
        r.fail(at, fmt::format("section {} instruction {}: {}", core_kind_name(sec.kind), i,
                               e.what()));
      }
      if (auto why = illegal_operand(sec.code[i]))
        r.fail(at, fmt::format("section {} instruction {}: illegal operand: {}",
                               core_kind_name(sec.kind), i, *why));
    }
    for (uint32_t i = 0; i < ninsns; ++i) {
      sec.code[i].src_line = r.u32("line table");
      sec.code[i].src_col = r.u32("line table");
    }
    for (uint32_t i = 0; i < nlabels; ++i) {
      const std::string& name = string_at("label name index");
      at = r.pos();
      uint32_t index = r.u32("label instruction index");
      if (index > ninsns)
        r.fail(at, fmt::format("label '{}' at instruction {} is past the end of section {} "
                               "({} instructions)",
                               name, index, core_kind_name(sec.kind), ninsns));
      if (!sec.labels.emplace(name, index).second)
        r.fail(at - 4, fmt::format("duplicate label '{}' in section {}", name,
                                   core_kind_name(sec.kind)));
    }
    p.sections.push_back(std::move(sec));
  }
  if (r.left() != 0)
    r.fail(r.pos(), fmt::format("{} unexpected bytes after the last section", r.left()));
  return p;
}

void write_kernel_file(const Program& p, const std::string& path) {
  std::vector<uint8_t> bytes = write_kernel(p);
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw IsaError(fmt::format("{}: cannot open for writing", path));
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw IsaError(fmt::format("{}: error writing binary kernel", path));
}

namespace {
std::vector<uint8_t> read_bytes(const std::string& path) {
  const std::string text = read_input_file<IsaError>(path, "kernel file", kMaxKernelFileBytes);
  return std::vector<uint8_t>(text.begin(), text.end());
}
}  // namespace

Program read_kernel_file(const std::string& path) { return read_kernel(read_bytes(path), path); }

bool is_kernel_binary(const std::vector<uint8_t>& bytes) {
  return bytes.size() >= 4 && std::memcmp(bytes.data(), kKernelMagic, 4) == 0;
}

Program load_program_file(const std::string& path) {
  std::vector<uint8_t> bytes = read_bytes(path);
  if (is_kernel_binary(bytes)) return read_kernel(bytes, path);
  return assemble(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), path);
}

}  // namespace npusim::isa
