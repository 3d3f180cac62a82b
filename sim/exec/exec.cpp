// Dispatch of plan()/execute() to the instruction families, and the core's local buffers.
#include "sim/exec/exec.h"

#include <algorithm>
#include <cstring>
#include <new>

#include <fmt/format.h>

#include "common/error.h"

#include <sys/mman.h>

namespace npusim {

namespace {
constexpr uint64_t kBufferAlign = 4096;
constexpr uint64_t kHugePage = 2 * 1024 * 1024;
uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
}  // namespace

CoreMemory::Mapping::~Mapping() {
  if (base) munmap(base, bytes);
}

CoreMemory::CoreMemory(const CoreKindConfig& kind) {
  uint64_t total = 0;
  for (const auto& [buf, bytes] : kind.buffer_bytes)
    if (bytes) total += align_up(bytes, kBufferAlign);
  if (total == 0) return;
  m_mapping.bytes = total >= kHugePage / 2 ? align_up(total, kHugePage) : total;
  m_mapping.base = mmap(nullptr, m_mapping.bytes, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m_mapping.base == MAP_FAILED) {
    m_mapping.base = nullptr;
    throw std::bad_alloc();
  }
#ifdef MADV_HUGEPAGE
  if (m_mapping.bytes >= kHugePage) madvise(m_mapping.base, m_mapping.bytes, MADV_HUGEPAGE);
#endif
  uint8_t* next = static_cast<uint8_t*>(m_mapping.base);
  for (const auto& [buf, bytes] : kind.buffer_bytes) {
    if (bytes == 0) continue;
    Buffer& v = m_bufs[static_cast<int>(buf)];
    v.data = next;
    v.size = bytes;
    next += align_up(bytes, kBufferAlign);
  }
}

uint8_t* CoreMemory::at(isa::Buf b, uint64_t addr, uint64_t n) {
  const Buffer& v = m_bufs[static_cast<int>(b)];
  if (v.size == 0)
    throw KernelFault(fmt::format("this core has no {} buffer", isa::buf_name(b)));
  if (n > v.size || addr > v.size - n)
    throw KernelFault(fmt::format("{} access [{:#x}, {:#x}) is outside the buffer of {} bytes",
                                  isa::buf_name(b), addr, addr + n, v.size));
  return v.data + addr;
}

void CoreMemory::clear() {
  for (Buffer& v : m_bufs)
    if (v.size) std::memset(v.data, 0, v.size);
}

std::vector<std::vector<uint8_t>> CoreMemory::save() const {
  std::vector<std::vector<uint8_t>> out(m_bufs.size());
  for (size_t b = 0; b < m_bufs.size(); ++b)
    out[b].assign(m_bufs[b].data, m_bufs[b].data + m_bufs[b].size);
  return out;
}

void CoreMemory::restore(const std::vector<std::vector<uint8_t>>& saved) {
  for (size_t b = 0; b < m_bufs.size() && b < saved.size(); ++b)
    if (m_bufs[b].size == saved[b].size() && m_bufs[b].size)
      std::memcpy(m_bufs[b].data, saved[b].data(), m_bufs[b].size);
}

namespace {
// The family of op's pipe: vector(), cube() or mte() (MTE1/2/3 and FIXPIPE).
template <typename V, typename M, typename T>
auto by_family(const IssuedOp& op, V&& vector, M&& cube, T&& mte) {
  switch (op.insn->desc().pipe) {
    case isa::Pipe::V: return vector();
    case isa::Pipe::M: return cube();
    case isa::Pipe::MTE1: case isa::Pipe::MTE2: case isa::Pipe::MTE3: case isa::Pipe::FIX:
      return mte();
    default:
      throw KernelFault(fmt::format("{} is not a pipe instruction", op.insn->desc().mnemonic));
  }
}
}  // namespace

ExecCost plan(const IssuedOp& op, const ExecContext& ctx) {
  return by_family(
      op, [&] { return plan_vector(op, ctx); }, [&] { return plan_cube(op, ctx); },
      [&] { return plan_mte(op, ctx); });
}

void invalidate_gm_writes(const ExecCost& cost, DeviceMemory& gm) {
  for (const GmAccess& a : cost.gm)
    if (a.write) gm.invalidate(a.addr, a.bytes);
}

void execute(const IssuedOp& op, ExecContext& ctx) {
  by_family(
      op, [&] { execute_vector(op, ctx); }, [&] { execute_cube(op, ctx); },
      [&] { execute_mte(op, ctx); });
}

std::unique_ptr<PreparedOp> prepare(const IssuedOp& op, const ExecContext& ctx) {
  return by_family(
      op, [&] { return prepare_vector(op, ctx); }, [&] { return prepare_cube(op, ctx); },
      [&] { return prepare_mte(op, ctx); });
}

}  // namespace npusim
