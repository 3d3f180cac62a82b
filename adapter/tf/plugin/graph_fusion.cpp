// The inference fusions (graph_fusion.h says what is matched and when a chain is left alone).
//
// Built on TensorFlow's GraphDef protobuf classes (exported by libtensorflow_framework.so.2)
// like graph_optimizer.cpp; CMakeLists.txt compiles both with TensorFlow's -D flags and NDEBUG.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wsign-compare"
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#include "tensorflow/core/framework/attr_value.pb.h"
#include "tensorflow/core/framework/graph.pb.h"
#include "tensorflow/core/framework/node_def.pb.h"
#include "tensorflow/core/framework/tensor.pb.h"
#include "tensorflow/core/framework/tensor_shape.pb.h"
#include "tensorflow/core/framework/types.pb.h"
#pragma GCC diagnostic pop

#include "adapter/compiler/compiler.h"
#include "adapter/compiler/ops/conv.h"
#include "adapter/compiler/ops/fused_elementwise.h"
#include "adapter/tf/plugin/filter_layout.h"
#include "adapter/tf/plugin/graph_fusion.h"
#include "adapter/tf/plugin/graph_liveness.h"
#include "adapter/tf/plugin/graph_view.h"
#include "adapter/tf/plugin/host_cpu_time.h"
#include "adapter/tf/plugin/mixed_precision.h"
#include "adapter/tf/plugin/plugin_device.h"
#include "adapter/tf/plugin/tensor_names.h"
#include "common/numeric.h"

namespace npusim::tf {
namespace {

using namespace graph_edit;  // NOLINT: the rewrites' shared view (graph_view.h)

// `elements` integers from a TensorProto's repeated field (one value: a splat) or its
// tensor_content of `Int`s.
template <typename Int, typename Field>
std::optional<std::vector<int64_t>> tensor_ints(const tfc::TensorProto& t, const Field& field,
                                                int64_t elements) {
  std::vector<int64_t> v;
  if (field.size() > 0) {
    for (int64_t i = 0; i < elements; ++i)
      v.push_back(field.Get(static_cast<int>(std::min<int64_t>(i, field.size() - 1))));
    return v;
  }
  const int64_t bytes = elements * static_cast<int64_t>(sizeof(Int));
  if (t.tensor_content().empty()) return std::vector<int64_t>(elements, 0);  // TF's zeros
  if (static_cast<int64_t>(t.tensor_content().size()) != bytes) return std::nullopt;
  for (int64_t i = 0; i < elements; ++i) {
    Int x;
    std::memcpy(&x, t.tensor_content().data() + i * sizeof(Int), sizeof(Int));
    v.push_back(x);
  }
  return v;
}

// The values of an int32/int64 Const.
std::optional<std::vector<int64_t>> const_ints(const tfc::NodeDef& n) {
  if (n.op() != "Const") return std::nullopt;
  auto it = n.attr().find("value");
  if (it == n.attr().end() || it->second.value_case() != tfc::AttrValue::kTensor)
    return std::nullopt;
  const tfc::TensorProto& t = it->second.tensor();
  int64_t elements = 1;
  for (const auto& d : t.tensor_shape().dim()) elements *= d.size();
  if (t.dtype() == tfc::DT_INT32) return tensor_ints<int32_t>(t, t.int_val(), elements);
  if (t.dtype() == tfc::DT_INT64) return tensor_ints<int64_t>(t, t.int64_val(), elements);
  return std::nullopt;
}

// A per-channel parameter must run along x's last axis (the fused kernel applies it there):
// produced by anything but ExpandDims, or by a Reshape to [1, ..., 1, C] (Keras' reshape for a
// positive channel axis, e.g. keras.applications' axis=3); a known rank other than 1 of another
// producer is refused. Other shape mismatches fail at compile time, naming the input.
bool channel_vector(GraphView& g, const std::string& input) {
  const InputRef r = parse_input(input);
  const tfc::NodeDef* p = g.node(r.node);
  if (!p || p->op() == "ExpandDims") return false;
  if (p->op() == "Reshape") {
    const InputRef s = p->input_size() >= 2 ? parse_input(p->input(1)) : InputRef{};
    const tfc::NodeDef* shape = s.control || s.port != 0 ? nullptr : g.node(s.node);
    std::optional<std::vector<int64_t>> dims = shape ? const_ints(*shape) : std::nullopt;
    if (!dims || dims->empty()) return false;
    for (size_t d = 0; d + 1 < dims->size(); ++d)
      if ((*dims)[d] != 1) return false;
    return true;
  }
  auto it = p->attr().find("_output_shapes");
  if (it != p->attr().end() && r.port < it->second.list().shape_size()) {
    const tfc::TensorShapeProto& s = it->second.list().shape(r.port);
    if (!s.unknown_rank() && s.dim_size() != 1) return false;
  }
  return true;
}

// A list(type) attribute of `types`, in order.
tfc::AttrValue type_list_value(const std::vector<tfc::DataType>& types) {
  tfc::AttrValue v;
  v.mutable_list();  // an empty list is a list too
  for (tfc::DataType t : types) v.mutable_list()->add_type(t);
  return v;
}

// FusedElementwise's attributes (kernels_fused.cpp): the steps' type t, each input's type (Tin:
// t, or bool for a SelectV2 step's condition) and the steps.
std::map<std::string, tfc::AttrValue> fused_elementwise_attrs(
    tfc::DataType t, const std::vector<tfc::DataType>& input_types, const tfc::AttrValue& steps) {
  std::map<std::string, tfc::AttrValue> attrs;
  attrs["T"] = type_value(t);
  attrs["Tin"] = type_list_value(input_types);
  attrs["steps"] = steps;
  return attrs;
}

bool float_node(const tfc::NodeDef& n) { return type_attr(n) == tfc::DT_FLOAT; }

// A matched batch-norm chain, ending at add_1 (and relu, if fused).
struct BatchNormChain {
  tfc::NodeDef *add_1 = nullptr, *eps_const = nullptr;
  tfc::NodeDef *rsqrt = nullptr;   // Rsqrt(variance + epsilon)
  tfc::NodeDef *factor = nullptr;  // what x and mean are multiplied by: Mul(rsqrt, scale), or
                                   // the Rsqrt itself where the chain has no scale
  std::vector<tfc::NodeDef*> inner;  // add, rsqrt[, mul], mul_1, mul_2, sub
  std::string x, scale, offset, mean, variance, bias;  // scale empty: none (gamma = 1)
  float epsilon = 0;
};

// Matches the chain ending at AddV2 node add_1 (graph_fusion.h), without checking consumers.
// With `scale_optional`, also the chain without the Mul by scale that tf.nn.batch_normalization
// builds for scale=None (Keras' BatchNormalization(scale=False)): x and mean multiplied by the
// Rsqrt itself; the chain's scale is then empty.
std::optional<BatchNormChain> match_batch_norm(GraphView& g, tfc::NodeDef& add_1,
                                               bool scale_optional = false) {
  if (add_1.op() != "AddV2" || !float_node(add_1) || !on_npu(add_1)) return std::nullopt;
  for (int o = 0; o < 2; ++o) {
    tfc::NodeDef* mul_1 = g.producer(add_1, o, "Mul");
    tfc::NodeDef* sub = g.producer(add_1, 1 - o, "Sub");
    if (!mul_1 || !sub) continue;
    tfc::NodeDef* mul_2 = g.producer(*sub, 1, "Mul");
    if (!mul_2) continue;
    for (int j = 0; j < 2; ++j) {
      tfc::NodeDef* factor = g.producer(*mul_1, j, "Mul");
      if (!factor && scale_optional) factor = g.producer(*mul_1, j, "Rsqrt");
      if (!factor) continue;
      int k = GraphView::reads(*mul_2, 0, factor->name())   ? 0
              : GraphView::reads(*mul_2, 1, factor->name()) ? 1
                                                            : -1;
      if (k < 0) continue;
      const bool scaled = factor->op() == "Mul";
      for (int q = 0; q < (scaled ? 2 : 1); ++q) {
        tfc::NodeDef* rs = scaled ? g.producer(*factor, q, "Rsqrt") : factor;
        if (!rs) continue;
        tfc::NodeDef* add = g.producer(*rs, 0, "AddV2");
        if (!add) continue;
        for (int r = 0; r < 2; ++r) {
          tfc::NodeDef* eps = g.producer(*add, r, "Const");
          if (!eps) continue;
          std::optional<float> e = scalar_float_const(*eps);
          if (!e) continue;
          BatchNormChain c;
          c.add_1 = &add_1;
          c.eps_const = eps;
          c.rsqrt = rs;
          c.factor = factor;
          c.inner = {add, rs};
          if (scaled) c.inner.push_back(factor);
          c.inner.insert(c.inner.end(), {mul_1, mul_2, sub});
          c.x = mul_1->input(1 - j);
          if (scaled) c.scale = factor->input(1 - q);
          c.offset = sub->input(0);
          c.mean = mul_2->input(1 - k);
          c.variance = add->input(1 - r);
          c.epsilon = *e;
          for (const tfc::NodeDef* n : c.inner)
            if (!float_node(*n)) return std::nullopt;
          return c;
        }
      }
    }
  }
  return std::nullopt;
}

// "node" for output 0, "node:port" otherwise.
std::string output_name(const std::string& node, int port) {
  return port == 0 ? node : node + ":" + std::to_string(port);
}

// Data input i of n, read from output 0 of a node of any op.
tfc::NodeDef* input_node(GraphView& g, const tfc::NodeDef& n, int i) {
  if (i >= n.input_size()) return nullptr;
  const InputRef r = parse_input(n.input(i));
  return r.control || r.port != 0 ? nullptr : g.node(r.node);
}

// For a two-input node reading output 0 of `name` as one operand: the other operand's text.
std::optional<std::string> other_operand(const tfc::NodeDef& n, const std::string& name) {
  if (n.input_size() < 2) return std::nullopt;
  for (int i = 0; i < 2; ++i)
    if (GraphView::reads(n, i, name) && !parse_input(n.input(1 - i)).control) return n.input(1 - i);
  return std::nullopt;
}

// The single data consumer of `name` of type `op` on the NPU reading it as operand `input` (-1:
// any), other than `except`, if there is exactly one such consumer.
tfc::NodeDef* consumer_of(GraphView& g, const std::string& name, const char* op, int input = -1,
                          const tfc::NodeDef* except = nullptr) {
  tfc::NodeDef* found = nullptr;
  for (int i : g.consumer_indices(name)) {
    tfc::NodeDef* c = g.at(i);
    if (c == except || c->op() != op || !on_npu(*c)) continue;
    bool reads = false;
    for (int k = 0; k < c->input_size(); ++k)
      reads |= (input < 0 || input == k) && GraphView::reads(*c, k, name);
    if (!reads) continue;
    if (found && found != c) return nullptr;
    found = c;
  }
  return found;
}

// n is `op` (Mean or Sum) over axes [0, 1, 2] of an NHWC tensor with keep_dims. A gradient's
// Sum (unit_axes_dropped) may list fewer of them: grappler drops the axes it knows to be 1 (a
// batch of one), which autodiff's Sum over the broadcast axes of x's shape then reduces alike.
bool reduces_nhw(GraphView& g, const tfc::NodeDef* n, const char* op,
                 bool unit_axes_dropped = false) {
  if (!n || n->op() != op || !float_node(*n) || n->input_size() < 2) return false;
  auto k = n->attr().find("keep_dims");
  if (k == n->attr().end() || !k->second.b()) return false;
  const tfc::NodeDef* axes = input_node(g, *n, 1);
  std::optional<std::vector<int64_t>> v = axes ? const_ints(*axes) : std::nullopt;
  if (!v || v->empty()) return false;
  if (!unit_axes_dropped) return *v == std::vector<int64_t>{0, 1, 2};
  for (size_t i = 0; i < v->size(); ++i)
    if ((*v)[i] < 0 || (*v)[i] > 2 || (i > 0 && (*v)[i] <= (*v)[i - 1])) return false;
  return true;
}

// n is a float Const holding one element of value `value` (within rounding of f32).
bool scalar_const_is(const tfc::NodeDef* n, double value) {
  std::optional<float> v = n ? scalar_float_const(*n) : std::nullopt;
  return v && *v == static_cast<float>(value);
}

// Whether n is a Reshape to a constant shape.
bool const_reshape(GraphView& g, const tfc::NodeDef* n) {
  const tfc::NodeDef* shape = n && n->op() == "Reshape" ? input_node(g, *n, 1) : nullptr;
  return shape && shape->op() == "Const";
}

// n, or the first node under the Reshapes to constant shapes that produce it (Keras reshapes a
// batch norm's per-channel tensors between [C] and [1, 1, 1, C] for a positive channel axis);
// `nodes` gets those Reshapes.
tfc::NodeDef* under_reshapes(GraphView& g, tfc::NodeDef* n, std::vector<tfc::NodeDef*>* nodes) {
  for (int depth = 0; depth < 4 && const_reshape(g, n); ++depth) {
    nodes->push_back(n);
    n = input_node(g, *n, 0);
  }
  return n;
}

// The Mean gradient of v: Mul(Tile(Reshape(...Reshape(v)), multiples), 1/R) with constant shapes
// and multiples; returns the Tile's Mul or null. `nodes` gets the chain.
tfc::NodeDef* mean_grad(GraphView& g, const tfc::NodeDef& v, std::vector<tfc::NodeDef*>* nodes) {
  tfc::NodeDef* reshape = consumer_of(g, v.name(), "Reshape", 0);
  if (!const_reshape(g, reshape)) return nullptr;
  nodes->push_back(reshape);
  for (int depth = 0; depth < 3; ++depth) {
    tfc::NodeDef* next = consumer_of(g, reshape->name(), "Reshape", 0);
    if (!const_reshape(g, next) || g.consumers(reshape->name()) != 1) break;
    nodes->push_back(next);
    reshape = next;
  }
  tfc::NodeDef* tile = consumer_of(g, reshape->name(), "Tile", 0);
  if (!tile || !input_node(g, *tile, 1) || input_node(g, *tile, 1)->op() != "Const") return nullptr;
  tfc::NodeDef* mul = consumer_of(g, tile->name(), "Mul");
  if (!mul) return nullptr;
  std::optional<std::string> k = other_operand(*mul, tile->name());
  const tfc::NodeDef* kc = k ? g.node(parse_input(*k).node) : nullptr;
  if (!kc || kc->op() != "Const" || !scalar_float_const(*kc)) return nullptr;
  nodes->insert(nodes->end(), {tile, mul});
  return mul;
}

// Keras 3's BatchNormalization in training (tf.nn.moments, tf.nn.batch_normalization) and its
// gradient, as found: forward nodes, gradient nodes, and the tensors the fused ops read.
struct TrainingBatchNorm {
  BatchNormChain chain;
  tfc::NodeDef *mean = nullptr, *variance = nullptr, *last = nullptr;
  tfc::NodeDef *mean_c = nullptr, *variance_c = nullptr;  // the Squeezes to [C]
  tfc::NodeDef *dscale = nullptr, *dx = nullptr, *doffset = nullptr;
  // Under a loss scale, the product of diff_scale and a constant k the graph reads as the scale's
  // gradient (null: none): Mul(AddN, Mul(k, rsqrt)), where dscale is Mul(k, rsqrt).
  tfc::NodeDef* dscale_scaled = nullptr;
  std::string dscale_factor;  // k's input text
  bool relu = false;
  bool keeps_dims = false;             // the graph's per-channel gradients are [1, 1, 1, C]
  int64_t channels = 0;                // C, where the chain has no scale (a Const of ones is)
  std::string g;                       // the gradient arriving at the batch norm's output
  // x's other gradients, summed in dx beside the batch norm's three parts (in their order);
  // empty where x feeds the batch norm only.
  std::vector<std::string> dx_others;
  std::vector<tfc::NodeDef*> removed;  // every matched node but variance, last, dscale, dx
};

// The forward part around a BatchNormChain whose mean and variance are tf.nn.moments' Squeezed
// Means over [0, 1, 2] of its x.
bool match_training_forward(GraphView& g, TrainingBatchNorm* t) {
  const BatchNormChain& c = t->chain;
  std::vector<tfc::NodeDef*> reshapes;
  tfc::NodeDef* mean_c = under_reshapes(g, g.node(c.mean), &reshapes);
  tfc::NodeDef* var_c = under_reshapes(g, g.node(c.variance), &reshapes);
  if (!mean_c || !var_c || parse_input(c.mean).port || parse_input(c.variance).port ||
      mean_c->op() != "Squeeze" || var_c->op() != "Squeeze")
    return false;
  tfc::NodeDef* mean = input_node(g, *mean_c, 0);
  tfc::NodeDef* var = input_node(g, *var_c, 0);
  if (!reduces_nhw(g, mean, "Mean") || !reduces_nhw(g, var, "Mean") || mean->input(0) != c.x)
    return false;
  tfc::NodeDef* sqd = input_node(g, *var, 0);
  std::optional<std::string> sx =
      sqd && sqd->op() == "SquaredDifference" ? other_operand(*sqd, mean->name()) : std::nullopt;
  if (!sx || *sx != c.x || !float_node(*sqd)) return false;
  t->mean = mean;
  t->variance = var;
  t->mean_c = mean_c;
  t->variance_c = var_c;
  t->last = c.add_1;
  if (tfc::NodeDef* r = g.only_consumer(c.add_1->name());
      r && r->op() == "Relu" && on_npu(*r) && float_node(*r) &&
      GraphView::reads(*r, 0, c.add_1->name())) {
    t->last = r;
    t->relu = true;
  }
  t->removed = {mean, sqd, mean_c, var_c};
  t->removed.insert(t->removed.end(), reshapes.begin(), reshapes.end());
  t->removed.insert(t->removed.end(), c.inner.begin(), c.inner.end());
  if (t->relu) t->removed.push_back(c.add_1);
  return true;
}

// The gradient TensorFlow's autodiff builds for it (after grappler's constant folding), given
// the forward match: see graph_fusion.h for the nodes.
bool match_training_grad(GraphView& g, TrainingBatchNorm* t) {
  const BatchNormChain& c = t->chain;
  tfc::NodeDef *rs = c.rsqrt, *bmul = c.factor;
  const std::string& x = c.x;
  const bool scaled = !c.scale.empty();
  tfc::NodeDef* rsqrt_grad = consumer_of(g, rs->name(), "RsqrtGrad", 0);
  tfc::NodeDef* drs = rsqrt_grad ? input_node(g, *rsqrt_grad, 1) : nullptr;
  if (!drs) return false;
  std::vector<tfc::NodeDef*> grad;
  tfc::NodeDef *dscale = nullptr, *dbmul = nullptr;
  if (scaled) {
    // d/d rsqrt: RsqrtGrad(rs, Mul(AddN(...), scale)); d scale: Mul(AddN, rs).
    dscale = consumer_of(g, rs->name(), "Mul", -1, bmul);
    if (drs->op() != "Mul" || !dscale || dscale == bmul) return false;
    std::optional<std::string> dbmul_s = other_operand(*dscale, rs->name());
    // A loss scale (the optimizer multiplying every gradient by a constant k = 1 / loss scale)
    // that grappler's constant folding pushed into dscale: Mul(Mul(AddN, rs), k) became
    // Mul(AddN, Mul(k, rs)), whose inner product is read by nothing else.
    const tfc::NodeDef* factor = dbmul_s ? g.node(parse_input(*dbmul_s).node) : nullptr;
    if (factor && factor->op() == "Const" && scalar_float_const(*factor)) {
      t->dscale_scaled = g.only_consumer(dscale->name());
      if (!t->dscale_scaled || t->dscale_scaled->op() != "Mul" || !float_node(*t->dscale_scaled))
        return false;
      t->dscale_factor = *dbmul_s;
      dbmul_s = other_operand(*t->dscale_scaled, dscale->name());
    }
    dbmul = dbmul_s ? g.node(*dbmul_s) : nullptr;
    if (!dbmul || other_operand(*drs, dbmul->name()) != c.scale) return false;
    grad = {rsqrt_grad, drs};
  } else {
    // No scale (gamma = 1): RsqrtGrad(rs, AddN(...)) directly, and no scale gradient; the
    // RsqrtGrad becomes BNTrainingUpdateGrad (its diff_scale read by BNTrainingReduceGrad only).
    dbmul = drs;
    dscale = rsqrt_grad;
  }
  if (dbmul->op() != "AddN" || dbmul->input_size() != 2) return false;
  // AddN([Reshape](Sum(Mul(x, g))), Mul(Neg(dbeta), mean))
  grad.push_back(dbmul);
  tfc::NodeDef *sum_xg = nullptr, *neg_mean = nullptr;
  bool keeps_dims = false;  // the per-channel gradients are [1, 1, 1, C] (no Reshape to [C])
  for (int i = 0; i < 2 && !sum_xg; ++i) {
    tfc::NodeDef* b = input_node(g, *dbmul, 1 - i);
    std::vector<tfc::NodeDef*> reshapes;
    tfc::NodeDef* a = under_reshapes(g, input_node(g, *dbmul, i), &reshapes);
    if (a && b && a->op() == "Sum" && b->op() == "Mul") {
      sum_xg = a;
      neg_mean = b;
      keeps_dims = reshapes.empty();
      grad.insert(grad.end(), reshapes.begin(), reshapes.end());
    }
  }
  tfc::NodeDef* xg = sum_xg ? input_node(g, *sum_xg, 0) : nullptr;
  if (!reduces_nhw(g, sum_xg, "Sum", true) || !xg || xg->op() != "Mul") return false;
  std::optional<std::string> gs = other_operand(*xg, parse_input(x).node);
  if (parse_input(x).port || !gs) return false;
  t->g = *gs;
  std::optional<std::string> neg_s = other_operand(*neg_mean, parse_input(c.mean).node);
  tfc::NodeDef* neg = neg_s ? g.node(*neg_s) : nullptr;
  tfc::NodeDef* dbeta = neg && neg->op() == "Neg" ? input_node(g, *neg, 0) : nullptr;
  tfc::NodeDef* sum_g = dbeta ? under_reshapes(g, dbeta, &grad) : nullptr;
  if (!reduces_nhw(g, sum_g, "Sum", true) || sum_g->input(0) != t->g) return false;
  // dx = AddN(Mul(g, bmul), mean grad of Mul(Neg, bmul), Mul(Mul(2, mean grad of RsqrtGrad),
  //      Sub(x, mean)))
  grad.insert(grad.end(), {sum_xg, xg, neg_mean, neg, sum_g});
  tfc::NodeDef* dmean = consumer_of(g, neg->name(), "Mul", -1, neg_mean);
  tfc::NodeDef* dx_mean = nullptr;
  if (!dmean || other_operand(*dmean, bmul->name()) != neg->name() ||
      !(dx_mean = mean_grad(g, *dmean, &grad)))
    return false;
  tfc::NodeDef* dvar = mean_grad(g, *rsqrt_grad, &grad);
  tfc::NodeDef* two_dvar = dvar ? consumer_of(g, dvar->name(), "Mul") : nullptr;
  std::optional<std::string> two_s =
      two_dvar ? other_operand(*two_dvar, dvar->name()) : std::nullopt;
  tfc::NodeDef* two = two_s ? g.node(parse_input(*two_s).node) : nullptr;
  if (!scalar_const_is(two, 2.0)) return false;
  tfc::NodeDef* dx_var = consumer_of(g, two_dvar->name(), "Mul");
  std::optional<std::string> xm_s =
      dx_var ? other_operand(*dx_var, two_dvar->name()) : std::nullopt;
  tfc::NodeDef* xm = xm_s ? g.node(*xm_s) : nullptr;
  if (!xm || xm->op() != "Sub" || !GraphView::reads(*xm, 0, parse_input(x).node) ||
      !GraphView::reads(*xm, 1, t->mean->name()))
    return false;
  tfc::NodeDef* dx_scale = nullptr;
  for (int i : g.consumer_indices(bmul->name())) {
    tfc::NodeDef* n = g.at(i);
    if (n->op() == "Mul" && other_operand(*n, bmul->name()) == t->g) dx_scale = n;
  }
  tfc::NodeDef* dx = dx_scale ? g.only_consumer(dx_scale->name()) : nullptr;
  if (!dx || dx->op() != "AddN" || dx->input_size() < 3) return false;
  // x's AddN: the three parts, each once, and x's other gradients if any (x read besides the
  // batch norm: a pre-activation block's identity shortcut, ResNet50V2's preact_bn).
  const std::set<std::string> parts = {dx_scale->name(), dx_mean->name(), dx_var->name()};
  std::multiset<std::string> found;
  t->dx_others.clear();
  for (int i = 0; i < dx->input_size(); ++i) {
    const std::string& in = dx->input(i);
    if (parse_input(in).control) continue;
    if (parts.count(in))
      found.insert(in);
    else
      t->dx_others.push_back(in);
  }
  if (parts.size() != 3 || found.size() != 3 ||
      std::set<std::string>(found.begin(), found.end()) != parts)
    return false;
  grad.insert(grad.end(), {dmean, two_dvar, xm, dx_var, dx_scale});
  if (two->input_size() > 0 || g.consumers(two->name()) == 1) grad.push_back(two);
  for (tfc::NodeDef* n : grad)
    if (n != two && !float_node(*n)) return false;
  if (!float_node(*dscale) || !float_node(*dx)) return false;
  // The fused diff_scale and diff_offset are [C]: where the graph's were [1, 1, 1, C], they may
  // only feed Reshapes (Keras' back to the variables' [C]); so may the scaled diff_scale.
  // Without a scale, the graph has no scale gradient (dscale's readers are matched nodes).
  t->keeps_dims = keeps_dims;
  if (keeps_dims)
    for (const tfc::NodeDef* n : {t->dscale_scaled ? t->dscale_scaled : dscale, dbeta})
      for (int i : g.consumer_indices(n->name()))
        if ((scaled || n == dbeta) && g.at(i) != neg && g.at(i)->op() != "Reshape") return false;
  t->dscale = dscale;
  t->dx = dx;
  t->doffset = dbeta;
  t->removed.insert(t->removed.end(), grad.begin(), grad.end());
  return true;
}

// Whether the matched nodes can go: on the NPU, not preserved or claimed, every data and
// control consumer among the matched nodes (except the forward's Squeezes and dbeta, whose
// other consumers are rewired to the fused outputs), control inputs only from matched nodes,
// and the kept nodes (variance, last, dscale, dx, the scaled dscale's product) without control
// inputs from removed ones.
bool training_removable(GraphView& g, const TrainingBatchNorm& t, const Removal& rm,
                        const std::unordered_set<std::string>& preserve) {
  std::set<std::string> region;
  for (const tfc::NodeDef* n : t.removed) region.insert(n->name());
  if (region.size() != t.removed.size()) return false;  // a node matched twice
  std::set<std::string> kept = {t.variance->name(), t.last->name(), t.dscale->name(), t.dx->name()};
  if (t.dscale_scaled) kept.insert(t.dscale_scaled->name());
  if (kept.size() != (t.dscale_scaled ? 5u : 4u)) return false;
  for (const std::string& k : kept)
    if (region.count(k) || rm.claimed(k) || !on_npu(*g.node(k))) return false;
  // variance and dscale change shape ([1, 1, 1, C] -> [C]) or value (dscale where the scaled
  // product reads it): not if a fetch reads them as such; nor the scaled product where the
  // graph's was [1, 1, 1, C].
  if (preserve.count(t.variance->name()) || preserve.count(t.dscale->name()) ||
      (t.dscale_scaled && t.keeps_dims && preserve.count(t.dscale_scaled->name())))
    return false;
  const std::set<std::string> rewired = {t.mean_c->name(), t.variance_c->name(), t.doffset->name()};
  std::set<std::string> inside = region;
  inside.insert(kept.begin(), kept.end());
  for (const tfc::NodeDef* n : t.removed) {
    if (!on_npu(*n) && n->op() != "Const") return false;
    if (preserve.count(n->name()) || rm.claimed(n->name())) return false;
    if (!rewired.count(n->name()))
      for (int i : g.consumer_indices(n->name()))
        if (!inside.count(g.at(i)->name())) return false;
    for (const std::string& in : n->input()) {
      const InputRef r = parse_input(in);
      if (r.control && !region.count(r.node)) return false;
    }
  }
  // Control edges out of removed nodes: only into removed nodes.
  for (int i = 0; i < g.size(); ++i) {
    const tfc::NodeDef& n = *g.at(i);
    if (region.count(n.name())) continue;
    for (const std::string& in : n.input()) {
      const InputRef r = parse_input(in);
      if (r.control && region.count(r.node)) return false;
    }
  }
  // The variance Mean's only consumer is its Squeeze (it becomes BNTrainingReduce).
  return g.consumers(t.variance->name()) == 1;
}

// Data inputs reading output 0 of a node in `rewire` (its keys) read the value instead, in every
// node not in `removed`.
void rewire_readers(tfc::GraphDef& graph, const std::set<std::string>& removed,
                    const std::unordered_map<std::string, std::string>& rewire) {
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& n = *graph.mutable_node(i);
    if (removed.count(n.name())) continue;
    for (int k = 0; k < n.input_size(); ++k) {
      const InputRef r = parse_input(n.input(k));
      auto it = r.control || r.port ? rewire.end() : rewire.find(r.node);
      if (it != rewire.end()) n.set_input(k, it->second);
    }
  }
}

std::vector<int64_t> variable_shape(GraphView& g, const std::string& in);  // below
tfc::NodeDef* add_node(tfc::GraphDef& graph, const std::string& name, const char* op,
                       const std::string& device, const std::vector<std::string>& inputs,
                       const std::map<std::string, tfc::AttrValue>& attrs);  // below

// The channel count C of a per-channel parameter read as `in`: a variable's value of static
// shape [C] (variable_shape), directly or through a Reshape to a constant [1, ..., 1, C] (Keras'
// reshape for a positive channel axis); 0 when unknown.
int64_t channel_count(GraphView& g, const std::string& in) {
  const InputRef r = parse_input(in);
  const tfc::NodeDef* n = r.control || r.port ? nullptr : g.node(r.node);
  std::string value = in;
  if (n && const_reshape(g, n)) value = n->input(0);
  const std::vector<int64_t> shape = variable_shape(g, value);
  return shape.size() == 1 ? shape[0] : 0;
}

// A float Const [c] of ones on `device`, named `name`: the scale of a batch norm without one.
std::string add_ones(tfc::GraphDef& graph, const std::string& name, const std::string& device,
                     int64_t c) {
  tfc::AttrValue value;
  tfc::TensorProto* t = value.mutable_tensor();
  t->set_dtype(tfc::DT_FLOAT);
  t->mutable_tensor_shape()->add_dim()->set_size(c);
  for (int64_t i = 0; i < c; ++i) t->add_float_val(1.0f);
  tfc::NodeDef* n = graph.add_node();
  n->set_name(name);
  n->set_op("Const");
  n->set_device(device);
  (*n->mutable_attr())["dtype"] = type_value(tfc::DT_FLOAT);
  (*n->mutable_attr())["value"] = value;
  return name;
}

int fuse_training_batch_norms(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                              std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  std::vector<TrainingBatchNorm> found;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& add_1 = *graph.mutable_node(i);
    if (rm.claimed(add_1.name())) continue;
    std::optional<BatchNormChain> c = match_batch_norm(g, add_1, /*scale_optional=*/true);
    if (!c) continue;
    TrainingBatchNorm t;
    t.chain = *c;
    if (c->scale.empty()) t.channels = channel_count(g, c->offset);
    if (!match_training_forward(g, &t) || !match_training_grad(g, &t) ||
        !training_removable(g, t, rm, preserve) ||
        (c->scale.empty() ? t.channels == 0 : !channel_vector(g, c->scale)) ||
        !channel_vector(g, c->offset))
      continue;
    for (tfc::NodeDef* n : t.removed) rm.remove(n->name());
    for (tfc::NodeDef* n : {t.variance, t.last, t.dscale, t.dx}) rm.claim(n->name());
    if (t.dscale_scaled) rm.claim(t.dscale_scaled->name());
    found.push_back(std::move(t));
  }
  // Consumers outside the region of the Squeezes and of dbeta read the fused outputs.
  std::unordered_map<std::string, std::string> rewire;
  for (const TrainingBatchNorm& t : found) {
    rewire[t.mean_c->name()] = output_name(t.last->name(), 1);
    rewire[t.variance_c->name()] = output_name(t.last->name(), 2);
    rewire[t.doffset->name()] = output_name(t.dscale->name(), 1);
  }
  rewire_readers(graph, rm.removed(), rewire);
  // The BNTrainingReduceGrads of their own (x with other gradients), added after the rewrites.
  struct NewNode {
    std::string name, device;
    std::vector<std::string> inputs;
    std::map<std::string, tfc::AttrValue> attrs;
  };
  std::vector<NewNode> added;
  for (TrainingBatchNorm& t : found) {
    const BatchNormChain& c = t.chain;
    tfc::AttrValue eps, relu;
    eps.set_f(c.epsilon);
    relu.set_b(t.relu);
    const tfc::AttrValue f32 = type_value(tfc::DT_FLOAT);
    const std::string reduce = t.variance->name(), update = t.last->name(),
                      dscale = t.dscale->name();
    // Without a scale (gamma = 1), the fused ops read a Const of ones as theirs: x * rsqrt is
    // x * (rsqrt * 1), bit for bit.
    const std::string scale =
        c.scale.empty() ? add_ones(graph, update + "/npusim_ones", t.last->device(), t.channels)
                        : c.scale;
    rewrite_as(*t.variance, "BNTrainingReduce", {c.x}, {{"T", f32}});
    rewrite_as(*t.last, "BNTrainingUpdate",
               {c.x, output_name(reduce, 0), output_name(reduce, 1), scale, c.offset},
               {{"T", f32}, {"epsilon", eps}, {"relu", relu}});
    rewrite_as(*t.dscale, "BNTrainingUpdateGrad",
               {t.g, c.x, output_name(update, 1), output_name(update, 2)},
               {{"T", f32}, {"epsilon", eps}});
    // The loss scale stays: the scaled product reads diff_scale (k * (AddN * rsqrt), the
    // graph's k * rsqrt * AddN reassociated).
    if (t.dscale_scaled)
      rewrite_as(*t.dscale_scaled, "Mul", {output_name(dscale, 0), t.dscale_factor}, {{"T", f32}});
    const std::vector<std::string> reduce_grad_in = {
        t.g, c.x, output_name(dscale, 0), output_name(dscale, 1), scale, output_name(update, 1),
        output_name(update, 2)};
    const std::map<std::string, tfc::AttrValue> reduce_grad_attrs = {{"T", f32}, {"epsilon", eps}};
    if (t.dx_others.empty()) {
      rewrite_as(*t.dx, "BNTrainingReduceGrad", reduce_grad_in, reduce_grad_attrs);
    } else {
      // x has other gradients: the BNTrainingReduceGrad is a node of its own, the AddN (its
      // name kept) sums it and them.
      const std::string reduce_grad = t.dx->name() + "/npusim_bn_reduce_grad";
      added.push_back({reduce_grad, t.dx->device(), reduce_grad_in, reduce_grad_attrs});
      std::vector<std::string> sum = {reduce_grad};
      sum.insert(sum.end(), t.dx_others.begin(), t.dx_others.end());
      std::map<std::string, tfc::AttrValue> add_attrs = {{"T", f32}};
      add_attrs["N"].set_i(static_cast<int64_t>(sum.size()));
      rewrite_as(*t.dx, "AddN", sum, add_attrs);
    }
  }
  for (const NewNode& n : added)
    add_node(graph, n.name, "BNTrainingReduceGrad", n.device, n.inputs, n.attrs);
  removed->insert(rm.removed().begin(), rm.removed().end());
  return static_cast<int>(found.size());
}

// ---- Rewrite 0b: the ReLU's gradient folded into rewrite 0's gradients (graph_fusion.h) ----

// Whether input i of n reads output `port` of node `name` (a data edge).
bool reads_output(const tfc::NodeDef& n, int i, const std::string& name, int port) {
  if (i >= n.input_size()) return false;
  const InputRef r = parse_input(n.input(i));
  return !r.control && r.node == name && r.port == port;
}

// BNTrainingUpdate's residual attribute R (0 when absent): 1 where rewrite 0c added
// the residual, whose ReLU then follows the add (y is not x * a + shift).
bool has_residual(const tfc::NodeDef& update) {
  auto it = update.attr().find("R");
  return it != update.attr().end() && it->second.i() != 0;
}

// ReluGrad(g, y) with y = output 0 of a BNTrainingUpdate(relu = true) whose gradients (rewrite
// 0's BNTrainingUpdateGrad and BNTrainingReduceGrad of the same x and statistics) are the
// ReluGrad's only two consumers: both read g and take it back through the ReLU themselves
// (relu = true, with the fold's scale and offset as extra inputs); the ReluGrad goes.
int fuse_bn_relu_grads(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                       std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  struct Fold {
    tfc::NodeDef *relu_grad, *update, *update_grad, *reduce_grad;
  };
  std::vector<Fold> found;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& ug = *graph.mutable_node(i);
    if (ug.op() != "BNTrainingUpdateGrad" || ug.input_size() < 4 || !on_npu(ug)) continue;
    if (auto r = ug.attr().find("relu"); r != ug.attr().end() && r->second.b()) continue;
    // float, or half after allow_mix_precision's pass (all four ops of one type)
    const std::optional<tfc::DataType> t = type_attr(ug);
    if (t != tfc::DT_FLOAT && t != tfc::DT_HALF) continue;
    tfc::NodeDef* rg = g.producer(ug, 0, "ReluGrad");
    if (!rg || type_attr(*rg) != t || rg->input_size() < 2 || !rm.removable(*rg, 2)) continue;
    const InputRef y = parse_input(rg->input(1));
    tfc::NodeDef* update = y.control || y.port != 0 ? nullptr : g.node(y.node);
    if (!update || update->op() != "BNTrainingUpdate" || update->input_size() < 5 ||
        !on_npu(*update) || type_attr(*update) != t)
      continue;
    if (auto r = update->attr().find("relu");
        r == update->attr().end() || !r->second.b() || has_residual(*update))
      continue;
    // The same batch norm: x, and the statistics of that BNTrainingUpdate.
    if (ug.input(1) != update->input(0) || !reads_output(ug, 2, update->name(), 1) ||
        !reads_output(ug, 3, update->name(), 2))
      continue;
    tfc::NodeDef* rd = nullptr;
    for (int k : g.consumer_indices(rg->name()))
      if (g.at(k) != &ug) rd = g.at(k);
    if (!rd || rd->op() != "BNTrainingReduceGrad" || rd->input_size() < 7 || !on_npu(*rd) ||
        type_attr(*rd) != t || !reads_output(*rd, 0, rg->name(), 0) ||
        rd->input(1) != ug.input(1) || !reads_output(*rd, 2, ug.name(), 0) ||
        !reads_output(*rd, 3, ug.name(), 1) || rd->input(4) != update->input(3) ||
        !reads_output(*rd, 5, update->name(), 1) || !reads_output(*rd, 6, update->name(), 2) ||
        rm.claimed(ug.name()) || rm.claimed(rd->name()))
      continue;
    if (auto r = rd->attr().find("relu"); r != rd->attr().end() && r->second.b()) continue;
    rm.remove(rg->name());
    rm.claim(ug.name());
    rm.claim(rd->name());
    found.push_back({rg, update, &ug, rd});
  }
  for (const Fold& f : found) {
    const std::string grad = f.relu_grad->input(0);
    std::map<std::string, tfc::AttrValue> attrs = {{"T", f.update_grad->attr().at("T")}};
    if (auto e = f.update_grad->attr().find("epsilon"); e != f.update_grad->attr().end())
      attrs["epsilon"] = e->second;
    attrs["relu"].set_b(true);
    attrs["N"].set_i(2);
    std::vector<std::string> in(f.update_grad->input().begin(), f.update_grad->input().begin() + 4);
    in[0] = grad;
    in.insert(in.end(), {f.update->input(3), f.update->input(4)});  // scale, offset
    rewrite_as(*f.update_grad, "BNTrainingUpdateGrad", in, attrs);
    attrs["N"].set_i(1);
    // (a reduce gradient that rewrite 0d gave the bias gradient in an earlier run of the pass
    // keeps it: its output 1 has readers)
    if (auto b = f.reduce_grad->attr().find("bias_grads"); b != f.reduce_grad->attr().end())
      attrs["bias_grads"] = b->second;
    in.assign(f.reduce_grad->input().begin(), f.reduce_grad->input().begin() + 7);
    in[0] = grad;
    in.push_back(f.update->input(4));  // offset
    rewrite_as(*f.reduce_grad, "BNTrainingReduceGrad", in, attrs);
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return static_cast<int>(found.size());
}

// ---- end of rewrite 0b ----

// ---- Rewrite 16: a residual gradient sum and its ReluGrad as one pass (graph_fusion.h) ----

// ReluGrad(AddN(a0, ..., a(n-1)), y) with the AddN read by nothing else -> the ReluGrad
// rewritten in place as FusedElementwise(a0, ..., a(n-1), y) of steps "AddV2 i0 i1",
// "AddV2 s0 i2", ..., "ReluGrad s(n-2) in" (AddN's own steps, then ReluGrad's); the AddN goes.
int fuse_add_n_relu_grads_in(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                             std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& rg = *graph.mutable_node(i);
    if (rg.op() != "ReluGrad" || !on_npu(rg) || rg.input_size() < 2) continue;
    const std::optional<tfc::DataType> t = type_attr(rg);
    if (t != tfc::DT_FLOAT && t != tfc::DT_HALF && t != tfc::DT_BFLOAT16) continue;
    tfc::NodeDef* sum = g.producer(rg, 0, "AddN");
    if (!sum || type_attr(*sum) != t || sum->device() != rg.device() || !rm.removable(*sum, 1) ||
        parse_input(rg.input(1)).control)
      continue;
    std::vector<std::string> inputs;
    for (const std::string& in : sum->input())
      if (in.empty() || in[0] != '^') inputs.push_back(in);
    if (inputs.empty()) continue;
    tfc::AttrValue steps;
    std::string last = "i0";
    for (size_t k = 1; k < inputs.size(); ++k) {
      steps.mutable_list()->add_s("AddV2 " + last + " i" + std::to_string(k));
      last = "s" + std::to_string(k - 1);
    }
    steps.mutable_list()->add_s("ReluGrad " + last + " i" + std::to_string(inputs.size()));
    inputs.push_back(rg.input(1));
    std::map<std::string, tfc::AttrValue> attrs =
        fused_elementwise_attrs(*t, std::vector<tfc::DataType>(inputs.size(), *t), steps);
    // The node names the fused node stands for besides its own (reports keep both).
    attrs["_npusim_fused"].mutable_list()->add_s(sum->name());
    rm.remove(sum->name());
    rewrite_as(rg, "FusedElementwise", inputs, attrs);
    ++fused;
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// ---- end of rewrite 16 ----

// Every node's inputs named in `renamed` (data inputs as node or node:port, control inputs as
// ^node) become the name they map to.
void rename_inputs(tfc::GraphDef& graph, const std::map<std::string, std::string>& renamed) {
  if (renamed.empty()) return;
  for (tfc::NodeDef& n : *graph.mutable_node())
    for (std::string& in : *n.mutable_input())
      if (auto it = renamed.find(in); it != renamed.end()) in = it->second;
}

// ---- Rewrite 0c: a residual add and its ReLU in BNTrainingUpdate (graph_fusion.h) ----

// Ops whose output 0 is an activation of a training graph's block: what the other operand of
// the residual add may come from (a bias, a constant or a broadcast operand may not).
bool training_activation(const tfc::NodeDef& n) {
  static const char* const kOps[] = {"BNTrainingUpdate", "AddRelu", "Relu", "AddV2"};
  for (const char* op : kOps)
    if (n.op() == op) return true;
  return false;
}

// Whether `target` is `from` or one of its ancestors (data or control inputs).
bool depends_on(GraphView& g, const std::string& from, const std::string& target) {
  std::vector<std::string> stack = {from};
  std::unordered_set<std::string> seen = {from};
  while (!stack.empty()) {
    const tfc::NodeDef* n = g.node(stack.back());
    stack.pop_back();
    if (!n) continue;
    if (n->name() == target) return true;
    for (const std::string& in : n->input()) {
      const InputRef r = parse_input(in);
      if (seen.insert(r.node).second) stack.push_back(r.node);
    }
  }
  return false;
}

// The data inputs, over all nodes, that read output `port` of `name`.
int output_reads(GraphView& g, const std::string& name, int port) {
  int reads = 0;
  for (int c : g.consumer_indices(name))
    for (int j = 0; j < g.at(c)->input_size(); ++j) reads += reads_output(*g.at(c), j, name, port);
  return reads;
}

// AddRelu(y, r) (either operand order) with y output 0 of a BNTrainingUpdate (no ReLU, no
// residual yet) that nothing else reads, and r output 0 of a training_activation of the same
// type T -> the BNTrainingUpdate with r as input 5 (R = 1) and relu = true, its name kept,
// `_npusim_fused` naming the AddRelu, whose readers read the batch norm's output 0 (control
// edges from it come from the batch norm) and which goes. The AddRelu must be on the NPU, not
// preserved, without control inputs; the BNTrainingUpdate not preserved (its y changes); r must
// not depend on it.
int fuse_bn_add_relus_in(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                         std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  std::map<std::string, std::string> renamed;  // the AddRelus -> the batch norms' output 0
  int fused = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& add = *graph.mutable_node(i);
    // (control consumers are fine: grappler's constant folding leaves the shapes of a
    // convolution's input, for its gradient, as Consts with a control edge from that input)
    if (add.op() != "AddRelu" || add.input_size() != 2 || !on_npu(add) ||
        preserve.count(add.name()) || has_control_inputs(add) || rm.claimed(add.name()))
      continue;
    const std::optional<tfc::DataType> t = type_attr(add);
    if (t != tfc::DT_FLOAT && t != tfc::DT_HALF) continue;
    for (int k = 0; k < 2; ++k) {
      tfc::NodeDef* update = g.producer(add, k, "BNTrainingUpdate");
      const InputRef other = parse_input(add.input(1 - k));
      tfc::NodeDef* r = other.control || other.port != 0 ? nullptr : g.node(other.node);
      if (!update || !r || r == update || !training_activation(*r) || !on_npu(*r) ||
          !on_npu(*update) || update->device() != add.device() || type_attr(*update) != t ||
          type_attr(*r) != t || update->input_size() < 5 || has_residual(*update) ||
          preserve.count(update->name()) || rm.claimed(update->name()))
        continue;
      if (auto relu = update->attr().find("relu"); relu != update->attr().end() && relu->second.b())
        continue;
      // y (output 0) read by the add alone; batch_mean and batch_variance may have readers.
      if (output_reads(g, update->name(), 0) != 1 || depends_on(g, r->name(), update->name()))
        continue;
      std::vector<std::string> inputs;
      for (const std::string& in : update->input())
        if (in.empty() || in[0] != '^') inputs.push_back(in);
      if (inputs.size() != 5) continue;
      inputs.push_back(add.input(1 - k));
      std::map<std::string, tfc::AttrValue> attrs;
      for (const auto& [name, value] : update->attr())
        if (!name.empty() && name[0] != '_') attrs[name] = value;
      attrs["R"].set_i(1);
      attrs["relu"].set_b(true);
      // The node names the fused node stands for besides its own (reports keep both).
      tfc::AttrValue fused_names;
      if (auto f = update->attr().find("_npusim_fused"); f != update->attr().end())
        fused_names = f->second;
      fused_names.mutable_list()->add_s(add.name());
      attrs["_npusim_fused"] = fused_names;
      renamed[add.name()] = update->name();
      renamed[add.name() + ":0"] = update->name();
      renamed["^" + add.name()] = "^" + update->name();
      rm.claim(update->name());
      rm.remove(add.name());
      rewrite_as(*update, "BNTrainingUpdate", inputs, attrs);
      ++fused;
      break;
    }
  }
  rename_inputs(graph, renamed);
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// ---- end of rewrite 0c ----

// ---- Rewrite 0f: a ReLU after a BNTrainingUpdate folded into it (graph_fusion.h) ----

// Relu(y) with y output 0 of a BNTrainingUpdate (relu = false, no residual, not preserved) that
// the Relu alone reads, both of one T (float or half) on one device, the Relu not preserved and
// without control inputs -> that BNTrainingUpdate with relu = true, its name kept,
// `_npusim_fused` naming the Relu, whose readers (the next layer, the ReLU's gradient) read the
// batch norm's output 0 (control edges from it come from the batch norm) and which goes.
int fold_bn_relus_in(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                     std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  std::map<std::string, std::string> renamed;  // the Relus -> the batch norms' output 0
  int folded = 0;
  for (int i = 0; i < g.size(); ++i) {
    tfc::NodeDef& relu = *g.at(i);
    if (relu.op() != "Relu" || relu.input_size() != 1 || !on_npu(relu) ||
        preserve.count(relu.name()) || rm.claimed(relu.name()))
      continue;
    const std::optional<tfc::DataType> t = type_attr(relu);
    tfc::NodeDef* update = g.producer(relu, 0, "BNTrainingUpdate");
    if ((t != tfc::DT_FLOAT && t != tfc::DT_HALF) || !update || !on_npu(*update) ||
        update->device() != relu.device() || type_attr(*update) != t || update->input_size() < 5 ||
        has_residual(*update) || preserve.count(update->name()) || rm.claimed(update->name()) ||
        output_reads(g, update->name(), 0) != 1)
      continue;
    if (auto r = update->attr().find("relu"); r != update->attr().end() && r->second.b()) continue;
    (*update->mutable_attr())["relu"].set_b(true);
    (*update->mutable_attr())["_npusim_fused"].mutable_list()->add_s(relu.name());
    renamed[relu.name()] = update->name();
    renamed[relu.name() + ":0"] = update->name();
    renamed["^" + relu.name()] = "^" + update->name();
    rm.claim(update->name());
    rm.remove(relu.name());
    ++folded;
  }
  rename_inputs(graph, renamed);
  removed->insert(rm.removed().begin(), rm.removed().end());
  return folded;
}

// ---- end of rewrite 0f ----

int fuse_batch_norms(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                     std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  struct Rewrite {
    tfc::NodeDef* last;
    std::vector<std::string> inputs;
    std::map<std::string, tfc::AttrValue> attrs;
  };
  std::vector<Rewrite> rewrites;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& add_1 = *graph.mutable_node(i);
    if (rm.claimed(add_1.name())) continue;
    std::optional<BatchNormChain> c = match_batch_norm(g, add_1);
    if (!c) continue;
    // Consumers inside the chain: add -> rsqrt -> mul -> (mul_1, mul_2); mul_1, sub -> add_1;
    // mul_2 -> sub.
    const size_t expected[] = {1, 1, 2, 1, 1, 1};
    bool ok = true;
    for (size_t n = 0; n < c->inner.size(); ++n) ok = ok && rm.removable(*c->inner[n], expected[n]);
    for (const std::string* p : {&c->scale, &c->offset, &c->mean, &c->variance})
      ok = ok && channel_vector(g, *p);
    if (!ok || rm.claimed(add_1.name())) continue;
    // A Relu or Relu6 that is add_1's only consumer becomes the fused node.
    tfc::NodeDef* last = &add_1;
    bool relu = false, relu6 = false;
    if (tfc::NodeDef* r = g.only_consumer(add_1.name());
        r && (r->op() == "Relu" || r->op() == "Relu6") && on_npu(*r) && float_node(*r) &&
        GraphView::reads(*r, 0, add_1.name()) && rm.removable(add_1, 1) && !rm.claimed(r->name())) {
      last = r;
      relu = r->op() == "Relu";
      relu6 = !relu;
    }
    // A BiasAdd (NHWC) whose only consumer is mul_1 is folded in.
    std::vector<std::string> inputs = {c->x, c->scale, c->offset, c->mean, c->variance};
    const InputRef xr = parse_input(c->x);
    tfc::NodeDef* bias_add = xr.port == 0 ? g.node(xr.node) : nullptr;
    if (bias_add && bias_add->op() == "BiasAdd" && float_node(*bias_add) &&
        rm.removable(*bias_add, 1) && bias_add->input_size() >= 2) {
      auto f = bias_add->attr().find("data_format");
      if (f == bias_add->attr().end() || f->second.s() == "NHWC") {
        inputs[0] = bias_add->input(0);
        inputs.push_back(bias_add->input(1));
        rm.remove(bias_add->name());
      }
    }
    for (tfc::NodeDef* n : c->inner) rm.remove(n->name());
    if (last != &add_1) rm.remove(add_1.name());
    rm.claim(last->name());
    // The epsilon Const goes when the chain was its only consumer (wherever it was placed).
    const tfc::NodeDef& eps = *c->eps_const;
    if (g.consumers(eps.name()) == 1 && !preserve.count(eps.name()) &&
        !g.control_target(eps.name()) && !has_control_inputs(eps) && !rm.claimed(eps.name()))
      rm.remove(eps.name());
    Rewrite w{last, inputs, {}};
    w.attrs["T"] = type_value(tfc::DT_FLOAT);
    w.attrs["N"].set_i(static_cast<int64_t>(inputs.size()) - 5);
    w.attrs["epsilon"].set_f(c->epsilon);
    w.attrs["relu"].set_b(relu);
    if (relu6) w.attrs["relu6"].set_b(true);
    rewrites.push_back(std::move(w));
  }
  for (Rewrite& w : rewrites) rewrite_as(*w.last, "BatchNormInference", w.inputs, w.attrs);
  removed->insert(rm.removed().begin(), rm.removed().end());
  return static_cast<int>(rewrites.size());
}

int fuse_add_relus(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                   std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& relu = *graph.mutable_node(i);
    if (relu.op() != "Relu" || !on_npu(relu) || removed->count(relu.name())) continue;
    const std::optional<tfc::DataType> t = type_attr(relu);
    if (t != tfc::DT_FLOAT && t != tfc::DT_HALF && t != tfc::DT_BFLOAT16) continue;
    tfc::NodeDef* add = g.producer(relu, 0, "AddV2");
    if (!add || removed->count(add->name()) || type_attr(*add) != t || add->input_size() != 2 ||
        !rm.removable(*add, 1))
      continue;
    const std::vector<std::string> inputs = {add->input(0), add->input(1)};
    rm.remove(add->name());
    rewrite_as(relu, "AddRelu", inputs, {{"T", type_value(*t)}});
    ++fused;
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// Conv2D -> BatchNormInference (the batch norm's x, the convolution's only consumer) ->
// Conv2DBatchNormInference in place of the batch norm; DepthwiseConv2dNative alike ->
// DepthwiseConv2dBatchNormInference.
int fuse_conv_batch_norms(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                          std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& bn = *graph.mutable_node(i);
    if (bn.op() != "BatchNormInference" || !on_npu(bn) || bn.input_size() < 5) continue;
    tfc::NodeDef* conv = g.producer(bn, 0, "Conv2D");
    const bool depthwise = !conv;
    if (!conv) conv = g.producer(bn, 0, "DepthwiseConv2dNative");
    if (!conv || !float_node(*conv) || conv->input_size() != 2 || !rm.removable(*conv, 1) ||
        type_attr(bn, "Tout").value_or(tfc::DT_FLOAT) != tfc::DT_FLOAT)
      continue;
    auto f = conv->attr().find("data_format");
    if (f != conv->attr().end() && f->second.s() != "NHWC") continue;
    std::vector<std::string> inputs = {conv->input(0), conv->input(1)};
    for (int k = 1; k < bn.input_size(); ++k)
      if (bn.input(k).empty() || bn.input(k)[0] != '^') inputs.push_back(bn.input(k));
    std::map<std::string, tfc::AttrValue> attrs;
    for (const char* a : {"T", "N", "epsilon", "relu", "relu6"})
      if (auto it = bn.attr().find(a); it != bn.attr().end()) attrs[a] = it->second;
    for (const char* a : {"strides", "padding", "explicit_paddings", "dilations", "data_format"})
      if (auto it = conv->attr().find(a); it != conv->attr().end()) attrs[a] = it->second;
    rm.remove(conv->name());
    rewrite_as(bn, depthwise ? "DepthwiseConv2dBatchNormInference" : "Conv2DBatchNormInference",
               inputs, attrs);
    ++fused;
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// ---- rewrite 2b: a residual add in the fused convolution's epilogue ----

// Ops whose output is a convolutional network's activation of the block: what a residual
// AddV2's other operand may come from for the add to join a fused convolution (rewrite 2b).
bool residual_producer(const tfc::NodeDef& n) {
  static const char* const kOps[] = {"Conv2DBatchNormInference",
                                     "DepthwiseConv2dBatchNormInference",
                                     "AddV2",
                                     "AddRelu",
                                     "Relu",
                                     "Relu6",
                                     "BatchNormInference"};
  for (const char* op : kOps)
    if (n.op() == op) return true;
  return false;
}

// AddV2(c, r) [-> Relu / Relu6], c a Conv2DBatchNormInference or DepthwiseConv2dBatchNormInference
// (float y, no activation, no residual yet) read only by the add, r (either operand) output 0
// of a residual_producer other than c, all float32 on the NPU: the fused convolution with r as
// its residual (attribute R = 1, the last input) and the activation, in place of the last node
// (CANN's Conv2D + BNInference + Add [+ ReLU]: the projection of a residual block). The add is
// taken to be of equal shapes (both are the block's activations); the compiler checks it.
int fuse_conv_residual_adds(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                            std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& add = *graph.mutable_node(i);
    if (add.op() != "AddV2" || !on_npu(add) || !float_node(add) || add.input_size() != 2 ||
        rm.claimed(add.name()))
      continue;
    for (int k = 0; k < 2; ++k) {
      tfc::NodeDef* conv = g.producer(add, k, "Conv2DBatchNormInference");
      if (!conv) conv = g.producer(add, k, "DepthwiseConv2dBatchNormInference");
      const InputRef other = parse_input(add.input(1 - k));
      tfc::NodeDef* r = other.control || other.port != 0 ? nullptr : g.node(other.node);
      if (!conv || !r || r == conv || !residual_producer(*r) || !on_npu(*r) ||
          !rm.removable(*conv, 1) || conv->device() != add.device() ||
          type_attr(*conv, "Tout").value_or(tfc::DT_FLOAT) != tfc::DT_FLOAT)
        continue;
      auto flag = [&](const char* a) {
        auto it = conv->attr().find(a);
        return it != conv->attr().end() && (it->second.b() || it->second.i());
      };
      if (flag("relu") || flag("relu6") || flag("R")) continue;
      // The activation after the add, where the add's only reader is a Relu / Relu6.
      tfc::NodeDef* last = &add;
      const char* act = nullptr;
      for (const char* op : {"Relu", "Relu6"}) {
        tfc::NodeDef* a = consumer_of(g, add.name(), op);
        if (a && rm.removable(add, 1) && float_node(*a) && a->device() == add.device() &&
            !rm.claimed(a->name())) {
          last = a;
          act = op == std::string("Relu") ? "relu" : "relu6";
        }
      }
      std::vector<std::string> inputs;
      for (const std::string& in : conv->input())
        if (in.empty() || in[0] != '^') inputs.push_back(in);
      inputs.push_back(add.input(1 - k));
      std::map<std::string, tfc::AttrValue> attrs;
      for (const auto& [name, value] : conv->attr())
        if (!name.empty() && name[0] != '_') attrs[name] = value;
      tfc::AttrValue one;
      one.set_i(1);
      attrs["R"] = one;
      if (act) {
        tfc::AttrValue yes;
        yes.set_b(true);
        attrs[act] = yes;
      }
      const std::string op = conv->op();
      rm.remove(conv->name());
      if (last != &add) rm.remove(add.name());
      rm.claim(last->name());
      rewrite_as(*last, op.c_str(), inputs, attrs);
      ++fused;
      break;
    }
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// ---- rewrite 1b: zero padding absorbed into the convolution ----

// n's data_format is NHWC (or absent: TensorFlow's default).
bool nhwc(const tfc::NodeDef& n) {
  auto f = n.attr().find("data_format");
  return f == n.attr().end() || f->second.s() == "NHWC";
}

// Pad / PadV2 (constant 0) of an NHWC tensor along H and W only, read only by a Conv2D or
// DepthwiseConv2dNative (NHWC, padding VALID, same device and T) as its input: the convolution
// reads the Pad's input with padding EXPLICIT and the Pad's amounts, and the Pad goes (the
// window pads with zeros: the same products and sums, a copy of the activation less).
int absorb_conv_pads(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                     std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int absorbed = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& conv = *graph.mutable_node(i);
    if ((conv.op() != "Conv2D" && conv.op() != "DepthwiseConv2dNative") || !on_npu(conv) ||
        !nhwc(conv) || conv.input_size() < 2)
      continue;
    auto padding = conv.attr().find("padding");
    if (padding == conv.attr().end() || padding->second.s() != "VALID") continue;
    tfc::NodeDef* pad = g.producer(conv, 0, "Pad");
    if (!pad) pad = g.producer(conv, 0, "PadV2");
    if (!pad || pad->device() != conv.device() || type_attr(*pad) != type_attr(conv) ||
        pad->input_size() != (pad->op() == "Pad" ? 2 : 3) || !rm.removable(*pad, 1))
      continue;
    if (pad->op() == "PadV2" && !scalar_const_is(input_node(g, *pad, 2), 0.0)) continue;
    const tfc::NodeDef* amounts = input_node(g, *pad, 1);
    std::optional<std::vector<int64_t>> p = amounts ? const_ints(*amounts) : std::nullopt;
    if (!p || p->size() != 8 || (*p)[0] || (*p)[1] || (*p)[6] || (*p)[7] ||
        *std::min_element(p->begin(), p->end()) < 0)
      continue;
    tfc::AttrValue explicit_paddings;
    for (int64_t v : *p) explicit_paddings.mutable_list()->add_i(v);
    *conv.mutable_input(0) = pad->input(0);
    (*conv.mutable_attr())["padding"].set_s("EXPLICIT");
    (*conv.mutable_attr())["explicit_paddings"] = explicit_paddings;
    rm.remove(pad->name());
    ++absorbed;
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return absorbed;
}

// ---- rewrite 3b: convolution and MatMul epilogues (Conv2DBiasAdd, MatMulBiasAdd) ----

// Conv2D (NHWC) or MatMul -> BiasAdd (NHWC: the channel last) [-> Relu], all float32 on the
// NPU on one device, the product read only by the BiasAdd (and the BiasAdd only by the Relu
// when that is taken): one Conv2DBiasAdd / MatMulBiasAdd in place of the chain's last node (its
// name kept), with the product's attributes and relu.
int fuse_bias_epilogues(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                        std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& bias_add = *graph.mutable_node(i);
    if (bias_add.op() != "BiasAdd" || !on_npu(bias_add) || removed->count(bias_add.name()) ||
        rm.claimed(bias_add.name()) || !float_node(bias_add) || !nhwc(bias_add) ||
        bias_add.input_size() < 2)
      continue;
    tfc::NodeDef* product = g.producer(bias_add, 0, "Conv2D");
    const bool conv = product != nullptr;
    if (!product) product = g.producer(bias_add, 0, "MatMul");
    if (!product || removed->count(product->name()) || !float_node(*product) ||
        (conv && !nhwc(*product)) || product->input_size() != 2 || !rm.removable(*product, 1) ||
        product->device() != bias_add.device())
      continue;
    tfc::NodeDef* last = &bias_add;
    if (tfc::NodeDef* r = g.only_consumer(bias_add.name());
        r && r->op() == "Relu" && on_npu(*r) && float_node(*r) &&
        r->device() == bias_add.device() && GraphView::reads(*r, 0, bias_add.name()) &&
        rm.removable(bias_add, 1) && !rm.claimed(r->name()) && !removed->count(r->name()))
      last = r;
    const bool relu = last != &bias_add;
    const std::vector<std::string> inputs = {product->input(0), product->input(1),
                                             bias_add.input(1)};
    std::map<std::string, tfc::AttrValue> attrs;
    attrs["T"] = type_value(tfc::DT_FLOAT);
    attrs["relu"].set_b(relu);
    const std::vector<const char*> kept =
        conv ? std::vector<const char*>{"strides", "padding", "explicit_paddings", "dilations",
                                        "data_format"}
             : std::vector<const char*>{"transpose_a", "transpose_b"};
    for (const char* a : kept)
      if (auto it = product->attr().find(a); it != product->attr().end()) attrs[a] = it->second;
    rm.remove(product->name());
    if (relu) rm.remove(bias_add.name());
    rm.claim(last->name());
    rewrite_as(*last, conv ? "Conv2DBiasAdd" : "MatMulBiasAdd", inputs, attrs);
    ++fused;
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// A Conv2DBatchNormInference or BatchNormInference whose every data consumer is a
// Conv2DBatchNormInference reading it as x or as its residual (rewrite 2b) (and nothing else
// of it) hands its output over in fp16: Tout = half there, Tx = half in the consumers reading
// it as x. The cube reads fp16 anyway (allow_fp32_to_fp16): FIXPIPE (or the batch norm's
// vector pass) rounds the result once instead of a cast launch per consumer, with the same RNE
// rounding of the same f32 value. A residual has its reader's type (Tout): a reader reading it
// as its residual hands its own output over in fp16 too, and a convolution with a residual
// hands over in fp16 only with its residual's producer; both sets are taken to a fixed point.
int half_handoffs(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve) {
  GraphView g(graph);
  auto fused_conv = [](const tfc::NodeDef& n) {
    return n.op() == "Conv2DBatchNormInference" || n.op() == "DepthwiseConv2dBatchNormInference";
  };
  auto has_residual = [&](const tfc::NodeDef& n) {
    auto it = n.attr().find("R");
    return fused_conv(n) && it != n.attr().end() && it->second.i() == 1;
  };
  // The index of n's last data input (its residual with R = 1).
  auto last_data_input = [](const tfc::NodeDef& n) {
    int last = -1;
    for (int k = 0; k < n.input_size(); ++k)
      if (!parse_input(n.input(k)).control) last = k;
    return last;
  };
  struct Reader {
    tfc::NodeDef* node = nullptr;  // null: a reader that keeps float32
    bool residual = false;
  };
  std::unordered_map<std::string, std::vector<Reader>> readers;  // producer -> consumers
  std::unordered_map<std::string, std::string>
      residual_of;  // fused conv -> its residual's producer
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& n = *graph.mutable_node(i);
    const int res_input = has_residual(n) ? last_data_input(n) : -1;
    if (res_input >= 0) residual_of[n.name()] = parse_input(n.input(res_input)).node;
    for (int k = 0; k < n.input_size(); ++k) {
      const InputRef r = parse_input(n.input(k));
      if (r.control) continue;
      tfc::NodeDef* p = g.node(r.node);
      if (!p || (!fused_conv(*p) && p->op() != "BatchNormInference")) continue;
      const bool x_of_conv = fused_conv(n) && k == 0 && on_npu(n) && r.port == 0 &&
                             type_attr(n, "Tx").value_or(tfc::DT_FLOAT) == tfc::DT_FLOAT;
      const bool residual = k == res_input && on_npu(n) && r.port == 0 &&
                            type_attr(n, "Tout").value_or(tfc::DT_FLOAT) == tfc::DT_FLOAT;
      readers[p->name()].push_back(x_of_conv || residual ? Reader{&n, residual} : Reader{});
    }
  }
  std::set<std::string> half;
  for (auto& [name, consumers] : readers) {
    tfc::NodeDef* p = g.node(name);
    if (on_npu(*p) && !preserve.count(name) &&
        type_attr(*p, "Tout").value_or(tfc::DT_FLOAT) == tfc::DT_FLOAT &&
        std::none_of(consumers.begin(), consumers.end(),
                     [](const Reader& c) { return c.node == nullptr; }))
      half.insert(name);
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (auto it = half.begin(); it != half.end();) {
      bool keep = true;
      auto res = residual_of.find(*it);
      if (res != residual_of.end() && !half.count(res->second)) keep = false;
      for (const Reader& c : readers[*it])
        if (c.residual && !half.count(c.node->name())) keep = false;
      if (keep) {
        ++it;
      } else {
        it = half.erase(it);
        changed = true;
      }
    }
  }
  for (const std::string& name : half) {
    (*g.node(name)->mutable_attr())["Tout"] = type_value(tfc::DT_HALF);
    for (const Reader& c : readers[name])
      if (!c.residual) (*c.node->mutable_attr())["Tx"] = type_value(tfc::DT_HALF);
  }
  return static_cast<int>(half.size());
}

// Whether n, on the NPU, has a float type T and no attribute but T (and TF's internal "_" ones).
bool float_step_node(const tfc::NodeDef& n) {
  if (!on_npu(n)) return false;
  const std::optional<tfc::DataType> t = type_attr(n);
  if (t != tfc::DT_FLOAT && t != tfc::DT_HALF && t != tfc::DT_BFLOAT16) return false;
  for (const auto& [name, value] : n.attr())
    if (name != "T" && (name.empty() || name[0] != '_')) return false;
  return true;
}

// Whether n may be a step of a FusedElementwise of its type: on the NPU, a fusible op
// (compiler::ops::fusible_elementwise) of a float type T with no attribute but T (and TF's
// internal "_" ones: a step carries no attributes), data inputs only before its control inputs.
bool fusible_step(const tfc::NodeDef& n) {
  if (!compiler::ops::fusible_elementwise(n.op()) || !float_step_node(n)) return false;
  return n.input_size() > 0 && !parse_input(n.input(0)).control;
}

// Whether n may be a SelectV2 step of a chain of its type T (fused_elementwise.h's
// "SelectV2 i<c> <t> <e>"): on the NPU, T float, no attribute but T (and "_" ones), three data
// inputs before its control inputs. Its bool condition is always an input of the chain (no step
// has a bool result): Keras' dropout where(mask, x * scale, 0) and its gradient
// where(mask, dy * scale, 0) become one launch each. Not with NPUSIM_FUSION_SELECT=0.
bool select_step(const tfc::NodeDef& n) {
  if (!select_fusion_requested() || n.op() != compiler::ops::kSelectStep || !float_step_node(n))
    return false;
  int data_inputs = 0;
  for (const std::string& in : n.input()) {
    if (parse_input(in).control) break;
    ++data_inputs;
  }
  return data_inputs == 3;
}

// Maximal connected sets of fusible steps (fusible_step, select_step) of one type, each with one
// sink: every other node of a set is removable (Removal) and has all its data consumers in the set.
// Taken in reverse topological order, a node joins the set of its consumers when it may and they
// all lie in one set; otherwise it is the sink of a new set. Sets of at least 2 nodes become one
// FusedElementwise node in place of the sink (graph_fusion.h, fused_elementwise.h).
int fuse_elementwise_chains(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                            std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  const int n_nodes = graph.node_size();
  std::vector<bool> step(n_nodes);
  for (int i = 0; i < n_nodes; ++i)
    step[i] = fusible_step(graph.node(i)) || select_step(graph.node(i));
  // Data producers of each step among the steps (graph indices; -1: outside), per data input.
  std::unordered_map<std::string, int> index;
  for (int i = 0; i < n_nodes; ++i)
    if (step[i]) index[graph.node(i).name()] = i;
  std::vector<std::vector<int>> producers(n_nodes);
  std::vector<int> pending(n_nodes, 0);  // step producers not yet ordered (Kahn)
  for (int i = 0; i < n_nodes; ++i) {
    if (!step[i]) continue;
    for (const std::string& in : graph.node(i).input()) {
      const InputRef r = parse_input(in);
      if (r.control) continue;
      auto it = index.find(r.node);
      const bool inner = it != index.end() && r.port == 0;
      producers[i].push_back(inner ? it->second : -1);
      pending[i] += inner;
    }
  }
  // Topological order of the steps (steps on a cycle, if any, are left out).
  std::vector<int> order;
  for (int i = 0; i < n_nodes; ++i)
    if (step[i] && pending[i] == 0) order.push_back(i);
  for (size_t k = 0; k < order.size(); ++k)
    for (int c : g.consumer_indices(graph.node(order[k]).name()))
      if (step[c] && --pending[c] == 0) order.push_back(c);
  // Each ordered step's set: the graph index of its sink.
  std::vector<int> sink(n_nodes, -1);
  for (auto k = order.rbegin(); k != order.rend(); ++k) {
    const tfc::NodeDef& n = graph.node(*k);
    const std::vector<int>& consumers = g.consumer_indices(n.name());
    int joined = consumers.empty() ? -1 : sink[consumers[0]];
    for (int c : consumers)
      if (sink[c] != joined || type_attr(graph.node(c)) != type_attr(n)) joined = -1;
    if (joined < 0 || !rm.removable(n, consumers.size())) joined = *k;
    sink[*k] = joined;
  }
  // The sets' members in topological order, by sink.
  std::map<int, std::vector<int>> sets;
  for (int i : order) sets[sink[i]].push_back(i);
  int fused = 0;
  for (const auto& [last, members] : sets) {
    if (members.size() < 2) continue;
    std::map<int, int> step_of;                           // graph index -> step number
    std::map<std::pair<std::string, int>, int> input_of;  // (node, port) -> input number
    const tfc::DataType t = *type_attr(graph.node(last));
    std::vector<std::string> inputs;
    std::vector<tfc::DataType> input_types;  // t, or bool: a SelectV2 step's condition
    tfc::AttrValue steps;
    for (int m : members) {
      const tfc::NodeDef& n = graph.node(m);
      const bool select = n.op() == compiler::ops::kSelectStep;
      std::string text = n.op();
      int k = 0;
      for (const std::string& in : n.input()) {
        const InputRef r = parse_input(in);
        if (r.control) continue;
        const bool condition = select && k == 0;
        const int p = producers[m][k++];
        if (p >= 0 && sink[p] == last) {
          text += " s" + std::to_string(step_of.at(p));
          continue;
        }
        auto [it, added] =
            input_of.emplace(std::make_pair(r.node, r.port), static_cast<int>(inputs.size()));
        if (added) {
          inputs.push_back(in);
          input_types.push_back(condition ? tfc::DT_BOOL : t);
        }
        text += " i" + std::to_string(it->second);
      }
      step_of[m] = steps.list().s_size();
      steps.mutable_list()->add_s(text);
      if (m != last) rm.remove(n.name());
    }
    tfc::NodeDef& sink_node = *graph.mutable_node(last);
    rewrite_as(sink_node, "FusedElementwise", inputs,
               fused_elementwise_attrs(t, input_types, steps));
    ++fused;
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// Control inputs "^a" of the nodes not in `removed` become "^redirect[a]" where a is redirected,
// each control input once, none from the node itself.
void redirect_controls(tfc::GraphDef& graph, const std::set<std::string>& removed,
                       const std::unordered_map<std::string, std::string>& redirect) {
  if (redirect.empty()) return;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& n = *graph.mutable_node(i);
    if (removed.count(n.name())) continue;
    std::set<std::string> had;
    std::vector<std::string> kept_inputs;
    bool changed = false;
    for (const std::string& in : n.input()) {
      const InputRef r = parse_input(in);
      std::string text = in;
      if (r.control) {
        auto it = redirect.find(r.node);
        if (it != redirect.end()) {
          text = "^" + it->second;
          changed = true;
        }
        if (text == "^" + n.name() || !had.insert(text).second) {
          changed = true;
          continue;
        }
      }
      kept_inputs.push_back(text);
    }
    if (!changed) continue;
    n.clear_input();
    for (const std::string& in : kept_inputs) n.add_input(in);
  }
}

// ---- rewrite 5: variable updates (FusedVariableUpdate) ----

// The value a variable update reads, as FusedVariableUpdate's steps see it.
struct UpdateOperand {
  enum Kind { kExternal, kBefore, kAfter } kind = kExternal;
  int update = -1;  // kBefore / kAfter: the update (index into the candidates) of that variable
};

// An Assign{Add,Sub,}VariableOp whose value comes from a FusedElementwise or one fusible step
// read only by it (the chain), or straight from a ReadVariableOp.
struct VariableUpdate {
  tfc::NodeDef* assign = nullptr;
  std::string handle;              // the resource input, as written
  const char* combine = nullptr;   // "AddV2" (AssignAdd), "Sub" (AssignSub), null (Assign)
  tfc::NodeDef* chain = nullptr;   // FusedElementwise or a fusible step; null: value read as is
  std::vector<std::string> reads;  // the chain's data inputs (or the value), as written
  std::vector<tfc::DataType> read_types;  // their types: the variable's, or a chain's Tin
};

bool is_variable_assign(const tfc::NodeDef& n) {
  return n.op() == "AssignAddVariableOp" || n.op() == "AssignSubVariableOp" ||
         n.op() == "AssignVariableOp";
}

// The steps of a chain node: FusedElementwise's attribute, or one step of a fusible op over its
// data inputs ("Mul i0 i1").
std::vector<std::string> chain_steps(const tfc::NodeDef& chain) {
  std::vector<std::string> steps;
  if (chain.op() == "FusedElementwise") {
    auto it = chain.attr().find("steps");
    if (it != chain.attr().end())
      for (const std::string& s : it->second.list().s()) steps.push_back(s);
    return steps;
  }
  std::string text = chain.op();
  int k = 0;
  for (const std::string& in : chain.input())
    if (!parse_input(in).control) text += " i" + std::to_string(k++);
  return {text};
}

int fuse_variable_updates(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                          std::set<std::string>* removed) {
  GraphView g(graph);
  const int n_nodes = graph.node_size();
  // Candidates.
  std::vector<VariableUpdate> ups;
  std::unordered_map<std::string, int> update_of_assign;  // assign name -> candidate
  for (int i = 0; i < n_nodes; ++i) {
    tfc::NodeDef& a = *graph.mutable_node(i);
    if (!is_variable_assign(a) || !on_npu(a) || a.input_size() < 2 ||
        parse_input(a.input(0)).control || parse_input(a.input(1)).control)
      continue;
    const std::optional<tfc::DataType> t = type_attr(a, "dtype");
    if (t != tfc::DT_FLOAT && t != tfc::DT_HALF && t != tfc::DT_BFLOAT16) continue;
    VariableUpdate u;
    u.assign = &a;
    u.handle = a.input(0);
    u.combine = a.op() == "AssignAddVariableOp"   ? "AddV2"
                : a.op() == "AssignSubVariableOp" ? "Sub"
                                                  : nullptr;
    const InputRef v = parse_input(a.input(1));
    tfc::NodeDef* p = v.port == 0 ? g.node(v.node) : nullptr;
    if (p && (p->op() == "FusedElementwise" || fusible_step(*p)) && type_attr(*p) == t &&
        g.consumers(p->name()) == 1 && !g.control_target(p->name()) && !preserve.count(p->name())) {
      u.chain = p;
      for (const std::string& in : p->input())
        if (!parse_input(in).control) u.reads.push_back(in);
      // A FusedElementwise's inputs are of the types its Tin lists (a SelectV2 step's
      // condition: bool); a fusible step's are of its type.
      u.read_types.assign(u.reads.size(), *t);
      if (const auto tin = p->attr().find("Tin"); tin != p->attr().end()) {
        const auto& types = tin->second.list().type();
        if (types.size() != static_cast<int>(u.reads.size())) continue;
        for (size_t r = 0; r < u.reads.size(); ++r)
          u.read_types[r] = static_cast<tfc::DataType>(types[static_cast<int>(r)]);
      }
    } else if (u.combine) {
      u.reads = {a.input(1)};  // var <op>= value: one step of the update itself
      u.read_types = {*t};
    } else {
      continue;  // an Assign of a value computed elsewhere: nothing to fuse
    }
    update_of_assign[a.name()] = static_cast<int>(ups.size());
    ups.push_back(std::move(u));
  }
  if (ups.empty()) return 0;
  std::unordered_map<std::string, std::vector<int>> updates_of_handle;
  for (int k = 0; k < static_cast<int>(ups.size()); ++k)
    updates_of_handle[ups[k].handle].push_back(k);

  // What an operand is: a ReadVariableOp of a candidate's variable ordered after that candidate's
  // assign by a control edge (its new value), one of a candidate's variable without such an edge
  // (its value before), anything else external.
  auto classify = [&](const std::string& in, tfc::NodeDef** read) -> UpdateOperand {
    *read = nullptr;
    const InputRef r = parse_input(in);
    tfc::NodeDef* p = r.port == 0 ? g.node(r.node) : nullptr;
    if (!p || p->op() != "ReadVariableOp" || !on_npu(*p) || p->input_size() < 1) return {};
    auto h = updates_of_handle.find(p->input(0));
    if (h == updates_of_handle.end()) return {};
    *read = p;
    for (const std::string& c : p->input()) {
      const InputRef cr = parse_input(c);
      if (!cr.control) continue;
      auto it = update_of_assign.find(cr.node);
      if (it != update_of_assign.end() && ups[it->second].handle == p->input(0))
        return {UpdateOperand::kAfter, it->second};
    }
    // Before an update of its variable: only where that variable has one candidate update.
    if (h->second.size() != 1) return {};
    return {UpdateOperand::kBefore, h->second[0]};
  };

  // Groups: an update reading another's new value joins its group (union-find).
  std::vector<int> parent(ups.size());
  for (size_t k = 0; k < ups.size(); ++k) parent[k] = static_cast<int>(k);
  std::function<int(int)> root = [&](int k) {
    return parent[k] == k ? k : parent[k] = root(parent[k]);
  };
  std::vector<std::vector<std::pair<UpdateOperand, tfc::NodeDef*>>> operands(ups.size());
  for (size_t k = 0; k < ups.size(); ++k)
    for (const std::string& in : ups[k].reads) {
      tfc::NodeDef* read = nullptr;
      const UpdateOperand o = classify(in, &read);
      operands[k].emplace_back(o, read);
      if (o.kind == UpdateOperand::kAfter) parent[root(static_cast<int>(k))] = root(o.update);
    }
  std::map<int, std::vector<int>> groups;  // root -> members, in candidate order
  for (size_t k = 0; k < ups.size(); ++k)
    groups[root(static_cast<int>(k))].push_back(static_cast<int>(k));

  // Out-edges (data and control) by graph index, for the cycle check.
  std::unordered_map<std::string, int> index;
  for (int i = 0; i < n_nodes; ++i) index[graph.node(i).name()] = i;
  std::vector<std::vector<int>> out(n_nodes);
  for (int i = 0; i < n_nodes; ++i)
    for (const std::string& in : graph.node(i).input()) {
      auto it = index.find(parse_input(in).node);
      if (it != index.end()) out[it->second].push_back(i);
    }
  std::vector<int> contracted(n_nodes, -1);  // accepted groups' nodes -> group number
  std::vector<std::vector<int>> accepted;    // their nodes

  std::unordered_map<std::string, std::string> control_redirect;  // removed -> kept node
  int fused = 0;
  for (auto& [unused_root, members] : groups) {
    (void)unused_root;
    // Variables: one update each; one type and device; updates ordered so that each reads only
    // new values of updates before it (Kahn over the group).
    std::set<std::string> handles;
    bool ok = true;
    const std::optional<tfc::DataType> t = type_attr(*ups[members[0]].assign, "dtype");
    for (int k : members) {
      ok = ok && handles.insert(ups[k].handle).second && type_attr(*ups[k].assign, "dtype") == t &&
           ups[k].assign->device() == ups[members[0]].assign->device();
    }
    if (!ok) continue;
    std::vector<int> order;
    std::set<int> placed;
    while (order.size() < members.size()) {
      bool progress = false;
      for (int k : members) {
        if (placed.count(k)) continue;
        bool ready = true;
        for (const auto& [o, read] : operands[k])
          if (o.kind == UpdateOperand::kAfter && o.update != k)
            ready = ready && placed.count(o.update);
        if (ready) {
          order.push_back(k);
          placed.insert(k);
          progress = true;
        }
      }
      if (!progress) break;
    }
    if (order.size() != members.size()) continue;
    std::map<int, int> var_of;  // candidate -> variable number (its position in `order`)
    for (size_t j = 0; j < order.size(); ++j) var_of[order[j]] = static_cast<int>(j);
    const int m = static_cast<int>(order.size());

    // The region: assigns, chains, and the reads of group variables; each read only by the
    // region, each node removable.
    std::set<std::string> region;
    for (int k : order) {
      region.insert(ups[k].assign->name());
      if (ups[k].chain) region.insert(ups[k].chain->name());
    }
    for (int k : order)
      for (const auto& [o, read] : operands[k]) {
        if (o.kind == UpdateOperand::kExternal) continue;
        if (!var_of.count(o.update)) ok = false;  // a before-read of another group's variable
        if (read) region.insert(read->name());
      }
    for (const std::string& name : region) {
      const tfc::NodeDef& n = *g.node(name);
      // A preserved node (a function's control output: its assigns and reads) keeps its name
      // (below); its data, if any, is read only inside the region.
      ok = ok && on_npu(n);
      for (int c : g.consumer_indices(name)) ok = ok && region.count(graph.node(c).name());
    }
    if (!ok) continue;

    // Steps: each update's chain, then its combine step; operands renamed.
    std::vector<std::string> steps, inputs;
    std::vector<tfc::DataType> input_types;  // Tin
    std::map<std::string, int> input_of;
    std::vector<int64_t> update_step(m, -1);
    auto operand_text = [&](const std::string& in, tfc::DataType type,
                            const UpdateOperand& o) -> std::string {
      if (o.kind == UpdateOperand::kBefore) return "i" + std::to_string(var_of.at(o.update));
      if (o.kind == UpdateOperand::kAfter)
        return "s" + std::to_string(update_step[var_of.at(o.update)]);
      auto [it, added] = input_of.emplace(in, m + static_cast<int>(inputs.size()));
      if (added) {
        inputs.push_back(in);
        input_types.push_back(type);
      }
      return "i" + std::to_string(it->second);
    };
    for (int k : order) {
      const VariableUpdate& u = ups[k];
      const int j = var_of.at(k);
      std::vector<std::string> mapped;  // the chain's inputs (or the value) as operands
      for (size_t r = 0; r < u.reads.size(); ++r)
        mapped.push_back(operand_text(u.reads[r], u.read_types[r], operands[k][r].first));
      std::string value;
      if (u.chain) {
        const size_t base = steps.size();
        for (const std::string& text : chain_steps(*u.chain)) {
          std::istringstream words(text);
          std::string word, renamed;
          words >> renamed;
          while (words >> word) {
            const size_t x = std::stoul(word.substr(1));
            renamed += " " + (word[0] == 's' ? "s" + std::to_string(base + x) : mapped.at(x));
          }
          steps.push_back(renamed);
        }
        value = "s" + std::to_string(steps.size() - 1);
      } else {
        value = mapped.at(0);
      }
      if (u.combine)
        steps.push_back(std::string(u.combine) + " i" + std::to_string(j) + " " + value);
      update_step[j] = static_cast<int64_t>(steps.size()) - 1;
    }
    // Distinct update steps (an Assign of a value that is another's new value is not fused).
    std::set<int64_t> distinct(update_step.begin(), update_step.end());
    if (static_cast<int>(distinct.size()) != m) continue;

    // The fused node's inputs from outside the region: data and control.
    tfc::NodeDef* kept = ups[order.back()].assign;
    std::vector<std::string> controls;
    std::set<std::string> control_set;
    for (const std::string& name : region)
      for (const std::string& in : g.node(name)->input()) {
        const InputRef r = parse_input(in);
        if (r.control && !region.count(r.node) && control_set.insert(r.node).second)
          controls.push_back("^" + r.node);
      }
    // No cycle: nothing outside the region that the fused node reads (data, handles, control)
    // may depend on the region (accepted groups count as one node). This also keeps a read of a
    // variable's value before its update honest: a writer of that variable ordered after the
    // read and before the update would be such a node (the fused kernel reads the variables
    // once its inputs are ready, so it would see that writer's value).
    std::set<int> sources;
    for (int k : order) sources.insert(index.at(parse_input(ups[k].handle).node));
    for (const std::string& in : inputs) sources.insert(index.at(parse_input(in).node));
    for (const std::string& c : control_set) sources.insert(index.at(c));
    std::vector<char> seen(n_nodes, 0);
    std::vector<int> stack;
    for (const std::string& name : region) {
      seen[index.at(name)] = 1;
      stack.push_back(index.at(name));
    }
    bool cycle = false;
    while (!stack.empty() && !cycle) {
      const int i = stack.back();
      stack.pop_back();
      std::vector<int> next = out[i];
      if (contracted[i] >= 0)
        next.insert(next.end(), accepted[contracted[i]].begin(), accepted[contracted[i]].end());
      for (int c : next) {
        if (seen[c]) continue;
        seen[c] = 1;
        if (sources.count(c)) cycle = true;
        stack.push_back(c);
      }
    }
    if (cycle) continue;
    // (Sources inside an accepted group: reaching any of its nodes reaches all of them.)

    std::vector<std::string> fused_inputs;
    for (int k : order) fused_inputs.push_back(ups[k].handle);
    fused_inputs.insert(fused_inputs.end(), inputs.begin(), inputs.end());
    std::map<std::string, tfc::AttrValue> attrs;
    attrs["T"] = type_value(*t);
    attrs["M"].set_i(m);
    attrs["Tin"] = type_list_value(input_types);
    for (const std::string& s : steps) attrs["steps"].mutable_list()->add_s(s);
    attrs["updates"].mutable_list();
    for (int64_t s : update_step) attrs["updates"].mutable_list()->add_i(s);
    const std::string kept_name = kept->name();
    rewrite_as(*kept, "FusedVariableUpdate", fused_inputs, attrs);
    // rewrite_as kept the assign's own control inputs; the fused node takes the region's.
    auto* in = kept->mutable_input();
    while (in->size() > static_cast<int>(fused_inputs.size())) in->RemoveLast();
    for (const std::string& c : controls) kept->add_input(c);
    std::vector<int> nodes;
    for (const std::string& name : region) {
      nodes.push_back(index.at(name));
      contracted[index.at(name)] = static_cast<int>(accepted.size());
      if (name == kept_name) continue;
      if (preserve.count(name)) {
        // A preserved node stays as a NoOp after the fused node, so a function's control
        // outputs still name it; nothing reads its data; it costs no launch.
        tfc::NodeDef& n = *g.node(name);
        rewrite_as(n, "NoOp", {}, {});
        n.clear_input();
        n.add_input("^" + kept_name);
        continue;
      }
      removed->insert(name);
      control_redirect[name] = kept_name;
    }
    accepted.push_back(std::move(nodes));
    ++fused;
  }
  // Control edges from removed nodes now come from the fused node (once per consumer).
  redirect_controls(graph, *removed, control_redirect);
  return fused;
}

// ---- rewrite 5b: multi-tensor variable updates ----

// Whether the graph with each group's nodes contracted to one node is acyclic (Kahn's
// algorithm on node indices, a group's members all mapped to its first member).
bool acyclic_contracted(const tfc::GraphDef& graph,
                        const std::unordered_map<std::string, int>& index,
                        const std::vector<std::vector<int>>& groups) {
  const int n = graph.node_size();
  std::vector<int> id(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) id[static_cast<size_t>(i)] = i;
  for (const std::vector<int>& g : groups)
    for (int i : g) id[static_cast<size_t>(i)] = g[0];
  std::vector<std::vector<int>> out(static_cast<size_t>(n));
  std::vector<int> in_degree(static_cast<size_t>(n), 0);
  for (int j = 0; j < n; ++j)
    for (const std::string& in : graph.node(j).input()) {
      auto it = index.find(parse_input(in).node);
      if (it == index.end()) continue;
      const int a = id[static_cast<size_t>(it->second)], b = id[static_cast<size_t>(j)];
      if (a == b) continue;
      out[static_cast<size_t>(a)].push_back(b);
      ++in_degree[static_cast<size_t>(b)];
    }
  std::vector<int> ready;
  int nodes = 0;
  for (int i = 0; i < n; ++i)
    if (id[static_cast<size_t>(i)] == i) {
      ++nodes;
      if (in_degree[static_cast<size_t>(i)] == 0) ready.push_back(i);
    }
  int done = 0;
  while (!ready.empty()) {
    const int i = ready.back();
    ready.pop_back();
    ++done;
    for (int c : out[static_cast<size_t>(i)])
      if (--in_degree[static_cast<size_t>(c)] == 0) ready.push_back(c);
  }
  return done == nodes;
}

// The NpuCollective nodes node `node` depends on (data or control, through any path), as text
// for a grouping key ("|name" each, sorted); empty in a graph without collectives. In a
// data-parallel step the optimizer's nodes wait for their gradient segment's all-reduce (an
// NpuCollective node; docs/multichip.md, "Gradient segments and overlap"): the members of a
// group must wait for the same collectives, or the group's launch would wait for a later segment
// where its members' own launches start as soon as their segment has arrived.
std::string collectives_before(const tfc::GraphDef& graph,
                               const std::unordered_map<std::string, int>& index, int node) {
  const int n_nodes = graph.node_size();
  std::string names;
  if (std::none_of(graph.node().begin(), graph.node().end(),
                   [](const tfc::NodeDef& n) { return n.op() == "NpuCollective"; }))
    return names;
  std::vector<char> seen(static_cast<size_t>(n_nodes), 0);
  std::vector<int> stack = {node};
  std::vector<std::string> found;
  while (!stack.empty()) {
    const int i = stack.back();
    stack.pop_back();
    for (const std::string& in : graph.node(i).input()) {
      auto it = index.find(parse_input(in).node);
      if (it == index.end() || seen[static_cast<size_t>(it->second)]) continue;
      seen[static_cast<size_t>(it->second)] = 1;
      if (graph.node(it->second).op() == "NpuCollective") found.push_back(it->first);
      stack.push_back(it->second);
    }
  }
  std::sort(found.begin(), found.end());
  for (const std::string& f : found) names += "|" + f;
  return names;
}

// Graph indices by node name.
std::unordered_map<std::string, int> node_index(const tfc::GraphDef& graph) {
  std::unordered_map<std::string, int> index;
  for (int i = 0; i < graph.node_size(); ++i) index[graph.node(i).name()] = i;
  return index;
}

// The candidates of a grouping rewrite (graph indices) by key, the keys in the order first seen.
struct KeyedCandidates {
  std::map<std::string, std::vector<int>> by_key;
  std::vector<std::string> key_order;
  void add(const std::string& key, int node) {
    if (!by_key.count(key)) key_order.push_back(key);
    by_key[key].push_back(node);
  }
};

// Groups of candidates (graph indices) that may each become one node: per key (in key order),
// greedily, candidates no one of which depends on another (no path either way, so the merged
// node sits on no cycle by itself) and all of one liveness class (graph_liveness.h: live in
// exactly the same executions; a node of a cond's branch and one of the other branch, or of a
// loop's body and outside it, would make a node one of whose inputs is dead whenever the other
// runs, so that neither runs; a node without a class joins none), groups of at least two; each
// group kept only if the graph with every kept group contracted stays acyclic.
std::vector<std::vector<int>> independent_groups(const tfc::GraphDef& graph,
                                                 const std::unordered_map<std::string, int>& index,
                                                 const KeyedCandidates& candidates) {
  const int n_nodes = graph.node_size();
  const std::vector<std::string> live_class = liveness_classes(graph).of;
  // Out-edges (data and control) by graph index.
  std::vector<std::vector<int>> out(static_cast<size_t>(n_nodes));
  for (int i = 0; i < n_nodes; ++i)
    for (const std::string& in : graph.node(i).input()) {
      auto it = index.find(parse_input(in).node);
      if (it != index.end()) out[static_cast<size_t>(it->second)].push_back(i);
    }
  // Nodes reachable from node i (itself excluded).
  auto reachable = [&](int from) {
    std::vector<char> seen(static_cast<size_t>(n_nodes), 0);
    std::vector<int> stack = {from};
    while (!stack.empty()) {
      const int i = stack.back();
      stack.pop_back();
      for (int c : out[static_cast<size_t>(i)])
        if (!seen[static_cast<size_t>(c)]) {
          seen[static_cast<size_t>(c)] = 1;
          stack.push_back(c);
        }
    }
    return seen;
  };
  std::vector<std::vector<int>> groups;
  for (const std::string& key : candidates.key_order) {
    const std::vector<int>& cands = candidates.by_key.at(key);
    if (cands.size() < 2) continue;
    std::vector<std::vector<char>> reach;
    for (int c : cands) reach.push_back(reachable(c));
    std::vector<std::vector<size_t>> open;  // candidate positions per group of this key
    for (size_t a = 0; a < cands.size(); ++a) {
      bool placed = false;
      const std::string& live = live_class[static_cast<size_t>(cands[a])];
      for (std::vector<size_t>& g : open) {
        bool independent = !live.empty() && live == live_class[static_cast<size_t>(cands[g[0]])];
        for (size_t b : g)
          independent = independent && !reach[a][static_cast<size_t>(cands[b])] &&
                        !reach[b][static_cast<size_t>(cands[a])];
        if (independent) {
          g.push_back(a);
          placed = true;
          break;
        }
      }
      if (!placed) open.push_back({a});
    }
    for (const std::vector<size_t>& g : open) {
      if (g.size() < 2) continue;
      std::vector<int> nodes;
      for (size_t a : g) nodes.push_back(cands[a]);
      groups.push_back(nodes);
      if (!acyclic_contracted(graph, index, groups)) groups.pop_back();
    }
  }
  return groups;
}

// Each group (graph indices; members of one data input and output 0 each, none preserved) as
// one node of op `op` named "<prefix><k>" with N = the members: input i and output i member
// i's, control inputs the members' together, the attributes `kept` of the first member,
// `_npusim_members` their names and `_npusim_fused` the nodes they had fused. Readers of member
// i's output read output i; control edges from a member come from the group's node. The members
// go into *removed; returns the nodes made.
int merge_multi_tensor_groups(tfc::GraphDef& graph,
                              const std::unordered_map<std::string, int>& index,
                              const std::vector<std::vector<int>>& groups, const char* op,
                              const std::string& prefix, const std::vector<const char*>& kept,
                              std::set<std::string>* removed) {
  const int n_nodes = graph.node_size();
  std::unordered_map<std::string, std::string> control_redirect;  // removed member -> group node
  std::unordered_map<std::string, std::string> output_of;         // removed member -> its output
  std::vector<tfc::NodeDef> made;
  for (const std::vector<int>& members : groups) {
    std::string name;
    for (size_t k = made.size();; ++k) {
      name = prefix + std::to_string(k);
      if (!index.count(name)) break;
    }
    const tfc::NodeDef& first = graph.node(members[0]);
    tfc::NodeDef node;
    node.set_name(name);
    node.set_op(op);
    node.set_device(first.device());
    std::set<std::string> member_names, control_set;
    for (int i : members) member_names.insert(graph.node(i).name());
    std::vector<std::string> controls;
    for (int i : members)
      for (const std::string& in : graph.node(i).input()) {
        const InputRef r = parse_input(in);
        if (!r.control)
          node.add_input(in);
        else if (!member_names.count(r.node) && control_set.insert(r.node).second)
          controls.push_back("^" + r.node);
      }
    for (const std::string& c : controls) node.add_input(c);
    auto& attrs = *node.mutable_attr();
    for (const char* a : kept)
      if (const auto it = first.attr().find(a); it != first.attr().end()) attrs[a] = it->second;
    attrs["N"].set_i(static_cast<int64_t>(members.size()));
    for (size_t k = 0; k < members.size(); ++k) {
      const tfc::NodeDef& m = graph.node(members[k]);
      attrs["_npusim_members"].mutable_list()->add_s(m.name());
      if (const auto f = m.attr().find("_npusim_fused"); f != m.attr().end())
        for (const std::string& fused : f->second.list().s())
          attrs["_npusim_fused"].mutable_list()->add_s(fused);
      output_of[m.name()] = k == 0 ? name : name + ":" + std::to_string(k);
      control_redirect[m.name()] = name;
      removed->insert(m.name());
    }
    made.push_back(std::move(node));
  }
  // Readers of a member's output read the group's output of it.
  for (int i = 0; i < n_nodes && !output_of.empty(); ++i) {
    tfc::NodeDef& n = *graph.mutable_node(i);
    if (removed->count(n.name())) continue;
    for (int j = 0; j < n.input_size(); ++j) {
      const InputRef r = parse_input(n.input(j));
      const auto it = r.control || r.port != 0 ? output_of.end() : output_of.find(r.node);
      if (it != output_of.end()) n.set_input(j, it->second);
    }
  }
  redirect_controls(graph, *removed, control_redirect);
  for (tfc::NodeDef& n : made) *graph.add_node() = std::move(n);
  return static_cast<int>(made.size());
}

int group_variable_updates(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                           std::set<std::string>* removed) {
  const int n_nodes = graph.node_size();
  const std::unordered_map<std::string, int> index = node_index(graph);
  // Candidates by key: device, T, M, Tin, steps, updates (one optimizer's updates of one type,
  // the same inputs' types: a gradient cast in or not, rewrite 5c) and the collectives they wait
  // for.
  KeyedCandidates candidates;
  for (int i = 0; i < n_nodes; ++i) {
    const tfc::NodeDef& n = graph.node(i);
    if (n.op() != "FusedVariableUpdate" || !on_npu(n)) continue;
    const auto members = n.attr().find("members");
    if (members != n.attr().end() && members->second.i() != 1) continue;
    // A SelectV2 step's condition may need broadcasting (Keras' Lamb: a scalar bool per
    // variable), which only the one-variable update's kernel does (a copy launch first); the
    // multi-tensor kernel streams a bool input and never broadcasts it. Such updates stay alone.
    if (const auto steps = n.attr().find("steps"); steps != n.attr().end()) {
      const auto& texts = steps->second.list().s();
      if (std::any_of(texts.begin(), texts.end(),
                      [](const std::string& t) { return t.rfind("SelectV2 ", 0) == 0; }))
        continue;
    }
    std::string key = n.device();
    for (const char* a : {"T", "M", "Tin", "steps", "updates"}) {
      const auto it = n.attr().find(a);
      if (it == n.attr().end()) {
        key.clear();
        break;
      }
      key += "|" + it->second.SerializeAsString();
    }
    if (key.empty()) continue;
    key += "|collectives" + collectives_before(graph, index, i);
    // Members are reported under the node's op type: only those of one report type together.
    if (const auto r = n.attr().find("_npusim_report_type"); r != n.attr().end())
      key += "|report " + r->second.s();
    candidates.add(key, i);
  }
  const std::vector<std::vector<int>> groups = independent_groups(graph, index, candidates);

  std::unordered_map<std::string, std::string> control_redirect;  // removed member -> group node
  int made = 0;
  for (const std::vector<int>& members : groups) {
    std::string name;
    for (int k = made;; ++k) {
      name = "npusim_multi_tensor_update_" + std::to_string(k);
      if (!index.count(name)) break;
    }
    const tfc::NodeDef& first = graph.node(members[0]);
    const int64_t m = first.attr().at("M").i();
    std::vector<std::string> handles, others, controls;
    std::set<std::string> member_names, control_set;
    for (int i : members) member_names.insert(graph.node(i).name());
    for (int i : members) {
      const tfc::NodeDef& u = graph.node(i);
      int data = 0;
      for (const std::string& in : u.input()) {
        const InputRef r = parse_input(in);
        if (r.control) {
          if (!member_names.count(r.node) && control_set.insert(r.node).second)
            controls.push_back("^" + r.node);
          continue;
        }
        (data++ < m ? handles : others).push_back(in);
      }
    }
    tfc::NodeDef node;
    node.set_name(name);
    node.set_op("FusedVariableUpdate");
    node.set_device(first.device());
    for (const std::string& in : handles) node.add_input(in);
    for (const std::string& in : others) node.add_input(in);
    for (const std::string& c : controls) node.add_input(c);
    auto& attrs = *node.mutable_attr();
    for (const auto& [a, value] : first.attr())
      if (!a.empty() && a[0] == '_') attrs[a] = value;
    attrs["T"] = first.attr().at("T");
    attrs["steps"] = first.attr().at("steps");
    attrs["updates"] = first.attr().at("updates");
    attrs["M"].set_i(m * static_cast<int64_t>(members.size()));
    attrs["Tin"].mutable_list();
    for (int i : members)
      for (int t : graph.node(i).attr().at("Tin").list().type())
        attrs["Tin"].mutable_list()->add_type(static_cast<tfc::DataType>(t));
    attrs["members"].set_i(static_cast<int64_t>(members.size()));
    // The members' names, for people reading the graph or an error naming this node.
    for (int i : members) attrs["_npusim_members"].mutable_list()->add_s(graph.node(i).name());
    for (int i : members) {
      tfc::NodeDef& u = *graph.mutable_node(i);
      if (preserve.count(u.name())) {
        // A function's control output keeps its name, as a NoOp after the group's node.
        rewrite_as(u, "NoOp", {}, {});
        u.clear_input();
        u.add_input("^" + name);
        continue;
      }
      removed->insert(u.name());
      control_redirect[u.name()] = name;
    }
    *graph.add_node() = std::move(node);
    ++made;
  }
  // Control edges from removed members now come from their group's node (once per consumer).
  redirect_controls(graph, *removed, control_redirect);
  return made;
}

// ---- rewrite 5c: casts folded into the variable updates ----

// Under mixed precision the float32 optimizer reads float16 gradients through Casts; CANN folds
// such a cast into the update kernel. Each FusedVariableUpdate (one member) input that is a
// Cast's output becomes the Cast's input, and the update's steps cast it first ("Cast i<n>",
// fused_elementwise.h): the update's kernel converts the tile in the UB with the Cast kernel's
// own vconv, so the new values are the same bits. The Cast must be on the update's device, of a
// fusible pair (compiler::ops::fusible_cast: float32 from float16 / bfloat16), Truncate false,
// with no control edges either way, not preserved, and read by this update alone (once). Returns
// the Casts folded.
bool is_cast(const tfc::NodeDef* n, std::optional<tfc::DataType> from,
             std::optional<tfc::DataType> to);  // below

// The compiler's type of a TensorFlow float type (nullopt for the others).
std::optional<compiler::DataType> compiler_float_type(tfc::DataType t) {
  switch (t) {
    case tfc::DT_FLOAT: return compiler::DataType::F32;
    case tfc::DT_HALF: return compiler::DataType::F16;
    case tfc::DT_BFLOAT16: return compiler::DataType::BF16;
    default: return std::nullopt;
  }
}

// `steps` (fused_elementwise.h) with `casts` ("Cast i<n>") put first: a step reading a cast
// input reads its Cast step, every s<j> becomes s<j + casts>.
std::vector<std::string> steps_with_casts(const tfc::AttrValue& steps,
                                          const std::vector<std::string>& casts) {
  std::map<std::string, std::string> cast_step;  // "i<n>" -> "s<k>"
  for (size_t k = 0; k < casts.size(); ++k)
    cast_step[casts[k].substr(casts[k].find(' ') + 1)] = "s" + std::to_string(k);
  std::vector<std::string> out = casts;
  for (const std::string& text : steps.list().s()) {
    std::istringstream words(text);
    std::string word, renamed;
    words >> renamed;
    while (words >> word) {
      auto it = cast_step.find(word);
      renamed +=
          " " + (it != cast_step.end() ? it->second
                 : word[0] == 's' ? "s" + std::to_string(std::stoul(word.substr(1)) + casts.size())
                                  : word);
    }
    out.push_back(renamed);
  }
  return out;
}

int fold_update_casts(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                      std::set<std::string>* removed) {
  GraphView g(graph);
  int folded = 0;
  std::vector<tfc::NodeDef> added;                       // split-off members' nodes
  std::map<std::string, std::vector<std::string>> also;  // node -> nodes split off it
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& u = *graph.mutable_node(i);
    if (u.op() != "FusedVariableUpdate" || !on_npu(u) || removed->count(u.name())) continue;
    const std::optional<tfc::DataType> t = type_attr(u);
    const auto tin = u.attr().find("Tin");
    const auto members_attr = u.attr().find("members");
    const int64_t members = members_attr == u.attr().end() ? 1 : members_attr->second.i();
    if (!t || tin == u.attr().end() || !u.attr().count("M") || members < 1) continue;
    const int64_t m = u.attr().at("M").i();
    const std::vector<int> types(tin->second.list().type().begin(),
                                 tin->second.list().type().end());
    int data = 0;  // data inputs: M handles, then the others
    while (data < u.input_size() && !parse_input(u.input(data)).control) ++data;
    if (m % members || data != m + static_cast<int64_t>(types.size()) ||
        types.size() % static_cast<size_t>(members))
      continue;
    // Member g's inputs: its M / members variables, then its per_n others (rewrite 5b).
    const size_t per_m = static_cast<size_t>(m / members);
    const size_t per_n = types.size() / static_cast<size_t>(members);
    // The foldable Cast feeding data input p, or nullptr.
    auto foldable = [&](size_t p) -> tfc::NodeDef* {
      tfc::NodeDef* c = g.producer(u, static_cast<int>(p), "Cast");
      if (!c || !is_cast(c, std::nullopt, *t) || c->device() != u.device()) return nullptr;
      const auto truncate = c->attr().find("Truncate");
      if (truncate != c->attr().end() && truncate->second.b()) return nullptr;
      const auto src = compiler_float_type(*type_attr(*c, "SrcT"));
      const auto dst = compiler_float_type(*t);
      if (!src || !dst || !compiler::ops::fusible_cast(*src, *dst)) return nullptr;
      if (preserve.count(c->name()) || has_control_inputs(*c) || g.control_target(c->name()) ||
          g.consumers(c->name()) != 1 || removed->count(c->name()))
        return nullptr;
      return c;
    };
    // The steps are common to the members: members whose foldable casts differ (a float16
    // gradient and a float32 one) go to nodes of their own, one per signature (per input k,
    // the cast's source type or -1), in the order of their first member.
    std::vector<std::vector<tfc::NodeDef*>> cast(static_cast<size_t>(members));
    std::map<std::vector<int>, std::vector<size_t>> by_signature;
    std::vector<std::vector<int>> signature_order;
    for (size_t gi = 0; gi < static_cast<size_t>(members); ++gi) {
      std::vector<int> sig;
      for (size_t k = 0; k < per_n; ++k) {
        tfc::NodeDef* c = foldable(static_cast<size_t>(m) + gi * per_n + k);
        cast[gi].push_back(c);
        sig.push_back(c ? static_cast<int>(*type_attr(*c, "SrcT")) : -1);
      }
      if (!by_signature.count(sig)) signature_order.push_back(sig);
      by_signature[sig].push_back(gi);
    }
    const std::vector<int> none(per_n, -1);
    if (signature_order.size() == 1 && signature_order[0] == none) continue;
    // The node keeps the members without casts (or the first signature's).
    const std::vector<int> kept = by_signature.count(none) ? none : signature_order[0];
    const tfc::NodeDef original = u;
    std::vector<std::string> controls;
    for (int p = data; p < original.input_size(); ++p) controls.push_back(original.input(p));
    std::vector<std::string> names;  // `_npusim_members`
    if (const auto it = original.attr().find("_npusim_members"); it != original.attr().end())
      names.assign(it->second.list().s().begin(), it->second.list().s().end());
    int split = 0;
    for (const std::vector<int>& sig : signature_order) {
      const std::vector<size_t>& group = by_signature.at(sig);
      std::vector<std::string> casts, handles, others;
      for (size_t k = 0; k < per_n; ++k)
        if (sig[k] >= 0)
          casts.push_back(std::string(compiler::ops::kCastStep) + " i" + std::to_string(per_m + k));
      tfc::NodeDef node;
      node.set_op(original.op());
      node.set_device(original.device());
      auto& attrs = *node.mutable_attr();
      attrs = original.attr();
      attrs["Tin"].mutable_list()->clear_type();
      attrs["_npusim_members"].mutable_list()->clear_s();
      for (size_t gi : group) {
        for (size_t j = 0; j < per_m; ++j) handles.push_back(original.input(int(gi * per_m + j)));
        for (size_t k = 0; k < per_n; ++k) {
          const size_t at = gi * per_n + k;
          tfc::NodeDef* c = cast[gi][k];
          const bool fold = sig[k] >= 0;
          others.push_back(fold ? c->input(0) : original.input(int(m + at)));
          attrs["Tin"].mutable_list()->add_type(
              static_cast<tfc::DataType>(fold ? sig[k] : types[at]));
          if (fold) {
            removed->insert(c->name());
            ++folded;
          }
        }
        if (gi < names.size()) attrs["_npusim_members"].mutable_list()->add_s(names[gi]);
      }
      if (attrs["_npusim_members"].list().s_size() == 0) attrs.erase("_npusim_members");
      attrs["M"].set_i(static_cast<int64_t>(per_m * group.size()));
      attrs["members"].set_i(static_cast<int64_t>(group.size()));
      if (!casts.empty()) {
        attrs["steps"].mutable_list()->clear_s();
        for (const std::string& text : steps_with_casts(original.attr().at("steps"), casts))
          attrs["steps"].mutable_list()->add_s(text);
        attrs["updates"].mutable_list()->clear_i();
        for (int64_t up : original.attr().at("updates").list().i())
          attrs["updates"].mutable_list()->add_i(up + static_cast<int64_t>(casts.size()));
      }
      for (const std::string& in : handles) node.add_input(in);
      for (const std::string& in : others) node.add_input(in);
      for (const std::string& c : controls) node.add_input(c);
      if (sig == kept) {
        node.set_name(original.name());
        u = std::move(node);
        continue;
      }
      node.set_name(original.name() + "/npusim_cast_folded_" + std::to_string(split++));
      also[original.name()].push_back(node.name());
      added.push_back(std::move(node));
    }
  }
  // A node depending on a split node by a control edge depends on its parts too.
  if (!also.empty())
    for (tfc::NodeDef& n : *graph.mutable_node()) {
      std::vector<std::string> more;
      for (const std::string& in : n.input()) {
        const InputRef r = parse_input(in);
        if (!r.control) continue;
        if (const auto it = also.find(r.node); it != also.end())
          for (const std::string& name : it->second) more.push_back("^" + name);
      }
      for (const std::string& c : more) n.add_input(c);
    }
  for (tfc::NodeDef& n : added) *graph.add_node() = std::move(n);
  return folded;
}

// ---- rewrite 5d: a gradient's scaling folded into its update ----

// An optimizer that scales each gradient before its update (Keras' constant loss scale: g * (1 /
// k); LossScaleOptimizer's dynamic one: g / scale) makes that product a node of its own where the
// update reads it in more than one chain (Adam's m and v): rewrite 4 leaves a node read by two
// chains out of both, and rewrite 5 then puts the two chains into one FusedVariableUpdate. Each
// FusedVariableUpdate (one member: run before 5b; a multi-tensor node's steps are common to its
// members) data input that is output 0 of a Mul or RealDiv
// of the update's T, on its device, with no control edges either way, not preserved and read by
// this update alone, becomes that step: the update reads the Mul's / RealDiv's two operands
// (deduplicated against its other inputs) and its steps start with "Mul a b" / "RealDiv a b",
// which its other steps read where they read the input. The kernel computes the step with the
// op's own instructions (fused_elementwise.h), so the new values are the same bits. Returns the
// nodes folded.
int fold_update_scales(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                       std::set<std::string>* removed) {
  GraphView g(graph);
  int folded = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& u = *graph.mutable_node(i);
    const auto members = u.attr().find("members");  // rewrite 5c's nodes have one (1)
    if (u.op() != "FusedVariableUpdate" || !on_npu(u) || removed->count(u.name()) ||
        (members != u.attr().end() && members->second.i() != 1) || !u.attr().count("M") ||
        !u.attr().count("steps") || !u.attr().count("updates"))
      continue;
    const std::optional<tfc::DataType> t = type_attr(u);
    const auto tin = u.attr().find("Tin");
    if (!t || tin == u.attr().end()) continue;
    const int64_t m = u.attr().at("M").i();
    std::vector<tfc::DataType> types;
    for (int type : tin->second.list().type()) types.push_back(static_cast<tfc::DataType>(type));
    int data = 0;  // data inputs: M handles, then the others
    while (data < u.input_size() && !parse_input(u.input(data)).control) ++data;
    if (m < 1 || data != m + static_cast<int64_t>(types.size())) continue;

    // The scale feeding other input k (data input m + k), or nullptr.
    auto scale_of = [&](size_t k) -> tfc::NodeDef* {
      const InputRef r = parse_input(u.input(static_cast<int>(m + static_cast<int64_t>(k))));
      tfc::NodeDef* p = r.port == 0 ? g.node(r.node) : nullptr;
      if (!p || (p->op() != "Mul" && p->op() != "RealDiv") || types[k] != *t ||
          type_attr(*p) != t || p->device() != u.device() || removed->count(p->name()) ||
          preserve.count(p->name()) || has_control_inputs(*p) || g.control_target(p->name()) ||
          g.consumers(p->name()) != 1 || p->input_size() != 2)
        return nullptr;
      return p;
    };
    std::vector<tfc::NodeDef*> scale(types.size());
    bool any = false;
    for (size_t k = 0; k < types.size(); ++k) any |= (scale[k] = scale_of(k)) != nullptr;
    if (!any) continue;

    // The new inputs: the handles, the inputs kept, then the scales' operands (deduplicated);
    // operand_of: an old data input's operand text in the new steps.
    std::vector<std::string> inputs(u.input().begin(), u.input().begin() + m);
    std::vector<tfc::DataType> input_types;
    std::map<std::string, int> index_of;  // a non-handle input, as written -> its data input
    auto input_text = [&](const std::string& in, tfc::DataType type) {
      auto [it, added] = index_of.emplace(in, static_cast<int>(inputs.size()));
      if (added) {
        inputs.push_back(in);
        input_types.push_back(type);
      }
      return "i" + std::to_string(it->second);
    };
    std::map<std::string, std::string> operand_of;  // "i<old>" -> "i<new>" / "s<new>"
    for (int64_t j = 0; j < m; ++j) operand_of["i" + std::to_string(j)] = "i" + std::to_string(j);
    for (size_t k = 0; k < types.size(); ++k)
      if (!scale[k])
        operand_of["i" + std::to_string(m + static_cast<int64_t>(k))] =
            input_text(u.input(static_cast<int>(m + static_cast<int64_t>(k))), types[k]);
    std::vector<std::string> steps;
    for (size_t k = 0; k < types.size(); ++k) {
      if (!scale[k]) continue;
      const tfc::NodeDef& p = *scale[k];
      steps.push_back(p.op() + " " + input_text(p.input(0), *t) + " " + input_text(p.input(1), *t));
      operand_of["i" + std::to_string(m + static_cast<int64_t>(k))] =
          "s" + std::to_string(steps.size() - 1);
      removed->insert(p.name());
      ++folded;
    }
    const size_t shift = steps.size();
    for (const std::string& text : u.attr().at("steps").list().s()) {
      std::istringstream words(text);
      std::string word, renamed;
      words >> renamed;
      while (words >> word)
        renamed += " " + (word[0] == 's' ? "s" + std::to_string(std::stoul(word.substr(1)) + shift)
                                         : operand_of.at(word));
      steps.push_back(renamed);
    }

    std::vector<std::string> controls(u.input().begin() + data, u.input().end());
    auto& attrs = *u.mutable_attr();
    attrs["Tin"] = type_list_value(input_types);
    attrs["steps"].mutable_list()->clear_s();
    for (const std::string& s : steps) attrs["steps"].mutable_list()->add_s(s);
    std::vector<int64_t> updates(attrs["updates"].list().i().begin(),
                                 attrs["updates"].list().i().end());
    attrs["updates"].mutable_list()->clear_i();
    for (int64_t s : updates)
      attrs["updates"].mutable_list()->add_i(s + static_cast<int64_t>(shift));
    u.clear_input();
    for (const std::string& in : inputs) u.add_input(in);
    for (const std::string& c : controls) u.add_input(c);
  }
  return folded;
}

// ---- rewrite 6: duplicate pure nodes ----

// Ops whose result depends only on their inputs and attributes (no state, no randomness), so
// two such nodes with the same inputs compute the same tensors. ReadVariableOp reads state, but
// two reads of one variable with the same control inputs are ordered alike against every writer
// (TensorFlow's automatic control dependencies order them), so they read the same value. Const:
// equal values (the same `value` attribute) are one constant; constant folding leaves Keras'
// Adam one `1.0` per variable, and the `iterations + 1` reading each are only duplicates once
// those are one.
bool pure_node(const tfc::NodeDef& n) {
  return n.op() == "Cast" || n.op() == "ReadVariableOp" || n.op() == "Const" ||
         compiler::ops::fusible_elementwise(n.op());
}

// Grappler's common-subexpression elimination (its arithmetic optimizer's dedup), which the
// plugin turns off with the arithmetic optimizer: Keras' optimizers compute iterations + 1 and
// its cast to float once per variable. Nodes in topological order; a pure NPU node with the
// same op, device, attributes and inputs (after earlier replacements; control inputs as a set)
// as an earlier one is replaced by it: its data consumers read the earlier node, and it goes
// (its control consumers then depend on the earlier node) unless TensorFlow must preserve it,
// in which case it stays, unread.
// `pure` picks the nodes considered (default: pure_node; dedup_rope_tables passes its own).
int dedup_pure_nodes(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                     std::set<std::string>* removed,
                     const std::function<bool(const tfc::NodeDef&)>& pure = pure_node) {
  const int n_nodes = graph.node_size();
  std::unordered_map<std::string, int> index;
  for (int i = 0; i < n_nodes; ++i) index[graph.node(i).name()] = i;
  // Topological order (Kahn over data and control edges); nodes on a cycle are left out.
  std::vector<std::vector<int>> out(n_nodes);
  std::vector<int> pending(n_nodes, 0);
  for (int i = 0; i < n_nodes; ++i)
    for (const std::string& in : graph.node(i).input()) {
      auto it = index.find(parse_input(in).node);
      if (it == index.end()) continue;
      out[it->second].push_back(i);
      ++pending[i];
    }
  std::vector<int> order;
  for (int i = 0; i < n_nodes; ++i)
    if (pending[i] == 0) order.push_back(i);
  for (size_t k = 0; k < order.size(); ++k)
    for (int c : out[order[k]])
      if (--pending[c] == 0) order.push_back(c);
  std::unordered_set<std::string> read;  // nodes with data consumers
  for (const tfc::NodeDef& n : graph.node())
    for (const std::string& in : n.input())
      if (!parse_input(in).control) read.insert(parse_input(in).node);

  int changed = 0;                                        // duplicates removed or no longer read
  std::unordered_map<std::string, std::string> replaced;  // duplicate -> the node it repeats
  std::unordered_map<std::string, std::string> first;     // key -> node
  auto renamed = [&](const std::string& in) {
    const InputRef r = parse_input(in);
    auto it = replaced.find(r.node);
    if (it == replaced.end()) return in;
    return r.control ? "^" + it->second : output_name(it->second, r.port);
  };
  for (int i : order) {
    tfc::NodeDef& n = *graph.mutable_node(i);
    for (int k = 0; k < n.input_size(); ++k) n.set_input(k, renamed(n.input(k)));
    if (!on_npu(n) || !pure(n)) continue;
    std::string key = n.op() + "|" + n.device() + "|";
    std::set<std::string> controls;
    for (const std::string& in : n.input()) {
      if (parse_input(in).control) {
        controls.insert(in);
      } else {
        key += in + ",";
      }
    }
    for (const std::string& c : controls) key += c + ",";
    std::vector<std::string> names;  // the attributes in name order
    for (const auto& [name, value] : n.attr()) names.push_back(name);
    std::sort(names.begin(), names.end());
    for (const std::string& name : names) {
      std::string bytes;
      n.attr().at(name).SerializeToString(&bytes);
      key += "|" + name + "=" + bytes;
    }
    auto [it, added] = first.emplace(key, n.name());
    if (added) continue;
    replaced[n.name()] = it->second;
    if (!preserve.count(n.name())) removed->insert(n.name());
    changed += !preserve.count(n.name()) || read.count(n.name());
  }
  if (replaced.empty()) return 0;
  // Control inputs from removed duplicates now come from the node they repeat (once each);
  // data inputs were renamed above, except those of nodes left out of the order.
  for (int i = 0; i < n_nodes; ++i) {
    tfc::NodeDef& n = *graph.mutable_node(i);
    if (removed->count(n.name())) continue;
    std::set<std::string> had;
    std::vector<std::string> inputs;
    for (const std::string& in : n.input()) {
      const InputRef r = parse_input(in);
      std::string text = in;
      if (!r.control || removed->count(r.node)) text = renamed(in);
      if (parse_input(text).control && (text == "^" + n.name() || !had.insert(text).second))
        continue;
      inputs.push_back(text);
    }
    n.clear_input();
    for (const std::string& in : inputs) n.add_input(in);
  }
  return changed;
}

// ---- rewrites 7-9: decoder-model fusions (keras-hub's Llama-family graphs) ----
// Each anchors at the last node of keras-hub's subgraph, checks every node of it (ops, types,
// constants, consumers) and rewrites the anchor in place as CANN's fused op (kernels_llm.cpp).

// The shape of data input i of n as TensorFlow's shape inference recorded it (_input_shapes);
// empty if unknown (no record, unknown rank or a dimension of unknown size).
std::vector<int64_t> input_shape(const tfc::NodeDef& n, int i) {
  auto it = n.attr().find("_input_shapes");
  if (it == n.attr().end() || i >= it->second.list().shape_size()) return {};
  const tfc::TensorShapeProto& s = it->second.list().shape(i);
  std::vector<int64_t> dims;
  if (s.unknown_rank()) return {};
  for (const auto& d : s.dim()) {
    if (d.size() < 0) return {};
    dims.push_back(d.size());
  }
  return dims;
}

// n is a Cast on the NPU from `from` to `to` (either: any type where nullopt).
bool is_cast(const tfc::NodeDef* n, std::optional<tfc::DataType> from,
             std::optional<tfc::DataType> to) {
  if (!n || n->op() != "Cast" || !on_npu(*n)) return false;
  const auto src = type_attr(*n, "SrcT"), dst = type_attr(*n, "DstT");
  return src && dst && (!from || *src == *from) && (!to || *dst == *to);
}

// A Transpose of data input 0 by the constant permutation `perm`.
tfc::NodeDef* transpose_by(GraphView& g, tfc::NodeDef* n, const std::vector<int64_t>& perm) {
  if (!n || n->op() != "Transpose" || !on_npu(*n)) return nullptr;
  const tfc::NodeDef* p = input_node(g, *n, 1);
  std::optional<std::vector<int64_t>> v = p ? const_ints(*p) : std::nullopt;
  return v && *v == perm ? n : nullptr;
}

// A BatchMatMulV2 without adjoints.
bool plain_batch_matmul(const tfc::NodeDef* n) {
  if (!n || n->op() != "BatchMatMulV2" || !on_npu(*n)) return false;
  for (const char* a : {"adj_x", "adj_y"}) {
    auto it = n->attr().find(a);
    if (it != n->attr().end() && it->second.b()) return false;
  }
  return true;
}

// Cast from the model's type T to f32 where T is half or bfloat16: the node producing input i of
// n is such a Cast (returned, to be removed) and *from is its input; for T = f32, *from is
// input i itself and nullptr is returned with ok. False when the pattern does not hold.
bool widened_input(GraphView& g, const tfc::NodeDef& n, int i, tfc::DataType t, tfc::NodeDef** cast,
                   std::string* from) {
  *cast = nullptr;
  if (i >= n.input_size() || parse_input(n.input(i)).control) return false;
  if (t == tfc::DT_FLOAT) {
    *from = n.input(i);
    return true;
  }
  tfc::NodeDef* c = input_node(g, n, i);
  if (!is_cast(c, t, tfc::DT_FLOAT)) return false;
  *cast = c;
  *from = c->input(0);
  return true;
}

// A new node `name` on `device` (appended to the graph).
tfc::NodeDef* add_node(tfc::GraphDef& graph, const std::string& name, const char* op,
                       const std::string& device, const std::vector<std::string>& inputs,
                       const std::map<std::string, tfc::AttrValue>& attrs) {
  tfc::NodeDef* n = graph.add_node();
  n->set_name(name);
  n->set_op(op);
  n->set_device(device);
  for (const std::string& in : inputs) n->add_input(in);
  for (const auto& [k, v] : attrs) (*n->mutable_attr())[k] = v;
  return n;
}

std::map<std::string, tfc::AttrValue> cast_attrs(tfc::DataType from, tfc::DataType to) {
  std::map<std::string, tfc::AttrValue> a;
  a["SrcT"] = type_value(from);
  a["DstT"] = type_value(to);
  a["Truncate"].set_b(false);
  return a;
}

std::vector<int64_t> variable_shape(GraphView& g, const std::string& in);  // below

// Rewrite 7, RmsNorm (keras-hub's LlamaLayerNorm / Llama3's, Gemma's RMSNormalization), T the
// model's compute type:
//   [xf = Cast(x: T -> f32)]  p = Pow(xf, 2.0) or Square(xf)  m = Mean(p, last axis, keep_dims)
//   a = AddV2(m, eps)  r = Rsqrt(a) or Reciprocal(Sqrt(a))  y = Mul(Mul(xf, r), gf)
//   [Cast(y: f32 -> T)]
// gf the scale: a variable's value [through a Cast T -> f32] (read by the fused op as gamma; the
// Cast goes if nothing else reads it), or Gemma's AddV2(1.0, that) (it stays: for T = f32 the
// fused op reads it, else a new Cast of it to T, "<last>/npusim_gamma"). Operands of Mul / AddV2
// in either order. The scale's variable [H], H a multiple of 16 (the kernel's rows).
int fuse_rms_norms(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                   std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  for (int pass = 0; pass < 2; ++pass)  // half / bfloat16 models first, then f32 ones
    for (int i = 0; i < g.size(); ++i) {
      tfc::NodeDef& last = *g.at(i);
      if (!on_npu(last) || rm.claimed(last.name())) continue;
      tfc::NodeDef* y = nullptr;
      tfc::DataType t = tfc::DT_FLOAT;
      if (pass == 0 && is_cast(&last, tfc::DT_FLOAT, std::nullopt) &&
          half_type(*type_attr(last, "DstT"))) {
        y = g.producer(last, 0, "Mul");
        t = *type_attr(last, "DstT");
        if (!y || !rm.removable(*y, 1)) continue;
      } else if (pass == 1 && last.op() == "Mul") {
        y = &last;
      } else {
        continue;
      }
      if (!float_node(*y)) continue;
      // The chain under y, fused in place of last: true if it matched.
      auto fuse_under = [&]() -> bool {
        for (int o = 0; o < 2; ++o) {
          tfc::NodeDef* xr = g.producer(*y, o, "Mul");
          if (!xr || !float_node(*xr) || !rm.removable(*xr, 1)) continue;
          tfc::NodeDef *gcast = nullptr, *xcast = nullptr;
          std::string gamma, x;
          // Gemma's scale: gf = AddV2(1.0, s), s a variable's value [through a Cast T -> f32]
          tfc::NodeDef* one_plus = g.producer(*y, 1 - o, "AddV2");
          if (one_plus && (!float_node(*one_plus) || !on_npu(*one_plus))) one_plus = nullptr;
          for (int k = 0; one_plus && k < 2; ++k) {
            tfc::NodeDef* s = input_node(g, *one_plus, 1 - k);
            if (scalar_value(input_node(g, *one_plus, k)) != 1.0 || !s) continue;
            if (t == tfc::DT_FLOAT
                    ? s->op() == "ReadVariableOp"
                    : is_cast(s, t, tfc::DT_FLOAT) && g.producer(*s, 0, "ReadVariableOp"))
              gamma = one_plus->name();
          }
          if (gamma.empty() && !widened_input(g, *y, 1 - o, t, &gcast, &gamma)) continue;
          // xr = Mul(xf, r), r = Rsqrt(a) or Reciprocal(Sqrt(a)) (Gemma)
          for (int q = 0; q < 2; ++q) {
            tfc::NodeDef* r = g.producer(*xr, q, "Rsqrt");
            tfc::NodeDef* sq = nullptr;
            if (!r && (r = g.producer(*xr, q, "Reciprocal"))) {
              sq = g.producer(*r, 0, "Sqrt");
              if (!sq || !float_node(*sq) || !rm.removable(*sq, 1)) continue;
            }
            tfc::NodeDef* a = r ? g.producer(sq ? *sq : *r, 0, "AddV2") : nullptr;
            if (!a || !rm.removable(*r, 1) || !rm.removable(*a, 1)) continue;
            if (!widened_input(g, *xr, 1 - q, t, &xcast, &x)) continue;
            const std::string xf = xr->input(1 - q);
            for (int k = 0; k < 2; ++k) {
              tfc::NodeDef* m = g.producer(*a, k, "Mean");
              std::optional<double> eps = scalar_value(input_node(g, *a, 1 - k));
              if (!m || !eps || !rm.removable(*m, 1) || !float_node(*m) || !float_node(*a) ||
                  !float_node(*r))
                continue;
              auto kd = m->attr().find("keep_dims");
              const tfc::NodeDef* axes = input_node(g, *m, 1);
              if (kd == m->attr().end() || !kd->second.b() || !axes ||
                  const_ints(*axes) != std::vector<int64_t>{-1})
                continue;
              tfc::NodeDef* p = input_node(g, *m, 0);
              if (!p || !on_npu(*p) || !float_node(*p) || !rm.removable(*p, 1) || p->input(0) != xf)
                continue;
              if (!(p->op() == "Square" ||
                    (p->op() == "Pow" && scalar_value(input_node(g, *p, 1)) == 2.0)))
                continue;
              // gamma is a variable's value (the layer's scale; the kernel checks it is [H])
              const tfc::NodeDef* gv = g.node(parse_input(gamma).node);
              if (!gv || (gv != one_plus && gv->op() != "ReadVariableOp")) continue;
              // H, the scale variable's [H], what the kernel takes (ops/norm.cpp: a multiple
              // of 16); unknown: left unfused, as a width the kernel refuses would fail the run
              std::string scale = gamma;
              for (int k = 0; gv == one_plus && k < 2; ++k)
                if (scalar_value(input_node(g, *one_plus, k)) != 1.0) scale = one_plus->input(k);
              const std::vector<int64_t> h = variable_shape(g, scale);
              if (h.size() != 1 || h[0] % 16 != 0) continue;
              // xf (a Cast) is read by p and xr only
              if (xcast && !rm.removable(*xcast, 2)) continue;
              std::vector<tfc::NodeDef*> gone = {p, m, a, r, xr};
              if (sq) gone.push_back(sq);
              if (gv == one_plus && t != tfc::DT_FLOAT)  // 1 + s (f32) rounded to T once
                gamma = add_node(graph, last.name() + "/npusim_gamma", "Cast", last.device(),
                                 {gamma}, cast_attrs(tfc::DT_FLOAT, t))
                            ->name();
              if (y != &last) gone.push_back(y);
              if (xcast) gone.push_back(xcast);
              if (gcast && rm.removable(*gcast, 1)) gone.push_back(gcast);
              for (tfc::NodeDef* n : gone) rm.remove(n->name());
              std::map<std::string, tfc::AttrValue> attrs;
              attrs["T"] = type_value(t);
              attrs["epsilon"].set_f(static_cast<float>(*eps));
              rewrite_as(last, "RmsNorm", {x, gamma}, attrs);
              rm.claim(last.name());
              ++fused;
              return true;
            }
          }
        }
        return false;
      };
      fuse_under();
    }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// The values of the int Const feeding data input i of n (nullopt: not such a Const).
std::optional<std::vector<int64_t>> input_ints(GraphView& g, const tfc::NodeDef& n, int i) {
  const tfc::NodeDef* c = input_node(g, n, i);
  return c ? const_ints(*c) : std::nullopt;
}

// Whether tensors a and b are Reshapes to one constant, fully known shape (keras' Dense layers'
// outputs: Tensordot's Reshape to [batch, seq, units]).
bool same_static_shape(GraphView& g, const std::string& a, const std::string& b) {
  const InputRef ra = parse_input(a), rb = parse_input(b);
  const tfc::NodeDef* na = ra.port ? nullptr : g.node(ra.node);
  const tfc::NodeDef* nb = rb.port ? nullptr : g.node(rb.node);
  if (!na || !nb || na->op() != "Reshape" || nb->op() != "Reshape") return false;
  const tfc::NodeDef* sa = input_node(g, *na, 1);
  const tfc::NodeDef* sb = input_node(g, *nb, 1);
  std::optional<std::vector<int64_t>> da = sa ? const_ints(*sa) : std::nullopt;
  std::optional<std::vector<int64_t>> db = sb ? const_ints(*sb) : std::nullopt;
  if (!da || !db || *da != *db || da->empty()) return false;
  for (int64_t d : *da)
    if (d < 0) return false;
  return true;
}

// Node i if it is an unclaimed `op` on the NPU of a float type T (*t = T): where rewrites 8 and
// 10 start matching.
tfc::NodeDef* float_anchor(GraphView& g, const Removal& rm, int i, const char* op,
                           std::optional<tfc::DataType>* t) {
  tfc::NodeDef& n = *g.at(i);
  *t = type_attr(n);
  if (n.op() != op || !on_npu(n) || !*t || !float_type(**t) || rm.claimed(n.name())) return nullptr;
  return &n;
}

// Rewrite 8, SwiGlu (Llama's feed-forward: silu of the gate in f32, times the up projection):
//   [gf = Cast(gate: T -> f32)]  s = Sigmoid(gf)  h = Mul(gf, s)  [hc = Cast(h: f32 -> T)]
//   out = Mul(up, hc or h)        (operands of either Mul in either order)
int fuse_swiglus(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                 std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  for (int i = 0; i < g.size(); ++i) {
    std::optional<tfc::DataType> t;
    tfc::NodeDef* anchor = float_anchor(g, rm, i, "Mul", &t);
    if (!anchor) continue;
    tfc::NodeDef& out = *anchor;
    for (int o = 0; o < 2; ++o) {
      tfc::NodeDef* hc = nullptr;
      tfc::NodeDef* h = nullptr;
      if (*t == tfc::DT_FLOAT) {
        h = g.producer(out, o, "Mul");
      } else {
        hc = input_node(g, out, o);
        if (!is_cast(hc, tfc::DT_FLOAT, *t) || !rm.removable(*hc, 1)) continue;
        h = g.producer(*hc, 0, "Mul");
      }
      if (!h || !float_node(*h) || !rm.removable(*h, 1) || parse_input(out.input(1 - o)).control)
        continue;
      for (int q = 0; q < 2; ++q) {
        tfc::NodeDef* s = g.producer(*h, q, "Sigmoid");
        if (!s || !float_node(*s) || !rm.removable(*s, 1) || s->input(0) != h->input(1 - q))
          continue;
        tfc::NodeDef* gcast = nullptr;
        std::string gate;
        if (!widened_input(g, *h, 1 - q, *t, &gcast, &gate)) continue;
        if (gcast && !rm.removable(*gcast, 2)) continue;
        if (!same_static_shape(g, gate, out.input(1 - o))) continue;
        for (tfc::NodeDef* n : {hc, h, s, gcast})
          if (n) rm.remove(n->name());
        std::map<std::string, tfc::AttrValue> attrs;
        attrs["T"] = type_value(*t);
        rewrite_as(out, "SwiGlu", {gate, out.input(1 - o)}, attrs);
        rm.claim(out.name());
        ++fused;
        o = 2;
        break;
      }
    }
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// Rewrite 13, WeightQuantBatchMatmulV2 (Keras' weight-only int8 Dense / EinsumDense, T half or
// bfloat16):
//   wc = Cast(w: int8 -> T)  [wr = Reshape(wc, 2-D constant shape)]
//   mm = MatMul(a, wc) or BatchMatMulV2(a, wr)  [z = Reshape(mm, constant shape)]
//   out = RealDiv(z or mm, s)
// -> "<out>/npusim_weight" = Reshape(w, wr's shape) where wr is there,
//    "<out>/npusim_antiquant_scale" = Reciprocal(s) (any shape of N elements),
//    "<out>/npusim_matmul" = WeightQuantBatchMatmulV2(a, w or npusim_weight, that), and out
//    becomes Reshape(npusim_matmul, z's shape) (or, without z, the fused op itself).
// s is Keras' kernel_scale (the quantisation's multiplier, one per output column: the kernel
// checks it has N elements); its reciprocal is CANN's antiquant_scale. MatMul without
// transposes; a BatchMatMulV2 only with its weight reshaped to 2-D (a weight shared by the batch).
int fuse_weight_quant_matmuls(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                              std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  std::vector<std::function<void()>> rewrites;  // applied after the scan (add_node grows graph)
  int fused = 0;
  for (int i = 0; i < g.size(); ++i) {
    std::optional<tfc::DataType> t;
    tfc::NodeDef* anchor = float_anchor(g, rm, i, "RealDiv", &t);
    if (!anchor || !half_type(*t) || parse_input(anchor->input(1)).control) continue;
    tfc::NodeDef& out = *anchor;
    tfc::NodeDef* z = g.producer(out, 0, "Reshape");
    if (z && (!const_reshape(g, z) || !rm.removable(*z, 1))) continue;
    tfc::NodeDef* mm = input_node(g, z ? *z : out, 0);
    if (!mm || !on_npu(*mm) || type_attr(*mm) != *t || !rm.removable(*mm, 1)) continue;
    tfc::NodeDef* wr = nullptr;
    tfc::NodeDef* wc = nullptr;
    if (mm->op() == "MatMul") {
      bool transposed = false;
      for (const char* a : {"transpose_a", "transpose_b"}) {
        auto it = mm->attr().find(a);
        transposed |= it != mm->attr().end() && it->second.b();
      }
      if (transposed) continue;
      wc = input_node(g, *mm, 1);
    } else if (plain_batch_matmul(mm)) {
      wr = g.producer(*mm, 1, "Reshape");
      const tfc::NodeDef* shape = wr && const_reshape(g, wr) ? input_node(g, *wr, 1) : nullptr;
      std::optional<std::vector<int64_t>> dims = shape ? const_ints(*shape) : std::nullopt;
      if (!dims || dims->size() != 2 || !rm.removable(*wr, 1)) continue;
      wc = input_node(g, *wr, 0);
    } else {
      continue;
    }
    if (!is_cast(wc, tfc::DT_INT8, *t) || !rm.removable(*wc, 1) ||
        parse_input(mm->input(0)).control)
      continue;
    for (tfc::NodeDef* n : {z, mm, wr, wc})
      if (n) rm.remove(n->name());
    rm.claim(out.name());
    ++fused;
    // Copies of what the rewrite reads: the graph's node storage moves as nodes are added.
    const std::string name = out.name(), device = out.device(), a = mm->input(0), w = wc->input(0),
                      scale = out.input(1);
    const std::string w_shape = wr ? wr->input(1) : std::string(),
                      z_shape = z ? z->input(1) : std::string();
    const tfc::DataType type = *t;
    rewrites.push_back([&graph, &g, name, device, a, w, scale, w_shape, z_shape, type] {
      std::map<std::string, tfc::AttrValue> tattrs;
      tattrs["T"] = type_value(type);
      std::map<std::string, tfc::AttrValue> rattrs = tattrs;
      rattrs["Tshape"] = type_value(tfc::DT_INT32);
      std::string weight = w;
      if (!w_shape.empty()) {
        std::map<std::string, tfc::AttrValue> wattrs = rattrs;
        wattrs["T"] = type_value(tfc::DT_INT8);
        weight = add_node(graph, name + "/npusim_weight", "Reshape", device, {w, w_shape}, wattrs)
                     ->name();
      }
      // The reciprocal feeds the fused op directly (the kernel takes any shape of N elements):
      // a Reshape between them would split them into two clusters, the Reciprocal then
      // dispatched on its own at every step.
      const std::string antiquant =
          add_node(graph, name + "/npusim_antiquant_scale", "Reciprocal", device, {scale}, tattrs)
              ->name();
      std::map<std::string, tfc::AttrValue> qattrs = tattrs;
      qattrs["transpose_x"].set_b(false);
      qattrs["transpose_weight"].set_b(false);
      qattrs["antiquant_group_size"].set_i(0);
      tfc::NodeDef* o = g.node(name);
      if (z_shape.empty()) {
        rewrite_as(*o, "WeightQuantBatchMatmulV2", {a, weight, antiquant}, qattrs);
        return;
      }
      const std::string q = add_node(graph, name + "/npusim_matmul", "WeightQuantBatchMatmulV2",
                                     device, {a, weight, antiquant}, qattrs)
                                ->name();
      o = g.node(name);
      rewrite_as(*o, "Reshape", {q, z_shape}, rattrs);
    });
  }
  for (const auto& r : rewrites) r();
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

bool fp32_attention_allowed();  // below

// Rewrite 14, a 2-D Transpose folded into the MatMul reading it (grappler's arithmetic
// optimizer does this, FoldTransposeIntoMatMul, but the plugin turns that optimizer off):
//   wt = Transpose(w, [1, 0])  MatMul(a, wt) -> MatMul(a, w; transpose_b = !transpose_b)
// (likewise input 0 and transpose_a), the Transpose read only by the MatMul. Keras'
// ReversibleEmbedding with tied weights (Llama 3.2 1B's vocabulary projection) multiplies by
// transpose(embeddings) in every call: a copy of the whole table per decode step, where the cube
// reads a transposed operand as it is stored (load2d's transposing fractal loads). T half or
// bfloat16, or float where its cube operands round to fp16 anyway (the transposing load takes
// 16-bit fractals; under must_keep_origin_dtype the f32 product cannot be transposed).
int fold_matmul_transposes(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                           std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  const bool f32_ok = fp32_attention_allowed();
  int folded = 0;
  for (int i = 0; i < g.size(); ++i) {
    tfc::NodeDef& mm = *graph.mutable_node(i);
    if (mm.op() != "MatMul" || !on_npu(mm) || rm.claimed(mm.name())) continue;
    const std::optional<tfc::DataType> t = type_attr(mm);
    if (!t || (!half_type(*t) && !(*t == tfc::DT_FLOAT && f32_ok))) continue;
    for (int operand = 0; operand < 2; ++operand) {
      tfc::NodeDef* tr = transpose_by(g, input_node(g, mm, operand), {1, 0});
      if (!tr || !rm.removable(*tr, 1) || parse_input(tr->input(0)).control) continue;
      const char* attr = operand == 0 ? "transpose_a" : "transpose_b";
      auto it = mm.attr().find(attr);
      const bool was = it != mm.attr().end() && it->second.b();
      rm.remove(tr->name());
      mm.set_input(operand, tr->input(0));
      (*mm.mutable_attr())[attr].set_b(!was);
      // TensorFlow's recorded shape of the operand is now the untransposed one.
      auto shapes = mm.mutable_attr()->find("_input_shapes");
      if (shapes != mm.mutable_attr()->end() && operand < shapes->second.list().shape_size()) {
        tfc::TensorShapeProto* sh = shapes->second.mutable_list()->mutable_shape(operand);
        if (sh->dim_size() == 2) {
          const int64_t d0 = sh->dim(0).size();
          sh->mutable_dim(0)->set_size(sh->dim(1).size());
          sh->mutable_dim(1)->set_size(d0);
        }
      }
      ++folded;
    }
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return folded;
}

// The bool values of a DT_BOOL Const.
std::optional<std::vector<bool>> const_bools(const tfc::NodeDef& n, std::vector<int64_t>* shape) {
  const tfc::TensorProto* tensor = const_tensor(n, tfc::DT_BOOL);
  if (!tensor) return std::nullopt;
  const tfc::TensorProto& t = *tensor;
  int64_t elements = 1;
  shape->clear();
  for (const auto& d : t.tensor_shape().dim()) {
    elements *= d.size();
    shape->push_back(d.size());
  }
  std::vector<bool> v;
  if (t.bool_val_size() > 0) {
    for (int64_t i = 0; i < elements; ++i)
      v.push_back(t.bool_val(static_cast<int>(std::min<int64_t>(i, t.bool_val_size() - 1))));
    return v;
  }
  if (static_cast<int64_t>(t.tensor_content().size()) != elements) return std::nullopt;
  for (int64_t i = 0; i < elements; ++i) v.push_back(t.tensor_content()[i] != 0);
  return v;
}

// The values of a float Const holding a vector.
std::optional<std::vector<float>> const_floats(const tfc::NodeDef* n) {
  const tfc::TensorProto* tensor = n ? const_tensor(*n, tfc::DT_FLOAT) : nullptr;
  if (!tensor) return std::nullopt;
  const tfc::TensorProto& t = *tensor;
  int64_t elements = 1;
  for (const auto& d : t.tensor_shape().dim()) elements *= d.size();
  std::vector<float> v;
  if (t.float_val_size() > 0) {
    for (int64_t i = 0; i < elements; ++i)
      v.push_back(t.float_val(static_cast<int>(std::min<int64_t>(i, t.float_val_size() - 1))));
    return v;
  }
  if (static_cast<int64_t>(t.tensor_content().size()) != elements * 4) return std::nullopt;
  v.resize(elements);
  std::memcpy(v.data(), t.tensor_content().data(), t.tensor_content().size());
  return v;
}

// keras-hub's attention mask, as the fused ops express it.
struct AttentionMask {
  // Constant mask [B, H.., Sq, L]: query i sees keys j <= i + offset (causal) or all keys.
  bool constant = false, causal = false;
  int64_t offset = 0;
  // Decode step: mask[b, .., 0, j] = (j <= index), index the int32 tensor `index`.
  std::string index;
  int64_t seq_kv = 0;  // L
  // The product of the dimensions between batch and query (1: broadcast over the heads; the
  // query heads where the mask was broadcast to the scores' shape), -1 where not known.
  int64_t heads = -1;
  std::vector<tfc::NodeDef*> nodes;  // the mask's subgraph (removed if nothing else reads it)
};

// The mask read by the softmax's SelectV2s:
//   - a bool Const of shape [B, H.., Sq, L] (H..: one or two dimensions, each 1 or the heads)
//     that is causal with one offset (or all true), the same for every batch entry and head;
//   - a decode step's compute_causal_mask(batch, L, 1, index) as grappler leaves it: c =
//     BroadcastTo(ExpandDims(GreaterEqual(ExpandDims(pos, 1), range(L)), 0), shape) with pos =
//     BroadcastTo(Cast(index), [1]) or AddV2(Cast(index), [0]), then given its head axes by
//     StridedSlice c[:, None] (Llama) or c[:, None, None] (Gemma), or by BroadcastTo(
//     ExpandDims(c, 1), [B, N, 1, L]) (keras' dot_product_attention: GPT-2).
// seq_kv: the keys' length L the mask must have (<= 0: any, taken from the mask). *seq_q gets
// the query length the mask is for.
std::optional<AttentionMask> match_mask(GraphView& g, const std::string& mask_in, int64_t seq_kv,
                                        int64_t* seq_q) {
  const InputRef r = parse_input(mask_in);
  tfc::NodeDef* n = r.control || r.port ? nullptr : g.node(r.node);
  if (!n) return std::nullopt;
  AttentionMask m;
  std::vector<int64_t> shape;
  if (std::optional<std::vector<bool>> v = const_bools(*n, &shape)) {
    if (shape.size() != 4 && shape.size() != 5) return std::nullopt;
    const int64_t sq = shape[shape.size() - 2], l = shape.back();
    if (sq < 1 || l < 1 || (seq_kv > 0 && l != seq_kv)) return std::nullopt;
    seq_kv = l;
    *seq_q = sq;
    m.heads = 1;
    for (size_t d = 1; d + 2 < shape.size(); ++d) m.heads *= shape[d];
    // all true: no mask; else one offset for every row and batch entry
    for (const std::optional<int64_t> off : {std::optional<int64_t>{}, std::optional<int64_t>{0},
                                             std::optional<int64_t>{seq_kv - *seq_q}}) {
      bool same = true;
      for (size_t e = 0; e < v->size() && same; ++e) {
        const int64_t j = static_cast<int64_t>(e) % seq_kv;
        const int64_t i = static_cast<int64_t>(e) / seq_kv % *seq_q;
        same = (*v)[e] == (!off || j <= i + *off);
      }
      if (!same) continue;
      m.constant = true;
      m.causal = off.has_value();
      m.offset = off.value_or(0);
      m.seq_kv = seq_kv;
      m.nodes = {n};
      return m;
    }
    return std::nullopt;
  }
  *seq_q = 1;  // a decode step's: the position index over keys [0, seq_kv)
  auto attr_i = [](const tfc::NodeDef* x, const char* a) {
    auto it = x->attr().find(a);
    return it == x->attr().end() ? int64_t{0} : it->second.i();
  };
  tfc::NodeDef* bc = nullptr;
  if (n->op() == "StridedSlice") {
    // [:, None, :, :] or [:, None, None, :, :]
    const int64_t new_axes = attr_i(n, "new_axis_mask");
    const int rank = new_axes == 2 ? 4 : new_axes == 6 ? 5 : 0;
    const int64_t full = ((int64_t{1} << rank) - 1) & ~new_axes;
    if (!rank || attr_i(n, "shrink_axis_mask") != 0 || attr_i(n, "ellipsis_mask") != 0 ||
        (attr_i(n, "begin_mask") & full) != full || (attr_i(n, "end_mask") & full) != full)
      return std::nullopt;
    const tfc::NodeDef* strides = input_node(g, *n, 3);
    std::optional<std::vector<int64_t>> sv = strides ? const_ints(*strides) : std::nullopt;
    if (!sv || *sv != std::vector<int64_t>(rank, 1)) return std::nullopt;
    bc = g.producer(*n, 0, "BroadcastTo");
    m.heads = 1;
    m.nodes = {n};
  } else if (n->op() == "BroadcastTo") {
    // BroadcastTo(ExpandDims(c, 1), [B, N, 1, L])
    tfc::NodeDef* ed = g.producer(*n, 0, "ExpandDims");
    std::optional<std::vector<int64_t>> to = input_ints(g, *n, 1);
    if (!ed || input_ints(g, *ed, 1) != std::vector<int64_t>{1} || !to || to->size() != 4 ||
        (*to)[1] < 1 || (*to)[2] != 1)
      return std::nullopt;
    bc = g.producer(*ed, 0, "BroadcastTo");
    m.heads = (*to)[1];
    m.nodes = {n, ed};
  }
  tfc::NodeDef* e0 = bc ? g.producer(*bc, 0, "ExpandDims") : nullptr;
  tfc::NodeDef* ge = e0 ? g.producer(*e0, 0, "GreaterEqual") : nullptr;
  tfc::NodeDef* e1 = ge ? g.producer(*ge, 0, "ExpandDims") : nullptr;
  if (!e1 || input_ints(g, *e0, 1) != std::vector<int64_t>{0} ||
      input_ints(g, *e1, 1) != std::vector<int64_t>{1} || type_attr(*ge) != tfc::DT_FLOAT)
    return std::nullopt;
  std::optional<std::vector<float>> range = const_floats(input_node(g, *ge, 1));
  if (!range || range->empty() || (seq_kv > 0 && static_cast<int64_t>(range->size()) != seq_kv))
    return std::nullopt;
  seq_kv = static_cast<int64_t>(range->size());
  for (int64_t j = 0; j < seq_kv; ++j)
    if ((*range)[j] != static_cast<float>(j)) return std::nullopt;
  tfc::NodeDef* pos = input_node(g, *e1, 0);
  tfc::NodeDef* cast = nullptr;
  if (pos && pos->op() == "BroadcastTo" && input_ints(g, *pos, 1) == std::vector<int64_t>{1}) {
    cast = input_node(g, *pos, 0);
  } else if (pos && pos->op() == "AddV2") {
    for (int k = 0; k < 2 && !cast; ++k) {
      std::optional<std::vector<float>> zero = const_floats(input_node(g, *pos, 1 - k));
      if (zero && *zero == std::vector<float>{0.0f}) cast = input_node(g, *pos, k);
    }
  }
  if (!is_cast(cast, tfc::DT_INT32, tfc::DT_FLOAT)) return std::nullopt;
  m.index = cast->input(0);
  m.seq_kv = seq_kv;
  m.nodes.insert(m.nodes.end(), {bc, e0, ge, e1, pos, cast});
  return m;
}

// The key or value as the attention reads it: t itself (one query head per KV head) or
// keras.ops.repeat(t, G, axis=2) as Reshape(Tile(ExpandDims(t, 3), [1, 1, 1, G, 1]),
// [B, L, Nkv * G, D]), or with G = 1 as Reshape(ExpandDims(t, 3), [B, L, Nkv, D]) (grappler
// removes a Tile by ones: keras-hub's LlamaAttention repeats by 1 for MHA).
struct KeyValue {
  std::string source;                 // t
  std::vector<int64_t> shape;         // t's [B, L, Nkv, D]
  int64_t heads = 0;                  // Nkv * G: the query heads
  std::vector<tfc::NodeDef*> repeat;  // the repeat's nodes, if any
};

// The KeyValue read through Transpose node `tr` (its input 0); the shapes come from the repeat's
// constant shape, or without a repeat from TensorFlow's recorded _input_shapes.
std::optional<KeyValue> unrepeated(GraphView& g, const tfc::NodeDef& tr) {
  KeyValue kv;
  kv.source = tr.input(0);
  tfc::NodeDef* n = input_node(g, tr, 0);
  tfc::NodeDef* tile = n && n->op() == "Reshape" ? g.producer(*n, 0, "Tile") : nullptr;
  tfc::NodeDef* ed = tile ? g.producer(*tile, 0, "ExpandDims") : nullptr;
  // keras' repeat by 1 (MHA: as many KV heads as query heads, Llama 2 7B): grappler drops the
  // Tile of multiples 1, leaving Reshape(ExpandDims(x, 3)).
  if (!tile && n && n->op() == "Reshape") ed = g.producer(*n, 0, "ExpandDims");
  if (!ed) {
    kv.shape = input_shape(tr, 0);
    if (kv.shape.size() != 4) return std::nullopt;
    kv.heads = kv.shape[2];
    return kv;
  }
  std::optional<std::vector<int64_t>> dim = input_ints(g, *ed, 1);
  std::optional<std::vector<int64_t>> mult =
      tile ? input_ints(g, *tile, 1) : std::vector<int64_t>{1, 1, 1, 1, 1};
  std::optional<std::vector<int64_t>> to = input_ints(g, *n, 1);
  if (!dim || !mult || !to || mult->size() != 5 || to->size() != 4 ||
      !(*dim == std::vector<int64_t>{3} || *dim == std::vector<int64_t>{-2}))
    return std::nullopt;
  const int64_t reps = (*mult)[3];
  if ((*mult)[0] != 1 || (*mult)[1] != 1 || (*mult)[2] != 1 || (*mult)[4] != 1 || reps < 1 ||
      (*to)[2] % reps != 0)
    return std::nullopt;
  for (int64_t d : *to)
    if (d < 1) return std::nullopt;
  kv.source = ed->input(0);
  kv.shape = {(*to)[0], (*to)[1], (*to)[2] / reps, (*to)[3]};
  kv.heads = (*to)[2];
  kv.repeat = tile ? std::vector<tfc::NodeDef*>{n, tile, ed} : std::vector<tfc::NodeDef*>{n, ed};
  return kv;
}

// Where fp32 attention may run in fp16 (the fused kernels take half or bfloat16): the device's
// precision mode lets fp32 cube operands be rounded to fp16 (allow_fp32_to_fp16,
// allow_mix_precision), as the unfused products' operands already are.
bool fp32_attention_allowed() {
  PluginSettings s;
  if (device_if_open()) {
    s = opened_settings();
  } else if (!settings_from_env(&s).ok()) {
    return false;
  }
  return s.precision != compiler::PrecisionMode::kKeepFp32;
}

// One attention subgraph matched by rewrite 9, as the fused op takes it: q [B, Sq, N, D], k and
// v [B, L, Nkv, D] in the model's type, the scores' scale, the mask.
struct AttentionMatch {
  std::string q, k, v;
  double scale = 1.0;
  int64_t heads = 0, kv_heads = 0;  // N and Nkv (0: the kernel takes them from the shapes)
  AttentionMask mask;
  std::vector<tfc::NodeDef*> gone;  // the nodes removed (besides out, rewritten in place)
};

// The scale of node n where it is Mul(x, scale) or Mul(scale, x) with scale a scalar constant:
// *x gets x's node (nullptr if n is not so), *x_in (if given) the input naming it.
std::optional<double> scaled_by(GraphView& g, const tfc::NodeDef* n, tfc::NodeDef** x,
                                std::string* x_in = nullptr) {
  *x = nullptr;
  if (!n || n->op() != "Mul" || n->input_size() < 2) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    std::optional<double> v = scalar_value(input_node(g, *n, 1 - k));
    if (v && !parse_input(n->input(k)).control) {
      *x = input_node(g, *n, k);
      if (x_in) *x_in = n->input(k);
      if (*x) return v;
    }
  }
  return std::nullopt;
}

// Keras' masked softmax over f32 scores: SelectV2(mask, Softmax(SelectV2(mask, x, c)), 0)
// (keras.layers.Softmax with a mask: Llama, Gemma) or, where `select_after` is false,
// Softmax(SelectV2(mask, x, c)) (ops.dot_product_attention: GPT-2), c <= -1e4. `last` is the
// chain's last node (the outer SelectV2 or the Softmax); returns the inner SelectV2, its nodes
// appended to *gone.
tfc::NodeDef* masked_softmax(GraphView& g, const Removal& rm, tfc::NodeDef* last, bool select_after,
                             std::vector<tfc::NodeDef*>* gone) {
  tfc::NodeDef* sm = last;
  if (select_after) {
    if (!last || last->op() != "SelectV2" || !rm.removable(*last, 1) ||
        scalar_value(input_node(g, *last, 2)) != 0.0)
      return nullptr;
    sm = g.producer(*last, 1, "Softmax");
  }
  if (!sm || sm->op() != "Softmax" || !on_npu(*sm)) return nullptr;
  tfc::NodeDef* sel0 = g.producer(*sm, 0, "SelectV2");
  std::optional<double> fill = sel0 ? scalar_value(input_node(g, *sel0, 2)) : std::nullopt;
  if (!sel0 || !rm.removable(*sm, 1) || !rm.removable(*sel0, 1) || !fill || *fill > -1e4 ||
      (select_after && sel0->input(0) != last->input(0)) || type_attr(*sm) != tfc::DT_FLOAT ||
      type_attr(*sel0) != tfc::DT_FLOAT)
    return nullptr;
  if (select_after) gone->push_back(last);
  gone->insert(gone->end(), {sm, sel0});
  return sel0;
}

// LlamaAttention (keras-hub's einsums as keras.ops.einsum lowers them), T the compute type,
// q [B, Sq, N, D], k and v [B, L, Nkv, D]:
//   s = BatchMatMulV2(Transpose(q, [0,2,1,3]), Transpose(repeat(k), [0,2,3,1]))
//   sc = [Cast to f32](Mul(s, scale))      (no Mul: scale 1)
//   p = SelectV2(mask, Softmax(SelectV2(mask, sc, c <= -1e4)), 0)
//   out = Transpose(BatchMatMulV2([Cast to T](p), Transpose(repeat(v), [0,2,1,3])), [0,2,1,3])
std::optional<AttentionMatch> match_llama_attention(GraphView& g, const Removal& rm,
                                                    tfc::NodeDef& out, tfc::DataType t) {
  if (!transpose_by(g, &out, {0, 2, 1, 3})) return std::nullopt;
  tfc::NodeDef* pv = input_node(g, out, 0);
  if (!plain_batch_matmul(pv) || !rm.removable(*pv, 1)) return std::nullopt;
  tfc::NodeDef* vt = transpose_by(g, input_node(g, *pv, 1), {0, 2, 1, 3});
  if (!vt || !rm.removable(*vt, 1)) return std::nullopt;
  AttentionMatch a;
  a.gone = {pv, vt};
  tfc::NodeDef* p = input_node(g, *pv, 0);  // the probabilities, cast to T where T is not f32
  if (t != tfc::DT_FLOAT) {
    if (!is_cast(p, tfc::DT_FLOAT, t) || !rm.removable(*p, 1)) return std::nullopt;
    a.gone.push_back(p);
    p = input_node(g, *p, 0);
  }
  tfc::NodeDef* sel0 = masked_softmax(g, rm, p, true, &a.gone);
  if (!sel0) return std::nullopt;
  // scores: [Cast to f32](Mul(BatchMatMulV2, scale))
  tfc::NodeDef* sc = input_node(g, *sel0, 1);
  if (t != tfc::DT_FLOAT) {
    if (!is_cast(sc, t, tfc::DT_FLOAT) || !rm.removable(*sc, 1)) return std::nullopt;
    a.gone.push_back(sc);
    sc = input_node(g, *sc, 0);
  }
  tfc::NodeDef* qk = sc;
  if (sc && sc->op() == "Mul" && type_attr(*sc) == t) {
    std::optional<double> scale = scaled_by(g, sc, &qk);
    if (!scale || !plain_batch_matmul(qk) || !rm.removable(*sc, 1)) return std::nullopt;
    a.scale = *scale;
    a.gone.push_back(sc);
  }
  if (!plain_batch_matmul(qk) || !rm.removable(*qk, 1) || type_attr(*qk) != t) return std::nullopt;
  tfc::NodeDef* qt = transpose_by(g, input_node(g, *qk, 0), {0, 2, 1, 3});
  tfc::NodeDef* kt = transpose_by(g, input_node(g, *qk, 1), {0, 2, 3, 1});
  if (!qt || !kt || !rm.removable(*qt, 1) || !rm.removable(*kt, 1)) return std::nullopt;
  a.gone.insert(a.gone.end(), {qk, qt, kt});
  // K and V, unrepeated alike; their repeats read only here
  std::optional<KeyValue> k = unrepeated(g, *kt), v = unrepeated(g, *vt);
  if (!k || !v || k->shape != v->shape || k->heads != v->heads) return std::nullopt;
  for (tfc::NodeDef* n : k->repeat) a.gone.push_back(n);
  for (tfc::NodeDef* n : v->repeat) a.gone.push_back(n);
  for (tfc::NodeDef* n : a.gone)
    if (!rm.removable(*n, 1)) return std::nullopt;
  int64_t seq_q = 0;
  std::optional<AttentionMask> mask = match_mask(g, sel0->input(0), k->shape[1], &seq_q);
  if (!mask || (mask->heads != 1 && mask->heads != k->heads)) return std::nullopt;
  // q [B, Sq, N, D] (where TensorFlow recorded q's shape, it must agree)
  const std::vector<int64_t> qs = {k->shape[0], seq_q, k->heads, k->shape[3]};
  const std::vector<int64_t> recorded = input_shape(*qt, 0);
  if (!recorded.empty() && recorded != qs) return std::nullopt;
  a.q = qt->input(0);
  a.k = k->source;
  a.v = v->source;
  a.heads = qs[2];
  a.kv_heads = k->shape[2];
  a.mask = std::move(*mask);
  return a;
}

// An Einsum node of `equation` with two data inputs and type t.
bool einsum_of(const tfc::NodeDef* n, const char* equation, tfc::DataType t) {
  if (!n || n->op() != "Einsum" || !on_npu(*n) || type_attr(*n) != t) return false;
  auto it = n->attr().find("equation");
  return it != n->attr().end() && it->second.s() == equation && n->input_size() >= 2 &&
         !parse_input(n->input(0)).control && !parse_input(n->input(1)).control;
}

// keras' ops.dot_product_attention as its TensorFlow backend computes it (keras'
// MultiHeadAttention without dropout: GPT-2's CachedMultiHeadAttention), T the compute type,
// q [B, Sq, N, D], k and v [B, L, N, D] (no grouped heads: keras repeats them with tf.repeat
// first, not matched):
//   s = Einsum(q, k; "BTNH,BSNH->BNTS")   sc = Mul([Cast to f32](s), scale)
//   p = Softmax(SelectV2(mask, sc, c <= -1e4))   (the mask broadcast to [B, N, Sq, L])
//   out = Einsum([Cast to T](p), v; "BNTS,BSNH->BTNH")
std::optional<AttentionMatch> match_dot_product_attention(GraphView& g, const Removal& rm,
                                                          tfc::NodeDef& out, tfc::DataType t) {
  if (!einsum_of(&out, "BNTS,BSNH->BTNH", t)) return std::nullopt;
  AttentionMatch a;
  tfc::NodeDef* p = input_node(g, out, 0);
  if (t != tfc::DT_FLOAT) {
    if (!is_cast(p, tfc::DT_FLOAT, t) || !rm.removable(*p, 1)) return std::nullopt;
    a.gone.push_back(p);
    p = input_node(g, *p, 0);
  }
  tfc::NodeDef* sel0 = masked_softmax(g, rm, p, false, &a.gone);
  tfc::NodeDef* sc = sel0 ? input_node(g, *sel0, 1) : nullptr;
  tfc::NodeDef* qk = nullptr;
  std::optional<double> scale = scaled_by(g, sc, &qk);
  if (!scale || type_attr(*sc) != tfc::DT_FLOAT || !rm.removable(*sc, 1)) return std::nullopt;
  a.gone.push_back(sc);
  a.scale = *scale;
  if (t != tfc::DT_FLOAT) {
    if (!is_cast(qk, t, tfc::DT_FLOAT) || !rm.removable(*qk, 1)) return std::nullopt;
    a.gone.push_back(qk);
    qk = input_node(g, *qk, 0);
  }
  if (!einsum_of(qk, "BTNH,BSNH->BNTS", t) || !rm.removable(*qk, 1)) return std::nullopt;
  a.gone.push_back(qk);
  int64_t seq_q = 0;
  std::optional<AttentionMask> mask = match_mask(g, sel0->input(0), 0, &seq_q);
  // a constant causal mask must have the scores' query rows (one row broadcast over several
  // queries is not the fused ops' causal mask)
  if (!mask || mask->heads < 1 || (mask->constant && mask->causal && seq_q == 1))
    return std::nullopt;
  a.q = qk->input(0);
  a.k = qk->input(1);
  a.v = out.input(1);
  // MHA: as many KV heads as query heads; where the mask was broadcast to the scores' shape
  // its head dimension is N, else the kernel takes N from the shapes.
  a.heads = a.kv_heads = mask->heads > 1 ? mask->heads : 0;
  a.mask = std::move(*mask);
  return a;
}

// A Reshape of data input 0 to a constant shape of `rank` dimensions: the shape, else empty.
std::vector<int64_t> reshape_to(GraphView& g, const tfc::NodeDef* n, size_t rank) {
  if (!n || n->op() != "Reshape" || !on_npu(*n)) return {};
  std::optional<std::vector<int64_t>> s = input_ints(g, *n, 1);
  return s && s->size() == rank ? *s : std::vector<int64_t>{};
}

// Whether `shape` is `want` where the leading (batch) dimension may be -1 in `shape`.
bool shape_is(const std::vector<int64_t>& shape, const std::vector<int64_t>& want) {
  if (shape.size() != want.size() || shape.empty()) return false;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != want[d] && !(d == 0 && shape[d] == -1)) return false;
  return true;
}

// Gemma's attention (CachedGemmaAttention._compute_attention without soft-capping, its einsums
// over grouped heads as keras.ops.einsum lowers them), T the compute type, q [B, Sq, N, D], k and
// v [B, L, K, D], N = K * G:
//   qg = Reshape(Mul(q, scale), [B, Sq, K, G, D])
//   s = Reshape(BatchMatMulV2(Reshape(Transpose(qg, [0,2,3,1,4]), [B, K, G * Sq, D]),
//                             Transpose(k, [0,2,3,1])), [B, K, G, Sq, L])
//   p = SelectV2(mask, Softmax(SelectV2(mask, [Cast to f32](s), c <= -1e4)), 0)
//   o = Reshape(BatchMatMulV2(Reshape([Cast to T](p), [B, K, G * Sq, L]), Transpose(v, [0,2,1,3])),
//               [B, K, G, Sq, D])
//   out = Reshape(Transpose(o, [0,3,1,2,4]), [B, Sq, N, D])
// (the Reshapes' batch dimension may be -1). The query's pre-scaling becomes the fused op's
// scale_value (applied to the f32 scores instead of to the rounded queries).
std::optional<AttentionMatch> match_grouped_attention(GraphView& g, const Removal& rm,
                                                      tfc::NodeDef& out, tfc::DataType t) {
  const std::vector<int64_t> os = reshape_to(g, &out, 4);
  if (os.size() != 4) return std::nullopt;
  const int64_t b = os[0], sq = os[1], n = os[2], d = os[3];
  tfc::NodeDef* ot = input_node(g, out, 0);
  AttentionMatch a;
  if (!transpose_by(g, ot, {0, 3, 1, 2, 4}) || !rm.removable(*ot, 1)) return std::nullopt;
  tfc::NodeDef* o5 = input_node(g, *ot, 0);
  const std::vector<int64_t> o5s = reshape_to(g, o5, 5);
  if (o5s.size() != 5 || o5s[3] != sq || o5s[4] != d || o5s[1] < 1 || o5s[2] < 1 ||
      o5s[1] * o5s[2] != n || !shape_is(o5s, {b, o5s[1], o5s[2], sq, d}))
    return std::nullopt;
  const int64_t kv = o5s[1], groups = o5s[2];
  tfc::NodeDef* pv = input_node(g, *o5, 0);
  if (!plain_batch_matmul(pv) || type_attr(*pv) != t) return std::nullopt;
  tfc::NodeDef* vt = transpose_by(g, input_node(g, *pv, 1), {0, 2, 1, 3});
  tfc::NodeDef* p4 = input_node(g, *pv, 0);
  const std::vector<int64_t> p4s = reshape_to(g, p4, 4);
  if (!vt || p4s.size() != 4 || !shape_is(p4s, {b, kv, groups * sq, p4s[3]}) || p4s[3] < 1)
    return std::nullopt;
  const int64_t seq_kv = p4s[3];
  a.gone = {ot, o5, pv, vt, p4};
  tfc::NodeDef* p = input_node(g, *p4, 0);
  if (t != tfc::DT_FLOAT) {
    if (!is_cast(p, tfc::DT_FLOAT, t)) return std::nullopt;
    a.gone.push_back(p);
    p = input_node(g, *p, 0);
  }
  tfc::NodeDef* sel0 = masked_softmax(g, rm, p, true, &a.gone);
  if (!sel0) return std::nullopt;
  tfc::NodeDef* s5 = input_node(g, *sel0, 1);
  if (t != tfc::DT_FLOAT) {
    if (!is_cast(s5, t, tfc::DT_FLOAT)) return std::nullopt;
    a.gone.push_back(s5);
    s5 = input_node(g, *s5, 0);
  }
  if (!shape_is(reshape_to(g, s5, 5), {b, kv, groups, sq, seq_kv})) return std::nullopt;
  tfc::NodeDef* qk = input_node(g, *s5, 0);
  if (!plain_batch_matmul(qk) || type_attr(*qk) != t) return std::nullopt;
  tfc::NodeDef* kt = transpose_by(g, input_node(g, *qk, 1), {0, 2, 3, 1});
  tfc::NodeDef* q4 = input_node(g, *qk, 0);
  if (!kt || !shape_is(reshape_to(g, q4, 4), {b, kv, groups * sq, d})) return std::nullopt;
  tfc::NodeDef* qt = transpose_by(g, input_node(g, *q4, 0), {0, 2, 3, 1, 4});
  tfc::NodeDef* q5 = qt ? input_node(g, *qt, 0) : nullptr;
  if (!shape_is(reshape_to(g, q5, 5), {b, sq, kv, groups, d})) return std::nullopt;
  tfc::NodeDef* q = nullptr;
  std::string q_in;
  std::optional<double> scale = scaled_by(g, input_node(g, *q5, 0), &q, &q_in);
  tfc::NodeDef* qs = input_node(g, *q5, 0);
  if (!scale || type_attr(*qs) != t) return std::nullopt;
  a.gone.insert(a.gone.end(), {s5, qk, kt, q4, qt, q5, qs});
  for (tfc::NodeDef* x : a.gone)
    if (!rm.removable(*x, 1)) return std::nullopt;
  int64_t mask_q = 0;
  std::optional<AttentionMask> mask = match_mask(g, sel0->input(0), seq_kv, &mask_q);
  if (!mask || mask_q != sq || mask->heads != 1) return std::nullopt;
  a.q = q_in;
  a.k = kt->input(0);
  a.v = vt->input(0);
  a.scale = *scale;
  a.heads = n;
  a.kv_heads = kv;
  a.mask = std::move(*mask);
  return a;
}

// Rewrite 9, fused attention: one of the subgraphs above (match_llama_attention,
// match_dot_product_attention, match_grouped_attention) ending at node out of the compute type
// T becomes, in place of out: PromptFlashAttention(q, k, v; scale, sparse_mode) for a constant
// causal mask (or none), IncreFlashAttention(q, k, v, index + 1; scale) for a decode step's mask
// over the first index + 1 positions. T = f32 only where fp32_attention_allowed(): q, k, v are
// cast to fp16 and the result back (new nodes "<out>/npusim_{q,k,v}_fp16",
// "<out>/npusim_attention"; out becomes the Cast back); an operand that is Cast(x: f16 -> f32)
// takes x instead (the same values, no cast). Masked scores weigh 0 either way
// (exp(c - max) underflows to 0 in f32 for c <= -1e4 and scores above -1e4 + 104).
int fuse_attentions(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                    std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  std::vector<tfc::NodeDef*> mask_nodes;  // of the fused attentions, each mask's last node first
  const int n_nodes = g.size();
  for (int i = 0; i < n_nodes; ++i) {
    tfc::NodeDef& out = *g.at(i);
    const std::optional<tfc::DataType> t = type_attr(out);
    if (!t || !float_type(*t) || !on_npu(out) || rm.claimed(out.name())) continue;
    std::optional<AttentionMatch> a = match_llama_attention(g, rm, out, *t);
    if (!a) a = match_dot_product_attention(g, rm, out, *t);
    if (!a) a = match_grouped_attention(g, rm, out, *t);
    if (!a) continue;
    if (*t == tfc::DT_FLOAT && !fp32_attention_allowed()) continue;
    for (tfc::NodeDef* n : a->gone) rm.remove(n->name());
    mask_nodes.insert(mask_nodes.end(), a->mask.nodes.begin(), a->mask.nodes.end());

    const tfc::DataType ft = *t == tfc::DT_FLOAT ? tfc::DT_HALF : *t;
    std::string q_in = a->q, k_in = a->k, v_in = a->v;
    const std::string name = out.name(), device = out.device();
    if (*t == tfc::DT_FLOAT) {
      // An operand that is an fp16 tensor widened to f32 (an f32 model's KV cache held in
      // fp16, models/llm.py ResidentCacheDecoder) goes in as the fp16 tensor: f16 -> f32 -> f16
      // gives the same bits, so neither cast runs. The widening Cast goes too when the
      // attention's removed nodes were its only readers.
      const auto to_fp16 = [&](const std::string& in, const char* suffix) {
        const InputRef r = parse_input(in);
        tfc::NodeDef* c = r.control || r.port != 0 ? nullptr : g.node(r.node);
        if (is_cast(c, tfc::DT_HALF, tfc::DT_FLOAT) && c->input_size() == 1 &&
            !parse_input(c->input(0)).control) {
          if (rm.removable(*c, 1)) rm.remove(c->name());
          return c->input(0);
        }
        return add_node(graph, name + suffix, "Cast", device, {in}, cast_attrs(tfc::DT_FLOAT, ft))
            ->name();
      };
      q_in = to_fp16(q_in, "/npusim_q_fp16");
      k_in = to_fp16(k_in, "/npusim_k_fp16");
      v_in = to_fp16(v_in, "/npusim_v_fp16");
    }
    std::map<std::string, tfc::AttrValue> attrs;
    attrs["T"] = type_value(ft);
    attrs["scale_value"].set_f(static_cast<float>(a->scale));
    attrs["input_layout"].set_s("BSND");
    attrs["num_heads"].set_i(a->heads);
    attrs["num_key_value_heads"].set_i(a->kv_heads);
    std::vector<std::string> inputs = {q_in, k_in, v_in};
    const char* op = "PromptFlashAttention";
    if (a->mask.constant) {
      attrs["sparse_mode"].set_i(!a->mask.causal ? 0 : a->mask.offset == 0 ? 2 : 3);
    } else {
      op = "IncreFlashAttention";
      tfc::AttrValue one;
      one.mutable_tensor()->set_dtype(tfc::DT_INT32);
      one.mutable_tensor()->mutable_tensor_shape();
      one.mutable_tensor()->add_int_val(1);
      std::map<std::string, tfc::AttrValue> cattrs;
      cattrs["dtype"] = type_value(tfc::DT_INT32);
      cattrs["value"] = one;
      const std::string c1 =
          add_node(graph, name + "/npusim_one", "Const", device, {}, cattrs)->name();
      std::map<std::string, tfc::AttrValue> aattrs;
      aattrs["T"] = type_value(tfc::DT_INT32);
      inputs.push_back(
          add_node(graph, name + "/npusim_kv_length", "AddV2", device, {a->mask.index, c1}, aattrs)
              ->name());
      attrs["Tlen"] = type_value(tfc::DT_INT32);
    }
    if (*t == tfc::DT_FLOAT) {
      const std::string fused_name = name + "/npusim_attention";
      tfc::NodeDef* f = add_node(graph, fused_name, op, device, inputs, attrs);
      if (out.has_experimental_debug_info())
        *f->mutable_experimental_debug_info() = out.experimental_debug_info();
      rewrite_as(out, "Cast", {fused_name}, cast_attrs(ft, tfc::DT_FLOAT));
    } else {
      rewrite_as(out, op, inputs, attrs);
    }
    rm.claim(name);
    ++fused;
  }
  // The masks' subgraphs no longer read (every data consumer removed): removed, consumers first.
  for (tfc::NodeDef* n : mask_nodes) {
    bool dead = on_npu(*n) && !preserve.count(n->name()) && !g.control_target(n->name()) &&
                !rm.claimed(n->name());
    for (int c : g.consumer_indices(n->name())) dead = dead && rm.removed().count(g.at(c)->name());
    if (dead) rm.remove(n->name());
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// The static shape of tensor `in` ("node" or "node:0") where the ops producing it fix it:
// the shape TensorFlow recorded (_output_shapes: function arguments), a Const's shape, a Reshape
// to a constant shape, ExpandDims by a constant axis, and through the shape-keeping unary ops
// (Cast, Cos, Sin, Neg, Identity). Empty when unknown; one dimension of unknown size (a
// Reshape's -1, which its input's size fixes, or a recorded one) is -1.
std::vector<int64_t> static_shape(GraphView& g, const std::string& in, int depth = 0) {
  const InputRef r = parse_input(in);
  const tfc::NodeDef* n = r.control || r.port != 0 || depth > 16 ? nullptr : g.node(r.node);
  if (!n) return {};
  auto recorded = n->attr().find("_output_shapes");  // what TensorFlow recorded, if it did
  if (recorded != n->attr().end() && r.port < recorded->second.list().shape_size()) {
    const tfc::TensorShapeProto& s = recorded->second.list().shape(r.port);
    std::vector<int64_t> dims;
    for (const auto& d : s.dim()) dims.push_back(d.size() < 0 ? -1 : d.size());
    if (!s.unknown_rank() && std::count(dims.begin(), dims.end(), -1) <= 1) return dims;
  }
  const std::string& op = n->op();
  if (op == "Const") {
    auto it = n->attr().find("value");
    if (it == n->attr().end() || it->second.value_case() != tfc::AttrValue::kTensor) return {};
    std::vector<int64_t> dims;
    for (const auto& d : it->second.tensor().tensor_shape().dim()) dims.push_back(d.size());
    return dims;
  }
  if (op == "Reshape") {
    std::optional<std::vector<int64_t>> dims = input_ints(g, *n, 1);
    if (!dims || std::count(dims->begin(), dims->end(), -1) > 1) return {};
    for (int64_t d : *dims)
      if (d < -1) return {};
    return *dims;
  }
  if (op == "ExpandDims") {
    std::vector<int64_t> dims = static_shape(g, n->input(0), depth + 1);
    std::optional<std::vector<int64_t>> axis = input_ints(g, *n, 1);
    if (dims.empty() || !axis || axis->size() != 1) return {};
    int64_t a = (*axis)[0];
    if (a < 0) a += static_cast<int64_t>(dims.size()) + 1;
    if (a < 0 || a > static_cast<int64_t>(dims.size())) return {};
    dims.insert(dims.begin() + a, 1);
    return dims;
  }
  if (op == "Cast" || op == "Cos" || op == "Sin" || op == "Neg" || op == "Identity")
    return static_shape(g, n->input(0), depth + 1);
  return {};
}

// Rewrite 10, RotaryPositionEmbedding (keras-hub's RotaryEmbedding._apply_rotary_pos_emb, which
// Llama's and Gemma's attention apply to the queries and the keys), every node of type T:
//   x1, x2 = Split(-1, x; num_split 2)   h = Pack(Neg(x2), x1; axis -2)   r = Reshape(h, [B,S,N,D])
//   out = AddV2(Mul(x, cos), Mul(r, sin))     (operands of AddV2 and the Muls in either order)
// -> RotaryPositionEmbedding(x, cos, sin; mode 0) in place of out, where x's static shape is the
// Reshape's [B, S, N, D] (D a multiple of 16, as the kernel takes it) and cos and sin are
// [1, S, 1, D] (keras-hub's tables) or [S, D] by static_shape(). Removed: the Split, Neg, Pack,
// Reshape and both Muls (each read only inside). The fused nodes' cos and sin inputs are added
// to *tables (for dedup_rope_tables).
int fuse_ropes(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
               std::set<std::string>* removed, std::vector<std::string>* tables) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  for (int i = 0; i < g.size(); ++i) {
    std::optional<tfc::DataType> t;
    tfc::NodeDef* anchor = float_anchor(g, rm, i, "AddV2", &t);
    if (!anchor) continue;
    tfc::NodeDef& out = *anchor;
    for (int o = 0; o < 2; ++o) {
      tfc::NodeDef* mc = g.producer(out, o, "Mul");
      tfc::NodeDef* ms = g.producer(out, 1 - o, "Mul");
      if (!mc || !ms || mc == ms || !rm.removable(*mc, 1) || !rm.removable(*ms, 1) ||
          type_attr(*mc) != t || type_attr(*ms) != t)
        continue;
      bool done = false;
      for (int q = 0; q < 2 && !done; ++q) {
        tfc::NodeDef* r = g.producer(*ms, q, "Reshape");
        if (!r || !on_npu(*r) || !rm.removable(*r, 1) || type_attr(*r) != t) continue;
        tfc::NodeDef* h = g.producer(*r, 0, "Pack");
        if (!h || !on_npu(*h) || !rm.removable(*h, 1) || type_attr(*h) != t ||
            h->input_size() != 2)  // (no control inputs: removable)
          continue;
        auto axis = h->attr().find("axis");
        tfc::NodeDef* neg = g.producer(*h, 0, "Neg");
        const InputRef x1 = parse_input(h->input(1));
        if (axis == h->attr().end() || (axis->second.i() != -2 && axis->second.i() != 3) || !neg ||
            !on_npu(*neg) || !rm.removable(*neg, 1) || type_attr(*neg) != t || x1.control ||
            x1.port != 0)
          continue;
        const InputRef x2 = parse_input(neg->input(0));
        tfc::NodeDef* split = g.node(x1.node);
        if (x2.control || x2.port != 1 || x2.node != x1.node || !split || split->op() != "Split" ||
            !on_npu(*split) || !rm.removable(*split, 2) || type_attr(*split) != t)
          continue;
        auto ns = split->attr().find("num_split");
        std::optional<std::vector<int64_t>> split_dim = input_ints(g, *split, 0);
        if (ns == split->attr().end() || ns->second.i() != 2 || !split_dim ||
            (*split_dim != std::vector<int64_t>{-1} && *split_dim != std::vector<int64_t>{3}))
          continue;
        // x: the Split's value, also the cos product's other operand
        const std::string x = split->input(1);
        std::optional<std::string> cos = other_operand(*mc, x);
        std::optional<std::string> sin = other_operand(*ms, r->name());
        if (!cos || !sin) continue;
        // r's shape is x's: where x's static shape leaves a dimension to its size (-1), the
        // Reshape of x's elements fixes it
        const std::vector<int64_t> shape = static_shape(g, r->name()), xs = static_shape(g, x);
        bool same = shape.size() == 4 && xs.size() == 4 && shape[3] % 16 == 0;
        for (size_t d = 0; same && d < 4; ++d)
          same = shape[d] >= 1 && (xs[d] == shape[d] || xs[d] == -1);
        if (!same) continue;
        const std::vector<int64_t> bsnd = {1, shape[1], 1, shape[3]}, flat = {shape[1], shape[3]};
        const std::vector<int64_t> cs = static_shape(g, *cos);
        if ((cs != bsnd && cs != flat) || static_shape(g, *sin) != cs) continue;
        for (tfc::NodeDef* n : {mc, ms, r, h, neg, split}) rm.remove(n->name());
        std::map<std::string, tfc::AttrValue> attrs;
        attrs["T"] = type_value(*t);
        attrs["mode"].set_i(0);
        tables->push_back(*cos);
        tables->push_back(*sin);
        rewrite_as(out, "RotaryPositionEmbedding", {x, *cos, *sin}, attrs);
        rm.claim(out.name());
        ++fused;
        done = true;
      }
      if (done) break;
    }
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// The rotary tables once per graph: keras-hub computes cos and sin in every RotaryEmbedding
// call (the queries' and the keys' of every layer: positions from the start index, Einsum with
// the inverse frequencies, Pack, Reshape, ExpandDims, Cos / Sin, Cast), each the same function
// of the same inputs. The nodes producing the fused ops' cos and sin inputs (`tables`), and their
// producers back through the ops below, are deduplicated as rewrite 6 does pure nodes (same op,
// device, attributes and inputs: the same tensor), so every layer reads one pair of tables.
// Returns the duplicates removed or no longer read.
int dedup_rope_tables(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                      std::set<std::string>* removed, const std::vector<std::string>& tables) {
  static const std::set<std::string> kTableOps = {
      "AddV2", "BroadcastTo", "Cast",  "Const",   "Cos",     "Einsum", "ExpandDims", "Identity",
      "Mul",   "Pack",        "Range", "RealDiv", "Reshape", "Sin",    "Sub"};
  GraphView g(graph);
  std::unordered_set<std::string> nodes;
  std::vector<std::string> todo;
  for (const std::string& t : tables) todo.push_back(parse_input(t).node);
  while (!todo.empty()) {
    const std::string name = todo.back();
    todo.pop_back();
    const tfc::NodeDef* n = g.node(name);
    if (!n || !kTableOps.count(n->op()) || !nodes.insert(name).second) continue;
    for (const std::string& in : n->input())
      if (!parse_input(in).control) todo.push_back(parse_input(in).node);
  }
  if (nodes.empty()) return 0;
  return dedup_pure_nodes(graph, preserve, removed,
                          [&](const tfc::NodeDef& n) { return nodes.count(n.name()) > 0; });
}

// ---- rewrite 11: GELU (GPT-2's feed-forward) and GeGLU (Gemma's) ----

// For a two-input node n of op `op` and type t, one of whose operands is a scalar constant
// equal to `value` as t holds it (within t's rounding): the other operand's input text.
std::optional<std::string> operand_besides(GraphView& g, const tfc::NodeDef* n, const char* op,
                                           double value, tfc::DataType t) {
  if (!n || n->op() != op || !on_npu(*n) || type_attr(*n) != t || n->input_size() < 2)
    return std::nullopt;
  const double ulp = t == tfc::DT_FLOAT ? 0x1p-23 : t == tfc::DT_HALF ? 0x1p-10 : 0x1p-7;
  for (int k = 0; k < 2; ++k) {
    std::optional<double> v = scalar_value(input_node(g, *n, 1 - k));
    if (v && std::abs(*v - value) <= std::abs(value) * ulp && !parse_input(n->input(k)).control)
      return n->input(k);
  }
  return std::nullopt;
}

// tf.nn.gelu(x, approximate=True) as TensorFlow builds it, every node of type t:
//   y = Mul(Mul(0.5, x), AddV2(1.0, Tanh(Mul(0.7978845608, AddV2(x, Mul(0.044715, Pow(x, 3)))))))
// (operands of Mul / AddV2 in either order; the constants as t holds them). Returns x's input
// text; the nodes before y (each read once, inside the chain) go to *nodes.
std::optional<std::string> match_gelu_tanh(GraphView& g, const Removal& rm, const tfc::NodeDef& y,
                                           tfc::DataType t, std::vector<tfc::NodeDef*>* nodes) {
  if (y.op() != "Mul" || !on_npu(y) || type_attr(y) != t || y.input_size() < 2) return std::nullopt;
  for (int k = 0; k < 2; ++k) {
    tfc::NodeDef* m0 = input_node(g, y, k);
    tfc::NodeDef* a1 = input_node(g, y, 1 - k);
    std::optional<std::string> x = operand_besides(g, m0, "Mul", 0.5, t);
    std::optional<std::string> th_in = operand_besides(g, a1, "AddV2", 1.0, t);
    tfc::NodeDef* th = th_in ? g.node(parse_input(*th_in).node) : nullptr;
    if (!x || !th || th->op() != "Tanh" || type_attr(*th) != t || parse_input(*th_in).port)
      continue;
    tfc::NodeDef* m2 = input_node(g, *th, 0);
    std::optional<std::string> ad_in = operand_besides(g, m2, "Mul", 0.7978845608028654, t);
    tfc::NodeDef* ad =
        ad_in && !parse_input(*ad_in).port ? g.node(parse_input(*ad_in).node) : nullptr;
    if (!ad || ad->op() != "AddV2" || type_attr(*ad) != t || ad->input_size() < 2) continue;
    for (int j = 0; j < 2; ++j) {
      if (ad->input(j) != *x) continue;
      tfc::NodeDef* m1 = input_node(g, *ad, 1 - j);
      std::optional<std::string> pw_in = operand_besides(g, m1, "Mul", 0.044715, t);
      tfc::NodeDef* pw =
          pw_in && !parse_input(*pw_in).port ? g.node(parse_input(*pw_in).node) : nullptr;
      if (!pw || pw->op() != "Pow" || type_attr(*pw) != t || pw->input_size() < 2 ||
          pw->input(0) != *x || scalar_value(input_node(g, *pw, 1)) != 3.0)
        continue;
      std::vector<tfc::NodeDef*> chain = {m0, a1, th, m2, ad, m1, pw};
      bool ok = true;
      for (tfc::NodeDef* n : chain) ok = ok && rm.removable(*n, 1);
      if (!ok) continue;
      nodes->insert(nodes->end(), chain.begin(), chain.end());
      return x;
    }
  }
  return std::nullopt;
}

// The static shape of a variable's value read as `in`: ReadVariableOp [through Cast or
// Identity] of a resource argument whose _handle_shapes TensorFlow recorded; empty if unknown.
std::vector<int64_t> variable_shape(GraphView& g, const std::string& in) {
  const InputRef r = parse_input(in);
  const tfc::NodeDef* n = r.control || r.port ? nullptr : g.node(r.node);
  while (n && (n->op() == "Cast" || n->op() == "Identity")) n = input_node(g, *n, 0);
  const tfc::NodeDef* res = n && n->op() == "ReadVariableOp" ? input_node(g, *n, 0) : nullptr;
  if (!res) return {};
  auto it = res->attr().find("_handle_shapes");
  if (it == res->attr().end() || it->second.list().shape_size() != 1) return {};
  const tfc::TensorShapeProto& s = it->second.list().shape(0);
  std::vector<int64_t> dims;
  for (const auto& d : s.dim()) {
    if (d.size() < 0) return {};
    dims.push_back(d.size());
  }
  return s.unknown_rank() ? std::vector<int64_t>{} : dims;
}

// Whether tensors a and b have one shape, proven from their producers: one static shape
// (static_shape), or the same MatMul / BatchMatMulV2 (same attributes) of one left operand by
// variables of one static shape (a gated feed-forward's two Dense layers).
bool same_shape_products(GraphView& g, const std::string& a, const std::string& b) {
  const std::vector<int64_t> sa = static_shape(g, a), sb = static_shape(g, b);
  if (!sa.empty() && sa == sb && std::count(sa.begin(), sa.end(), -1) == 0) return true;
  const InputRef ra = parse_input(a), rb = parse_input(b);
  const tfc::NodeDef* pa = ra.control || ra.port ? nullptr : g.node(ra.node);
  const tfc::NodeDef* pb = rb.control || rb.port ? nullptr : g.node(rb.node);
  if (!pa || !pb || pa->op() != pb->op() || (pa->op() != "MatMul" && pa->op() != "BatchMatMulV2") ||
      pa->input_size() < 2 || pb->input_size() < 2 || pa->input(0) != pb->input(0))
    return false;
  for (const char* attr : {"transpose_a", "transpose_b", "adj_x", "adj_y", "T"}) {
    auto ia = pa->attr().find(attr), ib = pb->attr().find(attr);
    const bool ha = ia != pa->attr().end(), hb = ib != pb->attr().end();
    if (ha != hb || (ha && ia->second.SerializeAsString() != ib->second.SerializeAsString()))
      return false;
  }
  const std::vector<int64_t> wa = variable_shape(g, pa->input(1));
  return !wa.empty() && wa == variable_shape(g, pb->input(1));
}

// Rewrite 11a, GeGlu (Gemma's feed-forward): Mul(gelu, up) or Mul(up, gelu), gelu
// tf.nn.gelu(gate, approximate=True) (match_gelu_tanh) read only here, gate and up of one shape
// (same_shape_products) -> GeGlu(gate, up; approximate 1).
int fuse_geglus(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  for (int i = 0; i < g.size(); ++i) {
    tfc::NodeDef& y = *g.at(i);
    const std::optional<tfc::DataType> t = type_attr(y);
    if (y.op() != "Mul" || !on_npu(y) || !t || !float_type(*t) || rm.claimed(y.name()) ||
        y.input_size() < 2)
      continue;
    for (int k = 0; k < 2; ++k) {
      tfc::NodeDef* gelu = input_node(g, y, k);
      std::vector<tfc::NodeDef*> nodes;
      std::optional<std::string> gate =
          gelu && rm.removable(*gelu, 1) ? match_gelu_tanh(g, rm, *gelu, *t, &nodes) : std::nullopt;
      const std::string up = y.input(1 - k);
      if (!gate || parse_input(up).control || !same_shape_products(g, *gate, up)) continue;
      nodes.push_back(gelu);
      for (tfc::NodeDef* n : nodes) rm.remove(n->name());
      std::map<std::string, tfc::AttrValue> attrs;
      attrs["T"] = type_value(*t);
      attrs["approximate"].set_i(1);
      rewrite_as(y, "GeGlu", {*gate, up}, attrs);
      rm.claim(y.name());
      ++fused;
      break;
    }
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// Rewrite 11b, Gelu (GPT-2's feed-forward), after 11a: tf.nn.gelu(x, approximate=True)
// (match_gelu_tanh) -> Gelu(x; approximate 1).
int fuse_gelus(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
               std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  for (int i = 0; i < g.size(); ++i) {
    tfc::NodeDef& y = *g.at(i);
    const std::optional<tfc::DataType> t = type_attr(y);
    if (!t || !float_type(*t) || rm.claimed(y.name())) continue;
    std::vector<tfc::NodeDef*> nodes;
    std::optional<std::string> x = match_gelu_tanh(g, rm, y, *t, &nodes);
    if (!x) continue;
    for (tfc::NodeDef* n : nodes) rm.remove(n->name());
    std::map<std::string, tfc::AttrValue> attrs;
    attrs["T"] = type_value(*t);
    attrs["approximate"].set_i(1);
    rewrite_as(y, "Gelu", {*x}, attrs);
    rm.claim(y.name());
    ++fused;
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// ---- rewrite 12: LayerNorm (GPT-2's keras LayerNormalization over the last axis) ----

// A Mean of data input 0 over the constant axes [-1] with keep_dims, type t.
bool mean_last_axis(GraphView& g, const tfc::NodeDef* n, tfc::DataType t) {
  if (!n || n->op() != "Mean" || !on_npu(*n) || type_attr(*n) != t) return false;
  auto keep = n->attr().find("keep_dims");
  return keep != n->attr().end() && keep->second.b() &&
         input_ints(g, *n, 1) == std::vector<int64_t>{-1};
}

// The [H] parameter (gamma, beta) read as `in`: a Reshape of it to [1, .., 1, H] (keras'
// broadcast shape: the Reshape, if read only here, goes to *gone) or, without one, `in` itself
// where it is a variable's value of shape [H]; its input text (*h: H), or nullopt.
std::optional<std::string> norm_param(GraphView& g, const Removal& rm, const std::string& in,
                                      std::vector<tfc::NodeDef*>* gone, int64_t* h) {
  const InputRef r = parse_input(in);
  tfc::NodeDef* n = r.control || r.port ? nullptr : g.node(r.node);
  if (!n || n->op() != "Reshape") {
    const std::vector<int64_t> s = variable_shape(g, in);
    if (s.size() != 1) return std::nullopt;
    *h = s[0];
    return in;
  }
  std::optional<std::vector<int64_t>> to = input_ints(g, *n, 1);
  if (!to || to->empty() || to->back() < 1) return std::nullopt;
  for (size_t d = 0; d + 1 < to->size(); ++d)
    if ((*to)[d] != 1) return std::nullopt;
  if (rm.removable(*n, 1)) gone->push_back(n);
  *h = to->back();
  return n->input(0);
}

// keras' LayerNormalization over the last axis as TensorFlow builds it (rewrites 12 and 12b),
// every node of one type T (float, half, bfloat16):
//   mean = Mean(x, [-1], keep_dims)   var = Mean(SquaredDifference(x, mean), [-1], keep_dims)
//   m = Mul(Rsqrt(AddV2(var, eps)), gamma)
//   y = AddV2(Mul(x, m), AddV2(Mul(Neg(mean), m), beta))
// (operands of Mul / AddV2 in either order; gamma and beta [H] [through a Reshape to
// [1, .., 1, H]], H a multiple of 16: the kernel's rows).
struct LayerNormMatch {
  tfc::DataType t = tfc::DT_FLOAT;
  std::string x, gamma, beta;  // the fused op's inputs
  std::string gamma_in;        // gamma as m reads it (through its Reshape, if any)
  double eps = 0;
  int64_t h = 0;
  tfc::NodeDef *y = nullptr, *mul2 = nullptr, *add1 = nullptr, *m = nullptr, *rs = nullptr,
               *eps_add = nullptr, *var = nullptr, *sqd = nullptr, *mean = nullptr, *mul1 = nullptr,
               *neg = nullptr;
  std::vector<tfc::NodeDef*> params_gone;  // gamma's and beta's Reshapes read only here
};

// The forward subgraph ending at y, or nullopt (consumers not checked).
std::optional<LayerNormMatch> match_layer_norm(GraphView& g, const Removal& rm, tfc::NodeDef& y) {
  const std::optional<tfc::DataType> t = type_attr(y);
  if (y.op() != "AddV2" || !on_npu(y) || !t || !float_type(*t) || y.input_size() < 2 ||
      rm.claimed(y.name()))
    return std::nullopt;
  auto node_of = [&](const std::string& in) -> tfc::NodeDef* {
    const InputRef r = parse_input(in);
    return r.control || r.port ? nullptr : g.node(r.node);
  };
  for (int k = 0; k < 2; ++k) {
    tfc::NodeDef* mul2 = input_node(g, y, k);
    tfc::NodeDef* add1 = input_node(g, y, 1 - k);
    if (!mul2 || mul2->op() != "Mul" || type_attr(*mul2) != *t || mul2->input_size() < 2 || !add1 ||
        add1->op() != "AddV2" || type_attr(*add1) != *t || add1->input_size() < 2)
      continue;
    // mul2 = Mul(x, m) with m = Mul(Rsqrt(AddV2(var, eps)), gamma)
    for (int j = 0; j < 2; ++j) {
      LayerNormMatch r;
      r.t = *t;
      r.y = &y;
      r.mul2 = mul2;
      r.add1 = add1;
      r.x = mul2->input(j);
      tfc::NodeDef* m = input_node(g, *mul2, 1 - j);
      if (!m || m->op() != "Mul" || type_attr(*m) != *t || m->input_size() < 2) continue;
      r.m = m;
      std::string beta_in;
      for (int a = 0; a < 2 && !r.rs; ++a) {
        tfc::NodeDef* c = input_node(g, *m, a);
        if (c && c->op() == "Rsqrt" && type_attr(*c) == *t) {
          r.rs = c;
          r.gamma_in = m->input(1 - a);
        }
      }
      r.eps_add = r.rs ? input_node(g, *r.rs, 0) : nullptr;
      if (r.eps_add && r.eps_add->op() == "AddV2" && type_attr(*r.eps_add) == *t) {
        for (int a = 0; a < 2 && !r.var; ++a) {
          std::optional<double> e = scalar_value(input_node(g, *r.eps_add, 1 - a));
          tfc::NodeDef* v = input_node(g, *r.eps_add, a);
          if (e && *e >= 0 && mean_last_axis(g, v, *t)) {
            r.var = v;
            r.eps = *e;
          }
        }
      }
      r.sqd = r.var ? input_node(g, *r.var, 0) : nullptr;
      if (!r.sqd || r.sqd->op() != "SquaredDifference" || type_attr(*r.sqd) != *t ||
          r.sqd->input_size() < 2 || r.sqd->input(0) != r.x)
        continue;
      r.mean = input_node(g, *r.sqd, 1);
      if (!mean_last_axis(g, r.mean, *t) || r.mean->input(0) != r.x) continue;
      // add1 = AddV2(Mul(Neg(mean), m), beta)
      for (int a = 0; a < 2 && !r.mul1; ++a) {
        tfc::NodeDef* c = input_node(g, *add1, a);
        if (!c || c->op() != "Mul" || type_attr(*c) != *t || c->input_size() < 2) continue;
        for (int b2 = 0; b2 < 2 && !r.mul1; ++b2) {
          tfc::NodeDef* ng = input_node(g, *c, b2);
          if (ng && ng->op() == "Neg" && type_attr(*ng) == *t && node_of(ng->input(0)) == r.mean &&
              GraphView::reads(*c, 1 - b2, m->name())) {
            r.mul1 = c;
            r.neg = ng;
            beta_in = add1->input(1 - a);
          }
        }
      }
      if (!r.mul1) continue;
      int64_t h_gamma = 0, h_beta = 0;
      std::optional<std::string> gamma = norm_param(g, rm, r.gamma_in, &r.params_gone, &h_gamma);
      std::optional<std::string> beta = norm_param(g, rm, beta_in, &r.params_gone, &h_beta);
      // H: what the kernel supports (ops/norm.cpp: a multiple of 16)
      if (!gamma || !beta || h_gamma != h_beta || h_gamma % 16 != 0) continue;
      r.gamma = *gamma;
      r.beta = *beta;
      r.h = h_gamma;
      return r;
    }
  }
  return std::nullopt;
}

std::map<std::string, tfc::AttrValue> layer_norm_attrs(const LayerNormMatch& r) {
  std::map<std::string, tfc::AttrValue> attrs;
  attrs["T"] = type_value(r.t);
  attrs["Tgamma"] = type_value(r.t);
  attrs["epsilon"].set_f(static_cast<float>(r.eps));
  return attrs;
}

// Rewrite 12, LayerNorm: match_layer_norm's subgraph, every node but y read only inside it ->
// LayerNorm(x, gamma, beta; epsilon) in place of y. NPUSIM_FUSION_LAYER_NORM=0 turns it off.
int fuse_layer_norms(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                     std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int fused = 0;
  for (int i = 0; i < g.size(); ++i) {
    tfc::NodeDef& y = *g.at(i);
    std::optional<LayerNormMatch> r = match_layer_norm(g, rm, y);
    if (!r) continue;
    const std::pair<tfc::NodeDef*, size_t> chain[] = {
        {r->mul2, 1}, {r->add1, 1}, {r->m, 2},    {r->rs, 1},   {r->eps_add, 1},
        {r->var, 1},  {r->sqd, 1},  {r->mean, 2}, {r->mul1, 1}, {r->neg, 1}};
    bool ok = true;
    for (const auto& [n, uses] : chain) ok = ok && rm.removable(*n, uses);
    if (!ok) continue;
    for (const auto& [n, uses] : chain) rm.remove(n->name());
    for (tfc::NodeDef* n : r->params_gone) rm.remove(n->name());
    rewrite_as(y, "LayerNorm", {r->x, r->gamma, r->beta}, layer_norm_attrs(*r));
    rm.claim(y.name());
    ++fused;
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// ---- rewrite 12b: LayerNorm in training, with TensorFlow's autodiff of it ----

// A Sum of data input 0 over constant axes (keep_dims either way) of type t: over x's last axis
// (rows: the axes [rank - 1] or [-1]) or over all the others (columns: [0, .., rank - 2]).
bool sums_axes(GraphView& g, const tfc::NodeDef* n, tfc::DataType t, int64_t rank, bool rows) {
  if (!n || n->op() != "Sum" || !on_npu(*n) || type_attr(*n) != t || n->input_size() < 2)
    return false;
  std::optional<std::vector<int64_t>> axes = input_ints(g, *n, 1);
  if (!axes) return false;
  if (rows) return *axes == std::vector<int64_t>{rank - 1} || *axes == std::vector<int64_t>{-1};
  std::vector<int64_t> lead(static_cast<size_t>(rank - 1));
  for (int64_t d = 0; d + 1 < rank; ++d) lead[static_cast<size_t>(d)] = d;
  return *axes == lead;
}

// n and the Reshapes to constant shapes that alone read it, one after another (autodiff's
// Reshape of a Sum to the operand's shape, Keras' to the variable's): the last of them; `nodes`
// gets the Reshapes.
tfc::NodeDef* over_reshapes(GraphView& g, tfc::NodeDef* n, std::vector<tfc::NodeDef*>* nodes) {
  for (int depth = 0; depth < 4; ++depth) {
    tfc::NodeDef* next = g.only_consumer(n->name());
    if (!const_reshape(g, next) || !GraphView::reads(*next, 0, n->name())) break;
    nodes->push_back(next);
    n = next;
  }
  return n;
}

// The gradient of a Mean over the last axis of H elements taken back to x's shape, read from
// v (the gradient of the Mean's [.., 1] output): [Reshapes to constant shapes] Tile(., [1, ..,
// 1, H]) then Mul by 1/H or RealDiv by H. Returns that last node (null if v is read otherwise);
// *rank gets the Tile's rank, `nodes` the chain.
tfc::NodeDef* row_mean_grad(GraphView& g, tfc::NodeDef* v, int64_t h, tfc::DataType t,
                            int64_t* rank, std::vector<tfc::NodeDef*>* nodes) {
  tfc::NodeDef* n = over_reshapes(g, v, nodes);
  tfc::NodeDef* tile = g.only_consumer(n->name());
  if (!tile || tile->op() != "Tile" || !GraphView::reads(*tile, 0, n->name()) ||
      type_attr(*tile) != t)
    return nullptr;
  std::optional<std::vector<int64_t>> mult = input_ints(g, *tile, 1);
  if (!mult || mult->empty() || mult->back() != h) return nullptr;
  for (size_t d = 0; d + 1 < mult->size(); ++d)
    if ((*mult)[d] != 1) return nullptr;
  tfc::NodeDef* div = g.only_consumer(tile->name());
  if (!div || type_attr(*div) != t || div->input_size() < 2) return nullptr;
  const double hd = static_cast<double>(h);
  bool ok = false;
  if (div->op() == "RealDiv" && GraphView::reads(*div, 0, tile->name())) {
    std::optional<double> k = scalar_value(input_node(g, *div, 1));
    ok = k && *k == hd;
  } else if (div->op() == "Mul") {
    std::optional<std::string> k = other_operand(*div, tile->name());
    std::optional<double> kv = k ? scalar_value(g.node(parse_input(*k).node)) : std::nullopt;
    ok = kv && static_cast<float>(*kv) == static_cast<float>(1.0 / hd);
  }
  if (!ok) return nullptr;
  *rank = static_cast<int64_t>(mult->size());
  nodes->insert(nodes->end(), {tile, div});
  return div;
}

// The Mul consumers of `name` whose other operand is `operand`, other than `except`.
std::vector<tfc::NodeDef*> muls_with(GraphView& g, const std::string& name,
                                     const std::string& operand, tfc::DataType t,
                                     const tfc::NodeDef* except = nullptr) {
  std::vector<tfc::NodeDef*> found;
  for (int i : g.consumer_indices(name)) {
    tfc::NodeDef* c = g.at(i);
    if (c == except || c->op() != "Mul" || type_attr(*c) != t || !on_npu(*c)) continue;
    if (other_operand(*c, name) == operand &&
        std::find(found.begin(), found.end(), c) == found.end())
      found.push_back(c);
  }
  return found;
}

// The forward LayerNorm (match_layer_norm) and the gradient TensorFlow's autodiff builds for it
// (graph_fusion.h 12b states the nodes).
struct LayerNormTraining {
  LayerNormMatch f;
  std::string dy;
  tfc::NodeDef* dx = nullptr;                        // the AddN summing x's gradients
  tfc::NodeDef *dgamma = nullptr, *dbeta = nullptr;  // the parameters' gradients, last nodes
  std::vector<std::string> dx_parts;  // dx's inputs the LayerNorm's gradient accounts for
  std::vector<tfc::NodeDef*> region;  // every matched node that goes (the forward's too)
};

bool match_layer_norm_grad(GraphView& g, LayerNormTraining* lt) {
  const LayerNormMatch& f = lt->f;
  const tfc::DataType t = f.t;
  const std::string x = f.x;
  if (parse_input(x).port || parse_input(x).control) return false;
  std::vector<tfc::NodeDef*> grad;
  // dy: the gradient arriving at y, multiplied by m (for x's gradient, and for the Neg's).
  std::string dy;
  std::vector<tfc::NodeDef*> dy_m;
  for (int i : g.consumer_indices(f.m->name())) {
    tfc::NodeDef* c = g.at(i);
    if (c == f.mul2 || c == f.mul1) continue;
    std::optional<std::string> o = c->op() == "Mul" ? other_operand(*c, f.m->name()) : std::nullopt;
    if (!o || (!dy.empty() && *o != dy) || type_attr(*c) != t) return false;
    dy = *o;
    if (std::find(dy_m.begin(), dy_m.end(), c) == dy_m.end()) dy_m.push_back(c);
  }
  if (dy.empty() || dy_m.size() > 2) return false;
  // dx_scale = Mul(dy, m) read by x's AddN; the Neg's gradient -Sum_rows(Mul(dy, m)).
  tfc::NodeDef *dx_scale = nullptr, *sum_dneg = nullptr;
  for (tfc::NodeDef* c : dy_m)
    for (int i : g.consumer_indices(c->name())) {
      tfc::NodeDef* u = g.at(i);
      if (u->op() == "AddN" && !dx_scale) {
        dx_scale = c;
        lt->dx = u;
      } else if (u->op() == "Sum" && !sum_dneg) {
        sum_dneg = u;
      } else {
        return false;
      }
    }
  if (!dx_scale || !sum_dneg) return false;
  grad.insert(grad.end(), dy_m.begin(), dy_m.end());
  tfc::NodeDef* dneg = over_reshapes(g, sum_dneg, &grad);
  tfc::NodeDef* dmean = g.only_consumer(dneg->name());
  if (!dmean || dmean->op() != "Neg" || type_attr(*dmean) != t) return false;
  int64_t rank = 0, rank2 = 0;
  tfc::NodeDef* dx_mean = row_mean_grad(g, dmean, f.h, t, &rank, &grad);
  if (!dx_mean || !sums_axes(g, sum_dneg, t, rank, true)) return false;
  grad.insert(grad.end(), {sum_dneg, dmean});
  // m's gradient: AddN(Mul(dy, x), Mul(Neg(mean), dy)).
  std::vector<tfc::NodeDef*> mx = muls_with(g, parse_input(x).node, dy, t);
  std::vector<tfc::NodeDef*> mn = muls_with(g, f.neg->name(), dy, t, f.mul1);
  if (mx.size() != 1 || mn.size() != 1) return false;
  tfc::NodeDef* dm = g.only_consumer(mx[0]->name());
  if (!dm || dm->op() != "AddN" || dm->input_size() != 2 || g.only_consumer(mn[0]->name()) != dm ||
      type_attr(*dm) != t)
    return false;
  grad.insert(grad.end(), {mx[0], mn[0], dm});
  // gamma's gradient: Sum_columns(Mul(rs, dm)) [Reshapes]; rs's: Sum_rows(Mul(dm, gamma))
  // [Reshapes] -> RsqrtGrad(rs, .).
  std::vector<tfc::NodeDef*> mr = muls_with(g, dm->name(), f.rs->name(), t);
  std::vector<tfc::NodeDef*> mg = muls_with(g, dm->name(), f.gamma_in, t);
  if (mr.size() != 1 || mg.size() != 1 || g.consumers(dm->name()) != 2) return false;
  tfc::NodeDef* sum_dgamma = g.only_consumer(mr[0]->name());
  tfc::NodeDef* sum_drs = g.only_consumer(mg[0]->name());
  if (!sums_axes(g, sum_dgamma, t, rank, false) || !sums_axes(g, sum_drs, t, rank, true))
    return false;
  // gamma's gradient ends at its chain's last node, which is kept (the fused op).
  std::vector<tfc::NodeDef*> dgamma_chain = {sum_dgamma};
  lt->dgamma = over_reshapes(g, sum_dgamma, &dgamma_chain);
  grad.insert(grad.end(), {mr[0], mg[0], sum_drs});
  grad.insert(grad.end(), dgamma_chain.begin(), dgamma_chain.end() - 1);
  tfc::NodeDef* drs = over_reshapes(g, sum_drs, &grad);
  tfc::NodeDef* rsqrt_grad = g.only_consumer(drs->name());
  if (!rsqrt_grad || rsqrt_grad->op() != "RsqrtGrad" || type_attr(*rsqrt_grad) != t ||
      !GraphView::reads(*rsqrt_grad, 0, f.rs->name()) ||
      !GraphView::reads(*rsqrt_grad, 1, drs->name()))
    return false;
  grad.push_back(rsqrt_grad);
  // The variance's gradient to x: Mul(Mul(2, mean grad of RsqrtGrad), Sub(x, mean)).
  tfc::NodeDef* dsqd = row_mean_grad(g, rsqrt_grad, f.h, t, &rank2, &grad);
  tfc::NodeDef* two_dsqd = dsqd ? g.only_consumer(dsqd->name()) : nullptr;
  std::optional<std::string> two_s =
      two_dsqd && two_dsqd->op() == "Mul" ? other_operand(*two_dsqd, dsqd->name()) : std::nullopt;
  tfc::NodeDef* two = two_s ? g.node(parse_input(*two_s).node) : nullptr;
  std::optional<double> two_v = scalar_value(two);
  if (rank2 != rank || !two_v || *two_v != 2.0 || type_attr(*two_dsqd) != t) return false;
  tfc::NodeDef* dx_var = g.only_consumer(two_dsqd->name());
  std::optional<std::string> xm_s =
      dx_var && dx_var->op() == "Mul" ? other_operand(*dx_var, two_dsqd->name()) : std::nullopt;
  tfc::NodeDef* xm = xm_s ? g.node(*xm_s) : nullptr;
  if (!xm || xm->op() != "Sub" || type_attr(*xm) != t || type_attr(*dx_var) != t ||
      !GraphView::reads(*xm, 0, parse_input(x).node) || !GraphView::reads(*xm, 1, f.mean->name()))
    return false;
  grad.insert(grad.end(), {two_dsqd, dx_var, xm});
  if (two->input_size() > 0 || g.consumers(two->name()) == 1) grad.push_back(two);
  // beta's gradient: Sum_columns(dy) [Reshapes].
  tfc::NodeDef* sum_dbeta = nullptr;
  for (int i : g.consumer_indices(parse_input(dy).node)) {
    tfc::NodeDef* c = g.at(i);
    if (GraphView::reads(*c, 0, parse_input(dy).node) && parse_input(dy).port == 0 &&
        sums_axes(g, c, t, rank, false)) {
      if (sum_dbeta) return false;
      sum_dbeta = c;
    }
  }
  if (!sum_dbeta) return false;
  // beta's gradient's chain goes, its last node's readers read the fused output.
  std::vector<tfc::NodeDef*> dbeta_chain = {sum_dbeta};
  lt->dbeta = over_reshapes(g, sum_dbeta, &dbeta_chain);
  grad.insert(grad.end(), dbeta_chain.begin(), dbeta_chain.end() - 1);
  // x's AddN: the three parts, with x's other gradients if any.
  if (lt->dx->op() != "AddN" || type_attr(*lt->dx) != t || !on_npu(*lt->dx)) return false;
  std::set<std::string> parts = {dx_scale->name(), dx_mean->name(), dx_var->name()};
  int found = 0;
  for (int i = 0; i < lt->dx->input_size(); ++i) found += parts.count(lt->dx->input(i)) ? 1 : 0;
  if (found != 3 || parts.size() != 3) return false;
  lt->dx_parts.assign(parts.begin(), parts.end());
  // The fused parameter gradients are [H]: where the graph's last nodes were of another shape,
  // only if nothing reads it as such.
  for (tfc::NodeDef* n : {lt->dgamma, lt->dbeta}) {
    auto keep = n->attr().find("keep_dims");
    const bool h_only = n->op() == "Reshape"
                            ? static_shape(g, n->name()) == std::vector<int64_t>{f.h}
                            : rank == 2 && (keep == n->attr().end() || !keep->second.b());
    if (!h_only) return false;
  }
  lt->dy = dy;
  lt->region = {f.mul2, f.add1, f.m, f.rs, f.eps_add, f.var, f.sqd, f.mean, f.mul1, f.neg};
  lt->region.insert(lt->region.end(), grad.begin(), grad.end());
  lt->region.insert(lt->region.end(), f.params_gone.begin(), f.params_gone.end());
  return true;
}

// Whether the matched nodes can go: on the NPU (or Consts), not preserved or claimed, every
// data consumer among the matched or kept nodes (y, dx, dgamma; dbeta's consumers are
// rewired), control inputs only from matched nodes, control edges out of them only into them,
// and the kept nodes on the NPU, unclaimed and without control inputs from removed ones.
bool layer_norm_training_removable(GraphView& g, const LayerNormTraining& lt, const Removal& rm,
                                   const std::unordered_set<std::string>& preserve) {
  std::set<std::string> region;
  for (const tfc::NodeDef* n : lt.region) region.insert(n->name());
  if (region.size() != lt.region.size()) return false;  // a node matched twice
  const std::set<std::string> kept = {lt.f.y->name(), lt.dx->name(), lt.dgamma->name()};
  if (kept.size() != 3) return false;
  for (const std::string& k : kept)
    if (region.count(k) || rm.claimed(k) || !on_npu(*g.node(k))) return false;
  if (region.count(lt.dbeta->name()) || kept.count(lt.dbeta->name())) return false;
  if (preserve.count(lt.dbeta->name()) || preserve.count(lt.dgamma->name())) return false;
  std::set<std::string> inside = region;
  inside.insert(kept.begin(), kept.end());
  inside.insert(lt.dbeta->name());
  std::vector<const tfc::NodeDef*> going(lt.region.begin(), lt.region.end());
  going.push_back(lt.dbeta);
  for (const tfc::NodeDef* n : going) {
    if (!on_npu(*n) && n->op() != "Const") return false;
    if (preserve.count(n->name()) || rm.claimed(n->name())) return false;
    if (n != lt.dbeta)
      for (int i : g.consumer_indices(n->name()))
        if (!inside.count(g.at(i)->name())) return false;
    for (const std::string& in : n->input()) {
      const InputRef r = parse_input(in);
      if (r.control && !region.count(r.node)) return false;
    }
  }
  region.insert(lt.dbeta->name());
  for (int i = 0; i < g.size(); ++i) {
    const tfc::NodeDef& n = *g.at(i);
    if (region.count(n.name())) continue;
    for (const std::string& in : n.input()) {
      const InputRef r = parse_input(in);
      if (r.control && region.count(r.node)) return false;
    }
  }
  return true;
}

// Rewrite 12b (graph_fusion.h): the forward as LayerNormV3 in place of y, the gradient as
// LayerNormXBackpropV2 (in place of x's AddN, or one of its inputs where x has other gradients)
// and LayerNormBetaGammaBackpropV2 (in place of gamma's gradient; beta's readers read its
// output 1). NPUSIM_FUSION_LAYER_NORM_TRAINING=0 turns it off.
int fuse_layer_norm_trainings(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                              std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  std::vector<LayerNormTraining> found;
  for (int i = 0; i < g.size(); ++i) {
    std::optional<LayerNormMatch> f = match_layer_norm(g, rm, *g.at(i));
    if (!f) continue;
    LayerNormTraining lt;
    lt.f = *f;
    if (!match_layer_norm_grad(g, &lt) || !layer_norm_training_removable(g, lt, rm, preserve))
      continue;
    for (tfc::NodeDef* n : lt.region) rm.remove(n->name());
    rm.remove(lt.dbeta->name());
    for (tfc::NodeDef* n : {lt.f.y, lt.dx, lt.dgamma}) rm.claim(n->name());
    found.push_back(std::move(lt));
  }
  std::unordered_map<std::string, std::string> rewire;
  for (const LayerNormTraining& lt : found)
    rewire[lt.dbeta->name()] = output_name(lt.dgamma->name(), 1);
  rewire_readers(graph, rm.removed(), rewire);
  // The nodes' rewrites in place first (add_node may move the graph's nodes), then the new
  // nodes: a LayerNormXBackpropV2 of its own where x has other gradients.
  struct NewNode {
    std::string name, device;
    std::vector<std::string> inputs;
    tfc::DataType t;
  };
  std::vector<NewNode> added;
  for (LayerNormTraining& lt : found) {
    const LayerNormMatch& f = lt.f;
    const std::string y = f.y->name(), dx = lt.dx->name();
    const std::map<std::string, tfc::AttrValue> t_attr = {{"T", type_value(f.t)}};
    const std::map<std::string, tfc::AttrValue> x_backprop_attrs = {{"T", type_value(f.t)},
                                                                    {"Tgamma", type_value(f.t)}};
    rewrite_as(*f.y, "LayerNormV3", {f.x, f.gamma, f.beta}, layer_norm_attrs(f));
    // x's gradients: the fused one, then the others in their order.
    std::vector<std::string> others;
    for (const std::string& in : lt.dx->input())
      if (!parse_input(in).control &&
          std::find(lt.dx_parts.begin(), lt.dx_parts.end(), in) == lt.dx_parts.end())
        others.push_back(in);
    const std::vector<std::string> backprop_in = {lt.dy, f.x, output_name(y, 2), output_name(y, 1),
                                                  f.gamma};
    std::string x_backprop = dx;
    if (others.empty()) {
      rewrite_as(*lt.dx, "LayerNormXBackpropV2", backprop_in, x_backprop_attrs);
    } else {
      x_backprop = dx + "/npusim_layer_norm_x_backprop";
      added.push_back({x_backprop, lt.dx->device(), backprop_in, f.t});
      std::vector<std::string> sum = {x_backprop};
      sum.insert(sum.end(), others.begin(), others.end());
      std::map<std::string, tfc::AttrValue> add_attrs = t_attr;
      add_attrs["N"].set_i(static_cast<int64_t>(sum.size()));
      rewrite_as(*lt.dx, "AddN", sum, add_attrs);
    }
    rewrite_as(*lt.dgamma, "LayerNormBetaGammaBackpropV2", {lt.dy, output_name(x_backprop, 1)},
               t_attr);
  }
  for (const NewNode& n : added)
    add_node(graph, n.name, "LayerNormXBackpropV2", n.device, n.inputs,
             {{"T", type_value(n.t)}, {"Tgamma", type_value(n.t)}});
  removed->insert(rm.removed().begin(), rm.removed().end());
  return static_cast<int>(found.size());
}

// ---- Rewrite 0d: a convolution's bias gradient in BNTrainingReduceGrad (graph_fusion.h) ----

// BiasAddGrad(dx) (NHWC) with dx output 0 of a BNTrainingReduceGrad without a bias gradient
// (bias_grads = 0) of the same T on the same device: the BNTrainingReduceGrad gets bias_grads =
// 1 (output 1 the per-channel sum of dx), `_npusim_fused` naming the BiasAddGrad, whose readers
// read that output and which goes. The BiasAddGrad must be removable (not preserved, no control
// edges); dx's other readers are fine.
int fuse_bn_bias_grads_in(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                          std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  std::map<std::string, std::string> renamed;  // BiasAddGrad outputs -> output 1 of its producer
  int fused = 0;
  for (tfc::NodeDef& bias_grad : *graph.mutable_node()) {
    if (bias_grad.op() != "BiasAddGrad" || bias_grad.input_size() != 1 || !nhwc(bias_grad) ||
        !rm.removable(bias_grad, g.consumers(bias_grad.name())))
      continue;
    tfc::NodeDef* reduce_grad = g.producer(bias_grad, 0, "BNTrainingReduceGrad");
    const std::optional<tfc::DataType> t = type_attr(bias_grad);
    if (!reduce_grad || rm.claimed(reduce_grad->name()) || !on_npu(*reduce_grad) ||
        reduce_grad->device() != bias_grad.device() || type_attr(*reduce_grad) != t ||
        (t != tfc::DT_FLOAT && t != tfc::DT_HALF))
      continue;
    auto& attrs = *reduce_grad->mutable_attr();
    if (auto m = attrs.find("bias_grads"); m != attrs.end() && m->second.i() != 0) continue;
    attrs["bias_grads"].set_i(1);
    // The node names the fused node stands for besides its own (reports keep both).
    attrs["_npusim_fused"].mutable_list()->add_s(bias_grad.name());
    renamed[bias_grad.name()] = reduce_grad->name() + ":1";
    renamed[bias_grad.name() + ":0"] = reduce_grad->name() + ":1";
    rm.claim(reduce_grad->name());
    rm.remove(bias_grad.name());
    ++fused;
  }
  rename_inputs(graph, renamed);
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// ---- end of rewrite 0d ----

// ---- rewrite 15: the batch norm's statistics as a convolution epilogue ----

// BNTrainingReduce(x) with x output 0 of a Conv2D or Conv2DBiasAdd (NHWC) of the same T
// (float or half) on the same device: the convolution becomes Conv2DBNTrainingReduce (its
// name, inputs and attributes kept; outputs y, sum, square_sum), the BNTrainingReduce's
// readers read its outputs 1 and 2, and the BNTrainingReduce goes. The BNTrainingReduce must
// be removable (not preserved, no control edges, only x as input); the convolution's other
// readers are fine (y is still written).
int fuse_conv_bn_reduces_in(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                            std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  // The BNTrainingReduce's outputs -> the fused convolution's.
  std::map<std::string, std::string> renamed;
  int fused = 0;
  for (int i = 0; i < graph.node_size(); ++i) {
    tfc::NodeDef& reduce = *graph.mutable_node(i);
    if (reduce.op() != "BNTrainingReduce" || reduce.input_size() != 1 ||
        !rm.removable(reduce, g.consumers(reduce.name())))
      continue;
    tfc::NodeDef* conv = g.producer(reduce, 0, "Conv2D");
    if (!conv) conv = g.producer(reduce, 0, "Conv2DBiasAdd");
    const std::optional<tfc::DataType> t = type_attr(reduce);
    if (!conv || rm.claimed(conv->name()) || !on_npu(*conv) || conv->device() != reduce.device() ||
        !nhwc(*conv) || type_attr(*conv) != t || (t != tfc::DT_FLOAT && t != tfc::DT_HALF) ||
        type_attr(*conv, "Tbias").value_or(tfc::DT_FLOAT) != tfc::DT_FLOAT)
      continue;
    const bool bias = conv->op() == "Conv2DBiasAdd";
    std::vector<std::string> inputs;
    for (int k = 0; k < conv->input_size(); ++k)
      if (conv->input(k).empty() || conv->input(k)[0] != '^') inputs.push_back(conv->input(k));
    if (inputs.size() != (bias ? 3u : 2u)) continue;
    std::map<std::string, tfc::AttrValue> attrs;
    attrs["T"] = type_value(*t);
    attrs["N"].set_i(bias ? 1 : 0);
    for (const char* a :
         {"relu", "strides", "padding", "explicit_paddings", "dilations", "data_format"})
      if (auto it = conv->attr().find(a); it != conv->attr().end()) attrs[a] = it->second;
    // The node names the fused node stands for besides its own (reports keep both).
    attrs["_npusim_fused"].mutable_list()->add_s(reduce.name());
    renamed[reduce.name()] = conv->name() + ":1";
    renamed[reduce.name() + ":0"] = conv->name() + ":1";
    renamed[reduce.name() + ":1"] = conv->name() + ":2";
    rm.claim(conv->name());
    rm.remove(reduce.name());
    rewrite_as(*conv, "Conv2DBNTrainingReduce", inputs, attrs);
    ++fused;
  }
  rename_inputs(graph, renamed);
  removed->insert(rm.removed().begin(), rm.removed().end());
  return fused;
}

// ---- rewrite 17: Lamb's trust ratio as element-wise steps ----

// The value of a float32 Const holding one element, where a Const of zeros holds no values
// (TensorFlow's encoding of 0: keras' `x > 0` and clip's lower bound).
std::optional<float> scalar_float_or_zero(const tfc::NodeDef& n) {
  if (std::optional<float> v = scalar_float_const(n)) return v;
  if (n.op() != "Const" || type_attr(n, "dtype") != tfc::DT_FLOAT) return std::nullopt;
  const tfc::TensorProto& t = n.attr().at("value").tensor();
  int64_t elements = 1;
  for (const auto& d : t.tensor_shape().dim()) elements *= d.size();
  if (elements == 1 && t.float_val_size() == 0 && t.tensor_content().empty()) return 0.0f;
  return std::nullopt;
}

// Output 0 of a Sqrt of type t on the NPU of a sum of squares (Sum(Square(x)) or SquareSumV1): a
// norm, >= 0 or NaN (the Sqrt of -0 is -0, whose Sign is +0 as for +0).
bool norm_input(GraphView& g, const tfc::NodeDef& n, int i, tfc::DataType t) {
  const tfc::NodeDef* s = g.producer(n, i, "Sqrt");
  if (!s || !on_npu(*s) || type_attr(*s) != t) return false;
  const tfc::NodeDef* sum = g.producer(*s, 0, "Sum");
  return (sum && g.producer(*sum, 0, "Square")) || g.producer(*s, 0, "SquareSumV1");
}

// Greater(a, 0) with a a norm (norm_input), of type t, removable: returns a's input text.
std::optional<std::string> positive_norm(GraphView& g, const Removal& rm, tfc::NodeDef* greater,
                                         tfc::DataType t) {
  if (!greater || greater->op() != "Greater" || type_attr(*greater) != t ||
      !rm.removable(*greater, 1) || !norm_input(g, *greater, 0, t))
    return std::nullopt;
  const tfc::NodeDef* zero = input_node(g, *greater, 1);
  if (!zero || scalar_float_or_zero(*zero) != 0.0f) return std::nullopt;
  return greater->input(0);
}

// The scalar float Const `value` is read as the other operand of `n` (Minimum / Maximum) than
// `name`: its input text and value.
std::optional<std::pair<std::string, float>> const_operand(GraphView& g, const tfc::NodeDef& n,
                                                           const std::string& name) {
  const std::optional<std::string> other = other_operand(n, name);
  if (!other) return std::nullopt;
  const InputRef r = parse_input(*other);
  const tfc::NodeDef* c = r.control || r.port ? nullptr : g.node(r.node);
  const std::optional<float> v = c ? scalar_float_or_zero(*c) : std::nullopt;
  if (!v || !std::isfinite(*v)) return std::nullopt;
  return std::make_pair(*other, *v);
}

// A norm's Sqrt(Sum(Square(x), axes)) (Sum: float32, a Const axes input, not claimed; Square
// read by the Sum alone, removable): the Sum rewritten in place as SquareSumV1(x; axis = the axes,
// keep_dims), CANN's op, which squares in the reduction's pass; the Square goes. Returns whether
// it did.
bool fold_square_sum(GraphView& g, Removal& rm, const tfc::NodeDef& sqrt) {
  tfc::NodeDef* sum = g.producer(sqrt, 0, "Sum");
  if (!sum || !on_npu(*sum) || type_attr(*sum) != tfc::DT_FLOAT || rm.claimed(sum->name()) ||
      sum->input_size() < 2 || parse_input(sum->input(1)).control)
    return false;
  tfc::NodeDef* square = g.producer(*sum, 0, "Square");
  const tfc::NodeDef* axes = input_node(g, *sum, 1);
  const std::optional<std::vector<int64_t>> values = axes ? const_ints(*axes) : std::nullopt;
  if (!square || type_attr(*square) != tfc::DT_FLOAT || !rm.removable(*square, 1) || !values ||
      parse_input(square->input(0)).control)
    return false;
  std::map<std::string, tfc::AttrValue> attrs;
  attrs["T"] = type_value(tfc::DT_FLOAT);
  for (int64_t a : *values) attrs["axis"].mutable_list()->add_i(a);
  if (values->empty()) attrs["axis"].mutable_list();
  auto keep = sum->attr().find("keep_dims");
  attrs["keep_dims"].set_b(keep != sum->attr().end() && keep->second.b());
  attrs["N"].set_i(1);  // one input (rewrite 17b groups such nodes)
  attrs["_npusim_fused"].mutable_list()->add_s(square->name());
  const std::string x = square->input(0);
  rm.remove(square->name());
  rm.claim(sum->name());
  rewrite_as(*sum, "SquareSumV1", {x}, attrs);
  return true;
}

// Reports: the op type the launches of the variable update that `n` feeds are shown under
// (`_npusim_report_type`, kept by rewrites 5, 5b and 5c and read by the update's kernel, node by
// node and in an NpuGraph): set on the AssignSubVariableOp reached from `n` through at most
// `hops` nodes each read by the next alone (Lamb: ratio -> lr * ratio -> u * that -> the
// assign), where there is one on the NPU.
void report_update_as(GraphView& g, const tfc::NodeDef& n, int hops, const char* report_type) {
  tfc::NodeDef* at = g.only_consumer(n.name());
  for (int k = 1; at && at->op() != "AssignSubVariableOp" && k < hops; ++k)
    at = g.only_consumer(at->name());
  if (at && at->op() == "AssignSubVariableOp" && on_npu(*at))
    (*at->mutable_attr())["_npusim_report_type"].set_s(report_type);
}

// Reports: the moments' updates whose new values Lamb's u = m_hat / (sqrt(v_hat) + eps) (+ decay
// * w) reads, CANN's LambNextMV: from x, the input of u's sum of squares, through at most six
// element-wise nodes (AddV2, Mul, RealDiv, Sqrt, Sub) to ReadVariableOps, the AssignVariableOps
// on the NPU those reads wait for (the control edge that makes a read see the new value) get
// `_npusim_report_type` LambNextMV.
void report_moments_as_next_mv(GraphView& g, const std::string& x) {
  static const std::set<std::string> kSteps = {"AddV2", "Mul", "RealDiv", "Sqrt", "Sub"};
  std::vector<std::pair<std::string, int>> stack = {{x, 0}};
  std::set<std::string> seen;
  while (!stack.empty()) {
    const auto [input, depth] = stack.back();
    stack.pop_back();
    const InputRef r = parse_input(input);
    tfc::NodeDef* n = r.control ? nullptr : g.node(r.node);
    if (!n || !seen.insert(n->name()).second) continue;
    if (n->op() == "ReadVariableOp") {
      for (const std::string& in : n->input())
        if (const InputRef c = parse_input(in); c.control)
          if (tfc::NodeDef* assign = g.node(c.node);
              assign && assign->op() == "AssignVariableOp" && on_npu(*assign))
            (*assign->mutable_attr())["_npusim_report_type"].set_s("LambNextMV");
      continue;
    }
    if (!kSteps.count(n->op()) || depth >= 6) continue;
    for (const std::string& in : n->input()) stack.emplace_back(in, depth + 1);
  }
}

// MindSpore's Lamb (models/bert.py) as TensorFlow traces it, per variable:
//   ratio = Maximum(Minimum(SelectV2(LogicalAnd(Greater(a, 0), Greater(b, 0)), r, one), hi), lo)
// (keras.ops.where then clip), a and b Sqrt outputs (||w||, ||g||), one the Const 1 with
// lo <= 1 <= hi finite Consts, all float32 on the NPU. The booleans have no
// FusedElementwise step, so the select is written as element-wise steps, in place of the clip's
// Maximum (name kept):
//   c = Sign(a) * Sign(b)            1 where a > 0 and b > 0, else 0 (a, b >= 0)
//   ratio = c * Maximum(Minimum(r, hi), lo) + (one - c)
// which is the same value: the clip moved into the branch it changes (clip(one) = one), c * x is
// x or 0 for the finite clipped x, and x + 0 = x, 0 + 1 = 1. Only where a or b is NaN (a NaN in
// w or g) does it differ: NaN instead of one. A NaN in g makes the whole update NaN either way
// (the clipped g, the moments, u); a NaN in w leaves w's other elements finite unfused (ratio
// one) and makes them NaN here. Rewrite 4 then takes these steps with the rest
// of the update's chain, so rewrite 5 computes the trust ratio inside the variable's update
// (uniform steps, once per launch): CANN's LambUpdateWithLR.
// The norms a, b and r's ||u|| (r = RealDiv(a, Maximum(Sqrt(...), eps)), as Lamb has it) become
// SquareSumV1 where they are Sqrt(Sum(Square(x))) (fold_square_sum). A norm's Sqrt read by
// other nodes too (||g||: the gradient's clip) is computed again for the ratio
// ("<name>/npusim_lamb_norm_w" / "_g": the same Sqrt of the same sum, a step of the ratio's
// chain), so that each reader's chain takes its own Sqrt and none is a launch of its own.
// Returns the ratios rewritten.
int lower_lamb_trust_ratios(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                            std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  std::vector<tfc::NodeDef> added;
  int lowered = 0;
  for (int i = 0; i < g.size(); ++i) {
    tfc::NodeDef& clip_lo = *g.at(i);
    if (clip_lo.op() != "Maximum" || !on_npu(clip_lo) || rm.claimed(clip_lo.name())) continue;
    const std::optional<tfc::DataType> t = type_attr(clip_lo);
    if (t != tfc::DT_FLOAT) continue;  // the Consts are float32
    // Minimum(select, hi), either operand order, read by the Maximum alone.
    tfc::NodeDef* clip_hi = nullptr;
    for (int k = 0; k < 2 && !clip_hi; ++k) clip_hi = g.producer(clip_lo, k, "Minimum");
    if (!clip_hi || type_attr(*clip_hi) != t || !rm.removable(*clip_hi, 1)) continue;
    const auto lo = const_operand(g, clip_lo, clip_hi->name());
    tfc::NodeDef* select = nullptr;
    for (int k = 0; k < 2 && !select; ++k) select = g.producer(*clip_hi, k, "SelectV2");
    if (!lo || !select || type_attr(*select) != t || !rm.removable(*select, 1)) continue;
    const auto hi = const_operand(g, *clip_hi, select->name());
    if (!hi || !(lo->second <= 1.0f && 1.0f <= hi->second)) continue;
    const tfc::NodeDef* one = input_node(g, *select, 2);
    tfc::NodeDef* both = g.producer(*select, 0, "LogicalAnd");
    if (!one || scalar_float_const(*one) != 1.0f || !both || !rm.removable(*both, 1)) continue;
    tfc::NodeDef* ga = g.producer(*both, 0, "Greater");
    tfc::NodeDef* gb = g.producer(*both, 1, "Greater");
    const std::optional<std::string> a = positive_norm(g, rm, ga, *t);
    const std::optional<std::string> b = positive_norm(g, rm, gb, *t);
    if (!a || !b || ga == gb || parse_input(select->input(1)).control) continue;
    const std::string r = select->input(1), one_in = select->input(2);
    for (tfc::NodeDef* n : {clip_hi, select, both, ga, gb}) rm.remove(n->name());
    rm.claim(clip_lo.name());
    const std::string base = clip_lo.name() + "/npusim_lamb_";
    std::map<std::string, tfc::AttrValue> attrs;
    attrs["T"] = type_value(*t);
    auto step = [&](const std::string& suffix, const char* op,
                    const std::vector<std::string>& inputs) {
      tfc::NodeDef n;
      n.set_name(base + suffix);
      n.set_op(op);
      n.set_device(clip_lo.device());
      for (const std::string& in : inputs) n.add_input(in);
      for (const auto& [k, v] : attrs) (*n.mutable_attr())[k] = v;
      added.push_back(std::move(n));
      return base + suffix;
    };
    // The norms: SquareSumV1 where Sqrt(Sum(Square(x))), a Sqrt of the ratio's own.
    std::string norm[2] = {*a, *b};
    const char* suffix[2] = {"norm_w", "norm_g"};
    for (int k = 0; k < 2; ++k) {
      const tfc::NodeDef* root = input_node(g, k == 0 ? *ga : *gb, 0);
      fold_square_sum(g, rm, *root);
      if (g.consumers(root->name()) > 1) norm[k] = step(suffix[k], "Sqrt", {root->input(0)});
    }
    if (const tfc::NodeDef* div = g.producer(*select, 1, "RealDiv");
        div && GraphView::reads(*div, 0, input_node(g, *ga, 0)->name()))
      for (int k = 0; k < 2; ++k)
        if (const tfc::NodeDef* floor = g.producer(*div, 1, "Maximum"))
          if (const tfc::NodeDef* u = g.producer(*floor, k, "Sqrt")) {
            fold_square_sum(g, rm, *u);
            if (const tfc::NodeDef* sum = g.producer(*u, 0, "SquareSumV1"))
              report_moments_as_next_mv(g, sum->input(0));
          }
    const std::string sa = step("sign_w", "Sign", {norm[0]});
    const std::string sb = step("sign_g", "Sign", {norm[1]});
    const std::string c = step("both_positive", "Mul", {sa, sb});
    const std::string rh = step("clip_hi", "Minimum", {r, hi->first});
    const std::string rc = step("clipped", "Maximum", {rh, lo->first});
    const std::string kept = step("kept", "Mul", {c, rc});
    const std::string rest = step("otherwise", "Sub", {one_in, c});
    rewrite_as(clip_lo, "AddV2", {kept, rest}, attrs);
    report_update_as(g, clip_lo, 3, "LambUpdateWithLR");
    ++lowered;
  }
  for (tfc::NodeDef& n : added) *graph.add_node() = std::move(n);
  removed->insert(rm.removed().begin(), rm.removed().end());
  return lowered;
}

// ---- rewrite 17b: Lamb's norms as multi-tensor SquareSumV1 ----

// SquareSumV1 nodes of one input (attribute N absent or 1), float32 on the NPU, not preserved,
// whose axis is [0, 1, ..., k-1] (the whole of an input of rank k: the graph has no shapes, so
// an input of another rank, or one too large to share a reduction, is only found when the op
// compiles, and gets its own launches there), grouped by device, axis, keep_dims and the
// collectives they wait for (collectives_before): groups of independent ones
// (independent_groups) become one SquareSumV1 node "npusim_multi_square_sum_<k>"
// (merge_multi_tensor_groups). Its kernel
// (adapter/compiler/ops/reduce.cpp, compile_square_sums) reduces the members of one small
// aligned size as the rows of one reduction, each output the bits of its member's own launch.
// Returns the nodes made.
int group_square_sums(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                      std::set<std::string>* removed) {
  const int n_nodes = graph.node_size();
  const std::unordered_map<std::string, int> index = node_index(graph);
  KeyedCandidates candidates;
  for (int i = 0; i < n_nodes; ++i) {
    const tfc::NodeDef& n = graph.node(i);
    if (n.op() != "SquareSumV1" || !on_npu(n) || type_attr(n) != tfc::DT_FLOAT ||
        preserve.count(n.name()))
      continue;
    if (const auto m = n.attr().find("N"); m != n.attr().end() && m->second.i() != 1) continue;
    const auto axis = n.attr().find("axis");
    if (axis == n.attr().end() || axis->second.list().i_size() == 0) continue;
    bool whole = true;
    for (int k = 0; k < axis->second.list().i_size(); ++k)
      whole = whole && axis->second.list().i(k) == k;
    const int data = static_cast<int>(
        std::count_if(n.input().begin(), n.input().end(),
                      [](const std::string& in) { return !parse_input(in).control; }));
    if (!whole || data != 1) continue;
    const auto keep = n.attr().find("keep_dims");
    std::string key = n.device() + "|" + axis->second.SerializeAsString() +
                      (keep != n.attr().end() && keep->second.b() ? "|keep_dims" : "|") +
                      "|collectives" + collectives_before(graph, index, i);
    candidates.add(key, i);
  }
  return merge_multi_tensor_groups(graph, index, independent_groups(graph, index, candidates),
                                   "SquareSumV1", "npusim_multi_square_sum_",
                                   {"T", "axis", "keep_dims"}, removed);
}

// ---- end of rewrite 17 ----

// ---- rewrite 20: a loss scale's overflow check as one AllFinite ----

// Whether the reduction n (All) keeps its reduced dimensions.
bool keeps_dims(const tfc::NodeDef& n) {
  const auto k = n.attr().find("keep_dims");
  return k != n.attr().end() && k->second.b();
}

// All(Pack(All(IsFinite(x_i), [0 .. k_i - 1]) ...), [0]) -> AllFinite(x_0 ..): the header's
// rewrite 20. Returns the AllFinite nodes made.
int fuse_all_finites(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                     std::set<std::string>* removed) {
  GraphView g(graph);
  Removal rm(g, preserve);
  int made = 0;
  for (int i = 0; i < g.size(); ++i) {
    tfc::NodeDef& outer = *g.at(i);
    if (outer.op() != "All" || !on_npu(outer) || keeps_dims(outer) || rm.claimed(outer.name()))
      continue;
    // Read only as a Switch's predicate (a lowered cond's), which TensorFlow requires to be a
    // scalar: then Pack's output is a vector, every a_i a scalar and every inner All reduced
    // every axis of its x_i (the graph has no shapes to tell it otherwise).
    const std::vector<int>& readers = g.consumer_indices(outer.name());
    bool predicate = !readers.empty();
    for (int r : readers)
      predicate = predicate && g.at(r)->op() == "Switch" && GraphView::reads(*g.at(r), 1, outer.name());
    if (!predicate) continue;
    const std::optional<std::vector<int64_t>> outer_axes = input_ints(g, outer, 1);
    if (!outer_axes || outer_axes->size() != 1 || ((*outer_axes)[0] != 0 && (*outer_axes)[0] != -1))
      continue;
    tfc::NodeDef* pack = g.producer(outer, 0, "Pack");
    if (!pack || !rm.removable(*pack, 1) || pack->device() != outer.device() ||
        pack->input_size() < 1)
      continue;
    const auto axis = pack->attr().find("axis");
    if (axis != pack->attr().end() && axis->second.i() != 0 && axis->second.i() != -1) continue;
    std::vector<std::string> xs, taken;
    tfc::AttrValue ranks;
    ranks.mutable_list();
    std::optional<tfc::DataType> t;
    bool ok = true;
    for (int j = 0; ok && j < pack->input_size(); ++j) {
      // a_j: an inner All, or the IsFinite itself where grappler dropped the All of a scalar
      // (no axes to reduce).
      tfc::NodeDef* inner = g.producer(*pack, j, "All");
      tfc::NodeDef* check = inner ? g.producer(*inner, 0, "IsFinite")
                                  : g.producer(*pack, j, "IsFinite");
      const std::optional<std::vector<int64_t>> axes =
          inner ? input_ints(g, *inner, 1) : std::vector<int64_t>{};
      ok = check && axes && (!inner || (rm.removable(*inner, 1) && !keeps_dims(*inner) &&
                                        inner->device() == outer.device())) &&
           rm.removable(*check, 1) && check->device() == outer.device() &&
           check->input_size() == 1 && type_attr(*check) && float_type(*type_attr(*check)) &&
           (!t || type_attr(*check) == t);
      for (size_t a = 0; ok && a < axes->size(); ++a) ok = (*axes)[a] == static_cast<int64_t>(a);
      if (!ok) break;
      t = type_attr(*check);
      xs.push_back(check->input(0));
      ranks.mutable_list()->add_i(static_cast<int64_t>(axes->size()));
      taken.push_back(check->name());
      if (inner) taken.push_back(inner->name());
    }
    if (!ok || !t) continue;
    taken.push_back(pack->name());
    std::map<std::string, tfc::AttrValue> attrs;
    attrs["T"] = type_value(*t);
    attrs["N"].set_i(static_cast<int64_t>(xs.size()));
    attrs["ranks"] = ranks;
    for (const std::string& name : taken) {
      attrs["_npusim_fused"].mutable_list()->add_s(name);
      rm.remove(name);
    }
    rm.claim(outer.name());
    rewrite_as(outer, "AllFinite", xs, attrs);
    ++made;
  }
  removed->insert(rm.removed().begin(), rm.removed().end());
  return made;
}

// ---- end of rewrite 20 ----

// ---- rewrite 0e: Keras mixed_float16's casts around the training batch norm ----

// A Cast between the given float types (Truncate false) on the NPU.
bool float_cast(const tfc::NodeDef& n, tfc::DataType from, tfc::DataType to) {
  const auto truncate = n.attr().find("Truncate");
  return is_cast(&n, from, to) && (truncate == n.attr().end() || !truncate->second.b());
}

// The nodes reading any output of `name` as data (once each) and whether something reads one
// by a control edge.
std::vector<tfc::NodeDef*> data_readers(GraphView& g, const std::string& name) {
  std::vector<tfc::NodeDef*> out;
  for (int i : g.consumer_indices(name))
    if (std::find(out.begin(), out.end(), g.at(i)) == out.end()) out.push_back(g.at(i));
  return out;
}

// Whether output 0 of `n` is read, and only by Casts float -> half that may go (its other
// outputs may have any readers); appends those Casts to `casts`.
bool read_through_half_casts(GraphView& g, const tfc::NodeDef& n,
                             const std::unordered_set<std::string>& preserve,
                             std::vector<tfc::NodeDef*>* casts) {
  bool any = false;
  for (tfc::NodeDef* c : data_readers(g, n.name())) {
    if (!GraphView::reads(*c, 0, n.name())) {  // reads another output only
      bool port0 = false;
      for (int k = 0; k < c->input_size(); ++k) port0 = port0 || GraphView::reads(*c, k, n.name());
      if (!port0) continue;
    }
    if (!float_cast(*c, tfc::DT_FLOAT, tfc::DT_HALF) || preserve.count(c->name())) return false;
    if (std::find(casts->begin(), casts->end(), c) == casts->end()) casts->push_back(c);
    any = true;
  }
  return any;
}

// One batch norm rewrite 0e turns float16: its four nodes (grads: the two gradients, or none
// in a forward-only graph), x's Cast, dy's Cast (null: none) and the Casts of y and dx to half.
struct HalfBatchNorm {
  tfc::NodeDef *update = nullptr, *reduce = nullptr, *xc = nullptr, *gc = nullptr;
  std::vector<tfc::NodeDef*> grads, out_casts;
};

// Rewrite 0e (graph_fusion.h). Returns the batch norms turned float16.
int fold_bn_half_casts_in(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                          std::set<std::string>* removed) {
  GraphView g(graph);
  std::vector<HalfBatchNorm> found;
  for (int i = 0; i < g.size(); ++i) {
    tfc::NodeDef& update = *g.at(i);
    if (update.op() != "BNTrainingUpdate" || type_attr(update) != tfc::DT_FLOAT ||
        update.input_size() < 5 || preserve.count(update.name()))
      continue;
    if (const auto r = update.attr().find("R"); r != update.attr().end() && r->second.i() != 0)
      continue;
    tfc::NodeDef* xc = g.producer(update, 0, "Cast");
    tfc::NodeDef* reduce = g.producer(update, 1, "BNTrainingReduce");
    if (!xc || !reduce || !float_cast(*xc, tfc::DT_HALF, tfc::DT_FLOAT) ||
        preserve.count(xc->name()) || type_attr(*reduce) != tfc::DT_FLOAT ||
        !GraphView::reads(*reduce, 0, xc->name()) || preserve.count(reduce->name()) ||
        g.consumers(reduce->name()) != 2)
      continue;
    // Every reader of x's Cast is this batch norm's: the reduce, the update and its gradients
    // (reading x as input 1 and the update's batch statistics).
    HalfBatchNorm h;
    h.update = &update;
    h.reduce = reduce;
    h.xc = xc;
    bool ok = true;
    for (tfc::NodeDef* r : data_readers(g, xc->name())) {
      if (r == reduce || r == &update) continue;
      const bool grad = (r->op() == "BNTrainingUpdateGrad" || r->op() == "BNTrainingReduceGrad") &&
                        type_attr(*r) == tfc::DT_FLOAT && GraphView::reads(*r, 1, xc->name()) &&
                        !preserve.count(r->name());
      if (!grad) ok = false;
      if (const auto b = r->attr().find("bias_grads"); b != r->attr().end() && b->second.i() != 0)
        ok = false;
      h.grads.push_back(r);
    }
    if (!ok || GraphView::reads(update, 0, xc->name()) == false) continue;
    // y read only through Casts to half; dy (the gradients' input 0) one Cast from half; dx
    // (BNTrainingReduceGrad's output 0) read only through Casts to half.
    if (!read_through_half_casts(g, update, preserve, &h.out_casts)) continue;
    for (tfc::NodeDef* r : h.grads) {
      tfc::NodeDef* c = g.producer(*r, 0, "Cast");
      if (!c || (h.gc && c != h.gc)) ok = false;
      h.gc = c;
      if (r->op() == "BNTrainingReduceGrad" &&
          !read_through_half_casts(g, *r, preserve, &h.out_casts))
        ok = false;
    }
    if (h.gc)
      ok = ok && float_cast(*h.gc, tfc::DT_HALF, tfc::DT_FLOAT) && !preserve.count(h.gc->name());
    if (ok) found.push_back(std::move(h));
  }
  // dy's Cast goes where the gradients of batch norms taken here are all its readers: one batch
  // norm's, or several whose dy is one tensor (a residual add's two branches, a projection
  // block's, whose Casts of that tensor TensorFlow merged into one). Batch norms whose Cast has
  // other readers are left out, until none is.
  for (bool dropped = true; dropped;) {
    dropped = false;
    std::set<const tfc::NodeDef*> grads;
    for (const HalfBatchNorm& h : found) grads.insert(h.grads.begin(), h.grads.end());
    for (auto h = found.begin(); h != found.end();) {
      bool ok = true;
      if (h->gc)
        for (tfc::NodeDef* r : data_readers(g, h->gc->name())) ok = ok && grads.count(r);
      dropped |= !ok;
      h = ok ? h + 1 : found.erase(h);
    }
  }
  // Turn the batch norms float16: x and dy read as the Casts read them, the outputs' Casts go
  // (their readers read the batch norm's outputs).
  std::map<std::string, std::string> rewire;  // a removed Cast -> the tensor its readers read
  std::set<std::string> gone;
  const auto input_of = [](const tfc::NodeDef& cast) { return cast.input(0); };
  for (HalfBatchNorm& h : found) {
    for (tfc::NodeDef* n : {h.reduce, h.update})
      (*n->mutable_attr())["T"] = type_value(tfc::DT_HALF);
    h.reduce->set_input(0, input_of(*h.xc));
    h.update->set_input(0, input_of(*h.xc));
    for (tfc::NodeDef* r : h.grads) {
      (*r->mutable_attr())["T"] = type_value(tfc::DT_HALF);
      r->set_input(1, input_of(*h.xc));
      r->set_input(0, input_of(*h.gc));
    }
    for (tfc::NodeDef* c : {h.xc, h.gc}) {
      if (!c || !gone.insert(c->name()).second) continue;  // (a shared dy Cast once)
      rewire[c->name()] = input_of(*c);
      // The Cast's control inputs hold its readers back: they now hold back the batch norms.
      for (const std::string& in : c->input())
        if (!in.empty() && in[0] == '^')
          for (tfc::NodeDef* r : data_readers(g, c->name())) r->add_input(in);
    }
    for (tfc::NodeDef* c : h.out_casts) {
      gone.insert(c->name());
      rewire[c->name()] = c->input(0);
    }
  }
  const int made = static_cast<int>(found.size());
  if (gone.empty()) return 0;
  // Readers of a removed Cast read what it read (a control edge: its producer's node).
  for (tfc::NodeDef& n : *graph.mutable_node()) {
    if (gone.count(n.name())) continue;
    for (int k = 0; k < n.input_size(); ++k) {
      const InputRef r = parse_input(n.input(k));
      const auto to = rewire.find(r.node);
      if (to == rewire.end()) continue;
      if (r.control) {
        n.set_input(k, "^" + parse_input(to->second).node);
      } else {
        n.set_input(k, to->second);
      }
    }
  }
  // Drop self control edges and duplicates the rewiring made.
  for (tfc::NodeDef& n : *graph.mutable_node()) {
    std::set<std::string> seen;
    std::vector<std::string> kept;
    for (const std::string& in : n.input()) {
      if (!in.empty() && in[0] == '^' && (in.substr(1) == n.name() || !seen.insert(in).second))
        continue;
      kept.push_back(in);
    }
    if (static_cast<int>(kept.size()) != n.input_size()) {
      n.clear_input();
      for (const std::string& in : kept) n.add_input(in);
    }
  }
  removed->insert(gone.begin(), gone.end());
  return made;
}

// ---- end of rewrite 0e ----

// ---- rewrite 19: the weights' casts of a training step in multi-tensor launches ----

// Whether `op` writes the variables whose handles it takes (the updates of a training step).
bool writes_variables(const std::string& op) {
  return op == "FusedVariableUpdate" || op == "AssignVariableOp" || op == "AssignAddVariableOp" ||
         op == "AssignSubVariableOp" || op.rfind("ResourceApply", 0) == 0 ||
         op.rfind("ResourceSparseApply", 0) == 0 || op.rfind("ResourceScatter", 0) == 0;
}

// Casts between float types on the NPU, not preserved, whose input is a ReadVariableOp's value
// of a variable that this graph also writes (the float16 copies of the weights that
// allow_mix_precision's pass or Keras' mixed_float16 layers cast at a training step's start;
// the writer's handle followed back through Switch / Identity), grouped by device, SrcT, DstT,
// Truncate and the collectives they wait for: groups of independent ones become one
// MultiTensorCast node "npusim_multi_cast_<k>" (merge_multi_tensor_groups). A variable only read
// here (inference, evaluation) keeps its Cast, whose launch the derived-tensor cache leaves out
// while the variable is unchanged (derived_tensor_cache.h). Returns the nodes made.
int group_weight_casts(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                       std::set<std::string>* removed) {
  const int n_nodes = graph.node_size();
  const std::unordered_map<std::string, int> index = node_index(graph);
  // The handles' nodes of written variables: a writer's handle input followed back through the
  // nodes that forward it (a lowered cond's Switch, Identity: Keras' LossScaleOptimizer updates
  // the variables in the cond's branch, on the Switch of the handle the step's reads take).
  std::unordered_set<std::string> written;
  for (const tfc::NodeDef& n : graph.node())
    if (writes_variables(n.op()))
      for (const std::string& in : n.input()) {
        InputRef r = parse_input(in);
        if (r.control) continue;
        for (int hops = 0; hops < 64; ++hops) {  // a chain of forwards, not a cycle
          written.insert(r.node);
          const auto f = index.find(r.node);
          if (f == index.end()) break;
          const tfc::NodeDef& fwd = graph.node(f->second);
          if ((fwd.op() != "Switch" && fwd.op() != "Identity") || fwd.input_size() < 1) break;
          r = parse_input(fwd.input(0));
          if (r.control) break;
        }
      }
  // The gradients' casts that a loss scale checks (rewrite 20's AllFinite) and hands to its
  // cond (Switch), read by nothing else: Keras' mixed_float16 float16 gradients of float32
  // variables, cast at the end of the backward pass.
  std::unordered_set<std::string> checked_gradient;
  for (const tfc::NodeDef& n : graph.node())
    if (n.op() == "AllFinite")
      for (const std::string& in : n.input()) {
        const InputRef r = parse_input(in);
        const auto c = index.find(r.node);
        if (!r.control && r.port == 0 && c != index.end() && graph.node(c->second).op() == "Cast")
          checked_gradient.insert(r.node);
      }
  for (const tfc::NodeDef& reader : graph.node())  // any other reader, or a control edge: out
    for (const std::string& in : reader.input()) {
      const InputRef r = parse_input(in);
      if (checked_gradient.count(r.node) &&
          (r.control || (reader.op() != "AllFinite" && reader.op() != "Switch")))
        checked_gradient.erase(r.node);
    }
  auto is_float = [](std::optional<tfc::DataType> t) {
    return t == tfc::DT_FLOAT || t == tfc::DT_HALF || t == tfc::DT_BFLOAT16;
  };
  KeyedCandidates candidates;
  for (int i = 0; i < n_nodes; ++i) {
    const tfc::NodeDef& n = graph.node(i);
    if (n.op() != "Cast" || !on_npu(n) || preserve.count(n.name()) ||
        !is_float(type_attr(n, "SrcT")) || !is_float(type_attr(n, "DstT")))
      continue;
    std::vector<InputRef> data;
    for (const std::string& in : n.input())
      if (const InputRef r = parse_input(in); !r.control) data.push_back(r);
    if (data.size() != 1 || data[0].port != 0) continue;
    const auto read = index.find(data[0].node);
    if (read == index.end()) continue;
    const tfc::NodeDef& r = graph.node(read->second);
    const bool weight = r.op() == "ReadVariableOp" && r.input_size() >= 1 &&
                        written.count(parse_input(r.input(0)).node);
    const bool checked = !weight && checked_gradient.count(n.name());
    if (!weight && !checked) continue;
    const auto truncate = n.attr().find("Truncate");
    const bool truncated = truncate != n.attr().end() && truncate->second.b();
    candidates.add(n.device() + "|" + std::to_string(*type_attr(n, "SrcT")) + "|" +
                       std::to_string(*type_attr(n, "DstT")) + (truncated ? "|truncate" : "|") +
                       (checked ? "|checked" : "|weight") + "|collectives" +
                       collectives_before(graph, index, i),
                   i);
  }
  return merge_multi_tensor_groups(graph, index, independent_groups(graph, index, candidates),
                                   "MultiTensorCast", "npusim_multi_cast_",
                                   {"SrcT", "DstT", "Truncate"}, removed);
}

// The forward convolutions' filters in blocks of 16 output channels (rewrite 19b): each
// float16 / bfloat16 member of a weights' MultiTensorCast (rewrite 19, above) whose output a
// forward convolution on the NPU reads as its filter (Conv2D, Conv2DBiasAdd,
// Conv2DBNTrainingReduce: input 1; NHWC) is written in kFilterLayoutN16 (adapter/compiler/ops/
// conv.h: [Cout/16][KH][KW][Cin][16]) for those convolutions, each of which gets the
// attribute kFilterLayoutAttr naming it. The input gradient Conv2DBackpropInput (input 1,
// NHWC) of such a member reads it blocked too (one run per k-block of its B) and gets the
// attribute, unless `input_grad` is false (NPUSIM_CONV_WEIGHTS_BLOCKED_INPUT_GRAD=0: it reads
// HWIO). Where anything else reads the member too, the member stays HWIO for those readers and
// a copy of it, one more member of the same input, is written blocked for the convolutions:
// one more f16 copy of the filter a step. Any groups (the compiler reads a grouped blocked
// filter). A filter of Cout not a multiple of 16 is HWIO in that layout (conv.h): where the
// graph shows its shape (the ReadVariableOp's _output_shapes, else its variable's: VarHandleOp
// `shape`, a function argument's _handle_shapes) such a member is left alone, elsewhere it is
// marked and stays HWIO bytes. Returns the members made blocked.
int block_conv_filters_in(tfc::GraphDef& graph, bool input_grad) {
  const int n_nodes = graph.node_size();
  const std::unordered_map<std::string, int> index = node_index(graph);
  // Readers of each (node, port), data edges only: (reader, input position).
  std::map<std::pair<std::string, int>, std::vector<std::pair<int, int>>> readers;
  for (int i = 0; i < n_nodes; ++i) {
    const tfc::NodeDef& n = graph.node(i);
    for (int j = 0; j < n.input_size(); ++j) {
      const InputRef r = parse_input(n.input(j));
      if (!r.control) readers[{r.node, r.port}].push_back({i, j});
    }
  }
  // The recorded shape of a data input (node:port); null where none is recorded.
  auto recorded_shape = [&](const std::string& input) -> const tfc::TensorShapeProto* {
    const InputRef r = parse_input(input);
    const auto p = index.find(r.node);
    if (p == index.end()) return nullptr;
    const auto shapes = graph.node(p->second).attr().find("_output_shapes");
    if (shapes == graph.node(p->second).attr().end() ||
        shapes->second.list().shape_size() <= r.port)
      return nullptr;
    const tfc::TensorShapeProto& shape = shapes->second.list().shape(r.port);
    return shape.unknown_rank() ? nullptr : &shape;
  };
  // The shape of the variable a ReadVariableOp `input` reads (its handle's VarHandleOp `shape`
  // or _Arg `_handle_shapes`); null where none is recorded.
  auto variable_shape = [&](const std::string& input) -> const tfc::TensorShapeProto* {
    const auto read = index.find(parse_input(input).node);
    if (read == index.end() || graph.node(read->second).op() != "ReadVariableOp" ||
        graph.node(read->second).input_size() < 1)
      return nullptr;
    const auto handle = index.find(parse_input(graph.node(read->second).input(0)).node);
    if (handle == index.end()) return nullptr;
    const tfc::NodeDef& h = graph.node(handle->second);
    const tfc::TensorShapeProto* shape = nullptr;
    if (const auto a = h.attr().find("shape"); h.op() == "VarHandleOp" && a != h.attr().end())
      shape = &a->second.shape();
    else if (const auto l = h.attr().find("_handle_shapes");
             l != h.attr().end() && l->second.list().shape_size() == 1)
      shape = &l->second.list().shape(0);
    return shape && !shape->unknown_rank() ? shape : nullptr;
  };
  // False only where a recorded shape of the filter rules the layout out (Cout not a multiple
  // of 16: the layout is HWIO, nothing to gain).
  auto shape_allows = [&](const std::string& input) {
    const tfc::TensorShapeProto* shape = recorded_shape(input);
    if (!shape) shape = variable_shape(input);
    if (!shape) return true;
    return shape->dim_size() == 4 && (shape->dim(3).size() < 0 || shape->dim(3).size() % 16 == 0);
  };
  // Whether `reader` reads the member as a forward convolution's filter that may be blocked.
  auto forward_conv = [&](int reader, int position) {
    const tfc::NodeDef& c = graph.node(reader);
    if (position != 1 || !on_npu(c) || c.attr().count(kFilterLayoutAttr)) return false;
    if (c.op() != "Conv2D" && c.op() != "Conv2DBiasAdd" && c.op() != "Conv2DBNTrainingReduce")
      return false;
    const auto f = c.attr().find("data_format");
    if (f != c.attr().end() && f->second.s() != "NHWC") return false;
    // (Any groups: the convolutions read a grouped blocked filter, in place where a group's
    // output channels are whole blocks of 16, else through an HWIO copy: conv.h.)
    return true;
  };
  // Whether `reader` reads the member as an input gradient's filter that may be blocked (one
  // that a forward convolution of the same member has: its groups are that convolution's).
  auto input_grad_conv = [&](int reader, int position) {
    const tfc::NodeDef& c = graph.node(reader);
    if (!input_grad || position != 1 || !on_npu(c) || c.attr().count(kFilterLayoutAttr) ||
        c.op() != "Conv2DBackpropInput")
      return false;
    const auto f = c.attr().find("data_format");
    return f == c.attr().end() || f->second.s() == "NHWC";
  };
  int blocked = 0;
  for (int i = 0; i < n_nodes; ++i) {
    tfc::NodeDef& cast = *graph.mutable_node(i);
    const auto dst = type_attr(cast, "DstT");
    if (cast.op() != "MultiTensorCast" || (dst != tfc::DT_HALF && dst != tfc::DT_BFLOAT16) ||
        cast.attr().count("filter_n16"))
      continue;
    const int64_t n = cast.attr().at("N").i();
    std::vector<int64_t> n16;
    std::vector<std::string> extra_inputs;
    for (int64_t m = 0; m < n; ++m) {
      const auto it = readers.find({cast.name(), static_cast<int>(m)});
      if (it == readers.end() || !shape_allows(cast.input(static_cast<int>(m)))) continue;
      std::vector<std::pair<int, int>> convs, grads;
      bool others = false;
      for (const auto& [reader, position] : it->second) {
        if (forward_conv(reader, position))
          convs.emplace_back(reader, position);
        else if (input_grad_conv(reader, position))
          grads.emplace_back(reader, position);
        else
          others = true;
      }
      if (convs.empty()) continue;
      convs.insert(convs.end(), grads.begin(), grads.end());
      int64_t member = m;
      if (others) {  // a blocked copy for the convolutions, the member stays HWIO
        member = n + static_cast<int64_t>(extra_inputs.size());
        extra_inputs.push_back(cast.input(static_cast<int>(m)));
      }
      for (const auto& [reader, position] : convs) {
        tfc::NodeDef& c = *graph.mutable_node(reader);
        c.set_input(position, member == 0 ? cast.name() : cast.name() + ":" + std::to_string(member));
        (*c.mutable_attr())[kFilterLayoutAttr].set_s(npusim::compiler::ops::kFilterLayoutN16);
      }
      n16.push_back(member);
    }
    if (n16.empty()) continue;
    // The copies' inputs after the data inputs, before the control inputs.
    std::vector<std::string> inputs(cast.input().begin(), cast.input().end());
    inputs.insert(inputs.begin() + n, extra_inputs.begin(), extra_inputs.end());
    cast.clear_input();
    for (const std::string& in : inputs) cast.add_input(in);
    auto& attrs = *cast.mutable_attr();
    attrs["N"].set_i(n + static_cast<int64_t>(extra_inputs.size()));
    const auto members = attrs.find("_npusim_members");
    for (size_t e = 0; e < extra_inputs.size(); ++e)
      if (members != attrs.end())
        members->second.mutable_list()->add_s(parse_input(extra_inputs[e]).node + "/n16");
    for (int64_t m : n16) attrs["filter_n16"].mutable_list()->add_i(m);
    blocked += static_cast<int>(n16.size());
  }
  return blocked;
}

// ---- end of rewrite 19 ----

void erase_nodes(tfc::GraphDef& graph, const std::set<std::string>& names) {
  if (names.empty()) return;
  auto* nodes = graph.mutable_node();
  int kept = 0;
  for (int i = 0; i < nodes->size(); ++i) {
    if (names.count(nodes->Get(i).name())) continue;
    if (kept != i) nodes->SwapElements(kept, i);
    ++kept;
  }
  while (nodes->size() > kept) nodes->RemoveLast();
}

}  // namespace

bool fusion_requested() {
  static const bool on = [] {
    const char* v = std::getenv("NPUSIM_FUSION");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

bool training_fusion_requested() {
  static const bool on = [] {
    const char* v = std::getenv("NPUSIM_FUSION_BN_TRAINING");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

bool bn_relu_grad_fusion_requested() {
  static const bool on = [] {
    const char* v = std::getenv("NPUSIM_FUSION_BN_RELU_GRAD");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

bool variable_update_fusion_requested() {
  static const bool on = [] {
    const char* v = std::getenv("NPUSIM_FUSION_VARIABLE_UPDATE");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

bool update_scale_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_UPDATE_SCALE");
  return on;
}

bool cast_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_CAST");
  return on;
}

bool multi_cast_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_MULTI_CAST");
  return on;
}

// NPUSIM_CONV_WEIGHTS_BLOCKED (read once per process): "1" on, "0" off; unset or empty, the
// chip's choice (block_conv_filters' `chip_default`). Anything else is off, with a warning.
std::optional<bool> conv_weights_blocked_forced() {
  static const std::optional<bool> forced = []() -> std::optional<bool> {
    const char* v = std::getenv("NPUSIM_CONV_WEIGHTS_BLOCKED");
    if (!v || !*v) return std::nullopt;
    if (std::string(v) == "1") return true;
    if (std::string(v) != "0")
      std::fprintf(stderr,
                   "npusim: warning: NPUSIM_CONV_WEIGHTS_BLOCKED='%s' is neither 0 nor 1: off\n", v);
    return false;
  }();
  return forced;
}

int block_conv_filters(tfc::GraphDef& graph, bool chip_default) {
  if (!fusion_enabled() || !multi_cast_requested() ||
      !conv_weights_blocked_forced().value_or(chip_default))
    return 0;
  static const bool input_grad = switch_on("NPUSIM_CONV_WEIGHTS_BLOCKED_INPUT_GRAD");
  return block_conv_filters_in(graph, input_grad);
}

bool all_finite_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_ALL_FINITE");
  return on;
}

bool multi_square_sum_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_MULTI_SQUARE_SUM");
  return on;
}

bool select_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_SELECT");
  return on;
}

bool rms_norm_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_RMS_NORM");
  return on;
}

bool swiglu_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_SWIGLU");
  return on;
}

bool attention_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_ATTENTION");
  return on;
}

bool multi_tensor_update_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_MULTI_TENSOR");
  return on;
}

bool epilogue_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_EPILOGUE");
  return on;
}

bool rope_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_ROPE");
  return on;
}

bool gelu_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_GELU");
  return on;
}

bool geglu_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_GEGLU");
  return on;
}

bool layer_norm_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_LAYER_NORM");
  return on;
}

bool layer_norm_training_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_LAYER_NORM_TRAINING");
  return on;
}

bool weight_quant_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_WEIGHT_QUANT");
  return on;
}

bool transpose_fold_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_TRANSPOSE_FOLD");
  return on;
}

bool lamb_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_LAMB");
  return on;
}

bool fusion_enabled() { return fusion_requested() && fused_ops_registered(); }

bool conv_bn_reduce_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_CONV_BN_REDUCE");
  return on;
}

int fold_update_casts(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve) {
  if (!fusion_enabled() || !cast_fusion_requested() || !fused_variable_update_registered())
    return 0;
  std::set<std::string> removed;
  const int folded = fold_update_casts(graph, preserve, &removed);
  erase_nodes(graph, removed);
  return folded;
}

int group_weight_casts(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve) {
  if (!fusion_enabled() || !multi_cast_requested()) return 0;
  std::set<std::string> removed;
  const int made = group_weight_casts(graph, preserve, &removed);
  erase_nodes(graph, removed);
  return made;
}

int fold_bn_relu_grads(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve) {
  if (!fusion_enabled() || !training_fusion_requested() || !bn_relu_grad_fusion_requested())
    return 0;
  std::set<std::string> removed;
  const int folded = fuse_bn_relu_grads(graph, preserve, &removed);
  erase_nodes(graph, removed);
  return folded;
}

bool add_n_relu_grad_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_ADDN_RELU_GRAD");
  return on;
}

int fuse_add_n_relu_grads(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve) {
  if (!fusion_enabled() || !add_n_relu_grad_fusion_requested() || !fused_elementwise_registered())
    return 0;
  std::set<std::string> removed;
  const int fused = fuse_add_n_relu_grads_in(graph, preserve, &removed);
  erase_nodes(graph, removed);
  return fused;
}

bool bn_bias_grad_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_BN_BIAS_GRAD");
  return on;
}

// Runs `rewrite` (its nodes to erase into the set it is given) and erases them from graph;
// returns the rewrite's count.
static int rewrite_and_erase(tfc::GraphDef& graph,
                             const std::function<int(std::set<std::string>*)>& rewrite) {
  std::set<std::string> removed;
  const int made = rewrite(&removed);
  erase_nodes(graph, removed);
  return made;
}

int fuse_bn_bias_grads(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve) {
  if (!fusion_enabled() || !training_fusion_requested() || !bn_bias_grad_fusion_requested())
    return 0;
  return rewrite_and_erase(graph, [&](std::set<std::string>* removed) {
    return fuse_bn_bias_grads_in(graph, preserve, removed);
  });
}

bool bn_add_relu_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_BN_ADD_RELU");
  return on;
}

int fuse_bn_add_relus(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve) {
  if (!fusion_enabled() || !training_fusion_requested() || !bn_add_relu_fusion_requested())
    return 0;
  return rewrite_and_erase(graph, [&](std::set<std::string>* removed) {
    return fuse_bn_add_relus_in(graph, preserve, removed);
  });
}

bool bn_relu_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_BN_RELU");
  return on;
}

int fold_bn_relus(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve) {
  if (!fusion_enabled() || !training_fusion_requested() || !bn_relu_fusion_requested()) return 0;
  return rewrite_and_erase(graph, [&](std::set<std::string>* removed) {
    return fold_bn_relus_in(graph, preserve, removed);
  });
}

bool bn_half_casts_fusion_requested() {
  static const bool on = switch_on("NPUSIM_FUSION_BN_HALF_CASTS");
  return on;
}

int fold_bn_half_casts(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve) {
  if (!fusion_enabled() || !training_fusion_requested() || !bn_half_casts_fusion_requested())
    return 0;
  return rewrite_and_erase(graph, [&](std::set<std::string>* removed) {
    return fold_bn_half_casts_in(graph, preserve, removed);
  });
}

int fuse_conv_bn_reduces(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve) {
  if (!fusion_enabled() || !conv_bn_reduce_fusion_requested()) return 0;
  std::set<std::string> removed;
  const int fused = fuse_conv_bn_reduces_in(graph, preserve, &removed);
  erase_nodes(graph, removed);
  return fused;
}

FusionCounts fuse_npu_graph(tfc::GraphDef& graph, const std::unordered_set<std::string>& preserve,
                            const TypeCheck& type_error) {
  FusionCounts counts;
  // Where the graph given passes `type_error`, each rewrite after which it does not (an edge
  // TensorFlow would refuse, and with it the whole optimized graph) is taken back on its own,
  // logged; the rewrites before and after it stay.
  const bool checked = type_error && type_error(graph).empty();
  // Runs `rewrite` (its nodes to erase into `removed`; returns the nodes it made) unless `on` is
  // false; its count into *count.
  auto apply = [&](const char* what, bool on, int* count,
                   const std::function<int(std::set<std::string>*)>& rewrite) {
    if (!on) return;
    tfc::GraphDef before;
    if (checked) {
      HostCpuScope timed("graph_pass", "fusion: copies and type checks");
      before = graph;
    }
    std::set<std::string> removed;
    int made;
    {
      HostCpuScope timed("graph_pass", std::string("fusion: ") + what);
      made = rewrite(&removed);
      erase_nodes(graph, removed);
    }
    if (checked && made > 0) {
      HostCpuScope timed("graph_pass", "fusion: copies and type checks");
      const std::string error = type_error(graph);
      if (!error.empty()) {
        std::fprintf(stderr, "npusim: graph fusion: the %s rewrite left out: %s\n", what,
                     error.c_str());
        graph.Swap(&before);
        made = 0;
      }
    }
    *count = made;
  };
  apply("AllFinite", all_finite_fusion_requested(), &counts.all_finite,
        [&](auto* removed) { return fuse_all_finites(graph, preserve, removed); });
  // Before 4, which would take the mask's comparison into a chain.
  apply("DropOutGenMask", gen_mask_fusion_requested(), &counts.gen_mask,
        [&](auto* removed) { return fuse_dropout_gen_masks(graph, preserve, removed); });
  // Decoder-model rewrites first: rewrite 4 would otherwise take their element-wise steps.
  if (llm_ops_registered()) {
    // Rewrite 11 first: its Reshape in place of the RealDiv is what rewrites 8-10 expect of a
    // Dense / EinsumDense output.
    apply("WeightQuantBatchMatmulV2", weight_quant_fusion_requested(), &counts.weight_quant_matmul,
          [&](auto* removed) { return fuse_weight_quant_matmuls(graph, preserve, removed); });
    apply("RmsNorm", rms_norm_fusion_requested(), &counts.rms_norm,
          [&](auto* removed) { return fuse_rms_norms(graph, preserve, removed); });
    apply("SwiGlu", swiglu_fusion_requested(), &counts.swiglu,
          [&](auto* removed) { return fuse_swiglus(graph, preserve, removed); });
    apply("attention", attention_fusion_requested(), &counts.attention,
          [&](auto* removed) { return fuse_attentions(graph, preserve, removed); });
    std::vector<std::string> tables;
    apply("RotaryPositionEmbedding", rope_fusion_requested(), &counts.rope,
          [&](auto* removed) { return fuse_ropes(graph, preserve, removed, &tables); });
    apply("rotary table", rope_fusion_requested() && counts.rope > 0, &counts.rope_tables,
          [&](auto* removed) { return dedup_rope_tables(graph, preserve, removed, tables); });
    apply("GeGlu", geglu_fusion_requested(), &counts.geglu,
          [&](auto* removed) { return fuse_geglus(graph, preserve, removed); });
    apply("Gelu", gelu_fusion_requested(), &counts.gelu,
          [&](auto* removed) { return fuse_gelus(graph, preserve, removed); });
    // 12b before 12: a training graph's LayerNorm (read by its gradient) with the gradient.
    apply("LayerNorm in training", layer_norm_training_fusion_requested(),
          &counts.layer_norm_training,
          [&](auto* removed) { return fuse_layer_norm_trainings(graph, preserve, removed); });
    apply("LayerNorm", layer_norm_fusion_requested(), &counts.layer_norm,
          [&](auto* removed) { return fuse_layer_norms(graph, preserve, removed); });
  }
  // After rewrite 13, which takes MatMuls without transposes only.
  apply("MatMul transpose", transpose_fold_requested(), &counts.matmul_transposes,
        [&](auto* removed) { return fold_matmul_transposes(graph, preserve, removed); });
  apply("training batch norm", training_fusion_requested(), &counts.training_batch_norm,
        [&](auto* removed) { return fuse_training_batch_norms(graph, preserve, removed); });
  // Under allow_mix_precision's graph pass after it instead (fold_bn_relu_grads), so that the
  // pass types the ReluGrad and the gradients as it does unfolded and the fold takes them in the
  // type they run in.
  apply("ReluGrad into batch norm",
        training_fusion_requested() && bn_relu_grad_fusion_requested() &&
            !mixed_precision_requested(),
        &counts.bn_relu_grad,
        [&](auto* removed) { return fuse_bn_relu_grads(graph, preserve, removed); });
  apply("BatchNormInference", true, &counts.batch_norm,
        [&](auto* removed) { return fuse_batch_norms(graph, preserve, removed); });
  // Before 2, which copies the convolution's padding attributes.
  apply("Pad into convolution", true, &counts.conv_pad,
        [&](auto* removed) { return absorb_conv_pads(graph, preserve, removed); });
  apply("Conv2DBatchNormInference", true, &counts.conv_batch_norm,
        [&](auto* removed) { return fuse_conv_batch_norms(graph, preserve, removed); });
  apply("residual add", true, &counts.conv_residual,
        [&](auto* removed) { return fuse_conv_residual_adds(graph, preserve, removed); });
  apply("fp16 hand-off", true, &counts.half_handoffs,
        [&](auto*) { return half_handoffs(graph, preserve); });
  apply("AddRelu", true, &counts.add_relu,
        [&](auto* removed) { return fuse_add_relus(graph, preserve, removed); });
  apply("bias epilogue", epilogue_fusion_requested(), &counts.bias_epilogue,
        [&](auto* removed) { return fuse_bias_epilogues(graph, preserve, removed); });
  // Before 4, which takes the steps it writes.
  apply("Lamb trust ratio", lamb_fusion_requested() && fused_elementwise_registered(), &counts.lamb,
        [&](auto* removed) { return lower_lamb_trust_ratios(graph, preserve, removed); });
  apply("FusedElementwise", fused_elementwise_registered(), &counts.elementwise,
        [&](auto* removed) { return fuse_elementwise_chains(graph, preserve, removed); });
  apply("FusedVariableUpdate",
        variable_update_fusion_requested() && fused_variable_update_registered(),
        &counts.variable_update,
        [&](auto* removed) { return fuse_variable_updates(graph, preserve, removed); });
  apply("duplicate node", true, &counts.deduplicated,
        [&](auto* removed) { return dedup_pure_nodes(graph, preserve, removed); });
  // After 6 (a scale's operands are then each one node) and before 5c, which folds the Casts
  // of the gradients the scales read, and 5b, which groups the updates of the same steps.
  apply("update scale", update_scale_fusion_requested() && fused_variable_update_registered(),
        &counts.update_scales,
        [&](auto* removed) { return fold_update_scales(graph, preserve, removed); });
  // After 6, which leaves one Cast per gradient (and one reader where the update is its only
  // one); before 5b, which groups updates of the same steps and input types.
  apply("update Cast", cast_fusion_requested() && fused_variable_update_registered(),
        &counts.update_casts,
        [&](auto* removed) { return fold_update_casts(graph, preserve, removed); });
  apply("multi-tensor update",
        multi_tensor_update_requested() && fused_variable_update_registered(),
        &counts.multi_tensor_update,
        [&](auto* removed) { return group_variable_updates(graph, preserve, removed); });
  // Last: the norms' readers are in their final nodes.
  apply("multi-tensor SquareSumV1", multi_square_sum_requested() && fused_ops_registered(),
        &counts.multi_square_sum,
        [&](auto* removed) { return group_square_sums(graph, preserve, removed); });
  return counts;
}

}  // namespace npusim::tf
