// Global memory (HBM) of the device: sparse, pages allocated on first write, so a 64 GiB chip
// runs on a host with far less RAM. Unwritten bytes read as zero. Addresses are device byte
// addresses in [0, capacity). A timing-only run writes no data (invalidate): the bytes a kernel
// writes become undefined and hold no host memory; they read as zero.
//
// Pages are found through a two-level table (a directory of page tables of kTablePages pages),
// both levels allocated on first write. Lookups take no lock, so several threads may read and
// write (distinct bytes) at once: the launch replay runs cores on host threads. Allocating a
// page or a table takes a lock; discard, clear and restore must not run concurrently with
// anything.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace npusim {

class DeviceMemory {
 public:
  static constexpr uint64_t kPageBytes = 64 * 1024;
  // The largest capacity: a 48-bit device address space (the virtual address width of current
  // 64-bit hosts and NPUs), whose page directory takes 8 MiB of host memory.
  static constexpr uint64_t kMaxCapacity = uint64_t{1} << 48;
  // Throws npusim::Error if capacity_bytes exceeds kMaxCapacity.
  explicit DeviceMemory(uint64_t capacity_bytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  uint64_t capacity() const { return m_capacity; }
  // Throws KernelFault naming the range if [addr, addr+n) is outside the device memory.
  void read(uint64_t addr, void* dst, uint64_t n) const;
  void write(uint64_t addr, const void* src, uint64_t n);
  // The bytes [addr, addr+n) in place, if they lie within one page (n <= kPageBytes): the
  // page's memory, or zeros if it was never written. nullptr if the range crosses a page
  // boundary (read() it then). Valid until the page is written, discarded or cleared. Throws
  // like read() if the range is outside the device memory.
  const uint8_t* view(uint64_t addr, uint64_t n) const;
  // The bytes [addr, addr+n) in place for writing, if they lie within one page (n <=
  // kPageBytes): the page's memory, allocated (zero-filled) if it held no data, its blocks
  // stamped as written now; the caller stores the n bytes before anything else reads them
  // (what write() does, without a copy from the caller's buffer). nullptr if the range crosses
  // a page boundary (write() it then). Valid like view(). Throws like write().
  uint8_t* span_for_write(uint64_t addr, uint64_t n);
  void fill(uint64_t addr, uint8_t value, uint64_t n);
  // Returns [addr, addr+n) to the never-written state (reads as zero): pages wholly inside the
  // range are released, the covered parts of other pages are zeroed. Throws like write().
  void discard(uint64_t addr, uint64_t n);
  // A write of undefined bytes to [addr, addr+n) (what a timing-only run's kernels do): it
  // stamps the write epochs and leaves the pages written, as write() does, but the bytes read
  // as zero and pages wholly inside the range hold no host memory (covered parts of other pages
  // are zeroed). Throws like write().
  void invalidate(uint64_t addr, uint64_t n);
  // Whether any byte of [addr, addr+n) is held in host memory: written by write() or fill() (a
  // timing-only run's device memory holds only what the host wrote). Throws like read().
  bool holds_data(uint64_t addr, uint64_t n) const;
  bool in_bounds(uint64_t addr, uint64_t n) const { return n <= m_capacity && addr <= m_capacity - n; }
  // Host memory the pages holding data take (pages written with undefined bytes take none).
  uint64_t resident_bytes() const { return m_resident.load() * kPageBytes; }
  void clear();

  // Write epochs: every write, fill, discard or clear stamps the kEpochBlockBytes blocks it
  // touches with the current epoch, so a caller can tell whether a range changed since a point
  // in time (the runtime keeps derived buffers, e.g. cast weights, while their source is
  // unchanged):
  //   const uint64_t e = mem.advance_write_epoch();  // later writes stamp > e
  //   ... later: mem.last_write_epoch(addr, n) <= e  <=>  no block of [addr, addr+n) written since.
  // Blocks never written, or only before the last clear, report that clear's epoch; restore
  // stamps the blocks whose bytes it changes. A write outside the range to a block it shares
  // counts (blocks are as fine as TF's allocator packs tensors, so neighbouring tensors rarely
  // share one). Thread-safe like write(); an answer reflects the writes before the call.
  static constexpr uint64_t kEpochBlockBytes = 256;
  uint64_t advance_write_epoch() { return m_write_epoch.fetch_add(1); }
  uint64_t last_write_epoch(uint64_t addr, uint64_t n) const;

  // A copy of every written page, and putting one back (the replay check compares a replayed
  // launch's memory with a simulated one's). Pages never written read as zero in both.
  using Snapshot = std::map<uint64_t, std::vector<uint8_t>>;
  Snapshot snapshot() const;
  void restore(const Snapshot& s);
  // The lowest address whose byte differs between this memory and `s`, if any.
  std::optional<uint64_t> first_difference(const Snapshot& s) const;

 private:
  static constexpr uint64_t kTablePages = 4096;  // pages per table: 256 MiB of addresses
  struct Table {
    std::atomic<uint8_t*> pages[kTablePages];
    // Write epochs of each page's blocks (kPageBytes / kEpochBlockBytes each), allocated with
    // the page's first use and kept after the page is released (0: never written).
    std::atomic<std::atomic<uint64_t>*> epochs[kTablePages];
  };
  // Pages come from chunks of host memory (huge-page backed where the host allows) that are
  // kept until the memory is destroyed; released pages are reused. A framework frees and
  // reallocates its buffers every step, so this also spares it host allocations and faults.
  static constexpr uint64_t kChunkBytes = 2 * 1024 * 1024;

  void check(uint64_t addr, uint64_t n) const;
  // The page at index `page`, or nullptr if never written; undefined_page() if written by
  // invalidate() only. No lock.
  uint8_t* find_page(uint64_t page) const {
    const Table* t = m_dir[page / kTablePages].load(std::memory_order_acquire);
    return t ? t->pages[page % kTablePages].load(std::memory_order_acquire) : nullptr;
  }
  // The one page of zeros, mapped read-only, that every page written only by invalidate()
  // points to: such a page is written (present) but holds no data.
  static uint8_t* undefined_page();
  static bool holds(const uint8_t* p) { return p && p != undefined_page(); }
  // The page at index `page`, allocated if it holds no data (never written, or undefined):
  // zero-filled, unless `whole` (the caller overwrites all of it).
  uint8_t* page_for_write(uint64_t page, bool whole);
  // The table of page `page` with the page's write epochs, both allocated if missing. Called
  // with m_alloc held.
  Table* table_with_epochs(uint64_t page);
  static constexpr uint64_t kEpochBlocks = kPageBytes / kEpochBlockBytes;
  // Stamps the blocks of page `page` (allocated once) holding [off, off+len) with the current
  // write epoch.
  void stamp(uint64_t page, uint64_t off, uint64_t len) {
    std::atomic<uint64_t>* e = m_dir[page / kTablePages]
                                   .load(std::memory_order_acquire)
                                   ->epochs[page % kTablePages]
                                   .load(std::memory_order_acquire);
    const uint64_t now = m_write_epoch.load(std::memory_order_relaxed);
    // Most writes find the stamps current: no store, so cores writing neighbouring blocks do
    // not contend for the cache line.
    for (uint64_t b = off / kEpochBlockBytes, end = (off + len - 1) / kEpochBlockBytes; b <= end;
         ++b)
      if (e[b].load(std::memory_order_relaxed) != now) e[b].store(now, std::memory_order_relaxed);
  }
  // Releases the page at index `page` (present) to the spare pool.
  void release(uint64_t page);
  // Calls f(index, page) for every written page, in address order.
  template <typename F>
  void for_each_page(F&& f) const;

  uint64_t m_capacity;
  // Tables, by page / kTablePages: zero-filled host memory from calloc (which the host maps
  // lazily), so that a large capacity costs nothing until used; an all-zero atomic pointer is
  // null.
  struct FreeDir {
    void operator()(std::atomic<Table*>* p) const { std::free(p); }
  };
  std::unique_ptr<std::atomic<Table*>[], FreeDir> m_dir;
  uint64_t m_dir_size = 0;
  std::atomic<uint64_t> m_dir_used{0};  // one past the highest table ever allocated
  std::atomic<uint64_t> m_resident{0};  // pages holding data
  std::atomic<uint64_t> m_write_epoch{1};  // stamped on written blocks (advance_write_epoch)
  std::atomic<uint64_t> m_epoch_floor{0};  // the epoch of the last clear
  std::mutex m_alloc;                   // page and table allocation, the spare pool
  std::vector<uint8_t*> m_spare;        // free pages, contents undefined
  std::vector<void*> m_chunks;          // every chunk mapped
};

}  // namespace npusim
