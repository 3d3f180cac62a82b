"""Multi-tensor variable updates (adapter/tf/plugin/graph_fusion.h, rewrite 5b; the kernel in
adapter/compiler/ops/fused_elementwise.h and elementwise.h's build_multi_stream_kernel): the
FusedVariableUpdate nodes of one optimizer become one node whose small members run as segments
of one launch, as CANN's foreach / multi-tensor apply kernels update a list of tensors.

A Keras 3 MLP of many small layers (widths 16, 8, 24, 8, 16, 3: variables of 3 to 192 elements,
the last bias' 12 bytes less than one 32-byte block) trained three steps with Adam, AdamW and
SGD with momentum:
- gives bit for bit the losses and weights of the same run with NPUSIM_FUSION_MULTI_TENSOR=0 in
  a child process (each element goes through the member's own instruction sequence), both with
  the updates inside the NpuGraph task lists and node by node (NPUSIM_GRAPH_UPDATES=0, the
  FusedVariableUpdate kernel of kernels_optimizer.cpp);
- matches TensorFlow on the CPU;
- runs the step's updates as one launch (every variable is small) under the group's node name,
  where the rewrite off runs one per variable; the launch record names its members: the nodes
  the rewrite-off run launched.
Under `allow_mix_precision` (float16 gradients, their Casts folded into the float32 updates:
rewrite 5c) the same against the rewrite-off run, in fewer launches.
Two Adam steps in one tf.function (the second update of a variable reads the first's
result) must not merge: two nodes, one per step, each with one update of every variable, and
the rewrite-off run's values bit for bit.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import FIT_STEPS, child_result  # noqa: E402  pylint: disable=wrong-import-position

OPTIMIZERS = ["adam", "adamw", "sgd_momentum"]
LAYERS = 6  # Dense layers: 12 variables (kernel and bias each)
# Updates per variable and step: Keras 3's AdamW decays each variable (its own assignment, one
# formula for every variable) before Adam's update reads it.
FORMULAS = {"adam": 1, "adamw": 2, "sgd_momentum": 1}

CODE = FIT_STEPS + r'''
import csv
import json
import tempfile
import numpy as np
import npusim
import tensorflow as tf
import keras

OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.05),
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
}


def fit_twice(model, opt, x, y, steps=3):
    """fit_steps with two optimizer steps per tf.function call on the same gradients."""

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    losses = []
    for _ in range(steps):
        npusim.clear_launch_records()
        losses.append(float(step(x, y).numpy()))
    return losses


def train(device, name, twice=False):
    keras.utils.set_random_seed(0)
    with tf.device(device):
        layers = [keras.layers.Dense(w, activation="relu") for w in (16, 8, 24, 8, 16)]
        model = keras.Sequential([keras.Input((12,))] + layers + [keras.layers.Dense(3)])
        opt = OPTIMIZERS[name]()
        rng = np.random.default_rng(0)
        x = tf.constant(rng.standard_normal((8, 12)).astype(np.float32))
        y = tf.constant(rng.standard_normal((8, 3)).astype(np.float32))
        if device == "/CPU:0":
            losses, summary = fit_steps(model, opt, x, y, device), []
        else:
            report = tempfile.mkdtemp()
            with npusim.profile(report, plots=False):
                losses = (fit_twice(model, opt, x, y) if twice
                          else fit_steps(model, opt, x, y, device))
            with open(f"{report}/op_summary.csv", newline="") as f:
                summary = [[r["Op Name"], r.get("members"), r["Input Shapes"]]
                           for r in csv.DictReader(f) if r["OP Type"] == "FusedVariableUpdate"]
    recs = npusim.launch_records() if device != "/CPU:0" else []
    updates = [r for r in recs if r["op_type"] == "FusedVariableUpdate"]
    return {"losses": losses, "weights": [w.numpy().tolist() for w in model.weights],
            "summary": summary,
            "updates": sorted(r["op_name"] for r in updates),
            "members": sorted(m for r in updates for m in r.get("members", [])),
            "members_by_node": {r["op_name"]: sorted(m for u in updates
                                                     if u["op_name"] == r["op_name"]
                                                     for m in u.get("members", []))
                                for r in updates}}


out = {}
for name in os.environ.get("RUN_OPTIMIZERS", ",".join(OPTIMIZERS)).split(","):
    out[name] = {"npu": train("/NPU:0", name, twice=bool(os.environ.get("TWICE")))}
    if os.environ.get("WITH_CPU"):
        out[name]["cpu"] = train("/CPU:0", name)
print("RESULT " + json.dumps(out))
'''


@pytest.fixture(scope="module")
def runs():
    code = "import os\n" + CODE
    return {
        "multi": child_result(code, extra_env={"WITH_CPU": "1"}),  # on by default
        "off": child_result(code, extra_env={"NPUSIM_FUSION_MULTI_TENSOR": "0"}),
        "multi_alone": child_result(code, extra_env={"NPUSIM_GRAPH_UPDATES": "0"}),
    }


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_multi_tensor_update_bit_identical(runs, name):
    multi, off = runs["multi"][name]["npu"], runs["off"][name]["npu"]
    alone = runs["multi_alone"][name]["npu"]
    cpu = runs["multi"][name]["cpu"]
    for other in (off, alone):
        assert multi["losses"] == other["losses"]
        assert multi["weights"] == other["weights"]
    np.testing.assert_allclose(multi["losses"], cpu["losses"], rtol=2e-3, atol=1e-5)
    for got, want in zip(multi["weights"], cpu["weights"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-2, atol=2e-3)
    # One launch per update formula for the 12 variables' updates (AdamW: its decays, then its
    # Adam updates, which read the decayed values), under the groups' names; one per variable
    # and formula off.
    groups = [f"npusim_multi_tensor_update_{k}" for k in range(FORMULAS[name])]
    assert multi["updates"] == groups, multi["updates"]
    assert all(len(m) == 2 * LAYERS for m in multi["members_by_node"].values())
    assert alone["updates"] == multi["updates"]
    assert len(off["updates"]) == FORMULAS[name] * 2 * LAYERS, off["updates"]
    # The launch keeps the original node names: its members are the updates the rewrite-off run
    # launched one by one (the records of the run without the rewrite name no members).
    assert multi["members"] == off["updates"], (multi["members"], off["updates"])
    assert alone["members"] == off["updates"]
    assert off["members"] == []
    # op_summary.csv (the three steps): each task under the group's name with the members it
    # computes in the `members` column, its input shapes those members' (the run without the
    # rewrite has no such column, its rows the members' own).
    for run in (multi, alone):
        assert {row[0] for row in run["summary"]} == set(groups)
        assert all(sorted(row[1].split(";")) == sorted(run["members_by_node"][row[0]])
                   for row in run["summary"])
    assert all(row[1] is None for row in off["summary"])
    own_shapes = {row[0]: row[2] for row in off["summary"]}
    assert sorted(own_shapes) == off["updates"]
    for run in (multi, alone):
        for row in run["summary"]:
            assert row[2] == ";".join(own_shapes[m] for m in row[1].split(";")), row


MIXED = {"NPUSIM_PRECISION_MODE": "allow_mix_precision"}


@pytest.fixture(scope="module")
def mixed_runs():
    code = "import os\n" + CODE
    return {
        "multi": child_result(code, extra_env=MIXED),
        "off": child_result(code, extra_env={**MIXED, "NPUSIM_FUSION_MULTI_TENSOR": "0"}),
    }


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_multi_tensor_update_mixed_precision(mixed_runs, name):
    multi, off = mixed_runs["multi"][name]["npu"], mixed_runs["off"][name]["npu"]
    assert multi["losses"] == off["losses"]
    assert multi["weights"] == off["weights"]
    assert len(off["updates"]) == FORMULAS[name] * 2 * LAYERS, off["updates"]
    assert multi["members"] == off["updates"], (multi["members"], off["updates"])
    # Per formula, the members whose gradient's Cast was folded and those reading a float32
    # gradient go to nodes of their own (a node's steps are common to its members): at most
    # two launches per formula, at least one.
    assert FORMULAS[name] <= len(multi["updates"]) <= 2 * FORMULAS[name], multi["updates"]


@pytest.fixture(scope="module")
def twice_runs():
    code = "import os\n" + CODE
    env = {"TWICE": "1", "RUN_OPTIMIZERS": "adam"}
    return {
        "multi": child_result(code, extra_env=env),
        "off": child_result(code, extra_env={**env, "NPUSIM_FUSION_MULTI_TENSOR": "0"}),
    }


@pytest.mark.parametrize("name", ["adam"])
def test_dependent_updates_stay_apart(twice_runs, name):
    # Each variable's second update reads the first's result: merged into one launch, both
    # would read the old value and the weights would differ from the rewrite-off run's.
    multi, off = twice_runs["multi"][name]["npu"], twice_runs["off"][name]["npu"]
    assert multi["losses"] == off["losses"]
    assert multi["weights"] == off["weights"]
    assert len(off["updates"]) == 4 * LAYERS, off["updates"]
    assert multi["members"] == off["updates"]
    # One node per optimizer step, each with one update of each of the 12 variables.
    nodes = multi["members_by_node"]
    assert len(nodes) == 2, nodes
    assert all(len(members) == 2 * LAYERS for members in nodes.values()), nodes
