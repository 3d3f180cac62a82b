// Generators: Fill, ZerosLike, OnesLike, Range.
//   Fill (attr dims; input value, a scalar): the output filled with value's bits (any dtype).
//   ZerosLike / OnesLike (input x): x's shape and dtype, all 0 / all 1 (bool true).
//     All three are splats into UB tiles (ops/assemble.h), stored block by block.
//   Range (attrs start, limit, delta: numbers; Tidx: s32, s64 (scalar unit, ops/int64.h) or f32, default s32 when all three
//     are integers, else f32): size as TF (integers: ceil(|limit - start| / |delta|); floats:
//     ceil(|(limit - start) / delta|) in the type). TF's CPU kernel accumulates, out[i] =
//     out[i-1] + delta, rounding each step. The vector kernel computes
//     out[i] = start + T(i) * delta (an iota built once by doubling, then vadds / vconv /
//     vmuls / vadds per tile), which equals TF's sequence for integers and whenever no partial
//     sum rounds (e.g. integral or dyadic steps). The compiler evaluates both sequences on the
//     host; when they differ (e.g. delta = 0.1) and the output has at most 4096 elements, the
//     kernel stores TF's values as immediates (movi + st, 8 bytes each); beyond that it fails.
// Operands TF passes as tensors that determine the shape (dims; start, limit, delta) are
// attributes (docs/compiler.md).
#include <cmath>
#include <cstring>
#include <variant>

#include <fmt/format.h>

#include "adapter/compiler/ops/assemble.h"
#include "adapter/compiler/ops/compose.h"
#include "adapter/compiler/ops/elementwise.h"
#include "adapter/compiler/ops/int64.h"
#include "adapter/compiler/ops/registry.h"
#include "common/convert.h"

namespace npusim::compiler::ops {

using isa::Dtype;
using isa::Opcode;

namespace {

constexpr int64_t kMaxImmediateRange = 4096;  // elements a Range may store as immediates

uint64_t one_bits(DataType t) {
  switch (t) {
    case DataType::F32: return 0x3f800000u;
    case DataType::F16: return 0x3c00u;
    case DataType::BF16: return 0x3f80u;
    default: return 1;
  }
}

CompiledKernel fill_kernel(const CompileContext& ctx, const TensorDesc& out, AsmFill fill) {
  CompiledKernel k;
  k.outputs = {out};
  if (out.num_elements() == 0) return k;
  AssembleSpec spec;
  spec.kernel_name = fmt::format("{}_{}", ctx.op.type, data_type_name(out.dtype));
  spec.dtype = out.dtype;
  spec.inputs = ctx.op.inputs;
  spec.out_shape = out.shape;
  spec.width = out.num_elements();
  AsmRegion r;
  r.col_hi = spec.width;
  r.fill = fill;
  spec.regions.push_back(r);
  k.launches.push_back(build_assemble_kernel(ctx.op.str(), spec, ctx.cfg));
  return k;
}

double number_attr(const OpDesc& op, const std::string& name) {
  auto it = op.attrs.find(name);
  if (it == op.attrs.end()) op.fail(fmt::format("attribute {} is missing", name));
  if (auto i = std::get_if<int64_t>(&it->second)) return static_cast<double>(*i);
  if (auto d = std::get_if<double>(&it->second)) return *d;
  op.fail(fmt::format("attribute {} must be a number", name));
}

bool is_int_attr(const OpDesc& op, const std::string& name) {
  auto it = op.attrs.find(name);
  return it != op.attrs.end() && std::holds_alternative<int64_t>(it->second);
}

// Range with values computed by the host, stored as 8-byte immediates by one vector core.
Launch range_immediates(const OpDesc& op, const std::vector<uint32_t>& bits,
                        const TensorDesc& out, const ChipConfig& cfg) {
  KernelBuilder b(fmt::format("Range_{}_immediates", data_type_name(out.dtype)), op.str(), cfg);
  b.begin_section(b.vector_core_kind());
  b.declare_arg("out", device_dtype(out.dtype), out.shape);
  Reg a = b.load_arg("out"), v = b.reg("two values");
  {
    KernelBuilder::Origin o(b, "TF's accumulated values, two per store");
    for (size_t i = 0; i < bits.size(); i += 2) {
      const uint64_t hi = i + 1 < bits.size() ? bits[i + 1] : 0;
      b.movi(v, static_cast<int64_t>(static_cast<uint64_t>(bits[i]) | hi << 32));
      b.emit(Opcode::op_st, {v, a});
      b.add(a, a, 8);
    }
  }
  b.end();
  Launch l;
  l.kernel = b.finish();
  l.block_dim = 1;
  l.args = {ArgRef{ArgRef::Kind::kOutput, 0, 0}};
  l.summary = fmt::format("Range: {} values stored as immediates (TF's accumulated sequence)",
                          bits.size());
  return l;
}

CompiledKernel compile_range(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  if (!op.inputs.empty())
    op.fail(fmt::format("takes no inputs (start, limit, delta are attributes), {} given",
                        op.inputs.size()));
  const double start = number_attr(op, "start"), limit = number_attr(op, "limit"),
               delta = number_attr(op, "delta");
  DataType dt = is_int_attr(op, "start") && is_int_attr(op, "limit") && is_int_attr(op, "delta")
                    ? DataType::S32
                    : DataType::F32;
  if (auto t = op.attr_type("Tidx")) dt = *t;
  if (dt == DataType::S64) {
    // Exact in int64 (the attributes may exceed 2^53): the scalar unit (ops/int64.h).
    for (const char* a : {"start", "limit", "delta"})
      if (!is_int_attr(op, a)) op.fail(fmt::format("s64 Range needs an integer attribute {}", a));
    const int64_t s = op.attr_int("start", 0), l = op.attr_int("limit", 0),
                  d = op.attr_int("delta", 0);
    if (d == 0) op.invalid("delta must not be 0");
    if (d > 0 ? s > l : s < l)
      op.invalid(fmt::format("start = {} and limit = {} are in the wrong order for delta = {}", s,
                             l, d));
    const uint64_t span = d > 0 ? static_cast<uint64_t>(l) - static_cast<uint64_t>(s)
                                : static_cast<uint64_t>(s) - static_cast<uint64_t>(l);
    const uint64_t step = d > 0 ? static_cast<uint64_t>(d) : 0 - static_cast<uint64_t>(d);
    return s64_range(ctx, s, d, static_cast<int64_t>((span + step - 1) / step));
  }
  if (dt != DataType::S32 && dt != DataType::F32)
    op.fail(fmt::format("Tidx = {} is not supported (s32, s64, f32)", data_type_name(dt)));
  if (delta == 0) op.invalid("delta must not be 0");
  if (delta > 0 ? start > limit : start < limit)
    op.invalid(fmt::format("start = {} and limit = {} are in the wrong order for delta = {}", start,
                           limit, delta));
  int64_t n = 0;
  std::vector<uint32_t> seq;  // TF's values (bits), and whether the vector formula matches
  bool formula_matches = true;
  if (dt == DataType::S32) {
    const int64_t s = static_cast<int64_t>(start), l = static_cast<int64_t>(limit),
                  d = static_cast<int64_t>(delta);
    if (s != start || l != limit || d != delta) op.fail("s32 Range needs integral attributes");
    n = (std::llabs(l - s) + std::llabs(d) - 1) / std::llabs(d);
  } else {
    const float s = static_cast<float>(start), l = static_cast<float>(limit),
                d = static_cast<float>(delta);
    n = static_cast<int64_t>(std::ceil(std::fabs((l - s) / d)));
    float val = s;
    for (int64_t i = 0; i < n; ++i) {
      const float formula = s + static_cast<float>(i) * d;
      uint32_t a, f;
      std::memcpy(&a, &val, 4);
      std::memcpy(&f, &formula, 4);
      if (a != f) formula_matches = false;
      if (n <= kMaxImmediateRange) seq.push_back(a);
      val += d;
    }
  }
  const TensorDesc out{dt, {n}};
  CompiledKernel k;
  k.outputs = {out};
  if (n == 0) return k;
  if (!formula_matches) {
    if (n > kMaxImmediateRange)
      op.fail(fmt::format("float Range of {} elements whose accumulated values (TF) differ from "
                          "start + i * delta is limited to {} elements",
                          n, kMaxImmediateRange));
    k.launches.push_back(range_immediates(op, seq, out, ctx.cfg));
    return k;
  }
  TileKernel::Options opt;
  opt.kernel_name = fmt::format("Range_{}", data_type_name(dt));
  opt.dtype = dt;
  opt.out_shape = out.shape;
  opt.runs = false;
  opt.temps = {{"iota", 4}, {"index", 4}};
  TileKernel tk(op.str(), opt, ctx.cfg);
  const Dtype type = device_dtype(dt);
  Launch l = tk.build(
      [&](TileKernel& t) {
        KernelBuilder& b = t.b();
        vec_scalar(b, Opcode::op_vadds, Dtype::S32, t.temp(1), t.temp(0), t.pos(), t.cnt());
        Reg s = b.reg_imm("delta", vector_scalar_bits(type, delta));
        if (type == Dtype::F32) {
          vec_convert(b, Dtype::F32, Dtype::S32, t.tile_addr(), t.temp(1), RoundMode::kRint,
                      t.cnt());
          vec_scalar(b, Opcode::op_vmuls, type, t.tile_addr(), t.tile_addr(), s, t.cnt());
        } else {
          vec_scalar(b, Opcode::op_vmuls, type, t.tile_addr(), t.temp(1), s, t.cnt());
        }
        b.movi(s, vector_scalar_bits(type, start));
        vec_scalar(b, Opcode::op_vadds, type, t.tile_addr(), t.tile_addr(), s, t.cnt());
      },
      [&](TileKernel& t) {
        // iota[0..8) by one-lane vdups, then doubled up to the tile.
        KernelBuilder& b = t.b();
        Reg v = b.reg("lane value"), m = b.reg("lane mask"), a = b.reg_imm("iota", 0);
        b.movi(a, static_cast<int64_t>(t.temp(0)));
        for (int64_t lane = 0; lane < 8; ++lane) {
          b.movi(m, int64_t{1} << lane);
          b.movi(v, lane);
          b.emit(Opcode::op_set_mask, {Opnd::reg_number(0), m});
          b.emit(Opcode::op_vdup, {Dtype::S32, a, v, 1, 1, 8});
        }
        for (int64_t have = 8; have < t.tile_elems();) {
          const int64_t more = std::min(have, t.tile_elems() - have);
          Reg cnt = b.reg_imm("iota: elements", more);
          b.movi(v, have);
          vec_scalar(b, Opcode::op_vadds, Dtype::S32, t.temp(0) + static_cast<uint64_t>(have) * 4,
                     t.temp(0), v, cnt);
          have += more;
        }
      });
  k.launches.push_back(std::move(l));
  return k;
}

}  // namespace

CompiledKernel compile_fill(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  // TF's full input lists: drop the shape operands (attributes here).
  if (op.type == "Range" && op.inputs.size() == 3)
    return compile_without_inputs(ctx, {0, 1, 2}, compile_fill);
  if (op.type == "Fill" && op.inputs.size() == 2)
    return compile_without_inputs(ctx, {0}, compile_fill);
  if (op.type == "Range") return compile_range(ctx);
  if (op.inputs.size() != 1)
    op.fail(fmt::format("takes 1 input, {} given{}", op.inputs.size(),
                        op.type == "Fill" ? " (dims is an attribute)" : ""));
  const TensorDesc& x = op.inputs[0];
  if (auto t = op.attr_type("T"); t && *t != x.dtype)
    op.fail(fmt::format("attribute T = {} does not match the input's {}", data_type_name(*t),
                        data_type_name(x.dtype)));
  if (op.type == "Fill") {
    if (x.num_elements() != 1) op.invalid(fmt::format("value {} must be a scalar", x.str()));
    if (!op.attrs.count("dims")) op.fail("attribute dims is missing");
    const std::vector<int64_t> dims = op.attr_ints("dims");
    for (int64_t d : dims)
      if (d < 0) op.invalid(fmt::format("dims {} has a negative dim", shape_str(dims)));
    op.check_size(TensorDesc{x.dtype, dims}, "dims");
    return fill_kernel(ctx, TensorDesc{x.dtype, dims}, AsmFill{0, 0});
  }
  if (op.type == "ZerosLike") return fill_kernel(ctx, x, AsmFill{-1, 0});
  if (op.type == "OnesLike") return fill_kernel(ctx, x, AsmFill{-1, one_bits(x.dtype)});
  op.fail("internal: not a fill op");
}

}  // namespace npusim::compiler::ops
