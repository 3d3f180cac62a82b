// Every op of the op table that takes bf16, compiled for bf16 on the 910b preset, whose vector
// unit has no bf16 arithmetic (vector.bf16_arithmetic: false, docs/validation.md "bf16 on the
// vector unit: what silicon has"): compile() verifies each kernel, and the verifier refuses bf16
// in every vector instruction that computes (sim/exec/vector_insn.h), so each op here must widen
// its bf16 to f32. An op of the table that takes bf16 and has no case here fails the test: a new
// op is covered as it is added.
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/registry.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

namespace npusim {
namespace {

using compiler::AttrValue;
using compiler::DataType;
using compiler::OpDesc;
using compiler::TensorDesc;
using test::make_op;

using Attrs = std::map<std::string, AttrValue>;
using I = std::vector<int64_t>;

const DataType bf = DataType::BF16, f32 = DataType::F32, s32 = DataType::S32;

TensorDesc t(DataType d, I shape) { return TensorDesc{d, std::move(shape)}; }
TensorDesc b(I shape) { return t(bf, std::move(shape)); }
const TensorDesc kMat = b({4, 200});  // rows of 200: a partial 32-byte block per row
const TensorDesc kRows16 = b({4, 208});  // the norms: rows of a multiple of 16
const TensorDesc kImg = b({2, 8, 8, 16});  // NHWC
const Attrs kConv = {{"strides", I{1, 1, 1, 1}}, {"padding", std::string("SAME")}};
const Attrs kPool = {{"ksize", I{1, 2, 2, 1}},
                     {"strides", I{1, 2, 2, 1}},
                     {"padding", std::string("VALID")}};
Attrs with(Attrs a, const std::string& k, AttrValue v) {
  a[k] = std::move(v);
  return a;
}

// The bf16 case of each op taking bf16 that is not element-wise over inputs of one shape.
std::map<std::string, OpDesc> special_cases() {
  std::map<std::string, OpDesc> m;
  auto add = [&](const std::string& op, std::vector<TensorDesc> in, Attrs a = {}) {
    m.emplace(op, make_op(op, std::move(in), std::move(a)));
  };
  add("Cast", {kMat}, {{"DstT", std::string("f32")}});
  add("MultiTensorCast", {kMat, b({3, 70})},
      {{"SrcT", std::string("bf16")}, {"DstT", std::string("f32")}, {"N", int64_t{2}}});
  add("MatMul", {b({64, 96}), b({96, 48})});
  add("BatchMatMulV2", {b({2, 64, 96}), b({2, 96, 48})});
  add("BatchMatMul", {b({2, 64, 96}), b({2, 96, 48})});
  add("Einsum", {b({2, 64, 96}), b({2, 96, 48})}, {{"equation", std::string("bij,bjk->bik")}});
  add("Transpose", {kMat}, {{"perm", I{1, 0}}});
  add("ConcatV2", {kMat, kMat}, {{"axis", int64_t{1}}});
  add("Split", {kMat}, {{"split_dim", int64_t{1}}, {"num_split", int64_t{2}}});
  add("SplitV", {kMat}, {{"split_dim", int64_t{1}}, {"size_splits", I{50, 150}}});
  add("Slice", {kMat}, {{"begin", I{1, 3}}, {"size", I{2, 100}}});
  add("StridedSlice", {kMat}, {{"begin", I{0, 1}}, {"end", I{4, 199}}, {"strides", I{1, 2}}});
  add("StridedSliceGrad", {b({4, 99})},
      {{"shape", I{4, 200}}, {"begin", I{0, 1}}, {"end", I{4, 199}}, {"strides", I{1, 2}}});
  add("Pad", {kMat}, {{"paddings", I{1, 1, 2, 3}}});
  add("PadV2", {kMat, b({})}, {{"paddings", I{1, 1, 2, 3}}});
  add("MirrorPad", {kMat}, {{"paddings", I{1, 1, 2, 3}}, {"mode", std::string("REFLECT")}});
  add("Tile", {kMat}, {{"multiples", I{2, 1}}});
  add("BroadcastTo", {b({200})}, {{"shape", I{4, 200}}});
  add("ReverseV2", {kMat}, {{"axis", I{1}}});
  add("XlaDynamicUpdateSlice", {kMat, b({2, 100})}, {{"indices", I{1, 50}}});
  add("GatherV2", {kMat, t(s32, {3})}, {{"axis", int64_t{0}}});
  add("UnsortedSegmentSum", {kMat, t(s32, {4})}, {{"num_segments", int64_t{3}}});
  add("OneHot", {t(s32, {4}), b({}), b({})}, {{"depth", int64_t{200}}});
  add("Fill", {b({})}, {{"dims", I{4, 200}}});
  add("Select", {t(DataType::BOOL, {4, 200}), kMat, kMat});
  add("SelectV2", {t(DataType::BOOL, {4, 200}), kMat, kMat});
  add("ClipByValue", {kMat, b({}), b({})});
  add("StatelessRandomUniformV2",
      {t(s32, {2}), t(DataType::S64, {1}), t(DataType::S64, {2}), t(s32, {})},
      {{"shape", I{4, 200}}, {"alg", int64_t{1}}, {"dtype", std::string("bf16")}});
  add("Cumsum", {kMat}, {{"axis", int64_t{1}}});
  for (const char* r : {"Sum", "Mean", "Max", "Min", "Prod"}) add(r, {kMat}, {{"axes", I{1}}});
  add("SquareSumV1", {kMat}, {{"axis", I{1}}});
  add("ArgMax", {kMat}, {{"axis", int64_t{1}}});
  add("ArgMin", {kMat}, {{"axis", int64_t{1}}});
  add("SparseSoftmaxCrossEntropyWithLogits", {kMat, t(s32, {4})});
  add("BiasAdd", {kMat, b({200})});
  add("AddRelu", {kMat, b({200})});
  add("Conv2D", {kImg, b({3, 3, 16, 32})}, kConv);
  add("Conv2DBackpropInput", {b({3, 3, 16, 32}), b({2, 8, 8, 32})},
      with(kConv, "input_sizes", I{2, 8, 8, 16}));
  add("Conv2DBackpropFilter", {kImg, b({2, 8, 8, 32})},
      with(kConv, "filter_sizes", I{3, 3, 16, 32}));
  add("DepthwiseConv2dNative", {kImg, b({3, 3, 16, 1})}, kConv);
  add("DepthwiseConv2dNativeBackpropInput", {b({3, 3, 16, 1}), kImg},
      with(kConv, "input_sizes", I{2, 8, 8, 16}));
  add("DepthwiseConv2dNativeBackpropFilter", {kImg, kImg},
      with(kConv, "filter_sizes", I{3, 3, 16, 1}));
  add("MaxPool", {kImg}, kPool);
  add("AvgPool", {kImg}, kPool);
  add("MaxPoolGrad", {kImg, b({2, 4, 4, 16}), b({2, 4, 4, 16})}, kPool);
  add("AvgPoolGrad", {b({2, 4, 4, 16})}, with(kPool, "orig_input_shape", I{2, 8, 8, 16}));
  const TensorDesc ch = t(f32, {16});
  add("FusedBatchNormV3", {kImg, ch, ch, ch, ch}, {{"is_training", true}});
  add("FusedBatchNormGradV3", {kImg, kImg, ch, ch, ch, ch}, {{"is_training", true}});
  add("ResourceApplyGradientDescent", {kMat, b({}), kMat});
  add("ResourceApplyMomentum", {kMat, kMat, b({}), kMat, b({})});
  add("ResourceApplyAdam", {kMat, kMat, kMat, b({}), b({}), b({}), b({}), b({}), b({}), kMat});
  add("FusedElementwise", {kMat, kMat},
      {{"T", std::string("bf16")},
       {"steps", AttrValue(std::vector<std::string>{"Neg i0", "Mul s0 i1", "Exp s1"})}});
  add("FusedVariableUpdate", {kMat, kMat, b({})},
      {{"T", std::string("bf16")},
       {"M", int64_t{1}},
       {"steps", AttrValue(std::vector<std::string>{"Mul i1 i2", "Sub i0 s0"})},
       {"updates", I{1}}});
  const TensorDesc bsnd = b({1, 16, 2, 64});
  add("FlashAttentionScore", {bsnd, bsnd, bsnd}, {{"input_layout", std::string("BSND")}});
  add("PromptFlashAttention", {bsnd, bsnd, bsnd}, {{"input_layout", std::string("BSND")}});
  add("IncreFlashAttention", {b({1, 1, 2, 64}), bsnd, bsnd, t(DataType::S64, {1})},
      {{"input_layout", std::string("BSND")}, {"actual_seq_lengths", I{16}}});
  add("WeightQuantBatchMatmulV2", {b({4, 64}), t(DataType::S8, {64, 32}), b({32})});
  add("RmsNorm", {kRows16, b({208})});
  add("LayerNorm", {kRows16, b({208}), b({208})});
  add("LayerNormV3", {kRows16, b({208}), b({208})});
  add("LayerNormXBackpropV2", {kRows16, kRows16, t(f32, {4, 1}), t(f32, {4, 1}), b({208})});
  add("LayerNormBetaGammaBackpropV2", {kRows16, t(f32, {4, 208})}, {{"shape_gamma", I{208}}});
  add("RotaryPositionEmbedding", {bsnd, b({1, 16, 1, 64}), b({1, 16, 1, 64})});
  return m;
}

// An element-wise op over `n` inputs of one shape (1 to 3), the first count that the op takes.
bool compile_elementwise(const std::string& op, const ChipConfig& cfg, std::string& why) {
  for (size_t n = 1; n <= 3; ++n) {
    try {
      compiler::compile(make_op(op, std::vector<TensorDesc>(n, kMat), {}), cfg);
      return true;
    } catch (const compiler::CompileError& e) {
      why = e.what();
      if (why.find("fails the verifier") != std::string::npos) return false;
    }
  }
  return false;
}

bool takes_bf16(const compiler::ops::OpEntry& e) {
  for (const auto& list : e.tf.types)
    for (const auto& c : list)
      for (DataType d : c.types)
        if (d == bf) return true;
  return false;
}

TEST_CASE("Cast from and to bf16 compiles for the 910b for every other type it takes") {
  // The op table's case above casts bf16 to f32 only; to bool the kernel compares with zero.
  const ChipConfig cfg = load_chip_config("910b");
  for (const char* other : {"f32", "f16", "s32", "s8", "u8", "bool"}) {
    for (bool from_bf16 : {true, false}) {
      INFO((from_bf16 ? "bf16 -> " : "-> bf16 from ") << other);
      const DataType o = *compiler::data_type_from_name(other);
      const OpDesc op = make_op("Cast", {from_bf16 ? kMat : t(o, {4, 200})},
                                {{"DstT", std::string(from_bf16 ? other : "bf16")}});
      try {
        compiler::compile(op, cfg);
      } catch (const compiler::CompileError& e) {
        // Casts the compiler refuses for their own reason are fine; a kernel failing the
        // verifier is not.
        CHECK(std::string(e.what()).find("fails the verifier") == std::string::npos);
      }
    }
  }
}

TEST_CASE("every op taking bf16 compiles for the 910b, whose vector unit has no bf16 arithmetic") {
  const ChipConfig cfg = load_chip_config("910b");
  REQUIRE_FALSE(cfg.vector_bf16_arithmetic);
  const std::map<std::string, OpDesc> cases = special_cases();
  std::set<std::string> seen;
  for (const compiler::ops::OpEntry& e : compiler::ops::op_table()) {
    if (!takes_bf16(e)) continue;
    seen.insert(e.tf_op);
    INFO(e.tf_op);
    auto it = cases.find(e.tf_op);
    if (it == cases.end()) {
      std::string why;
      const bool compiled = compile_elementwise(e.tf_op, cfg, why);
      INFO("no special case here, and as an element-wise op: " << why);
      CHECK(compiled);
      continue;
    }
    try {
      compiler::compile(it->second, cfg);
    } catch (const compiler::CompileError& ex) {
      FAIL_CHECK(ex.what());
    }
  }
  for (const auto& [op, desc] : cases) {
    INFO(op << ": a special case for an op that takes no bf16 (or no such op)");
    CHECK(seen.count(op));
  }
}

// The 910 and 310P have no bf16 on the vector unit at all, not even Cast (vector.bf16_conversion
// false): every op with a bf16 input, output type or expected output is refused, naming the op,
// the chip and the key; f16 is untouched.
TEST_CASE("no bf16 at all on the 910 and 310P: a clear CompileError") {
  for (const char* chip : {"910", "310p"}) {
    const ChipConfig cfg = load_chip_config(chip);
    REQUIRE_FALSE(cfg.vector_bf16_conversion);
    INFO(chip);
    const std::string why = std::string("dtype bf16 is not supported on chip ") + chip +
                            ": its vector unit has no bf16, not even conversions "
                            "(vector.bf16_conversion is false in ";
    CHECK_THROWS_WITH(compiler::compile(make_op("AddV2", {kMat, kMat}), cfg),
                      Catch::StartsWith("AddV2(bf16[4,200], bf16[4,200]): " + why));
    CHECK_THROWS_WITH(
        compiler::compile(make_op("Cast", {t(f32, {4, 200})}, {{"DstT", std::string("bf16")}}),
                          cfg),
        Catch::Contains(why));
    CHECK_THROWS_WITH(compiler::compile(make_op("Transpose", {kMat}, {{"perm", I{1, 0}}}), cfg),
                      Catch::Contains(why));
    CHECK_NOTHROW(compiler::compile(
        make_op("AddV2", {t(DataType::F16, {4, 200}), t(DataType::F16, {4, 200})}), cfg));
  }
}

}  // namespace
}  // namespace npusim
