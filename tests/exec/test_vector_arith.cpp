// Element-wise V instructions (VBIN, VUN, VSCL families) against a reference written here: the
// brief's lane addressing and mask contract, _Float16 for fp16 arithmetic, hand-rounded bf16,
// plain C++ for integers. Every test compares the whole UB, so lanes that must stay unchanged
// (inactive, between strided blocks) are checked too.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tests/exec/test_vector_util.h"

using namespace npusim;
using namespace npusim::test;
using isa::Dtype;
using isa::Opcode;

namespace {

constexpr uint64_t kDst = 0x0000, kSrc0 = 0x8000, kSrc1 = 0x10000;

struct Geometry {
  std::string name;
  int64_t repeat;
  int64_t dst_blk, src0_blk, src1_blk, dst_rep, src0_rep, src1_rep;
  VectorMask mask;
  uint64_t dst_at = kDst;  // the destination's address (kSrc0: in place)
};

// The operand layouts every element-wise instruction is tested with, for `lanes` lanes.
std::vector<Geometry> geometries(int lanes) {
  return {
      {"contiguous, full mask, 3 repeats", 3, 1, 1, 1, 8, 8, 8, VectorMask{}},
      {"block strides 2/3/1, repeat strides 16/24/9, partial mask, 5 repeats", 5, 2, 3, 1, 16, 24,
       9, normal_mask(0xf0f0f0f00ff00ff1ull, 0x123456789abcdef1ull)},
      {"counter mode 2*lanes+37 (repeat field ignored)", 1, 1, 1, 1, 8, 8, 8,
       counter_mask(2 * lanes + 37)},
      {"src1 repeat stride 0 (same block every repeat), lo mask only", 4, 1, 1, 1, 8, 8, 0,
       normal_mask(0, 0xfedcba9876543210ull)},
      // Dense spans (one pass over the whole tile in the executor): long, and in place with a
      // count that is no multiple of a repeat.
      {"contiguous, full mask, 20 repeats", 20, 1, 1, 1, 8, 8, 8, VectorMask{}},
      {"in place (dst is src0), counter mode 9*lanes+5", 1, 1, 1, 1, 8, 8, 8,
       counter_mask(9 * lanes + 5), kSrc0},
  };
}

uint64_t repeats_of(const Geometry& g, int lanes) {
  return g.mask.counter_mode ? (g.mask.count + lanes - 1) / lanes : g.repeat;
}

// Reference of an element-wise function of (src0 bits, src1-or-scalar bits).
using RefFn = std::function<uint32_t(uint32_t, uint32_t)>;

// Runs `op` (type t) with geometry g and compares the whole UB with the reference image.
// nsrc: 1 (VUN/VSCL) or 2 (VBIN). scalar: the xscalar register value for VSCL.
// run: the sources come in runs of that many equal values (a broadcast operand's pattern).
void check_elementwise(Opcode op, Dtype t, const Geometry& g, int nsrc, const RefFn& ref,
                       std::optional<int64_t> scalar = std::nullopt, uint32_t seed = 1,
                       int run = 1) {
  const int size = isa::dtype_size(t), lanes = 256 / size;
  const uint64_t repeats = repeats_of(g, lanes);
  VecHarness h;
  h.randomize(seed);
  ValuePool pool(t, seed);
  uint32_t a = 0, b = 0;
  int left = 0;  // lanes still to take a and b
  for (uint64_t r = 0; r < repeats; ++r)
    for (int lane = 0; lane < lanes; ++lane) {
      if (left-- == 0) {
        a = pool.next();
        if (nsrc == 2) b = pool.next();
        left = run - 1;
      }
      h.put_elem(ref_lane_addr(kSrc0, g.src0_blk, g.src0_rep, size, r, lane), size, a);
      if (nsrc == 2)
        h.put_elem(ref_lane_addr(kSrc1, g.src1_blk, g.src1_rep, size, r, lane), size, b);
    }
  const std::vector<uint8_t> before = h.snapshot();

  VecOp o(op,
          {{"type", dt(t)},
           {"xdst", g.dst_at},
           {"repeat", g.repeat},
           {"dst_blk", g.dst_blk},
           {"dst_rep", g.dst_rep}},
          g.mask);
  if (nsrc == 2) {
    o.set("xsrc0", kSrc0).set("xsrc1", kSrc1).set("src0_blk", g.src0_blk);
    o.set("src1_blk", g.src1_blk).set("src0_rep", g.src0_rep).set("src1_rep", g.src1_rep);
  } else {
    o.set("xsrc", kSrc0).set("src_blk", g.src0_blk).set("src_rep", g.src0_rep);
  }
  if (scalar) o.set("xscalar", *scalar);
  ExecCost cost = h.run(o);
  CHECK(cost.vector_repeats == repeats);

  std::vector<uint8_t> expected = before;
  for (uint64_t r = 0; r < repeats; ++r)
    for (int lane = 0; lane < lanes; ++lane) {
      if (!ref_lane_active(g.mask, r, lanes, lane)) continue;
      uint32_t a =
          element_from(before, ref_lane_addr(kSrc0, g.src0_blk, g.src0_rep, size, r, lane), size);
      uint32_t b =
          nsrc == 2 ? element_from(
                          before, ref_lane_addr(kSrc1, g.src1_blk, g.src1_rep, size, r, lane), size)
                    : 0;
      element_to(expected, ref_lane_addr(g.dst_at, g.dst_blk, g.dst_rep, size, r, lane), size,
                 ref(a, b) & elem_mask(size));
    }
  const std::vector<uint8_t> after = h.snapshot();
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < after.size(); ++i)
    if (after[i] != expected[i] && mismatches++ == 0) first = i;
  INFO(isa::describe(op).mnemonic << "." << isa::dtype_name(t) << ", " << g.name);
  INFO("first mismatching UB byte " << first << ": got " << int(after[first]) << ", want "
                                    << int(expected[first]));
  CHECK(mismatches == 0);
}

uint32_t wrap(Dtype t, int64_t v) {
  return static_cast<uint32_t>(v) & elem_mask(isa::dtype_size(t));
}

// Max/min with the documented NaN rule: NaN if either operand is NaN, else the chosen operand's
// bits (the first one on ties).
uint32_t ref_float_select(Dtype t, uint32_t a, uint32_t b, bool max) {
  float x = ref_float_of(t, a), y = ref_float_of(t, b);
  if (std::isnan(x) || std::isnan(y)) return ref_float_bits(t, NAN);
  bool take_b = max ? x < y : y < x;
  return take_b ? b : a;
}

// Binary arithmetic of VBIN/VSCL, per type.
uint32_t ref_binary(Opcode op, Dtype t, uint32_t a, uint32_t b) {
  if (t == Dtype::F16) {
    _Float16 x = ref_f16(static_cast<uint16_t>(a)), y = ref_f16(static_cast<uint16_t>(b)), r = 0;
    switch (op) {
      case Opcode::op_vadd:
      case Opcode::op_vadds: r = x + y; break;
      case Opcode::op_vsub: r = x - y; break;
      case Opcode::op_vmul:
      case Opcode::op_vmuls: r = x * y; break;
      case Opcode::op_vdiv: r = x / y; break;
      case Opcode::op_vlrelu: r = x >= 0 ? x : x * y; break;
      case Opcode::op_vmax:
      case Opcode::op_vmaxs: return ref_float_select(t, a, b, true);
      case Opcode::op_vmin:
      case Opcode::op_vmins: return ref_float_select(t, a, b, false);
      default: FAIL("no f16 reference");
    }
    return ref_float_bits(t, static_cast<float>(r));  // NaN -> canonical
  }
  if (isa::dtype_is_float(t)) {  // f32, bf16: fp32 arithmetic, rounded once
    float x = ref_float_of(t, a), y = ref_float_of(t, b), r = 0;
    switch (op) {
      case Opcode::op_vadd:
      case Opcode::op_vadds: r = x + y; break;
      case Opcode::op_vsub: r = x - y; break;
      case Opcode::op_vmul:
      case Opcode::op_vmuls: r = x * y; break;
      case Opcode::op_vdiv: r = x / y; break;
      case Opcode::op_vlrelu: r = x >= 0 ? x : x * y; break;
      case Opcode::op_vmax:
      case Opcode::op_vmaxs: return ref_float_select(t, a, b, true);
      case Opcode::op_vmin:
      case Opcode::op_vmins: return ref_float_select(t, a, b, false);
      default: FAIL("no float reference");
    }
    return ref_float_bits(t, r);
  }
  int64_t x = ref_int_of(t, a), y = ref_int_of(t, b);
  switch (op) {
    case Opcode::op_vadd:
    case Opcode::op_vadds: return wrap(t, x + y);
    case Opcode::op_vsub: return wrap(t, x - y);
    case Opcode::op_vmul:
    case Opcode::op_vmuls: return wrap(t, x * y);
    case Opcode::op_vmax:
    case Opcode::op_vmaxs: return wrap(t, std::max(x, y));
    case Opcode::op_vmin:
    case Opcode::op_vmins: return wrap(t, std::min(x, y));
    case Opcode::op_vand: return a & b;
    case Opcode::op_vor: return a | b;
    default: FAIL("no integer reference"); return 0;
  }
}

uint32_t ref_unary(Opcode op, Dtype t, uint32_t a) {
  if (op == Opcode::op_vcopy) return a;
  if (isa::dtype_is_float(t)) {
    float x = ref_float_of(t, a), r = 0;
    switch (op) {
      case Opcode::op_vexp: r = std::exp(x); break;
      case Opcode::op_vln: r = std::log(x); break;
      case Opcode::op_vsqrt: r = std::sqrt(x); break;
      case Opcode::op_vrsqrt: r = 1.0f / std::sqrt(x); break;
      case Opcode::op_vrec: r = 1.0f / x; break;
      case Opcode::op_vabs: r = std::fabs(x); break;
      case Opcode::op_vrelu:
        if (std::isnan(x)) return ref_float_bits(t, NAN);
        return x < 0 ? 0u : a;  // relu(-0) = max(-0, 0) = -0: ties keep the first operand
      default: FAIL("no float reference");
    }
    return ref_float_bits(t, r);
  }
  int64_t x = ref_int_of(t, a);
  switch (op) {
    case Opcode::op_vabs: return wrap(t, x < 0 ? -x : x);
    case Opcode::op_vrelu: return wrap(t, x < 0 ? 0 : x);
    case Opcode::op_vnot: return ~a;
    default: FAIL("no integer reference"); return 0;
  }
}

const Dtype kFloats[] = {Dtype::F32, Dtype::F16, Dtype::BF16};
const Dtype kArith[] = {Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::S32, Dtype::S16, Dtype::U16};

}  // namespace

TEST_CASE("VBIN: add sub mul div max min and or, every type and operand layout") {
  struct Case {
    Opcode op;
    std::vector<Dtype> types;
  };
  const std::vector<Case> cases = {
      {Opcode::op_vadd, {std::begin(kArith), std::end(kArith)}},
      {Opcode::op_vsub, {std::begin(kArith), std::end(kArith)}},
      {Opcode::op_vmul, {std::begin(kArith), std::end(kArith)}},
      {Opcode::op_vdiv, {std::begin(kFloats), std::end(kFloats)}},
      {Opcode::op_vmax, {std::begin(kArith), std::end(kArith)}},
      {Opcode::op_vmin, {std::begin(kArith), std::end(kArith)}},
      {Opcode::op_vand, {Dtype::S16, Dtype::U16}},
      {Opcode::op_vor, {Dtype::S16, Dtype::U16}},
  };
  uint32_t seed = 1;
  for (const Case& c : cases)
    for (Dtype t : c.types)
      for (const Geometry& g : geometries(256 / isa::dtype_size(t)))
        check_elementwise(
            c.op, t, g, 2, [&](uint32_t a, uint32_t b) { return ref_binary(c.op, t, a, b); },
            std::nullopt, seed++);
}

TEST_CASE("VUN: exp ln sqrt rsqrt rec abs relu not copy, every type and operand layout") {
  struct Case {
    Opcode op;
    std::vector<Dtype> types;
  };
  const std::vector<Case> cases = {
      {Opcode::op_vexp, {std::begin(kFloats), std::end(kFloats)}},
      {Opcode::op_vln, {std::begin(kFloats), std::end(kFloats)}},
      {Opcode::op_vsqrt, {std::begin(kFloats), std::end(kFloats)}},
      {Opcode::op_vrsqrt, {std::begin(kFloats), std::end(kFloats)}},
      {Opcode::op_vrec, {std::begin(kFloats), std::end(kFloats)}},
      {Opcode::op_vabs, {Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::S32, Dtype::S16}},
      {Opcode::op_vrelu, {Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::S32, Dtype::S16}},
      {Opcode::op_vnot, {Dtype::S16, Dtype::U16}},
      {Opcode::op_vcopy, {std::begin(kArith), std::end(kArith)}},
  };
  uint32_t seed = 100;
  for (const Case& c : cases)
    for (Dtype t : c.types)
      for (const Geometry& g : geometries(256 / isa::dtype_size(t)))
        check_elementwise(
            c.op, t, g, 1, [&](uint32_t a, uint32_t) { return ref_unary(c.op, t, a); },
            std::nullopt, seed++);
}

TEST_CASE("VUN: exp ln sqrt rsqrt rec on sources in runs of equal values (broadcasts)") {
  const Opcode ops[] = {Opcode::op_vexp, Opcode::op_vln, Opcode::op_vsqrt, Opcode::op_vrsqrt,
                        Opcode::op_vrec};
  uint32_t seed = 150;
  for (Opcode op : ops)
    for (Dtype t : kFloats)
      for (const Geometry& g : geometries(256 / isa::dtype_size(t)))
        for (int run : {3, 70})  // across blocks and repeats; longer than an f32 repeat
          check_elementwise(
              op, t, g, 1, [&](uint32_t a, uint32_t) { return ref_unary(op, t, a); }, std::nullopt,
              seed++, run);
}

TEST_CASE("VSCL: adds muls maxs mins lrelu, scalar rounded to the type") {
  struct Case {
    Opcode op;
    std::vector<Dtype> types;
  };
  const std::vector<Case> cases = {
      {Opcode::op_vadds, {std::begin(kArith), std::end(kArith)}},
      {Opcode::op_vmuls, {std::begin(kArith), std::end(kArith)}},
      {Opcode::op_vmaxs, {std::begin(kArith), std::end(kArith)}},
      {Opcode::op_vmins, {std::begin(kArith), std::end(kArith)}},
      {Opcode::op_vlrelu, {std::begin(kFloats), std::end(kFloats)}},
  };
  // Float scalars (fp32 bits): 0.1 is inexact in f16 and bf16; 2049 is an f16 tie (-> 2048);
  // integer scalars wrap to the type (70000 -> 4464 as s16/u16).
  const float float_scalars[] = {0.1f, -2.5f, 2049.0f};
  const int64_t int_scalars[] = {-3, 7, 70000};
  uint32_t seed = 200;
  for (const Case& c : cases)
    for (Dtype t : c.types)
      for (int k = 0; k < 3; ++k) {
        int64_t reg =
            isa::dtype_is_float(t) ? int64_t{ref_f32_bits(float_scalars[k])} : int_scalars[k];
        uint32_t s = isa::dtype_is_float(t)
                         ? ref_float_bits(t, float_scalars[k])
                         : static_cast<uint32_t>(reg) & elem_mask(isa::dtype_size(t));
        const Geometry g = geometries(256 / isa::dtype_size(t))[k];
        check_elementwise(
            c.op, t, g, 1, [&](uint32_t a, uint32_t) { return ref_binary(c.op, t, a, s); }, reg,
            seed++);
      }
}

namespace {

// One binary op on lane 0 of one repeat: a and b (the type's bits) in, the result's bits out.
uint32_t run_one_lane(VecHarness& h, Opcode op, Dtype t, uint32_t a, uint32_t b) {
  const int size = isa::dtype_size(t);
  h.put_elem(kSrc0, size, a);
  h.put_elem(kSrc1, size, b);
  VecOp o(op,
          {{"type", dt(t)},
           {"xdst", kDst},
           {"xsrc0", kSrc0},
           {"xsrc1", kSrc1},
           {"repeat", 1},
           {"dst_blk", 1},
           {"src0_blk", 1},
           {"src1_blk", 1},
           {"dst_rep", 8},
           {"src0_rep", 8},
           {"src1_rep", 8}},
          normal_mask(0, 1));
  h.run(o);
  return h.get_elem(kDst, size);
}

}  // namespace

TEST_CASE("fp16 and bf16 arithmetic rounds once to nearest even") {
  VecHarness h;
  auto run2 = [&](Opcode op, Dtype t, uint32_t a, uint32_t b) {
    return run_one_lane(h, op, t, a, b);
  };
  // f16 (10 fraction bits): 2048 (0x6800) + 1 (0x3c00) = 2049, a tie between 2048 and 2050
  // -> even 2048; 2048 + 3 (0x4200) = 2051, a tie -> 2052 (0x6802).
  CHECK(run2(Opcode::op_vadd, Dtype::F16, 0x6800, 0x3c00) == 0x6800);
  CHECK(run2(Opcode::op_vadd, Dtype::F16, 0x6800, 0x4200) == 0x6802);
  // 65504 (0x7bff) + 65504 overflows to inf (0x7c00); inf - inf is NaN -> canonical 0x7e00.
  CHECK(run2(Opcode::op_vadd, Dtype::F16, 0x7bff, 0x7bff) == 0x7c00);
  CHECK(run2(Opcode::op_vsub, Dtype::F16, 0x7c00, 0x7c00) == 0x7e00);
  // Subnormals: 2^-24 (0x0001) * 0.5 (0x3800) = 2^-25, a tie with 0 -> +0; 3*2^-24 (0x0003)
  // * 0.5 = 1.5*2^-24, a tie between 1 and 2 ulps -> 2 (0x0002); 2^-14 (0x0400) - 2^-24 =
  // the largest subnormal 0x03ff.
  CHECK(run2(Opcode::op_vmul, Dtype::F16, 0x0001, 0x3800) == 0x0000);
  CHECK(run2(Opcode::op_vmul, Dtype::F16, 0x0003, 0x3800) == 0x0002);
  CHECK(run2(Opcode::op_vsub, Dtype::F16, 0x0400, 0x0001) == 0x03ff);
  // 1/3 in f16: 0x3555 (0.33325195), the nearest of 0x3555 and 0x3556.
  CHECK(run2(Opcode::op_vdiv, Dtype::F16, 0x3c00, 0x4200) == 0x3555);
  // bf16 (7 fraction bits): 1 (0x3f80) + 2^-8 (0x3b80) is a tie -> 1; 1 + 3*2^-8 (0x3c40)
  // ties to 1 + 2^-6 (0x3f82); max (0x7f7f) * 2 (0x4000) -> inf 0x7f80.
  CHECK(run2(Opcode::op_vadd, Dtype::BF16, 0x3f80, 0x3b80) == 0x3f80);
  CHECK(run2(Opcode::op_vadd, Dtype::BF16, 0x3f80, 0x3c40) == 0x3f82);
  CHECK(run2(Opcode::op_vmul, Dtype::BF16, 0x7f7f, 0x4000) == 0x7f80);
  CHECK(run2(Opcode::op_vmax, Dtype::BF16, 0x7fc1, 0x3f80) == 0x7fc0);  // NaN -> canonical
}

TEST_CASE("integer arithmetic wraps") {
  VecHarness h;
  auto run2 = [&](Opcode op, Dtype t, uint32_t a, uint32_t b) {
    return run_one_lane(h, op, t, a, b);
  };
  CHECK(run2(Opcode::op_vadd, Dtype::S16, 32767, 1) == 0x8000);  // -32768
  CHECK(run2(Opcode::op_vmul, Dtype::U16, 65535, 65535) == 1);   // (2^16-1)^2 mod 2^16
  CHECK(run2(Opcode::op_vsub, Dtype::S32, 0x80000000u, 1) == 0x7fffffffu);
  CHECK(run2(Opcode::op_vmax, Dtype::U16, 0x8000, 0x7fff) == 0x8000);  // unsigned compare
  CHECK(run2(Opcode::op_vmax, Dtype::S16, 0x8000, 0x7fff) == 0x7fff);  // signed compare
}
