// The data-movement instructions: MTE2 (copy_gm2l1, copy_gm2ub, nd2nz), MTE1 (load2d, load3d,
// copy_l12ub, copy_l12bt), MTE3 (copy_ub2gm, copy_ub2l1) and FIXPIPE (fixpipe). Each instruction
// is decoded into a small descriptor whose constructor makes every check plan() promises
// (path, buffers, alignment, bounds, dtypes, parameters); plan() turns it into a cost and
// execute() applies it. Layouts: isa/layout.h and docs/assembly.md "Data layouts".
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <fmt/format.h>

#include "common/error.h"
#include "common/int_math.h"
#include "common/numeric.h"
#include "isa/layout.h"
#include "sim/exec/exec.h"
#include "sim/exec/f16_bulk.h"
#include "sim/exec/host_simd.h"
#include "sim/exec/mte_common.h"

namespace npusim {
namespace {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using layout::kBlockBytes;
using layout::kFractalBytes;
using layout::kFractalRows;
using mte::Operands;

// Element size of a type that can live in a fractal (1, 2 or 4 bytes); faults otherwise.
uint64_t fractal_elem_bytes(const Operands& o, const char* operand, Dtype t) {
  int s = isa::dtype_size(t);
  if (s != 1 && s != 2 && s != 4)
    o.fault(fmt::format("{} = {} is not a 1-, 2- or 4-byte type", operand, isa::dtype_name(t)));
  return static_cast<uint64_t>(s);
}

// Burst copies: copy_gm2l1, copy_gm2ub, copy_l12ub, copy_ub2gm, copy_ub2l1, copy_l12bt
// nburst bursts of burst_bytes; burst i reads src + i*src_pitch and writes dst + i*dst_pitch,
// pitch = (burst_len + gap) * 32 bytes.
struct BurstCopy {
  Buf src, dst;
  uint64_t xsrc, xdst, nburst, burst_bytes, src_pitch, dst_pitch;
  isa::L2Hint l2;  // of the GM side (NORMAL for the local copies, which have no l2 field)

  BurstCopy(const Operands& o, const ExecContext& ctx, Buf src_buf, Buf dst_buf)
      : src(src_buf), dst(dst_buf), l2(o.l2_hint()) {
    mte::require_path(o, ctx.cfg, src, dst);
    xsrc = o.addr("xsrc");
    xdst = o.addr("xdst");
    if (dst == Buf::BT) {  // copy_l12bt: one burst of len blocks
      nburst = 1;
      burst_bytes = o.count("len", 1) * kBlockBytes;
      src_pitch = dst_pitch = burst_bytes;
    } else {
      nburst = o.count("nburst", 1);
      uint64_t len = o.count("burst_len", 1);
      burst_bytes = len * kBlockBytes;
      src_pitch = (len + o.count("src_gap", 0)) * kBlockBytes;
      dst_pitch = (len + o.count("dst_gap", 0)) * kBlockBytes;
    }
    mte::check_range(o, ctx, "xsrc", src, xsrc, (nburst - 1) * src_pitch + burst_bytes);
    mte::check_range(o, ctx, "xdst", dst, xdst, (nburst - 1) * dst_pitch + burst_bytes);
  }

  ExecCost cost(const ChipConfig& cfg) const {
    ExecCost c = mte::path_cost(cfg, src, dst, nburst * burst_bytes);
    for (uint64_t i = 0; i < nburst; ++i) {
      if (src == Buf::GM)
        mte::add_gm_range(c.gm, xsrc + i * src_pitch, burst_bytes, false, l2);
      if (dst == Buf::GM) mte::add_gm_range(c.gm, xdst + i * dst_pitch, burst_bytes, true, l2);
    }
    if (!c.gm.empty()) c.gm_issue_cycles = mte::issue_cycles(cfg, c.gm);  // GM <-> UB / L1
    return c;
  }

  void run(ExecContext& ctx) const {
    for (uint64_t i = 0; i < nburst; ++i)
      mte::copy_bytes(ctx, src, xsrc + i * src_pitch, dst, xdst + i * dst_pitch, burst_bytes);
  }
};

// nd2nz's row copies: n rows at src, `pitch` bytes apart (all within one device page, so one
// host span), each of `blocks` whole C0 blocks and then `tail` bytes (< 32) of a partial one;
// block j of row r goes to out + j * plane_bytes + r * 32 (the partial block zero-padded). The
// row kNd2NzAhead rows on is prefetched while one is copied (rows a pitch apart cross host
// pages, where the hardware prefetchers stop).
constexpr uint64_t kNd2NzAhead = 8;

void nd2nz_rows_generic(const uint8_t* src, uint64_t pitch, uint64_t n, uint64_t blocks,
                        uint64_t tail, uint8_t* out, uint64_t plane_bytes) {
  const uint64_t row_bytes = blocks * kBlockBytes + tail;
  for (uint64_t r = 0; r < n; ++r, src += pitch, out += kBlockBytes) {
    if (r + kNd2NzAhead < n)
      for (uint64_t b = 0; b < row_bytes; b += 64)
        __builtin_prefetch(src + kNd2NzAhead * pitch + b);
    for (uint64_t j = 0; j < blocks; ++j)
      std::memcpy(out + j * plane_bytes, src + j * kBlockBytes, kBlockBytes);
    if (tail) mte::copy_block_prefix(out + blocks * plane_bytes, src + blocks * kBlockBytes, tail);
  }
}

#if defined(__SSE2__)
// Whole blocks only (tail 0), each one 32-byte move; kBlocks > 0 fixes the count at compile
// time (rows of one and two blocks: feature-map channel blocks and weight k-blocks), 0 reads
// `blocks`.
template <uint64_t kBlocks>
__attribute__((target("avx2"))) void nd2nz_rows_avx2(const uint8_t* src, uint64_t pitch,
                                                     uint64_t n, uint64_t blocks, uint8_t* out,
                                                     uint64_t plane_bytes) {
  const uint64_t count = kBlocks ? kBlocks : blocks;
  for (uint64_t r = 0; r < n; ++r, src += pitch, out += kBlockBytes) {
    if (r + kNd2NzAhead < n)
      for (uint64_t b = 0; b < count * kBlockBytes; b += 64)
        __builtin_prefetch(src + kNd2NzAhead * pitch + b);
    for (uint64_t j = 0; j < count; ++j)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j * plane_bytes),
                          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src) + j));
  }
}
#endif

void nd2nz_rows(const uint8_t* src, uint64_t pitch, uint64_t n, uint64_t blocks, uint64_t tail,
                uint8_t* out, uint64_t plane_bytes) {
#if defined(__SSE2__)
  static const bool avx2 = host_simd_at_least(HostSimd::kAvx2);
  if (avx2 && tail == 0) {
    if (blocks == 1) return nd2nz_rows_avx2<1>(src, pitch, n, blocks, out, plane_bytes);
    if (blocks == 2) return nd2nz_rows_avx2<2>(src, pitch, n, blocks, out, plane_bytes);
    return nd2nz_rows_avx2<0>(src, pitch, n, blocks, out, plane_bytes);
  }
#endif
  nd2nz_rows_generic(src, pitch, n, blocks, tail, out, plane_bytes);
}

// nd2nz: ND rows x cols (row pitch src_stride elements; rows may overlap in GM, a read) in GM
// -> NZ in L1
// Writes [ceil(cols/C0)][dst_rows][C0]; rows >= `rows` and columns >= `cols` are zero-filled.
// dst_rows need not be a multiple of 16: [pixels, C] with dst_rows = pixels is C/C0 planes of
// [pixels][C0] back to back (the convolution's slab, NC1HWC0).
struct Nd2Nz {
  uint64_t size, c0, xsrc, xdst, rows, cols, src_stride, dst_rows;
  isa::L2Hint l2;

  Nd2Nz(const Operands& o, const ExecContext& ctx) : l2(o.l2_hint()) {
    mte::require_path(o, ctx.cfg, Buf::GM, Buf::L1);
    size = fractal_elem_bytes(o, "type", o.dtype("type"));
    c0 = layout::c0_of(size);
    xsrc = o.addr("xsrc");
    xdst = o.addr("xdst");
    rows = o.count("rows", 1);
    cols = o.count("cols", 1);
    src_stride = o.count("src_stride", 1);
    dst_rows = o.count("dst_rows", 1);
    // dst_rows is the column blocks' stride in 32-byte blocks (the reference's Nd2Nz
    // dstNzC0Stride): any value >= rows; a multiple of 16 makes the blocks whole fractals.
    if (dst_rows < rows)
      o.fault(fmt::format("dst_rows = {} must be >= rows = {}", dst_rows, rows));
    mte::check_gm(o, ctx, "xsrc", xsrc, ((rows - 1) * src_stride + cols) * size);
    mte::check_local(o, ctx, "xdst", Buf::L1, xdst, dst_bytes());
  }

  uint64_t dst_bytes() const { return ceil_div(cols, c0) * dst_rows * c0 * size; }

  // bytes = the GM bytes read (rows * cols elements); one GM range per row unless contiguous.
  // The rows are issued one per cfg.nd2nz_row_cycles at most (contiguous rows too: the
  // conversion still requests row by row), which caps the transfer at a row's bytes per that.
  ExecCost cost(const ChipConfig& cfg) const {
    ExecCost c = mte::path_cost(cfg, Buf::GM, Buf::L1, rows * cols * size);
    if (cfg.nd2nz_row_cycles > 0)
      c.gm_request_rate = static_cast<double>(cols * size) / cfg.nd2nz_row_cycles;
    for (uint64_t r = 0; r < rows; ++r)
      mte::add_gm_range(c.gm, xsrc + r * src_stride * size, cols * size, false, l2);
    c.gm_issue_cycles = mte::issue_cycles(cfg, c.gm);  // contiguous rows: one run of bursts
    return c;
  }

  void run(ExecContext& ctx) const {
    uint8_t* out = ctx.local.at(Buf::L1, xdst, dst_bytes());
    const uint64_t full_blocks = cols / c0, tail = (cols % c0) * size;
    const uint64_t col_blocks = ceil_div(cols, c0), row_bytes = cols * size;
    // Zero what no row writes: rows rows..dst_rows-1 of every column block, and the padding
    // columns of a partial last block.
    if (dst_rows > rows)  // (most weight loads have none: a call per block saved)
      for (uint64_t j = 0; j < col_blocks; ++j)
        std::memset(out + (j * dst_rows + rows) * kBlockBytes, 0,
                    (dst_rows - rows) * kBlockBytes);
    // The rows in runs that lie in one device page each (one lookup, one host span); a row
    // that crosses a page boundary is read into a buffer and copied alone.
    constexpr uint64_t kPage = DeviceMemory::kPageBytes;
    const uint64_t pitch = src_stride * size, plane_bytes = dst_rows * kBlockBytes;
    thread_local std::vector<uint8_t> row;  // a GM row that crosses a page boundary
    for (uint64_t r = 0; r < rows;) {
      const uint64_t addr = xsrc + r * pitch, off = addr % kPage;
      uint8_t* dst = out + r * kBlockBytes;
      if (off + row_bytes <= kPage) {
        const uint64_t n = std::min(rows - r, (kPage - row_bytes - off) / pitch + 1);
        nd2nz_rows(ctx.gm.view(addr, (n - 1) * pitch + row_bytes), pitch, n, full_blocks, tail,
                   dst, plane_bytes);
        r += n;
      } else {
        row.resize(row_bytes);
        ctx.gm.read(addr, row.data(), row_bytes);
        nd2nz_rows(row.data(), pitch, 1, full_blocks, tail, dst, plane_bytes);
        ++r;
      }
    }
  }
};

// A 16 x 16 fractal of 2-byte elements transposed: out (c, r) = in (r, c). Exact copies. Rows of
// in and out are 32 bytes (kFractalRows elements) apart. Three rounds of unpacks (16-, 32- and
// 64-bit lanes) transpose an 8 x 8 block of 16-bit elements held one row a register; written
// out in full (GCC at -O2 left the loops over register arrays partly rolled, the arrays on the
// stack and the store positions in a table).
#if defined(__SSE2__)
// The 8 x 8 block at in (rows 32 bytes apart), transposed to out (rows 32 bytes apart).
inline void transpose_8x8_16bit_sse2(const uint8_t* in, uint8_t* out) {
  auto row = [in](int i) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i * kBlockBytes));
  };
  const __m128i r0 = row(0), r1 = row(1), r2 = row(2), r3 = row(3), r4 = row(4), r5 = row(5),
                r6 = row(6), r7 = row(7);
  // t: pairs of rows interleaved (columns 0-3 in lo, 4-7 in hi); u: four rows, two columns a
  // register; v: eight rows of one column.
  const __m128i t0 = _mm_unpacklo_epi16(r0, r1), t1 = _mm_unpackhi_epi16(r0, r1);
  const __m128i t2 = _mm_unpacklo_epi16(r2, r3), t3 = _mm_unpackhi_epi16(r2, r3);
  const __m128i t4 = _mm_unpacklo_epi16(r4, r5), t5 = _mm_unpackhi_epi16(r4, r5);
  const __m128i t6 = _mm_unpacklo_epi16(r6, r7), t7 = _mm_unpackhi_epi16(r6, r7);
  const __m128i u0 = _mm_unpacklo_epi32(t0, t2), u1 = _mm_unpackhi_epi32(t0, t2);
  const __m128i u2 = _mm_unpacklo_epi32(t1, t3), u3 = _mm_unpackhi_epi32(t1, t3);
  const __m128i u4 = _mm_unpacklo_epi32(t4, t6), u5 = _mm_unpackhi_epi32(t4, t6);
  const __m128i u6 = _mm_unpacklo_epi32(t5, t7), u7 = _mm_unpackhi_epi32(t5, t7);
  auto put = [out](int c, __m128i v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c * kBlockBytes), v);
  };
  put(0, _mm_unpacklo_epi64(u0, u4));
  put(1, _mm_unpackhi_epi64(u0, u4));
  put(2, _mm_unpacklo_epi64(u1, u5));
  put(3, _mm_unpackhi_epi64(u1, u5));
  put(4, _mm_unpacklo_epi64(u2, u6));
  put(5, _mm_unpackhi_epi64(u2, u6));
  put(6, _mm_unpacklo_epi64(u3, u7));
  put(7, _mm_unpackhi_epi64(u3, u7));
}

// Both 8 x 8 blocks of one column half at once: register i holds row i's 8 columns of the half
// in its low 128-bit lane and row i + 8's in its high lane, so the same unpacks (which work
// within lanes) leave in register c column c's rows 0-7 low and 8-15 high: out's row c whole.
// Row i's 16 bytes at s (rows 32 bytes apart) in the low lane, row i + 8's in the high lane.
__attribute__((target("avx2"), always_inline)) inline __m256i rows_i_and_i8(const uint8_t* s,
                                                                            int i) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i * kBlockBytes));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + (i + 8) * kBlockBytes));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

__attribute__((target("avx2"))) void transpose_fractal_16bit_avx2(const uint8_t* in,
                                                                  uint8_t* out) {
  for (int half = 0; half < 2; ++half) {
    const uint8_t* s = in + half * (kBlockBytes / 2);
    const __m256i r0 = rows_i_and_i8(s, 0), r1 = rows_i_and_i8(s, 1), r2 = rows_i_and_i8(s, 2),
                  r3 = rows_i_and_i8(s, 3), r4 = rows_i_and_i8(s, 4), r5 = rows_i_and_i8(s, 5),
                  r6 = rows_i_and_i8(s, 6), r7 = rows_i_and_i8(s, 7);
    const __m256i t0 = _mm256_unpacklo_epi16(r0, r1), t1 = _mm256_unpackhi_epi16(r0, r1);
    const __m256i t2 = _mm256_unpacklo_epi16(r2, r3), t3 = _mm256_unpackhi_epi16(r2, r3);
    const __m256i t4 = _mm256_unpacklo_epi16(r4, r5), t5 = _mm256_unpackhi_epi16(r4, r5);
    const __m256i t6 = _mm256_unpacklo_epi16(r6, r7), t7 = _mm256_unpackhi_epi16(r6, r7);
    const __m256i u0 = _mm256_unpacklo_epi32(t0, t2), u1 = _mm256_unpackhi_epi32(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi32(t1, t3), u3 = _mm256_unpackhi_epi32(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi32(t4, t6), u5 = _mm256_unpackhi_epi32(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi32(t5, t7), u7 = _mm256_unpackhi_epi32(t5, t7);
    __m256i* d = reinterpret_cast<__m256i*>(out + half * 8 * kBlockBytes);  // 32-byte rows
    _mm256_storeu_si256(d + 0, _mm256_unpacklo_epi64(u0, u4));
    _mm256_storeu_si256(d + 1, _mm256_unpackhi_epi64(u0, u4));
    _mm256_storeu_si256(d + 2, _mm256_unpacklo_epi64(u1, u5));
    _mm256_storeu_si256(d + 3, _mm256_unpackhi_epi64(u1, u5));
    _mm256_storeu_si256(d + 4, _mm256_unpacklo_epi64(u2, u6));
    _mm256_storeu_si256(d + 5, _mm256_unpackhi_epi64(u2, u6));
    _mm256_storeu_si256(d + 6, _mm256_unpacklo_epi64(u3, u7));
    _mm256_storeu_si256(d + 7, _mm256_unpackhi_epi64(u3, u7));
  }
}
#endif

void transpose_fractal_16bit(const uint8_t* in, uint8_t* out) {
#if defined(__SSE2__)
  static const bool avx2 = host_simd_at_least(HostSimd::kAvx2);
  if (avx2) return transpose_fractal_16bit_avx2(in, out);
  // The four 8 x 8 blocks, each to its mirrored position.
  const uint64_t half = kBlockBytes / 2, down = 8 * kBlockBytes;
  transpose_8x8_16bit_sse2(in, out);
  transpose_8x8_16bit_sse2(in + half, out + down);
  transpose_8x8_16bit_sse2(in + down, out + half);
  transpose_8x8_16bit_sse2(in + down + half, out + down + half);
#else
  for (uint64_t r = 0; r < kFractalRows; ++r)
    for (uint64_t c = 0; c < kFractalRows; ++c)
      std::memcpy(out + (c * kFractalRows + r) * 2, in + (r * kFractalRows + c) * 2, 2);
#endif
}

// load2d: nfrac fractals L1 -> L0A/L0B, optional 16x16 transpose (16-bit types)
struct Load2d {
  Buf dst;
  uint64_t xsrc, xdst, nfrac, src_stride;
  bool transpose;

  Load2d(const Operands& o, const ExecContext& ctx) {
    Dtype t = o.dtype("type");
    uint64_t size = fractal_elem_bytes(o, "type", t);
    dst = o.buf("dst");
    if (dst != Buf::L0A && dst != Buf::L0B)
      o.fault(fmt::format("dst = {} must be l0a or l0b", isa::buf_name(dst)));
    mte::require_path(o, ctx.cfg, Buf::L1, dst);
    xsrc = o.addr("xsrc");
    xdst = o.addr("xdst");
    nfrac = o.count("nfrac", 1);
    src_stride = o.count("src_stride", 0);
    transpose = o.count("transpose", 0) != 0;
    if (transpose && size != 2)
      o.fault(fmt::format("transpose needs a 16-bit type, not {}", isa::dtype_name(t)));
    mte::check_local(o, ctx, "xsrc", Buf::L1, xsrc, ((nfrac - 1) * src_stride + 1) * kFractalBytes);
    mte::check_local(o, ctx, "xdst", dst, xdst, nfrac * kFractalBytes);
  }

  ExecCost cost(const ChipConfig& cfg) const {
    return mte::path_cost(cfg, Buf::L1, dst, nfrac * kFractalBytes);
  }

  void run(ExecContext& ctx) const {
    uint8_t* out = ctx.local.at(dst, xdst, nfrac * kFractalBytes);
    // The fractals' whole span, looked up once (the constructor checked it).
    const uint8_t* src =
        ctx.local.at(Buf::L1, xsrc, ((nfrac - 1) * src_stride + 1) * kFractalBytes);
    for (uint64_t f = 0; f < nfrac; ++f) {
      const uint8_t* in = src + f * src_stride * kFractalBytes;
      uint8_t* o = out + f * kFractalBytes;
      if (!transpose) {  // 32 bytes at a time: a 512-byte memcpy compiles to `rep movsq`
        for (uint64_t b = 0; b < kFractalBytes; b += kBlockBytes)
          std::memcpy(o + b, in + b, kBlockBytes);
        continue;
      }
      transpose_fractal_16bit(in, o);
    }
  }
};

// n 32-byte blocks from src to dst (contiguous at both ends; not overlapping): the runs of
// img2col's whole blocks. A memcpy of n * 32 bytes (at most 512) compiles to `rep movsq`, whose
// start-up cost exceeds such a copy; a memcpy per block, two 16-byte moves in the SSE2 baseline.
void copy_blocks_sse2(uint8_t* dst, const uint8_t* src, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i)
    std::memcpy(dst + i * kBlockBytes, src + i * kBlockBytes, kBlockBytes);
}

#if defined(__SSE2__)
// The same with one 32-byte move per block, two blocks a step.
__attribute__((target("avx2"))) void copy_blocks_avx2(uint8_t* dst, const uint8_t* src,
                                                      uint64_t n) {
  auto* d = reinterpret_cast<__m256i*>(dst);
  const auto* s = reinterpret_cast<const __m256i*>(src);
  uint64_t i = 0;
  for (; i + 2 <= n; i += 2) {
    const __m256i a = _mm256_loadu_si256(s + i), b = _mm256_loadu_si256(s + i + 1);
    _mm256_storeu_si256(d + i, a);
    _mm256_storeu_si256(d + i + 1, b);
  }
  if (i < n) _mm256_storeu_si256(d + i, _mm256_loadu_si256(s + i));
}
#endif

using CopyBlocks = void (*)(uint8_t* dst, const uint8_t* src, uint64_t n);
CopyBlocks copy_blocks_for_host() {
#if defined(__SSE2__)
  if (host_simd_at_least(HostSimd::kAvx2)) return copy_blocks_avx2;
#endif
  return copy_blocks_sse2;
}

// load3d: img2col of an L1 feature map [C1][H][W][C0] into L0A (Zz)
// Row m = oh*OW + ow (rows >= OH*OW read zero), column k = ((c1*KH + kh)*KW + kw)*C0 + c0.
// Taps outside the (unpadded) image and channels >= `channels` read zero.
// load3dt (transposed): the same window, written as its transpose (k_ext rows x m_ext columns,
// Zz): each 16 x 16 fractal transposed and placed at (column block, row block); 16-bit types.
struct Load3d {
  uint64_t size, c0, xsrc, xdst, channels, m_start, m_ext, k_start, k_ext;
  int64_t h, w, oh_count, ow_count;
  FMatrix fm;
  L3dGeom g;
  bool transposed;

  Load3d(const Operands& o, const ExecContext& ctx, const IssuedOp& op, bool transpose)
      : fm(op.fmatrix), g(op.l3d), transposed(transpose) {
    Dtype t = o.dtype("type");
    if (t != Dtype::F16 && t != Dtype::BF16 && t != Dtype::F32 && t != Dtype::S8)
      o.fault(fmt::format("type = {} is not a cube input type (f16, bf16, f32, s8)",
                          isa::dtype_name(t)));
    size = static_cast<uint64_t>(isa::dtype_size(t));
    if (transposed && size != 2)
      o.fault(fmt::format("load3dt transposes 16 x 16 fractals: a 16-bit type, not {}",
                          isa::dtype_name(t)));
    c0 = layout::c0_of(size);
    mte::require_path(o, ctx.cfg, Buf::L1, Buf::L0A);
    xsrc = o.addr("xsrc");
    xdst = o.addr("xdst");
    channels = o.count("channels", 1);
    m_start = o.count("m_start", 0);
    m_ext = o.count("m_ext", 1);
    k_start = o.count("k_start", 0);
    k_ext = o.count("k_ext", 1);
    if (m_ext % kFractalRows != 0)
      o.fault(fmt::format("m_ext = {} is not a multiple of {}", m_ext, kFractalRows));
    if (k_ext % c0 != 0 || k_start % c0 != 0)
      o.fault(fmt::format("k_start = {} and k_ext = {} must be multiples of C0 = {}", k_start,
                          k_ext, c0));
    if (g.kh < 1 || g.kw < 1 || g.stride_h < 1 || g.stride_w < 1 || g.dilation_h < 1 ||
        g.dilation_w < 1)
      o.fault(fmt::format("set_l3d_geom kh={} kw={} stride={}x{} dilation={}x{}: all must be >= 1",
                          g.kh, g.kw, g.stride_h, g.stride_w, g.dilation_h, g.dilation_w));
    h = fm.h;
    w = fm.w;
    const int64_t hw_max = static_cast<int64_t>(isa::field_imm_max(isa::FieldKind::RU16));
    if (h < 1 || w < 1 || h > hw_max || w > hw_max || fm.pad_top < 0 || fm.pad_bottom < 0 ||
        fm.pad_left < 0 || fm.pad_right < 0)
      o.fault(fmt::format("set_fmatrix h={} w={} must be in [1, {}] with non-negative pads", h, w,
                          hw_max));
    int64_t span_h = h + fm.pad_top + fm.pad_bottom - int64_t(g.dilation_h) * (g.kh - 1) - 1;
    int64_t span_w = w + fm.pad_left + fm.pad_right - int64_t(g.dilation_w) * (g.kw - 1) - 1;
    if (span_h < 0 || span_w < 0)
      o.fault(fmt::format("the {}x{} kernel (dilation {}x{}) does not fit the padded {}x{} map",
                          g.kh, g.kw, g.dilation_h, g.dilation_w,
                          h + fm.pad_top + fm.pad_bottom, w + fm.pad_left + fm.pad_right));
    oh_count = span_h / g.stride_h + 1;
    ow_count = span_w / g.stride_w + 1;
    uint64_t c1_count = ceil_div(channels, c0);
    if (k_start + k_ext > c1_count * k_per_c1())
      o.fault(fmt::format("columns [{}, {}) exceed the img2col width {} (C1={} x {}x{} x C0={})",
                          k_start, k_start + k_ext, c1_count * k_per_c1(), c1_count, g.kh, g.kw,
                          c0));
    // The feature map up to the last channel block c1 the column range touches (each block a
    // full H x W x C0 plane).
    uint64_t plane = uint64_t(h) * uint64_t(w) * c0 * size;
    mte::check_local(o, ctx, "xsrc", Buf::L1, xsrc, (last_c1() + 1) * plane);
    mte::check_local(o, ctx, "xdst", Buf::L0A, xdst, dst_bytes());
  }

  uint64_t dst_bytes() const { return m_ext * k_ext * size; }
  uint64_t k_per_c1() const { return uint64_t(g.kh) * uint64_t(g.kw) * c0; }
  uint64_t last_c1() const { return (k_start + k_ext - 1) / k_per_c1(); }

  ExecCost cost(const ChipConfig& cfg) const {
    return mte::path_cost(cfg, Buf::L1, Buf::L0A, dst_bytes());
  }

  void run(ExecContext& ctx) const {
    uint8_t* l0a = ctx.local.at(Buf::L0A, xdst, dst_bytes());
    if (!transposed) {
      img2col(ctx, l0a);
      return;
    }
    // The window in the Zz layout (fractal (row block r, column block kb) at r * k_blocks + kb),
    // then each fractal transposed to (kb, r): index kb * m_blocks + r.
    thread_local std::vector<uint8_t> window;  // grown once, not allocated per instruction
    window.resize(std::max<size_t>(window.size(), dst_bytes()));
    img2col(ctx, window.data());
    const uint64_t k_blocks = k_ext / c0, m_blocks = m_ext / kFractalRows;
    for (uint64_t r = 0; r < m_blocks; ++r)
      for (uint64_t kb = 0; kb < k_blocks; ++kb)
        transpose_fractal_16bit(window.data() + (r * k_blocks + kb) * kFractalBytes,
                                l0a + (kb * m_blocks + r) * kFractalBytes);
  }

  // The img2col window in the Zz layout at out (dst_bytes()).
  void img2col(ExecContext& ctx, uint8_t* out) const {
    const uint64_t block = c0 * size;  // one C0 run of one tap: 32 bytes
    const uint64_t k_blocks = k_ext / c0;
    const uint64_t kc1 = k_per_c1();
    const uint8_t* fmap = ctx.local.at(Buf::L1, xsrc, (last_c1() + 1) * h * w * block);
    // Every 32-byte block of the output is written once below: a tap's channels (zero-padded
    // past `channels`), or zeros for taps outside the image and for rows at or past rows_total
    // (not output positions).
    const uint64_t rows_total = uint64_t(oh_count * ow_count);
    const uint64_t rows = m_start >= rows_total ? 0 : std::min(m_ext, rows_total - m_start);
    static const CopyBlocks copy_blocks = copy_blocks_for_host();
    for (uint64_t kb = 0; kb < k_blocks; ++kb) {
      // The column block's channel block c1 and tap (kh, kw), then its rows in order.
      const uint64_t k = k_start + kb * c0;
      const uint64_t c1 = k / kc1, tap = (k % kc1) / c0;
      const int64_t kh = int64_t(tap) / g.kw, kw = int64_t(tap) % g.kw;
      const uint64_t valid_c0 = std::min(c0, channels - std::min(channels, c1 * c0));
      const uint8_t* plane = fmap + c1 * h * w * block;
      // Row rr of this column block lands at Zz element offset
      // ((rr / 16) * k_blocks + kb) * 16 * c0 + (rr % 16) * c0, i.e. one 32-byte block.
      auto dst_of = [&](uint64_t rr) {
        return out + (((rr / kFractalRows) * k_blocks + kb) * kFractalRows + rr % kFractalRows) *
                         kBlockBytes;
      };
      auto copy_rows = [&](auto bytes) {
        // With stride_w 1 and whole blocks, the rows of one output row that read inside the
        // image and share a fractal are one run of consecutive blocks at both ends.
        constexpr bool kWhole = std::is_same_v<decltype(bytes),
                                               std::integral_constant<uint64_t, kBlockBytes>>;
        int64_t oh = int64_t(m_start) / ow_count, ow = int64_t(m_start) % ow_count;
        for (uint64_t rr = 0; rr < rows;) {
          int64_t ih = oh * g.stride_h - fm.pad_top + kh * g.dilation_h;
          int64_t iw = ow * g.stride_w - fm.pad_left + kw * g.dilation_w;
          uint8_t* dst = dst_of(rr);
          uint64_t run = 1;
          if (ih >= 0 && ih < h && iw >= 0 && iw < w) {
            if constexpr (kWhole) {
              if (g.stride_w == 1)
                run = std::min({uint64_t(ow_count - ow), uint64_t(w - iw),
                                kFractalRows - rr % kFractalRows, rows - rr});
              copy_blocks(dst, plane + (ih * w + iw) * block, run);
            } else {
              mte::copy_block_prefix(dst, plane + (ih * w + iw) * block, bytes);
            }
          } else {
            std::memset(dst, 0, kBlockBytes);
          }
          rr += run;
          ow += int64_t(run);
          if (ow == ow_count) {
            ow = 0;
            ++oh;
          }
        }
      };
      if (valid_c0 == c0) copy_rows(std::integral_constant<uint64_t, kBlockBytes>{});
      else copy_rows(valid_c0 * size);
      for (uint64_t rr = rows; rr < m_ext; ++rr) std::memset(dst_of(rr), 0, kBlockBytes);
    }
  }
};

// fixpipe: L0C (NZ, f32/s32) -> GM / L1 / UB with conversion, ReLU and NZ->ND
enum class FixConv { F32_F32, F32_F16, F32_BF16, F32_S8, S32_S32, S32_F16, S32_S8 };

// Quantisation to s8: round to nearest even, saturate to [-128, 127]; NaN -> 0.
inline int8_t quantise_s8(float v) {
  if (std::isnan(v)) return 0;
  v = std::clamp(v, -128.0f, 127.0f);
  float r = std::floor(v), frac = v - r;  // exact for |v| <= 128
  if (frac > 0.5f || (frac == 0.5f && std::fmod(r, 2.0f) != 0)) r += 1;  // independent of fenv
  return static_cast<int8_t>(r);
}

// One L0C value (raw 32-bit word) of a float-producing conversion, before narrowing. Order of
// operations: value (* scale for quantising conversions, in fp32) -> ReLU (v < 0 ? 0 : v).
template <FixConv kConv>
inline float fix_value(uint32_t word, float scale, bool relu) {
  float v;
  if constexpr (kConv == FixConv::S32_F16 || kConv == FixConv::S32_S8)
    v = static_cast<float>(static_cast<int32_t>(word)) * scale;  // s32->fp32 rounds RNE
  else if constexpr (kConv == FixConv::F32_S8)
    v = bits_to_f32(word) * scale;
  else
    v = bits_to_f32(word);
  if (relu && v < 0) v = 0;
  return v;
}

// n L0C words copied as f32 values to out (any alignment), each through fix_value's ReLU when
// relu is set (v < 0 ? +0 : v, so NaN and -0 stay as they are), 4 lanes at a time. (A plain
// memcpy of up to 1 KiB compiles to `rep movsq`, and the scalar ReLU branches per value.)
inline void copy_f32_relu(const uint32_t* in, uint8_t* out, uint64_t n, bool relu) {
  uint64_t i = 0;
#if defined(__SSE2__)
  const __m128 zero = _mm_setzero_ps();
  for (; i + 4 <= n; i += 4) {
    __m128 x = _mm_loadu_ps(reinterpret_cast<const float*>(in + i));
    if (relu) x = _mm_andnot_ps(_mm_cmplt_ps(x, zero), x);  // ordered: NaN < 0 false
    _mm_storeu_ps(reinterpret_cast<float*>(out + i * 4), x);
  }
#endif
  for (; i < n; ++i) {
    const uint32_t w = relu && bits_to_f32(in[i]) < 0 ? 0u : in[i];
    std::memcpy(out + i * 4, &w, 4);
  }
}

#if defined(__SSE2__)
// One row of a column block of C, 16 L0C f32 values at in, narrowed to f16 at out (32 bytes)
// straight from L0C: the bits convert_row<FixConv::F32_F16> gives (ReLU as copy_f32_relu, v < 0
// ? +0 : v with NaN and -0 kept; then f32_to_f16_n's vcvtps2ph, RNE, with eight values that hold
// a NaN redone by the scalar narrowing), without gathering the row and staging its floats first.
__attribute__((target("avx,f16c"))) void fix_block_f32_f16(const uint8_t* in, bool relu,
                                                           uint8_t* out) {
  const __m256 zero = _mm256_setzero_ps();
  for (int half = 0; half < 2; ++half) {
    __m256 f = _mm256_loadu_ps(reinterpret_cast<const float*>(in) + 8 * half);
    if (relu) f = _mm256_andnot_ps(_mm256_cmp_ps(f, zero, _CMP_LT_OQ), f);  // NaN < 0: false
    uint8_t* o = out + 16 * half;
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o),
                     _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    if (_mm256_movemask_ps(_mm256_cmp_ps(f, f, _CMP_UNORD_Q))) {
      float v[8];
      _mm256_storeu_ps(v, f);
      f32_to_f16_n(v, o, 8, /*allow_hw=*/false);
    }
  }
}
#endif

// Converts one row of n L0C values (raw 32-bit words) into dst elements: fix_value, then narrow.
template <FixConv kConv>
void convert_row(const uint32_t* in, uint8_t* out, uint64_t n, float scale, bool relu) {
  if constexpr (kConv == FixConv::F32_F16 || kConv == FixConv::S32_F16) {
    constexpr uint64_t kChunk = 256;  // values narrowed per bulk call
    float v[kChunk];
    for (uint64_t i0 = 0; i0 < n; i0 += kChunk) {
      const uint64_t cnt = std::min(kChunk, n - i0);
      if constexpr (kConv == FixConv::F32_F16) {  // fix_value's steps, 4 lanes at a time
        copy_f32_relu(in + i0, reinterpret_cast<uint8_t*>(v), cnt, relu);
      } else {
        for (uint64_t i = 0; i < cnt; ++i) v[i] = fix_value<kConv>(in[i0 + i], scale, relu);
      }
      f32_to_f16_n(v, out + i0 * 2, cnt);
    }
    return;
  }
  if constexpr (kConv == FixConv::F32_F32) {  // the word itself, or +0 for a value below 0
    copy_f32_relu(in, out, n, relu);
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    if constexpr (kConv == FixConv::S32_S32) {
      int32_t v = static_cast<int32_t>(in[i]);
      if (relu && v < 0) v = 0;
      std::memcpy(out + i * 4, &v, 4);
    } else {
      float v = fix_value<kConv>(in[i], scale, relu);
      if constexpr (kConv == FixConv::F32_BF16) {
        uint16_t b = f32_to_bf16(v);
        std::memcpy(out + i * 2, &b, 2);
      } else {
        out[i] = static_cast<uint8_t>(quantise_s8(v));
      }
    }
  }
}

// Reads C (m x n) from L0C at xsrc (NZ with M16 = round_up(m, 16), as mmad wrote it). Output
// nz2nd=1: m rows of n elements at a pitch of dst_stride elements (the gaps are not written);
// nz2nd=0: the whole [ceil(n/C0)][dst_stride][C0] region of the dst type (C0 = 32 / size),
// rows >= m and columns >= n zero-filled, like nd2nz's output. Conversions: f32 -> f32 / f16 /
// bf16 (RNE, scale ignored), f32 -> s8 and s32 -> s8 / f16 (value * scale in fp32, then RNE,
// s8 saturating), s32 -> s32 (scale ignored).
struct Fixpipe {
  Buf dst;
  Dtype src_type, dst_type;
  FixConv conv;
  uint64_t dsize, c0, xsrc, xdst, m, n, dst_stride;
  bool nz2nd, relu;
  float scale;
  isa::L2Hint l2;

  Fixpipe(const Operands& o, const ExecContext& ctx) : l2(o.l2_hint()) {
    src_type = o.dtype("src_type");
    dst_type = o.dtype("dst_type");
    dst = o.buf("dst");
    if (dst != Buf::GM && dst != Buf::L1 && dst != Buf::UB)
      o.fault(fmt::format("dst = {} must be gm, l1 or ub", isa::buf_name(dst)));
    if (dst != Buf::GM && l2 != isa::L2Hint::NORMAL)
      o.fault(fmt::format("L2 policy .{} needs dst = gm (got {})", isa::l2_hint_name(l2),
                          isa::buf_name(dst)));
    mte::require_path(o, ctx.cfg, Buf::L0C, dst);
    conv = conversion(o);
    dsize = static_cast<uint64_t>(isa::dtype_size(dst_type));
    c0 = layout::c0_of(dsize);
    xsrc = o.addr("xsrc");
    xdst = o.addr("xdst");
    m = o.count("m", 1);
    n = o.count("n", 1);
    dst_stride = o.count("dst_stride", 1);
    nz2nd = o.count("nz2nd", 0) != 0;
    relu = o.count("relu", 0) != 0;
    scale = bits_to_f32(static_cast<uint32_t>(o.raw("xscale")));
    if (nz2nd && dst_stride < n)
      o.fault(fmt::format("dst_stride = {} elements is less than n = {}", dst_stride, n));
    if (!nz2nd && dst_stride < m)
      o.fault(fmt::format("dst_stride = {} rows is less than m = {}", dst_stride, m));
    mte::check_local(o, ctx, "xsrc", Buf::L0C, xsrc, layout::l0c_extent(m, n) * 4);
    mte::check_range(o, ctx, "xdst", dst, xdst, dst_extent());
  }

  FixConv conversion(const Operands& o) const {
    using D = Dtype;
    if (src_type == D::F32) {
      if (dst_type == D::F32) return FixConv::F32_F32;
      if (dst_type == D::F16) return FixConv::F32_F16;
      if (dst_type == D::BF16) return FixConv::F32_BF16;
      if (dst_type == D::S8) return FixConv::F32_S8;
    } else if (src_type == D::S32) {
      if (dst_type == D::S32) return FixConv::S32_S32;
      if (dst_type == D::F16) return FixConv::S32_F16;
      if (dst_type == D::S8) return FixConv::S32_S8;
    }
    o.fault(fmt::format("conversion {} -> {} is not supported (f32 -> f32/f16/bf16/s8, "
                        "s32 -> s32/f16/s8)",
                        isa::dtype_name(src_type), isa::dtype_name(dst_type)));
  }

  // Bytes from xdst to the end of the last element written. ND: m rows of n elements at a pitch
  // of dst_stride elements. NZ: the whole [ceil(n/C0)][dst_stride][C0] region (padding zeroed).
  uint64_t dst_extent() const {
    if (nz2nd) return ((m - 1) * dst_stride + n) * dsize;
    return ceil_div(n, c0) * dst_stride * c0 * dsize;
  }

  // bytes = the bytes written at the destination (for NZ including the zero padding).
  ExecCost cost(const ChipConfig& cfg) const {
    uint64_t bytes = nz2nd ? m * n * dsize : dst_extent();
    ExecCost c = mte::path_cost(cfg, Buf::L0C, dst, bytes);
    if (dst == Buf::GM) {
      if (nz2nd)
        for (uint64_t r = 0; r < m; ++r)
          mte::add_gm_range(c.gm, xdst + r * dst_stride * dsize, n * dsize, true, l2);
      else
        mte::add_gm_range(c.gm, xdst, dst_extent(), true, l2);
    }
    return c;
  }

  // Rows are converted one at a time into the destination (L0C is never a destination, so the
  // source cannot change while it is read). A local destination is written in place; a GM one
  // too where an ND row lies in one device page, else through a staging buffer (ND: one row,
  // NZ: the whole region, written with one GM write).
  void run(ExecContext& ctx) const {
    const uint64_t m16 = round_up(m, kFractalRows);
    const uint8_t* l0c = ctx.local.at(Buf::L0C, xsrc, layout::l0c_extent(m, n) * 4);
    thread_local std::vector<uint32_t> row_in;  // one row of C as L0C words
    thread_local std::vector<uint8_t> staging;  // converted values on their way to GM / NZ
    row_in.resize(n);
    const uint64_t n_full = n / kFractalRows * kFractalRows;
    auto gather_row = [&](uint64_t r) {
      for (uint64_t c = 0; c < n_full; c += kFractalRows)
        std::memcpy(&row_in[c], l0c + layout::l0c_offset(r, c, m16) * 4, kFractalRows * 4);
      if (n_full != n)
        std::memcpy(&row_in[n_full], l0c + layout::l0c_offset(r, n_full, m16) * 4,
                    (n - n_full) * 4);
    };
    // f32 -> f16 on an F16C host: the whole column blocks of a row converted from L0C in place
    // (fix_block_f32_f16), only the last partial block's values gathered. f32 -> f32 (where L0C
    // is 4-byte aligned): each column block's values copied from L0C in place.
#if defined(__SSE2__)
    static const bool f16c = host_simd_at_least(HostSimd::kAvx2);
    const bool from_l0c = f16c && conv == FixConv::F32_F16;
#else
    const bool from_l0c = false;
#endif
    const bool f32_in_place =
        conv == FixConv::F32_F32 && reinterpret_cast<uintptr_t>(l0c) % alignof(uint32_t) == 0;
    // Row r of C converted to out (n values of the dst type).
    auto convert_row_of_c = [&](uint64_t r, uint8_t* out) {
      if (f32_in_place) {
        for (uint64_t c = 0; c < n; c += kFractalRows)
          copy_f32_relu(reinterpret_cast<const uint32_t*>(l0c) + layout::l0c_offset(r, c, m16),
                        out + c * 4, std::min(kFractalRows, n - c), relu);
        return;
      }
#if defined(__SSE2__)
      if (from_l0c) {
        for (uint64_t c = 0; c < n_full; c += kFractalRows)
          fix_block_f32_f16(l0c + layout::l0c_offset(r, c, m16) * 4, relu, out + c * 2);
        if (n_full != n) {
          std::memcpy(row_in.data(), l0c + layout::l0c_offset(r, n_full, m16) * 4,
                      (n - n_full) * 4);
          convert_row<FixConv::F32_F16>(row_in.data(), out + n_full * 2, n - n_full, scale,
                                        relu);
        }
        return;
      }
#endif
      gather_row(r);
      convert(row_in.data(), out);
    };
    const uint64_t row_bytes = n * dsize;
    if (nz2nd) {
      if (dst != Buf::GM) {
        for (uint64_t r = 0; r < m; ++r)
          convert_row_of_c(r, ctx.local.at(dst, xdst + r * dst_stride * dsize, row_bytes));
        return;
      }
      // A row inside one device page is converted in place; one that crosses a page boundary
      // goes through the staging row.
      staging.resize(row_bytes);
      for (uint64_t r = 0; r < m; ++r) {
        const uint64_t addr = xdst + r * dst_stride * dsize;
        if (uint8_t* in_place = ctx.gm.span_for_write(addr, row_bytes)) {
          convert_row_of_c(r, in_place);
        } else {
          convert_row_of_c(r, staging.data());
          ctx.gm.write(addr, staging.data(), row_bytes);
        }
      }
      return;
    }
    // NZ: [ceil(n/C0)][dst_stride][C0], zero outside the m x n values.
    const uint64_t extent = dst_extent();
    uint8_t* nz;
    if (dst == Buf::GM) {
      staging.assign(extent + row_bytes, 0);  // the region, then one converted row
      nz = staging.data();
    } else {
      nz = ctx.local.at(dst, xdst, extent);
      std::memset(nz, 0, extent);
      staging.resize(row_bytes);
    }
    uint8_t* row_out = dst == Buf::GM ? staging.data() + extent : staging.data();
    const uint64_t c_full = n / c0 * c0;
    for (uint64_t r = 0; r < m; ++r) {
      convert_row_of_c(r, row_out);
      for (uint64_t c = 0; c < c_full; c += c0)
        std::memcpy(nz + layout::nz_offset(r, c, dst_stride, c0) * dsize, row_out + c * dsize,
                    kBlockBytes);
      if (c_full != n)
        std::memcpy(nz + layout::nz_offset(r, c_full, dst_stride, c0) * dsize,
                    row_out + c_full * dsize, (n - c_full) * dsize);
    }
    if (dst == Buf::GM) ctx.gm.write(xdst, nz, extent);
  }

  void convert(const uint32_t* in, uint8_t* out) const {
    switch (conv) {
      case FixConv::F32_F32: return convert_row<FixConv::F32_F32>(in, out, n, scale, relu);
      case FixConv::F32_F16: return convert_row<FixConv::F32_F16>(in, out, n, scale, relu);
      case FixConv::F32_BF16: return convert_row<FixConv::F32_BF16>(in, out, n, scale, relu);
      case FixConv::F32_S8: return convert_row<FixConv::F32_S8>(in, out, n, scale, relu);
      case FixConv::S32_S32: return convert_row<FixConv::S32_S32>(in, out, n, scale, relu);
      case FixConv::S32_F16: return convert_row<FixConv::S32_F16>(in, out, n, scale, relu);
      case FixConv::S32_S8: return convert_row<FixConv::S32_S8>(in, out, n, scale, relu);
    }
  }
};

// Decodes (and so checks) op, then hands the descriptor to f.
template <typename F>
auto with_descriptor(const IssuedOp& op, const ExecContext& ctx, F&& f) {
  Operands o(op);
  switch (op.op()) {
    case Opcode::op_copy_gm2l1: return f(BurstCopy(o, ctx, Buf::GM, Buf::L1));
    case Opcode::op_copy_gm2ub: return f(BurstCopy(o, ctx, Buf::GM, Buf::UB));
    case Opcode::op_copy_l12ub: return f(BurstCopy(o, ctx, Buf::L1, Buf::UB));
    case Opcode::op_copy_l12bt: return f(BurstCopy(o, ctx, Buf::L1, Buf::BT));
    case Opcode::op_copy_ub2gm: return f(BurstCopy(o, ctx, Buf::UB, Buf::GM));
    case Opcode::op_copy_ub2l1: return f(BurstCopy(o, ctx, Buf::UB, Buf::L1));
    case Opcode::op_nd2nz: return f(Nd2Nz(o, ctx));
    case Opcode::op_load2d: return f(Load2d(o, ctx));
    case Opcode::op_load3d: return f(Load3d(o, ctx, op, false));
    case Opcode::op_load3dt: return f(Load3d(o, ctx, op, true));
    case Opcode::op_fixpipe: return f(Fixpipe(o, ctx));
    default: o.fault("not an MTE or FIXPIPE instruction");
  }
}

}  // namespace

ExecCost plan_mte(const IssuedOp& op, const ExecContext& ctx) {
  return with_descriptor(op, ctx, [&](const auto& d) { return d.cost(ctx.cfg); });
}

void execute_mte(const IssuedOp& op, ExecContext& ctx) {
  with_descriptor(op, ctx, [&](const auto& d) { d.run(ctx); });
}

std::unique_ptr<PreparedOp> prepare_mte(const IssuedOp& op, const ExecContext& ctx) {
  return with_descriptor(op, ctx, [](const auto& d) -> std::unique_ptr<PreparedOp> {
    return std::make_unique<PreparedDescriptor<std::decay_t<decltype(d)>>>(d);
  });
}

}  // namespace npusim
