"""SelectV2 steps of the element-wise chain fusion (adapter/tf/plugin/graph_fusion.h, rewrite 4;
the step in adapter/compiler/ops/fused_elementwise.h): Keras' dropout where(mask, x * scale, 0)
and its gradient where(mask, dy * scale, 0) become one FusedElementwise launch each, the bool
mask an input of both.

- f32 and f16 dropout-like chains (a zeros_like and a scalar 0 as e, a mask of the output's
  shape read by two chains, a mask broadcast along rows that the fused op first expands) give
  results BIT-IDENTICAL to the same function run with NPUSIM_FUSION_SELECT=0 in a child process
  (SelectV2 launches of their own), equal to numpy's where over TF-on-CPU products, in fewer
  launches, with no SelectV2 launch left (the broadcast mask's expansion is a launch of the
  fused op, as of SelectV2's own);
- a select read outside its chain stays the sink of its own set;
- run node by node (NPUSIM_GRAPH=0, where TensorFlow rebuilds the function's graph from the
  optimizer's output and checks every edge's type against the op definitions): a chain with a
  bool condition (FusedElementwise's Tin lists it as bool) and a variable update whose chain
  has one (FusedVariableUpdate's Tin too) run fused beside the graph's other rewrites (a
  MatMulBiasAdd), TensorFlow keeps the optimized graph, and the results are bit-identical to
  the same step with the select steps off; under allow_mix_precision too (the chain in
  float16, its condition still bool).
"""

import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("tensorflow")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import run_child  # noqa: E402  pylint: disable=wrong-import-position

CODE = r'''
import numpy as np

RATE = 0.25


def dropouts(x, dy, h, u, ur):
    """x, dy: f32 [64, 40]; h: f16 [64, 40]; u: f32 random [64, 40]; ur: f32 random [1, 40]."""
    import tensorflow as tf
    scale = 1.0 / (1.0 - RATE)
    mask = tf.math.greater_equal(u, RATE, name="mask")
    fwd = tf.where(mask, x * scale, tf.zeros_like(x), name="fwd")           # Keras' dropout
    grad = tf.where(mask, dy * scale, 0.0, name="grad")                     # its gradient
    hout = tf.where(mask, h * tf.constant(scale, tf.float16), tf.constant(0.0, tf.float16),
                    name="hout")                                            # f16
    rows = tf.math.less(ur, 0.5, name="rows")                               # broadcast mask
    bout = tf.where(rows, tf.math.abs(x) + 1.0, x, name="bout")
    sel = tf.where(mask, x, dy, name="sel")              # also read outside a chain: a sink
    out = tf.math.multiply(sel, 2.0, name="out")
    return fwd, grad, hout, bout, sel, out


def dropout_inputs():
    rng = np.random.default_rng(5)
    return (rng.standard_normal((64, 40)).astype(np.float32),
            rng.standard_normal((64, 40)).astype(np.float32),
            rng.standard_normal((64, 40)).astype(np.float16),
            rng.uniform(0.0, 1.0, (64, 40)).astype(np.float32),
            rng.uniform(0.0, 1.0, (1, 40)).astype(np.float32))


def run_dropouts():
    import npusim
    import tensorflow as tf
    args = [tf.constant(a) for a in dropout_inputs()]
    with tf.device("/NPU:0"):
        f = tf.function(dropouts)
        f(*args)  # trace, optimize, compile
        n0 = len(npusim.launch_records())
        outs = [t.numpy() for t in f(*args)]
        recs = npusim.launch_records()[n0:]
    return outs, recs


def hexed(arrays):
    return [[str(a.dtype), list(a.shape), a.tobytes().hex()] for a in arrays]
'''

CHILD = CODE + r'''
outs, recs = run_dropouts()
print("RESULT " + json.dumps({"outs": hexed(outs), "launches": len(recs),
                              "selects": sorted({r["op_name"].rsplit("/", 1)[-1] for r in recs
                                                 if r["op_type"] == "SelectV2"})}))
'''

exec(CODE)  # pylint: disable=exec-used


def unhexed(items):
    return [np.frombuffer(bytes.fromhex(h), dtype=d).reshape(s) for d, s, h in items]


FUSED_CHILD = CODE + r'''
outs, recs = run_dropouts()
print("RESULT " + json.dumps({"outs": hexed(outs),
                              "recs": [{"op_type": r["op_type"], "op_name": r["op_name"]}
                                       for r in recs]}))
'''


@pytest.fixture(scope="module")
def fused(npusim, tf):  # pylint: disable=unused-argument
    """The dropouts with the select steps on (their default), in a child process: outputs and
    launch records."""
    proc = run_child("import json\n" + FUSED_CHILD, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
    return unhexed(res["outs"]), res["recs"]


def test_dropouts_match_numpy_where(tf, fused):
    outs, _ = fused
    x, dy, h, u, ur = dropout_inputs()  # pylint: disable=undefined-variable
    with tf.device("/CPU:0"):  # the products, one rounding each, as TF on the CPU rounds them
        scale = 1.0 / (1.0 - RATE)  # pylint: disable=undefined-variable
        xs, dys = (tf.constant(x) * scale).numpy(), (tf.constant(dy) * scale).numpy()
        hs = (tf.constant(h) * tf.constant(scale, tf.float16)).numpy()
        ax = (tf.math.abs(tf.constant(x)) + 1.0).numpy()
    mask = u >= RATE  # pylint: disable=undefined-variable
    want = [np.where(mask, xs, np.float32(0)), np.where(mask, dys, np.float32(0)),
            np.where(mask, hs, np.float16(0)), np.where(ur < 0.5, ax, x), np.where(mask, x, dy),
            np.where(mask, x, dy) * np.float32(2)]
    for got, w in zip(outs, want):
        assert got.dtype == w.dtype and got.shape == w.shape
        np.testing.assert_array_equal(got, w)


def test_selects_fuse_bit_identical_to_unfused(fused):
    outs, recs = fused
    proc = run_child("import json, os\nos.environ['NPUSIM_FUSION_SELECT'] = '0'\n" + CHILD,
                     timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    off = json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
    for got, want in zip(outs, unhexed(off["outs"])):
        assert got.tobytes() == want.tobytes()
    types = [r["op_type"] for r in recs]
    fused_names = {r["op_name"].rsplit("/", 1)[-1] for r in recs
                   if r["op_type"] == "FusedElementwise"}
    # fwd, grad, hout, bout: multiply (add) and select in one launch each; sel is read by out
    # and is a function output: the sink of its own set (a single step: its SelectV2 launch).
    assert {"fwd", "grad", "hout", "bout"} <= fused_names, sorted(fused_names)
    assert types.count("SelectV2") == 1, types
    assert off["selects"] == ["bout", "fwd", "grad", "hout", "sel"], off["selects"]
    print(f"\ndropouts: {len(recs)} launches fused, {off['launches']} unfused")
    assert len(recs) < off["launches"]


NODE_BY_NODE_CHILD = r"""
import json
import numpy as np
import npusim
import tensorflow as tf

rng = np.random.default_rng(7)
x = rng.standard_normal((16, 32)).astype(np.float32)
w = rng.standard_normal((32, 24)).astype(np.float32)
b = rng.standard_normal(24).astype(np.float32)
u = rng.uniform(0.0, 1.0, (16, 24)).astype(np.float32)
g = rng.standard_normal((16, 24)).astype(np.float32)
with tf.device("/NPU:0"):
    v = tf.Variable(np.ones((16, 24), np.float32))

    @tf.function
    def step(x, w, b, u, g):
        h = tf.nn.bias_add(tf.matmul(x, w), b, name="dense")
        mask = tf.math.greater_equal(u, 0.25, name="mask")
        v.assign_sub(tf.where(mask, g * 0.5, 0.0, name="masked_step"))
        return tf.where(mask, h * (1.0 / 0.75), tf.zeros_like(h), name="dropout")

    args = [tf.constant(a) for a in (x, w, b, u, g)]
    step(*args)  # trace, optimize, compile
    n0 = len(npusim.launch_records())
    y = step(*args).numpy()
    recs = npusim.launch_records()[n0:]
print("RESULT " + json.dumps({"y": y.tobytes().hex(), "v": v.numpy().tobytes().hex(),
                              "types": sorted({r["op_type"] for r in recs}),
                              "kernels": sorted({r["kernel"] for r in recs})}))
"""


def _node_by_node(select, precision):
    # TensorFlow's warnings shown: a refused optimized graph is one.
    env = {"NPUSIM_GRAPH": "0", "TF_CPP_MIN_LOG_LEVEL": "1"}
    if select is not None:
        env["NPUSIM_FUSION_SELECT"] = select
    if precision is not None:
        env["NPUSIM_PRECISION_MODE"] = precision
    proc = run_child(NODE_BY_NODE_CHILD, timeout=300, extra_env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads([l for l in proc.stdout.splitlines() if l.startswith("RESULT ")][-1][7:])
    res["y"] = np.frombuffer(bytes.fromhex(res["y"]), np.float32).reshape(16, 24)
    res["v"] = np.frombuffer(bytes.fromhex(res["v"]), np.float32).reshape(16, 24)
    return res, proc.stderr


# allow_mix_precision: the graph pass runs the dropout chain in float16 (its Tin's T-typed
# inputs turned half with T, the condition kept bool), the update in float32.
@pytest.mark.parametrize("precision", [None, "allow_mix_precision"])
def test_select_steps_run_node_by_node_beside_the_other_rewrites(tf, precision):  # pylint: disable=unused-argument
    on, stderr = _node_by_node(None, precision)  # the select steps on: their default
    # TensorFlow refused no optimized graph (it used to fall back to the unoptimized one, every
    # rewrite lost, for one FusedElementwise whose bool input its definition typed as T).
    assert "optimization failure" not in stderr, stderr[-3000:]
    types = on["types"]
    assert {"FusedElementwise", "FusedVariableUpdate", "MatMulBiasAdd"} <= set(types), types
    assert "SelectV2" not in types and "MatMul" not in types, types
    if precision == "allow_mix_precision":
        assert "FusedElementwise_f16" in on["kernels"], on["kernels"]
    off, _ = _node_by_node("0", precision)
    assert "SelectV2" in off["types"], off["types"]
    assert on["y"].tobytes() == off["y"].tobytes()
    assert on["v"].tobytes() == off["v"].tobytes()
    rng = np.random.default_rng(7)  # the child's inputs
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((16, 32), (32, 24), 24))
    u = rng.uniform(0.0, 1.0, (16, 24)).astype(np.float32)
    g = rng.standard_normal((16, 24)).astype(np.float32)
    mask = u >= 0.25
    # The variable: two steps of v -= where(mask, g * 0.5, 0), exact in float32.
    step = np.where(mask, g * np.float32(0.5), np.float32(0))
    np.testing.assert_array_equal(on["v"], np.float32(1) - step - step)
    # The dropout: zero where the mask is false; elsewhere (x @ w + b) / 0.75 (the cube's fp16
    # operands, and under allow_mix_precision the fp16 product and scale: a tolerance).
    np.testing.assert_array_equal(on["y"][~mask], 0)
    np.testing.assert_allclose(on["y"][mask], ((x @ w + b) / np.float32(0.75))[mask], rtol=2e-3,
                               atol=2e-2)
