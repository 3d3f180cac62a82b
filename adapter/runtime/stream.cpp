#include "adapter/runtime/stream.h"

#include <fmt/format.h>

namespace npusim::rt {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::memcpy_h2d: return "memcpy_h2d";
    case OpKind::memcpy_d2h: return "memcpy_d2h";
    case OpKind::memcpy_d2d: return "memcpy_d2d";
    case OpKind::memset8: return "memset8";
    case OpKind::memset32: return "memset32";
    case OpKind::launch: return "launch";
    case OpKind::record_event: return "record_event";
    case OpKind::wait_event: return "wait_event";
    case OpKind::host_callback: return "host_callback";
    case OpKind::memcpy_peer: return "memcpy_peer";
    case OpKind::collective: return "collective";
    case OpKind::ai_cpu_task: return "ai_cpu_task";
    case OpKind::launch_group: return "launch_group";
  }
  return "unknown";
}

std::string DeviceOp::describe() const {
  switch (kind) {
    case OpKind::memcpy_h2d:
      return fmt::format("memcpy_h2d of {} bytes to device [{:#x}, {:#x})", bytes, dst,
                         dst + bytes);
    case OpKind::memcpy_d2h:
      return fmt::format("memcpy_d2h of {} bytes from device [{:#x}, {:#x})", bytes, src,
                         src + bytes);
    case OpKind::memcpy_d2d:
      return fmt::format("memcpy_d2d of {} bytes from device [{:#x}, {:#x}) to [{:#x}, {:#x})",
                         bytes, src, src + bytes, dst, dst + bytes);
    case OpKind::memset8:
      return fmt::format("memset8 of {} bytes at device [{:#x}, {:#x}) to {:#04x}", bytes, dst,
                         dst + bytes, pattern & 0xff);
    case OpKind::memset32:
      return fmt::format("memset32 of {} bytes at device [{:#x}, {:#x}) to {:#010x}", bytes, dst,
                         dst + bytes, pattern);
    case OpKind::launch:
      return fmt::format("launch of kernel '{}' (block_dim {})", program ? program->name : "",
                         block_dim);
    case OpKind::record_event: return fmt::format("record_event {}", event);
    case OpKind::wait_event:
      return fmt::format("wait_event {}{}", event, order_only ? " (order only)" : "");
    case OpKind::host_callback: return "host_callback";
    case OpKind::memcpy_peer:
      return fmt::format("memcpy_peer of {} bytes from chip {} [{:#x}, {:#x}) to chip {} [{:#x}, "
                         "{:#x})",
                         bytes, chip, src, src + bytes, dst_chip, dst, dst + bytes);
    case OpKind::collective:
      return fmt::format("{} rank {} on chip {}{}",
                         group ? collective_name(group->call.kind) : "collective", rank, chip,
                         group && !group->label.empty() ? " (" + group->label + ")" : "");
    case OpKind::ai_cpu_task:
      return fmt::format("AI CPU task '{}'{}", ai_cpu ? ai_cpu->kernel : "",
                         ai_cpu && ai_cpu->label ? " (" + ai_cpu->label->op_name + ")" : "");
    case OpKind::launch_group: {
      std::string kernels;
      for (const DeviceOp& m : members)
        kernels += (kernels.empty() ? "" : ", ") + m.describe();
      return fmt::format("launch_group of {} launches ({})", members.size(), kernels);
    }
  }
  return "unknown op";
}

}  // namespace npusim::rt
