// The disassembler: exact text of single instructions, and listings that re-assemble to the
// identical program.
#include <catch2/catch.hpp>

#include <random>
#include <string>

#include "isa/assembler.h"
#include "isa/disassembler.h"

using namespace npusim::isa;

namespace {

// Same name, arguments, sections, labels and instruction words (src positions may differ).
void require_same_program(const Program& a, const Program& b) {
  CHECK(a.name == b.name);
  CHECK(a.arg_names == b.arg_names);
  for (size_t i = 0; i < a.arg_names.size(); ++i) CHECK(a.arg(i) == b.arg(i));
  REQUIRE(a.sections.size() == b.sections.size());
  for (size_t s = 0; s < a.sections.size(); ++s) {
    CHECK(a.sections[s].kind == b.sections[s].kind);
    CHECK(a.sections[s].labels == b.sections[s].labels);
    REQUIRE(a.sections[s].code.size() == b.sections[s].code.size());
    for (size_t i = 0; i < a.sections[s].code.size(); ++i) {
      INFO("section " << s << " instruction " << i << ": "
                      << disassemble(a.sections[s].code[i]));
      CHECK(encode(a.sections[s].code[i]) == encode(b.sections[s].code[i]));
    }
  }
}

void check_round_trip(const std::string& text) {
  Program p = assemble(text, "orig.s");
  std::string listing = disassemble(p);
  INFO(listing);
  Program q = assemble(listing, "listing.s");
  require_same_program(p, q);
  CHECK(disassemble(q) == listing);  // the listing is a fixed point
}

}  // namespace

TEST_CASE("disassembler: single instructions in assembler syntax") {
  Program p = assemble(R"(
top: vadd.f16 x3, x4, x5, 8, 1, 1, 1, 8, 8, 8
     vconv.f32.bf16 x3, x4, x2, 1, 1, 8, 4, 3
     vcmp.s32.ge x6, x4, x5, x7, 1, 1, 8, 8
     movi x1, -1
     movi x1, f32(1.0)
     movi x1, 65536
     set_flag mte2, v, 3
     pipe_barrier all
     load2d.f16 l0b, x1, x2, 4, 2, 1
     fixpipe.f32.f16 gm, x1, x2, 16, 32, x9, 1, 0, x3
     bne x2, 0, top
     end
)", "t.s");
  const Section& s = p.sections[0];
  CHECK(disassemble(s.code[0]) == "vadd.f16 x3, x4, x5, 8, 1, 1, 1, 8, 8, 8");
  CHECK(disassemble(s.code[1]) == "vconv.f32.bf16 x3, x4, x2, 1, 1, 8, 4, 3");
  CHECK(disassemble(s.code[2]) == "vcmp.s32.ge x6, x4, x5, x7, 1, 1, 8, 8");
  CHECK(disassemble(s.code[3]) == "movi x1, -1");
  CHECK(disassemble(s.code[4]) == "movi x1, 0x3f800000");  // 1.0f = 0 01111111 0...0
  CHECK(disassemble(s.code[5]) == "movi x1, 0x10000");  // |v| >= 2^16 prints in hex
  CHECK(disassemble(s.code[6]) == "set_flag mte2, v, 3");
  CHECK(disassemble(s.code[7]) == "pipe_barrier all");
  CHECK(disassemble(s.code[8]) == "load2d.f16 l0b, x1, x2, 4, 2, 1");
  CHECK(disassemble(s.code[9]) == "fixpipe.f32.f16 gm, x1, x2, 16, 32, x9, 1, 0, x3");
  CHECK(disassemble(s.code[10]) == "bne x2, 0, @0");
  CHECK(disassemble(s.code[10], &s) == "bne x2, 0, top");
  CHECK(disassemble(s.code[11]) == "end");
}

TEST_CASE("disassembler: vaddreluconv (AddReluCast) prints and re-assembles") {
  // dst_type, src_type as suffixes; then the binary vector operands (isa.def).
  const std::string text = R"(
    vaddreluconv.f16.f32 x3, x4, x5, 255, 1, 2, 3, 4, 8, 0
    vaddreluconv.f16.f32 x6, x7, x8, x9, 1, 1, 1, x10, 16, 0
    end
)";
  Program p = assemble(text, "t.s");
  const Section& s = p.sections[0];
  REQUIRE(s.code.size() == 3);
  CHECK(s.code[0].op == Opcode::op_vaddreluconv);
  CHECK(static_cast<Dtype>(s.code[0].ops[0].value) == Dtype::F16);
  CHECK(static_cast<Dtype>(s.code[0].ops[1].value) == Dtype::F32);
  CHECK(disassemble(s.code[0]) == "vaddreluconv.f16.f32 x3, x4, x5, 255, 1, 2, 3, 4, 8, 0");
  CHECK(disassemble(s.code[1]) == "vaddreluconv.f16.f32 x6, x7, x8, x9, 1, 1, 1, x10, 16, 0");
  for (const Instruction& in : s.code) CHECK(encode(decode(encode(in))) == encode(in));
  check_round_trip(text);
}

TEST_CASE("disassembler: vmla (MulAddDst) prints and re-assembles") {
  const std::string text = R"(
    vmla.f16 x3, x4, x5, 255, 1, 2, 3, 4, 8, 0
    vmla.f32 x6, x7, x6, x9, 1, 1, 1, x10, 16, 8
    end
)";
  Program p = assemble(text, "t.s");
  const Section& s = p.sections[0];
  REQUIRE(s.code.size() == 3);
  CHECK(s.code[0].op == Opcode::op_vmla);
  CHECK(static_cast<Dtype>(s.code[0].ops[0].value) == Dtype::F16);
  CHECK(static_cast<Dtype>(s.code[1].ops[0].value) == Dtype::F32);
  CHECK(disassemble(s.code[0]) == "vmla.f16 x3, x4, x5, 255, 1, 2, 3, 4, 8, 0");
  CHECK(disassemble(s.code[1]) == "vmla.f32 x6, x7, x6, x9, 1, 1, 1, x10, 16, 8");
  for (const Instruction& in : s.code) CHECK(encode(decode(encode(in))) == encode(in));
  check_round_trip(text);
}

TEST_CASE("disassembler: codes that name nothing are marked") {
  Instruction in;
  in.op = Opcode::op_load2d;
  in.ops[0] = {false, 12};  // type: no such dtype
  in.ops[1] = {false, 9};   // dst: no such buffer
  CHECK(disassemble(in) == "load2d.?dt12 ?buf9, x0, x0, 0, 0, 0");
  CHECK(illegal_operand(in).value() ==
        "load2d operand type: data type code 12 is out of range 0..8");
  in.ops[0] = {false, int64_t(Dtype::F16)};
  CHECK(illegal_operand(in).value() == "load2d operand dst: buffer code 9 is out of range 0..7");
  in.ops[1] = {false, int64_t(Buf::L0A)};
  CHECK_FALSE(illegal_operand(in).has_value());
}

TEST_CASE("disassembler: the L2 policy prints as the last suffix unless normal") {
  Program p = assemble(R"(
copy_gm2ub.noalloc x1, x2, 1, 4, 0, 0
copy_ub2gm.bypass x1, x2, 1, 4, 0, 0
copy_gm2l1.normal x1, x2, 1, 4, 0, 0
nd2nz.bf16.noalloc x1, x2, 15, 17, 17, 16
fixpipe.f32.f16.bypass gm, x1, x2, 16, 32, 32, 1, 0, x3
)", "t.s");
  const auto& c = p.sections[0].code;
  CHECK(disassemble(c[0]) == "copy_gm2ub.noalloc x1, x2, 1, 4, 0, 0");
  CHECK(disassemble(c[1]) == "copy_ub2gm.bypass x1, x2, 1, 4, 0, 0");
  CHECK(disassemble(c[2]) == "copy_gm2l1 x1, x2, 1, 4, 0, 0");
  CHECK(disassemble(c[3]) == "nd2nz.bf16.noalloc x1, x2, 15, 17, 17, 16");
  CHECK(disassemble(c[4]) == "fixpipe.f32.f16.bypass gm, x1, x2, 16, 32, 32, 1, 0, x3");
  // Through the 128-bit encoding and back.
  for (const Instruction& in : c) {
    const Instruction d = decode(encode(in));
    CHECK(disassemble(d) == disassemble(in));
  }
  Instruction bad = c[0];
  bad.ops[static_cast<size_t>(field_index(bad.op, "l2"))] = {false, 3};
  CHECK(disassemble(bad) == "copy_gm2ub.?l2h3 x1, x2, 1, 4, 0, 0");
  CHECK(illegal_operand(bad).value() ==
        "copy_gm2ub operand l2: L2 policy code 3 is out of range 0..2");
}

TEST_CASE("disassembler: listings re-assemble to the identical program") {
  check_round_trip(R"(
.kernel add_two
.arg src
.arg dst
.arg n
.equ BLK, 32
    ldarg x1, src
    ldarg x2, dst
    ldarg x3, n
    movi x4, 0
loop:
    copy_gm2ub x4, x1, 1, BLK / 32 * 8, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    vadds.f32 x4, x4, x5, 4, 1, 1, 8, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    copy_ub2gm x2, x4, 1, 8, 0, 0
    add x1, x1, 256
    sub x3, x3, 1
    blt x4, x3, loop
    bge x3, x4, out
out: exit2:
    end
tail:
)");
  check_round_trip(R"(
.kernel mix
.section aic
    copy_gm2l1 x1, x2, 1, 16, 0, 0
    load2d.bf16 l0a, x3, x1, 4, 1, 0
    mmad.bf16 x5, x3, x4, 16, 64, 16, 0, x0
    fixpipe.f32.bf16 gm, x6, x5, 16, 16, 16, 1, 1, x0
    cc_set fix, 2, 1
    end
.section aiv
    cc_wait v, 1
    movi x1, 0xdeadbeefcafef00d
    movi x2, -123456789
    set_mask x1, x2
    set_mask_count x3
    vconv.s8.f16 x1, x2, 1, 1, 1, 4, 8, 4
    vsel.f16 x1, x2, x3, x4, 1, 1, 1, 1, 8, 8, 8
    vcmax.f32 x1, x2, 3, 1, 8
    vtranspose x1, x2
    jmp @3
)");
  // Typed arguments, dimensions naming arguments declared before and after.
  check_round_trip(R"(
.kernel typed
.arg n
.arg a, f16[M, 0x20]
.arg t, u8
.arg b,bf16[ 3 ,n,M ]
.arg M
.section aiv
    ldarg x1, b
    end
)");
  // Empty sections, a kernel without arguments, absolute targets without labels.
  check_round_trip(".kernel k\n.section aiv\n.section aic\njmp @0\n");
}

TEST_CASE("disassembler: arguments print in the form they were declared") {
  Program p = assemble(".arg n\n.arg a, f16[n, 16]\n.arg t, s64\nend\n", "t.s");
  CHECK(disassemble(p) == ".kernel t\n.arg n\n.arg a, f16[n, 16]\n.arg t, s64\n"
                          ".section aicore\n    end\n");
  CHECK(arg_type_text(p.arg(0)).empty());
  CHECK(arg_type_text(p.arg(1)) == "f16[n, 16]");
  CHECK(arg_type_text(p.arg(2)) == "s64");
  // A Program built in code with only arg_names lists untyped arguments.
  Program bare;
  bare.arg_names = {"u", "v"};
  CHECK(disassemble(bare) == ".arg u\n.arg v\n");
}

TEST_CASE("disassembler: random operands of every instruction round-trip") {
  std::mt19937_64 rng(12345);
  Program p;
  p.name = "random";
  p.arg_names = {"a", "b"};
  Section s;
  for (int rep = 0; rep < 4; ++rep) {
    for (int i = 0; i < kNumOpcodes; ++i) {
      Instruction in;
      in.op = static_cast<Opcode>(i);
      const auto& fields = in.desc().fields;
      for (size_t j = 0; j < fields.size(); ++j) {
        FieldKind k = fields[j].kind;
        uint64_t r = rng();
        Operand& o = in.ops[j];
        switch (k) {
          case FieldKind::Reg: o = {true, int64_t(r % kNumRegs)}; break;
          case FieldKind::Dt: o = {false, int64_t(r % int(Dtype::NONE))}; break;
          case FieldKind::Cmp: o = {false, int64_t(r % (int(Cmp::GE) + 1))}; break;
          case FieldKind::L2h: o = {false, int64_t(r % kNumL2Hints)}; break;
          case FieldKind::Uf: o = {false, int64_t(r % 3 == 0 ? 0 : r % 3 + 1)}; break;
          case FieldKind::Pipe: o = {false, int64_t(r % (int(Pipe::ALL) + 1))}; break;
          case FieldKind::Buf: o = {false, int64_t(r % kNumBufs)}; break;
          case FieldKind::Label: o = {false, int64_t(r % (kNumOpcodes * 4))}; break;
          case FieldKind::I64: o = {false, int64_t(r)}; break;
          default:
            if (field_is_reg_or_imm(k) && (r & 1)) o = {true, int64_t((r >> 1) % kNumRegs)};
            else o = {false, int64_t((r >> 1) % (field_imm_max(k) + 1))};
        }
      }
      s.code.push_back(in);
    }
  }
  s.labels = {{"first", 0}, {"middle", 77}, {"also_middle", 77}, {"end_of_code",
                                                                   uint32_t(s.code.size())}};
  p.sections.push_back(s);
  std::string listing = disassemble(p);
  Program q = assemble(listing, "listing.s");
  require_same_program(p, q);
}
