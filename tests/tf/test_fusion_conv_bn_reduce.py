"""The batch norm's statistics as a convolution epilogue (adapter/tf/plugin/graph_fusion.h
rewrite 15; the kernel in adapter/compiler/ops/conv2d.cpp and conv_emitter.cpp), on the tiny
chip (a split chip of two cube cores, so the cube cores' barrier has two members).

- Keras Conv2D (with and without bias) -> BatchNormalization -> ReLU models trained three steps
  (SGD) run the convolution and its BNTrainingReduce as one Conv2DBNTrainingReduce op whose
  cube kernel's vector cores compute the sums (kernel name ending in _BNTrainingReduce), no
  BNTrainingReduce launch left (the partials' epilogue in that kernel too), one launch per
  batch norm and step fewer than with NPUSIM_FUSION_CONV_BN_REDUCE=0 (a child process: read
  once; unfused, BNTrainingReduce is one launch that adds its blocks' partials itself,
  docs/compiler.md, "The partials added by the sums' own kernel"), and the same losses and
  weights within f32 rounding (the sums are formed in another order; the variance comes from
  the sum of squares either way); likewise under allow_mix_precision (y and the sums in
  float16 -> f32: the same f16 values summed in f32 in another order);
- the statistics against numpy: a hand-written training batch norm (as Keras 3 writes it) over
  a tf.nn.conv2d returns the batch mean and variance, which match numpy's of the convolution's
  output as the NPU computed it (the conv output fetched too: its other reader keeps y written);
- patterns that must not fuse stay unfused with CPU-equal results: the batch norm in inference
  mode (no BNTrainingReduce at all), and a BNTrainingReduce whose x is not the convolution's
  output itself (the convolution scaled first);
- the CNN of models/ trained three steps with Adam in whole-graph mode with the fusion tracks
  node-by-node execution without it (NPUSIM_GRAPH=0 NPUSIM_FUSION_CONV_BN_REDUCE=0).
"""

import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import (  # noqa: E402  pylint: disable=wrong-import-position
    CONV_BN_RELU_TRAIN, assert_close_lists, child_result, second_call, training_batch_norm_relu)

OFF = {"NPUSIM_FUSION_CONV_BN_REDUCE": "0"}
MIX = {"NPUSIM_PRECISION_MODE": "allow_mix_precision"}


# Keras Conv2D [bias] -> BatchNormalization -> ReLU twice -> pool -> Dense, three SGD steps on
# the NPU.
KERAS_CODE = CONV_BN_RELU_TRAIN + r'''
import json


def train(use_bias):
    return train_conv_bn_relu("/NPU:0", use_bias, blocks=2)


print("RESULT " + json.dumps({"bias": train(True), "no_bias": train(False)}))
'''


@pytest.fixture(scope="module")
def keras_runs():
    return {"fp32": (child_result(KERAS_CODE), child_result(KERAS_CODE, extra_env=OFF)),
            "mix": (child_result(KERAS_CODE, extra_env=MIX),
                    child_result(KERAS_CODE, extra_env=dict(MIX, **OFF)))}


@pytest.mark.parametrize("mode", ["fp32", "mix"])
@pytest.mark.parametrize("bias", ["bias", "no_bias"])
def test_keras_training_fused_matches_unfused(keras_runs, mode, bias):
    fused, unfused = (run[bias] for run in keras_runs[mode])
    fused_types = {t for t, _ in fused["ops"]}
    unfused_types = {t for t, _ in unfused["ops"]}
    assert "Conv2DBNTrainingReduce" in fused_types and "BNTrainingReduce" not in fused_types, \
        fused["ops"]
    assert "BNTrainingReduce" in unfused_types and "Conv2DBNTrainingReduce" not in unfused_types
    # The sums and their epilogue in the convolution's own kernel (its vector cores), not
    # launches of their own.
    fused_kernels = {k for t, k in fused["ops"] if t == "Conv2DBNTrainingReduce"}
    assert any(k.endswith("_BNTrainingReduce") for k in fused_kernels), fused_kernels
    assert not any(k.startswith("ChannelSum") for k in fused_kernels), fused_kernels
    assert "BNTrainingReduceSums" not in fused_kernels, fused_kernels
    # The last step's launches (fit_steps keeps those): two batch norms, each one's
    # BNTrainingReduce launch (its sums with their partials' epilogue) gone.
    assert fused["launches"] <= unfused["launches"] - 2, (fused["launches"], unfused["launches"])
    # f32 rounding of three steps (the sums in another order), as tests/tf/
    # test_fusion_bn_training.py's fused against unfused; in float16 the same f16 y values are
    # summed in f32 in another order, and three steps of SGD carry the differences on through
    # the f16 rounding of the next forward pass.
    rtol, atol = (1e-5, 1e-6) if mode == "fp32" else (2e-3, 2e-4)
    assert_close_lists(fused["losses"], unfused["losses"], rtol, atol)
    assert_close_lists(fused["weights"], unfused["weights"], 10 * rtol, 10 * atol)


# A training batch norm written as Keras 3 writes it (rewrite 0's pattern, its gradient taken
# for x, gamma and beta as Keras' is), over a convolution.
def _conv_bn(tf, variant):
    rng = np.random.default_rng(5)
    args = (tf.constant(rng.standard_normal((2, 7, 7, 8)).astype(np.float32)),
            tf.constant((rng.standard_normal((3, 3, 8, 16)) * 0.3).astype(np.float32)),
            tf.constant(rng.uniform(0.5, 2, 16).astype(np.float32)),
            tf.constant(rng.uniform(-1, 1, 16).astype(np.float32)))

    def f(x, w, gamma, beta):
        with tf.GradientTape() as tape:
            tape.watch([x, w, gamma, beta])
            c = tf.nn.conv2d(x, w, 1, "SAME")
            h = c * 2.0 if variant == "scaled" else c
            mean, var, y = training_batch_norm_relu(tf, h, gamma, beta)
            loss = tf.reduce_sum(y * tf.cast(tf.range(16), y.dtype))
        return [c, mean, var, y] + tape.gradient(loss, [x, w, gamma, beta])

    return f, args


def _run(npusim, tf, variant, device):
    outs, records = second_call(npusim, tf, *_conv_bn(tf, variant), device)
    return outs, {r["op_type"] for r in records}


def test_statistics_match_numpy_of_the_conv_output(npusim, tf):
    outs, types = _run(npusim, tf, "plain", "/NPU:0")
    assert "Conv2DBNTrainingReduce" in types and "BNTrainingReduce" not in types, types
    c, mean, var = outs[0], outs[1], outs[2]
    # numpy's statistics of the y the NPU wrote (the conv output is also fetched: read twice);
    # the kernel sums f32 values in f32 (relative error ~ pixels * 2^-24 of the sums) and the
    # variance is E[y^2] - mean^2 (CANN's one pass).
    want_mean = c.mean(axis=(0, 1, 2))
    want_var = c.var(axis=(0, 1, 2))
    scale = np.abs(c).max()
    np.testing.assert_allclose(mean, want_mean, rtol=0, atol=1e-5 * scale)
    np.testing.assert_allclose(var, want_var, rtol=1e-4, atol=1e-5 * scale * scale)
    # The whole function against TensorFlow on the CPU (the cube's fp16 operands).
    cpu, _ = _run(npusim, tf, "plain", "/CPU:0")
    for got, want in zip(outs, cpu):
        assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want)


def test_scaled_conv_output_stays_unfused(npusim, tf):
    outs, types = _run(npusim, tf, "scaled", "/NPU:0")
    assert "BNTrainingReduce" in types and "Conv2DBNTrainingReduce" not in types, types
    cpu, _ = _run(npusim, tf, "scaled", "/CPU:0")
    for got, want in zip(outs, cpu):
        assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want)


def test_inference_mode_batch_norm_stays_unfused(npusim, tf):
    import keras  # pylint: disable=import-outside-toplevel

    keras.utils.set_random_seed(0)
    inp = keras.Input((6, 6, 4))
    model = keras.Model(inp, keras.layers.ReLU()(keras.layers.BatchNormalization()(
        keras.layers.Conv2D(8, 3, use_bias=False)(inp))))
    x = tf.constant(np.random.default_rng(2).standard_normal((2, 6, 6, 4)).astype(np.float32))

    def step(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            loss = tf.reduce_sum(model(x, training=False))
        return tape.gradient(loss, [x] + model.trainable_variables)

    with tf.device("/CPU:0"):
        want = [g.numpy() for g in step(x)]
    with tf.device("/NPU:0"):
        fn = tf.function(step)
        fn(x)
        npusim.clear_launch_records()
        got = [g.numpy() for g in fn(x)]
    types = {r["op_type"] for r in npusim.launch_records()}
    assert not {"Conv2DBNTrainingReduce", "BNTrainingReduce"} & types, types
    for g, w in zip(got, want):
        assert np.linalg.norm(g - w) <= 1e-2 * np.linalg.norm(w)


# models/' CNN (2 x Conv2D without bias -> BatchNormalization -> ReLU -> MaxPool), three Adam
# steps; the last step's launches.
CNN_CODE = r'''
import json
import numpy as np
import npusim
import keras
import models

keras.utils.set_random_seed(0)
x, y = models.synthetic_data("cnn", batch=8, seed=1)
model = models.build("cnn", seed=3)
model.compile(optimizer="adam", loss=models.loss("cnn"))
losses = []
for step in range(3):
    npusim.clear_launch_records()
    losses.append(float(model.train_on_batch(x, y)))
recs = npusim.launch_records()
print("RESULT " + json.dumps({"losses": losses, "launches": len(recs),
                              "types": sorted({r["op_type"] for r in recs}),
                              "weights": [w.numpy().tolist() for w in model.weights]}))
'''


def test_cnn_whole_graph_fused_tracks_node_by_node_unfused():
    graph = child_result(CNN_CODE)
    nodes = child_result(CNN_CODE, extra_env=dict(OFF, NPUSIM_GRAPH="0"))
    assert "Conv2DBNTrainingReduce" in graph["types"] and "BNTrainingReduce" not in graph["types"]
    assert "BNTrainingReduce" in nodes["types"]
    # Two batch norms: their channel-sum and epilogue launches go (node by node also casts
    # again what a graph shares: docs/graph_engine.md "Casts shared inside a graph").
    assert graph["launches"] <= nodes["launches"] - 4, (graph["launches"], nodes["launches"])
    # f32 rounding (the statistics summed in another order: per tile, per weight key, the
    # partials in a pairwise fold), carried through three Adam steps. The one-pass variance's
    # cancellation leaves both orders within about 5e-6 of the exact variance at these layers
    # (against float64: 1e-6 to 5e-6 either way); the three steps turn the difference into
    # 1.2e-4 of the third loss (0.706218 against 0.706130, 2026-12-05). Adam moves a weight by
    # up to its learning rate (1e-3) a step whatever its gradient's size, so a weight whose
    # gradient is near 0 may differ by a good part of a step (one of the second convolution's
    # 4,608 by 4.4e-4): the weights are compared per tensor, the difference's norm against the
    # tensor's (measured: at most 8.0e-4, the first batch norm's beta, whose gradient is a sum
    # near 0; the convolutions' kernels 5.3e-5 and 1.1e-4).
    assert_close_lists(graph["losses"], nodes["losses"], 5e-4, 1e-6)
    assert len(graph["weights"]) == len(nodes["weights"])
    for g, w in zip(graph["weights"], nodes["weights"]):
        g, w = np.asarray(g), np.asarray(w)
        assert np.linalg.norm(g - w) <= 2e-3 * np.linalg.norm(w), g.shape
