"""Multi-tensor variable updates (adapter/tf/plugin/graph_fusion.h, rewrite 5b; the kernel in
adapter/compiler/ops/fused_elementwise.h and elementwise.h's build_multi_stream_kernel): the
FusedVariableUpdate nodes of one optimizer become one node whose small members run as segments
of one launch, as CANN's foreach / multi-tensor apply kernels update a list of tensors.

A Keras 3 MLP of many small layers trained three steps with Adam and with SGD with momentum:
- gives bit for bit the losses and weights of the same run without it (the default) in
  a child process (each element goes through the member's own instruction sequence), both with
  the updates inside the NpuGraph task lists and node by node (NPUSIM_GRAPH_UPDATES=0, the
  FusedVariableUpdate kernel of kernels_optimizer.cpp);
- matches TensorFlow on the CPU;
- runs the step's updates as one launch (every variable is small) under the group's node name,
  where the rewrite off runs one per variable.
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
import json
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
        losses = fit_steps(model, opt, x, y, device)
    recs = npusim.launch_records() if device != "/CPU:0" else []
    return {"losses": losses, "weights": [w.numpy().tolist() for w in model.weights],
            "updates": sorted(r["op_name"] for r in recs
                              if r["op_type"] == "FusedVariableUpdate")}


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
        "multi": child_result(code, extra_env={"WITH_CPU": "1", "NPUSIM_FUSION_MULTI_TENSOR": "1"}),
        "off": child_result(code, extra_env={"NPUSIM_FUSION_MULTI_TENSOR": "0"}),
        "multi_alone": child_result(code, extra_env={"NPUSIM_GRAPH_UPDATES": "0",
                                                     "NPUSIM_FUSION_MULTI_TENSOR": "1"}),
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
