"""Lamb's per-variable steps as a few fused launches (adapter/tf/plugin/graph_fusion.h, rewrite
17): the trust ratio's where / clip written as element-wise steps that the variable's update
computes (CANN's LambUpdateWithLR), the norms as SquareSumV1 (CANN's op: the squares in the
reduction's pass) and each norm's Sqrt taken into its readers' chains.

- models/bert.py's Lamb (MindSpore's, with the loss scale, the gradient clipping and the weight
  decay of the kernels) training a small MLP three steps on the NPU: the same weights as with
  NPUSIM_FUSION_LAMB=0 in a child process (the steps compute the same values: c * clip(r) +
  (1 - c) is clip(where(c, r, 1)) for c in {0, 1}; SquareSumV1 squares and sums as Square and
  Sum do) and as TensorFlow on the CPU within float rounding; no Greater, LogicalAnd, SelectV2,
  Square or Sum launch left of the optimizer, three SquareSumV1 per variable, and far fewer
  launches per step than unfused;
- the trust ratio by hand (tf.where, tf.clip_by_value) on a zero w (the ratio's "else" branch),
  a ratio above the clip and one inside it: the CPU's values; and a variant clipped to [2, 10]
  (so that clip(1) is not 1: the rewrite would change the value) must stay unfused (its
  SelectV2 launch stays) and give the CPU's values too;
- reports name the fused updates as CANN does: the last step's launch records and
  op_summary.csv show each variable's update as LambUpdateWithLR and its moments' as LambNextMV,
  under the node names the rewrite-off run reports as FusedVariableUpdate.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")
pytest.importorskip("keras")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import child_result  # noqa: E402  pylint: disable=wrong-import-position

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CODE = r'''
import csv
import json
import sys
import tempfile
import numpy as np
import npusim
import tensorflow as tf
import keras
sys.path.insert(0, ROOT)
from models import bert

VARIABLES = 6  # three Dense layers: kernels (decayed) and biases (not)


def train(device, steps=3):
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((32, 12)).astype(np.float32)
    y = rng.standard_normal((32, 3)).astype(np.float32)
    with tf.device(device):
        model = keras.Sequential([keras.Input((12,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(8, activation="relu"), keras.layers.Dense(3)])
        # clip_norm 0.05: the first steps' gradients are clipped, later ones partly not
        model.compile(optimizer=bert.lamb_optimizer(1e-2, loss_scale=8.0, clip_norm=0.05),
                      loss="mse", jit_compile=False)
        counts, updates = {}, {"records": {}, "summary": {}}
        for step in range(steps - 1):
            model.train_on_batch(x, y)
        if device == "/CPU:0":
            model.train_on_batch(x, y)
        else:
            npusim.clear_launch_records()
            report = tempfile.mkdtemp()
            with npusim.profile(report, plots=False):
                model.train_on_batch(x, y)
            for r in npusim.launch_records():
                counts[r["op_type"]] = counts.get(r["op_type"], 0) + 1
            # the optimizer's variable updates: the original nodes each op type computes, in
            # the launch records and in op_summary.csv (its `members` column, else its name)
            for r in npusim.launch_records():
                if r["op_name"].startswith("lamb/") or r.get("members"):
                    names = r.get("members") or [r["op_name"]]
                    updates["records"].setdefault(r["op_type"], []).extend(names)
            with open(f"{report}/op_summary.csv", newline="") as f:
                for row in csv.DictReader(f):
                    if row.get("members") or "VariableOp" in row["Op Name"]:
                        names = (row.get("members") or row["Op Name"]).split(";")
                        updates["summary"].setdefault(row["OP Type"], []).extend(names)
        return ([v.numpy().astype(np.float64).tolist() for v in model.trainable_variables],
                counts, {k: {t: sorted(set(n)) for t, n in v.items()} for k, v in updates.items()})


def trust_ratio(w, g, u, lo):
    w_norm = tf.sqrt(tf.reduce_sum(tf.square(w)))
    g_norm = tf.sqrt(tf.reduce_sum(tf.square(g)))
    u_norm = tf.sqrt(tf.reduce_sum(tf.square(u)))
    ratio = tf.where(tf.logical_and(w_norm > 0, g_norm > 0),
                     w_norm / tf.maximum(u_norm, 1e-30), tf.ones((), tf.float32))
    return u * tf.clip_by_value(ratio, lo, 10.0)


def by_hand(device, lo):
    rng = np.random.default_rng(2)
    g = rng.standard_normal((24, 8)).astype(np.float32)
    cases = {"zero_w": (np.zeros((24, 8), np.float32), 1.0),       # else branch: ratio 1
             "clipped": (rng.standard_normal((24, 8)).astype(np.float32), 1e-3),  # r >> 10
             "inside": (rng.standard_normal((24, 8)).astype(np.float32), 0.4)}
    out, counts = {}, {}
    with tf.device(device):
        f = tf.function(lambda w, g, u: trust_ratio(w, g, u, lo))
        for name, (w, u_scale) in cases.items():
            u = (rng.standard_normal((24, 8)) * u_scale).astype(np.float32)
            npusim.clear_launch_records()
            out[name] = f(tf.constant(w), tf.constant(g), tf.constant(u)).numpy().astype(
                np.float64).tolist()
            if device != "/CPU:0":
                for r in npusim.launch_records():
                    counts[r["op_type"]] = counts.get(r["op_type"], 0) + 1
    return {"out": out, "counts": counts}


weights, counts, updates = train("/NPU:0")
cpu_weights, _, _ = train("/CPU:0")
print("RESULT " + json.dumps({
    "npu": weights, "cpu": cpu_weights, "counts": counts, "variables": VARIABLES,
    "updates": updates,
    "hand": {str(lo): {"npu": by_hand("/NPU:0", lo), "cpu": by_hand("/CPU:0", lo)}
             for lo in (0.0, 2.0)}}))
'''.replace("ROOT", repr(ROOT))

# Rewrite 17's choices are counted with the element-wise chains' SelectV2 steps off
# (NPUSIM_FUSION_SELECT=0; they are on by default): the counts look for the SelectV2 launches
# TensorFlow's where leaves. The unfused Lamb with those steps on, the default, is checked on its
# own (test_unfused_lamb_with_select_steps).
SELECT_OFF = {"NPUSIM_FUSION_SELECT": "0"}
OFF = {"NPUSIM_FUSION_LAMB": "0", **SELECT_OFF}


@pytest.fixture(scope="module")
def runs():
    return child_result(CODE, extra_env=SELECT_OFF), child_result(CODE, extra_env=OFF)


def test_lamb_fused_matches_unfused_and_cpu(runs):
    on, off = runs
    for fused, unfused, cpu in zip(on["npu"], off["npu"], on["cpu"]):
        # the same steps' values (seen: bit for bit on the tiny chip)
        np.testing.assert_allclose(np.asarray(fused), np.asarray(unfused), rtol=1e-6, atol=1e-7)
        # CPU: the cube's fp16 operands (allow_fp32_to_fp16) in the forward and backward passes
        np.testing.assert_allclose(np.asarray(fused), np.asarray(cpu), rtol=2e-3, atol=2e-4)


def test_unfused_lamb_with_select_steps(runs):
    """Lamb unfused (NPUSIM_FUSION_LAMB=0) with the SelectV2 steps of the element-wise chains on
    (their default):
    the trust ratio's where, a scalar condition per variable, goes into that variable's update,
    which stays a one-variable launch (a multi-tensor update never broadcasts a bool input); the
    weights are the unfused run's without the steps."""
    _, off = runs
    with_select = child_result(CODE, extra_env={"NPUSIM_FUSION_LAMB": "0"})
    for got, want in zip(with_select["npu"], off["npu"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
    assert with_select["counts"].get("SelectV2", 0) < off["counts"]["SelectV2"], (
        with_select["counts"], off["counts"])


def test_lamb_runs_as_few_launches(runs):
    on, off = runs
    fused, unfused = on["counts"], off["counts"]
    n = on["variables"]
    for op in ("Greater", "LogicalAnd", "SelectV2", "Sqrt"):
        assert op not in fused, (op, fused)
        assert unfused.get(op, 0) >= n, (op, unfused)
    # ||g||, ||w||, ||u|| of every variable; the loss's own Square and Sum (mse) stay
    assert fused.get("SquareSumV1") == 3 * n, fused
    assert "SquareSumV1" not in unfused, unfused
    for op in ("Square", "Sum"):
        assert fused.get(op, 0) == unfused[op] - 3 * n, (op, fused, unfused)
    total_on, total_off = sum(fused.values()), sum(unfused.values())
    print(f"\nlaunches per step: {total_off} unfused -> {total_on} fused")
    assert total_on <= 0.6 * total_off, (total_on, total_off)


def test_trust_ratio_by_hand(runs):
    on, off = runs
    for lo in ("0.0", "2.0"):
        for case, want in on["hand"][lo]["cpu"]["out"].items():
            got = on["hand"][lo]["npu"]["out"][case]
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-6,
                                       err_msg=f"lo {lo}, {case}")
            assert got == off["hand"][lo]["npu"]["out"][case] or np.allclose(
                got, off["hand"][lo]["npu"]["out"][case], rtol=1e-6, atol=1e-7), (lo, case)
    fusible, kept = on["hand"]["0.0"]["npu"]["counts"], on["hand"]["2.0"]["npu"]["counts"]
    assert "SelectV2" not in fusible and fusible.get("SquareSumV1") == 9, fusible
    # clip(1) = 2 there: the where stays as TensorFlow has it
    assert kept.get("SelectV2") == 3 and "SquareSumV1" not in kept, kept


def test_lamb_updates_reported_under_cann_names(runs):
    """Reports show the fused updates under CANN's op types (docs/tf_plugin.md "Lamb"): each
    variable's trust-ratio update as LambUpdateWithLR, its moments' updates as LambNextMV, with
    the names of the nodes the rewrite-off run reports as FusedVariableUpdate; in the launch
    records and in op_summary.csv alike."""
    on, off = runs
    for source in ("records", "summary"):
        fused, unfused = on["updates"][source], off["updates"][source]
        assert "LambUpdateWithLR" not in unfused and "LambNextMV" not in unfused, unfused
        plain = unfused["FusedVariableUpdate"]
        # w -= lr * ratio * u: Keras' assign_sub of each variable
        lr_updates = [n for n in plain if n.startswith("lamb/AssignSubVariableOp")]
        moments = [n for n in plain if n.startswith("lamb/AssignVariableOp")]
        assert len(lr_updates) == on["variables"] and len(moments) == 2 * on["variables"], plain
        assert fused["LambUpdateWithLR"] == lr_updates, (source, fused)
        assert fused["LambNextMV"] == moments, (source, fused)
        # what is left under FusedVariableUpdate is not Lamb's (the step counter's update)
        assert not [n for n in fused.get("FusedVariableUpdate", []) if n.startswith("lamb/")]
