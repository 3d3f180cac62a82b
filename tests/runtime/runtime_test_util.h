// Helpers shared by the host-runtime tests. Each test_runtime_*.cpp is its own executable that
// opens at most one device (SystemC elaborates once per process).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "adapter/runtime/device.h"
#include "isa/assembler.h"

namespace npusim::test {

// The repository root (NPUSIM_SOURCE_DIR when ctest runs us, else derived from this file).
inline std::string source_dir() {
  if (const char* d = std::getenv("NPUSIM_SOURCE_DIR")) return d;
  std::string f = __FILE__;  // <root>/tests/runtime/runtime_test_util.h
  return f.substr(0, f.rfind("/tests/runtime/"));
}

// The process's device on the tiny chip (opened on first use, default options).
inline std::shared_ptr<rt::Device> tiny_device() {
  static std::shared_ptr<rt::Device> dev = [] {
    std::shared_ptr<rt::Device> d;
    rt::Status st = rt::Device::open("tiny", {}, SimOptions{}, rt::RuntimeOptions{}, &d);
    if (!st.ok()) throw std::runtime_error("cannot open the tiny device: " + st.to_string());
    return d;
  }();
  return dev;
}

inline std::shared_ptr<const isa::Program> load_kernel(const std::string& repo_path) {
  return std::make_shared<const isa::Program>(isa::assemble_file(source_dir() + "/" + repo_path));
}

inline std::shared_ptr<const isa::Program> assemble_text(const std::string& text,
                                                         const std::string& name) {
  return std::make_shared<const isa::Program>(isa::assemble(text, name));
}

// A vector kernel that faults: it copies one 32-byte block from GM (argument src) to the UB
// address passed as argument ub; the verifier cannot see that address, the chip model faults
// on it when ub lies past the UB.
inline std::shared_ptr<const isa::Program> ub_overrun_kernel() {
  return assemble_text(R"(
.kernel ub_overrun
.arg ub
.arg src
.section aiv
    ldarg x1, ub
    ldarg x2, src
    copy_gm2ub x1, x2, 1, 1, 0, 0
    end
)", "ub_overrun.s");
}

// n random fp16 values (bit patterns) in [-8, 8), from a fixed seed.
inline std::vector<uint16_t> random_f16(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-8.0f, 8.0f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) {
    _Float16 h = static_cast<_Float16>(dist(gen));
    std::memcpy(&x, &h, 2);
  }
  return v;
}

// Element-wise fp16 sum with GCC's _Float16 (round to nearest even).
inline std::vector<uint16_t> reference_add_f16(const std::vector<uint16_t>& x,
                                               const std::vector<uint16_t>& y) {
  std::vector<uint16_t> z(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    _Float16 a, b;
    std::memcpy(&a, &x[i], 2);
    std::memcpy(&b, &y[i], 2);
    _Float16 c = static_cast<_Float16>(a + b);
    std::memcpy(&z[i], &c, 2);
  }
  return z;
}

}  // namespace npusim::test
