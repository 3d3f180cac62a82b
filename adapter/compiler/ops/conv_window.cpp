// Window geometry of the convolution family (ops/conv.h): TF's window attributes resolved for
// one spatial input size; and the filter_layout attribute (filter_layout_n16).
#include <algorithm>

#include <fmt/format.h>

#include "adapter/compiler/ops/conv.h"
#include "common/int_math.h"

namespace npusim::compiler::ops {

// ---- window geometry ----

ConvWindow conv_window(const OpDesc& op, int64_t in_h, int64_t in_w, int64_t kh, int64_t kw,
                       bool pooling) {
  const std::string fmt_attr = op.attr_string("data_format", "NHWC");
  if (fmt_attr != "NHWC")
    op.fail(fmt::format("data_format {} is not supported (NHWC only)", fmt_attr));
  auto four = [&](const char* name, bool required) {
    std::vector<int64_t> v = op.attr_ints(name);
    if (v.empty() && !required) return std::vector<int64_t>{1, 1, 1, 1};
    if (v.size() != 4)
      op.invalid(
          fmt::format("attribute {} must have 4 entries (N, H, W, C), got {}", name, v.size()));
    if (v[0] != 1 || v[3] != 1)
      op.fail(fmt::format("attribute {} = {}: only H and W may differ from 1", name, shape_str(v)));
    for (int64_t x : v)
      if (x < 1) op.invalid(fmt::format("attribute {} = {} must be positive", name, shape_str(v)));
    return v;
  };
  ConvWindow cw;
  const std::vector<int64_t> strides = four("strides", true);
  std::vector<int64_t> dil{1, 1, 1, 1};
  if (pooling) {
    const std::vector<int64_t> ks = four("ksize", true);
    kh = ks[1];
    kw = ks[2];
  } else {
    dil = four("dilations", false);
  }
  cw.padding = op.attr_string("padding", "");
  if (cw.padding != "SAME" && cw.padding != "VALID" && cw.padding != "EXPLICIT")
    op.fail(fmt::format("padding '{}' is not supported (SAME, VALID, EXPLICIT)", cw.padding));
  std::vector<int64_t> ex = op.attr_ints("explicit_paddings");
  if (cw.padding == "EXPLICIT") {
    if (ex.size() != 8)
      op.invalid(fmt::format("explicit_paddings must have 8 entries, got {}", ex.size()));
    if (ex[0] || ex[1] || ex[6] || ex[7]) op.fail("explicit_paddings on N or C are not supported");
    for (int64_t p : ex)
      if (p < 0) op.invalid("explicit_paddings must be non-negative");
  }
  auto dim = [&](int64_t in, int64_t k, int64_t s, int64_t d, int idx) {
    WindowDim r{in, k, s, d, 0, 0, 0};
    const int64_t ek = r.extent();
    if (cw.padding == "VALID") {
      r.out = in >= ek ? (in - ek) / s + 1 : 0;
    } else if (cw.padding == "SAME") {
      r.out = ceil_div(in, s);
      const int64_t total = std::max<int64_t>((r.out - 1) * s + ek - in, 0);
      r.before = total / 2;
      r.after = total - r.before;
    } else {
      r.before = ex[static_cast<size_t>(2 * idx)];
      r.after = ex[static_cast<size_t>(2 * idx + 1)];
      r.out = in + r.before + r.after >= ek ? (in + r.before + r.after - ek) / s + 1 : 0;
    }
    return r;
  };
  if (kh < 1 || kw < 1) op.invalid(fmt::format("window {}x{} must be at least 1x1", kh, kw));
  cw.h = dim(in_h, kh, strides[1], dil[1], 1);
  cw.w = dim(in_w, kw, strides[2], dil[2], 2);
  return cw;
}

bool filter_layout_n16(const OpDesc& op) {
  const std::string layout = op.attr_string("filter_layout", "HWIO");
  if (layout == kFilterLayoutN16) return true;
  if (layout != "HWIO")
    op.invalid(fmt::format("attribute filter_layout = '{}' is neither 'HWIO' nor '{}'", layout,
                           kFilterLayoutN16));
  return false;
}

}  // namespace npusim::compiler::ops
