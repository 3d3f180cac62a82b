// Reading user input files (common/input_file.h): only regular files of bounded size, refused
// with an error naming the file, and the readers that go through it (.npy, assembly, binary
// kernels). A reader that regressed to reading /dev/zero would run the host out of memory, and
// one that opened a FIFO without O_NONBLOCK would wait forever: an alarm ends the test run
// instead (SIGALRM's default action terminates the process, which fails the test).
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "common/error.h"
#include "common/input_file.h"
#include "common/npy.h"
#include "isa/assembler.h"
#include "isa/kernel_file.h"

using namespace npusim;
namespace fs = std::filesystem;

namespace {

// A fresh directory, removed at scope exit.
struct TempDir {
  fs::path dir;
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "npusim_input_XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  std::string operator/(const std::string& name) const { return (dir / name).string(); }
};

#if defined(__SANITIZE_ADDRESS__)
#define NPUSIM_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NPUSIM_ASAN 1
#endif
#endif

// Bounds a regressed reader: 20 s of wall time and 8 GiB of address space for this process
// (not under AddressSanitizer, whose shadow memory needs far more address space).
struct Guard {
  rlimit old{};
  Guard() {
    alarm(20);
#ifndef NPUSIM_ASAN
    getrlimit(RLIMIT_AS, &old);
    rlimit lim = old;
    lim.rlim_cur = std::min<rlim_t>(old.rlim_max, rlim_t{8} << 30);
    setrlimit(RLIMIT_AS, &lim);
#endif
  }
  ~Guard() {
    alarm(0);
#ifndef NPUSIM_ASAN
    setrlimit(RLIMIT_AS, &old);
#endif
  }
};

template <typename E = Error, typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

std::string read(const std::string& path, uint64_t max_bytes) {
  return read_input_file(path, "test file", max_bytes);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  f << text;
}

}  // namespace

TEST_CASE("input files: a regular file up to the limit is read whole") {
  TempDir tmp;
  const std::string text("a\0b\nlast", 9);
  write_file(tmp / "f", text);
  CHECK(read(tmp / "f", 1 << 20) == text);
  CHECK(read(tmp / "f", text.size()) == text);  // exactly at the limit
  write_file(tmp / "empty", "");
  CHECK(read(tmp / "empty", 0).empty());
  CHECK(error_of([&] { read(tmp / "f", text.size() - 1); }) ==
        tmp / "f" + ": test file is 9 bytes, more than the limit of 8 bytes");
  CHECK_THAT(error_of([&] { read(tmp / "absent", 100); }),
             Catch::StartsWith(tmp / "absent" + ": cannot open test file: ") &&
                 Catch::Contains("No such file"));
}

TEST_CASE("input files: devices, FIFOs and directories are refused without reading") {
  Guard guard;
  TempDir tmp;
  const std::string fifo = tmp / "fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  const uint64_t big = uint64_t{1} << 40;
  CHECK(error_of([&] { read("/dev/zero", big); }) ==
        "/dev/zero: test file is a character device, not a regular file");
  CHECK(error_of([&] { read("/dev/urandom", big); }) ==
        "/dev/urandom: test file is a character device, not a regular file");
  CHECK(error_of([&] { read(fifo, big); }) ==
        fifo + ": test file is a FIFO (named pipe), not a regular file");
  CHECK(error_of([&] { read(tmp.dir.string(), big); }) ==
        tmp.dir.string() + ": test file is a directory, not a regular file");
}

TEST_CASE("input files: a file larger than it claims is cut off at the limit") {
  Guard guard;
  // /proc files are regular files whose size reads as 0; their contents are longer than 16 B.
  REQUIRE(fs::file_size("/proc/self/maps") == 0);
  CHECK(error_of([&] { read("/proc/self/maps", 16); }) ==
        "/proc/self/maps: test file holds more than the limit of 16 bytes");
  CHECK(read("/proc/self/maps", 1 << 24).size() > 16);
}

TEST_CASE("input files: .npy, assembly and binary kernel readers go through the checks") {
  Guard guard;
  TempDir tmp;
  const std::string fifo = tmp / "fifo";
  REQUIRE(mkfifo(fifo.c_str(), 0600) == 0);
  for (const std::string& path : {std::string("/dev/zero"), std::string("/dev/urandom"), fifo,
                                  tmp.dir.string()}) {
    INFO(path);
    CHECK_THAT(error_of([&] { read_npy(path); }),
               Catch::StartsWith(path + ": npy file is ") &&
                   Catch::EndsWith("not a regular file"));
    CHECK_THAT(error_of<IsaError>([&] { isa::assemble_file(path); }),
               Catch::StartsWith(path + ": assembly file is ") &&
                   Catch::EndsWith("not a regular file"));
    CHECK_THAT(error_of<IsaError>([&] { isa::load_program_file(path); }),
               Catch::StartsWith(path + ": kernel file is ") &&
                   Catch::EndsWith("not a regular file"));
    CHECK_THAT(error_of<IsaError>([&] { isa::read_kernel_file(path); }),
               Catch::StartsWith(path + ": kernel file is ") &&
                   Catch::EndsWith("not a regular file"));
  }
  // Sparse files one byte over each reader's limit: refused from their size, nothing read.
  const std::string npy = tmp / "huge.npy", kernel = tmp / "huge.s";
  write_file(npy, "");
  write_file(kernel, "");
  fs::resize_file(npy, kMaxNpyFileBytes + 1);
  fs::resize_file(kernel, kMaxKernelFileBytes + 1);
  CHECK(error_of([&] { read_npy(npy); }) ==
        fmt::format("{}: npy file is {} bytes, more than the limit of {} bytes", npy,
                    kMaxNpyFileBytes + 1, kMaxNpyFileBytes));
  CHECK(error_of<IsaError>([&] { isa::assemble_file(kernel); }) ==
        fmt::format("{}: assembly file is {} bytes, more than the limit of {} bytes", kernel,
                    kMaxKernelFileBytes + 1, kMaxKernelFileBytes));
  CHECK_THAT(error_of<IsaError>([&] { isa::load_program_file(kernel); }),
             Catch::StartsWith(kernel + ": kernel file is "));
}
