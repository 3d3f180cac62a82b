// Static checks of a program against a chip: rejects before running what would fault or hang.
// Checks (docs/assembly.md, "Verifier"):
//   - sections vs chip: split chips run aic/aiv sections of core kinds the chip has; coupled
//     chips run exactly one section (any kind) on their AI cores;
//   - every pipe an instruction uses exists on the section's core kind; every buffer and data
//     path it uses exists (ChipConfig::has_path, CoreKindConfig::has); data types fit the
//     instruction (vector type sets from sim/exec/vector_ops.h, fractal element sizes, the
//     cube's types on this chip);
//   - flags: ids below cfg.flag_ids (cross_core_flag_ids for cc_*), src != dst, no "all", and
//     every set_flag (src, dst, id) of a section has a wait_flag with the same triple and vice
//     versa; cross-core flags only on split chips;
//   - control: branch targets inside the section; the last instruction is end or jmp;
//   - bounds and alignment: a forward constant propagation over the scalar instructions (all
//     knowledge dropped at labels and branch targets) and, for every pipe instruction whose
//     operands are all known, sim/exec's plan() on a CoreMemory of the section's core kind; a
//     KernelFault becomes an issue. GM addresses are not checked (they come from arguments).
// It sits above the instruction model (sim/exec) so that it applies the model's own rules; its
// functions keep the isa namespace of the programs they check.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "isa/isa.h"
#include "sim/config/chip_config.h"

namespace npusim::isa {

struct VerifyIssue {
  uint32_t line = 0, col = 0;  // the instruction's source position (0: the section as a whole)
  CoreKind section = CoreKind::AICORE;
  std::string message;
};

// All issues of p on chip cfg, per section in source order; empty if p passes.
std::vector<VerifyIssue> verify(const Program& p, const ChipConfig& cfg);

// Throws IsaError listing every issue, one per line as "file:line:col: section: message".
void verify_or_throw(const Program& p, const ChipConfig& cfg);

}  // namespace npusim::isa
