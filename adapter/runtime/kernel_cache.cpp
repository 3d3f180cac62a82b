#include "adapter/runtime/kernel_cache.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace npusim::rt {

std::string chip_config_identity(const ChipConfig& cfg) {
  // FNV-1a, 64-bit (offset basis and prime from the FNV specification).
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : dump_chip_config_yaml(cfg)) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return fmt::format("{}:{:016x}", cfg.name, h);
}

std::string KernelKey::str() const {
  std::string s = op + "|";
  for (size_t i = 0; i < dtypes.size(); ++i) s += (i ? "," : "") + dtypes[i];
  s += "|";
  for (size_t i = 0; i < shapes.size(); ++i)
    s += fmt::format("{}[{}]", i ? "," : "", fmt::join(shapes[i], ","));
  s += "|";
  bool first = true;
  for (const auto& [name, value] : attrs) {
    s += (first ? "" : ";") + name + "=" + value;
    first = false;
  }
  return s;
}

KernelCache::KernelCache(const ChipConfig& cfg) : m_chip_identity(chip_config_identity(cfg)) {}

std::string KernelCache::full_key(const std::string& key) const {
  return m_chip_identity + "|" + key;
}

Status KernelCache::get_or_compile(const std::string& key, const CompileFn& compile,
                                   std::shared_ptr<const isa::Program>* out) {
  const std::string where = "kernel cache: compiling '" + key + "'";
  if (!out) return Status(StatusCode::invalid_argument, where + ": the output pointer is null");
  return guard(where, [&]() -> Status {
    const std::string full = full_key(key);
    std::unique_lock<std::mutex> lock(m_mutex);
    auto it = m_entries.find(full);
    if (it != m_entries.end()) {
      std::shared_ptr<Entry> e = it->second;  // keeps it alive across clear()
      m_stats.hits++;
      m_compiled.wait(lock, [&] { return e->done; });
      if (!e->program) return e->status;
      *out = e->program;
      return Status();
    }
    auto e = std::make_shared<Entry>();
    m_entries.emplace(full, e);
    m_stats.misses++;
    lock.unlock();

    std::shared_ptr<const isa::Program> program;
    Status s = guard(where, [&] {
      return compile ? compile(&program)
                     : Status(StatusCode::internal, where + ": no compile function");
    });
    if (s.ok() && !program)
      s = Status(StatusCode::internal, where + ": the compile function returned no program");

    lock.lock();
    e->done = true;
    if (s.ok()) {
      e->program = program;
      m_stats.entries++;
    } else {
      e->status = s;
      m_stats.failed_compiles++;
      auto cur = m_entries.find(full);
      if (cur != m_entries.end() && cur->second == e) m_entries.erase(cur);
    }
    m_compiled.notify_all();
    if (s.ok()) *out = program;
    return s;
  });
}

std::shared_ptr<const isa::Program> KernelCache::find(const std::string& key) const {
  std::lock_guard<std::mutex> lock(m_mutex);
  auto it = m_entries.find(full_key(key));
  if (it == m_entries.end() || !it->second->done) return nullptr;
  return it->second->program;
}

KernelCacheStats KernelCache::stats() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  return m_stats;
}

void KernelCache::clear() {
  std::lock_guard<std::mutex> lock(m_mutex);
  for (auto it = m_entries.begin(); it != m_entries.end();) {
    if (it->second->done) {
      it = m_entries.erase(it);
    } else {
      ++it;
    }
  }
  m_stats.entries = 0;
}

}  // namespace npusim::rt
