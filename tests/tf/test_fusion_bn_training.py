"""The training batch-norm fusion (adapter/tf/plugin/graph_fusion.h, rewrite 0; the kernels'
formulas in adapter/compiler/ops/batchnorm.cpp): Keras 3's BatchNormalization in training and
its gradient become BNTrainingReduce, BNTrainingUpdate, BNTrainingUpdateGrad and
BNTrainingReduceGrad.

- a Keras Conv2D + BatchNormalization + ReLU model trained three steps (SGD) gives the same
  losses, weights and moving statistics as with NPUSIM_FUSION_BN_TRAINING=0 in a child process
  (within f32 rounding: the fused kernels sum in another order, and the variance comes from the
  sum of squares) and, within the cube's fp16 operands, as TensorFlow on the CPU, in fewer
  launches; the fused launches carry the
  original node names; likewise with the channel axis given as 3 (Keras then reshapes the
  per-channel tensors to [1, 1, 1, C]) and a batch of one (grappler drops the unit axis from
  the gradient's Sums), and for batch norms without a scale (Keras' scale=False, as in
  InceptionV3: no Mul by gamma, the fused ops read a Const of ones);
- x read besides the batch norm (a pre-activation block's identity shortcut, as ResNet50V2's
  preact_bn: x's gradient sums the shortcut's beside the batch norm's) fuses too, the
  BNTrainingReduceGrad summed with the other gradient, and computes the CPU's results;
- patterns that must not fuse stay unfused and still compute the CPU's results: the same batch
  norm in inference mode inside a training step, a second consumer of an intermediate of the
  pattern (the normalisation factor also read by another node), and the pattern in float16 (the
  rewrite matches float32 graphs; under allow_mix_precision the graph pass of
  adapter/tf/plugin/mixed_precision.h turns the fused ops to float16 after it); a hand-written
  copy of the pattern in float32 does fuse.
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
    CONV_BN_RELU_TRAIN, assert_close_lists, child_result)

BN_TYPES = {"BNTrainingReduce", "BNTrainingUpdate", "BNTrainingUpdateGrad",
            "BNTrainingReduceGrad"}

# Runs in child processes: a Keras training run on `device`, its losses, weights and launches.
KERAS_CODE = CONV_BN_RELU_TRAIN + r'''
import json

out = {}
# axis 3 with a batch of one: grappler drops the unit batch axis from the gradient's Sums;
# "-1 noscale" / "3 noscale": the same without the batch norms' scale (gamma)
for axis, batch in ((-1, 4), (3, 1)):
    for scale in (True, False):
        key = str(axis) + ("" if scale else " noscale")
        out[key] = {"npu": train_conv_bn_relu("/NPU:0", axis=axis, batch=batch, scale=scale,
                                              blocks=1 if scale else 2),
                    "cpu": train_conv_bn_relu("/CPU:0", axis=axis, batch=batch, scale=scale,
                                              blocks=1 if scale else 2)}
print("RESULT " + json.dumps(out))
'''

# Hand-written copies of the pattern (tf.nn.moments + tf.nn.batch_normalization, as Keras 3
# writes them) with their gradient, in variants that must not fuse.
PATTERN_CODE = r'''
import json
import numpy as np
import npusim
import tensorflow as tf


def pattern(x, gamma, beta, variant):
    with tf.GradientTape() as tape:
        tape.watch([x, gamma, beta])
        mean = tf.reduce_mean(x, [0, 1, 2], keepdims=True)
        var = tf.reduce_mean(tf.math.squared_difference(x, tf.stop_gradient(mean)), [0, 1, 2],
                             keepdims=True)
        mean, var = tf.squeeze(mean, [0, 1, 2]), tf.squeeze(var, [0, 1, 2])
        inv = tf.math.rsqrt(var + 1e-3) * gamma
        y = tf.nn.relu(x * inv + (beta - mean * inv))
        # A pre-activation block's identity shortcut (ResNet50V2's preact_bn): x also feeds an
        # Add, so x's gradient sums the shortcut's beside the batch norm's three parts.
        out = y + x if variant == "shortcut" else y
        loss = tf.reduce_sum(out * tf.cast(tf.range(8), y.dtype))
    grads = tape.gradient(loss, [x, gamma, beta])
    # A node of the graph reading inv besides the pattern (a fetch of inv itself would be
    # preserved, which keeps it anyway).
    extra = [inv * 3.0] if variant == "second_consumer" else []
    return [y, mean, var] + grads + extra


def run(variant, device):
    dt = np.float16 if variant == "float16" else np.float32
    rng = np.random.default_rng(1)
    args = [tf.constant(rng.standard_normal((2, 4, 4, 8)).astype(dt)),
            tf.constant(rng.uniform(0.5, 2, 8).astype(dt)),
            tf.constant(rng.uniform(-1, 1, 8).astype(dt))]
    with tf.device(device):
        npusim.clear_launch_records()
        outs = tf.function(lambda *a: pattern(*a, variant))(*args)
        outs = [o.numpy().astype(np.float64).tolist() for o in outs]
    return {"outs": outs, "ops": sorted({r["op_type"] for r in npusim.launch_records()})}


def inference_in_training(device):
    import keras
    keras.utils.set_random_seed(0)
    with tf.device(device):
        inp = keras.Input((4, 4, 8))
        bn = keras.layers.BatchNormalization()
        model = keras.Model(inp, keras.layers.ReLU()(bn(inp)))
        x = tf.constant(np.random.default_rng(2).standard_normal((2, 4, 4, 8)).astype(np.float32))

        @tf.function
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                loss = tf.reduce_sum(model(x, training=False))
            return tape.gradient(loss, [x] + model.trainable_variables)

        npusim.clear_launch_records()
        grads = [g.numpy().tolist() for g in step(x)]
    return {"grads": grads, "ops": sorted({r["op_type"] for r in npusim.launch_records()})}


out = {v: {"npu": run(v, "/NPU:0"), "cpu": run(v, "/CPU:0")}
       for v in ("fusible", "shortcut", "second_consumer", "float16")}
out["inference"] = {"npu": inference_in_training("/NPU:0"),
                    "cpu": inference_in_training("/CPU:0")}
print("RESULT " + json.dumps(out))
'''


# Rewrite 0 alone: rewrite 15 (the BNTrainingReduce taken into the convolution before it,
# tests/tf/test_fusion_conv_bn_reduce.py) off, so that all four ops stay visible.
CONV_BN_REDUCE_OFF = {"NPUSIM_FUSION_CONV_BN_REDUCE": "0"}


@pytest.fixture(scope="module")
def keras_runs():
    return (child_result(KERAS_CODE, extra_env=CONV_BN_REDUCE_OFF),
            child_result(KERAS_CODE,
                         extra_env=dict(CONV_BN_REDUCE_OFF, NPUSIM_FUSION_BN_TRAINING="0")))


@pytest.mark.parametrize("axis", ["-1", "3", "-1 noscale", "3 noscale"])
def test_keras_training_fused_matches_unfused_and_cpu(keras_runs, axis):
    fused, unfused = keras_runs[0][axis], keras_runs[1][axis]
    fused_types = {t for t, _ in fused["npu"]["ops"]}
    assert BN_TYPES <= fused_types
    assert not BN_TYPES & {t for t, _ in unfused["npu"]["ops"]}
    assert fused["npu"]["launches"] < unfused["npu"]["launches"] - 10
    # f32 rounding of three steps (the statistics summed in another order, the variance
    # from the sum of squares); the moving variance and mean are among the weights.
    assert_close_lists(fused["npu"]["losses"], unfused["npu"]["losses"], 1e-5, 1e-6)
    # Two blocks (noscale): the first filter's gradient passes through both batch norms, whose
    # f32 differences add up (weights of magnitude 0.1: a few 1e-6 absolute).
    assert_close_lists(fused["npu"]["weights"], unfused["npu"]["weights"], 1e-4,
                       1e-5 if "noscale" in axis else 1e-6)
    # TensorFlow on the CPU: the convolution's operands go to the cube in fp16 (the default
    # precision mode) on the NPU, fused or not, so the weights agree to about 1e-3.
    assert_close_lists(fused["npu"]["losses"], fused["cpu"]["losses"], 1e-3, 1e-5)
    assert_close_lists(fused["npu"]["weights"], fused["cpu"]["weights"], 2e-2, 5e-3)
    # The fused launches keep the names of the nodes they replace.
    names = {t: n for t, n in fused["npu"]["names"] if t in BN_TYPES}
    assert names["BNTrainingReduce"].endswith("moments/variance")
    assert "re_lu" in names["BNTrainingUpdate"] and names["BNTrainingUpdate"].endswith("/Relu")
    # Without a scale there is no scale gradient: BNTrainingUpdateGrad takes the RsqrtGrad's
    # place.
    assert names["BNTrainingUpdateGrad"].endswith(
        "batchnorm/RsqrtGrad" if "noscale" in axis else "batchnorm/mul/Mul_1")
    assert names["BNTrainingReduceGrad"].startswith("AddN")
    # Both blocks' batch norms fused (the second block's is taken by rewrite 15 when it is on).
    if "noscale" in axis:
        counts = {}
        for t, _ in fused["npu"]["names"]:
            counts[t] = counts.get(t, 0) + 1
        assert all(counts[t] == 2 for t in BN_TYPES)


@pytest.fixture(scope="module")
def pattern_runs():
    return child_result(PATTERN_CODE)


@pytest.mark.parametrize("variant", ["fusible", "shortcut", "second_consumer", "float16"])
def test_pattern_variants(pattern_runs, variant):
    run = pattern_runs[variant]
    fused = BN_TYPES <= set(run["npu"]["ops"])
    assert fused == (variant in ("fusible", "shortcut"))
    if not fused:
        assert not BN_TYPES & set(run["npu"]["ops"])
    tol = 2e-2 if variant == "float16" else 1e-4
    for got, want in zip(run["npu"]["outs"], run["cpu"]["outs"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


def test_inference_mode_batch_norm_is_not_a_training_fusion(pattern_runs):
    run = pattern_runs["inference"]
    assert not BN_TYPES & set(run["npu"]["ops"])
    for got, want in zip(run["npu"]["grads"], run["cpu"]["grads"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
