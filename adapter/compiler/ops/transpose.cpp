// Transpose strategies, after dropping size-1 dims and merging input dims that stay adjacent
// and in order (so [B,S,H,D] -> [B,H,S,D] is 4-d, [N,H,W,C] -> [N,C,H,W] is [N,HW,C] -> [N,C,HW]):
//   inner dim kept (the last output dim is the last input dim): one assembly launch whose rows
//     are runs of the inner dim (assemble.h: whole blocks loaded straight into the output tile,
//     partial blocks through a scratch buffer and an exact vcopy).
//   inner dim moved, 2- and 4-byte elements, output rows of at least two 32-byte blocks: as
//     [P, Q, R] -> [P, R, Q] (a batched 2-d transpose; a keep-inner copy first when the input
//     is not in that order) by the block transposer below: 16x16 element blocks transposed
//     in the UB with vtranspose (2-byte: one per block; 4-byte: vtranspose works on 16-bit
//     lanes, so a 16x16 f32 block, two 512-byte matrices, takes three vtranspose passes with
//     a block permutation (vcopy with block strides) between them, see
//     build_block_transpose). When an output row (Q elements) is not whole 32-byte blocks, the
//     transposer
//     writes rows padded to whole blocks into the workspace and a copy kernel drops the
//     padding (GM is byte addressed, the UB is not: only an MTE round trip shifts data by less
//     than a block).
//   1-byte elements, same shapes: widened to u16 by a vconv launch, transposed as 2-byte,
//     narrowed back.
//   otherwise (8-byte elements, short output rows): element by element (ld + one-lane vdup per
//     element, assemble.h).
#include "adapter/compiler/ops/transpose.h"

#include <algorithm>

#include <fmt/format.h>

#include "adapter/compiler/ops/assemble.h"
#include "adapter/compiler/ops/cast.h"
#include "adapter/compiler/ops/elementwise.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

std::vector<int64_t> permuted_shape(const std::vector<int64_t>& shape,
                                    const std::vector<int64_t>& perm) {
  std::vector<int64_t> out;
  for (int64_t p : perm) out.push_back(shape[static_cast<size_t>(p)]);
  return out;
}

namespace {

// The permutation with size-1 dims dropped and runs of input dims that stay adjacent merged.
struct ReducedPerm {
  std::vector<int64_t> in_shape;  // merged input dims
  std::vector<int64_t> perm;      // over the merged dims
};

ReducedPerm reduce(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm) {
  // Input dims that matter, renumbered.
  std::vector<int64_t> keep(shape.size(), -1);
  std::vector<int64_t> sizes;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1) {
      keep[d] = static_cast<int64_t>(sizes.size());
      sizes.push_back(shape[d]);
    }
  std::vector<int64_t> p;
  for (int64_t d : perm)
    if (keep[static_cast<size_t>(d)] >= 0) p.push_back(keep[static_cast<size_t>(d)]);
  // Merge output-consecutive dims that are input-consecutive: groups of input dims.
  std::vector<std::vector<int64_t>> groups;  // in output order
  for (int64_t d : p) {
    if (!groups.empty() && groups.back().back() + 1 == d) groups.back().push_back(d);
    else groups.push_back({d});
  }
  // Number the groups in input order.
  std::vector<size_t> order(groups.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return groups[a].front() < groups[b].front(); });
  ReducedPerm r;
  r.perm.assign(groups.size(), 0);
  for (size_t rank = 0; rank < order.size(); ++rank) {
    int64_t size = 1;
    for (int64_t d : groups[order[rank]]) size *= sizes[static_cast<size_t>(d)];
    r.in_shape.push_back(size);
    r.perm[order[rank]] = static_cast<int64_t>(rank);
  }
  return r;
}

using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using isa::Pipe;

constexpr int64_t kSide = 16;  // vtranspose: 16 x 16 two-byte lanes
constexpr int64_t kBlock = static_cast<int64_t>(layout::kBlockBytes);

// Transposes [P, Q, R] -> [P, R, Q]; input rows are `ri` elements apart (ri = R, or more when
// the input rows are padded), output rows `qo` elements apart (qo = Q, or Q padded to whole
// blocks). Tiles of tq x tr (multiples of 16) go round-robin to the vector
// cores; per tile: MTE2 loads the q rows into a staging buffer laid out as 16x16 blocks
// ([r block][q block][16 q][16 r], each block contiguous), V transposes every block into the
// output staging ([q block][r block][16 r][16 q]), MTE3 stores each q block's column of rows
// with one copy_ub2gm. Staging buffers are ping/pong (MTE2 / V / MTE3 overlap).
// Arguments: in0 [P, Q, ri], out [P, R, qo].
Launch build_block_transpose(const std::string& op, DataType dt, int64_t np, int64_t nq,
                             int64_t nr, int64_t ri, int64_t qo, const ChipConfig& cfg) {
  const int esize = data_type_bytes(dt);
  const int64_t kb = kSide * esize / kBlock;  // 32-byte blocks per 16 elements (1 or 2)
  const int64_t blk = kSide * kSide * esize;  // bytes of one 16x16 block
  KernelBuilder b(fmt::format("Transpose_{}_blocks", data_type_name(dt)), op, cfg);
  const isa::CoreKind kind = b.vector_core_kind();
  const CoreKindConfig& core = *cfg.core_kind(kind);
  const int64_t side = esize == 2 ? 128 : 64;
  const int64_t tq = std::min(side, (nq + kSide - 1) / kSide * kSide);
  const int64_t tr = std::min(side, (nr + kSide - 1) / kSide * kSide);
  const int64_t nqb = tq / kSide, nrb = tr / kSide, nblocks = nqb * nrb;
  const int64_t tiles_q = (nq + tq - 1) / tq, tiles_r = (nr + tr - 1) / tr;
  const int64_t tiles = np * tiles_q * tiles_r;
  const int block_dim = static_cast<int>(std::min<int64_t>(core.count, tiles));
  const uint64_t tile_bytes = static_cast<uint64_t>(tq * tr * esize);
  b.begin_section(kind);
  uint64_t sb[2], ob[2], zb = 0;
  for (int q = 0; q < 2; ++q) {
    sb[q] = b.alloc(Buf::UB, tile_bytes, fmt::format("input blocks {}", q));
    ob[q] = b.alloc(Buf::UB, tile_bytes, fmt::format("output blocks {}", q));
  }
  if (esize == 4) zb = b.alloc(Buf::UB, tile_bytes, "permuted blocks");
  b.declare_arg("in0", device_dtype(dt), {np, nq, ri});
  b.declare_arg("out", device_dtype(dt), {np, nr, qo});
  FlagPair s_ready = b.flag_pair(Pipe::MTE2, Pipe::V, "input blocks loaded");
  FlagPair s_free = b.flag_pair(Pipe::V, Pipe::MTE2, "input blocks free");
  FlagPair o_ready = b.flag_pair(Pipe::V, Pipe::MTE3, "output blocks transposed");
  FlagPair o_free = b.flag_pair(Pipe::MTE3, Pipe::V, "output blocks stored");
  for (int q = 0; q < 2; ++q) {
    b.set_flag(s_free, q);
    b.set_flag(o_free, q);
  }
  // Input rows whole blocks apart (and within the copy's gap field): one copy per r block.
  const int64_t max_gap = static_cast<int64_t>(isa::field_imm_max(isa::FieldKind::RU16));
  const bool rows_by_block = ri * esize % kBlock == 0 && ri * esize / kBlock <= max_gap;
  if (qo * esize / kBlock > max_gap + kb)
    b.fail(fmt::format("output rows of {} elements exceed the copy gap field", qo));
  Reg t = b.reg("tile"), step = b.reg("block count");
  b.emit(Opcode::op_get_block_id, {t});
  b.emit(Opcode::op_get_block_num, {step});
  Label loop = b.label("tile_loop"), drain = b.label("drain");
  b.bind(loop);
  for (int q = 0; q < 2; ++q) {
    KernelBuilder::Origin o(b, fmt::format("tile ({})", q ? "pong" : "ping"));
    b.branch(ge(t, tiles), drain);
    Reg p = b.reg("p"), q0 = b.reg("first q"), r0 = b.reg("first r"), vq = b.reg("valid q"),
        vr = b.reg("valid r");
    b.div(p, t, tiles_q * tiles_r);
    b.rem(q0, t, tiles_q * tiles_r);
    b.rem(r0, q0, tiles_r);
    b.div(q0, q0, tiles_r);
    b.mul(q0, q0, tq);
    b.mul(r0, r0, tr);
    b.movi(vq, nq);
    b.sub(vq, vq, q0);
    b.min(vq, vq, tq);
    b.movi(vr, nr);
    b.sub(vr, vr, r0);
    b.min(vr, vr, tr);
    {
      KernelBuilder::Origin lo(b, "load the q rows into 16x16 blocks");
      Reg src = b.reg("source"), dst = b.reg("staging"), n = b.reg("blocks"),
          last = b.reg("blocks of the last r block"), full = b.reg("full r blocks"),
          i = b.reg("row / r block");
      b.wait_flag(s_free, q);
      // blocks of the valid r: `full` whole 16-element groups, then `last` blocks.
      b.mul(n, vr, esize);
      b.add(n, n, kBlock - 1);
      b.shr(n, n, 5, "32-byte blocks of valid r");
      b.div(full, n, kb);
      b.rem(last, n, kb);
      Reg in = b.load_arg("in0");
      b.mul(src, p, nq);
      b.add(src, src, q0);
      b.mul(src, src, ri);
      b.add(src, src, r0);
      b.mul(src, src, esize);
      b.add(src, src, in, "element (p, q0, r0)");
      if (rows_by_block) {
        // One copy per r block: vq rows, each kb blocks (or `last`), ri * esize bytes apart.
        b.movi(dst, static_cast<int64_t>(sb[q]));
        b.for_range(i, 0, full, 1, [&] {
          b.emit(Opcode::op_copy_gm2ub, {dst, src, vq, kb, ri * esize / kBlock - kb, 0});
          b.add(src, src, kSide * esize);
          b.add(dst, dst, nqb * blk);
        });
        b.if_(ne(last, 0), [&] {
          Reg g = b.reg("gaps");
          b.movi(g, ri * esize / kBlock);
          b.sub(g, g, last);
          Reg dg = b.reg("staging gap");
          b.movi(dg, kb);
          b.sub(dg, dg, last);
          b.emit(Opcode::op_copy_gm2ub, {dst, src, vq, last, g, dg});
        });
      } else {
        // One copy per q row: its r blocks go nqb blocks of 16 rows apart.
        Reg d0 = b.reg("staging row"), s0 = b.reg("row source");
        b.for_range(i, 0, vq, 1, [&] {
          // row i lands at (i / 16) * blk + (i % 16) * 16 * esize in every r block.
          b.div(d0, i, kSide);
          b.mul(d0, d0, blk);
          b.rem(dst, i, kSide);
          b.mul(dst, dst, kSide * esize);
          b.add(dst, dst, d0);
          b.add(dst, dst, static_cast<int64_t>(sb[q]));
          b.mul(s0, i, ri * esize);
          b.add(s0, s0, src);
          b.if_(ne(full, 0), [&] {
            b.emit(Opcode::op_copy_gm2ub, {dst, s0, full, kb, 0, nqb * blk / kBlock - kb});
          });
          b.if_(ne(last, 0), [&] {
            b.mul(d0, full, nqb * blk);
            b.add(dst, dst, d0);
            b.mul(d0, full, kSide * esize);
            b.add(s0, s0, d0);
            b.emit(Opcode::op_copy_gm2ub, {dst, s0, 1, last, 0, 0});
          });
        });
      }
      b.set_flag(s_ready, q);
    }
    b.wait_flag(s_ready, q);
    b.wait_flag(o_free, q);
    {
      KernelBuilder::Origin to(b, "transpose the 16x16 blocks");
      // Block (rb, qb) of the staging -> block (qb, rb) of the output.
      auto in_block = [&](uint64_t base, int64_t rb, int64_t qb) {
        return static_cast<int64_t>(base) + (rb * nqb + qb) * blk;
      };
      auto out_block = [&](uint64_t base, int64_t rb, int64_t qb) {
        return static_cast<int64_t>(base) + (qb * nrb + rb) * blk;
      };
      if (esize == 2) {
        for (int64_t rb = 0; rb < nrb; ++rb)
          for (int64_t qb = 0; qb < nqb; ++qb)
            b.emit(Opcode::op_vtranspose, {out_block(ob[q], rb, qb), in_block(sb[q], rb, qb)});
      } else {
        // A 16x16 block of 4-byte elements is 1024 bytes: lanes of 16 bits, u16 offset
        // q*32 + r*2 + h (h: which half of the element) = bits [q3 | q2 q1 q0 r3 | r2 r1 r0 h]
        // (matrix | row | lane of the two 512-byte matrices). vtranspose swaps row and lane
        // bits; the permutation P (block b of the pair -> (b & 1) * 16 + (b & 14) + b / 16)
        // swaps the matrix bit with the lowest row bit. T P T P T maps the bits to
        // [r3 | r2 r1 r0 q3 | q2 q1 q0 h]: the block transposed, row-major 16 r x 16 q.
        auto transpose_all = [&](uint64_t base) {
          for (int64_t rb = 0; rb < nrb; ++rb)
            for (int64_t qb = 0; qb < nqb; ++qb) {
              const int64_t a = in_block(base, rb, qb);
              b.emit(Opcode::op_vtranspose, {a, a});
              b.emit(Opcode::op_vtranspose, {a + blk / 2, a + blk / 2});
            }
        };
        auto permute = [&](uint64_t dst, uint64_t src) {
          // Four copies of every other block, over all blocks (repeat stride: one block pair).
          Reg cnt = b.reg_imm("lanes", nblocks * 128);
          b.emit(Opcode::op_set_mask_count, {cnt});
          const int64_t rep = blk / kBlock;
          const int64_t moves[4][2] = {{0, 0}, {17, 17}, {16, 1}, {1, 16}};  // {dst, src} block
          for (const auto& mv : moves)
            b.emit(Opcode::op_vcopy, {Dtype::U16, static_cast<int64_t>(dst) + mv[0] * kBlock,
                                      static_cast<int64_t>(src) + mv[1] * kBlock, 0, 2, 2, rep,
                                      rep});
        };
        transpose_all(sb[q]);
        permute(zb, sb[q]);
        transpose_all(zb);
        permute(sb[q], zb);
        for (int64_t rb = 0; rb < nrb; ++rb)
          for (int64_t qb = 0; qb < nqb; ++qb) {
            const int64_t a = in_block(sb[q], rb, qb), d = out_block(ob[q], rb, qb);
            b.emit(Opcode::op_vtranspose, {d, a});
            b.emit(Opcode::op_vtranspose, {d + blk / 2, a + blk / 2});
          }
      }
      b.set_flag(s_free, q);
      b.set_flag(o_ready, q);
    }
    b.wait_flag(o_ready, q);
    {
      KernelBuilder::Origin so(b, "store the r rows, one copy per q block");
      Reg dst = b.reg("destination"), src = b.reg("output staging"), n = b.reg("blocks"),
          i = b.reg("q block"), full = b.reg("full q blocks"), last = b.reg("blocks of the last");
      Reg out = b.load_arg("out");
      b.mul(n, vq, esize);
      b.add(n, n, kBlock - 1);
      b.shr(n, n, 5);
      b.div(full, n, kb);
      b.rem(last, n, kb);
      b.mul(dst, p, nr);
      b.add(dst, dst, r0);
      b.mul(dst, dst, qo);
      b.add(dst, dst, q0);
      b.mul(dst, dst, esize);
      b.add(dst, dst, out, "element (p, r0, q0)");
      b.movi(src, static_cast<int64_t>(ob[q]));
      const int64_t row_blocks = qo * esize / kBlock;
      b.for_range(i, 0, full, 1, [&] {
        b.emit(Opcode::op_copy_ub2gm, {dst, src, vr, kb, 0, row_blocks - kb});
        b.add(dst, dst, kSide * esize);
        b.add(src, src, nrb * blk);
      });
      b.if_(ne(last, 0), [&] {
        Reg g = b.reg("gaps");
        b.movi(g, row_blocks);
        b.sub(g, g, last);
        Reg sg = b.reg("staging gap");
        b.movi(sg, kb);
        b.sub(sg, sg, last);
        b.emit(Opcode::op_copy_ub2gm, {dst, src, vr, last, sg, g});
      });
    }
    b.set_flag(o_free, q);
    b.add(t, t, step);
  }
  b.jmp(loop);
  b.bind(drain);
  for (int q = 0; q < 2; ++q) {
    b.wait_flag(s_free, q);
    b.wait_flag(o_free, q);
  }
  b.end();
  Launch l;
  l.kernel = b.finish();
  l.block_dim = block_dim;
  l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  l.summary = fmt::format("{}: [{}, {}, {}] -> [{}, {}, {}] (rows {} / {} apart), tiles {}x{} ({} "
                          "over {} blocks), vtranspose",
                          l.kernel.program.name, np, nq, nr, np, nr, nq, ri, qo, tq, tr, tiles,
                          block_dim);
  return l;
}

// The copy out = view(in) (dims over the output, source strides) as one assembly launch.
void append_view(LaunchPlan& plan, const std::string& op, const ChipConfig& cfg, DataType dtype,
                 const std::vector<int64_t>& in_shape, const std::vector<int64_t>& out_shape,
                 const StridedView& v, ArgRef in, ArgRef out, const std::string& what) {
  const std::string name = fmt::format("Transpose_{}", data_type_name(dtype));
  AssembleSpec spec = view_spec(name, dtype, in_shape, out_shape, v);
  plan.add(build_assemble_kernel(op, spec, cfg), {in, out}, what);
}

}  // namespace

void append_transpose(LaunchPlan& plan, const std::string& op, const ChipConfig& cfg,
                      DataType dtype, const std::vector<int64_t>& in_shape,
                      const std::vector<int64_t>& perm, ArgRef in, ArgRef out) {
  int64_t n = 1;
  for (int64_t d : in_shape) n *= d;
  if (n == 0) return;
  const std::vector<int64_t> out_shape = permuted_shape(in_shape, perm);
  const ReducedPerm r = reduce(in_shape, perm);
  const size_t rank = r.perm.size();
  const std::vector<int64_t> strides = contiguous_strides(r.in_shape);
  auto view_of = [&](const std::vector<int64_t>& order) {
    StridedView v;
    for (int64_t p : order) {
      v.dims.push_back(r.in_shape[static_cast<size_t>(p)]);
      v.strides.push_back(strides[static_cast<size_t>(p)]);
    }
    return v;
  };
  const std::string what = fmt::format("transpose {} perm {}", shape_str(r.in_shape),
                                       shape_str(r.perm));
  if (rank == 0) {  // one element
    append_view(plan, op, cfg, dtype, in_shape, out_shape, StridedView{{1}, {1}, 0}, in, out, what);
    return;
  }
  const int esize = data_type_bytes(dtype);
  const int64_t last = static_cast<int64_t>(rank) - 1;
  const bool inner_kept = r.perm.back() == last;
  // The inner-moved fast path: output = [P-group, R-group, Q-group] with the R group ending
  // with the input's last dim (position j of the output) and the Q group after it.
  size_t j = 0;
  while (j < rank && r.perm[j] != last) ++j;
  int64_t qsize = 1;
  for (size_t i = j + 1; i < rank; ++i) qsize *= r.in_shape[static_cast<size_t>(r.perm[i])];
  if (!inner_kept && esize == 1 && block_transpose_applies(DataType::U16, qsize)) {
    // 1-byte elements: widened to u16 (vconv), transposed as 2-byte, narrowed back (values
    // below 256 convert exactly both ways).
    const uint64_t wide = static_cast<uint64_t>(n) * 2;
    const ArgRef w_in = plan.workspace(wide), w_out = plan.workspace(wide);
    const DataType u8 = DataType::U8;
    plan.add(build_stream_kernel(op, cast_spec(u8, DataType::U16, false, in_shape), cfg),
             {in, w_in}, what + ": widen to u16");
    append_transpose(plan, op, cfg, DataType::U16, in_shape, perm, w_in, w_out);
    plan.add(build_stream_kernel(op, cast_spec(DataType::U16, u8, false, out_shape), cfg),
             {w_out, out}, what + ": narrow to 8 bits");
    return;
  }
  if (inner_kept || !block_transpose_applies(dtype, qsize)) {
    append_view(plan, op, cfg, dtype, in_shape, out_shape, view_of(r.perm), in, out, what);
    return;
  }
  // Choose the R group p_m..p_j: prefer one that leaves the input in [P, Q, R] order already.
  size_t m = j;
  for (size_t c = 0; c <= j; ++c) {
    std::vector<int64_t> x(r.perm.begin(), r.perm.begin() + static_cast<std::ptrdiff_t>(c));
    x.insert(x.end(), r.perm.begin() + static_cast<std::ptrdiff_t>(j) + 1, r.perm.end());
    x.insert(x.end(), r.perm.begin() + static_cast<std::ptrdiff_t>(c),
             r.perm.begin() + static_cast<std::ptrdiff_t>(j) + 1);
    bool identity = true;
    for (size_t i = 0; i < x.size(); ++i) identity = identity && x[i] == static_cast<int64_t>(i);
    if (identity) {
      m = c;
      break;
    }
  }
  std::vector<int64_t> x_order(r.perm.begin(), r.perm.begin() + static_cast<std::ptrdiff_t>(m));
  x_order.insert(x_order.end(), r.perm.begin() + static_cast<std::ptrdiff_t>(j) + 1, r.perm.end());
  x_order.insert(x_order.end(), r.perm.begin() + static_cast<std::ptrdiff_t>(m),
                 r.perm.begin() + static_cast<std::ptrdiff_t>(j) + 1);
  int64_t np = 1, nr = 1;
  for (size_t i = 0; i < m; ++i) np *= r.in_shape[static_cast<size_t>(r.perm[i])];
  for (size_t i = m; i <= j; ++i) nr *= r.in_shape[static_cast<size_t>(r.perm[i])];
  const int64_t nq = qsize;
  ArgRef x = in;
  bool x_identity = true;
  for (size_t i = 0; i < x_order.size(); ++i)
    x_identity = x_identity && x_order[i] == static_cast<int64_t>(i);
  if (!x_identity) {
    x = plan.workspace(static_cast<uint64_t>(n) * static_cast<uint64_t>(esize));
    append_view(plan, op, cfg, dtype, in_shape, {np, nq, nr}, view_of(x_order), in, x,
                what + ": to [P, Q, R]");
  }
  append_block_transpose(plan, op, cfg, dtype, np, nq, nr, nr, x, out, what);
}

bool block_transpose_applies(DataType dtype, int64_t nq) {
  const int esize = data_type_bytes(dtype);
  if (esize != 2 && esize != 4) return false;
  const int64_t epb = kBlock / esize;
  // Output rows of at least two blocks, and not so long that the store's gap field overflows.
  const int64_t max_gap = static_cast<int64_t>(isa::field_imm_max(isa::FieldKind::RU16));
  return nq >= 2 * epb && (nq + epb - 1) / epb <= max_gap;
}

void append_block_transpose(LaunchPlan& plan, const std::string& op, const ChipConfig& cfg,
                            DataType dtype, int64_t np, int64_t nq, int64_t nr, int64_t ri,
                            ArgRef in, ArgRef out, const std::string& what, int64_t qo) {
  const int esize = data_type_bytes(dtype);
  const int64_t epb = kBlock / esize;
  if (qo == 0) qo = nq;
  const int64_t pitch = (qo + epb - 1) / epb * epb;  // the transposer's rows: whole blocks
  if (pitch == qo) {
    plan.add(build_block_transpose(op, dtype, np, nq, nr, ri, qo, cfg), {in, out}, what);
    return;
  }
  const ArgRef padded =
      plan.workspace(static_cast<uint64_t>(np * nr * pitch) * static_cast<uint64_t>(esize));
  plan.add(build_block_transpose(op, dtype, np, nq, nr, ri, pitch, cfg), {in, padded}, what);
  append_view(plan, op, cfg, dtype, {np, nr, pitch}, {np, nr, qo},
              StridedView{{np * nr, nq}, {pitch, 1}, 0}, padded, out,
              what + ": drop the row padding");
}

}  // namespace npusim::compiler::ops
