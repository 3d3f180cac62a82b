// 8-byte integer (TF int64) kernels on the scalar unit. No vector or cube instruction computes
// on 8-byte integers (op_desc.h), and 32-bit lane pairs with carries would need a carry-out
// per lane the vector unit does not give (a compare + select per add, and no 64-bit multiply),
// so s64 arithmetic runs on the scalar unit, whose registers are 64-bit two's complement
// (sim/exec/scalar_alu.h: add/sub/mul wrap modulo 2^64, min/max signed) with 8-byte ld / st at
// GM byte addresses. The common s64 tensors of training (Keras' iteration counter, metric
// counts, labels) have a handful of elements.
//
// Cost model: every element costs its scalar instructions (about 10-20 for an element-wise op,
// plus 4-6 per broadcast input dim, ~40 for a conversion to f32) at the scalar unit's rate,
// spread over the vector cores in ranges of at least kScalarMapMinPerBlock elements; no MTE or
// vector pipe is used. A million-element s64 tensor therefore costs ~10^6 * 20 / cores scalar
// cycles, some 100x the vector unit's cost for s32 of the same size.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/registry.h"

namespace npusim::compiler::ops {

// Arguments in (s32[n]), out (s64[n]): out[i] = in[i], sign-extended. n >= 1.
Launch build_widen_s32_to_s64(const std::string& op, int64_t n, const ChipConfig& cfg);

// Arguments in (s64[n]), out (s32[n]): out[i] = min(max(in[i], lo), hi) (lo, hi in the s32
// range), so out-of-range values stay recognisable (e.g. lo = -1, hi = C for class labels).
// n >= 1. Writes whole 8-byte pairs: for odd n the 4 bytes after the tensor, inside its
// rounded-up buffer (op_desc.h).
Launch build_narrow_s64_to_s32(const std::string& op, int64_t n, int64_t lo, int64_t hi,
                               const ChipConfig& cfg);

// ---- the scalar element-wise kernel ("scalar map") ----

inline constexpr int64_t kScalarMapMinPerBlock = 256;  // elements per block at least

struct ScalarMapInput {
  DataType dtype;
  std::vector<int64_t> shape;  // broadcast to the output's shape (numpy rules)
  // false: nothing is loaded; the compute function receives the input's GM base address in
  // its register instead of a value (kernels that read many elements per output, e.g. the
  // scalar reductions); `shape` is then only the argument's declared shape.
  bool load = true;
};

// Computes dst (a 64-bit register) for one output element from the input values `in` (each
// input element as a 64-bit integer: S64 as is, S32/S16/S8 sign-extended, U8/U16/BOOL
// zero-extended, float types as their raw bits, zero-extended) and the element's flat output
// index. Must not write the `in` or `index` registers.
using ScalarMapFn = std::function<void(KernelBuilder& b, const Reg& dst,
                                       const std::vector<Reg>& in, const Reg& index)>;

struct ScalarMapSpec {
  std::string kernel_name;
  std::vector<ScalarMapInput> inputs;
  DataType out_type = DataType::S64;  // stored as the low bytes of dst (integers wrap)
  std::vector<int64_t> out_shape;     // at least one element
  ScalarMapFn compute;
};

// The kernel: arguments in0..in<n-1> (kInput i), out (kOutput 0). Each block takes a range of
// output elements (a multiple of 8 / out element size, so that blocks write disjoint 8-byte
// words); elements are packed into 8-byte words and stored with st. Writes whole 8-byte words:
// up to 7 bytes after the tensor, inside its rounded-up buffer (op_desc.h). Reads inputs with
// 8-byte ld: up to 7 bytes past an input's end (allowed by the buffer contract).
Launch build_scalar_map(const std::string& op, const ScalarMapSpec& spec, const ChipConfig& cfg);

// Scalar-unit conversions used by the s64 ops (exposed for their tests' documentation):
// dst = the f32 bits of the s64 value in src, rounded to nearest even (as static_cast<float>).
void emit_s64_to_f32_bits(KernelBuilder& b, const Reg& dst, const Reg& src);
// dst = the f32 (bits in src, zero-extended) truncated toward zero to s64, saturated as the
// vector unit's float -> integer vconv (common/convert.h): values beyond the s64 range and
// infinities give INT64_MIN / INT64_MAX by sign, NaN gives 0. (TF's CPU Cast is undefined
// behaviour there; x86 gives INT64_MIN for all of them.)
void emit_f32_bits_to_s64(KernelBuilder& b, const Reg& dst, const Reg& src);

// Element-wise binary ops on s64 inputs with broadcasting: AddV2, Add, Sub, Mul, Maximum,
// Minimum, SquaredDifference (s64 out, wrapping), Equal, NotEqual, Less, LessEqual, Greater,
// GreaterEqual (bool out). Called by compile_binary for S64 inputs (types already checked),
// and for Equal / NotEqual of BOOL inputs (the 0 / 1 bytes compared).
CompiledKernel compile_s64_binary(const CompileContext& ctx);
// FloorMod and FloorDiv of s64 with broadcasting (registered ops; TF's floor semantics for
// signed integers: the remainder takes the divisor's sign, the quotient rounds toward -inf). A
// zero divisor faults on the scalar unit ("division by zero": the op fails, as TF's CPU kernel
// fails with "Integer division by zero"). Other dtypes are rejected.
CompiledKernel compile_s64_floor(const CompileContext& ctx);
// Cast with S64 on either side (src != dst), called by compile_cast: s64 <-> any integer type
// and bool, s64 <-> f32 on the scalar unit, s64 <-> f16/bf16 through f32 (a vector Cast launch
// and a workspace slice).
CompiledKernel compile_s64_cast(const CompileContext& ctx, DataType src, DataType dst);
// Reductions on the scalar unit: Sum, Max, Min, Prod and Mean of s64 (wrapping, as TF's int64
// kernels), and Mean of s32 (TF: the int64 sum divided by the count with truncation toward
// zero, then cast to int32). Each output element loops over its reduced elements (nested loops
// over the merged reduced dims: ~8 scalar instructions per input element), outputs split over
// the vector cores. `in` / `out` are arguments of `plan`. An empty reduction gives the identity
// (0, 1, INT64_MIN, INT64_MAX); an empty Mean is an error (TF divides by zero).
void append_scalar_reduce(LaunchPlan& plan, const CompileContext& ctx, const std::string& kind,
                          const TensorDesc& input, const std::vector<bool>& reduced,
                          ArgRef in, ArgRef out);

// Cumsum of s64 over x seen as [outer, n, inner] (wrapping, exclusive / reverse as TF): each
// column (o, i) is scanned sequentially (ld, add, st: ~6 scalar instructions per element),
// columns split over the vector cores. Arguments in0 (x), out.
Launch build_s64_cumsum(const std::string& op, int64_t outer, int64_t n, int64_t inner,
                        bool exclusive, bool reverse, const ChipConfig& cfg);

// UnsortedSegmentSum of s64 data [rows, inner] by ids [rows] (s32 / s64) into
// out [segments, inner] (wrapping adds; ids outside [0, segments) dropped, as the vector
// kernel). Each block owns a range of columns: zeroes them, then adds every row whose id is in
// range (~6 scalar instructions per data element). Arguments in0 (data), in1 (ids), out.
Launch build_s64_segment_sum(const std::string& op, int64_t rows, int64_t inner,
                             int64_t segments, DataType id_type, const ChipConfig& cfg);

// Range of s64 (start + i * delta, n elements; the values TF's accumulation gives).
CompiledKernel s64_range(const CompileContext& ctx, int64_t start, int64_t delta, int64_t n);

}  // namespace npusim::compiler::ops
