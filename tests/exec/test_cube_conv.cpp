// load3d (img2col from an NC1HWC0 feature map in L1 into L0A) checked directly against a
// reference img2col, and as a convolution: load3d + load2d(B) + mmad + fixpipe compared with a
// direct convolution with padding, stride and dilation.
#include <catch2/catch.hpp>

#include "common/error.h"
#include "tests/exec/test_mte_util.h"

using namespace npusim;
using namespace npusim::test;
using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using Catch::Contains;

namespace {

// A convolution problem: C x H x W input, KH x KW kernel, geometry as set_fmatrix/set_l3d_geom.
struct Conv {
  int c = 20, h = 7, w = 6;
  int kh = 3, kw = 2, sh = 2, sw = 1, dh = 1, dw = 2;
  int pt = 1, pb = 0, pl = 1, pr = 2;
  int oh() const { return (h + pt + pb - dh * (kh - 1) - 1) / sh + 1; }
  int ow() const { return (w + pl + pr - dw * (kw - 1) - 1) / sw + 1; }
  FMatrix fmatrix() const { return {h, w, pt, pb, pl, pr}; }
  L3dGeom geom() const { return {kh, kw, sh, sw, dh, dw}; }
};

// The feature map [C1][H][W][C0] of one element type as stored bytes, with the value of input
// channel ch at (y, x); channels >= C hold a large junk value that load3d must not read.
struct FeatureMap {
  int c0 = 0, c1 = 0;
  std::vector<uint8_t> bytes;
  std::vector<double> value;  // [C][H][W]
};

FeatureMap make_fmap(const Conv& cv, Dtype type, Rand& rnd) {
  const int size = isa::dtype_size(type);
  FeatureMap f;
  f.c0 = 32 / size;
  f.c1 = (cv.c + f.c0 - 1) / f.c0;
  f.bytes.resize(size_t(f.c1) * cv.h * cv.w * f.c0 * size);
  f.value.resize(size_t(cv.c) * cv.h * cv.w);
  for (int c1 = 0; c1 < f.c1; ++c1)
    for (int y = 0; y < cv.h; ++y)
      for (int x = 0; x < cv.w; ++x)
        for (int e = 0; e < f.c0; ++e) {
          int ch = c1 * f.c0 + e;
          uint8_t* p = &f.bytes[((size_t(c1) * cv.h + y) * cv.w + x) * f.c0 * size + e * size];
          if (type == Dtype::F16) {
            uint16_t v = ref_f32_to_f16(ch < cv.c ? rnd.uniform(-2, 2) : 1000.0f);
            std::memcpy(p, &v, 2);
            if (ch < cv.c) f.value[(size_t(ch) * cv.h + y) * cv.w + x] = ref_f16_to_f32(v);
          } else {  // s8
            int8_t v = static_cast<int8_t>(ch < cv.c ? rnd.integer(-128, 127) : 99);
            *p = static_cast<uint8_t>(v);
            if (ch < cv.c) f.value[(size_t(ch) * cv.h + y) * cv.w + x] = v;
          }
        }
  return f;
}

// Reference img2col element (row m = oh*OW + ow, column k = ((c1*KH + kh)*KW + kw)*C0 + c0):
// the input value, or 0 for padding taps, rows past OH*OW and channels >= C.
double img2col(const Conv& cv, const FeatureMap& f, int m, int k) {
  if (m >= cv.oh() * cv.ow()) return 0;
  int oy = m / cv.ow(), ox = m % cv.ow();
  int e = k % f.c0, tap = k / f.c0;
  int kx = tap % cv.kw, ky = (tap / cv.kw) % cv.kh, c1 = tap / (cv.kw * cv.kh);
  int ch = c1 * f.c0 + e;
  int y = oy * cv.sh - cv.pt + ky * cv.dh, x = ox * cv.sw - cv.pl + kx * cv.dw;
  if (ch >= cv.c || y < 0 || y >= cv.h || x < 0 || x >= cv.w) return 0;
  return f.value[(size_t(ch) * cv.h + y) * cv.w + x];
}

IssuedOp& load3d(ExecBench& t, const Conv& cv, Dtype type, uint64_t xdst, int m_start, int m_ext,
                 int k_start, int k_ext, Opcode code = Opcode::op_load3d) {
  IssuedOp& o = t.op(code, {{"type", dt(type)}, {"xdst", xdst}, {"xsrc", 0},
                                         {"channels", cv.c}, {"m_start", m_start},
                                         {"m_ext", m_ext}, {"k_start", k_start},
                                         {"k_ext", k_ext}});
  o.fmatrix = cv.fmatrix();
  o.l3d = cv.geom();
  return o;
}

}  // namespace

TEST_CASE("load3d writes the requested img2col window to L0A in the Zz layout") {
  // 1: OH = (7+1-2-1)/2+1 = 3, OW = (6+3-2-1)/1+1 = 7: 21 rows; rows 13..28 (21..28 past the
  //    output), columns 2*C0 .. 6*C0 - 1.
  // 2: 3x3, stride 1, 16 x 20 output, whole channel blocks: rows 5..52, long runs of
  //    consecutive taps that cross fractals inside an output row; columns of taps 3..6.
  struct Case {
    Conv cv;
    int m_start, m_ext, k_start_blocks, k_blocks;
  };
  Conv wide;
  wide.c = 32, wide.h = 16, wide.w = 20, wide.kh = 3, wide.kw = 3, wide.sh = 1, wide.sw = 1;
  wide.dh = 1, wide.dw = 1, wide.pt = 1, wide.pb = 1, wide.pl = 1, wide.pr = 1;
  for (const Case& cs : {Case{Conv{}, 13, 16, 2, 4}, Case{wide, 5, 48, 3, 4}}) {
    for (Dtype type : {Dtype::F16, Dtype::S8}) {
      const Conv& cv = cs.cv;
      INFO(isa::dtype_name(type) << " m_start " << cs.m_start);
      ExecBench t;
      Rand rnd(11);
      FeatureMap f = make_fmap(cv, type, rnd);
      t.put_local(Buf::L1, 0, f.bytes);
      const int size = isa::dtype_size(type);
      const int m_start = cs.m_start, m_ext = cs.m_ext, k_start = cs.k_start_blocks * f.c0,
                k_ext = cs.k_blocks * f.c0;
      t.put_local(Buf::L0A, 0, std::vector<uint8_t>(m_ext * k_ext * size, 0x5A));
      t.run(load3d(t, cv, type, 0, m_start, m_ext, k_start, k_ext));
      auto l0a = t.get_local<uint8_t>(Buf::L0A, 0, m_ext * k_ext * size);
      const int k_blocks = k_ext / f.c0;
      int mismatches = 0;
      for (int r = 0; r < m_ext; ++r)
        for (int c = 0; c < k_ext; ++c) {
          const uint8_t* p = &l0a[(((r / 16) * k_blocks + c / f.c0) * 16 * f.c0 + (r % 16) * f.c0 +
                                   c % f.c0) * size];
          double got;
          if (type == Dtype::F16) {
            uint16_t v;
            std::memcpy(&v, p, 2);
            got = ref_f16_to_f32(v);
          } else {
            got = static_cast<int8_t>(*p);
          }
          if (got != img2col(cv, f, m_start + r, k_start + c)) ++mismatches;
        }
      CHECK(mismatches == 0);
    }
  }
}

TEST_CASE("load3dt writes the img2col window transposed to L0A in the Zz layout") {
  // Rows 13..28 of a strided, padded map (21..28 past the output) and 4 column blocks: L0A holds
  // A = window^T, k_ext rows x m_ext columns, fractal (row block, column block) row-major inside.
  Conv cv;
  {
    const Dtype type = Dtype::F16;
    ExecBench t;
    Rand rnd(12);
    FeatureMap f = make_fmap(cv, type, rnd);
    t.put_local(Buf::L1, 0, f.bytes);
    const int m_start = 13, m_ext = 32, k_start = 2 * 16, k_ext = 4 * 16;
    t.put_local(Buf::L0A, 0, std::vector<uint8_t>(m_ext * k_ext * 2, 0x5A));
    t.run(load3d(t, cv, type, 0, m_start, m_ext, k_start, k_ext, Opcode::op_load3dt));
    auto l0a = t.get_local<uint16_t>(Buf::L0A, 0, m_ext * k_ext);
    auto l0a_ref = [&](int kk, int mm) {  // element (kk, mm) of A in the Zz layout
      return l0a[((kk / 16) * (m_ext / 16) + mm / 16) * 256 + (kk % 16) * 16 + mm % 16];
    };
    int mismatches = 0;
    for (int kk = 0; kk < k_ext; ++kk)
      for (int mm = 0; mm < m_ext; ++mm) {
        if (ref_f16_to_f32(l0a_ref(kk, mm)) != img2col(cv, f, m_start + mm, k_start + kk))
          ++mismatches;
      }
    CHECK(mismatches == 0);
  }
  ExecBench t;
  CHECK_THROWS_WITH(plan(load3d(t, cv, Dtype::S8, 0, 0, 16, 0, 32, Opcode::op_load3dt), t.ctx),
                    Contains("16-bit type"));
}

TEST_CASE("load3d + load2d + mmad + fixpipe computes a padded, strided, dilated convolution") {
  const Conv cv;
  const int n = 24, c0 = 16, c1 = 2;
  const int m = cv.oh() * cv.ow();     // 21 output positions
  const int k = c1 * cv.kh * cv.kw * c0;  // 192 img2col columns
  ExecBench t;
  Rand rnd(5);
  FeatureMap f = make_fmap(cv, Dtype::F16, rnd);
  t.put_local(Buf::L1, 0, f.bytes);

  // Weights as B (k x n) in img2col column order; rows of channels >= C are non-zero too, so
  // a load3d that read the junk channels would change the result.
  std::vector<uint16_t> b_bits(size_t(k) * n);
  std::vector<float> b(size_t(k) * n);
  for (size_t i = 0; i < b.size(); ++i) {
    b_bits[i] = ref_f32_to_f16(rnd.uniform(-1, 1));
    b[i] = ref_f16_to_f32(b_bits[i]);
  }
  const uint64_t gm_b = 0x1000, gm_out = 0x20000, l1_b = 0x40000, l0c = 0;
  t.put_gm(gm_b, b_bits);
  t.run(Opcode::op_nd2nz, {{"type", dt(Dtype::F16)}, {"xdst", l1_b}, {"xsrc", gm_b}, {"rows", k},
                           {"cols", n}, {"src_stride", n}, {"dst_rows", k}});
  const int kb = k / 16, nb = (n + 15) / 16;
  for (int i = 0; i < kb; ++i)
    t.run(Opcode::op_load2d, {{"type", dt(Dtype::F16)}, {"dst", bf(Buf::L0B)},
                              {"xdst", i * nb * 512}, {"xsrc", l1_b + i * 512}, {"nfrac", nb},
                              {"src_stride", kb}, {"transpose", 1}});
  // Two load3d of 16 rows each build the 32-row A in Zz (row block i at fractal i * kb).
  t.run(load3d(t, cv, Dtype::F16, 0, 0, 16, 0, k));
  t.run(load3d(t, cv, Dtype::F16, kb * 512, 16, 16, 0, k));
  t.run(Opcode::op_mmad, {{"type", dt(Dtype::F16)}, {"xc", l0c}, {"xa", 0}, {"xb", 0}, {"m", m},
                          {"k", k}, {"n", n}});
  t.run(Opcode::op_fixpipe, {{"src_type", dt(Dtype::F32)}, {"dst_type", dt(Dtype::F16)},
                             {"dst", bf(Buf::GM)}, {"xdst", gm_out}, {"xsrc", l0c}, {"m", m},
                             {"n", n}, {"dst_stride", n}, {"nz2nd", 1}});
  auto got = t.get_gm<uint16_t>(gm_out, size_t(m) * n);

  // Direct convolution, summed in fp32 in img2col column order (the cube's sequential k order);
  // absent taps and channels contribute x = 0.
  std::vector<uint16_t> want(size_t(m) * n);
  for (int oy = 0; oy < cv.oh(); ++oy)
    for (int ox = 0; ox < cv.ow(); ++ox)
      for (int co = 0; co < n; ++co) {
        float acc = 0;
        for (int ch1 = 0; ch1 < c1; ++ch1)
          for (int ky = 0; ky < cv.kh; ++ky)
            for (int kx = 0; kx < cv.kw; ++kx)
              for (int e = 0; e < c0; ++e) {
                int ch = ch1 * c0 + e;
                int y = oy * cv.sh - cv.pt + ky * cv.dh, x = ox * cv.sw - cv.pl + kx * cv.dw;
                float xv = ch < cv.c && y >= 0 && y < cv.h && x >= 0 && x < cv.w
                               ? float(f.value[(size_t(ch) * cv.h + y) * cv.w + x])
                               : 0.0f;
                int kk = ((ch1 * cv.kh + ky) * cv.kw + kx) * c0 + e;
                acc = acc + xv * b[size_t(kk) * n + co];
              }
        want[size_t(oy * cv.ow() + ox) * n + co] = ref_f32_to_f16(acc);
      }
  CHECK(got == want);
}

TEST_CASE("load3d cost and faults") {
  const Conv cv;
  ExecBench t;
  // 16 rows x 64 f16 columns = 2048 B over l1->l0a: path_latency 4 + 2048 / 512 B/cycle = 8.
  ExecCost c = plan(load3d(t, cv, Dtype::F16, 0, 0, 16, 0, 64), t.ctx);
  CHECK(c.cycles == 8);
  CHECK(c.bytes == 2048);
  CHECK(c.path_dst == Buf::L0A);

  auto fails = [&](IssuedOp& o) {
    try {
      plan(o, t.ctx);
    } catch (const KernelFault& e) {
      return std::string(e.what());
    }
    return std::string("no fault");
  };
  CHECK_THAT(fails(load3d(t, cv, Dtype::F16, 0, 0, 24, 0, 64)), Contains("m_ext = 24"));
  CHECK_THAT(fails(load3d(t, cv, Dtype::F16, 0, 0, 16, 8, 64)), Contains("k_start = 8"));
  // img2col width: C1 = 2 blocks x 3 x 2 taps x 16 = 192 columns.
  CHECK_THAT(fails(load3d(t, cv, Dtype::F16, 0, 0, 16, 160, 64)),
             Contains("columns [160, 224)") && Contains("192"));
  CHECK_THAT(fails(load3d(t, cv, Dtype::S32, 0, 0, 16, 0, 64)), Contains("type = s32"));
  IssuedOp& big = load3d(t, cv, Dtype::F16, 0, 0, 16, 0, 64);
  big.l3d.kh = 9;  // dilated extent 9 > padded height 8
  CHECK_THAT(fails(big), Contains("does not fit"));
  IssuedOp& far = load3d(t, cv, Dtype::F16, 0, 0, 16, 0, 64);
  far.v[isa::field_index(Opcode::op_load3d, "xsrc")] = 512 * 1024 - 1024;
  CHECK_THAT(fails(far), Contains("xsrc range") && Contains("l1"));
}
