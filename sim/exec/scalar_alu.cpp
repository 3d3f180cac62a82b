#include "sim/exec/scalar_alu.h"

#include <string>

#include "common/error.h"

namespace npusim::scalar_alu_detail {

void fault_not(isa::Opcode op, const char* what) {
  throw KernelFault(std::string(isa::describe(op).mnemonic) + " is not " + what);
}

void fault_division_by_zero() { throw KernelFault("division by zero"); }

}  // namespace npusim::scalar_alu_detail
