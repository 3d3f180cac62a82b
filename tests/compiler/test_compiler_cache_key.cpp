// The kernel cache key (compiler::kernel_cache_key) and the lowering switches it includes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <sstream>
#include <string>

#include "tests/compiler/compiler_test_util.h"

using namespace npusim;

namespace {

// The repository root (NPUSIM_SOURCE_DIR when ctest runs us, else derived from this file).
std::string source_dir() {
  if (const char* d = std::getenv("NPUSIM_SOURCE_DIR")) return d;
  const std::string f = __FILE__;  // <root>/tests/compiler/test_compiler_cache_key.cpp
  return f.substr(0, f.rfind("/tests/compiler/"));
}

// Sets (or, with nullopt, unsets) an environment variable for the scope, then restores it.
class ScopedEnv {
 public:
  ScopedEnv(std::string name, std::optional<std::string> value) : m_name(std::move(name)) {
    if (const char* old = std::getenv(m_name.c_str())) m_old = old;
    set(value);
  }
  ~ScopedEnv() { set(m_old); }
  void set(const std::optional<std::string>& value) {
    if (value)
      setenv(m_name.c_str(), value->c_str(), 1);
    else
      unsetenv(m_name.c_str());
  }

 private:
  std::string m_name;
  std::optional<std::string> m_old;
};

}  // namespace

TEST_CASE("the kernel cache key changes with a lowering switch, and back") {
  const ChipConfig& cfg = test::test_sim().config();
  const compiler::OpDesc op =
      test::make_op("Transpose", {{compiler::DataType::F32, {2, 511, 7, 127}}},
                    {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  const auto key = [&] {
    return compiler::kernel_cache_key(op, cfg, compiler::PrecisionMode::kAllowFp32ToFp16);
  };
  ScopedEnv cann("NPUSIM_TRANSPOSE_CANN", std::nullopt);
  const std::string unset = key();
  cann.set("0");
  const std::string off = key();
  cann.set("1");
  const std::string on = key();
  CHECK(off != unset);
  CHECK(on != unset);
  CHECK(on != off);
  CHECK(off.find("NPUSIM_TRANSPOSE_CANN=0") != std::string::npos);
  cann.set(std::nullopt);
  CHECK(key() == unset);
}

TEST_CASE("every NPUSIM_ variable the compiler's sources read is a lowering switch") {
  const std::vector<std::string>& switches = compiler::lowering_switches();
  const std::regex name("\"(NPUSIM_[A-Z0-9_]+)\"");
  size_t files = 0, names = 0;
  for (const auto& entry :
       std::filesystem::recursive_directory_iterator(source_dir() + "/adapter/compiler")) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".cpp" && ext != ".h")) continue;
    ++files;
    std::ifstream in(entry.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    for (std::sregex_iterator m(s.begin(), s.end(), name), end; m != end; ++m) {
      ++names;
      INFO(entry.path().string() << " reads " << (*m)[1]);
      CHECK(std::find(switches.begin(), switches.end(), (*m)[1].str()) != switches.end());
    }
  }
  CHECK(files > 10);
  CHECK(names >= switches.size());
}
