// fixpipe: L0C (NZ, f32/s32) -> GM / L1 / UB with conversion, quantisation (scale, round to
// nearest even, saturation), ReLU, and ND or NZ output; costs and faults. L0C is filled directly
// by the test at the NZ positions of the layout contract.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>

#include "common/error.h"
#include "sim/exec/f16_bulk.h"
#include "tests/exec/test_mte_util.h"

using namespace npusim;
using namespace npusim::test;
using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using Catch::Contains;

namespace {

constexpr uint64_t kL0C = 0x400;

// Writes the m x n row-major words into L0C at [ceil(n/16)][round16(m)][16] from kL0C.
void put_c(ExecBench& t, int m, int n, const std::vector<uint32_t>& words) {
  const int m16 = (m + 15) / 16 * 16;
  std::vector<uint32_t> nz(size_t((n + 15) / 16) * m16 * 16, 0xFFFFFFFF);
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c) nz[((c / 16) * m16 + r) * 16 + c % 16] = words[size_t(r) * n + c];
  t.put_local(Buf::L0C, kL0C, nz);
}

// Round half to even, written without the library's rounding-mode functions.
float ref_rne(float x) {
  float f = std::floor(x), d = x - f;
  if (d > 0.5f) return f + 1;
  if (d < 0.5f) return f;
  return std::fmod(f, 2.0f) == 0 ? f : f + 1;
}
int8_t ref_s8(float x) {
  if (std::isnan(x)) return 0;
  float r = ref_rne(x);
  return static_cast<int8_t>(r > 127 ? 127 : r < -128 ? -128 : r);
}

struct Fix {
  Dtype src, dst;
  Buf buf = Buf::GM;
  uint64_t xdst = 0x1000;
  int m = 0, n = 0, dst_stride = 0, nz2nd = 1, relu = 0;
  float scale = 1;
};

IssuedOp& fixpipe(ExecBench& t, const Fix& f) {
  return t.op(Opcode::op_fixpipe,
              {{"src_type", dt(f.src)}, {"dst_type", dt(f.dst)}, {"dst", bf(f.buf)},
               {"xdst", f.xdst}, {"xsrc", kL0C}, {"m", f.m}, {"n", f.n},
               {"dst_stride", f.dst_stride}, {"nz2nd", f.nz2nd}, {"relu", f.relu},
               {"xscale", float_bits(f.scale)}});
}

// Source words: special values first, then random ones.
std::vector<uint32_t> s32_words(size_t count, Rand& rnd) {
  std::vector<int32_t> special = {-300, -257, -256, -255, -5, -3, -1, 0, 1, 3, 5, 254, 255, 256,
                                  257, 1000, std::numeric_limits<int32_t>::max(),
                                  std::numeric_limits<int32_t>::min(), 16777217, -16777219};
  std::vector<uint32_t> w(count);
  for (size_t i = 0; i < count; ++i)
    w[i] = uint32_t(i < special.size() ? special[i] : rnd.integer(-70000, 70000));
  return w;
}
std::vector<uint32_t> f32_words(size_t count, Rand& rnd) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> special = {-300.5f, -2.5f, -1.5f, -0.5f, 0.5f, 1.5f, 2.5f, 126.5f, 127.5f,
                                -128.5f, 1e9f, -1e9f, inf, -inf, std::nanf(""), -0.0f, 65520.0f,
                                1e-8f, 3.0e38f};
  std::vector<uint32_t> w(count);
  for (size_t i = 0; i < count; ++i)
    w[i] = float_bits(i < special.size() ? special[i] : rnd.uniform(-400, 400));
  return w;
}

}  // namespace

TEST_CASE("fixpipe conversions: scale, ReLU after scaling, then round to nearest even") {
  const int m = 5, n = 20;  // m x n = 100 values, ND output to GM
  Rand rnd(9);
  auto s32 = s32_words(size_t(m) * n, rnd);
  auto f32 = f32_words(size_t(m) * n, rnd);
  for (int relu : {0, 1}) {
    INFO("relu " << relu);
    auto rl = [&](float v) { return relu && v < 0 ? 0.0f : v; };
    ExecBench t;
    auto run = [&](Dtype src, Dtype dst, float scale) {
      put_c(t, m, n, src == Dtype::S32 ? s32 : f32);
      t.run(fixpipe(t, {src, dst, Buf::GM, 0x1000, m, n, n, 1, relu, scale}));
    };
    {  // s32 -> s8: value * scale, saturate
      run(Dtype::S32, Dtype::S8, 0.5f);
      auto got = t.get_gm<int8_t>(0x1000, s32.size());
      for (size_t i = 0; i < s32.size(); ++i) {
        INFO(int32_t(s32[i]));
        CHECK(got[i] == ref_s8(rl(float(int32_t(s32[i])) * 0.5f)));
      }
    }
    {  // f32 -> s8: value * scale, saturate, NaN -> 0
      run(Dtype::F32, Dtype::S8, 1.0f);
      auto got = t.get_gm<int8_t>(0x1000, f32.size());
      for (size_t i = 0; i < f32.size(); ++i) {
        INFO(bits_float(f32[i]));
        CHECK(got[i] == ref_s8(rl(bits_float(f32[i]))));
      }
    }
    {  // s32 -> f16: value * scale in fp32
      run(Dtype::S32, Dtype::F16, 1.0f / 1024);
      auto got = t.get_gm<uint16_t>(0x1000, s32.size());
      for (size_t i = 0; i < s32.size(); ++i)
        CHECK(got[i] == ref_f32_to_f16(rl(float(int32_t(s32[i])) * (1.0f / 1024))));
    }
    {  // f32 -> f16 and bf16 ignore the scale
      run(Dtype::F32, Dtype::F16, 3.0f);
      auto h = t.get_gm<uint16_t>(0x1000, f32.size());
      run(Dtype::F32, Dtype::BF16, 3.0f);
      auto b = t.get_gm<uint16_t>(0x1000, f32.size());
      for (size_t i = 0; i < f32.size(); ++i) {
        float v = rl(bits_float(f32[i]));
        INFO(v);
        if (std::isnan(v)) {
          CHECK((h[i] & 0x7c00) == 0x7c00);
          CHECK((h[i] & 0x3ff) != 0);
          CHECK((b[i] & 0x7f80) == 0x7f80);
          CHECK((b[i] & 0x7f) != 0);
          continue;
        }
        CHECK(h[i] == ref_f32_to_f16(v));
        CHECK(b[i] == ref_f32_to_bf16(v));
      }
    }
    {  // f32 -> f32 and s32 -> s32 pass through (with ReLU)
      run(Dtype::F32, Dtype::F32, 7.0f);
      auto f = t.get_gm<uint32_t>(0x1000, f32.size());
      run(Dtype::S32, Dtype::S32, 7.0f);
      auto s = t.get_gm<int32_t>(0x1000, s32.size());
      for (size_t i = 0; i < f32.size(); ++i) {
        float v = bits_float(f32[i]);
        CHECK(f[i] == (relu && v < 0 ? float_bits(0.0f) : f32[i]));
        int32_t w = int32_t(s32[i]);
        CHECK(s[i] == (relu && w < 0 ? 0 : w));
      }
    }
  }
}

TEST_CASE("fixpipe nz2nd=1 writes rows of n elements at a pitch of dst_stride elements") {
  const int m = 20, n = 24, stride = 40;
  ExecBench t;
  Rand rnd(4);
  auto f32 = f32_words(size_t(m) * n, rnd);
  put_c(t, m, n, f32);
  // To UB, and to GM with row 4 crossing a device page boundary (the other rows are converted
  // in place in their page, that one through a staging row).
  const Buf dst = GENERATE(Buf::UB, Buf::GM);
  const uint64_t at = dst == Buf::UB ? 0x2000 : DeviceMemory::kPageBytes - 4 * stride * 2 - 32;
  INFO(isa::buf_name(dst));
  const std::vector<uint16_t> old(size_t(m) * stride, 0xABCD);
  if (dst == Buf::UB) t.put_local(Buf::UB, at, old);
  else t.put_gm(at, old);
  t.run(fixpipe(t, {Dtype::F32, Dtype::BF16, dst, at, m, n, stride, 1, 0, 1.0f}));
  std::vector<uint16_t> want(old);
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c) {
      float v = bits_float(f32[size_t(r) * n + c]);
      want[size_t(r) * stride + c] = std::isnan(v) ? 0 : ref_f32_to_bf16(v);
    }
  auto got = dst == Buf::UB ? t.get_local<uint16_t>(Buf::UB, at, want.size())
                            : t.get_gm<uint16_t>(at, want.size());
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c)
      if (std::isnan(bits_float(f32[size_t(r) * n + c]))) got[size_t(r) * stride + c] = 0;
  CHECK(got == want);
}

TEST_CASE("fixpipe nz2nd=0 writes [ceil(n/C0)][dst_stride][C0] of the dst type, zero-padded") {
  const int m = 20, n = 40, stride = 32;
  for (Dtype dst : {Dtype::F16, Dtype::S8, Dtype::S32}) {
    INFO(isa::dtype_name(dst));
    const int size = isa::dtype_size(dst), c0 = 32 / size;
    ExecBench t;
    Rand rnd(8);
    std::vector<uint32_t> words(size_t(m) * n);
    for (auto& w : words) w = uint32_t(rnd.integer(-200, 200));
    put_c(t, m, n, words);
    const uint64_t l1 = 0x8000;
    const size_t region = size_t((n + c0 - 1) / c0) * stride * c0 * size;
    t.put_local(Buf::L1, l1, std::vector<uint8_t>(region + 32, 0x77));
    t.run(fixpipe(t, {Dtype::S32, dst, Buf::L1, l1, m, n, stride, 0, 0, 1.0f}));
    std::vector<uint8_t> want(region + 32, 0);
    std::fill(want.begin() + region, want.end(), 0x77);
    for (int r = 0; r < m; ++r)
      for (int c = 0; c < n; ++c) {
        int32_t v = int32_t(words[size_t(r) * n + c]);
        uint8_t* p = &want[((size_t(c / c0) * stride + r) * c0 + c % c0) * size];
        if (dst == Dtype::F16) {
          uint16_t h = ref_f32_to_f16(float(v));
          std::memcpy(p, &h, 2);
        } else if (dst == Dtype::S8) {
          *p = uint8_t(ref_s8(float(v)));
        } else {
          std::memcpy(p, &v, 4);
        }
      }
    CHECK(t.get_local<uint8_t>(Buf::L1, l1, want.size()) == want);
  }
}

TEST_CASE("fixpipe costs") {
  ExecBench t;
  SECTION("to GM: the path latency, one range per row unless rows are contiguous") {
    // path_latency(l0c, gm) = 20, rate 32 B/cycle (test chip). f16 rows of 24 x 2 = 48 bytes
    // at a pitch of 40 x 2 = 80 bytes.
    ExecCost c = plan(fixpipe(t, {Dtype::F32, Dtype::F16, Buf::GM, 0x1000, 20, 24, 40}), t.ctx);
    CHECK(c.cycles == 20);
    CHECK(c.gm_core_rate == 32);
    CHECK(c.bytes == 20 * 48);
    REQUIRE(c.gm.size() == 20);
    CHECK(c.gm[19].addr == 0x1000 + 19 * 80);
    CHECK(c.gm[19].bytes == 48);
    CHECK(c.gm[19].write);
    ExecCost dense = plan(fixpipe(t, {Dtype::F32, Dtype::F16, Buf::GM, 0x1000, 20, 24, 24}), t.ctx);
    REQUIRE(dense.gm.size() == 1);
    CHECK(dense.gm[0].bytes == 20 * 48);
  }
  SECTION("to L1 as NZ: latency plus the whole padded region over the path rate") {
    // f16 NZ with n = 24, dst_stride 32: 2 column blocks x 32 rows x 16 x 2 B = 2048 B;
    // path_latency(l0c, l1) = 4 + 2048 / 256 B/cycle = 12.
    ExecCost c = plan(fixpipe(t, {Dtype::F32, Dtype::F16, Buf::L1, 0, 20, 24, 32, 0}), t.ctx);
    CHECK(c.cycles == 12);
    CHECK(c.bytes == 2048);
    CHECK(c.path_src == Buf::L0C);
    CHECK(c.path_dst == Buf::L1);
  }
}

TEST_CASE("fixpipe faults") {
  ExecBench t;
  auto fails = [&](const Fix& f) {
    try {
      plan(fixpipe(t, f), t.ctx);
    } catch (const KernelFault& e) {
      return std::string(e.what());
    }
    return std::string("no fault");
  };
  CHECK_THAT(fails({Dtype::S32, Dtype::BF16, Buf::GM, 0, 16, 16, 16}),
             Contains("fixpipe") && Contains("s32 -> bf16"));
  CHECK_THAT(fails({Dtype::F16, Dtype::F16, Buf::GM, 0, 16, 16, 16}), Contains("f16 -> f16"));
  CHECK_THAT(fails({Dtype::F32, Dtype::F32, Buf::L0A, 0, 16, 16, 16}),
             Contains("dst = l0a") && Contains("gm, l1 or ub"));
  CHECK_THAT(fails({Dtype::F32, Dtype::F32, Buf::GM, 0, 16, 24, 16}),
             Contains("dst_stride = 16") && Contains("n = 24"));
  CHECK_THAT(fails({Dtype::F32, Dtype::F32, Buf::L1, 0, 40, 16, 32, 0}),
             Contains("dst_stride = 32") && Contains("m = 40"));
  CHECK_THAT(fails({Dtype::F32, Dtype::F32, Buf::UB, 8, 16, 16, 16}),
             Contains("xdst = 0x8") && Contains("aligned to 32"));
  // L0C is 128 KiB from kL0C = 0x400: 128 x 256 words need 0x20000 bytes.
  CHECK_THAT(fails({Dtype::F32, Dtype::F32, Buf::GM, 0, 128, 256, 256}),
             Contains("xsrc range [0x400, 0x20400)") && Contains("l0c"));

  ChipConfig cfg = coupled_test_chip();
  cfg.path_bytes_per_cycle.erase({Buf::L0C, Buf::UB});
  ExecBench u(cfg);
  CHECK_THROWS_WITH(plan(fixpipe(u, {Dtype::F32, Dtype::F32, Buf::UB, 0, 16, 16, 16}), u.ctx),
                    Contains("no data path l0c->ub on chip unit-test"));
}

// f32 -> f16 rows are converted from L0C's 16-value column blocks in place on F16C hosts
// (exec_avx2), gathered first elsewhere (exec_generic), and f32 -> f32 rows copied from them in
// place: every element must have the bits of the scalar narrowing of its ReLU'd value (NaN
// payloads, signalling NaNs, -0, f16 subnormals, ties and overflow included), or the ReLU'd word
// itself, for rows of whole blocks, a partial last block and no whole block, to ND (UB; GM across
// a device page) and NZ (L1; f16 only).
TEST_CASE("fixpipe f32 -> f16: the scalar narrowing's bits for every row width and destination") {
  const float inf = std::numeric_limits<float>::infinity();
  // NaNs (quiet, signalling, with payloads), -0, f16's largest and overflow, f16 subnormals,
  // a tie (1 + 2^-11) and the value above it, infinities.
  const std::vector<uint32_t> special = {
      0x7fc00000u, 0xffc00123u, 0x7f800001u, 0xff812345u, 0x80000000u, 0x00000000u,
      float_bits(65520.0f), float_bits(-65520.0f), float_bits(65519.99f), float_bits(1e-5f),
      float_bits(-6e-8f), float_bits(2.98e-8f), float_bits(1.0009765625f),
      float_bits(1.00146484375f), float_bits(inf), float_bits(-inf), float_bits(-3.0f)};
  for (int relu : {0, 1})
    for (int n : {7, 16, 20, 33, 64})
      for (int m : {1, 5, 17})
        for (Buf dst : {Buf::UB, Buf::GM, Buf::L1}) {
          const int nz2nd = dst == Buf::L1 ? 0 : 1;
          INFO("relu " << relu << " m " << m << " n " << n << " nz2nd " << nz2nd << " "
                       << isa::buf_name(dst));
          Rand rnd(uint64_t(n * 100 + m));
          std::vector<uint32_t> words(size_t(m) * n);
          for (size_t i = 0; i < words.size(); ++i)
            words[i] = i % 3 == 0
                           ? special[(i / 3) % special.size()]
                           : float_bits(rnd.uniform(-70000, 70000) * (i % 3 == 1 ? 1.0f : 1e-9f));
          // The element's wanted f16: ReLU (v < 0 ? +0 : v; NaN, -0 kept), then the scalar
          // narrowing.
          auto want_f16 = [&](uint32_t w) {
            float v = bits_float(w);
            if (relu && v < 0) v = 0.0f;
            uint16_t h;
            f32_to_f16_n(&v, &h, 1, /*allow_hw=*/false);
            if (!std::isnan(v)) CHECK(h == ref_f32_to_f16(v));
            return h;
          };
          ExecBench t;
          put_c(t, m, n, words);
          const int stride = nz2nd ? n + 3 : (m + 15) / 16 * 16;
          const size_t extent =
              nz2nd ? size_t(m) * stride : size_t((n + 15) / 16) * size_t(stride) * 16;
          const uint64_t at = dst == Buf::GM   ? DeviceMemory::kPageBytes - 2 * stride * 2 - 32
                              : dst == Buf::UB ? 0x2000
                                               : 0x8000;
          const std::vector<uint16_t> old(extent, 0xABCD);
          if (dst == Buf::GM)
            t.put_gm(at, old);
          else
            t.put_local(dst, at, old);
          t.run(fixpipe(t, {Dtype::F32, Dtype::F16, dst, at, m, n, stride, nz2nd, relu, 1.0f}));
          std::vector<uint16_t> want(nz2nd ? old : std::vector<uint16_t>(extent, 0));
          for (int r = 0; r < m; ++r)
            for (int c = 0; c < n; ++c)
              want[nz2nd ? size_t(r) * stride + c : (size_t(c / 16) * stride + r) * 16 + c % 16] =
                  want_f16(words[size_t(r) * n + c]);
          auto got = dst == Buf::GM ? t.get_gm<uint16_t>(at, extent)
                                    : t.get_local<uint16_t>(dst, at, extent);
          CHECK(got == want);
        }
}

TEST_CASE("fixpipe f32 -> f32: the ReLU'd words for every row width, to UB and GM") {
  Rand rnd(12);
  for (int relu : {0, 1})
    for (int n : {7, 16, 20, 33, 64})
      for (int m : {1, 5, 17})
        for (Buf dst : {Buf::UB, Buf::GM}) {
          INFO("relu " << relu << " m " << m << " n " << n << " " << isa::buf_name(dst));
          auto words = f32_words(size_t(m) * n, rnd);
          ExecBench t;
          put_c(t, m, n, words);
          const int stride = n + 3;
          const size_t extent = size_t(m) * stride;
          const uint64_t at = dst == Buf::GM ? DeviceMemory::kPageBytes - 2 * stride * 4 - 32
                                             : 0x2000;
          const std::vector<uint32_t> old(extent, 0xABCDEF01u);
          if (dst == Buf::GM)
            t.put_gm(at, old);
          else
            t.put_local(dst, at, old);
          t.run(fixpipe(t, {Dtype::F32, Dtype::F32, dst, at, m, n, stride, 1, relu, 1.0f}));
          std::vector<uint32_t> want(old);
          for (int r = 0; r < m; ++r)
            for (int c = 0; c < n; ++c) {
              const uint32_t w = words[size_t(r) * n + c];
              want[size_t(r) * stride + c] = relu && bits_float(w) < 0 ? 0u : w;
            }
          auto got = dst == Buf::GM ? t.get_gm<uint32_t>(at, extent)
                                    : t.get_local<uint32_t>(dst, at, extent);
          CHECK(got == want);
        }
}
