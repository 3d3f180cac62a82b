"""A gradient's scaling folded into its variable update (adapter/tf/plugin/graph_fusion.h,
rewrite 5d): an optimizer that multiplies every gradient by a scale before the update (Keras'
`loss_scale_factor=k`: g * (1 / k); LossScaleOptimizer: g / scale) leaves that product a Mul or
RealDiv launch per variable where the update reads it in two chains (Adam's m and v); the
rewrite makes it the first step of the variable's FusedVariableUpdate.

- a Keras 3 MLP trained three steps with Adam and AdamW with `loss_scale_factor=1024` (the loss
  scaled in the tape, the gradients unscaled by the optimizer): no Mul launch is left in the
  optimizer's name scope (one per variable with NPUSIM_FUSION_UPDATE_SCALE=0), four launches
  fewer, the losses and weights bit for bit those of the rewrite-off run, and TensorFlow's on
  the CPU within the cube's fp16 tolerance;
- the same MLP under mixed_float16 with Keras' LossScaleOptimizer around Adam (a variable scale
  in the cond's apply branch): no RealDiv / Mul launch per variable is left there, bit for bit
  the rewrite-off run;
- a small CNN with Adam and `loss_scale_factor=1024` under allow_mix_precision: its six Muls
  fold; there the unfused Mul of a float16 gradient ran in float16 and the fused update
  multiplies in float32, so the weights are the rewrite-off run's within a stated bound, not
  bit for bit;
- hand-written Adam-like updates of three variables (m and v from the scaled gradient, w from
  their new values): the scale by a constant (Mul) and by a tensor (RealDiv) fold, bit for bit
  numpy's float32 values; a scaled gradient also returned by the function (read outside the
  update) must not fold and keeps its launch, with the same values.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import KERAS_SCALED_TRAIN, child_result  # noqa: E402  pylint: disable=wrong-import-position

OFF = {"NPUSIM_FUSION_UPDATE_SCALE": "0"}
VARIANTS = ("adam", "adamw", "mixed_float16")

# Runs in child processes: per variant, three training steps of a small MLP on `device`; the
# losses, weights and the last step's launches as [op type, op name].
KERAS_CODE = r'''
import json
import numpy as np
import npusim
import tensorflow as tf
import keras
''' + KERAS_SCALED_TRAIN + r'''

def train(device, variant):
    keras.mixed_precision.set_global_policy(
        "mixed_float16" if variant == "mixed_float16" else "float32")
    keras.utils.set_random_seed(0)
    with tf.device(device):
        # adam_conv: a convolution first (its filter gradient runs in float16 under
        # allow_mix_precision).
        first = ([keras.Input((8, 8, 3)), keras.layers.Conv2D(8, 3, activation="relu"),
                  keras.layers.Flatten()] if variant == "adam_conv" else [keras.Input((12,))])
        model = keras.Sequential(first + [keras.layers.Dense(16, activation="relu"),
                                          keras.layers.Dense(3, dtype="float32")])
        if variant == "adamw":
            opt = keras.optimizers.AdamW(0.01, weight_decay=0.05, loss_scale_factor=1024.0)
        elif variant in ("adam", "adam_conv"):
            opt = keras.optimizers.Adam(0.01, loss_scale_factor=1024.0)
        else:
            opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.01))
        rng = np.random.default_rng(0)
        x = tf.constant(rng.standard_normal(
            (8, 8, 8, 3) if variant == "adam_conv" else (8, 12)).astype(np.float32))
        y = tf.constant(rng.standard_normal((8, 3)).astype(np.float32))
        losses = scaled_train(model, opt, x, y)
    recs = npusim.launch_records() if device != "/CPU:0" else []
    return {"losses": losses, "weights": [np.asarray(w).tolist() for w in model.weights],
            "launches": [[r["op_type"], r["op_name"]] for r in recs]}


print("RESULT " + json.dumps({v: {"npu": train("/NPU:0", v), "cpu": train("/CPU:0", v)}
                              for v in VARIANTS}))
'''


@pytest.fixture(scope="module")
def keras_runs():
    code = KERAS_CODE.replace("VARIANTS", repr(VARIANTS))
    return child_result(code, timeout=900), child_result(code, timeout=900, extra_env=OFF)


def optimizer_launches(run, types):
    """The launches of `types` outside the forward and backward passes (the model's layers'
    name scopes: sequential/...)."""
    return [name for op, name in run["launches"] if op in types and not name.startswith(
        ("sequential", "gradient_tape"))]


@pytest.mark.parametrize("variant", VARIANTS)
def test_keras_scaled_updates_fold_bit_identical(keras_runs, variant):
    fused, unfused = keras_runs[0][variant]["npu"], keras_runs[1][variant]["npu"]
    cpu = keras_runs[0][variant]["cpu"]
    # Bit for bit the rewrite-off run: the update runs the scale's step with the op's own
    # instructions.
    assert fused["losses"] == unfused["losses"]
    assert fused["weights"] == unfused["weights"]
    # One scale per trainable variable (two kernels, two biases) in the rewrite-off run, none
    # left in the fused one; its launches are the others, one for one.
    scales = ("Mul", "RealDiv")
    assert len(optimizer_launches(unfused, scales)) >= 4, unfused["launches"]
    assert len(optimizer_launches(fused, scales)) == len(optimizer_launches(unfused, scales)) - 4
    assert len(fused["launches"]) == len(unfused["launches"]) - 4
    if variant == "mixed_float16":
        # LossScaleOptimizer's overflow check and cond; the NPU's half MatMuls against the CPU's.
        np.testing.assert_allclose(fused["losses"], cpu["losses"], rtol=2e-2, atol=1e-3)
        tol = dict(rtol=5e-2, atol=5e-3)
    else:
        # TensorFlow on the CPU (the MatMuls' operands go to the cube in fp16 on the NPU), as
        # tests/tf/test_fusion_variable_update.py's unscaled optimizers.
        np.testing.assert_allclose(fused["losses"], cpu["losses"], rtol=2e-3, atol=1e-5)
        tol = dict(rtol=2e-2, atol=2e-3)
    for got, want in zip(fused["weights"], cpu["weights"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), **tol)


@pytest.fixture(scope="module")
def mixed_runs():
    code = KERAS_CODE.replace("VARIANTS", repr(("adam_conv",)))
    env = {"NPUSIM_PRECISION_MODE": "allow_mix_precision"}
    return (child_result(code, timeout=900, extra_env=env),
            child_result(code, timeout=900, extra_env=dict(env, **OFF)))


def test_allow_mix_precision_scales_fold_in_float32(mixed_runs):
    # Under allow_mix_precision the precision pass runs the unfused Mul of a float16 gradient
    # (the filter's, a MatMul's) in float16 (then the Cast that rewrite 5c folds); the fused
    # update casts first
    # and multiplies in float32, as Keras' float32 optimizer writes it. So the weights are not
    # the rewrite-off run's bit for bit: they differ by the float16 rounding (and underflow) of
    # the unscaled gradient. Adam's step is about lr = 0.01 per element whatever the
    # gradient's size; a relative change of 2^-11 in g moves it by at most about 2 * 2^-11 of
    # it (m and sqrt(v) both scale with g), so by 1e-5 per step, 3e-5 over three (estimate; a
    # gradient float16 flushes to zero moves its step further).
    fused, unfused = mixed_runs[0]["adam_conv"]["npu"], mixed_runs[1]["adam_conv"]["npu"]
    cpu = mixed_runs[0]["adam_conv"]["cpu"]
    scales = ("Mul", "RealDiv")
    # Six trainable variables (filter, its bias, two Dense kernels and biases).
    assert len(optimizer_launches(fused, scales)) == len(optimizer_launches(unfused, scales)) - 6
    assert len(fused["launches"]) == len(unfused["launches"]) - 6
    # The step's forward pass reads the weights before the update: the same losses.
    assert fused["losses"] == unfused["losses"]
    for got, want in zip(fused["weights"], unfused["weights"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=0, atol=3e-5)
    np.testing.assert_allclose(fused["losses"], cpu["losses"], rtol=2e-3, atol=1e-5)
    for got, want in zip(fused["weights"], cpu["weights"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-2, atol=5e-3)


# Hand-written Adam-like updates (w reads the new m and v: one FusedVariableUpdate group) whose
# gradient is scaled first.
PATTERN_CODE = r'''
import json
import numpy as np
import npusim
import tensorflow as tf


def run(variant):
    rng = np.random.default_rng(5)
    g = tf.constant((rng.standard_normal((64,)) * 1024).astype(np.float32))
    m0, v0, w0 = (rng.standard_normal((64,)).astype(np.float32) for _ in range(3))
    with tf.device("/NPU:0"):
        m, v, w = tf.Variable(m0), tf.Variable(v0), tf.Variable(w0)
        s = tf.Variable(np.float32(1024.0))

        @tf.function
        def update(g):
            gs = g / s.read_value() if variant == "div_tensor" else g * (1.0 / 1024)
            m.assign_add((gs - m) * 0.25)
            v.assign_add((gs * gs - v) * 0.5)
            w.assign_sub(m.read_value() * 0.125 - v.read_value() * 0.0625)
            return gs if variant == "read_outside" else tf.constant(0.0)

        npusim.clear_launch_records()
        got = update(g).numpy()
    ops = [r["op_type"] for r in npusim.launch_records()]
    return {"m": m.numpy().tolist(), "v": v.numpy().tolist(), "w": w.numpy().tolist(),
            "ret": np.asarray(got).tolist(), "ops": ops, "g": g.numpy().tolist(),
            "m0": m0.tolist(), "v0": v0.tolist(), "w0": w0.tolist()}


print("RESULT " + json.dumps({v: run(v) for v in ("mul_const", "div_tensor", "read_outside")}))
'''


@pytest.fixture(scope="module")
def pattern_runs():
    return child_result(PATTERN_CODE), child_result(PATTERN_CODE, extra_env=OFF)


@pytest.mark.parametrize("variant", ["mul_const", "div_tensor", "read_outside"])
def test_pattern_variants(pattern_runs, variant):
    run, off = pattern_runs[0][variant], pattern_runs[1][variant]
    f32 = np.float32
    g, m, v, w = (np.asarray(run[k], f32) for k in ("g", "m0", "v0", "w0"))
    gs = g / f32(1024) if variant == "div_tensor" else g * f32(1.0 / 1024)
    m = m + (gs - m) * f32(0.25)
    v = v + (gs * gs - v) * f32(0.5)
    w = w - (m * f32(0.125) - v * f32(0.0625))
    for key, want in (("m", m), ("v", v), ("w", w)):
        np.testing.assert_array_equal(np.asarray(run[key], f32), want)
        assert run[key] == off[key]
    if variant == "read_outside":
        np.testing.assert_array_equal(np.asarray(run["ret"], f32), gs)
    scale_op = "RealDiv" if variant == "div_tensor" else "Mul"
    assert run["ops"].count("FusedVariableUpdate") == 1, run["ops"]
    assert off["ops"].count(scale_op) == 1, off["ops"]
    # Folded unless the scaled gradient has a reader outside the update.
    assert run["ops"].count(scale_op) == (1 if variant == "read_outside" else 0), run["ops"]
    assert len(run["ops"]) == len(off["ops"]) - (0 if variant == "read_outside" else 1)
