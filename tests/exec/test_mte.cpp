// MTE1/MTE2/MTE3 data movement: burst copies with gaps, copy_l12bt, nd2nz, load2d; their costs
// and faults. References are plain loops over the layouts as docs/assembly.md "Data layouts"
// defines them.
#include <catch2/catch.hpp>

#include "common/error.h"
#include "sim/exec/mte_common.h"
#include "tests/exec/test_mte_util.h"

using namespace npusim;
using namespace npusim::test;
using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using Catch::Contains;

namespace {

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7 + (i >> 8));
  return v;
}

// Reference burst copy on byte images of source and destination.
void ref_bursts(const std::vector<uint8_t>& src, uint64_t src_off, std::vector<uint8_t>& dst,
                uint64_t dst_off, int nburst, int len, int src_gap, int dst_gap) {
  for (int i = 0; i < nburst; ++i)
    for (int b = 0; b < len * 32; ++b)
      dst[dst_off + i * (len + dst_gap) * 32 + b] = src[src_off + i * (len + src_gap) * 32 + b];
}

}  // namespace

TEST_CASE("burst copies move nburst x burst_len blocks with source and destination gaps") {
  ExecBench t;
  const int nburst = 3, len = 2, src_gap = 1, dst_gap = 2;
  const uint64_t span = 4096;
  struct Case {
    Opcode op;
    Buf src, dst;
  };
  for (Case c : {Case{Opcode::op_copy_gm2l1, Buf::GM, Buf::L1},
                 Case{Opcode::op_copy_gm2ub, Buf::GM, Buf::UB},
                 Case{Opcode::op_copy_l12ub, Buf::L1, Buf::UB},
                 Case{Opcode::op_copy_ub2gm, Buf::UB, Buf::GM},
                 Case{Opcode::op_copy_ub2l1, Buf::UB, Buf::L1}}) {
    INFO(isa::describe(c.op).mnemonic);
    const uint64_t src_addr = c.src == Buf::GM ? 0x10000 + 4 : 0x400;  // GM: any byte address
    const uint64_t dst_addr = c.dst == Buf::GM ? 0x20000 + 3 : 0x800;
    auto src_img = pattern(span, 11);
    auto dst_img = pattern(span, 200);  // the gaps must keep these bytes
    auto put = [&](Buf b, uint64_t a, const std::vector<uint8_t>& v) {
      b == Buf::GM ? t.put_gm(a, v) : t.put_local(b, a, v);
    };
    put(c.src, src_addr, src_img);
    put(c.dst, dst_addr, dst_img);
    t.run(c.op, {{"xdst", int64_t(dst_addr)}, {"xsrc", int64_t(src_addr)}, {"nburst", nburst},
                 {"burst_len", len}, {"src_gap", src_gap}, {"dst_gap", dst_gap}});
    ref_bursts(src_img, 0, dst_img, 0, nburst, len, src_gap, dst_gap);
    auto got = c.dst == Buf::GM ? t.get_gm<uint8_t>(dst_addr, span)
                                : t.get_local<uint8_t>(c.dst, dst_addr, span);
    CHECK(got == dst_img);
  }
}

TEST_CASE("copy_l12bt copies len blocks from L1 to the bias table") {
  ExecBench t;
  auto src = pattern(96, 3);
  t.put_local(Buf::L1, 0x200, src);
  t.run(Opcode::op_copy_l12bt, {{"xdst", 64}, {"xsrc", 0x200}, {"len", 3}});
  CHECK(t.get_local<uint8_t>(Buf::BT, 64, 96) == src);
}

namespace {

struct Nd2NzCase {
  Dtype type;
  int rows, cols, src_stride, dst_rows;
  uint64_t gsrc = 0x3000;  // the first row's GM address
};

// Runs nd2nz on a patterned ND source (L1 at 0x1000 holding stale bytes) and checks L1 against
// a plain loop over [ceil(cols/C0)][dst_rows][C0] with zero padding; the stale bytes past the
// NZ image must stay.
void check_nd2nz(ExecBench& t, const Nd2NzCase& c) {
  const int size = isa::dtype_size(c.type), c0 = 32 / size;
  INFO(isa::dtype_name(c.type) << " rows " << c.rows << " cols " << c.cols << " src_stride "
                               << c.src_stride << " from GM " << c.gsrc);
  auto nd = pattern(size_t(c.rows) * c.src_stride * size + c.cols * size, 1);
  const uint64_t l1 = 0x1000;
  t.put_gm(c.gsrc, nd);
  const int col_blocks = (c.cols + c0 - 1) / c0;
  const size_t nz_bytes = size_t(col_blocks) * c.dst_rows * 32;
  t.put_local(Buf::L1, l1, std::vector<uint8_t>(nz_bytes + 64, 0xEE));  // stale contents
  t.run(Opcode::op_nd2nz, {{"type", dt(c.type)}, {"xdst", l1}, {"xsrc", int64_t(c.gsrc)},
                           {"rows", c.rows}, {"cols", c.cols}, {"src_stride", c.src_stride},
                           {"dst_rows", c.dst_rows}});
  std::vector<uint8_t> want(nz_bytes + 64, 0xEE);
  for (int j = 0; j < col_blocks; ++j)
    for (int r = 0; r < c.dst_rows; ++r)
      for (int e = 0; e < c0; ++e) {
        int col = j * c0 + e;
        for (int b = 0; b < size; ++b)
          want[((size_t(j) * c.dst_rows + r) * c0 + e) * size + b] =
              r < c.rows && col < c.cols ? nd[(size_t(r) * c.src_stride + col) * size + b] : 0;
      }
  CHECK(t.get_local<uint8_t>(Buf::L1, l1, want.size()) == want);
}

}  // namespace

TEST_CASE("nd2nz writes [ceil(cols/C0)][dst_rows][C0] with zero padding") {
  ExecBench t;
  for (Nd2NzCase c :
       {Nd2NzCase{Dtype::F16, 20, 37, 40, 32}, Nd2NzCase{Dtype::S8, 5, 70, 70, 16},
        Nd2NzCase{Dtype::F32, 17, 9, 11, 48},
        // partial blocks of 31 and 6 bytes (every piece size of copy_block_prefix; an image's
        // 3 channels), rows back to back as in NHWC
        Nd2NzCase{Dtype::S8, 3, 31, 31, 16}, Nd2NzCase{Dtype::F16, 40, 3, 3, 48},
        // rows over two 64 KiB device pages from 0x3000, row 87 across the boundary: one, two
        // (+ a partial) and three whole C0 blocks a row
        Nd2NzCase{Dtype::F16, 194, 16, 306, 208}, Nd2NzCase{Dtype::F16, 194, 32, 306, 208},
        Nd2NzCase{Dtype::F16, 194, 40, 306, 208}, Nd2NzCase{Dtype::F16, 194, 48, 306, 208},
        // dst_rows not a multiple of 16: column blocks dst_rows blocks apart (21 pixels of 64
        // channels as four planes back to back; a gap of two rows)
        Nd2NzCase{Dtype::F16, 21, 64, 64, 21}, Nd2NzCase{Dtype::F16, 21, 40, 64, 23}})
    check_nd2nz(t, c);
}

// nd2nz copies the rows in runs that lie in one 64 KiB device page (sim/exec/mte.cpp
// nd2nz_rows: fixed one- and two-block rows, any count of whole blocks, a partial last block),
// a row across a page boundary alone.
TEST_CASE("nd2nz rows in runs per device page: whole and partial blocks, page edges") {
  ExecBench t;
  constexpr uint64_t kPage = 64 * 1024;
  for (Nd2NzCase c : {
           // 700 rows of five blocks, 192 bytes apart, over three pages from 0x40 before one
           Nd2NzCase{Dtype::F16, 700, 80, 96, 704, kPage - 0x40},
           // rows that overlap in GM (64 bytes apart, 128 long) across a page boundary
           Nd2NzCase{Dtype::F16, 1100, 64, 32, 1104, 0x20},
           // page-aligned rows of 128 bytes, 128 apart: each page's last row ends at its end,
           // no row crosses (four whole-block rows of s8)
           Nd2NzCase{Dtype::S8, 1030, 128, 128, 1040, 2 * kPage},
           // one and two blocks a row, rows 2000 and 1200 bytes apart (runs of ~32 and ~54
           // rows a page), odd starts
           Nd2NzCase{Dtype::F16, 1500, 16, 1000, 1504, kPage + 6},
           Nd2NzCase{Dtype::BF16, 900, 32, 600, 912, 3 * kPage - 30},
           // two whole blocks and a partial one of 16 bytes (f32), rows across boundaries
           Nd2NzCase{Dtype::F32, 2000, 20, 24, 2000, 0x1234},
           // a single row, and a single row across a page boundary
           Nd2NzCase{Dtype::F16, 1, 48, 48, 16, 0x100},
           Nd2NzCase{Dtype::F16, 1, 48, 48, 16, kPage - 40}})
    check_nd2nz(t, c);
}

TEST_CASE("load2d copies strided fractals, transposing 16x16 fractals of 16-bit elements") {
  ExecBench t;
  auto l1 = pattern(8 * 512, 5);
  t.put_local(Buf::L1, 0x800, l1);
  const int nfrac = 3, stride = 2;
  SECTION("plain copy to l0a") {
    t.run(Opcode::op_load2d, {{"type", dt(Dtype::S8)}, {"dst", bf(Buf::L0A)}, {"xdst", 1024},
                              {"xsrc", 0x800}, {"nfrac", nfrac}, {"src_stride", stride}});
    std::vector<uint8_t> want;
    for (int f = 0; f < nfrac; ++f)
      want.insert(want.end(), l1.begin() + f * stride * 512, l1.begin() + f * stride * 512 + 512);
    CHECK(t.get_local<uint8_t>(Buf::L0A, 1024, want.size()) == want);
  }
  SECTION("transposed copy to l0b") {
    t.run(Opcode::op_load2d, {{"type", dt(Dtype::BF16)}, {"dst", bf(Buf::L0B)}, {"xdst", 0},
                              {"xsrc", 0x800}, {"nfrac", nfrac}, {"src_stride", stride},
                              {"transpose", 1}});
    std::vector<uint8_t> want(nfrac * 512);
    for (int f = 0; f < nfrac; ++f)
      for (int r = 0; r < 16; ++r)
        for (int c = 0; c < 16; ++c)
          for (int b = 0; b < 2; ++b)
            want[f * 512 + (c * 16 + r) * 2 + b] = l1[f * stride * 512 + (r * 16 + c) * 2 + b];
    CHECK(t.get_local<uint8_t>(Buf::L0B, 0, want.size()) == want);
  }
  SECTION("transposed, every element of the source distinct; the same fractal again") {
    // 16-bit elements numbered 0, 1, 2, ... over 8 fractals: a misplaced element shows.
    std::vector<uint16_t> elems(8 * 256);
    for (size_t i = 0; i < elems.size(); ++i) elems[i] = static_cast<uint16_t>(i * 3 + 1);
    t.put_local(Buf::L1, 0x800, elems);
    for (int stride : {0, 3}) {
      INFO("src_stride " << stride);
      t.run(Opcode::op_load2d, {{"type", dt(Dtype::F16)}, {"dst", bf(Buf::L0A)}, {"xdst", 512},
                                {"xsrc", 0x800 + 512}, {"nfrac", 2}, {"src_stride", stride},
                                {"transpose", 1}});
      std::vector<uint16_t> want(2 * 256);
      for (int f = 0; f < 2; ++f)
        for (int r = 0; r < 16; ++r)
          for (int c = 0; c < 16; ++c)
            want[f * 256 + c * 16 + r] = elems[(1 + f * stride) * 256 + r * 16 + c];
      CHECK(t.get_local<uint16_t>(Buf::L0A, 512, want.size()) == want);
    }
  }
}

TEST_CASE("GM paths cost the start latency and list the GM ranges; local paths add bytes/rate") {
  ExecBench t;
  SECTION("gaps on the GM side give one range per burst") {
    // cycles = path_latency(gm, l1) = 20 (test chip); rate = path_rate(gm, l1) = 32 B/cycle.
    ExecCost c = plan(t.op(Opcode::op_copy_gm2l1, {{"xdst", 0}, {"xsrc", 0x1000}, {"nburst", 3},
                                                   {"burst_len", 2}, {"src_gap", 1}}),
                      t.ctx);
    CHECK(c.cycles == 20);
    CHECK(c.gm_core_rate == 32);
    CHECK(c.bytes == 3 * 2 * 32);
    CHECK(c.path_src == Buf::GM);
    CHECK(c.path_dst == Buf::L1);
    REQUIRE(c.gm.size() == 3);
    for (int i = 0; i < 3; ++i) {  // burst i at 0x1000 + i * (2 + 1) * 32, 64 bytes, a read
      CHECK(c.gm[i].addr == 0x1000 + uint64_t(i) * 96);
      CHECK(c.gm[i].bytes == 64);
      CHECK_FALSE(c.gm[i].write);
    }
  }
  SECTION("contiguous bursts merge into one range") {
    ExecCost c = plan(t.op(Opcode::op_copy_ub2gm, {{"xdst", 0x1000}, {"xsrc", 0}, {"nburst", 4},
                                                   {"burst_len", 2}, {"src_gap", 3}}),
                      t.ctx);
    CHECK(c.cycles == 20);        // path_latency(ub, gm)
    CHECK(c.gm_core_rate == 64);  // path_rate(ub, gm)
    REQUIRE(c.gm.size() == 1);
    CHECK(c.gm[0].addr == 0x1000);
    CHECK(c.gm[0].bytes == 4 * 64);
    CHECK(c.gm[0].write);
  }
  SECTION("nd2nz reads one range per row unless the rows are contiguous") {
    auto nd2nz = [&](int src_stride) {
      return plan(t.op(Opcode::op_nd2nz, {{"type", dt(Dtype::F16)}, {"xdst", 0}, {"xsrc", 0x100},
                                          {"rows", 5}, {"cols", 24}, {"src_stride", src_stride},
                                          {"dst_rows", 16}}),
                  t.ctx);
    };
    ExecCost strided = nd2nz(32);
    REQUIRE(strided.gm.size() == 5);
    CHECK(strided.gm[4].addr == 0x100 + 4 * 32 * 2);
    CHECK(strided.gm[4].bytes == 48);
    CHECK(strided.bytes == 5 * 24 * 2);
    ExecCost dense = nd2nz(24);
    REQUIRE(dense.gm.size() == 1);
    CHECK(dense.gm[0].bytes == 5 * 48);
    // The row issue (mte.nd2nz_row_cycles): none on the test chip; with 4 cycles a row, a cap
    // of a 48-byte row per 4 cycles, contiguous rows too.
    CHECK(strided.gm_request_rate == 0);
    t.cfg.nd2nz_row_cycles = 4;
    CHECK(nd2nz(32).gm_request_rate == Approx(48.0 / 4));
    CHECK(nd2nz(24).gm_request_rate == Approx(48.0 / 4));
  }
  SECTION("the DMA's issue minimum counts GM bursts cut at 512-byte boundaries") {
    // 3 rows of 64 B 96 B apart from 0x1000 (one burst each), 64 B contiguous x 4 (one run of
    // 256 B from 0x1000: one burst), 1 KiB from 0x1100 (0x1100..0x14ff: 3 bursts).
    auto copy = [&](Opcode op, int64_t gm_addr, int nburst, int len, int gap) {
      const bool write = op == Opcode::op_copy_ub2gm;
      return plan(t.op(op, {{"xdst", write ? gm_addr : 0}, {"xsrc", write ? 0 : gm_addr},
                            {"nburst", nburst}, {"burst_len", len},
                            {write ? "dst_gap" : "src_gap", gap}}),
                  t.ctx);
    };
    CHECK(mte::gm_bursts(copy(Opcode::op_copy_gm2ub, 0x1000, 3, 2, 1).gm) == 3);
    CHECK(mte::gm_bursts(copy(Opcode::op_copy_gm2ub, 0x1000, 4, 2, 0).gm) == 1);
    CHECK(mte::gm_bursts(copy(Opcode::op_copy_ub2gm, 0x1100, 1, 32, 0).gm) == 3);
    // No keys on the test chip: no minimum.
    CHECK(copy(Opcode::op_copy_gm2ub, 0x1000, 3, 2, 1).gm_issue_cycles == 0);
    t.cfg.copy_issue_cycles = 10;
    t.cfg.burst_cycles = 2.5;
    CHECK(copy(Opcode::op_copy_gm2ub, 0x1000, 3, 2, 1).gm_issue_cycles == Approx(10 + 3 * 2.5));
    CHECK(copy(Opcode::op_copy_gm2l1, 0x1000, 4, 2, 0).gm_issue_cycles == Approx(10 + 2.5));
    CHECK(copy(Opcode::op_copy_ub2gm, 0x1100, 1, 32, 0).gm_issue_cycles == Approx(10 + 3 * 2.5));
    // Local copies issue no GM requests.
    CHECK(plan(t.op(Opcode::op_copy_l12ub, {{"xdst", 0}, {"xsrc", 0}, {"nburst", 2},
                                            {"burst_len", 5}}),
               t.ctx)
              .gm_issue_cycles == 0);
  }
  SECTION("local paths") {
    // copy_l12ub: 2 x 5 blocks = 320 B; path_latency(l1, ub) = 4, rate 128 B/cycle:
    // 4 + ceil(320 / 128) = 7.
    ExecCost c = plan(t.op(Opcode::op_copy_l12ub, {{"xdst", 0}, {"xsrc", 0}, {"nburst", 2},
                                                   {"burst_len", 5}}),
                      t.ctx);
    CHECK(c.cycles == 7);
    CHECK(c.gm.empty());
    CHECK(c.bytes == 320);
    // load2d of 3 fractals to l0b: 1536 B at 256 B/cycle after 4 cycles latency: 4 + 6 = 10.
    c = plan(t.op(Opcode::op_load2d, {{"type", dt(Dtype::F16)}, {"dst", bf(Buf::L0B)},
                                      {"xdst", 0}, {"xsrc", 0}, {"nfrac", 3}, {"src_stride", 1}}),
             t.ctx);
    CHECK(c.cycles == 10);
    CHECK(c.path_src == Buf::L1);
    CHECK(c.path_dst == Buf::L0B);
    // copy_l12bt of 3 blocks: 96 B at 64 B/cycle after 4: 4 + ceil(96 / 64) = 6.
    c = plan(t.op(Opcode::op_copy_l12bt, {{"xdst", 0}, {"xsrc", 0}, {"len", 3}}), t.ctx);
    CHECK(c.cycles == 6);
  }
}

TEST_CASE("MTE faults name the instruction, operand and range") {
  ExecBench t;
  auto fails = [&](Opcode code, std::initializer_list<std::pair<const char*, int64_t>> ops) {
    const IssuedOp& o = t.op(code, ops);
    try {
      plan(o, t.ctx);
    } catch (const KernelFault& e) {
      return std::string(e.what());
    }
    return std::string("no fault");
  };
  // L1 is 512 KiB (0x80000): 2 bursts of 64 blocks with a 1-block gap from 0x7f000 end at
  // 0x7f000 + (64 + 1) * 32 + 64 * 32 = 0x80020.
  CHECK_THAT(fails(Opcode::op_copy_gm2l1, {{"xdst", 0x7f000}, {"xsrc", 0}, {"nburst", 2},
                                           {"burst_len", 64}, {"dst_gap", 1}}),
             Contains("copy_gm2l1") && Contains("xdst") && Contains("0x7f000") &&
                 Contains("0x80020") && Contains("l1"));
  CHECK_THAT(fails(Opcode::op_copy_gm2ub, {{"xdst", 16}, {"xsrc", 0}, {"nburst", 1},
                                           {"burst_len", 1}}),
             Contains("xdst") && Contains("aligned to 32") && Contains("ub"));
  CHECK_THAT(fails(Opcode::op_copy_ub2gm, {{"xdst", (64ll << 20) - 32}, {"xsrc", 0}, {"nburst", 2},
                                           {"burst_len", 1}}),
             Contains("xdst") && Contains("device memory"));
  CHECK_THAT(fails(Opcode::op_copy_gm2l1, {{"xdst", 0}, {"xsrc", 0}, {"nburst", 0},
                                           {"burst_len", 1}}),
             Contains("nburst = 0"));
  CHECK_THAT(fails(Opcode::op_load2d, {{"type", dt(Dtype::F16)}, {"dst", bf(Buf::L0A)},
                                       {"xdst", 256}, {"xsrc", 0}, {"nfrac", 1}}),
             Contains("load2d") && Contains("xdst = 0x100") && Contains("512"));
  CHECK_THAT(fails(Opcode::op_load2d, {{"type", dt(Dtype::F16)}, {"dst", bf(Buf::UB)},
                                       {"xdst", 0}, {"xsrc", 0}, {"nfrac", 1}}),
             Contains("dst = ub") && Contains("l0a or l0b"));
  CHECK_THAT(fails(Opcode::op_load2d, {{"type", dt(Dtype::S8)}, {"dst", bf(Buf::L0B)},
                                       {"xdst", 0}, {"xsrc", 0}, {"nfrac", 1}, {"transpose", 1}}),
             Contains("transpose") && Contains("s8"));
  CHECK_THAT(fails(Opcode::op_load2d, {{"type", dt(Dtype::F16)}, {"dst", bf(Buf::L0A)},
                                       {"xdst", 63 * 1024}, {"xsrc", 0}, {"nfrac", 3}}),
             Contains("xdst range") && Contains("l0a"));
  CHECK_THAT(fails(Opcode::op_nd2nz, {{"type", dt(Dtype::F16)}, {"xdst", 0}, {"xsrc", 0},
                                      {"rows", 20}, {"cols", 16}, {"src_stride", 16},
                                      {"dst_rows", 19}}),
             Contains("dst_rows = 19") && Contains(">= rows = 20"));
  CHECK_THAT(fails(Opcode::op_nd2nz, {{"type", dt(Dtype::S64)}, {"xdst", 0}, {"xsrc", 0},
                                      {"rows", 1}, {"cols", 1}, {"src_stride", 1},
                                      {"dst_rows", 16}}),
             Contains("type = s64"));

  SECTION("a path or buffer the chip lacks") {
    ChipConfig cfg = coupled_test_chip();
    cfg.path_bytes_per_cycle.erase({Buf::UB, Buf::L1});
    cfg.core_kinds[0].buffer_bytes.erase(Buf::BT);
    ExecBench u(cfg);
    CHECK_THROWS_WITH(plan(u.op(Opcode::op_copy_ub2l1, {{"nburst", 1}, {"burst_len", 1}}), u.ctx),
                      Contains("no data path ub->l1 on chip unit-test"));
    CHECK_THROWS_WITH(plan(u.op(Opcode::op_copy_l12bt, {{"len", 1}}), u.ctx),
                      Contains("has no bt buffer"));
  }
}
