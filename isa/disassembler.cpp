// Disassembly, field by field from the instruction's descriptor.
#include "isa/disassembler.h"

#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace npusim::isa {
namespace {

// Name of an enumerated code, or "?<tag><value>" when the code names nothing.
template <typename E>
std::string code_name(int64_t v, E count, const char* (*name)(E), const char* tag) {
  if (v < 0 || v >= static_cast<int64_t>(count)) return fmt::format("?{}{}", tag, v);
  return name(static_cast<E>(v));
}

std::string label_text(int64_t index, const Section* section) {
  if (section)
    for (const auto& [name, at] : section->labels)
      if (at == index) return name;
  return fmt::format("@{}", index);
}

std::string operand_text(const FieldDesc& f, const Operand& o, const Section* section) {
  if (f.kind == FieldKind::Reg || (field_is_reg_or_imm(f.kind) && o.is_reg))
    return fmt::format("x{}", o.value);
  switch (f.kind) {
    case FieldKind::Dt: return code_name(o.value, Dtype::NONE, dtype_name, "dt");
    case FieldKind::Cmp: return code_name(o.value, Cmp(int(Cmp::GE) + 1), cmp_name, "cmp");
    case FieldKind::Pipe: return code_name(o.value, Pipe::SYNC, pipe_name, "pipe");
    case FieldKind::Buf: return code_name(o.value, Buf(kNumBufs), buf_name, "buf");
    case FieldKind::Label: return label_text(o.value, section);
    case FieldKind::L2h: return code_name(o.value, L2Hint(kNumL2Hints), l2_hint_name, "l2h");
    case FieldKind::Uf: {
      const char* name = o.value >= 0 && o.value <= 3 && o.value != 1
                             ? unit_flag_name(UnitFlag(o.value))
                             : nullptr;
      return name ? std::string(name) : fmt::format("?uf{}", o.value);
    }
    case FieldKind::I64:
      // Small values in decimal (signed), others as their 64-bit pattern in hex.
      if (o.value > -65536 && o.value < 65536) return fmt::format("{}", o.value);
      return fmt::format("{:#x}", static_cast<uint64_t>(o.value));
    default: return fmt::format("{}", static_cast<uint64_t>(o.value));
  }
}

}  // namespace

std::string disassemble(const Instruction& in, const Section* section) {
  const InstrDesc& d = in.desc();
  std::string text = d.mnemonic, operands;
  for (size_t i = 0; i < d.fields.size(); ++i) {
    if (field_is_optional(d.fields[i].kind) && in.ops[i].value == 0) continue;  // the default
    std::string t = operand_text(d.fields[i], in.ops[i], section);
    if (field_is_suffix(d.fields[i].kind)) text += "." + t;
    else operands += (operands.empty() ? " " : ", ") + t;
  }
  return text + operands;
}

std::string arg_type_text(const ArgInfo& a) {
  if (!a.typed()) return "";
  std::string t = code_name(static_cast<int64_t>(a.dtype), Dtype::NONE, dtype_name, "dt");
  if (!a.dims.empty()) t += fmt::format("[{}]", fmt::join(a.dims, ", "));
  return t;
}

std::string disassemble(const Program& p) {
  std::string out;
  if (!p.name.empty()) out += fmt::format(".kernel {}\n", p.name);
  for (size_t i = 0; i < p.arg_names.size(); ++i) {
    ArgInfo a = p.arg(i);
    out += a.typed() ? fmt::format(".arg {}, {}\n", p.arg_names[i], arg_type_text(a))
                     : fmt::format(".arg {}\n", p.arg_names[i]);
  }
  if (p.aiv_per_aic != 0) out += fmt::format(".aiv_per_aic {}\n", p.aiv_per_aic);
  for (const Section& s : p.sections) {
    out += fmt::format(".section {}\n", core_kind_name(s.kind));
    std::multimap<uint32_t, const std::string*> by_index;
    for (const auto& [name, at] : s.labels) by_index.emplace(at, &name);
    auto it = by_index.begin();
    for (uint32_t pc = 0; pc <= s.code.size(); ++pc) {
      // Labels at pc, including those past the last instruction.
      for (; it != by_index.end() && (it->first <= pc || pc == s.code.size()); ++it)
        out += fmt::format("{}:\n", *it->second);
      if (pc < s.code.size()) out += fmt::format("    {}\n", disassemble(s.code[pc], &s));
    }
  }
  return out;
}

}  // namespace npusim::isa
