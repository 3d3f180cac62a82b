// Static verification of a program against a chip config (contract in verifier.h). Structural
// checks (sections, pipes, buffers, data types, flags, control flow) look at the instructions
// alone; bounds and alignment come from sim/exec's plan() wherever a forward constant
// propagation knows every operand, so the verifier and the simulator cannot disagree on them.
#include "sim/verifier/verifier.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>

#include <fmt/format.h>

#include "common/error.h"
#include "sim/exec/exec.h"
#include "sim/exec/scalar_alu.h"
#include "sim/exec/vector_insn.h"
#include "sim/exec/vector_ops.h"

namespace npusim::isa {
namespace {

bool is_pipe_insn(Pipe p) {
  return p == Pipe::MTE1 || p == Pipe::MTE2 || p == Pipe::MTE3 || p == Pipe::M || p == Pipe::V ||
         p == Pipe::FIX;
}

const Operand& operand(const Instruction& in, const char* name) {
  return in.ops[field_index(in.op, name)];
}

// The buffers an MTE or FIXPIPE instruction moves data between, GM included: the opcode's
// fixed path, or its dst operand for load2d and fixpipe (isa.def comments).
struct DataPath {
  Buf src, dst;
};
std::optional<DataPath> data_path(const Instruction& in) {
  auto dst_operand = [&] { return static_cast<Buf>(operand(in, "dst").value); };
  switch (in.op) {
    case Opcode::op_copy_gm2l1: case Opcode::op_nd2nz: return DataPath{Buf::GM, Buf::L1};
    case Opcode::op_copy_gm2ub: return DataPath{Buf::GM, Buf::UB};
    case Opcode::op_load2d: return DataPath{Buf::L1, dst_operand()};
    case Opcode::op_load3d: case Opcode::op_load3dt: return DataPath{Buf::L1, Buf::L0A};
    case Opcode::op_copy_l12ub: return DataPath{Buf::L1, Buf::UB};
    case Opcode::op_copy_l12bt: return DataPath{Buf::L1, Buf::BT};
    case Opcode::op_fixpipe: return DataPath{Buf::L0C, dst_operand()};
    case Opcode::op_copy_ub2gm: return DataPath{Buf::UB, Buf::GM};
    case Opcode::op_copy_ub2l1: return DataPath{Buf::UB, Buf::L1};
    default: return std::nullopt;
  }
}

std::string type_list(vec::TypeSet set) {
  std::string s;
  for (int t = 0; t < static_cast<int>(Dtype::NONE); ++t)
    if (set & vec::type_bit(static_cast<Dtype>(t)))
      s += (s.empty() ? "" : ", ") + std::string(dtype_name(static_cast<Dtype>(t)));
  return s;
}

// What the constant propagation knows at one point of a section.
struct Known {
  std::array<std::optional<int64_t>, kNumRegs> reg;
  std::optional<VectorMask> mask = VectorMask{};  // a kernel starts with the default mask
  std::optional<FMatrix> fmatrix;
  std::optional<L3dGeom> l3d;
  void forget() {
    reg.fill(std::nullopt);
    mask.reset();
    fmatrix.reset();
    l3d.reset();
  }
  // Value of operand o of a field of kind k: a register's known contents or the immediate.
  std::optional<int64_t> value(const Operand& o, FieldKind k) const {
    if (k == FieldKind::Reg || (field_is_reg_or_imm(k) && o.is_reg)) return reg[o.value];
    return o.value;
  }
};

// The scalar ALU on known values (sim/exec/scalar_alu.h); nullopt for div/rem by zero, which
// faults at run time (the caller reports it).
std::optional<int64_t> fold_alu(Opcode op, int64_t a, int64_t b) {
  if ((op == Opcode::op_div || op == Opcode::op_rem) && b == 0) return std::nullopt;
  return scalar_alu(op, a, b);
}

class SectionCheck {
 public:
  SectionCheck(const Section& s, const ChipConfig& cfg, const CoreKindConfig& core,
               std::vector<VerifyIssue>& out)
      : m_sec(s), m_cfg(cfg), m_core(core), m_out(out) {}

  void run() {
    if (m_sec.code.empty()) {
      m_out.push_back({0, 0, m_sec.kind,
                       fmt::format("section {} is empty (it must end with end or jmp)",
                                   core_kind_name(m_sec.kind))});
      return;
    }
    m_clean.assign(m_sec.code.size(), true);
    for (size_t pc = 0; pc < m_sec.code.size(); ++pc) check_static(pc);
    check_flag_pairs();
    check_unit_flags();
    const Instruction& last = m_sec.code.back();
    if (last.op != Opcode::op_end && last.op != Opcode::op_jmp)
      m_out.push_back(
          {last.src_line, last.src_col, m_sec.kind,
           fmt::format("the last instruction of section {} is {}, not end or jmp: execution "
                       "would run past the end",
                       core_kind_name(m_sec.kind), last.desc().mnemonic)});
    propagate();
  }

 private:
  // Reports a problem of instruction pc, which then is not handed to plan().
  void issue(size_t pc, const std::string& msg) {
    const Instruction& in = m_sec.code[pc];
    m_out.push_back({in.src_line, in.src_col, m_sec.kind, msg});
    m_clean[pc] = false;
  }
  const char* kind_name() const { return core_kind_name(m_core.kind); }
  bool has_pipe(Pipe p) const { return p == Pipe::S || m_core.has(p); }

  void check_static(size_t pc) {
    const Instruction& in = m_sec.code[pc];
    const InstrDesc& d = in.desc();
    if (auto why = illegal_operand(in)) return issue(pc, *why);
    if (d.pipe == Pipe::SYNC || in.op == Opcode::op_pipe_barrier) return check_sync(pc);
    if (!has_pipe(d.pipe))
      return issue(pc, fmt::format("{}: {} cores have no {} pipe", d.mnemonic, kind_name(),
                                   pipe_name(d.pipe)));
    for (size_t i = 0; i < d.fields.size(); ++i)
      if (d.fields[i].kind == FieldKind::Label &&
          static_cast<uint64_t>(in.ops[i].value) >= m_sec.code.size())
        issue(pc, fmt::format("{}: branch target @{} is outside section {} ({} instructions)",
                              d.mnemonic, in.ops[i].value, core_kind_name(m_sec.kind),
                              m_sec.code.size()));
    check_buffers(pc);
    if (m_clean[pc]) check_types(pc);
  }

  void need_buffer(size_t pc, Buf b) {
    if (b != Buf::GM && !m_core.has(b))
      issue(pc, fmt::format("{}: {} cores have no {} buffer", m_sec.code[pc].desc().mnemonic,
                            kind_name(), buf_name(b)));
  }

  void check_buffers(size_t pc) {
    const Instruction& in = m_sec.code[pc];
    const char* mn = in.desc().mnemonic;
    if (auto path = data_path(in)) {
      if (in.op == Opcode::op_load2d && path->dst != Buf::L0A && path->dst != Buf::L0B)
        return issue(pc, fmt::format("{}: dst = {} must be l0a or l0b", mn, buf_name(path->dst)));
      if (in.op == Opcode::op_fixpipe && path->dst != Buf::GM && path->dst != Buf::L1 &&
          path->dst != Buf::UB)
        return issue(pc, fmt::format("{}: dst = {} must be gm, l1 or ub", mn, buf_name(path->dst)));
      const int64_t l2 = in.op == Opcode::op_fixpipe ? operand(in, "l2").value : 0;
      if (path->dst != Buf::GM && l2 > 0 && l2 < kNumL2Hints)
        return issue(pc, fmt::format("{}: L2 policy .{} needs dst = gm (got {})", mn,
                                     l2_hint_name(static_cast<L2Hint>(l2)), buf_name(path->dst)));
      if (!m_cfg.has_path(path->src, path->dst))
        issue(pc, fmt::format("{}: no data path {}->{} on chip {}", mn, buf_name(path->src),
                              buf_name(path->dst), m_cfg.name));
      need_buffer(pc, path->src);
      need_buffer(pc, path->dst);
    } else if (in.op == Opcode::op_mmad) {
      for (Buf b : {Buf::L0A, Buf::L0B, Buf::L0C}) need_buffer(pc, b);
      if (operand(in, "init").value == 2) need_buffer(pc, Buf::BT);
    } else if (in.desc().pipe == Pipe::V) {
      need_buffer(pc, Buf::UB);
    }
  }

  void check_types(size_t pc) {
    const Instruction& in = m_sec.code[pc];
    const InstrDesc& d = in.desc();
    auto type = [&](const char* name) { return static_cast<Dtype>(operand(in, name).value); };
    auto bad_type = [&](const char* field, const std::string& allowed) {
      issue(pc, fmt::format("{}: {} = {} is not supported ({})", d.mnemonic, field,
                            dtype_name(type(field)), allowed));
    };
    auto fractal_type = [&](const char* field) {  // 1-, 2- or 4-byte elements fill a fractal
      int s = dtype_size(type(field));
      if (s != 1 && s != 2 && s != 4) bad_type(field, "a 1-, 2- or 4-byte type");
    };
    if (d.pipe == Pipe::V) {
      if (const char* key = vec::missing_capability(in.op, m_cfg))
        return issue(pc, fmt::format("{} (@{}): chip {} does not have this instruction ({} is "
                                     "false in {})",
                                     d.mnemonic, pc, m_cfg.name, key, m_cfg.source_file));
      for (const FieldDesc& f : d.fields)
        if (f.kind == FieldKind::Dt)
          if (const char* key = vec::missing_type_capability(in.op, type(f.name), m_cfg))
            return issue(pc, fmt::format("{}.{} (@{}): {}", d.mnemonic, dtype_name(type(f.name)),
                                         pc,
                                         vec::missing_type_message(type(f.name), key, m_cfg)));
      // The type sets of the vector unit itself (sim/exec/vector_ops.h).
      bool types_ok = true;
      vec::visit_vector_op(in.op, [&](auto op) {
        for (const FieldDesc& f : d.fields)
          if (f.kind == FieldKind::Dt && !(decltype(op)::types & vec::type_bit(type(f.name)))) {
            bad_type(f.name, type_list(decltype(op)::types));
            types_ok = false;
          }
      });
      if (types_ok && d.fields[0].kind == FieldKind::Dt && d.fields[1].kind == FieldKind::Dt &&
          !vec::vector_pair_ok(in.op, type(d.fields[0].name), type(d.fields[1].name)))
        issue(pc, fmt::format("{}: {} <- {} is not supported (only f16 <- f32)", d.mnemonic,
                              dtype_name(type(d.fields[0].name)),
                              dtype_name(type(d.fields[1].name))));
      return;
    }
    switch (in.op) {
      case Opcode::op_mmad: {
        Dtype t = type("type");
        bool legal = t == Dtype::F16 || t == Dtype::S8 ||
                     (t == Dtype::BF16 && m_cfg.cube_bf16) ||
                     (t == Dtype::F32 && m_cfg.cube_fp32_rate_divisor > 0);
        if (!legal)
          bad_type("type", fmt::format("the cube of chip {} takes f16, s8{}{}", m_cfg.name,
                                       m_cfg.cube_bf16 ? ", bf16" : "",
                                       m_cfg.cube_fp32_rate_divisor > 0 ? ", f32" : ""));
        return;
      }
      case Opcode::op_nd2nz: case Opcode::op_load3d: return fractal_type("type");
      case Opcode::op_load3dt:
        fractal_type("type");
        if (dtype_size(type("type")) != 2) bad_type("type", "load3dt needs a 16-bit type");
        return;
      case Opcode::op_load2d:
        fractal_type("type");
        if (operand(in, "transpose").value != 0 && dtype_size(type("type")) != 2)
          bad_type("type", "transpose needs a 16-bit type");
        return;
      case Opcode::op_fixpipe:
        if (dtype_size(type("src_type")) != 4) bad_type("src_type", "L0C holds f32 or s32");
        fractal_type("dst_type");
        return;
      default: return;
    }
  }

  // set_flag / wait_flag / cc_set / cc_wait / pipe_barrier.
  void check_sync(size_t pc) {
    const Instruction& in = m_sec.code[pc];
    const char* mn = in.desc().mnemonic;
    auto pipe = [&](const char* name) { return static_cast<Pipe>(operand(in, name).value); };
    auto queue = [&](const char* name) {  // a pipe operand that must name an existing queue
      Pipe p = pipe(name);
      if (p == Pipe::ALL)
        issue(pc, fmt::format("{}: {} = all is not a single pipe", mn, name));
      else if (!has_pipe(p))
        issue(pc, fmt::format("{}: {} cores have no {} pipe ({})", mn, kind_name(),
                              pipe_name(p), name));
    };
    int64_t id = in.op == Opcode::op_pipe_barrier ? 0 : operand(in, "id").value;
    switch (in.op) {
      case Opcode::op_pipe_barrier:
        if (pipe("pipe") != Pipe::ALL) queue("pipe");
        return;
      case Opcode::op_set_flag: case Opcode::op_wait_flag:
        queue("src");
        queue("dst");
        if (pipe("src") == pipe("dst"))
          issue(pc, fmt::format("{}: src and dst are both {}", mn, pipe_name(pipe("src"))));
        if (id >= m_cfg.flag_ids)
          issue(pc, fmt::format("{}: flag id {} is not below flag_ids = {} of chip {}", mn, id,
                                m_cfg.flag_ids, m_cfg.name));
        return;
      default:  // cc_set, cc_wait
        if (!m_cfg.split)
          issue(pc, fmt::format("{}: cross-core flags need a split chip; {} is coupled", mn,
                                m_cfg.name));
        queue("pipe");
        if (id >= m_cfg.cross_core_flag_ids)
          issue(pc, fmt::format("{}: cross-core flag id {} is not below cross_core_flag_ids = {} "
                                "of chip {}",
                                mn, id, m_cfg.cross_core_flag_ids, m_cfg.name));
        if (in.op == Opcode::op_cc_set && operand(in, "mode").value > 2)
          issue(pc, fmt::format("{}: mode {} is not 0 (cube cores), 1 (vector pair) or 2 (cube "
                                "with its vector cores)",
                                mn, operand(in, "mode").value));
        return;
    }
  }

  // UnitFlag (isa::UnitFlag): a fixpipe's unit flag is .uf3 or none; a fixpipe .uf3 waits for
  // an mmad chain into its tile, so the section must have an mmad .uf3 before it; an mmad chain
  // with unit flags keeps its tile until a fixpipe .uf3 drains it, so the section must have one
  // after its mmads. Which tile (the L0C address) is a run-time value: a fixpipe whose chain
  // writes elsewhere is a deadlock the simulator reports (AiCore::blocked_waits).
  void check_unit_flags() {
    const int mmad_uf = field_index(Opcode::op_mmad, "unit_flag");
    const int fix_uf = field_index(Opcode::op_fixpipe, "unit_flag");
    const size_t none = m_sec.code.size();
    size_t first_last_mmad = none, last_fixpipe = none;  // an mmad .uf3, a fixpipe .uf3
    for (size_t pc = 0; pc < m_sec.code.size(); ++pc) {
      const Instruction& in = m_sec.code[pc];
      if (in.op == Opcode::op_mmad && in.ops[mmad_uf].value == int64_t(UnitFlag::LAST) &&
          first_last_mmad == none)
        first_last_mmad = pc;
      if (in.op == Opcode::op_fixpipe && in.ops[fix_uf].value == int64_t(UnitFlag::LAST))
        last_fixpipe = pc;
    }
    for (size_t pc = 0; pc < m_sec.code.size(); ++pc) {
      const Instruction& in = m_sec.code[pc];
      if (in.op == Opcode::op_fixpipe) {
        const int64_t uf = in.ops[fix_uf].value;
        if (uf == int64_t(UnitFlag::CHAIN))
          issue(pc, "fixpipe: unit flag .uf2 marks an mmad of a chain; a fixpipe takes .uf3 "
                    "(on) or none");
        else if (uf == int64_t(UnitFlag::LAST) && (first_last_mmad == none || first_last_mmad > pc))
          issue(pc, "fixpipe.uf3: no mmad .uf3 before it in the section: it would wait for an "
                    "mmad chain with unit flags into its L0C tile that never comes");
      } else if (in.op == Opcode::op_mmad && in.ops[mmad_uf].value != 0 &&
                 (last_fixpipe == none || last_fixpipe < pc)) {
        issue(pc, fmt::format("mmad.{}: no fixpipe .uf3 after it in the section drains its L0C "
                              "tile: the tile's next chain would wait forever",
                              unit_flag_name(UnitFlag(in.ops[mmad_uf].value))));
      }
    }
  }

  // Every set_flag (src, dst, id) needs a wait_flag with the same triple in the section, and
  // vice versa: an unmatched set leaves a flag pending, an unmatched wait blocks forever.
  void check_flag_pairs() {
    using Triple = std::tuple<int64_t, int64_t, int64_t>;
    std::set<Triple> sets, waits;
    auto triple = [](const Instruction& in) {
      return Triple{in.ops[0].value, in.ops[1].value, in.ops[2].value};  // src, dst, id
    };
    for (const Instruction& in : m_sec.code) {
      if (in.op == Opcode::op_set_flag) sets.insert(triple(in));
      if (in.op == Opcode::op_wait_flag) waits.insert(triple(in));
    }
    for (size_t pc = 0; pc < m_sec.code.size(); ++pc) {
      const Instruction& in = m_sec.code[pc];
      bool set = in.op == Opcode::op_set_flag;
      if (!set && in.op != Opcode::op_wait_flag) continue;
      const std::set<Triple>& other = set ? waits : sets;
      if (other.count(triple(in))) continue;
      auto [src, dst, id] = triple(in);
      issue(pc, fmt::format("unpaired flag: {} {}, {}, {} has no {} {}, {}, {} in section {}",
                            in.desc().mnemonic, pipe_name(Pipe(src)), pipe_name(Pipe(dst)), id,
                            set ? "wait_flag" : "set_flag", pipe_name(Pipe(src)),
                            pipe_name(Pipe(dst)), id, core_kind_name(m_sec.kind)));
    }
  }

  // Forward constant propagation in program order; knowledge is dropped at every join point
  // (labels and branch targets) and after an unconditional jmp/end.
  void propagate() {
    std::set<uint64_t> joins;
    for (const auto& [name, at] : m_sec.labels) joins.insert(at);
    for (const Instruction& in : m_sec.code)
      for (size_t i = 0; i < in.desc().fields.size(); ++i)
        if (in.desc().fields[i].kind == FieldKind::Label) joins.insert(in.ops[i].value);
    Known k;
    for (size_t pc = 0; pc < m_sec.code.size(); ++pc) {
      const Instruction& in = m_sec.code[pc];
      if (joins.count(pc)) k.forget();
      if (!m_clean[pc]) {
        forget_results(k, in);
        continue;
      }
      if (is_pipe_insn(in.desc().pipe)) check_plan(pc, k);
      else step(k, pc);
      if (in.op == Opcode::op_jmp || in.op == Opcode::op_end) k.forget();
    }
  }

  static void forget_results(Known& k, const Instruction& in) {
    int xd = field_index(in.op, "xd");
    if (xd >= 0 && in.ops[xd].value >= 0 && in.ops[xd].value < kNumRegs)
      k.reg[in.ops[xd].value].reset();
    if (in.op == Opcode::op_set_mask || in.op == Opcode::op_set_mask_count) k.mask.reset();
    if (in.op == Opcode::op_set_fmatrix) k.fmatrix.reset();
    if (in.op == Opcode::op_set_l3d_geom) k.l3d.reset();
  }

  void div_by_zero(size_t pc, const Instruction& in) {
    issue(pc, fmt::format("{}: division by zero (known operands)", in.desc().mnemonic));
  }

  // Effect of a scalar-unit instruction on what is known.
  void step(Known& k, size_t pc) {
    const Instruction& in = m_sec.code[pc];
    const auto& f = in.desc().fields;
    auto val = [&](int i) { return k.value(in.ops[i], f[i].kind); };
    std::optional<int64_t> result;
    switch (in.op) {
      case Opcode::op_movi: case Opcode::op_mov: result = val(1); break;
      case Opcode::op_add: case Opcode::op_sub: case Opcode::op_mul: case Opcode::op_div:
      case Opcode::op_rem: case Opcode::op_and: case Opcode::op_or: case Opcode::op_xor:
      case Opcode::op_shl: case Opcode::op_shr: case Opcode::op_min: case Opcode::op_max:
        if (auto a = val(1), b = val(2); a && b) {
          result = fold_alu(in.op, *a, *b);
          if (!result) div_by_zero(pc, in);
        }
        break;
      case Opcode::op_set_mask:
        if (auto hi = val(0), lo = val(1); hi && lo) {
          VectorMask m;
          m.hi = static_cast<uint64_t>(*hi), m.lo = static_cast<uint64_t>(*lo);
          k.mask = m;
        } else {
          k.mask.reset();
        }
        return;
      case Opcode::op_set_mask_count:
        if (auto n = val(0)) {
          VectorMask m;
          m.counter_mode = true;
          m.count = static_cast<uint64_t>(*n);
          k.mask = m;
        } else {
          k.mask.reset();
        }
        return;
      case Opcode::op_set_fmatrix:
        if (auto h = val(0), w = val(1); h && w)
          k.fmatrix = FMatrix{*h, *w, int(in.ops[2].value), int(in.ops[3].value),
                              int(in.ops[4].value), int(in.ops[5].value)};
        else
          k.fmatrix.reset();
        return;
      case Opcode::op_set_l3d_geom:
        k.l3d = L3dGeom{int(in.ops[0].value), int(in.ops[1].value), int(in.ops[2].value),
                        int(in.ops[3].value), int(in.ops[4].value), int(in.ops[5].value)};
        return;
      default: break;  // ldarg, get_*_id, ld: results unknown
    }
    int xd = field_index(in.op, "xd");
    if (xd >= 0) k.reg[in.ops[xd].value] = result;
  }

  // Operands plan() does not need to know to check what the verifier checks: GM addresses
  // (not checked), pure data (vector scalars, fixpipe scale) and an unused mmad bias address.
  static bool substitutable(const Instruction& in, const char* field) {
    std::string_view name = field;
    if (name == "xscalar" || name == "xscale") return true;
    if (in.op == Opcode::op_mmad && name == "xbias") return operand(in, "init").value != 2;
    auto path = data_path(in);
    return path && ((path->src == Buf::GM && name == "xsrc") ||
                    (path->dst == Buf::GM && name == "xdst"));
  }

  void check_plan(size_t pc, const Known& k) {
    const Instruction& in = m_sec.code[pc];
    const auto& f = in.desc().fields;
    IssuedOp op;
    op.insn = &in;
    op.pc = static_cast<uint32_t>(pc);
    for (size_t i = 0; i < f.size(); ++i) {
      std::optional<int64_t> v = k.value(in.ops[i], f[i].kind);
      if (!v && !substitutable(in, f[i].name)) return;  // not known: cannot check
      op.v[i] = v.value_or(0);  // 0: an aligned address in device memory (DeviceMemory below)
    }
    if (in.desc().pipe == Pipe::V) {
      if (!k.mask) return;
      op.mask = *k.mask;
    }
    if (in.op == Opcode::op_load3d || in.op == Opcode::op_load3dt) {
      if (!k.fmatrix || !k.l3d) return;
      op.fmatrix = *k.fmatrix;
      op.l3d = *k.l3d;
    }
    if (!m_local) m_local.emplace(m_core);
    ExecContext ctx{m_cfg, m_core, *m_local, m_gm};
    try {
      plan(op, ctx);
    } catch (const KernelFault& e) {
      // Families still being written throw "... not implemented ..."; nothing to check yet.
      if (std::string_view(e.what()).find("not implemented") != std::string_view::npos) return;
      issue(pc, e.what());
    } catch (const ConfigError& e) {
      issue(pc, e.what());
    }
  }

  const Section& m_sec;
  const ChipConfig& m_cfg;
  const CoreKindConfig& m_core;
  std::vector<VerifyIssue>& m_out;
  std::vector<bool> m_clean;  // no structural issue: safe to hand to plan()
  std::optional<CoreMemory> m_local;
  // GM is not checked: the largest device memory, so any GM range plan() sees on a chip is in
  // bounds (its directory costs nothing until written, and it never is).
  DeviceMemory m_gm{DeviceMemory::kMaxCapacity};
};

const CoreKindConfig* section_core(const Section& s, const ChipConfig& cfg,
                                   std::vector<VerifyIssue>& out) {
  auto where = [&](const std::string& msg) {
    uint32_t line = s.code.empty() ? 0 : s.code[0].src_line;
    uint32_t col = s.code.empty() ? 0 : s.code[0].src_col;
    out.push_back({line, col, s.kind, msg});
  };
  if (!cfg.split) {
    const CoreKindConfig* core = cfg.core_kinds.empty() ? nullptr : &cfg.core_kinds[0];
    if (!core) where(fmt::format("chip {} has no cores", cfg.name));
    return core;
  }
  if (s.kind == CoreKind::AICORE) {
    where(fmt::format("section aicore cannot run on split chip {}: use .section aic (cube) "
                      "and/or .section aiv (vector)",
                      cfg.name));
    return nullptr;
  }
  const CoreKindConfig* core = cfg.core_kind(s.kind);
  if (!core || core->count == 0) {
    where(fmt::format("chip {} has no {} cores", cfg.name, core_kind_name(s.kind)));
    return nullptr;
  }
  return core;
}

}  // namespace

std::vector<VerifyIssue> verify(const Program& p, const ChipConfig& cfg) {
  std::vector<VerifyIssue> out;
  if (p.sections.empty()) out.push_back({0, 0, CoreKind::AICORE, "the program has no sections"});
  if (!cfg.split && p.sections.size() > 1) {
    const Section& extra = p.sections[1];
    uint32_t line = extra.code.empty() ? 0 : extra.code[0].src_line;
    uint32_t col = extra.code.empty() ? 0 : extra.code[0].src_col;
    out.push_back({line, col, extra.kind,
                   fmt::format("coupled chip {} runs exactly one section; this program has {}",
                               cfg.name, p.sections.size())});
  }
  for (const Section& s : p.sections) {
    size_t first = out.size();
    if (const CoreKindConfig* core = section_core(s, cfg, out))
      SectionCheck(s, cfg, *core, out).run();
    std::stable_sort(out.begin() + first, out.end(), [](const auto& a, const auto& b) {
      return std::tie(a.line, a.col) < std::tie(b.line, b.col);
    });
  }
  return out;
}

void verify_or_throw(const Program& p, const ChipConfig& cfg) {
  std::vector<VerifyIssue> issues = verify(p, cfg);
  if (issues.empty()) return;
  std::string msg;
  for (const VerifyIssue& i : issues)
    msg += fmt::format("{}{}:{}:{}: {}: {}", msg.empty() ? "" : "\n", p.source, i.line, i.col,
                       core_kind_name(i.section), i.message);
  throw IsaError(msg);
}

}  // namespace npusim::isa
