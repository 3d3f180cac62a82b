// Status values returned by every host-runtime call. The runtime never lets an exception escape
// its API: failures come back as a code plus a message that names the operation, the object
// (kernel, stream, event, address range) and the reason.
#pragma once

#include <exception>
#include <new>
#include <string>
#include <utility>

#include "common/error.h"

namespace npusim::rt {

enum class StatusCode {
  ok,
  invalid_argument,     // a bad handle, size, range, launch or program (verifier issues)
  out_of_memory,        // the device allocator cannot satisfy a request
  kernel_fault,         // a kernel faulted or deadlocked on the chip
  unsupported,          // an op, dtype or attribute the compiler/runtime does not handle
  failed_precondition,  // the call is not allowed in the current state (second device, ...)
  internal,             // a bug or an unexpected failure inside the runtime or simulator
};

// "ok", "invalid_argument", ...
const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(StatusCode code, std::string message) : m_code(code), m_message(std::move(message)) {}

  bool ok() const { return m_code == StatusCode::ok; }
  StatusCode code() const { return m_code; }
  const std::string& message() const { return m_message; }
  // "<code>: <message>", or "ok".
  std::string to_string() const;

 private:
  StatusCode m_code = StatusCode::ok;
  std::string m_message;
};

inline Status ok_status() { return Status(); }

// Runs f (returning Status) and turns any exception it throws into a status whose message starts
// with `where`: npusim::ConfigError and IsaError -> invalid_argument, KernelFault ->
// kernel_fault, std::bad_alloc -> out_of_memory (host memory), anything else -> internal.
template <typename F>
Status guard(const std::string& where, F&& f) noexcept {
  try {
    return f();
  } catch (const ConfigError& e) {
    return Status(StatusCode::invalid_argument, where + ": " + e.what());
  } catch (const IsaError& e) {
    return Status(StatusCode::invalid_argument, where + ": " + e.what());
  } catch (const KernelFault& e) {
    return Status(StatusCode::kernel_fault, where + ": " + e.what());
  } catch (const std::bad_alloc&) {
    return Status(StatusCode::out_of_memory, where + ": host memory exhausted");
  } catch (const std::exception& e) {
    return Status(StatusCode::internal, where + ": " + e.what());
  } catch (...) {
    return Status(StatusCode::internal, where + ": unknown exception");
  }
}

}  // namespace npusim::rt
