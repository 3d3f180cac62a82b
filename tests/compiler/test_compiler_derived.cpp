// Derived tensors (compiler.h, CompiledKernel::derived): the precision casts of cube operands
// are marked as tensors computed by one launch from one input of the op alone, so a runtime can
// keep them across runs (the TF plugin's derived_tensor_cache.h). Checked here: which tensors are
// marked and from which input (also through compile_without_inputs and LaunchPlan's sub-kernels),
// that each holds exactly the f16 rounding of its input, that no other launch writes it, and
// that a run with the derived tensors in buffers of their own computes the same outputs as one
// with them in the workspace.
#include <catch2/catch.hpp>

#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::ArgRef;
using compiler::PrecisionMode;

namespace {

// The f16 bytes of an f32 host tensor, rounded to nearest even.
std::vector<uint8_t> f16_bytes(const HostTensor& t) {
  std::vector<uint8_t> b(t.values.size() * 2);
  for (size_t i = 0; i < t.values.size(); ++i) {
    const uint16_t h = to_f16_bits(t.values[i]);
    std::memcpy(&b[2 * i], &h, 2);
  }
  return b;
}

// k's derived tensors come from `want_inputs` (in order); each is computed by a launch that
// reads that input and writes the tensor and nothing else; runs with and without own buffers
// agree, and the buffers hold the f16 copies of the inputs.
void check_derived(const CompiledKernel& k, const std::vector<HostTensor>& inputs,
                   const std::vector<int>& want_inputs) {
  for (const compiler::Launch& l : k.launches) UNSCOPED_INFO(l.summary);
  REQUIRE(k.derived.size() == want_inputs.size());
  for (size_t d = 0; d < k.derived.size(); ++d) {
    const compiler::DerivedTensor& t = k.derived[d];
    INFO("derived " << d << ": " << t.what);
    REQUIRE(t.inputs.size() == 1);
    CHECK(t.inputs[0] == want_inputs[d]);
    const HostTensor& src = inputs.at(static_cast<size_t>(t.inputs[0]));
    CHECK(t.bytes == src.values.size() * 2);
    const compiler::Launch& l = k.launches.at(t.launch);
    REQUIRE(l.args.size() == 2);
    CHECK(l.args[0].kind == ArgRef::Kind::kInput);
    CHECK(l.args[0].index == t.inputs[0]);
    CHECK(l.args[1].kind == ArgRef::Kind::kDerived);
    CHECK(l.args[1].index == static_cast<int>(d));
  }
  const RunResult in_workspace = run_compiled(test_sim(), k, inputs);
  const RunResult own = run_compiled(test_sim(), k, inputs, /*own_derived=*/true);
  REQUIRE(own.outputs.size() == in_workspace.outputs.size());
  for (size_t i = 0; i < own.outputs.size(); ++i)
    CHECK(own.outputs[i].values == in_workspace.outputs[i].values);
  for (size_t d = 0; d < k.derived.size(); ++d)
    CHECK(own.derived[d] == f16_bytes(inputs.at(static_cast<size_t>(k.derived[d].inputs[0]))));
}

}  // namespace

TEST_CASE("MatMul f32: A and B are derived f16 tensors; mix precision too; f16 has none") {
  HostTensor a = random_tensor(DataType::F32, {20, 36}, -2, 2, 1);
  HostTensor b = random_tensor(DataType::F32, {36, 24}, -2, 2, 2);
  const ChipConfig& cfg = test_sim().config();
  for (PrecisionMode m : {PrecisionMode::kAllowFp32ToFp16, PrecisionMode::kAllowMixPrecision}) {
    INFO(compiler::precision_mode_name(m));
    check_derived(compiler::compile(make_op("MatMul", {a.desc, b.desc}), cfg, m), {a, b},
                  {0, 1});
  }
  HostTensor h = random_tensor(DataType::F16, {20, 36}, -2, 2, 3);
  CHECK(compiler::compile(make_op("MatMul", {h.desc, h.desc}, {{"transpose_b", true}}), cfg)
            .derived.empty());
}

TEST_CASE("Conv2D and Conv2DBackpropInput with its shape operand: derived from the right inputs") {
  const ChipConfig& cfg = test_sim().config();
  const std::map<std::string, compiler::AttrValue> attrs = {
      {"strides", std::vector<int64_t>{1, 1, 1, 1}}, {"padding", std::string("SAME")},
      {"data_format", std::string("NHWC")}};
  HostTensor x = random_tensor(DataType::F32, {1, 6, 5, 3}, -1, 1, 4);
  HostTensor f = random_tensor(DataType::F32, {3, 3, 3, 8}, -1, 1, 5);
  check_derived(compiler::compile(make_op("Conv2D", {x.desc, f.desc}, attrs), cfg), {x, f},
                {0, 1});
  // TF's full input list (input_sizes, filter, out_backprop): the sizes tensor is dropped for
  // compiling, the derived tensors still name the op's inputs (dy's cast comes first).
  HostTensor sizes{TensorDesc{DataType::S32, {4}}, {1, 6, 5, 3}};
  HostTensor dy = random_tensor(DataType::F32, {1, 6, 5, 8}, -1, 1, 6);
  auto op = make_op("Conv2DBackpropInput", {sizes.desc, f.desc, dy.desc}, attrs);
  op.attrs["input_sizes"] = std::vector<int64_t>{1, 6, 5, 3};
  check_derived(compiler::compile(op, cfg), {sizes, f, dy}, {2, 1});
}

TEST_CASE("Einsum: the cast of a transposed operand is plain workspace, of a direct one derived") {
  // x [i, b, j] is transposed to [b, i, j] first (a workspace tensor); y [b, j, k] goes to the
  // product as it is.
  HostTensor x = random_tensor(DataType::F32, {5, 2, 33}, -2, 2, 7);
  HostTensor y = random_tensor(DataType::F32, {2, 33, 20}, -2, 2, 8);
  auto k = compiler::compile(
      make_op("Einsum", {x.desc, y.desc}, {{"equation", std::string("ibj,bjk->bik")}}),
      test_sim().config(), PrecisionMode::kAllowFp32ToFp16);
  check_derived(k, {x, y}, {1});
}
