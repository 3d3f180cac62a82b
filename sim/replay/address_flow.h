// Where a kernel's tensor addresses can go: a static analysis of a program's scalar code that
// tells whether moving its tensors (other typed arguments, isa::ArgInfo) can change anything but
// the GM addresses its transfers touch, and by how much those move.
//
// The timing-only launch replay by translation (sim/replay/launch_replay.h, Translation) rests on
// it: if every value derived from a typed argument reaches only the GM address operand of a
// transfer, and only as "that argument plus a value that does not depend on any typed argument",
// then a launch of the same program with the same untyped arguments and block count at other
// tensor addresses runs the same scalar instructions with the same operands, except that each
// transfer's GM address moves by exactly its argument's displacement. Its instructions' costs
// (plan(), which reads a GM address only to form its ranges and to check its alignment) and
// control flow are then the recorded run's, and only the L2 could tell the launches apart.
//
// The analysis is an abstract interpretation of each section over the lattice
//   Bot < Fixed < Data < Top,  Bot < Arg(k) < Top
// per scalar register, where Fixed is a value that is the same for every launch with the same
// untyped arguments and block count, Arg(k) is argument k's value plus a Fixed value (for an
// untyped argument k that is Fixed too, but its provenance is kept for the GM operands), Data
// is a value computed from what ld loaded (and Fixed values), and Top is anything else.
// Registers start Fixed at every block (AiCore::run_block resets them). Data may reach only
// data operands (the vector unit's xscalar, the value st stores), whose values plan() does not
// read; so a kernel that broadcasts a loaded scalar (an optimizer's learning rate) moves with
// its tensors too. A branch may also compare two registers that hold Arg(k) of one argument k
// (a pointer against the last one, against its tensor's end): both move by the argument's
// displacement, so their difference, and the outcome, stay; likewise a sub of two Arg(k) is
// Fixed. ld and st take their address, a GM operand, like a transfer (the scalar
// unit's accesses do not go through the L2: docs/chip_model.md).
//
// Cross-core flags (cc_set / cc_wait) are followed too: their operands are immediates, and a
// core's progress is turned into time only, never into a register value. By induction over the
// simulated run, two launches of one key whose instructions cost the same and whose transfers
// see the same L2 hits and misses (the translated replay's conditions) reach every cc_set and
// cc_wait at the same times, so the waits end at the same times as well. The analysis notes
// them (AddressFlow::cross_core); whether such a program replays is the caller's choice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "isa/isa.h"

namespace npusim {

struct AddressFlow {
  // Whether the program moves with its tensors as above. If not, `why` names the first reason
  // ("section aiv pc 12: the branch reads x3, derived from a tensor address").
  bool ok = false;
  std::string why;
  // For each section of the program, for each pc: the argument whose address (plus a fixed
  // offset) the instruction's GM operand (a transfer's, ld's or st's) holds, or -1 if it has
  // none. Filled if ok.
  std::vector<std::vector<int16_t>> gm_arg;
  // Whether the program has cc_set or cc_wait (analysed whether ok or not, up to `why`).
  bool cross_core = false;
  // Not ok (`why` says where a loaded value goes), but the program moves with its tensors among
  // launches whose every ld reads the bytes it read in the recorded launch: the analysis with a
  // loaded value taken as Fixed is ok. By induction over each core's run, the launches then
  // load the same values, take the same branches and issue the same operands, each GM operand
  // moved by its argument's displacement (the loads' addresses too, which is where the next
  // launch's bytes are compared: record_translation, loads_as_recorded). A gather's row
  // address (params + index * row), a segment sum's branch on its segment id, an int64
  // kernel's loop on a value's words. gm_arg is filled as for ok.
  bool steered = false;
};

// Analyses `program` (every section; again with loaded values taken as Fixed if not ok and it has
// ld: AddressFlow::steered). A program with a loaded value or tensor address anywhere but
// where allowed above (a divisor included: one launch's may be zero), or a GM operand not derived
// from exactly one argument is not ok.
AddressFlow analyze_address_flow(const isa::Program& program);

}  // namespace npusim
