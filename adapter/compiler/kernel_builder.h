// KernelBuilder: emits an isa::Program directly (no assembly text) for the kernel compiler.
//
// What it takes care of, so op generators (adapter/compiler/ops/) state only their algorithm:
// - sections (aic / aiv / aicore), named kernel arguments (ldarg by name);
// - scalar registers: a pool of x1..x31 handed out as RAII `Reg`s (x0 is never written, so it
//   always holds 0 and serves as the "unused" register operand); running out is a CompileError
//   naming the op and what the register was for;
// - operands given as a register or an immediate: for RU* fields the builder encodes an
//   immediate when it fits the field (isa::field_imm_max) and otherwise loads it into a
//   temporary register first; Reg fields given an immediate get a temporary (0 uses x0),
//   except a written register (field xd); U* fields must fit (CompileError naming the
//   instruction and field);
// - labels with forward references, loops, two-way branches on a parity (flag ids are
//   immediates, so ping/pong code is emitted once per parity);
// - flag ids per (src pipe, dst pipe) pair, checked against ChipConfig::flag_ids;
// - on-chip buffer allocation from the section core's capacities with the config's alignment
//   (CompileError naming the op, the buffer and the sizes when a tile does not fit);
// - an origin comment per instruction, kept in the generated listing (see BuiltKernel);
// - finish(): patches labels, checks every section ends, and runs isa::verify_or_throw.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "adapter/compiler/op_desc.h"
#include "isa/isa.h"
#include "sim/config/chip_config.h"

namespace npusim::compiler {

class KernelBuilder;

// A scalar register owned by the caller; returned to the builder's pool on destruction.
class Reg {
 public:
  Reg() = default;
  Reg(Reg&& o) noexcept { *this = std::move(o); }
  Reg& operator=(Reg&& o) noexcept;
  Reg(const Reg&) = delete;
  Reg& operator=(const Reg&) = delete;
  ~Reg() { release(); }
  int id() const { return m_id; }
  bool valid() const { return m_id >= 0; }
  void release();

 private:
  friend class KernelBuilder;
  Reg(KernelBuilder* b, int id, int section) : m_builder(b), m_id(id), m_section(section) {}
  KernelBuilder* m_builder = nullptr;
  int m_id = -1;
  int m_section = -1;  // the section it belongs to (each core has its own registers)
};

// A branch target in the current section.
struct Label {
  int id = -1;
};

// One operand as the caller gives it; emit() matches it against the instruction's field kind.
class Opnd {
 public:
  enum class Kind { kReg, kImm, kDtype, kCmp, kPipe, kBuf, kLabel, kL2Hint };
  Opnd(const Reg& r) : m_kind(Kind::kReg), m_value(r.id()) {}  // NOLINT: implicit by design
  template <typename I,
            typename = std::enable_if_t<std::is_integral_v<I> && !std::is_same_v<I, bool>>>
  Opnd(I v) : m_kind(Kind::kImm), m_value(static_cast<int64_t>(v)) {}  // NOLINT
  Opnd(isa::Dtype t) : m_kind(Kind::kDtype), m_value(static_cast<int64_t>(t)) {}  // NOLINT
  Opnd(isa::Cmp c) : m_kind(Kind::kCmp), m_value(static_cast<int64_t>(c)) {}      // NOLINT
  Opnd(isa::Pipe p) : m_kind(Kind::kPipe), m_value(static_cast<int64_t>(p)) {}    // NOLINT
  Opnd(isa::Buf b) : m_kind(Kind::kBuf), m_value(static_cast<int64_t>(b)) {}      // NOLINT
  Opnd(Label l) : m_kind(Kind::kLabel), m_value(l.id) {}                          // NOLINT
  Opnd(isa::L2Hint h) : m_kind(Kind::kL2Hint), m_value(static_cast<int64_t>(h)) {}  // NOLINT
  // Register x<n> by number (x0: the zero register).
  static Opnd reg_number(int n) {
    Opnd o(int64_t{0});
    o.m_kind = Kind::kReg;
    o.m_value = n;
    return o;
  }
  Kind kind() const { return m_kind; }
  int64_t value() const { return m_value; }

 private:
  Kind m_kind;
  int64_t m_value;
};

// A condition for branches and if_(): `a <op> b` with op one of beq, bne, blt, bge.
struct Cond {
  isa::Opcode branch;
  const Reg* a;
  Opnd b;
};
inline Cond lt(const Reg& a, Opnd b) { return {isa::Opcode::op_blt, &a, b}; }
inline Cond ge(const Reg& a, Opnd b) { return {isa::Opcode::op_bge, &a, b}; }
inline Cond eq(const Reg& a, Opnd b) { return {isa::Opcode::op_beq, &a, b}; }
inline Cond ne(const Reg& a, Opnd b) { return {isa::Opcode::op_bne, &a, b}; }

// Two flag ids of one (src, dst) pipe pair, for ping (parity 0) and pong (parity 1) buffers.
struct FlagPair {
  isa::Pipe src = isa::Pipe::S, dst = isa::Pipe::S;
  int id[2] = {-1, -1};
};

// A built kernel: the verified program and its listing. The listing is assembly text (it
// assembles to the same program) with each instruction's origin as a trailing comment; each
// instruction's src_line points at its line in the listing, so faults at run time and verifier
// messages name the listing line.
struct BuiltKernel {
  isa::Program program;
  std::string listing;
};

class KernelBuilder {
 public:
  // kernel_name: Program::name; op: the op being compiled, named in every error.
  KernelBuilder(std::string kernel_name, std::string op, const ChipConfig& cfg);
  KernelBuilder(const KernelBuilder&) = delete;
  KernelBuilder& operator=(const KernelBuilder&) = delete;

  const ChipConfig& config() const { return m_cfg; }
  const std::string& op() const { return m_op; }
  // A mix kernel's vector cores per cube core in a block (isa::Program::aiv_per_aic): the
  // chip's cores.aiv.per_aic unless set_aiv_per_aic declared fewer. Emitters that split a
  // block's work among its vector cores read this, not config().aiv_per_aic.
  int aiv_per_aic() const;
  // Declares the kernel's ratio (1: Ascend C KERNEL_TYPE_MIX_AIC_1_1, the block's other vector
  // cores stay free for other launches). CompileError naming the op on a coupled chip, outside
  // 1..the chip's per_aic, or once a section has begun (its code may have read the ratio).
  void set_aiv_per_aic(int n);
  [[noreturn]] void fail(const std::string& what) const;  // CompileError "<op>: <what>"

  // ---- arguments ----
  // The most arguments a kernel takes: ldarg's index field is 8 bits, so indices 0..255. An op
  // with more tensors splits its work over several launches (AllFinite, the multi-tensor ops,
  // ConcatV2 / Pack); declare_arg past this is a CompileError naming the op.
  static int max_args();
  // Declares the next kernel argument (ldarg index = declaration order); returns its index.
  // Untyped: a scalar or a raw address.
  int declare_arg(const std::string& name);
  // Typed: the GM address of a tensor of `dtype` (Program::args, `.arg NAME, DTYPE[dims]` in
  // the listing); empty dims = any shape.
  int declare_arg(const std::string& name, isa::Dtype dtype, const std::vector<int64_t>& dims);
  // A new register loaded with argument `name` (declared before).
  Reg load_arg(const std::string& name);

  // ---- sections ----
  // Starts the code for cores of `kind`; the previous section (if any) must have ended with
  // end or jmp. Registers, flags and buffer allocations are per section (per core).
  void begin_section(isa::CoreKind kind);
  // The core kind that runs vector code / cube code on this chip (aiv / aic on a split chip,
  // aicore on a coupled one); throws if the chip has none.
  isa::CoreKind vector_core_kind() const;
  isa::CoreKind cube_core_kind() const;
  const CoreKindConfig& core() const;  // the current section's core kind

  // ---- registers ----
  Reg reg(const std::string& purpose);
  Reg reg_imm(const std::string& purpose, int64_t value);  // reg() + movi
  int free_regs() const;

  // ---- instructions ----
  // Emits one instruction with operands in isa.def order (Dt/Cmp suffix fields included, in
  // table order). comment: the instruction's origin in the listing (default: the innermost
  // Origin scope).
  void emit(isa::Opcode op, std::initializer_list<Opnd> operands, const std::string& comment = {});

  // Scalar shorthands (d = a OP b). An immediate b that makes the operation an identity or a
  // constant (a + 0, a - 0, a * 1, a / 1, a << 0, a >> 0; a * 0, a % 1) emits a move, a movi or,
  // when d is a, nothing: the scalar unit pays scalar.cycles_per_insn for every instruction,
  // and a compiler folds these (kernels' index arithmetic is written for the general case, e.g.
  // `* cg_in / 16` with one channel block per group).
  void movi(const Reg& d, int64_t v, const std::string& c = {});
  void mov(const Reg& d, const Reg& s, const std::string& c = {});
  void add(const Reg& d, const Reg& a, Opnd b, const std::string& c = {});
  void sub(const Reg& d, const Reg& a, Opnd b, const std::string& c = {});
  void mul(const Reg& d, const Reg& a, Opnd b, const std::string& c = {});
  void div(const Reg& d, const Reg& a, Opnd b, const std::string& c = {});
  void rem(const Reg& d, const Reg& a, Opnd b, const std::string& c = {});
  void and_(const Reg& d, const Reg& a, Opnd b, const std::string& c = {});
  void shl(const Reg& d, const Reg& a, Opnd b, const std::string& c = {});
  void shr(const Reg& d, const Reg& a, Opnd b, const std::string& c = {});
  void min(const Reg& d, const Reg& a, Opnd b, const std::string& c = {});
  void max(const Reg& d, const Reg& a, Opnd b, const std::string& c = {});
  // d = a * m + b (two instructions; m and b immediates or registers; any of a, m, b may be d:
  // when b is d the product goes through a temporary register).
  void mul_add(const Reg& d, const Reg& a, Opnd m, Opnd b, const std::string& c = {});
  void end();

  // ---- control flow ----
  Label label(const std::string& hint);  // a new, unbound label
  void bind(Label l);                    // binds l to the next instruction
  void jmp(Label l);
  void branch(const Cond& c, Label target);
  void branch_unless(const Cond& c, Label target);  // branch when c is false
  // Emits body only when c holds at run time.
  void if_(const Cond& c, const std::function<void()>& body);
  // for (i = begin; i < end; i += step) body(); i must stay unmodified by body.
  void for_range(const Reg& i, Opnd begin, Opnd end, Opnd step,
                 const std::function<void()>& body);
  // A software pipeline over `steps` steps (a register): iteration t runs load(t) if t < steps,
  // then compute(t - 1) if t >= 1, so step t+1's loads are issued before step t's compute and
  // the pipes overlap. Nothing is emitted into the loop when steps is 0.
  void pipelined_steps(const Reg& steps, const std::function<void(const Reg&)>& load,
                       const std::function<void(const Reg&)>& compute);
  // Emits body(0) and body(1) as the two arms of a branch on `parity` (0 or 1 at run time).
  void by_parity(const Reg& parity, const std::function<void(int)>& body);

  // ---- flags ----
  // A fresh flag id (or a ping/pong pair) for src -> dst in the current section.
  int flag(isa::Pipe src, isa::Pipe dst, const std::string& purpose);
  FlagPair flag_pair(isa::Pipe src, isa::Pipe dst, const std::string& purpose);
  void set_flag(isa::Pipe src, isa::Pipe dst, int id, const std::string& c = {});
  void wait_flag(isa::Pipe src, isa::Pipe dst, int id, const std::string& c = {});
  void set_flag(const FlagPair& f, int parity, const std::string& c = {});
  void wait_flag(const FlagPair& f, int parity, const std::string& c = {});
  // The same with the parity known only at run time (a two-way branch, see by_parity).
  void set_flag(const FlagPair& f, const Reg& parity, const std::string& c = {});
  void wait_flag(const FlagPair& f, const Reg& parity, const std::string& c = {});

  // ---- on-chip buffers ----
  // Allocates `bytes` of buffer b of the current section's core, aligned to
  // max(32, cfg.align_bytes[b]); returns the byte address. CompileError if it does not fit.
  uint64_t alloc(isa::Buf b, uint64_t bytes, const std::string& name);
  uint64_t free_bytes(isa::Buf b) const;  // what alloc() can still give (before alignment)
  uint64_t alignment(isa::Buf b) const;
  // The alignment alloc() gives buffer b on chip cfg: max(32, cfg.align_bytes[b]).
  static uint64_t alignment(const ChipConfig& cfg, isa::Buf b);

  // ---- origin comments ----
  // While alive, instructions without an explicit comment carry `what`.
  class Origin {
   public:
    Origin(KernelBuilder& b, std::string what);
    ~Origin();
    Origin(const Origin&) = delete;
    Origin& operator=(const Origin&) = delete;

   private:
    KernelBuilder& m_b;
  };

  // Patches labels, checks the sections and runs isa::verify_or_throw (its IsaError becomes a
  // CompileError naming the op and quoting the listing). The builder is spent afterwards.
  BuiltKernel finish();

 private:
  friend class Reg;
  struct SectionState {
    isa::CoreKind kind;
    std::vector<std::string> comments;          // per instruction
    std::vector<std::pair<size_t, int>> fixups;  // (instruction index, label id)
    std::map<std::pair<int, int>, int> next_flag;
    std::map<isa::Buf, uint64_t> used;           // bytes allocated per buffer
    std::map<isa::Buf, std::vector<std::string>> allocations;  // for messages
  };
  SectionState& section();
  isa::Section& code();
  void release_reg(int id, int section);
  // For the shorthands: d = a or d = 0 instead of d = a `op` b where the immediate b is
  // `identity` or `zeroing` (a value b never takes: kNoFold); true if folded (nothing emitted
  // for op).
  static constexpr int64_t kNoFold = INT64_MIN;
  bool fold_scalar(const Reg& d, const Reg& a, const Opnd& b, int64_t identity, int64_t zeroing,
                   const std::string& c);
  int take_reg(const std::string& purpose);
  std::string current_comment(const std::string& explicit_comment) const;

  std::string m_op;
  const ChipConfig& m_cfg;
  isa::Program m_program;
  std::vector<SectionState> m_sections;
  std::vector<std::string> m_label_names;   // by label id
  std::vector<int64_t> m_label_pos;         // by label id: instruction index, -1 unbound
  std::vector<int> m_label_section;         // by label id: section index
  std::vector<std::string> m_reg_purpose;   // by register number, "" = free
  std::vector<std::string> m_origin;        // Origin scope stack
  std::map<std::string, int> m_label_hint_count;
  bool m_finished = false;
};

}  // namespace npusim::compiler
