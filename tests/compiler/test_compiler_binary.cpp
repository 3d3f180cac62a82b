// Element-wise binary ops compiled for the tiny chip and run on the chip model, against a
// reference in plain C++: each element computed in double from the (exactly representable)
// inputs and rounded once to the output type. The vector unit computes f32 in fp32 and
// f16/bf16 in fp32 rounded once to the type, so for +, -, *, /, max, min the result is the
// correctly rounded value: tolerance 0 for f32 and s32, and 0 for f16/bf16 except
// SquaredDifference, which rounds the difference first (TF does the same): there the
// reference rounds the difference to the type too.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/elementwise.h"
#include "sim/config/chip_config.h"
#include "sim/replay/address_flow.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;

namespace {

using Fn = std::function<double(double, double)>;

struct Case {
  const char* op;
  Fn fn;
  bool compare;
};

const Case kCases[] = {
    {"AddV2", [](double a, double b) { return a + b; }, false},
    {"Sub", [](double a, double b) { return a - b; }, false},
    {"Mul", [](double a, double b) { return a * b; }, false},
    {"RealDiv", [](double a, double b) { return a / b; }, false},
    {"Maximum", [](double a, double b) { return std::max(a, b); }, false},
    {"Minimum", [](double a, double b) { return std::min(a, b); }, false},
    {"SquaredDifference", [](double a, double b) { return (a - b) * (a - b); }, false},
    {"Less", [](double a, double b) { return a < b ? 1.0 : 0.0; }, true},
    {"Equal", [](double a, double b) { return a == b ? 1.0 : 0.0; }, true},
    {"GreaterEqual", [](double a, double b) { return a >= b ? 1.0 : 0.0; }, true},
};

const Case& find_case(const std::string& op) {
  for (const Case& c : kCases)
    if (op == c.op) return c;
  FAIL("no case " << op);
  return kCases[0];
}

// Compiles op(a, b) for tiny (or `cfg`: a config differing from the test chip's in compiler-only
// keys), runs it on the test chip and compares with the reference. Returns the compiled kernel.
compiler::CompiledKernel check_binary(const std::string& op_name, DataType dt,
                                      const std::vector<int64_t>& sa,
                                      const std::vector<int64_t>& sb, uint32_t seed,
                                      const ChipConfig* cfg = nullptr) {
  const Case& c = find_case(op_name);
  INFO(op_name << " " << compiler::data_type_name(dt) << " " << compiler::shape_str(sa) << " op "
               << compiler::shape_str(sb));
  // Operands in [-4, 4] (b away from 0 for RealDiv); few distinct values make ties for the
  // comparisons likely.
  const bool div = op_name == "RealDiv";
  HostTensor a = random_tensor(dt, sa, -4, 4, seed);
  HostTensor b = random_tensor(dt, sb, div ? 0.5 : -4, div ? 4 : 4, seed + 1);
  if (c.compare)
    for (size_t i = 0; i < b.values.size(); ++i)
      if (i % 3 == 0 && !a.values.empty()) b.values[i] = a.values[i % a.values.size()];
  compiler::OpDesc op = make_op(op_name, {a.desc, b.desc});
  compiler::CompiledKernel k = compiler::compile(op, cfg ? *cfg : test_sim().config());
  RunResult r = run_compiled(test_sim(), k, {a, b});
  auto shape = compiler::broadcast_shapes(sa, sb);
  REQUIRE(shape);
  REQUIRE(r.outputs.size() == 1);
  CHECK(r.outputs[0].desc.shape == *shape);
  CHECK(r.outputs[0].desc.dtype == (c.compare ? DataType::BOOL : dt));
  auto ia = broadcast_index(sa, *shape), ib = broadcast_index(sb, *shape);
  std::vector<double> want(ia.size());
  for (size_t i = 0; i < want.size(); ++i) {
    double x = a.values[ia[i]], y = b.values[ib[i]];
    if (op_name == "SquaredDifference") {
      double d = round_to(dt, x - y);
      want[i] = round_to(dt, d * d);
    } else {
      want[i] = c.compare ? c.fn(x, y) : round_to(dt, c.fn(x, y));
    }
  }
  check_close(r.outputs[0].values, want, 0, 0, op_name);
  if (shape->size() && ia.empty()) CHECK(k.launches.empty());
  return k;
}

}  // namespace

TEST_CASE("same-shape binary ops, f32 and f16, odd sizes") {
  for (const char* op : {"AddV2", "Sub", "Mul", "RealDiv", "Maximum", "Minimum",
                         "SquaredDifference"}) {
    check_binary(op, DataType::F32, {3, 37}, {3, 37}, 1);
    check_binary(op, DataType::F16, {5, 40}, {5, 40}, 2);
  }
}

TEST_CASE("s32 and bf16") {
  for (const char* op : {"AddV2", "Sub", "Mul", "Maximum", "Minimum", "SquaredDifference"})
    check_binary(op, DataType::S32, {2, 45}, {45}, 3);
  for (const char* op : {"AddV2", "Mul", "RealDiv", "Minimum"})
    check_binary(op, DataType::BF16, {33, 7}, {33, 1}, 4);
}

// A chip whose vector unit has no bf16 arithmetic (vector.bf16_arithmetic false: the 910b, 910
// and 310p presets, so tiny and tiny_coupled too) gets bf16 Add/Sub/Mul/RealDiv/Maximum/Minimum
// and the comparisons widened to f32: vconv to f32, the instruction in f32, vconv back; the
// results stay correctly rounded (the reference's single rounding), as the native bf16
// instruction's of a chip with the key true (compiled here, not run: the test chip refuses it).
TEST_CASE("bf16 arithmetic widened to f32 where the vector unit has none") {
  const ChipConfig no_bf16 =
      load_chip_config(test_chip_name(), {"vector.bf16_arithmetic=false"});
  const ChipConfig with_bf16 =
      load_chip_config(test_chip_name(), {"vector.bf16_arithmetic=true"});
  REQUIRE_FALSE(no_bf16.vector_bf16_arithmetic);
  REQUIRE(with_bf16.vector_bf16_arithmetic);
  REQUIRE_FALSE(test_sim().config().vector_bf16_arithmetic);  // the presets' value
  const std::pair<const char*, const char*> ops[] = {{"AddV2", "vadd"}, {"Sub", "vsub"},
                                                      {"Mul", "vmul"},   {"RealDiv", "vdiv"},
                                                      {"Maximum", "vmax"}, {"Minimum", "vmin"},
                                                      {"SquaredDifference", "vsub"}};
  for (const auto& [op, mnemonic] : ops) {
    const std::string bf16_insn = std::string(mnemonic) + ".bf16";
    const std::string f32_insn = std::string(mnemonic) + ".f32";
    for (auto [sa, sb] : {std::pair<std::vector<int64_t>, std::vector<int64_t>>{{33, 7}, {33, 7}},
                          {{5, 131}, {131}},
                          {{1}, {3, 67}}}) {
      compiler::CompiledKernel widened = check_binary(op, DataType::BF16, sa, sb, 5, &no_bf16);
      compiler::CompiledKernel native = compiler::compile(
          make_op(op, {TensorDesc{DataType::BF16, sa}, TensorDesc{DataType::BF16, sb}}),
          with_bf16);
      REQUIRE(widened.launches.size() == 1);
      REQUIRE(native.launches.size() == 1);
      const std::string& w = widened.launches[0].kernel.listing;
      const std::string& n = native.launches[0].kernel.listing;
      CHECK(w.find(bf16_insn) == std::string::npos);
      CHECK(w.find(f32_insn) != std::string::npos);
      CHECK(w.find("vconv.f32.bf16") != std::string::npos);
      CHECK(w.find("vconv.bf16.f32") != std::string::npos);
      CHECK(n.find(bf16_insn) != std::string::npos);
    }
  }
  for (const char* op : {"Less", "Equal", "GreaterEqual"}) {
    compiler::CompiledKernel widened = check_binary(op, DataType::BF16, {5, 131}, {131}, 7,
                                                    &no_bf16);
    const std::string& w = widened.launches.at(0).kernel.listing;
    CHECK(w.find("vcmp.bf16") == std::string::npos);
    CHECK(w.find("vcmp.f32") != std::string::npos);
  }
  // f16 and f32 are untouched by the key.
  compiler::CompiledKernel f16 = check_binary("Maximum", DataType::F16, {5, 40}, {5, 40}, 6,
                                              &no_bf16);
  CHECK(f16.launches.at(0).kernel.listing.find("vconv") == std::string::npos);
}

TEST_CASE("comparisons give bool") {
  for (const char* op : {"Less", "Equal", "GreaterEqual"}) {
    check_binary(op, DataType::F32, {4, 50}, {4, 50}, 5);
    check_binary(op, DataType::F16, {3, 17}, {17}, 6);
    check_binary(op, DataType::S32, {9}, {}, 7);
  }
}

TEST_CASE("broadcasting patterns") {
  check_binary("AddV2", DataType::F32, {4, 5}, {}, 10);           // scalar right
  check_binary("Sub", DataType::F16, {}, {7, 9}, 11);             // scalar left
  check_binary("Mul", DataType::F32, {6, 33}, {33}, 12);          // row vector
  check_binary("RealDiv", DataType::F32, {6, 33}, {6, 1}, 13);    // column vector
  check_binary("Maximum", DataType::F16, {3, 1, 5}, {4, 1}, 14);  // both broadcast
  check_binary("SquaredDifference", DataType::F32, {2, 3, 4, 5}, {3, 1, 5}, 15);
  check_binary("Sub", DataType::F32, {1, 16}, {16, 1}, 16);       // outer product shape
  check_binary("AddV2", DataType::F16, {5, 1, 48}, {1, 7, 1}, 17);
  check_binary("Mul", DataType::F32, {1}, {1}, 18);               // one element
  check_binary("AddV2", DataType::F32, {}, {}, 19);               // scalars
  check_binary("Minimum", DataType::F32, {2, 1, 3, 1}, {1, 4, 1, 5}, 20);
}

TEST_CASE("shape grid: multiples and non-multiples of 16, size-1 dims") {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      {{16}, {16}},          {{15}, {15}},         {{17}, {1}},          {{1, 128}, {128}},
      {{129, 1}, {129, 3}},  {{2, 16, 16}, {16}},  {{3, 1, 31}, {3, 5, 31}},
      {{8, 1}, {1, 24}},     {{1, 1, 1}, {2, 1, 65}},
  };
  uint32_t seed = 30;
  for (const auto& [sa, sb] : shapes) {
    check_binary("AddV2", DataType::F32, sa, sb, seed++);
    check_binary("Mul", DataType::F16, sb, sa, seed++);
  }
}

TEST_CASE("large shapes: several tiles per core, resident and gathered operands") {
  check_binary("AddV2", DataType::F32, {70000}, {70000}, 40);        // flat, 4 blocks
  check_binary("Mul", DataType::F32, {300, 130}, {130}, 41);         // periodic, resident
  check_binary("Sub", DataType::F16, {200, 3, 70}, {200, 1, 70}, 42);  // contiguous pieces
  check_binary("RealDiv", DataType::F32, {1000, 37}, {1000, 1}, 43);   // one element per row
  check_binary("Maximum", DataType::F16, {1000, 3}, {3}, 44);        // short period
}

TEST_CASE("gathered rows repeated along the dim above them: copied within the tile") {
  // An attention mask [B, 1, 1, S] over scores [B, N, S, S]: the gather copies a row whose
  // source is the next row's from the tile (whole-block rows); tiles and block ranges cross the
  // batch entries, and rows of 48 bytes (not whole blocks) are loaded one by one as before.
  check_binary("AddV2", DataType::F16, {6, 4, 40, 64}, {6, 1, 1, 64}, 45);
  check_binary("Mul", DataType::F32, {5, 1, 1, 16}, {5, 3, 24, 16}, 46);
  check_binary("Sub", DataType::F16, {4, 3, 10, 24}, {4, 1, 1, 24}, 47);
  check_binary("AddV2", DataType::F32, {3, 2, 50, 8}, {3, 1, 50, 8}, 48);
  // The row copy's test (is this piece's source the last loaded one's?) compares two
  // addresses of the mask, the last one set before the first piece: a timing-only run replays the kernel at other addresses by
  // translation (sim/replay/address_flow.h), as it does the kernels without the copy.
  for (DataType t : {DataType::F16, DataType::F32}) {
    const auto k = compiler::compile(
        make_op("AddV2", {{t, {6, 4, 40, 64}}, {t, {6, 1, 1, 64}}}), test_sim().config());
    for (const compiler::Launch& l : k.launches) {
      INFO(l.summary);
      REQUIRE_THAT(l.kernel.listing, Catch::Matchers::Contains("gather_load"));
      const AddressFlow flow = analyze_address_flow(l.kernel.program);
      INFO(flow.why);
      CHECK(flow.ok);
    }
  }
}

TEST_CASE("zero-size outputs compile to no launch") {
  const ChipConfig& cfg = test_sim().config();
  for (auto [sa, sb] : std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>>{
           {{0}, {0}}, {{3, 0}, {1}}, {{0, 5}, {1, 5}}, {{2, 0, 4}, {4}}}) {
    auto k = compiler::compile(make_op("AddV2", {{DataType::F32, sa}, {DataType::F32, sb}}), cfg);
    CHECK(k.launches.empty());
    CHECK(k.outputs[0].num_elements() == 0);
    CHECK(k.outputs[0].shape == *compiler::broadcast_shapes(sa, sb));
  }
}

TEST_CASE("the kernel follows the config: UB size and vector core count") {
  const compiler::OpDesc op =
      make_op("AddV2", {{DataType::F32, {100000}}, {DataType::F32, {100000}}});
  auto k_tiny = compiler::compile(op, load_chip_config("tiny"));
  auto k_ub = compiler::compile(op, load_chip_config("tiny", {"cores.aiv.buffers.ub=96 KiB"}));
  auto k_cores = compiler::compile(
      op, load_chip_config("tiny", {"cores.aic.count=1", "cores.aiv.count=2"}));
  INFO(k_tiny.launches[0].summary << "\n" << k_ub.launches[0].summary << "\n"
                                   << k_cores.launches[0].summary);
  // f32 AddV2 with two streamed inputs: 6 tiles of 4-byte elements in the UB (in0, in1, out,
  // each ping and pong) plus 32 bytes of alignment slack each, rounded down to 128 elements:
  //   192 KiB: floor((196608 - 6*32) / 24 / 128) * 128 = 8064
  //    96 KiB: floor((98304 - 6*32) / 24 / 128) * 128 = 3968
  CHECK(k_tiny.launches[0].summary.find("tile 8064 elements") != std::string::npos);
  CHECK(k_ub.launches[0].summary.find("tile 3968 elements") != std::string::npos);
  CHECK(k_tiny.launches[0].block_dim == 4);
  CHECK(k_cores.launches[0].block_dim == 2);
}

TEST_CASE("binary op errors name the op and the reason") {
  const ChipConfig& cfg = test_sim().config();
  CHECK_THROWS_WITH(
      compiler::compile(make_op("AddV2", {{DataType::F32, {3, 4}}, {DataType::F32, {5}}}), cfg),
      Catch::Contains("AddV2(f32[3,4], f32[5])") && Catch::Contains("not broadcast-compatible"));
  CHECK_THROWS_WITH(
      compiler::compile(make_op("RealDiv", {{DataType::S32, {3}}, {DataType::S32, {3}}}), cfg),
      Catch::Contains("dtype s32 is not supported"));
  CHECK_THROWS_WITH(
      compiler::compile(make_op("Mul", {{DataType::F32, {3}}, {DataType::F16, {3}}}), cfg),
      Catch::Contains("different dtypes"));
  compiler::OpDesc op = make_op("Sub", {{DataType::F32, {3}}, {DataType::F32, {3}}});
  op.outputs = {{DataType::F32, {4}}};
  CHECK_THROWS_WITH(compiler::compile(op, cfg), Catch::Contains("expects outputs (f32[4])"));
}

TEST_CASE("shared reads in staggered parts: the plan and its order") {
  // The 910b with same-line serialisation in the L2 (memory.l2.line_read_bytes_per_cycle R =
  // 302.6): the broadcast row of Maximum f16 [255, 8193] op [8193] (16,386 bytes, read by all 48
  // vector cores) is cut into parts of whole L2 lines; block b loads part (b + step) % parts at
  // each step, so that at most ceil(blocks / parts) blocks in step read one part.
  const ChipConfig plain = load_chip_config("910b", {"memory.l2.line_read_bytes_per_cycle=0"});
  const ChipConfig serial = load_chip_config("910b", {"memory.l2.line_read_bytes_per_cycle=302.6"});
  REQUIRE(plain.l2_line_read_bytes_per_cycle == 0);
  const int64_t row = 8193 * 2, line = serial.l2_line_bytes;
  const int64_t blocks = serial.core_kind(isa::CoreKind::AIV)->count;
  using compiler::ops::plan_shared_read_parts;
  const compiler::ops::SharedReadParts p = plan_shared_read_parts(serial, row, blocks, "Maximum");
  INFO("parts of " << p.part_bytes << " B: " << p.parts << ", " << p.sharers << " blocks a part");
  REQUIRE(p.part_bytes > 0);
  CHECK(p.part_bytes % line == 0);
  CHECK(p.part_bytes < row);
  CHECK(p.parts == (row + p.part_bytes - 1) / p.part_bytes);  // the row's parts, whole lines
  CHECK(p.sharers == (blocks + p.parts - 1) / p.parts);
  // Fewer blocks on a line than unsplit, each at a larger share of R.
  CHECK(p.sharers < blocks);
  for (int64_t step = 0; step < p.parts; ++step) {
    std::vector<int64_t> on(static_cast<size_t>(p.parts), 0);
    for (int64_t b = 0; b < blocks; ++b)
      ++on[static_cast<size_t>(compiler::ops::shared_read_part_at(p.parts, b, step))];
    CHECK(*std::max_element(on.begin(), on.end()) <= p.sharers);
  }
  for (int64_t b = 0; b < blocks; ++b) {  // each block loads every part once
    std::vector<int> seen(static_cast<size_t>(p.parts), 0);
    for (int64_t step = 0; step < p.parts; ++step)
      ++seen[static_cast<size_t>(compiler::ops::shared_read_part_at(p.parts, b, step))];
    CHECK(std::count(seen.begin(), seen.end(), 1) == p.parts);
  }
  // No split: R = 0, one block, a piece of one line.
  CHECK(plan_shared_read_parts(plain, row, blocks, "Maximum").part_bytes == 0);
  CHECK(plan_shared_read_parts(serial, row, 1, "Maximum").part_bytes == 0);
  CHECK(plan_shared_read_parts(serial, line, blocks, "Maximum").part_bytes == 0);
  // The switch, and its bad value named.
  setenv("NPUSIM_STAGGERED_SHARED_READS", "0", 1);
  CHECK(plan_shared_read_parts(serial, row, blocks, "Maximum").part_bytes == 0);
  const compiler::OpDesc op = make_op("Maximum", {{DataType::F16, {255, 8193}}, {DataType::F16, {8193}}});
  for (const compiler::Launch& l : compiler::compile(op, serial).launches)
    CHECK(l.summary.find("staggered parts") == std::string::npos);
  setenv("NPUSIM_STAGGERED_SHARED_READS", "2", 1);
  CHECK_THROWS_WITH(plan_shared_read_parts(serial, row, blocks, "Maximum"),
                    Catch::Contains("NPUSIM_STAGGERED_SHARED_READS='2'"));
  unsetenv("NPUSIM_STAGGERED_SHARED_READS");
  bool staggered = false;
  for (const compiler::Launch& l : compiler::compile(op, serial).launches) {
    INFO(l.summary);
    staggered |= l.summary.find("in staggered parts of") != std::string::npos;
  }
  CHECK(staggered);
  for (const compiler::Launch& l : compiler::compile(op, plain).launches)
    CHECK(l.summary.find("staggered parts") == std::string::npos);
}

TEST_CASE("shared reads in staggered parts: the kernel gives the same bits as one load a piece") {
  // A plan for the test chip with R set (R moves only time), run on the test chip: values
  // against the reference, and bit for bit against the kernel without parts. Rows of 8193 and
  // 3001 elements (pieces starting anywhere in a part, the first before the input's start),
  // rows repeated along a dim above a contiguous one, f32; a resident row loaded whole (one
  // period, 4 KiB).
  const ChipConfig& chip = test_sim().config();
  ChipConfig serial = chip;
  serial.l2_line_read_bytes_per_cycle = 302.6;
  struct Shapes {
    std::vector<int64_t> a, b;
    DataType t;
  };
  int staggered = 0;
  uint32_t seed = 700;
  for (const Shapes& s : {Shapes{{24, 8193}, {8193}, DataType::F16},
                          Shapes{{37, 3001}, {3001}, DataType::F32},
                          Shapes{{5, 7, 1500}, {5, 1, 1500}, DataType::F16},
                          Shapes{{3001}, {40, 3001}, DataType::F32},
                          Shapes{{64, 1024}, {1024}, DataType::F32}}) {
    INFO(compiler::shape_str(s.a) << " op " << compiler::shape_str(s.b));
    const compiler::CompiledKernel k = check_binary("Maximum", s.t, s.a, s.b, seed, &serial);
    for (const compiler::Launch& l : k.launches) {
      INFO(l.summary);
      staggered += l.summary.find("in staggered parts of") != std::string::npos;
    }
    HostTensor a = random_tensor(s.t, s.a, -4, 4, seed), b = random_tensor(s.t, s.b, -4, 4, seed + 1);
    const compiler::OpDesc op = make_op("Maximum", {a.desc, b.desc});
    const RunResult parted = run_compiled(test_sim(), compiler::compile(op, serial), {a, b});
    const RunResult whole = run_compiled(test_sim(), compiler::compile(op, chip), {a, b});
    CHECK(parted.outputs[0].values == whole.outputs[0].values);
    ++seed;
  }
  if (chip.core_kind(chip.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE)->count > 1)
    CHECK(staggered >= 4);
}
