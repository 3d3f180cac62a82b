// The instruction table itself: every instruction fits the 128-bit word, names are unique, and
// encode/decode round-trip every field at its extreme values.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include "isa/isa.h"

using namespace npusim::isa;

TEST_CASE("every instruction fits in 128 bits and mnemonics are unique") {
  std::set<std::string> names;
  for (int i = 0; i < kNumOpcodes; ++i) {
    const InstrDesc& d = describe(static_cast<Opcode>(i));
    int bits = 8;
    for (const auto& f : d.fields) bits += field_bits(f.kind);
    INFO(d.mnemonic << " uses " << bits << " bits");
    CHECK(bits <= 128);
    CHECK(d.fields.size() <= static_cast<size_t>(kMaxFields));
    CHECK(names.insert(d.mnemonic).second);
    CHECK(opcode_from_mnemonic(d.mnemonic) == static_cast<Opcode>(i));
  }
}

TEST_CASE("encode/decode round-trips maximal operands of every instruction") {
  for (int i = 0; i < kNumOpcodes; ++i) {
    Instruction in;
    in.op = static_cast<Opcode>(i);
    const auto& fields = in.desc().fields;
    for (size_t j = 0; j < fields.size(); ++j) {
      FieldKind k = fields[j].kind;
      if (k == FieldKind::Reg) in.ops[j] = {true, 31};
      else if (k == FieldKind::I64) in.ops[j] = {false, -2};
      else if (field_is_reg_or_imm(k)) in.ops[j] = {j % 2 == 0, j % 2 == 0 ? 31 : int64_t(field_imm_max(k))};
      else in.ops[j] = {false, int64_t((1ull << field_bits(k)) - 1)};
    }
    Instruction out = decode(encode(in));
    INFO(in.desc().mnemonic);
    REQUIRE(out.op == in.op);
    for (size_t j = 0; j < fields.size(); ++j) {
      CHECK(out.ops[j].value == in.ops[j].value);
      CHECK(out.ops[j].is_reg == in.ops[j].is_reg);
    }
  }
}

TEST_CASE("an immediate too wide for its field is rejected") {
  Instruction in;
  in.op = Opcode::op_copy_gm2ub;
  in.ops[2] = {false, 1 << 16};  // nburst is RU16
  CHECK_THROWS_WITH(encode(in), Catch::Contains("nburst"));
}
