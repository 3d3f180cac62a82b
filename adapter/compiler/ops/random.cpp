// StatelessRandomGetKeyCounter and StatelessRandomUniformV2 on the scalar unit, the latter on
// the vector unit from kRandomVectorMinGroups groups on (random_vector.cpp; random.h says what
// they compute and what it costs).
#include "adapter/compiler/ops/random.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "adapter/compiler/ops/elementwise.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

constexpr int64_t kLow32 = 0xffffffff;
constexpr int kPhiloxRounds = 10;
// TF's seed scrambling key (GenerateKey in stateless_random_ops.cc).
constexpr int64_t kSeedKey0 = 0x3ec8f720;
constexpr int64_t kSeedKey1 = 0x02461e29;
constexpr int64_t kGroup = kPhiloxGroup;

constexpr int kAlgPhilox = 1, kAlgThreeFry = 2, kAlgAutoSelect = 3;  // TF's rng_alg.h

// One output type of the uniform distribution: the value (u & (2^W - 1)) * 2^-W as a float with
// `mantissa_bits` W and exponent bias `bias`.
struct UnitFloat {
  int mantissa_bits;
  int64_t bias;
  int bytes;
};

UnitFloat unit_float(DataType t) {
  switch (t) {
    case DataType::F16: return {10, 15, 2};
    case DataType::BF16: return {7, 127, 2};
    default: return {23, 127, 4};
  }
}

// dst = the bits of (sample & (2^W - 1)) * 2^-W. m and e are scratch (clobbered). A
// leading-zero count by binary search over the W+1-bit word, without branches (the control
// flow, and so the kernel's timing, must not depend on the random bits: a launch of it then
// replays at the next step's key, docs/chip_model.md "Launch replay"): steps s = 16, 8, 4, 2, 1
// (those up to W: fewer than 2s leading zeros remain before step s), each shifting m left by s
// when its top s bits are zero (shift = s * (1 - min(m >> (W + 1 - s), 1))). m then has bit W set
// and the value is 1.f * 2^-k with k the total shift, so the exponent field is bias - k; a zero
// sample (m still 0: bit W clear) gives +0.0 by multiplying the exponent by bit W of m.
void emit_unit_float_bits(KernelBuilder& b, const Reg& dst, const Reg& sample, const Reg& m,
                          const Reg& e, const UnitFloat& f) {
  const int w = f.mantissa_bits;
  const int64_t mask = (int64_t{1} << w) - 1;
  b.and_(m, sample, mask, "mantissa bits of the sample");
  b.movi(e, f.bias);
  for (int s = 16, log2_s = 4; s >= 1; s /= 2, --log2_s) {
    if (s > w) continue;  // the leading zeros are at most W: steps up to W suffice
    b.shr(dst, m, w + 1 - s,
          fmt::format("step {}: shift by {} if the top {} bits are zero", s, s, s));
    b.min(dst, dst, 1);
    b.emit(Opcode::op_xor, {dst, dst, 1});
    if (log2_s > 0) b.shl(dst, dst, log2_s);
    b.shl(m, m, dst);
    b.sub(e, e, dst);
  }
  b.shr(dst, m, w, "1 unless the sample's mantissa was 0");
  b.mul(e, e, dst);
  b.shl(dst, e, w, "exponent field");
  b.and_(m, m, mask, "drop the leading one");
  b.emit(Opcode::op_or, {dst, dst, m});
}

// The vector cores' block split of `groups` Philox groups.
struct GroupSplit {
  int64_t per = 0;
  int block_dim = 0;
};

GroupSplit split_groups(int64_t groups, const KernelBuilder& b) {
  const int64_t cores = b.config().core_kind(b.vector_core_kind())->count;
  GroupSplit s;
  s.per = std::min(groups, std::max<int64_t>(kRandomMinGroupsPerBlock,
                                             static_cast<int64_t>(ceil_div(groups, cores))));
  s.block_dim = static_cast<int>(ceil_div(groups, s.per));
  return s;
}

// Splits a 64-bit word into its two u32 halves (low first, TF's Uint64ToUint32s).
void split_u64(KernelBuilder& b, const Reg& lo, const Reg& hi, const Reg& v) {
  b.and_(lo, v, kLow32);
  b.shr(hi, v, 32);
}

// dst = lo | hi << 32 (lo, hi u32 words; hi is clobbered).
void join_u64(KernelBuilder& b, const Reg& dst, const Reg& lo, const Reg& hi) {
  b.shl(hi, hi, 32);
  b.emit(Opcode::op_or, {dst, lo, hi});
}

void check_key_counter(const OpDesc& op, const TensorDesc& key, const TensorDesc& counter) {
  if (key.dtype != DataType::S64 || key.shape != std::vector<int64_t>{1})
    op.fail(fmt::format("key must be uint64 [1] (s64 bits), got {}", key.str()));
  if (counter.dtype != DataType::S64 || counter.shape.size() != 1 || counter.shape[0] < 2)
    op.fail(fmt::format("counter must be uint64 [n >= 2] (s64 bits) for Philox, got {}",
                        counter.str()));
}

CompiledKernel compile_get_key_counter(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 1) op.fail("expects one input (seed)");
  const TensorDesc& seed = op.inputs[0];
  if ((seed.dtype != DataType::S32 && seed.dtype != DataType::S64) ||
      seed.shape != std::vector<int64_t>{2})
    op.fail(fmt::format("seed must be int32 or int64 [2], got {}", seed.str()));
  KernelBuilder b("RandomKeyCounter", op.str(), ctx.cfg);
  b.begin_section(b.vector_core_kind());
  b.declare_arg("seed", device_dtype(seed.dtype), seed.shape);
  b.declare_arg("key", Dtype::S64, {1});
  b.declare_arg("counter", Dtype::S64, {2});
  Reg seed_addr = b.load_arg("seed"), key_addr = b.load_arg("key");
  Reg counter_addr = b.load_arg("counter");
  Reg s0 = b.reg("seed 0"), s1 = b.reg("seed 1");
  {
    KernelBuilder::Origin o(b, "seeds, sign-extended to 64 bits");
    if (seed.dtype == DataType::S64) {
      b.emit(Opcode::op_ld, {s0, seed_addr});
      b.add(seed_addr, seed_addr, 8);
      b.emit(Opcode::op_ld, {s1, seed_addr});
    } else {
      const int64_t sign = int64_t{1} << 31;
      b.emit(Opcode::op_ld, {s0, seed_addr}, "both int32 seeds");
      b.shr(s1, s0, 32);
      for (const Reg* s : {&s0, &s1}) {
        b.and_(*s, *s, kLow32);
        b.emit(Opcode::op_xor, {*s, *s, sign});
        b.sub(*s, *s, sign);
      }
    }
  }
  Reg c0 = b.reg("c0"), c1 = b.reg("c1"), c2 = b.reg("c2"), c3 = b.reg("c3");
  split_u64(b, c0, c1, s0);
  split_u64(b, c2, c3, s1);
  Reg k0 = b.reg_imm("key 0", kSeedKey0), k1 = b.reg_imm("key 1", kSeedKey1);
  emit_philox4x32_10(b, {&c0, &c1, &c2, &c3}, k0, k1);
  {
    KernelBuilder::Origin o(b, "key = mix0 | mix1 << 32, counter = {0, mix2 | mix3 << 32}");
    join_u64(b, s0, c0, c1);
    b.emit(Opcode::op_st, {s0, key_addr});
    b.emit(Opcode::op_st, {Opnd::reg_number(0), counter_addr});
    join_u64(b, s1, c2, c3);
    b.add(counter_addr, counter_addr, 8);
    b.emit(Opcode::op_st, {s1, counter_addr});
  }
  b.end();
  CompiledKernel k;
  k.outputs = {TensorDesc{DataType::S64, {1}}, TensorDesc{DataType::S64, {2}}};
  Launch l;
  l.block_dim = 1;
  l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kOutput, 0, 0},
            ArgRef{ArgRef::Kind::kOutput, 1, 0}};
  l.summary = "scalar unit: one Philox4x32-10 call (TF's seed scrambling)";
  l.kernel = b.finish();
  k.launches.push_back(std::move(l));
  return k;
}

CompiledKernel compile_uniform(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 4) op.fail("expects 4 inputs (shape, key, counter, alg)");
  check_key_counter(op, op.inputs[1], op.inputs[2]);
  const int64_t alg = op.attr_int("alg", kAlgPhilox);
  if (alg == kAlgThreeFry)
    op.fail("alg 2 (ThreeFry) is not supported (neither is it by TensorFlow's CPU kernel)");
  if (alg != kAlgPhilox && alg != kAlgAutoSelect)
    op.fail(fmt::format("unsupported algorithm id {} (1: Philox, 3: auto-select)", alg));
  const DataType dtype = op.attr_type("dtype").value_or(DataType::F32);
  if (dtype != DataType::F32 && dtype != DataType::F16 && dtype != DataType::BF16)
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16)", data_type_name(dtype)));
  std::vector<int64_t> shape;
  if (op.attrs.count("shape"))
    shape = op.attr_ints("shape");
  else if (!op.outputs.empty())
    shape = op.outputs[0].shape;
  else
    op.fail("needs attribute 'shape' (the values of the shape input)");
  for (int64_t d : shape)
    if (d < 0) op.invalid(fmt::format("negative dimension in shape {}", shape_str(shape)));
  const TensorDesc out{dtype, shape};
  CompiledKernel k;
  k.outputs = {out};
  const int64_t n = out.num_elements();
  if (n == 0) return k;

  const int64_t groups = static_cast<int64_t>(ceil_div(n, kGroup));
  if (groups >= kRandomVectorMinGroups) {
    k.launches.push_back(build_uniform_vector_launch(op, dtype, n, ctx.cfg));
    return k;
  }
  const UnitFloat f = unit_float(dtype);
  KernelBuilder b(fmt::format("RandomUniform_{}", data_type_name(dtype)), op.str(), ctx.cfg);
  const GroupSplit split = split_groups(groups, b);
  b.begin_section(b.vector_core_kind());
  b.declare_arg("key", Dtype::S64, op.inputs[1].shape);
  b.declare_arg("counter", Dtype::S64, op.inputs[2].shape);
  b.declare_arg("out", device_dtype(dtype), shape);
  Reg lo = b.reg("counter low 64 bits"), hi = b.reg("counter high 64 bits");
  Reg key0 = b.reg("key word 0"), key1 = b.reg("key word 1");
  Reg out_addr = b.load_arg("out");
  Reg g = b.reg("group"), end = b.reg("end of this block's groups");
  {
    KernelBuilder::Origin o(b, "this block's groups and their first counter");
    {
      Reg a = b.load_arg("key");
      b.emit(Opcode::op_ld, {lo, a});
      split_u64(b, key0, key1, lo);
    }
    Reg a = b.load_arg("counter");
    b.emit(Opcode::op_ld, {lo, a});
    b.add(a, a, 8);
    b.emit(Opcode::op_ld, {hi, a});
    emit_block_range(b, g, end, split.per, groups);
    emit_counter_add(b, lo, hi, g);
  }
  Reg c0 = b.reg("c0"), c1 = b.reg("c1"), c2 = b.reg("c2"), c3 = b.reg("c3");
  Reg k0 = b.reg("round key 0"), k1 = b.reg("round key 1");
  Reg m = b.reg("mantissa"), e = b.reg("exponent"), v0 = b.reg("value bits"),
      v1 = b.reg("value bits"), word = b.reg("packed word"), addr = b.reg("address");
  const Reg* c[4] = {&c0, &c1, &c2, &c3};
  b.for_range(g, g, end, 1, [&] {
    split_u64(b, c0, c1, lo);
    split_u64(b, c2, c3, hi);
    b.mov(k0, key0);
    b.mov(k1, key1);
    emit_philox4x32_10(b, {&c0, &c1, &c2, &c3}, k0, k1);
    KernelBuilder::Origin o(b, "float bits of the group's four samples, packed and stored");
    b.mul_add(addr, g, kGroup * f.bytes, out_addr);
    if (f.bytes == 4) {
      for (int w = 0; w < 2; ++w) {
        emit_unit_float_bits(b, word, *c[2 * w], m, e, f);
        emit_unit_float_bits(b, v1, *c[2 * w + 1], m, e, f);
        b.shl(v1, v1, 32);
        b.emit(Opcode::op_or, {word, word, v1});
        b.emit(Opcode::op_st, {word, addr});
        if (w == 0) b.add(addr, addr, 8);
      }
    } else {
      emit_unit_float_bits(b, word, *c[0], m, e, f);
      for (int j = 1; j < 4; ++j) {
        emit_unit_float_bits(b, v0, *c[j], m, e, f);
        b.shl(v0, v0, 16 * j);
        b.emit(Opcode::op_or, {word, word, v0});
      }
      b.emit(Opcode::op_st, {word, addr});
    }
    // next group: counter + 1 (128-bit), without a branch (as above): the carry is 1 when the
    // low word wrapped to 0, i.e. when neither lo nor -lo has bit 63 set. m is free here.
    b.add(lo, lo, 1);
    b.movi(m, 0);
    b.sub(m, m, lo);
    b.emit(Opcode::op_or, {m, m, lo});
    b.shr(m, m, 63);
    b.emit(Opcode::op_xor, {m, m, 1});
    b.add(hi, hi, m);
  });
  b.end();
  Launch l;
  l.block_dim = split.block_dim;
  l.args = {ArgRef{ArgRef::Kind::kInput, 1, 0}, ArgRef{ArgRef::Kind::kInput, 2, 0},
            ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  l.summary = fmt::format("scalar unit: {} Philox groups, {} blocks of {}", groups, split.block_dim,
                          split.per);
  l.kernel = b.finish();
  k.launches.push_back(std::move(l));
  return k;
}

}  // namespace

void emit_counter_add(KernelBuilder& b, const Reg& lo, const Reg& hi, const Reg& g) {
  KernelBuilder::Origin o(b, "counter += g (128-bit)");
  // counter += g (128-bit): carry into the high word when the low word wraps, i.e. when the
  // new low word is below g as unsigned numbers (compared as signed after flipping the sign).
  // Without a branch (the counter is loaded data: a branch on it would keep the launch's
  // address flow from being followed, docs/chip_model.md "Launch replay"): x < y as signed
  // numbers is the sign of x - y, flipped when the subtraction overflows (x and y of other
  // signs, and x - y of y's sign): bit 63 of (x - y) ^ ((x ^ y) & ((x - y) ^ x)).
  b.add(lo, lo, g);
  Reg x = b.reg("lo ^ sign"), y = b.reg("g ^ sign"), d = b.reg("x - y"), t = b.reg("carry");
  Reg sign = b.reg_imm("sign bit", std::numeric_limits<int64_t>::min());
  b.emit(Opcode::op_xor, {x, lo, sign});
  b.emit(Opcode::op_xor, {y, g, sign});
  b.sub(d, x, y);
  b.emit(Opcode::op_xor, {t, x, y});
  b.emit(Opcode::op_xor, {x, d, x});
  b.and_(t, t, x);
  b.emit(Opcode::op_xor, {t, t, d});
  b.shr(t, t, 63);
  b.add(hi, hi, t);
}

void emit_philox4x32_10(KernelBuilder& b, const std::array<const Reg*, 4>& c, const Reg& k0,
                        const Reg& k1) {
  Reg p0 = b.reg("M0 * c0"), p1 = b.reg("M1 * c2");
  for (int r = 0; r < kPhiloxRounds; ++r) {
    KernelBuilder::Origin o(b, fmt::format("Philox round {}", r));
    if (r > 0) {
      b.add(k0, k0, kPhiloxW0, "raise the key");
      b.and_(k0, k0, kLow32);
      b.add(k1, k1, kPhiloxW1);
      b.and_(k1, k1, kLow32);
    }
    // (hi0, lo0) = M0 * c0, (hi1, lo1) = M1 * c2: the exact 64-bit products of u32 words.
    b.mul(p0, *c[0], kPhiloxM0);
    b.mul(p1, *c[2], kPhiloxM1);
    // c' = {hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0}
    emit_philox_mix(b, *c[0], *c[1], p1, *c[1], k0);
    emit_philox_mix(b, *c[2], *c[3], p0, *c[3], k1);
  }
}

void emit_philox_mix(KernelBuilder& b, const Reg& hi_out, const Reg& lo_out, const Reg& product,
                     const Reg& c, const Reg& k) {
  b.shr(hi_out, product, 32);
  b.emit(Opcode::op_xor, {hi_out, hi_out, c});
  b.emit(Opcode::op_xor, {hi_out, hi_out, k});
  b.and_(lo_out, product, kLow32);
}

CompiledKernel compile_random(const CompileContext& ctx) {
  if (ctx.op.type == "StatelessRandomGetKeyCounter") return compile_get_key_counter(ctx);
  if (ctx.op.type == "StatelessRandomUniformV2") return compile_uniform(ctx);
  ctx.op.fail("not a random op");
}

}  // namespace npusim::compiler::ops
