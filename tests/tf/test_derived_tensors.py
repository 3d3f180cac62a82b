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

from conftest import child_result, run_child  # noqa: E402


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


# A child (child_result): a two-layer Keras MLP predicts under allow_mix_precision; the weights'
# casts to float16 are Cast steps of the graph (mixed_precision.h) reading the variables.
MIXED_PRECISION_PREDICT = r'''
import json
import numpy as np
import npusim
npusim.configure(precision_mode="allow_mix_precision")
import tensorflow as tf
import keras

rng = np.random.default_rng(21)
x = rng.standard_normal((8, 24)).astype(np.float32)
with tf.device("/NPU:0"):
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((24,)), keras.layers.Dense(32, activation="relu", name="hidden"),
                              keras.layers.Dense(8, name="out")])

    def run():
        npusim.clear_launch_records()
        y = model.predict(x, batch_size=8, verbose=0)
        recs = npusim.launch_records()
        assert all(r["ok"] for r in recs)
        casts = [r["op_name"] for r in recs if r["kernel"].startswith("Cast")]
        return {"y": y.tolist(), "casts": casts,
                "weights": [w.numpy().tolist() for w in model.weights]}

    out = {"first": run(), "second": run()}
    k = model.layers[0].kernel
    k.assign(k.numpy() * -0.5)
    out["assigned"] = run()
    out["again"] = run()
print("RESULT" + json.dumps(out))
'''


def _mlp_reference(x, w1, b1, w2, b2):
    """The MLP in float16 as the pass runs it: every operand rounded to float16 but the biases
    (float32, added to the sum in the float16 MatMulBiasAdd), the products accumulated exactly
    (float64), each layer's result rounded once to float16."""
    r16 = lambda a: np.asarray(a, np.float64).astype(np.float16).astype(np.float64)  # noqa: E731
    h = np.maximum(r16(r16(x) @ r16(w1) + np.asarray(b1, np.float64)), 0)
    return r16(h @ r16(w2) + np.asarray(b2, np.float64))


def test_mixed_precision_predict_casts_each_weight_once():
    """Under allow_mix_precision a Cast of a variable's value is a step of the graph of its own:
    it is kept (npu_graph_kernel.cpp keep_stable_casts), so a second predict() launches no cast
    of a weight and gives the same outputs; after an assignment the kernel's cast runs again
    and the outputs follow the new weights."""
    out = child_result(MIXED_PRECISION_PREDICT)
    x = np.random.default_rng(21).standard_normal((8, 24)).astype(np.float32)

    def weight_casts(run):
        return sorted(c for c in run["casts"] if "ReadVariableOp" in c)

    first = weight_casts(out["first"])
    # the two kernels (the biases stay float32: MatMulBiasAdd reads them so)
    assert len(first) == 2, out["first"]["casts"]
    assert weight_casts(out["second"]) == []
    np.testing.assert_array_equal(out["second"]["y"], out["first"]["y"])
    # The assignment writes the first kernel only: its cast alone runs again, once.
    redone = weight_casts(out["assigned"])
    assert len(redone) == 1 and "/hidden" in redone[0] and redone[0] in first, redone
    assert weight_casts(out["again"]) == []
    np.testing.assert_array_equal(out["again"]["y"], out["assigned"]["y"])
    for run in ("first", "assigned"):
        want = _mlp_reference(x, *out[run]["weights"])
        # Summation order within fp32 accumulation: 2 fp16 ulps of the largest output.
        np.testing.assert_allclose(out[run]["y"], want, rtol=2.0 ** -9,
                                   atol=2.0 ** -9 * np.abs(want).max())
    assert not np.allclose(out["assigned"]["y"], out["first"]["y"])


# A child: four MatMuls of one input with weights of 2, 4, 6 and 8 KiB in float16, run node by
# node (their ops may run on several executor threads) under a derived-tensor budget of 6 KiB.
TINY_BUDGET = r'''
import json
import numpy as np
import npusim
npusim.configure(graph_mode={graph_mode})
import tensorflow as tf

rng = np.random.default_rng(5)
x = rng.standard_normal((4, 64)).astype(np.float32)
with tf.device("/NPU:0"):
    ws = [tf.Variable(rng.standard_normal((64, n)).astype(np.float32), name=f"w{{n}}")
          for n in (64, 48, 32, 16)]

    @tf.function
    def f(t):
        return tf.concat([tf.matmul(t, w) for w in ws], axis=1)

    steps = []
    for _ in range(4):
        npusim.clear_launch_records()
        y = f(tf.identity(tf.constant(x))).numpy()
        steps.append(sorted((r["op_name"], r["kernel"]) for r in npusim.launch_records()))
print("RESULT" + json.dumps({{"steps": steps, "y": y.tolist()}}))
'''


@pytest.mark.parametrize("graph_mode", [False, True], ids=["node_by_node", "whole_graph"])
def test_tiny_budget_keeps_the_same_casts_in_every_process(graph_mode):
    """When the budget is short the buffers kept are chosen by rank (smallest first,
    derived_tensor_cache.h), not by the order of lookups: the 6 KiB budget holds the 2 and 4 KiB
    casts, never the 6 or 8 KiB ones, whatever order the steps looked them up in; two processes
    launch the same kernels at every step. (Before, the least recently used buffer went first:
    the 6 KiB cast took the budget from the other two at each step, and they from it.)"""
    code = TINY_BUDGET.format(graph_mode=graph_mode)
    env = {"NPUSIM_DERIVED_BUDGET": str(2048 + 4096)}
    a, b = (child_result(code, extra_env=env) for _ in range(2))
    assert a["steps"] == b["steps"]
    matmul_casts = lambda step: sorted(  # noqa: E731
        name for name, kernel in step if kernel.startswith("Cast") and "MatMul" in name)
    first = matmul_casts(a["steps"][0])
    for step in a["steps"][1:]:
        # The 2 and 4 KiB weights' casts are left out; x's and the 6 and 8 KiB weights' run.
        assert len(matmul_casts(step)) == len(first) - 2, (first, matmul_casts(step))
    r16 = lambda v: np.asarray(v).astype(np.float16).astype(np.float64)  # noqa: E731
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 64)).astype(np.float32)
    ws = [rng.standard_normal((64, n)).astype(np.float32) for n in (64, 48, 32, 16)]
    want = np.concatenate([r16(x) @ r16(w) for w in ws], axis=1)
    np.testing.assert_allclose(a["y"], want, rtol=0, atol=1e-4)
