// .npy reading and writing; the format is described in npy.h.
#include "common/npy.h"

#include <cctype>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include "common/error.h"
#include "common/input_file.h"

namespace npusim {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;  // data starts at a multiple of this many bytes

struct DtypeInfo {
  const char* descr;
  int size;
  std::optional<isa::Dtype> isa;
};
const DtypeInfo kDtypes[] = {
    {"f2", 2, isa::Dtype::F16}, {"f4", 4, isa::Dtype::F32}, {"f8", 8, std::nullopt},
    {"i1", 1, isa::Dtype::S8},  {"i2", 2, isa::Dtype::S16}, {"i4", 4, isa::Dtype::S32},
    {"i8", 8, isa::Dtype::S64}, {"u1", 1, isa::Dtype::U8},  {"u2", 2, isa::Dtype::U16},
    {"b1", 1, std::nullopt},
};

const DtypeInfo* find_dtype(std::string_view descr) {
  for (const auto& d : kDtypes)
    if (descr == d.descr) return &d;
  return nullptr;
}

std::string supported_list() {
  std::string s;
  for (const auto& d : kDtypes) s += (s.empty() ? "" : ", ") + std::string(d.descr);
  return s;
}

// A parser for the header's Python dict literal, e.g.
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& source)
      : m_text(text), m_source(source) {}

  void parse(std::string& descr, bool& fortran, std::vector<int64_t>& shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    expect('{');
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        descr = string_literal();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        have_fortran = true;
      } else if (key == "shape") {
        shape = tuple();
        have_shape = true;
      } else {
        fail(fmt::format("unexpected header key '{}'", key));
      }
      skip_space();
      if (peek() == ',') ++m_pos;
    }
    ++m_pos;
    if (!have_descr || !have_fortran || !have_shape)
      fail(fmt::format("header lacks '{}'", !have_descr     ? "descr"
                                            : !have_fortran ? "fortran_order"
                                                            : "shape"));
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw Error(fmt::format("{}: malformed npy header: {} (header: {})", m_source, what,
                            std::string(m_text)));
  }
  void skip_space() {
    while (m_pos < m_text.size() && std::isspace(static_cast<unsigned char>(m_text[m_pos])))
      ++m_pos;
  }
  char peek() {
    if (m_pos >= m_text.size()) fail("unexpected end");
    return m_text[m_pos];
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(fmt::format("expected '{}' at offset {}", c, m_pos));
    ++m_pos;
  }
  std::string string_literal() {
    skip_space();
    char quote = peek();
    if (quote != '\'' && quote != '"') fail(fmt::format("expected a string at offset {}", m_pos));
    size_t end = m_text.find(quote, m_pos + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string s(m_text.substr(m_pos + 1, end - m_pos - 1));
    m_pos = end + 1;
    return s;
  }
  bool boolean() {
    skip_space();
    for (auto [word, value] : {std::pair{"True", true}, {"False", false}}) {
      std::string_view w(word);
      if (m_text.substr(m_pos, w.size()) == w) {
        m_pos += w.size();
        return value;
      }
    }
    fail(fmt::format("expected True or False at offset {}", m_pos));
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> dims;
    expect('(');
    for (;;) {
      skip_space();
      if (peek() == ')') break;
      if (!std::isdigit(static_cast<unsigned char>(peek())))
        fail(fmt::format("expected a non-negative dimension at offset {}", m_pos));
      int64_t v = 0;
      while (m_pos < m_text.size() && std::isdigit(static_cast<unsigned char>(m_text[m_pos]))) {
        int digit = m_text[m_pos++] - '0';
        if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) fail("dimension too large");
        v = v * 10 + digit;
      }
      if (m_pos < m_text.size() && m_text[m_pos] == 'L') ++m_pos;  // Python 2 long suffix
      dims.push_back(v);
      skip_space();
      if (peek() == ',') ++m_pos;
    }
    ++m_pos;
    return dims;
  }

  std::string_view m_text;
  const std::string& m_source;
  size_t m_pos = 0;
};

uint64_t read_le(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = v << 8 | p[i];
  return v;
}

// Elements of `shape`, or -1 if the byte count would overflow.
int64_t checked_elements(const std::vector<int64_t>& shape, int item_size) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / item_size / d) return -1;
    n *= d;
  }
  return n;
}

}  // namespace

int64_t NpyArray::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int NpyArray::item_size() const {
  const DtypeInfo* d = find_dtype(dtype);
  if (!d)
    throw Error(fmt::format("unsupported npy dtype '{}' (supported: {})", dtype, supported_list()));
  return d->size;
}

std::optional<isa::Dtype> isa_dtype_of_npy(std::string_view descr) {
  const DtypeInfo* d = find_dtype(descr);
  return d ? d->isa : std::nullopt;
}

std::string npy_dtype(isa::Dtype t) {
  if (t == isa::Dtype::BF16) return "u2";  // raw bf16 bits
  for (const auto& d : kDtypes)
    if (d.isa == t) return d.descr;
  throw Error(fmt::format("isa dtype '{}' has no npy dtype", isa::dtype_name(t)));
}

NpyArray parse_npy(const std::vector<uint8_t>& bytes, const std::string& source) {
  auto fail = [&](const std::string& what) -> Error {
    return Error(fmt::format("{}: {}", source, what));
  };
  if (bytes.size() < kMagicLen + 2 || std::string_view(reinterpret_cast<const char*>(bytes.data()),
                                                       kMagicLen) != kMagic)
    throw fail("not an npy file (bad magic; expected \"\\x93NUMPY\")");
  const int major = bytes[kMagicLen], minor = bytes[kMagicLen + 1];
  if ((major != 1 && major != 2) || minor != 0)
    throw fail(fmt::format("unsupported npy format version {}.{} (supported: 1.0, 2.0)", major,
                           minor));
  const int len_bytes = major == 1 ? 2 : 4;
  const size_t prefix = kMagicLen + 2 + len_bytes;
  if (bytes.size() < prefix) throw fail("truncated npy header");
  const uint64_t header_len = read_le(bytes.data() + kMagicLen + 2, len_bytes);
  if (bytes.size() < prefix + header_len)
    throw fail(fmt::format("truncated npy header: {} header bytes announced, {} present",
                           header_len, bytes.size() - prefix));

  std::string descr;
  bool fortran = false;
  NpyArray a;
  HeaderParser(std::string_view(reinterpret_cast<const char*>(bytes.data()) + prefix, header_len),
               source)
      .parse(descr, fortran, a.shape);

  if (descr.empty()) throw fail("empty dtype descr");
  const char order = descr[0];
  if (order == '>')
    throw fail(fmt::format("big-endian data ('{}') is not supported; save little-endian, e.g. "
                           "a.astype(a.dtype.newbyteorder('<'))",
                           descr));
  if (order != '<' && order != '|')
    throw fail(fmt::format("dtype '{}' has no byte order '<' or '|'", descr));
  a.dtype = descr.substr(1);
  const DtypeInfo* info = find_dtype(a.dtype);
  if (!info)
    throw fail(fmt::format("unsupported dtype '{}' (supported: {})", descr, supported_list()));
  if (order == '|' && info->size != 1)
    throw fail(fmt::format("dtype '{}': a multi-byte type needs a byte order", descr));
  if (fortran)
    throw fail("fortran_order True (column-major) arrays are not supported; save a C-order "
               "array, e.g. np.ascontiguousarray(a)");

  const int64_t n = checked_elements(a.shape, info->size);
  if (n < 0) throw fail("shape too large");
  const uint64_t want = static_cast<uint64_t>(n) * info->size;
  const uint64_t have = bytes.size() - prefix - header_len;
  if (have < want)
    throw fail(fmt::format("truncated data: shape needs {} bytes, file has {}", want, have));
  if (have > want)
    throw fail(fmt::format("{} unexpected bytes after the {} data bytes", have - want, want));
  a.data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(prefix + header_len), bytes.end());
  return a;
}

std::vector<uint8_t> serialize_npy(const NpyArray& a) {
  const DtypeInfo* info = find_dtype(a.dtype);
  if (!info)
    throw Error(
        fmt::format("unsupported npy dtype '{}' (supported: {})", a.dtype, supported_list()));
  const int64_t n = checked_elements(a.shape, info->size);
  if (n < 0) throw Error("npy array has a negative or too large shape");
  if (a.data.size() != static_cast<uint64_t>(n) * info->size)
    throw Error(fmt::format("npy array: its shape holds {} '{}' elements = {} bytes, but data "
                            "has {}",
                            n, a.dtype, n * info->size, a.data.size()));

  std::string shape = "(";
  for (size_t i = 0; i < a.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(a.shape[i]);
  shape += a.shape.size() == 1 ? ",)" : ")";
  std::string header = fmt::format("{{'descr': '{}{}', 'fortran_order': False, 'shape': {}, }}",
                                   info->size == 1 ? '|' : '<', a.dtype, shape);
  // Version 1.0 stores the header length in 2 bytes; longer headers need 2.0 (4 bytes).
  int len_bytes = 2;
  auto padded = [&] {
    size_t unpadded = kMagicLen + 2 + len_bytes + header.size() + 1;  // +1: the final '\n'
    return header.size() + (kAlign - unpadded % kAlign) % kAlign + 1;
  };
  if (padded() > 0xffff) len_bytes = 4;
  const size_t header_len = padded();
  header.append(header_len - header.size() - 1, ' ');
  header += '\n';

  std::vector<uint8_t> out(kMagic, kMagic + kMagicLen);
  out.push_back(len_bytes == 2 ? 1 : 2);
  out.push_back(0);
  for (int i = 0; i < len_bytes; ++i) out.push_back(static_cast<uint8_t>(header_len >> (8 * i)));
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), a.data.begin(), a.data.end());
  return out;
}

NpyArray read_npy(const std::string& path) {
  const std::string text = read_input_file(path, "npy file", kMaxNpyFileBytes);
  return parse_npy(std::vector<uint8_t>(text.begin(), text.end()), path);
}

void write_npy(const std::string& path, const NpyArray& a) {
  std::vector<uint8_t> bytes;
  try {
    bytes = serialize_npy(a);
  } catch (const Error& e) {
    throw Error(fmt::format("{}: {}", path, e.what()));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(fmt::format("{}: cannot create npy file", path));
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw Error(fmt::format("{}: write error", path));
}

}  // namespace npusim
