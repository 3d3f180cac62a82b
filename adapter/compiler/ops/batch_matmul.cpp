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

// An Einsum equation, parsed: the operands' terms, their labels with "..." expanded, the
// output's labels and every label's size (1 broadcasts against n).
struct EinsumEquation {
  std::string eq;
  std::vector<std::string> terms, in_labels;
  std::string out_labels;
  std::map<char, int64_t> size;
  bool in_out(char c) const { return out_labels.find(c) != std::string::npos; }
  int64_t product(const std::string& labels) const {
    int64_t p = 1;
    for (char c : labels) p *= size.at(c);
    return p;
  }
};

// The equation's operand terms (split at ','), checked against the inputs.
std::vector<std::string> einsum_terms(const OpDesc& op, const std::string& eq, size_t arrow) {
  std::vector<std::string> terms;
  const std::string lhs = eq.substr(0, arrow);
  size_t start = 0;
  for (size_t c = lhs.find(','); c != std::string::npos; c = lhs.find(',', start)) {
    terms.push_back(lhs.substr(start, c - start));
    start = c + 1;
  }
  terms.push_back(lhs.substr(start));
  if (terms.size() != op.inputs.size())
    op.invalid(fmt::format("equation '{}' names {} operands, {} inputs given", eq, terms.size(),
                           op.inputs.size()));
  if (terms.size() > 2) op.fail("Einsum with more than two operands is not supported");
  return terms;
}

// Label sizes from the inputs (1 broadcasts against n for generated and batch labels).
void einsum_sizes(const OpDesc& op, EinsumEquation& e) {
  for (size_t i = 0; i < e.terms.size(); ++i) {
    const std::string& l = e.in_labels[i];
    for (size_t d = 0; d < l.size(); ++d) {
      if (std::count(l.begin(), l.end(), l[d]) > 1)
        op.fail(fmt::format("label '{}' repeats within operand '{}' (diagonals are not "
                            "supported)",
                            l[d], e.terms[i]));
      const int64_t s = op.inputs[i].shape[d];
      auto it = e.size.find(l[d]);
      if (it == e.size.end() || it->second == 1) e.size[l[d]] = s;
      else if (s != 1 && s != it->second)
        op.invalid(fmt::format("label '{}' has sizes {} and {}", l[d], it->second, s));
    }
  }
}

EinsumEquation parse_einsum(const OpDesc& op) {
  EinsumEquation e;
  e.eq = op.attr_string("equation", "");
  e.eq.erase(std::remove(e.eq.begin(), e.eq.end(), ' '), e.eq.end());
  const size_t arrow = e.eq.find("->");
  if (e.eq.empty() || arrow == std::string::npos)
    op.invalid(fmt::format("equation '{}' must have the form 'in[,in]->out'", e.eq));
  e.terms = einsum_terms(op, e.eq, arrow);
  const DataType dt = op.inputs[0].dtype;
  for (const TensorDesc& t : op.inputs)
    if (t.dtype != dt)
      op.fail(fmt::format("inputs have different dtypes ({} and {})", data_type_name(dt),
                          data_type_name(t.dtype)));
  size_t ell = 0;
  for (size_t i = 0; i < e.terms.size(); ++i)
    e.in_labels.push_back(
        expand_ellipsis(op, e.terms[i], op.inputs[i].shape.size(), &ell, false));
  // Re-expand inputs now that the widest ellipsis is known (right-aligned generated labels).
  for (size_t i = 0; i < e.terms.size(); ++i)
    e.in_labels[i] = expand_ellipsis(op, e.terms[i], op.inputs[i].shape.size(), &ell, false);
  e.out_labels = expand_ellipsis(op, e.eq.substr(arrow + 2), 0, &ell, true);
  einsum_sizes(op, e);
  return e;
}

// The labels of a two-operand equation by role: batch (in both inputs and the output, in output
// order), contracted (in both inputs only), free in x, free in y.
struct EinsumRoles {
  std::string batch, contract, free_x, free_y;
};

EinsumRoles einsum_roles(const OpDesc& op, const EinsumEquation& e) {
  const std::string& lx = e.in_labels[0];
  const std::string& ly = e.in_labels[1];
  EinsumRoles r;
  for (char c : e.out_labels)
    if (lx.find(c) != std::string::npos && ly.find(c) != std::string::npos) r.batch += c;
  for (char c : lx) {
    const bool in_y = ly.find(c) != std::string::npos;
    if (in_y && !e.in_out(c)) r.contract += c;
    else if (!in_y && e.in_out(c)) r.free_x += c;
    else if (!in_y) op.fail(fmt::format("label '{}' is summed within x (not supported)", c));
  }
  for (char c : ly) {
    const bool in_x = lx.find(c) != std::string::npos;
    if (!in_x && e.in_out(c)) r.free_y += c;
    else if (!in_x) op.fail(fmt::format("label '{}' is summed within y (not supported)", c));
  }
  return r;
}

// Operand i as BatchMatMulV2 takes it: [batch, free, contract] (adj false for x, true for y) or
// [batch, contract, free]; the operand as it is when one of the two matches its own label order,
// else transposed into the workspace.
struct EinsumOperand {
  ArgRef ref;
  std::vector<int64_t> shape;
  bool adj = false;
};

EinsumOperand einsum_operand(const CompileContext& ctx, const EinsumEquation& e,
                             const EinsumRoles& r, int i, LaunchPlan& plan) {
  const OpDesc& op = ctx.op;
  const TensorDesc& t = op.inputs[static_cast<size_t>(i)];
  const std::string& labels = e.in_labels[static_cast<size_t>(i)];
  const bool is_x = i == 0;
  const std::string& free = is_x ? r.free_x : r.free_y;
  const std::string a = r.batch + free + r.contract, b = r.batch + r.contract + free;
  // x: [.., M, K] is adj false; y: [.., K, N] is adj false.
  const std::string plain = is_x ? a : b, adjusted = is_x ? b : a;
  EinsumOperand o;
  std::string target = plain;
  // Without contracted labels both orders name the same labels (an outer product, "i,j->ij"):
  // keep the plain one, whose shape puts the free dims where BatchMatMul reads them.
  if (labels == adjusted && labels != plain) {
    target = adjusted;
    o.adj = true;
  }
  for (char c : r.batch) o.shape.push_back(t.shape[labels.find(c)]);  // (1 broadcasts)
  const int64_t f = e.product(free), k = e.product(r.contract);
  // x plain and y adjusted are [batch, free, contract]; the other two [batch, contract, free].
  if (is_x != o.adj) o.shape.insert(o.shape.end(), {f, k});
  else o.shape.insert(o.shape.end(), {k, f});
  if (labels == target) {
    o.ref = LaunchPlan::input(i);
    return o;
  }
  std::vector<int64_t> perm;
  for (char c : target) perm.push_back(static_cast<int64_t>(labels.find(c)));
  o.ref = plan.workspace(t.bytes());
  append_transpose(plan, op.str(), ctx.cfg, t.dtype, t.shape, perm, LaunchPlan::input(i), o.ref);
  return o;
}

CompiledKernel compile_einsum(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  const EinsumEquation e = parse_einsum(op);
  const DataType dt = op.inputs[0].dtype;
  std::vector<int64_t> out_shape;
  for (char c : e.out_labels) {
    if (!e.size.count(c)) op.invalid(fmt::format("output label '{}' is in no input", c));
    if (std::count(e.out_labels.begin(), e.out_labels.end(), c) > 1)
      op.invalid(fmt::format("output label '{}' repeats", c));
    out_shape.push_back(e.size.at(c));
  }
  LaunchPlan plan({TensorDesc{dt, out_shape}});
  if (e.terms.size() == 1) {  // a permutation
    const std::string& l = e.in_labels[0];
    if (l.size() != e.out_labels.size())
      op.fail(fmt::format("equation '{}' sums over a label of its operand (not supported)",
                          e.eq));
    std::vector<int64_t> perm;
    for (char c : e.out_labels) perm.push_back(static_cast<int64_t>(l.find(c)));
    append_transpose(plan, op.str(), ctx.cfg, dt, op.inputs[0].shape, perm, LaunchPlan::input(0),
                     LaunchPlan::output(0));
    return std::move(plan).finish();
  }
  const EinsumRoles r = einsum_roles(op, e);
  const EinsumOperand x = einsum_operand(ctx, e, r, 0, plan);
  const EinsumOperand y = einsum_operand(ctx, e, r, 1, plan);
  OpDesc mm;
  mm.type = "BatchMatMulV2";
  mm.inputs = {TensorDesc{dt, x.shape}, TensorDesc{dt, y.shape}};
  mm.attrs = {{"adj_x", x.adj}, {"adj_y", y.adj}};
  const CompiledKernel sub = compile(mm, ctx.cfg, ctx.precision);
  const std::string result = r.batch + r.free_x + r.free_y;
  if (result == e.out_labels) {
    plan.add(sub, {x.ref, y.ref}, {LaunchPlan::output(0)}, "BatchMatMulV2");
    return std::move(plan).finish();
  }
  std::vector<int64_t> result_shape;
  for (char c : result) result_shape.push_back(e.size.at(c));
  const ArgRef c = plan.workspace(static_cast<uint64_t>(dims_product(result_shape)) *
                                  static_cast<uint64_t>(data_type_bytes(dt)));
  plan.add(sub, {x.ref, y.ref}, {c}, "BatchMatMulV2");
  std::vector<int64_t> perm;
  for (char ch : e.out_labels) perm.push_back(static_cast<int64_t>(result.find(ch)));
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
