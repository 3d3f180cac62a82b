#include "tools/device_buffers.h"

#include <fmt/format.h>

#include "common/error.h"

namespace npusim::cli {

uint64_t DeviceArena::allocate(uint64_t bytes, const std::string& what) {
  constexpr uint64_t kAlign = 512;
  uint64_t addr = m_next;
  uint64_t size = (bytes + kAlign - 1) / kAlign * kAlign;
  if (size > m_sim.gm().capacity() || addr > m_sim.gm().capacity() - size)
    throw Error(fmt::format("{}: {} bytes do not fit in the device memory of {} bytes", what,
                            bytes, m_sim.gm().capacity()));
  m_next = addr + size;
  return addr;
}

uint64_t DeviceArena::upload(const NpyArray& a, const std::string& what) {
  uint64_t addr = allocate(a.data.size(), what);
  if (!a.data.empty()) m_hdc_us += m_sim.copy_host_to_device(addr, a.data.data(), a.data.size()).time_us;
  return addr;
}

void DeviceArena::download(uint64_t addr, NpyArray& a) {
  a.data.resize(static_cast<size_t>(a.elements()) * a.item_size());
  if (!a.data.empty()) m_hdc_us += m_sim.copy_device_to_host(a.data.data(), addr, a.data.size()).time_us;
}

NpyArray parse_tensor_spec(const std::string& spec, const std::string& where) {
  auto colon = spec.find(':');
  if (colon == std::string::npos)
    throw Error(fmt::format("{}: expected DTYPE:SHAPE (e.g. f16:256x256), got '{}'", where, spec));
  std::string dt = spec.substr(0, colon), shape = spec.substr(colon + 1);
  auto dtype = isa::dtype_from_name(dt);
  if (!dtype) throw Error(fmt::format("{}: unknown dtype '{}'", where, dt));
  NpyArray a;
  a.dtype = npy_dtype(*dtype);
  size_t pos = 0;
  while (pos <= shape.size()) {
    size_t x = shape.find('x', pos);
    std::string dim = shape.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
    try {
      size_t used = 0;
      long long v = std::stoll(dim, &used);
      if (used != dim.size() || v < 0) throw std::invalid_argument(dim);
      a.shape.push_back(v);
    } catch (const std::exception&) {
      throw Error(fmt::format("{}: bad dimension '{}' in shape '{}'", where, dim, shape));
    }
    if (x == std::string::npos) break;
    pos = x + 1;
  }
  return a;
}

}  // namespace npusim::cli
