// The verifier: programs that run cleanly pass; each kind of fault is reported at the
// instruction's line:col. Chips: the coupled unit-test chip and a split chip derived from it
// (910B-like: cube core without UB/vector, vector core with only UB; paths of a 910B, ref S1).
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "isa/assembler.h"
#include "sim/exec/exec.h"
#include "sim/verifier/verifier.h"
#include "tests/common/test_chip.h"

using namespace npusim;
using namespace npusim::isa;

namespace {

ChipConfig split_chip() {
  ChipConfig c = test::coupled_test_chip();
  c.name = "split-test";
  c.split = true;
  CoreKindConfig aic = c.core_kinds[0], aiv = c.core_kinds[0];
  aic.kind = CoreKind::AIC;
  aic.pipes = {Pipe::S, Pipe::MTE1, Pipe::MTE2, Pipe::M, Pipe::FIX};
  aic.buffer_bytes.erase(Buf::UB);
  aiv.kind = CoreKind::AIV;
  aiv.count = 4;
  c.aiv_per_aic = 2;
  aiv.pipes = {Pipe::S, Pipe::MTE2, Pipe::MTE3, Pipe::V};
  aiv.buffer_bytes = {{Buf::UB, 192 * 1024}};
  c.core_kinds = {aic, aiv};
  // 910B has no L1<->UB or L0C->UB paths: cube and vector cores meet in GM.
  for (auto p : {std::pair{Buf::L1, Buf::UB}, std::pair{Buf::UB, Buf::L1},
                 std::pair{Buf::L0C, Buf::UB}}) {
    c.path_bytes_per_cycle.erase(p);
    c.path_latency_cycles.erase(p);
  }
  return c;
}

std::vector<VerifyIssue> issues_of(const std::string& text, const ChipConfig& cfg) {
  return verify(assemble(text, "k.s"), cfg);
}

// "line:col: section: message" of every issue, for readable failures.
std::string listing(const std::vector<VerifyIssue>& v) {
  std::string s;
  for (const auto& i : v)
    s += std::to_string(i.line) + ":" + std::to_string(i.col) + ": " +
         core_kind_name(i.section) + ": " + i.message + "\n";
  return s;
}

// Checks that v holds exactly the issues expected, in order: (line, col, message fragment).
struct Expect {
  uint32_t line, col;
  std::string fragment;
};
void check_issues(const std::vector<VerifyIssue>& v, const std::vector<Expect>& expect) {
  INFO(listing(v));
  REQUIRE(v.size() == expect.size());
  for (size_t i = 0; i < v.size(); ++i) {
    CHECK(v[i].line == expect[i].line);
    CHECK(v[i].col == expect[i].col);
    CHECK_THAT(v[i].message, Catch::Contains(expect[i].fragment));
  }
}

bool vector_plan_available() {
  ChipConfig cfg = test::coupled_test_chip();
  Program p = assemble("movi x1, 0\nvadd.f16 x1, x1, x1, 1, 1, 1, 1, 8, 8, 8\nend\n", "probe.s");
  IssuedOp op;
  op.insn = &p.sections[0].code[1];
  CoreMemory local(cfg.core_kinds[0]);
  DeviceMemory gm(1 << 20);
  try {
    plan(op, ExecContext{cfg, cfg.core_kinds[0], local, gm});
  } catch (const KernelFault& e) {
    return std::string(e.what()).find("not implemented") == std::string::npos;
  }
  return true;
}

}  // namespace

TEST_CASE("verifier: clean kernels pass on the chips they target") {
  // Vector add on the coupled chip; UB addresses set inside the loop so every copy and vadd is
  // checked by plan().
  check_issues(issues_of(R"(
.arg x
.arg y
.arg n
    ldarg x1, x
    ldarg x2, y
    ldarg x3, n
loop:
    movi x4, 0
    movi x5, 0x8000
    copy_gm2ub x4, x1, 1, 8, 0, 0
    copy_gm2ub x5, x2, 1, 8, 0, 0
    set_flag mte2, v, 0
    wait_flag mte2, v, 0
    vadd.f16 x4, x4, x5, 1, 1, 1, 1, 8, 8, 8
    set_flag v, mte3, 1
    wait_flag v, mte3, 1
    copy_ub2gm x1, x4, 1, 8, 0, 0
    add x1, x1, 256
    add x2, x2, 256
    sub x3, x3, 1
    bne x3, 0, loop
    end
)", test::coupled_test_chip()), {});

  // A 16x32 by 32x16 f16 matmul through L1, L0A/L0B, the cube and FIXPIPE.
  check_issues(issues_of(R"(
.arg a
.arg b
.arg c
    ldarg x1, a
    ldarg x2, b
    ldarg x3, c
    movi x4, 0
    movi x5, 16 * 32 * 2
    nd2nz.f16 x4, x1, 16, 32, 32, 16
    nd2nz.f16 x5, x2, 32, 16, 16, 32
    set_flag mte2, mte1, 0
    wait_flag mte2, mte1, 0
    movi x6, 0
    load2d.f16 l0a, x6, x4, 2, 1, 0
    load2d.f16 l0b, x6, x5, 1, 2, 1
    add x7, x5, 512
    movi x8, 512
    load2d.f16 l0b, x8, x7, 1, 2, 1
    set_flag mte1, m, 0
    wait_flag mte1, m, 0
    mmad.f16 x6, x6, x6, 16, 32, 16, 0, x0
    set_flag m, fix, 0
    wait_flag m, fix, 0
    fixpipe.f32.f16 gm, x3, x6, 16, 16, 16, 1, 0, x0
    end
)", test::coupled_test_chip()), {});

  // A mix kernel on the split chip: cube and vector sections meet through GM.
  check_issues(issues_of(R"(
.section aic
    ldarg x1, 0
    movi x2, 0
    copy_gm2l1 x2, x1, 1, 16, 0, 0
    cc_set mte2, 2, 3
    end
.section aiv
    ldarg x1, 0
    cc_wait mte2, 3
    movi x2, 0
    copy_gm2ub x2, x1, 1, 16, 0, 0
    set_flag mte2, mte3, 7
    wait_flag mte2, mte3, 7
    copy_ub2gm x1, x2, 1, 16, 0, 0
    end
)", split_chip()), {});
}

TEST_CASE("verifier: sections must match the chip") {
  check_issues(issues_of("nop\nend\n", split_chip()),
               {{1, 1, "section aicore cannot run on split chip split-test"}});
  check_issues(issues_of(".section aic\nend\n.section aiv\n  end\n", test::coupled_test_chip()),
               {{4, 3, "coupled chip unit-test runs exactly one section; this program has 2"}});
  // On a coupled chip the one section may be of any kind: it runs on the AI cores.
  check_issues(issues_of(".section aiv\nmovi x1, 0\nvdup.f16 x1, x2, 1, 1, 8\nend\n",
                         test::coupled_test_chip()),
               {});
  check_issues(verify(Program{}, test::coupled_test_chip()), {{0, 0, "no sections"}});
  check_issues(issues_of(".section aic\n", test::coupled_test_chip()),
               {{0, 0, "section aic is empty"}});
  ChipConfig no_aiv = split_chip();
  no_aiv.core_kinds.pop_back();
  check_issues(issues_of(".section aiv\nend\n", no_aiv),
               {{2, 1, "chip split-test has no aiv cores"}});
}

TEST_CASE("verifier: pipes, buffers and data paths of the core kind") {
  check_issues(issues_of(R"(.section aic
    vadd.f16 x1, x1, x1, 1, 1, 1, 1, 8, 8, 8
    copy_gm2ub x1, x2, 1, 1, 0, 0
    fixpipe.f32.f16 ub, x1, x2, 16, 16, 16, 1, 0, x0
    load2d.f16 l0c, x1, x2, 1, 1, 0
    mmad.f16 x1, x1, x1, 16, 16, 16, 2, x1
    end
.section aiv
    copy_l12ub x1, x2, 1, 1, 0, 0
    mmad.f16 x1, x1, x1, 16, 16, 16, 0, x0
    copy_ub2gm x2, x1, 1, 1, 0, 0
    end
)", split_chip()),
               {{2, 5, "vadd: aic cores have no v pipe"},
                {3, 5, "copy_gm2ub: aic cores have no ub buffer"},
                {4, 5, "fixpipe: no data path l0c->ub on chip split-test"},
                {4, 5, "fixpipe: aic cores have no ub buffer"},
                {5, 5, "load2d: dst = l0c must be l0a or l0b"},
                {9, 5, "copy_l12ub: aiv cores have no mte1 pipe"},
                {10, 5, "mmad: aiv cores have no m pipe"}});
  // An L2 policy only on a fixpipe that writes GM.
  check_issues(issues_of(".section aic\n"
                         "    fixpipe.f32.f16.bypass l1, x1, x2, 16, 16, 16, 0, 0, x0\n"
                         "    fixpipe.f32.f16.noalloc gm, x1, x2, 16, 16, 16, 1, 0, x0\n    end\n",
                         split_chip()),
               {{2, 5, "fixpipe: L2 policy .bypass needs dst = gm (got l1)"}});
  // A chip whose cube has no BT buffer rejects mmad with bias (init 2) only.
  ChipConfig no_bt = test::coupled_test_chip();
  no_bt.core_kinds[0].buffer_bytes.erase(Buf::BT);
  check_issues(issues_of("mmad.f16 x1, x1, x1, 16, 16, 16, 2, x1\n"
                         "mmad.f16 x1, x1, x1, 16, 16, 16, 1, x1\nend\n",
                         no_bt),
               {{1, 1, "mmad: aicore cores have no bt buffer"}});
}

TEST_CASE("verifier: data types each instruction supports") {
  ChipConfig cfg = test::coupled_test_chip();
  cfg.cube_fp32_rate_divisor = 0;
  cfg.cube_bf16 = false;
  check_issues(issues_of(R"(
    mmad.f32 x1, x1, x1, 16, 16, 16, 0, x0
    mmad.bf16 x1, x1, x1, 16, 16, 16, 0, x0
    mmad.s8 x1, x1, x1, 16, 32, 16, 0, x0
    vexp.s32 x1, x1, 1, 1, 1, 8, 8
    vand.f16 x1, x1, x1, 1, 1, 1, 1, 8, 8, 8
    vand.u16 x1, x1, x1, 1, 1, 1, 1, 8, 8, 8
    vconv.s64.f16 x1, x1, 1, 1, 1, 8, 8, 0
    fixpipe.f16.f16 gm, x1, x2, 16, 16, 16, 1, 0, x0
    load2d.f32 l0a, x1, x2, 1, 1, 1
    nd2nz.s64 x1, x2, 16, 16, 16, 16
    end
)", cfg),
               {{2, 5, "mmad: type = f32 is not supported (the cube of chip unit-test takes f16, "
                       "s8)"},
                {3, 5, "mmad: type = bf16 is not supported"},
                {5, 5, "vexp: type = s32 is not supported (f32, f16, bf16)"},
                {6, 5, "vand: type = f16 is not supported (s16, u16)"},
                {8, 5, "vconv: dst_type = s64 is not supported"},
                {9, 5, "fixpipe: src_type = f16 is not supported (L0C holds f32 or s32)"},
                {10, 5, "load2d: type = f32 is not supported (transpose needs a 16-bit type)"},
                {11, 5, "nd2nz: type = s64 is not supported (a 1-, 2- or 4-byte type)"}});
  // The same cube types are fine on a chip whose cube supports them.
  check_issues(issues_of("mmad.f32 x1, x1, x1, 16, 16, 16, 0, x0\n"
                         "mmad.bf16 x1, x1, x1, 16, 16, 16, 0, x0\nend\n",
                         test::coupled_test_chip()),
               {});
}

TEST_CASE("verifier: vaddreluconv only on chips with vector.add_relu_conv, f16 <- f32 only") {
  const std::string kernel = R"(
    movi x1, 0
    movi x2, 1024
    movi x3, 2048
    vaddreluconv.f16.f32 x3, x1, x2, 4, 1, 1, 1, 4, 8, 8
    end
)";
  ChipConfig without = test::coupled_test_chip();
  without.vector_add_relu_conv = false;
  // Refused naming the instruction, its pc, the chip and the key (and not planned).
  check_issues(issues_of(kernel, without),
               {{5, 5,
                 "vaddreluconv (@3): chip unit-test does not have this instruction "
                 "(vector.add_relu_conv is false in tests/common/test_chip.h)"}});
  ChipConfig with = without;
  with.vector_add_relu_conv = true;
  check_issues(issues_of(kernel, with), {});
  // Type pairs: each type must be f32 or f16, and only f16 <- f32 is an AddReluCast.
  check_issues(issues_of(R"(
    vaddreluconv.f32.f32 x3, x1, x2, 4, 1, 1, 1, 4, 8, 8
    vaddreluconv.f16.f16 x3, x1, x2, 4, 1, 1, 1, 4, 8, 8
    vaddreluconv.s8.f16 x3, x1, x2, 4, 1, 1, 1, 4, 8, 8
    end
)", with),
               {{2, 5, "vaddreluconv: f32 <- f32 is not supported (only f16 <- f32)"},
                {3, 5, "vaddreluconv: f16 <- f16 is not supported (only f16 <- f32)"},
                {4, 5, "vaddreluconv: dst_type = s8 is not supported (f32, f16)"}});
  // Bounds through plan(): a destination past the UB.
  check_issues(issues_of("movi x1, 0\nmovi x3, 0x7ffffff0\n"
                         "vaddreluconv.f16.f32 x3, x1, x1, 1, 1, 1, 1, 4, 8, 8\nend\n",
                         with),
               {{3, 1, "vaddreluconv"}});
}

TEST_CASE("verifier: bf16 only in conversions and data moves without vector.bf16_arithmetic") {
  // Every V instruction that computes, on bf16; then those Ascend C allows on bf16 (Cast,
  // Duplicate) and the pure data moves.
  const std::string computes = R"(
    movi x1, 0
    movi x2, 1024
    movi x3, 2048
    vadd.bf16 x3, x1, x2, 1, 1, 1, 1, 8, 8, 8
    vmax.bf16 x3, x1, x2, 1, 1, 1, 1, 8, 8, 8
    vexp.bf16 x3, x1, 1, 1, 1, 8, 8
    vmuls.bf16 x3, x1, x2, 1, 1, 1, 8, 8
    vcmp.bf16.lt x3, x1, x2, 1, 1, 1, 8, 8
    vcadd.bf16 x3, x1, 1, 1, 8
    end
)";
  const std::string moves = R"(
    movi x1, 0
    movi x2, 1024
    movi x3, 2048
    vconv.f32.bf16 x3, x1, 1, 1, 1, 8, 4, 0
    vconv.bf16.f32 x3, x1, 1, 1, 1, 4, 8, 0
    vdup.bf16 x3, x2, 1, 1, 8
    vcopy.bf16 x3, x1, 1, 1, 1, 8, 8
    vsel.bf16 x3, x1, x2, x1, 1, 1, 1, 1, 8, 8, 8
    vadd.f16 x3, x1, x2, 1, 1, 1, 1, 8, 8, 8
    end
)";
  ChipConfig without = test::coupled_test_chip();
  without.vector_bf16_arithmetic = false;
  auto refused = [](int line, const char* insn) {
    return Expect{
        static_cast<uint32_t>(line), 5,
        std::string(insn) + " (@" + std::to_string(line - 2) +
            "): chip unit-test has no bf16 arithmetic on the vector unit "
            "(vector.bf16_arithmetic is false in tests/common/test_chip.h)"};
  };
  check_issues(issues_of(computes, without),
               {refused(5, "vadd.bf16"), refused(6, "vmax.bf16"), refused(7, "vexp.bf16"),
                refused(8, "vmuls.bf16"), refused(9, "vcmp.bf16"), refused(10, "vcadd.bf16")});
  check_issues(issues_of(moves, without), {});
  ChipConfig with = without;
  with.vector_bf16_arithmetic = true;
  check_issues(issues_of(computes, with), {});
  check_issues(issues_of(moves, with), {});
  // No bf16 conversion either (the 910 and 310P): vconv and vdup refused too, the bit moves not.
  ChipConfig no_bf16 = without;
  no_bf16.vector_bf16_conversion = false;
  auto no_conversion = [](uint32_t line, const char* insn) {
    return Expect{line, 5,
                  std::string(insn) + " (@" + std::to_string(line - 2) +
                      "): chip unit-test has no bf16 on the vector unit "
                      "(vector.bf16_conversion is false in tests/common/test_chip.h)"};
  };
  check_issues(issues_of(moves, no_bf16),
               {no_conversion(5, "vconv.bf16"), no_conversion(6, "vconv.bf16"),
                no_conversion(7, "vdup.bf16")});
}

TEST_CASE("verifier: vmla only on chips with vector.multiply_accumulate, f16 and f32 only") {
  const std::string kernel = R"(
    movi x1, 0
    movi x2, 1024
    movi x3, 2048
    vmla.f32 x3, x1, x2, 4, 1, 1, 1, 8, 8, 8
    end
)";
  ChipConfig without = test::coupled_test_chip();
  without.vector_multiply_accumulate = false;
  // Refused naming the instruction, its pc, the chip and the key (and not planned).
  check_issues(issues_of(kernel, without),
               {{5, 5,
                 "vmla (@3): chip unit-test does not have this instruction "
                 "(vector.multiply_accumulate is false in tests/common/test_chip.h)"}});
  ChipConfig with = without;
  with.vector_multiply_accumulate = true;
  check_issues(issues_of(kernel, with), {});
  check_issues(issues_of("movi x1, 0\nvmla.f16 x1, x1, x1, 1, 1, 1, 1, 8, 8, 8\nend\n", with),
               {});
  check_issues(issues_of("movi x1, 0\nvmla.s32 x1, x1, x1, 1, 1, 1, 1, 8, 8, 8\nend\n", with),
               {{2, 1, "vmla: type = s32 is not supported (f32, f16)"}});
}

TEST_CASE("verifier: flags") {
  check_issues(issues_of(R"(
    set_flag mte2, v, 8
    wait_flag mte2, v, 8
    set_flag v, v, 1
    wait_flag v, v, 1
    set_flag all, v, 2
    wait_flag all, v, 2
    set_flag mte2, v, 3
    wait_flag mte3, v, 3
    pipe_barrier all
    pipe_barrier mte1
    cc_set v, 0, 1
    end
)", test::coupled_test_chip()),
               {{2, 5, "set_flag: flag id 8 is not below flag_ids = 8 of chip unit-test"},
                {3, 5, "wait_flag: flag id 8 is not below flag_ids = 8"},
                {4, 5, "set_flag: src and dst are both v"},
                {5, 5, "wait_flag: src and dst are both v"},
                {6, 5, "set_flag: src = all is not a single pipe"},
                {7, 5, "wait_flag: src = all is not a single pipe"},
                {8, 5, "unpaired flag: set_flag mte2, v, 3 has no wait_flag mte2, v, 3 in "
                       "section aicore"},
                {9, 5, "unpaired flag: wait_flag mte3, v, 3 has no set_flag mte3, v, 3"},
                {12, 5, "cc_set: cross-core flags need a split chip; unit-test is coupled"}});
  check_issues(issues_of(R"(.section aiv
    set_flag m, v, 0
    wait_flag m, v, 0
    cc_set v, 3, 1
    cc_wait v, 11
    end
)", split_chip()),
               {{2, 5, "set_flag: aiv cores have no m pipe (src)"},
                {3, 5, "wait_flag: aiv cores have no m pipe (src)"},
                {4, 5, "cc_set: mode 3 is not 0 (cube cores), 1 (vector pair) or 2"},
                {5, 5, "cc_wait: cross-core flag id 11 is not below cross_core_flag_ids = 11"}});
}

TEST_CASE("verifier: control flow") {
  check_issues(issues_of("loop: nop\n  bne x1, 0, loop\n  jmp @7\n  nop\n",
                         test::coupled_test_chip()),
               {{3, 3, "jmp: branch target @7 is outside section aicore (4 instructions)"},
                {4, 3, "the last instruction of section aicore is nop, not end or jmp"}});
  check_issues(issues_of("top: nop\njmp top\n", test::coupled_test_chip()), {});
}

TEST_CASE("verifier: bounds and alignment through plan() with propagated constants") {
  ChipConfig cfg = test::coupled_test_chip();  // UB 192 KiB = 0x30000, 32-byte aligned
  check_issues(issues_of(R"(
.arg src
    ldarg x1, src
    movi x4, 0x2ff00
    copy_gm2ub x4, x1, 1, 16, 0, 0      ; 512 bytes from 0x2ff00 pass the end of UB
    movi x5, 16
    copy_gm2ub x5, x1, 1, 1, 0, 0       ; 0x10 is not 32-byte aligned
    movi x6, 6144
    mul x6, x6, 32                      ; 196608 = 0x30000, the end of UB
    copy_ub2gm x1, x6, 1, 1, 0, 0
    movi x7, 100
    shl x7, x7, 3                       ; 800 rows
    add x8, x7, 0                       ; x8 = 800 for nburst
    movi x9, 0
    copy_gm2ub x9, x1, x8, 8, 0, 0      ; 800 bursts of 256 B = 200 KiB > UB
    movi x10, 0x20000
    mmad.f16 x10, x9, x9, 16, 16, 16, 0, x0   ; xc at the end of L0C (128 KiB)
    movi x11, 0xfe00
    load2d.f16 l0a, x11, x9, 2, 1, 0    ; two fractals from 63.5 KiB overrun L0A (64 KiB)
    ldarg x12, src
    copy_gm2ub x12, x1, 1, 1, 0, 0      ; unknown UB address: not checked
    end
)", cfg),
               {{5, 5, "copy_gm2ub: xdst range [0x2ff00, 0x30100) is outside ub (196608 bytes)"},
                {7, 5, "copy_gm2ub: xdst = 0x10 is not aligned to 32 bytes"},
                {10, 5, "copy_ub2gm: xsrc range [0x30000, 0x30020) is outside ub"},
                {15, 5, "copy_gm2ub: xdst range [0x0, 0x32000) is outside ub"},
                {17, 5, "mmad: xc range [0x20000, 0x20400) is outside l0c"},
                {19, 5, "load2d: xdst range [0xfe00, 0x10200) is outside l0a"}});

  // Knowledge is dropped at labels and at unlabelled branch targets (join points).
  check_issues(issues_of(R"(
    movi x4, 0x30000
again:
    copy_gm2ub x4, x1, 1, 1, 0, 0       ; x4 may come from the back edge: unknown
    movi x5, 0x30000
    beq x1, 0, @5
    copy_gm2ub x5, x1, 1, 1, 0, 0       ; still known: reported
    copy_gm2ub x5, x1, 1, 1, 0, 0       ; @5 is a branch target: unknown
    bne x1, 0, again
    end
)", cfg),
               {{7, 5, "copy_gm2ub: xdst range [0x30000, 0x30020) is outside ub"}});
}

TEST_CASE("verifier: load3d is checked with the tracked feature-map geometry") {
  // 8x8 map, 16 channels (one C1 block of f16), 3x3 kernel: k = 3*3*16 = 144 columns; a
  // 16 x 144 f16 block in L0A is 4608 bytes.
  check_issues(issues_of(R"(
    movi x1, 0
    movi x2, 0xfe00
    load3d.f16 x2, x1, 16, 0, 16, 0, 144   ; geometry not set yet: not checked
    set_fmatrix 8, 8, 1, 1, 1, 1
    set_l3d_geom 3, 3, 1, 1, 1, 1
    load3d.f16 x2, x1, 16, 0, 16, 0, 144   ; [0xfe00, 0x11000) passes the end of L0A (64 KiB)
    movi x2, 0
    load3d.f16 x2, x1, 16, 0, 16, 0, 144
again:
    movi x2, 0xfe00
    load3d.f16 x2, x1, 16, 0, 16, 0, 144   ; geometry unknown after the label
    bne x2, 0, again
    end
)", test::coupled_test_chip()),
               {{7, 5, "load3d: xdst range [0xfe00, 0x11000) is outside l0a"}});
}

TEST_CASE("verifier: constant folding follows the scalar unit (sim/exec/scalar_alu.h)") {
  check_issues(issues_of(R"(
    movi x2, -2
    shr x2, x2, 63                      ; logical shift: 1 (arithmetic would give -1)
    mul x2, x2, 32                      ; 32, a valid UB address
    copy_gm2ub x2, x1, 1, 1, 0, 0
    movi x3, -6400
    movi x6, -1
    div x3, x3, x6                      ; signed: 6400 (unsigned would give 0)
    mul x3, x3, 32                      ; 204800 > 196608 bytes of UB
    copy_gm2ub x3, x1, 1, 1, 0, 0
    movi x4, 0
    rem x5, x3, x4
    end
)", test::coupled_test_chip()),
               {{10, 5, "copy_gm2ub: xdst range [0x32000, 0x32020) is outside ub"},
                {12, 5, "rem: division by zero"}});
}

TEST_CASE("verifier: vector bounds use the propagated mask") {
  if (!vector_plan_available()) {
    WARN("sim/exec/vector.cpp plan() is not implemented yet: vector bounds are not checked");
    return;
  }
  ChipConfig cfg = test::coupled_test_chip();
  check_issues(issues_of(R"(
    movi x1, 0x2ff00
    vadd.f16 x1, x1, x1, 2, 1, 1, 1, 8, 8, 8     ; 2 repeats of 256 B from 0x2ff00
    movi x2, 0
    set_mask_count 128
    vadd.f16 x2, x2, x2, 200, 1, 1, 1, 8, 8, 8   ; counter mode: one repeat, repeat ignored
    ldarg x3, 0
    set_mask_count x3
    movi x4, 0x2ff00
    vadd.f16 x4, x4, x4, 2, 1, 1, 1, 8, 8, 8     ; mask unknown: not checked
    end
)", cfg),
               {{3, 5, "outside"}});
}

TEST_CASE("verifier: the example in docs/assembly.md assembles and passes") {
  const char* dir = std::getenv("NPUSIM_SOURCE_DIR");
  std::string root = dir ? dir : std::filesystem::path(__FILE__).parent_path().parent_path()
                                     .parent_path().string();
  std::ifstream f(root + "/docs/assembly.md");
  REQUIRE(f);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string doc = ss.str();
  size_t begin = doc.find("```\n"), end = doc.find("```", begin + 4);
  REQUIRE(end != std::string::npos);
  Program p = assemble(doc.substr(begin + 4, end - begin - 4), "assembly.md");
  CHECK(p.name == "vadd_small");
  CHECK(p.arg_names.size() == 3);
  check_issues(verify(p, split_chip()), {});
}

TEST_CASE("verify_or_throw lists every issue as file:line:col") {
  Program p = assemble("set_flag v, v, 0\nwait_flag v, v, 0\nnop\n", "dir/k.s");
  try {
    verify_or_throw(p, test::coupled_test_chip());
    FAIL("expected IsaError");
  } catch (const IsaError& e) {
    CHECK(std::string(e.what()) ==
          "dir/k.s:1:1: aicore: set_flag: src and dst are both v\n"
          "dir/k.s:2:1: aicore: wait_flag: src and dst are both v\n"
          "dir/k.s:3:1: aicore: the last instruction of section aicore is nop, not end or jmp: "
          "execution would run past the end");
  }
  CHECK_NOTHROW(verify_or_throw(assemble("end\n", "ok.s"), test::coupled_test_chip()));

  // Hand-built instructions with codes that name nothing are rejected, not planned.
  Program bad;
  bad.source = "built";
  Instruction in;
  in.op = Opcode::op_load2d;
  in.ops[0] = {false, 13};  // no such dtype
  in.src_line = 9;
  bad.sections.push_back(Section{CoreKind::AICORE, {in}, {}});
  CHECK_THROWS_WITH(verify_or_throw(bad, test::coupled_test_chip()),
                    Catch::StartsWith("built:9:0: aicore: load2d operand type: data type code 13"));
}

TEST_CASE("verifier: unit flags pair an mmad chain with a fixpipe .uf3") {
  const ChipConfig cfg = test::coupled_test_chip();
  // A chain of two mmads into the tile at x1, its fixpipe .uf3 after it: clean.
  check_issues(issues_of(R"(
    movi x1, 0
    movi x2, 0
    mmad.f16.uf2 x1, x2, x2, 16, 16, 16, 0, x0
    mmad.f16.uf3 x1, x2, x2, 16, 16, 16, 1, x0
    fixpipe.f32.f16.uf3 l1, x2, x1, 16, 16, 16, 1, 0, x0
    end
)", cfg),
               {});
  // Refused: a fixpipe .uf3 with no mmad .uf3 before it (it would wait forever), a fixpipe
  // .uf2 (a chain's flag), and mmads with unit flags that no later fixpipe .uf3 drains.
  check_issues(issues_of(R"(
    movi x1, 0
    movi x2, 0
    fixpipe.f32.f16.uf3 l1, x2, x1, 16, 16, 16, 1, 0, x0
    mmad.f16.uf3 x1, x2, x2, 16, 16, 16, 0, x0
    fixpipe.f32.f16.uf2 l1, x2, x1, 16, 16, 16, 1, 0, x0
    end
)", cfg),
               {{4, 5, "fixpipe.uf3: no mmad .uf3 before it in the section"},
                {5, 5, "mmad.uf3: no fixpipe .uf3 after it in the section drains its L0C tile"},
                {6, 5, "fixpipe: unit flag .uf2 marks an mmad of a chain"}});
  check_issues(issues_of(R"(
    movi x1, 0
    movi x2, 0
    mmad.f16.uf2 x1, x2, x2, 16, 16, 16, 0, x0
    set_flag m, fix, 0
    wait_flag m, fix, 0
    fixpipe.f32.f16 l1, x2, x1, 16, 16, 16, 1, 0, x0
    end
)", cfg),
               {{4, 5, "mmad.uf2: no fixpipe .uf3 after it in the section drains its L0C tile"}});
}
