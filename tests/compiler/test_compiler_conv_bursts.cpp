// A convolution's feature-map load by whole pixels (SlabEmitter::Geometry::whole_pixels) and
// the input gradient's weights by tap (CubeConvTiling::weights_by_tap): the
// GM bursts its nd2nz issues, derived from the slab's bytes and rows, on a chip whose DMA
// prices each burst (mte.burst_cycles). One Simulator per process, hence a file of its own.
#include <catch2/catch.hpp>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "sim/counters/observer.h"
#include "tests/compiler/compiler_test_util.h"
#include "tests/compiler/conv_reference.h"

using namespace npusim;
using namespace npusim::test;
using namespace npusim::test::conv;
using compiler::DataType;

namespace {
// The MTE2 cycles of every nd2nz whose src_stride is the immediate `pitch` (the slab's: x's
// channels; B's and dy's rows are other pitches in the cases below), per core.
struct SlabLoadTimes : ChipObserver {
  int64_t pitch = 0;
  std::vector<double> cycles;
  void on_core(int, const std::string&) override {}
  void on_kernel_begin(const isa::Program&, int, uint64_t) override {}
  void on_kernel_end(const isa::Program&, uint64_t, bool) override {}
  void on_instruction(int, Lane lane, uint64_t start, uint64_t end, uint32_t,
                      const isa::Instruction& in, const isa::Section&) override {
    if (lane != Lane::MTE2 || in.op != isa::Opcode::op_nd2nz) return;
    const isa::Operand& stride =
        in.ops[static_cast<size_t>(isa::field_index(isa::Opcode::op_nd2nz, "src_stride"))];
    if (!stride.is_reg && stride.value == pitch)
      cycles.push_back(static_cast<double>(end - start) / 1000.0);
  }
  void on_flow_begin(int, Lane, uint64_t, uint64_t) override {}
  void on_flow_end(int, Lane, uint64_t, uint64_t) override {}
  void on_hdc(bool, uint64_t, uint64_t, uint64_t) override {}
};
// The test chip whose DMA spends 1000 cycles a GM burst (mte.burst_cycles; no per-copy cost).
Simulator& burst_sim() {
  static Simulator sim(
      load_chip_config(test_chip_name(), {"mte.copy_issue_cycles=0", "mte.burst_cycles=1000"}),
      SimOptions{});
  return sim;
}
}  // namespace

TEST_CASE("A dense slab by whole pixels: bytes / 512 + rows GM bursts at most") {
  // On a chip whose DMA spends 1000 cycles a GM burst (mte.burst_cycles; no per-copy cost)
  // the planner takes whole pixels by its estimate, and the slab's nd2nz holds MTE2 for its
  // bursts x 1000 cycles (its data takes a few hundred). One image of 8 x 8 pixels of C
  // channels of 2 bytes, a 1x1 window: the slab is one contiguous run of 64 x 2C bytes from
  // x's 512-byte-aligned start, 2C / 8 bursts, and at most bytes / 512 + rows (8) wherever a
  // slab starts; per plane it would be 64 bursts a plane (C / 16 planes).
  Simulator& sim = burst_sim();
  const ChipConfig& cfg = sim.config();
  for (int64_t c : {64, 40}) {
    INFO("channels " << c);
    const ConvCase cc{1, 8, 8, c, 1, 1, 16};
    HostTensor x = random_tensor(DataType::F16, {1, 8, 8, c}, -2, 2, 313);
    HostTensor f = random_tensor(DataType::F16, {1, 1, c, 16}, -1, 1, 314);
    const compiler::CompiledKernel k =
        compiler::compile(make_op("Conv2D", {x.desc, f.desc}, cc.attrs()), cfg);
    summarize(k);
    bool whole = false;
    for (const compiler::Launch& l : k.launches)
      whole = whole || l.summary.find("by whole pixels") != std::string::npos;
    REQUIRE(whole);
    SlabLoadTimes times;
    times.pitch = c;
    sim.add_observer(&times);
    run_compiled(sim, k, {x, f});
    sim.remove_observer(&times);
    // (the tiny chip may split the 64 positions into a tile per core: the bounds hold for the
    // slabs' sums)
    REQUIRE(!times.cycles.empty());
    const double bytes = 64.0 * 2 * static_cast<double>(c);
    double bursts = 0;
    for (double t : times.cycles) bursts += t / 1000;
    CHECK(bursts >= std::ceil(bytes / 512) - 0.5);
    CHECK(bursts <= bytes / 512 + 8 + 1);                       // + 1: the data's own cycles
    CHECK(bursts < 64.0 * static_cast<double>((c + 15) / 16));  // per plane's count
  }
}

TEST_CASE("The input gradient's weights by tap: one 1 KiB run a tap, 2 GM bursts") {
  // Conv2DBackpropInput of one 8 x 8 x 16 image by a 3x3 filter of 16 -> 32 channels, stride 2:
  // B (kRowsN: n = dx's 16 channels, rows 32 channels = 64 bytes apart) is the only nd2nz of
  // src_stride 32 (dy's zero-inserted slab is copied pixel by pixel). By tap (the planner's
  // choice where each burst costs 1000 cycles) a tap's 16 rows of both channel blocks are one
  // contiguous 1 KiB run from a 32-byte-aligned start: 2 bursts, 3 where it straddles a third
  // 512-byte block; 9 nd2nz (one a tap) per load of B. One nd2nz per (16 channels, tap)
  // (NPUSIM_CONV_WEIGHT_RUNS=0) reads 16 rows of 32 bytes, 16 bursts each, 18 per load.
  Simulator& sim = burst_sim();
  ConvCase cc = ConvCase{1, 8, 8, 16, 3, 3, 32}.window(2, 2, 1, 1, "SAME");
  HostTensor f = random_tensor(DataType::F16, filter_shape(cc), -1, 1, 331);
  HostTensor dy = random_tensor(DataType::F16, y_shape(cc), -2, 2, 332);
  for (const char* runs : {"", "0"}) {
    INFO("NPUSIM_CONV_WEIGHT_RUNS='" << runs << "'");
    setenv("NPUSIM_CONV_WEIGHT_RUNS", runs, 1);
    OpDesc op = make_op("Conv2DBackpropInput", {f.desc, dy.desc}, cc.attrs());
    op.attrs["input_sizes"] = std::vector<int64_t>{1, 8, 8, 16};
    const compiler::CompiledKernel k = compiler::compile(op, sim.config());
    unsetenv("NPUSIM_CONV_WEIGHT_RUNS");
    summarize(k);
    bool by_tap = false;
    for (const compiler::Launch& l : k.launches)
      by_tap = by_tap || l.summary.find("by tap") != std::string::npos;
    const bool per_block = std::string(runs) == "0";
    REQUIRE(by_tap == !per_block);
    SlabLoadTimes times;
    times.pitch = 32;
    sim.add_observer(&times);
    run_compiled(sim, k, {f, dy});
    sim.remove_observer(&times);
    REQUIRE(!times.cycles.empty());
    CHECK(times.cycles.size() % (per_block ? 18 : 9) == 0);
    for (double t : times.cycles) {
      const double bursts = t / 1000;
      CHECK(bursts >= (per_block ? 16 : 2));
      CHECK(bursts < (per_block ? 16 : 3) + 1);  // + the data's own cycles
    }
  }
}

namespace {
// The MTE2 copy_gm2l1 instructions of a run and MTE2's time on them in thousands of cycles (the
// GM bursts on burst_sim; the strided view's slab loads: nothing else of the filter gradient
// uses copy_gm2l1).
struct CopyTimes : ChipObserver {
  int64_t copies = 0;
  double bursts = 0;
  void on_core(int, const std::string&) override {}
  void on_kernel_begin(const isa::Program&, int, uint64_t) override {}
  void on_kernel_end(const isa::Program&, uint64_t, bool) override {}
  void on_instruction(int, Lane lane, uint64_t start, uint64_t end, uint32_t,
                      const isa::Instruction& in, const isa::Section&) override {
    if (lane != Lane::MTE2 || in.op != isa::Opcode::op_copy_gm2l1) return;
    ++copies;
    bursts += static_cast<double>(end - start) / 1e6;  // (the other cases' cycles / 1000)
  }
  void on_flow_begin(int, Lane, uint64_t, uint64_t) override {}
  void on_flow_end(int, Lane, uint64_t, uint64_t) override {}
  void on_hdc(bool, uint64_t, uint64_t, uint64_t) override {}
};
}  // namespace

TEST_CASE("The filter gradient's strided view per pixel: fewer GM bursts, the same dW") {
  // Conv2DBackpropFilter of 2 images of 8 x 8 x 64 by a 1x1 window of stride 2 into 32
  // channels: x is read as a strided view (every other row and pixel). Per pixel a pixel's
  // planes (those of its tile's img2col rows, 16 a plane) are one run of at most 128 bytes
  // within its 256-byte-aligned pixel: one burst a copy. As before (the per plane and column or
  // per plane and row copies) each plane of a pixel is a 32-byte run of its own, a burst each:
  // where each burst costs 1000 cycles the planner takes per pixel wherever a tile has more
  // than one plane (`NPUSIM_FILTER_GRAD_STRIDED_PIXELS` unset; "1": per pixel always, "0": as
  // before). Every way gives dW = x^T x dy of the strided pixels (the reference).
  Simulator& sim = burst_sim();
  ConvCase cc = ConvCase{2, 8, 8, 64, 1, 1, 32}.window(2, 2, 1, 1, "VALID");
  HostTensor x = random_tensor(DataType::F16, {cc.n, cc.h, cc.w, cc.c}, -2, 2, 341);
  HostTensor dy = random_tensor(DataType::F16, y_shape(cc), -1, 1, 342);
  const Reference ref = filter_grad_reference(cc, x, dy);
  const int64_t pixels = cc.n * 4 * 4;  // the view's pixels, each loaded at least once
  for (const char* mode : {"", "1", "0"}) {
    INFO("NPUSIM_FILTER_GRAD_STRIDED_PIXELS='" << mode << "'");
    setenv("NPUSIM_FILTER_GRAD_STRIDED_PIXELS", mode, 1);
    setenv("NPUSIM_FILTER_GRAD_ROW_VIEW", "0", 1);  // the strided view (the next case: rows)
    OpDesc op = make_op("Conv2DBackpropFilter", {x.desc, dy.desc}, cc.attrs());
    op.attrs["filter_sizes"] = filter_shape(cc);
    const compiler::CompiledKernel k = compiler::compile(op, sim.config());
    unsetenv("NPUSIM_FILTER_GRAD_STRIDED_PIXELS");
    unsetenv("NPUSIM_FILTER_GRAD_ROW_VIEW");
    summarize(k);
    bool per_pixel = false;
    int64_t tile_rows = 0;
    for (const compiler::Launch& l : k.launches) {
      per_pixel = per_pixel || l.summary.find("slab loaded per pixel") != std::string::npos;
      const size_t at = l.summary.find("tiles of ");
      if (at != std::string::npos) tile_rows = std::stoll(l.summary.substr(at + 9));
    }
    REQUIRE(tile_rows > 0);
    const std::string m = mode;
    if (m == "0") CHECK(!per_pixel);
    if (m == "1") CHECK(per_pixel);
    if (m.empty()) CHECK(per_pixel == (tile_rows > 16));
    CopyTimes times;
    sim.add_observer(&times);
    RunResult r = run_compiled(sim, k, {x, dy});
    sim.remove_observer(&times);
    check_against(r.outputs[0].values, ref, DataType::F16, false, "dW");
    if (!per_pixel) continue;
    // One copy a pixel of a chunk, one burst each (+ its data's few cycles).
    CHECK(times.copies >= pixels);
    CHECK(times.bursts >= static_cast<double>(times.copies) - 0.5);
    CHECK(times.bursts < static_cast<double>(times.copies) * 1.5);
  }
}

namespace {
// op compiled with the environment variable `name` set to `value` (unset after), summarized.
compiler::CompiledKernel compile_with(const char* name, const char* value, const OpDesc& op,
                                      Simulator& sim) {
  setenv(name, value, 1);
  const compiler::CompiledKernel k = compiler::compile(op, sim.config());
  unsetenv(name);
  summarize(k);
  return k;
}
// A run of k, its copy_gm2l1 count and its slab nd2nz (src_stride `pitch`) count.
struct SlabRun {
  RunResult r;
  int64_t copies = 0;
  size_t slab_loads = 0;
};
SlabRun run_counting(Simulator& sim, const compiler::CompiledKernel& k,
                     const std::vector<HostTensor>& inputs, int64_t pitch) {
  CopyTimes copies;
  SlabLoadTimes slabs;
  slabs.pitch = pitch;
  sim.add_observer(&copies);
  sim.add_observer(&slabs);
  SlabRun run{run_compiled(sim, k, inputs)};
  sim.remove_observer(&slabs);
  sim.remove_observer(&copies);
  run.copies = copies.copies;
  run.slab_loads = slabs.cycles.size();
  return run;
}
}  // namespace

TEST_CASE("The filter gradient's row view: x's rows whole, one nd2nz a slab, the same dW") {
  // Conv2DBackpropFilter by a window one pixel wide of stride sw along W without padding along
  // W: x [N,H,W,C] read as the dense map [N,H,W/sw,sw*C] (a pixel of it: sw of x's, the window's
  // pixel its first C channels), the window of stride 1 along W. Each slab is one nd2nz of its
  // pixels (src_stride sw*C) and no copy_gm2l1 a pixel. NPUSIM_FILTER_GRAD_ROW_VIEW=1 forces
  // it, "0" keeps the strided view, unset the lower estimate (here, bursts without a cost a
  // copy, the strided view: the row view reads the rows and pixels between too). Every way
  // gives the reference's dW. Cases: the 1x1 stride-2
  // window; a 3x1 window of strides (1, 3), SAME (padding along H only), 40 channels (pixels
  // of 120, not whole 32-byte blocks).
  Simulator& sim = burst_sim();
  const ConvCase cases[] = {ConvCase{2, 8, 8, 64, 1, 1, 32}.window(2, 2, 1, 1, "VALID"),
                            ConvCase{2, 6, 9, 40, 3, 1, 24}.window(1, 3, 1, 1, "SAME")};
  for (const ConvCase& cc : cases) {
    INFO("x " << cc.h << "x" << cc.w << "x" << cc.c << ", window " << cc.kh << "x" << cc.kw);
    HostTensor x = random_tensor(DataType::F16, {cc.n, cc.h, cc.w, cc.c}, -2, 2, 361);
    HostTensor dy = random_tensor(DataType::F16, y_shape(cc), -1, 1, 362);
    const Reference ref = filter_grad_reference(cc, x, dy);
    // dW and its part count ("N parts" of the summary) of the forced and the strided view: the
    // same part count adds each element's products in the same order (the same bits).
    std::map<std::string, std::pair<std::vector<double>, std::string>> by_mode;
    for (const char* mode : {"", "1", "0"}) {
      INFO("NPUSIM_FILTER_GRAD_ROW_VIEW='" << mode << "'");
      OpDesc op = make_op("Conv2DBackpropFilter", {x.desc, dy.desc}, cc.attrs());
      op.attrs["filter_sizes"] = filter_shape(cc);
      const compiler::CompiledKernel k = compile_with("NPUSIM_FILTER_GRAD_ROW_VIEW", mode, op, sim);
      bool rows = false;
      std::string parts;
      for (const compiler::Launch& l : k.launches) {
        rows = rows || l.summary.find("x's rows read whole") != std::string::npos;
        const size_t at = l.summary.find(" parts: ");
        if (at != std::string::npos)
          parts = l.summary.substr(l.summary.rfind(' ', at - 1) + 1,
                                   at - l.summary.rfind(' ', at - 1) - 1);
      }
      if (std::string(mode) != "") CHECK(rows == (std::string(mode) == "1"));
      const SlabRun run = run_counting(sim, k, {x, dy}, cc.sw * cc.c);
      check_against(run.r.outputs[0].values, ref, DataType::F16, false, "dW");
      by_mode[mode] = {run.r.outputs[0].values, parts};
      if (!rows) continue;
      CHECK(run.copies == 0);
      CHECK(run.slab_loads > 0);
    }
    REQUIRE(!by_mode["1"].second.empty());
    if (by_mode["1"].second == by_mode["0"].second) CHECK(by_mode["1"].first == by_mode["0"].first);
  }
  setenv("NPUSIM_FILTER_GRAD_ROW_VIEW", "2", 1);
  OpDesc op =
      make_op("Conv2DBackpropFilter",
              {TensorDesc{DataType::F16, {2, 8, 8, 64}}, TensorDesc{DataType::F16, {2, 4, 4, 32}}},
              cases[0].attrs());
  op.attrs["filter_sizes"] = filter_shape(cases[0]);
  CHECK_THROWS_WITH(compiler::compile(op, sim.config()),
                    Catch::Contains("NPUSIM_FILTER_GRAD_ROW_VIEW='2'"));
  unsetenv("NPUSIM_FILTER_GRAD_ROW_VIEW");
}

TEST_CASE("The filter gradient of a stem window over 3 channels: unfolded where bursts cost") {
  // Conv2DBackpropFilter of 2 images of 21 x 21 x 3 by a 7x7 window of stride 2 into 16
  // channels. The width-folded view (21 channels a pixel, viewed with pixels 2 x 3 channels = 12
  // bytes apart) reads a 32-byte run a pixel and plane, a burst each; the dense map's pixels are
  // one run a slab, a burst per 512 bytes. Where each burst costs 1000 cycles the planner takes the
  // dense map by its estimate; NPUSIM_FILTER_GRAD_FOLD_ESTIMATE=0 folds as before. Both give the
  // reference's dW.
  Simulator& sim = burst_sim();
  ConvCase cc = ConvCase{2, 21, 21, 3, 7, 7, 16}.window(2, 2, 1, 1, "VALID");
  HostTensor x = random_tensor(DataType::F16, {cc.n, cc.h, cc.w, cc.c}, -2, 2, 351);
  HostTensor dy = random_tensor(DataType::F16, y_shape(cc), -1, 1, 352);
  const Reference ref = filter_grad_reference(cc, x, dy);
  for (const char* mode : {"", "0"}) {
    INFO("NPUSIM_FILTER_GRAD_FOLD_ESTIMATE='" << mode << "'");
    setenv("NPUSIM_FILTER_GRAD_FOLD_ESTIMATE", mode, 1);
    OpDesc op = make_op("Conv2DBackpropFilter", {x.desc, dy.desc}, cc.attrs());
    op.attrs["filter_sizes"] = filter_shape(cc);
    const compiler::CompiledKernel k = compiler::compile(op, sim.config());
    unsetenv("NPUSIM_FILTER_GRAD_FOLD_ESTIMATE");
    summarize(k);
    bool folded = false;
    for (const compiler::Launch& l : k.launches)
      folded = folded || l.summary.find("x viewed with pixels") != std::string::npos;
    CHECK(folded == (std::string(mode) == "0"));
    RunResult r = run_compiled(sim, k, {x, dy});
    check_against(r.outputs[0].values, ref, DataType::F16, false, "dW");
  }
}

namespace {
// y = x * f in double for a Conv2D case cc (y_shape's elements).
Reference conv2d_reference(const ConvCase& cc, const HostTensor& x, const HostTensor& f) {
  int64_t elements = 1;
  for (int64_t d : y_shape(cc)) elements *= d;
  Reference ref = new_reference(static_cast<size_t>(elements));
  for_each_product(cc, [&](int64_t xi, int64_t fi, int64_t yi) {
    accumulate(ref, yi, x.values[static_cast<size_t>(xi)] * f.values[static_cast<size_t>(fi)]);
  });
  return ref;
}
}  // namespace

TEST_CASE("The convolution's strided 1x1 view per pixel: a run a copy, the same y") {
  // Conv2D of 2 images of 8 x 8 x 256 by a 1x1 window of stride 2 into 32 channels: x is read
  // as a strided view (every other row and pixel, the 2 images one tall map of 8 rows of 4
  // pixels). Per pixel a pixel's planes (its chunk's, 16 channels a plane) are one run of at
  // most 512 bytes: one or two bursts a copy, one copy a pixel of each slab. As before (per
  // plane and row, or per plane and column) each plane of a pixel is a 32-byte run of its
  // own, a burst each; the dense map reads 4 bytes a byte used. Where each burst costs 1000
  // cycles the planner takes per pixel (NPUSIM_CONV_STRIDED_PIXELS unset; "1": per pixel
  // always; "0": as before). Every way gives y = x * f over the strided pixels (the reference,
  // in double).
  Simulator& sim = burst_sim();
  ConvCase cc = ConvCase{2, 8, 8, 256, 1, 1, 32}.window(2, 2, 1, 1, "VALID");
  HostTensor x = random_tensor(DataType::F16, {cc.n, cc.h, cc.w, cc.c}, -2, 2, 361);
  HostTensor f = random_tensor(DataType::F16, filter_shape(cc), -1, 1, 362);
  const Reference ref = conv2d_reference(cc, x, f);
  const int64_t pixels = cc.n * 4 * 4;  // the view's pixels, each loaded at least once
  for (const char* mode : {"", "1", "0"}) {
    INFO("NPUSIM_CONV_STRIDED_PIXELS='" << mode << "'");
    setenv("NPUSIM_CONV_STRIDED_PIXELS", mode, 1);
    const compiler::CompiledKernel k =
        compiler::compile(make_op("Conv2D", {x.desc, f.desc}, cc.attrs()), sim.config());
    unsetenv("NPUSIM_CONV_STRIDED_PIXELS");
    summarize(k);
    bool per_pixel = false;
    for (const compiler::Launch& l : k.launches)
      per_pixel = per_pixel || l.summary.find(", per pixel") != std::string::npos;
    CHECK(per_pixel == (std::string(mode) != "0"));
    CopyTimes times;
    sim.add_observer(&times);
    RunResult r = run_compiled(sim, k, {x, f});
    sim.remove_observer(&times);
    check_against(r.outputs[0].values, ref, DataType::F16, false, "y");
    if (!per_pixel) continue;
    // One copy a pixel of a slab, one or two bursts each (a run of at most 512 bytes; two
    // where x's start is not 512-byte aligned) + its data's few cycles; as before 16 a pixel.
    CHECK(times.copies >= pixels);
    CHECK(times.bursts >= static_cast<double>(times.copies) - 0.5);
    CHECK(times.bursts < static_cast<double>(times.copies) * 2.5);
  }
}

TEST_CASE("The convolution's row view, forced: one nd2nz a slab, the same y") {
  // Conv2D of 2 images of 8 x 8 x 256 by a 1x1 window of stride 2 into 32 channels with
  // NPUSIM_CONV_ROW_VIEW=1: x read as the dense map [2, 8, 4, 512] (a pixel: two of x's, the
  // window's its first 256 channels) under a window of strides (2, 1), each slab one nd2nz of
  // pixels 512 elements apart and no copy_gm2l1; y = x * f over the strided pixels (the
  // reference, in double). Unset, the planner does not plan the view (y's strided view per
  // pixel, the case above).
  Simulator& sim = burst_sim();
  ConvCase cc = ConvCase{2, 8, 8, 256, 1, 1, 32}.window(2, 2, 1, 1, "VALID");
  HostTensor x = random_tensor(DataType::F16, {cc.n, cc.h, cc.w, cc.c}, -2, 2, 371);
  HostTensor f = random_tensor(DataType::F16, filter_shape(cc), -1, 1, 372);
  const Reference ref = conv2d_reference(cc, x, f);
  for (const char* mode : {"1", ""}) {
    INFO("NPUSIM_CONV_ROW_VIEW='" << mode << "'");
    const compiler::CompiledKernel k = compile_with(
        "NPUSIM_CONV_ROW_VIEW", mode, make_op("Conv2D", {x.desc, f.desc}, cc.attrs()), sim);
    bool rows = false;
    for (const compiler::Launch& l : k.launches)
      rows = rows || l.summary.find("2x8x4x512 f16 (1x1 window, stride 2x1") != std::string::npos;
    CHECK(rows == (std::string(mode) == "1"));
    const SlabRun run = run_counting(sim, k, {x, f}, 2 * cc.c);
    check_against(run.r.outputs[0].values, ref, DataType::F16, false, "y");
    if (!rows) continue;
    CHECK(run.copies == 0);
    CHECK(run.slab_loads > 0);
  }
}
