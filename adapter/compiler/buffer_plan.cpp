#include "adapter/compiler/buffer_plan.h"

#include <cmath>
#include <utility>

#include "common/error.h"

namespace npusim::compiler {

BufferPlan::Id BufferPlan::push(Decl d) {
  if (d.copies != 1 && d.copies != 2)
    throw Error("BufferPlan: buffer '" + d.name + "' must have 1 or 2 copies");
  m_decls.push_back(std::move(d));
  return static_cast<Id>(m_decls.size() - 1);
}

BufferPlan::Id BufferPlan::add(std::string name, double bytes_per_unit, uint64_t fixed_bytes,
                               int copies, bool enabled) {
  SizeFn f = [bytes_per_unit, fixed_bytes](int64_t units) {
    return static_cast<uint64_t>(std::ceil(static_cast<double>(units) * bytes_per_unit)) +
           fixed_bytes;
  };
  return push({std::move(name), std::move(f), copies, enabled});
}

BufferPlan::Id BufferPlan::add_fixed(std::string name, uint64_t bytes, int copies, bool enabled) {
  return push({std::move(name), [bytes](int64_t) { return bytes; }, copies, enabled});
}

BufferPlan::Id BufferPlan::add_sized(std::string name, SizeFn bytes, int copies, bool enabled) {
  return push({std::move(name), std::move(bytes), copies, enabled});
}

void BufferPlan::place(Id id, uint64_t period, uint64_t offset) {
  Decl& d = m_decls.at(static_cast<size_t>(id));
  if (period == 0 || offset >= period)
    throw Error("BufferPlan: buffer '" + d.name + "' placed at offset " + std::to_string(offset) +
                " of a period of " + std::to_string(period));
  d.period = period;
  d.offset = offset;
}

bool BufferPlan::has_placed() const {
  for (const Decl& d : m_decls)
    if (d.enabled && d.period) return true;
  return false;
}

uint64_t BufferPlan::padding(const Decl& d, uint64_t used, uint64_t alignment) {
  if (!d.period) return 0;
  const uint64_t at = (used + alignment - 1) / alignment * alignment;
  return (d.offset + d.period - at % d.period) % d.period;
}

uint64_t BufferPlan::bytes(Id id, int64_t units) const {
  const Decl& d = m_decls.at(static_cast<size_t>(id));
  return d.enabled ? d.bytes(units) : 0;
}

uint64_t BufferPlan::extent(int64_t units, uint64_t alignment, uint64_t start) const {
  uint64_t used = start;
  for (size_t i = 0; i < m_decls.size(); ++i) {
    const uint64_t n = bytes(static_cast<Id>(i), units);
    if (!m_decls[i].enabled || n == 0) continue;  // KernelBuilder::alloc is not called
    for (int c = 0; c < m_decls[i].copies; ++c) {
      const uint64_t pad = padding(m_decls[i], used, alignment);
      if (pad) used = (used + alignment - 1) / alignment * alignment + pad;
      used = (used + alignment - 1) / alignment * alignment + n;
    }
  }
  return used;
}

int BufferPlan::allocations(int64_t units) const {
  int n = 0;
  for (size_t i = 0; i < m_decls.size(); ++i)
    if (bytes(static_cast<Id>(i), units) > 0) n += m_decls[i].copies * (m_decls[i].period ? 2 : 1);
  return n;
}

int64_t BufferPlan::fit(uint64_t capacity, uint64_t alignment, int64_t granule, int64_t max_units,
                        uint64_t start) const {
  if (granule < 1) throw Error("BufferPlan::fit: granule must be at least 1");
  auto fits = [&](int64_t k) { return extent(k * granule, alignment, start) <= capacity; };
  int64_t lo = 0, hi = max_units / granule;  // fits(lo) (or lo == 0), answer in [lo, hi]
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo + 1) / 2;
    if (fits(mid))
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo * granule;
}

int64_t BufferPlan::fit(const ChipConfig& cfg, isa::CoreKind kind, int64_t granule,
                        int64_t max_units) const {
  const CoreKindConfig* core = cfg.core_kind(kind);
  if (!core)
    throw Error(std::string("BufferPlan::fit: chip has no ") + isa::core_kind_name(kind) +
                " cores");
  return fit(core->capacity(m_buf), KernelBuilder::alignment(cfg, m_buf), granule, max_units);
}

int64_t BufferPlan::fit(const KernelBuilder& b, int64_t granule, int64_t max_units) const {
  const uint64_t cap = b.core().capacity(m_buf);
  return fit(cap, b.alignment(m_buf), granule, max_units, cap - b.free_bytes(m_buf));
}

BufferPlan::Placed BufferPlan::allocate(KernelBuilder& b, int64_t units) const {
  Placed p;
  for (size_t i = 0; i < m_decls.size(); ++i) {
    const Decl& d = m_decls[i];
    const uint64_t n = bytes(static_cast<Id>(i), units);
    Twin t;
    // Padding to the buffer's place, then the copy.
    auto alloc = [&](const std::string& name) {
      const uint64_t cap = b.core().capacity(m_buf);
      const uint64_t pad = padding(d, cap - b.free_bytes(m_buf), b.alignment(m_buf));
      if (pad) b.alloc(m_buf, pad, d.name + ": padding to its place");
      return b.alloc(m_buf, n, name);
    };
    if (d.enabled && n > 0) {
      if (d.copies == 1) {
        t.a[0] = t.a[1] = alloc(d.name);
      } else {
        t.a[0] = alloc(d.name + " (ping)");
        t.a[1] = alloc(d.name + " (pong)");
      }
    }
    p.m_at.push_back(t);
  }
  return p;
}

}  // namespace npusim::compiler
