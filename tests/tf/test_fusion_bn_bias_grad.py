"""A convolution's bias gradient in the batch norm's x gradient (adapter/tf/plugin/graph_fusion.h
rewrite 0d; the kernel in adapter/compiler/ops/batchnorm.cpp and channel.cpp), on the tiny chip
(split: the blocks add their partials after a barrier in the same kernel) and with
NPUSIM_FUSION_CHANNEL_EPILOGUE=0 (the partials added by an epilogue launch after it, as on a
coupled chip).

- Keras Conv2D with a bias -> BatchNormalization -> ReLU models trained three steps (SGD): each
  convolution's BiasAddGrad is BNTrainingReduceGrad's output 1 (no BiasAddGrad launch of that
  name; its name kept in the fused node's), one launch per convolution and step fewer than with
  NPUSIM_FUSION_BN_BIAS_GRAD=0 (a child process: read once), the same losses and weights within
  f32 rounding (the sum formed in another order; under allow_mix_precision the fused sum adds
  the f32 dx before its rounding to float16, the unfused one the float16 dx), and TensorFlow's
  on the CPU within the cube's fp16 operands; the Dense layer's BiasAddGrad (it reads the
  MatMul's gradient, not a batch norm's) stays a launch of its own;
- the bias gradient against numpy: a hand-written training batch norm over
  bias_add(conv2d(x, w), b) returns dx (the gradient at the convolution's output, fetched: its
  other reader) and the bias gradient, which is the per-channel sum of that dx;
- a BiasAddGrad of the same dx summing along another axis (data_format NCHW) stays unfused.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import (  # noqa: E402  pylint: disable=wrong-import-position
    CONV_BN_RELU_TRAIN, assert_close_lists, child_result, second_call, training_batch_norm_relu)

OFF = {"NPUSIM_FUSION_BN_BIAS_GRAD": "0"}
MIX = {"NPUSIM_PRECISION_MODE": "allow_mix_precision"}
TWO_LAUNCHES = {"NPUSIM_FUSION_CHANNEL_EPILOGUE": "0"}

# Keras Conv2D with bias -> BatchNormalization -> ReLU twice -> pool -> Dense, three SGD steps,
# on the NPU and on the CPU.
KERAS_CODE = CONV_BN_RELU_TRAIN + r'''
import json

print("RESULT " + json.dumps({"npu": train_conv_bn_relu("/NPU:0", True, blocks=2),
                              "cpu": train_conv_bn_relu("/CPU:0", True, blocks=2)}))
'''


@pytest.fixture(scope="module")
def keras_runs():
    return {"fp32": (child_result(KERAS_CODE), child_result(KERAS_CODE, extra_env=OFF)),
            "fp32_two_launches": (child_result(KERAS_CODE, extra_env=TWO_LAUNCHES),
                                  child_result(KERAS_CODE, extra_env=dict(TWO_LAUNCHES, **OFF))),
            "mix": (child_result(KERAS_CODE, extra_env=MIX),
                    child_result(KERAS_CODE, extra_env=dict(MIX, **OFF)))}


@pytest.mark.parametrize("mode", ["fp32", "fp32_two_launches", "mix"])
def test_keras_training_fused_matches_unfused_and_cpu(keras_runs, mode):
    fused_run, unfused_run = keras_runs[mode]
    fused, unfused = fused_run["npu"], unfused_run["npu"]
    # The convolutions' BiasAddGrads (named ".../conv2d.../BiasAddGrad") are gone; the Dense's
    # stays (it reads the MatMul's gradient).
    def bias_grads(run):
        return sorted(name for t, name in run["names"] if t == "BiasAddGrad")

    conv_bias_grads = [n for n in bias_grads(unfused) if "conv2d" in n]
    assert len(conv_bias_grads) == 2, bias_grads(unfused)
    assert bias_grads(fused) == [n for n in bias_grads(unfused) if "conv2d" not in n], \
        (bias_grads(fused), bias_grads(unfused))
    assert len(bias_grads(fused)) == 1, bias_grads(fused)
    assert "BNTrainingReduceGrad" in fused["types"]
    # One launch per convolution and step fewer (fit_steps keeps the last step's launches);
    # with the partials added by an epilogue launch (a coupled chip's way), that launch takes
    # the place of the BiasAddGrad's (these small ones' one reduction-engine launch).
    epilogues = [k for t, k in fused["ops"] if k == "BNTrainingReduceGradBiasSums"]
    if mode == "fp32_two_launches":
        assert epilogues, fused["ops"]
        assert fused["launches"] == unfused["launches"], (fused["launches"], unfused["launches"])
    else:
        assert not epilogues, fused["ops"]
        assert fused["launches"] == unfused["launches"] - 2, \
            (fused["launches"], unfused["launches"])
    # f32 rounding of three steps (the sums in another order); in float16 the fused sum adds
    # the f32 dx before its rounding to float16 (2^-11 relative each), carried on through the
    # next steps' f16 forward passes.
    rtol, atol = (1e-5, 1e-6) if mode != "mix" else (2e-3, 2e-4)
    assert_close_lists(fused["losses"], unfused["losses"], rtol, atol)
    assert_close_lists(fused["weights"], unfused["weights"], 10 * rtol, 10 * atol)
    # TensorFlow on the CPU: the cube's fp16 operands (and float16 activations under
    # allow_mix_precision) over three steps. A convolution's bias before a training batch norm
    # has a zero gradient in exact arithmetic (dx sums to 0 per channel), so the biases hold
    # what rounding left of it: a few 1e-4 under allow_mix_precision, on either device.
    cpu = fused_run["cpu"]
    noise = 1e-4 if mode != "mix" else 1e-3
    assert_close_lists(fused["losses"], cpu["losses"], 2e-2, 2e-3)
    for got, want in zip(fused["weights"], cpu["weights"]):
        got, want = np.asarray(got), np.asarray(want)
        assert np.linalg.norm(got - want) <= 2e-2 * np.linalg.norm(want) + noise


# A training batch norm written as Keras 3 writes it (rewrite 0's pattern) over a convolution
# with a bias; returns dx (the gradient at the convolution's output), the bias gradient of
# data_format `fmt` of that dx and the other gradients.
def _conv_bias_bn(tf, fmt):
    rng = np.random.default_rng(7)
    args = (tf.constant(rng.standard_normal((2, 7, 7, 8)).astype(np.float32)),
            tf.constant((rng.standard_normal((3, 3, 8, 16)) * 0.3).astype(np.float32)),
            tf.constant(rng.uniform(-1, 1, 16).astype(np.float32)),
            tf.constant(rng.uniform(0.5, 2, 16).astype(np.float32)),
            tf.constant(rng.uniform(-1, 1, 16).astype(np.float32)))

    def f(x, w, b, gamma, beta):
        with tf.GradientTape() as tape:
            tape.watch([x, w, gamma, beta])
            c = tf.nn.conv2d(x, w, 1, "SAME")
            _, _, y = training_batch_norm_relu(tf, tf.nn.bias_add(c, b), gamma, beta)
            loss = tf.reduce_sum(y * tf.cast(tf.range(16), y.dtype))
        dx, dw, dgamma, dbeta = tape.gradient(loss, [c, w, gamma, beta])
        db = tf.raw_ops.BiasAddGrad(out_backprop=dx, data_format=fmt)
        return [dx, db, dw, dgamma, dbeta]

    return f, args


def _run(npusim, tf, fmt, device):
    outs, records = second_call(npusim, tf, *_conv_bias_bn(tf, fmt), device)
    return outs, [(r["op_type"], r["op_name"]) for r in records]


def _check_sum_and_cpu(npusim, tf, fmt, outs, axes):
    """outs[1] (the bias gradient) is numpy's sum of outs[0] (dx) over `axes`, per channel:
    f32 sums of 98 f32 values err by at most ~100 * 2^-24 of the sum of |dx| (the sum itself is
    near 0: a bias before a training batch norm has a zero gradient in exact arithmetic, so only
    the sum of |dx| scales it); and the outputs are TensorFlow's on the CPU within the cube's
    fp16 operands (the bias gradient, a sum of such dx that nearly cancels, within 1e-2 of the
    sum of |dx|)."""
    dx, db = outs[0], outs[1]
    scale = np.abs(dx).sum(axis=axes)
    err = np.abs(db - dx.sum(axis=axes))
    assert np.all(err <= 1e-5 * scale), (err, scale)
    cpu, _ = _run(npusim, tf, fmt, "/CPU:0")
    assert np.all(np.abs(db - cpu[1]) <= 1e-2 * scale), (db, cpu[1], scale)
    for k, (got, want) in enumerate(zip(outs, cpu)):
        if k != 1:
            assert np.linalg.norm(got - want) <= 1e-2 * np.linalg.norm(want), k


def test_bias_grad_is_the_channel_sum_of_dx(npusim, tf):
    outs, launches = _run(npusim, tf, "NHWC", "/NPU:0")
    types = {t for t, _ in launches}
    assert "BNTrainingReduceGrad" in types and "BiasAddGrad" not in types, launches
    _check_sum_and_cpu(npusim, tf, "NHWC", outs, (0, 1, 2))


def test_bias_grad_along_another_axis_stays_unfused(npusim, tf):
    outs, launches = _run(npusim, tf, "NCHW", "/NPU:0")
    types = {t for t, _ in launches}
    assert "BNTrainingReduceGrad" in types and "BiasAddGrad" in types, launches
    _check_sum_and_cpu(npusim, tf, "NCHW", outs, (0, 2, 3))
