// Convolutions, NHWC as TensorFlow gives them, on the cube (kernels in ops/conv_emitter.cpp):
//
//   Conv2D(x [N,H,W,C], filter [KH,KW,Cin,Cout]) -> y [N,OH,OW,Cout]
//     the cube convolution kernel: img2col by load3d from NHWC slabs, B = the HWIO filter read
//     as (kh, kw, cin) rows, k-block by k-block (kRowsK). C = G * Cin gives G groups.
//   Conv2DBackpropInput(input_sizes, filter, dy) -> dx [N,H,W,C]
//     dx = a stride-1 convolution of dy with zeros inserted between its pixels (sh - 1 rows,
//     sw - 1 columns), padded by ((KH-1)*dh - pt) above and (H - Hv + pt) below (Hv =
//     (OH-1)*sh + 1; the part of that beyond (KH-1)*dh - 1 appended as zero rows), the same
//     for W, dilation (dh, dw), and the filter flipped and transposed:
//     B[(kh, kw, cout)][cin] = filter[KH-1-kh][KW-1-kw][cin][cout] (kRowsN, flipped).
//     C = G * Cin: G groups, group g's Cout/G channels of dy to its Cin of dx (one launch).
//   Conv2DBackpropFilter(x, filter_sizes, dy) -> dW [KH,KW,Cin,Cout]
//     dW = img2col(x)^T * dy by the fused kernel (build_filter_grad): img2col(x) made in L0A
//     by load3dt from slabs of x in L1, never in GM; few input channels without padding along
//     W take the width-folded view of x. A 1x1 window of stride 1 without padding is the MatMul
//     x^T * dy (transpose_a). Few output tiles over a long k (N*OH*OW): the product is split
//     along k into equal parts spread over the cube cores (f32 partial products), summed by a
//     vector reduction (plan_k_split / append_fused_filter_grad, append_partial_sum).
//     C = G * Cin: the fused kernel with G groups (FilterGradSpec::groups: a tile is one
//     group's rows and columns; dense x, no MatMul, no width fold), one launch.
//   DepthwiseConv2dNative(x [N,H,W,C], filter [KH,KW,C,M]) -> y [N,OH,OW,C*M]
//     a grouped convolution: groups of 16 input channels, 16*M outputs each, with the
//     block-diagonal filter Wbd[g][kh][kw][c0][c0'*M + q] = filter[kh][kw][16g + c0'][q] if
//     c0 == c0' (built in the workspace by a vector kernel). The cube does 16x the MACs of the
//     depthwise product, still several times the vector unit's rate.
//   DepthwiseConv2dNativeBackpropInput(input_sizes, filter, dy) -> dx
//     as Conv2DBackpropInput over the same groups (16*M dy channels -> 16 dx channels), B read
//     from Wbd transposed and flipped.
//   DepthwiseConv2dNativeBackpropFilter(x, filter_sizes, dy) -> dF [KH,KW,C,M]
//     dF[kh][kw][c][q] = sum_p img2col(x)[p][(kh, kw, c)] * dy[p][c*M + q]: the img2col kernel
//     writes img2col with each channel repeated M times, tap-major ([KH*KW][P][C*M]), then a
//     vector channel reduction (ops/channel.h) sums the products over p for each tap.
//   Conv2DBatchNormInference(x, filter, scale, offset, mean, variance[, bias][, residual]) -> y
//     the TF plugin's graph fusion of Conv2D -> BatchNormInference (a convolution followed by
//     a batch norm at inference, with the Relu after it when relu=true, the Relu6 when
//     relu6=true), f32: CANN's graph
//     engine folds such a batch norm into the convolution. Launches: the batch norm's fold
//     (a = rsqrt(variance + eps) * scale, shift; ops/fused.h), the folded filter
//     f16(W * a) (a derived tensor of filter, scale and variance: computed again only when
//     one of them changes), the activation cast, and the cube convolution of x and the folded
//     filter starting from shift (the bias table, mmad init 2) with ReLU in FIXPIPE.
//     Numerics: y = sum x16 * f16(W * a) + shift, where the unfused chain computes
//     (sum x16 * f16(W)) * a + shift: the filter is rounded to f16 after the scaling (the same
//     2^-11 relative rounding, on different values). Chips without a bias table whose tiles
//     leave L0C through the UB (coupled 910 / 310P cores) run the batch norm on each tile in
//     the UB, in the convolution's kernel (CubeConvSpec::bn_affine): y = conv + shift with
//     the folded filter (one group; grouped: conv * a + shift with the plain filter), the
//     activation (ReLU6 too) and one rounding to Tout. Elsewhere grouped convolutions keep
//     the batch norm as its own launch after the convolution (the bias needs one group and
//     the table), and so does relu6: FIXPIPE's ReLU clamps at 0 only, the batch norm's
//     vector launch clamps at 0 and 6.
//     With attribute R = 1 the last input is a residual (y's type and shape: the graph
//     fusion's Conv2D + BNInference + Add [+ ReLU]): y = act(round_Tout(conv * a + shift) +
//     residual), added in Tout. Through the UB where y's rows are whole blocks it is loaded
//     per tile and added in the epilogue (CubeConvSpec::residual); elsewhere one vector launch
//     adds it (and applies the activation, which the convolution then leaves out).
//
//   Conv2DBiasAdd(x, filter, bias [Cout]) -> y [N,OH,OW,Cout]
//     the TF plugin's graph fusion of Conv2D -> BiasAdd [-> Relu] (relu=true), f32 (Conv2D's
//     attributes, NHWC): CANN's convolution epilogue. One launch besides the operand casts: the
//     cube convolution starting from the bias (the bias table, mmad init 2) with ReLU in
//     FIXPIPE. Numerics: y = bias + sum x16 * f16(W) in fp32 (the unfused chain rounds the sum
//     to f32, then adds the bias: one rounding less here). Grouped convolutions and chips
//     without a bias table run the convolution, then the bias (and ReLU) as a vector launch in
//     place on y (what BiasAdd and Relu compute, in one pass). x and filter f16 (the TF
//     plugin's allow_mix_precision pass) with the bias f32: y f16, FIXPIPE rounding the fp32
//     sum once (the vector launch: widened, added in f32, rounded once).
//
// Dtypes: f16, bf16 (cube permitting), f32 under the precision modes as MatMul: inputs cast to
// f16 (RNE) by vector launches, fp32 accumulation in L0C, the output written as f32
// (allow_fp32_to_fp16) or rounded to f16 and widened (allow_mix_precision). must_keep_origin_
// dtype is rejected: the cube's fp32 L0B fractals cannot be built from these layouts (load2d
// transposes 16-bit fractals only).
//
// Numerics vs TF's CPU kernels: products of the (rounded) inputs are exact in fp32 and summed
// in fp32 in img2col k order (TF sums in double-free Eigen order); the result is rounded once.
// The shape operands (input_sizes, filter_sizes) are host tensors in TF: as for the data
// movement ops (docs/compiler.md), the compiler takes their values as an attribute of the same
// name (list(int)) or else from OpDesc::outputs[0]; `inputs` holds the data tensors, or TF's
// full input list (the shape tensor is then checked and ignored).
#include <algorithm>
#include <cstdlib>
#include <exception>
#include <limits>
#include <optional>
#include <string_view>

#include <fmt/format.h>

#include "adapter/compiler/ops/batchnorm.h"
#include "adapter/compiler/ops/channel.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/conv_slab.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/fused.h"
#include "adapter/compiler/ops/matmul.h"
#include "adapter/compiler/ops/reduce.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/transpose.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

using isa::Buf;
using isa::Dtype;
using isa::Opcode;
using isa::Pipe;

namespace {

constexpr int64_t kFold16 = 16;  // channels per cube k-block (C0 of f16)

// The cycles one more launch costs besides its work: the task's dispatch, completion and
// block start overheads (configs/chips).
double launch_overhead_cycles(const ChipConfig& cfg) {
  return static_cast<double>(cfg.task_dispatch_cycles() + cfg.task_done_cycles() +
                             cfg.task_block_start_cycles);
}

// CubeConvSpec::bn_stats_per_tile unless NPUSIM_FUSION_CONV_BN_REDUCE_TILES=0: a measuring
// switch (the statistics after a barrier of the cube cores instead), read at every compile.
// Unset, "0" or "1"; anything else is a CompileError naming op.
bool conv_stats_per_tile(const OpDesc& op) {
  const char* v = std::getenv("NPUSIM_FUSION_CONV_BN_REDUCE_TILES");
  if (!v || std::string_view(v) == "1") return true;
  if (std::string_view(v) == "0") return false;
  op.fail(fmt::format("NPUSIM_FUSION_CONV_BN_REDUCE_TILES='{}' is neither '0' nor '1'", v));
}

// Whether the width fold applies to a window of kw columns (padding pl / pr, dilation dw) over
// c channels and saves channel blocks.
bool width_fold_pays(int64_t c, int64_t kw, int64_t pl, int64_t pr, int64_t dw) {
  return c < kFold16 && kw >= 2 && pl == 0 && pr == 0 && dw == 1 &&
         (kw * c + kFold16 - 1) / kFold16 < kw;
}

// The view of x for a window one tap tall (or wide) with a stride (the filter gradient's and
// the convolution's): such a window reads only every sh-th row (sw-th column) of x, so x is
// viewed as the map of those rows (columns) with stride 1: rows x_row * sh elements apart
// (pixels x_pixel * sw), the same img2col matrix, column for column, without the slab loading
// the rows (pixels) no position reads. Then a window one tap tall of stride 1 without padding
// along H never crosses a row, so where the images follow each other row for row (x_image =
// h * x_row) the batch is one tall map of images * h rows: m tiles and chunks run across images
// instead of each image's positions rounded up to 16 (ResNet-50's 1x1 stride-2 layers: 49
// positions per image at 7x7). Needs every row of x in the view, so not with padding along the
// strided side. h, w, c: the spec's map fields (FilterGradSpec h, w, c; CubeConvSpec hs, ws,
// cs); a map left dense keeps x_row 0 (one copy per channel plane).
template <typename Spec>
void view_strided_rows(Spec& s, int64_t& h, int64_t& w, int64_t c) {
  if (s.x_row == 0) {  // dense NHWC
    s.x_pixel = c;
    s.x_row = w * c;
    s.x_image = h * w * c;
  }
  if (s.kh == 1 && s.sh > 1 && s.pt == 0 && s.pb == 0) {
    h = (h - 1) / s.sh + 1;
    s.x_row *= s.sh;
    s.sh = s.dh = 1;
  }
  if (s.kw == 1 && s.sw > 1 && s.pl == 0 && s.pr == 0) {
    w = (w - 1) / s.sw + 1;
    s.x_pixel *= s.sw;
    s.sw = s.dw = 1;
  }
  const int64_t rows = s.images * h;
  if (s.kh == 1 && s.sh == 1 && s.pt == 0 && s.pb == 0 && s.x_image == h * s.x_row &&
      rows <= field_max(isa::FieldKind::RU16)) {
    s.images = 1;
    h = rows;
    s.x_image = rows * s.x_row;
  }
  if (s.x_pixel == c && s.x_row == w * c && s.x_image == h * s.x_row)  // dense still
    s.x_pixel = s.x_row = s.x_image = 0;
}

// The convolution's strided view (view_strided_rows) where a 1x1-wide or -tall side has a
// stride: one group, x not viewed already (the width fold).
void view_strided_conv(CubeConvSpec& s) {
  const bool rows = s.kh == 1 && s.sh > 1 && s.pt == 0 && s.pb == 0;
  const bool cols = s.kw == 1 && s.sw > 1 && s.pl == 0 && s.pr == 0;
  if (s.groups == 1 && s.x_row == 0 && (rows || cols)) view_strided_rows(s, s.hs, s.ws, s.cs);
}

// The row view of x for a window one pixel wide of stride sw > 1 along W without padding along
// W (one group, W a multiple of sw): x [N,H,W,C] read as the dense map [N,H,W/sw,sw*C], whose
// pixel j holds x's pixels sw*j .. sw*j+sw-1 and whose first C channels are the window's pixel,
// the window then of stride 1 along W (its stride along H kept: the slab holds the rows between
// too). A slab is then one GM run per pixel at a uniform pitch, one nd2nz for all its pixels
// and planes (dense_slab_load's whole pixels), where the strided view's slab is a copy a pixel
// (or a copy a plane and row or column): CANN's load3d over whole rows of the feature map in L1
// with the stride in the window. It reads sw times the pixels (and the rows between where H is
// strided), so it is planned only where the chip prices the DMA's issue per copy and burst, and
// taken where its estimate is the lower. `variable` (NPUSIM_FILTER_GRAD_ROW_VIEW for the fused
// filter gradient, NPUSIM_CONV_ROW_VIEW for Conv2D and its fused forms, which take only 1):
// unset or empty, so; 0 never; 1 wherever it applies. Read at every compile; another value is
// a CompileError.
enum class RowView { kOff, kByEstimate, kForced };

RowView row_view_switch(const char* variable, const ChipConfig& cfg, const std::string& op) {
  const char* v = std::getenv(variable);
  const std::string value = v ? v : "";
  if (value == "0") return RowView::kOff;
  if (value == "1") return RowView::kForced;
  if (!value.empty())
    throw CompileError(fmt::format("{}: {}='{}' is none of '', '0', '1'", op, variable, value));
  return cfg.copy_issue_cycles > 0 || cfg.burst_cycles > 0 ? RowView::kByEstimate : RowView::kOff;
}

// The convolution's row view (see row_view_switch) where it applies: one group, x dense and
// not zero-inserted along W. Returns false (s unchanged) elsewhere.
bool view_conv_rows(CubeConvSpec& s) {
  if (s.groups != 1 || s.x_row != 0 || s.cs != s.cg_in || s.kw != 1 || s.sw < 2 || s.pl != 0 ||
      s.pr != 0 || s.up_w != 1 || s.ext_w != 0 || s.ws % s.sw != 0)
    return false;
  s.ws /= s.sw;
  s.cs *= s.sw;  // cg_in stays: a pixel's first C channels
  s.sw = s.dw = 1;
  return true;
}

// The groups of a convolution of x's c channels by filter f [KH,KW,Cin,Cout] (Conv2D and both
// gradients, TF's shape rule): c = G * Cin, G dividing Cout; group g convolves x's channels
// [g * Cin, (g + 1) * Cin) to y's [g * Cout/G, (g + 1) * Cout/G). Anything else is invalid,
// naming op and the channel counts.
int64_t conv_groups(const OpDesc& op, int64_t c, const std::vector<int64_t>& f) {
  const int64_t cin = f[2], cout = f[3];
  if (cin == 0 ? c != 0 : c % cin != 0)
    op.invalid(fmt::format("input channels {} are not a multiple of the filter's {}", c, cin));
  const int64_t groups = cin ? c / cin : 1;
  if (cout % groups != 0)
    op.invalid(fmt::format("output channels {} are not a multiple of the {} groups", cout, groups));
  return groups;
}

// The width fold for inputs of few channels (the first layer's 3): without padding or dilation
// along W, a KH x KW convolution of x [N,H,W,C] is the KH x 1 convolution of the view x'
// [N,H,W-KW+1,KW*C] with x'[n][h][w][kw*C + c] = x[n][h][w + kw][c] (the KW*C values from
// pixel w on are contiguous in NHWC: pixels C elements apart, overlapping) and the filter
// reshaped to [KH,1,KW*C,Cout] (HWIO rows kw*C + c: the same bytes). The cube then pads KW*C
// to 16 per tap instead of C to 16 per tap and column: for 7x7 over 3 channels 2 k-blocks per
// row of taps instead of 7 (3.5x fewer multiply-accumulates, and img2col copies), the effect
// of CANN's small-channel C04 layout. The sum runs in another k order (rounding only).
void fold_width(CubeConvSpec& s, const std::vector<int64_t>& x) {
  const int64_t c = s.cs;
  if (s.groups != 1 || !width_fold_pays(c, s.kw, s.pl, s.pr, s.dw)) return;
  s.x_pixel = c;
  s.x_row = x[2] * c;
  s.x_image = x[1] * x[2] * c;
  s.ws = x[2] - s.kw + 1;
  s.cs = s.cg_in = s.kw * c;
  s.kw = 1;
  s.b_tap = s.cs * s.cy;
}

// NPUSIM_CONV_STRIDE_PACK (read at every compile) for op: unset or empty, the stride-packed
// view (pack_stride) where it applies and the chip prices the DMA's issue
// (ChipConfig::copy_issue_cycles or burst_cycles > 0); "0", never (the width fold as before);
// "1", wherever it applies (a measuring switch). Anything else is a CompileError naming op.
bool stride_pack_wanted(const OpDesc& op, const ChipConfig& cfg) {
  const char* v = std::getenv("NPUSIM_CONV_STRIDE_PACK");
  const std::string_view value = v ? v : "";
  if (value.empty()) return cfg.copy_issue_cycles > 0 || cfg.burst_cycles > 0;
  if (value == "0" || value == "1") return value == "1";
  op.fail(fmt::format("NPUSIM_CONV_STRIDE_PACK='{}' is none of '', '0', '1'", value));
}

// The stride-packed view for inputs of few channels with a stride along W, where the width fold
// would apply (the first layer's 7x7 stride 2 over 3 channels): without padding or dilation
// along W, x [N,H,W,C]'s pixels taken sw at a time are one pixel of sw * C channels (contiguous
// in NHWC), the view x' [N,H,W',sw*C], x'[n][h][j][p*C + c] = x[n][h][j*sw + p][c], W' = OW +
// KW' - 1, KW' = ceil(KW / sw); the KH x KW convolution of stride (sh, sw) over x is the
// KH x KW' one of stride (sh, 1) over x', whose filter tap (kh, j) has rows p*C + c = the HWIO
// rows (kh, j*sw + p, c) where j*sw + p < KW, zero beyond (the last column of taps holds
// (KW - (KW' - 1) * sw) * C real rows: CubeConvSpec::b_last_col_rows).
// The width fold's view reads pixels C apart holding KW * C channels: they overlap in GM, so
// its slab is a GM run per pixel and plane (a burst each where the chip prices them: 420 k
// cycles for the 910b's 8x230x230x3 stem, 28 k without the DMA's issue). x' does not overlap:
// a slab row is one run, the slab one where W' * sw == W (then x' is x's own NHWC shape). The
// cost: the cube pads sw * C to 16 per tap, 4 k-blocks per row of taps for the 7x7 stride-2
// stem where the fold has 2 (and the plain map 7). A non-finite value in the pixel right of a
// window of odd width reaches that window's output through the zero weight (0 * inf): x' reads
// the pixel, TF's convolution does not.
// Applies (returns true) where stride_pack_wanted, a packed pixel is one channel block (sw * C
// <= 16: one k-block a tap, fewer than the plain map's KW a row of taps) and the view reads no
// pixel past a row of x. HWIO strides; a filter in kFilterLayoutN16 gets its own from the
// caller.
bool pack_stride(CubeConvSpec& s, const std::vector<int64_t>& x, const OpDesc& op,
                 const ChipConfig& cfg) {
  const int64_t c = s.cs, kw = s.kw, q = s.sw;
  if (s.groups != 1 || s.x_row != 0 || q < 2 || q * c > kFold16 || s.up_w != 1 ||
      !width_fold_pays(c, kw, s.pl, s.pr, s.dw))
    return false;
  const int64_t kw_packed = ceil_div(kw, q), ow = s.ow(), w_packed = ow + kw_packed - 1;
  if (kw_packed >= kw || w_packed * q > x[2] || !stride_pack_wanted(op, cfg)) return false;
  if (w_packed * q != x[2]) {  // a view of x: the pixels past W' * sw left out
    s.x_pixel = q * c;
    s.x_row = x[2] * c;
    s.x_image = x[1] * x[2] * c;
  }
  const int64_t last_col = (kw - (kw_packed - 1) * q) * c;
  s.ws = w_packed;
  s.cs = s.cg_in = q * c;
  s.kw = kw_packed;
  s.sw = 1;
  s.b_tap_row = kw * c * s.cy;  // HWIO: a row of taps kw taps of c rows
  s.b_tap = q * c * s.cy;       // a packed pixel's sw taps
  s.b_last_col_rows = last_col < q * c ? last_col : 0;
  return true;
}

// A convolution with a batch norm (Conv2DBatchNormInference, DepthwiseConv2dBatchNormInference):
// the filter (dtype dt) f32, x f32 or f16 (Tx: a fused producer's fp16 hand-off), y f32 or f16
// (Tout); returns y's type.
DataType batch_norm_conv_y_type(const OpDesc& op, DataType dt) {
  if (dt != DataType::F32)
    op.fail(fmt::format("filter is {}, only f32 is supported", data_type_name(dt)));
  const DataType xt = op.inputs[0].dtype;
  if ((xt != DataType::F32 && xt != DataType::F16) || op.attr_type("Tx").value_or(xt) != xt)
    op.fail(fmt::format("x is {} (attribute Tx {}): f32 or f16 expected", data_type_name(xt),
                        data_type_name(op.attr_type("Tx").value_or(xt))));
  const DataType y_type = op.attr_type("Tout").value_or(DataType::F32);
  if (y_type != DataType::F32 && y_type != DataType::F16)
    op.fail(fmt::format("attribute Tout = {}: f32 or f16 expected", data_type_name(y_type)));
  return y_type;
}

// Conv2DBatchNormInference's batch-norm inputs (scale, offset, mean, variance, bias follow).
constexpr int kBnScale = 2, kBnVariance = 5;

// A convolution with a batch norm's residual (attribute R = 1: the graph fusion's Conv2D +
// BNInference + Add, the input after the batch norm's): its input index, or -1 (R = 0). Checks
// the input count (6 + bias + R) and the residual against y (same shape, y's type Tout).
int batch_norm_conv_residual(const OpDesc& op, const TensorDesc& y) {
  const int64_t r = op.attr_int("R", 0);
  if (r != 0 && r != 1) op.invalid(fmt::format("attribute R = {}: 0 or 1 expected", r));
  const size_t n = op.inputs.size();
  if (n != 6 + static_cast<size_t>(r) && n != 7 + static_cast<size_t>(r))
    op.fail(
        fmt::format("takes x, filter, scale, offset, mean, variance[, bias]{}: {} or {} "
                    "inputs, {} given",
                    r ? ", residual" : "", 6 + r, 7 + r, n));
  if (!r) return -1;
  const TensorDesc& res = op.inputs[n - 1];
  if (res.shape != y.shape || res.dtype != y.dtype)
    op.invalid(
        fmt::format("residual (input {}) is {}, expected y's {}", n - 1, res.str(), y.str()));
  return static_cast<int>(n - 1);
}

// The cube types of an op of dtype dt under the precision mode.
struct CubeTypes {
  DataType cube = DataType::F16;  // what the cube multiplies
  Dtype fix_out = Dtype::F16;     // what FIXPIPE writes
  bool cast_inputs = false;       // f32 tensors cast to f16 first
  bool widen = false;             // FIXPIPE writes f16, a vector launch widens it to f32
};

CubeTypes cube_types(const CompileContext& ctx, DataType dt) {
  const OpDesc& op = ctx.op;
  CubeTypes t;
  switch (dt) {
    case DataType::F16:
      t.cube = DataType::F16;
      t.fix_out = Dtype::F16;
      break;
    case DataType::BF16:
      if (!ctx.cfg.cube_bf16)
        op.fail(fmt::format("bf16 is not supported by the cube of chip {}", ctx.cfg.name));
      t.cube = DataType::BF16;
      t.fix_out = Dtype::BF16;
      break;
    case DataType::F32:
      switch (ctx.precision) {
        case PrecisionMode::kKeepFp32:
          op.fail(
              fmt::format("precision mode {}: fp32 convolutions on the cube need fp32 L0B "
                          "fractals in the transposed layout, which load2d cannot build; "
                          "use allow_fp32_to_fp16",
                          precision_mode_name(ctx.precision)));
        case PrecisionMode::kAllowFp32ToFp16:
          t.cube = DataType::F16;
          t.fix_out = Dtype::F32;
          t.cast_inputs = true;
          break;
        case PrecisionMode::kAllowMixPrecision:
          t.cube = DataType::F16;
          t.fix_out = Dtype::F16;
          t.cast_inputs = t.widen = true;
          break;
      }
      break;
    default: op.fail(fmt::format("dtype {} is not supported (f16, bf16, f32)", data_type_name(dt)));
  }
  return t;
}

// All float inputs of the op share one dtype (and the T attribute).
DataType common_dtype(const OpDesc& op, std::initializer_list<size_t> inputs) {
  DataType dt = op.inputs[*inputs.begin()].dtype;
  for (size_t i : inputs)
    if (op.inputs[i].dtype != dt)
      op.fail(fmt::format("inputs have different dtypes ({} and {})", data_type_name(dt),
                          data_type_name(op.inputs[i].dtype)));
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the inputs' {}", data_type_name(*t),
                        data_type_name(dt)));
  return dt;
}

void require_rank4(const OpDesc& op, size_t i, const char* what) {
  if (op.inputs[i].shape.size() != 4)
    op.invalid(fmt::format("{} must have rank 4, got {}", what, shape_str(op.inputs[i].shape)));
}

// TF's shape operands (input_sizes, filter_sizes) as the compiler takes them: the values as an
// attribute of the same name (docs/compiler.md), or else the caller's expected output.
std::vector<int64_t> shape_attr(const OpDesc& op, const char* name) {
  std::vector<int64_t> v = op.attr_ints(name);
  if (v.empty() && !op.outputs.empty()) v = op.outputs[0].shape;
  if (v.empty())
    op.fail(
        fmt::format("the value of {} is needed at compile time: pass it as attribute {} "
                    "(or the expected output in OpDesc::outputs)",
                    name, name));
  if (v.size() != 4) op.invalid(fmt::format("{} = {} must have 4 entries", name, shape_str(v)));
  for (int64_t d : v)
    if (d < 0) op.invalid(fmt::format("{} = {} has a negative entry", name, shape_str(v)));
  return v;
}

// When TF's full input list is given, the shape tensor at `i` must be an int32/int64 [4].
void check_shape_tensor(const OpDesc& op, size_t i, const char* name) {
  const TensorDesc& t = op.inputs[i];
  if (t.shape != std::vector<int64_t>{4} || (t.dtype != DataType::S32 && t.dtype != DataType::S64))
    op.invalid(fmt::format("{} must be an int32[4] shape tensor, got {}", name, t.str()));
}

// A launch writing zeros to output 0 (a product over an empty k).
void append_zero_output(CompiledKernel& k, const OpDesc& op, const TensorDesc& out,
                        const ChipConfig& cfg) {
  StreamSpec spec;
  spec.kernel_name = fmt::format("Fill0_{}", data_type_name(out.dtype));
  spec.out_type = device_dtype(out.dtype);
  spec.out_shape = out.shape;
  spec.compute = [size = data_type_bytes(out.dtype)](KernelBuilder& b, const TileOperands& t) {
    vec_dup_bits(b, size, t.out, 0, *t.count);
  };
  k.launches.push_back(with_args(build_stream_kernel(op.str(), spec, cfg), {output_ref(0)}));
}

// The cube operands after the precision casts: ref of each float input as the cube reads it.
ArgRef cube_operand(CompiledKernel& k, const CompileContext& ctx, const CubeTypes& ct,
                    size_t input) {
  if (!ct.cast_inputs) return input_ref(static_cast<int>(input));
  return append_input_cast(k, ctx.op, static_cast<int>(input), ct.cube, ctx.cfg);
}

// Conv2DBNTrainingReduce's statistics (outputs 1 and 2): wanted by the op; done once the
// convolution's kernel computes them (its vector cores) and their epilogue is appended.
struct BnStats {
  bool wanted = false, done = false;
};

// The cube convolution's spec as append_cube_conv runs it (types, y's pitches) and the copy
// after it: through the UB, f16 rows that are not whole 32-byte blocks but are as f32 go
// through f32 (narrow_via_f32); groups whose channels are not whole blocks are padded to
// whole blocks in the rows (group_padded); either takes a strided copy launch after the kernel.
struct PreparedConv {
  CubeConvSpec spec;
  bool narrow_via_f32 = false, group_padded = false;
};

PreparedConv prepare_cube_conv(const CompileContext& ctx, const CubeTypes& ct, CubeConvSpec spec) {
  spec.in_type = device_dtype(ct.cube);
  spec.out_type = ct.fix_out;
  const bool via_ub = cube_store_via_ub(ctx.cfg, cube_core(ctx.cfg, ctx.op.str()), ctx.op.str());
  // Through the UB, f16 rows that are not whole blocks (24 channels: 48 bytes) but are as f32
  // (96 bytes): the kernel writes f32 y densely into the workspace and a dense cast rounds it
  // to f16 (RNE, the one rounding the kernel would do), rather than padded f16 rows and the
  // strided packing copy, whose rows of a block and a half cost a burst each.
  // Likewise groups of channels that are whole blocks as f32 only (8 channels: 16 bytes).
  const auto whole_blocks = [&](int64_t bytes_per_channel) {
    return (spec.cy * bytes_per_channel) % layout::kBlockBytes == 0 &&
           (spec.groups == 1 || (spec.cg_out * bytes_per_channel) % layout::kBlockBytes == 0);
  };
  // With the batch norm in the epilogue such rows go packed where every tile is whole blocks
  // (CubeConvSpec::y_packed): the epilogue packs and stores each tile as one run, no cast.
  spec.y_packed = via_ub && !ct.widen && conv_y_packable(spec);
  PreparedConv p;
  p.narrow_via_f32 = via_ub && !ct.widen && !spec.y_packed && spec.out_type == Dtype::F16 &&
                     !whole_blocks(2) && whole_blocks(4);
  if (p.narrow_via_f32) spec.out_type = Dtype::F32;
  const int64_t osz = isa::dtype_size(spec.out_type);
  if (via_ub && !spec.y_packed) spec.y_pitch = round_up(spec.cy, layout::kBlockBytes / osz);
  // Through the UB, groups whose channels are not whole blocks: each group's channels padded to
  // whole blocks in the rows (the packing copy after the kernel drops the padding).
  p.group_padded = via_ub && spec.groups > 1 && spec.cy == spec.groups * spec.cg_out &&
                   (spec.cg_out * osz) % layout::kBlockBytes != 0;
  if (p.group_padded) {
    spec.y_group_pitch = round_up(spec.cg_out, layout::kBlockBytes / osz);
    spec.y_pitch = spec.groups * spec.y_group_pitch;
  }
  p.spec = spec;
  return p;
}

// The spec (p's, its strided view or its block-diagonal groups merged) and tiling that
// append_cube_conv runs: the planner's lowest estimate; CompileError where nothing plans.
std::pair<CubeConvSpec, CubeConvTiling> plan_prepared_conv(const CompileContext& ctx,
                                                           const PreparedConv& p,
                                                           int64_t diagonal_merge_max) {
  // The tiling of sp, or of its strided view where the planner estimates that faster (sp then
  // the view).
  // The row view (view_conv_rows) only where NPUSIM_CONV_ROW_VIEW=1 forces it: the planner
  // prices its whole-pixel slab as misses at the GM path's rate, 1.6 to 1.9x what ResNet-50's
  // strided 1x1 layers run (docs/graph_engine.md, "The strided filter gradients' row view"), so
  // by estimate it would never be taken.
  const auto plan_or_view = [&](CubeConvSpec& sp) {
    CubeConvSpec rows = sp;
    if (view_conv_rows(rows) && row_view_switch("NPUSIM_CONV_ROW_VIEW", ctx.cfg, ctx.op.str()) ==
                                    RowView::kForced) {
      sp = rows;
      return plan_cube_conv(sp, ctx.cfg, ctx.op.str());
    }
    CubeConvTiling best = plan_cube_conv(sp, ctx.cfg, ctx.op.str());
    CubeConvSpec viewed = sp;
    view_strided_conv(viewed);
    if (viewed.x_row != 0 && sp.x_row == 0 && (!sp.y_packed || conv_y_packable(viewed))) {
      const CubeConvTiling tv = plan_cube_conv(viewed, ctx.cfg, ctx.op.str());
      if (tv.est_cycles < best.est_cycles) {
        sp = viewed;
        best = tv;
      }
    }
    return best;
  };
  const CubeConvSpec& one_group_per_step = p.spec;
  if (p.group_padded || diagonal_merge_max <= 1) {
    CubeConvSpec spec = p.spec;
    const CubeConvTiling t = plan_or_view(spec);
    return {spec, t};
  }
  // Block-diagonal groups of one 16-channel block (the depthwise convolutions, packed narrow
  // groups): `per` of them to a kernel step (merge_diagonal_groups) for per = 1 ..
  // diagonal_merge_max; the fewest per step whose estimate is within kPlanTieBand of the
  // lowest (group pitches unchanged: each group's rows whole blocks). A count that does not
  // plan (CompileError) is left out; where none plans, the first count's error stands.
  std::vector<std::pair<CubeConvSpec, CubeConvTiling>> per_step;
  std::exception_ptr first_error;
  for (int64_t per = 1; per <= std::min(diagonal_merge_max, one_group_per_step.groups); ++per) {
    try {
      CubeConvSpec sp = per == 1 ? one_group_per_step
                                 : merge_diagonal_groups(one_group_per_step, per, ctx.op.str());
      const CubeConvTiling tp = plan_or_view(sp);
      per_step.emplace_back(sp, tp);
    } catch (const CompileError&) {
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (per_step.empty()) std::rethrow_exception(first_error);
  double lowest = per_step.front().second.est_cycles;
  for (const auto& [sp, tp] : per_step) lowest = std::min(lowest, tp.est_cycles);
  for (const auto& [sp, tp] : per_step)
    if (tp.est_cycles <= lowest * (1 + kPlanTieBand)) return {sp, tp};
  return per_step.front();  // (not reached: the lowest is within the band)
}

// Runs the cube convolution writing output 0 (through a workspace f16 copy when widened).
// With spec.bias, `bias` is its f32 [cy] workspace tensor. On chips without an l0c->gm path
// the output leaves the cube through the UB in whole 32-byte blocks: when a row of y (cy
// channels) is not whole blocks, the kernel writes rows padded to blocks into the workspace
// and the strided copy (with the widening, if any) packs them into the output
// (prepare_cube_conv).
// With stats->wanted, on split chips where the kernel writes y densely in whole 32-byte
// pixels, the kernel also sums y's channels (CubeConvSpec::bn_stats: sum and sum of squares
// of y as FIXPIPE wrote it, before any widening, which is exact, and BNTrainingReduce's
// epilogue adding the vector cores' partials as its last phase); else stats->done stays false.
// With y_f32, the cube writes y as f32 to that workspace tensor instead of output 0 (ct.fix_out
// F32, no widening: a vector pass after it reads y and rounds it once to the output's type).
void append_cube_conv(CompiledKernel& k, const CompileContext& ctx, const CubeTypes& ct,
                      const CubeConvSpec& unprepared, const ArgRef& x, const ArgRef& w,
                      const ArgRef* bias = nullptr, BnStats* stats = nullptr,
                      const ArgRef* y_f32 = nullptr, const BatchNormFold* bn = nullptr,
                      const ArgRef* residual = nullptr, int64_t diagonal_merge_max = 1) {
  const TensorDesc& out = k.outputs[0];
  if (y_f32 && (ct.fix_out != Dtype::F32 || ct.widen))
    ctx.op.fail("internal: the convolution's f32 workspace output needs FIXPIPE to write f32");
  const ArgRef final_y = y_f32 ? *y_f32 : output_ref(0);
  const DataType final_type = y_f32 ? DataType::F32 : out.dtype;
  const PreparedConv prepared = prepare_cube_conv(ctx, ct, unprepared);
  const bool narrow_via_f32 = prepared.narrow_via_f32, group_padded = prepared.group_padded;
  auto [spec, t] = plan_prepared_conv(ctx, prepared, diagonal_merge_max);
  const int64_t osz = isa::dtype_size(spec.out_type);
  const int64_t rows = out.num_elements() / spec.cy;
  // (A strided y is the output itself: its pitch places its rows, the rest is not y's.)
  const bool padded = spec.pitch() != spec.cy && spec.y_strided.run_rows == 0;
  ArgRef y = final_y;
  if (ct.widen || padded || narrow_via_f32)
    y = workspace_take(k, static_cast<uint64_t>(rows * spec.pitch() * osz));
  std::vector<ArgRef> args = {x, w, y};
  if (spec.bias) args.push_back(*bias);
  if (spec.bn_affine) {
    if (!bn) ctx.op.fail("internal: the convolution's batch-norm epilogue needs its fold");
    args.push_back(bn->a);
    args.push_back(bn->shift);
  }
  if (spec.residual) {
    if (!residual || padded || !spec.bn_affine)
      ctx.op.fail(
          "internal: the convolution's residual epilogue needs its input, a dense y and "
          "the batch norm in the epilogue");
    args.push_back(*residual);
  }
  spec.bn_stats = stats && stats->wanted && ctx.cfg.split && !padded &&
                  !cube_store_via_ub(ctx.cfg, cube_core(ctx.cfg, ctx.op.str()), ctx.op.str()) &&
                  (spec.cy * osz) % layout::kBlockBytes == 0;
  ArgRef sums, squares;
  if (spec.bn_stats) spec.bn_stats_per_tile = conv_stats_per_tile(ctx.op);
  if (spec.bn_stats)
    spec.bn_stats_one_to_one_by_default = mix_one_to_one_asked(ctx.op, OneToOneMix::bn_reduce);
  if (spec.bn_stats) spec.name += "_BNTrainingReduce";
  int blocks = 0;
  Launch conv = build_cube_conv(spec, t, ctx.cfg, ctx.op.str(), &blocks);
  if (spec.bn_stats) {
    const uint64_t bytes = static_cast<uint64_t>(blocks * spec.cy) * 4;
    sums = workspace_take(k, bytes);
    squares = workspace_take(k, bytes);
    args.push_back(squares);        // "partials": the sums of squares (the channel sum's kind)
    args.push_back(sums);           // "partials2": the plain sums
    args.push_back(output_ref(1));  // sum and square_sum, added by the kernel's epilogue
    args.push_back(output_ref(2));
    stats->done = true;
  }
  k.launches.push_back(with_args(std::move(conv), args));
  if (narrow_via_f32)
    append_strided_copy(k, ctx.op, y, final_y, 1, out.num_elements(), out.num_elements(),
                        DataType::F32, final_type, ctx.cfg);
  else if (group_padded)  // each row's groups: rows x groups runs of cg_out, group pitch apart
    append_strided_copy(k, ctx.op, y, final_y, rows * spec.groups, spec.cg_out, spec.group_pitch(),
                        ct.widen ? DataType::F16 : final_type, final_type, ctx.cfg);
  else if (padded)
    append_strided_copy(k, ctx.op, y, final_y, rows, spec.cy, spec.pitch(),
                        ct.widen ? DataType::F16 : final_type, final_type, ctx.cfg);
  else if (ct.widen)
    append_strided_copy(k, ctx.op, y, final_y, 1, out.num_elements(), out.num_elements(),
                        DataType::F16, final_type, ctx.cfg);
}

// The convolution (x, w as the cube reads them), then the batch norm's vector pass `fold` with
// the op's activation into output 0 (y_type): where the cube cannot add the shift itself. An
// f16 y is rounded once, by the pass, from the cube's f32 result in the workspace.
// Whether the batch norm of the convolution s runs in its kernel's way out through the UB
// (CubeConvSpec::bn_affine): where tiles leave L0C through the UB (coupled cores: the L0C -> UB
// path passes the vector unit), as CANN's fused Conv2D + BNInference (+ ReLU6) on these cores:
// no f32 y in GM, one launch. Its tables are read in whole f32 blocks per group, so a group's
// channels are whole blocks.
bool batch_norm_in_epilogue(const CompileContext& ctx, const CubeConvSpec& s) {
  const CoreKindConfig& core = cube_core(ctx.cfg, ctx.op.str());
  return cube_store_via_ub(ctx.cfg, core, ctx.op.str()) && (s.groups == 1 || s.cg_out % 8 == 0);
}

// a_in_filter: w is the folded filter (append_folded_filter), the epilogue adds the shift only
// (batch_norm_in_epilogue must hold). residual_input >= 0: that input is added to y (rounded to
// y_type) before the activation, in the epilogue where y's rows are whole 32-byte blocks
// (CubeConvSpec::residual), else by a launch of its own after the batch norm
// (append_residual_add).
void append_conv_then_batch_norm(CompiledKernel& k, const CompileContext& ctx, CubeTypes ct,
                                 const CubeConvSpec& s, const ArgRef& x, const ArgRef& w,
                                 const BatchNormFold& fold, DataType y_type,
                                 bool a_in_filter = false, int residual_input = -1,
                                 int64_t diagonal_merge_max = 1) {
  const Activation act = activation_attr(ctx.op);
  const std::vector<int64_t>& shape = k.outputs[0].shape;
  const bool residual = residual_input >= 0;
  if (batch_norm_in_epilogue(ctx, s)) {
    CubeConvSpec e = s;
    e.bn_affine = true;
    e.bn_a_in_filter = a_in_filter;
    // The residual in the kernel where y is written dense (the UB path pads other rows) or
    // packed (append_cube_conv).
    CubeConvSpec packed = e;
    packed.out_type = device_dtype(y_type);
    e.residual = residual && ((s.cy * data_type_bytes(y_type)) % layout::kBlockBytes == 0 ||
                              conv_y_packable(packed));
    e.act = residual && !e.residual ? Activation::kNone : act;
    e.name = fmt::format("{}{}{}_{}", ctx.op.type, e.residual ? "Add" : "", activation_name(e.act),
                         data_type_name(y_type));
    ct.fix_out = device_dtype(y_type);
    ct.widen = false;
    const ArgRef r = residual ? input_ref(residual_input) : ArgRef{};
    append_cube_conv(k, ctx, ct, e, x, w, nullptr, nullptr, nullptr, &fold, &r, diagonal_merge_max);
    if (residual && !e.residual) append_residual_add(k, ctx, residual_input, act);
    return;
  }
  if (a_in_filter) ctx.op.fail("internal: a folded filter needs the batch norm in the epilogue");
  const Activation bn_act = residual ? Activation::kNone : act;
  if (y_type != DataType::F16) {
    append_cube_conv(k, ctx, ct, s, x, w, nullptr, nullptr, nullptr, nullptr, nullptr,
                     diagonal_merge_max);
    append_batch_norm_apply(k, ctx, output_ref(0), shape, fold, bn_act, device_dtype(y_type),
                            device_dtype(y_type));
  } else {
    ct.fix_out = Dtype::F32;
    ct.widen = false;
    const ArgRef y32 = workspace_take(k, static_cast<uint64_t>(k.outputs[0].num_elements()) * 4);
    append_cube_conv(k, ctx, ct, s, x, w, nullptr, nullptr, &y32, nullptr, nullptr,
                     diagonal_merge_max);
    append_batch_norm_apply(k, ctx, y32, shape, fold, bn_act, Dtype::F32, Dtype::F16);
  }
  if (residual) append_residual_add(k, ctx, residual_input, act);
}

// The window geometry of the forward op whose input is [N,H,W,*] and filter KH x KW; checks
// the forward output size against [OH, OW] when given (the gradients' dy).
ConvWindow forward_window(const OpDesc& op, const std::vector<int64_t>& in, int64_t kh, int64_t kw,
                          const std::vector<int64_t>* dy) {
  ConvWindow cw = conv_window(op, in[1], in[2], kh, kw, false);
  if (dy && ((*dy)[1] != cw.h.out || (*dy)[2] != cw.w.out))
    op.invalid(
        fmt::format("out_backprop {} does not match the forward output {}x{} of input {} "
                    "with a {}x{} filter",
                    shape_str(*dy), cw.h.out, cw.w.out, shape_str(in), kh, kw));
  return cw;
}

void set_window(CubeConvSpec& s, const ConvWindow& cw) {
  s.kh = cw.h.k;
  s.kw = cw.w.k;
  s.sh = cw.h.s;
  s.sw = cw.w.s;
  s.dh = cw.h.d;
  s.dw = cw.w.d;
  s.pt = cw.h.before;
  s.pb = cw.h.after;
  s.pl = cw.w.before;
  s.pr = cw.w.after;
}

// The input-gradient convolution of a forward window: dy with zeros inserted (stride - 1),
// padded so that the output has the forward input's size (see the file comment).
void set_transposed_window(CubeConvSpec& s, const ConvWindow& cw, const OpDesc& op) {
  auto dim = [&](const WindowDim& d, int64_t& up, int64_t& ext, int64_t& before, int64_t& after) {
    const int64_t ek = d.extent();
    if (d.before > ek - 1 || d.after > ek - 1)
      op.fail(
          fmt::format("padding {}/{} larger than the dilated window {} is not supported for "
                      "the input gradient",
                      d.before, d.after, ek));
    const int64_t vin = (d.out - 1) * d.s + 1;
    up = d.s;
    before = ek - 1 - d.before;
    after = d.in - vin + d.before;  // so that the output has d.in elements
    ext = std::max<int64_t>(0, after - (ek - 1));
    after -= ext;
  };
  s.kh = cw.h.k;
  s.kw = cw.w.k;
  s.sh = s.sw = 1;
  s.dh = cw.h.d;
  s.dw = cw.w.d;
  dim(cw.h, s.up_h, s.ext_h, s.pt, s.pb);
  dim(cw.w, s.up_w, s.ext_w, s.pl, s.pr);
}

// The filter with a batch norm's factor a (f32 [cout]) folded in, as the cube reads it:
// cube_type(W[kh][kw][ci][co] * a[co]) (one f32 multiply, then the precision cast), a derived
// tensor of the filter, scale and variance (a depends on those alone). A depthwise filter
// [kh][kw][c][m] passes its view [kh][kw][c * m] (output channel c * m + j), the layout kept.
ArgRef append_folded_filter(CompiledKernel& k, const CompileContext& ctx, const CubeTypes& ct,
                            const ArgRef& a, std::vector<int64_t> view = {}) {
  const TensorDesc& f = ctx.op.inputs[1];
  const std::vector<int64_t> shape = view.empty() ? f.shape : std::move(view);
  const int64_t cout = shape.back();
  const uint64_t bytes = static_cast<uint64_t>(f.num_elements()) * data_type_bytes(ct.cube);
  const ArgRef ws = workspace_take(k, bytes);
  const ArgRef derived{ArgRef::Kind::kDerived, static_cast<int>(k.derived.size()), ws.value};
  k.derived.push_back(
      DerivedTensor{{1, kBnScale, kBnVariance},
                    k.launches.size(),
                    bytes,
                    fmt::format("{} filter x batch-norm scale", data_type_name(ct.cube))});
  StreamSpec spec;
  spec.kernel_name = fmt::format("FoldFilter_f32_{}", data_type_name(ct.cube));
  spec.inputs = {StreamInput{Dtype::F32, broadcast_view(shape, shape), shape},
                 StreamInput{Dtype::F32, broadcast_view({cout}, shape), {cout}}};
  spec.out_type = device_dtype(ct.cube);
  spec.out_shape = shape;
  spec.temps = {TempSpec{"W * a (f32)", 4, 0}};
  spec.compute = [to = device_dtype(ct.cube)](KernelBuilder& b, const TileOperands& t) {
    vec_binary(b, Opcode::op_vmul, Dtype::F32, t.temp[0], t.in[0], t.in[1], *t.count);
    vec_convert(b, to, Dtype::F32, t.out, t.temp[0], RoundMode::kRint, *t.count);
  };
  Launch l = build_stream_kernel(ctx.op.str(), spec, ctx.cfg);
  l.summary = fmt::format("filter {} x a -> {} derived at workspace {} ({})", f.str(),
                          data_type_name(ct.cube), ws.value, l.summary);
  l.args = {input_ref(1), a, derived};
  k.launches.push_back(std::move(l));
  return derived;
}

// ---- filters in blocks of 16 output channels ----

// How a convolution reads its filter `f` [KH,KW,Cin,Cout] of G groups that the op's attribute
// filter_layout names kFilterLayoutN16 (conv.h), Cout / G output channels a group:
//   kHwio: as HWIO, with no copy: Cout is not a multiple of 16, so the layout is HWIO (conv.h);
//   kBlocked: in place, blocked (CubeConvSpec::b_nblock): one group, or groups of whole blocks
//     of 16 output channels (group g's columns are blocks [g * Cout/G / 16, ...));
//   kCopied: groups that split a block (Cout/G not a multiple of 16: a group's columns start
//     inside a block, and the narrow groups' block-diagonal packing reads HWIO) read an HWIO
//     copy of it (append_filter_from_n16).
enum class FilterRead { kHwio, kBlocked, kCopied };
FilterRead n16_filter_read(const std::vector<int64_t>& f, int64_t groups) {
  if (f[3] % kFold16 != 0) return FilterRead::kHwio;
  return groups == 1 || (f[3] / groups) % kFold16 == 0 ? FilterRead::kBlocked : FilterRead::kCopied;
}

// Filter input `input` (16-bit, kFilterLayoutN16, Cout a multiple of 16) copied to HWIO: the
// transpose [Cout/16][KH*KW*Cin][16] -> [KH*KW*Cin][Cout/16][16] of whole 32-byte rows (the
// cast's n16_transposed in reverse), one launch into a derived tensor of the input (a caller
// keeps it while the filter is unchanged). Returns the ArgRef that later launches read it by.
ArgRef append_filter_from_n16(CompiledKernel& k, const CompileContext& ctx, int input) {
  const TensorDesc& f = ctx.op.inputs[static_cast<size_t>(input)];
  const int64_t rows = f.shape[0] * f.shape[1] * f.shape[2], blocks = f.shape[3] / kFold16;
  LaunchPlan plan({f});
  append_transpose(plan, ctx.op.str(), ctx.cfg, f.dtype, {blocks, rows, kFold16}, {1, 0, 2},
                   LaunchPlan::input(0), LaunchPlan::output(0));
  CompiledKernel copy = std::move(plan).finish();
  if (copy.launches.size() != 1 || copy.workspace_bytes != 0)
    ctx.op.fail(fmt::format("the {} filter {} -> HWIO took {} launches and {} workspace bytes, "
                            "not one launch of its own",
                            kFilterLayoutN16, f.str(), copy.launches.size(),
                            copy.workspace_bytes));
  const uint64_t bytes = static_cast<uint64_t>(f.num_elements()) * data_type_bytes(f.dtype);
  const ArgRef ws = workspace_take(k, bytes);
  const ArgRef hwio{ArgRef::Kind::kDerived, static_cast<int>(k.derived.size()), ws.value};
  k.derived.push_back(DerivedTensor{{input}, k.launches.size(), bytes,
                                    fmt::format("{} filter as HWIO", kFilterLayoutN16)});
  Launch l = std::move(copy.launches[0]);
  for (ArgRef& a : l.args)
    a = a.kind == ArgRef::Kind::kInput ? input_ref(input) : hwio;
  l.summary = fmt::format("filter {} {} -> HWIO derived at workspace {} ({})", f.str(),
                          kFilterLayoutN16, ws.value, l.summary);
  k.launches.push_back(std::move(l));
  return hwio;
}

// ---- block-diagonal filters ----

// Groups narrow enough to share a 16-channel block: G groups of cin input channels (16 % cin
// == 0) and m output channels each, per = 16 / cin of them to a block (the last block may hold
// fewer: G need not be a multiple of per). The depthwise convolutions: cin = 1, G = C.
struct BlockDiagShape {
  int64_t cin = 1, m = 1, groups = 1;
  int64_t per() const { return kFold16 / cin; }
  int64_t channels() const { return groups * cin; }  // x's C
  int64_t cout() const { return groups * m; }
  int64_t blocks() const { return (channels() + kFold16 - 1) / kFold16; }
  int64_t block_cols() const { return per() * m; }  // one block's columns (output channels)
};

// The block-diagonal filter of narrow groups (BlockDiagShape), written by the vector cores:
//   Wbd[g][tap][j * cin + ci][j * m + q] = filter[tap][ci][(per * g + j) * m + q]
// for group per * g + j < G (x's channel 16g + j * cin + ci < C), 0 elsewhere: block g (g <
// ceil(C / 16)) holds groups [per * g, per * g + per), each its cin rows by m columns on the
// diagonal, with filter [taps][cin][cout] (16-bit elements, cout = G * m). The depthwise
// filter [taps][C][M] is the case cin = 1 (cout = C * M, per = 16).
// One item per (g, tap): each of the cin filter rows' per * m values of the block's groups is
// loaded (one row of the UB buffer each), the 16 x per * m block is zeroed and row j * cin + ci
// receives lanes [j * m, j * m + m) of value row ci by a masked vcopy (source and destination
// lanes coincide: every row is per * m elements, whole blocks).
Launch build_blockdiag(Dtype type, int64_t taps, const BlockDiagShape& d, const ChipConfig& cfg,
                       const std::string& op) {
  KernelBuilder b(
      fmt::format("{}BlockDiag_{}", d.cin == 1 ? "Depthwise" : "Grouped", isa::dtype_name(type)),
      op, cfg);
  const isa::CoreKind kind = b.vector_core_kind();
  const CoreKindConfig& core = *cfg.core_kind(kind);
  const int64_t cin = d.cin, m = d.m, per = d.per(), c = d.channels(), cols = d.block_cols();
  const int64_t groups = d.blocks(), items = groups * taps;
  const int64_t per_block = (items + core.count - 1) / core.count;
  const int block_dim = static_cast<int>((items + per_block - 1) / per_block);
  constexpr int64_t kLanes16 = 128;  // 16-bit lanes of one repeat
  b.begin_section(kind);
  const uint64_t vbytes = round_up(static_cast<uint64_t>(32 * m), 256);  // cin rows of cols
  const uint64_t v = b.alloc(Buf::UB, vbytes, "filter values of the group");
  const uint64_t t = b.alloc(Buf::UB, static_cast<uint64_t>(32 * cols) + 256, "block");
  b.declare_arg("filter", type, {taps, cin == 1 ? c : cin, cin == 1 ? m : d.cout()});
  b.declare_arg("wbd", type, {groups, taps, 16, cols});
  const int v_free = b.flag(Pipe::V, Pipe::MTE2, "values read");
  const int v_ready = b.flag(Pipe::MTE2, Pipe::V, "values loaded");
  const int t_ready = b.flag(Pipe::V, Pipe::MTE3, "block built");
  const int t_free = b.flag(Pipe::MTE3, Pipe::V, "block stored");
  b.set_flag(Pipe::V, Pipe::MTE2, v_free);
  b.set_flag(Pipe::MTE3, Pipe::V, t_free);
  Reg item = b.reg("item"), end = b.reg("end item");
  emit_block_range(b, item, end, per_block, items);
  b.for_range(item, item, end, 1, [&] {
    Reg valid = b.reg("channels of the group"), src = b.reg("source"), tmp = b.reg("temp");
    // g = item / taps, tap = item % taps; valid = min(16, C - 16g)
    b.div(valid, item, taps);
    b.mul(valid, valid, 16);
    b.movi(tmp, c);
    b.sub(valid, tmp, valid);
    b.min(valid, valid, 16);
    // src = filter + (tap * C + per * g) * m * 2: row 0 of the block's first group
    b.rem(src, item, taps);
    b.mul(src, src, c);
    b.div(tmp, item, taps);
    b.mul(tmp, tmp, per);
    b.add(src, src, tmp);
    b.mul(src, src, m * 2);
    {
      Reg f = b.load_arg("filter");
      b.add(src, src, f);
    }
    // blocks of the valid values of a row: valid / cin groups of m
    b.mul(tmp, valid, m);
    if (cin > 1) b.shr(tmp, tmp, ceil_log2(cin), "values of the valid groups");
    b.add(tmp, tmp, 15);
    b.shr(tmp, tmp, 4, "blocks of the valid values");
    b.wait_flag(Pipe::V, Pipe::MTE2, v_free);
    for (int64_t ci = 0; ci < cin; ++ci) {
      if (ci > 0) b.add(src, src, d.cout() * 2, "the filter's next row");
      Reg dst = b.reg_imm("values", static_cast<int64_t>(v) + ci * cols * 2);
      b.emit(Opcode::op_copy_gm2ub, {dst, src, 1, tmp, 0, 0});
    }
    b.set_flag(Pipe::MTE2, Pipe::V, v_ready);
    b.wait_flag(Pipe::MTE2, Pipe::V, v_ready);
    b.wait_flag(Pipe::MTE3, Pipe::V, t_free);
    vec_dup_bits(b, 2, t, 0, 16 * cols);
    for (int64_t c0 = 0; c0 < 16; ++c0) {
      const int64_t j = c0 / cin, ci = c0 % cin;
      b.if_(ge(valid, c0 + 1), [&] {
        const int64_t e0 = j * m, e1 = j * m + m;
        for (int64_t r = e0 / kLanes16; r * kLanes16 < e1; ++r) {
          const int64_t lo = std::max(e0, r * kLanes16) - r * kLanes16;
          const int64_t hi = std::min(e1, (r + 1) * kLanes16) - r * kLanes16;
          auto bits = [](int64_t a, int64_t z) {  // lanes [a, z) of 64
            const uint64_t top = z >= 64 ? ~uint64_t{0} : (uint64_t{1} << z) - 1;
            return static_cast<int64_t>(top & ~((uint64_t{1} << a) - 1));
          };
          Reg mlo = b.reg_imm("mask lo", lo < 64 ? bits(lo, std::min<int64_t>(hi, 64)) : 0);
          Reg mhi =
              b.reg_imm("mask hi", hi > 64 ? bits(std::max<int64_t>(lo, 64) - 64, hi - 64) : 0);
          b.emit(Opcode::op_set_mask, {mhi, mlo});
          b.emit(Opcode::op_vcopy,
                 {Dtype::U16, static_cast<int64_t>(t) + c0 * 2 * cols + r * 256,
                  static_cast<int64_t>(v) + ci * 2 * cols + r * 256, 1, 1, 1, 8, 8},
                 fmt::format("row {}: its {} values on the diagonal block", c0, m));
        }
      });
    }
    b.set_flag(Pipe::V, Pipe::MTE2, v_free);
    b.set_flag(Pipe::V, Pipe::MTE3, t_ready);
    b.wait_flag(Pipe::V, Pipe::MTE3, t_ready);
    {
      Reg dst = b.load_arg("wbd"), s = b.reg_imm("block", static_cast<int64_t>(t));
      b.mul(tmp, item, 32 * cols);
      b.add(dst, dst, tmp);
      b.emit(Opcode::op_copy_ub2gm, {dst, s, 1, cols, 0, 0});
    }
    b.set_flag(Pipe::MTE3, Pipe::V, t_free);
  });
  b.wait_flag(Pipe::V, Pipe::MTE2, v_free);
  b.wait_flag(Pipe::MTE3, Pipe::V, t_free);
  b.end();
  Launch l;
  l.kernel = b.finish();
  l.block_dim = block_dim;
  l.summary = cin == 1 ? fmt::format(
                             "block-diagonal depthwise filter: {} groups x {} taps, "
                             "multiplier {}",
                             groups, taps, m)
                       : fmt::format(
                             "block-diagonal grouped filter: {} groups of {} -> {} "
                             "channels, {} per 16-channel block, {} blocks x {} taps",
                             d.groups, cin, m, per, groups, taps);
  return l;
}

struct DepthwiseShapes {
  int64_t c = 0, m = 0, groups = 0;
};

DepthwiseShapes depthwise_shapes(const OpDesc& op, const std::vector<int64_t>& f, int64_t c) {
  if (f[2] != c)
    op.invalid(fmt::format("filter {} does not match the input's {} channels", shape_str(f), c));
  if (f[3] > 16)
    op.fail(
        fmt::format("channel multiplier {} > 16 is not supported (one 16 x 16M block per "
                    "group must fit one n tile)",
                    f[3]));
  return DepthwiseShapes{c, f[3], (c + 15) / 16};
}

// The cycles of build_blockdiag's launch (16-bit elements), # estimate: its task overheads
// (launch_overhead_cycles), then each vector core's items one after another, each waiting for
// its filter rows from GM (a first read: an L2 miss, memory.hbm.latency_cycles, plus the
// gm->ub path's latency) while the vector work and the store of the item before overlap it,
// at least the filter read and the blocks written at HBM's rate. Measured on the 910b:
// 4,534 cycles for 18 items (3 groups of 8 -> 8, 3x3), 6,380 for 207 (46 groups); this
// gives 3,807 and 5,935.
double blockdiag_cycles(int64_t taps, const BlockDiagShape& d, const ChipConfig& cfg,
                        const std::string& op) {
  const CoreKindConfig* vec = cfg.core_kind(isa::CoreKind::AIV);  // coupled: the cube's cores
  const int64_t cores = vec ? vec->count : cube_core(cfg, op).count;
  const int64_t items = d.blocks() * taps;
  const double item = cfg.hbm_latency_cycles + cfg.path_latency(Buf::GM, Buf::UB);
  const double bytes = static_cast<double>(
      (d.blocks() * taps * kFold16 * d.block_cols() + taps * d.cin * d.cout()) * 2);
  return launch_overhead_cycles(cfg) + std::max(static_cast<double>(ceil_div(items, cores)) * item,
                                                bytes / cfg.hbm_bytes_per_cycle());
}

// d's block-diagonal filter from w, the filter [taps][cin][cout] as the cube reads it (cube
// type; a depthwise filter [kh][kw][c][m] is the same bytes): a derived tensor of the op's
// inputs `from` (compiler.h), so a caller keeps it while they are unchanged (an inference's
// weights: built once, not at every run).
ArgRef append_blockdiag(CompiledKernel& k, const CompileContext& ctx, const CubeTypes& ct,
                        const ArgRef& w, std::vector<int> from, int64_t taps,
                        const BlockDiagShape& d) {
  const uint64_t bytes = static_cast<uint64_t>(d.blocks() * taps * kFold16 * d.block_cols()) * 2;
  const ArgRef ws = workspace_take(k, bytes);
  const ArgRef wbd{ArgRef::Kind::kDerived, static_cast<int>(k.derived.size()), ws.value};
  k.derived.push_back(DerivedTensor{
      std::move(from), k.launches.size(), bytes,
      d.cin == 1 ? "block-diagonal depthwise filter" : "block-diagonal grouped filter"});
  k.launches.push_back(
      with_args(build_blockdiag(device_dtype(ct.cube), taps, d, ctx.cfg, ctx.op.str()), {w, wbd}));
  return wbd;
}

// The same from filter input `input` (cast to the cube type), derived from that input.
ArgRef append_blockdiag(CompiledKernel& k, const CompileContext& ctx, const CubeTypes& ct,
                        size_t input, int64_t taps, const BlockDiagShape& d) {
  return append_blockdiag(k, ctx, ct, cube_operand(k, ctx, ct, input), {static_cast<int>(input)},
                          taps, d);
}

// The depthwise filter [kh][kw][c][m] as groups of one channel.
BlockDiagShape depthwise_blockdiag(const std::vector<int64_t>& f) {
  return BlockDiagShape{1, f[3], f[2]};
}

// NPUSIM_FUSION_GROUPED_CONV_PACK in the environment (read at every compile): unset or empty,
// narrow groups are packed where narrow_group_packing's estimate says; "0", never (each group
// padded to whole 16-channel blocks on its own, as before the packing); "1", wherever the
// shapes allow (for measuring and tests). Anything else is a CompileError naming op.
enum class GroupPacking { kByEstimate, kOff, kWhereShapesAllow };
GroupPacking grouped_conv_pack_mode(const OpDesc& op) {
  const char* v = std::getenv("NPUSIM_FUSION_GROUPED_CONV_PACK");
  if (!v || !*v) return GroupPacking::kByEstimate;
  if (std::string_view(v) == "0") return GroupPacking::kOff;
  if (std::string_view(v) == "1") return GroupPacking::kWhereShapesAllow;
  op.fail(fmt::format("NPUSIM_FUSION_GROUPED_CONV_PACK='{}' is none of '', '0', '1'", v));
}

// The cube convolution s of G groups (Conv2D: kRowsK; its input gradient: kRowsN, flipped) as
// d.blocks() groups of d.per() packed ones, B read from d's block-diagonal filter [blocks][taps]
// [16][per * M] (Conv2D: 16 channels of x -> per * M of y; the input gradient: per * M of dy ->
// 16 of dx). x's and y's channels keep their places (group j of block g is group per * g + j);
// the last block may hold fewer groups (its channels end at x's, its columns at y's).
CubeConvSpec pack_groups(CubeConvSpec s, const BlockDiagShape& d, int64_t taps) {
  const bool transposed = s.b_mode == CubeConvSpec::BMode::kRowsN;
  s.groups = d.blocks();
  s.cg_in = transposed ? d.block_cols() : kFold16;
  s.cg_out = transposed ? kFold16 : d.block_cols();
  s.b_row = d.block_cols();
  s.b_tap = kFold16 * d.block_cols();
  s.b_group = taps * s.b_tap;
  return s;
}

// The blocks per kernel step the planner may merge for a packed spec s (append_cube_conv's
// diagonal_merge_max): Conv2D's as the depthwise convolutions', as many as one n tile of at
// most kMaxTile columns holds; the input gradient's B (kRowsN) is not merged.
int64_t packed_merge_max(const CubeConvSpec& s) {
  return s.b_mode == CubeConvSpec::BMode::kRowsK ? std::max<int64_t>(1, kMaxTile / s.cg_out) : 1;
}

// The packing of a grouped convolution's narrow groups (s: Conv2D or its input gradient as
// append_cube_conv takes it, filter f [KH,KW,Cin,Cout], G groups of Cin -> M = Cout / G): per
// = 16 / Cin groups share one 16-channel block of x with the block-diagonal filter
// (BlockDiagShape, pack_groups), so that one kernel step serves per groups: k over 16 channels
// of per groups, n over their per * M columns. The cube still multiplies the zeros off the
// diagonal; what it saves is the padding of each group to whole blocks on its own: M to 16
// columns (Conv2D's n, the input gradient's k), ceil16(M) / M of the MACs, and Cin to 16 rows
// (per times fewer load3d moves of x into L0A, slab loads and steps).
// Where: G > 1, Cin < 16 divides 16, per * M is whole 16-column blocks (a packed group's
// columns, the block-diagonal filter's rows, are whole blocks: the vector kernel's rows and the
// y tiles' columns), M is not (with M whole blocks the MACs are the same either way:
// unpacked, Cin of each 16-row k block useful; packed, 1 of per diagonal blocks), and the
// packed kernel's estimate (plan_prepared_conv) plus the block-diagonal filter's launch
// (blockdiag_cycles) is below the unpacked kernel's, plus the launch of the copy that packs
// its output where it takes one (PreparedConv: groups of M not whole 32-byte blocks through
// the UB). NPUSIM_FUSION_GROUPED_CONV_PACK (grouped_conv_pack_mode) may turn the estimate off.
std::optional<BlockDiagShape> narrow_group_packing(const CompileContext& ctx, const CubeTypes& ct,
                                                   const CubeConvSpec& s,
                                                   const std::vector<int64_t>& f, int64_t groups) {
  const int64_t cin = f[2], m = groups > 0 ? f[3] / groups : 0;
  const GroupPacking mode = grouped_conv_pack_mode(ctx.op);
  if (mode == GroupPacking::kOff || groups <= 1 || cin <= 0 || cin >= kFold16 ||
      kFold16 % cin != 0 || m <= 0 || m % kFold16 == 0 || (kFold16 / cin * m) % kFold16 != 0)
    return std::nullopt;
  const BlockDiagShape d{cin, m, groups};
  if (mode == GroupPacking::kWhereShapesAllow) return d;
  const int64_t taps = f[0] * f[1];
  const CubeConvSpec packed = pack_groups(s, d, taps);
  const auto estimate = [&](const CubeConvSpec& spec, int64_t merge_max) {
    const PreparedConv p = prepare_cube_conv(ctx, ct, spec);
    double cycles = plan_prepared_conv(ctx, p, merge_max).second.est_cycles;
    if (p.narrow_via_f32 || p.group_padded) cycles += launch_overhead_cycles(ctx.cfg);
    return cycles;
  };
  double unpacked_cycles = std::numeric_limits<double>::infinity();
  try {
    unpacked_cycles = estimate(s, 1);
  } catch (const CompileError&) {  // (the packed kernel may still plan)
  }
  double packed_cycles = std::numeric_limits<double>::infinity();
  try {
    packed_cycles = estimate(packed, packed_merge_max(packed));
  } catch (const CompileError&) {
    return std::nullopt;
  }
  packed_cycles += blockdiag_cycles(taps, d, ctx.cfg, ctx.op.str());
  if (packed_cycles >= unpacked_cycles) return std::nullopt;
  return d;
}

// Conv2D, Conv2DBatchNormInference (x, filter, scale, offset, mean, variance[, bias];
// epsilon, relu: the graph fusion of Conv2D -> BatchNormInference) and Conv2DBiasAdd (x,
// filter, bias; relu: the fusion of Conv2D -> BiasAdd [-> Relu]); see the file comment.
CompiledKernel compile_conv2d_forward(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const bool batch_norm = op.type == "Conv2DBatchNormInference";
  // Conv2DBNTrainingReduce: Conv2D (x, filter) or Conv2DBiasAdd (x, filter, bias) with
  // BNTrainingReduce's outputs sum and square_sum of y
  BnStats stats;
  stats.wanted = op.type == "Conv2DBNTrainingReduce";
  if (stats.wanted && op.inputs.size() != 2 && op.inputs.size() != 3)
    op.fail(fmt::format("takes x, filter [, bias]: 2 or 3 inputs, {} given", op.inputs.size()));
  const bool bias_add = op.type == "Conv2DBiasAdd" || (stats.wanted && op.inputs.size() == 3);
  const size_t plain_inputs = bias_add ? 3 : 2;
  if (!batch_norm && op.inputs.size() != plain_inputs)
    op.fail(fmt::format("takes {} inputs, {} given", plain_inputs, op.inputs.size()));
  if (batch_norm && op.inputs.size() < 6)
    op.fail(fmt::format("takes at least 6 inputs, {} given", op.inputs.size()));
  require_rank4(op, 0, "input");
  require_rank4(op, 1, "filter");
  // Conv2DBatchNormInference: f32 filter and batch norm; x and y f32 or f16 (Tx / Tout: the
  // graph fusion's fp16 hand-off between two of them).
  const DataType dt = common_dtype(
      op, batch_norm ? std::initializer_list<size_t>{1} : std::initializer_list<size_t>{0, 1});
  if (bias_add) {
    // x and filter f32, or f16 (allow_mix_precision's graph pass: y f16); the bias f32 either
    // way, as the bias table holds it.
    if (dt != DataType::F32 && dt != DataType::F16)
      op.fail(fmt::format("dtype {} is not supported (f32, f16)", data_type_name(dt)));
    if (op.inputs[2].dtype != DataType::F32)
      op.fail(
          fmt::format("bias is {}: the bias table holds f32", data_type_name(op.inputs[2].dtype)));
    if (op.inputs[2].shape.size() != 1 || op.inputs[2].shape[0] != op.inputs[1].shape[3])
      op.invalid(fmt::format("bias {} is not [{}], the filter's output channels",
                             shape_str(op.inputs[2].shape), op.inputs[1].shape[3]));
  }
  const DataType y_type = batch_norm ? batch_norm_conv_y_type(op, dt) : dt;
  const std::vector<int64_t>& x = op.inputs[0].shape;
  const std::vector<int64_t>& f = op.inputs[1].shape;
  const int64_t c = x[3], cin = f[2], cout = f[3];
  const int64_t groups = conv_groups(op, c, f);
  const ConvWindow cw = forward_window(op, x, f[0], f[1], nullptr);
  CompiledKernel k;
  k.outputs = {TensorDesc{y_type, {x[0], cw.h.out, cw.w.out, cout}}};
  if (stats.wanted) {
    k.outputs.push_back(TensorDesc{DataType::F32, {cout}});  // sum
    k.outputs.push_back(TensorDesc{DataType::F32, {cout}});  // square_sum
    if (k.outputs[0].num_elements() == 0)
      op.fail(fmt::format("the batch norm's statistics need a non-empty y, got {}",
                          shape_str(k.outputs[0].shape)));
  }
  CubeTypes ct = cube_types(ctx, dt);
  if (y_type == DataType::F16) {  // FIXPIPE rounds the f32 result to the f16 output
    ct.fix_out = Dtype::F16;
    ct.widen = false;
  }
  // The statistics as launches of their own on y where the convolution's kernel does not
  // compute them.
  auto finish = [&]() -> CompiledKernel& {
    if (stats.wanted && !stats.done)
      append_bn_training_reduce(k, op, output_ref(0), k.outputs[0].num_elements() / cout, cout,
                                y_type, 1, ctx.cfg);
    return k;
  };
  if (k.outputs[0].num_elements() == 0) return k;
  if (c == 0 || f[0] * f[1] == 0) {
    append_zero_output(k, op, k.outputs[0], ctx.cfg);
    return finish();
  }
  CubeConvSpec s;
  s.name = fmt::format("Conv2D_{}", data_type_name(dt));
  s.images = x[0];
  s.hs = x[1];
  s.ws = x[2];
  s.cs = c;
  set_window(s, cw);
  s.groups = groups;
  s.cg_in = cin;
  s.cg_out = cout / groups;
  s.cy = cout;
  s.b_mode = CubeConvSpec::BMode::kRowsK;
  s.b_group = cout / groups;  // group g's columns start at g * cout / groups
  s.b_tap = cin * cout;
  s.b_row = cout;
  if (!pack_stride(s, x, op, ctx.cfg)) fold_width(s, x);
  const FilterRead filter_read =
      filter_layout_n16(op) ? n16_filter_read(f, groups) : FilterRead::kHwio;
  if (filter_layout_n16(op) && (batch_norm || ct.cast_inputs))
    op.fail(fmt::format(
        "filter_layout {} is read by Conv2D, Conv2DBiasAdd and Conv2DBNTrainingReduce with a "
        "filter of the cube's 16-bit type (filter {} {})",
        kFilterLayoutN16, data_type_name(op.inputs[1].dtype), shape_str(f)));
  if (filter_read == FilterRead::kBlocked) {
    // The filter in blocks of 16 output channels (conv.h, kFilterLayoutN16) as the cube reads
    // it: no cast, fold or packing may read it as HWIO first (groups of whole blocks are never
    // packed: narrow_group_packing).
    // The width fold's view (rows kw * cin + c of a tap row) holds in it too: a tap row's
    // (kw, ci) rows are contiguous in each column block.
    s.b_row = kFold16;
    s.b_tap = s.cg_in * kFold16;  // cg_in: kw * cin where the width is folded, sw * cin packed
    if (s.b_tap_row != 0) s.b_tap_row = f[1] * cin * kFold16;  // packed: a row of taps
    s.b_nblock = f[0] * f[1] * cin * kFold16;
    s.b_group = cout / groups / kFold16 * s.b_nblock;  // group g's first column block
  }
  const std::optional<ArgRef> filter_hwio =
      filter_read == FilterRead::kCopied ? std::optional<ArgRef>(append_filter_from_n16(k, ctx, 1))
                                         : std::nullopt;
  // Narrow groups packed into 16-channel blocks: the weights are then the block-diagonal filter
  // (a derived tensor of the filter), and the planner may merge several blocks into a step
  // (merge_diagonal_groups, as the depthwise convolutions: at most one n tile of columns).
  const std::optional<BlockDiagShape> packed = narrow_group_packing(ctx, ct, s, f, groups);
  if (packed) s = pack_groups(s, *packed, f[0] * f[1]);
  const int64_t merge_max = packed ? packed_merge_max(s) : 1;
  const auto weights = [&] {
    if (filter_hwio)
      return packed ? append_blockdiag(k, ctx, ct, *filter_hwio, {1}, f[0] * f[1], *packed)
                    : *filter_hwio;
    return packed ? append_blockdiag(k, ctx, ct, 1, f[0] * f[1], *packed)
                  : cube_operand(k, ctx, ct, 1);
  };
  const bool relu = op.attr_bool("relu", false);
  if (bias_add) {
    const ArgRef xr = cube_operand(k, ctx, ct, 0), wr = weights();
    // The cube's bias needs one group and a bias table (none on coupled 910 / 310P cores).
    if (groups > 1 || !ctx.cfg.has_path(Buf::L1, Buf::BT)) {
      append_cube_conv(k, ctx, ct, s, xr, wr, nullptr, nullptr, nullptr, nullptr, nullptr,
                       merge_max);
      append_bias_epilogue(k, ctx, 2, relu);
      return finish();
    }
    const ArgRef bias = input_ref(2);  // f32 [Cout], as the bias table reads it
    s.name = fmt::format("Conv2DBias{}_{}", relu ? "Relu" : "", data_type_name(y_type));
    s.bias = true;
    s.relu = relu;
    append_cube_conv(k, ctx, ct, s, xr, wr, &bias, &stats);
    return finish();
  }
  if (!batch_norm) {
    const ArgRef xr = cube_operand(k, ctx, ct, 0), wr = weights();
    if (relu) s.name = fmt::format("Conv2DRelu_{}", data_type_name(dt));
    s.relu = relu;
    append_cube_conv(k, ctx, ct, s, xr, wr, nullptr, &stats, nullptr, nullptr, nullptr, merge_max);
    return finish();
  }
  const int residual = batch_norm_conv_residual(op, k.outputs[0]);
  const BatchNormFold fold =
      append_batch_norm_fold(k, ctx, kBnScale, k.outputs[0].shape, residual >= 0 ? residual : -1);
  // x in f16 already (Tx = half) is what the cube reads.
  const ArgRef xr =
      op.inputs[0].dtype == DataType::F16 ? input_ref(0) : cube_operand(k, ctx, ct, 0);
  // The cube's bias needs one group and a bias table (none on coupled 910 / 310P cores), and
  // FIXPIPE clamps at 0 only (the fixpipe instruction's relu bit): else the batch norm, with
  // the activation, as its own launch.
  if (groups > 1 || !ctx.cfg.has_path(Buf::L1, Buf::BT) ||
      activation_attr(op) == Activation::kRelu6) {
    // One group through the UB: a folded into the filter (a derived tensor, as with the bias
    // table), the epilogue adds the shift.
    if (groups == 1 && batch_norm_in_epilogue(ctx, s))
      append_conv_then_batch_norm(k, ctx, ct, s, xr, append_folded_filter(k, ctx, ct, fold.a), fold,
                                  y_type, true, residual);
    else
      append_conv_then_batch_norm(k, ctx, ct, s, xr, weights(), fold, y_type, false, residual,
                                  merge_max);
    return k;
  }
  const ArgRef wr = append_folded_filter(k, ctx, ct, fold.a);
  // A residual is added after FIXPIPE (the ReLU, if any, after it).
  s.relu = relu && residual < 0;
  s.name = fmt::format("Conv2DBias{}_{}", s.relu ? "Relu" : "", data_type_name(y_type));
  s.bias = true;
  append_cube_conv(k, ctx, ct, s, xr, wr, &fold.shift);
  if (residual >= 0) append_residual_add(k, ctx, residual, activation_attr(op));
  return k;
}

// Which kernel a strided 1x1 input gradient takes (NPUSIM_CONV_STRIDED_INPUT_GRAD, read at
// every compile): unset or empty, the lowest estimate (append_strided_input_grad); "0", the
// zero-insertion convolution; "1", the lower of the two strided kernels wherever they apply;
// "matmul" / "conv" the one named (for measuring and tests). Where no strided kernel applies
// (chips whose tiles leave through the UB, widened products) every value gives the
// zero-insertion convolution. Anything else is a CompileError naming op.
enum class StridedInputGrad { kByEstimate, kOff, kStrided, kMatmul, kConv };
StridedInputGrad strided_input_grad_mode(const OpDesc& op) {
  const char* v = std::getenv("NPUSIM_CONV_STRIDED_INPUT_GRAD");
  if (!v || !*v) return StridedInputGrad::kByEstimate;
  const std::string_view value(v);
  if (value == "0") return StridedInputGrad::kOff;
  if (value == "1") return StridedInputGrad::kStrided;
  if (value == "matmul") return StridedInputGrad::kMatmul;
  if (value == "conv") return StridedInputGrad::kConv;
  op.fail(
      fmt::format("NPUSIM_CONV_STRIDED_INPUT_GRAD='{}' is none of '0', '1', 'matmul', 'conv'", v));
}

// The input gradient of a 1x1 window of stride (sh, sw) > 1 (no padding: a 1x1 window never
// has any, set_transposed_window), dx [N,H,W,Cin] from dy [N,OH,OW,Cout] and the filter
// [1,1,Cin,Cout]: dx[n][sh*i][sw*j][:] = dy[n][i][j][:] x W^T, zero elsewhere. The cube computes
// dy's positions only (the zero-insertion convolution `conv` computes every position of dx,
// sh*sw times the MACs), its tiles stored straight to dx's strided positions (StridedRows: runs
// of OW rows sw*Cin apart, run i of image n at (n*H + sh*i)*W*Cin), by one of two kernels: the
// 1x1 stride-1 convolution of dy (CubeConvSpec::y_strided; unstacked) or the MatMul of dy
// (N*OH*OW x Cout) by the filter read as Cin x Cout (trans_b; MatmulTiling::c_strided). dx is a
// fresh buffer: where its pixels are whole 32-byte blocks the kernel's own vector cores write
// the zeros between (emit_strided_zeros; the estimate then at least the launch's HBM bytes at
// HBM's rate), else a fill launch first (its bytes at the vector cores' ub->gm rate or HBM's,
// and one more launch's task overheads). Where FIXPIPE writes GM (split chips) and writes the
// op's type (no widening), from any L0C row (strided_rows_fit_l0c); the kernel of the lowest
// estimate (plan_cube_conv's, plan_matmul_ tiling's), or as NPUSIM_CONV_STRIDED_INPUT_GRAD says.
// Returns whether it appended it.
bool append_strided_input_grad(CompiledKernel& k, const CompileContext& ctx, const CubeTypes& ct,
                               const ConvWindow& cw, const std::vector<int64_t>& dy,
                               CubeConvSpec conv) {
  const OpDesc& op = ctx.op;
  const ChipConfig& cfg = ctx.cfg;
  const StridedInputGrad mode = strided_input_grad_mode(op);
  if (cw.h.k != 1 || cw.w.k != 1 || (cw.h.s == 1 && cw.w.s == 1) || cw.h.before != 0 ||
      cw.w.before != 0 || ct.widen || mode == StridedInputGrad::kOff ||
      cube_store_via_ub(cfg, cube_core(cfg, op.str()), op.str()) || !strided_rows_fit_l0c(cfg))
    return false;
  const TensorDesc& dx = k.outputs[0];
  const int64_t n = dx.shape[0], h = dx.shape[1], w = dx.shape[2], cin = dx.shape[3];
  const int64_t cout = dy[3];
  StridedRows rows;  // runs: dy's rows; groups: images
  rows.run_rows = dy[2];
  rows.row_pitch = cw.w.s * cin;
  rows.run_pitch = cw.h.s * w * cin;
  rows.runs_per_group = dy[1];
  rows.group_pitch = h * w * cin;
  rows.cols = cin;
  rows.elements = dx.num_elements();
  const bool zero_fill = strided_zeros_fit(rows, isa::dtype_size(ct.fix_out), cfg);
  const CoreKindConfig* vec = cfg.core_kind(isa::CoreKind::AIV);
  const int vector_cores = vec ? vec->count : cube_core(cfg, op.str()).count;
  const double fill_rate =
      std::min(vector_cores * cfg.path_rate(Buf::UB, Buf::GM), cfg.hbm_bytes_per_cycle());
  const double launch = launch_overhead_cycles(cfg);
  const double dx_bytes = static_cast<double>(dx.num_elements() * data_type_bytes(dx.dtype));
  const double operand_bytes =
      static_cast<double>((n * dy[1] * dy[2] + cin) * cout) * data_type_bytes(ct.cube);
  // A strided kernel's estimate with the zeros.
  const auto with_zeros = [&](double est) {
    return zero_fill ? std::max(est, (operand_bytes + dx_bytes) / cfg.hbm_bytes_per_cycle())
                     : est + dx_bytes / fill_rate + launch;
  };
  // A strided kernel's estimate with the zeros, or infinity where it does not plan (then a
  // CompileError only where the switch names it).
  const auto estimate = [&](StridedInputGrad kernel, auto&& plan) {
    try {
      return with_zeros(plan());
    } catch (const CompileError&) {
      if (mode == kernel) throw;
      return std::numeric_limits<double>::infinity();
    }
  };
  MatmulTiling t;
  const double matmul_cycles = estimate(StridedInputGrad::kMatmul, [&] {
    if (conv.b_nblock > 0)
      throw CompileError(fmt::format("{}: the strided input gradient's MatMul reads HWIO, not {}",
                                     op.str(), kFilterLayoutN16));
    t = plan_matmul_tiling(n * dy[1] * dy[2], cin, cout, false, true, device_dtype(ct.cube),
                           ct.fix_out, cfg, op.str(), 1, true);
    return t.est_cycles;
  });
  t.c_strided = rows;
  t.c_zero_fill = zero_fill;
  conv.in_type = device_dtype(ct.cube);  // the types append_cube_conv gives the kernel
  conv.out_type = ct.fix_out;
  CubeConvSpec strided = conv;  // dy's 1x1 stride-1 convolution, y at dx's strided positions
  strided.kh = strided.kw = strided.sh = strided.sw = strided.dh = strided.dw = 1;
  strided.up_h = strided.up_w = 1;
  strided.ext_h = strided.ext_w = 0;
  strided.pt = strided.pb = strided.pl = strided.pr = 0;
  strided.b_flip = false;
  strided.y_pitch = rows.row_pitch;
  strided.y_strided = rows;
  strided.y_zero_fill = zero_fill;
  const double conv_cycles = estimate(
      StridedInputGrad::kConv, [&] { return plan_cube_conv(strided, cfg, op.str()).est_cycles; });
  double zero_inserted_cycles = std::numeric_limits<double>::infinity();
  try {
    zero_inserted_cycles = plan_cube_conv(conv, cfg, op.str()).est_cycles;
  } catch (const CompileError&) {  // (the strided kernels may still plan)
  }
  const bool by_conv = mode == StridedInputGrad::kConv ||
                       (mode != StridedInputGrad::kMatmul && conv_cycles <= matmul_cycles);
  const double cycles = by_conv ? conv_cycles : matmul_cycles;
  if (cycles == std::numeric_limits<double>::infinity()) return false;  // neither plans
  if (mode == StridedInputGrad::kByEstimate && cycles >= zero_inserted_cycles) return false;
  if (!zero_fill) append_zero_output(k, op, dx, cfg);
  const ArgRef dyr = cube_operand(k, ctx, ct, 1), wr = cube_operand(k, ctx, ct, 0);
  if (by_conv)
    append_cube_conv(k, ctx, ct, strided, dyr, wr);
  else
    k.launches.push_back(
        with_args(build_matmul_launch(t, cfg, op.str()), {dyr, wr, output_ref(0)}));
  Launch& l = k.launches.back();
  l.summary = fmt::format(
      "dy's positions to dx's of stride {}x{} (modelled ~{:.0f} cycles with the zeros; the "
      "{} ~{:.0f}, the zero-insertion convolution ~{:.0f}): {}",
      cw.h.s, cw.w.s, cycles, by_conv ? "MatMul" : "convolution",
      by_conv ? matmul_cycles : conv_cycles, zero_inserted_cycles, l.summary);
  return true;
}

// Data inputs: filter, out_backprop (input_sizes as an attribute).
CompiledKernel compile_conv2d_backprop_input(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 2)
    op.fail(fmt::format("takes filter and out_backprop, {} inputs given", op.inputs.size()));
  require_rank4(op, 0, "filter");
  require_rank4(op, 1, "out_backprop");
  const DataType dt = common_dtype(op, {0, 1});
  const std::vector<int64_t> x = shape_attr(op, "input_sizes");
  const std::vector<int64_t>& f = op.inputs[0].shape;
  const std::vector<int64_t>& dy = op.inputs[1].shape;
  const int64_t groups = conv_groups(op, x[3], f);
  if (dy[0] != x[0] || dy[3] != f[3])
    op.invalid(fmt::format("out_backprop {} does not match batch {} / filter output channels {}",
                           shape_str(dy), x[0], f[3]));
  const ConvWindow cw = forward_window(op, x, f[0], f[1], &dy);
  CompiledKernel k;
  k.outputs = {TensorDesc{dt, x}};
  const CubeTypes ct = cube_types(ctx, dt);
  if (k.outputs[0].num_elements() == 0) return k;
  if (op.inputs[1].num_elements() == 0 || f[0] * f[1] == 0) {
    append_zero_output(k, op, k.outputs[0], ctx.cfg);
    return k;
  }
  CubeConvSpec s;
  s.name = fmt::format("Conv2DBackpropInput_{}", data_type_name(dt));
  s.images = dy[0];
  s.hs = dy[1];
  s.ws = dy[2];
  s.cs = dy[3];
  set_transposed_window(s, cw, op);
  // Group g: dy's channels [g * Cout/G, (g + 1) * Cout/G) to dx's [g * Cin, (g + 1) * Cin), B_g
  // the filter's columns of the group read transposed.
  s.groups = groups;
  s.cg_in = dy[3] / groups;
  s.cg_out = f[2];
  s.cy = x[3];
  s.b_mode = CubeConvSpec::BMode::kRowsN;
  s.b_flip = true;
  s.b_group = f[3] / groups;
  s.b_tap = f[2] * f[3];
  s.b_row = f[3];
  const FilterRead filter_read =
      filter_layout_n16(op) ? n16_filter_read(f, groups) : FilterRead::kHwio;
  if (filter_layout_n16(op) && ct.cast_inputs)
    op.fail(fmt::format(
        "filter_layout {} is read by Conv2DBackpropInput with a filter of the cube's 16-bit "
        "type (filter {} {})",
        kFilterLayoutN16, data_type_name(op.inputs[0].dtype), shape_str(f)));
  if (filter_read == FilterRead::kBlocked) {
    // The filter in blocks of 16 output channels (conv.h, kFilterLayoutN16): B's k-block c1
    // (dy's channels [16 c1, 16 c1 + 16) of the group) of a tap is dx's Cin rows of 16, one run.
    s.b_row = kFold16;
    s.b_tap = f[2] * kFold16;
    s.b_nblock = f[0] * f[1] * f[2] * kFold16;
    s.b_group = f[3] / groups / kFold16 * s.b_nblock;  // group g's first k-block
  }
  // (the strided kernels multiply all of dy's channels by all of the filter's: one group)
  if (groups == 1 && append_strided_input_grad(k, ctx, ct, cw, dy, s)) return k;
  // Narrow groups packed into 16-channel blocks of dx (narrow_group_packing): B read transposed
  // and flipped from the block-diagonal filter, per * M of dy's channels to 16 of dx's.
  const std::optional<BlockDiagShape> packed = narrow_group_packing(ctx, ct, s, f, groups);
  if (packed) s = pack_groups(s, *packed, f[0] * f[1]);
  const ArgRef dyr = cube_operand(k, ctx, ct, 1);
  const std::optional<ArgRef> filter_hwio =
      filter_read == FilterRead::kCopied ? std::optional<ArgRef>(append_filter_from_n16(k, ctx, 0))
                                         : std::nullopt;
  const ArgRef w = filter_hwio ? *filter_hwio : cube_operand(k, ctx, ct, 0);
  const ArgRef wr =
      packed ? append_blockdiag(k, ctx, ct, w, {0}, f[0] * f[1], *packed) : w;
  append_cube_conv(k, ctx, ct, s, dyr, wr);
  return k;
}

// ---- the filter gradient's product split along k ----

// dW = img2col(x)^T x dy is (KH*KW*Cin) x Cout over k = N*OH*OW positions: few output tiles
// (ResNet-50's 1x1 layers: 64 x 256 is one or two) and a long k, so the MatMul kernel, which
// spreads output tiles over the cube cores, would use one or two of them. Split in `parts`
// equal ranges of positions, the product is a batched MatMul (product p: rows
// [p * k / parts, (p + 1) * k / parts) of both operands) writing f32 partial products
// [parts][m][n] to the workspace, summed by a vector reduction (append_partial_sum).
struct KSplit {
  int64_t parts = 1;
  MatmulTiling tiling;  // of one part's product (batch = parts when split)
};

// The planner's estimate of a tiling's cycles on its busiest cube core: its tiles run in waves,
// each k of a tile costs the slower of its gm->l1 loads and its mmads (plan_matmul_tiling's
// model), and its C tiles leave through FIXPIPE at the l0c->gm rate, or through the UB (FIXPIPE
// into it, MTE3 out of it, overlapped) at the slower of l0c->ub and ub->gm.
double matmul_estimate(const MatmulTiling& t, const ChipConfig& cfg) {
  const double isz = isa::dtype_size(t.in_type), osz = isa::dtype_size(t.out_type);
  const int64_t tiles = t.batch * t.tiles_m * t.tiles_n;
  const double waves = static_cast<double>(ceil_div(tiles, t.block_dim));
  const double load = static_cast<double>(t.tm + t.tn) * isz / cfg.path_rate(Buf::GM, Buf::L1);
  const double cube =
      static_cast<double>(ceil_div(t.tm, cfg.cube_m) * ceil_div(t.tn, cfg.cube_n)) / cfg.cube_k;
  const double store_rate =
      t.via_ub ? std::min(cfg.path_rate(Buf::L0C, Buf::UB), cfg.path_rate(Buf::UB, Buf::GM))
               : cfg.path_rate(Buf::L0C, Buf::GM);
  const double store = static_cast<double>(t.tm * t.tn) * osz / store_rate;
  return waves * (static_cast<double>(t.k) * std::max(load, cube) + store);
}

// The shortest part worth splitting off. # estimate: the model above counts every load at the
// gm->l1 rate, while the unsplit kernel's tiles share their operand rows through L2 and parts
// do not; on ResNet-50's filter gradients (910b, batch 8) parts shorter than this measured
// slower than the model said (more partial products, shorter chunk loads), longer ones faster.
constexpr int64_t kMinPartPositions = 4096;

// The cycles of the vector Sum over `parts` f32 partial products of mn elements: the task
// overheads (dispatch, completion, a block's start) and its reads of the partials over the
// vector cores' gm->ub paths (or HBM, the lower); the extra part of k (MTE2 latency, pipeline
// fill) is ignored. # estimate: matmul_estimate's model for the reduction.
// in_kernel: the parts added by the product's own vector cores (FilterGradSpec::add_parts), no
// launch of their own.
double partial_sum_estimate(const ChipConfig& cfg, const std::string& op, int64_t parts, int64_t mn,
                            bool in_kernel = false) {
  const CoreKindConfig* vec = cfg.core_kind(isa::CoreKind::AIV);  // coupled: the cube's cores
  const int vector_cores = vec ? vec->count : cube_core(cfg, op).count;
  const double launch = in_kernel ? 0.0 : launch_overhead_cycles(cfg);
  const double bytes = static_cast<double>(parts * mn * 4);
  // In the kernel, on a write-back L2 that holds them, the products FIXPIPE has just written
  // are read from the L2: each vector core at its L2 read rate (cube_l2_read_rate: its port or
  // its share of the L2's bandwidth), not HBM's.
  if (in_kernel && vec && cfg.l2_write_back && bytes <= static_cast<double>(cfg.l2_bytes))
    return bytes / (vector_cores * cube_l2_read_rate(cfg, *vec));
  const double sum_rate =
      std::min(vector_cores * cfg.path_rate(Buf::GM, Buf::UB), cfg.hbm_bytes_per_cycle());
  return launch + bytes / sum_rate;
}

KSplit plan_k_split(int64_t m, int64_t n, int64_t k, Dtype in, Dtype out, const ChipConfig& cfg,
                    const std::string& op) {
  // The unsplit product may take tiles of any multiple of 16 (ResNet-50's 1x1 layers at 14x14
  // and 7x7: 16 power-of-two tiles on 24 cores become 24). The parts keep the powers of two:
  // with any side the first layer's parts took one 160x64 tile each instead of three 64x64
  // ones and ran 1.8x slower (the model counts loads at the gm->l1 rate that the 64x64 tiles
  // share through L2).
  KSplit best;
  // Chips whose C leaves L0C through the UB (padded rows): the unsplit product takes the
  // MatMul's own tiling (power-of-two sides).
  const bool via_ub = cube_store_via_ub(cfg, cube_core(cfg, op), op);
  best.tiling = plan_matmul_tiling(m, n, k, true, false, in, out, cfg, op, 1, !via_ub);
  double best_cycles = matmul_estimate(best.tiling, cfg);
  const int cores = cube_core(cfg, op).count;
  for (int64_t parts = 2; parts <= cores; ++parts) {
    // Equal parts, each at least kMinPartPositions long.
    if (k % parts != 0 || k / parts < kMinPartPositions) continue;
    MatmulTiling t =
        plan_matmul_tiling(m, n, k / parts, true, false, in, Dtype::F32, cfg, op, parts);
    if (t.c_pitch != n) continue;  // through the UB: f32 rows of n not whole blocks
    const double cycles = matmul_estimate(t, cfg) + partial_sum_estimate(cfg, op, parts, m * n);
    if (cycles >= best_cycles) continue;
    best_cycles = cycles;
    t.batch_dims = {parts};
    t.a_batch_strides = {k / parts * m};
    t.b_batch_strides = {k / parts * n};
    t.a_count = t.b_count = parts;
    best.parts = parts;
    best.tiling = t;
  }
  return best;
}

// Output 0 (dt) = the f32 matrix at `total` (`rows` x `cols` of a `pitch`) packed and cast to
// dt; `round_f16` rounds it to f16 before widening it (allow_mix_precision).
void append_packed_output(CompiledKernel& k, const CompileContext& ctx, const ArgRef& total,
                          bool round_f16, int64_t rows, int64_t cols, int64_t pitch) {
  const DataType dt = k.outputs[0].dtype;
  if (!round_f16) {
    append_strided_copy(k, ctx.op, total, output_ref(0), rows, cols, pitch, DataType::F32, dt,
                        ctx.cfg);
    return;
  }
  const int64_t out_n = rows * cols;
  const ArgRef half = workspace_take(k, static_cast<uint64_t>(out_n) * 2);
  append_strided_copy(k, ctx.op, total, half, rows, cols, pitch, DataType::F32, DataType::F16,
                      ctx.cfg);
  append_strided_copy(k, ctx.op, half, output_ref(0), 1, out_n, out_n, DataType::F16, dt, ctx.cfg);
}

// Output 0 (dt) = the sum over `parts` of the f32 partial products at `partials`
// ([parts][mn]; parts 1: the product itself, no Sum): a Sum over the first axis (the reduction
// engine, in f32), then the copy that packs its rows (`rows` x `cols` of a padded `pitch`:
// img2col's taps padded to a block through the UB; rows 1: dense) and casts to dt when it is not
// f32; `round_f16` (allow_mix_precision) rounds the sum to f16 before widening it, as the
// unsplit kernel's f16 FIXPIPE output. Rows without padding need no packing: the Sum rounds its
// f32 sums to dt (or to f16 under round_f16) itself, one launch where the Sum and the cast
// were two (the same bits: both round the f32 sum to nearest even).
void append_partial_sum(CompiledKernel& k, const CompileContext& ctx, const ArgRef& partials,
                        int64_t parts, int64_t mn, bool round_f16, int64_t rows = 1,
                        int64_t cols = 0, int64_t pitch = 0) {
  const DataType dt = k.outputs[0].dtype;
  if (rows == 1) cols = pitch = mn;
  const bool direct = dt == DataType::F32 && !round_f16 && pitch == cols;
  if (parts == 1) {  // the product itself (direct: written to the output already)
    if (!direct) append_packed_output(k, ctx, partials, round_f16, rows, cols, pitch);
    return;
  }
  // The Sum's result: dt where it is the output (dense rows), else f16 before the widening
  // (round_f16, dense rows) or f32 for the packing copy.
  const bool dense = pitch == cols;
  const DataType sum_type = !dense ? DataType::F32 : round_f16 ? DataType::F16 : dt;
  LaunchPlan plan({TensorDesc{sum_type, {mn}}});
  ReduceRequest req;
  req.input = TensorDesc{DataType::F32, {parts, mn}};
  req.reduced = {true, false};
  req.out_type = sum_type;
  append_reduce(plan, ctx, req, LaunchPlan::input(0), LaunchPlan::output(0));
  const CompiledKernel sum = std::move(plan).finish();
  const bool to_output = dense && !round_f16;
  const ArgRef total =
      to_output ? output_ref(0)
                : workspace_take(k, static_cast<uint64_t>(mn) * data_type_bytes(sum_type));
  const ArgRef sum_ws = sum.workspace_bytes ? workspace_take(k, sum.workspace_bytes) : ArgRef{};
  for (Launch l : sum.launches) {
    for (ArgRef& a : l.args) {
      if (a.kind == ArgRef::Kind::kInput)
        a = partials;
      else if (a.kind == ArgRef::Kind::kOutput)
        a = total;
      else if (a.kind == ArgRef::Kind::kWorkspace)
        a.value += sum_ws.value;
    }
    l.summary = fmt::format("sum of {} partial products: {}", parts, l.summary);
    k.launches.push_back(std::move(l));
  }
  if (to_output) return;
  if (dense)  // round_f16: the f16 sums widened to dt
    append_strided_copy(k, ctx.op, total, output_ref(0), 1, mn, mn, DataType::F16, dt, ctx.cfg);
  else
    append_packed_output(k, ctx, total, round_f16, rows, cols, pitch);
}

// The image and window fields of an img2col-reading spec (Img2colSpec, FilterGradSpec) from
// x's NHWC shape xs and the window; with `fold` and where it pays (width_fold_pays), the
// width-folded view of x: pixels c apart holding KW * c channels, a KH x 1 window (the same
// img2col matrix, column for column).
template <typename Spec>
void set_image_window(Spec& s, const std::vector<int64_t>& xs, const ConvWindow& cw, bool fold) {
  s.images = xs[0];
  s.h = xs[1];
  s.w = xs[2];
  s.c = xs[3];
  s.kh = cw.h.k;
  s.kw = cw.w.k;
  s.sh = cw.h.s;
  s.sw = cw.w.s;
  s.dh = cw.h.d;
  s.dw = cw.w.d;
  s.pt = cw.h.before;
  s.pb = cw.h.after;
  s.pl = cw.w.before;
  s.pr = cw.w.after;
  if (!fold || !width_fold_pays(s.c, s.kw, s.pl, s.pr, s.dw)) return;
  s.x_pixel = s.c;
  s.x_row = s.w * s.c;
  s.x_image = s.h * s.w * s.c;
  s.w -= s.kw - 1;
  s.c *= s.kw;
  s.kw = 1;
}

// img2col(x) for the window into a new workspace tensor (see Img2colSpec for the layout).
// fold: the columns of a tap are its channels, contiguous (tap_stride = c, rep 1: the filter
// gradient's HWIO rows), so the width fold may view x as [N, H, W-KW+1, KW*C] with a KH x 1
// window: the same matrix, in fewer channel blocks (the first layer's 7x7 over 3 channels: 2 per
// kernel row instead of 7).
ArgRef append_img2col(CompiledKernel& k, const CompileContext& ctx, const ArgRef& x,
                      const std::vector<int64_t>& xs, DataType cube, const ConvWindow& cw,
                      int64_t rep, int64_t row_stride, int64_t tap_stride, int64_t elements,
                      bool fold = false) {
  Img2colSpec s;
  s.in_type = s.out_type = device_dtype(cube);
  set_image_window(s, xs, cw, fold);
  s.rep = rep;
  s.row_stride = row_stride;
  s.tap_stride = s.x_pixel ? s.c : tap_stride;  // folded: a tap's columns are its KW * c channels
  Launch l = build_img2col(s, ctx.cfg, ctx.op.str());
  const ArgRef cols = workspace_take(k, static_cast<uint64_t>(elements) * data_type_bytes(cube));
  const ArgRef rep_ws = workspace_take(k, img2col_rep_bytes(rep, l.block_dim));
  k.launches.push_back(with_args(std::move(l), {x, cols, rep_ws}));
  return cols;
}

// Whether the fused filter gradient adds its parts in its own kernel (FilterGradSpec::add_parts)
// for dW of type dt with mn f32 products per part: split chips (cross-core flags, FIXPIPE
// writing dense rows) unless channel_epilogue_in_kernel is off, dW f32 or f16 (not the widening
// mixed precision), the products' rows and dW whole 32-byte blocks.
bool filter_grad_parts_in_kernel(const CompileContext& ctx, const CubeTypes& ct, DataType dt,
                                 int64_t mn) {
  const std::string op = ctx.op.str();
  return channel_epilogue_in_kernel(ctx.cfg) &&
         !cube_store_via_ub(ctx.cfg, cube_core(ctx.cfg, op), op) && !ct.widen &&
         (dt == DataType::F32 || dt == DataType::F16) &&
         mn * data_type_bytes(DataType::F32) % layout::kBlockBytes == 0 &&
         mn * data_type_bytes(dt) % layout::kBlockBytes == 0;
}

// Whether the fused kernel of one part writes dW (type dt, cout channels) itself: FIXPIPE
// rounds to f16 / bf16 (as the packing copy would) or writes f32, not under the widening mixed
// precision, and through the UB only rows (and with groups, each group's channels: cg_out of
// them) of whole 32-byte blocks; else it writes f32 partial products.
bool fused_writes_dw(const CompileContext& ctx, const CubeTypes& ct, DataType dt, int64_t cout,
                     int64_t cg_out) {
  const std::string op = ctx.op.str();
  const bool half = dt == DataType::F16 || dt == DataType::BF16;
  const bool via_ub = cube_store_via_ub(ctx.cfg, cube_core(ctx.cfg, op), op);
  const int64_t bytes = data_type_bytes(dt);
  return !ct.widen && (half || dt == DataType::F32) &&
         (!via_ub ||
          (cout * bytes % layout::kBlockBytes == 0 && cg_out * bytes % layout::kBlockBytes == 0));
}

// The fused kernel's plan for dW (FilterGradSpec): its spec, tiling and part count (the k
// split: the part count of the lowest estimate, the kernel's model plus the Sum's), whether
// its own vector cores add the parts, and the estimate (cycles of the busiest cube core, the
// parts' sum included; no task overheads).
struct FusedFilterGradPlan {
  FilterGradSpec spec;
  FilterGradTiling tiling;
  bool add_parts = false;
  int64_t rows = 0, mn = 0;  // dW's HWIO rows, f32 products per part (rows x pitch)
  double cycles = 0;
};

// The fused kernel's plan over x as viewed: width-folded where `fold` and it pays
// (set_image_window), see plan_fused_filter_grad.
// View of x for the fused filter gradient: as it is (dense, or the width fold where it pays),
// or the row view (row_view_applies).
enum class FilterGradView { kPlain, kRows };

FusedFilterGradPlan plan_fused_filter_grad_view(const CompileContext& ctx, const CubeTypes& ct,
                                                DataType dt, const std::vector<int64_t>& x,
                                                const std::vector<int64_t>& f, const ConvWindow& cw,
                                                bool fold,
                                                FilterGradView view = FilterGradView::kPlain) {
  const std::string op = ctx.op.str();
  FusedFilterGradPlan p;
  FilterGradSpec& s = p.spec;
  s.in_type = device_dtype(ct.cube);
  s.cout = f[3];
  // Grouped (x's channels G times the filter's): dense x, each tile one group's (no width fold
  // or strided view: those view x's channels as one group's).
  s.groups = x[3] / f[2];
  set_image_window(s, x, cw, fold && s.groups == 1);
  if (view == FilterGradView::kRows) {  // x [N,H,W,C] as [N,H,W/sw,sw*C], stride 1 along W
    s.pixel_channels = s.sw * s.c;
    s.w /= s.sw;
    s.sw = s.dw = 1;
  } else if (s.groups == 1) {
    view_strided_rows(s, s.h, s.w, s.c);
  } else {
    s.c = f[2];
  }
  const bool via_ub = cube_store_via_ub(ctx.cfg, cube_core(ctx.cfg, op), op);
  s.pitch = via_ub ? round_up(s.cout, layout::kBlockBytes / 4) : s.cout;
  // Through the UB, groups whose f32 channels are not whole blocks: each group's padded to
  // whole blocks in the products' rows (the packing copy drops the padding).
  if (via_ub && s.groups > 1 && s.cg_out() * 4 % layout::kBlockBytes != 0) {
    s.group_pitch = round_up(s.cg_out(), layout::kBlockBytes / 4);
    s.pitch = s.groups * s.group_pitch;
  }
  p.rows = s.kh * s.kw * s.c;
  p.mn = p.rows * s.pitch;
  p.add_parts = filter_grad_parts_in_kernel(ctx, ct, dt, p.mn);
  const bool one_part_writes_dw =
      s.group_pitch == 0 && fused_writes_dw(ctx, ct, dt, s.cout, s.cg_out());
  // The candidates: every part count's tilings, each with the parts' sum added; the choice is
  // the first of the lowest estimate (NPUSIM_FILTER_GRAD_PLAN_RANK=k: the k-th lowest, a
  // measuring switch, forced_plan_rank; benchmarks/filter_grad_plan_ranks.py).
  struct Candidate {
    int64_t parts;
    FilterGradTiling tiling;
    double cycles;
  };
  std::vector<Candidate> candidates;
  for (int64_t parts = 1; parts <= cube_core(ctx.cfg, op).count; ++parts) {
    s.parts = parts;
    s.out_type = parts == 1 && one_part_writes_dw ? device_dtype(dt) : Dtype::F32;
    std::vector<FilterGradTiling> tilings;
    try {
      tilings = filter_grad_tilings(s, ctx.cfg, op);
    } catch (const CompileError&) {
      if (parts == 1) throw;  // nothing fits
      continue;               // no chunk size that `parts` divides
    }
    const double sum = parts > 1 ? partial_sum_estimate(ctx.cfg, op, parts, p.mn, p.add_parts) : 0;
    for (const FilterGradTiling& t : tilings) candidates.push_back({parts, t, t.cycles + sum});
  }
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& a, const Candidate& b) { return a.cycles < b.cycles; });
  const int64_t rank = forced_plan_rank("NPUSIM_FILTER_GRAD_PLAN_RANK", op);
  if (rank > static_cast<int64_t>(candidates.size()))
    throw CompileError(fmt::format("{}: NPUSIM_FILTER_GRAD_PLAN_RANK={} but only {} plans fit", op,
                                   rank, candidates.size()));
  const Candidate& chosen = candidates[static_cast<size_t>(std::max<int64_t>(rank, 1) - 1)];
  p.tiling = chosen.tiling;
  p.cycles = chosen.cycles;
  const int64_t best_parts = chosen.parts;
  s.parts = best_parts;
  s.out_type = Dtype::F32;  // append_fused_filter_grad sets dW's type where one part writes it
  return p;
}

// Whether the fused filter gradient weighs the unfolded x against the width-folded view where
// the fold applies (width_fold_pays) and the chip prices the DMA's issue: the folded view's
// pixels overlap in GM (kw * c channels c apart), each a 32-byte run and a burst a plane, where
// the dense map's pixels are one run (the 7x7 stem over 3 channels). Elsewhere, or with
// NPUSIM_FILTER_GRAD_FOLD_ESTIMATE=0, the fold wherever it applies, as before. Read at every
// compile.
bool filter_grad_fold_by_estimate(const ChipConfig& cfg) {
  const char* v = std::getenv("NPUSIM_FILTER_GRAD_FOLD_ESTIMATE");
  return !(v && std::string(v) == "0") && (cfg.copy_issue_cycles > 0 || cfg.burst_cycles > 0);
}

// Whether the fused filter gradient's row view (row_view_switch) applies to x and filter f.
bool row_view_applies(const std::vector<int64_t>& x, const std::vector<int64_t>& f,
                      const ConvWindow& cw) {
  return x[3] == f[2] && cw.w.k == 1 && cw.w.s > 1 && cw.w.before == 0 && cw.w.after == 0 &&
         x[2] % cw.w.s == 0;
}

// The fused kernel's plan for dW: over the width-folded view where it applies, or (where
// filter_grad_fold_by_estimate) over the view of the lower estimate; the row view
// (row_view_applies, row_view_switch) where its estimate is the lower or it is forced.
FusedFilterGradPlan plan_fused_filter_grad(const CompileContext& ctx, const CubeTypes& ct,
                                           DataType dt, const std::vector<int64_t>& x,
                                           const std::vector<int64_t>& f, const ConvWindow& cw) {
  const RowView row_view =
      row_view_applies(x, f, cw)
          ? row_view_switch("NPUSIM_FILTER_GRAD_ROW_VIEW", ctx.cfg, ctx.op.str())
          : RowView::kOff;
  if (row_view != RowView::kOff) {
    FusedFilterGradPlan rows =
        plan_fused_filter_grad_view(ctx, ct, dt, x, f, cw, false, FilterGradView::kRows);
    if (row_view == RowView::kForced) return rows;
    FusedFilterGradPlan strided = plan_fused_filter_grad_view(ctx, ct, dt, x, f, cw, false);
    return rows.cycles < strided.cycles ? rows : strided;
  }
  FusedFilterGradPlan folded = plan_fused_filter_grad_view(ctx, ct, dt, x, f, cw, true);
  const bool fold_applies =
      x[3] == f[2] && width_fold_pays(x[3], cw.w.k, cw.w.before, cw.w.after, cw.w.d);
  if (!fold_applies || !filter_grad_fold_by_estimate(ctx.cfg)) return folded;
  FusedFilterGradPlan dense = plan_fused_filter_grad_view(ctx, ct, dt, x, f, cw, false);
  return dense.cycles < folded.cycles ? dense : folded;
}

// dW by the fused kernel as planned (plan_fused_filter_grad): f32 products of the parts into
// the workspace, then the Sum and the copy packing and casting them (append_partial_sum), or
// on split chips, where dW is f32 or f16 in whole 32-byte blocks, the kernel's own vector cores
// adding them (FilterGradSpec::add_parts; channel_epilogue_in_kernel, the channel sums'
// switch); one part writes dW itself where it can. Few input channels without padding along W
// take the width-folded view of x (as Conv2D: the same matrix in fewer channel blocks). Rows
// through the UB are whole 32-byte blocks: the f32 rows' pitch is cout rounded up to 8.
void append_fused_filter_grad(CompiledKernel& k, const CompileContext& ctx, const CubeTypes& ct,
                              const ArgRef& xr, const ArgRef& dyr, FusedFilterGradPlan p) {
  const std::string op = ctx.op.str();
  FilterGradSpec& s = p.spec;
  const FilterGradTiling& best = p.tiling;
  const DataType dt = k.outputs[0].dtype;
  if (s.parts == 1 && s.group_pitch == 0 && fused_writes_dw(ctx, ct, dt, s.cout, s.cg_out())) {
    s.out_type = device_dtype(dt);
    s.pitch = s.cout;
    k.launches.push_back(
        with_args(build_filter_grad(s, best, ctx.cfg, op), {xr, dyr, output_ref(0)}));
    return;
  }
  const ArgRef products = workspace_take(k, static_cast<uint64_t>(s.parts * p.mn) * 4);
  if (s.parts > 1 && p.add_parts) {
    s.add_parts = true;
    s.one_to_one_by_default = mix_one_to_one_asked(ctx.op, OneToOneMix::filter_grad);
    s.dw_type = device_dtype(dt);
    k.launches.push_back(
        with_args(build_filter_grad(s, best, ctx.cfg, op), {xr, dyr, products, output_ref(0)}));
    return;
  }
  k.launches.push_back(with_args(build_filter_grad(s, best, ctx.cfg, op), {xr, dyr, products}));
  if (s.group_pitch != 0)  // each row's groups: rows x groups runs of cg_out, group pitch apart
    append_partial_sum(k, ctx, products, s.parts, p.mn, ct.widen, p.rows * s.groups, s.cg_out(),
                       s.group_pitch);
  else
    append_partial_sum(k, ctx, products, s.parts, p.mn, ct.widen, p.rows, s.cout, s.pitch);
}

// NPUSIM_FILTER_GRAD_POINTWISE in the environment: the kernel of a 1x1 stride-1 filter
// gradient, `matmul` or `fused` (the fused kernel only where it adds its parts itself:
// filter_grad_parts_in_kernel); unset, empty or `auto`: the one of the lower modelled cycles.
// Anything else is a CompileError naming the op. Read at every compile: a measuring switch,
// to time both kernels of a layer against the planners' choice.
enum class PointwiseKernel { kAuto, kMatmul, kFused };

PointwiseKernel pointwise_filter_grad_kernel(const OpDesc& op) {
  const char* v = std::getenv("NPUSIM_FILTER_GRAD_POINTWISE");
  const std::string value = v ? v : "";
  if (value.empty() || value == "auto") return PointwiseKernel::kAuto;
  if (value == "matmul") return PointwiseKernel::kMatmul;
  if (value == "fused") return PointwiseKernel::kFused;
  op.fail(
      fmt::format("NPUSIM_FILTER_GRAD_POINTWISE='{}' is none of 'auto', 'matmul', 'fused'", value));
}

// Whether the pointwise filter gradient weighs the MatMul's estimate with the DMA's issue
// priced (MatmulTiling::issue_est_cycles) against the fused kernel's, which prices it
// (filter_grad_tilings); the two are the same where the chip prices no issue.
// NPUSIM_FILTER_GRAD_ISSUE_CHOICE=0: the MatMul's issue-free estimate, as before. Read at every
// compile.
bool filter_grad_issue_choice() {
  const char* v = std::getenv("NPUSIM_FILTER_GRAD_ISSUE_CHOICE");
  return !(v && std::string(v) == "0");
}

// Data inputs: input, out_backprop (filter_sizes as an attribute).
CompiledKernel compile_conv2d_backprop_filter(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 2)
    op.fail(fmt::format("takes input and out_backprop, {} inputs given", op.inputs.size()));
  require_rank4(op, 0, "input");
  require_rank4(op, 1, "out_backprop");
  const DataType dt = common_dtype(op, {0, 1});
  const std::vector<int64_t>& x = op.inputs[0].shape;
  const std::vector<int64_t> f = shape_attr(op, "filter_sizes");
  const std::vector<int64_t>& dy = op.inputs[1].shape;
  const int64_t groups = conv_groups(op, x[3], f);
  if (dy[0] != x[0] || dy[3] != f[3])
    op.invalid(fmt::format("out_backprop {} does not match batch {} / filter output channels {}",
                           shape_str(dy), x[0], f[3]));
  const ConvWindow cw = forward_window(op, x, f[0], f[1], &dy);
  CompiledKernel k;
  k.outputs = {TensorDesc{dt, f}};
  const CubeTypes ct = cube_types(ctx, dt);
  if (k.outputs[0].num_elements() == 0) return k;
  const int64_t positions = dy[0] * dy[1] * dy[2];
  if (positions == 0) {
    append_zero_output(k, op, k.outputs[0], ctx.cfg);
    return k;
  }
  // A 1x1 window of stride 1 without padding: img2col(x) is x itself ([N*H*W][Cin]), the
  // MatMul's operand, where its rows are whole 32-byte blocks through the UB (no l0c->gm path).
  // Every other window: the fused kernel (img2col by load3dt in L0A, append_fused_filter_grad).
  const bool via_ub = cube_store_via_ub(ctx.cfg, cube_core(ctx.cfg, op.str()), op.str());
  const bool blocks = !via_ub || f[2] % (layout::kBlockBytes / data_type_bytes(ct.cube)) == 0;
  // (the MatMul multiplies all of x's channels by all of dy's: one group)
  const bool pointwise = groups == 1 && blocks && f[0] == 1 && f[1] == 1 && cw.h.s == 1 &&
                         cw.w.s == 1 && cw.h.before + cw.h.after + cw.w.before + cw.w.after == 0;
  const ArgRef xr = cube_operand(k, ctx, ct, 0), dyr = cube_operand(k, ctx, ct, 1);
  if (!pointwise) {
    append_fused_filter_grad(k, ctx, ct, xr, dyr, plan_fused_filter_grad(ctx, ct, dt, x, f, cw));
    return k;
  }
  // The product x^T x dy: x [N*H*W][Cin] is img2col(x) (MatMul with transpose_a). Where the
  // fused kernel adds its parts in its own kernel (split chips), it computes the product too:
  // the one of the lower modelled cycles runs (the MatMul's tiling estimate with the DMA's issue,
  // filter_grad_issue_choice, and the Sum launch's where it is split, against the fused
  // kernel's; pointwise_filter_grad_kernel may name one).
  const int64_t cin = f[2];
  const KSplit split =
      plan_k_split(cin, f[3], positions, device_dtype(ct.cube), ct.fix_out, ctx.cfg, op.str());
  const double matmul_cycles =
      (filter_grad_issue_choice() ? split.tiling.issue_est_cycles : split.tiling.est_cycles) +
      (split.parts > 1 ? partial_sum_estimate(ctx.cfg, op.str(), split.parts, cin * f[3]) : 0);
  const PointwiseKernel forced = pointwise_filter_grad_kernel(op);
  if (forced != PointwiseKernel::kMatmul && filter_grad_parts_in_kernel(ctx, ct, dt, cin * f[3])) {
    // Unless forced or ranked (NPUSIM_FILTER_GRAD_PLAN_RANK, whose bad values are errors), a
    // fused kernel that does not plan (its one-part plan does not fit) leaves the MatMul.
    const bool ranked = forced_plan_rank("NPUSIM_FILTER_GRAD_PLAN_RANK", op.str()) > 0;
    std::optional<FusedFilterGradPlan> fused;
    try {
      fused = plan_fused_filter_grad(ctx, ct, dt, x, f, cw);
    } catch (const CompileError&) {
      if (forced == PointwiseKernel::kFused || ranked) throw;
    }
    if (fused && (forced == PointwiseKernel::kFused || fused->cycles < matmul_cycles)) {
      append_fused_filter_grad(k, ctx, ct, xr, dyr, *fused);
      return k;
    }
  }
  const MatmulTiling& t = split.tiling;
  if (split.parts > 1) {  // partials of cin x f[3] (plan_k_split: c_pitch == f[3])
    const int64_t mn = cin * f[3];
    const ArgRef partials = workspace_take(k, static_cast<uint64_t>(split.parts * mn) * 4);
    Launch mm = with_args(build_matmul_launch(t, ctx.cfg, op.str()), {xr, dyr, partials});
    mm.summary = fmt::format("x^T x dy, {} parts of {} positions (modelled ~{:.0f} cycles): {}",
                             split.parts, positions / split.parts, matmul_cycles, mm.summary);
    k.launches.push_back(std::move(mm));
    append_partial_sum(k, ctx, partials, split.parts, mn, ct.widen);
    return k;
  }
  ArgRef out = output_ref(0);
  if (ct.widen || t.c_pitch != f[3])
    out = workspace_take(k, static_cast<uint64_t>(cin * t.c_pitch) *
                                static_cast<uint64_t>(isa::dtype_size(ct.fix_out)));
  Launch mm = with_args(build_matmul_launch(t, ctx.cfg, op.str()), {xr, dyr, out});
  mm.summary = fmt::format("x^T x dy (modelled ~{:.0f} cycles): {}", matmul_cycles, mm.summary);
  k.launches.push_back(std::move(mm));
  const DataType from = ct.widen ? DataType::F16 : dt;
  if (t.c_pitch != f[3])  // per row: cout of c_pitch
    append_strided_copy(k, op, out, output_ref(0), cin, f[3], t.c_pitch, from, dt, ctx.cfg);
  else if (ct.widen)
    append_strided_copy(k, op, out, output_ref(0), 1, k.outputs[0].num_elements(),
                        k.outputs[0].num_elements(), DataType::F16, dt, ctx.cfg);
  return k;
}

// ---- depthwise ----

// The tallest output tile of the depthwise convolutions (CubeConvSpec::max_tile_height): twice
// MatMul's 256, so that a 56x56 map's 3,136 positions go in 7 tiles of 448 (2 slab loads of
// 8 rows become one of 10).
constexpr int64_t kDepthwiseMaxTileHeight = 2 * kMaxTile;

// NPUSIM_DEPTHWISE_GROUPS_PER_STEP=N in the environment: the depthwise convolutions' kernel
// serves N of its 16-channel groups per step (merge_diagonal_groups, at most the groups there
// are); unset or empty: 0, the planner chooses the count (append_cube_conv's
// diagonal_merge_max: the lowest estimate). A measuring switch, read at every compile;
// CompileError unless N is a positive integer.
int64_t depthwise_groups_per_step(const OpDesc& op, int64_t groups) {
  const char* v = std::getenv("NPUSIM_DEPTHWISE_GROUPS_PER_STEP");
  if (!v || !*v) return 0;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || n < 1)
    op.fail(fmt::format(
        "NPUSIM_DEPTHWISE_GROUPS_PER_STEP='{}' is not a positive count of 16-channel groups", v));
  return std::min<int64_t>(n, groups);
}

// NPUSIM_DEPTHWISE_TILE_ORDER in the environment: `spatial`, the depthwise convolutions' tiles
// go to the cube cores position-major (CubeConvSpec::tiles_spatial_major); unset, empty or
// `group`, weight-key-major as every cube convolution. A measuring switch like the one above
// (docs/validation.md, MobileNetV2 on the 310P: the order helps some layers and not others,
// and the planner does not model the L2 line fills that decide it), read at every compile;
// CompileError for any other value.
bool depthwise_tiles_spatial_major(const OpDesc& op) {
  const char* v = std::getenv("NPUSIM_DEPTHWISE_TILE_ORDER");
  if (!v || !*v || std::string_view(v) == "group") return false;
  if (std::string_view(v) == "spatial") return true;
  op.fail(fmt::format("NPUSIM_DEPTHWISE_TILE_ORDER='{}' is neither 'group' nor 'spatial'", v));
}

// DepthwiseConv2dNative, and DepthwiseConv2dBatchNormInference (x, filter, scale, offset, mean,
// variance[, bias]; epsilon, relu, relu6, Tx, Tout: the graph fusion of DepthwiseConv2dNative ->
// BatchNormInference): the depthwise convolution, then the batch norm's vector pass (fold,
// y = conv * a + shift, the activation, one rounding to Tout) as Conv2DBatchNormInference runs
// it where the cube has no bias for it: in the convolution's way out through the UB on coupled
// chips (a folded into the filter before its block-diagonal form, as for one group:
// y = sum x16 * f16(W * a) + shift), else as a launch of its own. x may be f16 (Tx: a fused
// producer's fp16 hand-off, what the cube reads), y f16 (Tout); filter and batch norm f32.
CompiledKernel compile_depthwise_forward(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const bool batch_norm = op.type == "DepthwiseConv2dBatchNormInference";
  if (batch_norm ? op.inputs.size() < 6 : op.inputs.size() != 2)
    op.fail(fmt::format("takes {} inputs, {} given", batch_norm ? "at least 6" : "2",
                        op.inputs.size()));
  require_rank4(op, 0, "input");
  require_rank4(op, 1, "filter");
  const DataType dt = common_dtype(
      op, batch_norm ? std::initializer_list<size_t>{1} : std::initializer_list<size_t>{0, 1});
  const DataType y_type = batch_norm ? batch_norm_conv_y_type(op, dt) : dt;
  const std::vector<int64_t>& x = op.inputs[0].shape;
  const std::vector<int64_t>& f = op.inputs[1].shape;
  const DepthwiseShapes d = depthwise_shapes(op, f, x[3]);
  const ConvWindow cw = forward_window(op, x, f[0], f[1], nullptr);
  CompiledKernel k;
  k.outputs = {TensorDesc{y_type, {x[0], cw.h.out, cw.w.out, d.c * d.m}}};
  const CubeTypes ct = cube_types(ctx, dt);
  if (k.outputs[0].num_elements() == 0) return k;
  BatchNormFold fold;
  const int residual = batch_norm ? batch_norm_conv_residual(op, k.outputs[0]) : -1;
  if (batch_norm) fold = append_batch_norm_fold(k, ctx, kBnScale, k.outputs[0].shape, residual);
  // x in f16 already (Tx = half) is what the cube reads.
  const ArgRef xr =
      op.inputs[0].dtype == DataType::F16 ? input_ref(0) : cube_operand(k, ctx, ct, 0);
  CubeConvSpec s;
  s.name = fmt::format("DepthwiseConv2dNative_{}", data_type_name(dt));
  s.images = x[0];
  s.hs = x[1];
  s.ws = x[2];
  s.cs = d.c;
  set_window(s, cw);
  s.groups = d.groups;
  s.cg_in = 16;
  s.cg_out = 16 * d.m;
  s.cy = d.c * d.m;
  s.b_mode = CubeConvSpec::BMode::kRowsK;
  s.b_tap = 256 * d.m;
  s.b_group = f[0] * f[1] * s.b_tap;
  s.b_row = 16 * d.m;
  s.tiles_spatial_major = depthwise_tiles_spatial_major(op);
  s.max_tile_height = kDepthwiseMaxTileHeight;
  const int64_t per_step = depthwise_groups_per_step(op, s.groups);
  if (per_step > 1) s = merge_diagonal_groups(s, per_step, op.str());
  // Unforced, the planner may merge as many groups as one n tile holds (tile_widths: a merged
  // group's columns are one tile of at most kMaxTile).
  const int64_t merge_max = per_step == 0 ? std::max<int64_t>(1, kMaxTile / s.cg_out) : 1;
  if (batch_norm && batch_norm_in_epilogue(ctx, s)) {
    // Through the UB, a folded into the filter as for one group (f16(W * a), then its
    // block-diagonal form, both derived from filter, scale and variance): the epilogue adds
    // the shift only, one f32 pass fewer per tile.
    const ArgRef wa = append_folded_filter(k, ctx, ct, fold.a, {f[0], f[1], f[2] * f[3]});
    const ArgRef wbd = append_blockdiag(k, ctx, ct, wa, {1, kBnScale, kBnVariance}, f[0] * f[1],
                                        depthwise_blockdiag(f));
    append_conv_then_batch_norm(k, ctx, ct, s, xr, wbd, fold, y_type, true, residual, merge_max);
    return k;
  }
  const ArgRef wbd = append_blockdiag(k, ctx, ct, 1, f[0] * f[1], depthwise_blockdiag(f));
  if (batch_norm)
    append_conv_then_batch_norm(k, ctx, ct, s, xr, wbd, fold, y_type, false, residual, merge_max);
  else
    append_cube_conv(k, ctx, ct, s, xr, wbd, nullptr, nullptr, nullptr, nullptr, nullptr,
                     merge_max);
  return k;
}

// Data inputs: filter, out_backprop (input_sizes as an attribute).
CompiledKernel compile_depthwise_backprop_input(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 2)
    op.fail(fmt::format("takes filter and out_backprop, {} inputs given", op.inputs.size()));
  require_rank4(op, 0, "filter");
  require_rank4(op, 1, "out_backprop");
  const DataType dt = common_dtype(op, {0, 1});
  const std::vector<int64_t> x = shape_attr(op, "input_sizes");
  const std::vector<int64_t>& f = op.inputs[0].shape;
  const std::vector<int64_t>& dy = op.inputs[1].shape;
  const DepthwiseShapes d = depthwise_shapes(op, f, x[3]);
  if (dy[0] != x[0] || dy[3] != d.c * d.m)
    op.invalid(fmt::format("out_backprop {} does not match batch {} and {} x {} channels",
                           shape_str(dy), x[0], d.c, d.m));
  const ConvWindow cw = forward_window(op, x, f[0], f[1], &dy);
  CompiledKernel k;
  k.outputs = {TensorDesc{dt, x}};
  const CubeTypes ct = cube_types(ctx, dt);
  if (k.outputs[0].num_elements() == 0) return k;
  if (op.inputs[1].num_elements() == 0) {
    append_zero_output(k, op, k.outputs[0], ctx.cfg);
    return k;
  }
  const ArgRef dyr = cube_operand(k, ctx, ct, 1);
  const ArgRef wbd = append_blockdiag(k, ctx, ct, 0, f[0] * f[1], depthwise_blockdiag(f));
  CubeConvSpec s;
  s.name = fmt::format("DepthwiseConv2dNativeBackpropInput_{}", data_type_name(dt));
  s.images = dy[0];
  s.hs = dy[1];
  s.ws = dy[2];
  s.cs = dy[3];
  set_transposed_window(s, cw, op);
  s.groups = d.groups;
  s.cg_in = 16 * d.m;
  s.cg_out = 16;
  s.cy = d.c;
  s.b_mode = CubeConvSpec::BMode::kRowsN;
  s.b_flip = true;
  s.b_tap = 256 * d.m;
  s.b_group = f[0] * f[1] * s.b_tap;
  s.b_row = 16 * d.m;
  append_cube_conv(k, ctx, ct, s, dyr, wbd);
  return k;
}

// Data inputs: input, out_backprop (filter_sizes as an attribute).
CompiledKernel compile_depthwise_backprop_filter(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 2)
    op.fail(fmt::format("takes input and out_backprop, {} inputs given", op.inputs.size()));
  require_rank4(op, 0, "input");
  require_rank4(op, 1, "out_backprop");
  const DataType dt = common_dtype(op, {0, 1});
  const std::vector<int64_t>& x = op.inputs[0].shape;
  const std::vector<int64_t> f = shape_attr(op, "filter_sizes");
  const std::vector<int64_t>& dy = op.inputs[1].shape;
  const DepthwiseShapes d = depthwise_shapes(op, f, x[3]);
  const int64_t cm = d.c * d.m;
  if (dy[0] != x[0] || dy[3] != cm)
    op.invalid(fmt::format("out_backprop {} does not match batch {} and {} x {} channels",
                           shape_str(dy), x[0], d.c, d.m));
  const ConvWindow cw = forward_window(op, x, f[0], f[1], &dy);
  CompiledKernel k;
  k.outputs = {TensorDesc{dt, f}};
  const CubeTypes ct = cube_types(ctx, dt);
  if (k.outputs[0].num_elements() == 0) return k;
  const int64_t pixels = dy[0] * dy[1] * dy[2], taps = f[0] * f[1];
  if (pixels == 0) {
    append_zero_output(k, op, k.outputs[0], ctx.cfg);
    return k;
  }
  // img2col(x) with each channel repeated M times, tap-major [taps][P][cp], cp = CM padded to
  // whole blocks of both operand types; dy in the same channel layout.
  const int64_t cp = (cm + 15) / 16 * 16;
  const ArgRef xr = cube_operand(k, ctx, ct, 0);
  const ArgRef cols =
      append_img2col(k, ctx, xr, x, ct.cube, cw, d.m, cp, pixels * cp, taps * pixels * cp);
  ArgRef dyp = input_ref(1);
  if (cp != cm) {
    dyp = workspace_take(k, static_cast<uint64_t>(pixels * cp * data_type_bytes(dt)));
    append_channel_pad(k, op, input_ref(1), dyp, pixels, cm, cp, dt, ctx.cfg);
  }
  ChannelSumSpec s;
  s.kind = ChannelSumSpec::Kind::kSumProduct;
  s.a_type = device_dtype(ct.cube);
  s.b_type = device_dtype(dt);
  s.batch = taps;
  s.pixels = pixels;
  s.cp = cp;
  s.a_batch_stride = pixels * cp;
  ChannelSumLaunch sum = build_channel_sum(s, ctx.cfg, op.str());
  const ArgRef partials = workspace_take(k, static_cast<uint64_t>(taps * sum.blocks * cp) * 4);
  k.launches.push_back(with_args(std::move(sum.launch), {cols, dyp, partials}));
  ChannelEpilogueSpec e;
  e.name = "DepthwiseFilterGrad";
  e.c = cm;
  e.batch = taps;
  e.partial_cp = cp;
  e.partial_blocks = {sum.blocks};
  e.outputs = 1;
  e.out_pitch = cp;
  e.compute = [](KernelBuilder& b, const EpilogueOperands& o) {
    f32_copy(b, o.outputs[0], o.sums[0], *o.count);
  };
  const ArgRef df = workspace_take(k, static_cast<uint64_t>(taps * cp) * 4);
  k.launches.push_back(with_args(build_channel_epilogue(e, ctx.cfg, op.str()), {partials, df}));
  append_strided_copy(k, op, df, output_ref(0), taps, cm, cp, DataType::F32, dt, ctx.cfg);
  return k;
}

}  // namespace

CompiledKernel compile_conv2d(const CompileContext& ctx) {
  const std::string& t = ctx.op.type;
  // TF's full input list: the shape tensor is checked and dropped (its value is an attribute).
  const bool grad_input = t == "Conv2DBackpropInput" || t == "DepthwiseConv2dNativeBackpropInput";
  const bool grad_filter =
      t == "Conv2DBackpropFilter" || t == "DepthwiseConv2dNativeBackpropFilter";
  if ((grad_input || grad_filter) && ctx.op.inputs.size() == 3) {
    const size_t i = grad_input ? 0 : 1;
    check_shape_tensor(ctx.op, i, grad_input ? "input_sizes" : "filter_sizes");
    return compile_without_inputs(ctx, {i}, compile_conv2d);
  }
  if (t == "Conv2D" || t == "Conv2DBatchNormInference" || t == "Conv2DBiasAdd" ||
      t == "Conv2DBNTrainingReduce")
    return compile_conv2d_forward(ctx);
  if (t == "Conv2DBackpropInput") return compile_conv2d_backprop_input(ctx);
  if (t == "Conv2DBackpropFilter") return compile_conv2d_backprop_filter(ctx);
  if (t == "DepthwiseConv2dNative" || t == "DepthwiseConv2dBatchNormInference")
    return compile_depthwise_forward(ctx);
  if (t == "DepthwiseConv2dNativeBackpropInput") return compile_depthwise_backprop_input(ctx);
  if (t == "DepthwiseConv2dNativeBackpropFilter") return compile_depthwise_backprop_filter(ctx);
  ctx.op.fail("not a conv2d-family op");
}

}  // namespace npusim::compiler::ops
