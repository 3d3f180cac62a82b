// Fused attention (ops/attention.cpp): FlashAttentionScore / PromptFlashAttention /
// IncreFlashAttention against softmax attention computed here in double, on the test chip.
//
// Error bound per output element (derived from the kernel's numerics, ops/attention.cpp): the
// kernel rounds the probabilities P (<= 1 after the running max is subtracted) to the input type
// before P V, so O moves by at most u_in * sum_j p_j |v_j| / l <= u_in * max|v| (u_in = 2^-11 for
// f16, 2^-8 for bf16: half an ulp relative); O is rounded once to the output type (u_in * |O|);
// scores and sums in f32 over at most a few hundred terms add about 1e-5 relative to p, and vexp
// in f32 a few f32 ulps: 1e-4 * max|v| covers both. check_within_bounds allows twice the bound.
#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/attention.h"
#include "tests/compiler/compiler_test_util.h"

using namespace npusim;
using namespace npusim::test;
using compiler::AttrValue;

namespace {

struct Case {
  std::string op = "FlashAttentionScore";
  DataType dt = DataType::F16;
  int64_t batch = 1, seq_q = 1, seq_kv = 1, heads = 1, kv_heads = 1, dim = 16;
  int64_t sparse_mode = 0;  // 0 none, 2 causal left-up, 3 causal right-down
  int64_t actual_len = 0;   // IncreFlashAttention: valid keys
  double scale = 0;         // 0: the default 1 / sqrt(dim)
  // IncreFlashAttention with its lengths a device input (no attribute): one per batch entry of
  // this type; the kernel clamps them to [1, seq_kv].
  std::vector<int64_t> lens = {};
  DataType len_type = DataType::S32;
};

OpDesc attention_op(const Case& c) {
  std::vector<TensorDesc> in = {{c.dt, {c.batch, c.seq_q, c.heads, c.dim}},
                                {c.dt, {c.batch, c.seq_kv, c.kv_heads, c.dim}},
                                {c.dt, {c.batch, c.seq_kv, c.kv_heads, c.dim}}};
  std::map<std::string, AttrValue> attrs = {{"input_layout", std::string("BSND")}};
  if (c.scale != 0) attrs["scale_value"] = c.scale;
  if (c.op == "IncreFlashAttention") {
    in.push_back({c.len_type, {c.batch}});
    if (c.lens.empty())
      attrs["actual_seq_lengths"] =
          std::vector<int64_t>(static_cast<size_t>(c.batch), c.actual_len);
  } else {
    attrs["sparse_mode"] = c.sparse_mode;
  }
  return make_op(c.op, in, attrs);
}

// O[b, i, n, :] = sum_j softmax_j(scale * q . k_j + mask) v_j, in double; bound[e] as derived at
// the top of the file.
void reference(const Case& c, const HostTensor& q, const HostTensor& k, const HostTensor& v,
               std::vector<double>& out, std::vector<double>& bound) {
  const double scale = c.scale != 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.dim));
  const double u = c.dt == DataType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
  const int64_t kv_len = c.op == "IncreFlashAttention" ? c.actual_len : c.seq_kv;
  const int64_t offset = c.sparse_mode == 3 ? c.seq_kv - c.seq_q : 0;
  const int64_t group = c.heads / c.kv_heads;
  out.assign(q.values.size(), 0);
  bound.assign(q.values.size(), 0);
  auto qi = [&](int64_t b, int64_t i, int64_t n) {
    return ((b * c.seq_q + i) * c.heads + n) * c.dim;
  };
  auto ki = [&](int64_t b, int64_t j, int64_t n) {
    return ((b * c.seq_kv + j) * c.kv_heads + n) * c.dim;
  };
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t n = 0; n < c.heads; ++n)
      for (int64_t i = 0; i < c.seq_q; ++i) {
        const int64_t kvh = n / group;
        int64_t keys = kv_len;
        if (!c.lens.empty())
          keys = std::clamp<int64_t>(c.lens[static_cast<size_t>(b)], 1, c.seq_kv);
        if (c.sparse_mode != 0) keys = std::min(kv_len, i + offset + 1);
        std::vector<double> s(static_cast<size_t>(keys));
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < c.dim; ++d)
            acc += q.values[qi(b, i, n) + d] * k.values[ki(b, j, kvh) + d];
          s[j] = acc * scale;
          mx = std::max(mx, s[j]);
        }
        double l = 0;
        for (double& x : s) l += (x = std::exp(x - mx));
        double vmax = 0;
        for (int64_t d = 0; d < c.dim; ++d) {
          double acc = 0;
          for (int64_t j = 0; j < keys; ++j) {
            acc += s[j] * v.values[ki(b, j, kvh) + d];
            vmax = std::max(vmax, std::fabs(v.values[ki(b, j, kvh) + d]));
          }
          out[qi(b, i, n) + d] = acc / l;
        }
        for (int64_t d = 0; d < c.dim; ++d)
          bound[qi(b, i, n) + d] = (u + 1e-4) * vmax + u * std::fabs(out[qi(b, i, n) + d]);
      }
}

struct Inputs {
  HostTensor q, k, v;
  std::vector<HostTensor> all(const Case& c) const {
    std::vector<HostTensor> r = {q, k, v};
    if (c.op == "IncreFlashAttention" && c.lens.empty())
      r.push_back(HostTensor{
          TensorDesc{DataType::S32, {c.batch}},
          std::vector<double>(static_cast<size_t>(c.batch), static_cast<double>(c.actual_len))});
    else if (c.op == "IncreFlashAttention")
      r.push_back(HostTensor{TensorDesc{c.len_type, {c.batch}},
                             std::vector<double>(c.lens.begin(), c.lens.end())});
    return r;
  }
};

Inputs make_inputs(const Case& c, uint32_t seed) {
  // Scores of a few units (|q . k| * scale up to ~3) so the softmax is neither flat nor one-hot.
  return {random_tensor(c.dt, {c.batch, c.seq_q, c.heads, c.dim}, -1, 1, seed),
          random_tensor(c.dt, {c.batch, c.seq_kv, c.kv_heads, c.dim}, -1, 1, seed + 1),
          random_tensor(c.dt, {c.batch, c.seq_kv, c.kv_heads, c.dim}, -2, 2, seed + 2)};
}

// Compiles and runs c; checks O against the reference. A coupled chip: the refusal, and no
// launches.
compiler::CompiledKernel check_case(const Case& c, uint32_t seed) {
  const OpDesc op = attention_op(c);
  INFO(op.str());
  if (!runs_mix_kernel(op)) return {};
  compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
  REQUIRE(k.launches.size() == 1);
  INFO(k.launches[0].summary);
  const Inputs in = make_inputs(c, seed);
  RunResult r = run_compiled(test_sim(), k, in.all(c));
  std::vector<double> want, bound;
  reference(c, in.q, in.k, in.v, want, bound);
  check_within_bounds(r.outputs[0].values, want, bound, "O");
  return k;
}

// The value of counter `path` ("chip.hbm.read_bytes") in a counter tree.
uint64_t counter(const nlohmann::json& tree, const std::string& path) {
  const nlohmann::json* n = &tree;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t dot = path.find('.', pos);
    if (dot == std::string::npos) dot = path.size();
    n = &n->at(path.substr(pos, dot - pos));
    pos = dot + 1;
  }
  return n->is_object() ? n->at("value").get<uint64_t>() : n->get<uint64_t>();
}

}  // namespace

// Fields in order: op, dtype, batch, seq_q, seq_kv, heads, kv_heads, dim, sparse_mode,
// actual_len, scale.
TEST_CASE("fused attention without a mask, odd sequence lengths") {
  // Neither length a multiple of 16 or of the key tile.
  check_case({"FlashAttentionScore", DataType::F16, 1, 40, 77, 2, 2, 32, 0}, 1);
}

TEST_CASE("fused attention, causal prefill over several row blocks and key tiles, GQA") {
  // 150 positions: two row blocks and two key tiles, neither full.
  check_case({"PromptFlashAttention", DataType::F16, 2, 150, 150, 4, 2, 64, 3}, 11);
}

TEST_CASE("fused attention, bf16, causal right-down with a longer key sequence") {
  // The queries are the last 70 positions: query i sees keys <= i + 130.
  check_case({"FlashAttentionScore", DataType::BF16, 1, 70, 200, 2, 1, 16, 3, 0, 0.3}, 21);
}

TEST_CASE("fused attention, causal left-up mask") {
  check_case({"FlashAttentionScore", DataType::F16, 1, 33, 90, 1, 1, 48, 2}, 31);
}

TEST_CASE("IncreFlashAttention: one decode step against a KV cache, query heads grouped") {
  for (DataType dt : {DataType::F16, DataType::BF16}) {
    // A cache of 300 positions of which 201 are valid (the rest is garbage).
    const compiler::CompiledKernel k = check_case(
        {"IncreFlashAttention", dt, 2, 1, 300, 8, 2, 64, 0, 201}, 41 + static_cast<uint32_t>(dt));
    if (!k.launches.empty())
      CHECK(k.launches[0].summary.find("groups of 4 heads") != std::string::npos);
  }
}

// The lengths in device memory (as the plugin runs the op): one kernel compiled for the cache's
// shape serves every length, per batch entry, clamped to [1, seq_kv].
TEST_CASE("IncreFlashAttention reads its lengths from device memory: one kernel, any length") {
  for (DataType lt : {DataType::S32, DataType::S64}) {
    Case c{"IncreFlashAttention", DataType::F16, 2, 1, 300, 8, 2, 64, 0, 0};
    c.len_type = lt;
    c.lens = {1, 1};
    const OpDesc op = attention_op(c);
    INFO(op.str());
    if (!runs_mix_kernel(op)) continue;
    const compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
    REQUIRE(k.launches.size() == 1);
    const Inputs in = make_inputs(c, 61 + static_cast<uint32_t>(lt));
    for (const std::vector<int64_t>& lens :
         {std::vector<int64_t>{201, 201}, {1, 300}, {64, 129}, {0, 500}, {-7, 65}}) {
      c.lens = lens;
      INFO("lengths " << lens[0] << ", " << lens[1]);
      RunResult r = run_compiled(test_sim(), k, in.all(c));
      std::vector<double> want, bound;
      reference(c, in.q, in.k, in.v, want, bound);
      check_within_bounds(r.outputs[0].values, want, bound, "O");
    }
  }
}

TEST_CASE("fused attention keeps the score matrix out of HBM") {
  // Causal prefill, 1024 tokens, 2 heads of 64: S is 2 x 1024 x 1024 f32 = 8 MiB per pass; Q,
  // K, V and O are 4 x 1024 x 2 x 64 x 2 bytes = 1 MiB. HBM (L2 misses; L2 starts cold, a write
  // to a missing line goes to HBM) sees Q, K, V and O once and the workspace (two S, P and P V
  // tiles per mix group, written and re-read in L2) once: a size set by the mix groups, not by
  // the number of tiles, and below S.
  const Case c{"FlashAttentionScore", DataType::F16, 1, 1024, 1024, 2, 2, 64, 3};
  const OpDesc op = attention_op(c);
  if (!runs_mix_kernel(op)) return;
  compiler::CompiledKernel k = compiler::compile(op, test_sim().config());
  const Inputs in = make_inputs(c, 51);
  const nlohmann::json before = test_sim().counters();
  run_compiled(test_sim(), k, in.all(c));
  const nlohmann::json after = test_sim().counters();
  const uint64_t hbm =
      counter(after, "chip.hbm.read_bytes") + counter(after, "chip.hbm.write_bytes") -
      counter(before, "chip.hbm.read_bytes") - counter(before, "chip.hbm.write_bytes");
  const uint64_t qkvo = 4 * in.q.desc.bytes();
  const uint64_t scores = static_cast<uint64_t>(c.heads * c.seq_q * c.seq_kv * 4);
  INFO("HBM bytes " << hbm << ", Q K V O " << qkvo << ", workspace " << k.workspace_bytes << ", S "
                    << scores);
  // Slack: L2 lines (512 bytes) at the tensors' edges may be touched twice.
  CHECK(hbm <= qkvo + k.workspace_bytes + 64 * 1024);
  CHECK(hbm < qkvo + scores);  // S never went to HBM, not even once
}

TEST_CASE("fused attention refuses what it does not support") {
  Case c;
  c.seq_q = c.seq_kv = 16;
  c.dim = 24;  // not a multiple of 16
  CHECK(compile_refusal(attention_op(c)).message.find("head_dim 24") != std::string::npos);
  c.dim = 16;
  c.heads = 3;
  c.kv_heads = 2;
  CHECK(compile_refusal(attention_op(c)).invalid);
  c.heads = 2;
  c.kv_heads = 1;
  c.seq_q = 20;
  c.sparse_mode = 3;  // more queries than keys
  CHECK(compile_refusal(attention_op(c)).invalid);
}

// The cube computes S_{j+1} before it waits for both vector cores' P_j, so one vector core may
// publish P_j and P_{j+1} before the other publishes P_j. Cross-core flags count per id: if both
// vector cores set one id, the cube's two waits could both take the faster core's sets and read
// the other core's rows of P_j before they are written. Each wait of the cube for its vector
// cores must name an id of its own (one per vector core), and the vector cores must set each.
TEST_CASE("fused attention: the cube waits for each vector core's P rows on that core's flag") {
  const ChipConfig& cfg = test_sim().config();
  for (const Case& c : {Case{"PromptFlashAttention", DataType::F16, 1, 150, 150, 4, 2, 64, 3},
                        Case{"IncreFlashAttention", DataType::F16, 2, 1, 300, 8, 2, 64, 0, 201}}) {
    const OpDesc op = attention_op(c);
    INFO(op.str());
    if (!runs_mix_kernel(op)) continue;
    REQUIRE(cfg.aiv_per_aic >= 2);
    const compiler::CompiledKernel k = compiler::compile(op, cfg);
    REQUIRE(k.launches.size() == 1);
    const isa::Program& prog = k.launches[0].kernel.program;
    const isa::Section* aic = prog.find(isa::CoreKind::AIC);
    const isa::Section* aiv = prog.find(isa::CoreKind::AIV);
    REQUIRE(aic != nullptr);
    REQUIRE(aiv != nullptr);
    std::set<int64_t> set_by_vector;
    for (const isa::Instruction& in : aiv->code)
      if (in.op == isa::Opcode::op_cc_set) set_by_vector.insert(in.ops[2].value);
    // Runs of back-to-back cc_waits: the cube waiting for its vector cores.
    int runs = 0;
    for (size_t i = 0; i < aic->code.size(); ++i) {
      if (aic->code[i].op != isa::Opcode::op_cc_wait) continue;
      std::set<int64_t> ids;
      size_t n = 0;
      for (; i < aic->code.size() && aic->code[i].op == isa::Opcode::op_cc_wait; ++i, ++n)
        ids.insert(aic->code[i].ops[1].value);
      ++runs;
      CHECK(n == static_cast<size_t>(cfg.aiv_per_aic));
      CHECK(ids.size() == n);  // one id per vector core, none waited for twice
      for (int64_t id : ids) CHECK(set_by_vector.count(id) == 1);
    }
    CHECK(runs >= 1);
  }
}
