#include "adapter/compiler/ops/vector_rows.h"

#include <cstdint>
#include <limits>
#include <numeric>

#include <fmt/format.h>

#include "adapter/compiler/ops/elementwise.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;
using isa::Pipe;

namespace {

constexpr int64_t kLaneBytes = 4;
constexpr int64_t kRowBlockBytes = vec::kBlockBytes;       // one replicated row value (8 lanes)
constexpr int64_t kTransposeBytes = vec::kTransposeBytes;  // one vtranspose: 16 x 16 u16
constexpr int64_t kReplicateGroupRows = 8;                 // 4-byte values per 16 x 16 u16 matrix
constexpr int64_t kReplicateGroupBytes = 2 * kTransposeBytes;  // the matrix and its transpose
constexpr int64_t kU16Lanes = 128;                             // u16 lanes of one repeat
constexpr int64_t kAltBytesPerGroup = 16;                      // vsel bits of one u16 repeat
constexpr int64_t kAltPattern = 0x5555;                        // even u16 lanes from src0

int64_t groups_of(int64_t rows) { return (rows + kReplicateGroupRows - 1) / kReplicateGroupRows; }

}  // namespace

void set_mask_lanes(KernelBuilder& b, uint64_t lanes) {
  b.emit(Opcode::op_set_mask, {0, static_cast<int64_t>(lanes)});
}

void vec_binary_strided(KernelBuilder& b, Opcode op, Dtype t, VOperand dst, VOperand src0,
                        VOperand src1, Opnd repeat) {
  b.emit(op, {t, dst.addr, src0.addr, src1.addr, repeat, dst.blk, src0.blk, src1.blk, dst.rep,
              src0.rep, src1.rep});
}

void vec_unary_strided(KernelBuilder& b, Opcode op, Dtype t, VOperand dst, VOperand src,
                       Opnd repeat) {
  b.emit(op, {t, dst.addr, src.addr, repeat, dst.blk, src.blk, dst.rep, src.rep});
}

void vec_scalar_strided(KernelBuilder& b, Opcode op, Dtype t, VOperand dst, VOperand src,
                        const Reg& scalar, Opnd repeat) {
  b.emit(op, {t, dst.addr, src.addr, scalar, repeat, dst.blk, src.blk, dst.rep, src.rep});
}

void vec_compare_strided(KernelBuilder& b, Dtype t, isa::Cmp cmp, Opnd bits, VOperand src0,
                         VOperand src1, Opnd repeat) {
  b.emit(Opcode::op_vcmp,
         {t, cmp, bits, src0.addr, src1.addr, repeat, src0.blk, src1.blk, src0.rep, src1.rep});
}

void vec_select_strided(KernelBuilder& b, Dtype t, VOperand dst, VOperand src0, VOperand src1,
                        Opnd bits, Opnd repeat) {
  b.emit(Opcode::op_vsel, {t, dst.addr, src0.addr, src1.addr, bits, repeat, dst.blk, src0.blk,
                           src1.blk, dst.rep, src0.rep, src1.rep});
}

void vec_reduce_strided(KernelBuilder& b, Opcode op, Dtype t, Opnd dst, VOperand src, Opnd repeat) {
  b.emit(op, {t, dst, src.addr, repeat, src.blk, src.rep});
}

void count_blocks(KernelBuilder& b, const Reg& blocks, const Reg& count, int64_t size) {
  b.mul(blocks, count, size);
  b.add(blocks, blocks, kRowBlockBytes - 1);
  b.shr(blocks, blocks, 5);
}

void vec_fill32(KernelBuilder& b, Opnd dst, int64_t bits, Opnd count) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vdup,
         {Dtype::S32, dst, static_cast<int64_t>(static_cast<int32_t>(bits)), 0, 1, 8});
}

Opcode combine_opcode(Combine c) {
  switch (c) {
    case Combine::kSum: return Opcode::op_vadd;
    case Combine::kMax: return Opcode::op_vmax;
    case Combine::kMin: return Opcode::op_vmin;
    case Combine::kProd: return Opcode::op_vmul;
  }
  return Opcode::op_vadd;
}

Opcode combine_reduce_opcode(Combine c) {
  switch (c) {
    case Combine::kSum: return Opcode::op_vcadd;
    case Combine::kMax: return Opcode::op_vcmax;
    case Combine::kMin: return Opcode::op_vcmin;
    case Combine::kProd: break;
  }
  throw Error("combine_reduce_opcode: no vector reduction for a product");
}

int64_t combine_identity_bits(Combine c, Dtype t) {
  const bool f = t == Dtype::F32;
  switch (c) {
    case Combine::kSum: return 0;
    case Combine::kMax: return f ? 0xff800000 : std::numeric_limits<int32_t>::min();
    case Combine::kMin: return f ? 0x7f800000 : std::numeric_limits<int32_t>::max();
    case Combine::kProd: return f ? 0x3f800000 : 1;
  }
  return 0;
}

// ---- super-rows ----

SuperRowLayout SuperRowLayout::make(int64_t row, int64_t granule) {
  SuperRowLayout l;
  l.row = row;
  l.rows = granule / std::gcd(row, granule);
  l.lanes = l.rows * row;
  l.spans.resize(static_cast<size_t>(l.rows));
  for (int64_t j = 0; j < l.rows; ++j) {
    const int64_t a = j * row, e = a + row;
    for (int64_t off = a / kBlockLanes32 * kBlockLanes32; off < e; off += kLanes32)
      l.spans[static_cast<size_t>(j)].push_back(
          RowSpan{off, lane_range(std::max<int64_t>(a - off, 0), std::min<int64_t>(e - off, 64))});
  }
  return l;
}

void for_superrow_batches(KernelBuilder& b, const RowGroup& g,
                          const std::function<void(const Reg&, Opnd, int64_t)>& body) {
  const int64_t xrep = g.layout->blocks32();
  if (xrep <= kMaxRepeat) {
    Reg first = b.reg_imm("all super-rows at once", 0);
    body(first, *g.supers, xrep);
  } else {
    Reg s = b.reg("super-row (one per instruction: longer than 255 blocks)");
    b.for_range(s, 0, *g.supers, 1, [&] { body(s, 1, 0); });
  }
}

namespace {

// r = base + first * stride (byte addresses).
void offset_addr(KernelBuilder& b, const Reg& r, const Reg& first, int64_t stride, int64_t base) {
  b.mul_add(r, first, stride, base);
}

}  // namespace

void rows_to_lanes(KernelBuilder& b, const RowGroup& g, Combine c, Dtype t, uint64_t acc) {
  KernelBuilder::Origin o(b, "row reduction: rows -> lane slots");
  const SuperRowLayout& L = *g.layout;
  {
    Reg n = b.reg("slot lanes");
    b.mul(n, *g.rows, kLanes32);
    vec_fill32(b, acc, combine_identity_bits(c, t), n);
  }
  const Opcode op = combine_opcode(c);
  const int64_t slot_rep = L.rows * (kSlotBytes / kRowBlockBytes);  // next super-row's slot j
  for_superrow_batches(b, g, [&](const Reg& first, Opnd count, int64_t xrep) {
    Reg xa = b.reg("row span"), aa = b.reg("lane slot");
    for (int64_t j = 0; j < L.rows; ++j) {
      offset_addr(b, aa, first, L.rows * kSlotBytes, static_cast<int64_t>(acc) + j * kSlotBytes);
      for (const RowSpan& sp : L.spans[static_cast<size_t>(j)]) {
        set_mask_lanes(b, sp.mask);
        offset_addr(b, xa, first, L.lanes * kLaneBytes,
                    static_cast<int64_t>(g.x) + sp.offset * kLaneBytes);
        vec_binary_strided(b, op, t, VOperand(aa, 1, slot_rep), VOperand(aa, 1, slot_rep),
                           VOperand(xa, 1, xrep), count);
      }
    }
  });
}

uint64_t rows_to_lanes_alternating(KernelBuilder& b, const RowGroup& g, Combine c, Dtype t,
                                   uint64_t acc, uint64_t acc2) {
  const SuperRowLayout& L = *g.layout;
  if (L.rows != 1 || L.spans.size() != 1) {
    rows_to_lanes(b, g, c, t, acc);
    return acc;
  }
  for (const RowSpan& sp : L.spans[0])
    if (sp.mask != kAllLanes) {
      rows_to_lanes(b, g, c, t, acc);
      return acc;
    }
  KernelBuilder::Origin o(b, "row reduction: rows -> lane slots (alternating)");
  {
    Reg n = b.reg("slot lanes");
    b.mul(n, *g.rows, kLanes32);
    vec_fill32(b, acc, combine_identity_bits(c, t), n);
  }
  const Opcode op = combine_opcode(c);
  const int64_t slot_rep = kSlotBytes / kRowBlockBytes;  // one super-row (row) per slot
  uint64_t from = acc, to = acc2;
  for_superrow_batches(b, g, [&](const Reg& first, Opnd count, int64_t xrep) {
    Reg xa = b.reg("row span"), fa = b.reg("lane slot"), ta = b.reg("next lane slot");
    for (const RowSpan& sp : L.spans[0]) {
      set_mask_lanes(b, sp.mask);
      offset_addr(b, fa, first, kSlotBytes, static_cast<int64_t>(from));
      offset_addr(b, ta, first, kSlotBytes, static_cast<int64_t>(to));
      offset_addr(b, xa, first, L.lanes * kLaneBytes,
                  static_cast<int64_t>(g.x) + sp.offset * kLaneBytes);
      vec_binary_strided(b, op, t, VOperand(ta, 1, slot_rep), VOperand(fa, 1, slot_rep),
                         VOperand(xa, 1, xrep), count);
      std::swap(from, to);
    }
    from = acc;  // the next batch's rows start from their identity slots again
    to = acc2;
  });
  return L.spans[0].size() % 2 == 0 ? acc : acc2;
}

void lanes_reduce(KernelBuilder& b, Combine c, Dtype t, uint64_t acc, const Reg& rows,
                  uint64_t dense, uint64_t tmp) {
  KernelBuilder::Origin o(b, "row reduction: lane slots -> one value per row");
  const VOperand slots(acc, 1, kSlotBytes / kRowBlockBytes);
  if (c != Combine::kProd) {
    set_mask_lanes(b, kAllLanes);
    vec_reduce_strided(b, combine_reduce_opcode(c), t, dense, slots, rows);
    return;
  }
  // Halve each slot to 8 lanes (one block), then multiply its 8 lanes, extracted one at a time
  // as a dense vector (vcmax of one active lane is that lane: max(identity, x) = x).
  for (int64_t half = kLanes32 / 2; half >= kBlockLanes32; half /= 2) {
    set_mask_lanes(b, lane_range(0, half));
    vec_binary_strided(b, Opcode::op_vmul, t, slots, slots,
                       VOperand(static_cast<int64_t>(acc) + half * kLaneBytes, 1, slots.rep), rows);
  }
  for (int64_t e = 0; e < kBlockLanes32; ++e) {
    set_mask_lanes(b, uint64_t{1} << e);
    vec_reduce_strided(b, Opcode::op_vcmax, t, e == 0 ? dense : tmp, slots, rows);
    if (e > 0) vec_binary(b, Opcode::op_vmul, t, dense, dense, tmp, rows);
  }
}

void fold_into_slot(KernelBuilder& b, Combine c, Dtype t, uint64_t buf, const Reg& n, Opnd slot) {
  KernelBuilder::Origin o(b, "fold a chunk into a lane slot");
  Reg m = b.reg("lanes left"), h = b.reg("half"), cnt = b.reg("folded lanes");
  Reg hi = b.reg("upper part");
  b.mov(m, n);
  Label fold = b.label("fold"), folded = b.label("folded");
  b.bind(fold);
  b.branch(lt(m, kLanes32 + 1), folded);
  b.add(h, m, 1);
  b.shr(h, h, 1);
  b.add(h, h, kLanes32 - 1);
  b.and_(h, h, -kLanes32);
  b.sub(cnt, m, h);
  b.mul_add(hi, h, kLaneBytes, static_cast<int64_t>(buf));
  vec_binary(b, combine_opcode(c), t, buf, buf, hi, cnt);
  b.mov(m, h);
  b.jmp(fold);
  b.bind(folded);
  vec_binary(b, combine_opcode(c), t, slot, slot, buf, m);
}

void lanes_arg_step(KernelBuilder& b, bool is_max, Dtype t, Opnd src, const Reg& count,
                    const Reg& idx0, Opnd acc_val, Opnd acc_idx, uint64_t iota64, uint64_t t64,
                    uint64_t bits) {
  vec_scalar(b, Opcode::op_vadds, Dtype::S32, t64, iota64, idx0, count);
  vec_compare_strided(b, t, is_max ? isa::Cmp::GT : isa::Cmp::LT, bits, VOperand(src),
                      VOperand(acc_val), 0);
  vec_select_strided(b, t, VOperand(acc_val), VOperand(src), VOperand(acc_val), bits, 0);
  vec_select_strided(b, Dtype::S32, VOperand(acc_idx), VOperand(t64), VOperand(acc_idx), bits, 0);
}

void rows_to_lanes_arg(KernelBuilder& b, const RowGroup& g, bool is_max, Dtype t, uint64_t acc_val,
                       uint64_t acc_idx, uint64_t iota64, uint64_t t64, uint64_t bits) {
  KernelBuilder::Origin o(b, fmt::format("arg{}: rows -> lane slots", is_max ? "max" : "min"));
  const SuperRowLayout& L = *g.layout;
  {
    Reg n = b.reg("slot lanes");
    b.mul(n, *g.rows, kLanes32);
    vec_fill32(b, acc_val, combine_identity_bits(is_max ? Combine::kMax : Combine::kMin, t), n);
    vec_fill32(b, acc_idx, 0, n);
  }
  const int64_t slot_rep = L.rows * (kSlotBytes / kRowBlockBytes);
  for_superrow_batches(b, g, [&](const Reg& first, Opnd count, int64_t xrep) {
    Reg xa = b.reg("row span"), va = b.reg("value slot"), ia = b.reg("index slot");
    Reg k = b.reg("index of the span's lane 0 in the row");
    Reg lanes = b.reg_imm("64", kLanes32);
    for (int64_t j = 0; j < L.rows; ++j) {
      offset_addr(b, va, first, L.rows * kSlotBytes,
                  static_cast<int64_t>(acc_val) + j * kSlotBytes);
      offset_addr(b, ia, first, L.rows * kSlotBytes,
                  static_cast<int64_t>(acc_idx) + j * kSlotBytes);
      for (const RowSpan& sp : L.spans[static_cast<size_t>(j)]) {
        b.movi(k, sp.offset - j * L.row);
        vec_scalar(b, Opcode::op_vadds, Dtype::S32, t64, iota64, k, lanes);
        set_mask_lanes(b, sp.mask);
        offset_addr(b, xa, first, L.lanes * kLaneBytes,
                    static_cast<int64_t>(g.x) + sp.offset * kLaneBytes);
        const VOperand x(xa, 1, xrep), v(va, 1, slot_rep), i(ia, 1, slot_rep);
        vec_compare_strided(b, t, is_max ? isa::Cmp::GT : isa::Cmp::LT, bits, x, v, count);
        vec_select_strided(b, t, v, x, v, bits, count);
        vec_select_strided(b, Dtype::S32, i, VOperand(t64, 1, 0), i, bits, count);
      }
    }
  });
}

void lanes_reduce_arg(KernelBuilder& b, bool is_max, Dtype t, uint64_t acc_val, uint64_t acc_idx,
                      const Reg& rows, uint64_t dense_val, uint64_t dense_idx,
                      const ArgScratch& s) {
  KernelBuilder::Origin o(
      b, fmt::format("arg{}: lane slots -> first index of the best value", is_max ? "max" : "min"));
  const int64_t slot_rep = kSlotBytes / kRowBlockBytes;
  set_mask_lanes(b, kAllLanes);
  vec_reduce_strided(b, is_max ? Opcode::op_vcmax : Opcode::op_vcmin, t, dense_val,
                     VOperand(acc_val, 1, slot_rep), rows);
  replicate_rows(b, dense_val, rows, s.rep, s.replicate, s.alt);
  set_mask_lanes(b, kAllLanes);
  vec_compare_strided(b, t, isa::Cmp::EQ, s.bits, VOperand(acc_val, 1, slot_rep),
                      VOperand(s.rep, 0, 1), rows);
  vec_select_strided(b, Dtype::S32, VOperand(acc_idx, 1, slot_rep), VOperand(acc_idx, 1, slot_rep),
                     VOperand(s.big64, 1, 0), s.bits, rows);
  vec_reduce_strided(b, Opcode::op_vcmin, Dtype::S32, dense_idx, VOperand(acc_idx, 1, slot_rep),
                     rows);
}

uint64_t replicated_bytes(int64_t max_rows) {
  return static_cast<uint64_t>(groups_of(max_rows) * kReplicateGroupRows * kRowBlockBytes);
}

uint64_t replicate_scratch_bytes(int64_t max_rows) {
  return static_cast<uint64_t>(groups_of(max_rows) * kReplicateGroupBytes);
}

uint64_t alt_pattern_bytes(int64_t max_rows) {
  return static_cast<uint64_t>((groups_of(max_rows) * kAltBytesPerGroup + 31) / 32 * 32);
}

void replicate_rows(KernelBuilder& b, uint64_t dense, const Reg& rows, uint64_t rep,
                    uint64_t scratch, uint64_t alt) {
  KernelBuilder::Origin o(b, "replicate one value per row to a block per row");
  Reg groups = b.reg("groups of 8 rows");
  b.add(groups, rows, kReplicateGroupRows - 1);
  b.shr(groups, groups, 3);
  Reg lanes = b.reg("u16 lanes");
  b.mul(lanes, groups, kU16Lanes);
  const int64_t group_rep = kReplicateGroupBytes / kRowBlockBytes;
  const int64_t xs = static_cast<int64_t>(scratch);
  // Matrix rows 0..7 and 8..15 of every group: the group's 8 values (one block), 8 times.
  for (int64_t half = 0; half < 2; ++half) {
    b.emit(Opcode::op_set_mask_count, {lanes});
    vec_unary_strided(b, Opcode::op_vcopy, Dtype::U16,
                      VOperand(xs + half * kTransposeBytes / 2, 1, group_rep),
                      VOperand(dense, 0, 1), 0);
  }
  {
    Reg g = b.reg("group"), src = b.reg("matrix"), dst = b.reg("transpose");
    b.for_range(g, 0, groups, 1, [&] {
      b.mul_add(src, g, kReplicateGroupBytes, xs);
      b.add(dst, src, kTransposeBytes);
      b.emit(Opcode::op_vtranspose, {dst, src});
    });
  }
  // Row r of a group's block: transposed rows 2r (low halves) and 2r+1 (high halves) interleaved.
  b.emit(Opcode::op_set_mask_count, {lanes});
  vec_select_strided(b, Dtype::U16, VOperand(rep, 1, 8),
                     VOperand(xs + kTransposeBytes, 2, group_rep),
                     VOperand(xs + kTransposeBytes + kRowBlockBytes, 2, group_rep), alt, 0);
}

void widen_rows(KernelBuilder& b, uint64_t rep, const Reg& rows, uint64_t wide) {
  KernelBuilder::Origin o(b, "widen one block per row to a repeat per row");
  set_mask_lanes(b, kAllLanes);
  vec_unary_strided(b, Opcode::op_vcopy, Dtype::S32, VOperand(wide, 1, kSlotBytes / kRowBlockBytes),
                    VOperand(rep, 0, 1), rows);
}

void widen_row_groups(KernelBuilder& b, uint64_t rep, const Reg& rows, uint64_t wide) {
  KernelBuilder::Origin o(b, "widen one block per row to a repeat per row, 8 rows per repeat");
  constexpr int64_t kBlocksPerRepeat = kSlotBytes / kRowBlockBytes;  // 8
  static_assert(kBlocksPerRepeat == kReplicateGroupRows);
  set_mask_lanes(b, kAllLanes);
  Reg groups = b.reg("groups of 8 rows");
  b.add(groups, rows, kReplicateGroupRows - 1);
  b.div(groups, groups, kReplicateGroupRows);
  // Instruction k: repeat i writes block k of rows 8i..8i+7 (block stride: a row's repeat; repeat
  // stride: 8 rows) from those rows' blocks in rep (consecutive).
  for (int64_t k = 0; k < kBlocksPerRepeat; ++k)
    vec_unary_strided(b, Opcode::op_vcopy, Dtype::S32,
                      VOperand(static_cast<int64_t>(wide) + k * kRowBlockBytes, kBlocksPerRepeat,
                               kReplicateGroupRows * kBlocksPerRepeat),
                      VOperand(rep, 1, kBlocksPerRepeat), groups);
}

void widen_rows_grouped(KernelBuilder& b, uint64_t rep, const Reg& rows, uint64_t wide,
                        int64_t max_rows) {
  constexpr int64_t kBlocksPerRepeat = kSlotBytes / kRowBlockBytes;  // 8
  // Cycles at the vector latency L: 8 (L + groups) against groups (L + 8): the loop wins while
  // groups < 8 whatever L.
  if (groups_of(max_rows) >= kBlocksPerRepeat) {
    widen_row_groups(b, rep, rows, wide);
    return;
  }
  KernelBuilder::Origin o(
      b, "widen one block per row to a repeat per row, one instruction per 8 rows");
  set_mask_lanes(b, kAllLanes);
  Reg groups = b.reg("groups of 8 rows"), i = b.reg("group"), src = b.reg("group's blocks"),
      dst = b.reg("group's repeats");
  b.add(groups, rows, kReplicateGroupRows - 1);
  b.div(groups, groups, kReplicateGroupRows);
  b.for_range(i, 0, groups, 1, [&] {
    b.mul_add(src, i, kReplicateGroupRows * kRowBlockBytes, static_cast<int64_t>(rep));
    b.mul_add(dst, i, kReplicateGroupRows * kSlotBytes, static_cast<int64_t>(wide));
    // Repeat k: block k of each of the 8 rows' repeats (block stride: a repeat; repeat stride: a
    // block) from the rows' blocks (block stride 1, repeat stride 0).
    vec_unary_strided(b, Opcode::op_vcopy, Dtype::S32, VOperand(dst, kBlocksPerRepeat, 1),
                      VOperand(src, 1, 0), kBlocksPerRepeat);
  });
}

uint64_t widened_bytes(int64_t max_rows) {
  return static_cast<uint64_t>(groups_of(max_rows) * kReplicateGroupRows * kSlotBytes);
}

void rows_bcast(KernelBuilder& b, const RowGroup& g, Opcode op, Dtype t, uint64_t rep,
                bool rep_first, uint64_t dst, bool rep_wide) {
  rows_bcast_into(b, g, op, t, rep, rep_first, dst ? dst : g.x, rep_wide);
}

void rows_bcast_into(KernelBuilder& b, const RowGroup& g, Opcode op, Dtype t, uint64_t rep,
                     bool rep_first, uint64_t dst, bool rep_wide) {
  KernelBuilder::Origin o(b, fmt::format("per-row value applied to every lane of the row ({})",
                                         isa::describe(op).mnemonic));
  const SuperRowLayout& L = *g.layout;
  for_superrow_batches(b, g, [&](const Reg& first, Opnd count, int64_t xrep) {
    Reg xa = b.reg("row span"), ra = b.reg("row value block"), da = b.reg("destination span");
    for (int64_t j = 0; j < L.rows; ++j) {
      const int64_t rep_bytes = rep_wide ? kSlotBytes : kRowBlockBytes;  // per row
      offset_addr(b, ra, first, L.rows * rep_bytes, static_cast<int64_t>(rep) + j * rep_bytes);
      for (const RowSpan& sp : L.spans[static_cast<size_t>(j)]) {
        set_mask_lanes(b, sp.mask);
        offset_addr(b, xa, first, L.lanes * kLaneBytes,
                    static_cast<int64_t>(g.x) + sp.offset * kLaneBytes);
        offset_addr(b, da, first, L.lanes * kLaneBytes,
                    static_cast<int64_t>(dst) + sp.offset * kLaneBytes);
        const VOperand x(xa, 1, xrep), y(da, 1, xrep);
        const VOperand v = rep_wide ? VOperand(ra, 1, L.rows * (kSlotBytes / kRowBlockBytes))
                                    : VOperand(ra, 0, L.rows);
        vec_binary_strided(b, op, t, y, rep_first ? v : x, rep_first ? x : v, count);
      }
    }
  });
}

void fill_iota64(KernelBuilder& b, uint64_t iota64) {
  KernelBuilder::Origin o(b, "s32 0..63");
  vec_fill32(b, iota64, 0, kLanes32);
  Reg v = b.reg("bit value");
  for (int bit = 0; bit < 6; ++bit) {
    uint64_t lanes = 0;
    for (int i = 0; i < kLanes32; ++i)
      if ((i >> bit) & 1) lanes |= uint64_t{1} << i;
    set_mask_lanes(b, lanes);
    b.movi(v, int64_t{1} << bit);
    vec_scalar_strided(b, Opcode::op_vadds, Dtype::S32, VOperand(iota64), VOperand(iota64), v, 1);
  }
}

void fill_alt_pattern(KernelBuilder& b, uint64_t alt, int64_t max_rows) {
  KernelBuilder::Origin o(b, "alternating vsel pattern");
  b.emit(Opcode::op_set_mask_count, {groups_of(max_rows) * kAltBytesPerGroup / 2});
  b.emit(Opcode::op_vdup, {Dtype::U16, alt, kAltPattern, 0, 1, 8});
}

// ---- PingPong ----

PingPong::PingPong(KernelBuilder& b)
    : m_b(b),
      m_load_free(b.flag_pair(Pipe::V, Pipe::MTE2, "load copy free")),
      m_load_ready(b.flag_pair(Pipe::MTE2, Pipe::V, "load copy landed")),
      m_out_free(b.flag_pair(Pipe::MTE3, Pipe::V, "output copy stored")),
      m_out_ready(b.flag_pair(Pipe::V, Pipe::MTE3, "output copy computed")),
      m_load_parity(b.reg_imm("load parity (ping 0 / pong 1)", 0)),
      m_out_parity(b.reg_imm("output parity (ping 0 / pong 1)", 0)) {
  KernelBuilder::Origin o(b, "both copies start free");
  for (int q = 0; q < 2; ++q) {
    b.set_flag(m_load_free, q);
    b.set_flag(m_out_free, q);
  }
}

void PingPong::flip(const Reg& parity) {
  m_b.add(parity, parity, 1);
  m_b.and_(parity, parity, 1, "next copy");
}
void PingPong::load_step(const std::function<void(int)>& body) {
  m_b.by_parity(m_load_parity, body);
  flip(m_load_parity);
}
void PingPong::out_step(const std::function<void(int)>& body) {
  m_b.by_parity(m_out_parity, body);
  flip(m_out_parity);
}
void PingPong::pipeline(const Reg& steps, const std::function<void(const Reg&, int)>& load,
                        const std::function<void(const Reg&, int)>& compute) {
  auto by_step_parity = [&](const Reg& t, const std::function<void(const Reg&, int)>& body) {
    Reg q = m_b.reg("copy of the step (t & 1)");
    m_b.and_(q, t, 1);
    m_b.by_parity(q, [&](int p) { body(t, p); });
  };
  m_b.pipelined_steps(
      steps, [&](const Reg& t) { by_step_parity(t, load); },
      [&](const Reg& t) { by_step_parity(t, compute); });
}
void PingPong::load_done(int q) { m_b.set_flag(m_load_ready, q); }
void PingPong::wait_loaded(int q) { m_b.wait_flag(m_load_ready, q); }
void PingPong::wait_load_free(int q) { m_b.wait_flag(m_load_free, q); }
void PingPong::loaded(int q) {
  m_b.set_flag(m_load_ready, q);
  m_b.wait_flag(m_load_ready, q);
}
void PingPong::release_load(int q) { m_b.set_flag(m_load_free, q); }
void PingPong::wait_out_free(int q) { m_b.wait_flag(m_out_free, q); }
void PingPong::out_ready(int q) {
  m_b.set_flag(m_out_ready, q);
  m_b.wait_flag(m_out_ready, q);
}
void PingPong::stored(int q) { m_b.set_flag(m_out_free, q); }
void PingPong::drain() {
  KernelBuilder::Origin o(m_b, "drain: consume the free flags of both copies");
  for (int q = 0; q < 2; ++q) {
    m_b.wait_flag(m_load_free, q);
    m_b.wait_flag(m_out_free, q);
  }
}

}  // namespace npusim::compiler::ops
