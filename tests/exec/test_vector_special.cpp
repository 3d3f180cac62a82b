// vcmp, vsel, vcadd/vcmax/vcmin, vconv, vdup and vtranspose against references written here
// (brief's lane addressing and masks; _Float16 / hand-rounded bf16; test_convert_ref.h for
// conversions). Whole-UB comparisons check that nothing else is written.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tests/exec/test_convert_ref.h"
#include "tests/exec/test_vector_util.h"

using namespace npusim;
using namespace npusim::test;
using isa::Dtype;
using isa::Opcode;

namespace {

constexpr uint64_t kDst = 0x0000, kSrc0 = 0x8000, kSrc1 = 0x10000, kSel = 0x18000;
const Dtype kArith[] = {Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::S32, Dtype::S16, Dtype::U16};

struct Layout {
  std::string name;
  int64_t repeat;
  int64_t dst_blk, src0_blk, src1_blk, dst_rep, src0_rep, src1_rep;
  VectorMask mask;
};
std::vector<Layout> layouts(int lanes) {
  return {
      {"contiguous, full mask, 3 repeats", 3, 1, 1, 1, 8, 8, 8, VectorMask{}},
      {"strided, partial mask, 5 repeats", 5, 3, 2, 1, 24, 17, 9,
       normal_mask(0x0123456789abcdefull, 0xfedcba9876543210ull)},
      {"counter mode", 7, 1, 1, 1, 8, 8, 8, counter_mask(2 * lanes + 5)},
  };
}
uint64_t repeats_of(const Layout& l, int lanes) {
  return l.mask.counter_mode ? (l.mask.count + lanes - 1) / lanes : l.repeat;
}

void check_image(VecHarness& h, const std::vector<uint8_t>& expected, const std::string& what) {
  const std::vector<uint8_t> after = h.snapshot();
  size_t mismatches = 0, first = 0;
  for (size_t i = 0; i < after.size(); ++i)
    if (after[i] != expected[i] && mismatches++ == 0) first = i;
  INFO(what);
  INFO("first mismatching UB byte " << first << ": got " << int(after[first]) << ", want "
                                    << int(expected[first]));
  CHECK(mismatches == 0);
}

bool ref_compare(isa::Cmp c, Dtype t, uint32_t a, uint32_t b) {
  double x, y;  // exact for every type
  if (isa::dtype_is_float(t)) x = ref_float_of(t, a), y = ref_float_of(t, b);
  else x = static_cast<double>(ref_int_of(t, a)), y = static_cast<double>(ref_int_of(t, b));
  switch (c) {
    case isa::Cmp::EQ: return x == y;
    case isa::Cmp::NE: return x != y;
    case isa::Cmp::LT: return x < y;
    case isa::Cmp::GT: return x > y;
    case isa::Cmp::LE: return x <= y;
    case isa::Cmp::GE: return x >= y;
  }
  return false;
}

}  // namespace

TEST_CASE("vcmp: one bit per active lane, 0 for inactive lanes, every comparison and type") {
  uint32_t seed = 1;
  for (Dtype t : kArith) {
    const int size = isa::dtype_size(t), lanes = 256 / size;
    for (const Layout& l : layouts(lanes)) {
      for (int c = 0; c <= static_cast<int>(isa::Cmp::GE); ++c) {
        VecHarness h;
        h.randomize(seed);
        ValuePool pool(t, seed++);
        const uint64_t repeats = repeats_of(l, lanes);
        for (uint64_t r = 0; r < repeats; ++r)
          for (int lane = 0; lane < lanes; ++lane) {
            uint32_t a = pool.next();
            // Every third lane compares equal values (NaN included).
            uint32_t b = lane % 3 == 0 ? a : pool.next();
            h.put_elem(ref_lane_addr(kSrc0, l.src0_blk, l.src0_rep, size, r, lane), size, a);
            h.put_elem(ref_lane_addr(kSrc1, l.src1_blk, l.src1_rep, size, r, lane), size, b);
          }
        std::vector<uint8_t> expected = h.snapshot();
        VecOp o(Opcode::op_vcmp,
                {{"type", dt(t)}, {"cmp", c}, {"xdst", kDst}, {"xsrc0", kSrc0}, {"xsrc1", kSrc1},
                 {"repeat", l.repeat}, {"src0_blk", l.src0_blk}, {"src1_blk", l.src1_blk},
                 {"src0_rep", l.src0_rep}, {"src1_rep", l.src1_rep}},
                l.mask);
        ExecCost cost = h.run(o);
        // Repeat r's bits at dst + r*lanes/8: lane i is bit i%8 of byte i/8.
        for (uint64_t r = 0; r < repeats; ++r)
          for (int lane = 0; lane < lanes; ++lane) {
            uint64_t byte = kDst + r * lanes / 8 + lane / 8;
            if (lane % 8 == 0) expected[byte] = 0;
            uint64_t a_at = ref_lane_addr(kSrc0, l.src0_blk, l.src0_rep, size, r, lane);
            uint64_t b_at = ref_lane_addr(kSrc1, l.src1_blk, l.src1_rep, size, r, lane);
            uint32_t a = element_from(expected, a_at, size), b = element_from(expected, b_at, size);
            if (ref_lane_active(l.mask, r, lanes, lane) &&
                ref_compare(static_cast<isa::Cmp>(c), t, a, b))
              expected[byte] |= static_cast<uint8_t>(1u << (lane % 8));
          }
        check_image(h, expected,
                    std::string("vcmp.") + isa::cmp_name(static_cast<isa::Cmp>(c)) + "." +
                        isa::dtype_name(t) + ", " + l.name);
        CHECK(cost.bytes == repeats * lanes / 8);
      }
    }
  }
}

TEST_CASE("vsel in place: dst is src0 or src1, every type") {
  uint32_t seed = 70;
  for (Dtype t : kArith)
    for (int into = 1; into <= 2; ++into) {
      const int size = isa::dtype_size(t), lanes = 256 / size;
      const uint64_t at = into == 1 ? kSrc0 : kSrc1;
      VecHarness h;
      h.randomize(seed++);
      const std::vector<uint8_t> before = h.snapshot();
      VecOp o(Opcode::op_vsel,
              {{"type", dt(t)}, {"xdst", static_cast<int64_t>(at)}, {"xsrc0", kSrc0},
               {"xsrc1", kSrc1}, {"xsel", kSel}, {"repeat", 2}, {"dst_blk", 1}, {"src0_blk", 1},
               {"src1_blk", 1}, {"dst_rep", 8}, {"src0_rep", 8}, {"src1_rep", 8}},
              VectorMask{});
      h.run(o);
      std::vector<uint8_t> expected = before;
      for (uint64_t r = 0; r < 2; ++r)
        for (int lane = 0; lane < lanes; ++lane) {
          const bool bit = (before[kSel + r * lanes / 8 + lane / 8] >> (lane % 8)) & 1;
          const uint64_t off = r * 256 + static_cast<uint64_t>(lane * size);
          element_to(expected, at + off, size,
                     element_from(before, (bit ? kSrc0 : kSrc1) + off, size));
        }
      check_image(h, expected,
                  std::string("vsel in place.") + isa::dtype_name(t) + " into src" +
                      std::to_string(into - 1));
    }
}

TEST_CASE("vcmp of NaN: only ne is true") {
  VecHarness h;
  h.put<uint16_t>(kSrc0, 0x7e01);  // f16 NaN
  h.put<uint16_t>(kSrc1, 0x7e01);
  for (int c = 0; c <= static_cast<int>(isa::Cmp::GE); ++c) {
    VecOp o(Opcode::op_vcmp,
            {{"type", dt(Dtype::F16)}, {"cmp", c}, {"xdst", kDst}, {"xsrc0", kSrc0},
             {"xsrc1", kSrc1}, {"repeat", 1}, {"src0_blk", 1}, {"src1_blk", 1}, {"src0_rep", 8},
             {"src1_rep", 8}},
            normal_mask(0, 1));
    h.run(o);
    CHECK(h.get<uint8_t>(kDst) == (static_cast<isa::Cmp>(c) == isa::Cmp::NE ? 1 : 0));
  }
}

TEST_CASE("vsel: dst = selector bit ? src0 : src1 on active lanes, bits kept") {
  uint32_t seed = 50;
  for (Dtype t : kArith) {
    const int size = isa::dtype_size(t), lanes = 256 / size;
    for (const Layout& l : layouts(lanes)) {
      VecHarness h;
      h.randomize(seed++);  // random selector bits at kSel and random (NaN-rich) sources
      const std::vector<uint8_t> before = h.snapshot();
      VecOp o(Opcode::op_vsel,
              {{"type", dt(t)}, {"xdst", kDst}, {"xsrc0", kSrc0}, {"xsrc1", kSrc1},
               {"xsel", kSel}, {"repeat", l.repeat}, {"dst_blk", l.dst_blk},
               {"src0_blk", l.src0_blk}, {"src1_blk", l.src1_blk}, {"dst_rep", l.dst_rep},
               {"src0_rep", l.src0_rep}, {"src1_rep", l.src1_rep}},
              l.mask);
      h.run(o);
      std::vector<uint8_t> expected = before;
      const uint64_t repeats = repeats_of(l, lanes);
      for (uint64_t r = 0; r < repeats; ++r)
        for (int lane = 0; lane < lanes; ++lane) {
          if (!ref_lane_active(l.mask, r, lanes, lane)) continue;
          bool bit = (before[kSel + r * lanes / 8 + lane / 8] >> (lane % 8)) & 1;
          uint64_t src = bit ? ref_lane_addr(kSrc0, l.src0_blk, l.src0_rep, size, r, lane)
                             : ref_lane_addr(kSrc1, l.src1_blk, l.src1_rep, size, r, lane);
          element_to(expected, ref_lane_addr(kDst, l.dst_blk, l.dst_rep, size, r, lane), size,
                     element_from(before, src, size));
        }
      check_image(h, expected, std::string("vsel.") + isa::dtype_name(t) + ", " + l.name);
    }
  }
}

namespace {

// Reference reductions: active lanes in lane order, accumulated in fp32 (floats) or wrapping
// int64 (integers), the result rounded once; identities for repeats without active lanes.
uint32_t ref_reduce(Opcode op, Dtype t, const std::vector<uint32_t>& active_values) {
  const int size = isa::dtype_size(t);
  if (isa::dtype_is_float(t)) {
    float acc = op == Opcode::op_vcadd ? 0.0f : op == Opcode::op_vcmax ? -INFINITY : INFINITY;
    bool nan = false;
    for (uint32_t v : active_values) {
      float x = ref_float_of(t, v);
      if (op == Opcode::op_vcadd) acc += x;
      else if (std::isnan(x)) nan = true;
      else acc = op == Opcode::op_vcmax ? std::max(acc, x) : std::min(acc, x);
    }
    return ref_float_bits(t, nan ? NAN : acc);
  }
  int64_t lo = t == Dtype::S32 ? INT32_MIN : t == Dtype::S16 ? INT16_MIN : 0;
  int64_t hi = t == Dtype::S32 ? INT32_MAX : t == Dtype::S16 ? INT16_MAX : UINT16_MAX;
  int64_t acc = op == Opcode::op_vcadd ? 0 : op == Opcode::op_vcmax ? lo : hi;
  for (uint32_t v : active_values) {
    int64_t x = ref_int_of(t, v);
    acc = op == Opcode::op_vcadd ? acc + x : op == Opcode::op_vcmax ? std::max(acc, x)
                                                                     : std::min(acc, x);
  }
  return static_cast<uint32_t>(acc) & elem_mask(size);
}

}  // namespace

TEST_CASE("vcadd vcmax vcmin: one result per repeat over the active lanes") {
  uint32_t seed = 70;
  for (Opcode op : {Opcode::op_vcadd, Opcode::op_vcmax, Opcode::op_vcmin}) {
    for (Dtype t : kArith) {
      const int size = isa::dtype_size(t), lanes = 256 / size;
      std::vector<Layout> ls = layouts(lanes);
      ls.push_back({"no active lane (identity results)", 2, 1, 1, 1, 8, 8, 8, normal_mask(0, 0)});
      for (const Layout& l : ls) {
        for (bool tame : {false, true}) {  // tame: finite moderate values, so sums are tested
          VecHarness h;
          h.randomize(seed);
          ValuePool pool(t, seed++);
          const uint64_t repeats = repeats_of(l, lanes);
          for (uint64_t r = 0; r < repeats; ++r)
            for (int lane = 0; lane < lanes; ++lane) {
              uint32_t v = pool.next();
              if (tame && isa::dtype_is_float(t))
                v = ref_float_bits(t, static_cast<float>((lane * 37 + r * 11) % 101) / 8 - 6);
              h.put_elem(ref_lane_addr(kSrc0, l.src0_blk, l.src0_rep, size, r, lane), size, v);
            }
          std::vector<uint8_t> expected = h.snapshot();
          VecOp o(op, {{"type", dt(t)}, {"xdst", kDst}, {"xsrc", kSrc0}, {"repeat", l.repeat},
                       {"src_blk", l.src0_blk}, {"src_rep", l.src0_rep}},
                  l.mask);
          ExecCost cost = h.run(o);
          for (uint64_t r = 0; r < repeats; ++r) {
            std::vector<uint32_t> values;
            for (int lane = 0; lane < lanes; ++lane)
              if (ref_lane_active(l.mask, r, lanes, lane))
                values.push_back(element_from(
                    expected, ref_lane_addr(kSrc0, l.src0_blk, l.src0_rep, size, r, lane), size));
            element_to(expected, kDst + r * size, size, ref_reduce(op, t, values));
          }
          check_image(h, expected,
                      std::string(isa::describe(op).mnemonic) + "." + isa::dtype_name(t) + ", " +
                          l.name + (tame ? ", moderate values" : ", random values"));
          CHECK(cost.bytes == repeats * size);
        }
      }
    }
  }
  // Identities by hand: f16 vcmax of nothing is -inf (0xfc00), s16 vcmin is 32767, vcadd 0.
  CHECK(ref_reduce(Opcode::op_vcmax, Dtype::F16, {}) == 0xfc00);
  CHECK(ref_reduce(Opcode::op_vcmin, Dtype::S16, {}) == 0x7fff);
}

// Sources come in runs of `run` equal values (run 1: every lane its own), as a broadcast
// operand gives: the executor reuses a lane's result for the next lane with the same bits.
void check_vconv_all(int run) {
  const Dtype types[] = {Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::S32,
                         Dtype::S16, Dtype::S8,  Dtype::U8,   Dtype::U16};
  uint32_t seed = 300;
  for (Dtype to : types)
    for (Dtype from : types) {
      const int dsize = isa::dtype_size(to), ssize = isa::dtype_size(from);
      if (dsize == 1 && ssize == 1) continue;  // unsupported (fault test elsewhere)
      const int lanes = 256 / std::max(dsize, ssize);
      for (int mode = 0; mode < 5; ++mode) {
        // Contiguous layouts: each operand's repeat stride is its bytes per repeat in blocks.
        // Odd modes also use block strides 2 / 1 and a partial mask; mode 4 counter mode.
        const bool strided = mode % 2 == 1;
        const int64_t dst_blk = strided ? 2 : 1, src_blk = 1;
        const int64_t dst_rep = lanes * dsize / 32 * dst_blk, src_rep = lanes * ssize / 32;
        VectorMask mask = strided ? normal_mask(0xaaaa5555aaaa5555ull, 0x0123456789abcdefull)
                                  : mode == 4 ? counter_mask(2 * lanes + 3) : VectorMask{};
        const int64_t repeat = 3;
        const uint64_t repeats = mask.counter_mode ? 3 : repeat;
        VecHarness h;
        h.randomize(seed);
        ValuePool pool(from, seed++);
        uint32_t value = 0;
        int left = 0;  // lanes still to take `value`
        for (uint64_t r = 0; r < repeats; ++r)
          for (int lane = 0; lane < lanes; ++lane) {
            if (left-- == 0) value = pool.next(), left = run - 1;
            h.put_elem(ref_lane_addr(kSrc0, src_blk, src_rep, ssize, r, lane), ssize, value);
          }
        const std::vector<uint8_t> before = h.snapshot();
        VecOp o(Opcode::op_vconv,
                {{"dst_type", dt(to)}, {"src_type", dt(from)}, {"xdst", kDst}, {"xsrc", kSrc0},
                 {"repeat", repeat}, {"dst_blk", dst_blk}, {"src_blk", src_blk},
                 {"dst_rep", dst_rep}, {"src_rep", src_rep}, {"round", mode}},
                mask);
        ExecCost cost = h.run(o);
        std::vector<uint8_t> expected = before;
        uint64_t active = 0;
        for (uint64_t r = 0; r < repeats; ++r)
          for (int lane = 0; lane < lanes; ++lane) {
            if (!ref_lane_active(mask, r, lanes, lane)) continue;
            ++active;
            uint32_t s = element_from(
                before, ref_lane_addr(kSrc0, src_blk, src_rep, ssize, r, lane), ssize);
            element_to(expected, ref_lane_addr(kDst, dst_blk, dst_rep, dsize, r, lane), dsize,
                       ref_convert(to, from, s, static_cast<RefRound>(mode)));
          }
        check_image(h, expected,
                    std::string("vconv ") + isa::dtype_name(from) + " -> " + isa::dtype_name(to) +
                        " round " + std::to_string(mode) + ", runs of " + std::to_string(run));
        CHECK(cost.bytes == active * dsize);
      }
    }
}

TEST_CASE("vconv: every type pair and rounding mode, lanes = 256 / wider size") {
  check_vconv_all(1);
}

TEST_CASE("vconv: sources in runs of equal values (broadcast operands)") {
  check_vconv_all(3);   // runs across blocks and repeats
  check_vconv_all(70);  // longer than an f32 repeat
}

TEST_CASE("vconv f32 -> f16 over overlapping operands keeps the repeat-by-repeat order") {
  // Contiguous operands (a whole tile converted in one pass when they do not overlap,
  // vector.cpp) whose ranges overlap: each repeat reads its 64 f32 before writing its 64 f16.
  // Destination 64 bytes past the source: repeat 0 converts its own 64 values although its
  // results land on its source's third 32-byte block (a pass 8 values at a time would read
  // them converted); 384 bytes past: repeat 0 overwrites half of repeat 1's source, which
  // repeat 1 then reads as f32; 0: in place.
  const int lanes = 64;
  const int64_t repeats = 4;
  for (uint64_t shift : {0u, 64u, 384u}) {
    VecHarness h;
    h.randomize(800 + shift);
    ValuePool pool(Dtype::F32, 900 + shift);
    for (int i = 0; i < lanes * repeats; ++i) h.put_elem(kSrc0 + 4 * i, 4, pool.next());
    std::vector<uint8_t> expected = h.snapshot();
    const uint64_t dst = kSrc0 + shift;
    for (int64_t r = 0; r < repeats; ++r) {
      uint32_t in[lanes];
      for (int i = 0; i < lanes; ++i)
        in[i] = element_from(expected, kSrc0 + (r * lanes + i) * 4, 4);
      for (int i = 0; i < lanes; ++i)
        element_to(expected, dst + (r * lanes + i) * 2, 2,
                   ref_convert(Dtype::F16, Dtype::F32, in[i], RefRound::kRint));
    }
    VecOp o(Opcode::op_vconv,
            {{"dst_type", dt(Dtype::F16)}, {"src_type", dt(Dtype::F32)}, {"xdst", int64_t(dst)},
             {"xsrc", kSrc0}, {"repeat", repeats}, {"dst_blk", 1}, {"src_blk", 1},
             {"dst_rep", 4}, {"src_rep", 8}, {"round", 0}},
            VectorMask{});
    h.run(o);
    check_image(h, expected, "vconv f32 -> f16, destination " + std::to_string(shift) +
                                 " bytes past the source");
  }
}

TEST_CASE("vdup: the scalar, rounded to the type, on active lanes") {
  uint32_t seed = 500;
  const float fval = 0.1f;  // inexact in f16 and bf16
  for (Dtype t : kArith) {
    const int size = isa::dtype_size(t), lanes = 256 / size;
    for (const Layout& l : layouts(lanes)) {
      const int64_t reg = isa::dtype_is_float(t) ? int64_t{ref_f32_bits(fval)} : int64_t{-70001};
      const uint32_t value = isa::dtype_is_float(t) ? ref_float_bits(t, fval)
                                                    : static_cast<uint32_t>(reg) & elem_mask(size);
      VecHarness h;
      h.randomize(seed++);
      std::vector<uint8_t> expected = h.snapshot();
      VecOp o(Opcode::op_vdup,
              {{"type", dt(t)}, {"xdst", kDst}, {"xscalar", reg}, {"repeat", l.repeat},
               {"dst_blk", l.dst_blk}, {"dst_rep", l.dst_rep}},
              l.mask);
      h.run(o);
      for (uint64_t r = 0; r < repeats_of(l, lanes); ++r)
        for (int lane = 0; lane < lanes; ++lane)
          if (ref_lane_active(l.mask, r, lanes, lane))
            element_to(expected, ref_lane_addr(kDst, l.dst_blk, l.dst_rep, size, r, lane), size,
                       value);
      check_image(h, expected, std::string("vdup.") + isa::dtype_name(t) + ", " + l.name);
    }
  }
  // f32 vdup keeps the register's bits, even a NaN payload.
  VecHarness h;
  VecOp o(Opcode::op_vdup, {{"type", dt(Dtype::F32)}, {"xdst", kDst}, {"xscalar", 0x7f800001},
                            {"repeat", 1}, {"dst_blk", 1}, {"dst_rep", 8}});
  h.run(o);
  CHECK(h.get<uint32_t>(kDst + 4 * 63) == 0x7f800001u);
}

TEST_CASE("vtranspose: 16x16 two-byte elements, also in place, mask ignored") {
  for (bool in_place : {false, true}) {
    VecHarness h;
    h.randomize(in_place ? 2 : 1);
    const uint64_t src = kSrc0, dst = in_place ? kSrc0 : kDst;
    std::vector<uint8_t> expected = h.snapshot();
    const std::vector<uint8_t> before = expected;
    VecOp o(Opcode::op_vtranspose, {{"xdst", dst}, {"xsrc", src}}, normal_mask(0, 1));
    ExecCost cost = h.run(o);
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j)
        element_to(expected, dst + (j * 16 + i) * 2, 2,
                   element_from(before, src + (i * 16 + j) * 2, 2));
    check_image(h, expected, in_place ? "in place" : "separate");
    CHECK(cost.bytes == 512);
    CHECK(cost.vector_repeats == 2);
  }
}

namespace {

// vaddreluconv's reference: the f32 sum, ReLU (a NaN stays NaN, -0 stays -0), rounded to f16 to
// nearest even by _Float16, then saturated: an infinite f16 becomes 65504 (0x7bff).
uint16_t ref_add_relu_conv(uint32_t a_bits, uint32_t b_bits) {
  const float sum = ref_f32(a_bits) + ref_f32(b_bits);
  if (std::isnan(sum)) return 0x7e00u;
  const float relu = sum < 0.0f ? 0.0f : sum;
  const uint16_t h = ref_f16_bits(static_cast<_Float16>(relu));
  return (h & 0x7fffu) == 0x7c00u ? static_cast<uint16_t>((h & 0x8000u) | 0x7bffu) : h;
}

}  // namespace

TEST_CASE("vaddreluconv: f16(max(a + b, 0)) rounded to nearest even, saturating, active lanes") {
  const int lanes = 64;  // 256 / max(4, 2)
  // Specials: ties to even (1 + 2^-11 -> 1, 1 + 3 * 2^-11 -> 1 + 2^-9), the largest finite f16
  // and the sums past it (65519 rounds to 65504, 65520 and +inf saturate to 65504), negatives,
  // -0, NaN, an f16 subnormal and f32 values below the f16 range.
  const float specials[] = {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 65504.0f, 65519.0f, 65520.0f,
                            1e6f, INFINITY, -INFINITY, -3.5f, -0.0f, NAN, 0x1p-20f, 0x1p-30f,
                            6.0f, 5.99f, -1e-3f};
  int li = 0;
  for (const Layout& l : layouts(lanes)) {
    VecHarness h;
    h.cfg.vector_add_relu_conv = true;
    h.randomize(1700 + li);
    ValuePool pool(Dtype::F32, 1800 + li++);
    const uint64_t repeats = repeats_of(l, lanes);
    // Sources: random f32 patterns, with the specials against a zero in the other source.
    int k = 0;
    for (uint64_t r = 0; r < repeats; ++r)
      for (int i = 0; i < lanes; ++i) {
        const uint64_t a = ref_lane_addr(kSrc0, l.src0_blk, l.src0_rep, 4, r, i);
        const uint64_t b = ref_lane_addr(kSrc1, l.src1_blk, l.src1_rep, 4, r, i);
        if (k < static_cast<int>(std::size(specials)) && i % 3 == 0) {
          h.put_elem(a, 4, ref_f32_bits(specials[k++]));
          h.put_elem(b, 4, ref_f32_bits(0.0f));
        } else {
          h.put_elem(a, 4, pool.next());
          h.put_elem(b, 4, pool.next());
        }
      }
    std::vector<uint8_t> expected = h.snapshot();
    for (uint64_t r = 0; r < repeats; ++r)
      for (int i = 0; i < lanes; ++i) {
        if (!ref_lane_active(l.mask, r, lanes, i)) continue;
        const uint32_t a =
            element_from(expected, ref_lane_addr(kSrc0, l.src0_blk, l.src0_rep, 4, r, i), 4);
        const uint32_t b =
            element_from(expected, ref_lane_addr(kSrc1, l.src1_blk, l.src1_rep, 4, r, i), 4);
        element_to(expected, ref_lane_addr(kDst, l.dst_blk, l.dst_rep, 2, r, i), 2,
                   ref_add_relu_conv(a, b));
      }
    VecOp o(Opcode::op_vaddreluconv,
            {{"dst_type", dt(Dtype::F16)}, {"src_type", dt(Dtype::F32)}, {"xdst", int64_t(kDst)},
             {"xsrc0", int64_t(kSrc0)}, {"xsrc1", int64_t(kSrc1)}, {"repeat", l.repeat},
             {"dst_blk", l.dst_blk}, {"src0_blk", l.src0_blk}, {"src1_blk", l.src1_blk},
             {"dst_rep", l.dst_rep}, {"src0_rep", l.src0_rep}, {"src1_rep", l.src1_rep}},
            l.mask);
    const ExecCost c = h.run(o);
    CHECK(c.vector_repeats == repeats);
    check_image(h, expected, "vaddreluconv, " + l.name);
  }
  // Spot values of the reference itself (independent of the pool): ties, saturation, NaN.
  CHECK(ref_add_relu_conv(ref_f32_bits(1.0f + 0x1p-11f), 0) == 0x3c00u);          // 1
  CHECK(ref_add_relu_conv(ref_f32_bits(1.0f + 3 * 0x1p-11f), 0) == 0x3c02u);      // 1 + 2^-9
  CHECK(ref_add_relu_conv(ref_f32_bits(65520.0f), 0) == 0x7bffu);                 // 65504
  CHECK(ref_add_relu_conv(ref_f32_bits(-2.0f), ref_f32_bits(1.0f)) == 0x0000u);   // +0
}

TEST_CASE("vaddreluconv: an f32 add's repeat cost; refused on a chip without it") {
  VecHarness h;
  h.cfg.vector_add_relu_conv = true;
  h.cfg.ub_banks = 0;  // no bank conflicts: latency + one cycle per 256-byte repeat
  auto op = [] {
    return VecOp(Opcode::op_vaddreluconv,
                 {{"dst_type", dt(Dtype::F16)}, {"src_type", dt(Dtype::F32)}, {"xdst", 0},
                  {"xsrc0", int64_t(kSrc0)}, {"xsrc1", int64_t(kSrc1)}, {"repeat", 10},
                  {"dst_blk", 1}, {"src0_blk", 1}, {"src1_blk", 1}, {"dst_rep", 4},
                  {"src0_rep", 8}, {"src1_rep", 8}});
  };
  VecOp a = op();
  const uint64_t per_repeat =
      (256 + h.cfg.vector_bytes_per_cycle - 1) / h.cfg.vector_bytes_per_cycle;
  CHECK(plan(a.issued(), h.ctx).cycles ==
        static_cast<uint64_t>(h.cfg.vector_latency_cycles) + 10 * per_repeat);
  VecOp add(Opcode::op_vadd,
            {{"type", dt(Dtype::F32)}, {"xdst", 0}, {"xsrc0", int64_t(kSrc0)},
             {"xsrc1", int64_t(kSrc1)}, {"repeat", 10}, {"dst_blk", 1}, {"src0_blk", 1},
             {"src1_blk", 1}, {"dst_rep", 8}, {"src0_rep", 8}, {"src1_rep", 8}});
  CHECK(plan(add.issued(), h.ctx).cycles == plan(a.issued(), h.ctx).cycles);
  h.cfg.vector_add_relu_conv = false;
  VecOp b = op();
  CHECK_THROWS_WITH(
      plan(b.issued(), h.ctx),
      Catch::Contains("vaddreluconv: chip unit-test does not have this instruction") &&
          Catch::Contains("vector.add_relu_conv"));
  // f16 <- f16 is not an AddReluCast.
  h.cfg.vector_add_relu_conv = true;
  VecOp c = op();
  c.set("src_type", dt(Dtype::F16));
  CHECK_THROWS_WITH(plan(c.issued(), h.ctx), Catch::Contains("f16 <- f16 is not supported"));
}

namespace {

// vmla's reference: vmul then vadd's (the product rounded to the type, then the sum), by
// _Float16 for f16 and float for f32; NaN canonical.
uint32_t ref_multiply_accumulate(Dtype t, uint32_t a, uint32_t b, uint32_t acc) {
  if (t == Dtype::F16) {
    // (the f32 product of two f16 values is exact: one rounding, to f16; the sum as vadd's)
    const float x = ref_f16(static_cast<uint16_t>(a)), y = ref_f16(static_cast<uint16_t>(b));
    const _Float16 p = static_cast<_Float16>(x * y);
    const _Float16 r =
        static_cast<_Float16>(static_cast<float>(p) + static_cast<float>(ref_f16(
                                                          static_cast<uint16_t>(acc))));
    return ref_float_bits(t, static_cast<float>(r));
  }
  const float p = ref_f32(a) * ref_f32(b);
  return ref_float_bits(t, p + ref_f32(acc));
}

}  // namespace

TEST_CASE("vmla: dst = src0 * src1 + dst, the product rounded first, f16 and f32, active lanes") {
  int li = 0;
  for (Dtype t : {Dtype::F32, Dtype::F16}) {
    const int size = isa::dtype_size(t), lanes = 256 / size;
    for (const Layout& l : layouts(lanes)) {
      // src1 separate, or the accumulator itself (dst = src0 * dst + dst: every source read
      // before the lane is written)
      for (bool src1_is_dst : {false, true}) {
        VecHarness h;
        h.cfg.vector_multiply_accumulate = true;
        h.randomize(2100 + li);
        ValuePool pool(t, 2200 + li++);
        const uint64_t repeats = repeats_of(l, lanes);
        const uint64_t src1 = src1_is_dst ? kDst : kSrc1;
        const int64_t src1_blk = src1_is_dst ? l.dst_blk : l.src1_blk;
        const int64_t src1_rep = src1_is_dst ? l.dst_rep : l.src1_rep;
        for (uint64_t r = 0; r < repeats; ++r)
          for (int i = 0; i < lanes; ++i) {
            h.put_elem(ref_lane_addr(kSrc0, l.src0_blk, l.src0_rep, size, r, i), size,
                       pool.next());
            h.put_elem(ref_lane_addr(kDst, l.dst_blk, l.dst_rep, size, r, i), size,
                       pool.next());
            if (!src1_is_dst)
              h.put_elem(ref_lane_addr(src1, src1_blk, src1_rep, size, r, i), size, pool.next());
          }
        const std::vector<uint8_t> before = h.snapshot();
        std::vector<uint8_t> expected = before;
        for (uint64_t r = 0; r < repeats; ++r)
          for (int i = 0; i < lanes; ++i) {
            if (!ref_lane_active(l.mask, r, lanes, i)) continue;
            const uint64_t d = ref_lane_addr(kDst, l.dst_blk, l.dst_rep, size, r, i);
            const uint32_t a = element_from(
                before, ref_lane_addr(kSrc0, l.src0_blk, l.src0_rep, size, r, i), size);
            const uint32_t b =
                element_from(before, ref_lane_addr(src1, src1_blk, src1_rep, size, r, i), size);
            element_to(expected, d, size,
                       ref_multiply_accumulate(t, a, b, element_from(before, d, size)));
          }
        VecOp o(Opcode::op_vmla,
                {{"type", dt(t)}, {"xdst", int64_t(kDst)}, {"xsrc0", int64_t(kSrc0)},
                 {"xsrc1", int64_t(src1)}, {"repeat", l.repeat}, {"dst_blk", l.dst_blk},
                 {"src0_blk", l.src0_blk}, {"src1_blk", src1_blk}, {"dst_rep", l.dst_rep},
                 {"src0_rep", l.src0_rep}, {"src1_rep", src1_rep}},
                l.mask);
        const ExecCost c = h.run(o);
        CHECK(c.vector_repeats == repeats);
        check_image(h, expected,
                    fmt::format("vmla.{}, {}{}", isa::dtype_name(t), l.name,
                                src1_is_dst ? ", src1 = dst" : ""));
      }
    }
  }
  // The reference's rounding: f16 (1 + 2^-10)^2 = 1 + 2^-9 + 2^-20 rounds to 1 + 2^-9 before
  // -(1 + 2^-9) is added: +0 (fused, one rounding, it would be 2^-20, the f16 0x0010).
  CHECK(ref_multiply_accumulate(Dtype::F16, 0x3c01u, 0x3c01u, 0xbc02u) == 0x0000u);
  CHECK(ref_multiply_accumulate(Dtype::F32, ref_f32_bits(1.0f + 0x1p-23f),
                                ref_f32_bits(1.0f + 0x1p-23f),
                                ref_f32_bits(-(1.0f + 0x1p-22f))) == 0u);
}

TEST_CASE("vmla: cost in the bank model (three reads: half rate), refused on a chip without it") {
  VecHarness h;
  h.cfg.vector_multiply_accumulate = true;
  h.cfg.vector_bytes_per_cycle = 256;  // one 256-byte repeat a cycle without conflicts
  h.cfg.ub_banks = 48;
  h.cfg.ub_bank_width_bytes = 32;  // kDst, kSrc0, kSrc1 in banks 0-7, 16-23, 32-39
  const auto op = [](Opcode code, uint64_t src1) {
    return VecOp(code, {{"type", dt(Dtype::F32)}, {"xdst", int64_t(kDst)},
                        {"xsrc0", int64_t(kSrc0)}, {"xsrc1", int64_t(src1)}, {"repeat", 10},
                        {"dst_blk", 1}, {"src0_blk", 1}, {"src1_blk", 1}, {"dst_rep", 8},
                        {"src0_rep", 8}, {"src1_rep", 8}});
  };
  const uint64_t latency = static_cast<uint64_t>(h.cfg.vector_latency_cycles);
  VecOp add = op(Opcode::op_vadd, kSrc1), mla = op(Opcode::op_vmla, kSrc1);
  CHECK(plan(add.issued(), h.ctx).cycles == latency + 10);
  // dst, src0 and src1 three different addresses: dst's banks read and written, 2 cycles a repeat
  CHECK(plan(mla.issued(), h.ctx).cycles == latency + 20);
  // src1 = dst: the accumulator's read is src1's, as an in-place vadd (also 2 in the model)
  VecOp add_in_place = op(Opcode::op_vadd, kDst), mla_in_place = op(Opcode::op_vmla, kDst);
  CHECK(plan(mla_in_place.issued(), h.ctx).cycles == plan(add_in_place.issued(), h.ctx).cycles);
  // x * x + dst (src0 = src1): x's banks twice and dst's twice, 2 cycles a repeat, as vmul x * x
  VecOp square = op(Opcode::op_vmla, kSrc0), mul_square = op(Opcode::op_vmul, kSrc0);
  CHECK(plan(square.issued(), h.ctx).cycles == latency + 20);
  CHECK(plan(mul_square.issued(), h.ctx).cycles == latency + 20);
  h.cfg.ub_banks = 0;  // no bank model: an add's repeat cost
  CHECK(plan(mla.issued(), h.ctx).cycles == latency + 10);
  h.cfg.vector_multiply_accumulate = false;
  VecOp refused = op(Opcode::op_vmla, kSrc1);
  CHECK_THROWS_WITH(plan(refused.issued(), h.ctx),
                    Catch::Contains("vmla: chip unit-test does not have this instruction") &&
                        Catch::Contains("vector.multiply_accumulate"));
  // Types: f16 and f32 only.
  h.cfg.vector_multiply_accumulate = true;
  VecOp s32 = op(Opcode::op_vmla, kSrc1);
  s32.set("type", dt(Dtype::S32));
  CHECK_THROWS_WITH(plan(s32.issued(), h.ctx), Catch::Contains("vmla"));
}
