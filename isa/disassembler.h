// The disassembler: instructions back to the assembler's syntax (docs/assembly.md), derived
// from the table like the assembler.
#pragma once

#include <string>

#include "isa/isa.h"

namespace npusim::isa {

// One instruction on one line, without indentation or comment, e.g.
// "vadd.f16 x3, x4, x5, 8, 1, 1, 1, 8, 8, 8". Branch targets print as a label of `section`
// at that index when there is one, else as "@<index>" (which the assembler also accepts).
// Operand codes outside their field's range (possible in hand-built instructions) print as
// "?<kind><value>", which does not re-assemble.
std::string disassemble(const Instruction& in, const Section* section = nullptr);

// An argument's type as written after ".arg NAME, ": "f16", "f16[M, K]"; "" if untyped.
std::string arg_type_text(const ArgInfo& a);

// The full listing: .kernel, .arg (with types) and .section directives, labels and instructions. Assembling
// it gives the same program (name, arguments, sections, labels and instruction words; src_line
// and src_col then refer to the listing).
std::string disassemble(const Program& p);

}  // namespace npusim::isa
