// .npy files: byte-exact headers per the format spec (numpy.lib.format), round trips of every
// supported dtype, the errors for files we do not accept, the numpy descr <-> ISA dtype mapping,
// and (only where python3 with numpy is installed) interoperability with numpy itself.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <sys/wait.h>

#include "common/error.h"
#include "common/npy.h"

using namespace npusim;
namespace fs = std::filesystem;

namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

// A file path in a fresh directory, removed with the directory at scope exit.
struct TempPath {
  fs::path dir;
  TempPath() {
    std::string tmpl = (fs::temp_directory_path() / "npusim_npy_XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
  }
  ~TempPath() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

// The message of the npusim::Error that f throws.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  FAIL("no npusim::Error thrown");
  return "";
}

// A well-formed version 1.0 file around `dict`, padded so the data starts at byte 128.
std::string v1_file(const std::string& dict, const std::string& data) {
  std::string header = dict;
  header.append(128 - 10 - dict.size() - 1, ' ');
  header += '\n';
  return std::string("\x93NUMPY\x01\x00", 8) + std::string("\x76\x00", 2) + header + data;
}

NpyArray parse(const std::string& file) { return parse_npy(bytes_of(file), "mem.npy"); }

}  // namespace

TEST_CASE("write_npy produces the header the npy spec prescribes") {
  // float32 [[1, -2, 0.5], [0, 3, -0.25]]: little-endian IEEE-754 bit patterns.
  const std::string data(
      "\x00\x00\x80\x3f" "\x00\x00\x00\xc0" "\x00\x00\x00\x3f"
      "\x00\x00\x00\x00" "\x00\x00\x40\x40" "\x00\x00\x80\xbe",
      24);
  NpyArray a{"f4", {2, 3}, std::vector<uint8_t>(data.begin(), data.end())};
  // Magic, version 1.0, header length 0x0076 = 118 (little-endian uint16), the dict, spaces and
  // '\n'; 10 + 118 = 128 bytes, a multiple of 64, so the data is aligned as the spec requires.
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const std::string expected = std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict +
                               std::string(58, ' ') + "\n" + data;
  REQUIRE(dict.size() == 59);  // 10 + 59 + 58 + 1 = 128
  CHECK(serialize_npy(a) == bytes_of(expected));

  // One-element tuples keep their comma; one-byte types use the '|' byte order.
  NpyArray b{"u1", {5}, {1, 2, 3, 4, 255}};
  const std::string dict_b = "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }";
  CHECK(serialize_npy(b) == bytes_of(std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict_b +
                                     std::string(128 - 10 - 57 - 1, ' ') + "\n" +
                                     "\x01\x02\x03\x04\xff"));

  // A 0-d array has shape () and one element.
  NpyArray c{"i2", {}, {0x34, 0x12}};
  CHECK(c.elements() == 1);
  const std::string dict_c = "{'descr': '<i2', 'fortran_order': False, 'shape': (), }";
  CHECK(serialize_npy(c) == bytes_of(std::string("\x93NUMPY\x01\x00\x76\x00", 10) + dict_c +
                                     std::string(128 - 10 - 55 - 1, ' ') + "\n\x34\x12"));

  // The data of the file written above reads back as the floats it encodes.
  NpyArray r = parse(expected);
  REQUIRE(r.data.size() == 24);
  float f[6];
  std::memcpy(f, r.data.data(), 24);
  CHECK(f[0] == 1.0f);
  CHECK(f[1] == -2.0f);
  CHECK(f[2] == 0.5f);
  CHECK(f[3] == 0.0f);
  CHECK(f[4] == 3.0f);
  CHECK(f[5] == -0.25f);
}

TEST_CASE("every supported dtype round-trips through a file") {
  TempPath tmp;
  struct Case {
    const char* dtype;
    int size;
    std::vector<int64_t> shape;
  };
  const Case cases[] = {{"f2", 2, {3, 4}}, {"f4", 4, {2, 3, 4}}, {"f8", 8, {7}},
                        {"i1", 1, {1, 1}}, {"i2", 2, {}},        {"i4", 4, {4, 0, 2}},
                        {"i8", 8, {2}},    {"u1", 1, {16}},      {"u2", 2, {1, 2, 3, 4, 5}},
                        {"b1", 1, {3}}};
  for (const auto& c : cases) {
    INFO("dtype " << c.dtype);
    NpyArray a{c.dtype, c.shape, {}};
    CHECK(a.item_size() == c.size);
    int64_t n = 1;
    for (int64_t d : c.shape) n *= d;
    CHECK(a.elements() == n);
    for (int64_t i = 0; i < n * c.size; ++i) a.data.push_back(static_cast<uint8_t>(i * 37 + 11));
    const std::string path = tmp / (std::string(c.dtype) + ".npy");
    write_npy(path, a);
    // The data starts at a multiple of 64 bytes.
    CHECK(fs::file_size(path) % 64 == static_cast<uintmax_t>(n * c.size) % 64);
    NpyArray r = read_npy(path);
    CHECK(r.dtype == a.dtype);
    CHECK(r.shape == a.shape);
    CHECK(r.data == a.data);
  }
}

TEST_CASE("fp16 data keeps its bits") {
  // Values written through GCC's _Float16, independent of the library's conversions.
  const _Float16 values[] = {_Float16(1.0f), _Float16(-0.333f), _Float16(65504.0f),
                             _Float16(6.1e-5f)};
  NpyArray a{"f2", {4}, std::vector<uint8_t>(sizeof values)};
  std::memcpy(a.data.data(), values, sizeof values);
  NpyArray r = parse_npy(serialize_npy(a), "mem.npy");
  _Float16 back[4];
  std::memcpy(back, r.data.data(), sizeof back);
  for (int i = 0; i < 4; ++i) CHECK(back[i] == values[i]);
}

TEST_CASE("read_npy accepts version 2.0 and any header key order and quoting") {
  // Version 2.0: 4-byte header length. Keys reordered, double quotes, no padding to 64.
  const std::string dict = "{\"shape\": (3,), \"fortran_order\": False, \"descr\": \"<i4\"}\n";
  std::string file = std::string("\x93NUMPY\x02\x00", 8);
  file += std::string(1, static_cast<char>(dict.size())) + std::string("\x00\x00\x00", 3);
  file += dict;
  file += std::string("\x01\x00\x00\x00\xfe\xff\xff\xff\x00\x00\x00\x80", 12);
  NpyArray a = parse(file);
  CHECK(a.dtype == "i4");
  CHECK(a.shape == std::vector<int64_t>{3});
  int32_t v[3];
  std::memcpy(v, a.data.data(), 12);
  CHECK(v[0] == 1);
  CHECK(v[1] == -2);
  CHECK(v[2] == INT32_MIN);

  // Python 2 style long dimensions ("3L") are accepted too.
  NpyArray b = parse(v1_file("{'descr': '<u2', 'fortran_order': False, 'shape': (2L, 1L), }",
                             std::string("\x01\x00\x02\x00", 4)));
  CHECK(b.shape == std::vector<int64_t>{2, 1});

  // A header longer than 65535 bytes makes the writer switch to version 2.0.
  NpyArray big{"u1", std::vector<int64_t>(25000, 1), {7}};
  std::vector<uint8_t> bytes = serialize_npy(big);
  CHECK(bytes[6] == 2);
  CHECK(parse_npy(bytes, "big.npy").shape == big.shape);
}

TEST_CASE("files we do not accept give an error naming the file and the problem") {
  const std::string f4 = std::string(8, '\0');  // two float32 zeros
  auto check = [](const std::string& msg, std::initializer_list<const char*> parts) {
    INFO(msg);
    for (const char* p : parts) CHECK(msg.find(p) != std::string::npos);
  };
  const std::string good = v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f4);
  REQUIRE_NOTHROW(parse(good));

  check(error_of([&] { parse("\x93NUMPZ" + good.substr(6)); }), {"mem.npy", "bad magic"});
  check(error_of([&] { parse("abc"); }), {"mem.npy", "bad magic"});
  check(error_of([&] {
          parse(v1_file("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", f4));
        }),
        {"mem.npy", "big-endian", "'>f4'"});
  check(error_of([&] {
          parse(v1_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", f4));
        }),
        {"mem.npy", "fortran_order"});
  check(error_of([&] { parse(good.substr(0, good.size() - 1)); }),
        {"mem.npy", "truncated data", "needs 8 bytes", "has 7"});
  check(error_of([&] { parse(good + "x"); }), {"mem.npy", "1 unexpected bytes"});
  check(error_of([&] { parse(good.substr(0, 40)); }), {"mem.npy", "truncated npy header"});
  check(error_of([&] { parse(good.substr(0, 9)); }), {"mem.npy", "truncated npy header"});
  std::string v3 = good;
  v3[6] = 3;
  check(error_of([&] { parse(v3); }), {"mem.npy", "version 3.0"});
  check(error_of([&] {
          parse(v1_file("{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", f4));
        }),
        {"mem.npy", "unsupported dtype '<c8'"});
  check(error_of([&] {
          parse(v1_file("{'descr': '<f4', 'fortran_order': False, }", f4));
        }),
        {"mem.npy", "lacks 'shape'"});
  check(error_of([&] {
          parse(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", f4));
        }),
        {"mem.npy", "dimension"});
  check(error_of([&] {
          parse(v1_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", f4));
        }),
        {"mem.npy", "unexpected header key 'x'"});

  TempPath tmp;
  check(error_of([&] { read_npy(tmp / "absent.npy"); }), {"absent.npy", "cannot open"});
  check(error_of([&] { write_npy(tmp / "bad.npy", NpyArray{"f4", {3}, {0, 0, 0, 0}}); }),
        {"bad.npy", "12 bytes", "has 4"});
  check(error_of([&] { write_npy(tmp / "bad.npy", NpyArray{"c8", {1}, {}}); }),
        {"bad.npy", "unsupported npy dtype 'c8'"});
  check(error_of([&] { write_npy(tmp / "no_dir/x.npy", NpyArray{"u1", {1}, {0}}); }),
        {"no_dir/x.npy", "cannot create"});
}

TEST_CASE("numpy descr <-> ISA dtype") {
  using isa::Dtype;
  const std::pair<const char*, Dtype> pairs[] = {{"f2", Dtype::F16}, {"f4", Dtype::F32},
                                                 {"i1", Dtype::S8},  {"i2", Dtype::S16},
                                                 {"i4", Dtype::S32}, {"i8", Dtype::S64},
                                                 {"u1", Dtype::U8},  {"u2", Dtype::U16}};
  for (auto [descr, t] : pairs) {
    INFO(descr);
    CHECK(isa_dtype_of_npy(descr) == t);
    CHECK(npy_dtype(t) == descr);
  }
  CHECK(npy_dtype(Dtype::BF16) == "u2");  // raw bf16 bits
  CHECK_FALSE(isa_dtype_of_npy("f8").has_value());
  CHECK_FALSE(isa_dtype_of_npy("b1").has_value());
  CHECK_FALSE(isa_dtype_of_npy("<f4").has_value());  // descrs without byte order only
  CHECK_THROWS_AS(npy_dtype(Dtype::NONE), Error);
}

TEST_CASE("numpy reads our files and we read numpy's (skipped without numpy)") {
  TempPath tmp;
  // Ours -> numpy: int16 [[0, -1, 2], [-3, 4, -5]] and a 0-d float32.
  NpyArray a{"i2", {2, 3}, {}};
  for (int16_t v : {0, -1, 2, -3, 4, -5}) {
    const auto u = static_cast<uint16_t>(v);
    a.data.push_back(static_cast<uint8_t>(u & 0xff));  // little-endian
    a.data.push_back(static_cast<uint8_t>(u >> 8));
  }
  write_npy(tmp / "ours.npy", a);
  NpyArray s{"f4", {}, {0x00, 0x00, 0xc0, 0x3f}};  // 1.5f
  write_npy(tmp / "scalar.npy", s);
  // numpy -> ours: float16 arange, a Fortran-order array and a big-endian array.
  const std::string script =
      "import sys\n"
      "try:\n"
      "    import numpy as np\n"
      "except ImportError:\n"
      "    sys.exit(77)\n"
      "d = sys.argv[1]\n"
      "a = np.load(d + '/ours.npy')\n"
      "assert a.dtype == np.int16 and a.shape == (2, 3), (a.dtype, a.shape)\n"
      "assert (a == np.array([[0, -1, 2], [-3, 4, -5]])).all(), a\n"
      "s = np.load(d + '/scalar.npy')\n"
      "assert s.shape == () and s.dtype == np.float32 and s == 1.5, s\n"
      "np.save(d + '/theirs.npy', (np.arange(24, dtype=np.float16) / 4).reshape(2, 3, 4))\n"
      "np.save(d + '/bool.npy', np.array([True, False, True]))\n"
      "np.save(d + '/fortran.npy', np.asfortranarray(np.ones((2, 3), np.float32)))\n"
      "np.save(d + '/big.npy', np.ones(3, '>f4'))\n";
  std::ofstream(tmp / "interop.py") << script;
  const int status = std::system(
      ("python3 " + (tmp / "interop.py") + " " + tmp.dir.string() + " 2>&1").c_str());
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (rc == 77 || rc == 127) {  // no numpy, or no python3
    WARN("python3 with numpy not found: numpy interoperability not checked");
    return;
  }
  REQUIRE(rc == 0);

  NpyArray t = read_npy(tmp / "theirs.npy");
  CHECK(t.dtype == "f2");
  CHECK(t.shape == std::vector<int64_t>{2, 3, 4});
  REQUIRE(t.data.size() == 48);
  for (int i = 0; i < 24; ++i) {
    _Float16 h;
    std::memcpy(&h, t.data.data() + 2 * i, 2);
    CHECK(static_cast<float>(h) == i / 4.0f);  // i/4 is exact in fp16 for i < 24
  }
  NpyArray b = read_npy(tmp / "bool.npy");
  CHECK(b.dtype == "b1");
  CHECK(b.data == std::vector<uint8_t>{1, 0, 1});
  CHECK(error_of([&] { read_npy(tmp / "fortran.npy"); }).find("fortran_order") !=
        std::string::npos);
  CHECK(error_of([&] { read_npy(tmp / "big.npy"); }).find("big-endian") != std::string::npos);
}
