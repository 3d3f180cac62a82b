// Pooling on the vector cores, NHWC as TensorFlow gives it (attrs ksize, strides, padding SAME
// or VALID, data_format NHWC):
//   MaxPool(x) -> y, AvgPool(x) -> y,
//   MaxPoolGrad(orig_input, orig_output, grad) -> dx, AvgPoolGrad(orig_input_shape, grad) -> dx
//   (orig_input_shape as an attribute, the tensor itself optional: docs/compiler.md).
//
// One kernel per op: MaxPool and MaxPoolGrad have their own (MaxPoolEmitter, MaxPoolGradEmitter,
// below: in the tensor's type over -inf-padded, plane-split rows; bf16 where the vector unit has
// no bf16 arithmetic: the f32 kernels between Casts); AvgPool and AvgPoolGrad share
// the "window kernel". Work items are (row, channel group): a row is an output row (n, oh) for
// AvgPool and an input row (n, ih) for AvgPoolGrad; a channel group
// is ct channels of every pixel of the row (ct from the UB capacity). Blocks take contiguous
// item ranges. Everything is computed on f32 lanes (f16/bf16 rows are widened exactly by
// vconv on arrival and rounded to nearest even once on the way out). A row of pixels lives in
// the UB as [pixel][ct] f32, so a window tap is a vector operation over pixels with a repeat per
// pixel (64 channels per repeat, masked for a partial group), the pixel pitches as repeat
// strides: stride sw on the input side. Padding taps are never read: each tap runs over the
// output pixels whose input pixel lies inside the row, and rows outside the map are skipped.
//   AvgPool    y = sum over the valid taps * 1/rows(oh) * 1/cols(ow), the counts of valid
//              rows and columns of the window (TF divides by the number of valid elements).
//   AvgPoolGrad dx[ih][iw] = sum over the windows (oh, ow) holding (ih, iw) of
//              dy[oh][ow] / count(oh, ow): per row ih, for each window row oh covering it, dy's
//              row oh scaled, then added at iw = ow*sw - pl + kw for every kw.
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

// Copies row `row` of image img, channel group g (ct of the cp channels of the NHWC tensor
// `arg`, height x width pixels), between GM and the UB at `ub` ([pixel][ct], pixels adjacent):
// its columns first, first + step, ... (< width). One burst when they are adjacent whole pixels,
// else a burst per pixel.
void copy_row(KernelBuilder& b, const PoolSpec& s, int64_t ct, bool to_ub, const char* arg,
              const Reg& img, const Reg& row, int64_t height, int64_t width, const Reg& g,
              uint64_t ub, int64_t first = 0, int64_t step = 1) {
  constexpr int64_t kMaxBurstBlocks = 65535;  // RU16 burst length
  const int64_t size = isa::dtype_size(s.type);
  Reg gm = b.reg("row in GM"), t = b.reg("temp");
  b.mul(gm, img, height);
  b.add(gm, gm, row);
  b.mul(gm, gm, width * s.cp * size);
  b.add(gm, gm, first * s.cp * size);
  b.mul(t, g, ct * size);
  b.add(gm, gm, t);
  Reg base = b.load_arg(arg);
  b.add(gm, gm, base);
  Reg u = b.reg_imm("row in UB", static_cast<int64_t>(ub));
  const int64_t pixels = ceil_div(width - first, step);
  const bool whole = ct == s.cp && step == 1 && pixels * ct * size / 32 <= kMaxBurstBlocks;
  const int64_t bursts = whole ? 1 : pixels, len = (whole ? pixels * ct : ct) * size / 32;
  const int64_t gap = (step * s.cp - ct) * size / 32;
  if (to_ub)
    b.emit(Opcode::op_copy_gm2ub, {u, gm, bursts, len, whole ? 0 : gap, 0},
           fmt::format("{} row, {} channels per pixel", arg, ct));
  else
    b.emit(Opcode::op_copy_ub2gm, {gm, u, bursts, len, 0, whole ? 0 : gap},
           fmt::format("{} row", arg));
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
      case PoolKind::kAvg:
        b.declare_arg("x", m_s.type, {m_s.n, m_s.h, m_s.w, m_s.cp});
        b.declare_arg("y", m_s.type, {m_s.n, m_s.oh, m_s.ow, m_s.cp});
        break;
      case PoolKind::kMax:
      case PoolKind::kMaxGrad:
        b.fail("MaxPool and MaxPoolGrad have their own emitters");
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
      case PoolKind::kAvg:
        bytes = kh * w * (f + r) + o * (f + r);
        buffers = static_cast<int>(2 * kh + 2);
        break;
      case PoolKind::kMax:
      case PoolKind::kMaxGrad:
        break;  // their own emitters
      case PoolKind::kAvgGrad:
        bytes = o * (f + r) + o * f + w * (f + r);
        buffers = 6;
        break;
    }
    return bytes + static_cast<uint64_t>(buffers) * (kSlack + 32);
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
    if (m_s.kind != PoolKind::kAvgGrad)
      for (int64_t k = 0; k < m_s.kh; ++k) {
        m_rows.push_back(buf(w * 4, fmt::format("row {} (f32)", k)));
        m_raw_rows.push_back(raw() ? buf(w * sz, fmt::format("row {} (raw)", k))
                                   : m_rows.back());
      }
    switch (m_s.kind) {
      case PoolKind::kAvg:
        m_out = buf(o * 4, "output row (f32)");
        m_raw_out = raw() ? buf(o * sz, "output row (raw)") : m_out;
        break;
      case PoolKind::kMax:
      case PoolKind::kMaxGrad:
        break;  // their own emitters
      case PoolKind::kAvgGrad:
        m_raw_dy = buf(o * (raw() ? sz : 4), "dy row (raw)");
        m_dy = raw() ? buf(o * 4, "dy row (f32)") : m_raw_dy;
        m_tmp = buf(o * 4, "scaled dy");
        m_out = buf(w * 4, "dx row (f32)");
        m_raw_out = raw() ? buf(w * sz, "dx row (raw)") : m_out;
        break;
    }
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

  void load_row(const char* arg, const Reg& img, const Reg& row, int64_t height, int64_t width,
                const Reg& g, uint64_t dst) {
    copy_row(m_b, m_s, m_ct, true, arg, img, row, height, width, g, dst);
  }
  void store_row(const char* arg, const Reg& img, const Reg& row, int64_t height, int64_t width,
                 const Reg& g, uint64_t src) {
    copy_row(m_b, m_s, m_ct, false, arg, img, row, height, width, g, src);
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
    fill(m_out, 0u, m_s.ow);
    for (int64_t kh = 0; kh < m_s.kh; ++kh) {
      input_row(kh);
      if_in(ih, m_s.h, [&] {
        widen(m_rows[kh], m_raw_rows[kh], m_s.w);
        for (int64_t kw = 0; kw < m_s.kw; ++kw) {
          auto [lo, hi] = tap_range(m_s.ow, m_s.sw, m_s.pl, kw, m_s.w);
          binary(Opcode::op_vadd, m_out, lo, 1, m_out, lo, 1,
                 m_rows[kh], lo * m_s.sw - m_s.pl + kw, m_s.sw, hi - lo);
        }
      });
    }
    b.set_flag(Pipe::V, Pipe::MTE2, m_in_free);
    Reg rh = reciprocal_count(oh, m_s.sh, m_s.pt, m_s.kh, m_s.h, m_s.oh);
    scale(m_out, 0, m_s.ow, rh);
    scale_columns(m_out);
    narrow(m_raw_out, m_out, m_s.ow);
    b.set_flag(Pipe::V, Pipe::MTE3, m_out_ready);
    b.wait_flag(Pipe::V, Pipe::MTE3, m_out_ready);
    store_row("y", img, oh, m_s.oh, m_s.ow, g, m_raw_out);
    b.set_flag(Pipe::MTE3, Pipe::V, m_out_free);
  }

  // AvgPoolGrad: one input row ih, from the window rows covering it.
  void grad_item(const Reg& img, const Reg& ih, const Reg& g) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, "input row: the window rows covering it");
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
      b.wait_flag(Pipe::V, Pipe::MTE2, m_in_free);
      load_row("dy", img, oh, m_s.oh, m_s.ow, g, m_raw_dy);
      b.set_flag(Pipe::MTE2, Pipe::V, m_in_ready);
      b.wait_flag(Pipe::MTE2, Pipe::V, m_in_ready);
      widen(m_dy, m_raw_dy, m_s.ow);
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
  uint64_t m_out = 0, m_raw_out = 0, m_dy = 0, m_raw_dy = 0, m_tmp = 0;
  int m_in_free = -1, m_in_ready = -1, m_out_ready = -1, m_out_free = -1;
};

// What the max-pooling kernels (MaxPoolEmitter, MaxPoolGradEmitter) share: x rows in the UB
// padded with -inf to the windows' reach and split into sw column planes, the rows' copies to
// and from GM, the choice between reloading and carrying the x rows two window rows share, and
// the bands of window rows the items walk.
class WindowRowKernel {
 protected:
  WindowRowKernel(const PoolSpec& s, const std::string& name, const ChipConfig& cfg,
                  const std::string& op)
      : m_s(s),
        m_b(fmt::format("{}_{}", name, isa::dtype_name(s.type)), op, cfg),
        m_size(isa::dtype_size(s.type)) {}
  virtual ~WindowRowKernel() = default;

  // ---- geometry ----
  // x rows two consecutive window rows share.
  int64_t carried_x() const { return std::max<int64_t>(m_s.kh - m_s.sh, 0); }
  // UB rows are padded: pl columns before the map's, up to the last window's reach after, and
  // split into sw column planes (padded column P in plane P % sw at pixel P / sw), so that a
  // tap over a window row is one contiguous run of ow pixels in one plane.
  int64_t padded_width() const {
    return std::max((m_s.ow - 1) * m_s.sw + m_s.kw, m_s.pl + m_s.w);
  }
  int64_t plane_pixels() const { return ceil_div(padded_width(), m_s.sw); }
  int64_t row_pixels() const { return m_s.sw * plane_pixels(); }
  int64_t pixel_bytes(int64_t ct) const { return ct * m_size; }
  uint64_t bytes(int64_t pixels, int64_t ct) const {
    return static_cast<uint64_t>(pixels * pixel_bytes(ct));
  }
  uint64_t bytes(int64_t pixels) const { return bytes(pixels, m_ct); }
  // Address of padded column col of the UB row at `row`.
  uint64_t column(uint64_t row, int64_t col) const {
    return row + bytes((col % m_s.sw) * plane_pixels() + col / m_s.sw);
  }
  int64_t neg_inf_bits() const {
    switch (m_s.type) {
      case Dtype::F16: return 0xFC00;
      case Dtype::BF16: return 0xFF80;
      default: return 0xFF800000;
    }
  }

  // Whether V should copy the kh - sh x rows a window row shares with the next (a vector copy)
  // instead of MTE2 loading them again: when that lowers the larger of the two pipes' times a
  // window row, estimated from the config. MTE2 moves the x rows and `other_bytes` (other rows
  // the window row loads) at the GM->UB path rate or the core's share of the HBM rate,
  // whichever is lower; V spends `vector` cycles a window row, plus the copy when it carries.
  bool carry_pays(double vector, uint64_t other_bytes, int64_t cores) const {
    if (carried_x() == 0) return false;
    const ChipConfig& cfg = m_b.config();
    auto path = cfg.path_bytes_per_cycle.find({Buf::GM, Buf::UB});
    double rate = cfg.hbm_bytes_per_cycle() / static_cast<double>(cores);
    if (path != cfg.path_bytes_per_cycle.end()) rate = std::min(rate, path->second);
    if (rate <= 0) return false;
    const double copy = static_cast<double>(carried_x()) * run_cycles(bytes(row_pixels()));
    const double row = static_cast<double>(bytes(m_s.w)), other = static_cast<double>(other_bytes);
    const double reload = std::max(vector, (static_cast<double>(m_s.kh) * row + other) / rate);
    const double carry = std::max(vector + copy, (static_cast<double>(m_s.sh) * row + other) / rate);
    return carry < reload;
  }
  // Cycles of one vector instruction over `b` bytes: its latency and its repeats at the
  // config's vector rate.
  double run_cycles(uint64_t b) const {
    const ChipConfig& cfg = m_b.config();
    return cfg.vector_latency_cycles +
           static_cast<double>(
               ceil_div(b, static_cast<uint64_t>(std::max(cfg.vector_bytes_per_cycle, 1))));
  }

  // Window rows per band: the split of each image's oh window rows (over `items_per_band`
  // items per band, e.g. images x channel groups) that gives the busiest core the fewest
  // window rows, each band's `extra` window rows' worth of work at its start counted.
  int64_t choose_band(int64_t items_per_band, double extra, int64_t cores) const {
    int64_t band = m_s.oh;
    double best = -1;
    for (int64_t split = 1; split <= m_s.oh; ++split) {
      const int64_t rows = ceil_div(m_s.oh, split);
      const int64_t n = items_per_band * ceil_div(m_s.oh, rows);
      const double load =
          static_cast<double>(ceil_div(n, cores)) * (static_cast<double>(rows) + extra);
      if (best < 0 || load < best) {
        best = load;
        band = rows;
      }
    }
    return band;
  }

  // ---- the items' loop ----

  // The items: (image, channel group, band of `band` window rows), `per` consecutive items a
  // block, over block_dim blocks.
  struct Items {
    int64_t band = 0, items = 0, per = 0;
    int block_dim = 0;
  };
  Items plan_items(int64_t groups, double extra, int64_t cores) const {
    Items r;
    r.band = choose_band(m_s.n * groups, extra, cores);
    r.items = m_s.n * groups * ceil_div(m_s.oh, r.band);
    r.per = ceil_div(r.items, std::min<int64_t>(cores, r.items));
    r.block_dim = static_cast<int>(ceil_div(r.items, r.per));
    return r;
  }

  // The UB address of x row a (< kh) of parity p.
  virtual uint64_t x_row(int p, int64_t a) const = 0;
  // Every x row of both parities -inf: MTE2 writes the map's pixels only, the padding keeps it.
  void fill_x_rows() {
    for (int p = 0; p < 2; ++p)
      for (int64_t a = 0; a < m_s.kh; ++a)
        vec_dup_bits(m_b, m_size, x_row(p, a), neg_inf_bits(), row_pixels() * m_ct);
  }
  // An item's registers: image, channel group, its band's first window row, the first window
  // row it walks (`rebuild` earlier, at least 0) and how many.
  struct Item {
    const Reg &img, &g, &band_first, &first, &steps;
  };
  // The blocks' items of `plan`: item = (image * groups + channel group) * bands + band;
  // body(item) per item.
  void for_each_item(const Items& plan, int64_t groups, int64_t rebuild,
                     const std::function<void(const Item&)>& body) {
    KernelBuilder& b = m_b;
    const int64_t band = plan.band, bands = ceil_div(m_s.oh, band);
    Reg item = b.reg("item"), end = b.reg("end item");
    emit_block_range(b, item, end, plan.per, plan.items);
    b.for_range(item, item, end, 1, [&] {
      KernelBuilder::Origin o(b, "item: (image, channel group, band of window rows)");
      Reg img = b.reg("image"), g = b.reg("channel group"), band_first = b.reg("band's first");
      Reg first = b.reg("first window row"), steps = b.reg("window rows of the item");
      b.rem(band_first, item, bands);
      b.div(img, item, bands);
      b.rem(g, img, groups);
      b.div(img, img, groups);
      b.mul(band_first, band_first, band);
      b.add(steps, band_first, band);
      b.min(steps, steps, m_s.oh, "window rows end");
      b.sub(first, band_first, rebuild, "rebuilt window rows before the band");
      b.max(first, first, 0);
      b.sub(steps, steps, first);
      body({img, g, band_first, first, steps});
    });
  }
  // Window rows [first, first + steps) as a software pipeline (KernelBuilder::pipelined_steps):
  // load(p, oh, t) and compute(p, oh, t) of step t, window row oh, parity p = t & 1.
  using RowStep = std::function<void(int, const Reg&, const Reg&)>;
  void pipelined_rows(const Reg& first, const Reg& steps, const RowStep& load,
                      const RowStep& compute) {
    KernelBuilder& b = m_b;
    auto step = [&](const RowStep& f) {
      return [&](const Reg& t) {
        Reg oh = b.reg("window row"), parity = b.reg("parity");
        b.add(oh, first, t);
        b.and_(parity, t, 1);
        b.by_parity(parity, [&](int p) { f(p, oh, t); });
      };
    };
    b.pipelined_steps(steps, step(load), step(compute));
  }

  // ---- MTE ----

  // MTE2: the x rows of window row oh (step t of an item) that lie in the map, into the rows of
  // parity p: all kh, or with m_carry_x all kh at the item's first step and after that the last
  // sh (V copies the first kh - sh from the previous window row's rows).
  void load_x_rows(int p, const Reg& img, const Reg& g, const Reg& oh, const Reg& t) {
    KernelBuilder& b = m_b;
    for (int64_t a = 0; a < m_s.kh; ++a) {
      auto load = [&] {
        Reg r = b.reg("input row");
        b.mul(r, oh, m_s.sh);
        b.add(r, r, a - m_s.pt);
        b.if_(ge(r, 0), [&] {
          b.if_(lt(r, m_s.h),
                [&] { copy_map_row(true, "x", img, r, m_s.h, m_s.w, g, x_row(p, a)); });
        });
      };
      if (a < carried_x() && m_carry_x) b.if_(eq(t, 0), load);
      else load();
    }
  }

  // Row `row` of image img, channel group g, of tensor `arg` (height x width pixels) between GM
  // and the padded, plane-split UB row at `ub` (its map's columns only).
  void copy_map_row(bool to_ub, const char* arg, const Reg& img, const Reg& row, int64_t height,
                    int64_t width, const Reg& g, uint64_t ub) {
    for (int64_t q = 0; q < m_s.sw; ++q) {
      const int64_t first = ((q - m_s.pl) % m_s.sw + m_s.sw) % m_s.sw;  // map column
      if (first >= width) continue;
      copy_row(m_b, m_s, m_ct, to_ub, arg, img, row, height, width, g,
               column(ub, first + m_s.pl), first, m_s.sw);
    }
  }

  const PoolSpec& m_s;
  KernelBuilder m_b;
  const int64_t m_size;
  int64_t m_ct = 0;
  bool m_carry_x = false;  // the shared x rows carried by V (carry_pays)
};

// MaxPoolGrad as CANN does it on the vector unit: items are (image, channel group, band of
// window rows); an item walks its window rows in order and, per window row, computes the window
// max from the kh input rows, then routes dy tap by tap in TF's scan order: compare with the
// max (bits), keep the bits of windows not yet routed (and-not of a "not found" bit set),
// select dy or 0 with them and add it into the dx rows in the UB. The UB rows carry the map's
// padding columns (and padding rows are filled) with -inf, so every tap covers every window of
// the row and the bit sets of all taps line up: padding never equals a window's max unless the
// window holds only -inf (then its gradient goes to the padding and is dropped; TF's CPU kernel
// routes it to the first -inf). Operations write a buffer other than their sources where a
// ping-pong pair allows it (the window max, the bit sets): an in-place operation reads and
// writes the same UB banks. A tap that is the first in scan order to reach its dx pixels
// (columns kw < sw of rows not carried) writes the selected dy instead of adding it. The window
// row's dx rows overlap the next one's by
// kh - sh rows: those partial sums are carried (copied) into the next window row's dx rows, the
// first sh rows are complete and stored. A band starts E = (kh - 1) / sh window rows early to
// rebuild the carried sums of its first rows (those window rows store nothing). Everything is
// computed in the tensor's type: max, compare and select are exact; the sums of dy round to the
// type per addition, as TF's CPU kernel does (it adds in T), in a different order (taps, then
// window rows). Window rows are double-buffered: MTE2 loads the next window row's x and dy rows
// and MTE3 stores the previous one's dx rows while V computes.
class MaxPoolGradEmitter : WindowRowKernel {
 public:
  MaxPoolGradEmitter(const PoolSpec& s, const ChipConfig& cfg, const std::string& op)
      : WindowRowKernel(s, "MaxPoolGrad", cfg, op) {}

  Launch emit() {
    KernelBuilder& b = m_b;
    const isa::CoreKind kind = b.vector_core_kind();
    const CoreKindConfig& core = *b.config().core_kind(kind);
    choose_layout(core.capacity(Buf::UB));
    m_carry_x = carry_x_rows(core.count);
    const int64_t groups = m_s.cp / m_ct;
    // Bands of window rows, each band's rebuilt rows ((kh - 1) / sh) counted.
    const Items plan =
        plan_items(groups, static_cast<double>((m_s.kh - 1) / m_s.sh), core.count);
    b.begin_section(kind);
    allocate();
    b.declare_arg("x", m_s.type, {m_s.n, m_s.h, m_s.w, m_s.cp});
    b.declare_arg("dy", m_s.type, {m_s.n, m_s.oh, m_s.ow, m_s.cp});
    b.declare_arg("dx", m_s.type, {m_s.n, m_s.h, m_s.w, m_s.cp});
    m_in_ready = b.flag_pair(Pipe::MTE2, Pipe::V, "x and dy rows loaded");
    m_in_free = b.flag_pair(Pipe::V, Pipe::MTE2, "x and dy rows free");
    m_out_ready = b.flag_pair(Pipe::V, Pipe::MTE3, "dx rows computed");
    m_out_free = b.flag_pair(Pipe::MTE3, Pipe::V, "dx rows stored");
    fill_x_rows();
    vec_dup_bits(b, m_size, m_l.zeros, 0, m_s.ow * m_ct);
    if (m_l.zero_row) vec_dup_bits(b, m_size, m_l.zero_row, 0, m_s.w * m_ct);
    for (int p = 0; p < 2; ++p) b.set_flag(m_in_free, p);
    for (int d = 0; d < m_l.dx_sets; ++d) b.set_flag(m_out_free, d);
    // A band starts (kh - 1) / sh window rows early to rebuild its first rows' carried sums.
    for_each_item(plan, groups, (m_s.kh - 1) / m_s.sh, [&](const Item& it) {
      Reg own = b.reg("first dx row of the band");
      b.mul(own, it.band_first, m_s.sh);
      b.sub(own, own, m_s.pt);
      pipelined_rows(
          it.first, it.steps,
          [&](int p, const Reg& oh, const Reg& t) { load_step(p, it.img, it.g, oh, t); },
          [&](int p, const Reg& oh, const Reg& t) {
            compute_step(p, it.img, it.g, oh, t, own);
          });
      if (m_carry_x) {  // the last step's x rows, held for a next step that is not
        Reg last = b.reg("parity of the last step");
        b.sub(last, it.steps, 1);
        b.and_(last, last, 1);
        b.by_parity(last, [&](int p) { b.set_flag(m_in_free, p); });
      }
    });
    for (int p = 0; p < 2; ++p) b.wait_flag(m_in_free, p);
    for (int d = 0; d < m_l.dx_sets; ++d) b.wait_flag(m_out_free, d);
    b.end();
    Launch l;
    l.kernel = b.finish();
    l.block_dim = plan.block_dim;
    l.summary = fmt::format(
        "MaxPoolGrad {}: {}x{}x{}x{} window {}x{} stride {}x{}, {} items (image x {} channels x "
        "band of {} window rows) over {} blocks of {}, {} dx set(s){}{}",
        isa::dtype_name(m_s.type), m_s.n, m_s.h, m_s.w, m_s.cp, m_s.kh, m_s.kw, m_s.sh, m_s.sw,
        plan.items, m_ct, plan.band, plan.block_dim, plan.per, m_l.dx_sets, m_l.placed ? ", placed on the banks" : "",
        m_carry_x ? ", x rows carried" : "");
    return l;
  }

 private:
  // ---- geometry ----
  // dx rows a window row touches (its kh, at least its sh stored rows) and those it carries.
  int64_t slots() const { return std::max(m_s.kh, m_s.sh); }
  int64_t carried() const { return carried_x(); }
  // Taps that write their dx pixels: columns kw < sw when every pixel of a row is reached that
  // way (kw >= sw), in rows not carried from the previous window row.
  bool writes(int64_t a, int64_t kw) const {
    return m_s.kw >= m_s.sw && kw < m_s.sw && a >= carried();
  }
  // A bit set over a window row (one bit per element), whole 32-byte blocks.
  uint64_t bits_bytes(int64_t ct) const {
    return round_up(static_cast<uint64_t>(ceil_div(m_s.ow * ct, int64_t{8})), uint64_t{32});
  }
  // Rows below the last window row's dx rows (VALID remainders): stored as zeros.
  int64_t first_zero_row() const { return (m_s.oh - 1) * m_s.sh - m_s.pt + slots(); }

  // The UB buffers of one choice of channel group, dx sets and bank placement, from UB address
  // 0: per parity kh x rows, a dy row and a window max, `slots` dx rows per dx set; the
  // selected dy, zeros as long as a dy row, four bit sets (x == max, the routed windows, the
  // not-found pair) and a zero dx row for VALID remainders.
  // Placed: the UB rows start on a bank period (banks x bank width bytes), so every x and dx
  // row has its taps on the same banks, and the window-row buffers sit where their 8 banks a
  // repeat miss the taps' and each other's (every operand of these runs moves 256 bytes a
  // repeat, so two of them meet in a bank on every repeat or never).
  struct Layout {
    int64_t ct = 0;
    int dx_sets = 2;
    bool placed = false;
    uint64_t row_stride = 0;  // bytes from one x or dx row to the next
    uint64_t x[2] = {}, dy[2] = {}, dx[2] = {}, max[2] = {}, not_found[2] = {};
    uint64_t sel = 0, zeros = 0, equal = 0, routed = 0, zero_row = 0;
    uint64_t end = 0;
  };

  Layout layout(int64_t ct, int dx_sets, bool placed) const {
    Layout l;
    l.ct = ct;
    l.dx_sets = dx_sets;
    l.placed = placed;
    const uint64_t period = static_cast<uint64_t>(m_b.config().ub_banks) *
                            static_cast<uint64_t>(m_b.config().ub_bank_width_bytes);
    placed = placed && period > 0;
    const uint64_t row = bytes(row_pixels(), ct), run = bytes(m_s.ow, ct);
    l.row_stride = placed ? round_up(row, period) : row;
    uint64_t at = 0;
    auto take = [&](uint64_t size) {  // 32-byte aligned, a repeat of slack past the end
      const uint64_t a = round_up(at, uint64_t{32});
      at = a + size + kSlack;
      return a;
    };
    auto rows = [&](int64_t n) {
      if (placed) at = round_up(at, period);
      return take(static_cast<uint64_t>(n) * l.row_stride);
    };
    for (int p = 0; p < 2; ++p) l.x[p] = rows(m_s.kh);
    for (int p = 0; p < dx_sets; ++p) l.dx[p] = rows(slots());
    if (dx_sets == 1) l.dx[1] = l.dx[0];
    // Bank offsets (bytes modulo the period) of the taps' runs, x and dx alike.
    std::vector<uint64_t> taps;
    for (int64_t a = 0; a < m_s.kh && placed; ++a)
      for (int64_t kw = 0; kw < m_s.kw; ++kw)
        taps.push_back((static_cast<uint64_t>(a) * l.row_stride +
                        bytes((kw % m_s.sw) * plane_pixels() + kw / m_s.sw, ct)) %
                       period);
    auto apart = [&](uint64_t u, uint64_t v) {  // 8-bank windows at u and v do not meet
      const uint64_t d = (u + period - v % period) % period;
      return std::min(d, period - d) >= vec::kRepeatBytes;
    };
    // A run buffer at the first address clear of the taps and of `others` (if one is).
    auto place = [&](const std::vector<uint64_t>& others) {
      if (!placed) return take(run);
      const uint64_t next = round_up(at, uint64_t{32});
      for (uint64_t a = next; a < next + period; a += 32) {
        bool ok = true;
        for (uint64_t t : taps) ok = ok && apart(a % period, t);
        for (uint64_t o : others) ok = ok && apart(a % period, o);
        if (ok) {
          at = a;
          break;
        }
      }
      return take(run);
    };
    l.max[0] = place({});
    l.max[1] = place({l.max[0]});
    l.dy[0] = place({});
    l.zeros = place({l.dy[0]});
    l.sel = place({l.dy[0], l.zeros});
    l.dy[1] = place({l.zeros, l.sel});
    const uint64_t bits = bits_bytes(ct);
    for (int p = 0; p < 2; ++p) l.not_found[p] = take(bits);
    l.equal = take(bits);
    l.routed = take(bits);
    if (first_zero_row() < m_s.h) l.zero_row = take(bytes(m_s.w, ct));
    l.end = at;
    return l;
  }

  // The largest channel group (dividing cp, whole blocks) that fits the UB: with two dx sets (V
  // fills one while MTE3 stores the other) where they fit, else one (V waits for the store of
  // the previous window row's dx rows before it writes them again); placed on the banks where
  // that fits too.
  void choose_layout(uint64_t ub) {
    const int64_t unit = 32 / m_size;
    m_l = Layout{};
    for (int64_t ct = unit; ct <= m_s.cp; ct += unit) {
      if (m_s.cp % ct != 0) continue;
      bool found = false;
      for (int sets = 2; sets >= 1 && !found; --sets)
        for (bool placed : {true, false}) {
          const Layout l = layout(ct, sets, placed);
          if (l.end <= ub) {
            m_l = l;
            found = true;
            break;
          }
        }
    }
    if (m_l.ct == 0)
      m_b.fail(fmt::format("MaxPoolGrad: a row of {} pixels x {} channels, {} window rows, does "
                           "not fit the {} bytes of UB",
                           m_s.w, unit, m_s.kh, ub));
    m_ct = m_l.ct;
  }

  // carry_pays with V's work a window row: a run of ow * ct elements per tap for vcmp, vsel
  // and vadd, and one less for vmax, two bit-set operations per tap; MTE2 loads the dy row
  // besides the x rows.
  bool carry_x_rows(int64_t cores) const {
    const double taps = static_cast<double>(m_s.kh * m_s.kw);
    const double vector =
        (4 * taps - 1) * run_cycles(bytes(m_s.ow)) + 2 * taps * run_cycles(bits_bytes(m_ct));
    return carry_pays(vector, bytes(m_s.ow), cores);
  }

  void allocate() {
    const uint64_t base = m_b.alloc(Buf::UB, m_l.end, "MaxPoolGrad rows, runs and bit sets");
    if (base != 0) m_b.fail("MaxPoolGrad: its UB layout must start at UB address 0");
  }

  uint64_t x_row(int p, int64_t a) const override {
    return m_l.x[p] + static_cast<uint64_t>(a) * m_l.row_stride;
  }
  int dx_set(int p) const { return m_l.dx_sets == 2 ? p : 0; }
  uint64_t dx_row(int p, int64_t a) const {
    return m_l.dx[p] + static_cast<uint64_t>(a) * m_l.row_stride;
  }

  // ---- MTE ----

  // MTE2: the dy row and the x rows of window row oh (step t of the item).
  void load_step(int p, const Reg& img, const Reg& g, const Reg& oh, const Reg& t) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, fmt::format("load window row ({})", p));
    b.wait_flag(m_in_free, p);
    copy_row(b, m_s, m_ct, true, "dy", img, oh, m_s.oh, m_s.ow, g, m_l.dy[p]);
    load_x_rows(p, img, g, oh, t);
    b.set_flag(m_in_ready, p);
  }

  // MTE3: the window row's first sh dx rows that the band owns (>= own) and lie in the map; the
  // last window row also stores its carried rows and the zero rows below them.
  void store_rows(int p, const Reg& img, const Reg& g, const Reg& oh, const Reg& own) {
    KernelBuilder& b = m_b;
    b.wait_flag(m_out_ready, dx_set(p));
    auto store = [&](int64_t a) {
      Reg r = b.reg("dx row");
      b.mul(r, oh, m_s.sh);
      b.add(r, r, a - m_s.pt);
      b.if_(ge(r, own), [&] {
        b.if_(ge(r, 0), [&] {
          b.if_(lt(r, m_s.h),
                [&] { copy_map_row(false, "dx", img, r, m_s.h, m_s.w, g, dx_row(p, a)); });
        });
      });
    };
    for (int64_t a = 0; a < m_s.sh; ++a) store(a);
    b.if_(eq(oh, m_s.oh - 1), [&] {
      for (int64_t a = m_s.sh; a < slots(); ++a) store(a);
      for (int64_t r = std::max<int64_t>(first_zero_row(), 0); r < m_s.h; ++r) {
        Reg rr = b.reg_imm("zero dx row", r);
        copy_row(b, m_s, m_ct, false, "dx", img, rr, m_s.h, m_s.w, g, m_l.zero_row);
      }
    });
    b.set_flag(m_out_free, dx_set(p));
  }

  // ---- V ----

  void compute_step(int p, const Reg& img, const Reg& g, const Reg& oh, const Reg& t,
                    const Reg& own) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, fmt::format("window row ({})", p));
    b.wait_flag(m_in_ready, p);
    // x rows a < kh - sh: the previous window row's rows a + sh (whole padded rows); that
    // window row's x and dy buffers are free after this (its step released them no earlier).
    if (m_carry_x)
      b.if_(ne(t, 0), [&] {
        for (int64_t a = 0; a < carried(); ++a)
          vec_copy_bits(b, m_size, x_row(p, a), x_row(1 - p, m_s.sh + a), row_pixels() * m_ct);
        b.set_flag(m_in_free, 1 - p);
      });
    // Rows outside the map: -inf.
    for (int64_t a = 0; a < m_s.kh; ++a) {
      Reg r = b.reg("input row");
      b.mul(r, oh, m_s.sh);
      b.add(r, r, a - m_s.pt);
      auto pad = [&] {
        vec_dup_bits(b, m_size, x_row(p, a), neg_inf_bits(), row_pixels() * m_ct);
      };
      b.if_(lt(r, 0), pad);
      b.if_(ge(r, m_s.h), pad);
    }
    Reg n = b.reg_imm("elements of a window row", m_s.ow * m_ct);
    // Tap (a, kw) of every window of the row: a run of ow pixels in one plane.
    std::vector<std::pair<int64_t, int64_t>> taps;
    for (int64_t a = 0; a < m_s.kh; ++a)
      for (int64_t kw = 0; kw < m_s.kw; ++kw) taps.emplace_back(a, kw);
    auto tap = [&](size_t i) { return column(x_row(p, taps[i].first), taps[i].second); };
    // The window max, ping-pong over the taps in scan order.
    int m = 0;  // the buffer holding the max so far
    for (size_t i = std::min<size_t>(1, taps.size() - 1); i < taps.size(); ++i) {
      const int d = i <= 1 ? 0 : 1 - m;
      vec_binary(b, Opcode::op_vmax, m_s.type, m_l.max[d], i <= 1 ? tap(0) : m_l.max[m], tap(i),
                 n);
      m = d;
    }
    // dx rows a < kh - sh continue the previous window row's rows a + sh (the same rows of
    // the map): where the first taps reach (kw < sw, when kw >= sw) they add sel to the
    // previous sums into the row (or write sel at an item's first window row); the rest of the
    // row is copied (zeroed). One dx set: rows a + sh are read before the window row writes
    // them (carried rows first, in scan order).
    b.wait_flag(m_out_free, dx_set(p));
    const int64_t c = carried(), row = row_pixels() * m_ct;
    const bool reached = m_s.kw >= m_s.sw;  // every pixel of a row by a tap kw < sw
    const int64_t tail = plane_pixels() - m_s.ow;  // per plane, past those taps' reach
    auto each_tail = [&](const std::function<void(int64_t)>& f) {  // f(offset in the row)
      if (tail > 0)
        for (int64_t q = 0; q < m_s.sw; ++q)
          f(static_cast<int64_t>(bytes(q * plane_pixels() + m_s.ow)));
    };
    for (int64_t a = 0; a < c; ++a) {
      const uint64_t dst = dx_row(p, a), src = dx_row(1 - p, m_s.sh + a);
      if (!reached) {
        b.if_(eq(t, 0), [&] { vec_dup_bits(b, m_size, dst, 0, row); });
        b.if_(ne(t, 0), [&] { vec_copy_bits(b, m_size, dst, src, row); });
        continue;
      }
      each_tail([&](int64_t off) {
        b.if_(eq(t, 0), [&] { vec_dup_bits(b, m_size, dst + off, 0, tail * m_ct); });
        b.if_(ne(t, 0), [&] { vec_copy_bits(b, m_size, dst + off, src + off, tail * m_ct); });
      });
    }
    // The other rows: zero where no tap writes (before the first of their taps).
    auto zero_rest = [&] {
      for (int64_t a = c; a < slots(); ++a) {
        if (a >= m_s.kh || !writes(a, 0))
          vec_dup_bits(b, m_size, dx_row(p, a), 0, row);
        else
          each_tail(
              [&](int64_t off) { vec_dup_bits(b, m_size, dx_row(p, a) + off, 0, tail * m_ct); });
      }
    };
    if (c == 0) zero_rest();
    // Route dy in scan order: the first tap equal to the max takes it.
    Reg words = b.reg_imm("bit set (u16 words)", static_cast<int64_t>(bits_bytes(m_ct)) / 2);
    int nf = 0;  // the not-found set in use
    for (size_t i = 0; i < taps.size(); ++i) {
      const auto [a, kw] = taps[i];
      const bool last = i + 1 == taps.size();
      if (c > 0 && a == c && kw == 0) zero_rest();
      vec_compare(b, m_s.type, isa::Cmp::EQ, m_l.equal, tap(i), m_l.max[m], n);
      uint64_t routed = m_l.equal;
      if (i == 0) {
        if (!last) vec_unary(b, Opcode::op_vnot, Dtype::U16, m_l.not_found[0], m_l.equal, words);
      } else {
        routed = m_l.routed;
        vec_binary(b, Opcode::op_vand, Dtype::U16, m_l.routed, m_l.equal, m_l.not_found[nf],
                   words);
        if (!last) {
          vec_binary(b, Opcode::op_vsub, Dtype::U16, m_l.not_found[1 - nf], m_l.not_found[nf],
                     m_l.routed, words);
          nf = 1 - nf;
        }
      }
      const uint64_t dx = column(dx_row(p, a), kw);
      if (writes(a, kw)) {
        vec_select(b, m_s.type, dx, m_l.dy[p], m_l.zeros, routed, n);
      } else if (a < c && reached && kw < m_s.sw) {
        const uint64_t prev = column(dx_row(1 - p, m_s.sh + a), kw);
        b.if_(eq(t, 0), [&] { vec_select(b, m_s.type, dx, m_l.dy[p], m_l.zeros, routed, n); });
        b.if_(ne(t, 0), [&] {
          vec_select(b, m_s.type, m_l.sel, m_l.dy[p], m_l.zeros, routed, n);
          vec_binary(b, Opcode::op_vadd, m_s.type, dx, prev, m_l.sel, n);
        });
      } else {
        vec_select(b, m_s.type, m_l.sel, m_l.dy[p], m_l.zeros, routed, n);
        vec_binary(b, Opcode::op_vadd, m_s.type, dx, dx, m_l.sel, n);
      }
    }
    if (!m_carry_x) b.set_flag(m_in_free, p);
    b.set_flag(m_out_ready, dx_set(p));
    store_rows(p, img, g, oh, own);
  }

  Layout m_l;
  FlagPair m_in_ready, m_in_free, m_out_ready, m_out_free;
};

// MaxPool on the vector unit, as MaxPoolGrad walks its windows: items are (image, channel
// group, band of window rows); per window row MTE2 loads its kh x rows into padded, plane-split
// UB rows (WindowRowKernel: -inf outside the map, so every tap covers every window of the row
// as one contiguous run of ow pixels), V takes the max over the kh * kw taps in the tensor's
// type (vmax is exact: the result is TF's bit for bit), ping-pong between a scratch run and the
// y row, and MTE3 stores the y row. Window rows are double-buffered (x rows and y rows per
// parity: MTE2 loads the next window row and MTE3 stores the previous y row while V computes).
// The kh - sh x rows a window row shares with the next are loaded again (L2 hits), or, where
// MTE2 bounds the window row (carry_pays), copied by V from the previous window row's rows.
class MaxPoolEmitter : WindowRowKernel {
 public:
  MaxPoolEmitter(const PoolSpec& s, const ChipConfig& cfg, const std::string& op)
      : WindowRowKernel(s, "MaxPool", cfg, op) {}

  Launch emit() {
    KernelBuilder& b = m_b;
    const isa::CoreKind kind = b.vector_core_kind();
    const CoreKindConfig& core = *b.config().core_kind(kind);
    choose_ct(core.capacity(Buf::UB));
    // V's work a window row: kh * kw - 1 vmax over a run of ow * ct elements.
    const double vector =
        static_cast<double>(m_s.kh * m_s.kw - 1) * run_cycles(bytes(m_s.ow));
    m_carry_x = carry_pays(vector, 0, core.count);
    const int64_t groups = m_s.cp / m_ct;
    // A band's first window row loads all kh x rows: with carried rows, kh - sh more than the
    // others (in window rows of MTE2 work: (kh - sh) / sh).
    const double extra =
        m_carry_x ? static_cast<double>(carried_x()) / static_cast<double>(m_s.sh) : 0;
    const Items plan = plan_items(groups, extra, core.count);
    b.begin_section(kind);
    allocate();
    b.declare_arg("x", m_s.type, {m_s.n, m_s.h, m_s.w, m_s.cp});
    b.declare_arg("y", m_s.type, {m_s.n, m_s.oh, m_s.ow, m_s.cp});
    m_in_ready = b.flag_pair(Pipe::MTE2, Pipe::V, "x rows loaded");
    m_in_free = b.flag_pair(Pipe::V, Pipe::MTE2, "x rows free");
    m_out_ready = b.flag_pair(Pipe::V, Pipe::MTE3, "y row computed");
    m_out_free = b.flag_pair(Pipe::MTE3, Pipe::V, "y row stored");
    fill_x_rows();
    for (int p = 0; p < 2; ++p) {
      b.set_flag(m_in_free, p);
      b.set_flag(m_out_free, p);
    }
    for_each_item(plan, groups, 0, [&](const Item& it) {
      pipelined_rows(
          it.first, it.steps,
          [&](int p, const Reg& oh, const Reg& t) { load_step(p, it.img, it.g, oh, t); },
          [&](int p, const Reg& oh, const Reg& t) {
            compute_step(p, it.img, it.g, oh, t, it.steps);
          });
    });
    for (int p = 0; p < 2; ++p) {
      b.wait_flag(m_in_free, p);
      b.wait_flag(m_out_free, p);
    }
    b.end();
    Launch l;
    l.kernel = b.finish();
    l.block_dim = plan.block_dim;
    l.summary = fmt::format(
        "MaxPool {}: {}x{}x{}x{} window {}x{} stride {}x{}, {} items (image x {} channels x band "
        "of {} window rows) over {} blocks of {}{}",
        isa::dtype_name(m_s.type), m_s.n, m_s.h, m_s.w, m_s.cp, m_s.kh, m_s.kw, m_s.sh, m_s.sw,
        plan.items, m_ct, plan.band, plan.block_dim, plan.per, m_carry_x ? ", x rows carried" : "");
    return l;
  }

 private:
  // UB bytes for channel group ct: per parity kh padded x rows and a y row, one scratch run
  // (each 32-byte aligned with a repeat of slack).
  uint64_t ub_need(int64_t ct) const {
    const uint64_t row = round_up(bytes(row_pixels(), ct) + kSlack, uint64_t{32});
    const uint64_t run = round_up(bytes(m_s.ow, ct) + kSlack, uint64_t{32});
    return 2 * static_cast<uint64_t>(m_s.kh) * row + 3 * run;
  }
  // The largest channel group (dividing cp, whole blocks) that fits the UB.
  void choose_ct(uint64_t ub) {
    const int64_t unit = 32 / m_size;
    for (int64_t ct = unit; ct <= m_s.cp; ct += unit)
      if (m_s.cp % ct == 0 && ub_need(ct) <= ub) m_ct = ct;
    if (m_ct == 0)
      m_b.fail(fmt::format("MaxPool: a row of {} pixels x {} channels, {} window rows, does not "
                           "fit the {} bytes of UB",
                           m_s.w, unit, m_s.kh, ub));
  }
  void allocate() {
    const uint64_t row = bytes(row_pixels()), run = bytes(m_s.ow);
    for (int p = 0; p < 2; ++p) {
      m_x[p] = m_b.alloc(Buf::UB, static_cast<uint64_t>(m_s.kh) * (row + kSlack),
                         fmt::format("x rows ({})", p));
      m_y[p] = m_b.alloc(Buf::UB, run + kSlack, fmt::format("y row ({})", p));
    }
    m_tmp = m_b.alloc(Buf::UB, run + kSlack, "running max");
  }
  uint64_t x_row(int p, int64_t a) const override {
    return m_x[p] + static_cast<uint64_t>(a) * (bytes(row_pixels()) + kSlack);
  }

  // MTE2: the x rows of window row oh (step t of the item).
  void load_step(int p, const Reg& img, const Reg& g, const Reg& oh, const Reg& t) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, fmt::format("load window row ({})", p));
    b.wait_flag(m_in_free, p);
    load_x_rows(p, img, g, oh, t);
    b.set_flag(m_in_ready, p);
  }

  // V: the window max of every window of the row into y row p; MTE3 stores it. With m_carry_x
  // V then copies the x rows a + sh the next window row shares (a < kh - sh) into its rows a of
  // the other parity: MTE2 loads that window row's other rows meanwhile (disjoint rows), and
  // V, in order, finishes the copy before it computes that window row.
  void compute_step(int p, const Reg& img, const Reg& g, const Reg& oh, const Reg& t,
                    const Reg& steps) {
    KernelBuilder& b = m_b;
    KernelBuilder::Origin o(b, fmt::format("window row ({})", p));
    b.wait_flag(m_in_ready, p);
    const int64_t row = row_pixels() * m_ct;
    // Rows outside the map: -inf.
    for (int64_t a = 0; a < m_s.kh; ++a) {
      Reg r = b.reg("input row");
      b.mul(r, oh, m_s.sh);
      b.add(r, r, a - m_s.pt);
      auto pad = [&] { vec_dup_bits(b, m_size, x_row(p, a), neg_inf_bits(), row); };
      b.if_(lt(r, 0), pad);
      b.if_(ge(r, m_s.h), pad);
    }
    b.wait_flag(m_out_free, p);
    Reg n = b.reg_imm("elements of a window row", m_s.ow * m_ct);
    std::vector<uint64_t> taps;  // scan order
    for (int64_t a = 0; a < m_s.kh; ++a)
      for (int64_t kw = 0; kw < m_s.kw; ++kw) taps.push_back(column(x_row(p, a), kw));
    const size_t ops = taps.size() - 1;  // the last of them writes y row p
    if (ops == 0) vec_copy_bits(b, m_size, m_y[p], taps[0], m_s.ow * m_ct);
    uint64_t acc = taps[0];
    for (size_t i = 1; i <= ops; ++i) {
      const uint64_t dst = (ops - i) % 2 == 0 ? m_y[p] : m_tmp;
      vec_binary(b, Opcode::op_vmax, m_s.type, dst, acc, taps[i], n);
      acc = dst;
    }
    if (m_carry_x) {
      Reg next = b.reg("next step");
      b.add(next, t, 1);
      b.if_(lt(next, steps), [&] {
        for (int64_t a = 0; a < carried_x(); ++a)
          vec_copy_bits(b, m_size, x_row(1 - p, a), x_row(p, m_s.sh + a), row);
      });
    }
    b.set_flag(m_in_free, p);
    b.set_flag(m_out_ready, p);
    b.wait_flag(m_out_ready, p);
    copy_row(b, m_s, m_ct, false, "y", img, oh, m_s.oh, m_s.ow, g, m_y[p]);
    b.set_flag(m_out_free, p);
  }

  uint64_t m_x[2] = {}, m_y[2] = {}, m_tmp = 0;
  FlagPair m_in_ready, m_in_free, m_out_ready, m_out_free;
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
  // bf16 without bf16 arithmetic: MaxPool's and MaxPoolGrad's vmax / vcmp / vadd on f32
  // copies (the average pools compute on f32 lanes already).
  if ((s.kind == PoolKind::kMax || s.kind == PoolKind::kMaxGrad) &&
      widens_bf16(device_dtype(dt), ctx.cfg))
    return compile_bf16_in_f32(ctx);
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
  Launch launch = s.kind == PoolKind::kMaxGrad ? MaxPoolGradEmitter(s, ctx.cfg, op.str()).emit()
                 : s.kind == PoolKind::kMax   ? MaxPoolEmitter(s, ctx.cfg, op.str()).emit()
                                              : PoolEmitter(s, ctx.cfg, op.str()).emit();
  k.launches.push_back(with_args(std::move(launch), args));
  if (s.cp != c)
    append_strided_copy(k, op, out, output_ref(0), out_pixels, c, s.cp, dt, dt, ctx.cfg);
  return k;
}

}  // namespace npusim::compiler::ops
