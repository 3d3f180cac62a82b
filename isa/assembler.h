// The assembler: kernel text (syntax in docs/assembly.md) -> Program. Operand order, kinds and
// widths all come from isa.def through describe(); nothing here knows an individual instruction
// except that ldarg's index may name a .arg.
#pragma once

#include <string>
#include <string_view>

#include "isa/isa.h"

namespace npusim::isa {

// Immediate expressions nest at most this many parentheses and unary operators deep (the
// parser recurses once per level); deeper throws IsaError at the level that exceeds it.
inline constexpr int kMaxExprDepth = 256;

// Assembles `text`. source_name is used in error messages and stored in Program::source; the
// kernel name is the .kernel directive or else the file stem of source_name. Every instruction
// keeps its src_line/src_col (1-based, the mnemonic's column); Section::labels holds the labels.
// Throws IsaError "source_name:line:col: what" on the first error.
Program assemble(std::string_view text, const std::string& source_name);

// Reads and assembles a file; a file that cannot be read throws IsaError naming it.
Program assemble_file(const std::string& path);

}  // namespace npusim::isa
