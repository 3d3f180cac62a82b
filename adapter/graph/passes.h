// The graph engine's fusion passes on the IR (graph.h), as CANN's graph engine applies them
// before building the task list. Each pass rewrites the last node of a matched chain in place
// (its name stays, so reports show the original node names), records the names of the nodes it
// absorbed in Node::fused and marks them dead. A node read by anything outside the chain, or a
// graph output, ends a chain. docs/graph_engine.md "Fusions" lists the patterns.
#pragma once

#include <string>
#include <vector>

#include "adapter/compiler/compiler.h"
#include "adapter/graph/graph.h"

namespace npusim::graph {

// One fusion applied, for the compile report.
struct FusionRecord {
  std::string pattern;  // e.g. "Conv2D+BiasAdd+Relu -> Conv2DBatchNormInference"
  std::string node;     // the fused node's name
  std::vector<std::string> absorbed;
};

// Pad (or PadV2 with a zero constant) along H and W only (constant, non-negative amounts), read
// only by a Conv2D or DepthwiseConv2dNative (NHWC, padding VALID) as its input: the
// convolution reads the Pad's input with padding EXPLICIT and the Pad's amounts (the window
// pads with zeros: the same values, one copy of the activation less). Run first.
std::vector<FusionRecord> absorb_conv_pads(Graph& g);

// Conv2D (NHWC, f32, constant filter) followed by per-channel constant affine ops (BiasAdd,
// AddV2/Add/Sub of a constant, Mul by a constant: grappler's leftovers of a Keras batch norm and
// the convolution's bias) and optionally Relu or Relu6 -> Conv2DBatchNormInference: the scales
// are folded into a new filter on the host at compile time (f32), the shift becomes the cube's
// bias, the Relu runs in FIXPIPE (Relu6: relu6, in the batch norm's vector pass).
std::vector<FusionRecord> fold_conv_epilogues(Graph& g);

// DepthwiseConv2dNative (NHWC, f32, constant filter) followed by the same affine ops (at least
// one) and optionally Relu or Relu6: the scales folded into the depthwise filter on the host
// (output channel c * M + q), the chain's last node becomes BatchNormInference(the convolution's
// output, shift as its offset, mean 0, variance 1, scale 1, epsilon 0; relu / relu6): one
// vector pass after the convolution instead of one per op (its fold an init task).
std::vector<FusionRecord> fold_depthwise_epilogues(Graph& g);

// A Conv2DBatchNormInference (or BatchNormInference: a depthwise convolution's, from
// fold_depthwise_epilogues) read only as the x of Conv2DBatchNormInference nodes hands
// its output over in fp16 (Tout = f16 there, Tx = f16 in the readers): the cube reads fp16
// anyway, so FIXPIPE's one rounding replaces a cast launch per reader, the same RNE rounding of
// the same f32 values. The record's `absorbed` lists the readers.
std::vector<FusionRecord> half_handoffs(Graph& g);

// Relu(AddV2(x, y)) with the sum read only by the Relu -> AddRelu.
std::vector<FusionRecord> fuse_add_relu(Graph& g);

// Maximal connected sets of element-wise steps of one float type (compiler::ops::
// fusible_elementwise), every node but the set's sink read only inside the set ->
// FusedElementwise (adapter/compiler/ops/fused_elementwise.h).
std::vector<FusionRecord> fuse_elementwise_chains(Graph& g);

// All of them, in that order; the fp16 hand-off only where fp32 cube operands are cast to fp16
// (not under kKeepFp32).
std::vector<FusionRecord> run_fusion_passes(Graph& g, compiler::PrecisionMode precision);

}  // namespace npusim::graph
