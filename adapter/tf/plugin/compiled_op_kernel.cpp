#include "adapter/tf/plugin/compiled_op_kernel.h"

#include <algorithm>
#include <cstdlib>

#include "adapter/profiler/op_metrics.h"
#include "adapter/tf/plugin/derived_tensor_cache.h"
#include "adapter/tf/plugin/host_cpu_time.h"
#include "adapter/tf/plugin/plugin_device.h"
#include "adapter/tf/plugin/filter_layout.h"
#include "adapter/tf/plugin/stable_inputs.h"

namespace npusim::tf {

// ---- CompiledOpCache

CompiledOpCache& CompiledOpCache::instance() {
  static CompiledOpCache* cache = new CompiledOpCache();  // lives as long as the device
  return *cache;
}

rt::Status CompiledOpCache::get_or_compile(const compiler::OpDesc& op, const ChipConfig& cfg,
                                           compiler::PrecisionMode precision,
                                           std::shared_ptr<const CompiledOp>* out) {
  const std::string key = compiler::kernel_cache_key(op, cfg, precision);
  std::shared_ptr<Entry> entry;
  {
    std::unique_lock<std::mutex> lock(m_mutex);
    auto it = m_entries.find(key);
    if (it != m_entries.end()) {
      entry = it->second;
      ++m_stats.hits;
      m_compiled.wait(lock, [&] { return entry->done; });
      if (!entry->status.ok()) return entry->status;
      *out = entry->op;
      return rt::ok_status();
    }
    entry = std::make_shared<Entry>();
    m_entries[key] = entry;
    ++m_stats.misses;
  }
  // Compile outside the lock.
  HostCpuScope timed("compile", op.type);
  auto compiled = std::make_shared<CompiledOp>();
  rt::Status st = rt::guard("compiling " + op.str(), [&]() -> rt::Status {
    try {
      compiled->kernel = compiler::compile(op, cfg, precision);
    } catch (const compiler::InvalidOpError& e) {
      return rt::Status(rt::StatusCode::invalid_argument, e.what());  // as TF on any device
    } catch (const compiler::CompileMemoryError& e) {
      return rt::Status(rt::StatusCode::out_of_memory, e.what());
    } catch (const compiler::CompileError& e) {
      return rt::Status(rt::StatusCode::unsupported, e.what());
    }
    for (const compiler::Launch& l : compiled->kernel.launches)
      compiled->programs.push_back(std::make_shared<const isa::Program>(l.kernel.program));
    return rt::ok_status();
  });
  std::lock_guard<std::mutex> lock(m_mutex);
  entry->done = true;
  entry->status = st;
  if (st.ok()) {
    entry->op = compiled;
    *out = compiled;
  } else {
    ++m_stats.failed_compiles;
    m_entries.erase(key);
  }
  m_compiled.notify_all();
  return st;
}

CompiledOpCacheStats CompiledOpCache::stats() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  CompiledOpCacheStats s = m_stats;
  s.entries = 0;
  for (const auto& [key, e] : m_entries) s.entries += e->done && e->status.ok();
  return s;
}

std::vector<std::string> CompiledOpCache::keys() const {
  std::lock_guard<std::mutex> lock(m_mutex);
  std::vector<std::string> k;
  for (const auto& [key, e] : m_entries)
    if (e->done && e->status.ok()) k.push_back(key);
  return k;
}

// ---- CompiledOpKernel

CompiledOpKernel::CompiledOpKernel(OpKernelConstruction* ctx, const std::vector<AttrSpec>& attrs,
                                   std::vector<HostAttrInput> host_attrs)
    : m_type(ctx->type_string()), m_host_attrs(std::move(host_attrs)) {
  if (ctx->HasAttr("_npusim_members") && !ctx->GetAttr("_npusim_members", &m_members).ok())
    m_members.clear();  // only names for reports
  // A forward convolution's filter layout (graph rewrite 19: its filter written blocked by a
  // MultiTensorCast), the compiler's attribute filter_layout (ops/conv.h).
  if (ctx->HasAttr(kFilterLayoutAttr)) {
    std::string layout;
    if (ctx->GetAttr(kFilterLayoutAttr, &layout).ok()) m_attrs["filter_layout"] = layout;
  }
  m_stable_inputs.marked = ctx->HasAttr(kStableInputsAttr);
  if (m_stable_inputs.marked && !ctx->GetAttr(kStableInputsAttr, &m_stable_inputs.positions).ok())
    m_stable_inputs = {};  // only a hint
  for (const AttrSpec& a : attrs) {
    if (!ctx->HasAttr(a.name)) continue;
    rt::Status st;
    switch (a.kind) {
      case AttrSpec::Kind::kType: {
        TF_DataType t;
        st = ctx->GetAttr(a.name, &t);
        if (!st.ok()) break;
        auto dt = from_tf_dtype(t);
        if (!dt) {
          st = rt::Status(rt::StatusCode::invalid_argument,
                          m_type + ": attribute " + a.name + " = " + tf_dtype_name(t) +
                              " cannot live on the NPU");
          break;
        }
        m_attrs[a.name] = std::string(compiler::data_type_name(*dt));
        break;
      }
      case AttrSpec::Kind::kBool: {
        bool v;
        st = ctx->GetAttr(a.name, &v);
        m_attrs[a.name] = v;
        break;
      }
      case AttrSpec::Kind::kInt: {
        int64_t v;
        st = ctx->GetAttr(a.name, &v);
        m_attrs[a.name] = v;
        break;
      }
      case AttrSpec::Kind::kFloat: {
        float v;
        st = ctx->GetAttr(a.name, &v);
        m_attrs[a.name] = static_cast<double>(v);
        break;
      }
      case AttrSpec::Kind::kString: {
        std::string v;
        st = ctx->GetAttr(a.name, &v);
        m_attrs[a.name] = v;
        break;
      }
      case AttrSpec::Kind::kInts: {
        std::vector<int64_t> v;
        st = ctx->GetAttr(a.name, &v);
        m_attrs[a.name] = v;
        break;
      }
      case AttrSpec::Kind::kStrings: {
        std::vector<std::string> v;
        st = ctx->GetAttr(a.name, &v);
        m_attrs[a.name] = v;
        break;
      }
    }
    if (!st.ok()) {
      ctx->CtxFailure(st);
      return;
    }
  }
}

// ---- compiling and launching

// The value of host-memory input `index` as the attribute `kind` describes (HostAttrInput).
rt::Status read_host_attr(const std::string& op_type, const Tensor& t, int index,
                          HostAttrInput::Kind kind, compiler::AttrValue* out) {
  using Kind = HostAttrInput::Kind;
  const std::string what = op_type + ": input " + std::to_string(index);
  const int64_t n = t.NumElements();
  if (kind == Kind::kInts && t.shape().size() > 1)
    return rt::Status(rt::StatusCode::invalid_argument, what + " must have rank <= 1");
  if ((kind == Kind::kInt || kind == Kind::kNumber) && n != 1)
    return rt::Status(rt::StatusCode::invalid_argument,
                      what + " must have one element, has " + std::to_string(n));
  if (kind == Kind::kNumber && t.dtype() == TF_FLOAT) {
    *out = static_cast<double>(*static_cast<const float*>(t.host_data()));
    return rt::ok_status();
  }
  std::vector<int64_t> values;
  if (t.dtype() == TF_INT32) {
    const auto* v = static_cast<const int32_t*>(t.host_data());
    values.assign(v, v + n);
  } else if (t.dtype() == TF_INT64) {
    const auto* v = static_cast<const int64_t*>(t.host_data());
    values.assign(v, v + n);
  } else {
    return rt::Status(rt::StatusCode::invalid_argument,
                      what + " is " + tf_dtype_name(t.dtype()) + ", expected int32 or int64" +
                          (kind == Kind::kNumber ? " or float32" : ""));
  }
  if (kind == Kind::kInt || kind == Kind::kNumber) *out = values[0];
  else *out = std::move(values);
  return rt::ok_status();
}

namespace {

rt::LaunchTensor launch_tensor(const compiler::TensorDesc& t) {
  return {t.shape, msprof_dtype_name(t.dtype)};
}

// The label of launch `l` of a node that merged several members (a multi-tensor
// FusedVariableUpdate, attribute members > 1; LaunchLabel::members): `label` (the node's,
// members = every member's name in order) narrowed to the members `l` computes, those whose
// outputs it writes (member g's outputs are g * M / members ...): their names and tensors
// (variables g * M / members ..., other inputs M + g * N / members ..., outputs as its
// variables); op_name stays the node's. `label` itself for other ops or where the names do not
// match the op.
std::shared_ptr<const rt::LaunchLabel> member_label(
    const std::shared_ptr<const rt::LaunchLabel>& label, const compiler::OpDesc& op,
    const compiler::Launch& l) {
  if (!label || label->members.empty()) return label;
  const int64_t members = op.attr_int("members", 1), m = op.attr_int("M", -1);
  if (members < 2 || m < members || m % members != 0 ||
      label->members.size() != static_cast<size_t>(members) ||
      label->outputs.size() != static_cast<size_t>(m) ||
      label->inputs.size() < static_cast<size_t>(m))
    return label;
  const size_t per_m = static_cast<size_t>(m / members);
  std::vector<int> written;  // the members whose outputs `l` writes, in argument order
  for (const compiler::ArgRef& a : l.args) {
    if (a.kind != compiler::ArgRef::Kind::kOutput || a.index < 0 || a.index >= m) continue;
    const int g = a.index / static_cast<int>(per_m);
    if (std::find(written.begin(), written.end(), g) == written.end()) written.push_back(g);
  }
  if (written.empty()) return label;
  const size_t per_n =
      (label->inputs.size() - static_cast<size_t>(m)) / static_cast<size_t>(members);
  auto out = std::make_shared<rt::LaunchLabel>(*label);
  out->inputs.clear();
  out->outputs.clear();
  out->members.clear();
  for (int g : written) {
    const size_t gs = static_cast<size_t>(g);
    out->members.push_back(label->members[gs]);
    for (size_t j = 0; j < per_m; ++j) out->inputs.push_back(label->inputs[gs * per_m + j]);
    for (size_t k = 0; k < per_n; ++k)
      out->inputs.push_back(label->inputs[static_cast<size_t>(m) + gs * per_n + k]);
    for (size_t j = 0; j < per_m; ++j) out->outputs.push_back(label->outputs[gs * per_m + j]);
  }
  return out;
}

}  // namespace

uint64_t next_dispatch_id() {
  static std::atomic<uint64_t> next_dispatch{1};
  return next_dispatch.fetch_add(1, std::memory_order_relaxed);
}

std::shared_ptr<rt::LaunchLabel> launch_label(const std::string& node, const compiler::OpDesc& op,
                                              const compiler::CompiledKernel& k,
                                              const std::vector<std::string>& members,
                                              const std::string& report_type) {
  auto label = std::make_shared<rt::LaunchLabel>();
  label->op_name = node;
  label->members = members;
  label->op_type = report_type.empty() ? op.type : report_type;
  for (const compiler::TensorDesc& t : op.inputs) label->inputs.push_back(launch_tensor(t));
  for (const compiler::TensorDesc& t : k.outputs) label->outputs.push_back(launch_tensor(t));
  return label;
}

// ---- ReportProfiler

ReportProfiler& ReportProfiler::instance() {
  static ReportProfiler* p = new ReportProfiler();  // attached to the device, which is never closed
  return *p;
}

namespace {

uint64_t env_count(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(v, &end, 10);
  return end && *end == '\0' ? n : fallback;
}

}  // namespace

prof::PipeTraceOptions ReportProfiler::options_from_env() {
  prof::PipeTraceOptions o;
  o.detail_launches = env_count("NPUSIM_TRACE_DETAIL_LAUNCHES", o.detail_launches);
  o.max_events = env_count("NPUSIM_TRACE_MAX_EVENTS", o.max_events);
  return o;
}

rt::Status ReportProfiler::attach_all() {
  const std::vector<std::shared_ptr<rt::Device>> devices = open_devices();
  if (devices.empty()) return rt::ok_status();
  if (m_collectors.size() < devices.size()) m_collectors.resize(devices.size());
  for (size_t k = 0; k < devices.size(); ++k) {
    if (m_collectors[k]) continue;
    auto c = std::make_unique<prof::PipeTraceCollector>(m_opts);
    rt::Status st = devices[k]->add_observer(c.get());
    if (!st.ok()) return st;
    m_collectors[k] = std::move(c);
  }
  return rt::ok_status();
}

rt::Status ReportProfiler::start(const prof::PipeTraceOptions& opts) {
  std::lock_guard<std::mutex> lock(m_mutex);
  m_requested = true;
  m_opts = opts;
  for (auto& c : m_collectors)
    if (c) c->reset(opts);
  if (device_if_open()) return attach_all();
  m_settled = false;  // attach at the devices' first op
  return rt::ok_status();
}

void ReportProfiler::attach_if_requested(rt::Device& /*device*/) {
  if (m_settled.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(m_mutex);
  if (m_settled.load()) return;
  if (!m_requested) {
    const char* dir = std::getenv("NPUSIM_REPORT_DIR");
    if (dir && *dir) {
      m_requested = true;
      m_opts = options_from_env();
    }
  }
  if (m_requested) (void)attach_all();  // a report without instruction detail otherwise
  m_settled.store(true, std::memory_order_release);
}

const prof::PipeTraceCollector* ReportProfiler::collector(int chip) const {
  std::lock_guard<std::mutex> lock(m_mutex);
  if (!m_requested || chip < 0 || static_cast<size_t>(chip) >= m_collectors.size())
    return nullptr;
  return m_collectors[static_cast<size_t>(chip)].get();
}

std::string msprof_dtype_name(compiler::DataType t) {
  if (t == compiler::DataType::BOOL) return "DT_BOOL";
  return prof::msprof_dtype(compiler::device_dtype(t));
}

rt::Status compile_op(const OpKernelContext& ctx, const compiler::OpDesc& op,
                      std::shared_ptr<rt::Device>* device, std::shared_ptr<const CompiledOp>* out) {
  rt::Status st = ctx.npu_device(device);
  if (!st.ok()) return st;
  ReportProfiler::instance().attach_if_requested(**device);
  return CompiledOpCache::instance().get_or_compile(op, (*device)->config(),
                                                    opened_settings().precision, out);
}

bool keep_derived_tensors() {
  static const bool keep = [] {
    const char* v = std::getenv("NPUSIM_KEEP_DERIVED");
    return !(v && std::string(v) == "0");
  }();
  return keep;
}

rt::Status prepare_compiled_op(const std::shared_ptr<rt::Device>& device_ptr,
                               const compiler::OpDesc& op, const CompiledOp& compiled,
                               const std::vector<uint64_t>& input_addrs,
                               const std::vector<uint64_t>& output_addrs, uint64_t workspace_addr,
                               const StableInputs& stable_inputs,
                               const std::shared_ptr<const rt::LaunchLabel>& label,
                               std::vector<std::shared_ptr<const void>>* hold,
                               const DerivedPlacement* placement, std::vector<PreparedLaunch>* out) {
  const compiler::CompiledKernel& k = compiled.kernel;
  // Derived tensors (the precision casts of cube operands) kept across runs where their source
  // is stable (derived_tensor_cache.h); `uses` holds their buffers until the launches are done.
  std::vector<DerivedTensorCache::Use> uses(k.derived.size());
  std::vector<uint64_t> derived_addrs(k.derived.size(), 0);
  std::vector<int> derived_of_launch(k.launches.size(), -1);
  std::vector<char> left_out(k.launches.size(), 0);
  const auto given = [&](bool reuse, size_t d) -> uint64_t {
    if (!placement) return 0;
    const std::vector<uint64_t>& v = reuse ? placement->reuse : placement->fallback;
    return d < v.size() ? v[d] : 0;
  };
  for (size_t d = 0; d < k.derived.size(); ++d) {
    const compiler::DerivedTensor& t = k.derived[d];
    if (const uint64_t at = given(true, d)) {
      derived_addrs[d] = at;
      left_out.at(t.launch) = 1;
      continue;
    }
    if (keep_derived_tensors()) {
      std::vector<rt::DerivedRange> sources;
      bool stable = true;
      for (int i : t.inputs) {
        const uint64_t addr = input_addrs.at(static_cast<size_t>(i));
        const uint64_t bytes = op.inputs.at(static_cast<size_t>(i)).bytes();
        if (addr != 0 && bytes != 0) sources.push_back({addr, bytes});
        stable = stable && stable_inputs.stable(i);
      }
      // An empty source: nothing to keep. A source the graph knows to be rewritten between
      // runs: computed every run, never watched (StableInputs::marked).
      if (sources.size() == t.inputs.size() && (stable || !stable_inputs.marked)) {
        uses[d] = DerivedTensorCache::instance().use(device_ptr, k, d, sources, stable);
        derived_addrs[d] = uses[d].addr;
        derived_of_launch.at(t.launch) = static_cast<int>(d);
      }
    }
    // No buffer of its own (a workspace slice, never left out: may_skip is false): computed
    // where the caller says; the cache still watches its source.
    if (derived_addrs[d] == 0) derived_addrs[d] = given(false, d);
  }
  if (placement && placement->placed) *placement->placed = derived_addrs;
  for (size_t i = 0; i < k.launches.size(); ++i) {
    if (left_out[i]) continue;
    const compiler::Launch& l = k.launches[i];
    PreparedLaunch p;
    p.program = compiled.programs[i];
    p.args = l.bind(input_addrs, output_addrs, workspace_addr, derived_addrs);
    p.block_dim = l.block_dim;
    p.label = member_label(label, op, l);
    if (derived_of_launch[i] >= 0) p.source = uses[static_cast<size_t>(derived_of_launch[i])].source;
    out->push_back(std::move(p));
  }
  for (DerivedTensorCache::Use& u : uses)
    if (u.hold) hold->push_back(std::move(u.hold));
  return rt::ok_status();
}

rt::Status queue_prepared(rt::Device& device, rt::Stream stream,
                          std::vector<PreparedLaunch> launches) {
  for (PreparedLaunch& p : launches) {
    rt::Status st =
        p.source.state
            ? device.launch_derived(stream, std::move(p.program), std::move(p.args), p.block_dim,
                                    std::move(p.label), std::move(p.source))
            : device.launch_kernel(stream, std::move(p.program), std::move(p.args), p.block_dim,
                                   std::move(p.label));
    if (!st.ok()) return st;
  }
  return rt::ok_status();
}

rt::Status queue_compiled_op(const std::shared_ptr<rt::Device>& device_ptr, rt::Stream stream,
                             const compiler::OpDesc& op, const CompiledOp& compiled,
                             const std::vector<uint64_t>& input_addrs,
                             const std::vector<uint64_t>& output_addrs, uint64_t workspace_addr,
                             const StableInputs& stable_inputs,
                             const std::shared_ptr<const rt::LaunchLabel>& label,
                             std::vector<std::shared_ptr<const void>>* hold,
                             const DerivedPlacement* placement) {
  std::vector<PreparedLaunch> launches;
  rt::Status st = prepare_compiled_op(device_ptr, op, compiled, input_addrs, output_addrs,
                                      workspace_addr, stable_inputs, label, hold, placement,
                                      &launches);
  if (!st.ok()) return st;
  return queue_prepared(*device_ptr, stream, std::move(launches));
}

bool keepable_output(const CompiledOp& compiled) {
  const compiler::CompiledKernel& k = compiled.kernel;
  return k.launches.size() == 1 && k.workspace_bytes == 0 && k.outputs.size() == 1 &&
         k.outputs[0].bytes() > 0 && k.derived.empty();
}

rt::Status queue_kept_output_op(const std::shared_ptr<rt::Device>& device, rt::Stream stream,
                                const compiler::OpDesc& op, const CompiledOp& compiled,
                                const std::vector<uint64_t>& input_addrs, uint64_t fallback_output,
                                const std::shared_ptr<const rt::LaunchLabel>& label,
                                std::vector<std::shared_ptr<const void>>* hold,
                                uint64_t* output_addr) {
  *output_addr = fallback_output;
  std::vector<rt::DerivedRange> sources;
  for (size_t i = 0; i < input_addrs.size(); ++i)
    if (input_addrs[i] != 0 && op.inputs.at(i).bytes() != 0)
      sources.push_back({input_addrs[i], op.inputs[i].bytes()});
  if (keep_derived_tensors() && keepable_output(compiled) && !sources.empty() &&
      sources.size() == input_addrs.size()) {
    DerivedTensorCache::Use u =
        DerivedTensorCache::instance().use_output(device, compiled.kernel, sources);
    if (u.addr) {
      *output_addr = u.addr;
      const compiler::Launch& l = compiled.kernel.launches[0];
      rt::Status st =
          device->launch_derived(stream, compiled.programs[0], l.bind(input_addrs, {u.addr}, 0, {}),
                                 l.block_dim, label, u.source);
      hold->push_back(std::move(u.hold));
      return st;
    }
  }
  return queue_compiled_op(device, stream, op, compiled, input_addrs, {fallback_output}, 0, {},
                           label, hold);
}

rt::Status launch_compiled_op(OpKernelContext* ctx, const std::shared_ptr<rt::Device>& device_ptr,
                              const compiler::OpDesc& op, const CompiledOp& compiled,
                              const std::vector<uint64_t>& input_addrs,
                              const std::vector<uint64_t>& output_addrs,
                              const StableInputs& stable_inputs,
                              const std::vector<std::string>& members,
                              const std::string& report_type, uint64_t dispatch) {
  rt::Device& device = *device_ptr;
  const compiler::CompiledKernel& k = compiled.kernel;
  if (k.launches.empty()) return rt::ok_status();  // every output is empty

  Tensor workspace;
  uint64_t workspace_addr = 0;
  if (k.workspace_bytes > 0) {
    rt::Status st = ctx->allocate_temp(TF_UINT8, {static_cast<int64_t>(k.workspace_bytes)},
                                       &workspace);
    if (!st.ok()) return st;
    workspace_addr = workspace.device_address();
  }

  rt::Stream stream;
  rt::Status st = ctx->npu_stream(&stream);
  if (!st.ok()) return st;
  std::shared_ptr<rt::LaunchLabel> label = launch_label(ctx->op_name(), op, k, members, report_type);
  label->dispatch = dispatch != 0 ? dispatch : next_dispatch_id();
  std::vector<std::shared_ptr<const void>> hold;
  st = queue_compiled_op(device_ptr, stream, op, compiled, input_addrs, output_addrs,
                         workspace_addr, stable_inputs, label, &hold);
  // Always wait, also after a failed launch: launches already queued use the inputs, outputs
  // and workspace, which TensorFlow may reuse once Compute returns. (The emulator's wait: a real
  // device's kernel returns at once, so the host clock does not learn the stream's end.)
  rt::Status sync = device.wait_stream_unobserved(stream);
  if (st.ok()) st = sync;
  if (!st.ok()) return rt::Status(st.code(), op.str() + " on the NPU: " + st.message());
  return rt::ok_status();
}

void CompiledOpKernel::Compute(OpKernelContext* ctx) {
  compiler::OpDesc op;
  op.type = m_type;
  op.attrs = m_attrs;
  std::vector<Tensor> inputs(static_cast<size_t>(ctx->num_inputs()));
  std::vector<uint64_t> input_addrs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    NPU_OP_REQUIRES_OK(ctx, ctx->input(static_cast<int>(i), &inputs[i]));
    compiler::TensorDesc d;
    NPU_OP_REQUIRES_OK(ctx, inputs[i].desc(&d));
    op.inputs.push_back(std::move(d));
    input_addrs.push_back(inputs[i].device_address());
  }
  for (const HostAttrInput& h : m_host_attrs) {
    const int index = h.input < 0 ? static_cast<int>(inputs.size()) + h.input : h.input;
    if (index < 0 || index >= static_cast<int>(inputs.size())) continue;
    NPU_OP_REQUIRES_OK(ctx,
                       read_host_attr(m_type, inputs[index], index, h.kind, &op.attrs[h.attr]));
    input_addrs[index] = 0;  // host memory: no kernel on the chip may read it
  }

  std::shared_ptr<rt::Device> device;
  std::shared_ptr<const CompiledOp> compiled;
  NPU_OP_REQUIRES_OK(ctx, compile_op(*ctx, op, &device, &compiled));
  const compiler::CompiledKernel& k = compiled->kernel;
  if (static_cast<int>(k.outputs.size()) != ctx->num_outputs()) {
    ctx->CtxFailure(rt::Status(
        rt::StatusCode::internal, op.str() + ": the compiler gives " +
                                      std::to_string(k.outputs.size()) +
                                      " outputs, TensorFlow expects " +
                                      std::to_string(ctx->num_outputs())));
    return;
  }

  std::vector<Tensor> outputs(k.outputs.size());
  std::vector<uint64_t> output_addrs;
  for (size_t i = 0; i < outputs.size(); ++i) {
    TF_DataType t = to_tf_dtype(k.outputs[i].dtype);
    TF_DataType expected = ctx->expected_output_dtype(static_cast<int>(i));
    if (t != expected) {
      ctx->CtxFailure(rt::Status(rt::StatusCode::internal,
                                 op.str() + ": output " + std::to_string(i) + " compiled as " +
                                     tf_dtype_name(t) + ", TensorFlow expects " +
                                     tf_dtype_name(expected)));
      return;
    }
    NPU_OP_REQUIRES_OK(ctx, ctx->allocate_output(static_cast<int>(i), t, k.outputs[i].shape,
                                                 &outputs[i]));
    output_addrs.push_back(outputs[i].device_address());
  }
  NPU_OP_REQUIRES_OK(ctx, launch_compiled_op(ctx, device, op, *compiled, input_addrs, output_addrs,
                                             m_stable_inputs, m_members));
}

}  // namespace npusim::tf
