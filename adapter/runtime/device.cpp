#include "adapter/runtime/device.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "adapter/runtime/driver.h"
#include "common/error.h"
#include "sim/config/core_taker.h"
#include "sim/verifier/verifier.h"

namespace npusim::rt {

namespace {

// The one device a process may have, or the devices of its one system (SystemC elaborates once
// per process).
struct DeviceRegistry {
  std::mutex mutex;
  std::weak_ptr<Device> device;
  std::vector<std::weak_ptr<Device>> system;  // open_system's devices, chip by chip
  bool opened = false;       // a device was opened in this process (it may be gone now)
  std::string identity;      // config and options of that device, compared on reopen
  std::string description;   // the same for messages
};

DeviceRegistry& registry() {
  static DeviceRegistry r;
  return r;
}

std::string options_text(const SimOptions& s, const RuntimeOptions& r) {
  return fmt::format("functional={} trace={} trace_max_events={} discard_freed_memory={} "
                     "record_launches={}",
                     s.functional, s.trace, s.trace_max_events, r.discard_freed_memory,
                     r.record_launches);
}

std::string describe_device(const ChipConfig& cfg, const SimOptions& s, const RuntimeOptions& r) {
  return fmt::format("chip '{}' (config {} from {}; {})", cfg.name, chip_config_identity(cfg),
                     cfg.source_file, options_text(s, r));
}

std::string describe_system(const SystemConfig& cfg, const SimOptions& s,
                            const RuntimeOptions& r) {
  return fmt::format("system '{}' of {} chips ({} x {}) of chip '{}' (config {} from {}; {})",
                     cfg.name, cfg.chips(), cfg.servers, cfg.chips_per_server, cfg.chip.name,
                     chip_config_identity(cfg.chip), cfg.source_file, options_text(s, r));
}

// The devices of the registry's system while all are alive, else empty.
std::vector<std::shared_ptr<Device>> live_system(const DeviceRegistry& reg) {
  std::vector<std::shared_ptr<Device>> out;
  for (const std::weak_ptr<Device>& w : reg.system) {
    std::shared_ptr<Device> d = w.lock();
    if (!d) return {};
    out.push_back(std::move(d));
  }
  return out;
}

Status already_open(const std::string& wanted, const std::string& existing) {
  return Status(StatusCode::failed_precondition,
                fmt::format("cannot open a device on {}: this process already has a device "
                            "on {}, and the chip config is fixed at the first open (SystemC "
                            "elaborates one chip per process; run another configuration in "
                            "another process)",
                            wanted, existing));
}

Status was_closed(const std::string& wanted, const std::string& existing) {
  return Status(StatusCode::failed_precondition,
                fmt::format("cannot open a device on {}: the device of this process (on {}) "
                            "was closed, and SystemC elaborates one chip per process, so no "
                            "device can be opened again in this process",
                            wanted, existing));
}

// invalid_argument when an output pointer is null (the API never dereferences one).
Status null_output(const char* what) {
  return Status(StatusCode::invalid_argument,
                fmt::format("{}: the output pointer is null", what));
}

Status prefixed(const Status& s, const std::string& where) {
  return s.ok() ? s : Status(s.code(), where + ": " + s.message());
}

}  // namespace

Device::Device(Key, const ChipConfig& cfg, const SimOptions& sim_opts,
               const RuntimeOptions& rt_opts)
    : m_cfg(cfg),
      m_rt_opts(rt_opts),
      // Blocks on whole L2 lines, so no two share a line; the L2 model files a launch's lines
      // by block (KernelLaunch::gm_blocks), so its timing does not depend on where the
      // allocator put them (allocator.h).
      m_allocator(std::make_shared<HbmAllocator>(
          kHbmBase, cfg.hbm_bytes,
          std::max<uint64_t>(HbmAllocator::kAlignment, cfg.l2_line_bytes))),
      m_cache(cfg),
      m_driver(std::make_shared<Driver>(cfg, sim_opts, rt_opts.record_launches)) {}

Device::Device(Key, const ChipConfig& cfg, const RuntimeOptions& rt_opts,
               std::shared_ptr<Driver> driver, int chip)
    : m_cfg(cfg),
      m_rt_opts(rt_opts),
      m_chip(chip),
      m_allocator(std::make_shared<HbmAllocator>(
          kHbmBase, cfg.hbm_bytes,
          std::max<uint64_t>(HbmAllocator::kAlignment, cfg.l2_line_bytes))),
      m_cache(cfg),
      m_driver(std::move(driver)) {}

int Device::chips() const { return m_driver->chips(); }

Device::~Device() = default;

Status Device::open(const ChipConfig& cfg, const SimOptions& sim_opts,
                    const RuntimeOptions& rt_opts, std::shared_ptr<Device>* out) {
  return guard("open device on chip '" + cfg.name + "'", [&]() -> Status {
    DeviceRegistry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    const std::string identity = dump_chip_config_yaml(cfg) + options_text(sim_opts, rt_opts);
    const std::string wanted = describe_device(cfg, sim_opts, rt_opts);
    if (std::shared_ptr<Device> dev = reg.device.lock()) {
      if (reg.identity == identity) {
        *out = dev;
        return Status();
      }
      return already_open(wanted, reg.description);
    }
    if (!live_system(reg).empty()) return already_open(wanted, reg.description);
    if (reg.opened) return was_closed(wanted, reg.description);
    if (cfg.hbm_bytes <= kHbmBase)
      return Status(StatusCode::invalid_argument,
                    fmt::format("chip '{}': memory.hbm.bytes ({}) must exceed the {} bytes the "
                                "runtime reserves below its first allocation",
                                cfg.name, cfg.hbm_bytes, kHbmBase));
    auto dev = std::make_shared<Device>(Key{}, cfg, sim_opts, rt_opts);
    if (Status st = dev->m_driver->start_status(); !st.ok()) return st;
    reg.device = dev;
    reg.opened = true;
    reg.identity = identity;
    reg.description = wanted;
    *out = std::move(dev);
    return Status();
  });
}

Status Device::open_system(const SystemConfig& cfg, const SimOptions& sim_opts,
                           const RuntimeOptions& rt_opts,
                           std::vector<std::shared_ptr<Device>>* out) {
  if (!out) return null_output("open_system");
  return guard("open the devices of system '" + cfg.name + "'", [&]() -> Status {
    DeviceRegistry& reg = registry();
    std::lock_guard<std::mutex> lock(reg.mutex);
    const std::string identity = dump_system_config_yaml(cfg, "chip.yaml") +
                                 dump_chip_config_yaml(cfg.chip) +
                                 options_text(sim_opts, rt_opts);
    const std::string wanted = describe_system(cfg, sim_opts, rt_opts);
    std::vector<std::shared_ptr<Device>> devices = live_system(reg);
    if (!devices.empty()) {
      if (reg.identity != identity) return already_open(wanted, reg.description);
      *out = std::move(devices);
      return Status();
    }
    if (reg.device.lock()) return already_open(wanted, reg.description);
    if (reg.opened) return was_closed(wanted, reg.description);
    if (cfg.chips() < 1)
      return Status(StatusCode::invalid_argument,
                    fmt::format("system '{}' has no chips", cfg.name));
    if (cfg.chip.hbm_bytes <= kHbmBase)
      return Status(StatusCode::invalid_argument,
                    fmt::format("chip '{}' of system '{}': memory.hbm.bytes ({}) must exceed the "
                                "{} bytes the runtime reserves below its first allocation",
                                cfg.chip.name, cfg.name, cfg.chip.hbm_bytes, kHbmBase));
    auto driver = std::make_shared<Driver>(cfg, sim_opts, rt_opts.record_launches);
    if (Status st = driver->start_status(); !st.ok()) return st;
    for (int c = 0; c < cfg.chips(); ++c)
      devices.push_back(std::make_shared<Device>(Key{}, cfg.chip, rt_opts, driver, c));
    reg.system.assign(devices.begin(), devices.end());
    reg.opened = true;
    reg.identity = identity;
    reg.description = wanted;
    *out = std::move(devices);
    return Status();
  });
}

Status Device::open(const std::string& chip, const std::vector<std::string>& overrides,
                    const SimOptions& sim_opts, const RuntimeOptions& rt_opts,
                    std::shared_ptr<Device>* out) {
  ChipConfig cfg;
  Status st = guard("open device: loading chip config '" + chip + "'", [&] {
    cfg = load_chip_config(chip, overrides);
    return Status();
  });
  if (!st.ok()) return st;
  return open(cfg, sim_opts, rt_opts, out);
}

Status Device::malloc(uint64_t bytes, uint64_t* dev_addr) {
  if (!dev_addr) return null_output("malloc");
  return guard("malloc", [&] {
    return prefixed(m_allocator->allocate(bytes, dev_addr),
                    fmt::format("malloc of {} bytes on chip '{}'", bytes, m_cfg.name));
  });
}

Status Device::free(uint64_t dev_addr) {
  const std::string where = fmt::format("free of device address {:#x}", dev_addr);
  return guard(where, [&]() -> Status {
    if (dev_addr == 0) return Status();
    uint64_t size = 0;
    if (Status st = m_allocator->begin_release(dev_addr, &size); !st.ok())
      return prefixed(st, "free");
    Status st;
    if (m_rt_opts.discard_freed_memory)
      st = m_driver->run_task([&] {
        m_driver->gm(m_chip).discard(dev_addr, size);
        return Status();
      });
    m_allocator->finish_release(dev_addr);
    return prefixed(st, where);
  });
}

AllocatorStats Device::memory_stats() const { return m_allocator->stats(); }

Status Device::resident_bytes(uint64_t* bytes) {
  if (!bytes) return null_output("resident_bytes");
  return guard("resident_bytes", [&] {
    return m_driver->run_task([&] {
      *bytes = m_driver->gm(m_chip).resident_bytes();
      return Status();
    });
  });
}

Status Device::create_stream(Stream* out) {
  if (!out) return null_output("create_stream");
  return guard("create_stream", [&] { return m_driver->create_stream(out, m_chip); });
}
Status Device::destroy_stream(Stream s) {
  return guard("destroy_stream", [&] { return m_driver->destroy_stream(s); });
}
Status Device::synchronize_stream(Stream s) {
  return guard("synchronize_stream", [&] { return m_driver->synchronize_stream(s); });
}
Status Device::wait_stream_unobserved(Stream s) {
  return guard("synchronize_stream",
               [&] { return m_driver->synchronize_stream(s, /*host_waits=*/false); });
}
Status Device::query_stream(Stream s, bool* idle) {
  if (!idle) return null_output("query_stream");
  return guard("query_stream", [&] { return m_driver->query_stream(s, idle); });
}
Status Device::stream_status(Stream s) {
  return guard("stream_status", [&] { return m_driver->stream_error(s); });
}
Status Device::synchronize_device() {
  return guard("synchronize_device", [&] { return m_driver->synchronize_all(m_chip); });
}

Status Device::create_event(Event* out) {
  if (!out) return null_output("create_event");
  return guard("create_event", [&] { return m_driver->create_event(out); });
}
Status Device::destroy_event(Event e) {
  return guard("destroy_event", [&] { return m_driver->destroy_event(e); });
}
Status Device::record_event(Event e, Stream s) {
  DeviceOp op;
  op.kind = OpKind::record_event;
  op.event = e.id;
  return enqueue(s, std::move(op));
}
Status Device::stream_wait_event(Stream s, Event e) {
  DeviceOp op;
  op.kind = OpKind::wait_event;
  op.event = e.id;
  return enqueue(s, std::move(op));
}
Status Device::stream_wait_stream(Stream waiter, Stream other, bool order_only) {
  return guard("stream_wait_stream", [&]() -> Status {
    Event e;
    if (Status st = m_driver->create_event(&e); !st.ok()) return st;
    Status st = record_event(e, other);
    if (st.ok()) {
      DeviceOp op;
      op.kind = OpKind::wait_event;
      op.event = e.id;
      op.order_only = order_only;
      st = enqueue(waiter, std::move(op));
    }
    Status destroyed = m_driver->destroy_event(e);  // a pending record still runs
    return st.ok() ? destroyed : st;
  });
}
Status Device::query_event(Event e, bool* complete) {
  if (!complete) return null_output("query_event");
  return guard("query_event", [&] { return m_driver->query_event(e, complete); });
}
Status Device::synchronize_event(Event e) {
  return guard("synchronize_event", [&] { return m_driver->synchronize_event(e); });
}
Status Device::event_elapsed_us(Event start, Event end, double* us) {
  if (!us) return null_output("event_elapsed_us");
  return guard("event_elapsed_us", [&] { return m_driver->elapsed_us(start, end, us); });
}

Status Device::check_range(const char* what, const char* which, uint64_t addr,
                           uint64_t bytes) const {
  if (bytes == 0 || m_allocator->contains(addr, bytes)) return Status();
  return Status(StatusCode::invalid_argument,
                fmt::format("{}: {} device range [{:#x}, {:#x}) ({} bytes) is not inside one "
                            "live allocation", what, which, addr, addr + bytes, bytes));
}

Status Device::enqueue(Stream s, DeviceOp op) {
  op.chip = m_chip;
  return guard(op_kind_name(op.kind), [&] { return m_driver->submit(s, std::move(op)); });
}

Status Device::submit_transfer(const Stream* s, DeviceOp op) {
  const char* what = op_kind_name(op.kind);
  return guard(what, [&]() -> Status {
    auto null_host = [&](const char* which) {
      return Status(StatusCode::invalid_argument,
                    fmt::format("{}: the host {} pointer is null", what, which));
    };
    if (op.kind == OpKind::memcpy_h2d && op.bytes && !op.host_src) return null_host("source");
    if (op.kind == OpKind::memcpy_d2h && op.bytes && !op.host_dst) return null_host("destination");
    if (op.kind == OpKind::memset32 && (op.dst % 4 || op.bytes % 4))
      return Status(StatusCode::invalid_argument,
                    fmt::format("memset32: device address {:#x} and size {} bytes must be "
                                "multiples of 4", op.dst, op.bytes));
    if (op.kind != OpKind::memcpy_d2h)
      if (Status st = check_range(what, "destination", op.dst, op.bytes); !st.ok()) return st;
    if (op.kind == OpKind::memcpy_d2h || op.kind == OpKind::memcpy_d2d)
      if (Status st = check_range(what, "source", op.src, op.bytes); !st.ok()) return st;
    op.chip = m_chip;
    if (s) return m_driver->submit(*s, std::move(op));
    return m_driver->submit_sync(std::move(op));
  });
}

namespace {

DeviceOp transfer_op(OpKind kind, uint64_t dst, uint64_t src, uint64_t bytes) {
  DeviceOp op;
  op.kind = kind;
  op.dst = dst;
  op.src = src;
  op.bytes = bytes;
  return op;
}

DeviceOp h2d_op(uint64_t dst, const void* src, uint64_t bytes) {
  DeviceOp op = transfer_op(OpKind::memcpy_h2d, dst, 0, bytes);
  op.host_src = src;
  return op;
}

DeviceOp d2h_op(void* dst, uint64_t src, uint64_t bytes) {
  DeviceOp op = transfer_op(OpKind::memcpy_d2h, 0, src, bytes);
  op.host_dst = dst;
  return op;
}

DeviceOp memset_op(OpKind kind, uint64_t dst, uint32_t pattern, uint64_t bytes) {
  DeviceOp op = transfer_op(kind, dst, 0, bytes);
  op.pattern = pattern;
  return op;
}

}  // namespace

Status Device::memcpy_h2d_async(Stream s, uint64_t dst, const void* src, uint64_t bytes,
                                CopyTiming timing) {
  DeviceOp op = h2d_op(dst, src, bytes);
  op.timed_by_data = timing == CopyTiming::data && chips() > 1;
  return submit_transfer(&s, std::move(op));
}
Status Device::memcpy_d2h_async(Stream s, void* dst, uint64_t src, uint64_t bytes,
                                CopyTiming timing) {
  DeviceOp op = d2h_op(dst, src, bytes);
  op.timed_by_data = timing == CopyTiming::data && chips() > 1;
  return submit_transfer(&s, std::move(op));
}
Status Device::memcpy_d2d_async(Stream s, uint64_t dst, uint64_t src, uint64_t bytes) {
  return submit_transfer(&s, transfer_op(OpKind::memcpy_d2d, dst, src, bytes));
}
Status Device::memset8_async(Stream s, uint64_t dst, uint8_t value, uint64_t bytes) {
  return submit_transfer(&s, memset_op(OpKind::memset8, dst, value, bytes));
}
Status Device::memset32_async(Stream s, uint64_t dst, uint32_t pattern, uint64_t bytes) {
  return submit_transfer(&s, memset_op(OpKind::memset32, dst, pattern, bytes));
}
Status Device::memcpy_h2d(uint64_t dst, const void* src, uint64_t bytes) {
  return submit_transfer(nullptr, h2d_op(dst, src, bytes));
}
Status Device::memcpy_d2h(void* dst, uint64_t src, uint64_t bytes) {
  return submit_transfer(nullptr, d2h_op(dst, src, bytes));
}
Status Device::memcpy_d2d(uint64_t dst, uint64_t src, uint64_t bytes) {
  return submit_transfer(nullptr, transfer_op(OpKind::memcpy_d2d, dst, src, bytes));
}
Status Device::memset8(uint64_t dst, uint8_t value, uint64_t bytes) {
  return submit_transfer(nullptr, memset_op(OpKind::memset8, dst, value, bytes));
}
Status Device::memset32(uint64_t dst, uint32_t pattern, uint64_t bytes) {
  return submit_transfer(nullptr, memset_op(OpKind::memset32, dst, pattern, bytes));
}

Status Device::memcpy_peer_async(Stream s, Device& dst_device, uint64_t dst, uint64_t src,
                                 uint64_t bytes, CopyTiming timing) {
  return submit_peer_copy(&s, dst_device, dst, src, bytes, timing);
}
Status Device::memcpy_peer(Device& dst_device, uint64_t dst, uint64_t src, uint64_t bytes) {
  return submit_peer_copy(nullptr, dst_device, dst, src, bytes);
}

Status Device::submit_peer_copy(const Stream* s, Device& dst_device, uint64_t dst, uint64_t src,
                                uint64_t bytes, CopyTiming timing) {
  return guard("memcpy_peer", [&]() -> Status {
    if (dst_device.m_driver != m_driver || chips() < 2)
      return Status(StatusCode::invalid_argument,
                    fmt::format("memcpy_peer from chip {}: the destination device is not another "
                                "chip of this device's system",
                                m_chip));
    if (&dst_device == this)
      return Status(StatusCode::invalid_argument,
                    fmt::format("memcpy_peer from chip {} to itself: use memcpy_d2d", m_chip));
    if (Status st = check_range("memcpy_peer", "source", src, bytes); !st.ok()) return st;
    if (Status st = dst_device.check_range("memcpy_peer", "destination", dst, bytes); !st.ok())
      return st;
    DeviceOp op = transfer_op(OpKind::memcpy_peer, dst, src, bytes);
    op.chip = m_chip;
    op.dst_chip = dst_device.m_chip;
    op.timed_by_data = timing == CopyTiming::data;
    if (s) return m_driver->submit(*s, std::move(op));
    return m_driver->submit_sync(std::move(op));
  });
}

Status Device::collective_async(Stream s, const std::shared_ptr<CollectiveGroup>& group,
                                int rank, uint64_t send, uint64_t recv, uint64_t count) {
  return guard("collective", [&]() -> Status {
    if (!group) return Status(StatusCode::invalid_argument, "collective: no group given");
    const std::string what = fmt::format("{} rank {} on chip {}",
                                         collective_name(group->call.kind), rank, m_chip);
    if (chips() < 2)
      return Status(StatusCode::invalid_argument,
                    what + ": the device is a single chip, not a chip of a system of chips");
    CollectiveCall one = group->call;  // this rank's buffer sizes
    one.count = count;
    one.chips.assign(static_cast<size_t>(group->ranks()), 0);
    if (Status st = check_range(what.c_str(), "send", send, collective_send_bytes(one));
        !st.ok())
      return st;
    if (Status st = check_range(what.c_str(), "receive", recv, collective_recv_bytes(one));
        !st.ok())
      return st;
    DeviceOp op = transfer_op(OpKind::collective, recv, send, 0);  // dst: recv, src: send
    op.chip = m_chip;
    op.group = group;
    op.rank = rank;
    op.count = count;
    return m_driver->submit(s, std::move(op));
  });
}

Status Device::collective_async(Stream s, const std::shared_ptr<CollectiveGroup>& group,
                                int rank, std::vector<CollectivePiece> send,
                                std::vector<CollectivePiece> recv, uint64_t count) {
  return guard("collective", [&]() -> Status {
    if (!group) return Status(StatusCode::invalid_argument, "collective: no group given");
    const std::string what = fmt::format("{} rank {} on chip {}",
                                         collective_name(group->call.kind), rank, m_chip);
    if (group->call.kind != CollectiveKind::all_reduce &&
        group->call.kind != CollectiveKind::broadcast)
      return Status(StatusCode::invalid_argument,
                    what + ": buffers in pieces are for all_reduce and broadcast only");
    if (send.empty() || recv.empty())
      return Status(StatusCode::invalid_argument, what + ": no buffer pieces given");
    if (chips() < 2)
      return Status(StatusCode::invalid_argument,
                    what + ": the device is a single chip, not a chip of a system of chips");
    const uint64_t bytes = count * static_cast<uint64_t>(isa::dtype_size(group->call.dtype));
    for (auto [name, list] : {std::pair{"send", &send}, {"receive", &recv}}) {
      uint64_t total = 0;
      for (const CollectivePiece& p : *list) {
        if (Status st = check_range(what.c_str(), name, p.addr, p.bytes); !st.ok()) return st;
        total += p.bytes;
      }
      if (total != bytes)
        return Status(StatusCode::invalid_argument,
                      fmt::format("{}: the {} pieces hold {} bytes, {} elements need {}", what,
                                  name, total, count, bytes));
    }
    DeviceOp op = transfer_op(OpKind::collective, recv[0].addr, send[0].addr, 0);
    op.chip = m_chip;
    op.group = group;
    op.rank = rank;
    op.count = count;
    op.send_pieces = std::move(send);
    op.recv_pieces = std::move(recv);
    return m_driver->submit(s, std::move(op));
  });
}

Status Device::check_launch(const std::shared_ptr<const isa::Program>& program,
                            const std::vector<uint64_t>& args, int block_dim) {
  if (!program) return Status(StatusCode::invalid_argument, "launch_kernel: no program");
  const isa::Program& p = *program;
  if (block_dim < 1)
    return Status(StatusCode::invalid_argument,
                  fmt::format("launch_kernel: kernel '{}': block_dim {} must be at least 1",
                              p.name, block_dim));
  if (!p.arg_names.empty() && args.size() != p.arg_names.size())
    return Status(StatusCode::invalid_argument,
                  fmt::format("launch_kernel: kernel '{}' declares {} arguments ({}) but the "
                              "launch passes {}",
                              p.name, p.arg_names.size(), fmt::join(p.arg_names, ", "),
                              args.size()));
  {
    std::lock_guard<std::mutex> lock(m_verified_mutex);
    auto it = m_verified.find(&p);
    if (it != m_verified.end() && it->second.lock() == program) return Status();
  }
  try {
    isa::verify_or_throw(p, m_cfg);
  } catch (const IsaError& e) {
    return Status(StatusCode::invalid_argument,
                  fmt::format("launch_kernel: kernel '{}' fails verification on chip '{}':\n{}",
                              p.name, m_cfg.name, e.what()));
  }
  std::lock_guard<std::mutex> lock(m_verified_mutex);
  if (m_verified.size() >= 1024)  // drop programs that no longer exist
    for (auto it = m_verified.begin(); it != m_verified.end();)
      it = it->second.expired() ? m_verified.erase(it) : std::next(it);
  m_verified[&p] = program;
  return Status();
}

Status Device::launch_kernel(Stream s, std::shared_ptr<const isa::Program> program,
                             std::vector<uint64_t> args, int block_dim) {
  return launch_kernel(s, std::move(program), std::move(args), block_dim, nullptr);
}

Status Device::launch_kernel(Stream s, std::shared_ptr<const isa::Program> program,
                             std::vector<uint64_t> args, int block_dim,
                             std::shared_ptr<const LaunchLabel> label) {
  return guard("launch_kernel", [&] {
    return submit_launch(s, std::move(program), std::move(args), block_dim, std::move(label), {});
  });
}

Status Device::submit_launch(Stream s, std::shared_ptr<const isa::Program> program,
                             std::vector<uint64_t> args, int block_dim,
                             std::shared_ptr<const LaunchLabel> label, DerivedSource derived) {
  if (Status st = check_launch(program, args, block_dim); !st.ok()) return st;
  DeviceOp op;
  op.kind = OpKind::launch;
  op.program = std::move(program);
  op.label = std::move(label);
  op.args = std::move(args);
  op.block_dim = block_dim;
  op.derived = std::move(derived);
  op.gm_blocks = [allocator = m_allocator](uint64_t addr, uint64_t* start, uint64_t* bytes) {
    return allocator->block_of(addr, start, bytes);
  };
  op.chip = m_chip;
  return m_driver->submit(s, std::move(op));
}

Status Device::launch_group(Stream s, std::vector<GroupLaunch> launches) {
  return guard("launch_group", [&]() -> Status {
    if (launches.size() == 1)
      return submit_launch(s, std::move(launches[0].program), std::move(launches[0].args),
                           launches[0].block_dim, std::move(launches[0].label), {});
    DeviceOp group;
    group.kind = OpKind::launch_group;
    group.chip = m_chip;
    // Refused before anything is queued: what the chip would refuse only when the group runs.
    const CoreTaker idle_chip(m_cfg);
    for (size_t j = 0; j < launches.size(); ++j) {
      const GroupLaunch& l = launches[j];
      if (Status st = check_launch(l.program, l.args, l.block_dim); !st.ok()) return st;
      for (const size_t k : l.after)
        if (k >= j)
          return Status(StatusCode::invalid_argument,
                        fmt::format("launch_group: launch {} (kernel '{}') waits for launch {}, "
                                    "which is not earlier",
                                    j, l.program->name, k));
      // Its blocks take cores as they free, in waves where block_dim exceeds its workers: it
      // needs one worker on the idle chip.
      std::string no_worker;
      try {
        if (idle_chip.idle_workers(*l.program) == 0)
          no_worker = fmt::format("chip '{}' has no core of its kind", m_cfg.name);
      } catch (const Error& e) {  // a mix kernel's vector cores per block (mix_aiv_per_block)
        no_worker = e.what();
      }
      if (!no_worker.empty())
        return Status(StatusCode::invalid_argument,
                      fmt::format("launch_group: launch {} (kernel '{}', block_dim {}) cannot "
                                  "run: {}",
                                  j, l.program->name, l.block_dim, no_worker));
    }
    for (size_t j = 0; j < launches.size(); ++j) {
      GroupLaunch& l = launches[j];
      DeviceOp op;
      op.kind = OpKind::launch;
      op.program = std::move(l.program);
      op.label = std::move(l.label);
      op.args = std::move(l.args);
      op.block_dim = l.block_dim;
      op.gm_blocks = [allocator = m_allocator](uint64_t addr, uint64_t* start, uint64_t* bytes) {
        return allocator->block_of(addr, start, bytes);
      };
      op.chip = m_chip;
      op.group_after = std::move(l.after);
      group.members.push_back(std::move(op));
    }
    return m_driver->submit(s, std::move(group));
  });
}

Status Device::launch_derived(Stream s, std::shared_ptr<const isa::Program> program,
                             std::vector<uint64_t> args, int block_dim,
                             std::shared_ptr<const LaunchLabel> label, DerivedSource source) {
  return guard("launch_derived", [&]() -> Status {
    if (!source.state)
      return Status(StatusCode::invalid_argument, "launch_derived: no DerivedState given");
    if (Status st = check_range("launch_derived", "source", source.addr, source.bytes); !st.ok())
      return st;
    for (const DerivedRange& r : source.more)
      if (Status st = check_range("launch_derived", "source", r.addr, r.bytes); !st.ok())
        return st;
    return submit_launch(s, std::move(program), std::move(args), block_dim, std::move(label),
                         std::move(source));
  });
}

Status Device::launch_callback(Stream s, HostCallback callback) {
  DeviceOp op;
  op.kind = OpKind::host_callback;
  op.callback = std::move(callback);
  return enqueue(s, std::move(op));
}

Status Device::ai_cpu_task_async(Stream s, AiCpuTask task) {
  return guard("ai_cpu_task_async", [&]() -> Status {
    const std::string what = "ai_cpu_task_async '" + task.kernel + "'";
    if (!task.compute)
      return Status(StatusCode::invalid_argument, what + ": no compute function given");
    for (const DerivedRange& r : task.inputs)
      if (Status st = check_range(what.c_str(), "input", r.addr, r.bytes); !st.ok()) return st;
    for (const DerivedRange& r : task.outputs)
      if (Status st = check_range(what.c_str(), "output", r.addr, r.bytes); !st.ok()) return st;
    DeviceOp op;
    op.kind = OpKind::ai_cpu_task;
    op.ai_cpu = std::make_shared<const AiCpuTask>(std::move(task));
    return enqueue(s, std::move(op));
  });
}

std::vector<LaunchRecord> Device::launch_records() const {
  return m_driver->launch_records(m_chip);
}
std::vector<CopyRecord> Device::copy_records() const { return m_driver->copy_records(m_chip); }
std::vector<CollectiveRecord> Device::collective_records() const {
  return m_driver->collective_records();
}
std::vector<AiCpuRecord> Device::ai_cpu_records() const {
  return m_driver->ai_cpu_records(m_chip);
}
void Device::clear_launch_records() { m_driver->clear_launch_records(); }

Status Device::add_observer(ChipObserver* observer) {
  if (!observer) return Status(StatusCode::invalid_argument, "add_observer: no observer given");
  return guard("add_observer", [&] {
    return m_driver->run_task([&] {
      if (Simulator* sim = m_driver->simulator()) sim->add_observer(observer);
      else m_driver->system()->add_observer(m_chip, observer);
      return Status();
    });
  });
}

Status Device::remove_observer(ChipObserver* observer) {
  if (!observer)
    return Status(StatusCode::invalid_argument, "remove_observer: no observer given");
  return guard("remove_observer", [&] {
    return m_driver->run_task([&] {
      if (Simulator* sim = m_driver->simulator()) sim->remove_observer(observer);
      else m_driver->system()->remove_observer(m_chip, observer);
      return Status();
    });
  });
}

Status Device::device_time_cycles(uint64_t* cycles) {
  if (!cycles) return null_output("device_time_cycles");
  return guard("device_time_cycles", [&] {
    return m_driver->run_task([&] {
      *cycles = std::max({m_driver->device_cycles(m_chip), m_driver->comm_cycles(m_chip),
                          m_driver->copy_cycles(m_chip), m_driver->ai_cpu_cycles(m_chip)});
      return Status();
    });
  });
}

Status Device::host_time_cycles(uint64_t* cycles) {
  if (!cycles) return null_output("host_time_cycles");
  *cycles = m_driver->host_cycles();
  return Status();
}

Status Device::counters(nlohmann::json* tree) {
  if (!tree) return null_output("counters");
  return guard("counters", [&] {
    return m_driver->run_task([&] {
      if (Simulator* sim = m_driver->simulator()) {
        *tree = sim->counters();
      } else {
        nlohmann::json all = m_driver->system()->counters();
        *tree = all[fmt::format("chip{}", m_chip)];
      }
      return Status();
    });
  });
}

Status Device::system_counters(nlohmann::json* tree) {
  if (!tree) return null_output("system_counters");
  return guard("system_counters", [&] {
    return m_driver->run_task([&] {
      if (Simulator* sim = m_driver->simulator()) *tree = sim->counters();
      else *tree = m_driver->system()->counters();
      return Status();
    });
  });
}

Status Device::trace(nlohmann::json* chrome_trace) {
  if (!chrome_trace) return null_output("trace");
  return guard("trace", [&] {
    return m_driver->run_task([&] {
      if (Simulator* sim = m_driver->simulator()) *chrome_trace = sim->trace();
      else *chrome_trace = m_driver->system()->trace(m_chip);
      return Status();
    });
  });
}

}  // namespace npusim::rt
