// CANN's automatic mixed precision (precision_mode allow_mix_precision, precision_mode_v2
// mixed_float16) as a graph pass on NPU graphs, run by the plugin's grappler optimizer
// (graph_optimizer.cpp) after the fusions of graph_fusion.h and before the NpuGraph clustering
// (npu_graph.h).
//
// CANN decides per op type from the precision_reduce flag of its ops-info json
// (opp/built-in/op_impl/ai_core/tbe/config/<soc>/aic-<soc>-ops-info.json; documented in CANN's
// "--modify_mixlist" page, hiascend.com .../atctool/atlasatcparam_16_0071.html, and the TF
// adapter's "Modifying the Blocklist, Trustlist, and Graylist for Mixed Precision",
// .../TensorFlowCommercial/800/migration/tfmigr1/tfmigr1_000044.html):
//   true  (trustlist): a float32 op is reduced to float16;
//   false (blocklist): it stays float32;
//   unset (graylist):  it follows its upstream op: reduced where the op before it was.
// The built-in lists are the table in mixed_precision.cpp (TensorFlow op types, with the CANN
// op each stands for); a user's json in CANN's format modifies them
// (npusim.configure(modify_mixlist=...) / NPUSIM_MODIFY_MIXLIST):
//   {"black-list": {"to-add": [ops], "to-remove": [ops]},
//    "white-list": {"to-add": [ops], "to-remove": [ops]}}
// to-add moves an op onto that list (off the other), to-remove moves an op of that list to the
// graylist (an op not on it is an error, as CANN asks it to be there).
//
// The pass (apply_mixed_precision) on a graph's NPU nodes, in topological order:
//   - a node runs in float16 when its type attribute T is float, it is not a node TensorFlow
//     must preserve (its outputs keep their type), the NPU has a kernel for it with T = half
//     (TensorFlow's kernel registry: ops without one stay float32), and
//       trustlist: always;
//       graylist:  at least one of its T-typed inputs comes from a node running in float16 and
//                  none from a blocklisted node;
//       blocklist, and ops without T: never;
//     so its T flips to half. Batch norm keeps its statistics float32: CANN's BNTraining* ops
//     and FusedBatchNorm* take x / dy in T and the per-channel tensors in float (U).
//   - Every edge whose producer's output type then differs from the type its consumer reads
//     gets a Cast, one per (tensor, target type), named "<producer>/npusim_amp_<port>_<type>",
//     on the producer's device when that is the NPU (else the consumer's). Variables stay
//     float32: a ReadVariableOp is not flipped, its value is cast for float16 readers, and the
//     optimizer's updates (blocklisted) read float32 gradients.
//   - The fused inference convolutions (Conv2DBatchNormInference,
//     DepthwiseConv2dBatchNormInference) are on their product's list and turn float16 through
//     Tx and Tout (x and y), T (filter, batch norm) staying float32.
//   - A Conv2DBiasAdd / MatMulBiasAdd (graph_fusion.h rewrite 3b; on the list of its product,
//     Conv2D / MatMul) turns float16 whole through T, its bias staying float32 (Tbias: the
//     bias is added to the f32 sum before C's one rounding, as CANN's Conv2D and MatMulV2 with
//     a bias do under mixed precision); both have a float16 kernel in the compiler's op table
//     (without one the node would stay float32, as any other).
// Graphs with a cycle (while loops) are left as they are.
//
// NPUSIM_MIX_PRECISION_GRAPH=0 turns the pass off: allow_mix_precision then only changes how
// fp32 cube ops round (compiler.h), the behaviour before this pass (and that of eager ops,
// which never pass through grappler).
#pragma once

#include <functional>
#include <set>
#include <string>
#include <unordered_set>

namespace tensorflow {
class GraphDef;
class NodeDef;
}  // namespace tensorflow
namespace npusim::rt {
class Status;
}

namespace npusim::tf {

// TensorFlow op types on CANN's lists; every other op is on the graylist.
struct MixLists {
  std::set<std::string> trust;  // precision_reduce true: reduced to float16
  std::set<std::string> block;  // precision_reduce false: stays float32
};

// The built-in lists (mixed_precision.cpp's table).
const MixLists& builtin_mix_lists();

// The built-in lists modified by the json file at `path` (CANN's modify_mixlist format, top of
// file); an empty path gives the built-in lists. invalid_argument naming the file and the key
// (e.g. "black-list.to-add[2]") for a file that does not read or parse, an unknown key, a value
// that is not a list of op type names, or a to-remove of an op not on that list.
rt::Status load_mix_lists(const std::string& path, MixLists* out);

struct MixedPrecisionCounts {
  int half_nodes = 0;      // nodes turned to float16
  int casts = 0;           // Cast nodes inserted
  int folded_consts = 0;   // float32 Consts read in float16: a float16 Const instead of a Cast
  int no_half_kernel = 0;  // trust- or graylisted nodes left float32: no float16 NPU kernel
  int total() const { return half_nodes + casts + folded_consts; }
};

// Whether the pass applies: the device's precision mode (opened, else the environment's) is
// allow_mix_precision and NPUSIM_MIX_PRECISION_GRAPH is not "0".
bool mixed_precision_requested();
// The lists the device was opened with (its NPUSIM_MODIFY_MIXLIST applied), else the
// environment's; the built-in lists if that file does not load (the device's open reports it).
MixLists mixed_precision_lists();

// Applies the pass to `graph` (top of file). `has_half_kernel(node)` says whether the NPU has a
// kernel for `node` with its T = half.
MixedPrecisionCounts apply_mixed_precision(
    tensorflow::GraphDef& graph, const std::unordered_set<std::string>& preserve,
    const MixLists& lists, const std::function<bool(const tensorflow::NodeDef&)>& has_half_kernel);

// The first data edge of `graph` whose producer's output type (from the op registry) is not the
// type its consumer's op definition reads there, as "node 'c' (Op) input k: bool from 'p',
// float expected"; empty if none. TensorFlow checks every edge so when it rebuilds a function's
// graph from the optimizer's output, and runs the unoptimized graph if one fails. Nodes of ops
// the registry does not know (function calls) are not checked, nor the edges from them.
std::string first_type_error(const tensorflow::GraphDef& graph);

}  // namespace npusim::tf
