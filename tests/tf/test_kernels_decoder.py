"""NPU kernels of the general ops decoder models put in their graphs (docs/llm.md): Sin and Cos
(keras-hub's rotary embeddings compute their tables every call), XlaDynamicUpdateSlice
(keras.ops.slice_update: the KV-cache writes), ReciprocalGrad and SqrtGrad (training Gemma's
RMSNorm), All and Any (Gemma's attention: no attended tokens), and the rotary tables' product
(k = 1: f32 on the vector unit). Soft placement off, so each must run on /NPU:0.

Tolerances. Sin/Cos are computed in f32 by a Cody-Waite reduction and Cephes' polynomials
(ops/unary.cpp): within 2e-7 absolute of the exact value for |x| < 12867; TF's CPU kernels are
Eigen's, a few ulp (about 1.2e-7 each near 1) from exact, so the two agree within 5e-7.
f16/bf16 inputs are widened, computed and rounded once: within one ulp of the output type of the
exact value (f16: 2^-11 near 1, bf16: 2^-8). XlaDynamicUpdateSlice moves bits and All / Any are
logic: exact, and so is the rotary tables' product (f32's exact products, as TF's CPU)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from test_kernels import BF16  # noqa: E402
from test_kernels_layout import _check, _floats  # noqa: E402


@pytest.mark.parametrize("op", ["Sin", "Cos"])
def test_sin_cos_f32(npusim, tf, strict_placement, op):
    fn = {"Sin": tf.math.sin, "Cos": tf.math.cos}[op]
    ref = {"Sin": np.sin, "Cos": np.cos}[op]
    # Every quadrant, a RoPE-like range of angles (positions x frequencies) and odd sizes.
    x = np.concatenate([_floats((300,), 1, -7.0, 7.0), _floats((77,), 2, -4000.0, 4000.0),
                        np.float32([0.0, -0.0, np.pi / 2, np.pi, 1e-8, 12000.0])])
    _check(npusim, tf, fn, [x], op, atol=5e-7)
    with tf.device("/NPU:0"):
        got = fn(tf.constant(x)).numpy()
    np.testing.assert_allclose(got, ref(x.astype(np.float64)), rtol=0, atol=2e-7)
    with tf.device("/NPU:0"):
        special = fn(tf.constant(np.float32([np.inf, -np.inf, np.nan]))).numpy()
    assert np.isnan(special).all(), special


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["f16", "bf16"])
def test_sin_cos_half(npusim, tf, strict_placement, dtype):
    x = _floats((5, 37), 3, -10.0, 10.0).astype(dtype)
    ulp = 2.0 ** -11 if dtype == np.float16 else 2.0 ** -8
    for fn, ref in ((tf.math.sin, np.sin), (tf.math.cos, np.cos)):
        with tf.device("/NPU:0"):
            got = fn(tf.constant(x)).numpy().astype(np.float64)
        np.testing.assert_allclose(got, ref(x.astype(np.float64)), rtol=0, atol=ulp)


def _dynamic_update_slice():
    from tensorflow.compiler.tf2xla.python import xla  # pylint: disable=import-outside-toplevel

    return xla.dynamic_update_slice


# (input shape, update shape, start indices): a KV-cache write (one position of (batch, seq,
# heads, head_dim)), a block in the middle of every dim, starts XLA clamps (beyond the end,
# negative), an update of the whole tensor, rank 1 and an empty update.
DUS_CASES = [
    ((2, 12, 2, 16), (2, 1, 2, 16), [0, 5, 0, 0]),
    ((3, 7, 9), (2, 3, 4), [1, 2, 5]),
    ((2, 12, 2, 16), (2, 4, 2, 16), [0, 10, 0, 0]),
    ((4, 6), (2, 2), [-3, 5]),
    ((4, 6), (4, 6), [0, 0]),
    ((37,), (5,), [30]),
    ((4, 6), (0, 6), [1, 0]),
]


@pytest.mark.parametrize("shape,update,start", DUS_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32],
                         ids=lambda t: np.dtype(t).name)
def test_xla_dynamic_update_slice(npusim, tf, strict_placement, shape, update, start, dtype):
    dus = _dynamic_update_slice()
    x = _floats(shape, 4, -100, 100).astype(dtype)
    u = _floats(update, 5, -100, 100).astype(dtype)
    idx = np.int32(start)
    _check(npusim, tf, dus, [x, u, idx], "XlaDynamicUpdateSlice")


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64], ids=["s32", "s64"])
def test_xla_dynamic_update_slice_index_from_graph(npusim, tf, strict_placement, index_dtype):
    """As keras-hub's decode step has it: the position is a graph input, the start indices a
    Pack of it; one trace, new positions (also negative and past the end: clamped). The kernel
    reads the starts from device memory, so every position runs the one kernel compiled for the
    shape: no new compiled-op cache entry after the first call."""
    dus = _dynamic_update_slice()
    cache = _floats((1, 9, 2, 8), 6)
    row = _floats((1, 1, 2, 8), 7)
    tf_index = tf.as_dtype(index_dtype)

    @tf.function
    def write(c, r, pos):
        zero = tf.zeros((), tf_index)
        return dus(c, r, tf.stack([zero, pos, zero, zero]))

    def dus_entries():
        return [k for k in npusim.compiled_ops()["keys"]
                if k.startswith("XlaDynamicUpdateSlice(f32[1,9,2,8],f32[1,1,2,8]")]

    entries = None
    for pos in (0, 4, 8, -3, 11):
        with tf.device("/NPU:0"):
            got = write(tf.constant(cache), tf.constant(row), tf.constant(pos, tf_index))
        want = cache.copy()
        want[:, min(max(pos, 0), 8)] = row[:, 0]
        assert got.device.endswith("device:NPU:0"), got.device
        np.testing.assert_array_equal(got.numpy(), want)
        if entries is None:
            entries = dus_entries()
            assert entries, npusim.compiled_ops()["keys"]
        assert dus_entries() == entries, "a new position compiled a new kernel"


@pytest.mark.parametrize("op", ["ReciprocalGrad", "SqrtGrad"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16, BF16], ids=["f32", "f16", "bf16"])
def test_reciprocal_and_sqrt_grad(npusim, tf, strict_placement, op, dtype):
    """Gemma's normalisation differentiates 1/x and sqrt(x). The NPU computes TF's vectorised
    formulas (ops/binary.cpp), each step rounded to the type: within one ulp of the type of TF's
    CPU result (whose scalar tail rounds in another order), and 0 wherever dy is 0, even for
    y = 0 or inf."""
    fn = getattr(tf.raw_ops, op)
    y = _floats((3, 41), 8, 0.2, 5.0)
    dy = _floats((3, 41), 9, -3.0, 3.0)
    dy[0, :4] = 0.0
    y[0, :2] = [0.0, np.inf]
    ulp = {np.float32: 2.0 ** -23, np.float16: 2.0 ** -10, BF16: 2.0 ** -7}[dtype]
    _check(npusim, tf, lambda a, b: fn(y=a, dy=b), [y.astype(dtype), dy.astype(dtype)], op,
           rtol=ulp)
    with tf.device("/NPU:0"):
        got = fn(y=tf.constant(y), dy=tf.constant(dy)).numpy()
    np.testing.assert_array_equal(got[0, :4], 0.0)


# (shape, axis, keepdims): Gemma's mask test (the last axis, kept), several axes, every axis,
# a reduced axis of size 0 (All: true, Any: false) and one of size 1.
LOGICAL_CASES = [((2, 1, 9), -1, True), ((3, 4, 5), [0, 2], False), ((6, 7), None, False),
                 ((3, 0), 1, False), ((4, 1, 3), 1, True)]


@pytest.mark.parametrize("op", ["All", "Any"])
@pytest.mark.parametrize("shape,axis,keepdims", LOGICAL_CASES)
def test_all_any(npusim, tf, strict_placement, op, shape, axis, keepdims):
    fn = {"All": tf.math.reduce_all, "Any": tf.math.reduce_any}[op]
    rng = np.random.default_rng(7)
    # mostly one value, so that some rows are all true (All) or all false (Any)
    x = rng.uniform(size=shape) < (0.9 if op == "All" else 0.1)
    if x.size:
        x.reshape(-1, shape[-1])[0] = op == "All"  # a row that decides: all true / all false
    _check(npusim, tf, lambda v: fn(v, axis=axis, keepdims=keepdims), [x])  # vs TF's CPU
    with tf.device("/NPU:0"):
        got = fn(tf.constant(x), axis=axis, keepdims=keepdims).numpy()
    axes = None if axis is None else tuple(np.atleast_1d(axis))
    ref = {"All": np.all, "Any": np.any}[op]
    np.testing.assert_array_equal(got, ref(x, axes, keepdims=keepdims))


def test_rotary_table_product_f32(npusim, tf, strict_placement):
    """keras-hub's rotary table product: einsum "bi,j->bij" of the positions [1, S] and the
    inverse frequencies (Llama 3.2's: theta 500000, head_dim 64), a contraction with k = 1, at
    positions 0..8191 in f32 under allow_fp32_to_fp16 (the default). A k = 1 product runs on the
    vector unit in f32 (ops/matmul.cpp), so every angle is f32's exact product, bit for bit TF's
    on the CPU; with fp16 operands on the cube the positions above 2048 would not be exact and
    each angle would be off by up to position x 2^-11. The same for MatMul [S, 1] x [1, D/2]."""
    pos = np.arange(8192, dtype=np.float32)
    inv = (1.0 / 500000.0 ** (np.arange(0, 64, 2, dtype=np.float64) / 64)).astype(np.float32)
    for fn, args in ((lambda p, f: tf.einsum("bi,j->bij", p, f), (pos[None, :], inv)),
                     (tf.linalg.matmul, (pos[:, None], inv[None, :]))):
        with tf.device("/CPU:0"):
            want = fn(*map(tf.constant, args)).numpy()
        with tf.device("/NPU:0"):
            got = fn(*map(tf.constant, args)).numpy()
        assert want.shape == got.shape
        np.testing.assert_array_equal(got, want)
