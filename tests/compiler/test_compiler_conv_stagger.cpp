// The convolutions' shared loads staggered across the cube cores (NPUSIM_CONV_STAGGERED_LOADS;
// ops/conv.h filter_grad_dy_part_blocks, conv_staggered_weights): on a chip that serialises
// reads of one L2 line (memory.l2.line_read_bytes_per_cycle R > 0) the filter gradient loads a
// chunk's dy rows in parts and the convolutions their weights' k-blocks (or taps) from a
// core-dependent first one on. Only the load order moves: the kernels give the same bits as
// without, and the values of the double references (tests/compiler/conv_reference.h). The
// kernels are planned for the test chip with R set (R moves only time) and run on the test chip.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <utility>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/cube_pipeline.h"
#include "adapter/compiler/ops/elementwise.h"
#include "common/int_math.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"
#include "tests/compiler/conv_reference.h"

using namespace npusim;
using namespace npusim::test;
using namespace npusim::test::conv;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

struct ScopedEnv {
  ScopedEnv(const char* name, const char* value) : name(name) { setenv(name, value, 1); }
  ~ScopedEnv() { unsetenv(name); }
  const char* name;
};

// The test chip with same-line serialisation: R below one core's L2 read port, so that two
// cores on one line already slow each other (the test chip has few cube cores).
ChipConfig serial_chip() {
  ChipConfig c = test_sim().config();
  c.l2_line_read_bytes_per_cycle =
      c.l2_read_bytes_per_cycle > 0 ? c.l2_read_bytes_per_cycle / 2 : 64;
  return c;
}

// The filter gradient of a dense x (NHWC, SAME padding) as the fused kernel's spec.
compiler::ops::FilterGradSpec filter_grad_spec(const ConvCase& c) {
  compiler::ops::FilterGradSpec s;
  s.images = c.n;
  s.h = c.h;
  s.w = c.w;
  s.c = c.c;
  s.cout = c.cout;
  s.kh = c.kh;
  s.kw = c.kw;
  s.pt = s.pb = c.kh / 2;
  s.pl = s.pr = c.kw / 2;
  s.pitch = c.cout;
  return s;
}

bool mentions(const compiler::CompiledKernel& k, const std::string& text) {
  return std::any_of(k.launches.begin(), k.launches.end(), [&](const compiler::Launch& l) {
    return l.summary.find(text) != std::string::npos;
  });
}

}  // namespace

TEST_CASE("conv staggered loads: the filter gradient's dy parts, their plan and order") {
  // ResNet-50's 3x3 256 -> 256 filter gradient at 14 x 14, batch 8, on the 910b with R = 302.6
  // (docs/validation.md): 24 blocks on one weight key read every chunk's dy rows at once. The
  // plan cuts the chunk into parts of whole 16-row blocks (each whole L2 lines: 16 rows of 256
  // channels), with at most ceil(readers / parts) cores a part at each step of the order core b
  // follows (part (b % n + step) % n), each part once a core; the tiling the one chosen at
  // R = 0 (the estimate prices no R); none at R = 0 or under the switch, and the switch's bad
  // value named.
  ChipConfig cfg = load_chip_config("910b", {"memory.l2.line_read_bytes_per_cycle=0"});
  const std::string op = "Conv2DBackpropFilter";
  const compiler::ops::FilterGradSpec s = filter_grad_spec(ConvCase{8, 14, 14, 256, 3, 3, 256});
  const compiler::ops::FilterGradTiling plain = compiler::ops::plan_filter_grad(s, cfg, op);
  CHECK(plain.dy_part_blocks == 0);
  cfg.l2_line_read_bytes_per_cycle = 302.6;
  const compiler::ops::FilterGradTiling t = compiler::ops::plan_filter_grad(s, cfg, op);
  CHECK((t.tp == plain.tp && t.tk == plain.tk && t.tn == plain.tn && t.cycles == plain.cycles));
  INFO("tp " << t.tp << ", tn " << t.tn << ", blocks " << t.block_dim << ", k tiles " << t.k_tiles
             << ", per " << t.per << ", part blocks " << t.dy_part_blocks);
  REQUIRE(t.dy_part_blocks > 0);
  const int64_t part_rows = t.dy_part_blocks * 16;
  CHECK(part_rows * s.cout * 2 % static_cast<int64_t>(cfg.l2_line_bytes) == 0);
  const int64_t readers = t.block_dim;  // at most
  const int64_t parts = ceil_div(std::min(t.tp, s.oh() * s.ow()), part_rows);
  REQUIRE(parts > 1);
  const int64_t sharers = ceil_div(readers, parts);
  CHECK(sharers <= 2);  // R / 2 = 151 B/cycle: two cores on a line still each get the port's 110
  for (int64_t step = 0; step < parts; ++step) {
    std::vector<int64_t> on(static_cast<size_t>(parts), 0);
    for (int64_t b = 0; b < readers; ++b)
      ++on[static_cast<size_t>(compiler::ops::shared_read_part_at(parts, b, step))];
    CHECK(*std::max_element(on.begin(), on.end()) <= sharers);
  }
  for (int64_t b = 0; b < readers; ++b) {
    std::set<int64_t> seen;
    for (int64_t step = 0; step < parts; ++step)
      seen.insert(compiler::ops::shared_read_part_at(parts, b, step));
    CHECK(static_cast<int64_t>(seen.size()) == parts);
  }
  {
    ScopedEnv off("NPUSIM_CONV_STAGGERED_LOADS", "0");
    CHECK(compiler::ops::plan_filter_grad(s, cfg, op).dy_part_blocks == 0);
  }
  {
    ScopedEnv bad("NPUSIM_CONV_STAGGERED_LOADS", "2");
    CHECK_THROWS_WITH(compiler::ops::plan_filter_grad(s, cfg, op),
                      Catch::Contains("NPUSIM_CONV_STAGGERED_LOADS='2'"));
  }
}

TEST_CASE("conv staggered loads: the filter gradient gives the same bits with dy in parts") {
  // Every tiling of the test chip with R whose dy rows go in parts (chunk sizes with a partial
  // last part and chunks that end an image early), against the double reference and bit for
  // bit against the same tiling with one nd2nz a chunk.
  const ChipConfig serial = serial_chip();
  const std::string op = "Conv2DBackpropFilter";
  int staggered = 0;
  uint32_t seed = 300;
  for (const ConvCase& c : {ConvCase{2, 14, 14, 64, 3, 3, 48}, ConvCase{1, 9, 11, 32, 3, 3, 40}}) {
    INFO("x " << c.n << "x" << c.h << "x" << c.w << "x" << c.c << " -> " << c.cout);
    const compiler::ops::FilterGradSpec s = filter_grad_spec(c);
    HostTensor x = random_tensor(DataType::F16, {c.n, c.h, c.w, c.c}, -2, 2, seed);
    HostTensor dy = random_tensor(DataType::F16, y_shape(c), -1, 1, seed + 1);
    seed += 2;
    const Reference ref = filter_grad_reference(c, x, dy);
    std::set<std::pair<int64_t, int64_t>> tried;  // (tp, dy_part_blocks)
    for (const compiler::ops::FilterGradTiling& t :
         compiler::ops::filter_grad_tilings(s, serial, op)) {
      if (t.dy_part_blocks == 0 || !tried.insert({t.tp, t.dy_part_blocks}).second) continue;
      if (tried.size() > 3) break;
      INFO("tp " << t.tp << ", tk " << t.tk << ", tn " << t.tn << ", parts of "
                 << t.dy_part_blocks * 16 << " rows, " << t.block_dim << " blocks");
      compiler::ops::FilterGradTiling whole = t;
      whole.dy_part_blocks = 0;
      std::vector<double> out[2];
      for (int parted : {0, 1}) {
        compiler::CompiledKernel k;
        k.outputs = {TensorDesc{DataType::F32, {1, c.kh * c.kw * c.c, c.cout}}};
        k.launches.push_back(compiler::ops::with_args(
            compiler::ops::build_filter_grad(s, parted ? t : whole, serial, op),
            {compiler::ops::input_ref(0), compiler::ops::input_ref(1),
             compiler::ops::output_ref(0)}));
        CHECK(mentions(k, "dy rows in staggered parts") == (parted == 1));
        const RunResult r = run_compiled(test_sim(), k, {x, dy});
        check_against(r.outputs[0].values, ref, DataType::F32, false, "dW");
        out[parted] = r.outputs[0].values;
      }
      CHECK(out[1] == out[0]);
      ++staggered;
    }
  }
  CHECK(staggered >= 2);
}

TEST_CASE("conv staggered loads: the convolutions' weights staggered give the same bits") {
  // Conv2D (kRowsK weights, a k-block a copy; the filter in blocks of 16 output channels, a
  // copy per (column block, tap)) and Conv2DBackpropInput (kRowsN: a k-block a copy, or by tap
  // under NPUSIM_CONV_WEIGHT_RUNS=1) planned with R: the launch says its
  // weights are staggered, y / dx match the double reference and, bit for bit, the kernel
  // planned without R (R moves only time here; the plans are the same otherwise: the planner
  // does not price R).
  // The chip without serialisation (the 910b preset has it): the unstaggered kernels.
  ChipConfig chip = test_sim().config();
  chip.l2_line_read_bytes_per_cycle = 0;
  const ChipConfig serial = serial_chip();
  const CoreKindConfig& cube = compiler::ops::cube_core(chip, "test");
  if (cube.count < 2) return;  // one block: nothing to stagger
  const ConvCase a{2, 10, 10, 48, 3, 3, 64};
  const ConvCase b{1, 12, 9, 40, 3, 3, 24};
  uint32_t seed = 400;
  for (const ConvCase& c : {a, b}) {
    INFO("x " << c.n << "x" << c.h << "x" << c.w << "x" << c.c << " -> " << c.cout);
    HostTensor x = random_tensor(DataType::F16, {c.n, c.h, c.w, c.c}, -2, 2, seed);
    HostTensor f = random_tensor(DataType::F16, filter_shape(c), -1, 1, seed + 1);
    seed += 2;
    const compiler::OpDesc op = make_op("Conv2D", {x.desc, f.desc}, c.attrs());
    const compiler::CompiledKernel ks = compiler::compile(op, serial);
    const compiler::CompiledKernel k0 = compiler::compile(op, chip);
    summarize(ks);
    CHECK(mentions(ks, "staggered"));
    CHECK_FALSE(mentions(k0, "staggered"));
    const RunResult rs = run_compiled(test_sim(), ks, {x, f});
    const RunResult r0 = run_compiled(test_sim(), k0, {x, f});
    Reference ref = new_reference(static_cast<size_t>(rs.outputs[0].values.size()));
    for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
      accumulate(ref, yi, x.values[static_cast<size_t>(xi)] * f.values[static_cast<size_t>(fi)]);
    });
    check_against(rs.outputs[0].values, ref, DataType::F16, false, "y");
    CHECK(rs.outputs[0].values == r0.outputs[0].values);
    if (c.cout % 16 == 0 && c.c % 16 == 0) {
      // The filter in blocks of 16 output channels (a copy per (column block, tap); whole
      // blocks of input channels: a partial one is not staggered, conv_staggered_weights).
      const compiler::OpDesc bop = make_op("Conv2D", {x.desc, f.desc}, with_layout(c.attrs()));
      const compiler::CompiledKernel kb = compiler::compile(bop, serial);
      summarize(kb);
      CHECK(mentions(kb, "(column block, tap) copies staggered"));
      const RunResult rb = run_compiled(test_sim(), kb, {x, to_blocked(f)});
      CHECK(rb.outputs[0].values == r0.outputs[0].values);
    }
    for (const char* runs : {"0", "1"}) {
      INFO("NPUSIM_CONV_WEIGHT_RUNS=" << runs);
      ScopedEnv by("NPUSIM_CONV_WEIGHT_RUNS", runs);
      const BackpropInputRun s = check_conv2d_backprop_input(
          DataType::F16, c, seed, compiler::PrecisionMode::kAllowFp32ToFp16, false, &serial);
      const BackpropInputRun p = check_conv2d_backprop_input(
          DataType::F16, c, seed, compiler::PrecisionMode::kAllowFp32ToFp16, false, &chip);
      CHECK(mentions(s.launches, "staggered"));
      CHECK_FALSE(mentions(p.launches, "staggered"));
      CHECK(s.dx == p.dx);
    }
  }
  {
    ScopedEnv off("NPUSIM_CONV_STAGGERED_LOADS", "0");
    HostTensor x = random_tensor(DataType::F16, {a.n, a.h, a.w, a.c}, -2, 2, 1);
    HostTensor f = random_tensor(DataType::F16, filter_shape(a), -1, 1, 2);
    CHECK_FALSE(mentions(compiler::compile(make_op("Conv2D", {x.desc, f.desc}, a.attrs()), serial),
                         "staggered"));
  }
}
