// KernelBuilder: operand encoding (register or immediate by field width), registers, labels and
// loops, flags, buffer allocation, the listing, the verifier gate; a built kernel runs on the
// tiny chip.
#include <catch2/catch.hpp>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/kernel_builder.h"
#include "isa/disassembler.h"
#include "isa/assembler.h"
#include "isa/isa.h"
#include "sim/config/chip_config.h"
#include "sim/simulator.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::compiler;
using isa::Opcode;
using isa::Pipe;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny"), SimOptions{});
  return s;
}

}  // namespace

TEST_CASE("immediates are encoded when they fit the field, else loaded into a register") {
  const ChipConfig& cfg = sim().config();
  KernelBuilder b("imm", "TestOp", cfg);
  b.begin_section(isa::CoreKind::AIV);
  Reg x = b.reg("x");
  b.movi(x, 5);
  b.add(x, x, 4000000000);  // fits RU32 (< 2^32)
  b.add(x, x, -1);          // negative: not an unsigned immediate -> movi + register
  b.emit(Opcode::op_copy_gm2ub, {0, x, 1, 70000, 0, 0});  // burst_len is RU16: needs a register
  b.end();
  BuiltKernel k = b.finish();
  const auto& code = k.program.sections[0].code;
  REQUIRE(code.size() == 7);  // movi, add, movi(-1), add, movi(70000), copy, end
  CHECK_FALSE(code[1].ops[2].is_reg);
  CHECK(code[1].ops[2].value == 4000000000);
  CHECK(code[2].op == Opcode::op_movi);
  CHECK(code[2].ops[1].value == -1);
  CHECK(code[3].ops[2].is_reg);
  CHECK(code[3].ops[2].value == code[2].ops[0].value);
  CHECK(code[4].op == Opcode::op_movi);
  CHECK(code[4].ops[1].value == 70000);
  CHECK(code[5].ops[0].value == 0);  // xdst given as immediate 0: the zero register x0
  CHECK(code[5].ops[3].is_reg);
  CHECK_FALSE(code[5].ops[2].is_reg);  // nburst 1 fits
}

TEST_CASE("U fields must fit, operand kinds must match") {
  const ChipConfig& cfg = sim().config();
  KernelBuilder b("bad", "TestOp", cfg);
  b.begin_section(isa::CoreKind::AIV);
  CHECK_THROWS_WITH(b.emit(Opcode::op_set_flag, {Pipe::V, Pipe::MTE3, 16}),
                    Catch::Contains("TestOp") && Catch::Contains("set_flag operand id = 16"));
  CHECK_THROWS_WITH(b.emit(Opcode::op_add, {Pipe::V, 1, 2}),
                    Catch::Contains("add operand xd: expected a register"));
  CHECK_THROWS_WITH(b.emit(Opcode::op_end, {1}), Catch::Contains("end takes 0 operands"));
  // x0 must stay 0: an immediate cannot stand for a written register.
  CHECK_THROWS_WITH(b.emit(Opcode::op_movi, {0, 5}), Catch::Contains("it is written"));
}

TEST_CASE("running out of registers names the op and what each register holds") {
  const ChipConfig& cfg = sim().config();
  KernelBuilder b("regs", "BigOp", cfg);
  b.begin_section(isa::CoreKind::AIV);
  std::vector<Reg> held;
  for (int i = 0; i < isa::kNumRegs - 1; ++i) held.push_back(b.reg("value " + std::to_string(i)));
  CHECK(b.free_regs() == 0);
  CHECK_THROWS_WITH(b.reg("one too many"),
                    Catch::Contains("BigOp") && Catch::Contains("one too many") &&
                        Catch::Contains("x31: value 30"));
  held.pop_back();  // a scoped register returns to the pool
  CHECK(b.free_regs() == 1);
  Reg again = b.reg("reused");
  CHECK(again.id() == 31);
}

TEST_CASE("kernel arguments stop at ldarg's index range, with an error naming the op") {
  const ChipConfig& cfg = sim().config();
  KernelBuilder b("args", "WideOp", cfg);
  b.begin_section(isa::CoreKind::AIV);
  // ldarg's index field is U8 (isa.def): indices 0..255.
  REQUIRE(KernelBuilder::max_args() == 256);
  for (int i = 0; i < KernelBuilder::max_args(); ++i)
    CHECK(b.declare_arg("a" + std::to_string(i)) == i);
  CHECK_THROWS_WITH(b.declare_arg("a256"), Catch::Contains("WideOp") &&
                                               Catch::Contains("'a256'") &&
                                               Catch::Contains("at most 256"));
  Reg last = b.load_arg("a255");  // the last index still encodes
  (void)last;
}

TEST_CASE("buffers: alignment from the config, and an error when a tile does not fit") {
  const ChipConfig& cfg = sim().config();
  KernelBuilder b("bufs", "TileOp", cfg);
  b.begin_section(isa::CoreKind::AIC);
  CHECK(b.alloc(isa::Buf::L0A, 100, "a") == 0);
  CHECK(b.alloc(isa::Buf::L0A, 100, "b") == 512);  // L0A alignment is 512 bytes (910b.yaml)
  CHECK(b.alloc(isa::Buf::L1, 40, "c") == 0);
  CHECK(b.alloc(isa::Buf::L1, 40, "d") == 64);  // 32-byte alignment
  CHECK_THROWS_WITH(b.alloc(isa::Buf::L0B, 64 * 1024 + 1, "huge B tile"),
                    Catch::Contains("TileOp") && Catch::Contains("huge B tile") &&
                        Catch::Contains("does not fit in l0b"));
  CHECK_THROWS_WITH(b.alloc(isa::Buf::UB, 32, "x"), Catch::Contains("aic cores"));
}

TEST_CASE("flag ids per pipe pair run out at the config's flag_ids") {
  const ChipConfig& cfg = sim().config();
  KernelBuilder b("flags", "FlagOp", cfg);
  b.begin_section(isa::CoreKind::AIV);
  for (int i = 0; i < cfg.flag_ids; ++i) CHECK(b.flag(Pipe::V, Pipe::MTE3, "f") == i);
  CHECK(b.flag(Pipe::MTE3, Pipe::V, "other pair") == 0);
  CHECK_THROWS_WITH(b.flag(Pipe::V, Pipe::MTE3, "ninth"), Catch::Contains("out of flag ids"));
}

TEST_CASE("every built kernel passes the verifier, or finish() fails naming the op") {
  const ChipConfig& cfg = sim().config();
  KernelBuilder b("unpaired", "FlagOp", cfg);
  b.begin_section(isa::CoreKind::AIV);
  b.set_flag(Pipe::V, Pipe::MTE3, 0, "a set without a wait");
  b.end();
  CHECK_THROWS_WITH(b.finish(), Catch::Contains("FlagOp") &&
                                    Catch::Contains("fails the verifier") &&
                                    Catch::Contains("set_flag v, mte3, 0"));
  KernelBuilder c("no_end", "Op", cfg);
  c.begin_section(isa::CoreKind::AIV);
  Reg x = c.reg_imm("x", 1);  // the section's last instruction is a movi
  CHECK_THROWS_WITH(c.finish(), Catch::Contains("does not end"));
}

TEST_CASE("loops, branches and parity arms run on the chip; the listing re-assembles") {
  // out[0] = sum of i for i in [0, 10) taken only for even i, + 100 * (number of odd i);
  // out[1] = the parity arm taken for 7 (0 -> 11, 1 -> 22).
  const ChipConfig& cfg = sim().config();
  KernelBuilder b("loops", "LoopOp", cfg);
  b.declare_arg("out");
  b.begin_section(isa::CoreKind::AIV);
  Reg out = b.load_arg("out");
  Reg sum = b.reg_imm("sum", 0);
  Reg i = b.reg("i");
  Reg p = b.reg("parity");
  {
    KernelBuilder::Origin o(b, "the loop");
    b.for_range(i, 0, 10, 1, [&] {
      b.and_(p, i, 1);
      b.by_parity(p, [&](int q) {
        if (q == 0) b.add(sum, sum, i);
        else b.add(sum, sum, 100);
      });
    });
  }
  b.emit(Opcode::op_st, {sum, out}, "store the sum");
  b.movi(i, 7);
  b.and_(p, i, 1);
  b.by_parity(p, [&](int q) { b.movi(sum, q == 0 ? 11 : 22); });
  b.add(out, out, 8);
  b.if_(ne(sum, 0), [&] { b.emit(Opcode::op_st, {sum, out}); });
  b.end();
  BuiltKernel k = b.finish();
  CHECK(k.listing.find("; the loop") != std::string::npos);
  CHECK(k.listing.find("; store the sum") != std::string::npos);
  // The listing is assembly text for the same program (comments aside).
  isa::Program again = isa::assemble(k.listing, "loops.s");
  REQUIRE(again.sections.size() == 1);
  REQUIRE(again.sections[0].code.size() == k.program.sections[0].code.size());
  for (size_t n = 0; n < again.sections[0].code.size(); ++n) {
    INFO("instruction " << n);
    CHECK(isa::encode(again.sections[0].code[n]) == isa::encode(k.program.sections[0].code[n]));
    CHECK(again.sections[0].code[n].src_line == k.program.sections[0].code[n].src_line);
  }
  const std::vector<int64_t> v = npusim::test::run_scalar_words(sim(), k.program, 2);
  CHECK(v[0] == (0 + 2 + 4 + 6 + 8) + 100 * 5);
  CHECK(v[1] == 22);
}

TEST_CASE("scalar identities fold to a move, a movi or nothing; the values are the same") {
  // a = 37: a + 0, a - 0, a * 1, a / 1, a << 0, a >> 0 into a itself emit nothing; into
  // another register a mov; a * 0 and a % 1 a movi 0; a * 3, a % 5 stay as they are.
  const ChipConfig& cfg = sim().config();
  KernelBuilder b("fold", "FoldOp", cfg);
  b.declare_arg("out");
  b.begin_section(isa::CoreKind::AIV);
  Reg out = b.load_arg("out");  // ldarg
  Reg a = b.reg_imm("a", 37);   // movi
  Reg d = b.reg("d");
  const size_t before = 2;
  b.add(a, a, 0);
  b.sub(a, a, 0);
  b.mul(a, a, 1);
  b.div(a, a, 1);
  b.shl(a, a, 0);
  b.shr(a, a, 0);
  b.div(d, a, 1);                   // mov d, a
  b.emit(Opcode::op_st, {d, out});  // 37
  b.mul(d, a, 0);                   // movi d, 0
  b.add(out, out, 8);
  b.emit(Opcode::op_st, {d, out});  // 0
  b.rem(d, a, 1);                   // movi d, 0
  b.add(d, d, 5);
  b.add(out, out, 8);
  b.emit(Opcode::op_st, {d, out});  // 5
  b.mul(d, a, 3);                   // 111
  b.rem(d, d, 5);                   // 1
  b.add(out, out, 8);
  b.emit(Opcode::op_st, {d, out});
  b.end();
  BuiltKernel k = b.finish();
  const auto& code = k.program.sections[0].code;
  // mov, st, movi, add, st, movi, add, add, st, mul, rem, add, st, end
  REQUIRE(code.size() == before + 14);
  CHECK(code[before].op == Opcode::op_mov);
  CHECK(code[before + 2].op == Opcode::op_movi);
  CHECK(code[before + 5].op == Opcode::op_movi);
  CHECK(code[before + 9].op == Opcode::op_mul);
  CHECK(code[before + 10].op == Opcode::op_rem);
  const std::vector<int64_t> v = npusim::test::run_scalar_words(sim(), k.program, 4);
  CHECK(v[0] == 37);
  CHECK(v[1] == 0);
  CHECK(v[2] == 5);
  CHECK(v[3] == 1);
}

TEST_CASE("a compiled kernel's listing re-assembles to the same program, typed arguments included") {
  OpDesc op;
  op.type = "AddV2";
  op.inputs = {{DataType::F16, {6, 33}}, {DataType::F16, {6, 1}}};
  CompiledKernel k = compile(op, sim().config());
  REQUIRE(k.launches.size() == 1);
  const BuiltKernel& built = k.launches[0].kernel;
  isa::Program again = isa::assemble(built.listing, built.program.source);
  CHECK(again.arg_names == built.program.arg_names);
  REQUIRE(again.args.size() == 3);
  CHECK(again.args[0] == built.program.args[0]);
  CHECK(isa::arg_type_text(again.args[2]) == "f16[6, 33]");
  REQUIRE(again.sections.size() == built.program.sections.size());
  const auto& a = again.sections[0].code;
  const auto& b = built.program.sections[0].code;
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(isa::encode(a[i]) == isa::encode(b[i]));
}
