// The assembler: text in, decoded fields checked by name against values written in the test.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/error.h"
#include "isa/assembler.h"
#include "isa/disassembler.h"

using namespace npusim;
using namespace npusim::isa;

namespace {

// Operand `name` of instruction `in` (looked up in the table, so tests read like the syntax).
const Operand& op(const Instruction& in, const char* name) {
  int i = field_index(in.op, name);
  REQUIRE(i >= 0);
  return in.ops[i];
}
int64_t imm(const Instruction& in, const char* name) {
  CHECK_FALSE(op(in, name).is_reg);
  return op(in, name).value;
}
int64_t reg(const Instruction& in, const char* name) {
  CHECK(op(in, name).is_reg);
  return op(in, name).value;
}

// The error message of assembling `text` as "t.s" (empty if it assembled).
std::string error_of(const std::string& text) {
  try {
    assemble(text, "t.s");
  } catch (const IsaError& e) {
    return e.what();
  }
  return "";
}

uint32_t f32_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

}  // namespace

TEST_CASE("assembler: directives, labels, suffixes and operands") {
  const char* text = R"(
; a vector kernel
.kernel vadd_kernel
.arg x_ptr          // argument 0
.arg y_ptr
.equ TILE, 4 * 256
.section aiv
    ldarg x1, y_ptr
    movi x2, TILE
loop:
    vadd.f16 x3, x4, x5, 8, 1, 1, 1, 8, 8, 8
    vconv.f32.f16 x3, x4, x2, 1, 1, 8, 4, 3
    vcmp.f16.lt x6, x4, x5, 2, 1, 1, 8, 8
    sub x2, x2, 1
    bne x2, 0, loop
    jmp done
done: end
)";
  Program p = assemble(text, "dir/k.s");
  CHECK(p.name == "vadd_kernel");
  CHECK(p.source == "dir/k.s");
  REQUIRE(p.arg_names == std::vector<std::string>{"x_ptr", "y_ptr"});
  REQUIRE(p.sections.size() == 1);
  const Section& s = p.sections[0];
  CHECK(s.kind == CoreKind::AIV);
  REQUIRE(s.code.size() == 9);
  CHECK(s.labels == std::map<std::string, uint32_t>{{"loop", 2}, {"done", 8}});

  CHECK(s.code[0].op == Opcode::op_ldarg);
  CHECK(reg(s.code[0], "xd") == 1);
  CHECK(imm(s.code[0], "index") == 1);  // y_ptr is the second .arg
  CHECK(s.code[0].src_line == 8);  // the raw string starts with a newline: line 1 is empty
  CHECK(s.code[0].src_col == 5);

  CHECK(imm(s.code[1], "imm") == 1024);

  const Instruction& vadd = s.code[2];
  CHECK(vadd.op == Opcode::op_vadd);
  CHECK(imm(vadd, "type") == int64_t(Dtype::F16));
  CHECK(reg(vadd, "xdst") == 3);
  CHECK(reg(vadd, "xsrc0") == 4);
  CHECK(reg(vadd, "xsrc1") == 5);
  CHECK(imm(vadd, "repeat") == 8);
  CHECK(imm(vadd, "src1_blk") == 1);
  CHECK(imm(vadd, "dst_rep") == 8);
  CHECK(vadd.src_line == 11);

  const Instruction& vconv = s.code[3];
  CHECK(imm(vconv, "dst_type") == int64_t(Dtype::F32));
  CHECK(imm(vconv, "src_type") == int64_t(Dtype::F16));
  CHECK(reg(vconv, "repeat") == 2);  // RU8 given a register
  CHECK(imm(vconv, "src_rep") == 4);
  CHECK(imm(vconv, "round") == 3);

  CHECK(imm(s.code[4], "cmp") == int64_t(Cmp::LT));
  CHECK(imm(s.code[4], "type") == int64_t(Dtype::F16));

  CHECK(imm(s.code[6], "target") == 2);  // backward reference
  CHECK(imm(s.code[7], "target") == 8);  // forward reference
  CHECK(s.code[8].op == Opcode::op_end);
  CHECK(s.code[8].src_line == 17);
  CHECK(s.code[8].src_col == 7);

  // The assembled form survives the binary encoding.
  for (const Instruction& in : s.code) {
    Instruction d = decode(encode(in));
    CHECK(d.op == in.op);
    for (int i = 0; i < kMaxFields; ++i) {
      CHECK(d.ops[i].value == in.ops[i].value);
      CHECK(d.ops[i].is_reg == in.ops[i].is_reg);
    }
  }
}

TEST_CASE("assembler: pipes, buffers and multi-suffix instructions") {
  Program p = assemble(R"(
set_flag mte2, v, 3
wait_flag mte2, v, 3
pipe_barrier all
load2d.f16 l0b, x1, x2, 4, 2, 1
fixpipe.f32.f16 ub, x1, x2, 16, 32, 32, 1, 0, x3
mmad.s8 x1, x2, x3, 16, 32, 16, 2, x4
nd2nz.bf16 x1, x2, 15, 17, 17, 16
cc_set fix, 2, 10
end
)", "t.s");
  REQUIRE(p.sections.size() == 1);
  CHECK(p.sections[0].kind == CoreKind::AICORE);  // no .section: the coupled AI cores
  CHECK(p.name == "t");                           // no .kernel: the file stem
  const auto& c = p.sections[0].code;
  REQUIRE(c.size() == 9);
  CHECK(imm(c[0], "src") == int64_t(Pipe::MTE2));
  CHECK(imm(c[0], "dst") == int64_t(Pipe::V));
  CHECK(imm(c[0], "id") == 3);
  CHECK(c[0].exec_pipe() == Pipe::MTE2);
  CHECK(c[1].exec_pipe() == Pipe::V);
  CHECK(imm(c[2], "pipe") == int64_t(Pipe::ALL));
  CHECK(imm(c[3], "type") == int64_t(Dtype::F16));
  CHECK(imm(c[3], "dst") == int64_t(Buf::L0B));
  CHECK(imm(c[3], "transpose") == 1);
  CHECK(imm(c[4], "src_type") == int64_t(Dtype::F32));
  CHECK(imm(c[4], "dst_type") == int64_t(Dtype::F16));
  CHECK(imm(c[4], "dst") == int64_t(Buf::UB));
  CHECK(imm(c[4], "nz2nd") == 1);
  CHECK(reg(c[4], "xscale") == 3);
  CHECK(imm(c[5], "type") == int64_t(Dtype::S8));
  CHECK(imm(c[5], "init") == 2);
  CHECK(imm(c[6], "type") == int64_t(Dtype::BF16));
  CHECK(imm(c[6], "dst_rows") == 16);
  CHECK(imm(c[7], "pipe") == int64_t(Pipe::FIX));
  CHECK(imm(c[7], "mode") == 2);
}

TEST_CASE("assembler: the L2 policy is an optional last suffix, normal when left out") {
  Program p = assemble(R"(
copy_gm2ub x1, x2, 1, 4, 0, 0
copy_gm2ub.noalloc x1, x2, 1, 4, 0, 0
copy_gm2l1.bypass x1, x2, 1, 4, 0, 0
copy_ub2gm.normal x1, x2, 1, 4, 0, 0
nd2nz.f16.noalloc x1, x2, 15, 17, 17, 16
fixpipe.f32.f16.bypass gm, x1, x2, 16, 32, 32, 1, 0, x3
fixpipe.f32.f16 gm, x1, x2, 16, 32, 32, 1, 0, x3
end
)", "t.s");
  const auto& c = p.sections.at(0).code;
  REQUIRE(c.size() == 8);
  const int64_t want[] = {int64_t(L2Hint::NORMAL), int64_t(L2Hint::NOALLOC),
                          int64_t(L2Hint::BYPASS), int64_t(L2Hint::NORMAL),
                          int64_t(L2Hint::NOALLOC), int64_t(L2Hint::BYPASS),
                          int64_t(L2Hint::NORMAL)};
  for (size_t i = 0; i < 7; ++i) {
    INFO(i);
    CHECK(imm(c[i], "l2") == want[i]);
  }
  CHECK(imm(c[4], "type") == int64_t(Dtype::F16));
  CHECK(imm(c[5], "dst_type") == int64_t(Dtype::F16));
  // The dtype suffixes stay required; a policy where a dtype belongs is not one.
  CHECK_THROWS_WITH(assemble("nd2nz.noalloc x1, x2, 1, 1, 1, 16", "t.s"),
                    Catch::Contains("t.s:1:7: bad suffix '.noalloc' for type of nd2nz"));
  CHECK_THROWS_WITH(assemble("copy_gm2ub.keep x1, x2, 1, 4, 0, 0", "t.s"),
                    Catch::Contains("t.s:1:12: bad suffix '.keep' for l2 of copy_gm2ub: expected "
                                    "an L2 policy (normal, noalloc, bypass)"));
  CHECK_THROWS_WITH(assemble("copy_gm2ub.noalloc.bypass x1, x2, 1, 4, 0, 0", "t.s"),
                    Catch::Contains("copy_gm2ub takes 0 to 1 suffix ([.l2]), got 2"));
  CHECK_THROWS_WITH(assemble("fixpipe.f32 gm, x1, x2, 16, 32, 32, 1, 0, x3", "t.s"),
                    Catch::Contains("fixpipe takes 2 to 4 suffixes "
                                    "(.src_type.dst_type[.l2][.unit_flag]), got 1"));
  CHECK_THROWS_WITH(assemble("copy_l12ub.noalloc x1, x2, 1, 4, 0, 0", "t.s"),
                    Catch::Contains("copy_l12ub takes no suffix"));
}

TEST_CASE("assembler: the unit flag is an optional suffix of mmad and fixpipe, off when left out") {
  Program p = assemble(R"(
mmad.f16 x1, x2, x3, 16, 32, 16, 0, x0
mmad.f16.uf2 x1, x2, x3, 16, 32, 16, 0, x0
mmad.f16.uf3 x1, x2, x3, 16, 32, 16, 1, x0
fixpipe.f32.f16.uf3 gm, x4, x1, 16, 16, 16, 1, 0, x0
fixpipe.f32.f16.noalloc.uf3 gm, x4, x1, 16, 16, 16, 1, 0, x0
fixpipe.f32.f16.bypass gm, x4, x1, 16, 16, 16, 1, 0, x0
end
)", "t.s");
  const auto& c = p.sections.at(0).code;
  const int64_t uf[] = {0, 2, 3, 3, 3, 0};
  const int64_t l2[] = {0, 0, 0, int64_t(L2Hint::NORMAL), int64_t(L2Hint::NOALLOC),
                        int64_t(L2Hint::BYPASS)};
  for (size_t i = 0; i < 6; ++i) {
    INFO(i);
    CHECK(imm(c[i], "unit_flag") == uf[i]);
    if (i >= 3) CHECK(imm(c[i], "l2") == l2[i]);
    // Through the 128-bit encoding and the disassembler and back.
    const Instruction d = decode(encode(c[i]));
    CHECK(imm(d, "unit_flag") == uf[i]);
    const Program again = assemble(disassemble(c[i]) + "\nend\n", "again.s");
    CHECK(imm(again.sections.at(0).code.at(0), "unit_flag") == uf[i]);
  }
  CHECK(disassemble(c[2]) == "mmad.f16.uf3 x1, x2, x3, 16, 32, 16, 1, x0");
  CHECK(disassemble(c[4]) == "fixpipe.f32.f16.noalloc.uf3 gm, x4, x1, 16, 16, 16, 1, 0, x0");
  // A word written before the field existed (its bits zero) decodes with the flag off.
  EncodedWord old = encode(c[0]);
  CHECK(imm(decode(old), "unit_flag") == 0);
  CHECK_THROWS_WITH(assemble("mmad.f16.uf1 x1, x2, x3, 16, 32, 16, 0, x0", "t.s"),
                    Catch::Contains("t.s:1:10: bad suffix '.uf1' for unit_flag of mmad: expected "
                                    "a unit flag (uf2, uf3)"));
  CHECK_THROWS_WITH(assemble("fixpipe.f32.f16.uf3.noalloc gm, x4, x1, 16, 16, 16, 1, 0, x0", "t.s"),
                    Catch::Contains("fixpipe takes no further suffix, got '.noalloc'"));
  CHECK_THROWS_WITH(assemble("fixpipe.f32.f16.keep gm, x4, x1, 16, 16, 16, 1, 0, x0", "t.s"),
                    Catch::Contains("bad suffix '.keep' for l2 of fixpipe"));
  // Code 1 is no unit flag: a binary word carrying it is refused by the loaders' check.
  Instruction bad = c[1];
  bad.ops[static_cast<size_t>(field_index(bad.op, "unit_flag"))] = {false, 1};
  CHECK(illegal_operand(bad).value() ==
        "mmad operand unit_flag: unit flag code 1 is not a unit flag (0 off, 2, 3)");
}

TEST_CASE("assembler: immediate expressions") {
  Program p = assemble(R"(
.equ A, 6
.equ B, A * 7 - 2        ; 40
.equ NEG, -(B + 2)       ; -42
movi x1, B
movi x1, NEG
movi x1, 0x1F + 0b101
movi x1, (1 << 10) | 3
movi x1, 0xFF & ~0xF
movi x1, 17 / 5 + 17 % 5
movi x1, 2 + 3 * 4 - (2 + 3) * 4
movi x1, 1 << 12 >> 4
movi x1, -8 >> 1
movi x1, 0xffffffffffffffff
movi x1, 5 ^ 3
movi x1, 1_000_000
add x2, x2, A * 1000
)", "t.s");
  const auto& c = p.sections[0].code;
  REQUIRE(c.size() == 13);
  int64_t expect[] = {40,
                      -42,
                      0x1F + 5,
                      (1 << 10) | 3,
                      0xFF & ~0xF,
                      17 / 5 + 17 % 5,
                      2 + 3 * 4 - (2 + 3) * 4,
                      (1 << 12) >> 4,
                      -4,  // arithmetic shift
                      -1,
                      5 ^ 3,
                      1000000};
  for (size_t i = 0; i < 12; ++i) {
    INFO("movi #" << i);
    CHECK(imm(c[i], "imm") == expect[i]);
  }
  CHECK(imm(c[12], "b") == 6000);
}

TEST_CASE("assembler: float literals give IEEE bit patterns") {
  Program p = assemble(R"(
movi x1, f32(1.5)
movi x1, f32(-0.1)
movi x1, f16(1.5)
movi x1, f16(-0.1)
movi x1, f16(65504)
movi x1, bf16(3.14159)
movi x1, bf16(-2.5e-3)
movi x1, f32(1e38) + 0
)", "t.s");
  const auto& c = p.sections[0].code;
  CHECK(imm(c[0], "imm") == f32_bits(1.5f));
  CHECK(imm(c[1], "imm") == f32_bits(-0.1f));
  auto h = [](float v) {
    _Float16 x = static_cast<_Float16>(v);
    uint16_t b;
    std::memcpy(&b, &x, 2);
    return int64_t(b);
  };
  CHECK(imm(c[2], "imm") == h(1.5f));
  CHECK(imm(c[3], "imm") == h(-0.1f));
  CHECK(imm(c[4], "imm") == 0x7BFF);  // largest finite half: 0 11110 1111111111
  // bf16: the top 16 bits of fp32, rounded to nearest even on the dropped 16 bits.
  auto bf = [](float v) {
    uint32_t b = f32_bits(v);
    uint32_t rounded = b + 0x7FFF + ((b >> 16) & 1);
    return int64_t(rounded >> 16);
  };
  CHECK(imm(c[5], "imm") == bf(3.14159f));
  CHECK(imm(c[6], "imm") == bf(-2.5e-3f));
  CHECK(imm(c[7], "imm") == f32_bits(1e38f));
}

TEST_CASE("assembler: sections and per-section label scopes") {
  Program p = assemble(R"(
.kernel mix
.section aic
top: nop
     jmp top
     end
.section aiv
     jmp top      // this section's own 'top'
     nop
top: end
)", "t.s");
  REQUIRE(p.sections.size() == 2);
  CHECK(p.sections[0].kind == CoreKind::AIC);
  CHECK(p.sections[1].kind == CoreKind::AIV);
  CHECK(p.sections[0].labels.at("top") == 0);
  CHECK(p.sections[1].labels.at("top") == 2);
  CHECK(imm(p.sections[0].code[1], "target") == 0);
  CHECK(imm(p.sections[1].code[0], "target") == 2);
  CHECK(p.find(CoreKind::AIV) == &p.sections[1]);
  CHECK(p.find(CoreKind::AICORE) == nullptr);

  // Labels may stand on their own line, several may share an instruction, and a label may
  // follow the last instruction; absolute @index targets are accepted too.
  Program q = assemble("a:\nb: c: nop\njmp @0\nend\nafter:\n", "t.s");
  CHECK(q.sections[0].labels ==
        std::map<std::string, uint32_t>{{"a", 0}, {"b", 0}, {"c", 0}, {"after", 3}});
  CHECK(imm(q.sections[0].code[1], "target") == 0);
}

TEST_CASE("assembler: errors name file, line, column and what") {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"nop\n  frob x1", "t.s:2:3: unknown mnemonic 'frob'"},
      {"add x1, x2", "t.s:1:1: add takes 3 operands (xd, xa, b), got 2"},
      {"nop x1", "t.s:1:1: nop takes 0 operands, got 1"},
      {"add x1, 5, 3", "t.s:1:9: add operand 2 (xa): expected a register x0..x31, got '5'"},
      {"mov x1, x32", "t.s:1:9: mov operand 2 (xs): no register 'x32' (x0..x31)"},
      {"ldarg x1, x2", "t.s:1:11: ldarg operand 2 (index): expected an immediate, got register"},
      {"vadd.f16 x1, x2, x3, 256, 1, 1, 1, 8, 8, 8",
       "t.s:1:22: vadd operand 4 (repeat): value 256 out of range 0..255"},
      {"set_flag mte2, v, 16", "t.s:1:19: set_flag operand 3 (id): value 16 out of range 0..15"},
      {"add x1, x1, -1", "t.s:1:13: add operand 3 (b): value -1 out of range 0..4294967295"},
      {"set_flag mte2, vec, 1",
       "t.s:1:16: set_flag operand 2 (dst): expected a pipe (s, mte1, mte2, mte3, m, v, fix, "
       "all), got 'vec'"},
      {"load2d.f16 l2, x1, x2, 1, 1, 0", "t.s:1:12: load2d operand 1 (dst): expected a buffer"},
      {"vadd x1, x2, x3, 1, 1, 1, 1, 8, 8, 8",
       "t.s:1:1: vadd takes 1 suffix (.type), got 0"},
      {"vadd.f16.f32 x1, x2, x3, 1, 1, 1, 1, 8, 8, 8",
       "t.s:1:9: vadd takes 1 suffix (.type), got 2"},
      {"add.s32 x1, x1, 1", "t.s:1:4: add takes no suffix"},
      {"vadd.f17 x1, x2, x3, 1, 1, 1, 1, 8, 8, 8",
       "t.s:1:6: bad suffix '.f17' for type of vadd: expected a data type"},
      {"vcmp.f16.lq x1, x2, x3, 1, 1, 1, 8, 8",
       "t.s:1:10: bad suffix '.lq' for cmp of vcmp: expected a comparison"},
      {"jmp nowhere\nend", "t.s:1:5: unknown label 'nowhere' in section aicore"},
      {"a: nop\n  a: end", "t.s:2:3: duplicate label 'a' (first defined at line 1)"},
      {".section aic\nl: nop\n.section aiv\njmp l\nend",
       "t.s:4:5: unknown label 'l' in section aiv"},
      {"movi x1, FOO", "t.s:1:10: unknown constant 'FOO'"},
      {"movi x1, 3 + BAR * 2", "t.s:1:14: unknown constant 'BAR'"},
      {"movi x1, 1 / (2 - 2)", "t.s:1:14: division by zero"},
      {"movi x1, 1.5", "t.s:1:10: bad number '1.5' (write float bit patterns as f32(1.5))"},
      {"movi x1, (1 + 2", "t.s:1:16: expected ')'"},
      {"movi x1, 1 +", "t.s:1:13: expected a value"},
      {"movi x1, 2 3", "t.s:1:12: unexpected '3' in expression"},
      {"movi x1, 1 << 64", "t.s:1:15: shift count 64 out of range 0..63"},
      {"movi x1, f32(abc)", "t.s:1:14: bad float literal 'abc' in f32()"},
      {"movi x1, 0x", "t.s:1:10: bad number '0x'"},
      {"movi x1, 99999999999999999999", "t.s:1:10: bad number '99999999999999999999' (does "
                                        "not fit 64 bits)"},
      {"add x1, x1, x2 + 1", "t.s:1:13: register 'x2' cannot be used in an expression"},
      {"movi x1, x2 + 1", "t.s:1:10: register 'x2' cannot be used in an expression"},
      {"ldarg x1, nothere", "t.s:1:11: ldarg operand 2 (index): unknown argument or constant"},
      {".equ A, 1\n.equ A, 2", "t.s:2:6: duplicate constant 'A'"},
      {".equ x3, 1", "t.s:1:6: name 'x3' is a register"},
      {".arg a\n.arg a", "t.s:2:6: duplicate argument 'a'"},
      {".arg a\n.arg a, f16", "t.s:2:6: duplicate argument 'a'"},
      {".arg , f16", "t.s:1:6: expected '.arg NAME' or '.arg NAME, DTYPE[DIMS]'"},
      {".arg x,", "t.s:1:8: argument 'x': expected a data type after ','"},
      {".arg x, f17", "t.s:1:9: argument 'x': unknown data type 'f17' (expected f32, f16"},
      {".arg x, f16 [4] 2", "t.s:1:18: argument 'x': expected ']' at the end of the shape"},
      {".arg x, f16[4", "t.s:1:14: argument 'x': expected ']' at the end of the shape"},
      {".arg x, [4]", "t.s:1:9: argument 'x': unknown data type ''"},
      {".arg x, f16[ ]", "t.s:1:13: argument 'x': empty shape (write '.arg x, f16' for a "
                         "tensor of any shape)"},
      {".arg x, f16[4,,4]", "t.s:1:15: argument 'x': bad dimension '' (missing dimension)"},
      {".arg x, f16[-1]", "t.s:1:13: argument 'x': bad dimension '-1' (expected an integer "
                          "literal or the name of an untyped argument)"},
      {".arg x, f16[2.5]", "t.s:1:13: argument 'x': bad dimension '2.5'"},
      {".arg x, f16[n + 1]", "t.s:1:13: argument 'x': bad dimension 'n + 1'"},
      {".arg x, f16[x1]", "t.s:1:13: argument 'x': bad dimension 'x1'"},
      {".arg x, f16[16x]", "t.s:1:13: bad number '16x'"},
      {".arg x, f16[9223372036854775808]",
       "t.s:1:13: argument 'x': bad dimension '9223372036854775808' (does not fit 63 bits)"},
      {".arg x, f16[4, q]\n.arg n", "t.s:1:16: argument 'x': dimension 'q' names no argument"},
      {".equ Q, 4\n.arg x, f16[Q]", "t.s:2:13: argument 'x': dimension 'Q' names no argument "
                                     "(a dimension cannot be an .equ constant)"},
      {".arg x, f16[y]\n.arg y, s8", "t.s:1:13: argument 'x': dimension 'y' names a tensor "
                                     "argument (a dimension names an untyped argument)"},
      {".arg x, f16[x]", "t.s:1:13: argument 'x': dimension 'x' names a tensor argument"},
      {".kernel a\n.kernel b", "t.s:2:1: duplicate .kernel directive"},
      {".section gpu", "t.s:1:10: unknown section 'gpu' (expected aic, aiv or aicore)"},
      {".section aic\nend\n.section aic", "t.s:3:10: section aic appears twice"},
      {"nop\n.section aicore", "t.s:2:10: section aicore appears twice (code before any "
                               ".section is already in aicore)"},
      {".frob 1", "t.s:1:1: unknown directive '.frob'"},
      {".equ A", "t.s:1:1: expected '.equ NAME, EXPR'"},
      {"add x1, , 1", "t.s:1:9: add operand 2 (xa): missing operand"},
      {"jmp @2000000", "t.s:1:5: jmp operand 1 (target): bad instruction index '@2000000'"},
      {"jmp 3", "t.s:1:5: jmp operand 1 (target): expected a label, got '3'"},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    CHECK_THAT(error_of(c.text), Catch::StartsWith(c.message));
  }
}

TEST_CASE("assembler: typed arguments") {
  const char* text = R"(
.arg x                          ; untyped: a scalar or a raw address
.arg t, bf16                    ; a tensor of any shape
.arg a, f16[ M , 0x10, 1_000 ]  ; dims: a later argument, literals in any base
.arg M
.arg y,s32[7]
.section aiv
    ldarg x1, a
    ldarg x2, M
    end
)";
  Program p = assemble(text, "t.s");
  REQUIRE(p.arg_names == std::vector<std::string>{"x", "t", "a", "M", "y"});
  REQUIRE(p.args.size() == 5);
  for (size_t i = 0; i < 5; ++i) CHECK(p.args[i].name == p.arg_names[i]);
  CHECK_FALSE(p.args[0].typed());
  CHECK(p.args[0].dims.empty());
  CHECK(p.args[1].dtype == Dtype::BF16);
  CHECK(p.args[1].dims.empty());
  CHECK(p.args[2].dtype == Dtype::F16);
  CHECK(p.args[2].dims == std::vector<std::string>{"M", "16", "1000"});  // literals in decimal
  CHECK_FALSE(p.args[3].typed());
  CHECK(p.args[4].dtype == Dtype::S32);
  CHECK(p.args[4].dims == std::vector<std::string>{"7"});
  // A typed argument is still an ldarg index.
  CHECK(imm(p.sections[0].code[0], "index") == 2);
  CHECK(imm(p.sections[0].code[1], "index") == 3);

  // Every ISA data type names an element type.
  for (int t = 0; t < int(Dtype::NONE); ++t) {
    Dtype d = static_cast<Dtype>(t);
    Program q = assemble(std::string(".arg v, ") + dtype_name(d) + "[3]\nend\n", "t.s");
    CHECK(q.arg(0).dtype == d);
  }

  // arg() reads a Program built in code with arg_names only as untyped arguments.
  Program bare;
  bare.arg_names = {"u"};
  CHECK(bare.arg(0).name == "u");
  CHECK_FALSE(bare.arg(0).typed());
}

TEST_CASE("assembler: argument count is bounded by ldarg's index field") {
  std::string text;
  for (int i = 0; i < 256; ++i) text += ".arg a" + std::to_string(i) + "\n";
  Program p = assemble(text + "ldarg x1, a255\n", "t.s");
  CHECK(p.sections[0].code[0].ops[1].value == 255);
  CHECK_THAT(error_of(text + ".arg one_more\n"),
             Catch::StartsWith("t.s:257:6: too many arguments (ldarg index is at most 255)"));
  CHECK_THAT(error_of(".kernel a b"), Catch::StartsWith("t.s:1:9: .kernel takes one name"));
}

TEST_CASE("assembler: comments, blank lines and CRLF line ends") {
  Program p = assemble("// header\r\n\r\n  nop ; trailing\r\n\tend // done\r\n", "t.s");
  REQUIRE(p.sections[0].code.size() == 2);
  CHECK(p.sections[0].code[0].src_line == 3);
  CHECK(p.sections[0].code[0].src_col == 3);
  CHECK(p.sections[0].code[1].src_line == 4);
  CHECK(p.sections[0].code[1].src_col == 2);  // a tab counts as one column
  CHECK(assemble("", "empty.s").sections.empty());
}

TEST_CASE("assembler: every instruction of the table assembles from its descriptor") {
  // Builds one line per opcode from the table (suffixes first, then one operand per field) and
  // checks the parsed operand values field by field.
  for (int i = 0; i < kNumOpcodes; ++i) {
    const InstrDesc& d = describe(static_cast<Opcode>(i));
    std::string line = d.mnemonic, operands;
    std::vector<Operand> expect(d.fields.size());
    for (size_t j = 0; j < d.fields.size(); ++j) {
      FieldKind k = d.fields[j].kind;
      std::string text;
      switch (k) {
        case FieldKind::Dt: line += ".bf16"; expect[j] = {false, int64_t(Dtype::BF16)}; continue;
        case FieldKind::Cmp: line += ".ge"; expect[j] = {false, int64_t(Cmp::GE)}; continue;
        case FieldKind::L2h:
          line += ".noalloc";
          expect[j] = {false, int64_t(L2Hint::NOALLOC)};
          continue;
        case FieldKind::Uf:
          line += ".uf3";
          expect[j] = {false, int64_t(UnitFlag::LAST)};
          continue;
        case FieldKind::Reg:
          text = "x" + std::to_string(j + 1);
          expect[j] = {true, int64_t(j + 1)};
          break;
        case FieldKind::Pipe: text = "fix"; expect[j] = {false, int64_t(Pipe::FIX)}; break;
        case FieldKind::Buf: text = "l0c"; expect[j] = {false, int64_t(Buf::L0C)}; break;
        case FieldKind::Label: text = "here"; expect[j] = {false, 0}; break;
        case FieldKind::I64: text = "-5"; expect[j] = {false, -5}; break;
        default:
          text = std::to_string(field_imm_max(k));
          expect[j] = {false, int64_t(field_imm_max(k))};
      }
      operands += (operands.empty() ? " " : ", ") + text;
    }
    INFO(line + operands);
    Program p = assemble("here: " + line + operands, "t.s");
    const Instruction& in = p.sections.at(0).code.at(0);
    REQUIRE(in.op == static_cast<Opcode>(i));
    for (size_t j = 0; j < d.fields.size(); ++j) {
      CHECK(in.ops[j].value == expect[j].value);
      CHECK(in.ops[j].is_reg == expect[j].is_reg);
    }
  }
}

TEST_CASE("assemble_file reads a file and names a missing one") {
  auto dir = std::filesystem::temp_directory_path() / "npusim_test_assembler";
  std::filesystem::create_directories(dir);
  auto path = (dir / "copy.s").string();
  {
    std::ofstream f(path);
    f << "movi x1, 7\nend\n";
  }
  Program p = assemble_file(path);
  CHECK(p.name == "copy");
  CHECK(p.source == path);
  CHECK(p.sections[0].code.size() == 2);
  std::filesystem::remove_all(dir);

  CHECK_THROWS_WITH(assemble_file("/nonexistent/k.s"),
                    Catch::Contains("/nonexistent/k.s") && Catch::Contains("cannot open"));
  try {
    assemble("nop\nbad x1\n", path);
    FAIL("expected an error");
  } catch (const IsaError& e) {
    CHECK_THAT(e.what(), Catch::StartsWith(path + ":2:1:"));
  }
}

TEST_CASE("expressions nest at most kMaxExprDepth levels; deeper is an error, not a crash") {
  auto parens = [](int n, const std::string& inner) {
    return std::string(n, '(') + inner + std::string(n, ')');
  };
  // At the limit: assembles, and the value is the innermost one (parentheses change nothing,
  // each '-' negates, so an even count of them gives back the value).
  Program p = assemble("movi x1, " + parens(kMaxExprDepth, "37") + "\nend\n", "t.s");
  CHECK(imm(p.sections[0].code[0], "imm") == 37);
  p = assemble("movi x1, " + std::string(kMaxExprDepth, '-') + "37\nend\n", "t.s");
  CHECK(imm(p.sections[0].code[0], "imm") == 37);
  p = assemble("movi x1, " + std::string(kMaxExprDepth / 2, '-') +
                   parens(kMaxExprDepth / 2, "37") + "\nend\n",
               "t.s");
  CHECK(imm(p.sections[0].code[0], "imm") == 37);

  // One level more: the error names file, line and the column of the level beyond the limit
  // (the operand starts at column 10), and the limit.
  const std::string limit = std::to_string(kMaxExprDepth);
  const std::string col = std::to_string(10 + kMaxExprDepth);
  CHECK_THAT(error_of("nop\nmovi x1, " + parens(kMaxExprDepth + 1, "37") + "\n"),
             Catch::StartsWith("t.s:2:" + col + ": expression nested more than " + limit));
  CHECK_THAT(error_of("movi x1, " + std::string(kMaxExprDepth + 1, '~') + "37\n"),
             Catch::StartsWith("t.s:1:" + col + ": expression nested more than " + limit));
  // The reproducer: ~17,000 parentheses overflowed the stack of the recursive parser.
  CHECK_THAT(error_of("movi x1, " + parens(17000, "1") + "\nend\n"),
             Catch::StartsWith("t.s:1:" + col + ":") && Catch::Contains(limit));
  CHECK_THAT(error_of(".equ N, " + std::string(17000, '-') + "1\n"),
             Catch::StartsWith("t.s:1:" + std::to_string(9 + kMaxExprDepth) + ":") &&
                 Catch::Contains(limit));
  // Unclosed: the limit is met before the missing ')' would be.
  CHECK_THAT(error_of("movi x1, " + std::string(17000, '(') + "\n"), Catch::Contains(limit));
}
