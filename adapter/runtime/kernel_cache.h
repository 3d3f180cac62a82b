// The kernel cache: compiled programs keyed by what determines the code (op type, dtypes,
// shapes, attributes) and by the chip config they were tiled for, so an op compiled once is not
// compiled again. Thread-safe; get_or_compile compiles a key once even when many threads ask for
// it at the same time (the others wait for that compile and count as hits).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "adapter/runtime/status.h"
#include "isa/isa.h"
#include "sim/config/chip_config.h"

namespace npusim::rt {

// Identity of a chip config: "<name>:<16 hex digits>", the FNV-1a 64-bit hash of
// dump_chip_config_yaml(cfg), so two configs that differ in any key differ here and the value is
// stable across processes and builds.
std::string chip_config_identity(const ChipConfig& cfg);

// What the compiler specialises a kernel on. str() is the canonical key text:
//   op|dtype,dtype|[d0,d1],[]|attr=value;attr=value
// (attributes in name order; [] is a scalar). Attribute values are the caller's text and must not
// contain '|' or ';' (str() does not escape).
struct KernelKey {
  std::string op;                              // TF op type, e.g. "MatMul"
  std::vector<std::string> dtypes;             // one per input and output, e.g. "f16"
  std::vector<std::vector<int64_t>> shapes;    // one per input and output
  std::map<std::string, std::string> attrs;    // e.g. {"transpose_a", "false"}
  std::string str() const;
};

struct KernelCacheStats {
  uint64_t hits = 0;             // lookups answered without compiling
  uint64_t misses = 0;           // compiles started
  uint64_t failed_compiles = 0;  // compiles that returned an error (not cached)
  uint64_t entries = 0;          // programs held
};

class KernelCache {
 public:
  // Compiles one kernel into *out; a non-ok status (e.g. unsupported naming the op and the
  // attribute) is returned to every caller waiting for that key and is not cached.
  using CompileFn = std::function<Status(std::shared_ptr<const isa::Program>* out)>;

  explicit KernelCache(const ChipConfig& cfg);
  KernelCache(const KernelCache&) = delete;
  KernelCache& operator=(const KernelCache&) = delete;

  // The program cached for `key` on this chip, compiling it with `compile` on a miss. Exceptions
  // thrown by `compile` become statuses naming the key (see guard()).
  Status get_or_compile(const std::string& key, const CompileFn& compile,
                        std::shared_ptr<const isa::Program>* out);
  // The cached program, or nullptr (does not count as a hit or miss).
  std::shared_ptr<const isa::Program> find(const std::string& key) const;
  // chip_config_identity() + '|' + key: what the cache is keyed on.
  std::string full_key(const std::string& key) const;
  const std::string& chip_identity() const { return m_chip_identity; }
  KernelCacheStats stats() const;
  void clear();  // drops every finished entry (compiles in progress still finish)

 private:
  struct Entry {
    bool done = false;
    Status status;                                // of a failed compile, for its waiters
    std::shared_ptr<const isa::Program> program;
  };

  const std::string m_chip_identity;
  mutable std::mutex m_mutex;
  std::condition_variable m_compiled;
  std::map<std::string, std::shared_ptr<Entry>> m_entries;  // full key -> entry
  KernelCacheStats m_stats;
};

}  // namespace npusim::rt
