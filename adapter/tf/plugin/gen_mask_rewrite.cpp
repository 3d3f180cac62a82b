// Rewrite 18 (graph_fusion.h): a dropout's keep mask moved to the AI CPU, as CANN's graph
// engine and MindSpore give DropOutGenMask to the AI CPU (docs/graph_engine.md, "Dropout masks
// on the AI CPU"). TensorFlow's stateless dropout (Keras 3's Dropout) draws
//   u = StatelessRandomUniformV2(shape, key, counter, alg; dtype T)
//   [u = Mul(u, 1)] [u = AddV2(u, 0)]       (stateless_uniform's scaling to [0, 1), if left)
//   keep = GreaterEqual(u, rate)             (rate a scalar Const of type T)
// and this becomes DropOutGenMask(shape, key, counter, alg; dtype T, rate) in place of the
// GreaterEqual (name, device and control inputs kept; kernels_gen_mask.cpp): the same bits
// (the mask is computed from TF's uniform bits, and multiplying by 1 or adding 0 changes no
// value in [0, 1)), computed by the chip's AI CPU instead of a Philox kernel on the AI cores
// and a comparison. Every node taken must be on the NPU, of type T (float, half, bfloat16),
// read by the next alone, without control edges, and not preserved. NPUSIM_FUSION_GENMASK=0
// turns it alone off; it needs the op registered (gen_mask_registered) and an open device
// whose chip models an AI CPU (the config's `ai_cpu:` section; the 910's, not the 910B's).
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "adapter/tf/plugin/graph_fusion.h"
#include "adapter/tf/plugin/graph_view.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/plugin_device.h"

namespace npusim::tf {
namespace {

using namespace graph_edit;  // NOLINT: the rewrites' shared view (graph_view.h)

// The producer of data input i of n (any output port 0 node), or nullptr.
tfc::NodeDef* data_producer(GraphView& g, const tfc::NodeDef& n, int i) {
  if (i >= n.input_size()) return nullptr;
  const InputRef r = parse_input(n.input(i));
  return r.control || r.port != 0 ? nullptr : g.node(r.node);
}

// For a node of the scaling stateless_uniform may leave between the uniform and the comparison
// (Identity, Snapshot, Mul by 1, AddV2 / Add of 0, either operand the constant), of type t: the
// index of its data operand; -1 if it is none of those.
int passthrough_operand(GraphView& g, const tfc::NodeDef& n, tfc::DataType t) {
  if (type_attr(n) != t) return -1;
  if (n.op() == "Identity" || n.op() == "Snapshot") return 0;
  double neutral = 0;
  if (n.op() == "Mul")
    neutral = 1;
  else if (n.op() != "AddV2" && n.op() != "Add")
    return -1;
  for (int i = 0; i < 2; ++i) {
    const std::optional<double> v = scalar_value(data_producer(g, n, 1 - i));
    if (v && *v == neutral) return i;
  }
  return -1;
}

}  // namespace

bool gen_mask_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_GENMASK");
  return on;
}

int fuse_dropout_gen_masks(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                           std::set<std::string>* removed) {
  if (!gen_mask_registered()) return 0;
  const std::shared_ptr<rt::Device> device = device_if_open();
  if (!device || device->config().ai_cpu_cores <= 0) return 0;
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  for (int i = 0; i < g.size(); ++i) {
    tfc::NodeDef& ge = *g.at(i);
    if (ge.op() != "GreaterEqual" || !on_npu(ge) || rm.claimed(ge.name())) continue;
    const std::optional<tfc::DataType> t = type_attr(ge);
    if (!t || !float_type(*t)) continue;
    const tfc::NodeDef* rate_node = data_producer(g, ge, 1);
    const std::optional<double> rate = scalar_value(rate_node);
    if (!rate || type_attr(*rate_node, "dtype") != *t) continue;
    std::vector<const tfc::NodeDef*> taken;
    tfc::NodeDef* x = data_producer(g, ge, 0);
    while (x && rm.removable(*x, 1) && x->op() != "StatelessRandomUniformV2") {
      const int operand = passthrough_operand(g, *x, *t);
      if (operand < 0) break;
      taken.push_back(x);
      x = data_producer(g, *x, operand);
    }
    if (!x || x->op() != "StatelessRandomUniformV2" || !rm.removable(*x, 1) ||
        type_attr(*x, "dtype") != *t || x->input_size() != 4)
      continue;
    taken.push_back(x);
    std::map<std::string, tfc::AttrValue> attrs;
    attrs["dtype"] = type_value(*t);
    attrs["rate"].set_f(static_cast<float>(*rate));  // exact: a value of type t
    attrs["Tshape"] = type_value(type_attr(*x, "Tshape").value_or(tfc::DT_INT32));
    const std::vector<std::string> inputs(x->input().begin(), x->input().end());
    for (const tfc::NodeDef* n : taken) rm.remove(n->name());
    rewrite_as(ge, "DropOutGenMask", inputs, attrs);
    rm.claim(ge.name());
    ++fused;
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

}  // namespace npusim::tf
