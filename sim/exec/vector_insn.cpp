#include "sim/exec/vector_insn.h"

#include <algorithm>
#include <initializer_list>
#include <numeric>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "common/int_math.h"

namespace npusim::vec {
namespace {

using isa::Dtype;
using isa::Opcode;

// Index of each operand field of a V instruction in its isa.def field list (-1 if absent),
// looked up by name once per opcode. VUN/VSCL/reductions name their source `xsrc`, `src_blk`,
// `src_rep`; it fills slot src0.
struct FieldMap {
  int type = -1, src_type = -1, cmp = -1, round = -1, scalar = -1, repeat = -1;
  std::array<int, 4> addr{-1, -1, -1, -1};  // per Slot
  std::array<int, 3> blk{-1, -1, -1};       // dst, src0, src1
  std::array<int, 3> rep{-1, -1, -1};
};

int first_field(Opcode op, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    int i = isa::field_index(op, n);
    if (i >= 0) return i;
  }
  return -1;
}

const FieldMap& field_map(Opcode op) {
  static const std::array<FieldMap, isa::kNumOpcodes> maps = [] {
    std::array<FieldMap, isa::kNumOpcodes> m{};
    for (int i = 0; i < isa::kNumOpcodes; ++i) {
      auto o = static_cast<Opcode>(i);
      if (isa::describe(o).pipe != isa::Pipe::V) continue;
      FieldMap& f = m[i];
      f.type = first_field(o, {"type", "dst_type"});
      f.src_type = first_field(o, {"src_type"});
      f.cmp = first_field(o, {"cmp"});
      f.round = first_field(o, {"round"});
      f.scalar = first_field(o, {"xscalar"});
      f.repeat = first_field(o, {"repeat"});
      f.addr = {first_field(o, {"xdst"}), first_field(o, {"xsrc0", "xsrc"}),
                first_field(o, {"xsrc1"}), first_field(o, {"xsel"})};
      f.blk = {first_field(o, {"dst_blk"}), first_field(o, {"src0_blk", "src_blk"}),
               first_field(o, {"src1_blk"})};
      f.rep = {first_field(o, {"dst_rep"}), first_field(o, {"src0_rep", "src_rep"}),
               first_field(o, {"src1_rep"})};
    }
    return m;
  }();
  return maps[static_cast<size_t>(op)];
}

// Reads operand field i, checking a register-supplied value against the field's range.
uint64_t field_value(const IssuedOp& op, int i) {
  const isa::FieldDesc& f = op.insn->desc().fields[i];
  int64_t v = op[i];
  if (isa::field_is_reg_or_imm(f.kind) && (v < 0 || uint64_t(v) > isa::field_imm_max(f.kind)))
    throw KernelFault(fmt::format("{}: operand {} = {} is outside [0, {}]",
                                  op.insn->desc().mnemonic, f.name, v,
                                  isa::field_imm_max(f.kind)));
  return static_cast<uint64_t>(v);
}

Dtype dtype_field(const IssuedOp& op, int i) {
  int64_t v = op[i];
  if (v < 0 || v >= static_cast<int64_t>(Dtype::NONE))
    throw KernelFault(fmt::format("{}: operand {} = {} is not a data type",
                                  op.insn->desc().mnemonic, op.insn->desc().fields[i].name, v));
  return static_cast<Dtype>(v);
}

std::string type_list(TypeSet s) {
  std::string out;
  for (int t = 0; t < static_cast<int>(Dtype::NONE); ++t)
    if (s & type_bit(static_cast<Dtype>(t)))
      out += (out.empty() ? "" : " ") + std::string(isa::dtype_name(static_cast<Dtype>(t)));
  return out;
}

void require_type(const char* mn, const char* what, Dtype t, TypeSet allowed) {
  if (!(allowed & type_bit(t)))
    throw KernelFault(fmt::format("{}: {} {} is not supported (supported: {})", mn, what,
                                  isa::dtype_name(t), type_list(allowed)));
}

}  // namespace

const char* missing_capability(isa::Opcode op, const ChipConfig& cfg) {
  if (op == Opcode::op_vaddreluconv && !cfg.vector_add_relu_conv) return "vector.add_relu_conv";
  if (op == Opcode::op_vmla && !cfg.vector_multiply_accumulate)
    return "vector.multiply_accumulate";
  return nullptr;
}

// Ascend C's type tables (docs/validation.md "bf16 on the vector unit: what silicon has") give
// the 910B (Atlas A2) bf16 in Cast (bf16 <-> f32) and Duplicate only; Add, Sub, Mul, Div, Max,
// Min, the scalar forms, Exp, Ln, Sqrt, Rsqrt, Reciprocal, Abs, Relu, LeakyRelu, Compare and the
// reductions take half / float (and integers), not bfloat16_t. So bf16 is allowed in vconv
// (Cast) and vdup (Duplicate), and in the instructions that move bits without reading them as
// numbers: vcopy (DataCopy / Copy), vsel and vtranspose (Ascend C kernels run Select and
// Transpose on bf16 data through its 16-bit view, which moves the same bits).
// Without vector.bf16_conversion (the 910 and 310P: no bf16 in their Cast tables) vconv and
// vdup (its fp32 scalar rounded to bf16) refuse bf16 too; vcopy, vsel and vtranspose move bits.
const char* missing_type_capability(isa::Opcode op, isa::Dtype type, const ChipConfig& cfg) {
  if (type != Dtype::BF16) return nullptr;
  if (!cfg.vector_bf16_conversion && (op == Opcode::op_vconv || op == Opcode::op_vdup))
    return "vector.bf16_conversion";
  if (cfg.vector_bf16_arithmetic) return nullptr;
  bool computes = false;
  visit_vector_op(op, [&](auto o) { computes = decltype(o)::computes; });
  return computes ? "vector.bf16_arithmetic" : nullptr;
}

std::string missing_type_message(Dtype type, const char* key, const ChipConfig& cfg) {
  const bool conversion = std::string_view(key) == "vector.bf16_conversion";
  return fmt::format("chip {} has no {} {}on the vector unit ({} is false in {}){}", cfg.name,
                     isa::dtype_name(type), conversion ? "" : "arithmetic ", key,
                     cfg.source_file,
                     conversion ? ": not even conversions" : "; widen to f32 with vconv");
}

bool Lanes::all(int first, int n) const {
  auto range = [](int from, int to) -> uint64_t {  // bits [from, to) of one word, 0..64
    if (to <= from) return 0;
    uint64_t hi_bits = to >= 64 ? ~uint64_t{0} : (uint64_t{1} << to) - 1;
    return hi_bits & ~((uint64_t{1} << from) - 1);
  };
  int end = first + n;
  uint64_t want_lo = range(std::min(first, 64), std::min(end, 64));
  uint64_t want_hi = range(std::max(first, 64) - 64, std::max(end, 64) - 64);
  return (lo & want_lo) == want_lo && (hi & want_hi) == want_hi;
}

int Lanes::count() const { return __builtin_popcountll(lo) + __builtin_popcountll(hi); }

Lanes VecInsn::active(uint64_t r) const {
  Lanes l;
  if (!masked) {
    l.lo = lanes >= 64 ? ~uint64_t{0} : (uint64_t{1} << lanes) - 1;
    l.hi = lanes >= 128 ? ~uint64_t{0} : lanes > 64 ? (uint64_t{1} << (lanes - 64)) - 1 : 0;
    return l;
  }
  if (mask.counter_mode) {
    uint64_t done = r * static_cast<uint64_t>(lanes);
    uint64_t n = mask.count > done ? std::min<uint64_t>(mask.count - done, lanes) : 0;
    l.lo = n >= 64 ? ~uint64_t{0} : (uint64_t{1} << n) - 1;
    l.hi = n >= 128 ? ~uint64_t{0} : n > 64 ? (uint64_t{1} << (n - 64)) - 1 : 0;
    return l;
  }
  l.lo = lanes >= 64 ? mask.lo : mask.lo & ((uint64_t{1} << lanes) - 1);
  l.hi = lanes > 64 ? mask.hi : 0;
  return l;
}

uint64_t VecInsn::bytes_written() const {
  const VecOperand& d = operand[kDst];
  if (d.dense) return repeats * static_cast<uint64_t>(d.bytes_per_repeat);
  uint64_t lanes_written;
  if (!masked) lanes_written = repeats * lanes;
  else if (mask.counter_mode) lanes_written = mask.count;
  else lanes_written = repeats * static_cast<uint64_t>(active(0).count());
  return lanes_written * static_cast<uint64_t>(d.elem_size);
}

VecInsn decode_vector(const IssuedOp& op, const ChipConfig& cfg) {
  VecInsn vi;
  vi.op = op.op();
  vi.mnemonic = op.insn->desc().mnemonic;
  const char* mn = vi.mnemonic;
  if (const char* key = missing_capability(vi.op, cfg))
    throw KernelFault(fmt::format("{}: chip {} does not have this instruction ({} is false in {})",
                                  mn, cfg.name, key, cfg.source_file));
  TypeSet types = 0;
  bool is_vector = visit_vector_op(vi.op, [&](auto o) {
    using Op = decltype(o);
    vi.family = Op::family;
    vi.cost = Op::cost;
    types = Op::types;
  });
  if (!is_vector) throw KernelFault(fmt::format("{} is not a vector instruction", mn));
  const FieldMap& f = field_map(vi.op);

  // Data types and lanes per repeat.
  if (vi.family == Family::kTranspose) {
    vi.type = vi.src_type = Dtype::U16;
  } else {
    vi.type = dtype_field(op, f.type);
    vi.src_type = f.src_type >= 0 ? dtype_field(op, f.src_type) : vi.type;
    bool conv = vi.family == Family::kConvert || vi.family == Family::kBinaryConvert;
    require_type(mn, conv ? "destination type" : "type", vi.type, types);
    if (conv) {
      require_type(mn, "source type", vi.src_type, types);
      if (!vector_pair_ok(vi.op, vi.type, vi.src_type))
        throw KernelFault(fmt::format("{}: {} <- {} is not supported (only f16 <- f32)", mn,
                                      isa::dtype_name(vi.type), isa::dtype_name(vi.src_type)));
      if (isa::dtype_size(vi.type) == 1 && isa::dtype_size(vi.src_type) == 1)
        throw KernelFault(fmt::format(
            "{}: conversion {} -> {} is not supported: two 8-bit types give 256 lanes, more "
            "than the 128-bit mask covers",
            mn, isa::dtype_name(vi.src_type), isa::dtype_name(vi.type)));
    }
  }
  for (Dtype t : {vi.type, vi.src_type})
    if (const char* key = missing_type_capability(vi.op, t, cfg))
      throw KernelFault(fmt::format("{}.{}: {}", mn, isa::dtype_name(t),
                                    missing_type_message(t, key, cfg)));
  const int dst_size = isa::dtype_size(vi.type), src_size = isa::dtype_size(vi.src_type);
  vi.lanes = kRepeatBytes / std::max(dst_size, src_size);
  if (f.cmp >= 0) {
    int64_t c = op[f.cmp];
    if (c < 0 || c > static_cast<int64_t>(isa::Cmp::GE))
      throw KernelFault(fmt::format("{}: operand cmp = {} is not a comparison", mn, c));
    vi.cmp = static_cast<isa::Cmp>(c);
  }
  if (f.round >= 0) {
    auto m = round_mode_from_field(op[f.round]);
    if (!m)
      throw KernelFault(fmt::format("{}: operand round = {} is not a rounding mode (0 rint, 1 "
                                    "floor, 2 ceil, 3 round, 4 trunc)",
                                    mn, op[f.round]));
    vi.round = *m;
  }
  if (f.scalar >= 0) vi.scalar = op[f.scalar];

  // Repeats: the repeat field, or from the element count in counter mode. vtranspose is one
  // 512-byte matrix, accounted as two repeats.
  vi.mask = op.mask;
  if (vi.family == Family::kTranspose) {
    vi.masked = false;
    vi.repeats = kTransposeBytes / kRepeatBytes;
  } else if (op.mask.counter_mode) {
    vi.repeats = ceil_div(op.mask.count, static_cast<uint64_t>(vi.lanes));
  } else {
    vi.repeats = field_value(op, f.repeat);
  }

  // Operands.
  const uint32_t align = [&] {
    auto it = cfg.align_bytes.find(isa::Buf::UB);
    return it == cfg.align_bytes.end() ? 1u : std::max(1u, it->second);
  }();
  auto address = [&](int slot) {
    int i = f.addr[slot];
    int64_t a = op[i];
    const char* name = op.insn->desc().fields[i].name;
    if (a < 0) throw KernelFault(fmt::format("{}: operand {} = {} is a negative ub address", mn,
                                             name, a));
    if (static_cast<uint64_t>(a) % align != 0)
      throw KernelFault(fmt::format("{}: operand {} = {:#x} is not {}-byte aligned (ub)", mn,
                                    name, a, align));
    VecOperand o;
    o.field = name;
    o.addr = static_cast<uint64_t>(a);
    o.write = slot == kDst;
    return o;
  };
  auto strided = [&](int slot, int elem_size) {
    VecOperand o = address(slot);
    o.elem_size = elem_size;
    o.bytes_per_repeat = vi.lanes * elem_size;
    if (vi.family == Family::kTranspose) {
      o.blk_bytes = kBlockBytes;
      o.rep_bytes = kRepeatBytes;
    } else {
      o.blk_bytes = field_value(op, f.blk[slot]) * kBlockBytes;
      o.rep_bytes = field_value(op, f.rep[slot]) * kBlockBytes;
    }
    return o;
  };
  auto dense = [&](int slot, int bytes_per_repeat) {
    VecOperand o = address(slot);
    o.dense = true;
    o.bytes_per_repeat = bytes_per_repeat;
    o.rep_bytes = static_cast<uint64_t>(bytes_per_repeat);
    return o;
  };
  const int bit_row_bytes = vi.lanes / 8;
  auto& opd = vi.operand;
  switch (vi.family) {
    case Family::kBinary:
      opd = {strided(kDst, dst_size), strided(kSrc0, src_size), strided(kSrc1, src_size)};
      vi.num_operands = 3;
      break;
    case Family::kUnary:
    case Family::kScalar:
    case Family::kConvert:
    case Family::kTranspose:
      opd[kDst] = strided(kDst, dst_size);
      opd[kSrc0] = strided(kSrc0, src_size);
      vi.num_operands = 2;
      break;
    case Family::kBinaryConvert:
      opd = {strided(kDst, dst_size), strided(kSrc0, src_size), strided(kSrc1, src_size)};
      vi.num_operands = 3;
      break;
    case Family::kMultiplyAccumulate: {
      // The fourth operand is dst read (the accumulator): a source of the element function and,
      // unless it is src0 or src1 itself, a second access to dst's banks (ub_bank_cycles).
      VecOperand acc = strided(kDst, dst_size);
      acc.write = false;
      opd = {strided(kDst, dst_size), strided(kSrc0, src_size), strided(kSrc1, src_size), acc};
      vi.num_operands = 4;
      break;
    }
    case Family::kCompare:
      opd = {dense(kDst, bit_row_bytes), strided(kSrc0, src_size), strided(kSrc1, src_size)};
      vi.num_operands = 3;
      break;
    case Family::kSelect:
      opd = {strided(kDst, dst_size), strided(kSrc0, src_size), strided(kSrc1, src_size),
             dense(kSel, bit_row_bytes)};
      vi.num_operands = 4;
      break;
    case Family::kReduce:
      opd[kDst] = dense(kDst, dst_size);
      opd[kSrc0] = strided(kSrc0, src_size);
      vi.num_operands = 2;
      break;
    case Family::kDup:
      opd[kDst] = strided(kDst, dst_size);
      vi.num_operands = 1;
      break;
  }
  return vi;
}

void check_vector_bounds(const VecInsn& vi, CoreMemory& local) {
  if (vi.repeats == 0) return;  // touches nothing
  for (int i = 0; i < vi.num_operands; ++i) {
    const VecOperand& o = vi.operand[i];
    // Strides are non-negative, so the first byte of repeat 0 and the last byte of the last
    // block of the last repeat bound every byte touched.
    uint64_t last = o.dense ? o.addr + vi.repeats * o.bytes_per_repeat
                            : o.addr + (vi.repeats - 1) * o.rep_bytes +
                                  (o.blocks_per_repeat() - 1) * o.blk_bytes + kBlockBytes;
    try {
      local.at(isa::Buf::UB, o.addr, last - o.addr);
    } catch (const KernelFault& e) {
      throw KernelFault(fmt::format("{}: operand {} ({} repeats): {}", vi.mnemonic, o.field,
                                    vi.repeats, e.what()));
    }
    local.note_access(isa::Buf::UB, last);
  }
}

namespace {

struct BankCycles {
  uint64_t cycles = 0;          // all repeats, factor included
  uint64_t conflict_cycles = 0;  // the part above the conflict-free time
};

// vmla (kMultiplyAccumulate) whose dst is src0 or src1 (the same address and strides): the
// accumulator's read is that source's (MulAddDst's bank-conflict note, docs/assembly.md: three
// different addresses cannot be read in one cycle, the unit runs at half rate; overlapping ones
// keep the binary ops' rate), so the bank model counts it once.
bool accumulator_is_a_source(const VecInsn& vi) {
  if (vi.family != Family::kMultiplyAccumulate) return false;
  const VecOperand& d = vi.operand[kDst];
  for (int s : {kSrc0, kSrc1}) {
    const VecOperand& o = vi.operand[s];
    if (o.addr == d.addr && o.blk_bytes == d.blk_bytes && o.rep_bytes == d.rep_bytes) return true;
  }
  return false;
}

// UB bank model of the vector unit.
// The UB has cfg.ub_banks banks of cfg.ub_bank_width_bytes; byte a lives in bank
// (a / ub_bank_width_bytes) % ub_banks (a 32-byte block at a: bank (a/32) % 48 on the 910B).
// In one repeat, every block an operand reads or writes (strided: its blocks_per_repeat blocks;
// dense: the block(s) of its bytes for that repeat) is one access to each bank it covers; a bank
// serves one access per cycle. The mask does not change the accesses. A repeat therefore takes
//   factor * max(c, max over banks of accesses to that bank)
// cycles, where c = ceil(256 B / cfg.vector_bytes_per_cycle) is the conflict-free repeat time
// and factor the op's cost factor; what exceeds factor * c is bank-conflict time. Without bank
// parameters (ub_banks or ub_bank_width_bytes 0) there are no conflicts.
// The pattern of repeat r repeats with period P = the smallest P with P * rep_bytes a multiple
// of width * banks for every operand (P <= width * banks), so at most P repeats are evaluated.
BankCycles count_bank_cycles(const VecInsn& vi, uint64_t banks, uint64_t width, uint64_t c,
                             uint64_t factor) {
  BankCycles out;
  const uint64_t span = width * banks;
  uint64_t period = 1;
  for (int i = 0; i < vi.num_operands; ++i)
    period = std::lcm(period, span / std::gcd(vi.operand[i].rep_bytes % span, span));
  const uint64_t evaluated = std::min(vi.repeats, period);
  const uint64_t full_periods = vi.repeats / period, remainder = vi.repeats % period;

  // Access counts per bank: on the stack for the usual bank counts (plan() runs per instruction).
  constexpr uint64_t kStackBanks = 128;
  std::array<uint32_t, kStackBanks> stack_counts;
  std::vector<uint32_t> heap_counts;
  if (banks > kStackBanks) heap_counts.resize(banks);
  uint32_t* const accesses = banks > kStackBanks ? heap_counts.data() : stack_counts.data();
  auto touch = [&](uint64_t a, uint64_t n) {
    for (uint64_t row = a / width; row <= (a + n - 1) / width; ++row) ++accesses[row % banks];
  };
  // The operands whose banks are counted: all but an accumulator read that is a source's.
  const int counted = accumulator_is_a_source(vi) ? kSel : vi.num_operands;
  uint64_t sum_all = 0, sum_remainder = 0;
  for (uint64_t r = 0; r < evaluated; ++r) {
    std::fill(accesses, accesses + banks, 0);
    for (int i = 0; i < counted; ++i) {
      const VecOperand& o = vi.operand[i];
      if (o.dense) {
        touch(o.addr + r * o.rep_bytes, o.bytes_per_repeat);
      } else {
        for (int b = 0; b < o.blocks_per_repeat(); ++b)
          touch(o.addr + r * o.rep_bytes + b * o.blk_bytes, kBlockBytes);
      }
    }
    uint64_t worst = *std::max_element(accesses, accesses + banks);
    uint64_t cycles = factor * std::max<uint64_t>(c, worst);
    sum_all += cycles;
    if (r < remainder) sum_remainder += cycles;
  }
  out.cycles = vi.repeats <= period ? sum_all : full_periods * sum_all + sum_remainder;
  out.conflict_cycles = out.cycles - vi.repeats * factor * c;
  return out;
}

// count_bank_cycles() depends on a UB address only through its bank, (a / width) % banks, so
// on every address and stride modulo span = width * banks; the key holds exactly those, the
// operands' shapes and the repeat count, factor and c. Equal keys give equal results.
struct BankKey {
  static constexpr int kPerOperand = 5;
  std::array<uint64_t, 4 + 4 * kPerOperand> v{};
  bool operator==(const BankKey& o) const { return v == o.v; }
};

BankKey bank_key(const VecInsn& vi, uint64_t span, uint64_t c, uint64_t factor) {
  BankKey k;
  k.v[0] = vi.repeats;
  k.v[1] = factor;
  k.v[2] = c;
  // (the operand count; and whether vmla's accumulator read is a source's, which the addresses
  // modulo the span do not tell)
  k.v[3] = static_cast<uint64_t>(vi.num_operands) | (accumulator_is_a_source(vi) ? 0x100u : 0u);
  for (int i = 0; i < vi.num_operands; ++i) {
    const VecOperand& o = vi.operand[static_cast<size_t>(i)];
    uint64_t* f = &k.v[4 + static_cast<size_t>(i) * BankKey::kPerOperand];
    f[0] = o.addr % span;
    f[1] = o.rep_bytes % span;
    f[2] = o.blk_bytes % span;
    f[3] = static_cast<uint64_t>(o.bytes_per_repeat);
    f[4] = o.dense ? 1 : 0;
  }
  return k;
}

// The UB bank time of the instruction (see count_bank_cycles). A kernel's tile loop issues the
// same few vector geometries over and over (ping/pong buffers at fixed UB addresses), and
// evaluating the bank pattern costs up to a period of repeats, so results are kept in a small
// direct-mapped memo per host thread (plan() also runs on the replay's threads) per chip
// geometry (banks, width).
BankCycles ub_bank_cycles(const VecInsn& vi, const ChipConfig& cfg, uint64_t c, uint64_t factor) {
  const uint64_t banks = cfg.ub_banks > 0 ? static_cast<uint64_t>(cfg.ub_banks) : 0;
  const uint64_t width = cfg.ub_bank_width_bytes > 0 ? cfg.ub_bank_width_bytes : 0;
  if (banks == 0 || width == 0 || vi.repeats == 0) {
    BankCycles out;
    out.cycles = vi.repeats * factor * c;
    return out;
  }
  struct Entry {
    BankKey key;
    BankCycles value;
    uint64_t banks = 0, width = 0;  // 0: empty
  };
  constexpr size_t kEntries = 1024;
  thread_local std::vector<Entry> memo(kEntries);
  const BankKey key = bank_key(vi, width * banks, c, factor);
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (uint64_t x : key.v) h = (h ^ x) * 0xff51afd7ed558ccdull;
  Entry& e = memo[static_cast<size_t>((h ^ (h >> 29)) % kEntries)];
  if (e.banks == banks && e.width == width && e.key == key) return e.value;
  e.value = count_bank_cycles(vi, banks, width, c, factor);
  e.key = key;
  e.banks = banks;
  e.width = width;
  return e.value;
}

}  // namespace

// Cost of a V instruction:
//   cycles = vector_latency_cycles + ub_bank_cycles(...) (factor * c per conflict-free repeat)
// with factor 1 for element-wise ops, vector_transcendental_factor for vdiv vexp vln vsqrt
// vrsqrt vrec and vector_reduce_factor for vcadd vcmax vcmin. A repeat count of 0 costs the
// latency only.
ExecCost vector_cost(const VecInsn& vi, const ChipConfig& cfg) {
  if (cfg.vector_bytes_per_cycle <= 0)
    throw ConfigError(fmt::format("{}: vector_bytes_per_cycle must be positive, got {}",
                                  cfg.source_file, cfg.vector_bytes_per_cycle));
  const uint64_t c = ceil_div(uint64_t{kRepeatBytes}, static_cast<uint64_t>(cfg.vector_bytes_per_cycle));
  uint64_t factor = 1;
  if (vi.cost == CostClass::kTranscendental)
    factor = static_cast<uint64_t>(std::max(1, cfg.vector_transcendental_factor));
  else if (vi.cost == CostClass::kReduce)
    factor = static_cast<uint64_t>(std::max(1, cfg.vector_reduce_factor));
  BankCycles banks = ub_bank_cycles(vi, cfg, c, factor);
  ExecCost cost;
  cost.cycles = static_cast<uint64_t>(std::max(0, cfg.vector_latency_cycles)) + banks.cycles;
  cost.bank_conflict_cycles = banks.conflict_cycles;
  cost.path_src = cost.path_dst = isa::Buf::UB;
  cost.bytes = vi.bytes_written();
  cost.vector_repeats = vi.repeats;
  return cost;
}

}  // namespace npusim::vec
