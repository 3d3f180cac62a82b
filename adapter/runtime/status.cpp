#include "adapter/runtime/status.h"

namespace npusim::rt {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::ok: return "ok";
    case StatusCode::invalid_argument: return "invalid_argument";
    case StatusCode::out_of_memory: return "out_of_memory";
    case StatusCode::kernel_fault: return "kernel_fault";
    case StatusCode::unsupported: return "unsupported";
    case StatusCode::failed_precondition: return "failed_precondition";
    case StatusCode::internal: return "internal";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(m_code)) + ": " + m_message;
}

}  // namespace npusim::rt
