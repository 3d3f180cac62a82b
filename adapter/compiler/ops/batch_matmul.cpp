// Batched matrix products on the cube:
//   BatchMatMulV2 (x, y; attrs adj_x, adj_y): x [..., M, K] (adj_x: [..., K, M]),
//     y [..., K, N] (adj_y: [..., N, K]), batch dims broadcast (numpy), output [..., M, N].
//     BatchMatMul (v1) is the same without broadcasting (equal batch dims). One cube kernel
//     covers every product: MatMul's tiling and pipeline (ops/matmul.*) with the tiles of all
//     products spread over the cube cores; each tile finds its product's A / B / C offsets from
//     the batch index (broadcast dims have stride 0). Precision modes, f32 casts and numerics
//     as MatMul (ops/matmul.cpp): f16 / bf16 / f32 with fp32 accumulation.
//   Einsum (attr equation; one or two inputs) for the equations that are a BatchMatMul plus
//     transposes: with two operands, every label must appear in both inputs (batch if also in
//     the output, contracted if not) or in one input and the output (a free dim of that side);
//     "..." stands for broadcast batch dims (numpy rules), in both inputs and the output. Each
//     operand is transposed (ops/transpose.h) to [batch, free, contracted] or [batch,
//     contracted, free] (no copy when it already is, using adj_x / adj_y), multiplied, and the
//     product [batch, free_x, free_y] transposed to the output's order. One operand: a pure
//     permutation ("ij->ji"). Not supported (compile error): a label summed within one operand
//     (e.g. "ij->i"), repeated labels in one operand (diagonals, "ii->i"), three or more
//     operands.
#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "adapter/compiler/ops/assemble.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/matmul.h"
#include "adapter/compiler/ops/registry.h"
#include "adapter/compiler/ops/transpose.h"

namespace npusim::compiler::ops {

namespace {

CompiledKernel compile_bmm(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (op.inputs.size() != 2) op.fail(fmt::format("takes 2 inputs, {} given", op.inputs.size()));
  const TensorDesc& x = op.inputs[0];
  const TensorDesc& y = op.inputs[1];
  const DataType dt = x.dtype;
  if (y.dtype != dt)
    op.fail(fmt::format("inputs have different dtypes ({} and {})", data_type_name(dt),
                        data_type_name(y.dtype)));
  if (auto t = op.attr_type("T"); t && *t != dt)
    op.fail(fmt::format("attribute T = {} does not match the inputs' {}", data_type_name(*t),
                        data_type_name(dt)));
  if (x.shape.size() < 2 || y.shape.size() < 2)
    op.invalid(fmt::format("inputs {} and {} must have rank >= 2", x.str(), y.str()));
  const bool adj_x = op.attr_bool("adj_x", false), adj_y = op.attr_bool("adj_y", false);
  const size_t rx = x.shape.size(), ry = y.shape.size();
  const int64_t m = adj_x ? x.shape[rx - 1] : x.shape[rx - 2];
  const int64_t k = adj_x ? x.shape[rx - 2] : x.shape[rx - 1];
  const int64_t ky = adj_y ? y.shape[ry - 1] : y.shape[ry - 2];
  const int64_t n = adj_y ? y.shape[ry - 2] : y.shape[ry - 1];
  if (k != ky)
    op.invalid(fmt::format("inner dimensions differ: x gives k = {}, y gives k = {}", k, ky));
  const std::vector<int64_t> bx(x.shape.begin(), x.shape.end() - 2);
  const std::vector<int64_t> by(y.shape.begin(), y.shape.end() - 2);
  std::vector<int64_t> batch;
  if (op.type == "BatchMatMul") {
    if (bx != by)
      op.invalid(fmt::format("batch dims {} and {} differ (BatchMatMul does not broadcast; "
                             "BatchMatMulV2 does)",
                             shape_str(bx), shape_str(by)));
    batch = bx;
  } else {
    auto b = broadcast_shapes(bx, by);
    if (!b)
      op.invalid(fmt::format("batch dims {} and {} are not broadcast-compatible", shape_str(bx),
                             shape_str(by)));
    batch = *b;
  }
  std::vector<int64_t> out_shape = batch;
  out_shape.insert(out_shape.end(), {m, n});
  MatmulProblem p;
  p.m = m;
  p.n = n;
  p.k = k;
  p.trans_a = adj_x;
  p.trans_b = adj_y;
  p.a_count = dims_product(bx);
  p.b_count = dims_product(by);
  // Batch strides of each operand (elements), right-aligned; 0 where it broadcasts.
  auto strides = [&](const std::vector<int64_t>& own, int64_t matrix) {
    std::vector<int64_t> s(batch.size(), 0);
    int64_t stride = matrix;
    for (size_t i = 0; i < own.size(); ++i) {
      const size_t od = own.size() - 1 - i, bd = batch.size() - 1 - i;
      if (own[od] != 1) s[bd] = stride;
      stride *= own[od];
    }
    return s;
  };
  if (dims_product(batch) != 1) {
    p.batch_dims = batch;
    p.a_batch_strides = strides(bx, m * k);
    p.b_batch_strides = strides(by, k * n);
  }
  return matmul_launches(ctx, dt, p, TensorDesc{dt, out_shape});
}

// ---- Einsum ----

// One operand's labels with "..." expanded into generated labels (upper-case letters are
// taken, so generated labels are digits '0'.. right-aligned: the last ellipsis dim is '0' +
// ell - 1 ... the labels match across operands as numpy aligns broadcast dims).
std::string expand_ellipsis(const OpDesc& op, const std::string& term, size_t rank,
                            size_t* ell_rank, bool output) {
  const size_t at = term.find("...");
  std::string labels = term;
  if (at == std::string::npos) {
    if (!output && term.size() != rank)
      op.invalid(fmt::format("operand '{}' has {} labels but the input has rank {}", term,
                             term.size(), rank));
    return labels;
  }
  if (term.find("...", at + 3) != std::string::npos)
    op.invalid(fmt::format("operand '{}' has more than one ellipsis", term));
  const size_t explicit_labels = term.size() - 3;
  size_t e = output ? *ell_rank : rank - explicit_labels;
  if (!output && explicit_labels > rank)
    op.invalid(fmt::format("operand '{}' has more labels than the input's rank {}", term, rank));
  if (!output) *ell_rank = std::max(*ell_rank, e);
  std::string gen;
  for (size_t i = 0; i < e; ++i) gen += static_cast<char>('0' + (*ell_rank - e + i));
  return term.substr(0, at) + gen + term.substr(at + 3);
}

CompiledKernel compile_einsum(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  std::string eq = op.attr_string("equation", "");
  eq.erase(std::remove(eq.begin(), eq.end(), ' '), eq.end());
  const size_t arrow = eq.find("->");
  if (eq.empty() || arrow == std::string::npos)
    op.invalid(fmt::format("equation '{}' must have the form 'in[,in]->out'", eq));
  std::vector<std::string> terms;
  {
    const std::string lhs = eq.substr(0, arrow);
    size_t start = 0;
    for (size_t c = lhs.find(','); c != std::string::npos; c = lhs.find(',', start)) {
      terms.push_back(lhs.substr(start, c - start));
      start = c + 1;
    }
    terms.push_back(lhs.substr(start));
  }
  if (terms.size() != op.inputs.size())
    op.invalid(fmt::format("equation '{}' names {} operands, {} inputs given", eq, terms.size(),
                           op.inputs.size()));
  if (terms.size() > 2) op.fail("Einsum with more than two operands is not supported");
  const DataType dt = op.inputs[0].dtype;
  for (const TensorDesc& t : op.inputs)
    if (t.dtype != dt)
      op.fail(fmt::format("inputs have different dtypes ({} and {})", data_type_name(dt),
                          data_type_name(t.dtype)));
  size_t ell = 0;
  std::vector<std::string> in_labels;
  for (size_t i = 0; i < terms.size(); ++i)
    in_labels.push_back(expand_ellipsis(op, terms[i], op.inputs[i].shape.size(), &ell, false));
  // Re-expand inputs now that the widest ellipsis is known (right-aligned generated labels).
  for (size_t i = 0; i < terms.size(); ++i)
    in_labels[i] = expand_ellipsis(op, terms[i], op.inputs[i].shape.size(), &ell, false);
  const std::string out_labels = expand_ellipsis(op, eq.substr(arrow + 2), 0, &ell, true);
  // Label sizes (1 broadcasts against n for generated and batch labels).
  std::map<char, int64_t> size;
  for (size_t i = 0; i < terms.size(); ++i) {
    const std::string& l = in_labels[i];
    for (size_t d = 0; d < l.size(); ++d) {
      if (std::count(l.begin(), l.end(), l[d]) > 1)
        op.fail(fmt::format("label '{}' repeats within operand '{}' (diagonals are not "
                            "supported)",
                            l[d], terms[i]));
      const int64_t s = op.inputs[i].shape[d];
      auto it = size.find(l[d]);
      if (it == size.end() || it->second == 1) size[l[d]] = s;
      else if (s != 1 && s != it->second)
        op.invalid(fmt::format("label '{}' has sizes {} and {}", l[d], it->second, s));
    }
  }
  std::vector<int64_t> out_shape;
  for (char c : out_labels) {
    if (!size.count(c)) op.invalid(fmt::format("output label '{}' is in no input", c));
    if (std::count(out_labels.begin(), out_labels.end(), c) > 1)
      op.invalid(fmt::format("output label '{}' repeats", c));
    out_shape.push_back(size[c]);
  }
  const TensorDesc out{dt, out_shape};
  LaunchPlan plan({out});
  auto in_out = [&](char c) { return out_labels.find(c) != std::string::npos; };

  if (terms.size() == 1) {  // a permutation
    const std::string& l = in_labels[0];
    if (l.size() != out_labels.size())
      op.fail(fmt::format("equation '{}' sums over a label of its operand (not supported)", eq));
    std::vector<int64_t> perm;
    for (char c : out_labels) perm.push_back(static_cast<int64_t>(l.find(c)));
    append_transpose(plan, op.str(), ctx.cfg, dt, op.inputs[0].shape, perm, LaunchPlan::input(0),
                     LaunchPlan::output(0));
    return std::move(plan).finish();
  }

  const std::string& lx = in_labels[0];
  const std::string& ly = in_labels[1];
  std::string batch, contract, free_x, free_y;
  for (char c : out_labels)  // batch labels in output order
    if (lx.find(c) != std::string::npos && ly.find(c) != std::string::npos) batch += c;
  for (char c : lx) {
    const bool in_y = ly.find(c) != std::string::npos;
    if (in_y && !in_out(c)) contract += c;
    else if (!in_y && in_out(c)) free_x += c;
    else if (!in_y) op.fail(fmt::format("label '{}' is summed within x (not supported)", c));
  }
  for (char c : ly) {
    const bool in_x = lx.find(c) != std::string::npos;
    if (!in_x && in_out(c)) free_y += c;
    else if (!in_x) op.fail(fmt::format("label '{}' is summed within y (not supported)", c));
  }
  // Operands as [batch, free, contract] (adj false for x, true for y) or [batch, contract,
  // free]; keep the operand as it is when one of the two matches its own label order.
  auto prepare = [&](int i, const std::string& labels, const std::string& free, bool is_x,
                     bool* adj) -> std::pair<ArgRef, std::vector<int64_t>> {
    const TensorDesc& t = op.inputs[static_cast<size_t>(i)];
    const std::string a = batch + free + contract, b = batch + contract + free;
    // x: [.., M, K] is adj false; y: [.., K, N] is adj false.
    const std::string plain = is_x ? a : b, adjusted = is_x ? b : a;
    std::string target = plain;
    *adj = false;
    if (labels == adjusted) {
      target = adjusted;
      *adj = true;
    }
    std::vector<int64_t> shape;
    for (char c : batch) {
      const size_t at = labels.find(c);
      shape.push_back(t.shape[at]);  // this operand's size (1 broadcasts)
    }
    auto prod = [&](const std::string& ls) {
      int64_t p = 1;
      for (char c : ls) p *= size[c];
      return p;
    };
    const bool free_first = target == a;
    const int64_t f = prod(free), k = prod(contract);
    if (free_first) shape.insert(shape.end(), {f, k});
    else shape.insert(shape.end(), {k, f});
    if (labels == target) return {LaunchPlan::input(i), shape};
    std::vector<int64_t> perm;
    for (char c : target) perm.push_back(static_cast<int64_t>(labels.find(c)));
    const ArgRef ws = plan.workspace(t.bytes());
    append_transpose(plan, op.str(), ctx.cfg, dt, t.shape, perm, LaunchPlan::input(i), ws);
    return {ws, shape};
  };
  bool adj_x = false, adj_y = false;
  auto [xr, xs] = prepare(0, lx, free_x, true, &adj_x);
  auto [yr, ys] = prepare(1, ly, free_y, false, &adj_y);
  OpDesc mm;
  mm.type = "BatchMatMulV2";
  mm.inputs = {TensorDesc{dt, xs}, TensorDesc{dt, ys}};
  mm.attrs = {{"adj_x", adj_x}, {"adj_y", adj_y}};
  const CompiledKernel sub = compile(mm, ctx.cfg, ctx.precision);
  const std::string result = batch + free_x + free_y;
  std::vector<int64_t> result_shape;
  for (char c : result) result_shape.push_back(size[c]);
  if (result == out_labels) {
    plan.add(sub, {xr, yr}, {LaunchPlan::output(0)}, "BatchMatMulV2");
    return std::move(plan).finish();
  }
  const ArgRef c = plan.workspace(static_cast<uint64_t>(dims_product(result_shape)) *
                                  static_cast<uint64_t>(data_type_bytes(dt)));
  plan.add(sub, {xr, yr}, {c}, "BatchMatMulV2");
  std::vector<int64_t> perm;
  for (char ch : out_labels) perm.push_back(static_cast<int64_t>(result.find(ch)));
  append_transpose(plan, op.str(), ctx.cfg, dt, result_shape, perm, c, LaunchPlan::output(0));
  return std::move(plan).finish();
}

}  // namespace

CompiledKernel compile_batch_matmul(const CompileContext& ctx) {
  const std::string& t = ctx.op.type;
  if (t == "BatchMatMulV2" || t == "BatchMatMul") return compile_bmm(ctx);
  if (t == "Einsum") return compile_einsum(ctx);
  ctx.op.fail("internal: not a batch matmul op");
}

}  // namespace npusim::compiler::ops
