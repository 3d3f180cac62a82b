// The fused optimizer updates (ops/optimizer.cpp) compiled for the test chip and run on the
// chip model, against references in plain C++ that follow TF's CPU functors (training_ops.cc)
// operation by operation: each operation in float, rounded to the variable's type (f16 / bf16
// round after every operation, as Eigen's half types do). The kernels do the same operations
// in the same order on the vector unit (fp32 arithmetic rounded once per instruction, correctly
// rounded sqrt and division), so the tolerance is 0.
#include <catch2/catch.hpp>

#include <cmath>
#include <functional>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

// One operation's result: computed in float, rounded to the type.
struct Arith {
  DataType dt;
  double r(float v) const { return round_to(dt, static_cast<double>(v)); }
  double add(double a, double b) const { return r(static_cast<float>(a) + static_cast<float>(b)); }
  double sub(double a, double b) const { return r(static_cast<float>(a) - static_cast<float>(b)); }
  double mul(double a, double b) const { return r(static_cast<float>(a) * static_cast<float>(b)); }
  double div(double a, double b) const { return r(static_cast<float>(a) / static_cast<float>(b)); }
  double sqrt(double a) const { return r(std::sqrt(static_cast<float>(a))); }
};

HostTensor scalar(DataType dt, double v) {
  return HostTensor{TensorDesc{dt, {}}, {round_to(dt, v)}};
}

// Runs k with inputs; output o is written into the buffer of input alias[o] (an in-place
// update, as the plugin may do) when in_place, else into buffers of its own. Returns the
// outputs' values.
std::vector<std::vector<double>> run(const compiler::CompiledKernel& k,
                                     const std::vector<HostTensor>& inputs,
                                     const std::vector<int>& alias, bool in_place) {
  if (!in_place) {
    RunResult r = run_compiled(test_sim(), k, inputs);
    std::vector<std::vector<double>> v;
    for (const HostTensor& t : r.outputs) v.push_back(t.values);
    return v;
  }
  GmArena arena;
  DeviceMemory& gm = test_sim().gm();
  std::vector<uint64_t> in_addr, out_addr;
  for (const HostTensor& t : inputs) {
    std::vector<uint8_t> bytes = encode(t);
    uint64_t a = arena.alloc(bytes.size());
    if (!bytes.empty()) gm.write(a, bytes.data(), bytes.size());
    in_addr.push_back(a);
  }
  for (int i : alias) out_addr.push_back(in_addr[static_cast<size_t>(i)]);
  const uint64_t ws = k.workspace_bytes ? arena.alloc(k.workspace_bytes) : 0;
  for (const compiler::Launch& l : k.launches) {
    KernelLaunch kl;
    kl.program = &l.kernel.program;
    kl.args = l.bind(in_addr, out_addr, ws);
    kl.block_dim = l.block_dim;
    KernelResult kr = test_sim().run(kl);
    INFO(kr.error);
    REQUIRE(kr.ok);
  }
  std::vector<std::vector<double>> v;
  for (size_t o = 0; o < k.outputs.size(); ++o) {
    std::vector<uint8_t> bytes(k.outputs[o].bytes());
    if (!bytes.empty()) gm.read(out_addr[o], bytes.data(), bytes.size());
    v.push_back(decode(k.outputs[o].dtype, bytes));
  }
  return v;
}

// Compiles op over inputs, runs it (separate outputs, then in place) and compares both with
// the reference outputs `want`.
void check(const std::string& type, const std::vector<HostTensor>& inputs,
           const std::vector<int>& alias, const std::vector<std::vector<double>>& want,
           bool nesterov) {
  INFO(type << " " << inputs[0].desc.str() << (nesterov ? " nesterov" : ""));
  std::vector<TensorDesc> descs;
  for (const HostTensor& t : inputs) descs.push_back(t.desc);
  compiler::OpDesc op = make_op(type, descs);
  if (type != "ResourceApplyGradientDescent") op.attrs["use_nesterov"] = nesterov;
  auto k = compiler::compile(op, test_sim().config());
  REQUIRE(k.outputs.size() == want.size());
  for (const TensorDesc& o : k.outputs) CHECK(o == inputs[0].desc);
  if (inputs[0].desc.num_elements() == 0) CHECK(k.launches.empty());
  for (bool in_place : {false, true}) {
    INFO((in_place ? "in place" : "separate outputs"));
    auto got = run(k, inputs, alias, in_place);
    for (size_t o = 0; o < want.size(); ++o) check_close(got[o], want[o], 0, 0, "output");
  }
}

const std::vector<std::vector<int64_t>> kShapes = {{37}, {3, 50}, {1}, {}, {0}, {2100}};
const DataType kTypes[] = {DataType::F32, DataType::F16, DataType::BF16};

}  // namespace

TEST_CASE("ResourceApplyGradientDescent: var - delta * alpha") {
  uint32_t seed = 1;
  for (DataType dt : kTypes)
    for (const auto& shape : kShapes) {
      const Arith A{dt};
      HostTensor var = random_tensor(dt, shape, -2, 2, seed++);
      HostTensor delta = random_tensor(dt, shape, -1, 1, seed++);
      HostTensor alpha = scalar(dt, 0.0123);
      std::vector<double> want;
      for (size_t i = 0; i < var.values.size(); ++i)
        want.push_back(A.sub(var.values[i], A.mul(delta.values[i], alpha.values[0])));
      check("ResourceApplyGradientDescent", {var, alpha, delta}, {0}, {want}, false);
    }
}

TEST_CASE("ResourceApplyMomentum, plain and Nesterov") {
  uint32_t seed = 100;
  for (DataType dt : kTypes)
    for (const auto& shape : kShapes)
      for (bool nesterov : {false, true}) {
        const Arith A{dt};
        HostTensor var = random_tensor(dt, shape, -2, 2, seed++);
        HostTensor accum = random_tensor(dt, shape, -0.5, 0.5, seed++);
        HostTensor grad = random_tensor(dt, shape, -1, 1, seed++);
        HostTensor lr = scalar(dt, 0.01), mom = scalar(dt, 0.9);
        std::vector<double> want_var, want_accum;
        for (size_t i = 0; i < var.values.size(); ++i) {
          const double l = lr.values[0], m = mom.values[0], g = grad.values[i];
          const double acc = A.add(A.mul(accum.values[i], m), g);
          want_accum.push_back(acc);
          want_var.push_back(nesterov
                                 ? A.sub(var.values[i], A.add(A.mul(g, l), A.mul(A.mul(acc, m), l)))
                                 : A.sub(var.values[i], A.mul(l, acc)));
        }
        check("ResourceApplyMomentum", {var, accum, lr, grad, mom}, {0, 1},
              {want_var, want_accum}, nesterov);
      }
}

TEST_CASE("ResourceApplyAdam, plain and Nesterov") {
  uint32_t seed = 200;
  for (DataType dt : kTypes)
    for (const auto& shape : kShapes)
      for (bool nesterov : {false, true}) {
        const Arith A{dt};
        HostTensor var = random_tensor(dt, shape, -2, 2, seed++);
        HostTensor m = random_tensor(dt, shape, -0.1, 0.1, seed++);
        HostTensor v = random_tensor(dt, shape, 0, 0.01, seed++);
        HostTensor grad = random_tensor(dt, shape, -1, 1, seed++);
        // Step 3 of Keras' defaults.
        HostTensor b1p = scalar(dt, 0.9 * 0.9 * 0.9), b2p = scalar(dt, 0.999 * 0.999 * 0.999);
        HostTensor lr = scalar(dt, 0.001), b1 = scalar(dt, 0.9), b2 = scalar(dt, 0.999),
                   eps = scalar(dt, 1e-7);
        const double B1 = b1.values[0], B2 = b2.values[0], E = eps.values[0];
        const double alpha = A.div(A.mul(lr.values[0], A.sqrt(A.sub(1, b2p.values[0]))),
                                   A.sub(1, b1p.values[0]));
        std::vector<double> want_var, want_m, want_v;
        for (size_t i = 0; i < var.values.size(); ++i) {
          const double g = grad.values[i];
          const double mi = A.add(m.values[i], A.mul(A.sub(g, m.values[i]), A.sub(1, B1)));
          const double vi =
              A.add(v.values[i], A.mul(A.sub(A.mul(g, g), v.values[i]), A.sub(1, B2)));
          const double num = nesterov ? A.mul(A.add(A.mul(g, A.sub(1, B1)), A.mul(B1, mi)), alpha)
                                      : A.mul(mi, alpha);
          want_var.push_back(A.sub(var.values[i], A.div(num, A.add(A.sqrt(vi), E))));
          want_m.push_back(mi);
          want_v.push_back(vi);
        }
        check("ResourceApplyAdam", {var, m, v, b1p, b2p, lr, b1, b2, eps, grad}, {0, 1, 2},
              {want_var, want_m, want_v}, nesterov);
      }
}

TEST_CASE("optimizer errors name the operand") {
  const ChipConfig& cfg = test_sim().config();
  const TensorDesc v{DataType::F32, {4}}, s{DataType::F32, {}};
  CHECK_THROWS_WITH(compiler::compile(make_op("ResourceApplyGradientDescent",
                                              {v, TensorDesc{DataType::F32, {2}}, v}),
                                      cfg),
                    Catch::Contains("alpha [2] must be a scalar"));
  CHECK_THROWS_WITH(compiler::compile(make_op("ResourceApplyMomentum",
                                              {v, v, s, TensorDesc{DataType::F32, {5}}, s}),
                                      cfg),
                    Catch::Contains("grad") && Catch::Contains("var's shape"));
  CHECK_THROWS_WITH(compiler::compile(make_op("ResourceApplyAdam", {v, v, v}), cfg),
                    Catch::Contains("takes 10 inputs"));
  CHECK_THROWS_WITH(compiler::compile(make_op("ResourceApplyGradientDescent",
                                              {TensorDesc{DataType::S32, {4}},
                                               TensorDesc{DataType::S32, {}},
                                               TensorDesc{DataType::S32, {4}}}),
                                      cfg),
                    Catch::Contains("dtype s32 is not supported"));
}
