"""AddN as a compiled op and the convolution epilogue fusion (docs/graph_engine.md, issue 14;
adapter/tf/plugin/graph_fusion.h rewrite 3b), on the tiny chip.

- AddN of 2..5 inputs, float32 / float16 / bfloat16, is one launch of op type AddN whose result
  is the left-to-right sum rounded to T after each add: numpy's (float16 sums formed exactly in
  float64, then rounded) bit for bit; bfloat16 against TensorFlow's CPU kernel;
- an AddN between compiled ops of a tf.function runs inside the same NpuGraph task list as its
  producers and readers (one graph run for the whole function), with numpy's result;
- Conv2D -> BiasAdd [-> Relu] (Keras Conv2D layers with bias, with and without ReLU, stride 1
  and 2) run as Conv2DBiasAdd launches named after the chain's last node (the Relu, else the
  BiasAdd), with no BiasAdd or Relu launch left, TensorFlow's CPU result within the precision
  mode's tolerance (allow_fp32_to_fp16: 1e-2 of the tensor's norm, as tests/tf/test_fusion.py),
  and fewer launches than with NPUSIM_FUSION_EPILOGUE=0 (a child process: read once);
- chains that must not fuse stay as they were and compute TensorFlow's CPU result: the
  convolution's output read by a second node, a float16 convolution (the bias table holds f32),
  a BiasAdd in NCHW over the convolution's NHWC output (it adds along H), and a Relu not taken
  where the BiasAdd's output is read elsewhere too (Conv2DBiasAdd without relu, then Relu);
- MatMul -> BiasAdd [-> Relu] (raw ops with every transpose the cube takes, and Keras Dense
  layers) run as MatMulBiasAdd launches named after the last node, numpy's result within the
  tolerance; a product read by a second node stays unfused;
- a small CNN with biased convolutions and a branch whose gradients meet in an AddN, trained
  three steps with Adam in whole-graph mode with the fusions, tracks node-by-node execution
  without the epilogue fusion (NPUSIM_GRAPH=0 NPUSIM_FUSION_EPILOGUE=0): losses and weights
  within the fp16 rounding of the cube's operands; its AddN launches run inside task lists.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import child_result, chip_config  # noqa: E402  pylint: disable=wrong-import-position

RTOL = 1e-2


def rel_error(actual, expected):
    actual, expected = np.asarray(actual, np.float64), np.asarray(expected, np.float64)
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def records_of(npusim, fn):
    """Runs fn() twice (trace and compile, then measured); the second run's output and
    launch records."""
    fn()
    n0 = len(npusim.launch_records())
    out = fn()
    return out, npusim.launch_records()[n0:]


# ---- AddN ----


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_add_n_is_one_launch_left_to_right(npusim, tf, n, dtype):
    rng = np.random.default_rng(n)
    xs = [rng.standard_normal((3, 37)).astype(np.float32) * 10 ** rng.uniform(-2, 2)
          for _ in range(n)]
    with tf.device("/CPU:0"):
        ts = [tf.cast(tf.constant(x), dtype) for x in xs]
        want_tf = tf.raw_ops.AddN(inputs=ts)
    with tf.device("/NPU:0"):
        got, recs = records_of(npusim, lambda: tf.raw_ops.AddN(inputs=[tf.identity(t) for t in ts]))
    got = tf.cast(got, tf.float32).numpy()
    adds = [r for r in recs if r["op_type"] == "AddN"]
    assert len(adds) == 1, [(r["op_type"], r["kernel"]) for r in recs]
    if dtype == "bfloat16":
        np.testing.assert_array_equal(got, tf.cast(want_tf, tf.float32).numpy())
        return
    t = np.dtype(dtype)
    acc = xs[0].astype(t)
    for x in xs[1:]:
        acc = (acc.astype(np.float64) + x.astype(t).astype(np.float64)).astype(t)
    np.testing.assert_array_equal(got, acc.astype(np.float32))


def test_add_n_inside_one_task_list(npusim, tf):
    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal((16, 16)).astype(np.float32) for _ in range(3))

    @tf.function
    def f(a, b, c):
        p = tf.matmul(a, b)
        q = tf.matmul(c, b)
        s = tf.raw_ops.AddN(inputs=[p, q, a])
        return tf.matmul(tf.nn.relu(s), c)

    with tf.device("/NPU:0"):
        args = [tf.constant(v) for v in (a, b, c)]
        got, recs = records_of(npusim, lambda: f(*args).numpy())
    # The cube rounds f32 operands to fp16 (allow_fp32_to_fp16).
    want = np.maximum(a @ b + c @ b + a, 0) @ c
    assert rel_error(got, want) < RTOL
    assert any(r["op_type"] == "AddN" for r in recs)
    runs = {r["graph_run"] for r in recs}
    assert len(runs) == 1 and 0 not in runs and None not in runs, \
        [(r["op_name"], r["op_type"], r["graph_run"]) for r in recs]


# ---- the convolution epilogue ----

# A Keras model of biased convolutions (built in this process and in the child).
EPILOGUE_MODEL = r'''
import numpy as np
import keras

def build_epilogue_model():
    keras.utils.set_random_seed(11)
    inp = keras.Input((9, 9, 3))
    h = keras.layers.Conv2D(16, 3, padding="same", activation="relu", name="c1")(inp)
    h = keras.layers.Conv2D(8, 3, strides=2, padding="same", name="c2")(h)
    out = keras.layers.Conv2D(8, 1, activation="relu", name="c3")(h)
    model = keras.Model(inp, out)
    rng = np.random.default_rng(3)
    for layer in model.layers[1:]:  # non-zero biases
        layer.bias.assign(rng.uniform(-0.5, 0.5, layer.bias.shape[0]).astype(np.float32))
    x = rng.standard_normal((2, 9, 9, 3)).astype(np.float32)
    return model, x
'''

EPILOGUE_CHILD = EPILOGUE_MODEL + r'''
import json
import npusim
import tensorflow as tf
model, x = build_epilogue_model()
with tf.device("/NPU:0"):
    f = tf.function(lambda t: model(t, training=False))
    xt = tf.constant(x)
    f(xt).numpy()
    n0 = len(npusim.launch_records())
    y = f(xt).numpy()
    recs = npusim.launch_records()[n0:]
print("RESULT " + json.dumps({"launches": len(recs), "y": y.tolist(),
                              "op_types": sorted({r["op_type"] for r in recs})}))
'''

exec(EPILOGUE_MODEL)  # pylint: disable=exec-used


def test_conv_bias_relu_fused(npusim, tf):
    model, x = build_epilogue_model()  # pylint: disable=undefined-variable
    with tf.device("/CPU:0"):
        want = model(tf.constant(x), training=False).numpy()
    with tf.device("/NPU:0"):
        f = tf.function(lambda t: model(t, training=False))
        xt = tf.constant(x)
        got, recs = records_of(npusim, lambda: f(xt).numpy())
    assert got.shape == want.shape == (2, 5, 5, 8)
    assert rel_error(got, want) < RTOL
    types = [r["op_type"] for r in recs]
    assert "BiasAdd" not in types and "Relu" not in types and "Conv2D" not in types, types
    fused = sorted({r["op_name"] for r in recs if r["op_type"] == "Conv2DBiasAdd"})
    # Each chain's last node: c1 and c3 end in their Relu, c2 in its BiasAdd.
    assert len(fused) == 3, fused
    assert sorted(n.split("/")[-1] for n in fused) == ["BiasAdd", "Relu", "Relu"], fused

    unfused = child_result(EPILOGUE_CHILD, extra_env={"NPUSIM_FUSION_EPILOGUE": "0"})
    assert "Conv2DBiasAdd" not in unfused["op_types"], unfused["op_types"]
    assert "BiasAdd" in unfused["op_types"] and "Relu" in unfused["op_types"]
    # Three convolutions, each with a BiasAdd launch, two with a Relu launch, fewer now: the
    # five of them where the chip has a bias table (an l1->bt path: the cube adds the bias,
    # FIXPIPE the ReLU); without one (the 910, 310P) each convolution's epilogue launch adds
    # the bias and the ReLU after it (ops/conv2d.cpp), saving the two Relu launches.
    saved = 5 if "l1->bt" in chip_config()["paths"] else 2
    assert len(recs) <= unfused["launches"] - saved, (len(recs), unfused["launches"])
    assert rel_error(got, unfused["y"]) < 1e-3


def _unfused_case(npusim, tf, fn, args, dtype=np.float32):
    with tf.device("/CPU:0"):
        want = [np.asarray(v, np.float32) for v in fn(*[tf.constant(a) for a in args])]
    with tf.device("/NPU:0"):
        f = tf.function(fn)
        ts = [tf.constant(a) for a in args]
        got, recs = records_of(npusim, lambda: [np.asarray(v, np.float32) for v in f(*ts)])
    for g, w in zip(got, want):
        assert rel_error(g, w) < (RTOL if dtype == np.float32 else 2e-2)
    return [(r["op_type"], r["op_name"]) for r in recs]


def test_conv_read_twice_stays_unfused(npusim, tf):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 6, 6, 4)).astype(np.float32)
    w = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)

    def fn(x, w, b):
        c = tf.nn.conv2d(x, w, 1, "SAME")
        return [tf.nn.bias_add(c, b) * 3.0 + c]

    ops = [t for t, _ in _unfused_case(npusim, tf, fn, [x, w, b])]
    assert "Conv2DBiasAdd" not in ops and "Conv2D" in ops, ops


def test_half_conv_stays_unfused(npusim, tf):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 6, 16)).astype(np.float16)
    w = (rng.standard_normal((3, 3, 16, 16)) * 0.2).astype(np.float16)
    b = rng.standard_normal(16).astype(np.float16)

    def fn(x, w, b):
        return [tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b))]

    ops = [t for t, _ in _unfused_case(npusim, tf, fn, [x, w, b], np.float16)]
    assert "Conv2DBiasAdd" not in ops and "Conv2D" in ops, ops


def test_nchw_bias_add_stays_unfused(npusim, tf):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 6, 6, 4)).astype(np.float32)
    w = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)  # along H of the NHWC output

    def fn(x, w, b):
        return [tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b, data_format="NCHW")]

    ops = [t for t, _ in _unfused_case(npusim, tf, fn, [x, w, b])]
    assert "Conv2DBiasAdd" not in ops and "Conv2D" in ops and "BiasAdd" in ops, ops


def test_relu_not_taken_when_bias_add_read_twice(npusim, tf):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 6, 6, 4)).astype(np.float32)
    w = rng.standard_normal((3, 3, 4, 8)).astype(np.float32)
    b = rng.standard_normal(8).astype(np.float32)

    def fn(x, w, b):
        y = tf.nn.bias_add(tf.nn.conv2d(x, w, 1, "SAME"), b)
        return [tf.nn.relu(y), y]

    ops = _unfused_case(npusim, tf, fn, [x, w, b])
    types = [t for t, _ in ops]
    assert "Conv2D" not in types and "BiasAdd" not in types and "Relu" in types, ops
    assert [n for t, n in ops if t == "Conv2DBiasAdd"][0].endswith("BiasAdd"), ops


# ---- the MatMul epilogue ----


@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True)])
@pytest.mark.parametrize("relu", [False, True])
def test_matmul_bias_fused(npusim, tf, ta, tb, relu):
    rng = np.random.default_rng(6)
    m, k, n = 20, 40, 24  # tiles cut in m and n, k over several fractals
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)

    def fn(a, b, bias):
        y = tf.nn.bias_add(tf.matmul(a, b, transpose_a=ta, transpose_b=tb), bias)
        return tf.nn.relu(y) if relu else y

    with tf.device("/NPU:0"):
        f = tf.function(fn)
        args = [tf.constant(v) for v in (a, b, bias)]
        got, recs = records_of(npusim, lambda: f(*args).numpy())
    want = (a.T if ta else a) @ (b.T if tb else b) + bias
    if relu:
        want = np.maximum(want, 0)
    assert rel_error(got, want) < RTOL
    if relu:
        assert (got >= 0).all()
    types = [r["op_type"] for r in recs]
    assert "MatMul" not in types and "BiasAdd" not in types and "Relu" not in types, types
    names = {r["op_name"] for r in recs if r["op_type"] == "MatMulBiasAdd"}
    assert len(names) == 1 and names.pop().endswith("Relu" if relu else "BiasAdd")


def test_matmul_read_twice_stays_unfused(npusim, tf):
    rng = np.random.default_rng(7)
    a, b = (rng.standard_normal((16, 16)).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal(16).astype(np.float32)

    def fn(a, b, bias):
        p = tf.matmul(a, b)
        return [tf.nn.bias_add(p, bias) - p]

    ops = [t for t, _ in _unfused_case(npusim, tf, fn, [a, b, bias])]
    assert "MatMulBiasAdd" not in ops and "MatMul" in ops, ops


def test_dense_layers_fused(npusim, tf):
    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((30,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10)])
    rng = np.random.default_rng(8)
    for layer in model.layers:
        layer.bias.assign(rng.uniform(-0.5, 0.5, layer.bias.shape[0]).astype(np.float32))
    x = rng.standard_normal((8, 30)).astype(np.float32)
    with tf.device("/CPU:0"):
        want = model(x).numpy()
    with tf.device("/NPU:0"):
        f = tf.function(lambda t: model(t, training=False))
        xt = tf.constant(x)
        got, recs = records_of(npusim, lambda: f(xt).numpy())
    assert rel_error(got, want) < RTOL
    fused = sorted(n.split("/")[-1]
                   for n in {r["op_name"] for r in recs if r["op_type"] == "MatMulBiasAdd"})
    assert fused == ["BiasAdd", "Relu"], [(r["op_type"], r["op_name"]) for r in recs]


# ---- training ----

TRAIN_CHILD = r'''
import json
import numpy as np
import npusim
import tensorflow as tf
import keras

keras.utils.set_random_seed(5)
inp = keras.Input((8, 8, 3))
h = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(inp)
a = keras.layers.Conv2D(8, 3, padding="same", activation="relu")(h)
b = keras.layers.Conv2D(8, 1)(h)  # h's gradient: AddN of the two branches' (and nothing else)
h = keras.layers.Add()([a, b])
h = keras.layers.Flatten()(h)
out = keras.layers.Dense(4)(h)
model = keras.Model(inp, out)
rng = np.random.default_rng(0)
x = rng.standard_normal((4, 8, 8, 3)).astype(np.float32)
y = rng.standard_normal((4, 4)).astype(np.float32)
opt = keras.optimizers.Adam(1e-2)
with tf.device("/NPU:0"):
    losses = fit_steps(model, opt, tf.constant(x), tf.constant(y), "/NPU:0")
recs = npusim.launch_records()
print("RESULT " + json.dumps({
    "losses": losses,
    "weights": [w.numpy().tolist() for w in model.trainable_variables],
    "op_types": sorted({r["op_type"] for r in recs}),
    "add_n_outside_graphs": sum(r["op_type"] == "AddN" and not r["graph_run"] for r in recs),
    "add_n": sum(r["op_type"] == "AddN" for r in recs)}))
'''


def test_cnn_training_tracks_node_by_node():
    from conftest import FIT_STEPS  # pylint: disable=import-outside-toplevel

    # (NPUSIM_FUSION_ADDN_RELU_GRAD=0: h's gradient sum stays an AddN, which rewrite 16 would
    # take into the ReluGrad after it; tests/tf/test_fusion_addn_relu_grad.py.)
    keep_add_n = {"NPUSIM_FUSION_ADDN_RELU_GRAD": "0"}
    fused = child_result(FIT_STEPS + TRAIN_CHILD, extra_env=keep_add_n)
    plain = child_result(FIT_STEPS + TRAIN_CHILD,
                         extra_env=dict(keep_add_n, NPUSIM_GRAPH="0", NPUSIM_FUSION_EPILOGUE="0"))
    assert "Conv2DBiasAdd" in fused["op_types"], fused["op_types"]
    assert "Conv2DBiasAdd" not in plain["op_types"]
    assert fused["add_n"] >= 1 and fused["add_n_outside_graphs"] == 0, fused
    np.testing.assert_allclose(fused["losses"], plain["losses"], rtol=2e-3)
    for wf, wp in zip(fused["weights"], plain["weights"]):
        wf, wp = np.asarray(wf), np.asarray(wp)
        assert np.linalg.norm(wf - wp) <= 2e-3 * np.linalg.norm(wp) + 1e-6
