// MaxPool, AvgPool, MaxPoolGrad and AvgPoolGrad compiled for the tiny chip and run on the chip
// model, against direct references written here in double from the exact inputs.
//
// Tolerances (the kernels compute in f32, f16/bf16 widened exactly and rounded once at the end,
// except MaxPoolGrad, which computes in the tensor's type):
//   MaxPool: the result is one of the inputs: exact.
//   MaxPoolGrad: each input gets the sum of the dy values routed to it (first maximum of each
//     window in scan order, TF's CPU rule): T additions in the tensor's type (as TF's CPU
//     kernel, in another order), T * u * S with u the type's unit roundoff (2^-24, 2^-11 f16,
//     2^-8 bf16) and S = sum |dy|, plus half an ulp of the output type.
//   AvgPool: y = sum(x) * r_h * r_w with r_h, r_w the f32-rounded reciprocals of the valid rows
//     and columns: K additions (K * 2^-24 * S, S = sum |x| / count) and two rounded reciprocals
//     and products (4 * 2^-24 * S), plus half an ulp of the output type.
//   AvgPoolGrad: dx = sum over windows of dy * r_h * r_w: per term 4 * 2^-24 relative, T
//     additions: (T + 4) * 2^-24 * S with S = sum |dy| / count, plus half an ulp.
// Each bound is doubled for slack.
#include <catch2/catch.hpp>

#include <cmath>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

double half_ulp(DataType t) {
  switch (t) {
    case DataType::F16: return std::ldexp(1.0, -11);
    case DataType::BF16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

struct PoolCase {
  int64_t n, h, w, c, kh, kw, sh, sw;
  std::string padding;
  // TF padding (tensorflow/core/framework/kernel_shape_util.cc), written out independently.
  int64_t out(int64_t in, int64_t k, int64_t s) const {
    return padding == "VALID" ? (in - k + s) / s : (in + s - 1) / s;
  }
  int64_t before(int64_t in, int64_t k, int64_t s) const {
    if (padding == "VALID") return 0;
    return std::max<int64_t>((out(in, k, s) - 1) * s + k - in, 0) / 2;
  }
  int64_t oh() const { return out(h, kh, sh); }
  int64_t ow() const { return out(w, kw, sw); }
  int64_t pt() const { return before(h, kh, sh); }
  int64_t pl() const { return before(w, kw, sw); }
  std::vector<int64_t> x_shape() const { return {n, h, w, c}; }
  std::vector<int64_t> y_shape() const { return {n, oh(), ow(), c}; }
  std::map<std::string, compiler::AttrValue> attrs() const {
    return {{"ksize", std::vector<int64_t>{1, kh, kw, 1}},
            {"strides", std::vector<int64_t>{1, sh, sw, 1}},
            {"padding", padding},
            {"data_format", std::string("NHWC")}};
  }
  // Visits the valid taps of every window: f(window flat index without channel, x flat index
  // without channel), windows in order and taps in scan order (rows, then columns).
  template <typename F>
  void for_each_tap(F&& f) const {
    for (int64_t b = 0; b < n; ++b)
      for (int64_t y = 0; y < oh(); ++y)
        for (int64_t x = 0; x < ow(); ++x)
          for (int64_t i = 0; i < kh; ++i)
            for (int64_t j = 0; j < kw; ++j) {
              const int64_t r = y * sh - pt() + i, q = x * sw - pl() + j;
              if (r < 0 || r >= h || q < 0 || q >= w) continue;
              f((b * oh() + y) * ow() + x, (b * h + r) * w + q);
            }
  }
  std::string str() const {
    return "[" + std::to_string(n) + "," + std::to_string(h) + "," + std::to_string(w) + "," +
           std::to_string(c) + "] window " + std::to_string(kh) + "x" + std::to_string(kw) +
           " stride " + std::to_string(sh) + "x" + std::to_string(sw) + " " + padding;
  }
};

struct Ref {
  std::vector<double> v, s;
  std::vector<int64_t> t;
  explicit Ref(size_t size) : v(size, 0), s(size, 0), t(size, 0) {}
};

// term_unit: the rounding of one addition, relative to the sum of magnitudes (2^-24: f32).
void check(const std::vector<double>& got, const Ref& r, DataType dt, double extra_terms,
           bool exact, const std::string& what, double term_unit = std::ldexp(1.0, -24)) {
  REQUIRE(got.size() == r.v.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = exact ? r.v[i] : r.v[i];
    double tol = exact ? 0
                       : 2 * ((static_cast<double>(r.t[i]) + extra_terms) * term_unit * r.s[i] +
                              half_ulp(dt) * std::fabs(want));
    if (!(std::fabs(got[i] - want) <= tol) && bad++ < 5)
      UNSCOPED_INFO(what << "[" << i << "] = " << got[i] << ", want " << want << " +- " << tol);
  }
  CHECK(bad == 0);
}

compiler::CompiledKernel compile_op(const compiler::OpDesc& op) {
  compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
  for (const compiler::Launch& l : k.launches) UNSCOPED_INFO(l.summary);
  return k;
}

void check_forward(bool is_max, DataType dt, const PoolCase& p, uint32_t seed) {
  INFO((is_max ? "MaxPool " : "AvgPool ") << compiler::data_type_name(dt) << " " << p.str());
  // Values on a coarse grid so that windows contain ties (MaxPool picks any of them).
  HostTensor x = random_tensor(dt, p.x_shape(), -4, 4, seed);
  for (double& v : x.values) v = std::round(v * 4) / 4;
  auto k = compile_op(make_op(is_max ? "MaxPool" : "AvgPool", {x.desc}, p.attrs()));
  REQUIRE(k.outputs[0] == (TensorDesc{dt, p.y_shape()}));
  RunResult r = run_compiled(test_sim(), k, {x});
  Ref ref(static_cast<size_t>(k.outputs[0].num_elements()));
  std::vector<double> mx(ref.v.size(), -INFINITY);
  std::vector<int64_t> count(ref.v.size() / static_cast<size_t>(p.c), 0);
  p.for_each_tap([&](int64_t yo, int64_t xi) {
    ++count[static_cast<size_t>(yo)];
    for (int64_t c = 0; c < p.c; ++c) {
      const size_t o = static_cast<size_t>(yo * p.c + c);
      const double v = x.values[static_cast<size_t>(xi * p.c + c)];
      mx[o] = std::max(mx[o], v);
      ref.v[o] += v;
      ref.s[o] += std::fabs(v);
      ++ref.t[o];
    }
  });
  for (size_t o = 0; o < ref.v.size(); ++o) {
    const double cnt = static_cast<double>(count[o / static_cast<size_t>(p.c)]);
    if (is_max) {
      ref.v[o] = mx[o];
    } else {
      ref.v[o] = round_to(dt, ref.v[o] / cnt);
      ref.s[o] /= cnt;
    }
  }
  check(r.outputs[0].values, ref, dt, 4, is_max, "y");
}

// cfg: the chip the kernel is compiled for (default: the test chip's), run on the test chip.
void check_max_grad(DataType dt, const PoolCase& p, uint32_t seed,
                    const ChipConfig* cfg = nullptr, const std::string& summary_has = "") {
  INFO("MaxPoolGrad " << compiler::data_type_name(dt) << " " << p.str());
  HostTensor x = random_tensor(dt, p.x_shape(), -2, 2, seed);
  for (double& v : x.values) v = std::round(v * 2) / 2;  // ties: the first maximum wins
  HostTensor dy = random_tensor(dt, p.y_shape(), -1, 1, seed + 1);
  // orig_output = MaxPool(x), computed here.
  HostTensor y{TensorDesc{dt, p.y_shape()}, std::vector<double>(dy.values.size(), -INFINITY)};
  p.for_each_tap([&](int64_t yo, int64_t xi) {
    for (int64_t c = 0; c < p.c; ++c) {
      double& m = y.values[static_cast<size_t>(yo * p.c + c)];
      m = std::max(m, x.values[static_cast<size_t>(xi * p.c + c)]);
    }
  });
  const compiler::OpDesc op = make_op("MaxPoolGrad", {x.desc, y.desc, dy.desc}, p.attrs());
  auto k = cfg ? compiler::compile(op, *cfg) : compile_op(op);
  REQUIRE(k.outputs[0] == x.desc);
  if (!summary_has.empty()) {
    std::string summaries;  // the pooling launch's, among the channel-padding copies
    for (const compiler::Launch& l : k.launches) summaries += l.summary + "\n";
    CHECK_THAT(summaries, Catch::Contains(summary_has));
  }
  RunResult r = run_compiled(test_sim(), k, {x, y, dy});
  Ref ref(x.values.size());
  std::vector<bool> done(dy.values.size(), false);
  p.for_each_tap([&](int64_t yo, int64_t xi) {
    for (int64_t c = 0; c < p.c; ++c) {
      const size_t o = static_cast<size_t>(yo * p.c + c), i = static_cast<size_t>(xi * p.c + c);
      if (done[o] || x.values[i] != y.values[o]) continue;
      done[o] = true;
      ref.v[i] += dy.values[o];
      ref.s[i] += std::fabs(dy.values[o]);
      ++ref.t[i];
    }
  });
  for (double& v : ref.v) v = round_to(dt, v);
  check(r.outputs[0].values, ref, dt, 0, false, "dx", half_ulp(dt));
}

void check_avg_grad(DataType dt, const PoolCase& p, uint32_t seed) {
  INFO("AvgPoolGrad " << compiler::data_type_name(dt) << " " << p.str());
  HostTensor sizes{TensorDesc{DataType::S32, {4}},
                   {double(p.n), double(p.h), double(p.w), double(p.c)}};
  HostTensor dy = random_tensor(dt, p.y_shape(), -1, 1, seed);
  auto op = make_op("AvgPoolGrad", {sizes.desc, dy.desc}, p.attrs());
  op.attrs["orig_input_shape"] = p.x_shape();
  auto k = compile_op(op);
  REQUIRE(k.outputs[0] == (TensorDesc{dt, p.x_shape()}));
  RunResult r = run_compiled(test_sim(), k, {sizes, dy});
  std::vector<int64_t> count(dy.values.size() / static_cast<size_t>(p.c), 0);
  p.for_each_tap([&](int64_t yo, int64_t) { ++count[static_cast<size_t>(yo)]; });
  Ref ref(static_cast<size_t>(k.outputs[0].num_elements()));
  p.for_each_tap([&](int64_t yo, int64_t xi) {
    for (int64_t c = 0; c < p.c; ++c) {
      const double v = dy.values[static_cast<size_t>(yo * p.c + c)] /
                       static_cast<double>(count[static_cast<size_t>(yo)]);
      const size_t i = static_cast<size_t>(xi * p.c + c);
      ref.v[i] += v;
      ref.s[i] += std::fabs(v);
      ++ref.t[i];
    }
  });
  for (double& v : ref.v) v = round_to(dt, v);
  check(r.outputs[0].values, ref, dt, 4, false, "dx");
}

const PoolCase kCases[] = {
    {2, 7, 6, 5, 3, 3, 2, 2, "SAME"},    // channels not whole blocks (padded copy)
    {1, 9, 8, 16, 3, 2, 1, 2, "VALID"},  // f16: one block per pixel
    {2, 5, 7, 24, 2, 2, 2, 1, "SAME"},
    {1, 6, 6, 8, 6, 6, 1, 1, "VALID"},   // global pooling
    {1, 8, 9, 136, 3, 3, 2, 2, "SAME"},  // 136 channels: two 64-lane parts per pixel in f32
    {2, 1, 1, 5, 3, 3, 1, 1, "SAME"},    // the window larger than the image
    {1, 5, 8, 40, 2, 2, 2, 3, "VALID"},  // stride > window: some inputs get no gradient
};

}  // namespace

TEST_CASE("MaxPool and AvgPool: f32, f16, bf16, SAME/VALID, strides, odd sizes") {
  uint32_t seed = 1;
  for (const PoolCase& p : kCases) {
    check_forward(true, DataType::F32, p, seed++);
    check_forward(false, DataType::F32, p, seed++);
  }
  check_forward(true, DataType::F16, kCases[0], seed++);
  check_forward(false, DataType::F16, kCases[1], seed++);
  check_forward(true, DataType::BF16, kCases[2], seed++);
  check_forward(false, DataType::BF16, kCases[0], seed++);
}

TEST_CASE("MaxPool: window rows in the tensor's type, bands, carried x rows") {
  // Every case in every type (the max is exact: y equals the reference bit for bit), and
  // ResNet-50's stem pool shape at a small size: several bands of window rows per image, the
  // kh - sh rows two window rows share carried by V where MTE2 bounds the window row (the tiny
  // chip's config), the bottom padding row of SAME filled with -inf.
  uint32_t seed = 300;
  for (const PoolCase& p : kCases)
    for (DataType dt : {DataType::F16, DataType::BF16}) check_forward(true, dt, p, seed++);
  const PoolCase stem{2, 20, 18, 64, 3, 3, 2, 2, "SAME"};
  for (DataType dt : {DataType::F16, DataType::F32}) check_forward(true, dt, stem, seed++);
  HostTensor x = random_tensor(DataType::F16, stem.x_shape(), -1, 1, seed);
  const auto k = compile_op(make_op("MaxPool", {x.desc}, stem.attrs()));
  REQUIRE(k.launches.size() == 1);
  CHECK_THAT(k.launches[0].summary, Catch::Contains("band of"));
  if (test_sim().config().name == "tiny")
    CHECK_THAT(k.launches[0].summary, Catch::Contains("band of 5 window rows") &&
                                          Catch::Contains("x rows carried"));
}

TEST_CASE("MaxPoolGrad routes each window's gradient to its first maximum") {
  uint32_t seed = 100;
  for (const PoolCase& p : kCases) check_max_grad(DataType::F32, p, seed++);
  check_max_grad(DataType::F16, kCases[0], seed++);
  check_max_grad(DataType::BF16, kCases[2], seed++);
  check_max_grad(DataType::F16, kCases[4], seed++);  // two 64-lane parts, SAME padding rows
  // Bands of window rows (fewer images than cores): the rows a band shares with the one before
  // rebuilt from the earlier window rows; row counts that divide neither the band nor the stride.
  const PoolCase banded[] = {
      {3, 13, 11, 64, 3, 3, 2, 2, "SAME"},
      {2, 12, 10, 32, 3, 3, 2, 2, "VALID"},  // row 11 and column 9 in no window: zero
      {1, 17, 9, 16, 3, 3, 1, 1, "SAME"},    // each dx row in three window rows
      {2, 11, 7, 8, 2, 3, 3, 2, "VALID"},    // window rows apart: rows in no window between
      {1, 15, 6, 24, 5, 2, 2, 1, "SAME"},
  };
  for (const PoolCase& p : banded) {
    check_max_grad(DataType::F32, p, seed++);
    check_max_grad(DataType::F16, p, seed++);
  }
  check_max_grad(DataType::BF16, banded[0], seed++);
  // The same on a chip whose GM->UB path is slow: MTE2 bounds the window row, so V copies the
  // x rows two window rows share instead of MTE2 loading them again (pool.cpp carry_x_rows).
  ChipConfig slow = test_sim().config();
  slow.path_bytes_per_cycle[{isa::Buf::GM, isa::Buf::UB}] = 1;
  for (const PoolCase& p : banded) {
    const bool shares = p.kh > p.sh;
    check_max_grad(DataType::F32, p, seed++, &slow, shares ? "x rows carried" : "");
    check_max_grad(DataType::F16, p, seed++, &slow, shares ? "x rows carried" : "");
  }
}

TEST_CASE("MaxPoolGrad f16/bf16 hold twice the f32 kernel's channels at ResNet-50's pool") {
  // ResNet-50's stem pool (3x3 stride 2 VALID over the padded 114x114x64 map), few rows. The
  // kernel computes in the tensor's type, so its UB rows take ct * size bytes: on the tiny chip
  // f32 fits 32 channels per pixel, f16 and bf16 all 64 (one dx set: pool.cpp). Where the
  // vector unit has no bf16 arithmetic (the presets) bf16 runs the f32 kernel between Casts.
  const PoolCase p{1, 7, 114, 64, 3, 3, 2, 2, "VALID"};
  const bool bf16_in_f32 = !test_sim().config().vector_bf16_arithmetic;
  auto summary = [&](DataType dt) {
    HostTensor x = random_tensor(dt, p.x_shape(), -1, 1, 1);
    HostTensor y = random_tensor(dt, p.y_shape(), -1, 1, 2);
    auto k = compile_op(make_op("MaxPoolGrad", {x.desc, y.desc, y.desc}, p.attrs()));
    const bool in_f32 = dt == DataType::BF16 && bf16_in_f32;  // 3 Casts in, the pool, 1 out
    REQUIRE(k.launches.size() == (in_f32 ? 5 : 1));
    return k.launches[in_f32 ? 3 : 0].summary;
  };
  CHECK_THAT(summary(DataType::F32), Catch::Contains("x 32 channels"));
  CHECK_THAT(summary(DataType::F16), Catch::Contains("x 64 channels"));
  CHECK_THAT(summary(DataType::BF16),
             Catch::Contains(bf16_in_f32 ? "MaxPoolGrad f32" : "x 64 channels"));
  uint32_t seed = 300;
  check_max_grad(DataType::F16, p, seed++);
  check_max_grad(DataType::BF16, p, seed++);
}

TEST_CASE("AvgPoolGrad spreads dy / count over each window") {
  uint32_t seed = 200;
  for (const PoolCase& p : kCases) check_avg_grad(DataType::F32, p, seed++);
  check_avg_grad(DataType::F16, kCases[0], seed++);
  check_avg_grad(DataType::BF16, kCases[1], seed++);
}

TEST_CASE("Pooling: empty outputs, errors") {
  HostTensor x = random_tensor(DataType::F32, {1, 2, 2, 3}, -1, 1, 7);
  PoolCase big{1, 2, 2, 3, 3, 3, 1, 1, "VALID"};  // the window does not fit: empty output
  auto k = compiler::compile(make_op("MaxPool", {x.desc}, big.attrs()), test_sim().config());
  CHECK(k.launches.empty());
  CHECK(k.outputs[0].shape == std::vector<int64_t>{1, 0, 0, 3});
  auto bad = big.attrs();
  bad["data_format"] = std::string("NCHW");
  CHECK_THROWS_WITH(compiler::compile(make_op("MaxPool", {x.desc}, bad), test_sim().config()),
                    Catch::Contains("NCHW"));
  bad = big.attrs();
  bad["ksize"] = std::vector<int64_t>{2, 1, 1, 1};
  CHECK_THROWS_WITH(compiler::compile(make_op("AvgPool", {x.desc}, bad), test_sim().config()),
                    Catch::Contains("ksize"));
}
