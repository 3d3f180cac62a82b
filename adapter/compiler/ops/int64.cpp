#include "adapter/compiler/ops/int64.h"

#include <algorithm>

#include <fmt/format.h>

#include "adapter/compiler/kernel_builder.h"
#include "sim/exec/layout.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

constexpr int64_t kLow32 = 0xffffffff;
constexpr int64_t kSign32 = 0x80000000;

// The element-pair range [k, end) of this block: `per` elements (even) per block.
struct PairRange {
  int64_t per = 0;
  int block_dim = 0;
};

PairRange pair_range(int64_t n, const KernelBuilder& b) {
  const int64_t cores = b.config().core_kind(b.vector_core_kind())->count;
  PairRange r;
  r.per = layout::round_up(layout::ceil_div(n, cores), 2);
  r.block_dim = static_cast<int>(layout::ceil_div(n, r.per));
  return r;
}

}  // namespace

Launch build_widen_s32_to_s64(const std::string& op, int64_t n, const ChipConfig& cfg) {
  KernelBuilder b("Widen_s32_s64", op, cfg);
  const PairRange pr = pair_range(n, b);
  b.begin_section(b.vector_core_kind());
  b.declare_arg("in0", Dtype::S32, {n});
  b.declare_arg("out", Dtype::S64, {n});
  Reg in = b.load_arg("in0"), out = b.load_arg("out");
  Reg k = b.reg("element"), end = b.reg("end of this block's range");
  b.emit(Opcode::op_get_block_id, {k});
  b.mul(k, k, pr.per);
  b.add(end, k, pr.per);
  b.min(end, end, n);
  Reg v = b.reg("two s32"), x = b.reg("one s64"), a = b.reg("address");
  auto widen = [&](const Reg& dst, const Reg& src) {  // dst = sign-extended low 32 bits of src
    b.and_(dst, src, kLow32);
    b.emit(Opcode::op_xor, {dst, dst, kSign32});
    b.sub(dst, dst, kSign32);
  };
  b.for_range(k, k, end, 2, [&] {
    b.mul_add(a, k, 4, in);
    b.emit(Opcode::op_ld, {v, a}, "elements k, k+1");
    b.mul_add(a, k, 8, out);
    widen(x, v);
    b.emit(Opcode::op_st, {x, a});
    Reg k1 = b.reg("k + 1");
    b.add(k1, k, 1);
    b.if_(lt(k1, end), [&] {
      b.shr(v, v, 32);
      widen(x, v);
      b.add(a, a, 8);
      b.emit(Opcode::op_st, {x, a});
    });
  });
  b.end();
  Launch l;
  l.block_dim = pr.block_dim;
  l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  l.summary = fmt::format("s32 -> s64: {} elements, {} blocks of {}", n, pr.block_dim, pr.per);
  l.kernel = b.finish();
  return l;
}

Launch build_narrow_s64_to_s32(const std::string& op, int64_t n, int64_t lo, int64_t hi,
                               const ChipConfig& cfg) {
  KernelBuilder b("Narrow_s64_s32", op, cfg);
  const PairRange pr = pair_range(n, b);
  b.begin_section(b.vector_core_kind());
  b.declare_arg("in0", Dtype::S64, {n});
  b.declare_arg("out", Dtype::S32, {n});
  Reg in = b.load_arg("in0"), out = b.load_arg("out");
  Reg k = b.reg("element"), end = b.reg("end of this block's range");
  b.emit(Opcode::op_get_block_id, {k});
  b.mul(k, k, pr.per);
  b.add(end, k, pr.per);
  b.min(end, end, n);
  Reg v = b.reg("pair"), w = b.reg("second"), a = b.reg("address");
  Reg lo_r = b.reg_imm("lower clamp", lo), hi_r = b.reg_imm("upper clamp", hi);
  auto clamp = [&](const Reg& r) {
    b.max(r, r, lo_r);
    b.min(r, r, hi_r);
    b.and_(r, r, kLow32);
  };
  b.for_range(k, k, end, 2, [&] {
    b.mul_add(a, k, 8, in);
    b.emit(Opcode::op_ld, {v, a}, "element k");
    clamp(v);
    Reg k1 = b.reg("k + 1");
    b.add(k1, k, 1);
    b.if_(lt(k1, end), [&] {
      b.add(a, a, 8);
      b.emit(Opcode::op_ld, {w, a}, "element k + 1");
      clamp(w);
      b.shl(w, w, 32);
      b.emit(Opcode::op_or, {v, v, w});
    });
    b.mul_add(a, k, 4, out);
    b.emit(Opcode::op_st, {v, a}, "elements k, k+1 as s32");
  });
  b.end();
  Launch l;
  l.block_dim = pr.block_dim;
  l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  l.summary = fmt::format("s64 -> s32 clamped to [{}, {}]: {} elements, {} blocks of {}", lo, hi,
                          n, pr.block_dim, pr.per);
  l.kernel = b.finish();
  return l;
}

}  // namespace npusim::compiler::ops
