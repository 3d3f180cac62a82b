// Data movement and generators (adapter/compiler/ops/layout.cpp, gather.cpp, fill.cpp,
// select.cpp, scan.cpp): Transpose, ConcatV2, Pack, Unpack, Split, SplitV, Slice,
// StridedSliceGrad, Pad, PadV2, MirrorPad, Select, SelectV2, ClipByValue, Fill, ZerosLike,
// OnesLike, GatherV2, UnsortedSegmentSum, OneHot, Cumsum, Range.
//
// Shape-like operands (perm, axis, split_dim, begin/size, paddings, dims, depth, ...) are
// HostMemory and read into the compiler's attributes of the same names (docs/compiler.md,
// "Data movement ops"); data tensors and data-dependent indices stay on the chip.
//
// Types: the movers are bit-exact for every type the chip holds; the ops that compute
// (ClipByValue, UnsortedSegmentSum, Cumsum) take f32/f16/bf16/s32, Range f32. Where TensorFlow
// already registers an int32 kernel for DEVICE_DEFAULT (host-memory shape arithmetic: ConcatV2,
// Unpack, Slice, Fill, ZerosLike, OnesLike, Range), int32 is left to it, so shape tensors stay
// on the host as TensorFlow's other devices keep them.
#include "adapter/tf/plugin/compiled_op_table.h"
#include "adapter/tf/plugin/kernel_families.h"

namespace npusim::tf {
namespace {

using K = AttrSpec::Kind;
using H = HostAttrInput::Kind;

std::vector<TF_DataType> without_int32(const std::vector<TF_DataType>& types) {
  std::vector<TF_DataType> v;
  for (TF_DataType t : types)
    if (t != TF_INT32) v.push_back(t);
  return v;
}

const std::vector<AttrSpec> kStridedSliceMasks = {
    {"begin_mask", K::kInt},    {"end_mask", K::kInt},          {"ellipsis_mask", K::kInt},
    {"new_axis_mask", K::kInt}, {"shrink_axis_mask", K::kInt}};

std::vector<AttrSpec> with_t(std::vector<AttrSpec> attrs) {
  attrs.insert(attrs.begin(), AttrSpec{"T", K::kType});
  return attrs;
}

}  // namespace

rt::Status register_layout_kernels() {
  const std::vector<TF_DataType> moves_no_s32 = without_int32(kMoveTypes);
  const std::vector<AttrSpec> t_only = with_t({});
  return register_compiled_ops({
      {"Transpose", {{"T", kMoveTypes}}, t_only, {{"perm", {1, "perm"}}}},
      {"ConcatV2", {{"T", moves_no_s32}}, with_t({{"N", K::kInt}}),
       {{"axis", {-1, "axis", H::kInt}}}},
      {"Pack", {{"T", kMoveTypes}}, with_t({{"N", K::kInt}, {"axis", K::kInt}}), {}},
      {"Unpack", {{"T", moves_no_s32}}, with_t({{"num", K::kInt}, {"axis", K::kInt}}), {}},
      {"Split", {{"T", kMoveTypes}}, with_t({{"num_split", K::kInt}}),
       {{"split_dim", {0, "split_dim", H::kInt}}}},
      {"SplitV", {{"T", kMoveTypes}}, with_t({{"num_split", K::kInt}}),
       {{"size_splits", {1, "size_splits"}}, {"split_dim", {2, "split_dim", H::kInt}}}},
      {"Slice", {{"T", moves_no_s32}}, t_only, {{"begin", {1, "begin"}}, {"size", {2, "size"}}}},
      {"StridedSliceGrad", {{"T", kMoveTypes}}, with_t(kStridedSliceMasks),
       {{"shape", {0, "shape"}},
        {"begin", {1, "begin"}},
        {"end", {2, "end"}},
        {"strides", {3, "strides"}}}},
      {"Pad", {{"T", kMoveTypes}}, t_only, {{"paddings", {1, "paddings", H::kFlatInts}}}},
      {"PadV2", {{"T", kMoveTypes}}, t_only, {{"paddings", {1, "paddings", H::kFlatInts}}}},
      {"MirrorPad", {{"T", kMoveTypes}}, with_t({{"mode", K::kString}}),
       {{"paddings", {1, "paddings", H::kFlatInts}}}},
      {"Select", {{"T", kMoveTypes}}, t_only, {}},
      {"SelectV2", {{"T", kMoveTypes}}, t_only, {}},
      {"ClipByValue", {{"T", kFloatS32Types}}, t_only, {}},
      {"Fill", {{"T", moves_no_s32}}, t_only, {{"dims", {0, "dims"}}}},
      {"ZerosLike", {{"T", moves_no_s32}}, t_only, {}},
      {"OnesLike", {{"T", moves_no_s32}}, t_only, {}},
      {"GatherV2",
       {{"Tparams", kMoveTypes}, {"Tindices", kIndexTypes}},
       {{"Tparams", K::kType}, {"Tindices", K::kType}, {"batch_dims", K::kInt}},
       {{"axis", {2, "axis", H::kInt}}}},
      {"UnsortedSegmentSum",
       {{"T", kFloatS32Types}, {"Tindices", kIndexTypes}},
       with_t({}),
       {{"num_segments", {2, "num_segments", H::kInt}}}},
      {"OneHot",
       {{"T", kMoveTypes}, {"TI", {TF_UINT8, TF_INT8, TF_INT32, TF_INT64}}},
       with_t({{"axis", K::kInt}}),
       {{"depth", {1, "depth", H::kInt}}}},
      {"Cumsum", {{"T", kFloatS32Types}},
       with_t({{"exclusive", K::kBool}, {"reverse", K::kBool}}),
       {{"axis", {1, "axis", H::kInt}}}},
      // int32 Range is TensorFlow's DEVICE_DEFAULT kernel (host memory).
      {"Range", {{"Tidx", {TF_FLOAT}}}, {{"Tidx", K::kType}},
       {{"start", {0, "start", H::kNumber}},
        {"limit", {1, "limit", H::kNumber}},
        {"delta", {2, "delta", H::kNumber}}}},
  });
}

}  // namespace npusim::tf
