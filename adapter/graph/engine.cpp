#include "adapter/graph/engine.h"

#include <fmt/format.h>

#include <climits>
#include <cstring>
#include <map>
#include <set>

#include "adapter/compiler/ops/registry.h"
#include "adapter/graph/memory_plan.h"
#include "adapter/graph/passes.h"
#include "isa/kernel_file.h"

namespace npusim::graph {
namespace {

using compiler::CompiledKernel;
using compiler::TensorDesc;
using nlohmann::json;

const std::set<std::string> kViewOps = {"Identity", "Snapshot", "StopGradient", "PreventGradient",
                                        "Reshape",  "Squeeze",  "ExpandDims",   "EnsureShape"};

// Where a tensor's bytes live: a constant-region offset or an activation buffer of the plan.
struct Loc {
  Region region = Region::kActivation;
  int buffer = -1;      // kActivation: index into the planned buffers
  uint64_t offset = 0;  // kConstant: offset in the constant region
};

// Launch arguments are bound to virtual addresses (region tag in the top bits) and then split
// into region and offset: Launch::bind adds offsets inside tensors and workspaces to them.
constexpr int kTagShift = 60;
constexpr uint64_t kOffsetMask = (uint64_t{1} << kTagShift) - 1;

struct CompiledNode {
  int node = 0;
  int step = 0;
  CompiledKernel kernel;
  std::vector<Loc> inputs, outputs;
  int workspace = -1;          // planned buffer, -1: none
  std::vector<uint64_t> kept;  // per derived tensor: constant-region offset, or 0 (not kept)
  size_t init_launches = 0;    // launches [0, init_launches) also run once at load
};

// The values of a constant as integers (int32/int64) or, for kNumber, one float.
compiler::AttrValue host_attr(const Node& c, compiler::ops::HostAttrInput::Kind kind) {
  using K = compiler::ops::HostAttrInput::Kind;
  const TensorDesc& t = c.outputs[0];
  std::vector<int64_t> ints;
  if (t.dtype == compiler::DataType::S32 || t.dtype == compiler::DataType::S64) {
    const int w = compiler::data_type_bytes(t.dtype);
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      int64_t v = 0;
      if (w == 4) {
        int32_t v32;
        std::memcpy(&v32, c.value.data() + i * 4, 4);
        v = v32;
      } else {
        std::memcpy(&v, c.value.data() + i * 8, 8);
      }
      ints.push_back(v);
    }
  } else if (kind == K::kNumber && t.dtype == compiler::DataType::F32 && t.num_elements() == 1) {
    float f;
    std::memcpy(&f, c.value.data(), 4);
    return double(f);
  } else {
    throw compiler::CompileError(
        fmt::format("constant '{}' is {}: int32/int64 expected", c.name, t.str()));
  }
  if (kind == K::kInts && t.shape.size() > 1)
    throw compiler::CompileError(fmt::format("constant '{}' has rank {}", c.name, t.shape.size()));
  if (kind == K::kInts || kind == K::kFlatInts) return ints;
  if (ints.size() != 1)
    throw compiler::CompileError(
        fmt::format("constant '{}' has {} elements, 1 expected", c.name, ints.size()));
  return ints[0];
}

class Lowering {
 public:
  Lowering(Graph& g, const ChipConfig& cfg, const EngineOptions& opts)
      : m_g(g), m_cfg(cfg), m_opts(opts) {}

  OmModel run(std::vector<FusionRecord> fusions) {
    m_model.chip_name = m_cfg.name;
    m_model.chip_yaml = dump_chip_config_yaml(m_cfg);
    m_model.precision = compiler::precision_mode_name(m_opts.precision);
    for (const GraphIo& in : m_g.inputs) place_input(in);
    for (size_t i = 0; i < m_g.nodes.size(); ++i) lower_node(int(i));
    if (!m_errors.empty()) throw UnmappableOpsError(unmappable_message());
    for (const GraphIo& out : m_g.outputs) {
      const Loc& l = loc(out.tensor);
      if (l.region == Region::kActivation) m_buffers[l.buffer].last = INT_MAX;
    }
    m_model.activation_bytes = plan_memory(m_buffers);
    for (const CompiledNode& c : m_nodes) emit_tasks(c);
    for (const GraphIo& in : m_g.inputs) m_model.inputs.push_back(binding(in));
    for (const GraphIo& out : m_g.outputs) m_model.outputs.push_back(binding(out));
    m_model.info = info(fusions);
    return std::move(m_model);
  }

 private:
  Graph& m_g;
  const ChipConfig& m_cfg;
  EngineOptions m_opts;
  OmModel m_model;
  std::map<TensorRef, Loc> m_locs;
  std::map<int, uint64_t> m_const_offsets;  // Const node -> constant-region offset
  std::vector<PlannedBuffer> m_buffers;
  std::vector<CompiledNode> m_nodes;
  std::map<std::vector<uint8_t>, int> m_kernel_index;  // .npuk bytes -> kernel
  std::vector<std::string> m_errors;
  int m_steps = 0;

  std::string tensor_name(const TensorRef& t) const {
    return fmt::format("{}:{}", m_g.nodes[t.node].name, t.port);
  }

  int add_buffer(const std::string& what, uint64_t bytes, int step) {
    m_buffers.push_back({what, compiler::device_buffer_bytes(bytes), step, step, 0});
    return int(m_buffers.size()) - 1;
  }

  uint64_t reserve_constant(const std::vector<uint8_t>& bytes) {
    const uint64_t offset = m_model.constants.size();
    const uint64_t size = compiler::device_buffer_bytes(bytes.size());
    m_model.constants.resize((offset + size + kPlanAlign - 1) / kPlanAlign * kPlanAlign, 0);
    std::copy(bytes.begin(), bytes.end(), m_model.constants.begin() + long(offset));
    return offset;
  }

  const Loc& loc(const TensorRef& t) {
    auto it = m_locs.find(t);
    if (it != m_locs.end()) return it->second;
    const Node& n = m_g.nodes[t.node];
    if (n.op != "Const")
      throw Error(fmt::format("tensor {} is used before it is computed", tensor_name(t)));
    Loc l;
    l.region = Region::kConstant;
    auto [c, added] = m_const_offsets.emplace(t.node, 0);
    if (added) c->second = reserve_constant(n.value);
    l.offset = c->second;
    return m_locs[t] = l;
  }

  void place_input(const GraphIo& in) {
    Loc l;
    l.buffer = add_buffer(in.name, m_g.desc(in.tensor).bytes(), 0);
    m_locs[in.tensor] = l;
  }

  // A read at step s keeps an activation buffer alive until s.
  const Loc& read(const TensorRef& t, int step) {
    const Loc& l = loc(t);
    if (l.region == Region::kActivation)
      m_buffers[l.buffer].last = std::max(m_buffers[l.buffer].last, step);
    return l;
  }

  // Compiles every node, also those downstream of an unmappable one (shapes are static), so
  // that the error lists every unmappable node; only nodes whose inputs all exist get buffers.
  void lower_node(int i) {
    const Node& n = m_g.nodes[i];
    if (n.dead || n.op == "Const" || n.op == "Placeholder" || n.op == "NoOp") return;
    bool inputs_exist = true;
    for (const TensorRef& t : n.inputs) inputs_exist &= m_locs.count(t) || m_g.is_const(t);
    if (kViewOps.count(n.op)) return lower_view(i, inputs_exist);
    try {
      CompiledKernel k = compiler::compile(op_desc(n), m_cfg, m_opts.precision);
      if (inputs_exist) place_node(i, std::move(k));
    } catch (const compiler::CompileError& e) {
      std::string why = e.what();
      why = why.substr(0, why.find(" (supported: "));  // listed once, in the message's last line
      m_errors.push_back(fmt::format("  {} ({}): {}", n.name, n.op, why));
    }
  }

  void lower_view(int i, bool input_exists) {
    const Node& n = m_g.nodes[i];
    if (n.inputs.empty() || n.outputs.size() != 1 ||
        m_g.desc(n.inputs[0]).bytes() != n.outputs[0].bytes()) {
      m_errors.push_back(fmt::format("  {} ({}): not a view of its first input", n.name, n.op));
      return;
    }
    if (input_exists) m_locs[{i, 0}] = loc(n.inputs[0]);
  }

  compiler::OpDesc op_desc(const Node& n) const {
    compiler::OpDesc d;
    d.type = n.op;
    d.attrs = n.attrs;
    for (const TensorRef& t : n.inputs) d.inputs.push_back(m_g.desc(t));
    d.outputs = n.outputs;
    for (const auto& e : compiler::ops::op_table()) {
      if (n.op != e.tf_op) continue;
      for (const auto& h : e.tf.host_inputs) {
        const int at = h.input < 0 ? int(n.inputs.size()) + h.input : h.input;
        if (at < 0 || size_t(at) >= n.inputs.size()) continue;
        if (!m_g.is_const(n.inputs[at]))
          d.fail(fmt::format("input {} ({}) must be a constant", at, h.tf_arg));
        d.attrs[h.attr] = host_attr(m_g.nodes[n.inputs[at].node], h.kind);
      }
    }
    return d;
  }

  void place_node(int i, CompiledKernel k) {
    const Node& n = m_g.nodes[i];
    CompiledNode c;
    c.node = i;
    c.step = m_steps++;
    c.kernel = std::move(k);
    for (const TensorRef& t : n.inputs) c.inputs.push_back(read(t, c.step));
    for (size_t p = 0; p < c.kernel.outputs.size(); ++p) {
      Loc l;
      l.buffer = add_buffer(tensor_name({i, int(p)}), c.kernel.outputs[p].bytes(), c.step);
      c.outputs.push_back(m_locs[{i, int(p)}] = l);
    }
    if (c.kernel.workspace_bytes)
      c.workspace = add_buffer(n.name + " workspace", c.kernel.workspace_bytes, c.step);
    keep_constant_derived(n, c);
    m_nodes.push_back(std::move(c));
  }

  // Derived tensors computed from constants alone get a constant-region slot; their launches
  // (and the launches before them) run once at load, the per-inference list leaves them out.
  void keep_constant_derived(const Node& n, CompiledNode& c) {
    c.kept.assign(c.kernel.derived.size(), 0);
    for (size_t d = 0; d < c.kernel.derived.size(); ++d) {
      const compiler::DerivedTensor& dt = c.kernel.derived[d];
      bool constant = true;
      for (int in : dt.inputs) constant &= m_g.is_const(n.inputs.at(in));
      if (!constant) continue;
      c.kept[d] = reserve_constant(std::vector<uint8_t>(dt.bytes, 0));
      c.init_launches = std::max(c.init_launches, dt.launch + 1);
    }
  }

  uint64_t vaddr(const Loc& l) const {
    const uint64_t offset = l.region == Region::kConstant ? l.offset : m_buffers[l.buffer].offset;
    return (uint64_t(l.region) + 1) << kTagShift | offset;
  }

  int kernel_index(const isa::Program& p) {
    auto [it, added] = m_kernel_index.emplace(isa::write_kernel(p), int(m_model.kernels.size()));
    if (added) m_model.kernels.push_back(p);
    return it->second;
  }

  Task task(const CompiledNode& c, size_t launch) {
    const Node& n = m_g.nodes[c.node];
    const compiler::Launch& l = c.kernel.launches[launch];
    std::vector<uint64_t> in, out, derived;
    for (const Loc& x : c.inputs) in.push_back(vaddr(x));
    for (const Loc& x : c.outputs) out.push_back(vaddr(x));
    for (uint64_t k : c.kept) derived.push_back(k ? vaddr({Region::kConstant, -1, k}) : 0);
    const uint64_t ws = c.workspace >= 0 ? vaddr({Region::kActivation, c.workspace, 0}) : 0;
    const std::vector<uint64_t> values = l.bind(in, out, ws, derived);
    Task t;
    t.node = n.name;
    t.op_type = n.op;
    t.kernel = kernel_index(l.kernel.program);
    t.block_dim = l.block_dim;
    for (size_t a = 0; a < values.size(); ++a) {
      ArgValue v;
      v.scalar = l.args[a].kind == compiler::ArgRef::Kind::kScalar;
      v.value = v.scalar ? values[a] : values[a] & kOffsetMask;
      if (!v.scalar) v.region = Region((values[a] >> kTagShift) - 1);
      t.args.push_back(v);
    }
    for (const TensorRef& x : n.inputs) t.inputs.push_back(m_g.desc(x));
    t.outputs = c.kernel.outputs;
    t.buffers = task_buffers(c);
    return t;
  }

  // The planned buffers node c's launches touch (Task::buffers), each once.
  std::vector<TaskBuffer> task_buffers(const CompiledNode& c) const {
    std::vector<TaskBuffer> buffers;
    // A buffer both read and written (an input updated in place) is written.
    const auto add = [&](Region region, uint64_t offset, uint64_t bytes, bool written = false) {
      for (TaskBuffer& b : buffers)
        if (b.region == region && b.offset == offset) {
          b.written = b.written || written;
          return;
        }
      buffers.push_back({region, offset, bytes, written});
    };
    const auto add_activation = [&](int buffer, bool written = false) {
      add(Region::kActivation, m_buffers[buffer].offset, m_buffers[buffer].bytes, written);
    };
    const Node& n = m_g.nodes[c.node];
    for (size_t i = 0; i < c.inputs.size(); ++i)
      if (c.inputs[i].region == Region::kConstant)
        add(Region::kConstant, c.inputs[i].offset,
            compiler::device_buffer_bytes(m_g.desc(n.inputs[i]).bytes()));
      else
        add_activation(c.inputs[i].buffer);
    for (const Loc& l : c.outputs) add_activation(l.buffer, true);
    if (c.workspace >= 0) add_activation(c.workspace, true);
    for (size_t d = 0; d < c.kept.size(); ++d)
      if (c.kept[d])
        add(Region::kConstant, c.kept[d], compiler::device_buffer_bytes(c.kernel.derived[d].bytes));
    return buffers;
  }

  void emit_tasks(const CompiledNode& c) {
    std::set<size_t> kept_launches;
    for (size_t d = 0; d < c.kept.size(); ++d)
      if (c.kept[d]) kept_launches.insert(c.kernel.derived[d].launch);
    for (size_t l = 0; l < c.kernel.launches.size(); ++l) {
      if (l < c.init_launches) m_model.init_tasks.push_back(task(c, l));
      if (!kept_launches.count(l)) m_model.tasks.push_back(task(c, l));
    }
  }

  IoBinding binding(const GraphIo& io) {
    const Loc& l = loc(io.tensor);
    const uint64_t offset = l.region == Region::kConstant ? l.offset : m_buffers[l.buffer].offset;
    return {io.name, m_g.desc(io.tensor), l.region, offset};
  }

  std::string unmappable_message() const {
    return fmt::format(
        "{} node(s) cannot be mapped to chip {} (an offline model has no CPU "
        "fallback):\n{}",
        m_errors.size(), m_cfg.name, fmt::join(m_errors, "\n"));
  }

  json info(const std::vector<FusionRecord>& fusions) const {
    json f = json::array(), nodes = json::array(), bufs = json::array();
    for (const FusionRecord& r : fusions)
      f.push_back({{"pattern", r.pattern}, {"node", r.node}, {"absorbed", r.absorbed}});
    for (const CompiledNode& c : m_nodes) {
      const Node& n = m_g.nodes[c.node];
      json launches = json::array();
      for (const auto& l : c.kernel.launches)
        launches.push_back({{"kernel", l.kernel.program.name},
                            {"block_dim", l.block_dim},
                            {"summary", l.summary}});
      nodes.push_back({{"name", n.name},
                       {"op", n.op},
                       {"fused", n.fused},
                       {"launches", launches},
                       {"init_launches", c.init_launches}});
    }
    uint64_t unplanned = 0;
    for (const PlannedBuffer& b : m_buffers) {
      unplanned += (b.bytes + kPlanAlign - 1) / kPlanAlign * kPlanAlign;
      bufs.push_back({{"tensor", b.what},
                      {"offset", b.offset},
                      {"bytes", b.bytes},
                      {"first_step", b.first},
                      {"last_step", b.last == INT_MAX ? -1 : b.last}});
    }
    return {{"fusions", f},
            {"nodes", nodes},
            {"memory",
             {{"activation_peak_bytes", m_model.activation_bytes},
              {"activation_bytes_without_reuse", unplanned},
              {"constant_bytes", m_model.constants.size()},
              {"buffers", bufs}}}};
  }
};

}  // namespace

OmModel compile_graph(Graph g, const ChipConfig& cfg, const EngineOptions& opts) {
  std::vector<FusionRecord> fusions;
  if (opts.fusion) fusions = run_fusion_passes(g, opts.precision);
  return Lowering(g, cfg, opts).run(std::move(fusions));
}

}  // namespace npusim::graph
