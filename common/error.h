// Error types shared by all layers. Every message names what was wrong and where.
#pragma once

#include <stdexcept>
#include <string>

namespace npusim {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bad assembly or binary kernel: message is "file:line:col: what".
struct IsaError : Error {
  using Error::Error;
};

// Bad chip configuration: message names file and key.
struct ConfigError : Error {
  using Error::Error;
};

// A fault raised while a kernel executes an instruction (out of bounds, misaligned, illegal
// operand). The simulator adds core, pc and instruction text before reporting it.
struct KernelFault : Error {
  using Error::Error;
};

}  // namespace npusim
