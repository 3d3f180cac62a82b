// The binary kernel format: documented layout, round trips, and rejection of corrupt input
// with the byte offset of the problem.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "common/error.h"
#include "isa/assembler.h"
#include "isa/disassembler.h"
#include "isa/kernel_file.h"

using namespace npusim;
using namespace npusim::isa;

namespace {

const char* kText = R"(.kernel scale
.arg src
.arg dst
.section aic
start:
    ldarg x1, src
    copy_gm2l1 x2, x1, 1, 16, 0, 0
    jmp start
.section aiv
    ldarg x1, dst
    movi x2, f32(0.5)
loop: vmuls.f32 x3, x3, x2, 1, 1, 1, 8, 8
      end
)";

std::string error_of(const std::vector<uint8_t>& bytes) {
  try {
    read_kernel(bytes, "k.npuk");
  } catch (const IsaError& e) {
    return e.what();
  }
  return "";
}

uint32_t le32(const std::vector<uint8_t>& b, size_t at) {
  return b[at] | b[at + 1] << 8 | b[at + 2] << 16 | uint32_t(b[at + 3]) << 24;
}

}  // namespace

TEST_CASE("kernel file: layout follows docs/assembly.md") {
  Program p = assemble(kText, "scale.s");
  std::vector<uint8_t> b = write_kernel(p);
  // Header: magic, version 2, 2 sections, strings {scale, scale.s, src, dst, start, loop}, 2 args.
  CHECK(std::string(b.begin(), b.begin() + 4) == "NPUK");
  CHECK((b[4] | b[5] << 8) == 2);
  CHECK((b[6] | b[7] << 8) == 2);
  CHECK(le32(b, 8) == 6);
  CHECK(le32(b, 12) == 2);
  // String table: u32 length + bytes each.
  size_t strings = (4 + 5) + (4 + 7) + (4 + 3) + (4 + 3) + (4 + 5) + (4 + 4);
  CHECK(le32(b, 16) == 5);
  CHECK(std::string(b.begin() + 20, b.begin() + 25) == "scale");
  size_t args = 16 + strings;
  CHECK(le32(b, args) == 2);      // .arg src -> string 2
  CHECK(le32(b, args + 4) == 3);  // .arg dst -> string 3
  // Argument types: both untyped (code 255, zero, rank 0).
  size_t types = args + 8;
  CHECK(le32(b, types) == 0xFF);
  CHECK(le32(b, types + 4) == 0xFF);
  // Section aic: kind, 3 pad bytes, 3 instructions, 1 label; then words, line table, labels.
  size_t aic = types + 8;
  CHECK(b[aic] == uint8_t(CoreKind::AIC));
  CHECK(le32(b, aic + 4) == 3);
  CHECK(le32(b, aic + 8) == 1);
  size_t words = aic + 12;
  EncodedWord w0 = encode(p.sections[0].code[0]);
  CHECK(le32(b, words) == uint32_t(w0.lo));
  size_t lines = words + 3 * 16;
  CHECK(le32(b, lines) == 6);      // ldarg is on line 6
  CHECK(le32(b, lines + 4) == 5);  // at column 5
  size_t labels = lines + 3 * 8;
  CHECK(le32(b, labels) == 4);      // "start"
  CHECK(le32(b, labels + 4) == 0);  // at instruction 0
  size_t aiv = labels + 8;
  CHECK(b[aiv] == uint8_t(CoreKind::AIV));
  CHECK(b.size() == aiv + 12 + 4 * 16 + 4 * 8 + 1 * 8);
}

TEST_CASE("kernel file: write/read round-trips names, code, lines and labels") {
  Program p = assemble(kText, "scale.s");
  Program q = read_kernel(write_kernel(p), "scale.npuk");
  CHECK(q.name == "scale");
  CHECK(q.source == "scale.s");  // errors still point at the assembly source
  CHECK(q.arg_names == p.arg_names);
  REQUIRE(q.sections.size() == 2);
  for (size_t s = 0; s < 2; ++s) {
    CHECK(q.sections[s].kind == p.sections[s].kind);
    CHECK(q.sections[s].labels == p.sections[s].labels);
    REQUIRE(q.sections[s].code.size() == p.sections[s].code.size());
    for (size_t i = 0; i < p.sections[s].code.size(); ++i) {
      CHECK(encode(q.sections[s].code[i]) == encode(p.sections[s].code[i]));
      CHECK(q.sections[s].code[i].src_line == p.sections[s].code[i].src_line);
      CHECK(q.sections[s].code[i].src_col == p.sections[s].code[i].src_col);
    }
  }
  CHECK(q.sections[1].code[2].src_line == 12);  // the vmuls after "loop:"
  CHECK(q.sections[1].code[2].src_col == 7);
  CHECK(disassemble(q) == disassemble(p));

  // A program without a stored source name takes the binary's name.
  Program anon;
  anon.sections.push_back(Section{CoreKind::AICORE, {}, {}});
  CHECK(read_kernel(write_kernel(anon), "x.npuk").source == "x.npuk");
}

TEST_CASE("kernel file: typed arguments are stored and read back") {
  Program p = assemble(".arg n\n.arg a, f16[n, 16]\n.arg t, bf16\nend\n", "t.s");
  std::vector<uint8_t> b = write_kernel(p);
  // Strings {t, t.s, n, a, t, 16}: the fixed kernel and source names, the argument names, then
  // dimensions not already there.
  CHECK(le32(b, 8) == 6);
  size_t types = 16 + (4 + 1) + (4 + 3) + (4 + 1) + (4 + 1) + (4 + 1) + (4 + 2) + 3 * 4;
  CHECK(le32(b, 16 + 5 + 7 + 5 + 5 + 5) == 2);  // the last string, "16", is 2 bytes long
  // n: untyped, rank 0.
  CHECK(b[types] == 0xFF);
  CHECK(b[types + 1] == 0);
  CHECK((b[types + 2] | b[types + 3] << 8) == 0);
  // a: f16 (the Dt code), rank 2, dims "n" (string 2) and "16" (string 5).
  CHECK(b[types + 4] == uint8_t(Dtype::F16));
  CHECK((b[types + 6] | b[types + 7] << 8) == 2);
  CHECK(le32(b, types + 8) == 2);
  CHECK(le32(b, types + 12) == 5);
  // t: bf16, any shape (rank 0).
  CHECK(b[types + 16] == uint8_t(Dtype::BF16));
  CHECK((b[types + 18] | b[types + 19] << 8) == 0);
  CHECK(b[types + 20] == uint8_t(CoreKind::AICORE));  // the section follows

  Program q = read_kernel(b, "t.npuk");
  REQUIRE(q.args.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(q.args[i] == p.args[i]);
  CHECK(q.arg_names == p.arg_names);
  CHECK(disassemble(q) == disassemble(p));

  auto error_at = [&](size_t at, uint8_t v) {
    auto c = b;
    c[at] = v;
    return error_of(c);
  };
  CHECK(error_at(types + 4, 9) ==
        fmt::format("k.npuk: byte offset {}: argument 'a': bad type code 9 (0..8 data types, "
                    "255 untyped)",
                    types + 4));
  CHECK(error_at(types + 2, 1) ==
        fmt::format("k.npuk: byte offset {}: argument 'n' is untyped but has 1 dimensions",
                    types + 2));
  CHECK(error_at(types + 8, 3) ==  // dim "a": a tensor
        fmt::format("k.npuk: byte offset {}: argument 'a': dimension 'a' names a tensor argument",
                    types + 8));
  CHECK(error_at(types + 8, 4) ==  // dim "t": a tensor (string 4; string 0 is the kernel)
        fmt::format("k.npuk: byte offset {}: argument 'a': dimension 't' names a tensor argument",
                    types + 8));
  CHECK(error_at(types + 12, 1) ==  // dim "t.s": neither
        fmt::format("k.npuk: byte offset {}: argument 'a': dimension 't.s' is neither a decimal "
                    "literal nor an argument",
                    types + 12));
  CHECK(error_at(types + 12, 9) ==
        fmt::format("k.npuk: byte offset {}: argument dimension string index 9 is not in the "
                    "string table of 6 strings",
                    types + 12));
  // Argument 2 named like argument 0.
  CHECK(error_at(types - 4, 2) ==
        fmt::format("k.npuk: byte offset {}: duplicate argument 'n'", types - 4));

  // The writer refuses what the reader would refuse, naming the source.
  Program bad = p;
  bad.args[1].dims[0] = "t";
  CHECK_THROWS_WITH(write_kernel(bad), "t.s: argument 'a': dimension 't' names a tensor argument");
  bad = p;
  bad.args[1].dims[1] = "-16";
  CHECK_THROWS_WITH(write_kernel(bad), "t.s: argument 'a': dimension '-16' is neither a decimal "
                                       "literal nor an argument");
  bad = p;
  bad.args[0].dims = {"4"};
  CHECK_THROWS_WITH(write_kernel(bad), "t.s: untyped argument 'n' has dimensions");
  bad = p;
  bad.args.pop_back();
  CHECK_THROWS_WITH(write_kernel(bad), "t.s: 2 argument declarations for 3 argument names");
  bad = p;
  bad.arg_names[2] = "u";
  CHECK_THROWS_WITH(write_kernel(bad), "t.s: argument 2 is declared as 't' but named 'u'");
  // A Program built in code with arg_names only is stored with untyped arguments.
  Program bare = p;
  bare.args.clear();
  Program r = read_kernel(write_kernel(bare), "bare.npuk");
  REQUIRE(r.args.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(r.args[i] == bare.arg(i));
}

TEST_CASE("kernel file: version 1 files load with untyped arguments") {
  Program p = assemble(kText, "scale.s");
  std::vector<uint8_t> v2 = write_kernel(p);
  // Version 1 is version 2 without the argument type table (2 untyped entries of 4 bytes).
  size_t types = 16 + 9 + 11 + 7 + 7 + 9 + 8 + 8;
  std::vector<uint8_t> v1 = v2;
  v1[4] = 1;
  v1.erase(v1.begin() + types, v1.begin() + types + 8);
  Program q = read_kernel(v1, "old.npuk");
  CHECK(q.arg_names == p.arg_names);
  REQUIRE(q.args.size() == 2);
  CHECK_FALSE(q.args[0].typed());
  CHECK(q.args[1].name == "dst");
  CHECK(disassemble(q) == disassemble(p));
  // A version 2 file read as version 1 has 8 stray bytes where the section should start.
  auto wrong = v2;
  wrong[4] = 1;
  CHECK_THAT(error_of(wrong), Catch::StartsWith(fmt::format("k.npuk: byte offset {}: bad core kind "
                                                            "255",
                                                            types)));
}

TEST_CASE("kernel file: corrupt input is rejected with what and where") {
  Program p = assemble(kText, "scale.s");
  const std::vector<uint8_t> good = write_kernel(p);
  // header + strings + argument names + argument types (layout test above)
  size_t aic = 16 + 9 + 11 + 7 + 7 + 9 + 8 + 8 + 8;
  size_t word0 = aic + 12;

  auto with = [&](size_t at, uint8_t v) {
    auto b = good;
    b[at] = v;
    return b;
  };
  CHECK_THAT(error_of(with(0, 'X')),
             Catch::StartsWith("k.npuk: byte offset 0: bad magic 0x5850554b"));
  CHECK_THAT(error_of({}), Catch::Contains("byte offset 0: bad magic (empty file)"));
  CHECK(error_of(with(4, 4)) ==
        "k.npuk: byte offset 4: unsupported version 4 (this reader supports 1 to 3)");
  CHECK(error_of(with(4, 0)) ==
        "k.npuk: byte offset 4: unsupported version 0 (this reader supports 1 to 3)");
  CHECK(error_of(with(aic, 7)) == fmt::format("k.npuk: byte offset {}: bad core kind 7 in "
                                              "section 0 (0 aic, 1 aiv, 2 aicore)",
                                              aic));
  CHECK(error_of(with(word0, 0xFF)) ==
        fmt::format("k.npuk: byte offset {}: section aic instruction 0: illegal instruction: "
                    "opcode 255 is not in the instruction set",
                    word0));
  // A word with a legal opcode but an operand encode() never produces: instruction 1
  // (copy_gm2l1) with nburst flagged as a register numbered 40.
  {
    Instruction bad;
    bad.op = Opcode::op_copy_gm2l1;
    EncodedWord w = encode(bad);
    // Fields: xdst (5 bits at 8), xsrc (5 at 13), nburst (17 bits at 18: flag, value).
    w.lo |= (1ull << 18) | (40ull << 19);  // "register" 40
    auto b = good;
    for (int i = 0; i < 8; ++i) b[word0 + 16 + i] = uint8_t(w.lo >> (8 * i));
    for (int i = 0; i < 8; ++i) b[word0 + 24 + i] = uint8_t(w.hi >> (8 * i));
    CHECK(error_of(b) == fmt::format("k.npuk: byte offset {}: section aic instruction 1: "
                                     "illegal operand: copy_gm2l1 operand nburst: register "
                                     "number 40 is out of range 0..31",
                                     word0 + 16));
  }
  {
    auto b = good;
    b[16 + 9 + 11 + 7 + 7 + 9 + 8] = 99;  // argument 0's string index
    CHECK_THAT(error_of(b), Catch::Contains(fmt::format(
                                "byte offset {}: argument name index 99 is not in the string "
                                "table of 6 strings",
                                16 + 9 + 11 + 7 + 7 + 9 + 8)));
  }
  {
    size_t label_index = word0 + 3 * 16 + 3 * 8 + 4;
    CHECK_THAT(error_of(with(label_index, 4)),
               Catch::Contains(fmt::format("byte offset {}: label 'start' at instruction 4 is "
                                           "past the end of section aic (3 instructions)",
                                           label_index)));
  }
  {
    auto b = good;
    b.push_back(0);
    CHECK(error_of(b) == fmt::format("k.npuk: byte offset {}: 1 unexpected bytes after the "
                                     "last section",
                                     good.size()));
  }
  {
    auto b = good;
    b[aic + 4] = 200;  // instruction count far beyond the file
    CHECK_THAT(error_of(b), Catch::Contains(fmt::format("byte offset {}: truncated: section body",
                                                        aic + 12)));
  }
  // Every strict prefix of a valid file is truncated somewhere; none loads.
  for (size_t n = 4; n < good.size(); ++n) {
    std::vector<uint8_t> b(good.begin(), good.begin() + n);
    INFO("prefix of " << n << " bytes");
    CHECK_THAT(error_of(b), Catch::StartsWith("k.npuk: byte offset ") &&
                                Catch::Contains("truncated"));
  }
}

TEST_CASE("kernel file: file helpers and loading by magic") {
  auto dir = std::filesystem::temp_directory_path() / "npusim_test_kernel_file";
  std::filesystem::create_directories(dir);
  std::string src = (dir / "scale.s").string(), bin = (dir / "scale.npuk").string();
  {
    std::ofstream f(src);
    f << kText;
  }
  Program p = load_program_file(src);  // assembly
  write_kernel_file(p, bin);
  Program q = load_program_file(bin);  // binary, recognised by its magic
  CHECK(q.source == src);
  CHECK(disassemble(q) == disassemble(p));
  CHECK(disassemble(read_kernel_file(bin)) == disassemble(p));
  std::filesystem::remove_all(dir);

  CHECK_THROWS_WITH(read_kernel_file("/nonexistent/k.npuk"),
                    Catch::Contains("/nonexistent/k.npuk: cannot open"));
  CHECK_THROWS_WITH(write_kernel_file(p, "/nonexistent/dir/k.npuk"),
                    Catch::Contains("/nonexistent/dir/k.npuk: cannot open for writing"));
  // An operand that does not fit is reported at its source line.
  Program bad = p;
  bad.sections[0].code[0].ops[1].value = 1000;  // ldarg index is U8
  CHECK_THROWS_WITH(write_kernel(bad), Catch::StartsWith(src + ":6:5: ldarg: operand index"));
}

TEST_CASE("kernel file: a declared mix ratio is version 3 and round-trips") {
  // At the end, so that the line table matches kText's.
  const std::string text = std::string(kText) + ".aiv_per_aic 1\n";
  Program p = assemble(text, "scale.s");
  REQUIRE(p.aiv_per_aic == 1);
  const std::vector<uint8_t> v3 = write_kernel(p);
  CHECK((v3[4] | v3[5] << 8) == 3);
  // Version 3 is version 2 with u8 ratio + 3 zero bytes after the argument type table.
  const size_t ratio_at = 16 + 9 + 11 + 7 + 7 + 9 + 8 + 8 + 8;
  std::vector<uint8_t> v2 = write_kernel(assemble(kText, "scale.s"));
  CHECK((v2[4] | v2[5] << 8) == 2);
  CHECK(v3[ratio_at] == 1);
  std::vector<uint8_t> stripped = v3;
  stripped[4] = 2;
  stripped.erase(stripped.begin() + ratio_at, stripped.begin() + ratio_at + 4);
  CHECK(stripped == v2);
  Program q = read_kernel(v3, "mix11.npuk");
  CHECK(q.aiv_per_aic == 1);
  CHECK(disassemble(q) == disassemble(p));
  CHECK_THAT(disassemble(q), Catch::Contains(".aiv_per_aic 1\n"));
  // The ratio changes how blocks run, so it is part of the digest; an undeclared one is not.
  CHECK(program_digest(q) != program_digest(assemble(kText, "scale.s")));
  auto zero = v3;
  zero[ratio_at] = 0;
  CHECK(error_of(zero) == fmt::format("k.npuk: byte offset {}: mix ratio 0: a version 3 file "
                                      "declares 1..255 vector cores per cube core",
                                      ratio_at));
}

TEST_CASE("assembler: .aiv_per_aic is checked") {
  auto error = [](const std::string& text) {
    try {
      assemble(text, "m.s");
    } catch (const IsaError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error(".aiv_per_aic 0\n.section aic\nend\n.section aiv\nend\n") ==
        "m.s:1:14: .aiv_per_aic 0 is outside 1..255");
  CHECK(error(".aiv_per_aic 1\n.aiv_per_aic 1\n.section aic\nend\n.section aiv\nend\n") ==
        "m.s:2:1: duplicate .aiv_per_aic directive");
  CHECK(error(".aiv_per_aic 1\n.section aiv\nend\n") ==
        "m.s:1:1: .aiv_per_aic applies to mix kernels, and this kernel does not have both an aic "
        "and an aiv section");
}
