// The binary kernel format (.npuk): a Program's instruction words plus the names, labels and
// source line table that let errors and disassembly after loading point at the assembly source.
// Layout in docs/assembly.md ("Binary kernel format"). All integers little-endian.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "isa/isa.h"

namespace npusim::isa {

inline constexpr char kKernelMagic[4] = {'N', 'P', 'U', 'K'};
// Version written for a program that declares a mix ratio (Program::aiv_per_aic). 2 added
// argument types, 3 the mix ratio; a program without one is written as version 2. read_kernel
// still reads versions 1 (whose arguments are all untyped) and 2 (no declared ratio).
inline constexpr uint16_t kKernelVersion = 3;
inline constexpr uint16_t kKernelVersionWithoutMixRatio = 2;
inline constexpr uint16_t kKernelOldestVersion = 1;
// Argument type table: the code of an untyped argument (typed ones use the Dt field codes).
inline constexpr uint8_t kUntypedArgCode = 255;

// Serialises p. Throws IsaError "source:line:col: ..." if an operand does not fit its field, and
// "source: ..." if p.args does not match p.arg_names or a dimension is neither a decimal literal
// nor the name of an untyped argument.
std::vector<uint8_t> write_kernel(const Program& p);

// Parses a binary kernel. source_name (the binary's own name) is used in error messages; the
// Program's source is the assembly file name stored in the binary (source_name if none was
// stored). Throws IsaError "source_name: byte offset N: what" on a bad magic or version,
// truncation, an illegal opcode or operand, a bad string or label index, a duplicate argument,
// a bad argument type or dimension, or trailing bytes.
Program read_kernel(const std::vector<uint8_t>& bytes, const std::string& source_name);

// File helpers; an unreadable or unwritable file throws IsaError naming it.
void write_kernel_file(const Program& p, const std::string& path);
Program read_kernel_file(const std::string& path);

// True if bytes start with the binary kernel magic.
bool is_kernel_binary(const std::vector<uint8_t>& bytes);
// Loads a kernel from a binary (.npuk, recognised by its magic) or an assembly file.
Program load_program_file(const std::string& path);

}  // namespace npusim::isa
