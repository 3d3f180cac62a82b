"""The ReLU's gradient folded into the training batch norm's gradient (adapter/tf/plugin/
graph_fusion.h, rewrite 0b; the kernels in adapter/compiler/ops/batchnorm.cpp, relu = true):
ReluGrad(g, y) of a BNTrainingUpdate(relu = true) read only by that batch norm's
BNTrainingUpdateGrad and BNTrainingReduceGrad goes, and both mask g themselves.

- a Keras Conv2D + BatchNormalization + ReLU model trained three steps (SGD) gives the same
  losses and weights as with NPUSIM_FUSION_BN_RELU_GRAD=0 in a child process (the mask is
  ReluGrad's bit for bit: the fused kernels recompute the ReLU's pre-activation with the
  forward pass's instructions) and, within the cube's fp16 operands, as TensorFlow on the CPU;
  without the ReluGrad launch (one launch fewer per step);
- under allow_mix_precision the fold runs after the mixed precision pass, on the float16
  ReluGrad and gradients it leaves: the same model's losses and weights as with
  NPUSIM_FUSION_BN_RELU_GRAD=0 (f16 kernels: the masked sums' tiles may differ, so within a
  few f16 roundings of the activations' gradients) and as TensorFlow on the CPU within the
  mixed precision tolerance of tests/tf/test_allow_mix_precision.py, without the ReluGrad
  launch; the kernels' bits against the unfolded chain are checked in
  tests/compiler/test_compiler_bn_training.cpp;
- patterns that must not fold keep their ReluGrad and still compute the CPU's results: the
  ReluGrad's output also read by another node, and fetched itself; the same hand-written
  pattern with neither folds and agrees with the CPU.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import (  # noqa: E402  pylint: disable=wrong-import-position
    CONV_BN_RELU_TRAIN, KERAS3_BN_PATTERN, assert_close_lists, child_result)

KERAS_CODE = CONV_BN_RELU_TRAIN + r'''
import json
print("RESULT " + json.dumps({"npu": train_conv_bn_relu("/NPU:0"),
                              "cpu": train_conv_bn_relu("/CPU:0")}))
'''

# The training batch norm as Keras 3 writes it (rewrite 0 fuses it), with a ReLU whose
# gradient is also read elsewhere in the variants that must not fold.
PATTERN_CODE = KERAS3_BN_PATTERN + r'''
def pattern(x, gamma, beta, variant):
    with tf.GradientTape() as tape:
        tape.watch([x, gamma, beta])
        z = keras3_batch_norm(x, gamma, beta)
        y = tf.nn.relu(z)
        loss = tf.reduce_sum(y * tf.cast(tf.range(8), y.dtype))
    if variant == "fusible":
        return [y] + tape.gradient(loss, [x, gamma, beta])
    grads = tape.gradient(loss, [x, gamma, beta, z])  # dz: the ReluGrad's output
    extra = [grads[3] * 3.0] if variant == "second_consumer" else [grads[3]]
    return [y] + grads[:3] + extra


rng = np.random.default_rng(1)
run_pattern_variants(pattern, [rng.standard_normal((2, 4, 4, 8)).astype(np.float32),
                               rng.uniform(0.5, 2, 8).astype(np.float32),
                               rng.uniform(-1, 1, 8).astype(np.float32)],
                     ("fusible", "second_consumer", "fetched"))
'''


def test_keras_training_folded_matches_unfolded_and_cpu():
    folded = child_result(KERAS_CODE)
    unfolded = child_result(KERAS_CODE, extra_env={"NPUSIM_FUSION_BN_RELU_GRAD": "0"})
    assert "ReluGrad" not in folded["npu"]["types"]
    assert "ReluGrad" in unfolded["npu"]["types"]
    assert {"BNTrainingUpdateGrad", "BNTrainingReduceGrad"} <= set(folded["npu"]["types"])
    # One ReluGrad launch per training step fewer (fit_steps: three steps and a warm-up).
    assert folded["npu"]["launches"] < unfolded["npu"]["launches"]
    # The mask is ReluGrad's and the sums see the same masked gradient: f32 rounding alone.
    assert_close_lists(folded["npu"]["losses"], unfolded["npu"]["losses"], 1e-6, 1e-7)
    assert_close_lists(folded["npu"]["weights"], unfolded["npu"]["weights"], 1e-5, 1e-7)
    # TensorFlow on the CPU: the convolution's operands reach the cube in fp16 on the NPU.
    assert_close_lists(folded["npu"]["losses"], folded["cpu"]["losses"], 1e-3, 1e-5)
    assert_close_lists(folded["npu"]["weights"], folded["cpu"]["weights"], 2e-2, 5e-3)


MIX = {"NPUSIM_PRECISION_MODE": "allow_mix_precision"}
U = 2.0 ** -11  # f16's unit roundoff


def test_keras_training_mixed_precision_folded_in_float16():
    folded = child_result(KERAS_CODE, extra_env=MIX)
    unfolded = child_result(KERAS_CODE, extra_env=dict(MIX, NPUSIM_FUSION_BN_RELU_GRAD="0"))
    assert "ReluGrad" not in folded["npu"]["types"]
    assert ["ReluGrad", "ReluGrad_f16"] in unfolded["npu"]["ops"]
    # the folded dx pass in float16 (f32 has its own kernel name)
    assert ["BNTrainingReduceGrad", "BNTrainingReduceGradRelu_f16"] in folded["npu"]["ops"]
    assert folded["npu"]["launches"] < unfolded["npu"]["launches"]
    # The mask is ReluGrad's on the f16 y; the sums may add in other tiles (f32 rounding), which
    # can move dx's f16 rounding by an ulp: a few U on the weights after three steps.
    assert_close_lists(folded["npu"]["losses"], unfolded["npu"]["losses"], 4 * U, 1e-6)
    assert_close_lists(folded["npu"]["weights"], unfolded["npu"]["weights"], 8 * U, 1e-4)
    # TensorFlow on the CPU in float32: test_allow_mix_precision.py's bound on the losses.
    assert_close_lists(folded["npu"]["losses"], folded["cpu"]["losses"], 3 * 16 * U, 1e-5)


@pytest.fixture(scope="module")
def pattern_runs():
    return child_result(PATTERN_CODE)


@pytest.mark.parametrize("variant", ["fusible", "second_consumer", "fetched"])
def test_pattern_variants(pattern_runs, variant):
    run = pattern_runs[variant]
    types = set(run["npu"]["types"])
    assert "BNTrainingReduceGrad" in types  # rewrite 0 took the batch norm in every variant
    assert ("ReluGrad" in types) == (variant != "fusible")
    for got, want in zip(run["npu"]["outs"], run["cpu"]["outs"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
