// Forward convolution filters in blocks of 16 output channels (ops/conv.h kFilterLayoutN16,
// [Cout/16][KH][KW][Cin][16]): MultiTensorCast's members named by filter_n16 are written in
// that layout (checked element by element against the cast of each HWIO element, placed by the
// layout's formula written out here), and Conv2D / Conv2DBiasAdd read such a filter given
// filter_layout: the same output bits as the HWIO filter's convolution (the kernel's L1 image of
// B is the same), and within the tolerance of the double reference (conv_reference.h); so does
// Conv2DBackpropInput, whose B's k-blocks (16 output channels, one tap) are then one run each.
// Grouped filters: groups of whole 16-channel blocks read it in place, others through an HWIO
// copy (both with the narrow groups' packing on and off); a filter of Cout % 16 != 0 is HWIO in
// that layout (the cast writes it so, the convolutions read it so).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/cast.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/elementwise.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"
#include "tests/compiler/conv_reference.h"

using namespace npusim;
using namespace npusim::test;
using namespace npusim::test::conv;
using compiler::DataType;
using compiler::TensorDesc;

TEST_CASE("MultiTensorCast writes its filter_n16 members in blocks of 16 output channels") {
  const ChipConfig& cfg = test_sim().config();
  using V = std::vector<int64_t>;
  // A 3x3 filter of several column blocks, a 7x7 one of 3 input channels, a plain member and
  // the first filter again written plain (as rewrite 19b keeps one for the input gradient).
  const std::vector<V> shapes = {V{3, 3, 32, 48}, V{7, 7, 3, 64}, V{5, 33}, V{3, 3, 32, 48}};
  std::vector<HostTensor> xs;
  std::vector<TensorDesc> descs;
  uint32_t seed = 140;
  for (const V& s : shapes) {
    xs.push_back(random_tensor(DataType::F32, s, -3, 3, seed++));
    descs.push_back(xs.back().desc);
  }
  xs[3] = HostTensor{xs[0].desc, xs[0].values};
  for (DataType dst : {DataType::F16, DataType::BF16}) {
    if (dst == DataType::BF16 && !cfg.vector_bf16_conversion) continue;  // (the cast refuses it)
    INFO(compiler::data_type_name(dst));
    const std::map<std::string, compiler::AttrValue> attrs = {
        {"SrcT", std::string("f32")},
        {"DstT", std::string(compiler::data_type_name(dst))},
        {"N", int64_t{4}},
        {"filter_n16", std::vector<int64_t>{0, 1}}};
    CompiledKernel k = compiler::compile(make_op("MultiTensorCast", descs, attrs), cfg);
    for (const compiler::Launch& l : k.launches) UNSCOPED_INFO(l.summary);
    const RunResult r = run_compiled(test_sim(), k, xs);
    for (size_t m = 0; m < shapes.size(); ++m) {
      INFO("member " << m);
      REQUIRE(r.outputs[m].desc == (TensorDesc{dst, shapes[m]}));
      std::vector<double> want(xs[m].values.size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = round_to(dst, xs[m].values[i]);
      if (m < 2) want = to_blocked(HostTensor{TensorDesc{dst, shapes[m]}, want}).values;
      CHECK(r.outputs[m].values == want);
    }
  }
}

TEST_CASE(
    "MultiTensorCast stores blocked rows from its tiles; a row wider than a tile is "
    "transposed") {
  const ChipConfig& cfg = test_sim().config();
  using V = std::vector<int64_t>;
  // The widest row a tile of the cast holds (the kernel's UB fit): a filter of a wider Cout is
  // cast as HWIO and transposed by a launch of its own.
  const int64_t tile = compiler::ops::stream_tile_capacity(
      compiler::ops::cast_spec(DataType::F32, DataType::F16, false, V{1, 1, 1, 16}), cfg);
  REQUIRE(tile >= 128);
  const int64_t wide = (tile / 16 + 1) * 16;
  // Members above 1,024 elements per vector core each (multi_tensor_launches' large kind):
  // alone, one stream of whole rows (Cout 96: rows of 6 column blocks); two together, one
  // multi-tensor launch whose blocks split each member's rows; with a row wider than a tile.
  const std::vector<std::vector<V>> sets = {
      {V{3, 3, 64, 96}}, {V{3, 3, 64, 96}, V{3, 3, 64, 112}}, {V{3, 3, 64, 112}, V{1, 1, 2, wide}}};
  uint32_t seed = 170;
  for (const std::vector<V>& shapes : sets) {
    std::vector<HostTensor> xs;
    std::vector<TensorDesc> descs;
    std::vector<int64_t> members;
    for (const V& s : shapes) {
      xs.push_back(random_tensor(DataType::F32, s, -3, 3, seed++));
      descs.push_back(xs.back().desc);
      members.push_back(static_cast<int64_t>(members.size()));
    }
    const CompiledKernel k = compiler::compile(make_op("MultiTensorCast", descs,
                                                       {{"SrcT", std::string("f32")},
                                                        {"DstT", std::string("f16")},
                                                        {"N", static_cast<int64_t>(shapes.size())},
                                                        {"filter_n16", members}}),
                                               cfg);
    int transposes = 0;
    for (const compiler::Launch& l : k.launches) {
      UNSCOPED_INFO(l.summary);
      transposes += l.summary.find("Transpose") != std::string::npos;
    }
    int want_transposes = 0;
    for (const V& s : shapes) want_transposes += s[3] > tile;
    CHECK(transposes == want_transposes);
    const RunResult r = run_compiled(test_sim(), k, xs);
    for (size_t m = 0; m < shapes.size(); ++m) {
      INFO("member " << m << " Cout " << shapes[m][3]);
      std::vector<double> want(xs[m].values.size());
      for (size_t i = 0; i < want.size(); ++i) want[i] = round_to(DataType::F16, xs[m].values[i]);
      CHECK(r.outputs[m].values ==
            to_blocked(HostTensor{TensorDesc{DataType::F16, shapes[m]}, want}).values);
    }
  }
}

TEST_CASE("MultiTensorCast: a filter_n16 member of Cout % 16 != 0 is HWIO, a non-filter refused") {
  // 24 output channels: no partial block fits the same bytes, so the layout is HWIO (conv.h).
  const HostTensor x = random_tensor(DataType::F32, {3, 3, 16, 24}, -3, 3, 145);
  const CompiledKernel k = compiler::compile(make_op("MultiTensorCast", {x.desc},
                                                     {{"SrcT", std::string("f32")},
                                                      {"DstT", std::string("f16")},
                                                      {"N", int64_t{1}},
                                                      {"filter_n16", std::vector<int64_t>{0}}}),
                                             test_sim().config());
  std::vector<double> want(x.values.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = round_to(DataType::F16, x.values[i]);
  CHECK(run_compiled(test_sim(), k, {x}).outputs[0].values == want);
  const TensorDesc rank2{DataType::F32, {5, 32}};
  CHECK_THROWS_WITH(compiler::compile(make_op("MultiTensorCast", {rank2},
                                              {{"SrcT", std::string("f32")},
                                               {"DstT", std::string("f16")},
                                               {"N", int64_t{1}},
                                               {"filter_n16", std::vector<int64_t>{0}}}),
                                      test_sim().config()),
                    Catch::Contains("rank-4 HWIO filter"));
}

TEST_CASE("Conv2D reads a filter in blocks of 16 output channels: the HWIO filter's bits") {
  // Several n tiles over a 3x3 window; a 1x1; a 7x7 stride-2 window over 3 channels (the
  // width fold, a partial channel block); a strided 3x3 of 256 channels (several k chunks).
  const std::vector<ConvCase> cases = {
      ConvCase{2, 9, 9, 32, 3, 3, 48},
      ConvCase{1, 6, 6, 64, 1, 1, 32},
      ConvCase{1, 20, 20, 3, 7, 7, 64}.window(2, 2, 1, 1, "SAME"),
      ConvCase{2, 8, 8, 256, 3, 3, 64}.window(2, 2, 1, 1, "SAME"),
  };
  uint32_t seed = 150;
  for (const ConvCase& c : cases) {
    INFO("x [" << c.n << "," << c.h << "," << c.w << "," << c.c << "] filter " << c.kh << "x"
               << c.kw << " -> " << c.cout << " stride " << c.sh);
    const HostTensor x = random_tensor(DataType::F16, {c.n, c.h, c.w, c.c}, -2, 2, seed++);
    const HostTensor f = random_tensor(DataType::F16, filter_shape(c), -1, 1, seed++);
    const CompiledKernel plain =
        compiler::compile(make_op("Conv2D", {x.desc, f.desc}, c.attrs()), test_sim().config());
    const CompiledKernel blocked = compiler::compile(
        make_op("Conv2D", {x.desc, f.desc}, with_layout(c.attrs())), test_sim().config());
    summarize(blocked);
    const RunResult want = run_compiled(test_sim(), plain, {x, f});
    const RunResult got = run_compiled(test_sim(), blocked, {x, to_blocked(f)});
    CHECK(got.outputs[0].values == want.outputs[0].values);
    Reference ref = new_reference(want.outputs[0].values.size());
    for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
      accumulate(ref, yi, x.values[static_cast<size_t>(xi)] * f.values[static_cast<size_t>(fi)]);
    });
    check_against(got.outputs[0].values, ref, DataType::F16, false, "y");
  }
}

TEST_CASE("Conv2D's stride-packed view reads a filter in blocks of 16 output channels") {
  // NPUSIM_CONV_STRIDE_PACK=1 (the view wherever it applies): the stem's 7x7 stride-2 VALID
  // window over 3 and 4 channels, x's pixel pairs one pixel of 6 / 8 channels; the blocked
  // filter's taps per row and column of taps, the last column's one real pixel.
  setenv("NPUSIM_CONV_STRIDE_PACK", "1", 1);
  const std::vector<ConvCase> cases = {
      ConvCase{2, 13, 16, 3, 7, 7, 32}.window(2, 2, 1, 1, "VALID"),
      ConvCase{1, 12, 22, 4, 7, 7, 48}.window(2, 2, 1, 1, "VALID"),
  };
  const std::vector<std::string> views = {"2x13x8x6 f16 (7x4 window", "1x12x11x8 f16 (7x4 window"};
  uint32_t seed = 170;
  for (size_t i = 0; i < cases.size(); ++i) {
    const ConvCase& c = cases[i];
    INFO("x [" << c.n << "," << c.h << "," << c.w << "," << c.c << "] filter " << c.kh << "x"
               << c.kw << " -> " << c.cout);
    const HostTensor x = random_tensor(DataType::F16, {c.n, c.h, c.w, c.c}, -2, 2, seed++);
    const HostTensor f = random_tensor(DataType::F16, filter_shape(c), -1, 1, seed++);
    const CompiledKernel plain =
        compiler::compile(make_op("Conv2D", {x.desc, f.desc}, c.attrs()), test_sim().config());
    const CompiledKernel blocked = compiler::compile(
        make_op("Conv2D", {x.desc, f.desc}, with_layout(c.attrs())), test_sim().config());
    summarize(blocked);
    CHECK_THAT(blocked.launches.back().summary, Catch::Contains(views[i]));
    const RunResult want = run_compiled(test_sim(), plain, {x, f});
    const RunResult got = run_compiled(test_sim(), blocked, {x, to_blocked(f)});
    CHECK(got.outputs[0].values == want.outputs[0].values);
    Reference ref = new_reference(want.outputs[0].values.size());
    for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
      accumulate(ref, yi, x.values[static_cast<size_t>(xi)] * f.values[static_cast<size_t>(fi)]);
    });
    check_against(got.outputs[0].values, ref, DataType::F16, false, "y");
  }
  unsetenv("NPUSIM_CONV_STRIDE_PACK");
}

TEST_CASE("Conv2DBiasAdd reads a filter in blocks of 16 output channels") {
  const ConvCase c{2, 7, 7, 64, 3, 3, 96};
  const HostTensor x = random_tensor(DataType::F16, {c.n, c.h, c.w, c.c}, -2, 2, 160);
  const HostTensor f = random_tensor(DataType::F16, filter_shape(c), -1, 1, 161);
  const HostTensor bias = random_tensor(DataType::F32, {c.cout}, -1, 1, 162);
  const auto run = [&](bool n16) {
    auto a = c.attrs();
    if (n16) a = with_layout(a);
    const CompiledKernel k = compiler::compile(
        make_op("Conv2DBiasAdd", {x.desc, f.desc, bias.desc}, a), test_sim().config());
    summarize(k);
    return run_compiled(test_sim(), k, {x, n16 ? to_blocked(f) : f, bias}).outputs[0].values;
  };
  CHECK(run(true) == run(false));
}

// The forward convolution of case c in f16 on filter f (HWIO) and on f blocked: the same bits,
// and within the double reference's tolerance. Returns the blocked kernel's launch summaries.
std::string check_forward_blocked(const ConvCase& c, uint32_t seed) {
  INFO("x [" << c.n << "," << c.h << "," << c.w << "," << c.c << "] filter " << c.kh << "x" << c.kw
             << " -> " << c.cout << " groups " << c.groups);
  const HostTensor x = random_tensor(DataType::F16, {c.n, c.h, c.w, c.c}, -2, 2, seed);
  const HostTensor f = random_tensor(DataType::F16, filter_shape(c), -1, 1, seed + 1);
  const CompiledKernel plain =
      compiler::compile(make_op("Conv2D", {x.desc, f.desc}, c.attrs()), test_sim().config());
  const CompiledKernel blocked = compiler::compile(
      make_op("Conv2D", {x.desc, f.desc}, with_layout(c.attrs())), test_sim().config());
  summarize(blocked);
  const RunResult want = run_compiled(test_sim(), plain, {x, f});
  const bool whole_blocks = c.cout % 16 == 0;  // else the layout is HWIO (conv.h)
  const RunResult got = run_compiled(test_sim(), blocked, {x, whole_blocks ? to_blocked(f) : f});
  CHECK(got.outputs[0].values == want.outputs[0].values);
  Reference ref = new_reference(want.outputs[0].values.size());
  for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
    accumulate(ref, yi, x.values[static_cast<size_t>(xi)] * f.values[static_cast<size_t>(fi)]);
  });
  check_against(got.outputs[0].values, ref, DataType::F16, false, "y");
  std::string summaries;
  for (const compiler::Launch& l : blocked.launches) summaries += l.summary + "\n";
  return summaries;
}

ConvCase grouped(ConvCase c, int64_t groups) {
  c.groups = groups;
  return c;
}

TEST_CASE("Grouped Conv2D reads a filter in blocks of 16 output channels") {
  // Groups of whole blocks (32 and 16 output channels a group) read it in place; groups that
  // split a block (8 and 24 a group; 4 input channels a group: the narrow groups' packing,
  // forced on and off) through an HWIO copy of it, one launch more.
  struct Case {
    ConvCase c;
    bool copied;
  };
  const std::vector<Case> cases = {
      {grouped(ConvCase{2, 7, 7, 64, 3, 3, 64}, 2), false},
      {grouped(ConvCase{1, 6, 6, 32, 1, 1, 64}, 4), false},
      {grouped(ConvCase{2, 7, 7, 32, 3, 3, 16}, 2), true},
      {grouped(ConvCase{1, 6, 6, 48, 3, 3, 48}, 2), true},
      {grouped(ConvCase{1, 8, 8, 16, 3, 3, 32}, 4), true},
  };
  uint32_t seed = 200;
  for (const char* pack : {"0", "1"}) {
    setenv("NPUSIM_FUSION_GROUPED_CONV_PACK", pack, 1);
    for (const Case& k : cases) {
      INFO("NPUSIM_FUSION_GROUPED_CONV_PACK=" << pack);
      const std::string summaries = check_forward_blocked(k.c, seed);
      seed += 2;
      CHECK((summaries.find("-> HWIO derived") != std::string::npos) == k.copied);
    }
  }
  unsetenv("NPUSIM_FUSION_GROUPED_CONV_PACK");
}

TEST_CASE("Conv2D on a blocked filter of Cout % 16 != 0 reads HWIO bytes") {
  check_forward_blocked(ConvCase{1, 6, 6, 32, 3, 3, 40}, 220);
  check_forward_blocked(grouped(ConvCase{1, 6, 6, 32, 3, 3, 24}, 2), 222);
}

TEST_CASE("A filter in blocks of 16: what cannot read it says so") {
  const ConvCase c{1, 6, 6, 32, 3, 3, 48};
  const TensorDesc x{DataType::F16, {1, 6, 6, 32}}, f{DataType::F16, filter_shape(c)};
  const TensorDesc f32{DataType::F32, filter_shape(c)}, x32{DataType::F32, {1, 6, 6, 32}};
  CHECK_THROWS_WITH(
      compiler::compile(make_op("Conv2D", {x32, f32}, with_layout(c.attrs())), test_sim().config()),
      Catch::Contains("16-bit"));
  auto odd = c.attrs();
  odd["filter_layout"] = std::string("OIHW");
  CHECK_THROWS_WITH(compiler::compile(make_op("Conv2D", {x, f}, odd), test_sim().config()),
                    Catch::Contains("filter_layout = 'OIHW'"));
}

TEST_CASE("Conv2DBackpropInput reads a filter in blocks of 16 output channels") {
  // B's k rows are the filter's output channels: several k-blocks (48, 256: several k chunks),
  // several n tiles (dx's 96 channels), dx's channels not whole blocks (24: the k-block's rows
  // zero-padded), the zero-inserted stride-2 3x3 and the strided 1x1 (its convolution kernel;
  // its MatMul reads HWIO only).
  const std::vector<ConvCase> cases = {
      ConvCase{2, 9, 9, 32, 3, 3, 48},
      ConvCase{1, 7, 7, 96, 3, 3, 256},
      ConvCase{1, 6, 6, 24, 3, 3, 32},
      ConvCase{2, 8, 8, 32, 3, 3, 64}.window(2, 2, 1, 1, "SAME"),
      ConvCase{2, 8, 8, 64, 1, 1, 128}.window(2, 2, 1, 1, "VALID"),
  };
  uint32_t seed = 190;
  for (const ConvCase& c : cases) {
    INFO("dx [" << c.n << "," << c.h << "," << c.w << "," << c.c << "] filter " << c.kh << "x"
                << c.kw << " -> " << c.cout << " stride " << c.sh);
    const HostTensor f = random_tensor(DataType::F16, filter_shape(c), -1, 1, seed++);
    const HostTensor dy = random_tensor(DataType::F16, y_shape(c), -2, 2, seed++);
    const auto run = [&](bool n16) {
      auto a = n16 ? with_layout(c.attrs()) : c.attrs();
      a["input_sizes"] = std::vector<int64_t>{c.n, c.h, c.w, c.c};
      const CompiledKernel k = compiler::compile(
          make_op("Conv2DBackpropInput", {f.desc, dy.desc}, a), test_sim().config());
      summarize(k);
      return run_compiled(test_sim(), k, {n16 ? to_blocked(f) : f, dy}).outputs[0].values;
    };
    const std::vector<double> got = run(true);
    CHECK(got == run(false));
    Reference ref = new_reference(got.size());
    for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
      accumulate(ref, xi, dy.values[static_cast<size_t>(yi)] * f.values[static_cast<size_t>(fi)]);
    });
    check_against(got, ref, DataType::F16, false, "dx");
  }
}

TEST_CASE("Grouped Conv2DBackpropInput and Cout % 16 != 0 read a blocked filter") {
  // Groups of whole blocks of dy's channels (in place), groups splitting a block (an HWIO
  // copy; 4 dx channels a group: the packing, forced on and off), 40 output channels (HWIO).
  const std::vector<ConvCase> cases = {
      grouped(ConvCase{2, 7, 7, 64, 3, 3, 64}, 2), grouped(ConvCase{1, 6, 6, 48, 3, 3, 48}, 2),
      grouped(ConvCase{1, 8, 8, 16, 3, 3, 32}, 4), ConvCase{1, 6, 6, 32, 3, 3, 40}};
  uint32_t seed = 230;
  for (const char* pack : {"0", "1"}) {
    setenv("NPUSIM_FUSION_GROUPED_CONV_PACK", pack, 1);
    for (const ConvCase& c : cases) {
      INFO("NPUSIM_FUSION_GROUPED_CONV_PACK=" << pack << " dx [" << c.n << "," << c.h << "," << c.w
                                              << "," << c.c << "] -> " << c.cout << " groups "
                                              << c.groups);
      const HostTensor f = random_tensor(DataType::F16, filter_shape(c), -1, 1, seed++);
      const HostTensor dy = random_tensor(DataType::F16, y_shape(c), -2, 2, seed++);
      const auto run = [&](bool n16) {
        auto a = n16 ? with_layout(c.attrs()) : c.attrs();
        a["input_sizes"] = std::vector<int64_t>{c.n, c.h, c.w, c.c};
        const CompiledKernel k = compiler::compile(
            make_op("Conv2DBackpropInput", {f.desc, dy.desc}, a), test_sim().config());
        summarize(k);
        const bool whole_blocks = c.cout % 16 == 0;
        return run_compiled(test_sim(), k, {n16 && whole_blocks ? to_blocked(f) : f, dy})
            .outputs[0]
            .values;
      };
      const std::vector<double> got = run(true);
      CHECK(got == run(false));
      Reference ref = new_reference(got.size());
      for_each_product(c, [&](int64_t xi, int64_t fi, int64_t yi) {
        accumulate(ref, xi, dy.values[static_cast<size_t>(yi)] * f.values[static_cast<size_t>(fi)]);
      });
      check_against(got, ref, DataType::F16, false, "dx");
    }
  }
  unsetenv("NPUSIM_FUSION_GROUPED_CONV_PACK");
}

TEST_CASE("Conv2DBackpropInput on a blocked filter: what cannot read it says so") {
  const ConvCase c{1, 6, 6, 32, 3, 3, 32};
  auto a = with_layout(c.attrs());
  a["input_sizes"] = std::vector<int64_t>{c.n, c.h, c.w, c.c};
  const TensorDesc f{DataType::F32, filter_shape(c)}, dy{DataType::F32, y_shape(c)};
  // An f32 filter (cast to f16 first).
  CHECK_THROWS_WITH(
      compiler::compile(make_op("Conv2DBackpropInput", {f, dy}, a), test_sim().config()),
      Catch::Contains("16-bit"));
}
