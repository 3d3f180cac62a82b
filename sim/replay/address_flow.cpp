#include "sim/replay/address_flow.h"

#include <algorithm>
#include <array>
#include <limits>
#include <string_view>

#include <fmt/format.h>

namespace npusim {

using isa::FieldKind;
using isa::Opcode;

namespace {

// A register's abstract value: kBot, kFixed, kData, kTop or an argument index (Arg(k)).
using Val = int32_t;
constexpr Val kBot = -4, kData = -3, kTop = -2, kFixed = -1;
using State = std::array<Val, isa::kNumRegs>;

struct Lattice {
  std::vector<bool> typed;  // by argument index
  // The same for every launch with the same untyped arguments.
  bool fixed(Val v) const { return v == kFixed || (v >= 0 && !typed[static_cast<size_t>(v)]); }
  // Fixed or loaded data: no tensor address in it.
  bool addressless(Val v) const { return fixed(v) || v == kData; }
  Val join(Val a, Val b) const {
    if (a == b || b == kBot) return a;
    if (a == kBot) return b;
    if (fixed(a) && fixed(b)) return kFixed;
    if (addressless(a) && addressless(b)) return kData;
    return kTop;
  }
  // a + b, a - b, or another operation of the scalar ALU.
  Val add(Val a, Val b) const {
    if (a == kBot || b == kBot) return kBot;
    if (a >= 0 && fixed(b)) return a;
    if (b >= 0 && fixed(a)) return b;
    return other(a, b);
  }
  Val sub(Val a, Val b) const {
    if (a == kBot || b == kBot) return kBot;
    if (a >= 0 && fixed(b)) return a;
    if (a >= 0 && a == b) return kFixed;  // the argument cancels
    return other(a, b);
  }
  Val other(Val a, Val b) const {
    if (a == kBot || b == kBot) return kBot;
    if (fixed(a) && fixed(b)) return kFixed;
    return addressless(a) && addressless(b) ? kData : kTop;
  }
};

bool is_alu(Opcode op) {
  switch (op) {
    case Opcode::op_add:
    case Opcode::op_sub:
    case Opcode::op_mul:
    case Opcode::op_div:
    case Opcode::op_rem:
    case Opcode::op_and:
    case Opcode::op_or:
    case Opcode::op_xor:
    case Opcode::op_shl:
    case Opcode::op_shr:
    case Opcode::op_min:
    case Opcode::op_max: return true;
    default: return false;
  }
}

// Instructions whose first field (xd) is a register they write, and which read none that
// matters here (their operands are followed through the lattice instead).
bool writes_xd(Opcode op) {
  switch (op) {
    case Opcode::op_movi:
    case Opcode::op_mov:
    case Opcode::op_ldarg:
    case Opcode::op_get_block_id:
    case Opcode::op_get_block_num:
    case Opcode::op_get_subblock_id:
    case Opcode::op_get_core_id:
    case Opcode::op_ld: return true;
    default: return is_alu(op);
  }
}

bool is_conditional_branch(Opcode op) {
  return op == Opcode::op_beq || op == Opcode::op_bne || op == Opcode::op_blt ||
         op == Opcode::op_bge;
}

// The field holding the instruction's GM address, or -1 (no GM operand).
int gm_field(const isa::Instruction& in) {
  switch (in.op) {
    case Opcode::op_copy_gm2l1:
    case Opcode::op_copy_gm2ub:
    case Opcode::op_nd2nz: return isa::field_index(in.op, "xsrc");
    case Opcode::op_copy_ub2gm: return isa::field_index(in.op, "xdst");
    case Opcode::op_ld:
    case Opcode::op_st: return isa::field_index(in.op, "xaddr");
    case Opcode::op_fixpipe: {
      const int dst = isa::field_index(in.op, "dst");
      if (in.ops[static_cast<size_t>(dst)].value != static_cast<int64_t>(isa::Buf::GM)) return -1;
      return isa::field_index(in.op, "xdst");
    }
    default: return -1;
  }
}

// Whether field f of `in` is only data: its value reaches results, never a cost, an address
// or the control flow (the vector unit's scalar operand, which sim/exec/vector.cpp reads in
// execute() only, and the value st stores).
bool data_field(const isa::Instruction& in, size_t f) {
  const std::string_view name = in.desc().fields[f].name;
  return name == "xscalar" || (in.op == Opcode::op_st && name == "xs");
}

// Successor pcs of `in` at `pc` (n: the section's length; a pc >= n ends the block).
int successors(const isa::Instruction& in, uint32_t pc, uint32_t n, uint32_t out[2]) {
  int k = 0;
  const auto target = [&] {
    const auto& f = in.desc().fields;
    for (size_t i = 0; i < f.size(); ++i)
      if (f[i].kind == FieldKind::Label) return static_cast<uint64_t>(in.ops[i].value);
    return uint64_t{n};
  };
  switch (in.op) {
    case Opcode::op_end: return 0;
    case Opcode::op_jmp:
      if (target() < n) out[k++] = static_cast<uint32_t>(target());
      return k;
    case Opcode::op_beq:
    case Opcode::op_bne:
    case Opcode::op_blt:
    case Opcode::op_bge:
      if (target() < n) out[k++] = static_cast<uint32_t>(target());
      break;
    default: break;
  }
  if (pc + 1 < n) out[k++] = pc + 1;
  return k;
}

std::string describe(Val v, const Lattice& l) {
  if (v == kTop) return "a value mixed from tensor addresses";
  if (v == kData) return "a loaded value";
  if (v >= 0 && l.typed[static_cast<size_t>(v)]) return fmt::format("tensor argument {}", v);
  return "a value not derived from an argument";
}

}  // namespace

namespace {

// The analysis above; with loads_fixed, a loaded value is Fixed (the same in every launch of the
// key), as it is among launches that load the same bytes (AddressFlow::steered).
AddressFlow analyze(const isa::Program& program, bool loads_fixed) {
  AddressFlow flow;
  Lattice lat;
  const size_t nargs = program.arg_names.size();
  for (size_t i = 0; i < nargs; ++i) lat.typed.push_back(program.arg(i).typed());
  if (nargs > static_cast<size_t>(std::numeric_limits<int16_t>::max())) {
    flow.why = "too many arguments";
    return flow;
  }
  auto reg = [](const isa::Operand& o) { return static_cast<size_t>(o.value) % isa::kNumRegs; };
  for (const isa::Section& s : program.sections) {
    const uint32_t n = static_cast<uint32_t>(s.code.size());
    const std::string where = isa::core_kind_name(s.kind);
    State bot;
    bot.fill(kBot);
    std::vector<State> in(n, bot);
    std::vector<bool> reached(n, false);
    std::vector<uint32_t> work;
    if (n > 0) {
      in[0].fill(kFixed);
      reached[0] = true;
      work.push_back(0);
    }
    // Forward to the fixpoint (the lattice has height 4 per register).
    while (!work.empty()) {
      const uint32_t pc = work.back();
      work.pop_back();
      const isa::Instruction& ins = s.code[pc];
      if (static_cast<int>(ins.op) >= isa::kNumOpcodes) {
        flow.why = fmt::format("section {} pc {}: an unknown opcode is not followed", where, pc);
        return flow;
      }
      // cc_set / cc_wait take immediates only and write no register (isa.def): they order the
      // cores in time, and time is the same in every launch of the key (header).
      flow.cross_core =
          flow.cross_core || ins.op == Opcode::op_cc_set || ins.op == Opcode::op_cc_wait;
      State out = in[pc];
      if (writes_xd(ins.op)) {
        Val& d = out[reg(ins.ops[0])];
        const State& r = in[pc];
        const auto b = [&] { return ins.ops[2].is_reg ? r[reg(ins.ops[2])] : kFixed; };
        switch (ins.op) {
          case Opcode::op_mov: d = r[reg(ins.ops[1])]; break;
          case Opcode::op_ld: d = loads_fixed ? kFixed : kData; break;
          case Opcode::op_ldarg:
            d = ins.ops[1].value >= 0 && static_cast<size_t>(ins.ops[1].value) < nargs
                    ? static_cast<Val>(ins.ops[1].value)
                    : kTop;
            break;
          case Opcode::op_add: d = lat.add(r[reg(ins.ops[1])], b()); break;
          case Opcode::op_sub: d = lat.sub(r[reg(ins.ops[1])], b()); break;
          default: d = is_alu(ins.op) ? lat.other(r[reg(ins.ops[1])], b()) : kFixed; break;
        }
      }
      uint32_t next[2];
      for (int i = 0, k = successors(ins, pc, n, next); i < k; ++i) {
        State& t = in[next[i]];
        bool changed = !reached[next[i]];
        reached[next[i]] = true;
        for (size_t x = 0; x < t.size(); ++x) {
          const Val j = lat.join(t[x], out[x]);
          changed = changed || j != t[x];
          t[x] = j;
        }
        if (changed) work.push_back(next[i]);
      }
    }
    // At the fixpoint: every register an instruction reads must be fixed, but the GM operand,
    // which must be one argument plus a fixed offset, and data operands, which may hold
    // anything.
    std::vector<int16_t> gm(n, -1);
    for (uint32_t pc = 0; pc < n; ++pc) {
      if (!reached[pc]) continue;
      const isa::Instruction& ins = s.code[pc];
      // A divisor that is not fixed may be zero in one launch and not in another: the fault
      // (KernelFault "division by zero") would then differ.
      if ((ins.op == Opcode::op_div || ins.op == Opcode::op_rem) && ins.ops[2].is_reg &&
          !lat.fixed(in[pc][reg(ins.ops[2])])) {
        flow.why = fmt::format("section {} pc {}: {} divides by {}", where, pc, ins.desc().mnemonic,
                               describe(in[pc][reg(ins.ops[2])], lat));
        return flow;
      }
      // The other operands of instructions that write xd are followed through the lattice
      // above; ld's address is a GM operand.
      if (writes_xd(ins.op) && ins.op != Opcode::op_ld) continue;
      // A branch comparing two registers derived from one argument (Arg(k) both): a launch at
      // other addresses moves both by the argument's displacement, which leaves their
      // difference, and so the comparison's outcome, as it was (an order's too: GM addresses lie
      // far below 2^63, so neither side wraps).
      // (xa is a register field; b a register or an immediate.)
      if (is_conditional_branch(ins.op) && ins.ops[1].is_reg) {
        const Val a = in[pc][reg(ins.ops[0])];
        if (a >= 0 && a == in[pc][reg(ins.ops[1])]) continue;
      }
      const auto& fields = ins.desc().fields;
      const int gmf = gm_field(ins);
      for (size_t f = ins.op == Opcode::op_ld ? 1 : 0; f < fields.size(); ++f) {
        if (data_field(ins, f)) continue;
        const bool is_reg = fields[f].kind == FieldKind::Reg ||
                            (isa::field_is_reg_or_imm(fields[f].kind) && ins.ops[f].is_reg);
        if (!is_reg) continue;
        const Val v = in[pc][reg(ins.ops[f])];
        if (static_cast<int>(f) == gmf) {
          if (v < 0) {
            flow.why = fmt::format("section {} pc {}: the GM operand {} holds {}", where, pc,
                                   fields[f].name, describe(v, lat));
            return flow;
          }
          gm[pc] = static_cast<int16_t>(v);
        } else if (!lat.fixed(v) && v != kBot) {
          flow.why = fmt::format("section {} pc {}: {} reads {} in {}", where, pc,
                                 ins.desc().mnemonic, describe(v, lat), fields[f].name);
          return flow;
        }
      }
    }
    flow.gm_arg.push_back(std::move(gm));
  }
  flow.ok = true;
  return flow;
}

}  // namespace

AddressFlow analyze_address_flow(const isa::Program& program) {
  AddressFlow flow = analyze(program, false);
  if (flow.ok) return flow;
  const bool loads =
      std::any_of(program.sections.begin(), program.sections.end(), [](const auto& s) {
        return std::any_of(s.code.begin(), s.code.end(),
                           [](const isa::Instruction& in) { return in.op == Opcode::op_ld; });
      });
  if (!loads) return flow;
  AddressFlow fixed = analyze(program, true);
  if (!fixed.ok) return flow;
  flow.steered = true;
  flow.gm_arg = std::move(fixed.gm_arg);
  return flow;
}

}  // namespace npusim
