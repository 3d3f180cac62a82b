"""The residual add and its ReLU in the training batch norm (adapter/tf/plugin/graph_fusion.h,
rewrite 0c; the kernel in adapter/compiler/ops/batchnorm.cpp, BNTrainingUpdate with R = 1):
AddRelu(y, r) where y is a BNTrainingUpdate's output read by the add alone and r an activation
becomes that BNTrainingUpdate with r as its residual and the ReLU after the add; the AddRelu's
launch and y's pass through HBM go.

- a Keras residual CNN (a stem, two identity blocks, the second's shortcut the first's fused
  output, and a projection block whose shortcut is a batch norm's y) trained three SGD steps,
  in float32 and under allow_mix_precision (the batch norms and adds in float16): the same
  losses and weights bit for bit as with NPUSIM_FUSION_BN_ADD_RELU=0 in a child process (the
  kernel adds and clamps with the AddRelu kernel's instructions on y rounded to T, and the
  backward reads the same values), no AddRelu launch where the unfused step has three, and
  TensorFlow's on the CPU within the cube's fp16 operands (and float16 activations);
- hand-written patterns (Keras 3's batch norm, which rewrite 0 fuses): relu(y + relu(x2))
  folds; y also read elsewhere, and an add of a broadcast [C] bias, keep their AddRelu; all
  agree with the CPU.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import (  # noqa: E402  pylint: disable=wrong-import-position
    FIT_STEPS, KERAS3_BN_PATTERN, assert_close_lists, child_result, runs_with_and_without)

KERAS_CODE = FIT_STEPS + r'''
import json
import numpy as np
import npusim
import tensorflow as tf
import keras


def conv_bn(h, filters, kernel):
    h = keras.layers.Conv2D(filters, kernel, padding="same", use_bias=False)(h)
    return keras.layers.BatchNormalization()(h)


def train(device):
    keras.utils.set_random_seed(0)
    with tf.device(device):
        inp = keras.Input((8, 8, 3))
        a = keras.layers.ReLU()(conv_bn(inp, 16, 3))
        for _ in range(2):  # identity blocks: the shortcut a block's input
            a = keras.layers.ReLU()(keras.layers.Add()([conv_bn(a, 16, 3), a]))
        # a projection block: the shortcut a batch norm's y
        a = keras.layers.ReLU()(keras.layers.Add()([conv_bn(a, 24, 3), conv_bn(a, 24, 1)]))
        h = keras.layers.GlobalAveragePooling2D()(a)
        model = keras.Model(inp, keras.layers.Dense(4)(h))
        rng = np.random.default_rng(0)
        x = tf.constant(rng.standard_normal((4, 8, 8, 3)).astype(np.float32))
        y = tf.constant(rng.standard_normal((4, 4)).astype(np.float32))
        losses = fit_steps(model, keras.optimizers.SGD(0.1), x, y, device)
    recs = npusim.launch_records() if device != "/CPU:0" else []
    counts = {}
    for r in recs:
        counts[r["op_type"]] = counts.get(r["op_type"], 0) + 1
    return {"losses": losses, "weights": [w.numpy().tolist() for w in model.weights],
            "launches": len(recs), "counts": counts,
            "kernels": sorted({r["kernel"] for r in recs})}


print("RESULT " + json.dumps({"npu": train("/NPU:0"), "cpu": train("/CPU:0")}))
'''

OFF = {"NPUSIM_FUSION_BN_ADD_RELU": "0"}
U = 2.0 ** -11  # f16's unit roundoff


@pytest.fixture(scope="module", params=["float32", "mixed"])
def keras_runs(request):
    return runs_with_and_without(request.param, KERAS_CODE, OFF)


def test_keras_residual_blocks_fused_bit_for_bit(keras_runs):
    mode, on, off = keras_runs
    fused, unfused = on["npu"], off["npu"]
    assert unfused["counts"].get("AddRelu") == 3, unfused["counts"]
    assert "AddRelu" not in fused["counts"], fused["counts"]
    assert fused["launches"] == unfused["launches"] - 3
    assert fused["counts"]["BNTrainingUpdate"] == unfused["counts"]["BNTrainingUpdate"]
    t = "f16" if mode == "mixed" else "f32"
    assert f"BNTrainingUpdateAddRelu_{t}" in fused["kernels"], fused["kernels"]
    assert f"AddRelu_{t}" in unfused["kernels"], unfused["kernels"]
    assert fused["losses"] == unfused["losses"]
    assert fused["weights"] == unfused["weights"]


def test_keras_residual_blocks_against_cpu(keras_runs):
    mode, on, _ = keras_runs
    npu, cpu = on["npu"], on["cpu"]
    if mode == "mixed":  # test_allow_mix_precision.py's bound on the losses
        assert_close_lists(npu["losses"], cpu["losses"], 3 * 16 * U, 1e-5)
        assert_close_lists(npu["weights"], cpu["weights"], 5e-2, 1e-2)
    else:  # the convolutions' operands reach the cube in fp16
        assert_close_lists(npu["losses"], cpu["losses"], 1e-3, 1e-5)
        assert_close_lists(npu["weights"], cpu["weights"], 2e-2, 5e-3)


# The training batch norm as Keras 3 writes it (rewrite 0 fuses it), then the residual add and
# ReLU: fusible, or with y read elsewhere, or an add of a broadcast bias; or of a ReLU of that
# bias (an activation the pass takes, of another shape: the update then an AddRelu launch).
PATTERN_CODE = KERAS3_BN_PATTERN + r'''
def pattern(x, x2, gamma, beta, bias, variant):
    with tf.GradientTape() as tape:
        tape.watch([x, x2, gamma, beta, bias])
        z = keras3_batch_norm(x, gamma, beta)
        r = {"bias": bias, "relu_bias": tf.nn.relu(bias)}.get(variant, tf.nn.relu(x2))
        out = tf.nn.relu(z + r)
        loss = tf.reduce_sum(out * tf.cast(tf.range(8), out.dtype))
        if variant == "second_reader":
            loss += tf.reduce_sum(z * z)
    return [out] + tape.gradient(loss, [x, x2, gamma, beta, bias],
                                 unconnected_gradients="zero")


rng = np.random.default_rng(1)
run_pattern_variants(pattern, [rng.standard_normal((2, 4, 4, 8)).astype(np.float32),
                               rng.standard_normal((2, 4, 4, 8)).astype(np.float32),
                               rng.uniform(0.5, 2, 8).astype(np.float32),
                               rng.uniform(-1, 1, 8).astype(np.float32),
                               rng.uniform(-1, 1, 8).astype(np.float32)],
                     ("fusible", "second_reader", "bias", "relu_bias"))
'''


@pytest.fixture(scope="module")
def pattern_runs():
    return child_result(PATTERN_CODE)


@pytest.mark.parametrize("variant", ["fusible", "second_reader", "bias", "relu_bias"])
def test_pattern_variants(pattern_runs, variant):
    run = pattern_runs[variant]
    types = set(run["npu"]["types"])
    assert "BNTrainingUpdate" in types, types  # rewrite 0 took the batch norm in every variant
    assert ("AddRelu" in types) == (variant not in ("fusible", "relu_bias")), types
    for got, want in zip(run["npu"]["outs"], run["cpu"]["outs"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
