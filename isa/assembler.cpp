// Assembler for the npusim kernel text format. Line-oriented: each line is a directive, labels,
// and/or one instruction. Labels are resolved per section after the whole text is read, so
// forward references work; .equ constants must be defined before they are used.
#include "isa/assembler.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "common/error.h"
#include "common/input_file.h"
#include "common/numeric.h"

namespace npusim::isa {
namespace {

// Label fields hold an instruction index in this many bits (isa.def: Label, 20 bits).
uint64_t label_max() { return field_imm_max(FieldKind::Label); }

bool is_ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

bool is_identifier(std::string_view s) {
  if (s.empty() || !is_ident_start(s[0])) return false;
  for (char c : s)
    if (!is_ident_char(c)) return false;
  return true;
}

// "x0".."x31" -> register number; "x<digits>" out of range -> -2; anything else -> -1.
int parse_register(std::string_view s) {
  if (s.size() < 2 || s[0] != 'x') return -1;
  int v = 0;
  for (size_t i = 1; i < s.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(s[i]))) return -1;
    v = v * 10 + (s[i] - '0');
    if (v >= 1000) break;
  }
  return v < kNumRegs ? v : -2;
}

// A piece of a line with the 1-based column of its first character.
struct Piece {
  std::string_view text;
  uint32_t col = 0;
};

Piece trim(Piece p) {
  size_t b = 0, e = p.text.size();
  while (b < e && is_space(p.text[b])) ++b;
  while (e > b && is_space(p.text[e - 1])) --e;
  return {p.text.substr(b, e - b), p.col + static_cast<uint32_t>(b)};
}

// Splits at commas outside parentheses.
std::vector<Piece> split_operands(Piece p) {
  std::vector<Piece> out;
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= p.text.size(); ++i) {
    char c = i < p.text.size() ? p.text[i] : ',';
    if (c == '(') ++depth;
    else if (c == ')') --depth;
    else if (i == p.text.size() || (c == ',' && depth <= 0)) {
      out.push_back(trim({p.text.substr(start, i - start), p.col + static_cast<uint32_t>(start)}));
      start = i + 1;
    }
  }
  return out;
}

std::string list_names(const std::vector<const FieldDesc*>& fields) {
  std::string s;
  for (const FieldDesc* f : fields) s += (s.empty() ? "" : ", ") + std::string(f->name);
  return s;
}

class Assembler {
 public:
  Assembler(std::string_view text, const std::string& source)
      : m_text(text), m_source(source) {}

  Program run() {
    m_prog.source = m_source;
    uint32_t lineno = 0;
    size_t pos = 0;
    while (pos <= m_text.size()) {
      size_t nl = m_text.find('\n', pos);
      if (nl == std::string_view::npos) nl = m_text.size();
      ++lineno;
      m_line = lineno;
      parse_line(m_text.substr(pos, nl - pos));
      pos = nl + 1;
    }
    resolve_arg_dims();
    resolve_labels();
    check_mix_ratio();
    if (!m_kernel_named) m_prog.name = std::filesystem::path(m_source).stem().string();
    return std::move(m_prog);
  }

 private:
  struct Fixup {
    size_t section, insn;
    int field;
    std::string label;
    uint32_t line, col;
  };
  // A dimension of argument m_prog.args[arg] that names an argument, and where it was written.
  struct DimRef {
    size_t arg;
    std::string name;
    uint32_t line, col;
  };

  [[noreturn]] void fail(uint32_t col, const std::string& what) const {
    throw IsaError(fmt::format("{}:{}:{}: {}", m_source, m_line, col, what));
  }
  [[noreturn]] void fail_at(uint32_t line, uint32_t col, const std::string& what) const {
    throw IsaError(fmt::format("{}:{}:{}: {}", m_source, line, col, what));
  }

  Section& current_section() {
    if (m_prog.sections.empty()) {  // code before any .section runs on the AI cores
      m_prog.sections.push_back(Section{CoreKind::AICORE, {}, {}});
    }
    return m_prog.sections.back();
  }

  void parse_line(std::string_view raw) {
    // Strip the comment: ';' or "//" to end of line.
    size_t cut = raw.size();
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] == ';' || (raw[i] == '/' && i + 1 < raw.size() && raw[i + 1] == '/')) {
        cut = i;
        break;
      }
    }
    Piece rest = trim({raw.substr(0, cut), 1});
    // Leading labels "name:".
    while (!rest.text.empty()) {
      size_t n = 0;
      while (n < rest.text.size() && is_ident_char(rest.text[n])) ++n;
      if (n == 0 || n >= rest.text.size() || rest.text[n] != ':' || !is_ident_start(rest.text[0]))
        break;
      define_label(std::string(rest.text.substr(0, n)), rest.col);
      rest = trim({rest.text.substr(n + 1), rest.col + static_cast<uint32_t>(n + 1)});
    }
    if (rest.text.empty()) return;
    if (rest.text[0] == '.') parse_directive(rest);
    else parse_instruction(rest);
  }

  void define_label(const std::string& name, uint32_t col) {
    Section& s = current_section();
    if (parse_register(name) != -1) fail(col, fmt::format("label name '{}' is a register", name));
    auto [it, inserted] = s.labels.emplace(name, static_cast<uint32_t>(s.code.size()));
    if (!inserted) {
      auto where = m_label_lines.find({m_prog.sections.size() - 1, name});
      fail(col, fmt::format("duplicate label '{}' (first defined at line {})", name,
                            where->second));
    }
    m_label_lines[{m_prog.sections.size() - 1, name}] = m_line;
  }

  // Splits "word rest" at the first whitespace.
  static std::pair<Piece, Piece> split_word(Piece p) {
    size_t n = 0;
    while (n < p.text.size() && !is_space(p.text[n])) ++n;
    return {{p.text.substr(0, n), p.col},
            trim({p.text.substr(n), p.col + static_cast<uint32_t>(n)})};
  }

  void parse_directive(Piece p) {
    const auto [word, args] = split_word(p);
    // Lambdas capture variables, not structured bindings (C++17).
    const Piece &word_p = word, &args_p = args;
    std::string_view d = word.text;
    auto need_name = [&](const char* what) -> std::string {
      if (args_p.text.empty()) fail(word_p.col, fmt::format("{} needs a {}", d, what));
      return std::string(args_p.text);
    };
    if (d == ".kernel") {
      if (m_kernel_named) fail(word.col, "duplicate .kernel directive");
      std::string name = need_name("kernel name");
      for (char c : name)
        if (is_space(c)) fail(args.col, fmt::format(".kernel takes one name, got '{}'", name));
      m_prog.name = name;
      m_kernel_named = true;
    } else if (d == ".arg") {
      need_name("argument name");
      parse_arg(args);
    } else if (d == ".equ") {
      std::vector<Piece> ops = split_operands(args);
      if (ops.size() != 2 || ops[0].text.empty())
        fail(word.col, "expected '.equ NAME, EXPR'");
      std::string name(ops[0].text);
      check_new_symbol(name, ops[0].col);
      if (m_constants.count(name)) fail(ops[0].col, fmt::format("duplicate constant '{}'", name));
      m_constants[name] = eval(ops[1]);
    } else if (d == ".aiv_per_aic") {
      // A mix kernel's vector cores per cube core in a block (Program::aiv_per_aic).
      if (m_prog.aiv_per_aic != 0) fail(word.col, "duplicate .aiv_per_aic directive");
      const int64_t n = eval(args);
      if (n < 1 || n > kMaxAivPerAic)
        fail(args.col, fmt::format(".aiv_per_aic {} is outside 1..{}", n, kMaxAivPerAic));
      m_prog.aiv_per_aic = static_cast<int>(n);
      m_ratio_line = m_line;
      m_ratio_col = word.col;
    } else if (d == ".section") {
      std::string name = need_name("core kind (aic, aiv or aicore)");
      auto kind = core_kind_from_name(name);
      if (!kind)
        fail(args.col, fmt::format("unknown section '{}' (expected aic, aiv or aicore)", name));
      if (m_prog.find(*kind))
        fail(args.col, fmt::format("section {} appears twice{}", name,
                                   *kind == CoreKind::AICORE
                                       ? " (code before any .section is already in aicore)"
                                       : ""));
      m_prog.sections.push_back(Section{*kind, {}, {}});
    } else {
      fail(word.col, fmt::format("unknown directive '{}'", d));
    }
  }

  // ".arg NAME", ".arg NAME, DTYPE" or ".arg NAME, DTYPE[DIM, ...]" (args: the text after
  // ".arg"). Dimensions naming arguments are checked once every .arg is known
  // (resolve_arg_dims), so they may name arguments declared later.
  void parse_arg(Piece args) {
    size_t comma = args.text.find(',');
    Piece name_p = trim({args.text.substr(0, comma), args.col});
    std::string name(name_p.text);
    if (name.empty()) fail(args.col, "expected '.arg NAME' or '.arg NAME, DTYPE[DIMS]'");
    check_new_symbol(name, name_p.col);
    for (const auto& a : m_prog.arg_names)
      if (a == name) fail(name_p.col, fmt::format("duplicate argument '{}'", name));
    const InstrDesc& ldarg = describe(Opcode::op_ldarg);
    uint64_t max_index = field_imm_max(ldarg.fields[field_index(Opcode::op_ldarg, "index")].kind);
    if (m_prog.arg_names.size() > max_index)
      fail(name_p.col, fmt::format("too many arguments (ldarg index is at most {})", max_index));
    ArgInfo info;
    info.name = name;
    if (comma != std::string_view::npos)
      parse_arg_type(trim({args.text.substr(comma + 1),
                           args.col + static_cast<uint32_t>(comma + 1)}),
                     info);
    m_prog.arg_names.push_back(name);
    m_prog.args.push_back(std::move(info));
  }

  // "DTYPE" or "DTYPE[DIM, ...]" of argument info.name.
  void parse_arg_type(Piece t, ArgInfo& info) {
    if (t.text.empty())
      fail(t.col, fmt::format("argument '{}': expected a data type after ','", info.name));
    size_t open = t.text.find('[');
    Piece dt = trim({t.text.substr(0, open), t.col});
    auto dtype = dtype_from_name(dt.text);
    if (!dtype)
      fail(dt.col, fmt::format("argument '{}': unknown data type '{}' (expected f32, f16, bf16, "
                               "s32, s16, s8, u8, u16, s64)",
                               info.name, dt.text));
    info.dtype = *dtype;
    if (open == std::string_view::npos) return;  // any shape
    if (t.text.back() != ']')
      fail(t.col + static_cast<uint32_t>(t.text.size()),
           fmt::format("argument '{}': expected ']' at the end of the shape", info.name));
    Piece inside = {t.text.substr(open + 1, t.text.size() - open - 2),
                    t.col + static_cast<uint32_t>(open + 1)};
    if (trim(inside).text.empty())
      fail(inside.col, fmt::format("argument '{}': empty shape (write '.arg {}, {}' for a "
                                   "tensor of any shape)",
                                   info.name, info.name, dt.text));
    for (const Piece& dim : split_operands(inside)) {
      auto bad = [&](const std::string& why) {
        fail(dim.col, fmt::format("argument '{}': bad dimension '{}' ({})", info.name, dim.text,
                                  why));
      };
      if (dim.text.empty()) bad("missing dimension");
      bool word = std::all_of(dim.text.begin(), dim.text.end(), is_ident_char);
      if (word && std::isdigit(static_cast<unsigned char>(dim.text[0]))) {
        Expr e{*this, dim};
        int64_t v = e.number();  // fails on a malformed or over-long literal
        if (e.i != dim.text.size()) bad("expected an integer literal");
        if (v < 0) bad("does not fit 63 bits");
        info.dims.push_back(std::to_string(v));
      } else if (word && parse_register(dim.text) == -1) {
        info.dims.push_back(std::string(dim.text));
        m_dim_refs.push_back({m_prog.args.size(), std::string(dim.text), m_line, dim.col});
      } else {
        bad("expected an integer literal or the name of an untyped argument");
      }
    }
  }

  // Every dimension that names an argument names an untyped one.
  void resolve_arg_dims() {
    for (const DimRef& r : m_dim_refs) {
      const std::string& owner = m_prog.args[r.arg].name;
      auto it = std::find(m_prog.arg_names.begin(), m_prog.arg_names.end(), r.name);
      if (it == m_prog.arg_names.end())
        fail_at(r.line, r.col, fmt::format("argument '{}': dimension '{}' names no argument{}",
                                           owner, r.name,
                                           m_constants.count(r.name)
                                               ? " (a dimension cannot be an .equ constant)"
                                               : ""));
      const ArgInfo& target = m_prog.args[it - m_prog.arg_names.begin()];
      if (target.typed())
        fail_at(r.line, r.col, fmt::format("argument '{}': dimension '{}' names a tensor "
                                           "argument (a dimension names an untyped argument)",
                                           owner, r.name));
    }
  }

  void check_new_symbol(const std::string& name, uint32_t col) {
    if (!is_identifier(name)) fail(col, fmt::format("'{}' is not a valid name", name));
    if (parse_register(name) != -1) fail(col, fmt::format("name '{}' is a register", name));
  }

  // Whether `text` is a suffix value of kind k (Dt, Cmp, L2h, Uf).
  static bool suffix_parses(FieldKind k, std::string_view text) {
    switch (k) {
      case FieldKind::Dt: return dtype_from_name(text).has_value();
      case FieldKind::Cmp: return cmp_from_name(text).has_value();
      case FieldKind::L2h: return l2_hint_from_name(text).has_value();
      case FieldKind::Uf: return unit_flag_from_name(text).has_value();
      default: return false;
    }
  }

  void parse_instruction(Piece p) {
    auto [word, args] = split_word(p);
    // mnemonic[.suffix...]
    std::vector<Piece> parts;
    size_t start = 0;
    for (size_t i = 0; i <= word.text.size(); ++i) {
      if (i == word.text.size() || word.text[i] == '.') {
        parts.push_back(
            {word.text.substr(start, i - start), word.col + static_cast<uint32_t>(start)});
        start = i + 1;
      }
    }
    auto op = opcode_from_mnemonic(parts[0].text);
    if (!op) fail(word.col, fmt::format("unknown mnemonic '{}'", parts[0].text));
    Instruction in;
    in.op = *op;
    in.src_line = m_line;
    in.src_col = word.col;
    const InstrDesc& d = in.desc();

    std::vector<int> suffix_fields, operand_fields;
    for (size_t i = 0; i < d.fields.size(); ++i)
      (field_is_suffix(d.fields[i].kind) ? suffix_fields : operand_fields).push_back(int(i));

    // The optional suffixes (the L2 policy, the unit flag) follow the required ones in table
    // order; any of them may be left out (it stays 0): a suffix past the required ones goes to
    // the next optional field whose kind reads it.
    size_t nsuffix = parts.size() - 1;
    size_t required = suffix_fields.size();
    while (required > 0 && field_is_optional(d.fields[suffix_fields[required - 1]].kind))
      --required;
    if (nsuffix < required || nsuffix > suffix_fields.size()) {
      std::string expect;
      for (size_t s = 0; s < suffix_fields.size(); ++s)
        expect += fmt::format(s < required ? ".{}" : "[.{}]", d.fields[suffix_fields[s]].name);
      const std::string count = required == suffix_fields.size()
                                    ? std::to_string(required)
                                    : fmt::format("{} to {}", required, suffix_fields.size());
      fail(nsuffix > suffix_fields.size() ? parts[suffix_fields.size() + 1].col - 1 : word.col,
           suffix_fields.empty()
               ? fmt::format("{} takes no suffix", d.mnemonic)
               : fmt::format("{} takes {} suffix{} ({}), got {}", d.mnemonic, count,
                             suffix_fields.size() == 1 ? "" : "es", expect, nsuffix));
    }
    size_t next_field = 0;  // index into suffix_fields of the next field a suffix may fill
    for (size_t s = 0; s < nsuffix; ++s) {
      const Piece& sp = parts[s + 1];
      if (s >= required) {  // an optional suffix: skip the optional fields it is not for
        size_t f = next_field;
        while (f < suffix_fields.size() && !suffix_parses(d.fields[suffix_fields[f]].kind, sp.text))
          ++f;
        if (f < suffix_fields.size()) next_field = f;  // else: reported against the next field
      }
      if (next_field >= suffix_fields.size())
        fail(sp.col, fmt::format("{} takes no further suffix, got '.{}'", d.mnemonic, sp.text));
      const FieldDesc& f = d.fields[suffix_fields[next_field]];
      Operand& o = in.ops[suffix_fields[next_field]];
      ++next_field;
      auto set = [&](auto parsed, const char* expected) {
        if (!parsed)
          fail(sp.col, fmt::format("bad suffix '.{}' for {} of {}: expected {}", sp.text, f.name,
                                   d.mnemonic, expected));
        o.value = static_cast<int64_t>(*parsed);
      };
      if (f.kind == FieldKind::Dt)
        set(dtype_from_name(sp.text), "a data type (f32, f16, bf16, s32, s16, s8, u8, u16, s64)");
      else if (f.kind == FieldKind::L2h)
        set(l2_hint_from_name(sp.text), "an L2 policy (normal, noalloc, bypass)");
      else if (f.kind == FieldKind::Uf)
        set(unit_flag_from_name(sp.text), "a unit flag (uf2, uf3)");
      else
        set(cmp_from_name(sp.text), "a comparison (eq, ne, lt, gt, le, ge)");
    }

    std::vector<Piece> ops;
    if (!args.text.empty()) ops = split_operands(args);
    if (ops.size() != operand_fields.size()) {
      std::vector<const FieldDesc*> names;
      for (int f : operand_fields) names.push_back(&d.fields[f]);
      fail(word.col, fmt::format("{} takes {} operand{}{}{}{}, got {}", d.mnemonic,
                                 operand_fields.size(), operand_fields.size() == 1 ? "" : "s",
                                 names.empty() ? "" : " (", list_names(names),
                                 names.empty() ? "" : ")", ops.size()));
    }
    Section& sec = current_section();
    if (sec.code.size() > label_max())
      fail(word.col, fmt::format("section has more than {} instructions", label_max() + 1));
    for (size_t k = 0; k < ops.size(); ++k)
      parse_operand(in, operand_fields[k], k + 1, ops[k]);
    sec.code.push_back(in);
  }

  void parse_operand(Instruction& in, int fi, size_t ordinal, const Piece& p) {
    const InstrDesc& d = in.desc();
    const FieldDesc& f = d.fields[fi];
    Operand& o = in.ops[fi];
    std::string where = fmt::format("{} operand {} ({})", d.mnemonic, ordinal, f.name);
    if (p.text.empty()) fail(p.col, where + ": missing operand");
    int reg = parse_register(p.text);
    if (reg == -2) fail(p.col, fmt::format("{}: no register '{}' (x0..x{})", where, p.text,
                                           kNumRegs - 1));
    switch (f.kind) {
      case FieldKind::Reg:
        if (reg < 0)
          fail(p.col, fmt::format("{}: expected a register x0..x{}, got '{}'", where,
                                  kNumRegs - 1, p.text));
        o = {true, reg};
        return;
      case FieldKind::Pipe: {
        auto v = pipe_from_name(p.text);
        if (!v)
          fail(p.col, fmt::format("{}: expected a pipe (s, mte1, mte2, mte3, m, v, fix, all), "
                                  "got '{}'", where, p.text));
        o = {false, static_cast<int64_t>(*v)};
        return;
      }
      case FieldKind::Buf: {
        auto v = buf_from_name(p.text);
        if (!v)
          fail(p.col, fmt::format("{}: expected a buffer (gm, l1, l0a, l0b, l0c, ub, bt, fb), "
                                  "got '{}'", where, p.text));
        o = {false, static_cast<int64_t>(*v)};
        return;
      }
      case FieldKind::Label:
        parse_label_operand(in, fi, where, p);
        return;
      case FieldKind::Dt:
      case FieldKind::Cmp:
      case FieldKind::L2h:
      case FieldKind::Uf:
        break;  // suffixes, handled by the caller
      default: {
        if (reg >= 0) {
          if (!field_is_reg_or_imm(f.kind))
            fail(p.col, fmt::format("{}: expected an immediate, got register '{}'", where,
                                    p.text));
          o = {true, reg};
          return;
        }
        int64_t v;
        bool arg_name = in.op == Opcode::op_ldarg && is_identifier(p.text) &&
                        !m_constants.count(std::string(p.text));
        if (arg_name)
          v = arg_index(p, where);
        else
          v = eval(p);
        if (f.kind != FieldKind::I64 &&
            (v < 0 || static_cast<uint64_t>(v) > field_imm_max(f.kind)))
          fail(p.col, fmt::format("{}: value {} out of range 0..{}", where, v,
                                  field_imm_max(f.kind)));
        o = {false, v};
        return;
      }
    }
  }

  int64_t arg_index(const Piece& p, const std::string& where) {
    for (size_t i = 0; i < m_prog.arg_names.size(); ++i)
      if (m_prog.arg_names[i] == p.text) return static_cast<int64_t>(i);
    fail(p.col, fmt::format("{}: unknown argument or constant '{}'", where, p.text));
  }

  void parse_label_operand(Instruction& in, int fi, const std::string& where, const Piece& p) {
    Operand& o = in.ops[fi];
    o.is_reg = false;
    if (p.text[0] == '@') {  // absolute instruction index, as the disassembler prints it
      std::string_view num = p.text.substr(1);
      uint64_t v = 0;
      bool ok = !num.empty();
      for (char c : num) {
        if (!std::isdigit(static_cast<unsigned char>(c)) || v > label_max()) ok = false;
        else v = v * 10 + (c - '0');
      }
      if (!ok || v > label_max())
        fail(p.col, fmt::format("{}: bad instruction index '{}' (expected @0..@{})", where,
                                p.text, label_max()));
      o.value = static_cast<int64_t>(v);
      return;
    }
    if (!is_identifier(p.text))
      fail(p.col, fmt::format("{}: expected a label, got '{}'", where, p.text));
    m_fixups.push_back({m_prog.sections.size() - 1, current_section().code.size(), fi,
                        std::string(p.text), m_line, p.col});
  }

  void resolve_labels() {
    for (const Fixup& f : m_fixups) {
      Section& s = m_prog.sections[f.section];
      auto it = s.labels.find(f.label);
      if (it == s.labels.end())
        fail_at(f.line, f.col, fmt::format("unknown label '{}' in section {}", f.label,
                                           core_kind_name(s.kind)));
      s.code[f.insn].ops[f.field].value = it->second;
    }
  }

  // ---- immediate expressions: C precedence, 64-bit two's complement ----
  struct Expr {
    const Assembler& as;
    Piece p;
    size_t i = 0;
    int depth = 0;  // open parentheses and unary operators around the current position

    // Enters one nesting level (the parenthesis or unary operator at offset `at`); the parser
    // recurses once per level, so the limit bounds its stack use.
    void nest(size_t at) {
      if (++depth > kMaxExprDepth) {
        i = at;
        fail(fmt::format("expression nested more than {} levels deep (parentheses and unary "
                         "operators)",
                         kMaxExprDepth));
      }
    }

    [[noreturn]] void fail(const std::string& what) const {
      as.fail(p.col + static_cast<uint32_t>(i), what);
    }
    void skip() {
      while (i < p.text.size() && is_space(p.text[i])) ++i;
    }
    bool eat(std::string_view tok) {
      skip();
      if (p.text.substr(i, tok.size()) == tok) {
        i += tok.size();
        return true;
      }
      return false;
    }
    bool peek(std::string_view tok) {
      skip();
      return p.text.substr(i, tok.size()) == tok;
    }

    int64_t parse() {
      int64_t v = bor();
      skip();
      if (i != p.text.size()) fail(fmt::format("unexpected '{}' in expression", p.text.substr(i)));
      return v;
    }
    int64_t bor() {
      int64_t v = bxor();
      while (!peek("||") && eat("|")) v |= bxor();
      return v;
    }
    int64_t bxor() {
      int64_t v = band();
      while (eat("^")) v ^= band();
      return v;
    }
    int64_t band() {
      int64_t v = shift();
      while (!peek("&&") && eat("&")) v &= shift();
      return v;
    }
    int64_t shift() {
      int64_t v = additive();
      for (;;) {
        bool left;
        if (eat("<<")) left = true;
        else if (eat(">>")) left = false;
        else return v;
        skip();
        size_t at = i;
        int64_t n = additive();
        if (n < 0 || n > 63) {
          i = at;
          fail(fmt::format("shift count {} out of range 0..63", n));
        }
        v = left ? static_cast<int64_t>(static_cast<uint64_t>(v) << n) : v >> n;
      }
    }
    int64_t additive() {
      int64_t v = multiplicative();
      for (;;) {
        if (eat("+")) v = static_cast<int64_t>(uint64_t(v) + uint64_t(multiplicative()));
        else if (eat("-")) v = static_cast<int64_t>(uint64_t(v) - uint64_t(multiplicative()));
        else return v;
      }
    }
    int64_t multiplicative() {
      int64_t v = unary();
      for (;;) {
        char c;
        if (eat("*")) c = '*';
        else if (eat("/")) c = '/';
        else if (eat("%")) c = '%';
        else return v;
        skip();
        size_t at = i;
        int64_t r = unary();
        if (c == '*') {
          v = static_cast<int64_t>(uint64_t(v) * uint64_t(r));
          continue;
        }
        if (r == 0) {
          i = at;
          fail(c == '/' ? "division by zero" : "remainder by zero");
        }
        if (r == -1) v = c == '/' ? static_cast<int64_t>(0 - uint64_t(v)) : 0;
        else v = c == '/' ? v / r : v % r;
      }
    }
    int64_t unary() {
      skip();
      const size_t at = i;
      char op;
      if (eat("-")) op = '-';
      else if (eat("+")) op = '+';
      else if (eat("~")) op = '~';
      else return primary();
      nest(at);
      const int64_t v = unary();
      --depth;
      return op == '-' ? static_cast<int64_t>(0 - uint64_t(v)) : op == '~' ? ~v : v;
    }
    int64_t primary() {
      skip();
      if (i >= p.text.size()) fail("expected a value");
      char c = p.text[i];
      if (c == '(') {
        nest(i);
        ++i;
        int64_t v = bor();
        if (!eat(")")) fail("expected ')'");
        --depth;
        return v;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) return number();
      if (is_ident_start(c)) {
        size_t b = i;
        while (i < p.text.size() && is_ident_char(p.text[i])) ++i;
        std::string name(p.text.substr(b, i - b));
        if ((name == "f32" || name == "f16" || name == "bf16") && peek("("))
          return float_bits(name);
        auto it = as.m_constants.find(name);
        if (it == as.m_constants.end()) {
          i = b;
          if (parse_register(name) != -1)
            fail(fmt::format("register '{}' cannot be used in an expression", name));
          fail(fmt::format("unknown constant '{}'", name));
        }
        return it->second;
      }
      fail(fmt::format("unexpected '{}' in expression", c));
    }
    int64_t number() {
      size_t b = i;
      int base = 10;
      if (p.text.substr(i, 2) == "0x" || p.text.substr(i, 2) == "0X") base = 16, i += 2;
      else if (p.text.substr(i, 2) == "0b" || p.text.substr(i, 2) == "0B") base = 2, i += 2;
      uint64_t v = 0;
      size_t digits = 0;
      bool overflow = false;
      for (; i < p.text.size(); ++i) {
        char c = static_cast<char>(std::tolower(static_cast<unsigned char>(p.text[i])));
        int d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c == '_') continue;  // digit separator
        else break;
        if (d >= base) break;
        if (v > (~0ull - d) / base) overflow = true;
        v = v * base + d;
        ++digits;
      }
      if (i < p.text.size() && (is_ident_char(p.text[i]) || p.text[i] == '.')) {
        size_t e = i;
        while (e < p.text.size() && (is_ident_char(p.text[e]) || p.text[e] == '.')) ++e;
        std::string_view tok = p.text.substr(b, e - b);
        i = b;
        if (tok.find('.') != std::string_view::npos)
          fail(fmt::format("bad number '{}' (write float bit patterns as f32({}))", tok, tok));
        fail(fmt::format("bad number '{}'", tok));
      }
      if (digits == 0 || overflow) {
        std::string_view tok = p.text.substr(b, i - b);
        i = b;
        fail(fmt::format("bad number '{}'{}", tok, overflow ? " (does not fit 64 bits)" : ""));
      }
      return static_cast<int64_t>(v);
    }
    // f32(x) / f16(x) / bf16(x): the IEEE bit pattern of the float literal x (rounded to fp32,
    // then to the 16-bit format with round-to-nearest-even).
    int64_t float_bits(const std::string& fmtname) {
      eat("(");
      skip();
      size_t b = i;
      int depth = 0;
      while (i < p.text.size() && !(p.text[i] == ')' && depth == 0)) {
        if (p.text[i] == '(') ++depth;
        if (p.text[i] == ')') --depth;
        ++i;
      }
      std::string lit(p.text.substr(b, i - b));
      while (!lit.empty() && is_space(lit.back())) lit.pop_back();
      if (!eat(")")) fail(fmt::format("expected ')' after {}(", fmtname));
      errno = 0;
      char* end = nullptr;
      float f = std::strtof(lit.c_str(), &end);
      if (lit.empty() || end != lit.c_str() + lit.size()) {
        i = b;
        fail(fmt::format("bad float literal '{}' in {}()", lit, fmtname));
      }
      if (fmtname == "f32") return f32_to_bits(f);
      if (fmtname == "f16") return f32_to_f16(f);
      return f32_to_bf16(f);
    }
  };

  // A declared ratio says how a mix kernel's blocks are formed: the kernel must have both an aic
  // and an aiv section.
  void check_mix_ratio() const {
    if (m_prog.aiv_per_aic == 0) return;
    if (!m_prog.find(CoreKind::AIC) || !m_prog.find(CoreKind::AIV))
      fail_at(m_ratio_line, m_ratio_col,
              ".aiv_per_aic applies to mix kernels, and this kernel does not have both an aic "
              "and an aiv section");
  }

  int64_t eval(const Piece& p) {
    if (p.text.empty()) fail(p.col, "missing expression");
    Expr e{*this, p};
    return e.parse();
  }

  std::string_view m_text;
  std::string m_source;
  Program m_prog;
  uint32_t m_line = 0;
  bool m_kernel_named = false;
  uint32_t m_ratio_line = 0, m_ratio_col = 0;  // where .aiv_per_aic was written
  std::map<std::string, int64_t> m_constants;
  std::map<std::pair<size_t, std::string>, uint32_t> m_label_lines;
  std::vector<Fixup> m_fixups;
  std::vector<DimRef> m_dim_refs;
};

}  // namespace

Program assemble(std::string_view text, const std::string& source_name) {
  return Assembler(text, source_name).run();
}

Program assemble_file(const std::string& path) {
  return assemble(read_input_file<IsaError>(path, "assembly file", kMaxKernelFileBytes), path);
}

}  // namespace npusim::isa
