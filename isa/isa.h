// Instruction-set descriptors derived from isa.def, and the decoded instruction form shared by
// the assembler, the verifier and the simulator.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace npusim::isa {

// Pipes of a DaVinci-style AI core. SYNC marks instructions whose pipe is an operand.
enum class Pipe : uint8_t { S, MTE1, MTE2, MTE3, M, V, FIX, ALL, SYNC };
inline constexpr int kNumExecPipes = 7;  // S..FIX: the pipes that own a queue
const char* pipe_name(Pipe p);           // lower case: "s", "mte1", ...
std::optional<Pipe> pipe_from_name(std::string_view s);

// Element types. Sizes in bytes via dtype_size().
enum class Dtype : uint8_t { F32, F16, BF16, S32, S16, S8, U8, U16, S64, NONE };
const char* dtype_name(Dtype t);  // "f32", "f16", "bf16", "s32", "s16", "s8", "u8", "u16", "s64"
std::optional<Dtype> dtype_from_name(std::string_view s);
int dtype_size(Dtype t);
bool dtype_is_float(Dtype t);

// On-chip buffers and global memory.
enum class Buf : uint8_t { GM, L1, L0A, L0B, L0C, UB, BT, FB };
inline constexpr int kNumBufs = 8;
const char* buf_name(Buf b);  // "gm", "l1", ...
std::optional<Buf> buf_from_name(std::string_view s);

enum class Cmp : uint8_t { EQ, NE, LT, GT, LE, GE };
const char* cmp_name(Cmp c);
std::optional<Cmp> cmp_from_name(std::string_view s);

// L2 cache policy of a GM transfer (the optional last suffix of the GM data-movement
// instructions; docs/assembly.md "L2 cache policy"). NORMAL: look up every line; a missing
// line is allocated. NOALLOC (streaming): look up; a missing line is not allocated (read from /
// written to HBM only). BYPASS: no lookup, every byte goes to HBM; a write drops the lines it
// covers from L2 (their copy would be stale).
enum class L2Hint : uint8_t { NORMAL, NOALLOC, BYPASS };
inline constexpr int kNumL2Hints = 3;
const char* l2_hint_name(L2Hint h);  // "normal", "noalloc", "bypass"
std::optional<L2Hint> l2_hint_from_name(std::string_view s);

// UnitFlag of an mmad chain and the fixpipe that takes its tile out of L0C (Ascend C's
// MmadParams::unitFlag / FixpipeParamsV220::unitFlag: 0 off, 2 an mmad of the chain but the
// last, 3 the chain's last mmad and the fixpipe; docs/assembly.md "UnitFlag"). 1 is not a value.
enum class UnitFlag : uint8_t { OFF = 0, CHAIN = 2, LAST = 3 };
const char* unit_flag_name(UnitFlag u);  // "", "uf2", "uf3" (nullptr for a code that is none)
std::optional<UnitFlag> unit_flag_from_name(std::string_view s);  // "uf2", "uf3"

enum class FieldKind : uint8_t {
  Reg, RU8, RU12, RU16, RU32, U1, U2, U3, U4, U8, U16, I64, Dt, Cmp, Pipe, Buf, Label, L2h, Uf
};
// Encoded width in bits of one field of this kind (including the register/immediate flag).
int field_bits(FieldKind k);
// True for kinds written as a ".suffix" of the mnemonic (Dt, Cmp, L2h, Uf).
bool field_is_suffix(FieldKind k);
// True for kinds that may be left out (only after the required suffixes): L2h, value 0
// (normal) then; Uf, value 0 (off) then.
bool field_is_optional(FieldKind k);
// True for RU* kinds (a register or an immediate).
bool field_is_reg_or_imm(FieldKind k);
// Largest immediate value a field of this kind can hold (for U*, RU*).
uint64_t field_imm_max(FieldKind k);

struct FieldDesc {
  FieldKind kind;
  const char* name;
};

inline constexpr int kMaxFields = 14;
inline constexpr int kNumRegs = 32;

// Enumerators are op_<mnemonic> (some mnemonics, e.g. "and", are C++ keywords).
enum class Opcode : uint8_t {
#define F(kind, name)
#define INSN(mn, pipe, ...) op_##mn,
#include "isa/isa.def"
#undef INSN
#undef F
  COUNT
};
inline constexpr int kNumOpcodes = static_cast<int>(Opcode::COUNT);

struct InstrDesc {
  const char* mnemonic;
  Pipe pipe;
  std::vector<FieldDesc> fields;
};
const InstrDesc& describe(Opcode op);
std::optional<Opcode> opcode_from_mnemonic(std::string_view mn);
// Index of the field called `name` in op's field list, or -1.
int field_index(Opcode op, std::string_view name);

// One operand as written: for RU* kinds, is_reg says whether `value` is a register number.
struct Operand {
  bool is_reg = false;
  int64_t value = 0;
};

// A decoded instruction. src_line/src_col locate it in the assembly text (0 if unknown).
struct Instruction {
  Opcode op = Opcode::op_nop;
  std::array<Operand, kMaxFields> ops{};
  uint32_t src_line = 0;
  uint32_t src_col = 0;
  const InstrDesc& desc() const { return describe(op); }
  // The pipe whose queue executes this instruction (resolves SYNC from the operand).
  Pipe exec_pipe() const;
};

// Which kind of core a program section runs on.
enum class CoreKind : uint8_t { AIC, AIV, AICORE };
const char* core_kind_name(CoreKind k);  // "aic", "aiv", "aicore"
std::optional<CoreKind> core_kind_from_name(std::string_view s);

// A kernel: one instruction stream per core kind it runs on. A kernel with only an "aicore"
// section runs on coupled cores; "aic" and/or "aiv" sections run on a split chip's cube /
// vector cores (both together: a mix kernel, one cube core with Program::aiv_per_aic vector
// cores per block).
struct Section {
  CoreKind kind = CoreKind::AICORE;
  std::vector<Instruction> code;
  std::map<std::string, uint32_t> labels;  // label -> instruction index (for disassembly)
};
// A kernel argument as declared by `.arg` (docs/assembly.md). Untyped (dtype NONE): a scalar or
// a raw address. Typed: the GM address of a tensor of `dtype` elements, of any shape if `dims` is
// empty, else of shape dims, each a decimal integer literal or the name of an untyped argument
// of the same kernel (whose value is that dimension).
struct ArgInfo {
  std::string name;
  Dtype dtype = Dtype::NONE;
  std::vector<std::string> dims;
  bool typed() const { return dtype != Dtype::NONE; }
  bool operator==(const ArgInfo& o) const {
    return name == o.name && dtype == o.dtype && dims == o.dims;
  }
  bool operator!=(const ArgInfo& o) const { return !(*this == o); }
};

// The value of a dimension written as a decimal literal (digits only, at most INT64_MAX), or
// nullopt if `dim` is not one (then it names an argument).
inline std::optional<int64_t> dim_literal(std::string_view dim) {
  if (dim.empty()) return std::nullopt;
  uint64_t v = 0;
  for (char c : dim) {
    if (c < '0' || c > '9') return std::nullopt;
    if (v > (uint64_t(INT64_MAX) - uint64_t(c - '0')) / 10) return std::nullopt;
    v = v * 10 + uint64_t(c - '0');
  }
  return static_cast<int64_t>(v);
}

// The largest vector cores per cube core a program may declare (a u8 in the binary format).
inline constexpr int kMaxAivPerAic = 255;

struct Program {
  std::string name;    // kernel name (.kernel directive) or file stem
  std::string source;  // file name the program came from, for error messages
  std::vector<Section> sections;
  std::vector<std::string> arg_names;  // .arg directives: ldarg index i names arg_names[i]
  // The arguments' declarations, parallel to arg_names (same order and names). The assembler
  // and read_kernel fill it; a Program built in code may leave it empty, meaning every argument
  // is untyped. Read it through arg().
  std::vector<ArgInfo> args;
  // A mix kernel's vector cores per cube core in a block (`.aiv_per_aic`, docs/assembly.md):
  // 0 = not declared, the chip's cores.aiv.per_aic (Ascend C KERNEL_TYPE_MIX_AIC_1_2 on 910B);
  // 1 = one vector core per cube core (KERNEL_TYPE_MIX_AIC_1_1), get_subblock_id always 0.
  int aiv_per_aic = 0;  // 0..kMaxAivPerAic
  const Section* find(CoreKind k) const;
  // Argument i (i < arg_names.size()): args[i] if args is filled, else untyped.
  ArgInfo arg(size_t i) const {
    if (i < args.size()) return args[i];
    ArgInfo a;
    a.name = arg_names.at(i);
    return a;
  }
};

// Why an operand of `in` is illegal for its field (a register above x31, an immediate wider
// than its field, a Dt/Cmp/Pipe/Buf code naming no type, comparison, pipe or buffer), naming
// the field; nullopt if every operand is legal. decode() accepts any bit pattern; loaders of
// binary kernels call this on every decoded instruction.
std::optional<std::string> illegal_operand(const Instruction& in);

// 128-bit binary encoding of one instruction.
struct EncodedWord {
  uint64_t lo = 0, hi = 0;
  bool operator==(const EncodedWord& o) const { return lo == o.lo && hi == o.hi; }
};
// Throws IsaError if an operand does not fit its field.
EncodedWord encode(const Instruction& in);
// Throws IsaError on an unknown opcode.
Instruction decode(const EncodedWord& w);

// A 64-bit digest (FNV-1a) of a program's code: every section's core kind and instructions
// (opcode and operands; not source positions, labels or argument names) and a declared
// aiv_per_aic (a program that declares none keeps the digest it had before the field existed). Two programs with the
// same digest run the same instructions; used to show that a compiler change left a kernel
// alone (SimOptions::launch_log).
uint64_t program_digest(const Program& p);

}  // namespace npusim::isa
