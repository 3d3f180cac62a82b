// The streaming element-wise kernel shared by the binary, unary and cast families (and by any
// later op that maps each output element to input elements at the same broadcast position):
// the flat output is split over the vector cores, each core streams its range through the UB
// in tiles, double-buffered (MTE2 loads tile t+1 and MTE3 stores tile t-1 while V computes
// tile t), and the family only supplies its UB temporaries and the vector instructions of one
// tile. A kernel may have several outputs of the output's shape (e.g. a fused chain's results,
// each stored per tile); its temporaries keep intermediate values in the UB within a tile.
//
// Buffers and tiling (all from the config): one BufferPlan (buffer_plan.h) declares, per tile
// of T elements, two tiles per streamed input and per output, one per resident input, a gather
// scratch and the family's temporaries; T is the largest multiple of 128 elements for which
// they fit in the UB of the vector core, rounded down to whole broadcast periods; blocks =
// min(vector cores, work); each block takes a range of whole 32-byte output blocks, so no two
// cores write the same block (only the last block of the tensor is partial; see the buffer
// contract in op_desc.h).
//
// How an input reaches the UB tile for output positions [pos, pos + cnt):
//   kFlat     same shape as the output: one contiguous copy_gm2ub per tile.
//   kResident the same values for every tile, built once before the loop: a scalar (vdup), or
//             a block repeated along broadcast outer dims (e.g. the [N] of [M,N] + [N]) whose
//             period divides the tile; the tile is built for one period then doubled.
//   kGather   anything else (general broadcasting): per tile, the output range is cut at the
//             input's innermost broadcast boundary into pieces; each piece is a contiguous run
//             of the input (copy_gm2ub into a scratch at the piece's phase within a 32-byte
//             block, then vcopy into place) or one broadcast element (ld + vdup). Pieces are
//             written last-to-first, each from its block-aligned start with an exact end, so
//             the head of a piece's first block, written with foreign values, is rewritten by
//             the pieces before it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/ops/registry.h"
#include "common/convert.h"

namespace npusim::compiler::ops {

// An input's elements as seen from the output (numpy broadcasting), with adjacent dimensions
// merged where the input is contiguous in both or broadcast in both.
struct BroadcastView {
  std::vector<int64_t> dims;     // output dims, outer to inner (size-1 dims dropped)
  std::vector<int64_t> strides;  // input element stride per dim; 0 = broadcast
  bool identity() const;         // the input has the output's elements in the output's order
  bool splat() const;            // one element broadcast to every position
  // P if the input is a contiguous block of P elements repeated along broadcast outer dims
  // (dims [R, P], strides [0, 1]); 0 otherwise.
  int64_t period() const;
};
BroadcastView broadcast_view(const std::vector<int64_t>& in_shape,
                             const std::vector<int64_t>& out_shape);

struct StreamInput {
  isa::Dtype type;             // device type of the input
  BroadcastView view;          // from broadcast_view(input shape, output shape)
  std::vector<int64_t> shape;  // for the kernel's typed argument; empty: any shape
  int window = -1;             // its tile(s) start in this UB bank window (StreamSpec)
  // Read by StreamSpec::resident_compute only (with resident_per_period; it must stay
  // resident): its UB buffer holds one period, not a tile, and is not doubled over the tile.
  bool period_only = false;
  // A splat read by StreamSpec::resident_compute only, with resident_results (which runs it over
  // the first kResidentPart elements): its UB buffer holds those elements, not a tile.
  bool part_only = false;
};

// A UB buffer of the compute step, declared in the kernel's BufferPlan after the input, output
// and gather buffers: one copy of ceil(T * bytes_per_element) + fixed_bytes bytes for a tile
// of T elements (fixed_bytes alone: a constant, e.g. one repeat filled by the prologue).
struct TempSpec {
  std::string name;
  double bytes_per_element = 0;
  uint64_t fixed_bytes = 0;
  int window = -1;  // starts in this UB bank window (StreamSpec)
  // bytes_per_element per element of one period of the resident inputs, not of a tile (scratch
  // of a resident_compute with resident_per_period only; fixed_bytes must be 0).
  bool period_only = false;
};

// The UB operands of one tile, all contiguous (element i at addr + i * size).
struct TileOperands {
  std::vector<uint64_t> in;    // per input
  uint64_t out = 0;            // output 0
  std::vector<uint64_t> outs;  // per output (outs[0] == out)
  std::vector<uint64_t> temp;  // per StreamSpec::temps
  const Reg* count = nullptr;  // elements in this tile, 1..tile_elems (a register)
  int64_t tile_elems = 0;
};

struct StreamSpec {
  std::string kernel_name;
  std::vector<StreamInput> inputs;
  isa::Dtype out_type = isa::Dtype::F32;  // output 0
  std::vector<int64_t> out_shape;         // every output's shape; at least one element
  // Outputs 1, 2, ... (their types), stored like output 0 from TileOperands::outs.
  std::vector<isa::Dtype> more_out_types;
  std::vector<TempSpec> temps;
  // UB bank windows (the vector unit's bank model, sim/exec/vector_insn.cpp: the operands of a
  // repeat that meet in a bank take turns, a destination that is also a source always does):
  // window w >= 0 of an input, the output(s) or a temp places its buffer(s) at w * 256 bytes
  // (one repeat) modulo the UB's banks x bank width bytes (w taken modulo the windows there
  // are), padding before it; -1 (the default everywhere): where the layout puts it. A compute
  // whose instructions read and write tiles in pairwise different windows runs its repeats
  // without bank conflicts (f32 operands: they advance one window per repeat together).
  int out_window = -1;
  // Optional, emitted once before the tile loop (e.g. to fill constant temporaries).
  std::function<void(KernelBuilder&, const std::vector<uint64_t>& temp)> prologue;
  // Emits the vector instructions computing one tile.
  std::function<void(KernelBuilder&, const TileOperands&)> compute;
  // Optional, emitted once after the resident inputs and the prologue: work whose result is the
  // same for every tile, computed over a whole tile (count = tile_elems) into temporaries that
  // compute() then reads. in[k] is resident input k's tile (0 for a streamed or gathered input);
  // out and outs are unset.
  std::function<void(KernelBuilder&, const TileOperands&)> resident_compute;
  // Where resident_compute leaves what compute() reads of it, when that is one value at every
  // position: temporaries (indices into temps) with their element bytes. Given, resident_compute
  // runs over the first kResidentPart elements only (count = min(tile, kResidentPart)) and each
  // such temporary is then copied over the whole tile: the same bits at every position, for
  // one repeat's work in place of a whole tile's per instruction. Empty: over a whole tile.
  std::vector<std::pair<size_t, int>> resident_results;
  // With resident_compute (and no resident_results): it runs over one period of the resident
  // inputs (count = the period; tiles start at whole periods, so that is each position's value
  // once), before they are doubled over the tile, instead of over a whole tile after: the
  // doubling then copies its results. For per-position work on broadcast vectors (a batch
  // norm's per-channel factors), a period's instructions in place of a tile's. Every input
  // with a broadcast period must stay resident (build_stream_kernel fails otherwise;
  // stream_keeps_resident says so beforehand).
  bool resident_per_period = false;
  // Resident results stored once: after resident_compute, block 0 stores the first `elements`
  // values of resident input `input`'s tile (its type) to argument rout<i> (the arguments after
  // the outputs; ArgRef kOutput (outputs + i) until the caller's with_args). elements times the
  // input's size must be whole 32-byte blocks. Needs the inputs resident, as above.
  struct ResidentStore {
    size_t input = 0;
    int64_t elements = 0;
  };
  std::vector<ResidentStore> resident_stores;
  // > 0: a tile's vector work in pieces of about this many elements (build_stream_kernel
  // only). The resident inputs (not period_only) and the temporaries then hold one piece, not a
  // tile, so the flat input and output tiles take the UB they leave: fewer, larger tiles, for a
  // stream whose tiles each wait a memory round trip (a load's set_flag holds MTE2 until the
  // tile has landed, sync.set_flag_holds_pipe) at more instructions per element. compute()
  // runs once per piece of a tile, its flat operands and outputs offset to the piece and count
  // the piece's elements (tile_elems the piece's length). A piece is whole periods of the
  // resident inputs, and where that stays within twice this many elements also whole UB bank
  // spans of every flat tile (so each piece's tiles keep their bank windows). Taken only where
  // a block's range holds at least work_piece_min_tiles tiles without pieces (with fewer, the
  // pieces' instructions cost more than the round trips they save; the caller's measurement).
  int64_t work_piece = 0;
  int64_t work_piece_min_tiles = 1;
  // Block b of B's first tile holds (b + 1) / B of a tile (whole periods, at least one), its
  // later tiles whole tiles: the blocks' tiles start out of phase, spread evenly over a tile,
  // so their loads and the round trips after them (a load's set_flag holds MTE2 until the tile
  // has landed, sync.set_flag_holds_pipe) fall at different times in different blocks, not all
  // at once with HBM idle meanwhile. Values are unchanged (tile boundaries only). Taken where
  // that can pay (the blocks' GM -> UB ports together faster than HBM's sustained rate,
  // sync.set_flag_holds_pipe, at least two tiles per block); honoured by build_stream_kernel and
  // build_multi_stream_kernel (segment 0's value).
  bool stagger_first_tiles = false;

  // > 0: output 0 (the only output) is stored in column blocks: the flat output, rows of
  // `blocked_row` elements ([rows][blocked_row]), goes to GM as [blocked_row / C][rows][C], C
  // the elements of a 32-byte block (16 of a 16-bit type: for an HWIO filter of Cout =
  // blocked_row, ops/conv.h kFilterLayoutN16). Tiles and block ranges are then whole rows, and
  // a tile's store is one copy_ub2gm per column block: its rows strided in the UB (src_gap
  // blocked_row / C - 1 blocks), one contiguous GM run of rows x 32 bytes. blocked_row must be
  // whole 32-byte blocks, at most 65,536 of them (src_gap is 16 bits), and fit a tile
  // (stream_tile_capacity); no stagger_first_tiles in a multi-tensor launch (its first tiles
  // are not whole rows). build_stream_kernel and build_multi_stream_kernel.
  int64_t blocked_row = 0;

  // Temporaries (indices into temps, f32) that compute() adds into over the tiles of a block
  // (e.g. per-position partial sums of a result): set to 0 over a whole tile (or piece) once,
  // before the tile loop (build_stream_kernel only).
  std::vector<size_t> accumulators;
  // Optional, emitted once per block after its tile loop has drained (every tile computed and
  // stored): work on what the tiles left in the temporaries (the accumulators), given temp and
  // tile_elems (in, out and count unset) and the launch's block count. It may declare
  // `tail_args` kernel arguments of its own, after the outputs and the resident stores' (ArgRef
  // kOutput outputs + resident stores + i until the caller's with_args).
  std::function<void(KernelBuilder&, const TileOperands&, int blocks)> block_finish;
  int tail_args = 0;
};
// The elements resident_compute runs over when StreamSpec::resident_results is given: one
// repeat of f32 (256 bytes), a whole number of 32-byte blocks of any element type.
inline constexpr int64_t kResidentPart = 64;

// One tile's work of the element-wise op `tf_op` of ops/binary.cpp (operands in[0], in[1]) or
// ops/unary.cpp (in[0]) on operands and a result of the float device type `type` (F32, F16,
// BF16): sets spec.temps, spec.prologue and spec.compute exactly as the op's own kernel does.
// The compute writes TileOperands::out (a tile of `type` that no operand shares) and reads the
// operands only. False, spec untouched, if the op is not of the family or its kernel is not
// such a stream (a bool result, the s64 scalar unit, LogicalAnd / LogicalOr, LogicalNot).
// `bf16_arithmetic`: the chip's ChipConfig::vector_bf16_arithmetic (false: bf16 widens to f32,
// widen_bf16_tile_work).
bool binary_tile_work(const std::string& tf_op, isa::Dtype type, bool bf16_arithmetic,
                      StreamSpec& spec);
bool unary_tile_work(const std::string& tf_op, isa::Dtype type, bool bf16_arithmetic,
                     StreamSpec& spec);
// The same for the activations of ops/activation.cpp taken as FusedElementwise steps: ReluGrad
// (operands in[0] = the gradients, in[1] = the features; float types). Returns the op's number
// of operands, 0 (spec untouched) for any other op or type.
int activation_tile_work(const std::string& tf_op, isa::Dtype type, StreamSpec& spec);

// Whether a kernel computing on `type` must widen it to f32 on chip `cfg`: bf16 where the vector
// unit has no bf16 arithmetic (ChipConfig::vector_bf16_arithmetic false; the verifier refuses
// bf16 in every vector instruction but vconv, vcopy, vsel, vdup and vtranspose there).
bool widens_bf16(isa::Dtype type, const ChipConfig& cfg);

// Where the f32 result of widen_bf16_tile_work's work goes.
enum class WidenedResult {
  kRounded,         // an f32 temporary of its own, rounded once to bf16 into the output
  kRoundedInPlace,  // over the widened first operand (the work computes in place), rounded so
  kBool,            // none: the work writes the (bool) output itself
};
// Turns the tile work `spec` holds for f32 operands (temps, prologue and compute as the family
// sets them for type F32; no resident_compute) into the same work on bf16 operands, as ops-nn's
// bf16 kernels run on chips without bf16 arithmetic: per tile, the first `inputs` operands
// converted to f32 (exact) into temporaries appended after the family's, the f32 work run on
// them, its result placed as `result` says. Where the work is one instruction the result equals
// the native bf16 instruction's (which also computes in fp32 and rounds once); a chain of
// instructions rounds once at its end.
void widen_bf16_tile_work(StreamSpec& spec, size_t inputs,
                          WidenedResult result = WidenedResult::kRounded);

// Builds and verifies the kernel. Arguments: in0..in<n-1> (ArgRef kInput i) then out (kOutput 0),
// out1, out2, ... (kOutput 1, 2, ...), then rout0, rout1, ... (StreamSpec::resident_stores).
Launch build_stream_kernel(const std::string& op, const StreamSpec& spec, const ChipConfig& cfg);

// The most elements a tile of build_stream_kernel(spec) holds on `cfg` (its UB buffers' fit,
// whole 128-element quanta, before rounding to periods and block ranges); 0 if none fit. A row
// of StreamSpec::blocked_row elements must be at most this.
int64_t stream_tile_capacity(const StreamSpec& spec, const ChipConfig& cfg);

// Whether build_stream_kernel(spec) gathers no input per tile: every broadcast input is a
// splat or periodic, and no period is too long for a tile (demoted to a gather).
bool stream_keeps_resident(const StreamSpec& spec, const ChipConfig& cfg);

// Whether `vector_cores` blocks loading their tiles in step leave HBM idle during the tiles'
// round trips, so that staggering their first tiles pays (StreamSpec::stagger_first_tiles,
// ChannelSumSpec::stagger_first_tiles): a load's set_flag holds MTE2 until the tile has landed
// (sync.set_flag_holds_pipe: a round trip per tile), and the cores' GM -> UB ports together
// (bytes per cycle) outrun HBM's sustained rate (memory.hbm: peak x efficiency, bytes per
// cycle), so HBM, not the ports, is what the round trips leave waiting.
bool load_round_trips_idle_hbm(const ChipConfig& cfg, int64_t vector_cores);

// Shared reads staggered over the cores, for a chip that serialises concurrent reads of one L2
// line (memory.l2.line_read_bytes_per_cycle R > 0; docs/compiler.md "Shared reads in staggered
// parts"). An input with a broadcast dim above its contiguous rows (the [N] of [M, N] op [N], a
// per-channel vector) is read by every block at once: gathered piece by piece (each block's
// piece of a row covers the same L2 lines) or, resident and loaded whole, one period at the
// start; k blocks in step each read at R / k. Staggered, each such load is cut into parts of
// `part_bytes` (whole L2 lines, counted from the input's start) and block b takes its parts
// from part b % n on (n the parts the load touches), wrapping, so that blocks in step read
// different parts. The part size is the one of least estimated cycles for a load of
// piece_bytes: per part the longer of the DMA's issue (copy_issue_estimate) and its bytes at
// min(the core's L2 read port, R / ceil(block_dim / parts)), against the one load's (R /
// block_dim). The bytes landing in the UB are the same either way, so the results are too.
// part_bytes 0 (one load, as without staggering) where R = 0, with one block, a load of at most
// one line, where splitting is estimated no faster, or under NPUSIM_STAGGERED_SHARED_READS=0
// (read at every compile; another value: a CompileError naming op).
struct SharedReadParts {
  int64_t part_bytes = 0;  // bytes per part (whole L2 lines); 0: one load a piece
  int64_t parts = 1;       // parts of a piece of piece_bytes starting on a part's boundary
  int64_t sharers = 1;     // blocks in step that read one part at a time: ceil(block_dim / parts)
};
SharedReadParts plan_shared_read_parts(const ChipConfig& cfg, int64_t piece_bytes,
                                       int64_t block_dim, const std::string& op);
// The part (0 .. parts - 1, of the parts a piece touches) block `block` loads at its step `step`
// (0 .. parts - 1) of a piece: (block + step) % parts. The kernel's order (the emitter
// computes the same on the scalar unit).
int64_t shared_read_part_at(int64_t parts, int64_t block, int64_t step);

// The staggered first tile (StreamSpec::stagger_first_tiles, ChannelSumSpec::
// stagger_first_tiles) of block `block` (a register, 0 .. blocks - 1) of `blocks`, a tile
// being `units` units of `unit` elements (or pixels): into `limit`, ceil((block + 1) * units
// / blocks) units, in elements: the blocks' first tiles spread evenly over a tile, 1 .. units
// units, the last block's a whole tile; where there are fewer units than blocks, every phase
// is taken by floor or ceil(blocks / units) neighbouring blocks (rounding down instead, with a
// floor of one unit, would put the blocks below one unit into the first phase as well and leave
// the last phase to the last block alone: with 2 units over 44 blocks, 43 blocks a one-unit
// first tile, i.e. in step with a tile more).
void emit_staggered_first_tile(KernelBuilder& b, const Reg& limit, const Reg& block, int64_t blocks,
                               int64_t units, int64_t unit);

// A multi-tensor stream (as CANN's foreach kernels and torch_npu's / apex's multi-tensor apply
// walk a list of tensors in one launch): segment g is a stream of its own spec (its inputs
// flat, i.e. of its output's shape, or single elements; every segment has a flat input) and
// the same input types, outputs and temporaries as segment 0 (the compute may differ, e.g. in
// which steps are uniform). The segments' elements, each segment padded to whole 32-byte output
// blocks, form one range split over the vector cores as build_stream_kernel splits one output,
// or, where that leaves a block crossing many small segments the longest, cut to balance the
// blocks' estimated costs (each segment a block meets: the HBM latency of its first tile, then
// its flat bytes at a block's share of the stream rate); each block streams the part of its range
// in each segment with that segment's addresses, every element computed by the segment's own
// compute, so the values are those of build_stream_kernel(segment) bit for bit. A segment with
// resident work (single-element inputs, uniform steps) issues its first tile's loads before that
// work, so that the work overlaps the load's round trip. Arguments, segment by segment: its inputs
// (ArgRef kInput g * n_inputs + k), then its outputs (kOutput g * n_outputs + j).
Launch build_multi_stream_kernel(const std::string& op, const std::vector<StreamSpec>& segments,
                                 const ChipConfig& cfg);

// A member of a multi-tensor op streamed as a segment (multi_tensor_launches): its stream (flat
// inputs of its output's shape or single elements, as build_multi_stream_kernel takes them), the
// member's index in the op and the bytes its flat streams move (inputs and outputs).
struct MultiTensorSegment {
  StreamSpec spec;
  size_t member = 0;
  uint64_t bytes = 0;
};

// The launches of a multi-tensor op's segments, every segment of the same input types and
// outputs (n_inputs and n_outputs each), in order. Small and large segments go to launches of
// their own kind. A multi-tensor launch splits its segments' elements over the blocks as one
// range, and each segment a block meets costs that block a setup (its addresses, its resident
// scalars, a pipeline fill): among large segments the small ones would all fall in one block's
// range and lengthen it; among small ones (at most 1024 elements per vector core, # estimate:
// the size below which a launch of its own spends more in task overheads, ~6,000 cycles on the
// 910b preset, than in streaming its elements) every block meets a few. Large segments hold
// more than 1024 elements per vector core each, so a block's range (their elements over the
// vector cores) meets about segments / vector cores + 1 of them: 2 at most for 23 segments on
// the 910b's 48. A launch takes as many segments as its arguments allow (ldarg's index is 8
// bits: at most 256 arguments) and as long as its streams together fit the L2, so that the L2
// policy of the stream kernels (plan_l2: streams above the L2 move with noalloc) treats each
// segment as its own launch would: a launch streaming more than the L2 would bypass it for all
// of its segments. A segment above the L2 by itself is alone; a launch of one segment is
// build_stream_kernel's. The arguments: segment s's input k is ArgRef kInput
// input_index(member, k), its output j kOutput output_index(member, j).
std::vector<Launch> multi_tensor_launches(
    const std::string& op, const std::vector<MultiTensorSegment>& segments, size_t n_inputs,
    size_t n_outputs, const std::function<int(size_t member, size_t k)>& input_index,
    const std::function<int(size_t member, size_t j)>& output_index, const ChipConfig& cfg);

// The CompiledKernel of a one-launch element-wise op with output `out`: no launch when `out`
// has no elements (nothing to compute), else build_stream_kernel(spec).
CompiledKernel stream_kernel(const CompileContext& ctx, const TensorDesc& out,
                             const StreamSpec& spec);

// This block's range of a flat output of n elements split in blocks of `per`: pos = block id *
// per, end = min(pos + per, n).
void emit_block_range(KernelBuilder& b, const Reg& pos, const Reg& end, int64_t per, int64_t n);

// SelectV2 as a tile work of three operands: in[0] the bool condition (one byte per element,
// streamed at the output's shape: a 1-byte input cannot be gathered), in[1] t and in[2] e of
// the float type `type` (f32, f16, bf16; false for other types). The same instructions as the
// SelectV2 op's own kernel (ops/select.cpp): condition widened to f16, vcmp != 0, vsel.
bool select_tile_work(isa::Dtype type, StreamSpec& spec);

class LaunchPlan;  // ops/compose.h
// Appends to `plan` a copy kernel broadcasting `in` (read at `src`) to `shape` into a new
// workspace slice; returns that slice. For 1-byte operands, which a streaming kernel cannot
// gather (ops/select.cpp, FusedElementwise's Select conditions).
ArgRef append_broadcast_copy(LaunchPlan& plan, const CompileContext& ctx, const TensorDesc& in,
                             const std::vector<int64_t>& shape, ArgRef src);

// The StreamInputs of an op's inputs broadcast to out_shape.
std::vector<StreamInput> stream_inputs(const std::vector<TensorDesc>& inputs,
                                       const std::vector<int64_t>& out_shape);

// Whether kernels use the vector unit's multiply-accumulate (vmla: dst = src0 * src1 + dst, f16
// and f32; the channel sums' squares and products): the chip has it (vector.multiply_accumulate)
// and NPUSIM_VECTOR_MULTIPLY_ACCUMULATE is not "0" (read at every compile; anything but unset,
// "0" or "1" is a CompileError naming it). vmla gives the bits of vmul then vadd.
bool multiply_accumulate_enabled(KernelBuilder& b);

// ---- vector instruction helpers over `count` contiguous elements (counter mode) ----
void vec_binary(KernelBuilder& b, isa::Opcode op, isa::Dtype t, Opnd dst, Opnd src0, Opnd src1,
                const Reg& count);
void vec_unary(KernelBuilder& b, isa::Opcode op, isa::Dtype t, Opnd dst, Opnd src,
               const Reg& count);
// A bitwise op (vand, vor: binary; vnot: unary, src1 unused) on `count` elements of a 16- or
// 32-bit type t as u16 lanes (the only type they take; a bit's result depends on that bit alone,
// so an s32 element is two lanes in either order).
void vec_bitwise(KernelBuilder& b, isa::Opcode op, isa::Dtype t, Opnd dst, Opnd src0, Opnd src1,
                 const Reg& count);
// VSCL family (vadds, vmuls, ...): scalar is a register holding vector_scalar_bits().
void vec_scalar(KernelBuilder& b, isa::Opcode op, isa::Dtype t, Opnd dst, Opnd src,
                const Reg& scalar, const Reg& count);
void vec_convert(KernelBuilder& b, isa::Dtype dst_type, isa::Dtype src_type, Opnd dst, Opnd src,
                 RoundMode round, const Reg& count);
// dst = bits of a 2- or 4-byte element, `count` times (vdup of the u16 / s32 view).
void vec_dup_bits(KernelBuilder& b, int elem_bytes, Opnd dst, Opnd bits, Opnd count);
// dst = src (bits), `count` elements of elem_bytes (1, 2 or 4) each.
void vec_copy_bits(KernelBuilder& b, int elem_bytes, Opnd dst, Opnd src, Opnd count);
// bits = cmp(src0, src1), one bit per element, dense (vcmp). src1_const: src1 is one repeat
// of constants read for every repeat (repeat stride 0, see vec_fill_repeat).
void vec_compare(KernelBuilder& b, isa::Dtype t, isa::Cmp cmp, Opnd bits, Opnd src0, Opnd src1,
                 const Reg& count, bool src1_const = false);
// dst = bit ? src0 : src1 per element (vsel); *_const as for vec_compare.
void vec_select(KernelBuilder& b, isa::Dtype t, Opnd dst, Opnd src0, Opnd src1, Opnd bits,
                const Reg& count, bool src0_const = false, bool src1_const = false);
// vec_binary / vec_unary of bf16 operands computed in f32, as a chip without bf16 arithmetic
// (widens_bf16) runs them: the sources converted to f32 (exact) into wide0 (and wide1), UB
// scratch of `count` f32 elements each, the instruction in f32, the result rounded once to
// bf16 (nearest even) into dst: the bits of the bf16 instruction, which computes in fp32 and
// rounds once. dst may be a source.
void vec_binary_bf16_in_f32(KernelBuilder& b, isa::Opcode op, Opnd dst, Opnd src0, Opnd src1,
                            Opnd wide0, Opnd wide1, const Reg& count);
void vec_unary_bf16_in_f32(KernelBuilder& b, isa::Opcode op, Opnd dst, Opnd src, Opnd wide0,
                           const Reg& count);
// One repeat (256 bytes) of `value` in type t at dst, for the *_const operands above.
void vec_fill_repeat(KernelBuilder& b, isa::Dtype t, uint64_t dst, double value);
// The register value a VSCL instruction or vdup needs for `value` in type t: fp32 bits for
// float types, the integer for integer types.
int64_t vector_scalar_bits(isa::Dtype t, double value);

}  // namespace npusim::compiler::ops
