// Index-driven ops (ops/gather.cpp) compiled for the tiny chip and run on the chip model,
// against references computed here from TF's definitions:
//   GatherV2 and OneHot move data: exact (tolerance 0).
//   UnsortedSegmentSum adds the rows of each segment in row order, rounding to the element type
//   after every addition, as TF's CPU kernel does; the reference does the same additions in
//   double rounded to the type after each one (round_to), so it is exact (tolerance 0) for f32,
//   f16 and bf16 (a sum of two values of a type, rounded once, is the correctly rounded sum).
#include <catch2/catch.hpp>

#include <cmath>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;
using Shape = std::vector<int64_t>;

namespace {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

HostTensor values(DataType dt, Shape shape, uint32_t seed) {
  if (dt == DataType::BOOL) {
    HostTensor t{TensorDesc{dt, std::move(shape)}, {}};
    for (int64_t i = 0; i < t.desc.num_elements(); ++i) t.values.push_back((i * 7 + seed) % 3 == 0);
    return t;
  }
  if (dt == DataType::S64) {
    HostTensor t{TensorDesc{dt, std::move(shape)}, {}};
    for (int64_t i = 0; i < t.desc.num_elements(); ++i)
      t.values.push_back((i % 2 ? -1.0 : 1.0) * (static_cast<double>(i + seed) * 8589934592.0 + i));
    return t;
  }
  return random_tensor(dt, std::move(shape), -100, 100, seed);
}

HostTensor index_tensor(DataType dt, Shape shape, int64_t lo, int64_t hi, uint32_t seed) {
  HostTensor t{TensorDesc{dt, std::move(shape)}, {}};
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  for (int64_t i = 0; i < t.desc.num_elements(); ++i)
    t.values.push_back(static_cast<double>(dist(rng)));
  return t;
}

void check(const compiler::OpDesc& op, const std::vector<HostTensor>& inputs,
           const HostTensor& want) {
  INFO(op.str());
  compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
  for (const compiler::Launch& l : k.launches) UNSCOPED_INFO(l.summary);
  RunResult r = run_compiled(test_sim(), k, inputs);
  REQUIRE(r.outputs.size() == 1);
  CHECK(r.outputs[0].desc == want.desc);
  check_close(r.outputs[0].values, want.values, 0, 0, op.type);
}

// GatherV2(params, indices, axis): out[o, i, in] = params[o, idx[i], in], zeros out of range.
void check_gather(DataType dt, const Shape& ps, DataType it, const Shape& is, int64_t axis,
                  uint32_t seed, int64_t lo_index = 0) {
  const int64_t rank = static_cast<int64_t>(ps.size());
  const size_t a = static_cast<size_t>(axis < 0 ? axis + rank : axis);
  HostTensor p = values(dt, ps, seed);
  HostTensor idx = index_tensor(it, is, lo_index, ps[a] - 1 + (lo_index < 0 ? 2 : 0), seed + 1);
  int64_t outer = 1, inner = 1;
  for (size_t d = 0; d < a; ++d) outer *= ps[d];
  for (size_t d = a + 1; d < ps.size(); ++d) inner *= ps[d];
  Shape os(ps.begin(), ps.begin() + static_cast<int64_t>(a));
  os.insert(os.end(), is.begin(), is.end());
  os.insert(os.end(), ps.begin() + static_cast<int64_t>(a) + 1, ps.end());
  HostTensor want{TensorDesc{dt, os}, {}};
  const int64_t ni = numel(is);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < ni; ++i)
      for (int64_t j = 0; j < inner; ++j) {
        const int64_t v = static_cast<int64_t>(idx.values[static_cast<size_t>(i)]);
        want.values.push_back(v < 0 || v >= ps[a]
                                  ? 0.0
                                  : p.values[static_cast<size_t>((o * ps[a] + v) * inner + j)]);
      }
  check(make_op("GatherV2", {p.desc, idx.desc}, {{"axis", axis}}), {p, idx}, want);
}

// GatherV2 with batch_dims = B: out[b, o, j, in] = params[b, o, idx[b, j], in] (b over the B
// batch dims, o over params' dims between them and axis, j over indices' other dims), zeros
// out of range.
void check_gather_batched(DataType dt, const Shape& ps, DataType it, const Shape& is,
                          int64_t axis, int64_t batch_dims, uint32_t seed, int64_t lo_index = 0) {
  const size_t a = static_cast<size_t>(axis), bd = static_cast<size_t>(batch_dims);
  HostTensor p = values(dt, ps, seed);
  HostTensor idx = index_tensor(it, is, lo_index, ps[a] - 1 + (lo_index < 0 ? 2 : 0), seed + 1);
  int64_t bt = 1, outer = 1, inner = 1, nj = 1;
  for (size_t d = 0; d < bd; ++d) bt *= ps[d];
  for (size_t d = bd; d < a; ++d) outer *= ps[d];
  for (size_t d = a + 1; d < ps.size(); ++d) inner *= ps[d];
  for (size_t d = bd; d < is.size(); ++d) nj *= is[d];
  Shape os(ps.begin(), ps.begin() + static_cast<int64_t>(a));
  os.insert(os.end(), is.begin() + batch_dims, is.end());
  os.insert(os.end(), ps.begin() + static_cast<int64_t>(a) + 1, ps.end());
  HostTensor want{TensorDesc{dt, os}, {}};
  for (int64_t b = 0; b < bt; ++b)
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t j = 0; j < nj; ++j)
        for (int64_t e = 0; e < inner; ++e) {
          const int64_t v = static_cast<int64_t>(idx.values[static_cast<size_t>(b * nj + j)]);
          want.values.push_back(
              v < 0 || v >= ps[a]
                  ? 0.0
                  : p.values[static_cast<size_t>(((b * outer + o) * ps[a] + v) * inner + e)]);
        }
  check(make_op("GatherV2", {p.desc, idx.desc}, {{"axis", axis}, {"batch_dims", batch_dims}}),
        {p, idx}, want);
}

}  // namespace

TEST_CASE("GatherV2 with batch_dims") {
  uint32_t seed = 500;
  // batch_dims = 1, axis 1 (embedding lookups per example), runs of 33 / 3 / single elements.
  check_gather_batched(DataType::F32, {3, 20, 33}, DataType::S32, {3, 7}, 1, 1, seed++);
  check_gather_batched(DataType::F16, {4, 10, 3}, DataType::S64, {4, 2, 5}, 1, 1, seed++);
  check_gather_batched(DataType::S32, {5, 17}, DataType::S32, {5, 6}, 1, 1, seed++);
  // Dims between the batch dims and axis; two batch dims; indices without further dims.
  check_gather_batched(DataType::F32, {2, 3, 9, 5}, DataType::S32, {2, 4}, 2, 1, seed++);
  check_gather_batched(DataType::BF16, {2, 3, 8, 4}, DataType::S64, {2, 3, 5}, 2, 2, seed++);
  check_gather_batched(DataType::F32, {6, 11}, DataType::S32, {6}, 1, 1, seed++);
  // Out-of-range indices give zeros (not rows of the neighbouring batch); size-1 batch.
  check_gather_batched(DataType::F32, {3, 8, 16}, DataType::S32, {3, 9}, 1, 1, seed++, -3);
  check_gather_batched(DataType::F16, {1, 5, 2}, DataType::S32, {1, 3}, 1, 1, seed++);
  // Negative batch_dims counts from the indices' rank.
  {
    HostTensor p = values(DataType::F32, {2, 6, 4}, seed++);
    HostTensor idx = index_tensor(DataType::S32, {2, 3}, 0, 5, seed++);
    auto k1 = compiler::compile(make_op("GatherV2", {p.desc, idx.desc},
                                        {{"axis", int64_t{1}}, {"batch_dims", int64_t{-1}}}),
                                test_sim().config());
    CHECK(k1.outputs[0].shape == Shape{2, 3, 4});
  }
  // Zero-size indices: nothing to run.
  auto k0 = compiler::compile(make_op("GatherV2", {TensorDesc{DataType::F32, {2, 5, 3}},
                                                   TensorDesc{DataType::S32, {2, 0}}},
                                      {{"axis", int64_t{1}}, {"batch_dims", int64_t{1}}}),
                              test_sim().config());
  CHECK(k0.outputs[0].shape == Shape{2, 0, 3});
  CHECK(k0.launches.empty());
  CHECK_THROWS_WITH(
      compiler::compile(make_op("GatherV2", {TensorDesc{DataType::F32, {2, 5}},
                                             TensorDesc{DataType::S32, {3, 2}}},
                                {{"axis", int64_t{1}}, {"batch_dims", int64_t{1}}}),
                        test_sim().config()),
      Catch::Contains("batch dim 0"));
}

TEST_CASE("GatherV2: axes, index types, element sizes") {
  uint32_t seed = 1;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16, DataType::S32, DataType::BOOL,
                      DataType::S64}) {
    check_gather(dt, {20, 33}, DataType::S32, {7}, 0, seed++);           // rows of 33
    check_gather(dt, {4, 10, 3}, DataType::S64, {2, 5}, -2, seed++);     // runs of 3: elements
    check_gather(dt, {3, 17}, DataType::S32, {6}, 1, seed++);            // single elements
  }
  check_gather(DataType::F32, {50, 40}, DataType::S32, {30}, 0, seed++, -5);  // out of range: 0
  check_gather(DataType::F16, {1, 9}, DataType::S32, {0}, 0, seed++);         // no indices
  check_gather(DataType::F32, {300, 129}, DataType::S64, {260}, 0, seed++);   // several tiles
}

namespace {

// TF's UnsortedSegmentSum on the CPU: zeros, then out[ids[r]] += data[r] row by row in the
// element type (s32 wrapping); ids outside [0, segs) dropped.
// Whether the test chip sums bf16 in f32 (vector.bf16_arithmetic false: Cast to f32, the f32
// sum, Cast back, ops/gather.cpp).
bool bf16_summed_in_f32(DataType dt) {
  return dt == DataType::BF16 && !test_sim().config().vector_bf16_arithmetic;
}

// Rows added in order, each add rounded to the type (to f32, rounded to bf16 at the end, where
// bf16_summed_in_f32).
HostTensor segment_sum_reference(const HostTensor& data, const HostTensor& ids, int64_t segs) {
  const DataType dt = data.desc.dtype;
  const DataType acc = bf16_summed_in_f32(dt) ? DataType::F32 : dt;
  const int64_t rows = ids.desc.num_elements();
  const int64_t inner = data.desc.num_elements() / std::max<int64_t>(rows, 1);
  Shape os = {segs};
  os.insert(os.end(), data.desc.shape.begin() + static_cast<int64_t>(ids.desc.shape.size()),
            data.desc.shape.end());
  HostTensor want{TensorDesc{dt, os}, std::vector<double>(static_cast<size_t>(numel(os)), 0)};
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t s = static_cast<int64_t>(ids.values[static_cast<size_t>(r)]);
    if (s < 0 || s >= segs) continue;
    for (int64_t j = 0; j < inner; ++j) {
      double& w = want.values[static_cast<size_t>(s * inner + j)];
      const double x = data.values[static_cast<size_t>(r * inner + j)];
      w = dt == DataType::S32 ? static_cast<double>(static_cast<int32_t>(
                                    static_cast<int64_t>(w) + static_cast<int64_t>(x)))
                              : round_to(acc, w + x);
    }
  }
  for (double& w : want.values) w = round_to(dt, w);
  return want;
}

compiler::OpDesc segment_sum_op(const HostTensor& data, const HostTensor& ids, int64_t segs) {
  return make_op("UnsortedSegmentSum", {data.desc, ids.desc}, {{"num_segments", segs}});
}

// Compiles UnsortedSegmentSum, checks that its one launch is the `kernel` kind (summary) and
// runs it against the reference.
void check_segment_sum(const HostTensor& data, const HostTensor& ids, int64_t segs,
                       const char* kernel) {
  compiler::OpDesc op = segment_sum_op(data, ids, segs);
  compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
  const bool in_f32 = bf16_summed_in_f32(data.desc.dtype);  // Cast, the sum, Cast
  REQUIRE(k.launches.size() == (in_f32 ? 3 : 1));
  CHECK_THAT(k.launches[in_f32 ? 1 : 0].summary, Catch::Contains(kernel));
  check(op, {data, ids}, segment_sum_reference(data, ids, segs));
}

}  // namespace

TEST_CASE("UnsortedSegmentSum adds rows in order") {
  uint32_t seed = 30;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16, DataType::S32}) {
    for (auto [ds, ids_shape, segs] : std::vector<std::tuple<Shape, Shape, int64_t>>{
             {{40, 19}, {40}, 7}, {{6, 5, 3}, {6, 5}, 4}, {{33}, {33}, 40}, {{0, 4}, {0}, 3}}) {
      HostTensor data = values(dt, ds, seed++);
      HostTensor ids = index_tensor(DataType::S32, ids_shape, -2, segs, seed++);  // some dropped
      check(segment_sum_op(data, ids, segs), {data, ids}, segment_sum_reference(data, ids, segs));
    }
  }
  // s64 ids, several tiles of output.
  HostTensor data = values(DataType::F32, {500, 70}, 99);
  HostTensor ids = index_tensor(DataType::S64, {500}, 0, 299, 98);
  check(segment_sum_op(data, ids, 300), {data, ids}, segment_sum_reference(data, ids, 300));
}

// Rows of whole 32-byte blocks and at least one segment per vector core: the segment-owner
// kernel (each core owns every D-th output row and adds its rows in GM, in row order).
TEST_CASE("UnsortedSegmentSum by segment owners") {
  const auto& cfg = test_sim().config();
  const int64_t cores = cfg.core_kind(cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE)->count;
  uint32_t seed = 200;
  auto run = [&](const HostTensor& data, const HostTensor& ids, int64_t segs) {
    check_segment_sum(data, ids, segs, "segment owners");
  };
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16, DataType::S32}) {
    const int64_t inner = 64 / compiler::data_type_bytes(dt);  // two blocks per row
    // Random ids, some negative or >= segs (dropped), more segments than rows.
    HostTensor data = values(dt, {90, inner}, seed++);
    run(data, index_tensor(DataType::S32, {90}, -2, cores + 3, seed++), cores + 3);
    run(data, index_tensor(DataType::S64, {90}, -3, 4 * cores + 2, seed++), 4 * cores);
    // Runs of one segment (each row's load waits for the previous row's store), ids < D only.
    HostTensor runs{TensorDesc{DataType::S32, {90}}, {}};
    for (int64_t r = 0; r < 90; ++r) runs.values.push_back(static_cast<double>((r / 4) % 3));
    run(data, runs, cores);
  }
  // No data rows: zeros.
  run(values(DataType::F32, {0, 16}, seed++), HostTensor{TensorDesc{DataType::S32, {0}}, {}},
      cores);
  // Rows longer than a row buffer (column chunks) and than the zero buffer (stored row by row);
  // seven consecutive rows of one segment, more than a batch of such rows holds (2 here; 7
  // chunks would run past the UB).
  for (int64_t inner : {int64_t{12288}, int64_t{40000}}) {
    HostTensor data = values(DataType::F32, {11, inner}, seed++);
    HostTensor ids{TensorDesc{DataType::S32, {11}}, {3, 0, 3, 3, 3, 3, 3, 3, 3, -1, 0}};
    run(data, ids, cores);
  }
}

// Rows of whole 32-byte blocks and fewer segments than vector cores: the column-owner kernel
// (each core owns a slice of column blocks of every segment, data rows streamed in batches).
TEST_CASE("UnsortedSegmentSum by column owners") {
  uint32_t seed = 300;
  auto run = [&](const HostTensor& data, const HostTensor& ids, int64_t segs) {
    check_segment_sum(data, ids, segs, "column owners");
  };
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16, DataType::S32}) {
    // 1, 2, 3 and 5 column blocks per row: slices of one block, uneven last slices.
    for (int64_t blocks : {1, 2, 3, 5}) {
      const int64_t inner = blocks * 32 / compiler::data_type_bytes(dt);
      HostTensor data = values(dt, {90, inner}, seed++);
      run(data, index_tensor(DataType::S32, {90}, -1, 2, seed++), 2);  // -1 and 2 dropped
      run(data, index_tensor(DataType::S64, {90}, 0, 2, seed++), 3);
    }
  }
  // Many batches of rows (1 KiB rows).
  HostTensor data = values(DataType::F32, {3000, 256}, seed++);
  run(data, index_tensor(DataType::S32, {3000}, 0, 1, seed++), 2);
}

TEST_CASE("OneHot: axes, dtypes, out-of-range indices") {
  uint32_t seed = 60;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::S32, DataType::BOOL,
                      DataType::S64}) {
    for (int64_t axis : {-1, 0, 1}) {
      const Shape is = {5, 7};
      const int64_t depth = 11;
      HostTensor idx = index_tensor(DataType::S32, is, -1, depth, seed++);  // -1 and 11: off rows
      const double on_value = dt == DataType::BOOL ? 1.0 : dt == DataType::S64 ? -3e12 : 3;
      HostTensor on{TensorDesc{dt, {}}, {on_value}};
      HostTensor off{TensorDesc{dt, {}}, {dt == DataType::BOOL ? 0.0 : -1}};
      const size_t a = static_cast<size_t>(axis < 0 ? 2 : axis);
      Shape os = is;
      os.insert(os.begin() + static_cast<int64_t>(a), depth);
      HostTensor want{TensorDesc{dt, os}, {}};
      for (int64_t f = 0; f < numel(os); ++f) {
        // output index -> (indices index, d)
        int64_t rest = f;
        std::vector<int64_t> oi(os.size());
        for (size_t d = os.size(); d-- > 0;) {
          oi[d] = rest % os[d];
          rest /= os[d];
        }
        const int64_t dv = oi[a];
        oi.erase(oi.begin() + static_cast<int64_t>(a));
        const double v = idx.values[static_cast<size_t>(oi[0] * is[1] + oi[1])];
        want.values.push_back(static_cast<int64_t>(v) == dv ? on.values[0] : off.values[0]);
      }
      check(make_op("OneHot", {idx.desc, on.desc, off.desc},
                    {{"depth", depth}, {"axis", axis}}),
            {idx, on, off}, want);
    }
  }
  // Large depth (several tiles), s64 indices.
  HostTensor idx = index_tensor(DataType::S64, {40}, 0, 999, 7);
  HostTensor on{TensorDesc{DataType::F32, {}}, {1}}, off{TensorDesc{DataType::F32, {}}, {0}};
  HostTensor want{TensorDesc{DataType::F32, {40, 1000}}, std::vector<double>(40000, 0)};
  for (int64_t i = 0; i < 40; ++i)
    want.values[static_cast<size_t>(i * 1000 + idx.values[static_cast<size_t>(i)])] = 1;
  check(make_op("OneHot", {idx.desc, on.desc, off.desc}, {{"depth", int64_t{1000}}}),
        {idx, on, off}, want);
}

TEST_CASE("gather op errors") {
  const ChipConfig& cfg = test_sim().config();
  TensorDesc p{DataType::F32, {3, 4}}, i{DataType::F32, {2}};
  CHECK_THROWS_WITH(compiler::compile(make_op("GatherV2", {p, i}, {{"axis", int64_t{0}}}), cfg),
                    Catch::Contains("must be s32 or s64"));
  TensorDesc i32{DataType::S32, {2}};
  CHECK_THROWS_WITH(compiler::compile(make_op("GatherV2", {p, i32}, {{"axis", int64_t{2}}}), cfg),
                    Catch::Contains("axis = 2 is out of range"));
  CHECK_THROWS_WITH(compiler::compile(make_op("GatherV2", {p, i32},
                                              {{"axis", int64_t{1}}, {"batch_dims", int64_t{2}}}),
                                      cfg),
                    Catch::Contains("batch_dims = 2 must be in [-1, 1]"));
  CHECK_THROWS_WITH(
      compiler::compile(make_op("UnsortedSegmentSum", {p, TensorDesc{DataType::S32, {4}}},
                                {{"num_segments", int64_t{2}}}),
                        cfg),
      Catch::Contains("must be a prefix"));
}
