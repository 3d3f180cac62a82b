#include "adapter/compiler/ops/assemble.h"

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "adapter/compiler/ops/elementwise.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;
using isa::Pipe;
using layout::kBlockBytes;
using vec::kRepeatBytes;

namespace {

constexpr int64_t kTileQuantum = 128;    // tiles are whole multiples of 128 elements
constexpr uint64_t kPatternBytes = 2 * kRepeatBytes;  // s64 splat pattern: two repeats of lo/hi
constexpr int64_t kMinRunElems = 4;      // shorter runs go element by element (ld + vdup)
constexpr int kLog2Block = 5;

Opnd zero_reg() { return Opnd::reg_number(0); }

}  // namespace

// ---- TileKernel ----

TileKernel::TileKernel(const std::string& op, Options options, const ChipConfig& cfg)
    : m_b(options.kernel_name, op, cfg), m_opt(std::move(options)), m_cfg(cfg) {
  m_esize = data_type_bytes(m_opt.dtype);
  switch (m_esize) {
    case 1: m_wide = true; m_unit = Dtype::U16; m_ubytes = 2; break;
    case 2: m_unit = Dtype::U16; m_ubytes = 2; break;
    case 4: m_unit = Dtype::S32; m_ubytes = 4; break;
    case 8: m_unit = Dtype::S32; m_ubytes = 4; m_units = 2; break;
    default: m_b.fail(fmt::format("no data movement for {}-byte elements", m_esize));
  }
}

Reg TileKernel::input_addr(int i) { return m_b.load_arg(fmt::format("in{}", i)); }

void TileKernel::load_shift(const Reg& v, const AsmShift& s) {
  KernelBuilder& b = m_b;
  const TensorDesc& idx = m_opt.inputs.at(static_cast<size_t>(s.input));
  Reg a = input_addr(s.input);
  if (s.element > 0) b.add(a, a, s.element * data_type_bytes(idx.dtype));
  load_index(v, a, idx.dtype);
  b.max(v, v, 0, "clamp the start index as XLA does");
  b.min(v, v, s.max);
  if (s.scale != 1) b.mul(v, v, s.scale);
}

void TileKernel::load_element(const Reg& value, const Reg& addr) {
  m_b.emit(Opcode::op_ld, {value, addr}, "load one element (scalar unit)");
}

void TileKernel::load_index(const Reg& value, const Reg& addr, DataType t) {
  KernelBuilder& b = m_b;
  load_element(value, addr);
  // Sign extension of a w-bit value v: ((v & (2^w - 1)) ^ 2^(w-1)) - 2^(w-1).
  switch (t) {
    case DataType::S64: return;
    case DataType::S32:
      b.and_(value, value, 0xffffffffLL, "sign-extend the s32 index");
      b.emit(Opcode::op_xor, {value, value, 0x80000000LL});
      b.sub(value, value, 0x80000000LL);
      return;
    case DataType::S8:
      b.and_(value, value, 0xff, "sign-extend the s8 index");
      b.emit(Opcode::op_xor, {value, value, 0x80});
      b.sub(value, value, 0x80);
      return;
    case DataType::U8:
      b.and_(value, value, 0xff, "the u8 index");
      return;
    default:
      b.fail(fmt::format("index type {} is not supported (s32, s64, u8, s8)", data_type_name(t)));
  }
}

void first_block_mask(KernelBuilder& b, const Reg& mask, const Reg& tmp, const Reg& phase,
                      Opnd len, int64_t epb) {
  // mask = (1 << min(phase + len, epb)) - (1 << phase)
  b.add(mask, phase, len);
  b.min(mask, mask, epb);
  b.movi(tmp, 1);
  b.shl(mask, tmp, mask);
  b.shl(tmp, tmp, phase);
  b.sub(mask, mask, tmp, "lanes of the piece in its first block");
}

void TileKernel::unit_offset(const Reg& off_u, const Reg& off) {
  if (m_units == 1) m_b.mov(off_u, off);
  else m_b.mul(off_u, off, m_units);
}

// dst lanes [off_u, off_u + len_u) of the current tile = op(src lanes at the same positions
// relative to the 32-byte block of off_u). The first block is written under a mask of exactly
// the piece's lanes, the rest in counter mode, so no other lane changes. src is the UB address
// holding the block-aligned data (src_pattern: a pattern buffer read with repeat stride 0).
void TileKernel::exact(Opcode op, Dtype type, const Reg& off_u, const Reg& len_u, const Reg& src,
                       bool src_pattern) {
  KernelBuilder& b = m_b;
  const int64_t epb = kBlockBytes / m_ubytes;  // lanes per 32-byte block
  const int src_rep = src_pattern ? 0 : 8;
  Reg d = b.reg("exact: destination block");
  Reg p = b.reg("exact: phase in the block");
  Reg t = b.reg("exact: mask / rest");
  Reg u = b.reg("exact: mask temporary");
  b.shr(d, off_u, ceil_log2(epb));
  b.shl(d, d, kLog2Block);
  b.add(d, d, static_cast<int64_t>(m_current_tile), "block of the first lane");
  b.and_(p, off_u, epb - 1, "phase of the first lane");
  auto issue = [&](const Reg& dst, Opnd s, Opnd repeat) {
    switch (op) {
      case Opcode::op_vcopy:
        b.emit(op, {type, dst, s, repeat, 1, 1, 8, src_rep});
        break;
      case Opcode::op_vdup:
        b.emit(op, {type, dst, s, repeat, 1, 8});
        break;
      default:  // a VBIN accumulation: dst = dst op src
        b.emit(op, {type, dst, dst, s, repeat, 1, 1, 1, 8, 8, src_rep});
        break;
    }
  };
  first_block_mask(b, t, u, p, len_u, epb);
  b.emit(Opcode::op_set_mask, {zero_reg(), t});
  issue(d, src, 1);
  b.add(t, p, len_u);
  b.sub(t, t, epb, "lanes after the first block");
  b.if_(ge(t, 1), [&] {
    b.emit(Opcode::op_set_mask_count, {t});
    b.add(d, d, kBlockBytes);
    if (op == Opcode::op_vdup) {
      issue(d, src, 0);
    } else {
      b.add(u, src, kBlockBytes);
      issue(d, u, 0);
    }
  });
}

void TileKernel::splat(const Reg& off, const Reg& len, const Reg& value) {
  KernelBuilder& b = m_b;
  if (m_pass == Pass::kLoad) b.fail("internal: a vector write in the load pass of a batch");
  KernelBuilder::Origin o(b, "splat");
  Reg off_u = b.reg("splat: first lane"), len_u = b.reg("splat: lanes");
  unit_offset(off_u, off);
  unit_offset(len_u, len);
  if (m_units == 1) {
    if (m_wide) {
      Reg v = b.reg("splat: byte");
      b.and_(v, value, 0xff);
      exact(Opcode::op_vdup, m_unit, off_u, len_u, v, false);
    } else {
      exact(Opcode::op_vdup, m_unit, off_u, len_u, value, false);
    }
    return;
  }
  // 8-byte elements: a two-repeat pattern lo, hi, lo, hi, ... then an exact copy of it.
  Reg t = b.reg("splat: pattern");
  Reg a = b.reg_imm("splat: pattern address", static_cast<int64_t>(m_pattern));
  b.emit(Opcode::op_set_mask_count, {static_cast<int64_t>(kPatternBytes / 4)});
  b.emit(Opcode::op_vdup, {Dtype::S32, a, value, 0, 1, 8}, "pattern: low words");
  b.movi(t, static_cast<int64_t>(0xAAAAAAAAAAAAAAAAull));
  b.emit(Opcode::op_set_mask, {zero_reg(), t});
  b.shr(t, value, 32);
  b.emit(Opcode::op_vdup, {Dtype::S32, a, t, 2, 1, 8}, "pattern: high words (odd lanes)");
  exact(Opcode::op_vcopy, Dtype::S32, off_u, len_u, a, true);
}

void TileKernel::place(const Reg& off, const Reg& value) {
  KernelBuilder& b = m_b;
  if (m_pass == Pass::kLoad) b.fail("internal: a vector write in the load pass of a batch");
  const int64_t epb = kBlockBytes / m_ubytes;
  Reg d = b.reg("place: block"), p = b.reg("place: lane mask"), v = b.reg("place: value");
  b.mul(d, off, m_units);
  b.and_(p, d, epb - 1);
  b.shr(d, d, ceil_log2(epb));
  b.shl(d, d, kLog2Block);
  b.add(d, d, static_cast<int64_t>(m_current_tile));
  b.movi(v, 1);
  b.shl(p, v, p, "one-lane mask");
  b.emit(Opcode::op_set_mask, {zero_reg(), p});
  if (m_wide) {
    b.and_(v, value, 0xff);
    b.emit(Opcode::op_vdup, {m_unit, d, v, 1, 1, 8}, "one element");
  } else {
    b.emit(Opcode::op_vdup, {m_unit, d, value, 1, 1, 8}, "one element");
  }
  if (m_units == 2) {
    b.shl(p, p, 1, "the high word's lane");
    b.emit(Opcode::op_set_mask, {zero_reg(), p});
    b.shr(v, value, 32);
    b.emit(Opcode::op_vdup, {m_unit, d, v, 1, 1, 8}, "high word");
  }
}

// The lanes of the piece [off, off + len) (elements) of the tile, its phase in its first block
// (lanes) and the 32-byte blocks that hold it from that block on: what a load of the piece from
// its block phase before it brings (src_unit GM bytes per lane).
void TileKernel::piece_span(const Reg& off_u, const Reg& len_u, const Reg& phase,
                            const Reg& blocks, const Reg& off, const Reg& len, int src_unit) {
  KernelBuilder& b = m_b;
  const int64_t epb = kBlockBytes / m_ubytes;
  unit_offset(off_u, off);
  unit_offset(len_u, len);
  b.and_(phase, off_u, epb - 1);
  b.add(blocks, phase, len_u);
  b.mul(blocks, blocks, src_unit);
  b.add(blocks, blocks, kBlockBytes - 1);
  b.shr(blocks, blocks, kLog2Block);
}

void TileKernel::run_piece(const Reg& off, const Reg& len, const Reg& src, bool accumulate) {
  KernelBuilder& b = m_b;
  if (!m_opt.runs) b.fail("internal: TileKernel built without run buffers");
  const int src_unit = m_wide ? 1 : m_ubytes;  // GM bytes per lane
  Reg off_u = b.reg("run: first lane"), len_u = b.reg("run: lanes");
  {
    Reg p = b.reg("run: phase"), s = b.reg("run: load source"), n = b.reg("run: blocks"),
        a = b.reg("run: scratch");
    piece_span(off_u, len_u, p, n, off, len, src_unit);
    b.mul(s, p, src_unit);
    b.sub(s, src, s, "load from the run's block phase before it");
    b.mul(a, *m_sp, static_cast<int64_t>(m_scratch[1] - m_scratch[0]));
    b.add(a, a, static_cast<int64_t>(m_scratch[0]));
    b.wait_flag(m_scratch_free, *m_sp, "scratch free");
    b.emit(Opcode::op_copy_gm2ub, {a, s, 1, n, 0, 0}, "load the run");
    b.set_flag(m_scratch_ready, *m_sp);
    b.wait_flag(m_scratch_ready, *m_sp, "run loaded");
    if (m_wide) {
      b.add(n, p, len_u);
      vec_convert(b, Dtype::U16, Dtype::U8, static_cast<int64_t>(m_widened), a, RoundMode::kRint,
                  n);
      b.movi(a, static_cast<int64_t>(m_widened));
    }
    if (accumulate) exact(Opcode::op_vadd, device_dtype(m_opt.dtype), off_u, len_u, a, false);
    else exact(Opcode::op_vcopy, m_unit, off_u, len_u, a, false);
  }
  b.set_flag(m_scratch_free, *m_sp, "scratch read");
  b.emit(Opcode::op_xor, {*m_sp, *m_sp, 1});
}

// A partial piece of copy_run (inside one or two blocks of the tile): at once through the
// ping/pong scratch, or in a batch (the load pass loads it into the next slot, the copy pass
// copies it from that slot).
void TileKernel::partial_piece(const Reg& off, const Reg& len, const Reg& src) {
  if (m_pass == Pass::kImmediate) {
    run_piece(off, len, src, false);
    return;
  }
  KernelBuilder& b = m_b;
  Reg off_u = b.reg("piece: first lane"), len_u = b.reg("piece: lanes"),
      p = b.reg("piece: phase"), n = b.reg("piece: blocks");
  piece_span(off_u, len_u, p, n, off, len, m_ubytes);
  if (m_pass == Pass::kLoad) {
    wait_scratch_free();
    Reg s = b.reg("piece: load source");
    b.mul(s, p, m_ubytes);
    b.sub(s, src, s, "load from the piece's block phase before it");
    b.emit(Opcode::op_copy_gm2ub, {*m_slot, s, 1, n, 0, 0}, "load the piece into its slot");
  } else {
    exact(Opcode::op_vcopy, m_unit, off_u, len_u, *m_slot, false);
  }
  b.shl(n, n, kLog2Block);
  b.add(*m_slot, *m_slot, n, "the next piece's slot");
}

int64_t TileKernel::batch_bytes() const {
  if (!m_direct) return 0;
  return m_tile * m_esize + static_cast<int64_t>(kBlockBytes);  // one run scratch buffer
}

void TileKernel::begin_loads(const Reg& slot, const Reg& limit, int64_t reserve) {
  KernelBuilder& b = m_b;
  if (m_pass != Pass::kImmediate || batch_bytes() < reserve)
    b.fail("internal: a batch of partial pieces does not fit the run scratch");
  first_slot(slot);
  b.add(limit, slot, batch_bytes() - reserve, "the last slot a unit of work starts from");
  m_slot = &slot;
  m_limit = &limit;
  m_reserve = reserve;
  m_pass = Pass::kLoad;
}

void TileKernel::first_slot(const Reg& slot) {
  m_b.mul(slot, *m_sp, static_cast<int64_t>(m_scratch[1] - m_scratch[0]));
  m_b.add(slot, slot, static_cast<int64_t>(m_scratch[0]), "the batch's first slot");
}

// gap = limit - slot; the condition: no piece loaded into this batch's scratch yet.
Cond TileKernel::nothing_loaded(const Reg& gap) {
  m_b.sub(gap, *m_limit, *m_slot);
  return eq(gap, batch_bytes() - m_reserve);
}

// The scratch buffer is waited for before its first load: a batch that loads no piece (rows of
// whole blocks, rows of padding) does not touch it.
void TileKernel::wait_scratch_free() {
  Reg gap = m_b.reg("batch: limit - slot");
  m_b.if_(nothing_loaded(gap),
          [&] { m_b.wait_flag(m_scratch_free, *m_sp, "batch scratch free"); });
}

void TileKernel::begin_copies(const Label* skip_if_empty) {
  KernelBuilder& b = m_b;
  if (m_pass != Pass::kLoad) b.fail("internal: begin_copies outside a load pass");
  if (skip_if_empty) {
    Reg gap = b.reg("batch: limit - slot");
    b.branch(nothing_loaded(gap), *skip_if_empty);
  } else {
    wait_scratch_free();  // the flags below pair with end_batch's whether pieces came or not
  }
  b.set_flag(m_scratch_ready, *m_sp);
  b.wait_flag(m_scratch_ready, *m_sp, "the batch's loads done");
  first_slot(*m_slot);
  m_pass = Pass::kCopy;
}

void TileKernel::end_batch() {
  KernelBuilder& b = m_b;
  if (m_pass != Pass::kCopy) b.fail("internal: end_batch outside a copy pass");
  b.set_flag(m_scratch_free, *m_sp, "batch scratch read");
  b.emit(Opcode::op_xor, {*m_sp, *m_sp, 1});
  m_slot = m_limit = nullptr;
  m_pass = Pass::kImmediate;
}

void TileKernel::direct_piece(const Reg& off, const Reg& len, const Reg& src) {
  KernelBuilder& b = m_b;
  Reg d = b.reg("direct: tile address"), n = b.reg("direct: blocks");
  b.mul(d, off, m_esize);
  b.add(d, d, static_cast<int64_t>(m_current_tile));
  b.mul(n, len, m_esize);
  b.add(n, n, kBlockBytes - 1);
  b.shr(n, n, kLog2Block);
  b.emit(Opcode::op_copy_gm2ub, {d, src, 1, n, 0, 0}, "whole blocks straight into the tile");
}

void TileKernel::copy_run(const Reg& off, const Reg& len, const Reg& src) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, "run");
  if (!m_direct) {
    run_piece(off, len, src, false);
    return;
  }
  const bool loads = m_pass != Pass::kCopy;  // the copy pass issues no direct loads
  // Split: head [off, a) and tail [e, off + len) through the scratch, [a, e) direct, where a
  // and e are the block boundaries inside the run (e = the run's end when it ends the tile:
  // lanes past the tile's count are never stored as data).
  const int64_t epb = kBlockBytes / m_esize;  // elements per block
  Reg a = b.reg("run: first whole block"), e = b.reg("run: end of whole blocks"),
      end = b.reg("run: end");
  b.add(end, off, len);
  b.add(a, off, epb - 1);
  b.shr(a, a, ceil_log2(epb));
  b.shl(a, a, ceil_log2(epb));
  Label partial = b.label("run_end_partial"), split = b.label("run_split"),
        done = b.label("run_done");
  b.mov(e, end);
  b.branch(eq(end, cnt()), partial);
  b.shr(e, e, ceil_log2(epb));
  b.shl(e, e, ceil_log2(epb));
  b.bind(partial);
  {
    Reg t = b.reg("run: whole-block length");
    b.sub(t, e, a);
    b.branch(ge(t, epb), split);
  }
  partial_piece(off, len, src);  // no whole block inside: all through the scratch
  b.jmp(done);
  b.bind(split);
  {
    Reg t = b.reg("run: piece length"), s = b.reg("run: piece source");
    b.sub(t, a, off);
    b.if_(ne(t, 0), [&] { partial_piece(off, t, src); });
    if (loads) {
      b.sub(t, e, a);
      b.sub(s, a, off);
      b.mul(s, s, m_esize);
      b.add(s, s, src);
      direct_piece(a, t, s);
    }
    b.sub(t, end, e);
    b.if_(ne(t, 0), [&] {
      if (loads) {  // the copy pass reads the piece from its slot: no source address
        b.sub(s, e, off);
        b.mul(s, s, m_esize);
        b.add(s, s, src);
      }
      partial_piece(e, t, s);
    });
  }
  b.bind(done);
}

void TileKernel::vector_before_direct() {
  if (!m_direct) return;
  m_b.set_flag(m_vector_done, m_q, "vector writes done");
  m_b.wait_flag(m_vector_done, m_q, "before direct loads");
}

void TileKernel::accumulate_run(const Reg& off, const Reg& len, const Reg& src) {
  if (m_pass != Pass::kImmediate) m_b.fail("internal: accumulate_run inside a batch");
  KernelBuilder::Origin o(m_b, "accumulate a run");
  run_piece(off, len, src, true);
}

// UB the tile choice holds back beyond the declared buffers: four blocks, two more with the run
// scratch, one more with the widened run buffer, one more with the s64 pattern. A deliberate
// cap that keeps the tile sizes the cycle figures are measured with; at 32-byte alignment every
// buffer below is whole blocks and the layout itself needs none of it.
uint64_t TileKernel::tile_reserve_bytes() const {
  uint64_t blocks = 4;
  if (m_opt.runs) blocks += m_wide ? 3 : 2;
  if (m_units == 2) blocks += 1;
  return blocks * kBlockBytes;
}

// In tile elements, in allocation order: two lane tiles, (wide) two narrow u8 tiles, (runs) two
// scratch buffers (a piece's phase adds up to one block) and (wide) the widened run, (s64) the
// splat pattern, the body's temporaries, and the room a counter-mode repeat may overrun.
TileKernel::TileBuffers TileKernel::declare_buffers() const {
  TileBuffers d;
  d.out = d.plan.add("out tile", m_units * m_ubytes, 0, 2);
  d.narrow = d.plan.add("u8 out tile", 1, 0, 2, m_wide);
  d.scratch = d.plan.add("run scratch", m_esize, kBlockBytes, 2, m_opt.runs);
  d.widened = d.plan.add("widened run", 2, kBlockBytes, 1, m_opt.runs && m_wide);
  d.pattern = d.plan.add_fixed("s64 splat pattern", kPatternBytes, 1, m_units == 2);
  for (const auto& t : m_opt.temps) d.temps.push_back(d.plan.add(t.first, t.second, kBlockBytes));
  d.plan.add_fixed("repeat overrun slack", kRepeatBytes);
  return d;
}

// The tile: the most multiples of kTileQuantum elements whose buffers fit in the UB less
// tile_reserve_bytes(). The split: each block a range of `per` elements (whole 32-byte output
// blocks); the tile is at most `per`.
void TileKernel::plan_tiles() {
  const uint64_t ub = m_core->capacity(isa::Buf::UB);
  const uint64_t reserve = tile_reserve_bytes();
  const int64_t tile = reserve < ub ? declare_buffers().plan.fit(ub - reserve, 1, kTileQuantum,
                                                                 static_cast<int64_t>(ub))
                                    : 0;
  if (tile == 0)
    m_b.fail(
        fmt::format("not even {} elements per tile fit in the {} bytes of UB", kTileQuantum, ub));
  const int64_t granule = std::max<int64_t>(1, kBlockBytes / m_esize);  // elements per block
  m_per = round_up(ceil_div(m_n, static_cast<int64_t>(m_core->count)), granule);
  if (m_opt.out_run > 0) {  // whole runs per block, one run per tile
    if (m_opt.out_run % granule != 0 || tile < m_opt.out_run)
      m_b.fail(fmt::format("output runs of {} elements are not whole blocks or exceed a tile ({})",
                           m_opt.out_run, tile));
    m_per = round_up(m_per, m_opt.out_run);
  }
  m_block_dim = static_cast<int>(ceil_div(m_n, m_per));
  m_tile = m_opt.out_run > 0 ? m_opt.out_run : std::min(tile, m_per);
}

void TileKernel::allocate() {
  const TileBuffers d = declare_buffers();
  const BufferPlan::Placed at = d.plan.allocate(m_b, m_tile);
  m_out = at.twin(d.out);
  m_narrow = at.twin(d.narrow);
  m_scratch = at.twin(d.scratch);
  m_widened = at[d.widened];
  m_pattern = at[d.pattern];
  for (BufferPlan::Id id : d.temps) m_temps.push_back(at[id]);
}

void TileKernel::declare_args(Launch& launch) {
  for (size_t i = 0; i < m_opt.inputs.size(); ++i) {
    m_b.declare_arg(fmt::format("in{}", i), device_dtype(m_opt.inputs[i].dtype),
                    m_opt.inputs[i].shape);
    launch.args.push_back(ArgRef{ArgRef::Kind::kInput, static_cast<int>(i), 0});
  }
  m_b.declare_arg("out", device_dtype(m_opt.dtype),
                  m_opt.out_arg_shape.empty() ? m_opt.out_shape : m_opt.out_arg_shape);
  launch.args.push_back(ArgRef{ArgRef::Kind::kOutput, 0, 0});
}

void TileKernel::init_flags() {
  KernelBuilder& b = m_b;
  m_out_ready = b.flag_pair(Pipe::V, Pipe::MTE3, "output tile assembled");
  m_out_free = b.flag_pair(Pipe::MTE3, Pipe::V, "output tile stored");
  if (m_opt.runs) {
    m_scratch_ready = b.flag_pair(Pipe::MTE2, Pipe::V, "run loaded");
    m_scratch_free = b.flag_pair(Pipe::V, Pipe::MTE2, "run scratch free");
  }
  m_direct = m_opt.runs && m_opt.direct && !m_wide;
  if (m_direct) {
    m_tile_free_mte2 = b.flag_pair(Pipe::MTE3, Pipe::MTE2, "output tile stored (direct loads)");
    m_tile_loaded = b.flag_pair(Pipe::MTE2, Pipe::MTE3, "direct loads done");
    m_vector_done = b.flag_pair(Pipe::V, Pipe::MTE2, "vector writes before direct loads");
  }
}

void TileKernel::free_all_buffers() {
  KernelBuilder::Origin o(m_b, "all buffers start free");
  for (int q = 0; q < 2; ++q) {
    m_b.set_flag(m_out_free, q);
    if (m_opt.runs) m_b.set_flag(m_scratch_free, q);
    if (m_direct) m_b.set_flag(m_tile_free_mte2, q);
  }
}

// One tile of parity q: its element count, the body into the free tile, (wide) the narrowing,
// the store, and the next tile's start.
void TileKernel::emit_tile(int q, const Reg& end, const Label& drain,
                           const std::function<void(TileKernel&)>& body) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, fmt::format("tile ({})", q ? "pong" : "ping"));
  const Reg& pos = *m_pos;
  const Reg& cnt = *m_cnt;
  b.branch(ge(pos, end), drain);
  b.sub(cnt, end, pos);
  b.min(cnt, cnt, m_tile, "elements in this tile");
  b.wait_flag(m_out_free, q);
  if (m_direct) b.wait_flag(m_tile_free_mte2, q, "tile free for direct loads");
  m_current_tile = m_out[q];
  m_q = q;
  body(*this);
  if (m_wide) vec_convert(b, Dtype::U8, Dtype::U16, m_narrow[q], m_out[q], RoundMode::kRint, cnt);
  b.set_flag(m_out_ready, q);
  b.wait_flag(m_out_ready, q);
  if (m_direct) {
    b.set_flag(m_tile_loaded, q);
    b.wait_flag(m_tile_loaded, q);
  }
  store_tile(q);
  b.set_flag(m_out_free, q);
  if (m_direct) b.set_flag(m_tile_free_mte2, q);
  b.add(pos, pos, cnt);
}

// out[pos, pos + cnt) = the tile of parity q, in whole 32-byte blocks.
void TileKernel::store_tile(int q) {
  KernelBuilder& b = m_b;
  Reg dst = b.load_arg("out");
  Reg blocks = b.reg("output tile blocks");
  if (m_opt.out_run > 0 || m_opt.out_shift.input >= 0) {  // written in place
    if (m_opt.out_run > 0) {  // the tile is run pos / out_run
      b.div(blocks, *m_pos, m_opt.out_run);
      b.mul(blocks, blocks, m_opt.out_run_stride);
    } else {
      b.add(blocks, *m_pos, 0);
    }
    if (m_opt.out_shift.input >= 0) {  // the box's place in the output argument, at run time
      Reg shift = b.reg("output start read at run time");
      load_shift(shift, m_opt.out_shift);
      b.add(blocks, blocks, shift);
    }
    b.mul(blocks, blocks, m_esize);
  } else {
    b.mul(blocks, *m_pos, m_esize);
  }
  b.add(dst, dst, blocks);
  b.mul(blocks, *m_cnt, m_esize);
  b.add(blocks, blocks, kBlockBytes - 1);
  b.shr(blocks, blocks, kLog2Block);
  b.emit(Opcode::op_copy_ub2gm, {dst, m_wide ? m_narrow[q] : m_out[q], 1, blocks, 0, 0},
         "store the output tile");
}

void TileKernel::emit_drain() {
  KernelBuilder::Origin o(m_b, "drain: consume the free flags");
  for (int q = 0; q < 2; ++q) {
    m_b.wait_flag(m_out_free, q);
    if (m_opt.runs) m_b.wait_flag(m_scratch_free, q);
    if (m_direct) m_b.wait_flag(m_tile_free_mte2, q);
  }
}

Launch TileKernel::build(const std::function<void(TileKernel&)>& body,
                         const std::function<void(TileKernel&)>& prologue) {
  KernelBuilder& b = m_b;
  const isa::CoreKind kind = b.vector_core_kind();
  m_core = m_cfg.core_kind(kind);
  m_n = 1;
  for (int64_t d : m_opt.out_shape) m_n *= d;
  if (m_n <= 0) b.fail("internal: TileKernel needs a non-empty output");
  plan_tiles();

  b.begin_section(kind);
  allocate();
  Launch launch;
  declare_args(launch);
  Reg pos = b.reg("tile start"), end = b.reg("end of this block's range"),
      cnt = b.reg("tile elements");
  emit_block_range(b, pos, end, m_per, m_n);
  init_flags();
  Reg sp = b.reg_imm("run scratch parity", 0);
  free_all_buffers();
  m_pos = &pos;
  m_cnt = &cnt;
  m_sp = &sp;
  if (prologue) {
    KernelBuilder::Origin o(b, "prologue");
    prologue(*this);
  }
  Label loop = b.label("tile_loop"), drain = b.label("drain");
  b.bind(loop);
  for (int q = 0; q < 2; ++q) emit_tile(q, end, drain, body);
  b.jmp(loop);
  b.bind(drain);
  emit_drain();
  b.end();
  m_pos = m_cnt = m_sp = nullptr;
  launch.summary =
      fmt::format("{}: {} elements of {}, {} blocks of {}, tile {} elements", m_opt.kernel_name,
                  m_n, data_type_name(m_opt.dtype), m_block_dim, m_per, m_tile);
  launch.block_dim = m_block_dim;
  launch.kernel = b.finish();
  return launch;
}

// ---- views ----

int64_t dims_product(const std::vector<int64_t>& shape, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < std::min(to, shape.size()); ++i) p *= shape[i];
  return p;
}

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> s(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) s[i - 1] = s[i] * shape[i];
  return s;
}

void StridedView::simplify() {
  std::vector<int64_t> d, s;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == 1) continue;
    if (!d.empty() && s.back() == strides[i] * dims[i]) {
      d.back() *= dims[i];
      s.back() = strides[i];
      continue;
    }
    d.push_back(dims[i]);
    s.push_back(strides[i]);
  }
  if (d.empty()) {
    d = {1};
    s = {1};
  }
  dims = std::move(d);
  strides = std::move(s);
}

AsmRegion full_region(const AssembleSpec& spec, int input, int64_t offset,
                      const std::vector<int64_t>& row_strides, int64_t col_stride) {
  AsmRegion r;
  for (size_t d = 0; d < spec.rows.size(); ++d) {
    AsmRowMap m;
    m.hi = spec.rows[d];
    m.stride = d < row_strides.size() ? row_strides[d] : 0;
    r.rows.push_back(m);
  }
  r.col_hi = spec.width;
  r.col_stride = col_stride;
  r.input = input;
  r.offset = offset;
  return r;
}

AssembleSpec view_spec(const std::string& kernel_name, DataType dtype,
                       const std::vector<int64_t>& in_shape,
                       const std::vector<int64_t>& out_shape, StridedView view) {
  view.simplify();
  AssembleSpec spec;
  spec.kernel_name = kernel_name;
  spec.dtype = dtype;
  spec.inputs = {TensorDesc{dtype, in_shape}};
  spec.out_shape = out_shape;
  spec.rows.assign(view.dims.begin(), view.dims.end() - 1);
  spec.width = view.dims.back();
  std::vector<int64_t> row_strides(view.strides.begin(), view.strides.end() - 1);
  spec.regions.push_back(full_region(spec, 0, view.offset, row_strides, view.strides.back()));
  return spec;
}

// ---- the assembly kernel ----

namespace {

bool is_run_region(const AsmRegion& r) {
  return r.input >= 0 && r.col_step == 1 && r.col_stride == 1 &&
         r.col_hi - r.col_lo >= kMinRunElems;
}

bool region_gathers(const AsmRegion& r) {
  return std::any_of(r.rows.begin(), r.rows.end(), [](const AsmRowMap& m) { return m.index >= 0; });
}

// The columns a region may write in some row: [col_lo, col_hi) moved by its column shift.
std::pair<int64_t, int64_t> region_columns(const AsmRegion& r) {
  const int64_t reach = r.col_shift.input >= 0 ? r.col_shift.max * r.col_shift.scale : 0;
  return {r.col_lo, r.col_hi + reach};
}

// Whether batching keeps the regions' order (TileKernel::begin_loads): a batch does every load
// (the runs' whole blocks) before every vector write (partial pieces, splats, elements), so no
// region written by the vector unit may lie under a later run region's whole blocks. Holds when
// every region before a run region either has no column in common with it, or is a plain run
// region (no gather, no column shift) whose columns cover it: its vector writes are its partial
// end blocks, outside the later region's whole blocks.
bool batch_keeps_order(const AssembleSpec& spec) {
  for (size_t j = 0; j < spec.regions.size(); ++j) {
    if (!is_run_region(spec.regions[j])) continue;
    const auto [jlo, jhi] = region_columns(spec.regions[j]);
    for (size_t i = 0; i < j; ++i) {
      const AsmRegion& ri = spec.regions[i];
      const auto [ilo, ihi] = region_columns(ri);
      if (ihi <= jlo || jhi <= ilo) continue;
      const bool covers = ilo <= jlo && jhi <= ihi;
      if (!is_run_region(ri) || region_gathers(ri) || ri.col_shift.input >= 0 || !covers)
        return false;
    }
  }
  return true;
}

class Assembler {
 public:
  // batch: the runs' partial blocks of as many rows as the run scratch holds go behind one flag
  // (TileKernel::begin_loads); false: each partial block behind its own flag.
  Assembler(const AssembleSpec& spec, TileKernel& k, bool batch) : m_spec(spec), m_k(k) {
    const size_t rank = spec.rows.size();
    m_rows = spec.rows;
    m_below.assign(rank, 1);
    for (size_t d = rank; d-- > 1;) m_below[d - 1] = m_below[d] * m_rows[d];
    int64_t runs = 0;
    for (const AsmRegion& r : spec.regions) runs += is_run_region(r) ? 1 : 0;
    m_row_batch_bytes = runs * TileKernel::kBatchBytesPerRun;
    m_batch = batch && runs > 0 && m_k.batch_bytes() >= m_row_batch_bytes &&
              batch_keeps_order(spec);
    m_runs_only = !spec.regions.empty();
    for (const AsmRegion& r : spec.regions)
      m_runs_only = m_runs_only && is_run_region(r) && !region_gathers(r);
  }

  void tile() {
    KernelBuilder& b = m_k.b();
    if (m_spec.background) {
      KernelBuilder::Origin o(b, "background fill");
      Reg v = fill_value(*m_spec.background);
      Reg zero = b.reg_imm("tile start", 0);
      m_k.splat(zero, m_k.cnt(), v);
      m_k.vector_before_direct();
    }
    const int64_t w = m_spec.width;
    Reg row = b.reg("row"), row_end = b.reg("end row");
    b.div(row, m_k.pos(), w, "first row of the tile");
    b.add(row_end, m_k.pos(), m_k.cnt());
    b.add(row_end, row_end, w - 1);
    b.div(row_end, row_end, w, "end row of the tile");
    if (m_batch) {
      batched_rows(row, row_end);
      return;
    }
    Label top = b.label("row_loop");
    b.bind(top);
    row_regions(row);
    b.add(row, row, 1);
    b.branch(lt(row, row_end), top);
  }

 private:
  // Every region's piece of one row.
  void row_regions(const Reg& row) {
    KernelBuilder& b = m_k.b();
    Reg rs = b.reg("row start in the tile");
    b.mul(rs, row, m_spec.width);
    b.sub(rs, rs, m_k.pos(), "row start relative to the tile");
    for (size_t r = 0; r < m_spec.regions.size(); ++r) region(r, row, rs);
  }

  // The rows [row, row_end) in batches: the load pass takes rows while the scratch holds
  // another row's partial blocks, the copy pass writes the same rows.
  void batched_rows(const Reg& row, const Reg& row_end) {
    KernelBuilder& b = m_k.b();
    KernelBuilder::Origin o(b, "batched rows");
    Reg first = b.reg("batch: first row"), last = b.reg("batch: end row"),
        slot = b.reg("batch: next slot"), limit = b.reg("batch: last slot for a row");
    Label batch = b.label("batch_loop"), loads = b.label("batch_loads"),
          loaded = b.label("batch_loaded"), copies = b.label("batch_copies");
    b.bind(batch);
    b.mov(first, row);
    m_k.begin_loads(slot, limit, m_row_batch_bytes);
    b.bind(loads);
    row_regions(row);
    b.add(row, row, 1);
    b.branch(ge(row, row_end), loaded);
    b.branch(ge(limit, slot), loads);
    b.bind(loaded);
    // Every region a plain run and no partial piece loaded (rows of whole blocks or of padding
    // only): the copy pass would write nothing, the batch ends with its loads.
    Label copied = b.label("batch_copied");
    m_k.begin_copies(m_runs_only ? &copied : nullptr);
    b.mov(last, row);
    b.mov(row, first);
    b.bind(copies);
    row_regions(row);
    b.add(row, row, 1);
    b.branch(lt(row, last), copies);
    m_k.end_batch();
    b.bind(copied);
    b.branch(lt(row, row_end), batch);
  }

  Reg fill_value(const AsmFill& f) {
    KernelBuilder& b = m_k.b();
    Reg v = b.reg("fill value");
    if (f.input >= 0) {
      Reg a = m_k.input_addr(f.input);
      m_k.load_element(v, a);
    } else {
      b.movi(v, static_cast<int64_t>(f.bits));
    }
    return v;
  }

  void region(size_t ri, const Reg& row, const Reg& rs) {
    KernelBuilder& b = m_k.b();
    const AsmRegion& r = m_spec.regions[ri];
    if (m_k.loading() && !is_run_region(r)) return;  // nothing to load: written in the copy pass
    KernelBuilder::Origin o(b, fmt::format("region {}", ri));
    const int esize = m_k.elem_bytes();
    Label skip = b.label("region_skip");
    const bool gathers = region_gathers(r);
    Reg src = b.reg_imm("region: source element", r.offset);
    Reg bad;
    if (gathers) bad = b.reg_imm("region: an index is out of range", 0);
    {
      Reg i = b.reg("region: row index"), t = b.reg("region: temporary");
      for (size_t d = 0; d < m_rows.size(); ++d) {
        const AsmRowMap& m = r.rows[d];
        const bool shifted = m.shift.input >= 0;
        const bool restricted = shifted || m.lo > 0 || m.hi < m_rows[d] || m.step > 1;
        if (!restricted && m.stride == 0 && m.index < 0) continue;
        if (m_below[d] == 1) b.mov(i, row);
        else b.div(i, row, m_below[d]);
        if (d > 0) b.rem(i, i, m_rows[d], fmt::format("index in row dim {}", d));
        if (shifted) {
          load_shift(t, m.shift);
          b.add(t, t, m.lo, fmt::format("first row of dim {} at run time", d));
          b.branch(lt(i, t), skip);
          b.sub(i, i, t);
          b.branch(ge(i, m.hi - m.lo), skip);
        }
        if (restricted) {
          if (!shifted) {
            if (m.lo > 0) b.branch(lt(i, m.lo), skip);
            if (m.hi < m_rows[d]) b.branch(ge(i, m.hi), skip);
            if (m.lo > 0) b.sub(i, i, m.lo);
          }
          if (m.step > 1) {
            b.rem(t, i, m.step);
            b.branch(ne(t, 0), skip);
            b.div(i, i, m.step);
          }
        }
        if (m.index >= 0) {
          const TensorDesc& idx = m_spec.inputs[static_cast<size_t>(m.index)];
          Reg a = m_k.input_addr(m.index);
          b.mul(t, i, data_type_bytes(idx.dtype));
          b.add(t, t, a);
          m_k.load_index(i, t, idx.dtype);
          Label ok = b.label("index_ok"), out = b.label("index_out_of_range");
          b.branch(lt(i, 0), out);
          b.branch(lt(i, m.index_bound), ok);
          b.bind(out);
          b.movi(bad, 1);
          b.movi(i, 0);
          b.bind(ok);
        }
        if (m.stride != 0) {
          b.mul(t, i, m.stride);
          b.add(src, src, t);
        }
      }
    }
    // Columns of this row inside the tile: [cl, ch) of the region's [col_lo, col_hi).
    Reg cl = b.reg("region: first column"), ch = b.reg("region: end column");
    if (r.col_shift.input >= 0) {
      if (r.col_step != 1)
        b.fail("internal: a region's column shift needs col_step 1");
      shifted_columns(r, rs, cl, ch, src);
    } else {
      b.emit(Opcode::op_sub, {cl, zero_reg(), rs});
      b.max(cl, cl, r.col_lo);
      b.sub(ch, m_k.cnt(), rs);
      b.min(ch, ch, r.col_hi);
    }
    if (r.col_step > 1) {
      Reg t = b.reg("region: column step");
      b.sub(t, cl, r.col_lo);
      b.add(t, t, r.col_step - 1);
      b.div(t, t, r.col_step);
      b.mul(t, t, r.col_step);
      b.add(cl, t, r.col_lo, "first column on the step");
    }
    b.branch(ge(cl, ch), skip);
    Reg off = b.reg("region: tile offset");
    b.add(off, rs, cl);
    if (r.input >= 0 && r.col_stride != 0 && r.col_shift.input < 0) {
      Reg t = b.reg("region: column term");
      b.sub(t, cl, r.col_lo);
      if (r.col_step > 1) b.div(t, t, r.col_step);
      b.mul(t, t, r.col_stride);
      b.add(src, src, t);
    }
    if (gathers) {
      Label normal = b.label("index_in_range");
      b.branch(eq(bad, 0), normal);
      if (!m_k.loading()) fill_piece(r, r.fill, off, cl, ch);
      b.jmp(skip);
      b.bind(normal);
    }
    if (r.input < 0) {
      fill_piece(r, r.fill, off, cl, ch);
    } else {
      Reg a = m_k.input_addr(r.input);
      b.mul(src, src, esize);
      b.add(src, src, a, "source byte address");
      source_piece(r, off, cl, ch, src);
    }
    b.bind(skip);
  }

  void load_shift(const Reg& v, const AsmShift& s) { m_k.load_shift(v, s); }

  // The columns [cl, ch) of this row inside the tile for a region placed at run time:
  // [col_lo + s, col_hi + s) with s = the column shift; the column term of the source
  // ((cl - col_lo - s) * col_stride) is added to src.
  void shifted_columns(const AsmRegion& r, const Reg& rs, const Reg& cl, const Reg& ch,
                       const Reg& src) {
    KernelBuilder& b = m_k.b();
    Reg lo = b.reg("region: first column at run time");
    load_shift(lo, r.col_shift);
    b.add(lo, lo, r.col_lo);
    b.emit(Opcode::op_sub, {cl, zero_reg(), rs});
    b.max(cl, cl, lo);
    b.sub(ch, m_k.cnt(), rs);
    Reg hi = b.reg("region: end column at run time");
    b.add(hi, lo, r.col_hi - r.col_lo);
    b.min(ch, ch, hi);
    if (r.input >= 0 && r.col_stride != 0) {
      b.sub(hi, cl, lo, "region: column term");
      b.mul(hi, hi, r.col_stride);
      b.add(src, src, hi);
    }
  }

  void fill_piece(const AsmRegion& r, const AsmFill& f, const Reg& off, const Reg& cl,
                  const Reg& ch) {
    KernelBuilder& b = m_k.b();
    Reg v = fill_value(f);
    if (r.col_step == 1) {
      Reg len = b.reg("fill: length");
      b.sub(len, ch, cl);
      m_k.splat(off, len, v);
      return;
    }
    Reg e = b.reg("fill: end offset"), o = b.reg("fill: offset");
    b.sub(e, ch, cl);
    b.add(e, e, off);
    b.mov(o, off);
    Label top = b.label("fill_elements");
    b.bind(top);
    m_k.place(o, v);
    b.add(o, o, r.col_step);
    b.branch(lt(o, e), top);
  }

  void source_piece(const AsmRegion& r, const Reg& off, const Reg& cl, const Reg& ch,
                    const Reg& src) {
    KernelBuilder& b = m_k.b();
    const int esize = m_k.elem_bytes();
    if (r.col_step == 1 && r.col_stride == 1 && r.col_hi - r.col_lo >= kMinRunElems) {
      Reg len = b.reg("run: length");
      b.sub(len, ch, cl);
      m_k.copy_run(off, len, src);
      return;
    }
    if (r.col_step == 1 && r.col_stride == 0) {
      KernelBuilder::Origin o(b, "broadcast element");
      Reg v = b.reg("broadcast value"), len = b.reg("broadcast length");
      m_k.load_element(v, src);
      b.sub(len, ch, cl);
      m_k.splat(off, len, v);
      return;
    }
    KernelBuilder::Origin o(b, "element by element");
    Reg e = b.reg("elements: end offset"), v = b.reg("elements: value");
    Reg step = b.reg_imm("elements: source step in bytes", r.col_stride * esize);
    b.sub(e, ch, cl);
    b.add(e, e, off);
    Label top = b.label("elements");
    b.bind(top);
    m_k.load_element(v, src);
    m_k.place(off, v);
    b.add(src, src, step);
    b.add(off, off, r.col_step);
    b.branch(lt(off, e), top);
  }

  const AssembleSpec& m_spec;
  TileKernel& m_k;
  std::vector<int64_t> m_rows, m_below;
  int64_t m_row_batch_bytes = 0;  // the most scratch bytes one row's partial blocks take
  bool m_batch = false;
  bool m_runs_only = false;  // every region a run (no gather): the copy pass writes only pieces
};

bool spec_uses_runs(const AssembleSpec& spec) {
  return std::any_of(spec.regions.begin(), spec.regions.end(), is_run_region);
}

// NPUSIM_ASSEMBLE_BATCHED_PIECES: unset, empty or "1", the runs' partial blocks are batched
// (Assembler); "0", each behind its own flag (for comparison). Anything else is a CompileError.
bool batched_pieces(const std::string& op) {
  const char* v = std::getenv("NPUSIM_ASSEMBLE_BATCHED_PIECES");
  if (!v || !*v) return true;
  const std::string_view value(v);
  if (value == "0") return false;
  if (value == "1") return true;
  throw CompileError(
      fmt::format("{}: NPUSIM_ASSEMBLE_BATCHED_PIECES='{}' is neither '0' nor '1'", op, v));
}

}  // namespace

Launch build_assemble_kernel(const std::string& op, const AssembleSpec& spec,
                             const ChipConfig& cfg) {
  if (spec.width <= 0) throw CompileError(op + ": internal: assemble width must be positive");
  for (const AsmRegion& r : spec.regions)
    if (r.rows.size() != spec.rows.size())
      throw CompileError(op + ": internal: a region's row maps do not match the rows");
  TileKernel::Options opt;
  opt.kernel_name = spec.kernel_name;
  opt.dtype = spec.dtype;
  opt.inputs = spec.inputs;
  opt.out_shape = spec.out_shape;
  opt.out_arg_shape = spec.out_arg_shape;
  opt.out_shift = spec.out_shift;
  opt.out_run = spec.out_run;
  opt.out_run_stride = spec.out_run_stride;
  opt.runs = spec_uses_runs(spec);
  const bool batch = batched_pieces(op);
  TileKernel k(op, opt, cfg);
  AssembleSpec normalized = spec;
  if (normalized.rows.empty()) {
    normalized.rows = {1};
    for (AsmRegion& r : normalized.regions) r.rows = {AsmRowMap{0, 1, 1, 0, -1, 0, {}}};
  }
  Launch l = k.build([&](TileKernel& tk) {
    Assembler a(normalized, tk, batch);
    a.tile();
  });
  return l;
}

}  // namespace npusim::compiler::ops
