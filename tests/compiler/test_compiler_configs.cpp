// The same ops compiled for two configs that differ only in buffer sizes (the tiny chip, and
// the tiny chip with half its UB and a quarter of L0A / L0B / L1; tiny: 4 vector cores, so each
// core's range spans several tiles) and run on both chip
// models: the kernels differ (tile sizes), the numbers are bit-identical, the cycle counts
// differ. SystemC elaborates one chip per process, so each config runs in a forked child that
// sends its outputs and cycles back through a pipe.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "sim/config/chip_config.h"
#include "tests/common/child_process.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::DataType;
using compiler::TensorDesc;

namespace {

const std::vector<std::string> kSmallBuffers = {
    "cores.aiv.buffers.ub=96 KiB", "cores.aic.buffers.l0a=16 KiB",
    "cores.aic.buffers.l0b=16 KiB", "cores.aic.buffers.l1=128 KiB"};

struct OpRun {
  compiler::OpDesc op;
  std::vector<HostTensor> inputs;
};

// Integer values: every sum below is exact in fp32 whatever its order, so results must agree
// bit for bit however the k / row chunks of the two tilings split them.
HostTensor integers(DataType dt, std::vector<int64_t> shape, double lo, double hi,
                    uint32_t seed) {
  HostTensor t = random_tensor(dt, std::move(shape), lo, hi, seed);
  for (double& v : t.values) v = std::round(v);
  return t;
}

std::vector<OpRun> workload() {
  std::vector<OpRun> v;
  // Element-wise: the tile follows the UB (a broadcast row resident, two streamed tensors).
  HostTensor a = random_tensor(DataType::F32, {6, 20000}, -4, 4, 1);
  HostTensor b = random_tensor(DataType::F32, {20000}, -4, 4, 2);
  v.push_back({make_op("AddV2", {a.desc, b.desc}), {a, b}});
  // MatMul: k per mmad and per L1 chunk follow L0A / L0B / L1.
  HostTensor x = integers(DataType::F16, {160, 1024}, -4, 4, 3);
  HostTensor w = integers(DataType::F16, {1024, 96}, -4, 4, 4);
  v.push_back({make_op("MatMul", {x.desc, w.desc}), {x, w}});
  // A reduction (rows kernel, super-row groups sized by the UB).
  HostTensor r = integers(DataType::F32, {300, 700}, -100, 100, 5);
  v.push_back({make_op("Sum", {r.desc}, {{"axes", std::vector<int64_t>{1}}}), {r}});
  return v;
}

// What a child reports per op: the launches' summaries, total cycles, the output bytes.
struct Report {
  std::string summaries;
  uint64_t cycles = 0;
  std::vector<uint8_t> out;
};

void put(std::string& s, const void* p, size_t n) { s.append(static_cast<const char*>(p), n); }
void put_blob(std::string& s, const std::string& b) {
  const uint64_t n = b.size();
  put(s, &n, 8);
  s += b;
}
std::string get_blob(const std::string& s, size_t& at) {
  uint64_t n = 0;
  std::memcpy(&n, s.data() + at, 8);
  at += 8;
  std::string b = s.substr(at, n);
  at += n;
  return b;
}

// Runs in the child: no Catch assertions (they would not reach the parent); errors are sent.
std::string run_config(const std::vector<std::string>& overrides) {
  Simulator sim(load_chip_config("tiny", overrides), SimOptions{});
  std::string msg;
  for (const OpRun& r : workload()) {
    compiler::CompiledKernel k = compiler::compile(r.op, sim.config());
    GmArena arena;
    std::vector<uint64_t> in_addr, out_addr;
    for (const HostTensor& t : r.inputs) {
      std::vector<uint8_t> bytes = encode(t);
      in_addr.push_back(arena.alloc(bytes.size()));
      sim.gm().write(in_addr.back(), bytes.data(), bytes.size());
    }
    for (const TensorDesc& t : k.outputs) out_addr.push_back(arena.alloc(t.bytes()));
    const uint64_t ws = k.workspace_bytes ? arena.alloc(k.workspace_bytes) : 0;
    std::string summaries;
    uint64_t cycles = 0;
    for (const compiler::Launch& l : k.launches) {
      KernelLaunch kl;
      kl.program = &l.kernel.program;
      kl.args = l.bind(in_addr, out_addr, ws);
      kl.block_dim = l.block_dim;
      KernelResult kr = sim.run(kl);
      if (!kr.ok) throw Error(r.op.str() + ": " + kr.error);
      cycles += kr.cycles;
      summaries += l.summary + "\n";
    }
    std::string out(k.outputs[0].bytes(), '\0');
    sim.gm().read(out_addr[0], out.data(), out.size());
    put_blob(msg, summaries);
    put(msg, &cycles, 8);
    put_blob(msg, out);
  }
  return msg;
}

std::vector<Report> run_config_in_child(const std::vector<std::string>& overrides) {
  const std::string text = test::run_in_child([&] { return run_config(overrides); });
  std::vector<Report> reports;
  size_t at = 0;
  while (at < text.size()) {
    Report r;
    r.summaries = get_blob(text, at);
    std::memcpy(&r.cycles, text.data() + at, 8);
    at += 8;
    const std::string out = get_blob(text, at);
    r.out.assign(out.begin(), out.end());
    reports.push_back(std::move(r));
  }
  return reports;
}

}  // namespace

TEST_CASE("two configs with different buffer sizes: same numbers, other tiles and cycles") {
  const std::vector<Report> base = run_config_in_child({});
  const std::vector<Report> small = run_config_in_child(kSmallBuffers);
  const std::vector<OpRun> ops = workload();
  REQUIRE(base.size() == ops.size());
  REQUIRE(small.size() == ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    INFO(ops[i].op.str() << " on tiny:\n"
                         << base[i].summaries << base[i].cycles << " cycles\nsmall buffers:\n"
                         << small[i].summaries << small[i].cycles << " cycles");
    CHECK(base[i].summaries != small[i].summaries);  // the tiling follows the buffers
    CHECK(base[i].out == small[i].out);              // bit-identical results
    CHECK(base[i].cycles != small[i].cycles);
  }
}
