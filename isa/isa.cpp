// Descriptors, names and the 128-bit encoding, all derived from isa.def.
#include "isa/isa.h"

#include <stdexcept>

#include <fmt/format.h>

#include "common/error.h"

namespace npusim::isa {
namespace {

template <typename E, size_t N>
std::optional<E> lookup(const char* const (&names)[N], std::string_view s) {
  for (size_t i = 0; i < N; ++i)
    if (s == names[i]) return static_cast<E>(i);
  return std::nullopt;
}

const char* const kPipeNames[] = {"s", "mte1", "mte2", "mte3", "m", "v", "fix", "all", "sync"};
const char* const kDtypeNames[] = {"f32", "f16", "bf16", "s32", "s16", "s8", "u8", "u16", "s64", "none"};
const char* const kBufNames[] = {"gm", "l1", "l0a", "l0b", "l0c", "ub", "bt", "fb"};
const char* const kCmpNames[] = {"eq", "ne", "lt", "gt", "le", "ge"};
const char* const kCoreKindNames[] = {"aic", "aiv", "aicore"};
const char* const kL2HintNames[] = {"normal", "noalloc", "bypass"};
static_assert(sizeof(kL2HintNames) / sizeof(kL2HintNames[0]) == kNumL2Hints);

const std::vector<InstrDesc>& table() {
  static const std::vector<InstrDesc> t = {
#define F(kind, name) FieldDesc{FieldKind::kind, #name}
#define INSN(mn, pipe, ...) InstrDesc{#mn, Pipe::pipe, {__VA_ARGS__}},
#include "isa/isa.def"
#undef INSN
#undef F
  };
  return t;
}

constexpr int kOpcodeBits = 8;
static_assert(kNumOpcodes < (1 << kOpcodeBits), "opcode field too narrow");

// Bit-level writer/reader over the 128-bit word.
void put_bits(EncodedWord& w, int pos, int nbits, uint64_t value) {
  for (int i = 0; i < nbits; ++i) {
    uint64_t bit = (value >> i) & 1;
    int p = pos + i;
    if (p < 64) w.lo |= bit << p;
    else w.hi |= bit << (p - 64);
  }
}
uint64_t get_bits(const EncodedWord& w, int pos, int nbits) {
  uint64_t v = 0;
  for (int i = 0; i < nbits; ++i) {
    int p = pos + i;
    uint64_t bit = p < 64 ? (w.lo >> p) & 1 : (w.hi >> (p - 64)) & 1;
    v |= bit << i;
  }
  return v;
}

int imm_width(FieldKind k) {
  switch (k) {
    case FieldKind::RU8: case FieldKind::U8: return 8;
    case FieldKind::RU12: return 12;
    case FieldKind::RU16: case FieldKind::U16: return 16;
    case FieldKind::RU32: return 32;
    case FieldKind::U1: return 1;
    case FieldKind::U2: return 2;
    case FieldKind::U3: return 3;
    case FieldKind::U4: return 4;
    case FieldKind::I64: return 64;
    case FieldKind::Reg: return 5;
    case FieldKind::Dt: case FieldKind::Pipe: case FieldKind::Buf: return 4;
    case FieldKind::Cmp: return 3;
    case FieldKind::Label: return 20;
    case FieldKind::L2h: return 2;
    case FieldKind::Uf: return 2;
  }
  return 0;
}

}  // namespace

const char* pipe_name(Pipe p) { return kPipeNames[static_cast<int>(p)]; }
std::optional<Pipe> pipe_from_name(std::string_view s) {
  auto p = lookup<Pipe>(kPipeNames, s);
  if (p && *p == Pipe::SYNC) return std::nullopt;
  return p;
}
const char* dtype_name(Dtype t) { return kDtypeNames[static_cast<int>(t)]; }
std::optional<Dtype> dtype_from_name(std::string_view s) {
  auto t = lookup<Dtype>(kDtypeNames, s);
  if (t && *t == Dtype::NONE) return std::nullopt;
  return t;
}
int dtype_size(Dtype t) {
  switch (t) {
    case Dtype::F32: case Dtype::S32: return 4;
    case Dtype::F16: case Dtype::BF16: case Dtype::S16: case Dtype::U16: return 2;
    case Dtype::S8: case Dtype::U8: return 1;
    case Dtype::S64: return 8;
    case Dtype::NONE: return 0;
  }
  return 0;
}
bool dtype_is_float(Dtype t) { return t == Dtype::F32 || t == Dtype::F16 || t == Dtype::BF16; }
const char* buf_name(Buf b) { return kBufNames[static_cast<int>(b)]; }
std::optional<Buf> buf_from_name(std::string_view s) { return lookup<Buf>(kBufNames, s); }
const char* cmp_name(Cmp c) { return kCmpNames[static_cast<int>(c)]; }
std::optional<Cmp> cmp_from_name(std::string_view s) { return lookup<Cmp>(kCmpNames, s); }
const char* l2_hint_name(L2Hint h) { return kL2HintNames[static_cast<int>(h)]; }
std::optional<L2Hint> l2_hint_from_name(std::string_view s) {
  return lookup<L2Hint>(kL2HintNames, s);
}
const char* unit_flag_name(UnitFlag u) {
  switch (u) {
    case UnitFlag::OFF: return "";
    case UnitFlag::CHAIN: return "uf2";
    case UnitFlag::LAST: return "uf3";
  }
  return nullptr;
}
std::optional<UnitFlag> unit_flag_from_name(std::string_view s) {
  if (s == "uf2") return UnitFlag::CHAIN;
  if (s == "uf3") return UnitFlag::LAST;
  return std::nullopt;
}
const char* core_kind_name(CoreKind k) { return kCoreKindNames[static_cast<int>(k)]; }
std::optional<CoreKind> core_kind_from_name(std::string_view s) {
  return lookup<CoreKind>(kCoreKindNames, s);
}

int field_bits(FieldKind k) {
  if (field_is_reg_or_imm(k)) return 1 + std::max(5, imm_width(k));
  return imm_width(k);
}
bool field_is_suffix(FieldKind k) {
  return k == FieldKind::Dt || k == FieldKind::Cmp || k == FieldKind::L2h || k == FieldKind::Uf;
}
bool field_is_optional(FieldKind k) { return k == FieldKind::L2h || k == FieldKind::Uf; }
bool field_is_reg_or_imm(FieldKind k) {
  // RU8, RU12, RU16, RU32 are consecutive enumerators: one unsigned range compare (this runs
  // for every operand the scalar unit resolves).
  static_assert(static_cast<int>(FieldKind::RU12) == static_cast<int>(FieldKind::RU8) + 1 &&
                    static_cast<int>(FieldKind::RU16) == static_cast<int>(FieldKind::RU8) + 2 &&
                    static_cast<int>(FieldKind::RU32) == static_cast<int>(FieldKind::RU8) + 3,
                "RU* field kinds must be consecutive");
  return static_cast<unsigned>(k) - static_cast<unsigned>(FieldKind::RU8) <= 3u;
}
uint64_t field_imm_max(FieldKind k) {
  int w = imm_width(k);
  return w >= 64 ? ~0ull : (1ull << w) - 1;
}

namespace {

// The table's storage, resolved once: set while the library loads (g_table_ready), or by the
// first lookup if another translation unit's static initialiser gets there first. A plain
// pointer rather than a function-local static, so the lookups below (each runs several times per
// simulated instruction) need no guard and no stack frame.
const InstrDesc* g_table_data = nullptr;
__attribute__((noinline)) const InstrDesc* init_table_data() {
  return g_table_data = table().data();
}
inline const InstrDesc* table_data() {
  const InstrDesc* d = g_table_data;
  return d ? d : init_table_data();
}
const bool g_table_ready = init_table_data() != nullptr;

// Per opcode, its field names with their lengths, so field_index compares lengths first.
struct FieldNames {
  std::array<std::string_view, kMaxFields> names;
  int count = 0;
};
const std::array<FieldNames, kNumOpcodes>& field_names() {
  static const std::array<FieldNames, kNumOpcodes> all = [] {
    std::array<FieldNames, kNumOpcodes> a{};
    const auto& t = table();
    for (size_t op = 0; op < t.size(); ++op) {
      if (t[op].fields.size() > static_cast<size_t>(kMaxFields))
        throw IsaError(fmt::format("{} has more than {} fields", t[op].mnemonic, kMaxFields));
      a[op].count = static_cast<int>(t[op].fields.size());
      for (size_t i = 0; i < t[op].fields.size(); ++i) a[op].names[i] = t[op].fields[i].name;
    }
    return a;
  }();
  return all;
}

[[noreturn]] __attribute__((noinline, cold)) void bad_opcode(const char* where, size_t i) {
  throw std::out_of_range(fmt::format("{}: opcode {} is not in the instruction set", where, i));
}

}  // namespace

const InstrDesc& describe(Opcode op) {
  const auto i = static_cast<size_t>(op);
  if (i >= static_cast<size_t>(kNumOpcodes)) bad_opcode("describe", i);
  return table_data()[i];
}

std::optional<Opcode> opcode_from_mnemonic(std::string_view mn) {
  const auto& t = table();
  for (size_t i = 0; i < t.size(); ++i)
    if (mn == t[i].mnemonic) return static_cast<Opcode>(i);
  return std::nullopt;
}

int field_index(Opcode op, std::string_view name) {
  const auto i = static_cast<size_t>(op);
  if (i >= static_cast<size_t>(kNumOpcodes)) bad_opcode("field_index", i);
  const FieldNames& f = field_names()[i];
  for (int j = 0; j < f.count; ++j)
    if (f.names[j] == name) return j;
  return -1;
}

Pipe Instruction::exec_pipe() const {
  const auto i = static_cast<size_t>(op);
  if (i >= static_cast<size_t>(kNumOpcodes)) bad_opcode("exec_pipe", i);
  const Pipe pipe = table_data()[i].pipe;
  if (pipe != Pipe::SYNC) return pipe;
  switch (op) {
    case Opcode::op_set_flag: return static_cast<Pipe>(ops[0].value);   // runs in src's queue
    case Opcode::op_wait_flag: return static_cast<Pipe>(ops[1].value);  // blocks dst's queue
    default: return static_cast<Pipe>(ops[0].value);                 // cc_set / cc_wait
  }
}

uint64_t program_digest(const Program& p) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a offset basis and prime (64-bit)
  auto add = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 0x100000001b3ull;
  };
  for (const Section& s : p.sections) {
    add(static_cast<uint64_t>(s.kind));
    add(s.code.size());
    for (const Instruction& in : s.code) {
      add(static_cast<uint64_t>(in.op));
      for (const Operand& o : in.ops) add(static_cast<uint64_t>(o.value) * 2 + (o.is_reg ? 1 : 0));
    }
  }
  if (p.aiv_per_aic != 0) add(0x4d49580000000000ull + static_cast<uint64_t>(p.aiv_per_aic));
  return h;
}

const Section* Program::find(CoreKind k) const {
  for (const auto& s : sections)
    if (s.kind == k) return &s;
  return nullptr;
}

std::optional<std::string> illegal_operand(const Instruction& in) {
  const InstrDesc& d = in.desc();
  for (size_t i = 0; i < d.fields.size(); ++i) {
    const FieldDesc& f = d.fields[i];
    const Operand& o = in.ops[i];
    uint64_t v = static_cast<uint64_t>(o.value);
    if (f.kind == FieldKind::I64) continue;
    uint64_t limit = field_imm_max(f.kind);  // largest legal value
    const char* what = "value";
    if (f.kind == FieldKind::Reg || (field_is_reg_or_imm(f.kind) && o.is_reg)) {
      limit = kNumRegs - 1, what = "register number";
    } else if (f.kind == FieldKind::Dt) {
      limit = static_cast<uint64_t>(Dtype::NONE) - 1, what = "data type code";
    } else if (f.kind == FieldKind::Cmp) {
      limit = static_cast<uint64_t>(Cmp::GE), what = "comparison code";
    } else if (f.kind == FieldKind::Pipe) {
      limit = static_cast<uint64_t>(Pipe::ALL), what = "pipe code";
    } else if (f.kind == FieldKind::Buf) {
      limit = kNumBufs - 1, what = "buffer code";
    } else if (f.kind == FieldKind::L2h) {
      limit = kNumL2Hints - 1, what = "L2 policy code";
    } else if (f.kind == FieldKind::Uf) {
      if (v == 1)
        return fmt::format("{} operand {}: unit flag code 1 is not a unit flag (0 off, 2, 3)",
                           d.mnemonic, f.name);
      limit = static_cast<uint64_t>(UnitFlag::LAST), what = "unit flag code";
    }
    if (v > limit)
      return fmt::format("{} operand {}: {} {} is out of range 0..{}", d.mnemonic, f.name, what,
                         o.value, limit);
  }
  return std::nullopt;
}

EncodedWord encode(const Instruction& in) {
  const InstrDesc& d = in.desc();
  EncodedWord w;
  put_bits(w, 0, kOpcodeBits, static_cast<uint64_t>(in.op));
  int pos = kOpcodeBits;
  for (size_t i = 0; i < d.fields.size(); ++i) {
    const FieldDesc& f = d.fields[i];
    const Operand& o = in.ops[i];
    int bits = field_bits(f.kind);
    uint64_t payload;
    if (field_is_reg_or_imm(f.kind)) {
      uint64_t v = static_cast<uint64_t>(o.value);
      if (o.is_reg ? v >= kNumRegs : v > field_imm_max(f.kind))
        throw IsaError(fmt::format("{}: operand {} value {} does not fit its {}-bit field",
                                   d.mnemonic, f.name, o.value, bits - 1));
      payload = (o.is_reg ? 1u : 0u) | (v << 1);
    } else if (f.kind == FieldKind::I64) {
      payload = static_cast<uint64_t>(o.value);
    } else {
      uint64_t v = static_cast<uint64_t>(o.value);
      uint64_t max = f.kind == FieldKind::Reg ? kNumRegs - 1 : (1ull << bits) - 1;
      if (v > max)
        throw IsaError(fmt::format("{}: operand {} value {} does not fit its {}-bit field",
                                   d.mnemonic, f.name, o.value, bits));
      payload = v;
    }
    if (pos + bits > 128)
      throw IsaError(fmt::format("{}: encoding exceeds 128 bits", d.mnemonic));
    put_bits(w, pos, bits, payload);
    pos += bits;
  }
  return w;
}

Instruction decode(const EncodedWord& w) {
  uint64_t opc = get_bits(w, 0, kOpcodeBits);
  if (opc >= static_cast<uint64_t>(kNumOpcodes))
    throw IsaError(fmt::format("illegal instruction: opcode {} is not in the instruction set", opc));
  Instruction in;
  in.op = static_cast<Opcode>(opc);
  const InstrDesc& d = in.desc();
  int pos = kOpcodeBits;
  for (size_t i = 0; i < d.fields.size(); ++i) {
    const FieldDesc& f = d.fields[i];
    int bits = field_bits(f.kind);
    uint64_t payload = get_bits(w, pos, bits);
    pos += bits;
    Operand& o = in.ops[i];
    if (field_is_reg_or_imm(f.kind)) {
      o.is_reg = payload & 1;
      o.value = static_cast<int64_t>(payload >> 1);
    } else {
      o.is_reg = f.kind == FieldKind::Reg;
      o.value = static_cast<int64_t>(payload);
    }
  }
  return in;
}

}  // namespace npusim::isa
