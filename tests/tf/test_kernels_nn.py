"""NPU kernels of the ops a Keras Dense MLP train step needs beyond the element-wise families and
MatMul (adapter/tf/plugin/kernels_nn.cpp, kernels_reduce.cpp): with soft placement off each op
runs on /NPU:0, matches a numpy reference, and its launches completed on the chip.

References are numpy, computed in fp32 (float64 for the transcendental ones) and rounded once to
the op's type. Exact comparisons where the NPU's arithmetic is one fp32 operation per element
rounded once (bias add, ReLU's gradient, data movement, max); sums, means, exp-based ops at the
stated tolerances (the chip sums in lane / fold order, and its exp differs from libm's)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from test_kernels import BF16, FLOAT_TYPES, _on_npu, _random  # noqa: E402


def _assert_launched(records, kernel_prefix):
    """A kernel named kernel_prefix... ran, and every launch of the op completed on the chip."""
    assert any(r["kernel"].startswith(kernel_prefix) for r in records), (kernel_prefix, records)
    for r in records:
        assert r["ok"], r["error"]
        assert r["cycles"] > 0


def _tol(dtype):
    """rtol of a value computed in fp32 and rounded once to dtype, plus fp32 summation error."""
    return {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 1e-3,
            np.dtype(BF16): 8e-3}[np.dtype(dtype)]


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=lambda t: np.dtype(t).name)
def test_bias_add(npusim, tf, strict_placement, dtype):
    x = _random((8, 40), dtype, 11)
    bias = _random((40,), dtype, 12)
    got, records = _on_npu(npusim, tf, tf.nn.bias_add, x, bias)
    want = (x.astype(np.float32) + bias.astype(np.float32)).astype(dtype)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, want)
    _assert_launched(records, "BiasAdd")


def test_bias_add_nchw(npusim, tf, strict_placement):
    x = _random((2, 3, 4, 5), np.float32, 13)
    bias = _random((3,), np.float32, 14)
    got, _ = _on_npu(npusim, tf, lambda v, b: tf.nn.bias_add(v, b, data_format="NCHW"), x, bias)
    np.testing.assert_array_equal(got, x + bias[None, :, None, None])


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=lambda t: np.dtype(t).name)
def test_bias_add_grad(npusim, tf, strict_placement, dtype):
    dy = _random((24, 40), dtype, 15)
    got, records = _on_npu(npusim, tf, lambda g: tf.raw_ops.BiasAddGrad(out_backprop=g), dy)
    want = dy.astype(np.float64).sum(axis=0)
    assert got.shape == (40,) and got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=_tol(dtype), atol=1e-5 * 24)
    assert records and all(r["ok"] for r in records), records


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=lambda t: np.dtype(t).name)
def test_relu_grad(npusim, tf, strict_placement, dtype):
    g = _random((5, 37), dtype, 16)
    f = _random((5, 37), dtype, 17)
    f[0, :5] = 0  # ReLU's gradient at 0 is 0 (TF: features > 0)
    got, records = _on_npu(
        npusim, tf, lambda a, b: tf.raw_ops.ReluGrad(gradients=a, features=b), g, f)
    want = np.where(f.astype(np.float32) > 0, g.astype(np.float32), 0).astype(dtype)
    np.testing.assert_array_equal(got, want)
    _assert_launched(records, "ReluGrad")


def _log_softmax64(logits):
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


@pytest.mark.parametrize("label_dtype", [np.int32, np.int64], ids=lambda t: np.dtype(t).name)
def test_sparse_softmax_cross_entropy(npusim, tf, strict_placement, label_dtype):
    logits = _random((16, 10), np.float32, 18)
    labels = np.random.default_rng(19).integers(0, 10, 16).astype(label_dtype)
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        loss, backprop = tf.raw_ops.SparseSoftmaxCrossEntropyWithLogits(
            features=tf.constant(logits), labels=tf.constant(labels))
    assert loss.device.endswith("device:NPU:0"), loss.device
    records = npusim.launch_records()
    log_p = _log_softmax64(logits)
    want_loss = -log_p[np.arange(16), labels]
    want_backprop = np.exp(log_p)
    want_backprop[np.arange(16), labels] -= 1
    np.testing.assert_allclose(loss.numpy(), want_loss, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(backprop.numpy(), want_backprop, rtol=1e-5, atol=1e-6)
    assert records and all(r["ok"] for r in records), records


# (axes, keep_dims) of the reductions: leading, trailing, negative, several, all axes.
REDUCTIONS = [([0], False), ([2], True), ([-1], False), ([0, 2], False), ([0, 1, 2], True)]


@pytest.mark.parametrize("axes,keep_dims", REDUCTIONS, ids=str)
@pytest.mark.parametrize("op", ["Sum", "Mean", "Max"])
def test_reductions_read_axes_from_host_memory(npusim, tf, strict_placement, op, axes, keep_dims):
    x = _random((6, 7, 40), np.float32, 20)
    fn = getattr(tf.raw_ops, op)
    got, records = _on_npu(
        npusim, tf,
        lambda t: fn(input=t, axis=tf.constant(axes, dtype=tf.int32), keep_dims=keep_dims), x)
    ref = {"Sum": np.sum, "Mean": np.mean, "Max": np.max}[op]
    want = ref(x.astype(np.float64), axis=tuple(axes), keepdims=keep_dims)
    assert got.shape == want.shape
    if op == "Max":
        np.testing.assert_array_equal(got, want.astype(np.float32))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert records and all(r["ok"] and r["cycles"] > 0 for r in records), records


def test_reduction_with_int64_axes_and_half(npusim, tf, strict_placement):
    x = _random((9, 33), np.float16, 21)
    got, records = _on_npu(
        npusim, tf, lambda t: tf.reduce_sum(t, axis=tf.constant([1], dtype=tf.int64)), x)
    np.testing.assert_allclose(got.astype(np.float64), x.astype(np.float64).sum(axis=1),
                               rtol=1e-3, atol=1e-2)
    assert records and all(r["ok"] for r in records), records


def test_tile_broadcast_to_strided_slice(npusim, tf, strict_placement):
    x = _random((3, 40), np.float32, 22)
    got, records = _on_npu(npusim, tf, lambda t: tf.tile(t, [2, 3]), x)
    np.testing.assert_array_equal(got, np.tile(x, (2, 3)))
    _assert_launched(records, "Tile")
    row = _random((40,), np.float32, 23)
    got, records = _on_npu(npusim, tf, lambda t: tf.broadcast_to(t, [5, 40]), row)
    np.testing.assert_array_equal(got, np.broadcast_to(row, (5, 40)))
    _assert_launched(records, "BroadcastTo")
    got, records = _on_npu(npusim, tf, lambda t: t[1:, ::2], x)
    np.testing.assert_array_equal(got, x[1:, ::2])
    _assert_launched(records, "StridedSlice")
    got, _ = _on_npu(npusim, tf, lambda t: t[-1], x)  # shrink_axis_mask
    np.testing.assert_array_equal(got, x[-1])


ACTIVATIONS = {
    "Softmax": lambda z: np.exp(_log_softmax64(z)),
    "LogSoftmax": _log_softmax64,
    "Sigmoid": lambda z: 1 / (1 + np.exp(-z.astype(np.float64))),
    "Tanh": lambda z: np.tanh(z.astype(np.float64)),
}


@pytest.mark.parametrize("dtype", FLOAT_TYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("op", sorted(ACTIVATIONS))
def test_softmax_and_activations(npusim, tf, strict_placement, op, dtype):
    x = _random((6, 50), dtype, 24)
    fn = getattr(tf.raw_ops, op)
    arg = "logits" if "Softmax" in op else "x"
    got, records = _on_npu(npusim, tf, lambda t: fn(**{arg: t}), x)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_allclose(got.astype(np.float64), ACTIVATIONS[op](x.astype(np.float32)),
                               rtol=2 * _tol(dtype), atol=2 * _tol(dtype) * 1e-1)
    assert records and all(r["ok"] for r in records), records


def _softmax_vs_cpu(npusim, tf, op, shape, dtype, seed, kernel):
    """op over the last axis on the NPU against TF on the CPU (f32 logits), with special rows:
    row 0 -inf in its first three and last two lanes (in lane 0 only on rows shorter than 8, so
    that it stays partly finite), row 1 all -inf (NaN: -inf - -inf), row 2 one large logit (1
    there, 0 elsewhere), the last row one large negative logit; kernel: the launch."""
    x = _random(shape, dtype, seed)
    rows = x.reshape(-1, shape[-1])
    big = 3e4 if dtype == np.float16 else 1e30
    if shape[-1] < 8:
        rows[0, 0] = -np.inf
    else:
        rows[0, :3] = -np.inf
        rows[0, -2:] = -np.inf
    rows[1, :] = -np.inf
    rows[2, -1] = big
    rows[-1, -1] = -big
    fn = getattr(tf.raw_ops, op)
    got, records = _on_npu(npusim, tf, lambda t: fn(logits=t), x)
    with tf.device("/CPU:0"):
        cpu = fn(logits=tf.constant(x.astype(np.float32))).numpy()
    assert got.dtype == np.dtype(dtype) and got.shape == x.shape
    np.testing.assert_allclose(got.astype(np.float64), cpu, rtol=2 * _tol(dtype),
                               atol=2 * _tol(dtype) * 1e-1)
    assert np.isnan(got.reshape(rows.shape)[1]).all()
    _assert_launched(records, f"{op}_{kernel}")


def _shape_dtype_id(v):
    return "x".join(map(str, v)) if isinstance(v, tuple) else np.dtype(v).name


# Rows whose bytes are not whole 32-byte blocks, too long to be resident 16 at a time on the
# test chip but fitting alone: one row resident per step (Softmax_long_rows), each row loaded
# from the block holding its first element and stored with the previous row's tail in its
# head block; rows split over the cores so that blocks start inside a 32-byte block.
RAGGED_ROWS = [((5, 1013), BF16), ((3, 3, 2049), np.float32), ((7, 1021), np.float16),
               ((3, 4001), BF16), ((9, 4097), np.float16)]


@pytest.mark.parametrize("shape,dtype", RAGGED_ROWS, ids=_shape_dtype_id)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_rows_inside_blocks(npusim, tf, strict_placement, op, shape, dtype):
    _softmax_vs_cpu(npusim, tf, op, shape, dtype, 29, "long_rows")


# Rows of 1, 2, 4 or 8 classes: each row's max / sum spread onto its lanes, one dense
# instruction per group (Softmax_rows).
TINY_ROWS = [((1000, 2), np.float16), ((3, 33, 4), np.float32), ((77, 8), BF16),
             ((9, 1), np.float32)]


@pytest.mark.parametrize("shape,dtype", TINY_ROWS, ids=_shape_dtype_id)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_tiny_rows(npusim, tf, strict_placement, op, shape, dtype):
    _softmax_vs_cpu(npusim, tf, op, shape, dtype, 30, "rows")


@pytest.mark.parametrize("op,ref", [
    ("SigmoidGrad", lambda y, dy: dy * y * (1 - y)),
    ("TanhGrad", lambda y, dy: dy * (1 - y * y)),
])
def test_activation_grads(npusim, tf, strict_placement, op, ref):
    y = _random((4, 70), np.float32, 25, lo=-1.0, hi=1.0)
    dy = _random((4, 70), np.float32, 26)
    got, records = _on_npu(npusim, tf, lambda a, b: getattr(tf.raw_ops, op)(y=a, dy=b), y, dy)
    np.testing.assert_allclose(got, ref(y.astype(np.float64), dy.astype(np.float64)),
                               rtol=1e-5, atol=1e-6)
    assert records and all(r["ok"] for r in records), records


def _dense_mlp_step(tf, device, x, labels, weights):
    """Loss and gradients of a 2-layer Dense MLP (bias_add, relu, sparse softmax cross entropy,
    mean over the batch) on `device`, as Keras' Dense + SparseCategoricalCrossentropy build it."""
    with tf.device(device):
        params = [tf.Variable(w) for w in weights]
        with tf.GradientTape() as tape:
            w1, b1, w2, b2 = params
            h = tf.nn.relu(tf.nn.bias_add(tf.matmul(tf.constant(x), w1), b1))
            logits = tf.nn.bias_add(tf.matmul(h, w2), b2)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
                labels=tf.constant(labels), logits=logits))
        grads = tape.gradient(loss, params)
    return loss, grads


def test_dense_mlp_gradient_step_runs_on_the_npu(npusim, tf, strict_placement):
    rng = np.random.default_rng(27)
    # Small integers / powers of two keep MatMul exact under every precision mode.
    x = rng.integers(-2, 3, (16, 32)).astype(np.float32)
    labels = rng.integers(0, 10, 16).astype(np.int32)
    weights = [rng.integers(-2, 3, s).astype(np.float32) / 8 for s in
               [(32, 24), (24,), (24, 10), (10,)]]
    npusim.clear_launch_records()
    loss, grads = _dense_mlp_step(tf, "/NPU:0", x, labels, weights)
    kernels = {r["kernel"].split("_")[0] for r in npusim.launch_records()}
    assert loss.device.endswith("device:NPU:0")
    assert all(g.device.endswith("device:NPU:0") for g in grads), [g.device for g in grads]
    assert {"MatMul", "BiasAdd", "ReluGrad"} <= kernels, kernels
    loss_cpu, grads_cpu = _dense_mlp_step(tf, "/CPU:0", x, labels, weights)
    np.testing.assert_allclose(loss.numpy(), loss_cpu.numpy(), rtol=1e-5)
    # The backward MatMuls multiply softmax probabilities, which the default precision mode
    # rounds to fp16 (relative error 2^-11 per input) before the cube: sums of up to 32 such
    # products of magnitude <= 2 * 0.25 stay within 1e-4 absolute of the CPU's fp32.
    for g, g_cpu in zip(grads, grads_cpu):
        np.testing.assert_allclose(g.numpy(), g_cpu.numpy(), rtol=2e-3, atol=1e-4)
