// Vector building blocks for row-wise kernels (ops/reduce.cpp, ops/softmax.cpp): per-row
// reductions, turning one value per row back into a value per lane, and the double buffering
// (PingPong) of their loads and stores.
//
// Compute type: all row-wise math runs on 4-byte lanes (f32 for float tensors, s32 for s32), 64
// lanes per 256-byte repeat, 8 per 32-byte block. f16/bf16 are widened with vconv first.
//
// The problem these pieces solve: vector operands start on 32-byte UB blocks and MTE transfers
// move whole blocks, but TF rows start anywhere (a row of 10 f32 starts at byte 40). Rows are
// therefore grouped into SUPER-ROWS of g rows, g = granule / gcd(R, granule) (granule = elements
// per 32 bytes of the narrowest tensor moved), so that a super-row of g*R elements is a whole
// number of blocks: a group of super-rows is one contiguous, block-aligned piece of the tensor
// (one copy in, one copy out). Inside a super-row, row j occupies lanes [jR, jR + R); it is
// covered by a compile-time list of 64-lane repeats (RowSpan: a block-aligned lane offset and
// the lane mask of the row), and every per-row instruction runs on all super-rows of a group
// at once (repeat = super-rows, repeat stride = the super-row).
//
// Per-row reductions go through a LANE ACCUMULATOR: one 64-lane slot (256 bytes) per row, in
// row order. Step 1 (rows_to_lanes) combines each row's spans lane-wise into its slot (lanes of
// other rows masked off, the slot starting at the reduction's identity); step 2 (lanes_reduce)
// reduces each slot to one value with vcadd / vcmax / vcmin (one instruction for all rows),
// giving a DENSE vector of one value per row, in row order and block-aligned.
//
// Per-row values come back to lanes through replicate_rows: a dense vector of 4-byte values
// becomes one 32-byte block per row holding the value 8 times, built from 16-bit transposes
// (vtranspose) and an alternating vsel. rows_bcast then applies it to every lane of each row
// with a block stride of 0 (the 8 blocks of a repeat all read the row's block).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "adapter/compiler/kernel_builder.h"
#include "isa/isa.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

inline constexpr int64_t kLanes32 = 64;                   // 4-byte lanes of one 256-byte repeat
inline constexpr int64_t kBlockLanes32 = 8;               // 4-byte lanes of one 32-byte block
inline constexpr int64_t kSlotBytes = vec::kRepeatBytes;  // one lane-accumulator slot (a repeat)
inline constexpr int64_t kMaxRepeat = 255;                // the RU8 repeat and stride fields
inline constexpr int64_t kMaxGroupRows = 240;  // rows per group: <= kMaxRepeat, a multiple of 16

// A strided vector operand: UB address (register or immediate), block and repeat strides in
// 32-byte blocks.
struct VOperand {
  VOperand(Opnd a, int64_t blk_stride = 1, int64_t rep_stride = 8)
      : addr(a), blk(blk_stride), rep(rep_stride) {}
  Opnd addr;
  int64_t blk;
  int64_t rep;
};

// Normal-mode mask over the 64 lanes of a 4-byte repeat (bit i = lane i).
void set_mask_lanes(KernelBuilder& b, uint64_t lanes);
inline constexpr uint64_t kAllLanes = ~uint64_t{0};
inline constexpr uint64_t lane_range(int64_t lo, int64_t hi) {  // lanes [lo, hi), 0..64
  return (hi >= 64 ? ~uint64_t{0} : (uint64_t{1} << hi) - 1) & ~((uint64_t{1} << lo) - 1);
}

// Strided vector instructions under the current mask, `repeat` repeats.
void vec_binary_strided(KernelBuilder& b, isa::Opcode op, isa::Dtype t, VOperand dst, VOperand src0,
                        VOperand src1, Opnd repeat);
void vec_unary_strided(KernelBuilder& b, isa::Opcode op, isa::Dtype t, VOperand dst, VOperand src,
                       Opnd repeat);
void vec_scalar_strided(KernelBuilder& b, isa::Opcode op, isa::Dtype t, VOperand dst, VOperand src,
                        const Reg& scalar, Opnd repeat);
// bits (dense, 8 bytes per 64-lane repeat) = src0 <cmp> src1.
void vec_compare_strided(KernelBuilder& b, isa::Dtype t, isa::Cmp cmp, Opnd bits, VOperand src0,
                         VOperand src1, Opnd repeat);
// dst = bit ? src0 : src1.
void vec_select_strided(KernelBuilder& b, isa::Dtype t, VOperand dst, VOperand src0, VOperand src1,
                        Opnd bits, Opnd repeat);
// vcadd / vcmax / vcmin: one value per repeat, dense at dst.
void vec_reduce_strided(KernelBuilder& b, isa::Opcode op, isa::Dtype t, Opnd dst, VOperand src,
                        Opnd repeat);
// blocks = the 32-byte blocks covering count * size bytes (count a register).
void count_blocks(KernelBuilder& b, const Reg& blocks, const Reg& count, int64_t size);

// Counter mode: `count` lanes of 4 bytes at dst = bits (vdup of the s32 view).
void vec_fill32(KernelBuilder& b, Opnd dst, int64_t bits, Opnd count);

// The combining reductions and their vector instructions.
enum class Combine { kSum, kMax, kMin, kProd };
isa::Opcode combine_opcode(Combine c);         // vadd vmax vmin vmul
isa::Opcode combine_reduce_opcode(Combine c);  // vcadd vcmax vcmin (not kProd)
// The identity as the 32 bits of a lane of type t (f32 or s32): 0, -inf / INT_MIN,
// +inf / INT_MAX, 1.
int64_t combine_identity_bits(Combine c, isa::Dtype t);

// ---- super-rows ----

// One 64-lane repeat covering part of a row: `offset` lanes from the super-row's start (a
// multiple of 8, so the repeat starts on a block) and the row's lanes in it.
struct RowSpan {
  int64_t offset = 0;
  uint64_t mask = 0;
};

struct SuperRowLayout {
  int64_t row = 0;    // R: elements per row (>= 1)
  int64_t rows = 1;   // g: rows per super-row (a power of two dividing the granule)
  int64_t lanes = 0;  // S = g * R
  std::vector<std::vector<RowSpan>> spans;  // per row j of the super-row
  // granule: elements per 32-byte block of the narrowest tensor loaded or stored whole (8 or
  // 16); S is then a whole number of blocks of every such tensor and of the 4-byte lanes.
  static SuperRowLayout make(int64_t row, int64_t granule);
  int64_t blocks32() const { return lanes / kBlockLanes32; }  // 32-byte blocks of 4-byte lanes
};

// A group of super-rows in the UB, as 4-byte lanes [supers][S].
struct RowGroup {
  const SuperRowLayout* layout = nullptr;
  uint64_t x = 0;               // UB address of lane 0 of super-row 0
  const Reg* supers = nullptr;  // super-rows in the group (1 .. kMaxRepeat), a register
  const Reg* rows = nullptr;    // supers * g, a register
};

// Calls body(first, count, x_rep) once with all super-rows (first = 0, count = supers, x_rep =
// the super-row in blocks) when the super-row is at most 255 blocks, else once per super-row in
// a run-time loop (count 1, x_rep 0). `first` holds the batch's first super-row.
void for_superrow_batches(
    KernelBuilder& b, const RowGroup& g,
    const std::function<void(const Reg& first, Opnd count, int64_t x_rep)>& body);

// Lane accumulator: slot r (256 bytes at acc + r*256) = identity, then the lanes of row r of
// the group combined into it (rows in order: super-row s, row j -> slot s*g + j).
void rows_to_lanes(KernelBuilder& b, const RowGroup& g, Combine c, isa::Dtype t, uint64_t acc);
// rows_to_lanes' sums in the same order (identity, then span by span), each add writing the
// other of two slot buffers acc and acc2 (rows of the group's size each) instead of its own
// (an in-place add is two UB bank accesses per block): for rows of whole 64-lane spans, one row
// per super-row; other layouts take rows_to_lanes into acc. Returns acc or acc2: where the
// sums are.
uint64_t rows_to_lanes_alternating(KernelBuilder& b, const RowGroup& g, Combine c, isa::Dtype t,
                                   uint64_t acc, uint64_t acc2);
// dense[r] = the combination of the 64 lanes of slot r, r < rows (a register <= 255). kProd
// folds the slots to 8 lanes and multiplies the 8 lanes extracted one by one (vcmax of one
// active lane), using tmp (rows * 4 bytes).
void lanes_reduce(KernelBuilder& b, Combine c, isa::Dtype t, uint64_t acc, const Reg& rows,
                  uint64_t dense, uint64_t tmp);

// Folds lanes [0, n) of buf (n a register >= 1, 4-byte lanes) in halves to at most 64 lanes
// ([0, m - h) op= [h, m) with h a multiple of 64, counter mode) and combines those lanes into
// the 64-lane slot: slot[i] op= buf[i] for i < min(n, 64). buf is overwritten.
void fold_into_slot(KernelBuilder& b, Combine c, isa::Dtype t, uint64_t buf, const Reg& n,
                    Opnd slot);

// Arg reductions (first index of the maximum / minimum, NaN ignored):
// rows_to_lanes_arg keeps per slot lane the best value (acc_val, identity first) and its index
// in the row (acc_idx, s32, 0 first), taking a later lane only if strictly better; iota64 holds
// s32 0..63, t64 is a 64-lane s32 scratch, bits holds supers * 8 bytes.
void rows_to_lanes_arg(KernelBuilder& b, const RowGroup& g, bool is_max, isa::Dtype t,
                       uint64_t acc_val, uint64_t acc_idx, uint64_t iota64, uint64_t t64,
                       uint64_t bits);
// One chunk of `count` lanes (a register, <= 64) at src, lane i having index idx0 + i (idx0 a
// register), into the slot at (acc_val, acc_idx); strictly better lanes win.
void lanes_arg_step(KernelBuilder& b, bool is_max, isa::Dtype t, Opnd src, const Reg& count,
                    const Reg& idx0, Opnd acc_val, Opnd acc_idx, uint64_t iota64, uint64_t t64,
                    uint64_t bits);
// dense_idx[r] = the smallest index among the lanes of slot r holding the slot's best value;
// dense_val[r] = that value. rep: rows * 32 bytes; scratch: see replicate_rows; big64: 64 s32
// lanes of INT_MAX; bits: rows * 8 bytes. acc_idx is overwritten.
struct ArgScratch {
  uint64_t rep = 0, replicate = 0, alt = 0, big64 = 0, bits = 0;
};
void lanes_reduce_arg(KernelBuilder& b, bool is_max, isa::Dtype t, uint64_t acc_val,
                      uint64_t acc_idx, const Reg& rows, uint64_t dense_val, uint64_t dense_idx,
                      const ArgScratch& s);

// rep[r] (a 32-byte block) = dense[r] (4 bytes) 8 times, r < rows (a register <= 255):
// per 8 rows a 16 x 16 u16 matrix whose rows all hold the 8 values (vcopy, block stride 0) is
// transposed (vtranspose: row 2k = the low halves of value k, row 2k+1 the high halves) and the
// pairs of rows are interleaved by a vsel on an alternating pattern.
// scratch: replicate_scratch_bytes(max rows); alt: the pattern (fill_alt_pattern).
// rep's bytes for replicate_rows: a block per row of whole groups of 8 rows (it writes 8 rows'
// blocks per group, the last group's too).
uint64_t replicated_bytes(int64_t max_rows);
uint64_t replicate_scratch_bytes(int64_t max_rows);
uint64_t alt_pattern_bytes(int64_t max_rows);
void replicate_rows(KernelBuilder& b, uint64_t dense, const Reg& rows, uint64_t rep,
                    uint64_t scratch, uint64_t alt);

// wide[r] (a 256-byte repeat) = rep[r] (a 32-byte block, replicate_rows') 8 times, r < rows (a
// register <= 255): one vcopy reading each row's block with a block stride of 0.
void widen_rows(KernelBuilder& b, uint64_t rep, const Reg& rows, uint64_t wide);

// As widen_rows, for rows rounded up to whole groups of 8 (wide: that many 256-byte repeats):
// eight vcopy instructions of ceil(rows / 8) repeats, repeat i of the k-th writing block k of
// rows 8i..8i+7 from their 8 consecutive blocks of rep, so every repeat touches 8 banks once per
// operand instead of one bank 8 times (UB bank model: about 2 cycles per 8 rows instead of 8 per
// row).
void widen_row_groups(KernelBuilder& b, uint64_t rep, const Reg& rows, uint64_t wide);

// The same result for groups of up to max_rows rows, in whichever form issues fewer vector
// cycles: widen_row_groups (8 instructions of ceil(rows / 8) repeats) or, for few groups of 8
// rows (max_rows <= 56), one vcopy per 8 rows in a run-time loop, its repeat k writing block k of
// the 8 rows' repeats from their 8 consecutive blocks (8 banks per operand and repeat; 8 repeats).
// wide: widened_bytes(max_rows); rep: replicated_bytes(max_rows).
void widen_rows_grouped(KernelBuilder& b, uint64_t rep, const Reg& rows, uint64_t wide,
                        int64_t max_rows);
uint64_t widened_bytes(int64_t max_rows);

// For every row of the group: dst lanes = op(lanes, rep[row]) (rep_first: op(rep[row], lanes)),
// op a VBIN instruction of type t; dst has the group's layout (0: in place, g.x). rep holds a
// 32-byte block per row (replicate_rows; read 8 times per repeat with a block stride of 0, 8
// accesses to one UB bank) or, rep_wide, a 256-byte repeat per row (widen_rows; 8 blocks in 8
// banks, one access each): the wide form when a row value is applied to many row spans.
void rows_bcast(KernelBuilder& b, const RowGroup& g, isa::Opcode op, isa::Dtype t, uint64_t rep,
                bool rep_first = false, uint64_t dst = 0, bool rep_wide = false);
// rows_bcast into the rows at dst, any UB address (0 included: a buffer at the UB's start).
void rows_bcast_into(KernelBuilder& b, const RowGroup& g, isa::Opcode op, isa::Dtype t,
                     uint64_t rep, bool rep_first, uint64_t dst, bool rep_wide);

// ---- constants ----
void fill_iota64(KernelBuilder& b, uint64_t iota64);                      // s32 0..63
void fill_alt_pattern(KernelBuilder& b, uint64_t alt, int64_t max_rows);  // 0x55 bytes

// ---- double buffering: loads (MTE2) -> vector (V) -> stores (MTE3) overlapped ----

// Two copies (ping q = 0, pong q = 1) of a kernel's load buffers and of its output buffers, each
// guarded by its own flags (as the element-wise kernel's tiles), so that MTE2 fills copy 1 - q
// while V works on copy q, and MTE3 stores one output copy while V computes into the other.
// Loads and outputs each have a run-time parity register (a kernel may load several times per
// output, as the streamed and columns reductions do); flag ids are immediates, so a step's code
// is emitted once per parity (KernelBuilder::by_parity) with the parity as a constant.
//   load_step(body):  body(q) = wait_load_free(q), loads into copy q, loaded(q), V work on copy
//                     q, release_load(q); then the load parity flips.
//   out_step(body):   body(q) = wait_out_free(q), V writes output copy q, out_ready(q), the
//                     stores, stored(q); then the output parity flips.
// V waits for a copy's loads only after issuing the previous step's work, so the loads of step
// i + 1 run under step i's vector work; MTE3 likewise. drain() before end consumes the free
// flags of both copies.
class PingPong {
 public:
  explicit PingPong(KernelBuilder& b);
  void load_step(const std::function<void(int q)>& body);
  void out_step(const std::function<void(int q)>& body);
  // Software-pipelined steps 0 .. steps-1 (steps a register; step t uses copy q = t & 1 for
  // its loads and, if it stores, its outputs): in program order step t + 1's loads are issued
  // before step t's vector work (KernelBuilder::pipelined_steps), so they reach MTE2 even while
  // the scalar unit waits on a full vector queue. load(t, q): wait_load_free(q), the loads,
  // load_done(q). compute(t, q): wait_loaded(q), V work, release_load(q) [, wait_out_free(q),
  // ..., stored(q)]. The copy comes from t, not from the parity registers: a kernel drives its
  // load (output) flags either through pipeline or through load_step (out_step), not both (the
  // streamed reduction pipelines its loads and stores per group through out_step).
  void pipeline(const Reg& steps, const std::function<void(const Reg& t, int q)>& load,
                const std::function<void(const Reg& t, int q)>& compute);
  void wait_load_free(int q);  // MTE2 waits until V released load copy q
  void loaded(int q);          // MTE2 signals, V waits for the loads into copy q
  void load_done(int q);       // MTE2 signals the loads into copy q (pipeline: load side)
  void wait_loaded(int q);     // V waits for them (pipeline: compute side)
  void release_load(int q);    // V is done with load copy q
  void wait_out_free(int q);   // V waits until MTE3 stored output copy q
  void out_ready(int q);       // V signals, MTE3 waits for output copy q
  void stored(int q);          // MTE3 is done with output copy q
  void drain();

 private:
  void flip(const Reg& parity);
  KernelBuilder& m_b;
  FlagPair m_load_free, m_load_ready, m_out_free, m_out_ready;
  Reg m_load_parity, m_out_parity;
};

}  // namespace npusim::compiler::ops
