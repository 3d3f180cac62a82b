#include "adapter/compiler/ops/row_kernel.h"

#include <utility>

#include <fmt/format.h>

#include "adapter/compiler/ops/elementwise.h"

namespace npusim::compiler::ops {

using isa::Opcode;

BufferPlan::SizeFn blocks_of(int64_t bytes_per_unit) {
  return [bytes_per_unit](int64_t units) {
    return static_cast<uint64_t>(rnd(units * bytes_per_unit));
  };
}

BufferPlan::SizeFn fixed_blocks(int64_t bytes) {
  return [bytes](int64_t) { return static_cast<uint64_t>(rnd(bytes)); };
}

void declare_repeat_overhang(BufferPlan& plan) {
  plan.add_fixed("vector repeat overhang", kSlotBytes - kBlock);
}

void take_buffers(const BufferPlan::Placed& at,
                  std::initializer_list<std::pair<uint64_t*, BufferPlan::Id>> buffers) {
  for (const auto& [dst, id] : buffers) *dst = at[id];
}

void take_twins(const BufferPlan::Placed& at,
                std::initializer_list<std::pair<Twin*, BufferPlan::Id>> twins) {
  for (const auto& [dst, id] : twins) *dst = at.twin(id);
}

VectorCores VectorCores::of(const ChipConfig& cfg) {
  VectorCores v;
  v.kind = cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE;
  v.count = cfg.core_kind(v.kind)->count;
  return v;
}

BlockSplit BlockSplit::make(int64_t units, int64_t cores, int64_t step) {
  BlockSplit s;
  s.per = round_up(ceil_div(units, cores), step);
  s.block_dim = static_cast<int>(ceil_div(units, s.per));
  return s;
}

RowKernel::RowKernel(const std::string& name, const std::string& op, const ChipConfig& cfg)
    : m_b(name, op, cfg) {
  m_b.begin_section(m_b.vector_core_kind());
}

void RowKernel::arg(const std::string& name, isa::Dtype t, const std::vector<int64_t>& dims,
                    ArgRef ref) {
  m_b.declare_arg(name, t, dims);
  m_launch.args.push_back(ref);
  m_args.push_back(name);
}

std::vector<Reg> RowKernel::load_args() {
  std::vector<Reg> regs;
  for (const std::string& name : m_args) regs.push_back(m_b.load_arg(name));
  return regs;
}

BufferPlan::Placed RowKernel::allocate(const BufferPlan& plan, int64_t units) {
  return plan.allocate(m_b, units);
}

PingPong& RowKernel::start_pingpong() {
  m_sync.emplace(m_b);
  return *m_sync;
}

void RowKernel::block_range(const Reg& start, const Reg& end, int64_t per, int64_t total) {
  emit_block_range(m_b, start, end, per, total);
}

void RowKernel::resident_groups(const BlockSplit& split, int64_t total, int64_t G,
                                const SuperRowLayout& L, const GroupFn& load,
                                const GroupFn& compute) {
  KernelBuilder& b = m_b;
  Reg r0 = b.reg("first row of the block"), end = b.reg("end of this block's rows");
  block_range(r0, end, split.per, total);
  Reg steps = b.reg("groups of this block");
  b.sub(steps, end, r0);
  b.add(steps, steps, G - 1);
  b.div(steps, steps, G);
  // Group t: rows r .. r + rows - 1 (r = r0 + t * G), in whole super-rows.
  Reg r = b.reg("first row of the group"), rows = b.reg("rows in the group");
  Reg supers = b.reg("super-rows"), slots = b.reg("slots");
  const GroupRegs grp{r, rows, supers, slots};
  auto group = [&](const Reg& t) {
    b.mul_add(r, t, G, r0);
    b.sub(rows, end, r);
    b.min(rows, rows, G);
    b.add(supers, rows, L.rows - 1);
    b.shr(supers, supers, ceil_log2(L.rows));
    b.mul(slots, supers, L.rows);
  };
  m_sync->pipeline(
      steps,
      [&](const Reg& t, int q) {
        KernelBuilder::Origin o(b, "load a group of rows");
        group(t);
        load(grp, q);
      },
      [&](const Reg& t, int q) {
        group(t);
        compute(grp, q);
      });
}

void RowKernel::streamed_groups(const BlockSplit& split, int64_t total, int64_t G,
                                const StreamedFn& body) {
  KernelBuilder& b = m_b;
  Reg u0 = b.reg("first unit of the group"), end = b.reg("end of this block's units");
  block_range(u0, end, split.per, total);
  Reg units = b.reg("units in the group");
  Label top = b.label("group"), done = b.label("groups_done");
  b.bind(top);
  b.branch(ge(u0, end), done);
  b.sub(units, end, u0);
  b.min(units, units, G);
  body(u0, end, units);
  b.add(u0, u0, G);
  b.jmp(top);
  b.bind(done);
}

Launch RowKernel::finish(int block_dim, std::string summary) {
  if (m_sync) m_sync->drain();
  m_b.end();
  m_launch.block_dim = block_dim;
  m_launch.summary = std::move(summary);
  m_launch.kernel = m_b.finish();
  return std::move(m_launch);
}

}  // namespace npusim::compiler::ops
