"""A residual gradient sum and its ReLU's gradient as one pass (adapter/tf/plugin/graph_fusion.h,
rewrite 16): ReluGrad(AddN(a, b), y) with the AddN read by nothing else becomes one
FusedElementwise of AddN's AddV2 steps and ReluGrad's (adapter/compiler/ops/
fused_elementwise.h), the AddN's launch and its pass over the sum gone.

- a hand-written graph whose ReLU output has two readers (so its gradient is an AddN of two,
  taken back through the ReLU), in float32 and, under allow_mix_precision, float16: the same
  values bit for bit as with NPUSIM_FUSION_ADDN_RELU_GRAD=0 (the steps are the AddN's and
  ReluGrad's own kernels' instructions), and TensorFlow's on the CPU within float rounding;
  no AddN launch and one ReluGrad launch fewer where it folds;
- the AddN also fetched must not fold: its AddN launch stays, results as the CPU's.
"""

import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import runs_with_and_without  # noqa: E402  pylint: disable=wrong-import-position

CODE = r'''
import json
import numpy as np
import npusim
import tensorflow as tf


def pattern(x, w, s, c, variant):
    with tf.GradientTape() as tape:
        tape.watch([x, s])
        # (a MatMul first: allow_mix_precision's pass runs what follows it in float16)
        h = tf.nn.relu(tf.matmul(x, w) + s)   # two readers: the gradient of h is an AddN
        loss = tf.reduce_sum(h * c) + tf.reduce_sum(tf.nn.relu(h - 0.5) * c * c)
    if variant == "fusible":
        return tape.gradient(loss, [x, s])
    return tape.gradient(loss, [x, s, h])     # dh: the AddN's output, fetched


def run(variant, device):
    rng = np.random.default_rng(3)
    args = [tf.constant(rng.standard_normal((40, 16)).astype(np.float32)),
            tf.constant(rng.uniform(-0.5, 0.5, (16, 16)).astype(np.float32)),
            tf.constant(rng.standard_normal((40, 16)).astype(np.float32)),
            tf.constant(rng.uniform(-1, 1, 16).astype(np.float32))]
    with tf.device(device):
        npusim.clear_launch_records()
        outs = tf.function(lambda *a: pattern(*a, variant))(*args)
        outs = [o.numpy().astype(np.float64).tolist() for o in outs]
    recs = npusim.launch_records() if device != "/CPU:0" else []
    counts = {}
    for r in recs:
        counts[r["op_type"]] = counts.get(r["op_type"], 0) + 1
    return {"outs": outs, "types": sorted(counts), "counts": counts,
            "kernels": sorted({r["kernel"] for r in recs})}


print("RESULT " + json.dumps({v: {"npu": run(v, "/NPU:0"), "cpu": run(v, "/CPU:0")}
                              for v in ("fusible", "fetched")}))
'''

OFF = {"NPUSIM_FUSION_ADDN_RELU_GRAD": "0"}


@pytest.fixture(scope="module", params=["float32", "mixed"])
def runs(request):
    return runs_with_and_without(request.param, CODE, OFF)


def test_fused_matches_unfused_bit_for_bit_and_cpu(runs):
    mode, on, off = runs
    fused, unfused = on["fusible"]["npu"], off["fusible"]["npu"]
    # (the inner ReLU's gradient is a ReluGrad of its own, not of a sum: it stays)
    assert "AddN" not in fused["types"], fused["types"]
    assert unfused["counts"].get("AddN") == 1, unfused["counts"]
    assert fused["counts"].get("ReluGrad") == unfused["counts"]["ReluGrad"] - 1, \
        (fused["counts"], unfused["counts"])
    assert fused["counts"].get("FusedElementwise", 0) > unfused["counts"].get(
        "FusedElementwise", 0), (fused["counts"], unfused["counts"])
    if mode == "mixed":  # the pair ran in float16 (the pass typed them before the rewrite)
        assert "ReluGrad_f16" in unfused["kernels"], unfused["kernels"]
    assert fused["outs"] == unfused["outs"]
    # CPU, float32: the cube's fp16 operands (allow_fp32_to_fp16) and, under
    # allow_mix_precision, float16 activations, each of the few steps rounded (u = 2^-11;
    # values of order 1, sums of 16 products).
    tol = 2e-2 if mode == "mixed" else 5e-3
    for got, want in zip(fused["outs"], on["fusible"]["cpu"]["outs"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


def test_fetched_sum_stays_unfused(runs):
    _, on, _ = runs
    run = on["fetched"]
    assert run["npu"]["counts"].get("AddN") == 1, run["npu"]["counts"]
    tol = 2e-2 if runs[0] == "mixed" else 5e-3
    for got, want in zip(run["npu"]["outs"], run["cpu"]["outs"]):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


def test_wide_sum_folds_and_matches_a_left_to_right_sum(npusim, tf):
    # ReluGrad(AddN of 40 terms, y): more inputs than one kernel holds addresses for, so the
    # FusedElementwise runs the AddN steps first as the AddN op (several launches) and ReluGrad's
    # step after them (ops/fused_elementwise.cpp); the values are numpy's left-to-right sum,
    # each partial sum rounded to float32, masked where y <= 0, bit for bit.
    rng = np.random.default_rng(17)
    xs = [rng.uniform(-10.0 ** (i % 4 - 1), 10.0 ** (i % 4 - 1), (6, 29)).astype(np.float32)
          for i in range(40)]
    y = rng.uniform(-1, 1, (6, 29)).astype(np.float32)
    fn = tf.function(lambda *a: tf.raw_ops.ReluGrad(gradients=tf.raw_ops.AddN(inputs=list(a[:-1])),
                                                    features=a[-1]))
    npusim.clear_launch_records()
    with tf.device("/NPU:0"):
        got = fn(*[tf.constant(v) for v in xs + [y]])
    types = {r["op_type"] for r in npusim.launch_records()}
    assert got.device.endswith("device:NPU:0"), got.device
    assert "FusedElementwise" in types and "AddN" not in types, types
    want = xs[0]
    for x in xs[1:]:
        want = want + x
    np.testing.assert_array_equal(got.numpy(), np.where(y > 0, want, np.float32(0)))
