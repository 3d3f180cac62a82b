// Softmax, LogSoftmax, SoftmaxCrossEntropyWithLogits and SparseSoftmaxCrossEntropyWithLogits
// compiled for the tiny chip and run on the chip model, against references computed here in
// double precision from the (exactly representable) inputs.
//
// Tolerances (u = 2^-24, u_t = the output type's unit roundoff: 2^-24 f32, 2^-11 f16, 2^-8
// bf16; C classes; inputs in [-4, 4], so |x - max| <= 8):
//   The kernels compute in f32: shifted = x - max (one rounding, relative u), e = exp(shifted)
//   (expf within an ulp, and the shifted error scaled by |shifted| <= 8: relative (8 + 2) u),
//   S = sum of C positive terms (relative C u more), then one more operation and the output
//   rounding. So
//   Softmax e / S:            relative (C + 24) u + u_t;
//   LogSoftmax shifted - ln S: absolute (C + 32) u (ln of a relative error is that absolute
//                              error, plus the ln's and subtraction's own roundings) + u_t |y|;
//   backprop e / S - label:   absolute (C + 24) u * e / S + (u + u_t) |y|;
//   Xent loss sum(label * (ln S - shifted)): absolute (C + 32) u * sum|label| + C u *
//                              sum|terms| (the sum's own roundings) + u_t |loss|;
//   Sparse loss ln S - shifted[label]: absolute (C + 32) u + u_t |loss|.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;

namespace {

constexpr double kU = 5.9604644775390625e-08;  // 2^-24

// Half the spacing of the output type's subnormals: the absolute part of its rounding.
double sub_half(DataType t) { return t == DataType::F16 ? std::ldexp(1.0, -25) : 0; }

double unit(DataType t) {
  switch (t) {
    case DataType::F16: return std::ldexp(1.0, -11);
    case DataType::BF16: return std::ldexp(1.0, -8);
    default: return kU;
  }
}

// Checks |got - want| <= tol elementwise (NaN matches NaN).
void check_tol(const std::vector<double>& got, const std::vector<double>& want,
               const std::vector<double>& tol, const std::string& what) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    bool ok = (std::isnan(got[i]) && std::isnan(want[i])) ||
              std::fabs(got[i] - want[i]) <= tol[i];
    if (!ok && bad++ < 5)
      UNSCOPED_INFO(what << ": element " << i << " got " << got[i] << " want " << want[i]
                         << " tol " << tol[i]);
  }
  INFO(what << ": " << bad << " of " << got.size() << " elements differ");
  CHECK(bad == 0);
}

struct RowRef {
  double max = 0, sum = 0;  // of the row; sum = sum(exp(x - max))
};

RowRef row_ref(const std::vector<double>& x, int64_t r, int64_t C) {
  RowRef rr;
  rr.max = -std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < C; ++c) rr.max = std::max(rr.max, x[static_cast<size_t>(r * C + c)]);
  for (int64_t c = 0; c < C; ++c) rr.sum += std::exp(x[static_cast<size_t>(r * C + c)] - rr.max);
  return rr;
}

void check_softmax(const std::string& op, DataType dt, const std::vector<int64_t>& shape,
                   uint32_t seed) {
  INFO(op << " " << compiler::data_type_name(dt) << compiler::shape_str(shape));
  HostTensor x = random_tensor(dt, shape, -4, 4, seed);
  auto k = compiler::compile(make_op(op, {x.desc}), test_sim().config());
  for (const auto& l : k.launches) INFO(l.summary);
  RunResult r = run_compiled(test_sim(), k, {x});
  REQUIRE(r.outputs[0].desc == x.desc);
  const int64_t C = shape.back(), rows = C ? x.desc.num_elements() / C : 0;
  const double ut = unit(dt);
  std::vector<double> want(x.values.size()), tol(x.values.size());
  for (int64_t i = 0; i < rows; ++i) {
    const RowRef rr = row_ref(x.values, i, C);
    for (int64_t c = 0; c < C; ++c) {
      const size_t f = static_cast<size_t>(i * C + c);
      if (op == "Softmax") {
        want[f] = std::exp(x.values[f] - rr.max) / rr.sum;
        tol[f] = ((C + 24) * kU + ut) * want[f] + sub_half(dt);
      } else {
        want[f] = x.values[f] - rr.max - std::log(rr.sum);
        tol[f] = (C + 32) * kU + ut * std::fabs(want[f]);
      }
    }
  }
  check_tol(r.outputs[0].values, want, tol, op);
}

void check_xent(DataType dt, const std::vector<int64_t>& xs, const std::vector<int64_t>& ls,
                uint32_t seed) {
  INFO("SoftmaxCrossEntropyWithLogits " << compiler::data_type_name(dt)
                                        << compiler::shape_str(xs) << compiler::shape_str(ls));
  HostTensor x = random_tensor(dt, xs, -4, 4, seed);
  HostTensor y = random_tensor(dt, ls, 0, 1, seed + 1);
  auto k = compiler::compile(make_op("SoftmaxCrossEntropyWithLogits", {x.desc, y.desc}),
                             test_sim().config());
  for (const auto& l : k.launches) INFO(l.summary);
  RunResult r = run_compiled(test_sim(), k, {x, y});
  const int64_t N = std::max(xs[0], ls[0]), C = std::max(xs[1], ls[1]);
  REQUIRE(r.outputs[0].desc == (compiler::TensorDesc{dt, {N}}));
  REQUIRE(r.outputs[1].desc == (compiler::TensorDesc{dt, {N, C}}));
  const auto xi = broadcast_index(xs, {N, C}), yi = broadcast_index(ls, {N, C});
  std::vector<double> xb(static_cast<size_t>(N * C)), yb(xb.size());
  for (size_t i = 0; i < xb.size(); ++i) xb[i] = x.values[xi[i]], yb[i] = y.values[yi[i]];
  const double ut = unit(dt);
  std::vector<double> loss(static_cast<size_t>(N)), ltol(loss.size());
  std::vector<double> bp(xb.size()), btol(xb.size());
  for (int64_t i = 0; i < N; ++i) {
    const RowRef rr = row_ref(xb, i, C);
    double sum_y = 0, sum_t = 0;
    for (int64_t c = 0; c < C; ++c) {
      const size_t f = static_cast<size_t>(i * C + c);
      const double sm = std::exp(xb[f] - rr.max) / rr.sum;
      const double term = yb[f] * (std::log(rr.sum) - (xb[f] - rr.max));
      loss[static_cast<size_t>(i)] += term;
      sum_y += std::fabs(yb[f]);
      sum_t += std::fabs(term);
      bp[f] = sm - yb[f];
      btol[f] = (C + 24) * kU * sm + (kU + ut) * std::fabs(bp[f]) + sub_half(dt) + 1e-30;
    }
    ltol[static_cast<size_t>(i)] =
        (C + 32) * kU * sum_y + C * kU * sum_t + ut * std::fabs(loss[static_cast<size_t>(i)]);
  }
  check_tol(r.outputs[0].values, loss, ltol, "loss");
  check_tol(r.outputs[1].values, bp, btol, "backprop");
}

void check_sparse(DataType dt, int64_t N, int64_t C, DataType label_type, uint32_t seed,
                  bool invalid = false) {
  INFO("SparseSoftmaxCrossEntropyWithLogits " << compiler::data_type_name(dt) << " [" << N
                                              << "," << C << "] labels "
                                              << compiler::data_type_name(label_type));
  HostTensor x = random_tensor(dt, {N, C}, -4, 4, seed);
  HostTensor lbl = random_tensor(DataType::S32, {N}, 0, static_cast<double>(C) - 1, seed + 1);
  lbl.desc.dtype = label_type;
  if (invalid && N > 3) {
    lbl.values[1] = -1;
    lbl.values[3] = static_cast<double>(C);
    if (label_type == DataType::S64) lbl.values[2] = 4294967296.0 + 1;  // 2^32 + 1
  }
  auto k = compiler::compile(make_op("SparseSoftmaxCrossEntropyWithLogits", {x.desc, lbl.desc}),
                             test_sim().config());
  for (const auto& l : k.launches) INFO(l.summary);
  RunResult r = run_compiled(test_sim(), k, {x, lbl});
  REQUIRE(r.outputs[0].desc == (compiler::TensorDesc{dt, {N}}));
  REQUIRE(r.outputs[1].desc == (compiler::TensorDesc{dt, {N, C}}));
  const double ut = unit(dt), nan = std::numeric_limits<double>::quiet_NaN();
  std::vector<double> loss(static_cast<size_t>(N)), ltol(loss.size());
  std::vector<double> bp(static_cast<size_t>(N * C)), btol(bp.size());
  for (int64_t i = 0; i < N; ++i) {
    const RowRef rr = row_ref(x.values, i, C);
    const double label = lbl.values[static_cast<size_t>(i)];
    const bool valid = label >= 0 && label < C;
    for (int64_t c = 0; c < C; ++c) {
      const size_t f = static_cast<size_t>(i * C + c);
      const double sm = std::exp(x.values[f] - rr.max) / rr.sum;
      bp[f] = valid ? sm - (c == label ? 1 : 0) : nan;
      btol[f] = (C + 24) * kU * sm + (kU + ut) * std::fabs(bp[f]) + sub_half(dt) + 1e-30;
    }
    const size_t li = static_cast<size_t>(i);
    loss[li] = valid ? std::log(rr.sum) -
                           (x.values[static_cast<size_t>(i * C + static_cast<int64_t>(label))] -
                            rr.max)
                     : nan;
    ltol[li] = (C + 32) * kU + ut * std::fabs(loss[li]);
  }
  check_tol(r.outputs[0].values, loss, ltol, "loss");
  check_tol(r.outputs[1].values, bp, btol, "backprop");
}

}  // namespace

TEST_CASE("Softmax and LogSoftmax over the last axis, rows resident in the UB") {
  uint32_t seed = 1;
  for (const char* op : {"Softmax", "LogSoftmax"}) {
    check_softmax(op, DataType::F32, {5, 10}, seed++);
    check_softmax(op, DataType::F32, {3, 1}, seed++);
    check_softmax(op, DataType::F16, {7, 33}, seed++);
    check_softmax(op, DataType::BF16, {2, 3, 100}, seed++);
    check_softmax(op, DataType::F32, {1000}, seed++);
    check_softmax(op, DataType::F32, {300, 10}, seed++);
    check_softmax(op, DataType::F16, {16, 1000}, seed++);
    check_softmax(op, DataType::F32, {17, 64}, seed++);
    check_softmax(op, DataType::F32, {9, 1, 2047}, seed++);
  }
}

TEST_CASE("long rows streamed through the UB (rows starting inside a block)") {
  uint32_t seed = 50;
  check_softmax("Softmax", DataType::F32, {3, 20000}, seed++);
  check_softmax("LogSoftmax", DataType::F16, {5, 30001}, seed++);
  check_softmax("Softmax", DataType::BF16, {40, 7001}, seed++);
  check_xent(DataType::F32, {4, 12345}, {4, 12345}, seed++);
  check_xent(DataType::F16, {18, 9999}, {18, 9999}, seed++);
  check_sparse(DataType::BF16, 6, 30522, DataType::S32, seed++);
  check_sparse(DataType::F32, 37, 8191, DataType::S64, seed++, true);
}

// The kernels are double-buffered (ping/pong UB copies, vector_rows.h PingPong): several groups
// (or windows) per core with odd remainders, so both copies are used and reused.
TEST_CASE("double-buffered softmax family: many groups and windows per core") {
  uint32_t seed = 300;
  // Resident groups: 200 rows of 500 bf16 are several groups of 16 rows per core on tiny.
  {
    auto k = compiler::compile(
        make_op("Softmax", {compiler::TensorDesc{DataType::BF16, {203, 500}}}), test_sim().config());
    REQUIRE(k.launches.size() == 1);
    INFO(k.launches[0].summary);
    CHECK(k.launches[0].summary.find("groups of") != std::string::npos);  // resident
    CHECK(k.launches[0].summary.find("windows of") == std::string::npos);  // not streamed
    CHECK(k.launches[0].summary.find("double-buffered") != std::string::npos);
  }
  // Rows of whole blocks too long for 16 at a time but fitting alone: one row resident per step
  // (~10 rows per core on tiny, so both copies are used and reused).
  using Case = std::tuple<const char*, DataType, int64_t>;
  for (const auto& [op, dt, C] : {Case{"Softmax", DataType::F16, 8192},
                                  Case{"LogSoftmax", DataType::F32, 4096}}) {
    auto k = compiler::compile(make_op(op, {compiler::TensorDesc{dt, {37, C}}}), test_sim().config());
    REQUIRE(k.launches.size() == 1);
    INFO(k.launches[0].summary);
    CHECK(k.launches[0].summary.find("one row resident") != std::string::npos);
  }
  check_softmax("Softmax", DataType::F16, {37, 8192}, seed++);
  check_softmax("LogSoftmax", DataType::F32, {37, 4096}, seed++);
  check_softmax("Softmax", DataType::BF16, {3, 2048}, seed++);  // fewer rows than cores
  check_softmax("LogSoftmax", DataType::F32, {61, 3001}, seed++);
  check_softmax("Softmax", DataType::BF16, {203, 500}, seed++);
  check_softmax("LogSoftmax", DataType::F16, {1001, 33}, seed++);
  check_xent(DataType::F16, {99, 1000}, {99, 1000}, seed++);
  check_sparse(DataType::F32, 45, 999, DataType::S32, seed++, true);
  // Streamed: many windows per row and rows per core.
  check_softmax("Softmax", DataType::F32, {6, 70001}, seed++);
  check_xent(DataType::BF16, {5, 40003}, {5, 40003}, seed++);
}

// Rows whose bytes are not whole 32-byte blocks and that fit the UB alone: one row resident per
// step, loaded from the block holding the row's first element, stored with the previous row's
// tail in its head block. Blocks of rows starting inside a 32-byte block (first computing the
// row before, unstored) and ending inside one (leaving that block to the next), one row per
// core, and rows of 8 / 16 elements plus one; NPUSIM_SOFTMAX_RAGGED_RESIDENT=0 streams them.
TEST_CASE("Softmax and LogSoftmax on rows inside 32-byte blocks, one row resident") {
  const ChipConfig& cfg = test_sim().config();
  auto summary = [&](const char* op, DataType dt, std::vector<int64_t> shape) {
    auto k = compiler::compile(make_op(op, {compiler::TensorDesc{dt, std::move(shape)}}), cfg);
    REQUIRE(k.launches.size() == 1);
    return k.launches[0].summary;
  };
  CHECK_THAT(summary("Softmax", DataType::F16, {7, 1021}),
             Catch::Contains("one row resident at a time (rows inside blocks)"));
  CHECK_THAT(summary("LogSoftmax", DataType::F32, {5, 2049}),
             Catch::Contains("one row resident at a time (rows inside blocks)"));
  // Too long for the UB alone: still streamed.
  CHECK_THAT(summary("Softmax", DataType::F16, {5, 30001}), Catch::Contains("windows of"));
  uint32_t seed = 400;
  check_softmax("Softmax", DataType::F16, {7, 1021}, seed++);
  check_softmax("LogSoftmax", DataType::F32, {5, 2049}, seed++);
  check_softmax("Softmax", DataType::BF16, {3, 7, 1013}, seed++);
  check_softmax("LogSoftmax", DataType::BF16, {13, 4001}, seed++);
  check_softmax("Softmax", DataType::F32, {3, 8193}, seed++);  // one row per core
  check_softmax("Softmax", DataType::F32, {11, 1, 2051}, seed++);
  check_softmax("LogSoftmax", DataType::F16, {6, 1, 1041}, seed++);
  setenv("NPUSIM_SOFTMAX_RAGGED_RESIDENT", "0", 1);
  CHECK_THAT(summary("Softmax", DataType::F16, {7, 1021}), Catch::Contains("windows of"));
  check_softmax("Softmax", DataType::F16, {7, 1021}, seed++);
  setenv("NPUSIM_SOFTMAX_RAGGED_RESIDENT", "yes", 1);
  CHECK_THROWS_WITH(summary("Softmax", DataType::F16, {7, 1021}),
                    Catch::Contains("NPUSIM_SOFTMAX_RAGGED_RESIDENT='yes'") &&
                        Catch::Contains("Softmax"));
  // The switch is read only where it applies: rows of whole blocks and the cross-entropy ops
  // compile whatever it holds.
  CHECK_NOTHROW(summary("Softmax", DataType::F16, {37, 8192}));
  const compiler::TensorDesc logits{DataType::F16, {5, 40003}};
  CHECK_NOTHROW(compiler::compile(make_op("SoftmaxCrossEntropyWithLogits", {logits, logits}), cfg));
  // An empty value is unset.
  setenv("NPUSIM_SOFTMAX_RAGGED_RESIDENT", "", 1);
  CHECK_THAT(summary("Softmax", DataType::F16, {7, 1021}),
             Catch::Contains("one row resident at a time (rows inside blocks)"));
  unsetenv("NPUSIM_SOFTMAX_RAGGED_RESIDENT");
  // Rows of whole blocks keep their kernel.
  CHECK_THAT(summary("Softmax", DataType::F16, {37, 8192}),
             Catch::Contains("one row resident at a time, single-buffered"));
}

// The long-rows kernel's two forms (switches NPUSIM_SOFTMAX_ROW_BROADCAST and
// NPUSIM_SOFTMAX_SINGLE_BUFFER, both on by default): the row's max / sum applied from a
// broadcast row or from its 32-byte block, one copy of the loaded / output row or two. Every
// combination against the reference, on each dtype (the loaded row released after the cast for
// bf16, after the subtract for f16 / f32), whole-block and ragged rows, Softmax and LogSoftmax.
TEST_CASE("Softmax_long_rows: row broadcast and single buffering, each switch on and off") {
  const ChipConfig& cfg = test_sim().config();
  auto summary = [&](const char* op, DataType dt, std::vector<int64_t> shape) {
    auto k = compiler::compile(make_op(op, {compiler::TensorDesc{dt, std::move(shape)}}), cfg);
    REQUIRE(k.launches.size() == 1);
    return k.launches[0].summary;
  };
  CHECK_THAT(summary("Softmax", DataType::F32, {37, 4096}),
             Catch::Contains("single-buffered, row values broadcast"));
  uint32_t seed = 700;
  for (const char* broadcast : {"1", "0"}) {
    for (const char* single : {"1", "0"}) {
      setenv("NPUSIM_SOFTMAX_ROW_BROADCAST", broadcast, 1);
      setenv("NPUSIM_SOFTMAX_SINGLE_BUFFER", single, 1);
      INFO("NPUSIM_SOFTMAX_ROW_BROADCAST=" << broadcast << " NPUSIM_SOFTMAX_SINGLE_BUFFER="
                                           << single);
      const std::string s = summary("Softmax", DataType::F32, {37, 4096});
      CHECK(s.find(std::string(single) == "1" ? "single-buffered" : "double-buffered") !=
            std::string::npos);
      CHECK((s.find("row values broadcast") != std::string::npos) ==
            (std::string(broadcast) == "1"));
      check_softmax("Softmax", DataType::F32, {37, 4096}, seed++);
      check_softmax("LogSoftmax", DataType::F16, {37, 8192}, seed++);
      check_softmax("Softmax", DataType::BF16, {13, 2048}, seed++);
      check_softmax("Softmax", DataType::F16, {7, 1021}, seed++);      // ragged
      check_softmax("LogSoftmax", DataType::F32, {5, 2049}, seed++);  // ragged
      check_softmax("Softmax", DataType::BF16, {3, 7, 1013}, seed++);  // ragged
    }
  }
  setenv("NPUSIM_SOFTMAX_SINGLE_BUFFER", "2", 1);
  CHECK_THROWS_WITH(summary("Softmax", DataType::F32, {37, 4096}),
                    Catch::Contains("NPUSIM_SOFTMAX_SINGLE_BUFFER='2'") &&
                        Catch::Contains("Softmax"));
  setenv("NPUSIM_SOFTMAX_ROW_BROADCAST", "on", 1);
  CHECK_THROWS_WITH(summary("Softmax", DataType::F32, {37, 4096}),
                    Catch::Contains("NPUSIM_SOFTMAX_ROW_BROADCAST='on'"));
  unsetenv("NPUSIM_SOFTMAX_ROW_BROADCAST");
  unsetenv("NPUSIM_SOFTMAX_SINGLE_BUFFER");
}

// Rows of 1, 2, 4 or 8 lanes: each row's value spread onto its lanes in the lane slots, applied
// by one dense instruction over the group; several groups per core, a partial last group.
TEST_CASE("softmax family on rows of 1, 2, 4 and 8 classes") {
  uint32_t seed = 500;
  check_softmax("Softmax", DataType::F16, {1000, 2}, seed++);
  check_softmax("LogSoftmax", DataType::F32, {3, 101, 4}, seed++);
  check_softmax("Softmax", DataType::BF16, {77, 8}, seed++);
  check_softmax("LogSoftmax", DataType::F16, {5, 1}, seed++);
  check_softmax("Softmax", DataType::F32, {2049, 2}, seed++);
  check_xent(DataType::F32, {37, 2}, {37, 2}, seed++);
  check_xent(DataType::F16, {300, 4}, {1, 4}, seed++);
  check_sparse(DataType::F32, 45, 4, DataType::S32, seed++, true);
  check_sparse(DataType::BF16, 1000, 8, DataType::S64, seed++);
}

TEST_CASE("Softmax: zero-size and bad inputs") {
  const ChipConfig& cfg = test_sim().config();
  for (std::vector<int64_t> shape : {std::vector<int64_t>{4, 0}, std::vector<int64_t>{0, 5}}) {
    auto k = compiler::compile(make_op("Softmax", {{DataType::F32, shape}}), cfg);
    CHECK(k.launches.empty());
  }
  CHECK_THROWS_WITH(compiler::compile(make_op("Softmax", {{DataType::S32, {4, 3}}}), cfg),
                    Catch::Contains("dtype s32"));
  CHECK_THROWS_WITH(compiler::compile(make_op("LogSoftmax", {{DataType::F32, {}}}), cfg),
                    Catch::Contains("at least one dimension"));
  CHECK_THROWS_WITH(compiler::compile(make_op("SparseSoftmaxCrossEntropyWithLogits",
                                              {{DataType::F32, {4, 0}}, {DataType::S32, {4}}}),
                                      cfg),
                    Catch::Contains("at least one class"));
  CHECK_THROWS_WITH(compiler::compile(make_op("SoftmaxCrossEntropyWithLogits",
                                              {{DataType::F32, {4, 3}}, {DataType::F32, {2, 3}}}),
                                      cfg),
                    Catch::Contains("not broadcast-compatible"));
}

TEST_CASE("SoftmaxCrossEntropyWithLogits") {
  uint32_t seed = 100;
  check_xent(DataType::F32, {37, 10}, {37, 10}, seed++);
  check_xent(DataType::F16, {8, 100}, {8, 100}, seed++);
  check_xent(DataType::BF16, {5, 3}, {5, 3}, seed++);
  check_xent(DataType::F32, {6, 10}, {1, 10}, seed++);  // labels broadcast over the batch
  check_xent(DataType::F32, {1, 7}, {5, 7}, seed++);    // features broadcast
  check_xent(DataType::F32, {4, 0}, {4, 0}, seed++);    // no classes: loss 0
}

TEST_CASE("SparseSoftmaxCrossEntropyWithLogits: s32 and s64 labels, invalid labels") {
  uint32_t seed = 200;
  check_sparse(DataType::F32, 37, 10, DataType::S32, seed++);
  check_sparse(DataType::F16, 20, 1000, DataType::S64, seed++);
  check_sparse(DataType::BF16, 9, 3, DataType::S32, seed++);
  check_sparse(DataType::F32, 8, 50, DataType::S32, seed++, true);
  check_sparse(DataType::F32, 8, 50, DataType::S64, seed++, true);
  check_sparse(DataType::F32, 1, 1, DataType::S32, seed++);
}
