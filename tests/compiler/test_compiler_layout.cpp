// Data-movement ops (ops/layout.cpp, fill.cpp, select.cpp, scan.cpp) compiled for the tiny chip
// and run on the chip model, against references computed here element by element from the
// op's definition (TF semantics). Data movement is exact: every output element must equal its
// source element bit for bit (tolerance 0; inputs are distinct values exactly representable in
// the dtype, s64 values above 2^32 so that both 32-bit halves are checked).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <numeric>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;
using Shape = std::vector<int64_t>;
using Index = std::vector<int64_t>;

namespace {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Index unflatten(int64_t f, const Shape& s) {
  Index i(s.size());
  for (size_t d = s.size(); d-- > 0;) {
    i[d] = f % s[d];
    f /= s[d];
  }
  return i;
}

int64_t flatten(const Index& i, const Shape& s) {
  int64_t f = 0;
  for (size_t d = 0; d < s.size(); ++d) f = f * s[d] + i[d];
  return f;
}

// Distinct values exactly representable in dt (f16: integers below 2048, bf16: below 256,
// bool: a pseudo-random 0/1 pattern, s64: large values with both halves non-trivial).
HostTensor distinct(DataType dt, Shape shape, uint32_t seed) {
  HostTensor t{TensorDesc{dt, std::move(shape)}, {}};
  const int64_t n = t.desc.num_elements();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = i + seed;
    double v = 0;
    switch (dt) {
      case DataType::F32: v = (k % 2 ? -1 : 1) * (static_cast<double>(k) + 0.25); break;
      case DataType::F16: v = (k % 2 ? -1 : 1) * static_cast<double>(k % 2048); break;
      case DataType::BF16: v = (k % 2 ? -1 : 1) * static_cast<double>(k % 256); break;
      case DataType::S32: v = (k % 2 ? -1 : 1) * static_cast<double>(k * 7919 % 1000003); break;
      case DataType::S64: v = (k % 2 ? -1 : 1) * (static_cast<double>(k) * 4294967296.0 * 3 + k);
        break;
      case DataType::BOOL: v = ((k * 2654435761u) >> 7) & 1; break;
      case DataType::U8: v = k % 256; break;
      case DataType::S8: v = k % 256 - 128; break;
      default: v = static_cast<double>(k % 30000); break;
    }
    t.values.push_back(v);
  }
  return t;
}

// Runs `op` and compares every output with `want` exactly; returns the run's cycles.
uint64_t check(const compiler::OpDesc& op, const std::vector<HostTensor>& inputs,
               const std::vector<HostTensor>& want) {
  INFO(op.str());
  compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
  for (const compiler::Launch& l : k.launches) UNSCOPED_INFO(l.summary);
  REQUIRE(k.outputs.size() == want.size());
  RunResult r = run_compiled(test_sim(), k, inputs);
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("output " << i);
    CHECK(r.outputs[i].desc == want[i].desc);
    check_close(r.outputs[i].values, want[i].values, 0, 0, op.type);
  }
  return r.cycles;
}

// out[i] = src.values[fn(i)] for every output multi-index i (fn < 0: the fill value).
HostTensor reference(DataType dt, const Shape& shape, const HostTensor& src,
                     const std::function<int64_t(const Index&)>& fn, double fill = 0) {
  HostTensor t{TensorDesc{dt, shape}, {}};
  for (int64_t f = 0; f < numel(shape); ++f) {
    int64_t s = fn(unflatten(f, shape));
    t.values.push_back(s < 0 ? fill : src.values[static_cast<size_t>(s)]);
  }
  return t;
}

// ---- Transpose ----

// The summaries of the launches `op` compiles to on the test chip, one a line.
std::string launch_summaries(const compiler::OpDesc& op) {
  std::string all;
  for (const compiler::Launch& l : compiler::compile(op, test_sim().config()).launches)
    all += l.summary + "\n";
  return all;
}

// strategy: a word the launch summaries must contain ("vtranspose" for the block path).
void check_transpose(DataType dt, const Shape& shape, const Index& perm, uint32_t seed,
                     const char* strategy = nullptr) {
  HostTensor x = distinct(dt, shape, seed);
  Shape out;
  for (int64_t p : perm) out.push_back(shape[static_cast<size_t>(p)]);
  HostTensor want = reference(dt, out, x, [&](const Index& i) {
    Index src(shape.size());
    for (size_t d = 0; d < perm.size(); ++d) src[static_cast<size_t>(perm[d])] = i[d];
    return flatten(src, shape);
  });
  const compiler::OpDesc op = make_op("Transpose", {x.desc}, {{"perm", perm}});
  check(op, {x}, {want});
  if (strategy) {
    const std::string all = launch_summaries(op);
    INFO(all);
    CHECK(all.find(strategy) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("Transpose: inner dim kept, every dtype") {
  const DataType types[] = {DataType::F32, DataType::F16, DataType::BF16, DataType::S32,
                            DataType::BOOL, DataType::S64, DataType::U8};
  uint32_t seed = 1;
  for (DataType dt : types) {
    check_transpose(dt, {3, 5, 17}, {1, 0, 2}, seed++);
    check_transpose(dt, {2, 3, 4, 33}, {0, 2, 1, 3}, seed++);
  }
  check_transpose(DataType::F32, {2, 1, 70, 3}, {2, 1, 0, 3}, seed++);  // runs of 3: elements
  check_transpose(DataType::F16, {1, 1, 1}, {2, 0, 1}, seed++);
  check_transpose(DataType::F32, {4, 0, 5}, {1, 0, 2}, seed++);         // empty
}

TEST_CASE("Transpose: inner dim kept, rows of whole blocks by MTE copies alone") {
  uint32_t seed = 60;
  const char* rows = "copy_gm2ub + copy_ub2gm";
  // Attention heads' split and merge ([B, S, N, D] <-> [B, N, S, D], D = 64): whole groups
  // of rows per tile; the split's rows strided in the input (one store per tile), the merge's
  // in the output (one load per tile).
  check_transpose(DataType::F16, {2, 128, 16, 64}, {0, 2, 1, 3}, seed++, "1024 apart in the input");
  check_transpose(DataType::F16, {2, 16, 128, 64}, {0, 2, 1, 3}, seed++, "1024 in the output");
  check_transpose(DataType::F32, {3, 32, 4, 16}, {0, 2, 1, 3}, seed++, rows);
  // Rows strided on both sides' groups: one load and one store per group.
  check_transpose(DataType::F16, {5, 3, 20, 16}, {2, 1, 0, 3}, seed++, rows);
  // Groups larger than half the UB (40 rows of 4 KiB): chunks of rows, the last one shorter;
  // rows strided in the input, then in the output.
  check_transpose(DataType::F32, {2, 40, 3, 1024}, {0, 2, 1, 3}, seed++, "chunks of");
  check_transpose(DataType::F32, {2, 3, 40, 1024}, {0, 2, 1, 3}, seed++, "chunks of");
  // A last tile with fewer groups, several outer dims, 1- and 8-byte elements.
  check_transpose(DataType::F16, {3, 5, 7, 16}, {0, 2, 1, 3}, seed++, rows);
  check_transpose(DataType::F16, {5, 3, 2, 16}, {2, 1, 0, 3}, seed++, rows);
  check_transpose(DataType::U8, {3, 5, 64}, {1, 0, 2}, seed++, rows);
  check_transpose(DataType::S64, {3, 5, 4}, {1, 0, 2}, seed++, rows);
}

TEST_CASE("Transpose: inner dim moved") {
  uint32_t seed = 20;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BOOL, DataType::S64}) {
    check_transpose(dt, {5, 7}, {1, 0}, seed++);
    check_transpose(dt, {2, 3, 19}, {2, 0, 1}, seed++);
    check_transpose(dt, {3, 17, 2, 4}, {0, 3, 1, 2}, seed++);
  }
}

TEST_CASE("Transpose: inner dim moved, vtranspose blocks (2- and 4-byte)") {
  uint32_t seed = 30;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16, DataType::S32}) {
    const char* v = "vtranspose";
    check_transpose(dt, {32, 48}, {1, 0}, seed++, v);             // output rows whole blocks
    check_transpose(dt, {40, 21}, {1, 0}, seed++, v);             // rows padded, then compacted
    check_transpose(dt, {3, 70, 150}, {0, 2, 1}, seed++, v);      // several and partial tiles
    check_transpose(dt, {2, 40, 3, 5}, {2, 0, 3, 1}, seed++, v);  // keep-inner copy first
    check_transpose(dt, {150, 2, 35}, {2, 1, 0}, seed++, v);
    // Output rows of exactly one block (BERT-tiny's K^T gradient: 16 f16, 8 f32).
    const int64_t one_block = 32 / static_cast<int64_t>(compiler::data_type_bytes(dt));
    check_transpose(dt, {8, 4, one_block, 32}, {0, 1, 3, 2}, seed++, v);
    check_transpose(dt, {one_block, 100}, {1, 0}, seed++, v);
  }
  // 1-byte types: widened to u16, transposed, narrowed.
  check_transpose(DataType::BOOL, {40, 70}, {1, 0}, seed++, "widen to u16");
  check_transpose(DataType::U8, {3, 50, 33}, {2, 0, 1}, seed++, "widen to u16");
}

// Rows of at least one block that are not whole blocks: one copy_gm2ub per row into even / odd
// row buffers, merged by one vsel per tile (the keep-inner view, the copy that drops the
// transposer's row padding, and the copy to [P, Q, R] before it).
TEST_CASE("Transpose: rows not whole blocks, gathered per row") {
  uint32_t seed = 70;
  const char* g = "row_gather";
  // Most shapes here have fewer rows than the chip has vector cores: the gather is forced.
  setenv("NPUSIM_TRANSPOSE_ROW_GATHER", "1", 1);
  for (DataType dt : {DataType::F16, DataType::BF16, DataType::F32}) {
    const int64_t epb = 32 / static_cast<int64_t>(compiler::data_type_bytes(dt));
    // Inner dim kept: rows of one block + 1, 67 and 3 blocks - 1 elements.
    check_transpose(dt, {3, 5, epb + 1}, {1, 0, 2}, seed++, g);
    check_transpose(dt, {2, 7, 3, 67}, {0, 2, 1, 3}, seed++, g);
    check_transpose(dt, {4, 3, 2, 3 * epb - 1}, {2, 1, 0, 3}, seed++, g);
    // Last tiles of a single (even) row and of two: 9 and 34 rows of 67 (f32: 8 rows a tile).
    check_transpose(dt, {3, 3, 67}, {1, 0, 2}, seed++, g);
    check_transpose(dt, {2, 17, 67}, {1, 0, 2}, seed++, g);
    // Inner dim moved: CANN-Bench's shapes, smaller (output rows padded by the transposer,
    // then the padding dropped; the full reversal's keep-inner copy first).
    check_transpose(dt, {3, 7, 13, 41}, {0, 3, 1, 2}, seed++, g);
    check_transpose(dt, {5, 3, 4, 67}, {3, 2, 1, 0}, seed++, g);
    check_transpose(dt, {41, 83}, {1, 0}, seed++, g);
    // Rows shorter than a block stay element by element (last axes 1, 3, 11).
    check_transpose(dt, {4, 6, 1}, {1, 0, 2}, seed++);
    check_transpose(dt, {5, 4, 3}, {1, 0, 2}, seed++);
    check_transpose(dt, {3, 5, 11}, {2, 0, 1}, seed++);
    check_transpose(dt, {7, 2, 11}, {1, 0, 2}, seed++);
  }
  // A row of 4001 f32 (16 KB; eight rows make a tile of whole blocks: 128 KB, more than the
  // UB's share) takes the assembly kernel's runs.
  check_transpose(DataType::F32, {2, 3, 4001}, {1, 0, 2}, seed++, "Transpose_f32:");
  unsetenv("NPUSIM_TRANSPOSE_ROW_GATHER");
}

TEST_CASE("Transpose: NPUSIM_TRANSPOSE_ROW_GATHER switches the row gather") {
  HostTensor x = distinct(DataType::F16, {3, 5, 17}, 90);
  const compiler::OpDesc op = make_op("Transpose", {x.desc}, {{"perm", Index{1, 0, 2}}});
  auto summaries = [&] { return launch_summaries(op); };
  setenv("NPUSIM_TRANSPOSE_ROW_GATHER", "1", 1);  // 15 rows: fewer than the vector cores
  CHECK(summaries().find("row_gather") != std::string::npos);
  setenv("NPUSIM_TRANSPOSE_ROW_GATHER", "0", 1);
  const std::string off = summaries();
  setenv("NPUSIM_TRANSPOSE_ROW_GATHER", "yes", 1);
  CHECK_THROWS_WITH(summaries(), Catch::Contains("NPUSIM_TRANSPOSE_ROW_GATHER='yes'"));
  unsetenv("NPUSIM_TRANSPOSE_ROW_GATHER");
  INFO(off);
  CHECK(off.find("row_gather") == std::string::npos);
  CHECK(off.find("Transpose_f16") != std::string::npos);
}

// Unset, the gather takes a tensor only when it has more rows than the chip has vector cores
// (fewer make fewer tiles than cores; the assembly kernel's runs spread over all of them).
TEST_CASE("Transpose: the row gather takes tensors of more rows than vector cores") {
  const ChipConfig& cfg = test_sim().config();
  const isa::CoreKind vector_kind = cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE;
  const int64_t cores = cfg.core_kind(vector_kind)->count;
  // [n / 2, 2, 67] -> [2, n / 2, 67]: n rows of 67.
  auto rows = [&](int64_t n) {
    const compiler::TensorDesc x{DataType::F16, {n / 2, 2, 67}};
    return launch_summaries(make_op("Transpose", {x}, {{"perm", Index{1, 0, 2}}}));
  };
  const int64_t even = cores / 2 * 2;
  INFO(cores << " vector cores");
  CHECK(rows(even).find("row_gather") == std::string::npos);
  CHECK(rows(even + 2).find("row_gather") != std::string::npos);
  uint32_t seed = 95;
  check_transpose(DataType::F16, {even / 2 + 1, 2, 67}, {1, 0, 2}, seed++, "row_gather");
  check_transpose(DataType::F16, {even / 2, 2, 67}, {1, 0, 2}, seed++, "Transpose_f16:");
}

// Kept rows of more than 256 bytes that are not whole blocks, each core's rows fitting its UB:
// CANN's Transpose kernel (scenario 1) copies them one at a time (ops/transpose.cpp,
// CannRowCopy); the core's last row without writing past its end.
TEST_CASE("Transpose: unaligned rows one at a time, as CANN's kernel") {
  const ChipConfig& cfg = test_sim().config();
  const isa::CoreKind vector_kind = cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE;
  const int64_t cores = cfg.core_kind(vector_kind)->count;
  INFO(cores << " vector cores");
  uint32_t seed = 100;
  const char* c = "cann_rows";
  for (DataType dt : {DataType::F16, DataType::BF16, DataType::F32, DataType::S32}) {
    const int64_t esize = static_cast<int64_t>(compiler::data_type_bytes(dt));
    const int64_t r = 8 * 32 / esize + 3;  // 262 / 268 bytes: 9 blocks, the last partial
    // More rows than cores, split unevenly (3 * cores + 3 rows: three cores take one more);
    // CANN-Bench's c14 permutation at a small shape; the outer dims reversed.
    check_transpose(dt, {cores + 1, 3, r}, {1, 0, 2}, seed++, c);
    check_transpose(dt, {2, 9, 3, r}, {0, 2, 1, 3}, seed++, c);
    check_transpose(dt, {4, 3, 2, r}, {2, 1, 0, 3}, seed++, c);
    // Four rows, at most one per core.
    check_transpose(dt, {2, 2, 3 * r}, {1, 0, 2}, seed++, c);
  }
  // Not CANN's scenario 1: rows of whole blocks, rows of 256 bytes or less.
  check_transpose(DataType::F16, {3, 5, 128}, {1, 0, 2}, seed++, "Transpose_f16_rows");
  check_transpose(DataType::F16, {cores + 1, 2, 127}, {1, 0, 2}, seed++, "row_gather");
  // More rows per core than the UB has row slots (less CANN's 4 KiB): CANN batches them, not
  // this kernel.
  auto summaries = [&](const Shape& shape) {
    return launch_summaries(
        make_op("Transpose", {TensorDesc{DataType::F32, shape}}, {{"perm", Index{1, 0, 2}}}));
  };
  const int64_t row_blocks = (4001 * 4 + 31) / 32;
  const int64_t slots =
      (static_cast<int64_t>(cfg.core_kind(vector_kind)->capacity(isa::Buf::UB)) - 4096) / 32 /
      row_blocks;
  INFO(slots << " row slots");
  CHECK(summaries({cores, slots, 4001}).find(c) != std::string::npos);
  CHECK(summaries({cores, slots + 1, 4001}).find(c) == std::string::npos);
}

TEST_CASE("Transpose: NPUSIM_TRANSPOSE_CANN switches CANN's row kernel") {
  HostTensor x = distinct(DataType::F32, {5, 3, 67}, 120);
  const compiler::OpDesc op = make_op("Transpose", {x.desc}, {{"perm", Index{1, 0, 2}}});
  auto summaries = [&] { return launch_summaries(op); };
  CHECK(summaries().find("cann_rows") != std::string::npos);
  setenv("NPUSIM_TRANSPOSE_CANN", "1", 1);
  CHECK(summaries().find("cann_rows") != std::string::npos);
  setenv("NPUSIM_TRANSPOSE_CANN", "0", 1);
  const std::string off = summaries();
  check_transpose(DataType::F32, {5, 3, 67}, {1, 0, 2}, 121);  // still right without it
  setenv("NPUSIM_TRANSPOSE_CANN", "yes", 1);
  CHECK_THROWS_WITH(summaries(), Catch::Contains("NPUSIM_TRANSPOSE_CANN='yes'"));
  unsetenv("NPUSIM_TRANSPOSE_CANN");
  INFO(off);
  CHECK(off.find("cann_rows") == std::string::npos);
  // The row gather forced (NPUSIM_TRANSPOSE_ROW_GATHER=1) takes precedence.
  setenv("NPUSIM_TRANSPOSE_ROW_GATHER", "1", 1);
  const std::string gather = summaries();
  unsetenv("NPUSIM_TRANSPOSE_ROW_GATHER");
  CHECK(gather.find("row_gather") != std::string::npos);
}

TEST_CASE("ConcatV2 and Pack") {
  uint32_t seed = 40;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BOOL, DataType::S64}) {
    HostTensor a = distinct(dt, {3, 5, 7}, seed), b = distinct(dt, {3, 2, 7}, seed + 100),
               c = distinct(dt, {3, 0, 7}, seed + 200), d = distinct(dt, {3, 9, 7}, seed + 300);
    // axis 1 (and -2): [3, 16, 7]
    HostTensor want = reference(dt, {3, 16, 7}, a, [&](const Index& i) { return 0; });
    for (int64_t f = 0; f < numel({3, 16, 7}); ++f) {
      Index i = unflatten(f, {3, 16, 7});
      double v;
      if (i[1] < 5) v = a.values[static_cast<size_t>(flatten({i[0], i[1], i[2]}, {3, 5, 7}))];
      else if (i[1] < 7)
        v = b.values[static_cast<size_t>(flatten({i[0], i[1] - 5, i[2]}, {3, 2, 7}))];
      else v = d.values[static_cast<size_t>(flatten({i[0], i[1] - 7, i[2]}, {3, 9, 7}))];
      want.values[static_cast<size_t>(f)] = v;
    }
    for (int64_t axis : {1, -2})
      check(make_op("ConcatV2", {a.desc, b.desc, c.desc, d.desc}, {{"axis", axis}}), {a, b, c, d},
            {want});
    // last axis: rows of 5 + 2 (short runs)
    HostTensor e = distinct(dt, {4, 5}, seed + 1), g = distinct(dt, {4, 2}, seed + 2);
    HostTensor w2 = reference(dt, {4, 7}, e, [&](const Index& i) { return 0; });
    for (int64_t r = 0; r < 4; ++r)
      for (int64_t col = 0; col < 7; ++col)
        w2.values[static_cast<size_t>(r * 7 + col)] =
            col < 5 ? e.values[static_cast<size_t>(r * 5 + col)]
                    : g.values[static_cast<size_t>(r * 2 + col - 5)];
    check(make_op("ConcatV2", {e.desc, g.desc}, {{"axis", int64_t{-1}}}), {e, g}, {w2});
    // Pack on axis 1 of three [4, 5]: [4, 3, 5]
    HostTensor p0 = distinct(dt, {4, 5}, seed + 3), p1 = distinct(dt, {4, 5}, seed + 4),
               p2 = distinct(dt, {4, 5}, seed + 5);
    HostTensor wp = reference(dt, {4, 3, 5}, p0, [](const Index&) { return 0; });
    for (int64_t f = 0; f < 60; ++f) {
      Index i = unflatten(f, {4, 3, 5});
      const HostTensor& s = i[1] == 0 ? p0 : i[1] == 1 ? p1 : p2;
      wp.values[static_cast<size_t>(f)] = s.values[static_cast<size_t>(i[0] * 5 + i[2])];
    }
    check(make_op("Pack", {p0.desc, p1.desc, p2.desc}, {{"axis", int64_t{1}}}), {p0, p1, p2},
          {wp});
    seed += 10;
  }
}

TEST_CASE("Unpack, Split, SplitV") {
  uint32_t seed = 60;
  for (DataType dt : {DataType::F32, DataType::BF16, DataType::BOOL, DataType::S64}) {
    HostTensor x = distinct(dt, {3, 4, 21}, seed++);
    // Unpack axis -2: four [3, 21]
    std::vector<HostTensor> want;
    for (int64_t j = 0; j < 4; ++j)
      want.push_back(reference(dt, {3, 21}, x, [&](const Index& i) {
        return flatten({i[0], j, i[1]}, {3, 4, 21});
      }));
    check(make_op("Unpack", {x.desc}, {{"axis", int64_t{-2}}, {"num", int64_t{4}}}), {x}, want);
    // Split axis 2 into 3 of [3, 4, 7]
    want.clear();
    for (int64_t j = 0; j < 3; ++j)
      want.push_back(reference(dt, {3, 4, 7}, x, [&](const Index& i) {
        return flatten({i[0], i[1], i[2] + 7 * j}, {3, 4, 21});
      }));
    check(make_op("Split", {x.desc}, {{"split_dim", int64_t{2}}, {"num_split", int64_t{3}}}), {x},
          want);
    // SplitV axis 2 sizes [5, -1, 0, 1] -> 5, 15, 0, 1
    want.clear();
    int64_t at = 0;
    for (int64_t s : {5, 15, 0, 1}) {
      want.push_back(reference(dt, {3, 4, s}, x, [&](const Index& i) {
        return flatten({i[0], i[1], i[2] + at}, {3, 4, 21});
      }));
      at += s;
    }
    check(make_op("SplitV", {x.desc},
                  {{"split_dim", int64_t{-1}}, {"size_splits", Index{5, -1, 0, 1}}}),
          {x}, want);
  }
}

TEST_CASE("Slice and StridedSlice with masks") {
  uint32_t seed = 80;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::U8, DataType::S64}) {
    const Shape s = {5, 6, 19};
    HostTensor x = distinct(dt, s, seed++);
    HostTensor want = reference(dt, {3, 6, 16}, x, [&](const Index& i) {
      return flatten({i[0] + 1, i[1], i[2] + 2}, s);
    });
    check(make_op("Slice", {x.desc}, {{"begin", Index{1, 0, 2}}, {"size", Index{3, -1, 16}}}),
          {x}, {want});
    // x[4:0:-2, ..., ::3] with new axis at 1 and the middle dim shrunk at index -2:
    // begin [4, 0, -2, 0], end [0, 0, 0, 0], strides [-2, 1, 1, 3],
    // new_axis_mask 0b10, shrink 0b100 -> dims: d0 4,2 (2); new 1; d1 = 4 (shrunk); d2 0,3,..18 (7)
    HostTensor w2 = reference(dt, {2, 1, 7}, x, [&](const Index& i) {
      return flatten({4 - 2 * i[0], 4, 3 * i[2]}, s);
    });
    compiler::OpDesc op = make_op("StridedSlice", {x.desc},
                                  {{"begin", Index{4, 0, -2, 0}},
                                   {"end", Index{0, 0, 0, 0}},
                                   {"strides", Index{-2, 1, 1, 3}},
                                   {"new_axis_mask", int64_t{2}},
                                   {"shrink_axis_mask", int64_t{4}},
                                   {"end_mask", int64_t{8}}});
    check(op, {x}, {w2});
    // Ellipsis and a reversed last dim: x[..., ::-1] -> [5, 6, 19]
    HostTensor w3 = reference(dt, s, x, [&](const Index& i) {
      return flatten({i[0], i[1], 18 - i[2]}, s);
    });
    check(make_op("StridedSlice", {x.desc},
                  {{"begin", Index{0, 0}}, {"end", Index{0, 0}}, {"strides", Index{1, -1}},
                   {"ellipsis_mask", int64_t{1}}, {"begin_mask", int64_t{2}},
                   {"end_mask", int64_t{2}}}),
          {x}, {w3});
    // Out-of-range begin/end are clamped; an empty result compiles to no launch.
    HostTensor w4 = reference(dt, {5, 6, 0}, x, [](const Index&) { return 0; });
    check(make_op("StridedSlice", {x.desc},
                  {{"begin", Index{0, 0, 30}},
                   {"end", Index{9, 9, 40}},
                   {"strides", Index{1, 1, 1}}}),
          {x}, {w4});
  }
}

TEST_CASE("StridedSliceGrad scatters dy into zeros") {
  uint32_t seed = 100;
  for (DataType dt : {DataType::F32, DataType::BF16, DataType::S32}) {
    const Shape s = {6, 5, 20};
    // x[5:0:-2, 1:4, 1::3]: dims 3 (5,3,1), 3 (1..3), 7 (1,4,..19)
    HostTensor dy = distinct(dt, {3, 3, 7}, seed++);
    HostTensor want{TensorDesc{dt, s}, std::vector<double>(static_cast<size_t>(numel(s)), 0.0)};
    for (int64_t a = 0; a < 3; ++a)
      for (int64_t b = 0; b < 3; ++b)
        for (int64_t c = 0; c < 7; ++c)
          want.values[static_cast<size_t>(flatten({5 - 2 * a, 1 + b, 1 + 3 * c}, s))] =
              dy.values[static_cast<size_t>(flatten({a, b, c}, {3, 3, 7}))];
    check(make_op("StridedSliceGrad", {dy.desc},
                  {{"shape", s}, {"begin", Index{5, 1, 1}}, {"end", Index{0, 4, 0}},
                   {"strides", Index{-2, 1, 3}}, {"end_mask", int64_t{4}}}),
          {dy}, {want});
  }
}

// The placements a graph planner may make instead of a launch (CompiledKernel::view_offsets,
// concat_offsets): checked against the bytes the kernels move. A claimed view offset o means
// output j's elements are the input's from element o / size on, in order; a claimed concat
// offset that input i's elements are the output's from there on.
TEST_CASE("contiguous slices and concatenations state their in-place byte offsets") {
  const DataType dt = DataType::BF16;
  const int64_t size = 2;
  // keras-hub's KV cache (batch 1, 2 layers, K/V, 13 positions, 2 heads, 16): cache[:, 1],
  // then its V half [:, 1]: contiguous.
  const Shape cache = {1, 2, 2, 13, 2, 16};
  HostTensor x = distinct(dt, cache, 7);
  const int64_t layer = 2 * 13 * 2 * 16, half = 13 * 2 * 16;
  auto check_view = [&](const compiler::OpDesc& op, const HostTensor& in, int64_t want_elems) {
    INFO(op.str());
    const compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
    REQUIRE(k.view_offsets == std::vector<int64_t>{want_elems * size});
    CHECK(k.view_input == 0);
    HostTensor want = reference(dt, k.outputs[0].shape, in, [&](const Index& i) {
      return want_elems + flatten(i, k.outputs[0].shape);
    });
    check(op, {in}, {want});
  };
  check_view(make_op("StridedSlice", {x.desc},
                     {{"begin", Index{0, 1}}, {"end", Index{0, 2}}, {"strides", Index{1, 1}},
                      {"begin_mask", int64_t{1}}, {"end_mask", int64_t{1}},
                      {"shrink_axis_mask", int64_t{2}}}),
             x, layer);
  HostTensor one{TensorDesc{dt, {1, 2, 13, 2, 16}}, {}};
  one.values.assign(x.values.begin() + layer, x.values.begin() + 2 * layer);
  check_view(make_op("StridedSlice", {one.desc},
                     {{"begin", Index{0, 1}}, {"end", Index{0, 2}}, {"strides", Index{1, 1}},
                      {"begin_mask", int64_t{1}}, {"end_mask", int64_t{1}},
                      {"shrink_axis_mask", int64_t{2}}}),
             one, half);
  check_view(make_op("Slice", {x.desc}, {{"begin", Index{0, 1, 0, 2, 0, 0}},
                                         {"size", Index{1, 1, 1, 4, -1, -1}}}),
             x, layer + 2 * 32);
  // With batch 2 the layer's rows are apart: no view.
  const HostTensor x2 = distinct(dt, {2, 2, 2, 13, 2, 16}, 9);
  const compiler::CompiledKernel strided = compiler::compile(
      make_op("StridedSlice", {x2.desc},
              {{"begin", Index{0, 1}}, {"end", Index{0, 2}}, {"strides", Index{1, 1}},
               {"begin_mask", int64_t{1}}, {"end_mask", int64_t{1}},
               {"shrink_axis_mask", int64_t{2}}}),
      test_sim().config());
  CHECK(strided.view_offsets == std::vector<int64_t>{-1});
  // Split (split_dim first, as TF passes it): the view is of input 1, the value.
  const compiler::CompiledKernel split = compiler::compile(
      make_op("Split", {TensorDesc{DataType::S32, {}}, one.desc},
              {{"split_dim", int64_t{1}}, {"num_split", int64_t{2}}}),
      test_sim().config());
  CHECK(split.view_input == 1);
  CHECK(split.view_offsets == std::vector<int64_t>{0, half * size});

  // Pack of K and V, then of the layers: the pieces in order; along an inner axis none.
  HostTensor k = distinct(dt, {1, 13, 2, 16}, 11), v = distinct(dt, {1, 13, 2, 16}, 12);
  const compiler::OpDesc pack = make_op("Pack", {k.desc, v.desc}, {{"axis", int64_t{1}}});
  const compiler::CompiledKernel packed = compiler::compile(pack, test_sim().config());
  REQUIRE(packed.concat_offsets == std::vector<int64_t>{0, half * size});
  HostTensor kv{TensorDesc{dt, {1, 2, 13, 2, 16}}, k.values};
  kv.values.insert(kv.values.end(), v.values.begin(), v.values.end());
  check(pack, {k, v}, {kv});
  HostTensor ragged = distinct(dt, {1, 3, 16}, 13), rest = distinct(dt, {1, 5, 16}, 14);
  const compiler::CompiledKernel concat = compiler::compile(
      make_op("ConcatV2", {ragged.desc, rest.desc}, {{"axis", int64_t{1}}}), test_sim().config());
  CHECK(concat.concat_offsets == std::vector<int64_t>{0, 3 * 16 * size});
  const compiler::CompiledKernel inner = compiler::compile(
      make_op("Pack", {x2.desc, x2.desc}, {{"axis", int64_t{1}}}), test_sim().config());
  CHECK(inner.concat_offsets.empty());
}

TEST_CASE("XlaDynamicUpdateSlice writes the update at clamped starts") {
  uint32_t seed = 110;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BOOL, DataType::S64}) {
    const Shape s = {3, 9, 2, 5}, u = {3, 2, 2, 5};  // a KV-cache write of two positions
    HostTensor x = distinct(dt, s, seed++);
    HostTensor upd = distinct(dt, u, seed++);
    // Start 8 in dim 1 is clamped to 9 - 2 = 7 (XLA); -1 in dim 2 to 0.
    for (const Index& start : {Index{0, 3, 0, 0}, Index{0, 8, -1, 0}}) {
      const int64_t at = std::min<int64_t>(start[1], 7);
      auto from_update = [&](const Index& i) -> int64_t {  // -1: the input's element
        if (i[1] < at || i[1] >= at + 2) return -1;
        return flatten({i[0], i[1] - at, i[2], i[3]}, u);
      };
      HostTensor want = x;
      for (int64_t f = 0; f < numel(s); ++f)
        if (int64_t k = from_update(unflatten(f, s)); k >= 0)
          want.values[static_cast<size_t>(f)] = upd.values[static_cast<size_t>(k)];
      check(make_op("XlaDynamicUpdateSlice", {x.desc, upd.desc}, {{"indices", start}}),
            {x, upd}, {want});
    }
  }
}

// The starts as a device input (TF's op as the plugin runs it): one kernel compiled per shape,
// run at several starts (in range, negative, past the end: clamped as XLA does), with the start
// moving in a row dim (dim 0) and in the column dim (dim 1) at once.
TEST_CASE("XlaDynamicUpdateSlice reads its starts from device memory: one kernel, any start") {
  uint32_t seed = 115;
  for (DataType dt : {DataType::F32, DataType::BF16, DataType::BOOL, DataType::S64}) {
    for (DataType it : {DataType::S32, DataType::S64}) {
      const Shape s = {4, 9, 2, 5}, u = {2, 2, 2, 5};
      HostTensor x = distinct(dt, s, seed++);
      HostTensor upd = distinct(dt, u, seed++);
      const TensorDesc idx_desc{it, {4}};
      const compiler::OpDesc op =
          make_op("XlaDynamicUpdateSlice", {x.desc, upd.desc, idx_desc}, {});
      INFO(op.str());
      const compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
      for (const Index& start : {Index{1, 3, 0, 0}, Index{-5, 8, -1, 2}, Index{3, -2, 0, 0},
                                 Index{0, 100, 0, 0}}) {
        const int64_t a0 = std::clamp<int64_t>(start[0], 0, 2);
        const int64_t a1 = std::clamp<int64_t>(start[1], 0, 7);
        HostTensor want = x;
        for (int64_t f = 0; f < numel(s); ++f) {
          const Index i = unflatten(f, s);
          if (i[0] >= a0 && i[0] < a0 + 2 && i[1] >= a1 && i[1] < a1 + 2)
            want.values[static_cast<size_t>(f)] =
                upd.values[static_cast<size_t>(flatten({i[0] - a0, i[1] - a1, i[2], i[3]}, u))];
        }
        HostTensor idx{idx_desc, {}};
        for (int64_t v : start) idx.values.push_back(static_cast<double>(v));
        INFO("start " << start[0] << ", " << start[1] << ", " << start[2] << ", " << start[3]);
        RunResult r = run_compiled(test_sim(), k, {x, upd, idx});
        REQUIRE(r.outputs.size() == 1);
        check_close(r.outputs[0].values, want.values, 0, 0, op.type);
      }
    }
  }
  // Indices of the wrong type or length are an error naming them.
  const TensorDesc x{DataType::F32, {4, 9}}, upd{DataType::F32, {1, 9}};
  CHECK_THROWS_WITH(compiler::compile(make_op("XlaDynamicUpdateSlice",
                                              {x, upd, TensorDesc{DataType::S32, {3}}}, {}),
                                      test_sim().config()),
                    Catch::Contains("indices") && Catch::Contains("shape [2]"));
}

TEST_CASE("Pad, PadV2, MirrorPad") {
  uint32_t seed = 120;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BOOL, DataType::S64}) {
    const Shape s = {3, 4, 17};
    HostTensor x = distinct(dt, s, seed++);
    const Index pads = {1, 0, 0, 2, 3, 1};
    const Shape o = {4, 6, 21};
    auto inside = [&](const Index& i) -> int64_t {
      if (i[0] < 1 || i[1] >= 4 || i[2] < 3 || i[2] >= 20) return -1;
      return flatten({i[0] - 1, i[1], i[2] - 3}, s);
    };
    check(make_op("Pad", {x.desc}, {{"paddings", pads}}), {x}, {reference(dt, o, x, inside)});
    HostTensor cv{TensorDesc{dt, {}}, {dt == DataType::BOOL ? 1.0 : 5.0}};
    check(make_op("PadV2", {x.desc, cv.desc}, {{"paddings", pads}}), {x, cv},
          {reference(dt, o, x, inside, cv.values[0])});
    for (const char* mode : {"REFLECT", "SYMMETRIC"}) {
      const int64_t e = std::string(mode) == "REFLECT" ? 1 : 0;
      auto mirror = [&](int64_t j, int64_t n) {  // index j relative to the input start
        if (j < 0) return -j - 1 + e;
        if (j >= n) return 2 * n - 1 - e - j;
        return j;
      };
      const Index mp = {2 - e, 1, 0, 0, 3, 2};
      const Shape mo = {3 + 2 - e + 1, 4, 22};
      HostTensor w = reference(dt, mo, x, [&](const Index& i) {
        return flatten({mirror(i[0] - (2 - e), 3), i[1], mirror(i[2] - 3, 17)}, s);
      });
      check(make_op("MirrorPad", {x.desc}, {{"paddings", mp}, {"mode", std::string(mode)}}),
            {x}, {w});
    }
  }
  // Padding an empty tensor gives only padding.
  HostTensor z = distinct(DataType::F32, {0, 3}, 1);
  check(make_op("Pad", {z.desc}, {{"paddings", Index{1, 1, 0, 2}}}), {z},
        {reference(DataType::F32, {2, 5}, z, [](const Index&) { return -1; })});
}

TEST_CASE("Tile and BroadcastTo") {
  uint32_t seed = 140;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BOOL, DataType::S64}) {
    HostTensor x = distinct(dt, {2, 1, 5}, seed++);
    HostTensor w = reference(dt, {6, 4, 10}, x, [&](const Index& i) {
      return flatten({i[0] % 2, 0, i[2] % 5}, {2, 1, 5});
    });
    check(make_op("Tile", {x.desc}, {{"multiples", Index{3, 4, 2}}}), {x}, {w});
    HostTensor b = reference(dt, {3, 2, 7, 5}, x, [&](const Index& i) {
      return flatten({i[1], 0, i[3]}, {2, 1, 5});
    });
    check(make_op("BroadcastTo", {x.desc}, {{"shape", Shape{3, 2, 7, 5}}}), {x}, {b});
    HostTensor c = distinct(dt, {3, 1}, seed++);
    HostTensor wc = reference(dt, {3, 40}, c, [&](const Index& i) { return i[0]; });
    check(make_op("BroadcastTo", {c.desc}, {{"shape", Shape{3, 40}}}), {c}, {wc});
  }
}

// One kernel addresses at most 128 inputs (ldarg's 8-bit argument index, half of it): more are
// concatenated in groups into workspace slices, then the slices into the output.
TEST_CASE("ConcatV2 and Pack of more inputs than one kernel takes") {
  const ChipConfig& cfg = test_sim().config();
  // Pack of 300 f16 [2, 3] on axis 1: [2, 300, 3], out[i][k][j] = in_k[i][j].
  std::vector<HostTensor> ins;
  std::vector<TensorDesc> descs;
  for (uint32_t k = 0; k < 300; ++k) {
    ins.push_back(distinct(DataType::F16, {2, 3}, 7 * k));
    descs.push_back(ins.back().desc);
  }
  HostTensor want = reference(DataType::F16, {2, 300, 3}, ins[0], [](const Index&) { return 0; });
  for (int64_t f = 0; f < numel({2, 300, 3}); ++f) {
    const Index i = unflatten(f, {2, 300, 3});
    want.values[static_cast<size_t>(f)] =
        ins[static_cast<size_t>(i[1])].values[static_cast<size_t>(i[0] * 3 + i[2])];
  }
  const compiler::OpDesc pack = make_op("Pack", descs, {{"axis", int64_t{1}}});
  CHECK(compiler::compile(pack, cfg).launches.size() == 4);  // 3 groups (128 + 128 + 44), 1 join
  check(pack, ins, {want});

  // ConcatV2 on axis 0 of 129 bool inputs, the first 128 of them empty (a group that adds
  // nothing): the output is the last input.
  std::vector<HostTensor> bools(128, HostTensor{TensorDesc{DataType::BOOL, {0, 4}}, {}});
  bools.push_back(distinct(DataType::BOOL, {5, 4}, 3));
  std::vector<TensorDesc> bdescs;
  for (const HostTensor& t : bools) bdescs.push_back(t.desc);
  check(make_op("ConcatV2", bdescs, {{"axis", int64_t{0}}}), bools, {bools.back()});

  // An error names the op with its inputs counted, not listed one by one.
  descs.back() = TensorDesc{DataType::F16, {3, 3}};
  CHECK_THROWS_WITH(compiler::compile(make_op("Pack", descs, {{"axis", int64_t{1}}}), cfg),
                    Catch::Contains("Pack(f16[2,3] x 299, f16[3,3]): input 299"));
}

TEST_CASE("layout op errors name the operand") {
  const ChipConfig& cfg = test_sim().config();
  TensorDesc x{DataType::F32, {3, 4}};
  CHECK_THROWS_WITH(compiler::compile(make_op("Transpose", {x}, {{"perm", Index{0, 0}}}), cfg),
                    Catch::Contains("not a permutation"));
  CHECK_THROWS_WITH(compiler::compile(make_op("ConcatV2", {x, x}, {}), cfg),
                    Catch::Contains("attribute axis is missing"));
  CHECK_THROWS_WITH(compiler::compile(make_op("Split", {x},
                                              {{"split_dim", int64_t{1}},
                                               {"num_split", int64_t{3}}}),
                                      cfg),
                    Catch::Contains("not divisible"));
  CHECK_THROWS_WITH(
      compiler::compile(make_op("Slice", {x}, {{"begin", Index{2, 0}}, {"size", Index{2, 4}}}),
                        cfg),
      Catch::Contains("outside the input in dim 0"));
  CHECK_THROWS_WITH(compiler::compile(make_op("MirrorPad", {x},
                                              {{"paddings", Index{3, 0, 0, 0}},
                                               {"mode", std::string("REFLECT")}}),
                                      cfg),
                    Catch::Contains("must be at most 2"));
}

// ---- generators ----

TEST_CASE("Fill, ZerosLike, OnesLike") {
  uint32_t seed = 160;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16, DataType::S32, DataType::BOOL,
                      DataType::S64, DataType::U8}) {
    HostTensor v = distinct(dt, {}, seed++);
    if (dt == DataType::BOOL) v.values[0] = 1;
    for (Shape s : {Shape{3, 45}, Shape{}, Shape{0, 4}, Shape{1000}}) {
      HostTensor want{TensorDesc{dt, s}, std::vector<double>(static_cast<size_t>(numel(s)),
                                                             v.values[0])};
      check(make_op("Fill", {v.desc}, {{"dims", s}}), {v}, {want});
    }
    HostTensor x = distinct(dt, {7, 13}, seed++);
    check(make_op("ZerosLike", {x.desc}), {x},
          {HostTensor{x.desc, std::vector<double>(91, 0.0)}});
    check(make_op("OnesLike", {x.desc}), {x}, {HostTensor{x.desc, std::vector<double>(91, 1.0)}});
  }
}

TEST_CASE("Range: TF's sequence, integers and floats") {
  auto run = [](compiler::OpDesc op, DataType dt, const std::vector<double>& want) {
    check(op, {}, {HostTensor{TensorDesc{dt, {static_cast<int64_t>(want.size())}}, want}});
  };
  auto ints = [](int64_t s, int64_t l, int64_t d) {
    std::vector<double> v;
    for (int64_t x = s; d > 0 ? x < l : x > l; x += d) v.push_back(static_cast<double>(x));
    return v;
  };
  run(make_op("Range", {}, {{"start", int64_t{3}}, {"limit", int64_t{18}}, {"delta", int64_t{3}}}),
      DataType::S32, ints(3, 18, 3));
  run(make_op("Range", {}, {{"start", int64_t{7}}, {"limit", int64_t{-2000}},
                            {"delta", int64_t{-3}}}),
      DataType::S32, ints(7, -2000, -3));
  run(make_op("Range", {}, {{"start", int64_t{0}}, {"limit", int64_t{50000}},
                            {"delta", int64_t{1}}}),
      DataType::S32, ints(0, 50000, 1));  // several tiles per core
  // Floats: TF accumulates in float (val += delta); the reference does the same.
  auto floats = [](float s, float l, float d) {
    std::vector<double> v;
    const int64_t n = static_cast<int64_t>(std::ceil(std::fabs((l - s) / d)));
    float val = s;
    for (int64_t i = 0; i < n; ++i, val += d) v.push_back(val);
    return v;
  };
  // Exact steps: the vector kernel; 0.1 steps: TF's rounded sums as immediates.
  run(make_op("Range", {}, {{"start", -2.5}, {"limit", 3000.0}, {"delta", 0.5},
                            {"Tidx", std::string("f32")}}),
      DataType::F32, floats(-2.5f, 3000.f, 0.5f));
  run(make_op("Range", {}, {{"start", 0.0}, {"limit", 1.0}, {"delta", 0.1}}), DataType::F32,
      floats(0.f, 1.f, 0.1f));
  run(make_op("Range", {}, {{"start", int64_t{5}}, {"limit", int64_t{5}}, {"delta", int64_t{2}}}),
      DataType::S32, {});
  CHECK_THROWS_WITH(compiler::compile(make_op("Range", {}, {{"start", 0.0}, {"limit", 1e6},
                                                            {"delta", 0.1}}),
                                      test_sim().config()),
                    Catch::Contains("limited to 4096 elements"));
}

// ---- selection and clipping ----

TEST_CASE("Select and SelectV2 with broadcasting conditions") {
  uint32_t seed = 180;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16, DataType::S32, DataType::BOOL,
                      DataType::S64}) {
    struct Case {
      const char* op;
      Shape c, t, e;
    };
    const Case cases[] = {{"SelectV2", {4, 37}, {4, 37}, {4, 37}},
                          {"SelectV2", {4, 1}, {4, 37}, {37}},
                          {"SelectV2", {}, {3, 5}, {3, 5}},
                          {"SelectV2", {2, 1, 9}, {1, 3, 1}, {3, 9}},
                          {"Select", {6}, {6, 11}, {6, 11}},
                          {"Select", {6, 11}, {6, 11}, {6, 11}}};
    for (const Case& k : cases) {
      INFO(k.op << " " << compiler::data_type_name(dt) << " " << compiler::shape_str(k.c) << " "
                << compiler::shape_str(k.t) << " " << compiler::shape_str(k.e));
      HostTensor c = distinct(DataType::BOOL, k.c, seed++), t = distinct(dt, k.t, seed++),
                 e = distinct(dt, k.e, seed++);
      Shape cs = k.c;  // Select: a vector condition picks rows
      if (std::string(k.op) == "Select" && cs.size() == 1 && k.t.size() > 1) cs.resize(2, 1);
      Shape out = *compiler::broadcast_shapes(*compiler::broadcast_shapes(k.t, k.e), cs);
      auto ic = broadcast_index(cs, out), it = broadcast_index(k.t, out),
           ie = broadcast_index(k.e, out);
      HostTensor want{TensorDesc{dt, out}, {}};
      for (size_t i = 0; i < ic.size(); ++i)
        want.values.push_back(c.values[ic[i]] != 0 ? t.values[it[i]] : e.values[ie[i]]);
      check(make_op(k.op, {c.desc, t.desc, e.desc}), {c, t, e}, {want});
    }
  }
}

TEST_CASE("ClipByValue: min then max, broadcast bounds") {
  uint32_t seed = 200;
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16, DataType::S32}) {
    HostTensor t = random_tensor(dt, {9, 40}, -10, 10, seed++);
    HostTensor lo = random_tensor(dt, {40}, -6, 0, seed++);
    HostTensor hi = random_tensor(dt, {}, 0, 5, seed++);
    HostTensor want{t.desc, {}};
    for (size_t i = 0; i < t.values.size(); ++i)
      want.values.push_back(std::max(std::min(t.values[i], hi.values[0]), lo.values[i % 40]));
    check(make_op("ClipByValue", {t.desc, lo.desc, hi.desc}), {t, lo, hi}, {want});
  }
  // min > max gives min (max is applied last, as TF).
  HostTensor t = random_tensor(DataType::F32, {5}, -10, 10, 1);
  HostTensor lo{TensorDesc{DataType::F32, {}}, {3}}, hi{TensorDesc{DataType::F32, {}}, {-3}};
  check(make_op("ClipByValue", {t.desc, lo.desc, hi.desc}), {t, lo, hi},
        {HostTensor{t.desc, std::vector<double>(5, 3.0)}});
}

// ---- scans ----

TEST_CASE("Cumsum: axes, exclusive, reverse; sequential rounding as TF") {
  uint32_t seed = 220;
  struct Case {
    Shape s;
    int64_t axis;
  };
  // {40, 37} / {24, 50} along the last axis: the vtranspose path (f16 needs 32 rows: the
  // second falls back to the padded copy), the others through the padded copies.
  const Case cases[] = {{{37, 16}, 0},  {{5, 37}, 1},  {{5, 37}, -1},     {{4, 6, 5}, 1},
                        {{3, 1, 9}, 1}, {{300, 3}, 0}, {{2, 130, 70}, 1}, {{40, 37}, -1},
                        {{24, 50}, 1}};
  for (DataType dt : {DataType::F32, DataType::F16, DataType::BF16, DataType::S32}) {
    for (const Case& c : cases) {
      for (int mode = 0; mode < 4; ++mode) {
        // Heavy on 910b (48 vector cores to simulate): there the four modes run for f32 only,
        // the other types run the inclusive forward scan.
        if (!test_chip_is_tiny() && dt != DataType::F32 && mode != 0) {
          ++seed;
          continue;
        }
        const bool exclusive = mode & 1, reverse = mode & 2;
        HostTensor x = random_tensor(dt, c.s, -4, 4, seed++);
        const size_t a = static_cast<size_t>(c.axis < 0 ? c.axis + 3 - (c.s.size() == 2) : c.axis);
        int64_t outer = 1, inner = 1;
        for (size_t d = 0; d < a; ++d) outer *= c.s[d];
        for (size_t d = a + 1; d < c.s.size(); ++d) inner *= c.s[d];
        const int64_t n = c.s[a];
        HostTensor want{x.desc, std::vector<double>(x.values.size(), 0)};
        for (int64_t o = 0; o < outer; ++o)
          for (int64_t in = 0; in < inner; ++in) {
            double acc = 0;
            for (int64_t k = 0; k < n; ++k) {
              const int64_t r = reverse ? n - 1 - k : k;
              const size_t at = static_cast<size_t>((o * n + r) * inner + in);
              if (exclusive) want.values[at] = acc;
              acc = dt == DataType::S32 ? acc + x.values[at] : round_to(dt, acc + x.values[at]);
              if (!exclusive) want.values[at] = acc;
            }
          }
        check(make_op("Cumsum", {x.desc}, {{"axis", c.axis}, {"exclusive", exclusive},
                                           {"reverse", reverse}}),
              {x}, {want});
      }
    }
  }
}

TEST_CASE("TF's full input lists: shape tensors may stay in the inputs") {
  // The shape operands are read from the attributes; the tensors are ignored (not even read),
  // and the launches bind the data inputs at their TF positions.
  HostTensor x = distinct(DataType::F32, {4, 6}, 1);
  HostTensor perm{TensorDesc{DataType::S32, {2}}, {1, 0}};
  HostTensor want = reference(DataType::F32, {6, 4}, x, [](const Index& i) {
    return flatten({i[1], i[0]}, {4, 6});
  });
  check(make_op("Transpose", {x.desc, perm.desc}, {{"perm", Index{1, 0}}}), {x, perm}, {want});
  HostTensor axis{TensorDesc{DataType::S32, {}}, {1}};
  HostTensor cat = reference(DataType::F32, {4, 12}, x, [](const Index& i) {
    return flatten({i[0], i[1] % 6}, {4, 6});
  });
  check(make_op("ConcatV2", {x.desc, x.desc, axis.desc}, {{"axis", int64_t{1}}, {"N", int64_t{2}}}),
        {x, x, axis}, {cat});
  std::vector<HostTensor> halves;
  for (int64_t h = 0; h < 2; ++h)
    halves.push_back(reference(DataType::F32, {4, 3}, x, [h](const Index& i) {
      return flatten({i[0], i[1] + 3 * h}, {4, 6});
    }));
  check(make_op("Split", {axis.desc, x.desc},
                {{"split_dim", int64_t{1}}, {"num_split", int64_t{2}}}),
        {axis, x}, halves);
  HostTensor dims{TensorDesc{DataType::S32, {2}}, {3, 5}}, v{TensorDesc{DataType::F32, {}}, {2.5}};
  check(make_op("Fill", {dims.desc, v.desc}, {{"dims", Index{3, 5}}}), {dims, v},
        {HostTensor{TensorDesc{DataType::F32, {3, 5}}, std::vector<double>(15, 2.5)}});
}

TEST_CASE("data movement kernels verify on every chip") {
  // Compile-only (the verifier checks each kernel against the chip): split 910B-like, coupled
  // 910 and 310P-like cores (one kind of core for vector and cube work).
  for (const char* chip : {"910b", "910", "310p"}) {
    INFO(chip);
    const ChipConfig cfg = load_chip_config(chip);
    TensorDesc f{DataType::F32, {70, 300}}, h{DataType::F16, {130, 66}}, b{DataType::BOOL, {9, 40}};
    CHECK_NOTHROW(compiler::compile(make_op("Transpose", {f}, {{"perm", Index{1, 0}}}), cfg));
    CHECK_NOTHROW(compiler::compile(make_op("Transpose", {h}, {{"perm", Index{1, 0}}}), cfg));
    CHECK_NOTHROW(compiler::compile(make_op("Transpose", {b}, {{"perm", Index{1, 0}}}), cfg));
    CHECK_NOTHROW(compiler::compile(
        make_op("Pad", {h}, {{"paddings", Index{1, 2, 3, 4}}}), cfg));
    CHECK_NOTHROW(compiler::compile(make_op("Cumsum", {f}, {{"axis", int64_t{1}}}), cfg));
    CHECK_NOTHROW(compiler::compile(
        make_op("SelectV2", {TensorDesc{DataType::BOOL, {70, 1}}, f, f}), cfg));
  }
}

TEST_CASE("large shapes: several tiles per core, direct and scratch runs") {
  uint32_t seed = 300;
  // Runs of 60 f32 (7 whole blocks loaded straight into the tile, then a partial one through
  // the scratch), ~3 tiles per core.
  check_transpose(DataType::F32, {8, 64, 4, 60}, {0, 2, 1, 3}, seed++);
  // Runs of 47 bf16 at odd offsets: partial head / tail blocks through the scratch.
  check_transpose(DataType::BF16, {30, 41, 47}, {1, 0, 2}, seed++);
  // 1-byte runs widened to u16 lanes, several tiles.
  check_transpose(DataType::BOOL, {40, 50, 30}, {1, 0, 2}, seed++);
  // Concat of unaligned widths, many rows.
  HostTensor a = distinct(DataType::F16, {300, 130}, seed++);
  HostTensor b = distinct(DataType::F16, {300, 77}, seed++);
  HostTensor want = reference(DataType::F16, {300, 207}, a, [](const Index&) { return 0; });
  for (int64_t r = 0; r < 300; ++r)
    for (int64_t c = 0; c < 207; ++c)
      want.values[static_cast<size_t>(r * 207 + c)] =
          c < 130 ? a.values[static_cast<size_t>(r * 130 + c)]
                  : b.values[static_cast<size_t>(r * 77 + c - 130)];
  check(make_op("ConcatV2", {a.desc, b.desc}, {{"axis", int64_t{1}}}), {a, b}, {want});
  // Pad: a background fill, then the input's rows loaded over it.
  HostTensor x = distinct(DataType::F32, {200, 300}, seed++);
  HostTensor wp = reference(DataType::F32, {205, 312}, x, [](const Index& i) -> int64_t {
    if (i[0] < 3 || i[0] >= 203 || i[1] < 5 || i[1] >= 305) return -1;
    return (i[0] - 3) * 300 + i[1] - 5;
  });
  check(make_op("Pad", {x.desc}, {{"paddings", Index{3, 2, 5, 7}}}), {x}, {wp});
}

TEST_CASE("data movement tiles follow the config: UB size and vector core count") {
  const compiler::OpDesc op = make_op("ZerosLike", {TensorDesc{DataType::F32, {100000}}});
  auto k_tiny = compiler::compile(op, load_chip_config("tiny"));
  auto k_ub = compiler::compile(op, load_chip_config("tiny", {"cores.aiv.buffers.ub=96 KiB"}));
  auto k_cores = compiler::compile(
      op, load_chip_config("tiny", {"cores.aic.count=1", "cores.aiv.count=2"}));
  INFO(k_tiny.launches[0].summary << "\n" << k_ub.launches[0].summary << "\n"
                                   << k_cores.launches[0].summary);
  // A fill uses two output tiles of 4-byte lanes (ping/pong); fixed: 256 bytes of repeat slack
  // and 4 blocks of alignment slack; rounded down to 128 elements:
  //   192 KiB: floor((196608 - 384) / 8 / 128) * 128 = 24448
  //    96 KiB: floor((98304 - 384) / 8 / 128) * 128 = 12160
  CHECK(k_tiny.launches[0].summary.find("tile 24448 elements") != std::string::npos);
  CHECK(k_ub.launches[0].summary.find("tile 12160 elements") != std::string::npos);
  CHECK(k_tiny.launches[0].block_dim == 4);
  CHECK(k_cores.launches[0].block_dim == 2);
}

TEST_CASE("runs' partial blocks batched behind one flag: same bytes, fewer cycles") {
  // Rows shorter than a tile's share of the run scratch (64 bytes a run a row), so each tile
  // takes several batches, and several tiles per core. Each op runs batched (the default) and
  // with NPUSIM_ASSEMBLE_BATCHED_PIECES=0 (a flag per partial block); both must give the
  // reference bit for bit.
  uint32_t seed = 400;
  auto both = [](const compiler::OpDesc& op, const std::vector<HostTensor>& in,
                 const std::vector<HostTensor>& want) {
    unsetenv("NPUSIM_ASSEMBLE_BATCHED_PIECES");
    const uint64_t batched = check(op, in, want);
    setenv("NPUSIM_ASSEMBLE_BATCHED_PIECES", "0", 1);
    const uint64_t per_piece = check(op, in, want);
    unsetenv("NPUSIM_ASSEMBLE_BATCHED_PIECES");
    return std::make_pair(batched, per_piece);
  };
  auto pad_reference = [](DataType dt, const HostTensor& x, const Index& pads) {
    const Shape& s = x.desc.shape;
    const Shape o = {s[0] + pads[0] + pads[1], s[1] + pads[2] + pads[3]};
    return reference(dt, o, x, [&](const Index& i) -> int64_t {
      const int64_t r = i[0] - pads[0], c = i[1] - pads[2];
      if (r < 0 || r >= s[0] || c < 0 || c >= s[1]) return -1;
      return r * s[1] + c;
    });
  };
  // f32 runs of 5 inside one or two blocks (all through the scratch), rows of 9.
  {
    HostTensor x = distinct(DataType::F32, {6000, 5}, seed++);
    const Index pads = {0, 0, 1, 3};
    const auto [batched, per_piece] =
        both(make_op("Pad", {x.desc}, {{"paddings", pads}}), {x},
             {pad_reference(DataType::F32, x, pads)});
    INFO("batched " << batched << " cycles, per piece " << per_piece);
    CHECK(batched < per_piece);
  }
  // f16 runs of 37: head, whole blocks straight into the tile, tail; one padded row each side.
  {
    HostTensor x = distinct(DataType::F16, {3000, 37}, seed++);
    const Index pads = {1, 1, 3, 2};
    const auto [batched, per_piece] =
        both(make_op("Pad", {x.desc}, {{"paddings", pads}}), {x},
             {pad_reference(DataType::F16, x, pads)});
    INFO("batched " << batched << " cycles, per piece " << per_piece);
    CHECK(batched < per_piece);
  }
  // Two run regions a row (ConcatV2 of widths 5 and 6), s64 (two s32 lanes an element).
  for (DataType dt : {DataType::F32, DataType::S64}) {
    HostTensor a = distinct(dt, {4000, 5}, seed++), c = distinct(dt, {4000, 6}, seed++);
    HostTensor want = reference(dt, {4000, 11}, a, [](const Index& i) -> int64_t {
      return i[1] < 5 ? i[0] * 5 + i[1] : -1;
    });
    for (int64_t r = 0; r < 4000; ++r)
      for (int64_t k = 0; k < 6; ++k)
        want.values[static_cast<size_t>(r * 11 + 5 + k)] = c.values[static_cast<size_t>(r * 6 + k)];
    both(make_op("ConcatV2", {a.desc, c.desc}, {{"axis", int64_t{1}}}), {a, c}, {want});
  }
  // A later run region over an earlier one (XlaDynamicUpdateSlice, starts read at run time).
  {
    HostTensor x = distinct(DataType::F32, {500, 23}, seed++);
    HostTensor u = distinct(DataType::F32, {500, 13}, seed++);
    HostTensor starts{TensorDesc{DataType::S32, {2}}, {0, 7}};
    HostTensor want = x;
    for (int64_t r = 0; r < 500; ++r)
      for (int64_t k = 0; k < 13; ++k)
        want.values[static_cast<size_t>(r * 23 + 7 + k)] =
            u.values[static_cast<size_t>(r * 13 + k)];
    both(make_op("XlaDynamicUpdateSlice", {x.desc, u.desc, starts.desc}), {x, u, starts}, {want});
  }
  setenv("NPUSIM_ASSEMBLE_BATCHED_PIECES", "yes", 1);
  HostTensor x = distinct(DataType::F32, {10, 5}, 1);
  CHECK_THROWS_WITH(
      compiler::compile(make_op("Pad", {x.desc}, {{"paddings", Index{0, 0, 1, 1}}}),
                        test_sim().config()),
      Catch::Contains("NPUSIM_ASSEMBLE_BATCHED_PIECES='yes' is neither '0' nor '1'"));
  unsetenv("NPUSIM_ASSEMBLE_BATCHED_PIECES");
}
