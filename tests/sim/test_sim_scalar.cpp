// Scalar-unit programs on the tiny split chip (4 vector cores): arithmetic, branches, loops,
// block ids, kernel arguments, the task scheduler with more blocks than cores, and results
// written to GM both by `st` and through the UB (vdup + copy_ub2gm).
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>

#include "common/error.h"
#include "sim/config/chip_config.h"
#include "tests/sim/sim_test_util.h"

using namespace npusim;
using npusim::test::counter;
using npusim::test::launch;
using npusim::test::read_gm;

namespace {

Simulator& sim() {
  static Simulator s(load_chip_config("tiny"), SimOptions{});
  return s;
}

constexpr uint64_t kOut = 0x100000;  // GM result area

}  // namespace

TEST_CASE("scalar arithmetic matches C++ two's-complement semantics") {
  const int64_t a = -7, b = 2, big = 0x123456789abcdefLL;
  isa::Program p = isa::assemble(R"(
.arg out
.section aiv
    ldarg x1, out
    movi x2, -7
    movi x3, 2
    movi x4, 0x123456789abcdef
    add x5, x2, x3
    st x5, x1
    sub x5, x2, 100
    add x1, x1, 8
    st x5, x1
    mul x5, x4, x3
    add x1, x1, 8
    st x5, x1
    div x5, x2, x3
    add x1, x1, 8
    st x5, x1
    rem x5, x2, x3
    add x1, x1, 8
    st x5, x1
    and x5, x4, 0xff00
    add x1, x1, 8
    st x5, x1
    or x5, x2, 0xf0
    add x1, x1, 8
    st x5, x1
    xor x5, x4, x2
    add x1, x1, 8
    st x5, x1
    shl x5, x4, 4
    add x1, x1, 8
    st x5, x1
    shr x5, x2, 60
    add x1, x1, 8
    st x5, x1
    min x5, x2, x3
    add x1, x1, 8
    st x5, x1
    max x5, x2, x3
    add x1, x1, 8
    st x5, x1
    mov x6, x4
    add x1, x1, 8
    st x6, x1
    end
)", "arith.s");
  KernelResult r = launch(sim(), p, {kOut}, 1);
  REQUIRE(r.ok);
  auto got = read_gm<int64_t>(sim(), kOut, 13);
  const uint64_t ua = static_cast<uint64_t>(a);
  std::vector<int64_t> want = {a + b,
                               a - 100,
                               big * b,
                               a / b,  // C++ truncates toward zero: -3
                               a % b,  // -1
                               big & 0xff00,
                               a | 0xf0,
                               big ^ a,
                               static_cast<int64_t>(static_cast<uint64_t>(big) << 4),
                               static_cast<int64_t>(ua >> 60),  // logical shift: 15
                               std::min(a, b),
                               std::max(a, b),
                               big};
  CHECK(got == want);
}

TEST_CASE("branches and loops: sum, factorial and a counted loop with bge/bne/beq/jmp") {
  isa::Program p = isa::assemble(R"(
.arg out
.arg n
.section aiv
    ldarg x1, out
    ldarg x2, n
    movi x3, 0          ; i
    movi x4, 0          ; sum
sum_loop:
    add x3, x3, 1
    add x4, x4, x3
    blt x3, x2, sum_loop
    st x4, x1
    movi x3, 1          ; factorial of 10 by a down-counting loop
    movi x5, 10
fact:
    beq x5, 0, fact_done
    mul x3, x3, x5
    sub x5, x5, 1
    jmp fact
fact_done:
    add x1, x1, 8
    st x3, x1
    movi x6, 0          ; fibonacci: F(30) with bne
    movi x7, 1
    movi x8, 0
fib:
    add x9, x6, x7
    mov x6, x7
    mov x7, x9
    add x8, x8, 1
    bne x8, 30, fib
    add x1, x1, 8
    st x6, x1
    bge x8, 31, skip    ; not taken: 30 < 31
    movi x10, 77
skip:
    add x1, x1, 8
    st x10, x1
    end
)", "loops.s");
  const uint64_t n = 100;
  KernelResult r = launch(sim(), p, {kOut, n}, 1);
  REQUIRE(r.ok);
  auto got = read_gm<int64_t>(sim(), kOut, 4);
  int64_t sum = 0, fact = 1, f0 = 0, f1 = 1;
  for (uint64_t i = 1; i <= n; ++i) sum += static_cast<int64_t>(i);
  for (int i = 2; i <= 10; ++i) fact *= i;
  for (int i = 0; i < 30; ++i) {
    int64_t t = f0 + f1;
    f0 = f1;
    f1 = t;
  }
  CHECK(got == std::vector<int64_t>{sum, fact, f0, 77});
}

namespace {
// Each block writes {block id, block num, subblock id, core id, arg} at out + 40 * block.
const char* kIdsKernel = R"(
.arg out
.arg tag
.section aiv
    ldarg x1, out
    get_block_id x2
    get_block_num x3
    get_subblock_id x4
    get_core_id x5
    ldarg x6, tag
    mul x7, x2, 40
    add x1, x1, x7
    st x2, x1
    add x1, x1, 8
    st x3, x1
    add x1, x1, 8
    st x4, x1
    add x1, x1, 8
    st x5, x1
    add x1, x1, 8
    st x6, x1
    end
)";
constexpr uint64_t kIdsScalarInsns = 17;  // instructions before `end`, one issue slot each
}  // namespace

TEST_CASE("get_block_id / get_block_num / ldarg with fewer blocks than cores") {
  isa::Program p = isa::assemble(kIdsKernel, "ids.s");
  KernelResult r = launch(sim(), p, {kOut, 0xabcd}, 3);
  REQUIRE(r.ok);
  for (int b = 0; b < 3; ++b) {
    auto v = read_gm<int64_t>(sim(), kOut + 40 * b, 5);
    // Initially block b runs on vector core b (blocks are handed out in core order).
    CHECK(v == std::vector<int64_t>{b, 3, 0, b, 0xabcd});
  }
  // Scalar-only blocks: each takes one issue slot (scalar_cycles_per_insn = 1) per instruction.
  const ChipConfig& cfg = sim().config();
  CHECK(r.cycles == test::task_overhead(cfg) +
                        kIdsScalarInsns * static_cast<uint64_t>(cfg.scalar_cycles_per_insn));
  CHECK(counter(r.counters, "chip.aiv0.blocks") == 1);
  CHECK(counter(r.counters, "chip.aiv3.blocks") == 0);
  CHECK(counter(r.counters, "chip.aiv1.s.insn.st") == 5);
  CHECK(counter(r.counters, "chip.aiv2.s.busy_cycles") == kIdsScalarInsns);
}

TEST_CASE("block_dim larger than the number of cores: free cores take the next block") {
  isa::Program p = isa::assemble(kIdsKernel, "ids.s");
  const int blocks = 10, cores = sim().config().core_kind(isa::CoreKind::AIV)->count;
  REQUIRE(cores == 4);
  KernelResult r = launch(sim(), p, {kOut, 7}, blocks);
  REQUIRE(r.ok);
  for (int b = 0; b < blocks; ++b) {
    auto v = read_gm<int64_t>(sim(), kOut + 40 * b, 5);
    // All blocks take equally long, so block b runs on core b % 4 in round b / 4.
    CHECK(v == std::vector<int64_t>{b, blocks, 0, b % cores, 7});
  }
  // ceil(10 / 4) = 3 rounds of one block each, each block after its block start.
  CHECK(r.cycles == test::task_overhead(sim().config(), 3) + 3 * kIdsScalarInsns);
  CHECK(counter(r.counters, "chip.aiv0.blocks") == 3);
  CHECK(counter(r.counters, "chip.aiv1.blocks") == 3);
  CHECK(counter(r.counters, "chip.aiv2.blocks") == 2);
  CHECK(counter(r.counters, "chip.aiv3.blocks") == 2);
  CHECK(counter(r.counters, "chip.aiv0.active_cycles") == 3 * kIdsScalarInsns);
}

TEST_CASE("results reach GM through the UB: vdup of a scalar result, then copy_ub2gm") {
  // Block b computes (b + 1) * 1000 + n and stores 8 s32 copies of it through the UB.
  isa::Program p = isa::assemble(R"(
.arg out
.arg n
.section aiv
    ldarg x1, out
    ldarg x2, n
    get_block_id x3
    add x4, x3, 1
    mul x4, x4, 1000
    add x4, x4, x2
    movi x5, 0              ; UB address
    set_mask_count 8        ; 8 lanes of s32 = one 32-byte block
    vdup.s32 x5, x4, 1, 1, 8
    set_flag v, mte3, 0
    wait_flag v, mte3, 0
    mul x6, x3, 32
    add x1, x1, x6
    copy_ub2gm x1, x5, 1, 1, 0, 0
    end
)", "ub_out.s");
  KernelResult r = launch(sim(), p, {kOut, 42}, 4);
  REQUIRE(r.ok);
  for (int b = 0; b < 4; ++b) {
    auto v = read_gm<int32_t>(sim(), kOut + 32 * b, 8);
    CHECK(v == std::vector<int32_t>(8, (b + 1) * 1000 + 42));
  }
  CHECK(counter(r.counters, "chip.aiv2.mte3.bytes.ub_to_gm") == 32);
  CHECK(counter(r.counters, "chip.aiv2.v.insn.vdup") == 1);
}

TEST_CASE("a second Simulator in the same process is refused") {
  sim();
  CHECK_THROWS_AS(Simulator(load_chip_config("tiny"), SimOptions{}), Error);
}
