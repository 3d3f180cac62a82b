"""The decoder-model ops (npusim.llm: RmsNorm, LayerNorm, SwiGlu, GeGlu, Gelu,
FlashAttentionScore / PromptFlashAttention, IncreFlashAttention) on /NPU:0 against TensorFlow on
the CPU computing the same formulas the way keras-hub's layers do (in float32, rounded once to the
op's type).

Tolerances: RmsNorm, LayerNorm, SwiGlu, GeGlu and Gelu are computed in f32 on the chip and
rounded once, so they differ from the CPU's f32 result by the f32 differences (summation order,
vrsqrt / vexp: ~1e-6 relative) plus one rounding of the type (half an ulp: 2^-11 for f16, 2^-8
for bf16) on each side. Attention rounds the probabilities to the input type before the product
with V (docs/compiler.md), |error| <= 2^-11 (f16) / 2^-8 (bf16) times max|v| more."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from conftest import chip_config  # noqa: E402
from test_kernels import BF16, FLOAT_TYPES, _random  # noqa: E402

ULP_HALF = {np.dtype(np.float32): 2.0 ** -24, np.dtype(np.float16): 2.0 ** -11,
            np.dtype(BF16): 2.0 ** -8}


@pytest.fixture(name="llm")
def _llm(npusim):  # pylint: disable=unused-argument
    import npusim.llm as module  # pylint: disable=import-outside-toplevel

    return module


def _npu(npusim, tf, fn, *arrays):
    """fn on /NPU:0 (eagerly and as a tf.function: both paths build the op); the eager result
    as numpy, checked equal to the graph's, and the kernels launched."""
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        tensors = [tf.constant(a) for a in arrays]
        eager = fn(*tensors)
        graph = tf.function(fn)(*tensors)
    assert eager.device.endswith("device:NPU:0"), eager.device
    np.testing.assert_array_equal(eager.numpy(), graph.numpy())
    records = npusim.launch_records()
    assert records and all(r["ok"] for r in records), records
    return eager.numpy(), [r["kernel"] for r in records]


def _refused_as_mix_kernel(tf, fn, *arrays):
    """Fused attention is a mix kernel, a cube core and its vector cores (ops/attention.cpp):
    on a coupled chip (the 910, 310P) the compiler refuses it with that reason. Checks the
    refusal there and returns True; False on a split chip."""
    if chip_config()["organisation"] != "coupled":
        return False
    with pytest.raises(tf.errors.UnimplementedError, match="mix kernel.*this chip is coupled"):
        with tf.device("/NPU:0"):
            fn(*[tf.constant(a) for a in arrays]).numpy()
    return True


def _cpu(tf, fn, *arrays):
    with tf.device("/CPU:0"):
        return fn(*[tf.constant(a) for a in arrays]).numpy()


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", [(3, 5, 96), (2, 3, 2048)], ids=["short", "long_rows"])
def test_rms_norm(npusim, tf, strict_placement, llm, dtype, shape):
    # long rows: Llama 3.2 1B's hidden size; fewer than 8 rows fit the UB at a time, and a row
    # is more than 255 blocks of f32 lanes (the gamma product goes row by row)
    x = _random(shape, dtype, 1, -3, 3)
    gamma = _random(shape[-1:], dtype, 2, 0.5, 1.5)

    def reference(v, g):  # keras-hub LlamaLayerNorm
        v32 = tf.cast(v, tf.float32)
        var = tf.reduce_mean(tf.square(v32), axis=-1, keepdims=True)
        return tf.cast(v32 * tf.math.rsqrt(var + 1e-5) * tf.cast(g, tf.float32), v.dtype)

    got, kernels = _npu(npusim, tf, lambda v, g: llm.rms_norm(v, g, epsilon=1e-5), x, gamma)
    want = _cpu(tf, reference, x, gamma)
    assert any(k.startswith("RmsNorm") for k in kernels), kernels
    u = ULP_HALF[np.dtype(dtype)]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol=2 * u + 1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", [(3, 5, 96), (2, 3, 2048)], ids=["short", "long_rows"])
def test_layer_norm(npusim, tf, strict_placement, llm, dtype, shape):
    x = _random(shape, dtype, 5, -2, 4)  # off-centre: the mean matters
    gamma = _random(shape[-1:], dtype, 6, 0.5, 1.5)
    beta = _random(shape[-1:], dtype, 7, -0.5, 0.5)

    def reference(v, g, b):  # keras' LayerNormalization, in f32, rounded once
        v32 = tf.cast(v, tf.float32)
        mean, var = tf.nn.moments(v32, axes=[-1], keepdims=True)
        y = (v32 - mean) * tf.math.rsqrt(var + 1e-5) * tf.cast(g, tf.float32)
        return tf.cast(y + tf.cast(b, tf.float32), v.dtype)

    got, kernels = _npu(npusim, tf, lambda v, g, b: llm.layer_norm(v, g, b, epsilon=1e-5), x,
                        gamma, beta)
    want = _cpu(tf, reference, x, gamma, beta)
    assert any(k.startswith("LayerNorm") for k in kernels), kernels
    u = ULP_HALF[np.dtype(dtype)]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol=2 * u + 1e-5, atol=2 * u * np.abs(want).max() + 1e-6)


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("approximate", [1, 0])
def test_geglu_and_gelu(npusim, tf, strict_placement, llm, dtype, approximate):
    gate = _random((4, 7, 64), dtype, 8, -6, 6)
    up = _random((4, 7, 64), dtype, 9, -2, 2)

    def reference(g, u):  # gelu(gate) * up in f32, rounded once
        g32 = tf.cast(g, tf.float32)
        return tf.cast(tf.nn.gelu(g32, approximate=bool(approximate)) * tf.cast(u, tf.float32),
                       g.dtype)

    got, kernels = _npu(npusim, tf, lambda g, u: llm.geglu(g, u, approximate), gate, up)
    want = _cpu(tf, reference, gate, up)
    assert any(k.startswith("GeGlu") for k in kernels), kernels
    u = ULP_HALF[np.dtype(dtype)]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol=2 * u + 1e-5, atol=1e-5)
    got, kernels = _npu(npusim, tf, lambda g: llm.gelu(g, approximate), gate)
    want = _cpu(tf, lambda g: tf.cast(tf.nn.gelu(tf.cast(g, tf.float32),
                                                 approximate=bool(approximate)), g.dtype), gate)
    assert any(k.startswith("Gelu") for k in kernels), kernels
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol=2 * u + 1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=lambda t: np.dtype(t).name)
def test_swiglu(npusim, tf, strict_placement, llm, dtype):
    gate = _random((4, 7, 64), dtype, 3, -6, 6)
    up = _random((4, 7, 64), dtype, 4, -2, 2)

    def reference(g, u):  # silu(gate) * up in f32, rounded once
        g32 = tf.cast(g, tf.float32)
        return tf.cast(tf.nn.silu(g32) * tf.cast(u, tf.float32), g.dtype)

    got, kernels = _npu(npusim, tf, llm.swiglu, gate, up)
    want = _cpu(tf, reference, gate, up)
    assert any(k.startswith("SwiGlu") for k in kernels), kernels
    u = ULP_HALF[np.dtype(dtype)]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol=2 * u + 1e-5, atol=1e-6)


def _attention_reference(tf, q, k, v, causal_offset=None, kv_len=None):
    """softmax(q k^T / sqrt(D) + mask) v in f32 on the CPU as keras' MultiHeadAttention
    computes it (einsum, softmax, einsum), KV heads repeated for grouped-query attention;
    keys < kv_len only; causal: query i sees keys <= i + causal_offset."""
    def fn(qt, kt, vt):
        q32, k32, v32 = (tf.cast(t, tf.float32) for t in (qt, kt, vt))
        group = q32.shape[2] // k32.shape[2]
        k32 = tf.repeat(k32, group, axis=2)
        v32 = tf.repeat(v32, group, axis=2)
        if kv_len is not None:
            k32, v32 = k32[:, :kv_len], v32[:, :kv_len]
        s = tf.einsum("bqnd,bknd->bnqk", q32, k32) / np.sqrt(q32.shape[-1])
        if causal_offset is not None:
            i = tf.range(s.shape[2])[:, None]
            j = tf.range(s.shape[3])[None, :]
            s = tf.where(j <= i + causal_offset, s, -np.inf)
        return tf.einsum("bnqk,bknd->bqnd", tf.nn.softmax(s, axis=-1), v32)
    return _cpu(tf, fn, q, k, v)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=lambda t: np.dtype(t).name)
def test_flash_attention_causal_gqa(npusim, tf, strict_placement, llm, dtype):
    b, s, heads, kv_heads, d = 2, 45, 4, 2, 32
    q = _random((b, s, heads, d), dtype, 5, -1, 1)
    k = _random((b, s, kv_heads, d), dtype, 6, -1, 1)
    v = _random((b, s, kv_heads, d), dtype, 7, -2, 2)
    attention = lambda *t: llm.prompt_flash_attention(*t, sparse_mode=3)  # noqa: E731
    if _refused_as_mix_kernel(tf, attention, q, k, v):
        return
    got, kernels = _npu(npusim, tf, attention, q, k, v)
    assert any(k.startswith("Attention") for k in kernels), kernels
    want = _attention_reference(tf, q, k, v, causal_offset=0)
    u = ULP_HALF[np.dtype(dtype)]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2 * u,
                               atol=2 * (u + 1e-4) * 2.0)


def test_incre_flash_attention(npusim, tf, strict_placement, llm):
    """Several valid lengths of one cache: the kernel reads the length from device memory, so
    every length runs the one kernel compiled for the shapes (no new compiled-op cache entry)."""
    b, cache, heads, kv_heads, d = 2, 96, 8, 2, 64
    q = _random((b, 1, heads, d), np.float16, 8, -1, 1)
    k = _random((b, cache, kv_heads, d), np.float16, 9, -1, 1)
    v = _random((b, cache, kv_heads, d), np.float16, 10, -2, 2)
    u = ULP_HALF[np.dtype(np.float16)]
    if _refused_as_mix_kernel(tf, lambda *t: llm.incre_flash_attention(*t, 37), q, k, v):
        return

    def entries():
        return [key for key in npusim.compiled_ops()["keys"]
                if key.startswith("IncreFlashAttention(")]

    first = None
    for valid in (37, 1, 96, 65):
        got, _ = _npu(npusim, tf, lambda *t, n=valid: llm.incre_flash_attention(*t, n), q, k, v)
        want = _attention_reference(tf, q, k, v, kv_len=valid)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2 * u,
                                   atol=2 * (u + 1e-4) * 2.0)
        if first is None:
            first = entries()
            assert first, npusim.compiled_ops()["keys"]
        assert entries() == first, "a new length compiled a new kernel"


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=lambda t: np.dtype(t).name)
def test_rotary_embedding(npusim, tf, strict_placement, llm, dtype):
    b, s, heads, d = 2, 6, 3, 32
    x = _random((b, s, heads, d), dtype, 11, -2, 2)
    # keras-hub's RotaryEmbedding: inverse frequencies 10000^(-2i/D), emb = concat(freqs, freqs).
    inv = 1.0 / (10000.0 ** (np.arange(0, d, 2) / d))
    freqs = np.arange(s)[:, None] * inv[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos = np.cos(emb).astype(np.float32).astype(dtype)[None, :, None, :]
    sin = np.sin(emb).astype(np.float32).astype(dtype)[None, :, None, :]

    def reference(xt, ct, st):
        x32, c32, s32 = (tf.cast(t, tf.float32) for t in (xt, ct, st))
        x1, x2 = tf.split(x32, 2, axis=-1)
        return tf.cast(x32 * c32 + tf.concat([-x2, x1], axis=-1) * s32, xt.dtype)

    got, kernels = _npu(npusim, tf, llm.rotary_embedding, x, cos, sin)
    want = _cpu(tf, reference, x, cos, sin)
    assert any(k.startswith("RotaryPositionEmbedding") for k in kernels), kernels
    u = ULP_HALF[np.dtype(dtype)]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64),
                               rtol=2 * u + 1e-5, atol=4 * u)
