// Cast (compiled by adapter/compiler/ops/cast.cpp; int64 on either side by ops/int64.cpp on the
// scalar unit). Every Cast registration of the plugin is in the table below: TensorFlow refuses a
// node that two registrations of one op match, so the rows' (SrcT, DstT) sets must not overlap.
// One row per DstT, naming the SrcT the compiler converts to it bit-exactly as TF's CPU kernel
// (tests/tf/test_kernels_cast.py checks every pair on edge values):
//   - between the floats, and float <-> int32/int16/uint16/int8/uint8 (to integers: values in
//     range; TF's out-of-range and NaN results are undefined behaviour, the vector unit saturates);
//   - everything to bool (x != 0); bool to everything (0 / 1; to int8 / uint8 a byte copy);
//   - integer -> wider integer of the same signedness, or unsigned -> wider signed (widening
//     keeps the value); not integer -> narrower or same-width (TF wraps, the vector unit
//     saturates) nor signed -> unsigned (TF wraps negative values);
//   - int64 to and from every type (the scalar unit wraps to narrower integers as TF).
// int32 inputs and outputs stay in device memory (no HostMemory): the int32 -> float label
// casts of Keras' losses run on the chip.
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {
namespace {

class CastOp : public CompiledOpKernel {
 public:
  explicit CastOp(OpKernelConstruction* ctx)
      : CompiledOpKernel(ctx, {{"SrcT", AttrSpec::Kind::kType},
                               {"DstT", AttrSpec::Kind::kType},
                               {"Truncate", AttrSpec::Kind::kBool}}) {}
};

struct CastRow {
  TF_DataType dst;
  std::vector<TF_DataType> srcs;
};

// Sources per destination.
const std::vector<CastRow>& cast_rows() {
  static const auto* rows = [] {
    const std::vector<TF_DataType> any = {TF_FLOAT, TF_HALF,  TF_BFLOAT16, TF_INT32, TF_INT16,
                                          TF_UINT16, TF_INT8, TF_UINT8,    TF_BOOL,  TF_INT64};
    // Into a float or bool: from everything.
    // Into an integer: from the floats, int64, itself and the narrower types (bool included)
    // that widen to it without changing the value (bool -> int8 / uint8: the compiler copies
    // the 0 / 1 bytes).
    auto into_int = [](TF_DataType self, std::vector<TF_DataType> narrower) {
      std::vector<TF_DataType> v = {TF_FLOAT, TF_HALF, TF_BFLOAT16, TF_INT64, self};
      v.insert(v.end(), narrower.begin(), narrower.end());
      return v;
    };
    return new std::vector<CastRow>{
        {TF_FLOAT, any},
        {TF_HALF, any},
        {TF_BFLOAT16, any},
        {TF_BOOL, any},
        {TF_INT64, any},
        {TF_INT32, into_int(TF_INT32, {TF_INT16, TF_UINT16, TF_INT8, TF_UINT8, TF_BOOL})},
        {TF_INT16, into_int(TF_INT16, {TF_INT8, TF_UINT8, TF_BOOL})},
        {TF_UINT16, into_int(TF_UINT16, {TF_UINT8, TF_BOOL})},
        {TF_INT8, into_int(TF_INT8, {TF_BOOL})},
        {TF_UINT8, into_int(TF_UINT8, {TF_BOOL})},
    };
  }();
  return *rows;
}

}  // namespace

rt::Status register_cast_kernels() {
  for (const CastRow& row : cast_rows()) {
    rt::Status st = register_kernel<CastOp>(KernelDefBuilder("Cast")
                                                .TypeConstraint("SrcT", row.srcs)
                                                .TypeConstraint("DstT", {row.dst}));
    if (!st.ok()) return st;
  }
  return rt::ok_status();
}

}  // namespace npusim::tf
