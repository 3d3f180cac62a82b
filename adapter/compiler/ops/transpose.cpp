// Transpose strategies, after dropping size-1 dims and merging input dims that stay adjacent
// and in order (so [B,S,H,D] -> [B,H,S,D] is 4-d, [N,H,W,C] -> [N,C,H,W] is [N,HW,C] -> [N,C,HW]):
//   inner dim kept (the last output dim is the last input dim), rows of whole 32-byte blocks:
//     MTE copies alone (RowCopy below: strided bursts in, strided bursts out, no vector pass).
//   inner dim kept, 2- and 4-byte rows of at least one block that are not whole blocks: the
//     row gather (RowGather below: one copy_gm2ub per row into even / odd row buffers, one
//     vsel and one store per tile); it also drops the block transposer's row padding.
//   inner dim kept, other rows: one assembly launch whose rows are runs of the inner dim
//     (assemble.h: whole blocks loaded straight into the output tile, partial blocks through a
//     scratch buffer and an exact vcopy).
//   inner dim moved, 2- and 4-byte elements, output rows of at least two 32-byte blocks or
//     exactly one: as [P, Q, R] -> [P, R, Q] (a batched 2-d transpose; a keep-inner copy first
//     when the input is not in that order) by the block transposer below: 16x16 element blocks
//     transposed in the UB with vtranspose (2-byte: one per block; 4-byte: vtranspose works on
//     16-bit lanes, so a 16x16 f32 block, two 512-byte matrices, takes three vtranspose passes
//     with a block permutation (vcopy with block strides) between them, see
//     build_block_transpose). When an output row (Q elements) is not whole 32-byte blocks, the
//     transposer writes rows padded to whole blocks into the workspace and a copy kernel drops the
//     padding (GM is byte addressed, the UB is not: only an MTE round trip shifts data by less
//     than a block).
//   1-byte elements, same shapes: widened to u16 by a vconv launch, transposed as 2-byte,
//     narrowed back.
//   otherwise (8-byte elements, short output rows): element by element (ld + one-lane vdup per
//     element, assemble.h).
#include "adapter/compiler/ops/transpose.h"

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string_view>

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

// The tile loop of both kernels here: tiles t = block id, + block count, ... in ping/pong pairs;
// tile(q, t, step, drain) emits one tile of parity q and branches to drain once t is past the
// last tile. The caller emits the drain's waits after it.
void emit_round_robin_tiles(
    KernelBuilder& b,
    const std::function<void(int, const Reg&, const Reg&, const Label&)>& tile) {
  Reg t = b.reg("tile"), step = b.reg("block count");
  b.emit(Opcode::op_get_block_id, {t});
  b.emit(Opcode::op_get_block_num, {step});
  Label loop = b.label("tile_loop"), drain = b.label("drain");
  b.bind(loop);
  for (int q = 0; q < 2; ++q) tile(q, t, step, drain);
  b.jmp(loop);
  b.bind(drain);
}

// The launch of b's kernel (finished here) on block_dim blocks, arguments in0 and out.
Launch in_out_launch(KernelBuilder& b, int block_dim) {
  Launch l;
  l.kernel = b.finish();
  l.block_dim = block_dim;
  l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  return l;
}

namespace {

// The coordinates of one tile: item p, its first q and r, and how many of its q and r are valid.
struct TileRegs {
  explicit TileRegs(KernelBuilder& b)
      : p(b.reg("p")),
        q0(b.reg("first q")),
        r0(b.reg("first r")),
        vq(b.reg("valid q")),
        vr(b.reg("valid r")) {}
  Reg p, q0, r0, vq, vr;
};

// Emits build_block_transpose's kernel: the tile geometry and buffers first, then each tile's
// steps (coordinates, load, transpose, store) in program order.
class BlockTranspose {
 public:
  BlockTranspose(const std::string& op, DataType dt, int64_t np, int64_t nq, int64_t nr, int64_t ri,
                 int64_t qo, const ChipConfig& cfg);
  Launch build();

 private:
  void allocate();
  void init_flags();
  void emit_tile(int q, const Reg& t, const Reg& step, const Label& drain);
  void tile_coordinates(const Reg& t, const TileRegs& r);
  void load_tile(int q, const TileRegs& r);
  void load_by_block(int q, const Reg& src, const Reg& dst, const Reg& full, const Reg& last,
                     const Reg& i, const TileRegs& r);
  void load_by_row(int q, const Reg& src, const Reg& dst, const Reg& full, const Reg& last,
                   const Reg& i, const TileRegs& r);
  void transpose_tile(int q);
  void transpose_wide_blocks(int q);
  void store_tile(int q, const TileRegs& r);
  void element_address(const Reg& addr, const Reg& base, const Reg& p, int64_t rows, const Reg& row,
                       int64_t pitch, const Reg& col, const char* what);
  void column_blocks(const Reg& valid, const Reg& n, const Reg& full, const Reg& last);
  void copy_columns(bool to_ub, const Reg& gm, const Reg& ub, const Reg& rows, const Reg& full,
                    const Reg& last, const Reg& i, int64_t gm_row_blocks, int64_t ub_column);
  // Block (rb, qb) of the input staging at base, and block (qb, rb) of the output staging.
  int64_t in_block(uint64_t base, int64_t rb, int64_t qb) const {
    return static_cast<int64_t>(base) + (rb * m_nqb + qb) * m_blk;
  }
  int64_t out_block(uint64_t base, int64_t rb, int64_t qb) const {
    return static_cast<int64_t>(base) + (qb * m_nrb + rb) * m_blk;
  }

  KernelBuilder m_b;
  const DataType m_dt;
  const int64_t m_np, m_nq, m_nr, m_ri, m_qo;
  const int m_esize;
  const int64_t m_kb;   // 32-byte blocks per 16 elements (1 or 2)
  const int64_t m_blk;  // bytes of one 16x16 block
  isa::CoreKind m_kind;
  int64_t m_tq = 0, m_tr = 0;    // tile sides (multiples of 16)
  int64_t m_nqb = 0, m_nrb = 0;  // 16x16 blocks of a tile along q and r
  int64_t m_tiles_q = 0, m_tiles_r = 0, m_tiles = 0;
  int m_block_dim = 0;
  uint64_t m_sb[2] = {0, 0}, m_ob[2] = {0, 0};  // input and output staging (ping / pong)
  uint64_t m_zb = 0;                            // 4-byte elements: the permuted blocks
  FlagPair m_s_ready, m_s_free, m_o_ready, m_o_free;
  bool m_rows_by_block = false;  // input rows whole blocks apart: one copy per r block
};

BlockTranspose::BlockTranspose(const std::string& op, DataType dt, int64_t np, int64_t nq,
                               int64_t nr, int64_t ri, int64_t qo, const ChipConfig& cfg)
    : m_b(fmt::format("Transpose_{}_blocks", data_type_name(dt)), op, cfg),
      m_dt(dt),
      m_np(np),
      m_nq(nq),
      m_nr(nr),
      m_ri(ri),
      m_qo(qo),
      m_esize(data_type_bytes(dt)),
      m_kb(kSide * m_esize / kBlock),
      m_blk(kSide * kSide * m_esize),
      m_kind(m_b.vector_core_kind()) {
  const CoreKindConfig& core = *cfg.core_kind(m_kind);
  const int64_t side = m_esize == 2 ? 128 : 64;
  m_tq = std::min(side, (nq + kSide - 1) / kSide * kSide);
  m_tr = std::min(side, (nr + kSide - 1) / kSide * kSide);
  m_nqb = m_tq / kSide;
  m_nrb = m_tr / kSide;
  m_tiles_q = (nq + m_tq - 1) / m_tq;
  m_tiles_r = (nr + m_tr - 1) / m_tr;
  m_tiles = np * m_tiles_q * m_tiles_r;
  m_block_dim = static_cast<int>(std::min<int64_t>(core.count, m_tiles));
}

void BlockTranspose::allocate() {
  const uint64_t tile_bytes = static_cast<uint64_t>(m_tq * m_tr * m_esize);
  for (int q = 0; q < 2; ++q) {
    m_sb[q] = m_b.alloc(Buf::UB, tile_bytes, fmt::format("input blocks {}", q));
    m_ob[q] = m_b.alloc(Buf::UB, tile_bytes, fmt::format("output blocks {}", q));
  }
  if (m_esize == 4) m_zb = m_b.alloc(Buf::UB, tile_bytes, "permuted blocks");
}

void BlockTranspose::init_flags() {
  m_s_ready = m_b.flag_pair(Pipe::MTE2, Pipe::V, "input blocks loaded");
  m_s_free = m_b.flag_pair(Pipe::V, Pipe::MTE2, "input blocks free");
  m_o_ready = m_b.flag_pair(Pipe::V, Pipe::MTE3, "output blocks transposed");
  m_o_free = m_b.flag_pair(Pipe::MTE3, Pipe::V, "output blocks stored");
  for (int q = 0; q < 2; ++q) {
    m_b.set_flag(m_s_free, q);
    m_b.set_flag(m_o_free, q);
  }
}

Launch BlockTranspose::build() {
  KernelBuilder& b = m_b;
  b.begin_section(m_kind);
  allocate();
  b.declare_arg("in0", device_dtype(m_dt), {m_np, m_nq, m_ri});
  b.declare_arg("out", device_dtype(m_dt), {m_np, m_nr, m_qo});
  init_flags();
  // Input rows whole blocks apart (and within the copy's gap field): one copy per r block.
  const int64_t max_gap = static_cast<int64_t>(isa::field_imm_max(isa::FieldKind::RU16));
  m_rows_by_block = m_ri * m_esize % kBlock == 0 && m_ri * m_esize / kBlock <= max_gap;
  if (m_qo * m_esize / kBlock > max_gap + m_kb)
    b.fail(fmt::format("output rows of {} elements exceed the copy gap field", m_qo));
  emit_round_robin_tiles(b, [&](int q, const Reg& t, const Reg& step, const Label& drain) {
    emit_tile(q, t, step, drain);
  });
  for (int q = 0; q < 2; ++q) {
    b.wait_flag(m_s_free, q);
    b.wait_flag(m_o_free, q);
  }
  b.end();
  Launch l = in_out_launch(b, m_block_dim);
  l.summary = fmt::format(
      "{}: [{}, {}, {}] -> [{}, {}, {}] (rows {} / {} apart), tiles {}x{} ({} "
      "over {} blocks), vtranspose",
      l.kernel.program.name, m_np, m_nq, m_nr, m_np, m_nr, m_nq, m_ri, m_qo, m_tq, m_tr, m_tiles,
      m_block_dim);
  return l;
}

// Tile t (of parity q): load, transpose, store, then t += the block count.
void BlockTranspose::emit_tile(int q, const Reg& t, const Reg& step, const Label& drain) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, fmt::format("tile ({})", q ? "pong" : "ping"));
  b.branch(ge(t, m_tiles), drain);
  TileRegs r(b);
  tile_coordinates(t, r);
  load_tile(q, r);
  b.wait_flag(m_s_ready, q);
  b.wait_flag(m_o_free, q);
  transpose_tile(q);
  b.wait_flag(m_o_ready, q);
  store_tile(q, r);
  b.set_flag(m_o_free, q);
  b.add(t, t, step);
}

void BlockTranspose::tile_coordinates(const Reg& t, const TileRegs& r) {
  KernelBuilder& b = m_b;
  b.div(r.p, t, m_tiles_q * m_tiles_r);
  b.rem(r.q0, t, m_tiles_q * m_tiles_r);
  b.rem(r.r0, r.q0, m_tiles_r);
  b.div(r.q0, r.q0, m_tiles_r);
  b.mul(r.q0, r.q0, m_tq);
  b.mul(r.r0, r.r0, m_tr);
  b.movi(r.vq, m_nq);
  b.sub(r.vq, r.vq, r.q0);
  b.min(r.vq, r.vq, m_tq);
  b.movi(r.vr, m_nr);
  b.sub(r.vr, r.vr, r.r0);
  b.min(r.vr, r.vr, m_tr);
}

// MTE2: the tile's q rows into the input staging, laid out as 16x16 blocks.
void BlockTranspose::load_tile(int q, const TileRegs& r) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin lo(b, "load the q rows into 16x16 blocks");
  Reg src = b.reg("source"), dst = b.reg("staging"), n = b.reg("blocks"),
      last = b.reg("blocks of the last r block"), full = b.reg("full r blocks"),
      i = b.reg("row / r block");
  b.wait_flag(m_s_free, q);
  column_blocks(r.vr, n, full, last);
  Reg in = b.load_arg("in0");
  element_address(src, in, r.p, m_nq, r.q0, m_ri, r.r0, "element (p, q0, r0)");
  if (m_rows_by_block)
    load_by_block(q, src, dst, full, last, i, r);
  else
    load_by_row(q, src, dst, full, last, i, r);
  b.set_flag(m_s_ready, q);
}

// One copy per r block: vq rows, each kb blocks (or `last`), ri * esize bytes apart.
void BlockTranspose::load_by_block(int q, const Reg& src, const Reg& dst, const Reg& full,
                                   const Reg& last, const Reg& i, const TileRegs& r) {
  KernelBuilder& b = m_b;
  const int64_t row_blocks = m_ri * m_esize / kBlock;
  b.movi(dst, static_cast<int64_t>(m_sb[q]));
  copy_columns(true, src, dst, r.vq, full, last, i, row_blocks, m_nqb * m_blk);
}

// One copy per q row: its r blocks go nqb blocks of 16 rows apart.
void BlockTranspose::load_by_row(int q, const Reg& src, const Reg& dst, const Reg& full,
                                 const Reg& last, const Reg& i, const TileRegs& r) {
  KernelBuilder& b = m_b;
  const int64_t esize = m_esize;
  Reg d0 = b.reg("staging row"), s0 = b.reg("row source");
  b.for_range(i, 0, r.vq, 1, [&] {
    // row i lands at (i / 16) * blk + (i % 16) * 16 * esize in every r block.
    b.div(d0, i, kSide);
    b.mul(d0, d0, m_blk);
    b.rem(dst, i, kSide);
    b.mul(dst, dst, kSide * esize);
    b.add(dst, dst, d0);
    b.add(dst, dst, static_cast<int64_t>(m_sb[q]));
    b.mul(s0, i, m_ri * esize);
    b.add(s0, s0, src);
    b.if_(ne(full, 0), [&] {
      b.emit(Opcode::op_copy_gm2ub, {dst, s0, full, m_kb, 0, m_nqb * m_blk / kBlock - m_kb});
    });
    b.if_(ne(last, 0), [&] {
      b.mul(d0, full, m_nqb * m_blk);
      b.add(dst, dst, d0);
      b.mul(d0, full, kSide * esize);
      b.add(s0, s0, d0);
      b.emit(Opcode::op_copy_gm2ub, {dst, s0, 1, last, 0, 0});
    });
  });
}

// V: block (rb, qb) of the input staging -> block (qb, rb) of the output staging.
void BlockTranspose::transpose_tile(int q) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin to(b, "transpose the 16x16 blocks");
  if (m_esize == 2) {
    for (int64_t rb = 0; rb < m_nrb; ++rb)
      for (int64_t qb = 0; qb < m_nqb; ++qb)
        b.emit(Opcode::op_vtranspose, {out_block(m_ob[q], rb, qb), in_block(m_sb[q], rb, qb)});
  } else {
    transpose_wide_blocks(q);
  }
  b.set_flag(m_s_free, q);
  b.set_flag(m_o_ready, q);
}

// A 16x16 block of 4-byte elements is 1024 bytes: lanes of 16 bits, u16 offset
// q*32 + r*2 + h (h: which half of the element) = bits [q3 | q2 q1 q0 r3 | r2 r1 r0 h]
// (matrix | row | lane of the two 512-byte matrices). vtranspose swaps row and lane
// bits; the permutation P (block b of the pair -> (b & 1) * 16 + (b & 14) + b / 16)
// swaps the matrix bit with the lowest row bit. T P T P T maps the bits to
// [r3 | r2 r1 r0 q3 | q2 q1 q0 h]: the block transposed, row-major 16 r x 16 q.
void BlockTranspose::transpose_wide_blocks(int q) {
  KernelBuilder& b = m_b;
  const int64_t blk = m_blk;
  auto transpose_all = [&](uint64_t base) {
    for (int64_t rb = 0; rb < m_nrb; ++rb)
      for (int64_t qb = 0; qb < m_nqb; ++qb) {
        const int64_t a = in_block(base, rb, qb);
        b.emit(Opcode::op_vtranspose, {a, a});
        b.emit(Opcode::op_vtranspose, {a + blk / 2, a + blk / 2});
      }
  };
  auto permute = [&](uint64_t dst, uint64_t src) {
    // Four copies of every other block, over all blocks (repeat stride: one block pair).
    Reg cnt = b.reg_imm("lanes", m_nqb * m_nrb * 128);
    b.emit(Opcode::op_set_mask_count, {cnt});
    const int64_t rep = blk / kBlock;
    const int64_t moves[4][2] = {{0, 0}, {17, 17}, {16, 1}, {1, 16}};  // {dst, src} block
    for (const auto& mv : moves)
      b.emit(Opcode::op_vcopy, {Dtype::U16, static_cast<int64_t>(dst) + mv[0] * kBlock,
                                static_cast<int64_t>(src) + mv[1] * kBlock, 0, 2, 2, rep, rep});
  };
  transpose_all(m_sb[q]);
  permute(m_zb, m_sb[q]);
  transpose_all(m_zb);
  permute(m_sb[q], m_zb);
  for (int64_t rb = 0; rb < m_nrb; ++rb)
    for (int64_t qb = 0; qb < m_nqb; ++qb) {
      const int64_t a = in_block(m_sb[q], rb, qb), d = out_block(m_ob[q], rb, qb);
      b.emit(Opcode::op_vtranspose, {d, a});
      b.emit(Opcode::op_vtranspose, {d + blk / 2, a + blk / 2});
    }
}

// MTE3: the tile's r rows, one copy per q block.
void BlockTranspose::store_tile(int q, const TileRegs& r) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin so(b, "store the r rows, one copy per q block");
  const int64_t esize = m_esize;
  Reg dst = b.reg("destination"), src = b.reg("output staging"), n = b.reg("blocks"),
      i = b.reg("q block"), full = b.reg("full q blocks"), last = b.reg("blocks of the last");
  Reg out = b.load_arg("out");
  column_blocks(r.vq, n, full, last);
  element_address(dst, out, r.p, m_nr, r.r0, m_qo, r.q0, "element (p, r0, q0)");
  b.movi(src, static_cast<int64_t>(m_ob[q]));
  copy_columns(false, dst, src, r.vr, full, last, i, m_qo * esize / kBlock, m_nrb * m_blk);
}

// addr = base + ((p * rows + row) * pitch + col) * esize: the element (p, row, col) of a tensor
// of `rows` rows `pitch` elements apart per item.
void BlockTranspose::element_address(const Reg& addr, const Reg& base, const Reg& p, int64_t rows,
                                     const Reg& row, int64_t pitch, const Reg& col,
                                     const char* what) {
  KernelBuilder& b = m_b;
  b.mul(addr, p, rows);
  b.add(addr, addr, row);
  b.mul(addr, addr, pitch);
  b.add(addr, addr, col);
  b.mul(addr, addr, m_esize);
  b.add(addr, addr, base, what);
}

// The 32-byte blocks of `valid` elements (n): `full` whole 16-element columns, then `last` blocks.
void BlockTranspose::column_blocks(const Reg& valid, const Reg& n, const Reg& full,
                                   const Reg& last) {
  KernelBuilder& b = m_b;
  b.mul(n, valid, m_esize);
  b.add(n, n, kBlock - 1);
  b.shr(n, n, 5, "32-byte blocks");
  b.div(full, n, m_kb);
  b.rem(last, n, m_kb);
}

// MTE copies of `rows` rows between GM and a staging buffer, one per 16-element column of the
// rows: `full` columns of kb blocks, then (last != 0) one of `last` blocks. GM rows are
// gm_row_blocks blocks apart, staging rows kb; per column gm advances 16 elements, ub
// ub_column bytes. to_ub: GM -> staging (copy_gm2ub), else staging -> GM (copy_ub2gm).
void BlockTranspose::copy_columns(bool to_ub, const Reg& gm, const Reg& ub, const Reg& rows,
                                  const Reg& full, const Reg& last, const Reg& i,
                                  int64_t gm_row_blocks, int64_t ub_column) {
  KernelBuilder& b = m_b;
  auto copy = [&](const Opnd& blocks, const Opnd& gm_gap, const Opnd& ub_gap) {
    if (to_ub)
      b.emit(Opcode::op_copy_gm2ub, {ub, gm, rows, blocks, gm_gap, ub_gap});
    else
      b.emit(Opcode::op_copy_ub2gm, {gm, ub, rows, blocks, ub_gap, gm_gap});
  };
  b.for_range(i, 0, full, 1, [&] {
    copy(m_kb, gm_row_blocks - m_kb, 0);
    b.add(gm, gm, kSide * m_esize);
    b.add(ub, ub, ub_column);
  });
  b.if_(ne(last, 0), [&] {
    Reg g = b.reg("gaps");
    b.movi(g, gm_row_blocks);
    b.sub(g, g, last);
    Reg sg = b.reg("staging gap");
    b.movi(sg, m_kb);
    b.sub(sg, sg, last);
    copy(last, g, sg);
  });
}

}  // namespace

// ---- rows of whole blocks: MTE copies only ----

namespace {

// Tiles per core the row copy aims at (so that one tile's load overlaps the previous one's
// store), and the smallest tile it makes for that (smaller tiles spend the copies' fixed costs
// on few bytes). A compiler tiling choice, not a chip figure: of (2, 8 KiB), (4, 8 KiB),
// (8, 4 KiB) and (8, 32 KiB), the fastest in simulated time for the attention heads' split on
// the 910 preset at batch 8 and 96 (docs/compiler.md, "Transpose").
constexpr int64_t kRowCopyTilesPerCore = 8;
constexpr int64_t kRowCopyMinTileBytes = 32 * 1024;

// One dim of the row copy's view: its size and its strides in the input and in the output,
// in elements.
struct RowDim {
  int64_t size = 1, in_stride = 0, out_stride = 0;
};

// Whether the group dims (output order) place consecutive groups `group` elements apart on the
// side `stride` reads: then the rows of consecutive groups are one contiguous range there.
bool groups_chain(const std::vector<RowDim>& dims, int64_t group,
                  int64_t RowDim::*stride) {
  int64_t next = group;
  for (size_t d = dims.size(); d-- > 0;) {
    if (dims[d].*stride != next) return false;
    next *= dims[d].size;
  }
  return true;
}

// Emits build_row_copy's kernel. The view is [group dims..., M, R] up to the order of its dims:
// rows of R contiguous elements (whole 32-byte blocks); the burst dim (M rows) is the one
// copied by one MTE instruction, M bursts of R elements, the rows in_stride apart in the input
// and out_stride apart in the output; the other dims index the groups.
class RowCopy {
 public:
  RowCopy(const std::string& op, DataType dt, const std::vector<int64_t>& in_shape,
          const StridedView& v, const std::vector<RowDim>& groups, const RowDim& burst,
          const ChipConfig& cfg);
  // False when a row does not fit half the UB (the caller takes another path).
  bool plan_tiles();
  Launch build();

 private:
  void emit_tile(int q, const Reg& t, const Reg& step, const Label& drain);
  void group_offset(const Reg& addr, const Reg& base, const Reg& g, int64_t RowDim::*stride,
                    int64_t offset);
  void copy(bool load, const Reg& gm, const Reg& ub, const Opnd& rows);

  KernelBuilder m_b;
  const DataType m_dt;
  const std::vector<int64_t> m_in_shape;
  const StridedView m_v;
  const int64_t m_esize;
  isa::CoreKind m_kind;
  const std::vector<RowDim> m_groups_dims;  // output order
  const RowDim m_burst;                     // the M rows of a group
  int64_t m_r = 0, m_row_blocks = 0;        // row elements, 32-byte blocks
  int64_t m_in_gap = 0, m_out_gap = 0;      // between a group's rows (32-byte blocks)
  int64_t m_groups = 0;
  // Consecutive groups are one contiguous range in the input / output: one load / store per
  // tile instead of one per group.
  bool m_loads_merge = false, m_stores_merge = false;
  // Tiling: m_group_tiles whole groups per tile, or (m_group_tiles == 0, a group larger than a
  // tile) chunks of m_chunk_rows rows, m_chunks per group.
  int64_t m_group_tiles = 0, m_chunk_rows = 0, m_chunks = 1, m_tiles = 0;
  uint64_t m_tile_bytes = 0;
  int m_block_dim = 0;
  uint64_t m_buf[2] = {0, 0};
  FlagPair m_loaded, m_stored;
};

RowCopy::RowCopy(const std::string& op, DataType dt, const std::vector<int64_t>& in_shape,
                 const StridedView& v, const std::vector<RowDim>& groups, const RowDim& burst,
                 const ChipConfig& cfg)
    : m_b(fmt::format("Transpose_{}_rows", data_type_name(dt)), op, cfg),
      m_dt(dt),
      m_in_shape(in_shape),
      m_v(v),
      m_esize(data_type_bytes(dt)),
      m_kind(m_b.vector_core_kind()),
      m_groups_dims(groups),
      m_burst(burst) {
  m_r = v.dims.back();
  m_row_blocks = m_r * m_esize / kBlock;
  m_in_gap = (burst.in_stride - m_r) * m_esize / kBlock;
  m_out_gap = (burst.out_stride - m_r) * m_esize / kBlock;
  m_groups = 1;
  for (const RowDim& d : groups) m_groups *= d.size;
  m_loads_merge = m_in_gap == 0 && groups_chain(groups, burst.size * m_r, &RowDim::in_stride);
  m_stores_merge = m_out_gap == 0 && groups_chain(groups, burst.size * m_r, &RowDim::out_stride);
}

bool RowCopy::plan_tiles() {
  KernelBuilder& b = m_b;
  b.begin_section(m_kind);
  const int64_t cores = b.core().count;
  const int64_t row_bytes = m_r * m_esize;
  const int64_t max_field = static_cast<int64_t>(isa::field_imm_max(isa::FieldKind::RU16));
  // Two tiles in the UB, each within one copy's burst length.
  const int64_t cap_rows =
      std::min<int64_t>(static_cast<int64_t>(b.free_bytes(Buf::UB)) / 2, max_field * kBlock) /
      row_bytes;
  if (cap_rows < 1) return false;
  const int64_t m = m_burst.size;
  const int64_t rows = m_groups * m;
  // kRowCopyTilesPerCore tiles per core, but tiles of kRowCopyMinTileBytes at least, unless
  // that would leave cores idle (a small tensor: its copies' latencies overlap across cores).
  const int64_t min_rows = std::min((kRowCopyMinTileBytes + row_bytes - 1) / row_bytes,
                                    (rows + cores - 1) / cores);
  const int64_t target = std::max(
      (rows + cores * kRowCopyTilesPerCore - 1) / (cores * kRowCopyTilesPerCore), min_rows);
  const int64_t tile_rows = std::min(std::min(cap_rows, max_field), target);
  if (m <= tile_rows) {
    m_group_tiles = tile_rows / m;
    m_tiles = (m_groups + m_group_tiles - 1) / m_group_tiles;
    m_tile_bytes = static_cast<uint64_t>(m_group_tiles * m * row_bytes);
  } else {
    m_chunks = (m + tile_rows - 1) / tile_rows;
    m_chunk_rows = (m + m_chunks - 1) / m_chunks;  // even chunks
    m_tiles = m_groups * m_chunks;
    m_tile_bytes = static_cast<uint64_t>(m_chunk_rows * row_bytes);
  }
  m_block_dim = static_cast<int>(std::min(cores, m_tiles));
  return true;
}

Launch RowCopy::build() {
  KernelBuilder& b = m_b;
  for (int q = 0; q < 2; ++q) m_buf[q] = b.alloc(Buf::UB, m_tile_bytes, fmt::format("rows {}", q));
  b.declare_arg("in0", device_dtype(m_dt), m_in_shape);
  b.declare_arg("out", device_dtype(m_dt), m_v.dims);
  m_loaded = b.flag_pair(Pipe::MTE2, Pipe::MTE3, "rows loaded");
  m_stored = b.flag_pair(Pipe::MTE3, Pipe::MTE2, "rows stored");
  for (int q = 0; q < 2; ++q) b.set_flag(m_stored, q, "both tiles start free");
  emit_round_robin_tiles(b, [&](int q, const Reg& t, const Reg& step, const Label& drain) {
    emit_tile(q, t, step, drain);
  });
  for (int q = 0; q < 2; ++q) b.wait_flag(m_stored, q);
  b.end();
  Launch l = in_out_launch(b, m_block_dim);
  l.summary = fmt::format(
      "{}: {} groups of {} rows of {} elements ({} apart in the input, {} in the output), {} "
      "({} tiles over {} blocks), copy_gm2ub + copy_ub2gm",
      l.kernel.program.name, m_groups, m_burst.size, m_r, m_burst.in_stride, m_burst.out_stride,
      m_group_tiles > 0 ? fmt::format("{} groups per tile", m_group_tiles)
                        : fmt::format("{} chunks of {} rows per group", m_chunks, m_chunk_rows),
      m_tiles, m_block_dim);
  return l;
}

// addr = base + the byte offset of group g's first row (offset + its index . stride).
void RowCopy::group_offset(const Reg& addr, const Reg& base, const Reg& g,
                           int64_t RowDim::*stride, int64_t offset) {
  KernelBuilder& b = m_b;
  Reg rest = b.reg("group index left"), idx = b.reg("index");
  b.mov(rest, g);
  b.movi(addr, offset);
  for (size_t d = m_groups_dims.size(); d-- > 0;) {
    const RowDim& dim = m_groups_dims[d];
    if (d > 0) {
      b.rem(idx, rest, dim.size);
      b.div(rest, rest, dim.size);
      b.mul_add(addr, idx, dim.*stride, addr);
    } else {
      b.mul_add(addr, rest, dim.*stride, addr);
    }
  }
  b.mul(addr, addr, m_esize);
  b.add(addr, addr, base, "group address");
}

// `rows` rows of one group between GM at gm and the UB at ub (load: GM -> UB).
void RowCopy::copy(bool load, const Reg& gm, const Reg& ub, const Opnd& rows) {
  if (load)
    m_b.emit(Opcode::op_copy_gm2ub, {ub, gm, rows, m_row_blocks, m_in_gap, 0});
  else
    m_b.emit(Opcode::op_copy_ub2gm, {gm, ub, rows, m_row_blocks, 0, m_out_gap});
}

// Tile t (of parity q): its rows loaded, then stored (one copy per group, or one for the tile
// where the groups are contiguous).
void RowCopy::emit_tile(int q, const Reg& t, const Reg& step, const Label& drain) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, fmt::format("tile ({})", q ? "pong" : "ping"));
  b.branch(ge(t, m_tiles), drain);
  const int64_t row_bytes = m_r * m_esize, m = m_burst.size;
  Reg in = b.load_arg("in0"), out = b.load_arg("out");
  Reg ub = b.reg("tile rows"), gm = b.reg("group address");
  if (m_group_tiles > 0) {
    Reg g = b.reg("group"), first = b.reg("first group"), end = b.reg("end group");
    b.mul(first, t, m_group_tiles);
    b.add(end, first, m_group_tiles);
    b.min(end, end, m_groups);
    // One side's copies: per group, or one of all the tile's rows when they are contiguous.
    auto side = [&](bool load, bool merged) {
      b.movi(ub, static_cast<int64_t>(m_buf[q]));
      if (merged) {
        Reg blocks = b.reg("blocks");
        b.sub(blocks, end, first);
        b.mul(blocks, blocks, m * m_row_blocks, "blocks of the tile");
        if (load) {
          b.mul_add(gm, first, m * row_bytes, in);
          if (m_v.offset != 0) b.add(gm, gm, m_v.offset * m_esize, "the view's offset");
          b.emit(Opcode::op_copy_gm2ub, {ub, gm, 1, blocks, 0, 0});
        } else {
          b.mul_add(gm, first, m * row_bytes, out);
          b.emit(Opcode::op_copy_ub2gm, {gm, ub, 1, blocks, 0, 0});
        }
        return;
      }
      b.for_range(g, first, end, 1, [&] {
        if (load)
          group_offset(gm, in, g, &RowDim::in_stride, m_v.offset);
        else
          group_offset(gm, out, g, &RowDim::out_stride, 0);
        copy(load, gm, ub, m);
        b.add(ub, ub, m * row_bytes);
      });
    };
    b.wait_flag(m_stored, q);
    side(true, m_loads_merge);
    b.set_flag(m_loaded, q);
    b.wait_flag(m_loaded, q);
    side(false, m_stores_merge);
  } else {
    Reg g = b.reg("group"), c = b.reg("first row in the group"), rows = b.reg("rows");
    b.div(g, t, m_chunks);
    b.rem(c, t, m_chunks);
    b.mul(c, c, m_chunk_rows);
    b.movi(rows, m);
    b.sub(rows, rows, c);
    b.min(rows, rows, m_chunk_rows, "rows of the chunk");
    b.movi(ub, static_cast<int64_t>(m_buf[q]));
    b.wait_flag(m_stored, q);
    group_offset(gm, in, g, &RowDim::in_stride, m_v.offset);
    b.mul_add(gm, c, m_burst.in_stride * m_esize, gm);
    copy(true, gm, ub, rows);
    b.set_flag(m_loaded, q);
    b.wait_flag(m_loaded, q);
    group_offset(gm, out, g, &RowDim::out_stride, 0);
    b.mul_add(gm, c, m_burst.out_stride * m_esize, gm);
    copy(false, gm, ub, rows);
  }
  b.set_flag(m_stored, q);
  b.add(t, t, step);
}

}  // namespace

// Rows of whole blocks (see RowCopy): the copy out = view(in), or nothing when the view's rows
// are not whole blocks, its gaps do not fit the copies' fields or a row does not fit the UB.
// The burst dim: the output's second-to-last (stores of contiguous rows), or the dim whose rows
// are contiguous in the input when it is longer (or the other's gaps do not fit): fewer, longer
// copies.
std::optional<Launch> build_row_copy(const std::string& op, DataType dt,
                                     const std::vector<int64_t>& in_shape, const StridedView& v,
                                     const ChipConfig& cfg) {
  const int64_t esize = data_type_bytes(dt);
  const size_t rank = v.dims.size();
  if (rank < 2 || v.strides.back() != 1 || v.offset * esize % kBlock != 0) return std::nullopt;
  const int64_t r = v.dims.back();
  if (r * esize % kBlock != 0) return std::nullopt;
  const std::vector<int64_t> out_strides = contiguous_strides(v.dims);
  std::vector<RowDim> dims;
  for (size_t d = 0; d + 1 < rank; ++d) {
    if (v.strides[d] % r != 0 || v.strides[d] < r) return std::nullopt;
    dims.push_back(RowDim{v.dims[d], v.strides[d], out_strides[d]});
  }
  const int64_t max_field = static_cast<int64_t>(isa::field_imm_max(isa::FieldKind::RU16));
  if (r * esize / kBlock > max_field) return std::nullopt;
  auto gaps_fit = [&](const RowDim& d) {
    return (d.in_stride - r) * esize / kBlock <= max_field &&
           (d.out_stride - r) * esize / kBlock <= max_field;
  };
  std::optional<size_t> burst;
  if (gaps_fit(dims.back())) burst = dims.size() - 1;
  for (size_t d = 0; d < dims.size(); ++d)
    if (dims[d].in_stride == r && gaps_fit(dims[d]) &&
        (!burst || dims[d].size > dims[*burst].size))
      burst = d;
  if (!burst) return std::nullopt;
  const RowDim m = dims[*burst];
  dims.erase(dims.begin() + static_cast<std::ptrdiff_t>(*burst));
  RowCopy k(op, dt, in_shape, v, dims, m, cfg);
  if (!k.plan_tiles()) return std::nullopt;
  return k.build();
}

// ---- rows not whole blocks: whole rows gathered by MTE2, merged by one vsel per tile ----

namespace {

// When the row gather is taken (NPUSIM_TRANSPOSE_ROW_GATHER): unset or empty, where it applies
// and the tensor has more rows than vector cores (RowGather::plan_tiles); "1", wherever it
// applies; "0", never (the assembly kernel's runs instead, for comparison). Anything else is a
// CompileError.
enum class RowGatherMode { kMoreRowsThanCores, kAlways, kNever };

RowGatherMode row_gather_mode(const std::string& op) {
  const char* v = std::getenv("NPUSIM_TRANSPOSE_ROW_GATHER");
  if (!v || !*v) return RowGatherMode::kMoreRowsThanCores;
  const std::string_view value(v);
  if (value == "0") return RowGatherMode::kNever;
  if (value == "1") return RowGatherMode::kAlways;
  throw CompileError(
      fmt::format("{}: NPUSIM_TRANSPOSE_ROW_GATHER='{}' is neither '0' nor '1'", op, v));
}

// src = the element offset in the input of output row `row` of view v (v's dims but the last,
// row-major; the row's first element).
void view_row_source(KernelBuilder& b, const StridedView& v, const Reg& src, const Reg& row) {
  Reg rest = b.reg("row index left"), idx = b.reg("index");
  b.mov(rest, row);
  b.movi(src, v.offset);
  for (size_t d = v.dims.size() - 1; d-- > 0;) {
    if (d > 0) {
      b.rem(idx, rest, v.dims[d]);
      b.div(rest, rest, v.dims[d]);
      b.mul_add(src, idx, v.strides[d], src);
    } else {
      b.mul_add(src, rest, v.strides[d], src);
    }
  }
}

// What the kernels copying out = view(in) row by row share: the builder (a vector-core kernel
// named `kernel`), the view, and its rows: the view's last dim R (elements, contiguous in the
// input), output rows = the product of its other dims.
struct ViewRows {
  ViewRows(const std::string& kernel, const std::string& op, DataType dt,
           const std::vector<int64_t>& in_shape, const StridedView& v, const ChipConfig& cfg)
      : m_b(kernel, op, cfg),
        m_dt(dt),
        m_in_shape(in_shape),
        m_v(v),
        m_esize(data_type_bytes(dt)),
        m_kind(m_b.vector_core_kind()),
        m_r(v.dims.back()) {
    for (size_t d = 0; d + 1 < v.dims.size(); ++d) m_rows *= v.dims[d];
  }
  // Declares the arguments: in0 (the input's shape), then out (the view's dims).
  void declare_in_out() {
    m_b.declare_arg("in0", device_dtype(m_dt), m_in_shape);
    m_b.declare_arg("out", device_dtype(m_dt), m_v.dims);
  }
  // Ends the kernel: its launch on block_dim blocks, summarised as
  // "<kernel>: <rows> rows of <R> elements <how>".
  Launch finish(int block_dim, const std::string& how) {
    m_b.end();
    Launch l = in_out_launch(m_b, block_dim);
    l.summary =
        fmt::format("{}: {} rows of {} elements {}", l.kernel.program.name, m_rows, m_r, how);
    return l;
  }

  KernelBuilder m_b;
  const DataType m_dt;
  const std::vector<int64_t> m_in_shape;
  const StridedView m_v;
  const int64_t m_esize;  // bytes per element
  const isa::CoreKind m_kind;
  const int64_t m_r;   // row length (elements)
  int64_t m_rows = 1;  // output rows
};

// Emits build_row_gather's kernel: out = view(in), the view's last dim R contiguous in the input
// (R at least one 32-byte block) and its rows at any element offset. The output is tiled in K
// consecutive rows, K*R*esize a multiple of 32 bytes, so that every tile is whole output blocks
// (the tensor's last block excepted). Per tile: MTE2 loads each row with one copy_gm2ub of whole
// blocks, starting `phase` elements before the row (GM is byte addressed) so that it lands at
// its place in the tile; even rows go to buffer E, odd rows to buffer O at the same offsets
// (rows two apart share no block since R >= one block); V merges them with one vsel whose
// select bits (1: a lane of an even row) are the same for every tile and are built once; MTE3
// stores the tile with one copy. E, O ping/pong: MTE2 / V / MTE3 overlap.
class RowGather : private ViewRows {
 public:
  RowGather(const std::string& op, DataType dt, const std::vector<int64_t>& in_shape,
            const StridedView& v, const ChipConfig& cfg);
  // False when two rows' tile does not fit the UB, or under kMoreRowsThanCores when the tensor
  // has no more rows than vector cores (the caller takes another path).
  bool plan_tiles(RowGatherMode mode);
  Launch build();

 private:
  void build_select_bits();
  void emit_tile(int q, const Reg& t, const Reg& step, const Label& drain);
  void load_row(const Reg& src, const Reg& off, uint64_t buf, const Reg& in);
  void next_row(const Reg& row, const Reg& src, const Reg& i);

  const int64_t m_epb;           // elements per 32-byte block
  const isa::Dtype m_unit;       // the lanes' type (u16 / s32: bits moved unchanged)
  RowDim m_inner;                // the innermost row dim (size 1 for a single row)
  int64_t m_k = 0, m_tiles = 0;  // rows per tile, tiles
  int64_t m_tile_lanes = 0;      // K * R rounded up to whole repeats
  int m_block_dim = 0;
  uint64_t m_even[2] = {0, 0}, m_odd[2] = {0, 0}, m_bits = 0, m_ones = 0;
  FlagPair m_loaded, m_merged, m_stored;
};

RowGather::RowGather(const std::string& op, DataType dt, const std::vector<int64_t>& in_shape,
                     const StridedView& v, const ChipConfig& cfg)
    : ViewRows(fmt::format("Transpose_{}_row_gather", data_type_name(dt)), op, dt, in_shape, v,
               cfg),
      m_epb(kBlock / data_type_bytes(dt)),
      m_unit(data_type_bytes(dt) == 2 ? Dtype::U16 : Dtype::S32) {
  if (v.dims.size() >= 2)
    m_inner = RowDim{v.dims[v.dims.size() - 2], v.strides[v.dims.size() - 2], 0};
}

bool RowGather::plan_tiles(RowGatherMode mode) {
  KernelBuilder& b = m_b;
  b.begin_section(m_kind);
  const int64_t cores = b.core().count;
  // Tiles are whole output blocks, so a small tensor makes few tiles (16 rows of an odd number
  // of f16 make one) and leaves cores idle, each tile's rows copied one after another on its
  // core; the assembly kernel's runs spread the elements over every core. Up to one row per
  // core those runs are one row's work per core, done in parallel, and the gather cannot be
  // faster; from two rows per core the runs' per-element work grows with the rows.
  if (mode == RowGatherMode::kMoreRowsThanCores && m_rows <= cores) return false;
  const int64_t row_bytes = m_r * m_esize;
  const int64_t repeat_bytes = 256;  // one vector repeat
  // Rows per tile: a multiple of kq, so that a tile is whole 32-byte blocks.
  int64_t g = kBlock, x = row_bytes % kBlock;
  while (x != 0) {
    const int64_t y = g % x;
    g = x;
    x = y;
  }
  const int64_t kq = kBlock / g;
  // UB: four tiles (E, O ping / pong), the select bits (one bit per lane of a tile), one repeat
  // of ones, and a block of slack per tile (a row's load ends up to a block past its end).
  const int64_t avail = static_cast<int64_t>(b.free_bytes(Buf::UB)) - repeat_bytes - 8 * kBlock;
  const int64_t lane_bits = 8 * m_esize;  // tile bytes per select byte
  const int64_t cap_bytes = avail * lane_bits / (4 * lane_bits + 1) - repeat_bytes;
  const int64_t cap_rows = cap_bytes / row_bytes / kq * kq;
  if (cap_rows < kq) return false;
  // Tiles per core and size as the row copy's (kRowCopyTilesPerCore, kRowCopyMinTileBytes).
  const int64_t min_rows =
      std::min((kRowCopyMinTileBytes + row_bytes - 1) / row_bytes, (m_rows + cores - 1) / cores);
  const int64_t target = std::max(
      (m_rows + cores * kRowCopyTilesPerCore - 1) / (cores * kRowCopyTilesPerCore), min_rows);
  m_k = std::min(cap_rows, (target + kq - 1) / kq * kq);
  m_tiles = (m_rows + m_k - 1) / m_k;
  const int64_t lanes_per_repeat = repeat_bytes / m_esize;
  m_tile_lanes = (m_k * m_r + lanes_per_repeat - 1) / lanes_per_repeat * lanes_per_repeat;
  m_block_dim = static_cast<int>(std::min(cores, m_tiles));
  return true;
}

Launch RowGather::build() {
  KernelBuilder& b = m_b;
  const uint64_t tile_bytes = static_cast<uint64_t>(m_tile_lanes * m_esize + kBlock);
  for (int q = 0; q < 2; ++q) {
    m_even[q] = b.alloc(Buf::UB, tile_bytes, fmt::format("even rows {}", q));
    m_odd[q] = b.alloc(Buf::UB, tile_bytes, fmt::format("odd rows {}", q));
  }
  m_bits = b.alloc(Buf::UB, static_cast<uint64_t>(m_tile_lanes / 8), "select bits (even rows)");
  m_ones = b.alloc(Buf::UB, 256, "ones");
  declare_in_out();
  m_loaded = b.flag_pair(Pipe::MTE2, Pipe::V, "rows loaded");
  m_merged = b.flag_pair(Pipe::V, Pipe::MTE3, "rows merged");
  m_stored = b.flag_pair(Pipe::MTE3, Pipe::MTE2, "tile stored");
  build_select_bits();
  for (int q = 0; q < 2; ++q) b.set_flag(m_stored, q, "both tiles start free");
  emit_round_robin_tiles(b, [&](int q, const Reg& t, const Reg& step, const Label& drain) {
    emit_tile(q, t, step, drain);
  });
  for (int q = 0; q < 2; ++q) b.wait_flag(m_stored, q);
  return finish(m_block_dim, fmt::format("gathered ({} rows per tile, {} tiles over {} blocks), "
                                         "copy_gm2ub per row + vsel of even / odd rows",
                                         m_k, m_tiles, m_block_dim));
}

// The select bits: a lane marker (1 in even rows' lanes, 0 elsewhere) built in odd[0] with
// exact vdups, compared with ones. odd[0] is free again once V is done (the first load into it
// waits for that).
void RowGather::build_select_bits() {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, "select bits of the even rows");
  Reg marker = b.reg_imm("lane marker", static_cast<int64_t>(m_odd[0]));
  Reg value = b.reg_imm("marker value", 0);
  b.emit(Opcode::op_set_mask_count, {m_tile_lanes});
  b.emit(Opcode::op_vdup, {m_unit, marker, value, 0, 1, 8}, "zero the marker");
  b.movi(value, 1);
  Reg k = b.reg("row"), d = b.reg("block address"), p = b.reg("phase"), m = b.reg("mask / rest"),
      u = b.reg("mask temporary");
  b.for_range(k, 0, m_k, 2, [&] {
    // lanes [k R, k R + R): the first block masked, the rest in counter mode.
    b.mul(d, k, m_r);
    b.and_(p, d, m_epb - 1);
    b.sub(d, d, p);
    b.mul_add(d, d, m_esize, static_cast<int64_t>(m_odd[0]));
    first_block_mask(b, m, u, p, m_r, m_epb);
    b.emit(Opcode::op_set_mask, {Opnd::reg_number(0), m});
    b.emit(Opcode::op_vdup, {m_unit, d, value, 1, 1, 8});
    b.add(m, p, m_r);
    b.sub(m, m, m_epb, "lanes after the first block");
    b.if_(ge(m, 1), [&] {
      b.emit(Opcode::op_set_mask_count, {m});
      b.add(d, d, kBlock);
      b.emit(Opcode::op_vdup, {m_unit, d, value, 0, 1, 8});
    });
  });
  Reg ones = b.reg_imm("ones", static_cast<int64_t>(m_ones));
  b.emit(Opcode::op_set_mask_count, {256 / m_esize});
  b.emit(Opcode::op_vdup, {m_unit, ones, value, 0, 1, 8});
  Reg bits = b.reg_imm("select bits", static_cast<int64_t>(m_bits));
  b.emit(Opcode::op_set_mask_count, {m_tile_lanes});
  b.emit(Opcode::op_vcmp, {m_unit, isa::Cmp::EQ, bits, marker, ones, 0, 1, 1, 8, 0});
  // The first tile's loads into odd[0] wait for the marker to be read.
  b.set_flag(Pipe::V, Pipe::MTE2, 0, "marker read");
  b.wait_flag(Pipe::V, Pipe::MTE2, 0, "marker read");
}

// MTE2: the row whose first element is input element src and tile element off, into buf at its
// place in the tile: whole blocks from `phase` elements before it. Then off += R.
void RowGather::load_row(const Reg& src, const Reg& off, uint64_t buf, const Reg& in) {
  KernelBuilder& b = m_b;
  Reg p = b.reg("phase"), ub = b.reg("row's first block"), gm = b.reg("row source"),
      n = b.reg("blocks");
  b.and_(p, off, m_epb - 1);
  b.sub(ub, off, p);
  b.mul_add(ub, ub, m_esize, static_cast<int64_t>(buf));
  b.sub(gm, src, p);
  b.mul_add(gm, gm, m_esize, in);
  b.mul_add(n, p, m_esize, m_r * m_esize + kBlock - 1);
  b.shr(n, n, 5, "32-byte blocks");
  b.emit(Opcode::op_copy_gm2ub, {ub, gm, 1, n, 0, 0});
  b.add(off, off, m_r);
}

// The next row: row + 1, its source one stride of the innermost row dim further (i: the index
// in that dim), or recomputed when that dim wraps.
void RowGather::next_row(const Reg& row, const Reg& src, const Reg& i) {
  KernelBuilder& b = m_b;
  b.add(row, row, 1);
  b.add(src, src, m_inner.in_stride);
  b.add(i, i, 1);
  b.if_(ge(i, m_inner.size), [&] {
    b.movi(i, 0);
    view_row_source(b, m_v, src, row);
  });
}

// Tile t (of parity q): its rows loaded into E / O, merged into E, E stored.
void RowGather::emit_tile(int q, const Reg& t, const Reg& step, const Label& drain) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, fmt::format("tile ({})", q ? "pong" : "ping"));
  b.branch(ge(t, m_tiles), drain);
  Reg in = b.load_arg("in0");
  Reg first = b.reg("first row"), end = b.reg("end row"), row = b.reg("row"),
      src = b.reg("row's first element"), i = b.reg("index in the innermost row dim"),
      off = b.reg("tile element");
  b.mul(first, t, m_k);
  b.add(end, first, m_k);
  b.min(end, end, m_rows, "end of the tile's rows");
  b.mov(row, first);
  view_row_source(b, m_v, src, row);
  b.rem(i, row, m_inner.size);
  b.movi(off, 0);
  b.wait_flag(m_stored, q);
  Label loop = b.label("row_pair"), loaded = b.label("rows_loaded");
  b.bind(loop);
  {
    // rows k (even: E) and k + 1 (odd: O), when there is one.
    load_row(src, off, m_even[q], in);
    next_row(row, src, i);
    b.branch(ge(row, end), loaded);
    load_row(src, off, m_odd[q], in);
    next_row(row, src, i);
    b.branch(lt(row, end), loop);
  }
  b.bind(loaded);
  b.set_flag(m_loaded, q);
  b.wait_flag(m_loaded, q);
  Reg e = b.reg_imm("even rows", static_cast<int64_t>(m_even[q]));
  Reg od = b.reg_imm("odd rows", static_cast<int64_t>(m_odd[q]));
  Reg bits = b.reg_imm("select bits", static_cast<int64_t>(m_bits));
  b.emit(Opcode::op_set_mask_count, {m_tile_lanes});
  b.emit(Opcode::op_vsel, {m_unit, e, e, od, bits, 0, 1, 1, 1, 8, 8, 8}, "even ? E : O");
  b.set_flag(m_merged, q);
  b.wait_flag(m_merged, q);
  Reg out = b.load_arg("out"), gm = b.reg("tile destination"), blocks = b.reg("tile blocks");
  b.mul_add(gm, first, m_r * m_esize, out);
  b.sub(blocks, end, first);
  b.mul_add(blocks, blocks, m_r * m_esize, kBlock - 1);
  b.shr(blocks, blocks, 5);
  b.emit(Opcode::op_copy_ub2gm, {gm, e, 1, blocks, 0, 0});
  b.set_flag(m_stored, q);
  b.add(t, t, step);
}

}  // namespace

// The gather out = view(in) of rows that are not whole blocks (RowGather), or nothing when it
// does not apply: 2- and 4-byte elements, the last dim contiguous and at least one block, two
// tiles' rows fitting the UB, and not switched off.
std::optional<Launch> build_row_gather(const std::string& op, DataType dt,
                                       const std::vector<int64_t>& in_shape, const StridedView& v,
                                       const ChipConfig& cfg) {
  const int64_t esize = data_type_bytes(dt);
  if ((esize != 2 && esize != 4) || v.dims.empty() || v.strides.back() != 1) return std::nullopt;
  if (v.dims.back() < kBlock / esize) return std::nullopt;
  const RowGatherMode mode = row_gather_mode(op);
  if (mode == RowGatherMode::kNever) return std::nullopt;
  RowGather k(op, dt, in_shape, v, cfg);
  if (!k.plan_tiles(mode)) return std::nullopt;
  return k.build();
}

// ---- rows not whole blocks, one at a time: CANN's kernel (NPUSIM_TRANSPOSE_CANN) ----

namespace {

// Whether a Transpose keeping its inner dim takes CANN's row-at-a-time kernel where it applies
// (NPUSIM_TRANSPOSE_CANN): unset, empty or "1", yes; "0", no (the row gather or the runs).
// Anything else is a CompileError.
bool cann_rows_on(const std::string& op) {
  const char* v = std::getenv("NPUSIM_TRANSPOSE_CANN");
  if (!v || !*v) return true;
  const std::string_view value(v);
  if (value == "1") return true;
  if (value == "0") return false;
  throw CompileError(fmt::format("{}: NPUSIM_TRANSPOSE_CANN='{}' is neither '0' nor '1'", op, v));
}

// CANN's tiling constants for its Transpose (op_tiling transpose.h; bytes): a kept row of more
// than kCannRowMinBytes (and below kCannRowHugeBytes) that is not whole 32-byte blocks takes
// scenario 1; its UB keeps kCannUbReservedBytes back. (Its small-shape scenario, tensors below
// 1 KiB, cannot take such rows: two transposed dims make at least 4 rows of over 256 bytes.)
constexpr int64_t kCannRowMinBytes = 256;
constexpr int64_t kCannRowHugeBytes = 100 * 1024;
constexpr int64_t kCannUbReservedBytes = 4 * 1024;

// out = view(in) the way CANN's Transpose kernel copies kept rows that are not whole blocks
// when every core's rows fit its UB (scenario 1 of the TIK kernel
// ops/built-in/tbe/impl/dynamic/transpose.py and its tiling, which then leaves the core's
// batched loop empty): the output rows split evenly over the vector cores (rows / cores each,
// the first rows % cores cores one more), and each core copies its rows one at a time through
// one UB slot: copy_gm2ub of the row's whole blocks, copy_ub2gm of them to the output (up to a
// block past the row's end, which the core's next row overwrites), the next row's load after
// that store. A core's last row stores its whole blocks only, then its last 32 bytes from a
// second load (CANN: one data_move_pad of the exact bytes), so no core writes into another's
// rows. Latency-bound: one GM round trip per row.
class CannRowCopy : private ViewRows {
 public:
  CannRowCopy(const std::string& op, DataType dt, const std::vector<int64_t>& in_shape,
              const StridedView& v, const ChipConfig& cfg);
  // False where CANN takes another scenario or batches the rows (the caller takes another path).
  bool plan();
  Launch build();

 private:
  void copy_row(const Reg& row, const Reg& src, const Reg& in, const Reg& out, bool last);

  int64_t m_row_bytes = 0, m_row_blocks = 0;
  int64_t m_per_core = 0, m_longer = 0;  // rows of the first m_longer cores; the rest one fewer
  int m_block_dim = 0;
  uint64_t m_row_buf = 0, m_tail_buf = 0;
  int m_loaded = 0, m_stored = 0;  // flag ids
};

CannRowCopy::CannRowCopy(const std::string& op, DataType dt, const std::vector<int64_t>& in_shape,
                         const StridedView& v, const ChipConfig& cfg)
    : ViewRows(fmt::format("Transpose_{}_cann_rows", data_type_name(dt)), op, dt, in_shape, v,
               cfg) {
  m_row_bytes = m_r * m_esize;
  m_row_blocks = (m_row_bytes + kBlock - 1) / kBlock;
}

bool CannRowCopy::plan() {
  KernelBuilder& b = m_b;
  b.begin_section(m_kind);
  if (m_row_bytes % kBlock == 0 || m_row_bytes <= kCannRowMinBytes ||
      m_row_bytes >= kCannRowHugeBytes)
    return false;
  const int64_t cores = b.core().count;
  m_block_dim = static_cast<int>(std::min(cores, m_rows));
  m_per_core = (m_rows + m_block_dim - 1) / m_block_dim;
  m_longer = m_rows - m_block_dim * (m_per_core - 1);
  // CANN's per-core batch: as many row slots of whole blocks as the UB (its capacity, less
  // CANN's reserve) holds; a core with more rows copies them in batches of data_move_pad, which
  // this kernel does not model.
  const int64_t ub_blocks =
      (static_cast<int64_t>(b.core().capacity(Buf::UB)) - kCannUbReservedBytes) / kBlock;
  return m_per_core <= ub_blocks / m_row_blocks;
}

Launch CannRowCopy::build() {
  KernelBuilder& b = m_b;
  m_row_buf = b.alloc(Buf::UB, static_cast<uint64_t>(m_row_blocks * kBlock), "row");
  m_tail_buf = b.alloc(Buf::UB, static_cast<uint64_t>(kBlock), "last row's last block");
  declare_in_out();
  m_loaded = b.flag(Pipe::MTE2, Pipe::MTE3, "row loaded");
  m_stored = b.flag(Pipe::MTE3, Pipe::MTE2, "row stored");
  Reg in = b.load_arg("in0"), out = b.load_arg("out");
  Reg c = b.reg("block id"), first = b.reg("first row"), end = b.reg("end row"),
      k = b.reg("cores before"), row = b.reg("row"), src = b.reg("row's first element");
  b.emit(Opcode::op_get_block_id, {c});
  // first(c) = c * (per_core - 1) + min(c, longer); end = first(c + 1).
  b.min(k, c, m_longer);
  b.mul_add(first, c, m_per_core - 1, k);
  b.add(c, c, 1);
  b.min(k, c, m_longer);
  b.mul_add(end, c, m_per_core - 1, k);
  b.sub(end, end, 1, "the last row");
  b.for_range(row, first, end, 1, [&] { copy_row(row, src, in, out, false); });
  copy_row(end, src, in, out, true);
  return finish(m_block_dim,
                fmt::format("one at a time ({} rows on each of the first {} of {} blocks, one "
                            "fewer on the rest), CANN's Transpose scenario 1",
                            m_per_core, m_longer, m_block_dim));
}

// One row: loaded into the row slot, stored from it; `last`: the core's last row, stored
// without writing past its end.
void CannRowCopy::copy_row(const Reg& row, const Reg& src, const Reg& in, const Reg& out,
                           bool last) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, last ? "the core's last row" : "one row");
  Reg gm = b.reg("row source"), dst = b.reg("row destination"),
      ub = b.reg_imm("row slot", static_cast<int64_t>(m_row_buf));
  view_row_source(b, m_v, src, row);
  b.mul_add(gm, src, m_esize, in);
  b.mul_add(dst, row, m_row_bytes, out);
  b.emit(Opcode::op_copy_gm2ub, {ub, gm, 1, m_row_blocks, 0, 0});
  Reg tail = b.reg("last block slot");
  if (last) {
    b.movi(tail, static_cast<int64_t>(m_tail_buf));
    b.add(gm, gm, m_row_bytes - kBlock, "the row's last 32 bytes");
    b.emit(Opcode::op_copy_gm2ub, {tail, gm, 1, 1, 0, 0});
  }
  b.set_flag(Pipe::MTE2, Pipe::MTE3, m_loaded);
  b.wait_flag(Pipe::MTE2, Pipe::MTE3, m_loaded);
  if (!last) {
    b.emit(Opcode::op_copy_ub2gm, {dst, ub, 1, m_row_blocks, 0, 0});
    // The next row's load reuses the slot.
    b.set_flag(Pipe::MTE3, Pipe::MTE2, m_stored);
    b.wait_flag(Pipe::MTE3, Pipe::MTE2, m_stored);
    return;
  }
  b.emit(Opcode::op_copy_ub2gm, {dst, ub, 1, m_row_bytes / kBlock, 0, 0});
  b.add(dst, dst, m_row_bytes - kBlock);
  b.emit(Opcode::op_copy_ub2gm, {dst, tail, 1, 1, 0, 0});
}

}  // namespace

// CANN's row-at-a-time copy of out = view(in) (CannRowCopy), or nothing where it does not apply:
// 2- and 4-byte elements, the last dim contiguous, rows as CannRowCopy::plan takes them, and
// not switched off.
std::optional<Launch> build_cann_row_copy(const std::string& op, DataType dt,
                                          const std::vector<int64_t>& in_shape,
                                          const StridedView& v, const ChipConfig& cfg) {
  const int64_t esize = data_type_bytes(dt);
  if ((esize != 2 && esize != 4) || v.dims.empty() || v.strides.back() != 1) return std::nullopt;
  if (!cann_rows_on(op)) return std::nullopt;
  CannRowCopy k(op, dt, in_shape, v, cfg);
  if (!k.plan()) return std::nullopt;
  return k.build();
}

// Transposes [P, Q, R] -> [P, R, Q]; input rows are `ri` elements apart (ri = R, or more when
// the input rows are padded), output rows `qo` elements apart (qo = Q, or Q padded to whole
// blocks). Tiles of tq x tr (multiples of 16) go round-robin to the vector
// cores; per tile: MTE2 loads the q rows into a staging buffer laid out as 16x16 blocks
// ([r block][q block][16 q][16 r], each block contiguous), V transposes every block into the
// output staging ([q block][r block][16 r][16 q]), MTE3 stores each q block's column of rows
// with one copy_ub2gm. Staging buffers are ping/pong (MTE2 / V / MTE3 overlap).
// Arguments: in0 [P, Q, ri], out [P, R, qo].
Launch build_block_transpose(const std::string& op, DataType dt, int64_t np, int64_t nq, int64_t nr,
                             int64_t ri, int64_t qo, const ChipConfig& cfg) {
  return BlockTranspose(op, dt, np, nq, nr, ri, qo, cfg).build();
}

// The copy out = view(in) (dims over the output, source strides) as one assembly launch.
void append_view(LaunchPlan& plan, const std::string& op, const ChipConfig& cfg, DataType dtype,
                 const std::vector<int64_t>& in_shape, const std::vector<int64_t>& out_shape,
                 const StridedView& v, ArgRef in, ArgRef out, const std::string& what) {
  StridedView simple = v;
  simple.simplify();
  if (std::optional<Launch> rows = build_row_copy(op, dtype, in_shape, simple, cfg)) {
    plan.add(std::move(*rows), {in, out}, what);
    return;
  }
  if (std::optional<Launch> rows = build_row_gather(op, dtype, in_shape, simple, cfg)) {
    plan.add(std::move(*rows), {in, out}, what);
    return;
  }
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
  if (inner_kept && row_gather_mode(op) != RowGatherMode::kAlways) {
    StridedView v = view_of(r.perm);
    v.simplify();
    if (std::optional<Launch> rows = build_cann_row_copy(op, dtype, in_shape, v, cfg)) {
      plan.add(std::move(*rows), {in, out}, what);
      return;
    }
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
  // Output rows of at least two blocks or exactly one (no padding pass; below two blocks a
  // padded row costs a transposer launch plus a copy of partial blocks, slower than element by
  // element), and not so long that the store's gap field overflows.
  const int64_t max_gap = static_cast<int64_t>(isa::field_imm_max(isa::FieldKind::RU16));
  return (nq >= 2 * epb || nq == epb) && (nq + epb - 1) / epb <= max_gap;
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
