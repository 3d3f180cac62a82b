// The vector-core kernel shared by the data-movement families (layout, fill, gather): the output
// is written tile by tile, each tile assembled in the UB from pieces of the inputs, then stored
// with one contiguous UB -> GM copy.
//
// Why assemble in the UB: copy_ub2gm moves whole 32-byte blocks, so a kernel that wrote short
// runs straight to GM would overwrite the bytes after each run, which another core may own.
// Here every core owns a range of whole 32-byte output blocks (only the tensor's last block is
// partial, inside the rounded buffer of op_desc.h's contract) and writes nothing else.
//
// Pieces are written EXACTLY (no byte outside the piece changes), so they can come in any order
// and overlap a background fill:
//   run      the whole 32-byte blocks of the run in the tile: copy_gm2ub straight into the
//            tile (no flag per run: a set_flag waits for all of its pipe's transfers, so
//            these loads keep their latencies overlapped; one MTE2 -> MTE3 flag per tile).
//            The partial blocks at its ends (and whole runs shorter than a block): copy_gm2ub
//            into a scratch buffer, starting up to 31 bytes before the piece so that it lands at
//            the phase it has in the tile (GM is byte addressed, the UB is not), then a vcopy
//            whose first block is masked to the piece's lanes and whose rest is counter-mode.
//            Scratch is ping/pong with MTE2 <-> V flags. A set_flag on MTE2 waits for every
//            transfer in flight, so a flag per partial block costs a round trip each; batched
//            (TileKernel::begin_loads, the assembly kernel's default) the partial blocks of
//            many rows are loaded into consecutive slots of one scratch buffer behind one flag.
//   splat    the same two-part vdup of one value (fills, broadcast elements).
//   element  ld of the element by the scalar unit (8 bytes, little-endian) and a vdup with a
//            one-lane mask: for strided, reversed or very short runs.
// Element sizes: 2- and 4-byte elements are handled as u16 / s32 lanes; 8-byte elements (s64)
// as two s32 lanes (splats through a lo/hi pattern buffer); 1-byte elements (bool, s8, u8) in a
// "wide" u16 tile (runs widened by vconv u8 -> u16 after the load, the tile narrowed by vconv
// u16 -> u8 before the store), because the vector unit has no 8-bit copy or mask granule.
//
// Work split and tiling: block_dim = min(vector cores, output blocks); each block a range of
// whole 32-byte output blocks; tile = the largest multiple of 128 elements for which two output
// tiles, two scratch buffers (and for 1-byte types two narrow tiles and the widening buffer) fit
// in the UB less a few blocks held back (one BufferPlan sizes and allocates them); output tiles are
// ping/pong (V <-> MTE3 flags) so the store of one tile overlaps the assembly of the next.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "adapter/compiler/buffer_plan.h"
#include "adapter/compiler/compiler.h"
#include "adapter/compiler/kernel_builder.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

// ---- the tile kernel: scaffolding plus exact piece writers ----

// A placement read at run time (XlaDynamicUpdateSlice's start indices in device memory): element
// `element` of index input `input` (s32 or s64), clamped to [0, max] as XLA clamps start indices,
// times `scale`, is added to both bounds it belongs to (a row map's lo and hi, or a region's
// col_lo and col_hi), and subtracted before the source term is computed. One kernel serves every
// start value.
struct AsmShift {
  int input = -1;  // -1: no shift
  int64_t element = 0;
  int64_t max = 0;
  int64_t scale = 1;
};

class TileKernel {
 public:
  struct Options {
    std::string kernel_name;
    DataType dtype = DataType::F32;    // output element type
    std::vector<TensorDesc> inputs;    // kernel arguments in0.. (typed)
    std::vector<int64_t> out_shape;    // the output (at least one element)
    bool runs = true;                  // copy_run / accumulate_run are used (scratch buffers)
    bool direct = true;                // copy_run may load whole blocks straight into the tile
    // Extra UB buffers of tile * bytes_per_element (+ 32) bytes each, for the body's own use.
    std::vector<std::pair<std::string, int>> temps;
    // The output argument's shape when the tiles cover only part of it (empty: out_shape):
    // out_shape's elements are written from element out_shift of the argument (read at run
    // time), contiguous, or with out_run > 0 as runs of out_run elements, run j at
    // out_run_stride * j further (one run per tile); nothing else of the argument is written.
    std::vector<int64_t> out_arg_shape;
    AsmShift out_shift;  // elements
    int64_t out_run = 0, out_run_stride = 0;
  };
  TileKernel(const std::string& op, Options options, const ChipConfig& cfg);

  // Builds the kernel; `body` is emitted once per output parity inside the tile loop and must
  // write every element of [pos, pos + cnt) of the tile (directly or by a background fill);
  // `prologue`, if given, once before the loop (e.g. to fill constant temporaries).
  Launch build(const std::function<void(TileKernel&)>& body,
               const std::function<void(TileKernel&)>& prologue = {});

  // ---- inside body ----
  KernelBuilder& b() { return m_b; }
  const Reg& pos() const { return *m_pos; }  // flat output index of the tile's first element
  const Reg& cnt() const { return *m_cnt; }  // elements in this tile (1..tile)
  int64_t tile_elems() const { return m_tile; }
  int elem_bytes() const { return m_esize; }
  uint64_t tile_addr() const { return m_current_tile; }  // UB address of the tile (lanes)
  uint64_t temp(size_t i) const { return m_temps.at(i); }
  Reg input_addr(int i);                     // ldarg of input i

  // Element offsets below are relative to the tile (0 = pos). All writes are exact.
  // tile[off, off + len) = value (the element's bits; 1-byte types: the low byte).
  void splat(const Reg& off, const Reg& len, const Reg& value);
  // tile[off] = value.
  void place(const Reg& off, const Reg& value);
  // tile[off, off + len) = the len contiguous elements at GM byte address src. The part of the
  // run that covers whole 32-byte blocks of the tile is loaded straight into the tile by MTE2
  // (no scratch, no flag round trip, so such loads pipeline); the partial blocks at its ends
  // go through the scratch and an exact vcopy.
  void copy_run(const Reg& off, const Reg& len, const Reg& src);
  // tile[off, off + len) += the elements at src (dtype arithmetic: f32/f16/bf16/s32).
  void accumulate_run(const Reg& off, const Reg& len, const Reg& src);
  // value = the element at GM byte address addr (8 bytes read; upper bytes belong to the next
  // elements: callers use only the element's low bits, or all 8 for s64).
  void load_element(const Reg& value, const Reg& addr);
  // value = the integer index at GM byte address addr, of type t (s32, s64, u8, s8),
  // sign-extended to 64 bits.
  void load_index(const Reg& value, const Reg& addr, DataType t);
  // value = the shift's start index read from its input, clamped to [0, max], times scale.
  void load_shift(const Reg& value, const AsmShift& s);
  // Orders the vector writes so far before the direct (MTE2) loads that follow: needed once,
  // after a background fill that copy_run pieces overwrite.
  void vector_before_direct();

  // ---- batched partial blocks: one MTE2 -> V round trip per batch of copy_run calls ----
  // A batch is emitted twice by the body. Load pass (begin_loads .. begin_copies): copy_run
  // issues only loads, the whole blocks straight into the tile and each partial piece into the
  // next slot of the batch's scratch buffer (slot advances by the piece's blocks, at most
  // kBatchBytesPerRun per copy_run); nothing else may write the tile. Copy pass (begin_copies ..
  // end_batch): the same copy_run calls in the same order with the same offsets and lengths
  // write each partial piece from its slot (exact vcopy); the body's other writes (splats,
  // elements) go here too, after every load of the batch, so a later piece or splat overwrites
  // an earlier run's whole blocks as in program order (an earlier vector write must not lie
  // under a later run's whole blocks). Batches alternate between the two scratch buffers
  // (MTE2 <-> V flags), so the next batch loads while this one copies.
  static constexpr int64_t kBatchBytesPerRun = 2 * static_cast<int64_t>(layout::kBlockBytes);
  // The bytes one batch may load into its scratch buffer; 0: batching is not available (1-byte
  // types, runs not loaded directly, or no runs).
  int64_t batch_bytes() const;
  // Starts the load pass: slot = the first slot of this batch's buffer, limit = the last slot
  // address from which `reserve` more bytes still fit (the body loads another unit of work,
  // at most `reserve` bytes, while slot <= limit). slot and limit live until end_batch. The
  // load pass waits for the buffer (V -> MTE2 flag) before its first piece only.
  void begin_loads(const Reg& slot, const Reg& limit, int64_t reserve);
  // Ends the load pass: one MTE2 -> V flag (every load of the batch done), slot back to the
  // first. skip_if_empty: where to branch, past end_batch, when no piece was loaded (for a body
  // that then writes nothing in the copy pass); null: the copy pass runs in any case.
  void begin_copies(const Label* skip_if_empty);
  void end_batch();  // the scratch buffer is free again; the next batch takes the other one
  bool loading() const { return m_pass == Pass::kLoad; }

 private:
  // The UB buffers of one tile, declared once (BufferPlan): tile choice and allocation.
  struct TileBuffers {
    BufferPlan plan;
    BufferPlan::Id out = -1, narrow = -1, scratch = -1, widened = -1, pattern = -1;
    std::vector<BufferPlan::Id> temps;
  };
  TileBuffers declare_buffers() const;
  uint64_t tile_reserve_bytes() const;
  void plan_tiles();
  void allocate();
  void declare_args(Launch& launch);
  void init_flags();
  void free_all_buffers();
  void emit_tile(int q, const Reg& end, const Label& drain,
                 const std::function<void(TileKernel&)>& body);
  void store_tile(int q);
  void emit_drain();

  void exact(isa::Opcode op, isa::Dtype type, const Reg& off_u, const Reg& len_u,
             const Reg& src, bool src_pattern);
  void run_piece(const Reg& off, const Reg& len, const Reg& src, bool accumulate);
  void partial_piece(const Reg& off, const Reg& len, const Reg& src);
  void piece_span(const Reg& off_u, const Reg& len_u, const Reg& phase, const Reg& bytes,
                  const Reg& off, const Reg& len, int src_unit);
  void direct_piece(const Reg& off, const Reg& len, const Reg& src);
  void unit_offset(const Reg& off_u, const Reg& off);  // elements -> lanes

  KernelBuilder m_b;
  Options m_opt;
  const ChipConfig& m_cfg;
  int m_esize = 0;       // bytes per element
  bool m_wide = false;   // 1-byte elements in a u16 tile
  int m_units = 1;       // lanes per element (2 for 8-byte elements)
  isa::Dtype m_unit = isa::Dtype::U16;  // lane type of the tile (u16 or s32)
  int m_ubytes = 2;      // bytes per lane
  const CoreKindConfig* m_core = nullptr;  // the vector cores
  int64_t m_n = 0;                         // output elements
  int64_t m_tile = 0;    // elements per tile
  int64_t m_per = 0;     // elements per block
  int m_block_dim = 0;
  Twin m_out;                      // UB tiles (lanes)
  Twin m_narrow;                   // wide mode: the u8 tiles that are stored
  Twin m_scratch;                  // run loads
  uint64_t m_widened = 0;          // wide mode: runs after vconv u8 -> u16
  uint64_t m_pattern = 0;          // s64 splats: lo/hi pattern (two repeats)
  uint64_t m_current_tile = 0;     // the tile of the parity being emitted
  std::vector<uint64_t> m_temps;
  FlagPair m_out_ready, m_out_free;
  FlagPair m_scratch_ready, m_scratch_free;
  bool m_direct = false;           // copy_run loads whole blocks straight into the tile
  FlagPair m_tile_free_mte2, m_tile_loaded, m_vector_done;
  int m_q = 0;                     // parity of the tile being emitted
  enum class Pass { kImmediate, kLoad, kCopy };
  Pass m_pass = Pass::kImmediate;  // batched partial blocks: which pass is being emitted
  const Reg* m_slot = nullptr;     // batch: UB address of the next partial piece's slot
  const Reg* m_limit = nullptr;    // batch: the last slot a unit of work starts from
  int64_t m_reserve = 0;           // batch: bytes from limit to the buffer's end
  void first_slot(const Reg& slot);
  Cond nothing_loaded(const Reg& gap);
  void wait_scratch_free();
  const Reg* m_pos = nullptr;
  const Reg* m_cnt = nullptr;
  const Reg* m_sp = nullptr;       // scratch parity
};

// ---- assembling an output from regions of the inputs ----

// A value written where no input element goes (pads, gaps, out-of-range gathers): constant bits,
// or the scalar held by an input (PadV2's constant_values, Fill's value).
struct AsmFill {
  int input = -1;      // >= 0: the element at offset 0 of this input
  uint64_t bits = 0;   // else: the element's bit pattern
};

// How a region maps one row dimension of the output to the source.
struct AsmRowMap {
  int64_t lo = 0, hi = 0;  // the region covers rows lo <= i < hi ...
  int64_t step = 1;        // ... with (i - lo) % step == 0
  int64_t stride = 0;      // source elements per step: term = ((i - lo) / step) * stride
  // Gather: >= 0 names an index input (s32 or s64); the term becomes
  // index[(i - lo) / step] * stride, and an index outside [0, index_bound) makes the row's
  // piece the region's `fill` (TF's GPU kernels give zeros there; the CPU ones fail).
  int index = -1;
  int64_t index_bound = 0;
  AsmShift shift;  // rows lo + s <= i < hi + s, term from (i - lo - s)
};

// A box of the output (rows x columns) and where its elements come from: the element of row
// index vector i and column c (in the box) comes from source element
//   offset + sum_d term_d(i_d) + ((c - col_lo) / col_step) * col_stride
// of input `input`, or is `fill` when input is -1.
struct AsmRegion {
  std::vector<AsmRowMap> rows;  // one per AssembleSpec::rows entry
  int64_t col_lo = 0, col_hi = 0, col_step = 1;
  int64_t col_stride = 1;
  AsmShift col_shift;  // columns col_lo + s <= c < col_hi + s (col_step 1 only)
  int input = -1;
  int64_t offset = 0;
  AsmFill fill;
};

struct AssembleSpec {
  std::string kernel_name;
  DataType dtype = DataType::F32;    // the output's and every source input's element type
  std::vector<TensorDesc> inputs;    // sources, index tensors, scalar fill values
  std::vector<int64_t> out_shape;    // the output tensor (at least one element)
  std::vector<int64_t> rows;         // the output as rows (row-major over these dims) ...
  int64_t width = 1;                 // ... of `width` elements
  std::optional<AsmFill> background; // written first where regions may leave gaps
  std::vector<AsmRegion> regions;    // later regions overwrite earlier ones where they overlap
  // Written in place (TileKernel::Options): out_shape is the runs of a box of an output argument
  // of out_arg_shape, at element out_shift (read at run time) of it; empty: the whole output.
  std::vector<int64_t> out_arg_shape;
  AsmShift out_shift;
  int64_t out_run = 0, out_run_stride = 0;  // runs of out_run elements, out_run_stride apart
};

// A region covering every row with the given source strides (no restriction).
AsmRegion full_region(const AssembleSpec& spec, int input, int64_t offset,
                      const std::vector<int64_t>& row_strides, int64_t col_stride);

// Builds and verifies the kernel. Arguments: in0..in<n-1> (kInput i), out (kOutput 0).
Launch build_assemble_kernel(const std::string& op, const AssembleSpec& spec,
                             const ChipConfig& cfg);

// A strided view of a tensor: output element with index vector i (over `dims`) is source
// element offset + sum_d i_d * strides[d]. simplify() drops size-1 dims and merges adjacent
// dims whose strides chain (strides[d] == strides[d+1] * dims[d+1]); it keeps at least one dim.
struct StridedView {
  std::vector<int64_t> dims;
  std::vector<int64_t> strides;
  int64_t offset = 0;
  void simplify();
};

// The kernel copying `view` of input 0 (dtype, shape in_shape) into a contiguous output of
// out_shape (view.dims' product elements): one full region, rows = all view dims but the last.
AssembleSpec view_spec(const std::string& kernel_name, DataType dtype,
                       const std::vector<int64_t>& in_shape,
                       const std::vector<int64_t>& out_shape, StridedView view);

// mask = the lanes [phase, min(phase + len, epb)) of a block of epb lanes, as a set_mask low
// word: the first block of a piece of len lanes starting at lane `phase` of its block (tmp is
// clobbered).
void first_block_mask(KernelBuilder& b, const Reg& mask, const Reg& tmp, const Reg& phase,
                      Opnd len, int64_t epb);

// Row-major element strides of a shape.
std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& shape);

// The product of shape[from, to) (to clamped to the rank): element counts of dim ranges.
int64_t dims_product(const std::vector<int64_t>& shape, size_t from = 0,
                     size_t to = static_cast<size_t>(-1));

}  // namespace npusim::compiler::ops
