#include "adapter/compiler/ops/compose.h"

#include <algorithm>

#include <fmt/format.h>

#include "sim/exec/layout.h"

namespace npusim::compiler::ops {

namespace {
constexpr uint64_t kSliceAlign = 512;  // workspace slices start on 512-byte boundaries
}  // namespace

LaunchPlan::LaunchPlan(std::vector<TensorDesc> outputs) { m_k.outputs = std::move(outputs); }

ArgRef LaunchPlan::workspace(uint64_t bytes) {
  ArgRef r{ArgRef::Kind::kWorkspace, 0, m_k.workspace_bytes};
  m_k.workspace_bytes += layout::round_up(device_buffer_bytes(bytes) + kDeviceBufferAlign,
                                          kSliceAlign);
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
  return k;
}

}  // namespace npusim::compiler::ops
