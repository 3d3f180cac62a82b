#include "adapter/compiler/kernel_builder.h"

#include <algorithm>
#include <cctype>
#include <sstream>
#include <string_view>

#include <fmt/format.h>

#include "isa/disassembler.h"
#include "sim/verifier/verifier.h"

namespace npusim::compiler {

using isa::FieldKind;
using isa::Opcode;

namespace {

constexpr int kZeroReg = 0;           // never allocated, never written: reads 0
constexpr uint64_t kMinAlign = 32;    // every on-chip allocation starts on a 32-byte block
constexpr int kListingIndent = 4;     // instruction lines are indented by 4 spaces

std::string sanitize_label(const std::string& hint) {
  std::string s;
  for (char c : hint) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
  if (s.empty() || std::isdigit(static_cast<unsigned char>(s[0]))) s = "l_" + s;
  return s;
}

Opcode negate(Opcode branch) {
  switch (branch) {
    case Opcode::op_beq: return Opcode::op_bne;
    case Opcode::op_bne: return Opcode::op_beq;
    case Opcode::op_blt: return Opcode::op_bge;
    case Opcode::op_bge: return Opcode::op_blt;
    default: throw Error("KernelBuilder: a condition must use beq, bne, blt or bge");
  }
}

}  // namespace

Reg& Reg::operator=(Reg&& o) noexcept {
  if (this != &o) {
    release();
    m_builder = o.m_builder;
    m_id = o.m_id;
    m_section = o.m_section;
    o.m_builder = nullptr;
    o.m_id = -1;
  }
  return *this;
}

void Reg::release() {
  if (m_builder && m_id >= 0) m_builder->release_reg(m_id, m_section);
  m_builder = nullptr;
  m_id = -1;
}

KernelBuilder::KernelBuilder(std::string kernel_name, std::string op, const ChipConfig& cfg)
    : m_op(std::move(op)), m_cfg(cfg), m_reg_purpose(isa::kNumRegs) {
  m_program.name = std::move(kernel_name);
  m_program.source = m_program.name + ".s";
}

void KernelBuilder::fail(const std::string& what) const {
  throw CompileError(fmt::format("{}: {}", m_op, what));
}

int KernelBuilder::aiv_per_aic() const {
  return m_program.aiv_per_aic != 0 ? m_program.aiv_per_aic : m_cfg.aiv_per_aic;
}

void KernelBuilder::set_aiv_per_aic(int n) {
  if (!m_cfg.split)
    fail(fmt::format("kernel {}: chip {} is coupled: a mix kernel's ratio of vector to cube cores "
                     "does not apply",
                     m_program.name, m_cfg.name));
  if (n < 1 || n > m_cfg.aiv_per_aic)
    fail(fmt::format("kernel {}: {} vector cores per cube core is outside 1..{} (chip {})",
                     m_program.name, n, m_cfg.aiv_per_aic, m_cfg.name));
  if (!m_program.sections.empty())
    fail(fmt::format("kernel {}: the ratio of vector to cube cores is set before any section",
                     m_program.name));
  m_program.aiv_per_aic = n == m_cfg.aiv_per_aic ? 0 : n;
}

// ---- arguments ----

int KernelBuilder::max_args() {
  const Opcode ldarg = Opcode::op_ldarg;
  return static_cast<int>(
      isa::field_imm_max(isa::describe(ldarg).fields[isa::field_index(ldarg, "index")].kind) + 1);
}

int KernelBuilder::declare_arg(const std::string& name) {
  if (std::find(m_program.arg_names.begin(), m_program.arg_names.end(), name) !=
      m_program.arg_names.end())
    fail(fmt::format("kernel argument '{}' declared twice", name));
  if (m_program.arg_names.size() >= static_cast<size_t>(max_args()))
    fail(fmt::format("kernel argument '{}' would be argument {}: a kernel takes at most {} "
                     "(ldarg's index field)",
                     name, m_program.arg_names.size() + 1, max_args()));
  m_program.arg_names.push_back(name);
  isa::ArgInfo info;
  info.name = name;
  m_program.args.push_back(info);
  return static_cast<int>(m_program.arg_names.size()) - 1;
}

int KernelBuilder::declare_arg(const std::string& name, isa::Dtype dtype,
                               const std::vector<int64_t>& dims) {
  int i = declare_arg(name);
  isa::ArgInfo& info = m_program.args.back();
  info.dtype = dtype;
  for (int64_t d : dims) info.dims.push_back(std::to_string(d));
  return i;
}

Reg KernelBuilder::load_arg(const std::string& name) {
  auto it = std::find(m_program.arg_names.begin(), m_program.arg_names.end(), name);
  if (it == m_program.arg_names.end()) fail(fmt::format("kernel argument '{}' not declared", name));
  Reg r = reg("argument " + name);
  emit(Opcode::op_ldarg, {r, static_cast<int64_t>(it - m_program.arg_names.begin())},
       "argument " + name);
  return r;
}

// ---- sections ----

void KernelBuilder::begin_section(isa::CoreKind kind) {
  if (!m_cfg.core_kind(kind))
    fail(fmt::format("chip {} has no {} cores", m_cfg.name, isa::core_kind_name(kind)));
  if (m_program.find(kind)) fail(fmt::format("section {} begun twice", isa::core_kind_name(kind)));
  for (int r = 0; r < isa::kNumRegs; ++r)
    if (!m_reg_purpose[r].empty())
      fail(fmt::format("register x{} ({}) still held when section {} begins", r,
                       m_reg_purpose[r], isa::core_kind_name(kind)));
  m_program.sections.push_back(isa::Section{kind, {}, {}});
  m_sections.push_back(SectionState{kind, {}, {}, {}, {}, {}});
}

isa::CoreKind KernelBuilder::vector_core_kind() const {
  isa::CoreKind k = m_cfg.split ? isa::CoreKind::AIV : isa::CoreKind::AICORE;
  const CoreKindConfig* c = m_cfg.core_kind(k);
  if (!c || !c->has(isa::Pipe::V)) fail(fmt::format("chip {} has no vector cores", m_cfg.name));
  return k;
}

isa::CoreKind KernelBuilder::cube_core_kind() const {
  isa::CoreKind k = m_cfg.split ? isa::CoreKind::AIC : isa::CoreKind::AICORE;
  const CoreKindConfig* c = m_cfg.core_kind(k);
  if (!c || !c->has(isa::Pipe::M)) fail(fmt::format("chip {} has no cube cores", m_cfg.name));
  return k;
}

const CoreKindConfig& KernelBuilder::core() const {
  if (m_sections.empty()) fail("no section begun");
  return *m_cfg.core_kind(m_sections.back().kind);
}

KernelBuilder::SectionState& KernelBuilder::section() {
  if (m_sections.empty()) fail("no section begun");
  return m_sections.back();
}

isa::Section& KernelBuilder::code() {
  if (m_program.sections.empty()) fail("no section begun");
  return m_program.sections.back();
}

// ---- registers ----

int KernelBuilder::take_reg(const std::string& purpose) {
  for (int r = 1; r < isa::kNumRegs; ++r) {
    if (r == kZeroReg || !m_reg_purpose[r].empty()) continue;
    m_reg_purpose[r] = purpose.empty() ? "temporary" : purpose;
    return r;
  }
  std::string held;
  for (int r = 1; r < isa::kNumRegs; ++r) held += fmt::format("\n  x{}: {}", r, m_reg_purpose[r]);
  fail(fmt::format("out of scalar registers for '{}'; all {} are held:{}", purpose,
                   isa::kNumRegs - 1, held));
}

Reg KernelBuilder::reg(const std::string& purpose) {
  return Reg(this, take_reg(purpose), static_cast<int>(m_sections.size()) - 1);
}

Reg KernelBuilder::reg_imm(const std::string& purpose, int64_t value) {
  Reg r = reg(purpose);
  movi(r, value, purpose);
  return r;
}

void KernelBuilder::release_reg(int id, int section) {
  if (section != static_cast<int>(m_sections.size()) - 1) return;  // a past section's register
  m_reg_purpose[static_cast<size_t>(id)].clear();
}

int KernelBuilder::free_regs() const {
  int n = 0;
  for (int r = 1; r < isa::kNumRegs; ++r) n += m_reg_purpose[r].empty();
  return n;
}

// ---- instructions ----

std::string KernelBuilder::current_comment(const std::string& explicit_comment) const {
  if (!explicit_comment.empty()) return explicit_comment;
  return m_origin.empty() ? std::string() : m_origin.back();
}

void KernelBuilder::emit(Opcode op, std::initializer_list<Opnd> operands,
                         const std::string& comment) {
  if (m_finished) fail("emit after finish()");
  const isa::InstrDesc& d = isa::describe(op);
  // A trailing optional field (the L2 policy) may be left out: it stays 0 (normal).
  size_t required = d.fields.size();
  while (required > 0 && isa::field_is_optional(d.fields[required - 1].kind)) --required;
  if (operands.size() < required || operands.size() > d.fields.size())
    fail(fmt::format("{} takes {} operands, {} given", d.mnemonic,
                     required == d.fields.size()
                         ? std::to_string(required)
                         : fmt::format("{} to {}", required, d.fields.size()),
                     operands.size()));
  isa::Instruction in;
  in.op = op;
  std::vector<Reg> temps;  // immediates that needed a register; freed after this instruction
  std::vector<int> label_fields;
  const std::string text = current_comment(comment);
  auto materialize = [&](const char* field, int64_t v) {
    temps.push_back(reg(fmt::format("{} {} = {}", d.mnemonic, field, v)));
    emit(Opcode::op_movi, {temps.back(), v}, text);
    return temps.back().id();
  };
  int i = 0;
  for (const Opnd& o : operands) {
    const isa::FieldDesc& f = d.fields[static_cast<size_t>(i)];
    isa::Operand& out = in.ops[static_cast<size_t>(i)];
    auto wrong = [&](const char* expected) {
      fail(fmt::format("{} operand {}: expected {}", d.mnemonic, f.name, expected));
    };
    switch (f.kind) {
      case FieldKind::Reg:
        if (o.kind() == Opnd::Kind::kReg) out.value = o.value();
        else if (o.kind() == Opnd::Kind::kImm && std::string_view(f.name) == "xd")
          wrong("a register (it is written)");
        else if (o.kind() == Opnd::Kind::kImm)
          out.value = o.value() == 0 ? kZeroReg : materialize(f.name, o.value());
        else wrong("a register");
        if (out.value < 0) fail(fmt::format("{} operand {}: an empty Reg", d.mnemonic, f.name));
        break;
      case FieldKind::RU8: case FieldKind::RU12: case FieldKind::RU16: case FieldKind::RU32:
        if (o.kind() == Opnd::Kind::kReg) {
          if (o.value() < 0) fail(fmt::format("{} operand {}: an empty Reg", d.mnemonic, f.name));
          out.is_reg = true;
          out.value = o.value();
        } else if (o.kind() == Opnd::Kind::kImm) {
          if (o.value() >= 0 && static_cast<uint64_t>(o.value()) <= isa::field_imm_max(f.kind)) {
            out.value = o.value();
          } else {
            out.is_reg = true;
            out.value = materialize(f.name, o.value());
          }
        } else {
          wrong("a register or an immediate");
        }
        break;
      case FieldKind::U1: case FieldKind::U2: case FieldKind::U3: case FieldKind::U4:
      case FieldKind::U8: case FieldKind::U16:
        if (o.kind() != Opnd::Kind::kImm) wrong("an immediate");
        if (o.value() < 0 || static_cast<uint64_t>(o.value()) > isa::field_imm_max(f.kind))
          fail(fmt::format("{} operand {} = {} does not fit its field (0..{})", d.mnemonic,
                           f.name, o.value(), isa::field_imm_max(f.kind)));
        out.value = o.value();
        break;
      case FieldKind::I64:
        if (o.kind() != Opnd::Kind::kImm) wrong("an immediate");
        out.value = o.value();
        break;
      case FieldKind::Dt:
        if (o.kind() != Opnd::Kind::kDtype) wrong("a data type");
        out.value = o.value();
        break;
      case FieldKind::Cmp:
        if (o.kind() != Opnd::Kind::kCmp) wrong("a comparison");
        out.value = o.value();
        break;
      case FieldKind::Pipe:
        if (o.kind() != Opnd::Kind::kPipe) wrong("a pipe");
        out.value = o.value();
        break;
      case FieldKind::Buf:
        if (o.kind() != Opnd::Kind::kBuf) wrong("a buffer");
        out.value = o.value();
        break;
      case FieldKind::L2h:
        if (o.kind() != Opnd::Kind::kL2Hint) wrong("an L2 policy");
        out.value = o.value();
        break;
      case FieldKind::Uf:  // an immediate isa::UnitFlag code: 0, 2 or 3
        if (o.kind() != Opnd::Kind::kImm || o.value() < 0 || o.value() == 1 || o.value() > 3)
          wrong("a unit flag code (0, 2, 3)");
        out.value = o.value();
        break;
      case FieldKind::Label:
        if (o.kind() != Opnd::Kind::kLabel || o.value() < 0) wrong("a label");
        label_fields.push_back(i);
        out.value = o.value();  // the label id until finish() patches it
        break;
    }
    ++i;
  }
  SectionState& s = section();
  const size_t index = code().code.size();
  for (int lf : label_fields)
    s.fixups.emplace_back(index, static_cast<int>(in.ops[static_cast<size_t>(lf)].value));
  code().code.push_back(in);
  s.comments.push_back(text);
}

bool KernelBuilder::fold_scalar(const Reg& d, const Reg& a, const Opnd& b, int64_t identity,
                                int64_t zeroing, const std::string& c) {
  // Empty registers go to emit(), which names them in its error.
  if (b.kind() != Opnd::Kind::kImm || !d.valid() || !a.valid()) return false;
  if (b.value() == zeroing) {
    movi(d, 0, c);
    return true;
  }
  if (b.value() != identity) return false;
  if (d.id() != a.id()) mov(d, a, c);
  return true;
}

void KernelBuilder::movi(const Reg& d, int64_t v, const std::string& c) {
  emit(Opcode::op_movi, {d, v}, c);
}
void KernelBuilder::mov(const Reg& d, const Reg& s, const std::string& c) {
  emit(Opcode::op_mov, {d, s}, c);
}
void KernelBuilder::add(const Reg& d, const Reg& a, Opnd b, const std::string& c) {
  if (!fold_scalar(d, a, b, 0, kNoFold, c)) emit(Opcode::op_add, {d, a, b}, c);
}
void KernelBuilder::sub(const Reg& d, const Reg& a, Opnd b, const std::string& c) {
  if (!fold_scalar(d, a, b, 0, kNoFold, c)) emit(Opcode::op_sub, {d, a, b}, c);
}
void KernelBuilder::mul(const Reg& d, const Reg& a, Opnd b, const std::string& c) {
  if (!fold_scalar(d, a, b, 1, 0, c)) emit(Opcode::op_mul, {d, a, b}, c);
}
void KernelBuilder::div(const Reg& d, const Reg& a, Opnd b, const std::string& c) {
  if (!fold_scalar(d, a, b, 1, kNoFold, c)) emit(Opcode::op_div, {d, a, b}, c);
}
void KernelBuilder::rem(const Reg& d, const Reg& a, Opnd b, const std::string& c) {
  if (!fold_scalar(d, a, b, kNoFold, 1, c)) emit(Opcode::op_rem, {d, a, b}, c);
}
void KernelBuilder::and_(const Reg& d, const Reg& a, Opnd b, const std::string& c) {
  emit(Opcode::op_and, {d, a, b}, c);
}
void KernelBuilder::shl(const Reg& d, const Reg& a, Opnd b, const std::string& c) {
  if (!fold_scalar(d, a, b, 0, kNoFold, c)) emit(Opcode::op_shl, {d, a, b}, c);
}
void KernelBuilder::shr(const Reg& d, const Reg& a, Opnd b, const std::string& c) {
  if (!fold_scalar(d, a, b, 0, kNoFold, c)) emit(Opcode::op_shr, {d, a, b}, c);
}
void KernelBuilder::min(const Reg& d, const Reg& a, Opnd b, const std::string& c) {
  emit(Opcode::op_min, {d, a, b}, c);
}
void KernelBuilder::max(const Reg& d, const Reg& a, Opnd b, const std::string& c) {
  emit(Opcode::op_max, {d, a, b}, c);
}
void KernelBuilder::mul_add(const Reg& d, const Reg& a, Opnd m, Opnd b, const std::string& c) {
  if (b.kind() == Opnd::Kind::kReg && b.value() == d.id() && d.id() != 0) {
    // d is also the addend: the product must not overwrite it before the add reads it.
    Reg t = reg("mul_add product");
    mul(t, a, m, c);
    add(d, t, b, c);
    return;
  }
  mul(d, a, m, c);
  add(d, d, b, c);
}
void KernelBuilder::end() { emit(Opcode::op_end, {}, "end of kernel"); }

// ---- control flow ----

Label KernelBuilder::label(const std::string& hint) {
  const std::string base = sanitize_label(hint);
  int n = m_label_hint_count[base]++;
  m_label_names.push_back(fmt::format("{}_{}", base, n));
  m_label_pos.push_back(-1);
  m_label_section.push_back(static_cast<int>(m_sections.size()) - 1);
  return Label{static_cast<int>(m_label_names.size()) - 1};
}

void KernelBuilder::bind(Label l) {
  if (l.id < 0 || static_cast<size_t>(l.id) >= m_label_pos.size()) fail("bind: unknown label");
  if (m_label_pos[l.id] >= 0) fail(fmt::format("label {} bound twice", m_label_names[l.id]));
  if (m_label_section[l.id] != static_cast<int>(m_sections.size()) - 1)
    fail(fmt::format("label {} bound in another section", m_label_names[l.id]));
  m_label_pos[l.id] = static_cast<int64_t>(code().code.size());
}

void KernelBuilder::jmp(Label l) { emit(Opcode::op_jmp, {l}); }

void KernelBuilder::branch(const Cond& c, Label target) {
  emit(c.branch, {*c.a, c.b, target});
}

void KernelBuilder::branch_unless(const Cond& c, Label target) {
  emit(negate(c.branch), {*c.a, c.b, target});
}

void KernelBuilder::if_(const Cond& c, const std::function<void()>& body) {
  Label skip = label("endif");
  branch_unless(c, skip);
  body();
  bind(skip);
}

void KernelBuilder::pipelined_steps(const Reg& steps,
                                   const std::function<void(const Reg&)>& load,
                                   const std::function<void(const Reg&)>& compute) {
  Reg t = reg_imm("pipeline iteration t: load step t, compute step t-1", 0);
  Label done = label("done");
  branch(eq(steps, 0), done);
  Label top = label("step_loop");
  bind(top);
  if_(lt(t, steps), [&] { load(t); });
  if_(ne(t, 0), [&] {
    Reg s = reg("step being computed");
    sub(s, t, 1);
    compute(s);
  });
  add(t, t, 1);
  branch(ge(steps, t), top);
  bind(done);
}

void KernelBuilder::for_range(const Reg& i, Opnd begin, Opnd end, Opnd step,
                              const std::function<void()>& body) {
  Label top = label("loop"), exit = label("loop_end");
  if (begin.kind() == Opnd::Kind::kReg) emit(Opcode::op_mov, {i, begin});
  else emit(Opcode::op_movi, {i, begin});
  emit(Opcode::op_bge, {i, end, exit});
  bind(top);
  body();
  emit(Opcode::op_add, {i, i, step});
  emit(Opcode::op_blt, {i, end, top});
  bind(exit);
}

void KernelBuilder::by_parity(const Reg& parity, const std::function<void(int)>& body) {
  Label odd = label("odd"), done = label("parity_end");
  emit(Opcode::op_bne, {parity, 0, odd});
  body(0);
  jmp(done);
  bind(odd);
  body(1);
  bind(done);
}

// ---- flags ----

int KernelBuilder::flag(isa::Pipe src, isa::Pipe dst, const std::string& purpose) {
  int& next = section().next_flag[{static_cast<int>(src), static_cast<int>(dst)}];
  if (next >= m_cfg.flag_ids)
    fail(fmt::format("out of flag ids for {} -> {} ('{}'): the chip has {}", isa::pipe_name(src),
                     isa::pipe_name(dst), purpose, m_cfg.flag_ids));
  return next++;
}

FlagPair KernelBuilder::flag_pair(isa::Pipe src, isa::Pipe dst, const std::string& purpose) {
  FlagPair f;
  f.src = src;
  f.dst = dst;
  f.id[0] = flag(src, dst, purpose + " (ping)");
  f.id[1] = flag(src, dst, purpose + " (pong)");
  return f;
}

void KernelBuilder::set_flag(isa::Pipe src, isa::Pipe dst, int id, const std::string& c) {
  emit(Opcode::op_set_flag, {src, dst, id}, c);
}
void KernelBuilder::wait_flag(isa::Pipe src, isa::Pipe dst, int id, const std::string& c) {
  emit(Opcode::op_wait_flag, {src, dst, id}, c);
}
void KernelBuilder::set_flag(const FlagPair& f, int parity, const std::string& c) {
  set_flag(f.src, f.dst, f.id[parity], c);
}
void KernelBuilder::wait_flag(const FlagPair& f, int parity, const std::string& c) {
  wait_flag(f.src, f.dst, f.id[parity], c);
}

void KernelBuilder::set_flag(const FlagPair& f, const Reg& parity, const std::string& c) {
  by_parity(parity, [&](int q) { set_flag(f, q, c); });
}
void KernelBuilder::wait_flag(const FlagPair& f, const Reg& parity, const std::string& c) {
  by_parity(parity, [&](int q) { wait_flag(f, q, c); });
}

// ---- on-chip buffers ----

uint64_t KernelBuilder::alignment(isa::Buf b) const { return alignment(m_cfg, b); }

uint64_t KernelBuilder::alignment(const ChipConfig& cfg, isa::Buf b) {
  auto it = cfg.align_bytes.find(b);
  uint64_t a = it == cfg.align_bytes.end() ? 1 : it->second;
  return std::max<uint64_t>(a, kMinAlign);
}

uint64_t KernelBuilder::free_bytes(isa::Buf b) const {
  if (m_sections.empty()) fail("no section begun");
  const SectionState& s = m_sections.back();
  uint64_t cap = core().capacity(b);
  auto it = s.used.find(b);
  uint64_t used = it == s.used.end() ? 0 : it->second;
  uint64_t start = (used + alignment(b) - 1) / alignment(b) * alignment(b);
  return start >= cap ? 0 : cap - start;
}

uint64_t KernelBuilder::alloc(isa::Buf b, uint64_t bytes, const std::string& name) {
  SectionState& s = section();
  const CoreKindConfig& c = core();
  if (!c.has(b))
    fail(fmt::format("'{}' needs buffer {}, which {} cores of chip {} do not have", name,
                     isa::buf_name(b), isa::core_kind_name(c.kind), m_cfg.name));
  const uint64_t a = alignment(b);
  uint64_t& used = s.used[b];
  const uint64_t start = (used + a - 1) / a * a;
  if (start + bytes > c.capacity(b)) {
    std::string so_far;
    for (const std::string& n : s.allocations[b]) so_far += (so_far.empty() ? "" : ", ") + n;
    fail(fmt::format("'{}' ({} bytes) does not fit in {} of the {} core ({} bytes, {} already "
                     "allocated{}{})",
                     name, bytes, isa::buf_name(b), isa::core_kind_name(c.kind), c.capacity(b),
                     start, so_far.empty() ? "" : ": ", so_far));
  }
  used = start + bytes;
  s.allocations[b].push_back(fmt::format("{} {} B at {:#x}", name, bytes, start));
  return start;
}

// ---- origin comments ----

KernelBuilder::Origin::Origin(KernelBuilder& b, std::string what) : m_b(b) {
  m_b.m_origin.push_back(std::move(what));
}
KernelBuilder::Origin::~Origin() { m_b.m_origin.pop_back(); }

// ---- finish ----

BuiltKernel KernelBuilder::finish() {
  if (m_finished) fail("finish() called twice");
  if (m_program.sections.empty()) fail("the kernel has no section");
  m_finished = true;
  // Labels: names into each section's label map, fixups into branch targets.
  for (size_t l = 0; l < m_label_pos.size(); ++l) {
    if (m_label_pos[l] < 0) {
      // An unbound label is an error only if something branches to it.
      for (const SectionState& s : m_sections)
        for (const auto& [index, id] : s.fixups)
          if (id == static_cast<int>(l))
            fail(fmt::format("label {} is used but never bound", m_label_names[l]));
      continue;
    }
    m_program.sections[static_cast<size_t>(m_label_section[l])]
        .labels[m_label_names[l]] = static_cast<uint32_t>(m_label_pos[l]);
  }
  for (size_t si = 0; si < m_sections.size(); ++si) {
    isa::Section& sec = m_program.sections[si];
    for (const auto& [index, id] : m_sections[si].fixups) {
      isa::Instruction& in = sec.code[index];
      for (size_t f = 0; f < in.desc().fields.size(); ++f)
        if (in.desc().fields[f].kind == FieldKind::Label) in.ops[f].value = m_label_pos[id];
    }
    if (sec.code.empty()) fail(fmt::format("section {} is empty", isa::core_kind_name(sec.kind)));
    Opcode last = sec.code.back().op;
    if (last != Opcode::op_end && last != Opcode::op_jmp)
      fail(fmt::format("section {} does not end with end or jmp", isa::core_kind_name(sec.kind)));
  }
  // The listing, and each instruction's line in it.
  std::ostringstream out;
  uint32_t line = 1;
  auto put = [&](const std::string& s) {
    out << s << '\n';
    ++line;
  };
  put(".kernel " + m_program.name);
  for (size_t i = 0; i < m_program.arg_names.size(); ++i) {
    const isa::ArgInfo a = m_program.arg(i);
    put(".arg " + a.name + (a.typed() ? ", " + isa::arg_type_text(a) : std::string()));
  }
  if (m_program.aiv_per_aic != 0) put(fmt::format(".aiv_per_aic {}", m_program.aiv_per_aic));
  for (size_t si = 0; si < m_sections.size(); ++si) {
    isa::Section& sec = m_program.sections[si];
    put(std::string(".section ") + isa::core_kind_name(sec.kind));
    std::multimap<uint32_t, std::string> by_index;
    for (const auto& [name, index] : sec.labels) by_index.emplace(index, name);
    for (size_t i = 0; i <= sec.code.size(); ++i) {
      auto range = by_index.equal_range(static_cast<uint32_t>(i));
      for (auto it = range.first; it != range.second; ++it) put(it->second + ":");
      if (i == sec.code.size()) break;
      isa::Instruction& in = sec.code[i];
      in.src_line = line;
      in.src_col = kListingIndent + 1;
      std::string text = std::string(kListingIndent, ' ') + isa::disassemble(in, &sec);
      const std::string& c = m_sections[si].comments[i];
      if (!c.empty()) {
        if (text.size() < 48) text.resize(48, ' ');
        text += " ; " + c;
      }
      put(text);
    }
  }
  BuiltKernel k{std::move(m_program), out.str()};
  std::vector<isa::VerifyIssue> issues = isa::verify(k.program, m_cfg);
  if (!issues.empty()) {
    std::vector<std::string> lines;
    std::istringstream in(k.listing);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    std::string msg = fmt::format("generated kernel {} fails the verifier on chip {}:",
                                  k.program.name, m_cfg.name);
    for (const isa::VerifyIssue& is : issues) {
      msg += fmt::format("\n  {}:{}: {}: {}", k.program.source, is.line,
                         isa::core_kind_name(is.section), is.message);
      if (is.line >= 1 && is.line <= lines.size()) msg += "\n    | " + lines[is.line - 1];
    }
    fail(msg);
  }
  return k;
}

}  // namespace npusim::compiler
