"""The variable-update fusion (adapter/tf/plugin/graph_fusion.h, rewrite 5; the kernel's
contract in adapter/compiler/ops/fused_elementwise.h): an optimizer's AssignAdd / AssignSub /
Assign VariableOps and the element-wise chains feeding them become one FusedVariableUpdate
launch per group of variables updated together.

- a Keras 3 MLP trained three steps with Adam, AdamW, SGD with momentum (plain and Nesterov)
  and plain SGD gives bit for bit the losses and weights of the same run with
  NPUSIM_FUSION_VARIABLE_UPDATE=0 in a child process (every step is the unfused op's
  instruction sequence), matches TensorFlow on the CPU, and runs one launch per variable
  update group (Adam: m, v and the variable together; AdamW: the weight decay, then that); the
  fused launches keep the name of the group's last assign;
- groups that must not fuse stay unfused and still compute numpy's results: a variable's new
  value also returned by the function (a read outside the group), and two updates of one
  variable chained by a read of its new value.
"""

import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import FIT_STEPS, child_result  # noqa: E402  pylint: disable=wrong-import-position

OPTIMIZERS = ["adam", "adamw", "sgd_momentum", "sgd_nesterov", "sgd"]

# Runs in child processes: per optimizer, three training steps of a small MLP on `device`.
KERAS_CODE = FIT_STEPS + r'''
import json
import numpy as np
import npusim
import tensorflow as tf
import keras

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
    "sgd_nesterov": lambda: keras.optimizers.SGD(0.05, momentum=0.9, nesterov=True),
    "sgd": lambda: keras.optimizers.SGD(0.05),
}


def train(device, name):
    keras.utils.set_random_seed(0)
    with tf.device(device):
        model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(3)])
        opt = OPTIMIZERS[name]()
        rng = np.random.default_rng(0)
        x = tf.constant(rng.standard_normal((8, 12)).astype(np.float32))
        y = tf.constant(rng.standard_normal((8, 3)).astype(np.float32))
        losses = fit_steps(model, opt, x, y, device)
    recs = npusim.launch_records() if device != "/CPU:0" else []
    return {"losses": losses, "weights": [w.numpy().tolist() for w in model.weights],
            "launches": len(recs),
            "updates": sorted(r["op_name"] for r in recs if r["op_type"] == "FusedVariableUpdate"),
            "names": sorted(r["op_name"] for r in recs)}


out = {name: {"npu": train("/NPU:0", name), "cpu": train("/CPU:0", name)}
       for name in OPTIMIZERS}
print("RESULT " + json.dumps(out))
'''

# Hand-written updates in variants that must not fuse, and one that does.
PATTERN_CODE = r'''
import json
import numpy as np
import npusim
import tensorflow as tf


def run(variant):
    rng = np.random.default_rng(3)
    g = tf.constant(rng.standard_normal((64,)).astype(np.float32))
    v0 = rng.standard_normal((64,)).astype(np.float32)
    w0 = rng.standard_normal((64,)).astype(np.float32)
    with tf.device("/NPU:0"):
        v, w = tf.Variable(v0), tf.Variable(w0)

        @tf.function
        def update(g):
            v.assign_add((g - v) * 0.25)
            if variant == "second_update":
                v.assign_sub(v * 0.5)     # a second update of v, reading its new value
            r = v.read_value()
            w.assign_sub(r * 0.125)
            return r if variant == "read_outside" else tf.constant(0.0)

        npusim.clear_launch_records()
        got = update(g).numpy()
    ops = [r["op_type"] for r in npusim.launch_records()]
    return {"v": v.numpy().tolist(), "w": w.numpy().tolist(), "ret": np.asarray(got).tolist(),
            "ops": ops, "g": g.numpy().tolist(), "v0": v0.tolist(), "w0": w0.tolist()}


print("RESULT " + json.dumps({v: run(v) for v in ("fusible", "read_outside", "second_update")}))
'''


@pytest.fixture(scope="module")
def keras_runs():
    # Rewrite 5 alone: rewrite 5b would merge the groups into one multi-tensor node
    # (tests/tf/test_multi_tensor_update.py).
    alone = {"NPUSIM_FUSION_MULTI_TENSOR": "0"}
    return (child_result(KERAS_CODE, extra_env=alone),
            child_result(KERAS_CODE,
                         extra_env={**alone, "NPUSIM_FUSION_VARIABLE_UPDATE": "0"}))


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_keras_optimizer_fused_bit_identical(keras_runs, name):
    fused, unfused = keras_runs[0][name]["npu"], keras_runs[1][name]["npu"]
    cpu = keras_runs[0][name]["cpu"]
    # Bit for bit the unfused ops' results.
    assert fused["losses"] == unfused["losses"]
    assert fused["weights"] == unfused["weights"]
    # TensorFlow on the CPU (the MatMuls' operands go to the cube in fp16 on the NPU).
    np.testing.assert_allclose(fused["losses"], cpu["losses"], rtol=2e-3, atol=1e-5)
    for got, want in zip(fused["weights"], cpu["weights"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-2, atol=2e-3)
    # One launch per group: 4 variables (two kernels, two biases); AdamW's weight decay is a
    # group of its own before each variable's Adam group.
    groups = 8 if name == "adamw" else 4
    assert len(fused["updates"]) == groups
    assert not unfused["updates"]
    # Launches saved per group: Adam's three chains and three AssignAdd / AssignSub kernels
    # (6 -> 1); SGD with momentum m's chain (an Assign swaps buffers, no launch) and var's
    # AssignAdd (2 -> 1), Nesterov also var's own chain (3 -> 1); plain SGD and AdamW's decay
    # a Mul and the AssignSub (2 -> 1).
    saved = {"adam": 4 * 5, "adamw": 4 * 5 + 4 * 1, "sgd_momentum": 4 * 1,
             "sgd_nesterov": 4 * 2, "sgd": 4 * 1}[name]
    # Counted among the launches of the optimizer's name scope (the weights' fp16 casts, in
    # MatMul and Cast launches elsewhere, run or not depending on what the derived-tensor cache
    # has learned by then: docs/tf_plugin.md).
    scope = fused["updates"][0].split("/")[0] + "/"

    def launches(run):
        return sum(n.startswith(scope) for n in run["names"])

    assert launches(unfused) - launches(fused) == saved, (fused["names"], unfused["names"])
    assert all("Assign" in n for n in fused["updates"])


@pytest.fixture(scope="module")
def pattern_runs():
    return child_result(PATTERN_CODE)


@pytest.mark.parametrize("variant", ["fusible", "read_outside", "second_update"])
def test_pattern_variants(pattern_runs, variant):
    run = pattern_runs[variant]
    g, v, w = (np.asarray(run[k], np.float32) for k in ("g", "v0", "w0"))
    v = v + (g - v) * np.float32(0.25)
    if variant == "second_update":
        v = v - v * np.float32(0.5)
    w = w - v * np.float32(0.125)
    np.testing.assert_array_equal(np.asarray(run["v"], np.float32), v)
    np.testing.assert_array_equal(np.asarray(run["w"], np.float32), w)
    if variant == "read_outside":
        np.testing.assert_array_equal(np.asarray(run["ret"], np.float32), v)
    fused = run["ops"].count("FusedVariableUpdate")
    if variant == "fusible":
        assert fused == 1 and not any(op.startswith("Assign") for op in run["ops"])
    else:
        # w's update reads v's new value, which joins them in one group; the group is left
        # alone (the read has a consumer outside it / v has two updates in it).
        assert fused == 0 and len(run["ops"]) >= 3
