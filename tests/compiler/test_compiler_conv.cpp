// Conv2D, Conv2DBackpropInput, Conv2DBackpropFilter and the depthwise convolutions compiled for
// the tiny chip (2 cube cores, 4 vector cores, 910B core buffers) and run on the chip model,
// against direct convolutions in double from the exact (rounded) inputs
// (tests/compiler/conv_reference.h: the references, checks and tolerances).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <utility>

#include <fmt/format.h>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "adapter/compiler/ops/matmul.h"
#include "isa/disassembler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"
#include "tests/compiler/conv_reference.h"

using namespace npusim;
using namespace npusim::test;
using namespace npusim::test::conv;
using compiler::DataType;
using compiler::PrecisionMode;
using compiler::TensorDesc;

namespace {
// Sets an environment variable (a compiler's measuring switch) for a test's compiles, unset
// again on the way out.
struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name); }
  const char* name;
};
// The summary of k's cube convolution launch (after it, a coupled chip may pack or cast y).
std::string conv_summary(const compiler::CompiledKernel& k) {
  for (const compiler::Launch& l : k.launches)
    if (l.summary.find("cube conv") != std::string::npos) return l.summary;
  return "(no cube conv launch)";
}

// The spec of a one-group convolution of square maps (images x hw x hw x cin) to cout channels
// with a k x k window and SAME padding (k odd), weights kRowsN.
compiler::ops::CubeConvSpec square_conv_spec(int64_t images, int64_t hw, int64_t cin, int64_t cout,
                                             int64_t k) {
  compiler::ops::CubeConvSpec s;
  s.images = images;
  s.hs = s.ws = hw;
  s.cs = s.cg_in = cin;
  s.kh = s.kw = k;
  s.pt = s.pb = s.pl = s.pr = k / 2;
  s.cg_out = s.cy = cout;
  s.b_tap = cin * cout;
  s.b_row = cout;
  return s;
}
}  // namespace

TEST_CASE("Conv2D f16: odd sizes, strides, dilation, SAME/VALID/EXPLICIT, batch > 1") {
  ConvCase a{2, 7, 6, 5, 3, 3, 7};  // SAME 3x3, channels not multiples of 16
  check_conv2d(DataType::F16, a, 1);
  ConvCase b{1, 9, 8, 20, 3, 2, 9};
  b.sh = 2;
  b.dw = 2;
  b.padding = "VALID";
  check_conv2d(DataType::F16, b, 2);
  ConvCase c{2, 8, 7, 3, 2, 3, 18};
  c.sh = c.sw = 2;
  c.dh = 2;
  c.padding = "EXPLICIT";
  c.explicit_pads = {1, 2, 2, 0};
  check_conv2d(DataType::F16, c, 3);
  ConvCase d{3, 5, 5, 17, 1, 1, 33};  // 1x1
  check_conv2d(DataType::F16, d, 4);
  ConvCase e{2, 9, 7, 300, 1, 1, 20};  // 1x1 stride 2, 19 channel blocks
  e.sh = e.sw = 2;
  check_conv2d(DataType::F16, e, 5);
  ConvCase g{3, 1, 1, 7, 3, 3, 5};  // 1x1 images, a 3x3 window: only the centre tap
  check_conv2d(DataType::F16, g, 6);
  ConvCase h{2, 2, 3, 6, 5, 4, 9};  // SAME with the window larger than the image
  check_conv2d(DataType::F16, h, 7);
  // 1x1 stride 2 over H and W multiples of 2: x viewed as its even rows and columns, the batch
  // one tall map of 4 x 4 x 3 positions (32 channels: the slab loaded by columns); bf16 and
  // with the bias too. (e above: 9 x 7, odd, viewed per image, loaded by rows.)
  ConvCase v{4, 8, 6, 32, 1, 1, 24};
  v.sh = v.sw = 2;
  check_conv2d(DataType::F16, v, 8);
  check_bf16_case([&] { check_conv2d(DataType::BF16, v, 9); });
  check_conv2d_bias_add(v, true, 54);
  // 256 channels (16 planes) over a tall map of 4 rows: the slab loaded per pixel, all planes.
  ConvCase vp{2, 4, 6, 256, 1, 1, 16};
  vp.sh = vp.sw = 2;
  check_conv2d(DataType::F16, vp, 55);
  // The view as before (NPUSIM_CONV_STRIDED_PIXELS=0): where the chip prices the DMA's issue
  // the planner weighs the view's issue and may take the dense map instead (v on the 910b: by
  // whole pixels), so the view is forced here to be checked on every chip.
  ScopedEnv as_before("NPUSIM_CONV_STRIDED_PIXELS", "0");
  check_conv2d(DataType::F16, v, 56);
  const TensorDesc vx{DataType::F16, {4, 8, 6, 32}}, vf{DataType::F16, {1, 1, 32, 24}};
  auto k = compiler::compile(make_op("Conv2D", {vx, vf}, v.attrs()), test_sim().config());
  CHECK_THAT(conv_summary(k), Catch::Contains("1x16x3x32 f16 (1x1 window, stride 1x1"));
}

TEST_CASE("Conv2D width fold: few input channels, no padding along W (the first layer)") {
  // 3 channels, 7 wide, stride 2, VALID: folded to a 7x1 window over 21 channels.
  ConvCase first{2, 15, 17, 3, 5, 7, 24};
  first.sh = first.sw = 2;
  first.padding = "VALID";
  check_conv2d(DataType::F32, first, 30);
  check_conv2d(DataType::F16, first, 31);
  ConvCase dilated{1, 12, 9, 4, 3, 3, 20};  // padding along H only, dilation along H
  dilated.dh = 2;
  dilated.padding = "EXPLICIT";
  dilated.explicit_pads = {1, 2, 0, 0};
  check_conv2d(DataType::F16, dilated, 32);
  // The plans: the folded one reads x as W - KW + 1 pixels of KW * C channels.
  const TensorDesc x{DataType::F16, {2, 15, 17, 3}}, f{DataType::F16, {5, 7, 3, 24}};
  auto k = compiler::compile(make_op("Conv2D", {x, f}, first.attrs()), test_sim().config());
  CHECK_THAT(conv_summary(k), Catch::Contains("2x15x11x21 f16 (5x1 window"));
  ConvCase same = first;  // padding along W: not folded
  same.padding = "SAME";
  k = compiler::compile(make_op("Conv2D", {x, f}, same.attrs()), test_sim().config());
  CHECK_THAT(conv_summary(k), Catch::Contains("2x15x17x3 f16 (5x7 window"));
}

TEST_CASE("Conv2D stride-packed view: few input channels, a stride along W (the stem)") {
  // NPUSIM_CONV_STRIDE_PACK=1: the view wherever it applies (unset: only on chips that price
  // the DMA's issue). x's pixels sw at a time as one pixel of sw * C channels, ceil(KW / sw)
  // taps wide, stride 1 along W; the last column of taps of an odd window holds one real pixel.
  auto pack = std::make_unique<ScopedEnv>("NPUSIM_CONV_STRIDE_PACK", "1");
  const auto summary = [](const ConvCase& c) {
    const TensorDesc x{DataType::F16, {c.n, c.h, c.w, c.c}};
    const TensorDesc f{DataType::F16, {c.kh, c.kw, c.c, c.cout}};
    return conv_summary(
        compiler::compile(make_op("Conv2D", {x, f}, c.attrs()), test_sim().config()));
  };
  // The stem's family: 7x7 stride 2 VALID over 3 and 4 channels, W' * 2 == W (x' dense).
  ConvCase stem3{2, 13, 16, 3, 7, 7, 24};
  stem3.sh = stem3.sw = 2;
  stem3.padding = "VALID";
  check_conv2d(DataType::F16, stem3, 60);
  check_conv2d(DataType::F32, stem3, 61);
  check_conv2d_bias_add(stem3, true, 62, PrecisionMode::kAllowFp32ToFp16, DataType::F16);
  CHECK_THAT(summary(stem3), Catch::Contains("2x13x8x6 f16 (7x4 window, stride 2x1"));
  ConvCase stem4{1, 12, 22, 4, 7, 7, 40};
  stem4.sh = stem4.sw = 2;
  stem4.padding = "VALID";
  check_conv2d(DataType::F16, stem4, 63);
  CHECK_THAT(summary(stem4), Catch::Contains("1x12x11x8 f16 (7x4 window, stride 2x1"));
  // An even window, W' * 2 < W (x viewed with its row pitch: the last column unread); stride 3.
  ConvCase even{2, 9, 21, 3, 4, 6, 17};
  even.sh = even.sw = 2;
  even.padding = "VALID";
  check_conv2d(DataType::F16, even, 64);
  CHECK_THAT(summary(even), Catch::Contains("2x9x10x6 f16 (4x3 window, stride 2x1"));
  ConvCase three{1, 10, 21, 3, 5, 7, 16};
  three.sh = three.sw = 3;
  three.padding = "VALID";
  check_conv2d(DataType::F16, three, 65);
  CHECK_THAT(summary(three), Catch::Contains("1x10x7x9 f16 (5x3 window, stride 3x1"));
  // Where the view would read past a row (W' * sw > W), the width fold; padding along W, neither.
  ConvCase past{2, 15, 17, 3, 5, 7, 24};
  past.sh = past.sw = 2;
  past.padding = "VALID";
  CHECK_THAT(summary(past), Catch::Contains("2x15x11x21 f16 (5x1 window"));
  // A packed pixel of more than one channel block (7 channels, stride 3: 21): the fold.
  ConvCase wide{1, 9, 21, 7, 3, 7, 16};
  wide.sh = wide.sw = 3;
  wide.padding = "VALID";
  CHECK_THAT(summary(wide), Catch::Contains("1x9x15x49 f16 (3x1 window"));
  ConvCase same = stem3;
  same.padding = "SAME";
  CHECK_THAT(summary(same), Catch::Contains("2x13x16x3 f16 (7x7 window"));
  // "0": the width fold as before; anything else is refused.
  pack.reset();
  {
    ScopedEnv off("NPUSIM_CONV_STRIDE_PACK", "0");
    CHECK_THAT(summary(stem3), Catch::Contains("2x13x10x21 f16 (7x1 window"));
  }
  {
    ScopedEnv bad("NPUSIM_CONV_STRIDE_PACK", "yes");
    CHECK_THROWS_WITH(summary(stem3), Catch::Contains("NPUSIM_CONV_STRIDE_PACK='yes'"));
  }
}

TEST_CASE("Conv2D f32 under the precision modes, bf16, groups") {
  ConvCase a{2, 6, 5, 3, 5, 5, 17};  // a first layer: 3 channels, 5x5
  check_conv2d(DataType::F32, a, 10);
  ConvCase b{1, 5, 6, 9, 3, 3, 6};
  b.padding = "VALID";
  check_conv2d(DataType::F32, b, 11, PrecisionMode::kAllowMixPrecision);
  check_bf16_case([&] { check_conv2d(DataType::BF16, b, 12); });
  ConvCase g{2, 5, 4, 12, 3, 3, 10};  // 2 groups of 6 -> 5
  g.groups = 2;
  check_conv2d(DataType::F16, g, 13);
  HostTensor x = random_tensor(DataType::F32, {1, 4, 4, 3}, -1, 1, 14);
  HostTensor f = random_tensor(DataType::F32, {3, 3, 3, 4}, -1, 1, 15);
  CHECK_THROWS_WITH(compiler::compile(make_op("Conv2D", {x.desc, f.desc}, a.attrs()),
                                      test_sim().config(), PrecisionMode::kKeepFp32),
                    Catch::Contains("allow_fp32_to_fp16"));
}

TEST_CASE("Conv2DBatchNormInference: the batch norm folded into the filter and the bias") {
  check_conv2d_batch_norm(ConvCase{1, 14, 14, 32, 3, 3, 64}, true, false, 40);
  ConvCase s2{2, 9, 9, 20, 1, 1, 300};  // n tiles with a partial last one; stacked images
  s2.sh = s2.sw = 2;
  check_conv2d_batch_norm(s2, false, true, 41);
  check_conv2d_batch_norm(ConvCase{3, 28, 28, 16, 1, 1, 40}, true, true, 42);  // 1-step tiles
  ConvCase first{1, 20, 20, 3, 7, 7, 24};                                      // a first layer
  first.sh = first.sw = 2;
  first.padding = "VALID";
  check_conv2d_batch_norm(first, true, true, 43, PrecisionMode::kAllowMixPrecision);
  ConvCase g{2, 5, 4, 12, 3, 3, 10};  // 2 groups: the batch norm as its own launch
  g.groups = 2;
  check_conv2d_batch_norm(g, true, true, 44);
  // fp16 hand-offs: f16 in, f16 out, both; grouped with an f16 output
  const PrecisionMode fp16 = PrecisionMode::kAllowFp32ToFp16;
  check_conv2d_batch_norm(ConvCase{1, 14, 14, 32, 3, 3, 64}, true, false, 45, fp16, DataType::F16,
                          DataType::F32);
  check_conv2d_batch_norm(s2, true, true, 46, fp16, DataType::F32, DataType::F16);
  check_conv2d_batch_norm(ConvCase{3, 28, 28, 16, 1, 1, 40}, false, true, 47, fp16, DataType::F16,
                          DataType::F16);
  check_conv2d_batch_norm(g, true, false, 48, fp16, DataType::F16, DataType::F16);
}

TEST_CASE("Conv2DBatchNormInference with a residual: the add (and ReLU) after the convolution") {
  // A chip with a bias table and l0c->gm: FIXPIPE writes conv + shift, one vector launch adds
  // the residual in y's type and applies the activation after it (not FIXPIPE's ReLU). Through
  // the UB the residual is added on the tile (test_compiler_conv_coupled.cpp): the values only.
  const PrecisionMode fp16 = PrecisionMode::kAllowFp32ToFp16;
  auto has = [](const std::vector<std::string>& names, const std::string& kernel) {
    return std::find(names.begin(), names.end(), kernel) != names.end();
  };
  const std::vector<std::string> dense =
      check_conv2d_batch_norm(ConvCase{2, 7, 7, 32, 1, 1, 48}, true, false, 49, fp16, DataType::F16,
                              DataType::F16, false, true);
  if (!cube_out_via_ub()) CHECK(has(dense, "AddResidualRelu_f16"));
  ConvCase g{2, 5, 4, 12, 3, 3, 10};  // grouped: the batch norm's own launch, then the add
  g.groups = 2;
  CHECK(has(
      check_conv2d_batch_norm(g, false, true, 39, fp16, DataType::F32, DataType::F32, true, true),
      "AddResidualRelu6_f32"));
}

TEST_CASE("Conv2DBiasAdd: the bias from the bias table, ReLU in FIXPIPE") {
  check_conv2d_bias_add(ConvCase{1, 14, 14, 32, 3, 3, 64}, true, 50);
  ConvCase s2{2, 9, 9, 20, 1, 1, 300};  // n tiles with a partial last one
  s2.sh = s2.sw = 2;
  check_conv2d_bias_add(s2, false, 51);
  ConvCase first{1, 20, 20, 3, 7, 7, 24};  // a first layer (the width fold)
  first.sh = first.sw = 2;
  first.padding = "VALID";
  check_conv2d_bias_add(first, true, 52, PrecisionMode::kAllowMixPrecision);
  ConvCase g{2, 5, 4, 12, 3, 3, 10};  // 2 groups: the bias as its own launch
  g.groups = 2;
  check_conv2d_bias_add(g, true, 53);
  // f16 x and filter, f32 bias, f16 y (allow_mix_precision's graph pass): from the bias table,
  // and grouped with the bias as an f16 vector launch
  const PrecisionMode fp16 = PrecisionMode::kAllowFp32ToFp16;
  check_conv2d_bias_add(ConvCase{1, 14, 14, 32, 3, 3, 64}, true, 54, fp16, DataType::F16);
  check_conv2d_bias_add(s2, false, 55, fp16, DataType::F16);
  check_conv2d_bias_add(g, true, 56, fp16, DataType::F16);
}

TEST_CASE("Conv2D tiles: the planner follows L1; every weight mode computes the same") {
  // Several m and n tiles per image (launch summaries).
  ConvCase a{2, 14, 14, 40, 3, 3, 70};
  check_conv2d(DataType::F16, a, 20);
  // 16 images of 12x11 share each core's weights (3*3*48 x 80 f16, 69 KB): on the tiny chip
  // (L1 512 KB) they stay resident; a 64 KB L1 cannot hold them, so the plan changes (narrower
  // n tiles or streamed weights) and what it allocates fits (planned for the tiny chip; run on
  // the test chip with its L1 cut so).
  compiler::ops::CubeConvSpec s;
  s.images = 16;
  s.hs = 12;
  s.ws = 11;
  s.cs = 48;
  s.kh = s.kw = 3;
  s.pt = s.pb = s.pl = s.pr = 1;
  s.cg_in = 48;
  s.cg_out = s.cy = 80;
  s.b_tap = 48 * 80;
  s.b_row = 80;
  const auto t_tiny = compiler::ops::plan_cube_conv(s, load_chip_config("tiny"), "test");
  const auto t_small = compiler::ops::plan_cube_conv(
      s, load_chip_config("tiny", {"cores.aic.buffers.l1=64 KiB"}), "test");
  INFO(t_tiny.str() << "\n" << t_small.str());
  CHECK(t_tiny.resident);
  CHECK(t_tiny.tn == 128);
  CHECK(2 * t_small.slab_bytes + (t_small.resident ? 1 : 2) * t_small.b_bytes <= 64 * 1024);
  CHECK((t_small.tn < t_tiny.tn || !t_small.resident));
  ConvCase b{16, 12, 11, 48, 3, 3, 80};
  const ChipConfig small = load_chip_config(test_chip_name(), {cube_core_key("buffers.l1=64 KiB")});
  check_conv2d(DataType::F16, b, 21, PrecisionMode::kAllowFp32ToFp16, &small);
  // The kernel in each weight mode (forced tilings): resident in one chunk, resident arriving
  // in 3 chunks, streamed in one chunk and in 3. All must give the direct convolution.
  s.images = b.n = 3;
  HostTensor x = random_tensor(DataType::F16, {b.n, b.h, b.w, b.c}, -2, 2, 22);
  HostTensor f = random_tensor(DataType::F16, filter_shape(b), -1, 1, 23);
  Reference ref = new_reference(static_cast<size_t>(b.n * 12 * 11 * 80));
  for_each_product(b, [&](int64_t xi, int64_t fi, int64_t yi) {
    accumulate(ref, yi, x.values[static_cast<size_t>(xi)] * f.values[static_cast<size_t>(fi)]);
  });
  const auto base = compiler::ops::plan_cube_conv(s, test_sim().config(), "test");
  for (auto [kc1, resident] :
       {std::pair<int64_t, bool>{3, true}, {1, true}, {3, false}, {1, false}}) {
    const auto t =
        compiler::ops::rechunk_cube_conv(s, base, kc1, resident, test_sim().config(), "t");
    INFO(t.str());
    compiler::CompiledKernel k;
    k.outputs = {TensorDesc{DataType::F16, y_shape(b)}};
    k.launches = {compiler::ops::build_cube_conv(s, t, test_sim().config(), "test")};
    RunResult r = run_compiled(test_sim(), k, {x, f});
    check_against(r.outputs[0].values, ref, DataType::F16, false, "y");
  }
}

TEST_CASE("Conv2D resident weights arriving in chunks keep pace with streamed ones") {
  // One tile per block (the block's first tile loads the weights): resident weights in 4
  // chunks move the same bytes as streamed weights in 4 chunks, each chunk with its step, and
  // the tile's mmads are the same; only where MTE2 queues the chunks differs. A chunk queued
  // behind the next step's slab (whose L1 buffer frees when MTE1 has finished this step's
  // predecessor) would make MTE1 wait for it at every step: ResNet-50's 3x3 256 -> 256 layer
  // at 14x14 on the 910b, 22,476 cycles with 2 tiles a block.
  ConvCase c{1, 14, 14, 256, 3, 3, 96};
  const compiler::ops::CubeConvSpec s = square_conv_spec(c.n, c.h, c.c, c.cout, 3);
  const ChipConfig& cfg = test_sim().config();
  const auto base = compiler::ops::plan_cube_conv(s, cfg, "test");
  HostTensor x = random_tensor(DataType::F16, {c.n, c.h, c.w, c.c}, -2, 2, 24);
  HostTensor f = random_tensor(DataType::F16, filter_shape(c), -1, 1, 25);
  Reference ref = new_reference(static_cast<size_t>(c.n * c.h * c.w * c.cout));
  for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
    accumulate(ref, yi, x.values[static_cast<size_t>(xi)] * f.values[static_cast<size_t>(fi)]);
  });
  // Split chips only: a coupled chip's kernel (tiles out through the UB) loads every chunk in
  // its compute stage (conv_emitter.cpp, chunks_ahead).
  const bool split =
      !compiler::ops::cube_store_via_ub(cfg, compiler::ops::cube_core(cfg, "test"), "test");
  uint64_t cycles[2] = {0, 0};
  for (bool resident : {false, true}) {
    auto t = compiler::ops::rechunk_cube_conv(s, base, 4, resident, cfg, "t");
    REQUIRE(t.chunks == 4);
    REQUIRE(t.tiles_per_block == 1);
    INFO(t.str());
    compiler::CompiledKernel k;
    k.outputs = {TensorDesc{DataType::F16, y_shape(c)}};
    k.launches = {compiler::ops::build_cube_conv(s, t, cfg, "test")};
    RunResult r = run_compiled(test_sim(), k, {x, f});
    check_against(r.outputs[0].values, ref, DataType::F16, false, "y");
    cycles[resident] = r.cycles;
  }
  // The same bytes and mmads: 1 % for the resident form's scalar bookkeeping (its key checks
  // per step). Measured 2026-12-05: 13,105 streamed, 13,182 resident on the test chip (7,203
  // and 7,248 on the 910b); with the chunks behind the next slab 15,302 (8,014).
  INFO("streamed " << cycles[0] << ", resident " << cycles[1]);
  if (split) CHECK(cycles[1] * 100 <= cycles[0] * 101);
}

TEST_CASE("conv_step_period: the planner's step pipeline from the chip's queue depth and flags") {
  // Steps as the kernel issues them (ops/conv.h, ConvStepProgram); each figure derived from the
  // program and the config, not measured.
  const ChipConfig& cfg = test_sim().config();
  const double latency = cfg.path_latency(isa::Buf::GM, isa::Buf::L1) + cfg.hbm_latency_cycles;
  compiler::ops::ConvStepProgram p;
  p.slab_insns = 8;
  p.slab_flow = 400;
  p.latency = latency;
  p.mmad_steps = 4;
  p.mte1 = 600;
  p.cube = 4 * (latency + 1000);  // longer than a load: the cube sets the pace
  p.scalar_step = 200;
  p.scalar_mmad_step = 60;
  // Cube-bound: MTE1 runs up to two mmad steps ahead (two L0 buffers) and the next slab has
  // landed long before, so the mmads run back to back.
  CHECK(compiler::ops::conv_step_period(cfg, p) == Approx(p.cube));
  // MTE2-bound: the L1-full set_flag holds MTE2 until the slab has landed, so a step costs
  // its transfers and the memory's latency; without the hold only the flag waits for it.
  compiler::ops::ConvStepProgram load_bound = p;
  load_bound.slab_flow = 2 * p.cube;
  REQUIRE(cfg.set_flag_holds_pipe);
  CHECK(compiler::ops::conv_step_period(cfg, load_bound) == Approx(load_bound.slab_flow + latency));
  const ChipConfig no_hold = load_chip_config(test_chip_name(), {"sync.set_flag_holds_pipe=false"});
  CHECK(compiler::ops::conv_step_period(no_hold, load_bound) == Approx(load_bound.slab_flow));
  // A load of more nd2nz than MTE2's queue holds: the scalar unit stalls in load(t + 1), which
  // waits for MTE1 to finish step t - 1, before it issues compute(t), so MTE1's step starts
  // late and the cube waits, though every stage alone is faster than the cube's.
  compiler::ops::ConvStepProgram queued = p;
  queued.mte1 = 0.9 * p.cube;
  queued.slab_flow = 0.5 * p.cube;
  const double fits = compiler::ops::conv_step_period(cfg, queued);
  CHECK(fits == Approx(p.cube));
  queued.slab_insns = cfg.issue_queue_depth + 16;
  CHECK(compiler::ops::conv_step_period(cfg, queued) > fits + 0.05 * p.cube);
}

TEST_CASE("Conv2DBackpropInput: strides (zero insertion), dilation, paddings") {
  ConvCase a{2, 7, 6, 5, 3, 3, 7};
  check_conv2d_backprop_input(DataType::F16, a, 30);
  ConvCase b{1, 9, 8, 20, 3, 2, 9};
  b.sh = 2;
  b.dw = 2;
  b.padding = "VALID";
  check_conv2d_backprop_input(DataType::F16, b, 31);
  ConvCase c{2, 8, 7, 3, 2, 3, 18};
  c.sh = c.sw = 2;
  c.dh = 2;
  c.padding = "EXPLICIT";
  c.explicit_pads = {1, 2, 2, 0};
  check_conv2d_backprop_input(DataType::F16, c, 32);
  ConvCase d{2, 8, 8, 4, 3, 3, 6};  // stride 2 VALID: the last input row gets no gradient
  d.sh = d.sw = 2;
  d.padding = "VALID";
  check_conv2d_backprop_input(DataType::F32, d, 33);
  ConvCase e{1, 7, 9, 17, 3, 3, 5};
  e.sw = 2;
  check_bf16_case([&] { check_conv2d_backprop_input(DataType::BF16, e, 34); });
  // The data inputs only (input_sizes as the attribute alone).
  check_conv2d_backprop_input(DataType::F16, e, 35, PrecisionMode::kAllowFp32ToFp16, true);
  ConvCase g{2, 9, 7, 30, 1, 1, 20};  // 1x1 stride 2: zero insertion, appended zero rows
  g.sh = g.sw = 2;
  check_conv2d_backprop_input(DataType::F16, g, 36);
  ConvCase h{2, 2, 3, 6, 5, 4, 9};
  check_conv2d_backprop_input(DataType::F16, h, 37);
}

TEST_CASE("Conv2DBackpropFilter: strides, dilation, paddings, f32") {
  ConvCase a{2, 7, 6, 5, 3, 3, 7};
  check_conv2d_backprop_filter(DataType::F16, a, 40);
  ConvCase b{1, 9, 8, 20, 3, 2, 9};
  b.sh = 2;
  b.dw = 2;
  b.padding = "VALID";
  check_conv2d_backprop_filter(DataType::F32, b, 41);
  ConvCase c{3, 8, 7, 3, 2, 3, 18};
  c.sh = c.sw = 2;
  c.dh = 2;
  c.padding = "EXPLICIT";
  c.explicit_pads = {1, 2, 2, 0};
  check_conv2d_backprop_filter(DataType::F16, c, 42);
  ConvCase h{2, 2, 3, 6, 5, 4, 9};
  check_conv2d_backprop_filter(DataType::F16, h, 43);
}

TEST_CASE("Conv2DBackpropFilter: the fused kernel's windows, channels and types") {
  // img2col(x)^T by load3dt in L0A: 3x3 and 7x7, strides 1 and 2, SAME and VALID, channel
  // counts that are not multiples of 16 (tiles of img2col columns crossing channel blocks:
  // 40 channels x 9 taps = 3 blocks of 144 columns), f16, bf16 and f32.
  ConvCase a{2, 9, 8, 40, 3, 3, 24};
  for (DataType dt : {DataType::F16, DataType::F32}) {
    CHECK(has_launch(check_conv2d_backprop_filter(dt, a, 60), "FilterGrad"));
    a.sh = a.sw = 2;
    check_conv2d_backprop_filter(dt, a.window(2, 2, 1, 1, "VALID"), 61);
    a.sh = a.sw = 1;
  }
  check_bf16_case([&] {
    check_conv2d_backprop_filter(DataType::BF16, ConvCase{1, 8, 9, 17, 3, 3, 33}, 62);
  });
  // One image: on a split chip the k split cuts its chunks (m tiles) into parts over the cube
  // cores (the same launch's vector cores sum them). A coupled chip's AI cores sum the parts
  // themselves: its planner may keep one part here (its k split: test_compiler_conv_coupled.cpp).
  const ConvCase one{1, 64, 64, 16, 3, 3, 16};
  for (DataType dt : {DataType::F16, DataType::F32}) {
    const std::vector<std::string> one_image = check_conv2d_backprop_filter(dt, one, 65);
    if (test_sim().config().split)
      CHECK(mentions(one_image, "the parts added by the vector cores"));
  }
  // The first layer's 7x7 stride 2 over 3 channels: SAME (no fold: each tap's 3 channels in a
  // block of 16) and VALID (the width fold: 7 taps of 21 channels; on a chip that prices the
  // DMA's issue the fold is weighed against the dense map, so it is forced here).
  ScopedEnv fold_always("NPUSIM_FILTER_GRAD_FOLD_ESTIMATE", "0");
  ConvCase first{2, 19, 17, 3, 7, 7, 20};
  for (DataType dt : {DataType::F16, DataType::F32}) {
    CHECK(mentions(check_conv2d_backprop_filter(dt, first.window(2, 2, 1, 1, "SAME"), 63),
                   "(7x7 window"));
    CHECK(mentions(check_conv2d_backprop_filter(dt, first.window(2, 2, 1, 1, "VALID"), 64),
                   "(7x1 window"));
  }
}

namespace {
// The launches among `launches` (check_conv2d's "name: summary" list) of the cube kernels.
int cube_launches(const std::vector<std::string>& launches) {
  return static_cast<int>(std::count_if(launches.begin(), launches.end(), [](const auto& l) {
    return l.rfind("Conv2D", 0) == 0 || l.rfind("FilterGrad", 0) == 0;
  }));
}
}  // namespace

TEST_CASE("Grouped Conv2D and both gradients: one cube launch for all the groups") {
  // x's channels G times the filter's (TF's grouped Conv2D, Keras' Conv2D(groups=G)): groups
  // of 16 channels and of 6 (not whole 16-channel blocks: each group's channels start inside
  // a block), strides 1 and 2, SAME and VALID, f16 and f32; against the per-group products.
  struct Grouped {
    ConvCase c;
    int64_t groups;
  };
  const std::vector<Grouped> cases = {
      {ConvCase{2, 7, 6, 32, 3, 3, 32}, 2},                              // 16 -> 16 per group
      {ConvCase{1, 9, 8, 24, 3, 3, 16}.window(2, 2, 1, 1, "SAME"), 4},   // 6 -> 4, stride 2
      {ConvCase{2, 8, 7, 64, 3, 3, 64}.window(2, 1, 1, 1, "VALID"), 4},  // 16 -> 16
      {ConvCase{1, 6, 6, 12, 1, 1, 24}, 2},                              // 1x1: 6 -> 12
      {ConvCase{1, 7, 7, 8, 3, 3, 16}.window(1, 1, 2, 2, "SAME"), 8},    // 1 -> 2, dilated
  };
  uint32_t seed = 300;
  for (const Grouped& g : cases) {
    ConvCase c = g.c;
    c.groups = g.groups;
    for (DataType dt : {DataType::F16, DataType::F32}) {
      CHECK(cube_launches(check_conv2d(dt, c, seed++)) == 1);
      const std::vector<std::string> dx = check_conv2d_backprop_input(dt, c, seed++).launches;
      CHECK(cube_launches(dx) == 1);
      const std::vector<std::string> dw = check_conv2d_backprop_filter(dt, c, seed++);
      CHECK(cube_launches(dw) == 1);
      CHECK(mentions(dw, fmt::format("; {} groups of {} -> {} channels", c.groups, c.c / c.groups,
                                     c.cout / c.groups)));
    }
  }
  // One image of 64 x 64: on a chip of many cube cores (910b) the filter gradient's k split
  // cuts its chunks into parts (on a split chip added by the kernel's own vector cores), each
  // part a product of every group; groups of 6 -> 4 and of 16 -> 16.
  for (const Grouped& g : {Grouped{ConvCase{1, 64, 64, 24, 3, 3, 16}, 4},
                           Grouped{ConvCase{1, 64, 64, 32, 3, 3, 32}, 2}}) {
    ConvCase c = g.c;
    c.groups = g.groups;
    for (DataType dt : {DataType::F16, DataType::F32}) {
      const std::vector<std::string> dw = check_conv2d_backprop_filter(dt, c, seed++);
      CHECK(cube_launches(dw) == 1);
      // (with fewer cube cores than groups, the groups' tiles fill the cores unsplit)
      const ChipConfig& cfg = test_sim().config();
      if (cfg.split && compiler::ops::cube_core(cfg, "test").count > 2 * c.groups)
        CHECK(mentions(dw, "the parts added by the vector cores"));
    }
  }
  // Channels that are no multiple of the filter's, or outputs of the groups': invalid, named.
  const TensorDesc x{DataType::F16, {1, 5, 5, 12}};
  const ConvCase v{1, 5, 5, 12, 3, 3, 8};
  CHECK_THROWS_WITH(
      compiler::compile(make_op("Conv2D", {x, TensorDesc{DataType::F16, {3, 3, 5, 8}}}, v.attrs()),
                        test_sim().config()),
      Catch::Contains("input channels 12 are not a multiple of the filter's 5"));
  OpDesc dw = make_op("Conv2DBackpropFilter",
                      {x, TensorDesc{DataType::S32, {4}}, TensorDesc{DataType::F16, {1, 5, 5, 10}}},
                      v.attrs());
  dw.outputs = {TensorDesc{DataType::F16, {3, 3, 3, 10}}};
  CHECK_THROWS_WITH(compiler::compile(dw, test_sim().config()),
                    Catch::Contains("output channels 10 are not a multiple of the 4 groups"));
}

namespace {
struct PointwiseKernel : ScopedEnv {
  explicit PointwiseKernel(const char* v) : ScopedEnv("NPUSIM_FILTER_GRAD_POINTWISE", v) {}
};
// The f16 Conv2DBackpropFilter op of case p (shapes only: to compile, not to run).
OpDesc backprop_filter_op(const ConvCase& p) {
  OpDesc op = make_op("Conv2DBackpropFilter",
                      {TensorDesc{DataType::F16, {p.n, p.h, p.w, p.c}},
                       TensorDesc{DataType::S32, {4}}, TensorDesc{DataType::F16, y_shape(p)}},
                      p.attrs());
  op.outputs = {TensorDesc{DataType::F16, filter_shape(p)}};
  return op;
}
// The "modelled ~N cycles" a launch summary of the filter gradient states (-1 if none).
double modelled_cycles(const std::vector<std::string>& launches) {
  for (const std::string& l : launches) {
    const size_t at = l.find("modelled ~");
    if (at != std::string::npos) return std::stod(l.substr(at + 10));
  }
  return -1;
}
}  // namespace

namespace {
struct GroupPacking : ScopedEnv {
  explicit GroupPacking(const char* v) : ScopedEnv("NPUSIM_FUSION_GROUPED_CONV_PACK", v) {}
};
// Conv2D of case c (x and filter random from seed, as check_conv2d makes them) run on the test
// chip: y and, per launch, the cube's busy cycles summed over the cores that ran.
struct ConvRun {
  std::vector<double> y;
  uint64_t cube_busy = 0;
  std::vector<std::string> kernels;
};
ConvRun run_conv2d(DataType dt, const ConvCase& c, uint32_t seed) {
  HostTensor x = random_tensor(dt, {c.n, c.h, c.w, c.c}, -2, 2, seed);
  HostTensor f = random_tensor(dt, filter_shape(c), -1, 1, seed + 1);
  const compiler::CompiledKernel k =
      compiler::compile(make_op("Conv2D", {x.desc, f.desc}, c.attrs()), test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {x, f});
  ConvRun run;
  run.y = std::move(r.outputs[0].values);
  for (size_t i = 0; i < k.launches.size(); ++i) {
    run.kernels.push_back(k.launches[i].kernel.program.name);
    const nlohmann::json& chip = r.counters.at(i).at("chip");
    for (auto it = chip.begin(); it != chip.end(); ++it)
      if (it->is_object() && it->contains("m") && it->at("m").contains("busy_cycles"))
        run.cube_busy += it->at("m").at("busy_cycles").at("value").get<uint64_t>();
  }
  return run;
}
}  // namespace

TEST_CASE("Grouped Conv2D and its input gradient: narrow groups packed block-diagonally") {
  // Groups of Cin < 16 channels (16 % Cin == 0) whose M = Cout / G outputs are not whole
  // 16-column blocks while 16 / Cin groups' are: that many groups share one 16-channel block
  // with the block-diagonal filter (NPUSIM_FUSION_GROUPED_CONV_PACK=1: wherever the shapes
  // allow). Against the per-group products in double, and bit for bit against the unpacked
  // kernel (=0): the off-diagonal zeros add exact zeros and each output's nonzero products
  // come in the same k order (taps, then the group's channels). The input gradient likewise
  // where each group's M channels of dy lie in one 16-channel block (M divides 16); M = 12
  // straddles blocks (the k order then runs block by block: within tolerance only).
  struct Packed {
    ConvCase c;
    int64_t groups;
  };
  const std::vector<Packed> cases = {
      {ConvCase{2, 7, 6, 32, 3, 3, 32}, 4},                             // 8 -> 8, 2 per block
      {ConvCase{1, 9, 8, 32, 3, 3, 32}.window(2, 2, 1, 1, "SAME"), 8},  // 4 -> 4, 4 per block
      {ConvCase{2, 6, 5, 24, 3, 3, 24}, 3},  // 8 -> 8: the last block holds one group
      {ConvCase{1, 5, 7, 10, 3, 3, 40}.window(1, 1, 1, 1, "VALID"), 5},  // 2 -> 8, 8 per block
      {ConvCase{1, 6, 6, 16, 1, 1, 48}, 4},                              // 1x1: 4 -> 12
      {ConvCase{1, 7, 7, 8, 3, 3, 16}.window(1, 1, 2, 2, "SAME"), 8},    // 1 -> 2, dilated
  };
  uint32_t seed = 700;
  for (const Packed& p : cases) {
    ConvCase c = p.c;
    c.groups = p.groups;
    const int64_t m = c.cout / c.groups;
    for (DataType dt : {DataType::F16, DataType::F32}) {
      INFO("groups " << c.groups << " of " << c.c / c.groups << " -> " << m << " "
                     << compiler::data_type_name(dt));
      std::vector<std::string> y;
      BackpropInputRun dx, dx_unpacked;
      ConvRun packed, unpacked;
      {
        GroupPacking on("1");
        y = check_conv2d(dt, c, seed);
        dx = check_conv2d_backprop_input(dt, c, seed + 2);
        packed = run_conv2d(dt, c, seed);
      }
      {
        GroupPacking off("0");
        dx_unpacked = check_conv2d_backprop_input(dt, c, seed + 2);
        unpacked = run_conv2d(dt, c, seed);
      }
      seed += 4;
      // One cube launch after the block-diagonal filter's; 16-channel groups.
      CHECK(cube_launches(y) == 1);
      CHECK(cube_launches(dx.launches) == 1);
      const int64_t cin = c.c / c.groups;
      const std::string filter =
          cin == 1 ? std::string("block-diagonal depthwise filter")
                   : fmt::format(
                         "block-diagonal grouped filter: {} groups of {} -> {} channels, "
                         "{} per 16-channel block",
                         c.groups, cin, m, 16 / cin);
      CHECK(mentions(y, filter));
      CHECK(mentions(dx.launches, filter));
      CHECK(!mentions(unpacked.kernels, "BlockDiag"));
      CHECK(packed.y == unpacked.y);
      if (16 % m == 0) CHECK(dx.dx == dx_unpacked.dx);
      // The cube's work: per groups' products in one step, without each group's M columns
      // padded to 16 on its own: fewer steps of the same 16-row, 16-column blocks.
      CHECK(packed.cube_busy < unpacked.cube_busy);
    }
  }
  // The fused forms with packed groups (the batch norm and the bias after the convolution, or
  // through the UB in its epilogue; with a residual, f16 in and out).
  {
    GroupPacking on("1");
    ConvCase g{2, 7, 6, 32, 3, 3, 32};
    g.groups = 4;
    CHECK(mentions(check_conv2d_batch_norm(g, true, true, seed++), "GroupedBlockDiag_f16"));
    check_conv2d_batch_norm(g, false, false, seed++, PrecisionMode::kAllowFp32ToFp16, DataType::F16,
                            DataType::F16, true, true);
    check_conv2d_bias_add(g, true, seed++);
  }
  // Shapes that stay unpacked even where packing is forced: groups of 6 (16 % 6 != 0), of 16
  // (whole blocks), M whole blocks (8 -> 16: the same MACs either way), per * M not whole
  // blocks (4 -> 2: 8 columns per block).
  for (const Packed& p :
       {Packed{ConvCase{1, 5, 5, 12, 3, 3, 8}, 2}, Packed{ConvCase{1, 5, 5, 32, 3, 3, 32}, 2},
        Packed{ConvCase{1, 5, 5, 16, 3, 3, 32}, 2}, Packed{ConvCase{1, 5, 5, 16, 3, 3, 8}, 4}}) {
    ConvCase c = p.c;
    c.groups = p.groups;
    GroupPacking on("1");
    const std::vector<std::string> y = check_conv2d(DataType::F16, c, seed++);
    CHECK(!mentions(y, "block-diagonal"));
    CHECK(mentions(
        y, fmt::format("{} group(s) of {} -> {}", c.groups, c.c / c.groups, c.cout / c.groups)));
  }
  // Unforced, the estimate decides: on the 910b a 3x3 layer of 8 x 28 x 28 x 64 in 16 groups
  // of 4 -> 4 (ResNeXt's width) packs, and packed it takes fewer cycles than unpacked; a layer
  // of 2 x 2 x 2 x 32 (a launch's overheads beside its work) does not. Anything but '', 0, 1
  // is refused.
  const ChipConfig& cfg = test_sim().config();
  if (cfg.name == "910b") {
    ConvCase big{8, 28, 28, 64, 3, 3, 64};
    big.groups = 16;
    const ConvRun chosen = run_conv2d(DataType::F16, big, seed);
    CHECK(std::find(chosen.kernels.begin(), chosen.kernels.end(), "GroupedBlockDiag_f16") !=
          chosen.kernels.end());
    ConvCase small{2, 2, 2, 32, 3, 3, 32};
    small.groups = 8;
    const ConvRun kept = run_conv2d(DataType::F16, small, seed);
    CHECK(kept.kernels.size() == 1);
  }
  {
    GroupPacking bad("yes");
    const TensorDesc x{DataType::F16, {1, 5, 5, 32}}, f{DataType::F16, {3, 3, 8, 32}};
    CHECK_THROWS_WITH(
        compiler::compile(make_op("Conv2D", {x, f}, ConvCase{1, 5, 5, 32, 3, 3, 32}.attrs()), cfg),
        Catch::Contains("NPUSIM_FUSION_GROUPED_CONV_PACK='yes'"));
  }
}

TEST_CASE("Conv2DBackpropFilter: 1x1 as MatMul, width fold, long k split over the cores") {
  // A 1x1 window of stride 1: x is the img2col matrix, the MatMul x^T x dy; through the UB
  // only where x's rows (20 channels) are whole blocks, else the fused kernel.
  // Where the fused kernel adds its parts in its own kernel (split chips) it computes the
  // product too: the kernel of the lower modelled cycles runs, or the one
  // NPUSIM_FILTER_GRAD_POINTWISE names; both give dW.
  const ChipConfig& cfg = test_sim().config();
  ConvCase p{2, 5, 7, 20, 1, 1, 24};
  for (const ConvCase& pc :
       {p, ConvCase{2, 6, 7, 64, 1, 1, 256}, ConvCase{1, 7, 7, 512, 1, 1, 64}}) {
    std::vector<std::string> mm, fused, chosen;
    {
      PointwiseKernel force("matmul");
      mm = check_conv2d_backprop_filter(DataType::F16, pc, 50);
      CHECK(has_launch(mm, cube_out_via_ub() && pc.c == 20 ? "FilterGrad" : "MatMul"));
    }
    if (!cfg.split || cube_out_via_ub()) continue;
    {
      PointwiseKernel force("fused");
      fused = check_conv2d_backprop_filter(DataType::F16, pc, 50);
      CHECK(has_launch(fused, "FilterGrad"));
    }
    chosen = check_conv2d_backprop_filter(DataType::F16, pc, 50);
    // MatMul's estimate counts a Sum launch after split parts: only compare unsplit ones.
    if (has_launch(mm, "Sum_")) continue;
    REQUIRE(modelled_cycles(mm) > 0);
    REQUIRE(modelled_cycles(fused) > 0);
    CHECK(
        has_launch(chosen, modelled_cycles(fused) < modelled_cycles(mm) ? "FilterGrad" : "MatMul"));
  }
  {
    PointwiseKernel bad("img2col");
    if (!cube_out_via_ub())
      CHECK_THROWS_WITH(compiler::compile(backprop_filter_op(p), cfg),
                        Catch::Contains("NPUSIM_FILTER_GRAD_POINTWISE='img2col'"));
  }
  {
    // A row of 65,552 pixels exceeds set_fmatrix's 16-bit width: the fused kernel does not plan
    // (CompileError where it is forced) and the planners' choice takes the MatMul.
    const ConvCase wide{1, 1, 65552, 16, 1, 1, 16};
    const std::vector<std::string> chosen = check_conv2d_backprop_filter(DataType::F16, wide, 59);
    CHECK(has_launch(chosen, "MatMul"));
    if (cfg.split && !cube_out_via_ub()) {
      PointwiseKernel force("fused");
      CHECK_THROWS_WITH(compiler::compile(backprop_filter_op(wide), cfg),
                        Catch::Contains("set_fmatrix"));
    }
  }
  // Tile sides of any multiple of 16, partial tiles (the tiny chip: two tiles for its two cube
  // cores; the 910b config cuts them smaller), on the MatMul.
  const bool tiny = cfg.name == "tiny";
  {
    PointwiseKernel on_matmul("matmul");
    ConvCase t{2, 6, 7, 80, 1, 1, 80};
    const std::vector<std::string> t80 = check_conv2d_backprop_filter(DataType::F16, t, 57);
    if (tiny) CHECK(mentions(t80, "tiles 48x80"));
    t.c = 40;
    const std::vector<std::string> t40 = check_conv2d_backprop_filter(DataType::F32, t, 58);
    if (tiny) CHECK(mentions(t40, "tiles 48x48"));
  }
  ConvCase ps = p;  // stride 2 subsamples x: the fused kernel
  ps.sh = ps.sw = 2;
  CHECK(has_launch(check_conv2d_backprop_filter(DataType::F16, ps, 51), "FilterGrad"));
  // k = 8 * 32 * 32 positions and one output tile: the product is split into parts over the
  // tiny chip's two cube cores and the f32 partial products summed by the vector cores.
  // The Sum writes dW, rounding its f32 sums to a 16-bit output itself (no cast launch after
  // it). Split chips: the fused kernel instead, its own vector cores adding the parts.
  ConvCase s{8, 32, 32, 16, 1, 1, 16};
  const auto sum_last = [](const std::vector<std::string>& v) {
    return !v.empty() && v.back().rfind("Sum_f32", 0) == 0;
  };
  for (DataType dt : {DataType::F16, DataType::F32}) {
    const std::vector<std::string> v = check_conv2d_backprop_filter(dt, s, 52);
    if (cfg.split)
      CHECK((mentions(v, "the parts added by the vector cores") && !has_launch(v, "Sum_f32")));
    else
      CHECK(sum_last(v));
  }
  std::vector<std::string> bf16;
  check_bf16_case([&] { bf16 = check_conv2d_backprop_filter(DataType::BF16, s, 52); });
  if (!bf16.empty()) CHECK(sum_last(bf16));
  CHECK(has_launch(
      check_conv2d_backprop_filter(DataType::F32, s, 53, PrecisionMode::kAllowMixPrecision),
      "Sum_f32"));
  // Few channels, no padding along W: the width-folded view (a 5x1 window over 4 * 3
  // channels), the same img2col matrix as the 5x4 window's (forced where the chip prices the
  // DMA's issue: there the fold is weighed against the dense map).
  ScopedEnv fold_always("NPUSIM_FILTER_GRAD_FOLD_ESTIMATE", "0");
  ConvCase fold{2, 9, 11, 3, 5, 4, 8};
  fold.sh = 2;
  fold.padding = "VALID";
  CHECK(mentions(check_conv2d_backprop_filter(DataType::F16, fold, 55), "(5x1 window"));
  fold.padding = "SAME";  // padding along W: no fold
  CHECK(mentions(check_conv2d_backprop_filter(DataType::F32, fold, 56), "(5x4 window"));
  // A window one tap tall / wide with a stride reads every sh-th row / sw-th column: x viewed
  // as those rows and columns with stride 1; where the images follow each other row for row
  // (H a multiple of sh) the batch is one tall map (4 images of 4 x 3 positions: 1x16x3).
  // Channels filling the planes, a narrow view: the slab is loaded by columns; 20 channels:
  // by rows. (Where the chip prices the DMA's issue the row view may plan lower: kept off, its
  // cases are test_compiler_conv_bursts'.)
  ScopedEnv no_row_view("NPUSIM_FILTER_GRAD_ROW_VIEW", "0");
  ConvCase v{4, 8, 6, 32, 1, 1, 24};
  v.sh = v.sw = 2;
  auto check_by_columns = [&](DataType dt) {
    const std::vector<std::string> vn = check_conv2d_backprop_filter(dt, v, 66);
    CHECK(mentions(vn, "x 1x16x3x32"));
    CHECK(mentions(vn, "slab loaded by columns"));
  };
  check_by_columns(DataType::F16);
  check_bf16_case([&] { check_by_columns(DataType::BF16); });
  ConvCase vp{2, 4, 6, 256, 1, 1, 16};  // 16 planes over 4 rows: per pixel, all planes
  vp.sh = vp.sw = 2;
  CHECK(mentions(check_conv2d_backprop_filter(DataType::F16, vp, 70), "x 1x4x3x256"));
  ConvCase vr{3, 6, 8, 20, 1, 1, 17};  // by rows; f32 cast to f16 first
  vr.sh = vr.sw = 2;
  const std::vector<std::string> vrn = check_conv2d_backprop_filter(DataType::F32, vr, 67);
  CHECK(mentions(vrn, "x 1x9x4x20"));
  CHECK(!mentions(vrn, "by columns"));
  // H not a multiple of the stride (7 rows, stride 3 VALID: rows 0, 3, 6): viewed per image.
  ConvCase odd = vr.window(3, 2, 1, 1, "VALID");
  odd.h = 7;
  CHECK(mentions(check_conv2d_backprop_filter(DataType::F16, odd, 68), "x 3x3x4x20"));
  // 1x3 SAME, stride 2 along H only: rows subsampled and merged, padding along W kept.
  ConvCase wide{2, 6, 7, 16, 1, 3, 8};
  CHECK(mentions(check_conv2d_backprop_filter(DataType::F16, wide.window(2, 1, 1, 1, "SAME"), 69),
                 "x 1x6x7x16 (1x3 window"));
  ConvCase w{8, 64, 64, 3, 3, 3, 5};  // strided 3x3 over 3 channels: the fused kernel in parts
  w.sh = w.sw = 2;
  w.dh = 2;
  const std::vector<std::string> names = check_conv2d_backprop_filter(DataType::F16, w, 54);
  CHECK(has_launch(names, "FilterGrad"));
  CHECK(has_launch(names, "Sum_f32"));
}

TEST_CASE("Conv2DBackpropFilter: NPUSIM_FILTER_GRAD_PLAN_RANK builds the k-th ranked plan") {
  // The fused kernel's candidates ranked by their estimates: rank 1 is the planner's choice,
  // the next ranks other plans (another summary), each giving dW; a bad rank names the switch.
  const ConvCase pc{2, 6, 7, 24, 3, 3, 40};
  const std::vector<std::string> chosen = check_conv2d_backprop_filter(DataType::F16, pc, 60);
  REQUIRE(has_launch(chosen, "FilterGrad"));
  {
    ScopedEnv rank("NPUSIM_FILTER_GRAD_PLAN_RANK", "1");
    CHECK(check_conv2d_backprop_filter(DataType::F16, pc, 60) == chosen);
  }
  for (const char* k : {"2", "3"}) {
    ScopedEnv rank("NPUSIM_FILTER_GRAD_PLAN_RANK", k);
    const std::vector<std::string> other = check_conv2d_backprop_filter(DataType::F16, pc, 60);
    CHECK(has_launch(other, "FilterGrad"));
    CHECK(other != chosen);
  }
  const OpDesc op = backprop_filter_op(pc);
  {
    ScopedEnv rank("NPUSIM_FILTER_GRAD_PLAN_RANK", "0");
    CHECK_THROWS_WITH(compiler::compile(op, test_sim().config()),
                      Catch::Contains("NPUSIM_FILTER_GRAD_PLAN_RANK='0' is not a positive rank"));
  }
  {
    ScopedEnv rank("NPUSIM_FILTER_GRAD_PLAN_RANK", "100000000");
    CHECK_THROWS_WITH(compiler::compile(op, test_sim().config()),
                      Catch::Contains("NPUSIM_FILTER_GRAD_PLAN_RANK=100000000 but only"));
  }
}

TEST_CASE("plan_filter_grad: a tile's store priced at the bytes FIXPIPE writes") {
  // One part writing f16 dW stores half the bytes of f32 partial products: the estimate of a
  // tiling drops by the tiles of the busiest core x tk x tn x 2 bytes at the store path's rate
  // (cube_store_rate, from the config); the planner's best is at most that. The estimate is
  // also bounded below by the launch's HBM bytes, which f16 lowers too: on the test chip only
  // f16 <= f32 holds whichever bound binds; the store's saving is checked on the test chip with
  // 1000 times its HBM bandwidth (so that the HBM bound cannot bind; the store rate does not
  // depend on it).
  using compiler::ops::FilterGradSpec;
  FilterGradSpec s;
  s.images = 2;
  s.h = 14;
  s.w = 7;
  s.c = 64;
  s.cout = 128;
  s.pitch = s.cout;
  const std::string op = "Conv2DBackpropFilter";
  ChipConfig wide_hbm = test_sim().config();
  wide_hbm.hbm_gbps *= 1000;
  for (const ChipConfig* cfg : {&test_sim().config(), static_cast<const ChipConfig*>(&wide_hbm)}) {
    FilterGradSpec sp = s;
    const compiler::ops::FilterGradTiling f32 = compiler::ops::plan_filter_grad(sp, *cfg, op);
    sp.out_type = isa::Dtype::F16;
    const compiler::ops::FilterGradTiling f16 = compiler::ops::plan_filter_grad(sp, *cfg, op);
    INFO("HBM " << cfg->hbm_gbps << " GB/s: f32 " << f32.cycles << ", f16 " << f16.cycles);
    CHECK(f16.cycles <= f32.cycles);
    if (cfg != &wide_hbm) continue;
    const double saved =
        static_cast<double>(f32.per * f32.tk * f32.tn * 2) / compiler::ops::cube_store_rate(*cfg);
    CHECK(f16.cycles < f32.cycles);
    CHECK(f16.cycles <= f32.cycles - saved + 1e-6);
  }
}

namespace {

// The fused filter gradient of case c (NHWC x, dense rows) in two parts that its own kernel adds
// (split chips), dW in f16.
compiler::ops::FilterGradSpec fused_filter_grad_spec(const ConvCase& c) {
  compiler::ops::FilterGradSpec s;
  s.images = c.n;
  s.h = c.h;
  s.w = c.w;
  s.c = c.c;
  s.cout = c.cout;
  s.x_pixel = c.c;
  s.x_row = c.w * c.c;
  s.x_image = c.h * c.w * c.c;
  s.pitch = s.cout;
  s.parts = 2;
  s.add_parts = true;
  s.dw_type = isa::Dtype::F16;
  return s;
}

}  // namespace

TEST_CASE("The fused filter gradient adds parts further apart than copy_gm2ub's source gap") {
  // The parts' f32 products lie a whole filter apart ([parts][taps * C * cout]): for 1x1 x 512
  // x 1,040 that is 532,480 floats, 66,560 32-byte blocks, past copy_gm2ub's 16-bit src_gap
  // (ResNet-50's 1x1 512 -> 2048 filter gradient at batch 256 on the 910b split in 2 parts
  // failed the verifier so). The vector cores then load each part's row by a copy of its own;
  // dW against the sums in double.
  if (!test_sim().config().split) return;  // add_parts: split chips only
  using compiler::ops::FilterGradSpec;
  const ConvCase c{1, 16, 16, 512, 1, 1, 1040};
  FilterGradSpec s = fused_filter_grad_spec(c);
  const std::string op = "Conv2DBackpropFilter";
  const compiler::ops::FilterGradTiling t =
      compiler::ops::plan_filter_grad(s, test_sim().config(), op);
  REQUIRE(static_cast<uint64_t>(s.pitch * s.c * 4 / 32) > isa::field_imm_max(isa::FieldKind::RU16));
  compiler::CompiledKernel k;
  k.outputs = {TensorDesc{DataType::F16, filter_shape(c)},
               TensorDesc{DataType::F32, {s.parts, s.c, s.pitch}}};
  k.launches.push_back(
      compiler::ops::with_args(compiler::ops::build_filter_grad(s, t, test_sim().config(), op),
                               {compiler::ops::input_ref(0), compiler::ops::input_ref(1),
                                compiler::ops::output_ref(1), compiler::ops::output_ref(0)}));
  HostTensor x = random_tensor(DataType::F16, {c.n, c.h, c.w, c.c}, -2, 2, 95);
  HostTensor dy = random_tensor(DataType::F16, y_shape(c), -1, 1, 96);
  const RunResult r = run_compiled(test_sim(), k, {x, dy});
  Reference ref = new_reference(static_cast<size_t>(k.outputs[0].num_elements()));
  for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
    accumulate(ref, fi, x.values[static_cast<size_t>(xi)] * dy.values[static_cast<size_t>(yi)]);
  });
  check_against(r.outputs[0].values, ref, DataType::F16, false, "dW");
}

TEST_CASE("NPUSIM_MIX_ONE_TO_ONE: the filter gradient's parts added by one vector core a block") {
  // The fused kernel that adds its parts (split chips), built 1:2 (the chip's ratio) and 1:1
  // (one vector core per cube core): the same dW bit for bit (each element's parts are added in
  // part order either way), against the sums in double; the 1:1 launch leaves each group's
  // second vector core idle. Then the whole op under the switch, against the reference.
  if (!test_sim().config().split) return;  // add_parts: split chips only
  using compiler::ops::FilterGradSpec;
  const ChipConfig& cfg = test_sim().config();
  const ConvCase c{2, 16, 16, 96, 1, 1, 80};
  FilterGradSpec s = fused_filter_grad_spec(c);
  const std::string op = "Conv2DBackpropFilter";
  const compiler::ops::FilterGradTiling t = compiler::ops::plan_filter_grad(s, cfg, op);
  HostTensor x = random_tensor(DataType::F16, {c.n, c.h, c.w, c.c}, -2, 2, 97);
  HostTensor dy = random_tensor(DataType::F16, y_shape(c), -1, 1, 98);
  std::vector<RunResult> runs;
  for (const char* one_to_one : {"0", "1"}) {
    ScopedEnv sw("NPUSIM_MIX_ONE_TO_ONE", one_to_one);
    compiler::CompiledKernel k;
    k.outputs = {TensorDesc{DataType::F16, filter_shape(c)},
                 TensorDesc{DataType::F32, {s.parts, s.c, s.pitch}}};
    k.launches.push_back(compiler::ops::with_args(
        compiler::ops::build_filter_grad(s, t, cfg, op),
        {compiler::ops::input_ref(0), compiler::ops::input_ref(1), compiler::ops::output_ref(1),
         compiler::ops::output_ref(0)}));
    const isa::Program& p = k.launches[0].kernel.program;
    CHECK(p.aiv_per_aic == (std::string(one_to_one) == "1" ? 1 : 0));
    runs.push_back(run_compiled(test_sim(), k, {x, dy}));
  }
  // The switch naming kernels: the filter gradient 1:1 where it names filter_grad.
  for (const auto& [value, one] : std::vector<std::pair<const char*, bool>>{
           {"filter_grad", true}, {"bn_reduce", false}, {"bn_reduce,filter_grad", true}}) {
    INFO("NPUSIM_MIX_ONE_TO_ONE=" << value);
    ScopedEnv sw("NPUSIM_MIX_ONE_TO_ONE", value);
    CHECK(compiler::ops::build_filter_grad(s, t, cfg, op).kernel.program.aiv_per_aic ==
          (one ? 1 : 0));
  }
  Reference ref = new_reference(static_cast<size_t>(c.c * c.cout));
  for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
    accumulate(ref, fi, x.values[static_cast<size_t>(xi)] * dy.values[static_cast<size_t>(yi)]);
  });
  check_against(runs[1].outputs[0].values, ref, DataType::F16, false, "dW 1:1");
  CHECK(runs[1].outputs[0].values == runs[0].outputs[0].values);
  // The 1:2 kernel's blocks run on every vector core; the 1:1 kernel's on aiv0 and aiv2 only.
  const nlohmann::json& two = runs[0].counters[0]["chip"];
  const nlohmann::json& one = runs[1].counters[0]["chip"];
  CHECK(two.contains("aiv1"));
  CHECK(one.contains("aiv0"));
  CHECK_FALSE(one.contains("aiv1"));
  CHECK_FALSE(one.contains("aiv3"));
  {
    ScopedEnv sw("NPUSIM_MIX_ONE_TO_ONE", "1");
    // Few output channels over many positions: the k split into parts over the cube cores.
    const std::vector<std::string> launches =
        check_conv2d_backprop_filter(DataType::F16, ConvCase{2, 32, 32, 16, 3, 3, 16}, 99);
    bool added_one_to_one = false;
    for (const std::string& l : launches) {
      INFO(l);
      added_one_to_one = added_one_to_one || l.find("one per cube core") != std::string::npos;
    }
    CHECK(added_one_to_one);
  }
  // Bad values: an error naming the op, the value and the name it does not know.
  for (const auto& [value, bad] : std::vector<std::pair<const char*, const char*>>{
           {"2", "'2'"},
           {"filter_grad,bn_stats", "'bn_stats'"},
           {"filter_grad,", "''"},
           {"1,bn_reduce", "'1'"}}) {
    INFO("NPUSIM_MIX_ONE_TO_ONE=" << value);
    ScopedEnv sw("NPUSIM_MIX_ONE_TO_ONE", value);
    CHECK_THROWS_WITH(compiler::ops::build_filter_grad(s, t, cfg, op),
                      Catch::Contains(op + ": NPUSIM_MIX_ONE_TO_ONE='" + value + "': " + bad +
                                      " is not a kernel it names (filter_grad, bn_reduce"));
  }
}

TEST_CASE("the mix_one_to_one compile option: the filter gradient 1:1 where the switch is unset") {
  // The option the TF plugin's NpuGraph plan passes under streams (kMixOneToOneAttr): the fused
  // kernel that adds its parts runs 1:1 with it, at the chip's ratio without it; the option is
  // part of the cache key (the two kernels apart); NPUSIM_MIX_ONE_TO_ONE, where set, wins
  // ("0" included); a bad value is an error naming the op and the attribute.
  if (!test_sim().config().split) return;  // add_parts: split chips only
  const ChipConfig& cfg = test_sim().config();
  const ConvCase c{2, 32, 32, 16, 3, 3, 16};  // few output channels over many positions
  const std::vector<TensorDesc> inputs = {TensorDesc{DataType::F16, {c.n, c.h, c.w, c.c}},
                                          TensorDesc{DataType::S32, {4}},
                                          TensorDesc{DataType::F16, y_shape(c)}};
  compiler::OpDesc plain = make_op("Conv2DBackpropFilter", inputs, c.attrs());
  plain.outputs = {TensorDesc{DataType::F16, filter_shape(c)}};  // dW's shape (filter_sizes)
  compiler::OpDesc asked = plain;
  asked.attrs[compiler::ops::kMixOneToOneAttr] = std::string("filter_grad");
  // The ratio of the launch that adds the parts (the fused kernel's mix launch).
  const auto ratio = [&](const compiler::OpDesc& op) {
    const compiler::CompiledKernel k = compiler::compile(op, cfg);
    int mix = 0, found = 0;
    for (const compiler::Launch& l : k.launches)
      if (l.summary.find("the parts added by the vector cores") != std::string::npos) {
        mix = l.kernel.program.aiv_per_aic;
        ++found;
      }
    REQUIRE(found == 1);
    return mix;
  };
  unsetenv("NPUSIM_MIX_ONE_TO_ONE");  // the default (each ScopedEnv below unsets it again)
  CHECK(ratio(plain) == 0);
  CHECK(ratio(asked) == 1);
  const auto key = [&](const compiler::OpDesc& op) {
    return compiler::kernel_cache_key(op, cfg, PrecisionMode::kAllowFp32ToFp16);
  };
  CHECK(key(plain) != key(asked));
  {
    ScopedEnv off("NPUSIM_MIX_ONE_TO_ONE", "0");
    CHECK(ratio(asked) == 0);
  }
  {
    ScopedEnv other("NPUSIM_MIX_ONE_TO_ONE", "bn_reduce");
    CHECK(ratio(asked) == 0);
  }
  {
    ScopedEnv on("NPUSIM_MIX_ONE_TO_ONE", "filter_grad");
    CHECK(ratio(plain) == 1);
  }
  compiler::OpDesc bad = plain;
  bad.attrs[compiler::ops::kMixOneToOneAttr] = std::string("filter_grads");
  CHECK_THROWS_WITH(compiler::compile(bad, cfg),
                    Catch::Contains("attribute mix_one_to_one='filter_grads': 'filter_grads' is "
                                    "not a kernel it names"));
}

TEST_CASE("Conv2DBackpropInput: a 1x1 window of stride > 1 stored at dx's strided positions") {
  // dx[n][sh*i][sw*j] = dy[n][i][j] x W^T, zero elsewhere. Where FIXPIPE writes GM (split
  // chips): the product of dy's positions only, its tiles stored at dx's strided positions, by
  // the MatMul or by dy's 1x1 stride-1 convolution; the zeros between written by the kernel's
  // vector cores where dx's pixels are whole 32-byte blocks, else by a fill launch before it
  // (NPUSIM_CONV_STRIDED_INPUT_GRAD=matmul / conv names the kernel, 0 keeps the zero-insertion
  // convolution, unset the lowest estimate). Each case against the double reference and the
  // zero-insertion convolution's dx bit for bit (the same f32 sums of the same products; the
  // inserted zeros add nothing).
  const ChipConfig& cfg = test_sim().config();
  const bool applies = cfg.split && !cube_out_via_ub();
  ConvCase a{2, 9, 7, 30, 1, 1, 20};  // stride 2 SAME over odd H, W: OH 5, OW 4; 60-byte pixels
  a.sh = a.sw = 2;
  ConvCase b{2, 10, 8, 24, 1, 1, 40};  // stride 3 VALID: row 9 and column 7 get no gradient
  b.sh = b.sw = 3;
  b.padding = "VALID";
  ConvCase m{1, 12, 9, 48, 1, 1, 300};  // strides 2 x 3, k 300: runs of 3 rows, several chunks
  m.sh = 2;
  m.sw = 3;
  ConvCase t{4, 16, 16, 64, 1, 1, 64};  // 256 positions: tiles holding several runs of 8
  t.sh = t.sw = 2;
  t.padding = "VALID";
  struct Case {
    ConvCase c;
    DataType dt;
  };
  uint32_t seed = 100;
  for (const Case& k : {Case{a, DataType::F16}, Case{b, DataType::F32}, Case{m, DataType::F16},
                        Case{t, DataType::F16}, Case{t, DataType::BF16}}) {
    if (k.dt == DataType::BF16 && !cfg.cube_bf16) continue;
    seed += 2;
    BackpropInputRun zero_inserted;
    {
      ScopedEnv off("NPUSIM_CONV_STRIDED_INPUT_GRAD", "0");
      zero_inserted = check_conv2d_backprop_input(k.dt, k.c, seed);
    }
    CHECK_FALSE(has_launch(zero_inserted.launches, "MatMul"));
    const bool whole_blocks = k.c.c * compiler::data_type_bytes(k.dt) % 32 == 0;
    for (const char* kernel : {"matmul", "conv"}) {
      INFO(kernel);
      ScopedEnv on("NPUSIM_CONV_STRIDED_INPUT_GRAD", kernel);
      const BackpropInputRun strided = check_conv2d_backprop_input(k.dt, k.c, seed);
      const bool matmul = kernel[0] == 'm';
      CHECK(has_launch(strided.launches, "MatMul") == (applies && matmul));
      CHECK(mentions(strided.launches, matmul ? "C strided" : "y strided") == applies);
      CHECK(has_launch(strided.launches, "Fill0") == (applies && !whole_blocks));
      CHECK(mentions(strided.launches, "zeros between by the vector cores") ==
            (applies && whole_blocks));
      CHECK(strided.dx == zero_inserted.dx);
    }
  }
  // A row of 65,552 dy pixels exceeds set_fmatrix's 16-bit width: neither convolution plans
  // (a CompileError where the switch names the strided one), the MatMul does.
  if (applies) {
    ConvCase wide{1, 1, 131103, 16, 1, 1, 16};
    wide.sw = 2;
    CHECK(has_launch(check_conv2d_backprop_input(DataType::F16, wide, 125).launches, "MatMul"));
    ScopedEnv on("NPUSIM_CONV_STRIDED_INPUT_GRAD", "conv");
    CHECK_THROWS_WITH(check_conv2d_backprop_input(DataType::F16, wide, 125),
                      Catch::Contains("set_fmatrix"));
  }
  // Forced, a 3x3 window of stride 2 stays on the zero-insertion convolution (its windows
  // overlap); so does f32 under allow_mix_precision (FIXPIPE writes f16 that a launch widens).
  {
    ScopedEnv on("NPUSIM_CONV_STRIDED_INPUT_GRAD", "1");
    ConvCase w{2, 8, 8, 4, 3, 3, 6};
    w.sh = w.sw = 2;
    CHECK_FALSE(mentions(check_conv2d_backprop_input(DataType::F16, w, 120).launches, "strided"));
    CHECK_FALSE(mentions(
        check_conv2d_backprop_input(DataType::F32, a, 121, PrecisionMode::kAllowMixPrecision)
            .launches,
        "strided"));
  }
  // Unforced on the 910b (compiled, not run): ResNet-50's 256 -> 512 projection at batch 8 takes
  // a strided kernel, one launch writing the zeros too, its modelled cycles below the other's
  // and the zero-insertion convolution's; the summary states all three.
  {
    ConvCase r{8, 56, 56, 256, 1, 1, 512};
    r.sh = r.sw = 2;
    r.padding = "VALID";
    const TensorDesc f{DataType::F16, filter_shape(r)}, dy{DataType::F16, y_shape(r)};
    auto op = make_op("Conv2DBackpropInput", {f, dy}, r.attrs());
    op.attrs["input_sizes"] = std::vector<int64_t>{r.n, r.h, r.w, r.c};
    const compiler::CompiledKernel k = compiler::compile(op, load_chip_config("910b"));
    REQUIRE(k.launches.size() == 1);
    const std::string& s = k.launches[0].summary;
    INFO(s);
    REQUIRE(s.find("modelled ~") != std::string::npos);
    const double chosen = std::stod(s.substr(s.find("modelled ~") + 10));
    const double other = std::stod(s.substr(s.find(" ~", s.find("; the ")) + 2));
    const double zero_inserted = std::stod(s.substr(s.find("insertion convolution ~") + 23));
    CHECK(chosen <= other);
    CHECK(chosen < zero_inserted);
    ScopedEnv bad("NPUSIM_CONV_STRIDED_INPUT_GRAD", "yes");
    CHECK_THROWS_WITH(compiler::compile(op, load_chip_config("910b")),
                      Catch::Contains("NPUSIM_CONV_STRIDED_INPUT_GRAD='yes'"));
  }
}

// store_strided_rows starts a fixpipe at any row of an L0C column block, the rows 16 f32 (64
// bytes) apart: on a chip whose alignment.l0c does not divide 64 bytes no strided input
// gradient applies, whatever NPUSIM_CONV_STRIDED_INPUT_GRAD says: the zero-insertion
// convolution serves it, dx bit for bit the test chip's; and a strided store built anyway (the
// MatMul with a strided C) is a CompileError naming the key and its value. (Compiled for the
// test chip with alignment.l0c 128, verified against that config, run on the test chip: its
// buffers, 128-byte aligned, are 64-byte aligned too.)
TEST_CASE("Conv2DBackpropInput: a 1x1 window of stride 2 on an L0C alignment of 128 bytes") {
  const ChipConfig cfg = load_chip_config(test_chip_name(), {"alignment.l0c=128"});
  REQUIRE_FALSE(compiler::ops::strided_rows_fit_l0c(cfg));
  REQUIRE(compiler::ops::strided_rows_fit_l0c(test_sim().config()) ==
          (test_sim().config().align_bytes.at(isa::Buf::L0C) <= 64));
  ConvCase t{4, 16, 16, 64, 1, 1, 64};  // the strided test's case of runs of 8 rows
  t.sh = t.sw = 2;
  t.padding = "VALID";
  BackpropInputRun zero_inserted;
  {
    ScopedEnv off("NPUSIM_CONV_STRIDED_INPUT_GRAD", "0");
    zero_inserted = check_conv2d_backprop_input(DataType::F16, t, 130);
  }
  for (const char* kernel : {"", "1", "matmul", "conv"}) {
    INFO("NPUSIM_CONV_STRIDED_INPUT_GRAD='" << kernel << "'");
    ScopedEnv on("NPUSIM_CONV_STRIDED_INPUT_GRAD", kernel);
    const BackpropInputRun r = check_conv2d_backprop_input(
        DataType::F16, t, 130, PrecisionMode::kAllowFp32ToFp16, false, &cfg);
    CHECK_FALSE(mentions(r.launches, "strided"));
    CHECK_FALSE(has_launch(r.launches, "MatMul"));
    CHECK(r.dx == zero_inserted.dx);
  }
  if (cfg.split && cfg.has_path(isa::Buf::L0C, isa::Buf::GM)) {
    compiler::ops::MatmulTiling m = compiler::ops::plan_matmul_tiling(
        256, 64, 64, false, true, isa::Dtype::F16, isa::Dtype::F16, cfg, "test", 1, true);
    m.c_strided = compiler::ops::StridedRows{8, 128, 2048, 8, 16384, 64, 65536};
    CHECK_THROWS_WITH(
        compiler::ops::build_matmul_launch(m, cfg, "test"),
        Catch::Contains("alignment.l0c = 128 bytes") && Catch::Contains("must divide 64"));
  }
}

TEST_CASE("Img2col and the filter gradient: the blocks touch disjoint GM bytes, so they replay") {
  // A launch is recorded for replay only if no block touches GM bytes another block writes
  // (sim/replay/launch_replay.h, record_blocks). Each block of the img2col kernel writes the
  // 0/1 repetition matrix to a copy of its own and reads only that, its output rows being its
  // tiles': run twice at the same addresses, the launch is replayed the second time.
  // The depthwise filter gradient's img2col (multiplier 1: 20 output channels), and the filter
  // gradient's fused kernel (each block writes the rows of its own tiles).
  for (const std::string name : {"DepthwiseConv2dNativeBackpropFilter", "Conv2DBackpropFilter"}) {
    const bool depthwise = name[0] == 'D';
    ConvCase c{2, 5, 7, 20, 1, 1, depthwise ? 20 : 24};
    c.sh = c.sw = 2;
    INFO(name);
    HostTensor x = random_tensor(DataType::F16, {c.n, c.h, c.w, c.c}, -2, 2, 90);
    HostTensor sizes{TensorDesc{DataType::S32, {4}},
                     {double(c.kh), double(c.kw), double(c.c), depthwise ? 1.0 : double(c.cout)}};
    HostTensor dy = random_tensor(DataType::F16, y_shape(c), -1, 1, 91);
    auto op = make_op(name, {x.desc, sizes.desc, dy.desc}, c.attrs());
    op.outputs = {TensorDesc{DataType::F16, {c.kh, c.kw, c.c, depthwise ? 1 : c.cout}}};
    compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
    summarize(k);
    const std::string prefix = depthwise ? "Img2col" : "FilterGrad";
    auto launch = std::find_if(k.launches.begin(), k.launches.end(), [&](const auto& l) {
      return l.kernel.program.name.rfind(prefix, 0) == 0;
    });
    REQUIRE(launch != k.launches.end());
    REQUIRE(launch->block_dim >= 2);
    k.launches = {*launch};
    run_compiled(test_sim(), k, {x, sizes, dy});
    // Where its vector cores add the parts the cube cores wrote (split chips), they read bytes
    // other blocks wrote: not recorded, run again.
    const bool adds_parts =
        launch->summary.find("parts added by the vector cores") != std::string::npos;
    CHECK(run_compiled(test_sim(), k, {x, sizes, dy}).replayed == (adds_parts ? 0 : 1));
  }
}

TEST_CASE("Depthwise convolutions and their gradients (block-diagonal groups on the cube)") {
  ConvCase a{2, 7, 6, 5, 3, 3, 0};   // 5 channels, multiplier 1
  ConvCase b{1, 9, 8, 20, 3, 2, 0};  // 2 groups, the second partial; stride, dilation
  b.sh = 2;
  b.dw = 2;
  b.padding = "VALID";
  ConvCase c{2, 6, 7, 17, 2, 3, 0};
  c.sw = 2;
  c.padding = "EXPLICIT";
  c.explicit_pads = {1, 0, 2, 1};
  for (int kind = 0; kind < 3; ++kind) {
    check_depthwise(kind, DataType::F16, a, 1, 50 + kind);
    check_depthwise(kind, DataType::F16, b, 2, 60 + kind);
    check_depthwise(kind, DataType::F32, c, 3, 70 + kind);
  }
  check_bf16_case([&] { check_depthwise(0, DataType::BF16, a, 2, 80); });
}

TEST_CASE("Block-diagonal groups: several depthwise 16-channel groups per kernel step") {
  // Each group's channel blocks multiplied into their own column blocks of the tile.
  // 40 channels in groups of 2 blocks: the second group one partial block (8 channels).
  check_diagonal_groups(ConvCase{2, 7, 9, 40, 3, 3, 0}, 1, 2, 0, true, 100);
  // Every block in one group (3 of 16, 96 outputs: multiplier 2), stride 2.
  check_diagonal_groups(ConvCase{1, 9, 8, 48, 3, 3, 0}.window(2, 2, 1, 1, "SAME"), 2, 3, 0, true,
                        102);
  // Groups of 3 blocks over 33 channels (the last block 1 channel, the last group one block),
  // dilation, a 16-pixel-wide map of one image per tile (every slab's planes whole fractals:
  // one nd2nz for all).
  check_diagonal_groups(ConvCase{2, 6, 16, 33, 3, 2, 0}.window(1, 1, 2, 1, "SAME"), 1, 3, 0, true,
                        104, 1);
  // One block per chunk (a tile's column blocks filled over two steps), weights resident and
  // streamed.
  for (bool resident : {true, false}) {
    const std::string plan =
        check_diagonal_groups(ConvCase{2, 5, 16, 64, 3, 3, 0}, 1, 2, 1, resident, 106, 1);
    CHECK_THAT(plan, Catch::Contains("(2 chunk(s)"));
  }
  // 80 channels in groups of 2 blocks: the last group holds one block, so chunks of one block
  // would leave its second chunk empty. Such a chunking is refused by name, and every tiling
  // the planner ranks for the depthwise compile (NPUSIM_CONV_PLAN_RANK) has only non-empty
  // chunks: the compile of each rank succeeds, a kernel of one chunk runs against the direct
  // product.
  {
    const ConvCase c80{1, 5, 6, 80, 3, 3, 0};
    CHECK_THROWS_WITH(check_diagonal_groups(c80, 1, 2, 1, true, 108),
                      Catch::Contains("the last group's chunk 2 holds no channels"));
    ScopedEnv two("NPUSIM_DEPTHWISE_GROUPS_PER_STEP", "2");
    for (int rank = 1;; ++rank) {
      ScopedEnv forced("NPUSIM_CONV_PLAN_RANK", std::to_string(rank).c_str());
      compiler::CompiledKernel k;
      try {
        k = compiler::compile(make_op("DepthwiseConv2dNative",
                                      {TensorDesc{DataType::F16, {c80.n, c80.h, c80.w, c80.c}},
                                       TensorDesc{DataType::F16, {c80.kh, c80.kw, c80.c, 1}}},
                                      c80.attrs()),
                              test_sim().config());
      } catch (const compiler::CompileError& e) {
        INFO(e.what());
        CHECK(std::string(e.what()).find("tilings fit") != std::string::npos);
        CHECK(rank > 1);
        break;
      }
      INFO("rank " << rank << ": " << conv_summary(k));
      CHECK_THAT(conv_summary(k), Catch::Contains("(1 chunk(s)"));
    }
    check_diagonal_groups(c80, 1, 2, 2, true, 108);
  }
  // Only groups of one 16-channel block merge.
  compiler::ops::CubeConvSpec wide;
  wide.cg_in = 32;
  CHECK_THROWS_WITH(compiler::ops::merge_diagonal_groups(wide, 2, "dw"),
                    Catch::Contains("one 16-channel block"));
}

namespace {
struct Groups : ScopedEnv {
  explicit Groups(const char* v) : ScopedEnv("NPUSIM_DEPTHWISE_GROUPS_PER_STEP", v) {}
};
struct TileOrder : ScopedEnv {
  explicit TileOrder(const char* v) : ScopedEnv("NPUSIM_DEPTHWISE_TILE_ORDER", v) {}
};
// DepthwiseConv2dNative of case c (f16) with multiplier m, for compile checks.
compiler::OpDesc depthwise_op(const ConvCase& c, int64_t m) {
  return make_op("DepthwiseConv2dNative",
                 {TensorDesc{DataType::F16, {c.n, c.h, c.w, c.c}},
                  TensorDesc{DataType::F16, {c.kh, c.kw, c.c, m}}},
                 c.attrs());
}
}  // namespace

TEST_CASE("NPUSIM_DEPTHWISE_GROUPS_PER_STEP: the depthwise compile's groups per kernel step") {
  // 40 channels x multiplier 2 (3 groups, the last 8 channels): 2 per step (the second step's
  // group one partial block), and more than there are (all 3 in one step).
  const ConvCase c{2, 7, 9, 40, 3, 3, 0};
  {
    Groups two("2");
    CHECK(mentions(check_depthwise(0, DataType::F16, c, 2, 110), "2 group(s) of 32 -> 64"));
  }
  {
    Groups five("5");
    CHECK(mentions(check_depthwise(0, DataType::F16, c, 2, 112), "1 group(s) of 48 -> 96"));
  }
  {
    Groups one("1");
    CHECK(mentions(check_depthwise(0, DataType::F16, c, 2, 114), "3 group(s) of 16 -> 32"));
  }
  Groups zero("0");
  CHECK_THROWS_WITH(compiler::compile(depthwise_op(c, 2), test_sim().config()),
                    Catch::Contains("NPUSIM_DEPTHWISE_GROUPS_PER_STEP='0' is not a positive"));
}

namespace {
// The planner's estimate (cycles) and the groups of k's cube convolution launch, from its
// summary ("N group(s) of ...", "~E cycles").
std::pair<double, int64_t> conv_estimate_and_groups(const compiler::CompiledKernel& k) {
  const std::string s = conv_summary(k);
  const size_t e = s.rfind('~'), g = s.find(" group(s) of ");
  REQUIRE(e != std::string::npos);
  REQUIRE(g != std::string::npos);
  const size_t g0 = s.rfind(' ', g - 1) + 1;
  return {std::stod(s.substr(e + 1)), std::stoll(s.substr(g0, g - g0))};
}
}  // namespace

TEST_CASE("depthwise groups per step: unforced, the planner's lowest estimate") {
  // Unforced, the depthwise compile takes the fewest 16-channel groups per kernel step whose
  // plan the planner estimates within kPlanTieBand of the fastest, among the counts forced
  // through NPUSIM_DEPTHWISE_GROUPS_PER_STEP. MobileNetV2's 28x28x192 and 14x14x384 layers on the
  // 310P (batch 4, compile only), where merging estimates faster (more than one group per
  // step: fails while the compile took one group unforced), and this test chip's cases run
  // against the direct product with the chosen count.
  const ChipConfig p310 = load_chip_config("310p");
  for (const ConvCase& c : {ConvCase{4, 28, 28, 192, 3, 3, 0}, ConvCase{4, 14, 14, 384, 3, 3, 0}}) {
    const auto [est, groups] =
        conv_estimate_and_groups(compiler::compile(depthwise_op(c, 1), p310));
    std::vector<std::pair<double, int64_t>> forced_plans;
    std::string seen;
    for (int per = 1; per <= 16; ++per) {
      Groups forced(std::to_string(per).c_str());
      forced_plans.push_back(conv_estimate_and_groups(compiler::compile(depthwise_op(c, 1), p310)));
      seen += std::to_string(per) + " per step: ~" + std::to_string(forced_plans.back().first) +
              " cycles, " + std::to_string(forced_plans.back().second) + " groups\n";
    }
    double lowest = forced_plans.front().first;
    for (const auto& p : forced_plans) lowest = std::min(lowest, p.first);
    const auto expected = *std::find_if(forced_plans.begin(), forced_plans.end(), [&](auto& p) {
      return p.first <= lowest * (1 + compiler::ops::kPlanTieBand);
    });
    INFO(seen << "unforced: ~" << est << " cycles, " << groups << " groups");
    CHECK(est == expected.first);
    CHECK(groups == expected.second);
    CHECK(groups < c.c / 16);
  }
  check_depthwise(0, DataType::F16, ConvCase{2, 9, 8, 80, 3, 3, 0}, 1, 132);
  check_depthwise(0, DataType::F16, ConvCase{2, 7, 9, 40, 3, 3, 0}, 2, 134);
}

TEST_CASE("cube conv planner: a grouped convolution's first reads of x over the cores' steps") {
  // MobileNetV2's 56x56x144 depthwise layer on the 310P (batch 4, f16, compile only). The L2
  // fills whole lines, each holding every group's channels of its pixels, so x comes from HBM
  // once, read by whichever tile reads a row first. How much of that read the cores' work
  // hides depends on when the first reads come: HBM's time for x is x's bytes over the
  // preset's sustained rate; taking it away (HBM a thousand times faster) lowers the estimate
  // by less than half of it where the blocks' first tiles are spread over the map (five groups
  // per step: two keys, the blocks of each start a quarter of the positions apart, so x's
  // first reads run through the whole launch), and by more than three quarters of it where
  // they come at the launch's start (one group per step: the eight blocks start on different
  // groups a few tiles apart, and x is read once they have each done a few tiles). Before
  // the first reads were modelled the estimate added all of HBM's time to the busiest core's,
  // and the first check failed.
  const ChipConfig p310 = load_chip_config("310p");
  const ChipConfig fast_hbm =
      load_chip_config("310p", {"memory.hbm.gbps=" + std::to_string(p310.hbm_gbps * 1000)});
  const ConvCase c{4, 56, 56, 144, 3, 3, 0};
  const double x_time =
      static_cast<double>(c.n * c.h * c.w * c.c * 2) / p310.hbm_sustained_bytes_per_cycle();
  auto estimate = [&](const char* per, const ChipConfig& cfg) {
    Groups forced(per);
    return conv_estimate_and_groups(compiler::compile(depthwise_op(c, 1), cfg)).first;
  };
  const double spread = estimate("5", p310) - estimate("5", fast_hbm);
  const double at_start = estimate("1", p310) - estimate("1", fast_hbm);
  INFO("x over HBM " << x_time << " cycles; HBM's share of the estimate: 5 per step " << spread
                     << ", 1 per step " << at_start);
  CHECK(spread < 0.5 * x_time);
  CHECK(at_start > 0.75 * x_time);
}

TEST_CASE("NPUSIM_DEPTHWISE_TILE_ORDER=spatial: depthwise tiles position-major") {
  const ConvCase c{2, 7, 9, 40, 3, 3, 0};
  {
    TileOrder spatial("spatial");
    Groups one("1");  // the groups apart (merged, a single group has one key: no order)
    // 3 groups (the last 8 channels) x multiplier 2; several m tiles per image; small images
    // (a block's tiles cycling through 4 groups across images); a block-diagonal step of 2
    // groups with the order; each against the direct product.
    CHECK(mentions(check_depthwise(0, DataType::F16, c, 2, 120), "position-major"));
    CHECK(mentions(check_depthwise(0, DataType::F16, ConvCase{2, 20, 21, 48, 3, 3, 0}, 1, 122),
                   "position-major"));
    CHECK(mentions(check_depthwise(0, DataType::F16, ConvCase{8, 4, 5, 64, 3, 3, 0}, 1, 124),
                   "position-major"));
    check_depthwise(0, DataType::F32, ConvCase{3, 6, 5, 24, 2, 3, 0}.window(2, 1, 1, 2, "SAME"), 1,
                    126);
    Groups two("2");
    CHECK(mentions(check_depthwise(0, DataType::F16, ConvCase{2, 9, 8, 80, 3, 3, 0}, 1, 128),
                   "position-major"));
  }
  CHECK_FALSE(mentions(check_depthwise(0, DataType::F16, c, 2, 130), "position-major"));
  TileOrder bad("rows");
  CHECK_THROWS_WITH(compiler::compile(depthwise_op(c, 2), test_sim().config()),
                    Catch::Contains("NPUSIM_DEPTHWISE_TILE_ORDER='rows' is neither"));
}

TEST_CASE("Conv2D stacked images: m tiles across images, any image count") {
  // Tilings forced to stack 2..4 images into one tall map (CubeConvTiling): image positions
  // not a multiple of 16, the batch not a multiple of the stack (the last stack is partial),
  // strides (the period a multiple of sh), asymmetric paddings, (L0A cut to 4 KiB, so tiles
  // of at most 64 positions) several m tiles per tall map, tiles starting in the rows between
  // images, and one L0C buffer (the FIX of a tile before the next tile's first mmad). Each
  // against the direct convolution.
  struct Forced {
    ConvCase c;
    int64_t stack;
    std::string set;  // a chip override for the planner ("" = the test chip as it is)
    bool one_l0c = false;
  };
  const std::string l0a_4k = cube_core_key("buffers.l0a=4 KiB");
  std::vector<Forced> cases;
  cases.push_back({ConvCase{5, 5, 5, 40, 3, 3, 24}, 2, ""});  // 25 positions, 5 = 2 + 2 + 1
  cases.push_back({ConvCase{5, 5, 5, 40, 3, 3, 24}, 3, ""});
  ConvCase s2{3, 7, 6, 20, 3, 3, 18};
  s2.sh = s2.sw = 2;
  cases.push_back({s2, 2, ""});
  ConvCase ex{4, 6, 5, 17, 3, 2, 33};
  ex.padding = "EXPLICIT";
  ex.explicit_pads = {2, 0, 1, 1};
  ex.dh = 2;
  cases.push_back({ex, 3, ""});
  cases.push_back({ConvCase{7, 6, 6, 24, 3, 3, 20}, 4, l0a_4k});
  ConvCase v{3, 6, 7, 16, 2, 2, 16};
  v.padding = "VALID";
  cases.push_back({v, 3, l0a_4k});
  cases.push_back({ConvCase{5, 5, 5, 40, 3, 3, 48}, 2, "", true});
  uint32_t seed = 90;
  for (const Forced& fc : cases) {
    const ConvCase& c = fc.c;
    const Dim dh = c.dim_h(), dw = c.dim_w();
    compiler::ops::CubeConvSpec s = cube_conv_geometry(c);
    s.cg_in = c.c;
    s.cg_out = s.cy = c.cout;
    s.b_tap = c.c * c.cout;
    s.b_row = c.cout;
    pad_rows_for_test_chip(s);
    const ChipConfig plan_cfg =
        fc.set.empty() ? test_sim().config() : load_chip_config(test_chip_name(), {fc.set});
    auto t = compiler::ops::plan_cube_conv(s, plan_cfg, "test", fc.stack);
    if (fc.one_l0c) t.l0c_buffers = 1;
    INFO("x [" << c.n << "," << c.h << "," << c.w << "," << c.c << "] " << c.kh << "x" << c.kw
               << " -> " << c.cout << ": " << t.str());
    REQUIRE(t.stack == fc.stack);
    if (fc.set == l0a_4k) CHECK(t.m_tiles > 1);
    HostTensor x = random_tensor(DataType::F16, {c.n, c.h, c.w, c.c}, -2, 2, seed++);
    HostTensor f = random_tensor(DataType::F16, filter_shape(c), -1, 1, seed++);
    Reference ref = new_reference(static_cast<size_t>(c.n * dh.out * dw.out * c.cout));
    for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
      accumulate(ref, yi, x.values[static_cast<size_t>(xi)] * f.values[static_cast<size_t>(fi)]);
    });
    compiler::CompiledKernel k;
    k.outputs = {TensorDesc{DataType::F16, {c.n, dh.out, dw.out, s.pitch()}}};
    k.launches = {compiler::ops::build_cube_conv(s, t, plan_cfg, "test")};
    RunResult r = run_compiled(test_sim(), k, {x, f});
    check_against(unpadded_rows(r.outputs[0].values, s), ref, DataType::F16, false, "y");
  }
  // Zero insertion cannot be stacked.
  compiler::ops::CubeConvSpec z;
  z.images = 2;
  z.hs = z.ws = 4;
  z.up_h = 2;
  z.cg_out = z.cy = 16;
  z.b_tap = z.b_row = 16;
  CHECK_THROWS_WITH(compiler::ops::plan_cube_conv(z, test_sim().config(), "zi", 2),
                    Catch::Contains("cannot stack"));
}

TEST_CASE("Conv2D stacking: the planner stacks small images (ResNet-50 res5 on 910b)") {
  // 7x7 images: one image per map rounds its 49 positions to 64 rows of the cube (77 %); two
  // stacked with one zero row between them take 105 positions, 112 rows (87.5 %).
  // Without the DMA's issue keys: where the chip prices GM bursts (the 910b preset) a slab of
  // whole pixels, which stacked slabs cannot take, outweighs the stacked rows here.
  const compiler::ops::CubeConvSpec s = square_conv_spec(32, 7, 512, 512, 3);
  const auto t = compiler::ops::plan_cube_conv(
      s, load_chip_config("910b", {"mte.copy_issue_cycles=0", "mte.burst_cycles=0"}), "res5");
  INFO(t.str());
  CHECK(t.stack > 1);
  CHECK(t.period == 8);
}

TEST_CASE("Conv2D stacking: the planner's scalar work per plane and image, from the kernel") {
  // The kernel's loop over a stacked slab's planes, counted in its listing (ResNet-50's 1x1
  // 2048 -> 512 layer at 7x7, batch 8: images 7 rows apart; its 3x3 512 -> 512: a gap row
  // between them; stacks of 2 to 4 on the 910b): per plane, the instructions besides the
  // images' nd2nz, divided by the images, are the planner's stacked_slab_scalar_per_image.
  const ChipConfig cfg = load_chip_config("910b");
  for (const auto& [s, stack] : {std::pair{square_conv_spec(8, 7, 2048, 512, 1), int64_t{2}},
                                 std::pair{square_conv_spec(8, 7, 2048, 512, 1), int64_t{3}},
                                 std::pair{square_conv_spec(8, 7, 512, 512, 3), int64_t{4}}}) {
    const auto t = compiler::ops::plan_cube_conv(s, cfg, "res5", stack);
    REQUIRE(t.stack == stack);
    const std::string listing = compiler::ops::build_cube_conv(s, t, cfg, "res5").kernel.listing;
    std::istringstream in(listing);
    std::string line;
    int64_t body = 0, images = 0;
    bool in_plane = false, seen = false;
    while (std::getline(in, line)) {
      const bool label = !line.empty() && line.back() == ':';
      if (label && line.rfind("loop_", 0) == 0 && line.find("end") == std::string::npos && !seen) {
        in_plane = true;  // the first loop: the slab's planes
        seen = true;
        continue;
      }
      if (label && line.rfind("loop_end_", 0) == 0) in_plane = false;
      if (!in_plane || label) continue;
      ++body;
      if (line.find("the image's rows of one plane") != std::string::npos) ++images;
    }
    INFO(listing);
    REQUIRE(images == stack);
    CHECK(static_cast<double>(body - images) / static_cast<double>(images) ==
          Approx(compiler::ops::stacked_slab_scalar_per_image(stack, t.period != s.hv())));
  }
}

namespace {
// The output tile height of the cube convolution launch among `launches` ("tiles 448x16 ...").
int64_t conv_tile_height(const std::vector<std::string>& launches) {
  for (const std::string& l : launches) {
    const size_t at = l.find("cube conv");
    const size_t tiles = l.find("tiles ", at == std::string::npos ? l.size() : at);
    if (tiles != std::string::npos) return std::stoll(l.substr(tiles + 6));
  }
  FAIL("no cube convolution launch");
  return 0;
}
}  // namespace

TEST_CASE("Depthwise groups per step: a count that does not plan is left out") {
  // A 31x31 window over 128 channels on the tiny chip: one 16-channel group per step plans,
  // two do not (no tile fits); unforced, the planner's search over the counts leaves two out
  // and takes one. Compiled for the tiny chip (the 910b's larger buffers fit two); run where
  // the test chip is the tiny one, against the reference.
  const ChipConfig tiny = load_chip_config("tiny");
  const TensorDesc x{DataType::F16, {1, 16, 16, 128}}, f{DataType::F16, {31, 31, 128, 1}};
  const std::map<std::string, compiler::AttrValue> attrs = {
      {"strides", std::vector<int64_t>{1, 1, 1, 1}}, {"padding", std::string("SAME")}};
  const OpDesc op = make_op("DepthwiseConv2dNative", {x, f}, attrs);
  {
    ScopedEnv two("NPUSIM_DEPTHWISE_GROUPS_PER_STEP", "2");
    CHECK_THROWS_WITH(compiler::compile(op, tiny), Catch::Contains("no convolution tile fits"));
  }
  CHECK_NOTHROW(compiler::compile(op, tiny));
  if (test_sim().config().name == "tiny")
    check_depthwise(0, DataType::F16, ConvCase{1, 16, 16, 128, 31, 31, 128}, 1, 92);
}

TEST_CASE("Depthwise tiles taller than MatMul's 256 positions (CubeConvSpec::max_tile_height)") {
  // Maps of 1,600 and 576 output positions (stride 1, and stride 2 with two groups, the second
  // partial), each against the direct product: on the few-core test chips the planner takes
  // tiles taller than 256 for both.
  const ConvCase plain{1, 40, 40, 16, 3, 3, 0};
  check_depthwise(0, DataType::F16, plain, 1, 130);
  check_depthwise(0, DataType::F16, ConvCase{2, 48, 48, 24, 3, 3, 0}.window(2, 2, 1, 1, "SAME"), 1,
                  132);
  // On one cube core the planner takes the taller tile (it may: up to 512 positions) for the
  // 1,600 positions, and never one past the limit.
  const ChipConfig one_core = load_chip_config("tiny", {"cores.aic.count=1", "cores.aiv.count=2"});
  compiler::CompiledKernel k = compiler::compile(depthwise_op(plain, 1), one_core);
  std::vector<std::string> summaries;
  for (const compiler::Launch& l : k.launches) summaries.push_back(l.summary);
  INFO(summaries.back());
  CHECK(conv_tile_height(summaries) > 256);
  CHECK(conv_tile_height(summaries) <= 512);
}

TEST_CASE("cube conv planner: a coupled chip's batch-norm way out priced stage by stage") {
  // MobileNetV2's 14x14 64 -> 384 expansion on the 310P (batch 4, f16, the batch norm and ReLU6
  // in the way out through the UB). Every tile's store lands before its UB buffers take the
  // tile two after it (the store's set_flag), so the landing's latency is paid once per tile
  // of a buffer where the way out bounds the block: raising the L2's latency (the landing of
  // stores into lines present) by d must raise the estimate by at least d per tile of the
  // busier buffer beyond its first (whose store misses: HBM's latency), for every plan and so
  // for the chosen one (t_slow) over its own estimate at the base latency, which is at least
  // the lowest there, which is at least t's over 1 + kPlanTieBand (the planner takes the first
  // tiling within that band of the lowest); and a much slower landing makes the planner take
  // fewer, larger tiles per core.
  compiler::ops::CubeConvSpec s = square_conv_spec(4, 14, 64, 384, 1);
  s.bn_affine = true;
  s.bn_a_in_filter = true;
  s.act = compiler::ops::Activation::kRelu6;
  const ChipConfig base = load_chip_config("310p");
  auto with_l2_latency = [&](int d) {
    return load_chip_config(
        "310p", {"memory.l2.latency_cycles=" + std::to_string(base.l2_latency_cycles + d)});
  };
  const int d = 200;
  const auto t = compiler::ops::plan_cube_conv(s, base, "pw");
  const auto t_slow = compiler::ops::plan_cube_conv(s, with_l2_latency(d), "pw");
  const auto t_slower = compiler::ops::plan_cube_conv(s, with_l2_latency(10 * d), "pw");
  INFO(t.str() << "\n" << t_slow.str() << "\n" << t_slower.str());
  CHECK(t_slow.tiles_per_block >= 4);
  CHECK(t_slow.est_cycles - t.est_cycles / (1 + compiler::ops::kPlanTieBand) >=
        d * ((t_slow.tiles_per_block + 1) / 2 - 1));
  CHECK(t_slower.tiles_per_block < t.tiles_per_block);
}

namespace {
struct PixelLoads : ScopedEnv {
  explicit PixelLoads(const char* v) : ScopedEnv("NPUSIM_CONV_PIXEL_LOADS", v) {}
};
}  // namespace

TEST_CASE("NPUSIM_CONV_PIXEL_LOADS=1: dense slabs by whole pixels compute the same") {
  // Every dense slab by one nd2nz of whole pixels (the bursts: test_compiler_conv_bursts.cpp),
  // against the references: partial channel blocks (40, 5), several chunks (kc1 < channel
  // blocks with 200 channels), strides and dilations, the input gradient (stride 1: a dense
  // slab of dy), the filter gradient and the block-diagonal depthwise groups. One image where
  // the summary is checked (several would be stacked: not a dense slab).
  PixelLoads on("1");
  CHECK(mentions(check_conv2d(DataType::F16, ConvCase{1, 9, 7, 40, 3, 3, 24}, 301),
                 "by whole pixels"));
  check_conv2d(DataType::F16, ConvCase{2, 9, 7, 40, 3, 3, 24}, 302);
  check_conv2d(DataType::F16, ConvCase{1, 6, 5, 200, 3, 3, 32}.window(2, 1, 1, 2, "SAME"), 303);
  check_conv2d(DataType::F32, ConvCase{2, 5, 6, 5, 2, 3, 17}, 305);
  check_conv2d_backprop_input(DataType::F16, ConvCase{2, 7, 6, 24, 3, 3, 40}, 307);
  check_conv2d_backprop_filter(DataType::F16, ConvCase{2, 8, 7, 40, 3, 3, 24}, 309);
  check_depthwise(0, DataType::F16, ConvCase{2, 7, 6, 40, 3, 3, 0}, 1, 311);
  PixelLoads bad("2");
  CHECK_THROWS_WITH(compiler::compile(make_op("Conv2D",
                                              {TensorDesc{DataType::F16, {1, 8, 8, 64}},
                                               TensorDesc{DataType::F16, {1, 1, 64, 16}}},
                                              ConvCase{1, 8, 8, 64, 1, 1, 16}.attrs()),
                                      test_sim().config()),
                    Catch::Contains("NPUSIM_CONV_PIXEL_LOADS='2' is none of"));
}

TEST_CASE("NPUSIM_CONV_WEIGHT_RUNS=1: the input gradient's weights by tap compute the same") {
  // Every kRowsN B by tap (one nd2nz per tap of the chunk's channels, an L0B load per k-block:
  // CubeConvTiling::weights_by_tap; the bursts: test_compiler_conv_bursts.cpp), against the
  // references: a partial last channel block of dy (40 channels) and of dx (24), the flipped
  // taps, zero insertion (stride 2), more dx channels than one n tile may hold, and 1x1
  // windows (one tap: the per-block layout), of stride 1 and 2.
  // (By tap needs chunks of several channel blocks: the chip's L1 decides which cases get
  // them, at least one on every test chip.)
  ScopedEnv on("NPUSIM_CONV_WEIGHT_RUNS", "1");
  int by_tap = 0;
  const auto check = [&](const ConvCase& c, uint32_t seed) {
    for (const std::string& l : check_conv2d_backprop_input(DataType::F16, c, seed).launches)
      by_tap += l.find("by tap") != std::string::npos ? 1 : 0;
  };
  check(ConvCase{2, 7, 6, 24, 3, 3, 40}, 321);
  check(ConvCase{1, 8, 8, 32, 3, 3, 48}.window(2, 2, 1, 1, "SAME"), 323);
  check(ConvCase{1, 6, 5, 200, 3, 3, 64}, 325);
  check(ConvCase{2, 6, 6, 48, 1, 1, 96}, 327);
  check(ConvCase{2, 8, 8, 48, 1, 1, 64}.window(2, 2, 1, 1, "SAME"), 328);
  CHECK(by_tap > 0);
  ScopedEnv bad("NPUSIM_CONV_WEIGHT_RUNS", "2");
  CHECK_THROWS_WITH(
      check_conv2d_backprop_input(DataType::F16, ConvCase{1, 5, 5, 16, 3, 3, 32}, 329),
      Catch::Contains("NPUSIM_CONV_WEIGHT_RUNS='2' is none of"));
}
