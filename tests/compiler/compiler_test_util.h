// Helpers for the kernel compiler's tests: typed host tensors, an independent reference in
// plain C++ (double arithmetic rounded to the output type; GCC's _Float16 for fp16, bf16 rounded
// by hand), and a runner that places tensors in the simulator's device memory the way the
// runtime must (op_desc.h buffer contract), runs every launch of a CompiledKernel in order and
// checks that nothing outside the output buffers changed.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "sim/simulator.h"

namespace npusim::test {

// The chip a compiler test executable runs its kernels on: $NPUSIM_TEST_CHIP, default "tiny".
// CMakeLists.txt registers every tests/compiler executable for tiny and again as <name>_910b
// with NPUSIM_TEST_CHIP=910b (one SystemC elaboration per process). Expectations that depend
// on the chip derive them from test_sim().config(); tiny-specific tiling numbers compile for
// load_chip_config("tiny") explicitly.
inline std::string test_chip_name() {
  const char* c = std::getenv("NPUSIM_TEST_CHIP");
  return c && *c ? std::string(c) : std::string("tiny");
}
// Tests tagged heavy run on tiny only: the 910b pass (48 vector / 24 cube cores to simulate)
// runs a representative subset.
inline bool test_chip_is_tiny() { return test_chip_name() == "tiny"; }

// What the MatMul family (MatMul, BatchMatMulV2, Einsum) says when the chip's cube cannot
// multiply dt operands as they are: bf16 where cube.bf16 is false, f32 under
// must_keep_origin_dtype where cube.fp32_rate_divisor is 0 (the 910 and 310P presets: fp16-only
// cubes); "" where it can, or where the precision mode casts f32 to f16 first. Tests of bf16 and
// f32 products run where this is empty and expect this refusal elsewhere.
inline std::string cube_type_refusal(const ChipConfig& cfg, compiler::DataType dt,
                                     compiler::PrecisionMode mode) {
  if (dt == compiler::DataType::BF16 && !cfg.vector_bf16_conversion)  // no bf16 at all
    return "dtype bf16 is not supported on chip " + cfg.name;
  if (dt == compiler::DataType::BF16 && !cfg.cube_bf16)
    return "bf16 is not supported by the cube of chip " + cfg.name;
  if (dt == compiler::DataType::F32 && mode == compiler::PrecisionMode::kKeepFp32 &&
      cfg.cube_fp32_rate_divisor <= 0)
    return "the cube of chip " + cfg.name + " has no fp32";
  return "";
}

// The executable's simulator of the test chip, functional (one per process: SystemC elaborates
// one chip per process).
inline Simulator& test_sim() {
  static Simulator s(load_chip_config(test_chip_name()), SimOptions{});
  return s;
}

// Runs `program` as one block on `sim` with argument 0 = a GM scratch address and reads back
// n 8-byte words from there: for scalar-unit kernels that `st` their results.
inline std::vector<int64_t> run_scalar_words(Simulator& sim, const isa::Program& program,
                                             size_t n) {
  const uint64_t addr = 0x200000;
  KernelLaunch l;
  l.program = &program;
  l.args = {addr};
  l.block_dim = 1;
  KernelResult r = sim.run(l);
  INFO(r.error);
  REQUIRE(r.ok);
  std::vector<int64_t> v(n);
  sim.gm().read(addr, v.data(), n * sizeof(int64_t));
  return v;
}

using compiler::CompiledKernel;
using compiler::DataType;
using compiler::OpDesc;
using compiler::TensorDesc;

// ---- element conversions (independent of the model's own converters) ----

inline uint16_t to_f16_bits(double v) {
  _Float16 h = static_cast<_Float16>(static_cast<float>(v));  // RNE via fp32 (exact for fp32 v)
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
// Rounds a double straight to fp16 (no intermediate fp32 rounding).
inline uint16_t to_f16_bits_direct(double v) {
  _Float16 h = static_cast<_Float16>(v);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
inline double from_f16_bits(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return static_cast<double>(h);
}
// fp32 -> bf16 with round to nearest even, by hand (NaN not handled: tests use finite values).
inline uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t lsb = (u >> 16) & 1u;
  u += 0x7fffu + lsb;
  return static_cast<uint16_t>(u >> 16);
}
inline double from_bf16_bits(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// A host tensor: values as doubles (exactly representable in dtype) plus its desc.
struct HostTensor {
  HostTensor() = default;
  HostTensor(TensorDesc d, std::vector<double> v, std::vector<int64_t> exact = {})
      : desc(std::move(d)), values(std::move(v)), s64(std::move(exact)) {}
  TensorDesc desc;
  std::vector<double> values;
  // S64 only, optional: the exact values (doubles hold integers up to 2^53); encode() stores
  // these when present.
  std::vector<int64_t> s64;
};

// Rounds v to the storage type (RNE for floats, truncation toward zero for integers).
inline double round_to(DataType t, double v) {
  switch (t) {
    case DataType::F32: return static_cast<float>(v);
    case DataType::F16: return from_f16_bits(to_f16_bits_direct(v));
    case DataType::BF16: return from_bf16_bits(to_bf16_bits(static_cast<float>(v)));
    case DataType::S32: return static_cast<double>(static_cast<int32_t>(v));
    case DataType::BOOL: return v != 0 ? 1 : 0;
    default: return v;
  }
}

inline std::vector<uint8_t> encode(const HostTensor& t) {
  const int size = compiler::data_type_bytes(t.desc.dtype);
  std::vector<uint8_t> out(t.values.size() * static_cast<size_t>(size));
  for (size_t i = 0; i < t.values.size(); ++i) {
    uint8_t* p = out.data() + i * size;
    double v = t.values[i];
    switch (t.desc.dtype) {
      case DataType::F32: { float f = static_cast<float>(v); std::memcpy(p, &f, 4); break; }
      case DataType::F16: { uint16_t b = to_f16_bits_direct(v); std::memcpy(p, &b, 2); break; }
      case DataType::BF16: {
        uint16_t b = to_bf16_bits(static_cast<float>(v));
        std::memcpy(p, &b, 2);
        break;
      }
      case DataType::S32: { int32_t x = static_cast<int32_t>(v); std::memcpy(p, &x, 4); break; }
      case DataType::S16: { int16_t x = static_cast<int16_t>(v); std::memcpy(p, &x, 2); break; }
      case DataType::S8: { int8_t x = static_cast<int8_t>(v); std::memcpy(p, &x, 1); break; }
      case DataType::U8: case DataType::BOOL: *p = static_cast<uint8_t>(v); break;
      case DataType::U16: { uint16_t x = static_cast<uint16_t>(v); std::memcpy(p, &x, 2); break; }
      case DataType::S64: {
        int64_t x = t.s64.empty() ? static_cast<int64_t>(v) : t.s64[i];
        std::memcpy(p, &x, 8);
        break;
      }
      default: FAIL("encode: unsupported dtype");
    }
  }
  return out;
}

inline std::vector<double> decode(DataType t, const std::vector<uint8_t>& bytes) {
  const int size = compiler::data_type_bytes(t);
  std::vector<double> v(bytes.size() / static_cast<size_t>(size));
  for (size_t i = 0; i < v.size(); ++i) {
    const uint8_t* p = bytes.data() + i * size;
    switch (t) {
      case DataType::F32: { float f; std::memcpy(&f, p, 4); v[i] = f; break; }
      case DataType::F16: { uint16_t b; std::memcpy(&b, p, 2); v[i] = from_f16_bits(b); break; }
      case DataType::BF16: { uint16_t b; std::memcpy(&b, p, 2); v[i] = from_bf16_bits(b); break; }
      case DataType::S32: { int32_t x; std::memcpy(&x, p, 4); v[i] = x; break; }
      case DataType::S16: { int16_t x; std::memcpy(&x, p, 2); v[i] = x; break; }
      case DataType::S8: { int8_t x; std::memcpy(&x, p, 1); v[i] = x; break; }
      case DataType::U8: case DataType::BOOL: v[i] = *p; break;
      case DataType::U16: { uint16_t x; std::memcpy(&x, p, 2); v[i] = x; break; }
      case DataType::S64: {
        int64_t x;
        std::memcpy(&x, p, 8);
        v[i] = static_cast<double>(x);
        break;
      }
      default: FAIL("decode: unsupported dtype");
    }
  }
  return v;
}

// Deterministic random values in [lo, hi], rounded to the dtype (integers for S32).
inline HostTensor random_tensor(DataType t, std::vector<int64_t> shape, double lo, double hi,
                                uint32_t seed) {
  HostTensor h{TensorDesc{t, std::move(shape)}, {}};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  h.values.resize(static_cast<size_t>(h.desc.num_elements()));
  for (double& v : h.values) {
    v = dist(rng);
    v = compiler::data_type_is_float(t) || t == DataType::BOOL ? round_to(t, v) : std::round(v);
  }
  return h;
}

// Device memory for one test: a bump allocator over the simulator's GM.
class GmArena {
 public:
  static constexpr uint64_t kBase = 1 << 20;
  static constexpr uint64_t kGuard = 256;  // bytes checked around every buffer
  uint64_t alloc(uint64_t bytes) {
    uint64_t a = m_next + kGuard;
    m_next = (a + compiler::device_buffer_bytes(bytes) + kGuard + 511) / 512 * 512;
    return a;
  }
  void reset() { m_next = kBase; }

 private:
  uint64_t m_next = kBase;
};

struct RunResult {
  std::vector<HostTensor> outputs;   // S64 outputs carry their exact values in HostTensor::s64
  uint64_t cycles = 0;
  int replayed = 0;  // launches the simulator replayed (KernelResult::replayed)
  std::vector<nlohmann::json> counters;  // per launch, its counter tree (KernelResult::counters)
  // With own_derived: each derived tensor's bytes (CompiledKernel::derived) after the run.
  std::vector<std::vector<uint8_t>> derived;
};

// The exact values of an S64 tensor's bytes.
inline std::vector<int64_t> decode_s64(const std::vector<uint8_t>& bytes) {
  std::vector<int64_t> v(bytes.size() / 8);
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * 8);
  return v;
}

// Runs every launch of k on sim with the given inputs. Checks: each launch succeeds, the
// program's block_dim and arguments bind, no byte of device memory outside the outputs'
// (rounded-up) buffers and the workspace changes. own_derived: the derived tensors get buffers
// of their own, as a runtime keeping them does (compiler.h), and a derived tensor must be
// written by its own launch only (its bytes right after that launch are its bytes at the end).
// input_at_memory_end >= 0: that input's buffer (device_buffer_bytes: its last 32-byte granule)
// ends where the device memory does, so a read past it faults. Stricter than the buffer
// contract (op_desc.h lets kernels read kDeviceBufferAlign bytes past an input), for kernels
// that read nothing past their inputs' granules.
inline RunResult run_compiled(Simulator& sim, const CompiledKernel& k,
                              const std::vector<HostTensor>& inputs, bool own_derived = false,
                              int input_at_memory_end = -1) {
  constexpr uint8_t kPoison = 0xA5;
  GmArena arena;
  DeviceMemory& gm = sim.gm();
  std::vector<uint64_t> in_addr, out_addr;
  std::vector<std::pair<uint64_t, uint64_t>> guards;  // ranges that must stay kPoison
  auto place = [&](uint64_t bytes) {
    uint64_t a = arena.alloc(bytes);
    uint64_t lo = a - GmArena::kGuard, hi = a + compiler::device_buffer_bytes(bytes);
    gm.fill(lo, kPoison, GmArena::kGuard);
    gm.fill(hi, kPoison, GmArena::kGuard);
    guards.emplace_back(lo, GmArena::kGuard);
    guards.emplace_back(hi, GmArena::kGuard);
    return a;
  };
  for (const HostTensor& t : inputs) {
    std::vector<uint8_t> bytes = encode(t);
    const bool at_end = static_cast<int>(in_addr.size()) == input_at_memory_end;
    uint64_t a = at_end ? gm.capacity() - compiler::device_buffer_bytes(bytes.size())
                        : place(bytes.size());
    if (at_end) {
      gm.fill(a - GmArena::kGuard, kPoison, GmArena::kGuard);
      guards.emplace_back(a - GmArena::kGuard, GmArena::kGuard);
    }
    if (!bytes.empty()) gm.write(a, bytes.data(), bytes.size());
    in_addr.push_back(a);
  }
  for (const TensorDesc& t : k.outputs) {
    uint64_t a = place(t.bytes());
    gm.fill(a, kPoison, compiler::device_buffer_bytes(t.bytes()));
    out_addr.push_back(a);
  }
  uint64_t ws = k.workspace_bytes ? place(k.workspace_bytes) : 0;
  std::vector<uint64_t> derived_addr;
  if (own_derived)
    for (const compiler::DerivedTensor& d : k.derived) {
      derived_addr.push_back(place(d.bytes));
      gm.fill(derived_addr.back(), kPoison, compiler::device_buffer_bytes(d.bytes));
    }
  RunResult r;
  r.derived.resize(derived_addr.size());
  for (size_t i = 0; i < k.launches.size(); ++i) {
    const compiler::Launch& l = k.launches[i];
    KernelLaunch kl;
    kl.program = &l.kernel.program;
    kl.args = l.bind(in_addr, out_addr, ws, derived_addr);
    kl.block_dim = l.block_dim;
    KernelResult kr = sim.run(kl);
    INFO(l.summary);
    INFO(kr.error);
    REQUIRE(kr.ok);
    r.cycles += kr.cycles;
    r.replayed += kr.replayed ? 1 : 0;
    r.counters.push_back(std::move(kr.counters));
    for (size_t d = 0; d < derived_addr.size(); ++d)
      if (k.derived[d].launch == i) {
        r.derived[d].resize(k.derived[d].bytes);
        gm.read(derived_addr[d], r.derived[d].data(), k.derived[d].bytes);
      }
  }
  for (size_t d = 0; d < derived_addr.size(); ++d) {
    std::vector<uint8_t> now(k.derived[d].bytes);
    gm.read(derived_addr[d], now.data(), now.size());
    if (now != r.derived[d]) FAIL("derived tensor " << d << " was written by another launch");
  }
  for (auto [lo, n] : guards) {
    std::vector<uint8_t> g(n);
    gm.read(lo, g.data(), n);
    for (uint64_t i = 0; i < n; ++i)
      if (g[i] != kPoison) FAIL("a kernel wrote outside its buffers at " << lo + i);
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<uint8_t> want = encode(inputs[i]), got(want.size());
    if (!got.empty()) gm.read(in_addr[i], got.data(), got.size());
    if (got != want) FAIL("input " << i << " was modified");
  }
  for (size_t i = 0; i < k.outputs.size(); ++i) {
    std::vector<uint8_t> bytes(k.outputs[i].bytes());
    if (!bytes.empty()) gm.read(out_addr[i], bytes.data(), bytes.size());
    r.outputs.push_back(HostTensor{k.outputs[i], decode(k.outputs[i].dtype, bytes)});
    if (k.outputs[i].dtype == DataType::S64) r.outputs.back().s64 = decode_s64(bytes);
  }
  return r;
}

// Relative/absolute comparison: |got - want| <= atol + rtol * |want| for every element
// (NaN matches NaN). Reports the first mismatches.
inline void check_close(const std::vector<double>& got, const std::vector<double>& want,
                        double rtol, double atol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    bool ok = (std::isnan(got[i]) && std::isnan(want[i])) ||
              std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]);
    if (!ok && bad++ < 5)
      UNSCOPED_INFO(what << ": element " << i << " got " << got[i] << " want " << want[i]);
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements differ");
  CHECK(bad == 0);
}

// Per-element bounds: |got - want| <= 2 * tol (the factor 2 is the slack over a derived error
// bound). Reports the first mismatches.
inline void check_within_bounds(const std::vector<double>& got, const std::vector<double>& want,
                                const std::vector<double>& tol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  REQUIRE(tol.size() == want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= 2 * tol[i]) && bad++ < 5)
      UNSCOPED_INFO(what << "[" << i << "] = " << got[i] << ", want " << want[i] << " +- "
                         << 2 * tol[i]);
  CHECK(bad == 0);
}

// Flat index of each output element's source in an input of in_shape broadcast to out_shape.
inline std::vector<size_t> broadcast_index(const std::vector<int64_t>& in_shape,
                                           const std::vector<int64_t>& out_shape) {
  const size_t rank = out_shape.size();
  std::vector<int64_t> in(rank - in_shape.size(), 1);
  in.insert(in.end(), in_shape.begin(), in_shape.end());
  int64_t n = 1;
  for (int64_t d : out_shape) n *= d;
  std::vector<size_t> idx(static_cast<size_t>(n));
  for (int64_t f = 0; f < n; ++f) {
    int64_t rest = f, src = 0, stride = 1;
    for (size_t d = rank; d-- > 0;) {
      int64_t i = rest % out_shape[d];
      rest /= out_shape[d];
      if (in[d] != 1) src += i * stride;
      stride *= in[d];
    }
    idx[static_cast<size_t>(f)] = static_cast<size_t>(src);
  }
  return idx;
}

// How compile() refused an op: its message, and whether it was an InvalidOpError (the op breaks
// its own contract) rather than a plain CompileError.
struct CompileRefusal {
  bool invalid = false;
  std::string message;
};

// Compiles op, which must be refused, for cfg (by default the test chip); checks that the
// message starts with the op's signature.
inline CompileRefusal compile_refusal(const OpDesc& op,
                                      const ChipConfig& cfg = test_sim().config()) {
  CompileRefusal r;
  try {
    compiler::compile(op, cfg);
    FAIL("compiled");
  } catch (const compiler::InvalidOpError& e) {
    r.invalid = true;
    r.message = e.what();
  } catch (const compiler::CompileError& e) {
    r.message = e.what();
  }
  INFO(r.message);
  CHECK(r.message.rfind(op.str() + ": ", 0) == 0);
  return r;
}

// Whether the test chip runs op, a mix kernel (the cube and vector cores of a split chip, in
// one launch); on a coupled chip, checks that op is refused, saying why, and returns false.
inline bool runs_mix_kernel(const OpDesc& op) {
  if (test_sim().config().split) return true;
  const std::string message = compile_refusal(op).message;
  CHECK(message.find("is a mix kernel") != std::string::npos);
  CHECK(message.find("this chip is coupled") != std::string::npos);
  return false;
}

inline OpDesc make_op(const std::string& type, std::vector<TensorDesc> inputs,
                      std::map<std::string, compiler::AttrValue> attrs = {}) {
  OpDesc op;
  op.type = type;
  op.inputs = std::move(inputs);
  op.attrs = std::move(attrs);
  return op;
}

// Op `type` on the host tensors `in` (attributes `attrs`) compiled for the test chip and run on
// it; its launches' summaries go to the test's log, and it must have `outputs` outputs.
// input_at_memory_end: run_compiled's.
inline RunResult run_op(const std::string& type, const std::vector<HostTensor>& in,
                        std::map<std::string, compiler::AttrValue> attrs, size_t outputs,
                        int input_at_memory_end = -1) {
  std::vector<TensorDesc> descs;
  for (const HostTensor& t : in) descs.push_back(t.desc);
  auto k = compiler::compile(make_op(type, descs, std::move(attrs)), test_sim().config());
  for (const auto& l : k.launches) UNSCOPED_INFO(l.summary);
  REQUIRE(k.outputs.size() == outputs);
  return run_compiled(test_sim(), k, in, false, input_at_memory_end);
}

}  // namespace npusim::test
