"""The training batch-norm fusion (adapter/tf/plugin/graph_fusion.h, rewrite 0) under Keras' loss
scaling: the optimizer multiplies the loss by its scale and every gradient by 1 / scale before
the update. With a constant scale (`loss_scale_factor`) grappler's constant folding pushes the
gradient's factor into the scale's gradient, Mul(Mul(AddN, rsqrt), k) -> Mul(AddN, Mul(k,
rsqrt)); the rewrite takes that form too, and k stays a Mul reading BNTrainingUpdateGrad's
diff_scale.

- a Keras model of two Conv2D + BatchNormalization + ReLU blocks, Dense, SGD with momentum,
  trained three steps with `loss_scale_factor=128`, with the mixed_float16 policy and the same
  constant scale, and with the mixed_float16 policy and its LossScaleOptimizer (a dynamic
  scale: a variable, which constant folding leaves alone; that one fused before too): both batch
  norms fuse (two of each BNTraining* launch a step), and the losses and weights track the run
  with NPUSIM_FUSION_BN_TRAINING=0, the fused run without a loss scale (float32: the scale
  cancels) and TensorFlow on the CPU;
- a hand-written batch norm (tf.nn.moments + the affine chain, as Keras 3 writes it) whose
  gradients are scaled by a constant fuses in float32 and stays unfused in float16 (the rewrite
  matches float32 graphs); both compute the CPU's values.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import (  # noqa: E402  pylint: disable=wrong-import-position
    KERAS3_BN_PATTERN, KERAS_SCALED_TRAIN, assert_close_lists, child_result)

BN_TYPES = ("BNTrainingReduce", "BNTrainingUpdate", "BNTrainingUpdateGrad",
            "BNTrainingReduceGrad")
VARIANTS = ("loss_scale_factor", "mixed_float16_loss_scale_factor", "mixed_float16")
# The child runs "unscaled" too: the same model without a loss scale.
RUNS = ("unscaled",) + VARIANTS

# Runs in child processes: each variant trained on the NPU and on the CPU; the losses, weights
# and the last step's launches by op type.
KERAS_CODE = r'''
import collections
import json
import numpy as np
import npusim
import tensorflow as tf
import keras
''' + KERAS_SCALED_TRAIN + r'''

def train(device, variant):
    keras.mixed_precision.set_global_policy(
        "mixed_float16" if variant.startswith("mixed_float16") else "float32")
    keras.utils.set_random_seed(0)
    with tf.device(device):
        inp = keras.Input((8, 8, 3))
        h = inp
        for conv in (dict(filters=16, kernel_size=3, padding="same"),
                     dict(filters=32, kernel_size=1)):
            h = keras.layers.Conv2D(**conv, use_bias=False)(h)
            h = keras.layers.BatchNormalization()(h)
            h = keras.layers.ReLU()(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        model = keras.Model(inp, keras.layers.Dense(4, dtype="float32")(h))
        scale = {} if variant in ("mixed_float16", "unscaled") else {"loss_scale_factor": 128.0}
        opt = keras.optimizers.SGD(0.1, momentum=0.9, **scale)
        if variant == "mixed_float16":
            opt = keras.optimizers.LossScaleOptimizer(opt)
        rng = np.random.default_rng(0)
        x = tf.constant(rng.standard_normal((4, 8, 8, 3)).astype(np.float32))
        y = tf.constant(rng.standard_normal((4, 4)).astype(np.float32))
        losses = scaled_train(model, opt, x, y)
    recs = npusim.launch_records() if device != "/CPU:0" else []
    return {"losses": losses, "weights": [np.asarray(w).tolist() for w in model.weights],
            "launches": len(recs),
            "types": collections.Counter(r["op_type"] for r in recs)}


print("RESULT " + json.dumps({v: {"npu": train("/NPU:0", v), "cpu": train("/CPU:0", v)}
                              for v in RUNS}))
'''.replace("RUNS", repr(RUNS))

# A hand-written batch norm (conftest's keras3_batch_norm) whose gradients are scaled by a
# constant k (constant folding pushes k into the scale's gradient as in Keras' graph), in float32
# and in float16 (rewrite 0 matches float32 graphs).
PATTERN_CODE = KERAS3_BN_PATTERN + r'''
def pattern(x, gamma, beta, dtype):
    x, gamma, beta = [tf.cast(t, dtype) for t in (x, gamma, beta)]
    with tf.GradientTape() as tape:
        tape.watch([x, gamma, beta])
        y = tf.nn.relu(keras3_batch_norm(x, gamma, beta))
        loss = tf.reduce_sum(y * tf.cast(tf.range(8), y.dtype)) * 128.0
    return [y] + [g * (1.0 / 128) for g in tape.gradient(loss, [x, gamma, beta])]


rng = np.random.default_rng(1)
args = [rng.standard_normal((2, 4, 4, 8)).astype(np.float32),
        rng.uniform(0.5, 2, 8).astype(np.float32), rng.uniform(-1, 1, 8).astype(np.float32)]
run_pattern_variants(pattern, args, ["float32", "float16"])
'''


@pytest.fixture(scope="module")
def keras_runs():
    return (child_result(KERAS_CODE, timeout=900),
            child_result(KERAS_CODE, timeout=900, extra_env={"NPUSIM_FUSION_BN_TRAINING": "0"}))


@pytest.mark.parametrize("variant", VARIANTS)
def test_loss_scaled_training_fuses_and_matches_unfused_and_cpu(keras_runs, variant):
    fused, unfused = keras_runs[0][variant], keras_runs[1][variant]
    # Both batch norms fused, in both passes (the reduce may have gone into the convolution
    # before it: rewrite 15's Conv2DBNTrainingReduce).
    types = fused["npu"]["types"]
    for t in BN_TYPES[1:]:
        assert types.get(t, 0) == 2, (t, types)
    assert types.get("BNTrainingReduce", 0) + types.get("Conv2DBNTrainingReduce", 0) >= 2
    assert not set(BN_TYPES) & set(unfused["npu"]["types"])
    assert fused["npu"]["launches"] < unfused["npu"]["launches"] - 20
    # Three steps of SGD with momentum carry the fused kernels' f32 rounding (the statistics
    # summed in another order, the variance from the sum of squares) forward: the model without
    # a loss scale differs from its own unfused run by as much (up to about 8e-5 on a weight).
    close = dict(losses=(2e-4, 1e-6), weights=(1e-3, 2e-4))
    for key, (rtol, atol) in close.items():
        assert_close_lists(fused["npu"][key], unfused["npu"][key], rtol, atol)
        # The scale cancels: as the fused run without one.
        if not variant.startswith("mixed_float16"):
            assert_close_lists(fused["npu"][key], keras_runs[0]["unscaled"]["npu"][key], rtol,
                               atol)
    # TensorFlow on the CPU: the cube's fp16 operands, as in tests/tf/test_fusion_bn_training.py.
    assert_close_lists(fused["npu"]["losses"], fused["cpu"]["losses"], 1e-3, 1e-5)
    assert_close_lists(fused["npu"]["weights"], fused["cpu"]["weights"], 2e-2, 5e-3)


@pytest.fixture(scope="module")
def pattern_runs():
    return child_result(PATTERN_CODE)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_scaled_pattern_fuses_in_float32_only(pattern_runs, dtype):
    run = pattern_runs[dtype]
    types = set(run["npu"]["types"])
    if dtype == "float32":
        assert set(BN_TYPES) <= types
    else:
        assert not set(BN_TYPES) & types
    tol = 2e-2 if dtype == "float16" else 1e-4
    for got, want in zip(run["npu"]["outs"], run["cpu"]["outs"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)
