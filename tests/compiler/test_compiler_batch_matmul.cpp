// BatchMatMulV2 / BatchMatMul / Einsum (ops/batch_matmul.cpp on ops/matmul.*) compiled for the
// test chip (compiler_test_util.h) and run on the chip model, against products summed in double from the exact inputs.
//
// Tolerance per output element (as test_compiler_matmul.cpp derives it), with
// S = sum_k |x_ik * y_kj| and K the contracted size:
//   fp32 accumulation on the cube: at most (K + 1) * 2^-24 * S;
//   output rounding: half an ulp of the output type (2^-11 |c| f16, 2^-8 |c| bf16, 2^-24 f32);
//   f32 inputs cast to f16 (allow_fp32_to_fp16): 2^-10 * S;
// doubled for slack. Transposes around the product (Einsum) move data exactly.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>
#include <map>

#include "adapter/compiler/compiler.h"
#include "isa/layout.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::PrecisionMode;
using compiler::TensorDesc;
using Shape = std::vector<int64_t>;

namespace {

double out_half_ulp(DataType t) {
  switch (t) {
    case DataType::F16: return std::ldexp(1.0, -11);
    case DataType::BF16: return std::ldexp(1.0, -8);
    default: return std::ldexp(1.0, -24);
  }
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Compares r with the reference products: want[f] = sum over the k terms of term(f, k), with
// the tolerance above.
void check_products(const RunResult& r, DataType dt, PrecisionMode mode, int64_t kdim,
                    const std::function<std::pair<double, double>(int64_t f, int64_t k)>& term) {
  const bool f16_inputs = dt == DataType::F32 && mode != PrecisionMode::kKeepFp32;
  int bad = 0;
  const std::vector<double>& got = r.outputs[0].values;
  for (int64_t f = 0; f < static_cast<int64_t>(got.size()); ++f) {
    double sum = 0, s_abs = 0;
    for (int64_t k = 0; k < kdim; ++k) {
      auto [a, b] = term(f, k);
      sum += a * b;
      s_abs += std::fabs(a * b);
    }
    double tol = static_cast<double>(kdim + 1) * std::ldexp(1.0, -24) * s_abs +
                 out_half_ulp(dt) * std::fabs(sum);
    if (f16_inputs) tol += std::ldexp(1.0, -10) * s_abs;
    tol *= 2;
    if (!(std::fabs(got[static_cast<size_t>(f)] - sum) <= tol) && bad++ < 5)
      UNSCOPED_INFO("element " << f << " = " << got[static_cast<size_t>(f)] << ", want " << sum
                               << " +- " << tol);
  }
  CHECK(bad == 0);
}

// BatchMatMulV2 of x [bx..., M, K] (adj_x: [..., K, M]) and y [by..., K, N] (adj_y: [..., N, K]).
void check_bmm(const char* op_name, DataType dt, Shape bx, Shape by, int64_t m, int64_t k,
               int64_t n, bool adj_x, bool adj_y, PrecisionMode mode, uint32_t seed) {
  Shape xs = bx, ys = by;
  xs.insert(xs.end(), adj_x ? std::initializer_list<int64_t>{k, m}
                            : std::initializer_list<int64_t>{m, k});
  ys.insert(ys.end(), adj_y ? std::initializer_list<int64_t>{n, k}
                            : std::initializer_list<int64_t>{k, n});
  INFO(op_name << " " << compiler::data_type_name(dt) << " x " << compiler::shape_str(xs)
               << " y " << compiler::shape_str(ys) << " adj " << adj_x << adj_y << " mode "
               << compiler::precision_mode_name(mode));
  HostTensor x = random_tensor(dt, xs, -2, 2, seed), y = random_tensor(dt, ys, -2, 2, seed + 1);
  auto op = make_op(op_name, {x.desc, y.desc}, {{"adj_x", adj_x}, {"adj_y", adj_y}});
  // A type the chip's cube does not multiply (bf16, or f32 kept f32, on the 910 and 310P):
  // the compiler's refusal instead of a product.
  const std::string refusal = cube_type_refusal(test_sim().config(), dt, mode);
  if (!refusal.empty()) {
    CHECK_THROWS_WITH(compiler::compile(op, test_sim().config(), mode), Catch::Contains(refusal));
    return;
  }
  compiler::CompiledKernel kern = compiler::compile(op, test_sim().config(), mode);
  for (const compiler::Launch& l : kern.launches) UNSCOPED_INFO(l.summary);
  Shape batch = *compiler::broadcast_shapes(bx, by);
  Shape out = batch;
  out.insert(out.end(), {m, n});
  REQUIRE(kern.outputs[0] == TensorDesc{dt, out});
  RunResult r = run_compiled(test_sim(), kern, {x, y});
  auto ix = broadcast_index(bx, batch), iy = broadcast_index(by, batch);
  check_products(r, dt, mode, k, [&](int64_t f, int64_t kk) {
    const int64_t b = f / (m * n), i = f / n % m, j = f % n;
    const int64_t xb = static_cast<int64_t>(ix.empty() ? 0 : ix[static_cast<size_t>(b)]);
    const int64_t yb = static_cast<int64_t>(iy.empty() ? 0 : iy[static_cast<size_t>(b)]);
    const double a = x.values[static_cast<size_t>(xb * m * k + (adj_x ? kk * m + i : i * k + kk))];
    const double c = y.values[static_cast<size_t>(yb * k * n + (adj_y ? j * k + kk : kk * n + j))];
    return std::make_pair(a, c);
  });
}

// Einsum with two operands, reference by label sums.
void check_einsum(const std::string& eq, DataType dt, const std::map<char, int64_t>& sizes,
                  uint32_t seed, PrecisionMode mode = PrecisionMode::kKeepFp32) {
  INFO(eq << " " << compiler::data_type_name(dt));
  const size_t arrow = eq.find("->"), comma = eq.find(',');
  const std::string lx = eq.substr(0, comma), ly = eq.substr(comma + 1, arrow - comma - 1),
                    lo = eq.substr(arrow + 2);
  auto shape_of = [&](const std::string& l) {
    Shape s;
    for (char c : l) s.push_back(sizes.at(c));
    return s;
  };
  HostTensor x = random_tensor(dt, shape_of(lx), -2, 2, seed);
  HostTensor y = random_tensor(dt, shape_of(ly), -2, 2, seed + 1);
  compiler::CompiledKernel kern = compiler::compile(
      make_op("Einsum", {x.desc, y.desc}, {{"equation", eq}}), test_sim().config(), mode);
  for (const compiler::Launch& l : kern.launches) UNSCOPED_INFO(l.summary);
  REQUIRE(kern.outputs[0] == TensorDesc{dt, shape_of(lo)});
  RunResult r = run_compiled(test_sim(), kern, {x, y});
  std::string contracted;
  for (char c : lx)
    if (ly.find(c) != std::string::npos && lo.find(c) == std::string::npos) contracted += c;
  const Shape cs = shape_of(contracted), os = shape_of(lo);
  auto flat = [&](const std::string& l, const std::map<char, int64_t>& at) {
    int64_t f = 0;
    for (char c : l) f = f * sizes.at(c) + at.at(c);
    return f;
  };
  check_products(r, dt, mode, numel(cs), [&](int64_t f, int64_t k) {
    std::map<char, int64_t> at;
    for (size_t d = lo.size(); d-- > 0;) {
      at[lo[d]] = f % os[d];
      f /= os[d];
    }
    for (size_t d = contracted.size(); d-- > 0;) {
      at[contracted[d]] = k % cs[d];
      k /= cs[d];
    }
    return std::make_pair(x.values[static_cast<size_t>(flat(lx, at))],
                          y.values[static_cast<size_t>(flat(ly, at))]);
  });
}

}  // namespace

TEST_CASE("BatchMatMulV2 f16: adjoints, odd sizes, broadcast batch dims") {
  const PrecisionMode keep = PrecisionMode::kKeepFp32;
  uint32_t seed = 1;
  for (int adj = 0; adj < 4; ++adj)
    check_bmm("BatchMatMulV2", DataType::F16, {3}, {3}, 17, 33, 20, adj & 1, adj & 2, keep,
              seed += 2);
  check_bmm("BatchMatMulV2", DataType::F16, {2, 1}, {3}, 5, 16, 9, false, false, keep, seed += 2);
  check_bmm("BatchMatMulV2", DataType::F16, {4}, {}, 24, 40, 7, false, true, keep, seed += 2);
  check_bmm("BatchMatMulV2", DataType::F16, {}, {2, 3}, 1, 1, 1, false, false, keep, seed += 2);
  check_bmm("BatchMatMulV2", DataType::F16, {1, 5}, {2, 1}, 40, 70, 33, true, false, keep,
            seed += 2);
  // Many small products: more tiles than cube cores, spread across them.
  check_bmm("BatchMatMulV2", DataType::F16, {12}, {12}, 16, 64, 48, false, false, keep, seed += 2);
  check_bmm("BatchMatMul", DataType::F16, {2, 3}, {2, 3}, 19, 21, 23, false, true, keep, seed += 2);
}

TEST_CASE("BatchMatMulV2 bf16 and f32 under the precision modes") {
  check_bmm("BatchMatMulV2", DataType::BF16, {3}, {1}, 20, 30, 18, false, false,
            PrecisionMode::kKeepFp32, 50);
  check_bmm("BatchMatMulV2", DataType::F32, {2}, {2}, 19, 37, 21, false, true,
            PrecisionMode::kKeepFp32, 51);
  check_bmm("BatchMatMulV2", DataType::F32, {3, 1}, {2}, 21, 16, 35, true, false,
            PrecisionMode::kAllowFp32ToFp16, 52);
}

TEST_CASE("BatchMatMulV2: empty batches and k = 0") {
  const ChipConfig& cfg = test_sim().config();
  auto empty = compiler::compile(
      make_op("BatchMatMulV2", {TensorDesc{DataType::F16, {0, 4, 5}}, {DataType::F16, {5, 3}}}),
      cfg);
  CHECK(empty.launches.empty());
  CHECK(empty.outputs[0].shape == Shape{0, 4, 3});
  HostTensor x{TensorDesc{DataType::F16, {2, 3, 0}}, {}};
  HostTensor y{TensorDesc{DataType::F16, {2, 0, 4}}, {}};
  auto kz = compiler::compile(make_op("BatchMatMulV2", {x.desc, y.desc}), cfg);
  RunResult r = run_compiled(test_sim(), kz, {x, y});
  CHECK(r.outputs[0].values == std::vector<double>(24, 0.0));
  const TensorDesc x234{DataType::F16, {2, 3, 4}};
  CHECK_THROWS_WITH(
      compiler::compile(make_op("BatchMatMulV2", {x234, {DataType::F16, {3, 4, 5}}}), cfg),
      Catch::Contains("not broadcast-compatible"));
  CHECK_THROWS_WITH(
      compiler::compile(make_op("BatchMatMul", {x234, {DataType::F16, {1, 4, 5}}}), cfg),
      Catch::Contains("does not broadcast"));
}

TEST_CASE("Einsum as BatchMatMul plus transposes") {
  std::map<char, int64_t> s = {{'b', 2}, {'h', 3}, {'q', 17}, {'k', 20}, {'d', 24}, {'i', 5},
                               {'j', 33}, {'a', 3}, {'c', 19}, {'e', 6}};
  uint32_t seed = 100;
  for (const char* eq : {"bij,bjk->bik",      // plain batched product
                         "bhqd,bhkd->bhqk",   // attention scores: adj_y, no transposes
                         "bqhd,bkhd->bhqk",   // heads in the middle: both operands transposed
                         "bhqk,bhkd->bhqd",   // attention output
                         "acj,jd->acd",       // free dims merged
                         "ij,jd->di",         // the product transposed to the output
                         "ja,jb->ab",         // contraction over the leading dim (adj_x)
                         "i,j->ij",           // outer product (rotary embedding tables)
                         "bi,bj->bji"})       // batched outer product, transposed
    check_einsum(eq, DataType::F16, s, seed += 2);
  check_einsum("bij,bjk->bik", DataType::F32, s, seed += 2, PrecisionMode::kAllowFp32ToFp16);
}

TEST_CASE("Einsum: ellipsis, single-operand permutation, unsupported equations") {
  const ChipConfig& cfg = test_sim().config();
  // "...ij,...jk->...ik" with broadcast leading dims: x [2, 3, 5, 7], y [3, 7, 4].
  HostTensor x = random_tensor(DataType::F16, {2, 3, 5, 7}, -2, 2, 1);
  HostTensor y = random_tensor(DataType::F16, {3, 7, 4}, -2, 2, 2);
  auto k = compiler::compile(
      make_op("Einsum", {x.desc, y.desc}, {{"equation", std::string("...ij,...jk->...ik")}}), cfg);
  REQUIRE(k.outputs[0] == TensorDesc{DataType::F16, {2, 3, 5, 4}});
  RunResult r = run_compiled(test_sim(), k, {x, y});
  check_products(r, DataType::F16, PrecisionMode::kKeepFp32, 7, [&](int64_t f, int64_t kk) {
    const int64_t j = f % 4, i = f / 4 % 5, b1 = f / 20 % 3, b0 = f / 60;
    return std::make_pair(x.values[static_cast<size_t>(((b0 * 3 + b1) * 5 + i) * 7 + kk)],
                          y.values[static_cast<size_t>((b1 * 7 + kk) * 4 + j)]);
  });
  // One operand: a permutation.
  HostTensor t = random_tensor(DataType::F32, {3, 4, 5}, -2, 2, 3);
  auto kt = compiler::compile(
      make_op("Einsum", {t.desc}, {{"equation", std::string("abc->cab")}}), cfg);
  RunResult rt = run_compiled(test_sim(), kt, {t});
  std::vector<double> want;
  for (int64_t c = 0; c < 5; ++c)
    for (int64_t a = 0; a < 3; ++a)
      for (int64_t b = 0; b < 4; ++b)
        want.push_back(t.values[static_cast<size_t>((a * 4 + b) * 5 + c)]);
  check_close(rt.outputs[0].values, want, 0, 0, "Einsum abc->cab");
  auto einsum = [&](std::vector<TensorDesc> in, const char* eq) {
    return compiler::compile(make_op("Einsum", std::move(in), {{"equation", std::string(eq)}}),
                             cfg);
  };
  CHECK_THROWS_WITH(einsum({t.desc}, "abc->a"), Catch::Contains("sums over a label"));
  HostTensor sq = random_tensor(DataType::F32, {4, 4}, -2, 2, 4);
  CHECK_THROWS_WITH(einsum({sq.desc}, "ii->i"), Catch::Contains("repeats within operand"));
  CHECK_THROWS_WITH(einsum({sq.desc, sq.desc}, "ij,jk->i"), Catch::Contains("summed within y"));
  // Launch counts: no copies where adj_x / adj_y absorb the layout, transposes otherwise. On
  // chips whose C leaves L0C through the UB (no l0c->gm path: the 910 and 310P), the cube writes
  // rows of whole 32-byte blocks, so a product whose output row (k = 20 f16, 40 bytes) is not
  // one is written padded into the workspace and copied to the output by one more launch
  // (ops/matmul.cpp).
  const uint64_t row_bytes = 20 * 2;
  const size_t padded_copy =
      !cfg.has_path(isa::Buf::L0C, isa::Buf::GM) && row_bytes % layout::kBlockBytes != 0 ? 1 : 0;
  TensorDesc q{DataType::F16, {2, 3, 17, 24}}, kk{DataType::F16, {2, 3, 20, 24}};
  CHECK(einsum({q, kk}, "bhqd,bhkd->bhqk").launches.size() == 1 + padded_copy);
  TensorDesc q2{DataType::F16, {2, 17, 3, 24}}, k2{DataType::F16, {2, 20, 3, 24}};
  CHECK(einsum({q2, k2}, "bqhd,bkhd->bhqk").launches.size() == 3 + padded_copy);
}

namespace {

// A product with k = 1 in f32 under allow_fp32_to_fp16 (ops/matmul.cpp: an outer product runs
// as an f32 Mul on the vector unit): no cube launch (no mmad in any listing), and every output
// element exactly f32's product of its two inputs, the value TF's CPU kernels give. The inputs
// are f32 values fp16 does not hold (24-bit mantissas in [-2, 2]), so fp16 operands on the cube
// would miss by up to 2^-10 relative. at(f) gives element f's flat indices into x and y.
void check_f32_outer(const compiler::OpDesc& op, const HostTensor& x, const HostTensor& y,
                     const Shape& out_shape,
                     const std::function<std::pair<int64_t, int64_t>(int64_t f)>& at) {
  INFO(op.str());
  compiler::CompiledKernel kern =
      compiler::compile(op, test_sim().config(), PrecisionMode::kAllowFp32ToFp16);
  REQUIRE(kern.outputs[0] == TensorDesc{DataType::F32, out_shape});
  for (const compiler::Launch& l : kern.launches) {
    INFO(l.summary);
    CHECK(l.kernel.listing.find("mmad") == std::string::npos);
  }
  RunResult r = run_compiled(test_sim(), kern, {x, y});
  const std::vector<double>& got = r.outputs[0].values;
  int bad = 0;
  for (int64_t f = 0; f < static_cast<int64_t>(got.size()); ++f) {
    auto [i, j] = at(f);
    const double want = round_to(DataType::F32, x.values[static_cast<size_t>(i)] *
                                                    y.values[static_cast<size_t>(j)]);
    if (got[static_cast<size_t>(f)] != want && bad++ < 5)
      UNSCOPED_INFO("element " << f << " = " << got[static_cast<size_t>(f)] << ", want " << want);
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("k = 1 in f32 under allow_fp32_to_fp16: exact f32 products on the vector unit") {
  uint32_t seed = 300;
  auto f32 = [&](Shape s) { return random_tensor(DataType::F32, std::move(s), -2, 2, seed++); };
  // MatMul, every transpose combination (with k = 1 they move no data).
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    HostTensor a = f32(ta ? Shape{1, 37} : Shape{37, 1}), b = f32(tb ? Shape{45, 1} : Shape{1, 45});
    check_f32_outer(make_op("MatMul", {a.desc, b.desc}, {{"transpose_a", ta}, {"transpose_b", tb}}),
                    a, b, {37, 45}, [](int64_t f) { return std::make_pair(f / 45, f % 45); });
  }
  // BatchMatMulV2 with broadcast batch dims: x [3, 1, 9, 1], y [2, 1, 20] -> [3, 2, 9, 20].
  HostTensor x = f32({3, 1, 9, 1}), y = f32({2, 1, 20});
  check_f32_outer(make_op("BatchMatMulV2", {x.desc, y.desc}), x, y, {3, 2, 9, 20},
                  [](int64_t f) {
                    const int64_t b0 = f / (2 * 180), b1 = f / 180 % 2, i = f / 20 % 9,
                                  j = f % 20;
                    return std::make_pair(b0 * 9 + i, b1 * 20 + j);
                  });
  // keras-hub's rotary tables: positions [1, S] x inverse frequencies [D / 2].
  HostTensor pos = f32({1, 40}), freq = f32({24});
  check_f32_outer(make_op("Einsum", {pos.desc, freq.desc}, {{"equation", "bi,j->bij"}}), pos,
                  freq, {1, 40, 24}, [](int64_t f) { return std::make_pair(f / 24, f % 24); });
  // A batched outer product transposed to the output.
  HostTensor u = f32({2, 7}), v = f32({2, 11});
  check_f32_outer(make_op("Einsum", {u.desc, v.desc}, {{"equation", "bi,bj->bji"}}), u, v,
                  {2, 11, 7}, [](int64_t f) {
                    const int64_t b = f / 77, j = f / 7 % 11, i = f % 7;
                    return std::make_pair(b * 7 + i, b * 11 + j);
                  });
}
