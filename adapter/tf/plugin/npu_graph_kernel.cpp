// The NpuGraph op (npu_graph.h): its definition and NPU kernel.
//
// Compute(ctx):
//   1. the plan for the inputs' dtypes and shapes (built on the first run with that signature,
//      then kept): every node's OpDesc (its attributes, its inputs' descriptions: the graph's
//      inputs, earlier nodes' compiled outputs, host constants), compiled through the plugin's
//      CompiledOpCache (compile_op, as node by node); each node output that is no output of the
//      graph, and each node's workspace, a buffer of the static memory plan
//      (adapter/graph/memory_plan.h: live from the step writing it to the last step reading it,
//      placed greedy by size with reuse);
//   2. the outputs allocated by TensorFlow, the plan's arena as one temporary;
//   3. every launch of every node queued on the op's stream (queue_compiled_op), each labelled
//      with its node's name and op type and a dispatch id per node (reports show the nodes as
//      node by node); all share one LaunchLabel::graph_run id, and the run pays the chip's
//      host.graph_dispatch_us once (LaunchLabel::HostDispatch::graph, then none);
//      (an AI CPU step whose inputs are the graph's queued first: Plan::queue_order);
//      with NPUSIM_GRAPH_CONCURRENT=1 as one rt::Device::launch_group whose launches wait for
//      the launches they depend on (Plan::stream_order, Plan::waits, schedule_streams), split
//      only where a step must be queued alone;
//   4. one synchronisation of the stream; a fault is this op's error, naming the node whose
//      kernel faulted (the runtime names it for graph launches).
// With variable updates (npu_graph.h): before 1 the variables are locked (GraphVariables) and
// their tensors' descriptions join the signature; before 3 a new buffer is allocated per
// variable, where its update step writes; after 4, if every launch ran, the new buffers become
// the variables' tensors; the locks are released when Compute returns.
// A compile error is the op's error naming the node (as node by node: TF_UNIMPLEMENTED for an
// unsupported shape or attribute).
// A DropOutGenMask node (gen_mask_task.h) is an AI CPU step of the task list: queued in order
// with the launches (Device::ai_cpu_task_async), reading key and counter where the run holds
// them when the task runs, its mask pending until the task ends (its readers' launches wait for
// it, the other launches do not). TensorFlow's uint64 key and counter enter the set as the
// compiler's s64 (same 8 bytes), allowed for inputs only DropOutGenMask steps read.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "tensorflow/c/ops.h"

#include "adapter/compiler/ops/conv.h"
#include "adapter/graph/memory_plan.h"
#include "adapter/graph/step_groups.h"
#include "adapter/tf/plugin/compiled_op_kernel.h"
#include "adapter/tf/plugin/compiled_op_table.h"
#include "adapter/tf/plugin/dense_update.h"
#include "adapter/tf/plugin/gen_mask_task.h"
#include "adapter/tf/plugin/host_cpu_time.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/npu_graph.h"
#include "adapter/tf/plugin/op_defs.h"
#include "adapter/tf/plugin/plugin_device.h"
#include "adapter/tf/plugin/stable_inputs.h"
#include "sim/config/core_taker.h"

namespace npusim::tf {
namespace {

bool g_registered = false;

// Where a tensor of a step lives in a run.
struct Place {
  // none: address 0; variable: a variable's tensor; new_value: the new buffer of a variable;
  // kept: the output of a kept step (Step::kept), where that step put it in this run.
  enum class Kind { none, input, output, arena, variable, new_value, kept } kind = Kind::none;
  uint64_t index = 0;   // input, output, variable or kept index, or arena offset
  uint64_t offset = 0;  // bytes into it (a slice read in place, a piece of a concatenation)
  // arena: the bytes of the planned buffer at arena offset `index` (rt::LaunchLabel::
  // planned_blocks); 0 otherwise.
  uint64_t extent = 0;
};

struct Step {
  compiler::OpDesc op;
  std::shared_ptr<const CompiledOp> compiled;
  std::vector<Place> inputs, outputs;
  Place workspace;
  // Per derived tensor of the compiled op (the casts of cube operands): where it is computed if
  // a later step reads it too (an arena buffer; none: as node by node), and the (step, derived
  // tensor) that computed it already in this run (-1: none), whose launch is then left out.
  std::vector<Place> derived_at;
  std::vector<std::pair<int, int>> derived_from;
  StableInputs stable_inputs;                    // inputs fed by stable inputs of the graph
  std::shared_ptr<const rt::LaunchLabel> label;  // dispatch set per run
  // A slice whose outputs the plan placed in its input, or a concatenation whose inputs' steps
  // write their pieces into its output (place_in_place): nothing to launch.
  bool in_place = false;
  // >= 0: a Cast of stable inputs of the graph alone (a variable's value cast for a float16
  // reader, mixed_precision.h), its output kept across runs (queue_kept_output_op): the index
  // of Plan::kept_fallback, and of the Place::Kind::kept places reading that output.
  int kept = -1;
  // An AI CPU step (a DropOutGenMask node): no launches; queued with queue_gen_mask, its inputs
  // (shape, key, counter, alg: the key's and counter's places) and output (the mask) as a
  // compiled step's. Attributes and element count here; the addresses are set per run.
  std::optional<GenMaskTask> gen_mask;
  // Queued ahead of every other step of the run (Plan::queue_order): an AI CPU step whose key and
  // counter are inputs of the graph, so nothing of the run comes before it.
  bool ahead = false;
};

// The arena buffers step `n` of `steps` touches in a run whose arena is at `arena_addr`: each
// [start, start + bytes) once (rt::LaunchLabel::planned_blocks). Besides its own places, the
// buffer of each derived tensor it reads where an earlier step computed it (Step::derived_from;
// `reuse`: DerivedPlacement::reuse of this run, the address it is read at) when that address is
// the earlier step's arena buffer (not a buffer the derived-tensor cache kept). Left out, the
// launch's argument would lie in the arena outside every buffer listed, so the cold L2 would
// file it by the whole arena, not by its buffer, as the tensor of a launch of its own.
std::vector<std::pair<uint64_t, uint64_t>> planned_blocks(const std::vector<Step>& steps, size_t n,
                                                          const std::vector<uint64_t>& reuse,
                                                          uint64_t arena_addr) {
  const Step& s = steps[n];
  std::vector<std::pair<uint64_t, uint64_t>> blocks;
  const auto add = [&](const Place& p) {
    if (p.kind != Place::Kind::arena || p.extent == 0) return;
    const std::pair<uint64_t, uint64_t> b{arena_addr + p.index, p.extent};
    if (std::find(blocks.begin(), blocks.end(), b) == blocks.end()) blocks.push_back(b);
  };
  for (const std::vector<Place>* places : {&s.inputs, &s.outputs, &s.derived_at})
    for (const Place& p : *places) add(p);
  add(s.workspace);
  for (size_t d = 0; d < s.derived_from.size() && d < reuse.size(); ++d) {
    const auto [from, from_d] = s.derived_from[d];
    if (from < 0 || reuse[d] == 0) continue;
    const Place& at = steps[static_cast<size_t>(from)].derived_at.at(static_cast<size_t>(from_d));
    if (at.kind == Place::Kind::arena && reuse[d] >= arena_addr + at.index &&
        reuse[d] < arena_addr + at.index + at.extent)
      add(at);
  }
  return blocks;
}

struct Plan {
  std::vector<Step> steps;
  std::vector<compiler::TensorDesc> outputs;
  uint64_t arena_bytes = 0;      // the static plan's peak
  uint64_t unplanned_bytes = 0;  // the same buffers without reuse
  // Per kept step (Step::kept): where its output goes when the cache gives it no buffer.
  std::vector<Place> kept_fallback;
  // Per variable: whether a step writes its new value into a new buffer (published after the
  // run), and whether a cache update writes into the variable's own buffer (in place).
  std::vector<char> new_value, in_place;
  // The order a run queues the steps in: the steps `ahead` first (in the order their outputs
  // are first read), then the others in task order. Queued after the stream's earlier launches, an
  // AI CPU task could not start before they end (a task starts no earlier than its stream's ready
  // time), and its readers would wait for all of it; ahead of them it runs on the AI CPU beside the
  // AI cores from the run's start, as MindSpore puts an AI CPU kernel whose inputs are all
  // constants on a stream of its own (docs/validation.md, "Dropout masks off the AI cores").
  std::vector<size_t> queue_order;
  // NPUSIM_GRAPH_CONCURRENT=1 when the plan was built (schedule_streams): the steps not
  // `ahead` in the order a run submits them (graph::schedule_step_groups' groups one after
  // another: a priority order, the chain later steps wait for first), and per step the steps
  // it waits for (each earlier in that order): those whose outputs or derived tensors it
  // reads, the earlier steps on a variable's buffers, and the steps earlier in task order that
  // read or wrote arena bytes it writes or wrote arena bytes it reads (the memory plan's
  // reuse, the in-order plan's peak: docs/graph_engine.md). A run submits the
  // launches as one rt::Device::launch_group with those waits, split where a step must be
  // queued alone. Empty: queue_order, one by one.
  std::vector<size_t> stream_order;
  std::vector<std::vector<size_t>> waits;
};

// Figures of every plan built in this process (npu_graph_stats).
struct PlanFigures {
  std::mutex mutex;
  uint64_t plans = 0, max_arena_bytes = 0, max_unplanned_bytes = 0;
  uint64_t arena_allocations = 0, arenas_held = 0, arena_bytes_held = 0;
};
PlanFigures& plan_figures();

// The device arenas of one kernel instance (npu_graph.h): each a block of one plan's
// arena_bytes, kept across runs. A run takes an idle arena of its plan (or allocates one, so two
// threads running the graph at once never share one) and gives it back after its stream
// synchronisation, when no launch of it is left. A run of another plan (the input shapes
// changed) first frees the idle arenas of the other plans; the destructor frees every arena
// (runs have all returned by then: TensorFlow destroys a kernel after its last Compute).
class ArenaPool {
 public:
  ~ArenaPool() {
    const std::shared_ptr<rt::Device> device = m_device.lock();
    for (const auto& [plan, idle] : m_idle)
      for (const uint64_t addr : idle) release(device.get(), plan, addr);
  }

  // An arena of `plan` (plan->arena_bytes > 0) at *addr.
  rt::Status take(const std::shared_ptr<rt::Device>& device, const Plan* plan, uint64_t* addr) {
    std::vector<std::pair<const Plan*, uint64_t>> stale;
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      m_device = device;
      for (auto it = m_idle.begin(); it != m_idle.end();) {
        if (it->first == plan) {
          ++it;
          continue;
        }
        for (const uint64_t a : it->second) stale.push_back({it->first, a});
        it = m_idle.erase(it);
      }
      auto& idle = m_idle[plan];
      if (!idle.empty()) {
        *addr = idle.back();
        idle.pop_back();
        addr = nullptr;
      }
    }
    for (const auto& [p, a] : stale) release(device.get(), p, a);
    if (!addr) return rt::ok_status();
    rt::Status st = malloc_tensor(*device, plan->arena_bytes, addr);
    if (!st.ok()) return st;
    PlanFigures& f = plan_figures();
    std::lock_guard<std::mutex> lock(f.mutex);
    ++f.arena_allocations;
    ++f.arenas_held;
    f.arena_bytes_held += plan->arena_bytes;
    return rt::ok_status();
  }

  // Gives back an arena `take` returned, after the run's launches have all run.
  void give_back(const Plan* plan, uint64_t addr) {
    std::lock_guard<std::mutex> lock(m_mutex);
    m_idle[plan].push_back(addr);
  }

 private:
  static void release(rt::Device* device, const Plan* plan, uint64_t addr) {
    // Without the device (closed at exit) its memory is gone already.
    if (device) (void)free_tensor(*device, addr);
    PlanFigures& f = plan_figures();
    std::lock_guard<std::mutex> lock(f.mutex);
    --f.arenas_held;
    f.arena_bytes_held -= plan->arena_bytes;
  }

  std::mutex m_mutex;
  std::weak_ptr<rt::Device> m_device;
  std::map<const Plan*, std::vector<uint64_t>> m_idle;  // plans outlive the pool (same kernel)
};
PlanFigures& plan_figures() {
  static PlanFigures* f = new PlanFigures();
  return *f;
}

// A host constant as a TensorFlow tensor, for read_host_attr.
Tensor host_tensor(const NpuGraphSpec::HostConst& c) {
  TF_Tensor* t = TF_AllocateTensor(static_cast<TF_DataType>(c.tf_dtype), c.shape.data(),
                                   static_cast<int>(c.shape.size()), c.bytes.size());
  if (t && !c.bytes.empty()) std::memcpy(TF_TensorData(t), c.bytes.data(), c.bytes.size());
  return Tensor(t);
}

// Whether input i of a step of `op` is a Philox key or counter: TensorFlow's uint64, which the
// step reads as the compiler's s64 (DropOutGenMask, and StatelessRandomUniformV2 whose key and
// counter are TF's inputs 1 and 2, as kernels_random.cpp describes them).
bool reads_key_or_counter(const std::string& op, size_t i) {
  if (op == kGenMaskOp) return i == kGenMaskKeyInput || i == kGenMaskCounterInput;
  return op == "StatelessRandomUniformV2" && (i == 1 || i == 2);
}

class NpuGraphKernel : public OpKernel {
 public:
  explicit NpuGraphKernel(OpKernelConstruction* ctx) : m_name(ctx->name()) {
    std::string graph;
    std::vector<std::string> outputs_of;
    rt::Status st = ctx->GetAttr(kGraphAttr, &graph);
    if (st.ok()) st = ctx->GetAttr(kOutputsOfAttr, &outputs_of);
    if (!st.ok()) {
      ctx->CtxFailure(st);
      return;
    }
    std::string error;
    if (!parse_npu_graph(graph, outputs_of, &m_spec, &error)) {
      ctx->CtxFailure(
          rt::Status(rt::StatusCode::invalid_argument, "NpuGraph '" + m_name + "': " + error));
      return;
    }
    // The graph inputs only read as a Philox key or counter (TF's uint64) by DropOutGenMask or
    // StatelessRandomUniformV2 steps.
    std::vector<char> key_use(static_cast<size_t>(m_spec.num_inputs), 0),
        other_use(static_cast<size_t>(m_spec.num_inputs), 0);
    for (const NpuGraphSpec::Node& node : m_spec.nodes)
      for (size_t i = 0; i < node.inputs.size(); ++i)
        if (const int k = node.inputs[i].input; k >= 0)
          (reads_key_or_counter(node.op, i) ? key_use : other_use)[static_cast<size_t>(k)] = 1;
    for (size_t k = 0; k < key_use.size(); ++k) m_u64_inputs.push_back(key_use[k] && !other_use[k]);
    m_marked = ctx->HasAttr(kStableInputsAttr);
    if (m_marked && !ctx->GetAttr(kStableInputsAttr, &m_stable).ok()) {
      m_marked = false;  // only a hint
      m_stable.clear();
    }
    if (ctx->HasAttr(kVariablesAttr)) {
      st = ctx->GetAttr(kVariablesAttr, &m_variables);
      if (st.ok() && m_variables != m_spec.num_variables)
        st = rt::Status(rt::StatusCode::invalid_argument,
                        "NpuGraph '" + m_name + "': V is " + std::to_string(m_variables) +
                            ", its graph updates " + std::to_string(m_spec.num_variables) +
                            " variables");
      if (!st.ok()) ctx->CtxFailure(st);
    }
  }

  void Compute(OpKernelContext* ctx) override {
    const int data_inputs = ctx->num_inputs() - static_cast<int>(m_variables);
    std::vector<Tensor> inputs(static_cast<size_t>(std::max(data_inputs, 0)));
    std::vector<compiler::TensorDesc> descs(inputs.size());
    std::vector<uint64_t> input_addrs;
    std::string signature;
    for (size_t i = 0; i < inputs.size(); ++i) {
      NPU_OP_REQUIRES_OK(ctx, ctx->input(static_cast<int>(i), &inputs[i]));
      NPU_OP_REQUIRES_OK(ctx, input_desc(i, inputs[i], &descs[i]));
      input_addrs.push_back(inputs[i].device_address());
      signature += descs[i].str() + ";";
    }
    // The variables, locked until Compute returns (after the synchronisation below).
    std::unique_ptr<GraphVariables> variables;
    std::vector<compiler::TensorDesc> variable_descs;
    std::vector<uint64_t> variable_addrs, new_value_addrs;
    if (m_variables > 0) {
      const std::string where = "NpuGraph '" + m_name + "'";
      NPU_OP_REQUIRES_OK(
          ctx, from_update_status(GraphVariables::lock(ctx->tf_context(), data_inputs,
                                                       static_cast<int>(m_variables), &variables)));
      for (int k = 0; k < static_cast<int>(m_variables); ++k) {
        const UpdateTensor v = variables->value(k);
        const auto dtype = from_tf_dtype(v.dtype);
        if (!dtype) {
          ctx->CtxFailure(rt::Status(rt::StatusCode::unsupported,
                                     where + ": variable " + std::to_string(k) + " is " +
                                         tf_dtype_name(v.dtype) + ", which the NPU cannot hold"));
          return;
        }
        variable_descs.push_back({*dtype, v.shape});
        variable_addrs.push_back(v.address);
        signature += "v" + variable_descs.back().str() + ";";
      }
    }
    std::shared_ptr<rt::Device> device;
    NPU_OP_REQUIRES_OK(ctx, ctx->npu_device(&device));
    std::shared_ptr<const Plan> plan;
    NPU_OP_REQUIRES_OK(ctx,
                       plan_for(*ctx, device->config(), signature, descs, variable_descs, &plan));
    // Every updated variable's new value: a buffer of its own, published after the run; a
    // variable updated in place: its own buffer, shared with no tensor read before.
    for (int k = 0; k < static_cast<int>(m_variables); ++k) {
      uint64_t addr = 0;
      if (plan->new_value.at(static_cast<size_t>(k)))
        NPU_OP_REQUIRES_OK(
            ctx, from_update_status(variables->allocate_new_value(ctx->tf_context(), k, &addr)));
      new_value_addrs.push_back(addr);
      if (plan->in_place.at(static_cast<size_t>(k))) {
        NPU_OP_REQUIRES_OK(ctx, from_update_status(variables->own_buffer(ctx->tf_context(), k)));
        variable_addrs[static_cast<size_t>(k)] = variables->value(k).address;
      }
    }
    if (static_cast<int>(plan->outputs.size()) != ctx->num_outputs()) {
      ctx->CtxFailure(
          rt::Status(rt::StatusCode::internal,
                     "NpuGraph '" + m_name + "' has " + std::to_string(plan->outputs.size()) +
                         " outputs, TensorFlow expects " + std::to_string(ctx->num_outputs())));
      return;
    }

    std::vector<Tensor> outputs(plan->outputs.size());
    std::vector<uint64_t> output_addrs;
    for (size_t i = 0; i < outputs.size(); ++i) {
      TF_DataType t = to_tf_dtype(plan->outputs[i].dtype);
      // A Philox key or counter (StatelessRandomGetKeyCounter's outputs): TensorFlow's uint64,
      // the compiler's s64 (the same 8 bytes).
      if (t == TF_INT64 && ctx->expected_output_dtype(static_cast<int>(i)) == TF_UINT64)
        t = TF_UINT64;
      if (t != ctx->expected_output_dtype(static_cast<int>(i))) {
        ctx->CtxFailure(
            rt::Status(rt::StatusCode::internal,
                       "NpuGraph '" + m_name + "': output " + std::to_string(i) + " compiled as " +
                           tf_dtype_name(t) + ", TensorFlow expects " +
                           tf_dtype_name(ctx->expected_output_dtype(static_cast<int>(i)))));
        return;
      }
      NPU_OP_REQUIRES_OK(
          ctx, ctx->allocate_output(static_cast<int>(i), t, plan->outputs[i].shape, &outputs[i]));
      output_addrs.push_back(outputs[i].device_address());
    }
    rt::Stream stream;
    NPU_OP_REQUIRES_OK(ctx, ctx->npu_stream(&stream));
    // The arena goes back to the pool after the synchronisation below; nothing returns between.
    uint64_t arena_addr = 0;
    if (plan->arena_bytes > 0)
      NPU_OP_REQUIRES_OK(ctx, m_arenas.take(device, plan.get(), &arena_addr));
    std::vector<uint64_t> kept_addrs(plan->kept_fallback.size(), 0);  // set by the kept steps
    auto address = [&](const Place& p) -> uint64_t {
      switch (p.kind) {
        case Place::Kind::input: return input_addrs[p.index] + p.offset;
        case Place::Kind::output: return output_addrs[p.index] + p.offset;
        case Place::Kind::arena: return arena_addr + p.index + p.offset;
        case Place::Kind::variable: return variable_addrs[p.index] + p.offset;
        case Place::Kind::new_value: return new_value_addrs[p.index] + p.offset;
        case Place::Kind::kept: return kept_addrs[p.index] + p.offset;
        default: return 0;
      }
    };
    // One run id for the graph; one dispatch id per node, so reports keep the nodes apart; the
    // first node that launches pays the graph's host dispatch, the others none.
    const uint64_t run = next_dispatch_id();
    bool paid = false;
    std::vector<std::shared_ptr<const void>> hold;
    // Where each step's derived tensors live in this run (DerivedPlacement::placed).
    std::vector<std::vector<uint64_t>> derived(plan->steps.size());
    // Step n's label in this run: its own dispatch id, the run's id, the graph's host dispatch
    // paid by the first launch queued; `reuse`: its DerivedPlacement::reuse (place_operands).
    const auto run_label = [&](size_t n, const std::vector<uint64_t>& reuse) {
      const Step& s = plan->steps[n];
      auto label = std::make_shared<rt::LaunchLabel>(*s.label);
      label->dispatch = next_dispatch_id();
      label->graph_run = run;
      label->host_dispatch =
          paid ? rt::LaunchLabel::HostDispatch::none : rt::LaunchLabel::HostDispatch::graph;
      label->planned_blocks = planned_blocks(plan->steps, n, reuse, arena_addr);
      paid = true;
      return label;
    };
    const auto node_error = [](const Step& s, const rt::Status& st) {
      return rt::Status(st.code(),
                        "node '" + s.label->op_name + "' (" + s.op.str() + "): " + st.message());
    };
    // Step n's operand addresses in this run, and where its derived tensors go (their
    // fallback in the arena, or the buffer of the step they are shared from).
    const auto place_operands = [&](size_t n, std::vector<uint64_t>* in, std::vector<uint64_t>* out,
                                    DerivedPlacement* placement) {
      const Step& s = plan->steps[n];
      for (const Place& p : s.inputs) in->push_back(address(p));
      for (const Place& p : s.outputs) out->push_back(address(p));
      placement->placed = &derived[n];
      for (size_t d = 0; d < s.derived_at.size(); ++d) {
        placement->fallback.push_back(address(s.derived_at[d]));
        const auto [from, from_d] = s.derived_from[d];
        uint64_t reuse = 0;
        if (from >= 0 && static_cast<size_t>(from_d) < derived[static_cast<size_t>(from)].size())
          reuse = derived[static_cast<size_t>(from)][static_cast<size_t>(from_d)];
        placement->reuse.push_back(reuse);
      }
    };
    const auto queue_step = [&](size_t n) -> rt::Status {
      const Step& s = plan->steps[n];
      if (s.gen_mask) {  // an AI CPU step; it pays no host dispatch (as node by node)
        if (s.gen_mask->elements == 0) return rt::ok_status();
        GenMaskTask task = *s.gen_mask;
        task.key_addr = address(s.inputs.at(kGenMaskKeyInput));
        task.counter_addr = address(s.inputs.at(kGenMaskCounterInput));
        task.mask_addr = address(s.outputs.at(0));
        auto label = std::make_shared<rt::LaunchLabel>(*s.label);
        label->dispatch = next_dispatch_id();
        label->graph_run = run;
        label->host_dispatch = rt::LaunchLabel::HostDispatch::none;
        return queue_gen_mask(*device, stream, task, std::move(label));  // names the node
      }
      if (s.in_place || s.compiled->kernel.launches.empty()) return rt::ok_status();
      std::vector<uint64_t> in, out;
      DerivedPlacement placement;
      place_operands(n, &in, &out, &placement);
      const std::shared_ptr<const rt::LaunchLabel> label = run_label(n, placement.reuse);
      rt::Status st =
          s.kept >= 0
              ? queue_kept_output_op(device, stream, s.op, *s.compiled, in,
                                     address(plan->kept_fallback[static_cast<size_t>(s.kept)]),
                                     label, &hold, &kept_addrs[static_cast<size_t>(s.kept)])
              : queue_compiled_op(device, stream, s.op, *s.compiled, in, out, address(s.workspace),
                                  s.stable_inputs, label, &hold, &placement);
      return st.ok() ? st : node_error(s, st);
    };
    // NPUSIM_GRAPH_CONCURRENT=1: the launches gathered into one group (Plan::stream_order),
    // each step's launches a chain, its first waiting for the last launch of each step of
    // Plan::waits gathered since the last submission (those before it are done first: the
    // stream runs its ops in order).
    std::vector<rt::Device::GroupLaunch> gathered;
    std::vector<int> last_gathered(plan->steps.size(), -1);  // per step: its last launch there
    std::vector<size_t> gathered_steps;
    const auto submit_gathered = [&]() -> rt::Status {
      for (const size_t n : gathered_steps) last_gathered[n] = -1;
      gathered_steps.clear();
      if (gathered.empty()) return rt::ok_status();
      const size_t count = gathered.size();
      rt::Status st = device->launch_group(stream, std::move(gathered));
      gathered.clear();
      if (st.ok()) return st;
      return rt::Status(st.code(),
                        "its " + std::to_string(count) + " launches as one group: " + st.message());
    };
    // Step n into the group, or (an AI CPU step, a kept output, a derived tensor kept across
    // runs, whose launches the driver may leave out) queued alone after the group so far.
    const auto gather_step = [&](size_t n) -> rt::Status {
      const Step& s = plan->steps[n];
      if (s.gen_mask || s.kept >= 0) {
        rt::Status st = submit_gathered();
        return st.ok() ? queue_step(n) : st;
      }
      if (s.in_place || s.compiled->kernel.launches.empty()) return rt::ok_status();
      std::vector<uint64_t> in, out;
      DerivedPlacement placement;
      place_operands(n, &in, &out, &placement);
      std::vector<PreparedLaunch> launches;
      rt::Status st = prepare_compiled_op(device, s.op, *s.compiled, in, out, address(s.workspace),
                                          s.stable_inputs, run_label(n, placement.reuse), &hold,
                                          &placement, &launches);
      const bool kept_across_runs = std::any_of(
          launches.begin(), launches.end(), [](const PreparedLaunch& l) { return l.source.state; });
      if (st.ok() && kept_across_runs) {
        st = submit_gathered();
        if (st.ok()) st = queue_prepared(*device, stream, std::move(launches));
      } else if (st.ok()) {
        for (PreparedLaunch& l : launches) {
          std::vector<size_t> after;
          if (last_gathered[n] >= 0) {
            after.push_back(static_cast<size_t>(last_gathered[n]));  // the step's chain
          } else {
            for (const size_t w : plan->waits[n])
              if (last_gathered[w] >= 0) after.push_back(static_cast<size_t>(last_gathered[w]));
            gathered_steps.push_back(n);
          }
          last_gathered[n] = static_cast<int>(gathered.size());
          gathered.push_back({std::move(l.program), std::move(l.args), l.block_dim,
                              std::move(l.label), std::move(after)});
        }
      }
      return st.ok() ? st : node_error(s, st);
    };
    rt::Status st = rt::ok_status();
    if (plan->stream_order.empty()) {
      for (const size_t n : plan->queue_order)
        if (st = queue_step(n); !st.ok()) break;
    } else {
      for (const size_t n : plan->queue_order) {  // the steps ahead come first
        if (!plan->steps[n].ahead) break;
        if (st = queue_step(n); !st.ok()) break;
      }
      for (size_t i = 0; i < plan->stream_order.size() && st.ok(); ++i)
        st = gather_step(plan->stream_order[i]);
      if (st.ok()) st = submit_gathered();
    }
    // Always wait, also after a failed launch: launches already queued use the inputs, outputs
    // and arena, which TensorFlow may reuse once Compute returns. (The emulator's wait: the host
    // clock does not learn the stream's end, as for one op's launches.)
    rt::Status sync = device->wait_stream_unobserved(stream);
    if (st.ok()) st = sync;
    if (arena_addr) m_arenas.give_back(plan.get(), arena_addr);
    // Every launch ran: the updated variables take their new values (still locked).
    if (st.ok() && variables) variables->publish();
    if (!st.ok())
      ctx->CtxFailure(rt::Status(st.code(), "NpuGraph '" + m_name + "' on the NPU (chip '" +
                                                device->config().name + "'): " + st.message()));
  }

 private:
  // The plan for the inputs `in` (signature: their descriptions), compiled for the chip of
  // ctx's stream.
  rt::Status plan_for(const OpKernelContext& ctx, const ChipConfig& chip,
                      const std::string& signature, const std::vector<compiler::TensorDesc>& in,
                      const std::vector<compiler::TensorDesc>& variables,
                      std::shared_ptr<const Plan>* out) {
    {
      std::lock_guard<std::mutex> lock(m_mutex);
      const auto it = m_plans.find(signature);
      if (it != m_plans.end()) {
        *out = it->second;
        return rt::ok_status();
      }
    }
    auto plan = std::make_shared<Plan>();
    rt::Status st;
    {
      HostCpuScope timed("graph_plan", "plan");  // the compiles inside count as "compile"
      st = build_plan(ctx, chip, in, variables, plan.get());
    }
    if (!st.ok()) return st;
    {
      PlanFigures& f = plan_figures();
      std::lock_guard<std::mutex> lock(f.mutex);
      ++f.plans;
      f.max_arena_bytes = std::max(f.max_arena_bytes, plan->arena_bytes);
      f.max_unplanned_bytes = std::max(f.max_unplanned_bytes, plan->unplanned_bytes);
    }
    std::lock_guard<std::mutex> lock(m_mutex);
    m_plans[signature] = plan;
    *out = plan;
    return rt::ok_status();
  }

  rt::Status build_plan(const OpKernelContext& ctx, const ChipConfig& chip,
                        const std::vector<compiler::TensorDesc>& in,
                        const std::vector<compiler::TensorDesc>& variables, Plan* plan) const {
    if (static_cast<int>(in.size()) < m_spec.num_inputs)
      return rt::Status(rt::StatusCode::internal,
                        "NpuGraph '" + m_name + "' has " + std::to_string(in.size()) + " inputs, " +
                            "its graph reads " + std::to_string(m_spec.num_inputs));
    // Streams (NPUSIM_GRAPH_CONCURRENT=1), read once: the steps' compile option, the kept
    // casts, the memory plan's run-on and the schedule all follow the same reading.
    const bool streams = graph_concurrent_enabled();
    // Which (node, port) is which output of the graph.
    std::map<std::pair<int, int>, int> output_of;
    for (size_t k = 0; k < m_spec.outputs.size(); ++k)
      output_of[{m_spec.outputs[k].node, m_spec.outputs[k].port}] = static_cast<int>(k);
    plan->outputs.resize(m_spec.outputs.size());
    plan->new_value.assign(variables.size(), 0);
    plan->in_place.assign(variables.size(), 0);
    // Where each variable's value is at this point of the task list: its own buffer, or the
    // new buffer an update wrote (reads after the update read it there).
    std::vector<Place> current;
    for (size_t k = 0; k < variables.size(); ++k)
      current.push_back({Place::Kind::variable, static_cast<uint64_t>(k)});

    std::vector<graph::PlannedBuffer> buffers;
    std::map<std::pair<int, int>, int> buffer_of;  // (node, port) -> buffers index
    std::vector<int> workspace_of(m_spec.nodes.size(), -1);
    std::map<std::string, std::pair<int, int>> derived_key;  // share_derived's
    for (size_t n = 0; n < m_spec.nodes.size(); ++n) {
      const NpuGraphSpec::Node& node = m_spec.nodes[n];
      const auto what = [&] { return "node '" + node.name + "' (" + node.op + ")"; };
      if (std::vector<int> view_host; npu_graph_view_op(node.op, &view_host)) {
        rt::Status st = plan_view(n, in, output_of, plan, &buffers, &buffer_of);
        if (!st.ok()) return st;
        continue;
      }
      if (node.op == kGenMaskOp) {
        rt::Status st = plan_gen_mask(n, in, output_of, plan, &buffers, &buffer_of);
        if (!st.ok()) return st;
        continue;
      }
      if (node.op == "ReadVariableOp" || node.op == kCacheUpdateOp) {
        rt::Status st =
            plan_cache_op(ctx, n, in, variables, output_of, &current, plan, &buffers, &buffer_of);
        if (!st.ok()) return st;
        continue;
      }
      const std::vector<HostAttrInput>* host = nullptr;
      const bool update = node.op == kVariableUpdateOp;
      const std::vector<AttrSpec>* specs =
          update ? &variable_update_attrs(&host) : task_list_op_attrs(node.op, &host);
      if (!specs)
        return rt::Status(rt::StatusCode::internal,
                          "NpuGraph '" + m_name + "': " + what() + " is no compiled op");
      Step s;
      s.stable_inputs.marked = m_marked;
      s.op.type = node.op;
      for (const AttrSpec& a : *specs) {
        const auto it = node.attrs.find(a.name);
        if (it != node.attrs.end()) s.op.attrs[a.name] = it->second;
      }
      // Under streams the filter gradients that add their parts run one vector core per cube
      // core, leaving the other of each group to the launches beside them (NPUSIM_MIX_ONE_TO_ONE,
      // where set, wins; docs/graph_engine.md, "The filter gradients 1:1 under streams").
      if (streams) s.op.attrs[compiler::ops::kMixOneToOneAttr] = std::string("filter_grad");
      for (size_t i = 0; i < node.inputs.size(); ++i) {
        const NpuGraphSpec::Source& src = node.inputs[i];
        Place p;
        compiler::TensorDesc d;
        if (src.variable >= 0) {
          if (!update || static_cast<size_t>(src.variable) >= variables.size())
            return rt::Status(rt::StatusCode::internal,
                              "NpuGraph '" + m_name + "': " + what() + " reads variable " +
                                  std::to_string(src.variable) + ", which it cannot");
          d = variables[static_cast<size_t>(src.variable)];
          p = {Place::Kind::variable, static_cast<uint64_t>(src.variable)};
        } else if (src.input >= 0) {
          d = in.at(static_cast<size_t>(src.input));
          p = {Place::Kind::input, static_cast<uint64_t>(src.input)};
          if (std::find(m_stable.begin(), m_stable.end(), src.input) != m_stable.end())
            s.stable_inputs.positions.push_back(static_cast<int64_t>(i));
        } else if (src.host_const >= 0) {
          const Tensor t = host_tensor(m_spec.consts.at(static_cast<size_t>(src.host_const)));
          if (!t.valid()) return rt::Status(rt::StatusCode::internal, what() + ": a host constant");
          rt::Status st = t.desc(&d);
          for (const HostAttrInput& h : *host) {
            const int index =
                h.input < 0 ? static_cast<int>(node.inputs.size()) + h.input : h.input;
            if (st.ok() && index == static_cast<int>(i))
              st = read_host_attr(node.op, t, index, h.kind, &s.op.attrs[h.attr]);
          }
          if (!st.ok()) return rt::Status(st.code(), what() + ": " + st.message());
        } else {
          const Step& from = plan->steps.at(static_cast<size_t>(src.node));
          if (src.port >= static_cast<int>(from.compiled->kernel.outputs.size()))
            return rt::Status(rt::StatusCode::internal,
                              what() + " reads output " + std::to_string(src.port) + " of '" +
                                  from.label->op_name + "', which has fewer");
          d = from.compiled->kernel.outputs[static_cast<size_t>(src.port)];
          p = from.outputs[static_cast<size_t>(src.port)];
          const auto b = buffer_of.find({src.node, src.port});
          if (b != buffer_of.end())
            buffers[static_cast<size_t>(b->second)].last = static_cast<int>(n);
        }
        s.op.inputs.push_back(std::move(d));
        s.inputs.push_back(p);
      }
      std::shared_ptr<rt::Device> device;
      rt::Status st = compile_op(ctx, s.op, &device, &s.compiled);
      if (!st.ok())
        return rt::Status(st.code(), "NpuGraph '" + m_name + "': " + what() + ": " + st.message());
      const compiler::CompiledKernel& k = s.compiled->kernel;
      for (size_t p = 0; p < k.outputs.size(); ++p) {
        const auto o = output_of.find({static_cast<int>(n), static_cast<int>(p)});
        if (update) {
          // Output p is the new value of the variable of input p (the compiler's contract,
          // adapter/compiler/ops/fused_elementwise.h), written into its new buffer.
          const Place& var = p < s.inputs.size() ? s.inputs[p] : Place{};
          if (var.kind != Place::Kind::variable || !(k.outputs[p] == s.op.inputs[p]))
            return rt::Status(rt::StatusCode::internal, "NpuGraph '" + m_name + "': " + what() +
                                                            ": output " + std::to_string(p) +
                                                            " is no new value of variable input " +
                                                            std::to_string(p));
          s.outputs.push_back({Place::Kind::new_value, var.index});
          plan->new_value.at(var.index) = 1;
          current.at(var.index) = s.outputs.back();  // reads after the update read it there
        } else if (o != output_of.end()) {
          s.outputs.push_back({Place::Kind::output, static_cast<uint64_t>(o->second)});
          plan->outputs[static_cast<size_t>(o->second)] = k.outputs[p];
        } else if (k.outputs[p].bytes() > 0) {
          buffer_of[{static_cast<int>(n), static_cast<int>(p)}] = static_cast<int>(buffers.size());
          s.outputs.push_back({Place::Kind::arena, buffers.size()});  // index until placed
          buffers.push_back({node.name + ":" + std::to_string(p),
                             compiler::device_buffer_bytes(k.outputs[p].bytes()),
                             static_cast<int>(n), static_cast<int>(n), 0});
        } else {
          s.outputs.push_back({});
        }
      }
      if (k.workspace_bytes > 0) {
        workspace_of[n] = static_cast<int>(buffers.size());
        buffers.push_back({node.name + " workspace",
                           compiler::device_buffer_bytes(k.workspace_bytes), static_cast<int>(n),
                           static_cast<int>(n), 0});
      }
      s.label = launch_label(node.name, s.op, k, node.members, node.report_type);
      plan->steps.push_back(std::move(s));
      share_derived(n, plan, &buffers, &derived_key);
    }
    // Kept casts (their launches skip while their source is unchanged) are queued alone.
    std::vector<Place> within(buffers.size());
    std::vector<char> keepable;
    if (streams) {
      keepable.assign(plan->steps.size(), 0);
      keep_stable_casts(within, plan, &keepable);
    }
    // Buffers placed inside another place (a slice's outputs in its input, a concatenation's
    // pieces in its output) take no bytes of their own; the rest are planned.
    if (in_place_enabled()) place_in_place(plan, &buffers, &within);
    std::vector<graph::PlannedBuffer> own;
    std::vector<size_t> own_index(buffers.size(), 0);
    for (size_t b = 0; b < buffers.size(); ++b) {
      if (within[b].kind != Place::Kind::none) continue;
      own_index[b] = own.size();
      own.push_back(buffers[b]);
      plan->unplanned_bytes += buffers[b].bytes;
    }
    std::vector<graph::GroupStep> stream_steps;
    if (streams) {
      // Streams: the in-order plan's peak is the budget; within it, the buffers of steps
      // expected to run on beside later steps stay live longer, so that fewer of those steps
      // wait for them (schedule_streams turns the plan's reuse into dependences).
      stream_steps = group_steps(keepable, *plan);
      std::vector<graph::PlannedBuffer> in_order = own;
      const uint64_t budget = graph::plan_memory(in_order);
      const std::vector<graph::LifetimeExtension> run_on =
          run_on_extensions(chip, stream_steps, workspace_of, *plan, within, own_index);
      std::vector<char> granted;
      plan->arena_bytes = graph::plan_memory_within_budget(own, run_on, budget, &granted);
    } else {
      plan->arena_bytes = graph::plan_memory(own);
    }
    keep_stable_casts(within, plan);
    // Buffer indices -> places: the arena offset of the buffer, or of the place it lies in.
    auto place = [&](Place& p) {
      if (p.kind != Place::Kind::arena) return;
      uint64_t offset = p.offset;
      size_t b = p.index;
      while (within[b].kind != Place::Kind::none) {
        offset += within[b].offset;
        if (within[b].kind != Place::Kind::arena) {
          p = {within[b].kind, within[b].index, offset};
          return;
        }
        b = within[b].index;
      }
      p = {Place::Kind::arena, own[own_index[b]].offset, offset, own[own_index[b]].bytes};
    };
    for (Place& p : plan->kept_fallback) place(p);
    for (size_t n = 0; n < plan->steps.size(); ++n) {
      Step& s = plan->steps[n];
      for (Place& p : s.outputs) place(p);
      for (Place& p : s.derived_at) place(p);
      if (workspace_of[n] >= 0) {
        s.workspace = {Place::Kind::arena, static_cast<uint64_t>(workspace_of[n])};
        place(s.workspace);
      }
    }
    // Inputs read earlier steps' outputs: copy their (now placed) places.
    for (size_t n = 0; n < plan->steps.size(); ++n) {
      const NpuGraphSpec::Node& node = m_spec.nodes[n];
      for (size_t i = 0; i < node.inputs.size(); ++i)
        if (node.inputs[i].node >= 0)
          plan->steps[n].inputs[i] = plan->steps[static_cast<size_t>(node.inputs[i].node)]
                                         .outputs[static_cast<size_t>(node.inputs[i].port)];
    }
    if (streams) schedule_streams(chip, std::move(stream_steps), workspace_of, plan);
    // The steps ahead in the order their outputs are first read (the AI CPU runs its tasks one
    // after another: the first needed first), then the others in task order.
    std::vector<size_t> first_read(plan->steps.size(), plan->steps.size());
    for (size_t n = 0; n < m_spec.nodes.size(); ++n)
      for (const NpuGraphSpec::Source& src : m_spec.nodes[n].inputs)
        if (src.node >= 0)
          first_read[static_cast<size_t>(src.node)] =
              std::min(first_read[static_cast<size_t>(src.node)], n);
    for (size_t n = 0; n < plan->steps.size(); ++n)
      if (plan->steps[n].ahead) plan->queue_order.push_back(n);
    std::stable_sort(plan->queue_order.begin(), plan->queue_order.end(),
                     [&](size_t a, size_t b) { return first_read[a] < first_read[b]; });
    for (size_t n = 0; n < plan->steps.size(); ++n)
      if (!plan->steps[n].ahead) plan->queue_order.push_back(n);
    for (size_t k = 0; k < m_spec.outputs.size(); ++k) {
      const NpuGraphSpec::Source& o = m_spec.outputs[k];
      if (o.port >= static_cast<int>(
                        plan->steps[static_cast<size_t>(o.node)].compiled->kernel.outputs.size()))
        return rt::Status(rt::StatusCode::internal,
                          "NpuGraph '" + m_name + "': output " + std::to_string(k) +
                              " names port " + std::to_string(o.port) + " of '" +
                              m_spec.nodes[o.node].name + "', which has fewer outputs");
    }
    return rt::ok_status();
  }

  // NPUSIM_GRAPH_CONCURRENT=1 (Plan::stream_order, Plan::waits), once every place is placed:
  // the order a run submits the steps in (graph::schedule_step_groups' groups one after another;
  // docs/graph_engine.md, "Concurrent steps of a TF graph") and what each step waits for. The
  // memory plan's lifetimes are in task order (some lengthened within the in-order plan's peak:
  // run_on_extensions), and its reuse becomes dependences, as CANN's memory reuse adds events
  // between streams: a step depends on every earlier step in task order that touched arena bytes
  // it touches where one of the two writes them (write after read, read after write, write after
  // write: a buffer placed in bytes an earlier buffer held). With its inputs' producers, the
  // step computing a derived tensor it reads and, for steps reading or writing a variable's
  // buffers, every earlier such step (an in-place update must not pass a read of the old
  // value), every pair of steps that touch one byte, one writing it, keeps its task order, so
  // any schedule of these dependences computes what the run in order computes. Steps of one
  // launch, no merged members, no derived tensor and no kept output (`keepable`) have a core
  // kind the schedule knows; the others count as holding every core. `steps`: group_steps'
  // (the dependences but the memory plan's reuse).
  void schedule_streams(const ChipConfig& chip, std::vector<graph::GroupStep> steps,
                        const std::vector<int>& workspace_of, Plan* plan) const {
    const size_t n_steps = plan->steps.size();
    const std::vector<std::vector<ArenaTouch>> touched = arena_touches(workspace_of, *plan);
    for (size_t n = 0; n < n_steps; ++n) {
      // A step ahead runs before every other: nothing it touches was held before it (its
      // bytes live from the run's start).
      if (plan->steps[n].ahead) continue;
      for (size_t j = 0; j < n; ++j) {
        if (plan->steps[j].ahead) continue;
        bool clash = false;
        for (const ArenaTouch& a : touched[n])
          for (const ArenaTouch& b : touched[j])
            clash = clash || ((a.writes || b.writes) && a.start < b.end && b.start < a.end);
        if (clash) steps[n].after.push_back(j);
      }
    }
    const graph::StepGroups sg = graph::schedule_step_groups(steps, chip);
    const auto launches = [&](size_t n) { return steps[n].alone || steps[n].program; };
    // Per step, the launching steps it waits for (through steps that launch nothing).
    plan->waits.assign(n_steps, {});
    for (size_t n = 0; n < n_steps; ++n) {
      std::vector<size_t>& w = plan->waits[n];
      for (const size_t j : steps[n].after) {
        if (launches(j))
          w.push_back(j);
        else
          w.insert(w.end(), plan->waits[j].begin(), plan->waits[j].end());
      }
      std::sort(w.begin(), w.end());
      w.erase(std::unique(w.begin(), w.end()), w.end());
    }
    for (const std::vector<size_t>& group : sg.groups)
      for (const size_t n : group)
        if (!plan->steps[n].ahead) plan->stream_order.push_back(n);
  }

  // The steps of schedule_streams' schedule with their dependences but the memory plan's
  // reuse: its inputs' producers, the step computing a derived tensor it reads and, for steps
  // reading or writing a variable's buffers, every earlier such step. After in-place
  // placement (a step placed in place launches nothing).
  std::vector<graph::GroupStep> group_steps(const std::vector<char>& keepable,
                                            const Plan& plan) const {
    const size_t n_steps = plan.steps.size();
    std::vector<graph::GroupStep> steps(n_steps);
    const auto on_variable = [](const Place& p) {
      return p.kind == Place::Kind::variable || p.kind == Place::Kind::new_value;
    };
    int last_on_variable = -1;
    for (size_t n = 0; n < n_steps; ++n) {
      const Step& s = plan.steps[n];
      graph::GroupStep& g = steps[n];
      for (const NpuGraphSpec::Source& src : m_spec.nodes[n].inputs)
        if (src.node >= 0) g.after.push_back(static_cast<size_t>(src.node));
      for (const auto& [from, from_d] : s.derived_from)
        if (from >= 0) g.after.push_back(static_cast<size_t>(from));
      bool variable = false;
      for (const std::vector<Place>* places : {&s.inputs, &s.outputs})
        for (const Place& p : *places) variable = variable || on_variable(p);
      if (variable) {
        if (last_on_variable >= 0) g.after.push_back(static_cast<size_t>(last_on_variable));
        last_on_variable = static_cast<int>(n);
      }
      const compiler::CompiledKernel& k = s.compiled->kernel;
      if (s.gen_mask) {
        g.alone = !s.ahead;  // queued ahead of every other step: in no group
      } else if (!s.in_place && !k.launches.empty()) {
        const bool one = k.launches.size() == 1 && k.derived.empty() && !keepable[n] &&
                         m_spec.nodes[n].members.empty();
        g.alone = !one;
        if (one) {
          g.program = s.compiled->programs.at(0).get();
          g.block_dim = k.launches[0].block_dim;
        }
      }
    }
    return steps;
  }

  // Per step expected to run on beside later steps in the schedule without the memory plan's
  // reuse (`steps`: group_steps'), in that schedule's order: its buffers (by index into the
  // planned buffers `own_index` names) live until the last task position of the steps that
  // schedule puts before it ends, so that none of those writes its bytes (which would make
  // it wait for the step). It runs on until the first later group holding a step that waits
  // for it or whose cores do not fit beside its own (CoreTaker: a filter gradient on the cube
  // cores beside a chain of vector steps). Before any place is placed: places hold buffer
  // indices; `within` says which buffer each lies in.
  std::vector<graph::LifetimeExtension> run_on_extensions(
      const ChipConfig& chip, const std::vector<graph::GroupStep>& steps,
      const std::vector<int>& workspace_of, const Plan& plan, const std::vector<Place>& within,
      const std::vector<size_t>& own_index) const {
    const size_t n_steps = plan.steps.size();
    const graph::StepGroups sg = graph::schedule_step_groups(steps, chip);
    const auto launches = [&](size_t n) { return steps[n].alone || steps[n].program; };
    // Per step, the launching steps it waits for (through steps that launch nothing).
    std::vector<std::vector<size_t>> waits(n_steps);
    for (size_t n = 0; n < n_steps; ++n) {
      for (const size_t j : steps[n].after) {
        if (launches(j))
          waits[n].push_back(j);
        else
          waits[n].insert(waits[n].end(), waits[j].begin(), waits[j].end());
      }
      std::sort(waits[n].begin(), waits[n].end());
    }
    CoreTaker cores(chip);
    const auto beside = [&](size_t a, size_t b) {
      if (steps[a].alone || steps[b].alone) return false;
      cores.clear();
      return cores.take(*steps[a].program, steps[a].block_dim, nullptr) &&
             cores.take(*steps[b].program, steps[b].block_dim, nullptr);
    };
    // Per group, the last task position of the steps in it or in an earlier group.
    const int n_groups = static_cast<int>(sg.groups.size());
    std::vector<int> last_task(sg.groups.size(), -1);
    for (int g = 0; g < n_groups; ++g) {
      last_task[g] = g > 0 ? last_task[g - 1] : -1;
      for (const size_t t : sg.groups[static_cast<size_t>(g)])
        last_task[g] = std::max(last_task[g], static_cast<int>(t));
    }
    std::vector<graph::LifetimeExtension> out;
    for (const std::vector<size_t>& group : sg.groups)
      for (const size_t n : group) {
        if (!launches(n) || steps[n].alone) continue;
        int until = sg.position[n];
        for (int g = sg.position[n] + 1; g < n_groups && until == g - 1; ++g) {
          bool runs = true;
          for (const size_t t : sg.groups[static_cast<size_t>(g)])
            runs = runs && !std::binary_search(waits[t].begin(), waits[t].end(), n) && beside(n, t);
          if (runs) until = g;
        }
        graph::LifetimeExtension e;
        const auto touch = [&](const Place& p) {
          if (p.kind != Place::Kind::arena) return;
          size_t b = p.index;
          while (within[b].kind == Place::Kind::arena) b = within[b].index;
          if (within[b].kind == Place::Kind::none)
            e.live_until.push_back({own_index[b], last_task[static_cast<size_t>(until)]});
        };
        const Step& s = plan.steps[n];
        for (const std::vector<Place>* places : {&s.inputs, &s.outputs, &s.derived_at})
          for (const Place& p : *places) touch(p);
        if (workspace_of[n] >= 0)
          touch({Place::Kind::arena, static_cast<uint64_t>(workspace_of[n])});
        for (const auto& [from, from_d] : s.derived_from)
          if (from >= 0)
            touch(plan.steps[static_cast<size_t>(from)].derived_at.at(static_cast<size_t>(from_d)));
        out.push_back(std::move(e));
      }
    return out;
  }

  // Arena bytes [start, end) a step touches, and whether it writes them.
  struct ArenaTouch {
    uint64_t start = 0, end = 0;
    bool writes = false;
  };

  // Per step, the arena bytes it touches once every place is placed: its inputs (read), its
  // outputs, workspace and derived tensors' buffers (written), the derived tensors it reads.
  // A tensor's bytes are counted as the device moves them (compiler::device_buffer_bytes); a
  // workspace and a derived tensor's buffer whole. A step placed in place launches nothing and
  // touches nothing itself: its readers touch what it names.
  static std::vector<std::vector<ArenaTouch>> arena_touches(const std::vector<int>& workspace_of,
                                                            const Plan& plan) {
    std::vector<std::vector<ArenaTouch>> touched(plan.steps.size());
    const auto add = [&](size_t n, const Place& p, uint64_t bytes, bool writes) {
      if (p.kind != Place::Kind::arena || bytes == 0) return;
      const uint64_t start = p.index + p.offset;
      touched[n].push_back({start, start + bytes, writes});
    };
    for (size_t n = 0; n < plan.steps.size(); ++n) {
      const Step& s = plan.steps[n];
      const compiler::CompiledKernel& k = s.compiled->kernel;
      if (s.in_place) continue;
      for (size_t i = 0; i < s.inputs.size() && i < s.op.inputs.size(); ++i)
        add(n, s.inputs[i], compiler::device_buffer_bytes(s.op.inputs[i].bytes()), false);
      for (size_t o = 0; o < s.outputs.size() && o < k.outputs.size(); ++o)
        add(n, s.outputs[o], compiler::device_buffer_bytes(k.outputs[o].bytes()), true);
      if (workspace_of[n] >= 0) add(n, s.workspace, s.workspace.extent, true);
      for (const Place& p : s.derived_at) add(n, p, p.extent, true);
      for (const auto& [from, from_d] : s.derived_from)
        if (from >= 0) {
          const Place& p =
              plan.steps[static_cast<size_t>(from)].derived_at.at(static_cast<size_t>(from_d));
          add(n, p, p.extent, false);
        }
    }
    return touched;
  }

  // Marks the steps whose output is kept across runs (Step::kept): a Cast reading stable inputs
  // of the graph alone (StableInputs) into an arena buffer of its own (no place lies inside it,
  // it lies inside none), compiled as one launch (keepable_output). Before the places are
  // placed: every place of that buffer (the step's output, views of it) becomes a kept place;
  // the buffer stays in the plan, where the output goes when the cache gives it no buffer.
  // CANN's graph engine likewise fuses a variable's Cast into the variable
  // (derived_tensor_cache.h).
  // With `candidates` nothing is marked: (*candidates)[n] is set for each step that would be
  // kept if no place lay inside or around its buffer (the group schedule, before in-place
  // placement, runs those alone).
  static void keep_stable_casts(const std::vector<Place>& within, Plan* plan,
                                std::vector<char>* candidates = nullptr) {
    if (!keep_derived_tensors()) return;
    std::vector<char> hosts(within.size(), 0);  // buffers some other buffer lies in
    for (const Place& w : within)
      if (w.kind == Place::Kind::arena) hosts.at(w.index) = 1;
    for (Step& s : plan->steps) {
      if (s.in_place || s.op.type != "Cast" || s.inputs.empty() || !keepable_output(*s.compiled))
        continue;
      bool stable = true;
      for (size_t i = 0; i < s.inputs.size(); ++i)
        stable = stable && s.inputs[i].kind == Place::Kind::input &&
                 s.stable_inputs.stable(static_cast<int64_t>(i));
      const Place out = s.outputs.at(0);
      if (candidates && stable) (*candidates).at(static_cast<size_t>(&s - plan->steps.data())) = 1;
      if (candidates || !stable || out.kind != Place::Kind::arena || out.offset != 0 ||
          hosts.at(out.index) || within.at(out.index).kind != Place::Kind::none)
        continue;
      s.kept = static_cast<int>(plan->kept_fallback.size());
      plan->kept_fallback.push_back(out);
      for (Step& t : plan->steps)
        for (Place& p : t.outputs)
          if (p.kind == Place::Kind::arena && p.index == out.index)
            p = {Place::Kind::kept, static_cast<uint64_t>(s.kept), p.offset};
    }
  }

  // Step n, a view (npu_graph_view_op): its output is its input's place (an input of the graph
  // or an earlier step's output, not yet placed: the same buffer) under the shape the op gives;
  // nothing launches, and its readers extend the liveness of the buffer it views. The
  // clustering never makes a view an output of the graph (graph_cluster.cpp keeps such a view
  // outside), so a view never needs bytes of its own.
  // The status `code` with "NpuGraph '<name>': node '<node>' (<op>): <why>".
  rt::Status node_status(size_t n, rt::StatusCode code, const std::string& why) const {
    const NpuGraphSpec::Node& node = m_spec.nodes[n];
    return rt::Status(
        code, "NpuGraph '" + m_name + "': node '" + node.name + "' (" + node.op + "): " + why);
  }

  // A variable read or a cache update (npu_graph.h) as step n, variable k its resource input:
  // - ReadVariableOp: the variable's value where it is at this point (*current: its own buffer,
  //   or the new buffer an earlier update step of the set wrote, a FusedVariableUpdate's or a
  //   cache update's), no launch;
  // - ResourceDynamicUpdateSlice(variable, update, indices): the compiler's
  //   XlaDynamicUpdateSlice with in_place, writing only the update's box into the variable's own
  //   buffer (Plan::in_place: the run first makes the buffer the variable's alone); where the
  //   compiler cannot write the box in place (a box of several runs: batch > 1), the whole new
  //   value into a new buffer (Plan::new_value), published after the run, as a
  //   FusedVariableUpdate. Either way later reads in the set read *current, the new value.
  // The clustering (graph_cluster.cpp) keeps one update per variable in a set, and the reads
  // in it after that update.
  rt::Status plan_cache_op(const OpKernelContext& ctx, size_t n,
                           const std::vector<compiler::TensorDesc>& in,
                           const std::vector<compiler::TensorDesc>& variables,
                           const std::map<std::pair<int, int>, int>& output_of,
                           std::vector<Place>* current, Plan* plan,
                           std::vector<graph::PlannedBuffer>* buffers,
                           std::map<std::pair<int, int>, int>* buffer_of) const {
    const NpuGraphSpec::Node& node = m_spec.nodes[n];
    const auto fail = [&](const std::string& why) {
      return node_status(n, rt::StatusCode::internal, why);
    };
    const bool read = node.op == "ReadVariableOp";
    if (node.inputs.size() != (read ? 1u : 3u) || node.inputs[0].variable < 0 ||
        static_cast<size_t>(node.inputs[0].variable) >= variables.size())
      return fail("its inputs are not a variable" + std::string(read ? "" : ", update, indices"));
    const size_t k = static_cast<size_t>(node.inputs[0].variable);
    if (output_of.count({static_cast<int>(n), 0}))
      return fail("is an output of the graph, which a variable read cannot be");
    Step s;
    s.op.type = read ? node.op : "XlaDynamicUpdateSlice";
    s.op.inputs.push_back(variables[k]);
    s.inputs.push_back((*current)[k]);
    if (read) {
      s.in_place = true;
      auto compiled = std::make_shared<CompiledOp>();
      compiled->kernel.outputs = {variables[k]};
      s.outputs = {(*current)[k]};
      s.label = launch_label(node.name, s.op, compiled->kernel);
      s.compiled = std::move(compiled);
      plan->steps.push_back(std::move(s));
      return rt::ok_status();
    }
    if ((*current)[k].kind != Place::Kind::variable)
      return fail("updates variable " + std::to_string(k) + " a second time");
    for (size_t i = 1; i < 3; ++i) {
      compiler::TensorDesc d;
      Place p;
      std::string why;
      if (!tensor_source(n, node.inputs[i], in, *plan, buffers, *buffer_of, &d, &p, &why))
        return fail("its input " + std::to_string(i) + " " + why);
      s.op.inputs.push_back(std::move(d));
      s.inputs.push_back(p);
    }
    const std::vector<HostAttrInput>* host = nullptr;
    const std::vector<AttrSpec>* specs = compiled_op_attrs(s.op.type, &host);
    if (!specs) return fail("XlaDynamicUpdateSlice is no compiled op");
    for (const AttrSpec& a : *specs) {
      const auto it = node.attrs.find(a.name);
      if (it != node.attrs.end()) s.op.attrs[a.name] = it->second;
    }
    s.op.attrs["in_place"] = true;
    std::shared_ptr<rt::Device> device;
    rt::Status st = compile_op(ctx, s.op, &device, &s.compiled);
    if (st.ok()) {
      plan->in_place[k] = 1;
    } else {  // the whole value into a new buffer
      s.op.attrs.erase("in_place");
      st = compile_op(ctx, s.op, &device, &s.compiled);
      if (!st.ok()) return node_status(n, st.code(), st.message());
      plan->new_value[k] = 1;
      (*current)[k] = {Place::Kind::new_value, static_cast<uint64_t>(k)};
    }
    if (s.compiled->kernel.outputs.size() != 1 || !(s.compiled->kernel.outputs[0] == variables[k]))
      return fail("its output is not the variable's new value");
    s.outputs = {(*current)[k]};
    s.label = launch_label(node.name, s.op, s.compiled->kernel, node.members, node.report_type);
    s.derived_at.assign(s.compiled->kernel.derived.size(), Place{});  // computed as node by node
    s.derived_from.assign(s.compiled->kernel.derived.size(), {-1, -1});
    plan->steps.push_back(std::move(s));
    return rt::ok_status();
  }

  // Graph input i's description: TensorFlow's uint64 as the compiler's s64 (same 8 bytes) where
  // only DropOutGenMask and StatelessRandomUniformV2 steps read it (their key and counter), an
  // error elsewhere; other types as Tensor::desc.
  rt::Status input_desc(size_t i, const Tensor& t, compiler::TensorDesc* out) const {
    if (t.dtype() != TF_UINT64) return t.desc(out);
    if (i >= m_u64_inputs.size() || !m_u64_inputs[i])
      return rt::Status(rt::StatusCode::invalid_argument,
                        "NpuGraph '" + m_name + "': input " + std::to_string(i) +
                            " is uint64, which only a random step's key and counter may be");
    *out = compiler::TensorDesc{compiler::DataType::S64, t.shape()};
    return rt::ok_status();
  }

  // The description and place of `src`, a tensor input of step n: an input of the graph or an
  // earlier step's output (whose buffer then lives until step n); false if it is neither or
  // names a port the step lacks (*why says which).
  bool tensor_source(size_t n, const NpuGraphSpec::Source& src,
                     const std::vector<compiler::TensorDesc>& in, const Plan& plan,
                     std::vector<graph::PlannedBuffer>* buffers,
                     const std::map<std::pair<int, int>, int>& buffer_of, compiler::TensorDesc* d,
                     Place* p, std::string* why) const {
    if (src.input >= 0) {
      *d = in.at(static_cast<size_t>(src.input));
      *p = {Place::Kind::input, static_cast<uint64_t>(src.input)};
      return true;
    }
    if (src.node < 0) {
      *why = "is no tensor of the graph";
      return false;
    }
    const Step& from = plan.steps.at(static_cast<size_t>(src.node));
    if (src.port >= static_cast<int>(from.compiled->kernel.outputs.size())) {
      *why = "reads output " + std::to_string(src.port) + " of '" + from.label->op_name +
             "', which has fewer";
      return false;
    }
    *d = from.compiled->kernel.outputs[static_cast<size_t>(src.port)];
    *p = from.outputs[static_cast<size_t>(src.port)];
    const auto b = buffer_of.find({src.node, src.port});
    if (b != buffer_of.end()) (*buffers)[static_cast<size_t>(b->second)].last = int(n);
    return true;
  }

  // Step n, a DropOutGenMask (Step::gen_mask): shape and alg from the set's Consts (the
  // clustering admits the node only so), key and counter TensorFlow's uint64 (s64 here: an
  // input of the graph or an earlier step's output), checked as node by node
  // (check_gen_mask_inputs); the mask (bool, the shape) an output of the graph or an arena
  // buffer live until its last reader, as a compiled step's output.
  rt::Status plan_gen_mask(size_t n, const std::vector<compiler::TensorDesc>& in,
                           const std::map<std::pair<int, int>, int>& output_of, Plan* plan,
                           std::vector<graph::PlannedBuffer>* buffers,
                           std::map<std::pair<int, int>, int>* buffer_of) const {
    const NpuGraphSpec::Node& node = m_spec.nodes[n];
    const auto fail = [&](const std::string& why) {
      return node_status(n, rt::StatusCode::invalid_argument, why);
    };
    if (node.inputs.size() != 4)
      return fail("it has " + std::to_string(node.inputs.size()) +
                  " inputs, not 4 (shape, key, counter, alg)");
    Step s;
    s.op.type = node.op;
    std::vector<int64_t> shape, alg;
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      compiler::TensorDesc d;
      Place p;
      const bool host = i == kGenMaskShapeInput || i == kGenMaskAlgInput;
      if (host) {
        const int c = node.inputs[i].host_const;
        if (c < 0) return fail("its input " + std::to_string(i) + " is not a constant");
        const Tensor t = host_tensor(m_spec.consts.at(static_cast<size_t>(c)));
        rt::Status st =
            t.valid() ? t.desc(&d) : rt::Status(rt::StatusCode::internal, "a host constant");
        if (st.ok())
          st = host_ints(kGenMaskOp, t, static_cast<int>(i),
                         i == kGenMaskShapeInput ? &shape : &alg);
        if (!st.ok()) return node_status(n, st.code(), st.message());
      } else {
        std::string why;
        if (!tensor_source(n, node.inputs[i], in, *plan, buffers, *buffer_of, &d, &p, &why))
          return fail("its input " + std::to_string(i) + " " + why);
        if (d.dtype != compiler::DataType::S64)
          return fail("its input " + std::to_string(i) + " is " + d.str() +
                      ", not TensorFlow's uint64 key or counter");
      }
      s.op.inputs.push_back(std::move(d));
      s.inputs.push_back(p);
    }
    GenMaskTask task;
    const auto dtype = node.attrs.find("dtype");
    const auto rate = node.attrs.find("rate");
    const std::string* type_name =
        dtype == node.attrs.end() ? nullptr : std::get_if<std::string>(&dtype->second);
    const std::optional<compiler::DataType> type =
        type_name ? compiler::data_type_from_name(*type_name) : std::nullopt;
    const double* rate_value =
        rate == node.attrs.end() ? nullptr : std::get_if<double>(&rate->second);
    if (!type || !rate_value) return fail("its dtype or rate attribute is missing");
    rt::Status st = gen_mask_uniform_type(to_tf_dtype(*type), &task.type);
    if (st.ok())
      st = check_gen_mask_inputs(shape, alg, s.op.inputs[kGenMaskKeyInput].num_elements(),
                                 s.op.inputs[kGenMaskCounterInput].num_elements(), &task.elements);
    if (!st.ok()) return node_status(n, st.code(), st.message());
    task.rate = static_cast<float>(*rate_value);
    s.gen_mask = task;
    s.ahead = s.inputs[kGenMaskKeyInput].kind == Place::Kind::input &&
              s.inputs[kGenMaskCounterInput].kind == Place::Kind::input;
    auto compiled = std::make_shared<CompiledOp>();
    const compiler::TensorDesc mask{compiler::DataType::BOOL, shape};
    compiled->kernel.outputs = {mask};
    if (const auto o = output_of.find({static_cast<int>(n), 0}); o != output_of.end()) {
      s.outputs.push_back({Place::Kind::output, static_cast<uint64_t>(o->second)});
      plan->outputs[static_cast<size_t>(o->second)] = mask;
    } else if (mask.bytes() > 0) {
      (*buffer_of)[{static_cast<int>(n), 0}] = static_cast<int>(buffers->size());
      s.outputs.push_back({Place::Kind::arena, buffers->size()});  // index until placed
      // Written ahead of every step (Step::ahead): live from the run's start.
      const int first = s.ahead ? 0 : static_cast<int>(n);
      buffers->push_back({node.name + ":0", compiler::device_buffer_bytes(mask.bytes()), first,
                          static_cast<int>(n), 0});
    } else {
      s.outputs.push_back({});
    }
    s.label = gen_mask_label(node.name, shape);
    s.compiled = std::move(compiled);
    plan->steps.push_back(std::move(s));
    return rt::ok_status();
  }

  rt::Status plan_view(size_t n, const std::vector<compiler::TensorDesc>& in,
                       const std::map<std::pair<int, int>, int>& output_of, Plan* plan,
                       std::vector<graph::PlannedBuffer>* buffers,
                       std::map<std::pair<int, int>, int>* buffer_of) const {
    const NpuGraphSpec::Node& node = m_spec.nodes[n];
    const auto fail = [&](const std::string& why) {
      return node_status(n, rt::StatusCode::invalid_argument, why);
    };
    if (node.inputs.empty() || (node.inputs[0].input < 0 && node.inputs[0].node < 0))
      return fail("its tensor input is no input of the graph and no earlier node's output");
    if (output_of.count({static_cast<int>(n), 0}))
      return fail("is an output of the graph, which a view cannot be");
    const NpuGraphSpec::Source& src = node.inputs[0];
    Step s;
    s.op.type = node.op;
    s.in_place = true;
    compiler::TensorDesc d;
    Place p;
    if (src.input >= 0) {
      d = in.at(static_cast<size_t>(src.input));
      p = {Place::Kind::input, static_cast<uint64_t>(src.input)};
    } else {
      const Step& from = plan->steps.at(static_cast<size_t>(src.node));
      if (src.port >= static_cast<int>(from.compiled->kernel.outputs.size()))
        return fail("reads output " + std::to_string(src.port) + " of '" + from.label->op_name +
                    "', which has fewer");
      d = from.compiled->kernel.outputs[static_cast<size_t>(src.port)];
      p = from.outputs[static_cast<size_t>(src.port)];
      const auto b = buffer_of->find({src.node, src.port});
      if (b != buffer_of->end()) {
        (*buffers)[static_cast<size_t>(b->second)].last = static_cast<int>(n);
        (*buffer_of)[{static_cast<int>(n), 0}] = b->second;
      }
    }
    // The Const input (Reshape's shape, ExpandDims' axis) as integers.
    std::vector<int64_t> values;
    if (node.op != "Squeeze" && node.op != "Bitcast") {
      if (node.inputs.size() != 2 || node.inputs[1].host_const < 0)
        return fail("its input 1 is not a constant");
      const NpuGraphSpec::HostConst& c =
          m_spec.consts.at(static_cast<size_t>(node.inputs[1].host_const));
      if (c.tf_dtype == TF_INT32) {
        for (size_t i = 0; i + 4 <= c.bytes.size(); i += 4) {
          int32_t v;
          std::memcpy(&v, c.bytes.data() + i, 4);
          values.push_back(v);
        }
      } else if (c.tf_dtype == TF_INT64) {
        for (size_t i = 0; i + 8 <= c.bytes.size(); i += 8) {
          int64_t v;
          std::memcpy(&v, c.bytes.data() + i, 8);
          values.push_back(v);
        }
      } else {
        return fail("its input 1 is " + tf_dtype_name(static_cast<TF_DataType>(c.tf_dtype)) +
                    ", not int32 or int64");
      }
    }
    compiler::TensorDesc out{d.dtype, {}};
    const int64_t rank = static_cast<int64_t>(d.shape.size());
    if (node.op == "Reshape") {
      int64_t known = 1, unknown = -1;
      for (size_t i = 0; i < values.size(); ++i) {
        if (values[i] == -1 && unknown < 0) {
          unknown = static_cast<int64_t>(i);
        } else if (values[i] < 0) {
          return fail("shape " + compiler::TensorDesc{d.dtype, values}.str() + " is invalid");
        } else {
          known *= values[i];
        }
      }
      out.shape = values;
      if (unknown >= 0 && known > 0 && d.num_elements() % known == 0)
        out.shape[static_cast<size_t>(unknown)] = d.num_elements() / known;
      else if (unknown >= 0 && !(known == 0 && d.num_elements() == 0))
        return fail("cannot reshape " + d.str() + " to " +
                    compiler::TensorDesc{d.dtype, values}.str());
      else if (unknown >= 0)
        out.shape[static_cast<size_t>(unknown)] = 0;
      if (out.num_elements() != d.num_elements())
        return fail("cannot reshape " + d.str() + " to " +
                    compiler::TensorDesc{d.dtype, values}.str());
    } else if (node.op == "ExpandDims") {
      if (values.size() != 1) return fail("its axis is not one value");
      const int64_t axis = values[0] < 0 ? values[0] + rank + 1 : values[0];
      if (axis < 0 || axis > rank)
        return fail("axis " + std::to_string(values[0]) + " is out of range for " + d.str());
      out.shape = d.shape;
      out.shape.insert(out.shape.begin() + axis, 1);
    } else if (node.op == "Bitcast") {  // the clustering takes only same-size types
      const auto it = node.attrs.find("type");
      const auto* name = it == node.attrs.end() ? nullptr : std::get_if<std::string>(&it->second);
      const auto type = name ? compiler::data_type_from_name(*name) : std::nullopt;
      if (!type || compiler::data_type_bytes(*type) != compiler::data_type_bytes(d.dtype))
        return fail("cannot bitcast " + d.str() + " to " +
                    (name ? *name : "a type the chip lacks") +
                    ": a view needs a type of the same size");
      out = {*type, d.shape};
    } else {  // Squeeze
      std::vector<int64_t> dims;
      const auto it = node.attrs.find("squeeze_dims");
      if (it != node.attrs.end())
        if (const auto* v = std::get_if<std::vector<int64_t>>(&it->second)) dims = *v;
      std::vector<char> drop(d.shape.size(), 0);
      for (int64_t a : dims) {
        const int64_t axis = a < 0 ? a + rank : a;
        if (axis < 0 || axis >= rank || d.shape[static_cast<size_t>(axis)] != 1)
          return fail("cannot squeeze dimension " + std::to_string(a) + " of " + d.str());
        drop[static_cast<size_t>(axis)] = 1;
      }
      for (size_t i = 0; i < d.shape.size(); ++i)
        if (!(dims.empty() ? d.shape[i] == 1 : drop[i])) out.shape.push_back(d.shape[i]);
    }
    s.op.inputs.push_back(d);
    s.inputs.push_back(p);
    auto compiled = std::make_shared<CompiledOp>();
    compiled->kernel.outputs = {out};
    s.outputs = {p};
    s.label = launch_label(node.name, s.op, compiled->kernel);
    s.compiled = std::move(compiled);
    plan->steps.push_back(std::move(s));
    return rt::ok_status();
  }

  // Places slices and concatenations in memory instead of running them (CompiledKernel's
  // view_offsets and concat_offsets; CANN's graph engine likewise emits no task for them):
  // - a slice (StridedSlice, Slice, Split, Unpack) whose every non-empty output (an arena
  //   buffer of this plan) is contiguous in its input gets its outputs' buffers inside its
  //   input (a graph input or output, or an arena buffer);
  // - a concatenation (Pack, ConcatV2) whose every non-empty input is an arena buffer of its
  //   own (written by one step of this plan, not already inside another place, not two inputs
  //   of it) gets those buffers inside its output (an arena buffer or a graph output): the
  //   producers write their pieces there.
  // (*within)[b] is where buffer b lies (kind arena: index is a buffer index, offset bytes into
  // it); its liveness joins that of the buffer it ends in. Safe because every place is written
  // by one step per run and nothing writes into its inputs: a slice's readers and a piece's
  // readers read bytes nobody overwrites; a piece's producer's tail write (device_buffer_bytes)
  // must stay inside its piece, and every piece and view must start on a kDeviceBufferAlign
  // boundary (as every buffer does), else the op runs as before.
  // The decode step of a keras-hub decoder slices the KV cache per layer and into K and V,
  // writes the new row (XlaDynamicUpdateSlice) and stacks K and V and then the layers again:
  // with batch 1 the slices are views of the cache and a stack whose inputs are written in the
  // same run holds them in place, so a step held in one run copies the cache once (each update
  // copies its slice) instead of five times (docs/llm.md, "KV cache in place").
  void place_in_place(Plan* plan, std::vector<graph::PlannedBuffer>* buffers,
                      std::vector<Place>* within) const {
    constexpr uint64_t kAlign = compiler::kDeviceBufferAlign;
    for (size_t n = 0; n < plan->steps.size(); ++n) {
      Step& s = plan->steps[n];
      const compiler::CompiledKernel& k = s.compiled->kernel;
      if (!k.view_offsets.empty()) {
        const size_t in = static_cast<size_t>(k.view_input);
        const Place src = in < s.inputs.size() ? s.inputs[in] : Place{};
        if (src.kind != Place::Kind::input && src.kind != Place::Kind::output &&
            src.kind != Place::Kind::arena)
          continue;
        bool all = k.view_offsets.size() == s.outputs.size();
        for (size_t j = 0; all && j < s.outputs.size(); ++j) {
          const bool empty = k.outputs[j].bytes() == 0;
          all = empty || (s.outputs[j].kind == Place::Kind::arena && k.view_offsets[j] >= 0 &&
                          static_cast<uint64_t>(k.view_offsets[j]) % kAlign == 0);
        }
        if (!all) continue;
        for (size_t j = 0; j < s.outputs.size(); ++j)
          if (s.outputs[j].kind == Place::Kind::arena)
            (*within)[s.outputs[j].index] = {src.kind, src.index,
                                             static_cast<uint64_t>(k.view_offsets[j])};
        s.in_place = true;
      } else if (!k.concat_offsets.empty() && k.outputs.size() == 1) {
        const Place dst = s.outputs[0];
        if (dst.kind != Place::Kind::arena && dst.kind != Place::Kind::output) continue;
        bool all = k.concat_offsets.size() == s.inputs.size();
        uint64_t end = 0;  // where the previous piece's tail write ends
        std::vector<uint64_t> pieces;
        for (size_t i = 0; all && i < s.inputs.size(); ++i) {
          const uint64_t bytes = s.op.inputs[i].bytes();
          if (bytes == 0) continue;
          const Place& p = s.inputs[i];
          const int64_t at = k.concat_offsets[i];
          all = at >= 0 && static_cast<uint64_t>(at) % kAlign == 0 &&
                static_cast<uint64_t>(at) >= end && p.kind == Place::Kind::arena && p.offset == 0 &&
                (*within)[p.index].kind == Place::Kind::none &&
                std::find(pieces.begin(), pieces.end(), p.index) == pieces.end();
          pieces.push_back(p.index);
          end = static_cast<uint64_t>(at) + compiler::device_buffer_bytes(bytes);
        }
        if (!all) continue;
        for (size_t i = 0; i < s.inputs.size(); ++i)
          if (s.op.inputs[i].bytes() > 0)
            (*within)[s.inputs[i].index] = {dst.kind, dst.index,
                                            static_cast<uint64_t>(k.concat_offsets[i])};
        s.in_place = true;
      }
    }
    // Each buffer placed inside an arena buffer extends that buffer's liveness.
    for (size_t b = 0; b < buffers->size(); ++b) {
      size_t root = b;
      while ((*within)[root].kind == Place::Kind::arena) root = (*within)[root].index;
      if (root == b || (*within)[root].kind != Place::Kind::none) continue;
      graph::PlannedBuffer& r = (*buffers)[root];
      r.first = std::min(r.first, (*buffers)[b].first);
      r.last = std::max(r.last, (*buffers)[b].last);
    }
  }

  // Step n's derived tensors that are a plain cast of one of its inputs (compose.cpp's
  // append_input_cast: one source, "<type> copy") read a tensor of this run that an earlier
  // step cast the same way (same source, type and shape, same cast program): the earlier step
  // computes it into an arena buffer live until this step, which reads it there and leaves its
  // own cast out. CANN's graph engine likewise casts a tensor once for all its readers. The
  // source is not rewritten in between: every buffer of the plan is written once per run, and
  // one read later is live until then. `keys` maps a cast to its first (step, derived tensor).
  void share_derived(size_t n, Plan* plan, std::vector<graph::PlannedBuffer>* buffers,
                     std::map<std::string, std::pair<int, int>>* keys) const {
    Step& s = plan->steps[n];
    const compiler::CompiledKernel& k = s.compiled->kernel;
    s.derived_at.assign(k.derived.size(), Place{});
    s.derived_from.assign(k.derived.size(), {-1, -1});
    for (size_t d = 0; d < k.derived.size(); ++d) {
      const compiler::DerivedTensor& t = k.derived[d];
      if (t.inputs.size() != 1 || t.bytes == 0 || t.what.find(" copy") == std::string::npos)
        continue;
      const size_t i = static_cast<size_t>(t.inputs[0]);
      const NpuGraphSpec::Source& src = m_spec.nodes[n].inputs.at(i);
      if (src.host_const >= 0 || s.op.inputs.at(i).bytes() == 0) continue;
      const std::string key = std::to_string(src.node) + ":" + std::to_string(src.port) + ":" +
                              std::to_string(src.input) + "|" + s.op.inputs[i].str() + "|" +
                              t.what + "|" + s.compiled->programs.at(t.launch)->name + "|" +
                              std::to_string(t.bytes);
      const auto [it, first] = keys->emplace(key, std::make_pair(static_cast<int>(n), int(d)));
      if (first) continue;
      const auto [from, from_d] = it->second;
      Place& at = plan->steps[static_cast<size_t>(from)].derived_at[static_cast<size_t>(from_d)];
      if (at.kind != Place::Kind::arena) {
        at = {Place::Kind::arena, buffers->size()};  // index until placed
        buffers->push_back({m_spec.nodes[static_cast<size_t>(from)].name + " " + t.what,
                            compiler::device_buffer_bytes(t.bytes), from, from, 0});
      }
      (*buffers)[at.index].last = static_cast<int>(n);
      s.derived_from[d] = it->second;
    }
  }

  // FusedVariableUpdate's attributes, as kernels_optimizer.cpp passes them to the compiler (so
  // both share one compiled op); its kernel class is no CompiledOpKernel.
  static const std::vector<AttrSpec>& variable_update_attrs(
      const std::vector<HostAttrInput>** host) {
    using K = AttrSpec::Kind;
    static const std::vector<AttrSpec> attrs = {{"T", K::kType},
                                                {"M", K::kInt},
                                                {"steps", K::kStrings},
                                                {"updates", K::kInts},
                                                {"members", K::kInt}};
    static const std::vector<HostAttrInput> none;
    *host = &none;
    return attrs;
  }

  rt::Status from_update_status(const DenseUpdateStatus& u) const {
    if (u.ok()) return rt::ok_status();
    TF_Status* tf = TF_NewStatus();
    TF_SetStatus(tf, u.code, u.message.c_str());
    rt::Status st = from_tf_status(tf, "NpuGraph '" + m_name + "'");
    TF_DeleteStatus(tf);
    return st;
  }

  std::string m_name;
  NpuGraphSpec m_spec;
  std::vector<int64_t> m_stable;
  std::vector<char> m_u64_inputs;  // per graph input: only a random step's key or counter
  bool m_marked = false;    // the graph optimizer gave the node kStableInputsAttr (StableInputs)
  int64_t m_variables = 0;  // V
  std::mutex m_mutex;
  std::map<std::string, std::shared_ptr<const Plan>> m_plans;  // by input signature
  ArenaPool m_arenas;  // declared last: destroyed first, while the plans live
};

void unknown_shapes(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeInferenceContextSetUnknownShape(ctx, status);
}

}  // namespace

bool npu_graph_clusterable_op(const std::string& op, std::vector<int>* host_inputs) {
  if (op == kGenMaskOp && gen_mask_registered()) {  // an AI CPU step (plan_gen_mask)
    *host_inputs = {kGenMaskShapeInput, kGenMaskAlgInput};
    return true;
  }
  const std::vector<HostAttrInput>* host = nullptr;
  if (!task_list_op_attrs(op, &host)) return false;
  host_inputs->clear();
  for (const HostAttrInput& h : *host) host_inputs->push_back(h.input);
  return true;
}

std::string compiler_type_name(int tf_dtype) {
  const auto t = from_tf_dtype(static_cast<TF_DataType>(tf_dtype));
  return t ? std::string(compiler::data_type_name(*t)) : std::string();
}

bool npu_graph_registered() { return g_registered; }

bool graph_mode_enabled() {
  const char* v = std::getenv("NPUSIM_GRAPH");
  return g_registered && !(v && std::string(v) == "0");
}

bool in_place_enabled() {
  const char* v = std::getenv("NPUSIM_GRAPH_IN_PLACE");
  return !(v && std::string(v) == "0");
}

bool graph_concurrent_enabled() {
  const char* v = std::getenv("NPUSIM_GRAPH_CONCURRENT");
  return v && std::string(v) == "1";
}

ControlFlowClustering graph_control_flow_clustering() {
  const char* v = std::getenv("NPUSIM_GRAPH_CONTROL_FLOW");
  const std::string value = v ? v : "";
  return value == "0"     ? ControlFlowClustering::off
         : value == "top" ? ControlFlowClustering::top
                          : ControlFlowClustering::all;
}

bool graph_updates_enabled() {
  const char* v = std::getenv("NPUSIM_GRAPH_UPDATES");
  return graph_mode_enabled() && !(v && std::string(v) == "0");
}

NpuGraphStats npu_graph_stats() {
  PlanFigures& f = plan_figures();
  std::lock_guard<std::mutex> lock(f.mutex);
  return {f.plans,       f.max_arena_bytes, f.max_unplanned_bytes, f.arena_allocations,
          f.arenas_held, f.arena_bytes_held};
}

rt::Status register_npu_graph_kernel() {
  rt::Status st = register_op_def({kNpuGraphOp,
                                   {"inputs: Tin", "variables: V * resource"},
                                   {"outputs: Tout"},
                                   {"Tin: list(type) >= 0", "Tout: list(type) >= 0",
                                    "V: int >= 0 = 0", "graph: string", "outputs_of: list(string)"},
                                   unknown_shapes,
                                   true});
  if (st.ok())
    st = register_kernel<NpuGraphKernel>(KernelDefBuilder(kNpuGraphOp).HostMemory("variables"));
  g_registered = st.ok();
  return st;
}

}  // namespace npusim::tf
