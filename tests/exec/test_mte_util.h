// Test scaffolding for the MTE / cube / FIXPIPE tests: one core's buffers and a device memory on
// the unit-test chip, instructions built from named operands, and independent reference
// conversions (GCC _Float16 for fp16, bf16 rounded by hand).
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <initializer_list>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "sim/exec/exec.h"
#include "tests/common/test_chip.h"

namespace npusim::test {

// A chip, one core of its first core kind, and 64 MiB of device memory.
class ExecBench {
 public:
  explicit ExecBench(ChipConfig c = coupled_test_chip())
      : cfg(std::move(c)),
        local(cfg.core_kinds.at(0)),
        gm(64ull << 20),
        ctx{cfg, cfg.core_kinds.at(0), local, gm} {}

  // An issued instruction with the named operands set (all others 0). Unknown names throw.
  IssuedOp& op(isa::Opcode code,
                     std::initializer_list<std::pair<const char*, int64_t>> operands) {
    auto& insn = m_insns.emplace_back();
    insn.op = code;
    auto& issued = m_ops.emplace_back();
    issued.insn = &insn;
    for (const auto& [name, value] : operands) {
      int i = isa::field_index(code, name);
      if (i < 0) throw std::invalid_argument(std::string("no operand ") + name);
      issued.v[i] = value;
    }
    return issued;
  }

  // plan() then execute(), as the core does in a functional run.
  ExecCost run(const IssuedOp& o) {
    ExecCost c = plan(o, ctx);
    execute(o, ctx);
    return c;
  }
  ExecCost run(isa::Opcode code, std::initializer_list<std::pair<const char*, int64_t>> operands) {
    return run(op(code, operands));
  }

  template <typename T>
  void put_gm(uint64_t addr, const std::vector<T>& v) {
    gm.write(addr, v.data(), v.size() * sizeof(T));
  }
  template <typename T>
  std::vector<T> get_gm(uint64_t addr, size_t count) {
    std::vector<T> v(count);
    gm.read(addr, v.data(), count * sizeof(T));
    return v;
  }
  template <typename T>
  void put_local(isa::Buf b, uint64_t addr, const std::vector<T>& v) {
    std::memcpy(local.at(b, addr, v.size() * sizeof(T)), v.data(), v.size() * sizeof(T));
  }
  template <typename T>
  std::vector<T> get_local(isa::Buf b, uint64_t addr, size_t count) {
    std::vector<T> v(count);
    std::memcpy(v.data(), local.at(b, addr, count * sizeof(T)), count * sizeof(T));
    return v;
  }

  ChipConfig cfg;
  CoreMemory local;
  DeviceMemory gm;
  ExecContext ctx;

 private:
  std::deque<isa::Instruction> m_insns;
  std::deque<IssuedOp> m_ops;
};

inline int64_t dt(isa::Dtype t) { return static_cast<int64_t>(t); }
inline int64_t bf(isa::Buf b) { return static_cast<int64_t>(b); }

inline uint32_t float_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
inline float bits_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

// fp16 through the compiler's own IEEE binary16 type.
inline uint16_t ref_f32_to_f16(float f) {
  _Float16 h = static_cast<_Float16>(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
inline float ref_f16_to_f32(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<float>(h);
}
// bf16: the upper half of fp32, rounded to nearest even (finite inputs only in these tests).
inline uint16_t ref_f32_to_bf16(float f) {
  uint32_t b = float_bits(f);
  uint32_t rounding = 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>((b + rounding) >> 16);
}
inline float ref_bf16_to_f32(uint16_t b) { return bits_float(uint32_t(b) << 16); }

// Reproducible random values.
class Rand {
 public:
  explicit Rand(uint32_t seed) : m_gen(seed) {}
  float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(m_gen); }
  int integer(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(m_gen); }

 private:
  std::mt19937 m_gen;
};

}  // namespace npusim::test
