// Helpers for the vector-unit tests: a core's memory on the unit-test chip, an IssuedOp built
// from field names, and independent references for element addressing and fp16/bf16 rounding.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "isa/isa.h"
#include "sim/exec/exec.h"
#include "tests/common/test_chip.h"

namespace npusim::test {

// A V instruction with operand values set by field name.
class VecOp {
 public:
  VecOp(isa::Opcode op, std::initializer_list<std::pair<const char*, int64_t>> fields,
        VectorMask mask = {}) {
    m_insn.op = op;
    m_op.mask = mask;
    for (const auto& [name, value] : fields) set(name, value);
  }
  VecOp& set(const char* name, int64_t value) {
    int i = isa::field_index(m_insn.op, name);
    INFO(isa::describe(m_insn.op).mnemonic << " has no field " << name);
    REQUIRE(i >= 0);
    m_op.v[i] = value;
    return *this;
  }
  VecOp& mask(VectorMask m) {
    m_op.mask = m;
    return *this;
  }
  const IssuedOp& issued() {
    m_op.insn = &m_insn;
    return m_op;
  }

 private:
  isa::Instruction m_insn;
  IssuedOp m_op;
};

inline int64_t dt(isa::Dtype t) { return static_cast<int64_t>(t); }

inline VectorMask counter_mask(uint64_t n) {
  VectorMask m;
  m.counter_mode = true;
  m.count = n;
  return m;
}
inline VectorMask normal_mask(uint64_t hi, uint64_t lo) {
  VectorMask m;
  m.hi = hi;
  m.lo = lo;
  return m;
}
// Reference lane test of the brief's mask contract.
inline bool ref_lane_active(const VectorMask& m, uint64_t r, int lanes, int lane) {
  if (m.counter_mode) return r * lanes + lane < m.count;
  return lane < 64 ? (m.lo >> lane) & 1 : (m.hi >> (lane - 64)) & 1;
}
// Reference address of lane `lane` of repeat r (brief: base + r*rep*32 + b*blk*32 + e*size).
inline uint64_t ref_lane_addr(uint64_t base, int64_t blk, int64_t rep, int size, uint64_t r,
                              int lane) {
  int per_block = 32 / size;
  return base + r * rep * 32 + (lane / per_block) * blk * 32 + (lane % per_block) * size;
}

// One core of the unit-test chip and the context plan()/execute() need.
struct VecHarness {
  ChipConfig cfg = coupled_test_chip();
  CoreMemory mem{cfg.core_kinds[0]};
  DeviceMemory gm{1 << 20};
  ExecContext ctx{cfg, cfg.core_kinds[0], mem, gm};

  uint64_t ub_bytes() const { return mem.capacity(isa::Buf::UB); }
  uint8_t* ub(uint64_t addr = 0) { return mem.at(isa::Buf::UB, addr, 1); }
  template <class T>
  T get(uint64_t addr) {
    T v;
    std::memcpy(&v, mem.at(isa::Buf::UB, addr, sizeof(T)), sizeof(T));
    return v;
  }
  template <class T>
  void put(uint64_t addr, T v) {
    std::memcpy(mem.at(isa::Buf::UB, addr, sizeof(T)), &v, sizeof(T));
  }
  // Fills the whole UB with pseudo-random bytes (so untouched lanes are recognisable).
  void randomize(uint64_t seed) {
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    uint8_t* p = ub();
    for (uint64_t i = 0; i + 8 <= ub_bytes(); i += 8) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;  // xorshift64
      std::memcpy(p + i, &x, 8);
    }
  }
  std::vector<uint8_t> snapshot() { return std::vector<uint8_t>(ub(), ub() + ub_bytes()); }
  // Element of `size` bytes at addr, zero-extended.
  uint32_t get_elem(uint64_t addr, int size) {
    uint32_t v = 0;
    std::memcpy(&v, mem.at(isa::Buf::UB, addr, size), size);
    return v;
  }
  void put_elem(uint64_t addr, int size, uint32_t v) {
    std::memcpy(mem.at(isa::Buf::UB, addr, size), &v, size);
  }
  ExecCost run(VecOp& op) {
    ExecCost c = plan(op.issued(), ctx);
    execute(op.issued(), ctx);
    return c;
  }
};

// Independent fp16/bf16 references: GCC's _Float16 for fp16, hand rounding for bf16.
inline uint16_t ref_f16_bits(_Float16 h) {
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
inline _Float16 ref_f16(uint16_t bits) {
  _Float16 h;
  std::memcpy(&h, &bits, 2);
  return h;
}
inline uint32_t ref_f32_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}
inline float ref_f32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
// fp32 -> bf16 round to nearest even, by hand on the bit pattern (NaN handled by the caller).
inline uint16_t ref_bf16_round(float f) {
  uint32_t b = ref_f32_bits(f);
  uint32_t upper = b >> 16, rest = b & 0xffffu;
  if (rest > 0x8000u || (rest == 0x8000u && (upper & 1u))) ++upper;
  return static_cast<uint16_t>(upper);
}
inline float ref_bf16_value(uint16_t bits) { return ref_f32(static_cast<uint32_t>(bits) << 16); }

inline uint32_t elem_mask(int size) { return size == 4 ? 0xffffffffu : (1u << (8 * size)) - 1u; }
inline uint32_t element_from(const std::vector<uint8_t>& image, uint64_t addr, int size) {
  uint32_t v = 0;
  std::memcpy(&v, image.data() + addr, size);
  return v;
}
inline void element_to(std::vector<uint8_t>& image, uint64_t addr, int size, uint32_t v) {
  std::memcpy(image.data() + addr, &v, size);
}

// Float element types as the reference sees them: value of the bits, and a float result
// rounded to the type (fp16 through _Float16, bf16 by hand, NaN as the canonical NaN).
inline float ref_float_of(isa::Dtype t, uint32_t bits) {
  switch (t) {
    case isa::Dtype::F32: return ref_f32(bits);
    case isa::Dtype::F16: return static_cast<float>(ref_f16(static_cast<uint16_t>(bits)));
    default: return ref_bf16_value(static_cast<uint16_t>(bits));
  }
}
inline uint32_t ref_float_bits(isa::Dtype t, float v) {
  switch (t) {
    case isa::Dtype::F32: return std::isnan(v) ? 0x7fc00000u : ref_f32_bits(v);
    case isa::Dtype::F16: return std::isnan(v) ? 0x7e00u : ref_f16_bits(static_cast<_Float16>(v));
    default: return std::isnan(v) ? 0x7fc0u : ref_bf16_round(v);
  }
}
// Sign-extended value of integer element bits.
inline int64_t ref_int_of(isa::Dtype t, uint32_t bits) {
  switch (t) {
    case isa::Dtype::S32: return static_cast<int32_t>(bits);
    case isa::Dtype::S16: return static_cast<int16_t>(bits);
    case isa::Dtype::U16: return static_cast<uint16_t>(bits);
    case isa::Dtype::S8: return static_cast<int8_t>(bits);
    default: return static_cast<uint8_t>(bits);
  }
}

// A source value generator: a mix of raw random bit patterns (NaNs, infinities, subnormals),
// moderate values and special values, in the type's encoding.
class ValuePool {
 public:
  ValuePool(isa::Dtype t, uint32_t seed) : m_type(t), m_rng(seed) {}
  uint32_t next() {
    const int size = isa::dtype_size(m_type);
    uint32_t raw = static_cast<uint32_t>(m_rng()) & elem_mask(size);
    if (!isa::dtype_is_float(m_type)) {
      switch (m_rng() % 4) {
        case 0: return raw;
        case 1: return static_cast<uint32_t>(static_cast<int32_t>(m_rng() % 201) - 100) &
                       elem_mask(size);
        default: {
          static const int64_t edges[] = {0, 1, -1, 32767, -32768, 65535, 2147483647,
                                          -2147483648LL, 127, -128, 255, 40000};
          return static_cast<uint32_t>(edges[m_rng() % 12]) & elem_mask(size);
        }
      }
    }
    switch (m_rng() % 4) {
      case 0: return raw;
      case 1: {
        std::uniform_real_distribution<float> d(-100.0f, 100.0f);
        return ref_float_bits(m_type, d(m_rng));
      }
      case 2: {
        std::uniform_real_distribution<float> d(0.001f, 4.0f);
        return ref_float_bits(m_type, d(m_rng));
      }
      default: {
        static const float specials[] = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 2049.0f, 65504.0f,
                                         INFINITY, -INFINITY, NAN, 6e-8f, -6e-8f, 1e-40f,
                                         3e38f, 1e-5f, 2.5f};
        return ref_float_bits(m_type, specials[m_rng() % 16]);
      }
    }
  }

 private:
  isa::Dtype m_type;
  std::mt19937 m_rng;
};

}  // namespace npusim::test
