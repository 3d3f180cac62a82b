// The decoder-model ops, CANN's op types: their op definitions (TensorFlow has no such ops; no
// tf.raw_ops wrappers exist for them: Python calls them through npusim.llm, a graph rewrite may
// create them) and their NPU kernels, compiled by adapter/compiler/ops/ (attention.cpp,
// norm.cpp, rope.cpp, activation.cpp), which state the algorithms and numerics:
//
//   FlashAttentionScore(query: T, key: T, value: T) -> attention_out: T
//   PromptFlashAttention(query: T, key: T, value: T) -> attention_out: T
//     T in {half, bfloat16}; query [B, Sq, N, D], key and value [B, Skv, Nkv, D] (input_layout
//     "BSND", the only one supported), N a multiple of Nkv (grouped-query attention);
//     scale_value: float (default 1/sqrt(D) when 0); sparse_mode: int (0 no mask, 2 causal
//     left-up, 3 causal right-down); num_heads, num_key_value_heads: int (0: from the shapes).
//   IncreFlashAttention(query: T, key: T, value: T, actual_seq_lengths: Tlen) -> attention_out: T
//     one decode step: query [B, 1, N, D] against a KV cache [B, L, Nkv, D] of which the first
//     actual_seq_lengths[b] positions are valid (shape [], [1] or [B], Tlen int64, CANN's type, or
//     int32, which the graph rewrite feeds from the step's int32 index). Device memory: the
//     kernel reads each length, clamped to [1, L], so one compiled kernel serves every length.
//   SwiGlu(gate: T, up: T) -> y: T     T in {float, half, bfloat16}: silu(gate) * up, gate and up
//     of one shape (Llama's feed-forward; CANN's SwiGlu takes them as the two halves of one
//     tensor, here they are the two Dense outputs as the model computes them). Computed in f32
//     (adapter/compiler/ops/activation.cpp).
//   GeGlu(gate: T, up: T) -> y: T     T in {float, half, bfloat16}: gelu(gate) * up (Gemma's
//     feed-forward; CANN's GeGlu splits one tensor into the halves and also returns gelu(gate):
//     here the two Dense outputs, y only); approximate: int = 1, CANN's attribute: 1 the tanh
//     form, 0 the erf form.
//   Gelu(x: T) -> y: T     T in {float, half, bfloat16}: CANN's Gelu, the tanh form
//     0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))) (tf.nn.gelu(approximate=True));
//     approximate: int = 1 as GeGlu's (0: the erf form, tf.nn.gelu's default).
//   LayerNorm(x: T, gamma: Tgamma, beta: Tgamma) -> y: T     T in {float, half, bfloat16};
//     Tgamma T or float (the graph fusion sets T; allow_mix_precision's graph pass turns T to
//     half and keeps Tgamma float, as CANN's LayerNorm takes f32 gamma and beta); epsilon: float
//     = 1e-5: (x - mean) * rsqrt(variance + epsilon) * gamma + beta over the last axis, gamma
//     and beta [H] (ops/norm.cpp, in f32; CANN's also returns mean and variance).
//   LayerNormV3(x: T, gamma: Tgamma, beta: Tgamma) -> y: T, mean: float, rstd: float     T,
//     Tgamma, epsilon as
//     LayerNorm's: y as LayerNorm's, and each row's mean and rsqrt(variance + epsilon) in f32 of
//     x's shape with the last dimension 1 (CANN's LayerNormV3; the graph rewrite 12b's forward
//     in training, whose gradients read them).
//   LayerNormXBackpropV2(dy: T, x: T, rstd: float, mean: float, gamma: Tgamma) -> pd_x: T,
//     res_for_gamma: float     T, Tgamma as LayerNorm's: xhat = (x - mean) * rstd (output
//     res_for_gamma, f32) and pd_x = rstd * (g - mean(g) - xhat * mean(g * xhat)), g = dy *
//     gamma, means over the last axis (CANN's LayerNormXBackpropV2, which takes the variance
//     where this takes LayerNormV3's rstd).
//   LayerNormBetaGammaBackpropV2(dy: T, res_for_gamma: float) -> pd_gamma: float,
//     pd_beta: float     [H] sums over the rows of dy * res_for_gamma and of dy.
//   RmsNorm(x: T, gamma: T) -> y: T     T in {float, half, bfloat16}; epsilon: float = 1e-6:
//     x * rsqrt(mean(x^2 over the last axis) + epsilon) * gamma, gamma [H] (ops/norm.cpp).
//   RotaryPositionEmbedding(x: T, cos: T, sin: T) -> y: T     T in {float, half, bfloat16};
//     mode: int = 0 (rotate half, keras-hub's layout): x * cos + rotate_half(x) * sin, x BSND,
//     cos and sin [S, D] or [1, S, 1, D] (ops/rope.cpp).
//   WeightQuantBatchMatmulV2(x: T, weight: int8, antiquant_scale: T) -> y: T     T in {half,
//     bfloat16}: x [..., K] @ (weight [K, N] * antiquant_scale [N]) -> [..., N], the weight
//     dequantised on chip (ops/quant_matmul.cpp); transpose_x, transpose_weight: bool = false and
//     antiquant_group_size: int = 0 as CANN has them (only the defaults are supported). CANN's
//     optional inputs (antiquant_offset, quant_scale, quant_offset, bias) are not taken.
#include <vector>

#include "tensorflow/c/ops.h"

#include "adapter/tf/plugin/compiled_op_table.h"
#include "adapter/tf/plugin/graph_fusion.h"
#include "adapter/tf/plugin/kernel_families.h"
#include "adapter/tf/plugin/op_defs.h"

namespace npusim::tf {

namespace {
bool g_llm_ops_registered = false;

// WeightQuantBatchMatmulV2: y = x's shape with the last dim replaced by weight's last (N);
// unknown where a rank is.
void quant_matmul_shape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* x = TF_NewShapeHandle();
  TF_ShapeHandle* w = TF_NewShapeHandle();
  TF_ShapeHandle* lead = TF_NewShapeHandle();
  TF_ShapeHandle* n = TF_NewShapeHandle();
  TF_ShapeHandle* out = TF_NewShapeHandle();
  TF_ShapeInferenceContextGetInput(ctx, 0, x, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextGetInput(ctx, 1, w, status);
  const bool known = TF_GetCode(status) == TF_OK && TF_ShapeInferenceContextRankKnown(ctx, x) &&
                     TF_ShapeInferenceContextRankKnown(ctx, w) &&
                     TF_ShapeInferenceContextRank(ctx, x) >= 1 &&
                     TF_ShapeInferenceContextRank(ctx, w) == 2;
  if (known) {
    TF_ShapeInferenceContextSubshape(ctx, x, 0, -1, lead, status);
    if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextSubshape(ctx, w, 1, 2, n, status);
    if (TF_GetCode(status) == TF_OK)
      TF_ShapeInferenceContextConcatenateShapes(ctx, lead, n, out, status);
    if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextSetOutput(ctx, 0, out, status);
  } else if (TF_GetCode(status) == TF_OK) {
    TF_ShapeInferenceContextSetUnknownShape(ctx, status);
  }
  for (TF_ShapeHandle* h : {x, w, lead, n, out}) TF_DeleteShapeHandle(h);
}

// LayerNormV3: y of x's shape, mean and rstd of x's shape with the last dimension 1; unknown
// where x's rank is.
void layer_norm_v3_shape(TF_ShapeInferenceContext* ctx, TF_Status* status) {
  TF_ShapeHandle* x = TF_NewShapeHandle();
  TF_ShapeHandle* lead = TF_NewShapeHandle();
  TF_ShapeHandle* stats = TF_NewShapeHandle();
  TF_ShapeHandle* one = TF_ShapeInferenceContextVectorFromSize(ctx, 1);
  TF_ShapeInferenceContextGetInput(ctx, 0, x, status);
  if (TF_GetCode(status) == TF_OK) TF_ShapeInferenceContextSetOutput(ctx, 0, x, status);
  if (TF_GetCode(status) == TF_OK && TF_ShapeInferenceContextRankKnown(ctx, x) &&
      TF_ShapeInferenceContextRank(ctx, x) >= 1) {
    TF_ShapeInferenceContextSubshape(ctx, x, 0, -1, lead, status);
    if (TF_GetCode(status) == TF_OK)
      TF_ShapeInferenceContextConcatenateShapes(ctx, lead, one, stats, status);
    for (int o = 1; o < 3 && TF_GetCode(status) == TF_OK; ++o)
      TF_ShapeInferenceContextSetOutput(ctx, o, stats, status);
  } else if (TF_GetCode(status) == TF_OK) {
    TF_ShapeInferenceContextSetUnknownShape(ctx, status);
  }
  for (TF_ShapeHandle* h : {x, lead, stats, one}) TF_DeleteShapeHandle(h);
}

// LayerNormXBackpropV2: both outputs of dy's shape.
void x_backprop_shape(TF_ShapeInferenceContext* ctx, TF_Status* s) {
  channel_outputs(ctx, 0, 2, 2, s);
}
// LayerNormBetaGammaBackpropV2: [H], H dy's last dimension.
void beta_gamma_shape(TF_ShapeInferenceContext* ctx, TF_Status* s) {
  channel_outputs(ctx, 0, 0, 2, s);
}
}  // namespace

rt::Status register_llm_kernels(const std::vector<TableKernelDef>& compiler_ops) {
  const std::vector<const char*> attention_attrs = {
      "T: {half, bfloat16}", "scale_value: float = 0", "input_layout: string = 'BSND'",
      "num_heads: int = 0", "num_key_value_heads: int = 0"};
  std::vector<const char*> prompt_attrs = attention_attrs;
  prompt_attrs.push_back("sparse_mode: int = 0");
  std::vector<const char*> incre_attrs = attention_attrs;
  incre_attrs.push_back("Tlen: {int32, int64} = DT_INT64");
  const OpDefSpec defs[] = {
      {"FlashAttentionScore",
       {"query: T", "key: T", "value: T"},
       {"attention_out: T"},
       prompt_attrs,
       same_as_input0},
      {"PromptFlashAttention",
       {"query: T", "key: T", "value: T"},
       {"attention_out: T"},
       prompt_attrs,
       same_as_input0},
      {"IncreFlashAttention",
       {"query: T", "key: T", "value: T", "actual_seq_lengths: Tlen"},
       {"attention_out: T"},
       incre_attrs,
       same_as_input0},
      {"SwiGlu", {"gate: T", "up: T"}, {"y: T"}, {"T: {float, half, bfloat16}"}, same_as_input0},
      {"GeGlu",
       {"gate: T", "up: T"},
       {"y: T"},
       {"T: {float, half, bfloat16}", "approximate: int = 1"},
       same_as_input0},
      {"Gelu",
       {"x: T"},
       {"y: T"},
       {"T: {float, half, bfloat16}", "approximate: int = 1"},
       same_as_input0},
      {"LayerNorm",
       {"x: T", "gamma: Tgamma", "beta: Tgamma"},
       {"y: T"},
       {"T: {float, half, bfloat16}", "Tgamma: {float, half, bfloat16}", "epsilon: float = 1e-5"},
       same_as_input0},
      {"LayerNormV3",
       {"x: T", "gamma: Tgamma", "beta: Tgamma"},
       {"y: T", "mean: float", "rstd: float"},
       {"T: {float, half, bfloat16}", "Tgamma: {float, half, bfloat16}", "epsilon: float = 1e-5"},
       layer_norm_v3_shape},
      {"LayerNormXBackpropV2",
       {"dy: T", "x: T", "rstd: float", "mean: float", "gamma: Tgamma"},
       {"pd_x: T", "res_for_gamma: float"},
       {"T: {float, half, bfloat16}", "Tgamma: {float, half, bfloat16}"},
       x_backprop_shape},
      {"LayerNormBetaGammaBackpropV2",
       {"dy: T", "res_for_gamma: float"},
       {"pd_gamma: float", "pd_beta: float"},
       {"T: {float, half, bfloat16}"},
       beta_gamma_shape},
      {"RmsNorm",
       {"x: T", "gamma: T"},
       {"y: T"},
       {"T: {float, half, bfloat16}", "epsilon: float = 1e-6"},
       same_as_input0},
      {"RotaryPositionEmbedding",
       {"x: T", "cos: T", "sin: T"},
       {"y: T"},
       {"T: {float, half, bfloat16}", "mode: int = 0"},
       same_as_input0},
      {"WeightQuantBatchMatmulV2",
       {"x: T", "weight: int8", "antiquant_scale: T"},
       {"y: T"},
       {"T: {half, bfloat16}", "transpose_x: bool = false", "transpose_weight: bool = false",
        "antiquant_group_size: int = 0"},
       quant_matmul_shape},
  };
  for (const OpDefSpec& d : defs) {
    rt::Status st = register_op_def(d);
    if (!st.ok()) return st;
  }
  rt::Status st = rt::ok_status();
  for (const TableKernelDef& d : compiler_ops)
    if (st.ok()) st = register_compiled_op_kernel(d);
  g_llm_ops_registered = st.ok() && !compiler_ops.empty();
  return st;
}

bool llm_ops_registered() { return g_llm_ops_registered; }

}  // namespace npusim::tf
