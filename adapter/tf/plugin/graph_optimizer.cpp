// TF_InitGraph: a graph optimizer plugin (TensorFlow's grappler C API,
// tensorflow/c/experimental/grappler/grappler.h) that records the ops soft placement put on the
// CPU because the NPU has no kernel for them (cpu_fallbacks.h), then applies the inference
// fusions of graph_fusion.h to the NPU's nodes (NPUSIM_FUSION=0: none), under allow_mix_precision
// CANN's automatic mixed precision (mixed_precision.h), replaces connected sets
// of compiled NPU nodes by NpuGraph nodes run as whole graphs (npu_graph.h; NPUSIM_GRAPH=0:
// none), and marks the NPU nodes' inputs that are variable values or constants
// (stable_inputs.h).
//
// Why a graph optimizer: TensorFlow places a tf.function's graph (model.fit's train step is one)
// before grappler runs on it (ProcessFunctionLibraryRuntime: placer, then the meta-optimizer,
// then partitioning), and soft placement moves an op to the CPU without any callback a plugin
// could hook. The meta-optimizer runs every registered plugin optimizer on every function graph it
// optimizes, with each node's assigned device in NodeDef.device, so this optimizer sees where
// every node of every tf.function landed. Eager ops (outside any tf.function) never pass through
// grappler: they are not seen here (docs/tf_plugin.md, "CPU fallbacks").
//
// What counts as a fallback: a node assigned to the CPU, in a graph that also has NPU nodes other
// than its arguments and results (a graph entirely on the CPU is host code, e.g. a tf.data function
// or code under tf.device("/CPU:0")), for which TensorFlow's registry has no NPU kernel matching
// its attributes (FindKernelDef: the NPU's own kernels and DEVICE_DEFAULT ones), and that is not
// host-side by nature (is_host_side below). A node with an NPU kernel that still sits on the CPU
// was put there by an explicit device request or colocation, not by a missing kernel.
//
// The meta-optimizer passes each graph several times (meta_optimizer_iterations, default 2) with
// the same GrapplerItem; nodes are counted once per item id (GrapplerItem::id, the function's
// name for a function graph) and node name, so the counts are nodes of distinct function graphs,
// not executions.
//
// Like kernels_resource_variables.cpp this file is compiled against TensorFlow's C++ headers
// (GraphDef, FindKernelDef; all exported by libtensorflow_framework.so.2, included through
// tf_graph_headers.h) and includes no npusim header but the standard-library-only
// cpu_fallbacks.h, graph_fusion.h, mixed_precision.h and npu_graph.h.
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "adapter/tf/plugin/cpu_fallbacks.h"
#include "adapter/tf/plugin/graph_fusion.h"
#include "adapter/tf/plugin/host_cpu_time.h"
#include "adapter/tf/plugin/host_loop_condition.h"
#include "adapter/tf/plugin/launch_order.h"
#include "adapter/tf/plugin/mixed_precision.h"
#include "adapter/tf/plugin/npu_graph.h"
#include "adapter/tf/plugin/plugin_device.h"
#include "adapter/tf/plugin/stable_inputs.h"
#include "adapter/tf/plugin/tf_graph_headers.h"

namespace npusim::tf {
namespace {

namespace tfc = ::tensorflow;

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Whether the device's chip prices the DMA's issue (mte.copy_issue_cycles or mte.burst_cycles
// > 0, the 910b preset): rewrite 19b's default (block_conv_filters), since the blocked filters
// save the weight loads' issue (whole-fractal runs) while, with the keys at 0, the cast's
// blocked store costs more than the loads save (docs/graph_engine.md). The open device's
// config, else the chip the environment names (chip 0's with several); false where that does
// not load (the device's open then reports it).
bool chip_prices_dma_issue() {
  const auto priced = [](const ChipConfig& cfg) {
    return cfg.copy_issue_cycles > 0 || cfg.burst_cycles > 0;
  };
  if (const std::shared_ptr<rt::Device> device = device_if_open()) return priced(device->config());
  PluginSettings s;
  if (!settings_from_env(&s).ok()) return false;
  try {
    return priced(load_chip_config(s.chip, s.overrides));
  } catch (const std::exception&) {
    return false;
  }
}

// Assigned devices are full names: "/job:localhost/replica:0/task:0/device:CPU:0".
bool on_device_type(const std::string& device, const char* type) {
  return contains(device, (std::string("/device:") + type + ":").c_str());
}

// A function's arguments and results: they sit where the caller's tensors are.
bool is_arg_or_retval(const std::string& op) {
  return op == "_Arg" || op == "_Retval" || op == "_DeviceArg" || op == "_DeviceRetval";
}

// Ops that belong on the host whatever devices exist, so a CPU placement is not a fallback:
//  - function plumbing: _Arg/_Retval (and device variants), Send/Recv between partitions,
//    function calls (their bodies are graphs of their own, seen separately), NoOp;
//  - Const/HostConst on the host (constants feeding host-side ops);
//  - control flow (Switch/Merge/Enter/Exit/NextIteration/LoopCond, If/While/Case): they route
//    tensors, the work is in the ops they route to;
//  - the input pipeline: tf.data's datasets, iterators and optionals (a host-side queue;
//    IteratorGetNext hands the batch to the step);
//  - int32-only ops: TensorFlow keeps int32 tensors (shapes, indices) in host memory by
//    convention, and shape arithmetic (Shape, Prod, StridedSlice on int32 ...) runs on the host
//    for GPUs too (their int32 kernels are HostMemory CPU code).
bool is_host_side(const tfc::NodeDef& node) {
  static const std::set<std::string> kHostOps = {"_Arg",
                                                 "_Retval",
                                                 "_DeviceArg",
                                                 "_DeviceRetval",
                                                 "_Send",
                                                 "_Recv",
                                                 "_HostSend",
                                                 "_HostRecv",
                                                 "NoOp",
                                                 "Const",
                                                 "HostConst",
                                                 "Placeholder",
                                                 "PlaceholderWithDefault",
                                                 "PartitionedCall",
                                                 "StatefulPartitionedCall",
                                                 "Switch",
                                                 "RefSwitch",
                                                 "Merge",
                                                 "RefMerge",
                                                 "Enter",
                                                 "RefEnter",
                                                 "Exit",
                                                 "RefExit",
                                                 "NextIteration",
                                                 "RefNextIteration",
                                                 "LoopCond",
                                                 "ControlTrigger",
                                                 "If",
                                                 "StatelessIf",
                                                 "While",
                                                 "StatelessWhile",
                                                 "Case",
                                                 "StatelessCase"};
  const std::string& op = node.op();
  if (kHostOps.count(op)) return true;
  if (contains(op, "Dataset") || contains(op, "Iterator") || op.rfind("Optional", 0) == 0)
    return true;
  int types = 0, int32s = 0;
  for (const auto& [name, value] : node.attr()) {
    if (value.value_case() == tfc::AttrValue::kType) {
      ++types;
      int32s += value.type() == tfc::DT_INT32;
    } else if (value.value_case() == tfc::AttrValue::kList) {
      for (int t : value.list().type()) {
        ++types;
        int32s += t == tfc::DT_INT32;
      }
    }
  }
  return types > 0 && types == int32s;
}

bool has_npu_kernel(const tfc::NodeDef& node) {
  tfc::NodeDef probe = node;
  probe.set_device("");  // FindKernelDef checks attributes against the NPU's registrations only
  return tfc::FindKernelDef(tfc::DeviceType("NPU"), probe, nullptr, nullptr).ok();
}

// "AddV2 'Adam/add' (T=int64)": an example for the warning.
std::string describe(const tfc::NodeDef& node) {
  std::string types;
  for (const auto& [name, value] : node.attr()) {
    if (value.value_case() != tfc::AttrValue::kType) continue;
    types += (types.empty() ? "" : ", ") + name + "=" + tfc::DataTypeString(value.type());
  }
  return node.op() + " '" + node.name() + "'" + (types.empty() ? "" : " (" + types + ")");
}

// Nodes already counted, per GrapplerItem id (the meta-optimizer's iterations reuse the item);
// the last kItems ids are remembered.
class SeenNodes {
 public:
  // True the first time (item, node) is seen.
  bool first_time(const std::string& item, const std::string& node) {
    std::lock_guard<std::mutex> lock(m_mutex);
    auto it = m_items.find(item);
    if (it == m_items.end()) {
      if (m_order.size() >= kItems) {
        m_items.erase(m_order.front());
        m_order.pop_front();
      }
      m_order.push_back(item);
      it = m_items.emplace(item, std::set<std::string>()).first;
    }
    return it->second.insert(node).second;
  }

 private:
  static constexpr size_t kItems = 256;
  std::mutex m_mutex;
  std::map<std::string, std::set<std::string>> m_items;
  std::deque<std::string> m_order;
};

SeenNodes& seen_nodes() {
  static SeenNodes* s = new SeenNodes();
  return *s;
}

void record_fallbacks(const tfc::GraphDef& graph, const std::string& item) {
  bool any_npu = false;
  for (const tfc::NodeDef& node : graph.node())
    any_npu |= on_device_type(node.device(), "NPU") && !is_arg_or_retval(node.op());
  if (!any_npu) return;
  std::map<std::string, std::pair<int64_t, std::string>> found;  // op -> (nodes, example)
  for (const tfc::NodeDef& node : graph.node()) {
    if (!on_device_type(node.device(), "CPU") || is_host_side(node) || has_npu_kernel(node))
      continue;
    if (!seen_nodes().first_time(item, node.name())) continue;
    auto& f = found[node.op()];
    if (f.first++ == 0) f.second = describe(node);
  }
  for (const auto& [op, f] : found) record_cpu_fallback(op, f.first, f.second);
}

// TF_GrapplerItem is TensorFlow's grappler::GrapplerItem behind a C name (grappler.cc casts it).
// Items without an id (none seen in practice) fall back to their address.
std::string item_id(const TF_GrapplerItem* item) {
  const auto* cc_item = reinterpret_cast<const tfc::grappler::GrapplerItem*>(item);
  if (!cc_item->id.empty()) return cc_item->id;
  return "item@" + std::to_string(reinterpret_cast<uintptr_t>(item));
}

void free_buffer(void* data, size_t) { std::free(data); }

// NPUSIM_GRAPH_DUMP=DIR: writes each NPU graph the optimizer is given and returns, as binary
// GraphDef protobufs DIR/<item>.<pass>.<stage>.pb (item: the GrapplerItem id with '/' replaced;
// pass: the optimizer's calls in this process, counted from 0; stage: before or after), to see what
// the fusions were given and what they made of it. Best effort: a failed write is ignored.
void dump_graph(const tfc::GraphDef& graph, const std::string& item, int pass, const char* stage) {
  const char* dir = std::getenv("NPUSIM_GRAPH_DUMP");
  if (!dir || !*dir) return;
  bool any_npu = false;
  for (const tfc::NodeDef& node : graph.node()) any_npu |= on_device_type(node.device(), "NPU");
  if (!any_npu) return;
  std::string name = item;
  for (char& ch : name)
    if (ch == '/') ch = '_';
  const std::string path =
      std::string(dir) + "/" + name + "." + std::to_string(pass) + "." + stage + ".pb";
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    const std::string text = graph.SerializeAsString();
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
}

void log_fusion_error(const char* what) {
  std::fprintf(stderr, "npusim: graph fusion skipped: %s\n", what);
}

// Hands `length` bytes at `data` to TensorFlow as the optimizer's output.
bool set_output(TF_Buffer* out, const void* data, size_t length, TF_Status* status) {
  void* copy = std::malloc(length ? length : 1);
  if (!copy) {
    TF_SetStatus(status, TF_RESOURCE_EXHAUSTED, "npusim graph optimizer: out of host memory");
    return false;
  }
  if (length) std::memcpy(copy, data, length);
  out->data = copy;
  out->length = length;
  out->data_deallocator = free_buffer;
  return true;
}

// The producer of data input `input` ("name", "name:k"), through Identity and the shape ops
// that forward their input's buffer (Reshape, Squeeze, ExpandDims: Keras reshapes a batch
// norm's per-channel variables to [1, 1, 1, C] for a positive channel axis, and a convolution's
// bias to [1, C] and back); null if not in the graph.
const tfc::NodeDef* producer(const std::map<std::string, const tfc::NodeDef*>& nodes,
                             std::string input) {
  for (int depth = 0; depth < 16; ++depth) {
    const auto it = nodes.find(input.substr(0, input.find(':')));
    if (it == nodes.end()) return nullptr;
    const tfc::NodeDef* n = it->second;
    const std::string& op = n->op();
    if ((op != "Identity" && op != "Reshape" && op != "Squeeze" && op != "ExpandDims") ||
        n->input_size() == 0)
      return n;
    input = n->input(0);
  }
  return nullptr;
}

// Gives every NPU node with data inputs the attribute kStableInputsAttr: the positions of those
// inputs that are a variable's value (ReadVariableOp) or a constant, possibly none. Such a value
// is not rewritten between steps unless the variable is assigned, so the kernel keeps what it
// derives from it at once (derived_tensor_cache.h); what it derives from any other input it
// computes every run (StableInputs::marked: the step's launches follow from the graph, not from
// tensor addresses or thread timing). Returns the nodes whose attribute changed.
int mark_stable_inputs(tfc::GraphDef& graph) {
  std::map<std::string, const tfc::NodeDef*> nodes;
  for (const tfc::NodeDef& node : graph.node()) nodes[node.name()] = &node;
  int changed = 0;
  for (tfc::NodeDef& node : *graph.mutable_node()) {
    if (!on_device_type(node.device(), "NPU") || is_arg_or_retval(node.op())) continue;
    std::vector<int64_t> stable;
    int data_index = 0;
    for (const std::string& in : node.input()) {
      if (!in.empty() && in[0] == '^') continue;  // control inputs come last
      const tfc::NodeDef* p = producer(nodes, in);
      if (p && (p->op() == "ReadVariableOp" || p->op() == "Const")) stable.push_back(data_index);
      ++data_index;
    }
    if (data_index == 0) continue;
    tfc::AttrValue value;
    value.mutable_list();  // an empty list is a list too
    for (int64_t i : stable) value.mutable_list()->add_i(i);
    auto& attrs = *node.mutable_attr();
    const auto it = attrs.find(kStableInputsAttr);
    if (it != attrs.end() && it->second.SerializeAsString() == value.SerializeAsString()) continue;
    attrs[kStableInputsAttr] = value;
    ++changed;
  }
  return changed;
}

// Records the CPU fallbacks, takes the launch order's chain of an earlier call off
// (launch_order.h), applies the inference fusions (graph_fusion.h) and the mixed precision pass
// (mixed_precision.h), clusters the NPU nodes into NpuGraph nodes (npu_graph.h), marks the NPU
// nodes' stable inputs (the NpuGraph nodes' too), then chains each NPU's nodes in the canonical
// launch order; the output is the input unless one of them changed the graph.
void optimize(void*, const TF_Buffer* graph_buf, const TF_GrapplerItem* item,
              TF_Buffer* optimized_graph_buf, TF_Status* status) {
  TF_SetStatus(status, TF_OK, "");
  // The passes' CPU time (host_cpu_time.h); this scope keeps what no pass's own scope holds
  // (parsing, the fallbacks' records, dumps, serializing).
  HostCpuScope whole("graph_pass", "parse_and_serialize");
  static std::atomic<int> passes{0};
  const int pass = passes++;
  tfc::GraphDef graph;
  bool parsed = false;
  try {
    parsed = graph.ParseFromArray(graph_buf->data, static_cast<int>(graph_buf->length));
    if (parsed) record_fallbacks(graph, item_id(item));
    if (parsed) dump_graph(graph, item_id(item), pass, "before");
  } catch (const std::exception&) {
    // Counting is best effort.
  }
  bool changed = false;
  if (parsed) {
    try {
      // The chain of the optimizer's previous call on this graph comes off before the fusions
      // and the clustering, and goes on again after them (launch_order.h).
      HostCpuScope timed("graph_pass", "launch_order");
      const int unchained = unchain_npu_launches(graph);
      if (std::getenv("NPUSIM_FUSION_LOG") && unchained < 0)
        std::fprintf(stderr, "npusim: launch order in %s: the chain of an earlier call kept\n",
                     item_id(item).c_str());
      changed |= unchained > 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "npusim: launch order kept: %s\n", e.what());
    }
  }
  if (parsed && fusion_enabled()) {
    HostCpuScope timed("graph_pass", "fusion");
    tfc::GraphDef fused = graph;
    try {
      const auto* cc_item = reinterpret_cast<const tfc::grappler::GrapplerItem*>(item);
      const FusionCounts counts =
          fuse_npu_graph(fused, cc_item->NodesToPreserve(), first_type_error);
      if (std::getenv("NPUSIM_FUSION_LOG"))
        std::fprintf(
            stderr,
            "npusim: fusion in %s: %d training batch norms (%d ReluGrads folded "
            "in), %d BatchNormInference, %d Pads into convolutions "
            "(%d of them into "
            "Conv2DBatchNormInference, %d with a residual add, %d handing fp16 on), %d AddRelu, "
            "%d Conv2DBiasAdd / MatMulBiasAdd, %d FusedElementwise, %d FusedVariableUpdate (%d "
            "multi-tensor, %d Casts and %d scales folded in), %d duplicates, %d RmsNorm, "
            "%d SwiGlu, %d fused attention, %d RotaryPositionEmbedding (%d table "
            "duplicates), %d GeGlu, %d Gelu, %d LayerNorm, %d LayerNorm in training (with "
            "its gradient), %d WeightQuantBatchMatmulV2, %d "
            "Transposes folded into MatMuls, %d Lamb trust ratios, %d multi-tensor "
            "SquareSumV1, %d DropOutGenMask, %d AllFinite\n",
            item_id(item).c_str(), counts.training_batch_norm, counts.bn_relu_grad,
            counts.batch_norm, counts.conv_pad, counts.conv_batch_norm, counts.conv_residual,
            counts.half_handoffs, counts.add_relu, counts.bias_epilogue, counts.elementwise,
            counts.variable_update, counts.multi_tensor_update, counts.update_casts,
            counts.update_scales, counts.deduplicated, counts.rms_norm, counts.swiglu,
            counts.attention, counts.rope, counts.rope_tables, counts.geglu, counts.gelu,
            counts.layer_norm, counts.layer_norm_training, counts.weight_quant_matmul,
            counts.matmul_transposes, counts.lamb, counts.multi_square_sum, counts.gen_mask,
            counts.all_finite);
      if (counts.total() > 0) {
        graph.Swap(&fused);
        changed = true;
      }
    } catch (const std::exception& e) {
      // A graph the fusion cannot handle is left unfused.
      log_fusion_error(e.what());
    }
  }
  if (parsed) {
    // Keras mixed_float16's casts around the training batch norms (rewrite 0e), before the
    // mixed precision pass and the training fusions that follow it.
    HostCpuScope timed("graph_pass", "training_fusions");
    try {
      const auto* cc_item = reinterpret_cast<const tfc::grappler::GrapplerItem*>(item);
      const int halved = fold_bn_half_casts(graph, cc_item->NodesToPreserve());
      if (std::getenv("NPUSIM_FUSION_LOG") && halved > 0)
        std::fprintf(stderr, "npusim: fusion in %s: %d batch norms in float16 (their Casts gone)\n",
                     item_id(item).c_str(), halved);
      changed |= halved > 0;
      // The ReLUs that the Casts kept from rewrite 0 folded into those batch norms (rewrite 0f);
      // 0b and 0c below then take their gradients and residual adds as in float32 graphs.
      const int relus = fold_bn_relus(graph, cc_item->NodesToPreserve());
      if (std::getenv("NPUSIM_FUSION_LOG") && relus > 0)
        std::fprintf(stderr, "npusim: fusion in %s: %d Relus folded into BNTrainingUpdate\n",
                     item_id(item).c_str(), relus);
      changed |= relus > 0;
    } catch (const std::exception& e) {
      log_fusion_error(e.what());
    }
  }
  if (parsed && mixed_precision_requested()) {
    HostCpuScope timed("graph_pass", "mixed_precision");
    try {
      const auto* cc_item = reinterpret_cast<const tfc::grappler::GrapplerItem*>(item);
      const MixedPrecisionCounts counts =
          apply_mixed_precision(graph, cc_item->NodesToPreserve(), mixed_precision_lists(),
                                [](const tfc::NodeDef& node) { return has_npu_kernel(node); });
      if (std::getenv("NPUSIM_FUSION_LOG") && counts.total() > 0)
        std::fprintf(stderr,
                     "npusim: mixed precision in %s: %d nodes in float16, %d Casts, %d Consts "
                     "folded to float16, %d left float32 (no float16 kernel)\n",
                     item_id(item).c_str(), counts.half_nodes, counts.casts, counts.folded_consts,
                     counts.no_half_kernel);
      changed |= counts.total() > 0;
    } catch (const std::exception& e) {
      // A graph the pass cannot handle keeps float32 (allow_mix_precision's cube rounding).
      std::fprintf(stderr, "npusim: mixed precision skipped: %s\n", e.what());
    }
  }
  if (parsed) {
    HostCpuScope timed("graph_pass", "training_fusions");
    try {
      const auto* cc_item = reinterpret_cast<const tfc::grappler::GrapplerItem*>(item);
      // The ReLUs' gradients folded into the batch norms' (rewrite 0b), in the types the
      // mixed precision pass gave them, and those of rewrite 0f's ReLUs (fuse_npu_graph folded
      // the others without the mixed precision pass).
      const int folded = fold_bn_relu_grads(graph, cc_item->NodesToPreserve());
      if (std::getenv("NPUSIM_FUSION_LOG") && folded > 0)
        std::fprintf(stderr, "npusim: fusion in %s: %d ReluGrads folded into batch norms\n",
                     item_id(item).c_str(), folded);
      changed |= folded > 0;
      // The residual add and its ReLU in the batch norm (rewrite 0c), after 0b (which must not
      // take the ReLU it adds), in the types the mixed precision pass gave them.
      const int adds = fuse_bn_add_relus(graph, cc_item->NodesToPreserve());
      if (std::getenv("NPUSIM_FUSION_LOG") && adds > 0)
        std::fprintf(stderr, "npusim: fusion in %s: %d AddRelus into BNTrainingUpdate\n",
                     item_id(item).c_str(), adds);
      changed |= adds > 0;
      // A residual gradient sum and its ReluGrad as one pass (rewrite 16), after 0b.
      const int sums = fuse_add_n_relu_grads(graph, cc_item->NodesToPreserve());
      if (std::getenv("NPUSIM_FUSION_LOG") && sums > 0)
        std::fprintf(stderr, "npusim: fusion in %s: %d AddN + ReluGrad\n", item_id(item).c_str(),
                     sums);
      changed |= sums > 0;
      const int fused = fuse_conv_bn_reduces(graph, cc_item->NodesToPreserve());
      if (std::getenv("NPUSIM_FUSION_LOG") && fused > 0)
        std::fprintf(stderr, "npusim: fusion in %s: %d Conv2DBNTrainingReduce\n",
                     item_id(item).c_str(), fused);
      changed |= fused > 0;
      // The convolutions' bias gradients in the batch norms' x gradients (rewrite 0d).
      const int bias_grads = fuse_bn_bias_grads(graph, cc_item->NodesToPreserve());
      if (std::getenv("NPUSIM_FUSION_LOG") && bias_grads > 0)
        std::fprintf(stderr, "npusim: fusion in %s: %d BiasAddGrads in BNTrainingReduceGrad\n",
                     item_id(item).c_str(), bias_grads);
      changed |= bias_grads > 0;
      // The Casts the mixed precision pass put before the variable updates (rewrite 5c).
      const int casts = fold_update_casts(graph, cc_item->NodesToPreserve());
      if (std::getenv("NPUSIM_FUSION_LOG") && casts > 0)
        std::fprintf(stderr, "npusim: fusion in %s: %d Casts folded into variable updates\n",
                     item_id(item).c_str(), casts);
      changed |= casts > 0;
      // The weights' Casts the mixed precision pass put at the step's start (rewrite 19).
      const int multi_casts = group_weight_casts(graph, cc_item->NodesToPreserve());
      if (std::getenv("NPUSIM_FUSION_LOG") && multi_casts > 0)
        std::fprintf(stderr, "npusim: fusion in %s: %d MultiTensorCast\n",
                     item_id(item).c_str(), multi_casts);
      changed |= multi_casts > 0;
      // Their members that forward convolutions read, written blocked (rewrite 19b; by default
      // where the chip prices the DMA's issue).
      const int blocked = block_conv_filters(graph, chip_prices_dma_issue());
      if (std::getenv("NPUSIM_FUSION_LOG") && blocked > 0)
        std::fprintf(stderr, "npusim: fusion in %s: %d convolution filters blocked\n",
                     item_id(item).c_str(), blocked);
      changed |= blocked > 0;
    } catch (const std::exception& e) {
      log_fusion_error(e.what());
    }
  }
  if (parsed) {
    HostCpuScope timed("graph_pass", "host_loop_condition");
    try {
      const int labelled = label_host_loop_conditions(graph);
      if (std::getenv("NPUSIM_FUSION_LOG") && labelled > 0)
        std::fprintf(stderr, "npusim: %d loop-condition logical ops on the host in %s\n", labelled,
                     item_id(item).c_str());
      changed |= labelled > 0;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "npusim: loop conditions left on the chip: %s\n", e.what());
    }
  }
  if (parsed && graph_mode_enabled()) {
    HostCpuScope timed("graph_pass", "cluster");
    try {
      const auto* cc_item = reinterpret_cast<const tfc::grappler::GrapplerItem*>(item);
      const ClusterCounts counts = cluster_npu_graph(graph, cc_item->NodesToPreserve());
      if (std::getenv("NPUSIM_FUSION_LOG") && counts.clusters > 0)
        std::fprintf(stderr, "npusim: whole-graph execution in %s: %d NpuGraph nodes of %d nodes\n",
                     item_id(item).c_str(), counts.clusters, counts.nodes);
      changed |= counts.clusters > 0;
    } catch (const std::exception& e) {
      // A graph the clustering cannot handle runs node by node.
      std::fprintf(stderr, "npusim: whole-graph execution skipped: %s\n", e.what());
    }
  }
  if (parsed) {
    HostCpuScope timed("graph_pass", "stable_inputs");
    try {
      changed |= mark_stable_inputs(graph) > 0;
    } catch (const std::exception&) {
      // Marking is an optimisation: without it the kernels learn which inputs are stable.
    }
  }
  if (parsed && launch_order_enabled()) {
    HostCpuScope timed("graph_pass", "launch_order");
    try {
      const int edges = order_npu_launches(graph);
      if (std::getenv("NPUSIM_FUSION_LOG") && edges > 0)
        std::fprintf(stderr, "npusim: launch order in %s: %d control edges and loop Enters\n",
                     item_id(item).c_str(), edges);
      changed |= edges > 0;
    } catch (const std::exception& e) {
      // The graph then runs in the order TensorFlow's executor issues it.
      std::fprintf(stderr, "npusim: launch order skipped: %s\n", e.what());
    }
  }
  if (parsed) dump_graph(graph, item_id(item), pass, "after");
  if (changed) {
    const std::string out = graph.SerializeAsString();
    set_output(optimized_graph_buf, out.data(), out.size(), status);
    return;
  }
  set_output(optimized_graph_buf, graph_buf->data, graph_buf->length, status);
}

}  // namespace
}  // namespace npusim::tf

// TensorFlow calls this when the plugin is loaded as a pluggable device library. Every default
// grappler pass keeps its setting (TP_OptimizerConfigs left at TF_TriState_Default), except the
// arithmetic optimizer while the fusion is requested (graph_fusion.h) and the memory optimizer.
extern "C" __attribute__((visibility("default"))) void TF_InitGraph(
    TP_OptimizerRegistrationParams* params, TF_Status* status) {
  params->struct_size = TP_OPTIMIZER_REGISTRATION_PARAMS_STRUCT_SIZE;
  params->major_version = GO_MAJOR;
  params->minor_version = GO_MINOR;
  params->patch_version = GO_PATCH;
  params->device_type = "NPU";
  params->optimizer_configs->struct_size = TP_OPTIMIZER_CONFIGS_STRUCT_SIZE;
  // The arithmetic optimizer's add re-association would break the fusion's chains
  // (graph_fusion.h).
  if (npusim::tf::fusion_requested())
    params->optimizer_configs->arithmetic_optimization = TF_TriState_Off;
  // The memory optimizer's scheduling pass rewrites an AddN of large tensors into a TF1 reference
  // variable (TemporaryVariable, Assign, AssignAdd, DestroyTemporaryVariable) once its static
  // estimate of the graph's peak exceeds 80 % of the device memory; the NPU has no reference
  // variables, and the runtime's allocator plans its own memory.
  params->optimizer_configs->memory_optimization = TF_TriState_Off;
  params->optimizer->struct_size = TP_OPTIMIZER_STRUCT_SIZE;
  params->optimizer->create_func = nullptr;
  params->optimizer->optimize_func = npusim::tf::optimize;
  params->optimizer->destroy_func = nullptr;
  TF_SetStatus(status, TF_OK, "");
}
