// Cumsum (input x; attrs axis, exclusive, reverse), types f32, f16, bf16, s32, and s64 (a
// sequential scan per column on the scalar unit, wrapping: ops/int64.h).
//
// The scan runs along rows: for x seen as [outer, N, inner] (N = the scanned axis), a work
// tensor [N, M] (M >= outer * inner columns, a multiple of 32 bytes per row) is scanned by the
// vector cores, each owning a range of whole 32-byte column blocks: row by row, out_row =
// previous out_row + x_row (vadd), so every column is accumulated sequentially in the element
// type exactly as TF's CPU kernel (Eigen's scan with a sum reducer, one rounding per add): f16,
// bf16 and f32 results are bit-identical, s32 wraps. Rows go round a ring of four x and four
// out buffers (each add reads the previous out row while it is stored), so four row loads and
// stores are in flight.
// When x is already [N, M] with M a multiple of 32 bytes (axis 0 of a suitable shape) the scan
// reads x and writes the output directly. The last axis of [outer, N] goes to [N, outer] and
// back by the vtranspose block transposer (ops/transpose.h). Otherwise a copy kernel
// (ops/assemble.h) moves x into a padded [N, M] workspace (the axis outermost; padding either
// the outer dims or the inner block, whichever wastes less) and another copies the result back.
#include <numeric>

#include <fmt/format.h>

#include "adapter/compiler/ops/assemble.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/int64.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/transpose.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;
using isa::Pipe;

namespace {

constexpr int64_t kBlock = static_cast<int64_t>(layout::kBlockBytes);

// The scan kernel over x [n, m] (m * esize a multiple of 32 bytes) into out [n, m]. Rows are
// processed kSlots at a time round a ring of x and out buffers (unrolled, so every flag id is
// an immediate): out[s] = out[s - 1] + x[s]; up to kSlots loads and stores are in flight.
constexpr int kSlots = 4;

// The column chunk: this block's column blocks [c, c_end), the chunk's w blocks (cnt elements),
// and the scan step k (the first row of the group).
struct ChunkRegs {
  explicit ChunkRegs(KernelBuilder& b)
      : c(b.reg("column block")),
        c_end(b.reg("end column block")),
        w(b.reg("chunk blocks")),
        cnt(b.reg("chunk elements")),
        k(b.reg("step")) {}
  Reg c, c_end, w, cnt, k;
};

// A group's registers: its rows, the row of the slot, a GM address.
struct GroupRegs {
  explicit GroupRegs(KernelBuilder& b)
      : g(b.reg("rows in this group")), r(b.reg("row")), a(b.reg("address")) {}
  Reg g, r, a;
};

// Emits build_scan_kernel's kernel: the split and chunk first, then per chunk of columns the
// zero row and the groups of kSlots rows (loads, ready flags, scan steps and stores, free flags).
class ScanEmitter {
 public:
  ScanEmitter(const std::string& op, DataType dt, int64_t n, int64_t m, bool exclusive,
              bool reverse, const ChipConfig& cfg);
  Launch build();

 private:
  void allocate();
  void emit_chunk(ChunkRegs& cr, const Label& chunks, const Label& done);
  void zero_first_row(const ChunkRegs& cr);
  void emit_group(const ChunkRegs& cr, const GroupRegs& gr);
  void slot(int q, bool needs_x, const ChunkRegs& cr, const GroupRegs& gr,
            const std::function<void()>& body);
  void row_of(int q, bool x_row, const ChunkRegs& cr, const GroupRegs& gr);
  void address(const char* arg, const ChunkRegs& cr, const GroupRegs& gr);
  void scan_step(int q, const ChunkRegs& cr, const GroupRegs& gr);

  KernelBuilder m_b;
  const DataType m_dt;
  const int64_t m_n, m_m;
  const bool m_exclusive, m_reverse;
  const int m_esize;
  const Dtype m_type;
  // bf16 without bf16 arithmetic (widens_bf16): each add in f32 through two f32 rows, rounded
  // to bf16 (vec_binary_bf16_in_f32): the same bits.
  const bool m_widen;
  const int64_t m_epb;     // elements per block
  const int64_t m_blocks;  // column blocks
  isa::CoreKind m_kind;
  int64_t m_per = 0;  // column blocks per block
  int m_block_dim = 0;
  int64_t m_cw = 0;  // column blocks per chunk
  uint64_t m_xb[kSlots] = {}, m_ob[kSlots] = {};
  uint64_t m_wide[2] = {};  // m_widen: the f32 rows
  int m_x_ready[kSlots] = {}, m_x_free[kSlots] = {}, m_o_ready[kSlots] = {}, m_o_free[kSlots] = {};
};

// Chunk of columns per pass: kSlots x rows and kSlots out rows of `cw` blocks in the UB.
ScanEmitter::ScanEmitter(const std::string& op, DataType dt, int64_t n, int64_t m, bool exclusive,
                         bool reverse, const ChipConfig& cfg)
    : m_b(fmt::format("Cumsum_{}", data_type_name(dt)), op, cfg),
      m_dt(dt),
      m_n(n),
      m_m(m),
      m_exclusive(exclusive),
      m_reverse(reverse),
      m_esize(data_type_bytes(dt)),
      m_type(device_dtype(dt)),
      m_widen(widens_bf16(m_type, cfg)),
      m_epb(kBlock / m_esize),
      m_blocks(m / m_epb),
      m_kind(m_b.vector_core_kind()) {
  const CoreKindConfig& core = *cfg.core_kind(m_kind);
  m_per = ceil_div(m_blocks, static_cast<int64_t>(core.count));
  m_block_dim = static_cast<int>(ceil_div(m_blocks, m_per));
  const int64_t ub = static_cast<int64_t>(core.capacity(isa::Buf::UB));
  const int64_t burst_max = static_cast<int64_t>(isa::field_imm_max(isa::FieldKind::RU16));
  const int64_t wide_rows_per_block = m_widen ? 2 * m_epb * 4 : 0;  // bytes per column block
  m_cw = std::min({m_per, (ub - 512) / (2 * kSlots * kBlock + wide_rows_per_block), burst_max});
}

void ScanEmitter::allocate() {
  KernelBuilder& b = m_b;
  for (int q = 0; q < kSlots; ++q) {
    m_xb[q] =
        b.alloc(isa::Buf::UB, static_cast<uint64_t>(m_cw * kBlock), fmt::format("x row {}", q));
    m_ob[q] =
        b.alloc(isa::Buf::UB, static_cast<uint64_t>(m_cw * kBlock), fmt::format("out row {}", q));
    m_x_ready[q] = b.flag(Pipe::MTE2, Pipe::V, "x row loaded");
    m_x_free[q] = b.flag(Pipe::V, Pipe::MTE2, "x row free");
    m_o_ready[q] = b.flag(Pipe::V, Pipe::MTE3, "out row computed");
    m_o_free[q] = b.flag(Pipe::MTE3, Pipe::V, "out row stored");
  }
  if (m_widen)
    for (int i = 0; i < 2; ++i)
      m_wide[i] = b.alloc(isa::Buf::UB, static_cast<uint64_t>(m_cw * m_epb * 4),
                          fmt::format("f32 row {}", i));
  b.alloc(isa::Buf::UB, vec::kRepeatBytes, "repeat overrun slack");
}

Launch ScanEmitter::build() {
  KernelBuilder& b = m_b;
  b.begin_section(m_kind);
  allocate();
  b.declare_arg("in0", m_type, {m_n, m_m});
  b.declare_arg("out", m_type, {m_n, m_m});
  for (int q = 0; q < kSlots; ++q) {
    b.set_flag(Pipe::V, Pipe::MTE2, m_x_free[q]);
    b.set_flag(Pipe::MTE3, Pipe::V, m_o_free[q]);
  }
  ChunkRegs cr(b);
  emit_block_range(b, cr.c, cr.c_end, m_per, m_blocks);
  Label chunks = b.label("chunk_loop"), done = b.label("done");
  b.bind(chunks);
  emit_chunk(cr, chunks, done);
  b.bind(done);
  for (int q = 0; q < kSlots; ++q) {
    b.wait_flag(Pipe::V, Pipe::MTE2, m_x_free[q]);
    b.wait_flag(Pipe::MTE3, Pipe::V, m_o_free[q]);
  }
  b.end();
  Launch l;
  l.kernel = b.finish();
  l.block_dim = m_block_dim;
  l.args = {ArgRef{ArgRef::Kind::kInput, 0, 0}, ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  l.summary = fmt::format(
      "Cumsum_{}: {} rows x {} columns{}{}, {} blocks of {} column blocks, "
      "chunks of {}, {} rows in flight",
      data_type_name(m_dt), m_n, m_m, m_exclusive ? ", exclusive" : "",
      m_reverse ? ", reverse" : "", m_block_dim, m_per, m_cw, kSlots);
  return l;
}

// One chunk of columns: its width, the zero row, every group of rows; then the next chunk.
void ScanEmitter::emit_chunk(ChunkRegs& cr, const Label& chunks, const Label& done) {
  KernelBuilder& b = m_b;
  b.branch(ge(cr.c, cr.c_end), done);
  b.sub(cr.w, cr.c_end, cr.c);
  b.min(cr.w, cr.w, m_cw, "blocks in this chunk");
  b.mul(cr.cnt, cr.w, m_epb);
  zero_first_row(cr);
  GroupRegs gr(b);
  b.movi(cr.k, 0);
  Label rows = b.label("row_loop");
  b.bind(rows);
  emit_group(cr, gr);
  b.add(cr.k, cr.k, kSlots);
  b.branch(lt(cr.k, m_n), rows);
  b.add(cr.c, cr.c, cr.w);
  b.jmp(chunks);
}

void ScanEmitter::zero_first_row(const ChunkRegs& cr) {
  KernelBuilder& b = m_b;
  const int last = kSlots - 1;
  KernelBuilder::Origin o(b, "the out row before the first = 0");
  b.wait_flag(Pipe::MTE3, Pipe::V, m_o_free[last]);
  vec_dup_bits(b, m_esize, m_ob[last], 0, cr.cnt);
  b.set_flag(Pipe::V, Pipe::MTE3, m_o_ready[last]);
  b.wait_flag(Pipe::V, Pipe::MTE3, m_o_ready[last]);
  b.set_flag(Pipe::MTE3, Pipe::V, m_o_free[last]);
}

// A group of up to kSlots rows (slot q = row k + q of the scan order): first every load, then
// the ready flags (a set_flag waits for all of its pipe's transfers, so the loads' latencies
// overlap), then per row out[q] = out[q - 1] + x[q] (or zeros: exclusive, k = 0) and its
// store, then the stores' free flags.
void ScanEmitter::emit_group(const ChunkRegs& cr, const GroupRegs& gr) {
  KernelBuilder& b = m_b;
  b.movi(gr.g, m_n);
  b.sub(gr.g, gr.g, cr.k);
  b.min(gr.g, gr.g, kSlots, "rows in this group");
  for (int q = 0; q < kSlots; ++q)
    slot(q, true, cr, gr, [&] {
      KernelBuilder::Origin o(b, fmt::format("load x (slot {})", q));
      b.wait_flag(Pipe::V, Pipe::MTE2, m_x_free[q]);
      row_of(q, true, cr, gr);
      address("in0", cr, gr);
      b.emit(Opcode::op_copy_gm2ub, {m_xb[q], gr.a, 1, cr.w, 0, 0}, "load the x row chunk");
    });
  for (int q = 0; q < kSlots; ++q)
    slot(q, true, cr, gr, [&] { b.set_flag(Pipe::MTE2, Pipe::V, m_x_ready[q], "x row loaded"); });
  for (int q = 0; q < kSlots; ++q) slot(q, false, cr, gr, [&] { scan_step(q, cr, gr); });
  for (int q = 0; q < kSlots; ++q)
    slot(q, false, cr, gr, [&] { b.set_flag(Pipe::MTE3, Pipe::V, m_o_free[q], "out row stored"); });
}

// body, if slot q holds a row of the group (and, needs_x, one with an x row).
void ScanEmitter::slot(int q, bool needs_x, const ChunkRegs& cr, const GroupRegs& gr,
                       const std::function<void()>& body) {
  KernelBuilder& b = m_b;
  Label skip = b.label("slot_skip");
  Reg qq = b.reg_imm("slot", q);
  b.branch(ge(qq, gr.g), skip);
  if (needs_x && m_exclusive && q == 0) b.branch(eq(cr.k, 0), skip);  // the zero row: no x
  body();
  b.bind(skip);
}

// r = the output (or x) row of slot q.
void ScanEmitter::row_of(int q, bool x_row, const ChunkRegs& cr, const GroupRegs& gr) {
  KernelBuilder& b = m_b;
  if (m_reverse) {
    b.movi(gr.r, m_n - 1 - q);
    b.sub(gr.r, gr.r, cr.k);
  } else {
    b.add(gr.r, cr.k, q);
  }
  if (x_row && m_exclusive) b.add(gr.r, gr.r, m_reverse ? 1 : -1);
}

// a = arg + (r * m + c * epb) * esize.
void ScanEmitter::address(const char* arg, const ChunkRegs& cr, const GroupRegs& gr) {
  KernelBuilder& b = m_b;
  Reg base = b.load_arg(arg), t = b.reg("column");
  b.mul(gr.a, gr.r, m_m);
  b.mul(t, cr.c, m_epb);
  b.add(gr.a, gr.a, t);
  b.mul(gr.a, gr.a, m_esize);
  b.add(gr.a, gr.a, base);
}

// out[q] = out[q - 1] + x[q] (exclusive, k = 0: zeros), then its store.
void ScanEmitter::scan_step(int q, const ChunkRegs& cr, const GroupRegs& gr) {
  KernelBuilder& b = m_b;
  KernelBuilder::Origin o(b, fmt::format("scan step (slot {})", q));
  const int prev = (q + kSlots - 1) % kSlots;
  const bool zero_row = m_exclusive && q == 0;
  b.wait_flag(Pipe::MTE3, Pipe::V, m_o_free[q]);
  Label zero = b.label("exclusive_first"), computed = b.label("computed");
  if (zero_row) b.branch(eq(cr.k, 0), zero);
  b.wait_flag(Pipe::MTE2, Pipe::V, m_x_ready[q]);
  if (m_widen)
    vec_binary_bf16_in_f32(b, Opcode::op_vadd, m_ob[q], m_ob[prev], m_xb[q], m_wide[0],
                           m_wide[1], cr.cnt);
  else
    vec_binary(b, Opcode::op_vadd, m_type, m_ob[q], m_ob[prev], m_xb[q], cr.cnt);
  b.set_flag(Pipe::V, Pipe::MTE2, m_x_free[q]);
  if (zero_row) {
    b.jmp(computed);
    b.bind(zero);
    vec_dup_bits(b, m_esize, m_ob[q], 0, cr.cnt);
    b.bind(computed);
  }
  b.set_flag(Pipe::V, Pipe::MTE3, m_o_ready[q]);
  b.wait_flag(Pipe::V, Pipe::MTE3, m_o_ready[q]);
  row_of(q, false, cr, gr);
  address("out", cr, gr);
  b.emit(Opcode::op_copy_ub2gm, {gr.a, m_ob[q], 1, cr.w, 0, 0}, "store the out row chunk");
}

// The scan kernel over x [n, m] (m * esize a multiple of 32 bytes) into out [n, m] (ScanEmitter).
Launch build_scan_kernel(const std::string& op, DataType dt, int64_t n, int64_t m, bool exclusive,
                         bool reverse, const ChipConfig& cfg) {
  return ScanEmitter(op, dt, n, m, exclusive, reverse, cfg).build();
}

}  // namespace

CompiledKernel compile_scan(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() == 2)  // TF's (x, axis): the axis is an attribute here
    return compile_without_inputs(ctx, {1}, compile_scan);
  if (op.inputs.size() != 1)
    op.fail(fmt::format("takes 1 input (axis is an attribute), {} given", op.inputs.size()));
  const TensorDesc& x = op.inputs[0];
  const DataType dt = x.dtype;
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the input's {}", data_type_name(*t),
                        data_type_name(dt)));
  if (!data_type_is_float(dt) && dt != DataType::S32 && dt != DataType::S64)
    op.fail(fmt::format("dtype {} is not supported (f32, f16, bf16, s32, s64)",
                        data_type_name(dt)));
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  if (rank == 0) op.invalid("x must have rank >= 1");
  if (!op.attrs.count("axis")) op.fail("attribute axis is missing");
  int64_t axis = op.attr_int("axis", 0);
  if (axis < -rank || axis >= rank)
    op.invalid(fmt::format("axis = {} is out of range for rank {}", axis, rank));
  if (axis < 0) axis += rank;
  const bool exclusive = op.attr_bool("exclusive", false), reverse = op.attr_bool("reverse", false);
  LaunchPlan plan({x});
  if (x.num_elements() == 0) return std::move(plan).finish();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[static_cast<size_t>(d)];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape[static_cast<size_t>(d)];
  const int64_t n = x.shape[static_cast<size_t>(axis)];
  if (dt == DataType::S64) {  // the scalar unit (ops/int64.h)
    plan.add(build_s64_cumsum(op.str(), outer, n, inner, exclusive, reverse, ctx.cfg),
             {LaunchPlan::input(0), LaunchPlan::output(0)});
    return std::move(plan).finish();
  }
  const int esize = data_type_bytes(dt);
  const int64_t epb = kBlock / esize;
  if (outer == 1 && inner % epb == 0) {
    plan.add(build_scan_kernel(op.str(), dt, n, inner, exclusive, reverse, ctx.cfg),
             {LaunchPlan::input(0), LaunchPlan::output(0)});
    return std::move(plan).finish();
  }
  if (inner == 1 && block_transpose_applies(dt, outer) && block_transpose_applies(dt, n)) {
    // The scanned axis is the last: [outer, N] -> [N, m] (rows padded to whole blocks) and
    // back by the vtranspose block transposer.
    const int64_t m = round_up(outer, epb);
    const uint64_t bytes = static_cast<uint64_t>(n * m * esize);
    const ArgRef w1 = plan.workspace(bytes), w2 = plan.workspace(bytes);
    append_block_transpose(plan, op.str(), ctx.cfg, dt, 1, outer, n, n, LaunchPlan::input(0), w1,
                           "axis to rows", m);
    plan.add(build_scan_kernel(op.str(), dt, n, m, exclusive, reverse, ctx.cfg), {w1, w2});
    append_block_transpose(plan, op.str(), ctx.cfg, dt, 1, n, outer, m, w2, LaunchPlan::output(0),
                           "rows back to the axis");
    return std::move(plan).finish();
  }
  // Work layout [N][rows_p][width]: either [N][outer_p][inner] (outer padded so that a row of
  // the work tensor is whole blocks) or [N][outer][inner_p] (each inner block padded).
  const int64_t outer_p = round_up(outer, epb / std::gcd(inner, epb));
  const int64_t inner_p = round_up(inner, epb);
  const bool pad_outer = outer_p * inner <= outer * inner_p;
  const int64_t rows_p = pad_outer ? outer_p : outer, width = pad_outer ? inner : inner_p;
  const int64_t m = rows_p * width;
  const TensorDesc work{dt, {n, rows_p, width}};
  AssembleSpec in;
  in.kernel_name = fmt::format("Cumsum_{}_to_rows", data_type_name(dt));
  in.dtype = dt;
  in.inputs = {x};
  in.out_shape = work.shape;
  in.rows = {n, rows_p};
  in.width = width;
  AsmRegion src = full_region(in, 0, 0, {inner, n * inner}, 1);
  src.rows[1].hi = outer;
  src.col_hi = inner;
  in.regions.push_back(src);
  if (pad_outer && outer_p > outer) {
    AsmRegion pad = full_region(in, -1, 0, {}, 0);
    pad.rows[1].lo = outer;
    in.regions.push_back(pad);
  } else if (!pad_outer && inner_p > inner) {
    AsmRegion pad = full_region(in, -1, 0, {}, 0);
    pad.col_lo = inner;
    in.regions.push_back(pad);
  }
  const ArgRef w1 = plan.workspace(work.bytes()), w2 = plan.workspace(work.bytes());
  plan.add(build_assemble_kernel(op.str(), in, ctx.cfg), {LaunchPlan::input(0), w1},
           "axis to rows");
  plan.add(build_scan_kernel(op.str(), dt, n, m, exclusive, reverse, ctx.cfg), {w1, w2});
  StridedView back{{outer, n, inner}, {width, m, 1}, 0};
  AssembleSpec out = view_spec(fmt::format("Cumsum_{}_from_rows", data_type_name(dt)), dt,
                               work.shape, x.shape, back);
  plan.add(build_assemble_kernel(op.str(), out, ctx.cfg), {w2, LaunchPlan::output(0)},
           "rows back to the axis");
  return std::move(plan).finish();
}

}  // namespace npusim::compiler::ops
