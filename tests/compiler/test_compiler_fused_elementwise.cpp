// FusedElementwise (adapter/compiler/ops/fused_elementwise.h): a chain of element-wise ops as
// one streaming kernel. The reference is the chain unfused: each step compiled as its own op,
// run on the chip model and its result fed to the next steps. The fused output must be
// bit-identical to it (same instructions and roundings per element), come from one launch and
// take fewer cycles than the unfused launches together. The f32 Adam-like chain is also checked
// against a double-precision evaluation of its formula.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/kernel_builder.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/fused_elementwise.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::AttrValue;

namespace {

using Steps = std::vector<std::string>;

OpDesc fused_op(const std::vector<HostTensor>& inputs, const Steps& steps) {
  std::vector<TensorDesc> descs;
  for (const HostTensor& t : inputs) descs.push_back(t.desc);
  return make_op(
      "FusedElementwise", descs,
      {{"T", std::string(compiler::data_type_name(descs[0].dtype))}, {"steps", AttrValue(steps)}});
}

struct ChainRun {
  HostTensor result;
  uint64_t cycles = 0;
  size_t launches = 0;
  std::vector<HostTensor> steps;  // every step's result, at its own shape
};

// The chain unfused: step k "<op> <a>[ <b>]" compiled as op(a, b) on the inputs (i<n>) and the
// earlier results (s<j>), at their own shapes ("Cast i<n>" as TF's Cast to `t`, the chain's T,
// by default input 0's type); the last result broadcast to out_shape.
ChainRun run_unfused(const std::vector<HostTensor>& inputs, const Steps& steps,
                     const std::vector<int64_t>& out_shape,
                     std::optional<DataType> t = std::nullopt) {
  ChainRun r;
  std::vector<HostTensor> results;
  for (const std::string& text : steps) {
    std::istringstream words(text);
    std::string name, operand;
    words >> name;
    std::vector<HostTensor> args;
    while (words >> operand) {
      const size_t i = std::stoul(operand.substr(1));
      args.push_back(operand[0] == 'i' ? inputs.at(i) : results.at(i));
    }
    std::vector<TensorDesc> descs;
    for (const HostTensor& t : args) descs.push_back(t.desc);
    std::map<std::string, AttrValue> attrs;
    if (name == compiler::ops::kCastStep)
      attrs["DstT"] = std::string(compiler::data_type_name(t ? *t : inputs.at(0).desc.dtype));
    const CompiledKernel k = compiler::compile(make_op(name, descs, attrs), test_sim().config());
    RunResult run = run_compiled(test_sim(), k, args);
    r.cycles += run.cycles;
    r.launches += k.launches.size();
    results.push_back(run.outputs.at(0));
  }
  r.steps = results;
  const HostTensor& last = results.back();
  r.result.desc = TensorDesc{last.desc.dtype, out_shape};
  for (size_t src : broadcast_index(last.desc.shape, out_shape))
    r.result.values.push_back(last.values[src]);
  return r;
}

// Equal bits: same value and sign, or both NaN.
void check_bit_identical(const HostTensor& got, const HostTensor& want) {
  REQUIRE(got.desc == want.desc);
  size_t bad = 0;
  for (size_t i = 0; i < got.values.size(); ++i) {
    const double g = got.values[i], w = want.values[i];
    const bool same =
        (std::isnan(g) && std::isnan(w)) || (g == w && std::signbit(g) == std::signbit(w));
    if (!same && bad++ < 5) UNSCOPED_INFO("element " << i << ": fused " << g << ", unfused " << w);
  }
  INFO(bad << " of " << got.values.size() << " elements differ");
  CHECK(bad == 0);
}

// Compiles and runs the fused chain and checks it against the unfused one; returns its output.
HostTensor check_chain(const std::vector<HostTensor>& inputs, const Steps& steps) {
  const OpDesc op = fused_op(inputs, steps);
  INFO(op.str());
  const CompiledKernel k = compiler::compile(op, test_sim().config());
  REQUIRE(k.outputs.size() == 1);
  REQUIRE(k.launches.size() == 1);
  INFO(k.launches[0].summary);
  const RunResult fused = run_compiled(test_sim(), k, inputs);
  const ChainRun unfused = run_unfused(inputs, steps, k.outputs[0].shape);
  check_bit_identical(fused.outputs[0], unfused.result);
  WARN(op.str() << ": fused 1 launch, " << fused.cycles << " cycles; unfused " << unfused.launches
                << " launches, " << unfused.cycles << " cycles");
  CHECK(unfused.launches == steps.size());
  CHECK(fused.cycles < unfused.cycles);
  return fused.outputs[0];
}

// An Adam-like update: lr * (m + (g - m) * b1) / (sqrt(v + g^2) + eps), with scalar b1, lr, eps.
const Steps kAdam = {"Sub i2 i0", "Mul s0 i3",   "AddV2 i0 s1",   "Square i2", "AddV2 i1 s3",
                     "Sqrt s4",   "AddV2 s5 i5", "RealDiv s2 s6", "Mul s7 i4"};

std::vector<HostTensor> adam_inputs(DataType t, const std::vector<int64_t>& shape, uint32_t seed) {
  return {random_tensor(t, shape, -1, 1, seed),          // m
          random_tensor(t, shape, 0, 2, seed + 1),       // v
          random_tensor(t, shape, -3, 3, seed + 2),      // g
          random_tensor(t, {}, 0.05, 0.2, seed + 3),     // b1
          random_tensor(t, {}, 1e-3, 1e-2, seed + 4),    // lr
          random_tensor(t, {1}, 1e-4, 1e-3, seed + 5)};  // eps
}

// `steps` with input n cast to T first: "Cast i<n>" becomes step 0, the steps' reads of i<n>
// read it (s0), every s<j> becomes s<j+1> (as the plugin's graph pass folds a Cast feeding a
// chain or an update).
Steps with_input_cast(const Steps& steps, size_t n) {
  Steps out = {std::string(compiler::ops::kCastStep) + " i" + std::to_string(n)};
  for (const std::string& text : steps) {
    std::istringstream words(text);
    std::string word, renamed;
    words >> renamed;
    while (words >> word) {
      const size_t x = std::stoul(word.substr(1));
      renamed += word[0] == 's' ? " s" + std::to_string(x + 1)
                 : x == n       ? std::string(" s0")
                                : " " + word;
    }
    out.push_back(renamed);
  }
  return out;
}

std::vector<int64_t> shifted(std::vector<int64_t> updates) {
  for (int64_t& u : updates) ++u;
  return updates;
}

}  // namespace

TEST_CASE("Cast steps: an input of another float type cast in the chain, bit-identical") {
  // (T, the cast input's type): float32 from float16 / bfloat16 (a gradient read by the f32
  // optimizer under mixed precision) and back (an f32 tensor read by an f16 chain).
  const std::vector<int64_t> shape =
      test_chip_is_tiny() ? std::vector<int64_t>{37, 129} : std::vector<int64_t>{3, 101, 517};
  const std::pair<DataType, DataType> pairs[] = {{DataType::F32, DataType::F16},
                                                 {DataType::F32, DataType::BF16},
                                                 {DataType::F16, DataType::F32},
                                                 {DataType::BF16, DataType::F32}};
  for (const auto& [t, src] : pairs) {
    INFO("T " << compiler::data_type_name(t) << ", input 0 " << compiler::data_type_name(src));
    // (Cast(x) * y + Cast(x)) * z, the cast's value read twice, z a broadcast scalar; x's
    // range beyond float16's precision so the rounding of the cast matters.
    const std::vector<HostTensor> in = {random_tensor(src, shape, -300, 300, 71),
                                        random_tensor(t, shape, -2, 2, 72),
                                        random_tensor(t, {}, 0.5, 1.5, 73)};
    const Steps steps = {"Cast i0", "Mul s0 i1", "AddV2 s1 s0", "Mul s2 i2"};
    std::vector<TensorDesc> descs;
    for (const HostTensor& h : in) descs.push_back(h.desc);
    const OpDesc op =
        make_op("FusedElementwise", descs,
                {{"T", std::string(compiler::data_type_name(t))}, {"steps", AttrValue(steps)}});
    INFO(op.str());
    const CompiledKernel k = compiler::compile(op, test_sim().config());
    REQUIRE(k.launches.size() == 1);
    REQUIRE(k.outputs.size() == 1);
    CHECK(k.outputs[0].dtype == t);
    const RunResult fused = run_compiled(test_sim(), k, in);
    const ChainRun unfused = run_unfused(in, steps, shape, t);
    check_bit_identical(fused.outputs[0], unfused.result);
    // The cast itself against the host's conversion: Cast(x) * 1 + Cast(x) is 2 Cast(x)
    // exactly, so with y = 1, z = 0.5 the output is Cast(x), each element x rounded to T.
    std::vector<HostTensor> ones = in;
    ones[1] = HostTensor{in[1].desc, std::vector<double>(in[1].values.size(), 1.0)};
    ones[2] = HostTensor{in[2].desc, {0.5}};
    const RunResult cast = run_compiled(test_sim(), k, ones);
    size_t bad = 0;
    for (size_t i = 0; i < in[0].values.size(); ++i) {
      const double want = round_to(t, in[0].values[i]);
      if (cast.outputs[0].values[i] != want && bad++ < 5)
        UNSCOPED_INFO("element " << i << ": " << in[0].values[i] << " cast to "
                                 << cast.outputs[0].values[i] << ", want " << want);
    }
    INFO(bad << " casts differ from the host's round to nearest even");
    CHECK(bad == 0);
    WARN(op.str() << ": fused 1 launch, " << fused.cycles << " cycles; unfused " << unfused.launches
                  << " launches, " << unfused.cycles << " cycles");
    CHECK(unfused.launches == steps.size());
    CHECK(fused.cycles < unfused.cycles);
  }
}

TEST_CASE("Cast steps that are refused: the pair, the operand, other readers of the input") {
  const TensorDesc f32{DataType::F32, {4, 8}}, f16{DataType::F16, {4, 8}},
      bf16{DataType::BF16, {4, 8}}, s32{DataType::S32, {4, 8}};
  auto refused = [](const std::vector<TensorDesc>& inputs, const std::string& t, const Steps& steps,
                    bool want_invalid, const std::vector<std::string>& words) {
    const OpDesc op = make_op("FusedElementwise", inputs, {{"T", t}, {"steps", AttrValue(steps)}});
    INFO(op.str());
    const CompileRefusal r = compile_refusal(op);
    INFO(r.message);
    CHECK(r.invalid == want_invalid);
    for (const std::string& w : words) CHECK(r.message.find(w) != std::string::npos);
  };
  // Pairs without one vconv (float16 <-> bfloat16), integers, the same type: not steps.
  refused({f16, bf16}, "bf16", {"Cast i0", "Mul s0 i1"}, false, {"step 0", "f16 -> bf16"});
  refused({s32, f32}, "f32", {"Cast i0", "Mul s0 i1"}, false, {"step 0", "s32 -> f32"});
  refused({f32, f32}, "f32", {"Cast i0", "Mul s0 i1"}, false, {"step 0", "f32 -> f32"});
  // A step's result is of type T already; Cast takes one operand.
  refused({f32, f32}, "f32", {"Mul i0 i1", "Cast s0"}, true, {"step 1", "reads an input"});
  refused({f16, f32}, "f32", {"Cast i0 i1"}, true, {"step 0", "Cast takes 1 operand"});
  // An input of another type read by a step other than a Cast.
  refused({f16, f32}, "f32", {"Cast i0", "Mul i0 i1"}, true,
          {"input 0", "f16", "step 1", "Cast steps only"});
  CHECK(compiler::ops::fusible_cast(DataType::F16, DataType::F32));
  CHECK(compiler::ops::fusible_cast(DataType::F32, DataType::BF16));
  CHECK_FALSE(compiler::ops::fusible_cast(DataType::F16, DataType::BF16));
  CHECK_FALSE(compiler::ops::fusible_cast(DataType::F32, DataType::F32));
  CHECK_FALSE(compiler::ops::fusible_cast(DataType::S32, DataType::F32));
}

// A bool mask of `shape`: element i true where a uniform draw is at least `rate` (dropout's).
HostTensor bool_mask(const std::vector<int64_t>& shape, double rate, uint64_t seed) {
  HostTensor m = random_tensor(DataType::F32, shape, 0, 1, seed);
  m.desc.dtype = DataType::BOOL;
  for (double& v : m.values) v = v >= rate ? 1.0 : 0.0;
  return m;
}

TEST_CASE("SelectV2 steps: dropout and its gradient, bit-identical to the unfused ops") {
  for (DataType t : {DataType::F32, DataType::F16, DataType::BF16}) {
    const std::vector<int64_t> shape = {37, 129};
    // where(mask, x * scale, 0) with a scalar zero; then the select first, scaled after.
    const std::vector<HostTensor> in = {
        random_tensor(t, shape, -4, 4, 81), bool_mask(shape, 0.25, 82),
        HostTensor{TensorDesc{t, {}}, {1.0 / 0.75}}, HostTensor{TensorDesc{t, {}}, {0.0}}};
    const HostTensor out = check_chain(in, {"Mul i0 i2", "SelectV2 i1 s0 i3"});
    check_chain(in, {"SelectV2 i1 i0 i3", "Mul s0 i2"});
    size_t kept = 0;
    for (size_t i = 0; i < out.values.size(); ++i) {
      if (in[1].values[i] == 0.0) CHECK(out.values[i] == 0.0);
      kept += in[1].values[i] != 0.0;
    }
    CHECK(kept > 0);
    CHECK(kept < out.values.size());
  }
}

TEST_CASE("a SelectV2 step's broadcast condition is expanded by a launch of its own first") {
  const std::vector<int64_t> shape = {16, 40};
  const std::vector<HostTensor> in = {random_tensor(DataType::F32, shape, -2, 2, 91),
                                      bool_mask({1, 40}, 0.5, 92),
                                      random_tensor(DataType::F32, {16, 1}, -2, 2, 93)};
  const Steps steps = {"Abs i0", "SelectV2 i1 s0 i2"};
  const OpDesc op = fused_op(in, steps);
  INFO(op.str());
  const CompiledKernel k = compiler::compile(op, test_sim().config());
  REQUIRE(k.outputs.size() == 1);
  CHECK(k.outputs[0].shape == shape);
  REQUIRE(k.launches.size() == 2);  // the condition's copy, then the chain
  const RunResult fused = run_compiled(test_sim(), k, in);
  check_bit_identical(fused.outputs[0], run_unfused(in, steps, shape).result);
}

TEST_CASE("SelectV2 steps that are refused: the condition's operand and type, other readers") {
  const TensorDesc f32{DataType::F32, {4, 8}}, mask{DataType::BOOL, {4, 8}};
  auto refused = [](const std::vector<TensorDesc>& inputs, const Steps& steps,
                    const std::vector<std::string>& words) {
    const OpDesc op = make_op("FusedElementwise", inputs,
                              {{"T", std::string("f32")}, {"steps", AttrValue(steps)}});
    INFO(op.str());
    const CompileRefusal r = compile_refusal(op);
    INFO(r.message);
    CHECK(r.invalid);
    for (const std::string& w : words) CHECK(r.message.find(w) != std::string::npos);
  };
  refused({f32, mask}, {"Abs i0", "SelectV2 s0 i0 i0"}, {"step 1", "bool input"});
  refused({f32, f32}, {"SelectV2 i1 i0 i0"}, {"step 0", "bool input"});
  refused({f32, mask}, {"SelectV2 i1 i0 i0", "Mul s0 i1"},
          {"input 1", "bool", "step 1", "condition only"});
  refused({f32, mask}, {"SelectV2 i1 i0"}, {"step 0", "SelectV2 takes 3 operands"});
  CHECK_FALSE(compiler::ops::fusible_elementwise("SelectV2"));  // a step, not rewrite 4's op list
}

TEST_CASE("fused Adam-like chain: bit-identical to the unfused ops, one launch, fewer cycles") {
  const std::vector<int64_t> shape =
      test_chip_is_tiny() ? std::vector<int64_t>{37, 129} : std::vector<int64_t>{3, 101, 517};
  for (DataType t : {DataType::F32, DataType::F16, DataType::BF16}) {
    INFO(compiler::data_type_name(t));
    const std::vector<HostTensor> in = adam_inputs(t, shape, 11);
    const HostTensor out = check_chain(in, kAdam);
    if (t != DataType::F32) continue;
    // The formula in double from the f32 inputs. Error bound (e = 2^-24): the numerator
    // n = m + (g - m) * b1 is off by 2e |(g - m) b1| + e |n| (the difference and the product
    // rounded, then the sum; the sum may cancel), the denominator by 3e relative (sum, square
    // root, + eps), the division and lr by e each: |err| <= lr / den * 2e |(g - m) b1| + 6e
    // |result|. Doubled for slack.
    const double e = 1.0 / (1 << 24);
    size_t bad = 0;
    for (size_t k = 0; k < in[0].values.size(); ++k) {
      const double m = in[0].values[k], v = in[1].values[k], g = in[2].values[k];
      const double b1 = in[3].values[0], lr = in[4].values[0], eps = in[5].values[0];
      const double den = std::sqrt(v + g * g) + eps;
      const double want = lr * (m + (g - m) * b1) / den;
      const double bound =
          2 * (lr / den * 2 * e * std::fabs((g - m) * b1) + 6 * e * std::fabs(want));
      if (!(std::fabs(out.values[k] - want) <= bound) && bad++ < 5)
        UNSCOPED_INFO("element " << k << ": got " << out.values[k] << ", want " << want);
    }
    INFO("f32 Adam-like chain vs double: " << bad << " elements outside the bound");
    CHECK(bad == 0);
  }
}

TEST_CASE("steps on broadcast scalars only run once, before the tile loop") {
  // Keras' Adam: var' = var - m * alpha / (sqrt(v) + eps), alpha = lr * sqrt(1 - b2^t) /
  // (1 - b1^t) from scalars (steps 0-5 are uniform). Bit-identical to the unfused ops; the
  // hoisted steps (the listing's "resident work") do not repeat in the tile loop, so the
  // launch takes fewer cycles than the same chain with alpha given as one scalar input plus
  // the scalar work done once per tile would.
  const std::vector<int64_t> shape =
      test_chip_is_tiny() ? std::vector<int64_t>{61, 257} : std::vector<int64_t>{5, 203, 517};
  for (DataType t : {DataType::F32, DataType::F16}) {
    INFO(compiler::data_type_name(t));
    const std::vector<HostTensor> in = {random_tensor(t, shape, -1, 1, 21),     // i0 var
                                        random_tensor(t, shape, -1, 1, 22),     // i1 m
                                        random_tensor(t, shape, 0, 1, 23),      // i2 v
                                        random_tensor(t, {}, 0.85, 0.95, 24),   // i3 b1
                                        random_tensor(t, {}, 0.99, 0.999, 25),  // i4 b2
                                        random_tensor(t, {}, 3, 3, 26),  // i5 t (a small integer)
                                        random_tensor(t, {}, 1, 1, 27),  // i6 one
                                        random_tensor(t, {}, 1e-3, 2e-3, 28),   // i7 lr
                                        random_tensor(t, {}, 1e-4, 1e-3, 29)};  // i8 eps
    const Steps steps = {"Pow i4 i5", "Sub i6 s0",   "Sqrt s1",       "Mul i7 s2",
                         "Pow i3 i5", "Sub i6 s4",   "RealDiv s3 s5", "Mul i1 s6",
                         "Sqrt i2",   "AddV2 s8 i8", "RealDiv s7 s9", "Sub i0 s10"};
    check_chain(in, steps);
    const CompiledKernel k = compiler::compile(fused_op(in, steps), test_sim().config());
    const std::string& listing = k.launches[0].kernel.listing;
    CHECK(listing.find("resident work") != std::string::npos);
    // They run over the first kResidentPart elements only (StreamSpec::resident_results); the
    // one result the tile loop reads (step 6, read by step 7) is then copied over the tile,
    // which every output position check_chain compared above depends on.
    CHECK(listing.find("resident work: the first elements") != std::string::npos);
    CHECK(listing.find("resident work: a whole tile") == std::string::npos);
    // Every Pow step is emitted once: its origin comment appears before the tile loop only.
    const size_t loop = listing.find("tile_loop");
    REQUIRE(loop != std::string::npos);
    CHECK(listing.find("step 0: Pow i4 i5") < loop);
    CHECK(listing.find("step 0: Pow i4 i5", loop) == std::string::npos);
    CHECK(listing.find("step 7: Mul i1 s6", loop) != std::string::npos);
  }
}

TEST_CASE("fused DAG reusing steps, general broadcasting, several cores") {
  // x [5, 7, 33], y [33] (resident period), z [7, 1] (gathered), w scalar.
  for (DataType t : {DataType::F32, DataType::F16, DataType::BF16}) {
    INFO(compiler::data_type_name(t));
    const std::vector<HostTensor> in = {
        random_tensor(t, {5, 7, 33}, -2, 2, 21), random_tensor(t, {33}, -2, 2, 22),
        random_tensor(t, {7, 1}, 0.5, 1.5, 23), random_tensor(t, {}, 0.25, 0.75, 24)};
    check_chain(in, {"Sub i0 i1", "Mul s0 i2", "Abs s1", "Minimum s2 s0", "Maximum s3 s0",
                     "AddV2 s4 s1", "Mul s5 i3"});
  }
}

TEST_CASE("fused chain of ops with temporaries and prologues") {
  // Log1p, Pow, Floor, Sign, DivNoNan, SquaredDifference have UB temporaries and constants
  // filled in the prologue; Pow and Log1p widen f16/bf16 to f32.
  const std::vector<int64_t> shape = {3, 1, 301};
  for (DataType t : {DataType::F32, DataType::F16, DataType::BF16}) {
    INFO(compiler::data_type_name(t));
    const std::vector<HostTensor> in = {random_tensor(t, shape, -3, 3, 31),
                                        random_tensor(t, {4, 1}, 0.5, 2, 32)};
    check_chain(in, {"Log1p i1", "Pow i1 i0", "DivNoNan s1 s0", "Floor s2", "Sign i0",
                     "SquaredDifference s3 s4", "Neg s5", "Exp s6", "Relu i0", "Rsqrt s1",
                     "Maximum s7 s8", "Mul s10 s9", "Ceil s11", "Round s2", "AddV2 s12 s13"});
  }
}

TEST_CASE("fused chain of one input: unary steps, a step reading one result twice") {
  const HostTensor x = random_tensor(DataType::F32, {1000}, 0.1, 4, 41);
  check_chain({x}, {"Sqrt i0", "Log s0", "Reciprocal i0", "Mul s1 s2", "Square s3", "Mul s4 s4",
                    "DivNoNan s5 s1"});
}

TEST_CASE("ReluGrad steps: a residual gradient sum back through its ReLU, bit-identical") {
  // The graph pass's rewrite 16: ReluGrad(AddN(a, b, c), y) as AddN's AddV2 steps, then
  // ReluGrad; y with zeros of both signs (masked), a with an infinity (inf * 0: NaN, as
  // ReluGrad's product gives where the mask is 0).
  const Steps steps = {"AddV2 i0 i1", "AddV2 s0 i2", "ReluGrad s1 i3"};
  for (DataType t : {DataType::F32, DataType::F16, DataType::BF16}) {
    INFO(compiler::data_type_name(t));
    const std::vector<int64_t> shape = {4, 7, 7, 24};
    std::vector<HostTensor> in = {
        random_tensor(t, shape, -2, 2, 51), random_tensor(t, shape, -2, 2, 52),
        random_tensor(t, shape, -2, 2, 53), random_tensor(t, shape, -1, 1, 54)};
    for (size_t i = 0; i < in[3].values.size(); i += 5) in[3].values[i] = i % 2 ? -0.0 : 0.0;
    in[0].values[10] = INFINITY;  // y[10] is 0: masked
    const HostTensor fused = check_chain(in, steps);
    // The sum is the AddN op's, bit for bit.
    const std::vector<HostTensor> terms(in.begin(), in.begin() + 3);
    std::vector<TensorDesc> descs;
    for (const HostTensor& x : terms) descs.push_back(x.desc);
    RunResult sum = run_compiled(
        test_sim(), compiler::compile(make_op("AddN", descs, {}), test_sim().config()), terms);
    RunResult masked =
        run_compiled(test_sim(),
                     compiler::compile(make_op("ReluGrad", {sum.outputs[0].desc, in[3].desc}, {}),
                                       test_sim().config()),
                     {sum.outputs[0], in[3]});
    check_bit_identical(fused, masked.outputs[0]);
    CHECK(std::isnan(fused.values[10]));
  }
}

namespace {

// The "tile N elements" of a stream launch's summary.
int64_t summary_tile(const std::string& summary) {
  const size_t at = summary.find("tile ");
  REQUIRE(at != std::string::npos);
  return std::stoll(summary.substr(at + 5));
}

// The get_block_id instructions of a launch: one for its range, one more for a staggered first
// tile (StreamSpec::stagger_first_tiles).
size_t block_id_reads(const compiler::Launch& l) {
  size_t n = 0;
  for (const isa::Section& s : l.kernel.program.sections)
    for (const isa::Instruction& i : s.code) n += i.op == isa::Opcode::op_get_block_id;
  return n;
}

}  // namespace

// The ResNet-50 step's residual gradient sum at a size where every block streams several tiles
// (docs/compiler.md "Fused element-wise chains", the chains' schedule): the blocks' first tiles
// are staggered where that can pay (the vector cores' GM -> UB ports together outrun HBM's
// sustained rate and a load's set_flag holds MTE2: the 910b, not the tiny chip), as AddN's, and
// ReluGrad declares the one scratch tile its compute uses, so the tile exceeds what a layout
// with ReluGrad's four scratch tiles could hold. The values stay the unfused ops' bit for bit.
TEST_CASE("the residual gradient sum: staggered blocks, ReluGrad's one scratch tile") {
  const ChipConfig& cfg = test_sim().config();
  const isa::CoreKind vk = cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE;
  const int cores = cfg.core_kind(vk)->count;
  const uint64_t ub = cfg.core_kind(vk)->capacity(isa::Buf::UB);
  const std::vector<int64_t> shape = {cores, 4, 4096 + 24};
  std::vector<HostTensor> in = {random_tensor(DataType::F16, shape, -2, 2, 71),
                                random_tensor(DataType::F16, shape, -2, 2, 72),
                                random_tensor(DataType::F16, shape, -1, 1, 73)};
  for (size_t i = 0; i < in[2].values.size(); i += 7) in[2].values[i] = i % 2 ? -0.0 : 0.0;
  const Steps steps = {"AddV2 i0 i1", "ReluGrad s0 i2"};
  check_chain(in, steps);
  const bool stagger = compiler::ops::load_round_trips_idle_hbm(cfg, cores);
  const CompiledKernel k = compiler::compile(fused_op(in, steps), cfg);
  REQUIRE(k.launches.size() == 1);
  INFO(k.launches[0].summary);
  CHECK(block_id_reads(k.launches[0]) == (stagger ? 2u : 1u));
  // Bytes per element with four scratch tiles: two f16 tiles per input (3) and the output, the
  // sum's f16 tile, ReluGrad's three widened f32 operands and four f32 scratch tiles.
  const uint64_t four_scratch = 2 * 2 * 4 + 2 + 3 * 4 + 4 * 4;
  CHECK(static_cast<uint64_t>(summary_tile(k.launches[0].summary)) * four_scratch > ub);
  // AddN streams as the same chain of AddV2 steps, with the same schedule (a larger shape: its
  // tile is larger, and a block of under two tiles is not staggered).
  const TensorDesc term{DataType::F16, {cores, 16, 4096 + 24}};
  const CompiledKernel add_n = compiler::compile(make_op("AddN", {term, term, term}, {}), cfg);
  REQUIRE(add_n.launches.size() == 1);
  INFO(add_n.launches[0].summary);
  CHECK(block_id_reads(add_n.launches[0]) == (stagger ? 2u : 1u));
}

// AddN over many inputs (ops/fused_elementwise.h): any N sums left to right, ((x0 + x1) + x2)
// + ..., each partial sum rounded to T, so the result is bit-identical to that sum evaluated on
// the host in T. Past what one kernel takes (its arguments: KernelBuilder::max_args(), its
// scalar registers and UB) the inputs go in several launches continuing the running sum. The
// inputs' magnitudes span 1e-3 .. 1e3 with both signs, so another order would round otherwise.
TEST_CASE("AddN of many inputs: left to right, bit-identical, several launches past a kernel") {
  const ChipConfig& cfg = test_sim().config();
  const size_t max_args = static_cast<size_t>(compiler::KernelBuilder::max_args());
  for (DataType t : {DataType::F32, DataType::F16}) {
    for (size_t n : {size_t{2}, size_t{31}, size_t{64}, size_t{300}}) {
      INFO(compiler::data_type_name(t) << ", N = " << n);
      const std::vector<int64_t> shape = {5, 37};
      std::vector<HostTensor> in;
      std::vector<TensorDesc> descs;
      for (size_t i = 0; i < n; ++i) {
        const double scale = std::pow(10.0, static_cast<double>(i % 7) - 3);
        in.push_back(random_tensor(t, shape, -scale, scale, static_cast<uint32_t>(900 + i)));
        descs.push_back(in.back().desc);
      }
      HostTensor want = in[0];
      for (size_t i = 1; i < n; ++i)
        for (size_t e = 0; e < want.values.size(); ++e) {
          const double a = want.values[e], b = in[i].values[e];
          want.values[e] = t == DataType::F32
                               ? static_cast<double>(static_cast<float>(a) + static_cast<float>(b))
                               : round_to(t, a + b);  // a half sum is exact in double
        }
      const CompiledKernel k = compiler::compile(make_op("AddN", descs, {}), cfg);
      REQUIRE(k.outputs.size() == 1);
      if (n == 2) CHECK(k.launches.size() == 1);
      if (n >= max_args) CHECK(k.launches.size() >= 2);
      for (const compiler::Launch& l : k.launches) CHECK(l.args.size() <= max_args);
      RunResult run = run_compiled(test_sim(), k, in);
      check_bit_identical(run.outputs.at(0), want);
    }
  }
}

// The graph pass's rewrite 16 on a wide sum: ReluGrad(AddN of 40 terms, y) as FusedElementwise.
// One kernel does not take 41 inputs (an address register each), so the AddN steps go first as
// the AddN op (itself several launches) into a workspace tensor and ReluGrad reads it: the bits
// of the AddN op followed by the ReluGrad op.
TEST_CASE("a chain headed by a wide AddN: the sum on its own first, the same bits") {
  const ChipConfig& cfg = test_sim().config();
  for (DataType t : {DataType::F32, DataType::F16}) {
    INFO(compiler::data_type_name(t));
    const std::vector<int64_t> shape = {6, 29};
    const size_t n = 40;
    std::vector<HostTensor> in;
    Steps steps = {"AddV2 i0 i1"};
    for (size_t i = 0; i < n; ++i)
      in.push_back(random_tensor(t, shape, -4, 4, static_cast<uint32_t>(1300 + i)));
    for (size_t i = 2; i < n; ++i) steps.push_back(fmt::format("AddV2 s{} i{}", i - 2, i));
    steps.push_back(fmt::format("ReluGrad s{} i{}", n - 2, n));
    in.push_back(random_tensor(t, shape, -1, 1, 1399));
    const CompiledKernel k = compiler::compile(fused_op(in, steps), cfg);
    CHECK(k.launches.size() >= 3);  // the sum's launches, then ReluGrad's
    const HostTensor fused = run_compiled(test_sim(), k, in).outputs.at(0);
    const std::vector<HostTensor> terms(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(n));
    std::vector<TensorDesc> descs;
    for (const HostTensor& x : terms) descs.push_back(x.desc);
    RunResult sum =
        run_compiled(test_sim(), compiler::compile(make_op("AddN", descs, {}), cfg), terms);
    RunResult masked = run_compiled(
        test_sim(),
        compiler::compile(make_op("ReluGrad", {sum.outputs[0].desc, in[n].desc}, {}), cfg),
        {sum.outputs[0], in[n]});
    check_bit_identical(fused, masked.outputs[0]);
  }
}

TEST_CASE("fusible_elementwise: the float ops of binary.cpp and unary.cpp with a float result") {
  using compiler::ops::fusible_elementwise;
  for (const char* op : {"AddV2",    "Add",        "Sub",     "Mul",
                         "RealDiv",  "Maximum",    "Minimum", "SquaredDifference",
                         "DivNoNan", "Pow",        "Neg",     "Abs",
                         "Exp",      "Log",        "Sqrt",    "Rsqrt",
                         "Square",   "Reciprocal", "Relu",    "Floor",
                         "Ceil",     "Round",      "Sign",    "Log1p"})
    CHECK(fusible_elementwise(op));
  for (const char* op : {"Equal", "Less", "LogicalAnd", "LogicalOr", "IsFinite", "LogicalNot",
                         "Sigmoid", "Cast", "MatMul", "FusedElementwise", ""})
    CHECK_FALSE(fusible_elementwise(op));
  // A step (rewrite 16 writes it), not one of rewrite 4's chain ops.
  CHECK_FALSE(fusible_elementwise("ReluGrad"));
}

TEST_CASE("bad FusedElementwise ops: a CompileError naming the op, the step and the problem") {
  const TensorDesc f32{DataType::F32, {4, 8}}, f16{DataType::F16, {4, 8}};
  // want_invalid: InvalidOpError (the op breaks its contract), else a plain CompileError.
  auto refused = [](const std::vector<TensorDesc>& inputs, const Steps& steps, bool want_invalid,
                    const std::vector<std::string>& words) {
    const OpDesc op = make_op("FusedElementwise", inputs, {{"steps", AttrValue(steps)}});
    INFO(op.str());
    const CompileRefusal r = compile_refusal(op);
    INFO(r.message);
    CHECK(r.invalid == want_invalid);
    for (const std::string& w : words) CHECK(r.message.find(w) != std::string::npos);
  };
  refused({f32, f32}, {"Sub i0 i1", "Frobnicate s0"}, false, {"step 1", "Frobnicate"});
  refused({f32, f32}, {"Sub i0 i1", "Mul s3 i0"}, true, {"step 1", "s3", "earlier step"});
  refused({f32, f32}, {"Sub i0 i1", "Mul s1 i0"}, true, {"step 1", "s1"});
  refused({f32, f32}, {"Sub i0 i7"}, true, {"step 0", "i7", "out of range"});
  refused({f32, f32}, {"Sub i0  i1"}, true, {"step 0", "empty word"});
  refused({f32, f32}, {"Sub i0 i1 "}, true, {"step 0", "empty word"});
  refused({f32, f32}, {"Sub x0 i1"}, true, {"step 0", "x0"});
  refused({f32, f32}, {"Sub i0 s"}, true, {"step 0", "'s'"});
  refused({f32, f32}, {"Sub i0 i-1"}, true, {"step 0", "i-1"});
  refused({f32, f32}, {"Sub i0 i1", "Sqrt"}, true, {"step 1", "expected"});
  refused({f32, f32}, {"Sub i0 i1", "Sqrt s0 i0"}, true, {"step 1", "Sqrt takes 1 operand"});
  refused({f32, f32}, {"Sub i0"}, true, {"step 0", "Sub takes 2 operands"});
  refused({f32, f32}, {"Sub i0 i1", "Equal s0 i1"}, false, {"step 1", "Equal", "fusible"});
  refused({f32, f32}, {"Sub i0 i1", "IsFinite s0"}, false, {"step 1", "IsFinite", "fusible"});
  refused({f32, f32}, {"LogicalAnd i0 i1"}, false, {"step 0", "LogicalAnd", "fusible"});
  refused({f32, f32}, {"Sigmoid i0"}, false, {"step 0", "Sigmoid", "fusible"});
  refused({f32, f16}, {"Sub i0 i1"}, true, {"input 1", "f16"});
  refused({f32, f32}, {}, true, {"steps"});
  refused({}, {"Sqrt i0"}, true, {"1 input"});
  refused({TensorDesc{DataType::S32, {4}}}, {"Abs i0"}, false, {"s32"});
  refused({f32, TensorDesc{DataType::F32, {3}}}, {"Sub i0 i1"}, true, {"input 1", "[3]"});
}

// Keras 3's Adam update of one variable as the graph pass groups it (rewrite 5 of the plugin's
// graph_fusion.h): variables i0 = m, i1 = v, i2 = var, then g, 1 - beta_1, 1 - beta_2, alpha,
// epsilon. m' = m + (g - m) * c1, v' = v + (g^2 - v) * c2, var' = var - m' * alpha /
// (sqrt(v') + eps): the AssignAdd / AssignSub steps are 2, 6 and 11.
const Steps kKerasAdam = {"Sub i3 i0", "Mul s0 i4",   "AddV2 i0 s1",   "Square i3",
                          "Sub s3 i1", "Mul s4 i5",   "AddV2 i1 s5",   "Mul s2 i6",
                          "Sqrt s6",   "AddV2 s8 i7", "RealDiv s7 s9", "Sub i2 s10"};
const std::vector<int64_t> kKerasAdamUpdates = {2, 6, 11};

OpDesc variable_update_op(const std::vector<HostTensor>& inputs, const Steps& steps,
                          const std::vector<int64_t>& updates) {
  std::vector<TensorDesc> descs;
  for (const HostTensor& t : inputs) descs.push_back(t.desc);
  return make_op("FusedVariableUpdate", descs,
                 {{"T", std::string(compiler::data_type_name(descs[0].dtype))},
                  {"M", AttrValue(static_cast<int64_t>(updates.size()))},
                  {"steps", AttrValue(steps)},
                  {"updates", AttrValue(updates)}});
}

TEST_CASE("FusedVariableUpdate: Keras' Adam, the new m, v and var in one launch, bit-identical") {
  const std::vector<int64_t> shape =
      test_chip_is_tiny() ? std::vector<int64_t>{37, 129} : std::vector<int64_t>{3, 101, 517};
  // (T, the gradient's type): under mixed precision the f32 update reads an f16 gradient, its
  // Cast a step of the update (with_input_cast).
  const std::pair<DataType, DataType> types[] = {{DataType::F32, DataType::F32},
                                                 {DataType::F16, DataType::F16},
                                                 {DataType::BF16, DataType::BF16},
                                                 {DataType::F32, DataType::F16}};
  for (const auto& [t, gt] : types) {
    INFO(compiler::data_type_name(t) << ", gradient " << compiler::data_type_name(gt));
    const Steps steps = gt == t ? kKerasAdam : with_input_cast(kKerasAdam, 3);
    const std::vector<int64_t> updates = gt == t ? kKerasAdamUpdates : shifted(kKerasAdamUpdates);
    const std::vector<HostTensor> in = {random_tensor(t, shape, -1, 1, 51),     // m
                                        random_tensor(t, shape, 0, 2, 52),      // v
                                        random_tensor(t, shape, -1, 1, 53),     // var
                                        random_tensor(gt, shape, -3, 3, 54),    // g
                                        random_tensor(t, {}, 0.1, 0.1, 55),     // 1 - beta_1
                                        random_tensor(t, {}, 1e-3, 1e-3, 56),   // 1 - beta_2
                                        random_tensor(t, {}, 1e-3, 2e-3, 57),   // alpha
                                        random_tensor(t, {}, 1e-7, 1e-7, 58)};  // epsilon
    const OpDesc op = variable_update_op(in, steps, updates);
    INFO(op.str());
    const CompiledKernel k = compiler::compile(op, test_sim().config());
    REQUIRE(k.launches.size() == 1);
    REQUIRE(k.outputs.size() == 3);
    const RunResult fused = run_compiled(test_sim(), k, in);
    const ChainRun unfused = run_unfused(in, steps, shape);
    for (size_t j = 0; j < 3; ++j) {
      INFO("variable " << j);
      check_bit_identical(fused.outputs[j], unfused.steps[static_cast<size_t>(updates[j])]);
    }
    if (gt != t) CHECK(unfused.launches == steps.size());  // the Cast's launch among them
    WARN(op.str() << ": fused 1 launch, " << fused.cycles << " cycles; unfused " << unfused.launches
                  << " launches, " << unfused.cycles << " cycles");
    CHECK(fused.cycles < unfused.cycles);
    if (t != DataType::F32) continue;
    // The formula in double from the f32 inputs: m' and v' within a few ulp (difference,
    // product and sum each rounded: 3e of the largest term), var' within 3e |var| + 8e |step|
    // (the step's error, 2e from m', 3e from the denominator, 2e its product and quotient,
    // plus slack; e = 2^-24).
    const double e = 1.0 / (1 << 24);
    size_t bad = 0;
    for (size_t i = 0; i < in[0].values.size(); ++i) {
      const double m = in[0].values[i], v = in[1].values[i], w = in[2].values[i];
      const double g = in[3].values[i], c1 = in[4].values[0], c2 = in[5].values[0];
      const double alpha = in[6].values[0], eps = in[7].values[0];
      const double m1 = m + (g - m) * c1, v1 = v + (g * g - v) * c2;
      const double step = m1 * alpha / (std::sqrt(v1) + eps), w1 = w - step;
      const double got[3] = {fused.outputs[0].values[i], fused.outputs[1].values[i],
                             fused.outputs[2].values[i]};
      const bool good =
          std::fabs(got[0] - m1) <= 3 * e * (std::fabs(m) + std::fabs(g - m) + std::fabs(m1)) &&
          std::fabs(got[1] - v1) <= 3 * e * (std::fabs(v) + g * g + std::fabs(v1)) &&
          std::fabs(got[2] - w1) <=
              3 * e * std::fabs(w) + 8 * e * std::fabs(step) + e * std::fabs(w1);
      if (!good && bad++ < 5)
        UNSCOPED_INFO("element " << i << ": got " << got[0] << " " << got[1] << " " << got[2]
                                 << ", want " << m1 << " " << v1 << " " << w1);
    }
    INFO(bad << " elements outside the bound");
    CHECK(bad == 0);
  }
}

TEST_CASE("FusedVariableUpdate: SGD with momentum, a variable read after its update") {
  // Keras 3's SGD: m' = m * momentum - g * lr (an Assign), var' = var + m' (AssignAdd of the
  // new m). i0 = m, i1 = var, i2 = g, i3 = momentum, i4 = lr (a [1] tensor).
  const std::vector<HostTensor> in = {random_tensor(DataType::F32, {1000}, -1, 1, 61),
                                      random_tensor(DataType::F32, {1000}, -1, 1, 62),
                                      random_tensor(DataType::F32, {1000}, -1, 1, 63),
                                      random_tensor(DataType::F32, {}, 0.9, 0.9, 64),
                                      random_tensor(DataType::F32, {1}, 0.01, 0.01, 65)};
  const Steps steps = {"Mul i0 i3", "Mul i2 i4", "Sub s0 s1", "AddV2 i1 s2"};
  const CompiledKernel k =
      compiler::compile(variable_update_op(in, steps, {2, 3}), test_sim().config());
  REQUIRE(k.launches.size() == 1);
  const RunResult fused = run_compiled(test_sim(), k, in);
  const ChainRun unfused = run_unfused(in, steps, {1000});
  check_bit_identical(fused.outputs[0], unfused.steps[2]);
  check_bit_identical(fused.outputs[1], unfused.steps[3]);
  for (size_t i = 0; i < 1000; ++i) {
    const float m1 = static_cast<float>(in[0].values[i]) * static_cast<float>(in[3].values[0]) -
                     static_cast<float>(in[2].values[i]) * static_cast<float>(in[4].values[0]);
    REQUIRE(fused.outputs[0].values[i] == m1);
    REQUIRE(fused.outputs[1].values[i] == static_cast<float>(in[1].values[i]) + m1);
  }
}

TEST_CASE("bad FusedVariableUpdate ops: an InvalidOpError naming the problem") {
  const TensorDesc var{DataType::F32, {4, 8}}, other{DataType::F32, {8}};
  auto refused = [](const std::vector<TensorDesc>& inputs, const Steps& steps,
                    const std::map<std::string, AttrValue>& attrs,
                    const std::vector<std::string>& words) {
    std::map<std::string, AttrValue> a = attrs;
    a["steps"] = AttrValue(steps);
    const OpDesc op = make_op("FusedVariableUpdate", inputs, a);
    INFO(op.str());
    const CompileRefusal r = compile_refusal(op);
    INFO(r.message);
    CHECK(r.invalid);
    for (const std::string& w : words) CHECK(r.message.find(w) != std::string::npos);
  };
  const Steps steps = {"Mul i0 i2", "Sub i1 s0"};
  using Ints = std::vector<int64_t>;
  refused({var, var, other}, steps, {{"updates", AttrValue(Ints{1})}}, {"M = -1"});
  refused({var, var, other}, steps, {{"M", AttrValue(int64_t{4})}, {"updates", AttrValue(Ints{1})}},
          {"M = 4", "3 inputs"});
  refused({var, var, other}, steps, {{"M", AttrValue(int64_t{2})}, {"updates", AttrValue(Ints{1})}},
          {"'updates' has 1"});
  refused({var, var, other}, steps,
          {{"M", AttrValue(int64_t{2})}, {"updates", AttrValue(Ints{1, 1})}}, {"both step 1"});
  refused({var, var, other}, steps,
          {{"M", AttrValue(int64_t{2})}, {"updates", AttrValue(Ints{0, 5})}}, {"step 5"});
  refused({var, other, other}, steps,
          {{"M", AttrValue(int64_t{2})}, {"updates", AttrValue(Ints{0, 1})}},
          {"variable 1", "[8]"});
  // A variable smaller than the steps' broadcast shape.
  refused({other, TensorDesc{DataType::F32, {4, 8}}}, {"Mul i0 i1"},
          {{"M", AttrValue(int64_t{1})}, {"updates", AttrValue(Ints{0})}}, {"[4,8]", "[8]"});
}

TEST_CASE("list(string) attributes: the cache key tells every two lists apart") {
  auto key = [](const Steps& steps) {
    return make_op("FusedElementwise", {TensorDesc{DataType::F32, {4}}},
                   {{"steps", AttrValue(steps)}})
        .key();
  };
  CHECK(key({"Sqrt i0", "Exp s0"}) == key({"Sqrt i0", "Exp s0"}));
  CHECK(key({"Sqrt i0", "Exp s0"}) != key({"Exp s0", "Sqrt i0"}));
  CHECK(key({"a", "b"}) != key({"a,b"}));
  CHECK(key({"a;b"}) != key({"a", "b"}));
  CHECK(key({""}) != key({}));
}

// Keras 3's Adam as the ResNet-50 step's graph pass makes it (the gradient's Cast folded):
// i0 = m, i1 = v, i2 = var, i3 = g (f16), i4 = 1 - beta_1, i5 = 1 - beta_2, i6 = beta_1,
// i7 = the step, i8 = beta_2, i9 = i10 = 1, i11 = epsilon, i12 = lr. The step size
// lr * sqrt(1 - beta_2^t) / (1 - beta_1^t) (steps 8, 9, 11, 12, 14, 15, 16) is uniform.
const Steps kKeras3Adam = {"Cast i3",         "Sub s0 i0",     "Mul s1 i4",       "AddV2 i0 s2",
                           "Square s0",       "Sub s4 i1",     "Mul s5 i5",       "AddV2 i1 s6",
                           "Pow i6 i7",       "Pow i8 i7",     "Sqrt s7",         "Sub i9 s8",
                           "Sub i10 s9",      "AddV2 s10 i11", "Sqrt s11",        "Mul i12 s14",
                           "RealDiv s15 s12", "Mul s3 s16",    "RealDiv s17 s13", "Sub i2 s18"};
const std::vector<int64_t> kKeras3AdamUpdates = {3, 7, 19};

// FusedVariableUpdate's schedule (docs/compiler.md "Fused element-wise chains"): the per-tile
// results share UB tiles, the uniform work's buffers (its results and scalars read by no
// per-tile step) hold its first elements only, and the blocks' first tiles are staggered. The
// new values are the unfused ops' bit for bit, and the tile is larger than a layout with a
// tile per step's result and per scalar could hold.
TEST_CASE("FusedVariableUpdate: Keras 3's Adam, its step size once, tiles the UB allows") {
  const ChipConfig& cfg = test_sim().config();
  const isa::CoreKind vk = cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE;
  const int64_t n = int64_t{8192} * cfg.core_kind(vk)->count + 37;  // several tiles a block
  const std::vector<int64_t> shape = {n};
  const double scalars[] = {0.1, 1e-3, 0.9, 3, 0.999, 1, 1, 1e-7, 1e-3};  // i4 .. i12
  std::vector<HostTensor> in = {random_tensor(DataType::F32, shape, -1, 1, 61),
                                random_tensor(DataType::F32, shape, 0, 2, 62),
                                random_tensor(DataType::F32, shape, -1, 1, 63),
                                random_tensor(DataType::F16, shape, -3, 3, 64)};
  for (double v : scalars) in.push_back(HostTensor{TensorDesc{DataType::F32, {}}, {v}});
  std::vector<TensorDesc> descs;
  for (const HostTensor& t : in) descs.push_back(t.desc);
  const OpDesc op = make_op("FusedVariableUpdate", descs,
                            {{"T", std::string("f32")},
                             {"M", AttrValue(int64_t{3})},
                             {"steps", AttrValue(kKeras3Adam)},
                             {"updates", AttrValue(kKeras3AdamUpdates)}});
  const CompiledKernel k = compiler::compile(op, cfg);
  REQUIRE(k.launches.size() == 1);
  const std::string& summary = k.launches[0].summary;
  INFO(summary);
  const RunResult fused = run_compiled(test_sim(), k, in);
  const ChainRun unfused = run_unfused(in, kKeras3Adam, shape, DataType::F32);
  for (size_t j = 0; j < 3; ++j) {
    INFO("variable " << j);
    check_bit_identical(fused.outputs[j],
                        unfused.steps[static_cast<size_t>(kKeras3AdamUpdates[j])]);
  }
  // A tile per step result that is no output (17 of 20) and per scalar (9), two per flat input
  // (3 f32, 1 f16) and output (3 f32): at least this many UB bytes per element.
  const uint64_t one_each = 17 * 4 + 9 * 4 + 2 * (3 * 4 + 2) + 2 * 3 * 4;
  CHECK(static_cast<uint64_t>(summary_tile(summary)) * one_each >
        cfg.core_kind(vk)->capacity(isa::Buf::UB));
  // The staggered first tiles (each block's first limit computed from its block id) where the
  // blocks' GM -> UB ports together outrun HBM's sustained rate (the 910b's 48 x 32 B/cycle;
  // not the tiny chip's 4): test_compiler_stream.cpp shows what that buys.
  const int cores = cfg.core_kind(vk)->count;
  const bool stagger = compiler::ops::load_round_trips_idle_hbm(cfg, cores);
  CHECK(block_id_reads(k.launches[0]) == (stagger ? 2u : 1u));  // its range, its first tile
}

// The multi-tensor form (members > 1, graph_fusion.h rewrite 5b): Keras' Adam over variables of
// many shapes in one op. The small variables' updates are segments of one launch (elements split
// over the cores across variables), the large ones' of another; every new value must be
// bit-identical to the member's own FusedVariableUpdate (which the test above checks against the
// unfused ops and the formula), in fewer cycles than those launches together.
namespace {

// Keras' Adam over variables of `shapes` as one multi-tensor FusedVariableUpdate, f32, f16 and
// f32 with f16 gradients: every member's outputs bit for bit its own kernel's, in fewer cycles;
// check_launches(k) looks at the compiled launches first.
void check_multi_tensor_adam(const std::vector<std::vector<int64_t>>& shapes,
                             const std::function<void(const CompiledKernel&)>& check_launches) {
  const ChipConfig& cfg = test_sim().config();
  const std::pair<DataType, DataType> types[] = {{DataType::F32, DataType::F32},
                                                 {DataType::F16, DataType::F16},
                                                 {DataType::F32, DataType::F16}};
  for (const auto& [t, gt] : types) {
    INFO(compiler::data_type_name(t) << ", gradient " << compiler::data_type_name(gt));
    const Steps steps = gt == t ? kKerasAdam : with_input_cast(kKerasAdam, 3);
    const std::vector<int64_t> updates = gt == t ? kKerasAdamUpdates : shifted(kKerasAdamUpdates);
    const size_t g_count = shapes.size();
    std::vector<std::vector<HostTensor>> member(g_count);
    for (size_t g = 0; g < g_count; ++g) {
      const uint64_t seed = 100 + 10 * g;
      const std::vector<int64_t>& s = shapes[g];
      member[g] = {
          random_tensor(t, s, -1, 1, seed),           random_tensor(t, s, 0, 2, seed + 1),
          random_tensor(t, s, -1, 1, seed + 2),       random_tensor(gt, s, -3, 3, seed + 3),
          random_tensor(t, {}, 0.1, 0.2, seed + 4),   random_tensor(t, {}, 1e-3, 2e-3, seed + 5),
          random_tensor(t, {}, 1e-3, 2e-3, seed + 6), random_tensor(t, {}, 1e-7, 2e-7, seed + 7)};
    }
    // Inputs: every member's 3 variables, then every member's 5 other inputs.
    std::vector<HostTensor> in;
    for (size_t g = 0; g < g_count; ++g)
      in.insert(in.end(), member[g].begin(), member[g].begin() + 3);
    for (size_t g = 0; g < g_count; ++g)
      in.insert(in.end(), member[g].begin() + 3, member[g].end());
    std::vector<TensorDesc> descs;
    for (const HostTensor& h : in) descs.push_back(h.desc);
    const OpDesc op = make_op("FusedVariableUpdate", descs,
                              {{"T", std::string(compiler::data_type_name(t))},
                               {"M", AttrValue(static_cast<int64_t>(3 * g_count))},
                               {"members", AttrValue(static_cast<int64_t>(g_count))},
                               {"steps", AttrValue(steps)},
                               {"updates", AttrValue(updates)}});
    const CompiledKernel k = compiler::compile(op, cfg);
    REQUIRE(k.outputs.size() == 3 * g_count);
    check_launches(k);
    const RunResult multi = run_compiled(test_sim(), k, in);
    uint64_t own_cycles = 0;
    for (size_t g = 0; g < g_count; ++g) {
      INFO("member " << g << " " << compiler::shape_str(shapes[g]));
      const CompiledKernel one =
          compiler::compile(variable_update_op(member[g], steps, updates), cfg);
      const RunResult own = run_compiled(test_sim(), one, member[g]);
      own_cycles += own.cycles;
      for (size_t j = 0; j < 3; ++j) {
        INFO("variable " << j);
        REQUIRE(multi.outputs[3 * g + j].desc.shape == shapes[g]);
        check_bit_identical(multi.outputs[3 * g + j], own.outputs[j]);
      }
    }
    WARN(op.str() << ": multi-tensor " << k.launches.size() << " launches, " << multi.cycles
                  << " cycles; one op per variable " << g_count << " launches, " << own_cycles
                  << " cycles");
    CHECK(multi.cycles < own_cycles);
  }
}

}  // namespace

TEST_CASE("FusedVariableUpdate: multi-tensor Adam over many small variables, bit-identical") {
  const ChipConfig& cfg = test_sim().config();
  const isa::CoreKind vk = cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE;
  const int64_t large = 1024 * cfg.core_kind(vk)->count + 5;  // over 1024 per vector core
  check_multi_tensor_adam(
      {{37}, {5, 3}, {1}, {128}, {2, 65}, {300}, {large}, {8}, {3, 3, 4, 2}, {3, large}},
      [](const CompiledKernel& k) {
        REQUIRE(k.launches.size() == 2);  // the small variables' segments, then the large ones'
        CHECK(k.launches[0].summary.find("8 segments") != std::string::npos);
        CHECK(k.launches[1].summary.find("2 segments") != std::string::npos);
        // A segment's first tile is loaded before its single-element inputs are built (scalar
        // ld, vdup) and its uniform steps run, which overlap the load's round trip: in each
        // launch the first GM -> UB copy comes before the first scalar load.
        for (const compiler::Launch& l : k.launches) {
          std::vector<isa::Opcode> ops;
          for (const isa::Section& sec : l.kernel.program.sections)
            for (const isa::Instruction& i : sec.code) ops.push_back(i.op);
          const auto copy = std::find(ops.begin(), ops.end(), isa::Opcode::op_copy_gm2ub);
          const auto ld = std::find(ops.begin(), ops.end(), isa::Opcode::op_ld);
          REQUIRE(ld != ops.end());
          CHECK(copy < ld);
        }
      });
}

TEST_CASE("multi-tensor FusedVariableUpdate: a one-element variable after a block's pong tile") {
  // Members of 1,000 elements per vector core (so a block's range holds more than one tile) and
  // one-element members between them: for a one-element variable the scalar inputs (lr, the
  // betas, epsilon) are of its shape, streamed through their ping tiles, which the segment
  // before held as resident splats. Its last tile's compute, maybe a pong tile, still reads
  // them when the next segment's first loads arrive: the loads wait for V to drain (before, the
  // last pong tile of a large member computed with the one-element member's values).
  const ChipConfig& cfg = test_sim().config();
  const isa::CoreKind vk = cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE;
  const int64_t n = 1000 * cfg.core_kind(vk)->count;
  check_multi_tensor_adam({{n}, {n}, {n}, {1}, {n}, {1}, {n}, {1}}, [](const CompiledKernel& k) {
    REQUIRE(k.launches.size() == 1);
    const std::string& summary = k.launches[0].summary;
    INFO(summary);
    CHECK(summary.find("8 segments") != std::string::npos);
    // more than one tile in a block's range: "blocks of [at most] R, tile T elements", T < R
    auto range = summary.find("blocks of ");
    const auto tile = summary.find("tile ");
    REQUIRE(range != std::string::npos);
    REQUIRE(tile != std::string::npos);
    range += 10;
    if (summary.compare(range, 8, "at most ") == 0) range += 8;
    CHECK(std::stoll(summary.substr(tile + 5)) < std::stoll(summary.substr(range)));
  });
}

// A multi-tensor launch streams at most the L2's bytes (unless one member alone is more), so the
// L2 policy of its streams is each member's own launch's: large variables whose updates
// together stream more than the L2 go to several launches.
TEST_CASE("multi-tensor FusedVariableUpdate: a launch's streams fit the L2") {
  const ChipConfig& cfg = test_sim().config();
  // Adam in f32: 3 variables, the gradient and 3 new values stream 28 bytes per element; each
  // member a third of the L2 and a little more, so two fit a launch and three do not.
  const int64_t n = static_cast<int64_t>(cfg.l2_bytes / 28 / 3) + 1024;
  const int64_t g_count = 5;
  std::vector<TensorDesc> descs;
  for (int64_t g = 0; g < g_count; ++g)
    for (int j = 0; j < 3; ++j) descs.push_back({DataType::F32, {n + g}});
  for (int64_t g = 0; g < g_count; ++g) {
    descs.push_back({DataType::F32, {n + g}});
    for (int j = 0; j < 4; ++j) descs.push_back({DataType::F32, {}});
  }
  const OpDesc op = make_op("FusedVariableUpdate", descs,
                            {{"T", std::string(compiler::data_type_name(DataType::F32))},
                             {"M", AttrValue(3 * g_count)},
                             {"members", AttrValue(g_count)},
                             {"steps", AttrValue(kKerasAdam)},
                             {"updates", AttrValue(kKerasAdamUpdates)}});
  const CompiledKernel k = compiler::compile(op, cfg);
  REQUIRE(k.launches.size() == 3);  // members 0-1, 2-3, and 4 alone
  CHECK(k.launches[0].summary.find("2 segments") != std::string::npos);
  CHECK(k.launches[1].summary.find("2 segments") != std::string::npos);
  CHECK(k.launches[2].summary.find("segments") == std::string::npos);
}

TEST_CASE("bad multi-tensor FusedVariableUpdate ops: an InvalidOpError naming the problem") {
  const TensorDesc a{DataType::F32, {4, 8}}, b{DataType::F32, {3}}, s{DataType::F32, {}};
  auto refused = [](const std::vector<TensorDesc>& inputs, int64_t m, int64_t members,
                    const std::vector<std::string>& words) {
    const OpDesc op = make_op("FusedVariableUpdate", inputs,
                              {{"M", AttrValue(m)},
                               {"members", AttrValue(members)},
                               {"steps", AttrValue(Steps{"Mul i0 i1"})},
                               {"updates", AttrValue(std::vector<int64_t>{0})}});
    INFO(op.str());
    const CompileRefusal r = compile_refusal(op);
    INFO(r.message);
    CHECK(r.invalid);
    for (const std::string& w : words) CHECK(r.message.find(w) != std::string::npos);
  };
  refused({a, b, s, s, s}, 2, 2, {"members = 2", "3 other inputs"});
  refused({a, b, s}, 2, 2, {"members = 2", "1 other inputs"});
  refused({a, b, b, s}, 3, 3, {"members = 3", "1 other inputs"});
  // Member 1's variable is smaller than its steps' result.
  refused({a, b, s, a}, 2, 2, {"member 1", "[4,8]", "[3]"});
}
