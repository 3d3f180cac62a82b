"""Multi-tensor variable updates (adapter/tf/plugin/graph_fusion.h, rewrite 5b; the kernel in
adapter/compiler/ops/fused_elementwise.h and elementwise.h's build_multi_stream_kernel): the
FusedVariableUpdate nodes of one optimizer become one node whose small members run as segments
of one launch, as CANN's foreach / multi-tensor apply kernels update a list of tensors.

A Keras 3 MLP of many small layers trained three steps with Adam and with SGD with momentum:
- gives bit for bit the losses and weights of the same run with NPUSIM_FUSION_MULTI_TENSOR=0 in
  a child process (each element goes through the member's own instruction sequence), both with
  the updates inside the NpuGraph task lists and node by node (NPUSIM_GRAPH_UPDATES=0, the
  FusedVariableUpdate kernel of kernels_optimizer.cpp);
- matches TensorFlow on the CPU;
- runs the step's updates as one launch (every variable is small) under the group's node name,
  where the rewrite off runs one per variable; the launch record names its members: the nodes
  the rewrite-off run launched.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import FIT_STEPS, child_result  # noqa: E402  pylint: disable=wrong-import-position

OPTIMIZERS = ["adam", "sgd_momentum"]
LAYERS = 6  # Dense layers: 12 variables (kernel and bias each)

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
    "sgd_momentum": lambda: keras.optimizers.SGD(0.05, momentum=0.9),
}


def train(device, name):
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
                losses = fit_steps(model, opt, x, y, device)
            with open(f"{report}/op_summary.csv", newline="") as f:
                summary = [[r["Op Name"], r.get("members"), r["Input Shapes"]]
                           for r in csv.DictReader(f) if r["OP Type"] == "FusedVariableUpdate"]
    recs = npusim.launch_records() if device != "/CPU:0" else []
    return {"losses": losses, "weights": [w.numpy().tolist() for w in model.weights],
            "summary": summary,
            "updates": sorted(r["op_name"] for r in recs
                              if r["op_type"] == "FusedVariableUpdate"),
            "members": sorted(m for r in recs if r["op_type"] == "FusedVariableUpdate"
                              for m in r.get("members", []))}


out = {}
for name in OPTIMIZERS:
    out[name] = {"npu": train("/NPU:0", name)}
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
    # One launch for the 12 variables' updates, under the group's name; one per variable off.
    assert multi["updates"] == ["npusim_multi_tensor_update_0"], multi["updates"]
    assert alone["updates"] == multi["updates"]
    assert len(off["updates"]) == 2 * LAYERS, off["updates"]
    # The launch keeps the original node names: its members are the updates the rewrite-off run
    # launched one by one (the records of the run without the rewrite name no members).
    assert multi["members"] == off["updates"], (multi["members"], off["updates"])
    assert alone["members"] == off["updates"]
    assert off["members"] == []
    # op_summary.csv (the three steps): each task under the group's name with the members it
    # computes in the `members` column, its input shapes those members' (the run without the
    # rewrite has no such column, its rows the members' own).
    for run in (multi, alone):
        assert {row[0] for row in run["summary"]} == {"npusim_multi_tensor_update_0"}
        assert all(sorted(row[1].split(";")) == off["updates"] for row in run["summary"])
    assert all(row[1] is None for row in off["summary"])
    own_shapes = {row[0]: row[2] for row in off["summary"]}
    assert sorted(own_shapes) == off["updates"]
    for run in (multi, alone):
        for row in run["summary"]:
            assert row[2] == ";".join(own_shapes[m] for m in row[1].split(";")), row
