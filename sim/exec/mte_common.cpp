#include "sim/exec/mte_common.h"

#include <array>
#include <cmath>
#include <cstring>

#include <fmt/format.h>

#include "common/error.h"

namespace npusim::mte {

Operands::Operands(const IssuedOp& op) : m_op(op), m_desc(op.insn->desc()) {
  using Row = std::array<CachedField, isa::kMaxFields>;
  thread_local std::array<Row, isa::kNumOpcodes> cache;
  m_cache = cache[static_cast<size_t>(op.op())].data();
}

int Operands::lookup(const char* name) const {
  int i = isa::field_index(m_op.op(), name);
  if (i < 0) fault(fmt::format("internal error: no operand named {}", name));
  return i;
}

int Operands::index(const char* name) const {
  // An entry is used only if its field still has this name, so a caller passing a name that is
  // not a literal (an address later reused for other text) gets a fresh lookup, never a wrong
  // field.
  for (int s = 0; s < isa::kMaxFields; ++s) {
    CachedField& c = m_cache[s];
    if (c.name == name) {
      // (The linker merges equal string literals, so the field's own name is usually the same
      // address: no comparison of the text then.)
      const char* field = m_desc.fields[c.index].name;
      if (field == name || std::strcmp(field, name) == 0) return c.index;
      return c.index = lookup(name);
    }
    if (c.name == nullptr) {
      c.index = lookup(name);
      c.name = name;
      return c.index;
    }
  }
  return lookup(name);  // more distinct addresses than fields: no caching
}

int64_t Operands::raw(const char* name) const { return m_op[index(name)]; }

uint64_t Operands::count(const char* name, uint64_t min) const {
  int i = index(name);
  int64_t v = m_op[i];
  uint64_t max = isa::field_imm_max(m_desc.fields[i].kind);
  if (v < 0 || static_cast<uint64_t>(v) < min || static_cast<uint64_t>(v) > max)
    fault(fmt::format("{} = {} is outside [{}, {}]", name, v, min, max));
  return static_cast<uint64_t>(v);
}

isa::Dtype Operands::dtype(const char* name) const {
  int64_t v = raw(name);
  if (v < 0 || v >= static_cast<int64_t>(isa::Dtype::NONE))
    fault(fmt::format("{} = {} is not a data type", name, v));
  return static_cast<isa::Dtype>(v);
}

isa::Buf Operands::buf(const char* name) const {
  int64_t v = raw(name);
  if (v < 0 || v >= isa::kNumBufs) fault(fmt::format("{} = {} is not a buffer", name, v));
  return static_cast<isa::Buf>(v);
}

isa::L2Hint Operands::l2_hint() const {
  if (isa::field_index(m_op.op(), "l2") < 0) return isa::L2Hint::NORMAL;
  int64_t v = raw("l2");
  if (v < 0 || v >= isa::kNumL2Hints) fault(fmt::format("l2 = {} is not an L2 policy", v));
  return static_cast<isa::L2Hint>(v);
}

void Operands::fault(const std::string& what) const {
  throw KernelFault(fmt::format("{}: {}", mnemonic(), what));
}

void require_path(const Operands& o, const ChipConfig& cfg, isa::Buf src, isa::Buf dst) {
  if (!cfg.has_path(src, dst))
    o.fault(fmt::format("no data path {}->{} on chip {}", isa::buf_name(src), isa::buf_name(dst),
                        cfg.name));
}

static uint64_t alignment(const ChipConfig& cfg, isa::Buf b) {
  auto it = cfg.align_bytes.find(b);
  return it == cfg.align_bytes.end() || it->second == 0 ? 1 : it->second;
}

void check_local(const Operands& o, const ExecContext& ctx, const char* operand, isa::Buf b,
                 uint64_t addr, uint64_t bytes) {
  if (!ctx.core.has(b))
    o.fault(fmt::format("{}: this core ({}) has no {} buffer", operand,
                        isa::core_kind_name(ctx.core.kind), isa::buf_name(b)));
  uint64_t align = alignment(ctx.cfg, b);
  if (addr % align != 0)
    o.fault(fmt::format("{} = {:#x} is not aligned to {} bytes as {} requires", operand, addr,
                        align, isa::buf_name(b)));
  uint64_t cap = ctx.core.capacity(b);
  if (bytes > cap || addr > cap - bytes)
    o.fault(fmt::format("{} range [{:#x}, {:#x}) is outside {} ({} bytes)", operand, addr,
                        addr + bytes, isa::buf_name(b), cap));
  if (bytes) ctx.local.note_access(b, addr + bytes);
}

void check_gm(const Operands& o, const ExecContext& ctx, const char* operand, uint64_t addr,
              uint64_t bytes) {
  uint64_t align = alignment(ctx.cfg, isa::Buf::GM);
  if (addr % align != 0)
    o.fault(fmt::format("{} = {:#x} is not aligned to {} bytes as gm requires", operand, addr,
                        align));
  if (!ctx.gm.in_bounds(addr, bytes))
    o.fault(fmt::format("{} range [{:#x}, {:#x}) is outside device memory ({} bytes)", operand,
                        addr, addr + bytes, ctx.gm.capacity()));
}

void check_range(const Operands& o, const ExecContext& ctx, const char* operand, isa::Buf b,
                 uint64_t addr, uint64_t bytes) {
  if (b == isa::Buf::GM) check_gm(o, ctx, operand, addr, bytes);
  else check_local(o, ctx, operand, b, addr, bytes);
}

void add_gm_range(std::vector<GmAccess>& gm, uint64_t addr, uint64_t bytes, bool write,
                  isa::L2Hint l2) {
  if (bytes == 0) return;
  if (!gm.empty() && gm.back().write == write && gm.back().l2 == l2 &&
      gm.back().addr + gm.back().bytes == addr) {
    gm.back().bytes += bytes;
    return;
  }
  gm.push_back({addr, bytes, write, l2});
}

uint64_t gm_bursts(const std::vector<GmAccess>& gm) {
  uint64_t n = 0;
  for (const GmAccess& a : gm)
    if (a.bytes > 0) n += (a.addr + a.bytes - 1) / kGmBurstBytes - a.addr / kGmBurstBytes + 1;
  return n;
}

double issue_cycles(const ChipConfig& cfg, const std::vector<GmAccess>& gm) {
  if (cfg.copy_issue_cycles == 0 && cfg.burst_cycles == 0) return 0;
  return cfg.copy_issue_cycles + cfg.burst_cycles * static_cast<double>(gm_bursts(gm));
}

ExecCost path_cost(const ChipConfig& cfg, isa::Buf src, isa::Buf dst, uint64_t bytes) {
  ExecCost c;
  c.path_src = src;
  c.path_dst = dst;
  c.bytes = bytes;
  double rate = cfg.path_rate(src, dst);
  c.cycles = static_cast<uint64_t>(cfg.path_latency(src, dst));
  if (src == isa::Buf::GM || dst == isa::Buf::GM)
    c.gm_core_rate = rate;
  else
    c.cycles += static_cast<uint64_t>(std::ceil(static_cast<double>(bytes) / rate));
  return c;
}

void read_bytes(ExecContext& ctx, isa::Buf b, uint64_t addr, void* out, uint64_t n) {
  if (b == isa::Buf::GM) ctx.gm.read(addr, out, n);
  else std::memcpy(out, ctx.local.at(b, addr, n), n);
}

void write_bytes(ExecContext& ctx, isa::Buf b, uint64_t addr, const void* in, uint64_t n) {
  if (b == isa::Buf::GM) ctx.gm.write(addr, in, n);
  else std::memcpy(ctx.local.at(b, addr, n), in, n);
}

void copy_bytes(ExecContext& ctx, isa::Buf src, uint64_t src_addr, isa::Buf dst,
                uint64_t dst_addr, uint64_t n) {
  if (src == isa::Buf::GM) {
    if (dst == isa::Buf::GM) {
      std::vector<uint8_t> tmp(n);
      ctx.gm.read(src_addr, tmp.data(), n);
      ctx.gm.write(dst_addr, tmp.data(), n);
    } else {
      ctx.gm.read(src_addr, ctx.local.at(dst, dst_addr, n), n);
    }
  } else if (dst == isa::Buf::GM) {
    ctx.gm.write(dst_addr, ctx.local.at(src, src_addr, n), n);
  } else {
    // memmove: source and destination may be the same buffer.
    std::memmove(ctx.local.at(dst, dst_addr, n), ctx.local.at(src, src_addr, n), n);
  }
}

}  // namespace npusim::mte
