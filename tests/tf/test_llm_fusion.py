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
  for RMSNorm with a second consumer of its mean square.

Tolerances: the fused attention runs fp32 graphs in fp16 (allow_fp32_to_fp16: q, k, v and the
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
             "ATTENTION": {"PromptFlashAttention", "IncreFlashAttention"}}

# Child: llama-tiny's greedy generation on the NPU (batch 2, prompt 8, 3 tokens: a prefill and
# two decode steps); the logits, the launches and the op types that launched.
GENERATE = r'''
import json, sys
sys.path.insert(0, %r)
import numpy as np
import npusim, tensorflow as tf
import models
from models import llm
npusim.configure(chip="tiny")
with tf.device("/NPU:0"):
    lm = models.build("llama-tiny", seed=0)
    npusim.clear_launch_records()
    tokens, logits = llm.GreedyDecoder(lm, 2, 8, 3).generate(
        llm.prompt_tokens("llama-tiny", 2, 8, seed=1), return_logits=True)
recs = npusim.launch_records()
types = {}
for r in recs:
    types[r["op_type"]] = types.get(r["op_type"], 0) + 1
print("RESULT" + json.dumps({"tokens": tokens.tolist(), "logits": logits.tolist(),
                             "launches": len(recs), "op_types": types}))
''' % ROOT


@pytest.fixture(scope="module")
def fused_run():
    return child_result(GENERATE, timeout=300)


@pytest.mark.parametrize("rewrite", sorted(FUSED_OPS))
def test_llama_tiny_generation_fused_vs_unfused(fused_run, rewrite):
    off = child_result(GENERATE, timeout=300, extra_env={f"NPUSIM_FUSION_{rewrite}": "0"})
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


@pytest.mark.parametrize("second_consumer", [False, True])
def test_rms_norm_pattern_fuses_only_when_exact(npusim, tf, second_consumer):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 64)).astype(np.float32)
    with tf.device("/NPU:0"):
        gamma = tf.Variable(rng.standard_normal(64).astype(np.float32))
    eps = 1e-5

    @tf.function
    def rms_norm(x):
        # keras-hub's LlamaLayerNorm.call for float32
        var = keras.ops.mean(keras.ops.power(x, 2), axis=-1, keepdims=True)
        y = x * keras.ops.rsqrt(var + eps) * gamma
        return (y, var) if second_consumer else (y,)

    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = rms_norm(tf.constant(x))[0].numpy()
    fused = _fused_launches(npusim, "RmsNorm")
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + eps) * gamma.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert fused == (0 if second_consumer else 1), fused
