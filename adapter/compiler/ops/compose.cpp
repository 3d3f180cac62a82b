#include "adapter/compiler/ops/compose.h"

#include <algorithm>
#include <variant>

#include <fmt/format.h>

#include "adapter/compiler/ops/cast.h"
#include "adapter/compiler/ops/conv.h"
#include "common/int_math.h"
#include "isa/layout.h"

namespace npusim::compiler::ops {

namespace {
constexpr uint64_t kSliceAlign = 512;  // workspace slices start on 512-byte boundaries
}  // namespace

LaunchPlan::LaunchPlan(std::vector<TensorDesc> outputs) { m_k.outputs = std::move(outputs); }

ArgRef LaunchPlan::workspace(uint64_t bytes) {
  ArgRef r{ArgRef::Kind::kWorkspace, 0, m_k.workspace_bytes};
  m_k.workspace_bytes += round_up(device_buffer_bytes(bytes) + kDeviceBufferAlign, kSliceAlign);
  return r;
}

void LaunchPlan::add(Launch l, const std::vector<ArgRef>& args, const std::string& what) {
  if (args.size() != l.args.size())
    throw Error(fmt::format("LaunchPlan: kernel {} takes {} arguments, {} rebound",
                            l.kernel.program.name, l.args.size(), args.size()));
  l.args = args;
  if (!what.empty()) l.summary = what + ": " + l.summary;
  m_k.launches.push_back(std::move(l));
}

void LaunchPlan::add(const CompiledKernel& sub, const std::vector<ArgRef>& ins,
                     const std::vector<ArgRef>& outs, const std::string& what) {
  const ArgRef ws = sub.workspace_bytes ? workspace(sub.workspace_bytes) : ArgRef{};
  // The sub's derived tensors stay derived where all their sources are inputs of this op;
  // computed from anything else they are plain workspace slices here.
  std::vector<int> derived_index(sub.derived.size(), -1);
  for (size_t d = 0; d < sub.derived.size(); ++d) {
    const DerivedTensor& t = sub.derived[d];
    std::vector<int> sources;
    for (int i : t.inputs) {
      const ArgRef src = ins.at(static_cast<size_t>(i));
      if (src.kind == ArgRef::Kind::kInput) sources.push_back(src.index);
    }
    if (sources.size() != t.inputs.size()) continue;
    derived_index[d] = static_cast<int>(m_k.derived.size());
    m_k.derived.push_back(DerivedTensor{std::move(sources), m_k.launches.size() + t.launch,
                                        t.bytes, t.what});
  }
  for (Launch l : sub.launches) {
    for (ArgRef& a : l.args) {
      auto pick = [&](const std::vector<ArgRef>& list, const char* kind) {
        if (a.index < 0 || static_cast<size_t>(a.index) >= list.size())
          throw Error(fmt::format("LaunchPlan: sub-kernel {} uses {} {}, {} mapped", sub.key,
                                  kind, a.index, list.size()));
        return list[static_cast<size_t>(a.index)];
      };
      switch (a.kind) {
        case ArgRef::Kind::kInput: a = pick(ins, "input"); break;
        case ArgRef::Kind::kOutput: a = pick(outs, "output"); break;
        case ArgRef::Kind::kWorkspace: a.value += ws.value; break;
        case ArgRef::Kind::kScalar: break;
        case ArgRef::Kind::kDerived: {
          const int d = derived_index.at(static_cast<size_t>(a.index));
          a.value += ws.value;
          if (d < 0) a = ArgRef{ArgRef::Kind::kWorkspace, 0, a.value + a.inner};
          else a.index = d;
          break;
        }
      }
    }
    if (!what.empty()) l.summary = what + ": " + l.summary;
    m_k.launches.push_back(std::move(l));
  }
}

CompiledKernel LaunchPlan::finish() && { return std::move(m_k); }

CompiledKernel compile_without_inputs(const CompileContext& ctx, const std::vector<size_t>& drop,
                                      CompileFn fn) {
  OpDesc op = ctx.op;
  op.inputs.clear();
  std::vector<int> kept;  // original index of each remaining input
  for (size_t i = 0; i < ctx.op.inputs.size(); ++i) {
    if (std::find(drop.begin(), drop.end(), i) != drop.end()) continue;
    kept.push_back(static_cast<int>(i));
    op.inputs.push_back(ctx.op.inputs[i]);
  }
  CompiledKernel k = fn(CompileContext{op, ctx.cfg, ctx.precision});
  for (Launch& l : k.launches)
    for (ArgRef& a : l.args)
      if (a.kind == ArgRef::Kind::kInput) a.index = kept.at(static_cast<size_t>(a.index));
  for (DerivedTensor& d : k.derived)
    for (int& i : d.inputs) i = kept.at(static_cast<size_t>(i));
  if (!k.view_offsets.empty()) k.view_input = kept.at(static_cast<size_t>(k.view_input));
  if (!k.concat_offsets.empty()) {
    std::vector<int64_t> at(ctx.op.inputs.size(), -1);
    for (size_t i = 0; i < k.concat_offsets.size(); ++i)
      at.at(static_cast<size_t>(kept.at(i))) = k.concat_offsets[i];
    k.concat_offsets = std::move(at);
  }
  return k;
}

ArgRef append_input_cast(CompiledKernel& k, const OpDesc& op, int input, DataType to,
                         const ChipConfig& cfg) {
  const TensorDesc& from = op.inputs.at(static_cast<size_t>(input));
  const uint64_t bytes = static_cast<uint64_t>(from.num_elements()) * data_type_bytes(to);
  const ArgRef ws = workspace_take(k, bytes);
  if (from.num_elements() == 0) return ws;
  const ArgRef derived{ArgRef::Kind::kDerived, static_cast<int>(k.derived.size()), ws.value};
  k.derived.push_back(
      DerivedTensor{{input}, k.launches.size(), bytes, fmt::format("{} copy", data_type_name(to))});
  Launch l = build_stream_kernel(op.str(), cast_spec(from.dtype, to, false, from.shape), cfg);
  l.summary = fmt::format("input {} {} -> {} derived at workspace {} ({})", input, from.str(),
                          data_type_name(to), ws.value, l.summary);
  l.args = {ArgRef{ArgRef::Kind::kInput, input, 0}, derived};
  k.launches.push_back(std::move(l));
  return derived;
}

CompiledKernel compile_bf16_in_f32(const CompileContext& ctx) {
  const OpDesc& op = ctx.op;
  auto cast = [&](const TensorDesc& from, DataType to) {
    OpDesc c;
    c.type = "Cast";
    c.inputs = {from};
    c.attrs = {{"DstT", std::string(data_type_name(to))}};
    return compile(c, ctx.cfg, ctx.precision);
  };
  OpDesc wide = op;
  for (TensorDesc& in : wide.inputs)
    if (in.dtype == DataType::BF16) in.dtype = DataType::F32;
  for (TensorDesc& out : wide.outputs)
    if (out.dtype == DataType::BF16) out.dtype = DataType::F32;
  for (auto& [name, value] : wide.attrs)  // type attributes (T)
    if (auto* t = std::get_if<std::string>(&value); t && *t == data_type_name(DataType::BF16))
      *t = data_type_name(DataType::F32);
  const CompiledKernel sub = compile(wide, ctx.cfg, ctx.precision);
  std::vector<TensorDesc> outputs = sub.outputs;
  for (TensorDesc& out : outputs)
    if (out.dtype == DataType::F32) out.dtype = DataType::BF16;
  LaunchPlan plan(outputs);
  std::vector<ArgRef> ins, outs;
  for (size_t i = 0; i < op.inputs.size(); ++i) {
    ins.push_back(LaunchPlan::input(static_cast<int>(i)));
    if (op.inputs[i].dtype != DataType::BF16) continue;
    ins.back() = plan.workspace(static_cast<uint64_t>(op.inputs[i].num_elements()) * 4);
    plan.add(cast(op.inputs[i], DataType::F32), {LaunchPlan::input(static_cast<int>(i))},
             {ins.back()}, fmt::format("input {} to f32", i));
  }
  for (const TensorDesc& out : sub.outputs)
    outs.push_back(out.dtype == DataType::F32 ? plan.workspace(out.bytes())
                                              : LaunchPlan::output(static_cast<int>(outs.size())));
  plan.add(sub, ins, outs, "in f32");
  for (size_t j = 0; j < sub.outputs.size(); ++j)
    if (sub.outputs[j].dtype == DataType::F32)
      plan.add(cast(sub.outputs[j], DataType::BF16), {outs[j]},
               {LaunchPlan::output(static_cast<int>(j))}, fmt::format("output {} to bf16", j));
  return std::move(plan).finish();
}

}  // namespace npusim::compiler::ops
