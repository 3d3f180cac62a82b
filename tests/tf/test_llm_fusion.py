"""The decoder-model graph rewrites (adapter/tf/plugin/graph_fusion.h, rewrites 7-9): keras-hub's
RMSNorm, SwiGLU and attention subgraphs become CANN's fused ops (RmsNorm, SwiGlu,
PromptFlashAttention for the prefill's causal mask, IncreFlashAttention for a decode step's cache
mask).

- llama-tiny's greedy generation (prefill and decode steps) with every rewrite on against the
  same run with one rewrite off (NPUSIM_FUSION_RMS_NORM / _SWIGLU / _ATTENTION=0, child
  processes): the logits agree within the precision mode's tolerance (tests/tf/test_llm.py
  derives it: 2e-2 relative), the fused op runs only where its rewrite is on, and the run with
  the rewrite takes fewer launches. (test_llm.py checks the fused runs' tokens against the CPU's.)
- The attention pattern written out with keras ops (einsum, scale, keras' masked Softmax with a
  constant causal mask, einsum; grouped-query heads by repeat) fuses and matches a float64 numpy
  reference; with a second consumer of the scores it stays unfused and still matches. The same
  for RMSNorm (Llama's and Gemma's: 1 / sqrt and a scale of 1 + gamma) with a second consumer of
  its mean square.

- keras-hub's RotaryEmbedding applied to two tensors (a layer's queries and keys) at a start
  index given as a tensor (a decode step) and as 0 (a prefill) in f32 / f16 / bf16 against TF on
  the CPU: two RotaryPositionEmbedding launches and the tables computed once (one Cos, one
  Sin); with head_dim 8 (not a multiple of 16) or a second consumer of the rotated half it stays
  unfused.

Tolerances: RotaryPositionEmbedding computes in f32 and rounds once; TF on the CPU rounds each
step to the type (x cos, rotate_half(x) sin, their sum) and both round the tables to the type, so
they differ by a few half-ulps of the type times max|x| (4 ulps allowed), plus the f32 tables'
own error: their angles (the Einsum positions x inverse frequencies, k = 1) are f32's exact
products on both (ops/matmul.cpp: no fp16 operands under allow_fp32_to_fp16), and the NPU's
Cos and Sin agree with TF's within 5e-7 (tests/tf/test_kernels_decoder.py derives it): at most
2 * 5e-7 * max|x| apart after the rotation.
The fused attention runs fp32 graphs in fp16 (allow_fp32_to_fp16: q, k, v and the
probabilities rounded to fp16 as the unfused products' operands are, plus the output: a few
2^-11 relative), 5e-3 relative to the largest output; RMSNorm in f32, 1e-5.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pytest.importorskip("keras_hub")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import ROOT, child_result  # noqa: E402  pylint: disable=wrong-import-position

LOGITS_RTOL = 2e-2
FUSED_OPS = {"RMS_NORM": {"RmsNorm"}, "SWIGLU": {"SwiGlu"},
             "ATTENTION": {"PromptFlashAttention", "IncreFlashAttention"},
             "ROPE": {"RotaryPositionEmbedding"}, "GELU": {"Gelu"}, "GEGLU": {"GeGlu"},
             "LAYER_NORM": {"LayerNorm"}}
LLAMA_REWRITES = ("ATTENTION", "RMS_NORM", "ROPE", "SWIGLU")

# Child: a tiny decoder's greedy generation on the NPU (batch 2, prompt 8, 3 tokens: a prefill
# and two decode steps); the logits, the launches and the op types that launched.
GENERATE = r'''
import json, sys
sys.path.insert(0, %r)
import numpy as np
import npusim, tensorflow as tf
import models
from models import llm
name = %r
npusim.configure(chip="tiny")
with tf.device("/NPU:0"):
    lm = models.build(name, seed=0)
    npusim.clear_launch_records()
    tokens, logits = llm.GreedyDecoder(lm, 2, 8, 3).generate(
        llm.prompt_tokens(name, 2, 8, seed=1), return_logits=True)
recs = npusim.launch_records()
types = {}
for r in recs:
    types[r["op_type"]] = types.get(r["op_type"], 0) + 1
print("RESULT" + json.dumps({"tokens": tokens.tolist(), "logits": logits.tolist(),
                             "launches": len(recs), "op_types": types}))
'''

_FUSED_RUNS = {}


def _fused_run(model):
    """The model's generation with every rewrite on (once per module)."""
    if model not in _FUSED_RUNS:
        _FUSED_RUNS[model] = child_result(GENERATE % (ROOT, model), timeout=300)
    return _FUSED_RUNS[model]


@pytest.mark.parametrize("model,rewrite", [("llama-tiny", r) for r in LLAMA_REWRITES] + [
    # GPT-2's attention (keras' dot_product_attention: MHA, its causal mask) and Gemma's
    # (grouped einsums without a repeat, query pre-scaling); GPT-2's GELU, Gemma's GeGLU
    ("gpt2-tiny", "ATTENTION"), ("gemma-tiny", "ATTENTION"), ("gpt2-tiny", "GELU"),
    ("gemma-tiny", "GEGLU"), ("gpt2-tiny", "LAYER_NORM")])
def test_tiny_generation_fused_vs_unfused(model, rewrite):
    fused_run = _fused_run(model)
    off = child_result(GENERATE % (ROOT, model), timeout=300,
                       extra_env={f"NPUSIM_FUSION_{rewrite}": "0"})
    on_logits, off_logits = np.array(fused_run["logits"]), np.array(off["logits"])
    err = np.linalg.norm(on_logits - off_logits) / np.linalg.norm(off_logits)
    assert err < LOGITS_RTOL, f"{rewrite}: logits differ by {err:.2e} relative"
    for op in FUSED_OPS[rewrite]:
        assert fused_run["op_types"].get(op, 0) > 0, (op, fused_run["op_types"])
        assert op not in off["op_types"], (op, off["op_types"])
    assert fused_run["launches"] < off["launches"], (fused_run["launches"], off["launches"])


def _fused_launches(npusim, op):
    return sum(r["op_type"] == op for r in npusim.launch_records())


def _attention_reference(q, k, v, scale):
    """float64 causal attention with grouped-query heads, q [B, S, N, D], k, v [B, S, Nkv, D]."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    groups = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, groups, axis=2), np.repeat(v, groups, axis=2)
    s = np.einsum("bquh,bkuh->buqk", q, k) * scale
    seq = q.shape[1]
    s = np.where(np.tril(np.ones((seq, seq), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("buqk,bkuh->bquh", p, v)


@pytest.mark.parametrize("second_consumer", [False, True])
def test_attention_pattern_fuses_only_when_exact(npusim, tf, second_consumer):
    batch, seq, heads, kv_heads, dim = 2, 8, 4, 2, 16
    rng = np.random.default_rng(0)
    q = rng.standard_normal((batch, seq, heads, dim)).astype(np.float32)
    k = rng.standard_normal((batch, seq, kv_heads, dim)).astype(np.float32)
    v = rng.standard_normal((batch, seq, kv_heads, dim)).astype(np.float32)
    mask = np.tril(np.ones((seq, seq), bool))[None, None].repeat(batch, 0)
    scale = 1.0 / np.sqrt(dim)
    softmax = keras.layers.Softmax(axis=-1)

    @tf.function
    def attention(q, k, v):
        # keras-hub's LlamaAttention._compute_attention, with the cache's causal mask
        k2 = keras.ops.repeat(k, heads // kv_heads, axis=2)
        v2 = keras.ops.repeat(v, heads // kv_heads, axis=2)
        scores = keras.ops.multiply(keras.ops.einsum("bquh,bkuh->buqk", q, k2),
                                    keras.ops.cast(scale, "float32"))
        probs = softmax(scores, tf.constant(mask))
        out = keras.ops.einsum("buqk,bkuh->bquh", probs, v2)
        return (out, scores) if second_consumer else (out,)

    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = attention(tf.constant(q), tf.constant(k), tf.constant(v))[0].numpy()
    fused = _fused_launches(npusim, "PromptFlashAttention")
    want = _attention_reference(q, k, v, scale)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 5e-3, err
    assert fused == (0 if second_consumer else 1), fused


ATTENTION_RTOL = {"float32": 5e-3, "bfloat16": 2e-2}


def _attention_inputs(dtype, heads, kv_heads, seq=8, dim=16, batch=2):
    """q, k, v in `dtype`'s values (float32 arrays), a causal mask [B, Sq, L]."""
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((batch, seq, h, dim)).astype(np.float32)
               for h in (heads, kv_heads, kv_heads))
    if dtype == "bfloat16":  # the reference sees the values the model's type holds
        q, k, v = (keras.ops.convert_to_numpy(keras.ops.cast(keras.ops.cast(a, dtype),
                                                             "float32")) for a in (q, k, v))
    mask = np.tril(np.ones((seq, seq), bool))[None].repeat(batch, 0)
    return q, k, v, mask


@pytest.mark.parametrize("second_consumer", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dot_product_attention_pattern_fuses_only_when_exact(npusim, tf, dtype,
                                                             second_consumer):
    """GPT-2's attention: keras' ops.dot_product_attention as its TensorFlow backend computes it
    (MultiHeadAttention without dropout), written out so the scores can have a second reader."""
    heads, dim = 4, 16
    q, k, v, mask = _attention_inputs(dtype, heads, heads, dim=dim)
    scale = 1.0 / np.sqrt(dim)

    @tf.function
    def attention(q, k, v):
        q, k, v = (tf.cast(a, dtype) for a in (q, k, v))
        if not second_consumer:
            return (keras.ops.dot_product_attention(q, k, v, mask=tf.constant(mask)[:, None],
                                                    scale=scale),)
        # keras.src.backend.tensorflow.nn._dot_product_attention_xla
        logits = tf.cast(tf.einsum("BTNH,BSNH->BNTS", q, k), "float32") * scale
        logits = tf.where(tf.constant(mask)[:, None], logits, -0.7 * 3.38953e38)
        probs = tf.cast(tf.nn.softmax(logits, axis=-1), dtype)
        return tf.einsum("BNTS,BSNH->BTNH", probs, v), logits

    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = tf.cast(attention(tf.constant(q), tf.constant(k), tf.constant(v))[0],
                      "float32").numpy()
    fused = _fused_launches(npusim, "PromptFlashAttention")
    want = _attention_reference(q, k, v, scale)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < ATTENTION_RTOL[dtype], err
    assert fused == (0 if second_consumer else 1), fused


@pytest.mark.parametrize("second_consumer", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_grouped_attention_pattern_fuses_only_when_exact(npusim, tf, dtype, second_consumer):
    """Gemma's attention (keras-hub's CachedGemmaAttention._compute_attention): the queries
    pre-scaled, einsums over [B, T, K, G, H] grouped heads (no repeat of K and V), keras' masked
    Softmax in f32; with a second reader of the logits it stays unfused."""
    heads, kv_heads, dim = 4, 2, 16
    q, k, v, mask = _attention_inputs(dtype, heads, kv_heads, dim=dim)
    scale = 1.0 / np.sqrt(dim)
    softmax = keras.layers.Softmax(dtype="float32")

    @tf.function
    def attention(q, k, v):
        q, k, v = (keras.ops.cast(a, dtype) for a in (q, k, v))
        q = q * keras.ops.cast(scale, dtype)
        b, t = q.shape[0], q.shape[1]
        q = keras.ops.reshape(q, (b, t, kv_heads, heads // kv_heads, dim))
        logits = keras.ops.einsum("btkgh,bskh->bkgts", q, k)
        probs = keras.ops.cast(softmax(logits, mask=tf.constant(mask)[:, None, None]), dtype)
        out = keras.ops.reshape(keras.ops.einsum("bkgts,bskh->btkgh", probs, v),
                                (b, t, heads, dim))
        return (out, logits) if second_consumer else (out,)

    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = keras.ops.convert_to_numpy(keras.ops.cast(
            attention(tf.constant(q), tf.constant(k), tf.constant(v))[0], "float32"))
    fused = _fused_launches(npusim, "PromptFlashAttention")
    want = _attention_reference(q, k, v, scale)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < ATTENTION_RTOL[dtype], err
    assert fused == (0 if second_consumer else 1), fused


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", ["layer", "second_consumer", "not_last_axis", "width_24"])
def test_layer_norm_fuses_only_when_exact(npusim, tf, dtype, case):
    """keras' LayerNormalization (GPT-2's) against TF on the CPU: one LayerNorm launch, within 2
    ulps of the type times the largest output (f32: 1e-6 relative; the fused kernel computes in
    f32 and rounds once, keras computes in f32 for f16 / bf16 too). Its mean also read outside
    the chain, a normalisation over another axis, or rows of 24 (the kernel takes multiples of
    16) stay unfused."""
    rng = np.random.default_rng(8)
    x = rng.normal(0.5, 2, (2, 5, 24 if case == "width_24" else 64)).astype(np.float32)
    axis = 1 if case == "not_last_axis" else -1
    layer = keras.layers.LayerNormalization(axis=axis, epsilon=1e-5, dtype=dtype)
    with tf.device("/NPU:0"):
        layer.build(x.shape)
        layer.gamma.assign(rng.uniform(0.5, 1.5, layer.gamma.shape).astype(np.float32))
        layer.beta.assign(rng.uniform(-0.5, 0.5, layer.beta.shape).astype(np.float32))

    @tf.function
    def norm(v):
        v = keras.ops.cast(v, dtype)
        if case != "second_consumer":
            return (layer(v),)
        # keras' LayerNormalization.call written out (f32 inside), its mean also returned
        v32 = keras.ops.cast(v, "float32")
        mean, var = tf.nn.moments(v32, axes=[-1], keepdims=True)
        inv = tf.math.rsqrt(var + 1e-5) * keras.ops.cast(layer.gamma, "float32")
        y = v32 * inv + (-mean * inv + keras.ops.cast(layer.beta, "float32"))
        return keras.ops.cast(y, dtype), mean

    with tf.device("/CPU:0"):
        want = keras.ops.convert_to_numpy(keras.ops.cast(norm(tf.constant(x))[0], "float32"))
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = keras.ops.convert_to_numpy(keras.ops.cast(norm(tf.constant(x))[0], "float32"))
    ulp = {"float32": 1e-6 / 2, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}[dtype]
    err = np.abs(got.astype(np.float64) - want).max()
    assert err <= 2 * ulp * np.abs(want).max(), err
    assert _fused_launches(npusim, "LayerNorm") == (1 if case == "layer" else 0), \
        [r["op_type"] for r in npusim.launch_records()]


GELU_ULP = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", ["gelu", "geglu", "gelu_beside_tanh", "geglu_broadcast_up",
                                  "geglu_gelu_read_twice"])
def test_gelu_patterns_fuse_only_when_exact(npusim, tf, dtype, case):
    """keras' gelu(approximate=True) (tf.nn.gelu's tanh form: GPT-2's feed-forward) and Gemma's
    GeGLU, gelu(x @ w_gate) * (x @ w_up), against TF on the CPU: one Gelu / GeGlu launch. The
    fused kernels compute in f32 and round once, TF rounds every step to the type: within a few
    ulps of the type times the largest output (f32: the tanh's own error, 1e-6). An `up` of
    another shape (broadcast), or a gelu read elsewhere too, is no GeGlu (the gelu alone becomes
    a Gelu); a second reader of an inner node: the test below."""
    rng = np.random.default_rng(6)
    x = rng.uniform(-4, 4, (2, 3, 64)).astype(np.float32)
    with tf.device("/NPU:0"):
        w_gate = tf.Variable(rng.uniform(-0.5, 0.5, (64, 128)).astype(np.float32))
        w_up = tf.Variable(rng.uniform(-0.5, 0.5, (64, 1 if "broadcast" in case else 128))
                           .astype(np.float32))

    @tf.function
    def ffn(x):
        x = keras.ops.cast(x, dtype)
        if case.startswith("gelu"):
            y = keras.activations.gelu(x, approximate=True)
            if case == "gelu_beside_tanh":  # another Tanh of x, outside the chain: fused
                return y, keras.ops.tanh(x) * 2.0
            return (y,)
        gate = keras.ops.matmul(x, keras.ops.cast(w_gate, dtype))
        up = keras.ops.matmul(x, keras.ops.cast(w_up, dtype))
        gelu = keras.activations.gelu(gate, approximate=True)
        if case == "geglu_gelu_read_twice":  # the gelu also an output: a Gelu, no GeGlu
            return gelu * up, gelu
        return (gelu * up,)

    with tf.device("/CPU:0"):
        want = [w.numpy().astype(np.float64) for w in ffn(tf.constant(x))]
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = [g.numpy().astype(np.float64) for g in ffn(tf.constant(x))]
    # matmuls (geglu): the operands rounded to fp16 under allow_fp32_to_fp16 on the NPU
    ulps = 4 if case.startswith("gelu") else {"float32": 2 ** 14, "float16": 8,
                                               "bfloat16": 4}[dtype]
    tol = max(ulps * GELU_ULP[dtype], 1e-6) * np.abs(want[0]).max()
    assert np.abs(got[0] - want[0]).max() <= tol, (np.abs(got[0] - want[0]).max(), tol)
    expected = {"gelu": (1, 0), "geglu": (0, 1), "gelu_beside_tanh": (1, 0),
                "geglu_broadcast_up": (1, 0), "geglu_gelu_read_twice": (1, 0)}[case]
    got_ops = (_fused_launches(npusim, "Gelu"), _fused_launches(npusim, "GeGlu"))
    assert got_ops == expected, [r["op_type"] for r in npusim.launch_records()]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_gelu_chain_with_outside_reader_stays_unfused(npusim, tf, dtype):
    """tf.nn.gelu's inner tanh also read outside the chain: no Gelu."""
    rng = np.random.default_rng(7)
    x = rng.uniform(-4, 4, (4, 64)).astype(np.float32)

    @tf.function
    def f(x):
        x = tf.cast(x, dtype)
        inner = tf.tanh(0.7978845608028654 * (x + tf.cast(0.044715, dtype) * tf.pow(x, 3)))
        return 0.5 * x * (1.0 + inner), inner

    with tf.device("/CPU:0"):
        want = [w.numpy().astype(np.float64) for w in f(tf.constant(x))]
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = [g.numpy().astype(np.float64) for g in f(tf.constant(x))]
    for g, w in zip(got, want):
        assert np.abs(g - w).max() <= 4 * GELU_ULP[dtype] * max(np.abs(w).max(), 1) + 1e-6
    assert _fused_launches(npusim, "Gelu") == 0


@pytest.mark.parametrize("second_consumer,width", [(False, 64), (True, 64), (False, 24)])
@pytest.mark.parametrize("variant", ["llama", "gemma"])
def test_rms_norm_pattern_fuses_only_when_exact(npusim, tf, second_consumer, width, variant):
    """Fused only where exact and where the kernel takes the rows (a width that is a multiple
    of 16, ops/norm.cpp): rows of 24 stay unfused and are computed right."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, width)).astype(np.float32)
    with tf.device("/NPU:0"):
        gamma = tf.Variable(rng.standard_normal(width).astype(np.float32))
    eps = 1e-5

    @tf.function
    def rms_norm(x):
        if variant == "llama":  # keras-hub's LlamaLayerNorm.call for float32
            var = keras.ops.mean(keras.ops.power(x, 2), axis=-1, keepdims=True)
            y = x * keras.ops.rsqrt(var + eps) * gamma
        else:  # keras-hub's Gemma RMSNormalization.call: 1 / sqrt, a scale of (1 + gamma)
            var = keras.ops.mean(keras.ops.square(x), axis=-1, keepdims=True)
            y = x * keras.ops.reciprocal(keras.ops.sqrt(var + eps)) * (1 + gamma)
        return (y, var) if second_consumer else (y,)

    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = rms_norm(tf.constant(x))[0].numpy()
    fused = _fused_launches(npusim, "RmsNorm")
    x64 = x.astype(np.float64)
    scale = gamma.numpy() + (1.0 if variant == "gemma" else 0.0)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps) * scale
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert fused == (0 if second_consumer or width % 16 else 1), fused


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gemma_rms_norm_layer_fuses(npusim, tf, dtype):
    """keras-hub's Gemma RMSNormalization layer (f32 inside, scale 1 + w) in the model's type
    against TF on the CPU: one RmsNorm launch, within 2 ulps of the type (the fused op rounds
    1 + w to the type once, and its result once; f32: 1e-5 relative)."""
    # pylint: disable-next=import-outside-toplevel
    from keras_hub.src.models.gemma.rms_normalization import RMSNormalization

    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 64)).astype(np.float32)
    with tf.device("/NPU:0"):
        layer = RMSNormalization(dtype=dtype)
        layer.build(x.shape)
        layer.scale.assign(rng.uniform(-0.5, 0.5, 64).astype(np.float32).astype(dtype))
    norm = tf.function(lambda v: layer(keras.ops.cast(v, dtype)))
    with tf.device("/CPU:0"):
        want = norm(tf.constant(x)).numpy().astype(np.float64)
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = norm(tf.constant(x)).numpy().astype(np.float64)
    ulp = {"float32": 1e-5 / 2, "float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}[dtype]
    assert np.abs(got - want).max() <= 2 * ulp * np.abs(want).max()
    assert _fused_launches(npusim, "RmsNorm") == 1


ROPE_ULP = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}


def _rotate_half_pattern(tensor, cos, sin):
    """keras-hub's RotaryEmbedding._apply_rotary_pos_emb written out, with the rotated half also
    returned (a second consumer: the rewrite must leave it)."""
    x1, x2 = keras.ops.split(tensor, 2, axis=-1)
    half = keras.ops.reshape(keras.ops.stack((-x2, x1), axis=-2), keras.ops.shape(tensor))
    return tensor * cos + half * sin, half


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("case", ["decode", "late_decode", "prefill", "head_dim_8",
                                  "second_consumer"])
def test_rope_pattern_fuses_only_when_exact(npusim, tf, dtype, case):
    from keras_hub.layers import RotaryEmbedding  # pylint: disable=import-outside-toplevel

    dim = 8 if case == "head_dim_8" else 32
    seq = 1 if case.endswith("decode") else 6
    # late_decode: position 8191, where fp16 operands of the tables' product (up to 8191 *
    # 2^-11 = 4 rad off) would turn the pairs by radians
    start = {"decode": 5, "late_decode": 8191}.get(case, 0)
    rng = np.random.default_rng(3)
    q = rng.uniform(-2, 2, (2, seq, 4, dim)).astype(np.float32)
    k = rng.uniform(-2, 2, (2, seq, 2, dim)).astype(np.float32)
    rope_q = RotaryEmbedding(max_wavelength=10000, dtype=dtype)
    rope_k = RotaryEmbedding(max_wavelength=10000, dtype=dtype)

    @tf.function
    def apply(q, k, index):
        # keras-hub's attention: one rotary layer call for the queries, one for the keys
        q, k = keras.ops.cast(q, dtype), keras.ops.cast(k, dtype)
        start_index = index if case.endswith("decode") else 0
        if case == "second_consumer":
            # pylint: disable-next=protected-access
            cos, sin = rope_q._compute_cos_sin_embedding(q, start_index)
            out, half = _rotate_half_pattern(q, cos, sin)
            return out, rope_k(k, start_index=start_index), half
        return rope_q(q, start_index=start_index), rope_k(k, start_index=start_index)

    args = (tf.constant(q), tf.constant(k), tf.constant(start, tf.int32))
    with tf.device("/CPU:0"):
        want = [w.numpy().astype(np.float64) for w in apply(*args)]
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = [g.numpy().astype(np.float64) for g in apply(*args)]
    # the module docstring's tolerance: the type's rounding plus the f32 tables' Cos / Sin
    tables = 2 * 5e-7 * 2  # |x| <= 2
    for g, w in zip(got, want):
        tol = 4 * ROPE_ULP[dtype] * np.abs(w).max() + tables
        assert np.abs(g - w).max() <= tol, (np.abs(g - w).max(), tol)
    fused = _fused_launches(npusim, "RotaryPositionEmbedding")
    expected = {"decode": 2, "late_decode": 2, "prefill": 2, "head_dim_8": 0,
                "second_consumer": 1}[case]
    assert fused == expected, fused
    if case.endswith("decode"):  # the tables (from the index: not constant) computed once
        assert [_fused_launches(npusim, op) for op in ("Cos", "Sin")] == [1, 1], \
            [r["op_type"] for r in npusim.launch_records()]
