"""Casts folded into the variable updates (adapter/tf/plugin/graph_fusion.h, rewrite 5c; the
Cast step of adapter/compiler/ops/fused_elementwise.h): a FusedVariableUpdate reading a Cast's
output reads the Cast's input instead and casts it in its tile, as CANN folds casts into the
kernels consuming them.

- A tf.function (default precision mode) updates four float32 variables: `a` from the float32 cast of a float16 tensor
  (folded), `b` from such a cast that the function also returns (a second consumer: it stays),
  `c` from the cast of an int32 tensor (not a fusible pair: it stays) and `d` from a float32
  tensor (no cast). The new values are numpy's (the f16 -> f32 cast is exact; each update one
  rounding), bit for bit those of NPUSIM_FUSION_CAST=0 in a child process; the folded Cast's
  launch is gone, the others ran; the update reading the f16 tensor ran as one launch.
- The small CNN trained three Adam steps under allow_mix_precision (its gradients float16, the
  optimizer float32): the same losses and weights bit for bit as with NPUSIM_FUSION_CAST=0,
  fewer launches per step, the gradients' Cast launches gone (the updates regrouped where a
  multi-tensor node's members differ), and the step graph's updates read the float16
  gradients (Tin) with the Cast as their first step.
Both with the updates in the NpuGraph task lists and node by node (NPUSIM_GRAPH_UPDATES=0).
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import SMALL_CNN_TRAINING, child_result, launch_multiset_diff  # noqa: E402  pylint: disable=wrong-import-position

CODE = SMALL_CNN_TRAINING + r'''
import glob, json, os
import numpy as np
import npusim
import tensorflow as tf
import keras
from tensorflow.core.framework import graph_pb2


def variables_run():
    rng = np.random.default_rng(5)
    x16 = rng.uniform(0.5, 4.0, (3, 37)).astype(np.float16)
    x32 = rng.uniform(-1.0, 1.0, (3, 37)).astype(np.float32)
    xi = rng.integers(-50, 50, (3, 37)).astype(np.int32)
    init = rng.uniform(-1.0, 1.0, (4, 3, 37)).astype(np.float32)
    with tf.device("/NPU:0"):
        a, b, c, d = (tf.Variable(init[k]) for k in range(4))

        @tf.function
        def step(x16, x32, xi):
            h = x16 * x16                        # float16 on the NPU
            a.assign_add(tf.cast(h, tf.float32) * 0.5)
            hb = tf.cast(h * 2.0, tf.float32)    # read by b's update and returned
            b.assign_sub(hb * 0.25)
            c.assign_add(tf.cast(xi + 1, tf.float32) * 0.125)
            d.assign_add(x32 * 0.5)
            return hb

        npusim.clear_launch_records()
        hb = step(tf.constant(x16), tf.constant(x32), tf.constant(xi))
    recs = npusim.launch_records()
    h = x16 * x16  # numpy's float16 product: exact in float32, rounded once, as the NPU's
    want = [init[0] + h.astype(np.float32) * np.float32(0.5),
            init[1] - (h * np.float16(2)).astype(np.float32) * np.float32(0.25),
            init[2] + (xi + 1).astype(np.float32) * np.float32(0.125),
            init[3] + x32 * np.float32(0.5)]
    return {"values": [v.numpy().tolist() for v in (a, b, c, d)],
            "want": [w.tolist() for w in want], "hb": hb.numpy().tolist(),
            "casts": sorted(r["op_name"] for r in recs if r["op_type"] == "Cast"),
            "updates": sorted([r["op_type"], r["kernel"]] for r in recs
                              if r["op_type"] == "FusedVariableUpdate")}


def cnn_run(folder):
    os.makedirs(folder, exist_ok=True)
    os.environ["NPUSIM_GRAPH_DUMP"] = folder
    model, step, x, y = small_cnn_training("/NPU:0")
    losses = []
    with tf.device("/NPU:0"):
        for _ in range(3):
            npusim.clear_launch_records()
            losses.append(float(step(x, y)[0].numpy()))
    recs = npusim.launch_records()
    os.environ.pop("NPUSIM_GRAPH_DUMP")
    path = sorted(glob.glob(os.path.join(folder, "*step*.after.pb")),
                  key=lambda p: int(p.split(".")[-3]))[-1]
    g = graph_pb2.GraphDef()
    with open(path, "rb") as f:
        g.ParseFromString(f.read())
    nodes = list(g.node)
    for n in g.node:  # the updates inside NpuGraph nodes (their subgraph, npu_graph.h)
        if n.op == "NpuGraph":
            sub = graph_pb2.GraphDef()
            sub.ParseFromString(n.attr["graph"].s)
            nodes += list(sub.node)
    updates = [{"Tin": [tf.dtypes.as_dtype(t).name for t in n.attr["Tin"].list.type],
                "steps": [s.decode() for s in n.attr["steps"].list.s]}
               for n in nodes if n.op == "FusedVariableUpdate"]
    return {"losses": losses, "weights": [w.numpy().tolist() for w in model.weights],
            "launches": sorted([r["op_type"], r["op_name"]] for r in recs),
            "updates": updates}


if os.environ["WHAT"] == "variables":
    print("RESULT " + json.dumps(variables_run()))
else:
    print("RESULT " + json.dumps(cnn_run(os.environ["DUMP"])))
'''


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cast_fusion")
    cnn = {"WHAT": "cnn", "NPUSIM_PRECISION_MODE": "allow_mix_precision",
           "TF_ENABLE_ONEDNN_OPTS": "0"}
    return {
        "variables": {
            "on": child_result(CODE, extra_env={"WHAT": "variables"}),
            "off": child_result(CODE, extra_env={"WHAT": "variables", "NPUSIM_FUSION_CAST": "0"}),
            "on_alone": child_result(CODE, extra_env={"WHAT": "variables",
                                                      "NPUSIM_GRAPH_UPDATES": "0"}),
        },
        "cnn": {
            "on": child_result(CODE, extra_env=dict(cnn, DUMP=str(tmp / "on"))),
            "off": child_result(CODE, extra_env=dict(cnn, DUMP=str(tmp / "off"),
                                                     NPUSIM_FUSION_CAST="0")),
            "on_alone": child_result(CODE, extra_env=dict(cnn, DUMP=str(tmp / "on_alone"),
                                                          NPUSIM_GRAPH_UPDATES="0")),
        },
    }


def test_update_casts_folded_only_where_allowed(runs):
    on, off, alone = (runs["variables"][k] for k in ("on", "off", "on_alone"))
    for run in (on, off, alone):
        for got, want in zip(run["values"], run["want"]):
            np.testing.assert_array_equal(np.asarray(got, np.float32),
                                          np.asarray(want, np.float32))
    assert on["values"] == off["values"] == alone["values"]
    assert on["hb"] == off["hb"]
    # Off: three Casts ran (a's, b's and c's); on: a's is folded into its update, b's (also
    # returned) and c's (int32 -> float32) stay.
    assert len(off["casts"]) == 3, off["casts"]
    assert len(on["casts"]) == 2 and set(on["casts"]) < set(off["casts"]), (on, off)
    assert alone["casts"] == on["casts"]
    assert on["updates"] and off["updates"]


def test_mixed_precision_gradient_casts_folded_into_adam(runs):
    on, off, alone = (runs["cnn"][k] for k in ("on", "off", "on_alone"))
    assert on["losses"] == off["losses"] == alone["losses"]
    assert on["weights"] == off["weights"] == alone["weights"]
    assert on["losses"][-1] < on["losses"][0]
    # Launch by launch (op type, node name): the gradients' Casts are gone; the update launches
    # may be regrouped (a multi-tensor node's members with a float16 gradient go to a node of
    # their own: the steps are common to a node's members); nothing else differs.
    missing, extra = launch_multiset_diff(off["launches"], on["launches"])
    casts = [name for op, name in missing if op == "Cast"]
    assert casts and all(op in ("Cast", "FusedVariableUpdate") for op, _ in missing), missing
    assert all(op == "FusedVariableUpdate" for op, _ in extra), extra
    assert len(on["launches"]) < len(off["launches"])
    # The updates read float16 gradients and cast them first, one Cast step per folded Cast;
    # off, every input is float32.
    folded = [u for u in on["updates"] if "float16" in u["Tin"]]
    assert folded, on["updates"]
    for u in folded:
        assert u["steps"][0].startswith("Cast i"), u
    assert sum(u["Tin"].count("float16") for u in folded) == len(casts), (folded, casts)
    assert all(set(u["Tin"]) <= {"float32"} for u in off["updates"]), off["updates"]
    assert all(not s.startswith("Cast") for u in off["updates"] for s in u["steps"])
