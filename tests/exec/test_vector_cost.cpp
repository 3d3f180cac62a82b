// Cost of V instructions (latency, per-repeat time, op factors, UB bank conflicts, bytes) and
// the faults plan() raises. The unit-test chip (tests/common/test_chip.h): vector latency 8
// cycles, 256 B/cycle (one repeat per cycle), reduce factor 2, transcendental factor 1, UB of
// 192 KiB in 48 banks of 32 B, UB alignment 32 B.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "tests/exec/test_vector_util.h"

using namespace npusim;
using namespace npusim::test;
using isa::Dtype;
using isa::Opcode;

namespace {

VecOp vbin(Opcode op, Dtype t, uint64_t dst, uint64_t src0, uint64_t src1, int64_t repeat,
           VectorMask mask = {}) {
  return VecOp(op, {{"type", dt(t)}, {"xdst", int64_t(dst)}, {"xsrc0", int64_t(src0)},
                    {"xsrc1", int64_t(src1)}, {"repeat", repeat}, {"dst_blk", 1},
                    {"src0_blk", 1}, {"src1_blk", 1}, {"dst_rep", 8}, {"src0_rep", 8},
                    {"src1_rep", 8}},
               mask);
}
VecOp vun(Opcode op, Dtype t, uint64_t dst, uint64_t src, int64_t repeat, int64_t dst_blk = 1,
          int64_t src_blk = 1, int64_t dst_rep = 8, int64_t src_rep = 8) {
  return VecOp(op, {{"type", dt(t)}, {"xdst", int64_t(dst)}, {"xsrc", int64_t(src)},
                    {"repeat", repeat}, {"dst_blk", dst_blk}, {"src_blk", src_blk},
                    {"dst_rep", dst_rep}, {"src_rep", src_rep}});
}

// The brief's bank model, evaluated repeat by repeat: every 32-byte block of every operand is
// one access to bank (addr / 32) % banks; a repeat takes max(1, most accesses to one bank)
// cycles times the factor. Operands given as (base, blk stride, rep stride, blocks per repeat).
struct RefOperand {
  uint64_t base, blk_bytes, rep_bytes;
  int blocks;
};
uint64_t ref_repeat_cycles(const std::vector<RefOperand>& ops, uint64_t repeats, int banks,
                           uint64_t factor, uint64_t* conflict) {
  uint64_t total = 0;
  *conflict = 0;
  for (uint64_t r = 0; r < repeats; ++r) {
    std::vector<int> n(banks, 0);
    for (const RefOperand& o : ops)
      for (int b = 0; b < o.blocks; ++b)
        ++n[((o.base + r * o.rep_bytes + b * o.blk_bytes) / 32) % banks];
    uint64_t worst = *std::max_element(n.begin(), n.end());
    total += factor * std::max<uint64_t>(1, worst);
    *conflict += factor * (std::max<uint64_t>(1, worst) - 1);
  }
  return total;
}

void require_fault(VecHarness& h, VecOp& op, std::vector<std::string> words) {
  const std::vector<uint8_t> before = h.snapshot();
  try {
    plan(op.issued(), h.ctx);
    FAIL("no KernelFault");
  } catch (const KernelFault& e) {
    std::string msg = e.what();
    for (const std::string& w : words) {
      INFO("message: " << msg);
      CHECK(msg.find(w) != std::string::npos);
    }
  }
  CHECK(h.snapshot() == before);
}

}  // namespace

TEST_CASE("conflict-free element-wise cost: latency + one cycle per repeat") {
  VecHarness h;
  // dst 0x0 uses banks 8r..8r+7, src0 0x100 banks 8r+8.., src1 0x200 banks 8r+16.. (mod 48):
  // never the same bank, so 8 + 10 repeats * 1 = 18 cycles.
  VecOp op = vbin(Opcode::op_vadd, Dtype::F16, 0x0, 0x100, 0x200, 10);
  ExecCost c = plan(op.issued(), h.ctx);
  CHECK(c.cycles == 18);
  CHECK(c.bank_conflict_cycles == 0);
  CHECK(c.vector_repeats == 10);
  CHECK(c.bytes == 10 * 256);  // full mask: every lane written
  CHECK(c.path_src == isa::Buf::UB);
  CHECK(c.path_dst == isa::Buf::UB);
  CHECK(c.gm.empty());
}

TEST_CASE("bank conflicts: in-place and same-bank operands") {
  VecHarness h;
  uint64_t conflict = 0;
  SECTION("in place: dst == src0, two accesses per bank, 2 cycles per repeat") {
    // 8 + 10 * 2 = 28 cycles, of which 10 are conflicts.
    VecOp op = vbin(Opcode::op_vadd, Dtype::F32, 0x0, 0x0, 0x200, 10);
    ExecCost c = plan(op.issued(), h.ctx);
    CHECK(c.cycles == 28);
    CHECK(c.bank_conflict_cycles == 10);
  }
  SECTION("operands 48 blocks (1536 B) apart share banks: 3 cycles per repeat") {
    // 8 + 4 * 3 = 20 cycles, 8 of them conflicts.
    VecOp op = vbin(Opcode::op_vsub, Dtype::S16, 0x0, 1536, 3072, 4);
    ExecCost c = plan(op.issued(), h.ctx);
    CHECK(c.cycles == 20);
    CHECK(c.bank_conflict_cycles == 8);
  }
  SECTION("block stride 48: all 8 source blocks of a repeat in one bank") {
    // src at 0x6000 = block 768 = bank 0; blk stride 48 and rep stride 1 put repeat r's eight
    // blocks in bank r. dst at 0x100, contiguous: banks 8+8r..15+8r, never bank r for r < 3.
    // 8 cycles per repeat: 8 + 3 * 8 = 32, conflicts 3 * 7 = 21.
    VecOp op = vun(Opcode::op_vabs, Dtype::F16, 0x100, 0x6000, 3, 1, 48, 8, 1);
    ExecCost c = plan(op.issued(), h.ctx);
    CHECK(c.cycles == 32);
    CHECK(c.bank_conflict_cycles == 21);
    // The same as vexp with a transcendental factor of 3: 8 + 3 * (3 * 8) = 80 cycles,
    // conflicts 80 - 8 - 3 * 3 = 63.
    h.cfg.vector_transcendental_factor = 3;
    VecOp e = vun(Opcode::op_vexp, Dtype::F16, 0x100, 0x6000, 3, 1, 48, 8, 1);
    ExecCost ce = plan(e.issued(), h.ctx);
    CHECK(ce.cycles == 80);
    CHECK(ce.bank_conflict_cycles == 63);
  }
  SECTION("reduction: factor 2, and a result block colliding with the source") {
    // vcadd.f32, src 0x400 contiguous: repeat r reads banks 32+8r..39+8r (mod 48), i.e.
    // 32-39, 40-47, 0-7, 8-15; results at 0x0 + 4r all lie in block 0 (bank 0). Repeat 2
    // hits bank 0 twice. Cycles: 8 + 2 * (1 + 1 + 2 + 1) = 18, conflicts 2 * 1 = 2.
    VecOp op(Opcode::op_vcadd, {{"type", dt(Dtype::F32)}, {"xdst", 0}, {"xsrc", 0x400},
                                {"repeat", 4}, {"src_blk", 1}, {"src_rep", 8}});
    ExecCost c = plan(op.issued(), h.ctx);
    CHECK(c.cycles == 18);
    CHECK(c.bank_conflict_cycles == 2);
    CHECK(c.bytes == 16);
    CHECK(ref_repeat_cycles({{0x400, 32, 256, 8}, {0, 0, 4, 1}}, 4, 48, 2, &conflict) == 10);
  }
  SECTION("half the bandwidth (128 B/cycle): 2 cycles per repeat hide a 2-way conflict") {
    h.cfg.vector_bytes_per_cycle = 128;
    VecOp free_op = vbin(Opcode::op_vadd, Dtype::F32, 0x0, 0x100, 0x200, 10);
    VecOp in_place = vbin(Opcode::op_vadd, Dtype::F32, 0x0, 0x0, 0x200, 10);
    CHECK(plan(free_op.issued(), h.ctx).cycles == 8 + 10 * 2);
    ExecCost c = plan(in_place.issued(), h.ctx);
    CHECK(c.cycles == 8 + 10 * 2);
    CHECK(c.bank_conflict_cycles == 0);
  }
}

TEST_CASE("bank model matches a repeat-by-repeat evaluation for long and odd layouts") {
  VecHarness h;
  struct Layout {
    uint64_t dst, s0, s1;
    int64_t dst_blk, s0_blk, s1_blk, dst_rep, s0_rep, s1_rep;
    uint64_t n;  // f32 elements (counter mode; 64 lanes per repeat)
  };
  std::vector<Layout> layouts = {
      // ~1000 repeats: many periods of the bank pattern plus a remainder.
      {0, 40000, 110016, 1, 3, 2, 1, 2, 0, 1000 * 64 - 5},
      {0, 40000, 110016, 2, 1, 1, 3, 1, 2, 937 * 64},
  };
  std::mt19937 rng(11);
  for (int trial = 0; trial < 40; ++trial) {
    // Up to 24 repeats with strides below 60 blocks (extent < 56 KiB per operand).
    layouts.push_back({32 * (rng() % 100), 65536 + 32 * (rng() % 100), 131072 - 32 * (rng() % 100),
                       int64_t(rng() % 50), int64_t(rng() % 50), int64_t(rng() % 50),
                       int64_t(rng() % 60), int64_t(rng() % 60), int64_t(rng() % 60),
                       64 + rng() % 1472});
  }
  for (const Layout& l : layouts) {
    const uint64_t repeats = (l.n + 63) / 64;
    VecOp op(Opcode::op_vmul, {{"type", dt(Dtype::F32)}, {"xdst", int64_t(l.dst)},
                               {"xsrc0", int64_t(l.s0)}, {"xsrc1", int64_t(l.s1)}, {"repeat", 0},
                               {"dst_blk", l.dst_blk}, {"src0_blk", l.s0_blk},
                               {"src1_blk", l.s1_blk}, {"dst_rep", l.dst_rep},
                               {"src0_rep", l.s0_rep}, {"src1_rep", l.s1_rep}},
             counter_mask(l.n));
    ExecCost c = plan(op.issued(), h.ctx);
    uint64_t conflict = 0;
    uint64_t want = ref_repeat_cycles(
        {{l.dst, uint64_t(l.dst_blk) * 32, uint64_t(l.dst_rep) * 32, 8},
         {l.s0, uint64_t(l.s0_blk) * 32, uint64_t(l.s0_rep) * 32, 8},
         {l.s1, uint64_t(l.s1_blk) * 32, uint64_t(l.s1_rep) * 32, 8}},
        repeats, 48, 1, &conflict);
    INFO("repeats " << repeats << " strides " << l.dst_blk << "/" << l.s0_blk << "/" << l.s1_blk
                    << " " << l.dst_rep << "/" << l.s0_rep << "/" << l.s1_rep);
    CHECK(c.cycles == 8 + want);
    CHECK(c.bank_conflict_cycles == conflict);
    CHECK(c.vector_repeats == repeats);
    CHECK(c.bytes == l.n * 4);
  }
}

TEST_CASE("bytes, repeats and special cases of the cost") {
  VecHarness h;
  // Normal mask with 8 active lanes (lo = 0xff), f16, 3 repeats: 3 * 8 * 2 = 48 bytes.
  VecOp masked = vbin(Opcode::op_vadd, Dtype::F16, 0, 0x100, 0x200, 3, normal_mask(0, 0xff));
  CHECK(plan(masked.issued(), h.ctx).bytes == 48);
  // f32 has 64 lanes: the hi half of the mask is ignored. lo = 0xf: 4 lanes * 4 B * 2 reps.
  VecOp f32 = vbin(Opcode::op_vadd, Dtype::F32, 0, 0x100, 0x200, 2, normal_mask(~0ull, 0xf));
  CHECK(plan(f32.issued(), h.ctx).bytes == 32);
  // Counter mode 100 f32 elements: ceil(100 / 64) = 2 repeats (the repeat field, 9, is
  // ignored), 400 bytes; 8 + 2 = 10 cycles.
  VecOp counted = vbin(Opcode::op_vadd, Dtype::F32, 0, 0x100, 0x200, 9, counter_mask(100));
  ExecCost cc = plan(counted.issued(), h.ctx);
  CHECK(cc.vector_repeats == 2);
  CHECK(cc.bytes == 400);
  CHECK(cc.cycles == 10);
  // vcmp.f16, 3 repeats: 16 bytes of bits per repeat.
  VecOp cmp(Opcode::op_vcmp, {{"type", dt(Dtype::F16)}, {"cmp", 0}, {"xdst", 0x3000},
                              {"xsrc0", 0x100}, {"xsrc1", 0x200}, {"repeat", 3}, {"src0_blk", 1},
                              {"src1_blk", 1}, {"src0_rep", 8}, {"src1_rep", 8}});
  CHECK(plan(cmp.issued(), h.ctx).bytes == 48);
  // vtranspose: 512 bytes as two repeats; src 0x0 (banks 0-15), dst 0x200 (banks 16-31):
  // 8 + 2 = 10 cycles.
  VecOp tr(Opcode::op_vtranspose, {{"xdst", 0x200}, {"xsrc", 0}});
  ExecCost ct = plan(tr.issued(), h.ctx);
  CHECK(ct.cycles == 10);
  CHECK(ct.vector_repeats == 2);
  // vconv f32 -> f16: 64 lanes, source 8 blocks, destination 4 blocks per repeat.
  // 8 + 5 = 13 cycles; 5 * 64 * 2 = 640 bytes.
  VecOp conv(Opcode::op_vconv, {{"dst_type", dt(Dtype::F16)}, {"src_type", dt(Dtype::F32)},
                                {"xdst", 0x4000}, {"xsrc", 0x100}, {"repeat", 5}, {"dst_blk", 1},
                                {"src_blk", 1}, {"dst_rep", 4}, {"src_rep", 8}, {"round", 0}});
  ExecCost cv = plan(conv.issued(), h.ctx);
  CHECK(cv.cycles == 13);
  CHECK(cv.bytes == 640);
}

TEST_CASE("repeat 0 does nothing and costs the latency; nothing is checked for bounds") {
  VecHarness h;
  h.randomize(3);
  const std::vector<uint8_t> before = h.snapshot();
  // Beyond the UB end, but no byte is touched.
  VecOp op = vbin(Opcode::op_vadd, Dtype::F16, 0x40000, 0x100, 0x200, 0);
  ExecCost c = h.run(op);
  CHECK(c.cycles == 8);
  CHECK(c.bytes == 0);
  CHECK(c.vector_repeats == 0);
  CHECK(h.snapshot() == before);
  VecOp counted = vbin(Opcode::op_vadd, Dtype::F16, 0, 0x100, 0x200, 5, counter_mask(0));
  CHECK(h.run(counted).vector_repeats == 0);
  CHECK(h.snapshot() == before);
}

TEST_CASE("plan() does not touch the UB (timing-only runs skip execute)") {
  VecHarness h;
  h.randomize(4);
  const std::vector<uint8_t> before = h.snapshot();
  VecOp op = vbin(Opcode::op_vmul, Dtype::F32, 0, 0x100, 0x200, 20);
  plan(op.issued(), h.ctx);
  CHECK(h.snapshot() == before);
}

TEST_CASE("faults: out of bounds, misaligned, unsupported types and bad fields") {
  VecHarness h;
  const uint64_t ub = h.ub_bytes();  // 192 KiB
  SECTION("a source reaching past the UB end") {
    VecOp op = vbin(Opcode::op_vadd, Dtype::F16, 0, 0x100, ub - 224, 1);
    require_fault(h, op, {"vadd", "xsrc1", "ub"});
  }
  SECTION("the last repeat of the destination past the UB end") {
    // dst at ub - 8 * 256: 8 repeats fit exactly, 9 do not.
    VecOp fits = vbin(Opcode::op_vadd, Dtype::F16, ub - 2048, 0x100, 0x200, 8);
    CHECK_NOTHROW(plan(fits.issued(), h.ctx));
    VecOp op = vbin(Opcode::op_vadd, Dtype::F16, ub - 2048, 0x100, 0x200, 9);
    require_fault(h, op, {"vadd", "xdst", "9 repeats"});
  }
  SECTION("vcmp bit rows past the end") {
    VecOp op(Opcode::op_vcmp, {{"type", dt(Dtype::F16)}, {"cmp", 0}, {"xdst", int64_t(ub - 32)},
                               {"xsrc0", 0x100}, {"xsrc1", 0x200}, {"repeat", 3}, {"src0_blk", 1},
                               {"src1_blk", 1}, {"src0_rep", 8}, {"src1_rep", 8}});
    require_fault(h, op, {"vcmp", "xdst"});
  }
  SECTION("misaligned operand") {
    VecOp op = vbin(Opcode::op_vadd, Dtype::F16, 0, 0x110, 0x200, 1);
    require_fault(h, op, {"vadd", "xsrc0", "0x110", "32-byte aligned"});
  }
  SECTION("negative address") {
    VecOp op = vun(Opcode::op_vcopy, Dtype::F16, 0, 0, 1);
    op.set("xdst", -32);
    require_fault(h, op, {"vcopy", "xdst", "negative"});
  }
  SECTION("unsupported types") {
    VecOp div = vbin(Opcode::op_vdiv, Dtype::S16, 0, 0x100, 0x200, 1);
    require_fault(h, div, {"vdiv", "s16", "not supported", "f32 f16 bf16"});
    VecOp band = vbin(Opcode::op_vand, Dtype::F16, 0, 0x100, 0x200, 1);
    require_fault(h, band, {"vand", "f16"});
    VecOp add8 = vbin(Opcode::op_vadd, Dtype::S8, 0, 0x100, 0x200, 1);
    require_fault(h, add8, {"vadd", "s8"});
    VecOp exp = vun(Opcode::op_vexp, Dtype::S32, 0, 0x100, 1);
    require_fault(h, exp, {"vexp", "s32"});
    VecOp s64 = vun(Opcode::op_vcopy, Dtype::S64, 0, 0x100, 1);
    require_fault(h, s64, {"vcopy", "s64"});
    VecOp conv(Opcode::op_vconv, {{"dst_type", dt(Dtype::U8)}, {"src_type", dt(Dtype::S8)},
                                  {"xdst", 0}, {"xsrc", 0x100}, {"repeat", 1}, {"dst_blk", 1},
                                  {"src_blk", 1}, {"dst_rep", 8}, {"src_rep", 8}, {"round", 0}});
    require_fault(h, conv, {"vconv", "s8", "u8"});
  }
  SECTION("bad round mode, comparison and register-supplied field values") {
    VecOp conv(Opcode::op_vconv, {{"dst_type", dt(Dtype::F16)}, {"src_type", dt(Dtype::F32)},
                                  {"xdst", 0}, {"xsrc", 0x100}, {"repeat", 1}, {"dst_blk", 1},
                                  {"src_blk", 1}, {"dst_rep", 4}, {"src_rep", 8}, {"round", 5}});
    require_fault(h, conv, {"vconv", "round"});
    VecOp cmp(Opcode::op_vcmp, {{"type", dt(Dtype::F16)}, {"cmp", 6}, {"xdst", 0},
                                {"xsrc0", 0x100}, {"xsrc1", 0x200}, {"repeat", 1},
                                {"src0_blk", 1}, {"src1_blk", 1}, {"src0_rep", 8},
                                {"src1_rep", 8}});
    require_fault(h, cmp, {"vcmp", "cmp"});
    VecOp rep = vbin(Opcode::op_vadd, Dtype::F16, 0, 0x100, 0x200, 256);
    require_fault(h, rep, {"vadd", "repeat", "256", "255"});
    VecOp stride = vun(Opcode::op_vrelu, Dtype::F16, 0, 0x100, 1, 1, -1);
    require_fault(h, stride, {"vrelu", "src_blk"});
  }
  SECTION("a core without a vector pipe") {
    CoreKindConfig cube_only = h.cfg.core_kinds[0];
    cube_only.pipes = {isa::Pipe::S, isa::Pipe::M};
    ExecContext ctx{h.cfg, cube_only, h.mem, h.gm};
    VecOp op = vbin(Opcode::op_vadd, Dtype::F16, 0, 0x100, 0x200, 1);
    CHECK_THROWS_AS(plan(op.issued(), ctx), KernelFault);
  }
}

TEST_CASE("every V instruction of isa.def is planned and executed") {
  for (int i = 0; i < isa::kNumOpcodes; ++i) {
    auto op = static_cast<Opcode>(i);
    const isa::InstrDesc& d = isa::describe(op);
    if (d.pipe != isa::Pipe::V) continue;
    bool ok = false;
    // (type or dst_type, src_type): f16 <- f32 for vaddreluconv's one pair.
    for (auto [t, src] : {std::pair{Dtype::F32, Dtype::F32}, std::pair{Dtype::S16, Dtype::S16},
                          std::pair{Dtype::F16, Dtype::F32}}) {
      VecHarness h;
      h.cfg.vector_add_relu_conv = true;  // a chip with every V instruction
      h.cfg.vector_multiply_accumulate = true;
      VecOp o(op, {});
      for (size_t f = 0; f < d.fields.size(); ++f) {
        std::string name = d.fields[f].name;
        int64_t v = 0;
        if (name == "type" || name == "dst_type") v = dt(t);
        else if (name == "src_type") v = dt(src);
        else if (name == "repeat") v = 2;
        else if (name.find("_blk") != std::string::npos) v = 1;
        else if (name.find("_rep") != std::string::npos) v = 8;
        else if (name[0] == 'x' && name != "xscalar") v = 0x1000 * (f + 1);
        o.set(name.c_str(), v);
      }
      try {
        h.run(o);
        ok = true;
      } catch (const KernelFault& e) {
        INFO(d.mnemonic << "." << isa::dtype_name(t) << ": " << e.what());
      }
    }
    INFO(d.mnemonic);
    CHECK(ok);
  }
}
