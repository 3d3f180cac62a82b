// The streaming element-wise skeleton (ops/elementwise.h) built directly from a StreamSpec and
// run on the chip model: a kernel with several outputs of different types whose values come
// from an intermediate kept in a UB temporary, against a reference in plain C++ that does the
// same fp32 operations (each rounded to f32) and rounds the f16 output once (RNE), so the
// tolerance is 0.
#include <catch2/catch.hpp>

#include <map>
#include <utility>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/elementwise.h"
#include "sim/config/chip_config.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;
using isa::Dtype;
using isa::Opcode;

namespace {

// p = x * s (f32, a UB temporary); out0 = p + x (f32), out1 = p as f16. x: [n], s: one element
// (a resident input).
compiler::ops::StreamSpec two_output_spec(int64_t n) {
  compiler::ops::StreamSpec spec;
  spec.kernel_name = "TwoOutputs_f32";
  spec.inputs = compiler::ops::stream_inputs(
      {TensorDesc{DataType::F32, {n}}, TensorDesc{DataType::F32, {1}}}, {n});
  spec.out_type = Dtype::F32;
  spec.more_out_types = {Dtype::F16};
  spec.out_shape = {n};
  spec.temps = {compiler::ops::TempSpec{"x * s", 4, 0}};
  spec.compute = [](compiler::KernelBuilder& b, const compiler::ops::TileOperands& t) {
    const compiler::Reg& c = *t.count;
    compiler::ops::vec_binary(b, Opcode::op_vmul, Dtype::F32, t.temp[0], t.in[0], t.in[1], c);
    compiler::ops::vec_binary(b, Opcode::op_vadd, Dtype::F32, t.outs[0], t.temp[0], t.in[0], c);
    compiler::ops::vec_convert(b, Dtype::F16, Dtype::F32, t.outs[1], t.temp[0], RoundMode::kRint,
                               c);
  };
  return spec;
}

}  // namespace

TEST_CASE("a stream kernel stores every output of every tile and block") {
  const ChipConfig& cfg = test_sim().config();
  // Several tiles per block, and on the tiny (4 vector cores) and 910b (48) chips the blocks'
  // ranges would end inside an f16 block if they were cut at the f32 output's granule (8
  // elements) instead of the f16 output's (16).
  const int64_t n = 700000;
  const compiler::ops::StreamSpec spec = two_output_spec(n);
  compiler::CompiledKernel k;
  k.outputs = {TensorDesc{DataType::F32, {n}}, TensorDesc{DataType::F16, {n}}};
  k.launches.push_back(compiler::ops::build_stream_kernel("TwoOutputs", spec, cfg));
  const compiler::Launch& l = k.launches[0];
  INFO(l.summary);
  CHECK(l.summary.find("of f32 + f16") != std::string::npos);
  REQUIRE(l.args.size() == 4);  // in0, in1, out, out1
  CHECK(l.args[3].kind == compiler::ArgRef::Kind::kOutput);
  CHECK(l.args[3].index == 1);

  const HostTensor x = random_tensor(DataType::F32, {n}, -4, 4, 17);
  const HostTensor s{TensorDesc{DataType::F32, {1}}, {1.3125}};
  const RunResult r = run_compiled(test_sim(), k, {x, s});
  std::vector<double> want_sum(static_cast<size_t>(n)), want_half(static_cast<size_t>(n));
  for (size_t i = 0; i < want_sum.size(); ++i) {
    const float p = static_cast<float>(x.values[i]) * static_cast<float>(s.values[0]);
    want_sum[i] = static_cast<float>(p + static_cast<float>(x.values[i]));
    want_half[i] = round_to(DataType::F16, p);
  }
  check_close(r.outputs[0].values, want_sum, 0, 0, "out0 = x * s + x");
  check_close(r.outputs[1].values, want_half, 0, 0, "out1 = f16(x * s)");
}

TEST_CASE("stream L2 policy: noalloc streams larger than a kept L2, normal ones that fit") {
  // An L2 of 1 MiB. in0 is flat (4 bytes per element), in1 resident (gathered once: always
  // normal); the outputs take 4 + 2 bytes per element.
  // The policy applies when the L2 is kept across launches or written back; on a cold,
  // write-through L2 (the tiny preset's) every stream is normal.
  const ChipConfig cfg =
      load_chip_config("tiny", {"memory.l2.bytes=1 MiB", "memory.l2.keep_across_launches=true"});
  REQUIRE(cfg.l2_bytes == 1u << 20);
  {
    const ChipConfig cold = load_chip_config("tiny", {"memory.l2.bytes=1 MiB"});
    const compiler::Launch l =
        compiler::ops::build_stream_kernel("TwoOutputs", two_output_spec(262144), cold);
    for (const isa::Section& s : l.kernel.program.sections)
      for (const isa::Instruction& in : s.code)
        if (isa::field_index(in.op, "l2") >= 0)
          CHECK(in.ops[static_cast<size_t>(isa::field_index(in.op, "l2"))].value == 0);
  }
  struct Case {
    int64_t n;
    isa::L2Hint in, out;
  };
  const Case cases[] = {
      {65536, isa::L2Hint::NORMAL, isa::L2Hint::NORMAL},     // 640 KiB in all
      {131072, isa::L2Hint::NOALLOC, isa::L2Hint::NORMAL},   // 1.25 MiB; outputs 768 KiB
      {262144, isa::L2Hint::NOALLOC, isa::L2Hint::NOALLOC},  // outputs alone 1.5 MiB
  };
  for (const Case& c : cases) {
    INFO("n = " << c.n);
    const compiler::Launch l =
        compiler::ops::build_stream_kernel("TwoOutputs", two_output_spec(c.n), cfg);
    int loads[3] = {0, 0, 0}, stores[3] = {0, 0, 0};
    for (const isa::Section& s : l.kernel.program.sections)
      for (const isa::Instruction& in : s.code) {
        const int i = isa::field_index(in.op, "l2");
        if (in.op == Opcode::op_copy_gm2ub) ++loads[in.ops[static_cast<size_t>(i)].value];
        if (in.op == Opcode::op_copy_ub2gm) ++stores[in.ops[static_cast<size_t>(i)].value];
      }
    // Flat in0's tile loads (ping and pong) carry c.in (in1, one element, is broadcast by the
    // scalar unit, not copied).
    CHECK(loads[static_cast<int>(c.in)] == 2);
    CHECK(loads[0] + loads[1] + loads[2] == 2);
    // Both outputs, ping and pong: 4 stores, all with c.out.
    CHECK(stores[static_cast<int>(c.out)] == 4);
  }
}

// emit_staggered_first_tile (the stream kernels' and the channel sums' staggered first tiles),
// run on the scalar unit for every block b of B: ceil((b + 1) * units / B) units, so
// nondecreasing, at least one unit, the last block a whole tile, and the phases spread evenly
// over the tile: every phase of min(units, B) taken, by floor or ceil(B / units) blocks. E.g.
// the 910b's BNTrainingReduceGrad of 8x56x56x256 f16: 48 blocks, tiles of 32 periods of 256
// channels (the rule before the even spread, (b + 1) * max(1, units / B) units, left blocks 31
// to 47 at a whole tile, 17 blocks in phase), and of 8x7x7x2048 f16: 44 blocks, tiles of 2
// periods (rounding down with a one-unit floor gave 43 blocks one unit, in step).
TEST_CASE("staggered first tiles: the blocks' phases spread evenly over a tile") {
  const ChipConfig& cfg = test_sim().config();
  const int64_t unit = 256;
  for (const auto& [blocks, units] : std::vector<std::pair<int64_t, int64_t>>{
           {48, 32}, {48, 30}, {24, 64}, {4, 7}, {40, 40}, {44, 2}, {48, 36}}) {
    INFO(blocks << " blocks, " << units << " units a tile");
    compiler::KernelBuilder b("stagger", "Stagger", cfg);
    b.declare_arg("out");
    b.begin_section(b.vector_core_kind());
    compiler::Reg out = b.load_arg("out"), block = b.reg("block"), limit = b.reg("limit");
    for (int64_t k = 0; k < blocks; ++k) {
      b.movi(block, k);
      compiler::ops::emit_staggered_first_tile(b, limit, block, blocks, units, unit);
      b.emit(Opcode::op_st, {limit, out});
      b.add(out, out, 8);
    }
    b.end();
    const std::vector<int64_t> v =
        run_scalar_words(test_sim(), b.finish().program, static_cast<size_t>(blocks));
    const int64_t most = (blocks + units - 1) / units;
    std::map<int64_t, int64_t> phases;
    for (int64_t k = 0; k < blocks; ++k) {
      const int64_t first = v[static_cast<size_t>(k)];
      CHECK(first % unit == 0);
      CHECK(first >= unit);
      if (k > 0) CHECK(first >= v[static_cast<size_t>(k - 1)]);
      ++phases[first];
    }
    CHECK(v.back() == units * unit);
    CHECK(static_cast<int64_t>(phases.size()) == std::min(units, blocks));
    for (const auto& [first, n] : phases) {
      INFO("first tile " << first);
      CHECK(n <= most);
      CHECK(n >= blocks / units);
    }
  }
}

// StreamSpec::stagger_first_tiles: block b of B takes (b + 1) / B of a tile first, then whole
// tiles. The values are the unstaggered kernel's (tile boundaries only); where the vector cores'
// GM -> UB ports together outrun HBM and a load's set_flag holds MTE2 until the tile has landed,
// blocks in step leave HBM idle during every round trip, and staggered ones do not: fewer cycles
// (elsewhere, e.g. the tiny chip's 4 ports at 32 B/cycle against its HBM, it is not taken).
TEST_CASE("stream kernel: staggered first tiles, the same values, HBM busier") {
  const ChipConfig& cfg = test_sim().config();
  const isa::CoreKind vk = cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE;
  const int cores = cfg.core_kind(vk)->count;
  const int64_t n = int64_t{cores} * 32768 + 40;  // several tiles per block
  compiler::ops::StreamSpec spec = two_output_spec(n);
  compiler::CompiledKernel plain;
  plain.outputs = {TensorDesc{DataType::F32, {n}}, TensorDesc{DataType::F16, {n}}};
  compiler::CompiledKernel staggered = plain;
  plain.launches.push_back(compiler::ops::build_stream_kernel("TwoOutputs", spec, cfg));
  spec.stagger_first_tiles = true;
  staggered.launches.push_back(compiler::ops::build_stream_kernel("TwoOutputs", spec, cfg));
  INFO(staggered.launches[0].summary);
  REQUIRE(staggered.launches[0].block_dim == cores);

  const HostTensor x = random_tensor(DataType::F32, {n}, -4, 4, 23);
  const HostTensor s{TensorDesc{DataType::F32, {1}}, {0.8125}};
  const RunResult a = run_compiled(test_sim(), plain, {x, s});
  const RunResult b = run_compiled(test_sim(), staggered, {x, s});
  check_close(b.outputs[0].values, a.outputs[0].values, 0, 0, "out0, staggered vs not");
  check_close(b.outputs[1].values, a.outputs[1].values, 0, 0, "out1, staggered vs not");
  WARN("plain " << a.cycles << " cycles, staggered " << b.cycles << "; GM -> UB ports "
                << cores * cfg.path_rate(isa::Buf::GM, isa::Buf::UB) << " B/cycle, HBM "
                << cfg.hbm_sustained_bytes_per_cycle());
  if (compiler::ops::load_round_trips_idle_hbm(cfg, cores))
    CHECK(b.cycles < a.cycles);
  else  // not staggered where it cannot pay
    CHECK(b.cycles == a.cycles);
}
