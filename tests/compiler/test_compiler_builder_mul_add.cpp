// KernelBuilder::mul_add(d, a, m, b) = a * m + b for every aliasing of d with a, m and b, run on
// the test chip against the same arithmetic in C++. (Before the fix, d == b computed
// a * m + a * m: the product overwrote the addend.)
#include <catch2/catch.hpp>

#include "adapter/compiler/kernel_builder.h"
#include "isa/isa.h"
#include "sim/config/chip_config.h"
#include "sim/simulator.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::compiler;
using isa::Opcode;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config(npusim::test::test_chip_name()), SimOptions{});
  return s;
}

}  // namespace

TEST_CASE("mul_add is a * m + b when the destination is also an operand") {
  // Inputs a = 7, m = 5, b = 100 in registers; five results stored to out[0..4].
  const int64_t av = 7, mv = 5, bv = 100;
  KernelBuilder kb("mul_add", "MulAddTest", sim().config());
  kb.declare_arg("out");
  kb.begin_section(kb.vector_core_kind());
  Reg out = kb.load_arg("out");
  Reg d = kb.reg("d"), m = kb.reg_imm("m", mv), b = kb.reg_imm("b", bv);
  auto store = [&](const Reg& v) {
    kb.emit(Opcode::op_st, {v, out});
    kb.add(out, out, 8);
  };
  kb.movi(d, bv);
  kb.mul_add(d, m, av, d, "d == b (register addend)");
  store(d);
  kb.movi(d, av);
  kb.mul_add(d, d, mv, bv, "d == a");
  store(d);
  kb.movi(d, mv);
  kb.mul_add(d, m, d, b, "d == m");  // m * m + b
  store(d);
  kb.movi(d, av);
  kb.mul_add(d, d, m, d, "d == a == b");  // a * m + a
  store(d);
  kb.movi(d, 0);
  kb.mul_add(d, m, av, b, "no aliasing");
  store(d);
  kb.end();
  BuiltKernel k = kb.finish();
  const std::vector<int64_t> v = npusim::test::run_scalar_words(sim(), k.program, 5);
  CHECK(v[0] == mv * av + bv);
  CHECK(v[1] == av * mv + bv);
  CHECK(v[2] == mv * mv + bv);
  CHECK(v[3] == av * mv + av);
  CHECK(v[4] == mv * av + bv);
}
