// mmad through the full chain ND A, B in GM -> nd2nz -> load2d -> mmad -> fixpipe nz2nd -> GM,
// against a reference matmul written here: fp32 sums in sequential k order for float inputs
// (the order cube.cpp documents), exact integer sums for s8. Also accumulate and bias modes,
// cycle costs and faults.
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

int ceil_div(int a, int b) { return (a + b - 1) / b; }
int round16(int a) { return ceil_div(a, 16) * 16; }

// A matrix of one cube input type: its stored bytes and the exact value of every element.
struct Matrix {
  int rows = 0, cols = 0;
  std::vector<uint8_t> bytes;  // row-major, dtype_size bytes per element
  std::vector<double> value;   // row-major
  Matrix transposed(int size) const {
    Matrix t{cols, rows, std::vector<uint8_t>(bytes.size()), std::vector<double>(value.size())};
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < cols; ++c) {
        t.value[size_t(c) * rows + r] = value[size_t(r) * cols + c];
        std::memcpy(&t.bytes[(size_t(c) * rows + r) * size], &bytes[(size_t(r) * cols + c) * size],
                    size);
      }
    return t;
  }
};

Matrix random_matrix(Dtype type, int rows, int cols, Rand& rnd) {
  const int size = isa::dtype_size(type);
  Matrix mtx{rows, cols, std::vector<uint8_t>(size_t(rows) * cols * size),
             std::vector<double>(size_t(rows) * cols)};
  for (size_t i = 0; i < mtx.value.size(); ++i) {
    uint8_t* p = &mtx.bytes[i * size];
    switch (type) {
      case Dtype::F16: {
        uint16_t h = ref_f32_to_f16(rnd.uniform(-4, 4));
        std::memcpy(p, &h, 2);
        mtx.value[i] = ref_f16_to_f32(h);
        break;
      }
      case Dtype::BF16: {
        uint16_t h = ref_f32_to_bf16(rnd.uniform(-4, 4));
        std::memcpy(p, &h, 2);
        mtx.value[i] = ref_bf16_to_f32(h);
        break;
      }
      case Dtype::F32: {
        float f = rnd.uniform(-4, 4);
        std::memcpy(p, &f, 4);
        mtx.value[i] = f;
        break;
      }
      default: {  // s8
        int8_t v = static_cast<int8_t>(rnd.integer(-128, 127));
        *p = static_cast<uint8_t>(v);
        mtx.value[i] = v;
      }
    }
  }
  return mtx;
}

constexpr uint64_t kGmA = 0x10000, kGmB = 0x40000, kGmC = 0x80000;
constexpr uint64_t kL1A = 0, kL1B = 0x20000;
constexpr uint64_t kL0C = 0x1000;

// Loads A into L0A and B into L0B following the recipes of the layout contract: A through nd2nz
// (dst_rows = M16) and one load2d per row block; B for 16-bit types as k x n through nd2nz
// (dst_rows = K16) and transposing load2d per k block, for other types as B^T (n x k) through
// nd2nz (dst_rows = N16) and plain load2d per k block.
void load_operands(ExecBench& t, Dtype type, const Matrix& a, const Matrix& b) {
  const int size = isa::dtype_size(type), k0 = 32 / size;
  const int m = a.rows, k = a.cols, n = b.cols;
  const int m16 = round16(m), k16 = round16(k), n16 = round16(n);
  const int kb = ceil_div(k, k0), nb = ceil_div(n, 16);
  t.put_gm(kGmA, a.bytes);
  t.run(Opcode::op_nd2nz, {{"type", dt(type)}, {"xdst", kL1A}, {"xsrc", kGmA}, {"rows", m},
                           {"cols", k}, {"src_stride", k}, {"dst_rows", m16}});
  for (int i = 0; i < m16 / 16; ++i)
    t.run(Opcode::op_load2d, {{"type", dt(type)}, {"dst", bf(Buf::L0A)}, {"xdst", i * kb * 512},
                              {"xsrc", kL1A + i * 512}, {"nfrac", kb}, {"src_stride", m16 / 16}});
  if (size == 2) {
    t.put_gm(kGmB, b.bytes);
    t.run(Opcode::op_nd2nz, {{"type", dt(type)}, {"xdst", kL1B}, {"xsrc", kGmB}, {"rows", k},
                             {"cols", n}, {"src_stride", n}, {"dst_rows", k16}});
    for (int i = 0; i < kb; ++i)
      t.run(Opcode::op_load2d, {{"type", dt(type)}, {"dst", bf(Buf::L0B)}, {"xdst", i * nb * 512},
                                {"xsrc", kL1B + i * 512}, {"nfrac", nb}, {"src_stride", k16 / 16},
                                {"transpose", 1}});
  } else {
    t.put_gm(kGmB, b.transposed(size).bytes);
    t.run(Opcode::op_nd2nz, {{"type", dt(type)}, {"xdst", kL1B}, {"xsrc", kGmB}, {"rows", n},
                             {"cols", k}, {"src_stride", k}, {"dst_rows", n16}});
    for (int i = 0; i < kb; ++i)
      t.run(Opcode::op_load2d, {{"type", dt(type)}, {"dst", bf(Buf::L0B)}, {"xdst", i * nb * 512},
                                {"xsrc", kL1B + i * n16 * 32}, {"nfrac", nb}, {"src_stride", 1}});
  }
}

ExecCost mmad(ExecBench& t, Dtype type, int m, int k, int n, int init, uint64_t xbias = 0) {
  return t.run(Opcode::op_mmad, {{"type", dt(type)}, {"xc", kL0C}, {"xa", 0}, {"xb", 0},
                                 {"m", m}, {"k", k}, {"n", n}, {"init", init}, {"xbias", xbias}});
}

// fixpipe L0C -> GM as ND, no conversion; returns the m x n raw 32-bit results.
std::vector<uint32_t> fetch_c(ExecBench& t, Dtype type, int m, int n) {
  Dtype acc = type == Dtype::S8 ? Dtype::S32 : Dtype::F32;
  t.run(Opcode::op_fixpipe, {{"src_type", dt(acc)}, {"dst_type", dt(acc)}, {"dst", bf(Buf::GM)},
                             {"xdst", kGmC}, {"xsrc", kL0C}, {"m", m}, {"n", n},
                             {"dst_stride", n}, {"nz2nd", 1}});
  return t.get_gm<uint32_t>(kGmC, size_t(m) * n);
}

// Reference: acc[r][c] += A[r][kk] * B[kk][c] for kk = 0..k-1 in order, in fp32 (float types)
// or int32 (s8); acc holds raw 32-bit words.
void ref_accumulate(Dtype type, const Matrix& a, const Matrix& b, std::vector<uint32_t>& acc) {
  const int m = a.rows, k = a.cols, n = b.cols;
  for (int r = 0; r < m; ++r)
    for (int c = 0; c < n; ++c) {
      uint32_t& word = acc[size_t(r) * n + c];
      if (type == Dtype::S8) {
        int64_t s = static_cast<int32_t>(word);
        for (int kk = 0; kk < k; ++kk)
          s += int64_t(a.value[size_t(r) * k + kk]) * int64_t(b.value[size_t(kk) * n + c]);
        word = static_cast<uint32_t>(static_cast<int32_t>(s));
      } else {
        float s = bits_float(word);
        for (int kk = 0; kk < k; ++kk) {
          float p = float(a.value[size_t(r) * k + kk]) * float(b.value[size_t(kk) * n + c]);
          s = s + p;
        }
        word = float_bits(s);
      }
    }
}

}  // namespace

TEST_CASE("mmad chain matches a reference matmul for odd shapes in every cube type") {
  struct Case {
    Dtype type;
    int m, k, n;
  };
  for (Case c : {Case{Dtype::F16, 20, 40, 24}, Case{Dtype::BF16, 20, 40, 24},
                 Case{Dtype::S8, 20, 40, 24}, Case{Dtype::F32, 20, 40, 24},
                 Case{Dtype::F16, 33, 17, 50}, Case{Dtype::S8, 7, 70, 3},
                 Case{Dtype::F32, 1, 13, 17}, Case{Dtype::BF16, 64, 96, 48},
                 // Whole register tiles (8 x 32 on AVX-512 hosts) next to edge tiles: m a
                 // multiple of 8 but not 16, odd and even counts of column blocks, long k.
                 Case{Dtype::F16, 24, 80, 80}, Case{Dtype::F16, 48, 256, 64},
                 Case{Dtype::S8, 40, 96, 96}, Case{Dtype::F32, 16, 24, 40}}) {
    INFO(isa::dtype_name(c.type) << " m=" << c.m << " k=" << c.k << " n=" << c.n);
    ExecBench t;
    Rand rnd(c.m * 1000 + c.k * 10 + c.n);
    Matrix a = random_matrix(c.type, c.m, c.k, rnd), b = random_matrix(c.type, c.k, c.n, rnd);
    load_operands(t, c.type, a, b);
    mmad(t, c.type, c.m, c.k, c.n, 0);
    std::vector<uint32_t> want(size_t(c.m) * c.n, 0);
    ref_accumulate(c.type, a, b, want);
    CHECK(fetch_c(t, c.type, c.m, c.n) == want);
  }
}

TEST_CASE("mmad with B in several column panels: long k, a partial last panel, every type") {
  // cube.cpp widens B into column panels of 16 columns (k x 16 each, CubeOperands::b): tiles
  // of 32 columns (AVX-512 hosts) read two panels, a last panel of n % 16 columns is zero past
  // n, and a long k makes a panel span many host cache lines. fp16 with k and n multiples of 16
  // widens B's fractals straight into the panels; the other shapes and types rearrange a
  // widened copy (k not a multiple of C0 included).
  struct Case {
    Dtype type;
    int m, k, n;
  };
  for (Case c : {Case{Dtype::F16, 40, 528, 48}, Case{Dtype::F16, 24, 256, 112},
                 Case{Dtype::F16, 19, 300, 72}, Case{Dtype::F16, 35, 176, 8},
                 Case{Dtype::BF16, 17, 200, 40}, Case{Dtype::F32, 9, 72, 36},
                 Case{Dtype::S8, 24, 320, 49}}) {
    INFO(isa::dtype_name(c.type) << " m=" << c.m << " k=" << c.k << " n=" << c.n);
    ExecBench t;
    Rand rnd(c.m * 7919 + c.k * 31 + c.n);
    Matrix a = random_matrix(c.type, c.m, c.k, rnd), b = random_matrix(c.type, c.k, c.n, rnd);
    load_operands(t, c.type, a, b);
    std::vector<uint32_t> want(size_t(c.m) * c.n, 0);
    mmad(t, c.type, c.m, c.k, c.n, 0);
    ref_accumulate(c.type, a, b, want);
    CHECK(fetch_c(t, c.type, c.m, c.n) == want);
    mmad(t, c.type, c.m, c.k, c.n, 1);
    ref_accumulate(c.type, a, b, want);
    CHECK(fetch_c(t, c.type, c.m, c.n) == want);
  }
}

TEST_CASE("fp16 mmad leaving out zero columns reads B's rows across every panel") {
  // The zero-column check (columns_to_keep_f16) reads B's row kk in each panel: an infinity in
  // the last panel, in a partial one (n = 72) and in a whole one (n = 80), under a column of A
  // that is zero in every row, keeps that column (0 * inf is NaN in the full sum).
  for (int n : {72, 80}) {
    const int m = 33, k = 256;
    INFO("m=" << m << " k=" << k << " n=" << n);
    Rand rnd(static_cast<uint32_t>(n));
    Matrix a = random_matrix(Dtype::F16, m, k, rnd), b = random_matrix(Dtype::F16, k, n, rnd);
    auto put = [](Matrix& mtx, int r, int c, uint16_t h) {
      std::memcpy(&mtx.bytes[(size_t(r) * mtx.cols + c) * 2], &h, 2);
      mtx.value[size_t(r) * mtx.cols + c] = ref_f16_to_f32(h);
    };
    for (int r = 0; r < m; ++r)
      for (int kk = 0; kk < k; ++kk)
        if (kk % 16 >= 3) put(a, r, kk, 0);  // 13 of every 16 columns zero, as an image's
    ExecBench t;
    load_operands(t, Dtype::F16, a, b);
    std::vector<uint32_t> want(size_t(m) * n, 0);
    mmad(t, Dtype::F16, m, k, n, 0);
    ref_accumulate(Dtype::F16, a, b, want);
    CHECK(fetch_c(t, Dtype::F16, m, n) == want);
    put(b, 200, n - 3, 0x7c00);  // +inf at kk = 200 (200 % 16 = 8: a zero column), last panel
    load_operands(t, Dtype::F16, a, b);
    mmad(t, Dtype::F16, m, k, n, 0);
    std::fill(want.begin(), want.end(), 0);
    ref_accumulate(Dtype::F16, a, b, want);
    CHECK(fetch_c(t, Dtype::F16, m, n) == want);
    CHECK((want[n - 3] & 0x7fffffffu) > 0x7f800000u);  // NaN: 0 * inf
  }
}

TEST_CASE("fp16 mmad over the whole finite fp16 range rounds each step's sum as the reference") {
  // The product of two fp16 values is exact in fp32, so the cube model may fuse multiply and
  // add (cube.cpp, kFused); sums of products spanning 2^-48 .. 2^32 round at every step, and
  // must match the reference's separate multiply and add bit for bit.
  const int m = 40, k = 64, n = 48;
  Rand rnd(2024);
  auto matrix = [&](int rows, int cols) {
    Matrix mtx{rows, cols, std::vector<uint8_t>(size_t(rows) * cols * 2),
               std::vector<double>(size_t(rows) * cols)};
    for (size_t i = 0; i < mtx.value.size(); ++i) {
      uint16_t h;
      do {
        h = static_cast<uint16_t>(rnd.integer(0, 0xffff));
      } while ((h & 0x7c00) == 0x7c00);  // not Inf or NaN
      std::memcpy(&mtx.bytes[i * 2], &h, 2);
      mtx.value[i] = ref_f16_to_f32(h);
    }
    return mtx;
  };
  ExecBench t;
  Matrix a = matrix(m, k), b = matrix(k, n);
  load_operands(t, Dtype::F16, a, b);
  mmad(t, Dtype::F16, m, k, n, 0);
  std::vector<uint32_t> want(size_t(m) * n, 0);
  ref_accumulate(Dtype::F16, a, b, want);
  CHECK(fetch_c(t, Dtype::F16, m, n) == want);
}

TEST_CASE("fp16 mmad of whole fractals with infinities and NaNs") {
  // k and n multiples of 16: B's fractals are widened and transposed in one pass (cube.cpp,
  // widen_transpose_fractal_f16), which redoes a fractal holding a NaN without the host's
  // converter. Quiet and signalling NaNs with payloads and infinities of both signs in some
  // fractals of B, infinities in rows of A (a NaN in A too would meet B's in some sums, where
  // which payload wins is the host's choice of operand order).
  const int m = 32, k = 48, n = 48;
  Rand rnd(77);
  Matrix a = random_matrix(Dtype::F16, m, k, rnd), b = random_matrix(Dtype::F16, k, n, rnd);
  auto put = [](Matrix& mtx, int r, int c, uint16_t h) {
    std::memcpy(&mtx.bytes[(size_t(r) * mtx.cols + c) * 2], &h, 2);
    mtx.value[size_t(r) * mtx.cols + c] = ref_f16_to_f32(h);
  };
  put(b, 3, 5, 0x7d01);    // signalling NaN, payload 0x101
  put(b, 20, 17, 0x7e42);  // quiet NaN
  put(b, 47, 47, 0xfd55);  // signalling NaN, sign set
  put(b, 33, 30, 0x7c00);  // +inf
  put(b, 0, 40, 0xfc00);   // -inf
  put(a, 9, 12, 0x7c00);
  put(a, 30, 44, 0xfc00);
  ExecBench t;
  load_operands(t, Dtype::F16, a, b);
  mmad(t, Dtype::F16, m, k, n, 0);
  std::vector<uint32_t> want(size_t(m) * n, 0);
  ref_accumulate(Dtype::F16, a, b, want);
  CHECK(fetch_c(t, Dtype::F16, m, n) == want);
}

TEST_CASE("fp16 mmad of every row tail with subnormals, infinities and NaNs") {
  // m from 1 to 24 and 49 (a 7 x 7 map): the last rows of a fractal row that fill no whole register
  // tile are computed by tiles of just those rows (cube.cpp, tile_rows_fma_avx512 on AVX-512 hosts,
  // tile_rows_fma_avx2 on AVX2 hosts and under NPUSIM_HOST_SIMD=avx2) when their columns are whole,
  // by the staging tile otherwise (n = 40); one to six column blocks. Operands mix normal values
  // with subnormals and signed zeros; one case has infinities of both signs in A (their sums may
  // give the host's default NaN), the other signalling and quiet NaNs in B, at most one per column
  // (a NaN that meets another NaN keeps a payload the host's operand order picks). Two mmads: init
  // 0, then init 1.
  auto value = [](Rand& rnd, int special) -> uint16_t {
    const int pick = rnd.integer(0, 9);
    const uint16_t sign = rnd.integer(0, 1) ? 0x8000 : 0;
    if (pick < 2) return static_cast<uint16_t>(sign | rnd.integer(1, 0x3ff));  // subnormal
    if (pick == 2) return sign;                                                // +-0
    if (pick == 3 && special == 1) return sign | 0x7c00;                       // +-inf
    return ref_f32_to_f16(rnd.uniform(-4, 4));
  };
  for (int special : {1, 2})
    for (int m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 20, 23, 24, 49})
      for (int n : {16, 32, 40, 48, 64, 96}) {
        const int k = 48;
        INFO("m=" << m << " k=" << k << " n=" << n << (special == 1 ? " inf in A" : " NaN in B"));
        Rand rnd(uint32_t(special * 100000 + m * 100 + n));
        auto matrix = [&](int rows, int cols, int kind) {
          Matrix mtx{rows, cols, std::vector<uint8_t>(size_t(rows) * cols * 2),
                     std::vector<double>(size_t(rows) * cols)};
          for (size_t i = 0; i < mtx.value.size(); ++i) {
            const uint16_t h = value(rnd, kind);
            std::memcpy(&mtx.bytes[i * 2], &h, 2);
            mtx.value[i] = ref_f16_to_f32(h);
          }
          return mtx;
        };
        Matrix a = matrix(m, k, special == 1 ? 1 : 0), b = matrix(k, n, 0);
        if (special == 2)
          for (int c = 0; c < n; c += 3) {  // one NaN in every third column
            const uint16_t h =
                static_cast<uint16_t>((c % 2 ? 0x7e00 : 0xfc00) | rnd.integer(1, 0x1ff));
            const int kk = rnd.integer(0, k - 1);
            std::memcpy(&b.bytes[(size_t(kk) * n + c) * 2], &h, 2);
            b.value[size_t(kk) * n + c] = ref_f16_to_f32(h);
          }
        ExecBench t;
        load_operands(t, Dtype::F16, a, b);
        std::vector<uint32_t> want(size_t(m) * n, 0);
        mmad(t, Dtype::F16, m, k, n, 0);
        ref_accumulate(Dtype::F16, a, b, want);
        CHECK(fetch_c(t, Dtype::F16, m, n) == want);
        mmad(t, Dtype::F16, m, k, n, 1);
        ref_accumulate(Dtype::F16, a, b, want);
        CHECK(fetch_c(t, Dtype::F16, m, n) == want);
      }
}

TEST_CASE("fp16 mmad with zero columns of A: the same bits as the sum over every column") {
  // An image's 3 channels padded to C0 = 16: columns kk % 16 >= 3 of A are zero in every row.
  // cube.cpp leaves such columns out where that cannot change a bit (columns_to_keep_f16);
  // the cases where it could are here: a B row with an infinity under a zero column (0 * inf
  // is NaN), and sums that end at -0 without the zero columns' products but at +0 with them
  // (a -0 bias or accumulator, the kept products -0, the left-out ones +0).
  const uint16_t kNegZero = 0x8000;
  for (int m : {20, 49, 64})
    for (int n : {32, 40, 64}) {
      const int k = 112;  // 7 taps x 16 channels
      INFO("m=" << m << " k=" << k << " n=" << n);
      Rand rnd(uint32_t(m * 100 + n));
      Matrix a = random_matrix(Dtype::F16, m, k, rnd), b = random_matrix(Dtype::F16, k, n, rnd);
      auto put = [](Matrix& mtx, int r, int c, uint16_t h) {
        std::memcpy(&mtx.bytes[(size_t(r) * mtx.cols + c) * 2], &h, 2);
        mtx.value[size_t(r) * mtx.cols + c] = ref_f16_to_f32(h);
      };
      for (int r = 0; r < m; ++r)
        for (int kk = 0; kk < k; ++kk) {
          if (kk % 16 >= 3)
            put(a, r, kk, kNegZero);  // -0 times a negative B: +0
          else if (r == 5)
            put(a, r, kk, 0);  // +0 times a negative B: -0
        }
      for (int kk = 0; kk < k; ++kk) put(b, kk, 0, ref_f32_to_f16(-rnd.uniform(0.5, 4)));
      ExecBench t;
      load_operands(t, Dtype::F16, a, b);
      // Bias: -0 in every column (init 2).
      std::vector<uint32_t> bias(n, 0x80000000u);
      t.put_local(Buf::L1, 0x60000, bias);
      t.run(Opcode::op_copy_l12bt, {{"xdst", 128}, {"xsrc", 0x60000}, {"len", n * 4 / 32}});
      std::vector<uint32_t> want(size_t(m) * n, 0x80000000u);
      mmad(t, Dtype::F16, m, k, n, 2, 128);
      ref_accumulate(Dtype::F16, a, b, want);
      CHECK(fetch_c(t, Dtype::F16, m, n) == want);
      CHECK(want[5 * n] == 0);  // +0: the sum over every column, not the shortened one's -0

      // Accumulating onto an L0C of -0 (init 1): the same, redone from the old C.
      const int m16 = round16(m);
      t.put_local(Buf::L0C, kL0C,
                  std::vector<uint32_t>(size_t(ceil_div(n, 16)) * m16 * 16, 0x80000000u));
      std::fill(want.begin(), want.end(), 0x80000000u);
      mmad(t, Dtype::F16, m, k, n, 1);
      ref_accumulate(Dtype::F16, a, b, want);
      CHECK(fetch_c(t, Dtype::F16, m, n) == want);

      // No -0 anywhere (init 0) and then an infinity in B under a zero column of A.
      mmad(t, Dtype::F16, m, k, n, 0);
      std::fill(want.begin(), want.end(), 0);
      ref_accumulate(Dtype::F16, a, b, want);
      CHECK(fetch_c(t, Dtype::F16, m, n) == want);
      put(b, 37, 7, 0x7c00);  // +inf at kk = 37 (37 % 16 = 5: a zero column)
      load_operands(t, Dtype::F16, a, b);
      mmad(t, Dtype::F16, m, k, n, 0);
      std::fill(want.begin(), want.end(), 0);
      ref_accumulate(Dtype::F16, a, b, want);
      CHECK(fetch_c(t, Dtype::F16, m, n) == want);
      CHECK((want[7] & 0x7fffffffu) > 0x7f800000u);  // NaN: 0 * inf
    }
}

TEST_CASE("fp16 mmad of ReLU-like A (zeros scattered by row): the same bits as every term") {
  // The zeros a ReLU leaves, for any leaving out of zero terms finer than whole columns (one
  // per register tile was measured and not kept: docs/chip_model.md "Performance"): about half
  // of A's values +-0, some columns zero in whole 8-row tiles, a few subnormals (not zero), and
  // B rows with an infinity or a NaN under columns that are zero in some tiles. Every init
  // mode, row tails (m % 4, m % 8) and k not a multiple of 16; the result must be the sum over
  // every column.
  const uint16_t kNegZero = 0x8000, kInf = 0x7c00, kNan = 0x7e00, kSubnormal = 0x0003;
  struct Shape {
    int m, k, n;
  };
  for (Shape s : {Shape{20, 40, 24}, Shape{49, 112, 64}, Shape{64, 288, 32}, Shape{100, 48, 96}})
    for (int special : {0, 1, 2}) {
      const int m = s.m, k = s.k, n = s.n;
      INFO("m=" << m << " k=" << k << " n=" << n << " special=" << special);
      Rand rnd(uint32_t(m * 1000 + k + special));
      Matrix a = random_matrix(Dtype::F16, m, k, rnd), b = random_matrix(Dtype::F16, k, n, rnd);
      auto put = [](Matrix& mtx, int r, int c, uint16_t h) {
        std::memcpy(&mtx.bytes[(size_t(r) * mtx.cols + c) * 2], &h, 2);
        mtx.value[size_t(r) * mtx.cols + c] = ref_f16_to_f32(h);
      };
      for (int r = 0; r < m; ++r)
        for (int kk = 0; kk < k; ++kk) {
          if (a.value[size_t(r) * k + kk] < 0) put(a, r, kk, rnd.integer(0, 3) == 0 ? kNegZero : 0);
          if (kk % 5 == 0 && r % 16 < 8) put(a, r, kk, 0);  // zero in whole tiles of rows
          if (rnd.integer(0, 200) == 0) put(a, r, kk, kSubnormal);
        }
      if (special == 1) {  // non-finite B under columns that are zero in some tiles
        put(b, 5, n - 1, kInf);
        put(b, 10, 0, kNan);
        put(b, k - 1, n / 2, kInf | 0x8000);
      }
      if (special == 2)  // rows 0-7 of A +0 (whole tiles), B's column 1: -2 in row 0, then > 0
        for (int kk = 0; kk < k; ++kk) {
          for (int r = 0; r < 8; ++r) put(a, r, kk, 0);
          put(b, kk, 1, ref_f32_to_f16(kk == 0 ? -2.0f : rnd.uniform(0.5, 4)));
        }
      ExecBench t;
      load_operands(t, Dtype::F16, a, b);
      std::vector<uint32_t> want(size_t(m) * n, 0);
      mmad(t, Dtype::F16, m, k, n, 0);
      ref_accumulate(Dtype::F16, a, b, want);
      CHECK(fetch_c(t, Dtype::F16, m, n) == want);

      mmad(t, Dtype::F16, m, k, n, 1);  // onto the C above (no -0 in it)
      ref_accumulate(Dtype::F16, a, b, want);
      CHECK(fetch_c(t, Dtype::F16, m, n) == want);

      std::vector<uint32_t> bias(n);
      for (int c = 0; c < n; ++c) bias[c] = float_bits(rnd.uniform(-50, 50));
      if (special == 2) bias[1] = 0x80000000u;  // -0 + (-0) + (+0) ...: +0 in rows 0-7
      t.put_local(Buf::L1, 0x60000, bias);
      t.run(Opcode::op_copy_l12bt, {{"xdst", 128}, {"xsrc", 0x60000}, {"len", n * 4 / 32}});
      mmad(t, Dtype::F16, m, k, n, 2, 128);
      for (int r = 0; r < m; ++r)
        for (int c = 0; c < n; ++c) want[size_t(r) * n + c] = bias[c];
      ref_accumulate(Dtype::F16, a, b, want);
      CHECK(fetch_c(t, Dtype::F16, m, n) == want);
      if (special == 2) CHECK(want[1] == 0);  // not the -0 of the first term alone
    }
}

TEST_CASE("mmad init 1 accumulates onto L0C and init 2 starts from the bias row in BT") {
  struct Shape {
    int m, k, n;
  };
  for (Dtype type : {Dtype::F16, Dtype::S8}) {
    for (Shape s : {Shape{20, 40, 24}, Shape{32, 48, 64}}) {
      INFO(isa::dtype_name(type) << " m=" << s.m << " k=" << s.k << " n=" << s.n);
      const int m = s.m, k = s.k, n = s.n;
      ExecBench t;
      Rand rnd(7);
      Matrix a = random_matrix(type, m, k, rnd), b = random_matrix(type, k, n, rnd);
      load_operands(t, type, a, b);

      // Bias: n 32-bit accumulator values placed in L1, then copy_l12bt (n * 4 / 32 blocks).
      std::vector<uint32_t> bias(n);
      for (int c = 0; c < n; ++c)
        bias[c] = type == Dtype::S8 ? uint32_t(rnd.integer(-100000, 100000))
                                    : float_bits(rnd.uniform(-50, 50));
      t.put_local(Buf::L1, 0x60000, bias);
      t.run(Opcode::op_copy_l12bt, {{"xdst", 128}, {"xsrc", 0x60000}, {"len", n * 4 / 32}});

      mmad(t, type, m, k, n, 2, 128);
      std::vector<uint32_t> want(size_t(m) * n);
      for (int r = 0; r < m; ++r)
        for (int c = 0; c < n; ++c) want[size_t(r) * n + c] = bias[c];
      ref_accumulate(type, a, b, want);
      CHECK(fetch_c(t, type, m, n) == want);

      mmad(t, type, m, k, n, 1);  // C += A * B, continuing the sequential sum
      ref_accumulate(type, a, b, want);
      CHECK(fetch_c(t, type, m, n) == want);

      mmad(t, type, m, k, n, 0);  // back to zero
      std::fill(want.begin(), want.end(), 0);
      ref_accumulate(type, a, b, want);
      CHECK(fetch_c(t, type, m, n) == want);
    }
  }
}

TEST_CASE("mmad writes only the m x n elements of C in L0C's NZ layout") {
  // C occupies [ceil(n / 16)][M16][16] words; rows m..M16-1 of each column block, the columns
  // past n of the last block and the words after the last element must keep their old contents.
  // m = 20, n = 24: every register tile reaches past m or n; m = 40, n = 40: whole tiles too.
  for (auto [m, n] : {std::pair{20, 24}, std::pair{40, 40}}) {
    INFO("m=" << m << " n=" << n);
    const int k = 16, m16 = round16(m);
    ExecBench t;
    Rand rnd(3);
    Matrix a = random_matrix(Dtype::F16, m, k, rnd), b = random_matrix(Dtype::F16, k, n, rnd);
    load_operands(t, Dtype::F16, a, b);
    const size_t words = size_t(ceil_div(n, 16)) * m16 * 16 + 64;
    t.put_local(Buf::L0C, kL0C, std::vector<uint32_t>(words, 0xDEADBEEF));
    mmad(t, Dtype::F16, m, k, n, 0);
    std::vector<uint32_t> c(size_t(m) * n, 0);
    ref_accumulate(Dtype::F16, a, b, c);
    auto l0c = t.get_local<uint32_t>(Buf::L0C, kL0C, words);
    std::vector<uint32_t> want(words, 0xDEADBEEF);
    for (int r = 0; r < m; ++r)
      for (int col = 0; col < n; ++col)
        want[((col / 16) * m16 + r) * 16 + col % 16] = c[r * n + col];
    CHECK(l0c == want);
  }
}

TEST_CASE("mmad cycles: latency plus one cycle per cube block, derived from the config") {
  ExecBench t;
  auto cost = [&](Dtype type, int m, int k, int n) {
    return plan(t.op(Opcode::op_mmad, {{"type", dt(type)}, {"xc", 0}, {"xa", 0}, {"xb", 0},
                                       {"m", m}, {"k", k}, {"n", n}}),
                t.ctx);
  };
  // Test chip: cube 16x16x16, int8 k 32, fp32 at 1/4 rate, cube_latency_cycles 8.
  // f16 20x40x24: 8 + ceil(20/16) * ceil(40/16) * ceil(24/16) = 8 + 2*3*2 = 20.
  ExecCost c = cost(Dtype::F16, 20, 40, 24);
  CHECK(c.cycles == 20);
  CHECK(c.macs == 20 * 40 * 24);
  CHECK(c.gm.empty());
  CHECK(cost(Dtype::BF16, 16, 16, 16).cycles == 8 + 1);
  // s8: k blocks of cube_int8_k = 32: 8 + 2 * ceil(40/32) * 2 = 16; macs in fp16 equivalents
  // m*k*n * cube_k / cube_int8_k = 19200 / 2.
  c = cost(Dtype::S8, 20, 40, 24);
  CHECK(c.cycles == 16);
  CHECK(c.macs == 20 * 40 * 24 / 2);
  // f32: 1/cube_fp32_rate_divisor of the fp16 rate: 8 + 2*3*2 * 4 = 56; macs m*k*n * 4.
  c = cost(Dtype::F32, 20, 40, 24);
  CHECK(c.cycles == 56);
  CHECK(c.macs == 20 * 40 * 24 * 4);
  // A 128 x 256 x 64 tile keeps the cube busy: 8 + 8 * 16 * 4 = 520.
  CHECK(cost(Dtype::F16, 128, 256, 64).cycles == 520);
}

TEST_CASE("mmad faults") {
  ExecBench t;
  auto fails = [&](std::initializer_list<std::pair<const char*, int64_t>> ops) {
    try {
      plan(t.op(Opcode::op_mmad, ops), t.ctx);
    } catch (const KernelFault& e) {
      return std::string(e.what());
    }
    return std::string("no fault");
  };
  const int64_t f16 = dt(Dtype::F16);
  CHECK_THAT(fails({{"type", dt(Dtype::S32)}, {"m", 16}, {"k", 16}, {"n", 16}}),
             Contains("mmad") && Contains("type = s32"));
  CHECK_THAT(fails({{"type", f16}, {"m", 0}, {"k", 16}, {"n", 16}}), Contains("m = 0"));
  CHECK_THAT(fails({{"type", f16}, {"m", 16}, {"k", 16}, {"n", 16}, {"init", 3}}),
             Contains("init = 3"));
  CHECK_THAT(fails({{"type", f16}, {"xa", 100}, {"m", 16}, {"k", 16}, {"n", 16}}),
             Contains("xa = 0x64") && Contains("l0a"));
  // L0C is 128 KiB: 128 x 256 f32 from 0x10000 needs 128 KiB more.
  CHECK_THAT(fails({{"type", f16}, {"xc", 0x10000}, {"m", 128}, {"k", 16}, {"n", 256}}),
             Contains("xc range [0x10000, 0x30000)") && Contains("l0c"));
  // L0A is 64 KiB: A of 256 x 256 f16 is 128 KiB.
  CHECK_THAT(fails({{"type", f16}, {"m", 256}, {"k", 256}, {"n", 16}}),
             Contains("xa range") && Contains("l0a"));
  CHECK_THAT(fails({{"type", f16}, {"m", 16}, {"k", 16}, {"n", 512}, {"init", 2}}),
             Contains("xbias range") && Contains("bt"));

  ChipConfig cfg = coupled_test_chip();
  cfg.cube_fp32_rate_divisor = 0;
  cfg.cube_bf16 = false;
  ExecBench u(cfg);
  for (Dtype type : {Dtype::F32, Dtype::BF16})
    CHECK_THROWS_WITH(plan(u.op(Opcode::op_mmad, {{"type", dt(type)}, {"m", 16}, {"k", 16},
                                                  {"n", 16}}),
                           u.ctx),
                      Contains("not supported by the cube of chip unit-test"));
}
