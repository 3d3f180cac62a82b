// Per-channel statistics of NHWC tensors on the vector cores (ops/channel.cpp), for batch
// normalisation (ops/batchnorm.cpp) and the depthwise filter gradient (ops/conv2d.cpp):
//
//   build_channel_sum:      partial sums over pixels, per channel, in f32:
//                             kSum         sum a
//                             kSumSquares  sum (a - m)^2      (m = 0 unless centered)
//                             kSumProduct  sum (a - m) * b
//                           and with plain_sum, in the same pass, a second set of partials:
//                             kSumSquares  sum a             (before centring)
//                             kSumProduct  sum b
//                           with relu_mask (kSumProduct, centered), b is first replaced by
//                           b * (round_A(fa * a + fs) > 0 ? 1 : 0), round_A the rounding to
//                           a's type (RNE; none for f32): the gradient b of the ReLU's output
//                           relu(fa * a + fs) as stored in a's type, taken back through the
//                           ReLU as ReluGrad does on that output; fa and fs are computed per
//                           channel group by mask_fold from m and mask_vectors more f32 [cp]
//                           vectors
//                           of tensors laid out [pixels][cp] with cp * element size a multiple
//                           of 32 bytes, or read as rows of whole pixels of `channels` each
//                           (ChannelSumSpec::channels, channel_sum_row: f16's 24 or 40); callers
//                           copy other channel counts to a padded layout.
//                           Block k of the launch sums pixels [k * per, (k+1) * per) and writes
//                           partials[item][k][0..cp) (f32), item < batch (independent sums:
//                           a advances a_batch_stride elements per item, b b_batch_stride).
//   build_channel_epilogue: one vector kernel over channels that first sums the partials of
//                           each channel_sum over its blocks, then runs the caller's f32 vector
//                           code (e.g. mean, variance, rsqrt) and writes f32 [c] outputs.
//
// Accumulation order (what the tolerances of callers rest on): within a block, a tile of T
// pixels at a time is added lane-wise into T running sums, the T sums are folded pairwise at
// the end (log2 T levels), and the epilogue folds the blocks' partials pairwise in the same way
// (fold_rows_pairwise: block k + ceil(B / 2) onto block k, ..., ceil(log2 B) levels). All in
// f32; f16/bf16 inputs are widened exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/ops/elementwise.h"
#include "isa/isa.h"
#include "sim/config/chip_config.h"

namespace npusim::compiler::ops {

struct ChannelSumSpec {
  enum class Kind { kSum, kSumSquares, kSumProduct };
  Kind kind = Kind::kSum;
  isa::Dtype a_type = isa::Dtype::F32, b_type = isa::Dtype::F32;
  int64_t batch = 1;
  int64_t pixels = 0, cp = 0;
  // The tensor's channels per pixel where a pixel is not whole 32-byte blocks of a's (and b's)
  // type (0: cp, the tensor's own): a multiple of 8 that divides cp. The tensor is then read
  // as rows of cp / channels pixels (whole blocks), cp channels each (lane l: channel
  // l mod channels), and the pixels past the last whole row (fewer than cp / channels) as one
  // partial row added lane by lane onto the last block's sums. m and the mask vectors are
  // [channels] (replicated over a row's pixels as they are loaded); the partials are
  // [batch][blocks * cp / channels][channels] f32 (ChannelSumLaunch::partial_rows,
  // partial_pitch): the epilogue folds a row's pixels with the blocks. One channel group only
  // (a row of cp f32 one repeat stride at most, channel_sum_row).
  int64_t channels = 0;
  int64_t a_batch_stride = 0, b_batch_stride = 0;  // elements
  bool centered = false;  // subtract m (f32 [cp], argument "m") from a
  bool plain_sum = false;  // also sum a (kSumSquares) or b (kSumProduct) into "partials2"
  bool relu_mask = false;  // kSumProduct, centered, a and b f32 or f16: mask b by
                           // round_A(fa * a + fs) > 0 (relu_mask_threshold)
  int mask_vectors = 0;    // relu_mask: vectors read besides m (arguments "mask0", ...)
  // The tile chosen for the most pixels per raw tile (ops/channel.cpp, plan_tile) rather than
  // the largest tile, where that raw tile holds more pixels; measured for BNTrainingUpdateGrad's
  // unmasked sums, BiasAddGrad's and f32 BNTrainingReduce's (docs/compiler.md).
  bool raw_tile_first = false;
  // Block b of B first loads a raw tile of (b + 1) / B of a raw tile's pixels (at least one),
  // then whole raw tiles, as StreamSpec::stagger_first_tiles: the blocks' round trips out of
  // phase. Taken where it can pay (the vector cores' GM -> UB ports together faster than HBM's
  // sustained rate, sync.set_flag_holds_pipe, a block's range more than one raw tile) and the
  // sums are added in place (a short tile's sums stay in their lanes); the lanes then gather
  // other pixels, a different f32 summation order.
  bool stagger_first_tiles = false;
  // relu_mask: writes fa and fs (f32, `count` lanes in the UB) from vectors = {m, mask0, ...};
  // tmp: a scratch of as many lanes.
  std::function<void(KernelBuilder& b, const Reg& count, const std::vector<uint64_t>& vectors,
                     uint64_t fa, uint64_t fs, uint64_t tmp)>
      mask_fold;
};

// The ReLU masks' threshold for outputs stored as t (f32 or f16): the largest f32 that rounds
// (RNE, the vector unit's f32 -> t conversion) to +0 in t, so that z > threshold exactly when
// relu(z) stored as t is > 0, as ReluGrad reads it (f32: 0; f16: 2^-25, the tie between 0 and
// the least subnormal going to even 0). Other types are an error.
float relu_mask_threshold(isa::Dtype t);

struct ChannelSumLaunch {
  Launch launch;   // arguments (rebind them): a, then b (kSumProduct), then m (centered), then
                   // the mask vectors (relu_mask), then partials, then partials2 (plain_sum;
                   // the same layout)
  int blocks = 0;  // partials are [batch][blocks][cp] f32
  // The partials as an epilogue reads them: [batch][partial_rows][partial_pitch] f32 (blocks
  // rows of cp, or with ChannelSumSpec::channels blocks * cp / channels rows of channels).
  int partial_rows = 0;
  int64_t partial_pitch = 0;
};

// The row a channel sum reads a [pixels, c] tensor of elem_bytes elements in: cp = c where c is
// whole 32-byte blocks (channels 0); else, where c is a multiple of 8 of at most 1020 and the
// tensor holds a row's pixels, cp = lcm(c, 32 / elem_bytes) read in place (channels = c,
// ChannelSumSpec::channels); else nothing (the caller pads the channels to whole blocks in a
// copy). NPUSIM_BN_RAGGED_CHANNELS=0 (read at every call): nothing for ragged c either.
struct ChannelSumRow {
  int64_t cp = 0, channels = 0;
};
std::optional<ChannelSumRow> channel_sum_row(int64_t pixels, int64_t c, int64_t elem_bytes);
ChannelSumLaunch build_channel_sum(const ChannelSumSpec& s, const ChipConfig& cfg,
                                   const std::string& op);

// The UB operands of one channel tile of the epilogue (all f32, `count` channels).
struct EpilogueOperands {
  std::vector<uint64_t> sums;     // per partial set: the sum over its blocks
  std::vector<uint64_t> vectors;  // per input vector
  std::vector<uint64_t> outputs;  // per output, stored after compute
  std::vector<uint64_t> temps;
  const Reg* count = nullptr;
};

struct ChannelEpilogueSpec {
  std::string name;
  int64_t c = 0;                 // channels computed and written
  int64_t batch = 1;             // items: partial sets advance blocks * cp, outputs out_pitch
  int64_t partial_cp = 0;        // channel pitch of the partials
  std::vector<int> partial_blocks;  // per partial set: its block count
  int vectors = 0;               // input vectors, f32 [c] (the same for every item)
  int outputs = 0;               // outputs, [c] of out_type per item
  // The outputs' type in memory: f32, or f16 (a c of whole 32-byte blocks), which compute
  // leaves in the output buffers (e.g. converted from an f32 result, one rounding).
  isa::Dtype out_type = isa::Dtype::F32;
  int64_t out_pitch = 0;         // elements between items' outputs (batch > 1)
  int temps = 0;
  bool spread = false;  // channel tiles spread over the vector cores (else one block does all)
  std::function<void(KernelBuilder&, const EpilogueOperands&)> compute;
};
// Arguments (rebind them): the partial sets, then the vectors, then the outputs.
Launch build_channel_epilogue(const ChannelEpilogueSpec& s, const ChipConfig& cfg,
                              const std::string& op);

// build_channel_sum with build_channel_epilogue's work in the same kernel (a split chip's
// vector cores; CANN's reduce kernels add their cores' partials themselves): once every block
// has stored its partials (a barrier of the launch's blocks: cc_set mode 0 from MTE3, which
// waits for the stores to land, cross-core flag 0), the epilogue's channel tiles go to the
// blocks (tile k on block k mod its tiles), each folding the blocks' partials pairwise
// with build_channel_epilogue's code: the same values, bit for bit, and one launch and its
// task overheads fewer. The sums' tiles are build_channel_sum's (the epilogue takes the UB
// again after the barrier). e's partial sets are the sums' ("partials", then "partials2" with
// plain_sum; partial_cp and partial_blocks are set here), e.batch must be s.batch. Arguments:
// build_channel_sum's, then e's vectors, then e's outputs.
ChannelSumLaunch build_channel_sum_with_epilogue(const ChannelSumSpec& s,
                                                 const ChannelEpilogueSpec& e,
                                                 const ChipConfig& cfg, const std::string& op);

// Whether channel sums take their epilogue into their kernel (build_channel_sum_with_epilogue):
// on split chips, unless NPUSIM_FUSION_CHANNEL_EPILOGUE=0 (read once per process, so a kernel
// cache never mixes the two).
bool channel_epilogue_in_kernel(const ChipConfig& cfg);

// Appends the channel sums s and their epilogue e to k: `args` are the sums' arguments before
// the partials (a, b, m, the mask vectors as s has them), `tail` e's vectors then its outputs;
// the partials go to k's workspace. in_kernel (channel_epilogue_in_kernel): one launch
// (build_channel_sum_with_epilogue), else the sums' launch and the epilogue's; the same values.
void append_channel_sum_epilogue(CompiledKernel& k, const std::string& op,
                                 const ChannelSumSpec& s, std::vector<ArgRef> args,
                                 ChannelEpilogueSpec e, const std::vector<ArgRef>& tail,
                                 const ChipConfig& cfg, bool in_kernel);

// The channel sums of a (kSum or kSumSquares [+ plain_sum], one item, not centred) as the
// vector section of a mix kernel another emitter builds in b (split chips: `groups` blocks,
// each a cube core and its aiv_per_aic vector cores; vector core v of group g sums block
// g * aiv_per_aic + v of the pixels). a is the kernel argument a_arg, declared by the caller;
// the section declares "partials" (and "partials2") after the arguments declared before it.
// wait (if set) emits the instructions every vector core issues before it reads a (e.g. a
// cross-core wait for the cube's output). Returns the blocks that write partials (the
// epilogue's partial_blocks; vector cores past the pixels write none).
// With epilogue set, the kernel also adds the partials itself: once every vector core of the
// launch has stored its partials (a barrier of the launch's vector cores, cross-core flag
// barrier_flag), the epilogue's channel tiles are spread over the vector cores (tile k on
// vector core k mod its blocks), each folding the blocks' partials pairwise, as
// build_channel_epilogue does (the same sums, bit for bit). Its partial sets are the section's
// arguments named in epilogue_sets ("partials", "partials2"; partial_blocks is set from the
// section's blocks), it has no input vectors, and it declares its outputs "output0", ...
// after partials2. The sums' tiles leave the epilogue's UB buffers free (planned for as many
// partials as the section has vector cores).
struct ChannelSumSection {
  const char* a_arg = "a";
  int groups = 1;
  std::function<void(KernelBuilder&)> wait;
  const ChannelEpilogueSpec* epilogue = nullptr;
  std::vector<std::string> epilogue_sets;
  int barrier_flag = 0;
};
int emit_channel_sum_section(KernelBuilder& b, const ChannelSumSpec& s,
                             const ChannelSumSection& sec);

// The epilogue e alone as the vector section of a mix kernel another emitter builds in b (split
// chips: `groups` blocks, each a cube core and its aiv_per_aic vector cores): every vector core
// issues `wait` (the cube cores' hand-over of the partials), then e's channel tiles are spread
// over the launch's vector cores (tile k on vector core k mod its blocks), each summing the
// partial sets pairwise as build_channel_epilogue does (the same sums, bit for bit). The
// partial sets are the kernel arguments named in partial_args (declared before, [batch][blocks]
// [partial_cp] f32); e has no input vectors; the section declares e's outputs "output0", ...
void emit_epilogue_section(KernelBuilder& b, const ChannelEpilogueSpec& e,
                           const std::vector<std::string>& partial_args, int groups,
                           const std::function<void(KernelBuilder&)>& wait);

// The end of a vector kernel whose `blocks` blocks have each stored their partial sets (the
// arguments named in partial_args, [e.batch][blocks][e.partial_cp] f32, stored by MTE3) in the
// section begun in b: a barrier of the launch's blocks (cross-core flag barrier_flag: cc_set
// from MTE3, which waits for the stores to land), then e's channel tiles spread over the blocks
// (tile k on block k mod its tiles), each folding the blocks' partials pairwise as
// build_channel_epilogue does (the same sums, bit for bit), its buffers laid out over the whole
// UB (every pipe is done with the kernel's own by the barrier). e's partial_blocks are set here;
// its vectors and outputs are arguments "vector<i>", "output<i>" the caller declared. Split
// chips only (cross-core flags).
// rows_per_block: partial rows each block stored (ChannelSumSpec::channels: a row's pixels).
void emit_partials_epilogue(KernelBuilder& b, ChannelEpilogueSpec e,
                            const std::vector<std::string>& partial_args, int blocks,
                            int barrier_flag, int rows_per_block = 1);

// The per-channel sums of an f32 result that the stream kernel `spec` (elementwise.h) computes
// per tile, as a second product of its pass (BNTrainingReduceGrad's bias gradient): its tiles
// and pieces are whole periods of the c channels (a resident per-channel input), so lane i of a
// tile is channel i mod c. Adds to spec a temporary "channel sums" (f32, one tile or piece;
// StreamSpec::accumulators) that spec's compute adds its f32 result into, lane by lane (the
// returned temporary index), and a block_finish that folds that tile's rows into c sums
// (halving: the top rows added into the bottom ones), stores them as the block's partials
// (argument "partials", [blocks][c] f32) and, with in_kernel (channel_epilogue_in_kernel), runs
// e over them after a barrier of the launch's blocks (emit_partials_epilogue; e's outputs the
// arguments "output0", ... after "partials"). Without in_kernel, build_channel_epilogue(e) over
// the partials (partial_blocks: the launch's block_dim) is the caller's next launch. c must be
// a multiple of 8 (whole 32-byte blocks of f32).
size_t add_stream_channel_sums(StreamSpec& spec, int64_t c, const ChannelEpilogueSpec& e,
                               bool in_kernel);

// The epilogue of plain channel sums (one partial set) stored as output 0 in out_type: f32 as
// summed, or f16 rounded once (vconv, round to nearest even, as a Cast's); its tiles spread
// over the vector cores. A bias gradient's (BiasAddGrad, BNTrainingReduceGrad's output 1).
ChannelEpilogueSpec rounded_sums_epilogue(const std::string& name, int64_t c, isa::Dtype out_type);

// Counter-mode helpers over `count` f32 lanes for epilogue code.
void f32_binary(KernelBuilder& b, isa::Opcode op, uint64_t d, uint64_t a, uint64_t c,
                const Reg& count);
void f32_unary(KernelBuilder& b, isa::Opcode op, uint64_t d, uint64_t a, const Reg& count);
void f32_scalar(KernelBuilder& b, isa::Opcode op, uint64_t d, uint64_t a, double v,
                const Reg& count);
void f32_copy(KernelBuilder& b, uint64_t d, uint64_t a, const Reg& count);
// Sums `rows` rows of f32 (row r at base + r * pitch * 4 bytes, its first `lanes` lanes) into
// dst's `lanes` lanes as a fixed pairwise tree: while more than one row is left, the top half
// (rounded down) of the rows is added lane-wise onto the bottom rows, one vadd a level
// (ceil(log2 rows) levels; the last writes dst). The rows are overwritten (unless rows is 1:
// then a copy where dst is not base). Used by every channel epilogue, the stream sums' tile and
// the convolution's batch-norm statistics (conv_emitter.cpp, add_partials).
void fold_rows_pairwise(KernelBuilder& b, uint64_t dst, uint64_t base, int64_t rows,
                        int64_t pitch, int64_t lanes);
// Several sets of rows of the same geometry folded as above (the same sums, set by set), level
// by level: a level's vadd of every set, in the order given, before the next level's (the sets'
// vadds independent of one another, one instruction count per level: the UB addresses of a
// set's rows and of its result).
struct FoldedRows {
  uint64_t dst = 0, base = 0;
};
void fold_rows_pairwise(KernelBuilder& b, const std::vector<FoldedRows>& sets, int64_t rows,
                        int64_t pitch, int64_t lanes);
void f32_fill(KernelBuilder& b, uint64_t d, double v, const Reg& count);

}  // namespace npusim::compiler::ops
