// The convolutions on a coupled chip (tiny_coupled: the 310p core, 2 AI cores; CMakeLists.txt
// sets NPUSIM_TEST_CHIP): no l0c->gm path, so every tile leaves L0C through the UB (FIXPIPE
// into the UB, MTE3 to GM in whole 32-byte blocks), output rows that are not whole blocks go
// through a padded workspace and a packing copy (the filter gradient's img2col with each tap's
// channels padded to a block; with groups, each group's channels), and there is no bias table (the
// batch norm of Conv2DBatchNormInference runs on the tile in the UB, in the convolution's kernel).
// Same references and tolerances as test_compiler_conv.cpp (tests/compiler/conv_reference.h).
#include <catch2/catch.hpp>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/conv.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"
#include "tests/compiler/conv_reference.h"

using namespace npusim;
using namespace npusim::test;
using namespace npusim::test::conv;  // (and its compiler::DataType, PrecisionMode, TensorDesc)

namespace {

// The launches' kernel names of Conv2D over c (f16), for the shape of the compiled work.
std::vector<std::string> conv2d_launches(const ConvCase& c, DataType dt = DataType::F16) {
  auto op = make_op(
      "Conv2D", {TensorDesc{dt, {c.n, c.h, c.w, c.c}}, TensorDesc{dt, filter_shape(c)}}, c.attrs());
  std::vector<std::string> names;
  for (const compiler::Launch& l : compiler::compile(op, test_sim().config()).launches)
    names.push_back(l.kernel.program.name);
  return names;
}

}  // namespace

TEST_CASE("coupled chip: the chip has no l0c->gm path and no bias table") {
  const ChipConfig& cfg = test_sim().config();
  REQUIRE_FALSE(cfg.split);
  REQUIRE_FALSE(cfg.has_path(isa::Buf::L0C, isa::Buf::GM));
  REQUIRE(cfg.has_path(isa::Buf::L0C, isa::Buf::UB));
  REQUIRE_FALSE(cfg.has_path(isa::Buf::L1, isa::Buf::BT));
}

TEST_CASE("coupled chip: Conv2D through the UB, rows whole blocks or padded and packed") {
  // 32 f16 channels (64-byte rows): the kernel writes the output itself.
  ConvCase a{2, 7, 6, 5, 3, 3, 32};
  CHECK(conv2d_launches(a).size() == 1);
  check_conv2d(DataType::F16, a, 1);
  // 7 channels (14-byte rows): rows padded to 16 channels in the workspace, then packed.
  ConvCase b{2, 7, 6, 5, 3, 3, 7};
  CHECK(conv2d_launches(b).size() == 2);
  check_conv2d(DataType::F16, b, 2);
  // 24 channels (48-byte rows, 96 as f32): f32 rows written densely, then one dense cast.
  ConvCase c{2, 7, 6, 5, 3, 3, 24};
  const std::vector<std::string> names = conv2d_launches(c);
  REQUIRE(names.size() == 2);
  CHECK(names[1] == "Cast_f32_f16");
  check_conv2d(DataType::F16, c, 8);
  // Stride, dilation, VALID, several n tiles with a partial last one (300 channels).
  check_conv2d(DataType::F16, ConvCase{1, 9, 8, 20, 3, 2, 300}.window(2, 1, 1, 2, "VALID"), 3);
  // EXPLICIT paddings; stacked small images (m tiles across images: each image's rows copied
  // from the UB on their own); the width fold of a first layer (3 channels).
  check_conv2d(DataType::F16,
               ConvCase{5, 4, 3, 24, 3, 3, 40}.window(1, 1, 1, 1, "EXPLICIT", {1, 2, 0, 1}), 4);
  check_conv2d(DataType::F16, ConvCase{1, 20, 20, 3, 7, 7, 24}.window(2, 2, 1, 1, "VALID"), 5);
  // Several m tiles per image; groups (channels per group whole blocks).
  check_conv2d(DataType::F16, ConvCase{1, 30, 30, 16, 3, 3, 64}, 6);
  ConvCase g{2, 5, 4, 32, 3, 3, 32};
  g.groups = 2;
  check_conv2d(DataType::F16, g, 7);
}

TEST_CASE("coupled chip: groups whose channels are not whole blocks") {
  // 2 groups of 6 -> 5 (10 bytes of f16, 20 of f32 per group): each group's channels padded to
  // a block in the workspace's rows, then packed (rows x groups runs of 5, a block apart).
  // 8 groups of 8 -> 8 (16 bytes of f16, a block as f32) unpacked
  // (NPUSIM_FUSION_GROUPED_CONV_PACK=0): f32 rows, then one dense cast. Packed two to a
  // 16-channel block (=1) each block's 16 f16 outputs are a whole block: no cast after the
  // kernel, the block-diagonal filter's launch before it.
  ConvCase g{2, 5, 4, 12, 3, 3, 10}, e{1, 8, 8, 64, 3, 3, 64};
  g.groups = 2;
  e.groups = 8;
  setenv("NPUSIM_FUSION_GROUPED_CONV_PACK", "0", 1);
  for (auto [c, after] : {std::pair{g, "Cast_f16_f16"}, std::pair{e, "Cast_f32_f16"}})
    CHECK(conv2d_launches(c) == std::vector<std::string>{"Conv2D_f16", after});
  check_conv2d(DataType::F16, e, 22);
  setenv("NPUSIM_FUSION_GROUPED_CONV_PACK", "1", 1);
  CHECK(conv2d_launches(e) == std::vector<std::string>{"GroupedBlockDiag_f16", "Conv2D_f16"});
  check_conv2d(DataType::F16, e, 22);
  unsetenv("NPUSIM_FUSION_GROUPED_CONV_PACK");
  check_conv2d(DataType::F16, g, 20);
  check_conv2d(DataType::F32, g, 21);
  // The bias and the batch norm after them (launches of their own with groups).
  check_conv2d_bias_add(g, true, 23);
  check_conv2d_batch_norm(g, true, true, 24);
}

TEST_CASE("coupled chip: f32 convolutions under the precision modes") {
  ConvCase a{2, 6, 5, 9, 3, 3, 12};  // 12 f32 = 48 bytes per row: padded to 16 channels
  check_conv2d(DataType::F32, a, 10, PrecisionMode::kAllowFp32ToFp16);
  check_conv2d(DataType::F32, a, 11, PrecisionMode::kAllowMixPrecision);  // f16, widened
  check_conv2d(DataType::F32, ConvCase{1, 6, 6, 8, 1, 1, 24}, 12);        // 96-byte rows: direct
}

TEST_CASE("coupled chip: depthwise convolutions, the input gradient, the fused batch norm") {
  ConvCase a{2, 7, 6, 5, 3, 3, 0};  // 5 channels: one partial group of 16
  check_depthwise(0, DataType::F16, a, 1, 20);
  // 3 groups, stride 2 (MobileNetV2's down-sampling)
  check_depthwise(0, DataType::F16, ConvCase{1, 9, 8, 40, 3, 3, 0}.window(2, 2, 1, 1, "SAME"), 1,
                  21);
  check_depthwise(0, DataType::F32, ConvCase{1, 6, 7, 17, 2, 3, 0}, 2, 22);
  // Conv2DBackpropInput: zero insertion, the padded output rows (9 channels).
  check_conv2d_backprop_input(DataType::F16,
                              ConvCase{1, 9, 8, 20, 3, 2, 9}.window(2, 1, 1, 2, "VALID"), 23);
  check_depthwise(1, DataType::F16, a, 2, 24);
}

namespace {

// Whether the launches hold the convolution with the batch norm in its epilogue (`kernel`) and
// no batch-norm pass of their own (only the fold of a and shift, and casts).
bool batch_norm_in_epilogue(const std::vector<std::string>& names, const std::string& kernel) {
  bool conv = false;
  for (const std::string& n : names) {
    if (n == kernel)
      conv = true;
    else if (n.rfind("BatchNormInference", 0) == 0 && n != "BatchNormInferenceFold")
      return false;
  }
  return conv;
}

}  // namespace

TEST_CASE("coupled chip: block-diagonal groups, tiles through the UB") {
  // 48 channels in groups of 2 blocks (the second group one block); an 8-pixel-wide map
  // of one image per tile (planes of an even row count whole fractals: one nd2nz for all,
  // else one per plane).
  check_diagonal_groups(ConvCase{2, 7, 8, 48, 3, 3, 0}, 1, 2, 0, true, 40, 1);
  // Multiplier 2, stride 2, every block in one group.
  check_diagonal_groups(ConvCase{1, 9, 9, 32, 3, 3, 0}.window(2, 2, 1, 1, "SAME"), 2, 2, 0, true,
                        42);
}

TEST_CASE("coupled chip: the batch norm in the convolution's way out through the UB") {
  // No bias table: the vector unit applies y * a + shift, the activation and the one rounding
  // to Tout on each tile between FIXPIPE (f32 into the UB) and MTE3; no launch of its own.
  CHECK(batch_norm_in_epilogue(
      check_conv2d_batch_norm(ConvCase{1, 14, 14, 32, 3, 3, 64}, true, false, 25),
      "Conv2DBatchNormInferenceRelu_f32"));
  // f16 x and y (the fp16 hand-off), with a bias; 40 f16 channels: f32 rows, then the cast.
  CHECK(batch_norm_in_epilogue(
      check_conv2d_batch_norm(ConvCase{2, 9, 9, 20, 1, 1, 40}.window(2, 2, 1, 1, "SAME"), false,
                              true, 26, PrecisionMode::kAllowFp32ToFp16, DataType::F16,
                              DataType::F16),
      "Conv2DBatchNormInference_f16"));
  // ReLU6 (clamped at 0 and 6: wide random weights reach both); 150 channels: column groups of
  // 64 lanes with a masked last one, several n tiles; three 5x5 images stacked in one tile.
  CHECK(batch_norm_in_epilogue(
      check_conv2d_batch_norm(ConvCase{3, 5, 5, 24, 1, 1, 150}, false, false, 27,
                              PrecisionMode::kAllowFp32ToFp16, DataType::F16, DataType::F16, true),
      "Conv2DBatchNormInferenceRelu6_f16"));
  // A 256-position tile: more rows than one vector instruction repeats (255); f32 y.
  CHECK(batch_norm_in_epilogue(
      check_conv2d_batch_norm(ConvCase{1, 16, 16, 16, 1, 1, 16}, false, false, 28,
                              PrecisionMode::kAllowFp32ToFp16, DataType::F32, DataType::F32, true),
      "Conv2DBatchNormInferenceRelu6_f32"));
  // f16 y of 96 channels in tiles of 48 (two images stacked): every tile's columns fill its
  // f16 and f32 rows, so the rounding is one counter-mode run over the tile rather than one
  // instruction per 64-lane column group.
  CHECK(batch_norm_in_epilogue(
      check_conv2d_batch_norm(ConvCase{2, 7, 7, 16, 1, 1, 96}, false, false, 34,
                              PrecisionMode::kAllowFp32ToFp16, DataType::F16, DataType::F16, true),
      "Conv2DBatchNormInferenceRelu6_f16"));
  // f32 y of 150 channels (tiles narrower than the widest: rows packed to the output's pitch).
  CHECK(batch_norm_in_epilogue(
      check_conv2d_batch_norm(ConvCase{2, 6, 6, 24, 1, 1, 150}, false, false, 24),
      "Conv2DBatchNormInference_f32"));
  // Groups of 16 output channels (the depthwise convolution's shape): each group's channels
  // index the tables.
  ConvCase g{2, 8, 8, 32, 3, 3, 32};
  g.groups = 2;
  CHECK(batch_norm_in_epilogue(
      check_conv2d_batch_norm(g, false, false, 29, PrecisionMode::kAllowFp32ToFp16, DataType::F16,
                              DataType::F16, true),
      "Conv2DBatchNormInferenceRelu6_f16"));
}

namespace {

// The listings of Conv2DBatchNormInference's launches over c (f16 x and y), ReLU6 or ReLU, with
// NPUSIM_FUSION_ADD_RELU_CAST set to `add_relu_cast` ("0" or "1").
std::string conv_bn_listing(const ConvCase& c, bool relu6, const char* add_relu_cast) {
  std::vector<TensorDesc> descs = {TensorDesc{DataType::F16, {c.n, c.h, c.w, c.c}},
                                   TensorDesc{DataType::F32, filter_shape(c)}};
  for (int i = 0; i < 4; ++i) descs.push_back(TensorDesc{DataType::F32, {c.cout}});
  auto attrs = c.attrs();
  attrs["epsilon"] = 0.001;
  attrs["relu"] = !relu6;
  attrs["relu6"] = relu6;
  attrs["Tx"] = std::string(compiler::data_type_name(DataType::F16));
  attrs["Tout"] = std::string(compiler::data_type_name(DataType::F16));
  setenv("NPUSIM_FUSION_ADD_RELU_CAST", add_relu_cast, 1);
  const compiler::CompiledKernel k =
      compiler::compile(make_op("Conv2DBatchNormInference", descs, attrs), test_sim().config());
  unsetenv("NPUSIM_FUSION_ADD_RELU_CAST");
  std::string listing;
  for (const compiler::Launch& l : k.launches) listing += l.kernel.listing;
  return listing;
}

}  // namespace

TEST_CASE("coupled chip: AddReluCast takes + shift, ReLU and the rounding to f16 in one pass") {
  // tiny_coupled has the 310p's vaddreluconv (vector.add_relu_conv): an f16 way out with ReLU6
  // takes it (then clamps at 6 only); NPUSIM_FUSION_ADD_RELU_CAST=0 keeps the f32 + shift, the
  // rounding and the clamps. ReLU keeps them either way (vaddreluconv saturates where the
  // rounding gives +inf). All against the reference.
  REQUIRE(test_sim().config().vector_add_relu_conv);
  ConvCase groups{2, 8, 8, 32, 3, 3, 32};
  groups.groups = 2;
  const struct {
    ConvCase c;
    bool relu6;
    const char* what;
  } cases[] = {
      {ConvCase{2, 7, 7, 16, 1, 1, 96}, true, "96 channels: tiles of 48, periodic tables"},
      {ConvCase{3, 5, 5, 24, 1, 1, 150}, true, "150 channels: column groups, a masked last"},
      {ConvCase{1, 9, 9, 20, 3, 3, 64}, false, "ReLU, 3x3, 64 channels: not fused"},
      {groups, true, "groups of 16: one dense run"},
  };
  uint32_t seed = 60;
  for (const auto& t : cases) {
    INFO(t.what);
    const std::string on = conv_bn_listing(t.c, t.relu6, "1"),
                      off = conv_bn_listing(t.c, t.relu6, "0");
    CHECK((on.find("vaddreluconv.f16.f32") != std::string::npos) == t.relu6);
    CHECK(off.find("vaddreluconv") == std::string::npos);
    for (const char* fused : {"1", "0"}) {
      setenv("NPUSIM_FUSION_ADD_RELU_CAST", fused, 1);
      check_conv2d_batch_norm(t.c, !t.relu6, false, seed++, PrecisionMode::kAllowFp32ToFp16,
                              DataType::F16, DataType::F16, t.relu6);
      unsetenv("NPUSIM_FUSION_ADD_RELU_CAST");
    }
  }
}

TEST_CASE("coupled chip: a residual added on the tile in the UB (Conv2D + BNInference + Add)") {
  const PrecisionMode fp16 = PrecisionMode::kAllowFp32ToFp16;
  // MobileNetV2's projection: f16 in and out, 32 channels (whole blocks), the residual's rows
  // loaded by MTE2 per tile and added after the rounding; three images of 5x5 (one image per
  // tile: a residual takes no stacking).
  CHECK(batch_norm_in_epilogue(
      check_conv2d_batch_norm(ConvCase{3, 5, 5, 24, 1, 1, 32}, false, false, 31, fp16,
                              DataType::F16, DataType::F16, false, true),
      "Conv2DBatchNormInferenceAdd_f16"));
  // f32 y of 152 channels (column groups, a partial n tile) with ReLU6 after the add; 256-row
  // tiles.
  CHECK(batch_norm_in_epilogue(
      check_conv2d_batch_norm(ConvCase{1, 16, 16, 16, 1, 1, 152}, false, false, 32, fp16,
                              DataType::F16, DataType::F32, true, true),
      "Conv2DBatchNormInferenceAddRelu6_f32"));
  // f16 y of 80 channels (one tile wide: 80 f32 lanes, two 64-lane column groups, rounded as
  // one run over the tile), the residual added after the rounding.
  CHECK(batch_norm_in_epilogue(
      check_conv2d_batch_norm(ConvCase{2, 6, 6, 16, 1, 1, 80}, false, false, 35, fp16,
                              DataType::F16, DataType::F16, false, true),
      "Conv2DBatchNormInferenceAdd_f16"));
  // f16 y of 24 channels (48-byte rows) on 6x6 images: every tile's rows are whole blocks
  // (16 * j rows of 48 bytes, 36 per image), so the epilogue packs the rows and stores each
  // tile as one run, the residual loaded and added the same way, ReLU after it.
  const auto no_residual_launch = [](const std::vector<std::string>& names) {
    return std::none_of(names.begin(), names.end(), [](const std::string& n) {
      return n.rfind("AddResidual", 0) == 0 || n.rfind("Cast", 0) == 0;
    });
  };
  std::vector<std::string> names =
      check_conv2d_batch_norm(ConvCase{2, 6, 6, 16, 1, 1, 24}, true, false, 33, fp16, DataType::F16,
                              DataType::F16, false, true);
  CHECK(batch_norm_in_epilogue(names, "Conv2DBatchNormInferenceAddRelu_f16"));
  CHECK(no_residual_launch(names));
  // Packed, 256-row tiles (two vector instructions per packing pass), ReLU6 after the add.
  names = check_conv2d_batch_norm(ConvCase{1, 16, 16, 32, 1, 1, 24}, false, false, 36, fp16,
                                  DataType::F16, DataType::F16, true, true);
  CHECK(batch_norm_in_epilogue(names, "Conv2DBatchNormInferenceAddRelu6_f16"));
  CHECK(no_residual_launch(names));
  // Packed, 8 channels (16-byte rows), no residual.
  names = check_conv2d_batch_norm(ConvCase{2, 6, 6, 16, 1, 1, 8}, false, false, 37, fp16,
                                  DataType::F16, DataType::F16, true);
  CHECK(batch_norm_in_epilogue(names, "Conv2DBatchNormInferenceRelu6_f16"));
  CHECK(no_residual_launch(names));
  // 5x5 images: 25 rows of 48 bytes are not whole blocks, so no packing: the kernel writes f32
  // rows (whole blocks), a cast rounds them, a launch adds the residual.
  names = check_conv2d_batch_norm(ConvCase{2, 5, 5, 16, 1, 1, 24}, true, false, 38, fp16,
                                  DataType::F16, DataType::F16, false, true);
  CHECK(batch_norm_in_epilogue(names, "Conv2DBatchNormInference_f16"));
  CHECK(std::find(names.begin(), names.end(), "AddResidualRelu_f16") != names.end());
}

TEST_CASE("coupled chip: Conv2DBiasAdd adds the bias by a vector launch (no bias table)") {
  check_conv2d_bias_add(ConvCase{1, 14, 14, 32, 3, 3, 64}, true, 30);
  check_conv2d_bias_add(ConvCase{2, 9, 9, 20, 1, 1, 40}.window(2, 2, 1, 1, "SAME"), false, 31);
  // 1x1 stride 2, even sizes: x viewed as one tall map of its even rows and columns
  check_conv2d_bias_add(ConvCase{4, 8, 6, 32, 1, 1, 40}.window(2, 2, 1, 1, "SAME"), true, 33);
  // f16 x, filter and y with the f32 bias (allow_mix_precision): the f16 bias launch
  check_conv2d_bias_add(ConvCase{1, 14, 14, 32, 3, 3, 64}, true, 32,
                        PrecisionMode::kAllowFp32ToFp16, DataType::F16);
}

TEST_CASE("coupled chip: Conv2DBackpropFilter, the fused kernel through the UB, the k split") {
  // 3 input channels (a block of 16 per tap in img2col); 9 output channels: f32 rows padded
  check_conv2d_backprop_filter(DataType::F16,
                               ConvCase{2, 9, 9, 3, 3, 3, 32}.window(2, 2, 1, 1, "SAME"), 30);
  check_conv2d_backprop_filter(
      DataType::F16, ConvCase{2, 8, 7, 16, 2, 3, 9}.window(2, 2, 2, 1, "EXPLICIT", {1, 2, 2, 0}),
      31);
  check_conv2d_backprop_filter(DataType::F32, ConvCase{1, 6, 5, 5, 3, 3, 24}, 32);
  check_conv2d_backprop_filter(DataType::F32, ConvCase{1, 6, 5, 32, 1, 1, 16}, 33,
                               PrecisionMode::kAllowMixPrecision);
  // A long k (8 x 32 x 32 positions) and one output tile: split into parts over the two cube
  // cores, f32 partial products (rows of 16 f32, whole blocks) summed by the vector cores; also
  // after an img2col whose taps need no padding (stride 2, 16 channels), and under
  // allow_mix_precision.
  ConvCase s{8, 32, 32, 16, 1, 1, 16};
  CHECK(has_launch(check_conv2d_backprop_filter(DataType::F16, s, 34), "Sum_f32"));
  CHECK(has_launch(
      check_conv2d_backprop_filter(DataType::F32, s, 35, PrecisionMode::kAllowMixPrecision),
      "Sum_f32"));
  const std::vector<std::string> fused = check_conv2d_backprop_filter(
      DataType::F16, ConvCase{8, 64, 64, 16, 1, 1, 16}.window(2, 2, 1, 1, "VALID"), 36);
  CHECK(has_launch(fused, "FilterGrad"));
  CHECK(has_launch(fused, "Sum_f32"));
  // 1x1 stride 2 over 4 images of 8x6: x viewed as one tall map of the even rows and columns,
  // loaded by columns; 9 output channels, f32 rows padded through the UB.
  CHECK(mentions(check_conv2d_backprop_filter(
                     DataType::F16, ConvCase{4, 8, 6, 32, 1, 1, 9}.window(2, 2, 1, 1, "SAME"), 41),
                 "slab loaded by columns"));
  // 3 channels in parts: the sum's packing copy (f32, and f16 rounded then widened).
  for (auto [dt, mode] : {std::pair{DataType::F16, PrecisionMode::kAllowFp32ToFp16},
                          std::pair{DataType::F32, PrecisionMode::kAllowFp32ToFp16},
                          std::pair{DataType::F32, PrecisionMode::kAllowMixPrecision}})
    CHECK(has_launch(check_conv2d_backprop_filter(dt, ConvCase{8, 32, 32, 3, 3, 3, 16}, 37, mode),
                     "Sum_f32"));
  // 3 input and 9 output channels: the f32 rows padded to 16 channels, dropped by the packing
  // copy; the first layer's 7x7 stride 2 (SAME: no fold) and a 3x3 stride 2 over 40 channels.
  check_conv2d_backprop_filter(DataType::F16, ConvCase{1, 5, 5, 3, 3, 3, 9}, 38);
  check_conv2d_backprop_filter(DataType::F32,
                               ConvCase{2, 19, 17, 3, 7, 7, 20}.window(2, 2, 1, 1, "SAME"), 39);
  check_conv2d_backprop_filter(DataType::F16,
                               ConvCase{2, 9, 8, 40, 3, 3, 24}.window(2, 2, 1, 1, "VALID"), 40);
}
