#include "adapter/compiler/ops/elementwise.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <fmt/format.h>

#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;
using isa::Pipe;
using layout::kBlockBytes;

namespace {

using vec::kRepeatBytes;  // one vector repeat: 8 blocks of 32 bytes (isa.def)
constexpr int64_t kTileQuantum = 128;  // tiles are whole multiples of 128 elements
constexpr int kLog2Block = 5;          // log2(kBlockBytes)

// The u16 / s32 view used to move elements of a size without interpreting them.
Dtype bits_type(int elem_bytes) {
  return elem_bytes == 4 ? Dtype::S32 : Dtype::U16;
}

}  // namespace

// ---- broadcast views ----

bool BroadcastView::identity() const {
  return dims.empty() || (dims.size() == 1 && strides[0] == 1);
}

bool BroadcastView::splat() const {
  return !dims.empty() &&
         std::all_of(strides.begin(), strides.end(), [](int64_t s) { return s == 0; });
}

int64_t BroadcastView::period() const {
  return dims.size() == 2 && strides[0] == 0 && strides[1] == 1 ? dims[1] : 0;
}

BroadcastView broadcast_view(const std::vector<int64_t>& in_shape,
                             const std::vector<int64_t>& out_shape) {
  const size_t rank = out_shape.size();
  if (in_shape.size() > rank) throw Error("broadcast_view: input rank exceeds output rank");
  std::vector<int64_t> in(rank - in_shape.size(), 1);
  in.insert(in.end(), in_shape.begin(), in_shape.end());
  std::vector<int64_t> natural(rank, 1);
  for (size_t i = rank; i-- > 1;) natural[i - 1] = natural[i] * in[i];
  BroadcastView v;
  for (size_t i = 0; i < rank; ++i) {
    if (out_shape[i] == 1) continue;
    const int64_t d = out_shape[i];
    const int64_t s = in[i] == 1 ? 0 : natural[i];
    if (!v.dims.empty()) {
      int64_t& D = v.dims.back();
      int64_t& S = v.strides.back();
      if ((S == 0 && s == 0) || (s != 0 && S == s * d)) {
        D *= d;
        S = s;
        continue;
      }
    }
    v.dims.push_back(d);
    v.strides.push_back(s);
  }
  return v;
}

// ---- vector helpers ----

void vec_binary(KernelBuilder& b, Opcode op, Dtype t, Opnd dst, Opnd src0, Opnd src1,
                const Reg& count) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(op, {t, dst, src0, src1, 0, 1, 1, 1, 8, 8, 8});
}

void vec_unary(KernelBuilder& b, Opcode op, Dtype t, Opnd dst, Opnd src, const Reg& count) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(op, {t, dst, src, 0, 1, 1, 8, 8});
}

void vec_scalar(KernelBuilder& b, Opcode op, Dtype t, Opnd dst, Opnd src, const Reg& scalar,
                const Reg& count) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(op, {t, dst, src, scalar, 0, 1, 1, 8, 8});
}

void vec_convert(KernelBuilder& b, Dtype dst_type, Dtype src_type, Opnd dst, Opnd src,
                 RoundMode round, const Reg& count) {
  // Lanes per repeat = 256 / the wider element; each operand advances lanes * size bytes.
  const int dsz = isa::dtype_size(dst_type), ssz = isa::dtype_size(src_type);
  const int lanes = kRepeatBytes / std::max(dsz, ssz);
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vconv, {dst_type, src_type, dst, src, 0, 1, 1, lanes * dsz / kBlockBytes,
                            lanes * ssz / kBlockBytes, static_cast<int64_t>(round)});
}

void vec_dup_bits(KernelBuilder& b, int elem_bytes, Opnd dst, Opnd bits, Opnd count) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vdup, {bits_type(elem_bytes), dst, bits, 0, 1, 8});
}

void vec_copy_bits(KernelBuilder& b, int elem_bytes, Opnd dst, Opnd src, Opnd count) {
  if (elem_bytes == 1) {
    // No 8-bit vcopy: move byte pairs as u16. An odd count writes one byte past the range
    // (callers' UB tiles are whole multiples of 128 elements, so it stays in the buffer).
    if (count.kind() == Opnd::Kind::kImm) {
      vec_copy_bits(b, 2, dst, src, (count.value() + 1) / 2);
      return;
    }
    Reg pairs = b.reg("byte pairs");
    b.emit(Opcode::op_add, {pairs, count, 1});
    b.shr(pairs, pairs, 1);
    vec_copy_bits(b, 2, dst, src, pairs);
    return;
  }
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vcopy, {bits_type(elem_bytes), dst, src, 0, 1, 1, 8, 8});
}

void vec_compare(KernelBuilder& b, Dtype t, isa::Cmp cmp, Opnd bits, Opnd src0, Opnd src1,
                 const Reg& count, bool src1_const) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vcmp, {t, cmp, bits, src0, src1, 0, 1, 1, 8, src1_const ? 0 : 8});
}

void vec_select(KernelBuilder& b, Dtype t, Opnd dst, Opnd src0, Opnd src1, Opnd bits,
                const Reg& count, bool src0_const, bool src1_const) {
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vsel, {t, dst, src0, src1, bits, 0, 1, 1, 1, 8, src0_const ? 0 : 8,
                           src1_const ? 0 : 8});
}

void vec_fill_repeat(KernelBuilder& b, Dtype t, uint64_t dst, double value) {
  Reg bits = b.reg("constant");
  Reg count = b.reg_imm("constant lanes", kRepeatBytes / isa::dtype_size(t));
  b.movi(bits, vector_scalar_bits(t, value));
  b.emit(Opcode::op_set_mask_count, {count});
  b.emit(Opcode::op_vdup, {t, dst, bits, 0, 1, 8});
}

int64_t vector_scalar_bits(Dtype t, double value) {
  if (isa::dtype_is_float(t)) return static_cast<int64_t>(f32_to_bits(static_cast<float>(value)));
  return static_cast<int64_t>(value);
}

// ---- the streaming kernel ----

namespace {

enum class Access { kFlat, kResident, kGather };

struct InputPlan {
  Access access = Access::kFlat;
  int size = 0;       // bytes per element
  int64_t period = 0; // kResident: the broadcast period (1 for a splat)
  uint64_t buf[2] = {0, 0};  // UB tiles (kResident: buf[0] only)
};

// Everything the tile loop and the gathers share.
struct StreamState {
  const StreamSpec& spec;
  std::vector<InputPlan> in;
  uint64_t scratch = 0;     // gather scratch (UB), when any input needs a contiguous piece
  int scratch_free = -1;    // flag v -> mte2: scratch may be overwritten
  int scratch_ready = -1;   // flag mte2 -> v: scratch loaded
};

bool needs_scratch(const BroadcastView& v) {
  return !v.dims.empty() && v.strides.back() != 0;  // pieces are contiguous runs
}

// Fills UB [buf, buf + cnt*size) with input k's values for output positions [pos, pos + cnt),
// pieces from last to first (see elementwise.h). buf must hold output position pos at a 32-byte
// boundary (tiles start at multiples of the output granule).
void emit_gather(KernelBuilder& b, const StreamState& st, int k, const Reg& in_addr,
                 uint64_t buf, const Reg& pos, const Reg& cnt) {
  const BroadcastView& v = st.spec.inputs[static_cast<size_t>(k)].view;
  const int size = st.in[static_cast<size_t>(k)].size;
  const int log2_epb = ceil_log2(kBlockBytes / size);  // elements per 32-byte block
  const size_t rank = v.dims.size();
  const int64_t inner = v.dims.back();
  const bool contiguous = v.strides.back() != 0;
  // nonzero_below[d]: some outer dim before d has a nonzero stride (the row index must still be
  // divided down to reach it).
  std::vector<bool> nonzero_below(rank, false);
  for (size_t d = 1; d < rank; ++d)
    nonzero_below[d] = nonzero_below[d - 1] || v.strides[d - 1] != 0;
  KernelBuilder::Origin origin(b, fmt::format("gather in{}: dims {} strides {}", k,
                                              shape_str(v.dims), shape_str(v.strides)));
  Reg f = b.reg("gather: end of the piece");
  Reg row = b.reg("gather: row / offsets");
  Reg a = b.reg("gather: start of the piece");
  Reg src = b.reg("gather: source address");
  Reg t = b.reg("gather: temporary");
  Reg rest = b.reg("gather: row index / destination");
  b.add(f, pos, cnt, "gather: pieces from the end of the tile");
  Label top = b.label("gather_in" + std::to_string(k));
  b.bind(top);
  b.sub(row, f, 1);
  b.div(row, row, inner, "row = (piece end - 1) / inner dim");
  b.mov(src, in_addr);
  if (rank >= 2 && nonzero_below[rank - 1]) {
    // src += sum over outer dims d of (index_d * stride_d) * size, innermost outer dim first.
    b.mov(rest, row);
    for (size_t d = rank - 1; d-- > 0;) {
      if (v.strides[d] != 0) {
        b.rem(t, rest, v.dims[d], fmt::format("index in dim {}", d));
        b.mul(t, t, v.strides[d] * size);
        b.add(src, src, t);
      }
      if (!nonzero_below[d]) break;
      b.div(rest, rest, v.dims[d]);
    }
  }
  b.mul(row, row, inner, "row start");
  b.max(a, row, pos, "piece start = max(row start, tile start)");
  if (contiguous) {
    b.sub(t, a, row);
    b.mul(t, t, size);
    b.add(src, src, t, "source of the piece start");
  }
  b.sub(t, a, pos, "piece start in the tile");
  b.shr(rest, t, log2_epb);
  b.shl(rest, rest, log2_epb, "rounded down to a 32-byte block");
  if (contiguous) {
    b.sub(t, t, rest);
    b.mul(t, t, size);
    b.sub(src, src, t, "load from the block start: the piece lands at its phase");
  }
  b.sub(f, f, pos);
  b.sub(f, f, rest, "elements from the block start to the piece end");
  b.mul(rest, rest, size);
  b.add(rest, rest, buf, "destination in the tile");
  if (contiguous) {
    b.mul(t, f, size);
    b.add(t, t, kBlockBytes - 1);
    b.shr(t, t, kLog2Block, "blocks to load");
    b.wait_flag(Pipe::V, Pipe::MTE2, st.scratch_free, "gather scratch free");
    b.emit(Opcode::op_copy_gm2ub, {st.scratch, src, 1, t, 0, 0}, "load the piece");
    b.set_flag(Pipe::MTE2, Pipe::V, st.scratch_ready);
    b.wait_flag(Pipe::MTE2, Pipe::V, st.scratch_ready);
    vec_copy_bits(b, size, rest, st.scratch, f);
    b.set_flag(Pipe::V, Pipe::MTE2, st.scratch_free);
  } else {
    b.emit(Opcode::op_ld, {t, src}, "the broadcast element (low bits)");
    vec_dup_bits(b, size, rest, t, f);
  }
  b.mov(f, a);
  b.branch(lt(pos, f), top);
}

// Tile elements for the given accesses, or 0 if not even kTileQuantum elements fit.
int64_t tile_elems(const StreamSpec& spec, const std::vector<InputPlan>& in, uint64_t ub_bytes) {
  double per_elem = 2.0 * isa::dtype_size(spec.out_type);
  uint64_t fixed = 0;
  int buffers = 2;
  int scratch_size = 0;
  for (size_t k = 0; k < in.size(); ++k) {
    per_elem += (in[k].access == Access::kResident ? 1 : 2) * in[k].size;
    buffers += in[k].access == Access::kResident ? 1 : 2;
    if (in[k].access != Access::kFlat && needs_scratch(spec.inputs[k].view))
      scratch_size = std::max(scratch_size, in[k].size);
  }
  if (scratch_size) {
    per_elem += scratch_size;
    fixed += kBlockBytes;  // a piece's phase adds up to one block
    ++buffers;
  }
  for (const TempSpec& t : spec.temps) {
    per_elem += t.bytes_per_element;
    fixed += t.fixed_bytes;
    ++buffers;
  }
  fixed += static_cast<uint64_t>(buffers) * kBlockBytes;  // alignment slack per buffer
  if (fixed >= ub_bytes) return 0;
  int64_t t = static_cast<int64_t>(static_cast<double>(ub_bytes - fixed) / per_elem);
  return t / kTileQuantum * kTileQuantum;
}

}  // namespace

Launch build_stream_kernel(const std::string& op, const StreamSpec& spec, const ChipConfig& cfg) {
  KernelBuilder b(spec.kernel_name, op, cfg);
  const isa::CoreKind kind = b.vector_core_kind();
  const CoreKindConfig& core = *cfg.core_kind(kind);
  int64_t n = 1;
  for (int64_t d : spec.out_shape) n *= d;
  if (n <= 0) b.fail("internal: build_stream_kernel needs a non-empty output");
  const int osize = isa::dtype_size(spec.out_type);
  const int64_t granule = kBlockBytes / osize;  // output elements per 32-byte block

  // Input access plans; resident periods must divide the tile, so demote the longest period to
  // a gather until they do.
  StreamState st{spec, {}, 0, -1, -1};
  for (const StreamInput& in : spec.inputs) {
    InputPlan p;
    p.size = isa::dtype_size(in.type);
    if (in.view.identity()) {
      p.access = Access::kFlat;
    } else if (in.view.splat() || in.view.period() > 0) {
      p.access = Access::kResident;
      p.period = in.view.splat() ? 1 : in.view.period();
    } else {
      p.access = Access::kGather;
    }
    if (p.access != Access::kFlat && p.size == 1)
      b.fail("broadcasting a 1-byte input is not supported yet");
    st.in.push_back(p);
  }
  const uint64_t ub = core.capacity(isa::Buf::UB);
  int64_t tile = 0, period = granule;
  for (;;) {
    tile = tile_elems(spec, st.in, ub);
    period = granule;
    InputPlan* longest = nullptr;
    for (InputPlan& p : st.in) {
      if (p.access != Access::kResident) continue;
      period = std::lcm(period, p.period);
      if (!longest || p.period > longest->period) longest = &p;
    }
    if (tile == 0) b.fail(fmt::format("not even {} elements per tile fit in the {} bytes of UB",
                                      kTileQuantum, ub));
    if (period <= tile) break;
    longest->access = Access::kGather;  // its period does not fit a tile: gather it per tile
  }
  tile = tile / period * period;
  // Work split: each block takes `per` elements (whole periods and 32-byte output blocks).
  const int64_t cores = core.count;
  const int64_t per = round_up(ceil_div(n, cores), period);
  const int block_dim = static_cast<int>(ceil_div(n, per));
  tile = std::min(tile, per);

  // Buffers.
  b.begin_section(kind);
  for (size_t k = 0; k < spec.inputs.size(); ++k) {
    InputPlan& p = st.in[k];
    for (int q = 0; q < (p.access == Access::kResident ? 1 : 2); ++q)
      p.buf[q] = b.alloc(isa::Buf::UB, static_cast<uint64_t>(tile * p.size),
                         fmt::format("in{} tile {}", k, q));
  }
  uint64_t out_buf[2];
  for (int q = 0; q < 2; ++q)
    out_buf[q] = b.alloc(isa::Buf::UB, static_cast<uint64_t>(tile * osize),
                         fmt::format("out tile {}", q));
  int scratch_size = 0;
  bool any_flat = false;
  for (size_t k = 0; k < st.in.size(); ++k) {
    if (st.in[k].access == Access::kFlat) any_flat = true;
    else if (needs_scratch(spec.inputs[k].view))
      scratch_size = std::max(scratch_size, st.in[k].size);
  }
  if (scratch_size)
    st.scratch = b.alloc(isa::Buf::UB, static_cast<uint64_t>(tile * scratch_size) + kBlockBytes,
                         "gather scratch");
  std::vector<uint64_t> temp;
  for (const TempSpec& t : spec.temps)
    temp.push_back(b.alloc(isa::Buf::UB,
                           static_cast<uint64_t>(std::ceil(static_cast<double>(tile) *
                                                           t.bytes_per_element)) +
                               t.fixed_bytes,
                           t.name));

  // Arguments and this block's range [pos, end).
  Launch launch;
  std::vector<Reg> in_addr;
  for (size_t k = 0; k < spec.inputs.size(); ++k) {
    b.declare_arg(fmt::format("in{}", k), spec.inputs[k].type, spec.inputs[k].shape);
    launch.args.push_back(ArgRef{ArgRef::Kind::kInput, static_cast<int>(k), 0});
  }
  b.declare_arg("out", spec.out_type, spec.out_shape);
  launch.args.push_back(ArgRef{ArgRef::Kind::kOutput, 0, 0});
  for (size_t k = 0; k < spec.inputs.size(); ++k)
    in_addr.push_back(b.load_arg(fmt::format("in{}", k)));
  Reg out_addr = b.load_arg("out");
  Reg pos = b.reg("tile start");
  Reg end = b.reg("end of this block's range");
  Reg cnt = b.reg("tile elements");
  {
    KernelBuilder::Origin o(b, fmt::format("block range: {} elements per block", per));
    b.emit(Opcode::op_get_block_id, {pos});
    b.mul(pos, pos, per);
    b.add(end, pos, per);
    b.min(end, end, n);
  }

  // Flags.
  FlagPair in_free, in_ready;
  if (any_flat) {
    in_free = b.flag_pair(Pipe::V, Pipe::MTE2, "input tile free");
    in_ready = b.flag_pair(Pipe::MTE2, Pipe::V, "input tile loaded");
  }
  FlagPair out_ready = b.flag_pair(Pipe::V, Pipe::MTE3, "output tile computed");
  FlagPair out_free = b.flag_pair(Pipe::MTE3, Pipe::V, "output tile stored");
  if (scratch_size) {
    st.scratch_free = b.flag(Pipe::V, Pipe::MTE2, "gather scratch free");
    st.scratch_ready = b.flag(Pipe::MTE2, Pipe::V, "gather scratch loaded");
  }
  {
    KernelBuilder::Origin o(b, "all buffers start free");
    for (int q = 0; q < 2; ++q) {
      if (any_flat) b.set_flag(in_free, q);
      b.set_flag(out_free, q);
    }
    if (scratch_size) b.set_flag(Pipe::V, Pipe::MTE2, st.scratch_free);
  }

  // Resident inputs: one period (or, for a splat, the whole tile) gathered, then doubled.
  for (size_t k = 0; k < st.in.size(); ++k) {
    const InputPlan& p = st.in[k];
    if (p.access != Access::kResident) continue;
    KernelBuilder::Origin o(b, fmt::format("resident in{}: period {}", k, p.period));
    const int64_t built = spec.inputs[k].view.splat() ? tile : period;
    Reg zero = b.reg_imm("resident: position 0", 0);
    Reg len = b.reg_imm("resident: elements", built);
    emit_gather(b, st, static_cast<int>(k), in_addr[k], p.buf[0], zero, len);
    for (int64_t have = built; have < tile;) {
      const int64_t more = std::min(have, tile - have);
      vec_copy_bits(b, p.size, p.buf[0] + static_cast<uint64_t>(have * p.size), p.buf[0], more);
      have += more;
    }
  }
  if (spec.prologue) {
    KernelBuilder::Origin o(b, "prologue");
    spec.prologue(b, temp);
  }

  // The tile loop, unrolled twice (ping: buffers 0, pong: buffers 1).
  Label loop = b.label("tile_loop"), drain = b.label("drain");
  b.bind(loop);
  for (int q = 0; q < 2; ++q) {
    KernelBuilder::Origin o(b, fmt::format("tile ({})", q ? "pong" : "ping"));
    b.branch(ge(pos, end), drain);
    b.sub(cnt, end, pos);
    b.min(cnt, cnt, tile, "elements in this tile");
    if (any_flat) {
      b.wait_flag(in_free, q);
      Reg src = b.reg("input tile source");
      Reg blocks = b.reg("input tile blocks");
      for (size_t k = 0; k < st.in.size(); ++k) {
        if (st.in[k].access != Access::kFlat) continue;
        const int size = st.in[k].size;
        b.mul(src, pos, size);
        b.add(src, src, in_addr[k]);
        b.mul(blocks, cnt, size);
        b.add(blocks, blocks, kBlockBytes - 1);
        b.shr(blocks, blocks, kLog2Block);
        b.emit(Opcode::op_copy_gm2ub, {st.in[k].buf[q], src, 1, blocks, 0, 0},
               fmt::format("load in{} tile", k));
      }
      b.set_flag(in_ready, q);
    }
    for (size_t k = 0; k < st.in.size(); ++k)
      if (st.in[k].access == Access::kGather)
        emit_gather(b, st, static_cast<int>(k), in_addr[k], st.in[k].buf[q], pos, cnt);
    if (any_flat) b.wait_flag(in_ready, q);
    b.wait_flag(out_free, q);
    TileOperands t;
    for (const InputPlan& p : st.in)
      t.in.push_back(p.access == Access::kResident ? p.buf[0] : p.buf[q]);
    t.out = out_buf[q];
    t.temp = temp;
    t.count = &cnt;
    t.tile_elems = tile;
    {
      KernelBuilder::Origin c(b, "compute");
      spec.compute(b, t);
    }
    if (any_flat) b.set_flag(in_free, q);
    b.set_flag(out_ready, q);
    b.wait_flag(out_ready, q);
    {
      Reg dst = b.reg("output tile destination");
      Reg blocks = b.reg("output tile blocks");
      b.mul(dst, pos, osize);
      b.add(dst, dst, out_addr);
      b.mul(blocks, cnt, osize);
      b.add(blocks, blocks, kBlockBytes - 1);
      b.shr(blocks, blocks, kLog2Block);
      b.emit(Opcode::op_copy_ub2gm, {dst, out_buf[q], 1, blocks, 0, 0}, "store the output tile");
    }
    b.set_flag(out_free, q);
    b.add(pos, pos, cnt);
  }
  b.jmp(loop);
  b.bind(drain);
  {
    KernelBuilder::Origin o(b, "drain: consume the free flags");
    for (int q = 0; q < 2; ++q) {
      if (any_flat) b.wait_flag(in_free, q);
      b.wait_flag(out_free, q);
    }
    if (scratch_size) b.wait_flag(Pipe::V, Pipe::MTE2, st.scratch_free);
  }
  b.end();

  std::string accesses;
  for (size_t k = 0; k < st.in.size(); ++k) {
    const char* a = st.in[k].access == Access::kFlat       ? "flat"
                    : st.in[k].access == Access::kResident ? "resident"
                                                           : "gather";
    accesses += fmt::format("{}in{} {}", k ? ", " : "", k, a);
  }
  launch.summary = fmt::format("{}: {} elements of {}, {} blocks of {}, tile {} elements{}{}",
                               spec.kernel_name, n, isa::dtype_name(spec.out_type), block_dim,
                               per, tile, accesses.empty() ? "" : "; ", accesses);
  launch.block_dim = block_dim;
  launch.kernel = b.finish();
  return launch;
}

CompiledKernel stream_kernel(const CompileContext& ctx, const TensorDesc& out,
                             const StreamSpec& spec) {
  CompiledKernel k;
  k.outputs = {out};
  if (out.num_elements() > 0)
    k.launches.push_back(build_stream_kernel(ctx.op.str(), spec, ctx.cfg));
  return k;
}

std::vector<StreamInput> stream_inputs(const std::vector<TensorDesc>& inputs,
                                       const std::vector<int64_t>& out_shape) {
  std::vector<StreamInput> v;
  for (const TensorDesc& t : inputs)
    v.push_back(StreamInput{device_dtype(t.dtype), broadcast_view(t.shape, out_shape), t.shape});
  return v;
}

}  // namespace npusim::compiler::ops
