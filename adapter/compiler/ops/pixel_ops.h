// Vector operations over rows of pixels held in the UB as [pixel][ct] f32, ct a multiple of 8
// (each pixel whole 32-byte blocks), shared by the pooling kernels (ops/pool.cpp) and the
// per-channel statistics kernel (ops/channel.cpp).
//
// One repeat covers 64 channels of one pixel: an instruction runs over pixels with the pixel
// pitches of its operands as repeat strides (so a stride-s window tap or a broadcast row, pitch
// 0, is one instruction), once per 64-channel part of ct (a partial part masked in normal mask
// mode) and per chunk of at most 248 pixels (255 repeats; compare bits stay 32-byte aligned).
// Masked repeats still address 8 blocks, so buffers need up to 224 bytes of room past their
// last pixel (kPixelSlack).
#pragma once

#include <cstdint>
#include <functional>

#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/ops/elementwise.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

class PixelOps {
 public:
  static constexpr int64_t kLanes = 64;       // f32 lanes of one repeat
  static constexpr int64_t kBlockF32 = 8;     // f32 per 32-byte block
  static constexpr int64_t kPixChunk = 248;   // pixels per instruction
  static constexpr uint64_t kPixelSlack = vec::kRepeatBytes;  // a repeat past the last pixel

  PixelOps(KernelBuilder& b, int64_t ct) : m_b(b), m_ct(ct) {}

  int64_t ct() const { return m_ct; }
  int64_t pitch() const { return m_ct / kBlockF32; }  // blocks per pixel

  // Byte address of pixel p, 64-channel part j, of a [pixel][ct] f32 buffer.
  int64_t at(uint64_t base, int64_t p, int64_t j) const {
    return static_cast<int64_t>(base) + (p * pitch() + j * 8) * 32;
  }

  // Calls one(part, first pixel, pixel count) per 64-channel part (mask set) and pixel chunk.
  void per_pixel(int64_t npix, const std::function<void(int64_t, int64_t, int64_t)>& one) {
    for (int64_t j = 0; j * kLanes < m_ct; ++j) {
      set_part_mask(j);
      for (int64_t first = 0; first < npix; first += kPixChunk)
        one(j, first, std::min(kPixChunk, npix - first));
    }
  }

  // d[pd0 + p*sd] = op(a[pa0 + p*sa], c[pc0 + p*sc]) for p in [0, n) (pixel indices and
  // strides; a stride of 0 repeats one pixel).
  void binary(isa::Opcode op, uint64_t d, int64_t pd0, int64_t sd, uint64_t a, int64_t pa0,
              int64_t sa, uint64_t c, int64_t pc0, int64_t sc, int64_t n) {
    if (n <= 0) return;
    per_pixel(n, [&](int64_t j, int64_t f, int64_t cnt) {
      m_b.emit(op, {isa::Dtype::F32, at(d, pd0 + f * sd, j), at(a, pa0 + f * sa, j),
                    at(c, pc0 + f * sc, j), cnt, 1, 1, 1, sd * pitch(), sa * pitch(),
                    sc * pitch()});
    });
  }
  // The same over a run-time pixel count n (at most kPixChunk), all pixel offsets 0.
  void binary(isa::Opcode op, uint64_t d, int64_t sd, uint64_t a, int64_t sa, uint64_t c,
              int64_t sc, const Reg& n) {
    for (int64_t j = 0; j * kLanes < m_ct; ++j) {
      set_part_mask(j);
      m_b.emit(op, {isa::Dtype::F32, at(d, 0, j), at(a, 0, j), at(c, 0, j), n, 1, 1, 1,
                    sd * pitch(), sa * pitch(), sc * pitch()});
    }
  }

  // Contiguous (counter-mode) operations over npix pixels starting at pixel p0.
  void fill(uint64_t d, uint64_t f32_bits, int64_t npix) {
    Reg v = m_b.reg_imm("fill value", static_cast<int64_t>(f32_bits));
    vec_dup_bits(m_b, 4, d, v, npix * m_ct);
  }
  void scale(uint64_t d, int64_t p0, int64_t npix, const Reg& f32_bits) {
    Reg cnt = m_b.reg_imm("elements", npix * m_ct);
    vec_scalar(m_b, isa::Opcode::op_vmuls, isa::Dtype::F32, at(d, p0, 0), at(d, p0, 0),
               f32_bits, cnt);
  }
  // f32 <- raw (exact widening) / raw <- f32 (RNE); no-op for f32 tensors.
  void widen(uint64_t f32, uint64_t raw, isa::Dtype type, const Reg& elements) {
    if (type != isa::Dtype::F32)
      vec_convert(m_b, isa::Dtype::F32, type, f32, raw, RoundMode::kRint, elements);
  }
  void narrow(uint64_t raw, uint64_t f32, isa::Dtype type, const Reg& elements) {
    if (type != isa::Dtype::F32)
      vec_convert(m_b, type, isa::Dtype::F32, raw, f32, RoundMode::kRint, elements);
  }

 private:
  void set_part_mask(int64_t j) {
    const int64_t lanes = std::min(kLanes, m_ct - j * kLanes);
    Reg lo = m_b.reg_imm("mask: channels of the part",
                         static_cast<int64_t>(lanes >= 64 ? ~uint64_t{0}
                                                          : (uint64_t{1} << lanes) - 1));
    m_b.emit(isa::Opcode::op_set_mask, {0, lo});
  }

  KernelBuilder& m_b;
  int64_t m_ct;
};

}  // namespace npusim::compiler::ops
