// Pooling on the vector cores, NHWC as TensorFlow gives it (attrs ksize, strides, padding SAME
// or VALID, data_format NHWC):
//   MaxPool(x) -> y, AvgPool(x) -> y,
//   MaxPoolGrad(orig_input, orig_output, grad) -> dx, AvgPoolGrad(orig_input_shape, grad) -> dx
//   (orig_input_shape as an attribute, the tensor itself optional: docs/compiler.md).
//
// One kernel ("window kernel") per op. Work items are (row, channel group): a row is an output
// row (n, oh) for the forward ops and an input row (n, ih) for the gradients; a channel group
// is ct channels of every pixel of the row (ct from the UB capacity). Blocks take contiguous
// item ranges. Everything is computed on f32 lanes (f16/bf16 rows are widened exactly by
// vconv on arrival and rounded to nearest even once on the way out). A row of pixels lives in
// the UB as [pixel][ct] f32, so a window tap is a vector operation over pixels with a repeat per
// pixel (64 channels per repeat, masked for a partial group), the pixel pitches as repeat
// strides: stride sw on the input side. Padding taps are never read: each tap runs over the
// output pixels whose input pixel lies inside the row, and rows outside the map are skipped.
//   MaxPool    y = max over the valid taps (starting from -inf).
//   AvgPool    y = sum over the valid taps * 1/rows(oh) * 1/cols(ow), the counts of valid
//              rows and columns of the window (TF divides by the number of valid elements).
//   AvgPoolGrad dx[ih][iw] = sum over the windows (oh, ow) holding (ih, iw) of
//              dy[oh][ow] / count(oh, ow): per row ih, for each window row oh covering it, dy's
//              row oh scaled, then added at iw = ow*sw - pl + kw for every kw.
//   MaxPoolGrad TF's CPU kernel routes each window's gradient to the FIRST maximal input in the
//              window's scan order (rows, then columns; max and argmax recomputed from
//              orig_input, orig_output is not read). Per input row ih and window row oh
//              covering it: the window's max m; found = 0; for each tap in scan order up to
//              row ih: eq = (x == m) & !found, found |= eq, and the taps of row ih add
//              eq * dy[oh][ow] at their input pixel.
// Channels: the kernel needs a pixel to be whole 32-byte blocks. Tensors whose C * size is not
// a multiple of 32 are copied to a channel-padded layout in the workspace first (a strided
// stream copy, one piece per pixel) and the result copied back; the padding channels are
// computed on like any other and dropped.
#include <algorithm>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/pixel_ops.h"
#include "adapter/compiler/ops/registry.h"
#include "common/convert.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using isa::Pipe;

namespace {

constexpr int64_t kLanes = PixelOps::kLanes;
constexpr int64_t kBlockF32 = PixelOps::kBlockF32;
constexpr int64_t kMaxStride = 255;    // RU8 strides
constexpr uint64_t kSlack = PixelOps::kPixelSlack;

enum class PoolKind { kMax, kAvg, kMaxGrad, kAvgGrad };

bool is_grad(PoolKind k) { return k == PoolKind::kMaxGrad || k == PoolKind::kAvgGrad; }

struct PoolSpec {
  PoolKind kind = PoolKind::kMax;
  Dtype type = Dtype::F32;  // of every tensor
  int64_t n = 1, h = 1, w = 1, cp = 8;  // input map, cp channels per pixel (whole blocks)
  int64_t oh = 1, ow = 1;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, pt = 0, pl = 0;
};

// Valid rows of window row oh (and columns of window column ow): the window minus padding.
int64_t window_count(int64_t o, int64_t s, int64_t p, int64_t k, int64_t in) {
  const int64_t start = o * s - p;
  return std::min(in, start + k) - std::max<int64_t>(0, start);
}

// Output pixels [lo, hi) whose tap kw reads an input pixel inside [0, in).
std::pair<int64_t, int64_t> tap_range(int64_t out, int64_t s, int64_t p, int64_t kw, int64_t in) {
  int64_t lo = 0, hi = out;
  while (lo < out && lo * s - p + kw < 0) ++lo;
  while (hi > lo && (hi - 1) * s - p + kw >= in) --hi;
  return {lo, hi};
}

class PoolEmitter {
 public:
  PoolEmitter(const PoolSpec& s, const ChipConfig& cfg, const std::string& op)
      : m_s(s),
        m_b(fmt::format("{}_{}", name(s.kind), isa::dtype_name(s.type)), op, cfg),
        m_size(isa::dtype_size(s.type)) {}

  static const char* name(PoolKind k) {
    switch (k) {
      case PoolKind::kMax: return "MaxPool";
      case PoolKind::kAvg: return "AvgPool";
      case PoolKind::kMaxGrad: return "MaxPoolGrad";
      case PoolKind::kAvgGrad: return "AvgPoolGrad";
    }
    return "";
  }

  Launch emit() {
    KernelBuilder& b = m_b;
    const isa::CoreKind kind = b.vector_core_kind();
    const CoreKindConfig& core = *b.config().core_kind(kind);
    choose_ct(core.capacity(Buf::UB));
    m_px.emplace(b, m_ct);
    const int64_t rows = m_s.n * (is_grad(m_s.kind) ? m_s.h : m_s.oh);
    const int64_t items = rows * (m_s.cp / m_ct);
    const int64_t per = ceil_div(items, std::min<int64_t>(core.count, items));
    const int block_dim = static_cast<int>(ceil_div(items, per));
    b.begin_section(kind);
    allocate();
    Launch l;
    switch (m_s.kind) {
      case PoolKind::kMax:
      case PoolKind::kAvg:
        b.declare_arg("x", m_s.type, {m_s.n, m_s.h, m_s.w, m_s.cp});
        b.declare_arg("y", m_s.type, {m_s.n, m_s.oh, m_s.ow, m_s.cp});
        break;
      case PoolKind::kMaxGrad:
        b.declare_arg("x", m_s.type, {m_s.n, m_s.h, m_s.w, m_s.cp});
        b.declare_arg("dy", m_s.type, {m_s.n, m_s.oh, m_s.ow, m_s.cp});
        b.declare_arg("dx", m_s.type, {m_s.n, m_s.h, m_s.w, m_s.cp});
        break;
      case PoolKind::kAvgGrad:
        b.declare_arg("dy", m_s.type, {m_s.n, m_s.oh, m_s.ow, m_s.cp});
        b.declare_arg("dx", m_s.type, {m_s.n, m_s.h, m_s.w, m_s.cp});
        break;
    }
    m_in_free = b.flag(Pipe::V, Pipe::MTE2, "input rows free");
    m_in_ready = b.flag(Pipe::MTE2, Pipe::V, "input rows loaded");
    m_out_ready = b.flag(Pipe::V, Pipe::MTE3, "output row computed");
    m_out_free = b.flag(Pipe::MTE3, Pipe::V, "output row stored");
    b.set_flag(Pipe::V, Pipe::MTE2, m_in_free);
    b.set_flag(Pipe::MTE3, Pipe::V, m_out_free);
    if (m_s.kind == PoolKind::kMaxGrad) constants();
    Reg item = b.reg("item"), end = b.reg("end item");
    emit_block_range(b, item, end, per, items);
    b.for_range(item, item, end, 1, [&] {
      Reg g = b.reg("channel group"), row = b.reg("row"), img = b.reg("image");
      b.rem(g, item, m_s.cp / m_ct);
      b.div(row, item, m_s.cp / m_ct);
      const int64_t height = is_grad(m_s.kind) ? m_s.h : m_s.oh;
      b.div(img, row, height);
      b.rem(row, row, height);
      if (is_grad(m_s.kind)) grad_item(img, row, g);
      else forward_item(img, row, g);
    });
    b.wait_flag(Pipe::V, Pipe::MTE2, m_in_free);
    b.wait_flag(Pipe::MTE3, Pipe::V, m_out_free);
    b.end();
    l.kernel = b.finish();
    l.block_dim = block_dim;
    l.summary = fmt::format("{} {}: {}x{}x{}x{} window {}x{} stride {}x{}, {} items (row x {} "
                            "channels) over {} blocks of {}",
                            name(m_s.kind), isa::dtype_name(m_s.type), m_s.n, m_s.h, m_s.w,
                            m_s.cp, m_s.kh, m_s.kw, m_s.sh, m_s.sw, items, m_ct, block_dim, per);
    return l;
  }

 private:
  bool raw() const { return m_size != 4; }  // staged through a raw buffer and converted
  int64_t pitch() const { return m_ct / kBlockF32; }  // blocks per pixel in the f32 rows

  // UB bytes for ct channels per pixel.
  uint64_t ub_need(int64_t ct) const {
    const uint64_t f = 4, r = raw() ? static_cast<uint64_t>(m_size) : 0;
    const uint64_t w = static_cast<uint64_t>(m_s.w * ct), o = static_cast<uint64_t>(m_s.ow * ct);
    const uint64_t kh = static_cast<uint64_t>(m_s.kh);
    uint64_t bytes = 0;
    int buffers = 0;
    switch (m_s.kind) {
      case PoolKind::kMax:
      case PoolKind::kAvg:
        bytes = kh * w * (f + r) + o * (f + r);
        buffers = static_cast<int>(2 * kh + 2);
        break;
      case PoolKind::kMaxGrad:
        bytes = kh * w * f + o * f + w * f +
                static_cast<uint64_t>(ceil_div(ct, kLanes) * round_up(m_s.ow, 4) * 8) +
                2 * static_cast<uint64_t>(ct) * f;
        if (raw()) {  // the raw rows in the scratch, the dx row narrowed into row 0
          bytes += grad_scratch_bytes(ct);
          buffers = static_cast<int>(kh + 6);
        } else {
          bytes += 4 * o * f;
          buffers = static_cast<int>(kh + 9);
        }
        break;
      case PoolKind::kAvgGrad:
        bytes = o * (f + r) + o * f + w * (f + r);
        buffers = 6;
        break;
    }
    return bytes + static_cast<uint64_t>(buffers) * (kSlack + 32);
  }

  // MaxPoolGrad on f16/bf16: the raw (unwidened) x rows and dy row are dead once widened, and
  // the window's f32 max, found, eq and first-max rows are written only after that, so both
  // sets share one scratch region (grad_item widens every row of a window row before it
  // writes the max: the V pipe runs in order, and MTE2 refills the raw rows only after V
  // frees the window row's inputs). Each view keeps its own slack, as a buffer of its own would.
  static uint64_t view_bytes(uint64_t bytes) { return round_up(bytes + kSlack, uint64_t{32}); }
  uint64_t grad_raw_view(int64_t pixels, int64_t ct) const {
    return view_bytes(static_cast<uint64_t>(pixels * ct * m_size));
  }
  uint64_t grad_f32_view(int64_t ct) const {
    return view_bytes(static_cast<uint64_t>(m_s.ow * ct * 4));
  }
  uint64_t grad_scratch_bytes(int64_t ct) const {
    const uint64_t raw_rows =
        static_cast<uint64_t>(m_s.kh) * grad_raw_view(m_s.w, ct) + grad_raw_view(m_s.ow, ct);
    return std::max(raw_rows, 4 * grad_f32_view(ct));
  }

  // The largest channel group (dividing cp, a multiple of the raw block) that fits the UB.
  void choose_ct(uint64_t ub) {
    const int64_t unit = std::max<int64_t>(kBlockF32, 32 / m_size);
    const int64_t max_pitch = kMaxStride / m_s.sw;  // input pixels step sw * ct / 8 blocks
    m_ct = 0;
    for (int64_t ct = unit; ct <= m_s.cp; ct += unit) {
      if (m_s.cp % ct != 0 || ct / kBlockF32 > max_pitch) continue;
      if (ub_need(ct) <= ub) m_ct = ct;
    }
    if (m_ct == 0)
      m_b.fail(fmt::format("a pooling row of {} pixels x {} channels does not fit the {} bytes "
                           "of UB",
                           std::max(m_s.w, m_s.ow), unit, ub));
  }

  uint64_t buf(uint64_t bytes, const std::string& what) {
    return m_b.alloc(Buf::UB, bytes + kSlack, what);
  }

  void allocate() {
    const uint64_t w = static_cast<uint64_t>(m_s.w * m_ct), o = static_cast<uint64_t>(m_s.ow * m_ct);
    const uint64_t sz = static_cast<uint64_t>(m_size);
    const bool scratch = m_s.kind == PoolKind::kMaxGrad && raw();
    if (m_s.kind != PoolKind::kAvgGrad)
      for (int64_t k = 0; k < m_s.kh; ++k) {
        m_rows.push_back(buf(w * 4, fmt::format("row {} (f32)", k)));
        if (!scratch)
          m_raw_rows.push_back(raw() ? buf(w * sz, fmt::format("row {} (raw)", k))
                                     : m_rows.back());
      }
    if (scratch) {
      // grad_scratch_bytes(): raw x rows and dy row, or the window's four f32 rows.
      m_dy = buf(o * 4, "dy row (f32)");
      const uint64_t base = m_b.alloc(Buf::UB, grad_scratch_bytes(m_ct),
                                      "raw x and dy rows / window max, found, eq, first max");
      uint64_t at = base;
      for (int64_t k = 0; k < m_s.kh; ++k, at += grad_raw_view(m_s.w, m_ct))
        m_raw_rows.push_back(at);
      m_raw_dy = at;
      const uint64_t v = grad_f32_view(m_ct);
      m_max = base;
      m_found = base + v;
      m_eq = base + 2 * v;
      m_tmp = base + 3 * v;
      m_bits =
          buf(static_cast<uint64_t>(ceil_div(m_ct, kLanes) * round_up(m_s.ow, 4) * 8), "bits");
      m_ones = buf(static_cast<uint64_t>(m_ct) * 4, "ones");
      m_zeros = buf(static_cast<uint64_t>(m_ct) * 4, "zeros");
      m_out = buf(w * 4, "dx row (f32)");
      // Row 0's f32 x is dead after the window rows; the next item widens into it only after
      // MTE3 has stored dx (grad_item waits for m_out_free first).
      m_raw_out = m_rows[0];
      return;
    }
    switch (m_s.kind) {
      case PoolKind::kMax:
      case PoolKind::kAvg:
        m_out = buf(o * 4, "output row (f32)");
        m_raw_out = raw() ? buf(o * sz, "output row (raw)") : m_out;
        break;
      case PoolKind::kMaxGrad:
        m_dy = buf(o * 4, "dy row (f32)");
        m_raw_dy = raw() ? buf(o * sz, "dy row (raw)") : m_dy;
        m_max = buf(o * 4, "window max");
        m_found = buf(o * 4, "max found");
        m_eq = buf(o * 4, "x == max");
        m_tmp = buf(o * 4, "first max");
        m_bits =
            buf(static_cast<uint64_t>(ceil_div(m_ct, kLanes) * round_up(m_s.ow, 4) * 8), "bits");
        m_ones = buf(static_cast<uint64_t>(m_ct) * 4, "ones");
        m_zeros = buf(static_cast<uint64_t>(m_ct) * 4, "zeros");
        m_out = buf(w * 4, "dx row (f32)");
        m_raw_out = raw() ? buf(w * sz, "dx row (raw)") : m_out;
        break;
      case PoolKind::kAvgGrad:
        m_raw_dy = buf(o * (raw() ? sz : 4), "dy row (raw)");
        m_dy = raw() ? buf(o * 4, "dy row (f32)") : m_raw_dy;
        m_tmp = buf(o * 4, "scaled dy");
        m_out = buf(w * 4, "dx row (f32)");
        m_raw_out = raw() ? buf(w * sz, "dx row (raw)") : m_out;
        break;
    }
  }

  void constants() {
    KernelBuilder& b = m_b;
    Reg v = b.reg_imm("1.0f", vector_scalar_bits(Dtype::F32, 1.0));
    vec_dup_bits(b, 4, m_ones, v, m_ct);
    vec_dup_bits(b, 4, m_zeros, 0, m_ct);
  }

  // ---- vector operations over pixels (ops/pixel_ops.h) ----

  int64_t at(uint64_t base, int64_t p, int64_t j) const { return m_px->at(base, p, j); }
  void binary(Opcode op, uint64_t d, int64_t pd0, int64_t sd, uint64_t a, int64_t pa0,
              int64_t sa, uint64_t c, int64_t pc0, int64_t sc, int64_t n) {
    m_px->binary(op, d, pd0, sd, a, pa0, sa, c, pc0, sc, n);
  }
  void fill(uint64_t d, uint64_t bits, int64_t n) { m_px->fill(d, bits, n); }
  void scale(uint64_t d, int64_t p0, int64_t n, const Reg& bits) { m_px->scale(d, p0, n, bits); }
  void widen(uint64_t f32, uint64_t rawb, int64_t n) {
    Reg cnt = m_b.reg_imm("elements", n * m_ct);
    m_px->widen(f32, rawb, m_s.type, cnt);
  }
  void narrow(uint64_t rawb, uint64_t f32, int64_t n) {
    Reg cnt = m_b.reg_imm("elements", n * m_ct);
    m_px->narrow(rawb, f32, m_s.type, cnt);
  }

  // ---- MTE ----

  // Loads pixels [row * width, +width) of channel group g of the tensor `arg` (NHWC with cp
  // channels) into UB at dst: burst per pixel of ct channels.
  void load_row(const char* arg, const Reg& img, const Reg& row, int64_t height, int64_t width,
                const Reg& g, uint64_t dst) {
    KernelBuilder& b = m_b;
    Reg src = b.reg("row source"), t = b.reg("temp");
    b.mul(src, img, height);
    b.add(src, src, row);
    b.mul(src, src, width * m_s.cp * m_size);
    b.mul(t, g, m_ct * m_size);
    b.add(src, src, t);
    Reg base = b.load_arg(arg);
    b.add(src, src, base);
    Reg d = b.reg_imm("row destination", static_cast<int64_t>(dst));
    b.emit(Opcode::op_copy_gm2ub, {d, src, width, m_ct * m_size / 32, (m_s.cp - m_ct) * m_size / 32,
                                   0},
           fmt::format("{} row, {} channels per pixel", arg, m_ct));
  }
  void store_row(const char* arg, const Reg& img, const Reg& row, int64_t height, int64_t width,
                 const Reg& g, uint64_t src_buf) {
    KernelBuilder& b = m_b;
    Reg dst = b.reg("row destination"), t = b.reg("temp");
    b.mul(dst, img, height);
    b.add(dst, dst, row);
    b.mul(dst, dst, width * m_s.cp * m_size);
    b.mul(t, g, m_ct * m_size);
    b.add(dst, dst, t);
    Reg base = b.load_arg(arg);
    b.add(dst, dst, base);
    Reg s = b.reg_imm("row source", static_cast<int64_t>(src_buf));
    b.emit(Opcode::op_copy_ub2gm, {dst, s, width, m_ct * m_size / 32, 0,
                                   (m_s.cp - m_ct) * m_size / 32},
           fmt::format("{} row", arg));
  }

  // body() only when 0 <= v < bound at run time.
  void if_in(const Reg& v, int64_t bound, const std::function<void()>& body) {
    m_b.if_(ge(v, 0), [&] { m_b.if_(lt(v, bound), body); });
  }

  // A register holding the f32 bits of 1 / count, count = window_count(o, ...) at run time,
  // chosen among the values the geometry produces.
  Reg reciprocal_count(const Reg& o, int64_t s, int64_t p, int64_t k, int64_t in, int64_t out) {
    KernelBuilder& b = m_b;
    std::set<int64_t> counts;
    for (int64_t i = 0; i < out; ++i) counts.insert(window_count(i, s, p, k, in));
    Reg bits = b.reg("1 / count (f32 bits)");
    Reg c = b.reg("count"), t = b.reg("temp");
    b.mul(c, o, s);
    b.sub(c, c, p, "window start");
    b.add(t, c, k);
    b.min(t, t, in);
    b.max(c, c, 0);
    b.sub(c, t, c, "valid rows of the window");
    Label done = b.label("count_done");
    size_t i = 0;
    for (int64_t v : counts) {
      const int64_t r = static_cast<int64_t>(f32_to_bits(1.0f / static_cast<float>(v)));
      if (++i == counts.size()) {
        b.movi(bits, r);
        break;
      }
      Label next = b.label("count_next");
      b.branch(ne(c, v), next);
      b.movi(bits, r);
      b.jmp(done);
      b.bind(next);
    }
    b.bind(done);
    return bits;
  }
  // d[ow] *= 1 / cols(ow) for every output column, by runs of equal counts.
  void scale_columns(uint64_t d) {
    int64_t start = 0;
    for (int64_t ow = 1; ow <= m_s.ow; ++ow) {
      const int64_t c = window_count(start, m_s.sw, m_s.pl, m_s.kw, m_s.w);
      if (ow < m_s.ow && window_count(ow, m_s.sw, m_s.pl, m_s.kw, m_s.w) == c) continue;
      if (c != 1) {
        Reg bits = m_b.reg_imm("1 / columns", static_cast<int64_t>(f32_to_bits(1.0f / c)));
        scale(d, start, ow - start, bits);
      }
      start = ow;
    }
  }

  // ---- the items ----

  void forward_item(const Reg& img, const Reg& oh, const Reg& g) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "output row: taps over the valid input rows");
    Reg ih = b.reg("input row");
    auto input_row = [&](int64_t kh) {
      b.mul(ih, oh, m_s.sh);
      b.add(ih, ih, kh - m_s.pt);
    };
    b.wait_flag(Pipe::V, Pipe::MTE2, m_in_free);
    for (int64_t kh = 0; kh < m_s.kh; ++kh) {
      input_row(kh);
      if_in(ih, m_s.h, [&] { load_row("x", img, ih, m_s.h, m_s.w, g, m_raw_rows[kh]); });
    }
    b.set_flag(Pipe::MTE2, Pipe::V, m_in_ready);
    b.wait_flag(Pipe::MTE2, Pipe::V, m_in_ready);
    b.wait_flag(Pipe::MTE3, Pipe::V, m_out_free);
    const bool is_max = m_s.kind == PoolKind::kMax;
    fill(m_out, is_max ? 0xFF800000u : 0u, m_s.ow);
    for (int64_t kh = 0; kh < m_s.kh; ++kh) {
      input_row(kh);
      if_in(ih, m_s.h, [&] {
        widen(m_rows[kh], m_raw_rows[kh], m_s.w);
        for (int64_t kw = 0; kw < m_s.kw; ++kw) {
          auto [lo, hi] = tap_range(m_s.ow, m_s.sw, m_s.pl, kw, m_s.w);
          binary(is_max ? Opcode::op_vmax : Opcode::op_vadd, m_out, lo, 1, m_out, lo, 1,
                 m_rows[kh], lo * m_s.sw - m_s.pl + kw, m_s.sw, hi - lo);
        }
      });
    }
    b.set_flag(Pipe::V, Pipe::MTE2, m_in_free);
    if (!is_max) {
      Reg rh = reciprocal_count(oh, m_s.sh, m_s.pt, m_s.kh, m_s.h, m_s.oh);
      scale(m_out, 0, m_s.ow, rh);
      scale_columns(m_out);
    }
    narrow(m_raw_out, m_out, m_s.ow);
    b.set_flag(Pipe::V, Pipe::MTE3, m_out_ready);
    b.wait_flag(Pipe::V, Pipe::MTE3, m_out_ready);
    store_row("y", img, oh, m_s.oh, m_s.ow, g, m_raw_out);
    b.set_flag(Pipe::MTE3, Pipe::V, m_out_free);
  }

  // eq = (x tap (kh, kw) == max) over the tap's output pixels, as 1.0 / 0.0.
  void tap_equal(uint64_t row, int64_t kw, int64_t lo, int64_t n) {
    KernelBuilder& b = m_b;
    const int64_t px0 = lo * m_s.sw - m_s.pl + kw;
    m_px->per_pixel(n, [&](int64_t j, int64_t f, int64_t cnt) {
      const int64_t bits = static_cast<int64_t>(m_bits) + (j * round_up(m_s.ow, 4) + f) * 8;
      b.emit(Opcode::op_vcmp, {Dtype::F32, isa::Cmp::EQ, bits, at(row, px0 + f * m_s.sw, j),
                               at(m_max, lo + f, j), cnt, 1, 1, m_s.sw * pitch(), pitch()});
      b.emit(Opcode::op_vsel, {Dtype::F32, at(m_eq, lo + f, j), static_cast<int64_t>(m_ones),
                               static_cast<int64_t>(m_zeros), bits, cnt, 1, 1, 1, pitch(), 0,
                               0});
    });
  }

  void grad_item(const Reg& img, const Reg& ih, const Reg& g) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "input row: the window rows covering it");
    const bool is_max = m_s.kind == PoolKind::kMaxGrad;
    b.wait_flag(Pipe::MTE3, Pipe::V, m_out_free);
    fill(m_out, 0, m_s.w);
    // Window rows oh with oh*sh - pt <= ih <= oh*sh - pt + kh - 1.
    Reg oh = b.reg("window row"), oh_end = b.reg("window rows end");
    b.add(oh, ih, m_s.pt - m_s.kh + 1);
    b.max(oh, oh, 0);
    b.add(oh, oh, m_s.sh - 1);
    b.div(oh, oh, m_s.sh, "first window row covering ih");
    b.add(oh_end, ih, m_s.pt);
    b.div(oh_end, oh_end, m_s.sh);
    b.add(oh_end, oh_end, 1);
    b.min(oh_end, oh_end, m_s.oh, "end of the window rows covering ih");
    b.for_range(oh, oh, oh_end, 1, [&] {
      Reg r = b.reg("window input row");
      auto window_row = [&](int64_t kh) {
        b.mul(r, oh, m_s.sh);
        b.add(r, r, kh - m_s.pt);
      };
      b.wait_flag(Pipe::V, Pipe::MTE2, m_in_free);
      load_row("dy", img, oh, m_s.oh, m_s.ow, g, m_raw_dy);
      if (is_max)
        for (int64_t kh = 0; kh < m_s.kh; ++kh) {
          window_row(kh);
          if_in(r, m_s.h, [&] { load_row("x", img, r, m_s.h, m_s.w, g, m_raw_rows[kh]); });
        }
      b.set_flag(Pipe::MTE2, Pipe::V, m_in_ready);
      b.wait_flag(Pipe::MTE2, Pipe::V, m_in_ready);
      widen(m_dy, m_raw_dy, m_s.ow);
      if (!is_max) {
        // dy / count, added at every column tap.
        Reg rh = reciprocal_count(oh, m_s.sh, m_s.pt, m_s.kh, m_s.h, m_s.oh);
        Reg cnt = b.reg_imm("elements", m_s.ow * m_ct);
        vec_scalar(b, Opcode::op_vmuls, Dtype::F32, m_tmp, m_dy, rh, cnt);
        scale_columns(m_tmp);
        for (int64_t kw = 0; kw < m_s.kw; ++kw) {
          auto [lo, hi] = tap_range(m_s.ow, m_s.sw, m_s.pl, kw, m_s.w);
          const int64_t px0 = lo * m_s.sw - m_s.pl + kw;
          binary(Opcode::op_vadd, m_out, px0, m_s.sw, m_out, px0, m_s.sw, m_tmp, lo, 1, hi - lo);
        }
      } else {
        // The window max, then the first max in scan order up to row ih. Raw rows are all
        // widened first: they share the scratch with m_max, m_found, m_eq and m_tmp.
        if (raw())
          for (int64_t kh = 0; kh < m_s.kh; ++kh) {
            window_row(kh);
            if_in(r, m_s.h, [&] { widen(m_rows[kh], m_raw_rows[kh], m_s.w); });
          }
        fill(m_max, 0xFF800000u, m_s.ow);
        for (int64_t kh = 0; kh < m_s.kh; ++kh) {
          window_row(kh);
          if_in(r, m_s.h, [&] {
            if (!raw()) widen(m_rows[kh], m_raw_rows[kh], m_s.w);  // f32: no conversion
            for (int64_t kw = 0; kw < m_s.kw; ++kw) {
              auto [lo, hi] = tap_range(m_s.ow, m_s.sw, m_s.pl, kw, m_s.w);
              binary(Opcode::op_vmax, m_max, lo, 1, m_max, lo, 1, m_rows[kh],
                     lo * m_s.sw - m_s.pl + kw, m_s.sw, hi - lo);
            }
          });
        }
        fill(m_found, 0, m_s.ow);
        Reg khi = b.reg("window row of ih");
        b.mul(khi, oh, m_s.sh);
        b.sub(khi, ih, khi);
        b.add(khi, khi, m_s.pt);
        for (int64_t kh = 0; kh < m_s.kh; ++kh) {
          window_row(kh);
          if_in(r, m_s.h, [&] {
            b.if_(ge(khi, kh), [&] {
              for (int64_t kw = 0; kw < m_s.kw; ++kw) {
                auto [lo, hi] = tap_range(m_s.ow, m_s.sw, m_s.pl, kw, m_s.w);
                if (hi <= lo) continue;
                tap_equal(m_rows[kh], kw, lo, hi - lo);
                b.if_(eq(khi, kh), [&] {
                  // first = eq * (1 - found); dx[iw] += first * dy
                  binary(Opcode::op_vsub, m_tmp, lo, 1, m_ones, 0, 0, m_found, lo, 1, hi - lo);
                  binary(Opcode::op_vmul, m_tmp, lo, 1, m_tmp, lo, 1, m_eq, lo, 1, hi - lo);
                  binary(Opcode::op_vmul, m_tmp, lo, 1, m_tmp, lo, 1, m_dy, lo, 1, hi - lo);
                  const int64_t px0 = lo * m_s.sw - m_s.pl + kw;
                  binary(Opcode::op_vadd, m_out, px0, m_s.sw, m_out, px0, m_s.sw, m_tmp, lo, 1,
                         hi - lo);
                });
                binary(Opcode::op_vmax, m_found, lo, 1, m_found, lo, 1, m_eq, lo, 1, hi - lo);
              }
            });
          });
        }
      }
      b.set_flag(Pipe::V, Pipe::MTE2, m_in_free);
    });
    narrow(m_raw_out, m_out, m_s.w);
    b.set_flag(Pipe::V, Pipe::MTE3, m_out_ready);
    b.wait_flag(Pipe::V, Pipe::MTE3, m_out_ready);
    store_row("dx", img, ih, m_s.h, m_s.w, g, m_raw_out);
    b.set_flag(Pipe::MTE3, Pipe::V, m_out_free);
  }

  const PoolSpec& m_s;
  KernelBuilder m_b;
  const int64_t m_size;
  int64_t m_ct = 0;
  std::optional<PixelOps> m_px;
  std::vector<uint64_t> m_rows, m_raw_rows;
  uint64_t m_out = 0, m_raw_out = 0, m_dy = 0, m_raw_dy = 0, m_max = 0, m_found = 0, m_eq = 0,
           m_tmp = 0, m_bits = 0, m_ones = 0, m_zeros = 0;
  int m_in_free = -1, m_in_ready = -1, m_out_ready = -1, m_out_free = -1;
};

DataType pool_dtype(const OpDesc& op, std::initializer_list<size_t> inputs) {
  DataType dt = op.inputs[*inputs.begin()].dtype;
  for (size_t i : inputs) {
    if (op.inputs[i].dtype != dt)
      op.fail(fmt::format("inputs have different dtypes ({} and {})", data_type_name(dt),
                          data_type_name(op.inputs[i].dtype)));
    if (op.inputs[i].shape.size() != 4)
      op.invalid(fmt::format("input {} must have rank 4, got {}", i, op.inputs[i].str()));
  }
  if (dt != DataType::F32 && dt != DataType::F16 && dt != DataType::BF16)
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16)", data_type_name(dt)));
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the inputs' {}", data_type_name(*t),
                        data_type_name(dt)));
  return dt;
}

}  // namespace

CompiledKernel compile_pool(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  PoolSpec s;
  std::vector<int64_t> x;  // the pooled map [N, H, W, C]
  DataType dt;
  if (op.type == "MaxPool" || op.type == "AvgPool") {
    s.kind = op.type == "MaxPool" ? PoolKind::kMax : PoolKind::kAvg;
    if (op.inputs.size() != 1) op.fail(fmt::format("takes 1 input, {} given", op.inputs.size()));
    dt = pool_dtype(op, {0});
    x = op.inputs[0].shape;
  } else if (op.type == "MaxPoolGrad") {
    s.kind = PoolKind::kMaxGrad;
    if (op.inputs.size() != 3) op.fail(fmt::format("takes 3 inputs, {} given", op.inputs.size()));
    dt = pool_dtype(op, {0, 1, 2});
    x = op.inputs[0].shape;
  } else if (op.type == "AvgPoolGrad") {
    s.kind = PoolKind::kAvgGrad;
    if (op.inputs.size() == 2) {
      // TF's full input list: orig_input_shape is checked and dropped (its value is an
      // attribute, docs/compiler.md).
      const TensorDesc& sz = op.inputs[0];
      if (sz.shape != std::vector<int64_t>{4} ||
          (sz.dtype != DataType::S32 && sz.dtype != DataType::S64))
        op.fail(fmt::format("orig_input_shape must be an int32[4] shape, got {}", sz.str()));
      return compile_without_inputs(ctx, {0}, compile_pool);
    }
    if (op.inputs.size() != 1) op.fail(fmt::format("takes grad, {} inputs given", op.inputs.size()));
    dt = pool_dtype(op, {0});
    x = op.attr_ints("orig_input_shape");
    if (x.empty() && !op.outputs.empty()) x = op.outputs[0].shape;
    if (x.size() != 4)
      op.fail("the value of orig_input_shape is needed at compile time: pass it as attribute "
              "orig_input_shape (or the expected output in OpDesc::outputs)");
  } else {
    op.fail("not a pooling op");
  }
  const ConvWindow cw = conv_window(op, x[1], x[2], 0, 0, true);
  if (cw.padding == "EXPLICIT") op.fail("padding EXPLICIT is not supported for pooling");
  const std::vector<int64_t> y{x[0], cw.h.out, cw.w.out, x[3]};
  if (s.kind == PoolKind::kMaxGrad) {
    if (op.inputs[1].shape != y || op.inputs[2].shape != y)
      op.invalid(fmt::format("orig_output and grad must have the pooled shape {}", shape_str(y)));
  } else if (s.kind == PoolKind::kAvgGrad && op.inputs[0].shape != y) {
    op.invalid(fmt::format("grad must have the pooled shape {}", shape_str(y)));
  }
  CompiledKernel k;
  const bool grad = is_grad(s.kind);
  const std::vector<int64_t>& out_shape = grad ? x : y;
  k.outputs = {TensorDesc{dt, out_shape}};
  if (TensorDesc{dt, out_shape}.num_elements() == 0) return k;
  if (cw.h.out == 0 || cw.w.out == 0) {  // gradient of an empty pooling: zeros
    StreamSpec spec;
    spec.kernel_name = "Fill0";
    spec.out_type = device_dtype(dt);
    spec.out_shape = out_shape;
    spec.compute = [size = data_type_bytes(dt)](KernelBuilder& b, const TileOperands& t) {
      vec_dup_bits(b, size, t.out, 0, *t.count);
    };
    k.launches.push_back(with_args(build_stream_kernel(op.str(), spec, ctx.cfg), {output_ref(0)}));
    return k;
  }
  s.type = device_dtype(dt);
  s.n = x[0];
  s.h = x[1];
  s.w = x[2];
  s.oh = cw.h.out;
  s.ow = cw.w.out;
  s.kh = cw.h.k;
  s.kw = cw.w.k;
  s.sh = cw.h.s;
  s.sw = cw.w.s;
  s.pt = cw.h.before;
  s.pl = cw.w.before;
  const int64_t c = x[3], size = data_type_bytes(dt);
  s.cp = round_up(c, 32 / size);
  // Tensors in the kernel's layout: inputs padded to cp channels when c is not whole blocks.
  std::vector<ArgRef> args;
  auto operand = [&](size_t input, const std::vector<int64_t>& shape) {
    const int64_t pixels = shape[0] * shape[1] * shape[2];
    if (s.cp == c) return input_ref(static_cast<int>(input));
    ArgRef ws = workspace_take(k, static_cast<uint64_t>(pixels * s.cp * size));
    append_channel_pad(k, op, input_ref(static_cast<int>(input)), ws, pixels, c, s.cp, dt,
                       ctx.cfg);
    return ws;
  };
  switch (s.kind) {
    case PoolKind::kMax: case PoolKind::kAvg: args = {operand(0, x)}; break;
    case PoolKind::kMaxGrad: args = {operand(0, x), operand(2, y)}; break;
    case PoolKind::kAvgGrad: args = {operand(0, y)}; break;
  }
  const int64_t out_pixels = out_shape[0] * out_shape[1] * out_shape[2];
  ArgRef out = output_ref(0);
  if (s.cp != c) out = workspace_take(k, static_cast<uint64_t>(out_pixels * s.cp * size));
  args.push_back(out);
  k.launches.push_back(with_args(PoolEmitter(s, ctx.cfg, op.str()).emit(), args));
  if (s.cp != c)
    append_strided_copy(k, op, out, output_ref(0), out_pixels, c, s.cp, dt, dt, ctx.cfg);
  return k;
}

}  // namespace npusim::compiler::ops
