"""Derived tensors kept across runs (adapter/tf/plugin/derived_tensor_cache.h): under the default
precision mode allow_fp32_to_fp16 a Conv2D or MatMul casts its fp32 operands to fp16 first; the
cast of a weight is kept while the variable is not written, as CANN keeps a variable in the form
its consumers read. Checked through the launch records (which casts ran) against outputs computed
by TensorFlow on the CPU from the fp16-rounded operands: every write to the variable (assign,
assign_add on the chip) must bring the new weights into the result.

Reference: the cube multiplies the fp16 roundings of the operands exactly and accumulates in
fp32, so TF-CPU's fp32 convolution of the rounded operands agrees up to fp32 summation order
(relative 1e-5 of the sum of |products|; atol 1e-4 covers it for these sizes)."""

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from conftest import run_child  # noqa: E402


def _rng(seed):
    return np.random.default_rng(seed)


def _casts(npusim, op_type):
    """Cast launches of the given TF op type since the records were cleared."""
    recs = npusim.launch_records()
    assert all(r["ok"] for r in recs)
    return sum(1 for r in recs if r["op_type"] == op_type and r["kernel"].startswith("Cast"))


def _reference_conv(tf, x, w):
    r16 = lambda a: a.astype(np.float16).astype(np.float32)  # noqa: E731
    with tf.device("/CPU:0"):
        return tf.nn.conv2d(r16(x), r16(w), strides=1, padding="SAME").numpy()


def test_graph_weight_cast_runs_once_until_the_variable_is_written(npusim, tf, strict_placement):
    x = _rng(1).uniform(-1, 1, (1, 7, 6, 5)).astype(np.float32)
    w0 = _rng(2).uniform(-1, 1, (3, 3, 5, 16)).astype(np.float32)
    w1 = _rng(3).uniform(-1, 1, (3, 3, 5, 16)).astype(np.float32)
    delta = _rng(4).uniform(-1, 1, (3, 3, 5, 16)).astype(np.float32)
    with tf.device("/NPU:0"):
        w = tf.Variable(w0)
        f = tf.function(lambda t: tf.nn.conv2d(t, w, strides=1, padding="SAME"))

        def run():
            # A new input tensor each run (like a new batch): its cast always runs.
            xt = tf.identity(tf.constant(x))
            npusim.clear_launch_records()
            y = f(xt).numpy()
            return y, _casts(npusim, "Conv2D")

        y, casts = run()  # x and w cast; w's kept (the graph marks it a variable's value)
        assert casts == 2
        np.testing.assert_allclose(y, _reference_conv(tf, x, w0), rtol=0, atol=1e-4)
        for _ in range(2):
            y2, casts = run()
            assert casts == 1  # only x's: w's cast is left out
            np.testing.assert_array_equal(y2, y)

        w.assign(w1)  # a new buffer for the variable
        y, casts = run()
        assert casts == 2
        np.testing.assert_allclose(y, _reference_conv(tf, x, w1), rtol=0, atol=1e-4)
        assert run()[1] == 1

        w.assign_add(tf.constant(delta))  # the chip writes the variable's buffer in place
        y, casts = run()
        assert casts == 2
        np.testing.assert_allclose(y, _reference_conv(tf, x, w.numpy()), rtol=0, atol=1e-4)
        y2, casts = run()
        assert casts == 1
        np.testing.assert_array_equal(y2, y)


def test_eager_sources_are_kept_once_seen_unchanged(npusim, tf, strict_placement):
    x = _rng(5).uniform(-1, 1, (6, 40)).astype(np.float32)
    w0 = _rng(6).uniform(-1, 1, (40, 24)).astype(np.float32)
    delta = _rng(7).uniform(-1, 1, (40, 24)).astype(np.float32)
    r16 = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    with tf.device("/NPU:0"):
        w = tf.Variable(w0)
        xt = tf.constant(x)
        counts = []
        for _ in range(5):
            npusim.clear_launch_records()
            y = tf.matmul(xt, w).numpy()
            counts.append(_casts(npusim, "MatMul"))
            np.testing.assert_allclose(y, r16(x) @ r16(w0), rtol=0, atol=1e-4)
        # Watched twice in the workspace, given buffers at the third run, left out after.
        assert counts == [2, 2, 2, 0, 0]
        w.assign_add(tf.constant(delta))
        npusim.clear_launch_records()
        y = tf.matmul(xt, w).numpy()
        assert _casts(npusim, "MatMul") == 1  # w's only: x is unchanged
        np.testing.assert_allclose(y, r16(x) @ r16(w.numpy()), rtol=0, atol=1e-4)


def test_keep_derived_0_casts_every_time():
    out = run_child("""
import os
os.environ["NPUSIM_KEEP_DERIVED"] = "0"
import numpy as np, npusim
import tensorflow as tf
with tf.device("/NPU:0"):
    w = tf.Variable(np.ones((3, 3, 4, 8), np.float32))
    x = tf.constant(np.ones((1, 5, 5, 4), np.float32))
    f = tf.function(lambda t: tf.nn.conv2d(t, w, strides=1, padding="SAME"))
    counts = []
    for _ in range(3):
        npusim.clear_launch_records()
        f(x).numpy()
        counts.append(sum(1 for r in npusim.launch_records() if r["kernel"].startswith("Cast")))
print("casts", counts)
""")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "casts [2, 2, 2]" in out.stdout, out.stdout
