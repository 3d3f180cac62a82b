"""Lamb's norms as multi-tensor SquareSumV1 (adapter/tf/plugin/graph_fusion.h, rewrite 17b; the
kernel in adapter/compiler/ops/reduce.cpp, compile_square_sums): the independent SquareSumV1
nodes of rewrite 17 become one node of N inputs, whose members of one small aligned size are
reduced as the rows of one reduction.

- models/bert.py's Lamb training an MLP of five Dense(16) layers and a Dense(8) (kernels of 256
  and 128 elements, biases of 16 and 8) three steps: the same weights and losses bit for bit as
  with NPUSIM_FUSION_MULTI_SQUARE_SUM=0 in a child process (each norm sums in its own launch's
  order); fewer SquareSumV1 launches than the 3 per variable of the rewrite off, under the group
  nodes' names, each launch record naming the nodes the rewrite-off run launched;
- must not merge: Lamb's trust ratio by hand twice in a row, the second on the first's result
  (its ||w|| reads the first's norms through the ratio): that norm shares no node with the
  norms it depends on, and the values are the rewrite-off run's bit for bit.
Both in the NpuGraph task lists and node by node (NPUSIM_GRAPH=0).
"""

import os
import sys

import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import child_result  # noqa: E402  pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CODE = r'''
import json
import sys
import numpy as np
import npusim
import tensorflow as tf
import keras
sys.path.insert(0, ROOT)
from models import bert

VARIABLES = 12  # six Dense layers: kernel and bias each


def norm_launches():
    """The last step's SquareSumV1 launches: (op_name, members) each."""
    return [(r["op_name"], r.get("members") or [r["op_name"]])
            for r in npusim.launch_records() if r["op_type"] == "SquareSumV1"]


def train(steps=3):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 16)).astype(np.float32)
    y = rng.standard_normal((32, 8)).astype(np.float32)
    with tf.device("/NPU:0"):
        model = keras.Sequential([keras.Input((16,))] +
                                 [keras.layers.Dense(16, activation="relu") for _ in range(5)] +
                                 [keras.layers.Dense(8)])
        model.compile(optimizer=bert.lamb_optimizer(1e-2, loss_scale=8.0, clip_norm=0.05),
                      loss="mse", jit_compile=False)
        losses = []
        for step in range(steps):
            npusim.clear_launch_records()
            losses.append(float(model.train_on_batch(x, y)))
        return {"weights": [v.numpy().astype(np.float64).tolist()
                            for v in model.trainable_variables],
                "losses": losses, "norms": norm_launches()}


def trust_ratio(w, g, u):
    w_norm = tf.sqrt(tf.reduce_sum(tf.square(w)))
    g_norm = tf.sqrt(tf.reduce_sum(tf.square(g)))
    u_norm = tf.sqrt(tf.reduce_sum(tf.square(u)))
    ratio = tf.where(tf.logical_and(w_norm > 0, g_norm > 0),
                     w_norm / tf.maximum(u_norm, 1e-30), tf.ones((), tf.float32))
    return u * tf.clip_by_value(ratio, 0.0, 10.0)


def chained():
    rng = np.random.default_rng(2)
    w, g, u, u2 = (rng.standard_normal((8, 16)).astype(np.float32) for _ in range(4))
    with tf.device("/NPU:0"):
        f = tf.function(lambda w, g, u, u2: trust_ratio(trust_ratio(w, g, u), g, u2))
        npusim.clear_launch_records()
        out = f(tf.constant(w), tf.constant(g), tf.constant(u), tf.constant(u2))
        return {"out": out.numpy().astype(np.float64).tolist(), "norms": norm_launches()}


print("RESULT " + json.dumps({"train": train(), "chained": chained(),
                              "variables": VARIABLES}))
'''.replace("ROOT", repr(ROOT))

OFF = {"NPUSIM_FUSION_MULTI_SQUARE_SUM": "0"}
# In the NpuGraph task lists (the default) and node by node (NPUSIM_GRAPH=0: each node's own
# TF kernel, the group node's launches named by its `_npusim_members` there too).
MODES = {"graph": {}, "node_by_node": {"NPUSIM_GRAPH": "0"}}


@pytest.fixture(scope="module", params=sorted(MODES))
def runs(request):
    env = MODES[request.param]
    return child_result(CODE, extra_env=env), child_result(CODE, extra_env={**env, **OFF})


def test_lamb_norms_grouped_bit_identical(runs):
    on, off = runs
    assert on["train"]["weights"] == off["train"]["weights"]
    assert on["train"]["losses"] == off["train"]["losses"]
    grouped, alone = on["train"]["norms"], off["train"]["norms"]
    # ||w||, ||g||, ||u|| of every variable, one launch each with the rewrite off
    assert len(alone) == 3 * on["variables"], alone
    assert all(len(members) == 1 for _, members in alone), alone
    assert len(grouped) < len(alone), (len(grouped), len(alone))
    assert any(name.startswith("npusim_multi_square_sum_") for name, _ in grouped), grouped
    # the group nodes' launches name the nodes the rewrite-off run launched, every one of them
    members = {m for _, ms in grouped for m in ms}
    assert members == {name for name, _ in alone}, (members, alone)
    print(f"\nSquareSumV1 launches per step: {len(alone)} -> {len(grouped)}")


def test_dependent_norms_stay_apart(runs):
    on, off = runs
    assert on["chained"]["out"] == off["chained"]["out"]
    # TensorFlow names the traced reductions Sum, Sum_1, ... in trace order: the first ratio's
    # ||w||, ||g||, ||u||, then the second's, whose ||w|| (Sum_3) reads the first ratio and
    # with it every first norm; its ||g|| and ||u|| do not.
    assert sorted(name for name, _ in off["chained"]["norms"]) == [
        "Sum", "Sum_1", "Sum_2", "Sum_3", "Sum_4", "Sum_5"], off["chained"]["norms"]
    groups = [set(members) for _, members in on["chained"]["norms"]]
    assert any(len(g) > 1 for g in groups), groups  # the independent norms merge
    for g in groups:
        if "Sum_3" in g:
            assert not g & {"Sum", "Sum_1", "Sum_2"}, groups
